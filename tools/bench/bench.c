/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * bench.c — `flashattn bench`: flashattn against naive attention over a grid of configurations.
 *
 * For each configuration (pass, dtype, head dim, causal, sequence length; B and H fixed) it
 *  1. makes random inputs in [-1, 1) (bf16 rows: rounded to bf16, and naive gets exact fp32
 *     copies, converted before any timing);
 *  2. runs flashattn once and naive attention (naive.c) once, measuring the peak memory of each
 *     call, and checks that they agree (a disagreement is an error row, and is not timed);
 *  3. times more runs of each, interleaved, and reports the median.
 * Naive attention is skipped, saying how much memory it would need, when its score tensors would
 * not fit in MemAvailable.
 *
 * Speed is GFLOP/s with flash-attn's convention (forward 4*B*H*Sq*Sk*D, halved for causal,
 * backward 2.5x the forward; naive is credited with the same count) and a percentage of this
 * machine's peak measured by a probe in the same run (peak.c): the fp32 FMA peak for fp32 rows,
 * the bf16 dot-product peak for bf16 rows. Memory is the growth of the process's peak resident
 * set (VmHWM, reset through /proc/self/clear_refs) during one call, so it counts what the call
 * allocated and touched (scores, scratch, thread stacks), not its caller-owned inputs/outputs.
 *
 * Output: a table on stdout (or JSON with --json), progress on stderr, --csv FILE, --svg FILE.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "../cli/cli.h"
#include "flashattn.h"
#include "naive.h"
#include "peak.h"
#include "svg.h"

#define MAX_LIST 32
#define MAX_RUNS 101
#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

/* Check tolerances, on max |flash - naive| / max(1, max |naive|) over every output. fp32: both
 * are fp32 but sum in different orders and use different exp functions. bf16: flashattn rounds
 * its outputs (and may round P) to bf16, 2^-8 relative, while naive stays in fp32. A wrong
 * kernel is off by O(0.1-1). */
#define TOL_F32 1e-4
#define TOL_BF16 3e-2

typedef struct options {
    long seqlens[MAX_LIST], dims[MAX_LIST], causal[2], passes[2];
    fa_dtype dtypes[3];
    int n_seqlens, n_dims, n_causal, n_passes, n_dtypes;
    long runs, threads, heads, batch;
    double long_run_s, probe_s, naive_max_gib;
    uint64_t seed;
    int naive, json, quiet, quick;
    const char *csv_path, *svg_path;
} options;

typedef struct row {
    int pass; /* 0 forward, 1 backward */
    fa_dtype dtype;
    long D, causal, S, B, H;
    double gflop;
    /* flash */
    double flash_s, flash_mem_mib;
    int flash_runs;
    /* naive: status 0 ran, 1 skipped (memory), 2 off (--no-naive), 3 failed to allocate */
    int naive_status;
    double naive_s, naive_mem_mib, naive_need_gib;
    int naive_runs;
    double err, tol;
    int status; /* 0 ok, 1 mismatch, 2 library error */
    char msg[256];
} row;

/* ---- small helpers --------------------------------------------------------------------------- */

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Comma-separated integers in [lo, hi]. Returns the count, or -1. */
static int parse_long_list(const char *s, long lo, long hi, long *out, int max) {
    char buf[512], *tok, *save = NULL;
    int n = 0;
    if (!s || strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n >= max || cli_parse_long(tok, lo, hi, &out[n]) != 0)
            return -1;
        n++;
    }
    return n > 0 ? n : -1;
}

/* kB value of a "Key:   123 kB" line of a /proc file, or -1. */
static long proc_kib(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    size_t n = strlen(key);
    long v = -1;
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

/* Resets the peak RSS to the current RSS ("5" > /proc/self/clear_refs). 0 on success. */
static int hwm_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    int ok;
    if (!f)
        return -1;
    ok = fputs("5", f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int g_hwm_resettable = -1; /* -1 unknown, 0 no, 1 yes */

/* Before a measured call: give freed heap memory back to the OS (so reused pages are faulted in
 * again and counted), reset the peak, and return it (KiB). */
static long mem_begin(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    g_hwm_resettable = hwm_reset() == 0;
    return proc_kib("/proc/self/status", "VmHWM");
}

/* After the call: its peak growth in MiB (NaN if unknown). */
static double mem_end(long before_kib) {
    long after = proc_kib("/proc/self/status", "VmHWM");
    if (before_kib < 0 || after < 0)
        return NAN;
    return (double)(after - before_kib) / 1024.0;
}

/* "model name" from /proc/cpuinfo, with x86 family and model numbers (a model name like
 * "AMD EPYC" says nothing about the core generation; family 25 is Zen 3/4, 26 is Zen 5). */
static void cpu_model(char *buf, size_t n) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512], name[256] = "unknown CPU";
    long family = -1, model = -1;
    if (f) {
        while (fgets(line, sizeof line, f)) {
            char *p = strchr(line, ':');
            if (!p)
                continue;
            if (line[0] == '\n')
                break; /* the first CPU is enough */
            p++;
            while (*p == ' ' || *p == '\t')
                p++;
            p[strcspn(p, "\n")] = '\0';
            if (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0 ||
                strncmp(line, "cpu model", 9) == 0)
                snprintf(name, sizeof name, "%s", p);
            else if (strncmp(line, "cpu family", 10) == 0)
                family = strtol(p, NULL, 10);
            else if (strncmp(line, "model\t", 6) == 0 || strncmp(line, "model ", 6) == 0)
                model = strtol(p, NULL, 10);
        }
        fclose(f);
    }
    if (family >= 0 && model >= 0)
        snprintf(buf, n, "%s (family %ld model %ld)", name, family, model);
    else
        snprintf(buf, n, "%s", name);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* A number for JSON/CSV: NaN and infinities become null / empty. */
static void num_out(FILE *f, double v, const char *fmt, int json) {
    if (isfinite(v))
        fprintf(f, fmt, v);
    else if (json)
        fputs("null", f);
}

static const char *pass_name(int pass) {
    return pass ? "bwd" : "fwd";
}

static const char *naive_status_name(int st) {
    return st == 0 ? "ran" : st == 1 ? "skipped-memory" : st == 2 ? "off" : "alloc-failed";
}

static const char *row_status_name(int st) {
    return st == 0 ? "ok" : st == 1 ? "MISMATCH" : "ERROR";
}

/* max |got - ref| over n elements, scaled by max(1, max|ref|); NaN/inf count as infinite. */
static double scaled_err(const void *got, fa_dtype t, const float *ref, size_t n) {
    double e = 0.0, r = 1.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double g = cli_load(got, t, i), x = ref[i], d;
        d = isfinite(g) && isfinite(x) ? fabs(g - x) : INFINITY;
        if (d > e)
            e = d;
        if (fabs(x) > r)
            r = fabs(x);
    }
    return e / r;
}

