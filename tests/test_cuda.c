/* SPDX-License-Identifier: MIT */
/*
 * test_cuda.c — the CUDA plug-in (libflashattn_cuda.so) against the fp64 reference and the CPU
 * backend, through the public API only (fa_device_* for memory, so no CUDA toolkit is needed).
 *
 * Without a usable CUDA device (no plug-in, no driver, or 0 GPUs) it prints
 * "SKIP: no CUDA device: <why>" and exits 77, which ctest reports as skipped.
 *
 * Forward cases (fa_forward / fa_varlen_forward on CUDA tensors): fresh random inputs are made
 * on the host, copied to the device with fa_device_copy, and the device out/lse are poisoned
 * (every byte 0xFF, a NaN in every float dtype) before each call. After the call they are copied
 * back and
 *  - checked against the fp64 reference with the dtype tolerances of test_forward.c
 *    (tu_check_attention: no element left NaN, fully masked rows exactly 0 / -inf, gaps of a
 *    strided view untouched);
 *  - checked against the CPU backend run on the same host inputs: the GPU's max error against
 *    the reference must not exceed twice the CPU backend's plus a small floor (see
 *    check_vs_cpu for the floors);
 *  - with dropout, also compared with the CPU output element by element (both use the Philox
 *    mask of fa_dropout_mask, so they agree to rounding; a different mask moves outputs by a
 *    good fraction of |v| / Sk, far beyond the tolerance, especially in fp32).
 * fa_dropout_mask on a device u8 tensor must equal the host mask byte for byte, gaps included.
 * Error paths check the status, that the message names the argument, and that no byte of any
 * device or host buffer changed. The tiles group runs D = 128 cases under each value of
 * FA_CUDA_TILE_D128 (the tensor-core kernel's two key blocks).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, strdup */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

#define MAXB 16

static int32_t g_dev;  /* the CUDA ordinal every case runs on */
static int32_t g_ndev; /* fa_device_count(FA_DEVICE_CUDA) */
static const char *g_case = "";

static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* ---------------------------------------------------------------------------------------------
 * Device memory through the public helpers. A failure here makes every later check meaningless
 * (and usually means a kernel left the context broken), so it ends the program.
 * ------------------------------------------------------------------------------------------- */

static void fatal_status(const char *what, fa_status st) {
    printf("FATAL in case \"%s\": %s: %s: %s\n", g_case, what, fa_status_name(st),
           fa_last_error_message());
    fflush(stdout);
    exit(1);
}

static long g_live_allocs; /* device allocations not yet freed */

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    fa_status st = fa_device_alloc(FA_DEVICE_CUDA, g_dev, bytes > 0 ? bytes : 1, &p);
    if (st != FA_OK)
        fatal_status("fa_device_alloc", st);
    if (!p) {
        printf("FATAL: fa_device_alloc returned FA_OK and a NULL pointer\n");
        exit(1);
    }
    g_live_allocs++;
    return p;
}

static void dev_free(void *p) {
    if (!p)
        return;
    fa_status st = fa_device_free(FA_DEVICE_CUDA, g_dev, p);
    if (st != FA_OK)
        fatal_status("fa_device_free", st);
    g_live_allocs--;
}

static void h2d(void *dst, const void *src, size_t bytes) {
    if (bytes == 0)
        return;
    fa_status st = fa_device_copy(dst, FA_DEVICE_CUDA, src, FA_DEVICE_CPU, g_dev, bytes);
    if (st != FA_OK)
        fatal_status("fa_device_copy host -> device", st);
}

static void d2h(void *dst, const void *src, size_t bytes) {
    if (bytes == 0)
        return;
    fa_status st = fa_device_copy(dst, FA_DEVICE_CPU, src, FA_DEVICE_CUDA, g_dev, bytes);
    if (st != FA_OK)
        fatal_status("fa_device_copy device -> host", st);
}

/* A device copy of a test tensor: same shape, strides and gaps (the gaps keep the host's 0xFF
 * bytes, so a kernel reading outside the view reads NaN, and one writing outside it is seen). */
typedef struct dtensor {
    fa_tensor t;
    void *p;
    size_t bytes;
} dtensor;

static void dt_upload(dtensor *d, const tu_tensor *h) {
    d->bytes = (size_t)(h->nbuf > 0 ? h->nbuf : 0) * tu_dtype_size(h->t.dtype);
    d->p = dev_alloc(d->bytes);
    h2d(d->p, h->buf, d->bytes);
    d->t = h->t;
    d->t.data = d->p;
    d->t.device = FA_DEVICE_CUDA;
    d->t.device_index = g_dev;
}

static void dt_download(const dtensor *d, tu_tensor *h) { d2h(h->buf, d->p, d->bytes); }

static void dt_free(dtensor *d) {
    dev_free(d->p);
    d->p = NULL;
}

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

static int contains_ci(const char *s, const char *sub) {
    size_t n = strlen(sub);
    for (; s && *s; s++) {
        size_t i = 0;
        while (i < n && s[i] && tolower((unsigned char)s[i]) == tolower((unsigned char)sub[i]))
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * One forward case (fixed length or varlen)
 * ------------------------------------------------------------------------------------------- */

typedef struct ccfg {
    int varlen;
    int64_t B, Sq, Sk; /* fixed length */
    int nseq;          /* varlen: sequences and their lengths */
    int32_t lq[MAXB], lk[MAXB];
    int32_t q_start, k_start, q_tail, k_tail; /* cu_seqlens[0]; rows after cu_seqlens[B] */
    int cu_dev;                               /* varlen: cu_seqlens in device memory */
    int64_t H, Hk, D;
    int causal, wl, wr;
    float softcap, scale; /* scale 0 = default */
    int alibi;            /* 0 none, 1 (H), 2 (B, H) */
    int dtype;
    int layout; /* tu_layout of q, k, v, out and lse */
    int no_lse;
    float dropout_p;
    const char *tile;    /* FA_CUDA_TILE_D128 for the GPU call (NULL: the environment's) */
    const char *kernels; /* FA_CUDA_KERNELS for the GPU call (NULL: the environment's) */
} ccfg;

static tu_errstats g_gpu[8], g_cpu[8]; /* vs fp64, per dtype */
static double g_worst_vs_cpu[8];       /* max over cases of gpu error / (2 cpu error + floor) */
static long g_cases_total;

static ccfg fixed_cfg(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D) {
    ccfg c;
    memset(&c, 0, sizeof c);
    c.B = B;
    c.Sq = Sq;
    c.Sk = Sk;
    c.H = H;
    c.Hk = Hk;
    c.D = D;
    c.wl = c.wr = -1;
    c.dtype = FA_DTYPE_F32;
    return c;
}

static ccfg varlen_cfg(int nseq, const int32_t *lq, const int32_t *lk, int64_t H, int64_t Hk,
                       int64_t D) {
    ccfg c = fixed_cfg(0, 0, 0, H, Hk, D);
    c.varlen = 1;
    c.nseq = nseq;
    for (int b = 0; b < nseq; b++) {
        c.lq[b] = lq[b];
        c.lk[b] = lk[b];
    }
    return c;
}

static void describe(const ccfg *c, char *buf, size_t n) {
    int pos;
    if (c->varlen) {
        pos = snprintf(buf, n, "varlen %s lens q/k=", tu_dtype_name(c->dtype));
        for (int b = 0; b < c->nseq && pos < 200; b++)
            pos += snprintf(buf + pos, n - (size_t)pos, "%s%d/%d", b ? "," : "", (int)c->lq[b],
                            (int)c->lk[b]);
        pos += snprintf(buf + pos, n - (size_t)pos, " start=%d/%d tail=%d/%d cu_seqlens on %s",
                        (int)c->q_start, (int)c->k_start, (int)c->q_tail, (int)c->k_tail,
                        c->cu_dev ? "device" : "host");
    } else {
        pos = snprintf(buf, n, "%s B=%lld Sq=%lld Sk=%lld", tu_dtype_name(c->dtype),
                       (long long)c->B, (long long)c->Sq, (long long)c->Sk);
    }
    snprintf(buf + pos, n - (size_t)pos,
             " H=%lld Hk=%lld D=%lld causal=%d window=(%d,%d) softcap=%g scale=%g alibi=%s "
             "layout=%s lse=%s dropout=%g",
             (long long)c->H, (long long)c->Hk, (long long)c->D, c->causal, c->wl, c->wr,
             (double)c->softcap, (double)c->scale,
             c->alibi == 0   ? "none"
             : c->alibi == 1 ? "(H)"
                             : "(B,H)",
             tu_layout_name(c->layout), c->no_lse ? "none" : "yes", (double)c->dropout_p);
    if (c->tile)
        snprintf(buf + strlen(buf), n - strlen(buf), " FA_CUDA_TILE_D128=%s", c->tile);
    if (c->kernels)
        snprintf(buf + strlen(buf), n - strlen(buf), " FA_CUDA_KERNELS=%s", c->kernels);
}

/* Max |x - ref| over elements where both are finite (non-finite ones are tu_check_attention's
 * business); *maxref gets max |ref| over finite ref. */
static double max_err(int64_t n, const double *x, const double *ref, double *maxref) {
    double e = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(ref[i]))
            continue;
        if (fabs(ref[i]) > m)
            m = fabs(ref[i]);
        if (isfinite(x[i]) && fabs(x[i] - ref[i]) > e)
            e = fabs(x[i] - ref[i]);
    }
    if (maxref)
        *maxref = m;
    return e;
}

/* The GPU must be no less accurate than the CPU backend on the same inputs:
 *   max|gpu - ref| <= 2 * max|cpu - ref| + floor,
 * for out and (when requested) lse. The floors, absolute, are what two correct implementations
 * may differ by through rounding alone, so a GPU exactly as good as the CPU never fails on a
 * case where the CPU happens to be nearly exact:
 *   out fp32:      2e-6 * max(1, max|ref|) plus the score-rounding term of tu_check_attention
 *                  (8 * 2^-24 * max|lse_ref| * max(1, max|ref|)): a few fp32 roundings of O(1)
 *                  outputs summed in another order;
 *   out fp16/bf16: one ulp of the dtype at max|ref| (rounding the output costs half an ulp, a
 *                  near-tie rounded the other way another half);
 *   lse (fp32 in every dtype, computed from inputs exact in fp32): 2e-6 * max(1, max|lse_ref|).
 * Returns 1 when it passes. */
