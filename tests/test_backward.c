/* SPDX-License-Identifier: MIT */
/*
 * test_backward.c — fa_backward and fa_varlen_backward against the fp64 reference
 * (reference/attention_ref_backward.c) over the forward's feature grid, for fp32, fp16 and bf16:
 * head dims 1..256, Sq != Sk both ways, Sq = 1, Sk = 0/1, GQA 1/2/8, causal, windows (with
 * causal + left window), ALiBi (H) and (B, H), softcap, custom and negative scales, BHSD /
 * strided / inner-stride views for the inputs and for the gradient outputs, multi-block
 * problems, fully masked rows, varlen with empty sequences and rows outside every sequence, a
 * few dropout cases (test_dropout.c has the rest), and random combinations.
 *
 * Each case (backward_check.h) runs the library's forward to get out and lse as a user would,
 * then the backward into NaN-poisoned gradients, and compares dq, dk, dv with the reference
 * computed from the same dtype-rounded inputs; tolerances are documented there (DESIGN.md §9).
 *
 * Then two independent checks of the maths itself: the reference's gradients against central
 * finite differences of the other reference forward (attention_ref.c) in fp64, and the
 * library's fp32 gradients against central finite differences of the library's own forward.
 *
 * Prints the max relative error of dq, dk, dv per dtype, then "N passed, N failed".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward_check.h"
#include "flashattn.h"
#include "reference/attention_ref.h"
#include "reference/attention_ref_backward.h"
#include "test.h"
#include "testutil.h"

static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* Runs c for every dtype; returns the number of failed cases. */
static long run_all_dtypes(bcfg c, long *n) {
    long failed = 0;
    for (int t = 0; t < 3; t++) {
        c.dtype = k_dtypes[t];
        failed += !bc_run(&c, NULL);
        (*n)++;
    }
    return failed;
}

static void group_line(const char *group, long cases, long failed) {
    printf("%-34s %4ld cases, %ld failed\n", group, cases, failed);
    fflush(stdout);
}

static ref_problem make_problem(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk,
                                int64_t D) {
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.B = B;
    p.Sq = Sq;
    p.Sk = Sk;
    p.H = H;
    p.Hk = Hk;
    p.D = D;
    p.scale = 1.0 / sqrt((double)D);
    p.window_left = p.window_right = -1;
    return p;
}

static void fill(double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = tu_normal();
}

/* ---------------------------------------------------------------------------------------------
 * The reference itself
 * ------------------------------------------------------------------------------------------- */

/* L = Σ out∘W with out from ref_attention_forward (attention_ref.c, written independently). */
static double ref_loss(const ref_problem *p, const double *q, const double *k, const double *v,
                       const double *W) {
    const int64_t n = p->B * p->Sq * p->H * p->D;
    double *out = bc_dalloc(n), L = 0.0;
    ref_attention_forward(p, q, k, v, out, NULL);
    for (int64_t i = 0; i < n; i++)
        L += out[i] * W[i];
    free(out);
    return L;
}

/* Every entry of the reference's dq, dk, dv against a central difference of ref_loss. */
static void reference_fd_case(const char *what, ref_problem p) {
    CASE_BEGIN("reference gradients == finite differences of attention_ref.c: %s", what);
    const int64_t nq = p.B * p.Sq * p.H * p.D, nk = p.B * p.Sk * p.Hk * p.D;
    double *q = bc_dalloc(nq), *k = bc_dalloc(nk), *v = bc_dalloc(nk), *W = bc_dalloc(nq);
    double *dq = bc_dalloc(nq), *dk = bc_dalloc(nk), *dv = bc_dalloc(nk);
    double *bq = bc_dalloc(nq), *bk = bc_dalloc(nk), *bv = bc_dalloc(nk);
    fill(q, nq);
    fill(k, nk);
    fill(v, nk);
    fill(W, nq);
    ref_attention_backward(&p, q, k, v, W, NULL, NULL, dq, dk, dv);
    ref_attention_backward_bound(&p, q, k, v, W, bq, bk, bv);
    const double h = 1e-5;
    double worst = 0.0, maxg = 0.0;
    double *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv}, *bs[3] = {bq, bk, bv};
    const int64_t ns[3] = {nq, nk, nk};
    int64_t bound_bad = 0;
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < ns[t]; i++) {
            const double x0 = xs[t][i];
            xs[t][i] = x0 + h;
            const double Lp = ref_loss(&p, q, k, v, W);
            xs[t][i] = x0 - h;
            const double Lm = ref_loss(&p, q, k, v, W);
            xs[t][i] = x0;
            const double fd = (Lp - Lm) / (2.0 * h);
            const double e = fabs(fd - gs[t][i]);
            if (e > worst)
                worst = e;
            if (fabs(gs[t][i]) > maxg)
                maxg = fabs(gs[t][i]);
            bound_bad += !(fabs(gs[t][i]) <= bs[t][i] * (1 + 1e-12)); /* the bound bounds */
        }
    CHECK_MSG(worst <= 1e-7 * (maxg > 1 ? maxg : 1), "max |fd - grad| = %.3g (max|grad| %.3g)",
              worst, maxg);
    CHECK_MSG(bound_bad == 0, "%lld gradient entries exceed ref_attention_backward_bound",
              (long long)bound_bad);
    CHECK(maxg > 0.0);
    free(q);
    free(k);
    free(v);
    free(W);
    free(dq);
    free(dk);
    free(dv);
    free(bq);
    free(bk);
    free(bv);
    CASE_END();
}

