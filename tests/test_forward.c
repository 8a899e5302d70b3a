/* SPDX-License-Identifier: MIT */
/*
 * test_forward.c — fa_forward against the fp64 reference over a grid of shapes, masks, dtypes
 * and memory layouts; plus hand-computed checks of the reference itself.
 *
 * Every case draws fresh random inputs (the seed is printed; FA_TEST_SEED replays a run),
 * poisons out and lse (all bytes 0xFF = NaN) before the call so an unwritten element fails,
 * and checks that the gaps of a strided out/lse are left untouched. Tolerances: see
 * tu_check_attention in testutil.h (DESIGN.md §9).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------------
 * One forward case
 * ------------------------------------------------------------------------------------------- */

typedef struct fcfg {
    int64_t B, Sq, Sk, H, Hk, D;
    int causal, wl, wr;
    float softcap, scale; /* scale 0 = default */
    int alibi;            /* 0 none, 1 (H), 2 (B, H) */
    int alibi_strided;    /* slopes with non-unit strides (every other float, padded rows) */
    int dtype;
    int lq, lk, lv, lo, llse; /* layouts (tu_layout) */
    int no_lse;
    int kv_bcast;    /* k and v with batch stride 0 (one K/V shared by every batch) */
    double amp;      /* input amplitude (0 = 1) */
    double const_qk; /* nonzero: q = const_qk and k = +-const_qk everywhere (huge equal scores) */
    int packed;      /* 1: q, k, v are views of one (B, S, 3, H, D) buffer (qkvpacked); 2: k, v
                        of one (B, Sk, 2, Hk, D) buffer (kvpacked); 3: q, k and v are the same
                        view (same pointer) */
    float dropout_p; /* > 0: dropout, mask from fa_dropout_mask */
    uint64_t dropout_seed, dropout_offset;
} fcfg;

static tu_errstats g_stats[8]; /* per dtype (indexed by fa_dtype; room to spare) */

static fcfg base_cfg(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D) {
    fcfg c;
    memset(&c, 0, sizeof c);
    c.B = B;
    c.Sq = Sq;
    c.Sk = Sk;
    c.H = H;
    c.Hk = Hk;
    c.D = D;
    c.wl = -1;
    c.wr = -1;
    c.dtype = FA_DTYPE_F32;
    return c;
}

static void describe(const fcfg *c, char *buf, size_t n) {
    snprintf(buf, n,
             "%s B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld causal=%d window=(%d,%d) "
             "softcap=%g scale=%g alibi=%s%s layouts q=%s k=%s v=%s out=%s lse=%s%s%s%s%s "
             "dropout=%g",
             tu_dtype_name(c->dtype), (long long)c->B, (long long)c->Sq, (long long)c->Sk,
             (long long)c->H, (long long)c->Hk, (long long)c->D, c->causal, c->wl, c->wr,
             (double)c->softcap, (double)c->scale,
             c->alibi == 0   ? "none"
             : c->alibi == 1 ? "(H)"
                             : "(B,H)",
             c->alibi_strided ? "-strided" : "", tu_layout_name(c->lq), tu_layout_name(c->lk),
             tu_layout_name(c->lv), tu_layout_name(c->lo),
             c->no_lse ? "none" : tu_layout_name(c->llse), c->kv_bcast ? " kv-batch-stride-0" : "",
             c->amp != 0 && c->amp != 1 ? " (scaled inputs)" : "",
             c->const_qk != 0 ? " (constant q, k)" : "",
             c->packed == 1   ? " qkv-packed"
             : c->packed == 2 ? " kv-packed"
             : c->packed == 3 ? " q=k=v"
                              : "",
             (double)c->dropout_p);
}

static double *dalloc(int64_t n) {
    double *p = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!p)
        abort();
    return p;
}

