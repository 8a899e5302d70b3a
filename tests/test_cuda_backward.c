/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_backward.c — fa_backward and fa_varlen_backward on CUDA tensors (the plug-in's
 * backward) against the fp64 reference and the CPU backend, through the public API only.
 *
 * Without a usable CUDA device it prints "SKIP: no CUDA device: <why>" and exits 77 (ctest:
 * skipped). ctest also runs it against the emulated plug-in (tests/cuda_emu: the plug-in's own
 * kernels on the CPU) and against tests/fake_cuda_plugin.c (the core's CUDA path only).
 *
 * Each case (backward_check.h, bcfg.cuda) draws fresh inputs, runs the forward and then the
 * backward on device copies of every tensor (outputs poisoned with NaN, gaps of strided views
 * NaN), and checks the gradients against the fp64 reference with backward_check.h's
 * tolerances; then the same case runs on the CPU backend from the same inputs (also held to
 * the reference), and the device's gradients must match the CPU's elementwise:
 * |gpu - cpu| <= 4 ulp_dtype(R) (fp16/bf16) or 4e-5 R (fp32), plus 2·4·u·max bnd, R = max|cpu|
 * of the gradient. Two results within backward_check.h's first bound of the same exact gradient
 * differ by at most ulp_dtype(R) (half an ulp each) or 2e-5 R (fp32), plus twice its fp32
 * accumulation term 4·u·bnd, which matters where a gradient cancels to nothing (with one key
 * dS = 0 exactly and both results are rounding noise); a different dropout mask, a missed
 * query head of a GQA group or a wrong row moves a gradient by far more. The tensor-core
 * kernels also round P and dS to the dtype (up to 2^-8 of each term for bf16), which that
 * bound leaves out; on these shapes the emulated plug-in's largest difference was 0.25 of the
 * tolerance (the summary line prints it).
 * Non-finite inputs: NaN and infinities planted in q, k, v or dout give NaN and infinite
 * gradients exactly where the CPU backend's are (docs/semantics.md's rule), the same values
 * elsewhere. Determinism: a case run twice on the device gives bitwise equal results. Errors
 * (gradients or lse on the host, dq on another device index): a clear status, and no byte of
 * any device or host buffer changed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward_check.h"
#include "flashattn.h"
#include "test.h"
#include "testutil.h"

static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
static int32_t g_dev;
static double g_vs_cpu[8]; /* per dtype: max over cases of max|gpu - cpu| / tolerance */

/* max|a - b| over n elements, and max|b| in *R. */
static double max_diff(int64_t n, const double *a, const double *b, double *R) {
    double m = 0.0;
    *R = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs(a[i] - b[i]);
        m = d > m || d != d ? d : m;
        *R = fabs(b[i]) > *R ? fabs(b[i]) : *R;
    }
    return m;
}

/* Runs c on the device (checked against the reference), then again from the same inputs on
 * the CPU (second_cuda 0) or the device (1), as a repeat; results in *first and *second.
 * Returns 1 when both runs passed bc_run's checks. */
static int run_twice(bcfg c, int second_cuda, bc_result *first, bc_result *second) {
    const uint64_t rng = tu_rng_state_;
    c.cuda = 1;
    c.cuda_dev = g_dev;
    memset(first, 0, sizeof *first);
    memset(second, 0, sizeof *second);
    int ok = bc_run(&c, first);
    tu_rng_state_ = rng;
    c.cuda = second_cuda;
    c.repeat = 1; /* the same inputs, already checked against the reference */
    return ok & bc_run(&c, second);
}

/* Runs c on the device, then on the CPU from the same inputs; checks both against the
 * reference (bc_run) and the device's gradients against the CPU's. Returns 1 on pass. */
static int run_case(bcfg c) {
    bc_result gpu, cpu;
    int ok = run_twice(c, 0, &gpu, &cpu);
    char name[768];
    bc_describe(&c, name, sizeof name);
    CASE_BEGIN("device vs CPU backend: %s", name);
    if (gpu.dq && cpu.dq) {
        const double *g[3] = {gpu.dq, gpu.dk, gpu.dv}, *h[3] = {cpu.dq, cpu.dk, cpu.dv};
        const int64_t n[3] = {gpu.nq, gpu.nk, gpu.nk};
        for (int t = 0; t < 3; t++) {
            double R;
            const double d = max_diff(n[t], g[t], h[t], &R);
            const double tol = (c.dtype == FA_DTYPE_F32 ? 4e-5 * R : 4.0 * tu_ulp(c.dtype, R)) +
                               2.0 * BC_F32_BOUND_ULPS * 0x1.0p-24 * gpu.bnd_max[t];
            const double ratio = tol > 0.0 ? d / tol : d > 0.0 ? INFINITY : 0.0;
            g_vs_cpu[c.dtype] = ratio > g_vs_cpu[c.dtype] ? ratio : g_vs_cpu[c.dtype];
            CHECK_MSG(d <= tol, "%s: max|gpu - cpu| = %.3g > %.3g (max|cpu| %.3g)",
                      bc_grad_names[t], d, tol, R);
        }
    } else {
        CHECK_MSG(0, "a run gave no gradients");
    }
    ok &= CASE_END();
    bc_result_free(&gpu);
    bc_result_free(&cpu);
    return ok;
}

