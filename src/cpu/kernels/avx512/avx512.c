/* SPDX-License-Identifier: MIT */
/*
 * avx512.c — AVX-512F microkernels. Built with -mavx512f -mfma and called only after
 * features.c has seen AVX-512F in CPUID and ZMM state enabled in XCR0.
 *
 * Both products are one register-tiled GEMM, C[m, n] = diag(beta) C + A[m, k] B[k, n]
 * (qk: A = Q, B = Kᵀ, beta = none; pv: A = P, B = V, beta = alpha). A tile is MR rows x 32
 * columns held in 2·MR zmm accumulators; each step of k loads one 32-wide row of B and
 * broadcasts one element of A per row (9 x 32: 18 accumulators, 18 FMAs per 2 loads and 9
 * broadcasts). 9 rows leave general registers for every row's address: a 14-row tile (28
 * accumulators) ran at 92.7% of the FMA peak on Zen 4, its row offsets spilled to the stack,
 * where 9 rows run at 98.9% (126 x 128 x 128, operands in L1/L2).
 */
#include "../kernels.h"
#include "decode_common.h"
#include "exp2.h"

#include "flashattn.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Kernel pieces always inlined, so their callers' compile-time arguments (dtype, masks) fold. */
#define FA_INLINE static inline __attribute__((always_inline))

static inline __mmask16 tail_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/* One MR x 32 tile of C; lanes outside (m0, m1) are neither read nor written. A[i, t] is at
 * a[i·lda + t], or at a[t·lda + i] when AT (A given transposed: then the tile's MR elements of a
 * step of k are side by side). Inlined into panel(), so AT and a whole panel's constant masks
 * fold: plain loads and stores (masks held in registers cost about 8% of the FMA rate on Zen 4). */
#define FA_AVX512_TILE(MR)                                                                         \
    FA_INLINE void tile_##MR(int k, const float *a, int64_t lda, const int AT, const float *b,     \
                             int64_t ldb, const float *beta, float *c, int64_t ldc, __mmask16 m0,  \
                             __mmask16 m1) {                                                       \
        __m512 acc[MR][2]; /* C tile: [MR, 32] */                                                  \
        if (AT && beta) /* the backward's dK, dV sums: asked for first, as in bf16.c */            \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                \
                _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);                            \
                _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);                       \
            }                                                                                      \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
            acc[i][0] = _mm512_setzero_ps();                                                       \
            acc[i][1] = _mm512_setzero_ps();                                                       \
        }                                                                                          \
        for (int t = 0; t < k; t++) {                                                              \
            const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + t * ldb);      /* B[t, 0:16] */        \
            const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + t * ldb + 16); /* B[t, 16:32] */       \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                \
                const __m512 ai = _mm512_set1_ps(AT ? a[t * lda + i] : a[i * lda + t]);            \
                acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);                                    \
                acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);                                    \
            }                                                                                      \
        }                                                                                          \
        /* C = beta C + (this call's sum): summing each call apart keeps long sums accurate */     \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
            if (beta) {                                                                            \
                const __m512 s = _mm512_set1_ps(beta[i]);                                          \
                acc[i][0] = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(m0, c + i * ldc), acc[i][0]); \
                acc[i][1] =                                                                        \
                    _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(m1, c + i * ldc + 16), acc[i][1]);    \
            }                                                                                      \
            _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);                                     \
            _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);                                \
        }                                                                                          \
    }

FA_AVX512_TILE(9)
FA_AVX512_TILE(8)
FA_AVX512_TILE(4)
FA_AVX512_TILE(2)
FA_AVX512_TILE(1)

/* Columns [0, 32) of C (lanes outside (m0, m1) untouched), in FA_TILES_9's tiles (the
 * backward's 128 keys: 8 x 9 + 7 x 8). */
FA_INLINE void panel(int m, int k, const float *a, int64_t lda, const int AT, const float *b,
                     int64_t ldb, const float *beta, float *c, int64_t ldc, __mmask16 m0,
                     __mmask16 m1) {
    int i = 0;
#define FA_AVX512_RUN(MR)                                                                          \
    tile_##MR(k, AT ? a + i : a + i * lda, lda, AT, b, ldb, beta ? beta + i : 0, c + i * ldc, ldc, \
              m0, m1);                                                                             \
    i += MR
    FA_TILES_9(m, i, FA_AVX512_RUN);
#undef FA_AVX512_RUN
}

/* C = diag(beta) C + A B (beta NULL: C = A B); A: [m, k], or given as Aᵀ [k, m] when at. */
static void gemm(int m, int n, int k, const float *a, int64_t lda, int at, const float *b,
                 int64_t ldb, const float *beta, float *c, int64_t ldc) {
    for (int j0 = 0; j0 < n; j0 += 32) {
        const __mmask16 m0 = tail_mask(n - j0), m1 = tail_mask(n - j0 - 16);
        if (n - j0 >= 32 && at) /* whole panel: constant masks */
            panel(m, k, a, lda, 1, b + j0, ldb, beta, c + j0, ldc, 0xFFFF, 0xFFFF);
        else if (n - j0 >= 32)
            panel(m, k, a, lda, 0, b + j0, ldb, beta, c + j0, ldc, 0xFFFF, 0xFFFF);
        else if (at)
            panel(m, k, a, lda, 1, b + j0, ldb, beta, c + j0, ldc, m0, m1);
        else
            panel(m, k, a, lda, 0, b + j0, ldb, beta, c + j0, ldc, m0, m1);
    }
}

static void qk_avx512(int m, int n, int d, const float *q, int64_t ldq, const float *kt,
                      int64_t ldk, float *s, int64_t lds) {
    gemm(m, n, d, q, ldq, 0, kt, ldk, 0, s, lds);
}

static void pv_avx512(int m, int n, int d, const float *p, int64_t ldp, const float *v,
                      int64_t ldv, const float *alpha, float *o, int64_t ldo) {
    gemm(m, d, n, p, ldp, 0, v, ldv, alpha, o, ldo);
}

