"""flashattn.bert_padding: flash-attn's padding helpers, with flash-attn 2.8's names, arguments and
return values, for PyTorch tensors. Code ported from flash-attn changes only its import:

    from flashattn.bert_padding import pad_input, unpad_input   # was: flash_attn.bert_padding

A padded batch (batch, seqlen, ...) with an attention mask becomes the packed rows a varlen call
takes, and back:

    x, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, attention_mask)
    out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)
    padded = pad_input(out, indices, batch, seqlen)          # zeros where the mask was 0

Every function is differentiable in its tensor arguments. This module needs PyTorch (the rest of
flashattn does not).
"""

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("flashattn.bert_padding works on PyTorch tensors: install torch") from e

from ._lib import FlashAttnValueError

__all__ = [
    "index_first_axis",
    "index_put_first_axis",
    "index_first_axis_residual",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
    "pad_input",
]


def _check_rows(x, name, indices):
    if x.dim() < 2:
        raise FlashAttnValueError(f"{name}: expected at least 2 dimensions (rows, ...); got shape "
                                  f"{tuple(x.shape)}")
    if indices.dim() != 1:
        raise FlashAttnValueError(f"indices: expected 1 dimension; got shape "
                                  f"{tuple(indices.shape)}")


class _IndexFirstAxis(torch.autograd.Function):
    """out = input[indices] along the first axis; the gradient goes back to those rows."""

    @staticmethod
    def forward(ctx, input, indices):
        _check_rows(input, "input", indices)
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        grad_input = grad_output.new_zeros((ctx.first_axis_dim, *grad_output.shape[1:]))
        grad_input.index_copy_(0, indices, grad_output)
        return grad_input, None


class _IndexPutFirstAxis(torch.autograd.Function):
    """out = zeros(first_axis_dim, ...) with out[indices] = values."""

    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        _check_rows(values, "values", indices)
        ctx.save_for_backward(indices)
        output = values.new_zeros((first_axis_dim, *values.shape[1:]))
        output[indices] = values
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return grad_output[indices], None, None


class _IndexFirstAxisResidual(torch.autograd.Function):
    """(input[indices], input detached): the second output carries the rows' residual gradient,
    to which the first's is added (flash-attn's fused residual path)."""

    @staticmethod
    def forward(ctx, input, indices):
        _check_rows(input, "input", indices)
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input[indices], input.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_residual):
        (indices,) = ctx.saved_tensors
        grad_input = grad_residual  # as flash-attn: accumulated in place
        index = indices.reshape(-1, *((1,) * (grad_output.dim() - 1))).expand_as(grad_output)
        grad_input.scatter_add_(0, index, grad_output)
        return grad_input.reshape(ctx.first_axis_dim, *grad_output.shape[1:]), None


index_first_axis = _IndexFirstAxis.apply
index_put_first_axis = _IndexPutFirstAxis.apply
index_first_axis_residual = _IndexFirstAxisResidual.apply


def _check_mask(hidden_states, mask, name):
    if mask.dim() != 2 or hidden_states.dim() < 2 or tuple(mask.shape) != \
            tuple(hidden_states.shape[:2]):
        raise FlashAttnValueError(f"{name}: expected shape (batch, seqlen) = "
                                  f"{tuple(hidden_states.shape[:2])}, the first two dimensions "
                                  f"of hidden_states; got {tuple(mask.shape)}")


def _packed(hidden_states, indices):
    batch, seqlen = hidden_states.shape[:2]
    rows = hidden_states.reshape(batch * seqlen, *hidden_states.shape[2:])
    if rows.dim() == 1:  # (batch, seqlen): one value per token
        return index_first_axis(rows.unsqueeze(-1), indices).squeeze(-1)
    return index_first_axis(rows, indices)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Removes the padding of a batch.

    hidden_states: (batch, seqlen, ...). attention_mask: (batch, seqlen), bool or int, nonzero =
    a real token. unused_mask (optional): (batch, seqlen), nonzero = a slot that is allocated but
    unused; its rows are kept too (counted in cu_seqlens, not in seqused).

    Returns (hidden_states (total, ...), indices (total,) int64 into the flattened (batch *
    seqlen) rows, cu_seqlens (batch + 1,) int32, max_seqlen_in_batch int, seqused (batch,) int32
    the real tokens per sequence)."""
    _check_mask(hidden_states, attention_mask, "attention_mask")
    all_masks = attention_mask
    if unused_mask is not None:
        _check_mask(hidden_states, unused_mask, "unused_mask")
        all_masks = attention_mask + unused_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return _packed(hidden_states, indices), indices, cu_seqlens, max_seqlen, seqused


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Unpads rows that each hold several sequences back to back (packed fine-tuning samples).

    attention_mask_in_length: (batch, seqlen), int: row b's nonzero entries, in order, are the
    lengths of the sequences concatenated in it (e.g. [2, 3, 0, 0, 0, 0]: tokens 0-1 and 2-4).

    Returns (hidden_states (total, ...), indices, cu_seqlens (sequences + 1,) int32 with one
    entry per sequence, max_seqlen int), as flash-attn does."""
    _check_mask(hidden_states, attention_mask_in_length, "attention_mask_in_length")
    lengths = attention_mask_in_length
    seqlen = lengths.shape[-1]
    length = lengths.sum(dim=-1)
    mask = torch.arange(seqlen, device=length.device, dtype=length.dtype).expand(
        len(length), seqlen) < length.unsqueeze(1)
    seqlens = lengths.flatten()[torch.nonzero(lengths.flatten(), as_tuple=False).flatten()]
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return _packed(hidden_states, indices), indices, cu_seqlens, max_seqlen


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse of unpad_input: hidden_states (total, ...) back to (batch, seqlen, ...), with
    zeros in the rows no index names."""
    if hidden_states.dim() == 1:  # one value per token
        return pad_input(hidden_states.unsqueeze(-1), indices, batch, seqlen).squeeze(-1)
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.reshape(batch, seqlen, *output.shape[1:])
