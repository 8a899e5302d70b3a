/* SPDX-License-Identifier: MIT */
/*
 * bwd_simple.cu — the stage-1 CUDA backward (DESIGN.md §6): simple, deterministic and correct,
 * every feature at any D <= 256 in fp32, fp16 and bf16. One thread per task of bwd_row.h:
 * Δ and lse2 of one row, dq of one query row, dk and dv of one key row, or zeroing a varlen
 * row outside every sequence; grids as simple_grid.cuh says, offsets int64.
 */
#include "bwd_row.h"
#include "kernels.h"
#include "simple_grid.cuh"

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    bwd_prepare_kernel(const fa__problem p, const fa__bwd_rows_in rows, const int32_t *cu_q,
                       int64_t nrows) {
    const int64_t n = nrows * p.H;
    for (int64_t t = FA_TASK_FIRST; t < n; t += FA_TASK_STEP)
        fa__bwd_prepare_task(&p, &rows, cu_q, nrows, t);
}

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    bwd_dq_kernel(const fa__problem p, const fa__bwd_rows_in rows, const int32_t *cu_q,
                  const int32_t *cu_k, int64_t nrows) {
    const int64_t n = nrows * p.H;
    for (int64_t t = FA_TASK_FIRST; t < n; t += FA_TASK_STEP)
        fa__bwd_dq_task(&p, &rows, cu_q, cu_k, nrows, t);
}

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    bwd_dkdv_kernel(const fa__problem p, const fa__bwd_rows_in rows, const int32_t *cu_q,
                    const int32_t *cu_k, int64_t krows) {
    const int64_t n = krows * p.Hk;
    for (int64_t t = FA_TASK_FIRST; t < n; t += FA_TASK_STEP)
        fa__bwd_dkdv_task(&p, &rows, cu_q, cu_k, krows, t);
}

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    bwd_clear_kernel(const fa__problem p, int64_t nq, int64_t q_end, int64_t q_begin, int64_t k_end,
                     int64_t k_begin, int64_t n) {
    for (int64_t t = FA_TASK_FIRST; t < n; t += FA_TASK_STEP)
        fa__bwd_clear_task(&p, nq, q_end, q_begin, k_end, k_begin, t);
}

extern "C" cudaError_t fa__bwd_prepare(const fa__problem *p, const fa__bwd_rows_in *rows,
                                       const int32_t *cu_q_dev, cudaStream_t stream) {
    const int64_t nrows = fa__fwd_rows(p);
    if (nrows == 0)
        return cudaSuccess;
    bwd_prepare_kernel<<<fa__simple_blocks(nrows * p->H), FA_SIMPLE_THREADS, 0, stream>>>(
        *p, *rows, cu_q_dev, nrows);
    return cudaGetLastError();
}

extern "C" cudaError_t fa__simple_backward(const fa__problem *p, const fa__bwd_rows_in *rows,
                                           const int32_t *cu_q_dev, const int32_t *cu_k_dev,
                                           cudaStream_t stream) {
    const int64_t nrows = fa__fwd_rows(p), krows = fa__bwd_key_rows(p);
    if (nrows > 0) {
        bwd_dq_kernel<<<fa__simple_blocks(nrows * p->H), FA_SIMPLE_THREADS, 0, stream>>>(
            *p, *rows, cu_q_dev, cu_k_dev, nrows);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
    }
    if (krows > 0) {
        bwd_dkdv_kernel<<<fa__simple_blocks(krows * p->Hk), FA_SIMPLE_THREADS, 0, stream>>>(
            *p, *rows, cu_q_dev, cu_k_dev, krows);
        return cudaGetLastError();
    }
    return cudaSuccess;
}

extern "C" cudaError_t fa__bwd_clear_outside(const fa__problem *p, cudaStream_t stream) {
    const int64_t nq = fa__bwd_clear_q_tasks(p), n = nq + fa__bwd_clear_k_tasks(p);
    if (n == 0)
        return cudaSuccess;
    bwd_clear_kernel<<<fa__simple_blocks(n), FA_SIMPLE_THREADS, 0, stream>>>(
        *p, nq, p->cu_q[0], p->cu_q[p->B], p->cu_k[0], p->cu_k[p->B], n);
    return cudaGetLastError();
}