static int check_vs_cpu(const ccfg *c, int64_t nout, const double *gpu, const double *cpu,
                        const double *ref, int64_t nlse, const double *lgpu, const double *lcpu,
                        const double *lref) {
    int ok = 1;
    double maxref = 0.0, lmax = 0.0;
    const double eg = max_err(nout, gpu, ref, &maxref), ec = max_err(nout, cpu, ref, NULL);
    double lg = 0.0, lc = 0.0;
    if (!c->no_lse) {
        lg = max_err(nlse, lgpu, lref, &lmax);
        lc = max_err(nlse, lcpu, lref, NULL);
    }
    const double s1 = maxref > 1.0 ? maxref : 1.0, l1 = lmax > 1.0 ? lmax : 1.0;
    double floor_out;
    if (c->dtype == FA_DTYPE_F32)
        floor_out = 2e-6 * s1 + 8.0 * 0x1p-24 * lmax * s1;
    else
        floor_out = tu_ulp(c->dtype, maxref);
    const double tol = 2.0 * ec + floor_out;
    if (!(eg <= tol)) {
        CHECK_MSG(0, "GPU out error %.3g > 2 x CPU error %.3g + floor %.3g (max|ref| %.3g)", eg, ec,
                  floor_out, maxref);
        ok = 0;
    }
    if (eg / tol > g_worst_vs_cpu[c->dtype])
        g_worst_vs_cpu[c->dtype] = eg / tol;
    if (!c->no_lse) {
        const double ltol = 2.0 * lc + 2e-6 * l1;
        if (!(lg <= ltol)) {
            CHECK_MSG(0, "GPU lse error %.3g > 2 x CPU error %.3g + floor %.3g", lg, lc, 2e-6 * l1);
            ok = 0;
        }
    }
    return ok;
}

/* Dropout: GPU and CPU use the same mask, so they agree to rounding. Tolerance per element: the
 * reference tolerance of tu_check_attention (fp32: 1e-5 * max(1, max|ref|); fp16/bf16:
 * 2 * max|naive - ref| + ulp(max|ref|)); one key dropped on one side and kept on the other moves
 * an output by p_j * |v_j| / (1 - p), typically |v| / Sk, which the small-Sk cases below put far
 * above it. */
static void check_dropout_direct(const ccfg *c, int64_t nout, const double *gpu, const double *cpu,
                                 const double *ref, const double *naive) {
    double maxref = 0.0;
    const double nerr = c->dtype == FA_DTYPE_F32 ? 0.0 : max_err(nout, naive, ref, &maxref);
    if (c->dtype == FA_DTYPE_F32)
        max_err(nout, ref, ref, &maxref);
    const double tol = c->dtype == FA_DTYPE_F32 ? 1e-5 * (maxref > 1.0 ? maxref : 1.0)
                                                : 2.0 * nerr + tu_ulp(c->dtype, maxref);
    int64_t bad = 0, worst = -1;
    double we = 0.0;
    for (int64_t i = 0; i < nout; i++) {
        const double e = fabs(gpu[i] - cpu[i]);
        if (!(e <= tol)) {
            bad++;
            if (!(e <= we)) {
                we = e;
                worst = i;
            }
        }
    }
    CHECK_MSG(bad == 0,
              "dropout: %lld outputs differ between GPU and CPU by more than %.3g (worst at flat "
              "%lld: GPU %.9g, CPU %.9g): not the same mask?",
              (long long)bad, tol, (long long)worst, worst >= 0 ? gpu[worst] : 0.0,
              worst >= 0 ? cpu[worst] : 0.0);
}

/* Sets FA_CUDA_TILE_D128 to tile; returns its previous value (malloc'd, NULL when unset) for
 * tile_env_restore, which puts it back and frees it. */
/* Sets the environment variable name to value; returns its old value for env_restore. */
static char *env_set(const char *name, const char *value) {
    const char *cur = getenv(name);
    char *saved = cur ? strdup(cur) : NULL;
    setenv(name, value, 1);
    return saved;
}

