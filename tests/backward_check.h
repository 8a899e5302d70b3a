/* SPDX-License-Identifier: MIT */
/*
 * backward_check.h — one backward test case, shared by test_backward.c and test_dropout.c
 * (header-only, like testutil.h, so each test builds alone).
 *
 * A case draws fresh normal inputs q, k, v, dout in the chosen memory layouts (rounded to the
 * dtype), runs the library's forward (with the case's params) to get out and lse as a user
 * would, then the library's backward into NaN-poisoned dq, dk, dv, and checks:
 *   - the forward's out and lse against the fp64 reference (tu_check_attention; with dropout
 *     this is the forward against the reference built from fa_dropout_mask's mask);
 *   - dq, dk, dv twice (below): against the exact gradient of what fa_backward was handed, and
 *     against the exact gradient of q, k, v, dout (the same rounded inputs, the same mask);
 *   - that no input (q, k, v, out, dout, lse) changed and no gap of a strided gradient output
 *     was written;
 *   - that gradient rows which no (query, key) pair reaches — a query row that sees no key, a
 *     key no query sees, varlen rows outside every sequence — are exactly 0.
 *
 * Tolerances (DESIGN.md §9), per gradient tensor; u = 2^-24; bnd_i is
 * ref_attention_backward_bound's value for element i (the sum of the absolute values of the
 * terms that make it up); R = max|exact gradient|.
 *  1. Against g = ref_attention_backward_given_out (Δ = rowsum(dO∘out) with the out the forward
 *     stored, the backward's actual input), every element:
 *        |got_i − g_i| <= ½ ulp_dtype(|got_i|, |g_i|) + 1e-5·R + 4·u·bnd_i,
 *     i.e. the correctly rounded result up to the fp32 computation's own error. bf16 on a CPU
 *     whose kernels use bf16 dot products (fa_build_info() says "+ avx512_bf16", or "in use:
 *     refbf16", their portable form) rounds Pd and dS to bf16 before the dV, dK and dQ products,
 *     as flash-attn does: each term of those sums then moves by at most 2^-8 of its size, so
 *     2^-8·bnd_i is added (on CUDA, whose tensor-core kernels round them for fp16 and bf16: 2^-8
 *     or 2^-11·bnd_i) (the bound's terms are |Pd|·|dO| for dv and |dS|·|q|, |dS|·|k| for
 *     dk, dq).
 *  2. Against ref = ref_attention_backward (exact gradient of q, k, v, dout):
 *     fp32, every element: |got_i − ref_i| <= 1e-5·R + 4·u·bnd_i.
 *        The second term is the rounding error fp32 accumulation itself commits; it matters
 *        only where the gradient cancels to (nearly) nothing: a row that sees a single key has
 *        dS = P·(dP − Δ) = 0 exactly (dP = Δ = dO·v), so R is 0 or tiny, while the library
 *        computes dP and Δ as two fp32 dot products in different orders. Measured over ~100
 *        seeds such cases need at most ~1.5·u·bnd beyond 1e-5·R (worst: GQA + dropout + rows
 *        that see one key); every other case is within 1e-5·R.
 *     fp16/bf16: max|got − ref| <= 2·max|naive − ref| + ulp_dtype(R') + max|g − ref| + e32,
 *        naive being ref_attention_backward_rounded in the dtype (flash-attn's criterion),
 *        R' = max(R, max|g|), e32 = 1e-5·R' + 4·u·max bnd (the fp32 allowance of 1.); ulp(R'):
 *        rounding the fp32 result to the dtype costs half of it, and a result within fp32
 *        noise of a tie can land on the other neighbour; max|g − ref| is what storing out in
 *        the dtype moves the exact gradient by. fa_backward must take out as stored, so no
 *        implementation can undo it, while a naive backward keeps its own out: for short rows
 *        with large D (e.g. Sq=2, Sk=5, D=80 in bf16) this term alone can exceed twice the
 *        naive error, about once in 300 random draws. bf16 on bf16 dot products adds, likewise,
 *        max|o − g|, o the exact gradient with dS and Pd rounded to bf16 where they enter the
 *        products (ref_attention_backward_given_out_operands): the library rounds them by
 *        design, as flash-attn does, and the naive backward rounds its own dS and Pd
 *        independently, so on a row of few keys its error can be small by chance. Seed
 *        2450521666 (bf16, Sq=2, Sk=5, D=1): the library's dq, 0.0498046875, is o rounded to
 *        bf16; its error was 0.00165 where the naive's was 0.000298.
 * NaN or inf never passes.
 */
#ifndef FA_BACKWARD_CHECK_H
#define FA_BACKWARD_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "reference/attention_ref_backward.h"
#include "test.h"
#include "testutil.h"

#define BC_MAXSEQ 8
#define BC_F32_BOUND_ULPS 4.0

typedef struct bcfg {
    int64_t B, Sq, Sk, H, Hk, D; /* varlen: B = nseq, Sq/Sk unused */
    int causal, wl, wr;
    float softcap, scale; /* scale 0 = default */
    int alibi;            /* 0 none, 1 (H), 2 (B, H) */
    int dtype;
    /* layouts (tu_layout) of the inputs, the forward's lse, and the gradient outputs */
    int lq, lk, lv, lo, ldo, llse, ldq, ldk, ldv;
    int kv_bcast; /* fixed length: k and v with batch stride 0 */
    float dropout_p;
    uint64_t dropout_seed, dropout_offset;
    fa_context *ctx; /* NULL = default */
    /* varlen when nseq > 0: sequence lengths, rows before the first / after the last sequence,
     * and slack added to max_seqlen */
    int nseq;
    int32_t seq_q[BC_MAXSEQ], seq_k[BC_MAXSEQ];
    int32_t lead_q, tail_q, lead_k, tail_k;
    int64_t extra_max;
    /* a rerun of a checked case whose result the caller compares bitwise with the checked one:
     * the fp64 references are skipped (they would repeat the first run's checks) */
    int repeat;
    /* a CUDA case: the forward and the backward run on device copies of every tensor and of the
     * ALiBi slopes on CUDA device cuda_dev (fa_device_*), and the results come back to the host
     * for the same checks */
    int cuda;
    int32_t cuda_dev;
} bcfg;

