"""All-gather attention over packed (varlen) sequences, Llama 3's context parallelism: the ranks
hold equal contiguous slices of one packed token stream (split_sequence(x, rank, world, dim=0)),
sequences may cross slice boundaries; K and V are gathered once (one dist.all_gather; in the
backward one dist.all_to_all brings each rank the dK/dV of its keys from every rank, summed in
rank order in fp32) and this rank's rows attend with one flash_attn_varlen_func call.
"""

import bisect
import hashlib

import torch
import torch.distributed as dist

from .. import _args
from .._lib import FlashAttnError, FlashAttnTypeError, FlashAttnValueError
from ..flash_attn_interface import flash_attn_varlen_func
from ._all_gather import _GatherKV
from ._split import _DTYPES, _agree


def _plan(cu, rank, t_local, causal, window_size, aligned):
    """This rank's varlen call over the whole stream's boundaries cu (a list): (b, first row,
    end row, dummy query rows, first key, cu_q, cu_k, max_q, max_k), b the indices of the
    sequences with rows here. Sequence [s, e)'s query part is its rows in [r0, r1), qa..qb; its
    key part ks..ke must end at qb + pad for flashattn's bottom-right alignment (off = Sk - Sq)
    to put each query at its position: causal ends at qb; non-causal ends at e (or qb + the
    right window), with pad zero query rows after the last sequence's rows when positions
    matter (a window or ALiBi). ks skips keys that a left window hides. Only the first sequence
    starts before r0 and only the last ends after r1, so the key parts are contiguous."""
    r0, r1 = rank * t_local, (rank + 1) * t_local
    wl, wr = window_size
    lo, hi = max(0, bisect.bisect_right(cu, r0) - 1), bisect.bisect_left(cu, r1)
    b = [i for i in range(lo, min(hi, len(cu) - 1)) if cu[i] < cu[i + 1] and cu[i + 1] > r0]
    cu_q, cu_k, pad = [0], [0], 0
    for i in b:
        s, e = cu[i], cu[i + 1]
        qa, qb = max(s, r0), min(e, r1)
        ke = qb if causal else e if wr < 0 else min(e, qb + wr)
        ks = s if wl < 0 else max(s, qa - wl)
        pad = ke - qb if aligned else 0  # nonzero only for the last sequence
        cu_q.append(cu_q[-1] + qb - qa + pad)
        cu_k.append(cu_k[-1] + ke - ks)
        if i == b[0]:
            first, k0 = qa - r0, ks
    if not b:
        first, k0 = 0, 0
    end = cu_q[-1] - pad + first
    return b, first, end, pad, k0, cu_q, cu_k, _longest(cu_q), _longest(cu_k)


def _longest(cu):
    """The longest sequence of boundaries cu (0 for none)."""
    return max([b - a for a, b in zip(cu, cu[1:])], default=0)


def _digest(t):
    """A hash of a tensor's contents (compared across ranks)."""
    raw = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(raw, digest_size=16).digest()


