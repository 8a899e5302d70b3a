/* SPDX-License-Identifier: MIT */
/*
 * tools/check/ — the checks a user runs: `flashattn verify` (against the fp64 reference) and
 * `flashattn demo`.
 *
 * verify.c — `flashattn verify`: the "does it really work" check. Runs small attentions on every
 * available backend (the CPU, and each CUDA device when the plug-in and a GPU are present; when
 * not, the reason is printed) and compares out and lse with the fp64 reference
 * (tests/reference/attention_ref.h),
 * one verdict line per case. Inputs are fresh uniform random values in [-1, 1] (the seed is
 * printed; --seed replays it), rounded to the case's dtype, and the reference is computed from
 * those rounded values. Outputs are poisoned with NaN before each call so an element the library
 * does not write fails, and NaN never passes.
 *
 * Tolerances (max abs error over all elements):
 *   fp32  out: 1e-5 * max(1, max|ref out|)     lse: 1e-5 * max(1, max|ref lse|)
 *   fp16  out: 2e-3 absolute                   lse: 2e-3 * max(1, max|ref lse|)
 *   bf16  out: 1.6e-2 absolute                 lse: 1.6e-2 * max(1, max|ref lse|)
 * For inputs in [-1, 1] the fp16/bf16 bounds are the same order as twice the error of a naive
 * attention computed in that precision (DESIGN.md §9). lse is fp32 for every dtype. An lse of
 * -inf (fully masked row) must match exactly, as must out = 0 and lse = -inf on varlen rows that
 * belong to no sequence.
 *
 * Backward: for a few cases (classic, causal GQA, dropout with the mask from fa_dropout_mask)
 * it runs fa_forward and then fa_backward on that out and lse with a random dout, and compares
 * dq, dk and dv with the fp64 reference backward (tests/reference/attention_ref_backward.h)
 * computed from the same rounded inputs (and the same dropout mask). Tolerances, per gradient
 * (max abs error; R = max|ref| of that gradient), as in the C tests (tests/backward_check.h):
 *   fp32       1e-5 * R + 4 * 2^-24 * (max of the reference's sum of |terms| per element), the
 *              second term being fp32 accumulation error where the gradient cancels
 *   fp16/bf16  2 * the error of a naive backward computed in that precision (the reference with
 *              every intermediate rounded to the dtype) + one ulp of the dtype at R + what
 *              storing out in the dtype moves the exact gradient by (the backward is handed
 *              that out and computes rowsum(dout * out) from it; no backward can undo it)
 * Gradients are poisoned with NaN before the call, so an element the library does not write
 * fails.
 *
 * On each CUDA device also the KV cache (verify_kv.c): fa_forward_kvcache against the CPU
 * backend on the same inputs.
 *
 * Exit status: 0 if every case passes, 1 if any fails or the library reports an error, 2 on bad
 * usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/cli.h"
#include "attention_ref.h"
#include "attention_ref_backward.h"
#include "flashattn.h"
#include "verify.h"

#define MAX_SEQS 4

typedef struct vcase {
    const char *name;
    fa_dtype dtype;
    int64_t B, H, Hk, D;
    int64_t Sq, Sk; /* fixed-length cases */
    int causal;
    int nseq; /* > 0: a varlen case with these sequences (B = nseq) */
    int64_t seq_q[MAX_SEQS], seq_k[MAX_SEQS];
    int64_t lead_q, tail_q; /* varlen: packed q rows before the first and after the last sequence */
    int64_t lead_k, tail_k; /* likewise for k/v */
} vcase;

/* clang-format off */
static const vcase cases[] = {
    /* name           dtype         B  H Hk  D  Sq  Sk causal nseq seq_q  seq_k  lead/tail q, k */
    {"classic",       FA_DTYPE_F32,  2, 8, 8, 64, 32, 32, 0, 0, {0}, {0}, 0, 0, 0, 0},
    {"classic",       FA_DTYPE_F16,  2, 8, 8, 64, 32, 32, 0, 0, {0}, {0}, 0, 0, 0, 0},
    {"classic",       FA_DTYPE_BF16, 2, 8, 8, 64, 32, 32, 0, 0, {0}, {0}, 0, 0, 0, 0},
    {"causal",        FA_DTYPE_F16,  2, 8, 8, 64, 32, 32, 1, 0, {0}, {0}, 0, 0, 0, 0},
    {"causal Sq<Sk",  FA_DTYPE_F16,  2, 8, 8, 64, 24, 40, 1, 0, {0}, {0}, 0, 0, 0, 0},
    {"gqa",           FA_DTYPE_F16,  2, 8, 2, 64, 32, 32, 0, 0, {0}, {0}, 0, 0, 0, 0},
    /* varlen: 3 sequences, Sq == Sk, Sq < Sk, Sq > Sk; packed rows outside every sequence */
    {"varlen",        FA_DTYPE_F16, 3, 8, 8, 64, 0, 0, 0, 3, {32, 9, 27}, {32, 41, 14}, 1, 2, 3, 1},
    {"varlen causal", FA_DTYPE_F16, 3, 8, 2, 64, 0, 0, 1, 3, {32, 9, 27}, {32, 41, 14}, 1, 2, 3, 1},
};
/* clang-format on */