static void env_restore(const char *name, char *saved) {
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

static int run_case(const ccfg *c) {
    char name[640];
    describe(c, name, sizeof name);
    g_case = name;
    CASE_BEGIN("%s", name);
    g_cases_total++;

    const int vl = c->varlen;
    const int64_t H = c->H, Hk = c->Hk, D = c->D;
    const int64_t nb = vl ? c->nseq : c->B; /* batches: ALiBi (B, H) and the dropout mask */
    int32_t cuq[MAXB + 1], cuk[MAXB + 1];
    int64_t maxq, maxk, tq = 0, tk = 0;
    if (vl) {
        maxq = maxk = 0;
        cuq[0] = c->q_start;
        cuk[0] = c->k_start;
        for (int b = 0; b < c->nseq; b++) {
            cuq[b + 1] = cuq[b] + c->lq[b];
            cuk[b + 1] = cuk[b] + c->lk[b];
            if (c->lq[b] > maxq)
                maxq = c->lq[b];
            if (c->lk[b] > maxk)
                maxk = c->lk[b];
        }
        tq = cuq[c->nseq] + c->q_tail;
        tk = cuk[c->nseq] + c->k_tail;
    } else {
        maxq = c->Sq;
        maxk = c->Sk;
    }
    /* the layout tu_check_attention reads: (CB, CS, H, D) and lse (CB, H, CS) */
    const int64_t CB = vl ? 1 : c->B, CS = vl ? tq : c->Sq;
    const int64_t nout = CB * CS * H * D, nkv = vl ? tk * Hk * D : c->B * c->Sk * Hk * D;
    const int64_t nlse = CB * H * CS;

    int nd = vl ? 3 : 4, lnd = vl ? 2 : 3;
    int64_t qs[4], ks[4], ls[3];
    if (vl) {
        qs[0] = tq, qs[1] = H, qs[2] = D;
        ks[0] = tk, ks[1] = Hk, ks[2] = D;
        ls[0] = H, ls[1] = tq;
    } else {
        qs[0] = c->B, qs[1] = c->Sq, qs[2] = H, qs[3] = D;
        ks[0] = c->B, ks[1] = c->Sk, ks[2] = Hk, ks[3] = D;
        ls[0] = c->B, ls[1] = H, ls[2] = c->Sq;
    }
    tu_tensor q, k, v, out_c, out_g, lse_c, lse_g;
    tu_alloc(&q, c->dtype, nd, qs, c->layout);
    tu_alloc(&k, c->dtype, nd, ks, c->layout);
    tu_alloc(&v, c->dtype, nd, ks, c->layout);
    tu_alloc(&out_c, c->dtype, nd, qs, c->layout);
    tu_alloc(&out_g, c->dtype, nd, qs, c->layout);
    tu_alloc(&lse_c, FA_DTYPE_F32, lnd, ls, c->layout);
    tu_alloc(&lse_g, FA_DTYPE_F32, lnd, ls, c->layout);

    double *dq = dalloc(nout), *dk = dalloc(nkv), *dv = dalloc(nkv);
    double *og = dalloc(nout), *oc = dalloc(nout), *oref = dalloc(nout), *onaive = dalloc(nout);
    double *lg = dalloc(nlse), *lc = dalloc(nlse), *lref = dalloc(nlse), *lnaive = dalloc(nlse);
    double *lsize = dalloc(nlse); /* fp32: ref_score_sizes; packed rows outside: 0 */
    tu_fill_normal(&q, 1.0, dq);
    tu_fill_normal(&k, 1.0, dk);
    tu_fill_normal(&v, 1.0, dv);

    fa_params params;
    fa_params_init(&params);
    params.causal = c->causal;
    params.window_left = c->wl;
    params.window_right = c->wr;
    params.softcap = c->softcap;
    params.softmax_scale = c->scale;

    /* ALiBi slopes, fp32: mostly positive, some negative (allowed) */
    const int64_t nslopes = c->alibi == 2 ? nb * H : c->alibi == 1 ? H : 0;
    float *slopes = malloc(sizeof(float) * (size_t)(nslopes > 0 ? nslopes : 1));
    double *dslopes = dalloc(nslopes);
    if (!slopes)
        abort();
    for (int64_t i = 0; i < nslopes; i++) {
        double x = -0.1 + 0.6 * tu_uniform();
        if (x > -0.01 && x < 0.01)
            x = 0.01;
        slopes[i] = (float)x;
        dslopes[i] = slopes[i];
    }
    if (c->alibi) {
        int64_t sh[2] = {nb, H};
        params.alibi_slopes = c->alibi == 2 ? fa_tensor_contiguous(slopes, FA_DTYPE_F32, 2, sh)
                                            : fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, sh + 1);
    }

    /* the host dropout mask (nb, H, maxq, maxk), for the reference */
    uint8_t *mask = NULL;
    if (c->dropout_p > 0.0f) {
        params.dropout_p = c->dropout_p;
        params.dropout_seed = tu_next_u64();
        params.dropout_offset = tu_next_u64() >> tu_randint(0, 40);
        const int64_t nm = nb * H * maxq * maxk;
        int64_t ms[4] = {nb, H, maxq, maxk};
        mask = malloc((size_t)(nm > 0 ? nm : 1));
        if (!mask)
            abort();
        fa_tensor tm = fa_tensor_contiguous(mask, FA_DTYPE_U8, 4, ms);
        fa_status ms_st = fa_dropout_mask(&params, &tm);
        CHECK_MSG(ms_st == FA_OK, "host fa_dropout_mask: %s: %s", fa_status_name(ms_st),
                  fa_last_error_message());
    }

    /* CPU backend on the host inputs */
    int64_t ncu = nb + 1;
    fa_tensor tcuq = fa_tensor_contiguous(cuq, FA_DTYPE_I32, 1, &ncu);
    fa_tensor tcuk = fa_tensor_contiguous(cuk, FA_DTYPE_I32, 1, &ncu);
    fa_status st_c =
        vl ? fa_varlen_forward(NULL, &params, &q.t, &k.t, &v.t, &tcuq, &tcuk, maxq, maxk, &out_c.t,
                               c->no_lse ? NULL : &lse_c.t)
           : fa_forward(NULL, &params, &q.t, &k.t, &v.t, &out_c.t, c->no_lse ? NULL : &lse_c.t);
    CHECK_MSG(st_c == FA_OK, "CPU backend returned %s: %s", fa_status_name(st_c),
              fa_last_error_message());

    /* the same on the device: inputs copied, outputs poisoned (out_g/lse_g are all 0xFF) */
    dtensor gq, gk, gv, gout, glse;
    dt_upload(&gq, &q);
    dt_upload(&gk, &k);
    dt_upload(&gv, &v);
    dt_upload(&gout, &out_g);
    glse.p = NULL;
    if (!c->no_lse)
        dt_upload(&glse, &lse_g);
    fa_params gparams = params;
    void *gslopes = NULL, *gcuq = NULL, *gcuk = NULL;
    if (c->alibi) {
        gslopes = dev_alloc(sizeof(float) * (size_t)nslopes);
        h2d(gslopes, slopes, sizeof(float) * (size_t)nslopes);
        gparams.alibi_slopes.data = gslopes;
        gparams.alibi_slopes.device = FA_DEVICE_CUDA;
        gparams.alibi_slopes.device_index = g_dev;
    }
    fa_tensor gcq = tcuq, gck = tcuk;
    if (vl && c->cu_dev) {
        gcuq = dev_alloc(sizeof(int32_t) * (size_t)ncu);
        gcuk = dev_alloc(sizeof(int32_t) * (size_t)ncu);
        h2d(gcuq, cuq, sizeof(int32_t) * (size_t)ncu);
        h2d(gcuk, cuk, sizeof(int32_t) * (size_t)ncu);
        gcq.data = gcuq;
        gck.data = gcuk;
        gcq.device = gck.device = FA_DEVICE_CUDA;
        gcq.device_index = gck.device_index = g_dev;
    }
    char *env_tile = c->tile ? env_set("FA_CUDA_TILE_D128", c->tile) : NULL;
    char *env_kernels = c->kernels ? env_set("FA_CUDA_KERNELS", c->kernels) : NULL;
    fa_status st_g =
        vl ? fa_varlen_forward(NULL, &gparams, &gq.t, &gk.t, &gv.t, &gcq, &gck, maxq, maxk, &gout.t,
                               c->no_lse ? NULL : &glse.t)
           : fa_forward(NULL, &gparams, &gq.t, &gk.t, &gv.t, &gout.t, c->no_lse ? NULL : &glse.t);
    if (c->tile)
        env_restore("FA_CUDA_TILE_D128", env_tile);
    if (c->kernels)
        env_restore("FA_CUDA_KERNELS", env_kernels);
    CHECK_MSG(st_g == FA_OK, "GPU forward returned %s (%d): %s", fa_status_name(st_g), (int)st_g,
              fa_last_error_message());
    if (st_g == FA_OK)
        CHECK_EQ_STR(fa_last_error_message(), "");
    dt_download(&gout, &out_g);
    if (!c->no_lse)
        dt_download(&glse, &lse_g);

    if (st_g == FA_OK && st_c == FA_OK) {
        tu_gather(&out_g, og);
        tu_gather(&out_c, oc);
        if (!c->no_lse) {
            tu_gather(&lse_g, lg);
            tu_gather(&lse_c, lc);
        }
        /* the reference: whole problem, or one sequence at a time stitched into (tq, H, D) with
         * rows outside every sequence 0 / -inf */
        ref_problem p;
        memset(&p, 0, sizeof p);
        p.H = H;
        p.Hk = Hk;
        p.D = D;
        p.scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
        p.causal = c->causal;
        p.window_left = c->wl;
        p.window_right = c->wr;
        p.softcap = c->softcap;
        p.alibi_per_batch = c->alibi == 2;
        p.dropout_p = (double)c->dropout_p;
        double (*rnd)(double) = tu_round_fn(c->dtype);
        if (!vl) {
            p.B = c->B;
            p.Sq = c->Sq;
            p.Sk = c->Sk;
            p.alibi = c->alibi ? dslopes : NULL;
            p.dropout_mask = mask;
            ref_attention_forward(&p, dq, dk, dv, oref, lref);
            if (c->dtype != FA_DTYPE_F32)
                ref_attention_forward_rounded(&p, dq, dk, dv, onaive, lnaive, rnd);
            else
                ref_score_sizes(&p, dq, dk, lsize);
        } else {
            for (int64_t i = 0; i < nlse; i++)
                lref[i] = lnaive[i] = -INFINITY; /* oref/onaive start at 0 (calloc) */
            for (int b = 0; b < c->nseq; b++) {
                const int64_t Sq = c->lq[b], Sk = c->lk[b];
                double *sq = dalloc(Sq * H * D), *sk = dalloc(Sk * Hk * D),
                       *sv = dalloc(Sk * Hk * D);
                double *ro = dalloc(Sq * H * D), *rl = dalloc(H * Sq);
                double *no = dalloc(Sq * H * D), *nl = dalloc(H * Sq), *ss = dalloc(H * Sq);
                uint8_t *smask = NULL;
                memcpy(sq, dq + (int64_t)cuq[b] * H * D, sizeof(double) * (size_t)(Sq * H * D));
                memcpy(sk, dk + (int64_t)cuk[b] * Hk * D, sizeof(double) * (size_t)(Sk * Hk * D));
                memcpy(sv, dv + (int64_t)cuk[b] * Hk * D, sizeof(double) * (size_t)(Sk * Hk * D));
                p.B = 1;
                p.Sq = Sq;
                p.Sk = Sk;
                p.alibi = c->alibi == 2 ? dslopes + b * H : c->alibi == 1 ? dslopes : NULL;
                if (mask) {
                    smask = malloc((size_t)(H * Sq * Sk > 0 ? H * Sq * Sk : 1));
                    if (!smask)
                        abort();
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t i = 0; i < Sq; i++)
                            for (int64_t j = 0; j < Sk; j++)
                                smask[(h * Sq + i) * Sk + j] =
                                    mask[((b * H + h) * maxq + i) * maxk + j];
                }
                p.dropout_mask = smask;
                ref_attention_forward(&p, sq, sk, sv, ro, rl);
                if (c->dtype != FA_DTYPE_F32)
                    ref_attention_forward_rounded(&p, sq, sk, sv, no, nl, rnd);
                else
                    ref_score_sizes(&p, sq, sk, ss);
                memcpy(oref + (int64_t)cuq[b] * H * D, ro, sizeof(double) * (size_t)(Sq * H * D));
                memcpy(onaive + (int64_t)cuq[b] * H * D, no, sizeof(double) * (size_t)(Sq * H * D));
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < Sq; i++) {
                        lref[h * tq + cuq[b] + i] = rl[h * Sq + i];
                        lnaive[h * tq + cuq[b] + i] = nl[h * Sq + i];
                        lsize[h * tq + cuq[b] + i] = ss[h * Sq + i];
                    }
                free(sq);
                free(sk);
                free(sv);
                free(ro);
                free(rl);
                free(no);
                free(nl);
                free(ss);
                free(smask);
            }
        }
        const int lowp = c->dtype != FA_DTYPE_F32;
        if (!tu_check_attention(c->dtype, CB, CS, H, D, og, oref, lowp ? onaive : NULL,
                                c->no_lse ? NULL : lg, lref, lowp ? lnaive : NULL, lsize,
                                &g_gpu[c->dtype]))
            CHECK_MSG(0, "GPU result does not match the fp64 reference");
        /* the CPU backend's own error, the yardstick (test_forward/test_varlen check it; a CPU
         * miss is not this test's finding, so it is only measured) */
        {
            double mr;
            double e = max_err(nout, oc, oref, &mr);
            if ((mr > 0 ? e / mr : e) > g_cpu[c->dtype].max_rel)
                g_cpu[c->dtype].max_rel = mr > 0 ? e / mr : e;
            if (e > g_cpu[c->dtype].max_abs)
                g_cpu[c->dtype].max_abs = e;
            g_cpu[c->dtype].cases++;
        }
        check_vs_cpu(c, nout, og, oc, oref, nlse, lg, lc, lref);
        if (c->dropout_p > 0.0f)
            check_dropout_direct(c, nout, og, oc, oref, onaive);
    }
    int64_t gaps = tu_count_touched_gaps(&out_g);
    CHECK_MSG(gaps == 0, "%lld gap elements of the device out were written", (long long)gaps);
    if (!c->no_lse) {
        gaps = tu_count_touched_gaps(&lse_g);
        CHECK_MSG(gaps == 0, "%lld gap elements of the device lse were written", (long long)gaps);
    }

    dt_free(&gq);
    dt_free(&gk);
    dt_free(&gv);
    dt_free(&gout);
    if (!c->no_lse)
        dt_free(&glse);
    dev_free(gslopes);
    dev_free(gcuq);
    dev_free(gcuk);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&out_c);
    tu_free(&out_g);
    tu_free(&lse_c);
    tu_free(&lse_g);
    free(slopes);
    free(dslopes);
    free(mask);
    free(dq);
    free(dk);
    free(dv);
    free(og);
    free(oc);
    free(oref);
    free(onaive);
    free(lg);
    free(lc);
    free(lref);
    free(lnaive);
    free(lsize);
    g_case = "";
    return CASE_END();
}

static int run_all_dtypes(ccfg c) {
    int failed = 0;
    for (int t = 0; t < 3; t++) {
        c.dtype = k_dtypes[t];
        failed += !run_case(&c);
    }
    return failed;
}

