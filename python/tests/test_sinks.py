"""Attention sinks from Python (learnable_sink, alias s_aux): flash_attn_func,
flash_attn_varlen_func (packed and paged) and flash_attn_with_kvcache on NumPy arrays and torch
tensors against the fp64 reference; the sinks' gradient through autograd and torch.compile;
errors. The torch tests skip without torch."""

import numpy as np
import pytest
from helpers import seeded

from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn._lib import FlashAttnTypeError, FlashAttnValueError
from flashattn.reference import attention_ref, attention_varlen_ref, kvcache_ref

# fp32 inputs: the library's own rounding only (fp32 accumulation over <= 40 keys).
TOL = 2e-5


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    fin = np.isfinite(b)
    assert np.array_equal(np.isfinite(a), fin), "non-finite entries differ"
    return float(np.abs(a[fin] - b[fin]).max(initial=0.0) / max(1.0, np.abs(b[fin]).max(initial=0)))


def _inputs(key, B, Sq, Sk, H, Hk, D, sink_scale=2.0):
    r = np.random.default_rng(seeded(key))
    q, k, v = (r.standard_normal(s).astype(np.float32)
               for s in ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    sinks = (sink_scale * r.standard_normal(H)).astype(np.float32)
    dout = r.standard_normal((B, Sq, H, D)).astype(np.float32)
    return q, k, v, sinks, dout


# (name, B, Sq, Sk, H, Hk, D, options); the window (1, 0) with Sq > Sk leaves rows with no key.
CASES = [
    ("plain", 2, 7, 9, 4, 4, 16, {}),
    ("causal gqa", 2, 9, 9, 4, 2, 32, {"causal": True}),
    ("window, rows without keys", 1, 12, 5, 2, 1, 8, {"window_size": (1, 0)}),
    ("softcap alibi", 2, 6, 11, 4, 1, 24,
     {"softcap": 4.0, "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625], np.float32)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_numpy_forward_matches_reference(case):
    name, B, Sq, Sk, H, Hk, D, kw = case
    q, k, v, sinks, _ = _inputs(name, B, Sq, Sk, H, Hk, D)
    out, lse, _ = flash_attn_func(q, k, v, learnable_sink=sinks, return_attn_probs=True, **kw)
    ref = attention_ref(q, k, v, sinks=sinks, **kw)
    assert _rel(out, ref[0]) <= TOL
    assert _rel(lse, ref[1]) <= TOL
    # the sinks change the result: without them it is another one
    assert _rel(flash_attn_func(q, k, v, **kw), ref[0]) > 1e-3
    if name.startswith("window"):  # a row that sees no key: out 0, lse = the sink
        assert np.array_equal(out[0, 0], np.zeros_like(out[0, 0]))
        assert np.allclose(lse[0, :, 0], sinks, rtol=0, atol=0)


def test_numpy_varlen_and_kvcache_match_reference():
    q, k, v, sinks, _ = _inputs("varlen", 1, 13, 17, 4, 2, 16)
    cu_q = np.array([0, 4, 4, 13], np.int32)
    cu_k = np.array([0, 6, 9, 17], np.int32)
    qv, kv, vv = q[0], k[0], v[0]
    out, lse, _ = flash_attn_varlen_func(qv, kv, vv, cu_q, cu_k, 9, 8, causal=True,
                                         s_aux=sinks, return_attn_probs=True)
    ref = attention_varlen_ref(qv, kv, vv, cu_q, cu_k, causal=True, sinks=sinks)
    assert _rel(out, ref[0]) <= TOL and _rel(lse, ref[1]) <= TOL

    # a paged cache through flash_attn_varlen_func's block_table path
    page, H, Hk, D = 3, 4, 2, 16
    kp = np.zeros((8, page, Hk, D), np.float32)
    vp = np.zeros_like(kp)
    table = np.array([[5, 1, 7], [0, 2, 6], [3, 4, 0]], np.int32)
    for b in range(3):
        for t in range(cu_k[b + 1] - cu_k[b]):
            kp[table[b, t // page], t % page] = kv[cu_k[b] + t]
            vp[table[b, t // page], t % page] = vv[cu_k[b] + t]
    out_p = flash_attn_varlen_func(qv, kp, vp, cu_q, cu_k, 9, 8, causal=True,
                                   learnable_sink=sinks, block_table=table)
    assert _rel(out_p, ref[0]) <= TOL

    qd, kc, vc, _, _ = _inputs("kvcache", 2, 2, 10, H, Hk, D)
    kn, vn, _, _, _ = _inputs("kvcache new", 2, 2, 2, Hk, Hk, D)
    lens = np.array([3, 7], np.int32)
    want = kvcache_ref(qd, kc, vc, kn, vn, cache_seqlens=lens, causal=True, sinks=sinks)
    o, l = flash_attn_with_kvcache(qd, kc, vc, kn, vn, cache_seqlens=lens, causal=True,
                                   learnable_sink=sinks, return_softmax_lse=True)
    assert _rel(o, want[0]) <= TOL and _rel(l, want[1]) <= TOL


def test_numpy_errors():
    q, k, v, sinks, _ = _inputs("errors", 1, 3, 4, 2, 2, 8)
    with pytest.raises(FlashAttnValueError, match="learnable_sink and s_aux"):
        flash_attn_func(q, k, v, learnable_sink=sinks, s_aux=sinks)
    with pytest.raises(FlashAttnValueError, match=r"learnable_sink: shape \(3,\); expected "
                                                  r"\(nheads,\) = \(2,\)"):
        flash_attn_func(q, k, v, learnable_sink=np.zeros(3, np.float32))
    with pytest.raises(FlashAttnValueError, match="learnable_sink"):
        flash_attn_func(q, k, v, learnable_sink=np.zeros((1, 2), np.float32))
    with pytest.raises(FlashAttnTypeError, match="floating-point"):
        flash_attn_func(q, k, v, learnable_sink=np.zeros(2, np.int32))
    with pytest.raises(FlashAttnTypeError, match="floating-point"):
        flash_attn_func(q, k, v, learnable_sink=[0.0, 1.0])
    with pytest.raises(FlashAttnValueError, match="sinks.*nan|nan.*sink"):
        flash_attn_func(q, k, v, learnable_sink=np.array([0.0, np.nan], np.float32))


# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_torch_gradients_match_reference(torch, case):
    name, B, Sq, Sk, H, Hk, D, kw = case
    q, k, v, sinks, dout = _inputs(name + " torch", B, Sq, Sk, H, Hk, D)
    ref = attention_ref(q, k, v, sinks=sinks, dout=dout, **kw)
    tkw = dict(kw)
    if "alibi_slopes" in kw:
        tkw["alibi_slopes"] = torch.from_numpy(kw["alibi_slopes"])
    tq, tk, tv, ts = (torch.tensor(x, requires_grad=True) for x in (q, k, v, sinks))
    out = flash_attn_func(tq, tk, tv, learnable_sink=ts, **tkw)
    out.backward(torch.from_numpy(dout))
    assert _rel(out.detach(), ref[0]) <= TOL
    for got, want in zip((tq.grad, tk.grad, tv.grad, ts.grad), ref[3]):
        assert _rel(got, want) <= 4 * TOL
    assert ts.grad.abs().max() > 0


def test_torch_varlen_gradients_and_sink_dtype(torch):
    q, k, v, sinks, dout = _inputs("torch varlen", 1, 11, 14, 4, 2, 16)
    cu_q = np.array([0, 5, 11], np.int32)
    cu_k = np.array([0, 8, 14], np.int32)
    ref = attention_varlen_ref(q[0], k[0], v[0], cu_q, cu_k, causal=True, sinks=sinks,
                               dout=dout[0])
    tq, tk, tv = (torch.tensor(x[0], requires_grad=True) for x in (q, k, v))
    ts = torch.tensor(sinks, requires_grad=True)
    out = flash_attn_varlen_func(tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k), 6,
                                 8, causal=True, s_aux=ts)
    out.backward(torch.from_numpy(dout[0]))
    assert _rel(out.detach(), ref[0]) <= TOL
    for got, want in zip((tq.grad, tk.grad, tv.grad, ts.grad), ref[3]):
        assert _rel(got, want) <= 4 * TOL
    # transformers passes s_aux in the activations' dtype: it is used as fp32 and its gradient
    # comes back in its own dtype
    sb = torch.tensor(sinks).to(torch.bfloat16).requires_grad_()
    qb, kb, vb = (torch.tensor(x[0]).to(torch.bfloat16) for x in (q, k, v))
    ob = flash_attn_varlen_func(qb, kb, vb, torch.from_numpy(cu_q), torch.from_numpy(cu_k), 6, 8,
                                causal=True, s_aux=sb)
    ob.float().backward(torch.from_numpy(dout[0]))
    assert sb.grad.dtype == torch.bfloat16 and torch.isfinite(sb.grad).all()


def test_torch_kvcache_and_compile(torch):
    q, k, v, sinks, dout = _inputs("torch compile", 2, 8, 8, 4, 2, 16)
    tq, tk, tv, ts = (torch.tensor(x, requires_grad=True) for x in (q, k, v, sinks))
    fn = torch.compile(lambda a, b, c, s: flash_attn_func(a, b, c, causal=True,
                                                          learnable_sink=s), fullgraph=True)
    out = fn(tq, tk, tv, ts)
    out.backward(torch.from_numpy(dout))
    ref = attention_ref(q, k, v, causal=True, sinks=sinks, dout=dout)
    assert _rel(out.detach(), ref[0]) <= TOL and _rel(ts.grad, ref[3][3]) <= 4 * TOL

    kc = torch.zeros(2, 12, 2, 16)
    vc = torch.zeros(2, 12, 2, 16)
    lens = torch.tensor([0, 4], dtype=torch.int32)
    want = kvcache_ref(q[:, :2], kc.numpy(), vc.numpy(), k[:, :2], v[:, :2],
                       cache_seqlens=lens.numpy(), causal=True, sinks=sinks)
    got = flash_attn_with_kvcache(torch.from_numpy(q[:, :2]), kc, vc, torch.from_numpy(k[:, :2]),
                                  torch.from_numpy(v[:, :2]), cache_seqlens=lens, causal=True,
                                  s_aux=torch.from_numpy(sinks))
    assert _rel(got, want[0]) <= TOL


def test_torch_errors(torch):
    q, k, v, sinks, _ = _inputs("torch errors", 1, 3, 4, 2, 2, 8)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    with pytest.raises(FlashAttnValueError, match="learnable_sink and s_aux"):
        flash_attn_func(tq, tk, tv, learnable_sink=torch.zeros(2), s_aux=torch.zeros(2))
    with pytest.raises(FlashAttnTypeError, match="floating-point"):
        flash_attn_func(tq, tk, tv, learnable_sink=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(FlashAttnValueError, match=r"\(nheads,\) = \(2,\)"):
        flash_attn_func(tq, tk, tv, s_aux=torch.zeros(5))


def test_torch_opcheck_with_sinks(torch):
    from flashattn.flash_attn_interface import _torch

    _torch()  # registers the ops (flashattn may have been imported before torch)
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    ops = torch.ops.flashattn_c
    q, k, v, sinks, dout = (torch.from_numpy(x) for x in _inputs("opcheck", 2, 5, 6, 4, 2, 8))
    args = (q, k, v, 0.0, 8 ** -0.5, True, -1, -1, 0.0, None, False, sinks)
    torch.library.opcheck(ops._flash_attn_forward, args, test_utils=(
        "test_schema", "test_faketensor", "test_aot_dispatch_static"))
    out, lse, _, rng = ops._flash_attn_forward(*args)
    grads = ops._flash_attn_backward_grads(dout, q, k, v, out, lse, 0.0, 8 ** -0.5, True, -1, -1,
                                           0.0, None, rng, 0, sinks)
    assert grads[3].shape == (4,) and grads[3].dtype == torch.float32
    torch.library.opcheck(ops._flash_attn_backward_grads, (
        dout, q, k, v, out, lse, 0.0, 8 ** -0.5, True, -1, -1, 0.0, None, rng, 0, sinks),
        test_utils=("test_schema", "test_faketensor"))
