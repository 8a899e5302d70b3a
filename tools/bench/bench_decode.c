/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * bench_decode.c — `flashattn bench-decode`: the decode step of inference, one query token per
 * sequence against a KV cache (fa_forward_kvcache), over batch sizes and cache lengths.
 *
 * A decode step reads the whole K and V cache once and does little arithmetic per byte, so its
 * speed limit is memory bandwidth. Each row reports the median time of --runs calls, the cache
 * bytes read per second (2·B·L·Hk·D·esize: K and V, nothing else counted) and that rate as a
 * share of the read bandwidth of the very same K and V buffers, measured by a STREAM-like
 * probe: sums over each buffer on the same number of threads, each thread reading its own
 * contiguous slice (the slice it first-touched). Three readers take turns, a plain sum and two
 * that ask (prefetch) ahead as decode does, and a round's probe is the fastest of them: on an
 * Intel Xeon VM the asking sums read 1.5 times as fast as the plain one, which decode had
 * outrun by 25%. Probe rounds and calls alternate, one round over K and V before each call, and
 * the share is the median over calls of each call's rate over its own round's probe: measured
 * minutes apart, the two saw different machines. A probe over
 * one separate large buffer, run before and after the grid, is printed for reference only: on
 * this project's VMs it flipped between about 34 and 60 GB/s from run to run while the decode's
 * own rate did not move, so a separate buffer says little about the memory the caches got.
 *
 * Shape: H = 32 query heads, Hk = 8 KV heads, D = 128, Sq = 1 (--queries N: N query tokens, as a
 * speculative step checks several), the whole cache attended
 * (cache_seqlen = -1, no append), contiguous BSHD caches (--layout bhsd: the same logical view
 * of head-major memory, through strides; --page-size N: paged caches, a pool of pages of N
 * tokens and a block table that scatters each sequence's pages over it). Configurations whose
 * caches do not fit in MemAvailable (with a margin) are skipped and listed. Each row also checks
 * batch 0's first and last heads (of its first and last query tokens) against an fp64
 * computation over the cache, so a broken kernel cannot report a good time. After the grid,
 * per dtype: the rows of 16k tokens or more at 80% of their probe (the decode issue's target),
 * beside decode's fastest row whose cache fits in the last-level cache, its rate with the bytes
 * coming from cache: where 80% of a row's probe is above that, the target asks decode to read
 * memory faster than it read the cache on the same cores.
 *
 * 8-bit caches (--dtypes i8, e4m3, e5m2; kv8.h): bf16 q and out, the bf16 row's values quantized
 * by the library's append with a scale per token and KV head, stored after each cache's data in
 * its buffer, so the bytes counted and probed are K and V and their scales. Each row's tokens/s
 * is set against the bf16 row of the same B and L, and after the grid, per 8-bit dtype, the rows
 * of 16k tokens or more at 1.7 times bf16's tokens/s (the quantized-cache issue's target).
 * --accuracy prints the formats' error table instead of the grid (decode_accuracy.c).
 */
#define _POSIX_C_SOURCE 200809L
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE), Linux only and optional */
#endif

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "../cli/cli.h"
#include "flashattn.h"
#include "kv8.h"

enum { BD_H = 32, BD_HK = 8, BD_D = 128, BD_MAX_LIST = 32, BD_MAX_DTYPES = 8 };

#define BD_ALIGN ((size_t)2 << 20) /* 2 MiB: huge-page aligned */

typedef struct bd_options {
    long lens[BD_MAX_LIST], batches[BD_MAX_LIST];
    int nlens, nbatches;
    fa_dtype dtypes[BD_MAX_DTYPES];
    int ndtypes;
    long runs, threads, probe_mib, probe_passes;
    int bhsd;             /* caches laid out (B, Hk, L, D) in memory: each head's keys contiguous */
    long page;            /* > 0: paged caches of pages of this many tokens (--page-size) */
    int page_inorder;     /* pages handed out in order, not shuffled (--page-order in-order) */
    int page_order;       /* --page-order given */
    long queries;         /* query tokens per sequence (--queries; default 1) */
    int accuracy;         /* --accuracy: the accuracy table instead of the timing grid */
    int lens_given;       /* --lens given (--accuracy has its own default) */
    const char *grid_opt; /* the first option given that only the timing grid takes */
} bd_options;

/* ---- small helpers ----------------------------------------------------------------------------
 */

static int bd_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bd_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bd_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int bd_parse_list(const char *s, long lo, long hi, long *out, int max) {
    int n = 0;
    char buf[512];
    if (!s || strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == max || cli_parse_long(tok, lo, hi, &out[n]) != 0)
            return -1;
        n++;
    }
    return n > 0 ? n : -1;
}

/* A "key: value kB" line of a /proc file, in KiB; -1 when absent. */
static long bd_proc_kib(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    long v = -1;
    const size_t n = strlen(key);
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static double bd_avail_gib(void) {
    long kib = bd_proc_kib("/proc/meminfo", "MemAvailable");
    if (kib >= 0)
        return (double)kib / (1024.0 * 1024.0);
#ifdef _SC_AVPHYS_PAGES
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0)
        return (double)pages * (double)psz / (1024.0 * 1024.0 * 1024.0);
#endif
    return -1.0;
}

static void bd_first_line(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (!f)
        return;
    if (fgets(buf, (int)n, f))
        buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
}

static void bd_cpu_model(char *buf, size_t n) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(buf, n, "unknown CPU");
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t')
                    c++;
                c[strcspn(c, "\n")] = '\0';
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    fclose(f);
}

