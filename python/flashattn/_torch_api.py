"""PyTorch integration: a backend for _core, torch.library custom ops with fake implementations
(so torch.compile traces them), and the torch.autograd.Function classes behind the public
functions. Imported only when a torch tensor arrives (or when torch is already imported), and
never compiled against torch: every torch version that has torch.library.custom_op (>= 2.4) gets
custom ops; older ones get plain functions (eager autograd still works, torch.compile does not
see through them).

The custom ops live in the `flashattn_c` namespace (flash-attn itself registers `flashattn::`,
so both packages can be imported in one process):
    torch.ops.flashattn_c._flash_attn_forward, _flash_attn_varlen_forward: flash-attn 2.8's
        private forward signatures → (out, softmax_lse, S_dmask, rng_state);
    torch.ops.flashattn_c._flash_attn_backward, _flash_attn_varlen_backward: flash-attn 2.8's
        private backward signatures, writing dq/dk/dv in place (for code that calls them);
    torch.ops.flashattn_c._flash_attn_backward_grads, _flash_attn_varlen_backward_grads: the
        functional backward the autograd.Function classes use → (dq, dk, dv) or packed grads;
    torch.ops.flashattn_c._flash_attn_with_kvcache: the KV-cache forward, appending to k_cache
        and v_cache (and the per-token descales of 8-bit caches) in place → (out,
        softmax_lse); no backward, as in flash-attn.
A decode step in plain eager mode (no compilation, tracing or dispatch mode, no tensor that
requires grad, plain torch.Tensor arguments) skips the custom op's dispatch, a third of the
step's Python time on short caches, and bumps the caches' version counters itself.
"""

from typing import Optional, Tuple

import numpy as np
import torch

from . import _args, _core, _lib
from ._lib import FlashAttnRuntimeError, FlashAttnTypeError, FlashAttnValueError

NAMESPACE = "flashattn_c"

_TORCH_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.float16: _lib.DTYPE_F16,
                 torch.bfloat16: _lib.DTYPE_BF16, torch.int32: _lib.DTYPE_I32,
                 torch.uint8: _lib.DTYPE_U8, torch.int8: _lib.DTYPE_I8}
if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1
    _TORCH_DTYPES[torch.float8_e4m3fn] = _lib.DTYPE_F8_E4M3
    _TORCH_DTYPES[torch.float8_e5m2] = _lib.DTYPE_F8_E5M2


