"""CUDA tensors through the Python package.

Everywhere: the ctypes fa_params has the size the loaded library expects, cuda_available()
answers (with a reason), the device rules are checked before any C call, and the custom ops'
fake implementations put outputs on the input's (fake) CUDA device.

Only where torch sees a GPU and the library's CUDA plug-in reports a device (skipped otherwise,
with the reason): flash_attn_func, the varlen and packed variants on the GPU against the CPU
backend on the same inputs (fp16, bf16, fp32; causal, window, softcap, ALiBi, GQA, dropout with
the same seed), both FA_CUDA_TILE_D128 tiles at head dim 128, outputs on the input's device and
on torch's current stream, mixed-device errors, a malformed FA_CUDA_TILE_D128, the backward
(flash_attn_func over the forward's grid, varlen, packed, _flash_attn_backward, torch.compile)
against the CPU backend's gradients and bitwise deterministic, and the KV cache
(flash_attn_with_kvcache in place, contiguous and paged with pages of 1..256, rotary, leftpad,
cache_batch_idx, a 64-step decode loop, splits bitwise identical, varlen with block_table,
torch.compile) against the CPU on the same inputs, flash_attn_combine, the forward's fp32 out of
16-bit inputs, and flashattn.parallel on CUDA tensors (NCCL, one rank).
"""

import ctypes
import glob
import os
import zlib

import numpy as np
import pytest

import flashattn
from flashattn import _core, _lib

try:
    import torch
except ImportError:  # the GPU tests need torch; the others do not
    torch = None


def _gpu_status():
    if torch is None:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, (f"torch.cuda.is_available() is False (torch {torch.__version__}, "
                       f"built for CUDA {torch.version.cuda})")
    ok, why = flashattn.cuda_available()
    if not ok:
        return False, f"flashattn.cuda_available() is False: {why}"
    return True, why


GPU_OK, GPU_REASON = _gpu_status()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"no GPU for flashattn: {GPU_REASON}")

# GPU vs CPU on the same inputs: each is within helpers.TOL of the fp64 reference, so they are
# within twice that of each other (relative to max(1, max |cpu|)).
TOL = {"float32": 5e-5, "float16": 4e-3, "bfloat16": 3.2e-2}


# ----------------------------------------------------------------------------------------------
# Everywhere
# ----------------------------------------------------------------------------------------------

def test_gpu_present_when_required():
    """scripts/gpu-check.sh sets FLASHATTN_REQUIRE_GPU=1: there, skipping the GPU tests is a
    failure, not a pass."""
    if os.environ.get("FLASHATTN_REQUIRE_GPU") != "1":
        pytest.skip("FLASHATTN_REQUIRE_GPU is not set")
    assert GPU_OK, f"the GPU tests would be skipped: {GPU_REASON}"


def test_params_struct_size_matches_library():
    """fa_params_init writes struct_size = sizeof(fa_params) as the C library was compiled;
    the ctypes struct must be exactly that (dsinks is its last field)."""
    buf = ctypes.create_string_buffer(4096)
    _lib.lib().fa_params_init(buf)
    size = ctypes.c_uint32.from_buffer(buf).value
    assert size == ctypes.sizeof(_lib.Params), (
        f"libflashattn's fa_params is {size} bytes; python/flashattn/_lib.py's Params is "
        f"{ctypes.sizeof(_lib.Params)}")
    assert _lib.Params.dsinks.offset + ctypes.sizeof(_lib.Tensor) == size
    # fa_params_init leaves the sinks and their gradient absent
    assert _lib.Params.from_buffer(buf).sinks.data is None
    assert _lib.Params.from_buffer(buf).dsinks.data is None
    assert _lib.params_struct_size() == size
    # fa_params_init leaves cuda_stream NULL (the legacy default stream) and cancel NULL
    assert _lib.Params.from_buffer(buf).cuda_stream is None
    assert _lib.Params.from_buffer(buf).cancel is None


def test_params_carry_the_stream():
    p = _lib.Params.from_buffer(_lib.params(cuda_stream=0x7F00DEAD0))
    assert p.cuda_stream == 0x7F00DEAD0
    assert _lib.Params.from_buffer(_lib.params()).cuda_stream is None


def _nvidia_device_node():
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/nvidiactl")


def test_cuda_available_answers_with_a_reason():
    ok, reason = flashattn.cuda_available()
    assert isinstance(ok, bool)
    assert isinstance(reason, str) and reason.strip(), "cuda_available() gave no reason"
    if not _nvidia_device_node():  # no GPU on this machine: must say no, and why
        assert ok is False, reason
    if ok:
        assert _lib.device_count(_lib.DEVICE_CUDA) >= 1


def test_device_count_cpu_is_one():
    if not hasattr(_lib.lib(), "fa_device_count"):
        pytest.skip("the loaded library has no fa_device_count")
    assert _lib.device_count(_lib.DEVICE_CPU) == 1


def test_cuda_device_count_error_or_count():
    """With no plug-in or no driver, fa_device_count(CUDA) is FA_ERR_DEVICE with a message."""
    if not hasattr(_lib.lib(), "fa_device_count"):
        pytest.skip("the loaded library has no fa_device_count")
    try:
        n = _lib.device_count(_lib.DEVICE_CUDA)
    except flashattn.FlashAttnRuntimeError as e:
        assert e.status_name == "FA_ERR_DEVICE"
        assert str(e).split("FA_ERR_DEVICE:", 1)[1].strip()
    else:
        assert n >= 0


def _view(device, index=0, dtype=_lib.DTYPE_F32):
    return _lib.Tensor.make(0x1000, dtype, (1, 4, 2, 8), (64, 16, 8, 1), device, index)