static long g_cases, g_failed;

static void run_all_dtypes(bcfg c) {
    for (int t = 0; t < 3; t++) {
        c.dtype = k_dtypes[t];
        g_failed += !run_case(c);
        g_cases++;
    }
}

static void group_line(const char *group, long cases0, long failed0) {
    printf("%-28s %4ld cases, %ld failed\n", group, g_cases - cases0, g_failed - failed0);
    fflush(stdout);
}

/* Head dims: every tensor-core kernel's own (32 .. 256 in 32s are covered by 64, 128, 256) and
 * padded ones, and ones only the stage-1 kernel takes (1, 33). */
static void group_shapes(void) {
    const long c0 = g_cases, f0 = g_failed;
    static const int64_t dims[] = {1, 8, 33, 40, 64, 80, 128, 200, 256};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        run_all_dtypes(bc_cfg(2, 37, 45, 2, 2, dims[i]));
    run_all_dtypes(bc_cfg(1, 70, 20, 2, 1, 64)); /* Sq > Sk */
    run_all_dtypes(bc_cfg(1, 1, 90, 4, 2, 64));  /* one query */
    run_all_dtypes(bc_cfg(2, 20, 1, 2, 2, 32));  /* one key */
    group_line("shapes", c0, f0);
}

static void group_features(void) {
    const long c0 = g_cases, f0 = g_failed;
    bcfg c = bc_cfg(2, 50, 66, 4, 2, 64);
    c.causal = 1;
    run_all_dtypes(c);
    c = bc_cfg(1, 66, 50, 4, 4, 40); /* causal with Sq > Sk: rows that see no key */
    c.causal = 1;
    run_all_dtypes(c);
    c = bc_cfg(1, 60, 60, 2, 2, 64);
    c.wl = 9;
    c.wr = 3;
    run_all_dtypes(c);
    c.causal = 1, c.wr = 0;
    run_all_dtypes(c);
    c = bc_cfg(2, 33, 41, 4, 2, 80);
    c.alibi = 1;
    run_all_dtypes(c);
    c.alibi = 2, c.causal = 1;
    run_all_dtypes(c);
    c = bc_cfg(1, 40, 40, 2, 2, 64);
    c.softcap = 2.5f;
    run_all_dtypes(c);
    c = bc_cfg(2, 30, 35, 8, 1, 64); /* MQA */
    c.scale = -0.3f;
    run_all_dtypes(c);
    c = bc_cfg(2, 30, 35, 4, 2, 64);
    c.kv_bcast = 1;
    run_all_dtypes(c);
    c = bc_cfg(2, 29, 31, 4, 2, 48);
    c.dropout_p = 0.25f;
    c.dropout_seed = tu_next_u64();
    c.dropout_offset = tu_next_u64();
    run_all_dtypes(c);
    c.causal = 1, c.alibi = 1, c.softcap = 3.0f;
    run_all_dtypes(c);
    group_line("features", c0, f0);
}

static void group_layouts(void) {
    const long c0 = g_cases, f0 = g_failed;
    for (int l = 1; l < TU_NUM_LAYOUTS; l++) {
        bcfg c = bc_cfg(2, 19, 23, 2, 2, 64);
        c.lq = c.lk = c.lv = c.lo = c.ldo = c.ldq = c.ldk = c.ldv = l;
        c.llse = l % 2;
        run_all_dtypes(c);
    }
    group_line("layouts", c0, f0);
}