static void pv_t_avx512(int m, int n, int d, const float *pt, int64_t ldp, const float *v,
                        int64_t ldv, const float *alpha, float *o, int64_t ldo) {
    gemm(m, d, n, pt, ldp, 1, v, ldv, alpha, o, ldo);
}


/* Is dtype an 8-bit cache's (i8, f8_e4m3, f8_e5m2)? A constant where dtype is. */
FA_INLINE int is_8bit(int32_t dtype) {
    return dtype == FA_DTYPE_I8 || dtype == FA_DTYPE_F8_E4M3 || dtype == FA_DTYPE_F8_E5M2;
}

/* Bytes per element of a row of dtype. */
FA_INLINE int elem_bytes(int32_t dtype) {
    return dtype == FA_DTYPE_F32 ? 4 : is_8bit(dtype) ? 1 : 2;
}

/* The 16 stored values in b, of an 8-bit cache row, as fp32 (AVX2's 16-bit steps on a ymm, then
 * vcvtph2ps): i8 sign-extended and converted; e5m2 as the upper byte of an fp16 (subnormals,
 * infinities and NaN widen exactly); e4m3fn as the fp16 S.0EEEE.MMM0000000, which is 2^-8 times
 * its value (subnormals too), the NaN code S.1111.111 made the fp16 NaN 0xffff. The factor 2^8
 * is left to the caller (e4m3_unit): once per sum in the products, not once per element. */
FA_INLINE __m512 cvt16(__m128i b, int32_t dtype) {
    if (dtype == FA_DTYPE_I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    if (dtype == FA_DTYPE_F8_E5M2)
        return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
    const __m256i s = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7); /* S.S.EEEE.MMM0000000 */
    const __m256i nan = _mm256_cmpeq_epi16(_mm256_or_si256(s, _mm256_set1_epi16((short)0xc07f)),
                                           _mm256_set1_epi16(-1)); /* EEEE.MMM all ones */
    return _mm512_cvtph_ps(
        _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi16((short)0xbfff)), nan));
}

/* x times 2^8 where dtype is e4m3 (cvt16 loads 2^-8 times its values), exactly; else x. */
FA_INLINE __m512 e4m3_unit(__m512 x, int32_t dtype) {
    return dtype == FA_DTYPE_F8_E4M3 ? _mm512_mul_ps(x, _mm512_set1_ps(256.0f)) : x;
}

/* 16 elements of a row of any dtype from element c on (fewer than 16 left: zero-filled); an
 * e4m3 row's as cvt16 gives them, 2^-8 times their values. */
FA_INLINE __m512 load16(const void *row, int32_t dtype, int c, int left) {
    if (dtype == FA_DTYPE_F32) return _mm512_maskz_loadu_ps(tail_mask(left), (const float *)row + c);
    if (is_8bit(dtype)) {
        const uint8_t *b = (const uint8_t *)row + c;
        if (left >= 16) return cvt16(_mm_loadu_si128((const __m128i *)b), dtype);
        uint8_t part[16] = {0}; /* never read past the row */
        for (int i = 0; i < left; i++) part[i] = b[i];
        return cvt16(_mm_loadu_si128((const __m128i *)part), dtype);
    }
    __m256i h;
    if (left >= 16) {
        h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c));
    } else { /* never read past the row */
        uint16_t part[16];
        for (int i = 0; i < 16; i++) part[i] = i < left ? ((const uint16_t *)row)[c + i] : 0;
        h = _mm256_loadu_si256((const __m256i *)part);
    }
    if (dtype == FA_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* bf16 row[c : c+32] from one 64-byte load: its even columns (a shift) into *even, its odd ones
 * (a mask) into *odd, where load16 widens each half by two steps; even_odd_order puts sums over
 * them back in column order. */
FA_INLINE void load32_even_odd(const void *row, int c, __m512 *even, __m512 *odd) {
    const __m512i x = _mm512_loadu_si512((const uint16_t *)row + c);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536)));
}

/* Columns c..c+15 into *even and c+16..c+31 into *odd, from sums over load32_even_odd's. */
FA_INLINE void even_odd_order(__m512 *even, __m512 *odd) {
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    const __m512 e = *even, o = *odd;
    *even = _mm512_permutex2var_ps(e, lo, o);
    *odd = _mm512_permutex2var_ps(e, hi, o);
}

/* to_f32 on rows of dtype DT (a constant, or f32/f16/bf16 at run time): e4m3's 2^8 (exact),
 * then the scale (rounded once), as scale · fa__row_load. */
FA_INLINE void to_f32_dt(int n, const void *src, const int32_t DT, float scale, float *dst) {
    const __m512 s = _mm512_set1_ps(scale);
    for (int t = 0; t < n; t += 16)
        _mm512_mask_storeu_ps(dst + t, tail_mask(n - t),
                              _mm512_mul_ps(s, e4m3_unit(load16(src, DT, t, n - t), DT)));
}

/* vcvtph2ps for fp16, a 16-bit shift for bf16, cvt16 for the 8-bit caches, through load16. */
static void to_f32_avx512(int n, const void *src, int32_t dtype, float scale, float *dst) {
    if (dtype == FA_DTYPE_I8) to_f32_dt(n, src, FA_DTYPE_I8, scale, dst);
    else if (dtype == FA_DTYPE_F8_E4M3) to_f32_dt(n, src, FA_DTYPE_F8_E4M3, scale, dst);
    else if (dtype == FA_DTYPE_F8_E5M2) to_f32_dt(n, src, FA_DTYPE_F8_E5M2, scale, dst);
    else to_f32_dt(n, src, dtype, scale, dst); /* f32, f16, bf16: picked per load, as before */
}

/* bf16 of 16 fp32 lanes, round to nearest even on the bits (exact for subnormals, which
 * vcvtneps2bf16 would flush); NaN stays a quiet NaN. */
static inline __m256i bf16_16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)),
                                          _mm512_set1_epi32(0x7fff)); /* 0x7fff + lsb */
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

