/* SPDX-License-Identifier: MIT */
/*
 * bf16.c — AVX512_BF16 microkernels: both products with vdpbf16ps, which multiplies pairs of
 * bf16 and accumulates in fp32. Called only when features.c has seen AVX512_BF16.
 *
 * Operands hold bf16 pairs along the reduction dimension in 32-bit words ("VNNI" layout):
 *   qk: S[m, n] = scale · Q[m, d] K[n, d]ᵀ  with Q as [m, d2] pairs and K packed as [d2, n] pairs
 *   pv: O[m, d] = diag(alpha) O + P[m, n] V[n, d]  with P as [m, n2] pairs, V as [n2, d] pairs
 * (d2 = ceil(d / 2), n2 = ceil(n / 2), an odd tail padded with bf16 zero).
 *   pv_t: the same with P given as [n2, m] pairs (the backward's Pᵀ and dSᵀ: pairs of query
 *         rows, read in place from two rows interleaved).
 *   qk_rows: decode's S = scale · Q Kᵀ with K rows read in place by pointer: a bf16 row is its
 *         own [d2] pairs along d, so no packing or conversion.
 * and the backward's step between its products (bwd_pair_bf16): P, dS and their bf16 pairs.
 * The tiles are those of avx512.c: MR rows x 32 columns in 2·MR zmm accumulators, one broadcast
 * pair per row.
 */
#include "../avx512/decode_common.h"
#include "../avx512/exp2.h"
#include "../kernels.h"

#include <immintrin.h>

/* Kernel pieces always inlined, so their callers' constant masks fold. */
#define FA_INLINE static inline __attribute__((always_inline))

static inline __mmask16 tail_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/* One MR x 32 tile: C = (beta ? diag(beta) C : 0) + scale A B. k counts pairs; A's pair (i, t)
 * is a[i * lda + t], or a[t * lda + i] when at (A transposed; a constant). Inlined into panel(),
 * so whole panels run with constant masks: plain loads and stores. The transposed product's C (the
 * backward's dK, dV sums, which come from L2 or L3) is asked for before the k loop: its loads
 * stalled the epilogue (18% of the product's samples at S = 4096, D = 128). */
#define FA_BF16_TILE(MR)                                                                           \
    FA_INLINE void tile_##MR(int k, const uint32_t *a, int64_t lda, const int at,                  \
                             const uint32_t *b, int64_t ldb, const float *beta, float scale,       \
                             float *c, int64_t ldc, __mmask16 m0, __mmask16 m1) {                  \
        __m512 acc[MR][2]; /* C tile: [MR, 32] */                                                  \
        if (at && beta)                                                                            \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                \
                _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);                            \
                _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);                       \
            }                                                                                      \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
            acc[i][0] = _mm512_setzero_ps();                                                       \
            acc[i][1] = _mm512_setzero_ps();                                                       \
        }                                                                                          \
        for (int t = 0; t < k; t++) {                                                              \
            /* B[t, 0:32]: 32 columns of one pair each */                                          \
            const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, b + t * ldb);               \
            const __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, b + t * ldb + 16);          \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                \
                const uint32_t pair = at ? a[t * lda + i] : a[i * lda + t];                        \
                const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)pair);                        \
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);                                   \
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);                                   \
            }                                                                                      \
        }                                                                                          \
        /* C = beta C + scale (this call's sum); summing calls apart keeps long sums accurate */   \
        const __m512 vs = _mm512_set1_ps(scale);                                                   \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
            __m512 c0 = _mm512_mul_ps(vs, acc[i][0]), c1 = _mm512_mul_ps(vs, acc[i][1]);           \
            if (beta) {                                                                            \
                const __m512 s = _mm512_set1_ps(beta[i]);                                          \
                c0 = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(m0, c + i * ldc), c0);               \
                c1 = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(m1, c + i * ldc + 16), c1);          \
            }                                                                                      \
            _mm512_mask_storeu_ps(c + i * ldc, m0, c0);                                            \
            _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c1);                                       \
        }                                                                                          \
    }

FA_BF16_TILE(9)
FA_BF16_TILE(8)
FA_BF16_TILE(4)
FA_BF16_TILE(2)
FA_BF16_TILE(1)

/* Columns [0, 32) of C (lanes outside (m0, m1) untouched), in FA_TILES_9's tiles (the
 * backward's 128 and 64 keys: 8 x 9 + 7 x 8 and 8 x 8). */
