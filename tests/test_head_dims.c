/* SPDX-License-Identifier: MIT */
/*
 * test_head_dims.c — a V head dim Dv of its own (v, out, dout, dv: Dv; q, k, dq, dk: D) on the
 * CPU against the fp64 reference, for (D, Dv) in {(192, 128), (128, 64), (64, 128), (40, 24),
 * (8, 16)}: fa_forward, fa_varlen_forward, fa_backward, fa_varlen_backward and
 * fa_forward_kvcache (paged, with an append), with causal, window, ALiBi, softcap, GQA and
 * dropout; then the errors of mismatched head dims.
 *
 * The reference has one head dim, so it runs on inputs padded with zeros to Dm = max(D, Dv):
 * zero columns of q and k add exact zeros to every score, zero columns of v give zero columns of
 * out, and zero columns of dout add nothing to Δ or dP; the first D (Dv) columns of its results
 * are then the exact ones. The scale is given explicitly as 1/sqrt(D), while the library gets
 * the default (0): the default must follow q's head dim.
 *
 * Per case (fresh normal inputs, outputs poisoned with NaN): out and lse by tu_check_attention
 * (fp32 within 1e-5, fp16/bf16 within twice a naive implementation in the dtype plus an ulp);
 * dq, dk, dv against the exact gradient of what fa_backward was handed (the stored out):
 * |got − g| <= ½ ulp + 1e-5·R + 4u·bnd (+ 2^-8·bnd for bf16 on bf16 dot products), as
 * tests/backward_check.h, and for fp32 also against the exact gradient of q, k, v, dout within
 * 1e-5·R + 4u·bnd.
 */
#include "flashattn.h"
#include "reference/attention_ref.h"
#include "reference/attention_ref_backward.h"
#include "test.h"
#include "testutil.h"

typedef struct hcase {
    int dtype;
    int64_t B, Sq, Sk, H, Hk, D, Dv;
    int causal, wl, wr;
    double softcap;
    int alibi;
    double dropout;
    int varlen;   /* B = 2 sequences of Sq, Sk and about half that; a row of q after them */
    int backward; /* also fa_backward / fa_varlen_backward */
} hcase;

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

static int bf16_products(void) {
    const char *info = fa_build_info();
    return strstr(info, "+ avx512_bf16") != NULL || strstr(info, "in use: refbf16") != NULL;
}

/* rows x (n, d) of src (rows of heads·d) into (n, dm) rows of heads·dm, zero beyond d. */
static double *pad(const double *src, int64_t rows, int64_t heads, int64_t d, int64_t dm) {
    double *dst = dalloc(rows * heads * dm);
    for (int64_t r = 0; r < rows * heads; r++)
        for (int64_t t = 0; t < d; t++)
            dst[r * dm + t] = src[r * d + t];
    return dst;
}

/* The first d columns of (rows·heads, dm) src into (rows·heads, d) dst. */
static void unpad(const double *src, int64_t rows, int64_t heads, int64_t dm, int64_t d,
                  double *dst) {
    for (int64_t r = 0; r < rows * heads; r++)
        for (int64_t t = 0; t < d; t++)
            dst[r * d + t] = src[r * dm + t];
}

/* |got − want| within the fp32 allowance (and ½ ulp of the dtype, bf16 products' 2^-8): 1 on
 * pass. exact: the exact gradient of q, k, v, dout (fp32 only, else NULL). */
static int check_grad(const char *name, int dtype, int64_t n, const double *got,
                      const double *given, const double *exact, const double *ref_exact,
                      const double *bnd) {
    double R = 0.0;
    for (int64_t i = 0; i < n; i++)
        R = fmax(R, fabs(ref_exact[i]));
    const double pds = dtype == FA_DTYPE_BF16 && bf16_products() ? 0x1.0p-8 : 0.0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double m = fmax(fabs(got[i]), fabs(given[i]));
        const double tol = 0.5 * tu_ulp(dtype, m == 0.0 ? 0x1.0p-1000 : m) + 1e-5 * R +
                           (4.0 * 0x1.0p-24 + pds) * bnd[i];
        int ok = fabs(got[i] - given[i]) <= tol;
        if (exact)
            ok = ok && fabs(got[i] - exact[i]) <= 1e-5 * R + 4.0 * 0x1.0p-24 * bnd[i];
        if (!ok && bad++ < 3)
            CHECK_MSG(0, "%s[%lld] = %.9g; given-out gradient %.9g (tol %.3g), exact %.9g", name,
                      (long long)i, got[i], given[i], tol, ref_exact[i]);
    }
    return bad == 0;
}

