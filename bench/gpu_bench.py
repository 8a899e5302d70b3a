#!/usr/bin/env python3
"""flashattn's CUDA forward against PyTorch's SDPA flash and cuDNN backends, in one run.

The grid (the issue's): bf16, B·S = 16384 tokens, H·D = 2048, S in {512, 1024, 2048, 4096, 8192,
16384}, D in {64, 128}, causal and not (24 configurations). For each one it makes one set of
random inputs on the GPU and runs

  flashattn    flashattn.flash_attn_func(q, k, v, causal=...) on (B, S, H, D) CUDA tensors,
               through the Python package (python/ in this tree) and libflashattn's CUDA plug-in;
  torch-flash  torch.nn.functional.scaled_dot_product_attention under
               sdpa_kernel(SDPBackend.FLASH_ATTENTION) on (B, H, S, D) views (q.transpose(1, 2),
               no copies), is_causal=...: torch's built-in FA2, unless the process activated
               another implementation (torch.nn.attention.activate_flash_attention_impl); the
               report names the one that ran;
  cudnn        the same under sdpa_kernel(SDPBackend.CUDNN_ATTENTION);
  fa-other-tile  at D = 128 only: flashattn again with FA_CUDA_TILE_D128 naming the tensor-core
               kernel's other tile (128x32 where flashattn ran 128x64, the default from sm_90
               on, and 128x64 where it ran 128x32), so that the GPU says which tile should be
               the default. It is checked like flashattn, and its own table follows the main
               one.

Before the grid it measures the run's ceilings: the rate of mma.sync m16n8k16 bf16 (the
instruction of the forward's products, flashattn's and FA2's) and of ex2.approx, by fa_cuda_peak
(bench/cuda_peak.cu, built next to the plug-in; --peak-exe PATH, else next to the library), and a
bf16 8192^3 matmul through torch (cuBLAS: the chip's dense rate, wgmma on Hopper). The table's
%mma columns are TFLOP/s over the mma.sync rate.

It first checks agreement: max |out - ref| / max |ref| against torch-flash's output (cuDNN's where
torch-flash is unavailable), which must be <= --tol (2e-2 for bf16); a disagreement is printed
loudly and makes the exit status 1. Then it times each backend with CUDA events: a warm-up, then
the median of several runs (triton.testing.do_bench with return_mode="median" when Triton
imports, else its own event loop; fewer runs where one call is long). TFLOP/s follow flash-attn's
convention, 4·B·H·S²·D, halved when causal; the ratios are speed ratios, backend time / flashattn
time, so > 1 means flashattn is faster. A backend that is unavailable or fails is "n/a" with the
reason; the run goes on.

    python3 bench/gpu_bench.py                       # the whole grid (not yet timed on a GPU)
    python3 bench/gpu_bench.py --quick               # 4 configurations
    python3 bench/gpu_bench.py --check-only          # agreement only, no timing
    python3 bench/gpu_bench.py --time-budget 240 --json out.json --md out.md

The library: --library PATH, else FLASHATTN_LIBRARY, else build-gpu/libflashattn.so of this tree
when it exists (scripts/gpu-check.sh builds it there), else the package's own search. Exit status:
0 when flashattn ran and agreed on every configuration run, 1 when it disagreed, failed or could
not run, 2 when there is no CUDA GPU for torch (or no torch).
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TOKENS = 16384   # B * S
HIDDEN = 2048    # H * D
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
DIMS = [64, 128]
QUICK_SEQLENS = [1024, 8192]
QUICK_DIMS = [128]
BACKENDS = ["flashattn", "torch-flash", "cudnn"]
TILE_ENV = "FA_CUDA_TILE_D128"  # read by the plug-in at every call
TILES_D128 = ("128x32", "128x64")
ALT = "fa-other-tile"           # the backend name of flashattn with the other tile, D = 128 only
OURS = ("flashattn", ALT)


def d128_tiles(capability, env):
    """(the tile flashattn runs at D = 128, the other one) on a GPU of this (major, minor)
    capability with FA_CUDA_TILE_D128 = env: the tile env names, else the plug-in's default
    (fa__mma_d128_block_n in cuda/fwd_mma.cu: 128x64 from sm_90 on, 128x32 before)."""
    tile = env if env in TILES_D128 else ("128x64" if capability[0] >= 9 else "128x32")
    return tile, TILES_D128[1 - TILES_D128.index(tile)]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="flashattn's CUDA forward vs PyTorch SDPA (flash and cuDNN backends), bf16, "
                    "B*S = 16384, H*D = 2048.",
        epilog="Exit status: 0 ok; 1 flashattn disagreed, failed or could not run; 2 no CUDA GPU "
               "for torch.")
    ap.add_argument("--quick", action="store_true",
                    help=f"S in {QUICK_SEQLENS}, D in {QUICK_DIMS}, causal and not")
    ap.add_argument("--check-only", action="store_true",
                    help="check agreement only, time nothing")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--md", metavar="FILE", help="write the results as a Markdown report")
    ap.add_argument("--time-budget", type=float, metavar="SECONDS",
                    help="start no new configuration after this many seconds")
    ap.add_argument("--seqlens", metavar="LIST", help="comma-separated S values")
    ap.add_argument("--dims", metavar="LIST", help="comma-separated D values")
    ap.add_argument("--causal", metavar="LIST", default="0,1", help="0, 1 or 0,1 (default)")
    ap.add_argument("--tol", type=float, default=2e-2,
                    help="agreement bound, max|out-ref|/max|ref| (default 2e-2, bf16)")
    ap.add_argument("--target-ms", type=float, default=100.0,
                    help="timed milliseconds per backend and configuration (default 100)")
    ap.add_argument("--timer", choices=["auto", "triton", "events"], default="auto",
                    help="auto: triton.testing.do_bench when Triton imports, else CUDA events")
    ap.add_argument("--library", metavar="PATH", help="libflashattn.so to load")
    ap.add_argument("--peak-exe", metavar="PATH",
                    help="fa_cuda_peak to run for the mma.sync and ex2 ceilings (default: the "
                         "one next to the library, else build-gpu/fa_cuda_peak)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.quick:
        args.seqlens = args.seqlens or ",".join(map(str, QUICK_SEQLENS))
        args.dims = args.dims or ",".join(map(str, QUICK_DIMS))
    args.seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else SEQLENS
    args.dims = [int(d) for d in args.dims.split(",")] if args.dims else DIMS
    args.causal = [bool(int(c)) for c in args.causal.split(",")]
    for s in args.seqlens:
        if s <= 0 or TOKENS % s:
            ap.error(f"--seqlens: {s} does not divide {TOKENS} tokens")
    for d in args.dims:
        if d <= 0 or HIDDEN % d:
            ap.error(f"--dims: {d} does not divide H*D = {HIDDEN}")
    return args


def short(e):
    """One line for an exception."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------