/* The last-level cache size in bytes as the OS reports it (0 = unknown). */
static double bd_llc_bytes(void) {
    double best = 0.0;
    for (int i = 0; i < 8; i++) {
        char path[96], txt[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        bd_first_line(path, txt, sizeof txt);
        if (!txt[0])
            continue;
        char *end = NULL;
        double v = strtod(txt, &end);
        if (end && (*end == 'K' || *end == 'k'))
            v *= 1024.0;
        else if (end && (*end == 'M' || *end == 'm'))
            v *= 1024.0 * 1024.0;
        if (v > best)
            best = v;
    }
    return best;
}

/* 2 MiB-aligned memory, huge pages requested where the OS has them. Not touched here. */
static void *bd_alloc(size_t bytes) {
    const size_t n = (bytes + BD_ALIGN - 1) / BD_ALIGN * BD_ALIGN;
    void *p = aligned_alloc(BD_ALIGN, n ? n : BD_ALIGN);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p)
        (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

/* ---- threads: first touch, fill and the read probe --------------------------------------------
 */

/* The probe's readers, each a sum over the buffer: plain, or asking (prefetching) BD_ASK_AHEAD
 * bytes ahead into every level or to L2. Each round runs all three and takes the fastest: which
 * one reads memory fastest depends on the machine (asking: 1.5 times the plain sum's rate on an
 * Intel Xeon VM, slower on a Zen 4 VM), and a share of the plain sum alone went over 100%. */
enum { BD_READERS = 3 };
#define BD_ASK_AHEAD ((size_t)8 << 10)
static const char *const bd_reader_names[BD_READERS] = {"plain sum", "asking, all levels",
                                                        "asking, to L2"};

typedef struct bd_job {
    int kind;   /* 0: fill with a repeated random block, 1: read-sum */
    int reader; /* kind 1: which of the BD_READERS */
    unsigned char *buf;
    size_t bytes;
    const unsigned char *block; /* kind 0: a block of `block_bytes` to repeat */
    size_t block_bytes;
    int nthreads;
    pthread_barrier_t *start, *stop; /* kind 1: passes in lock step */
    int passes;
    uint64_t sink;
} bd_job;

typedef struct bd_worker {
    bd_job *job;
    int index;
    uint64_t sum;
} bd_worker;

/* Thread t's slice [lo, hi) of the buffer, cut at 4 KiB boundaries. */
static void bd_slice(const bd_job *j, int t, size_t *lo, size_t *hi) {
    const size_t pages = (j->bytes + 4095) / 4096;
    *lo = pages * (size_t)t / (size_t)j->nthreads * 4096;
    *hi = pages * (size_t)(t + 1) / (size_t)j->nthreads * 4096;
    if (*lo > j->bytes)
        *lo = j->bytes;
    if (*hi > j->bytes)
        *hi = j->bytes;
}

/* The job's reader over [lo, hi) of its buffer. */
static uint64_t bd_read(const bd_job *j, size_t lo, size_t hi) {
    if (j->reader == 0)
        return cli_sum_words(j->buf + lo, hi - lo);
    return cli_sum_words_asking(j->buf + lo, hi - lo, BD_ASK_AHEAD, j->reader == 2);
}

static void *bd_worker_main(void *arg) {
    bd_worker *w = arg;
    bd_job *j = w->job;
    size_t lo, hi;
    bd_slice(j, w->index, &lo, &hi);
    if (j->kind == 0) {
        for (size_t o = lo; o < hi; o += j->block_bytes) {
            const size_t n = hi - o < j->block_bytes ? hi - o : j->block_bytes;
            memcpy(j->buf + o, j->block + (o / j->block_bytes % 7) * 64, n);
        }
        return NULL;
    }
    for (int p = 0; p < j->passes; p++) {
        pthread_barrier_wait(j->start);
        w->sum += bd_read(j, lo, hi);
        pthread_barrier_wait(j->stop);
    }
    return NULL;
}

/* Runs the job on nthreads threads (the caller is thread 0). With kind 1 the caller also times
 * each pass (start barrier to stop barrier) into secs[]. Returns 0 on success. */
static int bd_run_job(bd_job *j, double *secs) {
    const int T = j->nthreads;
    pthread_t tid[1024];
    bd_worker w[1024];
    pthread_barrier_t b0, b1;
    if (T < 1 || T > 1024)
        return -1;
    if (j->kind == 1) {
        if (pthread_barrier_init(&b0, NULL, (unsigned)T) ||
            pthread_barrier_init(&b1, NULL, (unsigned)T))
            return -1;
        j->start = &b0;
        j->stop = &b1;
    }
    for (int t = 0; t < T; t++)
        w[t] = (bd_worker){j, t, 0};
    int started = 1;
    for (int t = 1; t < T; t++) {
        if (pthread_create(&tid[t], NULL, bd_worker_main, &w[t]) != 0) {
            fprintf(stderr, "flashattn: bench-decode: cannot start thread %d\n", t);
            exit(1); /* the others would wait at the barrier forever */
        }
        started++;
    }
    if (j->kind == 0) {
        bd_worker_main(&w[0]);
    } else {
        size_t lo, hi;
        bd_slice(j, 0, &lo, &hi);
        for (int p = 0; p < j->passes; p++) {
            pthread_barrier_wait(&b0);
            const double t0 = cli_now();
            w[0].sum += bd_read(j, lo, hi);
            pthread_barrier_wait(&b1);
            secs[p] = cli_now() - t0;
        }
    }
    for (int t = 1; t < started; t++)
        pthread_join(tid[t], NULL);
    for (int t = 0; t < T; t++)
        j->sink += w[t].sum;
    if (j->kind == 1) {
        pthread_barrier_destroy(&b0);
        pthread_barrier_destroy(&b1);
    }
    return 0;
}

/* Fills (and so first-touches) buf with a repeated random block, each thread its own slice. */
static void bd_fill(unsigned char *buf, size_t bytes, const unsigned char *block,
                    size_t block_bytes, int threads) {
    bd_job j = {.kind = 0,
                .buf = buf,
                .bytes = bytes,
                .block = block,
                .block_bytes = block_bytes,
                .nthreads = threads};
    if (bd_run_job(&j, NULL) != 0) {
        fprintf(stderr, "flashattn: bench-decode: cannot run %d threads\n", threads);
        exit(1);
    }
}

typedef struct bd_probe {
    double gbs, gbs_min, gbs_max; /* each pass's fastest reader: median, min, max */
    double reader_gbs[BD_READERS]; /* each reader's median */
    int passes;
} bd_probe;

static uint64_t bd_sink; /* keeps the sums alive */

/* "plain sum X, asking, all levels Y, asking, to L2 Z" into buf: each reader's rate (gbs, as
 * %.1f) or, where gbs is NULL, its count of wins. Returns buf. */
static const char *bd_readers_text(char *buf, size_t size, const double *gbs, const int *wins) {
    size_t at = 0;
    for (int r = 0; r < BD_READERS && at < size; r++) {
        const char *sep = r ? ", " : "";
        const int w =
            gbs ? snprintf(buf + at, size - at, "%s%s %.1f", sep, bd_reader_names[r], gbs[r])
                : snprintf(buf + at, size - at, "%s%s %d", sep, bd_reader_names[r], wins[r]);
        at += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

/* One timed pass of a reader over buf: seconds from the threads' start to their stop; *sum: the
 * threads' sums together. */
static double bd_probe_pass(unsigned char *buf, size_t bytes, int threads, int reader,
                            uint64_t *sum) {
    double secs[1];
    bd_job j = {.kind = 1,
                .reader = reader,
                .buf = buf,
                .bytes = bytes,
                .nthreads = threads,
                .passes = 1};
    if (bd_run_job(&j, secs) != 0) {
        fprintf(stderr, "flashattn: bench-decode: the bandwidth probe failed\n");
        exit(1);
    }
    bd_sink += j.sink;
    *sum = j.sink;
    return secs[0];
}

/* One round of the probe: each reader reads each of the nbuf buffers (at most 2, of `bytes`
 * each) in turn; gbs[r]: reader r's rate over all of them. Returns the fastest reader. Every
 * reader must come to the plain sum's total over each buffer: one that skipped bytes would
 * time less than the buffer and report a rate it never read. */
static int bd_probe_round(unsigned char *const *bufs, int nbuf, size_t bytes, int threads,
                          double gbs[BD_READERS]) {
    uint64_t sum[2];
    int best = 0;
    for (int r = 0; r < BD_READERS; r++) {
        double secs = 0.0;
        for (int b = 0; b < nbuf; b++) {
            uint64_t s;
            secs += bd_probe_pass(bufs[b], bytes, threads, r, &s);
            if (r == 0)
                sum[b] = s;
            else if (s != sum[b]) {
                fprintf(stderr,
                        "flashattn: bench-decode: the probe's reader '%s' summed a buffer to "
                        "%016llx where the plain sum had %016llx\n",
                        bd_reader_names[r], (unsigned long long)s, (unsigned long long)sum[b]);
                exit(1);
            }
        }
        gbs[r] = (double)nbuf * (double)bytes / secs * 1e-9;
        best = gbs[r] > gbs[best] ? r : best;
    }
    return best;
}

static void bd_measure_probe(unsigned char *buf, size_t bytes, int threads, int passes,
                             bd_probe *out) {
    double g[BD_READERS], best[64], each[BD_READERS][64];
    if (passes > 64) {
        fprintf(stderr, "flashattn: bench-decode: at most 64 probe passes\n");
        exit(1);
    }
    (void)bd_probe_round(&buf, 1, bytes, threads, g); /* a warm-up round */
    out->gbs_min = 1e300;
    out->gbs_max = 0.0;
    for (int p = 0; p < passes; p++) {
        best[p] = g[bd_probe_round(&buf, 1, bytes, threads, g)];
        for (int r = 0; r < BD_READERS; r++)
            each[r][p] = g[r];
        out->gbs_min = best[p] < out->gbs_min ? best[p] : out->gbs_min;
        out->gbs_max = best[p] > out->gbs_max ? best[p] : out->gbs_max;
    }
    out->gbs = bd_median(best, passes);
    for (int r = 0; r < BD_READERS; r++)
        out->reader_gbs[r] = bd_median(each[r], passes);
    out->passes = passes;
}

/* ---- one configuration ------------------------------------------------------------------------
 */

typedef struct bd_row {
    fa_dtype dtype; /* the caches'; q and out are bf16 with 8-bit caches */
    long B, L;
    double cache_bytes; /* K and V, with their scales where 8-bit */
    int skipped;
    char why[160];
    double ms, ms_min, ms_max, gbs, probe, pct, err;
    int in_llc;
    int wins[BD_READERS]; /* rounds in which each reader was the fastest */
} bd_row;

/* Where the cache holds batch 0's key j of KV head hk: the element offset of its row (its row
 * of D values; an 8-bit cache's scales are in the same row order). bt0: batch 0's row of the
 * block table where paged (page > 0). */
typedef struct bd_layout {
    int bhsd;
    long page;
    const int32_t *bt0;
} bd_layout;

static size_t bd_row_at(const bd_layout *y, long L, long j, int hk) {
    if (y->page > 0)
        j = (long)y->bt0[j / y->page] * y->page + j % y->page;
    return y->bhsd ? ((size_t)hk * (size_t)L + (size_t)j) * BD_D
                   : ((size_t)j * BD_HK + (size_t)hk) * BD_D;
}

/* One cache as the check reads it: data of dtype t and, 8-bit, one fp32 scale per row. */
typedef struct bd_kv {
    const void *data;
    fa_dtype t;
    const float *scale;
} bd_kv;

/* Batch 0, heads 0 and H-1 of its first and last query tokens (of sq) against fp64 over the
 * whole cache (8-bit: dequantized, as the library reads it): max |out - ref|. q and out are of
 * dtype t. */
static double bd_check(const void *q, const bd_kv *kc, const bd_kv *vc, const void *out, fa_dtype t,
                       long L, long sq, const bd_layout *y) {
    const int heads[2] = {0, BD_H - 1};
    const int g = BD_H / BD_HK;
    const double scale = 1.0 / sqrt((double)BD_D);
    double err = 0.0;
    double *s = malloc(sizeof(double) * (size_t)L), acc[BD_D];
    if (!s)
        return NAN;
    for (int k = 0; k < (sq > 1 ? 4 : 2); k++) { /* k / 2: the first or the last token */
        const int h = heads[k % 2], hk = h / g;
        const size_t row = ((size_t)(k < 2 ? 0 : sq - 1) * BD_H + (size_t)h) * BD_D; /* q, out */
        double m = -INFINITY, l = 0.0;
        for (long j = 0; j < L; j++) {
            double dot = 0.0;
            const size_t kb = bd_row_at(y, L, j, hk);
            for (int d = 0; d < BD_D; d++)
                dot += cli_load(q, t, row + (size_t)d) *
                       bd_kv_load(kc->data, kc->t, kc->scale, kb + (size_t)d, BD_D);
            s[j] = dot * scale;
            if (s[j] > m)
                m = s[j];
        }
        for (int d = 0; d < BD_D; d++)
            acc[d] = 0.0;
        for (long j = 0; j < L; j++) {
            const double p = exp(s[j] - m);
            const size_t vb = bd_row_at(y, L, j, hk);
            l += p;
            for (int d = 0; d < BD_D; d++)
                acc[d] += p * bd_kv_load(vc->data, vc->t, vc->scale, vb + (size_t)d, BD_D);
        }
        for (int d = 0; d < BD_D; d++) {
            const double e = fabs(cli_load(out, t, row + (size_t)d) - acc[d] / l);
            if (!(e <= err))
                err = isnan(e) ? INFINITY : e > err ? e : err;
        }
    }
    free(s);
    return err;
}

/* Fills an 8-bit row's caches through the library's append (fa_forward_kvcache with k_new and
 * v_new, chunk by chunk into the empty cache), which quantizes them and writes their per-token
 * scales: the values are the bf16 row's, its random blocks rndk and rndv (bf16) repeated as
 * bd_fill repeats them on one thread, in (B, L, Hk, D) order. kv: the caches as the timed calls
 * see them; tq and to: their q and out, here with no query token (Sq = 0: append only). */
static void bd_append_q8(const bd_row *r, fa_context *ctx, const fa_kvcache *kv,
                         const unsigned char *rndk, const unsigned char *rndv, size_t block,
                         const fa_tensor *tq, const fa_tensor *to) {
    const size_t tok = (size_t)BD_HK * BD_D * 2;        /* one token's bf16 keys, all KV heads */
    const long C = 32768 / r->B > 0 ? 32768 / r->B : 1; /* tokens per chunk: <= 64 MiB */
    const size_t chunk = (size_t)r->B * (size_t)C * tok;
    unsigned char *kn = cli_xmalloc(chunk, "k_new"), *vn = cli_xmalloc(chunk, "v_new");
    int32_t *seq = cli_xmalloc(sizeof(int32_t) * (size_t)r->B, "cache_seqlens");
    const int64_t ss[1] = {r->B};
    fa_kvcache ap = *kv;
    ap.cache_seqlens = fa_tensor_contiguous(seq, FA_DTYPE_I32, 1, ss);
    fa_tensor q0 = *tq, o0 = *to;
    q0.shape[1] = o0.shape[1] = 0;
    for (long c0 = 0; c0 < r->L; c0 += C) {
        const long n = r->L - c0 < C ? r->L - c0 : C;
        for (long b = 0; b < r->B; b++) {
            seq[b] = (int32_t)c0;
            for (long j = 0; j < n; j++) { /* o: the row's bytes in a (B, L, Hk, D) bf16 cache */
                const size_t o = ((size_t)b * (size_t)r->L + (size_t)(c0 + j)) * tok;
                const size_t at = o % block + o / block % 7 * 64, to_at = ((size_t)b * n + j) * tok;
                memcpy(kn + to_at, rndk + at, tok);
                memcpy(vn + to_at, rndv + at, tok);
            }
        }
        const int64_t ns[4] = {r->B, n, BD_HK, BD_D};
        ap.k_new = fa_tensor_contiguous(kn, FA_DTYPE_BF16, 4, ns);
        ap.v_new = fa_tensor_contiguous(vn, FA_DTYPE_BF16, 4, ns);
        CLI_CHECK("fa_forward_kvcache (append)",
                  fa_forward_kvcache(ctx, NULL, &q0, &ap, &o0, NULL));
    }
    free(kn);
    free(vn);
    free(seq);
}

static void bd_run_row(const bd_options *o, fa_context *ctx, int threads, double llc, bd_row *r) {
    const int q8 = bd_dtype_8bit(r->dtype);
    const fa_dtype qt = q8 ? FA_DTYPE_BF16 : r->dtype; /* q and out */
    const size_t es = bd_dtype_size(r->dtype), qes = cli_dtype_size(qt);
    const size_t row_bytes = BD_D * es + (q8 ? sizeof(float) : 0); /* a token's head: + scale */
    /* paged: a pool of B * ceil(L / page) pages, batch b's pages spread over it by the block
     * table (a random permutation of the pool unless --page-order in-order) */
    const long per_seq = o->page > 0 ? (r->L + o->page - 1) / o->page : 0;
    const size_t pool_tokens = o->page > 0 ? (size_t)r->B * (size_t)per_seq * (size_t)o->page
                                           : (size_t)r->B * (size_t)r->L;
    /* each cache's buffer: its data, then (8-bit) its scales, so the probe reads both */
    const size_t data_bytes = pool_tokens * BD_HK * BD_D * es;
    const size_t per_cache = pool_tokens * BD_HK * row_bytes;
    r->cache_bytes = 2.0 * (double)r->B * (double)r->L * BD_HK * (double)row_bytes;
    r->in_llc = llc > 0 && r->cache_bytes <= llc;
    const double avail = bd_avail_gib();
    const double need_gib = 2.0 * (double)per_cache / (1024.0 * 1024.0 * 1024.0); /* the pools */
    if (avail >= 0 && need_gib + 0.5 > avail) {
        r->skipped = 1;
        snprintf(r->why, sizeof r->why, "skipped: K+V need %.1f GiB, %.1f GiB available", need_gib,
                 avail);
        return;
    }
    unsigned char *kc = bd_alloc(per_cache), *vc = bd_alloc(per_cache);
    const size_t nq = (size_t)r->B * (size_t)o->queries * BD_H * BD_D;
    void *q = cli_xmalloc(nq * qes, "q"), *out = cli_xmalloc(nq * qes, "out");
    float *lse = cli_xmalloc(sizeof(float) * (size_t)r->B * BD_H * (size_t)o->queries, "lse");
    int32_t *bt = o->page > 0
                      ? cli_xmalloc(sizeof(int32_t) * (size_t)r->B * (size_t)per_seq, "block table")
                      : NULL;
    if (!kc || !vc) {
        free(kc);
        free(vc);
        free(q);
        free(out);
        free(lse);
        free(bt);
        r->skipped = 1;
        snprintf(r->why, sizeof r->why, "skipped: cannot allocate %.1f GiB for K+V", need_gib);
        return;
    }
    /* random values in [-1, 1): a 1 MiB block (+ 7·64 B so slices start at different offsets),
     * repeated by the threads that first-touch their slices. 8-bit caches: the same bf16 blocks,
     * quantized by the append after zeros first-touch the buffers. */
    const size_t block = (size_t)1 << 20;
    unsigned char *rndk = cli_xmalloc(block + 7 * 64, "random block");
    unsigned char *rndv = cli_xmalloc(block + 7 * 64, "random block");
    cli_rng rng = {0x5eed0000u + (uint64_t)r->L * 131u + (uint64_t)r->B};
    for (size_t i = 0; i < (block + 7 * 64) / qes; i++)
        cli_store(rndk, qt, i, cli_rng_uniform(&rng));
    for (size_t i = 0; i < (block + 7 * 64) / qes; i++)
        cli_store(rndv, qt, i, cli_rng_uniform(&rng));
    unsigned char *zero =
        q8 ? memset(cli_xmalloc(block + 7 * 64, "zeros"), 0, block + 7 * 64) : NULL;
    bd_fill(kc, per_cache, q8 ? zero : rndk, block, threads);
    bd_fill(vc, per_cache, q8 ? zero : rndv, block, threads);
    free(zero);
    for (size_t i = 0; i < nq; i++)
        cli_store(q, qt, i, 2.0f * cli_rng_uniform(&rng));
    const size_t npages = (size_t)r->B * (size_t)per_seq;
    for (size_t i = 0; i < npages; i++)
        bt[i] = (int32_t)i;
    for (size_t i = npages; !o->page_inorder && i > 1; i--) { /* Fisher-Yates */
        const size_t k = (size_t)(cli_rng_next(&rng) % i);
        const int32_t x = bt[i - 1];
        bt[i - 1] = bt[k];
        bt[k] = x;
    }

    const int64_t qs[4] = {r->B, o->queries, BD_H, BD_D}, ls[3] = {r->B, BD_H, o->queries};
    const int64_t rows = o->page > 0 ? (int64_t)npages : r->B, slots = o->page > 0 ? o->page : r->L;
    const int64_t cs[4] = {rows, slots, BD_HK, BD_D}, bts[2] = {r->B, per_seq};
    fa_tensor tq = fa_tensor_contiguous(q, qt, 4, qs);
    fa_tensor to = fa_tensor_contiguous(out, qt, 4, qs);
    fa_tensor tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, ls);
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = fa_tensor_contiguous(kc, r->dtype, 4, cs);
    kv.v_cache = fa_tensor_contiguous(vc, r->dtype, 4, cs);
    if (q8) { /* scales (rows, slots, Hk), a token's in its data's row order */
        kv.k_scale = fa_tensor_contiguous(kc + data_bytes, FA_DTYPE_F32, 3, cs);
        kv.v_scale = fa_tensor_contiguous(vc + data_bytes, FA_DTYPE_F32, 3, cs);
    }
    if (o->bhsd) { /* same logical (B, L, Hk, D) view of head-major memory; scales (B, Hk, L) */
        fa_tensor *views[4] = {&kv.k_cache, &kv.v_cache, &kv.k_scale, &kv.v_scale};
        for (int t = 0; t < (q8 ? 4 : 2); t++) {
            const int64_t d = t < 2 ? BD_D : 1; /* elements per token and head */
            views[t]->stride[1] = d;
            views[t]->stride[2] = (int64_t)r->L * d;
            views[t]->stride[0] = (int64_t)BD_HK * r->L * d;
        }
    }
    kv.cache_seqlen = -1; /* the whole cache */
    if (o->page > 0) {
        kv.block_table = fa_tensor_contiguous(bt, FA_DTYPE_I32, 2, bts);
        kv.cache_seqlen = r->L; /* the last page may be partly used */
    }
    if (q8)
        bd_append_q8(r, ctx, &kv, rndk, rndv, block, &tq, &to);
    free(rndk);
    free(rndv);

    cli_poison(out, qt, nq);
    CLI_CHECK("fa_forward_kvcache", fa_forward_kvcache(ctx, NULL, &tq, &kv, &to, &tl));
    const bd_layout y = {o->bhsd, o->page, bt};
    const bd_kv kck = {kc, r->dtype, q8 ? (const float *)(kc + data_bytes) : NULL};
    const bd_kv vck = {vc, r->dtype, q8 ? (const float *)(vc + data_bytes) : NULL};
    r->err = bd_check(q, &kck, &vck, out, qt, r->L, o->queries, &y);

    /* Probe passes and decode calls alternate, so each round's ratio compares the two in the
     * same moment: this project's VMs change their memory read rate from minute to minute. */
    double t[256], pr[256], ratio[256];
    const int runs = (int)o->runs;
    unsigned char *const kv_bufs[2] = {kc, vc};
    double g[BD_READERS];
    (void)bd_probe_round(kv_bufs, 2, per_cache, threads, g); /* warm-up, like the checked call */
    for (int i = 0; i < runs; i++) {
        const int best = bd_probe_round(kv_bufs, 2, per_cache, threads, g);
        r->wins[best]++;
        pr[i] = g[best];
        const double t0 = cli_now();
        fa_status st = fa_forward_kvcache(ctx, NULL, &tq, &kv, &to, &tl);
        t[i] = cli_now() - t0;
        if (st != FA_OK)
            cli_die_status("fa_forward_kvcache", st);
        ratio[i] = r->cache_bytes / t[i] * 1e-9 / pr[i];
    }
    r->ms_min = 1e300;
    r->ms_max = 0.0;
    for (int i = 0; i < runs; i++) {
        r->ms_min = t[i] * 1e3 < r->ms_min ? t[i] * 1e3 : r->ms_min;
        r->ms_max = t[i] * 1e3 > r->ms_max ? t[i] * 1e3 : r->ms_max;
    }
    r->ms = bd_median(t, runs) * 1e3;
    r->gbs = r->cache_bytes / (r->ms * 1e-3) * 1e-9;
    r->probe = bd_median(pr, runs);
    r->pct = 100.0 * bd_median(ratio, runs);
    free(kc);
    free(vc);
    free(q);
    free(out);
    free(lse);
    free(bt);
}

/* The target, rows of BD_TARGET_L tokens or more at BD_TARGET_PCT% of their probe or
 * better, per dtype, beside decode's fastest row whose cache fits in the last-level cache: the
 * probe round before each call leaves such a cache there, so that row is decode's rate with
 * little or no wait for memory, on the same cores in the same run. A row whose probe times
 * BD_TARGET_PCT% is above it asks for more than decode read from cache. Rates and shares are
 * compared as printed (to 0.1), so the counts can be redone from the table. */
enum { BD_TARGET_L = 16384, BD_TARGET_PCT = 80 };

static double bd_r1(double x) { return round(x * 10.0) / 10.0; }

static void bd_summary(const bd_options *o, const bd_row *rows, int n) {
    printf("\ntarget: rows of %d tokens or more at >= %d%% of their probe; in-LLC: decode's "
           "fastest row whose K and V fit in the LLC (read from cache, not memory); above: rows "
           "of %d+ tokens whose %d%% of probe is above that rate\n",
           BD_TARGET_L, BD_TARGET_PCT, BD_TARGET_L, BD_TARGET_PCT);
    char at[16];
    snprintf(at, sizeof at, ">=%d%%", BD_TARGET_PCT);
    printf("%-5s %6s %6s %15s | %26s %6s\n", "dtype", "rows", at, "%probe range",
           "in-LLC GB/s (B, L)", "above");
    for (int di = 0; di < o->ndtypes; di++) {
        const bd_row *fast = NULL;
        int big = 0, met = 0;
        double lo = 1e300, hi = 0.0;
        for (int i = 0; i < n; i++) {
            const bd_row *r = &rows[i];
            if (r->dtype != o->dtypes[di] || r->skipped)
                continue;
            if (r->in_llc && (!fast || bd_r1(r->gbs) > bd_r1(fast->gbs)))
                fast = r;
            if (r->L < BD_TARGET_L)
                continue;
            big++;
            met += bd_r1(r->pct) >= BD_TARGET_PCT;
            lo = r->pct < lo ? r->pct : lo;
            hi = r->pct > hi ? r->pct : hi;
        }
        char range[32] = "-", llc[40] = "none in the grid", above[16] = "-";
        if (big)
            snprintf(range, sizeof range, "%.1f-%.1f%%", lo, hi);
        if (fast)
            snprintf(llc, sizeof llc, "%.1f (%ld, %ld)", fast->gbs, fast->B, fast->L);
        if (fast && big) {
            int k = 0;
            for (int i = 0; i < n; i++)
                k += rows[i].dtype == o->dtypes[di] && !rows[i].skipped &&
                     rows[i].L >= BD_TARGET_L &&
                     bd_r1(rows[i].probe) * (BD_TARGET_PCT / 100.0) > bd_r1(fast->gbs);
            snprintf(above, sizeof above, "%d", k);
        }
        printf("%-5s %6d %6d %15s | %26s %6s\n", bd_dtype_name(o->dtypes[di]), big, met, range, llc,
               above);
    }
}

/* 8-bit caches against bf16, the decode issue's other target: int8 at BD_TARGET_X times the
 * tokens/s of the bf16 cache or more, on rows of BD_TARGET_L tokens or more. A row's ratio is
 * its tokens/s over the bf16 row's of the same B and L in this run (that row's median time over
 * its own), compared as printed (to 0.01). */
#define BD_TARGET_X 1.7

/* The measured bf16 row of r's B and L among rows[0..n), or NULL. */
static const bd_row *bd_bf16_of(const bd_row *rows, int n, const bd_row *r) {
    for (int i = 0; i < n; i++)
        if (rows[i].dtype == FA_DTYPE_BF16 && !rows[i].skipped && rows[i].B == r->B &&
            rows[i].L == r->L)
            return &rows[i];
    return NULL;
}

static double bd_r2(double x) { return round(x * 100.0) / 100.0; }

static void bd_summary_q8(const bd_options *o, const bd_row *rows, int n) {
    int q8 = 0, bf16 = 0;
    for (int di = 0; di < o->ndtypes; di++) {
        q8 |= bd_dtype_8bit(o->dtypes[di]);
        bf16 |= o->dtypes[di] == FA_DTYPE_BF16;
    }
    if (!q8)
        return;
    if (!bf16) {
        printf("\nagainst bf16: no bf16 rows in this run (add bf16 to --dtypes)\n");
        return;
    }
    printf("\nagainst bf16: each 8-bit row's tokens/s over the bf16 row's of the same B and L "
           "(x bf16); target: %.2fx or more at %d tokens or more (int8); all: every L\n",
           BD_TARGET_X, BD_TARGET_L);
    char at[16];
    snprintf(at, sizeof at, ">=%.2fx", BD_TARGET_X);
    printf("%-5s %6s %7s %15s | %6s %15s\n", "dtype", "rows", at, "x bf16 range", "all",
           "x bf16 range");
    for (int di = 0; di < o->ndtypes; di++) {
        if (!bd_dtype_8bit(o->dtypes[di]))
            continue;
        int big = 0, met = 0, all = 0;
        double lo = 1e300, hi = 0.0, alo = 1e300, ahi = 0.0;
        for (int i = 0; i < n; i++) {
            const bd_row *r = &rows[i], *b = bd_bf16_of(rows, n, r);
            if (r->dtype != o->dtypes[di] || r->skipped || !b)
                continue;
            const double x = bd_r2(b->ms / r->ms);
            all++;
            alo = x < alo ? x : alo;
            ahi = x > ahi ? x : ahi;
            if (r->L < BD_TARGET_L)
                continue;
            big++;
            met += x >= BD_TARGET_X;
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        char range[32] = "-", arange[32] = "-";
        if (big)
            snprintf(range, sizeof range, "%.2f-%.2fx", lo, hi);
        if (all)
            snprintf(arange, sizeof arange, "%.2f-%.2fx", alo, ahi);
        printf("%-5s %6d %7d %15s | %6d %15s\n", bd_dtype_name(o->dtypes[di]), big, met, range, all,
               arange);
    }
}

/* ---- the command ------------------------------------------------------------------------------
 */

static void bd_usage(FILE *f) {
    fprintf(f,
            "usage: flashattn bench-decode [options]\n"
            "\n"
            "Decode-step attention (one query token per sequence, or --queries N) against a KV\n"
            "cache through fa_forward_kvcache: H=32, Hk=8, D=128, whole cache attended, BSHD\n"
            "caches.\n"
            "Per row: median time, cache-read GB/s (2*B*L*Hk*D*esize bytes of K and V; 8-bit\n"
            "caches: 2*B*L*Hk*(D + 4), their fp32 scales too) and its share of the read\n"
            "bandwidth of the same K and V buffers (with the scales), by a multi-threaded read\n"
            "probe (sums over each buffer, each thread its own slice) that reads K and V before\n"
            "every timed call with three readers (a plain sum; sums asking 8 KiB ahead into\n"
            "every cache level, or to L2) and keeps the fastest: %%probe is the median over\n"
            "calls of the call's rate over its own round's probe. A probe over a separate\n"
            "buffer larger than the last-level cache is printed before and after the grid for\n"
            "reference. Last, per dtype: how many rows of 16384 tokens or more read 80%% of their\n"
            "probe, decode's fastest row whose cache fits in the last-level cache (a rate read\n"
            "from cache, not memory), and how many 16k+ rows ask 80%% of a probe above it.\n"
            "Tokens/s: B*Sq over the median time; x bf16: an 8-bit row's tokens/s over the bf16\n"
            "row's of the same B and L, where that row ran before it; after the grid, per 8-bit\n"
            "dtype, how many rows of 16384 tokens or more reach 1.70x bf16.\n"
            "\n"
            "options:\n"
            "  --lens LIST      cache lengths (default 1024,4096,16384,65536,131072)\n"
            "  --batches LIST   batch sizes (default 1,2,4,8)\n"
            "  --dtypes LIST    cache dtypes: f32, f16, bf16, i8, e4m3, e5m2 (default f32,f16);\n"
            "                   8-bit caches hold the bf16 row's values quantized by the\n"
            "                   library's append, an fp32 scale per token and KV head, and take\n"
            "                   bf16 q and out; their check is against the dequantized cache\n"
            "  --runs N         timed calls per row after one checked warm-up call (default 7)\n"
            "  --threads N      threads for the library and the probe (default: the library's\n"
            "                   default, FA_NUM_THREADS or the online CPUs)\n"
            "  --probe-mib N    size of the reference probe's buffer in MiB (default 1024)\n"
            "  --probe-passes N timed passes of the reference probe, median reported (default 7)\n"
            "  --layout L       bshd (default: flash-attn's (B, L, Hk, D) memory order) or bhsd\n"
            "                   (head-major (B, Hk, L, D) memory, the same logical view)\n"
            "  --page-size N    paged caches: a pool of B*ceil(L/N) pages of N tokens\n"
            "                   (num_pages, N, Hk, D) and a block table (bshd only)\n"
            "  --page-order O   shuffled (default: batch b's pages scattered over the pool by\n"
            "                   a random permutation, as a serving engine's become) or in-order\n"
            "  --queries N      query tokens per sequence, 1-64 (default 1), each attending to\n"
            "                   the whole cache: a step that checks N tokens at once\n"
            "  --accuracy       instead of the timing grid: the output error of int8, e4m3 and\n"
            "                   e5m2 caches (scales per token; e4m3 also per batch and KV head)\n"
            "                   against the fp32 cache, in fp64, for normal and outlier-heavy\n"
            "                   inputs, at each --lens (default 1024,16384); takes --lens,\n"
            "                   --queries and --threads only\n"
            "  -h, --help       this text\n"
            "\n"
            "Rows whose K+V do not fit in MemAvailable (less 0.5 GiB) are skipped and listed.\n");
}

static int bd_parse(int argc, char **argv, bd_options *o) {
    memset(o, 0, sizeof *o);
    o->nlens = bd_parse_list("1024,4096,16384,65536,131072", 1, 1L << 30, o->lens, BD_MAX_LIST);
    o->nbatches = bd_parse_list("1,2,4,8", 1, 4096, o->batches, BD_MAX_LIST);
    o->dtypes[0] = FA_DTYPE_F32;
    o->dtypes[1] = FA_DTYPE_F16;
    o->ndtypes = 2;
    o->runs = 7;
    o->probe_mib = 1024;
    o->probe_passes = 7;
    o->queries = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *opt = argv[i]; /* opt: the option, before i moves to its value */
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bd_usage(stdout);
            exit(0);
        } else if (!strcmp(argv[i], "--accuracy")) {
            o->accuracy = 1;
        } else if (cli_opt_value(argc, argv, &i, "--lens", &v)) {
            if ((o->nlens = bd_parse_list(v, 1, 1L << 30, o->lens, BD_MAX_LIST)) < 0)
                goto bad;
            o->lens_given = 1;
        } else if (cli_opt_value(argc, argv, &i, "--batches", &v)) {
            if ((o->nbatches = bd_parse_list(v, 1, 4096, o->batches, BD_MAX_LIST)) < 0)
                goto bad;
        } else if (cli_opt_value(argc, argv, &i, "--dtypes", &v)) {
            char buf[128];
            if (!v || strlen(v) >= sizeof buf)
                goto bad;
            strcpy(buf, v);
            o->ndtypes = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save))
                if (o->ndtypes == BD_MAX_DTYPES ||
                    bd_parse_dtype(tok, &o->dtypes[o->ndtypes++]) != 0)
                    goto bad;
            if (o->ndtypes == 0)
                goto bad;
        } else if (cli_opt_value(argc, argv, &i, "--runs", &v)) {
            if (cli_parse_long(v, 1, 255, &o->runs) != 0)
                goto bad;
        } else if (cli_opt_value(argc, argv, &i, "--threads", &v)) {
            if (cli_parse_long(v, 1, 1024, &o->threads) != 0)
                goto bad;
        } else if (cli_opt_value(argc, argv, &i, "--probe-mib", &v)) {
            if (cli_parse_long(v, 1, 1L << 20, &o->probe_mib) != 0)
                goto bad;
        } else if (cli_opt_value(argc, argv, &i, "--layout", &v)) {
            if (!v || (strcmp(v, "bshd") && strcmp(v, "bhsd")))
                goto bad;
            o->bhsd = !strcmp(v, "bhsd");
        } else if (cli_opt_value(argc, argv, &i, "--page-size", &v)) {
            if (cli_parse_long(v, 1, 1L << 20, &o->page) != 0)
                goto bad;
        } else if (cli_opt_value(argc, argv, &i, "--page-order", &v)) {
            if (!v || (strcmp(v, "shuffled") && strcmp(v, "in-order")))
                goto bad;
            o->page_inorder = !strcmp(v, "in-order");
            o->page_order = 1;
        } else if (cli_opt_value(argc, argv, &i, "--queries", &v)) {
            if (cli_parse_long(v, 1, 64, &o->queries) != 0)
                goto bad;
        } else if (cli_opt_value(argc, argv, &i, "--probe-passes", &v)) {
            if (cli_parse_long(v, 1, 63, &o->probe_passes) != 0)
                goto bad;
        } else {
            fprintf(stderr, "flashattn bench-decode: unknown option '%s'\n\n", argv[i]);
            bd_usage(stderr);
            return 2;
        }
        if (strncmp(opt, "--lens", 6) && strncmp(opt, "--queries", 9) &&
            strncmp(opt, "--threads", 9) && strcmp(opt, "--accuracy") && !o->grid_opt)
            o->grid_opt = opt;
        continue;
    bad:
        fprintf(stderr, "flashattn bench-decode: bad value for %.*s%s%s\n\n",
                (int)strcspn(opt, "="), opt, v ? ": " : "", v ? v : "");
        bd_usage(stderr);
        return 2;
    }
    if (o->accuracy && o->grid_opt) {
        fprintf(stderr,
                "flashattn bench-decode: --accuracy takes --lens, --queries and --threads; "
                "%.*s is for the timing grid\n",
                (int)strcspn(o->grid_opt, "="), o->grid_opt);
        return 2;
    }
    if (o->accuracy && !o->lens_given)
        o->nlens = bd_parse_list("1024,16384", 1, 1L << 30, o->lens, BD_MAX_LIST);
    if (o->page_order && o->page == 0) {
        fprintf(stderr, "flashattn bench-decode: --page-order needs --page-size\n");
        return 2;
    }
    if (o->page > 0 && o->bhsd) {
        fprintf(stderr, "flashattn bench-decode: --page-size takes --layout bshd: a paged "
                        "cache is (num_pages, page_size, Hk, D)\n");
        return 2;
    }
    return 0;
}