/* vcvtps2ph for fp16, bf16_16 for bf16; the last n % 16 fp16/bf16 elements through a 16-lane
 * buffer, so nothing past dst[n) is written. */
static void from_f32_avx512(int n, const float *src, float scale, int32_t dtype, void *dst) {
    const __m512 s = _mm512_set1_ps(scale);
    if (dtype == FA_DTYPE_F32) {
        for (int t = 0; t < n; t += 16) {
            const __mmask16 k = tail_mask(n - t);
            const __m512 x = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, src + t));
            _mm512_mask_storeu_ps((float *)dst + t, k, x);
        }
        return;
    }
    uint16_t *d = dst;
    for (int t = 0; t < n; t += 16) {
        const __m512 x = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(tail_mask(n - t), src + t));
        const __m256i h = dtype == FA_DTYPE_F16
                              ? _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                              : bf16_16(x);
        if (n - t >= 16) {
            _mm256_storeu_si256((__m256i *)(d + t), h);
        } else {
            uint16_t part[16];
            _mm256_storeu_si256((__m256i *)part, h);
            memcpy(d + t, part, (size_t)(n - t) * sizeof *d);
        }
    }
}

/* Runs CALL with FA_DK bound to d as a compile-time constant where d is 64, 128 or 256 and the
 * rows of q are d apart (decode's query rows), else to 0 (d at run time). Inside FA_BY_ROW_DTYPE:
 * 8-bit rows (FA_DT) take d at run time only: their dims made this file's compile time (gcc 12)
 * twice what it had been. */
#define FA_WIDE_DT ((int)FA_DT == (int)FA_DTYPE_F32 || (int)FA_DT == (int)FA_DTYPE_F16 ||           \
                    (int)FA_DT == (int)FA_DTYPE_BF16)
#define FA_BY_DIM(d, ldq, CALL)                                                                    \
    do {                                                                                           \
        if ((d) == 128 && (ldq) == 128 && FA_WIDE_DT) {                                            \
            enum { FA_DK = 128 };                                                                  \
            CALL;                                                                                  \
        } else if ((d) == 64 && (ldq) == 64 && FA_WIDE_DT) {                                       \
            enum { FA_DK = 64 };                                                                   \
            CALL;                                                                                  \
        } else if ((d) == 256 && (ldq) == 256 && FA_WIDE_DT) {                                     \
            enum { FA_DK = 256 };                                                                  \
            CALL;                                                                                  \
        } else {                                                                                   \
            enum { FA_DK = 0 };                                                                    \
            CALL;                                                                                  \
        }                                                                                          \
    } while (0)

/* Columns c..c+15 of a tile of TR rows x 4 keys into acc[4 ii + jj] (row ii, key jj); whole
 * chunks load unmasked. */
FA_INLINE void qk_chunk(int TR, __m512 *acc, const void *const *kr, const float *const *qr, int c,
                        int d, const int32_t DT) {
    __m512 kv[4], qv[4];
    if (d - c >= 16) {
        for (int jj = 0; jj < 4; jj++) kv[jj] = load16(kr[jj], DT, c, 16);
        for (int ii = 0; ii < TR; ii++) qv[ii] = _mm512_loadu_ps(qr[ii] + c);
    } else {
        for (int jj = 0; jj < 4; jj++) kv[jj] = load16(kr[jj], DT, c, d - c);
        for (int ii = 0; ii < TR; ii++)
            qv[ii] = _mm512_maskz_loadu_ps(tail_mask(d - c), qr[ii] + c);
    }
    for (int ii = 0; ii < TR; ii++)
        for (int jj = 0; jj < 4; jj++)
            acc[4 * ii + jj] = _mm512_fmadd_ps(qv[ii], kv[jj], acc[4 * ii + jj]);
}

/* Every chunk of a tile (qk_chunk), asking at each for as many lines as it loads. DK: d as a
 * compile-time constant (64, 128, 256; 0: d at run time), the loop then unrolled whole so that
 * every offset is a constant: at d = 128 gcc had kept the loop with row pointers on the stack and
 * in vector registers, a reload or a move to a general register per row per chunk. */
FA_INLINE void qk_chunks(int TR, __m512 *acc, const void *const *kr, const float *const *qr, int d,
                         const int DK, const int32_t DT, fa__asks *ask, int asking,
                         const int L2) {
    const int kl = elem_bytes(DT); /* lines per chunk: 4 keys x 16 columns of elem_bytes */
    if (DK) {
#pragma GCC unroll 16
        for (int c = 0; c < DK; c += 16) {
            if (asking) fa__ask_lines(ask, kl, L2);
            qk_chunk(TR, acc, kr, qr, c, DK, DT);
        }
    } else {
        for (int c = 0; c < d; c += 16) {
            if (asking) fa__ask_lines(ask, kl, L2);
            qk_chunk(TR, acc, kr, qr, c, d, DT);
        }
    }
}

/* Tiles of 4 rows x 4 keys: 16 accumulators over d, then one 16-way reduction whose 128-bit
 * lane ii holds row ii's 4 scores, stored as one piece. DT is a compile-time dtype in each
 * caller, so the conversion is chosen outside the loops; DK as in qk_chunks (ldq = d then). */
