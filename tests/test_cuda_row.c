/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_row.c — the CUDA plug-in's stage-1 arithmetic (cuda/fwd_row.h) run on the CPU, task
 * by task in the numbering of the GPU kernels (cuda/fwd_simple.cu), so the GPU forward is
 * checked without a GPU:
 *   - forward tasks (plus the varlen clear tasks) against the fp64 reference and against the CPU
 *     backend (fa_forward / fa_varlen_forward on the same inputs), both with test_forward's
 *     tolerances (tu_check_attention), over fp32/fp16/bf16, head dims 1..256, Sq != Sk both
 *     ways, Sk = 0, causal, windows, ALiBi (H) and (B, H), softcap, GQA, varlen with empty
 *     sequences, lse, dropout and strided layouts;
 *   - dropout-mask tasks byte for byte against fa_dropout_mask.
 * The problem handed to the tasks is built here the way the core builds it for the plug-in.
 * Every case draws fresh random inputs (the seed is printed; FA_TEST_SEED replays a run) and
 * outputs start poisoned (NaN), so an element no task writes fails; gaps of strided outputs
 * must stay untouched.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "fwd_row.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

#define MAXSEQ 8

typedef struct cfg {
    int dtype;
    int64_t B, Sq, Sk, H, Hk, D; /* varlen: B = sequences, Sq/Sk = max_seqlen_q/k */
    int varlen;
    int32_t lq[MAXSEQ], lk[MAXSEQ];           /* varlen: sequence lengths */
    int32_t q_start, k_start, q_tail, k_tail; /* varlen: rows before/after the sequences */
    int causal, wl, wr;
    float softcap, scale;                    /* scale 0 = default */
    int alibi;                               /* 0 none, 1 (H), 2 (B, H) */
    int alibi_strided;                       /* slopes every other float, rows padded */
    int lay_q, lay_k, lay_v, lay_o, lay_lse; /* tu_layout */
    int no_lse;
    float dropout_p;
} cfg;

static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
static tu_errstats g_vs_ref[8], g_vs_cpu[8]; /* per dtype */

static cfg base(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D) {
    cfg c;
    memset(&c, 0, sizeof c);
    c.B = B;
    c.Sq = Sq;
    c.Sk = Sk;
    c.H = H;
    c.Hk = Hk;
    c.D = D;
    c.wl = c.wr = -1;
    return c;
}

static cfg base_varlen(int nseq, const int32_t *lq, const int32_t *lk, int64_t H, int64_t Hk,
                       int64_t D) {
    cfg c = base(nseq, 0, 0, H, Hk, D);
    c.varlen = 1;
    for (int b = 0; b < nseq; b++) {
        c.lq[b] = lq[b];
        c.lk[b] = lk[b];
        c.Sq = lq[b] > c.Sq ? lq[b] : c.Sq;
        c.Sk = lk[b] > c.Sk ? lk[b] : c.Sk;
    }
    return c;
}

static void describe(const cfg *c, char *buf, size_t n) {
    int pos = snprintf(buf, n, "%s%s ", c->varlen ? "varlen " : "", tu_dtype_name(c->dtype));
    if (c->varlen) {
        pos += snprintf(buf + pos, n - (size_t)pos, "lens q/k=");
        for (int b = 0; b < c->B; b++)
            pos += snprintf(buf + pos, n - (size_t)pos, "%s%d/%d", b ? "," : "", (int)c->lq[b],
                            (int)c->lk[b]);
        pos += snprintf(buf + pos, n - (size_t)pos, " start=%d/%d tail=%d/%d", (int)c->q_start,
                        (int)c->k_start, (int)c->q_tail, (int)c->k_tail);
    } else {
        pos += snprintf(buf + pos, n - (size_t)pos, "B=%lld Sq=%lld Sk=%lld", (long long)c->B,
                        (long long)c->Sq, (long long)c->Sk);
    }
    snprintf(buf + pos, n - (size_t)pos,
             " H=%lld Hk=%lld D=%lld causal=%d window=(%d,%d) softcap=%g scale=%g alibi=%s%s "
             "layouts q=%s k=%s v=%s out=%s lse=%s dropout=%g",
             (long long)c->H, (long long)c->Hk, (long long)c->D, c->causal, c->wl, c->wr,
             (double)c->softcap, (double)c->scale,
             c->alibi == 0   ? "none"
             : c->alibi == 1 ? "(H)"
                             : "(B,H)",
             c->alibi_strided ? "-strided" : "", tu_layout_name(c->lay_q), tu_layout_name(c->lay_k),
             tu_layout_name(c->lay_v), tu_layout_name(c->lay_o),
             c->no_lse ? "none" : tu_layout_name(c->lay_lse), (double)c->dropout_p);
}

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

/* ---------------------------------------------------------------------------------------------
 * The problem, as the core hands it to the plug-in
 * ------------------------------------------------------------------------------------------- */

enum { SLOPES_CAP = 2048 }; /* floats for the (strided) slopes of any case here */

/* The parameters of c; ALiBi slopes (fp32 in slopes[SLOPES_CAP], and as fp64 in dslopes, (H) or
 * (B, H) contiguous), mostly positive, some negative. */
