/* SPDX-License-Identifier: MIT */
/*
 * read_order.c — `build/bench_read_order` (and `_avx2`): how fast a BSHD KV cache reads in the
 * orders a decode step can read it, with and without decode's arithmetic and prefetch requests.
 * It is the experiment behind decode's prefetch plan (src/cpu/fwd.c: decode_block, decode_ask).
 *
 * The buffer is a cache of 8 KV heads of 128 fp32 (a token: 4 KiB), its first half K and its
 * second V; each thread takes its own contiguous share of tokens. Orders (the argument names):
 *   sum       a sum of the whole share front to back: what bench-decode's probe does
 *   seq       token by token, each token's heads in turn, 4 FMAs per 64 bytes against 4 query
 *             rows held in L1 (a 4-row decode tile's arithmetic)
 *   group     decode's order: blocks of 128 tokens, K then V, in groups of 8 tokens, head by
 *             head inside a group (each head's 8 rows), the same arithmetic; no prefetch
 *   next-call the same, each head's rows asking (prefetcht0) for the next call's rows, as
 *             decode did before: the next head's rows of the group, then the next group's
 *   next-group the same, each call asking for its share of the next group's rows in memory
 *             order (key by key, each key's heads in turn), a line per 64 bytes it loads: what
 *             decode does now on AVX-512
 *   tiles     next-group with the rows read 4 keys at a time, a line of each per step, as the
 *             decode tile reads them
 *   strided   decode's products until 2026-12-02: K as tiles, V in two passes of 64 columns
 *             over the keys (pv's column tiles); the share asked a line of each of 4 rows per
 *             step (K) and each row's half of its lines per key (V), strided over the share
 *   kernels   the same reads, the share asked in memory order, a line per line loaded: decode's
 *             products now (src/cpu/kernels/avx512/decode_common.h, fa__asks)
 * With -q, each head has its own query rows (16 KiB for 8 heads, as in decode), not one 2 KiB set.
 *
 * usage: bench_read_order [-q] THREADS MIB ROUNDS ORDER...
 * The orders alternate within each round; reported: the median over rounds of GB/s (min-max).
 * Built on x86-64 twice from this file: bench_read_order with AVX-512F (a zmm FMA per 64 bytes
 * and query row) and bench_read_order_avx2 with AVX2 + FMA (two ymm FMAs: the same arithmetic
 * per byte as the AVX2 kernels' fp32 decode). Each says so and exits 2 on a CPU without its ISA.
 */
