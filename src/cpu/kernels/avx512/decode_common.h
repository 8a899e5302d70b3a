/* SPDX-License-Identifier: MIT */
/*
 * decode_common.h — pieces shared by the AVX-512 decode products (avx512.c) and their bf16
 * dot-product variant (avx512bf16/bf16.c): the 16-way reduction of a 4 x 4 tile of dot products
 * and the prefetch of the rows the caller reads next, spread over a product's load steps.
 * Header-only, for AVX-512F builds.
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

/* The caller's next rows (pf) asked for in memory order, row by row and each row's lines in
 * turn; rows that follow each other in memory (a BSHD cache's heads of a key, and its keys when
 * the cache is dense) are walked as one span, so a line costs a prefetch and an add. A product
 * asks at each load step for as many lines as the step loads (fa__ask_lines), so the requests
 * keep pace with its reads, and at its end for any left (fa__ask_rest). On Zen 5, where the
 * products had asked a line of each of several rows per step, this took 0.87 (fp32), 0.94 (bf16)
 * and 0.96-1.05 (fp16) of the time at 32k tokens (bench/results/2026-12-02-decode-zen5-asks.md).
 * The hint is a compile-time L2 in each product, whose entry points come one per hint
 * (dispatch.c picks, kernels.h: fa__qk_rows_l2_avx512):
 * prefetcht0 on Zen 5, where decode took 0.75-0.93 of prefetcht1's time
 * (bench/results/2026-12-02-decode-zen5-order.md); prefetcht1 on Sapphire Rapids, where it took
 * 0.78-0.95 of prefetcht0's time at 16k-64k tokens (bench/results/2026-12-03-decode-spr-l2.md),
 * and on Zen 4, where it took 0.62-0.74 (bench/results/2026-12-04-decode-zen4-l2.md). */
typedef struct fa__asks {
    const char *at, *end; /* the next line to ask for, and the end of its span */
    const void *const *rows;
    int r, n, bytes; /* the row after the span; rows; bytes of a row */
} fa__asks;

/* The span that starts at row a->r (0: none left). */
static inline int fa__asks_span(fa__asks *a) {
    if (a->r >= a->n) return 0;
    a->at = (const char *)a->rows[a->r];
    a->end = a->at + a->bytes;
    for (a->r++; a->r < a->n && (const char *)a->rows[a->r] == a->end; a->r++) a->end += a->bytes;
    return 1;
}

static inline fa__asks fa__asks_begin(const fa__prefetch *pf) {
    fa__asks a = {NULL, NULL, NULL, 0, 0, 0};
    if (!pf || pf->n <= 0 || pf->bytes <= 0)
        return a;
    if (!pf->rows) { /* rows back to back: one span */
        a.at = pf->base;
        a.end = pf->base + (int64_t)pf->n * pf->bytes;
        return a;
    }
    a.rows = pf->rows, a.n = pf->n, a.bytes = pf->bytes;
    fa__asks_span(&a);
    return a;
}

/* One line into L2 (prefetcht1) where L2, else into L1 (prefetcht0); L2 is a constant. */
static inline __attribute__((always_inline)) void fa__ask(const char *line, const int L2) {
    if (L2) _mm_prefetch(line, _MM_HINT_T1);
    else _mm_prefetch(line, _MM_HINT_T0);
}

/* The next k lines (k: a compile-time count in each caller), or those left. */
static inline __attribute__((always_inline)) void fa__ask_lines(fa__asks *a, const int k,
                                                                const int L2) {
    for (int u = 0; u < k; u++) {
        if (a->at >= a->end && !fa__asks_span(a)) return;
        fa__ask(a->at, L2);
        a->at += 64;
    }
}

/* Every line not asked for yet. */
static inline __attribute__((always_inline)) void fa__ask_rest(fa__asks *a, const int L2) {
    do
        for (; a->at < a->end; a->at += 64) fa__ask(a->at, L2);
    while (fa__asks_span(a));
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