static inline bcfg bc_cfg(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D) {
    bcfg c;
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

/* Per-dtype error statistics of the gradients: index 0 dq, 1 dk, 2 dv. */
typedef struct bc_stats {
    double rel[3];   /* max over cases of max|got - ref| / max|ref| (ref: exact fp64) */
    double ratio[3]; /* fp16/bf16: max over cases of max|got-ref| / max|naive-ref| */
    double given[3]; /* max over cases of max|got - given| / ulp(dtype, max|given|) (given: the
                      * exact gradient of the inputs fa_backward got, its out included) */
    double per_u[3]; /* fp32: max over cases and elements of (|got-ref| - 1e-5 R) / (u * bound):
                      * how much of the accumulation term of the tolerance was used */
    long beyond_2x;  /* fp16/bf16: gradients with max|got-ref| > 2 max|naive-ref| + ulp(R) */
    long zero_grads; /* gradients that are 0 in exact arithmetic (empty, fully masked, or every
                      * row sees one key so dS = 0): left out of rel, where max|ref| is 0 or
                      * fp64 rounding residue */
    long cases;
    double *rels[3]; /* every non-zero gradient's rel, for the median */
    long nrels[3], caprels[3];
} bc_stats;

static bc_stats bc_grad_stats[3];   /* per dtype */
static tu_errstats bc_fwd_stats[3]; /* the forward's out/lse, per dtype */
static const char *const bc_grad_names[3] = {"dq", "dk", "dv"};

static inline double *bc_dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

/* 1 when the library's bf16 backward rounds Pd and dS to bf16 (its kernels have bf16 dot
 * products: the avx512 set's, or the portable refbf16 set's). */
static inline int bc_bf16_products(void) {
    const char *info = fa_build_info();
    return strstr(info, "+ avx512_bf16") != NULL || strstr(info, "in use: refbf16") != NULL;
}

/* The dtype's half-ulp at |x| plus the fp32 computation's own error allowance, for elements
 * compared with the exact gradient of the library's actual inputs (plus, where Pd and dS are
 * rounded to the dtype as products' operands, rounded != 0: 2^-8 of each term for bf16, 2^-11
 * for fp16). */
static inline double bc_given_tol(int dtype, double got, double want, double R, double bnd,
                                  int rounded) {
    const double m = fabs(got) > fabs(want) ? fabs(got) : fabs(want);
    const double pds = !rounded ? 0.0 : dtype == FA_DTYPE_BF16 ? 0x1.0p-8 : 0x1.0p-11;
    return 0.5 * tu_ulp(dtype, m == 0.0 ? 0x1.0p-1000 : m) + 1e-5 * R +
           (BC_F32_BOUND_ULPS * 0x1.0p-24 + pds) * bnd;
}

/* Compares one gradient tensor (n elements in logical order, rows of D elements) with
 *   ref:   the exact fp64 gradient of q, k, v, dout (ref_attention_backward),
 *   given: the exact gradient of what fa_backward was handed, i.e. with Δ from the out the
 *          forward stored (ref_attention_backward_given_out),
 *   naive: the naive low-precision gradient (fp16/bf16 only),
 *   operands: given's gradient with dS and Pd rounded as the products' operands (bf16 on bf16
 *          dot products, fp16/bf16 on CUDA; else NULL: ref_attention_backward_given_out_operands),
 *   bnd: the per-element bound.
 * zero_row[r] set means row r must be exactly 0. Returns 1 on pass. */
static inline int bc_check_grad(int which, int dtype, int64_t n, int64_t D, const double *got,
                                const double *ref, const double *given, const double *naive,
                                const double *operands, const double *bnd,
                                const unsigned char *zero_row, bc_stats *st) {
    const char *name = bc_grad_names[which];
    const double u32 = 0x1.0p-24;
    int ok = 1;
    double R = 0.0, Rg = 0.0, err = 0.0, nerr = 0.0, eout = 0.0, gerr = 0.0, maxbnd = 0.0;
    double eops = 0.0; /* what rounding dS and Pd as operands moves the exact gradient by */
    int64_t worst = -1, nonfinite = 0, first_nonfinite = -1, nonzero = 0, first_nonzero = -1;
    for (int64_t i = 0; i < n; i++) {
        R = fmax(R, fabs(ref[i]));
        Rg = fmax(Rg, fabs(given[i]));
        eout = fmax(eout, fabs(given[i] - ref[i]));
        maxbnd = fmax(maxbnd, bnd[i]);
        if (naive)
            nerr = fmax(nerr, fabs(naive[i] - ref[i]));
        if (operands)
            eops = fmax(eops, fabs(operands[i] - given[i]));
        if (!isfinite(got[i])) {
            if (first_nonfinite < 0)
                first_nonfinite = i;
            nonfinite++;
            continue;
        }
        if (zero_row && zero_row[i / D] && got[i] != 0.0) {
            if (first_nonzero < 0)
                first_nonzero = i;
            nonzero++;
        }
        if (fabs(got[i] - ref[i]) > err) {
            err = fabs(got[i] - ref[i]);
            worst = i;
        }
        gerr = fmax(gerr, fabs(got[i] - given[i]));
    }
    if (nonfinite) {
        CHECK_MSG(0, "%s has %lld non-finite elements (first at flat index %lld: %g)", name,
                  (long long)nonfinite, (long long)first_nonfinite, got[first_nonfinite]);
        ok = 0;
    }
    if (nonzero) {
        CHECK_MSG(0,
                  "%s: %lld elements of rows no query/key pair reaches are not 0 (first at "
                  "flat index %lld: %g, row %lld)",
                  name, (long long)nonzero, (long long)first_nonzero, got[first_nonzero],
                  (long long)(first_nonzero / D));
        ok = 0;
    }

    /* 1. Against the exact gradient of its actual inputs, element by element: the correctly
     *    rounded value up to the fp32 computation's error. */
    int64_t bad = 0, first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            continue;
        if (!(fabs(got[i] - given[i]) <=
              bc_given_tol(dtype, got[i], given[i], Rg, bnd[i], operands != NULL))) {
            if (first_bad < 0)
                first_bad = i;
            bad++;
        }
    }
    if (bad) {
        const int64_t w = first_bad;
        CHECK_MSG(0,
                  "%s: %lld elements differ from the exact gradient of the backward's inputs "
                  "by more than half an ulp + 1e-5 * max|ref| (%.3g) + %g u * bound%s; first "
                  "at flat index %lld (row %lld, d %lld): %.9g vs %.9g (bound %.3g)",
                  name, (long long)bad, 1e-5 * Rg, BC_F32_BOUND_ULPS,
                  dtype == FA_DTYPE_BF16 && bc_bf16_products() ? " + 2^-8 * bound" : "",
                  (long long)w, (long long)(w / D), (long long)(w % D), got[w], given[w], bnd[w]);
        ok = 0;
    }

    /* 2. Against the exact gradient of q, k, v, dout (DESIGN.md §9). */
    double used = 0.0; /* fp32: max (e_i - 1e-5 R) / (u bnd_i) */
    if (dtype == FA_DTYPE_F32) {
        bad = 0;
        first_bad = -1;
        for (int64_t i = 0; i < n; i++) {
            const double e = fabs(got[i] - ref[i]);
            if (!isfinite(got[i]))
                continue;
            if (!(e <= 1e-5 * R + BC_F32_BOUND_ULPS * u32 * bnd[i])) {
                if (first_bad < 0)
                    first_bad = i;
                bad++;
            }
            if (e > 1e-5 * R && bnd[i] > 0 && (e - 1e-5 * R) / (u32 * bnd[i]) > used)
                used = (e - 1e-5 * R) / (u32 * bnd[i]);
        }
        if (bad) {
            const int64_t w = first_bad;
            CHECK_MSG(0,
                      "%s: %lld elements off by more than 1e-5 * max|ref| (%.3g) + %g u * "
                      "their bound; first at flat index %lld (row %lld, d %lld): %.9g vs ref "
                      "%.9g (bound %.3g); max error %.3g at %lld",
                      name, (long long)bad, 1e-5 * R, BC_F32_BOUND_ULPS, (long long)w,
                      (long long)(w / D), (long long)(w % D), got[w], ref[w], bnd[w], err,
                      (long long)worst);
            ok = 0;
        }
    } else {
        /* flash-attn's criterion, plus what storing out in the dtype moves the exact gradient
         * by (eout: fa_backward is handed that out, a naive backward keeps its own) and, on bf16
         * dot products, what rounding dS and Pd as operands moves it by (eops) */
        const double tol = 2.0 * nerr + tu_ulp(dtype, fmax(R, Rg)) + eout + eops +
                           1e-5 * fmax(R, Rg) + BC_F32_BOUND_ULPS * u32 * maxbnd;
        if (!(err <= tol)) {
            CHECK_MSG(0,
                      "%s error %.3g > tol %.3g (max|ref| %.3g, naive error %.3g, out's "
                      "rounding moves the gradient by %.3g, dS and Pd's by %.3g) worst at flat "
                      "index %lld (row %lld, d %lld): %.9g vs ref %.9g",
                      name, err, tol, R, nerr, eout, eops, (long long)worst, (long long)(worst / D),
                      (long long)(worst % D), got[worst], ref[worst]);
            ok = 0;
        }
    }
    if (st && R <= 1e-12 * maxbnd) {
        st->zero_grads++;
    } else if (st) {
        const double rel = R > 0 ? err / R : err;
        st->rel[which] = fmax(st->rel[which], rel);
        if (st->nrels[which] == st->caprels[which]) {
            st->caprels[which] = st->caprels[which] ? 2 * st->caprels[which] : 256;
            st->rels[which] = realloc(st->rels[which], sizeof(double) * (size_t)st->caprels[which]);
            if (!st->rels[which])
                abort();
        }
        st->rels[which][st->nrels[which]++] = rel;
        if (dtype != FA_DTYPE_F32 && nerr > 0)
            st->ratio[which] = fmax(st->ratio[which], err / nerr);
        st->given[which] = fmax(st->given[which], gerr / tu_ulp(dtype, Rg));
        st->per_u[which] = fmax(st->per_u[which], used);
        if (dtype != FA_DTYPE_F32 && err > 2.0 * nerr + tu_ulp(dtype, R))
            st->beyond_2x++;
    }
    return ok;
}

