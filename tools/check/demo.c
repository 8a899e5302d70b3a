/* SPDX-License-Identifier: MIT */
/*
 * tools/check/ — the checks a user runs: `flashattn verify` (against the fp64 reference) and
 * `flashattn demo`.
 *
 * demo.c — `flashattn demo`: one attention forward on a long sequence, to show what the library
 * is for. Prints the shape, the wall time (median of 3 runs when one run is quick, else the
 * single first run, and it says which), GFLOP/s with flash-attn's convention (4·B·H·Sq·Sk·D,
 * halved for causal with Sq = Sk), and the memory the call really took — measured as the growth
 * of the process's peak resident set (VmHWM in /proc/self/status, or getrusage's ru_maxrss where
 * /proc is missing) across context creation and the first call, so it includes the library's
 * scratch and its threads' stacks — next to the fp32 N×N score matrix a naive implementation
 * would have to hold. Ends with a spot check of a few rows against the fp64 reference.
 *
 * Defaults (B=1, H=8, S=8192, D=64, causal, fp32: 68.7 GFLOP) take about 3-15 s on a 2-core
 * machine at the 5-20 GFLOP/s of a plain C kernel.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../cli/cli.h"
#include "attention_ref.h"
#include "flashattn.h"

#define REPEAT_BELOW_S 2.0 /* a first run faster than this is repeated twice more (median of 3) */

/* Peak resident set size in KiB: VmHWM from /proc/self/status, else ru_maxrss. *method names
 * the source used. Returns -1 if neither is available. */
static long peak_rss_kib(const char **method) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        long kib = -1;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "VmHWM:", 6) == 0) {
                kib = strtol(line + 6, NULL, 10);
                break;
            }
        }
        fclose(f);
        if (kib >= 0) {
            *method = "VmHWM in /proc/self/status";
            return kib;
        }
    }
    {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0) {
            *method = "getrusage ru_maxrss";
            return (long)ru.ru_maxrss; /* KiB on Linux */
        }
    }
    *method = "unavailable";
    return -1;
}

