/* SPDX-License-Identifier: MIT */
/*
 * decode_kernels.c — times the decode microkernels alone (kernels.h: qk_rows, pv_rows) on K/V
 * rows that sit in L2, so what `flashattn bench-decode` cannot separate is measured here: the
 * cores' cost per key, without the memory's.
 *
 * Shape of the decode bench: by default 4 query rows per KV head (H = 32, Hk = 8; the second
 * argument sets it: 1 for MHA), D = 128, blocks of 128 keys of 8 KV heads, BSHD rows (a key's
 * heads side by side), and the decode's own keys per call (8 of fp32 K or V; of fp16/bf16 the
 * kernel set's decode_keys_half, 16 and 16 on AVX-512), each head with its own scores and output
 * rows, as in decode (one shared output row set had each call's loads wait on the stores of the
 * call before). The rows' L keys (default 64: 64 x 8 heads, 256 KiB of
 * fp32 K and as much V) are reused every repetition, so they stay in L2. Per kernel set and
 * dtype it prints the best of 40 short timings (the host's other load only ever adds time) of qk
 * alone, pv alone and both, in ns per key and KV head, and the cache-read rate one core could
 * sustain at that speed (bytes of K and V per key and head over the time): the ceiling the cores
 * put on decode. Where decode runs bf16 caches on
 * the bf16 dot product (AVX512_BF16, rows a multiple of 4), a row "bf16d" times that path.
 *
 * Uses the library's internal kernel table, so it links the static library:
 *   cmake --build build --target bench_decode_kernels && build/bench_decode_kernels [L] [rows]
 * FA_CPU_ISA picks the kernel set, as for the library.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../src/cpu/cpu.h"
#include "flashattn.h"

enum { MAX_ROWS = 16, D = 128, HK = 8, BLOCK = 128, REPS = 40 };

static int g_rows = 4; /* query rows per KV head: H / Hk of the decode */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Best time per key and KV head of `which` (1 qk, 2 pv, 3 both) over L keys, in ns. q2: the
 * query rows as bf16 pairs for decode's bf16 dot-product path (qk_rows_bf16, and pv_rows_bf16
 * on P rounded to bf16, the rounding timed with it); NULL: qk_rows and pv_rows. s: each head's
 * scores, [HK][MAX_ROWS, BLOCK]; o: each head's output rows, [HK][MAX_ROWS, D]. */
static double time_kernels(const fa__cpu_kernels *kern, int32_t dtype, int L, int which,
                           const char *k, const char *v, const float *q, const uint32_t *q2,
                           float *s, float *o) {
    static const float alpha[MAX_ROWS] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const size_t es = dtype == FA_DTYPE_F32 ? 4 : 2;
    /* keys per call as decode makes them (fwd.c: 8 of fp32, the kernel set's decode_keys_half) */
    const int qkk = dtype == FA_DTYPE_F32 ? 8 : kern->decode_keys_half[0];
    const int pvk = dtype == FA_DTYPE_F32 ? 8 : kern->decode_keys_half[1];
    const long passes = L < 16 * 1024 ? 16L * 1024 / L : 1; /* about 16k keys per timing */
    const void *rows[BLOCK];
    double best = 1e300;
    for (int rep = 0; rep < REPS; rep++) {
        const double t0 = now();
        for (long pass = 0; pass < passes; pass++)
            for (int j0 = 0; j0 < L; j0 += BLOCK) {
                const int n = L - j0 < BLOCK ? L - j0 : BLOCK;
                for (int jg = 0; (which & 1) && jg < n; jg += qkk)
                    for (int h = 0; h < HK; h++) { // S = Q Kᵀ: [rows, c]
                        float *sh = s + (size_t)h * MAX_ROWS * BLOCK;
                        const int c = n - jg < qkk ? n - jg : qkk;
                        for (int j = 0; j < c; j++)
                            rows[j] = k + ((size_t)(j0 + jg + j) * HK + (size_t)h) * D * es;
                        if (q2)
                            kern->qk_rows_bf16(g_rows, c, D / 2, q2, D / 2, rows, 1.0f, sh + jg,
                                               BLOCK, NULL);
                        else
                            kern->qk_rows(g_rows, c, D, q, D, rows, dtype, sh + jg, BLOCK, NULL);
                    }
                for (int jg = 0; (which & 2) && jg < n; jg += pvk)
                    for (int h = 0; h < HK; h++) { // O += P V: [rows, D]
                        const float *sh = s + (size_t)h * MAX_ROWS * BLOCK;
                        float *oh = o + (size_t)h * MAX_ROWS * D;
                        const int c = n - jg < pvk ? n - jg : pvk;
                        for (int j = 0; j < c; j++)
                            rows[j] = v + ((size_t)(j0 + jg + j) * HK + (size_t)h) * D * es;
                        if (q2) { /* as decode: P rounded to bf16 pairs, then the pair product */
                            uint32_t p2[MAX_ROWS * 16];
                            for (int r = 0; r < g_rows; r++)
                                kern->to_bf16(c, sh + r * BLOCK + jg, (uint16_t *)(p2 + r * 16));
                            kern->pv_rows_bf16(g_rows, c, D, p2, 16, rows, alpha, oh, D, NULL);
                        } else {
                            kern->pv_rows(g_rows, c, D, sh + jg, BLOCK, rows, dtype, alpha, oh, D,
                                          NULL);
                        }
                    }
            }
        const double t = (now() - t0) / ((double)passes * L * HK);
        best = t < best ? t : best;
    }
    return best * 1e9;
}