FA_INLINE void panel(int m, int k2, const uint32_t *a, int64_t lda, const int at, const uint32_t *b,
                     int64_t ldb, const float *beta, float scale, float *c, int64_t ldc,
                     __mmask16 m0, __mmask16 m1) {
    int i = 0;
#define FA_BF16_RUN(MR)                                                                            \
    tile_##MR(k2, a + (at ? i : i * lda), lda, at, b, ldb, beta ? beta + i : 0, scale,           \
              c + i * ldc, ldc, m0, m1);                                                           \
    i += MR
    FA_TILES_9(m, i, FA_BF16_RUN);
#undef FA_BF16_RUN
}

FA_INLINE void gemm(int m, int n, int k2, const uint32_t *a, int64_t lda, const int at,
                    const uint32_t *b, int64_t ldb, const float *beta, float scale, float *c,
                    int64_t ldc) {
    for (int j0 = 0; j0 < n; j0 += 32) {
        if (n - j0 >= 32) /* whole panel: constant masks */
            panel(m, k2, a, lda, at, b + j0, ldb, beta, scale, c + j0, ldc, 0xFFFF, 0xFFFF);
        else
            panel(m, k2, a, lda, at, b + j0, ldb, beta, scale, c + j0, ldc, tail_mask(n - j0),
                  tail_mask(n - j0 - 16));
    }
}

/* A as it is (qk, pv) or transposed (pv_t): one function each. */
static void gemm_n(int m, int n, int k2, const uint32_t *a, int64_t lda, const uint32_t *b,
                   int64_t ldb, const float *beta, float scale, float *c, int64_t ldc) {
    gemm(m, n, k2, a, lda, 0, b, ldb, beta, scale, c, ldc);
}

static void gemm_t(int m, int n, int k2, const uint32_t *a, int64_t lda, const uint32_t *b,
                   int64_t ldb, const float *beta, float *c, int64_t ldc) {
    gemm(m, n, k2, a, lda, 1, b, ldb, beta, 1.0f, c, ldc);
}

void fa__qk_bf16_avx512(int m, int n, int d2, const uint32_t *q, int64_t ldq, const uint32_t *k,
                        int64_t ldk, float scale, float *s, int64_t lds) {
    gemm_n(m, n, d2, q, ldq, k, ldk, 0, scale, s, lds);
}

void fa__pv_bf16_avx512(int m, int n2, int d, const uint32_t *p, int64_t ldp, const uint32_t *v,
                        int64_t ldv, const float *alpha, float *o, int64_t ldo) {
    gemm_n(m, d, n2, p, ldp, v, ldv, alpha, 1.0f, o, ldo);
}

void fa__pv_bf16_t_avx512(int m, int n2, int d, const uint32_t *pt, int64_t ldp, const uint32_t *v,
                          int64_t ldv, const float *alpha, float *o, int64_t ldo) {
    gemm_t(m, d, n2, pt, ldp, v, ldv, alpha, o, ldo);
}

/* fp32 -> bf16 with round to nearest even (vcvtneps2bf16); an odd n gets a zero pad. */
void fa__to_bf16_avx512(int n, const float *x, uint16_t *y) {
    int j = 0;
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(y + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + j)));
    if (j < n) {
        const __mmask16 k = tail_mask(n - j);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x + j));
        _mm256_mask_storeu_epi16(y + j, k, h);
    }
    if (n & 1) y[n] = 0;
}

/* Two rows of 16 bf16 as 16 pairs: lo | hi << 16. */
static inline __m512i pairs16(__m256i lo, __m256i hi) {
    return _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}

void fa__interleave_bf16_avx512(int n, const uint16_t *a, const uint16_t *b, uint32_t *dst) {
    for (int t = 0; t < n; t += 16) {
        const __mmask16 k = tail_mask(n - t);
        _mm512_mask_storeu_epi32(dst + t, k, pairs16(_mm256_maskz_loadu_epi16(k, a + t),
                                                     _mm256_maskz_loadu_epi16(k, b + t)));
    }
}

void fa__pair_bf16_avx512(int n, const float *a, const float *b, uint32_t *dst) {
    for (int t = 0; t < n; t += 16) {
        const __mmask16 k = tail_mask(n - t);
        const __m256i ha = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, a + t));
        const __m256i hb = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, b + t));
        _mm512_mask_storeu_epi32(dst + t, k, pairs16(ha, hb));
    }
}

/* Tiles of 4 rows x 4 keys as avx512.c's qk_rows, on pairs: 16 accumulators over d2, one
 * 16-way reduction, the scale applied to the sums. L2: asks into L2, else L1 (fa__ask). */