static void group_line(const char *group, long cases, long failed) {
    printf("%-44s %4ld cases, %ld failed\n", group, cases, failed);
    fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
 * Forward groups
 * ------------------------------------------------------------------------------------------- */

/* Every head dim x lengths (Sq != Sk both ways, Sq = 1, Sk = 0, ragged lengths around the 64/128
 * tiles) x GQA 1/2/8, BSHD and BHSD, causal on a third: 8 x 7 x 3 dtypes = 168 cases. */
static void group_shapes(void) {
    static const int64_t dims[] = {1, 7, 32, 64, 80, 96, 128, 256};
    static const int64_t lens[][2] = {{1, 1},    {1, 77}, {77, 1},   {45, 130},
                                      {130, 45}, {5, 0},  {129, 129}};
    static const int64_t heads[][2] = {{2, 2}, {4, 2}, {8, 1}, {3, 3}};
    long n = 0, failed = 0;
    int r = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++, r++) {
            const int64_t *hh = heads[r % 4];
            ccfg c = fixed_cfg(1 + r % 2, lens[li][0], lens[li][1], hh[0], hh[1], dims[di]);
            if (dims[di] >= 128 && c.B * c.H > 4)
                c.B = 1;
            c.causal = r % 3 == 2;
            c.layout = (r / 2) % 2 ? TU_PERMUTED : TU_CONTIG;
            failed += run_all_dtypes(c);
            n += 3;
        }
    group_line("shapes (D x lengths x GQA, BSHD/BHSD)", n, failed);
}

/* Masks, bias, softcap, scale: 12 variants x 3 length pairs x 3 dtypes = 108 cases. */
static void group_masks(void) {
    static const int64_t lens[][2] = {{37, 53}, {53, 37}, {100, 100}};
    static const int64_t dims[] = {64, 80, 128, 32};
    long n = 0, failed = 0;
    for (int variant = 0; variant < 12; variant++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t H = variant % 2 ? 4 : 2, Hk = variant % 3 == 0 ? 1 : 2;
            ccfg c = fixed_cfg(2, lens[li][0], lens[li][1], H, Hk, dims[(variant + li) % 4]);
            switch (variant) {
            case 0:
                c.causal = 1; /* with Sq > Sk: the first Sq - Sk rows see nothing */
                break;
            case 1:
                c.wl = 5;
                c.wr = 3;
                break;
            case 2:
                c.wl = 9;
                break; /* left only */
            case 3:
                c.causal = 1;
                c.wl = 7;
                break; /* causal + left (Mistral) */
            case 4:
                c.alibi = 1;
                break;
            case 5:
                c.alibi = 2;
                c.causal = 1;
                break;
            case 6:
                c.softcap = 5.0f;
                break;
            case 7:
                c.softcap = 3.0f;
                c.alibi = 2;
                c.causal = 1;
                c.wl = 20;
                break;
            case 8:
                c.scale = 0.3f;
                c.wr = 0;
                c.wl = 0; /* the diagonal only */
                break;
            case 9:
                c.no_lse = 1;
                c.causal = 1;
                break;
            case 10:
                c.layout = TU_PERMUTED;
                c.alibi = 1;
                c.softcap = 4.0f;
                c.wl = 11;
                c.wr = 2;
                break;
            case 11:
                c.layout = TU_STRIDED;
                c.causal = 1;
                c.scale = -0.2f; /* any finite scale is used as is */
                break;
            }
            failed += run_all_dtypes(c);
            n += 3;
        }
    group_line("masks/ALiBi/softcap/scale/lse off", n, failed);
}

/* Every memory layout for the two head dims the fast kernel takes (it must not take the
 * strided ones by mistake): 4 layouts x 2 D x 3 dtypes = 24 cases. */
static void group_layouts(void) {
    long n = 0, failed = 0;
    for (int l = 0; l < TU_NUM_LAYOUTS; l++)
        for (int d = 0; d < 2; d++) {
            ccfg c = fixed_cfg(2, 100, 100, 4, 2, d ? 128 : 64);
            c.layout = l;
            c.causal = (l + d) % 2;
            failed += run_all_dtypes(c);
            n += 3;
        }
    group_line("layouts (contig/BHSD/strided/inner2)", n, failed);
}

/* Varlen with empty sequences of every kind, cu_seqlens on the host and on the device:
 * 8 variants x 3 dtypes = 24 cases. */
