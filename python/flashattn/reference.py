"""A naive, obviously correct fp64 NumPy reference of flashattn's semantics (docs/semantics.md).

It materializes the (Sq, Sk) score matrix, so use it only on small shapes: the tests, the
`python -m flashattn` check and the attention probabilities that return_attn_probs=True returns
are built from it.

    out, lse, probs = attention_ref(q, k, v, causal=True)
    out, lse, probs, (dq, dk, dv) = attention_ref(q, k, v, dout=dout)

q (B, Sq, H, D), k (B, Sk, Hk, D) and v (B, Sk, Hk, Dv) (out and dout (B, Sq, H, Dv)), any
float dtype (computed in fp64). lse is (B, H, Sq);
probs (B, H, Sq, Sk) are the softmax probabilities before dropout. A row with no visible key has
out = 0, lse = -inf and zero probabilities. With sinks (H,) (gpt-oss's attention sinks,
flash-attn's learnable_sink), sinks[h] is one more logit in every softmax row of head h, with no
value: probabilities shrink by the sink's share, lse includes it (a row with no visible key then
has lse = sinks[h]), and the backward also returns dsinks (H,). kvcache_ref also takes 8-bit
caches with their descales (dequantized in fp64).
"""

import numpy as np

from . import _quant

__all__ = ["attention_ref", "attention_varlen_ref", "kvcache_ref", "rotary_ref", "visible_mask"]


def visible_mask(sq, sk, causal=False, window_size=(-1, -1)):
    """(Sq, Sk) bool: key j is visible to query i iff
    i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1 = unbounded); causal sets right = 0."""
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    vis = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


def _f64(x):
    return None if x is None else np.asarray(x).astype(np.float64)


def attention_ref(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, dropout_p=0.0, dropout_keep=None, dout=None, sinks=None):
    """Forward (and, with dout, backward) of attention in fp64.

    dropout_keep: (B, H, Sq, Sk) bool, True where a probability is kept (e.g. from
    flashattn.dropout_mask); kept ones are scaled by 1/(1 - dropout_p). alibi_slopes: (H,) or
    (B, H). sinks: (H,) or None. Returns (out, lse, probs) or, with dout, (out, lse, probs,
    (dq, dk, dv)) — (dq, dk, dv, dsinks) with sinks — all fp64."""
    q, k, v, dout = _f64(q), _f64(k), _f64(v), _f64(dout)
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    assert H % Hk == 0, "Hk must divide H"
    g = H // Hk
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    kh = np.repeat(k, g, axis=2)  # (B, Sk, H, D): query head h reads KV head h // g
    vh = np.repeat(v, g, axis=2)

    raw = scale * np.einsum("bqhd,bkhd->bhqk", q, kh)
    if softcap > 0:
        t = np.tanh(raw / softcap)
        s = softcap * t
    else:
        t = None
        s = raw
    if alibi_slopes is not None:
        slopes = _f64(alibi_slopes)
        slopes = np.broadcast_to(slopes if slopes.ndim == 2 else slopes[None, :], (B, H))
        dist = np.abs(np.arange(Sq)[:, None] + Sk - Sq - np.arange(Sk)[None, :])
        s = s - slopes[:, :, None, None] * dist[None, None]
    vis = visible_mask(Sq, Sk, causal, window_size)
    s = np.where(vis[None, None], s, -np.inf)

    m = s.max(axis=-1, keepdims=True) if Sk > 0 else np.full((B, H, Sq, 1), -np.inf)
    if sinks is not None:
        sink = _f64(sinks)[None, :, None, None]  # (1, H, 1, 1)
        m = np.maximum(m, sink)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)  # exp(-inf) = 0 for masked keys
    l = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        l = l + np.exp(sink - m_safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)
        lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0))
                       + m_safe[..., 0], -np.inf)

    if dropout_p > 0:
        if dropout_keep is None:
            raise ValueError("dropout_p > 0 needs dropout_keep, the (B, H, Sq, Sk) keep mask")
        keep = np.asarray(dropout_keep, dtype=bool)
        pd = np.where(keep, p / (1.0 - dropout_p), 0.0)
    else:
        keep = None
        pd = p
    out = np.einsum("bhqk,bkhd->bqhd", pd, vh)
    if dout is None:
        return out, lse, p

    # Backward: dV = Pdᵀ dO; dPd = dO Vᵀ; dP = dPd ∘ keep / (1 - p);
    # dS = P ∘ (dP − rowsum(P ∘ dP)); through softcap ds/draw = 1 − tanh²; dQ = scale dS K ...
    dvh = np.einsum("bhqk,bqhd->bkhd", pd, dout)
    dpd = np.einsum("bqhd,bkhd->bhqk", dout, vh)
    dp = np.where(keep, dpd / (1.0 - dropout_p), 0.0) if keep is not None else dpd
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = scale * np.einsum("bhqk,bkhd->bqhd", ds, kh)
    dkh = scale * np.einsum("bhqk,bqhd->bkhd", ds, q)
    dk = dkh.reshape(B, Sk, Hk, g, D).sum(axis=3)
    dv = dvh.reshape(B, Sk, Hk, g, v.shape[3]).sum(axis=3)
    if sinks is None:
        return out, lse, p, (dq, dk, dv)
    # The sink's probability exp(sink - lse) enters every row's denominator: dsink_h =
    # -sum_{b,i} p_sink · rowsum(P ∘ dP) (rowsum(dO ∘ O)).
    with np.errstate(invalid="ignore"):
        psink = np.where(np.isfinite(lse), np.exp(sink[..., 0] - lse), 0.0)
    dsinks = -(psink * (p * dp).sum(axis=-1)).sum(axis=(0, 2))
    return out, lse, p, (dq, dk, dv, dsinks)