static inline void bc_describe(const bcfg *c, char *buf, size_t n) {
    int pos;
    if (c->nseq > 0) {
        pos = snprintf(buf, n, "varlen %s seqs q/k=", tu_dtype_name(c->dtype));
        for (int b = 0; b < c->nseq && pos < (int)n - 40; b++)
            pos += snprintf(buf + pos, n - (size_t)pos, "%s%d/%d", b ? "," : "", (int)c->seq_q[b],
                            (int)c->seq_k[b]);
        pos += snprintf(buf + pos, n - (size_t)pos, " lead/tail q=%d/%d k=%d/%d max+%lld",
                        (int)c->lead_q, (int)c->tail_q, (int)c->lead_k, (int)c->tail_k,
                        (long long)c->extra_max);
    } else {
        pos = snprintf(buf, n, "%s B=%lld Sq=%lld Sk=%lld", tu_dtype_name(c->dtype),
                       (long long)c->B, (long long)c->Sq, (long long)c->Sk);
    }
    if (pos < (int)n)
        snprintf(buf + pos, n - (size_t)pos,
                 " H=%lld Hk=%lld D=%lld causal=%d window=(%d,%d) softcap=%g scale=%g alibi=%s "
                 "dropout=%g layouts q=%s k=%s v=%s out=%s dout=%s lse=%s dq=%s dk=%s dv=%s%s%s",
                 (long long)c->H, (long long)c->Hk, (long long)c->D, c->causal, c->wl, c->wr,
                 (double)c->softcap, (double)c->scale,
                 c->alibi == 0   ? "none"
                 : c->alibi == 1 ? "(H)"
                                 : "(B,H)",
                 (double)c->dropout_p, tu_layout_name(c->lq), tu_layout_name(c->lk),
                 tu_layout_name(c->lv), tu_layout_name(c->lo), tu_layout_name(c->ldo),
                 tu_layout_name(c->llse), tu_layout_name(c->ldq), tu_layout_name(c->ldk),
                 tu_layout_name(c->ldv), c->kv_bcast ? " kv-batch-stride-0" : "",
                 c->ctx ? " (own context)" : "");
}

