/* SPDX-License-Identifier: MIT */
/*
 * avx2.c — AVX2 + FMA microkernels. Built with -mavx2 -mfma and called only after features.c
 * has seen AVX2 and FMA in CPUID and YMM state enabled in XCR0.
 *
 * The same register-tiled GEMM as avx512.c, C[m, n] = diag(beta) C + A[m, k] B[k, n], with
 * BLIS's Haswell shape: a tile is 6 rows x 16 columns in 12 ymm accumulators, each step of k
 * loading one 16-wide row of B and broadcasting one element of A per row.
 */
#include "../kernels.h"

#include "flashattn.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Lane mask for the first `left` (clamped to 0..8) lanes of a ymm. */
static inline __m256i lanes(int left) {
    static const int32_t ones_then_zeros[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    left = left < 0 ? 0 : left > 8 ? 8 : left;
    return _mm256_loadu_si256((const __m256i *)(ones_then_zeros + 8 - left));
}

/* One MR x 16 tile of C; lanes outside (k0, k1) are neither read nor written. FULL (a
 * compile-time constant at each call) says every lane is in: plain loads and stores then, since
 * vmaskmovps is slow on some CPUs (a masked store takes many cycles on AMD's). A[i, t] is at
 * a[i·lda + t], or at a[t·lda + i] when AT (A given transposed; also a compile-time constant). */
#define FA_AVX2_LOAD(p, k) (full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, k))
#define FA_AVX2_TILE(MR)                                                                           \
    static inline __attribute__((always_inline)) void tile_##MR(                                   \
        int k, const float *a, int64_t lda, const int AT, const float *b, int64_t ldb,             \
        const float *beta, float *c, int64_t ldc, __m256i k0, __m256i k1, const int full) {        \
        __m256 acc[MR][2]; /* C tile: [MR, 16] */                                                 \
        if (AT && beta) /* the backward's dK, dV sums, from L2 or L3: asked for first */           \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)                                   \
                _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);                            \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                     \
            acc[i][0] = _mm256_setzero_ps();                                                       \
            acc[i][1] = _mm256_setzero_ps();                                                       \
        }                                                                                          \
        for (int t = 0; t < k; t++) {                                                              \
            const __m256 b0 = FA_AVX2_LOAD(b + t * ldb, k0);     /* B[t, 0:8] */                  \
            const __m256 b1 = FA_AVX2_LOAD(b + t * ldb + 8, k1); /* B[t, 8:16] */                 \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                 \
                const __m256 ai = _mm256_broadcast_ss(AT ? a + t * lda + i : a + i * lda + t);     \
                acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);                                    \
                acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);                                    \
            }                                                                                      \
        }                                                                                          \
        /* C = beta C + (this call's sum): summing each call apart keeps long sums accurate */    \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                     \
            if (beta) {                                                                            \
                const __m256 s = _mm256_set1_ps(beta[i]);                                         \
                acc[i][0] = _mm256_fmadd_ps(s, FA_AVX2_LOAD(c + i * ldc, k0), acc[i][0]);         \
                acc[i][1] = _mm256_fmadd_ps(s, FA_AVX2_LOAD(c + i * ldc + 8, k1), acc[i][1]);     \
            }                                                                                      \
            if (full) {                                                                            \
                _mm256_storeu_ps(c + i * ldc, acc[i][0]);                                          \
                _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);                                      \
            } else {                                                                               \
                _mm256_maskstore_ps(c + i * ldc, k0, acc[i][0]);                                   \
                _mm256_maskstore_ps(c + i * ldc + 8, k1, acc[i][1]);                               \
            }                                                                                      \
        }                                                                                          \
    }

FA_AVX2_TILE(6)
FA_AVX2_TILE(4)
FA_AVX2_TILE(2)
FA_AVX2_TILE(1)

/* The tiles of one 16-column panel (FULL: all 16 columns are in; AT: A given transposed). */
static inline __attribute__((always_inline)) void panel(int m, int k, const float *a, int64_t lda,
                                                        const int AT, const float *b, int64_t ldb,
                                                        const float *beta, float *c, int64_t ldc,
                                                        __m256i k0, __m256i k1, const int full) {
    int i = 0;
#define FA_AVX2_RUN(MR)                                                                            \
    tile_##MR(k, AT ? a + i : a + i * lda, lda, AT, b, ldb, beta ? beta + i : 0, c + i * ldc, ldc, \
              k0, k1, full);                                                                       \
    i += MR
    /* an even m as 6-row tiles and one or two 4-row ones (128 = 20 x 6 + 2 x 4), not ending on
     * a 2-row tile, whose 4 accumulators run at half the FMA rate */
    const int fours = m % 6 == 2 ? 2 : m % 6 == 4 ? 1 : 0;
    while (i + 6 <= m - (4 * fours <= m ? 4 * fours : 0)) {
        FA_AVX2_RUN(6);
    }
    /* the last m % 6 rows as 4 + 2 + 1, or the 4-row tiles */
    if (m - i >= 8) {
        FA_AVX2_RUN(4);
    }
    if (m - i >= 4) {
        FA_AVX2_RUN(4);
    }
    if (m - i >= 2) {
        FA_AVX2_RUN(2);
    }
    if (m - i >= 1) {
        FA_AVX2_RUN(1);
    }
#undef FA_AVX2_RUN
}