static void reference_self_tests(void) {
    long before = test_state_g_.cases_passed + test_state_g_.cases_failed;
    long fb = test_state_g_.cases_failed;

    /* By hand: Sq = 1, Sk = 2, D = 1, scale c = 0.5, q = 1, k = (0, 2 ln 3) so s = (0, ln 3)
     * and P = (1/4, 3/4); v = (1, 5) so O = 4; dO = 2.
     *   dv = P dO = (0.5, 1.5);  dS = P·dO·(v − O) = (−1.5, 1.5);
     *   dq = c Σ dS_j k_j = 1.5 ln 3;  dk = c dS q = (−0.75, 0.75). */
    {
        CASE_BEGIN("reference backward by hand (Sq=1, Sk=2, D=1)");
        ref_problem p = make_problem(1, 1, 2, 1, 1, 1);
        p.scale = 0.5;
        double q[1] = {1.0}, k[2] = {0.0, 2.0 * log(3.0)}, v[2] = {1.0, 5.0}, dout[1] = {2.0};
        double out[1], lse[1], dq[1], dk[2], dv[2];
        ref_attention_backward(&p, q, k, v, dout, out, lse, dq, dk, dv);
        CHECK_NEAR(out[0], 4.0, 1e-14);
        CHECK_NEAR(lse[0], log(4.0), 1e-14);
        CHECK_NEAR(dv[0], 0.5, 1e-14);
        CHECK_NEAR(dv[1], 1.5, 1e-14);
        CHECK_NEAR(dq[0], 1.5 * log(3.0), 1e-14);
        CHECK_NEAR(dk[0], -0.75, 1e-14);
        CHECK_NEAR(dk[1], 0.75, 1e-14);
        /* dropout p = 0.5 dropping key 1: Pd = (0.5, 0), O = 0.5; dv = (1, 0);
         * dP = (dO v_j)·M/(1-p) = (4, 0); Δ = dO·O = 1; dS = P (dP − Δ) = (0.75, −0.75);
         * dq = c (0.75·0 − 0.75·2 ln 3) = −0.75 ln 3; dk = c dS q = (0.375, −0.375). */
        uint8_t keep[2] = {1, 0};
        p.dropout_mask = keep;
        p.dropout_p = 0.5;
        ref_attention_backward(&p, q, k, v, dout, out, lse, dq, dk, dv);
        CHECK_NEAR(out[0], 0.5, 1e-14);
        CHECK_NEAR(lse[0], log(4.0), 1e-14); /* lse ignores dropout */
        CHECK_NEAR(dv[0], 1.0, 1e-14);
        CHECK(dv[1] == 0.0);
        CHECK_NEAR(dq[0], -0.75 * log(3.0), 1e-14);
        CHECK_NEAR(dk[0], 0.375, 1e-14);
        CHECK_NEAR(dk[1], -0.375, 1e-14);
        CASE_END();
    }

    /* Finite differences in fp64 over every feature. */
    {
        ref_problem p = make_problem(2, 5, 7, 4, 2, 3);
        reference_fd_case("plain, GQA 2", p);
        p.causal = 1;
        reference_fd_case("causal (Sq < Sk)", p);
        p = make_problem(1, 7, 4, 2, 1, 3);
        p.causal = 1;
        reference_fd_case("causal (Sq > Sk: fully masked rows)", p);
        p = make_problem(2, 6, 6, 2, 2, 4);
        p.window_left = 2;
        p.window_right = 1;
        reference_fd_case("window (2, 1)", p);
        p.softcap = 1.5;
        p.scale = 0.9;
        reference_fd_case("softcap 1.5, window, scale 0.9", p);
        double slopes[2 * 4] = {0.3, -0.1, 0.5, 0.05, 0.2, 0.7, -0.2, 0.1};
        p = make_problem(2, 5, 8, 4, 1, 3);
        p.alibi = slopes;
        p.alibi_per_batch = 1;
        reference_fd_case("ALiBi (B, H), GQA 4", p);
        p.alibi_per_batch = 0;
        p.softcap = 2.0;
        p.causal = 1;
        reference_fd_case("ALiBi (H) + softcap + causal", p);
        uint8_t keep[2 * 4 * 5 * 8];
        for (size_t i = 0; i < sizeof keep; i++)
            keep[i] = tu_uniform() >= 0.3;
        p = make_problem(2, 5, 8, 4, 2, 3);
        p.dropout_mask = keep;
        p.dropout_p = 0.3;
        reference_fd_case("dropout 0.3 (mask fixed), GQA 2", p);
        p.softcap = 3.0;
        p.causal = 1;
        p.window_left = 1;
        reference_fd_case("dropout + softcap + causal + left window", p);
    }

    /* Its forward part agrees with attention_ref.c (with and without dropout); the rounded
     * variant without rounding is the same function; GQA equals replicated heads with dk, dv
     * summed over each group. */
    {
        CASE_BEGIN("reference backward: forward == attention_ref.c, rounded(NULL) == exact, "
                   "GQA == replicated heads");
        enum { B = 2, SQ = 6, SK = 9, H = 4, HK = 2, D = 5 };
        static double q[B * SQ * H * D], k[B * SK * HK * D], v[B * SK * HK * D];
        static double dout[B * SQ * H * D], k4[B * SK * H * D], v4[B * SK * H * D];
        static double o1[B * SQ * H * D], o2[B * SQ * H * D], l1[B * H * SQ], l2[B * H * SQ];
        static double dq1[B * SQ * H * D], dk1[B * SK * HK * D], dv1[B * SK * HK * D];
        static double dq2[B * SQ * H * D], dk2[B * SK * HK * D], dv2[B * SK * HK * D];
        static double dk4[B * SK * H * D], dv4[B * SK * H * D];
        static uint8_t keep[B * H * SQ * SK];
        fill(q, B * SQ * H * D);
        fill(k, B * SK * HK * D);
        fill(v, B * SK * HK * D);
        fill(dout, B * SQ * H * D);
        for (int i = 0; i < B * H * SQ * SK; i++)
            keep[i] = tu_uniform() >= 0.25;
        double slopes[H] = {0.25, 0.5, -0.125, 0.0625};
        ref_problem p = make_problem(B, SQ, SK, H, HK, D);
        p.causal = 1;
        p.window_left = 3;
        p.softcap = 2.5;
        p.alibi = slopes;
        for (int drop = 0; drop < 2; drop++) {
            p.dropout_mask = drop ? keep : NULL;
            p.dropout_p = drop ? 0.25 : 0.0;
            ref_attention_forward(&p, q, k, v, o1, l1);
            ref_attention_backward(&p, q, k, v, dout, o2, l2, dq1, dk1, dv1);
            double e = 0.0;
            for (int i = 0; i < B * SQ * H * D; i++)
                e = fmax(e, fabs(o1[i] - o2[i]));
            for (int i = 0; i < B * H * SQ; i++)
                e = fmax(e, l1[i] == l2[i] ? 0.0 : fabs(l1[i] - l2[i]));
            CHECK_MSG(e <= 1e-13, "forward parts differ by %.3g (dropout %d)", e, drop);
            ref_attention_backward_rounded(&p, q, k, v, dout, o1, l1, dq2, dk2, dv2, NULL);
            CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(dq1, dq2, sizeof dq1) == 0 &&
                  memcmp(dk1, dk2, sizeof dk1) == 0 && memcmp(dv1, dv2, sizeof dv1) == 0);
        }
        for (int b = 0; b < B; b++)
            for (int j = 0; j < SK; j++)
                for (int h = 0; h < H; h++)
                    for (int d = 0; d < D; d++) {
                        k4[((b * SK + j) * H + h) * D + d] = k[((b * SK + j) * HK + h / 2) * D + d];
                        v4[((b * SK + j) * H + h) * D + d] = v[((b * SK + j) * HK + h / 2) * D + d];
                    }
        ref_problem p4 = p;
        p4.Hk = H;
        ref_attention_backward(&p4, q, k4, v4, dout, NULL, NULL, dq2, dk4, dv4);
        double e = 0.0;
        for (int i = 0; i < B * SQ * H * D; i++)
            e = fmax(e, fabs(dq1[i] - dq2[i]));
        for (int b = 0; b < B; b++)
            for (int j = 0; j < SK; j++)
                for (int hk = 0; hk < HK; hk++)
                    for (int d = 0; d < D; d++) {
                        const int at = ((b * SK + j) * HK + hk) * D + d;
                        const int a0 = ((b * SK + j) * H + 2 * hk) * D + d, a1 = a0 + D;
                        e = fmax(e, fabs(dk1[at] - (dk4[a0] + dk4[a1])));
                        e = fmax(e, fabs(dv1[at] - (dv4[a0] + dv4[a1])));
                    }
        CHECK_MSG(e <= 1e-13, "GQA vs replicated heads differ by %.3g", e);
        /* a rounded run in fp16 is close to, but not the same as, the exact one */
        ref_attention_backward_rounded(&p, q, k, v, dout, NULL, NULL, dq2, dk2, dv2, tu_round_f16);
        double en = 0.0, m = 0.0;
        for (int i = 0; i < B * SQ * H * D; i++) {
            en = fmax(en, fabs(dq1[i] - dq2[i]));
            m = fmax(m, fabs(dq1[i]));
        }
        CHECK_MSG(en > 0.0 && en < 0.05 * m, "fp16-rounded dq differs by %.3g (max %.3g)", en, m);
        CASE_END();
    }
    long after = test_state_g_.cases_passed + test_state_g_.cases_failed;
    group_line("reference self-tests", after - before, test_state_g_.cases_failed - fb);
}