/* A copy of a tensor's whole buffer, to check later that it did not change. */
static inline void *bc_snapshot(const tu_tensor *x) {
    size_t bytes = (size_t)(x->nbuf > 0 ? x->nbuf : 1) * tu_dtype_size(x->t.dtype);
    void *s = malloc(bytes);
    if (!s)
        abort();
    memcpy(s, x->buf, bytes);
    return s;
}

static inline int bc_unchanged(const tu_tensor *x, const void *snap) {
    size_t bytes = (size_t)(x->nbuf > 0 ? x->nbuf : 1) * tu_dtype_size(x->t.dtype);
    return memcmp(x->buf, snap, bytes) == 0;
}

/* Results of a case for callers that want them (determinism checks); may be NULL. */
/* CUDA cases: a device copy of x's whole buffer (gaps included, so a kernel reading outside
 * the view reads the host's 0xFF bytes, and one writing there is seen) becomes x's view. A
 * failed device call ends the program: every later check would be meaningless. */
static inline void bc_device_fatal(const char *what, fa_status st) {
    printf("FATAL: %s: %s: %s\n", what, fa_status_name(st), fa_last_error_message());
    fflush(stdout);
    exit(1);
}

static inline size_t bc_buf_bytes(const tu_tensor *x) {
    return (size_t)(x->nbuf > 0 ? x->nbuf : 1) * tu_dtype_size(x->t.dtype);
}

static inline void bc_upload(tu_tensor *x, int32_t dev) {
    void *d = NULL;
    fa_status st = fa_device_alloc(FA_DEVICE_CUDA, dev, bc_buf_bytes(x), &d);
    if (st == FA_OK)
        st = fa_device_copy(d, FA_DEVICE_CUDA, x->buf, FA_DEVICE_CPU, dev, bc_buf_bytes(x));
    if (st != FA_OK)
        bc_device_fatal("copying a test tensor to the device", st);
    x->t.data = d;
    x->t.device = FA_DEVICE_CUDA;
    x->t.device_index = dev;
}

/* The device bytes of an uploaded x into its host buffer (x stays on the device). */
static inline void bc_fetch(const tu_tensor *x) {
    const fa_status st = fa_device_copy(x->buf, FA_DEVICE_CPU, x->t.data, FA_DEVICE_CUDA,
                                        x->t.device_index, bc_buf_bytes(x));
    if (st != FA_OK)
        bc_device_fatal("copying a test tensor back from the device", st);
}

/* bc_fetch, then the device copy freed and x's view on its host buffer again. */
static inline void bc_download(tu_tensor *x) {
    bc_fetch(x);
    const fa_status st = fa_device_free(FA_DEVICE_CUDA, x->t.device_index, x->t.data);
    if (st != FA_OK)
        bc_device_fatal("fa_device_free", st);
    x->t.data = x->buf;
    x->t.device = FA_DEVICE_CPU;
    x->t.device_index = 0;
}

typedef struct bc_result {
    double *out, *lse, *dq, *dk, *dv; /* logical order, malloc'd; the caller frees */
    int64_t nq, nk, nl;
    double bnd_max[3]; /* dq, dk, dv: max of ref_attention_backward_bound (0 for a repeat) */
} bc_result;

static inline void bc_result_free(bc_result *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    memset(r, 0, sizeof *r);
}

