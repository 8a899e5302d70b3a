# SPDX-License-Identifier: MIT
"""
context_parallel.py — causal attention over one sequence split across processes with
flashattn.parallel (torch.distributed; gloo on the CPU), forward and backward, checked against one
process doing the whole sequence.

    torchrun --nproc-per-node 2 examples/context_parallel.py [--seqlen 4096] [--split zigzag]
                                                             [--method ring|all_gather]

Every rank draws the same whole sequence (same seed), keeps its slice (split_sequence), runs
ring_attention or all_gather_attention (both, by default) and its backward, and compares its
output and gradients with the same rows of flash_attn_func over the whole sequence. Rank 0
prints the verdicts.
"""
import argparse
import sys

import torch
import torch.distributed as dist

import flashattn
from flashattn import parallel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--split", default="zigzag", choices=parallel.SPLITS)
    ap.add_argument("--method", choices=("ring", "all_gather"), action="append")
    args = ap.parse_args()

    dist.init_process_group("gloo")  # torchrun sets the rendezvous variables
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    B, H, Hk, D = 1, 8, 2, 64
    q = torch.randn(B, args.seqlen, H, D, generator=g)
    k, v = (torch.randn(B, args.seqlen, Hk, D, generator=g) for _ in range(2))
    dout = torch.randn(B, args.seqlen, H, D, generator=g)

    whole = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = flashattn.flash_attn_func(*whole, causal=True)
    ref.backward(dout)
    refs = [parallel.split_sequence(t, rank, world, args.split)
            for t in (ref.detach(), whole[0].grad, whole[1].grad, whole[2].grad)]

    mine = [parallel.split_sequence(t, rank, world, args.split) for t in (q, k, v, dout)]
    ok = True
    for method in args.method or ("ring", "all_gather"):
        attend = getattr(parallel, method + "_attention")
        x = [t.clone().requires_grad_(True) for t in mine[:3]]
        out = attend(*x, causal=True, split=args.split)
        out.backward(mine[3])
        got = [out.detach()] + [t.grad for t in x]
        worst = torch.tensor(max(float((a - b).abs().max()) for a, b in zip(got, refs)))
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        ok = ok and worst.item() <= 1e-4
        if rank == 0:
            print(f"{method}_attention, {world} ranks, {args.seqlen} tokens ({args.split} split): "
                  f"max |difference| from one process over out, dq, dk, dv: {worst.item():.2e} "
                  f"-> {'OK' if worst.item() <= 1e-4 else 'FAIL'}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