static void group_varlen(void) {
    const long c0 = g_cases, f0 = g_failed;
    bcfg c = bc_cfg(0, 0, 0, 4, 2, 64);
    c.nseq = 4;
    const int32_t sq[4] = {17, 0, 1, 40}, sk[4] = {20, 5, 1, 33};
    memcpy(c.seq_q, sq, sizeof sq);
    memcpy(c.seq_k, sk, sizeof sk);
    c.lead_q = 3, c.tail_q = 2, c.lead_k = 1, c.tail_k = 4;
    c.extra_max = 5;
    run_all_dtypes(c);
    c.causal = 1, c.wl = 7;
    run_all_dtypes(c);
    c.causal = 0, c.wl = -1, c.alibi = 2, c.dropout_p = 0.1f;
    c.dropout_seed = tu_next_u64();
    run_all_dtypes(c);
    group_line("varlen", c0, f0);
}

/* Two device runs of one case from the same inputs: bitwise equal. */
static void group_determinism(void) {
    const long c0 = g_cases, f0 = g_failed;
    for (int t = 0; t < 3; t++) {
        bcfg c = bc_cfg(2, 75, 90, 4, 2, 64);
        c.causal = t == 1;
        c.dtype = k_dtypes[t];
        bc_result a, b;
        int ok = run_twice(c, 1, &a, &b);
        CASE_BEGIN("determinism: %s, two device runs bitwise equal", tu_dtype_name(c.dtype));
        CHECK(bc_same_result(&a, &b));
        ok &= CASE_END();
        g_failed += !ok;
        g_cases++;
        bc_result_free(&a);
        bc_result_free(&b);
    }
    group_line("determinism", c0, f0);
}

/* ---------------------------------------------------------------------------------------------
 * Non-finite inputs (the rule of docs/semantics.md, which tests/test_nonfinite.c holds the CPU
 * backend to): a NaN or an infinity planted in q, k, v or dout of a causal, sliding-window GQA
 * problem; the device's gradients, from the same out and lse (the CPU forward's), must be NaN
 * and infinite exactly where the CPU backend's are, and match them elsewhere.
 * ------------------------------------------------------------------------------------------- */

static void nonfinite_case(int dtype, char what, int64_t row, double val) {
    const int64_t S = 12, H = 2, Hk = 1, D = 16, qs[4] = {1, S, H, D}, ks[4] = {1, S, Hk, D};
    const int64_t ls[3] = {1, H, S};
    CASE_BEGIN("nonfinite: %s, %g planted in %c row %lld", tu_dtype_name(dtype), val, what,
               (long long)row);
    tu_tensor q, k, v, out, dout, lse, g[2][3]; /* g[0]: CPU gradients, g[1]: device */
    tu_alloc(&q, dtype, 4, qs, TU_CONTIG);
    tu_alloc(&k, dtype, 4, ks, TU_CONTIG);
    tu_alloc(&v, dtype, 4, ks, TU_CONTIG);
    tu_alloc(&out, dtype, 4, qs, TU_CONTIG);
    tu_alloc(&dout, dtype, 4, qs, TU_CONTIG);
    tu_alloc(&lse, FA_DTYPE_F32, 3, ls, TU_CONTIG);
    for (int r = 0; r < 2; r++) {
        tu_alloc(&g[r][0], dtype, 4, qs, TU_CONTIG);
        tu_alloc(&g[r][1], dtype, 4, ks, TU_CONTIG);
        tu_alloc(&g[r][2], dtype, 4, ks, TU_CONTIG);
    }
    double *vals = bc_dalloc(S * H * D); /* tu_fill_normal's copy of the values, unused */
    tu_fill_normal(&q, 1.0, vals);
    tu_fill_normal(&k, 1.0, vals);
    tu_fill_normal(&v, 1.0, vals);
    tu_fill_normal(&dout, 1.0, vals);
    free(vals);
    tu_tensor *planted = what == 'q' ? &q : what == 'k' ? &k : what == 'v' ? &v : &dout;
    const int64_t heads = what == 'k' || what == 'v' ? Hk : H;
    tu_store(planted->buf, dtype, (row * heads + 0) * D + 3, val);

    fa_params prm;
    fa_params_init(&prm);
    prm.causal = 1;
    prm.window_left = 2;
    fa_status st = fa_forward(NULL, &prm, &q.t, &k.t, &v.t, &out.t, &lse.t);
    CHECK_MSG(st == FA_OK, "CPU forward: %s", fa_last_error_message());
    st = fa_backward(NULL, &prm, &q.t, &k.t, &v.t, &out.t, &dout.t, &lse.t, &g[0][0].t, &g[0][1].t,
                     &g[0][2].t);
    CHECK_MSG(st == FA_OK, "CPU backward: %s", fa_last_error_message());
    tu_tensor *dev[9] = {&q, &k, &v, &out, &dout, &lse, &g[1][0], &g[1][1], &g[1][2]};
    for (int t = 0; t < 9; t++)
        bc_upload(dev[t], g_dev);
    st = fa_backward(NULL, &prm, &q.t, &k.t, &v.t, &out.t, &dout.t, &lse.t, &g[1][0].t, &g[1][1].t,
                     &g[1][2].t);
    CHECK_MSG(st == FA_OK, "device backward: %s", fa_last_error_message());
    for (int t = 0; t < 9; t++)
        bc_download(dev[t]);
    long nonfinite = 0;
    for (int t = 0; t < 3; t++) {
        const int64_t n = g[0][t].numel;
        double R = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double c = tu_load(g[0][t].buf, dtype, i);
            R = isfinite(c) && fabs(c) > R ? fabs(c) : R;
        }
        const double tol = dtype == FA_DTYPE_F32 ? 4e-5 * R : 4.0 * tu_ulp(dtype, R);
        for (int64_t i = 0; i < n; i++) {
            const double c = tu_load(g[0][t].buf, dtype, i), d = tu_load(g[1][t].buf, dtype, i);
            nonfinite += !isfinite(c);
            const int same = isfinite(c) ? isfinite(d) && fabs(c - d) <= tol
                             : isnan(c)  ? isnan(d)
                                         : c == d;
            CHECK_MSG(same, "%s[%lld] (row %lld, head %lld, d %lld): device %g, CPU %g",
                      bc_grad_names[t], (long long)i, (long long)(i / D / (t ? Hk : H)),
                      (long long)(i / D % (t ? Hk : H)), (long long)(i % D), d, c);
        }
    }
    /* the plant reached some gradient (else the case would test nothing) */
    CHECK_MSG(nonfinite > 0, "no gradient element is non-finite");
    tu_free(&q), tu_free(&k), tu_free(&v), tu_free(&out), tu_free(&dout), tu_free(&lse);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++)
            tu_free(&g[r][t]);
    g_failed += !CASE_END();
    g_cases++;
}

