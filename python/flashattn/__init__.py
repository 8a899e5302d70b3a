"""flashattn: FlashAttention in C, with flash-attn 2.8's Python API for NumPy and PyTorch.

    from flashattn import flash_attn_func      # instead of: from flash_attn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)

The package is pure Python over libflashattn (ctypes): nothing is compiled against Python or
PyTorch, so one wheel serves every CPython >= 3.9 and every torch version. `python -m flashattn`
checks the installation against an fp64 reference.

PyTorch tensors may be on the CPU or on a CUDA device (forward, backward and KV cache through the
library's CUDA plug-in, on torch's current stream; `flashattn.cuda_available()` says whether it
can run there).
"""

import sys as _sys

from ._lib import (
    FlashAttnError,
    FlashAttnMemoryError,
    FlashAttnRuntimeError,
    FlashAttnTypeError,
    FlashAttnValueError,
    build_info,
    cuda_available,
    library_path,
)
from ._lib import version as library_version
from ._quant import quantize_kvcache
from .flash_attn_interface import (
    flash_attn_combine,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = "0.1.0"

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "quantize_kvcache",
    "FlashAttnError",
    "FlashAttnValueError",
    "FlashAttnTypeError",
    "FlashAttnRuntimeError",
    "FlashAttnMemoryError",
    "library_path",
    "library_version",
    "build_info",
    "cuda_available",
    "__version__",
]

# With torch already imported, register the custom ops now, outside any torch.compile trace.
if "torch" in _sys.modules:
    from . import flash_attn_interface as _fai

    try:
        _fai._torch()
    except Exception:  # a broken torch must not break `import flashattn`
        pass