/* Runs one case; returns 1 on pass. */
static int run_forward_case(const fcfg *c) {
    char name[512];
    describe(c, name, sizeof name);
    CASE_BEGIN("%s", name);

    const double amp = c->amp != 0 ? c->amp : 1.0;
    int64_t qshape[4] = {c->B, c->Sq, c->H, c->D};
    int64_t kshape[4] = {c->kv_bcast ? 1 : c->B, c->Sk, c->Hk, c->D};
    int64_t lshape[3] = {c->B, c->H, c->Sq};
    tu_tensor q, k, v, out, lse;
    tu_alloc(&q, c->dtype, 4, qshape, c->lq);
    tu_alloc(&k, c->dtype, 4, kshape, c->lk);
    tu_alloc(&v, c->dtype, 4, kshape, c->lv);
    tu_alloc(&out, c->dtype, 4, qshape, c->lo);
    tu_alloc(&lse, FA_DTYPE_F32, 3, lshape, c->llse);

    const int64_t nq = c->B * c->Sq * c->H * c->D, nk = c->B * c->Sk * c->Hk * c->D;
    const int64_t nl = c->B * c->H * c->Sq;
    double *dq = dalloc(nq), *dk = dalloc(nk), *dv = dalloc(nk);
    double *dout = dalloc(nq), *dref = dalloc(nq), *dnaive = dalloc(nq);
    double *dlse = dalloc(nl), *dlse_ref = dalloc(nl), *dlse_naive = dalloc(nl);
    double *dsize = dalloc(nl);

    tu_fill_normal(&q, amp, dq);
    tu_fill_normal(&k, amp, dk);
    tu_fill_normal(&v, 1.0, dv);
    if (c->const_qk != 0.0) {
        for (int64_t i = 0; i < q.numel; i++)
            dq[i] = fabs(c->const_qk);
        for (int64_t i = 0; i < k.numel; i++)
            dk[i] = c->const_qk;
        tu_scatter(&q, dq);
        tu_scatter(&k, dk);
    }
    /* Packed inputs: replace the views of q/k/v by views into one shared buffer. */
    void *packed_buf = NULL;
    if (c->packed == 1 || c->packed == 2) {
        const int n3 = c->packed == 1 ? 3 : 2;
        const int64_t S = c->Sk, Hx = c->Hk, D = c->D, es = (int64_t)tu_dtype_size(c->dtype);
        const int64_t total = c->B * S * n3 * Hx * D;
        packed_buf = malloc((size_t)(total > 0 ? total : 1) * (size_t)es);
        if (!packed_buf)
            abort();
        for (int64_t i = 0; i < total; i++)
            tu_store(packed_buf, c->dtype, i, tu_normal());
        tu_tensor *views[3] = {&q, &k, &v};
        for (int w = 3 - n3; w < 3; w++) {
            tu_tensor *x = views[w];
            const int slot = w - (3 - n3);
            free(x->buf); /* the separate buffer tu_alloc made */
            x->buf = (char *)packed_buf + (size_t)(slot * Hx * D * es);
            x->t.data = x->buf;
            x->t.stride[0] = S * n3 * Hx * D;
            x->t.stride[1] = n3 * Hx * D;
            x->t.stride[2] = D;
            x->t.stride[3] = 1;
            tu_gather(x, w == 0 ? dq : w == 1 ? dk : dv);
        }
    } else if (c->packed == 3) {
        free(k.buf);
        free(v.buf);
        k.t = v.t = q.t;
        k.buf = v.buf = q.buf;
        memcpy(dk, dq, sizeof(double) * (size_t)nk);
        memcpy(dv, dq, sizeof(double) * (size_t)nk);
    }
    if (c->kv_bcast) {
        k.t.shape[0] = v.t.shape[0] = c->B;
        k.t.stride[0] = v.t.stride[0] = 0;
        k.numel = v.numel = nk;
        tu_gather(&k, dk);
        tu_gather(&v, dv);
    }

    /* ALiBi slopes, fp32: mostly positive (the usual case), some negative (allowed) */
    float slopes[4 * 64 * 64];
    double dslopes[64 * 64];
    fa_params params;
    fa_params_init(&params);
    params.causal = c->causal;
    params.window_left = c->wl;
    params.window_right = c->wr;
    params.softcap = c->softcap;
    params.softmax_scale = c->scale;
    int64_t nslopes = c->alibi == 2 ? c->B * c->H : c->H;
    if (c->alibi) {
        /* element (b, h) at b * sb + h * sh */
        const int64_t sh_ = c->alibi_strided ? 2 : 1, sb_ = c->alibi_strided ? 2 * c->H + 3 : c->H;
        for (size_t i = 0; i < sizeof slopes / sizeof slopes[0]; i++)
            slopes[i] = NAN; /* gaps: poison */
        for (int64_t i = 0; i < nslopes; i++) {
            const int64_t b = c->alibi == 2 ? i / c->H : 0, h = i % c->H;
            double x = -0.2 + 0.7 * tu_uniform();
            if (x > -0.01 && x < 0.01)
                x = 0.01;
            slopes[b * sb_ + h * sh_] = (float)x;
            dslopes[i] = slopes[b * sb_ + h * sh_];
        }
        int64_t sh[2] = {c->B, c->H};
        if (c->alibi == 2)
            params.alibi_slopes = fa_tensor_contiguous(slopes, FA_DTYPE_F32, 2, sh);
        else
            params.alibi_slopes = fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, sh + 1);
        params.alibi_slopes.stride[params.alibi_slopes.ndim - 1] = sh_;
        if (c->alibi == 2)
            params.alibi_slopes.stride[0] = sb_;
    }

    uint8_t *mask = NULL;
    if (c->dropout_p > 0.0f) {
        params.dropout_p = c->dropout_p;
        params.dropout_seed = c->dropout_seed;
        params.dropout_offset = c->dropout_offset;
        int64_t mshape[4] = {c->B, c->H, c->Sq, c->Sk};
        const int64_t nm = c->B * c->H * c->Sq * c->Sk;
        mask = malloc((size_t)(nm > 0 ? nm : 1));
        if (!mask)
            abort();
        memset(mask, 0xEE, (size_t)(nm > 0 ? nm : 1));
        fa_tensor tm = fa_tensor_contiguous(mask, FA_DTYPE_U8, 4, mshape);
        fa_status ms = fa_dropout_mask(&params, &tm);
        CHECK_MSG(ms == FA_OK, "fa_dropout_mask returned %s: %s", fa_status_name(ms),
                  fa_last_error_message());
        int64_t bad = 0;
        for (int64_t i = 0; i < nm; i++)
            bad += mask[i] > 1;
        CHECK_MSG(bad == 0, "%lld mask elements are neither 0 nor 1", (long long)bad);
    }

    fa_status st = fa_forward(NULL, &params, &q.t, &k.t, &v.t, &out.t, c->no_lse ? NULL : &lse.t);
    CHECK_MSG(st == FA_OK, "fa_forward returned %s (%d): %s", fa_status_name(st), (int)st,
              fa_last_error_message());
    if (st == FA_OK) {
        CHECK_EQ_STR(fa_last_error_message(), "");
        tu_gather(&out, dout);
        tu_gather(&lse, dlse);

        ref_problem p;
        memset(&p, 0, sizeof p);
        p.B = c->B;
        p.Sq = c->Sq;
        p.Sk = c->Sk;
        p.H = c->H;
        p.Hk = c->Hk;
        p.D = c->D;
        p.scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)c->D);
        p.causal = c->causal;
        p.window_left = c->wl;
        p.window_right = c->wr;
        p.softcap = c->softcap;
        p.alibi = c->alibi ? dslopes : NULL;
        p.alibi_per_batch = c->alibi == 2;
        p.dropout_mask = mask;
        p.dropout_p = (double)c->dropout_p;
        ref_attention_forward(&p, dq, dk, dv, dref, dlse_ref);
        if (c->dtype != FA_DTYPE_F32)
            ref_attention_forward_rounded(&p, dq, dk, dv, dnaive, dlse_naive,
                                          tu_round_fn(c->dtype));
        else
            ref_score_sizes(&p, dq, dk, dsize);
        tu_check_attention(c->dtype, c->B, c->Sq, c->H, c->D, dout, dref,
                           c->dtype != FA_DTYPE_F32 ? dnaive : NULL, c->no_lse ? NULL : dlse,
                           dlse_ref, c->dtype != FA_DTYPE_F32 ? dlse_naive : NULL, dsize,
                           &g_stats[c->dtype]);
    }
    int64_t gaps = tu_count_touched_gaps(&out);
    CHECK_MSG(gaps == 0, "%lld gap elements of out were written", (long long)gaps);
    gaps = tu_count_touched_gaps(&lse);
    if (c->no_lse) {
        /* lse was not passed: no byte of its buffer may have changed */
        unsigned char *b = (unsigned char *)lse.buf;
        int64_t changed = 0;
        for (int64_t i = 0; i < lse.nbuf * 4; i++)
            changed += b[i] != 0xFF;
        CHECK_MSG(changed == 0, "lse buffer not passed but %lld bytes changed", (long long)changed);
    } else {
        CHECK_MSG(gaps == 0, "%lld gap elements of lse were written", (long long)gaps);
    }

    if (c->packed) { /* k and v (and q for qkvpacked) point into packed_buf or alias q */
        if (c->packed != 1)
            tu_free(&q);
        free(packed_buf);
    } else {
        tu_free(&q);
        tu_free(&k);
        tu_free(&v);
    }
    tu_free(&out);
    tu_free(&lse);
    free(mask);
    free(dq);
    free(dk);
    free(dv);
    free(dout);
    free(dref);
    free(dnaive);
    free(dlse);
    free(dlse_ref);
    free(dlse_naive);
    free(dsize);
    return CASE_END();
}

