/* SPDX-License-Identifier: MIT */
/*
 * ref.c — the portable microkernels: plain C, always built, the fallback on every CPU and the
 * baseline the SIMD kernels are tested against.
 */
#include "../kernels.h"

#include "../../../convert.h"
#include "flashattn.h"

#include <math.h>

/* Row i of S accumulates d rank-1 updates along unit-stride rows of Kt, which compilers
 * vectorize without reassociating a reduction. */
void fa__qk_ref(int m, int n, int d, const float *q, int64_t ldq, const float *kt, int64_t ldk,
                   float *s, int64_t lds) {
    for (int i = 0; i < m; i++) {
        const float *qi = q + i * ldq; // qi: [d]
        float *si = s + i * lds;       // si: [n]
        for (int j = 0; j < n; j++) si[j] = 0.0f;
        for (int t = 0; t < d; t++) {
            const float a = qi[t];
            const float *kt_t = kt + t * ldk; // kt_t: [n]
            for (int j = 0; j < n; j++) si[j] += a * kt_t[j];
        }
    }
}

/* Each call's P V is summed apart and then added to alpha O: long rows accumulate in blocks,
 * which keeps the rounding error of a sum over many keys small. */
void fa__pv_ref(int m, int n, int d, const float *p, int64_t ldp, const float *v, int64_t ldv,
                   const float *alpha, float *o, int64_t ldo) {
    enum { D_MAX = 256 }; /* the library's largest head dim */
    float acc[D_MAX];
    for (int i = 0; i < m; i++) {
        float *oi = o + i * ldo; // oi: [d]
        for (int t0 = 0; t0 < d; t0 += D_MAX) {
            const int dt = d - t0 < D_MAX ? d - t0 : D_MAX;
            for (int t = 0; t < dt; t++) acc[t] = 0.0f;
            for (int j = 0; j < n; j++) {
                const float pij = p[i * ldp + j];
                const float *vj = v + j * ldv + t0; // vj: [dt]
                for (int t = 0; t < dt; t++) acc[t] += pij * vj[t];
            }
            for (int t = 0; t < dt; t++) oi[t0 + t] = alpha[i] * oi[t0 + t] + acc[t];
        }
    }
}

void fa__to_f32_ref(int n, const void *src, int32_t dtype, float scale, float *dst) {
    for (int t = 0; t < n; t++) dst[t] = scale * fa__row_load(src, dtype, t);
}

void fa__transpose_ref(int n, int d, const float *src, int64_t lds, float *dst, int64_t ldd) {
    for (int j = 0; j < n; j++)
        for (int t = 0; t < d; t++) dst[t * ldd + j] = src[j * lds + t];
}

void fa__from_f32_ref(int n, const float *src, float scale, int32_t dtype, void *dst) {
    for (int t = 0; t < n; t++) {
        const float x = src[t] * scale;
        if (dtype == FA_DTYPE_F32) ((float *)dst)[t] = x;
        else ((uint16_t *)dst)[t] = dtype == FA_DTYPE_F16 ? fa__f32_to_f16(x) : fa__f32_to_bf16(x);
    }
}

static float row_max_ref(int n, const float *x) {
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

float fa__exp2_sum_ref(int n, float *x, float m) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        x[j] = exp2f(x[j] - m);
        sum += x[j];
    }
    return sum;
}

/* The online softmax step (kernels.h): per row the max, then the exp2 and the sum. */
void fa__softmax_rows_ref(int rows, int n, float *x, int64_t ldx, float *m, float *sum) {
    fa__softmax_rows_2pass(rows, n, x, ldx, m, sum, row_max_ref, fa__exp2_sum_ref);
}

const fa__cpu_kernels fa__cpu_kernels_ref = {
    .name = "ref",
    .gemm_rows = 1,
    .decode_rows_f32 = 32, /* no decode products: bounds split batches only */
    .qk = fa__qk_ref,
    .pv = fa__pv_ref,
    .to_f32 = fa__to_f32_ref,
    .from_f32 = fa__from_f32_ref,
    .transpose = fa__transpose_ref,
    .softmax_rows = fa__softmax_rows_ref,
    .exp2_sum = fa__exp2_sum_ref,
};