static void group_nonfinite(void) {
    const long c0 = g_cases, f0 = g_failed;
    for (int t = 0; t < 3; t++) {
        nonfinite_case(k_dtypes[t], 'q', 5, NAN);
        nonfinite_case(k_dtypes[t], 'k', 5, NAN);
        nonfinite_case(k_dtypes[t], 'k', 5, INFINITY);
        nonfinite_case(k_dtypes[t], 'k', 11, -INFINITY);
        nonfinite_case(k_dtypes[t], 'v', 5, NAN);
        nonfinite_case(k_dtypes[t], 'v', 0, INFINITY);
        nonfinite_case(k_dtypes[t], 'o', 7, NAN);
    }
    group_line("nonfinite", c0, f0);
}

/* ---------------------------------------------------------------------------------------------
 * Errors: a clear status, and no byte of any device buffer changed.
 * ------------------------------------------------------------------------------------------- */

typedef struct dbuf {
    fa_tensor t;
    unsigned char *host; /* the bytes uploaded */
    size_t bytes;
} dbuf;

/* A contiguous device tensor of random bytes. */
static dbuf dbuf_make(int dtype, int ndim, const int64_t *shape) {
    dbuf d;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    d.bytes = (size_t)n * tu_dtype_size(dtype);
    d.host = malloc(d.bytes);
    if (!d.host)
        abort();
    for (size_t i = 0; i < d.bytes; i++)
        d.host[i] = (unsigned char)tu_next_u64(); /* any bytes: the calls must not read them */
    void *p = NULL;
    fa_status st = fa_device_alloc(FA_DEVICE_CUDA, g_dev, d.bytes, &p);
    if (st == FA_OK)
        st = fa_device_copy(p, FA_DEVICE_CUDA, d.host, FA_DEVICE_CPU, g_dev, d.bytes);
    if (st != FA_OK)
        bc_device_fatal("dbuf_make", st);
    d.t = fa_tensor_contiguous(p, dtype, ndim, shape);
    d.t.device = FA_DEVICE_CUDA;
    d.t.device_index = g_dev;
    return d;
}

static int dbuf_unchanged(const dbuf *d) {
    unsigned char *now = malloc(d->bytes);
    if (!now)
        abort();
    const fa_status st =
        fa_device_copy(now, FA_DEVICE_CPU, d->t.data, FA_DEVICE_CUDA, g_dev, d->bytes);
    if (st != FA_OK)
        bc_device_fatal("dbuf_unchanged", st);
    const int same = memcmp(now, d->host, d->bytes) == 0;
    free(now);
    return same;
}

