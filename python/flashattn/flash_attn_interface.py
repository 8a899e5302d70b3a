"""flash-attn 2.8's Python API (flash_attn/flash_attn_interface.py) over libflashattn.

Every function takes NumPy arrays or PyTorch tensors. NumPy arrays give NumPy results (no
autograd); PyTorch tensors go through torch.autograd.Function classes whose forward and
backward are `torch.library` custom ops (namespace `flashattn_c`), so they train and
torch.compile. Same names, arguments, defaults, layouts and return values as flash-attn:

    from flashattn import flash_attn_func          # was: from flash_attn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)    # q (B, Sq, H, D), k/v (B, Sk, Hk, D)

PyTorch tensors may be on the CPU or on one CUDA device (every tensor of a call on the same
device; cu_seqlens may also stay on the CPU): the forward and the backward then run through
libflashattn's CUDA plug-in on torch's current stream and return tensors on that device, and so
does flash_attn_with_kvcache (appending to CUDA caches in place; its int32 indices may stay on
the CPU); `flashattn.cuda_available()` says whether the GPU path can run here.

Differences from flash-attn (docs/python.md, docs/semantics.md): fp32 is accepted; any head dim
1..256 without padding; softmax_lse is -inf (not +inf) on rows with no visible key; windows are
taken literally (no rewriting of values >= seqlen_k); S_dmask is (B, H, Sq, Sk), not rounded up
to multiples of 128, and holds the exact probabilities; the backward is always deterministic;
paged KV (block_table) is forward-only, without dropout, through the library's KV-cache path.
"""

import numpy as np

from . import _args, _core
from ._core import NumpyBackend as _NP
from ._lib import FlashAttnTypeError

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
]

_torch_mod = None


def _torch():
    """flashattn._torch_api, imported on the first torch tensor (torch is never required)."""
    global _torch_mod
    if _torch_mod is None:
        try:
            from . import _torch_api
        except ImportError as e:  # torch is not installed
            raise FlashAttnTypeError(
                f"flashattn: expected numpy.ndarray or torch.Tensor inputs ({e})") from None
        _torch_mod = _torch_api
    return _torch_mod


def _is_numpy(x):
    return isinstance(x, np.ndarray)


def _torch_for(x, name):
    """The torch integration, after checking that x (the first array argument) is a tensor."""
    T = _torch()
    if not isinstance(x, T.torch.Tensor):
        raise FlashAttnTypeError(
            f"{name}: expected a numpy.ndarray or torch.Tensor; got {type(x).__name__}")
    return T


# ----------------------------------------------------------------------------------------------
# flash-attn's private wrappers (flash_attn_interface._flash_attn_forward & co., 2.8 signatures).
# Some libraries call these directly; for torch tensors they are the torch.library custom ops.
# ----------------------------------------------------------------------------------------------

def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                        window_size_right, softcap, alibi_slopes, return_softmax):
    """→ (out, softmax_lse, S_dmask, rng_state)."""
    if _is_numpy(q):
        return _core.flash_attn_forward(_NP, q, k, v, dropout_p, softmax_scale, causal,
                                        window_size_left, window_size_right, softcap,
                                        alibi_slopes, return_softmax)
    return _torch_for(q, "q").flash_attn_forward_op(
        q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
        alibi_slopes, return_softmax)


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p, softmax_scale, causal, window_size_left=-1,
                               window_size_right=-1, softcap=0.0, alibi_slopes=None,
                               return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None):
    """→ (out, softmax_lse, S_dmask, rng_state)."""
    if _is_numpy(q):
        return _core.flash_attn_varlen_forward(
            _NP, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
            return_softmax, block_table, leftpad_k, seqused_k)
    return _torch_for(q, "q").flash_attn_varlen_forward_op(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
        return_softmax, block_table, leftpad_k, seqused_k)


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                         causal, window_size_left, window_size_right, softcap, alibi_slopes,
                         deterministic, rng_state=None):
    """Writes dq, dk, dv; returns softmax_d (B, H, Sq) fp32."""
    if _is_numpy(q):
        return _core.flash_attn_backward(_NP, dout, q, k, v, out, softmax_lse, dq, dk, dv,
                                         dropout_p, softmax_scale, causal, window_size_left,
                                         window_size_right, softcap, alibi_slopes,
                                         deterministic, rng_state)
    return _torch_for(q, "q").flash_attn_backward_op(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
        window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state)


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None):
    """Writes dq, dk, dv; returns softmax_d (H, total_q) fp32."""
    if _is_numpy(q):
        return _core.flash_attn_varlen_backward(
            _NP, dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
            max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
            window_size_right, softcap, alibi_slopes, deterministic, rng_state)
    return _torch_for(q, "q").flash_attn_varlen_backward_op(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        softcap, alibi_slopes, deterministic, rng_state)