FA_INLINE void qk_rows_dt(int m, int n, int d, const float *q, int64_t ldq, const void *const *k,
                          const int32_t DT, const int DK, float *s, int64_t lds,
                          const fa__prefetch *pf, const int L2) {
    fa__asks ask = fa__asks_begin(pf); /* asked for by the first 4 rows */
    if (DK) d = DK, ldq = DK;
    for (int i0 = 0; i0 < m; i0 += 4)
        for (int j0 = 0; j0 < n; j0 += 4) {
            __m512 acc[16]; /* acc[4 ii + jj]: rows i0+ii, keys j0+jj */
            for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
            const void *kr[4];
            for (int jj = 0; jj < 4; jj++) kr[jj] = k[j0 + jj < n ? j0 + jj : j0]; /* pad: repeat */
            const float *q0 = q + i0 * ldq;
            if (m - i0 >= 4) { /* rows ldq apart: constant offsets from q0 where DK */
                const float *qr[4] = {q0, q0 + ldq, q0 + 2 * ldq, q0 + 3 * ldq};
                qk_chunks(4, acc, kr, qr, d, DK, DT, &ask, i0 == 0, L2);
            } else { /* rows past m repeat row i0: computed, not stored */
                const float *qr[4];
                for (int ii = 0; ii < 4; ii++) qr[ii] = i0 + ii < m ? q0 + ii * ldq : q0;
                qk_chunks(4, acc, kr, qr, d, DK, DT, &ask, i0 == 0, L2);
            }
            fa__store_tile4(e4m3_unit(fa__sum16(acc), DT), m - i0 < 4 ? m - i0 : 4, n - j0,
                            s + i0 * lds + j0, lds);
        }
    fa__ask_rest(&ask, L2);
}

/* The last one or two rows (TR) of qk_rows, which a decode with one or two query rows per KV
 * head (MHA, or 2 query heads per KV head) has alone: tiles of TR rows x 4 keys, 4·TR
 * accumulators through the same chunks (qk_chunks), the same 16-way reduction (128-bit lane ii:
 * row ii's 4 scores). Keys past n repeat key j0: computed, not stored. */
FA_INLINE void qk_few_tile(int TR, int n, int j0, int d, const float *q, int64_t ldq,
                           const void *const *k, const int32_t DT, const int DK, float *s,
                           int64_t lds, fa__asks *ask, const int L2) {
    if (DK) d = DK, ldq = DK;
    __m512 acc[16]; /* acc[4 ii + jj]: row ii, key j0+jj */
    for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
    const void *kr[4];
    const float *qr[4];
    for (int jj = 0; jj < 4; jj++) kr[jj] = k[j0 + jj < n ? j0 + jj : j0]; /* pad: repeat */
    for (int ii = 0; ii < TR; ii++) qr[ii] = q + ii * ldq;
    qk_chunks(TR, acc, kr, qr, d, DK, DT, ask, 1, L2);
    const __m512 sums = e4m3_unit(fa__sum16(acc), DT);
    if (n - j0 >= 4) { /* lane ii: row ii's 4 scores */
        _mm_storeu_ps(s + j0, _mm512_castps512_ps128(sums));
        if (TR > 1) _mm_storeu_ps(s + lds + j0, _mm512_extractf32x4_ps(sums, 1));
    } else {
        float out[16];
        _mm512_storeu_ps(out, sums);
        for (int ii = 0; ii < TR; ii++)
            for (int jj = 0; jj < n - j0; jj++) s[ii * lds + j0 + jj] = out[4 * ii + jj];
    }
}

/* qk_rows' last rows (rows = 1 or 2) for one dtype: TR compile-time in each loop. */
FA_INLINE void qk_few_dt(int rows, int n, int d, const float *q, int64_t ldq,
                         const void *const *k, const int32_t DT, const int DK, float *s,
                         int64_t lds, const fa__prefetch *pf, const int L2) {
    fa__asks ask = fa__asks_begin(pf);
    if (rows == 2)
        for (int j0 = 0; j0 < n; j0 += 4)
            qk_few_tile(2, n, j0, d, q, ldq, k, DT, DK, s, lds, &ask, L2);
    else
        for (int j0 = 0; j0 < n; j0 += 4)
            qk_few_tile(1, n, j0, d, q, ldq, k, DT, DK, s, lds, &ask, L2);
    fa__ask_rest(&ask, L2);
}

/* The products come once per hint (L2: 0 asks into L1, 1 into L2; fa__ask), each in functions
 * of its own: with both hints' copies in one function gcc had kept the fp16 pv loop's row index
 * and asks on the stack, a load and a store per key. */
#define FA_QK_PARAMS                                                                               \
    int m, int n, int d, const float *q, int64_t ldq, const void *const *k, int32_t dtype,       \
        float *s, int64_t lds, const fa__prefetch *pf
#define FA_QK_ARGS m, n, d, q, ldq, k, dtype, s, lds, pf

/* FA_BY_DTYPE where L2 is 0, FA_BY_ROW_DTYPE where it is 1: 8-bit rows have the copies that ask
 * into L2 only (as the avx2 and neon sets ask), each copy of theirs being compile time. */
#define FA_BY_HINT_DTYPE(L2, dtype, CALL)                                                          \
    do {                                                                                           \
        if (L2)                                                                                    \
            FA_BY_ROW_DTYPE(dtype, CALL);                                                          \
        else                                                                                       \
            FA_BY_DTYPE(dtype, CALL);                                                              \
    } while (0)

/* The hint of a call on rows of dtype: 8-bit rows ask into L2 (FA_BY_HINT_DTYPE). */
static inline int hint_of(int L2, int32_t dtype) {
    return L2 || dtype == FA_DTYPE_I8 || dtype == FA_DTYPE_F8_E4M3 || dtype == FA_DTYPE_F8_E5M2;
}

/* qk_rows' 4-row tiles, m a multiple of 4 or 3 more. */
FA_INLINE void qk_tiles(FA_QK_PARAMS, const int L2) {
    FA_BY_HINT_DTYPE(L2, dtype, FA_BY_DIM(d, ldq, qk_rows_dt(m, n, d, q, ldq, k, FA_DT, FA_DK, s,
                                                             lds, pf, L2)));
}
static __attribute__((noinline)) void qk_tiles_l1(FA_QK_PARAMS) { qk_tiles(FA_QK_ARGS, 0); }
static __attribute__((noinline)) void qk_tiles_l2(FA_QK_PARAMS) { qk_tiles(FA_QK_ARGS, 1); }

/* qk_rows' last rows when m % 4 is 1 or 2 (m = those rows), rows 0.. of q and s (callers offset
 * them). */
