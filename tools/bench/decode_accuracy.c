/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * decode_accuracy.c — `flashattn bench-decode --accuracy`: the output error of 8-bit KV caches
 * against the fp32 cache they were quantized from (the format's error), beside the kernel's own.
 *
 * For each cache length and two inputs (normal: q, k, v ~ N(0, 1); outliers: the same with four
 * of K's 128 channels times 100 in every KV head, as real K caches have, and q's same channels
 * over 100, so the scores keep their distribution and only K's range grows), the fp32 keys and
 * values go through fa_forward_kvcache's append into int8, e4m3 and e5m2 caches with a scale
 * per token and KV head (the append computes them), and into an e4m3 cache with one scale per
 * batch and KV head (flash-attn 3's descale: that head's max |x| over the whole cache / 448).
 * A decode call (fp32 q and out) then reads each cache, and its output is compared with fp64
 * attention over the fp32 cache (the format's error) and over the stored cache, dequantized as
 * the library reads it (the kernel's error, checked). A bf16 row, fp64 attention over the cache
 * rounded to bf16 (no kernel run), shows the error a 16-bit cache already has.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cli/cli.h"
#include "flashattn.h"
#include "kv8.h"

enum { AC_B = 2, AC_H = 32, AC_HK = 8, AC_D = 128, AC_G = AC_H / AC_HK, AC_INPUTS = 2 };

#define AC_TOL 1e-4    /* the kernel check: max error against fp64 over the dequantized cache */
#define AC_TARGET 0.01 /* the decode issue's bound: int8's error on random inputs */

typedef struct ac_format {
    const char *name, *scale;
    fa_dtype t;
    int per_token; /* else one scale per batch and KV head */
} ac_format;

static const ac_format ac_formats[] = {{"int8", "per token", FA_DTYPE_I8, 1},
                                       {"e4m3", "per token", FA_DTYPE_F8_E4M3, 1},
                                       {"e5m2", "per token", FA_DTYPE_F8_E5M2, 1},
                                       {"e4m3", "per (B, Hk)", FA_DTYPE_F8_E4M3, 0}};
enum { AC_FORMATS = sizeof ac_formats / sizeof ac_formats[0] };

static const char *const ac_inputs[AC_INPUTS] = {"normal", "outliers"};

/* K's outlier channels (the outliers input): 7, 39, 71, 103. */
static int ac_outlier(int d) { return d % 32 == 7; }

/* Standard normal (Box-Muller). */
static double ac_normal(cli_rng *r) {
    const double u1 = ((double)(cli_rng_next(r) >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
    const double u2 = (double)(cli_rng_next(r) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* fp64 attention, scale 1/sqrt(D), of every query row of q (B, sq, H, D) against k and v
 * (B, L, Hk, D), all fp32 contiguous: ref (B, sq, H, D). s: scratch of G·L doubles. */
static void ac_reference(const float *q, const float *k, const float *v, long L, long sq, double *s,
                         double *ref) {
    const double scale = 1.0 / sqrt((double)AC_D);
    double qr[AC_G][AC_D], acc[AC_G][AC_D], m[AC_G], l[AC_G];
    for (long b = 0; b < AC_B; b++)
        for (long i = 0; i < sq; i++)
            for (int hk = 0; hk < AC_HK; hk++) { /* the G query heads of KV head hk together */
                const size_t q0 =
                    (((size_t)b * (size_t)sq + (size_t)i) * AC_H + (size_t)hk * AC_G) * AC_D;
                for (int g = 0; g < AC_G; g++) {
                    for (int d = 0; d < AC_D; d++) {
                        qr[g][d] = q[q0 + (size_t)g * AC_D + (size_t)d];
                        acc[g][d] = 0.0;
                    }
                    m[g] = -INFINITY;
                    l[g] = 0.0;
                }
                for (long j = 0; j < L; j++) {
                    const float *kr = k + (((size_t)b * (size_t)L + (size_t)j) * AC_HK + hk) * AC_D;
                    for (int g = 0; g < AC_G; g++) {
                        double dot = 0.0;
                        for (int d = 0; d < AC_D; d++)
                            dot += qr[g][d] * kr[d];
                        s[g * L + j] = dot * scale;
                        m[g] = s[g * L + j] > m[g] ? s[g * L + j] : m[g];
                    }
                }
                for (long j = 0; j < L; j++) {
                    const float *vr = v + (((size_t)b * (size_t)L + (size_t)j) * AC_HK + hk) * AC_D;
                    for (int g = 0; g < AC_G; g++) {
                        const double p = exp(s[g * L + j] - m[g]);
                        l[g] += p;
                        for (int d = 0; d < AC_D; d++)
                            acc[g][d] += p * vr[d];
                    }
                }
                for (int g = 0; g < AC_G; g++)
                    for (int d = 0; d < AC_D; d++)
                        ref[q0 + (size_t)g * AC_D + (size_t)d] = acc[g][d] / l[g];
            }
}

/* The errors of o against ref, rows of D values: e = |o - ref| / max|ref| over its row for each
 * element, its max (err[0]) and mean (err[1]); and the largest |o - ref| / |ref| of a row in
 * the 2-norm (err[2]). A NaN anywhere makes all three infinite. */
static void ac_error(const double *o, const double *ref, size_t rows, double err[3]) {
    double sum = 0.0;
    err[0] = err[2] = 0.0;
    for (size_t r = 0; r < rows; r++) {
        const double *x = o + r * AC_D, *y = ref + r * AC_D;
        double big = 0.0, dd = 0.0, yy = 0.0;
        for (int d = 0; d < AC_D; d++) {
            big = fmax(big, fabs(y[d]));
            dd += (x[d] - y[d]) * (x[d] - y[d]);
            yy += y[d] * y[d];
        }
        for (int d = 0; d < AC_D; d++) {
            const double diff = fabs(x[d] - y[d]), e = big > 0.0 ? diff / big : diff;
            if (!(e <= INFINITY)) { /* NaN */
                err[0] = err[1] = err[2] = INFINITY;
                return;
            }
            err[0] = e > err[0] ? e : err[0];
            sum += e;
        }
        const double n = yy > 0.0 ? sqrt(dd / yy) : sqrt(dd);
        err[2] = n > err[2] ? n : err[2];
    }
    err[1] = sum / (double)(rows * AC_D);
}

/* The fp32 caches and their quantized copies of one cache length. */
typedef struct ac_bufs {
    long L, sq;
    size_t nq, nc, nrows; /* elements of q and out, of a cache; rows of D in a cache */
    float *q, *out, *k, *v, *kd, *vd, *ks, *vs; /* kd, vd: a cache as read; ks, vs: scales */
    uint8_t *k8, *v8;
    double *ref, *refd, *od, *s; /* fp64 over the fp32 cache, over kd and vd; out; scratch */
    int32_t seqlens[AC_B];
} ac_bufs;

/* One scale per batch and KV head: the head's max |x| over the whole fp32 cache x / 448. */
static void ac_head_scales(const float *x, long L, float s[AC_B * AC_HK]) {
    for (int i = 0; i < AC_B * AC_HK; i++)
        s[i] = 0.0f;
    for (size_t r = 0; r < (size_t)AC_B * (size_t)L * AC_HK; r++) {
        const size_t bh = r / ((size_t)L * AC_HK) * AC_HK + r % AC_HK;
        for (int d = 0; d < AC_D; d++)
            s[bh] = fmaxf(s[bh], fabsf(x[r * AC_D + (size_t)d]));
    }
    for (int i = 0; i < AC_B * AC_HK; i++)
        s[i] /= 448.0f;
}

/* Format f of the cache in a: the append quantizes a->k and a->v into it, a decode call reads
 * it into a->od, and a->kd, a->vd get the cache as the library reads it. */
static void ac_run_format(fa_context *ctx, const ac_format *f, ac_bufs *a) {
    float hs[2][AC_B * AC_HK];
    const int64_t qs[4] = {AC_B, a->sq, AC_H, AC_D}, cs[4] = {AC_B, a->L, AC_HK, AC_D};
    const int64_t ss[3] = {AC_B, f->per_token ? a->L : AC_HK, AC_HK}, ls[1] = {AC_B};
    memset(a->k8, 0xff, a->nc); /* -1 in int8, NaN in fp8 */
    memset(a->v8, 0xff, a->nc);
    memset(a->ks, 0xff, a->nrows * sizeof(float)); /* NaN */
    memset(a->vs, 0xff, a->nrows * sizeof(float));
    fa_tensor tq = fa_tensor_contiguous(a->q, FA_DTYPE_F32, 4, qs);
    fa_tensor to = fa_tensor_contiguous(a->out, FA_DTYPE_F32, 4, qs);
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = fa_tensor_contiguous(a->k8, f->t, 4, cs);
    kv.v_cache = fa_tensor_contiguous(a->v8, f->t, 4, cs);
    if (f->per_token) {
        kv.k_scale = fa_tensor_contiguous(a->ks, FA_DTYPE_F32, 3, ss);
        kv.v_scale = fa_tensor_contiguous(a->vs, FA_DTYPE_F32, 3, ss);
    } else {
        ac_head_scales(a->k, a->L, hs[0]);
        ac_head_scales(a->v, a->L, hs[1]);
        kv.k_scale = fa_tensor_contiguous(hs[0], FA_DTYPE_F32, 2, ss);
        kv.v_scale = fa_tensor_contiguous(hs[1], FA_DTYPE_F32, 2, ss);
    }
    fa_kvcache ap = kv; /* the append: the whole cache, into an empty one */
    ap.k_new = fa_tensor_contiguous(a->k, FA_DTYPE_F32, 4, cs);
    ap.v_new = fa_tensor_contiguous(a->v, FA_DTYPE_F32, 4, cs);
    ap.cache_seqlens = fa_tensor_contiguous(a->seqlens, FA_DTYPE_I32, 1, ls);
    CLI_CHECK("fa_forward_kvcache (append)", fa_forward_kvcache(ctx, NULL, &tq, &ap, &to, NULL));
    cli_poison(a->out, FA_DTYPE_F32, a->nq);
    CLI_CHECK("fa_forward_kvcache", fa_forward_kvcache(ctx, NULL, &tq, &kv, &to, NULL));
    for (size_t i = 0; i < a->nq; i++)
        a->od[i] = a->out[i];
    for (size_t r = 0; r < a->nrows; r++) { /* row r = (b·L + j)·Hk + hk */
        const size_t bh = r / ((size_t)a->L * AC_HK) * AC_HK + r % AC_HK;
        const float sk = f->per_token ? a->ks[r] : hs[0][bh];
        const float sv = f->per_token ? a->vs[r] : hs[1][bh];
        for (size_t e = r * AC_D; e < (r + 1) * AC_D; e++) {
            a->kd[e] = bd_q8_value(f->t, a->k8[e]) * sk;
            a->vd[e] = bd_q8_value(f->t, a->v8[e]) * sv;
        }
    }
}

/* Fresh inputs of one kind (0 normal, 1 outliers) into a->q, a->k, a->v. */
static void ac_inputs_fill(ac_bufs *a, int kind) {
    cli_rng rng = {0xacc00000u + (uint64_t)a->L * 131u + (uint64_t)kind};
    for (size_t i = 0; i < a->nq; i++) {
        a->q[i] = (float)ac_normal(&rng);
        if (kind == 1 && ac_outlier((int)(i % AC_D)))
            a->q[i] /= 100.0f;
    }
    for (size_t i = 0; i < a->nc; i++) {
        a->k[i] = (float)ac_normal(&rng);
        a->v[i] = (float)ac_normal(&rng);
        if (kind == 1 && ac_outlier((int)(i % AC_D)))
            a->k[i] *= 100.0f;
    }
}

static void ac_row(const char *name, const char *scale, int kind, long L, const double err[3],
                   const char *kernel, const char *note) {
    char pct[3][24];
    for (int k = 0; k < 3; k++) /* a broken kernel's errors can be far beyond 100% */
        snprintf(pct[k], sizeof pct[k], err[k] < 1e3 ? "%.4f" : "%.2e", 100.0 * err[k]);
    printf("%-5s %-11s %-8s %7ld | %9s %9s %9s | %8s %s\n", name, scale, ac_inputs[kind], L, pct[0],
           pct[1], pct[2], kernel, note);
    fflush(stdout);
}

int bd_accuracy(fa_context *ctx, const long *lens, int nlens, long queries, const char *cmdline) {
    char date[64];
    const time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", &tmv);
    printf("flashattn bench-decode --accuracy: 8-bit KV caches against the fp32 cache "
           "(fa_forward_kvcache)\n");
    printf("date:      %s\n", date);
    printf("command:   %s\n", cmdline);
    printf("library:   %s\n", fa_build_info());
    printf("threads:   %d (library context)\n", (int)fa_context_num_threads(ctx));
    printf("shape:     B=%d, Sq=%ld, H=%d, Hk=%d, D=%d, whole cache attended; q, out and the "
           "appended k_new, v_new fp32\n",
           AC_B, queries, AC_H, AC_HK, AC_D);
    printf("inputs:    normal: q, k, v ~ N(0, 1), fresh per length; outliers: the same with K's "
           "channels 7, 39, 71, 103 times 100 in every KV head and q's same channels / 100 (the "
           "scores keep their distribution: only K's range grows)\n");
    printf("caches:    quantized by the library's append; per token: a scale per token and KV "
           "head, max|x| / Q (Q = 127, 448, 57344); per (B, Hk): one scale per batch and KV "
           "head, its max |x| over the cache / 448\n");
    printf("error:     e = |o - o_ref| / max|o_ref| over the element's row (b, i, h: D values), "
           "o_ref fp64 attention over the fp32 cache; max and mean of e over all B*Sq*H*D "
           "elements, and norm: the largest |o - o_ref| / |o_ref| of a row (2-norms), in %%\n");
    printf("kernel:    max e against fp64 over the cache as stored, dequantized (the kernel's "
           "own rounding; checked <= %.0e)\n",
           AC_TOL);
    printf("bf16:      fp64 attention over the cache rounded to bf16, q fp32 (no kernel run): "
           "a 16-bit cache's error, for scale\n");
    printf("\n%-5s %-11s %-8s %7s | %9s %9s %9s | %8s %s\n", "cache", "scale", "inputs", "L",
           "max e %", "mean e %", "norm %", "kernel", "note");
    fflush(stdout);

    int bad = 0;
    double *target = cli_xmalloc(3 * sizeof(double) * (size_t)nlens, "target"); /* int8's err */
    for (int li = 0; li < nlens; li++) {
        ac_bufs a = {.L = lens[li], .sq = queries};
        a.nq = (size_t)AC_B * (size_t)queries * AC_H * AC_D;
        a.nrows = (size_t)AC_B * (size_t)a.L * AC_HK;
        a.nc = a.nrows * AC_D;
        a.q = cli_xmalloc(a.nq * sizeof(float), "q");
        a.out = cli_xmalloc(a.nq * sizeof(float), "out");
        a.k = cli_xmalloc(a.nc * sizeof(float), "k");
        a.v = cli_xmalloc(a.nc * sizeof(float), "v");
        a.kd = cli_xmalloc(a.nc * sizeof(float), "dequantized k");
        a.vd = cli_xmalloc(a.nc * sizeof(float), "dequantized v");
        a.ks = cli_xmalloc(a.nrows * sizeof(float), "k scales");
        a.vs = cli_xmalloc(a.nrows * sizeof(float), "v scales");
        a.k8 = cli_xmalloc(a.nc, "8-bit k");
        a.v8 = cli_xmalloc(a.nc, "8-bit v");
        a.ref = cli_xmalloc(a.nq * sizeof(double), "reference");
        a.refd = cli_xmalloc(a.nq * sizeof(double), "reference");
        a.od = cli_xmalloc(a.nq * sizeof(double), "out");
        a.s = cli_xmalloc((size_t)AC_G * (size_t)a.L * sizeof(double), "scores");
        const size_t qrows = a.nq / AC_D;
        for (int kind = 0; kind < AC_INPUTS; kind++) {
            double err[3], kerr[3];
            ac_inputs_fill(&a, kind);
            ac_reference(a.q, a.k, a.v, a.L, a.sq, a.s, a.ref);
            for (size_t i = 0; i < a.nc; i++) { /* bf16, for scale */
                a.kd[i] = fa_tool_bf16_to_f32(fa_tool_f32_to_bf16(a.k[i]));
                a.vd[i] = fa_tool_bf16_to_f32(fa_tool_f32_to_bf16(a.v[i]));
            }
            ac_reference(a.q, a.kd, a.vd, a.L, a.sq, a.s, a.refd);
            ac_error(a.refd, a.ref, qrows, err);
            ac_row("bf16", "-", kind, a.L, err, "-", "");
            for (int fi = 0; fi < AC_FORMATS; fi++) {
                const ac_format *f = &ac_formats[fi];
                ac_run_format(ctx, f, &a);
                ac_reference(a.q, a.kd, a.vd, a.L, a.sq, a.s, a.refd);
                ac_error(a.od, a.refd, qrows, kerr);
                char kernel[16];
                snprintf(kernel, sizeof kernel, "%.1e", kerr[0]);
                const int ok = kerr[0] <= AC_TOL;
                bad += !ok;
                ac_error(a.od, a.ref, qrows, err);
                if (fi == 0 && kind == 0)
                    memcpy(&target[3 * li], err, sizeof err);
                ac_row(f->name, f->scale, kind, a.L, err, kernel,
                       ok ? "" : "CHECK FAILED (kernel vs fp64)");
            }
        }
        free(a.q);
        free(a.out);
        free(a.k);
        free(a.v);
        free(a.kd);
        free(a.vd);
        free(a.ks);
        free(a.vs);
        free(a.k8);
        free(a.v8);
        free(a.ref);
        free(a.refd);
        free(a.od);
        free(a.s);
    }
    printf("\ntarget: int8 (per token) on normal inputs, error <= %.0f%% (max e, mean e, row "
           "norm):",
           100.0 * AC_TARGET);
    for (int li = 0; li < nlens; li++) {
        printf("%s L=%ld", li ? ";" : "", lens[li]);
        for (int k = 0; k < 3; k++)
            printf(" %.2f%% %s", 100.0 * target[3 * li + k],
                   target[3 * li + k] <= AC_TARGET ? "yes" : "no");
    }
    printf("\n");
    free(target);
    if (bad) {
        fprintf(stderr, "flashattn: bench-decode --accuracy: %d row%s failed the kernel check\n",
                bad, bad == 1 ? "" : "s");
        return 1;
    }
    return 0;
}
