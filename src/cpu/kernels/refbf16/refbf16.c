/* SPDX-License-Identifier: MIT */
/*
 * refbf16.c — the ref set plus portable C versions of the avx512bf16 set's bf16 products and
 * steps (kernels.h), so the forward's and backward's bf16 pair paths (fwd.c, bwd.c) run and are
 * tested on every CPU. Chosen only by FA_CPU_ISA=refbf16, never automatically: scalar, and slow.
 *
 * The products follow vdpbf16ps: each pair's two products are added to an fp32 accumulator,
 * the odd element's first, rounded to nearest even; bf16 inputs that are denormal count as 0
 * (DAZ) and denormal sums become 0 (FTZ). Where this differs from the instruction: a product
 * whose magnitude falls below FLT_MIN is rounded to fp32 here before it is added (the instruction
 * leaves that step undocumented), and the sums run in another order than the SIMD tiles' (the
 * decode product's 16 lanes, say), so results agree to rounding, not bit for bit.
 * The decode products (qk_rows, pv_rows and their bf16 forms) are here because fwd.c takes the
 * bf16 ones only where a set has qk_rows; the prefetch lists they get are ignored.
 */
#include "../kernels.h"

#include "../../../convert.h"
#include "flashattn.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* The most columns of any product's output: the library's largest head dim (keys come at most
 * FA_BC = 128 per call). */
enum { D_MAX = 256 };

/* A bf16 as vdpbf16ps reads it: a denormal is a zero of its sign (DAZ). */
static inline float bf16_daz(uint32_t h) {
    h &= 0xFFFFu;
    return fa__bf16_to_f32((uint16_t)((h & 0x7F80u) ? h : h & 0x8000u));
}

/* An fp32 sum as vdpbf16ps writes it: a denormal becomes a zero of its sign (FTZ). */
static inline float ftz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

/* acc + a·b over one pair (words a, b), the odd elements' product first. */
static inline float dot_pair(float acc, uint32_t a, uint32_t b) {
    acc = ftz(acc + bf16_daz(a >> 16) * bf16_daz(b >> 16));
    return ftz(acc + bf16_daz(a) * bf16_daz(b));
}

/* fp32 -> bf16 as vcvtneps2bf16: round to nearest even, NaN quieted (convert.h), and a denormal
 * to a zero of its sign. */
static inline uint16_t round_bf16(float x) {
    const uint32_t u = fa__f32_bits(x);
    return (u & 0x7F800000u) ? fa__f32_to_bf16(x) : (uint16_t)(u >> 16 & 0x8000u);
}

/* ---- the decode products on rows in place (the other fp32 entries are the ref set's) ---- */

/* Decode's S = Q Kᵀ on K rows of any dtype in place: each row widened once, then a dot product
 * per query row. */
static void qk_rows_refbf16(int m, int n, int d, const float *q, int64_t ldq, const void *const *k,
                            int32_t dtype, float *s, int64_t lds, const fa__prefetch *pf) {
    (void)pf;
    float kj[D_MAX];
    for (int j = 0; j < n; j++) {
        fa__to_f32_ref(d, k[j], dtype, 1.0f, kj);
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int t = 0; t < d; t++)
                acc += q[i * ldq + t] * kj[t];
            s[i * lds + j] = acc;
        }
    }
}

/* pv_rows on rows of dtype FA_DT (an 8-bit cache's: the stored values, fa__row_load), a
 * constant where FA_BY_ROW_DTYPE inlines it. */
static inline void pv_rows_dt(int m, int n, int d, const float *p, int64_t ldp,
                              const void *const *v, int32_t dtype, const float *alpha, float *o,
                              int64_t ldo) {
    float acc[D_MAX];
    for (int i = 0; i < m; i++) {
        float *oi = o + i * ldo; // oi: [d]
        for (int t = 0; t < d; t++)
            acc[t] = 0.0f;
        for (int j = 0; j < n; j++) {
            const float pij = p[i * ldp + j];
            for (int t = 0; t < d; t++)
                acc[t] += pij * fa__row_load(v[j], dtype, t);
        }
        for (int t = 0; t < d; t++)
            oi[t] = alpha[i] * oi[t] + acc[t];
    }
}