FA_INLINE void qk_few(FA_QK_PARAMS, const int L2) {
    FA_BY_HINT_DTYPE(L2, dtype, FA_BY_DIM(d, ldq, qk_few_dt(m, n, d, q, ldq, k, FA_DT, FA_DK, s,
                                                            lds, pf, L2)));
}
static __attribute__((noinline)) void qk_few_l1(FA_QK_PARAMS) { qk_few(FA_QK_ARGS, 0); }
static __attribute__((noinline)) void qk_few_l2(FA_QK_PARAMS) { qk_few(FA_QK_ARGS, 1); }

/* Rows in 4-row tiles (a last 3 as one), then a last 1 or 2 through qk_few. */
FA_INLINE void qk_rows_at(FA_QK_PARAMS, int L2) {
    const int few = m % 4 == 1 || m % 4 == 2 ? m % 4 : 0, m4 = m - few;
    L2 = hint_of(L2, dtype);
    if (m4 > 0) {
        (L2 ? qk_tiles_l2 : qk_tiles_l1)(m4, n, d, q, ldq, k, dtype, s, lds, pf);
        pf = NULL; /* asked for already */
    }
    if (few)
        (L2 ? qk_few_l2 : qk_few_l1)(few, n, d, q + m4 * ldq, ldq, k, dtype, s + m4 * lds, lds, pf);
}
static void qk_rows_avx512(FA_QK_PARAMS) { qk_rows_at(FA_QK_ARGS, 0); }
void fa__qk_rows_l2_avx512(FA_QK_PARAMS) { qk_rows_at(FA_QK_ARGS, 1); }
#undef FA_QK_ARGS
#undef FA_QK_PARAMS

/* Rows i0..i0+3 of O, columns [c, c + 16·W) (W = 1..4 chunks; the last may be partial):
 * 4·W named accumulators summed over the keys, then alpha O + sum. Named scalars, not an array,
 * so the accumulators stay in registers (an array was kept on the stack, one store and reload
 * per key); each key's 4 broadcast probabilities serve all W chunks. Rows past m repeat row i0's
 * probabilities and are not stored. FULL (W = 4, 64 columns left): loads without tail checks,
 * and bf16 V through load32_even_odd (EO), the sums put back in order before the store (four
 * widenings and four shifts become two shifts and two ANDs; the sums are the same, term for
 * term). */
FA_INLINE void pv_rows_tile(int m, int i0, int n, int d, int c, const int W, const int FULL,
                            const int WHOLE, const float *p, int64_t ldp, const void *const *v,
                            const int32_t DT, const float *alpha, float *o, int64_t ldo,
                            fa__asks *ask, const int L2) {
    const int EO = FULL && DT == FA_DTYPE_BF16;
    const int rows = WHOLE || m - i0 >= 4 ? 4 : m - i0; /* WHOLE: 4, known at compile time */
    /* row ii of P at p0 + oii (constant offsets where WHOLE and ldp are) */
    const float *p0 = p + i0 * ldp;
    const int64_t o1 = rows > 1 ? ldp : 0, o2 = rows > 2 ? 2 * ldp : 0, o3 = rows > 3 ? 3 * ldp : 0;
    const __m512 z = _mm512_setzero_ps();
    __m512 a0 = z, a1 = z, a2 = z, a3 = z; /* columns c .. c+15 (EO: c, c+2, .., c+30) */
    __m512 b0 = z, b1 = z, b2 = z, b3 = z; /* c+16 .. c+31 (EO: c+1, c+3, .., c+31) */
    __m512 e0 = z, e1 = z, e2 = z, e3 = z; /* c+32 .. c+47 (EO: as a, from c+32) */
    __m512 f0 = z, f1 = z, f2 = z, f3 = z; /* c+48 .. c+63 (EO: as b, from c+32) */
    const size_t cb = (size_t)c * elem_bytes(DT); /* bytes before column c */
    /* The asks' state in locals (registers), not behind the pointer, which gcc kept in memory
     * and spilled the loop's registers around. */
    fa__asks a = ask ? *ask : (fa__asks){NULL, NULL, NULL, 0, 0, 0};
    for (int j = 0; j < n; j++) {
        if (ask) fa__ask_lines(&a, (W * elem_bytes(DT) + 3) / 4, L2); /* as loaded */
        const void *vj = (const char *)v[j] + cb; /* columns from c: constant offsets below */
        const float *pj = p0 + j;
        const __m512 s0 = _mm512_set1_ps(pj[0]), s1 = _mm512_set1_ps(pj[o1]);
        const __m512 s2 = _mm512_set1_ps(pj[o2]), s3 = _mm512_set1_ps(pj[o3]);
#define FA_PV_FMA(x, vw)                                                                           \
    do {                                                                                           \
        x##0 = _mm512_fmadd_ps(s0, vw, x##0);                                                      \
        x##1 = _mm512_fmadd_ps(s1, vw, x##1);                                                      \
        x##2 = _mm512_fmadd_ps(s2, vw, x##2);                                                      \
        x##3 = _mm512_fmadd_ps(s3, vw, x##3);                                                      \
    } while (0)
#define FA_PV_CHUNK(x, w) FA_PV_FMA(x, load16(vj, DT, 16 * (w), FULL ? 16 : d - c - 16 * (w)))
        if (EO) { /* bf16 V[j, c:c+64] as the even and odd columns of each 32 */
            __m512 ve0, vo0, ve1, vo1;
            load32_even_odd(vj, 0, &ve0, &vo0);
            load32_even_odd(vj, 32, &ve1, &vo1);
            FA_PV_FMA(a, ve0);
            FA_PV_FMA(b, vo0);
            FA_PV_FMA(e, ve1);
            FA_PV_FMA(f, vo1);
        } else {
            FA_PV_CHUNK(a, 0);
            if (W >= 2) FA_PV_CHUNK(b, 1);
            if (W >= 3) FA_PV_CHUNK(e, 2);
            if (W >= 4) FA_PV_CHUNK(f, 3);
        }
#undef FA_PV_CHUNK
#undef FA_PV_FMA
    }
    if (ask) *ask = a;
    __m512 acc[4][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}, {e0, e1, e2, e3}, {f0, f1, f2, f3}};
    if (EO) /* the even and odd columns back in order */
        for (int ii = 0; ii < 4; ii++) {
            even_odd_order(&acc[0][ii], &acc[1][ii]);
            even_odd_order(&acc[2][ii], &acc[3][ii]);
        }
    for (int w = 0; w < W; w++) {
        const __mmask16 kd = tail_mask(d - c - 16 * w);
        for (int ii = 0; ii < rows; ii++) {
            float *oi = o + (i0 + ii) * ldo + c + 16 * w;
            const __m512 prev = _mm512_maskz_loadu_ps(kd, oi);
            _mm512_mask_storeu_ps(oi, kd, _mm512_fmadd_ps(_mm512_set1_ps(alpha[i0 + ii]), prev,
                                                          e4m3_unit(acc[w][ii], DT)));
        }
    }
}

