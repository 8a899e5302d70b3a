/* SPDX-License-Identifier: MIT */
/*
 * decode_common.h — pieces shared by the AVX-512 decode products (avx512.c) and their bf16
 * dot-product variant (avx512bf16/bf16.c): the 16-way reduction of a 4 x 4 tile of dot products
 * and the prefetch of the rows the caller reads next. Header-only, for AVX-512F builds.
 */
#ifndef FA_AVX512_DECODE_COMMON_H
#define FA_AVX512_DECODE_COMMON_H

#include "../kernels.h"

#include <immintrin.h>

/* The 16 sums of v[0..16): lane k of the result is the sum of v[k]'s lanes. */
static inline __m512 fa__sum16(__m512 v[16]) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* pairs interleaved, halved within 128-bit lanes */
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* lane L: partial sums of v[4i..4i+3] */
        b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++) /* across 128-bit lanes */
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

/* Prefetches row r of pf (all its lines), if there is one, into L2. */
static inline __attribute__((always_inline)) void fa__prefetch_row(const fa__prefetch *pf, int r) {
    if (pf && r < pf->n)
        for (int at = 0; at < pf->bytes; at += 64)
            _mm_prefetch((const char *)pf->rows[r] + at, _MM_HINT_T1);
}

/* Stores a 4 x 4 tile of scores, lane 4 ii + jj of sums (row ii, key jj), into s (row stride
 * lds): `rows` rows and `keys` keys of it. */
static inline void fa__store_tile4(__m512 sums, int rows, int keys, float *s, int64_t lds) {
    if (keys >= 4) { /* lane ii: row ii's 4 scores */
        _mm_storeu_ps(s, _mm512_castps512_ps128(sums));
        if (rows > 1) _mm_storeu_ps(s + lds, _mm512_extractf32x4_ps(sums, 1));
        if (rows > 2) _mm_storeu_ps(s + 2 * lds, _mm512_extractf32x4_ps(sums, 2));
        if (rows > 3) _mm_storeu_ps(s + 3 * lds, _mm512_extractf32x4_ps(sums, 3));
        return;
    }
    float out[16];
    _mm512_storeu_ps(out, sums);
    for (int ii = 0; ii < rows; ii++)
        for (int jj = 0; jj < keys; jj++) s[ii * lds + jj] = out[4 * ii + jj];
}

#endif /* FA_AVX512_DECODE_COMMON_H */
