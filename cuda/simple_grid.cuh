/* SPDX-License-Identifier: MIT */
/*
 * simple_grid.cuh — the launch shape of the stage-1 kernels (fwd_simple.cu, bwd_simple.cu): one
 * thread per task, one-dimensional grids of FA_SIMPLE_THREADS-thread blocks capped at the
 * gridDim.x limit, and kernels that loop over their tasks, so any task count fits.
 */
#ifndef FA_CUDA_SIMPLE_GRID_CUH
#define FA_CUDA_SIMPLE_GRID_CUH

#include <stdint.h>

enum { FA_SIMPLE_THREADS = 128 };

/* Blocks for n > 0 tasks, one per thread, capped at the gridDim.x limit. */
static inline unsigned fa__simple_blocks(int64_t n) {
    const int64_t blocks = (n + FA_SIMPLE_THREADS - 1) / FA_SIMPLE_THREADS;
    return (unsigned)(blocks < 0x7fffffff ? blocks : 0x7fffffff);
}

/* The first task of this thread and the step to its next. */
#define FA_TASK_FIRST ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define FA_TASK_STEP ((int64_t)gridDim.x * blockDim.x)

#endif /* FA_CUDA_SIMPLE_GRID_CUH */
