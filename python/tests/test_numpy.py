"""The NumPy path against the fp64 reference: every feature, forward (out, lse, S_dmask) and
backward (dq, dk, dv through flash-attn's private _flash_attn_backward), every dtype, strided
views, packed and varlen variants."""

import numpy as np
import pytest
from helpers import BF16, DTYPES, assert_close, assert_lse, dtype_ids, randn, seeded

from flashattn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashattn import _core
from flashattn.flash_attn_interface import (
    _flash_attn_backward,
    _flash_attn_forward,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
)
from flashattn.reference import attention_ref, attention_varlen_ref

# (name, B, Sq, Sk, H, Hk, D, kwargs for flash_attn_func)
FEATURES = [
    ("plain", 2, 33, 47, 3, 3, 64, {}),
    ("sq>sk", 1, 40, 17, 2, 2, 32, {}),
    ("causal", 2, 45, 45, 2, 2, 32, {"causal": True}),
    ("causal sq<sk", 1, 13, 50, 4, 4, 16, {"causal": True}),
    ("causal sq>sk (masked rows)", 1, 30, 12, 2, 1, 24, {"causal": True}),
    ("gqa", 2, 20, 31, 8, 2, 40, {}),
    ("mqa causal", 1, 25, 25, 4, 1, 8, {"causal": True}),
    ("window", 1, 40, 40, 2, 2, 32, {"window_size": (5, 2)}),
    ("window left only", 1, 40, 52, 2, 2, 32, {"window_size": (7, -1)}),
    ("causal + window", 2, 37, 37, 2, 2, 16, {"causal": True, "window_size": (4, 9)}),
    ("alibi (H)", 1, 30, 35, 4, 2, 32, {"alibi_slopes": "H"}),
    ("alibi (B, H) causal", 2, 30, 30, 2, 2, 32, {"alibi_slopes": "BH", "causal": True}),
    ("softcap", 2, 29, 31, 2, 2, 64, {"softcap": 3.0}),
    ("scale", 1, 21, 26, 2, 2, 48, {"softmax_scale": 0.37}),
    ("everything", 2, 41, 53, 6, 3, 80,
     {"causal": True, "window_size": (20, 5), "alibi_slopes": "BH", "softcap": 6.0}),
    ("head dim 1", 1, 9, 11, 2, 2, 1, {}),
    ("head dim 7", 1, 9, 11, 2, 2, 7, {"causal": True}),
    ("head dim 256", 1, 17, 19, 1, 1, 256, {}),
    ("sk = 0", 1, 5, 0, 2, 2, 16, {}),
    ("sq = 0", 1, 0, 5, 2, 2, 16, {}),
]


def _alibi(spec, rng, B, H):
    if spec == "H":
        return rng.uniform(0.05, 1.0, H).astype(np.float32)
    if spec == "BH":
        return rng.uniform(0.05, 1.0, (B, H)).astype(np.float32)
    return spec


def _inputs(rng, dtype, B, Sq, Sk, H, Hk, D):
    return (randn(rng, (B, Sq, H, D), dtype), randn(rng, (B, Sk, Hk, D), dtype),
            randn(rng, (B, Sk, Hk, D), dtype))


def _ref_kwargs(kw):
    return {k: v for k, v in kw.items() if k in ("softmax_scale", "causal", "window_size",
                                                  "softcap", "alibi_slopes")}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids(DTYPES))