/* WHOLE: m a multiple of 4, so every tile has 4 rows (with a constant ldp, at constant offsets
 * from one pointer: gcc had kept 4 row pointers, one of them in a vector register). */
FA_INLINE void pv_rows_dt(int m, int n, int d, const float *p, int64_t ldp, const void *const *v,
                          const int32_t DT, const int WHOLE, const float *alpha, float *o,
                          int64_t ldo, const fa__prefetch *pf, const int L2) {
    fa__asks first = fa__asks_begin(pf), *ask = &first; /* asked for by the first 4 rows */
    for (int i0 = 0; i0 < m; i0 += 4) {
        int c = 0;
#define FA_PV_TILE(W, FULL)                                                                        \
    pv_rows_tile(m, i0, n, d, c, W, FULL, WHOLE, p, ldp, v, DT, alpha, o, ldo, ask, L2)
        for (; d - c >= 64; c += 64) FA_PV_TILE(4, 1);
        for (; d - c > 48; c += 64) FA_PV_TILE(4, 0);
        if (d - c > 32) FA_PV_TILE(3, 0);
        else if (d - c > 16) FA_PV_TILE(2, 0);
        else if (d - c > 0) FA_PV_TILE(1, 0);
#undef FA_PV_TILE
        ask = NULL;
    }
    fa__ask_rest(&first, L2);
}

/* Rows 0..TR-1 of O (TR = 1 or 2: the last rows, so one or two query rows per KV head do not
 * pay for four), columns [c, c + 16·W) (W = 1, 2, 4 or 8; the last chunk may be partial): TR·W
 * accumulators summed over the keys, then alpha O + sum. FULL (W = 8, 128 columns left): as in
 * pv_rows_tile. */
FA_INLINE void pv_rows_small(int TR, int n, int d, int c, const int W, const int FULL,
                             const float *p, int64_t ldp, const void *const *v, const int32_t DT,
                             const float *alpha, float *o, int64_t ldo, fa__asks *ask,
                             const int L2) {
    const int EO = FULL && DT == FA_DTYPE_BF16;
    const float *p0 = p, *p1 = TR > 1 ? p + ldp : p;
    const __m512 z = _mm512_setzero_ps();
    __m512 a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z; /* row 0, chunk w */
    __m512 b0 = z, b1 = z, b2 = z, b3 = z, b4 = z, b5 = z, b6 = z, b7 = z; /* row 1 */
    const size_t cb = (size_t)c * elem_bytes(DT); /* as in pv_rows_tile */
    fa__asks a = *ask;
    for (int j = 0; j < n; j++) {
        fa__ask_lines(&a, (W * elem_bytes(DT) + 3) / 4, L2); /* as many as it loads */
        const void *vj = (const char *)v[j] + cb;
        const __m512 s0 = _mm512_set1_ps(p0[j]), s1 = _mm512_set1_ps(p1[j]);
#define FA_PV_FMA(w, vw)                                                                           \
    do {                                                                                           \
        a##w = _mm512_fmadd_ps(s0, vw, a##w);                                                      \
        if (TR > 1) b##w = _mm512_fmadd_ps(s1, vw, b##w);                                          \
    } while (0)
#define FA_PV_SMALL(w) FA_PV_FMA(w, load16(vj, DT, 16 * (w), FULL ? 16 : d - c - 16 * (w)))
        if (EO) { /* bf16 V[j, c:c+128]: chunks 2h, 2h+1 the even and odd columns of half h */
            __m512 ve, vo;
            load32_even_odd(vj, 0, &ve, &vo);
            FA_PV_FMA(0, ve);
            FA_PV_FMA(1, vo);
            load32_even_odd(vj, 32, &ve, &vo);
            FA_PV_FMA(2, ve);
            FA_PV_FMA(3, vo);
            load32_even_odd(vj, 64, &ve, &vo);
            FA_PV_FMA(4, ve);
            FA_PV_FMA(5, vo);
            load32_even_odd(vj, 96, &ve, &vo);
            FA_PV_FMA(6, ve);
            FA_PV_FMA(7, vo);
        } else {
            FA_PV_SMALL(0);
            if (W > 1) FA_PV_SMALL(1);
            if (W > 2) {
                FA_PV_SMALL(2);
                FA_PV_SMALL(3);
            }
            if (W > 4) {
                FA_PV_SMALL(4);
                FA_PV_SMALL(5);
                FA_PV_SMALL(6);
                FA_PV_SMALL(7);
            }
        }
#undef FA_PV_SMALL
#undef FA_PV_FMA
    }
    *ask = a;
    __m512 acc[2][8] = {{a0, a1, a2, a3, a4, a5, a6, a7}, {b0, b1, b2, b3, b4, b5, b6, b7}};
    if (EO) /* the even and odd columns back in order */
        for (int ii = 0; ii < TR; ii++)
            for (int w = 0; w < 8; w += 2) even_odd_order(&acc[ii][w], &acc[ii][w + 1]);
    for (int w = 0; w < W; w++) {
        const __mmask16 kd = tail_mask(d - c - 16 * w);
        for (int ii = 0; ii < TR; ii++) {
            float *oi = o + ii * ldo + c + 16 * w;
            const __m512 prev = _mm512_maskz_loadu_ps(kd, oi);
            _mm512_mask_storeu_ps(oi, kd, _mm512_fmadd_ps(_mm512_set1_ps(alpha[ii]), prev,
                                                          e4m3_unit(acc[ii][w], DT)));
        }
    }
}

