/* SPDX-License-Identifier: MIT */
/*
 * test_varlen.c — fa_varlen_forward against the fp64 reference, one sequence at a time.
 *
 * Sequences of different lengths (empty queries, empty keys, both) are packed along the first
 * dimension; cu_seqlens may start after row 0 and end before the last row, and the rows outside
 * every sequence must come back as out = 0, lse = -inf. Each sequence is compared with
 * ref_attention_forward for B = 1 and its own lengths (causal/window/ALiBi aligned per
 * sequence; (B, H) ALiBi slopes indexed by sequence). Same tolerances as test_forward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

#define MAXB 16

typedef struct vcfg {
    int nseq;
    int32_t lq[MAXB], lk[MAXB];
    int32_t q_start, k_start; /* cu_seqlens[0] */
    int32_t q_tail, k_tail;   /* rows after cu_seqlens[B] */
    int64_t H, Hk, D;
    int causal, wl, wr;
    float softcap, scale;
    int alibi; /* 0, 1 = (H), 2 = (B, H) */
    int dtype;
    int layout; /* for q, k, v and out */
    int llse;
    int no_lse;
    int64_t extra_max; /* added to max_seqlen_q/k (bounds need not be tight) */
    int cu_strided;    /* cu_seqlens as every other int32 of a bigger array */
    float dropout_p;   /* > 0: dropout; sequence b's mask is mask[b, :, :Sq_b, :Sk_b] */
} vcfg;

static tu_errstats g_stats[8]; /* per dtype (indexed by fa_dtype; room to spare) */
static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