/* "16.0 GiB" or "300 MiB": a size given in GiB, in the unit that reads best. */
static const char *fmt_size(char *buf, size_t n, double gib) {
    if (gib >= 1.0)
        snprintf(buf, n, "%.1f GiB", gib);
    else
        snprintf(buf, n, "%.0f MiB", gib * 1024.0);
    return buf;
}

/* ---- usage ----------------------------------------------------------------------------------- */

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: flashattn bench [--quick] [--seqlens LIST] [--dims LIST] [--dtypes LIST]\n"
            "                       [--causal LIST] [--pass LIST] [--runs N] [--threads N]\n"
            "                       [--heads N] [--batch N] [--no-naive] [--long-run SECONDS]\n"
            "                       [--csv FILE] [--svg FILE] [--json] [--seed N] [--quiet]\n"
            "                       [--naive-max-gib G] [--probe-ms N]\n"
            "\n"
            "flashattn against naive attention (the full N x N score matrix in memory) over a\n"
            "grid of configurations: median time, GFLOP/s, %% of this machine's peak (measured\n"
            "by a short probe in the same run), speedup over naive and peak memory of each.\n"
            "Outputs are checked against naive before timing; a disagreement is an error row.\n"
            "\n"
            "  --quick          a short subset: seqlens 512,1024,2048, dims 64,128, fp32 and\n"
            "                   bf16, non-causal, forward, 3 runs (later options still apply)\n"
            "  --seqlens LIST   Sq = Sk values (default 512,1024,2048,4096,8192,16384)\n"
            "  --dims LIST      head dims D (default 64,128)\n"
            "  --dtypes LIST    f32, bf16 and/or f16 (default f32,bf16)\n"
            "  --causal LIST    0 and/or 1 (default 0,1)\n"
            "  --pass LIST      fwd and/or bwd (default fwd,bwd)\n"
            "  --runs N         timed runs per configuration, median reported (default 5)\n"
            "  --threads N      threads for flashattn and naive (default: the library default)\n"
            "  --heads N        heads H (default 16)\n"
            "  --batch N        batch B (default 1)\n"
            "  --no-naive       time flashattn only (no check, no speedup)\n"
            "  --naive-max-gib G\n"
            "                   skip naive where its tensors would exceed G GiB (default: 90%%\n"
            "                   of MemAvailable; lower it on a machine shared with others)\n"
            "  --long-run S     a configuration whose first run takes over S seconds is timed\n"
            "                   by that run alone (default 10)\n"
            "  --csv FILE       also write the rows as CSV\n"
            "  --svg FILE       also write a chart: time and memory against sequence length\n"
            "  --json           print JSON (header and rows) on stdout instead of the table\n"
            "  --seed N         seed for the random inputs (default: fresh each run)\n"
            "  --quiet          no progress on stderr\n"
            "  --probe-ms N     length of one repetition of the peak probe (default 120; 5\n"
            "                   repetitions per kernel, before and after the grid)\n"
            "\n"
            "Exit status: 0 if every row agreed with naive (or naive was skipped), 1 if any row\n"
            "disagreed or failed, 2 on bad usage.\n");
}

/* ---- one configuration ----------------------------------------------------------------------- */

typedef struct bufs {
    void *q, *k, *v, *dout, *out, *fo, *fdq, *fdk, *fdv; /* the row's dtype */
    float *qf, *kf, *vf, *doutf, *outf;                   /* fp32 copies for naive */
    float *lse, *flse, *no, *nlse, *ndq, *ndk, *ndv;      /* fp32 */
} bufs;

