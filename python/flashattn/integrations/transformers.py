"""Hugging Face transformers on flashattn, in one call:

    import flashattn.integrations.transformers as fa_transformers
    fa_transformers.enable()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="flash_attention_2")
    # or attn_implementation=fa_transformers.NAME ("flashattn/flashattn")

How: transformers 5.x loads attn_implementation="flash_attention_2" ("_3"), when the flash-attn
package is not usable, from the `kernels` package as the hub kernel kernels-community/flash-attn2
(kernels-community/vllm-flash-attn3, where models such as gpt-oss also redirect
"flash_attention_2" and NAME), and any "owner/name" attn_implementation as that hub kernel;
`kernels` loads a repository from a local folder instead when the LOCAL_KERNELS environment
variable maps it to one. enable() maps these three repositories to the kernel folder shipped
in this package (integrations/hf_kernel: metadata.json and an __init__.py exporting the three
functions below), so transformers' own flash-attention
code (integrations/flash_attention.py, modeling_flash_attention_utils.py) runs unchanged on
flashattn, on CPU tensors and on CUDA tensors through the plug-in: padding (unpadded to varlen),
packed sequences (position_ids, cu_seq_lens_*), static and dynamic caches, sliding windows,
softcap, dropout, attention sinks, MLA (transformers pads V to Q's head dim) and continuous
batching's paged cache (flash_attn_with_kvcache with block_table). Nothing in transformers is
patched. Where the flash-attn package is installed and usable (CUDA), "flash_attention_2" stays
flash-attn's (enable() warns) and NAME is flashattn's.

No feature is dropped: transformers passes exactly the arguments these functions' signatures
name (it reads them), and each reaches flashattn, attention sinks (transformers' s_aux, passed
as learnable_sink) included; anything flashattn refuses (head dim > 256, a CUDA call without the
plug-in, ...) raises flashattn's error. transformers itself only warns on
output_attentions=True (flash attention returns no probabilities).

Versions: tested with transformers 5.25.0 and kernels 0.19.1 (TESTED). enable() raises
FlashAttnValueError where transformers or kernels is missing, transformers is older than 5, or
transformers refuses this kernels version; with other transformers 5.x or kernels versions it
goes ahead after a warnings.warn naming the tested ones.
"""

import logging
import os
import warnings
from pathlib import Path

from .. import flash_attn_interface as _fai
from .._lib import FlashAttnValueError

__all__ = ["enable", "NAME", "TESTED", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache"]

NAME = "flashattn/flashattn"
TESTED = {"transformers": ("5.25.0",), "kernels": ("0.19.1",)}
KERNEL_DIR = Path(__file__).resolve().parent / "hf_kernel"
_PREFIX = "flashattn.integrations.transformers"


def _error(message):
    return FlashAttnValueError(f"{_PREFIX}: {message}")


def _seqlen(x):
    """A max_seqlen as an int: transformers passes a 0-d tensor for packed position_ids."""
    return x.item() if hasattr(x, "item") and getattr(x, "ndim", 1) == 0 else x


def _cu_seqlens(x):
    """int64 cu_seqlens (transformers' FlashAttentionKwargs are LongTensors) as int32 when every
    value fits; anything else goes to flashattn as it is, to be checked there."""
    import torch

    if isinstance(x, torch.Tensor) and x.dtype == torch.int64 and x.numel() and \
            int(x.min()) >= 0 and int(x.max()) < 2 ** 31:
        return x.to(torch.int32)
    return x


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, learnable_sink=None):
    """flashattn.flash_attn_func with learnable_sink (H,) (transformers' s_aux)."""
    return _fai.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                                alibi_slopes, deterministic, return_attn_probs,
                                learnable_sink=learnable_sink)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None,
                           learnable_sink=None):
    """flashattn.flash_attn_varlen_func with learnable_sink; max_seqlen_q/_k may be 0-d tensors
    and cu_seqlens int64 (both as transformers passes them)."""
    return _fai.flash_attn_varlen_func(
        q, k, v, _cu_seqlens(cu_seqlens_q), _cu_seqlens(cu_seqlens_k), _seqlen(max_seqlen_q),
        _seqlen(max_seqlen_k), dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs, block_table,
        learnable_sink=learnable_sink)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, learnable_sink=None):
    """flashattn.flash_attn_with_kvcache with learnable_sink (continuous batching's paged
    decode)."""
    return _fai.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse,
        learnable_sink=learnable_sink)


