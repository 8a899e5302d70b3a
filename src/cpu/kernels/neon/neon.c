/* SPDX-License-Identifier: MIT */
/*
 * neon.c — AArch64 Advanced SIMD (NEON) microkernels. Advanced SIMD is mandatory on AArch64, so
 * this file needs no special flags and features.c reports it on every __aarch64__ build.
 *
 * One register-tiled GEMM serves both products, C[m, n] = diag(beta) C + A[m, k] B[k, n], as
 * BLIS does on armv8a but with the tile turned round: 12 rows x 8 columns in 24 q-register
 * accumulators. Each step of k loads one 8-wide row of B (2 q registers) and 12 elements of A
 * (3 q registers, from a strip of A packed as [k][12]) and does 24 FMLA by element. 12 x 8
 * rather than 8 x 12 because the column counts here are Bc = 128 keys (qk) and D = 64 / 128
 * (pv), multiples of 8 but not of 12, while the row count R = g*br already has a tail. The
 * strip of A is packed from A's rows, or copied from Aᵀ's (pv_t: the backward's P and dS read
 * transposed in place), so both give the same strip and the same sums.
 */
#include "../kernels.h"

#include "flashattn.h"

#include <arm_neon.h>
#include <math.h>

enum {
    MR = 12, /* rows of a tile: 3 q registers of A per step of k */
    NR = 8,  /* columns of a tile: 2 q registers of B per step of k */
    KC = 256 /* steps of k per packed strip of A: [KC][MR] floats, 12 KiB on the stack */
};