static void run_case(const hcase *c) {
    CASE_BEGIN("%s B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld Dv=%lld causal=%d w=(%d,%d) "
               "softcap=%g alibi=%d dropout=%g varlen=%d backward=%d",
               tu_dtype_name(c->dtype), (long long)c->B, (long long)c->Sq, (long long)c->Sk,
               (long long)c->H, (long long)c->Hk, (long long)c->D, (long long)c->Dv, c->causal,
               c->wl, c->wr, c->softcap, c->alibi, c->dropout, c->varlen, c->backward);
    const int64_t H = c->H, Hk = c->Hk, D = c->D, Dv = c->Dv, Dm = D > Dv ? D : Dv;
    const int64_t B = c->B;
    int32_t cuq[3] = {0, 0, 0}, cuk[3] = {0, 0, 0};
    int64_t lq[2] = {c->Sq, c->Sq}, lk[2] = {c->Sk, c->Sk};
    if (c->varlen) {
        lq[1] = c->Sq / 2 + 1, lk[1] = c->Sk / 2 + 3;
        for (int b = 0; b < 2; b++)
            cuq[b + 1] = cuq[b] + (int32_t)lq[b], cuk[b + 1] = cuk[b] + (int32_t)lk[b];
    }
    const int64_t rq = c->varlen ? cuq[2] + 1 : B * c->Sq, rk = c->varlen ? cuk[2] : B * c->Sk;
    const int nd = c->varlen ? 3 : 4;
    const int64_t sq_[4] = {B, c->Sq, H, D}, sk_[4] = {B, c->Sk, Hk, D};
    const int64_t so_[4] = {B, c->Sq, H, Dv}, sv_[4] = {B, c->Sk, Hk, Dv};
    const int64_t vq[3] = {rq, H, D}, vk[3] = {rk, Hk, D}, vo[3] = {rq, H, Dv},
                  vv[3] = {rk, Hk, Dv};
    tu_tensor q, k, v, out, lse, dout, dq, dk, dv;
    tu_alloc(&q, c->dtype, nd, c->varlen ? vq : sq_, TU_CONTIG);
    tu_alloc(&k, c->dtype, nd, c->varlen ? vk : sk_, TU_CONTIG);
    tu_alloc(&v, c->dtype, nd, c->varlen ? vv : sv_, TU_CONTIG);
    tu_alloc(&out, c->dtype, nd, c->varlen ? vo : so_, TU_CONTIG);
    const int64_t ls[3] = {B, H, c->Sq}, lsv[2] = {H, rq};
    tu_alloc(&lse, FA_DTYPE_F32, c->varlen ? 2 : 3, c->varlen ? lsv : ls, TU_CONTIG);
    double *qd = dalloc(rq * H * D), *kd = dalloc(rk * Hk * D), *vd = dalloc(rk * Hk * Dv);
    tu_fill_normal(&q, 1.0, qd);
    tu_fill_normal(&k, 1.0, kd);
    tu_fill_normal(&v, 1.0, vd);

    fa_params prm;
    fa_params_init(&prm);
    prm.causal = c->causal;
    prm.window_left = c->wl;
    prm.window_right = c->wr;
    prm.softcap = (float)c->softcap;
    prm.dropout_p = (float)c->dropout;
    prm.dropout_seed = 1234 + (uint64_t)c->Sq;
    float slopes[16];
    double dslopes[16];
    for (int64_t h = 0; h < H; h++)
        slopes[h] = (float)(0.3 * tu_uniform()), dslopes[h] = slopes[h];
    if (c->alibi)
        prm.alibi_slopes = fa_tensor_contiguous(slopes, FA_DTYPE_F32, 1, &H);
    uint8_t *mask = NULL;
    if (c->dropout > 0.0) {
        const int64_t ms[4] = {B, H, c->Sq, c->Sk};
        mask = malloc((size_t)(B * H * c->Sq * c->Sk));
        fa_tensor mt = fa_tensor_contiguous(mask, FA_DTYPE_U8, 4, ms);
        REQUIRE(fa_dropout_mask(&prm, &mt) == FA_OK);
    }
    fa_status st;
    fa_tensor cq = fa_tensor_contiguous(cuq, FA_DTYPE_I32, 1, (const int64_t[]){3});
    fa_tensor ck = fa_tensor_contiguous(cuk, FA_DTYPE_I32, 1, (const int64_t[]){3});
    if (c->varlen)
        st =
            fa_varlen_forward(NULL, &prm, &q.t, &k.t, &v.t, &cq, &ck, c->Sq, c->Sk, &out.t, &lse.t);
    else
        st = fa_forward(NULL, &prm, &q.t, &k.t, &v.t, &out.t, &lse.t);
    CHECK_MSG(st == FA_OK, "forward: %s", fa_last_error_message());
    double *od = dalloc(rq * H * Dv), *lsed = dalloc(rq * H);
    tu_gather(&out, od);
    tu_gather(&lse, lsed);

    double *dod = NULL, *dqd = NULL, *dkd = NULL, *dvd = NULL;
    if (c->backward && st == FA_OK) {
        tu_alloc(&dout, c->dtype, nd, c->varlen ? vo : so_, TU_CONTIG);
        tu_alloc(&dq, c->dtype, nd, c->varlen ? vq : sq_, TU_CONTIG);
        tu_alloc(&dk, c->dtype, nd, c->varlen ? vk : sk_, TU_CONTIG);
        tu_alloc(&dv, c->dtype, nd, c->varlen ? vv : sv_, TU_CONTIG);
        dod = dalloc(rq * H * Dv);
        tu_fill_normal(&dout, 1.0, dod);
        if (c->varlen)
            st = fa_varlen_backward(NULL, &prm, &q.t, &k.t, &v.t, &out.t, &dout.t, &lse.t, &cq, &ck,
                                    c->Sq, c->Sk, &dq.t, &dk.t, &dv.t);
        else
            st = fa_backward(NULL, &prm, &q.t, &k.t, &v.t, &out.t, &dout.t, &lse.t, &dq.t, &dk.t,
                             &dv.t);
        CHECK_MSG(st == FA_OK, "backward: %s", fa_last_error_message());
        dqd = dalloc(rq * H * D), dkd = dalloc(rk * Hk * D), dvd = dalloc(rk * Hk * Dv);
        tu_gather(&dq, dqd);
        tu_gather(&dk, dkd);
        tu_gather(&dv, dvd);
    }

    for (int64_t b = 0; b < B && st == FA_OK; b++) {
        const int64_t sq = lq[b], sk = lk[b];
        const int64_t q0 = c->varlen ? cuq[b] : b * sq, k0 = c->varlen ? cuk[b] : b * sk;
        const ref_problem rp = {.B = 1,
                                .Sq = sq,
                                .Sk = sk,
                                .H = H,
                                .Hk = Hk,
                                .D = Dm,
                                .scale = 1.0 / sqrt((double)D),
                                .causal = c->causal,
                                .window_left = c->wl,
                                .window_right = c->wr,
                                .softcap = c->softcap,
                                .alibi = c->alibi ? dslopes : NULL,
                                .dropout_mask = mask ? mask + b * H * sq * sk : NULL,
                                .dropout_p = c->dropout};
        double *qp = pad(qd + q0 * H * D, sq, H, D, Dm), *kp = pad(kd + k0 * Hk * D, sk, Hk, D, Dm);
        double *vp = pad(vd + k0 * Hk * Dv, sk, Hk, Dv, Dm);
        double *ref = dalloc(sq * H * Dm), *naive = dalloc(sq * H * Dm);
        double *lref = dalloc(H * sq), *lnaive = dalloc(H * sq), *size = dalloc(H * sq);
        double *ro = dalloc(sq * H * Dv), *rn = dalloc(sq * H * Dv), *gl = dalloc(H * sq);
        ref_attention_forward(&rp, qp, kp, vp, ref, lref);
        ref_score_sizes(&rp, qp, kp, size);
        unpad(ref, sq, H, Dm, Dv, ro);
        if (c->dtype != FA_DTYPE_F32) {
            ref_attention_forward_rounded(&rp, qp, kp, vp, naive, lnaive, tu_round_fn(c->dtype));
            unpad(naive, sq, H, Dm, Dv, rn);
        }
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sq; i++)
                gl[h * sq + i] = c->varlen ? lsed[h * rq + q0 + i] : lsed[(b * H + h) * sq + i];
        CHECK(tu_check_attention(c->dtype, 1, sq, H, Dv, od + q0 * H * Dv, ro, rn, gl, lref, lnaive,
                                 size, NULL));
        if (dqd) {
            double *op = pad(od + q0 * H * Dv, sq, H, Dv, Dm),
                   *dop = pad(dod + q0 * H * Dv, sq, H, Dv, Dm);
            double *g[3], *e[3], *bd[3], *gu[3], *eu[3], *bu[3];
            const int64_t rows[3] = {sq * H, sk * Hk, sk * Hk}, dims[3] = {D, D, Dv};
            for (int t = 0; t < 3; t++) {
                g[t] = dalloc(rows[t] * Dm), e[t] = dalloc(rows[t] * Dm),
                bd[t] = dalloc(rows[t] * Dm);
                gu[t] = dalloc(rows[t] * dims[t]), eu[t] = dalloc(rows[t] * dims[t]);
                bu[t] = dalloc(rows[t] * dims[t]);
            }
            ref_attention_backward_given_out(&rp, qp, kp, vp, op, dop, g[0], g[1], g[2]);
            ref_attention_backward(&rp, qp, kp, vp, dop, NULL, NULL, e[0], e[1], e[2]);
            ref_attention_backward_bound(&rp, qp, kp, vp, dop, bd[0], bd[1], bd[2]);
            const double *got[3] = {dqd + q0 * H * D, dkd + k0 * Hk * D, dvd + k0 * Hk * Dv};
            static const char *const names[3] = {"dq", "dk", "dv"};
            for (int t = 0; t < 3; t++) {
                unpad(g[t], rows[t], 1, Dm, dims[t], gu[t]);
                unpad(e[t], rows[t], 1, Dm, dims[t], eu[t]);
                unpad(bd[t], rows[t], 1, Dm, dims[t], bu[t]);
                CHECK(check_grad(names[t], c->dtype, rows[t] * dims[t], got[t], gu[t],
                                 c->dtype == FA_DTYPE_F32 ? eu[t] : NULL, eu[t], bu[t]));
                free(g[t]), free(e[t]), free(bd[t]), free(gu[t]), free(eu[t]), free(bu[t]);
            }
            free(op), free(dop);
        }
        free(qp), free(kp), free(vp), free(ref), free(naive), free(lref), free(lnaive);
        free(size), free(ro), free(rn), free(gl);
    }
    if (c->varlen && st == FA_OK) { /* the row after both sequences: out 0, lse -inf, dq 0 */
        const int64_t r = cuq[2];
        for (int64_t t = 0; t < H * Dv; t++)
            CHECK(od[r * H * Dv + t] == 0.0);
        for (int64_t h = 0; h < H; h++)
            CHECK(lsed[h * rq + r] == -INFINITY);
        for (int64_t t = 0; dqd && t < H * D; t++)
            CHECK(dqd[r * H * D + t] == 0.0);
    }
    if (c->backward) {
        tu_free(&dout), tu_free(&dq), tu_free(&dk), tu_free(&dv);
        free(dod), free(dqd), free(dkd), free(dvd);
    }
    tu_free(&q), tu_free(&k), tu_free(&v), tu_free(&out), tu_free(&lse);
    free(qd), free(kd), free(vd), free(od), free(lsed), free(mask);
    CASE_END();
}

