#!/usr/bin/env python3
"""flashattn's CUDA KV-cache decode: cache-read bandwidth against the GPU's copy bandwidth and
torch SDPA on the same cache, in one run.

The grid (issue 48's): one query token, H = 32 query heads, Hk = 8 KV heads, D = 128, bf16
cache; batch B in {1, 8, 64} (--batches), cache length L in {1024, 16384, 131072} (--lengths;
configurations whose K and V exceed --max-cache-gb are left out); layouts contiguous (B, L, Hk,
D) and paged, pages of 16 and 256 rows behind a shuffled block table (--layouts). Per
configuration it fills one cache with random values and times

  flashattn    flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=L,
               causal=True [, block_table]) — the plug-in's split-KV decode, num_splits = 0 —
               with cache_seqlens and block_table as CPU tensors (a serving loop's scheduler
               has them there);
  fa-dev-idx   the same with cache_seqlens and block_table on the GPU, which the library
               copies back to check them (a wait for the stream each call);
  sdpa         torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True) on
               (B, H, 1, D) and (B, Hk, L, D) views of the contiguous cache (no copies; the paged
               rows compare with it too: torch has no paged attention).

Bandwidth: the bytes of K and V the call must read, B·L·Hk·D·2 bytes·2, over its median time;
"%copy" divides it by the copy bandwidth measured first in the same run (a device-to-device copy
of --probe-gb GiB: read + write bytes over its median time). Agreement first: max |out - ref| /
max |ref| against SDPA's output must be <= --tol (2e-2, bf16). Timing as gpu_bench.py (medians of
CUDA-event or Triton runs).

    python3 bench/gpu_bench_decode.py --time-budget 90 --json out.json

Exit status: 0 when flashattn ran and agreed everywhere it ran, 1 otherwise, 2 without a GPU.
"""

import argparse
import datetime
import json
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench as gb  # noqa: E402  (the shared loaders, timers and checks)

