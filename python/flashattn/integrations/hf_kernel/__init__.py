"""The kernel folder that `flashattn.integrations.transformers.enable()` names in LOCAL_KERNELS:
the `kernels` package imports this file (by path, under metadata.json's id) when transformers
asks for kernels-community/flash-attn2 or flashattn/flashattn, and transformers reads these
three functions' signatures to decide which arguments to pass."""

from flashattn.integrations.transformers import (  # noqa: F401
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)