def load_torch():
    try:
        import torch
    except Exception as e:
        print(f"gpu_bench.py: cannot import torch ({short(e)}); this benchmark needs PyTorch "
              f"with CUDA and an NVIDIA GPU", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print(f"gpu_bench.py: CUDA is not available: torch {torch.__version__} (built for CUDA "
              f"{torch.version.cuda or 'none: a CPU-only build'}) sees no GPU. This benchmark "
              f"needs an NVIDIA GPU, its driver and torch with CUDA.", file=sys.stderr)
        sys.exit(2)
    return torch


def load_flashattn(args):
    """(module or None, available, reason)."""
    if args.library:
        os.environ["FLASHATTN_LIBRARY"] = os.path.abspath(args.library)
    elif not os.environ.get("FLASHATTN_LIBRARY"):
        cand = os.path.join(ROOT, "build-gpu", "libflashattn.so")
        if os.path.exists(cand):
            os.environ["FLASHATTN_LIBRARY"] = cand
    pkg = os.path.join(ROOT, "python")
    if os.path.isdir(os.path.join(pkg, "flashattn")) and pkg not in sys.path:
        sys.path.insert(0, pkg)
    try:
        import flashattn
    except Exception as e:
        return None, False, f"import flashattn: {short(e)}"
    try:
        ok, why = flashattn.cuda_available()
    except AttributeError:
        ok, why = False, "this flashattn package has no cuda_available() (too old)"
    return flashattn, ok, why


def setup(args):
    """What every benchmark here starts with: torch (exit 2 without a GPU), flashattn, the timer
    and the machine's description, as one namespace."""
    import types

    torch = load_torch()
    fa, fa_ok, fa_why = load_flashattn(args)
    timer_name, timer = make_timer(torch, args.timer)
    return types.SimpleNamespace(torch=torch, fa=fa, fa_ok=fa_ok, fa_why=fa_why,
                                 timer_name=timer_name, timer=timer,
                                 info=machine_info(torch, fa))


def _try(f, default=None):
    try:
        return f()
    except Exception:
        return default


def torch_flash_impl(torch):
    """Which flash attention SDPA's FLASH_ATTENTION backend runs: torch's built-in FA2 unless
    another implementation was activated (torch.nn.attention.activate_flash_attention_impl, in
    newer torch), e.g. FA3; the issue's target is against FA2."""
    try:
        from torch.nn import attention
    except Exception as e:
        return f"unknown ({short(e)})"
    current = getattr(attention, "current_flash_attention_impl", None)
    if current is None:
        return "built-in (FA2; this torch cannot switch implementations)"
    try:
        name = current()
    except Exception as e:
        return f"unknown ({short(e)})"
    listed = _try(lambda: list(attention.list_flash_attention_impls()), [])
    others = f"; registered: {', '.join(map(str, listed))}" if listed else ""
    return (f"{name} (activated)" if name else "built-in (FA2)") + others


def machine_info(torch, fa):
    info = {"gpu": _try(torch.cuda.get_device_name, "unknown GPU"),
            "capability": _try(lambda: "sm_%d%d" % torch.cuda.get_device_capability(), "sm_?"),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cudnn": _try(torch.backends.cudnn.version),
            "python": platform.python_version(), "host": platform.node()}
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        info["driver"] = r.stdout.strip().splitlines()[0] if r.returncode == 0 else None
    except Exception:
        info["driver"] = None
    info["torch_flash_impl"] = torch_flash_impl(torch)
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if fa is not None:
        try:
            info["flashattn_library"] = fa.library_path()
            info["flashattn_build"] = fa.build_info()
        except Exception as e:
            info["flashattn_library"] = f"not loaded: {short(e)}"
    return info


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def make_timer(torch, kind):
    do_bench = None
    if kind in ("auto", "triton"):
        try:
            from triton.testing import do_bench
        except Exception as e:
            if kind == "triton":
                print(f"gpu_bench.py: --timer triton: {short(e)}; using CUDA events",
                      file=sys.stderr)
            do_bench = None

    def events(fn, target_ms):
        fn()  # warm-up (also the first-call costs: plug-in load, allocator growth)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        est = max(s.elapsed_time(e), 1e-3)
        for _ in range(min(10, max(0, int(25.0 / est)))):
            fn()
        n = min(200, max(3, int(target_ms / est)))
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(n)]
        for a, b in pairs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in pairs]
        return statistics.median(times), n

    def triton_bench(fn, target_ms):
        fn()  # warm-up and a first estimate, so a long call still gets >= 3 timed runs
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        est = (time.perf_counter() - t0) * 1e3
        rep = max(target_ms, 3.5 * est)
        try:
            ms = do_bench(fn, warmup=max(10.0, est), rep=rep, return_mode="median")
        except Exception as e:  # a Triton that cannot time here: fall back to plain events
            print(f"gpu_bench.py: triton do_bench failed ({short(e)}); timing with CUDA events",
                  file=sys.stderr)
            return events(fn, target_ms)
        return float(ms), max(1, int(rep / max(est, 1e-3)))

    if do_bench is not None:
        return "triton.testing.do_bench (median)", triton_bench
    return "CUDA events (median)", events


