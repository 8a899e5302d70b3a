/* SPDX-License-Identifier: MIT */
/*
 * read_order.c — `build/bench_read_order` (and `_avx2`): how fast a BSHD KV cache reads in the
 * orders a decode step can read it, with and without decode's arithmetic and prefetch requests.
 * It is the experiment behind decode's prefetch plan (src/cpu/fwd.c: decode_block, decode_ask).
 *
 * The buffer is a cache of 8 KV heads of 128 fp32 (a token: 4 KiB; with -h, fp16: 2 KiB), its
 * first half K and its second V; each thread takes its own contiguous share of tokens. Orders
 * (the argument names):
 *   sum       a sum of the whole share front to back: what bench-decode's probe does
 *   sum-ask   the same sum asking, a line per line loaded, for the line a group ahead (-g, -p,
 *             -d): what the asks cost a read the hardware's prefetch already follows
 *   seq       token by token, each token's heads in turn, 4 FMAs per 16 elements against 4 query
 *             rows held in L1 (a 4-row decode tile's arithmetic)
 *   group     decode's order: blocks of 128 tokens, K then V, in groups of 8 tokens (-g), head
 *             by head inside a group (each head's rows), the same arithmetic; no prefetch
 *   next-call the same, each head's rows asking for the next call's rows, as decode did before:
 *             the next head's rows of the group, then the next group's
 *   next-group the same, each call asking for its share of the next group's rows in memory
 *             order (key by key, each key's heads in turn), a line per line it loads
 *   tiles     next-group with the rows read 4 keys at a time, a chunk of each in turn, as the
 *             decode tile reads them
 *   strided   decode's products until 2026-12-02: K as tiles, V in passes of 64 columns over the
 *             keys (pv's column tiles); the share asked a line of each of 4 rows per step (K) and
 *             each row's lines of the pass per key (V), strided over the share
 *   kernels   the same reads, the share asked in memory order, a line per line loaded: decode's
 *             products now (src/cpu/kernels/avx512/decode_common.h, fa__asks)
 *   pairs     kernels with V read in whole rows, twice: half the query rows over the group's
 *             keys, then the other half (the first pass asks, a line per line loaded)
 *   kseq      each block's K as seq reads it (token by token, no asks), V as kernels
 *   kh2t2     K in tiles of 2 heads x 2 tokens, a chunk of each of the 4 rows in turn (no asks),
 *             V as kernels
 *   kh4       K token by token in tiles of 4 heads, a chunk of each head in turn (no asks), V as
 *             kernels
 *   vtiles    kernels with V's column passes reading 4 keys at a time, a chunk of each in turn
 *   vtiles2   the same, 2 keys at a time
 * Options: -q: each head has its own query rows (16 KiB for 8 heads, as in decode), not one 2 KiB
 * set; -h: fp16 rows, widened in registers (vcvtph2ps); -g N: tokens per group (decode: 8 of
 * fp32, 16 of fp16); -p HINT: the asks' prefetch hint (0: prefetcht0, 1: t1, 2: t2, 3: nta, 4:
 * a one-byte load instead); -d N: ask for the group N groups ahead; -t: the buffer on
 * transparent huge pages (madvise).
 *
 * usage: bench_read_order [-q] [-h] [-g N] [-p HINT] [-d N] [-t] THREADS MIB ROUNDS ORDER...
 * The orders alternate within each round; reported: the median over rounds of GB/s (min-max).
 * Built on x86-64 three times from this file: bench_read_order with AVX-512F (a zmm FMA per 16
 * elements and query row), bench_read_order_light the same with one query row (a quarter of the
 * arithmetic: one FMA chain, 64 bytes of fp32 or 32 of fp16 per 4 cycles, so the reads are what
 * is measured; pairs then does one row a pass) and bench_read_order_avx2 with AVX2 + FMA + F16C
 * (two ymm FMAs: the same arithmetic per element as the AVX2 kernels' decode). Each says so and
 * exits 2 on a CPU without its ISA.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE (-t) */

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
static inline v16 v16_widen(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p));
}
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
static inline v16 v16_widen(const uint16_t *p) {
    return (v16){_mm256_cvtph_ps(_mm_load_si128((const __m128i *)p)),
                 _mm256_cvtph_ps(_mm_load_si128((const __m128i *)p + 1))};
}
#endif

