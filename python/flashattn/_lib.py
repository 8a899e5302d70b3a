"""ctypes binding to libflashattn: loading, the C structs, and status codes → Python exceptions.

Nothing here knows NumPy or PyTorch: callers hand in `Tensor` views (pointer, dtype, shape,
strides in elements) and `params()` structs, and get back the library's status checked.

The library is found, in order:
  1. the path in the environment variable FLASHATTN_LIBRARY;
  2. libflashattn.so next to this file (where `pip install .` puts it);
  3. build/libflashattn.so of a source checkout this file lives in (python/flashattn/ → build/),
     so `PYTHONPATH=python` works after `make`.
It is loaded on first use, so `import flashattn` never fails because of it.

Ctrl-C: a ctypes call holds off Python's signal handling until it returns, so a long call (more
than INTERRUPTIBLE_WORK multiply-adds) from the main thread runs on a helper thread while the
main thread waits in short slices; a KeyboardInterrupt (or any exception) there sets the call's
fa_params.cancel flag, waits for the library to stop between two of its tasks and is re-raised.
"""

import ctypes
import os
import struct
import sys
import threading

__all__ = [
    "DTYPE_F32", "DTYPE_F16", "DTYPE_BF16", "DTYPE_I32", "DTYPE_U8", "DTYPE_I8", "DTYPE_F8_E4M3",
    "DTYPE_F8_E5M2", "DTYPES_8BIT",
    "DEVICE_CPU", "DEVICE_CUDA",
    "Tensor", "Params",
    "FlashAttnError", "FlashAttnValueError", "FlashAttnTypeError", "FlashAttnRuntimeError",
    "FlashAttnMemoryError",
    "lib", "library_path", "version", "build_info", "params",
    "forward", "varlen_forward", "backward", "varlen_backward", "dropout_mask",
    "KvCache", "has_kvcache", "kvcache", "forward_kvcache", "KVCACHE_SIZE_V1",
    "PARAMS_SIZE_V1", "PARAMS_SIZE_V2", "PARAMS_SIZE_V3", "params_struct_size", "device_count",
    "cuda_available",
    "INTERRUPTIBLE_WORK",
]

# fa_dtype / fa_device (include/flashattn.h)
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_I32, DTYPE_U8 = 0, 1, 2, 3, 4
# 8-bit KV caches only (fa_kvcache.k_scale): int8, fp8 e4m3fn, fp8 e5m2
DTYPE_I8, DTYPE_F8_E4M3, DTYPE_F8_E5M2 = 5, 6, 7
DTYPES_8BIT = frozenset({DTYPE_I8, DTYPE_F8_E4M3, DTYPE_F8_E5M2})
DTYPE_NAMES = {DTYPE_F32: "f32", DTYPE_F16: "f16", DTYPE_BF16: "bf16", DTYPE_I32: "i32",
               DTYPE_U8: "u8", DTYPE_I8: "i8", DTYPE_F8_E4M3: "f8_e4m3",
               DTYPE_F8_E5M2: "f8_e5m2"}
DEVICE_CPU, DEVICE_CUDA = 0, 1
MAX_DIMS = 4


# fa_tensor's bytes: the fields of Tensor below, in order, with the C compiler's alignment.
_TENSOR_LAYOUT = struct.Struct(f"@Piiii{MAX_DIMS}q{MAX_DIMS}q")


class Tensor(ctypes.Structure):
    """fa_tensor: a strided view of memory the caller owns (shape and strides in elements)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("stride", ctypes.c_int64 * MAX_DIMS),
    ]

    @classmethod
    def make(cls, data, dtype, shape, stride, device=DEVICE_CPU, device_index=0):
        # One struct.pack and one copy: half the time of setting the fields one by one, which
        # a short call (a decode step) pays for every tensor.
        pad = (0,) * (MAX_DIMS - len(shape))
        return cls.from_buffer_copy(_TENSOR_LAYOUT.pack(
            data or 0, dtype, device, device_index, len(shape), *shape, *pad, *stride, *pad))


class Params(ctypes.Structure):
    """fa_params as this binding knows it. The library may know a longer struct (fields are only
    ever appended), so params() lets the library fill a larger zeroed buffer first; a library
    from before cuda_stream (struct_size PARAMS_SIZE_V1) is still accepted for CPU tensors."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", Tensor),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        # CUDA tensors only: the cudaStream_t the work is enqueued on (None = legacy default).
        ("cuda_stream", ctypes.c_void_p),
        # const int32_t *: a flag the library reads between tasks; nonzero = stop
        # (FA_ERR_CANCELLED). Set by _call for the calls Ctrl-C must be able to stop.
        ("cancel", ctypes.c_void_p),
        # Attention sinks, fp32 (H), and their gradient (written by the backward); data NULL =
        # none.
        ("sinks", Tensor),
        ("dsinks", Tensor),
    ]


