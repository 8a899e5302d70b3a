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
 * and, in the same rotation, the read alone: the same K and V bytes summed by as many threads
 * as the library computes with, each its share of the sequence's pages (K's in the block
 * table's order, then V's), through the identity table (sum contiguous) and the shuffled one
 * (sum shuffled), and the same two asking, with each 256 bytes read, for the 256 bytes 32 KiB
 * further on in that order (sum+asks), as decode asks for its next group of keys: what
 * scattered pages cost a plain reader next to what they cost decode.
 *
 * Reported: the median time over rounds, the cache-read GB/s (2·L·8·128·esize bytes) and the
 * median over rounds of each row's time over its contiguous row's in the same round (decode's:
 * over contiguous; a sum's: over the same sum's contiguous row), then the median over rounds of
 * decode's shuffled ratio over each sum's shuffled ratio (below 1: decode loses less to the
 * scattered pages than the sum does). The decode calls' threads may still poll for work
 * (FA_SPIN_US, 50 us by default) as a sum starts; a pass over 64k tokens takes milliseconds. The
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
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../tools/cli/cli.h" /* clock, dtype parsing, element access, rng, poison */
#include "flashattn.h"

enum { H = 32, HK = 8, D = 128, MAX_ROUNDS = 101, LAYOUTS = 3, SUMS = 4, RUNS = LAYOUTS + SUMS };

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

/* ---- the read alone: a sum of the cache's bytes through a block table ---------------------- */

static volatile uint64_t sum_sink; /* keeps the sums alive */

/* Thread t's share: the sequence's pages [pages·t/T, pages·(t+1)/T), K's through the table,
 * then V's; ask: with each 256 bytes read, a prefetch of the 256 bytes ASK_AHEAD further on in
 * that order, as decode asks for its next group (16 fp16 or 8 fp32 tokens of the 8 heads). */
enum { ASK_AHEAD = 32 << 10 };
typedef struct sum_share {
    const unsigned char *k, *v;
    const int32_t *table;
    long lo, hi;
    size_t page_bytes; /* a multiple of 256 */
    int ask;
    uint64_t sum;
} sum_share;

/* A place in a share: offset o of its page table[i] of K (c = 0) or V (c = 1). */
typedef struct sum_cursor {
    int c;
    long i;
    size_t o;
} sum_cursor;

static const unsigned char *sum_at(const sum_share *s, const sum_cursor *u) {
    return (u->c ? s->v : s->k) + (size_t)s->table[u->i] * s->page_bytes + u->o;
}

/* Moves u `by` bytes on; returns 0 once it has left the share. */
static int sum_advance(const sum_share *s, sum_cursor *u, size_t by) {
    for (u->o += by; u->o >= s->page_bytes; u->o -= s->page_bytes)
        if (++u->i == s->hi) {
            if (u->c)
                return 0;
            u->c = 1, u->i = s->lo;
        }
    return 1;
}

static void sum_pages(sum_share *s) {
    if (s->lo == s->hi)
        return;
    sum_cursor rd = {0, s->lo, 0}, ask = rd;
    if (!s->ask) {
        do
            s->sum += cli_sum_words(sum_at(s, &rd), s->page_bytes);
        while (sum_advance(s, &rd, s->page_bytes));
        return;
    }
    int asking = sum_advance(s, &ask, ASK_AHEAD);
    do {
        if (asking) {
            for (int l = 0; l < 256; l += 64)
                __builtin_prefetch(sum_at(s, &ask) + l);
            asking = sum_advance(s, &ask, 256);
        }
        s->sum += cli_sum_words(sum_at(s, &rd), 256);
    } while (sum_advance(s, &rd, 256));
}

/* Threads 1..T-1 wait at `start` for each pass, or for stop. */
typedef struct sum_pool {
    int T, stop;
    sum_share *share;
    pthread_t *tid;
    pthread_barrier_t start, done;
} sum_pool;

typedef struct sum_worker {
    sum_pool *pool;
    int t;
} sum_worker;

static void *sum_worker_main(void *arg) {
    sum_worker *w = arg;
    for (;;) {
        pthread_barrier_wait(&w->pool->start);
        if (w->pool->stop)
            return NULL;
        sum_pages(&w->pool->share[w->t]);
        pthread_barrier_wait(&w->pool->done);
    }
}

/* Starts T - 1 threads (the caller is thread 0); returns 0 on success. */
static int sum_pool_start(sum_pool *pl, int T, sum_worker *w) {
    *pl = (sum_pool){.T = T};
    pl->share = calloc((size_t)T, sizeof *pl->share);
    pl->tid = calloc((size_t)T, sizeof *pl->tid);
    if (!pl->share || !pl->tid || pthread_barrier_init(&pl->start, NULL, (unsigned)T) ||
        pthread_barrier_init(&pl->done, NULL, (unsigned)T))
        return -1;
    for (int t = 1; t < T; t++) {
        w[t] = (sum_worker){pl, t};
        if (pthread_create(&pl->tid[t], NULL, sum_worker_main, &w[t]) != 0)
            return -1; /* the caller exits: the started threads wait at the barrier */
    }
    return 0;
}