static void make_params(const cfg *c, fa_params *params, float *slopes, double *dslopes) {
    fa_params_init(params);
    params->causal = c->causal;
    params->window_left = c->wl;
    params->window_right = c->wr;
    params->softcap = c->softcap;
    params->softmax_scale = c->scale;
    params->dropout_p = c->dropout_p;
    params->dropout_seed = tu_next_u64();
    params->dropout_offset = tu_next_u64();
    if (!c->alibi)
        return;
    const int64_t sh = c->alibi_strided ? 2 : 1, sb = c->alibi_strided ? 2 * c->H + 3 : c->H;
    const int64_t n = c->alibi == 2 ? c->B * c->H : c->H;
    for (int64_t t = 0; t < SLOPES_CAP; t++)
        slopes[t] = NAN; /* gaps */
    if ((c->B - 1) * sb + (c->H - 1) * sh >= SLOPES_CAP) {
        fprintf(stderr, "test_cuda_row: B·H too large for SLOPES_CAP\n");
        abort();
    }
    for (int64_t t = 0; t < n; t++) {
        double x = -0.2 + 0.7 * tu_uniform();
        if (x > -0.01 && x < 0.01)
            x = 0.01;
        const int64_t at = (t / c->H) * sb + (t % c->H) * sh;
        slopes[at] = (float)x;
        dslopes[t] = slopes[at];
    }
    const int64_t shape[2] = {c->B, c->H};
    params->alibi_slopes = c->alibi == 2 ? fa_tensor_contiguous(slopes, FA_DTYPE_F32, 2, shape)
                                         : fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, shape + 1);
    params->alibi_slopes.stride[params->alibi_slopes.ndim - 1] = sh;
    if (c->alibi == 2)
        params->alibi_slopes.stride[0] = sb;
}

/* A view of t (varlen: no batch dimension, sb = 0). */
static fa__view view_of(const fa_tensor *t, int varlen) {
    fa__view x;
    memset(&x, 0, sizeof x);
    const int o = varlen ? -1 : 0;
    x.data = t->data;
    x.dtype = t->dtype;
    x.sb = varlen ? 0 : t->stride[0];
    x.ss = t->stride[1 + o];
    x.sh = t->stride[2 + o];
    x.sd = t->stride[3 + o];
    return x;
}

/* Sizes and the resolved parameters, as fa__resolve_params and fa__resolve_alibi. */
static fa__problem problem_of(const cfg *c, const fa_params *pr) {
    fa__problem p;
    memset(&p, 0, sizeof p);
    p.B = c->B;
    p.H = c->H;
    p.Hk = c->Hk;
    p.D = p.Dv = c->D;
    p.Sq = c->Sq;
    p.Sk = c->Sk;
    p.scale = pr->softmax_scale != 0.0f ? pr->softmax_scale : (float)(1.0 / sqrt((double)c->D));
    p.causal = pr->causal != 0;
    p.window_left = pr->window_left;
    p.window_right = p.causal ? 0 : pr->window_right;
    p.softcap = pr->softcap;
    if (pr->alibi_slopes.data) {
        const fa_tensor *a = &pr->alibi_slopes;
        p.alibi = a->data;
        p.alibi_sb = a->ndim == 2 ? a->stride[0] : 0;
        p.alibi_sh = a->stride[a->ndim - 1];
    }
    p.dropout_p = pr->dropout_p;
    p.dropout_threshold = fa__dropout_threshold(pr->dropout_p);
    p.dropout_scale = (float)(1.0 / (1.0 - (double)pr->dropout_p));
    p.dropout_seed = pr->dropout_seed;
    p.dropout_offset = pr->dropout_offset;
    return p;
}

/* The dropout mask (B, H, Sq, Sk) from fa_dropout_mask, or NULL without dropout. */
static uint8_t *dropout_mask(const fa_params *params, int64_t B, int64_t H, int64_t Sq,
                             int64_t Sk) {
    if (params->dropout_p == 0.0f)
        return NULL;
    const int64_t shape[4] = {B, H, Sq, Sk}, n = B * H * Sq * Sk;
    uint8_t *mask = malloc((size_t)(n > 0 ? n : 1));
    if (!mask)
        abort();
    fa_tensor t = fa_tensor_contiguous(mask, FA_DTYPE_U8, 4, shape);
    const fa_status st = fa_dropout_mask(params, &t);
    CHECK_MSG(st == FA_OK, "fa_dropout_mask: %s: %s", fa_status_name(st), fa_last_error_message());
    return mask;
}

/* The fp64 reference problem of one batch (varlen: one sequence, B = 1). */
static ref_problem ref_of(const cfg *c, int64_t B, int64_t Sq, int64_t Sk, const double *slopes,
                          const uint8_t *mask) {
    ref_problem r;
    memset(&r, 0, sizeof r);
    r.B = B;
    r.Sq = Sq;
    r.Sk = Sk;
    r.H = c->H;
    r.Hk = c->Hk;
    r.D = c->D;
    r.scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)c->D);
    r.causal = c->causal;
    r.window_left = c->wl;
    r.window_right = c->wr;
    r.softcap = c->softcap;
    r.alibi = slopes;
    r.alibi_per_batch = c->alibi == 2 && !c->varlen;
    r.dropout_mask = mask;
    r.dropout_p = (double)c->dropout_p;
    return r;
}

/* out/lse of the tasks (dlse NULL: no lse) against the CPU backend's (always with lse); naive
 * and dlse_naive: the fp64 naive implementation in the dtype (fp16/bf16); size: the rows' score
 * sizes (fp32, ref_score_sizes). */