/* TR rows through pv_rows_small, W as wide as d allows. */
FA_INLINE void pv_rows_last(int TR, int n, int d, const float *p, int64_t ldp,
                            const void *const *v, const int32_t DT, const float *alpha, float *o,
                            int64_t ldo, const fa__prefetch *pf, const int L2) {
    fa__asks ask = fa__asks_begin(pf);
    int c = 0;
    for (; d - c >= 128; c += 128)
        pv_rows_small(TR, n, d, c, 8, 1, p, ldp, v, DT, alpha, o, ldo, &ask, L2);
    for (; d - c > 64; c += 128)
        pv_rows_small(TR, n, d, c, 8, 0, p, ldp, v, DT, alpha, o, ldo, &ask, L2);
    if (d - c > 32) pv_rows_small(TR, n, d, c, 4, 0, p, ldp, v, DT, alpha, o, ldo, &ask, L2);
    else if (d - c > 16) pv_rows_small(TR, n, d, c, 2, 0, p, ldp, v, DT, alpha, o, ldo, &ask, L2);
    else if (d - c > 0) pv_rows_small(TR, n, d, c, 1, 0, p, ldp, v, DT, alpha, o, ldo, &ask, L2);
    fa__ask_rest(&ask, L2);
}

/* pv_rows' last rows (rows = 1 or 2) for one dtype: TR compile-time in each call. */
FA_INLINE void pv_few_dt(int rows, int n, int d, const float *p, int64_t ldp,
                         const void *const *v, const int32_t DT, const float *alpha, float *o,
                         int64_t ldo, const fa__prefetch *pf, const int L2) {
    if (rows == 2) pv_rows_last(2, n, d, p, ldp, v, DT, alpha, o, ldo, pf, L2);
    else pv_rows_last(1, n, d, p, ldp, v, DT, alpha, o, ldo, pf, L2);
}

/* Entry points in pairs, one per hint, as qk_rows'. */
#define FA_PV_PARAMS                                                                               \
    int m, int n, int d, const float *p, int64_t ldp, const void *const *v, int32_t dtype,       \
        const float *alpha, float *o, int64_t ldo, const fa__prefetch *pf
#define FA_PV_ARGS m, n, d, p, ldp, v, dtype, alpha, o, ldo, pf

/* pv_rows' 4-row tiles, m a multiple of 4 or 3 more. */
FA_INLINE void pv_tiles(FA_PV_PARAMS, const int L2) {
    if (m % 4 == 0 && ldp == 128) /* decode's P (rows FA_BC apart), whole tiles */
        FA_BY_HINT_DTYPE(L2, dtype,
                         pv_rows_dt(m, n, d, p, 128, v, FA_DT, 1, alpha, o, ldo, pf, L2));
    else
        FA_BY_HINT_DTYPE(L2, dtype,
                         pv_rows_dt(m, n, d, p, ldp, v, FA_DT, 0, alpha, o, ldo, pf, L2));
}
static __attribute__((noinline)) void pv_tiles_l1(FA_PV_PARAMS) { pv_tiles(FA_PV_ARGS, 0); }
static __attribute__((noinline)) void pv_tiles_l2(FA_PV_PARAMS) { pv_tiles(FA_PV_ARGS, 1); }

/* pv_rows' last rows when m % 4 is 1 or 2 (m = those rows), rows 0.. of p, alpha and o (callers
 * offset them). */
FA_INLINE void pv_few(FA_PV_PARAMS, const int L2) {
    if (ldp == 128) /* decode's P rows (FA_BC apart): the second at a constant offset */
        FA_BY_HINT_DTYPE(L2, dtype, pv_few_dt(m, n, d, p, 128, v, FA_DT, alpha, o, ldo, pf, L2));
    else
        FA_BY_HINT_DTYPE(L2, dtype, pv_few_dt(m, n, d, p, ldp, v, FA_DT, alpha, o, ldo, pf, L2));
}
static __attribute__((noinline)) void pv_few_l1(FA_PV_PARAMS) { pv_few(FA_PV_ARGS, 0); }
static __attribute__((noinline)) void pv_few_l2(FA_PV_PARAMS) { pv_few(FA_PV_ARGS, 1); }

/* Rows in 4-row tiles (a last 3 as one), then a last 1 or 2 through pv_few. */
FA_INLINE void pv_rows_at(FA_PV_PARAMS, int L2) {
    const int few = m % 4 == 1 || m % 4 == 2 ? m % 4 : 0, m4 = m - few;
    L2 = hint_of(L2, dtype);
    if (m4 > 0) {
        (L2 ? pv_tiles_l2 : pv_tiles_l1)(m4, n, d, p, ldp, v, dtype, alpha, o, ldo, pf);
        pf = NULL; /* asked for already */
    }
    if (few)
        (L2 ? pv_few_l2 : pv_few_l1)(few, n, d, p + m4 * ldp, ldp, v, dtype, alpha + m4,
                                     o + m4 * ldo, ldo, pf);
}
static void pv_rows_avx512(FA_PV_PARAMS) { pv_rows_at(FA_PV_ARGS, 0); }
void fa__pv_rows_l2_avx512(FA_PV_PARAMS) { pv_rows_at(FA_PV_ARGS, 1); }
#undef FA_PV_ARGS
#undef FA_PV_PARAMS

/* 16 x 16 blocks through unpack, shuffle and 128-bit lane shuffles; rows past n load as zeros,
 * columns past d and n are not stored. */
