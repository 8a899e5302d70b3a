#!/usr/bin/env python3
"""flashattn's CUDA forward + backward against PyTorch's SDPA flash and cuDNN backends, one run.

The grid: bf16, B·S = 16384 tokens, H·D = 2048 (gpu_bench.py's shapes), S in {1024, 2048, 4096}
by default (--seqlens), D in {64, 128}, causal and not. For each configuration it makes one set
of random q, k, v and dout on the GPU and times, per backend, one training step of attention:

    out = attention(q, k, v); out.backward(dout)        (q, k, v require grad)

  flashattn    flashattn.flash_attn_func on (B, S, H, D) CUDA tensors (the plug-in's forward and
               backward; deterministic: the gradients are the same bits on every run);
  torch-flash  scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION on (B, H, S, D)
               views (torch's built-in FA2, whose dQ is summed with atomics);
  cudnn        the same under SDPBackend.CUDNN_ATTENTION.

Agreement first: dq, dk, dv of each backend against torch-flash's (cuDNN's where torch-flash is
unavailable), max |g - ref| / max |ref| <= --tol (3e-2: bf16 gradients of two different bf16
kernels). Then the median time of the step (gpu_bench.py's timers). TFLOP/s count the forward's
4·B·H·S²·D (halved when causal) times 3.5: the backward does 2.5 times the forward's products,
flash-attn's convention. Ratios are speed ratios, backend time / flashattn time (> 1: flashattn
faster).

    python3 bench/gpu_bench_bwd.py --time-budget 90 --json out.json

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

SEQLENS = [1024, 2048, 4096]
BACKENDS = ["flashattn", "torch-flash", "cudnn"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", metavar="LIST", default=",".join(map(str, SEQLENS)))
    ap.add_argument("--dims", metavar="LIST", default="64,128")
    ap.add_argument("--causal", metavar="LIST", default="0,1")
    ap.add_argument("--tol", type=float, default=3e-2)
    ap.add_argument("--target-ms", type=float, default=100.0)
    ap.add_argument("--timer", choices=["auto", "triton", "events"], default="auto")
    ap.add_argument("--time-budget", type=float, metavar="SECONDS",
                    help="start no new configuration after this many seconds")
    ap.add_argument("--library", metavar="PATH", help="libflashattn.so to load")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.seqlens = [int(s) for s in args.seqlens.split(",")]
    args.dims = [int(d) for d in args.dims.split(",")]
    args.causal = [bool(int(c)) for c in args.causal.split(",")]
    for s in args.seqlens:
        if s <= 0 or gb.TOKENS % s:
            ap.error(f"--seqlens: {s} does not divide {gb.TOKENS} tokens")
    for d in args.dims:
        if d <= 0 or gb.HIDDEN % d:
            ap.error(f"--dims: {d} does not divide H*D = {gb.HIDDEN}")
    return args


def bench_config(torch, fa, fa_ok, fa_why, sdpa, timer, args, S, D, causal):
    import torch.nn.functional as F

    B, H = gb.TOKENS // S, gb.HIDDEN // D
    flops = 3.5 * 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    rec = {"S": S, "B": B, "H": H, "D": D, "causal": causal, "flops": flops, "backends": {},
           "check": {}}
    g = torch.Generator(device="cuda").manual_seed(args.seed + S * 1000 + D * 10 + causal)
    q, k, v, do = (torch.randn((B, S, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)

    def step(attn):
        def fn():
            for t in (q, k, v):
                t.grad = None
            attn().backward(do)
        return fn

    fns = {}
    if fa_ok:
        fns["flashattn"] = (step(lambda: fa.flash_attn_func(q, k, v, causal=causal)), None)
    else:
        rec["backends"]["flashattn"] = {"error": fa_why}
    for name in ("torch-flash", "cudnn"):
        ctx, why = sdpa[name]
        if ctx is None:
            rec["backends"][name] = {"error": why}
            continue
        attn = (lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=causal).transpose(1, 2))
        fns[name] = (step(attn), ctx)

    grads = {}
    for name, (fn, ctx) in fns.items():
        _, why = gb.run_checked(torch, fn, ctx)
        if why is not None:
            rec["backends"][name] = {"error": why}
        else:
            grads[name] = [t.grad.detach().clone() for t in (q, k, v)]
    ref = next((n for n in ("torch-flash", "cudnn") if n in grads), None)
    rec["check"]["reference"] = ref
    if ref is not None:
        for name, gr in grads.items():
            if name != ref:
                e = max(gb.rel_err(torch, a, b) for a, b in zip(gr, grads[ref]))
                rec["check"][name] = e
                if name == "flashattn" and not (e <= args.tol):
                    rec["check"]["mismatch"] = True
                    print(f"\n!!! MISMATCH: S={S} D={D} causal={int(causal)}: gradients vs "
                          f"{ref}: {e:.3e} > {args.tol:g} !!!\n", file=sys.stderr, flush=True)
    if "flashattn" in grads:  # deterministic: a second step gives the same bits
        fns["flashattn"][0]()
        rec["deterministic"] = all(torch.equal(t.grad, a)
                                   for t, a in zip((q, k, v), grads["flashattn"]))
    grads.clear()

    gb.time_backends(fns, rec, timer, args.target_ms)
    return rec


def table(results):
    head = (f"{'S':>6} {'B':>3} {'H':>3} {'D':>4} {'c':>1} | {'fa ms':>8} {'TF/s':>6} | "
            f"{'flash ms':>8} {'TF/s':>6} | {'cudnn ms':>8} {'TF/s':>6} | {'vs flash':>8} "
            f"{'vs cudnn':>8} | {'check':>10} {'det':>3}")
    lines = [head, "-" * len(head)]
    for r in results:
        det = {True: "yes", False: "NO"}.get(r.get("deterministic"), "n/a")
        lines.append(
            f"{r['S']:>6} {r['B']:>3} {r['H']:>3} {r['D']:>4} {int(r['causal']):>1} | "
            f"{gb._ms(r, 'flashattn'):>8} {gb._tf(r, 'flashattn'):>6} | "
            f"{gb._ms(r, 'torch-flash'):>8} {gb._tf(r, 'torch-flash'):>6} | "
            f"{gb._ms(r, 'cudnn'):>8} {gb._tf(r, 'cudnn'):>6} | "
            f"{gb._ratio(r.get('ratio_vs_torch_flash')):>8} "
            f"{gb._ratio(r.get('ratio_vs_cudnn')):>8} | {gb._check(r):>10} {det:>3}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    env = gb.setup(args)
    torch, fa, fa_ok, fa_why = env.torch, env.fa, env.fa_ok, env.fa_why
    timer_name, timer, info = env.timer_name, env.timer, env.info
    sdpa = gb.sdpa_backends(torch)
    configs = [(S, D, c) for S in args.seqlens for D in args.dims for c in args.causal]
    results, skipped = [], []
    for i, (S, D, c) in enumerate(configs):
        elapsed = time.perf_counter() - t_start
        if args.time_budget is not None and elapsed > args.time_budget:
            skipped = [f"S={s} D={d} causal={int(cc)}" for s, d, cc in configs[i:]]
            break
        try:
            rec = bench_config(torch, fa, fa_ok, fa_why, sdpa, timer, args, S, D, c)
        except Exception as e:  # e.g. out of memory
            rec = {"S": S, "B": gb.TOKENS // S, "H": gb.HIDDEN // D, "D": D, "causal": c,
                   "check": {}, "backends": {n: {"error": gb.short(e)} for n in BACKENDS}}
        rec["tol"] = args.tol
        rec["seconds"] = round(time.perf_counter() - t_start - elapsed, 2)
        results.append(rec)
        print(f"[{i + 1}/{len(configs)}] S={S} D={D} causal={int(c)}: flashattn "
              f"{gb._ms(rec, 'flashattn')} ms, torch-flash {gb._ms(rec, 'torch-flash')} ms, "
              f"cudnn {gb._ms(rec, 'cudnn')} ms; check {gb._check(rec)} "
              f"({rec['seconds']:.1f} s)", file=sys.stderr, flush=True)

    ran = [r for r in results if "ms" in r["backends"].get("flashattn", {})]
    bad = [r for r in results if r["check"].get("mismatch") or r.get("deterministic") is False or
           "error" in r["backends"].get("flashattn", {})]
    rc = 0 if ran and not bad else 1
    verdict = (f"flashattn forward+backward ran {len(ran)} of {len(configs)} configurations"
               + (f"; {len(bad)} failed, disagreed or were not deterministic" if bad else ""))
    if args.json:
        doc = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
               "machine": info, "timer": timer_name, "tol": args.tol, "results": results,
               "skipped": skipped, "verdict": verdict, "ok": rc == 0}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    print()
    print(f"GPU forward + backward, bf16, B*S={gb.TOKENS}, H*D={gb.HIDDEN}: {info['gpu']}; torch "
          f"{info['torch']}; timer {timer_name}; TF/s = 3.5 x forward FLOPs / time; ratios = "
          f"backend time / flashattn time (>1: flashattn faster); det = flashattn's gradients "
          f"bitwise equal over two steps")
    print(table(results))
    if skipped:
        print(f"not run (time budget {args.time_budget:g} s): " + ", ".join(skipped))
    print(verdict)
    return rc


if __name__ == "__main__":
    sys.exit(main())