/* C = diag(beta) C + A B (beta NULL: C = A B); A: [m, k], or given as Aᵀ [k, m] when at. */
static void gemm(int m, int n, int k, const float *a, int64_t lda, int at, const float *b,
                 int64_t ldb, const float *beta, float *c, int64_t ldc) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        const __m256i k0 = lanes(n - j0), k1 = lanes(n - j0 - 8);
        if (n - j0 >= 16 && at) panel(m, k, a, lda, 1, b + j0, ldb, beta, c + j0, ldc, k0, k1, 1);
        else if (n - j0 >= 16) panel(m, k, a, lda, 0, b + j0, ldb, beta, c + j0, ldc, k0, k1, 1);
        else if (at) panel(m, k, a, lda, 1, b + j0, ldb, beta, c + j0, ldc, k0, k1, 0);
        else panel(m, k, a, lda, 0, b + j0, ldb, beta, c + j0, ldc, k0, k1, 0);
    }
}

static void qk_avx2(int m, int n, int d, const float *q, int64_t ldq, const float *kt, int64_t ldk,
                    float *s, int64_t lds) {
    gemm(m, n, d, q, ldq, 0, kt, ldk, 0, s, lds);
}

static void pv_avx2(int m, int n, int d, const float *p, int64_t ldp, const float *v, int64_t ldv,
                    const float *alpha, float *o, int64_t ldo) {
    gemm(m, d, n, p, ldp, 0, v, ldv, alpha, o, ldo);
}

static void pv_t_avx2(int m, int n, int d, const float *pt, int64_t ldp, const float *v,
                      int64_t ldv, const float *alpha, float *o, int64_t ldo) {
    gemm(m, d, n, pt, ldp, 1, v, ldv, alpha, o, ldo);
}

/* Is dtype an 8-bit cache's (i8, f8_e4m3, f8_e5m2)? A constant where dtype is. */
static inline __attribute__((always_inline)) int is_8bit(int32_t dtype) {
    return dtype == FA_DTYPE_I8 || dtype == FA_DTYPE_F8_E4M3 || dtype == FA_DTYPE_F8_E5M2;
}

/* The 8 stored values in the low 8 bytes of b, of an 8-bit cache row, as fp32: i8 sign-extended
 * and converted; e5m2 as the upper byte of an fp16 (F16C, which widens subnormals, infinities
 * and NaN exactly); e4m3fn as the fp16 S.0EEEE.MMM0000000, which is 2^-8 times its value
 * (subnormals too), the NaN code S.1111.111 made the fp16 NaN 0xffff. The factor 2^8 is left to
 * the caller (e4m3_unit): once per sum in the products, not once per element. */
static inline __attribute__((always_inline)) __m256 cvt8(__m128i b, int32_t dtype) {
    if (dtype == FA_DTYPE_I8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    if (dtype == FA_DTYPE_F8_E5M2)
        return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), b));
    const __m128i s = _mm_slli_epi16(_mm_cvtepi8_epi16(b), 7); /* S.S.EEEE.MMM0000000 */
    const __m128i nan = _mm_cmpeq_epi16(_mm_or_si128(s, _mm_set1_epi16((short)0xc07f)),
                                        _mm_set1_epi16(-1)); /* EEEE.MMM all ones */
    return _mm256_cvtph_ps(_mm_or_si128(_mm_and_si128(s, _mm_set1_epi16((short)0xbfff)), nan));
}

/* x times 2^8 where dtype is e4m3 (cvt8 loads 2^-8 times its values), exactly; else x. */
static inline __attribute__((always_inline)) __m256 e4m3_unit(__m256 x, int32_t dtype) {
    return dtype == FA_DTYPE_F8_E4M3 ? _mm256_mul_ps(x, _mm256_set1_ps(256.0f)) : x;
}

/* 8 elements of a row of any dtype from element c on (fewer than 8 left: zero-filled, never
 * reading past the row); an e4m3 row's as cvt8 gives them, 2^-8 times their values. */
static inline __attribute__((always_inline)) __m256 load8(const void *row, int32_t dtype, int c,
                                                          int left) {
    if (dtype == FA_DTYPE_F32)
        return left >= 8 ? _mm256_loadu_ps((const float *)row + c)
                         : _mm256_maskload_ps((const float *)row + c, lanes(left));
    if (is_8bit(dtype)) {
        const uint8_t *b = (const uint8_t *)row + c;
        if (left >= 8) return cvt8(_mm_loadl_epi64((const __m128i *)b), dtype);
        uint8_t part[8] = {0};
        for (int i = 0; i < left; i++) part[i] = b[i];
        return cvt8(_mm_loadl_epi64((const __m128i *)part), dtype);
    }
    __m128i h;
    if (left >= 8) {
        h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + c));
    } else {
        uint16_t part[8] = {0};
        for (int i = 0; i < left; i++) part[i] = ((const uint16_t *)row)[c + i];
        h = _mm_loadu_si128((const __m128i *)part);
    }
    if (dtype == FA_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* to_f32 on rows of dtype DT (a constant, or f32/f16/bf16 at run time): e4m3's 2^8 (exact),
 * then the scale (rounded once), as scale · fa__row_load. */
static inline __attribute__((always_inline)) void to_f32_dt(int n, const void *src,
                                                            const int32_t DT, float scale,
                                                            float *dst) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int t = 0; t < n; t += 8) {
        const __m256 x = _mm256_mul_ps(s, e4m3_unit(load8(src, DT, t, n - t), DT));
        if (n - t >= 8) _mm256_storeu_ps(dst + t, x);
        else _mm256_maskstore_ps(dst + t, lanes(n - t), x);
    }
}