/* Decode's O = diag(alpha) O + P V on V rows of any dtype in place, P V summed apart first. */
static void pv_rows_refbf16(int m, int n, int d, const float *p, int64_t ldp, const void *const *v,
                            int32_t dtype, const float *alpha, float *o, int64_t ldo,
                            const fa__prefetch *pf) {
    (void)pf;
    FA_BY_ROW_DTYPE(dtype, pv_rows_dt(m, n, d, p, ldp, v, FA_DT, alpha, o, ldo));
}

/* ---- the bf16 products and steps ---- */

/* C = (beta ? diag(beta) C : 0) + scale A B over k pairs: A's pair (i, t) is a[i·lda + t], or
 * a[t·lda + i] when at (A transposed); B: [k, n] pairs (ldb). Row i sums in acc first, then
 * C = scale · acc + beta C, as bf16.c's tiles do (not fused here). */
static void gemm_pairs(int m, int n, int k, const uint32_t *a, int64_t lda, int at,
                       const uint32_t *b, int64_t ldb, const float *beta, float scale, float *c,
                       int64_t ldc) {
    float acc[D_MAX];
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++)
            acc[j] = 0.0f;
        for (int t = 0; t < k; t++) {
            const uint32_t pair = at ? a[t * lda + i] : a[i * lda + t];
            const uint32_t *bt = b + t * ldb; // bt: [n] pairs
            for (int j = 0; j < n; j++)
                acc[j] = dot_pair(acc[j], pair, bt[j]);
        }
        float *ci = c + i * ldc; // ci: [n]
        for (int j = 0; j < n; j++)
            ci[j] = beta ? beta[i] * ci[j] + scale * acc[j] : scale * acc[j];
    }
}

static void qk_bf16_refbf16(int m, int n, int d2, const uint32_t *q, int64_t ldq, const uint32_t *k,
                            int64_t ldk, float scale, float *s, int64_t lds) {
    gemm_pairs(m, n, d2, q, ldq, 0, k, ldk, NULL, scale, s, lds);
}

static void pv_bf16_refbf16(int m, int n2, int d, const uint32_t *p, int64_t ldp, const uint32_t *v,
                            int64_t ldv, const float *alpha, float *o, int64_t ldo) {
    gemm_pairs(m, d, n2, p, ldp, 0, v, ldv, alpha, 1.0f, o, ldo);
}

static void pv_bf16_t_refbf16(int m, int n2, int d, const uint32_t *pt, int64_t ldp,
                              const uint32_t *v, int64_t ldv, const float *alpha, float *o,
                              int64_t ldo) {
    gemm_pairs(m, d, n2, pt, ldp, 1, v, ldv, alpha, 1.0f, o, ldo);
}

/* Word t of a row of bf16 (2-byte aligned only): elements 2t and 2t + 1 as a pair. */
static inline uint32_t row_pair(const void *row, int t) {
    uint32_t w;
    memcpy(&w, (const char *)row + 4 * (int64_t)t, sizeof w);
    return w;
}

/* Decode's S = scale · Q Kᵀ, K rows of d2 pairs read in place. */
static void qk_rows_bf16_refbf16(int m, int n, int d2, const uint32_t *q, int64_t ldq,
                                 const void *const *k, float scale, float *s, int64_t lds,
                                 const fa__prefetch *pf) {
    (void)pf;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int t = 0; t < d2; t++)
                acc = dot_pair(acc, q[i * ldq + t], row_pair(k[j], t));
            s[i * lds + j] = scale * acc;
        }
}

/* Decode's O = diag(alpha) O + P V, P as pairs of keys (2t, 2t + 1) and V as n bf16 rows in
 * place. An odd last key's pair has no second row: its product is left out (bf16.c pairs that
 * key's row with itself times P's zero half, which makes 0 · Inf = NaN where V holds an
 * infinity). */