static void print_bytes(double bytes) {
    if (bytes >= 1024.0 * 1024.0 * 1024.0)
        printf("%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
    else if (bytes >= 1024.0 * 1024.0)
        printf("%.1f MiB", bytes / (1024.0 * 1024.0));
    else
        printf("%.0f KiB", bytes / 1024.0);
}

/* *maxerr = max(*maxerr, |got - ref|), where a non-finite value counts as infinitely wrong. */
static void note_err(double *maxerr, double got, double ref) {
    double e = isfinite(got) && isfinite(ref) ? fabs(got - ref) : INFINITY;
    if (e > *maxerr)
        *maxerr = e;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void demo_usage(FILE *f) {
    fprintf(f,
            "usage: flashattn demo [--seqlen N] [--heads N] [--dim N] [--batch N]\n"
            "                      [--causal | --no-causal] [--dtype f32|f16|bf16] [--threads N]\n"
            "\n"
            "One attention forward on a long sequence: time, GFLOP/s, and the memory it used\n"
            "next to what a naive N x N implementation would need.\n"
            "\n"
            "  --seqlen N    sequence length Sq = Sk (default 8192)\n"
            "  --heads N     heads H (default 8)\n"
            "  --dim N       head dimension D, 1..256 (default 64)\n"
            "  --batch N     batch B (default 1)\n"
            "  --causal      causal mask (default); --no-causal for full attention\n"
            "  --dtype T     f32 (default), f16 or bf16\n"
            "  --threads N   use a context with N threads (default: the default context)\n");
}

int cmd_demo(int argc, char **argv) {
    long S = 8192, H = 8, D = 64, B = 1, threads = 0;
    int causal = 1;
    fa_dtype t = FA_DTYPE_F32;
    fa_context *ctx = NULL;
    fa_params params;
    fa_tensor tq, tk, tv, tout, tlse;
    int64_t shape[4], lshape[3];
    size_t n, nl, i;
    void *q, *k, *v, *out;
    float *lse;
    double flops, times[3], tmed, t0, naive_bytes, io_bytes;
    long hwm0, hwm1;
    const char *method = "";
    int runs = 1, a;
    cli_rng rng;

    for (a = 1; a < argc; a++) {
        const char *val = NULL;
        long *target = NULL;
        long lo = 1, hi = 0;
        const char *opt = argv[a];
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            demo_usage(stdout);
            return 0;
        } else if (!strcmp(opt, "--causal")) {
            causal = 1;
            continue;
        } else if (!strcmp(opt, "--no-causal")) {
            causal = 0;
            continue;
        } else if (cli_opt_value(argc, argv, &a, "--dtype", &val)) {
            if (cli_parse_dtype(val, &t) != 0) {
                fprintf(stderr, "flashattn demo: --dtype must be f32, f16 or bf16\n");
                return 2;
            }
            continue;
        } else if (cli_opt_value(argc, argv, &a, "--seqlen", &val)) {
            target = &S, hi = 1L << 22;
        } else if (cli_opt_value(argc, argv, &a, "--heads", &val)) {
            target = &H, hi = 4096;
        } else if (cli_opt_value(argc, argv, &a, "--dim", &val)) {
            target = &D, hi = 4096; /* the library checks its own limit (256) */
        } else if (cli_opt_value(argc, argv, &a, "--batch", &val)) {
            target = &B, hi = 1L << 20;
        } else if (cli_opt_value(argc, argv, &a, "--threads", &val)) {
            target = &threads, hi = 1024;
        } else {
            fprintf(stderr, "flashattn demo: unknown argument '%s'\n\n", opt);
            demo_usage(stderr);
            return 2;
        }
        if (cli_parse_long(val, lo, hi, target) != 0) {
            fprintf(stderr, "flashattn demo: %s needs an integer in %ld..%ld\n", opt, lo, hi);
            return 2;
        }
    }

    n = (size_t)B * (size_t)S * (size_t)H * (size_t)D;
    nl = (size_t)B * (size_t)H * (size_t)S;
    flops = 4.0 * (double)B * (double)H * (double)S * (double)S * (double)D * (causal ? 0.5 : 1.0);
    naive_bytes = (double)B * (double)H * (double)S * (double)S * 4.0;
    io_bytes = 4.0 * (double)n * (double)cli_dtype_size(t) + (double)nl * 4.0;

    printf("flashattn demo: one attention forward on a long sequence (libflashattn %s, cpu)\n",
           fa_version_string());
    printf("shape:   B=%ld H=%ld Sq=Sk=%ld D=%ld %s %s; q, k, v, out, lse: ", B, H, S, D,
           causal ? "causal" : "non-causal", cli_dtype_name(t));
    print_bytes(io_bytes);
    printf(" (caller-owned)\n");
    printf("work:    %.3g GFLOP (4*B*H*Sq*Sk*D%s); at 5-20 GFLOP/s that is %.2g-%.2g s a run\n",
           flops * 1e-9, causal ? ", halved for causal" : "", flops / 20e9, flops / 5e9);
    fflush(stdout);

    /* Inputs: uniform [-1, 1), written (so touched) before the memory baseline is taken. */
    rng.state = cli_fresh_seed();
    q = cli_xmalloc(n * cli_dtype_size(t), "q");
    k = cli_xmalloc(n * cli_dtype_size(t), "k");
    v = cli_xmalloc(n * cli_dtype_size(t), "v");
    out = cli_xmalloc(n * cli_dtype_size(t), "out");
    lse = cli_xmalloc(nl * sizeof(float), "lse");
    for (i = 0; i < n; i++) {
        cli_store(q, t, i, cli_rng_uniform(&rng));
        cli_store(k, t, i, cli_rng_uniform(&rng));
        cli_store(v, t, i, cli_rng_uniform(&rng));
    }
    cli_poison(out, t, n);
    cli_poison(lse, FA_DTYPE_F32, nl);

    shape[0] = B;
    shape[1] = S;
    shape[2] = H;
    shape[3] = D;
    lshape[0] = B;
    lshape[1] = H;
    lshape[2] = S;
    tq = fa_tensor_contiguous(q, t, 4, shape);
    tk = fa_tensor_contiguous(k, t, 4, shape);
    tv = fa_tensor_contiguous(v, t, 4, shape);
    tout = fa_tensor_contiguous(out, t, 4, shape);
    tlse = fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, lshape);
    fa_params_init(&params);
    params.causal = causal;

    /* Memory: peak RSS before creating the context (nothing has been freed yet, so the peak is
     * the current RSS), and after the first call. */
    hwm0 = peak_rss_kib(&method);
    if (threads > 0) {
        fa_context_options opts;
        fa_context_options_init(&opts);
        opts.num_threads = (int32_t)threads;
        CLI_CHECK("fa_context_create", fa_context_create(&opts, &ctx));
    }
    printf("threads: %d (%s)\n", (int)fa_context_num_threads(ctx),
           ctx ? "--threads" : "default context"); /* creates the default context, if used */
    fflush(stdout);

    t0 = cli_now();
    CLI_CHECK("fa_forward", fa_forward(ctx, &params, &tq, &tk, &tv, &tout, &tlse));
    times[0] = cli_now() - t0;
    hwm1 = peak_rss_kib(&method);
    if (times[0] < REPEAT_BELOW_S) {
        for (runs = 1; runs < 3; runs++) {
            t0 = cli_now();
            CLI_CHECK("fa_forward", fa_forward(ctx, &params, &tq, &tk, &tv, &tout, &tlse));
            times[runs] = cli_now() - t0;
        }
        qsort(times, 3, sizeof times[0], cmp_double);
        tmed = times[1];
        printf("time:    %.4f s (median of 3 runs; the first includes any lazy set-up)\n", tmed);
    } else {
        tmed = times[0];
        printf("time:    %.3f s (1 run: a run takes over %.0f s, so it was not repeated)\n", tmed,
               REPEAT_BELOW_S);
    }
    printf("speed:   %.2f GFLOP/s\n", flops / tmed * 1e-9);

    if (hwm0 >= 0 && hwm1 >= 0) {
        double grown = (double)(hwm1 - hwm0) * 1024.0;
        printf("memory:  +");
        print_bytes(grown);
        printf(" peak-RSS growth across context creation + the first call\n"
               "         method: %s, read before and after; it counts the library's\n"
               "         scratch, its threads' stacks and anything else the process touched "
               "meanwhile\n"
               "         (page-granular; the caller-owned tensors above are not counted)\n",
               method);
        printf("naive:   ");
        print_bytes(naive_bytes);
        printf(" for the fp32 Sq x Sk score matrix alone (B*H*Sq*Sk*4 bytes)\n");
        if (grown >= 4096.0)
            printf("ratio:   naive / measured = %.0fx\n", naive_bytes / grown);
        else
            printf("ratio:   naive / measured > %.0fx (growth below one 4 KiB page)\n",
                   naive_bytes / 4096.0);
    } else {
        printf("memory:  not measured (no /proc/self/status and no getrusage)\n");
        printf("naive:   ");
        print_bytes(naive_bytes);
        printf(" for the fp32 Sq x Sk score matrix alone (B*H*Sq*Sk*4 bytes)\n");
    }

    /* Spot check: a few rows against the fp64 reference. Row i of a causal Sq = Sk problem is
     * the last row of the problem with keys 0..i, so each row is one Sq = 1 reference call. */
    {
        const int64_t rows[4] = {0, S / 2, S - 1, (int64_t)(cli_rng_next(&rng) % (uint64_t)S)};
        const double tol = t == FA_DTYPE_F32 ? 1e-5 : t == FA_DTYPE_F16 ? 2e-3 : 1.6e-2;
        double err_out = 0.0, err_lse = 0.0, max_lse = 1.0, tol_lse;
        size_t nonfinite = 0;
        double *qr = cli_xmalloc((size_t)D * sizeof(double), "reference q");
        double *kr = cli_xmalloc((size_t)S * (size_t)D * sizeof(double), "reference k");
        double *vr = cli_xmalloc((size_t)S * (size_t)D * sizeof(double), "reference v");
        double *orow = cli_xmalloc((size_t)D * sizeof(double), "reference out");
        int r;

        for (i = 0; i < n; i++)
            if (!isfinite(cli_load(out, t, i)))
                nonfinite++;
        for (r = 0; r < 4; r++) {
            const int64_t row = rows[r];
            const int64_t b = (int64_t)(cli_rng_next(&rng) % (uint64_t)B);
            const int64_t h = (int64_t)(cli_rng_next(&rng) % (uint64_t)H);
            const int64_t sk = causal ? row + 1 : S;
            ref_problem p;
            double lrow, got;
            int64_t j, d;
            for (d = 0; d < D; d++)
                qr[d] = cli_load(q, t, (size_t)(((b * S + row) * H + h) * D + d));
            for (j = 0; j < sk; j++)
                for (d = 0; d < D; d++) {
                    size_t src = (size_t)(((b * S + j) * H + h) * D + d);
                    kr[j * D + d] = cli_load(k, t, src);
                    vr[j * D + d] = cli_load(v, t, src);
                }
            memset(&p, 0, sizeof p);
            p.B = 1;
            p.Sq = 1;
            p.Sk = sk;
            p.H = 1;
            p.Hk = 1;
            p.D = D;
            p.scale = 1.0 / sqrt((double)D);
            p.window_left = -1;
            p.window_right = -1;
            ref_attention_forward(&p, qr, kr, vr, orow, &lrow);
            for (d = 0; d < D; d++) {
                got = cli_load(out, t, (size_t)(((b * S + row) * H + h) * D + d));
                note_err(&err_out, got, orow[d]);
            }
            got = (double)lse[(b * H + h) * S + row];
            note_err(&err_lse, got, lrow);
            if (fabs(lrow) > max_lse)
                max_lse = fabs(lrow);
        }
        tol_lse = tol * max_lse;
        {
            int pass = nonfinite == 0 && err_out <= tol && err_lse <= tol_lse;
            printf("check:   4 rows vs the fp64 reference: max err out %.2e (tol %.1e), lse %.2e "
                   "(tol %.1e); %zu non-finite outputs: %s\n",
                   err_out, tol, err_lse, tol_lse, nonfinite, pass ? "PASS" : "FAIL");
            free(qr);
            free(kr);
            free(vr);
            free(orow);
            free(q);
            free(k);
            free(v);
            free(out);
            free(lse);
            fa_context_destroy(ctx);
            return pass ? 0 : 1;
        }
    }
}
