#!/usr/bin/env python3
"""flashattn against PyTorch's scaled_dot_product_attention on the CPU, in one run.

For each configuration (the grid of `flashattn bench`: B=1, H=16, D in {64, 128}, Sq = Sk,
causal and not, fp32 and bf16, forward and backward) it makes one set of random inputs, gives
flashattn the BSHD layout (flash-attn's) and torch the same values as contiguous BHSD tensors
(SDPA's own layout), checks that the two outputs agree, then times both, interleaved, and prints
the medians and the ratio flashattn time / torch time (below 1: flashattn is faster).

    python3 bench/compare.py --quick                  # the short subset
    python3 bench/compare.py --install-torch --quick  # first install torch into .venv-bench

flashattn is called through the Python package (`import flashattn`, python/ in this tree) when it
imports, else straight through ctypes on libflashattn (build/libflashattn.so, or --lib, or
FLASHATTN_LIBRARY). The backward is timed alone: one forward with autograd, then
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) for each run, for both.

torch: torch.set_num_threads(--threads) and flashattn: FA_NUM_THREADS=--threads (default: the
number of CPUs this process may use, for both). FLOPs follow flash-attn's convention (forward
4*B*H*Sq*Sk*D, halved for causal; backward 2.5x).

--install-torch creates .venv-bench in the repository (gitignored) and pip-installs torch and
numpy from PyPI there, then runs the comparison with that interpreter. PyPI's Linux x86_64 torch
wheel depends on the CUDA runtime packages (several GB); a CPU-only wheel is not on PyPI (it is on
download.pytorch.org, which --torch-index-url can name where reachable), and torch installed
without its dependencies does not import (libcufile.so.0 is missing).
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, ".venv-bench")
VENV_PY = os.path.join(VENV, "bin", "python")

TOL = {"fp32": 1e-4, "bf16": 3e-2}


# ---------------------------------------------------------------------------------------------
# torch: find it, or install it into .venv-bench
# ---------------------------------------------------------------------------------------------

def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except Exception:  # ImportError, or OSError from a broken install
        return False


def in_bench_venv():
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def install_torch(index_url):
    t0 = time.time()
    if not os.path.exists(VENV_PY):
        print(f"compare.py: creating {VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True, stdout=sys.stderr)
    cmd = [VENV_PY, "-m", "pip", "install", "--disable-pip-version-check", "torch", "numpy"]
    if index_url:
        cmd += ["--index-url", index_url]
    print("compare.py: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=sys.stderr)  # keep stdout for the results table
    dt = time.time() - t0
    size = 0
    for dirpath, _, files in os.walk(VENV):
        for f in files:
            try:
                size += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    print(f"compare.py: torch installed in {dt:.0f} s; {VENV} is {size / 2**30:.1f} GiB",
          file=sys.stderr)


def reexec_in_venv(argv):
    args = [a for a in argv if a != "--install-torch"]
    os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + args)


# ---------------------------------------------------------------------------------------------
# flashattn: the Python package, else ctypes
# ---------------------------------------------------------------------------------------------

class CtypesFlash:
    """Minimal binding of fa_forward / fa_backward for contiguous BSHD torch tensors."""

    name = "ctypes on libflashattn"

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32),
                    ("device", ctypes.c_int32), ("device_index", ctypes.c_int32),
                    ("ndim", ctypes.c_int32), ("shape", ctypes.c_int64 * 4),
                    ("stride", ctypes.c_int64 * 4)]

    def __init__(self, path):
        import torch
        self.torch = torch
        self.lib = ctypes.CDLL(path)
        self.path = path
        self.lib.fa_build_info.restype = ctypes.c_char_p
        self.lib.fa_last_error_message.restype = ctypes.c_char_p
        self.lib.fa_params_init.argtypes = [ctypes.c_void_p]
        self.dtypes = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

    def build_info(self):
        return self.lib.fa_build_info().decode()

    def _t(self, x):
        t = self.Tensor()
        t.data = x.data_ptr()
        t.dtype = self.dtypes[x.dtype]
        t.ndim = x.dim()
        for i in range(x.dim()):
            t.shape[i] = x.shape[i]
            t.stride[i] = x.stride(i)
        return t

    def _params(self, causal):
        buf = ctypes.create_string_buffer(512)  # fa_params, filled by fa_params_init
        self.lib.fa_params_init(buf)
        ctypes.c_int32.from_buffer(buf, 8).value = 1 if causal else 0  # .causal, after size+scale
        return buf

    def _check(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: status {st}: {self.lib.fa_last_error_message().decode()}")

    def forward(self, q, k, v, causal):
        torch = self.torch
        B, S, H, _ = q.shape
        out = torch.empty_like(q)
        lse = torch.empty((B, H, S), dtype=torch.float32)
        ts = [self._t(x) for x in (q, k, v, out, lse)]
        self._check(self.lib.fa_forward(None, self._params(causal),
                                        *[ctypes.byref(t) for t in ts]), "fa_forward")
        return out, lse

    def backward(self, q, k, v, out, dout, lse, causal):
        torch = self.torch
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ts = [self._t(x) for x in (q, k, v, out, dout, lse, dq, dk, dv)]
        self._check(self.lib.fa_backward(None, self._params(causal),
                                         *[ctypes.byref(t) for t in ts]), "fa_backward")
        return dq, dk, dv


def load_flash(lib_path, via):
    """(kind, object): the package if it imports and works with torch, else ctypes."""
    if lib_path:
        os.environ["FLASHATTN_LIBRARY"] = lib_path
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        if via == "ctypes":
            raise ImportError("--via ctypes")
        import flashattn
        flashattn.flash_attn_func  # noqa: B018
        flashattn.library_path()  # loads libflashattn now: a missing library fails here
        return "package", flashattn
    except Exception as e:  # not built, not importable, or half-finished
        print(f"compare.py: `import flashattn` failed ({type(e).__name__}: {e}); "
              "using ctypes on libflashattn", file=sys.stderr)
    candidates = [lib_path, os.environ.get("FLASHATTN_LIBRARY"),
                  os.path.join(ROOT, "build", "libflashattn.so")]
    for p in candidates:
        if p and os.path.exists(p):
            return "ctypes", CtypesFlash(p)
    sys.exit("compare.py: libflashattn not found: run `make` first, or pass --lib PATH")


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def gflop(B, H, S, D, causal, bwd):
    return 4.0 * B * H * S * S * D * (0.5 if causal else 1.0) * (2.5 if bwd else 1.0) * 1e-9


def scaled_err(got, ref):
    """max |got - ref| / max(1, max |ref|), in fp32."""
    got, ref = got.float(), ref.float()
    if not bool(got.isfinite().all()):
        return float("inf")
    return float((got - ref).abs().max()) / max(1.0, float(ref.abs().max()))


def run_config(torch, kind, fa, cfg, args):
    B, H, S, D = args.batch, args.heads, cfg["S"], cfg["D"]
    causal, bwd = cfg["causal"], cfg["pass"] == "bwd"
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[cfg["dtype"]]
    g = torch.Generator().manual_seed(args.seed + S * 7 + D)
    # Same values for both: BSHD for flashattn, contiguous BHSD for torch.
    q, k, v = [(torch.rand((B, S, H, D), generator=g) * 2 - 1).to(dt) for _ in range(3)]
    dout = (torch.rand((B, S, H, D), generator=g) * 2 - 1).to(dt)
    qt, kt, vt, doutt = [x.transpose(1, 2).contiguous() for x in (q, k, v, dout)]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    if not bwd:
        if kind == "package":
            def f_call():
                return fa.flash_attn_func(q, k, v, causal=causal)
        else:
            def f_call():
                return fa.forward(q, k, v, causal)[0]

        def t_call():
            return sdpa(qt, kt, vt, is_causal=causal)

        with torch.no_grad():
            f_out = f_call()
            t_out = t_call()
            err = scaled_err(f_out, t_out.transpose(1, 2))
            if err > TOL[cfg["dtype"]]:
                return {"err": err, "status": "MISMATCH"}
            tf, nf, tt, nt = interleave(f_call, t_call, args)
    else:
        fq, fk, fv = [x.clone().requires_grad_(True) for x in (q, k, v)]
        tq, tk, tv = [x.clone().requires_grad_(True) for x in (qt, kt, vt)]
        t_o = sdpa(tq, tk, tv, is_causal=causal)

        def t_call():
            return torch.autograd.grad(t_o, (tq, tk, tv), doutt, retain_graph=True)

        if kind == "package":
            f_o = fa.flash_attn_func(fq, fk, fv, causal=causal)

            def f_call():
                return torch.autograd.grad(f_o, (fq, fk, fv), dout, retain_graph=True)
        else:
            with torch.no_grad():
                f_o, lse = fa.forward(q, k, v, causal)

            def f_call():
                return fa.backward(q, k, v, f_o, dout, lse, causal)

        fg = f_call()
        tg = t_call()
        err = max(scaled_err(a, b.transpose(1, 2)) for a, b in zip(fg, tg))
        if err > TOL[cfg["dtype"]]:
            return {"err": err, "status": "MISMATCH"}
        tf, nf, tt, nt = interleave(f_call, t_call, args)
    return {"err": err, "status": "ok", "flash_s": tf, "flash_runs": nf, "torch_s": tt,
            "torch_runs": nt}


# Idle seconds before each timed call: torch's OpenMP threads keep spinning for a while after
# a call, and ran into flashattn's next call on a 2-core machine (its 2048 x 128 bf16 backward
# took 246 ms right after torch's, 236 ms alone).
SETTLE_S = 0.1


def interleave(f_call, t_call, args):
    """Warm-up both, then alternate timed calls, each after SETTLE_S idle; medians. Long first
    calls are used alone."""
    firsts = []
    for fn in (f_call, t_call):
        t0 = time.perf_counter()
        fn()
        firsts.append(time.perf_counter() - t0)
    nf = 0 if firsts[0] > args.long_run else args.runs
    nt = 0 if firsts[1] > args.long_run else args.runs
    tf, tt = [], []
    for i in range(max(nf, nt)):
        if i < nf:
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            f_call()
            tf.append(time.perf_counter() - t0)
        if i < nt:
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            t_call()
            tt.append(time.perf_counter() - t0)
    return (statistics.median(tf) if tf else firsts[0], max(nf, 1),
            statistics.median(tt) if tt else firsts[1], max(nt, 1))


def parse_list(s, conv=int):
    return [conv(x) for x in s.split(",") if x]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install-torch", action="store_true",
                    help="create .venv-bench and pip-install torch and numpy there first")
    ap.add_argument("--torch-index-url", default=None,
                    help="pip index for --install-torch (default: PyPI)")
    ap.add_argument("--quick", action="store_true",
                    help="seqlens 512,1024,2048, dims 64,128, fp32 and bf16, non-causal, "
                         "forward, 3 runs (other options still apply)")
    ap.add_argument("--seqlens", default=None, help="default 512,1024,2048,4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--causal", default=None, help="0 and/or 1 (default 0,1)")
    ap.add_argument("--pass", dest="passes", default=None, help="fwd and/or bwd (default both)")
    ap.add_argument("--runs", type=int, default=None, help="timed runs, median (default 5)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both (default: the CPUs this process may use)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--long-run", type=float, default=10.0,
                    help="a first run over this many seconds is the only one timed (default 10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lib", default=None, help="path of libflashattn.so to use")
    ap.add_argument("--via", choices=("auto", "ctypes"), default="auto",
                    help="auto: the flashattn package if it imports, else ctypes; ctypes: always "
                         "call libflashattn directly")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)

    if args.install_torch:
        install_torch(args.torch_index_url)
        reexec_in_venv(argv)
    if not have_torch():
        if not in_bench_venv() and os.path.exists(VENV_PY):
            reexec_in_venv(argv)
        sys.exit("compare.py: PyTorch is not installed for " + sys.executable + ".\n"
                 "Run `python3 bench/compare.py --install-torch ...` to install it into "
                 ".venv-bench\n(pip install torch from PyPI: ~0.5 GB wheel plus several GB of "
                 "CUDA runtime packages it depends on).")

    seqlens = parse_list(args.seqlens) if args.seqlens else (
        [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192, 16384])
    causals = parse_list(args.causal) if args.causal else ([0] if args.quick else [0, 1])
    passes = parse_list(args.passes, str) if args.passes else (
        ["fwd"] if args.quick else ["fwd", "bwd"])
    runs = args.runs or (3 if args.quick else 5)
    args.runs = runs
    dtypes = []
    for d in parse_list(args.dtypes, str):
        d = {"f32": "fp32", "fp32": "fp32", "float32": "fp32", "bf16": "bf16",
             "bfloat16": "bf16"}.get(d)
        if d is None:
            sys.exit("compare.py: --dtypes takes f32 and/or bf16")
        dtypes.append(d)
    dims = parse_list(args.dims)
    for p in passes:
        if p not in ("fwd", "bwd"):
            sys.exit("compare.py: --pass takes fwd and/or bwd")

    threads = args.threads or len(os.sched_getaffinity(0))
    os.environ["FA_NUM_THREADS"] = str(threads)  # before the library makes its default context
    import torch
    torch.set_num_threads(threads)
    kind, fa = load_flash(args.lib, args.via)
    if kind == "package":
        build = fa.build_info()
        where = f"the flashattn package ({os.path.dirname(fa.__file__)}), " \
                f"library {fa.library_path()}"
    else:
        build = fa.build_info()
        where = f"ctypes on {fa.path}"

    print("bench/compare.py: flashattn vs torch.nn.functional.scaled_dot_product_attention (CPU)")
    print(f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S UTC}")
    print(f"command:   python3 bench/compare.py {' '.join(argv)}")
    print(f"machine:   {cpu_model()}, {os.cpu_count()} CPUs; {platform.platform()}")
    print(f"flashattn: {build}")
    print(f"           via {where}")
    print(f"torch:     {torch.__version__}, {torch.get_num_threads()} threads "
          f"(python {platform.python_version()})")
    print(f"threads:   {threads} for both (FA_NUM_THREADS, torch.set_num_threads)")
    print(f"shape:     B={args.batch} H={args.heads}, Sq = Sk; flashattn BSHD, torch BHSD, "
          f"both contiguous; default scale")
    print(f"time:      median of {runs} runs after a checking warm-up run (outputs agree: "
          f"max|diff|/max(1,max|torch|) <= {TOL['fp32']:g} fp32, {TOL['bf16']:g} bf16);")
    print(f"           a first run over {args.long_run:g} s is the only one; backward = "
          "autograd.grad of a kept graph;")
    print(f"           the two alternate, each timed call after {SETTLE_S:g} s idle (torch's "
          "OpenMP threads spin for a while after its calls)")
    print("ratio:     flashattn time / torch time: below 1 = flashattn faster\n")
    print("pass dtype   D causal     S |  flash ms  GFLOP/s |  torch ms  GFLOP/s | "
          "flash/torch    err")
    sys.stdout.flush()

    rows, failures = [], 0
    n = len(passes) * len(dtypes) * len(dims) * len(causals) * len(seqlens)
    i = 0
    for p in passes:
        for dt in dtypes:
            for D in dims:
                for c in causals:
                    for S in seqlens:
                        i += 1
                        cfg = {"pass": p, "dtype": dt, "D": D, "causal": bool(c), "S": S}
                        gf = gflop(args.batch, args.heads, S, D, c, p == "bwd")
                        print(f"[{i}/{n}] {p} {dt} D={D} {'causal' if c else 'non-causal'} "
                              f"S={S} ({gf:.1f} GFLOP)", file=sys.stderr, flush=True)
                        try:
                            r = run_config(torch, kind, fa, cfg, args)
                        except Exception as e:  # one failed row must not lose the others
                            r = {"status": "ERROR", "message": f"{type(e).__name__}: {e}"}
                        r.update(cfg)
                        r["gflop"] = gf
                        rows.append(r)
                        head = f"{p:<4} {dt:<5} {D:3d} {'yes' if c else 'no':<6} {S:5d} | "
                        if r["status"] == "ok":
                            print(head + f"{r['flash_s'] * 1e3:9.2f} {gf / r['flash_s']:8.1f} | "
                                  f"{r['torch_s'] * 1e3:9.2f} {gf / r['torch_s']:8.1f} | "
                                  f"{r['flash_s'] / r['torch_s']:10.2f}x {r['err']:8.1e}")
                        else:
                            failures += 1
                            print(head + f"{r['status']}: "
                                  + r.get("message", f"error {r.get('err', 0):.3g}"))
                        sys.stdout.flush()
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        ratios = [r["flash_s"] / r["torch_s"] for r in ok]
        geo = 1.0
        for x in ratios:
            geo *= x
        geo **= 1.0 / len(ratios)
        print(f"\nflash/torch time over {len(ok)} rows: geometric mean {geo:.2f}x, "
              f"min {min(ratios):.2f}x, max {max(ratios):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "bench/compare.py", "argv": argv, "build": build,
                       "torch": torch.__version__, "threads": threads, "via": where,
                       "rows": rows}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
