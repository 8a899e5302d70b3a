/* SPDX-License-Identifier: MIT */
/*
 * test_sinks.c — attention sinks (params.sinks, params.dsinks) on the CPU against the fp64
 * reference.
 *
 * The sink reference is computed here from the reference's own un-sinked results (the
 * reference has no sinks): with the keys' out O and lse L of a row and the sink s of its head,
 *   L' = logaddexp(L, s),  O' = O · exp(L − L')           (a row with no key: O' = 0, L' = s)
 * and the gradients follow from the sink being a key whose value is 0: P'_j = P_j σ with
 * σ = exp(L − L'), so dV = P'ᵀ dO and dS = P'∘(dP − dO·O') are the un-sinked formulas with dO
 * replaced by σ∘dO and out by O' (ref_attention_backward_given_out), and
 *   dL/ds = −Σ_{b,i} exp(s − L'_bi) · dO_bi·O'_bi.
 * A finite-difference case in fp64 checks both derivations against the reference's forward.
 *
 * Per case (fresh normal inputs, outputs poisoned with NaN, canaries around dsinks):
 *   forward:  out and lse against the sinked reference (tu_check_attention: fp32 within 1e-5,
 *             fp16/bf16 within twice a naive implementation in the dtype plus an ulp);
 *   backward: dq, dk, dv against the exact gradient of what fa_backward was handed (the stored
 *             out and lse): |got − g| <= ½ ulp(got, g) + 1e-5·R + 4u·bnd (+ 2^-8·bnd for bf16
 *             on bf16 dot products), as tests/backward_check.h; fp32 also against the exact
 *             gradient of q, k, v, dout; dsinks against the fp64 sum over the stored out and
 *             lse within 32u·Σ|terms| (the backward's fp32 Δ of up to 16 + D/16 terms per
 *             partial sum) and, for fp32, the exact one within 1e-5·Σ|terms|;
 *   the same call on 1 and 3 threads gives bitwise identical results; sinks of -inf give the
 *   results of no sinks bitwise.
 * Then fa_forward_kvcache with sinks, every error path with outputs untouched, and a struct
 * from before sinks (its sinks are not read).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "reference/attention_ref_backward.h"
#include "test.h"
#include "testutil.h"

#include <stddef.h>

typedef struct sink_case {
    int dtype;
    int64_t B, Sq, Sk, H, Hk, D;
    int causal, wl, wr;
    double softcap;
    int alibi;
    int varlen;               /* cu below: B sequences, rows outside them before and after */
    const int32_t *cuq, *cuk; /* varlen offsets (B + 1) */
    int64_t total_q, total_k;
    double sink_amp; /* sinks ~ N(0, amp²); head 0 = -inf, head H-1 = big when H > 2 */
    double big;      /* head H-1's sink when H > 2 */
} sink_case;

static fa_context *ctx1, *ctx3;

static double logaddexp(double a, double b) {
    if (a == -INFINITY)
        return b;
    if (b == -INFINITY)
        return a;
    return fmax(a, b) + log1p(exp(-fabs(a - b)));
}

static double half_ulp(int dtype, double a, double b) {
    const double x = fmax(fabs(a), fabs(b));
    return x == 0.0 ? 0.0 : 0.5 * tu_ulp(dtype, x);
}

static int bf16_products(void) {
    const char *info = fa_build_info();
    return strstr(info, "+ avx512_bf16") != NULL || strstr(info, "in use: refbf16") != NULL;
}

/* lse index of (b, h, row i of sequence b) in the call's lse layout. */
static int64_t lse_at(const sink_case *c, int64_t b, int64_t h, int64_t i) {
    if (c->varlen)
        return h * c->total_q + c->cuq[b] + i;
    return (b * c->H + h) * c->Sq + i;
}
static int64_t row0_q(const sink_case *c, int64_t b) { return c->varlen ? c->cuq[b] : b * c->Sq; }
static int64_t row0_k(const sink_case *c, int64_t b) { return c->varlen ? c->cuk[b] : b * c->Sk; }
static int64_t len_q(const sink_case *c, int64_t b) {
    return c->varlen ? c->cuq[b + 1] - c->cuq[b] : c->Sq;
}
static int64_t len_k(const sink_case *c, int64_t b) {
    return c->varlen ? c->cuk[b + 1] - c->cuk[b] : c->Sk;
}

static ref_problem ref_of(const sink_case *c, int64_t b, double scale, const double *slopes) {
    return (ref_problem){.B = 1,
                         .Sq = len_q(c, b),
                         .Sk = len_k(c, b),
                         .H = c->H,
                         .Hk = c->Hk,
                         .D = c->D,
                         .scale = scale,
                         .causal = c->causal,
                         .window_left = c->wl,
                         .window_right = c->wr,
                         .softcap = c->softcap,
                         .alibi = c->alibi ? slopes : NULL};
}

/* The sinked reference forward: out (rows, H, D), lse and the keys' lse (without the sink)
 * in the call's layout (rows outside every sequence: 0 and -inf); sigma (rows, H) =
 * exp(L − L'); round_fn: the naive one in a dtype. */
