"""`python -m flashattn`: does it really work here? Small attention problems through the Python
API against the fp64 NumPy reference, forward and backward, for each dtype (and through PyTorch
autograd when torch is installed), with a one-line verdict each. Exit status 0 = all passed.

    python -m flashattn            # the check
    python -m flashattn --info     # where the library is and how it was built
"""

import sys
import time

import numpy as np

from . import __version__, _core, _lib
from .flash_attn_interface import _flash_attn_backward, _flash_attn_forward
from .reference import attention_ref

# Error bound relative to max |reference|, per dtype: fp32 accumulation everywhere, so the
# error is the inputs'/outputs' rounding.
_TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}

_CASES = [
    # name, B, Sq, Sk, H, Hk, D, kwargs
    ("plain", 2, 37, 41, 4, 4, 64, {}),
    ("causal gqa", 1, 50, 64, 8, 2, 32, {"causal": True}),
    ("window alibi softcap", 2, 33, 33, 2, 1, 80,
     {"window_size": (8, 3), "alibi_slopes": np.array([0.5, 0.25], np.float32),
      "softcap": 5.0}),
    ("dropout", 1, 24, 40, 2, 2, 16, {"dropout_p": 0.2}),
]


def _dtypes():
    out = [np.dtype(np.float32), np.dtype(np.float16)]
    if _core._NP_BF16 is not None:
        out.append(_core._NP_BF16)
    return out


def _err(a, ref):
    a = np.asarray(a, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    return float(np.max(np.abs(a - ref))) / scale if ref.size else 0.0


def _check_numpy(dtype, case, rng):
    name, B, Sq, Sk, H, Hk, D, kw = case
    q = rng.standard_normal((B, Sq, H, D)).astype(dtype)
    k = rng.standard_normal((B, Sk, Hk, D)).astype(dtype)
    v = rng.standard_normal((B, Sk, Hk, D)).astype(dtype)
    dout = rng.standard_normal((B, Sq, H, D)).astype(dtype)
    p = kw.get("dropout_p", 0.0)
    ws = kw.get("window_size", (-1, -1))
    out, lse, _, rng_state = _flash_attn_forward(
        q, k, v, p, None, kw.get("causal", False), ws[0], ws[1], kw.get("softcap", 0.0),
        kw.get("alibi_slopes"), False)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, p, None, kw.get("causal", False),
                         ws[0], ws[1], kw.get("softcap", 0.0), kw.get("alibi_slopes"), False,
                         rng_state)
    keep = None
    if p > 0:
        keep = _core.dropout_mask_for(_core.NumpyBackend, (B, H, Sq, Sk), p, rng_state) != 0
    ref = attention_ref(q, k, v, causal=kw.get("causal", False), window_size=ws,
                        softcap=kw.get("softcap", 0.0), alibi_slopes=kw.get("alibi_slopes"),
                        dropout_p=p, dropout_keep=keep, dout=dout)
    fin = np.isfinite(ref[1])
    errs = {"out": _err(out, ref[0]), "lse": _err(np.where(fin, lse, 0), np.where(fin, ref[1], 0)),
            "dq": _err(dq, ref[3][0]), "dk": _err(dk, ref[3][1]), "dv": _err(dv, ref[3][2])}
    if not np.array_equal(np.isfinite(lse), fin):
        errs["lse"] = float("inf")
    return errs


def _check_kvcache(dtype, rng):
    """One decode step with append, rotary and a paged cache of page size 3."""
    from . import flash_attn_with_kvcache
    from .reference import kvcache_ref

    B, H, Hk, D, page, pages = 2, 4, 2, 32, 3, 12
    q = rng.standard_normal((B, 1, H, D)).astype(dtype)
    kc = rng.standard_normal((pages, page, Hk, D)).astype(dtype)
    vc = rng.standard_normal((pages, page, Hk, D)).astype(dtype)
    kn = rng.standard_normal((B, 1, Hk, D)).astype(dtype)
    vn = rng.standard_normal((B, 1, Hk, D)).astype(dtype)
    table = rng.permutation(pages).reshape(B, pages // B).astype(np.int32)
    lens = np.array([7, 13], np.int32)
    ang = rng.uniform(0, 6.28, (pages // B * page, 8))
    cos, sin = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens, block_table=table, causal=True)
    ref = kvcache_ref(q, kc, vc, kn, vn, **kw)
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, **kw)
    return {"out": _err(out, ref[0]), "k_cache": _err(kc, ref[2])}


def _check_torch(rng):
    import torch

    from . import flash_attn_func

    q, k, v = (torch.tensor(rng.standard_normal((2, 19, 4, 32)), dtype=torch.float32,
                            requires_grad=True) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    dout = torch.tensor(rng.standard_normal(out.shape), dtype=torch.float32)
    out.backward(dout)
    ref = attention_ref(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), causal=True,
                        dout=dout.numpy())
    return {"out": _err(out.detach().numpy(), ref[0]), "dq": _err(q.grad.numpy(), ref[3][0]),
            "dk": _err(k.grad.numpy(), ref[3][1]), "dv": _err(v.grad.numpy(), ref[3][2])}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        path = _lib.library_path()
    except ImportError as e:
        print(f"✗ flashattn {__version__}: {e}")
        return 1
    print(f"flashattn {__version__} (Python {sys.version.split()[0]}, NumPy {np.__version__})")
    print(f"  library: {path}")
    print(f"  build:   {_lib.build_info()}")
    if "--info" in argv:
        return 0
    rng = np.random.default_rng(0)
    np.random.seed(0)
    failed = 0
    for dtype in _dtypes():
        tol = _TOL[dtype.name]
        for case in _CASES:
            t0 = time.perf_counter()
            errs = _check_numpy(dtype, case, rng)
            worst = max(errs, key=errs.get)
            ok = all(e <= tol for e in errs.values())
            failed += not ok
            print(f"  {'✓' if ok else '✗'} numpy {dtype.name:8s} {case[0]:22s} "
                  f"forward+backward  max rel err {errs[worst]:.1e} ({worst}; bound {tol:.0e})"
                  f"  {1e3 * (time.perf_counter() - t0):.0f} ms")
        t0 = time.perf_counter()
        errs = _check_kvcache(dtype, rng)
        worst = max(errs, key=errs.get)
        ok = all(e <= 2 * tol for e in errs.values())
        failed += not ok
        print(f"  {'✓' if ok else '✗'} numpy {dtype.name:8s} {'kvcache paged rotary':22s} "
              f"decode step        max rel err {errs[worst]:.1e} ({worst}; bound {2 * tol:.0e})"
              f"  {1e3 * (time.perf_counter() - t0):.0f} ms")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("  - torch not installed: PyTorch autograd not checked")
    else:
        errs = _check_torch(rng)
        worst = max(errs, key=errs.get)
        ok = all(e <= _TOL["float32"] for e in errs.values())
        failed += not ok
        print(f"  {'✓' if ok else '✗'} torch {torch.__version__} float32 autograd causal "
              f"max rel err {errs[worst]:.1e} ({worst})")
    print(("✓ flashattn works: every check matches the fp64 reference" if not failed else
           f"✗ flashattn: {failed} check(s) failed"))
    print("  hint: Hugging Face transformers on flashattn: flashattn.integrations.transformers"
          ".enable(), then attn_implementation=\"flash_attention_2\" (docs/transformers.md)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