static void group_varlen(void) {
    static const int32_t lq[] = {5, 0, 17, 1, 9, 0, 33, 2};
    static const int32_t lk[] = {7, 3, 0, 12, 9, 0, 20, 40};
    long n = 0, failed = 0;
    for (int variant = 0; variant < 8; variant++) {
        ccfg c = varlen_cfg(8, lq, lk, 4, 2, 32);
        c.cu_dev = variant % 2;
        switch (variant) {
        case 0:
            break;
        case 1:
            c.causal = 1;
            break;
        case 2:
            c.wl = 3;
            c.wr = 2;
            c.D = 64;
            break;
        case 3:
            c.alibi = 2;
            c.causal = 1;
            c.D = 128;
            break;
        case 4:
            c.softcap = 4.0f;
            c.alibi = 1;
            c.H = 8;
            c.Hk = 1;
            break;
        case 5: /* cu_seqlens not starting at row 0, rows after the last sequence */
            c.q_start = 3;
            c.k_start = 5;
            c.q_tail = 4;
            c.k_tail = 2;
            c.no_lse = 1;
            c.causal = 1;
            c.D = 64;
            break;
        case 6:
            c.layout = TU_STRIDED;
            c.D = 80;
            c.wl = 4;
            c.causal = 1;
            break;
        case 7:
            c.q_start = 2;
            c.q_tail = 3;
            c.k_tail = 1;
            c.D = 256;
            c.H = 2;
            c.Hk = 1;
            c.causal = 1;
            break;
        }
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("varlen (host and device cu_seqlens)", n, failed);
}

/* Dropout p in {0.1, 0.5}: 7 variants x 3 dtypes = 21 cases. The small-Sk ones make a mask
 * mismatch visible element by element even in bf16. */
static void group_dropout(void) {
    static const int32_t lq[] = {9, 0, 21, 4};
    static const int32_t lk[] = {13, 5, 0, 17};
    long n = 0, failed = 0;
    for (int variant = 0; variant < 7; variant++) {
        ccfg c = fixed_cfg(2, 13, 19, 4, 2, 32);
        switch (variant) {
        case 0:
            c.dropout_p = 0.1f;
            break;
        case 1:
            c.dropout_p = 0.5f;
            c.causal = 1;
            c.Sq = 23;
            c.Sk = 11; /* empty rows too */
            break;
        case 2: /* the fast kernel's shape: contiguous D = 64 */
            c.dropout_p = 0.1f;
            c.Sq = c.Sk = 200;
            c.D = 64;
            break;
        case 3:
            c.dropout_p = 0.5f;
            c.Sq = 150;
            c.Sk = 170;
            c.D = 128;
            c.H = 8;
            c.Hk = 2;
            c.causal = 1;
            break;
        case 4:
            c = varlen_cfg(4, lq, lk, 4, 2, 64);
            c.dropout_p = 0.5f;
            c.cu_dev = 1;
            c.causal = 1;
            break;
        case 5:
            c = varlen_cfg(4, lq, lk, 2, 1, 128);
            c.dropout_p = 0.1f;
            break;
        case 6:
            c.dropout_p = 0.5f;
            c.layout = TU_PERMUTED;
            c.alibi = 2;
            c.softcap = 5.0f;
            c.D = 7;
            break;
        }
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("dropout (same Philox mask as the CPU)", n, failed);
}

/* Case `variant` of B = 2, H = 4 at length S and head dim D, the band shapes that stress a key
 * loop: 0 plain, 1 causal, 2 GQA 4:1 causal, 3 ragged varlen (causal, cu_seqlens on the device),
 * 4 bottom-right causal with Sq < Sk, 5 decode (Sq = 1), 6 a sliding window, 7 softcap with ALiBi
 * (causal). */
enum { BAND_VARIANTS = 8 };
static ccfg band_cfg(int variant, int64_t S, int64_t D) {
    ccfg c = fixed_cfg(2, S, S, 4, 4, D);
    switch (variant) {
    case 0:
        break;
    case 1:
        c.causal = 1;
        break;
    case 2:
        c.Hk = 1; /* GQA 4:1 */
        c.causal = 1;
        break;
    case 3: { /* varlen, ragged, cu_seqlens on the device */
        const int32_t l2[2] = {(int32_t)S, (int32_t)S - 45};
        c = varlen_cfg(2, l2, l2, 4, 2, D);
        c.causal = 1;
        c.cu_dev = 1;
        break;
    }
    case 4:
        c.Sq = S / 3 + 1; /* Sq < Sk, bottom-right causal */
        c.causal = 1;
        c.Hk = 2;
        break;
    case 5:
        c.Sq = 1; /* decode */
        c.Hk = 1;
        break;
    case 6:
        c.wl = 40;
        c.wr = 17;
        break;
    case 7:
        c.softcap = 5.0f;
        c.alibi = 2;
        c.causal = 1;
        break;
    }
    return c;
}

/* Large problems, where the fast kernel runs (fp16/bf16, D a multiple of 8 up to 256,
 * contiguous): B = 2, H = 4, band_cfg's variants 0-5 x 2 dtypes at S = 300 for D = 64, 128, 256,
 * 80, 96 and 200 (72 cases: the kernels for 64, 128, 256 and 96 at their own D, and those for 96
 * and 224 at a zero-padded one) and at S = 1000 for D = 64 and 128 (24); plus fp32 at S = 300,
 * plain and causal, D 64/128: 4 cases. FA_TEST_LARGE_S=300 (ctest sets it for the fake
 * plug-in, whose forward is the CPU's that test_forward covers at every size) leaves out the
 * S = 1000 cases: their fp64 references were 90% of the run, and S = 300 takes the same path
 * through the core. */
static void group_large(void) {
    long n = 0, failed = 0;
    static const int dt[2] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    static const int64_t S_[2] = {300, 1000}, D_[6] = {64, 128, 256, 80, 96, 200};
    const char *only = getenv("FA_TEST_LARGE_S");
    const int ns = only && strcmp(only, "300") == 0 ? 1 : 2;
    for (int si = 0; si < ns; si++)
        for (int di = 0; di < (si == 0 ? 6 : 2); di++)
            for (int variant = 0; variant < 6; variant++)
                for (int ti = 0; ti < 2; ti++) {
                    ccfg c = band_cfg(variant, S_[si], D_[di]);
                    c.dtype = dt[ti];
                    failed += !run_case(&c);
                    n++;
                }
    for (int di = 0; di < 2; di++)
        for (int causal = 0; causal < 2; causal++) {
            ccfg c = fixed_cfg(2, 300, 300, 4, 2, D_[di]);
            c.causal = causal;
            failed += !run_case(&c);
            n++;
        }
    group_line(ns == 2 ? "large (B=2 H=4 S=300/1000, D=64/128/256/80/96/200)"
                       : "large (B=2 H=4 S=300 (FA_TEST_LARGE_S), D=64/128/256/80/96/200)",
               n, failed);
}

/* D = 128, fp16 and bf16, under each FA_CUDA_TILE_D128: the tensor-core kernel with key blocks
 * of 32 and of 64 over every band_cfg shape at S = 300 (off the 64-key grid). */
static void group_tiles(void) {
    static const char *tiles[2] = {"128x32", "128x64"};
    static const int dt[2] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    long n = 0, failed = 0;
    for (int ti = 0; ti < 2; ti++)
        for (int variant = 0; variant < BAND_VARIANTS; variant++)
            for (int di = 0; di < 2; di++) {
                ccfg c = band_cfg(variant, 300, 128);
                c.dtype = dt[di];
                c.tile = tiles[ti];
                failed += !run_case(&c);
                n++;
            }
    group_line("tiles (FA_CUDA_TILE_D128 128x32, 128x64)", n, failed);
}

/* FA_CUDA_KERNELS: Turing's tensor-core kernels (fp16; bf16 on stage 1) and stage 1 alone, on
 * whatever GPU this is (on an older one than sm_75, only "simple"): band variants at D = 64 and
 * 128, fp16 and bf16, against the CPU and fp64 as every case. */
static void group_kernel_choice(void) {
    static const char *choices[2] = {"sm75", "simple"};
    static const int dt[2] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    long n = 0, failed = 0;
    for (int ci = 0; ci < 2; ci++)
        for (int variant = 0; variant < BAND_VARIANTS; variant++)
            for (int di = 0; di < 2; di++)
                for (int D = 64; D <= 128; D += 64) {
                    ccfg c = band_cfg(variant, 150, D);
                    c.dtype = dt[di];
                    c.kernels = choices[ci];
                    failed += !run_case(&c);
                    n++;
                }
    group_line("kernel choice (FA_CUDA_KERNELS sm75, simple)", n, failed);
}

/* Nothing to compute: Sq = 0 and B = 0 succeed: 2 x 3 dtypes = 6 cases. */
static void group_empty(void) {
    long n = 0, failed = 0;
    failed += run_all_dtypes(fixed_cfg(2, 0, 7, 2, 1, 64));
    failed += run_all_dtypes(fixed_cfg(0, 5, 7, 2, 1, 64));
    n += 6;
    group_line("empty (Sq = 0, B = 0)", n, failed);
}

/* ---------------------------------------------------------------------------------------------
 * fa_dropout_mask on a device tensor: byte for byte the host's, gaps untouched
 * ------------------------------------------------------------------------------------------- */

static void mask_case(const char *desc, const int64_t *shape, const int64_t *stride, float p) {
    CASE_BEGIN("fa_dropout_mask on the device: %s shape (%lld, %lld, %lld, %lld) p=%g", desc,
               (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
               (double)p);
    g_case = desc;
    int64_t span = 1;
    for (int d = 0; d < 4; d++)
        span += (shape[d] - 1) * stride[d];
    const size_t bytes = (size_t)span + 5; /* a few bytes past the view, also gaps */
    unsigned char *hbuf = malloc(bytes), *gbuf = malloc(bytes);
    if (!hbuf || !gbuf)
        abort();
    memset(hbuf, 0xEE, bytes);
    fa_params params;
    fa_params_init(&params);
    params.dropout_p = p;
    params.dropout_seed = tu_next_u64();
    params.dropout_offset = tu_next_u64() >> 20;
    fa_tensor ht = fa_tensor_contiguous(hbuf, FA_DTYPE_U8, 4, shape);
    for (int d = 0; d < 4; d++)
        ht.stride[d] = stride[d];
    void *dbuf = dev_alloc(bytes);
    h2d(dbuf, hbuf, bytes); /* poison: 0xEE everywhere */
    fa_tensor dt = ht;
    dt.data = dbuf;
    dt.device = FA_DEVICE_CUDA;
    dt.device_index = g_dev;
    fa_status sh = fa_dropout_mask(&params, &ht);
    fa_status sg = fa_dropout_mask(&params, &dt);
    CHECK_MSG(sh == FA_OK, "host: %s: %s", fa_status_name(sh), fa_last_error_message());
    CHECK_MSG(sg == FA_OK, "device: %s: %s", fa_status_name(sg), fa_last_error_message());
    if (sg == FA_OK)
        CHECK_EQ_STR(fa_last_error_message(), "");
    d2h(gbuf, dbuf, bytes);
    int64_t diff = 0, first = -1, kept = 0, nview = shape[0] * shape[1] * shape[2] * shape[3];
    for (size_t i = 0; i < bytes; i++)
        if (hbuf[i] != gbuf[i]) {
            if (first < 0)
                first = (int64_t)i;
            diff++;
        }
    CHECK_MSG(diff == 0,
              "%lld bytes differ from the host mask (first at byte %lld: GPU 0x%02x, "
              "host 0x%02x)",
              (long long)diff, (long long)first, first >= 0 ? gbuf[first] : 0,
              first >= 0 ? hbuf[first] : 0);
    /* and the host mask itself is sane, so equality means something: 0/1 in the view, the
     * gaps untouched, about 1 - p kept */
    fa_tensor vt = ht;
    int64_t bad = 0;
    for (int64_t f = 0; f < nview; f++) {
        unsigned char m = hbuf[tu_offset(&vt, f)];
        bad += m > 1;
        kept += m == 1;
    }
    int64_t gap_bytes = 0, gap_poison = 0;
    unsigned char *in_view = calloc(bytes, 1);
    if (!in_view)
        abort();
    for (int64_t f = 0; f < nview; f++)
        in_view[tu_offset(&vt, f)] = 1;
    for (size_t i = 0; i < bytes; i++)
        if (!in_view[i]) {
            gap_bytes++;
            gap_poison += hbuf[i] == 0xEE;
        }
    free(in_view);
    CHECK_MSG(bad == 0, "%lld mask elements are neither 0 nor 1", (long long)bad);
    CHECK_MSG(gap_poison == gap_bytes, "%lld of %lld gap bytes were written",
              (long long)(gap_bytes - gap_poison), (long long)gap_bytes);
    const double want = 1.0 - (double)p, nn = (double)nview;
    const double sigma = sqrt(nn * want * (1.0 - want));
    CHECK_MSG(fabs((double)kept - nn * want) <= 6.0 * sigma + 1e-9,
              "kept %lld of %lld, expected %.1f +- 6 x %.1f", (long long)kept, (long long)nview,
              nn * want, sigma);
    dev_free(dbuf);
    free(hbuf);
    free(gbuf);
    g_case = "";
    CASE_END();
}

/* 9 cases. */
static void group_dropout_mask(void) {
    long c0 = test_state_g_.cases_passed + test_state_g_.cases_failed;
    long f0 = test_state_g_.cases_failed;
    struct {
        const char *desc;
        int64_t shape[4];
        int transposed; /* i fastest, then j */
        int64_t pad_j;  /* extra elements at the end of each row */
        float p;
    } cases[] = {
        {"contiguous", {2, 3, 5, 7}, 0, 0, 0.5f},
        {"contiguous", {1, 4, 33, 130}, 0, 0, 0.1f},
        {"contiguous", {2, 2, 64, 128}, 0, 0, 0.5f},
        {"contiguous", {3, 1, 17, 1}, 0, 0, 0.1f},
        {"contiguous", {1, 2, 300, 257}, 0, 0, 0.1f},
        {"transposed (i fastest)", {1, 3, 13, 97}, 1, 0, 0.5f},
        {"padded rows", {2, 2, 9, 11}, 0, 5, 0.1f},
        {"padded rows", {1, 3, 40, 63}, 0, 1, 0.5f},
        {"p = 0 (all kept)", {2, 2, 7, 9}, 0, 3, 0.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t *s = cases[i].shape;
        int64_t st[4];
        if (cases[i].transposed) {
            st[2] = 1;
            st[3] = s[2];
            st[1] = s[2] * s[3];
            st[0] = s[1] * st[1];
        } else {
            st[3] = 1;
            st[2] = s[3] + cases[i].pad_j;
            st[1] = s[2] * st[2];
            st[0] = s[1] * st[1];
        }
        mask_case(cases[i].desc, s, st, cases[i].p);
    }
    group_line("fa_dropout_mask on the device",
               test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
               test_state_g_.cases_failed - f0);
}

/* ---------------------------------------------------------------------------------------------
 * Device memory helpers with a device present
 * ------------------------------------------------------------------------------------------- */

static void group_device_helpers(void) {
    long c0 = test_state_g_.cases_passed + test_state_g_.cases_failed;
    long f0 = test_state_g_.cases_failed;
    void *const sentinel = (void *)(uintptr_t)0x5678;

    CASE_BEGIN("device helpers: host -> device -> device -> host round trip");
    {
        enum { N = (1 << 20) + 3 };
        unsigned char *a = malloc(N), *b = malloc(N);
        if (!a || !b)
            abort();
        for (size_t i = 0; i < N; i++)
            a[i] = (unsigned char)tu_next_u64();
        memset(b, 0, N);
        void *d1 = dev_alloc(N), *d2 = dev_alloc(N);
        CHECK(d1 != d2);
        CHECK_EQ_INT(fa_device_copy(d1, FA_DEVICE_CUDA, a, FA_DEVICE_CPU, g_dev, N), FA_OK);
        CHECK_EQ_INT(fa_device_copy(d2, FA_DEVICE_CUDA, d1, FA_DEVICE_CUDA, g_dev, N), FA_OK);
        CHECK_EQ_INT(fa_device_copy(b, FA_DEVICE_CPU, d2, FA_DEVICE_CUDA, g_dev, N), FA_OK);
        CHECK(memcmp(a, b, N) == 0);
        /* a partial copy at an offset */
        memset(b, 0, N);
        CHECK_EQ_INT(fa_device_copy(b + 1, FA_DEVICE_CPU, (unsigned char *)d2 + 7, FA_DEVICE_CUDA,
                                    g_dev, 1000),
                     FA_OK);
        CHECK(memcmp(b + 1, a + 7, 1000) == 0 && b[0] == 0 && b[1001] == 0);
        dev_free(d1);
        dev_free(d2);
        free(a);
        free(b);
    }
    CASE_END();

    CASE_BEGIN("device helpers: argument errors with a device present");
    {
        void *p = sentinel;
        CHECK_EQ_INT(fa_device_free(FA_DEVICE_CUDA, g_dev, NULL), FA_OK);
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CUDA, g_dev, 0, &p), FA_ERR_VALUE);
        CHECK(p == sentinel);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "bytes"), "message \"%s\"",
                  fa_last_error_message());
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CUDA, g_dev, 64, NULL), FA_ERR_NULL_POINTER);
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CUDA, g_ndev, 64, &p), FA_ERR_DEVICE);
        CHECK(p == sentinel);
        CHECK(fa_last_error_message()[0] != '\0');
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CUDA, -1, 64, &p), FA_ERR_DEVICE);
        CHECK(p == sentinel);
        int32_t cnt = -5;
        CHECK_EQ_INT(fa_device_count(FA_DEVICE_CUDA, &cnt), FA_OK);
        CHECK_EQ_INT(cnt, g_ndev);
        CHECK_EQ_STR(fa_last_error_message(), "");
        cnt = -5;
        CHECK_EQ_INT(fa_device_count(FA_DEVICE_CPU, &cnt), FA_OK);
        CHECK_EQ_INT(cnt, 1);
        void *d = dev_alloc(256);
        unsigned char h[256];
        memset(h, 0x3C, sizeof h);
        CHECK_EQ_INT(fa_device_copy(d, FA_DEVICE_CUDA, h, FA_DEVICE_CPU, g_ndev, sizeof h),
                     FA_ERR_DEVICE);
        CHECK_EQ_INT(fa_device_copy(NULL, FA_DEVICE_CUDA, h, FA_DEVICE_CPU, g_dev, sizeof h),
                     FA_ERR_NULL_POINTER);
        CHECK_EQ_INT(fa_device_copy(h, FA_DEVICE_CPU, NULL, FA_DEVICE_CUDA, g_dev, sizeof h),
                     FA_ERR_NULL_POINTER);
        CHECK_EQ_INT(fa_device_copy(h, FA_DEVICE_CPU, d, (fa_device)7, g_dev, sizeof h),
                     FA_ERR_DEVICE);
        unsigned char z[256];
        memset(z, 0x3C, sizeof z);
        CHECK(memcmp(h, z, sizeof h) == 0); /* the failed copies did not write h */
        dev_free(d);
    }
    CASE_END();
    group_line("device memory helpers",
               test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
               test_state_g_.cases_failed - f0);
}