/* ---------------------------------------------------------------------------------------------
 * The library against the reference
 * ------------------------------------------------------------------------------------------- */

static void group_shapes(void) {
    /* Every head dim, odd lengths, Sq != Sk both ways, Sq = 1, Sk = 1, GQA 1/2/8. */
    static const int64_t dims[] = {1, 7, 32, 64, 80, 128, 256};
    static const int64_t lens[][2] = {{1, 1}, {1, 37},  {37, 1},  {5, 2},
                                      {2, 5}, {33, 33}, {17, 65}, {65, 17}};
    static const int64_t heads[][2] = {{1, 1}, {4, 2}, {8, 1}, {3, 3}};
    long n = 0, failed = 0;
    int r = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++, r++) {
            const int64_t *hh = heads[r % 4];
            bcfg c = bc_cfg(1 + r % 2, lens[li][0], lens[li][1], hh[0], hh[1], dims[di]);
            if (dims[di] >= 128) { /* keep the big head dims small */
                c.B = 1;
                if (c.H > 4) {
                    c.H = 4;
                    c.Hk = 1;
                }
            }
            c.causal = (r % 3 == 2);
            failed += run_all_dtypes(c, &n);
        }
    group_line("shapes (D x lengths x GQA)", n, failed);
}

static void group_masks(void) {
    static const int64_t lens[][2] = {{37, 53}, {53, 37}, {48, 48}, {1, 40}, {40, 1}};
    static const int64_t dims[] = {16, 64, 80, 24, 40};
    long n = 0, failed = 0;
    for (int variant = 0; variant < 17; variant++) {
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t H = (variant % 2) ? 4 : 2, Hk = (variant % 3 == 0) ? 1 : 2;
            bcfg c = bc_cfg(2, lens[li][0], lens[li][1], H, Hk, dims[(variant + li) % 5]);
            switch (variant) {
            case 0:
                c.causal = 1;
                break;
            case 1: /* left only */
                c.wl = 5;
                break;
            case 2: /* right only */
                c.wr = 3;
                break;
            case 3: /* both */
                c.wl = 4;
                c.wr = 2;
                break;
            case 4: /* causal + left window */
                c.causal = 1;
                c.wl = 7;
                break;
            case 5: /* diagonal only: dS = 0 */
                c.wl = 0;
                c.wr = 0;
                break;
            case 6:
                c.alibi = 1;
                break;
            case 7:
                c.alibi = 2;
                break;
            case 8:
                c.alibi = 1;
                c.causal = 1;
                break;
            case 9:
                c.softcap = 5.0f;
                break;
            case 10:
                c.softcap = 3.0f;
                c.alibi = 2;
                c.causal = 1;
                break;
            case 11:
                c.scale = 0.3f;
                break;
            case 12: /* any finite scale is used as is */
                c.scale = -0.25f;
                c.causal = 1;
                break;
            case 13:
                c.softcap = 2.0f;
                c.wl = 6;
                c.wr = 1;
                break;
            case 14: /* peaked softmax */
                c.scale = 4.0f / (float)sqrt((double)c.D);
                break;
            case 15: /* causal overrides window_right */
                c.causal = 1;
                c.wr = 5;
                break;
            case 16:
                c.alibi = 2;
                c.wl = 9;
                c.wr = 0;
                c.scale = 0.5f;
                c.softcap = 1.0f;
                break;
            }
            failed += run_all_dtypes(c, &n);
        }
    }
    group_line("masks/bias/softcap/scale", n, failed);
}