static void ref_forward(const sink_case *c, double scale, const double *slopes, const double *sk,
                        const double *q, const double *k, const double *v, double *out, double *lse,
                        double *lkeys, double *sigma, double (*round_fn)(double)) {
    const int64_t H = c->H, D = c->D, Hk = c->Hk, rows = c->varlen ? c->total_q : c->B * c->Sq;
    for (int64_t t = 0; t < rows * H * D; t++)
        out[t] = 0.0;
    for (int64_t t = 0; t < rows * H; t++)
        lse[t] = lkeys[t] = -INFINITY, sigma[t] = 0.0;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t sq = len_q(c, b), r0 = row0_q(c, b), k0 = row0_k(c, b);
        if (sq == 0)
            continue;
        const ref_problem rp = ref_of(c, b, scale, slopes);
        double *l = malloc(sizeof(double) * (size_t)(H * sq));
        if (round_fn)
            ref_attention_forward_rounded(&rp, q + r0 * H * D, k + k0 * Hk * D, v + k0 * Hk * D,
                                          out + r0 * H * D, l, round_fn);
        else
            ref_attention_forward(&rp, q + r0 * H * D, k + k0 * Hk * D, v + k0 * Hk * D,
                                  out + r0 * H * D, l);
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sq; i++) {
                const double L = l[h * sq + i], Lp = logaddexp(L, sk[h]);
                const double sg = L == -INFINITY ? 0.0 : exp(L - Lp);
                double *o = out + ((r0 + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++)
                    o[d] = round_fn ? round_fn(o[d] * sg) : o[d] * sg;
                lse[lse_at(c, b, h, i)] = Lp;
                lkeys[lse_at(c, b, h, i)] = L;
                sigma[(r0 + i) * H + h] = sg;
            }
        free(l);
    }
}

/* The sinked reference gradient of q, k, v given out (rows, H, D) and sigma: the un-sinked
 * given-out gradient of sigma·dout; bnd (optional): ref_attention_backward_bound of the same. */
static void ref_backward(const sink_case *c, double scale, const double *slopes, const double *q,
                         const double *k, const double *v, const double *out, const double *dout,
                         const double *sigma, double *dq, double *dk, double *dv, double *bq,
                         double *bk, double *bv) {
    const int64_t H = c->H, D = c->D, Hk = c->Hk;
    const int64_t rows = c->varlen ? c->total_q : c->B * c->Sq;
    const int64_t krows = c->varlen ? c->total_k : c->B * c->Sk;
    double *sd = malloc(sizeof(double) * (size_t)(rows * H * D + 1));
    for (int64_t t = 0; t < rows * H * D; t++)
        sd[t] = dout[t] * sigma[t / D];
    for (int64_t t = 0; t < rows * H * D; t++)
        dq[t] = bq[t] = 0.0;
    for (int64_t t = 0; t < krows * Hk * D; t++)
        dk[t] = dv[t] = bk[t] = bv[t] = 0.0;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t r0 = row0_q(c, b) * H * D, k0 = row0_k(c, b) * Hk * D;
        if (len_q(c, b) == 0 && len_k(c, b) == 0)
            continue;
        const ref_problem rp = ref_of(c, b, scale, slopes);
        ref_attention_backward_given_out(&rp, q + r0, k + k0, v + k0, out + r0, sd + r0, dq + r0,
                                         dk + k0, dv + k0);
        ref_attention_backward_bound(&rp, q + r0, k + k0, v + k0, sd + r0, bq + r0, bk + k0,
                                     bv + k0);
    }
    free(sd);
}

/* dL/ds per head from out (rows, H, D) and lse (call layout); abs: Σ|terms|; w: Σ exp(s − lse)
 * (may be NULL). */
static void ref_dsinks(const sink_case *c, const double *sk, const double *out, const double *lse,
                       const double *dout, double *ds, double *abs, double *w) {
    const int64_t H = c->H, D = c->D;
    double w_[64];
    if (!w)
        w = w_;
    for (int64_t h = 0; h < H; h++) {
        ds[h] = abs[h] = w[h] = 0.0;
        if (sk[h] == -INFINITY)
            continue;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t i = 0; i < len_q(c, b); i++) {
                const double L = lse[lse_at(c, b, h, i)];
                if (L == -INFINITY)
                    continue;
                const int64_t at = ((row0_q(c, b) + i) * H + h) * D;
                double dot = 0.0, adot = 0.0;
                for (int64_t d = 0; d < D; d++) {
                    dot += dout[at + d] * out[at + d];
                    adot += fabs(dout[at + d] * out[at + d]);
                }
                ds[h] -= exp(sk[h] - L) * dot;
                abs[h] += exp(sk[h] - L) * adot;
                w[h] += exp(sk[h] - L);
            }
    }
}

/* got vs g elementwise with the backward_check.h criterion; ref2 (fp32 only, may be NULL): the
 * exact gradient, within 1e-5·R + 4u·bnd. */
static void check_grad(const char *name, int dtype, int64_t n, const double *got, const double *g,
                       const double *ref2, const double *bnd) {
    const double u = 0x1p-24, extra = dtype == FA_DTYPE_BF16 && bf16_products() ? 0x1p-8 : 0.0;
    double R = 0.0;
    for (int64_t t = 0; t < n; t++)
        R = fmax(R, fabs(g[t]));
    int64_t bad = 0;
    for (int64_t t = 0; t < n; t++) {
        const double tol = half_ulp(dtype, got[t], g[t]) + 1e-5 * R + (4.0 * u + extra) * bnd[t];
        if (!(fabs(got[t] - g[t]) <= tol) && bad++ < 3)
            CHECK_MSG(0, "%s[%lld] = %.9g, want %.9g (tol %.3g)", name, (long long)t, got[t], g[t],
                      tol);
        if (ref2 && !(fabs(got[t] - ref2[t]) <= 1e-5 * R + 4.0 * u * bnd[t]) && bad++ < 3)
            CHECK_MSG(0, "%s[%lld] = %.9g, exact %.9g", name, (long long)t, got[t], ref2[t]);
    }
    CHECK_MSG(bad == 0, "%s: %lld elements out of tolerance", name, (long long)bad);
}

typedef struct run_out {
    tu_tensor out, lse, dq, dk, dv;
    float dsinks[66]; /* canary, H <= 64 values, canary */
} run_out;