static void dbuf_free(dbuf *d) {
    const fa_status st = fa_device_free(FA_DEVICE_CUDA, g_dev, d->t.data);
    if (st != FA_OK)
        bc_device_fatal("dbuf_free", st);
    free(d->host);
}

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static void group_errors(void) {
    const long c0 = g_cases, f0 = g_failed;
    const int64_t qs[4] = {1, 9, 2, 16}, ls[3] = {1, 2, 9};
    enum { Q, K, V, O, DO, LSE, DQ, DK, DV, N };
    dbuf t[N];
    for (int i = 0; i < N; i++)
        t[i] = i == LSE ? dbuf_make(FA_DTYPE_F32, 3, ls) : dbuf_make(FA_DTYPE_F16, 4, qs);
    uint16_t host_dk[1 * 9 * 2 * 16];
    float host_lse[1 * 2 * 9];
    fa_tensor hdk = fa_tensor_contiguous(host_dk, FA_DTYPE_F16, 4, qs);
    fa_tensor hlse = fa_tensor_contiguous(host_lse, FA_DTYPE_F32, 3, ls);
    fa_tensor other_dev = t[DQ].t;
    other_dev.device_index = g_dev + 1;
    struct {
        const char *desc, *needle;
        int swap; /* which tensor is replaced */
        const fa_tensor *with;
        fa_status want;
    } cases[] = {
        {"dk on the host, q on the device", "dk: is on the CPU", DK, &hdk, FA_ERR_DEVICE},
        {"lse on the host, q on the device", "lse: is on the CPU", LSE, &hlse, FA_ERR_DEVICE},
        {"dq on another device index", "dq: is on CUDA device", DQ, &other_dev, FA_ERR_DEVICE},
    };
    for (size_t e = 0; e < sizeof cases / sizeof *cases; e++) {
        CASE_BEGIN("errors: %s", cases[e].desc);
        memset(host_dk, 0x5A, sizeof host_dk);
        memset(host_lse, 0x5A, sizeof host_lse);
        const fa_tensor *a[N];
        for (int i = 0; i < N; i++)
            a[i] = i == cases[e].swap ? cases[e].with : &t[i].t;
        fa_params prm;
        fa_params_init(&prm);
        const fa_status st =
            fa_backward(NULL, &prm, a[Q], a[K], a[V], a[O], a[DO], a[LSE], a[DQ], a[DK], a[DV]);
        CHECK_MSG(st == cases[e].want, "status %s, want %s (%s)", fa_status_name(st),
                  fa_status_name(cases[e].want), fa_last_error_message());
        CHECK_MSG(contains(fa_last_error_message(), cases[e].needle), "message \"%s\" lacks \"%s\"",
                  fa_last_error_message(), cases[e].needle);
        for (int i = 0; i < N; i++)
            CHECK_MSG(dbuf_unchanged(&t[i]), "device tensor %d changed", i);
        unsigned char ref[sizeof host_dk];
        memset(ref, 0x5A, sizeof ref);
        CHECK(memcmp(host_dk, ref, sizeof host_dk) == 0 &&
              memcmp(host_lse, ref, sizeof host_lse) == 0);
        g_failed += !CASE_END();
        g_cases++;
    }
    for (int i = 0; i < N; i++)
        dbuf_free(&t[i]);
    group_line("errors", c0, f0);
}

/* ---- attention sinks: the device's forward (out, lse) and backward (dq, dk, dv, dsinks) against
 * the CPU backend's from the same inputs (the CPU's sinks are held to the fp64 reference by
 * test_sinks.c). A head without a sink (-inf) among them; sq > sk with a window leaves rows
 * without a visible key (out = 0, lse = the sink). Tolerances: out 2 ulp of the dtype at 1
 * (|out| <= 1), lse 1e-3 (the tensor-core kernel's fast log2), gradients and dsinks 2e-2 (bf16),
 * 4e-3 (fp16) or 1e-4 (fp32) of their largest magnitude: the device's P and dS are rounded to
 * the dtype and its out differs from the CPU's by a rounding, which Δ carries into dsinks. ---- */

typedef struct sink_case {
    int dtype, varlen, causal, wl, wr;
    int64_t B, Sq, Sk, H, Hk, D;
    int64_t Dv;    /* v's head dim (out, dout, dv); 0: D */
    float dropout; /* dropout_p */
} sink_case;

