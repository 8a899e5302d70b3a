"""The PyTorch path: forward and gradients against torch.nn.functional.scaled_dot_product_attention
(math backend, fp64), torch.autograd.gradcheck, torch.compile (forward and backward through the
custom ops), torch.library.opcheck, dropout through torch's generator, layouts and errors.
Skipped as a whole when torch is not installed (`make test-torch` installs it)."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from helpers import seeded  # noqa: E402

from flashattn import (  # noqa: E402
    flash_attn_func,
    flash_attn_with_kvcache,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashattn import _core  # noqa: E402
from flashattn.flash_attn_interface import _flash_attn_forward  # noqa: E402
from flashattn.flash_attn_interface import _torch as _register_torch_ops  # noqa: E402
from flashattn.reference import attention_ref, kvcache_ref, visible_mask  # noqa: E402

HAS_CUSTOM_OP = hasattr(torch.library, "custom_op")

# flashattn was imported before torch here (conftest), so its custom ops register on first use;
# register them now for the tests that call torch.ops.flashattn_c directly.
_register_torch_ops()


def _sdpa_math(q, k, v, scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None):
    """flashattn's semantics through SDPA's math backend. q (B, Sq, H, D), k/v (B, Sk, Hk, D),
    any dtype (use fp64 for a reference). Bottom-right causal, windows and ALiBi go in as an
    additive float mask; GQA by repeating KV heads."""
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(g, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(g, dim=2).transpose(1, 2)
    vis = torch.from_numpy(visible_mask(Sq, Sk, causal, window_size))
    mask = torch.zeros((Sq, Sk), dtype=q.dtype).masked_fill(~vis, float("-inf"))
    if alibi_slopes is not None:
        dist = (torch.arange(Sq)[:, None] + Sk - Sq - torch.arange(Sk)[None, :]).abs()
        s = alibi_slopes.to(q.dtype)
        s = s if s.dim() == 2 else s[None].expand(B, H)
        mask = mask - s[:, :, None, None] * dist.to(q.dtype)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = sdpa_kernel(SDPBackend.MATH)
    except ImportError:  # torch < 2.3
        ctx = torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False)
    with ctx:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    assert not torch.isnan(a).any()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item()


TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

CASES = [
    # name, B, Sq, Sk, H, Hk, D, kwargs (no fully masked rows: SDPA gives NaN there)
    ("plain", 2, 33, 47, 3, 3, 64, {}),
    ("causal sq<sk", 2, 19, 40, 4, 4, 32, {"causal": True}),
    ("causal", 1, 37, 37, 2, 2, 16, {"causal": True}),
    ("gqa", 2, 20, 31, 8, 2, 40, {}),
    ("window", 1, 40, 40, 2, 1, 32, {"window_size": (5, 2)}),
    ("causal window", 1, 40, 44, 2, 2, 32, {"causal": True, "window_size": (6, -1)}),
    ("alibi (H)", 1, 30, 35, 4, 2, 32, {"alibi_slopes": "H"}),
    ("alibi (B, H) causal", 2, 30, 30, 2, 2, 8, {"alibi_slopes": "BH", "causal": True}),
    ("scale", 1, 21, 26, 2, 2, 48, {"softmax_scale": 0.21}),
    ("head dim 5", 1, 9, 11, 2, 2, 5, {"causal": True}),
]


def _slopes(spec, B, H):
    g = torch.Generator().manual_seed(3)
    if spec == "H":
        return torch.rand(H, generator=g) * 0.9 + 0.05
    if spec == "BH":
        return torch.rand(B, H, generator=g) * 0.9 + 0.05
    return spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_gradients_match_sdpa(case, dtype):
    name, B, Sq, Sk, H, Hk, D, kw = case
    kw = dict(kw)
    if "alibi_slopes" in kw:
        kw["alibi_slopes"] = _slopes(kw["alibi_slopes"], B, H)
    torch.manual_seed(seeded(0))
    q = torch.randn(B, Sq, H, D).to(dtype).requires_grad_()
    k = torch.randn(B, Sk, Hk, D).to(dtype).requires_grad_()
    v = torch.randn(B, Sk, Hk, D).to(dtype).requires_grad_()
    dout = torch.randn(B, Sq, H, D).to(dtype)
    out = flash_attn_func(q, k, v, **kw)
    assert out.dtype == dtype and out.shape == (B, Sq, H, D)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _sdpa_math(q64, k64, v64, scale=kw.get("softmax_scale"), causal=kw.get("causal", False),
                     window_size=kw.get("window_size", (-1, -1)),
                     alibi_slopes=kw.get("alibi_slopes"))
    rdq, rdk, rdv = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    tol = TOL[dtype]
    assert _rel(out, ref) <= tol, "out"
    for nm, a, b in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert a.dtype == dtype
        assert _rel(a, b) <= 2 * tol, nm


def test_softcap_and_fully_masked_rows_match_reference():
    """What SDPA cannot express (softcap; rows with no visible key) against the fp64 reference."""
    torch.manual_seed(seeded(1))
    q = torch.randn(2, 30, 4, 32, requires_grad=True)
    k = torch.randn(2, 12, 2, 32, requires_grad=True)
    v = torch.randn(2, 12, 2, 32, requires_grad=True)
    dout = torch.randn(2, 30, 4, 32)
    out, lse, S = flash_attn_func(q, k, v, causal=True, softcap=4.0, return_attn_probs=True)
    out.backward(dout)
    ref = attention_ref(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), causal=True,
                        softcap=4.0, dout=dout.numpy())
    assert _rel(out, torch.from_numpy(ref[0])) <= 2e-5
    fin = np.isfinite(ref[1])
    assert np.array_equal(np.isfinite(lse.numpy()), fin) and (lse.numpy()[~fin] == -np.inf).all()
    assert torch.all(out[:, :18] == 0), "rows with no visible key are zero"
    for g, r in zip((q.grad, k.grad, v.grad), ref[3]):
        assert _rel(g, torch.from_numpy(r)) <= 4e-5
    assert S.shape == (0,) and not lse.requires_grad and not S.requires_grad


def test_packed_and_bhsd_views_without_copies():
    torch.manual_seed(seeded(2))
    B, S, H, D = 2, 17, 4, 16
    qkv = torch.randn(B, S, 3, H, D, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    out.sum().backward()
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    out2 = flash_attn_func(q, k, v, causal=True)
    out2.sum().backward()
    assert torch.equal(out, out2)
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2))
    # kv packed with GQA
    q = torch.randn(B, 9, H, D, requires_grad=True)
    kv = torch.randn(B, S, 2, 2, D, requires_grad=True)
    out = flash_attn_kvpacked_func(q, kv, window_size=(4, 4))
    out.sum().backward()
    k, v = (kv.detach()[:, :, i].clone().requires_grad_() for i in range(2))
    q2 = q.detach().clone().requires_grad_()
    out2 = flash_attn_func(q2, k, v, window_size=(4, 4))
    out2.sum().backward()
    assert torch.equal(out, out2) and torch.equal(q.grad, q2.grad)
    assert torch.equal(kv.grad, torch.stack([k.grad, v.grad], dim=2))
    # SDPA's BHSD layout transposed to BSHD: a strided view, no copy, same bits.
    qb, kb, vb = (torch.randn(B, H, S, D) for _ in range(3))
    a = flash_attn_func(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2))
    b = flash_attn_func(*(x.transpose(1, 2).contiguous() for x in (qb, kb, vb)))
    assert torch.equal(a, b)


def _varlen(lens_q, lens_k, H, Hk, D, dtype=torch.float32):
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), H, D, dtype=dtype, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), Hk, D, dtype=dtype, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), Hk, D, dtype=dtype, requires_grad=True)
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


def test_varlen_matches_sdpa_per_sequence():
    torch.manual_seed(seeded(3))
    lq, lk = [5, 17, 9], [7, 30, 9]
    q, k, v, cu_q, cu_k, mq, mk = _varlen(lq, lk, 4, 2, 24)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True,
                                         return_attn_probs=True)
    assert lse.shape == (4, q.shape[0])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for b in range(3):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        x = [t.detach()[None, s:e].double().requires_grad_()
             for t, s, e in ((q, qs, qe), (k, ks, ke), (v, ks, ke))]
        ref = _sdpa_math(*x, causal=True)
        assert _rel(out[qs:qe], ref[0]) <= 2e-5
        rg = torch.autograd.grad(ref, x, dout[None, qs:qe].double())
        assert _rel(grads[0][qs:qe], rg[0][0]) <= 4e-5
        assert _rel(grads[1][ks:ke], rg[1][0]) <= 4e-5
        assert _rel(grads[2][ks:ke], rg[2][0]) <= 4e-5


def test_varlen_packed_gradients():
    torch.manual_seed(seeded(4))
    lens = [6, 13, 2]
    q, k, v, cu, _, m, _ = _varlen(lens, lens, 2, 2, 16)
    qkv = torch.stack([q, k, v], dim=1).detach().requires_grad_()
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, m, causal=True)
    out.sum().backward()
    out2 = flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True)
    out2.sum().backward()
    assert torch.equal(out, out2)
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=1))
    kv = torch.stack([k, v], dim=1).detach().requires_grad_()
    q2 = q.detach().clone().requires_grad_()
    out3 = flash_attn_varlen_kvpacked_func(q2, kv, cu, cu, m, m, causal=True)
    out3.sum().backward()
    assert torch.equal(out3, out2) and torch.equal(q2.grad, q.grad)
    assert torch.equal(kv.grad, torch.stack([k.grad, v.grad], dim=1))


def test_dropout_uses_torch_generator_and_backward_regenerates_mask():
    torch.manual_seed(seeded(5))
    B, Sq, Sk, H, D, p = 2, 21, 33, 2, 16, 0.3
    q, k, v = (torch.randn(B, s, H, D) for s in (Sq, Sk, Sk))
    dout = torch.randn(B, Sq, H, D)
    torch.manual_seed(seeded(123))
    _, _, _, rng_state = _flash_attn_forward(q, k, v, p, None, True, -1, -1, 0.0, None, False)
    keep = _core.dropout_mask_for(_core.NumpyBackend, (B, H, Sq, Sk), p, rng_state.numpy()) != 0
    torch.manual_seed(seeded(123))  # same generator state → same seed → same mask
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse, S = flash_attn_func(qg, kg, vg, dropout_p=p, causal=True, return_attn_probs=True)
    out.backward(dout)
    ref = attention_ref(q.numpy(), k.numpy(), v.numpy(), causal=True, dropout_p=p,
                        dropout_keep=keep, dout=dout.numpy())
    assert _rel(out, torch.from_numpy(ref[0])) <= 2e-5
    for g, r in zip((qg.grad, kg.grad, vg.grad), ref[3]):
        assert _rel(g, torch.from_numpy(r)) <= 4e-5
    vis = ref[2] > 0
    assert S.shape == (B, H, Sq, Sk)
    assert np.array_equal((S.numpy() >= 0)[vis], keep[vis])
    torch.manual_seed(seeded(123))
    assert torch.equal(flash_attn_func(q, k, v, dropout_p=p, causal=True), out.detach())
    assert not torch.equal(flash_attn_func(q, k, v, dropout_p=p, causal=True), out.detach())


def test_backward_is_deterministic():
    torch.manual_seed(seeded(6))
    q, k, v = (torch.randn(2, 64, 4, 32, requires_grad=True) for _ in range(3))
    g1 = torch.autograd.grad(flash_attn_func(q, k, v, causal=True).sum(), (q, k, v))
    g2 = torch.autograd.grad(flash_attn_func(q, k, v, causal=True, deterministic=True).sum(),
                             (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))


# gradcheck: the library computes in fp32 (it has no fp64 dtype), so gradcheck runs on fp32
# inputs with central differences of step GC_EPS. Measured on these shapes, the analytic
# Jacobian (our backward) differs from the numerical one by at most ~1e-4 at eps = 3e-3
# (fp32 rounding of f over 2·eps); the bounds below leave a 5x margin. The tight accuracy check
# of the gradients is test_forward_and_gradients_match_sdpa (fp64 SDPA, 4e-5 relative).
GC_EPS, GC_ATOL, GC_RTOL = 3e-3, 5e-4, 1e-3


def _gradcheck(fn, inputs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not of double precision.*")
        return torch.autograd.gradcheck(fn, inputs, eps=GC_EPS, atol=GC_ATOL, rtol=GC_RTOL,
                                        nondet_tol=0.0)


GRADCHECK = [
    ("plain", 1, 5, 6, 2, 2, 8, {}),
    ("causal gqa", 1, 6, 6, 4, 2, 8, {"causal": True}),
    ("window alibi softcap", 2, 5, 7, 2, 1, 4,
     {"window_size": (2, 1), "alibi_slopes": torch.tensor([0.4, 0.2]), "softcap": 3.0}),
    ("dropout (fixed seed)", 1, 5, 6, 2, 2, 8, {"dropout_p": 0.3}),
]


@pytest.mark.parametrize("case", GRADCHECK, ids=[c[0] for c in GRADCHECK])
def test_gradcheck(case):
    name, B, Sq, Sk, H, Hk, D, kw = case
    torch.manual_seed(seeded(7))
    q = torch.randn(B, Sq, H, D, requires_grad=True)
    k = torch.randn(B, Sk, Hk, D, requires_grad=True)
    v = torch.randn(B, Sk, Hk, D, requires_grad=True)

    def fn(q, k, v):
        torch.manual_seed(seeded(11))  # dropout: the same mask on every evaluation
        return flash_attn_func(q, k, v, **kw)

    assert _gradcheck(fn, (q, k, v))


def test_gradcheck_bounds_catch_a_one_percent_gradient_error():
    """The fp32 bounds are not vacuous: a backward off by 1% fails them."""

    class Skewed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g * 1.01

    torch.manual_seed(seeded(7))
    q, k, v = (torch.randn(1, 5, 2, 8, requires_grad=True) for _ in range(3))
    with pytest.raises(Exception, match="Jacobian mismatch"):
        _gradcheck(lambda q, k, v: flash_attn_func(Skewed.apply(q), k, v, causal=True),
                   (q, k, v))


def test_gradcheck_varlen_and_packed():
    torch.manual_seed(seeded(8))
    q, k, v, cu_q, cu_k, mq, mk = _varlen([3, 5], [4, 6], 2, 1, 4)
    assert _gradcheck(lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk,
                                                             causal=True), (q, k, v))
    qkv = torch.randn(1, 5, 3, 2, 4, requires_grad=True)
    assert _gradcheck(lambda x: flash_attn_qkvpacked_func(x, causal=True), (qkv,))


class _Attention(torch.nn.Module):
    """A small attention block: qkv projection, flash_attn_func, output projection."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, C // self.heads).unbind(2)
        return self.proj(flash_attn_func(q, k, v, causal=True).reshape(B, S, C))


