"""Ring attention: each rank keeps its queries and passes its K/V block around the ring of a
process group (dist.isend/irecv to rank + 1, from rank - 1), attending over one block while the
next is in flight; the partial results (out in fp32 from the kernel, unrounded, and lse) are
merged in fp32 in step order, and only the final output is rounded to q's dtype. The backward
goes around the ring again with the blocks, and each block's dK/dV travels with it, summed in
fp32 by every rank it passes (in ring order from its owner) before it returns home.

With W ranks, at step s rank r holds the K/V block of rank (r - s) mod W. Which of its queries
see which of the block's keys (_visible):
    not causal              every query, every key
    causal, contiguous      own block: causal; an earlier rank's: all keys; a later rank's: none
    causal, zigzag          own block (chunks r and 2W-1-r): causal; an earlier rank j < r: all
                            queries over chunk j (the block's first half); a later rank j > r:
                            the queries of chunk 2W-1-r (second half) over the whole block
Each case is one flashattn call on a slice of this rank's queries and a slice of the block.
"""

import torch
import torch.distributed as dist

from .. import _core
from .._torch_api import TorchBackend
from ._split import _agree, _fixed_fields, _local_problem

_ALL = slice(None)


def _visible(rank, src, causal, split, s_local):
    """(query rows, key rows, causal) of the one call for src's block on rank, or None."""
    if not causal:
        return _ALL, _ALL, False
    if src == rank:
        return _ALL, _ALL, True
    if split == "contiguous":
        return (_ALL, _ALL, False) if src < rank else None
    half = s_local // 2
    if src < rank:
        return _ALL, slice(0, half), False
    return slice(half, None), _ALL, False


class _Ring:
    """Point-to-point transfers to the next rank and from the previous one, posted together and
    waited together."""

    def __init__(self, group):
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        if group is not None:
            nxt, prv = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prv)
        self.next, self.prev = nxt, prv

    def shift(self, tensors):
        """Starts sending tensors to the next rank and receiving their likes from the previous
        one; returns (received tensors, requests)."""
        got = [torch.empty_like(t) for t in tensors]
        ops = []
        for tag, (t, g) in enumerate(zip(tensors, got)):
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group, tag))
            ops.append(dist.P2POp(dist.irecv, g, self.prev, self.group, tag))
        return got, dist.batch_isend_irecv(ops)


def _wait(reqs):
    for r in reqs:
        r.wait()


def _merge(out, lse, o_b, lse_b):
    """out, lse (fp32, (B, s, H, D) and (B, H, s)) updated in place with a partial o_b, lse_b
    of the same rows: a row with lse = -inf in both stays out = 0, lse = -inf."""
    m = torch.maximum(lse, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    a, b = torch.exp(lse - m), torch.exp(lse_b - m)
    total = a + b
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    wa, wb = ((w * inv).transpose(1, 2).unsqueeze(-1) for w in (a, b))
    out.mul_(wa).add_(o_b * wb)
    lse.copy_(m + torch.log(total))


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, group, causal, softcap, scale, split):
        ring = _Ring(group)
        B, S, H, D = q.shape
        out = torch.zeros((B, S, H, D), dtype=torch.float32, device=q.device)
        lse = torch.full((B, H, S), float("-inf"), dtype=torch.float32, device=q.device)
        kb, vb = k.contiguous(), v.contiguous()
        for step in range(ring.world):
            if step + 1 < ring.world:
                (kn, vn), reqs = ring.shift([kb, vb])
            vis = _visible(ring.rank, (ring.rank - step) % ring.world, causal, split, S)
            if vis is not None:
                qs, ks, c = vis
                o_b, lse_b, _, _ = _core.flash_attn_forward(
                    TorchBackend, q[:, qs], kb[:, ks], vb[:, ks], 0.0, scale, c, -1, -1, softcap,
                    None, False, out_dtype=torch.float32)
                _merge(out[:, qs], lse[:, :, qs], o_b, lse_b)
            if step + 1 < ring.world:
                _wait(reqs)
                kb, vb = kn, vn
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.split = group, causal, split
        ctx.softcap, ctx.scale = softcap, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        S = q.shape[1]
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kb, vb = k.contiguous(), v.contiguous()
        dkb = dvb = d_reqs = None
        for step in range(ring.world):
            if step + 1 < ring.world:
                (kn, vn), kv_reqs = ring.shift([kb, vb])
            vis = _visible(ring.rank, (ring.rank - step) % ring.world, ctx.causal, ctx.split, S)
            if vis is not None:
                qs, ks, c = vis
                dq_b, dk_b, dv_b = (torch.empty_like(t) for t in (q[:, qs], kb[:, ks], vb[:, ks]))
                _core.flash_attn_backward(
                    TorchBackend, dout[:, qs], q[:, qs], kb[:, ks], vb[:, ks], out[:, qs],
                    lse[:, :, qs], dq_b, dk_b, dv_b, 0.0, ctx.scale, c, -1, -1, ctx.softcap,
                    None, True)
                dq[:, qs] += dq_b
            # the block's dK/dV so far arrive from the previous rank (zeros at its owner) while
            # this rank computes its part; they go on to the next rank, which holds the block
            # next step, and after the last step home to the block's owner
            if d_reqs is None:
                dkb = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
                dvb = torch.zeros_like(dkb)
            else:
                _wait(d_reqs)
            if vis is not None:
                dkb[:, ks] += dk_b
                dvb[:, ks] += dv_b
            if ring.world > 1:
                (dkb, dvb), d_reqs = ring.shift([dkb, dvb])
            if step + 1 < ring.world:
                _wait(kv_reqs)
                kb, vb = kn, vn
        if ring.world > 1:
            _wait(d_reqs)
        return dq.to(q.dtype), dkb.to(k.dtype), dvb.to(v.dtype), None, None, None, None, None


def ring_attention(q, k, v, group=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None, softmax_scale=None, split="contiguous"):
    """flash_attn_func over a sequence split across group's ranks, by ring attention: q
    (B, S_local, H, D), k and v (B, S_local, Hk, D) are this rank's tokens (split_sequence);
    returns this rank's out (B, S_local, H, D), differentiable in q, k and v. Causal or full
    attention, GQA, softcap; deterministic for a fixed world size. Sliding windows and ALiBi
    need each key's distance to the query, which a block passed around the ring does not
    carry: they raise (all_gather_attention has them)."""
    problem = _local_problem(q, k, v, split, window_size)
    if not problem and (tuple(int(w) for w in window_size) != (-1, -1) or
                        alibi_slopes is not None):
        problem = ("sliding windows and ALiBi are not supported (a K/V block does not carry its "
                   "distance to the queries); use all_gather_attention, which has them")
    _agree("ring_attention", group, problem,
           lambda: _fixed_fields(q, k, v, split, causal, window_size, softcap, softmax_scale))
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return _RingAttention.apply(q, k, v, group, bool(causal), float(softcap), scale, split)