# ---------------------------------------------------------------------------------------------
# Ceilings
# ---------------------------------------------------------------------------------------------

PEAK_EXE = "fa_cuda_peak"
MATMUL_N = 8192


def peak_exe(args):
    """The fa_cuda_peak to run: --peak-exe, else the one next to the library, else the tree's
    build-gpu/ one (None when none exists)."""
    if args.peak_exe:
        return args.peak_exe
    lib = os.environ.get("FLASHATTN_LIBRARY")
    for d in ([os.path.dirname(os.path.abspath(lib))] if lib else []) + \
            [os.path.join(ROOT, "build-gpu")]:
        cand = os.path.join(d, PEAK_EXE)
        if os.path.exists(cand):
            return cand
    return None


def run_peak(exe, timeout=120):
    """fa_cuda_peak's JSON as a dict, or {"error": reason}."""
    if exe is None:
        return {"error": f"no {PEAK_EXE} next to the library or in build-gpu/ (built with the "
                         f"CUDA plug-in; --peak-exe PATH)"}
    try:
        r = subprocess.run([exe], capture_output=True, text=True, timeout=timeout)
    except Exception as e:
        return {"error": f"{exe}: {short(e)}"}
    why = (r.stderr.strip().splitlines() or [""])[-1][:300]
    if r.returncode != 0:
        return {"error": f"{exe} exited with {r.returncode}: {why}"}
    try:
        out = json.loads(r.stdout)
        if not (out["mma_bf16_tflops"] > 0 and out["ex2_gops"] > 0):
            raise ValueError("non-positive rates")
    except Exception as e:
        return {"error": f"{exe}: unreadable output ({short(e)}): {r.stdout.strip()[:200]}"}
    return out