def test_one_device_per_call_is_checked_before_c():
    cpu, cuda, i32 = _lib.DEVICE_CPU, _lib.DEVICE_CUDA, _lib.DTYPE_I32
    assert _core.call_device([("q", _view(cpu)), ("k", _view(cpu))]) == (cpu, 0)
    assert _core.call_device([("q", _view(cuda, 1)), ("k", _view(cuda, 1)),
                              ("alibi_slopes", None)]) == (cuda, 1)
    with pytest.raises(RuntimeError, match=r"FA_ERR_DEVICE: k is on cpu but q is on cuda:0"):
        _core.call_device([("q", _view(cuda)), ("k", _view(cpu))])
    with pytest.raises(flashattn.FlashAttnRuntimeError,
                       match=r"v is on cuda:1 but q is on cuda:0"):
        _core.call_device([("q", _view(cuda, 0)), ("k", _view(cuda, 0)), ("v", _view(cuda, 1))])
    # cu_seqlens may stay on the host, or be on the call's device, but not on another one
    assert _core.call_device([("q", _view(cuda, 1)), ("cu_seqlens_q", _view(cpu, 0, i32)),
                              ("cu_seqlens_k", _view(cuda, 1, i32))]) == (cuda, 1)
    with pytest.raises(RuntimeError, match="cu_seqlens_k is on cuda:0 but q is on cuda:1"):
        _core.call_device([("q", _view(cuda, 1)), ("cu_seqlens_k", _view(cuda, 0, i32))])
    with pytest.raises(RuntimeError, match="out is on cpu but q is on cuda:0"):
        _core.call_device([("q", _view(cuda)), ("cu_seqlens_q", _view(cpu, 0, i32)),
                           ("out", _view(cpu))])
    with pytest.raises(flashattn.FlashAttnError) as e:
        _core.call_device([("q", _view(cpu)), ("alibi_slopes", _view(cuda))])
    assert e.value.status_name == "FA_ERR_DEVICE"


def test_fake_impls_put_outputs_on_the_input_device():
    """torch.compile traces the custom ops with fake tensors: their outputs must be on q's
    device (a fake CUDA device here needs no GPU)."""
    if torch is None:
        pytest.skip("torch is not installed")
    from flashattn.flash_attn_interface import _torch as _register

    T = _register()
    if not T.HAS_CUSTOM_OP:
        pytest.skip("torch < 2.4 has no torch.library.custom_op")
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = torch.ops.flashattn_c
    with FakeTensorMode():
        try:
            q = torch.empty(2, 16, 4, 32, device="cuda:1", dtype=torch.bfloat16)
        except Exception as e:  # pragma: no cover - depends on the torch build
            pytest.skip(f"no fake CUDA tensors in this torch: {e}")
        kv = torch.empty(2, 16, 2, 32, device="cuda:1", dtype=torch.bfloat16)
        res = ops._flash_attn_forward(q, kv, kv, 0.1, 0.2, True, -1, -1, 0.0, None, True)
        assert [tuple(r.shape) for r in res] == [(2, 16, 4, 32), (2, 4, 16), (2, 4, 16, 16),
                                                 (2,)]
        assert all(r.device == q.device for r in res)
        qv, kvv = q[0], kv[0]
        cu = torch.empty(3, dtype=torch.int32, device="cuda:1")
        res = ops._flash_attn_varlen_forward(qv, kvv, kvv, cu, cu, 9, 9, 0.0, 0.2, False)
        assert all(r.device == q.device for r in res)
        out, lse = res[0], res[1]
        rng = res[3]
        for pack, kk in ((0, kv), (2, kv), (3, q)):
            grads = ops._flash_attn_backward_grads(out, q, kk, kk, out, lse, 0.0, 0.2, True, -1,
                                                   -1, 0.0, None, rng, pack)
            assert all(g.device == q.device for g in grads)
        grads = ops._flash_attn_varlen_backward_grads(out[0], qv, kvv, kvv, out[0], lse[0], cu,
                                                      cu, 9, 9, 0.0, 0.2, False, -1, -1, 0.0,
                                                      None, rng, 0)
        assert all(g.device == q.device for g in grads)
        o, l = ops._flash_attn_with_kvcache(q, kv, kv, None, None, None, None, None, 16, None,
                                            None, None, 0.2, True, -1, -1, 0.0, True, None, 0)
        assert o.device == q.device and l.device == q.device
        out2 = flashattn.flash_attn_func(q, kv, kv, causal=True)
        assert out2.device == q.device and out2.shape == q.shape


def test_numpy_arrays_stay_on_the_cpu():
    q = np.random.default_rng(0).standard_normal((1, 5, 2, 8)).astype(np.float32)
    out = flashattn.flash_attn_func(q, q, q, causal=True)
    assert isinstance(out, np.ndarray)


# ----------------------------------------------------------------------------------------------
# On a GPU
# ----------------------------------------------------------------------------------------------

DTYPES = ["float32", "float16", "bfloat16"]


def _rel(a, ref):
    a = a.detach().float().cpu()
    ref = ref.detach().float().cpu()
    assert a.shape == ref.shape, (a.shape, ref.shape)
    if ref.numel() == 0:
        return 0.0
    assert not torch.isnan(a).any(), "NaN in the GPU result"
    return float((a - ref).abs().max()) / max(1.0, float(ref.abs().max()))


def _assert_close(gpu, cpu, dtype, what):
    e = _rel(gpu, cpu)
    assert e <= TOL[dtype], f"{what}: GPU vs CPU max rel err {e:.2e} > {TOL[dtype]:.1e} ({dtype})"


def _assert_lse(gpu, cpu, what="softmax_lse"):
    g, c = gpu.detach().double().cpu(), cpu.detach().double().cpu()
    assert g.shape == c.shape
    fin = torch.isfinite(c)
    assert torch.equal(torch.isfinite(g), fin), f"{what}: -inf rows differ between GPU and CPU"
    assert bool((g[~fin] == float("-inf")).all()), f"{what}: a fully masked row is not -inf"
    if fin.any():
        err = float((g[fin] - c[fin]).abs().max())
        assert err <= 2e-4 * max(1.0, float(c[fin].abs().max())), f"{what}: max abs err {err:.2e}"


def _randn(shape, dtype, gen, scale=1.0):
    return (scale * torch.randn(shape, generator=gen)).to(getattr(torch, dtype))


def _both(*xs):
    """(GPU copies, CPU tensors) of CPU tensors, None passed through."""
    return ([None if x is None else x.cuda() for x in xs], list(xs))


