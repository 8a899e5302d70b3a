"""All-gather attention (Llama 3's context parallelism): K and V gathered once (dist.all_gather;
in the backward, dist.all_to_all brings each rank the dK/dV of its keys from every rank, summed
in rank order), and this rank's queries attend over the keys before them with flash_attn_func.
"""

import torch
import torch.distributed as dist

from ..flash_attn_interface import flash_attn_func
from ._split import _check_same_everywhere, _chunks, _unzigzag


class _GatherTokens(torch.autograd.Function):
    """Every rank's (B, S_local, ...) slice, concatenated in rank order along dim 1; the
    backward returns each rank the sum, in rank order, of every rank's gradient of its slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        world = dist.get_world_size(ctx.group)
        mine = [c.contiguous() for c in grad.chunk(world, dim=1)]
        theirs = [torch.empty_like(mine[0]) for _ in range(world)]
        dist.all_to_all(theirs, mine, group=ctx.group)
        return torch.stack(theirs).sum(0), None


def all_gather_attention(q, k, v, group=None, causal=False, window_size=(-1, -1), softcap=0.0,
                         alibi_slopes=None, softmax_scale=None, split="contiguous"):
    """flash_attn_func over a sequence split across group's ranks: q (B, S_local, H, D), k and v
    (B, S_local, Hk, D) are this rank's tokens (split_sequence); returns this rank's out
    (B, S_local, H, D), differentiable in q, k and v (dK and dV of every rank's queries summed
    back to the rank that holds the keys). causal with any left window, or full attention
    (no window); windows without causal are not supported and raise."""
    window_size = tuple(window_size)
    problem = None
    if not causal and window_size != (-1, -1):
        problem = ("a window without causal is not supported (keys after a rank's own block "
                   "would need another alignment); use causal=True or no window")
    _check_same_everywhere("all_gather_attention", group, q, k, v, split, causal, window_size,
                           problem)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    K, V = _GatherTokens.apply(k, group), _GatherTokens.apply(v, group)
    if split == "zigzag":  # the gathered slices back into sequence order
        K, V = (_unzigzag(x, world) for x in (K, V))
    kw = dict(causal=causal, window_size=window_size, softcap=softcap,
              alibi_slopes=alibi_slopes, softmax_scale=softmax_scale)
    if not causal:
        return flash_attn_func(q, K, V, **kw)
    chunks = _chunks(rank, world, split)
    c = q.shape[1] // len(chunks)
    # a chunk's queries over the keys up to its end: flashattn aligns causal masks (and ALiBi
    # distances) bottom-right, which puts each query at its global position
    outs = [flash_attn_func(q.narrow(1, j * c, c), K[:, :(ci + 1) * c], V[:, :(ci + 1) * c], **kw)
            for j, ci in enumerate(chunks)]
    return torch.cat(outs, dim=1)
