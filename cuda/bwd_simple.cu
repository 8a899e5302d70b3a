/* SPDX-License-Identifier: MIT */
/*
 * bwd_simple.cu — the stage-1 CUDA backward (DESIGN.md §6): simple, deterministic and correct,
 * every feature at any D, Dv <= 256 in fp32, fp16 and bf16. One thread per task of bwd_row.h:
 * Δ and lse2 of one row, dq of one query row, dk and dv of one key row, or zeroing a varlen
 * row outside every sequence; grids as simple_grid.cuh says, offsets int64. The sinks' gradient
 * is one CTA a head, a fixed-order fp64 reduction over its rows.
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

/* dsinks[h] = -Σ_{b,i} exp(s_h - lse_bhi)·Δ_bhi (bwd.c's dsink_task), one CTA a head: thread
 * tid sums rows tid, tid + FA_SIMPLE_THREADS, ... in fp64, then a fixed tree over the threads.
 * Task rows r < nrows as fa__fwd_task's: b·Sq + i, or the packed row r0 + r (r0 = cu_q[0]).
 * Rows with lse = -inf add nothing; a head with s_h = -inf gets 0. */
static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    bwd_dsinks_kernel(const fa__problem p, const fa__bwd_rows_in rows, int64_t r0, int64_t nrows) {
    extern __shared__ __align__(128) unsigned char smem[]; // [FA_SIMPLE_THREADS] fp64 sums
    const int tid = threadIdx.x;
    for (int64_t h = blockIdx.x; h < p.H; h += gridDim.x) {
        const double s = p.sinks[h * p.sinks_sh];
        double acc = 0.0;
        for (int64_t r = tid; s != -INFINITY && r < nrows; r += FA_SIMPLE_THREADS) {
            const int64_t at = p.cu_q ? h * p.lse_sh + (r0 + r) * p.lse_ss
                                      : r / p.Sq * p.lse_sb + h * p.lse_sh + r % p.Sq * p.lse_ss;
            const float lse = p.lse[at];
            if (lse != -INFINITY)
                acc -= exp(s - (double)lse) * (double)rows.delta[h * rows.R + r0 + r];
        }
        *(double *)(smem + 8 * tid) = acc;
        __syncthreads();
        for (int w = FA_SIMPLE_THREADS / 2; w > 0; w >>= 1) {
            if (tid < w)
                *(double *)(smem + 8 * tid) += *(double *)(smem + 8 * (tid + w));
            __syncthreads();
        }
        if (tid == 0)
            p.dsinks[h * p.dsinks_sh] = (float)*(double *)smem;
        __syncthreads();
    }
}

extern "C" cudaError_t fa__bwd_dsinks(const fa__problem *p, const fa__bwd_rows_in *rows,
                                      cudaStream_t stream) {
    const unsigned blocks = (unsigned)(p->H < 65536 ? p->H : 65536);
    bwd_dsinks_kernel<<<blocks, FA_SIMPLE_THREADS, 8 * FA_SIMPLE_THREADS, stream>>>(
        *p, *rows, p->cu_q ? p->cu_q[0] : 0, fa__fwd_rows(p));
    return cudaGetLastError();
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
