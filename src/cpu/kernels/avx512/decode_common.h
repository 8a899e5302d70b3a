/* SPDX-License-Identifier: MIT */
/*
 * decode_common.h — pieces shared by the AVX-512 decode products (avx512.c) and their bf16
 * dot-product variant (avx512bf16/bf16.c): the 16-way reduction of a 4 x 4 tile of dot products
 * and the prefetch of the rows the caller reads next, spread over a tile's steps so the requests
 * keep pace with the tile's loads. Header-only, for AVX-512F builds.
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

/* Prefetches lines [l0, l1) of row r of pf, if there is one. prefetcht0: on Zen 5 decode took
 * 0.75-0.93 of prefetcht1's time at 32k tokens (bench/results/2026-12-02-decode-zen5-order.md). */
static inline __attribute__((always_inline)) void fa__prefetch_lines(const fa__prefetch *pf,
                                                                     int r, int l0, int l1) {
    if (pf && r < pf->n)
        for (int l = l0; l < l1; l++)
            _mm_prefetch((const char *)pf->rows[r] + 64 * l, _MM_HINT_T0);
}

/* Line `line` of each of pf's rows [r0, r0 + 4), if there is a pf: a qk tile of 4 keys, which
 * reads a line of each of its 4 rows per step, asks for the next rows at the same pace. */
static inline __attribute__((always_inline)) void fa__prefetch_line4(const fa__prefetch *pf,
                                                                     int r0, int line) {
    if (pf && line * 64 < pf->bytes)
        for (int r = r0; r < r0 + 4; r++) fa__prefetch_lines(pf, r, line, line + 1);
}

/* The lines [*l0, *l1) of pf's rows that a pv tile over columns [c, c + w) of d asks for, so
 * the column tiles of a row of keys share each row's lines; none without a pf. */
static inline void fa__prefetch_cols(const fa__prefetch *pf, int c, int w, int d, int *l0,
                                     int *l1) {
    const int nl = pf ? (pf->bytes + 63) / 64 : 0;
    *l0 = nl * c / d;
    *l1 = c + w >= d ? nl : nl * (c + w) / d;
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