/* F16C for fp16, a 16-bit shift for bf16, cvt8 for the 8-bit caches, through load8; tails
 * through a masked store. */
static void to_f32_avx2(int n, const void *src, int32_t dtype, float scale, float *dst) {
    if (dtype == FA_DTYPE_I8) to_f32_dt(n, src, FA_DTYPE_I8, scale, dst);
    else if (dtype == FA_DTYPE_F8_E4M3) to_f32_dt(n, src, FA_DTYPE_F8_E4M3, scale, dst);
    else if (dtype == FA_DTYPE_F8_E5M2) to_f32_dt(n, src, FA_DTYPE_F8_E5M2, scale, dst);
    else to_f32_dt(n, src, dtype, scale, dst); /* f32, f16, bf16: picked per load, as before */
}

/* bf16 of 8 fp32 lanes, round to nearest even on the bits (as convert.h); NaN stays quiet. */
static inline __m128i bf16_8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x), hi = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)),
                                          _mm256_set1_epi32(0x7fff)); /* 0x7fff + lsb */
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    /* |u| > inf as signed 32-bit compares: both sides are below 2^31 */
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i q = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    /* 8 x 32 -> 8 x 16: every value fits, so the saturating pack is exact */
    const __m256i packed = _mm256_packus_epi32(q, q); /* [0..3 0..3 | 4..7 4..7] */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

/* The way back: F16C for fp16, bf16_8 for bf16; tails through an 8-lane buffer, so nothing
 * past dst[n) is written. */
static void from_f32_avx2(int n, const float *src, float scale, int32_t dtype, void *dst) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int t = 0; t < n; t += 8) {
        const int left = n - t;
        const __m256 x = _mm256_mul_ps(
            s, left >= 8 ? _mm256_loadu_ps(src + t) : _mm256_maskload_ps(src + t, lanes(left)));
        if (dtype == FA_DTYPE_F32) {
            if (left >= 8) _mm256_storeu_ps((float *)dst + t, x);
            else _mm256_maskstore_ps((float *)dst + t, lanes(left), x);
            continue;
        }
        const __m128i h = dtype == FA_DTYPE_F16
                              ? _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                              : bf16_8(x);
        uint16_t *d = (uint16_t *)dst + t;
        if (left >= 8) {
            _mm_storeu_si128((__m128i *)d, h);
        } else {
            uint16_t part[8];
            _mm_storeu_si128((__m128i *)part, h);
            memcpy(d, part, (size_t)left * sizeof *d);
        }
    }
}

/* ---- decode products on rows read in place (kernels.h: qk_rows, pv_rows) ---- */

/* Prefetches row r of pf (all its lines), if there is one, into L2. */
static inline __attribute__((always_inline)) void prefetch_row(const fa__prefetch *pf, int r) {
    if (!pf || r >= pf->n)
        return;
    const char *row = fa__prefetch_row(pf, r);
    for (int at = 0; at < pf->bytes; at += 64)
        _mm_prefetch(row + at, _MM_HINT_T1);
}

/* A tile's share of pf, rows [r0, r1), spread evenly over its n keys: called once per key, *due
 * and *r keep the place (start them at 0 and r0). Rows asked for in a burst at a call's start
 * took 0.90-0.95 of the time in fp16/bf16 decode once spread (bench_ab_builds --pass decode). */
static inline __attribute__((always_inline)) void prefetch_spread(const fa__prefetch *pf, int n,
                                                                  int r0, int r1, int *due,
                                                                  int *r) {
    for (*due += r1 - r0; *due >= n; *due -= n) prefetch_row(pf, (*r)++);
}

/* The 8 sums of v[0..8): lane k of the result is the sum of v[k]'s lanes. */
static inline __m256 sum8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    /* a: 128-bit lane 0 the low-half sums of v[0..3], lane 1 the high-half sums; b likewise */
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* The 4 sums of v[0..4) in the lanes of an xmm, added in sum8's order. */
static inline __m128 sum4(const __m256 v[4]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    return _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
}

/* One tile of qk_rows: rows i0..i0+3 (rows past m repeat row i0: computed, not stored) x NK = 2
 * or 3 keys from j0 (keys past n repeat key j0), 4·NK accumulators over d, then sum8 (and sum4
 * for a third key). */
