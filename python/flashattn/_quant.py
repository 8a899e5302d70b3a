"""8-bit KV caches: quantize_kvcache, and the exact conversions behind it (NumPy, fp32).

The rules are fa_kvcache.k_scale's (include/flashattn.h), which the library's append follows, so
that quantize_kvcache gives the bytes the append writes for the same rows:
    Q = 127 (int8), 448 (fp8 e4m3fn), 57344 (fp8 e5m2); all arithmetic in fp32;
    per token: s = max|x| / Q over the row's head dims, stored = x / s rounded to nearest even
        (s = 0: stored 0; a row with a NaN or an infinity: s = NaN, stored 0);
    per head: one s per (batch, KV head) = max|x| / Q over its tokens and dims (1.0 where that
        is 0), stored = x / s rounded to nearest even;
    stores saturate at +-Q; the value is stored * s.
The reference (reference.kvcache_ref) quantizes appended rows with quantize_rows.
"""

import numpy as np

from ._lib import FlashAttnTypeError, FlashAttnValueError

__all__ = ["quantize_kvcache", "FORMATS", "format_of", "quantize_rows", "encode", "decode"]

# name -> (largest stored magnitude Q, fp8 mantissa bits, exponent bias, largest code, NaN code)
FORMATS = {
    "int8": (127.0, None, None, None, None),
    "float8_e4m3fn": (448.0, 3, 7, 0x7E, 0x7F),
    "float8_e5m2": (57344.0, 2, 15, 0x7B, 0x7E),
}