static int run_varlen_case(const vcfg *c) {
    char name[512];
    int pos = snprintf(name, sizeof name, "varlen %s lens q/k=", tu_dtype_name(c->dtype));
    for (int b = 0; b < c->nseq && pos < 300; b++)
        pos += snprintf(name + pos, sizeof name - (size_t)pos, "%s%d/%d", b ? "," : "",
                        (int)c->lq[b], (int)c->lk[b]);
    snprintf(name + pos, sizeof name - (size_t)pos,
             " start=%d/%d tail=%d/%d H=%lld Hk=%lld D=%lld causal=%d window=(%d,%d) "
             "softcap=%g scale=%g alibi=%d layout=%s lse=%s%s max+%lld dropout=%g",
             (int)c->q_start, (int)c->k_start, (int)c->q_tail, (int)c->k_tail, (long long)c->H,
             (long long)c->Hk, (long long)c->D, c->causal, c->wl, c->wr, (double)c->softcap,
             (double)c->scale, c->alibi, tu_layout_name(c->layout),
             c->no_lse ? "none" : tu_layout_name(c->llse), c->cu_strided ? " cu-strided" : "",
             (long long)c->extra_max, (double)c->dropout_p);
    CASE_BEGIN("%s", name);

    const int B = c->nseq;
    int32_t cuq[MAXB + 1], cuk[MAXB + 1];
    int64_t maxq = 0, maxk = 0;
    cuq[0] = c->q_start;
    cuk[0] = c->k_start;
    for (int b = 0; b < B; b++) {
        cuq[b + 1] = cuq[b] + c->lq[b];
        cuk[b + 1] = cuk[b] + c->lk[b];
        if (c->lq[b] > maxq)
            maxq = c->lq[b];
        if (c->lk[b] > maxk)
            maxk = c->lk[b];
    }
    const int64_t tq = cuq[B] + c->q_tail, tk = cuk[B] + c->k_tail;
    const int64_t H = c->H, Hk = c->Hk, D = c->D;

    int64_t qshape[3] = {tq, H, D}, kshape[3] = {tk, Hk, D}, lshape[2] = {H, tq};
    tu_tensor q, k, v, out, lse;
    tu_alloc(&q, c->dtype, 3, qshape, c->layout);
    tu_alloc(&k, c->dtype, 3, kshape, c->layout);
    tu_alloc(&v, c->dtype, 3, kshape, c->layout);
    tu_alloc(&out, c->dtype, 3, qshape, c->layout);
    tu_alloc(&lse, FA_DTYPE_F32, 2, lshape, c->llse);
    double *dq = dalloc(tq * H * D), *dk = dalloc(tk * Hk * D), *dv = dalloc(tk * Hk * D);
    double *dout = dalloc(tq * H * D), *dlse = dalloc(H * tq);
    tu_fill_normal(&q, 1.0, dq);
    tu_fill_normal(&k, 1.0, dk);
    tu_fill_normal(&v, 1.0, dv);

    int64_t one = B + 1;
    int32_t cuq2[2 * (MAXB + 1)], cuk2[2 * (MAXB + 1)];
    fa_tensor tcuq = fa_tensor_contiguous(cuq, FA_DTYPE_I32, 1, &one);
    fa_tensor tcuk = fa_tensor_contiguous(cuk, FA_DTYPE_I32, 1, &one);
    if (c->cu_strided) {
        for (int b = 0; b <= B; b++) {
            cuq2[2 * b] = cuq[b];
            cuk2[2 * b] = cuk[b];
            cuq2[2 * b + 1] = cuk2[2 * b + 1] = -12345; /* garbage between the offsets */
        }
        tcuq.data = cuq2;
        tcuk.data = cuk2;
        tcuq.stride[0] = tcuk.stride[0] = 2;
    }

    float slopes[MAXB * 64];
    double dslopes[MAXB * 64];
    fa_params params;
    fa_params_init(&params);
    params.causal = c->causal;
    params.window_left = c->wl;
    params.window_right = c->wr;
    params.softcap = c->softcap;
    params.softmax_scale = c->scale;
    if (c->alibi) {
        int64_t ns = c->alibi == 2 ? B * H : H;
        for (int64_t i = 0; i < ns; i++) {
            slopes[i] = (float)(0.02 + 0.5 * tu_uniform());
            dslopes[i] = slopes[i];
        }
        int64_t sh[2] = {B, H};
        params.alibi_slopes = c->alibi == 2 ? fa_tensor_contiguous(slopes, FA_DTYPE_F32, 2, sh)
                                            : fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, sh + 1);
    }

    /* dropout mask (B, H, max_seqlen_q, max_seqlen_k) */
    uint8_t *mask = NULL;
    const int64_t mq = maxq, mk = maxk;
    if (c->dropout_p > 0.0f) {
        params.dropout_p = c->dropout_p;
        params.dropout_seed = tu_next_u64();
        params.dropout_offset = tu_next_u64();
        int64_t ms[4] = {B, H, mq, mk};
        mask = malloc((size_t)(B * H * mq * mk > 0 ? B * H * mq * mk : 1));
        if (!mask)
            abort();
        fa_tensor tm = fa_tensor_contiguous(mask, FA_DTYPE_U8, 4, ms);
        fa_status ms_st = fa_dropout_mask(&params, &tm);
        CHECK_MSG(ms_st == FA_OK, "fa_dropout_mask: %s: %s", fa_status_name(ms_st),
                  fa_last_error_message());
    }

    fa_status st =
        fa_varlen_forward(NULL, &params, &q.t, &k.t, &v.t, &tcuq, &tcuk, maxq + c->extra_max,
                          maxk + c->extra_max, &out.t, c->no_lse ? NULL : &lse.t);
    CHECK_MSG(st == FA_OK, "fa_varlen_forward returned %s (%d): %s", fa_status_name(st), (int)st,
              fa_last_error_message());
    if (st == FA_OK) {
        tu_gather(&out, dout);
        tu_gather(&lse, dlse);
        /* rows outside every sequence: out 0, lse -inf */
        int64_t bad = 0;
        for (int64_t r = 0; r < tq; r++) {
            if (r >= cuq[0] && r < cuq[B])
                continue;
            for (int64_t h = 0; h < H; h++) {
                for (int64_t d = 0; d < D; d++)
                    bad += dout[(r * H + h) * D + d] != 0.0;
                if (!c->no_lse)
                    bad += dlse[h * tq + r] != -INFINITY;
            }
        }
        CHECK_MSG(bad == 0, "%lld elements of rows outside every sequence are not 0 / -inf",
                  (long long)bad);

        for (int b = 0; b < B; b++) {
            const int64_t Sq = c->lq[b], Sk = c->lk[b];
            double *sq = dalloc(Sq * H * D), *sk = dalloc(Sk * Hk * D), *sv = dalloc(Sk * Hk * D);
            double *so = dalloc(Sq * H * D), *sl = dalloc(H * Sq);
            double *ro = dalloc(Sq * H * D), *rl = dalloc(H * Sq);
            double *no = dalloc(Sq * H * D), *nl = dalloc(H * Sq), *rs = dalloc(H * Sq);
            memcpy(sq, dq + (int64_t)cuq[b] * H * D, sizeof(double) * (size_t)(Sq * H * D));
            memcpy(so, dout + (int64_t)cuq[b] * H * D, sizeof(double) * (size_t)(Sq * H * D));
            memcpy(sk, dk + (int64_t)cuk[b] * Hk * D, sizeof(double) * (size_t)(Sk * Hk * D));
            memcpy(sv, dv + (int64_t)cuk[b] * Hk * D, sizeof(double) * (size_t)(Sk * Hk * D));
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Sq; i++)
                    sl[h * Sq + i] = dlse[h * tq + cuq[b] + i];
            ref_problem p;
            memset(&p, 0, sizeof p);
            p.B = 1;
            p.Sq = Sq;
            p.Sk = Sk;
            p.H = H;
            p.Hk = Hk;
            p.D = D;
            p.scale = c->scale != 0.0f ? (double)c->scale : 1.0 / sqrt((double)D);
            p.causal = c->causal;
            p.window_left = c->wl;
            p.window_right = c->wr;
            p.softcap = c->softcap;
            p.alibi = c->alibi == 2 ? dslopes + b * H : c->alibi == 1 ? dslopes : NULL;
            uint8_t *smask = NULL;
            if (mask) {
                smask = malloc((size_t)(H * Sq * Sk > 0 ? H * Sq * Sk : 1));
                if (!smask)
                    abort();
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < Sq; i++)
                        for (int64_t j = 0; j < Sk; j++)
                            smask[(h * Sq + i) * Sk + j] = mask[((b * H + h) * mq + i) * mk + j];
                p.dropout_mask = smask;
                p.dropout_p = (double)c->dropout_p;
            }
            ref_attention_forward(&p, sq, sk, sv, ro, rl);
            if (c->dtype != FA_DTYPE_F32)
                ref_attention_forward_rounded(&p, sq, sk, sv, no, nl, tu_round_fn(c->dtype));
            else
                ref_score_sizes(&p, sq, sk, rs);
            if (!tu_check_attention(c->dtype, 1, Sq, H, D, so, ro,
                                    c->dtype != FA_DTYPE_F32 ? no : NULL, c->no_lse ? NULL : sl, rl,
                                    c->dtype != FA_DTYPE_F32 ? nl : NULL, rs, &g_stats[c->dtype]))
                CHECK_MSG(0, "sequence %d (Sq=%lld Sk=%lld) differs from the reference", b,
                          (long long)Sq, (long long)Sk);
            free(sq);
            free(sk);
            free(sv);
            free(so);
            free(sl);
            free(ro);
            free(rl);
            free(rs);
            free(no);
            free(nl);
            free(smask);
        }
    }
    int64_t gaps = tu_count_touched_gaps(&out);
    CHECK_MSG(gaps == 0, "%lld gap elements of out were written", (long long)gaps);
    if (c->no_lse) {
        const unsigned char *bb = lse.buf;
        int64_t changed = 0;
        for (int64_t i = 0; i < lse.nbuf * 4; i++)
            changed += bb[i] != 0xFF;
        CHECK_MSG(changed == 0, "lse not passed but %lld bytes of its buffer changed",
                  (long long)changed);
    } else {
        gaps = tu_count_touched_gaps(&lse);
        CHECK_MSG(gaps == 0, "%lld gap elements of lse were written", (long long)gaps);
    }

    tu_free(&q);
    tu_free(&k);
    tu_free(&v);
    tu_free(&out);
    tu_free(&lse);
    free(mask);
    free(dq);
    free(dk);
    free(dv);
    free(dout);
    free(dlse);
    return CASE_END();
}