static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* Runs c for every dtype; returns the number of failed cases. */
static int run_all_dtypes(fcfg c) {
    int failed = 0;
    for (int t = 0; t < 3; t++) {
        c.dtype = k_dtypes[t];
        failed += !run_forward_case(&c);
    }
    return failed;
}

static void group_line(const char *group, long cases, long failed) {
    printf("%-28s %4ld cases, %ld failed\n", group, cases, failed);
    fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
 * The reference itself, against hand-computed values
 * ------------------------------------------------------------------------------------------- */

/* A ref_problem from its leading fields (the optional trailing ones zero). */
static ref_problem mkp(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D,
                       double scale, int causal, int wl, int wr, double softcap,
                       const double *alibi, int alibi_per_batch) {
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.B = B;
    p.Sq = Sq;
    p.Sk = Sk;
    p.H = H;
    p.Hk = Hk;
    p.D = D;
    p.scale = scale;
    p.causal = causal;
    p.window_left = wl;
    p.window_right = wr;
    p.softcap = softcap;
    p.alibi = alibi;
    p.alibi_per_batch = alibi_per_batch;
    return p;
}

static void reference_self_tests(void) {
    long before = test_state_g_.cases_passed + test_state_g_.cases_failed;
    long fb = test_state_g_.cases_failed;

    /* Uniform keys: every score equal, so out = mean of v and lse = s + log(Sk). */
    {
        CASE_BEGIN("reference: uniform keys give the mean of v");
        double q[2] = {0.5, -1.0}, k[3 * 2], v[3 * 2] = {1, 2, 3, 4, 5, 9}, out[2], lse[1];
        for (int j = 0; j < 3; j++) {
            k[2 * j] = 1.0;
            k[2 * j + 1] = 2.0;
        }
        ref_problem p = mkp(1, 1, 3, 1, 1, 2, 0.25, 0, -1, -1, 0.0, NULL, 0);
        ref_attention_forward(&p, q, k, v, out, lse);
        CHECK_NEAR(out[0], 3.0, 1e-15);
        CHECK_NEAR(out[1], 5.0, 1e-15);
        CHECK_NEAR(lse[0], 0.25 * (0.5 - 2.0) + log(3.0), 1e-15);
        CASE_END();
    }
    /* A 2x2 causal example with D = 1: row 0 sees key 0 only, row 1 both keys. */
    {
        CASE_BEGIN("reference: 2x2 causal example");
        double q[2] = {1.0, 2.0}, k[2] = {1.0, -1.0}, v[2] = {10.0, 20.0}, out[2], lse[2];
        ref_problem p = mkp(1, 2, 2, 1, 1, 1, 1.0, 1, -1, -1, 0.0, NULL, 0);
        ref_attention_forward(&p, q, k, v, out, lse);
        CHECK_NEAR(out[0], 10.0, 1e-15);
        CHECK_NEAR(lse[0], 1.0, 1e-15);
        /* row 1: scores 2 and -2 */
        double p0 = exp(2.0) / (exp(2.0) + exp(-2.0));
        CHECK_NEAR(out[1], p0 * 10.0 + (1 - p0) * 20.0, 1e-13);
        CHECK_NEAR(lse[1], log(exp(2.0) + exp(-2.0)), 1e-14);
        CASE_END();
    }
    /* flash-attn's documented causal masks (bottom-right aligned). */
    {
        CASE_BEGIN("reference: causal mask Sq=2 Sk=5 is 11110/11111");
        ref_problem p = mkp(1, 2, 5, 1, 1, 1, 1.0, 1, -1, -1, 0.0, NULL, 0);
        const char *want[2] = {"11110", "11111"};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 5; j++)
                CHECK_EQ_INT(ref_visible(&p, i, j), want[i][j] - '0');
        CASE_END();
        CASE_BEGIN("reference: causal mask Sq=5 Sk=2 is 00/00/00/10/11");
        ref_problem p2 = mkp(1, 5, 2, 1, 1, 1, 1.0, 1, -1, -1, 0.0, NULL, 0);
        const char *want2[5] = {"00", "00", "00", "10", "11"};
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 2; j++)
                CHECK_EQ_INT(ref_visible(&p2, i, j), want2[i][j] - '0');
        /* and the forward gives out = 0, lse = -inf on the empty rows */
        double q[5] = {1, 2, 3, 4, 5}, k[2] = {1, 1}, v[2] = {3, 7}, out[5], lse[5];
        ref_attention_forward(&p2, q, k, v, out, lse);
        for (int i = 0; i < 3; i++) {
            CHECK(out[i] == 0.0);
            CHECK(lse[i] == -INFINITY);
        }
        CHECK_NEAR(out[3], 3.0, 1e-15);
        CHECK_NEAR(out[4], 5.0, 1e-15);
        CHECK_NEAR(lse[4], 5.0 + log(2.0), 1e-14);
        CASE_END();
    }
    /* Sliding window (1, 0) with Sq = Sk = 4: row i sees keys i-1 and i. */
    {
        CASE_BEGIN("reference: window (1,0) and (0,1) masks");
        ref_problem p = mkp(1, 4, 4, 1, 1, 1, 1.0, 0, 1, 0, 0.0, NULL, 0);
        const char *want[4] = {"1000", "1100", "0110", "0011"};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                CHECK_EQ_INT(ref_visible(&p, i, j), want[i][j] - '0');
        ref_problem p2 = mkp(1, 4, 4, 1, 1, 1, 1.0, 0, 0, 1, 0.0, NULL, 0);
        const char *want2[4] = {"1100", "0110", "0011", "0001"};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                CHECK_EQ_INT(ref_visible(&p2, i, j), want2[i][j] - '0');
        /* causal forces right = 0 even if window_right says otherwise */
        ref_problem p3 = mkp(1, 4, 4, 1, 1, 1, 1.0, 1, 1, 3, 0.0, NULL, 0);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                CHECK_EQ_INT(ref_visible(&p3, i, j), want[i][j] - '0');
        CASE_END();
    }
    /* ALiBi + softcap + GQA, by hand: Sq = 1, Sk = 2, H = 2, Hk = 1, D = 1. */
    {
        CASE_BEGIN("reference: ALiBi, softcap and GQA by hand");
        double q[2] = {1.0, 2.0}, k[2] = {1.0, 3.0}, v[2] = {1.0, -1.0}, out[2], lse[2];
        double slopes[2] = {0.5, 0.25};
        ref_problem p = mkp(1, 1, 2, 2, 1, 1, 0.5, 0, -1, -1, 2.0, slopes, 0);
        ref_attention_forward(&p, q, k, v, out, lse);
        for (int h = 0; h < 2; h++) {
            /* query row 0 is aligned with key Sk - Sq = 1 */
            double s0 = 2.0 * tanh(0.5 * q[h] * k[0] / 2.0) - slopes[h] * 1.0;
            double s1 = 2.0 * tanh(0.5 * q[h] * k[1] / 2.0) - slopes[h] * 0.0;
            double l = log(exp(s0) + exp(s1));
            CHECK_NEAR(lse[h], l, 1e-14);
            CHECK_NEAR(out[h], exp(s0 - l) * 1.0 + exp(s1 - l) * -1.0, 1e-14);
        }
        /* (B, H) slopes with B = 1 give the same */
        double out2[2], lse2[2];
        p.alibi_per_batch = 1;
        ref_attention_forward(&p, q, k, v, out2, lse2);
        CHECK(out2[0] == out[0] && out2[1] == out[1] && lse2[0] == lse[0] && lse2[1] == lse[1]);
        CASE_END();
    }
    /* Sk = 0: out 0, lse -inf. */
    {
        CASE_BEGIN("reference: Sk = 0");
        double q[3] = {1, 2, 3}, out[3] = {9, 9, 9}, lse[1] = {9};
        ref_problem p = mkp(1, 1, 0, 1, 1, 3, 1.0, 0, -1, -1, 0.0, NULL, 0);
        ref_attention_forward(&p, q, NULL, NULL, out, lse);
        CHECK(out[0] == 0.0 && out[1] == 0.0 && out[2] == 0.0);
        CHECK(lse[0] == -INFINITY);
        CASE_END();
    }
    /* The rounded variant without rounding equals the reference; fp16/bf16 helpers round. */
    {
        CASE_BEGIN("test helpers: fp16/bf16 round-to-nearest-even");
        CHECK(tu_f16_from_double(1.0) == 0x3C00);
        CHECK(tu_f16_from_double(-2.0) == 0xC000);
        CHECK(tu_f16_from_double(65504.0) == 0x7BFF);
        CHECK(tu_f16_from_double(65520.0) == 0x7C00);             /* rounds up to inf */
        CHECK(tu_f16_from_double(1.0 + 0x1.0p-11) == 0x3C00);     /* tie to even (down) */
        CHECK(tu_f16_from_double(1.0 + 3 * 0x1.0p-11) == 0x3C02); /* tie to even (up) */
        CHECK(tu_f16_from_double(0x1.0p-24) == 0x0001);           /* smallest subnormal */
        CHECK(tu_f16_from_double(0x1.0p-25) == 0x0000);           /* tie to even: 0 */
        CHECK(tu_f16_to_double(0x3555) == 0x1.554p-2);
        CHECK(tu_bf16_from_double(1.0) == 0x3F80);
        CHECK(tu_bf16_from_double(1.0 + 0x1.0p-8) == 0x3F80); /* tie to even (down) */
        CHECK(tu_bf16_from_double(1.0 + 3 * 0x1.0p-8) == 0x3F82);
        CHECK(tu_bf16_to_double(0xC040) == -3.0);
        CHECK(tu_round_f16(0.1) == tu_f16_to_double(0x2E66));
        for (int i = 0; i < 2000; i++) {
            double x = tu_normal() * 10.0;
            CHECK(tu_f16_to_double(tu_f16_from_double(x)) == tu_round_f16(x));
            CHECK(tu_bf16_to_double(tu_bf16_from_double(x)) == tu_round_bf16(x));
            CHECK(fabs(tu_round_f16(x) - x) <= 0.5 * tu_ulp(FA_DTYPE_F16, x));
            CHECK(fabs(tu_round_bf16(x) - x) <= 0.5 * tu_ulp(FA_DTYPE_BF16, x));
            CHECK(tu_round_f32(x) == (double)(float)x);
        }
        double q[4] = {0.3, -0.7, 1.1, 0.2}, k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
        double o1[4], o2[4], l1[2], l2[2];
        ref_problem p = mkp(1, 2, 2, 1, 1, 2, 0.7, 0, -1, -1, 0.0, NULL, 0);
        ref_attention_forward(&p, q, k, v, o1, l1);
        ref_attention_forward_rounded(&p, q, k, v, o2, l2, NULL);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(l1, l2, sizeof l1) == 0);
        CASE_END();
    }
    /* Internal consistency on random data: causal == window (-1, 0); GQA == the same K/V
     * heads replicated (Hk = H); (B, H) slopes with equal rows == (H) slopes. */
    {
        CASE_BEGIN("reference: causal == window(-1,0), GQA == replicated heads, ALiBi forms");
        enum { B = 2, SQ = 7, SK = 11, H = 4, HK = 2, D = 5 };
        static double q[B * SQ * H * D], k[B * SK * HK * D], v[B * SK * HK * D];
        static double k4[B * SK * H * D], v4[B * SK * H * D];
        static double o1[B * SQ * H * D], o2[B * SQ * H * D], l1[B * H * SQ], l2[B * H * SQ];
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
            q[i] = tu_normal();
        for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
            k[i] = tu_normal();
            v[i] = tu_normal();
        }
        for (int b = 0; b < B; b++)
            for (int j = 0; j < SK; j++)
                for (int h = 0; h < H; h++)
                    for (int d = 0; d < D; d++) {
                        k4[((b * SK + j) * H + h) * D + d] = k[((b * SK + j) * HK + h / 2) * D + d];
                        v4[((b * SK + j) * H + h) * D + d] = v[((b * SK + j) * HK + h / 2) * D + d];
                    }
        double sl[H] = {0.1, 0.2, 0.3, 0.4}, sl2[B * H];
        for (int i = 0; i < B * H; i++)
            sl2[i] = sl[i % H];
        ref_problem p1 = mkp(B, SQ, SK, H, HK, D, 0.4, 1, 2, -1, 0.0, NULL, 0);
        ref_problem p2 = p1;
        p2.causal = 0;
        p2.window_right = 0;
        ref_attention_forward(&p1, q, k, v, o1, l1);
        ref_attention_forward(&p2, q, k, v, o2, l2);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(l1, l2, sizeof l1) == 0);
        p2 = p1;
        p2.Hk = H;
        ref_attention_forward(&p2, q, k4, v4, o2, l2);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(l1, l2, sizeof l1) == 0);
        p1.alibi = sl;
        p1.softcap = 3.0;
        p2 = p1;
        p2.alibi = sl2;
        p2.alibi_per_batch = 1;
        ref_attention_forward(&p1, q, k, v, o1, l1);
        ref_attention_forward(&p2, q, k, v, o2, l2);
        CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(l1, l2, sizeof l1) == 0);
        /* softmax rows sum to one: with v = 1 everywhere, out = 1 on rows that see a key */
        for (size_t i = 0; i < sizeof v4 / sizeof v4[0]; i++)
            v4[i] = 1.0;
        p2 = p1;
        p2.Hk = H;
        ref_attention_forward(&p2, q, k4, v4, o2, l2);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < SQ; i++)
                for (int h = 0; h < H; h++)
                    CHECK_NEAR(o2[((b * SQ + i) * H + h) * D], 1.0, 1e-14);
        CASE_END();
    }
    long after = test_state_g_.cases_passed + test_state_g_.cases_failed;
    group_line("reference self-tests", after - before, test_state_g_.cases_failed - fb);
}

