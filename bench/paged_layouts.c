/* SPDX-License-Identifier: MIT */
/*
 * paged_layouts.c — `build/bench_paged_layouts`: one decode step (q (1, 1, 32, 128) against a
 * cache of L tokens, 8 KV heads) through fa_forward_kvcache from the same K and V buffers laid
 * out three ways, alternating within each round so that the three see the same machine:
 *
 *   contiguous      the buffers as (1, L, 8, 128)
 *   paged in order  the same memory as a pool (L / N, N, 8, 128), block table 0, 1, 2, ...
 *   paged shuffled  the same pool, the block table a fixed random permutation: each page of
 *                   the sequence somewhere else in the pool, as a serving engine's pages become
 *
 * Reported: the median time over rounds, the cache-read GB/s (2·L·8·128·esize bytes) and the
 * median over rounds of each layout's time over the contiguous one's in the same round. The
 * buffers are on transparent huge pages where the OS has them (madvise), like bench-decode's,
 * and hold random values; the outputs are checked: paged in order reads the same sequence as
 * the contiguous cache, so its output must be bitwise the same, and the shuffled one attends
 * over the same keys in another order, so its output must agree to rounding (the whole cache is
 * attended, no mask: attention does not depend on the keys' order; so this checks the reads,
 * not the block table, which any permutation of the whole pool would satisfy: the table is
 * checked by tests/test_kvcache.c and bench-decode's fp64 rows).
 *
 * usage: bench_paged_layouts L N DTYPE ROUNDS   (DTYPE f16, f32 or bf16; N divides L; ROUNDS
 * 1-101)
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../tools/flashattn/cli.h" /* clock, dtype parsing, element access, rng, poison */
#include "flashattn.h"

enum { H = 32, HK = 8, D = 128, MAX_ROUNDS = 101, LAYOUTS = 3 };

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double s[MAX_ROUNDS];
    memcpy(s, v, sizeof *v * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp);
    return s[n / 2];
}