/* ---------------------------------------------------------------------------------------------
 * Error paths on CUDA tensors
 *
 * A valid problem (fixed: B=2 Sq=3 Sk=4 H=4 Hk=2 D=8; varlen: cu_seqlens_q {0,3,5} over 6 rows,
 * cu_seqlens_k {0,4,6} over 7 rows), fp32, every buffer both on the host and on the device:
 * inputs random, outputs poisoned with 0xA5. A case swaps or breaks one tensor, makes the call
 * and checks the status, the message and that no byte of any buffer, host or device, changed.
 * ------------------------------------------------------------------------------------------- */

enum {
    GB_Q,
    GB_K,
    GB_V,
    GB_OUT,
    GB_LSE,
    GB_DOUT,
    GB_DQ,
    GB_DK,
    GB_DV,
    GB_SLOPES,
    GB_CUQ,
    GB_CUK,
    GB_N
};
enum { CALL_FWD, CALL_VARLEN, CALL_BWD, CALL_VARLEN_BWD, CALL_KVCACHE, CALL_MASK };

#define GB_BYTES 4096 /* every buffer: room for each shape below */

typedef struct genv {
    int kind;
    unsigned char *host[GB_N], *snap[GB_N], *scratch;
    void *dev[GB_N];
    fa_tensor ht[GB_N], dt[GB_N]; /* the same views on the host and on the device */
    fa_tensor t[GB_N];            /* what the call passes (default: the device views) */
    const fa_tensor *pt[GB_N];
    fa_params params;
    int64_t maxq, maxk;
} genv;

static void genv_init(genv *e, int kind) {
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->scratch = malloc(GB_BYTES);
    if (!e->scratch)
        abort();
    for (int i = 0; i < GB_N; i++) {
        e->host[i] = malloc(GB_BYTES);
        e->snap[i] = malloc(GB_BYTES);
        if (!e->host[i] || !e->snap[i])
            abort();
        float *f = (float *)e->host[i];
        for (int j = 0; j < GB_BYTES / 4; j++)
            f[j] = (float)tu_normal();
        e->dev[i] = dev_alloc(GB_BYTES);
    }
    for (int i = 0; i < GB_BYTES / 4; i++)
        ((float *)e->host[GB_SLOPES])[i] = 0.1f + 0.01f * (float)(i % 7);
    const int vl = kind == CALL_VARLEN || kind == CALL_VARLEN_BWD;
    if (kind == CALL_MASK) {
        int64_t ms[4] = {2, 3, 5, 7};
        e->ht[GB_OUT] = fa_tensor_contiguous(e->host[GB_OUT], FA_DTYPE_U8, 4, ms);
    } else if (!vl) {
        int64_t qs[4] = {2, 3, 4, 8}, ks[4] = {2, 4, 2, 8}, ls[3] = {2, 4, 3};
        const int qlike[] = {GB_Q, GB_OUT, GB_DOUT, GB_DQ}, klike[] = {GB_K, GB_V, GB_DK, GB_DV};
        for (int i = 0; i < 4; i++) {
            e->ht[qlike[i]] = fa_tensor_contiguous(e->host[qlike[i]], FA_DTYPE_F32, 4, qs);
            e->ht[klike[i]] = fa_tensor_contiguous(e->host[klike[i]], FA_DTYPE_F32, 4, ks);
        }
        e->ht[GB_LSE] = fa_tensor_contiguous(e->host[GB_LSE], FA_DTYPE_F32, 3, ls);
    } else {
        int32_t *cq = (int32_t *)e->host[GB_CUQ], *ck = (int32_t *)e->host[GB_CUK];
        cq[0] = 0, cq[1] = 3, cq[2] = 5;
        ck[0] = 0, ck[1] = 4, ck[2] = 6;
        int64_t qs[3] = {6, 4, 8}, ks[3] = {7, 2, 8}, ls[2] = {4, 6}, cs = 3;
        const int qlike[] = {GB_Q, GB_OUT, GB_DOUT, GB_DQ}, klike[] = {GB_K, GB_V, GB_DK, GB_DV};
        for (int i = 0; i < 4; i++) {
            e->ht[qlike[i]] = fa_tensor_contiguous(e->host[qlike[i]], FA_DTYPE_F32, 3, qs);
            e->ht[klike[i]] = fa_tensor_contiguous(e->host[klike[i]], FA_DTYPE_F32, 3, ks);
        }
        e->ht[GB_LSE] = fa_tensor_contiguous(e->host[GB_LSE], FA_DTYPE_F32, 2, ls);
        e->ht[GB_CUQ] = fa_tensor_contiguous(cq, FA_DTYPE_I32, 1, &cs);
        e->ht[GB_CUK] = fa_tensor_contiguous(ck, FA_DTYPE_I32, 1, &cs);
        e->maxq = 3;
        e->maxk = 4;
    }
    /* outputs of the call poisoned (lse is an input of the backward, but poisoning it there is
     * harmless: the backward never gets to read it) */
    const int outs[] = {GB_OUT, GB_LSE, GB_DQ, GB_DK, GB_DV};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
        if (!(kind == CALL_BWD || kind == CALL_VARLEN_BWD) || outs[i] >= GB_DQ)
            memset(e->host[outs[i]], 0xA5, GB_BYTES);
    {
        int64_t sh[2] = {2, 4};
        e->ht[GB_SLOPES] = fa_tensor_contiguous(e->host[GB_SLOPES], FA_DTYPE_F32, 1, sh + 1);
    }
    for (int i = 0; i < GB_N; i++) {
        e->dt[i] = e->ht[i];
        e->dt[i].data = e->dev[i];
        e->dt[i].device = FA_DEVICE_CUDA;
        e->dt[i].device_index = g_dev;
        e->t[i] = e->dt[i];
        e->pt[i] = &e->t[i];
    }
    /* cu_seqlens default to the host (both places are valid) */
    e->t[GB_CUQ] = e->ht[GB_CUQ];
    e->t[GB_CUK] = e->ht[GB_CUK];
    fa_params_init(&e->params);
}

/* Copies every host buffer to its device twin and snapshots it: called after the mutations. */
static void genv_sync(genv *e) {
    for (int i = 0; i < GB_N; i++) {
        h2d(e->dev[i], e->host[i], GB_BYTES);
        memcpy(e->snap[i], e->host[i], GB_BYTES);
    }
}