static inline __attribute__((always_inline)) void
qk_rows_tile(int m, int i0, int n, int j0, const int NK, int d, const float *q, int64_t ldq,
             const void *const *k, const int32_t DT, float *s, int64_t lds) {
    const void *kr[3];
    for (int jj = 0; jj < 3; jj++) kr[jj] = k[j0 + jj < n ? j0 + jj : j0];
    const float *qr[4];
    for (int ii = 0; ii < 4; ii++) qr[ii] = q + (i0 + (i0 + ii < m ? ii : 0)) * ldq;
    __m256 acc[12]; /* acc[2 ii + jj]: row i0+ii, key j0+jj (jj < 2); acc[8 + ii]: key j0+2 */
    for (int t = 0; t < 12; t++) acc[t] = _mm256_setzero_ps();
#define FA_QK_STEP(left)                                                                           \
    do {                                                                                           \
        const __m256 kv0 = load8(kr[0], DT, c, left), kv1 = load8(kr[1], DT, c, left);           \
        const __m256 kv2 = NK > 2 ? load8(kr[2], DT, c, left) : kv0;                              \
        for (int ii = 0; ii < 4; ii++) {                                                           \
            const __m256 qv = load8(qr[ii], FA_DTYPE_F32, c, left);                               \
            acc[2 * ii] = _mm256_fmadd_ps(qv, kv0, acc[2 * ii]);                                   \
            acc[2 * ii + 1] = _mm256_fmadd_ps(qv, kv1, acc[2 * ii + 1]);                           \
            if (NK > 2) acc[8 + ii] = _mm256_fmadd_ps(qv, kv2, acc[8 + ii]);                       \
        }                                                                                          \
    } while (0)
    int c = 0;
    for (; c + 8 <= d; c += 8) FA_QK_STEP(8);
    if (c < d) FA_QK_STEP(d - c);
#undef FA_QK_STEP
    float out[12];
    _mm256_storeu_ps(out, e4m3_unit(sum8(acc), DT));
    if (NK > 2) {
        const __m128 s4 = sum4(acc + 8);
        _mm_storeu_ps(out + 8,
                      DT == FA_DTYPE_F8_E4M3 ? _mm_mul_ps(s4, _mm_set1_ps(256.0f)) : s4);
    }
    for (int ii = 0; ii < 4 && i0 + ii < m; ii++)
        for (int jj = 0; jj < NK && j0 + jj < n; jj++)
            s[(i0 + ii) * lds + j0 + jj] = out[jj < 2 ? 2 * ii + jj : 8 + ii];
}

/* Tiles of 4 rows x 3 keys (12 accumulators, as pv_rows_dt's), the keys that do not split in
 * threes as 2-key tiles (n = 64: twenty of 3, two of 2). DT is a compile-time dtype in each
 * caller. */
static inline __attribute__((always_inline)) void qk_rows_dt(int m, int n, int d, const float *q,
                                                             int64_t ldq, const void *const *k,
                                                             const int32_t DT, float *s,
                                                             int64_t lds, const fa__prefetch *pf) {
    const int n3 = n % 3 == 1 && n > 1 ? n - 4 : n - n % 3; /* keys in 3-key tiles */
    for (int i0 = 0; i0 < m; i0 += 4) {
        int j0 = 0;
        for (; j0 < n3; j0 += 3) {
            if (i0 == 0) /* pf's rows, 3 per 3 keys */
                for (int r = j0; r < j0 + 3; r++) prefetch_row(pf, r);
            qk_rows_tile(m, i0, n, j0, 3, d, q, ldq, k, DT, s, lds);
        }
        for (; j0 < n; j0 += 2) {
            if (i0 == 0)
                for (int r = j0; r < j0 + 2; r++) prefetch_row(pf, r);
            qk_rows_tile(m, i0, n, j0, 2, d, q, ldq, k, DT, s, lds);
        }
    }
}

/* The last one or two rows (TR) of qk_rows, which a decode with one or two query rows per KV
 * head (MHA, or 2 query heads per KV head) has alone: tiles of TR rows x 4 keys, 4·TR
 * accumulators, the same 8-way reduction (lane 4·ii + jj: row ii, key j0+jj). Kept apart from
 * the 4-row tiles, whose code stays as it was. Keys past n repeat key j0: computed, not stored. */
static inline __attribute__((always_inline)) void
qk_few_tile(int TR, int n, int j0, int d, const float *q, int64_t ldq, const void *const *k,
            const int32_t DT, float *s, int64_t lds, const fa__prefetch *pf) {
    const int NK = 4;
    for (int r = j0; r < j0 + NK; r++) prefetch_row(pf, r); /* pf's rows, one per key */
    __m256 acc[8]; /* acc[NK ii + jj]: row ii, key j0+jj */
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    const void *kr[4];
    const float *qr[4];
    for (int jj = 0; jj < NK; jj++) kr[jj] = k[j0 + jj < n ? j0 + jj : j0]; /* pad: repeat */
    for (int ii = 0; ii < TR; ii++) qr[ii] = q + ii * ldq;
#define FA_QK_FEW_STEP(left) /* columns c .. c+7 (left: how many of them there are) */             \
    do {                                                                                           \
        __m256 kv[4];                                                                              \
        for (int jj = 0; jj < NK; jj++) kv[jj] = load8(kr[jj], DT, c, left);                      \
        for (int ii = 0; ii < TR; ii++) {                                                          \
            const __m256 qv = load8(qr[ii], FA_DTYPE_F32, c, left);                                \
            for (int jj = 0; jj < NK; jj++)                                                        \
                acc[NK * ii + jj] = _mm256_fmadd_ps(qv, kv[jj], acc[NK * ii + jj]);                \
        }                                                                                          \
    } while (0)
    int c = 0;
    for (; c + 8 <= d; c += 8) FA_QK_FEW_STEP(8); /* whole: no tail checks */
    if (c < d) FA_QK_FEW_STEP(d - c);
#undef FA_QK_FEW_STEP
    float out[8];
    _mm256_storeu_ps(out, e4m3_unit(sum8(acc), DT));
    for (int ii = 0; ii < TR; ii++)
        for (int jj = 0; jj < NK && j0 + jj < n; jj++) s[ii * lds + j0 + jj] = out[NK * ii + jj];
}

/* qk_rows' last rows (rows = 1 or 2) for one dtype: TR compile-time in each loop. */
static inline __attribute__((always_inline)) void
qk_few_dt(int rows, int n, int d, const float *q, int64_t ldq, const void *const *k,
          const int32_t DT, float *s, int64_t lds, const fa__prefetch *pf) {
    if (rows == 2)
        for (int j0 = 0; j0 < n; j0 += 4) qk_few_tile(2, n, j0, d, q, ldq, k, DT, s, lds, pf);
    else
        for (int j0 = 0; j0 < n; j0 += 4) qk_few_tile(1, n, j0, d, q, ldq, k, DT, s, lds, pf);
}