/* ---------------------------------------------------------------------------------------------
 * Groups
 * ------------------------------------------------------------------------------------------- */

static void group_shapes(void) {
    /* Every head dim, with odd lengths, Sq != Sk both ways, Sq = 1, Sk = 1, GQA 1/2/8. */
    static const int64_t dims[] = {1, 7, 32, 64, 80, 128, 256};
    static const int64_t lens[][2] = {{1, 1}, {1, 37},  {37, 1},  {5, 2},
                                      {2, 5}, {33, 33}, {17, 65}, {65, 17}};
    static const int64_t heads[][2] = {{1, 1}, {4, 2}, {8, 1}, {3, 3}};
    long n = 0, failed = 0;
    int r = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++, r++) {
            const int64_t *hh = heads[r % 4];
            fcfg c = base_cfg(1 + r % 2, lens[li][0], lens[li][1], hh[0], hh[1], dims[di]);
            if (dims[di] >= 128 && c.H * c.B > 4) { /* keep the big head dims cheap */
                c.B = 1;
            }
            c.causal = (r % 3 == 2);
            failed += run_all_dtypes(c);
            n += 3;
        }
    group_line("shapes (D x lengths x GQA)", n, failed);
}

static void group_masks(void) {
    static const int64_t lens[][2] = {{37, 53}, {53, 37}, {48, 48}, {1, 40}, {40, 1}};
    static const int64_t dims[] = {16, 64, 80, 24, 40};
    long n = 0, failed = 0;
    for (int variant = 0; variant < 19; variant++) {
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t H = (variant % 2) ? 4 : 2, Hk = (variant % 3 == 0) ? 1 : 2;
            fcfg c = base_cfg(2, lens[li][0], lens[li][1], H, Hk, dims[(variant + li) % 5]);
            switch (variant) {
            case 0:
                c.causal = 1;
                break;
            case 1:
                c.wl = 5;
                break; /* left only */
            case 2:
                c.wr = 3;
                break; /* right only */
            case 3:
                c.wl = 4;
                c.wr = 2;
                break; /* both */
            case 4:
                c.causal = 1;
                c.wl = 7;
                break; /* causal + left (Mistral) */
            case 5:
                c.wl = 0;
                c.wr = 0;
                break; /* diagonal only */
            case 6:
                c.wl = 100;
                c.wr = 100;
                break; /* wider than the sequence */
            case 7:
                c.alibi = 1;
                break;
            case 8:
                c.alibi = 2;
                break;
            case 9:
                c.alibi = 1;
                c.causal = 1;
                break;
            case 10:
                c.softcap = 5.0f;
                break;
            case 11:
                c.softcap = 3.0f;
                c.alibi = 2;
                c.causal = 1;
                break;
            case 12:
                c.scale = 0.3f;
                break;
            case 13:
                c.scale = -0.25f;
                c.causal = 1;
                break; /* any finite scale is used as is */
            case 14:
                c.softcap = 2.0f;
                c.wl = 6;
                c.wr = 1;
                break;
            case 15:
                c.scale = 4.0f / (float)sqrt((double)c.D);
                break; /* scores ~ N(0, 16) */
            case 16:
                c.causal = 1;
                c.wr = 5;
                break; /* causal overrides window_right */
            case 17:
                c.alibi = 2;
                c.wl = 9;
                c.wr = 0;
                c.scale = 0.5f;
                break;
            case 18:
                c.wl = 0;
                c.wr = -1;
                c.softcap = 1.0f;
                c.alibi = 1;
                break;
            }
            failed += run_all_dtypes(c);
            n += 3;
        }
    }
    group_line("masks/bias/softcap/scale", n, failed);
}