static void check_vs_cpu(const cfg *c, int64_t B, int64_t Sq, const double *dout,
                         const double *dlse, const double *cpu_out, const double *cpu_lse,
                         const double *naive, const double *lse_naive, const double *size) {
    const int half = c->dtype != FA_DTYPE_F32;
    if (!tu_check_attention(c->dtype, B, Sq, c->H, c->D, dout, cpu_out, half ? naive : NULL, dlse,
                            cpu_lse, half ? lse_naive : NULL, size, &g_vs_cpu[c->dtype]))
        CHECK_MSG(0, "the row tasks differ from the CPU backend");
}

/* Gaps of out (and lse, or its whole buffer when it was not passed) untouched. */
static void check_gaps(const cfg *c, const tu_tensor *out, const tu_tensor *lse) {
    int64_t gaps = tu_count_touched_gaps(out);
    CHECK_MSG(gaps == 0, "%lld gap elements of out were written", (long long)gaps);
    if (c->no_lse) {
        const unsigned char *bytes = lse->buf;
        int64_t changed = 0;
        for (int64_t t = 0; t < lse->nbuf * 4; t++)
            changed += bytes[t] != 0xFF;
        CHECK_MSG(changed == 0, "lse not passed but %lld bytes of its buffer changed",
                  (long long)changed);
    } else {
        gaps = tu_count_touched_gaps(lse);
        CHECK_MSG(gaps == 0, "%lld gap elements of lse were written", (long long)gaps);
    }
}

/* ---------------------------------------------------------------------------------------------
 * One fixed-length case
 * ------------------------------------------------------------------------------------------- */

static int run_fixed(const cfg *c) {
    char name[512];
    describe(c, name, sizeof name);
    CASE_BEGIN("%s", name);
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, Hk = c->Hk, D = c->D;
    const int64_t qshape[4] = {B, Sq, H, D}, kshape[4] = {B, Sk, Hk, D}, lshape[3] = {B, H, Sq};
    tu_tensor q, k, v, out, lse, cpu_out, cpu_lse;
    tu_alloc(&q, c->dtype, 4, qshape, c->lay_q);
    tu_alloc(&k, c->dtype, 4, kshape, c->lay_k);
    tu_alloc(&v, c->dtype, 4, kshape, c->lay_v);
    tu_alloc(&out, c->dtype, 4, qshape, c->lay_o);
    tu_alloc(&lse, FA_DTYPE_F32, 3, lshape, c->lay_lse);
    tu_alloc(&cpu_out, c->dtype, 4, qshape, TU_CONTIG);
    tu_alloc(&cpu_lse, FA_DTYPE_F32, 3, lshape, TU_CONTIG);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    double *dq = dalloc(nq), *dk = dalloc(nk), *dv = dalloc(nk);
    double *dout = dalloc(nq), *dlse = dalloc(nl), *cout = dalloc(nq), *clse = dalloc(nl);
    double *ref = dalloc(nq), *ref_lse = dalloc(nl), *naive = dalloc(nq), *naive_lse = dalloc(nl);
    double *size = dalloc(nl);
    tu_fill_normal(&q, 1.0, dq);
    tu_fill_normal(&k, 1.0, dk);
    tu_fill_normal(&v, 1.0, dv);
    float slopes[SLOPES_CAP];
    double dslopes[SLOPES_CAP];
    fa_params params;
    make_params(c, &params, slopes, dslopes);
    uint8_t *mask = dropout_mask(&params, B, H, Sq, Sk);

    fa__problem p = problem_of(c, &params);
    p.q = view_of(&q.t, 0);
    p.k = view_of(&k.t, 0);
    p.v = view_of(&v.t, 0);
    p.out = view_of(&out.t, 0);
    if (!c->no_lse) {
        p.lse = lse.t.data;
        p.lse_sb = lse.t.stride[0];
        p.lse_sh = lse.t.stride[1];
        p.lse_ss = lse.t.stride[2];
    }
    const int64_t rows = fa__fwd_rows(&p);
    CHECK_EQ_INT(rows, B * Sq);
    CHECK_EQ_INT(fa__clear_tasks(&p), 0);
    for (int64_t t = 0; t < rows * H; t++)
        fa__fwd_task(&p, NULL, NULL, rows, t);

    const fa_status st = fa_forward(NULL, &params, &q.t, &k.t, &v.t, &cpu_out.t, &cpu_lse.t);
    CHECK_MSG(st == FA_OK, "fa_forward: %s: %s", fa_status_name(st), fa_last_error_message());
    if (st == FA_OK) {
        tu_gather(&out, dout);
        tu_gather(&lse, dlse);
        tu_gather(&cpu_out, cout);
        tu_gather(&cpu_lse, clse);
        const ref_problem r = ref_of(c, B, Sq, Sk, c->alibi ? dslopes : NULL, mask);
        ref_attention_forward(&r, dq, dk, dv, ref, ref_lse);
        if (c->dtype != FA_DTYPE_F32)
            ref_attention_forward_rounded(&r, dq, dk, dv, naive, naive_lse, tu_round_fn(c->dtype));
        else
            ref_score_sizes(&r, dq, dk, size);
        const int half = c->dtype != FA_DTYPE_F32;
        if (!tu_check_attention(c->dtype, B, Sq, H, D, dout, ref, half ? naive : NULL,
                                c->no_lse ? NULL : dlse, ref_lse, half ? naive_lse : NULL, size,
                                &g_vs_ref[c->dtype]))
            CHECK_MSG(0, "the row tasks differ from the fp64 reference");
        check_vs_cpu(c, B, Sq, dout, c->no_lse ? NULL : dlse, cout, clse, naive, naive_lse, size);
    }
    check_gaps(c, &out, &lse);

    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&out);
    tu_free(&lse);
    tu_free(&cpu_out);
    tu_free(&cpu_lse);
    free(mask);
    double *all[] = {dq, dk, dv, dout, dlse, cout, clse, ref, ref_lse, naive, naive_lse, size};
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++)
        free(all[t]);
    return CASE_END();
}