class TorchBackend:
    """Describes torch tensors to the library (data_ptr, sizes, strides: no copies);
    outputs are new contiguous tensors on the input's device."""

    name = "torch"
    float_types = "torch.float32, torch.float16, torch.bfloat16"
    int_types = "torch.int32"
    cache_types = "torch.int8, torch.float8_e4m3fn, torch.float8_e5m2"

    @staticmethod
    def direct_output(x):
        return isinstance(x, torch.Tensor)

    @staticmethod
    def view(x, name, wanted=None, output=False):
        if not isinstance(x, torch.Tensor):
            raise FlashAttnTypeError(f"{name}: expected a torch.Tensor; got {type(x).__name__}")
        code = _TORCH_DTYPES.get(x.dtype)
        if code is None:
            raise _core._dtype_error(name, x.dtype, _core.wanted_dtypes(TorchBackend, name, wanted))
        if x.dim() > _lib.MAX_DIMS:
            raise FlashAttnValueError(f"{name}: {x.dim()} dimensions; at most {_lib.MAX_DIMS}")
        if x.is_cpu:  # (x.device.type costs more than the rest of the checks)
            device, index = _lib.DEVICE_CPU, 0
        elif (dev := x.device).type == "cuda":
            # Device memory: the library runs the call through its CUDA plug-in (or answers
            # FA_ERR_DEVICE when the plug-in or the driver is missing).
            device, index = _lib.DEVICE_CUDA, dev.index if dev.index is not None else 0
        else:
            raise FlashAttnRuntimeError(
                f"{name}: tensors on {dev.type} are not supported (cpu, or cuda with the "
                f"CUDA plug-in)")
        if x.is_neg():
            x = x.resolve_neg()
        t = _lib.Tensor.make(x.data_ptr() if x.numel() else None, code, x.shape, x.stride(),
                             device, index)
        return t, x

    @staticmethod
    def empty(shape, like, dtype=None):
        dt = {None: like.dtype, "f32": torch.float32, "i64": torch.int64}[dtype]
        return torch.empty(shape, dtype=dt, device=like.device)

    @staticmethod
    def zeros(shape, like, dtype=None):
        dt = {None: like.dtype, "f32": torch.float32}[dtype]
        return torch.zeros(shape, dtype=dt, device=like.device)

    @staticmethod
    def full(shape, value, like, dtype=None):
        dt = {None: like.dtype, "f32": torch.float32}[dtype]
        return torch.full(shape, value, dtype=dt, device=like.device)

    @staticmethod
    def cuda_stream(index):
        """The cudaStream_t (an int; 0 = the legacy default stream) of torch's current stream
        on CUDA device index: the library enqueues its work there, ordered with torch's."""
        return torch.cuda.current_stream(index).cuda_stream

    @staticmethod
    def draw_seed():
        # torch's default (CPU) generator for every device, so torch.manual_seed() makes dropout
        # reproducible and a CUDA call draws the same seed, hence the same mask, as a CPU call.
        return int(torch.empty((), dtype=torch.int64).random_().item())

    @staticmethod
    def rng_state(seed, offset, like):
        if seed == 0 and offset == 0:  # no dropout: no host-to-device copy on CUDA
            return torch.zeros((2,), dtype=torch.int64, device=like.device)
        return torch.tensor([seed, offset], dtype=torch.int64, device=like.device)

    @staticmethod
    def rng_values(rng):
        r = rng.tolist() if isinstance(rng, torch.Tensor) else list(np.asarray(rng).reshape(-1))
        return int(r[0]) & 0xFFFFFFFFFFFFFFFF, int(r[1]) & 0xFFFFFFFFFFFFFFFF

    @staticmethod
    def to_numpy(x):
        x = x.detach()
        if x.is_floating_point():
            x = x.to(torch.float32)
        return x.cpu().numpy()

    @staticmethod
    def from_numpy(a, like, dtype=None):
        return torch.from_numpy(np.ascontiguousarray(a)).to(
            device=like.device, dtype=like.dtype if dtype is None else dtype)

    @staticmethod
    def ints(x):
        return [int(i) for i in (x.tolist() if isinstance(x, torch.Tensor) else x)]

    @staticmethod
    def copy(dst, src):
        dst.copy_(src)

    @staticmethod
    def softmax_d(dout, out, varlen):
        d = torch.einsum("...hd,...hd->...h", dout.float(), out.float())
        return (d.t() if varlen else d.transpose(-1, -2)).contiguous()


_TB = TorchBackend

# ----------------------------------------------------------------------------------------------
# The four ops (flash-attn 2.8's private signatures)
# ----------------------------------------------------------------------------------------------


def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
         softmax_scale: float, causal: bool, window_size_left: int, window_size_right: int,
         softcap: float, alibi_slopes: Optional[torch.Tensor], return_softmax: bool,
         sinks: Optional[torch.Tensor] = None
         ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _core.flash_attn_forward(_TB, q, k, v, dropout_p, softmax_scale, causal,
                                    window_size_left, window_size_right, softcap, alibi_slopes,
                                    return_softmax, sinks=sinks)


def _fwd_fake(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
              softcap, alibi_slopes, return_softmax, sinks=None):
    B, Sq, H, _ = q.shape
    Sk = k.shape[1]
    out = q.new_empty((B, Sq, H, v.shape[3]))
    lse = q.new_empty((B, H, Sq), dtype=torch.float32)
    S = q.new_empty((B, H, Sq, Sk) if return_softmax else (0,))
    return out, lse, S, q.new_empty((2,), dtype=torch.int64)


def _varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                dropout_p: float, softmax_scale: float, causal: bool,
                window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
                alibi_slopes: Optional[torch.Tensor] = None, return_softmax: bool = False,
                block_table: Optional[torch.Tensor] = None,
                leftpad_k: Optional[torch.Tensor] = None,
                seqused_k: Optional[torch.Tensor] = None,
                sinks: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _core.flash_attn_varlen_forward(
        _TB, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
        return_softmax, block_table, leftpad_k, seqused_k, sinks=sinks)


def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                     softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                     softcap=0.0, alibi_slopes=None, return_softmax=False, block_table=None,
                     leftpad_k=None, seqused_k=None, sinks=None):
    Tq, H, _ = q.shape
    B = cu_seqlens_q.shape[0] - 1
    out = q.new_empty((Tq, H, v.shape[-1]))
    lse = q.new_empty((H, Tq), dtype=torch.float32)
    S = q.new_empty((B, H, max_seqlen_q, max_seqlen_k) if return_softmax else (0,))
    return out, lse, S, q.new_empty((2,), dtype=torch.int64)