def _check_args(q, k, v, cu_seqlens, window_size, alibi_slopes):
    """The argument errors each rank finds alone, raised before any collective."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.dtype not in _DTYPES:
            raise FlashAttnValueError(
                f"{name}: expected a 3-D (tokens, nheads, headdim) tensor of {_DTYPES}; got "
                f"{tuple(getattr(t, 'shape', ()))} {getattr(t, 'dtype', type(t).__name__)}")
    if not q.dtype == k.dtype == v.dtype:
        raise FlashAttnTypeError(f"q, k, v: dtypes {q.dtype}, {k.dtype}, {v.dtype}; expected one")
    if (not q.shape[0] == k.shape[0] == v.shape[0] or k.shape != v.shape
            or q.shape[2] != k.shape[2] or k.shape[1] == 0 or q.shape[1] % k.shape[1]):
        raise FlashAttnValueError(
            f"q, k, v: shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; a rank's "
            f"slice holds the same tokens of each, k and v have one shape, q's heads are a "
            f"multiple of k's and its headdim k's")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32:
        raise FlashAttnTypeError(f"cu_seqlens: expected an int32 tensor; got "
                                 f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)}")
    cu = cu_seqlens.tolist()
    if cu_seqlens.dim() != 1 or not cu or cu[0] < 0 or any(
            a > b for a, b in zip(cu, cu[1:])):
        raise FlashAttnValueError(f"cu_seqlens: {cu}; expected a 1-D (batch + 1) tensor, "
                                  f"nondecreasing from >= 0")
    if len(window_size) != 2 or any(int(w) < -1 for w in window_size):
        raise FlashAttnValueError(f"window_size: {tuple(window_size)}; expected two values "
                                  f">= -1 (-1: unbounded)")
    if alibi_slopes is not None and (
            not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32
            or tuple(alibi_slopes.shape) not in ((q.shape[1],), (len(cu) - 1, q.shape[1]))):
        raise FlashAttnValueError(
            f"alibi_slopes: {tuple(getattr(alibi_slopes, 'shape', ()))} "
            f"{getattr(alibi_slopes, 'dtype', '')}; expected float32 (nheads) or "
            f"(batch, nheads) = {(len(cu) - 1, q.shape[1])}")
    return cu


def all_gather_attention_varlen(q, k, v, cu_seqlens, max_seqlen, group=None, causal=False,
                                window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                softmax_scale=None):
    """flash_attn_varlen_func (cu_seqlens for queries and keys) over a packed stream split
    across group's ranks: q (T_local, H, D), k and v (T_local, Hk, D) are this rank's tokens
    [rank·T_local, (rank+1)·T_local) of the T = world·T_local; cu_seqlens (int32, batch + 1, the
    same on every rank) and max_seqlen describe the whole stream; rows in no sequence get out 0
    and zero gradients. Returns this rank's out (T_local, H, D), differentiable in q, k and v.
    alibi_slopes: (H) or (batch, H) fp32. A non-causal call with a window or ALiBi computes the
    rows after this rank's part of its last sequence as well (up to that sequence's end, or the
    right window), because flashattn aligns positions at the end of the keys."""
    api = "all_gather_attention_varlen"
    try:
        window_size = tuple(int(w) for w in window_size)
        max_seqlen = _args.seqlen(max_seqlen, "max_seqlen")
        cu, problem = _check_args(q, k, v, cu_seqlens, window_size, alibi_slopes), None
    except (FlashAttnError, TypeError, ValueError) as e:  # e.g. window_size=None
        problem = str(e)
    _agree(api, group, problem, lambda: [
        ("q shape", tuple(q.shape)), ("k shape", tuple(k.shape)), ("v shape", tuple(v.shape)),
        ("dtype", str(q.dtype)), ("causal", bool(causal)), ("window_size", window_size),
        ("softcap", float(softcap)), ("softmax_scale", softmax_scale),
        ("max_seqlen", max_seqlen), ("batch size", len(cu) - 1),
        ("cu_seqlens", _digest(cu_seqlens)),
        ("alibi_slopes", None if alibi_slopes is None else _digest(alibi_slopes))])
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    t_local = q.shape[0]
    if cu[-1] > world * t_local:
        raise FlashAttnValueError(f"{api}: cu_seqlens ends at {cu[-1]}, past the {world} x "
                                  f"{t_local} tokens of the stream")
    longest = _longest(cu)
    if max_seqlen < longest:
        raise FlashAttnValueError(f"{api}: max_seqlen {max_seqlen} < the longest sequence "
                                  f"({longest} tokens)")
    aligned = not causal and (window_size != (-1, -1) or alibi_slopes is not None)
    b, first, end, pad, k0, cu_q, cu_k, max_q, max_k = _plan(
        cu, rank, t_local, causal, window_size, aligned)
    K, V = _GatherKV.apply(k, v, 0, group)
    qv = q.narrow(0, first, end - first)
    if pad:
        qv = torch.cat([qv, qv.new_zeros(pad, *q.shape[1:])])
    slopes = alibi_slopes
    if slopes is not None and slopes.dim() == 2:
        slopes = slopes[torch.tensor(b, dtype=torch.long, device=slopes.device)]
    dev = cu_seqlens.device
    kv = [x.narrow(0, k0, cu_k[-1]) for x in (K, V)]
    out = flash_attn_varlen_func(
        qv, *kv, torch.tensor(cu_q, dtype=torch.int32, device=dev),
        torch.tensor(cu_k, dtype=torch.int32, device=dev), max_q, max_k,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        alibi_slopes=slopes)
    # every rank's out depends on K and V (an empty call included), so every rank's backward
    # reaches _GatherKV's all_to_all
    return torch.cat([q.new_zeros(first, *q.shape[1:]), out[:end - first],
                      q.new_zeros(t_local - end, *q.shape[1:])])