/* ---------------------------------------------------------------------------------------------
 * One varlen case: sequences packed along the rows, possibly after a head and before a tail
 * of rows outside every sequence
 * ------------------------------------------------------------------------------------------- */

static int run_varlen(const cfg *c) {
    char name[640];
    describe(c, name, sizeof name);
    CASE_BEGIN("%s", name);
    const int B = (int)c->B;
    const int64_t H = c->H, Hk = c->Hk, D = c->D;
    int32_t cuq[MAXSEQ + 1], cuk[MAXSEQ + 1];
    cuq[0] = c->q_start;
    cuk[0] = c->k_start;
    for (int b = 0; b < B; b++) {
        cuq[b + 1] = cuq[b] + c->lq[b];
        cuk[b + 1] = cuk[b] + c->lk[b];
    }
    const int64_t tq = cuq[B] + c->q_tail, tk = cuk[B] + c->k_tail;
    const int64_t qshape[3] = {tq, H, D}, kshape[3] = {tk, Hk, D}, lshape[2] = {H, tq};
    tu_tensor q, k, v, out, lse, cpu_out, cpu_lse;
    tu_alloc(&q, c->dtype, 3, qshape, c->lay_q);
    tu_alloc(&k, c->dtype, 3, kshape, c->lay_k);
    tu_alloc(&v, c->dtype, 3, kshape, c->lay_v);
    tu_alloc(&out, c->dtype, 3, qshape, c->lay_o);
    tu_alloc(&lse, FA_DTYPE_F32, 2, lshape, c->lay_lse);
    tu_alloc(&cpu_out, c->dtype, 3, qshape, TU_CONTIG);
    tu_alloc(&cpu_lse, FA_DTYPE_F32, 2, lshape, TU_CONTIG);
    double *dq = dalloc(tq * H * D), *dk = dalloc(tk * Hk * D), *dv = dalloc(tk * Hk * D);
    double *dout = dalloc(tq * H * D), *dlse = dalloc(H * tq);
    double *cout = dalloc(tq * H * D), *clse = dalloc(H * tq);
    double *naive = dalloc(tq * H * D), *naive_lse = dalloc(H * tq); /* packed, outside: 0/-inf */
    double *size = dalloc(H * tq);                                   /* packed, outside: 0 */
    for (int64_t t = 0; t < H * tq; t++)
        naive_lse[t] = -INFINITY;
    tu_fill_normal(&q, 1.0, dq);
    tu_fill_normal(&k, 1.0, dk);
    tu_fill_normal(&v, 1.0, dv);
    float slopes[SLOPES_CAP];
    double dslopes[SLOPES_CAP];
    fa_params params;
    make_params(c, &params, slopes, dslopes);
    uint8_t *mask = dropout_mask(&params, B, H, c->Sq, c->Sk);

    fa__problem p = problem_of(c, &params);
    p.cu_q = cuq;
    p.cu_k = cuk;
    p.total_q = tq;
    p.total_k = tk;
    p.q = view_of(&q.t, 1);
    p.k = view_of(&k.t, 1);
    p.v = view_of(&v.t, 1);
    p.out = view_of(&out.t, 1);
    if (!c->no_lse) {
        p.lse = lse.t.data;
        p.lse_sh = lse.t.stride[0];
        p.lse_ss = lse.t.stride[1];
    }
    const int64_t rows = fa__fwd_rows(&p), clears = fa__clear_tasks(&p);
    CHECK_EQ_INT(rows, (int64_t)cuq[B] - cuq[0]);
    CHECK_EQ_INT(clears, (c->q_start + c->q_tail) * H);
    for (int64_t t = 0; t < rows * H; t++)
        fa__fwd_task(&p, cuq, cuk, rows, t);
    for (int64_t t = 0; t < clears; t++)
        fa__clear_task(&p, cuq[0], cuq[B], t);

    const int64_t one = B + 1;
    fa_tensor tcuq = fa_tensor_contiguous(cuq, FA_DTYPE_I32, 1, &one);
    fa_tensor tcuk = fa_tensor_contiguous(cuk, FA_DTYPE_I32, 1, &one);
    const fa_status st = fa_varlen_forward(NULL, &params, &q.t, &k.t, &v.t, &tcuq, &tcuk, c->Sq,
                                           c->Sk, &cpu_out.t, &cpu_lse.t);
    CHECK_MSG(st == FA_OK, "fa_varlen_forward: %s: %s", fa_status_name(st),
              fa_last_error_message());
    if (st == FA_OK) {
        tu_gather(&out, dout);
        tu_gather(&lse, dlse);
        tu_gather(&cpu_out, cout);
        tu_gather(&cpu_lse, clse);
        for (int b = 0; b < B; b++) { /* each sequence against the reference, as test_varlen */
            const int64_t Sq = c->lq[b], Sk = c->lk[b], r0 = cuq[b];
            double *sq = dalloc(Sq * H * D), *sk = dalloc(Sk * Hk * D), *sv = dalloc(Sk * Hk * D);
            double *sl = dalloc(H * Sq), *ro = dalloc(Sq * H * D), *rl = dalloc(H * Sq);
            double *no = dalloc(Sq * H * D), *nl = dalloc(H * Sq), *ss = dalloc(H * Sq);
            uint8_t *smask = mask ? malloc((size_t)(H * Sq * Sk > 0 ? H * Sq * Sk : 1)) : NULL;
            memcpy(sq, dq + r0 * H * D, sizeof(double) * (size_t)(Sq * H * D));
            memcpy(sk, dk + (int64_t)cuk[b] * Hk * D, sizeof(double) * (size_t)(Sk * Hk * D));
            memcpy(sv, dv + (int64_t)cuk[b] * Hk * D, sizeof(double) * (size_t)(Sk * Hk * D));
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Sq; i++) {
                    sl[h * Sq + i] = dlse[h * tq + r0 + i];
                    for (int64_t j = 0; smask && j < Sk; j++)
                        smask[(h * Sq + i) * Sk + j] = mask[((b * H + h) * c->Sq + i) * c->Sk + j];
                }
            const double *seq_slopes = c->alibi == 2 ? dslopes + b * H : c->alibi ? dslopes : NULL;
            const ref_problem r = ref_of(c, 1, Sq, Sk, seq_slopes, smask);
            ref_attention_forward(&r, sq, sk, sv, ro, rl);
            const int half = c->dtype != FA_DTYPE_F32;
            if (half) {
                ref_attention_forward_rounded(&r, sq, sk, sv, no, nl, tu_round_fn(c->dtype));
                memcpy(naive + r0 * H * D, no, sizeof(double) * (size_t)(Sq * H * D));
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < Sq; i++)
                        naive_lse[h * tq + r0 + i] = nl[h * Sq + i];
            } else {
                ref_score_sizes(&r, sq, sk, ss);
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < Sq; i++)
                        size[h * tq + r0 + i] = ss[h * Sq + i];
            }
            if (!tu_check_attention(c->dtype, 1, Sq, H, D, dout + r0 * H * D, ro, half ? no : NULL,
                                    c->no_lse ? NULL : sl, rl, half ? nl : NULL, ss,
                                    &g_vs_ref[c->dtype]))
                CHECK_MSG(0, "sequence %d (Sq=%lld Sk=%lld) differs from the fp64 reference", b,
                          (long long)Sq, (long long)Sk);
            double *seq[] = {sq, sk, sv, sl, ro, rl, no, nl, ss};
            for (size_t t = 0; t < sizeof seq / sizeof seq[0]; t++)
                free(seq[t]);
            free(smask);
        }
        /* The whole packed output against the CPU's, rows outside every sequence included
         * (there the CPU's lse is -inf, so out must be exactly 0 and lse exactly -inf). */
        check_vs_cpu(c, 1, tq, dout, c->no_lse ? NULL : dlse, cout, clse, naive, naive_lse, size);
    }
    check_gaps(c, &out, &lse);

    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&out);
    tu_free(&lse);
    tu_free(&cpu_out);
    tu_free(&cpu_lse);
    free(mask);
    double *all[] = {dq, dk, dv, dout, dlse, cout, clse, naive, naive_lse, size};
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++)
        free(all[t]);
    return CASE_END();
}