static void group_layouts(void) {
    long n = 0, failed = 0;
    for (int variant = 0; variant < 10; variant++) {
        bcfg c = bc_cfg(2, 19, 23, 4, 2, 40);
        c.causal = variant % 2;
        switch (variant) {
        case 0: /* BHSD everything */
            c.lq = c.lk = c.lv = c.lo = c.ldo = c.llse = TU_PERMUTED;
            c.ldq = c.ldk = c.ldv = TU_PERMUTED;
            break;
        case 1: /* every other head, padded rows */
            c.lq = c.lk = c.lv = c.lo = c.ldo = c.llse = TU_STRIDED;
            c.ldq = c.ldk = c.ldv = TU_STRIDED;
            break;
        case 2: /* inner stride 2 */
            c.lq = c.lk = c.lv = c.lo = c.ldo = TU_INNER2;
            c.ldq = c.ldk = c.ldv = TU_INNER2;
            break;
        case 3: /* contiguous inputs, strided gradient outputs */
            c.ldq = TU_STRIDED;
            c.ldk = TU_INNER2;
            c.ldv = TU_PERMUTED;
            break;
        case 4: /* strided inputs, contiguous gradient outputs */
            c.lq = TU_PERMUTED;
            c.lk = TU_STRIDED;
            c.lv = TU_INNER2;
            c.lo = TU_STRIDED;
            c.ldo = TU_PERMUTED;
            c.llse = TU_STRIDED;
            break;
        case 5: /* k, v with batch stride 0 (dk, dv are still per batch) */
            c.kv_bcast = 1;
            c.lk = TU_STRIDED;
            c.ldk = TU_STRIDED;
            break;
        case 6:
            c.lq = TU_STRIDED;
            c.lo = TU_INNER2;
            c.lk = TU_PERMUTED;
            c.lv = TU_INNER2;
            c.ldo = TU_STRIDED;
            c.ldq = TU_INNER2;
            c.ldk = TU_PERMUTED;
            c.ldv = TU_STRIDED;
            c.alibi = 2;
            c.wl = 3;
            break;
        case 7: /* D = 1, strided */
            c.D = 1;
            c.lq = c.lk = c.lv = c.lo = c.ldo = c.ldq = c.ldk = c.ldv = TU_STRIDED;
            c.llse = TU_PERMUTED;
            break;
        case 8:
            c.Hk = 4;
            c.lq = c.lk = c.lv = c.lo = c.ldo = c.ldq = c.ldk = c.ldv = TU_PERMUTED;
            c.softcap = 4.0f;
            break;
        case 9: /* GQA 8 (H = 8, Hk = 1) with mixed views */
            c.H = 8;
            c.Hk = 1;
            c.lq = TU_PERMUTED;
            c.ldq = TU_STRIDED;
            c.ldk = TU_PERMUTED;
            c.ldv = TU_INNER2;
            break;
        }
        failed += run_all_dtypes(c, &n);
    }
    group_line("layouts (inputs and gradients)", n, failed);
}

static void group_large(void) {
    long n = 0, failed = 0;
    struct {
        int64_t Sq, Sk, H, Hk, D;
        int causal, wl, wr, alibi;
        float softcap;
    } big[] = {
        {257, 300, 2, 1, 64, 0, -1, -1, 0, 0.0f}, /* long rows: fp32 accumulation */
        {257, 300, 2, 1, 64, 1, -1, -1, 0, 0.0f},
        {300, 257, 4, 2, 32, 1, -1, -1, 0, 0.0f},
        {200, 200, 2, 2, 48, 1, 64, -1, 1, 0.0f}, /* sliding window: skipped blocks */
        {190, 210, 2, 1, 40, 0, 30, 20, 0, 0.0f},
        {130, 130, 8, 1, 64, 1, -1, -1, 0, 4.0f}, /* GQA 8 over several blocks */
        {70, 70, 2, 2, 256, 0, -1, -1, 0, 0.0f},
        {70, 70, 2, 1, 256, 1, -1, -1, 0, 0.0f},
        {1, 400, 8, 2, 64, 0, -1, -1, 0, 0.0f}, /* decode-like */
        {400, 3, 2, 1, 64, 1, -1, -1, 1, 0.0f}, /* most rows masked */
        /* 2048 query rows or more: tiles of 252 rows (bwd.c), the last one partial */
        {2050, 2050, 1, 1, 16, 1, -1, -1, 0, 0.0f},
        {2100, 260, 2, 1, 24, 0, 64, 16, 1, 0.0f},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        if (big[i].Sq >= 2048 && tu_emulated()) continue; /* bwd.c's row tiles: portable C */
        bcfg c = bc_cfg(1, big[i].Sq, big[i].Sk, big[i].H, big[i].Hk, big[i].D);
        c.causal = big[i].causal;
        c.wl = big[i].wl;
        c.wr = big[i].wr;
        c.alibi = big[i].alibi;
        c.softcap = big[i].softcap;
        failed += run_all_dtypes(c, &n);
    }
    group_line(tu_emulated() ? "large (multi-block; Sq >= 2048 left out, emulated)"
                             : "large (multi-block)",
               n, failed);
}