/* qk_rows' last rows when m % 4 is 1 or 2, rows 0.. of q and s (callers offset them). */
static __attribute__((noinline)) void qk_rows_few(int rows, int n, int d, const float *q,
                                                  int64_t ldq, const void *const *k, int32_t dtype,
                                                  float *s, int64_t lds, const fa__prefetch *pf) {
    FA_BY_ROW_DTYPE(dtype, qk_few_dt(rows, n, d, q, ldq, k, FA_DT, s, lds, pf));
}

/* Rows in 4-row tiles (a last 3 as one), then a last 1 or 2 through qk_rows_few. Every dtype
 * asks for pf: on Zen 3, since decode asks for the next group's rows in memory order, fp32
 * decode of 2k-128k-token caches took 0.82-0.88 of its time on the hardware's prefetchers
 * alone (bench/results/2026-12-02-decode-zen3-asks.md; 1.08-1.16 at 1k tokens, all in L3). */
static void qk_rows_avx2(int m, int n, int d, const float *q, int64_t ldq, const void *const *k,
                         int32_t dtype, float *s, int64_t lds, const fa__prefetch *pf) {
    const int few = m % 4 == 1 || m % 4 == 2 ? m % 4 : 0, m4 = m - few;
    if (m4 > 0) {
        FA_BY_ROW_DTYPE(dtype, qk_rows_dt(m4, n, d, q, ldq, k, FA_DT, s, lds, pf));
        pf = NULL; /* asked for already */
    }
    if (few) qk_rows_few(few, n, d, q + m4 * ldq, ldq, k, dtype, s + m4 * lds, lds, pf);
}

/* bf16 row[c : c+16] from one 32-byte load: its even columns (a shift) into *even, its odd ones
 * (a mask) into *odd; even_odd_order puts sums over them back in column order. */
static inline __attribute__((always_inline)) void load16_even_odd(const void *row, int c,
                                                                  __m256 *even, __m256 *odd) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c));
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *odd = _mm256_and_ps(_mm256_castsi256_ps(x), _mm256_castsi256_ps(_mm256_set1_epi32(-65536)));
}

/* Columns c..c+7 into *even and c+8..c+15 into *odd, from sums over load16_even_odd's halves. */
static inline __attribute__((always_inline)) void even_odd_order(__m256 *even, __m256 *odd) {
    const __m256 lo = _mm256_unpacklo_ps(*even, *odd), hi = _mm256_unpackhi_ps(*even, *odd);
    *even = _mm256_permute2f128_ps(lo, hi, 0x20);
    *odd = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/* Rows i0..i0+3 of O, columns [c, c + 8·W) (W = 1, 2 or 3; the last chunk may be partial): 4·W
 * named accumulators summed over the keys, then alpha O + sum. Rows past m repeat row i0's
 * probabilities and are not stored. FULL (8·W columns left): loads without tail checks (on
 * Sapphire Rapids under FA_CPU_ISA=avx2, 0.93 of the fp16 decode's time). EO (bf16, W >= 2, 16
 * columns left): the first 16 columns through load16_even_odd, put back in order before the
 * store (two widenings and two shifts become a shift and an AND; the sums are the same, term for
 * term). */
static inline __attribute__((always_inline)) void
pv_rows_tile(int m, int i0, int n, int d, int c, const int W, const int EO, const int FULL,
             const float *p, int64_t ldp, const void *const *v, const int32_t DT,
             const float *alpha, float *o, int64_t ldo, const fa__prefetch *pf, int r0, int r1) {
    const int rows = m - i0 < 4 ? m - i0 : 4;
    const float *p0 = p + i0 * ldp, *p1 = rows > 1 ? p0 + ldp : p0;
    const float *p2 = rows > 2 ? p0 + 2 * ldp : p0, *p3 = rows > 3 ? p0 + 3 * ldp : p0;
    const __m256 z = _mm256_setzero_ps();
    __m256 a0 = z, a1 = z, a2 = z, a3 = z; /* columns c .. c+7 */
    __m256 b0 = z, b1 = z, b2 = z, b3 = z; /* c+8 .. c+15 */
    __m256 e0 = z, e1 = z, e2 = z, e3 = z; /* c+16 .. c+23 */
    int r = r0, due = 0;
    for (int j = 0; j < n; j++) {
        prefetch_spread(pf, n, r0, r1, &due, &r);
        __m256 va, vb;
        if (EO) { /* bf16 V[j, c:c+16] as its even (va) and odd (vb) columns */
            load16_even_odd(v[j], c, &va, &vb);
        } else {
            va = load8(v[j], DT, c, FULL ? 8 : d - c); /* V[j, c:c+8] */
            vb = W >= 2 ? load8(v[j], DT, c + 8, FULL ? 8 : d - c - 8) : z;
        }
        const __m256 ve = W >= 3 ? load8(v[j], DT, c + 16, FULL ? 8 : d - c - 16) : z;
#define FA_PV_ROW(ii, pi)                                                                          \
    do {                                                                                           \
        const __m256 sp = _mm256_broadcast_ss(pi + j); /* P[i0 + ii, j] */                       \
        a##ii = _mm256_fmadd_ps(sp, va, a##ii);                                                    \
        if (W >= 2) b##ii = _mm256_fmadd_ps(sp, vb, b##ii);                                        \
        if (W >= 3) e##ii = _mm256_fmadd_ps(sp, ve, e##ii);                                        \
    } while (0)
        FA_PV_ROW(0, p0);
        FA_PV_ROW(1, p1);
        FA_PV_ROW(2, p2);
        FA_PV_ROW(3, p3);
#undef FA_PV_ROW
    }
    __m256 acc[3][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}, {e0, e1, e2, e3}};
    if (EO) /* the even and odd columns back in order */
        for (int ii = 0; ii < 4; ii++)
            even_odd_order(&acc[0][ii], &acc[1][ii]);
    for (int w = 0; w < W; w++) {
        const int left = d - c - 8 * w;
        for (int ii = 0; ii < rows; ii++) {
            float *oi = o + (i0 + ii) * ldo + c + 8 * w;
            const __m256 x = _mm256_fmadd_ps(_mm256_set1_ps(alpha[i0 + ii]),
                                             load8(oi, FA_DTYPE_F32, 0, left),
                                             e4m3_unit(acc[w][ii], DT));
            if (left >= 8) _mm256_storeu_ps(oi, x);
            else _mm256_maskstore_ps(oi, lanes(left), x);
        }
    }
}