#define _POSIX_C_SOURCE 200809L

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* 16 floats: one zmm, or two ymm halves */
#ifdef __AVX512F__
typedef __m512 v16;
#define ISA "avx512f"
static inline v16 v16_zero(void) { return _mm512_setzero_ps(); }
static inline v16 v16_load(const float *p) { return _mm512_load_ps(p); }
static inline v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
static inline v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline float v16_first(v16 a) { return _mm512_cvtss_f32(a); }
#else
typedef struct {
    __m256 lo, hi;
} v16;
#define ISA "avx2"
static inline v16 v16_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16 v16_load(const float *p) {
    return (v16){_mm256_load_ps(p), _mm256_load_ps(p + 8)};
}
static inline v16 v16_add(v16 a, v16 b) {
    return (v16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
static inline v16 v16_fma(v16 a, v16 b, v16 c) {
    return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline float v16_first(v16 a) { return _mm256_cvtss_f32(_mm256_add_ps(a.lo, a.hi)); }
#endif

enum { HK = 8, D = 128, ROW = D * 4, TOKEN = HK * ROW, BLOCK = 128, GROUP = 8 };
enum { SUM, SEQ, GROUPED, NEXT_CALL, NEXT_GROUP, TILES, STRIDED, KERNELS, NORDERS };

static const char *const names[NORDERS] = {"sum",        "seq",   "group",   "next-call",
                                           "next-group", "tiles", "strided", "kernels"};

typedef struct run {
    const char *buf; /* K: tokens [0, ntok), V: [ntok, 2 ntok) */
    size_t ntok;
    int threads, order, own_q;
    pthread_barrier_t *start, *stop;
} run;

typedef struct worker {
    const run *r;
    int index;
    float sink;
} worker;

static float qrows[HK][4][D] __attribute__((aligned(64))); // q: [HK][4 rows, D]

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* acc[i] += q[i] · the 16 floats at p, for the 4 query rows of head h. */
static inline __attribute__((always_inline)) void fma4(const run *r, int h, const float *p, int c,
                                                       v16 acc[4]) {
    const float(*q)[D] = qrows[r->own_q ? h : 0];
    const v16 k = v16_load(p + c);
    for (int i = 0; i < 4; i++) acc[i] = v16_fma(k, v16_load(q[i] + c), acc[i]);
}

static inline void ask(const char *line) { _mm_prefetch(line, _MM_HINT_T0); }

/* Head h's rows of a group as decode's products read them (strided, kernels): K (v = 0) as
 * tiles of 4 keys, V in column passes; head h's share of the next group is its h-th token. */
static void products(const run *r, const char *base, size_t g, int n, int h, int v,
                     const char *next, int *asked, v16 acc[4]) {
    const char *share = next ? next + h * TOKEN : NULL;
    if (!v)
        for (int j = 0; j < n; j += 4) {
            const float *p[4];
            for (int jj = 0; jj < 4; jj++)
                p[jj] = (const float *)(base + (g + (j + jj < n ? j + jj : j)) * TOKEN + h * ROW);
            for (int c = 0; c < D; c += 16) {
                for (int u = 0; share && u < 4; u++) /* row j + u's line c/16, or the next 4 */
                    ask(r->order == STRIDED ? share + (j + u) * ROW + 4 * c
                                            : next + 64 * (*asked)++);
                for (int jj = 0; jj < 4; jj++) fma4(r, h, p[jj], c, acc);
            }
        }
    else
        for (int c0 = 0; c0 < D; c0 += 64)
            for (int j = 0; j < n; j++) {
                for (int u = 0; share && u < 4; u++) /* row j's lines of this pass, or the next 4 */
                    ask(r->order == STRIDED ? share + j * ROW + 4 * c0 + 64 * u
                                            : next + 64 * (*asked)++);
                const float *p = (const float *)(base + (g + j) * TOKEN + h * ROW);
                for (int c = c0; c < c0 + 64; c += 16) fma4(r, h, p, c, acc);
            }
}

/* One group (tokens [g, ge) of the buffer at base; v: of V) head by head; `next` is the next
 * group's first byte, for the orders that ask for rows (NULL: none). */
static void group(const run *r, const char *base, size_t g, size_t ge, int v, const char *next,
                  v16 acc[4]) {
    const int n = (int)(ge - g);
    int asked = 0; /* next-group, tiles, kernels: lines asked for so far, a line per line loaded */
    for (int h = 0; h < HK; h++) {
        if (r->order == STRIDED || r->order == KERNELS) {
            products(r, base, g, n, h, v, next, &asked, acc);
            continue;
        }
        if (r->order == TILES) {
            for (int j = 0; j < n; j += 4) {
                const float *p[4];
                for (int jj = 0; jj < 4; jj++)
                    p[jj] = (const float *)(base + (g + (j + jj < n ? j + jj : j)) * TOKEN +
                                            h * ROW);
                for (int c = 0; c < D; c += 16) {
                    for (int u = 0; next && u < 4; u++) ask(next + 64 * asked++);
                    for (int jj = 0; jj < 4; jj++) fma4(r, h, p[jj], c, acc);
                }
            }
            continue;
        }
        for (int j = 0; j < n; j++) {
            const float *p = (const float *)(base + (g + j) * TOKEN + h * ROW);
            if (r->order == NEXT_CALL) { /* head h + 1's row of this token, else next group's */
                const char *want = h + 1 < HK ? (const char *)p + ROW
                                   : next     ? next + j * TOKEN
                                              : NULL;
                for (int at = 0; want && at < ROW; at += 64) ask(want + at);
            }
            for (int c = 0; c < D; c += 16) {
                if (r->order == NEXT_GROUP && next) ask(next + 64 * asked++);
                fma4(r, h, p, c, acc);
            }
        }
    }
}

static void *work(void *arg) {
    worker *w = arg;
    const run *r = w->r;
    const size_t lo = r->ntok * (size_t)w->index / (size_t)r->threads;
    const size_t hi = r->ntok * (size_t)(w->index + 1) / (size_t)r->threads;
    const char *kbase = r->buf, *vbase = r->buf + r->ntok * TOKEN;
    v16 acc[4] = {v16_zero(), v16_zero(), v16_zero(), v16_zero()};
    pthread_barrier_wait(r->start);
    if (r->order == SUM) {
        for (int half = 0; half < 2; half++)
            for (size_t o = lo * TOKEN; o < hi * TOKEN; o += 64)
                acc[0] = v16_add(acc[0], v16_load((const float *)((half ? vbase : kbase) + o)));
    } else if (r->order == SEQ) {
        for (int half = 0; half < 2; half++)
            for (size_t j = lo; j < hi; j++)
                for (int h = 0; h < HK; h++)
                    for (int c = 0; c < D; c += 16)
                        fma4(r, h, (const float *)((half ? vbase : kbase) + j * TOKEN + h * ROW),
                             c, acc);
    } else {
        for (size_t b = lo; b < hi; b += BLOCK) {
            const size_t be = b + BLOCK < hi ? b + BLOCK : hi;
            for (int half = 0; half < 2; half++) {
                const char *base = half ? vbase : kbase;
                for (size_t g = b; g < be; g += GROUP) {
                    const size_t ge = g + GROUP < be ? g + GROUP : be;
                    const char *next = ge < be ? base + ge * TOKEN          /* same phase */
                                       : !half ? vbase + b * TOKEN          /* V's first */
                                       : be < hi ? kbase + be * TOKEN : NULL; /* next block */
                    group(r, base, g, ge, half, r->order == GROUPED ? NULL : next, acc);
                }
            }
        }
    }
    pthread_barrier_wait(r->stop);
    w->sink = v16_first(v16_add(v16_add(acc[0], acc[1]), v16_add(acc[2], acc[3])));
    return NULL;
}

/* GB/s of one pass of `order` over the buffer on r->threads threads. */
static double pass(run *r, int order) {
    pthread_t tid[64];
    worker w[64];
    pthread_barrier_t b0, b1;
    pthread_barrier_init(&b0, NULL, (unsigned)r->threads);
    pthread_barrier_init(&b1, NULL, (unsigned)r->threads);
    r->order = order;
    r->start = &b0;
    r->stop = &b1;
    for (int t = 0; t < r->threads; t++) w[t] = (worker){r, t, 0.0f};
    for (int t = 1; t < r->threads; t++) pthread_create(&tid[t], NULL, work, &w[t]);
    const double t0 = now();
    work(&w[0]);
    const double dt = now() - t0;
    for (int t = 1; t < r->threads; t++) pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&b0);
    pthread_barrier_destroy(&b1);
    if (w[0].sink == 42.0f) puts(""); /* keeps the sums alive */
    return 2.0 * (double)r->ntok * TOKEN / dt * 1e-9;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int a = 1, own_q = 0;
    if (a < argc && !strcmp(argv[a], "-q")) own_q = 1, a++;
    if (argc - a < 4) {
        fprintf(stderr, "usage: %s [-q] THREADS MIB ROUNDS ORDER...\norders:", argv[0]);
        for (int o = 0; o < NORDERS; o++) fprintf(stderr, " %s", names[o]);
        fprintf(stderr, "\n");
        return 2;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports(ISA) || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, "%s: built for %s + FMA, which this CPU does not have\n", argv[0], ISA);
        return 2;
    }
    const int threads = atoi(argv[a]), rounds = atoi(argv[a + 2]);
    const size_t bytes = (size_t)atol(argv[a + 1]) << 20;
    int orders[16], no = 0;
    for (int i = a + 3; i < argc && no < 16; i++) {
        int o = 0;
        while (o < NORDERS && strcmp(argv[i], names[o])) o++;
        if (o == NORDERS) {
            fprintf(stderr, "bench_read_order: unknown order '%s'\n", argv[i]);
            return 2;
        }
        orders[no++] = o;
    }
    if (threads < 1 || threads > 64 || rounds < 1 || rounds > 101 || bytes < 2 * TOKEN * BLOCK) {
        fprintf(stderr, "bench_read_order: 1-64 threads, 1-101 rounds, at least 1 MiB\n");
        return 2;
    }
    char *buf = aligned_alloc(1 << 21, bytes);
    if (!buf) return 1;
    memset(buf, 1, bytes); /* first touch here: one thread, as a cache written by one */
    for (int h = 0; h < HK; h++)
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < D; c++) qrows[h][i][c] = 0.001f * (float)(i + c + h);
    run r = {buf, bytes / 2 / TOKEN, threads, 0, own_q, NULL, NULL};
    static double gbs[16][101];
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < no; i++) gbs[i][k] = pass(&r, orders[(i + k) % no]);
    printf("%s: %d thread(s), %zu MiB, %s query rows, median of %d rounds (min-max):\n", ISA,
           threads, bytes >> 20, own_q ? "per-head" : "shared", rounds);
    for (int i = 0; i < no; i++) { /* slot i ran order (i + k) % no in round k: regroup */
        double v[101];
        for (int k = 0; k < rounds; k++) v[k] = gbs[((i - k) % no + no) % no][k];
        qsort(v, (size_t)rounds, sizeof *v, cmp);
        printf("  %-10s %6.1f GB/s (%.1f-%.1f)\n", names[orders[i]], v[rounds / 2], v[0],
               v[rounds - 1]);
    }
    free(buf);
    return 0;
}