static void group_empty(void) {
    long n = 0, failed = 0;
    bcfg c = bc_cfg(2, 5, 0, 4, 2, 16); /* Sk = 0: dq = 0, dk/dv empty */
    failed += run_all_dtypes(c, &n);
    c.causal = 1;
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(2, 0, 7, 2, 1, 8); /* Sq = 0: dk = dv = 0 */
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(0, 5, 7, 2, 1, 8); /* B = 0 */
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(2, 0, 0, 2, 1, 8);
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(2, 9, 4, 2, 2, 5); /* causal Sq > Sk: rows 0..4 see nothing */
    c.causal = 1;
    c.alibi = 1;
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(1, 12, 4, 2, 1, 8); /* window missing every key for early rows */
    c.wl = 1;
    c.wr = 2;
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(1, 4, 12, 2, 1, 8); /* keys no query sees: dk = dv = 0 there */
    c.wl = 1;
    c.wr = 0;
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(2, 1, 1, 4, 2, 33); /* one key: dS = 0, so dq = dk = 0 (up to rounding) */
    failed += run_all_dtypes(c, &n);
    c = bc_cfg(1, 1, 200, 4, 4, 64); /* Sq = 1 over two key blocks */
    c.causal = 1;
    failed += run_all_dtypes(c, &n);
    group_line("empty / fully masked / Sq=1, Sk=0/1", n, failed);
}

/* bwd.c's two schedules, fused (one task per batch and KV head) and split (dK/dV and dQ passes),
 * must give bitwise the same gradients: 1 thread always runs fused, 8 threads run split (every
 * case has B·Hk < 16), 2 and 3 threads either. Multi-block cases with the band's edges off the
 * tile grid, K used in place (fp32) and converted (fp16, bf16, inner stride). */
static void group_schedules(void) {
    bcfg c = bc_cfg(2, 300, 400, 4, 2, 64);
    c.wl = 70;
    c.wr = 20;
    bc_determinism_case("fp32 window 70/20, 3 x 7 blocks", c);
    c = bc_cfg(2, 200, 520, 4, 1, 32);
    c.causal = 1;
    bc_determinism_case("fp32 causal Sq < Sk GQA 4", c);
    c = bc_cfg(1, 390, 390, 2, 2, 48);
    c.dtype = FA_DTYPE_BF16;
    c.causal = 1;
    c.wl = 100;
    c.alibi = 1;
    c.softcap = 4.0f;
    bc_determinism_case("bf16 causal window 100 ALiBi softcap", c);
    c = bc_cfg(2, 260, 200, 2, 2, 40);
    c.dtype = FA_DTYPE_F16;
    c.causal = 1;
    bc_determinism_case("fp16 causal Sq > Sk", c);
    c = bc_cfg(2, 150, 330, 2, 1, 24);
    c.lk = TU_INNER2;
    c.wr = 0;
    bc_determinism_case("fp32 K inner stride 2, window right 0", c);
    if (tu_emulated()) {
        printf("  determinism bf16 causal Sq = 2100 > Sk: left out under emulation (bwd.c's "
               "row tiles are portable C, tested natively)\n");
        return;
    }
    c = bc_cfg(1, 2100, 300, 2, 1, 32); /* tiles of 252 rows */
    c.dtype = FA_DTYPE_BF16;
    c.causal = 1;
    bc_determinism_case("bf16 causal Sq = 2100 > Sk", c);
}

static void group_dropout(void) {
    long n = 0, failed = 0;
    for (int variant = 0; variant < 4; variant++) {
        bcfg c = bc_cfg(2, 45, 70, 4, 2, 32);
        c.dropout_p = variant == 3 ? 0.8f : 0.17f;
        c.dropout_seed = tu_next_u64();
        c.dropout_offset = tu_next_u64();
        if (variant == 1) {
            c.causal = 1;
            c.softcap = 3.0f;
            c.Hk = 1;
        } else if (variant == 2) {
            c.alibi = 2;
            c.wl = 10;
            c.wr = 4;
            c.ldq = TU_PERMUTED;
            c.ldk = TU_STRIDED;
        }
        failed += run_all_dtypes(c, &n);
    }
    group_line("dropout (more in test_dropout)", n, failed);
}

static void group_varlen(void) {
    long n = 0, failed = 0;
    for (int variant = 0; variant < 10; variant++) {
        bcfg c = bc_cfg(0, 0, 0, 4, 2, 32);
        static const int32_t sq[][5] = {
            {9, 0, 40, 1, 70}, {33, 12, 0, 5, 17}, {1, 1, 1, 2, 64}, {80, 3, 0, 0, 30}};
        static const int32_t sk[][5] = {
            {12, 5, 40, 0, 90}, {20, 0, 7, 5, 65}, {1, 30, 2, 2, 64}, {60, 9, 4, 0, 30}};
        const int set = variant % 4;
        c.nseq = 5;
        memcpy(c.seq_q, sq[set], sizeof sq[set]);
        memcpy(c.seq_k, sk[set], sizeof sk[set]);
        c.lead_q = variant % 3;
        c.tail_q = (variant + 1) % 4;
        c.lead_k = (variant + 2) % 3;
        c.tail_k = variant % 2 ? 3 : 0;
        switch (variant) {
        case 0:
            break;
        case 1:
            c.causal = 1;
            break;
        case 2:
            c.causal = 1;
            c.wl = 6;
            c.H = 8;
            c.Hk = 1;
            break;
        case 3:
            c.alibi = 1;
            c.wl = 4;
            c.wr = 9;
            break;
        case 4:
            c.alibi = 2;
            c.causal = 1;
            c.softcap = 2.0f;
            break;
        case 5:
            c.softcap = 6.0f;
            c.scale = 0.2f;
            c.D = 80;
            c.extra_max = 5;
            break;
        case 6: /* views */
            c.lq = TU_PERMUTED;
            c.lk = TU_STRIDED;
            c.lv = TU_INNER2;
            c.lo = TU_STRIDED;
            c.ldo = TU_PERMUTED;
            c.llse = TU_STRIDED;
            c.ldq = TU_STRIDED;
            c.ldk = TU_PERMUTED;
            c.ldv = TU_INNER2;
            c.causal = 1;
            break;
        case 7:
            c.D = 7;
            c.H = 3;
            c.Hk = 3;
            c.wl = 0;
            c.wr = 0;
            break;
        case 8:
            c.D = 128;
            c.H = 2;
            c.Hk = 1;
            c.causal = 1;
            c.extra_max = 1;
            break;
        case 9:
            c.dropout_p = 0.3f;
            c.dropout_seed = tu_next_u64();
            c.dropout_offset = tu_next_u64();
            c.causal = 1;
            c.ldq = c.ldk = c.ldv = TU_STRIDED;
            break;
        }
        failed += run_all_dtypes(c, &n);
    }
    { /* one sequence of 2048 rows gives every sequence tiles of 252 rows (bwd.c) */
        bcfg c = bc_cfg(0, 0, 0, 2, 1, 16);
        static const int32_t sq[3] = {2048, 7, 300}, sk[3] = {90, 33, 300};
        c.nseq = 3;
        memcpy(c.seq_q, sq, sizeof sq);
        memcpy(c.seq_k, sk, sizeof sk);
        c.causal = 1;
        c.lead_q = 1;
        c.tail_k = 2;
        failed += run_all_dtypes(c, &n);
    }
    /* only empty sequences, and no sequence at all: every gradient row is outside */
    bcfg c = bc_cfg(0, 0, 0, 2, 1, 16);
    c.nseq = 3;
    c.lead_q = 2;
    c.tail_q = 3;
    c.lead_k = 1;
    c.tail_k = 4;
    failed += run_all_dtypes(c, &n);
    c.nseq = 1;
    c.seq_q[0] = 0;
    c.seq_k[0] = 6;
    failed += run_all_dtypes(c, &n);
    group_line("varlen", n, failed);
}