@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_torch_compile_forward_and_backward():
    torch.manual_seed(seeded(9))
    eager = _Attention()
    compiled_model = _Attention()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, fullgraph=True)  # fullgraph: no graph breaks
    x = torch.randn(2, 24, 32)
    y_eager = eager(x)
    y = compiled(x)
    assert torch.allclose(y, y_eager, atol=1e-5, rtol=1e-5)
    y.square().sum().backward()
    y_eager.square().sum().backward()
    for (n, a), b in zip(compiled_model.named_parameters(), eager.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-4, rtol=1e-4), n


@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_torch_compile_graph_holds_the_custom_ops():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(seeded(10))
    q, k, v = (torch.randn(1, 16, 2, 16, requires_grad=True) for _ in range(3))
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True).sum(),
                      backend=cnt, fullgraph=True)
    f(q, k, v).backward()
    assert cnt.frame_count == 1
    # The autograd.Function is traced into fwd/bwd sub-graphs that call the custom ops.
    text = "\n".join(g.print_readable(print_output=False) for g in cnt.graphs)
    assert "flashattn_c._flash_attn_forward" in text
    assert "flashattn_c._flash_attn_backward_grads" in text


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck")
def test_opcheck_custom_ops():
    torch.manual_seed(seeded(11))
    ops = torch.ops.flashattn_c
    # The ops carry no autograd formula of their own (the autograd.Function classes do, as in
    # flash-attn), so the inputs here do not require grad.
    q = torch.randn(2, 7, 4, 8)
    k = torch.randn(2, 9, 2, 8)
    v = torch.randn(2, 9, 2, 8)
    args = (q, k, v, 0.0, 8 ** -0.5, True, -1, -1, 0.0, None, False)
    torch.library.opcheck(ops._flash_attn_forward, args, test_utils=(
        "test_schema", "test_faketensor", "test_aot_dispatch_static"))
    out, lse, _, rng = ops._flash_attn_forward(*args)
    bargs = (torch.randn_like(out), q, k, v, out, lse,
             torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), 0.0, 8 ** -0.5,
             True, -1, -1, 0.0, None, False, rng)
    torch.library.opcheck(ops._flash_attn_backward, bargs, test_utils=(
        "test_schema", "test_faketensor"))
    for pack, kk, vv in ((0, k, v), (2, k, v), (3, torch.randn_like(q), torch.randn_like(q))):
        torch.library.opcheck(ops._flash_attn_backward_grads, (
            torch.randn_like(out), q, kk, vv, out, lse, 0.0, 8 ** -0.5, True, -1, -1, 0.0, None,
            rng, pack), test_utils=("test_schema", "test_faketensor"))
    kc, vc = torch.randn(2, 20, 2, 8), torch.randn(2, 20, 2, 8)
    torch.library.opcheck(ops._flash_attn_with_kvcache, (
        q, kc, vc, torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2, 8), None, None,
        torch.tensor([4, 9], dtype=torch.int32), -1, None, None, None, 8 ** -0.5, True, -1, -1,
        0.0, True, None, 0), test_utils=("test_schema", "test_faketensor"))
    qv = torch.randn(12, 4, 8)
    kv = torch.randn(15, 2, 8)
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 15], dtype=torch.int32)
    torch.library.opcheck(ops._flash_attn_varlen_forward,
                          (qv, kv, kv, cu_q, cu_k, 7, 9, 0.0, 8 ** -0.5, False),
                          test_utils=("test_schema", "test_faketensor"))