def matmul_peak(torch, timer, target_ms):
    """bf16 MATMUL_N^3 through torch (cuBLAS) on random inputs: {"tflops", "ms"} or {"error"}."""
    try:
        g = torch.Generator(device="cuda").manual_seed(1)
        a, b = (torch.randn((MATMUL_N, MATMUL_N), device="cuda", dtype=torch.bfloat16,
                            generator=g) for _ in range(2))
        ms, _ = timer(lambda: torch.matmul(a, b), target_ms)
        del a, b
        return {"tflops": 2.0 * MATMUL_N ** 3 / (ms * 1e-3) / 1e12, "ms": ms}
    except Exception as e:
        return {"error": short(e)}


def ceilings_line(ceil):
    """One line: the ceilings measured in this run, or why each is n/a."""
    m, mm = ceil.get("mma", {}), ceil.get("matmul", {})
    mma = (f"mma.sync m16n8k16 bf16 {m['mma_bf16_tflops']:.1f} TFLOP/s, ex2.approx "
           f"{m['ex2_gops']:.0f} Gop/s ({PEAK_EXE})" if "error" not in m else
           f"mma.sync n/a ({m['error']})")
    mat = (f"bf16 matmul {MATMUL_N}^3 {mm['tflops']:.1f} TFLOP/s (torch)" if "error" not in mm
           else f"bf16 matmul n/a ({mm['error']})")
    return f"Ceilings measured in this run: {mma}; {mat}"


def _pct_mma(rec, name, ceil):
    """rec's TFLOP/s for backend name as a percentage of the mma.sync rate."""
    b, m = rec["backends"].get(name, {}), (ceil or {}).get("mma", {})
    if "tflops" not in b or "mma_bf16_tflops" not in m:
        return "n/a"
    return f"{100.0 * b['tflops'] / m['mma_bf16_tflops']:.0f}%"


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------

