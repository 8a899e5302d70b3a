"""The four calls behind every public function, written once over an array "backend".

A backend (NumpyBackend here, TorchBackend in _torch_api.py) knows how to describe its arrays
to the C library (`view`), allocate outputs, draw dropout seeds and move data to NumPy for the
testing-only attention probabilities. The functions mirror flash-attn 2.8's private
`_flash_attn_forward`, `_flash_attn_varlen_forward`, `_flash_attn_backward` and
`_flash_attn_varlen_backward` (same arguments, same return values).
"""

import operator

import numpy as np

from . import _args, _lib, _quant
from ._lib import FlashAttnTypeError, FlashAttnValueError
from .reference import attention_ref

# ----------------------------------------------------------------------------------------------
# NumPy backend
# ----------------------------------------------------------------------------------------------

try:  # bf16 and fp8 for NumPy come from ml_dtypes when it is installed
    import ml_dtypes as _ml_dtypes

    _NP_BF16 = np.dtype(_ml_dtypes.bfloat16)
    _NP_E4M3 = np.dtype(_ml_dtypes.float8_e4m3fn)
    _NP_E5M2 = np.dtype(_ml_dtypes.float8_e5m2)
except Exception:  # pragma: no cover - depends on the environment
    _ml_dtypes = None
    _NP_BF16 = _NP_E4M3 = _NP_E5M2 = None

_NP_DTYPES = {np.dtype(np.float32): _lib.DTYPE_F32, np.dtype(np.float16): _lib.DTYPE_F16,
              np.dtype(np.int32): _lib.DTYPE_I32, np.dtype(np.uint8): _lib.DTYPE_U8,
              np.dtype(np.int8): _lib.DTYPE_I8}
if _NP_BF16 is not None:
    _NP_DTYPES[_NP_BF16] = _lib.DTYPE_BF16
    _NP_DTYPES[_NP_E4M3] = _lib.DTYPE_F8_E4M3
    _NP_DTYPES[_NP_E5M2] = _lib.DTYPE_F8_E5M2


# The index arguments: int32, as flash-attn takes them (the rest are float tensors).
INT_ARGS = frozenset({"cu_seqlens_q", "cu_seqlens_k", "cache_seqlens", "cache_batch_idx",
                      "cache_leftpad", "block_table"})


# The KV caches, which may also be 8-bit (with k_descale and v_descale).
CACHE_ARGS = frozenset({"k_cache", "v_cache"})


def wanted_dtypes(bk, name, wanted):
    """What view() names as accepted for `name`: `wanted` if given, else int32 for an index
    argument, the backend's float dtypes for the rest, and its 8-bit ones too for a cache."""
    if wanted:
        return wanted
    if name in INT_ARGS:
        return bk.int_types
    return bk.float_types + (f"; 8-bit caches: {bk.cache_types}" if name in CACHE_ARGS else "")


def _dtype_error(name, dtype, wanted):
    hint = ""
    if name in INT_ARGS and str(dtype) == "torch.int64":
        hint = f" (flash-attn takes int32 too: {name}.to(torch.int32))"
    elif name in INT_ARGS and str(dtype) == "int64":
        hint = f" (flash-attn takes int32 too: {name}.astype(np.int32))"
    elif name not in INT_ARGS and str(dtype) in ("float64", "torch.float64"):
        hint = " (flashattn computes in fp32, fp16 or bf16: cast to float32 first)"
    elif str(dtype) == "bfloat16":
        hint = " (NumPy bf16 arrays need the ml_dtypes package)"
    return FlashAttnTypeError(f"{name}: dtype {dtype} is not supported; expected {wanted}{hint}")


def _rank_check(x, name, ndims, layout):
    if not hasattr(x, "shape"):
        raise FlashAttnTypeError(f"{name}: expected a numpy.ndarray or torch.Tensor; got "
                                 f"{type(x).__name__}")
    if len(x.shape) not in ndims:
        raise FlashAttnValueError(
            f"{name}: expected a {ndims[0]}-D array {layout}; got shape {tuple(x.shape)}")