static void *sink_dev(const void *host, size_t bytes) {
    void *d = NULL;
    if (fa_device_alloc(FA_DEVICE_CUDA, g_dev, bytes, &d) != FA_OK) return NULL;
    fa_device_copy(d, FA_DEVICE_CUDA, host, FA_DEVICE_CPU, g_dev, bytes);
    return d;
}

static fa_tensor sink_tensor(void *data, int dtype, int ndim, const int64_t *shape, int cuda) {
    fa_tensor t = fa_tensor_contiguous(data, dtype, ndim, shape);
    if (cuda) t.device = FA_DEVICE_CUDA, t.device_index = g_dev;
    return t;
}

/* One run on the CPU (cuda 0) or the device from the host inputs in[6] (q, k, v, dout, sinks,
 * cu_seqlens); results to host arrays res[6] (out, lse, dq, dk, dv, dsinks), poisoned first. */
static fa_status sink_run(const sink_case *c, int cuda, void *const in[6], const size_t in_b[6],
                          void *const res[6], const size_t res_b[6]) {
    const int64_t tq = c->B * c->Sq, tk = c->B * c->Sk;
    void *d_in[6], *d_res[6];
    for (int i = 0; i < 6; i++) {
        d_in[i] = cuda ? sink_dev(in[i], in_b[i]) : in[i];
        memset(res[i], 0xFF, res_b[i]);
        d_res[i] = cuda ? sink_dev(res[i], res_b[i]) : res[i];
    }
    const int64_t Dv = c->Dv ? c->Dv : c->D;
    const int64_t qf[4] = {c->B, c->Sq, c->H, c->D}, kf[4] = {c->B, c->Sk, c->Hk, c->D};
    const int64_t qv[3] = {tq, c->H, c->D}, kv[3] = {tk, c->Hk, c->D};
    const int64_t of[4] = {c->B, c->Sq, c->H, Dv}, vf[4] = {c->B, c->Sk, c->Hk, Dv};
    const int64_t ov[3] = {tq, c->H, Dv}, vv[3] = {tk, c->Hk, Dv};
    const int64_t lf[3] = {c->B, c->H, c->Sq}, lv[2] = {c->H, tq}, hs = c->H, cs = c->B + 1;
    const int nd = c->varlen ? 3 : 4;
    const int64_t *qs = c->varlen ? qv : qf, *ks = c->varlen ? kv : kf;
    const int64_t *os = c->varlen ? ov : of, *vs = c->varlen ? vv : vf;
    const fa_tensor q = sink_tensor(d_in[0], c->dtype, nd, qs, cuda);
    const fa_tensor k = sink_tensor(d_in[1], c->dtype, nd, ks, cuda);
    const fa_tensor v = sink_tensor(d_in[2], c->dtype, nd, vs, cuda);
    const fa_tensor dout = sink_tensor(d_in[3], c->dtype, nd, os, cuda);
    const fa_tensor cu = sink_tensor(d_in[5], FA_DTYPE_I32, 1, &cs, cuda);
    const fa_tensor out = sink_tensor(d_res[0], c->dtype, nd, os, cuda);
    const fa_tensor lse =
        sink_tensor(d_res[1], FA_DTYPE_F32, c->varlen ? 2 : 3, c->varlen ? lv : lf, cuda);
    const fa_tensor dq = sink_tensor(d_res[2], c->dtype, nd, qs, cuda);
    const fa_tensor dk = sink_tensor(d_res[3], c->dtype, nd, ks, cuda);
    const fa_tensor dv = sink_tensor(d_res[4], c->dtype, nd, vs, cuda);
    fa_params p;
    fa_params_init(&p);
    p.causal = c->causal, p.window_left = c->wl, p.window_right = c->wr;
    p.dropout_p = c->dropout, p.dropout_seed = 0x5eed, p.dropout_offset = 17;
    p.sinks = sink_tensor(d_in[4], FA_DTYPE_F32, 1, &hs, cuda);
    p.dsinks = sink_tensor(d_res[5], FA_DTYPE_F32, 1, &hs, cuda);
    fa_status st = c->varlen ? fa_varlen_forward(NULL, &p, &q, &k, &v, &cu, &cu, c->Sq, c->Sk,
                                                 &out, &lse)
                             : fa_forward(NULL, &p, &q, &k, &v, &out, &lse);
    if (st == FA_OK)
        st = c->varlen ? fa_varlen_backward(NULL, &p, &q, &k, &v, &out, &dout, &lse, &cu, &cu,
                                            c->Sq, c->Sk, &dq, &dk, &dv)
                       : fa_backward(NULL, &p, &q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv);
    for (int i = 0; cuda && i < 6; i++) {
        fa_device_copy(res[i], FA_DEVICE_CPU, d_res[i], FA_DEVICE_CUDA, g_dev, res_b[i]);
        fa_device_free(FA_DEVICE_CUDA, g_dev, d_res[i]);
        fa_device_free(FA_DEVICE_CUDA, g_dev, d_in[i]);
    }
    return st;
}