def attention_varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                         window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                         dropout_keep=None, dout=None, sinks=None):
    """attention_ref over packed sequences: q (total_q, H, D), k (total_k, Hk, D) and v
    (total_k, Hk, Dv), cu_seqlens (B + 1). Returns out (total_q, H, Dv), lse (H, total_q), probs
    (B, H, max_sq, max_sk) (sequence b in [:Sq_b, :Sk_b]) and, with dout, (dq, dk, dv) (and
    dsinks with sinks). Rows outside every sequence get out = 0, lse = -inf and zero gradients.
    dropout_keep is (B, H, max_sq, max_sk)."""
    q, k, v, dout = _f64(q), _f64(k), _f64(v), _f64(dout)
    cu_q = np.asarray(cu_seqlens_q, dtype=np.int64)
    cu_k = np.asarray(cu_seqlens_k, dtype=np.int64)
    B = len(cu_q) - 1
    H = q.shape[1]
    lq = np.diff(cu_q)
    lk = np.diff(cu_k)
    msq = int(lq.max()) if B else 0
    msk = int(lk.max()) if B else 0
    out = np.zeros(q.shape[:2] + v.shape[2:])
    lse = np.full((H, q.shape[0]), -np.inf)
    probs = np.zeros((B, H, msq, msk))
    grads = None
    if dout is not None:
        grads = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v))
        if sinks is not None:
            grads += (np.zeros(H),)
    for b in range(B):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        slopes = None
        if alibi_slopes is not None:
            a = np.asarray(alibi_slopes, dtype=np.float64)
            slopes = a[b] if a.ndim == 2 else a
        keep = None if dropout_keep is None else \
            np.asarray(dropout_keep)[b:b + 1, :, :qe - qs, :ke - ks]
        r = attention_ref(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke],
                          softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                          softcap=softcap, alibi_slopes=slopes, dropout_p=dropout_p,
                          dropout_keep=keep, dout=None if dout is None else dout[None, qs:qe],
                          sinks=sinks)
        out[qs:qe] = r[0][0]
        lse[:, qs:qe] = r[1][0]
        probs[b, :, :qe - qs, :ke - ks] = r[2][0]
        if dout is not None:
            grads[0][qs:qe] += r[3][0][0]
            grads[1][ks:ke] += r[3][1][0]
            grads[2][ks:ke] += r[3][2][0]
            if sinks is not None:
                grads[3][:] += r[3][3]
    if dout is None:
        return out, lse, probs
    return out, lse, probs, grads


def rotary_ref(x, cos, sin, positions, interleaved=True):
    """x (S, H, D) rotated at table rows positions (S,): the first rotary_dim = 2 * cos.shape[1]
    dims, in pairs (2t, 2t+1) if interleaved else (t, t + rotary_dim/2), by angle t of the row:
    (a, b) -> (a cos - b sin, a sin + b cos)."""
    x = _f64(x).copy()
    half = np.asarray(cos).shape[1]
    c = _f64(cos)[positions][:, None, :]  # (S, 1, half)
    s = _f64(sin)[positions][:, None, :]
    ia = np.arange(half) * 2 if interleaved else np.arange(half)
    ib = ia + 1 if interleaved else ia + half
    a, b = x[..., ia].copy(), x[..., ib].copy()
    x[..., ia] = a * c - b * s
    x[..., ib] = a * s + b * c
    return x