def test_inference_modes():
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    with torch.no_grad():
        a = flash_attn_func(q, k, v)
    with torch.inference_mode():
        b = flash_attn_func(q, k, v)
    assert torch.equal(a, b)


def test_torch_errors():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(TypeError, match="float64 is not supported.*cast to float32"):
        flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="which does not divide"):
        flash_attn_func(torch.randn(1, 4, 4, 8), torch.randn(1, 4, 3, 8), torch.randn(1, 4, 3, 8))
    with pytest.raises(TypeError, match="FA_ERR_DTYPE"):
        flash_attn_func(q, q.half(), q)
    cu = torch.tensor([0, 4], dtype=torch.int64)
    with pytest.raises(TypeError, match=r"cu_seqlens_q: dtype torch.int64 is not supported; "
                                        r"expected torch.int32 \(.*\.to\(torch\.int32\)\)"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu.int(), 4, 4)


def test_kvcache_torch_in_place_and_no_grad():
    torch.manual_seed(seeded(12))
    B, H, Hk, D, S_cache = 2, 4, 2, 32, 40
    q = torch.randn(B, 1, H, D)
    k_cache, v_cache = torch.randn(B, S_cache, Hk, D), torch.randn(B, S_cache, Hk, D)
    k_new, v_new = torch.randn(B, 1, Hk, D), torch.randn(B, 1, Hk, D)
    seqlens = torch.tensor([5, 17], dtype=torch.int32)
    ang = torch.rand(S_cache, 8) * 6.28
    cos, sin = ang.cos(), ang.sin()
    ref = kvcache_ref(q.numpy(), k_cache.numpy(), v_cache.numpy(), k_new.numpy(), v_new.numpy(),
                      cos.numpy(), sin.numpy(), seqlens.numpy(), causal=True)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens,
                                       causal=True, return_softmax_lse=True)
    assert _rel(out, torch.from_numpy(ref[0])) <= 2e-5
    assert _rel(lse, torch.from_numpy(ref[1])) <= 2e-5
    assert _rel(k_cache, torch.from_numpy(ref[2])) <= 2e-6  # written in place
    assert torch.equal(v_cache, torch.from_numpy(ref[3]).float())