/* max |a - b| over n elements of dtype (NaN anywhere: infinity) and max |b| into *R. */
static double sink_diff(int dtype, const void *a, const void *b, int64_t n, double *R) {
    double d = 0.0;
    *R = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double x = tu_load(a, dtype, i), y = tu_load(b, dtype, i);
        const double e = x == y ? 0.0 : isnan(x) || isnan(y) ? INFINITY : fabs(x - y);
        d = e > d ? e : d;
        *R = fabs(y) > *R ? fabs(y) : *R;
    }
    return d;
}

static void sink_check(sink_case c) {
    const int64_t tq = c.B * c.Sq, tk = c.B * c.Sk, es = (int64_t)tu_dtype_size(c.dtype);
    const int64_t Dv = c.Dv ? c.Dv : c.D;
    const int64_t nq = tq * c.H * c.D, nk = tk * c.Hk * c.D;
    const int64_t no = tq * c.H * Dv, nv = tk * c.Hk * Dv;
    const size_t in_b[6] = {(size_t)(nq * es), (size_t)(nk * es), (size_t)(nv * es),
                            (size_t)(no * es), (size_t)c.H * 4, (size_t)(c.B + 1) * 4};
    const size_t res_b[6] = {in_b[3], (size_t)(c.H * tq) * 4, in_b[0], in_b[1], in_b[2], in_b[4]};
    void *in[6], *gpu[6], *cpu[6];
    for (int i = 0; i < 6; i++) {
        in[i] = malloc(in_b[i]);
        gpu[i] = malloc(res_b[i]);
        cpu[i] = malloc(res_b[i]);
    }
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < (t == 0 ? nq : t == 1 ? nk : t == 2 ? nv : no); i++)
            tu_store(in[t], c.dtype, i, 2.0 * tu_uniform() - 1.0);
    for (int64_t h = 0; h < c.H; h++)
        ((float *)in[4])[h] = h % 3 == 2 ? -INFINITY : (float)(2.0 * tu_uniform() + 0.5);
    for (int64_t b = 0; b <= c.B; b++) /* varlen: one cu_seqlens for q and k (Sq = Sk) */
        ((int32_t *)in[5])[b] = (int32_t)(b * c.Sq);
    const fa_status sc = sink_run(&c, 0, in, in_b, cpu, res_b);
    const fa_status sg = sink_run(&c, 1, in, in_b, gpu, res_b);
    CASE_BEGIN("sinks, device vs CPU: %s %s B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld Dv=%lld "
               "causal=%d window=(%d, %d) dropout=%g", tu_dtype_name(c.dtype),
               c.varlen ? "varlen" : "fixed", (long long)c.B, (long long)c.Sq, (long long)c.Sk,
               (long long)c.H, (long long)c.Hk, (long long)c.D, (long long)Dv, c.causal, c.wl,
               c.wr, (double)c.dropout);
    CHECK_MSG(sc == FA_OK && sg == FA_OK, "CPU %s, device %s (%s)", fa_status_name(sc),
              fa_status_name(sg), fa_last_error_message());
    const double g = c.dtype == FA_DTYPE_BF16 ? 2e-2 : c.dtype == FA_DTYPE_F16 ? 4e-3 : 1e-4;
    double R, d = sink_diff(c.dtype, gpu[0], cpu[0], no, &R);
    CHECK_MSG(d <= 2.0 * tu_ulp(c.dtype, 1.0) + 1e-6, "out: max|gpu - cpu| = %.3g", d);
    d = 0.0;
    for (int64_t i = 0; i < c.H * tq; i++) { /* lse: the same -inf, else within 1e-3 */
        const float x = ((float *)gpu[1])[i], y = ((float *)cpu[1])[i];
        const double e = x == y ? 0.0 : isfinite(x) && isfinite(y) ? fabs(x - y) : INFINITY;
        d = e > d ? e : d;
    }
    CHECK_MSG(d <= 1e-3, "lse: max|gpu - cpu| = %.3g", d);
    const char *names[4] = {"dq", "dk", "dv", "dsinks"};
    const int64_t n[4] = {nq, nk, nv, c.H};
    for (int t = 0; t < 4; t++) {
        d = sink_diff(t == 3 ? FA_DTYPE_F32 : c.dtype, gpu[2 + t], cpu[2 + t], n[t], &R);
        CHECK_MSG(d <= g * R + 1e-6, "%s: max|gpu - cpu| = %.3g (max|cpu| %.3g)", names[t], d, R);
    }
    for (int64_t h = 2; h < c.H; h += 3)
        CHECK_MSG(((float *)gpu[5])[h] == 0.0f, "dsinks[%lld] of a head without a sink: %g",
                  (long long)h, (double)((float *)gpu[5])[h]);
    g_failed += !CASE_END();
    g_cases++;
    for (int i = 0; i < 6; i++) free(in[i]), free(gpu[i]), free(cpu[i]);
}