static void group_random(void) {
    long n = 0, failed = 0;
    static const int64_t dims[] = {1, 7, 32, 64, 80, 128, 256, 3, 17, 96};
    for (int i = 0; i < 60; i++) {
        int64_t D = dims[tu_randint(0, 9)];
        int64_t Hk = tu_randint(1, 2), g = (int64_t[]){1, 2, 8}[tu_randint(0, 2)];
        int64_t maxlen = D >= 128 ? 40 : 90;
        bcfg c =
            bc_cfg(tu_randint(1, 2), tu_randint(1, maxlen), tu_randint(0, maxlen), Hk * g, Hk, D);
        c.causal = (int)tu_randint(0, 1);
        c.wl = (int)tu_randint(-1, 20);
        c.wr = (int)tu_randint(-1, 20);
        if (tu_randint(0, 2) == 0)
            c.wl = c.wr = -1;
        c.alibi = (int)tu_randint(0, 2);
        c.softcap = tu_randint(0, 2) == 0 ? (float)(1.0 + 10.0 * tu_uniform()) : 0.0f;
        c.scale = tu_randint(0, 2) == 0 ? (float)(0.05 + 0.5 * tu_uniform()) : 0.0f;
        if (tu_randint(0, 3) == 0) {
            c.dropout_p = (float)(0.6 * tu_uniform());
            c.dropout_seed = tu_next_u64();
            c.dropout_offset = tu_next_u64();
        }
        c.lq = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lk = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lv = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.lo = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.ldo = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.llse = (int)tu_randint(0, 2);
        c.ldq = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.ldk = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.ldv = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.dtype = k_dtypes[i % 3];
        failed += !bc_run(&c, NULL);
        n++;
    }
    group_line("random combinations", n, failed);
}

/* ---------------------------------------------------------------------------------------------
 * The backward's P sums to 1 over each row's keys: its scores are the forward's
 * ------------------------------------------------------------------------------------------- */

typedef struct psum_cfg {
    const char *name;
    int64_t Sq, Sk, H, Hk;
} psum_cfg;

/* The backward recomputes P = 2^(S - lse) from the lse the forward saved, so each row of P sums
 * to 1 only if the backward sums each score S in the same order as the forward did: decode's
 * row products (a step of few rows, or a short last query block) add a dot product in another
 * order than the prefill's packed ones. With dO row i = the unit vector e_(i mod D), column c of
 * dV = Pᵀ dO sums, over keys, P's rows i = c (mod D): Σ_j dV[j, c] = the number of those rows.
 * q and k are built so that every score cancels from large partial sums (q = [a, a], k = [b,
 * e - b], entries of a and b about 8: partial sums of several hundred, S = a·e / 16 of a few
 * units): a score summed in another order then differs by about 1e-5, so P's rows would sum to
 * 1 +- 1e-5, where the rest of the arithmetic (exp2, the fp32 roundings of an lse of a few tens
 * at most, dV's sums over Sk keys) keeps them within (Sk + 64) u (measured: at most 1.9e-6 over
 * 12 runs of each kernel set, where summing in the prefill's order left 1.2e-5 to 2.1e-5).
 * fp32, D = 256, scale 1/16, no mask. */