enum { HK = 8, D = 128, BLOCK = 128 };
#ifndef NQ
#define NQ 4 /* query rows of arithmetic per head: a 4-row decode tile's (light build: 1) */
#endif

/* Bytes of an element (4: fp32 rows, 2 with -h: fp16 rows, widened to fp32 in registers), of a
 * head's row and of a token; tokens per group (-g). */
static int es = 4, row_b = D * 4, token_b = HK * D * 4, group_n = 8;

/* From STRIDED on, every order reads its groups through products() (the V phase alone where
 * k_phase reads K its own way). */
enum { SUM, SUM_ASK, SEQ, GROUPED, NEXT_CALL, NEXT_GROUP, TILES, STRIDED, KERNELS, PAIRS, KSEQ,
       KH2T2, KH4, VTILES, VTILES2, NORDERS };

static const char *const names[NORDERS] = {
    "sum",     "sum-ask", "seq",  "group", "next-call", "next-group", "tiles",  "strided",
    "kernels", "pairs",   "kseq", "kh2t2", "kh4",       "vtiles",     "vtiles2"};

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

/* acc[i] += q[i] · elements c..c+15 of the row at p, for query rows i0 .. i0 + n - 1 of head h
 * (n, i0: constants at each call). */
static inline __attribute__((always_inline)) void fma_rows(const run *r, int h, const char *p,
                                                           int c, int i0, int n, v16 acc[4]) {
    const float(*q)[D] = qrows[r->own_q ? h : 0];
    const v16 k = es == 4 ? v16_load((const float *)p + c) : v16_widen((const uint16_t *)p + c);
    for (int i = i0; i < i0 + n; i++) acc[i] = v16_fma(k, v16_load(q[i] + c), acc[i]);
}

/* fma_rows over the NQ query rows of head h. */
static inline __attribute__((always_inline)) void fma4(const run *r, int h, const char *p, int c,
                                                       v16 acc[4]) {
    fma_rows(r, h, p, c, 0, NQ, acc);
}

static int hint = 0; /* -p: the asks' hint, 0: prefetcht0, 1: t1, 2: t2, 3: nta, 4: a load */
static _Thread_local unsigned touched; /* -p 4: the loaded bytes' sum, kept alive */
static int ahead = 1;                  /* -d: the asks are for the group this many groups ahead */
static size_t ask_skip;                /* the bytes from the next group to that one (main sets it) */

static inline void ask(const char *line) {
    line += ask_skip; /* past the buffer: harmless, a prefetch does not fault (-p 4: no skip) */
    switch (hint) {
    case 1:
        _mm_prefetch(line, _MM_HINT_T1);
        break;
    case 2:
        _mm_prefetch(line, _MM_HINT_T2);
        break;
    case 3:
        _mm_prefetch(line, _MM_HINT_NTA);
        break;
    case 4:
        touched += *(const volatile unsigned char *)line;
        break;
    default:
        _mm_prefetch(line, _MM_HINT_T0);
    }
}

/* Asks for lines of `next` until as many have been asked for as `loaded` bytes hold (a line per
 * line loaded, at either row size). */
static inline void ask_upto(const char *next, int *asked, int loaded) {
    for (; next && 64 * *asked < loaded; ++*asked) ask(next + 64 * *asked);
}

/* Head h's rows of a group as decode's products read them (strided, kernels): K (v = 0) as
 * tiles of 4 keys, V in column passes of 64; head h's share of the next group is its h-th token
 * (at -g 8 and 8 heads, a call's share of a group is a token's worth of rows). */
