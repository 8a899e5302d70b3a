"""Scalar arguments: every public function checks the type and range of each scalar against the C
field it ends in, so nothing is silently truncated or rounded away (window_size=(2**40, 0) ran
as (0, 0), max_seqlen=2**64 + 5 as 5, softmax_scale=1e-300 as the default scale, (1.5, 2) as
(1, 2)). Errors name the argument and the allowed range; nothing is written. Also: a malformed
FA_NUM_THREADS / FA_SPIN_US is a ValueError naming the variable (it was a MemoryError), and an
FA_CPU_ISA the library ignores is reported once on stderr and in build_info()."""

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import randn

import flashattn
from flashattn import (
    FlashAttnTypeError,
    FlashAttnValueError,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from flashattn.flash_attn_interface import (
    _flash_attn_backward,
    _flash_attn_forward,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
)

B, S, H, D = 2, 5, 2, 8


def _inputs(rng):
    q = randn(rng, (B, S, H, D), np.float32)
    k = randn(rng, (B, S, H, D), np.float32)
    v = randn(rng, (B, S, H, D), np.float32)
    return q, k, v


def _varlen(x):
    return np.ascontiguousarray(x.reshape(B * S, *x.shape[2:]))


CU = np.array([0, 2, B * S], np.int32)


def _calls(rng):
    """name → f(**scalars) for each public function on small valid inputs."""
    q, k, v = _inputs(rng)
    qv, kv_, vv = _varlen(q), _varlen(k), _varlen(v)
    return {
        "flash_attn_func": lambda **a: flash_attn_func(q, k, v, **a),
        "flash_attn_qkvpacked_func":
            lambda **a: flash_attn_qkvpacked_func(np.stack([q, k, v], axis=2), **a),
        "flash_attn_kvpacked_func":
            lambda **a: flash_attn_kvpacked_func(q, np.stack([k, v], axis=2), **a),
        "flash_attn_varlen_func":
            lambda **a: flash_attn_varlen_func(qv, kv_, vv, CU, CU, a.pop("max_seqlen_q", 8),
                                               a.pop("max_seqlen_k", 8), **a),
        "flash_attn_varlen_qkvpacked_func":
            lambda **a: flash_attn_varlen_qkvpacked_func(
                np.stack([qv, kv_, vv], axis=1), CU, a.pop("max_seqlen_q", 8), **a),
        "flash_attn_varlen_kvpacked_func":
            lambda **a: flash_attn_varlen_kvpacked_func(
                qv, np.stack([kv_, vv], axis=1), CU, CU, a.pop("max_seqlen_q", 8),
                a.pop("max_seqlen_k", 8), **a),
    }


PUBLIC = list(_calls(np.random.default_rng(0)))

# (scalars, exception, message) shared by the six functions above
BAD = [
    (dict(window_size=(2 ** 40, 0)), ValueError,
     r"FA_ERR_VALUE: window_size\[0\] is 1099511627776; expected an integer in "
     r"\[-2147483648, 2147483647\] \(negative: unbounded\)"),
    (dict(window_size=(0, 2 ** 31)), ValueError, r"window_size\[1\] is 2147483648"),
    (dict(window_size=(-(2 ** 31) - 1, 0)), ValueError, r"window_size\[0\] is -2147483649"),
    (dict(window_size=(1.5, 2)), TypeError, r"window_size\[0\]: expected an integer; got float"),
    (dict(window_size=(1, 2.0)), TypeError, r"window_size\[1\]: expected an integer; got float"),
    (dict(window_size=(True, 2)), TypeError, r"window_size\[0\]: expected an integer; got bool"),
    (dict(window_size=(3,)), TypeError, r"window_size: expected a pair \(left, right\)"),
    (dict(window_size=4), TypeError, r"window_size: expected a pair"),
    (dict(window_size="ab"), TypeError, r"window_size: expected a pair"),
    (dict(softmax_scale=1e-300), ValueError,
     r"softmax_scale is 1e-300, which is 0 in fp32 .*magnitude in \[1.4e-45, 3.4e38\]"),
    (dict(softmax_scale=-1e-300), ValueError, r"softmax_scale is -1e-300, which is 0 in fp32"),
    (dict(softmax_scale=1e39), ValueError, r"softmax_scale is 1e\+39, which is infinite in fp32"),
    (dict(softmax_scale=float("inf")), ValueError, r"softmax_scale is inf; expected a finite"),
    (dict(softmax_scale=float("nan")), ValueError, r"softmax_scale is nan; expected a finite"),
    (dict(softmax_scale="0.5"), TypeError, r"softmax_scale: expected a real number; got str"),
    (dict(softmax_scale=True), TypeError, r"softmax_scale: expected a real number; got bool"),
    (dict(softcap=1e-300), ValueError, r"softcap is 1e-300, which is 0 in fp32"),
    (dict(softcap=1e39), ValueError, r"softcap is 1e\+39, which is infinite in fp32"),
    (dict(softcap=float("nan")), ValueError, r"softcap is nan; expected a finite number"),
    (dict(softcap=float("inf")), ValueError, r"softcap is inf; expected a finite number"),
    (dict(softcap=[1.0]), TypeError, r"softcap: expected a real number; got list"),
    (dict(dropout_p=1.0), ValueError, r"dropout_p is 1.0; expected a probability in \[0, 1\)"),
    (dict(dropout_p=1 - 1e-9), ValueError, r"dropout_p is 0.999999999; .*below 1 in fp32"),
    (dict(dropout_p=-0.1), ValueError, r"dropout_p is -0.1"),
    (dict(dropout_p=float("nan")), ValueError, r"dropout_p is nan"),
    (dict(dropout_p="0.1"), TypeError, r"dropout_p: expected a real number; got str"),
    (dict(causal="yes"), TypeError, r"causal: expected a bool; got str 'yes'"),
    (dict(causal=2), TypeError, r"causal: expected a bool; got int 2"),
    (dict(causal=None), TypeError, r"causal: expected a bool; got NoneType"),
    (dict(deterministic="no"), TypeError, r"deterministic: expected a bool"),
    (dict(return_attn_probs=[]), TypeError, r"return_attn_probs: expected a bool"),
]


@pytest.mark.parametrize("fn", PUBLIC)
@pytest.mark.parametrize("args,exc,match", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_scalar_is_refused(rng, fn, args, exc, match):
    with pytest.raises(exc, match=match) as e:
        _calls(rng)[fn](**args)
    cls = FlashAttnValueError if exc is ValueError else FlashAttnTypeError
    assert isinstance(e.value, cls)
    if exc is ValueError:
        assert e.value.status_name == "FA_ERR_VALUE"


VARLEN = [f for f in PUBLIC if "varlen" in f]


SEQLEN_ARGS = [(f, n) for f in VARLEN for n in ("max_seqlen_q", "max_seqlen_k")
               if not (f == "flash_attn_varlen_qkvpacked_func" and n == "max_seqlen_k")]


@pytest.mark.parametrize("fn,name", SEQLEN_ARGS)
def test_max_seqlen_is_an_int64(rng, fn, name):
    shown = "max_seqlen" if fn == "flash_attn_varlen_qkvpacked_func" else name
    calls = _calls(rng)
    with pytest.raises(ValueError, match=rf"{shown} is 18446744073709551621; expected an "
                                         rf"integer in \[0, 9223372036854775807\]"):
        calls[fn](**{name: 2 ** 64 + 5})  # ran as 5
    with pytest.raises(ValueError, match=rf"{shown} is 9223372036854775808"):
        calls[fn](**{name: 2 ** 63})
    with pytest.raises(ValueError, match=rf"{shown} is -1"):
        calls[fn](**{name: -1})
    with pytest.raises(TypeError, match=rf"{shown}: expected an integer; got float"):
        calls[fn](**{name: 8.0})
    with pytest.raises(TypeError, match=rf"{shown}: expected an integer; got bool"):
        calls[fn](**{name: True})
    want = calls[fn]()
    assert np.array_equal(calls[fn](**{name: np.int32(8)}), want)  # NumPy integers are integers
    assert np.array_equal(calls[fn](**{name: 2 ** 62}), want)  # a bound, however large


@pytest.mark.parametrize("fn", PUBLIC)
def test_good_scalars_of_any_integer_or_real_type(rng, fn):
    calls = _calls(rng)
    f = calls[fn]
    base = f(window_size=(3, 1), softmax_scale=0.25, softcap=2.0, causal=False)
    assert np.array_equal(f(window_size=(np.int64(3), np.int32(1)), softmax_scale=np.float32(0.25),
                            softcap=np.float64(2.0), causal=np.bool_(False)), base)
    assert np.array_equal(f(window_size=[3, 1], softmax_scale=0.25, softcap=2, causal=0), base)
    # any negative side is unbounded (flash-attn), down to the int32 minimum
    unbounded = f()
    assert np.array_equal(f(window_size=(-5, -(2 ** 31))), unbounded)
    assert np.array_equal(f(softcap=-3.0), f(softcap=0.0))  # softcap <= 0: off
    # the largest and smallest magnitudes fp32 holds are accepted
    assert np.isfinite(f(softmax_scale=1e-44)).all()
    assert np.isfinite(f(window_size=(2 ** 31 - 1, 2 ** 31 - 1))).all()


def test_kvcache_scalars(rng):
    q = randn(rng, (2, 1, 2, 8), np.float32)
    kc = randn(rng, (2, 10, 2, 8), np.float32)
    vc = randn(rng, (2, 10, 2, 8), np.float32)
    kn = randn(rng, (2, 1, 2, 8), np.float32)
    cos = np.ones((11, 2), np.float32)
    sin = np.zeros((11, 2), np.float32)
    seqlens = np.array([3, 4], np.int32)
    k0, v0 = kc.copy(), vc.copy()
    bad = [
        (dict(window_size=(2 ** 40, 0)), ValueError, r"window_size\[0\] is 1099511627776"),
        (dict(window_size=(1.5, 2)), TypeError, r"window_size\[0\]: expected an integer"),
        (dict(softmax_scale=1e-300), ValueError, r"softmax_scale is 1e-300, which is 0 in fp32"),
        (dict(softcap=1e39), ValueError, r"softcap is 1e\+39, which is infinite in fp32"),
        (dict(causal="no"), TypeError, r"causal: expected a bool"),
        (dict(num_splits=2 ** 40), ValueError,
         r"num_splits is 1099511627776; expected an integer in \[-2147483648, 2147483647\]"),
        (dict(num_splits=1.5), TypeError, r"num_splits: expected an integer; got float"),
        (dict(rotary_interleaved="no", rotary_cos=cos, rotary_sin=sin), TypeError,
         r"rotary_interleaved: expected a bool"),
        (dict(return_softmax_lse="x"), TypeError, r"return_softmax_lse: expected a bool"),
    ]
    for args, exc, match in bad:
        with pytest.raises(exc, match=match):
            flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens, **args)
    with pytest.raises(ValueError, match=r"cache_seqlens is 9223372036854775808; expected an "
                                         r"integer in \[0, 9223372036854775807\]"):
        flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=2 ** 63)
    assert np.array_equal(kc, k0) and np.array_equal(vc, v0)  # nothing written
    out = flash_attn_with_kvcache(q, kc.copy(), vc.copy(), cache_seqlens=seqlens,
                                  window_size=(np.int64(2), -7), num_splits=np.int32(0))
    want = flash_attn_with_kvcache(q, kc.copy(), vc.copy(), cache_seqlens=seqlens,
                                   window_size=(2, -1))
    assert np.array_equal(out, want)