class NumpyBackend:
    """Describes numpy.ndarray to the library; outputs are new C-contiguous arrays."""

    name = "numpy"
    float_types = "float32, float16" + (", bfloat16 (ml_dtypes)" if _NP_BF16 is not None else "")
    int_types = "int32"
    cache_types = "int8" + (", float8_e4m3fn, float8_e5m2 (ml_dtypes)" if _NP_E4M3 is not None
                            else " (fp8 needs the ml_dtypes package)")

    @staticmethod
    def is_array(x):
        return isinstance(x, np.ndarray)

    @staticmethod
    def direct_output(x):
        """Whether the library can write x in place (else _gradients goes through a copy)."""
        return isinstance(x, np.ndarray) and x.flags.writeable and \
            all(s >= 0 and s % x.itemsize == 0 for s in x.strides)

    @staticmethod
    def view(x, name, wanted=None, output=False):
        """(fa_tensor, keep-alive) for x. Inputs whose strides the library cannot take (negative,
        or not a multiple of the item size) are copied first; outputs must be direct_output."""
        if not isinstance(x, np.ndarray):
            raise FlashAttnTypeError(f"{name}: expected a numpy.ndarray; got {type(x).__name__}")
        code = _NP_DTYPES.get(x.dtype)
        if code is None:
            raise _dtype_error(name, x.dtype, wanted_dtypes(NumpyBackend, name, wanted))
        if x.ndim > _lib.MAX_DIMS:
            raise FlashAttnValueError(f"{name}: {x.ndim} dimensions; at most {_lib.MAX_DIMS}")
        if output and not x.flags.writeable:
            raise FlashAttnValueError(f"{name}: the output array is read-only")
        item = x.itemsize
        if any(s < 0 or s % item for s in x.strides):
            if output:
                raise FlashAttnValueError(f"{name}: output strides {x.strides} are not "
                                          f"non-negative multiples of the item size")
            x = np.ascontiguousarray(x)
        t = _lib.Tensor.make(x.ctypes.data if x.size else None, code, x.shape,
                             [s // item for s in x.strides])
        return t, x

    @staticmethod
    def empty(shape, like, dtype=None):
        dt = {None: like.dtype, "f32": np.float32, "i64": np.int64}[dtype]
        return np.empty(shape, dtype=dt)

    @staticmethod
    def zeros(shape, like, dtype=None):
        dt = {None: like.dtype, "f32": np.float32}[dtype]
        return np.zeros(shape, dtype=dt)

    @staticmethod
    def full(shape, value, like, dtype=None):
        dt = {None: like.dtype, "f32": np.float32}[dtype]
        return np.full(shape, value, dtype=dt)

    @staticmethod
    def cuda_stream(index):
        return None  # NumPy arrays live on the CPU

    @staticmethod
    def draw_seed():
        # NumPy's global generator, so np.random.seed() makes dropout reproducible.
        return int(np.random.randint(0, 2 ** 63 - 1, dtype=np.int64))

    @staticmethod
    def rng_state(seed, offset, like):
        return np.array([seed, offset], dtype=np.int64)

    @staticmethod
    def rng_values(rng):
        r = np.asarray(rng).astype(np.int64).reshape(-1)
        return int(r[0]) & 0xFFFFFFFFFFFFFFFF, int(r[1]) & 0xFFFFFFFFFFFFFFFF

    @staticmethod
    def to_numpy(x):
        return np.asarray(x)

    @staticmethod
    def from_numpy(a, like, dtype=None):
        return np.ascontiguousarray(a, dtype=like.dtype if dtype is None else dtype)

    @staticmethod
    def ints(x):
        return [int(i) for i in np.asarray(x).reshape(-1)]

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)

    @staticmethod
    def softmax_d(dout, out, varlen):
        # rowsum(dO ∘ O) in fp32: (B, H, Sq), varlen (H, total_q). flash-attn returns it too.
        d = np.einsum("...hd,...hd->...h", dout.astype(np.float32), out.astype(np.float32))
        return np.ascontiguousarray(np.moveaxis(d, -1, -2) if not varlen else d.T)


# ----------------------------------------------------------------------------------------------
# Argument normalization shared by every path (flash-attn's conventions → the C library's)
# ----------------------------------------------------------------------------------------------

def norm_window(left, right):
    """flash-attn treats any negative window side as unbounded; the C library wants -1. Checked
    as int32 (_args.window_side)."""
    return (_args.window_side(left, "window_size_left"),
            _args.window_side(right, "window_size_right"))


def norm_softcap(softcap):
    """flash-attn: softcap <= 0 means off; the C library wants exactly 0 (_args.softcap refuses
    NaN, inf and values fp32 cannot hold)."""
    softcap = _args.softcap(softcap)
    return 0.0 if softcap <= 0.0 else softcap


def _scalars(dropout_p, softmax_scale, causal, wl, wr, softcap):
    """The attention scalars of a call, checked (_args) and normalized for the C library:
    (dropout_p, softmax_scale, causal, window_left, window_right, softcap)."""
    dropout_p, softmax_scale, causal, _ = _args.attention(dropout_p, softmax_scale, causal, 0.0)
    wl, wr = norm_window(wl, wr)
    return dropout_p, softmax_scale, causal, wl, wr, norm_softcap(softcap)


def _work(q, keys):
    """A bound on the multiply-adds of q·kᵀ for q (.., Sq, H, D) or varlen (total_q, H, D)
    against at most `keys` keys per query: how long a call may run (_lib: whether Ctrl-C must
    be able to stop it)."""
    n = int(keys)
    for d in q.shape:
        n *= int(d)
    return n


def _dev(t):
    return (int(t.device), int(t.device_index) if t.device != _lib.DEVICE_CPU else 0)


def _device_name(t):
    return "cpu" if t.device == _lib.DEVICE_CPU else f"cuda:{t.device_index}"


# Tensors that may stay on the host when the others are on a CUDA device (the C library reads
# them there either way).
_HOST_OK = ("cu_seqlens_q", "cu_seqlens_k", "cache_seqlens", "cache_batch_idx", "cache_leftpad",
            "block_table")


def call_device(named):
    """(device, device_index) of a call whose tensors are named = [(name, Tensor or None)]:
    every tensor must be on one device, except cu_seqlens, which may also be on the CPU.
    Checked here, before the C call, so the error names the tensors."""
    present = [(n, t) for n, t in named if t is not None]
    if all(t.device == _lib.DEVICE_CPU for _, t in present):  # the common case, in one pass
        return _lib.DEVICE_CPU, 0
    main = next(((n, t) for n, t in present if n not in _HOST_OK), None)
    if main is None:
        return _lib.DEVICE_CPU, 0
    for name, t in present:
        if _dev(t) == _dev(main[1]):
            continue
        host_ok = name in _HOST_OK
        if host_ok and t.device == _lib.DEVICE_CPU:
            continue
        raise _device_error(name, t, main, host_ok)
    return _dev(main[1])


def _device_error(name, t, main, host_ok=False):
    extra = " or on the CPU" if host_ok else " (int32 indices may also be on the CPU)"
    return _lib.FlashAttnRuntimeError(
        f"flashattn: FA_ERR_DEVICE: {name} is on {_device_name(t)} but {main[0]} is on "
        f"{_device_name(main[1])}; every tensor of a call must be on one device{extra}",
        status=-8, status_name="FA_ERR_DEVICE")


def _params(bk, dropout_p, softmax_scale, causal, wl, wr, softcap, alibi_slopes, seed, offset,
            keep, named=(), sinks=None, dsinks=None):
    """fa_params for a call whose tensors are named = [(name, Tensor)]: checks that they,
    alibi_slopes and the sinks share one device and, on CUDA, passes the backend's current
    stream. The scalars are _scalars' (checked); sinks and dsinks are fp32 (H) arrays or None
    (check_sinks)."""
    extra = []
    for name, x, out in (("alibi_slopes", alibi_slopes, False), ("learnable_sink", sinks, False),
                         ("dsinks", dsinks, True)):
        t = None
        if x is not None:
            t, a = bk.view(x, name, "float32", output=True) if out else \
                bk.view(x, name, "float32")
            keep.append(a)
        extra.append((name, t))
    dev, idx = call_device(list(named) + extra)
    stream = bk.cuda_stream(idx) if dev == _lib.DEVICE_CUDA else None
    return _lib.params(softmax_scale=softmax_scale, causal=causal, window_left=wl,
                       window_right=wr, softcap=softcap, alibi=extra[0][1], dropout_p=dropout_p,
                       seed=seed, offset=offset, cuda_stream=stream, sinks=extra[1][1],
                       dsinks=extra[2][1])


def check_sinks(sinks, H):
    """learnable_sink (flash-attn's name; s_aux in vLLM's and transformers') as the library
    takes it: None, or a (nheads,) array of one sink logit per query head. Its dtype is the
    caller's to convert (the public functions make it fp32)."""
    if sinks is None:
        return None
    _rank_check(sinks, "learnable_sink", (1,), "(nheads,)")
    if sinks.shape[0] != H:
        raise FlashAttnValueError(f"learnable_sink: shape ({sinks.shape[0]},); expected "
                                  f"(nheads,) = ({H},), one sink per query head")
    return sinks


def _views(bk, names_arrays, output=False):
    keep, views = [], []
    for name, x in names_arrays:
        t, k = bk.view(x, name, output=output) if output else bk.view(x, name)
        views.append(t)
        keep.append(k)
    return views, keep


def _named(names, views):
    return list(zip(names, views))


def _probs_dmask(bk, q, k, cu_q, cu_k, max_q, max_k, p, dropout_p, softmax_scale,
                 causal, wl, wr, softcap, alibi_slopes, seed, offset, sinks=None):
    """S_dmask for return_attn_probs: the softmax probabilities (before dropout's 1/(1-p)), from
    the fp64 reference, negated where the library's dropout mask drops them. Shape (B, H, Sq, Sk),
    varlen (B, H, max_seqlen_q, max_seqlen_k) with sequence b in [:Sq_b, :Sk_b]."""
    wl, wr = norm_window(wl, wr)
    sc = norm_softcap(softcap)
    qn = bk.to_numpy(q).astype(np.float64)
    kn = bk.to_numpy(k).astype(np.float64)
    an = None if alibi_slopes is None else bk.to_numpy(alibi_slopes).astype(np.float64)
    sn = None if sinks is None else bk.to_numpy(sinks).astype(np.float64)
    H = qn.shape[-2]
    if cu_q is None:
        B, Sq, Sk = qn.shape[0], qn.shape[1], kn.shape[1]  # v does not enter the probabilities
        _, _, probs = attention_ref(qn, kn, kn, softmax_scale, causal, (wl, wr), sc, an,
                                    sinks=sn)
    else:
        cq, ck = bk.ints(cu_q), bk.ints(cu_k)
        B, Sq, Sk = len(cq) - 1, int(max_q), int(max_k)
        probs = np.zeros((B, H, Sq, Sk))
        for b in range(B):
            slopes = None if an is None else (an[b] if an.ndim == 2 else an)
            _, _, pb = attention_ref(qn[None, cq[b]:cq[b + 1]], kn[None, ck[b]:ck[b + 1]],
                                     kn[None, ck[b]:ck[b + 1]], softmax_scale, causal, (wl, wr),
                                     sc, slopes, sinks=sn)
            probs[b, :, :pb.shape[2], :pb.shape[3]] = pb[0]
    mask = np.empty((B, H, Sq, Sk), dtype=np.uint8)
    _lib.dropout_mask(p, _lib.Tensor.make(mask.ctypes.data if mask.size else None,
                                          _lib.DTYPE_U8, mask.shape,
                                          [s for s in mask.strides]))
    s = np.where(mask.astype(bool), probs, -probs)
    return bk.from_numpy(s, like=q)


# ----------------------------------------------------------------------------------------------
# The four calls
# ----------------------------------------------------------------------------------------------

def _seed(bk, dropout_p):
    return (bk.draw_seed(), 0) if dropout_p > 0 else (0, 0)


def _out_dtype(bk, q, out_dtype):
    """The forward's out as bk.empty's dtype argument: None (q's dtype) or "f32". out_dtype (an
    internal keyword) may be None, q's dtype, or the backend's float32 for fp16/bf16 q: the fp32
    accumulator's result unrounded, for partial results that flash_attn_combine merges."""
    if out_dtype is None or out_dtype == q.dtype:
        return None
    f32 = bk.empty((0,), like=q, dtype="f32").dtype
    if out_dtype == f32:  # q is fp16 or bf16 here (an fp32 q equals out_dtype above)
        return "f32"
    raise FlashAttnTypeError(f"out_dtype: {out_dtype}; expected None, q's dtype ({q.dtype}) or "
                             f"{f32} for fp16/bf16 q")


def flash_attn_forward(bk, q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                       window_size_right, softcap, alibi_slopes, return_softmax, out_dtype=None,
                       sinks=None):
    """→ (out, softmax_lse, S_dmask, rng_state); S_dmask is empty unless return_softmax. out is
    of q's dtype, or fp32 for fp16/bf16 q with out_dtype float32 (see _out_dtype). sinks: fp32
    (H) or None (check_sinks)."""
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _scalars(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    return_softmax = _args.boolean("return_softmax", return_softmax)
    _rank_check(q, "q", (4,), "(batch, seqlen_q, nheads, headdim)")
    _rank_check(k, "k", (4,), "(batch, seqlen_k, nheads_k, headdim)")
    _rank_check(v, "v", (4,), "(batch, seqlen_k, nheads_k, headdim_v)")
    B, Sq, H, _ = q.shape
    sinks = check_sinks(sinks, H)
    out = bk.empty((B, Sq, H, v.shape[3]), like=q, dtype=_out_dtype(bk, q, out_dtype))
    lse = bk.empty((B, H, Sq), like=q, dtype="f32")
    seed, offset = _seed(bk, dropout_p)
    names = ("q", "k", "v", "out", "softmax_lse")
    views, keep = _views(bk, list(zip(names, (q, k, v, out, lse))))
    p = _params(bk, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                softcap, alibi_slopes, seed, offset, keep, _named(names, views), sinks)
    _lib.forward(p, *views, work=_work(q, k.shape[1]), keep=keep)
    if return_softmax:
        S = _probs_dmask(bk, q, k, None, None, None, None, p, dropout_p, softmax_scale,
                         causal, window_size_left, window_size_right, softcap, alibi_slopes,
                         seed, offset, sinks)
    else:
        S = bk.empty((0,), like=q)
    return out, lse, S, bk.rng_state(seed, offset, like=q)


def flash_attn_varlen_forward(bk, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, dropout_p, softmax_scale, causal,
                              window_size_left=-1, window_size_right=-1, softcap=0.0,
                              alibi_slopes=None, return_softmax=False, block_table=None,
                              leftpad_k=None, seqused_k=None, out_dtype=None, sinks=None):
    """→ (out (total_q, H, Dv), softmax_lse (H, total_q), S_dmask, rng_state); out_dtype and
    sinks as flash_attn_forward's (out_dtype not with block_table)."""
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _scalars(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    max_seqlen_q = _args.seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _args.seqlen(max_seqlen_k, "max_seqlen_k")
    return_softmax = _args.boolean("return_softmax", return_softmax)
    if leftpad_k is not None or seqused_k is not None:
        raise NotImplementedError("flashattn: leftpad_k and seqused_k (arguments of flash-attn's "
                                  "private varlen forward) are not supported")
    if block_table is not None:
        if out_dtype is not None and out_dtype != getattr(q, "dtype", out_dtype):
            raise FlashAttnValueError("out_dtype: a paged KV cache (block_table) writes out in "
                                      "q's dtype; expected None")
        return _varlen_paged_forward(bk, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, dropout_p, softmax_scale, causal,
                                     window_size_left, window_size_right, softcap, alibi_slopes,
                                     return_softmax, block_table, sinks)
    _rank_check(q, "q", (3,), "(total_q, nheads, headdim)")
    _rank_check(k, "k", (3,), "(total_k, nheads_k, headdim)")
    _rank_check(v, "v", (3,), "(total_k, nheads_k, headdim_v)")
    Tq, H, _ = q.shape
    sinks = check_sinks(sinks, H)
    out = bk.empty((Tq, H, v.shape[2]), like=q, dtype=_out_dtype(bk, q, out_dtype))
    lse = bk.empty((H, Tq), like=q, dtype="f32")
    seed, offset = _seed(bk, dropout_p)
    names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "out", "softmax_lse")
    views, keep = _views(bk, list(zip(names, (q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse))))
    tq, tk, tv, tcq, tck, to, tl = views
    p = _params(bk, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                softcap, alibi_slopes, seed, offset, keep, _named(names, views), sinks)
    _lib.varlen_forward(p, tq, tk, tv, tcq, tck, max_seqlen_q, max_seqlen_k, to, tl,
                        work=_work(q, min(k.shape[0], max_seqlen_k)), keep=keep)
    if return_softmax:
        S = _probs_dmask(bk, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         p, dropout_p, softmax_scale, causal, window_size_left,
                         window_size_right, softcap, alibi_slopes, seed, offset, sinks)
    else:
        S = bk.empty((0,), like=q)
    return out, lse, S, bk.rng_state(seed, offset, like=q)


def _bwd_prologue(bk, q, k, v, dq, dk, dv, dropout_p, rng_state):
    dq = bk.empty(tuple(q.shape), like=q) if dq is None else dq
    dk = bk.empty(tuple(k.shape), like=k) if dk is None else dk
    dv = bk.empty(tuple(v.shape), like=v) if dv is None else dv
    if dropout_p > 0:
        if rng_state is None:
            raise FlashAttnValueError(
                "rng_state: None, but dropout_p > 0: pass the rng_state the forward returned")
        seed, offset = bk.rng_values(rng_state)
    else:
        seed, offset = 0, 0
    return dq, dk, dv, seed, offset


def _gradients(bk, call, dq, dk, dv):
    """Runs call(dq, dk, dv) (views of the three outputs). The library refuses outputs whose
    address ranges interleave or touch an input (FA_ERR_OVERLAP), which happens legitimately
    when dq, dk and dv are views of one packed gradient buffer (torch.compile's inductor lays
    out the gradient of an unbind/stack that way): then compute into fresh arrays and copy."""
    if all(bk.direct_output(x) for x in (dq, dk, dv)):
        try:
            return call(dq, dk, dv)
        except FlashAttnValueError as e:
            if e.status_name != "FA_ERR_OVERLAP":
                raise
    tmp = [bk.empty(tuple(x.shape), like=x) for x in (dq, dk, dv)]
    call(*tmp)
    for dst, src in zip((dq, dk, dv), tmp):
        bk.copy(dst, src)


def flash_attn_backward(bk, dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                        softmax_scale, causal, window_size_left, window_size_right, softcap,
                        alibi_slopes, deterministic, rng_state=None, sinks=None, dsinks=None):
    """Writes dq, dk, dv (allocated if None) and returns softmax_d = rowsum(dout ∘ out), fp32
    (B, H, Sq). The backward is always deterministic; `deterministic` is accepted and ignored.
    sinks: the forward's, fp32 (H) or None; dsinks: an fp32 (H) array the sinks' gradient is
    written to, or None."""
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _scalars(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    _args.boolean("deterministic", deterministic)
    _rank_check(q, "q", (4,), "(batch, seqlen_q, nheads, headdim)")
    sinks = check_sinks(sinks, q.shape[2])
    dq, dk, dv, seed, offset = _bwd_prologue(bk, q, k, v, dq, dk, dv, dropout_p, rng_state)
    names = ("q", "k", "v", "out", "dout", "softmax_lse")
    views, keep = _views(bk, list(zip(names, (q, k, v, out, dout, softmax_lse))))
    p = _params(bk, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                softcap, alibi_slopes, seed, offset, keep, _named(names, views), sinks, dsinks)

    def call(dq_, dk_, dv_):
        grads, _keep = _views(bk, [("dq", dq_), ("dk", dk_), ("dv", dv_)], output=True)
        call_device(_named(names, views) + _named(("dq", "dk", "dv"), grads))
        _lib.backward(p, *views, *grads, work=_work(q, k.shape[1]), keep=(keep, _keep))

    _gradients(bk, call, dq, dk, dv)
    return bk.softmax_d(dout, out, varlen=False)


def flash_attn_varlen_backward(bk, dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                               cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left, window_size_right,
                               softcap, alibi_slopes, deterministic, rng_state=None, sinks=None,
                               dsinks=None):
    """Varlen flash_attn_backward; softmax_d is (H, total_q)."""
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _scalars(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    max_seqlen_q = _args.seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _args.seqlen(max_seqlen_k, "max_seqlen_k")
    _args.boolean("deterministic", deterministic)
    _rank_check(q, "q", (3,), "(total_q, nheads, headdim)")
    sinks = check_sinks(sinks, q.shape[1])
    dq, dk, dv, seed, offset = _bwd_prologue(bk, q, k, v, dq, dk, dv, dropout_p, rng_state)
    names = ("q", "k", "v", "out", "dout", "softmax_lse", "cu_seqlens_q", "cu_seqlens_k")
    views, keep = _views(bk, list(zip(names, (q, k, v, out, dout, softmax_lse, cu_seqlens_q,
                                              cu_seqlens_k))))
    tq, tk, tv, to, tdo, tl, tcq, tck = views
    p = _params(bk, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                softcap, alibi_slopes, seed, offset, keep, _named(names, views), sinks, dsinks)

    def call(dq_, dk_, dv_):
        (tdq, tdk, tdv), _keep = _views(bk, [("dq", dq_), ("dk", dk_), ("dv", dv_)],
                                        output=True)
        call_device(_named(names, views) + [("dq", tdq), ("dk", tdk), ("dv", tdv)])
        _lib.varlen_backward(p, tq, tk, tv, to, tdo, tl, tcq, tck, max_seqlen_q, max_seqlen_k,
                             tdq, tdk, tdv, work=_work(q, min(k.shape[0], max_seqlen_k)),
                             keep=(keep, _keep))

    _gradients(bk, call, dq, dk, dv)
    return bk.softmax_d(dout, out, varlen=True)


def dropout_mask_for(bk, shape, dropout_p, rng_state):
    """The (B, H, Sq, Sk) uint8 keep mask (1 = kept) that a forward with this dropout_p and
    rng_state used, as a NumPy array."""
    seed, offset = bk.rng_values(rng_state)
    mask = np.empty(tuple(int(s) for s in shape), dtype=np.uint8)
    p = _lib.params(dropout_p=_args.dropout_p(dropout_p), seed=seed, offset=offset)
    _lib.dropout_mask(p, _lib.Tensor.make(mask.ctypes.data if mask.size else None,
                                          _lib.DTYPE_U8, mask.shape, list(mask.strides)))
    return mask


def seqlen_int(x):
    """cache_seqlens given as one number (a Python or NumPy integer, not a bool) -> int64 >= 0,
    so that a float is not truncated and a negative length is not taken for "the whole
    cache"."""
    n = None
    if not isinstance(x, (bool, np.bool_)):
        try:
            n = operator.index(x)
        except TypeError:
            pass
    if n is None:
        raise FlashAttnTypeError(f"cache_seqlens: expected an int or a (batch,) int32 array; got "
                                 f"{type(x).__name__}")
    if n < 0:
        raise FlashAttnValueError(f"cache_seqlens is {n}; expected >= 0 (None: the whole cache)")
    return _args.seqlen(n, "cache_seqlens")  # and within the C field (int64)


def no_q_descale(q_descale):
    """flash-attn 3's q_descale goes with an fp8 q, which the library does not take."""
    if q_descale is not None:
        raise FlashAttnValueError(
            "flashattn: FA_ERR_UNSUPPORTED: q_descale: not supported: q stays float32, float16 "
            "or bfloat16 (only the KV cache may be 8-bit, with k_descale and v_descale); pass q "
            "dequantized and q_descale=None",
            status=-11, status_name="FA_ERR_UNSUPPORTED")


def _descale_views(bk, fields, k_cache, k_descale, v_descale, append, put):
    """k_descale/v_descale into fields as kv.k_scale/v_scale: given with 8-bit caches (the
    library checks shapes, dtype and values), absent otherwise. Per-token ones (3-D) are written
    by an append, so they must be writable in place like the caches."""
    q8 = fields["k_cache"].dtype in _lib.DTYPES_8BIT
    for name, x in (("k_descale", k_descale), ("v_descale", v_descale)):
        if q8 and x is None:
            raise FlashAttnValueError(
                f"flashattn: FA_ERR_NULL_POINTER: {name}: None, but k_cache is {k_cache.dtype}; "
                f"8-bit caches need k_descale and v_descale, float32 (batch_size, nheads_k) or "
                f"per token (batch_size_cache, seqlen_cache, nheads_k)", status=-1,
                status_name="FA_ERR_NULL_POINTER")
        if not q8 and x is not None:
            raise FlashAttnValueError(
                f"flashattn: FA_ERR_VALUE: {name}: given, but k_cache is {k_cache.dtype}; "
                f"descales go with 8-bit caches (int8, float8_e4m3fn, float8_e5m2)", status=-7,
                status_name="FA_ERR_VALUE")
        if x is None:
            continue
        written = append and len(getattr(x, "shape", ())) == 3
        if written and not bk.direct_output(x):
            raise FlashAttnValueError(f"{name}: per-token descales are written in place by the "
                                      f"append, so it must be a writable array with "
                                      f"non-negative strides")
        put(name[0] + "_scale", x, output=written, label=name,
            wanted="float32" if bk.name == "numpy" else "torch.float32")


def flash_attn_with_kvcache(bk, q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, sinks=None, k_descale=None,
                            v_descale=None):
    """→ (out, softmax_lse) through fa_forward_kvcache; k/v (if given) are appended to
    k_cache/v_cache in place first. cache_seqlens: None, an int >= 0 (seqlen_int), or a (B,)
    int32 array. sinks: fp32 (H) or None. k_descale/v_descale: the fp32 scales of 8-bit caches
    (value = stored * descale): (B, Hk), or per token (B_cache, S_cache, Hk) / paged
    (num_pages, page_size, Hk), which an append writes in place.
    softmax_lse is None unless return_softmax_lse (the library then writes none)."""
    wl, wr = _args.window(window_size)
    _, softmax_scale, causal, softcap = _args.attention(0.0, softmax_scale, causal, softcap)
    rotary_interleaved = _args.boolean("rotary_interleaved", rotary_interleaved)
    num_splits = _args.integer("num_splits", num_splits, _args.INT32_MIN, _args.INT32_MAX)
    return_softmax_lse = _args.boolean("return_softmax_lse", return_softmax_lse)
    _rank_check(q, "q", (4,), "(batch, seqlen_q, nheads, headdim)")
    _rank_check(k_cache, "k_cache", (4,),
                "(batch_cache, seqlen_cache, nheads_k, headdim) or paged (num_blocks, "
                "page_block_size, nheads_k, headdim)")
    _rank_check(v_cache, "v_cache", (4,),
                "(batch_cache, seqlen_cache, nheads_k, headdim_v) or paged (num_blocks, "
                "page_block_size, nheads_k, headdim_v)")
    B, Sq, H, _ = q.shape
    sinks = check_sinks(sinks, H)
    out = bk.empty((B, Sq, H, v_cache.shape[3]), like=q)
    lse = bk.empty((B, H, Sq), like=q, dtype="f32") if return_softmax_lse else None
    append = k is not None or v is not None
    fields, keep = {}, []

    def put(name, x, output=False, label=None, wanted=None):
        if x is None:
            return
        t, kp = bk.view(x, label or name, wanted, output)
        fields[name] = t
        keep.append(kp)

    if append and not all(bk.direct_output(x) for x in (k_cache, v_cache)):
        raise FlashAttnValueError("k_cache, v_cache: written in place, so they must be writable "
                                  "arrays with non-negative strides")
    put("k_cache", k_cache, output=append)
    put("v_cache", v_cache, output=append)
    _descale_views(bk, fields, k_cache, k_descale, v_descale, append, put)
    names = {"k": "k_new", "v": "v_new"}
    for nm, x in (("k", k), ("v", v)):
        if x is not None:
            t, kp = bk.view(x, nm)
            fields[names[nm]] = t
            keep.append(kp)
    if cache_seqlens is not None and not isinstance(cache_seqlens, np.ndarray) and \
            not hasattr(cache_seqlens, "__dlpack__"):  # one length for every row
        fields["cache_seqlen"] = seqlen_int(cache_seqlens)
    else:
        put("cache_seqlens", cache_seqlens)
    put("cache_batch_idx", cache_batch_idx)
    put("cache_leftpad", cache_leftpad)
    put("block_table", block_table)
    put("rotary_cos", rotary_cos)
    put("rotary_sin", rotary_sin)
    fields["rotary_interleaved"] = 1 if rotary_interleaved else 0
    fields["num_splits"] = num_splits
    kv = _lib.kvcache(fields)
    (tq, to), keep2 = _views(bk, [("q", q), ("out", out)])
    tl = None
    if lse is not None:
        tl, kl = bk.view(lse, "softmax_lse")
        keep2.append(kl)
    named = [("q", tq), ("out", to), ("softmax_lse", tl)]
    named += [(n, t) for n, t in fields.items() if isinstance(t, _lib.Tensor)]
    p = _params(bk, 0.0, softmax_scale, causal, wl, wr, norm_softcap(softcap), alibi_slopes, 0,
                0, keep2, named, sinks)
    keys = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])  # per row
    _lib.forward_kvcache(p, tq, kv, to, tl, work=_work(q, keys), keep=(keep, keep2))
    return out, lse


def _stride0(x):
    """The element stride of x's first dimension (numpy.ndarray or torch.Tensor)."""
    return x.stride(0) if callable(getattr(x, "stride", None)) else x.strides[0] // x.itemsize


def flash_attn_combine(bk, out_partial, lse_partial, out=None):
    """→ (out, softmax_lse) through fa_combine: flash-attn 3's flash_attn_combine. out_partial
    (num_splits, batch, seqlen, nheads, headdim) and lse_partial (num_splits, batch, seqlen,
    nheads), both fp32; out (batch, seqlen, nheads, headdim), fp32 when not given (the caller
    makes one of another dtype); softmax_lse (batch, seqlen, nheads), a view of (batch, nheads,
    seqlen) storage as flash-attn 3 returns it."""
    _rank_check(out_partial, "out_partial", (5,),
                "(num_splits, batch_size, seqlen, nheads, headdim)")
    _rank_check(lse_partial, "lse_partial", (4,), "(num_splits, batch_size, seqlen, nheads)")
    n, B, S, H, D = out_partial.shape
    if n < 1:
        raise FlashAttnValueError("out_partial: num_splits (shape[0]) is 0; expected >= 1 "
                                  "partial result")
    if tuple(lse_partial.shape) != (n, B, S, H):
        raise FlashAttnValueError(f"lse_partial: shape {tuple(lse_partial.shape)}; expected "
                                  f"{(n, B, S, H)} (num_splits, batch_size, seqlen, nheads)")
    # the library reads part i at part 0 + i·stride(0): NumPy strides it cannot take (negative,
    # not a multiple of the item size) would make bk.view copy part 0 alone, so copy it all
    out_partial, lse_partial = (np.ascontiguousarray(x) if isinstance(x, np.ndarray) and any(
        s < 0 or s % x.itemsize for s in x.strides) else x for x in (out_partial, lse_partial))
    if out is None:
        out = bk.empty((B, S, H, D), like=out_partial, dtype="f32")
    lse = bk.empty((B, H, S), like=out_partial, dtype="f32")
    lse = lse.transpose(0, 2, 1) if bk.name == "numpy" else lse.transpose(1, 2)
    (op, lp), keep = _views(bk, [("out_partial", out_partial[0]),
                                 ("lse_partial", lse_partial[0])])
    (to, tl), keep2 = _views(bk, [("out", out), ("softmax_lse", lse)], output=True)
    p = _params(bk, 0.0, 1.0, False, -1, -1, 0.0, None, 0, 0, keep,
                [("out_partial", op), ("lse_partial", lp), ("out", to), ("softmax_lse", tl)])
    _lib.combine(p, n, op, _stride0(out_partial), lp, _stride0(lse_partial), to, tl,
                 work=n * B * S * H * D, keep=(keep, keep2))
    return out, lse


def _varlen_paged_forward(bk, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                          softcap, alibi_slopes, return_softmax, block_table, sinks=None):
    """flash_attn_varlen_func with a paged KV cache: k/v (num_blocks, page_block_size, Hk, D),
    block_table (B, max_blocks_per_seq) int32; sequence b's keys are its first
    cu_seqlens_k[b+1] - cu_seqlens_k[b] positions in its pages. One fa_forward_kvcache call per
    sequence (forward only, no dropout, as the library's KV-cache path). The scalars are
    checked (flash_attn_varlen_forward)."""
    if dropout_p > 0:
        raise FlashAttnValueError("dropout_p: the paged KV cache (block_table) has no dropout")
    for name, x in (("k", k), ("v", v)):
        if _quant.format_of(getattr(x, "dtype", None)) is not None:
            raise FlashAttnTypeError(
                f"flashattn: FA_ERR_DTYPE: {name}: dtype {x.dtype}: flash_attn_varlen_func "
                f"takes no 8-bit cache (it has no descales); use flash_attn_with_kvcache(..., "
                f"block_table=..., k_descale=..., v_descale=...) for an int8 or fp8 paged cache",
                status=-4, status_name="FA_ERR_DTYPE")
    _rank_check(q, "q", (3,), "(total_q, nheads, headdim)")
    _rank_check(block_table, "block_table", (2,), "(batch_size, max_blocks_per_seq)")
    _rank_check(v, "v_cache", (4,), "(num_blocks, page_block_size, nheads_k, headdim_v)")
    Tq, H, _ = q.shape
    cq, ck = bk.ints(cu_seqlens_q), bk.ints(cu_seqlens_k)
    if len(cq) != len(ck) or len(cq) < 1:
        raise FlashAttnValueError(f"cu_seqlens_q and cu_seqlens_k: shapes ({len(cq)},) and "
                                  f"({len(ck)},); expected (batch_size + 1,) both")
    B = len(cq) - 1
    if block_table.shape[0] != B:
        raise FlashAttnValueError(f"block_table: shape[0] is {block_table.shape[0]}; expected "
                                  f"batch_size = {B}")
    for name, cu, total, mx in (("cu_seqlens_q", cq, Tq, max_seqlen_q),
                                ("cu_seqlens_k", ck, None, max_seqlen_k)):
        for b in range(B):
            if cu[b] < 0 or cu[b + 1] < cu[b] or (total is not None and cu[b + 1] > total):
                raise FlashAttnValueError(f"{name}: offsets {cu} must start >= 0, never decrease "
                                          f"and end within the rows")
            if cu[b + 1] - cu[b] > mx:
                raise FlashAttnValueError(f"{name}: sequence {b} has length {cu[b + 1] - cu[b]}, "
                                          f"more than its max_seqlen {mx}")
    out = bk.zeros((Tq, H, v.shape[3]), like=q)
    lse = bk.full((H, Tq), float("-inf"), like=q, dtype="f32")
    for b in range(B):
        qs, qe = cq[b], cq[b + 1]
        slopes = alibi_slopes
        if alibi_slopes is not None and len(alibi_slopes.shape) == 2:
            slopes = alibi_slopes[b]
        o_b, l_b = flash_attn_with_kvcache(
            bk, q[qs:qe][None], k, v, cache_seqlens=ck[b + 1] - ck[b],
            block_table=block_table[b:b + 1], softmax_scale=softmax_scale, causal=causal,
            window_size=(window_size_left, window_size_right), softcap=softcap,
            alibi_slopes=slopes, return_softmax_lse=True, sinks=sinks)
        bk.copy(out[qs:qe], o_b[0])
        bk.copy(lse[:, qs:qe], l_b[0])
    # return_softmax is only asked for with dropout, which the paged path refuses above.
    return out, lse, bk.empty((0,), like=q), bk.rng_state(0, 0, like=q)