#define NUM_CASES (sizeof cases / sizeof cases[0])

typedef struct verdict {
    double out_err, lse_err; /* max abs error; INFINITY for NaN or a mismatched infinity */
    double max_ref_out, max_ref_lse;
} verdict;

/* |a - r|, where NaN anywhere or a differing infinity counts as infinitely wrong. */
static double abs_err(double a, double r) {
    if (isnan(a) || isnan(r))
        return INFINITY;
    if (isinf(a) || isinf(r))
        return a == r ? 0.0 : INFINITY;
    return fabs(a - r);
}

static void note(double *maxv, double v) {
    if (v > *maxv || isnan(v))
        *maxv = isnan(v) ? INFINITY : v;
}

/* Allocates n elements of dtype t filled with uniform [-1, 1) values rounded to t, and their
 * exact double values. */
static void *random_tensor(cli_rng *rng, fa_dtype t, size_t n, double **exact, const char *what) {
    size_t i;
    void *buf = cli_xmalloc(n * cli_dtype_size(t), what);
    double *d = cli_xmalloc(n * sizeof(double), what);
    for (i = 0; i < n; i++) {
        cli_store(buf, t, i, cli_rng_uniform(rng));
        d[i] = cli_load(buf, t, i);
    }
    *exact = d;
    return buf;
}

fa_tensor place(backend *be, fa_tensor t, size_t bytes) {
    void *d;
    if (!be->cuda)
        return t;
    t.device = FA_DEVICE_CUDA;
    t.device_index = be->index;
    if (bytes == 0)
        return t; /* empty: never dereferenced */
    CLI_CHECK("fa_device_alloc", fa_device_alloc(FA_DEVICE_CUDA, be->index, bytes, &d));
    CLI_CHECK("fa_device_copy",
              fa_device_copy(d, FA_DEVICE_CUDA, t.data, FA_DEVICE_CPU, be->index, bytes));
    be->dev[be->ndev++] = d;
    t.data = d;
    return t;
}

void fetch(const backend *be, void *host, const fa_tensor *t, size_t bytes) {
    if (be->cuda && bytes > 0)
        CLI_CHECK("fa_device_copy",
                  fa_device_copy(host, FA_DEVICE_CPU, t->data, FA_DEVICE_CUDA, be->index, bytes));
}

void release(backend *be) {
    while (be->ndev > 0)
        CLI_CHECK("fa_device_free", fa_device_free(FA_DEVICE_CUDA, be->index, be->dev[--be->ndev]));
}

static ref_problem make_ref(const vcase *c, int64_t B, int64_t Sq, int64_t Sk) {
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.B = B;
    p.Sq = Sq;
    p.Sk = Sk;
    p.H = c->H;
    p.Hk = c->Hk;
    p.D = c->D;
    p.scale = 1.0 / sqrt((double)c->D); /* the library's default scale */
    p.causal = c->causal;
    p.window_left = -1;
    p.window_right = -1;
    p.softcap = 0.0;
    p.alibi = NULL;
    p.alibi_per_batch = 0;
    return p;
}

