"""flashattn.bert_padding against a plain loop over the mask, its gradients (gradcheck), flash-attn
2.8's return values, a padded batch through unpad -> varlen attention -> pad, and bad shapes."""

import pytest

torch = pytest.importorskip("torch")

from helpers import seeded  # noqa: E402

from flashattn import FlashAttnValueError, flash_attn_func, flash_attn_varlen_func  # noqa: E402
from flashattn.bert_padding import (  # noqa: E402
    index_first_axis,
    index_first_axis_residual,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)


def _mask(batch, seqlen, gen):
    """Random lengths, left-aligned, with an empty row and a full row among them."""
    lens = torch.randint(0, seqlen + 1, (batch,), generator=gen)
    lens[0], lens[-1] = 0, seqlen
    return (torch.arange(seqlen)[None, :] < lens[:, None]).to(torch.int32), lens


def test_unpad_and_pad_match_a_loop_over_the_mask():
    gen = torch.Generator().manual_seed(seeded(1))
    batch, seqlen = 5, 7
    x = torch.randn(batch, seqlen, 3, 4, generator=gen)
    mask, lens = _mask(batch, seqlen, gen)
    mask[2, 1] = 0  # a hole: unpad keeps rows in row-major order, not only prefixes
    out, indices, cu, max_seqlen, seqused = unpad_input(x, mask)

    want_idx = [b * seqlen + s for b in range(batch) for s in range(seqlen) if mask[b, s]]
    assert indices.dtype == torch.int64 and indices.tolist() == want_idx
    assert torch.equal(out, x.reshape(batch * seqlen, 3, 4)[want_idx])
    per_row = mask.sum(-1).tolist()
    assert cu.dtype == torch.int32 and cu.tolist() == [sum(per_row[:b]) for b in range(batch + 1)]
    assert isinstance(max_seqlen, int) and max_seqlen == max(per_row)
    assert seqused.dtype == torch.int32 and seqused.tolist() == per_row

    back = pad_input(out, indices, batch, seqlen)
    assert back.shape == x.shape
    keep = mask.bool()[..., None, None]
    assert torch.equal(back, torch.where(keep, x, torch.zeros(())))


def test_unused_mask_rows_are_kept_but_not_used():
    gen = torch.Generator().manual_seed(seeded(2))
    x = torch.randn(2, 6, 8, generator=gen)
    used = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    unused = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0]])
    out, indices, cu, max_seqlen, seqused = unpad_input(x, used, unused)
    assert indices.tolist() == [0, 1, 2, 3, 6, 7, 8, 9, 10]
    assert cu.tolist() == [0, 4, 9] and max_seqlen == 5 and seqused.tolist() == [2, 4]
    assert torch.equal(out, x.reshape(12, 8)[indices])


def test_concatenated_sequences_as_flash_attn_documents():
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    x = torch.arange(3 * 6, dtype=torch.float32).reshape(3, 6, 1)
    out, indices, cu, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)
    assert cu.tolist() == [0, 2, 5, 8, 10, 16] and max_seqlen == 6
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17]
    assert out.flatten().tolist() == [float(i) for i in indices.tolist()]


def test_gradients():
    gen = torch.Generator().manual_seed(seeded(3))
    x = torch.randn(6, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    idx = torch.tensor([4, 0, 2])
    torch.autograd.gradcheck(lambda t: index_first_axis(t, idx), (x,))
    vals = torch.randn(3, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    torch.autograd.gradcheck(lambda t: index_put_first_axis(t, idx, 6), (vals,))

    def residual(t):
        rows, res = index_first_axis_residual(t, idx)
        return rows * 2.0, res * 3.0
    torch.autograd.gradcheck(residual, (x,))

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    h = torch.randn(2, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    torch.autograd.gradcheck(
        lambda t: pad_input(unpad_input(t, mask)[0] * 2.0, unpad_input(t, mask)[1], 2, 3), (h,))


def test_padded_batch_through_varlen_attention():
    gen = torch.Generator().manual_seed(seeded(4))
    batch, seqlen, H, Hk, D = 4, 9, 4, 2, 16
    mask, lens = _mask(batch, seqlen, gen)
    q = torch.randn(batch, seqlen, H, D, generator=gen, requires_grad=True)
    k = torch.randn(batch, seqlen, Hk, D, generator=gen, requires_grad=True)
    v = torch.randn(batch, seqlen, Hk, D, generator=gen, requires_grad=True)
    qu, idx, cu, mx, _ = unpad_input(q, mask)
    ku, vu = unpad_input(k, mask)[0], unpad_input(v, mask)[0]
    out = pad_input(flash_attn_varlen_func(qu, ku, vu, cu, cu, mx, mx, causal=True), idx, batch,
                    seqlen)
    for b in range(batch):
        n = int(lens[b])
        assert torch.all(out[b, n:] == 0)
        if n:
            ref = flash_attn_func(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n], causal=True)
            torch.testing.assert_close(out[b, :n], ref[0], rtol=0, atol=0)
    out.sum().backward()
    pad = ~mask.bool()
    for g in (q.grad, k.grad, v.grad):
        assert torch.all(g[pad] == 0) and torch.isfinite(g).all()
    assert q.grad[mask.bool()].abs().sum() > 0


def test_bad_shapes_name_the_argument():
    x = torch.randn(2, 5, 3)
    with pytest.raises(FlashAttnValueError, match=r"attention_mask: expected shape \(batch, "
                                                  r"seqlen\) = \(2, 5\).*got \(2, 4\)"):
        unpad_input(x, torch.ones(2, 4))
    with pytest.raises(FlashAttnValueError, match="unused_mask"):
        unpad_input(x, torch.ones(2, 5), torch.ones(5))
    with pytest.raises(FlashAttnValueError, match="indices: expected 1 dimension"):
        index_first_axis(x, torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(FlashAttnValueError, match="input: expected at least 2 dimensions"):
        index_first_axis(torch.randn(4), torch.zeros(1, dtype=torch.int64))