/* Forward then backward of the case on ctx into r (poisoned first); 0 on success. */
static int run_case(const sink_case *c, fa_context *ctx, const fa_params *prm, const tu_tensor *q,
                    const tu_tensor *k, const tu_tensor *v, const tu_tensor *dout,
                    const int32_t *cuq, const int32_t *cuk, run_out *r) {
    tu_poison(&r->out), tu_poison(&r->lse), tu_poison(&r->dq), tu_poison(&r->dk);
    tu_poison(&r->dv);
    memset(r->dsinks, 0xFF, sizeof r->dsinks);
    fa_status st;
    fa_tensor tcq, tck;
    if (c->varlen) {
        const int64_t n = c->B + 1;
        tcq = fa_tensor_contiguous((void *)cuq, FA_DTYPE_I32, 1, &n);
        tck = fa_tensor_contiguous((void *)cuk, FA_DTYPE_I32, 1, &n);
        st = fa_varlen_forward(ctx, prm, &q->t, &k->t, &v->t, &tcq, &tck, c->Sq, c->Sk, &r->out.t,
                               &r->lse.t);
    } else {
        st = fa_forward(ctx, prm, &q->t, &k->t, &v->t, &r->out.t, &r->lse.t);
    }
    CHECK_MSG(st == FA_OK, "forward: %s (%s)", fa_status_name(st), fa_last_error_message());
    if (st != FA_OK)
        return 1;
    if (c->varlen)
        st = fa_varlen_backward(ctx, prm, &q->t, &k->t, &v->t, &r->out.t, &dout->t, &r->lse.t, &tcq,
                                &tck, c->Sq, c->Sk, &r->dq.t, &r->dk.t, &r->dv.t);
    else
        st = fa_backward(ctx, prm, &q->t, &k->t, &v->t, &r->out.t, &dout->t, &r->lse.t, &r->dq.t,
                         &r->dk.t, &r->dv.t);
    CHECK_MSG(st == FA_OK, "backward: %s (%s)", fa_status_name(st), fa_last_error_message());
    return st != FA_OK;
}

static void alloc_outs(const sink_case *c, const int64_t *qs, const int64_t *ks, run_out *r) {
    const int nd = c->varlen ? 3 : 4;
    const int64_t ls[3] = {c->varlen ? c->H : c->B, c->varlen ? c->total_q : c->H, c->Sq};
    tu_alloc(&r->out, c->dtype, nd, qs, TU_CONTIG);
    tu_alloc(&r->lse, FA_DTYPE_F32, nd - 1, ls, TU_CONTIG);
    tu_alloc(&r->dq, c->dtype, nd, qs, TU_CONTIG);
    tu_alloc(&r->dk, c->dtype, nd, ks, TU_CONTIG);
    tu_alloc(&r->dv, c->dtype, nd, ks, TU_CONTIG);
}

static void free_outs(run_out *r) {
    tu_free(&r->out), tu_free(&r->lse), tu_free(&r->dq), tu_free(&r->dk), tu_free(&r->dv);
}

static int same_bytes(const tu_tensor *a, const tu_tensor *b) {
    return memcmp(a->buf, b->buf, (size_t)a->nbuf * tu_dtype_size(a->t.dtype)) == 0;
}

