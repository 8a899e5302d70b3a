/* SPDX-License-Identifier: MIT */
/*
 * ab_builds.c — one attention call timed through two or more builds of libflashattn.so in one
 * process, alternating, so that a change can be judged on a shared machine whose speed drifts
 * from minute to minute: every round times each build once (the order rotating; a call that
 * took under 0.1 s runs once untimed just before), and each build's time is divided by the first
 * build's time in the same round. It prints per build the median time, the median of those
 * ratios and an FNV-1a hash of the output (out for the forward and decode, dq, dk, dv for the
 * backward), so a change meant to keep results bitwise shows that it does.
 *
 *   cmake --build build --target bench_ab_builds
 *   build/bench_ab_builds [options] OLD.so NEW.so [MORE.so ...]
 *
 * Each build is loaded with dlopen(RTLD_LOCAL) and called through the public API (fa_forward,
 * fa_backward, fa_forward_kvcache with the NULL context: FA_NUM_THREADS threads), on the same
 * random inputs (B = 1, BSHD, contiguous). The backward is timed alone, after a forward of the
 * same build. --pass decode times one query token (--queries N: N of them, as a speculative
 * step checks several) against a cache of S tokens (q (1, N, H, D), cache (1, S, Hk, D), Hk
 * from --kv-heads, H = 32 and Hk = 8 unless given) and prints the
 * cache's GB/s instead of GFLOP/s; with --page-size N the cache is paged, S / N pages of N
 * tokens in a pool (S / N, N, Hk, D) whose block table is a fixed shuffle of the pool.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tools/cli/halfconv.h"
#include "flashattn.h"

enum { MAX_BUILDS = 8, MAX_ROUNDS = 200 };

typedef struct build {
    const char *path;
    void (*params_init)(fa_params *);
    fa_tensor (*tensor)(void *, fa_dtype, int, const int64_t *);
    fa_status (*forward)(fa_context *, const fa_params *, const fa_tensor *, const fa_tensor *,
                         const fa_tensor *, fa_tensor *, fa_tensor *);
    fa_status (*backward)(fa_context *, const fa_params *, const fa_tensor *, const fa_tensor *,
                          const fa_tensor *, const fa_tensor *, const fa_tensor *,
                          const fa_tensor *, const fa_tensor *, const fa_tensor *,
                          const fa_tensor *);
    void (*kvcache_init)(fa_kvcache *);
    fa_status (*forward_kvcache)(fa_context *, const fa_params *, const fa_tensor *,
                                 const fa_kvcache *, const fa_tensor *, const fa_tensor *);
    const char *(*message)(void);
    double seconds[MAX_ROUNDS];
    uint64_t hash;
} build;

enum { PASS_FWD, PASS_BWD, PASS_DECODE };

typedef struct config {
    int pass, causal, rounds;
    long S, D, H, Hk; /* Hk 0: H (fwd, bwd) or 8 (decode) */
    long page;        /* decode: > 0, tokens per page of a paged cache */
    long queries;     /* decode: query tokens (1 unless given) */
    fa_dtype dtype;
} config;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static int load(build *b, const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "bench_ab_builds: cannot load %s: %s\n", path, dlerror());
        return 0;
    }
    b->path = path;
    *(void **)&b->params_init = dlsym(lib, "fa_params_init");
    *(void **)&b->tensor = dlsym(lib, "fa_tensor_contiguous");
    *(void **)&b->forward = dlsym(lib, "fa_forward");
    *(void **)&b->backward = dlsym(lib, "fa_backward");
    *(void **)&b->message = dlsym(lib, "fa_last_error_message");
    *(void **)&b->kvcache_init = dlsym(lib, "fa_kvcache_init");
    *(void **)&b->forward_kvcache = dlsym(lib, "fa_forward_kvcache");
    if (!b->params_init || !b->tensor || !b->forward || !b->backward || !b->message ||
        !b->kvcache_init || !b->forward_kvcache) {
        fprintf(stderr, "bench_ab_builds: %s lacks the fa_ entry points it needs\n", path);
        return 0;
    }
    return 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_ab_builds [--pass fwd|bwd|decode] [--dtype f32|f16|bf16]\n"
            "                       [--seqlen S] [--dim D] [--heads H] [--kv-heads HK]\n"
            "                       [--causal 0|1] [--rounds N] [--page-size N] [--queries N]\n"
            "                       OLD.so NEW.so [MORE.so ...]\n"
            "defaults: fwd, f32, S = 4096, D = 128, H = 16 (decode: 32), HK = H (decode: 8),\n"
            "non-causal, 10 rounds, a contiguous cache; at most %d builds and %d rounds;\n"
            "--page-size (decode only) must divide S; --queries (decode only, 1-1024, default 1)\n",
            MAX_BUILDS, MAX_ROUNDS);
}

