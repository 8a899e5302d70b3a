"""All-gather attention (Llama 3's context parallelism): K and V gathered once (one
dist.all_gather; in the backward one dist.all_to_all brings each rank the dK/dV of its keys from
every rank, summed in fp32 in rank order), then this rank's queries attend with flash_attn_func,
each chunk of them over the keys it can see, placed so that flashattn's bottom-right alignment
puts every query at its position in the sequence.
"""

import torch
import torch.distributed as dist

from ..flash_attn_interface import flash_attn_func
from ._split import _agree, _chunks, _fixed_fields, _local_problem, _unzigzag


class _GatherKV(torch.autograd.Function):
    """k and v of every rank, concatenated in rank order along their token dimension `dim`, by
    one all_gather; the backward returns each rank the sum, in fp32 and rank order, of every
    rank's dK and dV of its tokens, by one all_to_all (so K's and V's can never cross, whatever
    order autograd runs nodes in)."""

    @staticmethod
    def forward(ctx, k, v, dim, group):
        ctx.dim, ctx.group = dim, group
        kv = torch.stack([k, v])  # (2, ...): k and v travel together
        parts = [torch.empty_like(kv) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, kv, group=group)
        kv = torch.cat(parts, dim=dim + 1)
        return kv[0], kv[1]

    @staticmethod
    def backward(ctx, dk, dv):
        world = dist.get_world_size(ctx.group)
        mine = [c.contiguous() for c in torch.stack([dk, dv]).chunk(world, dim=ctx.dim + 1)]
        theirs = [torch.empty_like(mine[0]) for _ in range(world)]
        dist.all_to_all(theirs, mine, group=ctx.group)
        total = theirs[0].float()
        for t in theirs[1:]:
            total += t
        total = total.to(dk.dtype)
        return total[0], total[1], None, None


def _chunk_call(q, K, V, start, causal, window_size, positional, **kw):
    """flash_attn_func of the c queries at sequence positions [start, start + c) over the keys of
    K/V they can see. flashattn puts query i at key position i + Sk - Sq: the keys run from the
    first a left window lets in to the chunk's end (causal) or to the sequence's end or the
    right window's (not causal); where positions matter without causal (a window or ALiBi),
    zero query rows after the chunk make up the difference and their outputs are dropped (their
    gradients are exactly 0)."""
    c, n = q.shape[1], K.shape[1]
    wl, wr = window_size
    lo = 0 if wl < 0 else max(0, start - wl)
    hi = start + c if causal else n if wr < 0 else min(n, start + c + wr)
    if not causal and not positional:
        lo, hi = 0, n
    pad = hi - start - c if positional and not causal else 0
    if pad:
        q = torch.cat([q, q.new_zeros(q.shape[0], pad, *q.shape[2:])], dim=1)
    out = flash_attn_func(q, K[:, lo:hi], V[:, lo:hi], causal=causal, window_size=window_size, **kw)
    return out[:, :c] if pad else out


def all_gather_attention(q, k, v, group=None, causal=False, window_size=(-1, -1), softcap=0.0,
                         alibi_slopes=None, softmax_scale=None, split="contiguous"):
    """flash_attn_func over a sequence split across group's ranks: q (B, S_local, H, D), k and v
    (B, S_local, Hk, D) are this rank's tokens (split_sequence); returns this rank's out
    (B, S_local, H, D), differentiable in q, k and v (dK and dV of every rank's queries summed
    back to the rank that holds the keys). Every flash_attn_func option but dropout: causal or
    not, windows, GQA, softcap, ALiBi. Without causal, a window or ALiBi makes a rank compute
    dummy query rows after each chunk, up to the sequence's end or the right window."""
    _agree("all_gather_attention", group, _local_problem(q, k, v, split, window_size),
           lambda: _fixed_fields(q, k, v, split, causal, window_size, softcap, softmax_scale))
    window_size = tuple(int(w) for w in window_size)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    K, V = _GatherKV.apply(k, v, 1, group)
    if split == "zigzag":  # the gathered slices back into sequence order
        K, V = (_unzigzag(x, world) for x in (K, V))
    positional = window_size != (-1, -1) or alibi_slopes is not None
    kw = dict(softcap=softcap, alibi_slopes=alibi_slopes, softmax_scale=softmax_scale)
    chunks = _chunks(rank, world, split)
    c = q.shape[1] // len(chunks)
    outs = [_chunk_call(q.narrow(1, j * c, c), K, V, ci * c, causal, window_size, positional, **kw)
            for j, ci in enumerate(chunks)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