FA_INLINE void qk_rows_bf16(int m, int n, int d2, const uint32_t *q, int64_t ldq,
                            const void *const *k, float scale, float *s, int64_t lds,
                            const fa__prefetch *pf, const int L2) {
    const int dfull = d2 / 16 * 16;
    const __m512 vs = _mm512_set1_ps(scale);
    fa__asks ask = fa__asks_begin(pf); /* asked for by the first 4 rows */
    for (int i0 = 0; i0 < m; i0 += 4)
        for (int j0 = 0; j0 < n; j0 += 4) {
            __m512 acc[16]; /* acc[4 ii + jj]: rows i0+ii, keys j0+jj */
            for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
            const char *kr[4];
            const uint32_t *qr[4];
            for (int jj = 0; jj < 4; jj++) kr[jj] = k[j0 + jj < n ? j0 + jj : j0]; /* pad: repeat */
            for (int ii = 0; ii < 4; ii++) /* rows past m repeat row i0: computed, not stored */
                qr[ii] = q + (i0 + (i0 + ii < m ? ii : 0)) * ldq;
            for (int c = 0; c < d2; c += 16) {
                const __mmask16 mk = c < dfull ? (__mmask16)0xFFFF : tail_mask(d2 - c);
                __m512bh kv[4], qv[4];
                if (i0 == 0) fa__ask_lines(&ask, 4, L2); /* a line per line loaded */
                for (int jj = 0; jj < 4; jj++)
                    kv[jj] = (__m512bh)_mm512_maskz_loadu_epi32(mk, kr[jj] + 4 * c);
                for (int ii = 0; ii < 4; ii++)
                    qv[ii] = (__m512bh)_mm512_maskz_loadu_epi32(mk, qr[ii] + c);
                for (int ii = 0; ii < 4; ii++)
                    for (int jj = 0; jj < 4; jj++)
                        acc[4 * ii + jj] = _mm512_dpbf16_ps(acc[4 * ii + jj], qv[ii], kv[jj]);
            }
            fa__store_tile4(_mm512_mul_ps(vs, fa__sum16(acc)), m - i0 < 4 ? m - i0 : 4, n - j0,
                            s + i0 * lds + j0, lds);
        }
    fa__ask_rest(&ask, L2);
}

void fa__qk_rows_bf16_avx512(int m, int n, int d2, const uint32_t *q, int64_t ldq,
                             const void *const *k, float scale, float *s, int64_t lds,
                             const fa__prefetch *pf) {
    qk_rows_bf16(m, n, d2, q, ldq, k, scale, s, lds, pf, 0);
}

void fa__qk_rows_bf16_l2_avx512(int m, int n, int d2, const uint32_t *q, int64_t ldq,
                                const void *const *k, float scale, float *s, int64_t lds,
                                const fa__prefetch *pf) {
    qk_rows_bf16(m, n, d2, q, ldq, k, scale, s, lds, pf, 1);
}

/* Decode's pv_rows on pairs: O = diag(alpha) O + P V for rows i0..i0+3 and 64 columns at a time.
 * Keys go in pairs (2t, 2t + 1); vpermt2w interleaves the two V rows' columns into pairs, so
 * each vdpbf16ps does two keys' products per column; an odd last key pairs with a zero P and a
 * zero V row (its own row there would give 0 times an infinity of V, NaN, in every row). The
 * sum over the keys is taken on its own and then added to alpha O, as avx512.c's pv_rows does.
 * L2: as in qk_rows_bf16. */
