"""flash_attn_combine (flash-attn 3's layout) on NumPy and PyTorch: against an fp64 merge of the
same partials with the edge rows planted (a part with lse = -inf whose outputs are NaN, a row
with every part -inf, a NaN lse), flash_attn_func over all keys against the combine of
flash_attn_func over parts of them, out= and out_dtype, torch.compile, and the errors."""

import numpy as np
import pytest

import flashattn
from flashattn import FlashAttnError

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def _partials(rng, n, B, S, H, D):
    op = rng.standard_normal((n, B, S, H, D)).astype(np.float32)
    lp = (3 * rng.standard_normal((n, B, S, H))).astype(np.float32)
    lp[0, 0, 0, 1 % H] = -np.inf  # a masked part: its outputs must not be read
    op[0, 0, 0, 1 % H] = np.nan
    lp[:, 0, min(1, S - 1), 0] = -np.inf  # every part masked
    if B > 1:
        lp[n - 1, 1, 0, 0] = np.nan  # a NaN lse
    return op, lp


def _ref(op, lp):
    """fp64 merge: out, lse (B, S, H)."""
    op, lp = op.astype(np.float64), lp.astype(np.float64)
    m = lp.max(0)
    bad = np.isnan(lp).any(0)
    none = ~bad & (m == -np.inf)
    mm = np.where(none | bad, 0.0, m)
    w = np.where(lp == -np.inf, 0.0, np.exp(np.where(np.isnan(lp), 0.0, lp) - mm))
    safe = np.where(np.isnan(op) & (w[..., None] == 0), 0.0, op)
    l = w.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (w[..., None] * safe).sum(0) / l[..., None]
        lse = mm + np.log(l)
    out[none] = 0.0
    lse[none] = -np.inf
    out[bad] = np.nan
    lse[bad] = np.nan
    return out, lse


def _check(out, lse, ref_out, ref_lse, tol=1e-5):
    out, lse = np.asarray(out, dtype=np.float64), np.asarray(lse, dtype=np.float64)
    assert np.array_equal(np.isnan(out), np.isnan(ref_out))
    assert np.array_equal(np.isnan(lse), np.isnan(ref_lse))
    fin = ~np.isnan(ref_out)
    assert np.abs(out[fin] - ref_out[fin]).max() <= tol * max(1.0, np.abs(ref_out[fin]).max())
    fl = np.isfinite(ref_lse)
    assert np.array_equal(lse[~fl & ~np.isnan(ref_lse)], ref_lse[~fl & ~np.isnan(ref_lse)])
    assert np.abs(lse[fl] - ref_lse[fl]).max() <= tol * max(1.0, np.abs(ref_lse[fl]).max())


@pytest.mark.parametrize("n,B,S,H,D", [(1, 1, 3, 2, 8), (3, 2, 5, 3, 64), (17, 2, 4, 2, 130)])
def test_numpy_matches_fp64(n, B, S, H, D):
    op, lp = _partials(np.random.default_rng(n * 100 + D), n, B, S, H, D)
    out, lse = flashattn.flash_attn_combine(op, lp)
    assert out.shape == (B, S, H, D) and out.dtype == np.float32
    assert lse.shape == (B, S, H) and lse.dtype == np.float32
    _check(out, lse, *_ref(op, lp))


def test_numpy_reversed_strides():
    """Negative strides: the partials are copied whole, never part 0 alone."""
    op, lp = _partials(np.random.default_rng(4), 3, 2, 4, 2, 8)
    rop, rlp = op[:, :, ::-1], lp[:, :, ::-1]  # each part's rows in reverse order
    out, lse = flashattn.flash_attn_combine(rop, rlp)
    _check(out, lse, *_ref(np.ascontiguousarray(rop), np.ascontiguousarray(rlp)))


