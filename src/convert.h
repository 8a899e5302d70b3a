/* SPDX-License-Identifier: MIT */
/*
 * convert.h — fp16 and bf16 to and from fp32, round to nearest even, NaN and infinity kept; the
 * 8-bit cache formats (int8, fp8 e4m3fn and e5m2) to fp32 and back (saturating); elements of
 * arrays of any of them read as fp32, and fp32/fp16/bf16 ones written.
 * Portable C, also compiled as CUDA device code (FA_HD); the SIMD kernels convert in their
 * packs instead.
 */
#ifndef FA_CONVERT_H
#define FA_CONVERT_H

#include "flashattn.h"
#include "hd.h"

#include <math.h>
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

/* fp8 e4m3fn to fp32, exactly: 2^(e-7)·(1 + m/8), subnormals m·2^-9, S.1111.111 NaN. */
FA_HD float fa__e4m3_to_f32(uint8_t x) {
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, e = (x >> 3) & 0xfu, m = x & 7u;
    if (e == 15 && m == 7) return fa__bits_f32(sign | 0x7fc00000u);
    if (e == 0) return fa__bits_f32(sign | fa__f32_bits((float)m * 0.001953125f));
    return fa__bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* fp8 e5m2 to fp32, exactly: the upper byte of an fp16. */
FA_HD float fa__e5m2_to_f32(uint8_t x) { return fa__f16_to_f32((uint16_t)(x << 8)); }

/* |x| as fp8 with M mantissa bits and exponent bias `bias`, round to nearest even, finite and at
 * most the code `top` (saturating), then the sign; a NaN gives code `nan` with the sign. */
FA_HD uint8_t fa__f32_to_f8(float x, int M, int bias, uint8_t top, uint8_t nan) {
    const uint32_t u = fa__f32_bits(x), a = u & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return (uint8_t)(sign | nan);
    uint32_t code;
    if (a < (uint32_t)(128 - bias) << 23) { /* below the smallest normal 2^(1-bias) */
        /* a multiple of 2^(1-bias-M): its count is the code (2^M: the smallest normal) */
        code = (uint32_t)rintf(fa__bits_f32(a) * fa__bits_f32((uint32_t)(126 + bias + M) << 23));
    } else if (a >= 0x7f000000u) { /* 2^127 and above (infinity): far beyond any fp8 */
        code = top;
    } else { /* drop 23 - M mantissa bits, to nearest even (a carry moves into the exponent) */
        const uint32_t r = a + ((1u << (22 - M)) - 1u) + ((a >> (23 - M)) & 1u);
        code = (((r >> 23) - 127u + (uint32_t)bias) << M) | ((r >> (23 - M)) & ((1u << M) - 1u));
    }
    return (uint8_t)(sign | (code > top ? top : code));
}

/* fp32 to fp8 e4m3fn (largest 448 = 0x7e, NaN 0x7f) and e5m2 (largest 57344 = 0x7b, NaN 0x7e),
 * as fa__f32_to_f8: saturating. */
FA_HD uint8_t fa__f32_to_e4m3(float x) { return fa__f32_to_f8(x, 3, 7, 0x7eu, 0x7fu); }
FA_HD uint8_t fa__f32_to_e5m2(float x) { return fa__f32_to_f8(x, 2, 15, 0x7bu, 0x7eu); }

/* fp32 to int8: x rounded to nearest even, saturating at +-127; NaN gives 0. */
FA_HD int8_t fa__f32_to_i8(float x) {
    if (!(x == x)) return 0;
    const float r = rintf(x);
    return (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
}

/* Element idx of an array of any floating dtype, fp32 or 8-bit, as fp32 (8-bit: the stored
 * value, before its scale). */
FA_HD float fa__row_load(const void *data, int32_t dtype, int64_t idx) {
    if (dtype == FA_DTYPE_F32) return ((const float *)data)[idx];
    if (dtype == FA_DTYPE_I8) return (float)((const int8_t *)data)[idx];
    if (dtype == FA_DTYPE_F8_E4M3) return fa__e4m3_to_f32(((const uint8_t *)data)[idx]);
    if (dtype == FA_DTYPE_F8_E5M2) return fa__e5m2_to_f32(((const uint8_t *)data)[idx]);
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
