"""Context parallelism over torch.distributed: attention over a sequence whose tokens are split
across the ranks of a process group (gloo on CPUs, NCCL on GPUs), forward and backward.

    import torch.distributed as dist
    from flashattn import parallel
    q, k, v = (parallel.split_sequence(x, dist.get_rank(), dist.get_world_size()) for x in qkv)
    out = parallel.all_gather_attention(q, k, v, causal=True)   # this rank's rows
    full = parallel.gather_sequence(out)                        # every rank's rows, in order

all_gather_attention gathers K and V once and attends this rank's queries over them (Llama 3's
context parallelism; every feature of flash_attn_func but dropout), all_gather_attention_varlen
the same over a packed stream of sequences (flash_attn_varlen_func's cu_seqlens);
ring_attention passes K/V blocks around the ring, overlapping each transfer with a block's
compute (causal or full attention, GQA, softcap). The split is "contiguous" (rank r holds
tokens [r·S, (r+1)·S)) or "zigzag" (the sequence in 2·W chunks, rank r holding chunks r and
2·W-1-r, which balances causal work). Shapes, dtypes and the split are checked on every rank
first (one small all_gather), so a rank that differs fails every rank with the same message.
"""

from ._all_gather import all_gather_attention
from ._all_gather_varlen import all_gather_attention_varlen
from ._ring import ring_attention
from ._split import SPLITS, gather_sequence, split_sequence

__all__ = ["SPLITS", "all_gather_attention", "all_gather_attention_varlen", "gather_sequence",
           "ring_attention", "split_sequence"]