static void group_layouts(void) {
    long n = 0, failed = 0;
    for (int variant = 0; variant < 17; variant++) {
        fcfg c = base_cfg(2, 19, 23, 4, 2, 40);
        c.causal = variant % 2;
        switch (variant) {
        case 0:
            c.lq = c.lk = c.lv = c.lo = TU_PERMUTED;
            c.llse = TU_PERMUTED;
            break; /* BHSD */
        case 1:
            c.lq = c.lk = c.lv = c.lo = TU_STRIDED;
            c.llse = TU_STRIDED;
            break;
        case 2:
            c.lq = c.lk = c.lv = c.lo = TU_INNER2;
            break;
        case 3:
            c.lq = TU_PERMUTED;
            c.lk = TU_CONTIG;
            c.lv = TU_STRIDED;
            c.lo = TU_STRIDED;
            c.llse = TU_STRIDED;
            break;
        case 4:
            c.no_lse = 1;
            c.lo = TU_PERMUTED;
            break;
        case 5:
            c.kv_bcast = 1;
            c.lk = TU_STRIDED;
            break;
        case 6:
            c.lq = TU_STRIDED;
            c.lo = TU_INNER2;
            c.lk = TU_PERMUTED;
            c.lv = TU_INNER2;
            c.alibi = 2;
            c.wl = 3;
            break;
        case 7:
            c.D = 1;
            c.lq = c.lk = c.lv = c.lo = TU_STRIDED;
            c.llse = TU_PERMUTED;
            break;
        case 8:
            c.Hk = 4;
            c.lq = c.lk = c.lv = c.lo = TU_PERMUTED;
            c.softcap = 4.0f;
            break;
        case 9:
            c.alibi = 2;
            c.alibi_strided = 1;
            c.lq = TU_STRIDED;
            break;
        case 10:
            c.alibi = 1;
            c.alibi_strided = 1;
            c.causal = 1;
            c.lk = TU_INNER2;
            break;
        case 11:
            c.wl = 2147483647;
            c.wr = 2147483647;
            break; /* = unbounded */
        case 12:
            c.wl = 2147483647;
            c.wr = 0;
            c.lo = TU_STRIDED;
            break; /* = causal */
        case 13:
            c.Sq = c.Sk;
            c.Hk = c.H;
            c.packed = 1;
            c.causal = 1;
            break; /* qkvpacked */
        case 14:
            c.packed = 2;
            c.lo = TU_PERMUTED;
            break; /* kvpacked */
        case 15:
            c.Sq = c.Sk;
            c.Hk = c.H;
            c.packed = 3;
            c.alibi = 1;
            break; /* q = k = v */
        case 16:
            c.Sq = c.Sk = 70;
            c.Hk = c.H = 3;
            c.packed = 1;
            c.lo = TU_STRIDED;
            break;
        }
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("layouts (BHSD/strided/views)", n, failed);
}

static void group_large(void) {
    long n = 0, failed = 0;
    struct {
        int64_t Sq, Sk, H, Hk, D;
        int causal, wl, wr, alibi;
    } big[] = {
        {257, 300, 2, 1, 64, 0, -1, -1, 0},
        {257, 300, 2, 1, 64, 1, -1, -1, 0},
        {300, 257, 4, 2, 32, 1, -1, -1, 0},
        {280, 280, 2, 2, 48, 1, 64, -1, 1}, /* sliding window: skipped blocks on both sides */
        {260, 260, 2, 1, 40, 0, 30, 20, 0},
        {600, 640, 1, 1, 64, 1, -1, -1, 0}, /* 3 query blocks of 252 rows, Sq < Sk */
        {530, 530, 2, 2, 32, 0, 150, 10, 1},
        {70, 70, 2, 1, 256, 0, -1, -1, 0},
        {70, 70, 2, 2, 256, 1, -1, -1, 0},
        {1, 600, 8, 2, 64, 0, -1, -1, 0}, /* decode-like */
        {3, 530, 4, 1, 128, 1, -1, -1, 1},
        {3, 70, 200, 1, 8, 0, -1, -1, 1}, /* more query heads per KV head than rows */
        {5, 9, 130, 2, 16, 1, 4, -1, 0},
        /* split-KV decode (g·Sq <= 16 rows, Sk > 1024: keys cut into 1024-key chunks) */
        {1, 3000, 8, 2, 64, 0, -1, -1, 0},
        {2, 2500, 8, 1, 32, 1, -1, -1, 1},   /* causal, ALiBi, 16 rows */
        {1, 2100, 4, 4, 16, 0, 700, -1, 0},  /* window: whole chunks fall outside the band */
        {4, 1030, 2, 1, 8, 1, 100, 0, 0},    /* a chunk with 6 keys, most chunks empty */
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        fcfg c = base_cfg(1, big[i].Sq, big[i].Sk, big[i].H, big[i].Hk, big[i].D);
        c.causal = big[i].causal;
        c.wl = big[i].wl;
        c.wr = big[i].wr;
        c.alibi = big[i].alibi;
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("large (multi-block)", n, failed);
}

static void group_empty(void) {
    long n = 0, failed = 0;
    /* Sk = 0: every row is empty */
    fcfg c = base_cfg(2, 5, 0, 4, 2, 16);
    failed += run_all_dtypes(c);
    n += 3;
    c.causal = 1;
    failed += run_all_dtypes(c);
    n += 3;
    /* fully masked rows inside a real problem */
    c = base_cfg(1, 10, 3, 2, 1, 8);
    c.wl = 0;
    c.wr = 0; /* row i sees only key i - 7 */
    failed += run_all_dtypes(c);
    n += 3;
    c = base_cfg(2, 9, 4, 2, 2, 5);
    c.causal = 1; /* rows 0..4 see nothing */
    c.alibi = 1;
    failed += run_all_dtypes(c);
    n += 3;
    c = base_cfg(1, 6, 6, 1, 1, 3);
    c.wl = 2;
    c.wr = -1;
    c.causal = 0;
    c.Sq = 12; /* left window only, Sq > Sk: row i sees keys >= i - 8 */
    failed += run_all_dtypes(c);
    n += 3;
    /* window that puts every key out of reach for early rows with Sq > Sk */
    c = base_cfg(1, 12, 4, 2, 1, 8);
    c.wl = 1;
    c.wr = 2;
    failed += run_all_dtypes(c);
    n += 3;
    /* B = 0 and Sq = 0: nothing to do, status OK */
    c = base_cfg(0, 5, 7, 2, 1, 8);
    failed += run_all_dtypes(c);
    n += 3;
    c = base_cfg(2, 0, 7, 2, 1, 8);
    failed += run_all_dtypes(c);
    n += 3;
    c = base_cfg(2, 0, 0, 2, 1, 8);
    failed += run_all_dtypes(c);
    n += 3;
    /* huge equal scores (+-1024 with D = 64, scale 1): exp overflows/underflows unless the
     * row maximum is subtracted; out must be the (masked) mean of v, lse = s + log(count) */
    c = base_cfg(2, 20, 33, 2, 1, 64);
    c.scale = 1.0f;
    c.const_qk = 4.0;
    failed += run_all_dtypes(c);
    n += 3;
    c.const_qk = -4.0;
    c.causal = 1;
    failed += run_all_dtypes(c);
    n += 3;
    group_line("empty / masked / extreme", n, failed);
}

/* Dropout in the forward: out against the reference with fa_dropout_mask's mask. */
static void group_dropout(void) {
    long n = 0, failed = 0;
    for (int variant = 0; variant < 8; variant++) {
        fcfg c = base_cfg(2, 37, 53, 4, 2, 32);
        c.dropout_seed = tu_next_u64();
        c.dropout_offset = tu_next_u64() >> (variant * 8);
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
            c.dropout_p = 0.25f;
            c.Sq = 60;
            c.Sk = 20;
            c.causal = 1;
            break; /* empty rows */
        case 6:
            c.dropout_p = 0.4f;
            c.lq = TU_STRIDED;
            c.lo = TU_PERMUTED;
            c.lk = TU_INNER2;
            c.llse = TU_STRIDED;
            break;
        case 7:
            c.dropout_p = 1e-6f;
            c.D = 7;
            c.H = 3;
            c.Hk = 3;
            break; /* ~never drops */
        }
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("dropout (forward)", n, failed);
}

/* fa_dropout_mask on its own: a pure function of (seed, offset, b, h, i, j) for a given H. */
static void group_dropout_mask(void) {
    long f0 = test_state_g_.cases_failed, c0 = test_state_g_.cases_passed + f0;
    enum { B = 2, H = 3, SQ = 40, SK = 300 };
    static uint8_t m1[B * H * SQ * SK], m2[B * H * SQ * SK], m3[B * H * SQ * SK];
    int64_t shape[4] = {B, H, SQ, SK};
    fa_params p;
    fa_params_init(&p);
    p.dropout_seed = tu_next_u64();
    p.dropout_offset = tu_next_u64();

    CASE_BEGIN("dropout mask: p = 0 keeps everything");
    fa_tensor t = fa_tensor_contiguous(m1, FA_DTYPE_U8, 4, shape);
    memset(m1, 7, sizeof m1);
    CHECK_EQ_INT(fa_dropout_mask(&p, &t), FA_OK);
    int64_t ones = 0;
    for (size_t i = 0; i < sizeof m1; i++)
        ones += m1[i] == 1;
    CHECK_EQ_INT(ones, (int64_t)sizeof m1);
    CASE_END();

    static const float ps[] = {0.1f, 0.5f, 0.9f};
    for (int pi = 0; pi < 3; pi++) {
        CASE_BEGIN("dropout mask: p = %g keep rate, determinism, slicing", (double)ps[pi]);
        p.dropout_p = ps[pi];
        t = fa_tensor_contiguous(m1, FA_DTYPE_U8, 4, shape);
        CHECK_EQ_INT(fa_dropout_mask(&p, &t), FA_OK);
        int64_t kept = 0;
        for (size_t i = 0; i < sizeof m1; i++)
            kept += m1[i];
        const double n = (double)sizeof m1, want = 1.0 - (double)ps[pi];
        const double sigma = sqrt(n * want * (1.0 - want));
        CHECK_MSG(fabs((double)kept - n * want) <= 6.0 * sigma,
                  "kept %lld of %.0f, expected %.1f +- 6 * %.1f", (long long)kept, n, n * want,
                  sigma);
        /* same params, same bits */
        t.data = m2;
        CHECK_EQ_INT(fa_dropout_mask(&p, &t), FA_OK);
        CHECK(memcmp(m1, m2, sizeof m1) == 0);
        /* a smaller (B, Sq, Sk) with the same H sees the same bits at the same (b, h, i, j),
         * written through a strided (BHSD -> permuted) view */
        int64_t sub[4] = {1, H, 13, 97};
        fa_tensor ts = fa_tensor_contiguous(m3, FA_DTYPE_U8, 4, sub);
        ts.stride[2] = 1;      /* i fastest ... */
        ts.stride[3] = sub[2]; /* ... then j: a transposed layout */
        memset(m3, 9, sizeof m3);
        CHECK_EQ_INT(fa_dropout_mask(&p, &ts), FA_OK);
        int64_t diff = 0;
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sub[2]; i++)
                for (int64_t j = 0; j < sub[3]; j++)
                    diff += m3[h * ts.stride[1] + i + j * sub[2]] != m1[(h * SQ + i) * SK + j];
        CHECK_MSG(diff == 0, "%lld elements of a sub-shaped mask differ", (long long)diff);
        /* another seed or offset gives another mask */
        fa_params p2 = p;
        p2.dropout_seed ^= 1;
        t.data = m2;
        CHECK_EQ_INT(fa_dropout_mask(&p2, &t), FA_OK);
        CHECK(memcmp(m1, m2, sizeof m1) != 0);
        p2 = p;
        p2.dropout_offset += 1;
        CHECK_EQ_INT(fa_dropout_mask(&p2, &t), FA_OK);
        CHECK(memcmp(m1, m2, sizeof m1) != 0);
        CASE_END();
    }
    group_line("dropout mask", test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
               test_state_g_.cases_failed - f0);
}

/* A few random configurations of everything at once. */
static void group_random(void) {
    long n = 0, failed = 0;
    static const int64_t dims[] = {1, 7, 32, 64, 80, 128, 256, 3, 17, 96};
    for (int i = 0; i < 150; i++) {
        int64_t D = dims[tu_randint(0, 9)];
        int64_t Hk = tu_randint(1, 3), g = (int64_t[]){1, 2, 8}[tu_randint(0, 2)];
        int64_t maxlen = D >= 128 ? 48 : 96;
        fcfg c =
            base_cfg(tu_randint(1, 2), tu_randint(1, maxlen), tu_randint(0, maxlen), Hk * g, Hk, D);
        c.causal = (int)tu_randint(0, 1);
        c.wl = (int)tu_randint(-1, 20);
        c.wr = (int)tu_randint(-1, 20);
        if (tu_randint(0, 2) == 0)
            c.wl = c.wr = -1;
        c.alibi = (int)tu_randint(0, 2);
        c.softcap = tu_randint(0, 2) == 0 ? (float)(1.0 + 10.0 * tu_uniform()) : 0.0f;
        c.scale = tu_randint(0, 2) == 0 ? (float)(0.05 + 0.5 * tu_uniform()) : 0.0f;
        c.lq = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lk = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lv = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lo = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.llse = (int)tu_randint(0, 2);
        c.dtype = k_dtypes[i % 3];
        if (tu_randint(0, 3) == 0) {
            c.dropout_p = (float)(0.05 + 0.8 * tu_uniform());
            c.dropout_seed = tu_next_u64();
            c.dropout_offset = tu_next_u64();
        }
        failed += !run_forward_case(&c);
        n++;
    }
    group_line("random combinations", n, failed);
}

/* fp16/bf16 outputs are rounded to nearest even. With q = 0 every score is 0, so out is the plain
 * mean of v's rows, which fp32 computes exactly here (the sums need at most 11 + 11 bits): column
 * d holds base_d in every row, plus one
 * ulp of the dtype in ones_d of the Sk rows, so out = base_d + (ones_d / Sk) ulp, a value the
 * store must round (0.5 ulp: the tie goes to the even neighbour). Columns cover fractions of
 * 0 to Sk - 1 ulps / Sk, signs, binades and (fp16) subnormals; D = 37 leaves a SIMD tail. Run
 * through fa_forward (Sq = 3) and fa_forward_kvcache (one query: decode, and with Sk = 2048 the
 * split path whose merge writes the rows). */
static int rounding_case(int dtype, int64_t Sk, int kvcache) {
    const int64_t H = 2, Hk = 1, D = 37, Sq = kvcache ? 1 : 3;
    const int p = dtype == FA_DTYPE_F16 ? 11 : 8;
    const size_t es = tu_dtype_size(dtype);
    double base[37], ulp[37], want[37];
    int64_t ones[37];
    for (int64_t d = 0; d < D; d++) {
        const int e = (int)tu_randint(-3, 3);
        const double sign = tu_randint(0, 1) ? -1.0 : 1.0;
        base[d] = sign * ldexp(1.0 + (double)tu_randint(0, 7) / 16.0, e);
        ulp[d] = ldexp(1.0, e - (p - 1));
        if (dtype == FA_DTYPE_F16 && d == 5) { /* a subnormal column: spacing 2^-24 */
            base[d] = 3 * 0x1.0p-24;
            ulp[d] = 0x1.0p-24;
        }
        ones[d] = d < 4 ? d * Sk / 4 : tu_randint(0, Sk - 1); /* 0, 1/4, 1/2, 3/4, random */
        want[d] = tu_round_fn(dtype)(base[d] + (double)ones[d] / (double)Sk * ulp[d]);
    }
    void *q = calloc((size_t)(Sq * H * D), es), *k = calloc((size_t)(Sk * Hk * D), es);
    void *v = malloc((size_t)(Sk * Hk * D) * es), *out = malloc((size_t)(Sq * H * D) * es);
    if (!q || !k || !v || !out)
        abort();
    for (int64_t j = 0; j < Sk; j++) /* the first ones_d rows of column d get the extra ulp */
        for (int64_t d = 0; d < D; d++)
            tu_store(v, dtype, j * D + d, base[d] + (j < ones[d] ? ulp[d] : 0.0));
    memset(out, 0xFF, (size_t)(Sq * H * D) * es);
    const int64_t sq[4] = {1, Sq, H, D}, sk[4] = {1, Sk, Hk, D};
    fa_tensor tq = fa_tensor_contiguous(q, dtype, 4, sq);
    fa_tensor tout = fa_tensor_contiguous(out, dtype, 4, sq);
    fa_tensor tk = fa_tensor_contiguous(k, dtype, 4, sk), tv = fa_tensor_contiguous(v, dtype, 4, sk);
    fa_status st;
    if (kvcache) {
        fa_kvcache kv;
        fa_kvcache_init(&kv);
        kv.k_cache = tk;
        kv.v_cache = tv;
        st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &tout, NULL);
    } else {
        st = fa_forward(NULL, NULL, &tq, &tk, &tv, &tout, NULL);
    }
    CHECK_MSG(st == FA_OK, "%s: %s", fa_status_name(st), fa_last_error_message());
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < Sq * H * D; i++)
        if (!(tu_load(out, dtype, i) == want[i % D]) && bad++ == 0)
            first = i;
    if (bad) {
        const int64_t d = first % D;
        CHECK_MSG(0, "%lld elements not rounded to nearest even; first d=%lld: %.9g, want %.9g "
                  "(base %.9g + %lld/%lld ulp)", (long long)bad, (long long)d,
                  tu_load(out, dtype, first), want[d], base[d], (long long)ones[d], (long long)Sk);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    return bad == 0 && st == FA_OK;
}