# sizeof(fa_params) before cuda_stream was appended: libraries of that size know no CUDA.
PARAMS_SIZE_V1 = Params.cuda_stream.offset
# sizeof(fa_params) before cancel was appended: such libraries cannot be interrupted.
PARAMS_SIZE_V2 = Params.cancel.offset
# sizeof(fa_params) before sinks were appended: such libraries know no attention sinks.
PARAMS_SIZE_V3 = Params.sinks.offset

# Bytes of the buffers fa_params_init / fa_kvcache_init fill (the library's whole struct, 1080
# bytes for fa_kvcache with its scales), with room for fields a newer library may append.
_PARAMS_BUFFER = 4096


class KvCache(ctypes.Structure):
    """fa_kvcache (fa_forward_kvcache's cache side) as this binding knows it; like Params, the
    library's fa_kvcache_init fills a larger zeroed buffer first. A library from before the
    8-bit caches' scales (struct_size KVCACHE_SIZE_V1) is still accepted without them."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("k_cache", Tensor),
        ("v_cache", Tensor),
        ("k_new", Tensor),
        ("v_new", Tensor),
        ("cache_seqlens", Tensor),
        ("cache_seqlen", ctypes.c_int64),
        ("cache_batch_idx", Tensor),
        ("cache_leftpad", Tensor),
        ("block_table", Tensor),
        ("rotary_cos", Tensor),
        ("rotary_sin", Tensor),
        ("rotary_interleaved", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        # 8-bit caches: fp32 scales, per token (B_cache, S_cache, Hk) / paged (num_pages,
        # page_size, Hk), which the append writes, or per (B, Hk); data NULL = none.
        ("k_scale", Tensor),
        ("v_scale", Tensor),
    ]


# sizeof(fa_kvcache) before k_scale/v_scale were appended: such libraries know no 8-bit caches.
KVCACHE_SIZE_V1 = KvCache.k_scale.offset


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

class FlashAttnError(Exception):
    """An error reported by libflashattn. `status` is the fa_status code (negative) and
    `status_name` its name, e.g. "FA_ERR_SHAPE"; str() is "<name>: <library message>"."""

    def __init__(self, message, status=None, status_name=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


class FlashAttnValueError(FlashAttnError, ValueError):
    """Bad shapes, strides, values or overlapping outputs (also a ValueError)."""


class FlashAttnTypeError(FlashAttnError, TypeError):
    """Unsupported or mismatched dtypes (also a TypeError)."""


class FlashAttnRuntimeError(FlashAttnError, RuntimeError):
    """Device, ABI or internal errors (also a RuntimeError)."""


class FlashAttnMemoryError(FlashAttnError, MemoryError):
    """The library ran out of memory (also a MemoryError)."""


# fa_status → exception class
_STATUS_CLASS = {
    -1: FlashAttnValueError,   # FA_ERR_NULL_POINTER (an empty/None tensor where one is needed)
    -2: FlashAttnValueError,   # FA_ERR_RANK
    -3: FlashAttnValueError,   # FA_ERR_SHAPE
    -4: FlashAttnTypeError,    # FA_ERR_DTYPE
    -5: FlashAttnValueError,   # FA_ERR_STRIDE
    -6: FlashAttnValueError,   # FA_ERR_OVERLAP
    -7: FlashAttnValueError,   # FA_ERR_VALUE
    -8: FlashAttnRuntimeError,  # FA_ERR_DEVICE
    -9: FlashAttnRuntimeError,  # FA_ERR_STRUCT_SIZE
    -10: FlashAttnMemoryError,  # FA_ERR_NO_MEMORY
    -11: FlashAttnValueError,  # FA_ERR_UNSUPPORTED (e.g. head dim > 256)
    -12: FlashAttnRuntimeError,  # FA_ERR_INTERNAL
    -13: FlashAttnRuntimeError,  # FA_ERR_CANCELLED (only through a caller's own flag)
}


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    names = ["libflashattn.so"] if not sys.platform.startswith("darwin") else ["libflashattn.dylib"]
    paths = [os.path.join(here, n) for n in names]
    paths += [os.path.join(here, os.pardir, os.pardir, "build", n) for n in names]
    return [os.path.normpath(p) for p in paths], False


def _declare(cdll):
    P = ctypes.POINTER
    T = P(Tensor)
    c = ctypes
    sigs = {
        "fa_version": (c.c_uint, []),
        "fa_version_string": (c.c_char_p, []),
        "fa_build_info": (c.c_char_p, []),
        "fa_status_name": (c.c_char_p, [c.c_int]),
        "fa_strerror": (c.c_char_p, [c.c_int]),
        "fa_last_error_message": (c.c_char_p, []),
        "fa_params_init": (None, [c.c_void_p]),
        "fa_forward": (c.c_int, [c.c_void_p, c.c_void_p, T, T, T, T, T]),
        "fa_varlen_forward": (c.c_int, [c.c_void_p, c.c_void_p, T, T, T, T, T, c.c_int64,
                                        c.c_int64, T, T]),
        "fa_backward": (c.c_int, [c.c_void_p, c.c_void_p, T, T, T, T, T, T, T, T, T]),
        "fa_varlen_backward": (c.c_int, [c.c_void_p, c.c_void_p, T, T, T, T, T, T, T, T,
                                         c.c_int64, c.c_int64, T, T, T]),
        "fa_dropout_mask": (c.c_int, [c.c_void_p, T]),
    }
    optional = {  # newer entry points: absent in an older library, which is still usable
        "fa_kvcache_init": (None, [c.c_void_p]),
        "fa_forward_kvcache": (c.c_int, [c.c_void_p, c.c_void_p, T, c.c_void_p, T, T]),
        "fa_combine": (c.c_int, [c.c_void_p, c.c_void_p, c.c_int64, T, c.c_int64, T, c.c_int64,
                                 T, T]),
        "fa_device_count": (c.c_int, [c.c_int, P(c.c_int32)]),
        "fa_device_alloc": (c.c_int, [c.c_int, c.c_int32, c.c_size_t, P(c.c_void_p)]),
        "fa_device_free": (c.c_int, [c.c_int, c.c_int32, c.c_void_p]),
        "fa_device_copy": (c.c_int, [c.c_void_p, c.c_int, c.c_void_p, c.c_int, c.c_int32,
                                     c.c_size_t]),
    }
    for name, (res, args) in list(sigs.items()) + list(optional.items()):
        if name in optional and not hasattr(cdll, name):
            continue
        fn = getattr(cdll, name)
        fn.restype = res
        fn.argtypes = args


def lib():
    """The loaded library (a ctypes.CDLL), loading it on first use."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, from_env = _candidates()
        errors = []
        for path in paths:
            if not from_env and not os.path.exists(path):
                errors.append(f"{path}: not found")
                continue
            try:
                cdll = ctypes.CDLL(path)
                _declare(cdll)
            except (OSError, AttributeError) as e:
                errors.append(f"{path}: {e}")
                continue
            _lib_path = path
            _lib = cdll
            return _lib
        where = "FLASHATTN_LIBRARY" if from_env else "the package folder or a source build"
        raise ImportError(
            "flashattn: cannot load libflashattn from " + where + ":\n  " + "\n  ".join(errors)
            + "\nReinstall with `pip install .` from the source tree, run `make` for a source "
            "checkout, or set FLASHATTN_LIBRARY to the path of libflashattn.so.")