def sdpa_backends(torch):
    """name -> (context factory, None) or (None, reason)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:
        why = f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel ({short(e)})"
        return {"torch-flash": (None, why), "cudnn": (None, why)}
    out = {}
    for name, attr in (("torch-flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
        be = getattr(SDPBackend, attr, None)
        if be is None:
            out[name] = (None, f"torch {torch.__version__} has no SDPBackend.{attr}")
        else:
            out[name] = ((lambda be=be: sdpa_kernel(be)), None)
    return out


@contextlib.contextmanager
def tile_env(tile):
    """FA_CUDA_TILE_D128 = tile inside, as it was after."""
    old = os.environ.get(TILE_ENV)
    os.environ[TILE_ENV] = tile
    try:
        yield
    finally:
        if old is None:
            del os.environ[TILE_ENV]
        else:
            os.environ[TILE_ENV] = old


def run_checked(torch, fn, ctx=None):
    """Runs fn once (inside ctx), synchronizes, and returns (output, None) or (None, reason);
    warnings that torch gives on the way (why a backend refused) go into the reason."""
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        try:
            if ctx is not None:
                with ctx():
                    out = fn()
            else:
                out = fn()
            torch.cuda.synchronize()
            return out, None
        except Exception as e:
            why = short(e)
            notes = [str(w.message).strip().splitlines()[0] for w in ws if str(w.message).strip()]
            if notes:
                why += " [" + "; ".join(dict.fromkeys(notes))[:400] + "]"
            return None, why


def rel_err(torch, a, ref):
    a = a.float()
    ref = ref.float()
    if a.shape != ref.shape:
        return float("inf")
    if torch.isnan(a).any() or torch.isinf(a).any():
        return float("nan")
    return float((a - ref).abs().max()) / max(float(ref.abs().max()), 1e-6)


def time_backends(fns, rec, timer, target_ms):
    """Times each backend of fns ({name: (fn, ctx or None)}) that has no error in rec, into
    rec["backends"][name] (ms, runs, TFLOP/s of rec["flops"]), and the speed ratios of
    torch-flash and cuDNN over flashattn into rec["ratio_vs_..."]."""
    for name, (fn, ctx) in fns.items():
        if "error" in rec["backends"].get(name, {}):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if ctx is not None:
                    with ctx():
                        ms, n = timer(fn, target_ms)
                else:
                    ms, n = timer(fn, target_ms)
            rec["backends"][name] = {"ms": ms, "runs": n,
                                     "tflops": rec["flops"] / (ms * 1e-3) / 1e12}
        except Exception as e:
            rec["backends"][name] = {"error": short(e)}
    fa_ms = rec["backends"].get("flashattn", {}).get("ms")
    for name in ("torch-flash", "cudnn"):
        ms = rec["backends"].get(name, {}).get("ms")
        rec["ratio_vs_" + name.replace("-", "_")] = (ms / fa_ms) if (ms and fa_ms) else None


# ---------------------------------------------------------------------------------------------
# One configuration
# ---------------------------------------------------------------------------------------------

def bench_config(torch, fa, fa_ok, fa_why, sdpa, timer, args, S, D, causal):
    import torch.nn.functional as F

    B, H = TOKENS // S, HIDDEN // D
    flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    rec = {"S": S, "B": B, "H": H, "D": D, "causal": causal, "dtype": "bf16", "flops": flops,
           "tol": args.tol, "backends": {}, "check": {}}
    g = torch.Generator(device="cuda").manual_seed(args.seed + S * 1000 + D * 10 + causal)
    q, k, v = (torch.randn((B, S, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D) views, no copies

    fns = {}
    if fa_ok:
        fns["flashattn"] = ((lambda: fa.flash_attn_func(q, k, v, causal=causal)), None)
        if D == 128:
            tile, other = d128_tiles(torch.cuda.get_device_capability(), os.environ.get(TILE_ENV))
            rec["tiles"] = {"flashattn": tile, ALT: other}
            fns[ALT] = ((lambda: fa.flash_attn_func(q, k, v, causal=causal)),
                        (lambda: tile_env(other)))
    else:
        rec["backends"]["flashattn"] = {"error": fa_why}
    for name in ("torch-flash", "cudnn"):
        ctx, why = sdpa[name]
        if ctx is None:
            rec["backends"][name] = {"error": why}
        else:
            fns[name] = ((lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)),
                         ctx)

    # 1. agreement
    outs = {}
    for name, (fn, ctx) in fns.items():
        out, why = run_checked(torch, fn, ctx)
        if why is not None:
            rec["backends"][name] = {"error": why}
        else:
            outs[name] = out if name in OURS else out.transpose(1, 2)
    ref_name = next((n for n in ("torch-flash", "cudnn") if n in outs), None)
    rec["check"]["reference"] = ref_name
    if ref_name is not None:
        for name, out in outs.items():
            if name != ref_name:
                e = rel_err(torch, out, outs[ref_name])
                rec["check"][name] = e
                if name in OURS and not (e <= args.tol):
                    rec["check"]["mismatch"] = True
                    print(f"\n!!! MISMATCH: S={S} D={D} causal={int(causal)}: {name} vs "
                          f"{ref_name}: max|diff|/max|ref| = {e:.3e} > {args.tol:g} !!!\n",
                          file=sys.stderr, flush=True)
    outs.clear()

    # 2. timing
    if not args.check_only:
        time_backends(fns, rec, timer, args.target_ms)
        fa_ms = rec["backends"].get("flashattn", {}).get("ms")
        if ALT in fns:
            alt_ms = rec["backends"].get(ALT, {}).get("ms")
            flash_ms = rec["backends"].get("torch-flash", {}).get("ms")
            rec["alt_ratio_vs_torch_flash"] = flash_ms / alt_ms if (flash_ms and alt_ms) else None
            rec["alt_speedup"] = fa_ms / alt_ms if (fa_ms and alt_ms) else None
    del q, k, v, qt, kt, vt
    return rec


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

def _ms(rec, name):
    b = rec["backends"].get(name, {})
    return "n/a" if "ms" not in b else f"{b['ms']:.3f}"


def _tf(rec, name):
    b = rec["backends"].get(name, {})
    return "n/a" if "tflops" not in b else f"{b['tflops']:.1f}"


def _ratio(x):
    return "n/a" if x is None else f"{x:.2f}x"


def _check(rec, name="flashattn"):
    c = rec["check"]
    if name not in c:
        return "n/a"
    e = c[name]
    return ("ok " if e <= rec.get("tol", float("inf")) else "FAIL ") + f"{e:.1e}"


def tile_rows(results):
    """The D = 128 records that timed or checked ALT."""
    return [r for r in results if ALT in r["backends"] or ALT in r["check"]]


def tile_names(rows):
    """(flashattn's tile, the other tile) of tile_rows' records."""
    t = rows[0].get("tiles", {})
    return t.get("flashattn", "?"), t.get(ALT, "?")


def tile_title(rows):
    tile, other = tile_names(rows)
    return (f"D = 128 tiles: flashattn as run above ({tile}) and with {TILE_ENV}={other}; "
            f"ratios are speed ratios (> 1: {other} faster)")


def tile_table(results):
    rows = tile_rows(results)
    if not rows:
        return ""
    tile, other = tile_names(rows)
    head = (f"{'S':>6} {'c':>1} | {tile + ' TF/s':>11} | {other + ' TF/s':>11} | "
            f"{other + ' vs flash':>15} | {other + ' / ' + tile:>15} | {'check':>10}")
    lines = [tile_title(rows), head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['S']:>6} {int(r['causal']):>1} | {_tf(r, 'flashattn'):>11} | "
                     f"{_tf(r, ALT):>11} | {_ratio(r.get('alt_ratio_vs_torch_flash')):>15} | "
                     f"{_ratio(r.get('alt_speedup')):>15} | {_check(r, ALT):>10}")
    return "\n".join(lines)


def table(results, check_only, ceil=None):
    if check_only:
        head = (f"{'S':>6} {'B':>3} {'H':>3} {'D':>4} {'causal':>6}  {'vs ref':>12}  "
                f"{'cudnn vs ref':>12}")
        lines = [head, "-" * len(head)]
        for r in results:
            cu = r["check"].get("cudnn")
            lines.append(f"{r['S']:>6} {r['B']:>3} {r['H']:>3} {r['D']:>4} {int(r['causal']):>6}  "
                         f"{_check(r):>12}  {('n/a' if cu is None else f'{cu:.1e}'):>12}")
        return "\n".join(lines)
    head = (f"{'S':>6} {'B':>3} {'H':>3} {'D':>4} {'c':>1} | {'fa ms':>8} {'TF/s':>6} "
            f"{'%mma':>4} | {'flash ms':>8} {'TF/s':>6} {'%mma':>4} | {'cudnn ms':>8} "
            f"{'TF/s':>6} | {'vs flash':>8} {'vs cudnn':>8} | {'check':>10}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['S']:>6} {r['B']:>3} {r['H']:>3} {r['D']:>4} {int(r['causal']):>1} | "
            f"{_ms(r, 'flashattn'):>8} {_tf(r, 'flashattn'):>6} "
            f"{_pct_mma(r, 'flashattn', ceil):>4} | "
            f"{_ms(r, 'torch-flash'):>8} {_tf(r, 'torch-flash'):>6} "
            f"{_pct_mma(r, 'torch-flash', ceil):>4} | "
            f"{_ms(r, 'cudnn'):>8} {_tf(r, 'cudnn'):>6} | "
            f"{_ratio(r.get('ratio_vs_torch_flash')):>8} {_ratio(r.get('ratio_vs_cudnn')):>8} | "
            f"{_check(r):>10}")
    return "\n".join(lines)


def reasons(results):
    """Distinct n/a reasons, one line each."""
    seen = {}
    for r in results:
        for name, b in r["backends"].items():
            if "error" in b:
                seen.setdefault((name, b["error"]), []).append(
                    f"S={r['S']} D={r['D']} c={int(r['causal'])}")
    out = []
    for (name, why), where in seen.items():
        at = "all configurations" if len(where) == len(results) else ", ".join(where[:4]) + \
            (" ..." if len(where) > 4 else "")
        out.append(f"n/a {name} ({at}): {why}")
    return out


def markdown(doc):
    m = doc["machine"]
    lines = [f"# GPU forward: flashattn vs PyTorch SDPA ({doc['date']})", "",
             f"- Command: `{doc['command']}`",
             f"- GPU: {m['gpu']} ({m['capability']}), driver {m.get('driver')}; torch "
             f"{m['torch']} (CUDA {m['torch_cuda']}, cuDNN {m.get('cudnn')}); torch flash "
             f"= {m.get('torch_flash_impl', 'not recorded')}",
             f"- flashattn: {m.get('flashattn_library')}; {m.get('flashattn_build', '')}",
             f"- bf16, B·S = {TOKENS}, H·D = {HIDDEN}; timer: {doc['timer']}; TFLOP/s = "
             f"4·B·H·S²·D / t (halved when causal); ratios = backend time / flashattn time "
             f"(> 1: flashattn faster); check = max|flashattn − ref|/max|ref|, ref = torch "
             f"flash's output (cuDNN's where that is n/a), bound {doc['tol']:g}"]
    if doc.get("ceilings"):
        lines.append(f"- {ceilings_line(doc['ceilings'])}; %mma = TFLOP/s over the mma.sync "
                     f"rate")
    lines.append("")
    rows = doc["results"]
    if doc["check_only"]:
        lines += ["| S | B | H | D | causal | flashattn vs ref | cuDNN vs ref |",
                  "|---:|---:|---:|---:|:---:|---:|---:|"]
        for r in rows:
            cu = r["check"].get("cudnn")
            lines.append(f"| {r['S']} | {r['B']} | {r['H']} | {r['D']} | {int(r['causal'])} | "
                         f"{_check(r)} | {'n/a' if cu is None else f'{cu:.1e}'} |")
    else:
        ceil = doc.get("ceilings")
        lines += ["| S | B | H | D | causal | flashattn ms | TFLOP/s | %mma | torch flash ms | "
                  "TFLOP/s | %mma | cuDNN ms | TFLOP/s | vs flash | vs cuDNN | check |",
                  "|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                  "---|"]
        for r in rows:
            lines.append(
                f"| {r['S']} | {r['B']} | {r['H']} | {r['D']} | {int(r['causal'])} | "
                f"{_ms(r, 'flashattn')} | {_tf(r, 'flashattn')} | "
                f"{_pct_mma(r, 'flashattn', ceil)} | {_ms(r, 'torch-flash')} | "
                f"{_tf(r, 'torch-flash')} | {_pct_mma(r, 'torch-flash', ceil)} | "
                f"{_ms(r, 'cudnn')} | {_tf(r, 'cudnn')} | "
                f"{_ratio(r.get('ratio_vs_torch_flash'))} | {_ratio(r.get('ratio_vs_cudnn'))} | "
                f"{_check(r)} |")
    alt = tile_rows(rows)
    if alt:
        tile, other = tile_names(alt)
        lines += ["", tile_title(alt) + ".", "",
                  f"| S | causal | {tile} TFLOP/s | {other} TFLOP/s | {other} vs flash | "
                  f"{other} / {tile} | check |", "|---:|:---:|---:|---:|---:|---:|---|"]
        for r in alt:
            lines.append(f"| {r['S']} | {int(r['causal'])} | {_tf(r, 'flashattn')} | "
                         f"{_tf(r, ALT)} | {_ratio(r.get('alt_ratio_vs_torch_flash'))} | "
                         f"{_ratio(r.get('alt_speedup'))} | {_check(r, ALT)} |")
    notes = reasons(rows)
    if doc["skipped"]:
        notes.append("not run (time budget): " + ", ".join(doc["skipped"]))
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", f"Verdict: {doc['verdict']}", ""]
    return "\n".join(lines)


def verdict_of(results, skipped):
    """(verdict line, exit status): 1 when flashattn (at D = 128 also with the other tile)
    disagreed with the reference, failed or could not run anywhere, or nothing ran."""
    mismatches = [r for r in results if r["check"].get("mismatch")]
    fa_errors = [(r, n) for r in results for n in OURS if "error" in r["backends"].get(n, {})]
    unchecked = [r for r in results if "flashattn" not in r["check"] and
                 "error" not in r["backends"].get("flashattn", {})]
    if not results:
        verdict, rc = "FAIL: no configuration was run", 1
    elif mismatches:
        verdict, rc = f"FAIL: flashattn (or {ALT}) disagrees with the reference on " \
                      f"{len(mismatches)} configuration(s)", 1
    elif fa_errors:
        r, n = fa_errors[0]
        verdict, rc = f"FAIL: flashattn failed or could not run on {len(fa_errors)} " \
                      f"configuration(s); first, {n} at S={r['S']} D={r['D']} " \
                      f"causal={int(r['causal'])}: {r['backends'][n]['error']}", 1
    else:
        verdict, rc = "ok: flashattn agrees with the reference on every configuration run", 0
        if unchecked:
            verdict += f" ({len(unchecked)} without a torch reference to check against)"
    if skipped:
        verdict += f"; {len(skipped)} configuration(s) not run (time budget)"
    return verdict, rc


# ---------------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    env = setup(args)
    torch, fa, fa_ok, fa_why = env.torch, env.fa, env.fa_ok, env.fa_why
    timer_name, timer, info = env.timer_name, env.timer, env.info
    if not fa_ok:
        print(f"gpu_bench.py: flashattn cannot run on the GPU: {fa_why}", file=sys.stderr)
    sdpa = sdpa_backends(torch)
    print(f"gpu_bench.py: {info['gpu']} ({info['capability']}), torch {info['torch']} (flash: "
          f"{info.get('torch_flash_impl')}), flashattn library {info.get('flashattn_library')}; "
          f"timer: {timer_name}", file=sys.stderr, flush=True)

    ceil = None
    if not args.check_only:
        exe = peak_exe(args)
        print(f"gpu_bench.py: ceilings: {exe or PEAK_EXE + ' (not found)'} and a bf16 "
              f"{MATMUL_N}^3 matmul", file=sys.stderr, flush=True)
        with torch.inference_mode():
            ceil = {"mma": run_peak(exe), "matmul": matmul_peak(torch, timer, args.target_ms)}
        print(f"gpu_bench.py: {ceilings_line(ceil)}", file=sys.stderr, flush=True)

    configs = [(S, D, c) for S in args.seqlens for D in args.dims for c in args.causal]
    results, skipped = [], []
    with torch.inference_mode():
        for i, (S, D, c) in enumerate(configs):
            elapsed = time.perf_counter() - t_start
            if args.time_budget is not None and elapsed > args.time_budget:
                skipped += [f"S={s} D={d} causal={int(cc)}" for s, d, cc in configs[i:]]
                print(f"gpu_bench.py: time budget {args.time_budget:g} s spent after "
                      f"{elapsed:.0f} s: {len(configs) - i} configurations not run",
                      file=sys.stderr, flush=True)
                break
            try:
                rec = bench_config(torch, fa, fa_ok, fa_why, sdpa, timer, args, S, D, c)
            except Exception as e:  # e.g. out of memory making the inputs
                B, H = TOKENS // S, HIDDEN // D
                rec = {"S": S, "B": B, "H": H, "D": D, "causal": c, "dtype": "bf16",
                       "flops": 4.0 * B * H * S * S * D * (0.5 if c else 1.0), "tol": args.tol,
                       "check": {},
                       "backends": {n: {"error": short(e)} for n in BACKENDS}}
            rec["seconds"] = round(time.perf_counter() - t_start - elapsed, 2)
            results.append(rec)
            b = rec["backends"]
            print(f"[{i + 1}/{len(configs)}] S={S} D={D} causal={int(c)}: " + ", ".join(
                f"{n} {b[n]['ms']:.3f} ms" if "ms" in b.get(n, {}) else
                (f"{n} n/a" if "error" in b.get(n, {}) else f"{n} checked")
                for n in BACKENDS + ([ALT] if D == 128 and fa_ok else [])) +
                f"; check {_check(rec)}" +
                (f", {ALT} {_check(rec, ALT)}" if ALT in rec["check"] else "") +
                f" ({rec['seconds']:.1f} s)",
                file=sys.stderr, flush=True)

    verdict, rc = verdict_of(results, skipped)

    doc = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
           "machine": info, "timer": timer_name, "tol": args.tol, "check_only": args.check_only,
           "tokens": TOKENS, "hidden": HIDDEN, "ceilings": ceil, "results": results,
           "skipped": skipped,
           "seconds": round(time.perf_counter() - t_start, 1), "verdict": verdict, "ok": rc == 0,
           "flashattn_cuda": {"available": fa_ok, "reason": fa_why}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(doc))

    print()
    print(f"GPU forward, bf16, B*S={TOKENS}, H*D={HIDDEN}: {info['gpu']}; torch "
          f"{info['torch']}, flash = {info.get('torch_flash_impl')}; timer {timer_name}; "
          f"ratios = backend time / flashattn time (>1: flashattn faster)")
    if ceil:
        print(ceilings_line(ceil) + "; %mma = TFLOP/s over the mma.sync rate")
    print(table(results, args.check_only, ceil))
    tiles = tile_table(results)
    if tiles:
        print()
        print(tiles)
    for line in reasons(results):
        print(line)
    if skipped:
        print(f"not run (time budget {args.time_budget:g} s): " + ", ".join(skipped))
    print(f"{verdict} ({doc['seconds']:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