static void test_case(const sink_case *c) {
    CASE_BEGIN("%s B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld causal=%d window=(%d,%d) "
               "softcap=%g alibi=%d varlen=%d big=%g",
               tu_dtype_name(c->dtype), (long long)c->B, (long long)c->Sq, (long long)c->Sk,
               (long long)c->H, (long long)c->Hk, (long long)c->D, c->causal, c->wl, c->wr,
               c->softcap, c->alibi, c->varlen, c->big);
    const int64_t H = c->H, Hk = c->Hk, D = c->D;
    const int64_t rows = c->varlen ? c->total_q : c->B * c->Sq;
    const int64_t krows = c->varlen ? c->total_k : c->B * c->Sk;
    const int nd = c->varlen ? 3 : 4;
    const int64_t qs[4] = {c->varlen ? c->total_q : c->B, c->varlen ? H : c->Sq, c->varlen ? D : H,
                           D};
    const int64_t ks[4] = {c->varlen ? c->total_k : c->B, c->varlen ? Hk : c->Sk,
                           c->varlen ? D : Hk, D};
    tu_tensor q, k, v, dout, sinks, slopes;
    tu_alloc(&q, c->dtype, nd, qs, TU_CONTIG);
    tu_alloc(&k, c->dtype, nd, ks, TU_CONTIG);
    tu_alloc(&v, c->dtype, nd, ks, TU_CONTIG);
    tu_alloc(&dout, c->dtype, nd, qs, TU_CONTIG);
    tu_alloc(&sinks, FA_DTYPE_F32, 1, &H, TU_CONTIG);
    tu_alloc(&slopes, FA_DTYPE_F32, 1, &H, TU_CONTIG);
    const size_t nq = (size_t)(rows * H * D), nk = (size_t)(krows * Hk * D);
    double *dq_ = malloc(sizeof(double) * (nq + 1)), *dk_ = malloc(sizeof(double) * (nk + 1));
    double *dv_ = malloc(sizeof(double) * (nk + 1)), *dd = malloc(sizeof(double) * (nq + 1));
    tu_fill_normal(&q, 1.0, dq_);
    tu_fill_normal(&k, 1.0, dk_);
    tu_fill_normal(&v, 1.0, dv_);
    tu_fill_normal(&dout, 1.0, dd);
    double sk[64], sl[64];
    for (int64_t h = 0; h < H; h++) {
        sk[h] = (double)(float)(c->sink_amp * tu_normal());
        sl[h] = (double)(float)(0.1 + 0.4 * tu_uniform());
    }
    sk[0] = -INFINITY;
    if (H > 2)
        sk[H - 1] = c->big;
    for (int64_t h = 0; h < H; h++) {
        ((float *)sinks.buf)[h] = (float)sk[h];
        ((float *)slopes.buf)[h] = (float)sl[h];
    }
    const double scale = (double)(float)(1.0 / sqrt((double)D));

    fa_params prm;
    fa_params_init(&prm);
    prm.softmax_scale = (float)scale;
    prm.causal = c->causal;
    prm.window_left = c->wl;
    prm.window_right = c->wr;
    prm.softcap = (float)c->softcap;
    if (c->alibi)
        prm.alibi_slopes = slopes.t;
    prm.sinks = sinks.t;
    run_out r3, r1;
    alloc_outs(c, qs, ks, &r3);
    alloc_outs(c, qs, ks, &r1);
    prm.dsinks = fa_tensor_contiguous(r3.dsinks + 1, FA_DTYPE_F32, 1, &H);
    if (run_case(c, ctx3, &prm, &q, &k, &v, &dout, c->cuq, c->cuk, &r3))
        goto done;

    /* forward against the sinked reference */
    double *ref = malloc(sizeof(double) * (nq + 1)),
           *lref = malloc(sizeof(double) * (rows * H + 1));
    double *sig = malloc(sizeof(double) * (rows * H + 1)), *got = malloc(sizeof(double) * (nq + 1));
    double *lgot = malloc(sizeof(double) * (rows * H + 1));
    double *nv = malloc(sizeof(double) * (nq + 1)), *lnv = malloc(sizeof(double) * (rows * H + 1));
    double *sig_nv = malloc(sizeof(double) * (rows * H + 1));
    double *lk = malloc(sizeof(double) * (rows * H + 1)),
           *lk_nv = malloc(sizeof(double) * (rows * H + 1));
    ref_forward(c, scale, sl, sk, dq_, dk_, dv_, ref, lref, lk, sig, NULL);
    if (c->dtype != FA_DTYPE_F32)
        ref_forward(c, scale, sl, sk, dq_, dk_, dv_, nv, lnv, lk_nv, sig_nv, tu_round_fn(c->dtype));
    tu_gather(&r3.out, got);
    tu_gather(&r3.lse, lgot);
    /* out: varlen is one batch of total_q rows, whose lse (1, H, total_q) is the call's
     * (H, total_q). The keys' lse serves for the rows that see no key (out exactly 0) and for
     * the fp32 tolerance's score size, which a large sink must not loosen; lse is checked below. */
    const int64_t cb = c->varlen ? 1 : c->B, cs = c->varlen ? c->total_q : c->Sq;
    tu_check_attention(c->dtype, cb, cs, H, D, got, ref, c->dtype != FA_DTYPE_F32 ? nv : NULL, NULL,
                       lk, NULL, NULL, NULL);
    /* lse per row: fp32 within 1e-5 max(1, |ref|); fp16/bf16 within twice the naive error plus
     * that; -inf exactly where the reference's is (no key, no sink); a row that sees no key (or
     * whose keys the sink outweighs to 0) has exactly its sink */
    double lnerr = 0.0;
    for (int64_t t = 0; c->dtype != FA_DTYPE_F32 && t < rows * H; t++)
        if (isfinite(lref[t]))
            lnerr = fmax(lnerr, fabs(lnv[t] - lref[t]));
    int64_t lbad = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < len_q(c, b); i++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t at = lse_at(c, b, h, i);
                const double tol = 2.0 * lnerr + 1e-5 * fmax(1.0, fabs(lref[at]));
                int ok = lref[at] == -INFINITY ? lgot[at] == -INFINITY
                                               : fabs(lgot[at] - lref[at]) <= tol;
                if (sig[(row0_q(c, b) + i) * H + h] == 0.0 && sk[h] != -INFINITY)
                    ok &= lgot[at] == (double)(float)sk[h];
                if (!ok && lbad++ < 3)
                    CHECK_MSG(0, "lse b=%lld i=%lld h=%lld: %.9g, want %.9g (sink %g)",
                              (long long)b, (long long)i, (long long)h, lgot[at], lref[at], sk[h]);
            }

    /* backward: against the exact gradient of the stored out and lse, then the exact one */
    double *gq = malloc(sizeof(double) * (nq + 1)), *gk = malloc(sizeof(double) * (nk + 1));
    double *gv = malloc(sizeof(double) * (nk + 1)), *bq = malloc(sizeof(double) * (nq + 1));
    double *bk = malloc(sizeof(double) * (nk + 1)), *bv = malloc(sizeof(double) * (nk + 1));
    double *eq = malloc(sizeof(double) * (nq + 1)), *ek = malloc(sizeof(double) * (nk + 1));
    double *ev = malloc(sizeof(double) * (nk + 1)), *x = malloc(sizeof(double) * (nq + nk + 1));
    /* sigma of the stored lse: exp(L_ref − L'_stored), L_ref the keys' exact lse */
    double *sig_got = malloc(sizeof(double) * (rows * H + 1));
    for (int64_t t = 0; t < rows * H; t++)
        sig_got[t] = 0.0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < len_q(c, b); i++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t row = (row0_q(c, b) + i) * H + h;
                if (sig[row] == 0.0)
                    continue;
                const double L = lref[lse_at(c, b, h, i)] + log(sig[row]); /* keys' lse */
                sig_got[row] = exp(L - lgot[lse_at(c, b, h, i)]);
            }
    ref_backward(c, scale, sl, dq_, dk_, dv_, got, dd, sig_got, gq, gk, gv, bq, bk, bv);
    const int f32 = c->dtype == FA_DTYPE_F32;
    if (f32)
        ref_backward(c, scale, sl, dq_, dk_, dv_, ref, dd, sig, eq, ek, ev, bq, bk, bv);
    tu_gather(&r3.dq, x);
    check_grad("dq", c->dtype, (int64_t)nq, x, gq, f32 ? eq : NULL, bq);
    tu_gather(&r3.dk, x);
    check_grad("dk", c->dtype, (int64_t)nk, x, gk, f32 ? ek : NULL, bk);
    tu_gather(&r3.dv, x);
    check_grad("dv", c->dtype, (int64_t)nk, x, gv, f32 ? ev : NULL, bv);
    /* dsinks */
    double dsg[64], asg[64], wsg[64], dse[64], ase[64];
    ref_dsinks(c, sk, got, lgot, dd, dsg, asg, wsg);
    ref_dsinks(c, sk, ref, lref, dd, dse, ase, NULL);
    CHECK_MSG(isnan(r3.dsinks[0]) && isnan(r3.dsinks[H + 1]), "dsinks' canaries were written");
    for (int64_t h = 0; h < H; h++) {
        /* Δ's fp32 products and sums underflow by up to 2^-150 each ((D + 16) per row) when
         * a large sink leaves out subnormal; then the result rounds to fp32 */
        const double ds = r3.dsinks[1 + h], u = 0x1p-24;
        const double tol = 32.0 * u * asg[h] + (double)(D + 16) * 0x1p-150 * wsg[h] +
                           half_ulp(FA_DTYPE_F32, ds, dsg[h]);
        CHECK_MSG(fabs(ds - dsg[h]) <= tol,
                  "dsinks[%lld] = %.9g, want %.9g (given out/lse; sum|terms| %.3g)", (long long)h,
                  ds, dsg[h], asg[h]);
        if (f32)
            CHECK_MSG(fabs(ds - dse[h]) <= 1e-5 * ase[h] + tol, "dsinks[%lld] = %.9g, exact %.9g",
                      (long long)h, ds, dse[h]);
        if (sk[h] == -INFINITY)
            CHECK_MSG(ds == 0.0, "dsinks[%lld] of a -inf sink is %g", (long long)h, ds);
    }

    /* one thread: bitwise the same */
    prm.dsinks = fa_tensor_contiguous(r1.dsinks + 1, FA_DTYPE_F32, 1, &H);
    if (!run_case(c, ctx1, &prm, &q, &k, &v, &dout, c->cuq, c->cuk, &r1))
        CHECK_MSG(same_bytes(&r1.out, &r3.out) && same_bytes(&r1.lse, &r3.lse) &&
                      same_bytes(&r1.dq, &r3.dq) && same_bytes(&r1.dk, &r3.dk) &&
                      same_bytes(&r1.dv, &r3.dv) &&
                      memcmp(r1.dsinks, r3.dsinks, sizeof r1.dsinks) == 0,
                  "1 and 3 threads differ");
    /* every sink -inf: the results of no sinks, bitwise */
    for (int64_t h = 0; h < H; h++)
        ((float *)sinks.buf)[h] = -INFINITY;
    if (!run_case(c, ctx3, &prm, &q, &k, &v, &dout, c->cuq, c->cuk, &r1)) {
        fa_params none = prm;
        none.sinks.data = NULL, none.dsinks.data = NULL;
        if (!run_case(c, ctx3, &none, &q, &k, &v, &dout, c->cuq, c->cuk, &r3))
            CHECK_MSG(same_bytes(&r1.out, &r3.out) && same_bytes(&r1.lse, &r3.lse) &&
                          same_bytes(&r1.dq, &r3.dq) && same_bytes(&r1.dk, &r3.dk) &&
                          same_bytes(&r1.dv, &r3.dv),
                      "sinks of -inf differ from no sinks");
        for (int64_t h = 0; h < H; h++)
            CHECK_MSG(r1.dsinks[1 + h] == 0.0f, "dsinks[%lld] = %g with -inf sinks", (long long)h,
                      (double)r1.dsinks[1 + h]);
    }
    free(ref), free(lref), free(sig), free(got), free(lgot), free(nv), free(lnv), free(sig_nv);
    free(lk), free(lk_nv);
    free(gq), free(gk), free(gv), free(bq), free(bk), free(bv), free(eq), free(ek), free(ev);
    free(x), free(sig_got);
