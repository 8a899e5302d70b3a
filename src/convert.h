/* SPDX-License-Identifier: MIT */
/*
 * convert.h — fp16 and bf16 to and from fp32, round to nearest even, NaN and infinity kept, and
 * elements of fp32/fp16/bf16 arrays read and written as fp32.
 * Portable C, also compiled as CUDA device code (FA_HD); the SIMD kernels convert in their
 * packs instead.
 */
#ifndef FA_CONVERT_H
#define FA_CONVERT_H

#include "flashattn.h"
#include "hd.h"

#include <stdint.h>
#include <string.h>

FA_HD uint32_t fa__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

FA_HD float fa__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

FA_HD float fa__bf16_to_f32(uint16_t h) { return fa__bits_f32((uint32_t)h << 16); }

FA_HD uint16_t fa__f32_to_bf16(float f) {
    uint32_t u = fa__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

FA_HD float fa__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return fa__bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in fp32 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return fa__bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

FA_HD uint16_t fa__f32_to_f16(float f) {
    uint32_t u = fa__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* below the smallest normal 2^-14: round to a multiple of 2^-24 (subnormal or zero).
         * Adding 0.5 (2^-1) aligns the fp32 rounding point with 2^-24, RNE by the FPU. */
        float r = fa__bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(fa__f32_bits(r) - 0x3f000000u));
    }
    /* normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even */
    uint32_t m = a + 0xc8000fffu + ((a >> 13) & 1u); /* -112 << 23 folded in, plus rounding */
    return (uint16_t)(sign | (uint16_t)(m >> 13));
}

/* Element idx of an fp32, fp16 or bf16 array, as fp32. */
FA_HD float fa__row_load(const void *data, int32_t dtype, int64_t idx) {
    if (dtype == FA_DTYPE_F32) return ((const float *)data)[idx];
    const uint16_t x = ((const uint16_t *)data)[idx];
    return dtype == FA_DTYPE_F16 ? fa__f16_to_f32(x) : fa__bf16_to_f32(x);
}

/* x into element idx of an fp32, fp16 or bf16 array (round to nearest even). */
FA_HD void fa__row_store(void *data, int32_t dtype, int64_t idx, float x) {
    if (dtype == FA_DTYPE_F32)
        ((float *)data)[idx] = x;
    else if (dtype == FA_DTYPE_F16)
        ((uint16_t *)data)[idx] = fa__f32_to_f16(x);
    else
        ((uint16_t *)data)[idx] = fa__f32_to_bf16(x);
}

#endif /* FA_CONVERT_H */