H, HK, D = 32, 8, 128
LAYOUTS = ["contiguous", "paged16", "paged256"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", metavar="LIST", default="1,8,64")
    ap.add_argument("--lengths", metavar="LIST", default="1024,16384,131072")
    ap.add_argument("--layouts", metavar="LIST", default=",".join(LAYOUTS))
    ap.add_argument("--max-cache-gb", type=float, default=8.0,
                    help="leave out configurations whose K and V take more (GiB)")
    ap.add_argument("--probe-gb", type=float, default=2.0)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--target-ms", type=float, default=50.0)
    ap.add_argument("--timer", choices=["auto", "triton", "events"], default="auto")
    ap.add_argument("--time-budget", type=float, metavar="SECONDS",
                    help="start no new configuration after this many seconds")
    ap.add_argument("--library", metavar="PATH", help="libflashattn.so to load")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.lengths = [int(s) for s in args.lengths.split(",")]
    args.layouts = args.layouts.split(",")
    for lay in args.layouts:
        if lay not in LAYOUTS:
            ap.error(f"--layouts: {lay!r} is not one of {', '.join(LAYOUTS)}")
    return args


def cache_bytes(B, L):
    return B * L * HK * D * 2 * 2  # K and V, bf16


def copy_bandwidth(torch, timer, gib):
    """GB/s of a device-to-device copy (bytes read + written over the median time)."""
    n = int(gib * (1 << 30)) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    ms, _ = timer(lambda: dst.copy_(src), 50.0)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def block_table(torch, B, L, page, g):
    """(B, ceil(L / page)) int32 on the GPU: the pages of all rows in shuffled order."""
    per = (L + page - 1) // page
    return torch.randperm(B * per, generator=g).reshape(B, per).to(torch.int32).cuda()


def paged(torch, cache, page, bt):
    """cache (B, L, Hk, D) as pages of `page` rows: page bt[b, i] holds rows i·page.. of b."""
    B, L = cache.shape[:2]
    per = bt.shape[1]
    if per * page != L:
        pad = torch.zeros((B, per * page - L, HK, D), dtype=cache.dtype, device=cache.device)
        cache = torch.cat([cache, pad], dim=1)
    pages = torch.empty((B * per, page, HK, D), dtype=cache.dtype, device=cache.device)
    pages[bt.reshape(-1).long()] = cache.reshape(B * per, page, HK, D)
    return pages


def bench_config(torch, fa, fa_ok, fa_why, timer, args, B, L):
    import torch.nn.functional as F

    recs = []
    g = torch.Generator(device="cuda").manual_seed(args.seed + B * 1000003 + L)
    gc = torch.Generator().manual_seed(args.seed + B + L)
    q = torch.randn((B, 1, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
    kc, vc = (torch.randn((B, L, HK, D), device="cuda", dtype=torch.bfloat16, generator=g)
              for _ in range(2))
    lens = torch.full((B,), L, dtype=torch.int32)  # on the host
    nbytes = cache_bytes(B, L)

    def sdpa():
        return F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2),
                                              vc.transpose(1, 2), enable_gqa=True).transpose(1, 2)

    ref, sdpa_why = gb.run_checked(torch, sdpa)
    sdpa_ms = None
    if ref is not None:
        sdpa_ms, _ = timer(sdpa, args.target_ms)
    for lay in args.layouts:
        rec = {"B": B, "L": L, "layout": lay, "bytes": nbytes, "backends": {}, "check": {}}
        if lay == "contiguous":
            k, v, extra = kc, vc, {}
        else:
            page = int(lay[len("paged"):])
            bt = block_table(torch, B, L, page, gc)
            k, v = paged(torch, kc, page, bt), paged(torch, vc, page, bt)
            extra = {"block_table": bt}

        def fa_call(k=k, v=v, extra=extra):
            return fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, **extra)

        dev_extra = {n: t.cuda() for n, t in extra.items()}
        lens_dev = lens.cuda()

        def fa_dev(k=k, v=v, extra=dev_extra):
            return fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens_dev, causal=True,
                                              **extra)

        if not fa_ok:
            rec["backends"]["flashattn"] = {"error": fa_why}
        else:
            out, why = gb.run_checked(torch, fa_call)
            if why is not None:
                rec["backends"]["flashattn"] = {"error": why}
            else:
                if ref is not None:
                    e = gb.rel_err(torch, out, ref)
                    rec["check"]["flashattn"] = e
                    if not (e <= args.tol):
                        rec["check"]["mismatch"] = True
                        print(f"\n!!! MISMATCH: B={B} L={L} {lay}: out vs sdpa: {e:.3e} > "
                              f"{args.tol:g} !!!\n", file=sys.stderr, flush=True)
                for name, fn in (("flashattn", fa_call), ("fa-dev-idx", fa_dev)):
                    ms, n = timer(fn, args.target_ms)
                    rec["backends"][name] = {"ms": ms, "runs": n,
                                             "gbps": nbytes / (ms * 1e-3) / 1e9}
        if sdpa_ms is not None:
            rec["backends"]["sdpa"] = {"ms": sdpa_ms, "gbps": nbytes / (sdpa_ms * 1e-3) / 1e9}
        else:
            rec["backends"]["sdpa"] = {"error": sdpa_why}
        fa_ms = rec["backends"]["flashattn"].get("ms")
        rec["ratio_vs_sdpa"] = sdpa_ms / fa_ms if (sdpa_ms and fa_ms) else None
        recs.append(rec)
    return recs


def _f(rec, name, key, fmt):
    b = rec["backends"].get(name, {})
    return "n/a" if key not in b else format(b[key], fmt)