static int run_case(const cfg *c) { return c->varlen ? run_varlen(c) : run_fixed(c); }

/* Runs c for every dtype; returns the number of failed cases. */
static int run_all_dtypes(cfg c, long *cases) {
    int failed = 0;
    for (int t = 0; t < 3; t++) {
        c.dtype = k_dtypes[t];
        failed += !run_case(&c);
    }
    *cases += 3;
    return failed;
}

static void group_line(const char *group, long cases, long failed) {
    printf("%-32s %4ld cases, %ld failed\n", group, cases, failed);
    fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
 * Groups
 * ------------------------------------------------------------------------------------------- */

/* Every head dim on Sq < Sk, Sq > Sk, one query row, Sk = 0; without and with a causal mask. */
static void group_head_dims(void) {
    long n = 0, failed = 0;
    static const int64_t dims[] = {1, 7, 32, 64, 80, 128, 256};
    static const int64_t shapes[][5] = {
        {2, 13, 29, 4, 2}, {2, 29, 13, 4, 2}, {1, 1, 40, 8, 2}, {2, 17, 0, 2, 1}};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int causal = 0; causal < 2; causal++) {
                cfg c = base(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                             dims[d]);
                c.causal = causal;
                failed += run_all_dtypes(c, &n);
            }
    group_line("head dims x shapes", n, failed);
}