static verdict run_fixed(fa_context *ctx, backend *be, const vcase *c, cli_rng *rng) {
    const fa_dtype t = c->dtype;
    const size_t nq = (size_t)(c->B * c->Sq * c->H * c->D);
    const size_t nk = (size_t)(c->B * c->Sk * c->Hk * c->D);
    const size_t nl = (size_t)(c->B * c->H * c->Sq);
    int64_t qshape[4] = {c->B, c->Sq, c->H, c->D};
    int64_t kshape[4] = {c->B, c->Sk, c->Hk, c->D};
    int64_t lshape[3] = {c->B, c->H, c->Sq};
    double *qd, *kd, *vd, *rout, *rlse;
    void *q, *k, *v, *out;
    float *lse;
    fa_tensor tq, tk, tv, tout, tlse;
    fa_params params;
    ref_problem p;
    verdict r = {0, 0, 0, 0};
    size_t i;

    q = random_tensor(rng, t, nq, &qd, "q");
    k = random_tensor(rng, t, nk, &kd, "k");
    v = random_tensor(rng, t, nk, &vd, "v");
    out = cli_xmalloc(nq * cli_dtype_size(t), "out");
    lse = cli_xmalloc(nl * sizeof(float), "lse");
    cli_poison(out, t, nq);
    cli_poison(lse, FA_DTYPE_F32, nl);

    tq = place(be, fa_tensor_contiguous(q, t, 4, qshape), nq * cli_dtype_size(t));
    tk = place(be, fa_tensor_contiguous(k, t, 4, kshape), nk * cli_dtype_size(t));
    tv = place(be, fa_tensor_contiguous(v, t, 4, kshape), nk * cli_dtype_size(t));
    tout = place(be, fa_tensor_contiguous(out, t, 4, qshape), nq * cli_dtype_size(t));
    tlse = place(be, fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, lshape), nl * sizeof(float));
    fa_params_init(&params);
    params.causal = c->causal;
    CLI_CHECK("fa_forward", fa_forward(ctx, &params, &tq, &tk, &tv, &tout, &tlse));
    fetch(be, out, &tout, nq * cli_dtype_size(t));
    fetch(be, lse, &tlse, nl * sizeof(float));
    release(be);

    rout = cli_xmalloc(nq * sizeof(double), "reference out");
    rlse = cli_xmalloc(nl * sizeof(double), "reference lse");
    p = make_ref(c, c->B, c->Sq, c->Sk);
    ref_attention_forward(&p, qd, kd, vd, rout, rlse);

    for (i = 0; i < nq; i++) {
        note(&r.out_err, abs_err(cli_load(out, t, i), rout[i]));
        note(&r.max_ref_out, fabs(rout[i]));
    }
    for (i = 0; i < nl; i++) {
        note(&r.lse_err, abs_err((double)lse[i], rlse[i]));
        if (isfinite(rlse[i]))
            note(&r.max_ref_lse, fabs(rlse[i]));
    }

    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    free(qd);
    free(kd);
    free(vd);
    free(rout);
    free(rlse);
    return r;
}