/* 4-row tiles 24 columns wide while more than 32 are left (12 accumulators: Zen 3's FMAs, 4
 * cycles of latency at 2 a cycle, need 8 in flight, and 12 leave slack for the loads), then 16
 * and 8 wide (D = 128: four of 24 and two of 16). */
static inline __attribute__((always_inline)) void pv_rows_dt(int m, int n, int d, const float *p,
                                                             int64_t ldp, const void *const *v,
                                                             const int32_t DT, const float *alpha,
                                                             float *o, int64_t ldo,
                                                             const fa__prefetch *pf) {
    int tiles = 0; /* per 4 rows */
    for (int c = 0; d - c > 0; c += d - c > 32 ? 24 : 16) tiles++;
    tiles *= (m + 3) / 4;
    const int np = pf ? pf->n : 0;
    int t = 0; /* tile t asks for pf's rows [t·np/tiles, (t+1)·np/tiles) */
#define FA_PV_TILE(W)                                                                              \
    do {                                                                                           \
        const int r0 = t * np / tiles, r1 = (t + 1) * np / tiles;                                  \
        const int eo = W >= 2 && DT == FA_DTYPE_BF16 && d - c >= 16;                               \
        if (d - c >= 8 * W && eo) /* whole: no tail checks */                                      \
            pv_rows_tile(m, i0, n, d, c, W, 1, 1, p, ldp, v, DT, alpha, o, ldo, pf, r0, r1);       \
        else if (d - c >= 8 * W)                                                                   \
            pv_rows_tile(m, i0, n, d, c, W, 0, 1, p, ldp, v, DT, alpha, o, ldo, pf, r0, r1);       \
        else if (eo)                                                                               \
            pv_rows_tile(m, i0, n, d, c, W, 1, 0, p, ldp, v, DT, alpha, o, ldo, pf, r0, r1);       \
        else                                                                                       \
            pv_rows_tile(m, i0, n, d, c, W, 0, 0, p, ldp, v, DT, alpha, o, ldo, pf, r0, r1);       \
        t++;                                                                                       \
    } while (0)
    for (int i0 = 0; i0 < m; i0 += 4) {
        int c = 0;
        for (; d - c > 32; c += 24) FA_PV_TILE(3);
        for (; d - c > 8; c += 16) FA_PV_TILE(2);
        if (d - c > 0) FA_PV_TILE(1);
    }
#undef FA_PV_TILE
}

/* Rows 0..TR-1 of O (TR = 1 or 2: the last rows, so one or two query rows per KV head do not
 * pay for four), columns [c, c + 8·W) (W = 1, 2 or 4; the last chunk may be partial): TR·W named
 * accumulators summed over the keys, then alpha O + sum. FULL: as pv_rows_tile's. EO (bf16,
 * W = 4, 32 columns left): as pv_rows_tile's, two pairs of even and odd columns. */
