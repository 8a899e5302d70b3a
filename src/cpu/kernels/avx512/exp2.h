/* SPDX-License-Identifier: MIT */
/*
 * exp2.h — the AVX-512 2^x shared by avx512.c's exp2_sum and the bf16 backward's row step in
 * avx512bf16/bf16.c, so both give the same bits. Header-only, for AVX-512F builds.
 */
#ifndef FA_AVX512_EXP2_H
#define FA_AVX512_EXP2_H

#include <immintrin.h>

/* 2^x for x <= 128, within 1 ulp: x = n + f with f in [-1/2, 1/2], 2^f by a degree-6
 * polynomial, times 2^n by vscalefps. x is clamped at -200, where 2^n underflows to +0, so
 * -inf gives exactly 0. NaN gives NaN: the clamp is max(-200, x), and vmaxps returns its second
 * operand when either is NaN. */
static inline __m512 fa__exp2_ps(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-200.0f), x);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5345810970757157e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399932067841291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618489071726799e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550328642129898e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022646248340607e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471824645996e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