@pytest.mark.parametrize("case", FEATURES, ids=[c[0] for c in FEATURES])
def test_forward(case, dtype, rng):
    name, B, Sq, Sk, H, Hk, D, kw = case
    kw = dict(kw)
    if "alibi_slopes" in kw:
        kw["alibi_slopes"] = _alibi(kw["alibi_slopes"], rng, B, H)
    q, k, v = _inputs(rng, dtype, B, Sq, Sk, H, Hk, D)
    out, lse, S = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert out.dtype == dtype and out.shape == (B, Sq, H, D) and out.flags.c_contiguous
    assert lse.dtype == np.float32 and lse.shape == (B, H, Sq)
    assert S.shape == (0,), "S_dmask is empty without dropout, as in flash-attn"
    ref_out, ref_lse, _ = attention_ref(q, k, v, **_ref_kwargs(kw))
    assert_close(out, ref_out, dtype, "out")
    assert_lse(lse, ref_lse)
    # Without return_attn_probs, just out.
    out2 = flash_attn_func(q, k, v, **kw)
    assert isinstance(out2, np.ndarray) and np.array_equal(out2, out)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids(DTYPES))
@pytest.mark.parametrize("case", FEATURES, ids=[c[0] for c in FEATURES])
def test_backward(case, dtype, rng):
    name, B, Sq, Sk, H, Hk, D, kw = case
    kw = dict(kw)
    if "alibi_slopes" in kw:
        kw["alibi_slopes"] = _alibi(kw["alibi_slopes"], rng, B, H)
    q, k, v = _inputs(rng, dtype, B, Sq, Sk, H, Hk, D)
    dout = randn(rng, q.shape, dtype)
    ws = kw.get("window_size", (-1, -1))
    args = (kw.get("softmax_scale"), kw.get("causal", False), ws[0], ws[1],
            kw.get("softcap", 0.0), kw.get("alibi_slopes"))
    out, lse, S, rng_state = _flash_attn_forward(q, k, v, 0.0, *args, False)
    dq, dk, dv = (np.full_like(x, np.nan) for x in (q, k, v))  # poisoned: every element written
    softmax_d = _flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, *args, False,
                                     rng_state)
    ref = attention_ref(q, k, v, dout=dout, **_ref_kwargs(kw))
    for got, want, nm in zip((dq, dk, dv), ref[3], ("dq", "dk", "dv")):
        assert_close(got, want, dtype, nm, factor=2.0)
    want_d = np.einsum("bqhd,bqhd->bhq", dout.astype(np.float64), out.astype(np.float64))
    assert softmax_d.shape == (B, H, Sq)
    assert np.allclose(softmax_d, want_d, rtol=1e-4, atol=1e-4)


def test_fully_masked_rows_are_zero_and_lse_minus_inf(rng):
    # causal with Sq > Sk: the first Sq - Sk rows see no key; a window can also miss every key.
    q, k, v = _inputs(rng, np.float32, 1, 6, 2, 2, 2, 8)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[0, :4] == 0) and np.all(lse[0, :, :4] == -np.inf)
    assert np.all(np.isfinite(lse[0, :, 4:]))
    dout = randn(rng, q.shape, np.float32)
    o, l, _, st = _flash_attn_forward(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _flash_attn_backward(dout, q, k, v, o, l, dq, dk, dv, 0.0, None, True, -1, -1, 0.0, None,
                         False, st)
    assert np.all(dq[0, :4] == 0) and np.isfinite(dq).all() and np.isfinite(dk).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids(DTYPES))