@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_kvcache_eager_call_matches_the_op():
    """A plain eager decode step skips the custom op's dispatch: it must give the op's results
    bit for bit, bump the caches' version counters when it appends (and only then), and leave
    calls that need the op (a tensor requiring grad, a dispatch mode) to it."""
    torch.manual_seed(seeded(14))
    B, H, Hk, D, S_cache = 2, 4, 2, 32, 40
    q = torch.randn(B, 1, H, D).bfloat16()
    caches = [torch.randn(B, S_cache, Hk, D).bfloat16() for _ in range(2)]
    k_new, v_new = torch.randn(B, 1, Hk, D).bfloat16(), torch.randn(B, 1, Hk, D).bfloat16()
    seqlens = torch.tensor([5, 17], dtype=torch.int32)
    kc1, vc1 = (c.clone() for c in caches)
    kc2, vc2 = (c.clone() for c in caches)
    before = kc1._version, vc1._version
    out1, lse1 = flash_attn_with_kvcache(q, kc1, vc1, k_new, v_new, cache_seqlens=seqlens,
                                         causal=True, return_softmax_lse=True)
    assert kc1._version > before[0] and vc1._version > before[1]
    out2, lse2 = torch.ops.flashattn_c._flash_attn_with_kvcache(
        q, kc2, vc2, k_new, v_new, None, None, seqlens, -1, None, None, None, D ** -0.5, True,
        -1, -1, 0.0, True, None, 0)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    after = kc1._version, vc1._version
    out3 = flash_attn_with_kvcache(q, kc1, vc1, cache_seqlens=seqlens + 1, causal=True)
    assert (kc1._version, vc1._version) == after  # nothing appended, nothing written
    # without return_softmax_lse the eager call asks the library for no lse: out is the op's
    out4, _ = torch.ops.flashattn_c._flash_attn_with_kvcache(
        q, kc1, vc1, None, None, None, None, seqlens + 1, -1, None, None, None, D ** -0.5, True,
        -1, -1, 0.0, True, None, 0)
    assert torch.equal(out3, out4)
    # under a dispatch mode the call goes through the op, so the mode sees it
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen() as mode:
        flash_attn_with_kvcache(q, kc1, vc1, cache_seqlens=seqlens, causal=True)
    assert any("flashattn_c" in name for name in mode.ops), mode.ops


