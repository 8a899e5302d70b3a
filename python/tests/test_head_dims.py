"""A V head dim of its own (v, out, dout, dv: Dv; q, k: D), as DeepSeek's MLA (192, 128): numpy
and torch tensors against the fp64 reference (flashattn.reference), forward, varlen, KV cache
and gradients (torch through autograd); the packed variants refuse Dv != D."""

import numpy as np
import pytest
from helpers import DTYPES, assert_close, assert_lse, dtype_ids, randn

from flashattn import (
    FlashAttnValueError,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)
from flashattn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward
from flashattn.reference import attention_ref, attention_varlen_ref, kvcache_ref

DIMS = [(192, 128), (128, 64), (64, 128), (40, 24), (8, 16)]
FEATURES = [("plain", {}), ("causal_gqa", {"causal": True}),
            ("window_softcap", {"window_size": (20, 5), "softcap": 4.0})]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids(DTYPES))
@pytest.mark.parametrize("dims", DIMS, ids=[f"{d}x{dv}" for d, dv in DIMS])
@pytest.mark.parametrize("feat", FEATURES, ids=[f[0] for f in FEATURES])
def test_forward_backward_numpy(feat, dims, dtype, rng):
    (D, Dv), kw = dims, feat[1]
    B, Sq, Sk, H, Hk = 2, 33, 47, 4, 2
    q, k = randn(rng, (B, Sq, H, D), dtype), randn(rng, (B, Sk, Hk, D), dtype)
    v, dout = randn(rng, (B, Sk, Hk, Dv), dtype), randn(rng, (B, Sq, H, Dv), dtype)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert out.shape == (B, Sq, H, Dv) and out.dtype == dtype
    ref = attention_ref(q, k, v, dout=dout, **kw)
    assert_close(out, ref[0], dtype, "out")
    assert_lse(lse, ref[1])
    ws = kw.get("window_size", (-1, -1))
    args = (None, kw.get("causal", False), ws[0], ws[1], kw.get("softcap", 0.0), None)
    out, lse, _, rng_state = _flash_attn_forward(q, k, v, 0.0, *args, False)
    dq, dk, dv = (np.full_like(x, np.nan) for x in (q, k, v))
    _flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, *args, False, rng_state)
    assert dv.shape == (B, Sk, Hk, Dv)
    for got, want, nm in zip((dq, dk, dv), ref[3], ("dq", "dk", "dv")):
        assert_close(got, want, dtype, nm, factor=2.0)


@pytest.mark.parametrize("dims", DIMS, ids=[f"{d}x{dv}" for d, dv in DIMS])
def test_varlen_and_kvcache_numpy(dims, rng):
    D, Dv = dims
    dtype = np.float32
    cu_q, cu_k = np.array([0, 7, 20], np.int32), np.array([0, 30, 41], np.int32)
    q, k = randn(rng, (20, 4, D), dtype), randn(rng, (41, 2, D), dtype)
    v = randn(rng, (41, 2, Dv), dtype)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 13, 30, causal=True)
    assert out.shape == (20, 4, Dv)
    assert_close(out, attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True)[0], dtype, "out")
    # paged cache with an append
    kc, vc = randn(rng, (8, 16, 2, D), dtype), randn(rng, (8, 16, 2, Dv), dtype)
    kn, vn = randn(rng, (2, 3, 2, D), dtype), randn(rng, (2, 3, 2, Dv), dtype)
    qd = randn(rng, (2, 3, 4, D), dtype)
    bt = np.array([[7, 5, 3, 1], [6, 4, 2, 0]], np.int32)
    lens = np.array([40, 9], np.int32)
    want = kvcache_ref(qd, kc, vc, k=kn, v=vn, cache_seqlens=lens, block_table=bt, causal=True)
    got, lse = flash_attn_with_kvcache(qd, kc, vc, k=kn, v=vn, cache_seqlens=lens,
                                       block_table=bt, causal=True, return_softmax_lse=True)
    assert got.shape == (2, 3, 4, Dv)
    assert_close(got, want[0], dtype, "out")
    assert_lse(lse, want[1])
    assert np.array_equal(vc, want[3].astype(dtype)), "v_new appended into the cache"


def test_packed_and_mismatched_refused(rng):
    q, k = randn(rng, (1, 4, 2, 64), np.float32), randn(rng, (1, 4, 2, 64), np.float32)
    with pytest.raises(FlashAttnValueError):  # kv packed as one tensor: one head dim for both
        flash_attn_kvpacked_func(q, np.stack([k, randn(rng, (1, 4, 2, 64), np.float32)], 2)[
            ..., :32])
    v = randn(rng, (1, 4, 2, 32), np.float32)
    out = flash_attn_func(q, k, v)
    assert out.shape == (1, 4, 2, 32)
    with pytest.raises(FlashAttnValueError, match="head dim"):
        flash_attn_func(q, k, randn(rng, (1, 4, 2, 257), np.float32))


def test_torch_autograd():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    for D, Dv in DIMS:
        q = torch.randn(2, 17, 4, D, generator=g, dtype=torch.float64).float().requires_grad_()
        k = torch.randn(2, 23, 2, D, generator=g).requires_grad_()
        v = torch.randn(2, 23, 2, Dv, generator=g).requires_grad_()
        dout = torch.randn(2, 17, 4, Dv, generator=g)
        out = flash_attn_func(q, k, v, causal=True)
        assert out.shape == (2, 17, 4, Dv)
        out.backward(dout)
        ref = attention_ref(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(),
                            dout=dout.numpy(), causal=True)
        assert_close(out.detach().numpy(), ref[0], np.float32, "out")
        for x, want, nm in zip((q, k, v), ref[3], ("dq", "dk", "dv")):
            assert x.grad.shape == x.shape
            assert_close(x.grad.numpy(), want, np.float32, nm, factor=2.0)
        # varlen through autograd
        qv = q.detach()[0].clone().requires_grad_()
        kv_, vv = k.detach()[0].clone().requires_grad_(), v.detach()[0].clone().requires_grad_()
        cu_q, cu_k = torch.tensor([0, 17], dtype=torch.int32), torch.tensor([0, 23],
                                                                            dtype=torch.int32)
        o = flash_attn_varlen_func(qv, kv_, vv, cu_q, cu_k, 17, 23, causal=True)
        o.backward(dout[0])
        assert_close(o.detach().numpy(), ref[0][0], np.float32, "varlen out")
        assert_close(vv.grad.numpy(), ref[3][2][0], np.float32, "varlen dv", factor=2.0)