def test_dropout_forward_backward_and_s_dmask(dtype, rng):
    B, Sq, Sk, H, Hk, D, p = 2, 23, 37, 4, 2, 32, 0.3
    q, k, v = _inputs(rng, dtype, B, Sq, Sk, H, Hk, D)
    dout = randn(rng, q.shape, dtype)
    np.random.seed(seeded(7) % 2**32)
    out, lse, S, rng_state = _flash_attn_forward(q, k, v, p, None, True, -1, -1, 0.0, None, True)
    assert rng_state.dtype == np.int64 and rng_state.shape == (2,)
    keep = _core.dropout_mask_for(_core.NumpyBackend, (B, H, Sq, Sk), p, rng_state) != 0
    assert 0.6 < keep.mean() < 0.8, "keep rate should be about 1 - p"
    ref = attention_ref(q, k, v, causal=True, dropout_p=p, dropout_keep=keep, dout=dout)
    assert_close(out, ref[0], dtype, "out")
    assert_lse(lse, ref[1])  # lse ignores dropout
    # S_dmask: the probabilities, negative where dropped (flash-attn's encoding).
    assert S.shape == (B, H, Sq, Sk) and S.dtype == dtype
    Sf = S.astype(np.float64)
    visible = ref[2] > 0
    assert np.array_equal((Sf >= 0)[visible], keep[visible])
    assert_close(np.abs(Sf), ref[2], dtype, "|S_dmask|")
    # The backward regenerates the same mask from rng_state.
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, p, None, True, -1, -1, 0.0, None,
                         False, rng_state)
    for got, want, nm in zip((dq, dk, dv), ref[3], ("dq", "dk", "dv")):
        assert_close(got, want, dtype, nm, factor=2.0)
    # Same global seed, same mask; a new draw, a new mask.
    np.random.seed(seeded(7) % 2**32)
    out2 = flash_attn_func(q, k, v, dropout_p=p, causal=True)
    assert np.array_equal(out, out2)
    out3 = flash_attn_func(q, k, v, dropout_p=p, causal=True)
    assert not np.array_equal(out, out3)


def test_dropout_backward_needs_rng_state(rng):
    q, k, v = _inputs(rng, np.float32, 1, 4, 4, 1, 1, 8)
    out, lse, _, _ = _flash_attn_forward(q, k, v, 0.5, None, False, -1, -1, 0.0, None, False)
    with pytest.raises(ValueError, match="rng_state"):
        _flash_attn_backward(q, q, k, v, out, lse, None, None, None, 0.5, None, False, -1, -1,
                             0.0, None, False, None)


def test_strided_views_without_copies(rng):
    """BHSD buffers (PyTorch SDPA's layout) passed as BSHD views, every-other-head views and
    broadcast (zero-stride) dout all work and match the contiguous result."""
    B, S, H, D = 2, 19, 4, 16
    qb, kb, vb = (randn(rng, (B, H, S, D), np.float32) for _ in range(3))
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (qb, kb, vb))  # (B, S, H, D) views
    assert not q.flags.c_contiguous
    out = flash_attn_func(q, k, v, causal=True)
    ref = flash_attn_func(*(np.ascontiguousarray(x) for x in (q, k, v)), causal=True)
    assert np.array_equal(out, ref), "the result must not depend on the memory layout"
    # Every other head of a wider tensor.
    wide = randn(rng, (B, S, 2 * H, D), np.float32)
    out = flash_attn_func(wide[:, :, ::2], k, v)
    assert np.array_equal(out, flash_attn_func(np.ascontiguousarray(wide[:, :, ::2]), k, v))
    # Negative strides are copied first (the C API takes strides >= 0).
    out = flash_attn_func(q[:, ::-1], k, v)
    assert np.array_equal(out, flash_attn_func(np.ascontiguousarray(q[:, ::-1]), k, v))
    # A zero-stride dout (the gradient of a sum) is read in place.
    o, l, _, st = _flash_attn_forward(q, k, v, 0.0, None, False, -1, -1, 0.0, None, False)
    dout = np.broadcast_to(np.float32(1.0), q.shape)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _flash_attn_backward(dout, q, k, v, o, l, dq, dk, dv, 0.0, None, False, -1, -1, 0.0, None,
                         False, st)
    r = attention_ref(q, k, v, dout=np.ones(q.shape))
    assert_close(dv, r[3][2], np.float32, "dv")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids(DTYPES))