def test_kvcache_seqlens_as_one_number():
    """An int cache_seqlens is the (B,) tensor of it; a negative one, a float or a bool is an
    error with nothing written (-1 is not "the whole cache": that is None)."""
    torch.manual_seed(seeded(5))
    q, kn = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    kc, vc = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    want = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.full((2,), 4, dtype=torch.int32))
    assert torch.equal(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=4), want)
    k0, v0 = kc.clone(), vc.clone()
    for bad, err in ((-1, ValueError), (4.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match="cache_seqlens"):
            flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=bad)
    assert torch.equal(kc, k0) and torch.equal(vc, v0)


@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch < 2.4 has no torch.library.custom_op")
def test_kvcache_under_torch_compile():
    """A compiled decode step appends to the cache in place (a mutating custom op) and matches
    eager."""
    torch.manual_seed(seeded(13))
    B, H, D, S_cache = 2, 2, 16, 24

    def step(q, k, v, k_cache, v_cache, seqlens):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                       causal=True) * 2

    compiled = torch.compile(step, fullgraph=True)
    caches = [torch.zeros(B, S_cache, H, D) for _ in range(4)]
    seqlens = torch.zeros(B, dtype=torch.int32)
    for t in range(3):
        q, k, v = (torch.randn(B, 1, H, D) for _ in range(3))
        a = step(q, k, v, caches[0], caches[1], seqlens)
        b = compiled(q, k, v, caches[2], caches[3], seqlens)
        assert torch.allclose(a, b, atol=1e-6)
        seqlens += 1
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[2][:, :3].abs().sum() > 0 and caches[2][:, 3:].abs().sum() == 0