static void psum_case(const psum_cfg *f) {
    CASE_BEGIN("backward P rows sum to 1 (scores as the forward's): %s", f->name);
    enum { D = 256 };
    const int64_t B = 1, H = f->H, Hk = f->Hk, Sq = f->Sq, Sk = f->Sk;
    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
    const int64_t nq = Sq * H * D, nk = Sk * Hk * D;
    float *all = calloc((size_t)(4 * nq + 4 * nk + H * Sq), sizeof(float)); /* one block */
    if (!all)
        abort();
    float *q = all, *out = q + nq, *dout = out + nq, *dq = dout + nq; /* [Sq, H, D] each */
    float *k = dq + nq, *v = k + nk, *dk = v + nk, *dv = dk + nk;     /* [Sk, Hk, D] each */
    float *lse = dv + nk;                                             /* [H, Sq] */
    for (int64_t r = 0; r < Sq * H; r++)
        for (int64_t d = 0; d < D / 2; d++)
            q[r * D + d] = q[r * D + D / 2 + d] = (float)(8.0 * tu_normal());
    for (int64_t r = 0; r < Sk * Hk; r++)
        for (int64_t d = 0; d < D / 2; d++) {
            const float b = (float)(8.0 * tu_normal());
            k[r * D + d] = b;
            k[r * D + D / 2 + d] = (float)tu_normal() - b;
        }
    for (int64_t i = 0; i < nk; i++)
        v[i] = (float)tu_normal();
    for (int64_t i = 0; i < Sq; i++) /* row i of every head: e_(i mod D) */
        for (int64_t h = 0; h < H; h++)
            dout[(i * H + h) * D + i % D] = 1.0f;
    fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, qs);
    fa_tensor tk = fa_tensor_contiguous(k, FA_DTYPE_F32, 4, ks);
    fa_tensor tv = fa_tensor_contiguous(v, FA_DTYPE_F32, 4, ks);
    fa_tensor to = fa_tensor_contiguous(out, FA_DTYPE_F32, 4, qs);
    fa_tensor tdo = fa_tensor_contiguous(dout, FA_DTYPE_F32, 4, qs);
    fa_tensor tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, ls);
    fa_tensor tdq = fa_tensor_contiguous(dq, FA_DTYPE_F32, 4, qs);
    fa_tensor tdk = fa_tensor_contiguous(dk, FA_DTYPE_F32, 4, ks);
    fa_tensor tdv = fa_tensor_contiguous(dv, FA_DTYPE_F32, 4, ks);
    fa_params params;
    fa_params_init(&params);
    params.softmax_scale = 1.0f / 16.0f;
    fa_status st = fa_forward(NULL, &params, &tq, &tk, &tv, &to, &tl);
    REQUIRE(st == FA_OK);
    for (int64_t i = 0; i < nq; i++) /* poison: NaN */
        dq[i] = NAN;
    for (int64_t i = 0; i < nk; i++)
        dk[i] = dv[i] = NAN;
    st = fa_backward(NULL, &params, &tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv);
    CHECK_MSG(st == FA_OK, "fa_backward: %s", fa_last_error_message());
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < nq; i++)
        nonfinite += !isfinite(dq[i]);
    for (int64_t i = 0; i < nk; i++)
        nonfinite += !isfinite(dk[i]) + !isfinite(dv[i]);
    CHECK_MSG(nonfinite == 0, "%lld gradient elements not finite (poison left?)",
              (long long)nonfinite);
    const double tol = (double)(Sk + 64) * 0x1.0p-24;
    double worst = 0.0;
    int64_t worst_at = 0;
    for (int64_t hk = 0; hk < Hk && st == FA_OK; hk++)
        for (int64_t c = 0; c < D; c++) {
            double sum = 0.0; /* rows i = c (mod D) of the hk's H / Hk query heads */
            for (int64_t j = 0; j < Sk; j++)
                sum += dv[(j * Hk + hk) * D + c];
            const int64_t rows = (H / Hk) * (c < Sq % D ? Sq / D + 1 : Sq / D);
            const double e = fabs(sum - (double)rows) / (rows > 0 ? (double)rows : 1.0);
            if (!(e <= worst)) {
                worst = e;
                worst_at = hk * D + c;
            }
        }
    CHECK_MSG(worst <= tol,
              "a row of P sums to 1 +- %.3g (> (Sk + 64) u = %.3g) at KV head %lld, column %lld",
              worst, tol, (long long)(worst_at / D), (long long)(worst_at % D));
    printf("  P rows %-30s max |sum - 1| = %.2e (limit %.2e)\n", f->name, worst, tol);
    free(all);
    CASE_END();
}