static void pv_rows_bf16_refbf16(int m, int n, int d, const uint32_t *p, int64_t ldp,
                                 const void *const *v, const float *alpha, float *o, int64_t ldo,
                                 const fa__prefetch *pf) {
    (void)pf;
    float acc[D_MAX];
    for (int i = 0; i < m; i++) {
        float *oi = o + i * ldo; // oi: [d]
        for (int c = 0; c < d; c++)
            acc[c] = 0.0f;
        for (int t = 0; 2 * t < n; t++) {
            const uint32_t pair = p[i * ldp + t];
            const uint16_t *va = v[2 * t]; // va, vb: [d]
            if (2 * t + 1 < n) {
                const uint16_t *vb = v[2 * t + 1];
                for (int c = 0; c < d; c++)
                    acc[c] = dot_pair(acc[c], pair, (uint32_t)va[c] | (uint32_t)vb[c] << 16);
            } else {
                for (int c = 0; c < d; c++)
                    acc[c] = ftz(acc[c] + bf16_daz(pair) * bf16_daz(va[c]));
            }
        }
        for (int c = 0; c < d; c++)
            oi[c] = alpha[i] * oi[c] + acc[c];
    }
}

static void to_bf16_refbf16(int n, const float *x, uint16_t *y) {
    for (int j = 0; j < n; j++)
        y[j] = round_bf16(x[j]);
    if (n & 1)
        y[n] = 0;
}

static void interleave_bf16_refbf16(int n, const uint16_t *a, const uint16_t *b, uint32_t *dst) {
    for (int t = 0; t < n; t++)
        dst[t] = (uint32_t)a[t] | (uint32_t)b[t] << 16;
}

static void pair_bf16_refbf16(int n, const float *a, const float *b, uint32_t *dst) {
    for (int t = 0; t < n; t++)
        dst[t] = (uint32_t)round_bf16(a[t]) | (uint32_t)round_bf16(b[t]) << 16;
}

/* The backward's row step on a pair of rows (kernels.h): exp2_sum's P, the dS loop, then
 * to_bf16's rounding, the same operations as the separate steps. */
static void bwd_pair_bf16_refbf16(int n, const float *const s[2], const float *const dp[2],
                                  const float lse[2], const float dlt[2], uint16_t *const ds2[2],
                                  uint32_t *px, uint32_t *dsx) {
    for (int j = 0; j < n; j++) {
        uint32_t hp[2] = {0, 0}, hd[2] = {0, 0}; /* bf16 of P and dS; a row outside: 0 */
        for (int r = 0; r < 2; r++) {
            if (!s[r])
                continue;
            const float pr = exp2f(s[r][j] - lse[r]); // P = 2^(S - lse)
            hp[r] = round_bf16(pr);
            hd[r] = round_bf16(pr * (dp[r][j] - dlt[r]));
            if (ds2[r])
                ds2[r][j] = (uint16_t)hd[r];
        }
        if (px)
            px[j] = hp[0] | hp[1] << 16;
        if (dsx)
            dsx[j] = hd[0] | hd[1] << 16;
    }
    if (n & 1) /* dS as pairs along keys: an odd row ends on a zero */
        for (int r = 0; r < 2; r++)
            if (ds2[r])
                ds2[r][n] = 0;
}

const fa__cpu_kernels fa__cpu_kernels_refbf16 = {
    .name = "refbf16",
    .gemm_rows = 1,
    .qk = fa__qk_ref,
    .pv = fa__pv_ref,
    .to_f32 = fa__to_f32_ref,
    .from_f32 = fa__from_f32_ref,
    .qk_rows = qk_rows_refbf16,
    .pv_rows = pv_rows_refbf16,
    .decode_keys_half = {16, 16}, /* the avx512 set's, so decode's calls are cut as there */
    .decode_rows_f32 = 64,
    .transpose = fa__transpose_ref,
    .qk_bf16 = qk_bf16_refbf16,
    .pv_bf16 = pv_bf16_refbf16,
    .pv_bf16_t = pv_bf16_t_refbf16,
    .qk_rows_bf16 = qk_rows_bf16_refbf16,
    .pv_rows_bf16 = pv_rows_bf16_refbf16,
    .to_bf16 = to_bf16_refbf16,
    .interleave_bf16 = interleave_bf16_refbf16,
    .pair_bf16 = pair_bf16_refbf16,
    .bwd_pair_bf16 = bwd_pair_bf16_refbf16,
    .exp2_sum = fa__exp2_sum_ref,
    .softmax_rows = fa__softmax_rows_ref,
};