static void bufs_free(bufs *b) {
    void *all[] = {b->q,     b->k,    b->v,    b->dout, b->out, b->fo,  b->fdq, b->fdk,
                   b->fdv,   b->lse,  b->flse, b->no,   b->nlse, b->ndq, b->ndk, b->ndv};
    size_t i;
    for (i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    /* fp32 copies are separate allocations only for low-precision rows */
    if ((void *)b->qf != b->q) {
        free(b->qf);
        free(b->kf);
        free(b->vf);
        free(b->doutf);
    }
    free(b->outf);
    memset(b, 0, sizeof *b);
}

static fa_context *make_context(long threads) {
    fa_context *ctx = NULL;
    fa_context_options o;
    fa_context_options_init(&o);
    o.num_threads = (int32_t)threads;
    CLI_CHECK("fa_context_create", fa_context_create(&o, &ctx));
    return ctx;
}

typedef struct call {
    fa_context *ctx;
    fa_params params;
    fa_tensor tq, tk, tv, tout, tdout, tlse, tfo, tflse, tdq, tdk, tdv;
    naive_problem np;
    const bufs *b;
    int pass;
} call;

static fa_status flash_call(call *c, double *secs) {
    double t0 = cli_now();
    fa_status st;
    if (c->pass == 0)
        st = fa_forward(c->ctx, &c->params, &c->tq, &c->tk, &c->tv, &c->tfo, &c->tflse);
    else
        st = fa_backward(c->ctx, &c->params, &c->tq, &c->tk, &c->tv, &c->tout, &c->tdout,
                         &c->tlse, &c->tdq, &c->tdk, &c->tdv);
    *secs = cli_now() - t0;
    return st;
}

static int naive_call(call *c, double *secs) {
    const bufs *b = c->b;
    double t0 = cli_now();
    int r;
    if (c->pass == 0)
        r = naive_forward(&c->np, b->qf, b->kf, b->vf, b->no, b->nlse);
    else
        r = naive_backward(&c->np, b->qf, b->kf, b->vf, b->outf, b->doutf, b->ndq, b->ndk,
                           b->ndv);
    *secs = cli_now() - t0;
    return r;
}

#if defined(__GNUC__)
static void progress(const options *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
static void progress(const options *o, const char *fmt, ...) {
    va_list ap;
    if (o->quiet)
        return;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

static void run_row(const options *o, row *r, const char *tag) {
    const long B = r->B, H = r->H, S = r->S, D = r->D;
    const fa_dtype t = r->dtype;
    const size_t n = (size_t)B * (size_t)S * (size_t)H * (size_t)D, nl = (size_t)(B * H * S);
    const size_t es = cli_dtype_size(t);
    const int low = t != FA_DTYPE_F32;
    int64_t shape[4] = {B, S, H, D}, lshape[3] = {B, H, S};
    double tf[MAX_RUNS], tn[MAX_RUNS], t_first;
    int nf, nn, i;
    long before;
    bufs b;
    call c;
    cli_rng rng;
    size_t e;

    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    rng.state = o->seed ^ (uint64_t)(r->S * 1000003 + r->D * 131 + r->causal * 7 + r->pass * 3 +
                                     (long)t);
    b.q = cli_xmalloc(n * es, "q");
    b.k = cli_xmalloc(n * es, "k");
    b.v = cli_xmalloc(n * es, "v");
    for (e = 0; e < n; e++) {
        cli_store(b.q, t, e, cli_rng_uniform(&rng));
        cli_store(b.k, t, e, cli_rng_uniform(&rng));
        cli_store(b.v, t, e, cli_rng_uniform(&rng));
    }
    if (r->pass == 1) {
        b.dout = cli_xmalloc(n * es, "dout");
        for (e = 0; e < n; e++)
            cli_store(b.dout, t, e, cli_rng_uniform(&rng));
        b.out = cli_xmalloc(n * es, "out");
        b.lse = cli_xmalloc(nl * sizeof(float), "lse");
        b.fdq = cli_xmalloc(n * es, "dq");
        b.fdk = cli_xmalloc(n * es, "dk");
        b.fdv = cli_xmalloc(n * es, "dv");
    } else {
        b.fo = cli_xmalloc(n * es, "out");
        b.flse = cli_xmalloc(nl * sizeof(float), "lse");
    }

    fa_params_init(&c.params);
    c.params.causal = (int32_t)r->causal;
    c.tq = fa_tensor_contiguous(b.q, t, 4, shape);
    c.tk = fa_tensor_contiguous(b.k, t, 4, shape);
    c.tv = fa_tensor_contiguous(b.v, t, 4, shape);
    if (r->pass == 1) {
        fa_context *prep = make_context(o->threads);
        fa_status st;
        c.tout = fa_tensor_contiguous(b.out, t, 4, shape);
        c.tdout = fa_tensor_contiguous(b.dout, t, 4, shape);
        c.tlse = fa_tensor_contiguous(b.lse, FA_DTYPE_F32, 3, lshape);
        c.tdq = fa_tensor_contiguous(b.fdq, t, 4, shape);
        c.tdk = fa_tensor_contiguous(b.fdk, t, 4, shape);
        c.tdv = fa_tensor_contiguous(b.fdv, t, 4, shape);
        /* The backward's inputs out and lse: one (untimed) flashattn forward, in its own
         * context so the measured backward starts from a fresh one. Naive's backward gets the
         * same out, in fp32, as a framework's backward gets its forward's output. */
        progress(o, "%s: forward for the backward's inputs\n", tag);
        st = fa_forward(prep, &c.params, &c.tq, &c.tk, &c.tv, &c.tout, &c.tlse);
        fa_context_destroy(prep);
        if (st != FA_OK) {
            r->status = 2;
            snprintf(r->msg, sizeof r->msg, "fa_forward: %s: %s", fa_status_name(st),
                     fa_last_error_message());
            bufs_free(&b);
            return;
        }
        cli_poison(b.fdq, t, n);
        cli_poison(b.fdk, t, n);
        cli_poison(b.fdv, t, n);
    } else {
        c.tfo = fa_tensor_contiguous(b.fo, t, 4, shape);
        c.tflse = fa_tensor_contiguous(b.flse, FA_DTYPE_F32, 3, lshape);
        cli_poison(b.fo, t, n);
        cli_poison(b.flse, FA_DTYPE_F32, nl);
    }
    c.b = &b;
    c.pass = r->pass;

    /* ---- flashattn: first call (memory, warm-up, check) ---- */
    c.ctx = make_context(o->threads);
    progress(o, "%s: flashattn first run\n", tag);
    before = mem_begin();
    {
        fa_status st = flash_call(&c, &t_first);
        r->flash_mem_mib = mem_end(before);
        if (st != FA_OK) {
            r->status = 2;
            snprintf(r->msg, sizeof r->msg, "%s: %s: %s", r->pass ? "fa_backward" : "fa_forward",
                     fa_status_name(st), fa_last_error_message());
            fa_context_destroy(c.ctx);
            bufs_free(&b);
            return;
        }
    }
    tf[0] = t_first;
    nf = t_first > o->long_run_s ? 0 : (int)o->runs;

    /* ---- naive: fits? first call (memory, check) ---- */
    c.np.B = B;
    c.np.H = H;
    c.np.Sq = S;
    c.np.Sk = S;
    c.np.D = D;
    c.np.causal = (int)r->causal;
    c.np.scale = (float)(1.0 / sqrt((double)D));
    c.np.threads = (int)fa_context_num_threads(c.ctx);
    r->naive_need_gib = naive_bytes_needed(&c.np, r->pass) / GIB;
    nn = 0;
    if (!o->naive) {
        r->naive_status = 2;
    } else {
        long avail_kib = proc_kib("/proc/meminfo", "MemAvailable");
        if (avail_kib >= 0 && r->naive_need_gib * GIB > 0.9 * (double)avail_kib * 1024.0) {
            r->naive_status = 1;
            char need[32];
            snprintf(r->msg, sizeof r->msg, "naive would need %s (%.1f GiB available)",
                     fmt_size(need, sizeof need, r->naive_need_gib),
                     (double)avail_kib / (1024.0 * 1024.0));
        } else if (o->naive_max_gib > 0.0 && r->naive_need_gib > o->naive_max_gib) {
            r->naive_status = 1;
            char need[32];
            snprintf(r->msg, sizeof r->msg, "naive would need %s (--naive-max-gib %g)",
                     fmt_size(need, sizeof need, r->naive_need_gib), o->naive_max_gib);
        }
    }
    if (r->naive_status == 0) {
        /* fp32 copies of the inputs (exact for bf16/fp16), made before any naive timing */
        if (low) {
            b.qf = cli_xmalloc(n * sizeof(float), "naive q");
            b.kf = cli_xmalloc(n * sizeof(float), "naive k");
            b.vf = cli_xmalloc(n * sizeof(float), "naive v");
            for (e = 0; e < n; e++) {
                b.qf[e] = (float)cli_load(b.q, t, e);
                b.kf[e] = (float)cli_load(b.k, t, e);
                b.vf[e] = (float)cli_load(b.v, t, e);
            }
            if (r->pass == 1) {
                b.doutf = cli_xmalloc(n * sizeof(float), "naive dout");
                for (e = 0; e < n; e++)
                    b.doutf[e] = (float)cli_load(b.dout, t, e);
            }
        } else {
            b.qf = b.q;
            b.kf = b.k;
            b.vf = b.v;
            b.doutf = b.dout;
        }
        if (r->pass == 1) {
            b.outf = cli_xmalloc(n * sizeof(float), "naive out");
            for (e = 0; e < n; e++)
                b.outf[e] = (float)cli_load(b.out, t, e);
            b.ndq = cli_xmalloc(n * sizeof(float), "naive dq");
            b.ndk = cli_xmalloc(n * sizeof(float), "naive dk");
            b.ndv = cli_xmalloc(n * sizeof(float), "naive dv");
        } else {
            b.no = cli_xmalloc(n * sizeof(float), "naive out");
            b.nlse = cli_xmalloc(nl * sizeof(float), "naive lse");
        }
        progress(o, "%s: naive first run (%.2f GiB of scores)\n", tag,
                 (double)(r->pass + 1) * (double)(B * H) * (double)S * (double)S * 4.0 / GIB);
        before = mem_begin();
        if (naive_call(&c, &t_first) != 0) {
            r->naive_status = 3;
            char need[32];
            snprintf(r->msg, sizeof r->msg, "naive: could not allocate %s",
                     fmt_size(need, sizeof need, r->naive_need_gib));
        } else {
            r->naive_mem_mib = mem_end(before);
            tn[0] = t_first;
            nn = t_first > o->long_run_s ? 0 : (int)o->runs;
            /* the check */
            if (r->pass == 0) {
                double e1 = scaled_err(b.fo, t, b.no, n);
                double e2 = scaled_err(b.flse, FA_DTYPE_F32, b.nlse, nl);
                r->err = e1 > e2 ? e1 : e2;
            } else {
                double e1 = scaled_err(b.fdq, t, b.ndq, n), e2 = scaled_err(b.fdk, t, b.ndk, n);
                double e3 = scaled_err(b.fdv, t, b.ndv, n);
                r->err = e1 > e2 ? e1 : e2;
                r->err = r->err > e3 ? r->err : e3;
            }
            r->tol = low ? TOL_BF16 : TOL_F32;
            if (!(r->err <= r->tol)) {
                r->status = 1;
                snprintf(r->msg, sizeof r->msg,
                         "flashattn and naive disagree: scaled max error %.3g > tolerance %.1g",
                         r->err, r->tol);
                nf = nn = 0;
            }
        }
    }

    /* ---- timed runs, interleaved ---- */
    if (r->status == 0) {
        int total = nf > nn ? nf : nn;
        for (i = 0; i < total; i++) {
            double s;
            if (i < nf) {
                fa_status st = flash_call(&c, &s);
                if (st != FA_OK) {
                    r->status = 2;
                    snprintf(r->msg, sizeof r->msg, "%s", fa_last_error_message());
                    break;
                }
                tf[i] = s;
                if (s > 5.0)
                    progress(o, "%s: flashattn run %d/%d: %.2f s\n", tag, i + 1, nf, s);
            }
            if (i < nn) {
                if (naive_call(&c, &s) != 0) {
                    r->naive_status = 3;
                    nn = 0;
                    char need[32];
                    snprintf(r->msg, sizeof r->msg, "naive: could not allocate %s",
                             fmt_size(need, sizeof need, r->naive_need_gib));
                } else {
                    tn[i] = s;
                    if (s > 5.0)
                        progress(o, "%s: naive run %d/%d: %.2f s\n", tag, i + 1, nn, s);
                }
            }
        }
    }
    r->flash_runs = nf ? nf : 1;
    r->flash_s = median(tf, r->flash_runs);
    if (r->naive_status == 0) {
        r->naive_runs = nn ? nn : 1;
        r->naive_s = median(tn, r->naive_runs);
    }
    fa_context_destroy(c.ctx);
    bufs_free(&b);
}

/* ---- output ---------------------------------------------------------------------------------- */

typedef struct header {
    char date[64], cpu[256], os[256], build[512], cmdline[1024];
    int threads, cpus;
    double mem_avail_gib;
    peak_result p32, pbf16;         /* measured before the grid; %peak uses these */
    peak_result p32_end, pbf16_end; /* measured again after it, to show how busy the machine was */
} header;

static double peak_for(const header *h, fa_dtype t) {
    return t == FA_DTYPE_BF16 ? h->pbf16.gflops : h->p32.gflops; /* fp16: no fp16 dot here */
}

static void print_peak(FILE *f, const char *name, const peak_result *p) {
    fprintf(f, "%-10s %.1f GFLOP/s (%s, %d chains x %d threads, median of %d: %.1f-%.1f)%s%s\n",
            name, p->gflops, p->kernel, p->chains, p->threads, p->reps, p->gflops_min,
            p->gflops_max, p->note[0] ? "; " : "", p->note);
    if (p->gflops_cpu > 0)
        fprintf(f, "           per CPU-second %.1f GFLOP/s: these threads got %.0f%% of %d CPUs\n",
                p->gflops_cpu, 100.0 * p->gflops / p->gflops_cpu, p->threads);
}

static void print_header(const header *h, const options *o) {
    printf("flashattn bench: flashattn vs naive attention\n");
    printf("date:      %s\n", h->date);
    printf("command:   %s\n", h->cmdline);
    printf("machine:   %s, %d CPUs online, %.1f GiB available; %s\n", h->cpu, h->cpus,
           h->mem_avail_gib, h->os);
    printf("cpu flags: %s (probe's own CPUID + XGETBV check)\n", peak_cpu_features());
    printf("library:   %s\n", h->build);
    printf("threads:   %d (flashattn context and naive pthreads)\n", h->threads);
    print_peak(stdout, "peak fp32:", &h->p32);
    print_peak(stdout, "peak bf16:", &h->pbf16);
    printf("shape:     B=%ld H=%ld, Sq = Sk, BSHD contiguous, default scale\n", o->batch,
           o->heads);
    printf("flops:     forward 4*B*H*Sq*Sk*D (halved for causal), backward 2.5x; naive is\n"
           "           credited with the same count (it computes every masked score too)\n");
    printf("time:      median of %ld runs after a first run that checks flashattn against\n"
           "           naive (max |diff| / max(1, max|naive|) <= %.0e fp32, %.0e bf16);\n"
           "           a configuration whose first run takes over %.0f s is timed by it alone\n",
           o->runs, TOL_F32, TOL_BF16, o->long_run_s);
    printf("memory:    growth of peak RSS (VmHWM%s) during the first call, in MiB:\n"
           "           what the call allocates and touches, not its inputs and outputs\n",
           g_hwm_resettable == 0 ? "; /proc/self/clear_refs unavailable, so only new process "
                                   "peaks show"
                                 : ", reset through /proc/self/clear_refs");
    printf("naive:     fp32, the whole (B,H,Sq,Sk) score tensor (backward: P and dS), plain\n"
           "           blocked C loops at the build's flags (no -march), libm expf, causal mask\n"
           "           applied after the full product; same thread count, split over (b,h);\n"
           "           bf16 inputs converted to fp32 before timing. Backward: both get the\n"
           "           same forward output (flashattn's) and dout.\n");
    printf("%%peak:     flashattn GFLOP/s over the bf16 peak (bf16 rows) or the fp32 peak (fp32\n"
           "           and fp16 rows)\n\n");
    printf("pass dtype   D causal     S |  flash ms  GFLOP/s  %%peak   mem MiB |  naive ms  "
           "GFLOP/s    mem MiB | speedup    err\n");
    fflush(stdout);
}

static void print_row(const header *h, const row *r) {
    printf("%-4s %-5s %3ld %-6s %5ld | ", pass_name(r->pass), cli_dtype_name(r->dtype), r->D,
           r->causal ? "yes" : "no", r->S);
    if (r->status == 2) {
        printf("ERROR: %s\n", r->msg);
        fflush(stdout);
        return;
    }
    printf("%9.2f %8.1f %5.1f%% %9.2f | ", r->flash_s * 1e3, r->gflop / r->flash_s,
           100.0 * r->gflop / r->flash_s / peak_for(h, r->dtype), r->flash_mem_mib);
    if (r->naive_status == 0) {
        printf("%9.2f %8.1f %10.1f | %6.2fx %8.1e%s", r->naive_s * 1e3, r->gflop / r->naive_s,
               r->naive_mem_mib, r->naive_s / r->flash_s, r->err,
               r->status == 1 ? "  MISMATCH" : "");
        if (r->status == 1)
            printf(": %s", r->msg);
    } else if (r->naive_status == 1) {
        char need[32];
        printf("skipped: would need %s", fmt_size(need, sizeof need, r->naive_need_gib));
    } else if (r->naive_status == 2) {
        printf("(naive off)");
    } else {
        printf("%s", r->msg);
    }
    printf("\n");
    fflush(stdout);
}

static void print_footer(const header *h, const row *rows, int nrows) {
    const double r32 = h->p32_end.gflops / h->p32.gflops;
    int i, over = 0;
    const double r16 = h->pbf16_end.gflops / h->pbf16.gflops;
    printf("\npeak again after the grid: fp32 %.1f GFLOP/s (%.1f-%.1f), bf16 %.1f GFLOP/s "
           "(%.1f-%.1f); before: %.1f and %.1f\n",
           h->p32_end.gflops, h->p32_end.gflops_min, h->p32_end.gflops_max, h->pbf16_end.gflops,
           h->pbf16_end.gflops_min, h->pbf16_end.gflops_max, h->p32.gflops, h->pbf16.gflops);
    if (fabs(r32 - 1.0) > 0.15 || fabs(r16 - 1.0) > 0.15)
        printf("note: the two probes differ by more than 15%%: the machine's load changed during "
               "the run,\n      so %%peak is approximate (other processes share these CPUs)\n");
    for (i = 0; i < nrows; i++)
        if (rows[i].status == 0 && rows[i].gflop / rows[i].flash_s > peak_for(h, rows[i].dtype))
            over++;
    if (over)
        printf("note: %d row(s) show more than 100%% of the peak: the machine was busier while the "
               "peak\n      was probed than while those rows ran\n",
               over);
    fflush(stdout);
}

static int write_csv(const char *path, const header *h, const row *rows, int nrows) {
    FILE *f = fopen(path, "w");
    int i;
    if (!f)
        return -1;
    fprintf(f, "pass,dtype,batch,heads,dim,causal,seqlen,gflop,flash_s,flash_runs,flash_gflops,"
               "flash_pct_peak,peak_gflops,flash_mem_mib,naive_status,naive_s,naive_runs,"
               "naive_gflops,naive_mem_mib,naive_need_gib,speedup,err,tol,status,message\n");
    for (i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        const int ok = r->status != 2, nv = ok && r->naive_status == 0;
        fprintf(f, "%s,%s,%ld,%ld,%ld,%ld,%ld,%.6g,", pass_name(r->pass), cli_dtype_name(r->dtype),
                r->B, r->H, r->D, r->causal, r->S, r->gflop);
        num_out(f, ok ? r->flash_s : NAN, "%.6g", 0);
        fprintf(f, ",%d,", ok ? r->flash_runs : 0);
        num_out(f, ok ? r->gflop / r->flash_s : NAN, "%.4g", 0);
        fputc(',', f);
        num_out(f, ok ? 100.0 * r->gflop / r->flash_s / peak_for(h, r->dtype) : NAN, "%.4g", 0);
        fprintf(f, ",%.4g,", peak_for(h, r->dtype));
        num_out(f, ok ? r->flash_mem_mib : NAN, "%.4g", 0);
        fprintf(f, ",%s,", naive_status_name(r->naive_status));
        num_out(f, nv ? r->naive_s : NAN, "%.6g", 0);
        fprintf(f, ",%d,", nv ? r->naive_runs : 0);
        num_out(f, nv ? r->gflop / r->naive_s : NAN, "%.4g", 0);
        fputc(',', f);
        num_out(f, nv ? r->naive_mem_mib : NAN, "%.4g", 0);
        fprintf(f, ",%.4g,", r->naive_need_gib);
        num_out(f, nv ? r->naive_s / r->flash_s : NAN, "%.4g", 0);
        fputc(',', f);
        num_out(f, nv ? r->err : NAN, "%.3g", 0);
        fputc(',', f);
        num_out(f, nv ? r->tol : NAN, "%.3g", 0);
        fprintf(f, ",%s,\"", row_status_name(r->status));
        {
            const char *m;
            for (m = r->msg; *m; m++) {
                if (*m == '"')
                    fputc('"', f);
                fputc(*m, f);
            }
        }
        fprintf(f, "\"\n");
    }
    return fclose(f) == 0 ? 0 : -1;
}

static void json_peak(FILE *f, const char *name, const peak_result *p) {
    fprintf(f,
            "    \"%s\": {\"gflops\": %.2f, \"min\": %.2f, \"max\": %.2f, \"gflops_per_cpu_second\": "
            "%.2f, \"kernel\": ",
            name, p->gflops, p->gflops_min, p->gflops_max, p->gflops_cpu);
    json_str(f, p->kernel);
    fprintf(f, ", \"chains\": %d, \"threads\": %d, \"reps\": %d, \"note\": ", p->chains,
            p->threads, p->reps);
    json_str(f, p->note);
    fprintf(f, "}");
}

static void write_json(FILE *f, const header *h, const options *o, const row *rows, int nrows) {
    int i;
    fprintf(f, "{\n  \"tool\": \"flashattn bench\",\n  \"date\": ");
    json_str(f, h->date);
    fprintf(f, ",\n  \"command\": ");
    json_str(f, h->cmdline);
    fprintf(f, ",\n  \"machine\": {\"cpu\": ");
    json_str(f, h->cpu);
    fprintf(f, ", \"cpus_online\": %d, \"mem_available_gib\": %.2f, \"os\": ", h->cpus,
            h->mem_avail_gib);
    json_str(f, h->os);
    fprintf(f, ", \"cpu_features\": ");
    json_str(f, peak_cpu_features());
    fprintf(f, "},\n  \"library\": ");
    json_str(f, h->build);
    fprintf(f, ",\n  \"threads\": %d,\n  \"runs\": %ld,\n  \"peaks\": {\n", h->threads, o->runs);
    json_peak(f, "fp32", &h->p32);
    fprintf(f, ",\n");
    json_peak(f, "bf16", &h->pbf16);
    fprintf(f, "\n  },\n  \"peaks_after\": {\n");
    json_peak(f, "fp32", &h->p32_end);
    fprintf(f, ",\n");
    json_peak(f, "bf16", &h->pbf16_end);
    fprintf(f, "\n  },\n  \"rows\": [\n");
    for (i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        const int ok = r->status != 2, nv = ok && r->naive_status == 0;
        fprintf(f, "    {\"pass\": \"%s\", \"dtype\": \"%s\", \"batch\": %ld, \"heads\": %ld, "
                   "\"dim\": %ld, \"causal\": %s, \"seqlen\": %ld, \"gflop\": %.6g, ",
                pass_name(r->pass), cli_dtype_name(r->dtype), r->B, r->H, r->D,
                r->causal ? "true" : "false", r->S, r->gflop);
        fprintf(f, "\"flash_s\": ");
        num_out(f, ok ? r->flash_s : NAN, "%.6g", 1);
        fprintf(f, ", \"flash_runs\": %d, \"flash_gflops\": ", ok ? r->flash_runs : 0);
        num_out(f, ok ? r->gflop / r->flash_s : NAN, "%.4g", 1);
        fprintf(f, ", \"flash_pct_peak\": ");
        num_out(f, ok ? 100.0 * r->gflop / r->flash_s / peak_for(h, r->dtype) : NAN, "%.4g", 1);
        fprintf(f, ", \"flash_mem_mib\": ");
        num_out(f, ok ? r->flash_mem_mib : NAN, "%.4g", 1);
        fprintf(f, ", \"naive_status\": \"%s\", \"naive_s\": ",
                naive_status_name(r->naive_status));
        num_out(f, nv ? r->naive_s : NAN, "%.6g", 1);
        fprintf(f, ", \"naive_runs\": %d, \"naive_gflops\": ", nv ? r->naive_runs : 0);
        num_out(f, nv ? r->gflop / r->naive_s : NAN, "%.4g", 1);
        fprintf(f, ", \"naive_mem_mib\": ");
        num_out(f, nv ? r->naive_mem_mib : NAN, "%.4g", 1);
        fprintf(f, ", \"naive_need_gib\": %.4g, \"speedup\": ", r->naive_need_gib);
        num_out(f, nv ? r->naive_s / r->flash_s : NAN, "%.4g", 1);
        fprintf(f, ", \"err\": ");
        num_out(f, nv ? r->err : NAN, "%.3g", 1);
        fprintf(f, ", \"tol\": ");
        num_out(f, nv ? r->tol : NAN, "%.3g", 1);
        fprintf(f, ", \"status\": \"%s\", \"message\": ", row_status_name(r->status));
        json_str(f, r->msg);
        fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

/* One chart: a series pair (flash solid, naive dashed) per (pass, dtype, D, causal). */
static int write_svg(const char *path, const header *h, const options *o, const row *rows,
                     int nrows) {
    svg_series *s = calloc((size_t)(2 * nrows + 2), sizeof *s);
    double *xs = calloc((size_t)nrows + 1, sizeof(double));
    double *ys = calloc((size_t)(4 * nrows + 4), sizeof(double));
    char (*labels)[96] = calloc((size_t)(2 * nrows + 2), sizeof *labels);
    char subtitle[512], note1[256], note2[512];
    svg_chart c;
    FILE *f;
    int ns = 0, i = 0, cfg = 0, rc, any_skip = 0;

    if (!s || !xs || !ys || !labels) {
        free(s), free(xs), free(ys), free(labels);
        return -1;
    }
    note2[0] = '\0';
    while (i < nrows) {
        int j = i, k;
        while (j < nrows && rows[j].pass == rows[i].pass && rows[j].dtype == rows[i].dtype &&
               rows[j].D == rows[i].D && rows[j].causal == rows[i].causal)
            j++;
        for (k = i; k < j; k++) {
            const row *r = &rows[k];
            const int ok = r->status == 0;
            xs[k] = (double)r->S;
            ys[4 * i + 0 * (j - i) + (k - i)] = ok ? r->flash_s : NAN;
            ys[4 * i + 1 * (j - i) + (k - i)] =
                ok ? (r->flash_mem_mib > 0 ? r->flash_mem_mib : 4.0 / 1024.0) : NAN;
            ys[4 * i + 2 * (j - i) + (k - i)] = ok && r->naive_status == 0 ? r->naive_s : NAN;
            ys[4 * i + 3 * (j - i) + (k - i)] =
                ok && r->naive_status == 0 ? r->naive_mem_mib : NAN;
            if (r->naive_status == 1 && !any_skip) {
                any_skip = 1;
                snprintf(note2, sizeof note2, "Missing naive points: skipped for memory (first: %s %s "
                         "D=%ld S=%ld: %s).", pass_name(r->pass), cli_dtype_name(r->dtype), r->D,
                         r->S, r->msg);
            }
        }
        snprintf(labels[ns], sizeof labels[ns], "flash %s %s D=%ld%s", pass_name(rows[i].pass),
                 cli_dtype_name(rows[i].dtype), rows[i].D, rows[i].causal ? " causal" : "");
        s[ns].label = labels[ns];
        s[ns].color = cfg;
        s[ns].dashed = 0;
        s[ns].n = j - i;
        s[ns].x = xs + i;
        s[ns].y[0] = ys + 4 * i;
        s[ns].y[1] = ys + 4 * i + (j - i);
        ns++;
        if (o->naive) {
            snprintf(labels[ns], sizeof labels[ns], "naive %s %s D=%ld%s", pass_name(rows[i].pass),
                     cli_dtype_name(rows[i].dtype), rows[i].D, rows[i].causal ? " causal" : "");
            s[ns].label = labels[ns];
            s[ns].color = cfg;
            s[ns].dashed = 1;
            s[ns].n = j - i;
            s[ns].x = xs + i;
            s[ns].y[0] = ys + 4 * i + 2 * (j - i);
            s[ns].y[1] = ys + 4 * i + 3 * (j - i);
            ns++;
        }
        cfg++;
        i = j;
    }
    memset(&c, 0, sizeof c);
    c.title = "flashattn vs naive attention";
    snprintf(subtitle, sizeof subtitle, "%s, %d threads; B=%ld H=%ld; %s", h->cpu, h->threads,
             o->batch, o->heads, h->date);
    c.subtitle = subtitle;
    c.x_label = "sequence length (Sq = Sk)";
    c.y_label[0] = "time per call (median)";
    c.y_label[1] = "peak memory of the call (VmHWM growth)";
    c.y_unit[0] = 0;
    c.y_unit[1] = 1;
    snprintf(note1, sizeof note1,
             "Solid: flashattn; dashed, hollow markers: naive (fp32, full score matrix). "
             "Peaks: fp32 %.0f, bf16 %.0f GFLOP/s.",
             h->p32.gflops, h->pbf16.gflops);
    c.notes[0] = note1;
    c.notes[1] = note2[0] ? note2 : NULL;
    c.notes[2] = NULL;
    f = fopen(path, "w");
    rc = f ? svg_write_chart(f, &c, s, ns) : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    free(s), free(xs), free(ys), free(labels);
    return rc;
}

/* ---- the command ----------------------------------------------------------------------------- */

int cmd_bench(int argc, char **argv) {
    options o;
    header h;
    row *rows;
    int a, nrows = 0, failures = 0, ri;
    int ip, it, id, ic, is;

    memset(&o, 0, sizeof o);
    {
        static const long def_s[] = {512, 1024, 2048, 4096, 8192, 16384};
        memcpy(o.seqlens, def_s, sizeof def_s);
        o.n_seqlens = 6;
    }
    o.dims[0] = 64, o.dims[1] = 128, o.n_dims = 2;
    o.causal[0] = 0, o.causal[1] = 1, o.n_causal = 2;
    o.passes[0] = 0, o.passes[1] = 1, o.n_passes = 2;
    o.dtypes[0] = FA_DTYPE_F32, o.dtypes[1] = FA_DTYPE_BF16, o.n_dtypes = 2;
    o.runs = 5, o.threads = 0, o.heads = 16, o.batch = 1, o.long_run_s = 10.0, o.probe_s = 0.12, o.naive_max_gib = 0.0;
    o.naive = 1;
    o.seed = cli_fresh_seed();

    /* --quick first, so that any other option given with it overrides it */
    for (a = 1; a < argc; a++)
        if (!strcmp(argv[a], "--quick")) {
            o.quick = 1;
            o.seqlens[0] = 512, o.seqlens[1] = 1024, o.seqlens[2] = 2048, o.n_seqlens = 3;
            o.n_causal = 1;
            o.n_passes = 1;
            o.runs = 3;
        }
    for (a = 1; a < argc; a++) {
        const char *opt = argv[a], *val = NULL;
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            bench_usage(stdout);
            return 0;
        } else if (!strcmp(opt, "--quick")) {
            continue;
        } else if (!strcmp(opt, "--json")) {
            o.json = 1;
        } else if (!strcmp(opt, "--quiet")) {
            o.quiet = 1;
        } else if (!strcmp(opt, "--no-naive")) {
            o.naive = 0;
        } else if (cli_opt_value(argc, argv, &a, "--seqlens", &val)) {
            if ((o.n_seqlens = parse_long_list(val, 1, 1L << 20, o.seqlens, MAX_LIST)) < 0)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--dims", &val)) {
            if ((o.n_dims = parse_long_list(val, 1, 4096, o.dims, MAX_LIST)) < 0)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--causal", &val)) {
            if ((o.n_causal = parse_long_list(val, 0, 1, o.causal, 2)) < 0)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--pass", &val)) {
            char buf[64], *tok, *save = NULL;
            if (!val || strlen(val) >= sizeof buf)
                goto bad_list;
            strcpy(buf, val);
            o.n_passes = 0;
            for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (o.n_passes >= 2)
                    goto bad_list;
                if (!strcmp(tok, "fwd") || !strcmp(tok, "forward"))
                    o.passes[o.n_passes++] = 0;
                else if (!strcmp(tok, "bwd") || !strcmp(tok, "backward"))
                    o.passes[o.n_passes++] = 1;
                else
                    goto bad_list;
            }
            if (!o.n_passes)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--dtypes", &val)) {
            char buf[64], *tok, *save = NULL;
            if (!val || strlen(val) >= sizeof buf)
                goto bad_list;
            strcpy(buf, val);
            o.n_dtypes = 0;
            for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                if (o.n_dtypes >= 3 || cli_parse_dtype(tok, &o.dtypes[o.n_dtypes++]) != 0)
                    goto bad_list;
            if (!o.n_dtypes)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--runs", &val)) {
            if (cli_parse_long(val, 1, MAX_RUNS, &o.runs) != 0)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--threads", &val)) {
            if (cli_parse_long(val, 1, 1024, &o.threads) != 0)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--heads", &val)) {
            if (cli_parse_long(val, 1, 4096, &o.heads) != 0)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--batch", &val)) {
            if (cli_parse_long(val, 1, 1L << 20, &o.batch) != 0)
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--seed", &val)) {
            long sd;
            if (cli_parse_long(val, 0, 0x7fffffffffffffffL, &sd) != 0)
                goto bad_list;
            o.seed = (uint64_t)sd;
        } else if (cli_opt_value(argc, argv, &a, "--long-run", &val)) {
            char *end = NULL;
            o.long_run_s = val ? strtod(val, &end) : -1.0;
            if (!val || *end || !(o.long_run_s >= 0.0))
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--naive-max-gib", &val)) {
            char *end = NULL;
            o.naive_max_gib = val ? strtod(val, &end) : -1.0;
            if (!val || *end || !(o.naive_max_gib > 0.0))
                goto bad_list;
        } else if (cli_opt_value(argc, argv, &a, "--probe-ms", &val)) {
            long ms;
            if (cli_parse_long(val, 1, 10000, &ms) != 0)
                goto bad_list;
            o.probe_s = (double)ms * 1e-3;
        } else if (cli_opt_value(argc, argv, &a, "--csv", &val)) {
            if (!val)
                goto bad_list;
            o.csv_path = val;
        } else if (cli_opt_value(argc, argv, &a, "--svg", &val)) {
            if (!val)
                goto bad_list;
            o.svg_path = val;
        } else {
            fprintf(stderr, "flashattn bench: unknown argument '%s'\n\n", opt);
            bench_usage(stderr);
            return 2;
        }
        continue;
    bad_list:
        fprintf(stderr, "flashattn bench: bad value for %s%s%s (see --help)\n", opt,
                val ? ": " : "", val ? val : "");
        return 2;
    }

    /* ---- header: machine, library, threads, peaks ---- */
    memset(&h, 0, sizeof h);
    {
        time_t now = time(NULL);
        struct tm tmv;
        struct utsname u;
        fa_context *ctx = make_context(o.threads);
        long avail = proc_kib("/proc/meminfo", "MemAvailable");
        size_t len = 0;
        gmtime_r(&now, &tmv);
        strftime(h.date, sizeof h.date, "%Y-%m-%d %H:%M:%S UTC", &tmv);
        cpu_model(h.cpu, sizeof h.cpu);
        if (uname(&u) == 0)
            snprintf(h.os, sizeof h.os, "%s %s %s", u.sysname, u.release, u.machine);
        snprintf(h.build, sizeof h.build, "%s", fa_build_info());
        h.cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
        h.mem_avail_gib = avail >= 0 ? (double)avail / (1024.0 * 1024.0) : NAN;
        h.threads = (int)fa_context_num_threads(ctx);
        fa_context_destroy(ctx);
        for (a = 0; a < argc && len + 2 < sizeof h.cmdline; a++)
            len += (size_t)snprintf(h.cmdline + len, sizeof h.cmdline - len, "%s%s",
                                    a ? " " : "flashattn ", argv[a]);
    }
    progress(&o, "flashattn bench: measuring this machine's peak on %d threads...\n", h.threads);
    peak_measure_fp32(h.threads, 5, o.probe_s, &h.p32);
    peak_measure_bf16(h.threads, 5, o.probe_s, &h.p32, &h.pbf16);
    g_hwm_resettable = hwm_reset() == 0;
    if (!o.json)
        print_header(&h, &o);

    /* ---- the grid ---- */
    rows = calloc((size_t)(o.n_passes * o.n_dtypes * o.n_dims * o.n_causal * o.n_seqlens),
                  sizeof *rows);
    if (!rows) {
        fprintf(stderr, "flashattn bench: out of memory\n");
        return 1;
    }
    for (ip = 0; ip < o.n_passes; ip++)
        for (it = 0; it < o.n_dtypes; it++)
            for (id = 0; id < o.n_dims; id++)
                for (ic = 0; ic < o.n_causal; ic++)
                    for (is = 0; is < o.n_seqlens; is++) {
                        row *r = &rows[nrows++];
                        r->pass = (int)o.passes[ip];
                        r->dtype = o.dtypes[it];
                        r->D = o.dims[id];
                        r->causal = o.causal[ic];
                        r->S = o.seqlens[is];
                        r->B = o.batch;
                        r->H = o.heads;
                        r->gflop = 4.0 * (double)r->B * (double)r->H * (double)r->S *
                                   (double)r->S * (double)r->D * 1e-9 * (r->causal ? 0.5 : 1.0) *
                                   (r->pass ? 2.5 : 1.0);
                    }
    for (ri = 0; ri < nrows; ri++) {
        row *r = &rows[ri];
        char tag[160];
        snprintf(tag, sizeof tag, "[%d/%d] %s %s D=%ld %s S=%ld (%.1f GFLOP)", ri + 1, nrows,
                 pass_name(r->pass), cli_dtype_name(r->dtype), r->D,
                 r->causal ? "causal" : "non-causal", r->S, r->gflop);
        run_row(&o, r, tag);
        if (r->status != 0)
            failures++;
        if (!o.json)
            print_row(&h, r);
    }

    /* The peak once more: if the machine's load changed during the grid, this shows it. */
    progress(&o, "flashattn bench: measuring the peak again...\n");
    peak_measure_fp32(h.threads, 5, o.probe_s, &h.p32_end);
    peak_measure_bf16(h.threads, 5, o.probe_s, &h.p32_end, &h.pbf16_end);
    if (!o.json)
        print_footer(&h, rows, nrows);
    if (o.json)
        write_json(stdout, &h, &o, rows, nrows);
    if (o.csv_path) {
        if (write_csv(o.csv_path, &h, rows, nrows) != 0) {
            fprintf(stderr, "flashattn bench: cannot write %s\n", o.csv_path);
            failures++;
        } else
            progress(&o, "wrote %s\n", o.csv_path);
    }
    if (o.svg_path) {
        if (write_svg(o.svg_path, &h, &o, rows, nrows) != 0) {
            fprintf(stderr, "flashattn bench: cannot write %s\n", o.svg_path);
            failures++;
        } else
            progress(&o, "wrote %s\n", o.svg_path);
    }
    if (failures)
        fprintf(stderr, "flashattn bench: %d configuration(s) failed (see the rows above)\n",
                failures);
    free(rows);
    return failures ? 1 : 0;
}