class _OwnKernelDigestFilter(logging.Filter):
    """Drops kernels' "no digest" warning for this package's own kernel folder (it is our code,
    installed with flashattn; a digest would break on its __pycache__), and nothing else."""

    def filter(self, record):
        msg = record.getMessage()
        return not (msg.startswith(f"Kernel 'flashattn' variant '{KERNEL_DIR.name}'")
                    and "digest" in msg)


_filter = _OwnKernelDigestFilter()


def _version(module):
    return getattr(module, "__version__", "unknown")


def enable():
    """Make attn_implementation="flash_attention_2" and NAME run on flashattn (idempotent);
    returns NAME. Sets LOCAL_KERNELS in os.environ (adding to entries already there)."""
    try:
        import kernels
        import transformers
    except ImportError as e:
        raise _error(f"needs transformers and kernels ({e}); expected e.g. pip install "
                     f"transformers=={TESTED['transformers'][0]} "
                     f"kernels=={TESTED['kernels'][0]}") from None
    major = transformers.__version__.split(".")[0]
    if not major.isdigit() or int(major) < 5:
        raise _error(f"transformers {transformers.__version__} is not supported; expected 5.x "
                     f"(tested: {', '.join(TESTED['transformers'])})")
    from transformers import modeling_flash_attention_utils as mfa
    from transformers.utils import is_flash_attn_2_available, is_kernels_available

    if not is_kernels_available():
        raise _error(f"transformers {transformers.__version__} does not accept kernels "
                     f"{_version(kernels)}; expected the kernels version it asks for (tested: "
                     f"transformers {TESTED['transformers'][0]} with kernels "
                     f"{TESTED['kernels'][0]})")
    fallbacks = getattr(mfa, "FLASH_ATTN_KERNEL_FALLBACK", {})
    repos = [fallbacks.get(f"flash_attention_{v}") for v in (2, 3)]
    if not all(isinstance(r, str) and r.count("/") == 1 for r in repos):
        raise _error(f"transformers {transformers.__version__} has no hub-kernel fallback for "
                     f"flash_attention_2 and _3 (FLASH_ATTN_KERNEL_FALLBACK); expected a 5.x "
                     f"version that has them (tested: {', '.join(TESTED['transformers'])})")
    repos.append(NAME)
    folder = str(KERNEL_DIR)
    if ":" in folder:
        raise _error(f"flashattn is installed under a path with ':' ({folder}), which "
                     f"LOCAL_KERNELS cannot hold; expected a path without ':'")
    current = os.environ.get("LOCAL_KERNELS", "")
    entries = dict(e.split("=", 1) for e in current.split(":") if "=" in e)
    for repo in repos:
        if entries.get(repo, folder) != folder:
            raise _error(f"LOCAL_KERNELS already maps {repo} to {entries[repo]}; expected it "
                         f"unset or {folder}")
    added = [f"{repo}={folder}" for repo in repos if repo not in entries]
    if added:
        os.environ["LOCAL_KERNELS"] = ":".join(([current] if current else []) + added)
    logging.getLogger("kernels._internals.validate").addFilter(_filter)  # (a set: idempotent)
    untested = [f"{name} {_version(m)}" for name, m in (("transformers", transformers),
                                                         ("kernels", kernels))
                if _version(m) not in TESTED[name]]
    if untested:
        warnings.warn(f"{_PREFIX}: {' and '.join(untested)} untested (tested: transformers "
                      f"{', '.join(TESTED['transformers'])}, kernels "
                      f"{', '.join(TESTED['kernels'])})", stacklevel=2)
    if is_flash_attn_2_available():
        warnings.warn(f"{_PREFIX}: flash-attn is installed, so transformers runs "
                      f"attn_implementation='flash_attention_2' on flash-attn; "
                      f"attn_implementation='{NAME}' runs on flashattn", stacklevel=2)
    return NAME