# name: (B, Sq, Sk, H, Hk, D, kwargs)
CASES = {
    "plain": (2, 97, 97, 4, 4, 64, {}),
    "causal_sq_lt_sk": (2, 113, 157, 4, 4, 128, dict(causal=True)),
    "causal_sq_gt_sk": (1, 150, 70, 2, 2, 64, dict(causal=True)),
    "window": (2, 200, 200, 4, 4, 64, dict(window_size=(32, 8))),
    "window_causal": (1, 129, 300, 4, 4, 128, dict(causal=True, window_size=(40, 0))),
    "softcap": (2, 77, 133, 4, 4, 96, dict(softcap=5.0, softmax_scale=0.5)),
    "alibi": (2, 90, 110, 4, 4, 64, dict(causal=True, alibi="h")),
    "alibi_bh": (2, 64, 64, 4, 2, 64, dict(alibi="bh")),
    "gqa": (2, 140, 140, 8, 2, 128, dict(causal=True)),
    "mqa_decode": (3, 1, 333, 8, 1, 128, dict(causal=True)),
    "long": (1, 1031, 1031, 4, 2, 128, dict(causal=True)),
    "d256": (1, 70, 90, 2, 2, 256, dict(causal=True)),
    "d32": (2, 65, 65, 3, 3, 32, {}),
    # head dims between the kernels' (zero-padded to 96 and 224) and one of the larger kernels
    "d80": (2, 130, 150, 4, 2, 80, dict(causal=True)),
    "d160": (1, 100, 140, 2, 2, 160, dict(window_size=(50, 10))),
    "d200": (2, 70, 90, 2, 1, 200, dict(causal=True, softcap=4.0)),
    "dropout": (2, 96, 120, 4, 2, 64, dict(dropout_p=0.17, causal=True)),
    "dropout_softcap": (1, 80, 80, 2, 2, 128, dict(dropout_p=0.3, softcap=3.0)),
}


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_cpu(case, dtype):
    B, Sq, Sk, H, Hk, D, kw = CASES[case]
    kw = dict(kw)
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{dtype}".encode()))
    q, k, v = (_randn(s, dtype, g) for s in ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    alibi = kw.pop("alibi", None)
    if alibi is not None:
        alibi = torch.rand((H,) if alibi == "h" else (B, H), generator=g) * 0.3
    (qg, kg, vg, ag), (qc, kc, vc, ac) = _both(q, k, v, alibi)
    seed = 1000 + len(case)
    torch.manual_seed(seed)
    og, lg, Sg = flashattn.flash_attn_func(qg, kg, vg, alibi_slopes=ag, return_attn_probs=True,
                                           **kw)
    torch.manual_seed(seed)  # the same dropout seed, hence the same mask
    oc, lc, Sc = flashattn.flash_attn_func(qc, kc, vc, alibi_slopes=ac, return_attn_probs=True,
                                           **kw)
    for t in (og, lg, Sg):
        assert t.device == qg.device
    assert og.dtype == qg.dtype and lg.dtype == torch.float32
    torch.cuda.synchronize()
    _assert_close(og, oc, dtype, f"{case} out")
    _assert_lse(lg, lc)
    if kw.get("dropout_p", 0) > 0:
        assert Sg.shape == (B, H, Sq, Sk)
        assert torch.equal(torch.signbit(Sg.cpu()), torch.signbit(Sc))


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("tile", ["128x32", "128x64"])
def test_d128_tiles_match_cpu(tile, dtype, monkeypatch):
    """FA_CUDA_TILE_D128 picks the tensor-core kernel's key block at head dim 128; both tiles
    agree with the CPU (long causal with GQA, a window, softcap with ALiBi)."""
    monkeypatch.setenv("FA_CUDA_TILE_D128", tile)
    g = torch.Generator().manual_seed(zlib.crc32(f"{tile}/{dtype}".encode()))
    for B, Sq, Sk, H, Hk, kw in ((1, 1031, 1031, 4, 2, dict(causal=True)),
                                  (2, 200, 333, 4, 4, dict(window_size=(40, 17))),
                                  (2, 150, 150, 4, 1, dict(causal=True, softcap=5.0))):
        q, k, v = (_randn(s, dtype, g) for s in ((B, Sq, H, 128), (B, Sk, Hk, 128),
                                                  (B, Sk, Hk, 128)))
        (qg, kg, vg), (qc, kc, vc) = _both(q, k, v)
        og, lg, _ = flashattn.flash_attn_func(qg, kg, vg, return_attn_probs=True, **kw)
        oc, lc, _ = flashattn.flash_attn_func(qc, kc, vc, return_attn_probs=True, **kw)
        torch.cuda.synchronize()
        _assert_close(og, oc, dtype, f"{tile} {kw} out")
        _assert_lse(lg, lc)


@needs_gpu
def test_malformed_tile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FA_CUDA_TILE_D128", "128x48")
    q = torch.randn(1, 8, 2, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(flashattn.FlashAttnValueError, match=r"FA_CUDA_TILE_D128 is \"128x48\""):
        flashattn.flash_attn_func(q, q, q)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cu_on", ["device", "host"])
def test_varlen_matches_cpu(dtype, cu_on):
    g = torch.Generator().manual_seed(7)
    H, Hk, D = 6, 2, 64
    cu_q = torch.tensor([0, 5, 5, 70, 201, 202], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 20, 20, 150, 400], dtype=torch.int32)
    lq, lk = (cu_q[1:] - cu_q[:-1]), (cu_k[1:] - cu_k[:-1])
    mq, mk = int(lq.max()), int(lk.max())
    q = _randn((int(cu_q[-1]), H, D), dtype, g)
    k = _randn((int(cu_k[-1]), Hk, D), dtype, g)
    v = _randn((int(cu_k[-1]), Hk, D), dtype, g)
    for kw in (dict(causal=True), dict(window_size=(16, 4)), dict(softcap=4.0),
               dict(dropout_p=0.2, causal=True)):
        (qg, kg, vg), _ = _both(q, k, v)
        cqg, ckg = (cu_q.cuda(), cu_k.cuda()) if cu_on == "device" else (cu_q, cu_k)
        torch.manual_seed(3)
        og, lg, _ = flashattn.flash_attn_varlen_func(qg, kg, vg, cqg, ckg, mq, mk,
                                                     return_attn_probs=True, **kw)
        torch.manual_seed(3)
        oc, lc, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk,
                                                     return_attn_probs=True, **kw)
        assert og.device == qg.device and lg.device == qg.device
        _assert_close(og, oc, dtype, f"varlen {kw} out")
        _assert_lse(lg, lc, f"varlen {kw} lse")


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_variants_match_cpu(dtype):
    g = torch.Generator().manual_seed(11)
    B, S, H, D = 2, 111, 4, 64
    qkv = _randn((B, S, 3, H, D), dtype, g)
    out_g = flashattn.flash_attn_qkvpacked_func(qkv.cuda(), causal=True)
    out_c = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    assert out_g.device.type == "cuda"
    _assert_close(out_g, out_c, dtype, "qkvpacked")

    q = _randn((B, S, H, D), dtype, g)
    kv = _randn((B, 130, 2, 2, D), dtype, g)
    _assert_close(flashattn.flash_attn_kvpacked_func(q.cuda(), kv.cuda(), causal=True),
                  flashattn.flash_attn_kvpacked_func(q, kv, causal=True), dtype, "kvpacked")

    cu = torch.tensor([0, 40, 41, 150], dtype=torch.int32)
    qkv_v = _randn((150, 3, H, D), dtype, g)
    _assert_close(flashattn.flash_attn_varlen_qkvpacked_func(qkv_v.cuda(), cu.cuda(), 109,
                                                             causal=True),
                  flashattn.flash_attn_varlen_qkvpacked_func(qkv_v, cu, 109, causal=True),
                  dtype, "varlen_qkvpacked")
    kv_v = _randn((150, 2, 2, D), dtype, g)
    _assert_close(flashattn.flash_attn_varlen_kvpacked_func(qkv_v[:, 0].cuda(), kv_v.cuda(), cu,
                                                            cu.cuda(), 109, 109),
                  flashattn.flash_attn_varlen_kvpacked_func(qkv_v[:, 0], kv_v, cu, cu, 109,
                                                            109), dtype, "varlen_kvpacked")