/* Runs one case (fixed length or varlen); returns 1 on pass. */
static inline int bc_run(const bcfg *c, bc_result *res) {
    char name[768];
    bc_describe(c, name, sizeof name);
    CASE_BEGIN("%s", name);

    const int varlen = c->nseq > 0;
    const int64_t H = c->H, Hk = c->Hk, D = c->D, B = varlen ? c->nseq : c->B;
    int32_t cuq[BC_MAXSEQ + 1], cuk[BC_MAXSEQ + 1];
    int64_t maxq = 0, maxk = 0, rows_q, rows_k; /* rows_*: total (varlen) or B * S */
    if (varlen) {
        cuq[0] = c->lead_q;
        cuk[0] = c->lead_k;
        for (int b = 0; b < c->nseq; b++) {
            cuq[b + 1] = cuq[b] + c->seq_q[b];
            cuk[b + 1] = cuk[b] + c->seq_k[b];
            if (c->seq_q[b] > maxq)
                maxq = c->seq_q[b];
            if (c->seq_k[b] > maxk)
                maxk = c->seq_k[b];
        }
        rows_q = cuq[c->nseq] + c->tail_q;
        rows_k = cuk[c->nseq] + c->tail_k;
    } else {
        maxq = c->Sq;
        maxk = c->Sk;
        rows_q = c->B * c->Sq;
        rows_k = c->B * c->Sk;
    }
    const int64_t nq = rows_q * H * D, nk = rows_k * Hk * D, nl = rows_q * H;

    /* tensors */
    tu_tensor q, k, v, out, dout, lse, dq, dk, dv;
    if (varlen) {
        int64_t qs[3] = {rows_q, H, D}, ks[3] = {rows_k, Hk, D}, ls[2] = {H, rows_q};
        tu_alloc(&q, c->dtype, 3, qs, c->lq);
        tu_alloc(&k, c->dtype, 3, ks, c->lk);
        tu_alloc(&v, c->dtype, 3, ks, c->lv);
        tu_alloc(&out, c->dtype, 3, qs, c->lo);
        tu_alloc(&dout, c->dtype, 3, qs, c->ldo);
        tu_alloc(&lse, FA_DTYPE_F32, 2, ls, c->llse);
        tu_alloc(&dq, c->dtype, 3, qs, c->ldq);
        tu_alloc(&dk, c->dtype, 3, ks, c->ldk);
        tu_alloc(&dv, c->dtype, 3, ks, c->ldv);
    } else {
        int64_t qs[4] = {c->B, c->Sq, H, D}, ks[4] = {c->kv_bcast ? 1 : c->B, c->Sk, Hk, D};
        int64_t gks[4] = {c->B, c->Sk, Hk, D}, ls[3] = {c->B, H, c->Sq};
        tu_alloc(&q, c->dtype, 4, qs, c->lq);
        tu_alloc(&k, c->dtype, 4, ks, c->lk);
        tu_alloc(&v, c->dtype, 4, ks, c->lv);
        tu_alloc(&out, c->dtype, 4, qs, c->lo);
        tu_alloc(&dout, c->dtype, 4, qs, c->ldo);
        tu_alloc(&lse, FA_DTYPE_F32, 3, ls, c->llse);
        tu_alloc(&dq, c->dtype, 4, qs, c->ldq);
        tu_alloc(&dk, c->dtype, 4, gks, c->ldk);
        tu_alloc(&dv, c->dtype, 4, gks, c->ldv);
    }
    double *xq = bc_dalloc(nq), *xk = bc_dalloc(nk), *xv = bc_dalloc(nk), *xdo = bc_dalloc(nq);
    tu_fill_normal(&q, 1.0, xq);
    tu_fill_normal(&k, 1.0, xk);
    tu_fill_normal(&v, 1.0, xv);
    tu_fill_normal(&dout, 1.0, xdo);
    if (!varlen && c->kv_bcast) { /* one K/V shared by every batch */
        k.t.shape[0] = v.t.shape[0] = c->B;
        k.t.stride[0] = v.t.stride[0] = 0;
        k.numel = v.numel = nk;
        tu_gather(&k, xk);
        tu_gather(&v, xv);
    }

    /* cu_seqlens */
    int64_t ncu = B + 1;
    fa_tensor tcuq = fa_tensor_contiguous(cuq, FA_DTYPE_I32, 1, &ncu);
    fa_tensor tcuk = fa_tensor_contiguous(cuk, FA_DTYPE_I32, 1, &ncu);

    /* params, ALiBi slopes */
    float slopes[BC_MAXSEQ * 64 > 512 ? BC_MAXSEQ * 64 : 512];
    double dslopes[sizeof slopes / sizeof slopes[0]];
    fa_params params;
    fa_params_init(&params);
    params.causal = c->causal;
    params.window_left = c->wl;
    params.window_right = c->wr;
    params.softcap = c->softcap;
    params.softmax_scale = c->scale;
    params.dropout_p = c->dropout_p;
    params.dropout_seed = c->dropout_seed;
    params.dropout_offset = c->dropout_offset;
    if (c->alibi) {
        const int64_t ns = c->alibi == 2 ? B * H : H;
        if (ns > (int64_t)(sizeof slopes / sizeof slopes[0]))
            abort();
        for (int64_t i = 0; i < ns; i++) {
            double x = -0.2 + 0.7 * tu_uniform(); /* mostly positive, some negative (allowed) */
            slopes[i] = (float)(fabs(x) < 0.01 ? 0.01 : x);
            dslopes[i] = slopes[i];
        }
        int64_t sh[2] = {B, H};
        params.alibi_slopes = c->alibi == 2 ? fa_tensor_contiguous(slopes, FA_DTYPE_F32, 2, sh)
                                            : fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, sh + 1);
    }

    /* the dropout mask the library says it uses: (B, H, max Sq, max Sk) */
    uint8_t *mask = NULL;
    if (c->dropout_p > 0.0f) {
        int64_t ms[4] = {B, H, maxq, maxk};
        mask = malloc((size_t)(B * H * maxq * maxk > 0 ? B * H * maxq * maxk : 1));
        if (!mask)
            abort();
        memset(mask, 0xAB, (size_t)(B * H * maxq * maxk > 0 ? B * H * maxq * maxk : 1));
        fa_tensor tm = fa_tensor_contiguous(mask, FA_DTYPE_U8, 4, ms);
        fa_status mst = fa_dropout_mask(&params, &tm);
        CHECK_MSG(mst == FA_OK, "fa_dropout_mask returned %s: %s", fa_status_name(mst),
                  fa_last_error_message());
    }

    /* forward, as a user would, then the backward from its out and lse */
    void *snap_q = bc_snapshot(&q), *snap_k = bc_snapshot(&k), *snap_v = bc_snapshot(&v);
    void *snap_do = bc_snapshot(&dout);
    tu_tensor *const all[9] = {&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv};
    tu_tensor tslopes = {.nbuf = 0}; /* CUDA cases: the slopes as a tensor, for bc_upload */
    if (c->cuda) {
        for (int t = 0; t < 9; t++)
            bc_upload(all[t], c->cuda_dev);
        if (c->alibi) {
            tslopes.t = params.alibi_slopes;
            tslopes.buf = slopes;
            tslopes.nbuf = tslopes.numel = c->alibi == 2 ? B * H : H;
            bc_upload(&tslopes, c->cuda_dev);
            params.alibi_slopes = tslopes.t;
        }
    }
    fa_status st;
    if (varlen)
        st = fa_varlen_forward(c->ctx, &params, &q.t, &k.t, &v.t, &tcuq, &tcuk, maxq + c->extra_max,
                               maxk + c->extra_max, &out.t, &lse.t);
    else
        st = fa_forward(c->ctx, &params, &q.t, &k.t, &v.t, &out.t, &lse.t);
    CHECK_MSG(st == FA_OK, "forward returned %s (%d): %s", fa_status_name(st), (int)st,
              fa_last_error_message());
    if (c->cuda) {
        bc_fetch(&out);
        bc_fetch(&lse);
    }
    void *snap_o = bc_snapshot(&out), *snap_l = bc_snapshot(&lse);
    fa_status bst = FA_ERR_INTERNAL;
    if (st == FA_OK) {
        if (varlen)
            bst = fa_varlen_backward(c->ctx, &params, &q.t, &k.t, &v.t, &out.t, &dout.t, &lse.t,
                                     &tcuq, &tcuk, maxq + c->extra_max, maxk + c->extra_max, &dq.t,
                                     &dk.t, &dv.t);
        else
            bst = fa_backward(c->ctx, &params, &q.t, &k.t, &v.t, &out.t, &dout.t, &lse.t, &dq.t,
                              &dk.t, &dv.t);
        CHECK_MSG(bst == FA_OK, "backward returned %s (%d): %s", fa_status_name(bst), (int)bst,
                  fa_last_error_message());
        if (bst == FA_OK)
            CHECK_EQ_STR(fa_last_error_message(), "");
    }
    if (c->cuda) {
        for (int t = 0; t < 9; t++)
            bc_download(all[t]);
        if (c->alibi)
            bc_download(&tslopes);
    }
    CHECK_MSG(bc_unchanged(&q, snap_q) && bc_unchanged(&k, snap_k) && bc_unchanged(&v, snap_v) &&
                  bc_unchanged(&dout, snap_do),
              "an input (q, k, v or dout) changed");
    CHECK_MSG(bc_unchanged(&out, snap_o) && bc_unchanged(&lse, snap_l),
              "the backward changed its inputs out or lse");

    if (bst == FA_OK) {
        double *gout = bc_dalloc(nq), *glse = bc_dalloc(nl);
        double *gdq = bc_dalloc(nq), *gdk = bc_dalloc(nk), *gdv = bc_dalloc(nk);
        tu_gather(&out, gout);
        tu_gather(&lse, glse);
        tu_gather(&dq, gdq);
        tu_gather(&dk, gdk);
        tu_gather(&dv, gdv);

        if (!c->repeat) {
            /* references, sequence by sequence (one "sequence" per batch for fixed length) */
            const int lowp = c->dtype != FA_DTYPE_F32;
            double *rout = bc_dalloc(nq), *rlse = bc_dalloc(nl), *rdq = bc_dalloc(nq);
            double *rsize = bc_dalloc(nl); /* fp32 only; 0 outside every sequence */
            double *rdk = bc_dalloc(nk), *rdv = bc_dalloc(nk);
            double *bdq = bc_dalloc(nq), *bdk = bc_dalloc(nk), *bdv = bc_dalloc(nk);
            double *edq = bc_dalloc(nq), *edk = bc_dalloc(nk), *edv = bc_dalloc(nk);
            /* the exact gradient with dS and Pd rounded as operands, where they may be: bf16 on
             * the CPU's bf16 dot products, fp16 and bf16 on CUDA (the tensor-core kernels round
             * them as flash-attn does) */
            const int ops = (c->dtype == FA_DTYPE_BF16 && bc_bf16_products()) || (c->cuda && lowp);
            double *odq = bc_dalloc(nq), *odk = bc_dalloc(nk), *odv = bc_dalloc(nk);
            double *nout = bc_dalloc(nq), *nlse = bc_dalloc(nl), *ndq = bc_dalloc(nq);
            double *ndk = bc_dalloc(nk), *ndv = bc_dalloc(nk);
            unsigned char *zq = calloc((size_t)(rows_q * H + 1), 1);
            unsigned char *zk = calloc((size_t)(rows_k * Hk + 1), 1);
            if (!zq || !zk)
                abort();
            for (int64_t i = 0; i < nl; i++)
                rlse[i] = nlse[i] = -INFINITY;   /* varlen rows outside every sequence */
            memset(zq, 1, (size_t)(rows_q * H)); /* cleared below for rows that see a key */
            memset(zk, 1, (size_t)(rows_k * Hk));
            const int nref = varlen ? c->nseq : 1;
            for (int s = 0; s < nref; s++) {
                ref_problem p;
                memset(&p, 0, sizeof p);
                p.B = varlen ? 1 : c->B;
                p.Sq = varlen ? c->seq_q[s] : c->Sq;
                p.Sk = varlen ? c->seq_k[s] : c->Sk;
                p.H = H;
                p.Hk = Hk;
                p.D = D;
                p.scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
                p.causal = c->causal;
                p.window_left = c->wl;
                p.window_right = c->wr;
                p.softcap = c->softcap;
                if (c->alibi == 1)
                    p.alibi = dslopes;
                else if (c->alibi == 2) {
                    p.alibi = varlen ? dslopes + s * H : dslopes;
                    p.alibi_per_batch = !varlen;
                }
                const int64_t r0q = varlen ? cuq[s] : 0, r0k = varlen ? cuk[s] : 0;
                uint8_t *smask = NULL;
                if (mask && varlen) { /* sequence s uses mask[s, h, :Sq_s, :Sk_s] */
                    smask = malloc((size_t)(H * p.Sq * p.Sk + 1));
                    if (!smask)
                        abort();
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t i = 0; i < p.Sq; i++)
                            for (int64_t j = 0; j < p.Sk; j++)
                                smask[(h * p.Sq + i) * p.Sk + j] =
                                    mask[((s * H + h) * maxq + i) * maxk + j];
                }
                if (mask) {
                    p.dropout_mask = varlen ? smask : mask;
                    p.dropout_p = (double)c->dropout_p;
                }
                /* varlen: the sequence's slices are contiguous in logical order */
                const double *sq_ = xq + r0q * H * D, *sk_ = xk + r0k * Hk * D;
                const double *sv_ = xv + r0k * Hk * D, *sdo = xdo + r0q * H * D;
                double *sl = bc_dalloc(p.B * H * p.Sq), *nsl = bc_dalloc(p.B * H * p.Sq);
                double *ssz = bc_dalloc(p.B * H * p.Sq);
                ref_attention_backward(&p, sq_, sk_, sv_, sdo, rout + r0q * H * D, sl,
                                       rdq + r0q * H * D, rdk + r0k * Hk * D, rdv + r0k * Hk * D);
                ref_attention_backward_bound(&p, sq_, sk_, sv_, sdo, bdq + r0q * H * D,
                                             bdk + r0k * Hk * D, bdv + r0k * Hk * D);
                ref_attention_backward_given_out(&p, sq_, sk_, sv_, gout + r0q * H * D, sdo,
                                                 edq + r0q * H * D, edk + r0k * Hk * D,
                                                 edv + r0k * Hk * D);
                if (ops)
                    ref_attention_backward_given_out_operands(
                        &p, sq_, sk_, sv_, gout + r0q * H * D, sdo, odq + r0q * H * D,
                        odk + r0k * Hk * D, odv + r0k * Hk * D, tu_round_fn(c->dtype));
                if (lowp)
                    ref_attention_backward_rounded(&p, sq_, sk_, sv_, sdo, nout + r0q * H * D, nsl,
                                                   ndq + r0q * H * D, ndk + r0k * Hk * D,
                                                   ndv + r0k * Hk * D, tu_round_fn(c->dtype));
                else
                    ref_score_sizes(&p, sq_, sk_, ssz);
                /* lse: fixed (B, H, Sq) is the reference's layout; varlen (H, total_q) */
                for (int64_t b = 0; b < p.B; b++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t i = 0; i < p.Sq; i++) {
                            const int64_t at =
                                varlen ? h * rows_q + r0q + i : (b * H + h) * p.Sq + i;
                            rlse[at] = sl[(b * H + h) * p.Sq + i];
                            nlse[at] = nsl[(b * H + h) * p.Sq + i];
                            rsize[at] = ssz[(b * H + h) * p.Sq + i];
                        }
                /* rows reached by some visible (query, key) pair */
                for (int64_t b = 0; b < p.B; b++)
                    for (int64_t i = 0; i < p.Sq; i++)
                        for (int64_t j = 0; j < p.Sk; j++)
                            if (ref_visible(&p, i, j)) {
                                for (int64_t h = 0; h < H; h++)
                                    zq[(r0q + b * p.Sq + i) * H + h] = 0;
                                for (int64_t h = 0; h < Hk; h++)
                                    zk[(r0k + b * p.Sk + j) * Hk + h] = 0;
                            }
                free(sl);
                free(nsl);
                free(ssz);
                free(smask);
            }

            /* the forward (with dropout: against the reference built from the mask) */
            {
                const int64_t fb = varlen ? 1 : c->B, fs = varlen ? rows_q : c->Sq;
                tu_check_attention(c->dtype, fb, fs, H, D, gout, rout, lowp ? nout : NULL, glse,
                                   rlse, lowp ? nlse : NULL, rsize, &bc_fwd_stats[c->dtype]);
            }
            bc_stats *gs = &bc_grad_stats[c->dtype];
            bc_check_grad(0, c->dtype, nq, D, gdq, rdq, edq, lowp ? ndq : NULL, ops ? odq : NULL,
                          bdq, zq, gs);
            bc_check_grad(1, c->dtype, nk, D, gdk, rdk, edk, lowp ? ndk : NULL, ops ? odk : NULL,
                          bdk, zk, gs);
            bc_check_grad(2, c->dtype, nk, D, gdv, rdv, edv, lowp ? ndv : NULL, ops ? odv : NULL,
                          bdv, zk, gs);
            gs->cases++;
            if (res) {
                const double *bnd[3] = {bdq, bdk, bdv};
                const int64_t nb[3] = {nq, nk, nk};
                for (int t = 0; t < 3; t++)
                    for (int64_t i = 0; i < nb[t]; i++)
                        res->bnd_max[t] = fmax(res->bnd_max[t], bnd[t][i]);
            }
            free(rout);
            free(rlse);
            free(rsize);
            free(rdq);
            free(rdk);
            free(rdv);
            free(bdq);
            free(bdk);
            free(bdv);
            free(edq);
            free(edk);
            free(edv);
            free(odq);
            free(odk);
            free(odv);
            free(nout);
            free(nlse);
            free(ndq);
            free(ndk);
            free(ndv);
            free(zq);
            free(zk);
        }
        if (res) {
            res->out = gout;
            res->lse = glse;
            res->dq = gdq;
            res->dk = gdk;
            res->dv = gdv;
            res->nq = nq;
            res->nk = nk;
            res->nl = nl;
        } else {
            free(gout);
            free(glse);
            free(gdq);
            free(gdk);
            free(gdv);
        }
    }
    /* strided gradient outputs: gaps untouched */
    int64_t g1 = tu_count_touched_gaps(&dq), g2 = tu_count_touched_gaps(&dk);
    int64_t g3 = tu_count_touched_gaps(&dv);
    CHECK_MSG(g1 == 0 && g2 == 0 && g3 == 0, "gap elements written: dq %lld, dk %lld, dv %lld",
              (long long)g1, (long long)g2, (long long)g3);

    free(snap_q);
    free(snap_k);
    free(snap_v);
    free(snap_do);
    free(snap_o);
    free(snap_l);
    free(mask);
    free(xq);
    free(xk);
    free(xv);
    free(xdo);
    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&out);
    tu_free(&dout);
    tu_free(&lse);
    tu_free(&dq);
    tu_free(&dk);
    tu_free(&dv);
    return CASE_END();
}