FA_INLINE void pv_rows_bf16(int m, int n, int d, const uint32_t *p2, int64_t ldp,
                            const void *const *v, const float *alpha, float *o, int64_t ldo,
                            const fa__prefetch *pf, const int L2) {
    static const uint16_t lo_hi[64] = { /* pair k of the low / high 16 columns: (A[k], B[k]) */
        0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
        8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47,
        16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
        24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i ilo = _mm512_loadu_si512(lo_hi), ihi = _mm512_loadu_si512(lo_hi + 32);
    const int n2 = (n + 1) / 2;
    fa__asks ask = fa__asks_begin(pf); /* asked for by the first 4 rows */
    for (int i0 = 0; i0 < m; i0 += 4)
        for (int c = 0; c < d; c += 64) {
            const int left = d - c;
            const __mmask32 k0 = left >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
            const __mmask32 k1 = left >= 64   ? 0xFFFFFFFFu
                                 : left <= 32 ? 0u
                                              : (__mmask32)((1u << (left - 32)) - 1u);
            const __m512 z = _mm512_setzero_ps();
            __m512 acc[4][4] = {{z, z, z, z}, {z, z, z, z}, {z, z, z, z}, {z, z, z, z}};
            for (int t = 0; t < n2; t++) {
                if (i0 == 0) fa__ask_lines(&ask, 4, L2); /* 2 rows x 128 bytes loaded */
                const int pair = 2 * t + 1 < n; /* else key 2t's partner is a row of zeros */
                const char *va = v[2 * t], *vb = pair ? v[2 * t + 1] : va;
                __m512bh s[4]; /* row ii's probabilities of keys 2t, 2t + 1 */
                for (int ii = 0; ii < 4; ii++)
                    s[ii] = (__m512bh)_mm512_set1_epi32((int)p2[(i0 + ii) * ldp + t]);
                for (int h = 0; h < 2; h++) { /* columns c + 32h .. c + 32h + 31 */
                    const __mmask32 k = h ? k1 : k0;
                    if (!k) break;
                    const __m512i a = _mm512_maskz_loadu_epi16(k, va + 2 * (c + 32 * h));
                    const __m512i b = _mm512_maskz_loadu_epi16(pair ? k : 0, vb + 2 * (c + 32 * h));
                    const __m512bh lo = (__m512bh)_mm512_permutex2var_epi16(a, ilo, b);
                    const __m512bh hi = (__m512bh)_mm512_permutex2var_epi16(a, ihi, b);
                    for (int ii = 0; ii < 4; ii++) {
                        acc[2 * h][ii] = _mm512_dpbf16_ps(acc[2 * h][ii], s[ii], lo);
                        acc[2 * h + 1][ii] = _mm512_dpbf16_ps(acc[2 * h + 1][ii], s[ii], hi);
                    }
                }
            }
            for (int w = 0; w < 4 && 16 * w < left; w++) {
                const __mmask16 kd = tail_mask(left - 16 * w);
                for (int ii = 0; ii < 4; ii++) {
                    float *oi = o + (i0 + ii) * ldo + c + 16 * w;
                    const __m512 prev = _mm512_maskz_loadu_ps(kd, oi);
                    _mm512_mask_storeu_ps(
                        oi, kd, _mm512_fmadd_ps(_mm512_set1_ps(alpha[i0 + ii]), prev, acc[w][ii]));
                }
            }
        }
    fa__ask_rest(&ask, L2);
}

void fa__pv_rows_bf16_avx512(int m, int n, int d, const uint32_t *p2, int64_t ldp,
                             const void *const *v, const float *alpha, float *o, int64_t ldo,
                             const fa__prefetch *pf) {
    pv_rows_bf16(m, n, d, p2, ldp, v, alpha, o, ldo, pf, 0);
}

void fa__pv_rows_bf16_l2_avx512(int m, int n, int d, const uint32_t *p2, int64_t ldp,
                                const void *const *v, const float *alpha, float *o, int64_t ldo,
                                const fa__prefetch *pf) {
    pv_rows_bf16(m, n, d, p2, ldp, v, alpha, o, ldo, pf, 1);
}

/* The backward's row step on a pair of rows (kernels.h), 16 keys at a time: the same operations
 * in the same order as exp2_sum, the dS loop, to_bf16, pair_bf16 and interleave_bf16 one after
 * the other, so the bits are theirs. */
void fa__bwd_pair_bf16_avx512(int n, const float *const s[2], const float *const dp[2],
                              const float lse[2], const float dlt[2], uint16_t *const ds2[2],
                              uint32_t *px, uint32_t *dsx) {
    for (int j = 0; j < n; j += 16) {
        const __mmask16 k = tail_mask(n - j);
        __m256i hp[2], hd[2]; /* bf16 of P and dS, per row */
        for (int r = 0; r < 2; r++) {
            if (!s[r]) { /* a row outside the tile's: 0 */
                hp[r] = hd[r] = _mm256_setzero_si256();
                continue;
            }
            const __m512 x =
                _mm512_sub_ps(_mm512_maskz_loadu_ps(k, s[r] + j), _mm512_set1_ps(lse[r]));
            const __m512 pr = fa__exp2_ps(x); // P = 2^(S - lse)
            const __m512 dpr = _mm512_maskz_loadu_ps(k, dp[r] + j);
            const __m512 dsr = _mm512_mul_ps(pr, _mm512_sub_ps(dpr, _mm512_set1_ps(dlt[r])));
            hp[r] = (__m256i)_mm512_cvtneps_pbh(pr);
            hd[r] = (__m256i)_mm512_cvtneps_pbh(dsr);
            if (ds2[r]) _mm256_mask_storeu_epi16(ds2[r] + j, k, hd[r]);
        }
        if (px) _mm512_mask_storeu_epi32(px + j, k, pairs16(hp[0], hp[1]));
        if (dsx) _mm512_mask_storeu_epi32(dsx + j, k, pairs16(hd[0], hd[1]));
    }
    if (n & 1) /* dS as pairs along keys: an odd row ends on a zero */
        for (int r = 0; r < 2; r++)
            if (ds2[r]) ds2[r][n] = 0;
}