static void transpose_avx512(int n, int d, const float *src, int64_t lds, float *dst,
                             int64_t ldd) {
    for (int j0 = 0; j0 < n; j0 += 16)
        for (int t0 = 0; t0 < d; t0 += 16) {
            const __mmask16 kt = tail_mask(d - t0), kj = tail_mask(n - j0);
            __m512 r[16], u[16], w[16];
            for (int i = 0; i < 16; i++) /* r[i] = src[j0 + i, t0:t0+16] */
                r[i] = _mm512_maskz_loadu_ps(j0 + i < n ? kt : 0, src + (j0 + i) * lds + t0);
            for (int i = 0; i < 16; i += 2) { /* pairs of rows interleaved */
                u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
                u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 16; i += 4) { /* w[i + e]: rows i..i+3, element 4L + e per lane L */
                w[i] = _mm512_shuffle_ps(u[i], u[i + 2], 0x44);
                w[i + 1] = _mm512_shuffle_ps(u[i], u[i + 2], 0xEE);
                w[i + 2] = _mm512_shuffle_ps(u[i + 1], u[i + 3], 0x44);
                w[i + 3] = _mm512_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
            }
            for (int e = 0; e < 4; e++) { /* output rows t0 + e + {0, 4, 8, 12} */
                const __m512 a = _mm512_shuffle_f32x4(w[e], w[4 + e], 0x88);
                const __m512 b = _mm512_shuffle_f32x4(w[8 + e], w[12 + e], 0x88);
                const __m512 c = _mm512_shuffle_f32x4(w[e], w[4 + e], 0xDD);
                const __m512 dd = _mm512_shuffle_f32x4(w[8 + e], w[12 + e], 0xDD);
                const __m512 out[4] = {_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(c, dd, 0x88),
                                       _mm512_shuffle_f32x4(a, b, 0xDD), _mm512_shuffle_f32x4(c, dd, 0xDD)};
                for (int q = 0; q < 4; q++)
                    if (t0 + e + 4 * q < d)
                        _mm512_mask_storeu_ps(dst + (t0 + e + 4 * q) * ldd + j0, kj, out[q]);
            }
        }
}

static float row_max_avx512(int n, const float *x) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16)
        mx = _mm512_mask_max_ps(mx, tail_mask(n - j), mx, _mm512_maskz_loadu_ps(tail_mask(n - j), x + j));
    return _mm512_reduce_max_ps(mx);
}

static float exp2_sum_avx512(int n, float *x, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        const __mmask16 k = tail_mask(n - j);
        const __m512 e = fa__exp2_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm));
        _mm512_mask_storeu_ps(x + j, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* The online softmax step on R (1 or 2) rows of up to 128 scores, each held in 8 zmm: a row's
 * max and sum are trees (depth 3, then the in-register reduction) and its 8 exp2 run side by
 * side. Separate row_max and exp2_sum passes were chains of 8 dependent steps; here the rows'
 * own latency (max, reduction, exp2, sum) is what is left, so two rows run interleaved. */
FA_INLINE void softmax_tile(const int R, int n, float *x, int64_t ldx, float *m, float *sum) {
    enum { W = 8 }; /* vectors per row */
    __m512 v[2][W];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
        _Pragma("GCC unroll 8") for (int i = 0; i < W; i++)
            v[r][i] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n - 16 * i),
                                           x + r * ldx + 16 * i);
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
        const __m512 *u = v[r];
        const __m512 t0 = _mm512_max_ps(_mm512_max_ps(u[0], u[1]), _mm512_max_ps(u[2], u[3]));
        const __m512 t1 = _mm512_max_ps(_mm512_max_ps(u[4], u[5]), _mm512_max_ps(u[6], u[7]));
        const __m512 mu =
            _mm512_set1_ps(fa__softmax_mu(m + r, _mm512_reduce_max_ps(_mm512_max_ps(t0, t1))));
        _Pragma("GCC unroll 8") for (int i = 0; i < W; i++) {
            v[r][i] = fa__exp2_ps(_mm512_sub_ps(v[r][i], mu));
            _mm512_mask_storeu_ps(x + r * ldx + 16 * i, tail_mask(n - 16 * i), v[r][i]);
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
        const __m512 *u = v[r];
        const __m512 s0 = _mm512_add_ps(_mm512_add_ps(u[0], u[1]), _mm512_add_ps(u[2], u[3]));
        const __m512 s1 = _mm512_add_ps(_mm512_add_ps(u[4], u[5]), _mm512_add_ps(u[6], u[7]));
        sum[r] = fa__softmax_nan(m + r, _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)));
    }
}

/* The online softmax step (kernels.h): rows of up to 128 scores in pairs (softmax_tile), longer
 * rows by the two passes. */
static void softmax_rows_avx512(int rows, int n, float *x, int64_t ldx, float *m, float *sum) {
    if (n > 128) {
        fa__softmax_rows_2pass(rows, n, x, ldx, m, sum, row_max_avx512, exp2_sum_avx512);
        return;
    }
    int r = 0;
    for (; r + 2 <= rows; r += 2) softmax_tile(2, n, x + r * ldx, ldx, m + r, sum + r);
    if (r < rows) softmax_tile(1, n, x + r * ldx, ldx, m + r, sum + r);
}

const fa__cpu_kernels fa__cpu_kernels_avx512 = {
    .name = "avx512",
    .gemm_rows = 9,
    .qk = qk_avx512,
    .pv = pv_avx512,
    .pv_t = pv_t_avx512,
    .to_f32 = to_f32_avx512,
    .from_f32 = from_f32_avx512,
    .qk_rows = qk_rows_avx512,
    .pv_rows = pv_rows_avx512,
    .transpose = transpose_avx512,
    .softmax_rows = softmax_rows_avx512,
    .decode_keys_half = {16, 16}, /* Zen 5: GQA fp16/bf16 in 0.86-0.97 of 64/32's time */
    .decode_rows_f32 = 64,        /* Zen 4: 33-48 rows in 0.62-0.96 of the prefill's time */
    .exp2_sum = exp2_sum_avx512,
    .pv_packed_b = 1, /* Zen 5: pv at 88% of qk's rate on rows 8 KiB apart, 100% packed */
};