@needs_torch
@pytest.mark.parametrize("out_dtype", [None, "float16", "bfloat16"])
def test_torch_matches_fp64(out_dtype):
    op, lp = _partials(np.random.default_rng(5), 4, 2, 6, 3, 40)
    dt = None if out_dtype is None else getattr(torch, out_dtype)
    # flash-attn 3's lse_partial is stored (n, B, H, S): the same values through a transpose
    lpt = torch.from_numpy(np.ascontiguousarray(lp.transpose(0, 1, 3, 2))).transpose(2, 3)
    out, lse = flashattn.flash_attn_combine(torch.from_numpy(op), lpt, out_dtype=dt)
    assert out.dtype == (dt or torch.float32) and lse.shape == (2, 6, 3)
    tol = {None: 1e-5, "float16": 1e-3, "bfloat16": 8e-3}[out_dtype]
    _check(out.float().numpy(), lse.numpy(), *_ref(op, lp), tol=tol)


@needs_torch
def test_combine_of_parts_equals_whole_attention():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 37, 4, 32, generator=g)
    k, v = (torch.randn(2, 100, 2, 32, generator=g) for _ in range(2))
    whole, whole_lse, _ = flashattn.flash_attn_func(q, k, v, softcap=4.0,
                                                    return_attn_probs=True)
    outs, lses = [], []
    for a, b in ((0, 30), (30, 64), (64, 100)):
        o, lse, _ = flashattn.flash_attn_func(q, k[:, a:b], v[:, a:b], softcap=4.0,
                                              return_attn_probs=True)
        outs.append(o)
        lses.append(lse.transpose(1, 2))  # (B, H, S) -> (B, S, H)
    out, lse = flashattn.flash_attn_combine(torch.stack(outs), torch.stack(lses))
    assert (out - whole).abs().max() <= 2e-5
    assert (lse - whole_lse.transpose(1, 2)).abs().max() <= 2e-5


@needs_torch
def test_out_is_written_in_place():
    op, lp = _partials(np.random.default_rng(9), 2, 2, 3, 2, 16)
    out = torch.full((2, 3, 2, 16), 7.0, dtype=torch.bfloat16)
    res, lse = flashattn.flash_attn_combine(torch.from_numpy(op), torch.from_numpy(lp), out=out)
    assert res is out
    ref_out, _ = _ref(op, lp)
    fin = ~np.isnan(ref_out)
    assert np.abs(out.float().numpy()[fin] - ref_out[fin]).max() <= 8e-3


@needs_torch
def test_torch_compile():
    from flashattn.flash_attn_interface import _torch as _register

    if not _register().HAS_CUSTOM_OP:
        pytest.skip("torch < 2.4 has no torch.library.custom_op")
    op, lp = (torch.from_numpy(x) for x in _partials(np.random.default_rng(2), 3, 2, 4, 2, 8))
    f = torch.compile(lambda a, b: flashattn.flash_attn_combine(a, b), backend="aot_eager",
                      fullgraph=True)
    (a, la), (b, lb) = f(op, lp), flashattn.flash_attn_combine(op, lp)
    assert torch.equal(a.nan_to_num(), b.nan_to_num()) and la.shape == lb.shape == (2, 4, 2)


def test_errors():
    op = np.zeros((2, 1, 3, 2, 8), dtype=np.float32)
    lp = np.zeros((2, 1, 3, 2), dtype=np.float32)
    with pytest.raises(FlashAttnError, match="out_partial: expected a 5-D"):
        flashattn.flash_attn_combine(op[0], lp)
    with pytest.raises(FlashAttnError, match="num_splits"):
        flashattn.flash_attn_combine(op[:0], lp[:0])
    with pytest.raises(FlashAttnError, match="lse_partial: shape"):
        flashattn.flash_attn_combine(op, lp[:, :, :2])
    with pytest.raises(FlashAttnError, match="out_partial.*f32"):
        flashattn.flash_attn_combine(op.astype(np.float16), lp)
    with pytest.raises(FlashAttnError, match="out: shape"):
        flashattn.flash_attn_combine(op, lp, out=np.zeros((1, 3, 2, 4), dtype=np.float32))