static verdict run_varlen(fa_context *ctx, backend *be, const vcase *c, cli_rng *rng) {
    const fa_dtype t = c->dtype;
    const int64_t H = c->H, Hk = c->Hk, D = c->D;
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
    int64_t total_q, total_k, max_q = 0, max_k = 0, b, i, h;
    int64_t ncu = 0, qshape[3], kshape[3], lshape[2];
    size_t nq, nk, nl, n;
    double *qd, *kd, *vd;
    void *q, *k, *v, *out;
    float *lse;
    fa_tensor tq, tk, tv, tout, tlse, tcuq, tcuk;
    fa_params params;
    verdict r = {0, 0, 0, 0};

    cu_q[0] = (int32_t)c->lead_q;
    cu_k[0] = (int32_t)c->lead_k;
    for (b = 0; b < c->nseq; b++) {
        cu_q[b + 1] = cu_q[b] + (int32_t)c->seq_q[b];
        cu_k[b + 1] = cu_k[b] + (int32_t)c->seq_k[b];
        if (c->seq_q[b] > max_q)
            max_q = c->seq_q[b];
        if (c->seq_k[b] > max_k)
            max_k = c->seq_k[b];
    }
    total_q = cu_q[c->nseq] + c->tail_q;
    total_k = cu_k[c->nseq] + c->tail_k;
    nq = (size_t)(total_q * H * D);
    nk = (size_t)(total_k * Hk * D);
    nl = (size_t)(H * total_q);

    q = random_tensor(rng, t, nq, &qd, "q");
    k = random_tensor(rng, t, nk, &kd, "k");
    v = random_tensor(rng, t, nk, &vd, "v");
    out = cli_xmalloc(nq * cli_dtype_size(t), "out");
    lse = cli_xmalloc(nl * sizeof(float), "lse");
    cli_poison(out, t, nq);
    cli_poison(lse, FA_DTYPE_F32, nl);

    qshape[0] = total_q;
    qshape[1] = H;
    qshape[2] = D;
    kshape[0] = total_k;
    kshape[1] = Hk;
    kshape[2] = D;
    lshape[0] = H;
    lshape[1] = total_q;
    ncu = c->nseq + 1;
    tq = place(be, fa_tensor_contiguous(q, t, 3, qshape), nq * cli_dtype_size(t));
    tk = place(be, fa_tensor_contiguous(k, t, 3, kshape), nk * cli_dtype_size(t));
    tv = place(be, fa_tensor_contiguous(v, t, 3, kshape), nk * cli_dtype_size(t));
    tout = place(be, fa_tensor_contiguous(out, t, 3, qshape), nq * cli_dtype_size(t));
    tlse = place(be, fa_tensor_contiguous(lse, FA_DTYPE_F32, 2, lshape), nl * sizeof(float));
    /* On CUDA, cu_seqlens_q is on the device and cu_seqlens_k on the host: both are allowed. */
    tcuq = place(be, fa_tensor_contiguous(cu_q, FA_DTYPE_I32, 1, &ncu), (size_t)ncu * 4);
    tcuk = fa_tensor_contiguous(cu_k, FA_DTYPE_I32, 1, &ncu);
    fa_params_init(&params);
    params.causal = c->causal;
    CLI_CHECK("fa_varlen_forward", fa_varlen_forward(ctx, &params, &tq, &tk, &tv, &tcuq, &tcuk,
                                                     max_q, max_k, &tout, &tlse));
    fetch(be, out, &tout, nq * cli_dtype_size(t));
    fetch(be, lse, &tlse, nl * sizeof(float));
    release(be);

    /* Each sequence against a B = 1 reference call on its own rows. */
    for (b = 0; b < c->nseq; b++) {
        const int64_t sq = c->seq_q[b], sk = c->seq_k[b];
        const size_t qoff = (size_t)cu_q[b] * (size_t)(H * D);
        const size_t koff = (size_t)cu_k[b] * (size_t)(Hk * D);
        double *rout = cli_xmalloc((size_t)(sq * H * D) * sizeof(double), "reference out");
        double *rlse = cli_xmalloc((size_t)(H * sq) * sizeof(double), "reference lse");
        ref_problem p = make_ref(c, 1, sq, sk);
        ref_attention_forward(&p, qd + qoff, kd + koff, vd + koff, rout, rlse);
        for (n = 0; n < (size_t)(sq * H * D); n++) {
            note(&r.out_err, abs_err(cli_load(out, t, qoff + n), rout[n]));
            note(&r.max_ref_out, fabs(rout[n]));
        }
        for (h = 0; h < H; h++) {
            for (i = 0; i < sq; i++) {
                double ref = rlse[h * sq + i];
                note(&r.lse_err, abs_err((double)lse[h * total_q + cu_q[b] + i], ref));
                if (isfinite(ref))
                    note(&r.max_ref_lse, fabs(ref));
            }
        }
        free(rout);
        free(rlse);
    }
    /* Rows outside every sequence: out = 0 and lse = -inf, exactly. */
    for (i = 0; i < total_q; i++) {
        if (i >= cu_q[0] && i < cu_q[c->nseq])
            continue;
        for (n = 0; n < (size_t)(H * D); n++)
            note(&r.out_err, abs_err(cli_load(out, t, (size_t)i * (size_t)(H * D) + n), 0.0));
        for (h = 0; h < H; h++)
            note(&r.lse_err, abs_err((double)lse[h * total_q + i], -INFINITY));
    }

    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    free(qd);
    free(kd);
    free(vd);
    return r;
}

void verify_tolerance(fa_dtype t, double max_ref_out, double max_ref_lse, double *tol_out,
                      double *tol_lse) {
    double f = t == FA_DTYPE_F32 ? 1e-5 : t == FA_DTYPE_F16 ? 2e-3 : 1.6e-2;
    *tol_out = t == FA_DTYPE_F32 ? f * (max_ref_out > 1.0 ? max_ref_out : 1.0) : f;
    *tol_lse = f * (max_ref_lse > 1.0 ? max_ref_lse : 1.0);
}

static void describe(const vcase *c, char *buf, size_t n) {
    if (c->nseq == 0) {
        snprintf(buf, n, "B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld", (long long)c->B,
                 (long long)c->Sq, (long long)c->Sk, (long long)c->H, (long long)c->Hk,
                 (long long)c->D);
    } else {
        size_t used;
        int b;
        used = (size_t)snprintf(buf, n, "%d seqs (Sq,Sk)=", c->nseq);
        for (b = 0; b < c->nseq && used < n; b++)
            used += (size_t)snprintf(buf + used, n - used, "%s(%lld,%lld)", b ? "," : "",
                                     (long long)c->seq_q[b], (long long)c->seq_k[b]);
        if (used < n)
            snprintf(buf + used, n - used, " H=%lld Hk=%lld D=%lld", (long long)c->H,
                     (long long)c->Hk, (long long)c->D);
    }
}

/* ---- backward ------------------------------------------------------------------------------- */

typedef struct bcase {
    const char *name;
    fa_dtype dtype;
    int64_t B, H, Hk, D, Sq, Sk;
    int causal;
    float dropout_p;
} bcase;