static void group_rounding(void) {
    long n = 0, failed = 0;
    static const struct {
        int64_t Sk;
        int kvcache;
        const char *path;
    } runs[] = {{4, 0, "forward"}, {4, 1, "decode"}, {2048, 1, "split decode"}};
    for (int t = 1; t < 3; t++) /* fp16, bf16 */
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            CASE_BEGIN("rounding %s %s Sk=%lld", tu_dtype_name(k_dtypes[t]), runs[r].path,
                       (long long)runs[r].Sk);
            failed += !rounding_case(k_dtypes[t], runs[r].Sk, runs[r].kvcache);
            n++;
            CASE_END();
        }
    group_line("output rounding", n, failed);
}

int main(void) {
    tu_seed_init("test_forward");
    printf("library %s; %s\n", fa_version_string(), fa_build_info());
    reference_self_tests();
    group_shapes();
    group_masks();
    group_layouts();
    group_large();
    group_empty();
    group_dropout();
    group_dropout_mask();
    group_random();
    group_rounding();
    for (int t = 0; t < 3; t++) {
        const tu_errstats *s = &g_stats[k_dtypes[t]];
        if (k_dtypes[t] == FA_DTYPE_F32)
            printf("max error %s vs fp64 over %ld cases: out rel %.3g (abs %.3g), lse rel %.3g "
                   "(abs %.3g)\n",
                   tu_dtype_name(k_dtypes[t]), s->cases, s->max_rel, s->max_abs, s->max_lse_rel,
                   s->max_lse_abs);
        else
            printf("max error %s vs fp64 over %ld cases: out rel %.3g (abs %.3g, at most %.2fx "
                   "the naive %s implementation's), lse rel %.3g (abs %.3g)\n",
                   tu_dtype_name(k_dtypes[t]), s->cases, s->max_rel, s->max_abs, s->max_ratio,
                   tu_dtype_name(k_dtypes[t]), s->max_lse_rel, s->max_lse_abs);
    }
    return TEST_REPORT();
}