/* Bitwise equal results (out, lse and every gradient). */
static inline int bc_same_result(const bc_result *a, const bc_result *b) {
    if (!a->dq || !b->dq || a->nq != b->nq || a->nk != b->nk || a->nl != b->nl)
        return 0;
    return memcmp(a->out, b->out, sizeof(double) * (size_t)a->nq) == 0 &&
           memcmp(a->lse, b->lse, sizeof(double) * (size_t)a->nl) == 0 &&
           memcmp(a->dq, b->dq, sizeof(double) * (size_t)a->nq) == 0 &&
           memcmp(a->dk, b->dk, sizeof(double) * (size_t)a->nk) == 0 &&
           memcmp(a->dv, b->dv, sizeof(double) * (size_t)a->nk) == 0;
}

/* Runs c on contexts of 1, 2, 3 and 8 threads and on the default context, twice, with the same
 * inputs and dropout seed, and checks every run is bitwise equal to the first (1 thread). */
static inline void bc_determinism_case(const char *what, bcfg c) {
    static const int threads[4] = {1, 2, 3, 8};
    fa_context *ctx[4] = {NULL, NULL, NULL, NULL};
    for (int t = 0; t < 4; t++) {
        fa_context_options o;
        fa_context_options_init(&o);
        o.num_threads = threads[t];
        fa_status st = fa_context_create(&o, &ctx[t]);
        CHECK_MSG(st == FA_OK, "fa_context_create(%d): %s", threads[t], fa_last_error_message());
        if (st != FA_OK)
            ctx[t] = NULL;
    }
    c.dropout_seed = tu_next_u64();
    c.dropout_offset = tu_next_u64();
    const uint64_t rng = tu_rng_state_; /* every run draws the same inputs */
    bc_result ref;
    memset(&ref, 0, sizeof ref);
    c.ctx = ctx[0];
    bc_run(&c, &ref);
    int64_t differ = 0, runs = 0;
    for (int rep = 0; rep < 2; rep++)
        for (int t = 0; t < 5; t++) {
            if (rep == 0 && t == 0)
                continue; /* that is ref */
            bc_result r;
            memset(&r, 0, sizeof r);
            tu_rng_state_ = rng;
            c.ctx = t < 4 ? ctx[t] : NULL; /* t = 4: the default context */
            c.repeat = 1;                  /* ref was checked against fp64 */
            bc_run(&c, &r);
            runs++;
            CASE_BEGIN("determinism %s: run %d on %d threads%s bitwise equal to 1 thread", what,
                       rep, t < 4 ? threads[t] : (int)fa_context_num_threads(NULL),
                       t < 4 ? "" : " (default context)");
            const int same = bc_same_result(&ref, &r);
            differ += !same;
            CHECK(same);
            CASE_END();
            bc_result_free(&r);
        }
    printf("  determinism %-44s %lld of %lld runs (1/2/3/8 threads, default context, twice) "
           "bitwise equal\n",
           what, (long long)(runs - differ), (long long)runs);
    bc_result_free(&ref);
    for (int t = 0; t < 4; t++)
        fa_context_destroy(ctx[t]);
}