/* 2 MiB-aligned, on huge pages where the OS has them; not touched here. */
static void *alloc_2m(size_t bytes) {
    const size_t n = (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    void *p = aligned_alloc((size_t)2 << 20, n);
#ifdef MADV_HUGEPAGE
    if (p)
        (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

/* n values uniform in [-1, 1) into x as dtype dt (first touch here). */
static void fill_random(void *x, fa_dtype dt, size_t n, cli_rng *rng) {
    for (size_t i = 0; i < n; i++)
        cli_store(x, dt, i, cli_rng_uniform(rng));
}

int main(int argc, char **argv) {
    const long L = argc == 5 ? atol(argv[1]) : 0, N = argc == 5 ? atol(argv[2]) : 0;
    const int rounds = argc == 5 ? atoi(argv[4]) : 0;
    fa_dtype dt = FA_DTYPE_F32;
    if (!(L >= 1 && L <= (1L << 24) && N >= 1 && N <= L && L % N == 0 && rounds >= 1 &&
          rounds <= MAX_ROUNDS && cli_parse_dtype(argv[3], &dt) == 0)) {
        fprintf(stderr,
                "usage: %s L N f16|f32|bf16 ROUNDS   (1 <= L <= 2^24, N divides L, "
                "1 <= ROUNDS <= %d)\n",
                argv[0], MAX_ROUNDS);
        return 2;
    }
    const size_t es = cli_dtype_size(dt), n = (size_t)L * HK * D;
    const long pages = L / N;
    void *k = alloc_2m(n * es), *v = alloc_2m(n * es), *q = malloc((size_t)H * D * es);
    void *out[LAYOUTS];
    for (int m = 0; m < LAYOUTS; m++)
        out[m] = malloc((size_t)H * D * es);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)pages);
    int32_t *shuffled = malloc(sizeof(int32_t) * (size_t)pages);
    if (!k || !v || !q || !out[0] || !out[1] || !out[2] || !order || !shuffled) {
        fprintf(stderr, "%s: out of memory for a cache of %ld tokens\n", argv[0], L);
        return 1;
    }
    cli_rng rng = {3};
    fill_random(k, dt, n, &rng);
    fill_random(v, dt, n, &rng);
    fill_random(q, dt, (size_t)H * D, &rng);
    for (long i = 0; i < pages; i++)
        order[i] = shuffled[i] = (int32_t)i;
    for (long i = pages; i > 1; i--) { /* Fisher-Yates */
        const long j = (long)(cli_rng_next(&rng) % (uint64_t)i);
        const int32_t x = shuffled[i - 1];
        shuffled[i - 1] = shuffled[j];
        shuffled[j] = x;
    }
    const int64_t qs[4] = {1, 1, H, D}, cs[4] = {1, L, HK, D}, ps[4] = {pages, N, HK, D};
    const int64_t ts[2] = {1, pages};
    const fa_tensor tq = fa_tensor_contiguous(q, dt, 4, qs);
    static const char *const names[LAYOUTS] = {"contiguous", "paged in order", "paged shuffled"};
    static double t[LAYOUTS][MAX_ROUNDS];
    for (int r = -1; r < rounds; r++) /* round -1: one untimed call of each */
        for (int i = 0; i < LAYOUTS; i++) {
            const int m = (i + (r < 0 ? 0 : r)) % LAYOUTS; /* the order rotates every round */
            fa_kvcache kv;
            fa_kvcache_init(&kv);
            kv.k_cache = fa_tensor_contiguous(k, dt, 4, m ? ps : cs);
            kv.v_cache = fa_tensor_contiguous(v, dt, 4, m ? ps : cs);
            if (m) {
                kv.block_table =
                    fa_tensor_contiguous(m == 1 ? order : shuffled, FA_DTYPE_I32, 2, ts);
                kv.cache_seqlen = L;
            }
            const fa_tensor to = fa_tensor_contiguous(out[m], dt, 4, qs);
            cli_poison(out[m], dt, (size_t)H * D); /* a call that writes nothing fails the check */
            const double t0 = cli_now();
            const fa_status st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &to, NULL);
            const double dt_s = cli_now() - t0;
            if (st != FA_OK) {
                fprintf(stderr, "%s: %s: %s\n", argv[0], names[m], fa_last_error_message());
                return 1;
            }
            if (r >= 0)
                t[m][r] = dt_s;
        }
    /* the checks: in order bitwise; shuffled to a tolerance of the output's rounding (2^-8 of
     * bf16, 2^-11 of fp16, fp32's summation-order differences), |out| <= 1 */
    const double tol = dt == FA_DTYPE_F32 ? 1e-5 : dt == FA_DTYPE_F16 ? 2e-3 : 1.6e-2;
    double err = 0.0;
    for (size_t i = 0; i < (size_t)H * D; i++) {
        const double e = fabs(cli_load(out[2], dt, i) - cli_load(out[0], dt, i));
        err = e > err || e != e ? e : err;
    }
    const int same = !memcmp(out[0], out[1], (size_t)H * D * es);
    printf("decode %s, cache (1, %ld, %d, %d), pages of %ld tokens, %d rounds (FA_NUM_THREADS or "
           "all CPUs)\n",
           argv[3], L, HK, D, N, rounds);
    for (int m = 0; m < LAYOUTS; m++) {
        double ratio[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            ratio[r] = t[m][r] / t[0][r];
        const double ms = median(t[m], rounds);
        printf("  %-15s %9.3f ms %7.1f GB/s  time / contiguous's %.3f\n", names[m], 1e3 * ms,
               2.0 * (double)(n * es) / ms * 1e-9, median(ratio, rounds));
    }
    printf("  check: in order %s contiguous; shuffled max |diff| %.2e (tolerance %.1e)\n",
           same ? "bitwise equal to" : "DIFFERS FROM", err, tol);
    free(k);
    free(v);
    free(q);
    for (int m = 0; m < LAYOUTS; m++)
        free(out[m]);
    free(order);
    free(shuffled);
    if (!same || !(err <= tol)) {
        fprintf(stderr, "%s: the layouts' outputs disagree\n", argv[0]);
        return 1;
    }
    return 0;
}