static inline __attribute__((always_inline)) void
pv_rows_small(int TR, int n, int d, int c, const int W, const int EO, const int FULL,
              const float *p, int64_t ldp, const void *const *v, const int32_t DT,
              const float *alpha, float *o, int64_t ldo, const fa__prefetch *pf, int r0, int r1) {
    const float *p0 = p, *p1 = TR > 1 ? p + ldp : p;
    const __m256 z = _mm256_setzero_ps();
    __m256 a0 = z, a1 = z, a2 = z, a3 = z; /* row 0, chunk w */
    __m256 b0 = z, b1 = z, b2 = z, b3 = z; /* row 1 */
    int r = r0, due = 0;
    for (int j = 0; j < n; j++) {
        prefetch_spread(pf, n, r0, r1, &due, &r);
        const __m256 s0 = _mm256_broadcast_ss(p0 + j), s1 = _mm256_broadcast_ss(p1 + j);
#define FA_PV_SMALL(w)                                                                             \
    do {                                                                                           \
        const __m256 vw = load8(v[j], DT, c + 8 * (w), FULL ? 8 : d - c - 8 * (w)); /* V[j, w] */  \
        a##w = _mm256_fmadd_ps(s0, vw, a##w);                                                      \
        if (TR > 1) b##w = _mm256_fmadd_ps(s1, vw, b##w);                                          \
    } while (0)
        if (EO) { /* bf16 V[j, c:c+32] as two pairs of even and odd columns */
            __m256 ve0, vo0, ve1, vo1;
            load16_even_odd(v[j], c, &ve0, &vo0);
            load16_even_odd(v[j], c + 16, &ve1, &vo1);
            a0 = _mm256_fmadd_ps(s0, ve0, a0);
            a1 = _mm256_fmadd_ps(s0, vo0, a1);
            a2 = _mm256_fmadd_ps(s0, ve1, a2);
            a3 = _mm256_fmadd_ps(s0, vo1, a3);
            if (TR > 1) {
                b0 = _mm256_fmadd_ps(s1, ve0, b0);
                b1 = _mm256_fmadd_ps(s1, vo0, b1);
                b2 = _mm256_fmadd_ps(s1, ve1, b2);
                b3 = _mm256_fmadd_ps(s1, vo1, b3);
            }
        } else {
            FA_PV_SMALL(0);
            if (W > 1) FA_PV_SMALL(1);
            if (W > 2) {
                FA_PV_SMALL(2);
                FA_PV_SMALL(3);
            }
        }
#undef FA_PV_SMALL
    }
    __m256 acc[2][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}};
    if (EO) /* the even and odd columns back in order */
        for (int ii = 0; ii < TR; ii++)
            for (int w = 0; w < 4; w += 2)
                even_odd_order(&acc[ii][w], &acc[ii][w + 1]);
    for (int w = 0; w < W; w++) {
        const int left = d - c - 8 * w;
        for (int ii = 0; ii < TR; ii++) {
            float *oi = o + ii * ldo + c + 8 * w;
            const __m256 x = _mm256_fmadd_ps(_mm256_set1_ps(alpha[ii]),
                                             load8(oi, FA_DTYPE_F32, 0, left),
                                             e4m3_unit(acc[ii][w], DT));
            if (left >= 8) _mm256_storeu_ps(oi, x);
            else _mm256_maskstore_ps(oi, lanes(left), x);
        }
    }
}

/* TR rows through pv_rows_small, W as wide as d allows. */
static inline __attribute__((always_inline)) void
pv_rows_last(int TR, int n, int d, const float *p, int64_t ldp, const void *const *v,
             const int32_t DT, const float *alpha, float *o, int64_t ldo, const fa__prefetch *pf) {
    const int tiles = (d + 31) / 32, np = pf ? pf->n : 0; /* tile t: pf's rows as pv_rows_dt's */
    int c = 0, t = 0;
    for (; d - c > 16; c += 32, t++) {
        const int r0 = t * np / tiles, r1 = (t + 1) * np / tiles;
        if (DT == FA_DTYPE_BF16 && d - c >= 32) /* whole 16-column pairs */
            pv_rows_small(TR, n, d, c, 4, 1, 1, p, ldp, v, DT, alpha, o, ldo, pf, r0, r1);
        else if (d - c >= 32) /* whole: no tail checks */
            pv_rows_small(TR, n, d, c, 4, 0, 1, p, ldp, v, DT, alpha, o, ldo, pf, r0, r1);
        else pv_rows_small(TR, n, d, c, 4, 0, 0, p, ldp, v, DT, alpha, o, ldo, pf, r0, r1);
    }
    if (d - c > 8)
        pv_rows_small(TR, n, d, c, 2, 0, 0, p, ldp, v, DT, alpha, o, ldo, pf, t * np / tiles, np);
    else if (d - c > 0)
        pv_rows_small(TR, n, d, c, 1, 0, 0, p, ldp, v, DT, alpha, o, ldo, pf, t * np / tiles, np);
}

/* pv_rows' last rows (rows = 1 or 2) for one dtype: TR compile-time in each call. */
static inline __attribute__((always_inline)) void
pv_few_dt(int rows, int n, int d, const float *p, int64_t ldp, const void *const *v,
          const int32_t DT, const float *alpha, float *o, int64_t ldo, const fa__prefetch *pf) {
    if (rows == 2) pv_rows_last(2, n, d, p, ldp, v, DT, alpha, o, ldo, pf);
    else pv_rows_last(1, n, d, p, ldp, v, DT, alpha, o, ldo, pf);
}

/* pv_rows' last rows when m % 4 is 1 or 2, rows 0.. of p, alpha and o (callers offset them). */
static __attribute__((noinline)) void pv_rows_few(int rows, int n, int d, const float *p,
                                                  int64_t ldp, const void *const *v, int32_t dtype,
                                                  const float *alpha, float *o, int64_t ldo,
                                                  const fa__prefetch *pf) {
    FA_BY_ROW_DTYPE(dtype, pv_few_dt(rows, n, d, p, ldp, v, FA_DT, alpha, o, ldo, pf));
}

/* Rows in 4-row tiles (a last 3 as one), then a last 1 or 2 through pv_rows_few. Every dtype
 * asks for pf, as in qk_rows_avx2. */
static void pv_rows_avx2(int m, int n, int d, const float *p, int64_t ldp, const void *const *v,
                         int32_t dtype, const float *alpha, float *o, int64_t ldo,
                         const fa__prefetch *pf) {
    const int few = m % 4 == 1 || m % 4 == 2 ? m % 4 : 0, m4 = m - few;
    if (m4 > 0) {
        FA_BY_ROW_DTYPE(dtype, pv_rows_dt(m4, n, d, p, ldp, v, FA_DT, alpha, o, ldo, pf));
        pf = NULL; /* asked for already */
    }
    if (few)
        pv_rows_few(few, n, d, p + m4 * ldp, ldp, v, dtype, alpha + m4, o + m4 * ldo, ldo, pf);
}

