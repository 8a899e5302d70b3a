"""How a sequence is split across the ranks of a process group: "contiguous" (rank r holds tokens
[r·S, (r+1)·S)) or "zigzag" (the sequence in 2·W chunks, rank r holding chunks r and 2·W-1-r,
which balances causal work); this rank's slice of a whole sequence and the whole sequence back
from every rank's slice; and the check that every rank passes the same shapes and options.
"""

import torch
import torch.distributed as dist

from .._lib import FlashAttnValueError

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


def _unzigzag(x, world):
    """Rank-ordered zigzag slices (B, 2·W·c, ...) back into sequence order."""
    c = x.shape[1] // (2 * world)
    order = [None] * (2 * world)
    for r in range(world):
        for j, ci in enumerate(_chunks(r, world, "zigzag")):
            order[ci] = x[:, (2 * r + j) * c:(2 * r + j + 1) * c]
    return torch.cat(order, dim=1)


def _check_same_everywhere(api, group, q, k, v, split, causal, window_size):
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
                f"{api}: rank {r} has q/k/v shapes, dtype or options "
                f"{d.tolist()} but rank 0 has {every[0].tolist()} (q, k, v shapes, dtype, split, "
                f"causal, window); every rank must pass the same")