/* In place: r[e][l] becomes r[l][e] (a 4 x 4 block of floats). */
static inline void transpose4(float32x4_t r[4]) {
    const float32x4_t t0 = vtrn1q_f32(r[0], r[1]); /* r0[0] r1[0] r0[2] r1[2] */
    const float32x4_t t1 = vtrn2q_f32(r[0], r[1]); /* r0[1] r1[1] r0[3] r1[3] */
    const float32x4_t t2 = vtrn1q_f32(r[2], r[3]); /* r2[0] r3[0] r2[2] r3[2] */
    const float32x4_t t3 = vtrn2q_f32(r[2], r[3]); /* r2[1] r3[1] r2[3] r3[3] */
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

/* ap: [kc][mrp] = A[0:rows, 0:kc]ᵀ with rows rows..mrp zero (mrp a multiple of 4, rows <= mrp).
 * at: A is given transposed (a: [kc, rows] with row stride lda), so the strip is a plain copy. */
static void pack_a(int rows, int mrp, int kc, const float *a, int64_t lda, int at, float *ap) {
    if (at) {
        for (int t = 0; t < kc; t++) {
            const float *src = a + t * lda;
            float *dst = ap + t * mrp;
            int e = 0;
            for (; e + 4 <= rows; e += 4) vst1q_f32(dst + e, vld1q_f32(src + e));
            for (; e < mrp; e++) dst[e] = e < rows ? src[e] : 0.0f;
        }
        return;
    }
    for (int i0 = 0; i0 < mrp; i0 += 4) {
        int t = 0;
        for (; t + 4 <= kc; t += 4) {
            float32x4_t r[4]; /* r[e] = A[i0 + e, t:t+4] */
            for (int e = 0; e < 4; e++)
                r[e] = i0 + e < rows ? vld1q_f32(a + (i0 + e) * lda + t) : vdupq_n_f32(0.0f);
            transpose4(r);
            for (int l = 0; l < 4; l++) vst1q_f32(ap + (t + l) * mrp + i0, r[l]);
        }
        for (; t < kc; t++)
            for (int e = 0; e < 4; e++) ap[t * mrp + i0 + e] = i0 + e < rows ? a[(i0 + e) * lda + t] : 0.0f;
    }
}

/* acc[i][v] += b[v] * a[lane] for the 4 rows i = 4q .. 4q+3 held in the lanes of a. */
#define FA_NEON_FMLA4(q, v)                                                                        \
    do {                                                                                           \
        acc[4 * (q) + 0][v] = vfmaq_laneq_f32(acc[4 * (q) + 0][v], bv[v], aq, 0);                  \
        acc[4 * (q) + 1][v] = vfmaq_laneq_f32(acc[4 * (q) + 1][v], bv[v], aq, 1);                  \
        acc[4 * (q) + 2][v] = vfmaq_laneq_f32(acc[4 * (q) + 2][v], bv[v], aq, 2);                  \
        acc[4 * (q) + 3][v] = vfmaq_laneq_f32(acc[4 * (q) + 3][v], bv[v], aq, 3);                  \
    } while (0)

/* One MRP x 4*NV tile of C from ap ([kc][MRP], packed A) and b ([kc, 4*NV], row stride ldb).
 * load == 0: C = A B; else C = diag(beta) C + A B (beta NULL: C + A B). Only the first `rows`
 * rows of C are read or written (the packed rows past them are zeros). */
#define FA_NEON_TILE(MRP, NV)                                                                      \
    static inline void tile_##MRP##x##NV(int kc, const float *ap, const float *b, int64_t ldb,     \
                                         int load, const float *beta, float *c, int64_t ldc,       \
                                         int rows) {                                               \
        float32x4_t acc[MRP][NV]; /* C tile: [MRP, 4*NV] */                                       \
        _Pragma("GCC unroll 12") for (int i = 0; i < MRP; i++) {                                   \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) {                                 \
                if (load && i < rows) {                                                            \
                    const float32x4_t x = vld1q_f32(c + i * ldc + 4 * v);                          \
                    acc[i][v] = beta ? vmulq_n_f32(x, beta[i]) : x;                                \
                } else {                                                                           \
                    acc[i][v] = vdupq_n_f32(0.0f);                                                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int t = 0; t < kc; t++) {                                                             \
            float32x4_t bv[NV]; /* B[t, 0:4*NV] */                                                 \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) bv[v] = vld1q_f32(b + t * ldb + 4 * v); \
            _Pragma("GCC unroll 3") for (int q = 0; q < (MRP) / 4; q++) {                          \
                const float32x4_t aq = vld1q_f32(ap + t * (MRP) + 4 * q); /* A[4q:4q+4, t] */      \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) FA_NEON_FMLA4(q, v);          \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 12") for (int i = 0; i < MRP; i++) {                                   \
            if (i < rows) {                                                                        \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)                               \
                    vst1q_f32(c + i * ldc + 4 * v, acc[i][v]);                                     \
            }                                                                                      \
        }                                                                                          \
    }

FA_NEON_TILE(12, 2)
FA_NEON_TILE(12, 1)
FA_NEON_TILE(8, 2)
FA_NEON_TILE(8, 1)
FA_NEON_TILE(4, 2)
FA_NEON_TILE(4, 1)

/* One tile of mrp (12, 8 or 4) packed rows and nv (2 or 1) vectors of columns. */
static inline void tile(int mrp, int nv, int kc, const float *ap, const float *b, int64_t ldb,
                        int load, const float *beta, float *c, int64_t ldc, int rows) {
    if (mrp == 12) {
        if (nv == 2) tile_12x2(kc, ap, b, ldb, load, beta, c, ldc, rows);
        else tile_12x1(kc, ap, b, ldb, load, beta, c, ldc, rows);
    } else if (mrp == 8) {
        if (nv == 2) tile_8x2(kc, ap, b, ldb, load, beta, c, ldc, rows);
        else tile_8x1(kc, ap, b, ldb, load, beta, c, ldc, rows);
    } else {
        if (nv == 2) tile_4x2(kc, ap, b, ldb, load, beta, c, ldc, rows);
        else tile_4x1(kc, ap, b, ldb, load, beta, c, ldc, rows);
    }
}

/* C[m, n] = A[m, k] B[k, n] (load == 0) or diag(beta) C + A B (load == 1); at: A given as Aᵀ
 * ([k, m], row stride lda). Row strips of MR (the last one 12, 8 or 4 rows with zero padding),
 * k in chunks of KC (the later chunks add to C), columns in tiles of 8 then 4; the last n % 4
 * columns go through a zero-padded copy of B and C so that nothing outside C[m, n] or B[k, n]
 * is touched. */
static void gemm(int m, int n, int k, const float *a, int64_t lda, int at, const float *b,
                 int64_t ldb, int load, const float *beta, float *c, int64_t ldc) {
    float ap[KC * MR];     /* packed strip of A: [kc][mrp] */
    float bp[KC * 4];      /* the last n % 4 columns of B, padded: [kc][4] */
    float cp[MR * 4];      /* the matching columns of C, padded: [mrp][4] */
    for (int i0 = 0; i0 < m; i0 += MR) {
        const int rows = m - i0 < MR ? m - i0 : MR;
        const int mrp = rows > 8 ? 12 : rows > 4 ? 8 : 4;
        const float *ai = at ? a + i0 : a + i0 * lda;
        float *ci = c + i0 * ldc;
        int k0 = 0;
        do { /* at least once, so k == 0 still gives C = 0 or diag(beta) C */
            const int kc = k - k0 < KC ? k - k0 : KC;
            const int ld = load || k0 > 0;
            const float *bt = beta && k0 == 0 ? beta + i0 : 0;
            const float *bk = b + k0 * ldb;
            pack_a(rows, mrp, kc, at ? ai + k0 * lda : ai + k0, lda, at, ap);
            int j = 0;
            for (; j + 8 <= n; j += 8) tile(mrp, 2, kc, ap, bk + j, ldb, ld, bt, ci + j, ldc, rows);
            if (j + 4 <= n) {
                tile(mrp, 1, kc, ap, bk + j, ldb, ld, bt, ci + j, ldc, rows);
                j += 4;
            }
            if (j < n) {
                const int cols = n - j;
                for (int t = 0; t < kc; t++)
                    for (int u = 0; u < 4; u++) bp[t * 4 + u] = u < cols ? bk[t * ldb + j + u] : 0.0f;
                for (int i = 0; i < mrp; i++)
                    for (int u = 0; u < 4; u++) cp[i * 4 + u] = i < rows && u < cols && ld ? ci[i * ldc + j + u] : 0.0f;
                tile(mrp, 1, kc, ap, bp, 4, ld, bt, cp, 4, rows);
                for (int i = 0; i < rows; i++)
                    for (int u = 0; u < cols; u++) ci[i * ldc + j + u] = cp[i * 4 + u];
            }
            k0 += KC;
        } while (k0 < k);
    }
}

static void qk_neon(int m, int n, int d, const float *q, int64_t ldq, const float *kt, int64_t ldk,
                    float *s, int64_t lds) {
    gemm(m, n, d, q, ldq, 0, kt, ldk, 0, 0, s, lds);
}

static void pv_neon(int m, int n, int d, const float *p, int64_t ldp, const float *v, int64_t ldv,
                    const float *alpha, float *o, int64_t ldo) {
    gemm(m, d, n, p, ldp, 0, v, ldv, 1, alpha, o, ldo);
}

/* bf16 of 4 fp32 lanes, round to nearest even on the bits (as convert.h); NaN stays quiet. */
static inline uint16x4_t bf16_4(float32x4_t x) {
    const uint32x4_t u = vreinterpretq_u32_f32(x), hi = vshrq_n_u32(u, 16);
    const uint32x4_t lsb = vandq_u32(hi, vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
    const uint32x4_t nan =
        vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    return vmovn_u32(vbslq_u32(nan, vorrq_u32(hi, vdupq_n_u32(0x40)), r));
}

/* The way back from to_f32: FCVTN for fp16 (round to nearest even under the default FPCR),
 * bf16_4 for bf16; the last n % 4 elements through 4-lane buffers. */
static void from_f32_neon(int n, const float *src, float scale, int32_t dtype, void *dst) {
    for (int t = 0; t < n; t += 4) {
        const int left = n - t;
        float in[4] = {0}, out[4];
        for (int i = 0; left < 4 && i < left; i++) in[i] = src[t + i];
        const float32x4_t x = vmulq_n_f32(vld1q_f32(left >= 4 ? src + t : in), scale);
        if (dtype == FA_DTYPE_F32) {
            vst1q_f32(left >= 4 ? (float *)dst + t : out, x);
            for (int i = 0; left < 4 && i < left; i++) ((float *)dst)[t + i] = out[i];
            continue;
        }
        const uint16x4_t h =
            dtype == FA_DTYPE_F16 ? vreinterpret_u16_f16(vcvt_f16_f32(x)) : bf16_4(x);
        uint16_t part[4];
        vst1_u16(left >= 4 ? (uint16_t *)dst + t : part, h);
        for (int i = 0; left < 4 && i < left; i++) ((uint16_t *)dst)[t + i] = part[i];
    }
}

/* The packed strip of A is the same as pv's on the transpose of pt, so are the sums. */
static void pv_t_neon(int m, int n, int d, const float *pt, int64_t ldp, const float *v,
                      int64_t ldv, const float *alpha, float *o, int64_t ldo) {
    gemm(m, d, n, pt, ldp, 1, v, ldv, 1, alpha, o, ldo);
}

/* 8 elements -> 2 q registers of fp32: FCVTL for fp16, a 16-bit shift (SHLL) for bf16. */
static inline void to_f32_8(const uint16_t *h16, int32_t dtype, float32x4_t *lo, float32x4_t *hi) {
    const uint16x8_t h = vld1q_u16(h16);
    if (dtype == FA_DTYPE_F16) {
        const float16x8_t f = vreinterpretq_f16_u16(h);
        *lo = vcvt_f32_f16(vget_low_f16(f));
        *hi = vcvt_high_f32_f16(f);
    } else {
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
}

/* Is dtype an 8-bit cache's (i8, f8_e4m3, f8_e5m2)? A constant where dtype is. */
static inline __attribute__((always_inline)) int is_8bit(int32_t dtype) {
    return dtype == FA_DTYPE_I8 || dtype == FA_DTYPE_F8_E4M3 || dtype == FA_DTYPE_F8_E5M2;
}

/* 8 stored values of an 8-bit cache row -> 2 q registers of fp32: i8 sign-extended (SXTL) and
 * converted; e5m2 as the upper byte of an fp16 (SHLL by 8, then FCVTL, which widens subnormals,
 * infinities and NaN exactly); e4m3fn as the fp16 S.0EEEE.MMM0000000, which is 2^-8 times its
 * value (subnormals too), the NaN code S.1111.111 made the fp16 NaN 0xffff. The factor 2^8 is
 * left to the caller: once per sum in the products, not once per element. */
static inline __attribute__((always_inline)) void to_f32_8b(const uint8_t *b8, int32_t dtype,
                                                            float32x4_t *lo, float32x4_t *hi) {
    const uint8x8_t b = vld1_u8(b8);
    if (dtype == FA_DTYPE_I8) {
        const int16x8_t w = vmovl_s8(vreinterpret_s8_u8(b));
        *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        *hi = vcvtq_f32_s32(vmovl_high_s16(w));
        return;
    }
    uint16x8_t h;
    if (dtype == FA_DTYPE_F8_E5M2) {
        h = vshll_n_u8(b, 8);
    } else { /* S.S.EEEE.MMM0000000, then the second S cleared and NaN codes set to all ones */
        const uint16x8_t s =
            vreinterpretq_u16_s16(vshlq_n_s16(vmovl_s8(vreinterpret_s8_u8(b)), 7));
        const uint16x8_t nan = vceqq_u16(vorrq_u16(s, vdupq_n_u16(0xc07f)), vdupq_n_u16(0xffff));
        h = vorrq_u16(vandq_u16(s, vdupq_n_u16(0xbfff)), nan);
    }
    const float16x8_t f = vreinterpretq_f16_u16(h);
    *lo = vcvt_f32_f16(vget_low_f16(f));
    *hi = vcvt_high_f32_f16(f);
}

/* to_f32 on an 8-bit cache row: 8 values at a time, the last n % 8 through a zero-padded copy;
 * times 2^8 for e4m3 (exact, 1 otherwise), then the scale (rounded once), as
 * scale · fa__row_load. */
static void to_f32_8bit(int n, const uint8_t *src, int32_t dtype, float scale, float *dst) {
    const float u = dtype == FA_DTYPE_F8_E4M3 ? 256.0f : 1.0f;
    float32x4_t lo, hi;
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        to_f32_8b(src + t, dtype, &lo, &hi);
        vst1q_f32(dst + t, vmulq_n_f32(vmulq_n_f32(lo, u), scale));
        vst1q_f32(dst + t + 4, vmulq_n_f32(vmulq_n_f32(hi, u), scale));
    }
    if (t < n) {
        uint8_t part[8] = {0};
        float out[8];
        for (int i = 0; t + i < n; i++) part[i] = src[t + i];
        to_f32_8b(part, dtype, &lo, &hi);
        vst1q_f32(out, vmulq_n_f32(vmulq_n_f32(lo, u), scale));
        vst1q_f32(out + 4, vmulq_n_f32(vmulq_n_f32(hi, u), scale));
        for (int i = 0; t + i < n; i++) dst[t + i] = out[i];
    }
}

/* dst[t] = scale · src[t]; the last n % 8 elements go through a zero-padded copy, so nothing
 * past src[n) is read or past dst[n) written. */
static void to_f32_neon(int n, const void *src, int32_t dtype, float scale, float *dst) {
    int t = 0;
    if (is_8bit(dtype)) {
        to_f32_8bit(n, src, dtype, scale, dst);
        return;
    }
    if (dtype == FA_DTYPE_F32) {
        const float *f = src;
        for (; t + 4 <= n; t += 4) vst1q_f32(dst + t, vmulq_n_f32(vld1q_f32(f + t), scale));
        for (; t < n; t++) dst[t] = scale * f[t];
        return;
    }
    const uint16_t *h = src;
    float32x4_t lo, hi;
    for (; t + 8 <= n; t += 8) {
        to_f32_8(h + t, dtype, &lo, &hi);
        vst1q_f32(dst + t, vmulq_n_f32(lo, scale));
        vst1q_f32(dst + t + 4, vmulq_n_f32(hi, scale));
    }
    if (t < n) {
        uint16_t part[8] = {0};
        float out[8];
        for (int i = 0; t + i < n; i++) part[i] = h[t + i];
        to_f32_8(part, dtype, &lo, &hi);
        vst1q_f32(out, vmulq_n_f32(lo, scale));
        vst1q_f32(out + 4, vmulq_n_f32(hi, scale));
        for (int i = 0; t + i < n; i++) dst[t + i] = out[i];
    }
}

/* ---- decode products on rows read in place (kernels.h: qk_rows, pv_rows) ---- */

/* 8 elements of a row of any dtype from element c on as two q registers (fewer than 8 left:
 * zero-filled, never reading past the row); an e4m3 row's as to_f32_8b gives them, 2^-8 times
 * their values. */
static inline __attribute__((always_inline)) void load8(const void *row, int32_t dtype, int c,
                                                        int left, float32x4_t *lo,
                                                        float32x4_t *hi) {
    if (left >= 8) {
        if (dtype == FA_DTYPE_F32) {
            *lo = vld1q_f32((const float *)row + c);
            *hi = vld1q_f32((const float *)row + c + 4);
        } else if (is_8bit(dtype)) {
            to_f32_8b((const uint8_t *)row + c, dtype, lo, hi);
        } else {
            to_f32_8((const uint16_t *)row + c, dtype, lo, hi);
        }
        return;
    }
    float part[8] = {0};
    if (dtype == FA_DTYPE_F32) {
        for (int i = 0; i < left; i++) part[i] = ((const float *)row)[c + i];
        *lo = vld1q_f32(part);
        *hi = vld1q_f32(part + 4);
        return;
    }
    if (is_8bit(dtype)) {
        uint8_t bytes[8] = {0};
        for (int i = 0; i < left; i++) bytes[i] = ((const uint8_t *)row)[c + i];
        to_f32_8b(bytes, dtype, lo, hi);
        return;
    }
    uint16_t half[8] = {0};
    for (int i = 0; i < left; i++) half[i] = ((const uint16_t *)row)[c + i];
    to_f32_8(half, dtype, lo, hi);
}

/* Prefetches row r of pf (all its lines), if there is one, into L2. */
static inline __attribute__((always_inline)) void prefetch_row(const fa__prefetch *pf, int r) {
    if (!pf || r >= pf->n)
        return;
    const char *row = fa__prefetch_row(pf, r);
    for (int at = 0; at < pf->bytes; at += 64)
        __builtin_prefetch(row + at, 0, 2);
}

/* One tile of TR rows x 4 keys (TR = 4, or 2 and 1 for the last rows, so a decode with one or two
 * query rows per KV head computes only the rows it has): 4·TR accumulators over d, then pairwise
 * adds (FADDP) leave row ii's 4 scores in one register. DT and TR are compile-time in each
 * caller. Keys past n repeat key j0 and rows past m repeat row i0: computed, not stored. */
static inline __attribute__((always_inline)) void
qk_rows_tile(int TR, int m, int i0, int n, int j0, int d, const float *q, int64_t ldq,
             const void *const *k, const int32_t DT, float *s, int64_t lds,
             const fa__prefetch *pf) {
    if (i0 == 0) /* pf's rows, 4 per 4 keys */
        for (int r = j0; r < j0 + 4; r++) prefetch_row(pf, r);
    float32x4_t acc[16]; /* acc[4 ii + jj]: row i0+ii, key j0+jj */
    for (int t = 0; t < 4 * TR; t++) acc[t] = vdupq_n_f32(0.0f);
    const void *kr[4];
    const float *qr[4];
    for (int jj = 0; jj < 4; jj++) kr[jj] = k[j0 + jj < n ? j0 + jj : j0]; /* pad: repeat */
    for (int ii = 0; ii < TR; ii++) qr[ii] = q + (i0 + (i0 + ii < m ? ii : 0)) * ldq;
    for (int c = 0; c < d; c += 8) {
        float32x4_t klo[4], khi[4];
        for (int jj = 0; jj < 4; jj++) load8(kr[jj], DT, c, d - c, &klo[jj], &khi[jj]);
        for (int ii = 0; ii < TR; ii++) {
            float32x4_t qlo, qhi;
            load8(qr[ii], FA_DTYPE_F32, c, d - c, &qlo, &qhi);
            for (int jj = 0; jj < 4; jj++)
                acc[4 * ii + jj] =
                    vfmaq_f32(vfmaq_f32(acc[4 * ii + jj], qlo, klo[jj]), qhi, khi[jj]);
        }
    }
    for (int ii = 0; ii < TR && i0 + ii < m; ii++) {
        const float32x4_t *a = acc + 4 * ii;
        float32x4_t sums = vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
        if (DT == FA_DTYPE_F8_E4M3) sums = vmulq_n_f32(sums, 256.0f); /* to_f32_8b's 2^-8 */
        if (n - j0 >= 4) {
            vst1q_f32(s + (i0 + ii) * lds + j0, sums);
        } else {
            float out[4];
            vst1q_f32(out, sums);
            for (int jj = 0; jj < n - j0; jj++) s[(i0 + ii) * lds + j0 + jj] = out[jj];
        }
    }
}

static inline __attribute__((always_inline)) void qk_rows_dt(int m, int n, int d, const float *q,
                                                             int64_t ldq, const void *const *k,
                                                             const int32_t DT, float *s,
                                                             int64_t lds, const fa__prefetch *pf) {
    for (int i0 = 0; i0 < m;) {
        const int TR = m - i0 >= 3 ? 4 : m - i0; /* TR compile-time in each tile below */
        for (int j0 = 0; j0 < n; j0 += 4) {
            if (TR == 4) qk_rows_tile(4, m, i0, n, j0, d, q, ldq, k, DT, s, lds, pf);
            else if (TR == 2) qk_rows_tile(2, m, i0, n, j0, d, q, ldq, k, DT, s, lds, pf);
            else qk_rows_tile(1, m, i0, n, j0, d, q, ldq, k, DT, s, lds, pf);
        }
        i0 += TR;
    }
}

static void qk_rows_neon(int m, int n, int d, const float *q, int64_t ldq, const void *const *k,
                         int32_t dtype, float *s, int64_t lds, const fa__prefetch *pf) {
    FA_BY_ROW_DTYPE(dtype, qk_rows_dt(m, n, d, q, ldq, k, FA_DT, s, lds, pf));
}

/* Rows i0..i0+TR-1 of O (TR = 4, or 2 and 1 for the last rows), columns [c, c + 16) (the last
 * tile may be partial): 4·TR accumulators (TR rows x 4 registers) summed over the keys, then
 * alpha O + sum. Rows past m repeat row i0's probabilities and are not stored. */
static inline __attribute__((always_inline)) void pv_rows_tile(int TR, int m, int i0, int n, int d,
                                                               int c, const float *p, int64_t ldp,
                                                               const void *const *v,
                                                               const int32_t DT,
                                                               const float *alpha, float *o,
                                                               int64_t ldo, const fa__prefetch *pf) {
    const int rows = m - i0 < TR ? m - i0 : TR;
    const float *pr[4];
    for (int ii = 0; ii < 4; ii++) pr[ii] = p + (i0 + (ii < rows ? ii : 0)) * ldp;
    float32x4_t acc[4][4]; /* acc[ii][w]: row i0+ii, columns c+4w .. c+4w+3 */
    for (int ii = 0; ii < TR; ii++)
        for (int w = 0; w < 4; w++) acc[ii][w] = vdupq_n_f32(0.0f);
    for (int j = 0; j < n; j++) {
        prefetch_row(pf, j); /* the caller passes pf to the first tile only */
        float32x4_t vv[4]; /* V[j, c:c+16] */
        load8(v[j], DT, c, d - c, &vv[0], &vv[1]);
        load8(v[j], DT, c + 8, d - c - 8, &vv[2], &vv[3]);
        const float32x4_t pj = {pr[0][j], pr[1][j], pr[2][j], pr[3][j]};
        for (int w = 0; w < 4; w++) {
            acc[0][w] = vfmaq_laneq_f32(acc[0][w], vv[w], pj, 0);
            if (TR > 1) acc[1][w] = vfmaq_laneq_f32(acc[1][w], vv[w], pj, 1);
            if (TR > 2) {
                acc[2][w] = vfmaq_laneq_f32(acc[2][w], vv[w], pj, 2);
                acc[3][w] = vfmaq_laneq_f32(acc[3][w], vv[w], pj, 3);
            }
        }
    }
    if (DT == FA_DTYPE_F8_E4M3) /* to_f32_8b's 2^-8 */
        for (int ii = 0; ii < TR; ii++)
            for (int w = 0; w < 4; w++) acc[ii][w] = vmulq_n_f32(acc[ii][w], 256.0f);
    for (int ii = 0; ii < rows; ii++) {
        float *oi = o + (i0 + ii) * ldo + c;
        const float a = alpha[i0 + ii];
        if (d - c >= 16) {
            for (int w = 0; w < 4; w++)
                vst1q_f32(oi + 4 * w, vfmaq_n_f32(acc[ii][w], vld1q_f32(oi + 4 * w), a));
        } else {
            float sum[16];
            for (int w = 0; w < 4; w++) vst1q_f32(sum + 4 * w, acc[ii][w]);
            for (int t = 0; t < d - c; t++) oi[t] = a * oi[t] + sum[t];
        }
    }
}

static inline __attribute__((always_inline)) void pv_rows_dt(int m, int n, int d, const float *p,
                                                             int64_t ldp, const void *const *v,
                                                             const int32_t DT, const float *alpha,
                                                             float *o, int64_t ldo,
                                                             const fa__prefetch *pf) {
    for (int i0 = 0; i0 < m;) {
        const int TR = m - i0 >= 3 ? 4 : m - i0; /* TR compile-time in each tile below */
        for (int c = 0; c < d; c += 16, pf = NULL) {
            if (TR == 4) pv_rows_tile(4, m, i0, n, d, c, p, ldp, v, DT, alpha, o, ldo, pf);
            else if (TR == 2) pv_rows_tile(2, m, i0, n, d, c, p, ldp, v, DT, alpha, o, ldo, pf);
            else pv_rows_tile(1, m, i0, n, d, c, p, ldp, v, DT, alpha, o, ldo, pf);
        }
        i0 += TR;
    }
}

static void pv_rows_neon(int m, int n, int d, const float *p, int64_t ldp, const void *const *v,
                         int32_t dtype, const float *alpha, float *o, int64_t ldo,
                         const fa__prefetch *pf) {
    FA_BY_ROW_DTYPE(dtype, pv_rows_dt(m, n, d, p, ldp, v, FA_DT, alpha, o, ldo, pf));
}

/* 4 x 4 blocks through transpose4; the ragged edges (n % 4 rows, d % 4 columns) element by
 * element. */
static void transpose_neon(int n, int d, const float *src, int64_t lds, float *dst, int64_t ldd) {
    const int n4 = n & ~3, d4 = d & ~3;
    for (int j0 = 0; j0 < n4; j0 += 4) {
        for (int t0 = 0; t0 < d4; t0 += 4) {
            float32x4_t r[4]; /* r[e] = src[j0 + e, t0:t0+4] */
            for (int e = 0; e < 4; e++) r[e] = vld1q_f32(src + (j0 + e) * lds + t0);
            transpose4(r);
            for (int e = 0; e < 4; e++) vst1q_f32(dst + (t0 + e) * ldd + j0, r[e]);
        }
        for (int t = d4; t < d; t++)
            for (int e = 0; e < 4; e++) dst[t * ldd + j0 + e] = src[(j0 + e) * lds + t];
    }
    for (int j = n4; j < n; j++)
        for (int t = 0; t < d; t++) dst[t * ldd + j] = src[j * lds + t];
}

/* max over x[0..n): FMAXNM, so a NaN is passed over as in ref (the exp2 and the sum then carry
 * it: kernels.h, softmax_rows); the last n % 4 elements are loaded into a -inf padded vector. */
static float row_max_neon(int n, const float *x) {
    float32x4_t mx0 = vdupq_n_f32(-INFINITY), mx1 = mx0;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        mx0 = vmaxnmq_f32(mx0, vld1q_f32(x + j));
        mx1 = vmaxnmq_f32(mx1, vld1q_f32(x + j + 4));
    }
    for (; j + 4 <= n; j += 4) mx0 = vmaxnmq_f32(mx0, vld1q_f32(x + j));
    if (j < n) {
        float tail[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (int u = 0; j + u < n; u++) tail[u] = x[j + u];
        mx1 = vmaxnmq_f32(mx1, vld1q_f32(tail));
    }
    return vmaxnmvq_f32(vmaxnmq_f32(mx0, mx1));
}

/* 2^x for x <= 127, within 1 ulp: x = n + f with f in [-1/2, 1/2], 2^f by the degree-6
 * polynomial of avx2.c, times 2^n built in the exponent bits. Below -126 the result is flushed
 * to 0, so -inf gives exactly 0. NaN gives NaN: it is kept (x < -126 is false for it) and FMAX,
 * unlike FMAXNM, returns it (vcvtq_s32_f32 makes its n 0, a factor of 1). */
static inline float32x4_t exp2_q(float32x4_t x) {
    const uint32x4_t keep = vmvnq_u32(vcltq_f32(x, vdupq_n_f32(-126.0f)));
    x = vmaxq_f32(x, vdupq_n_f32(-126.0f));
    const float32x4_t n = vrndnq_f32(x); /* round to nearest, ties to even */
    const float32x4_t f = vsubq_f32(x, n);
    float32x4_t p = vdupq_n_f32(1.5345810970757157e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3399932067841291e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(9.618489071726799e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(5.550328642129898e-2f), p, f);
    p = vfmaq_f32(vdupq_n_f32(2.4022646248340607e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(6.931471824645996e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(r), keep));
}

static float exp2_sum_neon(int n, float *x, float m) {
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t sum0 = vdupq_n_f32(0.0f), sum1 = sum0;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const float32x4_t e0 = exp2_q(vsubq_f32(vld1q_f32(x + j), vm));
        const float32x4_t e1 = exp2_q(vsubq_f32(vld1q_f32(x + j + 4), vm));
        vst1q_f32(x + j, e0);
        vst1q_f32(x + j + 4, e1);
        sum0 = vaddq_f32(sum0, e0);
        sum1 = vaddq_f32(sum1, e1);
    }
    for (; j + 4 <= n; j += 4) {
        const float32x4_t e = exp2_q(vsubq_f32(vld1q_f32(x + j), vm));
        vst1q_f32(x + j, e);
        sum0 = vaddq_f32(sum0, e);
    }
    if (j < n) { /* -inf padding gives 0 in the unused lanes */
        float tail[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (int u = 0; j + u < n; u++) tail[u] = x[j + u];
        vst1q_f32(tail, exp2_q(vsubq_f32(vld1q_f32(tail), vm)));
        for (int u = 0; j + u < n; u++) x[j + u] = tail[u];
        sum1 = vaddq_f32(sum1, vld1q_f32(tail));
    }
    return vaddvq_f32(vaddq_f32(sum0, sum1));
}

/* The online softmax step (kernels.h): per row the max, then the exp2 and the sum. */
static void softmax_rows_neon(int rows, int n, float *x, int64_t ldx, float *m, float *sum) {
    fa__softmax_rows_2pass(rows, n, x, ldx, m, sum, row_max_neon, exp2_sum_neon);
}

const fa__cpu_kernels fa__cpu_kernels_neon = {
    .name = "neon",
    .gemm_rows = 12,
    .qk = qk_neon,
    .pv = pv_neon,
    .pv_t = pv_t_neon,
    .qk_rows = qk_rows_neon,
    .pv_rows = pv_rows_neon,
    .decode_keys_half = {64, 32},
    .decode_rows_f32 = 32, /* as AVX2; not measured on Arm */
    .to_f32 = to_f32_neon,
    .from_f32 = from_f32_neon,
    .transpose = transpose_neon,
    .softmax_rows = softmax_rows_neon,
    .exp2_sum = exp2_sum_neon,
};