def test_packed(dtype, rng):
    B, S, H, D = 2, 21, 4, 32
    qkv = randn(rng, (B, S, 3, H, D), dtype)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    ref = attention_ref(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert_close(out, ref[0], dtype, "qkvpacked out")
    q = randn(rng, (B, 9, H, D), dtype)
    kv = randn(rng, (B, S, 2, 2, D), dtype)  # GQA: 2 KV heads
    out, lse, S_ = flash_attn_kvpacked_func(q, kv, window_size=(3, 3), return_attn_probs=True)
    ref = attention_ref(q, kv[:, :, 0], kv[:, :, 1], window_size=(3, 3))
    assert_close(out, ref[0], dtype, "kvpacked out")
    assert_lse(lse, ref[1])


def _varlen_inputs(rng, dtype, lens_q, lens_k, H, Hk, D, pad=0):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = randn(rng, (cu_q[-1] + pad, H, D), dtype)
    k = randn(rng, (cu_k[-1] + pad, Hk, D), dtype)
    v = randn(rng, (cu_k[-1] + pad, Hk, D), dtype)
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


VARLEN = [
    ("plain", [5, 17, 1, 9], [7, 3, 12, 9], {}),
    ("causal", [5, 17, 1, 9], [7, 30, 12, 9], {"causal": True}),
    ("window alibi softcap", [11, 4, 20], [11, 9, 25],
     {"window_size": (3, 1), "alibi_slopes": "BH", "softcap": 2.5}),
    ("empty sequences", [0, 6, 0], [3, 0, 4], {"causal": True}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids(DTYPES))
@pytest.mark.parametrize("case", VARLEN, ids=[c[0] for c in VARLEN])
def test_varlen_forward_backward(case, dtype, rng):
    name, lq, lk, kw = case
    kw = dict(kw)
    H, Hk, D = 4, 2, 24
    if "alibi_slopes" in kw:
        kw["alibi_slopes"] = _alibi(kw["alibi_slopes"], rng, len(lq), H)
    q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs(rng, dtype, lq, lk, H, Hk, D, pad=2)
    out, lse, S = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, return_attn_probs=True,
                                         **kw)
    assert out.shape == q.shape and lse.shape == (H, q.shape[0])
    ref = attention_varlen_ref(q, k, v, cu_q, cu_k, dout=randn(rng, q.shape, np.float64),
                               **_ref_kwargs(kw))
    assert_close(out, ref[0], dtype, "out")
    assert_lse(lse, ref[1])
    # Backward through the private wrapper, with the dout the reference used.
    dout = randn(rng, q.shape, dtype)
    ref = attention_varlen_ref(q, k, v, cu_q, cu_k, dout=dout, **_ref_kwargs(kw))
    ws = kw.get("window_size", (-1, -1))
    a = (kw.get("softmax_scale"), kw.get("causal", False), ws[0], ws[1], kw.get("softcap", 0.0),
         kw.get("alibi_slopes"))
    o, l, _, st = _flash_attn_varlen_forward(q, k, v, cu_q, cu_k, mq, mk, 0.0, *a)
    dq, dk, dv = (np.full_like(x, np.nan) for x in (q, k, v))
    d = _flash_attn_varlen_backward(dout, q, k, v, o, l, dq, dk, dv, cu_q, cu_k, mq, mk, 0.0, *a,
                                    False, st)
    assert d.shape == (H, q.shape[0])
    for got, want, nm in zip((dq, dk, dv), ref[3], ("dq", "dk", "dv")):
        assert_close(got, want, dtype, nm, factor=2.0)


def test_varlen_packed_and_dropout(rng):
    lens = [6, 13, 2]
    H, D, p = 2, 16, 0.25
    q, k, v, cu, _, m, _ = _varlen_inputs(rng, np.float32, lens, lens, H, H, D)
    qkv = np.stack([q, k, v], axis=1)  # (total, 3, H, D)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, m, causal=True)
    assert_close(out, attention_varlen_ref(q, k, v, cu, cu, causal=True)[0], np.float32, "qkv")
    kv = np.stack([k, v], axis=1)
    out = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, m, m)
    assert_close(out, attention_varlen_ref(q, k, v, cu, cu)[0], np.float32, "kv")
    # Dropout: sequence b uses mask[b, :, :Sq_b, :Sk_b]; S_dmask is (B, H, max_sq, max_sk).
    out, lse, S, st = _flash_attn_varlen_forward(q, k, v, cu, cu, m, m, p, None, True, -1, -1,
                                                 0.0, None, True)
    keep = _core.dropout_mask_for(_core.NumpyBackend, (3, H, m, m), p, st) != 0
    ref = attention_varlen_ref(q, k, v, cu, cu, causal=True, dropout_p=p, dropout_keep=keep)
    assert_close(out, ref[0], np.float32, "dropout out")
    assert S.shape == (3, H, m, m)
    vis = ref[2] > 0
    assert np.array_equal((S >= 0)[vis], keep[vis])