@needs_gpu
def test_strided_bhsd_views_match_cpu():
    """SDPA's (B, H, S, D) tensors transposed to BSHD views are read in place on the GPU too."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (_randn((2, 4, 100, 64), "float16", g) for _ in range(3))
    og = flashattn.flash_attn_func(*(t.cuda().transpose(1, 2) for t in (q, k, v)), causal=True)
    oc = flashattn.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True)
    _assert_close(og, oc, "float16", "strided")


def _capture_streams(monkeypatch):
    seen = []
    for name in ("forward", "varlen_forward", "backward", "varlen_backward"):
        orig = getattr(_lib, name)

        def wrap(p, *args, _orig=orig, **kw):
            seen.append(_lib.Params.from_buffer(p).cuda_stream or 0)
            return _orig(p, *args, **kw)

        monkeypatch.setattr(_lib, name, wrap)
    return seen


@needs_gpu
def test_outputs_on_the_input_device_and_current_stream(monkeypatch):
    seen = _capture_streams(monkeypatch)
    g = torch.Generator().manual_seed(9)
    q, k, v = (_randn((4, 512, 8, 128), "bfloat16", g) for _ in range(3))
    ref = flashattn.flash_attn_func(q, k, v, causal=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    qg, kg, vg = (t.to(dev) for t in (q, k, v))

    out = flashattn.flash_attn_func(qg, kg, vg, causal=True)
    assert seen[-1] == torch.cuda.current_stream(dev).cuda_stream
    assert out.device == dev

    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        outs = [flashattn.flash_attn_func(qg, kg, vg, causal=True) for _ in range(3)]
        cu = torch.tensor([0, 512, 1024], dtype=torch.int32, device=dev)
        ov = flashattn.flash_attn_varlen_func(qg[:2].flatten(0, 1), kg[:2].flatten(0, 1),
                                              vg[:2].flatten(0, 1), cu, cu, 512, 512,
                                              causal=True)
    assert seen[-4:] == [side.cuda_stream] * 4, (seen, side.cuda_stream)
    assert side.cuda_stream != 0
    with torch.cuda.stream(side):
        x = qg[:1, :64].clone().requires_grad_(True)
        flashattn.flash_attn_func(x, x, x, causal=True).float().sum().backward()
    assert seen[-2:] == [side.cuda_stream] * 2, (seen, side.cuda_stream)  # forward, backward
    side.synchronize()
    for o in outs:
        assert o.device == dev
        _assert_close(o, ref, "bfloat16", "out on a side stream")
    _assert_close(ov, ref[:2].flatten(0, 1), "bfloat16", "varlen on a side stream")


@needs_gpu
@pytest.mark.skipif(GPU_OK and torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device():
    g = torch.Generator().manual_seed(4)
    q, k, v = (_randn((1, 64, 2, 64), "float16", g) for _ in range(3))
    with torch.cuda.device(0):
        out = flashattn.flash_attn_func(q.to("cuda:1"), k.to("cuda:1"), v.to("cuda:1"))
    assert out.device == torch.device("cuda", 1)
    _assert_close(out, flashattn.flash_attn_func(q, k, v), "float16", "cuda:1")


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                    reason="torch sees no CUDA device")
def test_cuda_tensors_without_the_plugin_are_a_clear_error():
    """FA_CUDA_PLUGIN names the only file the library tries: a missing one is FA_ERR_DEVICE with
    the reason, from cuda_available() and from a call, never a crash."""
    import subprocess
    import sys

    code = (
        "import flashattn, torch\n"
        "ok, why = flashattn.cuda_available()\n"
        "assert not ok and 'FA_CUDA_PLUGIN' in why, why\n"
        "q = torch.randn(1, 4, 2, 8, device='cuda')\n"
        "try:\n"
        "    flashattn.flash_attn_func(q, q, q)\n"
        "except RuntimeError as e:\n"
        "    assert 'FA_ERR_DEVICE' in str(e), e\n"
        "    print('clear error:', e)\n"
        "else:\n"
        "    raise SystemExit('no error without the plug-in')\n")
    env = dict(os.environ, FA_CUDA_PLUGIN="/nonexistent/libflashattn_cuda.so",
               FLASHATTN_LIBRARY=flashattn.library_path(),
               PYTHONPATH=os.pathsep.join(
                   [os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))] +
                   [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "clear error" in r.stdout


@needs_gpu
def test_mixed_devices_are_a_clear_error():
    q = torch.randn(1, 8, 2, 16, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"FA_ERR_DEVICE: k is on cpu but q is on cuda"):
        flashattn.flash_attn_func(q, q.cpu(), q)
    with pytest.raises(RuntimeError, match=r"alibi_slopes is on cpu but q is on cuda"):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=torch.rand(2))
    qv = q[0]
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"k is on cpu"):
        flashattn.flash_attn_varlen_func(qv, qv.cpu(), qv, cu, cu, 8, 8)
    # cu_seqlens on the host is fine
    out = flashattn.flash_attn_varlen_func(qv, qv, qv, cu, cu, 8, 8)
    assert out.device == q.device
    # the KV cache: a cache on the host is refused, its int32 indices on the host are fine
    cache = torch.zeros(1, 16, 2, 16, device="cuda", dtype=torch.float16)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"v_cache is on cpu but q is on cuda"):
        flashattn.flash_attn_with_kvcache(q[:, :1], cache, cache.cpu(), cache_seqlens=lens)
    out = flashattn.flash_attn_with_kvcache(q[:, :1], cache, cache.clone(), cache_seqlens=lens)
    assert out.device == q.device


# The backward cases: the forward's grid less its longest shapes (the CPU backward of each runs
# in the same test)
BWD_CASES = [c for c in CASES if c not in ("long", "mqa_decode")]


def _grads_pair(case, dtype):
    """(GPU grads, CPU grads, GPU out) of flash_attn_func's loss sum(out * w) on the same inputs
    and dropout seed."""
    B, Sq, Sk, H, Hk, D, kw = CASES[case]
    kw = dict(kw)
    g = torch.Generator().manual_seed(zlib.crc32(f"bwd/{case}/{dtype}".encode()))
    q, k, v = (_randn(s, dtype, g) for s in ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    w = _randn((B, Sq, H, D), dtype, g)
    alibi = kw.pop("alibi", None)
    if alibi is not None:
        alibi = torch.rand((H,) if alibi == "h" else (B, H), generator=g) * 0.3
    res = []
    for dev in ("cuda", "cpu"):
        x = [t.to(dev).requires_grad_(True) for t in (q, k, v)]
        torch.manual_seed(77)  # the same dropout mask on both devices
        out = flashattn.flash_attn_func(*x, alibi_slopes=None if alibi is None else alibi.to(dev),
                                        **kw)
        (out.float() * w.to(dev).float()).sum().backward()
        res.append(([t.grad for t in x], out))
    return res[0][0], res[1][0], res[0][1]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", BWD_CASES)
def test_backward_matches_cpu(case, dtype):
    gg, gc, out = _grads_pair(case, dtype)
    for name, a, b in zip(("dq", "dk", "dv"), gg, gc):
        assert a.device == out.device and a.dtype == out.dtype, name
        _assert_close(a, b, dtype, f"{case} {name}")


@needs_gpu
def test_backward_is_deterministic():
    a, _, _ = _grads_pair("gqa", "bfloat16")
    b, _, _ = _grads_pair("gqa", "bfloat16")
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_and_packed_backward_match_cpu(dtype):
    g = torch.Generator().manual_seed(21)
    H, Hk, D = 4, 2, 64
    cu_q = torch.tensor([0, 5, 5, 70, 131], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 20, 20, 150], dtype=torch.int32)
    q = _randn((131, H, D), dtype, g)
    k, v = (_randn((150, Hk, D), dtype, g) for _ in range(2))
    qkv = _randn((2, 77, 3, H, D), dtype, g)
    grads = []
    for dev in ("cuda", "cpu"):
        x = [t.to(dev).requires_grad_(True) for t in (q, k, v)]
        torch.manual_seed(5)
        o = flashattn.flash_attn_varlen_func(*x, cu_q.to(dev), cu_k, 65, 130, causal=True,
                                             dropout_p=0.1)
        o.float().square().sum().backward()
        p = qkv.to(dev).requires_grad_(True)
        flashattn.flash_attn_qkvpacked_func(p, causal=True).float().square().sum().backward()
        grads.append([t.grad for t in x] + [p.grad])
    for name, a, b in zip(("dq", "dk", "dv", "dqkv"), *grads):
        assert a.device.type == "cuda"
        _assert_close(a, b, dtype, f"varlen/packed {name}")


@needs_gpu
def test_private_backward_on_cuda_writes_the_given_buffers():
    """flash_attn_2_cuda-style _flash_attn_backward: dq, dk, dv written in place on the GPU."""
    from flashattn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward

    g = torch.Generator().manual_seed(8)
    q, k, v, do = (_randn((1, 50, 2, 64), "float16", g).cuda() for _ in range(4))
    out, lse, _, rng = _flash_attn_forward(q, k, v, 0.0, 0.125, True, -1, 0, 0.0, None, False)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    _flash_attn_backward(do, q, k, v, out, lse, dq, dk, dv, 0.0, 0.125, True, -1, 0, 0.0, None,
                         False, rng)
    torch.cuda.synchronize()
    ref = [x.cuda() for x in _grads_cpu(q, k, v, do)]
    for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        _assert_close(a, b, "float16", name)


def _grads_cpu(q, k, v, do):
    x = [t.cpu().requires_grad_(True) for t in (q, k, v)]
    out = flashattn.flash_attn_func(*x, softmax_scale=0.125, causal=True)
    out.backward(do.cpu())
    return [t.grad for t in x]


def _rotary_tables(n, rd, dtype):
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    inv = 10000.0 ** (-torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    return torch.cos(pos * inv).to(getattr(torch, dtype)), torch.sin(pos * inv).to(
        getattr(torch, dtype))


def _paged(cache, page, block_table):
    """A (B, S, Hk, D) cache (S a multiple of page) as pages of `page` rows: page
    block_table[b, i] holds rows [i·page, (i+1)·page) of batch b; one more page, unused, NaN."""
    B, S, Hk, D = cache.shape
    pages = torch.full((B * S // page + 1, page, Hk, D), float("nan"), dtype=cache.dtype)
    pages[block_table.reshape(-1).long()] = cache.reshape(B * S // page, page, Hk, D)
    return pages


def _block_table(B, pages_per_row, gen):
    return torch.randperm(B * pages_per_row, generator=gen).reshape(B, -1).to(torch.int32)


# name: (B, Sq, H, Hk, D, S_new, kwargs); the caches hold 768 positions
KV_CASES = {
    "decode_gqa": (4, 1, 8, 2, 128, 1, dict(causal=True)),
    "decode_rotary": (3, 1, 8, 2, 64, 1, dict(causal=True, rotary="interleaved")),
    "decode_neox_leftpad": (2, 1, 4, 1, 64, 1, dict(causal=True, rotary="neox", leftpad=True)),
    "few_tokens_window": (2, 4, 8, 2, 128, 4, dict(causal=True, window_size=(64, 0))),
    "prefill": (2, 96, 4, 2, 64, 96, dict(causal=True, rotary="neox")),
    "softcap_alibi": (2, 2, 4, 2, 128, 2, dict(softcap=5.0, alibi=True)),
    "batch_idx": (2, 1, 4, 4, 64, 1, dict(batch_idx=True)),
    "no_append": (3, 1, 8, 8, 256, 0, {}),
}


def _kv_inputs(case, dtype):
    B, Sq, H, Hk, D, S_new, kw = KV_CASES[case]
    g = torch.Generator().manual_seed(zlib.crc32(f"kv/{case}/{dtype}".encode()))
    S = 768
    rows = B + 1 if kw.get("batch_idx") else B
    x = dict(q=_randn((B, Sq, H, D), dtype, g), k_cache=_randn((rows, S, Hk, D), dtype, g),
             v_cache=_randn((rows, S, Hk, D), dtype, g))
    if S_new:
        x["k"], x["v"] = _randn((B, S_new, Hk, D), dtype, g), _randn((B, S_new, Hk, D), dtype, g)
    x["cache_seqlens"] = torch.randint(S // 4, S - S_new, (B,), generator=g, dtype=torch.int32)
    if kw.get("leftpad"):
        x["cache_leftpad"] = (x["cache_seqlens"] // 3).to(torch.int32)
    if kw.get("batch_idx"):
        x["cache_batch_idx"] = torch.randperm(rows, generator=g)[:B].to(torch.int32)
    if kw.get("rotary"):
        x["rotary_cos"], x["rotary_sin"] = _rotary_tables(S, D // 2, dtype)
    if kw.get("alibi"):
        x["alibi_slopes"] = torch.rand((B, H), generator=g) * 0.3
    opts = {k: v for k, v in kw.items() if k in ("causal", "window_size", "softcap")}
    opts["rotary_interleaved"] = kw.get("rotary") != "neox"
    return x, opts, g


def _kv_call(x, opts, **more):
    out, lse = flashattn.flash_attn_with_kvcache(**x, **opts, **more, return_softmax_lse=True)
    return out, lse


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [None, 1, 3, 16, 256])
@pytest.mark.parametrize("case", list(KV_CASES))
def test_kvcache_matches_cpu(case, page, dtype):
    """flash_attn_with_kvcache on CUDA tensors, in place, against the CPU on the same inputs:
    the caches after the append equal bit for bit (the append and its rotation are the CPU's
    arithmetic), out and lse within TOL; paged caches of any page size read in place."""
    x, opts, g = _kv_inputs(case, dtype)
    if page is not None:
        if "cache_batch_idx" in x or "cache_leftpad" in x:
            pytest.skip("cache_batch_idx and cache_leftpad are for contiguous caches")
        B, S = x["k_cache"].shape[:2]
        bt = _block_table(B, S // page, g)
        x["k_cache"], x["v_cache"] = (_paged(x[n], page, bt) for n in ("k_cache", "v_cache"))
        x["block_table"] = bt
    xc = {k: v.clone() for k, v in x.items()}
    xg = {k: v.cuda() for k, v in x.items()}
    oc, lc = _kv_call(xc, opts)
    og, lg = _kv_call(xg, opts)
    assert og.device == xg["q"].device
    torch.cuda.synchronize()
    _assert_close(og, oc, dtype, f"{case} out")
    _assert_lse(lg, lc)
    for name in ("k_cache", "v_cache"):
        assert torch.equal(xg[name].cpu().view(torch.uint8), xc[name].view(torch.uint8)), name


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_kvcache_splits_are_bitwise_identical(dtype):
    """The decode's split count changes which CTAs read which chunks, not the arithmetic: out
    and lse have the same bits for num_splits 1, 2, 3, 7 and 0 (chosen from the SM count)."""
    g = torch.Generator().manual_seed(7)
    B, H, Hk, D, S = 8, 32, 8, 128, 5000
    q = _randn((B, 1, H, D), dtype, g).cuda()
    kc, vc = (_randn((B, S, Hk, D), dtype, g).cuda() for _ in range(2))
    lens = torch.randint(1, S, (B,), generator=g, dtype=torch.int32).cuda()
    res = [flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                             num_splits=n, return_softmax_lse=True)
           for n in (1, 2, 3, 7, 0)]
    for o, l in res[1:]:
        assert torch.equal(o, res[0][0]) and torch.equal(l, res[0][1])


@needs_gpu
def test_kvcache_decode_loop_on_cuda():
    """64 decode steps appending in place on the GPU (paged, pages of 16, rotary), each step's
    output against the CPU running the same loop; the caches stay equal bit for bit."""
    g = torch.Generator().manual_seed(11)
    B, H, Hk, D, S, page = 2, 8, 2, 64, 256, 16
    bt = _block_table(B, S // page, g)
    kp, vp = (_paged(_randn((B, S, Hk, D), "bfloat16", g), page, bt) for _ in range(2))
    cos, sin = _rotary_tables(S, D, "bfloat16")
    lens = torch.tensor([100, 37], dtype=torch.int32)
    cpu = dict(k_cache=kp.clone(), v_cache=vp.clone(), block_table=bt, rotary_cos=cos,
               rotary_sin=sin)
    gpu = {k: v.cuda() for k, v in cpu.items()}
    for step in range(64):
        q, k, v = (_randn((B, 1, n, D), "bfloat16", g) for n in (H, Hk, Hk))
        oc = flashattn.flash_attn_with_kvcache(q, k=k, v=v, cache_seqlens=lens + step,
                                               causal=True, **cpu)
        og = flashattn.flash_attn_with_kvcache(q.cuda(), k=k.cuda(), v=v.cuda(),
                                               cache_seqlens=(lens + step).cuda(), causal=True,
                                               **gpu)
        _assert_close(og, oc, "bfloat16", f"step {step}")
    for name in ("k_cache", "v_cache"):
        assert torch.equal(gpu[name].cpu().view(torch.uint8), cpu[name].view(torch.uint8))


@needs_gpu
def test_varlen_with_block_table_on_cuda():
    """flash_attn_varlen_func over a paged cache (block_table) on CUDA tensors = on the CPU."""
    g = torch.Generator().manual_seed(5)
    H, Hk, D, page = 4, 2, 64, 16
    lq = [3, 1, 17]
    q = _randn((sum(lq), H, D), "float16", g)
    bt = _block_table(3, 64 // page, g)
    kp, vp = (_paged(_randn((3, 64, Hk, D), "float16", g), page, bt) for _ in range(2))
    cu_q = torch.tensor([0, 3, 4, 21], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 104, 121], dtype=torch.int32)
    args = dict(max_seqlen_q=17, max_seqlen_k=64, causal=True)
    oc = flashattn.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, block_table=bt, **args)
    og = flashattn.flash_attn_varlen_func(q.cuda(), kp.cuda(), vp.cuda(), cu_q.cuda(),
                                          cu_k.cuda(), block_table=bt.cuda(), **args)
    assert og.device.type == "cuda"
    _assert_close(og, oc, "float16", "varlen paged")


@needs_gpu
def test_kvcache_under_torch_compile():
    """flash_attn_with_kvcache traced by torch.compile on CUDA tensors appends in place as in
    eager mode."""
    from flashattn.flash_attn_interface import _torch as _register

    if not _register().HAS_CUSTOM_OP:
        pytest.skip("torch < 2.4 has no torch.library.custom_op")

    def step(q, kc, vc, k, v, lens):
        return flashattn.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=lens,
                                                 causal=True) * 2

    g = torch.Generator().manual_seed(3)
    q, k, v = (_randn((2, 1, n, 64), "float16", g).cuda() for n in (8, 2, 2))
    kc, vc = (_randn((2, 128, 2, 64), "float16", g).cuda() for _ in range(2))
    lens = torch.tensor([5, 77], dtype=torch.int32, device="cuda")
    kc2, vc2 = kc.clone(), vc.clone()
    eager = step(q, kc, vc, k, v, lens)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(q, kc2, vc2, k, v, lens)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert torch.allclose(eager, compiled, rtol=2e-3, atol=2e-3)


@needs_gpu
def test_combine_on_cuda_matches_cpu():
    """flash_attn_combine on CUDA tensors (flash-attn 3's layout) = on the CPU, a masked part
    (lse -inf, NaN outputs) and a fully masked row included; on torch's current stream."""
    g = torch.Generator().manual_seed(13)
    op = torch.randn(5, 2, 33, 4, 128, generator=g)
    lp = 3 * torch.randn(5, 2, 33, 4, generator=g)
    lp[0, 0, 0, 1], op[0, 0, 0, 1] = float("-inf"), float("nan")
    lp[:, 1, 2, 3] = float("-inf")
    for dt in (None, torch.bfloat16):
        oc, lc = flashattn.flash_attn_combine(op, lp, out_dtype=dt)
        og, lg = flashattn.flash_attn_combine(op.cuda(), lp.cuda(), out_dtype=dt)
        assert og.device.type == "cuda" and og.dtype == oc.dtype and lg.shape == (2, 33, 4)
        torch.cuda.synchronize()
        _assert_close(og, oc, "float32" if dt is None else "bfloat16", "combine out")
        assert torch.equal(torch.isinf(lg.cpu()), torch.isinf(lc))
        fin = torch.isfinite(lc)
        assert (lg.cpu()[fin] - lc[fin]).abs().max() <= 1e-5 * max(1.0, lc[fin].abs().max())


@needs_gpu
def test_dropout_mask_on_cuda_is_the_cpu_mask():
    B, H, Sq, Sk = 2, 3, 77, 131
    dev = torch.device("cuda", torch.cuda.current_device())
    p = _lib.params(dropout_p=0.37, seed=0x1234ABCD5678, offset=96,
                    cuda_stream=torch.cuda.current_stream(dev).cuda_stream)
    mg = torch.full((B, H, Sq, Sk), 7, dtype=torch.uint8, device=dev)
    mc = torch.full((B, H, Sq, Sk), 7, dtype=torch.uint8)
    _lib.dropout_mask(p, _lib.Tensor.make(mg.data_ptr(), _lib.DTYPE_U8, mg.shape, mg.stride(),
                                          _lib.DEVICE_CUDA, dev.index))
    _lib.dropout_mask(p, _lib.Tensor.make(mc.data_ptr(), _lib.DTYPE_U8, mc.shape, mc.stride()))
    torch.cuda.synchronize()
    assert torch.equal(mg.cpu(), mc)
    assert 0.5 < float(mc.float().mean()) < 0.75


@needs_gpu
def test_torch_compile_on_cuda():
    """Traced through the fake implementations on CUDA tensors (aot_eager: no codegen)."""
    from flashattn.flash_attn_interface import _torch as _register

    if not _register().HAS_CUSTOM_OP:
        pytest.skip("torch < 2.4 has no torch.library.custom_op")

    def f(q, k, v):
        return flashattn.flash_attn_func(q * 2, k, v, causal=True) + 1

    q, k, v = (torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        a, b = f(q, k, v), compiled(q, k, v)
    assert b.device == q.device and b.shape == q.shape
    assert torch.allclose(a, b, rtol=2e-3, atol=2e-3)


@needs_gpu
def test_torch_compile_backward_on_cuda():
    """Training step under torch.compile on CUDA tensors: the gradients equal eager mode's (the
    backward is deterministic, and both run the same kernels)."""
    from flashattn.flash_attn_interface import _torch as _register

    if not _register().HAS_CUSTOM_OP:
        pytest.skip("torch < 2.4 has no torch.library.custom_op")

    def step(q, k, v):
        out = flashattn.flash_attn_func(q, k, v, causal=True, softcap=4.0)
        out.float().square().sum().backward()
        return q.grad, k.grad, v.grad

    g = torch.Generator().manual_seed(12)
    base = [_randn((2, 96, 4, 64), "bfloat16", g).cuda() for _ in range(3)]
    eager = step(*(t.clone().requires_grad_(True) for t in base))
    compiled = torch.compile(step, backend="aot_eager")
    got = compiled(*(t.clone().requires_grad_(True) for t in base))
    for a, b in zip(got, eager):
        assert a.device == b.device and torch.equal(a, b)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fp32_out_on_cuda(dtype):
    """The forward's fp32 out of 16-bit inputs on the GPU (the tensor-core kernel's fp32
    epilogue at D = 128, stage 1 at D = 36): rounded to the dtype it is the 16-bit out bit for
    bit, with the same lse, and it matches the CPU's fp32 out."""
    from flashattn._torch_api import TorchBackend

    g = torch.Generator().manual_seed(21)
    for D in (128, 36):
        q, k, v = (torch.randn(2, 150, 4, D, generator=g).to(getattr(torch, dtype))
                   for _ in range(3))
        args = (0.0, None, True, -1, -1, 0.0, None, False)
        o16, l16, _, _ = _core.flash_attn_forward(TorchBackend, q.cuda(), k.cuda(), v.cuda(),
                                                  *args)
        o32, l32, _, _ = _core.flash_attn_forward(TorchBackend, q.cuda(), k.cuda(), v.cuda(),
                                                  *args, out_dtype=torch.float32)
        oc, _, _, _ = _core.flash_attn_forward(TorchBackend, q, k, v, *args,
                                               out_dtype=torch.float32)
        torch.cuda.synchronize()
        assert o32.dtype == torch.float32 and o32.device.type == "cuda"
        assert torch.equal(o32.to(o16.dtype), o16) and torch.equal(l32, l16), D
        _assert_close(o32, oc, dtype, f"fp32 out, D = {D}")


@needs_gpu
def test_parallel_on_cuda_tensors():
    """flashattn.parallel on CUDA tensors, NCCL with one rank (the GPU's share of a ring: fp32
    partials, the merge, the backward): ring and all-gather attention equal flash_attn_func on
    the same GPU to rounding."""
    import socket

    import torch.distributed as dist
    from flashattn import parallel

    if not dist.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(22)
        q, k, v, dout = (torch.randn(1, 256, 4, 64, generator=g).bfloat16().cuda()
                         for _ in range(4))
        w = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref = flashattn.flash_attn_func(*w, causal=True)
        ref.backward(dout)
        for attend in (parallel.ring_attention, parallel.all_gather_attention):
            x = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out = attend(*x, causal=True)
            out.backward(dout)
            for a, b in zip([out] + [t.grad for t in x], [ref] + [t.grad for t in w]):
                _assert_close(a.detach(), b.detach(), "bfloat16", attend.__name__)
    finally:
        dist.destroy_process_group()


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_on_cuda_match_cpu(dtype):
    """learnable_sink on CUDA tensors: flash_attn_func's out and the gradients of q, k, v and
    the sinks, flash_attn_varlen_func, and a split-KV decode step, against the CPU."""
    g = torch.Generator().manual_seed(zlib.crc32(f"sinks/{dtype}".encode()))
    B, Sq, Sk, H, Hk, D = 2, 70, 90, 4, 2, 64
    q, k, v = (_randn(s, dtype, g) for s in ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    sinks = 2 * torch.randn(H, generator=g)
    w = _randn((B, Sq, H, D), dtype, g)
    res = []
    for dev in ("cuda", "cpu"):
        x = [t.to(dev).requires_grad_(True) for t in (q, k, v, sinks)]
        out = flashattn.flash_attn_func(*x[:3], causal=True, learnable_sink=x[3])
        (out.float() * w.to(dev).float()).sum().backward()
        res.append((out, [t.grad for t in x]))
    (og, gg), (oc, gc) = res
    _assert_close(og, oc, dtype, "sinks out")
    for name, a, b in zip(("dq", "dk", "dv"), gg, gc):
        _assert_close(a, b, dtype, f"sinks {name}")
    assert (gg[3].cpu() - gc[3]).abs().max() <= 2e-2 * max(1.0, gc[3].abs().max())

    cu = torch.tensor([0, 30, 70], dtype=torch.int32)
    ov = [flashattn.flash_attn_varlen_func(q[0].to(d), k[0, :70].to(d), v[0, :70].to(d),
                                           cu.to(d), cu.to(d), 40, 40, causal=True,
                                           s_aux=sinks.to(d)) for d in ("cuda", "cpu")]
    _assert_close(ov[0], ov[1], dtype, "sinks varlen")
    lens = torch.tensor([5, 90], dtype=torch.int32)
    od = [flashattn.flash_attn_with_kvcache(q[:, :1].to(d), k.to(d), v.to(d), cache_seqlens=lens,
                                            learnable_sink=sinks.to(d), num_splits=3)
          for d in ("cuda", "cpu")]
    _assert_close(od[0], od[1], dtype, "sinks decode")