/* Masks, bias, softcap, scale and GQA, on Sq < Sk and Sq > Sk. */
static void group_features(void) {
    long n = 0, failed = 0;
    for (int sq_big = 0; sq_big < 2; sq_big++)
        for (int variant = 0; variant < 15; variant++) {
            cfg c = sq_big ? base(2, 31, 19, 4, 2, 40) : base(2, 19, 31, 4, 2, 40);
            switch (variant) {
            case 0:
                c.wl = 3;
                c.wr = 5;
                break;
            case 1:
                c.wl = 4;
                break; /* left window only */
            case 2:
                c.wr = 0;
                c.wl = 0;
                break; /* the diagonal only */
            case 3:
                c.causal = 1;
                c.wl = 6;
                break;
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
                break;
            case 8:
                c.scale = -0.25f;
                c.causal = 1;
                break;
            case 9:
                c.scale = 4.0f / sqrtf(40.0f);
                break; /* scores ~ N(0, 16) */
            case 10:
                c.H = 8;
                c.Hk = 1;
                c.causal = 1;
                break;
            case 11:
                c.H = 6;
                c.Hk = 3;
                c.alibi = 1;
                c.wl = 2;
                c.wr = 9;
                break;
            case 12:
                c.Hk = 4;
                c.softcap = 2.0f;
                c.wl = 6;
                c.wr = 1;
                break;
            case 13:
                c.alibi = 2;
                c.alibi_strided = 1;
                c.wl = 100;
                c.wr = 100;
                break;
            case 14:
                c.wl = 2147483647;
                c.wr = 0;
                c.alibi = 1;
                c.alibi_strided = 1;
                break;
            }
            failed += run_all_dtypes(c, &n);
        }
    /* Longer rows: the online softmax rescales many times. */
    cfg c = base(1, 150, 170, 2, 1, 64);
    c.causal = 1;
    failed += run_all_dtypes(c, &n);
    c = base(1, 40, 300, 2, 2, 128);
    c.alibi = 1;
    c.wl = 200;
    failed += run_all_dtypes(c, &n);
    group_line("masks/bias/softcap/scale/GQA", n, failed);
}

static void group_layouts(void) {
    long n = 0, failed = 0;
    for (int variant = 0; variant < 7; variant++) {
        cfg c = base(2, 19, 23, 4, 2, 40);
        c.causal = variant % 2;
        switch (variant) {
        case 0:
            c.lay_q = c.lay_k = c.lay_v = c.lay_o = c.lay_lse = TU_PERMUTED;
            break; /* BHSD */
        case 1:
            c.lay_q = c.lay_k = c.lay_v = c.lay_o = c.lay_lse = TU_STRIDED;
            break;
        case 2:
            c.lay_q = c.lay_k = c.lay_v = c.lay_o = TU_INNER2;
            break;
        case 3:
            c.lay_q = TU_PERMUTED;
            c.lay_v = TU_STRIDED;
            c.lay_o = TU_INNER2;
            c.lay_lse = TU_STRIDED;
            break;
        case 4:
            c.no_lse = 1;
            c.lay_o = TU_PERMUTED;
            break;
        case 5:
            c.D = 1;
            c.lay_q = c.lay_k = c.lay_v = c.lay_o = TU_STRIDED;
            break;
        case 6:
            c.D = 256;
            c.lay_k = TU_INNER2;
            c.lay_o = TU_STRIDED;
            c.no_lse = 1;
            break;
        }
        failed += run_all_dtypes(c, &n);
    }
    group_line("layouts (BHSD/strided/no lse)", n, failed);
}

/* Nothing to do (B = 0, Sq = 0), Sk = 0 and rows that see no key. */
static void group_empty(void) {
    long n = 0, failed = 0;
    cfg c = base(0, 5, 7, 2, 1, 8);
    failed += run_all_dtypes(c, &n);
    c = base(2, 0, 7, 2, 1, 8);
    failed += run_all_dtypes(c, &n);
    c = base(2, 5, 0, 4, 2, 16);
    c.causal = 1;
    failed += run_all_dtypes(c, &n);
    c = base(2, 9, 4, 2, 2, 5); /* causal with Sq > Sk: rows 0..4 see nothing */
    c.causal = 1;
    c.alibi = 1;
    failed += run_all_dtypes(c, &n);
    c = base(1, 12, 4, 2, 1, 8); /* a window out of reach of the early rows */
    c.wl = 1;
    c.wr = 2;
    c.dropout_p = 0.3f;
    failed += run_all_dtypes(c, &n);
    group_line("empty / fully masked", n, failed);
}

static void group_dropout(void) {
    long n = 0, failed = 0;
    for (int variant = 0; variant < 7; variant++) {
        cfg c = base(2, 37, 53, 4, 2, 32);
        switch (variant) {
        case 0:
            c.dropout_p = 0.1f;
            break;
        case 1:
            c.dropout_p = 0.5f;
            c.causal = 1;
            break;
        case 2:
            c.dropout_p = 0.3f;
            c.alibi = 2;
            c.softcap = 5.0f;
            break;
        case 3:
            c.dropout_p = 0.9f;
            c.D = 64;
            c.H = 8;
            c.Hk = 1;
            break;
        case 4:
            c.dropout_p = 0.2f;
            c.B = 1;
            c.Sq = 150;
            c.Sk = 170;
            c.causal = 1;
            c.wl = 40;
            break;
        case 5:
            c.dropout_p = 0.4f;
            c.lay_q = TU_STRIDED;
            c.lay_o = TU_PERMUTED;
            c.lay_k = TU_INNER2;
            c.lay_lse = TU_STRIDED;
            break;
        case 6:
            c.dropout_p = 0.25f;
            c.D = 7;
            c.Sq = 60;
            c.Sk = 21;
            c.wl = 5;
            break;
        }
        failed += run_all_dtypes(c, &n);
    }
    group_line("dropout", n, failed);
}