def test_flash_attn_defaults_and_normalization(rng):
    q, k, v = _inputs(rng, np.float32, 1, 12, 15, 2, 2, 16)
    base = flash_attn_func(q, k, v)
    assert np.array_equal(base, flash_attn_func(q, k, v, softmax_scale=16 ** -0.5))
    # flash-attn conventions: any negative window side is unbounded; softcap <= 0 is off.
    assert np.array_equal(base, flash_attn_func(q, k, v, window_size=(-5, -2)))
    assert np.array_equal(base, flash_attn_func(q, k, v, softcap=-1.0))
    # deterministic is accepted (the backward always is).
    assert np.array_equal(base, flash_attn_func(q, k, v, deterministic=True))
    # softmax_scale = 0: uniform attention over the visible keys.
    out = flash_attn_func(q, k, v, softmax_scale=0.0)
    assert np.allclose(out, v.mean(axis=1, keepdims=True).repeat(12, axis=1), atol=1e-6)


def test_bf16_needs_ml_dtypes():
    if BF16 is None:
        pytest.skip("ml_dtypes not installed")
    assert BF16.name == "bfloat16"


def test_gradients_into_packed_and_readonly_outputs(rng):
    """dq, dk, dv as interleaved views of one (B, S, 3, H, D) buffer (the library refuses
    interleaved outputs, so the binding goes through fresh arrays and copies): same values."""
    B, S, H, D = 2, 11, 2, 8
    qkv = randn(rng, (B, S, 3, H, D), np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    dout = randn(rng, (B, S, H, D), np.float32)
    o, l, _, st = _flash_attn_forward(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _flash_attn_backward(dout, q, k, v, o, l, dq, dk, dv, 0.0, None, True, -1, -1, 0.0, None,
                         False, st)
    dqkv = np.full_like(qkv, np.nan)
    _flash_attn_backward(dout, q, k, v, o, l, dqkv[:, :, 0], dqkv[:, :, 1], dqkv[:, :, 2], 0.0,
                         None, True, -1, -1, 0.0, None, False, st)
    assert np.array_equal(dqkv, np.stack([dq, dk, dv], axis=2))
    # A reversed (negative-stride) output view is written through a copy as well.
    dq2 = np.empty_like(q)
    _flash_attn_backward(dout, q, k, v, o, l, dq2[:, ::-1], dk, dv, 0.0, None, True, -1, -1,
                         0.0, None, False, st)
    assert np.array_equal(dq2[:, ::-1], dq)


def test_concurrent_calls_from_python_threads(rng):
    """ctypes releases the GIL during the call; concurrent calls share the default context
    safely and give the same bits as serial ones."""
    import threading

    inputs = [_inputs(rng, np.float32, 1, 64, 64, 4, 2, 32) for _ in range(6)]
    serial = [flash_attn_func(q, k, v, causal=True) for q, k, v in inputs]
    results = [None] * len(inputs)

    def work(i):
        for _ in range(3):
            results[i] = flash_attn_func(*inputs[i], causal=True)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(a, b) for a, b in zip(results, serial))