def kvcache_ref(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                rotary_interleaved=True, alibi_slopes=None, sinks=None, k_descale=None,
                v_descale=None):
    """flash_attn_with_kvcache in fp64 on copies: returns (out, lse, k_cache', v_cache') where
    the caches have k/v (rotated, if rotary) appended at cache_seqlens. Batch b attends over its
    row's positions [leftpad_b, cache_seqlens[b] + seqlen_new).

    8-bit caches (NumPy int8, ml_dtypes float8_e4m3fn / float8_e5m2) come with k_descale and
    v_descale: per token (B_cache, S_cache, Hk) / paged (num_pages, page_size, Hk), or
    (B, Hk) for batch b. A cached value is stored * descale, in fp64. New rows (rotated, then
    rounded to fp32) are quantized as the library's append does (_quant.quantize_rows). Returns
    (out, lse, k_cache', v_cache', k_descale', v_descale'): the caches' stored values (fp64)
    and the descales after the append."""
    q = _f64(q)
    kc, vc = _f64(k_cache).copy(), _f64(v_cache).copy()
    q8 = k_descale is not None or v_descale is not None
    if q8:
        fmts = [_quant.format_of(np.asarray(c).dtype) for c in (k_cache, v_cache)]
        assert None not in fmts and k_descale is not None and v_descale is not None, \
            "8-bit caches need k_descale and v_descale"
        scales = [_f64(k_descale).copy(), _f64(v_descale).copy()]
    B, Sq, H, D = q.shape
    paged = block_table is not None
    page = kc.shape[1]
    capacity = np.asarray(block_table).shape[1] * page if paged else kc.shape[1]
    s_new = 0 if k is None else np.asarray(k).shape[1]
    if cache_seqlens is None:
        lens = np.full(B, capacity)
    elif np.ndim(cache_seqlens) == 0:
        lens = np.full(B, int(cache_seqlens))
    else:
        lens = np.asarray(cache_seqlens, dtype=np.int64)
    rows = np.arange(B) if cache_batch_idx is None else np.asarray(cache_batch_idx)
    pads = np.zeros(B, np.int64) if cache_leftpad is None else np.asarray(cache_leftpad)
    shift = causal or window_size[0] >= 0 or window_size[1] >= 0

    def positions(b, n):  # cache array indices of logical positions 0..n-1 of batch b
        t = np.arange(n)
        if paged:
            pages = np.asarray(block_table)[b][t // page]
            return pages, t % page
        return np.full(n, rows[b]), t

    out = np.zeros((B, Sq, H, vc.shape[3]))
    lse = np.zeros((B, H, Sq))
    for b in range(B):
        L = int(lens[b])
        qb = q[b]
        if k is not None:
            kn, vn = _f64(k)[b], _f64(v)[b]
            if rotary_cos is not None:
                kn = rotary_ref(kn, rotary_cos, rotary_sin, L + np.arange(s_new),
                                rotary_interleaved)
            i0, i1 = positions(b, L + s_new)
            if q8:
                kn, vn = (_append_q8(x, fmts[t], scales[t], b, i0[L:], i1[L:])
                          for t, x in enumerate((kn, vn)))
            kc[i0[L:], i1[L:]] = kn
            vc[i0[L:], i1[L:]] = vn
        if rotary_cos is not None:
            pos = L + (np.arange(Sq) if shift else np.zeros(Sq, np.int64))
            qb = rotary_ref(qb, rotary_cos, rotary_sin, pos, rotary_interleaved)
        i0, i1 = positions(b, L + s_new)
        pad = int(pads[b])
        keys, vals = kc[i0[pad:], i1[pad:]], vc[i0[pad:], i1[pad:]]
        if q8:
            keys, vals = (x * (s[i0[pad:], i1[pad:]][..., None] if s.ndim == 3
                               else s[b][None, :, None]) for x, s in zip((keys, vals), scales))
        slopes = None
        if alibi_slopes is not None:
            a = _f64(alibi_slopes)
            slopes = a[b] if a.ndim == 2 else a
        r = attention_ref(qb[None], keys[None], vals[None], softmax_scale=softmax_scale,
                          causal=causal, window_size=window_size, softcap=softcap,
                          alibi_slopes=slopes, sinks=sinks)
        out[b], lse[b] = r[0][0], r[1][0]
    if q8:
        return out, lse, kc, vc, scales[0], scales[1]
    return out, lse, kc, vc


def _append_q8(x, fmt, scale, b, i0, i1):
    """New rows x (S_new, Hk, D) of batch b quantized into an 8-bit cache at (i0, i1): their
    stored values (fp64); a per-token scale (3-D) gets the rows' scales written."""
    if scale.ndim == 3:
        codes, s = _quant.quantize_rows(x.astype(np.float32), fmt)
        scale[i0, i1] = s
    else:
        codes, _ = _quant.quantize_rows(x.astype(np.float32), fmt, scale[b][None, :])
    return _quant.decode(codes, fmt)