def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         out: torch.Tensor, softmax_lse: torch.Tensor, dq: Optional[torch.Tensor],
         dk: Optional[torch.Tensor], dv: Optional[torch.Tensor], dropout_p: float,
         softmax_scale: float, causal: bool, window_size_left: int, window_size_right: int,
         softcap: float, alibi_slopes: Optional[torch.Tensor], deterministic: bool,
         rng_state: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _core.flash_attn_backward(_TB, dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                                     softmax_scale, causal, window_size_left, window_size_right,
                                     softcap, alibi_slopes, deterministic, rng_state)


def _bwd_fake(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
              window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
              rng_state=None):
    B, Sq, H, _ = q.shape
    return q.new_empty((B, H, Sq), dtype=torch.float32)


def _varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, softmax_lse: torch.Tensor, dq: Optional[torch.Tensor],
                dk: Optional[torch.Tensor], dv: Optional[torch.Tensor],
                cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool,
                window_size_left: int, window_size_right: int, softcap: float,
                alibi_slopes: Optional[torch.Tensor], deterministic: bool,
                rng_state: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _core.flash_attn_varlen_backward(
        _TB, dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
        window_size_right, softcap, alibi_slopes, deterministic, rng_state)


def _varlen_bwd_fake(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                     window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
                     rng_state=None):
    Tq, H, _ = q.shape
    return q.new_empty((H, Tq), dtype=torch.float32)


def _new_real(like, shape):
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _new_fake(like, shape):
    return like.new_empty(shape)


def _packed_grad(shape, dim, like, new=_new_real):
    """A gradient of a packed qkv/kv tensor, e.g. (B, S, 3, H, D) with dim = 2, laid out so
    that each of its 3 (or 2) parts is one contiguous block: the library refuses outputs whose
    address ranges interleave, so the parts of a (B, S, 3, H, D)-contiguous tensor cannot be
    written in one call. The backward writes the parts in place, with no concatenation;
    autograd copies it only if a consumer needs another layout."""
    n = shape[dim]
    return new(like, (n,) + shape[:dim] + shape[dim + 1:]).movedim(0, dim)


# Functional backward ops for the autograd.Function classes: they return fresh gradients instead
# of writing into dq/dk/dv arguments. Measured: under torch 2.4.1's inductor, a qkv projection
# unbound into flash_attn_func got a wrong dq through the mutating op (fine in eager and
# aot_eager, and on torch 2.15); the functional op is right on both versions.
# pack: 0 → (dq, dk, dv); 3 → (dqkv, ∅, ∅) for packed qkv; 2 → (dq, dkv, ∅) for packed kv, where
# the packed dimension sits before the heads (q.dim() - 2) and ∅ is an empty tensor. With sinks
# (fp32 (H)) a fourth result is their gradient dsinks (fp32 (H)); ∅ without.


def _grads(q, k, v, pack, new):
    dim = q.dim() - 2
    if pack == 3:
        dqkv = _packed_grad(tuple(q.shape[:dim]) + (3,) + tuple(q.shape[dim:]), dim, q, new)
        views = (dqkv.select(dim, 0), dqkv.select(dim, 1), dqkv.select(dim, 2))
        return (dqkv, new(q, (0,)), new(q, (0,))), views
    dq = new(q, tuple(q.shape))
    if pack == 2:
        dkv = _packed_grad(tuple(k.shape[:dim]) + (2,) + tuple(k.shape[dim:]), dim, k, new)
        return (dq, dkv, new(q, (0,))), (dq, dkv.select(dim, 0), dkv.select(dim, 1))
    if pack != 0:
        raise FlashAttnValueError(f"pack is {pack}; expected 0, 2 or 3")
    dk, dv = new(k, tuple(k.shape)), new(v, tuple(v.shape))
    return (dq, dk, dv), (dq, dk, dv)