/* fa_forward_kvcache on a paged cache (pages of 16 rows, in reverse order) holding `seqlen[b]`
 * tokens, appending Sq new ones (k_new, v_new), causal; then the cache's V rows are v_new and out
 * is the reference over the cache's first seqlen[b] + Sq keys. */
static void kvcache_case(int dtype, int64_t H, int64_t Hk, int64_t D, int64_t Dv, int64_t Sq,
                         int causal) {
    CASE_BEGIN("kvcache paged %s H=%lld Hk=%lld D=%lld Dv=%lld Sq=%lld causal=%d",
               tu_dtype_name(dtype), (long long)H, (long long)Hk, (long long)D, (long long)Dv,
               (long long)Sq, causal);
    enum { B = 2, PAGE = 16, PAGES_PER = 24 }; /* 384 rows per batch: split-KV decode too */
    const int32_t seqlen[B] = {300, 37};
    const int64_t Dm = D > Dv ? D : Dv, np = B * PAGES_PER;
    const int64_t kcs[4] = {np, PAGE, Hk, D}, vcs[4] = {np, PAGE, Hk, Dv};
    const int64_t kns[4] = {B, Sq, Hk, D}, vns[4] = {B, Sq, Hk, Dv};
    const int64_t qs[4] = {B, Sq, H, D}, os[4] = {B, Sq, H, Dv}, ls[3] = {B, H, Sq};
    tu_tensor kc, vc, kn, vn, q, out, lse;
    tu_alloc(&kc, dtype, 4, kcs, TU_CONTIG);
    tu_alloc(&vc, dtype, 4, vcs, TU_CONTIG);
    tu_alloc(&kn, dtype, 4, kns, TU_CONTIG);
    tu_alloc(&vn, dtype, 4, vns, TU_CONTIG);
    tu_alloc(&q, dtype, 4, qs, TU_CONTIG);
    tu_alloc(&out, dtype, 4, os, TU_CONTIG);
    tu_alloc(&lse, FA_DTYPE_F32, 3, ls, TU_CONTIG);
    double *kcd = dalloc(np * PAGE * Hk * D), *vcd = dalloc(np * PAGE * Hk * Dv);
    double *knd = dalloc(B * Sq * Hk * D), *vnd = dalloc(B * Sq * Hk * Dv);
    double *qd = dalloc(B * Sq * H * D);
    tu_fill_normal(&kc, 1.0, kcd);
    tu_fill_normal(&vc, 1.0, vcd);
    tu_fill_normal(&kn, 1.0, knd);
    tu_fill_normal(&vn, 1.0, vnd);
    tu_fill_normal(&q, 1.0, qd);
    int32_t bt[B * PAGES_PER], sl[B] = {seqlen[0], seqlen[1]};
    for (int64_t t = 0; t < B * PAGES_PER; t++)
        bt[t] = (int32_t)(np - 1 - t);
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = kc.t, kv.v_cache = vc.t, kv.k_new = kn.t, kv.v_new = vn.t;
    kv.block_table = fa_tensor_contiguous(bt, FA_DTYPE_I32, 2, (const int64_t[]){B, PAGES_PER});
    kv.cache_seqlens = fa_tensor_contiguous(sl, FA_DTYPE_I32, 1, (const int64_t[]){B});
    fa_params prm;
    fa_params_init(&prm);
    prm.causal = causal;
    const fa_status st = fa_forward_kvcache(NULL, &prm, &q.t, &kv, &out.t, &lse.t);
    CHECK_MSG(st == FA_OK, "fa_forward_kvcache: %s", fa_last_error_message());
    double *od = dalloc(B * Sq * H * Dv), *lsed = dalloc(B * H * Sq),
           *vca = dalloc(np * PAGE * Hk * Dv);
    double *kca = dalloc(np * PAGE * Hk * D);
    tu_gather(&out, od);
    tu_gather(&lse, lsed);
    tu_gather(&vc, vca);
    tu_gather(&kc, kca);
    for (int64_t b = 0; b < B && st == FA_OK; b++) {
        const int64_t sk = seqlen[b] + Sq;
        double *kb = dalloc(sk * Hk * Dm), *vb = dalloc(sk * Hk * Dm);
        for (int64_t j = 0; j < sk; j++) {
            const int64_t page = bt[b * PAGES_PER + j / PAGE], row = page * PAGE + j % PAGE;
            for (int64_t h = 0; h < Hk; h++) {
                for (int64_t t = 0; t < D; t++)
                    kb[(j * Hk + h) * Dm + t] = kca[(row * Hk + h) * D + t];
                for (int64_t t = 0; t < Dv; t++) {
                    const double x = vca[(row * Hk + h) * Dv + t];
                    vb[(j * Hk + h) * Dm + t] = x;
                    if (j >= seqlen[b]) /* appended: v_new's row */
                        CHECK(x == vnd[((b * Sq + j - seqlen[b]) * Hk + h) * Dv + t]);
                }
            }
        }
        double *qp = pad(qd + b * Sq * H * D, Sq, H, D, Dm);
        const ref_problem rp = {.B = 1,
                                .Sq = Sq,
                                .Sk = sk,
                                .H = H,
                                .Hk = Hk,
                                .D = Dm,
                                .scale = 1.0 / sqrt((double)D),
                                .causal = causal,
                                .window_left = -1,
                                .window_right = -1};
        double *ref = dalloc(Sq * H * Dm), *naive = dalloc(Sq * H * Dm), *lref = dalloc(H * Sq);
        double *lnaive = dalloc(H * Sq), *size = dalloc(H * Sq), *ro = dalloc(Sq * H * Dv);
        double *rn = dalloc(Sq * H * Dv);
        ref_attention_forward(&rp, qp, kb, vb, ref, lref);
        ref_score_sizes(&rp, qp, kb, size);
        unpad(ref, Sq, H, Dm, Dv, ro);
        if (dtype != FA_DTYPE_F32) {
            ref_attention_forward_rounded(&rp, qp, kb, vb, naive, lnaive, tu_round_fn(dtype));
            unpad(naive, Sq, H, Dm, Dv, rn);
        }
        CHECK(tu_check_attention(dtype, 1, Sq, H, Dv, od + b * Sq * H * Dv, ro, rn,
                                 lsed + b * H * Sq, lref, lnaive, size, NULL));
        free(kb), free(vb), free(qp), free(ref), free(naive), free(lref), free(lnaive);
        free(size), free(ro), free(rn);
    }
    tu_free(&kc), tu_free(&vc), tu_free(&kn), tu_free(&vn), tu_free(&q), tu_free(&out);
    tu_free(&lse);
    free(kcd), free(vcd), free(knd), free(vnd), free(qd), free(od), free(lsed), free(vca);
    free(kca);
    CASE_END();
}