/* K and V of dtype: values in [-0.5, 0.5), none subnormal (byte patterns read as fp32 were,
 * and Intel cores take a microcode assist on each subnormal product: 10x the time). */
static void fill(const fa__cpu_kernels *kern, int32_t dtype, int L, char *k, char *v) {
    const size_t n = (size_t)L * HK * D, es = dtype == FA_DTYPE_F32 ? 4 : 2;
    float row[D];
    for (size_t r = 0; r < n / D; r++) {
        for (int i = 0; i < D; i++) row[i] = 0.0103f * (float)((r * D + i) * 7 % 97) - 0.5f;
        kern->from_f32(D, row, 1.0f, dtype, k + r * D * es);
        for (int i = 0; i < D; i++) row[i] = 0.0107f * (float)((r * D + i) * 13 % 89) - 0.45f;
        kern->from_f32(D, row, 1.0f, dtype, v + r * D * es);
    }
}

int main(int argc, char **argv) {
    const int L = argc > 1 ? atoi(argv[1]) : 64;
    g_rows = argc > 2 ? atoi(argv[2]) : 4;
    if (L < 1 || L > (1 << 20) || g_rows < 1 || g_rows > MAX_ROWS) {
        fprintf(stderr, "usage: bench_decode_kernels [L keys, 1..1048576, default 64] "
                        "[query rows per KV head, 1..%d, default 4]\n", MAX_ROWS);
        return 2;
    }
    const fa__cpu_kernels *kern = fa__cpu_kernels_get();
    if (!kern->qk_rows || !kern->pv_rows) {
        printf("kernel set %s has no decode products (decode packs K and V there)\n", kern->name);
        return 0;
    }
    const size_t bytes = (size_t)L * HK * D * 4;
    char *k = malloc(bytes), *v = malloc(bytes);
    float *q = malloc(sizeof(float) * MAX_ROWS * D);
    float *s = malloc(sizeof(float) * HK * MAX_ROWS * BLOCK); /* each head's S and O */
    float *o = malloc(sizeof(float) * HK * MAX_ROWS * D);
    if (!k || !v || !q || !s || !o) {
        fprintf(stderr, "bench_decode_kernels: out of memory\n");
        return 1;
    }
    for (int i = 0; i < MAX_ROWS * D; i++) q[i] = 0.01f * (float)(i % 97);
    for (int i = 0; i < HK * MAX_ROWS * D; i++) o[i] = 0.0f;
    for (int i = 0; i < HK * MAX_ROWS * BLOCK; i++) s[i] = 0.001f * (float)(i % 89);

    printf("decode kernels \"%s\": %d query rows per KV head, D=%d, %d keys x %d KV heads in L2\n",
           kern->name, g_rows, D, L, HK);
    printf("ns per key and KV head (best of %d); GB/s: K+V bytes per key and head over qk+pv\n", REPS);
    /* the fourth row: bf16 scores through the bf16 dot product, where decode uses it */
    static uint32_t q2[MAX_ROWS * D / 2];
    for (int i = 0; i < MAX_ROWS * D / 2; i++) q2[i] = 0x3c233c23u; /* 0.01 in both halves */
    const int dot = kern->qk_rows_bf16 != NULL && kern->pv_rows_bf16 != NULL && g_rows % 4 == 0;
    static const int32_t dtypes[4] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16, FA_DTYPE_BF16};
    static const char *const names[4] = {"fp32", "fp16", "bf16", "bf16d"};
    if (dot)
        printf("bf16d: bf16 on the bf16 dot product (qk_rows_bf16, pv_rows_bf16), decode's path "
               "on this CPU\n");
    printf("%-5s %8s %8s %8s %12s\n", "dtype", "qk", "pv", "qk+pv", "GB/s/core");
    for (int t = 0; t < 3 + dot; t++) {
        const uint32_t *qd = t == 3 ? q2 : NULL;
        fill(kern, dtypes[t], L, k, v);
        const double qk = time_kernels(kern, dtypes[t], L, 1, k, v, q, qd, s, o);
        const double pv = time_kernels(kern, dtypes[t], L, 2, k, v, q, qd, s, o);
        const double both = time_kernels(kern, dtypes[t], L, 3, k, v, q, qd, s, o);
        const double kv = 2.0 * D * (t == 0 ? 4 : 2);
        printf("%-5s %8.2f %8.2f %8.2f %12.1f\n", names[t], qk, pv, both, kv / both);
    }
    volatile float sink = o[0] + s[0]; /* keeps the products observable */
    (void)sink;
    free(k), free(v), free(q), free(s), free(o);
    return 0;
}