def _bwd_grads(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor, softmax_lse: torch.Tensor, dropout_p: float,
               softmax_scale: float, causal: bool, window_size_left: int, window_size_right: int,
               softcap: float, alibi_slopes: Optional[torch.Tensor],
               rng_state: Optional[torch.Tensor], pack: int,
               sinks: Optional[torch.Tensor] = None
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    result, (dq, dk, dv) = _grads(q, k, v, pack, _new_real)
    dsinks = _dsinks(sinks, q, _new_real)
    _core.flash_attn_backward(_TB, dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                              softmax_scale, causal, window_size_left, window_size_right,
                              softcap, alibi_slopes, True, rng_state, sinks,
                              None if sinks is None else dsinks)
    return result + (dsinks,)


def _dsinks(sinks, q, new):
    return q.new_empty((0,)) if sinks is None else new(sinks, tuple(sinks.shape))


def _bwd_grads_fake(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal,
                    window_size_left, window_size_right, softcap, alibi_slopes, rng_state, pack,
                    sinks=None):
    return _grads(q, k, v, pack, _new_fake)[0] + (_dsinks(sinks, q, _new_fake),)


def _varlen_bwd_grads(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      out: torch.Tensor, softmax_lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                      dropout_p: float, softmax_scale: float, causal: bool,
                      window_size_left: int, window_size_right: int, softcap: float,
                      alibi_slopes: Optional[torch.Tensor], rng_state: Optional[torch.Tensor],
                      pack: int, sinks: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    result, (dq, dk, dv) = _grads(q, k, v, pack, _new_real)
    dsinks = _dsinks(sinks, q, _new_real)
    _core.flash_attn_varlen_backward(
        _TB, dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
        window_size_right, softcap, alibi_slopes, True, rng_state, sinks,
        None if sinks is None else dsinks)
    return result + (dsinks,)


def _varlen_bwd_grads_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                           window_size_left, window_size_right, softcap, alibi_slopes, rng_state,
                           pack, sinks=None):
    return _grads(q, k, v, pack, _new_fake)[0] + (_dsinks(sinks, q, _new_fake),)


def _kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             k: Optional[torch.Tensor], v: Optional[torch.Tensor],
             rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
             cache_seqlens: Optional[torch.Tensor], cache_seqlen: int,
             cache_batch_idx: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor],
             block_table: Optional[torch.Tensor], softmax_scale: float, causal: bool,
             window_size_left: int, window_size_right: int, softcap: float,
             rotary_interleaved: bool, alibi_slopes: Optional[torch.Tensor], num_splits: int,
             sinks: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
             v_descale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _kvcache_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_seqlen, cache_batch_idx, cache_leftpad, block_table, softmax_scale,
                         causal, window_size_left, window_size_right, softcap, rotary_interleaved,
                         alibi_slopes, num_splits, sinks, True, k_descale, v_descale)


def _kvcache_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                  cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                  window_size_left, window_size_right, softcap, rotary_interleaved, alibi_slopes,
                  num_splits, sinks, want_lse, k_descale=None, v_descale=None):
    """_kvcache's work; a plain eager call that returns no lse (want_lse False) skips it."""
    if cache_seqlens is None and cache_seqlen >= 0:
        cache_seqlens = cache_seqlen
    return _core.flash_attn_with_kvcache(
        _TB, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, (window_size_left, window_size_right),
        softcap, rotary_interleaved, alibi_slopes, num_splits, want_lse, sinks, k_descale,
        v_descale)


def _kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                  cache_seqlen, cache_batch_idx, cache_leftpad, block_table, softmax_scale,
                  causal, window_size_left, window_size_right, softcap, rotary_interleaved,
                  alibi_slopes, num_splits, sinks=None, k_descale=None, v_descale=None):
    B, Sq, H, _ = q.shape
    return (q.new_empty((B, Sq, H, v_cache.shape[3])),
            q.new_empty((B, H, Sq), dtype=torch.float32))


HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")


def _combine(out_partial: torch.Tensor, lse_partial: torch.Tensor,
             out_dtype: Optional[torch.dtype]) -> Tuple[torch.Tensor, torch.Tensor]:
    n, B, S, H, D = out_partial.shape
    out = None
    if out_dtype is not None:
        out = torch.empty((B, S, H, D), dtype=out_dtype, device=out_partial.device)
    out, lse = _core.flash_attn_combine(_TB, out_partial, lse_partial, out)
    return out, lse.transpose(1, 2)  # the (B, H, S) storage; the wrapper gives (B, S, H)


def _combine_fake(out_partial, lse_partial, out_dtype):
    n, B, S, H, D = out_partial.shape
    dt = torch.float32 if out_dtype is None else out_dtype
    return (out_partial.new_empty((B, S, H, D), dtype=dt),
            out_partial.new_empty((B, H, S), dtype=torch.float32))