done:
    free_outs(&r3), free_outs(&r1);
    free(dq_), free(dk_), free(dv_), free(dd);
    tu_free(&q), tu_free(&k), tu_free(&v), tu_free(&dout), tu_free(&sinks), tu_free(&slopes);
    CASE_END();
}

static void test_grid(void) {
    static const int dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    /* sequences of 5, 0, 9 and 3 queries over 7, 4, 0 and 12 keys; rows outside before/after */
    static const int32_t cuq[5] = {2, 7, 7, 16, 19}, cuk[5] = {1, 8, 12, 12, 24};
    for (int di = 0; di < 3; di++) {
        const int dt = dtypes[di];
        const sink_case cs[] = {
            {dt, 2, 13, 17, 4, 4, 32, 0, -1, -1, 0.0, 0, 0, NULL, NULL, 0, 0, 2.0, 3.0},
            {dt, 2, 13, 9, 6, 2, 40, 1, -1, -1, 0.0, 0, 0, NULL, NULL, 0, 0, 2.0, 30.0},
            {dt, 1, 37, 70, 4, 1, 64, 0, 5, 3, 0.0, 1, 0, NULL, NULL, 0, 0, 1.0, 1e30},
            {dt, 2, 21, 21, 3, 3, 24, 1, 4, -1, 4.0, 1, 0, NULL, NULL, 0, 0, 2.0, 5.0},
            {dt, 1, 1, 300, 8, 2, 64, 0, -1, -1, 0.0, 0, 0, NULL, NULL, 0, 0, 2.0, 4.0},
            {dt, 3, 9, 6, 4, 2, 16, 1, 2, 0, 0.0, 0, 0, NULL, NULL, 0, 0, 3.0, 100.0},
            {dt, 4, 9, 12, 4, 2, 48, 1, -1, -1, 0.0, 1, 1, cuq, cuk, 21, 26, 2.0, 2.0},
            {dt, 4, 9, 12, 6, 3, 8, 0, 3, 2, 3.0, 0, 1, cuq, cuk, 21, 26, 2.0, 40.0},
        };
        for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
            test_case(&cs[i]);
    }
}

