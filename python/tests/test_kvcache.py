"""flash_attn_with_kvcache (and varlen with a paged block_table) on NumPy against the fp64
reference: in-place append, cache_seqlens as int or array, cache_batch_idx, cache_leftpad, paged
caches of any page size, rotary (interleaved and GPT-NeoX), ALiBi, windows, long decode."""

import numpy as np
import pytest
from helpers import (DTYPES, TOL, assert_close, assert_lse, dtype_ids, kvcache_options, randn,
                     rotary_tables)

from flashattn import flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn.reference import attention_varlen_ref, kvcache_ref


# name, B, Sq, H, Hk, D, S_cache, S_new, options
CASES = [
    ("attend only, seqlens array, causal", 3, 4, 4, 2, 32, 40, 0, {"causal": True}),
    ("append, seqlens int, gqa", 2, 3, 8, 2, 16, 30, 3, {"seqlens": "int"}),
    ("append + rotary interleaved, causal", 2, 5, 2, 2, 32, 32, 5,
     {"causal": True, "rotary": 16}),
    ("append + rotary neox, not causal", 2, 2, 4, 4, 24, 32, 2,
     {"rotary": 24, "rotary_interleaved": False}),
    ("cache_batch_idx", 3, 2, 2, 1, 16, 20, 2, {"batch_idx": True, "causal": True}),
    ("leftpad + window", 2, 3, 2, 2, 16, 30, 3, {"leftpad": True, "window_size": (6, 0)}),
    ("paged page 3 + rotary + alibi", 2, 3, 4, 2, 32, 0, 3,
     {"paged": 3, "rotary": 8, "causal": True, "alibi": True}),
    ("whole cache (seqlens None)", 2, 6, 2, 2, 8, 17, 0, {"seqlens": None}),
    ("decode over a long cache", 2, 1, 4, 1, 64, 2600, 1, {"causal": True}),
    ("softcap", 1, 4, 2, 2, 16, 25, 2, {"softcap": 2.0, "causal": True}),
]


def _case(rng, dtype, B, Sq, H, Hk, D, S_cache, S_new, o):
    q = randn(rng, (B, Sq, H, D), dtype)
    kw = {"causal": o.get("causal", False), "window_size": o.get("window_size", (-1, -1)),
          "softcap": o.get("softcap", 0.0)}
    if o.get("paged"):
        page = o["paged"]
        max_pages = 6
        n_pages = B * max_pages + 2
        k_cache = randn(rng, (n_pages, page, Hk, D), dtype)
        v_cache = randn(rng, (n_pages, page, Hk, D), dtype)
        kw["block_table"] = rng.permutation(n_pages)[:B * max_pages].reshape(B, max_pages) \
            .astype(np.int32)
        capacity = max_pages * page
    else:
        rows = B + 1 if o.get("batch_idx") else B
        k_cache = randn(rng, (rows, S_cache, Hk, D), dtype)
        v_cache = randn(rng, (rows, S_cache, Hk, D), dtype)
        capacity = S_cache
    lens = rng.integers(S_new + 1, capacity - S_new + 1, B).astype(np.int32)
    seq = o.get("seqlens", "array")
    if seq == "int":
        kw["cache_seqlens"] = int(lens[0])
    elif seq == "array":
        kw["cache_seqlens"] = lens
    kvcache_options(rng, o, kw, B, S_new, H, Hk, D, dtype, capacity, lens)
    return q, k_cache, v_cache, kw


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kvcache(case, dtype, rng):
    name, B, Sq, H, Hk, D, S_cache, S_new, o = case
    q, k_cache, v_cache, kw = _case(rng, dtype, B, Sq, H, Hk, D, S_cache, S_new, o)
    ref_out, ref_lse, ref_k, ref_v = kvcache_ref(q, k_cache, v_cache, **kw)
    k0, v0 = k_cache.copy(), v_cache.copy()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (B, H, Sq)
    assert_close(out, ref_out, dtype, "out", factor=2.0 if o.get("rotary") else 1.0)
    if np.dtype(dtype) == np.float32:
        assert_lse(lse, ref_lse)
    # The cache: appended rows equal the reference's (rotated, rounded to the cache dtype) and
    # every other position is untouched.
    changed = np.any(ref_k != k0.astype(np.float64), axis=(-1, -2)) | \
        np.any(ref_v != v0.astype(np.float64), axis=(-1, -2))
    assert changed.sum() == (B * S_new if S_new else 0)
    assert np.array_equal(k_cache[~changed], k0[~changed])
    assert np.array_equal(v_cache[~changed], v0[~changed])
    assert_close(k_cache, ref_k, dtype, "k_cache")
    assert np.array_equal(v_cache[changed].astype(np.float64), ref_v[changed])
    # return_softmax_lse=False gives out alone.
    if not S_new:
        assert np.array_equal(flash_attn_with_kvcache(q, k_cache, v_cache, **kw), out)