int cmd_bench_decode(int argc, char **argv) {
    bd_options o;
    int rc = bd_parse(argc, argv, &o);
    if (rc)
        return rc;

    fa_context *ctx = NULL;
    fa_context_options co;
    fa_context_options_init(&co);
    co.num_threads = (int32_t)o.threads;
    CLI_CHECK("fa_context_create", fa_context_create(&co, &ctx));
    const int threads = (int)fa_context_num_threads(ctx);

    /* header */
    char date[64], cpu[256], load0[128], load1[128], cmdline[1024];
    int m = snprintf(cmdline, sizeof cmdline, "flashattn bench-decode");
    for (int i = 1; i < argc && m < (int)sizeof cmdline - 2; i++)
        m += snprintf(cmdline + m, sizeof cmdline - (size_t)m, " %s", argv[i]);
    if (o.accuracy) {
        rc = bd_accuracy(ctx, o.lens, o.nlens, o.queries, cmdline);
        fa_context_destroy(ctx);
        return rc;
    }
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", &tmv);
    bd_cpu_model(cpu, sizeof cpu);
    bd_first_line("/proc/loadavg", load0, sizeof load0);
    struct utsname u;
    char uts[256] = "";
    if (uname(&u) == 0)
        snprintf(uts, sizeof uts, "%s %s %s", u.sysname, u.release, u.machine);
    const double llc = bd_llc_bytes();
    if (o.queries == 1)
        printf("flashattn bench-decode: one query token against a KV cache (fa_forward_kvcache)\n");
    else
        printf("flashattn bench-decode: %ld query tokens against a KV cache (fa_forward_kvcache)\n",
               o.queries);
    printf("date:      %s\n", date);
    printf("command:   %s\n", cmdline);
    printf("machine:   %s, %ld CPUs online, %.1f GiB available; %s\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), bd_avail_gib(), uts);
    printf("llc:       %.0f MiB (as the OS reports it)\n", llc / (1024.0 * 1024.0));
    printf("library:   %s\n", fa_build_info());
    printf("threads:   %d (library context and probe)\n", threads);
    printf("load:      %s (/proc/loadavg before)\n", load0);
    printf("shape:     Sq=%ld, H=%d, Hk=%d, D=%d, whole cache attended\n", o.queries, BD_H, BD_HK,
           BD_D);
    if (o.page > 0)
        printf("layout:    paged: pages of %ld tokens, a pool (num_pages, %ld, Hk, D) and a block "
               "table; each sequence's pages %s\n",
               o.page, o.page,
               o.page_inorder ? "in pool order" : "scattered over the pool (a shuffled table)");
    else
        printf("layout:    %s caches\n",
               o.bhsd ? "head-major (B, Hk, L, D) memory" : "BSHD contiguous (B, L, Hk, D)");
    printf("bytes:     2*B*L*Hk*D*esize (K and V once; q, out, lse not counted); 8-bit caches: "
           "2*B*L*Hk*(D + 4), K and V and their fp32 scales, one per token and KV head\n");
    for (int di = 0; di < o.ndtypes; di++)
        if (bd_dtype_8bit(o.dtypes[di])) {
            printf(
                "8-bit:     int8, e4m3, e5m2 caches hold the bf16 row's values, quantized by the "
                "library's append (a scale per token and KV head, max|x| / 127, 448 or "
                "57344); q and out bf16; checked against fp64 over the dequantized cache\n");
            break;
        }
    printf("time:      median (min-max) of %ld calls after one warm-up call checked against fp64\n",
           o.runs);
    fflush(stdout);

    /* the probe: allocated and first-touched like the caches */
    const size_t pbytes = (size_t)o.probe_mib << 20;
    unsigned char *pbuf = bd_alloc(pbytes);
    if (!pbuf) {
        fprintf(stderr, "flashattn: bench-decode: cannot allocate the %ld MiB probe buffer\n",
                o.probe_mib);
        fa_context_destroy(ctx);
        return 1;
    }
    {
        unsigned char *blk = cli_xmalloc(((size_t)1 << 20) + 7 * 64, "probe block");
        for (size_t i = 0; i < ((size_t)1 << 20) + 7 * 64; i++)
            blk[i] = (unsigned char)(i * 2654435761u >> 13);
        bd_fill(pbuf, pbytes, blk, (size_t)1 << 20, threads);
        free(blk);
    }
    bd_probe p0, p1;
    bd_measure_probe(pbuf, pbytes, threads, (int)o.probe_passes, &p0);
    printf("probe:     each row's own K and V buffers, read (summed) by %d threads before every "
           "timed call, by three readers in turn: a plain sum, and sums that ask for the bytes "
           "%zu KiB ahead into every cache level or to L2; a round's probe is its fastest "
           "reader's rate over K and V; 'probe GB/s' is their median; %%probe is the median over "
           "calls of the call's GB/s over its own round's probe\n",
           threads, BD_ASK_AHEAD >> 10);
    char rtext[160];
    printf("reference: a separate %ld MiB buffer read the same way: %.1f GB/s (%.1f-%.1f); each "
           "reader's median: %s\n",
           o.probe_mib, p0.gbs, p0.gbs_min, p0.gbs_max,
           bd_readers_text(rtext, sizeof rtext, p0.reader_gbs, NULL));
    printf("\n%-5s %3s %7s %10s | %10s %21s | %7s %7s %7s | %9s %6s | %8s %s\n", "dtype", "B", "L",
           "K+V MiB", "median ms", "(min-max)", "GB/s", "probe", "%probe", "tok/s", "x bf16", "err",
           "note");
    fflush(stdout);

    int bad = 0, nskipped = 0, wins[BD_READERS] = {0}, nrows = 0;
    bd_row *rows = cli_xmalloc(sizeof *rows * (size_t)(o.ndtypes * o.nlens * o.nbatches), "rows");
    for (int di = 0; di < o.ndtypes; di++)
        for (int li = 0; li < o.nlens; li++)
            for (int bi = 0; bi < o.nbatches; bi++) {
                bd_row r;
                memset(&r, 0, sizeof r);
                r.dtype = o.dtypes[di];
                r.L = o.lens[li];
                r.B = o.batches[bi];
                bd_run_row(&o, ctx, threads, llc, &r);
                rows[nrows++] = r;
                for (int k = 0; k < BD_READERS; k++)
                    wins[k] += r.wins[k];
                if (r.skipped) {
                    nskipped++;
                    printf("%-5s %3ld %7ld %10.1f | %s\n", bd_dtype_name(r.dtype), r.B, r.L,
                           r.cache_bytes / 1048576.0, r.why);
                    fflush(stdout);
                    continue;
                }
                const double tol = r.dtype == FA_DTYPE_F32 ? 1e-4 : 2e-2;
                const int ok = r.err <= tol;
                bad += !ok;
                char mm[64], xb[16] = "-";
                snprintf(mm, sizeof mm, "(%.3f-%.3f)", r.ms_min, r.ms_max);
                const bd_row *b16 = bd_dtype_8bit(r.dtype) ? bd_bf16_of(rows, nrows, &r) : NULL;
                if (b16)
                    snprintf(xb, sizeof xb, "%.2fx", b16->ms / r.ms);
                printf("%-5s %3ld %7ld %10.1f | %10.3f %21s | %7.1f %7.1f %6.1f%% | %9.0f %6s | "
                       "%8.1e %s%s\n",
                       bd_dtype_name(r.dtype), r.B, r.L, r.cache_bytes / 1048576.0, r.ms, mm, r.gbs,
                       r.probe, r.pct, (double)(r.B * o.queries) / (r.ms * 1e-3), xb, r.err,
                       r.in_llc ? "fits in LLC" : "", ok ? "" : " CHECK FAILED (out vs fp64)");
                fflush(stdout);
            }

    bd_measure_probe(pbuf, pbytes, threads, (int)o.probe_passes, &p1);
    bd_first_line("/proc/loadavg", load1, sizeof load1);
    printf("\nfastest probe reader over the grid's rounds: %s\n",
           bd_readers_text(rtext, sizeof rtext, NULL, wins));
    printf("reference probe again after the grid: %.1f GB/s (%.1f-%.1f); before: %.1f; each "
           "reader's median: %s\n",
           p1.gbs, p1.gbs_min, p1.gbs_max, p0.gbs,
           bd_readers_text(rtext, sizeof rtext, p1.reader_gbs, NULL));
    printf("load after: %s\n", load1);
    bd_summary(&o, rows, nrows);
    bd_summary_q8(&o, rows, nrows);
    free(rows);
    if (nskipped)
        printf("%d configuration%s skipped for memory (see above)\n", nskipped,
               nskipped == 1 ? "" : "s");
    if (bd_sink == 42)
        printf(" \n"); /* never: keeps the probe's sums observable */
    free(pbuf);
    fa_context_destroy(ctx);
    if (bad) {
        fprintf(stderr, "flashattn: bench-decode: %d row%s failed the fp64 check\n", bad,
                bad == 1 ? "" : "s");
        return 1;
    }
    return 0;
}
