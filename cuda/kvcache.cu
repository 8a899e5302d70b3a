/* SPDX-License-Identifier: MIT */
/*
 * kvcache.cu — what fa_forward_kvcache does on the GPU before attention: the in-place append of
 * k_new/v_new into the cache (through its page table or batch index), k_new rotated on the way,
 * and q rotated into a scratch copy. The arithmetic is src/cpu/kvcache.c's, product by product
 * (no fused multiply-add), so the appended cache has the CPU's bits.
 *
 * Both kernels run one thread per output element, or per rotated pair: a row of D elements with
 * rotary_dim rd has W = D - rd/2 tasks, e < rd/2 rotating the pair (2e, 2e+1) (interleaved) or
 * (e, e + rd/2), the others copying element rd + (e - rd/2). Neighbouring threads take
 * neighbouring elements of one row. Grids are one-dimensional (simple_grid.cuh).
 */
#include "fwd_row.h"
#include "kernels.h"
#include "simple_grid.cuh"

/* The rotation's cosine and sine of pair t at position pos. */
static __device__ __forceinline__ void rot_cs(const fa__rotary &ro, int64_t pos, int64_t t,
                                              float *c, float *s) {
    const int64_t at = pos * ro.s_row + t * ro.s_col;
    *c = fa__row_load(ro.cos, ro.dtype, at);
    *s = fa__row_load(ro.sin, ro.dtype, at);
}

/* Element e of a row's W tasks: the rotated pair (*a, *b) (returns 1) or the copied element *a
 * (returns 0). */
static __device__ __forceinline__ int rot_task(const fa__rotary &ro, int64_t e, int64_t *a,
                                               int64_t *b) {
    const int64_t half = ro.cos ? ro.rd / 2 : 0;
    if (e >= half) {
        *a = 2 * half + (e - half);
        return 0;
    }
    *a = ro.interleaved ? 2 * e : e;
    *b = ro.interleaved ? 2 * e + 1 : e + half;
    return 1;
}

/* x1·c - x2·s and x1·s + x2·c, each product rounded alone as in C. */
static __device__ __forceinline__ void rotate(float x1, float x2, float c, float s, float *y1,
                                              float *y2) {
    *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *y2 = __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c));
}

/* Append task t of [B, S_new, Hk, Wk + Dv]: the first Wk of a row are k's (rotated, k rows of
 * D), the next Dv v's. The caches' views carry the page table or batch index, not the leftpad. */
static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    kv_append_kernel(fa__kvcache_job job, fa__view kc, fa__view vc, const int32_t *seqlens,
                     int64_t Hk, int64_t D, int64_t Dv, int64_t tasks) {
    const int64_t wk = D - (job.rotary.cos ? job.rotary.rd / 2 : 0), w = wk + Dv;
    for (int64_t t = FA_TASK_FIRST; t < tasks; t += FA_TASK_STEP) {
        const int64_t e = t % w, row = t / w, h = row % Hk, i = row / Hk % job.S_new;
        const int64_t b = row / Hk / job.S_new, pos = seqlens[b] + i;
        if (e >= wk) { /* v: a copy */
            const int64_t d = e - wk;
            const float x = fa__row_load(job.v_new.data, job.v_new.dtype,
                                         fa__row_at(&job.v_new, b, i, h) + d * job.v_new.sd);
            fa__row_store(vc.data, vc.dtype, fa__view_at(&vc, b, pos, h) + d * vc.sd, x);
            continue;
        }
        const int64_t src = fa__row_at(&job.k_new, b, i, h), dst = fa__view_at(&kc, b, pos, h);
        int64_t a, c;
        if (!rot_task(job.rotary, e, &a, &c)) {
            const float x = fa__row_load(job.k_new.data, job.k_new.dtype, src + a * job.k_new.sd);
            fa__row_store(kc.data, kc.dtype, dst + a * kc.sd, x);
            continue;
        }
        float cs, sn, y1, y2;
        rot_cs(job.rotary, pos, e, &cs, &sn);
        rotate(fa__row_load(job.k_new.data, job.k_new.dtype, src + a * job.k_new.sd),
               fa__row_load(job.k_new.data, job.k_new.dtype, src + c * job.k_new.sd), cs, sn, &y1,
               &y2);
        fa__row_store(kc.data, kc.dtype, dst + a * kc.sd, y1);
        fa__row_store(kc.data, kc.dtype, dst + c * kc.sd, y2);
    }
}

/* Rotation task t of [B, Sq, H, W]: q into dst, contiguous (B, Sq, H, D) of dtype dst_dtype. */
static __global__ void __launch_bounds__(FA_SIMPLE_THREADS)
    kv_rotate_q_kernel(fa__view q, fa__rotary ro, const int32_t *seqlens, int32_t shift_rows,
                       int64_t Sq, int64_t H, int64_t D, void *dst, int32_t dst_dtype,
                       int64_t tasks) {
    const int64_t w = D - ro.rd / 2;
    for (int64_t t = FA_TASK_FIRST; t < tasks; t += FA_TASK_STEP) {
        const int64_t e = t % w, row = t / w, h = row % H, i = row / H % Sq, b = row / H / Sq;
        const int64_t src = fa__row_at(&q, b, i, h), out = row * D;
        int64_t a, c;
        if (!rot_task(ro, e, &a, &c)) {
            fa__row_store(dst, dst_dtype, out + a, fa__row_load(q.data, q.dtype, src + a * q.sd));
            continue;
        }
        float cs, sn, y1, y2;
        rot_cs(ro, seqlens[b] + (shift_rows ? i : 0), e, &cs, &sn);
        rotate(fa__row_load(q.data, q.dtype, src + a * q.sd),
               fa__row_load(q.data, q.dtype, src + c * q.sd), cs, sn, &y1, &y2);
        fa__row_store(dst, dst_dtype, out + a, y1);
        fa__row_store(dst, dst_dtype, out + c, y2);
    }
}

extern "C" cudaError_t fa__kv_append(const fa__problem *pd, const fa__kvcache_job *job,
                                     const int32_t *seqlens_dev, cudaStream_t stream) {
    const int64_t wk = pd->D - (job->rotary.cos ? job->rotary.rd / 2 : 0);
    const int64_t tasks = pd->B * job->S_new * pd->Hk * (wk + pd->Dv);
    if (tasks == 0)
        return cudaSuccess;
    fa__view kc = pd->k, vc = pd->v;
    kc.row_off = vc.row_off = NULL; /* positions are absolute */
    kv_append_kernel<<<fa__simple_blocks(tasks), FA_SIMPLE_THREADS, 0, stream>>>(
        *job, kc, vc, seqlens_dev, pd->Hk, pd->D, pd->Dv, tasks);
    return cudaGetLastError();
}

extern "C" cudaError_t fa__kv_rotate_q(const fa__problem *pd, const fa__kvcache_job *job,
                                       const int32_t *seqlens_dev, void *dst, int32_t dst_dtype,
                                       cudaStream_t stream) {
    const int64_t tasks = pd->B * pd->Sq * pd->H * (pd->D - job->rotary.rd / 2);
    if (tasks == 0)
        return cudaSuccess;
    kv_rotate_q_kernel<<<fa__simple_blocks(tasks), FA_SIMPLE_THREADS, 0, stream>>>(
        pd->q, job->rotary, seqlens_dev, job->shift_rows, pd->Sq, pd->H, pd->D, dst, dst_dtype,
        tasks);
    return cudaGetLastError();
}