def test_private_wrappers_check_their_scalars(rng):
    q, k, v = _inputs(rng)
    args = [q, k, v, 0.0, None, False, 2 ** 40, 0, 0.0, None, False]
    with pytest.raises(ValueError, match=r"window_size_left is 1099511627776; expected an "
                                         r"integer in \[-2147483648, 2147483647\]"):
        _flash_attn_forward(*args)
    args[6], args[7] = -1, 1.5
    with pytest.raises(TypeError, match=r"window_size_right: expected an integer; got float"):
        _flash_attn_forward(*args)
    out, lse, _, rng_state = _flash_attn_forward(q, k, v, 0.0, None, False, -1, -1, 0.0, None,
                                                 False)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    with pytest.raises(ValueError, match=r"softmax_scale is 1e-300, which is 0 in fp32"):
        _flash_attn_backward(q, q, k, v, out, lse, dq, dk, dv, 0.0, 1e-300, False, -1, -1, 0.0,
                             None, False)
    with pytest.raises(TypeError, match=r"deterministic: expected a bool"):
        _flash_attn_backward(q, q, k, v, out, lse, dq, dk, dv, 0.0, None, False, -1, -1, 0.0,
                             None, "x")
    qv, kv_, vv = _varlen(q), _varlen(k), _varlen(v)
    with pytest.raises(ValueError, match=r"max_seqlen_k is 18446744073709551621"):
        _flash_attn_varlen_forward(qv, kv_, vv, CU, CU, 8, 2 ** 64 + 5, 0.0, None, False)
    o, l, _, _ = _flash_attn_varlen_forward(qv, kv_, vv, CU, CU, 8, 8, 0.0, None, False)
    with pytest.raises(ValueError, match=r"max_seqlen_q is 18446744073709551621"):
        _flash_attn_varlen_backward(qv, qv, kv_, vv, o, l, None, None, None, CU, CU, 2 ** 64 + 5,
                                    8, 0.0, None, False, -1, -1, 0.0, None, False)