static void group_varlen(void) {
    long n = 0, failed = 0;
    /* empty sequences of every kind, Sq != Sk both ways */
    static const int32_t lq[] = {5, 0, 17, 1, 9, 0, 33, 2}, lk[] = {7, 3, 0, 12, 9, 0, 20, 40};
    for (int variant = 0; variant < 14; variant++) {
        cfg c = base_varlen(8, lq, lk, 4, 2, 32);
        switch (variant) {
        case 0:
            break;
        case 1:
            c.causal = 1;
            break;
        case 2:
            c.wl = 3;
            c.wr = 2;
            c.q_start = 3;
            c.k_start = 5;
            c.q_tail = 4;
            c.k_tail = 2;
            break;
        case 3:
            c.alibi = 1;
            c.q_tail = 6;
            c.lay_q = c.lay_k = c.lay_v = c.lay_o = TU_STRIDED;
            break;
        case 4:
            c.alibi = 2;
            c.causal = 1;
            c.q_start = 2;
            c.lay_lse = TU_PERMUTED;
            break;
        case 5:
            c.softcap = 4.0f;
            c.wr = 0;
            c.no_lse = 1;
            c.q_start = 1;
            c.q_tail = 1;
            break;
        case 6:
            c.H = 8;
            c.Hk = 1;
            c.causal = 1;
            c.alibi = 2;
            c.alibi_strided = 1;
            break;
        case 7:
            c.D = 1;
            c.wl = 0;
            c.wr = 0;
            c.lay_o = TU_INNER2;
            break;
        case 8:
            c.D = 256;
            c.H = 2;
            c.Hk = 1;
            c.causal = 1;
            c.q_start = 2;
            c.k_tail = 3;
            break;
        case 9:
            c.D = 80;
            c.wr = 3;
            c.softcap = 2.0f;
            c.alibi = 1;
            c.lay_q = TU_PERMUTED;
            break;
        case 10:
            c.dropout_p = 0.3f;
            c.causal = 1;
            c.q_start = 3;
            c.q_tail = 2;
            break;
        case 11:
            c.dropout_p = 0.6f;
            c.alibi = 2;
            c.lay_o = c.lay_lse = TU_STRIDED;
            break;
        case 12:
            c.D = 7;
            c.H = 3;
            c.Hk = 3;
            c.scale = 0.4f;
            c.Sq += 5;
            c.Sk += 100;
            break;
        case 13:
            c.D = 128;
            c.H = 6;
            c.Hk = 2;
            c.lay_k = c.lay_v = TU_PERMUTED;
            break;
        }
        failed += run_all_dtypes(c, &n);
    }
    /* no sequence (every row outside), all-empty sequences, one sequence */
    cfg c = base_varlen(0, lq, lk, 2, 1, 16);
    c.q_tail = 6;
    c.k_tail = 4;
    failed += run_all_dtypes(c, &n);
    static const int32_t zeros[] = {0, 0, 0}, q3[] = {0, 4, 0}, k3[] = {6, 0, 0};
    c = base_varlen(3, zeros, zeros, 2, 2, 8);
    c.q_start = 2;
    c.q_tail = 3;
    c.causal = 1;
    failed += run_all_dtypes(c, &n);
    c = base_varlen(3, q3, k3, 2, 1, 8); /* no sequence has both queries and keys */
    c.q_start = 1;
    failed += run_all_dtypes(c, &n);
    static const int32_t one_q[] = {13}, one_k[] = {29};
    c = base_varlen(1, one_q, one_k, 4, 4, 64);
    c.causal = 1;
    c.alibi = 2;
    failed += run_all_dtypes(c, &n);
    group_line("varlen", n, failed);
}

/* Random combinations of everything, fixed length and varlen. */
static void group_random(void) {
    long n = 0, failed = 0;
    static const int64_t dims[] = {1, 7, 32, 64, 80, 128, 256, 3, 17, 96};
    for (int r = 0; r < 90; r++) {
        const int64_t D = dims[tu_randint(0, 9)], Hk = tu_randint(1, 3);
        const int64_t g = (int64_t[]){1, 2, 8}[tu_randint(0, 2)], maxlen = D >= 128 ? 40 : 70;
        cfg c;
        if (r % 3 == 2) {
            int32_t lq[MAXSEQ], lk[MAXSEQ];
            const int nseq = (int)tu_randint(1, 6);
            for (int b = 0; b < nseq; b++) {
                lq[b] = (int32_t)(tu_randint(0, 3) == 0 ? 0 : tu_randint(1, maxlen));
                lk[b] = (int32_t)(tu_randint(0, 3) == 0 ? 0 : tu_randint(1, maxlen));
            }
            c = base_varlen(nseq, lq, lk, Hk * g, Hk, D);
            c.q_start = (int32_t)tu_randint(0, 3);
            c.k_start = (int32_t)tu_randint(0, 3);
            c.q_tail = (int32_t)tu_randint(0, 3);
            c.k_tail = (int32_t)tu_randint(0, 3);
        } else {
            c = base(tu_randint(1, 2), tu_randint(1, maxlen), tu_randint(0, maxlen), Hk * g, Hk, D);
        }
        c.causal = (int)tu_randint(0, 1);
        c.wl = (int)tu_randint(-1, 20);
        c.wr = (int)tu_randint(-1, 20);
        if (tu_randint(0, 2) == 0)
            c.wl = c.wr = -1;
        c.alibi = (int)tu_randint(0, 2);
        c.alibi_strided = c.alibi && tu_randint(0, 1);
        c.softcap = tu_randint(0, 2) == 0 ? (float)(1.0 + 10.0 * tu_uniform()) : 0.0f;
        c.scale = tu_randint(0, 2) == 0 ? (float)(0.05 + 0.5 * tu_uniform()) : 0.0f;
        c.lay_q = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lay_k = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lay_v = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lay_o = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lay_lse = (int)tu_randint(0, 2);
        c.no_lse = tu_randint(0, 5) == 0;
        if (tu_randint(0, 3) == 0)
            c.dropout_p = (float)(0.05 + 0.8 * tu_uniform());
        c.dtype = k_dtypes[r % 3];
        failed += !run_case(&c);
        n++;
    }
    group_line("random combinations", n, failed);
}

