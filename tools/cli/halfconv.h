/* SPDX-License-Identifier: MIT */
/*
 * tools/cli/ — the `flashattn` command's entry (main.c's table of subcommands, `info`) and the
 * helpers every subcommand shares.
 *
 * halfconv.h — fp16 and bf16 <-> fp32 conversions for the `flashattn` command, written out in
 * portable C (no F16C, no _Float16) so the tool builds with any C11 compiler.
 *
 * fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even; overflow gives ±inf; NaN stays a
 * (quiet) NaN with its sign; fp16 subnormals are produced and read exactly. The reverse
 * conversions are exact.
 */
#ifndef FA_TOOLS_HALFCONV_H
#define FA_TOOLS_HALFCONV_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fa_tool_f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static inline float fa_tool_bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* binary32 -> binary16, round to nearest even. */
static inline uint16_t fa_tool_f32_to_f16(float f) {
    uint32_t x = fa_tool_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) /* inf or NaN (NaN keeps its top payload bits and is made quiet) */
        return (uint16_t)(sign | 0x7c00u |
                          (ax > 0x7f800000u ? 0x0200u | ((ax >> 13) & 0x03ffu) : 0u));
    if (ax >= 0x47800000u) /* >= 65536: beyond the largest finite fp16 after rounding */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal fp16 range: >= 2^-14 */
        uint32_t h = (ax >> 13) - ((uint32_t)(127 - 15) << 10);
        uint32_t rem = ax & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++; /* a carry into the exponent is correct, 0x7bff + 1 is inf */
        return (uint16_t)(sign | h);
    }
    {
        /* fp16 subnormal: value = m16 * 2^-24, with m16 = m32 * 2^(e - 126) (24-bit m32) */
        uint32_t e = ax >> 23;
        if (e < 102) /* below 2^-25: rounds to zero */
            return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++; /* 0x3ff + 1 = 0x400, the smallest normal: also correct */
        return (uint16_t)(sign | r);
    }
}

/* binary16 -> binary32, exact. */
static inline float fa_tool_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x03ffu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return (sign ? -v : v);
    }
    if (e == 31)
        return fa_tool_bits_f32(sign | 0x7f800000u | (m << 13));
    return fa_tool_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* binary32 -> bfloat16, round to nearest even. */
static inline uint16_t fa_tool_f32_to_bf16(float f) {
    uint32_t x = fa_tool_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u); /* overflow rounds to inf, as it should */
    return (uint16_t)(x >> 16);
}

/* bfloat16 -> binary32, exact. */
static inline float fa_tool_bf16_to_f32(uint16_t h) { return fa_tool_bits_f32((uint32_t)h << 16); }

#endif /* FA_TOOLS_HALFCONV_H */
