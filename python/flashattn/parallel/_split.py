"""How a sequence is split across the ranks of a process group: "contiguous" (rank r holds tokens
[r·S, (r+1)·S)) or "zigzag" (the sequence in 2·W chunks, rank r holding chunks r and 2·W-1-r,
which balances causal work); this rank's slice of a whole sequence and the whole sequence back
from every rank's slice; and the agreement every call starts with: each rank's arguments
checked, and the same on every rank.
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
    whole = torch.cat(parts, dim=dim)
    return whole if split == "contiguous" else _unzigzag(whole, world, dim)


def _unzigzag(x, world, dim=1):
    """Rank-ordered zigzag slices (2·W chunks of c along dim) back into sequence order."""
    c = x.shape[dim] // (2 * world)
    order = [None] * (2 * world)
    for r in range(world):
        for j, ci in enumerate(_chunks(r, world, "zigzag")):
            order[ci] = x.narrow(dim, (2 * r + j) * c, c)
    return torch.cat(order, dim=dim)


def _local_problem(q, k, v, split, window_size):
    """What is wrong with this rank's own fixed-length arguments, or None."""
    if split not in SPLITS:
        return f"split: {split!r}; expected one of {SPLITS}"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.dtype not in _DTYPES:
            what = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t)
            return (f"{name}: expected a 4-D (batch, seqlen, nheads, headdim) tensor of "
                    f"{_DTYPES}; got {what}")
    if not q.shape[1] == k.shape[1] == v.shape[1]:
        return (f"q, k, v: {q.shape[1]}, {k.shape[1]} and {v.shape[1]} tokens; a rank's slice of "
                f"the sequence has the same tokens in each")
    if split == "zigzag" and q.shape[1] % 2:
        return f"q: {q.shape[1]} tokens; a zigzag slice is two equal chunks (split_sequence " \
               f"makes them)"
    try:
        ok = len(window_size) == 2 and min(int(w) for w in window_size) >= -1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        return f"window_size: {window_size!r}; expected two integers >= -1 (-1: unbounded)"
    return None


def _fixed_fields(q, k, v, split, causal, window_size, softcap, softmax_scale):
    """What every rank must pass alike in a fixed-length call: (name, value) pairs."""
    return [("q shape", tuple(q.shape)), ("k shape", tuple(k.shape)),
            ("v shape", tuple(v.shape)), ("dtype", str(q.dtype)), ("split", split),
            ("causal", bool(causal)), ("window_size", tuple(int(w) for w in window_size)),
            ("softcap", float(softcap)),
            ("softmax_scale", None if softmax_scale is None else float(softmax_scale))]


def _agree(api, group, problem, fields):
    """The first collective of every call: each rank's finding about its own arguments
    (`problem`, None if none) and, if none, its `fields()` ((name, value) pairs; a value of
    type bytes is a digest, shown as such) gathered by one all_gather_object. A rank whose
    arguments are wrong or differ from rank 0's fails every rank with the same message, never
    leaving the others waiting in a later collective. Without an initialized process group a
    problem raises at once."""
    if not problem:
        try:
            mine = (None, fields())
        except Exception as e:  # an argument fields() cannot read: a problem like the others
            problem = f"{type(e).__name__}: {e}"
    if problem:
        if not dist.is_initialized():
            raise FlashAttnValueError(f"{api}: {problem}")
        mine = (problem, None)
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    for r, (p, _) in enumerate(every):
        if p:
            raise FlashAttnValueError(f"{api}: rank {r}: {p}")
    first = dict(every[0][1])
    for r, (_, theirs) in enumerate(every):
        for name, value in theirs:
            if value != first[name]:
                what = ("differs from rank 0's" if isinstance(value, bytes) else
                        f"is {value} but rank 0's is {first[name]}")
                raise FlashAttnValueError(f"{api}: rank {r}'s {name} {what}; every rank must "
                                          f"pass the same")