# ----------------------------------------------------------------------------------------------
# The public functions
# ----------------------------------------------------------------------------------------------

def _checked(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
             return_attn_probs):
    """The public functions' scalars, checked against their C fields (_args) before either path:
    (dropout_p, softmax_scale, causal, (left, right), softcap, deterministic,
    return_attn_probs)."""
    dropout_p, softmax_scale, causal, softcap = _args.attention(dropout_p, softmax_scale, causal,
                                                                softcap)
    return (dropout_p, softmax_scale, causal, _args.window(window_size), softcap,
            _args.boolean("deterministic", deterministic),
            _args.boolean("return_attn_probs", return_attn_probs))


def _np_sinks(learnable_sink, s_aux):
    """The sinks of a call on NumPy arrays (see _torch_api.sinks_arg): a float array, as fp32."""
    x = _args.sinks(learnable_sink, s_aux)
    if x is None:
        return None
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f" and str(x.dtype) != "bfloat16":
        raise FlashAttnTypeError(f"learnable_sink: expected a floating-point numpy.ndarray of "
                                 f"shape (nheads,); got {getattr(x, 'dtype', type(x).__name__)}")
    return x.astype(np.float32)


def _result(res, return_attn_probs):
    out, lse, S, _ = res
    return (out, lse, S) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """Attention over packed qkv (batch, seqlen, 3, nheads, headdim) → out (batch, seqlen,
    nheads, headdim); with return_attn_probs=True, (out, softmax_lse (batch, nheads, seqlen),
    S_dmask). The backward writes dqkv directly (no concatenation). Arguments as
    flash_attn_func."""
    dropout_p, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs = \
        _checked(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                 return_attn_probs)
    if _is_numpy(qkv):
        return _result(_core.flash_attn_forward(
            _NP, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
            window_size[0], window_size[1], softcap, alibi_slopes,
            return_attn_probs and dropout_p > 0), return_attn_probs)
    return _torch_for(qkv, "qkv").FlashAttnQKVPackedFunc.apply(
        qkv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """Attention with packed kv (batch, seqlen_k, 2, nheads_k, headdim); q (batch, seqlen_q,
    nheads, headdim). GQA/MQA when nheads_k divides nheads. Arguments as flash_attn_func."""
    dropout_p, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs = \
        _checked(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                 return_attn_probs)
    if _is_numpy(q):
        return _result(_core.flash_attn_forward(
            _NP, q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size[0],
            window_size[1], softcap, alibi_slopes, return_attn_probs and dropout_p > 0),
            return_attn_probs)
    return _torch_for(q, "q").FlashAttnKVPackedFunc.apply(
        q, kv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, learnable_sink=None, s_aux=None):
    """Exact attention softmax(softmax_scale · q kᵀ + masks) v, fused and tiled.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim); fp32, fp16 or bf16.
        k, v: (batch_size, seqlen_k, nheads_k, headdim), q's dtype; nheads_k divides nheads
            (query head h reads KV head h // (nheads // nheads_k)).
        dropout_p: dropout probability on the attention probabilities (0.0 for evaluation).
            The seed comes from torch's default generator (NumPy's global one for arrays).
        softmax_scale: scale of q kᵀ; default 1/sqrt(headdim).
        causal: bottom-right aligned causal mask: key j visible to query i iff
            j <= i + seqlen_k - seqlen_q. A row with no visible key gives out = 0.
        window_size: (left, right); query i sees keys in
            [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]; -1 = unbounded.
        softcap: > 0 caps scores as softcap · tanh(score / softcap).
        alibi_slopes: (nheads,) or (batch_size, nheads) fp32; adds
            -slope · |i + seqlen_k - seqlen_q - j| to the score.
        deterministic: accepted for compatibility; the backward is always deterministic.
        return_attn_probs: also return softmax_lse and S_dmask (testing only).
        learnable_sink (alias s_aux; keyword only): (nheads,) float attention sinks (gpt-oss,
            flash-attn 4): sinks[h] is one more logit in every softmax row of head h, with no
            value, so out_i = sum_j p_ij v_j with p_ij = exp(s_ij) / (sum_j exp(s_ij) +
            exp(sinks[h])); softmax_lse includes it. Computed in fp32; differentiable.
    Return:
        out: (batch_size, seqlen_q, nheads, headdim), q's dtype.
        softmax_lse [if return_attn_probs]: (batch_size, nheads, seqlen_q) fp32, natural-log
            logsumexp of each row of the scores; -inf on rows with no visible key.
        S_dmask [if return_attn_probs]: (batch_size, nheads, seqlen_q, seqlen_k), q's dtype:
            the softmax probabilities, negated where dropout dropped them; empty (shape (0,))
            when dropout_p == 0, as in flash-attn.

    Every scalar is checked against the C field it ends in (TypeError or ValueError naming it):
    integers for window_size (int32; negative = unbounded), a softmax_scale and softcap that
    fp32 holds (a nonzero value that rounds to 0 or overflows is refused), dropout_p in [0, 1).
    """
    dropout_p, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs = \
        _checked(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                 return_attn_probs)
    if _is_numpy(q):
        return _result(_core.flash_attn_forward(
            _NP, q, k, v, dropout_p, softmax_scale, causal, window_size[0], window_size[1],
            softcap, alibi_slopes, return_attn_probs and dropout_p > 0,
            sinks=_np_sinks(learnable_sink, s_aux)), return_attn_probs)
    T = _torch_for(q, "q")
    return T.FlashAttnFunc.apply(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, T.sinks_arg(learnable_sink, s_aux))


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """Variable-length attention over packed qkv (total, 3, nheads, headdim) with cu_seqlens
    (batch_size + 1,) int32 → out (total, nheads, headdim); softmax_lse (nheads, total)."""
    dropout_p, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs = \
        _checked(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                 return_attn_probs)
    max_seqlen = _args.seqlen(max_seqlen, "max_seqlen")
    if _is_numpy(qkv):
        return _result(_core.flash_attn_varlen_forward(
            _NP, qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen,
            max_seqlen, dropout_p, softmax_scale, causal, window_size[0], window_size[1],
            softcap, alibi_slopes, return_attn_probs and dropout_p > 0), return_attn_probs)
    return _torch_for(qkv, "qkv").FlashAttnVarlenQKVPackedFunc.apply(
        qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """Variable-length attention: q (total_q, nheads, headdim), packed kv (total_k, 2, nheads_k,
    headdim), cu_seqlens_q/_k (batch_size + 1,) int32, max_seqlen_q/_k ints."""
    dropout_p, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs = \
        _checked(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                 return_attn_probs)
    max_seqlen_q = _args.seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _args.seqlen(max_seqlen_k, "max_seqlen_k")
    if _is_numpy(q):
        return _result(_core.flash_attn_varlen_forward(
            _NP, q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            dropout_p, softmax_scale, causal, window_size[0], window_size[1], softcap,
            alibi_slopes, return_attn_probs and dropout_p > 0), return_attn_probs)
    return _torch_for(q, "q").FlashAttnVarlenKVPackedFunc.apply(
        q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           learnable_sink=None, s_aux=None):
    """Variable-length attention over sequences packed along the first dimension.

    q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim); sequence b's queries
    are rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) (int32, (batch_size + 1,)), likewise for keys.
    Masks and windows align per sequence. Returns out (total_q, nheads, headdim); with
    return_attn_probs, also softmax_lse (nheads, total_q) and S_dmask (batch_size, nheads,
    max_seqlen_q, max_seqlen_k). With block_table (batch_size, max_blocks_per_seq) int32, k and
    v are a paged cache (num_blocks, page_block_size, nheads_k, headdim) and sequence b's keys
    are the first cu_seqlens_k[b+1] - cu_seqlens_k[b] positions of its pages (forward only, no
    dropout). max_seqlen_q/_k: integers in [0, 2**63 - 1], bounds on the sequence lengths.
    learnable_sink / s_aux: (nheads,) attention sinks, as flash_attn_func's."""
    dropout_p, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs = \
        _checked(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                 return_attn_probs)
    max_seqlen_q = _args.seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _args.seqlen(max_seqlen_k, "max_seqlen_k")
    if _is_numpy(q):
        return _result(_core.flash_attn_varlen_forward(
            _NP, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size[0], window_size[1], softcap, alibi_slopes,
            return_attn_probs and dropout_p > 0, block_table,
            sinks=_np_sinks(learnable_sink, s_aux)), return_attn_probs)
    T = _torch_for(q, "q")
    return T.FlashAttnVarlenFunc.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, block_table, T.sinks_arg(learnable_sink, s_aux))


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merges partial attentions of the same queries over different parts of the keys (ring
    attention's steps, split-KV's splits) into the attention over all of them: flash-attn 3's
    flash_attn_combine (its argument layout; no backward).

    Arguments:
        out_partial: (num_splits, batch_size, seqlen, nheads, headdim) float32, each part's
            output.
        lse_partial: (num_splits, batch_size, seqlen, nheads) float32, each part's softmax_lse
            (-inf: the part saw no key; its out_partial is then never read).
        out: optional (batch_size, seqlen, nheads, headdim) output to write; else a new one of
            out_dtype (None: float32; float16 and bfloat16 too).
    Return:
        (out, softmax_lse): softmax_lse (batch_size, seqlen, nheads) float32. Parts are summed
        in order in fp32: w_i = exp(lse_i - max lse), out = sum w_i out_i / sum w_i; a row whose
        parts all have lse = -inf gets out = 0 and lse = -inf; a NaN lse makes the row NaN.
    """
    if _is_numpy(out_partial):
        _core._rank_check(out_partial, "out_partial", (5,),
                          "(num_splits, batch_size, seqlen, nheads, headdim)")
        if out is None and out_dtype is not None:
            out = np.empty(out_partial.shape[1:], dtype=out_dtype)
        return _core.flash_attn_combine(_NP, out_partial, lse_partial, out)
    return _torch_for(out_partial, "out_partial").flash_attn_combine(out_partial, lse_partial,
                                                                       out, out_dtype)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, learnable_sink=None, s_aux=None,
                            k_descale=None, v_descale=None, q_descale=None):
    """Attention of q against a KV cache for inference (no backward), appending k/v to the
    cache in place first: flash-attn's flash_attn_with_kvcache.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim).
        k_cache, v_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim), or with
            block_table a paged cache (num_blocks, page_block_size, nheads_k, headdim); any
            page_block_size >= 1 (flash-attn: a multiple of 256).
        k, v: optional (batch_size, seqlen_new, nheads_k, headdim), written into the cache at
            [cache_seqlens[b], cache_seqlens[b] + seqlen_new) before attending. The caller
            advances cache_seqlens.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2), applied to k (at positions
            cache_seqlens + i) and q (at cache_seqlens + i with causal or a window, else at
            cache_seqlens); needs k and v. rotary_interleaved: pairs (2t, 2t+1) if True, else
            (t, t + rotary_dim/2) (GPT-NeoX).
        cache_seqlens: int >= 0 (Python or NumPy) or (batch_size,) int32: tokens already in each
            cache row; None means the whole cache.
        cache_batch_idx: (batch_size,) int32 cache rows to use; cache_leftpad: (batch_size,)
            int32 first valid position of each row (neither with block_table).
        block_table: (batch_size, max_blocks_per_seq) int32 pages of each sequence.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as flash_attn_func, aligned
            to each row's seqlen_k = cache_seqlens + seqlen_new - leftpad.
        num_splits: accepted for compatibility (the CPU splits long caches in fixed chunks).
        return_softmax_lse: also return softmax_lse (batch_size, nheads, seqlen_q).
        learnable_sink / s_aux: (nheads,) attention sinks, as flash_attn_func's.
        k_descale, v_descale: float32 scales of 8-bit caches (CPU only; k_cache and v_cache
            both int8, float8_e4m3fn or float8_e5m2: value = stored * descale), flash-attn 3's
            names: (batch_size, nheads_k), fixed, or per token (batch_size_cache, seqlen_cache,
            nheads_k) / paged (num_blocks, page_block_size, nheads_k), which the append writes
            (quantize_kvcache makes both). Required with 8-bit caches, refused otherwise.
        q_descale: not supported (q is float32, float16 or bfloat16); must be None.
    Return:
        out (batch_size, seqlen_q, nheads, headdim), or (out, softmax_lse).
    """
    _core.no_q_descale(q_descale)
    if _is_numpy(q):
        out, lse = _core.flash_attn_with_kvcache(
            _NP, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
            cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
            softcap, rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse,
            _np_sinks(learnable_sink, s_aux), k_descale, v_descale)
        return (out, lse) if return_softmax_lse else out
    T = _torch_for(q, "q")
    return T.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse,
        T.sinks_arg(learnable_sink, s_aux), k_descale, v_descale)