static void products(const run *r, const char *base, size_t g, int n, int h, int v,
                     const char *next, int *asked, int *loaded, v16 acc[4]) {
    const char *share = next ? next + (size_t)h * (size_t)n * (size_t)row_b : NULL;
    const int strided = r->order == STRIDED;
    if (!v)
        for (int j = 0; j < n; j += 4) {
            const char *p[4];
            for (int jj = 0; jj < 4; jj++)
                p[jj] = base + (g + (j + jj < n ? j + jj : j)) * token_b + h * row_b;
            for (int c = 0; c < D; c += 16) {
                *loaded += 4 * 16 * es;
                if (strided) /* a line of each of the 4 rows, where a line starts */
                    for (int u = 0; share && u < 4 && (c * es) % 64 == 0; u++)
                        ask(share + (j + u) * row_b + es * c);
                else
                    ask_upto(next, asked, *loaded);
                for (int jj = 0; jj < 4; jj++) fma4(r, h, p[jj], c, acc);
            }
        }
    else if (r->order == PAIRS) /* (NQ + 1) / 2 rows a pass */
        for (int i0 = 0; i0 < 2 * ((NQ + 1) / 2); i0 += (NQ + 1) / 2)
            for (int j = 0; j < n; j++) {
                if (!i0) {
                    *loaded += D * es;
                    ask_upto(next, asked, *loaded);
                }
                const char *p = base + (g + j) * token_b + h * row_b;
                for (int c = 0; c < D; c += 16) fma_rows(r, h, p, c, i0, (NQ + 1) / 2, acc);
            }
    else if (r->order == VTILES || r->order == VTILES2) {
        const int kt = r->order == VTILES ? 4 : 2; /* keys at a time */
        for (int c0 = 0; c0 < D; c0 += 64)
            for (int j = 0; j < n; j += kt) {
                const char *p[4];
                for (int jj = 0; jj < kt; jj++)
                    p[jj] = base + (g + (j + jj < n ? j + jj : j)) * token_b + h * row_b;
                for (int c = c0; c < c0 + 64; c += 16) {
                    *loaded += kt * 16 * es;
                    ask_upto(next, asked, *loaded);
                    for (int jj = 0; jj < kt; jj++) fma4(r, h, p[jj], c, acc);
                }
            }
    } else
        for (int c0 = 0; c0 < D; c0 += 64)
            for (int j = 0; j < n; j++) {
                *loaded += 64 * es;
                if (strided) /* row j's lines of this pass */
                    for (int u = 0; share && u < es; u++) ask(share + j * row_b + es * c0 + 64 * u);
                else
                    ask_upto(next, asked, *loaded);
                const char *p = base + (g + j) * token_b + h * row_b;
                for (int c = c0; c < c0 + 64; c += 16) fma4(r, h, p, c, acc);
            }
}

/* One group (tokens [g, ge) of the buffer at base; v: of V) head by head; `next` is the next
 * group's first byte, for the orders that ask for rows (NULL: none). */
static void group(const run *r, const char *base, size_t g, size_t ge, int v, const char *next,
                  v16 acc[4]) {
    const int n = (int)(ge - g);
    int asked = 0, loaded = 0; /* lines asked for, bytes loaded so far: a line per line loaded */
    for (int h = 0; h < HK; h++) {
        if (r->order >= STRIDED) {
            products(r, base, g, n, h, v, next, &asked, &loaded, acc);
            continue;
        }
        if (r->order == TILES) {
            for (int j = 0; j < n; j += 4) {
                const char *p[4];
                for (int jj = 0; jj < 4; jj++)
                    p[jj] = base + (g + (j + jj < n ? j + jj : j)) * token_b + h * row_b;
                for (int c = 0; c < D; c += 16) {
                    loaded += 4 * 16 * es;
                    ask_upto(next, &asked, loaded);
                    for (int jj = 0; jj < 4; jj++) fma4(r, h, p[jj], c, acc);
                }
            }
            continue;
        }
        for (int j = 0; j < n; j++) {
            const char *p = base + (g + j) * token_b + h * row_b;
            if (r->order == NEXT_CALL) { /* head h + 1's row of this token, else next group's */
                const char *want = h + 1 < HK ? p + row_b : next ? next + j * token_b : NULL;
                for (int at = 0; want && at < row_b; at += 64) ask(want + at);
            }
            for (int c = 0; c < D; c += 16) {
                loaded += 16 * es;
                if (r->order == NEXT_GROUP)
                    ask_upto(next, &asked, loaded);
                fma4(r, h, p, c, acc);
            }
        }
    }
}

