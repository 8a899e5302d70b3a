"""Context parallelism on gloo over loopback: flashattn.parallel's ring and all-gather attention,
forward + backward, on W ranks of S_local tokens each, against one process running
flash_attn_func over the whole sequence of W·S_local tokens.

    python bench/parallel_bench.py [--worlds 2,4] [--seqlens 1024,2048,4096,8192]
                                   [--heads 4] [--dim 64] [--runs 3] [--md FILE]

Every process (each rank and the single one) runs flashattn on FA_NUM_THREADS threads (1 by
default), so W ranks use W threads against the single process's one. Per row: the median over
--runs (after a warm-up call) of the slowest rank's time (a step ends when every rank has); `comm` is the part of it a
rank spent blocked in communication (ring: waiting for a transfer posted before the block's
compute; all-gather: inside all_gather/all_to_all), the rest is compute; efficiency is
ring-flash-attention's: single-process time / (W · per-rank time), 1.0 when W ranks are W times
faster. fp32, causal, B = 1, Hk = H.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

os.environ.setdefault("FA_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashattn  # noqa: E402
from flashattn import parallel  # noqa: E402
from flashattn.parallel import _all_gather, _ring  # noqa: E402

METHODS = (("ring", "contiguous"), ("ring", "zigzag"), ("all_gather", "zigzag"))


def _inputs(S, H, D):
    g = torch.Generator().manual_seed(S)
    return [torch.randn(1, S, H, D, generator=g) for _ in range(4)]  # q, k, v, dout


def _fwd_bwd(attend, q, k, v, dout):
    x = [t.clone().requires_grad_(True) for t in (q, k, v)]
    t0 = time.perf_counter()
    attend(*x).backward(dout)
    return time.perf_counter() - t0


class _Blocked:
    """Seconds spent inside the wrapped communication calls."""

    def __init__(self):
        self.s = 0.0

    def wrap(self, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.s += time.perf_counter() - t0
        return timed


def _worker(rank, world, port, outdir, S_local, H, D, runs):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    blocked = _Blocked()
    _ring._wait = blocked.wrap(_ring._wait)
    _all_gather.dist = type("dist", (), {
        "all_gather": staticmethod(blocked.wrap(dist.all_gather)),
        "all_to_all": staticmethod(blocked.wrap(dist.all_to_all)),
        "get_world_size": staticmethod(dist.get_world_size),
        "get_rank": staticmethod(dist.get_rank)})
    q, k, v, dout = _inputs(world * S_local, H, D)
    res = {}
    for method, split in METHODS:
        mine = [parallel.split_sequence(t, rank, world, split) for t in (q, k, v, dout)]
        fn = getattr(parallel, method + "_attention")
        times, comms = [], []
        _fwd_bwd(lambda *x: fn(*x, causal=True, split=split), *mine)  # warm-up, not timed
        for _ in range(runs):
            dist.barrier()
            blocked.s = 0.0
            times.append(_fwd_bwd(lambda *x: fn(*x, causal=True, split=split), *mine))
            comms.append(blocked.s)
        res[f"{method}/{split}"] = {"time": times, "comm": comms}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(world, S_local, H, D, runs):
    """{method: (median slowest-rank time, median comm of that rank)} over W spawned ranks."""
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, _free_port(), d, S_local, H, D, runs),
                           nprocs=world, join=True, start_method="spawn")
        every = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(world)]
    out = {}
    for m in every[0]:
        per_run = [max(range(world), key=lambda r: every[r][m]["time"][i]) for i in range(runs)]
        t = [every[r][m]["time"][i] for i, r in enumerate(per_run)]
        c = [every[r][m]["comm"][i] for i, r in enumerate(per_run)]
        out[m] = (statistics.median(t), statistics.median(c))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192", help="S_local, tokens per rank")
    ap.add_argument("--max-total", type=int, default=16384, help="skip W·S_local above this")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--md", help="also write the table to this Markdown file")
    a = ap.parse_args()
    rows = ["| W | S_local | S | method | single ms | per-rank ms | comm ms | compute ms | "
            "efficiency |", "|---|---|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for world in (int(w) for w in a.worlds.split(",")):
        for S_local in (int(s) for s in a.seqlens.split(",")):
            S = world * S_local
            if S > a.max_total:
                continue
            q, k, v, dout = _inputs(S, a.heads, a.dim)
            whole = [_fwd_bwd(lambda *x: flashattn.flash_attn_func(*x, causal=True), q, k, v,
                              dout) for _ in range(a.runs + 1)]
            single = statistics.median(whole[1:])  # the first is a warm-up
            for m, (t, c) in _ranks(world, S_local, a.heads, a.dim, a.runs).items():
                rows.append(f"| {world} | {S_local} | {S} | {m} | {single * 1e3:.0f} | "
                            f"{t * 1e3:.0f} | {c * 1e3:.0f} | {(t - c) * 1e3:.0f} | "
                            f"{single / (world * t):.2f} |")
                print(rows[-1], flush=True)
    if a.md:
        with open(a.md, "w") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