static void group_sinks(void) {
    const long cases0 = g_cases, failed0 = g_failed;
    /* GQA, causal, the tensor-core kernels (fp16, bf16) and stage 1 (fp32) */
    for (int t = 0; t < 3; t++)
        sink_check((sink_case){k_dtypes[t], 0, 1, -1, -1, 2, 37, 50, 6, 2, 64, 0, 0.0f});
    /* sq > sk and a window: rows without a visible key; D = 40 */
    sink_check((sink_case){FA_DTYPE_F16, 0, 0, 2, 0, 2, 30, 12, 3, 1, 40, 0, 0.0f});
    sink_check((sink_case){FA_DTYPE_F32, 0, 0, 2, 0, 1, 30, 12, 3, 3, 40, 0, 0.0f});
    /* varlen (sequences of Sq queries and keys), causal */
    sink_check((sink_case){FA_DTYPE_BF16, 1, 1, -1, -1, 3, 21, 21, 4, 2, 64, 0, 0.0f});
    group_line("sinks", cases0, failed0);
}

/* A V head dim of its own (Dv != D: the stage-1 kernels), device vs CPU as group_sinks: MLA's
 * 192/128, Dv > D, odd dims; causal, window, GQA, varlen, dropout; a head without a sink. */
static void group_head_dims(void) {
    const long cases0 = g_cases, failed0 = g_failed;
    static const int64_t dims[4][2] = {{192, 128}, {64, 128}, {40, 24}, {8, 16}};
    for (int i = 0; i < 4; i++) {
        const int64_t D = dims[i][0], Dv = dims[i][1];
        for (int t = 0; t < 3; t++) /* GQA, causal */
            sink_check((sink_case){k_dtypes[t], 0, 1, -1, -1, 2, 13, 19, 6, 2, D, Dv, 0.0f});
        /* sq > sk and a window: rows without a visible key; dropout */
        sink_check((sink_case){FA_DTYPE_F32, 0, 0, 2, 0, 1, 17, 9, 3, 1, D, Dv, 0.2f});
        /* varlen, causal */
        sink_check((sink_case){FA_DTYPE_BF16, 1, 1, -1, -1, 3, 11, 11, 4, 2, D, Dv, 0.0f});
    }
    group_line("head dims (Dv != D)", cases0, failed0);
}

int main(void) {
    int32_t n = -1;
    const fa_status st = fa_device_count(FA_DEVICE_CUDA, &n);
    if (st != FA_OK || n <= 0) {
        const char *why = st != FA_OK ? fa_last_error_message() : "0 devices";
        printf("SKIP: no CUDA device: %s\n", why && *why ? why : fa_status_name(st));
        return TU_SKIP;
    }
    g_dev = 0;
    tu_seed_init("test_cuda_backward");
    printf("library %s; %s\n%d CUDA device(s); running on device %d\n", fa_version_string(),
           fa_build_info(), (int)n, (int)g_dev);
    fflush(stdout);

    group_errors();
    group_shapes();
    group_features();
    group_layouts();
    group_varlen();
    group_nonfinite();
    group_determinism();
    group_sinks();
    group_head_dims();

    for (int t = 0; t < 3; t++) {
        const int dt = k_dtypes[t];
        const bc_stats *s = &bc_grad_stats[dt];
        printf("%s: %ld gradient checks; max rel error vs fp64 dq %.3g dk %.3g dv %.3g; "
               "device vs CPU at most %.2f of its tolerance\n",
               tu_dtype_name(dt), s->cases, s->rel[0], s->rel[1], s->rel[2], g_vs_cpu[dt]);
    }
    return TEST_REPORT();
}