def library_path():
    """The path of the loaded libflashattn."""
    lib()
    return _lib_path


def version():
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return lib().fa_version_string().decode()


def build_info():
    """The loaded library's one-line build description (compiler, CPU kernels)."""
    return lib().fa_build_info().decode()


def _raise(status, what):
    L = lib()
    name = L.fa_status_name(status).decode()
    msg = L.fa_last_error_message().decode() or L.fa_strerror(status).decode()
    cls = _STATUS_CLASS.get(status, FlashAttnRuntimeError)
    raise cls(f"{what}: {name}: {msg}", status=status, status_name=name)


def _check(status, what):
    if status != 0:
        _raise(status, what)


# --------------------------------------------------------------------------------------------
# Calls
# --------------------------------------------------------------------------------------------

_F32_MAX = 3.4028234663852886e38
_F32_MIN_SUBNORMAL = 1.401298464324817e-45


# The bytes fa_params_init / fa_kvcache_init write into a zeroed _PARAMS_BUFFER, taken once per
# loaded library: a short call (a decode step) then copies them instead of calling into C.
_init_bytes = {}


def _inited(init):
    got = _init_bytes.get(init)
    if got is None:
        buf = ctypes.create_string_buffer(_PARAMS_BUFFER)
        getattr(lib(), init)(buf)
        got = _init_bytes[init] = buf.raw
    return got