def test_checked_before_either_path():
    """The public functions check their scalars before they look at the arrays, so the torch
    path refuses the same values with the same messages (here without torch: q is no array)."""
    with pytest.raises(ValueError, match=r"window_size\[0\] is 1099511627776"):
        flash_attn_func(object(), None, None, window_size=(2 ** 40, 0))
    with pytest.raises(ValueError, match=r"max_seqlen_q is 18446744073709551621"):
        flash_attn_varlen_func(object(), None, None, None, None, 2 ** 64 + 5, 1)
    with pytest.raises(ValueError, match=r"softmax_scale is 1e-300"):
        flash_attn_qkvpacked_func(object(), softmax_scale=1e-300)


def test_torch_path_refuses_the_same_values(rng):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in _inputs(rng))
    with pytest.raises(ValueError, match=r"window_size\[0\] is 1099511627776"):
        flash_attn_func(q, k, v, window_size=(2 ** 40, 0))
    with pytest.raises(TypeError, match=r"window_size\[0\]: expected an integer; got float"):
        flash_attn_func(q, k, v, window_size=(1.5, 2))
    with pytest.raises(ValueError, match=r"softmax_scale is 1e-300, which is 0 in fp32"):
        flash_attn_func(q, k, v, softmax_scale=1e-300)
    qv = q.detach().reshape(B * S, H, D)
    cu = torch.from_numpy(CU)
    with pytest.raises(ValueError, match=r"max_seqlen_q is 18446744073709551621"):
        flash_attn_varlen_func(qv, qv, qv, cu, cu, 2 ** 64 + 5, 8)
    kc = torch.zeros((2, 10, 2, 8))
    with pytest.raises(ValueError, match=r"num_splits is 1099511627776"):
        flash_attn_with_kvcache(q.detach()[:, :1], kc, kc, cache_seqlens=3, num_splits=2 ** 40)
    with pytest.raises(ValueError, match=r"window_size\[1\] is 2147483648"):
        flash_attn_with_kvcache(q.detach()[:, :1], kc, kc, cache_seqlens=3,
                                window_size=(0, 2 ** 31))
    from flashattn import _torch_api

    with pytest.raises(ValueError, match=r"window_size_left is 1099511627776"):
        _torch_api.flash_attn_forward_op(q.detach(), k.detach(), v.detach(), 0.0, None, False,
                                         2 ** 40, 0, 0.0, None, False)