/* 8 x 8 blocks through unpack/shuffle/permute; rows past n load as zeros, columns past d and
 * n are not stored. */
static void transpose_avx2(int n, int d, const float *src, int64_t lds, float *dst, int64_t ldd) {
    for (int j0 = 0; j0 < n; j0 += 8)
        for (int t0 = 0; t0 < d; t0 += 8) {
            const __m256i kt = lanes(d - t0), kj = lanes(n - j0);
            __m256 r[8], u[8], w[8];
            const int full_t = d - t0 >= 8, full_j = n - j0 >= 8; /* plain loads and stores */
            for (int i = 0; i < 8; i++) /* r[i] = src[j0 + i, t0:t0+8] */
                r[i] = j0 + i >= n ? _mm256_setzero_ps()
                       : full_t    ? _mm256_loadu_ps(src + (j0 + i) * lds + t0)
                                   : _mm256_maskload_ps(src + (j0 + i) * lds + t0, kt);
            for (int i = 0; i < 8; i += 2) {
                u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                w[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
                w[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xEE);
                w[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
                w[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
            }
            for (int e = 0; e < 4; e++) { /* output rows t0 + e and t0 + 4 + e */
                const __m256 lo = _mm256_permute2f128_ps(w[e], w[4 + e], 0x20);
                const __m256 hi = _mm256_permute2f128_ps(w[e], w[4 + e], 0x31);
                if (full_j) {
                    if (t0 + e < d) _mm256_storeu_ps(dst + (t0 + e) * ldd + j0, lo);
                    if (t0 + 4 + e < d) _mm256_storeu_ps(dst + (t0 + 4 + e) * ldd + j0, hi);
                } else {
                    if (t0 + e < d) _mm256_maskstore_ps(dst + (t0 + e) * ldd + j0, kj, lo);
                    if (t0 + 4 + e < d) _mm256_maskstore_ps(dst + (t0 + 4 + e) * ldd + j0, kj, hi);
                }
            }
        }
}

static inline float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static inline float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static float row_max_avx2(int n, const float *x) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 mx = ninf, mx1 = ninf; /* two chains: a row is only 16 vectors */
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + j));
        mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(x + j + 8));
    }
    mx = _mm256_max_ps(mx, mx1);
    if (j + 8 <= n) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + j)), j += 8;
    if (j < n) { /* the tail */
        const __m256i k = lanes(n - j);
        const __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + j, k), _mm256_castsi256_ps(k));
        mx = _mm256_max_ps(mx, v);
    }
    return hmax(mx);
}

/* 2^x for x <= 127, within 1 ulp: x = n + f with f in [-1/2, 1/2], 2^f by a degree-6
 * polynomial, times 2^n built in the exponent bits. x is clamped to -127 first, where n = -127
 * builds the exponent bits 0, a factor of exactly 0: below -126.5 the result is 0, so -inf
 * gives exactly 0. NaN gives NaN: the clamp is max(-127, x), and maxps returns its second
 * operand when either is NaN. */
static inline __m256 exp2_ps(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5345810970757157e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3399932067841291e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618489071726799e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550328642129898e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022646248340607e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471824645996e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static float exp2_sum_avx2(int n, float *x, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps(); /* two chains of adds */
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m256 e = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
        const __m256 e1 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), vm));
        _mm256_storeu_ps(x + j, e);
        _mm256_storeu_ps(x + j + 8, e1);
        sum = _mm256_add_ps(sum, e);
        sum1 = _mm256_add_ps(sum1, e1);
    }
    sum = _mm256_add_ps(sum, sum1);
    if (j + 8 <= n) {
        const __m256 e = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
        _mm256_storeu_ps(x + j, e);
        sum = _mm256_add_ps(sum, e);
        j += 8;
    }
    if (j < n) { /* the tail */
        const __m256i k = lanes(n - j);
        const __m256 e = _mm256_and_ps(exp2_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, k), vm)),
                                       _mm256_castsi256_ps(k));
        _mm256_maskstore_ps(x + j, k, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum(sum);
}

/* The online softmax step (kernels.h): per row the max, then the exp2 and the sum. */
static void softmax_rows_avx2(int rows, int n, float *x, int64_t ldx, float *m, float *sum) {
    fa__softmax_rows_2pass(rows, n, x, ldx, m, sum, row_max_avx2, exp2_sum_avx2);
}

const fa__cpu_kernels fa__cpu_kernels_avx2 = {
    .name = "avx2",
    .gemm_rows = 6,
    .qk = qk_avx2,
    .pv = pv_avx2,
    .pv_t = pv_t_avx2,
    .pv_packed_b = 1, /* one line per row and k step: 77% of its rate on rows 8 KiB apart */
    .qk_rows = qk_rows_avx2,
    .pv_rows = pv_rows_avx2,
    .decode_keys_half = {32, 32}, /* Zen 3: GQA fp16 in 0.88-0.95 of 64/32's time */
    .decode_rows_f32 = 32,        /* Zen 4: 1.32 times the prefill's time at 64 rows */
    .to_f32 = to_f32_avx2,
    .from_f32 = from_f32_avx2,
    .transpose = transpose_avx2,
    .softmax_rows = softmax_rows_avx2,
    .exp2_sum = exp2_sum_avx2,
};