/* clang-format off */
static const bcase bcases[] = {
    /* name           dtype          B  H Hk  D  Sq  Sk causal dropout */
    {"classic",       FA_DTYPE_F32,  2, 8, 8, 64, 32, 32, 0, 0.0f},
    {"classic",       FA_DTYPE_F16,  2, 8, 8, 64, 32, 32, 0, 0.0f},
    {"classic",       FA_DTYPE_BF16, 2, 8, 8, 64, 32, 32, 0, 0.0f},
    {"causal gqa",    FA_DTYPE_F16,  2, 8, 2, 64, 32, 32, 1, 0.0f},
    {"dropout 0.1",   FA_DTYPE_F32,  2, 8, 8, 64, 32, 32, 0, 0.1f},
    {"dropout causal", FA_DTYPE_F16, 2, 8, 2, 64, 24, 40, 1, 0.1f},
};
/* clang-format on */

#define NUM_BCASES (sizeof bcases / sizeof bcases[0])

typedef struct bverdict {
    double err[3], tol[3]; /* dq, dk, dv: max abs error (INFINITY for NaN) and its tolerance */
} bverdict;

/* x rounded to nearest even in a binary format with p significand bits, minimum normal
 * exponent emin and largest finite value maxval (the naive low-precision backward's roundings). */
static double round_fmt(double x, int p, int emin, double maxval) {
    int e;
    double ulp, r;
    if (x == 0.0 || !isfinite(x))
        return x;
    frexp(x, &e);
    e = e - 1 < emin ? emin : e - 1;
    ulp = ldexp(1.0, e - (p - 1));
    r = nearbyint(x / ulp) * ulp;
    return fabs(r) > maxval ? copysign(INFINITY, x) : r;
}

static double round_f16(double x) { return round_fmt(x, 11, -14, 65504.0); }
static double round_bf16(double x) { return round_fmt(x, 8, -126, 0x1.FEp127); }

/* The dtype's spacing at |x| (at 1 for x = 0). */
static double dtype_ulp(fa_dtype t, double x) {
    int p = t == FA_DTYPE_F16 ? 11 : t == FA_DTYPE_BF16 ? 8 : 24, e;
    int emin = t == FA_DTYPE_F16 ? -14 : -126;
    frexp(x == 0.0 ? 1.0 : fabs(x), &e);
    e = e - 1 < emin ? emin : e - 1;
    return ldexp(1.0, e - (p - 1));
}