def _register(name, fn, fake, mutates_args=()):
    if not HAS_CUSTOM_OP:
        return fn
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", fn, mutates_args=mutates_args)
    op.register_fake(fake)
    return op


_forward_op = _register("_flash_attn_forward", _fwd, _fwd_fake)
_varlen_forward_op = _register("_flash_attn_varlen_forward", _varlen_fwd, _varlen_fwd_fake)
_backward_op = _register("_flash_attn_backward", _bwd, _bwd_fake, ("dq", "dk", "dv"))
_varlen_backward_op = _register("_flash_attn_varlen_backward", _varlen_bwd, _varlen_bwd_fake,
                                ("dq", "dk", "dv"))
# The append writes the caches and per-token descales (8-bit caches) in place.
_kvcache_op = _register("_flash_attn_with_kvcache", _kvcache, _kvcache_fake,
                        ("k_cache", "v_cache", "k_descale", "v_descale"))
_combine_op = _register("_flash_attn_combine", _combine, _combine_fake)
_bwd_grads_op = _register("_flash_attn_backward_grads", _bwd_grads, _bwd_grads_fake)
_varlen_bwd_grads_op = _register("_flash_attn_varlen_backward_grads", _varlen_bwd_grads,
                                 _varlen_bwd_grads_fake)


def _scale(softmax_scale, q):
    return q.shape[-1] ** (-0.5) if softmax_scale is None else softmax_scale


def _checked(dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap):
    """The private wrappers' scalars, checked (_args) before the custom op's schema converts
    them: (dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)."""
    return _core._scalars(dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                          softcap)


