/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * kv8.h — the 8-bit KV caches of `flashattn bench-decode` (int8, fp8 e4m3 and e5m2 with fp32
 * scales, fa_kvcache.k_scale in include/flashattn.h): their names on the command line and in
 * the tables, their elements read exactly as the library reads them, and the accuracy table
 * (decode_accuracy.c).
 */
#ifndef FA_TOOLS_BENCH_KV8_H
#define FA_TOOLS_BENCH_KV8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../cli/cli.h"

static inline int bd_dtype_8bit(fa_dtype t) {
    return t == FA_DTYPE_I8 || t == FA_DTYPE_F8_E4M3 || t == FA_DTYPE_F8_E5M2;
}

/* Bytes per element: 1 for the 8-bit caches, else cli_dtype_size. */
static inline size_t bd_dtype_size(fa_dtype t) { return bd_dtype_8bit(t) ? 1 : cli_dtype_size(t); }

static inline const char *bd_dtype_name(fa_dtype t) {
    if (t == FA_DTYPE_I8)
        return "int8";
    if (t == FA_DTYPE_F8_E4M3)
        return "e4m3";
    if (t == FA_DTYPE_F8_E5M2)
        return "e5m2";
    return cli_dtype_name(t);
}

/* cli_parse_dtype's names, and "i8"/"int8", "e4m3"/"f8_e4m3"/"fp8_e4m3",
 * "e5m2"/"f8_e5m2"/"fp8_e5m2". 0 on success. */
static inline int bd_parse_dtype(const char *s, fa_dtype *out) {
    if (cli_parse_dtype(s, out) == 0)
        return 0;
    if (!s)
        return -1;
    if (!strcmp(s, "i8") || !strcmp(s, "int8"))
        *out = FA_DTYPE_I8;
    else if (!strcmp(s, "e4m3") || !strcmp(s, "f8_e4m3") || !strcmp(s, "fp8_e4m3"))
        *out = FA_DTYPE_F8_E4M3;
    else if (!strcmp(s, "e5m2") || !strcmp(s, "f8_e5m2") || !strcmp(s, "fp8_e5m2"))
        *out = FA_DTYPE_F8_E5M2;
    else
        return -1;
    return 0;
}

/* A stored 8-bit value, exactly: int8 as is; e4m3fn 2^(e-7)·(1 + m/8), subnormals m·2^-9,
 * S.1111.111 NaN; e5m2 the upper byte of an fp16. */
static inline float bd_q8_value(fa_dtype t, uint8_t x) {
    if (t == FA_DTYPE_I8)
        return (float)(int8_t)x;
    if (t == FA_DTYPE_F8_E5M2)
        return fa_tool_f16_to_f32((uint16_t)(x << 8));
    const int e = (x >> 3) & 15, m = x & 7;
    const float v = e == 15 && m == 7 ? NAN
                    : e               ? ldexpf((float)(8 + m), e - 10)
                                      : ldexpf((float)m, -9);
    return x & 0x80 ? -v : v;
}

/* Element e of a cache as the library reads it: an 8-bit stored value times its row's scale
 * (scale[e / d], one per row of d values), the product in fp32; other dtypes exactly. */
static inline double bd_kv_load(const void *data, fa_dtype t, const float *scale, size_t e,
                                size_t d) {
    if (!bd_dtype_8bit(t))
        return cli_load(data, t, e);
    return (double)(bd_q8_value(t, ((const uint8_t *)data)[e]) * scale[e / d]);
}

/* `flashattn bench-decode --accuracy` (decode_accuracy.c): the output error of each 8-bit format
 * against the fp32 cache at each cache length. Returns the exit status: 0, or 1 when a kernel
 * check failed. */
int bd_accuracy(fa_context *ctx, const long *lens, int nlens, long queries, const char *cmdline);

#endif /* FA_TOOLS_BENCH_KV8_H */