static void genv_free(genv *e) {
    for (int i = 0; i < GB_N; i++) {
        dev_free(e->dev[i]);
        free(e->host[i]);
        free(e->snap[i]);
    }
    free(e->scratch);
}

static void use_alibi(genv *e, int on_device) {
    e->params.alibi_slopes = on_device ? e->dt[GB_SLOPES] : e->ht[GB_SLOPES];
}

static fa_status genv_call(genv *e) {
    const fa_tensor *const *t = e->pt;
    switch (e->kind) {
    case CALL_FWD:
        return fa_forward(NULL, &e->params, t[GB_Q], t[GB_K], t[GB_V], t[GB_OUT], t[GB_LSE]);
    case CALL_VARLEN:
        return fa_varlen_forward(NULL, &e->params, t[GB_Q], t[GB_K], t[GB_V], t[GB_CUQ], t[GB_CUK],
                                 e->maxq, e->maxk, t[GB_OUT], t[GB_LSE]);
    case CALL_BWD:
        return fa_backward(NULL, &e->params, t[GB_Q], t[GB_K], t[GB_V], t[GB_OUT], t[GB_DOUT],
                           t[GB_LSE], t[GB_DQ], t[GB_DK], t[GB_DV]);
    case CALL_VARLEN_BWD:
        return fa_varlen_backward(NULL, &e->params, t[GB_Q], t[GB_K], t[GB_V], t[GB_OUT],
                                  t[GB_DOUT], t[GB_LSE], t[GB_CUQ], t[GB_CUK], e->maxq, e->maxk,
                                  t[GB_DQ], t[GB_DK], t[GB_DV]);
    case CALL_KVCACHE: {
        fa_kvcache kv;
        fa_kvcache_init(&kv);
        kv.k_cache = *t[GB_K];
        kv.v_cache = *t[GB_V];
        return fa_forward_kvcache(NULL, &e->params, t[GB_Q], &kv, t[GB_OUT], t[GB_LSE]);
    }
    case CALL_MASK:
        return fa_dropout_mask(&e->params, t[GB_OUT]);
    }
    return FA_ERR_INTERNAL;
}

static const char *kind_name(int kind) {
    static const char *names[] = {"fa_forward",         "fa_varlen_forward",  "fa_backward",
                                  "fa_varlen_backward", "fa_forward_kvcache", "fa_dropout_mask"};
    return names[kind];
}

/* want_alt: a second acceptable status (= want when there is none). word/word2: the message
 * must name one of them as a whole word (NULL: not checked); sub: or contain this substring,
 * case-insensitively (NULL: not accepted that way). */
static void genv_expect(genv *e, const char *desc, fa_status want, fa_status want_alt,
                        const char *word, const char *word2, const char *sub) {
    CASE_BEGIN("CUDA %s: %s", kind_name(e->kind), desc);
    g_case = desc;
    genv_sync(e);
    fa_status st = genv_call(e);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fa_last_error_message());
    CHECK_MSG(st == want || st == want_alt, "status %s (%d), expected %s%s%s; message \"%s\"",
              fa_status_name(st), (int)st, fa_status_name(want), want_alt != want ? " or " : "",
              want_alt != want ? fa_status_name(want_alt) : "", msg);
    if (want == FA_OK) {
        CHECK_EQ_STR(msg, "");
    } else {
        CHECK_MSG(msg[0] != '\0', "empty error message");
        if (word || sub)
            CHECK_MSG((word && tu_contains_word(msg, word)) ||
                          (word2 && tu_contains_word(msg, word2)) || (sub && contains_ci(msg, sub)),
                      "message \"%s\" names neither \"%s\"%s%s%s%s", msg, word ? word : "",
                      word2 ? " nor \"" : "", word2 ? word2 : "", word2 ? "\"" : "",
                      sub ? " nor mentions the device" : "");
        /* nothing written anywhere, on the host or on the device */
        for (int i = 0; i < GB_N; i++) {
            CHECK_MSG(memcmp(e->host[i], e->snap[i], GB_BYTES) == 0,
                      "host buffer %d was modified by a failing call", i);
            d2h(e->scratch, e->dev[i], GB_BYTES);
            CHECK_MSG(memcmp(e->scratch, e->snap[i], GB_BYTES) == 0,
                      "device buffer %d was modified by a failing call", i);
        }
    }
    g_case = "";
    CASE_END();
}

#define GCASE(kind_, desc, want, alt, word, word2, sub, ...)                                       \
    do {                                                                                           \
        genv e;                                                                                    \
        genv_init(&e, kind_);                                                                      \
        { __VA_ARGS__; }                                                                           \
        genv_expect(&e, desc, want, alt, word, word2, sub);                                        \
        genv_free(&e);                                                                             \
    } while (0)
#define GERR(kind_, desc, want, word, ...)                                                         \
    GCASE(kind_, desc, want, want, word, NULL, NULL, __VA_ARGS__)