def params_struct_size():
    """sizeof(fa_params) as the loaded library's fa_params_init reports it."""
    return Params.from_buffer_copy(_inited("fa_params_init")).struct_size


def params(softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
           alibi=None, dropout_p=0.0, seed=0, offset=0, cuda_stream=None, sinks=None,
           dsinks=None):
    """An fa_params filled by fa_params_init and then with these values, as a ctypes buffer.

    softmax_scale None means the default 1/sqrt(D). The C library reads 0 as "default", so an
    explicit 0.0 is passed as the smallest positive float, which gives the same (uniform)
    probabilities. alibi, sinks and dsinks are Tensors or None. cuda_stream is a cudaStream_t as
    an int (None or 0: the legacy default stream); it and the sinks need a library that knows
    their fields."""
    buf = ctypes.create_string_buffer(_inited("fa_params_init"), _PARAMS_BUFFER)
    p = Params.from_buffer(buf)
    if p.struct_size < PARAMS_SIZE_V1 or p.struct_size > _PARAMS_BUFFER:
        raise FlashAttnRuntimeError(
            f"flashattn: the loaded library's fa_params is {p.struct_size} bytes; this binding "
            f"needs {PARAMS_SIZE_V1}..{_PARAMS_BUFFER} ({_lib_path}: version {version()})")
    if cuda_stream:
        if p.struct_size < PARAMS_SIZE_V2:
            raise FlashAttnRuntimeError(
                f"fa_params: FA_ERR_DEVICE: the loaded library ({_lib_path}, version "
                f"{version()}) predates CUDA streams (its fa_params is {p.struct_size} bytes, "
                f"without cuda_stream); CUDA tensors need a newer libflashattn", status=-8,
                status_name="FA_ERR_DEVICE")
        p.cuda_stream = int(cuda_stream)
    if sinks is not None or dsinks is not None:
        if p.struct_size <= PARAMS_SIZE_V3:
            raise FlashAttnRuntimeError(
                f"learnable_sink: the loaded library ({_lib_path}, version {version()}) predates "
                f"attention sinks (its fa_params is {p.struct_size} bytes); sinks need a newer "
                f"libflashattn")
        if sinks is not None:
            p.sinks = sinks
        if dsinks is not None:
            p.dsinks = dsinks
    if softmax_scale is not None:
        s = float(softmax_scale)
        if s == 0.0:
            s = _F32_MIN_SUBNORMAL
        p.softmax_scale = s
    p.causal = 1 if causal else 0
    p.window_left = int(window_left)
    p.window_right = int(window_right)
    p.softcap = float(softcap)
    if alibi is not None:
        p.alibi_slopes = alibi
    p.dropout_p = float(dropout_p)
    p.dropout_seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    p.dropout_offset = int(offset) & 0xFFFFFFFFFFFFFFFF
    return buf