/* Tokens [j0, j1) of the buffer at base front to back: each token's heads in turn, each row
 * whole (seq's order). */
static void seq_rows(const run *r, const char *base, size_t j0, size_t j1, v16 acc[4]) {
    for (size_t j = j0; j < j1; j++)
        for (int h = 0; h < HK; h++)
            for (int c = 0; c < D; c += 16) fma4(r, h, base + j * token_b + h * row_b, c, acc);
}

/* The K phase of block [b, be) for the orders that read K in an order of their own (kseq, kh2t2,
 * kh4; no asks); returns 0 for the others, whose K goes through group(). */
static int k_phase(const run *r, const char *base, size_t b, size_t be, v16 acc[4]) {
    if (r->order == KSEQ) {
        seq_rows(r, base, b, be, acc);
    } else if (r->order == KH4) {
        for (size_t j = b; j < be; j++)
            for (int h = 0; h < HK; h += 4)
                for (int c = 0; c < D; c += 16)
                    for (int hh = h; hh < h + 4; hh++)
                        fma4(r, hh, base + j * token_b + hh * row_b, c, acc);
    } else if (r->order == KH2T2) { /* tiles of 2 heads x 2 tokens; an odd last token as seq */
        size_t j = b;
        for (; j + 1 < be; j += 2)
            for (int h = 0; h < HK; h += 2)
                for (int c = 0; c < D; c += 16)
                    for (int t = 0; t < 4; t++) /* t: token j + t / 2, head h + t % 2 */
                        fma4(r, h + (t & 1), base + (j + (size_t)(t >> 1)) * token_b +
                                                 (h + (t & 1)) * row_b,
                             c, acc);
        seq_rows(r, base, j, be, acc);
    } else {
        return 0;
    }
    return 1;
}