/* A call that must fail with `want` and a message naming `what`, out left poisoned. */
static void expect_error(const char *label, fa_status got, fa_status want, const char *what,
                         const tu_tensor *out) {
    CASE_BEGIN("error: %s", label);
    CHECK_MSG(got == want, "status %d, want %d (%s)", got, want, fa_last_error_message());
    CHECK_MSG(strstr(fa_last_error_message(), what) != NULL, "message \"%s\" lacks \"%s\"",
              fa_last_error_message(), what);
    if (out) {
        const unsigned char *b = out->buf;
        for (int64_t i = 0; i < out->nbuf * (int64_t)tu_dtype_size(out->t.dtype); i++)
            if (b[i] != 0xFF) {
                CHECK_MSG(0, "out written at byte %lld", (long long)i);
                break;
            }
    }
    CASE_END();
}

static void error_cases(void) {
    const int64_t B = 1, S = 4, H = 2;
    tu_tensor q, k, v, o, o_bad, lse, dout_bad, dq, dk, dv_bad, dv, v0, v257, dout;
    tu_alloc(&q, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 64}, TU_CONTIG);
    tu_alloc(&k, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 64}, TU_CONTIG);
    tu_alloc(&v, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 100}, TU_CONTIG);
    tu_alloc(&v0, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 0}, TU_CONTIG);
    tu_alloc(&v257, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 257}, TU_CONTIG);
    tu_alloc(&o, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 100}, TU_CONTIG);
    tu_alloc(&o_bad, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 128}, TU_CONTIG);
    tu_alloc(&lse, FA_DTYPE_F32, 3, (const int64_t[]){B, H, S}, TU_CONTIG);
    tu_alloc(&dout, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 100}, TU_CONTIG);
    tu_alloc(&dout_bad, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 64}, TU_CONTIG);
    tu_alloc(&dq, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 64}, TU_CONTIG);
    tu_alloc(&dk, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 64}, TU_CONTIG);
    tu_alloc(&dv, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 100}, TU_CONTIG);
    tu_alloc(&dv_bad, FA_DTYPE_F32, 4, (const int64_t[]){B, S, H, 64}, TU_CONTIG);
    double *tmp = dalloc(B * S * H * 257);
    tu_fill_normal(&q, 1.0, tmp), tu_fill_normal(&k, 1.0, tmp), tu_fill_normal(&v, 1.0, tmp);
    tu_fill_normal(&v257, 1.0, tmp), tu_fill_normal(&dout, 1.0, tmp);
    tu_fill_normal(&dout_bad, 1.0, tmp);
    free(tmp);
    expect_error("out's head dim 128 != v's 100",
                 fa_forward(NULL, NULL, &q.t, &k.t, &v.t, &o_bad.t, NULL), FA_ERR_SHAPE,
                 "out: head dim (shape[3]) is 128; expected v's 100", &o_bad);
    expect_error("v's head dim 0", fa_forward(NULL, NULL, &q.t, &k.t, &v0.t, &o.t, NULL),
                 FA_ERR_SHAPE, "v: head dim Dv (shape[3]) is 0", &o);
    expect_error("v's head dim 257", fa_forward(NULL, NULL, &q.t, &k.t, &v257.t, &o.t, NULL),
                 FA_ERR_UNSUPPORTED, "v: head dim Dv (shape[3]) is 257; supported: 1..256", &o);
    /* a valid forward, then backward errors with dq, dk, dv untouched */
    REQUIRE(fa_forward(NULL, NULL, &q.t, &k.t, &v.t, &o.t, &lse.t) == FA_OK);
    expect_error(
        "dout's head dim 64 != v's 100",
        fa_backward(NULL, NULL, &q.t, &k.t, &v.t, &o.t, &dout_bad.t, &lse.t, &dq.t, &dk.t, &dv.t),
        FA_ERR_SHAPE, "dout: head dim (shape[3]) is 64; expected v's 100", &dv);
    expect_error(
        "dv's head dim 64 != v's 100",
        fa_backward(NULL, NULL, &q.t, &k.t, &v.t, &o.t, &dout.t, &lse.t, &dq.t, &dk.t, &dv_bad.t),
        FA_ERR_SHAPE, "dv: head dim (shape[3]) is 64; expected v's 100", &dv_bad);
    expect_error(
        "dq's head dim 100 != q's 64",
        fa_backward(NULL, NULL, &q.t, &k.t, &v.t, &o.t, &dout.t, &lse.t, &dv.t, &dk.t, &dv_bad.t),
        FA_ERR_SHAPE, "dq: head dim (shape[3]) is 100; expected q's 64", &dv_bad);
    /* KV cache: v_new and out must have v_cache's Dv */
    {
        tu_tensor kc, vc, kn, vn_bad, qk, ok, ok_bad;
        tu_alloc(&kc, FA_DTYPE_F32, 4, (const int64_t[]){1, 8, H, 64}, TU_CONTIG);
        tu_alloc(&vc, FA_DTYPE_F32, 4, (const int64_t[]){1, 8, H, 32}, TU_CONTIG);
        tu_alloc(&kn, FA_DTYPE_F32, 4, (const int64_t[]){1, 1, H, 64}, TU_CONTIG);
        tu_alloc(&vn_bad, FA_DTYPE_F32, 4, (const int64_t[]){1, 1, H, 64}, TU_CONTIG);
        tu_alloc(&qk, FA_DTYPE_F32, 4, (const int64_t[]){1, 1, H, 64}, TU_CONTIG);
        tu_alloc(&ok, FA_DTYPE_F32, 4, (const int64_t[]){1, 1, H, 32}, TU_CONTIG);
        tu_alloc(&ok_bad, FA_DTYPE_F32, 4, (const int64_t[]){1, 1, H, 64}, TU_CONTIG);
        double *t2 = dalloc(8 * H * 64);
        tu_fill_normal(&kc, 1.0, t2), tu_fill_normal(&vc, 1.0, t2), tu_fill_normal(&kn, 1.0, t2);
        tu_fill_normal(&vn_bad, 1.0, t2), tu_fill_normal(&qk, 1.0, t2);
        free(t2);
        fa_kvcache kv;
        fa_kvcache_init(&kv);
        kv.k_cache = kc.t, kv.v_cache = vc.t, kv.cache_seqlen = 4;
        expect_error("kvcache out's head dim 64 != v_cache's 32",
                     fa_forward_kvcache(NULL, NULL, &qk.t, &kv, &ok_bad.t, NULL), FA_ERR_SHAPE,
                     "out: head dim (shape[3]) is 64; expected kv.v_cache's 32", &ok_bad);
        kv.k_new = kn.t, kv.v_new = vn_bad.t;
        expect_error("kvcache v_new's head dim 64 != v_cache's 32",
                     fa_forward_kvcache(NULL, NULL, &qk.t, &kv, &ok.t, NULL), FA_ERR_SHAPE,
                     "kv.v_new: shape[3] is 64; expected 32 (B, S_new, Hk, Dv)", &ok);
        /* the KV cache on CUDA tensors with Dv != D: refused before any plug-in */
        fa_tensor cq = qk.t, co = ok.t;
        fa_kvcache ckv = kv;
        cq.device = co.device = ckv.k_cache.device = ckv.v_cache.device = FA_DEVICE_CUDA;
        ckv.k_new.data = ckv.v_new.data = NULL;
        expect_error("kvcache on CUDA with Dv != D",
                     fa_forward_kvcache(NULL, NULL, &cq, &ckv, &co, NULL), FA_ERR_UNSUPPORTED,
                     "the KV cache on CUDA tensors takes Dv = D only", NULL);
        tu_free(&kc), tu_free(&vc), tu_free(&kn), tu_free(&vn_bad), tu_free(&qk), tu_free(&ok);
        tu_free(&ok_bad);
    }
    tu_free(&q), tu_free(&k), tu_free(&v), tu_free(&o), tu_free(&o_bad), tu_free(&lse);
    tu_free(&dout), tu_free(&dout_bad), tu_free(&dq), tu_free(&dk), tu_free(&dv);
    tu_free(&dv_bad), tu_free(&v0), tu_free(&v257);
}