static bverdict run_backward(fa_context *ctx, backend *be, const bcase *c, cli_rng *rng) {
    const fa_dtype t = c->dtype;
    const size_t nq = (size_t)(c->B * c->Sq * c->H * c->D);
    const size_t nk = (size_t)(c->B * c->Sk * c->Hk * c->D);
    const size_t nl = (size_t)(c->B * c->H * c->Sq);
    const size_t nm = (size_t)(c->B * c->H * c->Sq * c->Sk);
    int64_t qshape[4] = {c->B, c->Sq, c->H, c->D};
    int64_t kshape[4] = {c->B, c->Sk, c->Hk, c->D};
    int64_t lshape[3] = {c->B, c->H, c->Sq};
    int64_t mshape[4] = {c->B, c->H, c->Sq, c->Sk};
    double *qd, *kd, *vd, *dod, *outd, *ref[3], *bnd[3], *naive[3], *given[3];
    void *q, *k, *v, *dout, *out, *grad[3];
    float *lse;
    uint8_t *mask = NULL;
    fa_tensor tq, tk, tv, tdo, tout, tlse, tg[3];
    fa_params params;
    ref_problem p;
    bverdict r;
    size_t n[3], i;
    int g;

    q = random_tensor(rng, t, nq, &qd, "q");
    k = random_tensor(rng, t, nk, &kd, "k");
    v = random_tensor(rng, t, nk, &vd, "v");
    dout = random_tensor(rng, t, nq, &dod, "dout");
    out = cli_xmalloc(nq * cli_dtype_size(t), "out");
    lse = cli_xmalloc(nl * sizeof(float), "lse");
    cli_poison(out, t, nq);
    cli_poison(lse, FA_DTYPE_F32, nl);
    n[0] = nq;
    n[1] = n[2] = nk;
    for (g = 0; g < 3; g++) {
        grad[g] = cli_xmalloc(n[g] * cli_dtype_size(t), "gradient");
        cli_poison(grad[g], t, n[g]);
        ref[g] = cli_xmalloc(n[g] * sizeof(double), "reference gradient");
        bnd[g] = cli_xmalloc(n[g] * sizeof(double), "reference bound");
        naive[g] = cli_xmalloc(n[g] * sizeof(double), "naive gradient");
        given[g] = cli_xmalloc(n[g] * sizeof(double), "reference gradient");
    }

    tq = place(be, fa_tensor_contiguous(q, t, 4, qshape), nq * cli_dtype_size(t));
    tk = place(be, fa_tensor_contiguous(k, t, 4, kshape), nk * cli_dtype_size(t));
    tv = place(be, fa_tensor_contiguous(v, t, 4, kshape), nk * cli_dtype_size(t));
    tdo = place(be, fa_tensor_contiguous(dout, t, 4, qshape), nq * cli_dtype_size(t));
    tout = place(be, fa_tensor_contiguous(out, t, 4, qshape), nq * cli_dtype_size(t));
    tlse = place(be, fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, lshape), nl * sizeof(float));
    tg[0] = place(be, fa_tensor_contiguous(grad[0], t, 4, qshape), nq * cli_dtype_size(t));
    tg[1] = place(be, fa_tensor_contiguous(grad[1], t, 4, kshape), nk * cli_dtype_size(t));
    tg[2] = place(be, fa_tensor_contiguous(grad[2], t, 4, kshape), nk * cli_dtype_size(t));
    fa_params_init(&params);
    params.causal = c->causal;
    params.dropout_p = c->dropout_p;
    params.dropout_seed = cli_rng_next(rng);
    params.dropout_offset = cli_rng_next(rng);
    CLI_CHECK("fa_forward", fa_forward(ctx, &params, &tq, &tk, &tv, &tout, &tlse));
    CLI_CHECK("fa_backward",
              fa_backward(ctx, &params, &tq, &tk, &tv, &tout, &tdo, &tlse, &tg[0], &tg[1], &tg[2]));
    fetch(be, out, &tout, nq * cli_dtype_size(t));
    for (g = 0; g < 3; g++)
        fetch(be, grad[g], &tg[g], n[g] * cli_dtype_size(t));
    release(be);

    memset(&p, 0, sizeof p);
    p.B = c->B;
    p.Sq = c->Sq;
    p.Sk = c->Sk;
    p.H = c->H;
    p.Hk = c->Hk;
    p.D = c->D;
    p.scale = 1.0 / sqrt((double)c->D);
    p.causal = c->causal;
    p.window_left = p.window_right = -1;
    if (c->dropout_p > 0.0f) {
        fa_tensor tm;
        mask = cli_xmalloc(nm, "dropout mask");
        tm = fa_tensor_contiguous(mask, FA_DTYPE_U8, 4, mshape);
        CLI_CHECK("fa_dropout_mask", fa_dropout_mask(&params, &tm));
        p.dropout_mask = mask;
        p.dropout_p = (double)c->dropout_p;
    }
    ref_attention_backward(&p, qd, kd, vd, dod, NULL, NULL, ref[0], ref[1], ref[2]);
    ref_attention_backward_bound(&p, qd, kd, vd, dod, bnd[0], bnd[1], bnd[2]);
    if (t != FA_DTYPE_F32)
        ref_attention_backward_rounded(&p, qd, kd, vd, dod, NULL, NULL, naive[0], naive[1],
                                       naive[2], t == FA_DTYPE_F16 ? round_f16 : round_bf16);
    /* the exact gradient with Δ = rowsum(dout * out) from the out the forward stored */
    outd = cli_xmalloc(nq * sizeof(double), "out");
    for (i = 0; i < nq; i++)
        outd[i] = cli_load(out, t, i);
    ref_attention_backward_given_out(&p, qd, kd, vd, outd, dod, given[0], given[1], given[2]);

    for (g = 0; g < 3; g++) {
        double maxref = 0.0, maxbnd = 0.0, nerr = 0.0, eout = 0.0, maxgiven = 0.0;
        r.err[g] = 0.0;
        for (i = 0; i < n[g]; i++) {
            note(&r.err[g], abs_err(cli_load(grad[g], t, i), ref[g][i]));
            note(&maxref, fabs(ref[g][i]));
            note(&maxbnd, bnd[g][i]);
            note(&eout, fabs(given[g][i] - ref[g][i]));
            note(&maxgiven, fabs(given[g][i]));
            if (t != FA_DTYPE_F32)
                note(&nerr, fabs(naive[g][i] - ref[g][i]));
        }
        r.tol[g] = t == FA_DTYPE_F32
                       ? 1e-5 * maxref + 4.0 * 0x1.0p-24 * maxbnd
                       : 2.0 * nerr + dtype_ulp(t, maxref > maxgiven ? maxref : maxgiven) + eout;
    }

    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
    free(qd);
    free(kd);
    free(vd);
    free(dod);
    free(mask);
    free(outd);
    for (g = 0; g < 3; g++) {
        free(grad[g]);
        free(ref[g]);
        free(bnd[g]);
        free(naive[g]);
        free(given[g]);
    }
    return r;
}