static inline int bc_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double bc_median(double *v, long n) {
    if (n == 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, bc_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Prints the per-dtype table of the gradients' errors (and of the forward's out). */
static inline void bc_print_table(const char *program) {
    static const int dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    printf("%s: gradient errors per dtype, max (and median) over cases\n"
           "  rel = max|got - ref| / max|ref| against the exact fp64 gradient of q, k, v, dout;\n"
           "  inputs-ulp = max|got - g| in ulps of the dtype at max|g|, g the exact gradient of\n"
           "  the backward's actual inputs (out as the forward stored it)\n",
           program);
    printf("  dtype  cases    dq rel    dk rel    dv rel   out rel   inputs-ulp dq/dk/dv   note\n");
    long zeros = 0;
    for (int t = 0; t < 3; t++) {
        const bc_stats *s = &bc_grad_stats[dts[t]];
        const tu_errstats *f = &bc_fwd_stats[dts[t]];
        if (s->cases == 0)
            continue;
        printf("  %-5s %6ld  %8.2e  %8.2e  %8.2e  %8.2e   %5.2f/%5.2f/%5.2f     ",
               tu_dtype_name(dts[t]), s->cases, s->rel[0], s->rel[1], s->rel[2], f->max_rel,
               s->given[0], s->given[1], s->given[2]);
        if (dts[t] == FA_DTYPE_F32)
            printf("accumulation term used: dq %.2f dk %.2f dv %.2f of %g u*bound\n", s->per_u[0],
                   s->per_u[1], s->per_u[2], BC_F32_BOUND_ULPS);
        else
            printf("vs naive-%s error: dq %.2fx dk %.2fx dv %.2fx; %ld of %ld gradients "
                   "beyond 2x naive + 1 ulp (all within out's rounding%s)\n",
                   tu_dtype_name(dts[t]), s->ratio[0], s->ratio[1], s->ratio[2], s->beyond_2x,
                   3 * s->cases,
                   dts[t] == FA_DTYPE_BF16 && bc_bf16_products() ? " and dS and Pd's" : "");
        zeros += s->zero_grads;
        bc_stats *m = &bc_grad_stats[dts[t]];
        printf("  %-5s %6s  %8.2e  %8.2e  %8.2e\n", "", "median",
               bc_median(m->rels[0], m->nrels[0]), bc_median(m->rels[1], m->nrels[1]),
               bc_median(m->rels[2], m->nrels[2]));
        for (int g = 0; g < 3; g++) {
            free(m->rels[g]);
            m->rels[g] = NULL;
            m->nrels[g] = m->caprels[g] = 0;
        }
    }
    if (zeros)
        printf("  (%ld gradient tensors that are exactly 0 in exact arithmetic - empty, fully "
               "masked, or every row seeing one key (dS = 0) - are left out of rel)\n",
               zeros);
    fflush(stdout);
}

#endif /* FA_BACKWARD_CHECK_H */