static void group_errors(void) {
    long c0 = test_state_g_.cases_passed + test_state_g_.cases_failed;
    long f0 = test_state_g_.cases_failed;
    const int n = g_ndev;

    for (int vl = 0; vl < 2; vl++) {
        const int K = vl ? CALL_VARLEN : CALL_FWD;
        const int hd = vl ? 1 : 2; /* heads dim */
        /* valid calls first, so the errors below are the mutation's */
        GCASE(K, "valid", FA_OK, FA_OK, NULL, NULL, NULL, (void)0);
        GCASE(K, "valid with device ALiBi slopes", FA_OK, FA_OK, NULL, NULL, NULL,
              use_alibi(&e, 1));
        GCASE(K, "valid without lse", FA_OK, FA_OK, NULL, NULL, NULL, e.pt[GB_LSE] = NULL);
        if (vl)
            GCASE(K, "valid with cu_seqlens on the device", FA_OK, FA_OK, NULL, NULL, NULL,
                  e.t[GB_CUQ] = e.dt[GB_CUQ];
                  e.t[GB_CUK] = e.dt[GB_CUK]);

        /* devices */
        GERR(K, "k on the host, q on CUDA", FA_ERR_DEVICE, "k", e.t[GB_K] = e.ht[GB_K]);
        GERR(K, "v on the host", FA_ERR_DEVICE, "v", e.t[GB_V] = e.ht[GB_V]);
        GERR(K, "out on the host (host out stays poisoned)", FA_ERR_DEVICE, "out",
             e.t[GB_OUT] = e.ht[GB_OUT]);
        GERR(K, "lse on the host (host lse stays poisoned)", FA_ERR_DEVICE, "lse",
             e.t[GB_LSE] = e.ht[GB_LSE]);
        GCASE(K, "q on the host, the rest on CUDA", FA_ERR_DEVICE, FA_ERR_DEVICE, "q", "k", NULL,
              e.t[GB_Q] = e.ht[GB_Q]);
        GERR(K, "k device_index = device count (no such GPU)", FA_ERR_DEVICE, "k",
             e.t[GB_K].device_index = n);
        GERR(K, "out device_index = device count", FA_ERR_DEVICE, "out",
             e.t[GB_OUT].device_index = n);
        GCASE(K, "every tensor on device_index = device count", FA_ERR_DEVICE, FA_ERR_DEVICE, "q",
              "device_index", "device",
              for (int i = 0; i < GB_N; i++) if (e.t[i].device == FA_DEVICE_CUDA) e.t[i]
                  .device_index = n);
        GCASE(K, "every tensor on device_index -1", FA_ERR_DEVICE, FA_ERR_DEVICE, "q",
              "device_index", "device",
              for (int i = 0; i < GB_N; i++) if (e.t[i].device == FA_DEVICE_CUDA) e.t[i]
                  .device_index = -1);
        GERR(K, "k device 7 (not a fa_device)", FA_ERR_DEVICE, "k", e.t[GB_K].device = 7);
        GERR(K, "ALiBi slopes on the host with CUDA q", FA_ERR_DEVICE, "alibi_slopes",
             use_alibi(&e, 0));
        GERR(K, "ALiBi slopes on device_index = device count", FA_ERR_DEVICE, "alibi_slopes",
             use_alibi(&e, 1);
             e.params.alibi_slopes.device_index = n);

        /* argument errors come first, as on the CPU */
        GERR(K, "q wrong ndim", FA_ERR_RANK, "q", e.t[GB_Q].ndim = vl ? 4 : 3);
        GERR(K, "v heads != k heads", FA_ERR_SHAPE, "v", e.t[GB_V].shape[hd] = 1);
        GERR(K, "Hk does not divide H", FA_ERR_SHAPE, "k", e.t[GB_K].shape[hd] = 3;
             e.t[GB_V].shape[hd] = 3);
        GERR(K, "out heads != q heads", FA_ERR_SHAPE, "out", e.t[GB_OUT].shape[hd] = 2);
        GERR(K, "k fp16 with q fp32", FA_ERR_DTYPE, "k", e.t[GB_K].dtype = FA_DTYPE_F16);
        GERR(K, "lse fp16", FA_ERR_DTYPE, "lse", e.t[GB_LSE].dtype = FA_DTYPE_F16);
        GERR(K, "out zero stride on a dim > 1", FA_ERR_STRIDE, "out",
             e.t[GB_OUT].stride[hd - 1] = 0);
        GERR(K, "q negative stride", FA_ERR_STRIDE, "q", e.t[GB_Q].stride[hd + 1] = -1);
        GERR(K, "out overlaps q on the device", FA_ERR_OVERLAP, "out",
             e.t[GB_OUT].data = e.dev[GB_Q]);
        GERR(K, "window_left = -2", FA_ERR_VALUE, "window_left", e.params.window_left = -2);
        /* a malformed FA_CUDA_TILE_D128 or FA_CUDA_KERNELS fails every CUDA forward */
        static const struct {
            const char *name, *value;
        } bad_env[] = {{"FA_CUDA_TILE_D128", "128x48"},  {"FA_CUDA_TILE_D128", "64"},
                       {"FA_CUDA_TILE_D128", "128x64 "}, {"FA_CUDA_TILE_D128", "128X64"},
                       {"FA_CUDA_KERNELS", "sm80"},      {"FA_CUDA_KERNELS", "SIMPLE"},
                       {"FA_CUDA_KERNELS", "sm75 "},     {"FA_CUDA_KERNELS", "turing"}};
        for (size_t i = 0; i < sizeof bad_env / sizeof bad_env[0]; i++) {
            char desc[64];
            snprintf(desc, sizeof desc, "%s=\"%s\"", bad_env[i].name, bad_env[i].value);
            char *saved = env_set(bad_env[i].name, bad_env[i].value);
            GERR(K, desc, FA_ERR_VALUE, bad_env[i].name, (void)0);
            env_restore(bad_env[i].name, saved);
        }
        GERR(K, "softcap NaN", FA_ERR_VALUE, "softcap", e.params.softcap = NAN);
        GERR(K, "dropout_p = 1", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = 1.0f);
        GERR(K, "ALiBi (H + 1) on the device", FA_ERR_SHAPE, "alibi_slopes", use_alibi(&e, 1);
             e.params.alibi_slopes.shape[0] = 5);
        GERR(K, "q data NULL", FA_ERR_NULL_POINTER, "q", e.t[GB_Q].data = NULL);
        if (vl) {
            GERR(K, "cu_seqlens_q on device_index = device count", FA_ERR_DEVICE, "cu_seqlens_q",
                 e.t[GB_CUQ] = e.dt[GB_CUQ];
                 e.t[GB_CUQ].device_index = n);
            GERR(K, "device cu_seqlens_k not monotonic", FA_ERR_VALUE, "cu_seqlens_k",
                 e.t[GB_CUK] = e.dt[GB_CUK];
                 ((int32_t *)e.host[GB_CUK])[1] = 7; e.maxk = 7);
            GERR(K, "device cu_seqlens_q beyond total_q", FA_ERR_VALUE, "cu_seqlens_q",
                 e.t[GB_CUQ] = e.dt[GB_CUQ];
                 ((int32_t *)e.host[GB_CUQ])[2] = 7; e.maxq = 100);
            GERR(K, "host cu_seqlens_q beyond total_q", FA_ERR_VALUE, "cu_seqlens_q",
                 ((int32_t *)e.host[GB_CUQ])[2] = 7;
                 e.maxq = 100);
            GCASE(K, "device cu_seqlens: a sequence longer than max_seqlen_q", FA_ERR_VALUE,
                  FA_ERR_VALUE, "max_seqlen_q", "cu_seqlens_q", NULL, e.t[GB_CUQ] = e.dt[GB_CUQ];
                  e.t[GB_CUK] = e.dt[GB_CUK]; e.maxq = 2);
            GERR(K, "cu_seqlens_q fp32", FA_ERR_DTYPE, "cu_seqlens_q",
                 e.t[GB_CUQ].dtype = FA_DTYPE_F32);
        }
    }

    /* the KV cache's argument errors on CUDA (test_kvcache --cuda runs the KV cache itself) */
    GERR(CALL_KVCACHE, "fa_forward_kvcache: k_cache on the host", FA_ERR_DEVICE, "k_cache",
         e.t[GB_K] = e.ht[GB_K]);
    GERR(CALL_KVCACHE, "fa_forward_kvcache: out on the host", FA_ERR_DEVICE, "out",
         e.t[GB_OUT] = e.ht[GB_OUT]);
    GCASE(CALL_KVCACHE, "fa_forward_kvcache: q on device_index = device count", FA_ERR_DEVICE,
          FA_ERR_DEVICE, "q", "device_index", "device", e.t[GB_Q].device_index = n;
          e.t[GB_OUT].device_index = n);
    GERR(CALL_KVCACHE, "fa_forward_kvcache: v_cache bf16", FA_ERR_DTYPE, "v_cache",
         e.t[GB_V].dtype = FA_DTYPE_BF16);
    /* the backward's argument errors (tests/test_cuda_backward.c runs the backward itself) */
    GERR(CALL_BWD, "fa_backward: v heads != k heads", FA_ERR_SHAPE, "v", e.t[GB_V].shape[2] = 1);
    GERR(CALL_BWD, "fa_backward: dk on the host", FA_ERR_DEVICE, "dk", e.t[GB_DK] = e.ht[GB_DK]);
    GERR(CALL_BWD, "fa_backward: lse on the host", FA_ERR_DEVICE, "lse",
         e.t[GB_LSE] = e.ht[GB_LSE]);
    GERR(CALL_VARLEN_BWD, "fa_varlen_backward: dq bf16", FA_ERR_DTYPE, "dq",
         e.t[GB_DQ].dtype = FA_DTYPE_BF16);
    GERR(CALL_VARLEN_BWD,
         "fa_varlen_backward: device cu_seqlens, a sequence longer than "
         "max_seqlen_q",
         FA_ERR_VALUE, "cu_seqlens_q", e.t[GB_CUQ] = e.dt[GB_CUQ];
         e.t[GB_CUK] = e.dt[GB_CUK]; e.maxq = 2);

    /* the dropout mask */
    GCASE(CALL_MASK, "valid", FA_OK, FA_OK, NULL, NULL, NULL, e.params.dropout_p = 0.5f);
    GCASE(CALL_MASK, "mask on device_index = device count", FA_ERR_DEVICE, FA_ERR_DEVICE, "mask",
          "device_index", "device", e.params.dropout_p = 0.5f;
          e.t[GB_OUT].device_index = n);
    GERR(CALL_MASK, "dropout_p = 1", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = 1.0f);
    GERR(CALL_MASK, "mask fp32", FA_ERR_DTYPE, "mask", e.params.dropout_p = 0.5f;
         e.t[GB_OUT].dtype = FA_DTYPE_F32);
    GERR(CALL_MASK, "mask zero stride", FA_ERR_STRIDE, "mask", e.params.dropout_p = 0.5f;
         e.t[GB_OUT].stride[2] = 0);

    group_line("error paths on CUDA tensors",
               test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
               test_state_g_.cases_failed - f0);
}

/* A GPU for which the plug-in has no kernels (an sm_70 under a CUDA 13 build; FA_EMU_SM=70 in
 * the emulator): a forward must fail with FA_ERR_UNSUPPORTED, name the GPU's sm and what to do,
 * and write nothing. Returns 1 for such a GPU (after checking so), 0 when the forward runs. */
static int no_kernels_checked(void) {
    static const int64_t shape[4] = {1, 1, 1, 8};
    void *buf[4];
    uint16_t host[8], got[8];
    memset(host, 0x3c, sizeof host); /* fp16 1.0-ish inputs; out poisoned below */
    fa_tensor t[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = dev_alloc(sizeof host);
        h2d(buf[i], host, sizeof host);
        t[i] = fa_tensor_contiguous(buf[i], FA_DTYPE_F16, 4, shape);
        t[i].device = FA_DEVICE_CUDA, t[i].device_index = g_dev;
    }
    memset(host, 0xff, sizeof host);
    h2d(buf[3], host, sizeof host);
    const fa_status st = fa_forward(NULL, NULL, &t[0], &t[1], &t[2], &t[3], NULL);
    char msg[1024]; /* the copies below clear the last error */
    snprintf(msg, sizeof msg, "%s", fa_last_error_message());
    const int none = st == FA_ERR_UNSUPPORTED && strstr(msg, "has no kernels") != NULL;
    if (none) {
        CASE_BEGIN("a GPU without kernels in this plug-in: a clear error, nothing written");
        d2h(got, buf[3], sizeof got);
        CHECK_MSG(memcmp(got, host, sizeof got) == 0, "out was written");
        CHECK_MSG(strstr(msg, "sm_") && strstr(msg, "FA_CUDA_ARCHS"),
                  "the message names neither the GPU's sm nor FA_CUDA_ARCHS: %s", msg);
        CASE_END();
        printf("no kernels for this GPU checked: %s\n", msg);
    }
    for (int i = 0; i < 4; i++)
        dev_free(buf[i]);
    return none;
}

int main(void) {
    int32_t n = -1;
    fa_status st = fa_device_count(FA_DEVICE_CUDA, &n);
    if (st != FA_OK || n <= 0) {
        const char *why = st != FA_OK ? fa_last_error_message() : "0 devices";
        printf("SKIP: no CUDA device: %s\n", why && *why ? why : fa_status_name(st));
        return TU_SKIP;
    }
    g_ndev = n;
    g_dev = 0;
    tu_seed_init("test_cuda");
    printf("library %s; %s\n", fa_version_string(), fa_build_info());
    printf("%d CUDA device(s); running on device %d\n", (int)n, (int)g_dev);
    fflush(stdout);
    if (no_kernels_checked())
        return TEST_REPORT();

    group_device_helpers();
    group_errors();
    group_dropout_mask();
    group_empty();
    group_shapes();
    group_masks();
    group_layouts();
    group_varlen();
    group_dropout();
    group_large();
    group_tiles();
    group_kernel_choice();

    CHECK_MSG(g_live_allocs == 0, "%ld device allocations were not freed", g_live_allocs);
    printf("forward cases: %ld\n", g_cases_total);
    for (int t = 0; t < 3; t++) {
        const int dt = k_dtypes[t];
        const tu_errstats *s = &g_gpu[dt];
        printf("max error %s over %ld cases: GPU vs fp64 out rel %.3g (abs %.3g", tu_dtype_name(dt),
               s->cases, s->max_rel, s->max_abs);
        if (dt != FA_DTYPE_F32)
            printf(", at most %.2fx the naive %s implementation's", s->max_ratio,
                   tu_dtype_name(dt));
        printf("), lse rel %.3g (abs %.3g); CPU backend out abs %.3g; GPU error at most %.2f of "
               "(2 x CPU error + floor)\n",
               s->max_lse_rel, s->max_lse_abs, g_cpu[dt].max_abs, g_worst_vs_cpu[dt]);
    }
    return TEST_REPORT();
}