def _ref(t):
    return None if t is None else ctypes.byref(t)


# Calls of at least this many multiply-adds (of q·kᵀ) from the main thread can be stopped by
# Ctrl-C. Shorter ones (a decode step) run directly: they end within about 0.1 s on a 2-core
# machine (10 GMAC/s) anyway, and the helper thread's cost (0.1-0.3 ms) would be a large part
# of them on a many-core one.
INTERRUPTIBLE_WORK = 1 << 30

# How often the waiting main thread looks for a signal (seconds).
_WAIT_SLICE = 0.05


def _call(fn, args, what, p, work, keep):
    """fn(*args), a library call with params p, its status checked. A call of `work` >=
    INTERRUPTIBLE_WORK from the main thread runs on a helper thread (ctypes releases the GIL)
    while the main thread waits in slices of _WAIT_SLICE, so that signal handlers run: when one
    raises (KeyboardInterrupt), the call's cancel flag is set, the helper joined and the
    exception re-raised. `keep` holds the arrays the call reads and writes: the helper holds it
    too, so they outlive the call whatever happens to the waiting thread. Calls on CUDA tensors
    (work 0: the plug-in only enqueues them, and ignores the flag) always run directly."""
    if work < INTERRUPTIBLE_WORK or threading.current_thread() is not threading.main_thread():
        _check(fn(*args), what)
        return
    fp = Params.from_buffer(p)
    if fp.struct_size <= PARAMS_SIZE_V2:  # a library without params.cancel
        _check(fn(*args), what)
        return
    flag = ctypes.c_int32(0)
    fp.cancel = ctypes.addressof(flag)
    status = []

    def run(args=args, keep=keep, flag=flag):
        status.append(fn(*args))

    helper = threading.Thread(target=run, name="flashattn-call", daemon=True)
    try:
        helper.start()
        while helper.is_alive():
            helper.join(_WAIT_SLICE)
    except BaseException:
        flag.value = 1
        while helper.is_alive():  # the library stops within one of its tasks
            try:
                helper.join()
            except BaseException:  # another Ctrl-C while it stops: keep waiting
                flag.value = 1
        raise
    _check(status[0], what)


def _host(q, work):
    return work if q.device == DEVICE_CPU else 0


def forward(p, q, k, v, out, lse, work=0, keep=None):
    _call(lib().fa_forward, (None, p, _ref(q), _ref(k), _ref(v), _ref(out), _ref(lse)),
          "fa_forward", p, _host(q, work), keep)


def varlen_forward(p, q, k, v, cu_q, cu_k, max_q, max_k, out, lse, work=0, keep=None):
    _call(lib().fa_varlen_forward, (None, p, _ref(q), _ref(k), _ref(v), _ref(cu_q), _ref(cu_k),
                                    int(max_q), int(max_k), _ref(out), _ref(lse)),
          "fa_varlen_forward", p, _host(q, work), keep)


def backward(p, q, k, v, out, dout, lse, dq, dk, dv, work=0, keep=None):
    _call(lib().fa_backward, (None, p, _ref(q), _ref(k), _ref(v), _ref(out), _ref(dout),
                              _ref(lse), _ref(dq), _ref(dk), _ref(dv)),
          "fa_backward", p, _host(q, work), keep)


def varlen_backward(p, q, k, v, out, dout, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, work=0,
                    keep=None):
    _call(lib().fa_varlen_backward, (None, p, _ref(q), _ref(k), _ref(v), _ref(out), _ref(dout),
                                     _ref(lse), _ref(cu_q), _ref(cu_k), int(max_q), int(max_k),
                                     _ref(dq), _ref(dk), _ref(dv)),
          "fa_varlen_backward", p, _host(q, work), keep)


def dropout_mask(p, mask):
    _check(lib().fa_dropout_mask(p, _ref(mask)), "fa_dropout_mask")


def has_kvcache():
    """Whether the loaded library has fa_forward_kvcache."""
    return hasattr(lib(), "fa_forward_kvcache")


# A non-NULL address for given-but-empty tensors: fa_kvcache treats data == NULL as "absent".
_EMPTY = ctypes.c_int64(0)