static vcfg make(int nseq, const int32_t *lq, const int32_t *lk, int64_t H, int64_t Hk, int64_t D) {
    vcfg c;
    memset(&c, 0, sizeof c);
    c.nseq = nseq;
    for (int b = 0; b < nseq; b++) {
        c.lq[b] = lq[b];
        c.lk[b] = lk[b];
    }
    c.H = H;
    c.Hk = Hk;
    c.D = D;
    c.wl = c.wr = -1;
    c.dtype = FA_DTYPE_F32;
    return c;
}

static int run_all_dtypes(vcfg c) {
    int failed = 0;
    for (int t = 0; t < 3; t++) {
        c.dtype = k_dtypes[t];
        failed += !run_varlen_case(&c);
    }
    return failed;
}

static void group_line(const char *group, long cases, long failed) {
    printf("%-34s %4ld cases, %ld failed\n", group, cases, failed);
    fflush(stdout);
}

int main(void) {
    tu_seed_init("test_varlen");
    long n, failed;

    /* Lengths with empty sequences of every kind and Sq != Sk both ways. */
    static const int32_t lq1[] = {5, 0, 17, 1, 9, 0, 33, 2};
    static const int32_t lk1[] = {7, 3, 0, 12, 9, 0, 20, 40};

    n = failed = 0;
    for (int variant = 0; variant < 12; variant++) {
        vcfg c = make(8, lq1, lk1, 4, 2, 32);
        switch (variant) {
        case 0:
            break;
        case 1:
            c.causal = 1;
            break;
        case 2:
            c.wl = 3;
            c.wr = 2;
            break;
        case 3:
            c.causal = 1;
            c.wl = 4;
            break;
        case 4:
            c.alibi = 1;
            break;
        case 5:
            c.alibi = 2;
            c.causal = 1;
            break;
        case 6:
            c.softcap = 4.0f;
            c.wr = 0;
            c.wl = -1;
            break;
        case 7:
            c.H = 8;
            c.Hk = 1;
            c.causal = 1;
            c.alibi = 2;
            break;
        case 8:
            c.H = 3;
            c.Hk = 3;
            c.D = 7;
            c.scale = 0.4f;
            break;
        case 9:
            c.D = 1;
            c.wl = 0;
            c.wr = 0;
            break;
        case 10:
            c.D = 256;
            c.H = 2;
            c.Hk = 1;
            c.causal = 1;
            break;
        case 11:
            c.D = 80;
            c.wl = -1;
            c.wr = 3;
            c.softcap = 2.0f;
            c.alibi = 1;
            break;
        }
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("packed from row 0, features", n, failed);

    /* cu_seqlens not starting at 0 and not ending at total; layouts; no lse; loose max. */
    n = failed = 0;
    for (int variant = 0; variant < 12; variant++) {
        vcfg c = make(8, lq1, lk1, 4, 2, 24);
        c.q_start = 3;
        c.k_start = 5;
        c.q_tail = 4;
        c.k_tail = 2;
        switch (variant) {
        case 0:
            break;
        case 1:
            c.causal = 1;
            c.layout = TU_STRIDED;
            c.llse = TU_STRIDED;
            break;
        case 2:
            c.layout = TU_PERMUTED;
            c.llse = TU_PERMUTED;
            c.alibi = 2;
            break;
        case 3:
            c.layout = TU_INNER2;
            c.wl = 2;
            c.wr = 5;
            break;
        case 4:
            c.no_lse = 1;
            c.causal = 1;
            c.extra_max = 100;
            break;
        case 5:
            c.q_start = 0;
            c.k_start = 0;
            c.q_tail = 7;
            c.k_tail = 0;
            c.causal = 1;
            break;
        case 6:
            c.q_tail = 0;
            c.k_tail = 9;
            c.alibi = 1;
            c.layout = TU_STRIDED;
            break;
        case 7:
            c.H = 8;
            c.Hk = 2;
            c.softcap = 6.0f;
            c.extra_max = 1;
            break;
        case 8:
            c.cu_strided = 1;
            c.causal = 1;
            c.alibi = 1;
            break;
        case 9:
            c.extra_max = (int64_t)1 << 40;
            c.wl = 3;
            break; /* a huge (loose) bound */
        case 10:
            c.dropout_p = 0.3f;
            c.causal = 1;
            break;
        case 11:
            c.dropout_p = 0.6f;
            c.extra_max = 5;
            c.alibi = 2;
            c.layout = TU_STRIDED;
            break;
        }
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("offset cu_seqlens, layouts", n, failed);

    /* Degenerate: zero sequences (every row outside), one sequence, all-empty sequences. */
    n = failed = 0;
    {
        vcfg c = make(0, lq1, lk1, 2, 1, 16);
        c.q_start = 0;
        c.q_tail = 6;
        c.k_tail = 4;
        failed += run_all_dtypes(c);
        n += 3;
        static const int32_t z[] = {0, 0, 0};
        c = make(3, z, z, 2, 2, 8);
        c.q_start = 2;
        c.k_start = 1;
        c.q_tail = 3;
        c.k_tail = 1;
        c.causal = 1;
        failed += run_all_dtypes(c);
        n += 3;
        static const int32_t one_q[] = {13}, one_k[] = {29};
        c = make(1, one_q, one_k, 4, 4, 64);
        c.causal = 1;
        c.alibi = 2;
        failed += run_all_dtypes(c);
        n += 3;
        static const int32_t q3[] = {0, 4, 0}, k3[] = {6, 0, 0};
        c = make(3, q3, k3, 2, 1, 8); /* no sequence has both queries and keys */
        c.q_start = 1;
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("degenerate", n, failed);

    /* Long sequences: several query/key blocks per sequence. */
    n = failed = 0;
    {
        static const int32_t lq[] = {150, 3, 210, 64}, lk[] = {190, 260, 130, 64};
        vcfg c = make(4, lq, lk, 4, 2, 64);
        failed += run_all_dtypes(c);
        n += 3;
        c.causal = 1;
        c.q_start = 7;
        c.q_tail = 5;
        failed += run_all_dtypes(c);
        n += 3;
        c.causal = 0;
        c.wl = 40;
        c.wr = 10;
        c.alibi = 2;
        c.layout = TU_PERMUTED;
        failed += run_all_dtypes(c);
        n += 3;
    }
    group_line("long sequences", n, failed);

    /* Random configurations. */
    n = failed = 0;
    for (int i = 0; i < 60; i++) {
        int32_t lq[MAXB], lk[MAXB];
        int nseq = (int)tu_randint(1, 6);
        for (int b = 0; b < nseq; b++) {
            lq[b] = (int32_t)(tu_randint(0, 3) == 0 ? 0 : tu_randint(1, 70));
            lk[b] = (int32_t)(tu_randint(0, 3) == 0 ? 0 : tu_randint(1, 70));
        }
        int64_t Hk = tu_randint(1, 3), g = (int64_t[]){1, 2, 8}[tu_randint(0, 2)];
        int64_t D = (int64_t[]){1, 7, 32, 64, 80, 128, 256, 5}[tu_randint(0, 7)];
        vcfg c = make(nseq, lq, lk, Hk * g, Hk, D);
        c.q_start = (int32_t)tu_randint(0, 3);
        c.k_start = (int32_t)tu_randint(0, 3);
        c.q_tail = (int32_t)tu_randint(0, 3);
        c.k_tail = (int32_t)tu_randint(0, 3);
        c.causal = (int)tu_randint(0, 1);
        c.wl = (int)tu_randint(-1, 15);
        c.wr = (int)tu_randint(-1, 15);
        c.alibi = (int)tu_randint(0, 2);
        c.softcap = tu_randint(0, 2) == 0 ? (float)(1.0 + 8.0 * tu_uniform()) : 0.0f;
        c.layout = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        c.llse = (int)tu_randint(0, 2);
        c.no_lse = tu_randint(0, 5) == 0;
        c.dtype = k_dtypes[i % 3];
        if (tu_randint(0, 3) == 0)
            c.dropout_p = (float)(0.05 + 0.8 * tu_uniform());
        failed += !run_varlen_case(&c);
        n++;
    }
    group_line("random combinations", n, failed);

    for (int t = 0; t < 3; t++) {
        const tu_errstats *s = &g_stats[k_dtypes[t]];
        printf("max error %s vs fp64 over %ld sequences: out rel %.3g (abs %.3g%s), lse rel %.3g "
               "(abs %.3g)\n",
               tu_dtype_name(k_dtypes[t]), s->cases, s->max_rel, s->max_abs,
               k_dtypes[t] == FA_DTYPE_F32 ? "" : ", vs naive ratio below", s->max_lse_rel,
               s->max_lse_abs);
        if (k_dtypes[t] != FA_DTYPE_F32)
            printf("  %s error at most %.2fx the naive %s implementation's\n",
                   tu_dtype_name(k_dtypes[t]), s->max_ratio, tu_dtype_name(k_dtypes[t]));
    }
    return TEST_REPORT();
}
