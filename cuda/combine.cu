/* SPDX-License-Identifier: MIT */
/*
 * combine.cu — fa_combine on the GPU: one thread per task of src/combine.h (a row's group of
 * FA_COMBINE_COLS columns), the CPU's arithmetic; neighbouring threads take neighbouring column
 * groups of a row, so a warp reads contiguous partial outputs. Grids as simple_grid.cuh.
 */
#include "combine.h"
#include "kernels.h"
#include "simple_grid.cuh"

static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    combine_kernel(const fa__combine c, int64_t tasks) {
    for (int64_t t = FA_TASK_FIRST; t < tasks; t += FA_TASK_STEP)
        fa__combine_task(&c, t);
}

extern "C" cudaError_t fa__combine_launch(const fa__combine *c, cudaStream_t stream) {
    const int64_t tasks = c->B * c->S * c->H * ((c->D + FA_COMBINE_COLS - 1) / FA_COMBINE_COLS);
    if (tasks == 0)
        return cudaSuccess;
    combine_kernel<<<fa__simple_blocks(tasks), FA_SIMPLE_THREADS, 0, stream>>>(*c, tasks);
    return cudaGetLastError();
}