@pytest.mark.parametrize("varlen", [False, True])
def test_fp32_out_of_bf16_forward(varlen):
    """_core's internal out_dtype=torch.float32 (ring attention's partials): the fp32 out of bf16
    inputs is closer to the fp64 reference than the bf16 out, and rounds to it within one ulp;
    lse is the same. Other out dtypes are refused."""
    from flashattn._torch_api import TorchBackend

    torch.manual_seed(seeded(40))
    B, Sq, Sk, H, Hk, D = 2, 37, 53, 4, 2, 64
    q = torch.randn(B, Sq, H, D).to(torch.bfloat16)
    k = torch.randn(B, Sk, Hk, D).to(torch.bfloat16)
    v = torch.randn(B, Sk, Hk, D).to(torch.bfloat16)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    args = (0.0, None, True, 20, 0, 3.0, slopes, False)
    if varlen:
        cu_q = torch.tensor([0, Sq, 2 * Sq], dtype=torch.int32)
        cu_k = torch.tensor([0, Sk, 2 * Sk], dtype=torch.int32)
        qv, kv, vv = q.reshape(-1, H, D), k.reshape(-1, Hk, D), v.reshape(-1, Hk, D)

        def run(**kw):
            out, lse, _, _ = _core.flash_attn_varlen_forward(TorchBackend, qv, kv, vv, cu_q, cu_k,
                                                             Sq, Sk, *args[:6], *args[6:], **kw)
            return out.reshape(B, Sq, H, D), lse
    else:
        def run(**kw):
            out, lse, S, rng = _core.flash_attn_forward(TorchBackend, q, k, v, *args, **kw)
            assert S.shape == (0,) and rng.shape == (2,)
            return out, lse
    o16, l16 = run()
    o32, l32 = run(out_dtype=torch.float32)
    assert o16.dtype == torch.bfloat16 and o32.dtype == torch.float32
    assert torch.equal(l16, l32)
    ref = attention_ref(q.float().numpy(), k.float().numpy(), v.float().numpy(), causal=True,
                        window_size=(20, 0), softcap=3.0, alibi_slopes=slopes.numpy())[0]
    e32 = np.abs(o32.numpy() - ref).max()
    e16 = np.abs(o16.float().numpy() - ref).max()
    # the bf16 out's rounding is gone; where the CPU's bf16 products round P to bf16 for P·V
    # (refbf16, avx512 + avx512_bf16), that error stays, and is the size of the output's rounding
    import flashattn

    info = flashattn.build_info()
    p_rounded = "in use: refbf16" in info or "+ avx512_bf16" in info
    assert e32 < (1.0 if p_rounded else 0.5) * e16, (e32, e16)
    # within one bf16 ulp of the bf16 out (equal where P·V runs on fp32 probabilities)
    ulp = torch.finfo(torch.bfloat16).eps * o16.float().abs().clamp_min(2.0 ** -126)
    assert torch.all((o32.to(torch.bfloat16).float() - o16.float()).abs() <= ulp)
    assert torch.equal(run(out_dtype=torch.bfloat16)[0], o16)
    with pytest.raises(TypeError, match="out_dtype"):
        run(out_dtype=torch.float16)