int main(void) {
    tu_seed_init("test_head_dims");
    static const int64_t dims[][2] = {{192, 128}, {128, 64}, {64, 128}, {40, 24}, {8, 16}};
    static const int dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int d = 0; d < 5; d++) {
        const int64_t D = dims[d][0], Dv = dims[d][1];
        for (int t = 0; t < 3; t++) {
            const int dt = dtypes[t];
            /* plain, then GQA causal with ALiBi, a window with softcap, dropout */
            run_case(&(hcase){dt, 2, 37, 45, 2, 2, D, Dv, 0, -1, -1, 0.0, 0, 0.0, 0, 1});
            run_case(&(hcase){dt, 1, 70, 150, 4, 2, D, Dv, 1, -1, 0, 0.0, 1, 0.0, 0, 1});
            run_case(&(hcase){dt, 1, 50, 200, 2, 1, D, Dv, 0, 30, 10, 5.0, 0, 0.0, 0, 1});
            run_case(&(hcase){dt, 2, 33, 29, 2, 1, D, Dv, 0, -1, -1, 0.0, 0, 0.2, 0, 1});
            /* varlen, causal GQA */
            run_case(&(hcase){dt, 2, 40, 60, 4, 2, D, Dv, 1, -1, 0, 0.0, 0, 0.0, 1, 1});
            /* decode: one row and few rows on a long cache (split-KV), fixed and paged */
            run_case(&(hcase){dt, 1, 1, 2100, 4, 1, D, Dv, 0, -1, -1, 0.0, 0, 0.0, 0, 0});
            run_case(&(hcase){dt, 2, 3, 1500, 8, 2, D, Dv, 1, -1, 0, 0.0, 1, 0.0, 0, 0});
            kvcache_case(dt, 4, 2, D, Dv, 1, 1);
            kvcache_case(dt, 4, 1, D, Dv, 5, 1);
        }
        /* long enough for the head packs and the fused/split backward's many blocks */
        run_case(&(hcase){FA_DTYPE_F32, 1, 300, 520, 2, 1, D, Dv, 1, -1, 0, 0.0, 0, 0.0, 0, 1});
    }
    error_cases();
    return TEST_REPORT();
}