/* fp64 finite differences of the sinked reference's loss Σ out·dout: the sink's gradient and a
 * few elements of dq, dk, dv, against the formulas above (independent of the library). */
static void test_finite_differences(void) {
    CASE_BEGIN("finite differences of the sinked reference");
    const sink_case c = {FA_DTYPE_F32, 1, 5, 7,    2,    1, 4, 1,   -1, -1,
                         2.0,          0, 0, NULL, NULL, 0, 0, 1.0, 0.0};
    const int64_t nq = 5 * 2 * 4, nk = 7 * 1 * 4;
    double q[40], k[28], v[28], dout[40], sk[2] = {0.7, -1.3}, out[40], lse[10], lk[10], sig[10];
    for (int t = 0; t < nq; t++)
        q[t] = tu_normal(), dout[t] = tu_normal();
    for (int t = 0; t < nk; t++)
        k[t] = tu_normal(), v[t] = tu_normal();
    const double scale = 0.5;
    ref_forward(&c, scale, NULL, sk, q, k, v, out, lse, lk, sig, NULL);
    double gq[40], gk[28], gv[28], bq[40], bk[28], bv[28], ds[2], as[2];
    ref_backward(&c, scale, NULL, q, k, v, out, dout, sig, gq, gk, gv, bq, bk, bv);
    ref_dsinks(&c, sk, out, lse, dout, ds, as, NULL);
#define LOSS(res)                                                                                  \
    do {                                                                                           \
        double o2[40], l2[10], k2[10], s2[10];                                                     \
        ref_forward(&c, scale, NULL, sk, q, k, v, o2, l2, k2, s2, NULL);                           \
        res = 0.0;                                                                                 \
        for (int u = 0; u < nq; u++)                                                               \
            res += o2[u] * dout[u];                                                                \
    } while (0)
    const double e = 1e-6;
    double *xs[4] = {sk, q, k, v}, *gs[4] = {ds, gq, gk, gv};
    const int ns[4] = {2, 40, 28, 28};
    static const char *const names[4] = {"dsinks", "dq", "dk", "dv"};
    for (int w = 0; w < 4; w++)
        for (int t = 0; t < ns[w]; t += w ? 5 : 1) {
            const double x0 = xs[w][t];
            double lp, lm;
            xs[w][t] = x0 + e;
            LOSS(lp);
            xs[w][t] = x0 - e;
            LOSS(lm);
            xs[w][t] = x0;
            const double fd = (lp - lm) / (2 * e);
            CHECK_MSG(fabs(fd - gs[w][t]) <= 1e-7 * (1.0 + fabs(fd)),
                      "%s[%d]: analytic %.12g, "
                      "finite difference %.12g",
                      names[w], t, gs[w][t], fd);
        }
#undef LOSS
    CASE_END();
}

/* fa_forward_kvcache over a whole cache equals fa_forward with the same sinks, bitwise. */
static void test_kvcache(void) {
    CASE_BEGIN("fa_forward_kvcache with sinks");
    const int64_t B = 2, Sq = 3, Sk = 40, H = 4, Hk = 2, D = 32;
    const int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
    tu_tensor q, k, v, o1, o2, l1, l2;
    double *tmp = malloc(sizeof(double) * (size_t)(B * Sk * Hk * D));
    tu_alloc(&q, FA_DTYPE_F16, 4, qs, TU_CONTIG);
    tu_alloc(&k, FA_DTYPE_F16, 4, ks, TU_CONTIG);
    tu_alloc(&v, FA_DTYPE_F16, 4, ks, TU_CONTIG);
    tu_fill_normal(&q, 1.0, tmp);
    tu_fill_normal(&k, 1.0, tmp);
    tu_fill_normal(&v, 1.0, tmp);
    tu_alloc(&o1, FA_DTYPE_F16, 4, qs, TU_CONTIG);
    tu_alloc(&o2, FA_DTYPE_F16, 4, qs, TU_CONTIG);
    tu_alloc(&l1, FA_DTYPE_F32, 3, ls, TU_CONTIG);
    tu_alloc(&l2, FA_DTYPE_F32, 3, ls, TU_CONTIG);
    float sinks[4] = {-INFINITY, 0.5f, 3.0f, 20.0f};
    fa_params prm;
    fa_params_init(&prm);
    prm.causal = 1;
    prm.sinks = fa_tensor_contiguous(sinks, FA_DTYPE_F32, 1, &H);
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = k.t, kv.v_cache = v.t;
    fa_status st = fa_forward_kvcache(ctx3, &prm, &q.t, &kv, &o1.t, &l1.t);
    CHECK_MSG(st == FA_OK, "kvcache: %s (%s)", fa_status_name(st), fa_last_error_message());
    st = fa_forward(ctx3, &prm, &q.t, &k.t, &v.t, &o2.t, &l2.t);
    CHECK_MSG(st == FA_OK, "forward: %s (%s)", fa_status_name(st), fa_last_error_message());
    CHECK_MSG(same_bytes(&o1, &o2) && same_bytes(&l1, &l2), "kvcache and forward differ");
    /* and the sink took part: head 3's lse is at least its sink */
    CHECK(((float *)l1.buf)[(0 * H + 3) * Sq] >= 20.0f);
    free(tmp);
    tu_free(&q), tu_free(&k), tu_free(&v), tu_free(&o1), tu_free(&o2), tu_free(&l1), tu_free(&l2);
    CASE_END();
}