/* Mask tasks against fa_dropout_mask, into a contiguous mask and a transposed one with gaps. */
static void group_mask(void) {
    long n = 0, failed = 0;
    static const int64_t shapes[][4] = {
        {2, 3, 17, 37}, {1, 2, 5, 4}, {3, 1, 1, 1}, {2, 2, 3, 0}, {1, 4, 9, 130}};
    static const float ps[] = {0.1f, 0.5f, 0.9f};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int pi = 0; pi < 3; pi++)
            for (int transposed = 0; transposed < 2; transposed++) {
                const int64_t B = shapes[s][0], H = shapes[s][1], Sq = shapes[s][2],
                              Sk = shapes[s][3];
                CASE_BEGIN("dropout mask tasks: B=%lld H=%lld Sq=%lld Sk=%lld p=%g %s",
                           (long long)B, (long long)H, (long long)Sq, (long long)Sk, (double)ps[pi],
                           transposed ? "transposed with gaps" : "contiguous");
                fa_params params;
                fa_params_init(&params);
                params.dropout_p = ps[pi];
                params.dropout_seed = tu_next_u64();
                params.dropout_offset = tu_next_u64();
                uint8_t *want = dropout_mask(&params, B, H, Sq, Sk);
                /* element (b, h, i, j) at b·sb + h·sh + i·ss + j·sd */
                int64_t sd = 1, ss = Sk, sh = Sq * Sk, sb = H * Sq * Sk;
                if (transposed) {
                    ss = 2;
                    sd = 2 * Sq + 1;
                    sh = sd * Sk + 5;
                    sb = sh * H;
                }
                const int64_t nbuf = sb * B + 1;
                uint8_t *buf = malloc((size_t)nbuf);
                if (!buf)
                    abort();
                memset(buf, 0xEE, (size_t)nbuf);
                cfg c = base(B, Sq, Sk, H, H, 1);
                fa__problem p = problem_of(&c, &params);
                p.out.data = buf;
                p.out.dtype = FA_DTYPE_U8;
                p.out.sb = sb;
                p.out.sh = sh;
                p.out.ss = ss;
                p.out.sd = sd;
                const int64_t tasks = fa__mask_tasks(&p);
                CHECK_EQ_INT(tasks, B * H * Sq * ((Sk + 3) / 4));
                for (int64_t t = 0; t < tasks; t++)
                    fa__mask_task(&p, t);
                int64_t diff = 0, written = 0, kept = 0;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t i = 0; i < Sq; i++)
                            for (int64_t j = 0; j < Sk; j++) {
                                const uint8_t got = buf[b * sb + h * sh + i * ss + j * sd];
                                diff += got != want[((b * H + h) * Sq + i) * Sk + j];
                                kept += got == 1;
                            }
                for (int64_t t = 0; t < nbuf; t++)
                    written += buf[t] != 0xEE;
                CHECK_MSG(diff == 0, "%lld mask elements differ from fa_dropout_mask",
                          (long long)diff);
                CHECK_MSG(written == B * H * Sq * Sk,
                          "%lld bytes written, expected %lld (gaps touched or elements missing)",
                          (long long)written, (long long)(B * H * Sq * Sk));
                /* the same draw, but not a degenerate mask: some kept, some dropped */
                CHECK_MSG(B * H * Sq * Sk < 64 || (kept > 0 && kept < B * H * Sq * Sk),
                          "%lld of %lld kept", (long long)kept, (long long)(B * H * Sq * Sk));
                free(buf);
                free(want);
                failed += !CASE_END();
                n++;
            }
    group_line("dropout mask tasks", n, failed);
}

int main(void) {
    tu_seed_init("test_cuda_row");
    printf("library %s; %s\n", fa_version_string(), fa_build_info());
    group_head_dims();
    group_features();
    group_layouts();
    group_empty();
    group_dropout();
    group_varlen();
    group_random();
    group_mask();
    for (int t = 0; t < 3; t++) {
        const int dt = k_dtypes[t];
        const tu_errstats *r = &g_vs_ref[dt], *c = &g_vs_cpu[dt];
        printf("max error %s vs fp64 (%ld comparisons): out rel %.3g (abs %.3g), lse rel %.3g (abs "
               "%.3g)",
               tu_dtype_name(dt), r->cases, r->max_rel, r->max_abs, r->max_lse_rel, r->max_lse_abs);
        if (dt != FA_DTYPE_F32)
            printf(", %.2fx the naive %s implementation's", r->max_ratio, tu_dtype_name(dt));
        printf("\nmax difference %s vs the CPU backend (%ld comparisons): out rel %.3g (abs %.3g), "
               "lse "
               "rel %.3g (abs %.3g)\n",
               tu_dtype_name(dt), c->cases, c->max_rel, c->max_abs, c->max_lse_rel, c->max_lse_abs);
    }
    return TEST_REPORT();
}
