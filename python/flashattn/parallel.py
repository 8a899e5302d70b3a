"""Context parallelism over torch.distributed: attention over a sequence whose tokens are split
across the ranks of a process group (gloo on CPUs, NCCL on GPUs), forward and backward.

    import torch.distributed as dist
    from flashattn import parallel
    q, k, v = (parallel.split_sequence(x, dist.get_rank(), dist.get_world_size()) for x in qkv)
    out = parallel.all_gather_attention(q, k, v, causal=True)   # this rank's rows
    full = parallel.gather_sequence(out)                        # every rank's rows, in order

all_gather_attention gathers K and V once (dist.all_gather; in the backward, dist.all_to_all
brings each rank the dK/dV of its keys from every rank, summed in rank order) and attends this
rank's queries over the keys before them with flash_attn_func: Llama 3's context parallelism.
The split is "contiguous" (rank r holds tokens [r·S, (r+1)·S)) or "zigzag" (the sequence in 2·W
chunks, rank r holding chunks r and 2·W-1-r, which balances causal work). Shapes, dtypes and
the split are checked on every rank first (one small all_gather), so a rank that differs fails
every rank with the same message.
"""

import torch
import torch.distributed as dist

from ._lib import FlashAttnValueError
from .flash_attn_interface import flash_attn_func

SPLITS = ("contiguous", "zigzag")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _chunks(rank, world, split):
    """The global chunk indices rank holds, in order: chunks of S_local (contiguous) or of
    S_local / 2 (zigzag)."""
    if split == "contiguous":
        return [rank]
    return [rank, 2 * world - 1 - rank]


def split_sequence(x, rank, world, split="contiguous", dim=1):
    """This rank's slice of a whole sequence x along dim (1: (B, S, H, D))."""
    if split not in SPLITS:
        raise FlashAttnValueError(f"split: {split!r}; expected one of {SPLITS}")
    parts = 1 if split == "contiguous" else 2
    n = x.shape[dim]
    if n % (world * parts):
        raise FlashAttnValueError(f"split_sequence: {n} tokens do not split into {world * parts} "
                                  f"equal {split} chunks")
    c = n // (world * parts)
    return torch.cat([x.narrow(dim, i * c, c) for i in _chunks(rank, world, split)], dim=dim)


def gather_sequence(x, group=None, split="contiguous", dim=1):
    """The whole sequence from every rank's slice x (the inverse of split_sequence); not
    differentiable."""
    world = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    if split == "contiguous":
        return torch.cat(parts, dim=dim)
    half = x.shape[dim] // 2
    order = [None] * (2 * world)
    for r, p in enumerate(parts):
        for j, c in enumerate(_chunks(r, world, split)):
            order[c] = p.narrow(dim, j * half, half)
    return torch.cat(order, dim=dim)


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


def _check_same_everywhere(group, q, k, v, split, causal, window_size):
    """Every rank's shapes, dtypes and options, gathered once: a rank that differs fails every
    rank with one message (never a hang in a later collective)."""
    if split not in SPLITS:
        raise FlashAttnValueError(f"split: {split!r}; expected one of {SPLITS}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4 or t.dtype not in _DTYPES:
            raise FlashAttnValueError(f"{name}: expected a 4-D (batch, seqlen, nheads, headdim) "
                                      f"tensor of {_DTYPES}; got {tuple(t.shape)} {t.dtype}")
    if not q.shape[1] == k.shape[1] == v.shape[1]:
        raise FlashAttnValueError(f"q, k, v: {q.shape[1]}, {k.shape[1]} and {v.shape[1]} tokens; "
                                  f"a rank's slice of the sequence has the same tokens in each")
    if split == "zigzag" and q.shape[1] % 2:
        raise FlashAttnValueError(f"q: {q.shape[1]} tokens; a zigzag slice is two equal chunks "
                                  f"(split_sequence makes them)")
    desc = list(q.shape) + list(k.shape) + list(v.shape) + [
        _DTYPES.index(q.dtype), SPLITS.index(split), int(bool(causal)), int(window_size[0]),
        int(window_size[1])]
    mine = torch.tensor(desc, dtype=torch.int64, device=q.device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    for r, d in enumerate(every):
        if not torch.equal(d, every[0]):
            raise FlashAttnValueError(
                f"all_gather_attention: rank {r} has q/k/v shapes, dtype or options "
                f"{d.tolist()} but rank 0 has {every[0].tolist()} (q, k, v shapes, dtype, split, "
                f"causal, window); every rank must pass the same")


def all_gather_attention(q, k, v, group=None, causal=False, window_size=(-1, -1), softcap=0.0,
                         alibi_slopes=None, softmax_scale=None, split="contiguous"):
    """flash_attn_func over a sequence split across group's ranks: q (B, S_local, H, D), k and v
    (B, S_local, Hk, D) are this rank's tokens (split_sequence); returns this rank's out
    (B, S_local, H, D), differentiable in q, k and v (dK and dV of every rank's queries summed
    back to the rank that holds the keys). causal with any left window, or full attention
    (no window); windows without causal are not supported and raise."""
    window_size = tuple(window_size)
    if not causal and window_size != (-1, -1):
        raise FlashAttnValueError("all_gather_attention: a window without causal is not "
                                  "supported (keys after a rank's own block would need another "
                                  "alignment); use causal=True or no window")
    _check_same_everywhere(group, q, k, v, split, causal, window_size)
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


def _unzigzag(x, world):
    """Rank-ordered zigzag slices (B, 2·W·c, ...) back into sequence order."""
    c = x.shape[1] // (2 * world)
    order = [None] * (2 * world)
    for r in range(world):
        for j, ci in enumerate(_chunks(r, world, "zigzag")):
            order[ci] = x[:, (2 * r + j) * c:(2 * r + j + 1) * c]
    return torch.cat(order, dim=1)