# ------------------------------------------------------------------------------------------------
# Environment variables
# ------------------------------------------------------------------------------------------------

def _run_python(code, **env):
    full = dict(os.environ, **env)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))
    full["PYTHONPATH"] = pkg + os.pathsep + full.get("PYTHONPATH", "")
    if not os.environ.get("FLASHATTN_LIBRARY"):
        full["FLASHATTN_LIBRARY"] = flashattn.library_path()
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=120)


_CALL = ("import numpy as np, flashattn\n"
         "x = np.ones((1, 2, 1, 4), np.float32)\n"
         "try:\n"
         "    flashattn.flash_attn_func(x, x, x)\n"
         "except Exception as e:\n"
         "    print(isinstance(e, ValueError), isinstance(e, MemoryError), e.status_name)\n"
         "    print(e)\n")


@pytest.mark.parametrize("var,value", [("FA_NUM_THREADS", "abc"), ("FA_NUM_THREADS", "0"),
                                       ("FA_SPIN_US", "-5"), ("FA_SPIN_US", "1e3")])
def test_malformed_thread_variables_are_value_errors(var, value):
    r = _run_python(_CALL, **{var: value})
    assert r.returncode == 0, r.stderr
    first, message = r.stdout.splitlines()[:2]
    assert first == "True False FA_ERR_VALUE", r.stdout  # a ValueError, not a MemoryError
    assert f'{var} is "{value}"' in message, message
    assert message.startswith("fa_forward: FA_ERR_VALUE: default context: "), message


