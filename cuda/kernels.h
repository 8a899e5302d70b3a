/* SPDX-License-Identifier: MIT */
/*
 * kernels.h — the CUDA plug-in's kernel launchers, called by plugin.cu (C linkage).
 *
 * p is a problem as the plug-in receives it (src/plugin_abi.h): data, lse and alibi are device
 * pointers, and a varlen problem's cu_q/cu_k are HOST arrays, which the launchers read for
 * their task counts; cu_q_dev/cu_k_dev are their device copies (NULL for fixed length). The
 * current device must be the data's. Each launcher enqueues its work on stream, launches
 * nothing when there is nothing to do, and returns the launch's error (cudaGetLastError).
 */
#ifndef FA_CUDA_KERNELS_H
#define FA_CUDA_KERNELS_H

#include "bwd_row.h"
#include "plugin_abi.h"
#include "problem.h"

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Stage 1 (fwd_simple.cu): every row of every sequence (out, and lse when requested), any
 * D <= 256 and Dv <= 256 (v's head dim, D or not), every feature; one thread per (batch, head,
 * row). The only forward for Dv != D. */
cudaError_t fa__simple_forward(const fa__problem *p, const int32_t *cu_q_dev,
                               const int32_t *cu_k_dev, cudaStream_t stream);

/* Varlen (fwd_simple.cu): out = 0 and lse = -inf on the rows outside every sequence, which
 * neither forward writes. No-op for fixed length. */
cudaError_t fa__clear_outside(const fa__problem *p, cudaStream_t stream);

/* fa_dropout_mask (fwd_simple.cu): p holds B, H, Sq, Sk and the dropout fields; the u8 mask is
 * p->out (element (b, h, i, j) at b·sb + h·sh + i·ss + j·sd). */
cudaError_t fa__dropout_mask_kernel(const fa__problem *p, cudaStream_t stream);

/* Stage 2 (fwd_mma.cu): does the mma.sync kernel handle p on a device of compute capability
 * sm = 10·major + minor (sm_80 and later: fp16, bf16; sm_75: fp16, Turing's instructions) whose
 * blocks can have smem bytes of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin)? Never
 * for Dv != D. Then fa__mma_forward, given the same sm, computes what fa__simple_forward would,
 * with key blocks of d128_block_n keys when the sm_80 kernel for D = 128 runs (D = 104..128; 32
 * or 64, see fa__mma_d128_block_n). KV caches too (the attention of
 * fa_forward_kvcache, any Sq): fa__mma_supported takes the host problem (it reads seqlens_k and
 * row_off; K and V must share their indices), fa__mma_forward the problem with every index on
 * the device (pd, below; it reads k's indices for both), and cu_q_dev = cu_k_dev = NULL. */
int fa__mma_supported(const fa__problem *p, int sm, int smem);
cudaError_t fa__mma_forward(const fa__problem *p, int sm, int d128_block_n, const int32_t *cu_q_dev,
                            const int32_t *cu_k_dev, cudaStream_t stream);

/* The D = 128 key block on a device of compute capability sm, tile being FA_CUDA_TILE_D128:
 * "128x32" gives 32, "128x64" 64, NULL or "" the default (64 on sm_90 and later, 32 before),
 * anything else 0. */
int fa__mma_d128_block_n(const char *tile, int sm);

/* ---- KV cache (fa_forward_kvcache) ----
 * pd is the problem with every index on the device: seqlens_k and the K/V views' row_off,
 * block_table and batch_idx point to device copies (plugin.cu uploads them). */

/* kvcache.cu: job's append of k_new/v_new into pd's caches at seqlens_dev[b] + i (k_new
 * rotated when job->rotary.cos is set), with src/cpu/kvcache.c's bits. */
cudaError_t fa__kv_append(const fa__problem *pd, const fa__kvcache_job *job,
                          const int32_t *seqlens_dev, cudaStream_t stream);
/* kvcache.cu: pd's q rotated (row i of batch b at position seqlens_dev[b] + (shift_rows ? i :
 * 0)) into dst, contiguous (B, Sq, H, D) of dtype dst_dtype (fp32: the CPU's values). */
cudaError_t fa__kv_rotate_q(const fa__problem *pd, const fa__kvcache_job *job,
                            const int32_t *seqlens_dev, void *dst, int32_t dst_dtype,
                            cudaStream_t stream);