/* Parses the options; returns the index of the first library argument, 0 on bad input. */
static int parse(int argc, char **argv, config *c) {
    *c = (config){.rounds = 10, .S = 4096, .D = 128, .dtype = FA_DTYPE_F32};
    int i = 1;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];
        char *end;
        const long n = strtol(v, &end, 10);
        const int num = *v != '\0' && *end == '\0';
        if (strcmp(o, "--pass") == 0 && strcmp(v, "fwd") == 0)
            c->pass = PASS_FWD;
        else if (strcmp(o, "--pass") == 0 && strcmp(v, "bwd") == 0)
            c->pass = PASS_BWD;
        else if (strcmp(o, "--pass") == 0 && strcmp(v, "decode") == 0)
            c->pass = PASS_DECODE;
        else if (strcmp(o, "--dtype") == 0 && strcmp(v, "f32") == 0)
            c->dtype = FA_DTYPE_F32;
        else if (strcmp(o, "--dtype") == 0 && strcmp(v, "f16") == 0)
            c->dtype = FA_DTYPE_F16;
        else if (strcmp(o, "--dtype") == 0 && strcmp(v, "bf16") == 0)
            c->dtype = FA_DTYPE_BF16;
        else if (strcmp(o, "--seqlen") == 0 && num && n >= 1 && n <= 1 << 20)
            c->S = n;
        else if (strcmp(o, "--dim") == 0 && num && n >= 1 && n <= 256)
            c->D = n;
        else if (strcmp(o, "--heads") == 0 && num && n >= 1 && n <= 1024)
            c->H = n;
        else if (strcmp(o, "--kv-heads") == 0 && num && n >= 1 && n <= 1024)
            c->Hk = n;
        else if (strcmp(o, "--causal") == 0 && num && (n == 0 || n == 1))
            c->causal = (int)n;
        else if (strcmp(o, "--rounds") == 0 && num && n >= 1 && n <= MAX_ROUNDS)
            c->rounds = (int)n;
        else if (strcmp(o, "--page-size") == 0 && num && n >= 1 && n <= 1 << 20)
            c->page = n;
        else if (strcmp(o, "--queries") == 0 && num && n >= 1 && n <= 1024)
            c->queries = n;
        else {
            fprintf(stderr, "bench_ab_builds: bad option or value: %s %s\n", o, v);
            return 0;
        }
    }
    if (!c->H)
        c->H = c->pass == PASS_DECODE ? 32 : 16;
    if (!c->Hk)
        c->Hk = c->pass == PASS_DECODE && c->H % 8 == 0 ? 8 : c->H;
    if (c->H % c->Hk != 0) {
        fprintf(stderr, "bench_ab_builds: --kv-heads %ld does not divide --heads %ld\n", c->Hk,
                c->H);
        return 0;
    }
    if (c->page && (c->pass != PASS_DECODE || c->S % c->page != 0)) {
        fprintf(stderr, "bench_ab_builds: --page-size is for --pass decode and must divide "
                        "--seqlen\n");
        return 0;
    }
    if (c->queries && c->pass != PASS_DECODE) {
        fprintf(stderr, "bench_ab_builds: --queries is for --pass decode\n");
        return 0;
    }
    if (!c->queries)
        c->queries = 1;
    const int nlib = argc - i;
    if (nlib < 2 || nlib > MAX_BUILDS) {
        fprintf(stderr, "bench_ab_builds: give 2 to %d library paths after the options\n",
                MAX_BUILDS);
        return 0;
    }
    return i;
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    config c;
    const int first = parse(argc, argv, &c);
    if (!first) {
        usage(stderr);
        return 2;
    }
    const int nb = argc - first;
    static build builds[MAX_BUILDS];
    for (int i = 0; i < nb; i++)
        if (!load(&builds[i], argv[first + i]))
            return 1;

    /* decode: q, out, dout (1, Q, H, D), K and V (1, S, Hk, D); else q (1, S, H, D), K and V
     * (1, S, Hk, D) */
    const int dec = c.pass == PASS_DECODE, bwd = c.pass == PASS_BWD;
    const long sq = dec ? c.queries : c.S;
    const size_t es = c.dtype == FA_DTYPE_F32 ? 4 : 2, nq = (size_t)(sq * c.H * c.D);
    const size_t nk = (size_t)(c.S * c.Hk * c.D);
    enum { Q, K, V, OUT, DOUT, DQ, DK, DV, NBUF };
    const size_t count[NBUF] = {nq, nk, nk, nq, nq, nq, nk, nk};
    void *buf[NBUF];
    float *lse = malloc(sizeof(float) * (size_t)(c.H * sq));
    for (int t = 0; t < NBUF; t++)
        buf[t] = malloc(count[t] * es);
    for (int t = 0; t < NBUF; t++)
        if (!buf[t] || !lse) {
            fprintf(stderr, "bench_ab_builds: out of memory for %zu elements a tensor\n", count[t]);
            return 1;
        }
    srand(1);
    for (int t = Q; t <= DOUT; t++) /* uniform in [-1/2, 1/2], rounded to the dtype */
        for (size_t e = 0; e < count[t]; e++) {
            const float x = (float)rand() / (float)RAND_MAX - 0.5f;
            if (c.dtype == FA_DTYPE_F32)
                ((float *)buf[t])[e] = x;
            else if (c.dtype == FA_DTYPE_F16)
                ((uint16_t *)buf[t])[e] = fa_tool_f32_to_f16(x);
            else
                ((uint16_t *)buf[t])[e] = fa_tool_f32_to_bf16(x);
        }

    /* paged: pool page i holds tokens [N·pg[i], N·pg[i] + N) of the sequence, pg a shuffle */
    const long pages = c.page ? c.S / c.page : 1;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)pages);
    if (!table) {
        fprintf(stderr, "bench_ab_builds: out of memory for the block table\n");
        return 1;
    }
    for (long i = 0; i < pages; i++)
        table[i] = (int32_t)i;
    for (long i = pages; i > 1; i--) {
        const long k = rand() % i;
        const int32_t x = table[i - 1];
        table[i - 1] = table[k];
        table[k] = x;
    }
    const int64_t qshape[4] = {1, sq, c.H, c.D};
    const int64_t kshape[4] = {c.page ? pages : 1, c.page ? c.page : c.S, c.Hk, c.D};
    const int64_t tshape[2] = {1, pages};
    const int64_t lse_shape[3] = {1, c.H, sq};
    for (int r = 0; r < c.rounds; r++)
        for (int k = 0; k < nb; k++) {
            build *b = &builds[(k + r) % nb]; /* the order rotates every round */
            fa_tensor t[NBUF];
            for (int u = 0; u < NBUF; u++)
                t[u] = b->tensor(buf[u], c.dtype, 4,
                                 u == K || u == V || u == DK || u == DV ? kshape : qshape);
            fa_tensor l = b->tensor(lse, FA_DTYPE_F32, 3, lse_shape);
            fa_params p;
            b->params_init(&p);
            p.causal = c.causal;
            fa_kvcache kv;
            b->kvcache_init(&kv);
            kv.k_cache = t[K];
            kv.v_cache = t[V];
            if (c.page) {
                kv.block_table = b->tensor(table, FA_DTYPE_I32, 2, tshape);
                kv.cache_seqlen = c.S;
            }
            /* Short calls run once untimed first, so that no build pays for waking the thread
             * pool (or for the caches the hash below went through) more often than another. */
            fa_status st = FA_OK;
            for (int warm = r == 0 || b->seconds[r - 1] < 0.1; warm >= 0 && st == FA_OK; warm--) {
                b->seconds[r] = now();
                st = dec ? b->forward_kvcache(NULL, &p, &t[Q], &kv, &t[OUT], &l)
                         : b->forward(NULL, &p, &t[Q], &t[K], &t[V], &t[OUT], &l);
            }
            double t0 = b->seconds[r];
            if (st == FA_OK && bwd) {
                t0 = now();
                st = b->backward(NULL, &p, &t[Q], &t[K], &t[V], &t[OUT], &t[DOUT], &l, &t[DQ],
                                 &t[DK], &t[DV]);
            }
            b->seconds[r] = now() - t0;
            if (st != FA_OK) {
                fprintf(stderr, "bench_ab_builds: %s: status %d: %s\n", b->path, (int)st,
                        b->message());
                return 1;
            }
            uint64_t h = 1469598103934665603ull;
            for (int u = bwd ? DQ : OUT; u <= (bwd ? DV : OUT); u++)
                h = fnv1a(h, buf[u], count[u] * es);
            b->hash = h;
        }

    /* fwd, bwd: GFLOP/s (the backward 2.5 forwards); decode: GB/s of the cache read */
    const double work = dec ? 2.0 * (double)nk * (double)es
                            : 4.0 * (double)c.H * (double)c.S * (double)c.S * (double)c.D *
                                  (c.causal ? 0.5 : 1.0) * (bwd ? 2.5 : 1.0);
    static const char *pass_name[3] = {"forward", "backward", "decode"};
    char queries[32] = "";
    if (dec && c.queries > 1)
        snprintf(queries, sizeof queries, " Sq=%ld", c.queries);
    printf("%s %s%s S=%ld D=%ld H=%ld Hk=%ld %s, %d rounds; ratio: median over rounds of time / "
           "the first build's time in that round\n",
           pass_name[c.pass],
           c.dtype == FA_DTYPE_F32   ? "f32"
           : c.dtype == FA_DTYPE_F16 ? "f16"
                                     : "bf16",
           queries, c.S, c.D, c.H, c.Hk, c.causal ? "causal" : "non-causal", c.rounds);
    if (c.page)
        printf("paged: %ld pages of %ld tokens, their order shuffled\n", pages, c.page);
    for (int k = 0; k < nb; k++) {
        double ratio[MAX_ROUNDS], t[MAX_ROUNDS];
        for (int r = 0; r < c.rounds; r++) {
            ratio[r] = builds[k].seconds[r] / builds[0].seconds[r];
            t[r] = builds[k].seconds[r];
        }
        const double m = median(t, c.rounds);
        printf("  %9.3f ms  %7.1f %s  ratio %.3f  hash %016llx  %s\n", 1e3 * m, 1e-9 * work / m,
               dec ? "GB/s" : "GFLOP/s", median(ratio, c.rounds),
               (unsigned long long)builds[k].hash, builds[k].path);
    }
    for (int t = 0; t < NBUF; t++)
        free(buf[t]);
    free(lse);
    free(table);
    return 0;
}