static void *work(void *arg) {
    worker *w = arg;
    const run *r = w->r;
    const size_t lo = r->ntok * (size_t)w->index / (size_t)r->threads;
    const size_t hi = r->ntok * (size_t)(w->index + 1) / (size_t)r->threads;
    const char *kbase = r->buf, *vbase = r->buf + r->ntok * token_b;
    v16 acc[4] = {v16_zero(), v16_zero(), v16_zero(), v16_zero()};
    pthread_barrier_wait(r->start);
    if (r->order == SUM || r->order == SUM_ASK) {
        const size_t ahead_b = (size_t)group_n * (size_t)token_b; /* ask adds ask_skip (-d) */
        for (int half = 0; half < 2; half++)
            for (size_t o = lo * token_b; o < hi * token_b; o += 64) {
                const char *line = (half ? vbase : kbase) + o;
                if (r->order == SUM_ASK && o + ahead_b < hi * token_b)
                    ask(line + ahead_b);
                acc[0] = v16_add(acc[0], v16_load((const float *)line));
            }
    } else if (r->order == SEQ) {
        seq_rows(r, kbase, lo, hi, acc);
        seq_rows(r, vbase, lo, hi, acc);
    } else {
        for (size_t b = lo; b < hi; b += BLOCK) {
            const size_t be = b + BLOCK < hi ? b + BLOCK : hi;
            for (int half = 0; half < 2; half++) {
                const char *base = half ? vbase : kbase;
                if (!half && k_phase(r, base, b, be, acc)) continue;
                for (size_t g = b; g < be; g += (size_t)group_n) {
                    const size_t ge = g + (size_t)group_n < be ? g + (size_t)group_n : be;
                    const char *next = ge < be   ? base + ge * token_b /* same phase */
                                       : !half   ? vbase + b * token_b /* V's first */
                                       : be < hi ? kbase + be * token_b
                                                 : NULL; /* next block */
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
    return 2.0 * (double)r->ntok * token_b / dt * 1e-9;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int a = 1, own_q = 0, huge = 0;
    for (; a < argc && argv[a][0] == '-'; a++)
        if (!strcmp(argv[a], "-q"))
            own_q = 1;
        else if (!strcmp(argv[a], "-h"))
            es = 2;
        else if (!strcmp(argv[a], "-t"))
            huge = 1;
        else if (!strcmp(argv[a], "-p") && a + 1 < argc)
            hint = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-d") && a + 1 < argc)
            ahead = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-g") && a + 1 < argc)
            group_n = atoi(argv[++a]);
        else
            break;
    row_b = D * es, token_b = HK * row_b;
    ask_skip = (size_t)(ahead > 1 ? ahead - 1 : 0) * (size_t)group_n * (size_t)token_b;
    if (argc - a < 4 || group_n < 4 || group_n > BLOCK || group_n % 4 || hint < 0 || hint > 4 ||
        ahead < 1 || ahead > 8 || (hint == 4 && ahead > 1)) { /* a load past the buffer faults */
        fprintf(stderr,
                "usage: %s [-q] [-h] [-g N] [-p HINT] [-d N] [-t] THREADS MIB ROUNDS ORDER...\n"
                "-q: per-head query rows; -h: fp16 rows; -g: tokens per group, 4-128 in 4s "
                "(default 8);\n-p: the asks' hint, 0-4: prefetcht0, t1, t2, nta, a load "
                "(default 0); -d: ask N groups ahead, 1-8\n(default 1; 1 with -p 4); -t: transparent "
                "huge pages\norders:",
                argv[0]);
        for (int o = 0; o < NORDERS; o++) fprintf(stderr, " %s", names[o]);
        fprintf(stderr, "\n");
        return 2;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports(ISA) || !__builtin_cpu_supports("fma") ||
        (!strcmp(ISA, "avx2") && !__builtin_cpu_supports("f16c"))) {
        fprintf(stderr, "%s: built for %s + FMA%s, which this CPU does not have\n", argv[0], ISA,
                strcmp(ISA, "avx2") ? "" : " + F16C");
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
    if (threads < 1 || threads > 64 || rounds < 1 || rounds > 101 ||
        bytes < (size_t)2 * token_b * BLOCK) {
        fprintf(stderr, "bench_read_order: 1-64 threads, 1-101 rounds, at least 1 MiB\n");
        return 2;
    }
    char *buf = aligned_alloc(1 << 21, bytes);
    if (!buf) return 1;
#ifdef MADV_HUGEPAGE
    if (huge && madvise(buf, bytes, MADV_HUGEPAGE))
        perror("bench_read_order: madvise");
#endif
    memset(buf, 1, bytes); /* first touch here: one thread, as a cache written by one */
    for (int h = 0; h < HK; h++)
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < D; c++) qrows[h][i][c] = 0.001f * (float)(i + c + h);
    run r = {buf, bytes / 2 / token_b, threads, 0, own_q, NULL, NULL};
    static double gbs[16][101];
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < no; i++) gbs[i][k] = pass(&r, orders[(i + k) % no]);
    static const char *const hints[] = {"prefetcht0", "prefetcht1", "prefetcht2", "prefetchnta",
                                        "a load"};
    printf("%s: %d thread(s), %zu MiB%s, %s rows, groups of %d tokens, asks by %s %d group(s) "
           "ahead,\n%d %s query row(s) of arithmetic, median of %d rounds (min-max):\n",
           ISA, threads, bytes >> 20, huge ? " (huge pages)" : "", es == 4 ? "fp32" : "fp16",
           group_n, hints[hint], ahead, NQ, own_q ? "per-head" : "shared", rounds);
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