# Entry points for flash_attn_interface's private wrappers (softmax_scale may be None there).
def flash_attn_forward_op(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                          window_size_right, softcap, alibi_slopes, return_softmax):
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _checked(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    return _forward_op(q, k, v, dropout_p, _scale(softmax_scale, q), causal, window_size_left,
                       window_size_right, softcap, alibi_slopes,
                       _args.boolean("return_softmax", return_softmax))


def flash_attn_varlen_forward_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, dropout_p, softmax_scale, causal,
                                 window_size_left=-1, window_size_right=-1, softcap=0.0,
                                 alibi_slopes=None, return_softmax=False, block_table=None,
                                 leftpad_k=None, seqused_k=None):
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _checked(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    return _varlen_forward_op(q, k, v, cu_seqlens_q, cu_seqlens_k,
                              _args.seqlen(max_seqlen_q, "max_seqlen_q"),
                              _args.seqlen(max_seqlen_k, "max_seqlen_k"), dropout_p,
                              _scale(softmax_scale, q), causal, window_size_left,
                              window_size_right, softcap, alibi_slopes,
                              _args.boolean("return_softmax", return_softmax), block_table,
                              leftpad_k, seqused_k)


def flash_attn_backward_op(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                           softmax_scale, causal, window_size_left, window_size_right, softcap,
                           alibi_slopes, deterministic, rng_state=None):
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _checked(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    return _backward_op(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                        _scale(softmax_scale, q), causal, window_size_left, window_size_right,
                        softcap, alibi_slopes, _args.boolean("deterministic", deterministic),
                        rng_state)


def flash_attn_varlen_backward_op(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                  cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size_left, window_size_right,
                                  softcap, alibi_slopes, deterministic, rng_state=None):
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap = _checked(
        dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    return _varlen_backward_op(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                               cu_seqlens_k, _args.seqlen(max_seqlen_q, "max_seqlen_q"),
                               _args.seqlen(max_seqlen_k, "max_seqlen_k"), dropout_p,
                               _scale(softmax_scale, q), causal, window_size_left,
                               window_size_right, softcap, alibi_slopes,
                               _args.boolean("deterministic", deterministic), rng_state)


_CAN_SKIP_OP = HAS_CUSTOM_OP and hasattr(torch.autograd.graph, "increment_version") and \
    hasattr(torch._C, "_len_torch_dispatch_stack") and hasattr(torch, "compiler")


def _plain_eager(tensors):
    """Whether a call on these tensors (None allowed) may skip the custom op: eager mode, no
    dispatch mode active, plain tensors, none requiring grad while grad mode is on."""
    if not _CAN_SKIP_OP or torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    grad = torch.is_grad_enabled()
    return all(t is None or (type(t) is torch.Tensor and not (grad and t.requires_grad))
               for t in tensors)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, sinks=None, k_descale=None,
                            v_descale=None):
    for name, d in (("k_descale", k_descale), ("v_descale", v_descale)):
        if d is not None and not isinstance(d, torch.Tensor):
            raise FlashAttnTypeError(f"{name}: expected a float32 torch.Tensor (batch_size, "
                                     f"nheads_k) or per token; got {type(d).__name__}")
    seqlen = -1
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        seqlen, cache_seqlens = _core.seqlen_int(cache_seqlens), None
    wl, wr = _args.window(window_size)
    _, softmax_scale, causal, softcap = _args.attention(0.0, softmax_scale, causal, softcap)
    return_softmax_lse = _args.boolean("return_softmax_lse", return_softmax_lse)
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, seqlen,
            cache_batch_idx, cache_leftpad, block_table, _scale(softmax_scale, q), causal, wl, wr,
            softcap, _args.boolean("rotary_interleaved", rotary_interleaved), alibi_slopes,
            _args.integer("num_splits", num_splits, _args.INT32_MIN, _args.INT32_MAX), sinks)
    if _plain_eager((q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sinks, k_descale,
                     v_descale)):
        out, lse = _kvcache_call(*args, return_softmax_lse, k_descale, v_descale)
        if k is not None or v is not None:  # written in place, as the op would record
            torch.autograd.graph.increment_version(k_cache)
            torch.autograd.graph.increment_version(v_cache)
            for d in (k_descale, v_descale):  # per-token descales get the new rows' scales
                if d is not None and d.dim() == 3:
                    torch.autograd.graph.increment_version(d)
    else:
        out, lse = _kvcache_op(*args, k_descale, v_descale)
    return (out, lse) if return_softmax_lse else out


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------

def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """flash_attn_interface.flash_attn_combine on torch tensors: the custom op (traceable by
    torch.compile), or with out given a direct call writing it."""
    _core._rank_check(out_partial, "out_partial", (5,),
                      "(num_splits, batch_size, seqlen, nheads, headdim)")
    if out is not None:
        res, lse = _core.flash_attn_combine(_TB, out_partial, lse_partial, out)
        return res, lse
    res, lse = _combine_op(out_partial, lse_partial, out_dtype)
    return res, lse.transpose(1, 2)


def _outputs(ctx, out, lse, S, return_softmax):
    if not return_softmax:
        return out
    ctx.mark_non_differentiable(lse, S)
    return out, lse, S


def sinks_arg(learnable_sink, s_aux):
    """The sinks of a public call: learnable_sink (flash-attn's name) or s_aux (vLLM's and
    transformers'), not both; a float tensor, made fp32 here so that autograd returns the
    gradient in the caller's dtype."""
    x = _args.sinks(learnable_sink, s_aux)
    if x is None:
        return None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise FlashAttnTypeError(f"learnable_sink: expected a floating-point torch.Tensor of "
                                 f"shape (nheads,); got {getattr(x, 'dtype', type(x).__name__)}")
    return x.to(torch.float32)


def _dsinks_out(ctx, sinks, dsinks):
    return dsinks if sinks is not None and ctx.needs_input_grad[-1] else None


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                alibi_slopes, deterministic, return_softmax, sinks=None):
        softmax_scale = _scale(softmax_scale, q)
        out, lse, S, rng = _forward_op(q, k, v, dropout_p, softmax_scale, causal,
                                       window_size[0], window_size[1], softcap, alibi_slopes,
                                       return_softmax and dropout_p > 0, sinks)
        ctx.save_for_backward(q, k, v, out, lse, rng, sinks)
        ctx.args = (dropout_p, softmax_scale, causal, window_size[0], window_size[1], softcap,
                    alibi_slopes)
        return _outputs(ctx, out, lse, S, return_softmax)

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, lse, rng, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks = _bwd_grads_op(dout, q, k, v, out, lse, *ctx.args, rng, 0, sinks)
        return (dq, dk, dv) + (None,) * 8 + (_dsinks_out(ctx, sinks, dsinks),)


class FlashAttnQKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_softmax):
        q, k, v = qkv[:, :, 0].detach(), qkv[:, :, 1].detach(), qkv[:, :, 2].detach()
        softmax_scale = _scale(softmax_scale, q)
        out, lse, S, rng = _forward_op(q, k, v, dropout_p, softmax_scale, causal,
                                       window_size[0], window_size[1], softcap, alibi_slopes,
                                       return_softmax and dropout_p > 0)
        ctx.save_for_backward(q, k, v, out, lse, rng)
        ctx.args = (dropout_p, softmax_scale, causal, window_size[0], window_size[1], softcap,
                    alibi_slopes)
        return _outputs(ctx, out, lse, S, return_softmax)

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, lse, rng = ctx.saved_tensors
        dqkv, _, _, _ = _bwd_grads_op(dout, q, k, v, out, lse, *ctx.args, rng, 3)
        return dqkv, None, None, None, None, None, None, None, None


class FlashAttnKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, dropout_p, softmax_scale, causal, window_size, softcap,
                alibi_slopes, deterministic, return_softmax):
        k, v = kv[:, :, 0].detach(), kv[:, :, 1].detach()
        softmax_scale = _scale(softmax_scale, q)
        out, lse, S, rng = _forward_op(q, k, v, dropout_p, softmax_scale, causal,
                                       window_size[0], window_size[1], softcap, alibi_slopes,
                                       return_softmax and dropout_p > 0)
        ctx.save_for_backward(q, k, v, out, lse, rng)
        ctx.args = (dropout_p, softmax_scale, causal, window_size[0], window_size[1], softcap,
                    alibi_slopes)
        return _outputs(ctx, out, lse, S, return_softmax)

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, lse, rng = ctx.saved_tensors
        dq, dkv, _, _ = _bwd_grads_op(dout, q, k, v, out, lse, *ctx.args, rng, 2)
        return dq, dkv, None, None, None, None, None, None, None, None


class FlashAttnVarlenFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                return_softmax, block_table, sinks=None):
        softmax_scale = _scale(softmax_scale, q)
        out, lse, S, rng = _varlen_forward_op(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size[0], window_size[1], softcap, alibi_slopes,
            return_softmax and dropout_p > 0, block_table, None, None, sinks)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng, sinks)
        ctx.args = (max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size[0],
                    window_size[1], softcap, alibi_slopes)
        ctx.paged = block_table is not None
        return _outputs(ctx, out, lse, S, return_softmax)

    @staticmethod
    def backward(ctx, dout, *args):
        if ctx.paged:
            raise NotImplementedError("flashattn: no backward through a paged KV cache "
                                      "(block_table)")
        q, k, v, out, lse, cu_q, cu_k, rng, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks = _varlen_bwd_grads_op(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args,
                                                  rng, 0, sinks)
        return (dq, dk, dv) + (None,) * 13 + (_dsinks_out(ctx, sinks, dsinks),)


class FlashAttnVarlenQKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size,
                softcap, alibi_slopes, deterministic, return_softmax):
        q, k, v = qkv[:, 0].detach(), qkv[:, 1].detach(), qkv[:, 2].detach()
        softmax_scale = _scale(softmax_scale, q)
        out, lse, S, rng = _varlen_forward_op(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
            causal, window_size[0], window_size[1], softcap, alibi_slopes,
            return_softmax and dropout_p > 0, None)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, rng)
        ctx.args = (max_seqlen, max_seqlen, dropout_p, softmax_scale, causal, window_size[0],
                    window_size[1], softcap, alibi_slopes)
        return _outputs(ctx, out, lse, S, return_softmax)

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, lse, cu, rng = ctx.saved_tensors
        dqkv, _, _, _ = _varlen_bwd_grads_op(dout, q, k, v, out, lse, cu, cu, *ctx.args, rng,
                                             3)
        return (dqkv,) + (None,) * 10


class FlashAttnVarlenKVPackedFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                return_softmax):
        k, v = kv[:, 0].detach(), kv[:, 1].detach()
        softmax_scale = _scale(softmax_scale, q)
        out, lse, S, rng = _varlen_forward_op(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size[0], window_size[1], softcap, alibi_slopes,
            return_softmax and dropout_p > 0, None)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng)
        ctx.args = (max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size[0],
                    window_size[1], softcap, alibi_slopes)
        return _outputs(ctx, out, lse, S, return_softmax)

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, lse, cu_q, cu_k, rng = ctx.saved_tensors
        dq, dkv, _, _ = _varlen_bwd_grads_op(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args,
                                             rng, 2)
        return (dq, dkv) + (None,) * 12