static void describe_bcase(const bcase *c, char *buf, size_t n) {
    snprintf(buf, n, "B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld", (long long)c->B,
             (long long)c->Sq, (long long)c->Sk, (long long)c->H, (long long)c->Hk,
             (long long)c->D);
}

static void print_backward_header(void) {
    printf("  %-14s %-51s %-5s %9s %9s %9s %9s %9s %9s  %s\n", "case", "shape", "dtype", "err dq",
           "err dk", "err dv", "tol dq", "tol dk", "tol dv", "verdict");
}

static void print_table_header(void) {
    printf("  %-14s %-51s %-5s %9s %9s %9s %9s  %s\n", "case", "shape", "dtype", "err out",
           "err lse", "tol out", "tol lse", "verdict");
}

static void verify_usage(FILE *f) {
    fprintf(f, "usage: flashattn verify [--threads N] [--seed S] [-q]\n"
               "\n"
               "Runs small attentions on every available backend against the fp64 reference and\n"
               "prints one verdict per case. Exit status 0 only if every case passes.\n"
               "\n"
               "  --threads N   use a context with N threads (default: the default context)\n"
               "  --seed S      replay the inputs of an earlier run (default: a fresh seed)\n"
               "  -q, --quiet   print only failing cases and the summary line\n");
}

/* The forward cases on one backend, one verdict line each (failures only when quiet); returns
 * the number that failed. */
static size_t run_forward_cases(fa_context *ctx, backend *be, cli_rng *rng, int quiet) {
    size_t ci, failed = 0;
    for (ci = 0; ci < NUM_CASES; ci++) {
        const vcase *c = &cases[ci];
        char shape[128];
        double tol_out, tol_lse;
        int pass;
        verdict r = c->nseq ? run_varlen(ctx, be, c, rng) : run_fixed(ctx, be, c, rng);
        verify_tolerance(c->dtype, r.max_ref_out, r.max_ref_lse, &tol_out, &tol_lse);
        pass = r.out_err <= tol_out && r.lse_err <= tol_lse; /* false for NaN/inf errors */
        if (!pass)
            failed++;
        if (quiet && !pass && failed == 1)
            print_table_header();
        if (!quiet || !pass) {
            describe(c, shape, sizeof shape);
            printf("  %-14s %-51s %-5s %9.2e %9.2e %9.1e %9.1e  %s\n", c->name, shape,
                   cli_dtype_name(c->dtype), r.out_err, r.lse_err, tol_out, tol_lse,
                   pass ? "PASS" : "FAIL");
        }
    }
    return failed;
}

/* The backward cases on one backend, with their header unless quiet (then only failures). */
static size_t run_backward_cases(fa_context *ctx, backend *be, cli_rng *rng, int quiet) {
    size_t ci, failed = 0;
    int header = 0;
    if (!quiet) {
        if (be->cuda)
            printf("\nbackward on cuda:%d: fa_forward, then fa_backward with a random dout; dq, dk, "
                   "dv vs the fp64 reference backward (tolerances as on the cpu)\n",
                   (int)be->index);
        else
            printf("\nbackward on cpu: fa_forward, then fa_backward with a random dout; dq, dk, dv "
                   "vs the fp64 reference backward\n");
        if (!be->cuda)
            printf("tolerance (max abs error per gradient, R = its max|ref|): fp32 1e-5*R + "
                   "4*2^-24*(max sum of |terms|); fp16/bf16 2*(naive low-precision backward's "
                   "error) + ulp(R) + (effect of out's rounding)\n");
        print_backward_header();
        header = 1;
    }
    for (ci = 0; ci < NUM_BCASES; ci++) {
        const bcase *c = &bcases[ci];
        char shape[128];
        int pass = 1, g;
        const bverdict r = run_backward(ctx, be, c, rng);
        for (g = 0; g < 3; g++)
            pass &= r.err[g] <= r.tol[g]; /* false for NaN/inf errors */
        if (!pass)
            failed++;
        if (!pass && !header) {
            if (be->cuda)
                printf("backward on cuda:%d\n", (int)be->index);
            print_backward_header();
            header = 1;
        }
        if (!quiet || !pass) {
            describe_bcase(c, shape, sizeof shape);
            printf("  %-14s %-51s %-5s %9.2e %9.2e %9.2e %9.1e %9.1e %9.1e  %s\n", c->name, shape,
                   cli_dtype_name(c->dtype), r.err[0], r.err[1], r.err[2], r.tol[0], r.tol[1],
                   r.tol[2], pass ? "PASS" : "FAIL");
        }
    }
    return failed;
}