def kvcache(fields):
    """An fa_kvcache filled by fa_kvcache_init, then with fields (name → Tensor or int), as a
    ctypes buffer."""
    if not has_kvcache():
        raise FlashAttnRuntimeError(
            f"flashattn: the loaded library ({_lib_path}, version {version()}) has no "
            f"fa_forward_kvcache; flash_attn_with_kvcache needs a newer libflashattn")
    buf = ctypes.create_string_buffer(_inited("fa_kvcache_init"), _PARAMS_BUFFER)
    kv = KvCache.from_buffer(buf)
    if kv.struct_size < KVCACHE_SIZE_V1 or kv.struct_size > _PARAMS_BUFFER:
        raise FlashAttnRuntimeError(
            f"flashattn: the loaded library's fa_kvcache is {kv.struct_size} bytes; this "
            f"binding needs {KVCACHE_SIZE_V1}..{_PARAMS_BUFFER}")
    if kv.struct_size < ctypes.sizeof(KvCache) and ("k_scale" in fields or "v_scale" in fields):
        raise FlashAttnRuntimeError(
            f"k_descale, v_descale: the loaded library ({_lib_path}, version {version()}) "
            f"predates 8-bit KV caches (its fa_kvcache is {kv.struct_size} bytes, without "
            f"k_scale and v_scale); int8 and fp8 caches need a newer libflashattn")
    for name, value in fields.items():
        if isinstance(value, Tensor) and not value.data:
            value.data = ctypes.addressof(_EMPTY)
        setattr(kv, name, value)
    return buf


def device_count(device=DEVICE_CUDA):
    """fa_device_count: the number of devices of that kind (CUDA: 0 when the plug-in loads but
    sees no GPU). Raises FlashAttnRuntimeError (FA_ERR_DEVICE) when the plug-in or the driver
    cannot be loaded, or when the loaded library has no fa_device_count."""
    L = lib()
    if not hasattr(L, "fa_device_count"):
        raise FlashAttnRuntimeError(
            f"fa_device_count: FA_ERR_DEVICE: the loaded library ({_lib_path}, version "
            f"{version()}) has no device support (it predates the CUDA plug-in)", status=-8,
            status_name="FA_ERR_DEVICE")
    n = ctypes.c_int32(0)
    _check(L.fa_device_count(int(device), ctypes.byref(n)), "fa_device_count")
    return int(n.value)


def cuda_available():
    """(True, description) when libflashattn can run on a CUDA GPU: the library loads, its CUDA
    plug-in (libflashattn_cuda.so) and the NVIDIA driver load, and at least one GPU is visible.
    Otherwise (False, why). Never raises; needs no PyTorch."""
    try:
        L = lib()
    except ImportError as e:
        return False, str(e)
    try:
        n = device_count(DEVICE_CUDA)
    except FlashAttnError as e:
        return False, str(e)
    if n <= 0:
        return False, "fa_device_count: the CUDA plug-in loaded but sees no CUDA device"
    if params_struct_size() < PARAMS_SIZE_V2:
        return False, (f"the loaded library ({_lib_path}) has no cuda_stream in fa_params; "
                       f"CUDA tensors need a newer libflashattn")
    info = L.fa_build_info().decode()
    return True, f"{n} CUDA device{'s' if n != 1 else ''} ({info})"


def combine(p, n, out_partial, out_stride, lse_partial, lse_stride, out, lse, work=0, keep=None):
    if not hasattr(lib(), "fa_combine"):
        raise FlashAttnRuntimeError(f"the loaded library ({_lib_path}) has no fa_combine; "
                                    f"flash_attn_combine needs a newer libflashattn")
    _call(lib().fa_combine, (None, p, int(n), _ref(out_partial), int(out_stride),
                             _ref(lse_partial), int(lse_stride), _ref(out), _ref(lse)),
          "fa_combine", p, work, keep)


def forward_kvcache(p, q, kv, out, lse, work=0, keep=None):
    _call(lib().fa_forward_kvcache, (None, p, _ref(q), kv, _ref(out), _ref(lse)),
          "fa_forward_kvcache", p, work, keep)