/* One pass over the pages of k and v through table: seconds from the start barrier to the
 * last thread's end; the sums go to *sink. */
static double sum_pass(sum_pool *pl, const void *k, const void *v, const int32_t *table, long pages,
                       size_t page_bytes, int ask, uint64_t *sink) {
    for (int t = 0; t < pl->T; t++)
        pl->share[t] = (sum_share){
            k, v, table, pages * t / pl->T, pages * (t + 1) / pl->T, page_bytes, ask, 0};
    pthread_barrier_wait(&pl->start);
    const double t0 = cli_now();
    sum_pages(&pl->share[0]);
    pthread_barrier_wait(&pl->done);
    const double secs = cli_now() - t0;
    for (int t = 0; t < pl->T; t++)
        *sink += pl->share[t].sum;
    return secs;
}

static void sum_pool_stop(sum_pool *pl) {
    pl->stop = 1;
    pthread_barrier_wait(&pl->start);
    for (int t = 1; t < pl->T; t++)
        pthread_join(pl->tid[t], NULL);
    pthread_barrier_destroy(&pl->start);
    pthread_barrier_destroy(&pl->done);
    free(pl->share);
    free(pl->tid);
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
    static const char *const names[RUNS] = {
        "contiguous",   "paged in order",      "paged shuffled",   "sum contiguous",
        "sum shuffled", "sum+asks contiguous", "sum+asks shuffled"};
    const int T = (int)fa_context_num_threads(NULL); /* the threads decode computes with */
    sum_pool pool;
    sum_worker *workers = calloc((size_t)T, sizeof *workers);
    if (!workers || sum_pool_start(&pool, T, workers) != 0) {
        fprintf(stderr, "%s: cannot start %d threads for the sums\n", argv[0], T);
        return 1;
    }
    const size_t page_bytes = (size_t)N * HK * D * es;
    uint64_t sink = 0;
    static double t[RUNS][MAX_ROUNDS];
    for (int r = -1; r < rounds; r++) /* round -1: one untimed call of each */
        for (int i = 0; i < RUNS; i++) {
            const int m = (i + (r < 0 ? 0 : r)) % RUNS; /* the order rotates every round */
            double secs;
            if (m >= LAYOUTS) {
                const int s = m - LAYOUTS; /* 0, 1: the sum in order, shuffled; 2, 3: asking */
                secs = sum_pass(&pool, k, v, s % 2 ? shuffled : order, pages, page_bytes, s / 2,
                                &sink);
            } else {
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
                cli_poison(out[m], dt, (size_t)H * D); /* a call that writes nothing fails */
                const double t0 = cli_now();
                const fa_status st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &to, NULL);
                secs = cli_now() - t0;
                if (st != FA_OK) {
                    fprintf(stderr, "%s: %s: %s\n", argv[0], names[m], fa_last_error_message());
                    return 1;
                }
            }
            if (r >= 0)
                t[m][r] = secs;
        }
    sum_pool_stop(&pool);
    free(workers);
    sum_sink = sink;
    /* the checks: in order bitwise; shuffled to a tolerance of the output's rounding (2^-8 of
     * bf16, 2^-11 of fp16, fp32's summation-order differences), |out| <= 1 */
    const double tol = dt == FA_DTYPE_F32 ? 1e-5 : dt == FA_DTYPE_F16 ? 2e-3 : 1.6e-2;
    double err = 0.0;
    for (size_t i = 0; i < (size_t)H * D; i++) {
        const double e = fabs(cli_load(out[2], dt, i) - cli_load(out[0], dt, i));
        err = e > err || e != e ? e : err;
    }
    const int same = !memcmp(out[0], out[1], (size_t)H * D * es);
    printf("decode %s, cache (1, %ld, %d, %d), pages of %ld tokens, %d rounds, %d threads "
           "(FA_NUM_THREADS or all CPUs; the sums' too)\n",
           argv[3], L, HK, D, N, rounds, T);
    double ratio[RUNS][MAX_ROUNDS];
    for (int m = 0; m < RUNS; m++) {
        const int base = m < LAYOUTS ? 0 : m - (m - LAYOUTS) % 2; /* a sum's: its contiguous */
        for (int r = 0; r < rounds; r++)
            ratio[m][r] = t[m][r] / t[base][r];
        const double ms = median(t[m], rounds);
        printf("  %-19s %9.3f ms %7.1f GB/s  time / %s's %.3f\n", names[m], 1e3 * ms,
               2.0 * (double)(n * es) / ms * 1e-9, names[base], median(ratio[m], rounds));
    }
    double over[2][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int a = 0; a < 2; a++)
            over[a][r] = ratio[2][r] / ratio[LAYOUTS + 1 + 2 * a][r];
    printf("  shuffled pages: decode's ratio over the sum's %.3f, over the asking sum's %.3f\n",
           median(over[0], rounds), median(over[1], rounds));
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