static void group_score_order(void) {
    long before = test_state_g_.cases_passed + test_state_g_.cases_failed;
    long fb = test_state_g_.cases_failed;
    /* decode's products in the forward for the whole query (few rows), for only its last block
     * (257 = 252 + 5 positions), for 48 rows of 4 query heads per KV head (AVX-512: decode's;
     * AVX2: the prefill's beyond 32), and the prefill's alone */
    static const psum_cfg cases[] = {
        {"Sq=8 (decode's products)", 8, 48, 1, 1},
        {"Sq=257 (the last 5 rows decode's)", 257, 40, 1, 1},
        {"Sq=12, GQA 4 (48 rows)", 12, 48, 4, 1},
        {"Sq=100 (the prefill's)", 100, 48, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        psum_case(&cases[i]);
    long n = test_state_g_.cases_passed + test_state_g_.cases_failed - before;
    long failed = test_state_g_.cases_failed - fb;
    /* fp16 and bf16 rows the forward takes through decode's products: 3 rows (bf16 on the bf16
     * dot product: widened, as rows that do not tile by 4), 4 rows (bf16: on the dot product) */
    for (int64_t sq = 3; sq <= 4; sq++) {
        bcfg c = bc_cfg(1, sq, 37, 2, 2, 64);
        failed += run_all_dtypes(c, &n);
    }
    group_line("P sums to 1 (scores as forward)", n, failed);
}

/* ---------------------------------------------------------------------------------------------
 * The library's fp32 gradients against finite differences of its own forward
 * ------------------------------------------------------------------------------------------- */

typedef struct fdcfg {
    const char *name;
    int64_t Sq, Sk, H, Hk;
    int causal;
    float softcap;
    int alibi;
    float dropout_p;
} fdcfg;

/* L = Σ out∘W in fp64 from the library's fp32 forward. */
static double lib_loss(const fa_params *pp, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                       fa_tensor *out, const double *W, int64_t n) {
    fa_status st = fa_forward(NULL, pp, q, k, v, out, NULL);
    if (st != FA_OK)
        return NAN;
    double L = 0.0;
    const float *o = out->data;
    for (int64_t i = 0; i < n; i++)
        L += (double)o[i] * W[i];
    return L;
}

static void fd_case(const fdcfg *f) {
    CASE_BEGIN("library fp32 gradients == finite differences of fa_forward: %s", f->name);
    const int64_t B = 1, D = 4, H = f->H, Hk = f->Hk;
    int64_t qs[4] = {B, f->Sq, H, D}, ks[4] = {B, f->Sk, Hk, D}, ls[3] = {B, H, f->Sq};
    const int64_t nq = B * f->Sq * H * D, nk = B * f->Sk * Hk * D;
    float *q = malloc(sizeof(float) * (size_t)nq), *k = malloc(sizeof(float) * (size_t)nk);
    float *v = malloc(sizeof(float) * (size_t)nk), *out = malloc(sizeof(float) * (size_t)nq);
    float *W = malloc(sizeof(float) * (size_t)nq),
          *lse = malloc(sizeof(float) * (size_t)(B * H * f->Sq));
    float *dq = malloc(sizeof(float) * (size_t)nq), *dk = malloc(sizeof(float) * (size_t)nk);
    float *dv = malloc(sizeof(float) * (size_t)nk);
    double *Wd = bc_dalloc(nq);
    if (!q || !k || !v || !out || !W || !lse || !dq || !dk || !dv)
        abort();
    for (int64_t i = 0; i < nq; i++) {
        q[i] = (float)tu_normal();
        W[i] = (float)tu_normal();
        Wd[i] = W[i];
    }
    for (int64_t i = 0; i < nk; i++) {
        k[i] = (float)tu_normal();
        v[i] = (float)tu_normal();
    }
    fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, qs);
    fa_tensor tk = fa_tensor_contiguous(k, FA_DTYPE_F32, 4, ks);
    fa_tensor tv = fa_tensor_contiguous(v, FA_DTYPE_F32, 4, ks);
    fa_tensor to = fa_tensor_contiguous(out, FA_DTYPE_F32, 4, qs);
    fa_tensor tW = fa_tensor_contiguous(W, FA_DTYPE_F32, 4, qs);
    fa_tensor tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, ls);
    fa_tensor tdq = fa_tensor_contiguous(dq, FA_DTYPE_F32, 4, qs);
    fa_tensor tdk = fa_tensor_contiguous(dk, FA_DTYPE_F32, 4, ks);
    fa_tensor tdv = fa_tensor_contiguous(dv, FA_DTYPE_F32, 4, ks);
    float slopes[8] = {0.3f, 0.7f, -0.2f, 0.45f, 0.1f, 0.2f, 0.3f, 0.4f};
    fa_params params;
    fa_params_init(&params);
    params.causal = f->causal;
    params.softcap = f->softcap;
    if (f->alibi) {
        int64_t nh = H;
        params.alibi_slopes = fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, &nh);
    }
    params.dropout_p = f->dropout_p;
    params.dropout_seed = 0x1234567890ABCDEFull;
    params.dropout_offset = 99;

    fa_status st = fa_forward(NULL, &params, &tq, &tk, &tv, &to, &tl);
    REQUIRE(st == FA_OK);
    st = fa_backward(NULL, &params, &tq, &tk, &tv, &to, &tW, &tl, &tdq, &tdk, &tdv);
    CHECK_MSG(st == FA_OK, "fa_backward: %s", fa_last_error_message());

    const double h = 1e-2;
    float *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
    const int64_t ns[3] = {nq, nk, nk};
    double worst_rel = 0.0;
    for (int t = 0; t < 3 && st == FA_OK; t++) {
        double maxg = 0.0, err = 0.0;
        int64_t worst = 0;
        double worst_fd = 0.0;
        for (int64_t i = 0; i < ns[t]; i++)
            maxg = fmax(maxg, fabs((double)gs[t][i]));
        for (int64_t i = 0; i < ns[t]; i++) {
            const float x0 = xs[t][i];
            const float xp = (float)(x0 + h), xm = (float)(x0 - h);
            xs[t][i] = xp;
            const double Lp = lib_loss(&params, &tq, &tk, &tv, &to, Wd, nq);
            xs[t][i] = xm;
            const double Lm = lib_loss(&params, &tq, &tk, &tv, &to, Wd, nq);
            xs[t][i] = x0;
            const double fd = (Lp - Lm) / ((double)xp - (double)xm);
            const double e = fabs(fd - (double)gs[t][i]);
            if (!(e <= err)) {
                err = e;
                worst = i;
                worst_fd = fd;
            }
        }
        /* central differences with h = 1e-2: truncation h²/6·L''' ~ 1e-5 for these O(1)
         * inputs, fp32 rounding of out ~ 1e-7·|L| / h ~ 1e-5; 3e-3 leaves a wide margin and
         * still catches any wrong term (which would be O(max|grad|)). */
        CHECK_MSG(err <= 3e-3 * maxg,
                  "%s: max |fd - grad| %.3g > 3e-3 * max|grad| %.3g at %lld "
                  "(fd %.7g, grad %.7g)",
                  bc_grad_names[t], err, maxg, (long long)worst, worst_fd, (double)gs[t][worst]);
        CHECK_MSG(maxg > 0.0, "%s is all zero", bc_grad_names[t]);
        if (maxg > 0 && err / maxg > worst_rel)
            worst_rel = err / maxg;
    }
    printf("  fd %-38s max |fd - grad| / max|grad| = %.2e\n", f->name, worst_rel);
    free(q);
    free(k);
    free(v);
    free(out);
    free(W);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    free(Wd);
    CASE_END();
}

static void group_finite_differences(void) {
    long before = test_state_g_.cases_passed + test_state_g_.cases_failed;
    long fb = test_state_g_.cases_failed;
    static const fdcfg cases[] = {
        {"plain (S=7)", 7, 7, 2, 2, 0, 0.0f, 0, 0.0f},
        {"causal (Sq=6, Sk=9)", 6, 9, 2, 2, 1, 0.0f, 0, 0.0f},
        {"causal (Sq=9, Sk=5: masked rows)", 9, 5, 2, 2, 1, 0.0f, 0, 0.0f},
        {"softcap 1.5 (S=8)", 8, 8, 2, 2, 0, 1.5f, 0, 0.0f},
        {"ALiBi (H) (Sq=5, Sk=8)", 5, 8, 2, 2, 0, 0.0f, 1, 0.0f},
        {"GQA 2 + causal + ALiBi (S=6)", 6, 6, 2, 1, 1, 0.0f, 1, 0.0f},
        {"dropout 0.25 + softcap (S=9)", 9, 9, 2, 1, 0, 2.0f, 0, 0.25f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fd_case(&cases[i]);
    long after = test_state_g_.cases_passed + test_state_g_.cases_failed;
    group_line("finite differences (fp32 library)", after - before,
               test_state_g_.cases_failed - fb);
}

int main(void) {
    tu_seed_init("test_backward");
    printf("library %s; %s\n", fa_version_string(), fa_build_info());
    reference_self_tests();
    group_shapes();
    group_masks();
    group_layouts();
    group_large();
    group_empty();
    group_dropout();
    group_schedules();
    group_varlen();
    group_random();
    group_score_order();
    group_finite_differences();
    bc_print_table("test_backward");
    return TEST_REPORT();
}
