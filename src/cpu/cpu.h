/* SPDX-License-Identifier: MIT */
/*
 * cpu.h — the CPU backend's entry points, called by api.c after validation.
 */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "../internal.h"
#include "../problem.h"
#include "kernels/kernels.h"

/* The microkernel set in use (chosen once per process) and a note on it: " + avx512_bf16" when
 * the avx512 set has the bf16 products, then "" or how FA_CPU_ISA was (or was not) honoured. */
const fa__cpu_kernels *fa__cpu_kernels_get(void);
const char *fa__cpu_kernels_note(void);

/* The names of the kernel sets compiled in, e.g. "ref avx2 avx512". */
const char *fa__cpu_kernels_compiled(void);

/* Attention forward on the CPU. Writes out (and lse) for every row of every batch, and for
 * varlen also the rows outside every sequence (0 and -inf). Returns FA_OK or FA_ERR_NO_MEMORY,
 * in which case nothing has been written. */
fa_status fa__cpu_forward(fa_context *ctx, const fa__problem *p);

/* fa__cpu_forward that calls first(arg) once all its memory is allocated, before it writes or
 * reads a tensor: a caller that must write before the forward (the KV cache's append) then
 * writes nothing when the forward fails for lack of memory. */
fa_status fa__cpu_forward_after(fa_context *ctx, const fa__problem *p, void (*first)(void *),
                                void *arg);

/* The products the forward computes a query row's scores with: the prefill's on packed K
 * blocks (qk), or decode's on K rows in place (qk_rows on fp32 Q, or qk_rows_bf16 on bf16
 * pairs), which sum each score in another order. */
typedef enum fa__score_path {
    FA_SCORES_PACKED,
    FA_SCORES_ROWS,
    FA_SCORES_ROWS_BF16
} fa__score_path;

/* The query positions [*from, sq) of batch b of p whose scores the forward computes with
 * decode's products (with the kernel set kern), and which of them; FA_SCORES_PACKED with *from
 * = sq: none. They are a suffix: a whole batch of few rows, or its short last block; the rest
 * are the prefill's. The backward recomputes P = exp(S - lse) from the forward's lse, so it
 * computes each S with the same products: a score summed in another order is off by its
 * rounding (up to about 1e-5 of dV in fp32, D = 256), which the saved lse no longer absorbs. */
fa__score_path fa__fwd_score_rows(const fa__problem *p, const fa__cpu_kernels *kern, int64_t b,
                                  int64_t *from);

/* Attention backward on the CPU: dq, dk, dv for every row (varlen rows outside every sequence
 * get zeros). Returns FA_OK or FA_ERR_NO_MEMORY, in which case nothing has been written. */
fa_status fa__cpu_backward(fa_context *ctx, const fa__problem *p);

/* The append of fa_forward_kvcache: k_new (B, S_new, Hk, D) and v_new (B, S_new, Hk, Dv)
 * written into the caches at absolute positions seqlens[b] + i (the cache views carry page table
 * and batch index, no leftpad), k_new rotated first when rotary.cos is set. 8-bit caches (their
 * views have a scale) are quantized into, with a scale per token written alongside (scale_token
 * for k, v) or the given scale per (batch, KV head). */
typedef struct fa__kvappend {
    fa__view k_new, v_new, k_cache, v_cache;
    const int32_t *seqlens;
    int64_t B, S_new, Hk, D, Dv;
    fa__rotary rotary;
    int scale_token[2];
} fa__kvappend;

void fa__cpu_kvcache_append(const fa__kvappend *a);

/* q (B, Sq, H, D) rotated into dst, contiguous fp32 (not rounded back to q's dtype): row i at
 * position seqlens[b] + (shift_rows ? i : 0). */
void fa__cpu_rotate_q(const fa__view *q, const fa__rotary *ro, const int32_t *seqlens,
                      int shift_rows, int64_t B, int64_t Sq, int64_t H, int64_t D, float *dst);

#endif /* FA_CPU_H */