/* decode.cu, the split-KV decode: the G·Sq query rows that share a KV head (G = H / Hk) in one
 * CTA, so each cache byte is read once; keys in fixed chunks of FA_DECODE_CHUNK (256) whose
 * partial (m, l, o) go to scratch and are merged in chunk order, so the result has the same bits
 * for every split count. Does it handle p (host view; only the index pointers' presence is
 * read)? Fixed length, no dropout, G·Sq <= 16, Dv = D <= 256 with rows of whole 16-byte groups;
 * k, v and out of one dtype (fp32, fp16, bf16), q of that dtype or fp32; k and v with sd = 1
 * and data, ss, sh, sb on 16-byte boundaries (q, out and lse: any strides); tiles that fit smem,
 * the bytes of shared memory a block can have (fa__decode_forward takes the same smem). */
int fa__decode_supported(const fa__problem *p, int smem);
/* The splits (CTAs along the keys of one (batch, KV head)) for num_splits (> 0: that many, at
 * most the chunks; 0: chosen from sms, the device's SM count), and the scratch the call needs for
 * max_sk, the most keys of any batch (fa__decode_forward's max_sk must be the same). */
int fa__decode_splits(const fa__problem *p, int64_t max_sk, int num_splits, int sms);
size_t fa__decode_scratch_bytes(const fa__problem *p, int64_t max_sk);
cudaError_t fa__decode_forward(const fa__problem *pd, int64_t max_sk, int splits, void *scratch,
                               int smem, cudaStream_t stream);

/* ---- fa_combine ---- */

/* combine.cu: every task of c (src/combine.h), its pointers on the current device. */
cudaError_t fa__combine_launch(const fa__combine *c, cudaStream_t stream);

/* ---- backward ---- */

/* The backward's per-row inputs (fa__bwd_rows_in) are described in bwd_row.h. */

/* bwd_simple.cu: delta and lse2 of every row inside a sequence; one thread per (head, row). */
cudaError_t fa__bwd_prepare(const fa__problem *p, const fa__bwd_rows_in *rows,
                            const int32_t *cu_q_dev, cudaStream_t stream);

/* bwd_simple.cu, the stage-1 backward (any D, Dv <= 256, fp32/fp16/bf16, every feature): dq of
 * every query row and dk, dv of every key row inside a sequence, from rows (fa__bwd_prepare).
 * dk and dv of a KV head sum over the query heads that share it, in head order; no atomics, so
 * the result does not depend on the launch. */
cudaError_t fa__simple_backward(const fa__problem *p, const fa__bwd_rows_in *rows,
                                const int32_t *cu_q_dev, const int32_t *cu_k_dev,
                                cudaStream_t stream);

/* Stage 2 (bwd_mma.cu): does the mma.sync backward handle p on a device of compute capability
 * sm (10·major + minor) whose blocks can have smem bytes of shared memory (as
 * fa__mma_supported)? Never for Dv != D. Then fa__mma_backward, given the same sm, computes dq
 * of every query row and dk, dv of every key row inside a sequence, for fp16/bf16 p, from rows
 * (fa__bwd_prepare), as fa__simple_backward would (deterministic, no atomics). */
int fa__mma_bwd_supported(const fa__problem *p, int sm, int smem);
cudaError_t fa__mma_backward(const fa__problem *p, int sm, const fa__bwd_rows_in *rows,
                             const int32_t *cu_q_dev, const int32_t *cu_k_dev, cudaStream_t stream);

/* bwd_simple.cu: p->dsinks from the sinks, the forward's lse and rows' delta (fa__bwd_prepare;
 * rows->delta may be NULL when p has no row inside a sequence): one CTA a head, fixed order,
 * fp64 sums, no atomics. p->dsinks must be set. */
cudaError_t fa__bwd_dsinks(const fa__problem *p, const fa__bwd_rows_in *rows, cudaStream_t stream);

/* Varlen (bwd_simple.cu): dq = 0 on the query rows and dk = dv = 0 on the key rows outside
 * every sequence, which neither backward writes. No-op for fixed length. */
cudaError_t fa__bwd_clear_outside(const fa__problem *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FA_CUDA_KERNELS_H */