def test_kvcache_decode_loop_matches_full_attention(rng):
    """Token-by-token decoding with an appending cache equals causal attention over the whole
    sequence: the way an inference loop uses flash_attn_with_kvcache."""
    B, S, H, Hk, D = 2, 12, 4, 2, 16
    q, k, v = (randn(rng, (B, S, h, D), np.float32) for h in (H, Hk, Hk))
    k_cache = np.zeros((B, S, Hk, D), np.float32)
    v_cache = np.zeros((B, S, Hk, D), np.float32)
    seqlens = np.zeros(B, np.int32)
    outs = []
    for t in range(S):
        outs.append(flash_attn_with_kvcache(q[:, t:t + 1], k_cache, v_cache, k[:, t:t + 1],
                                            v[:, t:t + 1], cache_seqlens=seqlens, causal=True))
        seqlens += 1
    from flashattn import flash_attn_func

    full = flash_attn_func(q, k, v, causal=True)
    assert np.allclose(np.concatenate(outs, axis=1), full, atol=2e-6)
    assert np.array_equal(k_cache, k) and np.array_equal(v_cache, v)


def test_varlen_paged_block_table(rng):
    """flash_attn_varlen_func with block_table equals the unpaged call on the same keys."""
    H, Hk, D, page = 4, 2, 16, 5
    lq, lk = [3, 7, 1], [9, 4, 13]
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q = randn(rng, (cu_q[-1], H, D), np.float32)
    k = randn(rng, (cu_k[-1], Hk, D), np.float32)
    v = randn(rng, (cu_k[-1], Hk, D), np.float32)
    max_pages = 3
    table = rng.permutation(len(lq) * max_pages).reshape(len(lq), max_pages).astype(np.int32)
    k_pages = np.zeros((len(lq) * max_pages, page, Hk, D), np.float32)
    v_pages = np.zeros_like(k_pages)
    for b in range(len(lq)):
        for t in range(lk[b]):
            k_pages[table[b, t // page], t % page] = k[cu_k[b] + t]
            v_pages[table[b, t // page], t % page] = v[cu_k[b] + t]
    out, lse, _ = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lq), max(lk),
                                         causal=True, return_attn_probs=True, block_table=table)
    ref = attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True)
    assert_close(out, ref[0], np.float32, "out")
    assert_lse(lse, ref[1])
    with pytest.raises(ValueError, match="dropout"):
        flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lq), max(lk), dropout_p=0.1,
                               block_table=table)


def test_kvcache_errors(rng):
    q = randn(rng, (2, 1, 2, 8), np.float32)
    kc = randn(rng, (2, 10, 2, 8), np.float32)
    vc = randn(rng, (2, 10, 2, 8), np.float32)
    kn = randn(rng, (2, 1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="FA_ERR_VALUE.*say where the new keys go"):
        flash_attn_with_kvcache(q, kc, vc, kn, kn)
    with pytest.raises(ValueError, match="exceeds the cache"):
        flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=10)
    with pytest.raises(ValueError, match="FA_ERR_UNSUPPORTED.*cache_batch_idx"):
        flash_attn_with_kvcache(q, kc, vc, cache_batch_idx=np.array([0, 1], np.int32),
                                block_table=np.zeros((2, 1), np.int32))
    with pytest.raises(ValueError, match="written in place"):
        flash_attn_with_kvcache(q, np.broadcast_to(kc, kc.shape), vc, kn, kn, cache_seqlens=3)
    with pytest.raises(TypeError, match="cache_seqlens: dtype int64"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([1, 2]))
    with pytest.raises(ValueError, match="rotary"):
        cos, sin = rotary_tables(rng, 10, 8, np.float32)
        flash_attn_with_kvcache(q, kc, vc, rotary_cos=cos, rotary_sin=sin, cache_seqlens=3)
    assert np.isfinite(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3)).all()


def test_kvcache_seqlens_as_one_number(rng):
    """cache_seqlens as one number: a Python or NumPy integer, the same as the (B,) array of it;
    a negative one is an error (not "the whole cache", which is None), and a float, a bool or a
    list is refused rather than truncated or guessed at. Nothing is written on error."""
    q = randn(rng, (2, 1, 2, 8), np.float32)
    kc = randn(rng, (2, 10, 2, 8), np.float32)
    vc = randn(rng, (2, 10, 2, 8), np.float32)
    kn = randn(rng, (2, 1, 2, 8), np.float32)
    want = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([4, 4], np.int32))
    for n in (4, np.int32(4), np.int64(4)):
        assert np.array_equal(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n), want)
    k0, v0 = kc.copy(), vc.copy()
    for bad, err, match in ((-1, ValueError, r"cache_seqlens is -1; expected >= 0 \(None"),
                            (-5, ValueError, "cache_seqlens is -5"),
                            (4.0, TypeError, "expected an int or a \\(batch,\\) int32 array; "
                             "got float"),
                            (True, TypeError, "got bool"), ([4, 4], TypeError, "got list")):
        with pytest.raises(err, match=match):
            flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=bad)
    assert np.array_equal(kc, k0) and np.array_equal(vc, v0)


def test_tolerances_table_covers_dtypes():
    assert all(d.name in TOL for d in DTYPES)