int cmd_verify(int argc, char **argv) {
    backend cpu = {0, 0, {NULL}, 0};
    int32_t ncuda = 0, dev;
    char cuda_note[1200];
    size_t total;
    long threads = 0;
    int quiet = 0, have_seed = 0;
    unsigned long long seed = 0;
    fa_context *ctx = NULL;
    cli_rng rng;
    size_t failed = 0;
    int i;

    for (i = 1; i < argc; i++) {
        const char *val = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            verify_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet")) {
            quiet = 1;
        } else if (cli_opt_value(argc, argv, &i, "--threads", &val)) {
            if (cli_parse_long(val, 1, 1024, &threads) != 0) {
                fprintf(stderr, "flashattn verify: --threads needs an integer in 1..1024\n");
                return 2;
            }
        } else if (cli_opt_value(argc, argv, &i, "--seed", &val)) {
            char *end = NULL;
            if (!val || !*val || (seed = strtoull(val, &end, 0), *end != '\0')) {
                fprintf(stderr, "flashattn verify: --seed needs an unsigned integer\n");
                return 2;
            }
            have_seed = 1;
        } else {
            fprintf(stderr, "flashattn verify: unknown argument '%s'\n\n", argv[i]);
            verify_usage(stderr);
            return 2;
        }
    }
    if (!have_seed)
        seed = cli_fresh_seed();
    rng.state = seed;

    if (threads > 0) {
        fa_context_options opts;
        fa_context_options_init(&opts);
        opts.num_threads = (int32_t)threads;
        CLI_CHECK("fa_context_create", fa_context_create(&opts, &ctx));
    }

    if (!quiet) {
        printf("flashattn verify: libflashattn %s\n", fa_version_string());
        printf("build: %s\n", fa_build_info());
        printf("reference: fp64 naive attention; inputs uniform in [-1,1] rounded to the dtype, "
               "seed 0x%016llx (--seed replays); outputs poisoned with NaN\n",
               seed);
        printf("tolerance (max abs error): fp32 out/lse 1e-5*max(1,max|ref|); fp16 out 2e-3, "
               "bf16 out 1.6e-2 absolute; fp16/bf16 lse the same factor * max(1,max|ref lse|)\n");
        printf("\nbackend cpu (%d threads%s)\n", (int)fa_context_num_threads(ctx),
               ctx ? ", --threads" : ", default context");
        print_table_header();
    }

    failed += run_forward_cases(ctx, &cpu, &rng, quiet);
    failed += run_backward_cases(ctx, &cpu, &rng, quiet);
    total = NUM_CASES + NUM_BCASES;
    if (fa_device_count(FA_DEVICE_CUDA, &ncuda) != FA_OK || ncuda == 0) {
        const char *why = ncuda == 0 && !fa_last_error_message()[0] ? "no CUDA device visible"
                                                                    : fa_last_error_message();
        snprintf(cuda_note, sizeof cuda_note, "cuda skipped (%s)", why);
        if (!quiet)
            printf("\nbackend cuda: skipped: %s\n", why);
    } else {
        for (dev = 0; dev < ncuda; dev++) {
            backend gpu = {1, dev, {NULL}, 0};
            if (!quiet) {
                printf("\nbackend cuda:%d (cu_seqlens_q on the device, cu_seqlens_k on the "
                       "host)\n", (int)dev);
                print_table_header();
            }
            size_t nkv;
            failed += run_forward_cases(ctx, &gpu, &rng, quiet);
            failed += run_backward_cases(ctx, &gpu, &rng, quiet);
            failed += verify_kvcache_cases(dev, &rng, quiet, &nkv);
            total += NUM_CASES + NUM_BCASES + nkv;
        }
        snprintf(cuda_note, sizeof cuda_note, "forward, backward and KV cache on %d CUDA device%s",
                 (int)ncuda, ncuda == 1 ? "" : "s");
    }

    if (failed)
        printf("verify: FAIL, %zu of %zu cases failed (seed 0x%016llx); cpu forward and backward, "
               "%s\n", failed, total, seed, cuda_note);
    else
        printf("verify: PASS, %zu of %zu cases passed; cpu forward and backward, %s\n", total,
               total, cuda_note);

    fa_context_destroy(ctx);
    return failed ? 1 : 0;
}