static int all_ff(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0xFF)
            return 0;
    return 1;
}

/* Every error: the status, a message naming the argument, and no output written. */
static void test_errors(void) {
    CASE_BEGIN("errors");
    enum { B = 1, S = 4, H = 2, D = 8 };
    const int64_t qs[4] = {B, S, H, D}, ls[3] = {B, H, S}, h2 = H, h3 = H + 1, hh[2] = {1, H};
    float qb[B * S * H * D], ob[B * S * H * D], dqb[B * S * H * D], dkb[B * S * H * D];
    float dvb[B * S * H * D], lb[B * H * S], sb[H + 1], dsb[H + 1];
    for (int i = 0; i < B * S * H * D; i++)
        qb[i] = (float)tu_normal();
    fa_tensor q = fa_tensor_contiguous(qb, FA_DTYPE_F32, 4, qs);
    fa_tensor out = fa_tensor_contiguous(ob, FA_DTYPE_F32, 4, qs);
    fa_tensor lse = fa_tensor_contiguous(lb, FA_DTYPE_F32, 3, ls);
    fa_tensor dq = fa_tensor_contiguous(dqb, FA_DTYPE_F32, 4, qs);
    fa_tensor dk = fa_tensor_contiguous(dkb, FA_DTYPE_F32, 4, qs);
    fa_tensor dv = fa_tensor_contiguous(dvb, FA_DTYPE_F32, 4, qs);
    fa_params prm;
    fa_params_init(&prm);
    CHECK(prm.sinks.data == NULL && prm.dsinks.data == NULL);
    /* a valid forward first: out and lse for the backwards below */
    sb[0] = 0.5f, sb[1] = -INFINITY, sb[2] = 1.0f;
    prm.sinks = fa_tensor_contiguous(sb, FA_DTYPE_F32, 1, &h2);
    fa_status st = fa_forward(ctx1, &prm, &q, &q, &q, &out, &lse);
    CHECK_EQ_INT(st, FA_OK);
    float ob0[B * S * H * D], lb0[B * H * S];
    memcpy(ob0, ob, sizeof ob), memcpy(lb0, lb, sizeof lb);

    typedef struct bad {
        const char *what, *word;
        fa_status want;
        fa_tensor sinks, dsinks;
        float value; /* sinks[0] */
    } bad;
    const bad fwd[] = {
        {"rank 2",
         "params.sinks",
         FA_ERR_RANK,
         fa_tensor_contiguous(sb, FA_DTYPE_F32, 2, hh),
         {0},
         0.5f},
        {"shape H+1",
         "params.sinks",
         FA_ERR_SHAPE,
         fa_tensor_contiguous(sb, FA_DTYPE_F32, 1, &h3),
         {0},
         0.5f},
        {"dtype f16",
         "params.sinks",
         FA_ERR_DTYPE,
         fa_tensor_contiguous(sb, FA_DTYPE_F16, 1, &h2),
         {0},
         0.5f},
        {"NaN",
         "params.sinks[0]",
         FA_ERR_VALUE,
         fa_tensor_contiguous(sb, FA_DTYPE_F32, 1, &h2),
         {0},
         NAN},
        {"+inf",
         "params.sinks[0]",
         FA_ERR_VALUE,
         fa_tensor_contiguous(sb, FA_DTYPE_F32, 1, &h2),
         {0},
         INFINITY},
        {"overlaps out",
         "params.sinks",
         FA_ERR_OVERLAP,
         fa_tensor_contiguous(ob, FA_DTYPE_F32, 1, &h2),
         {0},
         0.5f},
    };
    for (size_t i = 0; i < sizeof fwd / sizeof *fwd; i++) {
        fa_params p = prm;
        p.sinks = fwd[i].sinks;
        sb[0] = fwd[i].value;
        memset(ob, i == 5 ? 0 : 0xFF, sizeof ob), memset(lb, 0xFF, sizeof lb); /* 5: sinks */
        st = fa_forward(ctx1, &p, &q, &q, &q, &out, &lse);
        CHECK_MSG(st == fwd[i].want && strstr(fa_last_error_message(), fwd[i].word) &&
                      all_ff(lb, sizeof lb) && (i == 5 || all_ff(ob, sizeof ob)),
                  "forward, sinks %s: %s (%s)", fwd[i].what, fa_status_name(st),
                  fa_last_error_message());
    }
    sb[0] = 0.5f;
    memcpy(ob, ob0, sizeof ob), memcpy(lb, lb0, sizeof lb);
    const bad bwd[] = {
        {"dsinks without sinks",
         "params.dsinks",
         FA_ERR_VALUE,
         {0},
         fa_tensor_contiguous(dsb, FA_DTYPE_F32, 1, &h2),
         0.5f},
        {"dsinks shape H+1", "params.dsinks", FA_ERR_SHAPE, prm.sinks,
         fa_tensor_contiguous(dsb, FA_DTYPE_F32, 1, &h3), 0.5f},
        {"dsinks dtype bf16", "params.dsinks", FA_ERR_DTYPE, prm.sinks,
         fa_tensor_contiguous(dsb, FA_DTYPE_BF16, 1, &h2), 0.5f},
        {"dsinks overlaps sinks", "params.dsinks", FA_ERR_OVERLAP, prm.sinks,
         fa_tensor_contiguous(sb + 1, FA_DTYPE_F32, 1, &h2), 0.5f},
        {"dsinks overlaps dq", "params.dsinks", FA_ERR_OVERLAP, prm.sinks,
         fa_tensor_contiguous(dqb + 3, FA_DTYPE_F32, 1, &h2), 0.5f},
        {"dsinks overlaps q", "params.dsinks", FA_ERR_OVERLAP, prm.sinks,
         fa_tensor_contiguous(qb, FA_DTYPE_F32, 1, &h2), 0.5f},
        {"sinks NaN", "params.sinks[0]", FA_ERR_VALUE, prm.sinks,
         fa_tensor_contiguous(dsb, FA_DTYPE_F32, 1, &h2), NAN},
    };
    for (size_t i = 0; i < sizeof bwd / sizeof *bwd; i++) {
        fa_params p = prm;
        p.sinks = bwd[i].sinks, p.dsinks = bwd[i].dsinks;
        sb[0] = bwd[i].value;
        memset(dqb, 0xFF, sizeof dqb), memset(dkb, 0xFF, sizeof dkb);
        memset(dvb, 0xFF, sizeof dvb), memset(dsb, 0xFF, sizeof dsb);
        const float q0 = qb[0];
        st = fa_backward(ctx1, &p, &q, &q, &q, &out, &q, &lse, &dq, &dk, &dv);
        CHECK_MSG(
            st == bwd[i].want && strstr(fa_last_error_message(), bwd[i].word) &&
                all_ff(dkb, sizeof dkb) && all_ff(dvb, sizeof dvb) && all_ff(dsb, sizeof dsb) &&
                qb[0] == q0 && (i == 4 ? 1 : all_ff(dqb, sizeof dqb)),
            "backward, %s: %s (%s)", bwd[i].what, fa_status_name(st), fa_last_error_message());
    }
    sb[0] = 0.5f;
    /* dsinks is ignored by the forward */
    {
        fa_params p = prm;
        p.dsinks = fa_tensor_contiguous(ob, FA_DTYPE_F32, 1, &h3);
        memset(lb, 0xFF, sizeof lb);
        float o2[B * S * H * D];
        fa_tensor out2 = fa_tensor_contiguous(o2, FA_DTYPE_F32, 4, qs);
        CHECK_EQ_INT(fa_forward(ctx1, &p, &q, &q, &q, &out2, &lse), FA_OK);
        CHECK(memcmp(lb, lb0, sizeof lb) == 0);
    }
    /* CUDA tensors without a plug-in: refused before anything is written */
    {
        fa_tensor cq = q, cout = out, clse = lse, cs = prm.sinks;
        cq.device = cout.device = clse.device = cs.device = FA_DEVICE_CUDA;
        fa_params p = prm;
        p.sinks = cs;
        memset(ob, 0xFF, sizeof ob), memset(lb, 0xFF, sizeof lb);
        st = fa_forward(NULL, &p, &cq, &cq, &cq, &cout, &clse);
        CHECK_MSG(st == FA_ERR_DEVICE && strstr(fa_last_error_message(), "plug-in") &&
                      all_ff(ob, sizeof ob) && all_ff(lb, sizeof lb),
                  "CUDA forward: %s (%s)", fa_status_name(st), fa_last_error_message());
        fa_tensor cdq = dq, cdk = dk, cdv = dv;
        cdq.device = cdk.device = cdv.device = FA_DEVICE_CUDA;
        memset(dqb, 0xFF, sizeof dqb);
        st = fa_backward(NULL, &p, &cq, &cq, &cq, &cq, &cq, &clse, &cdq, &cdk, &cdv);
        CHECK_MSG(st == FA_ERR_DEVICE && all_ff(dqb, sizeof dqb), "CUDA backward: %s (%s)",
                  fa_status_name(st), fa_last_error_message());
        /* sinks on CUDA with CPU q: a device error */
        st = fa_forward(ctx1, &p, &q, &q, &q, &out, &lse);
        CHECK_MSG(st == FA_ERR_DEVICE && strstr(fa_last_error_message(), "params.sinks") &&
                      all_ff(ob, sizeof ob),
                  "CUDA sinks, CPU q: %s (%s)", fa_status_name(st), fa_last_error_message());
    }
    /* a struct from before sinks: its sinks are never read */
    {
        fa_params p = prm;
        p.struct_size = (uint32_t)offsetof(fa_params, sinks);
        sb[0] = NAN;
        float l2[B * H * S];
        float o2[B * S * H * D], o3[B * S * H * D];
        fa_tensor out2 = fa_tensor_contiguous(o2, FA_DTYPE_F32, 4, qs);
        fa_tensor out3 = fa_tensor_contiguous(o3, FA_DTYPE_F32, 4, qs);
        fa_tensor lse2 = fa_tensor_contiguous(l2, FA_DTYPE_F32, 3, ls);
        CHECK_EQ_INT(fa_forward(ctx1, &p, &q, &q, &q, &out2, &lse2), FA_OK);
        CHECK_EQ_INT(fa_forward(ctx1, NULL, &q, &q, &q, &out3, &lse2), FA_OK);
        CHECK(memcmp(o2, o3, sizeof o2) == 0);
        sb[0] = 0.5f;
    }
    CASE_END();
}

int main(void) {
    /* no plug-in, whatever the machine has: test_errors's CUDA calls pass host memory */
    setenv("FA_CUDA_PLUGIN", "/nonexistent/flashattn-test_sinks/libflashattn_cuda.so", 1);
    tu_seed_init("test_sinks");
    fa_context_options o;
    fa_context_options_init(&o);
    o.num_threads = 1;
    if (fa_context_create(&o, &ctx1) != FA_OK)
        return 1;
    o.num_threads = 3;
    if (fa_context_create(&o, &ctx3) != FA_OK)
        return 1;
    test_finite_differences();
    test_grid();
    test_kvcache();
    test_errors();
    fa_context_destroy(ctx1);
    fa_context_destroy(ctx3);
    return TEST_REPORT();
}