def test_unknown_cpu_isa_is_reported_once():
    code = ("import numpy as np, flashattn\n"
            "x = np.ones((1, 2, 1, 4), np.float32)\n"
            "for _ in range(3):\n"
            "    flashattn.flash_attn_func(x, x, x)\n"
            "print(flashattn.build_info())\n")
    r = _run_python(code, FA_CPU_ISA="avx9000")
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "FA_CPU_ISA" in ln]
    assert len(warnings) == 1, r.stderr
    assert "FA_CPU_ISA=avx9000 ignored: not a kernel set; valid: ref" in warnings[0]
    assert "(FA_CPU_ISA=avx9000 ignored: not a kernel set; valid: ref" in r.stdout
    r = _run_python(code, FA_CPU_ISA="ref")
    assert r.returncode == 0 and "FA_CPU_ISA" not in r.stderr, r.stderr
    assert "in use: ref (forced by FA_CPU_ISA)" in r.stdout


def test_fp32_limits_are_fp32_rounding():
    """The limits _args checks against are where fp32 rounding makes a scale 0 or inf and a
    probability 1, value for value (NumPy's float32 conversion rounds as the C cast does)."""
    from flashattn import _args

    for x in (_args.F32_ZERO, _args.F32_INF, 1e-300, 1e-44, 3.4e38, 3.5e38):
        for y in (x, np.nextafter(x, 0.0), np.nextafter(x, np.inf)):
            for s in (y, -y):
                with np.errstate(over="ignore"):
                    fits = np.float32(s) != 0 and np.isfinite(np.float32(s))
                try:
                    _args.softmax_scale(float(s))
                    _args.softcap(float(s)) if s > 0 else None
                    accepted = True
                except FlashAttnValueError:
                    accepted = False
                assert accepted == fits, s
    for y in (_args.P_MAX, np.nextafter(_args.P_MAX, 0.0), np.nextafter(_args.P_MAX, 1.0)):
        try:
            _args.dropout_p(float(y))
            accepted = True
        except FlashAttnValueError:
            accepted = False
        assert accepted == (np.float32(y) < 1.0), y