def table(results, copy_gbps):
    head = (f"{'B':>3} {'L':>7} {'layout':>10} | {'fa us':>9} {'GB/s':>7} {'%copy':>6} | "
            f"{'dev-idx us':>10} | {'sdpa us':>9} {'GB/s':>7} | {'vs sdpa':>7} | {'check':>10}")
    lines = [head, "-" * len(head)]
    for r in results:
        fa = r["backends"].get("flashattn", {})
        pct = f"{100 * fa['gbps'] / copy_gbps:.0f}%" if "gbps" in fa and copy_gbps else "n/a"
        us = lambda n: "n/a" if "ms" not in r["backends"].get(n, {}) else \
            f"{1e3 * r['backends'][n]['ms']:.1f}"  # noqa: E731
        lines.append(f"{r['B']:>3} {r['L']:>7} {r['layout']:>10} | {us('flashattn'):>9} "
                     f"{_f(r, 'flashattn', 'gbps', '.0f'):>7} {pct:>6} | {us('fa-dev-idx'):>10} | "
                     f"{us('sdpa'):>9} "
                     f"{_f(r, 'sdpa', 'gbps', '.0f'):>7} | {gb._ratio(r.get('ratio_vs_sdpa')):>7}"
                     f" | {gb._check(r):>10}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    env = gb.setup(args)
    torch, fa, fa_ok, fa_why = env.torch, env.fa, env.fa_ok, env.fa_why
    timer_name, timer, info = env.timer_name, env.timer, env.info
    copy_gbps = copy_bandwidth(torch, timer, args.probe_gb)
    torch.cuda.empty_cache()
    configs = [(B, L) for L in args.lengths for B in args.batches
               if cache_bytes(B, L) <= args.max_cache_gb * (1 << 30)]
    left_out = [f"B={B} L={L}" for L in args.lengths for B in args.batches
                if (B, L) not in configs]
    results, skipped = [], []
    for i, (B, L) in enumerate(configs):
        elapsed = time.perf_counter() - t_start
        if args.time_budget is not None and elapsed > args.time_budget:
            skipped = [f"B={b} L={s}" for b, s in configs[i:]]
            break
        try:
            recs = bench_config(torch, fa, fa_ok, fa_why, timer, args, B, L)
            torch.cuda.empty_cache()  # this configuration's caches, before the next one
        except Exception as e:  # e.g. out of memory
            recs = [{"B": B, "L": L, "layout": lay, "bytes": cache_bytes(B, L), "check": {},
                     "backends": {"flashattn": {"error": gb.short(e)}}} for lay in args.layouts]
        for r in recs:
            r["tol"] = args.tol
        results += recs
        print(f"[{i + 1}/{len(configs)}] B={B} L={L}: " + ", ".join(
            f"{r['layout']} {_f(r, 'flashattn', 'gbps', '.0f')} GB/s" for r in recs) +
            f" ({time.perf_counter() - t_start - elapsed:.1f} s)", file=sys.stderr, flush=True)

    ran = [r for r in results if "ms" in r["backends"].get("flashattn", {})]
    bad = [r for r in results if r["check"].get("mismatch") or
           "error" in r["backends"].get("flashattn", {})]
    rc = 0 if ran and not bad else 1
    verdict = (f"flashattn decode ran {len(ran)} of {len(results) + 3 * len(skipped)} "
               f"configurations" + (f"; {len(bad)} failed or disagreed" if bad else ""))
    if args.json:
        doc = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
               "machine": info, "timer": timer_name, "copy_gbps": copy_gbps, "tol": args.tol,
               "results": results, "skipped": skipped, "left_out": left_out,
               "verdict": verdict, "ok": rc == 0}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    print()
    print(f"GPU KV-cache decode, bf16, Sq=1, H={H}, Hk={HK}, D={D}, causal: {info['gpu']}; torch "
          f"{info['torch']}; timer {timer_name}; copy bandwidth {copy_gbps:.0f} GB/s (read + "
          f"write of {args.probe_gb:g} GiB); GB/s = K and V bytes / time; dev-idx = cache_seqlens "
          f"and block_table on the GPU (fa us: on the host); vs sdpa = sdpa time / flashattn "
          f"time (>1: flashattn faster; sdpa reads the contiguous cache)")
    print(table(results, copy_gbps))
    if left_out:
        print(f"left out (K+V > {args.max_cache_gb:g} GiB): " + ", ".join(left_out))
    if skipped:
        print(f"not run (time budget {args.time_budget:g} s): " + ", ".join(skipped))
    print(verdict)
    return rc


if __name__ == "__main__":
    sys.exit(main())