def format_of(dtype):
    """The FORMATS name of an 8-bit dtype: a torch dtype, a NumPy or ml_dtypes dtype, or its
    name ("int8", "float8_e4m3fn", "float8_e5m2"); None for any other dtype."""
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    elif not isinstance(dtype, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            return None
    return name if name in FORMATS else None


def _f8_codes(y, M, bias, top, nan):
    """fp32 y as fp8 codes (uint8) with M mantissa bits and exponent bias `bias`: round to
    nearest even, saturating at code `top`, NaN as code `nan`, the sign kept (convert.h's
    fa__f32_to_f8, bit for bit)."""
    u = np.ascontiguousarray(y, dtype=np.float32).view(np.uint32).astype(np.int64)
    a = u & 0x7FFFFFFF
    sign = (u >> 24) & 0x80
    small = a < (128 - bias) << 23  # below the smallest normal 2^(1-bias)
    # there: a count of subnormal steps 2^(1-bias-M), exact in fp32 (2^M: the smallest normal)
    sub = np.rint(np.where(small, a, 0).astype(np.uint32).view(np.float32) *
                  np.float32(2.0 ** (bias + M - 1)))
    r = a + ((1 << (22 - M)) - 1) + ((a >> (23 - M)) & 1)  # drop 23 - M bits, to nearest even
    norm = (((r >> 23) - 127 + bias) << M) | ((r >> (23 - M)) & ((1 << M) - 1))
    code = np.where(small, sub.astype(np.int64),
                    np.where(a >= 0x7F000000, top, norm))
    code = np.minimum(code, top)
    code = np.where(a > 0x7F800000, nan, code)
    return (sign | code).astype(np.uint8)


def encode(y, fmt):
    """fp32 y (already divided by its scale) as the stored values of format fmt: int8 codes
    (round to nearest even, saturating at +-127, NaN as 0) or fp8 codes as uint8."""
    y = np.asarray(y, dtype=np.float32)
    if fmt == "int8":
        r = np.rint(y)
        return np.where(np.isnan(r), 0, np.clip(r, -127, 127)).astype(np.int8)
    return _f8_codes(y, *FORMATS[fmt][1:])


def decode(codes, fmt):
    """Stored values of format fmt (int8 codes, or fp8 codes as uint8) as fp64, exactly: e4m3fn
    2^(e-7)(1 + m/8), subnormals m 2^-9, S.1111.111 NaN; e5m2 2^(e-15)(1 + m/4), subnormals
    m 2^-16, exponent 31: infinity (m = 0) or NaN."""
    if fmt == "int8":
        return np.asarray(codes).view(np.int8).astype(np.float64)
    c = np.asarray(codes).view(np.uint8).astype(np.int64)
    M, bias = FORMATS[fmt][1:3]
    e, m = (c & 0x7F) >> M, c & ((1 << M) - 1)
    with np.errstate(over="ignore"):
        mag = np.where(e == 0, m * 2.0 ** (1 - bias - M),
                       np.ldexp(1.0 + m / 2.0 ** M, (e - bias).astype(np.int32)))
    top = (1 << (7 - M)) - 1  # the largest exponent field
    if fmt == "float8_e4m3fn":
        mag = np.where((e == top) & (m == 7), np.nan, mag)
    else:
        mag = np.where(e == top, np.where(m == 0, np.inf, np.nan), mag)
    return np.where(c & 0x80, -mag, mag)


def quantize_rows(x, fmt, scale=None):
    """x (..., D), fp32, quantized row by row as the append does: (codes (..., D), s (...)).
    scale None: a scale per row, s = max|x| / Q (0 for a zero row, NaN for a row with a NaN or
    an infinity, which then stores zeros); else the fixed scales, broadcast to x.shape[:-1]."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if scale is None:
            finite = np.isfinite(x).all(axis=-1)
            amax = np.max(np.abs(np.where(np.isfinite(x), x, 0)), axis=-1, initial=0.0)
            s = np.where(finite, amax.astype(np.float32) / np.float32(FORMATS[fmt][0]),
                         np.float32(np.nan)).astype(np.float32)
        else:
            s = np.broadcast_to(np.asarray(scale, dtype=np.float32), x.shape[:-1])
        zero = ~(s > 0)  # a zero or NaN scale stores zeros
        y = np.where(zero[..., None], np.float32(0), x / np.where(zero, 1, s)[..., None])
    return encode(y.astype(np.float32), fmt), s


def _per_head_scales(x, fmt):
    """(..., S, Hk, D) fp32 -> one scale per (..., Hk): max|x| over tokens and dims / Q, 1.0
    where that is 0 in fp32 (a fixed scale must be > 0)."""
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise FlashAttnValueError(
            f"cache: a NaN or an infinity at {tuple(int(i) for i in bad)}; per='head' needs "
            f"finite values (per='token' gives such rows a NaN scale and zeros)")
    amax = np.max(np.abs(x), axis=(-3, -1), initial=0.0).astype(np.float32)
    s = (amax / np.float32(FORMATS[fmt][0])).astype(np.float32)
    return np.where(s > 0, s, np.float32(1.0)).astype(np.float32)


def _fp8_numpy(codes, fmt):
    from ._core import _ml_dtypes

    if _ml_dtypes is None:
        raise FlashAttnTypeError(f"dtype {fmt}: NumPy fp8 arrays need the ml_dtypes package "
                                 f"(or pass a torch tensor, or dtype int8)")
    return codes.view(getattr(_ml_dtypes, fmt))


def quantize_kvcache(cache, dtype, per="token"):
    """An fp32/fp16/bf16 KV cache as an 8-bit one for flash_attn_with_kvcache: (stored,
    descale), value = stored * descale, exactly as the library's append quantizes new rows.

    Arguments:
        cache: (..., seqlen, nheads_k, headdim), a torch tensor or a NumPy array: a contiguous
            cache (batch_size_cache, seqlen_cache, nheads_k, headdim) or a paged one
            (num_blocks, page_block_size, nheads_k, headdim); computed in fp32.
        dtype: int8, float8_e4m3fn or float8_e5m2 (torch dtypes, NumPy/ml_dtypes dtypes or
            their names).
        per: "token": a scale per (..., token, KV head), descale (..., seqlen, nheads_k):
            s = max|x| / Q over the row (Q = 127, 448, 57344), 0 for a zero row, NaN for a row
            with a NaN or an infinity (stored as zeros); appends write such scales.
            "head": one scale per (..., KV head), descale (..., nheads_k) = max|x| / Q over
            the tokens and head dims (1.0 for an all-zero head); for a contiguous cache this is
            the fixed (batch_size, nheads_k) descale (with cache_batch_idx, index it by the
            rows; paged caches need per="token"). Finite values only.
    Return:
        (stored, descale): stored has the cache's shape and dtype `dtype` (NumPy fp8 through
        ml_dtypes), descale is float32; both of the cache's kind, torch ones on its device.
        Stored values are x / s rounded to nearest even, saturating at +-Q.
    """
    fmt = format_of(dtype)
    if fmt is None:
        raise FlashAttnTypeError(f"dtype: {dtype!r} is not an 8-bit cache dtype; expected int8, "
                                 f"float8_e4m3fn or float8_e5m2")
    if per not in ("token", "head"):
        raise FlashAttnValueError(f"per: {per!r}; expected 'token' (a scale per token and KV "
                                  f"head) or 'head' (one per batch and KV head)")
    if not hasattr(cache, "shape") or len(cache.shape) < 3:
        raise FlashAttnValueError(f"cache: expected an array (..., seqlen, nheads_k, headdim); "
                                  f"got {getattr(cache, 'shape', type(cache).__name__)}")
    torch_in = not isinstance(cache, np.ndarray)
    if torch_in:
        from .flash_attn_interface import _torch_for

        torch = _torch_for(cache, "cache").torch
        if not cache.is_floating_point():
            raise FlashAttnTypeError(f"cache: dtype {cache.dtype}; expected a float tensor")
        x = cache.detach().to("cpu", torch.float32).numpy()
    else:
        if cache.dtype.kind != "f" and cache.dtype.name not in (
                "bfloat16", "float8_e4m3fn", "float8_e5m2"):
            raise FlashAttnTypeError(f"cache: dtype {cache.dtype}; expected a float array")
        x = cache.astype(np.float32)
    if per == "token":
        codes, s = quantize_rows(x, fmt)
    else:
        s = _per_head_scales(x, fmt)
        codes, _ = quantize_rows(x, fmt, s[..., None, :])
    s = np.ascontiguousarray(s, dtype=np.float32)
    if not torch_in:
        return (codes if fmt == "int8" else _fp8_numpy(codes, fmt)), s
    t = torch.from_numpy(np.ascontiguousarray(codes))
    if fmt != "int8":
        t = t.view(getattr(torch, fmt))
    return t.to(cache.device), torch.from_numpy(s).to(cache.device)
