/* SPDX-License-Identifier: MIT */
/*
 * fwd_simple.cu — stage 1 of the CUDA forward (DESIGN.md §6): simple and correct, the oracle
 * for the faster kernels. One thread per task of fwd_row.h: the forward of one query row (any
 * D, Dv <= 256, every feature), clearing one varlen row outside every sequence, or four columns
 * of the dropout mask. Grids are one-dimensional (tasks in gridDim.x, whose limit is 2^31 - 1) and
 * the kernels loop, so any task count fits; offsets are int64.
 */
#include "fwd_row.h"
#include "kernels.h"
#include "simple_grid.cuh"

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    simple_forward_kernel(const fa__problem p, const int32_t *cu_q, const int32_t *cu_k,
                          int64_t rows) {
    const int64_t n = rows * p.H;
    for (int64_t t = FA_TASK_FIRST; t < n; t += FA_TASK_STEP)
        fa__fwd_task(&p, cu_q, cu_k, rows, t);
}

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    clear_outside_kernel(const fa__problem p, int64_t head_end, int64_t tail_begin, int64_t n) {
    for (int64_t t = FA_TASK_FIRST; t < n; t += FA_TASK_STEP)
        fa__clear_task(&p, head_end, tail_begin, t);
}

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    dropout_mask_kernel(const fa__problem p, int64_t n) {
    for (int64_t t = FA_TASK_FIRST; t < n; t += FA_TASK_STEP)
        fa__mask_task(&p, t);
}

extern "C" cudaError_t fa__simple_forward(const fa__problem *p, const int32_t *cu_q_dev,
                                          const int32_t *cu_k_dev, cudaStream_t stream) {
    const int64_t rows = fa__fwd_rows(p);
    if (rows == 0)
        return cudaSuccess;
    simple_forward_kernel<<<fa__simple_blocks(rows * p->H), FA_SIMPLE_THREADS, 0, stream>>>(
        *p, cu_q_dev, cu_k_dev, rows);
    return cudaGetLastError();
}

extern "C" cudaError_t fa__clear_outside(const fa__problem *p, cudaStream_t stream) {
    const int64_t n = fa__clear_tasks(p);
    if (n == 0)
        return cudaSuccess;
    clear_outside_kernel<<<fa__simple_blocks(n), FA_SIMPLE_THREADS, 0, stream>>>(*p, p->cu_q[0],
                                                                                 p->cu_q[p->B], n);
    return cudaGetLastError();
}

extern "C" cudaError_t fa__dropout_mask_kernel(const fa__problem *p, cudaStream_t stream) {
    const int64_t n = fa__mask_tasks(p);
    if (n == 0)
        return cudaSuccess;
    dropout_mask_kernel<<<fa__simple_blocks(n), FA_SIMPLE_THREADS, 0, stream>>>(*p, n);
    return cudaGetLastError();
}
