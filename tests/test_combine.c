/* SPDX-License-Identifier: MIT */
/*
 * test_combine.c — fa_combine against an fp64 merge of the same partials, and against a whole
 * attention: fa_forward over all the keys equals fa_combine of fa_forward over parts of them.
 *
 * Merge cases draw n partial outputs and lse values (flash-attn 3's layout (n, B, S, H, D) and
 * (n, B, H, S)-stored lse, or padded strides) and plant the edge rows: parts with lse = -inf
 * whose outputs are NaN (they must be skipped, never read), rows whose parts are all -inf
 * (out 0, lse -inf), a NaN or +inf lse (the row is NaN). out and lse start as NaN, and the pad
 * elements of a padded out must stay untouched. fp32 out: |out - ref| <= 1e-5 (max(1, |ref|));
 * fp16/bf16 out: the dtype's half ulp of |ref| on top (the rounding of the fp32 result); lse:
 * 1e-5 (max(1, |ref|)).
 * Error cases break one argument of a valid call and check the status, that the message names
 * the argument, and that out and lse are unchanged.
 *
 * fp32 out cases run fa_forward / fa_varlen_forward on fp16/bf16 inputs twice, into a 16-bit out
 * and into an fp32 one (the partials fa_combine wants), and check the fp32 out against the fp64
 * reference; see f32out_case.
 *
 * --cuda runs every call on CUDA device 0 on device copies of the buffers (exit 77 without one).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

static int g_cuda;

/* A buffer and its device copy in --cuda mode: calls take dev, checks read host. */
typedef struct buf {
    float *host;
    void *dev;
    size_t bytes;
} buf;

static buf buf_new(size_t elems, size_t esize) {
    buf b = {malloc(elems * esize + 16), NULL, elems * esize};
    if (!b.host)
        abort();
    memset(b.host, 0xFF, b.bytes); /* NaN */
    return b;
}

static void *buf_call(buf *b) { /* the pointer a call gets; the host bytes copied in first */
    if (!g_cuda)
        return b->host;
    if (!b->dev && fa_device_alloc(FA_DEVICE_CUDA, 0, b->bytes, &b->dev) != FA_OK)
        abort();
    if (fa_device_copy(b->dev, FA_DEVICE_CUDA, b->host, FA_DEVICE_CPU, 0, b->bytes) != FA_OK)
        abort();
    return b->dev;
}

static void buf_back(buf *b) { /* the device bytes into host */
    if (g_cuda && fa_device_copy(b->host, FA_DEVICE_CPU, b->dev, FA_DEVICE_CUDA, 0, b->bytes))
        abort();
}

static void buf_free(buf *b) {
    if (b->dev)
        fa_device_free(FA_DEVICE_CUDA, 0, b->dev);
    free(b->host);
}

static fa_tensor view(void *data, fa_dtype t, int ndim, const int64_t *shape,
                      const int64_t *stride) {
    fa_tensor x = fa_tensor_contiguous(data, t, ndim, shape);
    for (int i = 0; i < ndim; i++)
        x.stride[i] = stride[i];
    if (g_cuda)
        x.device = FA_DEVICE_CUDA;
    return x;
}

/* fp64 merge of row r's n parts (lse at lse[i·ls], outputs at o[i·os + d]). */
static void ref_row(int64_t n, const float *lse, int64_t ls, const float *o, int64_t os, int64_t od,
                    int64_t D, double *out, double *lse_out) {
    double m = -INFINITY;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        nan |= isnan(lse[i * ls]) || lse[i * ls] == INFINITY;
        if (lse[i * ls] > m)
            m = lse[i * ls];
    }
    if (nan || m == -INFINITY) {
        for (int64_t d = 0; d < D; d++)
            out[d] = nan ? NAN : 0.0;
        *lse_out = nan ? NAN : -INFINITY;
        return;
    }
    double l = 0.0;
    for (int64_t d = 0; d < D; d++)
        out[d] = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (lse[i * ls] == -INFINITY)
            continue;
        const double w = exp((double)lse[i * ls] - m);
        l += w;
        for (int64_t d = 0; d < D; d++)
            out[d] += w * o[i * os + d * od];
    }
    for (int64_t d = 0; d < D; d++)
        out[d] /= l;
    *lse_out = m + log(l);
}

/* Merge case: n parts of (B, S, H, D); out of dtype dt; fa3 layout or padded; lse wanted. */
static void merge_case(int64_t n, int64_t B, int64_t S, int64_t H, int64_t D, int dt, int fa3,
                       int want_lse) {
    CASE_BEGIN("merge n=%lld B=%lld S=%lld H=%lld D=%lld out %s %s%s", (long long)n, (long long)B,
               (long long)S, (long long)H, (long long)D, tu_dtype_name(dt),
               fa3 ? "fa3 layout" : "padded", want_lse ? "" : " no lse");
    const int64_t pad = fa3 ? 0 : 3, rows = B * S * H;
    /* partials: (n, B, S, H, D) with D padded; lse stored (n, B, H, S) (fa3) or padded */
    const int64_t od = 1, oh = D + pad, os = H * oh, ob = S * os, on = B * ob + pad;
    const int64_t lh = fa3 ? S : 1, ls = fa3 ? 1 : H + pad, lb = fa3 ? H * S : S * (H + pad);
    const int64_t ln = B * lb + pad;
    buf op = buf_new((size_t)(n * on), 4), lp = buf_new((size_t)(n * ln), 4);
    for (int64_t i = 0; i < n * on; i++)
        op.host[i] = (float)tu_normal();
    for (int64_t i = 0; i < n * ln; i++)
        lp.host[i] = (float)(3.0 * tu_normal());
    /* edge rows: part 0 of row 1 masked with NaN outputs, row 2 fully masked, row 3 NaN, row 4
     * +inf (where the rows exist) */
    int64_t row_at[5];
    for (int64_t r = 0; r < 5 && r < rows; r++) {
        const int64_t h = r % H, s = r / H % S, b = r / H / S;
        row_at[r] = b * lb + s * ls + h * lh;
    }
    if (rows > 1) {
        lp.host[row_at[1]] = -INFINITY;
        const int64_t h = 1 % H, s = 1 / H % S, b = 1 / H / S;
        for (int64_t d = 0; d < D; d++)
            op.host[b * ob + s * os + h * oh + d * od] = NAN;
    }
    for (int64_t i = 0; rows > 2 && i < n; i++)
        lp.host[i * ln + row_at[2]] = -INFINITY;
    if (rows > 3)
        lp.host[(n - 1) * ln + row_at[3]] = NAN;
    if (rows > 4)
        lp.host[row_at[4]] = INFINITY;

    const int64_t es = (int64_t)tu_dtype_size(dt), oe_h = D + pad, oe_s = H * oe_h;
    const int64_t oe_b = S * oe_s, ne = B * oe_b;
    buf out = buf_new((size_t)ne, (size_t)es), lse = buf_new((size_t)rows, 4);
    const int64_t sh4[4] = {B, S, H, D}, ost[4] = {ob, os, oh, od}, lst[3] = {lb, ls, lh};
    const int64_t outst[4] = {oe_b, oe_s, oe_h, 1}, lsest[3] = {S * H, H, 1};
    const fa_tensor top = view(buf_call(&op), FA_DTYPE_F32, 4, sh4, ost);
    const fa_tensor tlp = view(buf_call(&lp), FA_DTYPE_F32, 3, sh4, lst);
    const fa_tensor tout = view(buf_call(&out), (fa_dtype)dt, 4, sh4, outst);
    const fa_tensor tlse = view(buf_call(&lse), FA_DTYPE_F32, 3, sh4, lsest);
    const fa_status st =
        fa_combine(NULL, NULL, n, &top, on, &tlp, ln, &tout, want_lse ? &tlse : NULL);
    CHECK_MSG(st == FA_OK, "fa_combine: %s: %s", fa_status_name(st), fa_last_error_message());
    buf_back(&out);
    buf_back(&lse);

    double *ref = malloc(sizeof(double) * (size_t)D), worst = 0.0;
    int64_t bad = 0, touched = 0;
    for (int64_t r = 0; r < rows && st == FA_OK; r++) {
        const int64_t h = r % H, s = r / H % S, b = r / H / S;
        double rl;
        ref_row(n, lp.host + b * lb + s * ls + h * lh, ln, op.host + b * ob + s * os + h * oh, on,
                od, D, ref, &rl);
        for (int64_t d = 0; d < D; d++) {
            const double got = tu_load(out.host, dt, b * oe_b + s * oe_s + h * oe_h + d);
            const double half_ulp =
                dt == FA_DTYPE_F32 ? 0.0 : fabs(ref[d]) * (dt == FA_DTYPE_F16 ? 0x1p-11 : 0x1p-8);
            const double tol = 1e-5 * fmax(1.0, fabs(ref[d])) + half_ulp;
            const int ok = isnan(ref[d]) ? isnan(got) : fabs(got - ref[d]) <= tol;
            if (!ok && bad++ < 3)
                CHECK_MSG(0, "row %lld col %lld: out %.9g, reference %.9g", (long long)r,
                          (long long)d, got, ref[d]);
            if (!isnan(ref[d]) && fabs(got - ref[d]) / fmax(1.0, fabs(ref[d])) > worst)
                worst = fabs(got - ref[d]) / fmax(1.0, fabs(ref[d]));
        }
        for (int64_t d = D; d < D + pad; d++) /* out's pad elements keep their NaN bytes */
            touched += !isnan(tu_load(out.host, dt, b * oe_b + s * oe_s + h * oe_h + d));
        const double gl = lse.host[(b * S + s) * H + h];
        if (want_lse) {
            const int ok = isnan(rl)   ? isnan(gl)
                           : isinf(rl) ? gl == rl
                                       : fabs(gl - rl) <= 1e-5 * fmax(1.0, fabs(rl));
            CHECK_MSG(ok, "row %lld: lse %.9g, reference %.9g", (long long)r, gl, rl);
        } else {
            CHECK_MSG(isnan(gl), "row %lld: lse written though not wanted", (long long)r);
        }
    }
    CHECK_MSG(touched == 0, "%lld pad elements of out written", (long long)touched);
    free(ref);
    buf_free(&op);
    buf_free(&lp);
    buf_free(&out);
    buf_free(&lse);
    CASE_END();
}

/* fa_forward over all Sk keys = fa_combine of fa_forward over key ranges [cuts[i], cuts[i+1]). */
static void split_case(int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D,
                       const int64_t *cuts, int64_t n, float softcap) {
    CASE_BEGIN("fa_forward over %lld keys = combine of %lld parts (B=%lld Sq=%lld H=%lld Hk=%lld "
               "D=%lld softcap=%g)",
               (long long)Sk, (long long)n, (long long)B, (long long)Sq, (long long)H,
               (long long)Hk, (long long)D, (double)softcap);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    buf q = buf_new((size_t)nq, 4), k = buf_new((size_t)nk, 4), v = buf_new((size_t)nk, 4);
    buf whole = buf_new((size_t)nq, 4), wl = buf_new((size_t)nl, 4);
    buf parts = buf_new((size_t)(n * nq), 4), pl = buf_new((size_t)(n * nl), 4);
    buf out = buf_new((size_t)nq, 4), lse = buf_new((size_t)nl, 4);
    for (int64_t i = 0; i < nq; i++)
        q.host[i] = (float)tu_normal();
    for (int64_t i = 0; i < nk; i++)
        k.host[i] = (float)tu_normal(), v.host[i] = (float)tu_normal();
    fa_params p;
    fa_params_init(&p);
    p.softcap = softcap;
    const int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
    const int64_t qst[4] = {Sq * H * D, H * D, D, 1}, kst[4] = {Sk * Hk * D, Hk * D, D, 1};
    const int64_t lst[3] = {H * Sq, Sq, 1};
    fa_tensor tq = view(buf_call(&q), FA_DTYPE_F32, 4, qs, qst);
    fa_tensor tk = view(buf_call(&k), FA_DTYPE_F32, 4, ks, kst);
    fa_tensor tv = view(buf_call(&v), FA_DTYPE_F32, 4, ks, kst);
    fa_tensor tw = view(buf_call(&whole), FA_DTYPE_F32, 4, qs, qst);
    fa_tensor twl = view(buf_call(&wl), FA_DTYPE_F32, 3, ls, lst);
    fa_status st = fa_forward(NULL, &p, &tq, &tk, &tv, &tw, &twl);
    CHECK_MSG(st == FA_OK, "fa_forward: %s", fa_last_error_message());
    char *pbase = buf_call(&parts), *plbase = buf_call(&pl);
    for (int64_t i = 0; i < n && st == FA_OK; i++) { /* part i: keys [cuts[i], cuts[i+1]) */
        const int64_t kpart[4] = {B, cuts[i + 1] - cuts[i], Hk, D};
        fa_tensor pk = tk, pv = tv;
        pk.shape[1] = pv.shape[1] = kpart[1];
        pk.data = (char *)tk.data + cuts[i] * Hk * D * 4;
        pv.data = (char *)tv.data + cuts[i] * Hk * D * 4;
        fa_tensor po = view(pbase + i * nq * 4, FA_DTYPE_F32, 4, qs, qst);
        fa_tensor plse = view(plbase + i * nl * 4, FA_DTYPE_F32, 3, ls, lst);
        st = fa_forward(NULL, &p, &tq, &pk, &pv, &po, &plse);
        CHECK_MSG(st == FA_OK, "fa_forward (part %lld): %s", (long long)i, fa_last_error_message());
    }
    /* lse of the forward is (B, H, Sq): as (B, S, H) its strides are (H·Sq, 1, Sq) */
    const int64_t lbsh[3] = {H * Sq, 1, Sq};
    fa_tensor cop = view(pbase, FA_DTYPE_F32, 4, qs, qst);
    fa_tensor clp = view(plbase, FA_DTYPE_F32, 3, qs, lbsh);
    fa_tensor cout = view(buf_call(&out), FA_DTYPE_F32, 4, qs, qst);
    fa_tensor clse = view(buf_call(&lse), FA_DTYPE_F32, 3, qs, lbsh);
    if (st == FA_OK) {
        st = fa_combine(NULL, NULL, n, &cop, nq, &clp, nl, &cout, &clse);
        CHECK_MSG(st == FA_OK, "fa_combine: %s", fa_last_error_message());
    }
    buf_back(&whole);
    buf_back(&wl);
    buf_back(&out);
    buf_back(&lse);
    double eo = 0.0, el = 0.0;
    for (int64_t i = 0; i < nq; i++)
        eo = fmax(eo, isnan(out.host[i]) ? INFINITY : fabs(out.host[i] - whole.host[i]));
    for (int64_t i = 0; i < nl; i++)
        el = fmax(el, isnan(lse.host[i]) ? INFINITY : fabs(lse.host[i] - wl.host[i]));
    CHECK_MSG(eo <= 2e-5 && el <= 2e-5, "combined vs whole: max |out diff| %.3g, |lse diff| %.3g",
              eo, el);
    buf *all[] = {&q, &k, &v, &whole, &wl, &parts, &pl, &out, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        buf_free(all[i]);
    CASE_END();
}

/* ---- fp32 out of the forward ----
 * A forward case: fixed length (lq NULL: B sequences of Sq queries and Sk keys) or varlen (lq, lk:
 * B lengths, with 2 rows before the first sequence and 3 after the last in q, k, v and out, which
 * the call must write as 0). */
typedef struct fwdcfg {
    int64_t B, Sq, Sk, H, Hk, D; /* varlen: Sq, Sk are max_seqlen_q, max_seqlen_k */
    const int32_t *lq, *lk;
    int causal, wl, wr, alibi; /* alibi: slopes (H) */
    float softcap, dropout_p;
} fwdcfg;

enum { CANARY = 64 }; /* elements of NaN on each side of out */

/* Does this call's P·V take the probabilities rounded to the inputs' dtype? The CUDA tensor-core
 * kernel's does (fp16 and bf16), as do the CPU's bf16 products (refbf16, avx512 + avx512_bf16);
 * the CPU's other paths compute in fp32 throughout. */
static int p_rounded(int dt) {
    const char *info = fa_build_info();
    return g_cuda || (dt == FA_DTYPE_BF16 &&
                      (strstr(info, "in use: refbf16") || strstr(info, "+ avx512_bf16")));
}

/* The same call into a 16-bit out (dt) and into an fp32 one, both NaN-poisoned with canaries:
 *  - the fp32 out rounded to dt equals the 16-bit out bit for bit (it is the value before that
 *    rounding), the two lse are equal, the canaries stay NaN, and varlen rows outside every
 *    sequence are 0;
 *  - without dropout, against the fp64 reference on the same (16-bit) inputs: where P·V is
 *    computed on fp32 P, the error is that of fp32 arithmetic on exact fp32 inputs, the bound of
 *    fp32 inputs (tu_check_attention: 1e-5 max(1, max|ref|), plus 8·2^-24·max|lse| for the
 *    scores' rounding), and it must be below half the 16-bit out's error (its rounding of the
 *    output is gone). Where P is rounded to dt (unit roundoff u: 2^-8 bf16, 2^-11 fp16), each
 *    element may also err by u Σ p_j |v_j| / l (the reference run on |v|), plus for fp16 P
 *    below 2^-14 (subnormal) 2^-25 Σ|v_j| / l <= Sk 2^-25 max|v|; that term can be as large as
 *    the output's own rounding, so the half rule applies only to the fp32-P paths. */
static void f32out_case(int dt, const fwdcfg *c) {
    const int varlen = c->lq != NULL;
    CASE_BEGIN("fp32 out of %s %s: B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld causal=%d "
               "window=(%d,%d) softcap=%g alibi=%d dropout=%g",
               tu_dtype_name(dt), varlen ? "fa_varlen_forward" : "fa_forward", (long long)c->B,
               (long long)c->Sq, (long long)c->Sk, (long long)c->H, (long long)c->Hk,
               (long long)c->D, c->causal, c->wl, c->wr, (double)c->softcap, c->alibi,
               (double)c->dropout_p);
    const int64_t B = c->B, H = c->H, Hk = c->Hk, D = c->D;
    int32_t cu_q[9], cu_k[9]; /* B <= 8 */
    cu_q[0] = varlen ? 2 : 0, cu_k[0] = varlen ? 2 : 0;
    for (int64_t b = 0; b < B; b++) {
        cu_q[b + 1] = cu_q[b] + (varlen ? c->lq[b] : (int32_t)c->Sq);
        cu_k[b + 1] = cu_k[b] + (varlen ? c->lk[b] : (int32_t)c->Sk);
    }
    const int64_t tq = cu_q[B] + (varlen ? 3 : 0), tk = cu_k[B] + (varlen ? 3 : 0);
    const int64_t nq = tq * H * D, nk = tk * Hk * D, nl = tq * H;
    const size_t es = tu_dtype_size(dt);
    const size_t nk1 = (size_t)(nk > 0 ? nk : 1); /* a device buffer of 0 bytes is an error */
    buf q = buf_new((size_t)nq, es), k = buf_new(nk1, es), v = buf_new(nk1, es);
    buf o16 = buf_new((size_t)(nq + 2 * CANARY), es), o32 = buf_new((size_t)(nq + 2 * CANARY), 4);
    buf l16 = buf_new((size_t)nl, 4), l32 = buf_new((size_t)nl, 4), sl = buf_new((size_t)H, 4);
    double *qd = malloc(sizeof(double) * (size_t)(nq + 2 * nk)), *kd = qd + nq, *vd = kd + nk;
    /* ref, rabs: the reference's out on v and on |v|; lref: one sequence's lse; va: |v| */
    double *ref = malloc(sizeof(double) * (size_t)(2 * nq + nl)), *rabs = ref + nq;
    double *lref = rabs + nq, *va = malloc(sizeof(double) * (size_t)nk), slopes[16];
    if (!qd || !ref || !va)
        abort();
    for (int64_t i = 0; i < nq; i++) {
        tu_store(q.host, dt, i, tu_normal());
        qd[i] = tu_load(q.host, dt, i);
    }
    for (int64_t i = 0; i < nk; i++) {
        tu_store(k.host, dt, i, tu_normal());
        tu_store(v.host, dt, i, tu_normal());
        kd[i] = tu_load(k.host, dt, i), vd[i] = tu_load(v.host, dt, i), va[i] = fabs(vd[i]);
    }
    for (int64_t h = 0; h < H; h++)
        sl.host[h] = (float)(0.25 / (double)(h + 1)), slopes[h] = sl.host[h];

    fa_params p;
    fa_params_init(&p);
    p.causal = c->causal, p.window_left = c->wl, p.window_right = c->wr, p.softcap = c->softcap;
    p.dropout_p = c->dropout_p, p.dropout_seed = 7;
    const int64_t n1[1] = {H}, s1[1] = {1};
    if (c->alibi)
        p.alibi_slopes = view(buf_call(&sl), FA_DTYPE_F32, 1, n1, s1);
    /* fixed: (B, S, H, D); varlen: (total, H, D) */
    const int64_t qs[4] = {B, c->Sq, H, D}, ks[4] = {B, c->Sk, Hk, D};
    const int64_t qst[4] = {c->Sq * H * D, H * D, D, 1}, kst[4] = {c->Sk * Hk * D, Hk * D, D, 1};
    const int64_t vqs[3] = {tq, H, D}, vks[3] = {tk, Hk, D}, vqst[3] = {H * D, D, 1};
    const int64_t vkst[3] = {Hk * D, D, 1}, ls[3] = {B, H, c->Sq}, lst[3] = {H * c->Sq, c->Sq, 1};
    const int64_t vls[2] = {H, tq}, vlst[2] = {tq, 1}, cus[1] = {B + 1};
    void *qb = buf_call(&q), *kb = buf_call(&k), *vb = buf_call(&v);
    const fa_tensor tq_ = varlen ? view(qb, dt, 3, vqs, vqst) : view(qb, dt, 4, qs, qst);
    const fa_tensor tk_ = varlen ? view(kb, dt, 3, vks, vkst) : view(kb, dt, 4, ks, kst);
    const fa_tensor tv_ = varlen ? view(vb, dt, 3, vks, vkst) : view(vb, dt, 4, ks, kst);
    const fa_tensor cq = fa_tensor_contiguous(cu_q, FA_DTYPE_I32, 1, cus);
    const fa_tensor ck = fa_tensor_contiguous(cu_k, FA_DTYPE_I32, 1, cus);
    fa_status st = FA_OK;
    for (int pass = 0; pass < 2 && st == FA_OK; pass++) { /* 16-bit out, then fp32 */
        buf *o = pass ? &o32 : &o16, *l = pass ? &l32 : &l16;
        const int odt = pass ? FA_DTYPE_F32 : dt;
        char *od = (char *)buf_call(o) + CANARY * (pass ? 4 : es);
        const fa_tensor to = varlen ? view(od, odt, 3, vqs, vqst) : view(od, odt, 4, qs, qst);
        const fa_tensor tl = varlen ? view(buf_call(l), FA_DTYPE_F32, 2, vls, vlst)
                                    : view(buf_call(l), FA_DTYPE_F32, 3, ls, lst);
        st = varlen
                 ? fa_varlen_forward(NULL, &p, &tq_, &tk_, &tv_, &cq, &ck, c->Sq, c->Sk, &to, &tl)
                 : fa_forward(NULL, &p, &tq_, &tk_, &tv_, &to, &tl);
        CHECK_MSG(st == FA_OK, "%s out: %s: %s", tu_dtype_name(odt), fa_status_name(st),
                  fa_last_error_message());
        buf_back(o);
        buf_back(l);
    }
    const void *out16 = (const char *)o16.host + CANARY * es;
    const float *out32 = o32.host + CANARY;
    int64_t canary_bad = 0, bad_round = 0, bad_lse = 0, bad_outside = 0;
    for (int64_t i = 0; i < CANARY && st == FA_OK; i++)
        canary_bad += !isnan(tu_load(o16.host, dt, i)) +
                      !isnan(tu_load(o16.host, dt, nq + CANARY + i)) + !isnan(o32.host[i]) +
                      !isnan(o32.host[nq + CANARY + i]);
    CHECK_MSG(canary_bad == 0, "%lld canary elements around out written", (long long)canary_bad);
    for (int64_t i = 0; i < nq && st == FA_OK; i++) {
        const uint16_t got16 = ((const uint16_t *)out16)[i];
        const uint16_t r16 =
            dt == FA_DTYPE_BF16 ? tu_bf16_from_double(out32[i]) : tu_f16_from_double(out32[i]);
        const int nans = isnan(out32[i]) && isnan(tu_load(out16, dt, i));
        if (r16 != got16 && !nans && bad_round++ < 3)
            CHECK_MSG(0, "element %lld: fp32 out %.9g rounds to %#x, the 16-bit out is %#x",
                      (long long)i, out32[i], r16, got16);
        const int64_t row = i / (H * D);
        const int outside = row < cu_q[0] || row >= cu_q[B];
        bad_outside += outside && (out32[i] != 0.0f || tu_load(out16, dt, i) != 0.0);
    }
    CHECK_MSG(bad_outside == 0, "%lld elements outside every sequence not 0",
              (long long)bad_outside);
    for (int64_t i = 0; i < nl && st == FA_OK; i++)
        bad_lse += memcmp(&l16.host[i], &l32.host[i], 4) != 0;
    CHECK_MSG(bad_lse == 0, "%lld lse values differ between the two calls", (long long)bad_lse);

    if (c->dropout_p == 0.0f && st == FA_OK) {
        /* the reference per sequence, (b, i, h, d) at row cu_q[b] + i; out and on |v| */
        for (int64_t i = 0; i < nq; i++)
            ref[i] = rabs[i] = 0.0;
        double max_lse = 0.0, maxref = 0.0, maxv = 0.0;
        for (int64_t i = 0; i < nk; i++)
            maxv = fmax(maxv, va[i]);
        for (int64_t b = 0; b < B; b++) {
            ref_problem rp;
            memset(&rp, 0, sizeof rp);
            rp.B = 1, rp.Sq = cu_q[b + 1] - cu_q[b], rp.Sk = cu_k[b + 1] - cu_k[b];
            rp.H = H, rp.Hk = Hk, rp.D = D;
            rp.scale = 1.0 / sqrt((double)D), rp.causal = c->causal;
            rp.window_left = c->wl, rp.window_right = c->wr, rp.softcap = c->softcap;
            rp.alibi = c->alibi ? slopes : NULL;
            const int64_t qo = cu_q[b] * H * D, ko = cu_k[b] * Hk * D;
            ref_attention_forward(&rp, qd + qo, kd + ko, vd + ko, ref + qo, lref);
            ref_attention_forward(&rp, qd + qo, kd + ko, va + ko, rabs + qo, NULL);
            for (int64_t r = 0; r < H * rp.Sq; r++)
                if (isfinite(lref[r]))
                    max_lse = fmax(max_lse, fabs(lref[r]));
        }
        for (int64_t i = 0; i < nq; i++)
            maxref = fmax(maxref, fabs(ref[i]));
        const double scale1 = fmax(1.0, maxref);
        const double tol = 1e-5 * scale1 + 8.0 * 0x1p-24 * max_lse * scale1;
        const int pr = p_rounded(dt);
        const double u = dt == FA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
        const double sub = dt == FA_DTYPE_F16 ? (double)c->Sk * 0x1p-25 * maxv : 0.0;
        double e16 = 0.0, e32 = 0.0, excess = 0.0; /* excess: max e / its bound */
        int64_t worst = 0;
        for (int64_t i = 0; i < nq; i++) {
            const double d32 = fabs(out32[i] - ref[i]), d16 = fabs(tu_load(out16, dt, i) - ref[i]);
            const double bound = tol + (pr ? u * rabs[i] + sub : 0.0);
            e16 = isnan(d16) ? INFINITY : fmax(e16, d16);
            e32 = isnan(d32) ? INFINITY : fmax(e32, d32);
            if (!(d32 <= excess * bound))
                excess = isnan(d32) ? INFINITY : d32 / bound, worst = i;
        }
        CHECK_MSG(excess <= 1.0,
                  "fp32 out error %.3g at element %lld (%.9g, reference %.9g) is "
                  "%.3g times its bound (P %s)",
                  fabs(out32[worst] - ref[worst]), (long long)worst, out32[worst], ref[worst],
                  excess, pr ? "rounded" : "fp32");
        if (!pr) /* both 0 only where every row is exact (Sk = 0) */
            CHECK_MSG(e32 < 0.5 * e16 || (e16 == 0.0 && e32 == 0.0),
                      "fp32 out error %.3g not below half the %s out's %.3g", e32,
                      tu_dtype_name(dt), e16);
        printf("  max|out - ref|: fp32 out %.3g, %s out %.3g (P %s; fp32 bound %.3g)\n", e32,
               tu_dtype_name(dt), e16, pr ? "rounded" : "fp32", tol);
    }
    free(qd);
    free(ref);
    free(va);
    buf *all[] = {&q, &k, &v, &o16, &o32, &l16, &l32, &sl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        buf_free(all[i]);
    CASE_END();
}

/* fp32 out where out must stay q's dtype, or with an out of neither dtype: FA_ERR_DTYPE naming
 * out, nothing written. */
static void f32out_errors(void) {
    static const struct {
        int q, out, backward;
        const char *what;
    } cases[] = {{FA_DTYPE_BF16, FA_DTYPE_F16, 0, "bf16 q, f16 out"},
                 {FA_DTYPE_F16, FA_DTYPE_BF16, 0, "f16 q, bf16 out"},
                 {FA_DTYPE_F32, FA_DTYPE_F16, 0, "f32 q, f16 out"},
                 {FA_DTYPE_F16, FA_DTYPE_I32, 0, "f16 q, i32 out"},
                 {FA_DTYPE_BF16, FA_DTYPE_F32, 1, "fa_backward: bf16 q, f32 out"}};
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        CASE_BEGIN("fp32 out errors: %s", cases[t].what);
        const int64_t sh[4] = {1, 4, 2, 8}, st4[4] = {64, 16, 8, 1}, ls[3] = {1, 2, 4};
        const int64_t lst[3] = {8, 4, 1};
        const int qdt = cases[t].q, odt = cases[t].out;
        const size_t qes = tu_dtype_size(qdt), oes = tu_dtype_size(odt);
        buf q = buf_new(64, qes), k = buf_new(64, qes), v = buf_new(64, qes), o = buf_new(64, oes);
        buf l = buf_new(8, 4), g = buf_new(3 * 64 + 64, qes);
        for (int i = 0; i < 64; i++) {
            tu_store(q.host, qdt, i, tu_normal());
            tu_store(k.host, qdt, i, tu_normal());
            tu_store(v.host, qdt, i, tu_normal());
        }
        const fa_tensor tq = view(buf_call(&q), qdt, 4, sh, st4);
        const fa_tensor tk = view(buf_call(&k), qdt, 4, sh, st4);
        const fa_tensor tv = view(buf_call(&v), qdt, 4, sh, st4);
        const fa_tensor to = view(buf_call(&o), odt, 4, sh, st4);
        const fa_tensor tl = view(buf_call(&l), FA_DTYPE_F32, 3, ls, lst);
        char *gd = buf_call(&g);
        fa_status st;
        if (cases[t].backward) {
            for (int i = 0; i < 8; i++)
                l.host[i] = 0.0f;
            const fa_tensor tl0 = view(buf_call(&l), FA_DTYPE_F32, 3, ls, lst);
            const fa_tensor tdo = view(gd, qdt, 4, sh, st4);
            const fa_tensor tdq = view(gd + 64 * qes, qdt, 4, sh, st4);
            const fa_tensor tdk = view(gd + 128 * qes, qdt, 4, sh, st4);
            const fa_tensor tdv = view(gd + 192 * qes, qdt, 4, sh, st4);
            st = fa_backward(NULL, NULL, &tq, &tk, &tv, &to, &tdo, &tl0, &tdq, &tdk, &tdv);
        } else {
            st = fa_forward(NULL, NULL, &tq, &tk, &tv, &to, &tl);
        }
        const char *msg = fa_last_error_message();
        CHECK_MSG(st == FA_ERR_DTYPE, "status %s, expected FA_ERR_DTYPE: %s", fa_status_name(st),
                  msg);
        CHECK_MSG(tu_contains_word(msg, "out"), "message \"%s\" does not name out", msg);
        buf_back(&o);
        buf_back(&l);
        buf_back(&g);
        int64_t written = 0;
        for (int i = 0; i < 64; i++)
            written += (odt == FA_DTYPE_I32 ? ((int32_t *)o.host)[i] != -1
                                            : !isnan(tu_load(o.host, odt, i)));
        for (int i = 0; i < 8 && !cases[t].backward; i++)
            written += !isnan(l.host[i]);
        for (int i = 64; i < 256 && cases[t].backward; i++) /* dq, dk, dv */
            written += !isnan(tu_load(g.host, qdt, i));
        CHECK_MSG(written == 0, "%lld elements written by a failing call", (long long)written);
        buf *all[] = {&q, &k, &v, &o, &l, &g};
        for (size_t i = 0; i < 6; i++)
            buf_free(all[i]);
        CASE_END();
    }
}

/* Error cases: a valid call (n = 2, (2, 3, 2, 8), fp32) with one thing broken. */
typedef struct env {
    buf op, lp, out, lse;
    fa_tensor top, tlp, tout, tlse;
    int64_t n, ops, lps;
    fa_params params;
    const fa_params *pp;
} env;

static void env_init(env *e) {
    memset(e, 0, sizeof *e);
    const int64_t sh[4] = {2, 3, 2, 8}, st4[4] = {48, 16, 8, 1}, st3[3] = {6, 2, 1};
    e->op = buf_new(2 * 96, 4), e->lp = buf_new(2 * 12, 4);
    e->out = buf_new(96, 4), e->lse = buf_new(12, 4);
    for (int i = 0; i < 2 * 96; i++)
        e->op.host[i] = (float)tu_normal();
    for (int i = 0; i < 2 * 12; i++)
        e->lp.host[i] = (float)tu_normal();
    e->top = view(buf_call(&e->op), FA_DTYPE_F32, 4, sh, st4);
    e->tlp = view(buf_call(&e->lp), FA_DTYPE_F32, 3, sh, st3);
    e->tout = view(buf_call(&e->out), FA_DTYPE_F32, 4, sh, st4);
    e->tlse = view(buf_call(&e->lse), FA_DTYPE_F32, 3, sh, st3);
    e->n = 2, e->ops = 96, e->lps = 12;
    fa_params_init(&e->params);
    e->pp = &e->params;
}

static void env_expect(env *e, const char *desc, fa_status want, const char *word) {
    CASE_BEGIN("fa_combine error: %s", desc);
    const fa_status st =
        fa_combine(NULL, e->pp, e->n, &e->top, e->ops, &e->tlp, e->lps, &e->tout, &e->tlse);
    const char *msg = fa_last_error_message();
    CHECK_MSG(st == want, "status %s, expected %s: %s", fa_status_name(st), fa_status_name(want),
              msg);
    CHECK_MSG(tu_contains_word(msg, word), "message \"%s\" does not name %s", msg, word);
    buf_back(&e->out);
    buf_back(&e->lse);
    int64_t written = 0;
    for (int i = 0; i < 96; i++)
        written += !isnan(e->out.host[i]);
    for (int i = 0; i < 12; i++)
        written += !isnan(e->lse.host[i]);
    CHECK_MSG(written == 0, "%lld elements written by a failing call", (long long)written);
    buf *all[] = {&e->op, &e->lp, &e->out, &e->lse};
    for (int i = 0; i < 4; i++)
        buf_free(all[i]);
    CASE_END();
}

#define EERR(desc, want, word, ...)                                                                \
    do {                                                                                           \
        env e;                                                                                     \
        env_init(&e);                                                                              \
        { __VA_ARGS__; }                                                                           \
        env_expect(&e, desc, want, word);                                                          \
    } while (0)

static void errors(void) {
    EERR("n = 0", FA_ERR_VALUE, "n", e.n = 0);
    EERR("out_partial fp16", FA_ERR_DTYPE, "out_partial", e.top.dtype = FA_DTYPE_F16);
    EERR("lse_partial shape[2] = 1", FA_ERR_SHAPE, "lse_partial", e.tlp.shape[2] = 1);
    EERR("out shape[3] = 4", FA_ERR_SHAPE, "out", e.tout.shape[3] = 4);
    EERR("lse i32", FA_ERR_DTYPE, "lse", e.tlse.dtype = FA_DTYPE_I32);
    EERR("out_partial rank 3", FA_ERR_RANK, "out_partial", e.top.ndim = 3);
    EERR("negative out_partial stride", FA_ERR_STRIDE, "out_partial_stride", e.ops = -96);
    EERR("out over the second partial", FA_ERR_OVERLAP, "out",
         e.tout.data = (char *)e.top.data + 96 * 4);
    EERR("lse over out", FA_ERR_OVERLAP, "lse", e.tlse.data = e.tout.data);
    EERR("out on the other device", FA_ERR_DEVICE, "out",
         e.tout.device = g_cuda ? FA_DEVICE_CPU : FA_DEVICE_CUDA);
    EERR("NULL out_partial", FA_ERR_NULL_POINTER, "out_partial", e.top.data = NULL);
    EERR("params.struct_size 3", FA_ERR_STRUCT_SIZE, "struct_size", e.params.struct_size = 3);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--cuda") == 0) {
        int32_t ndev = 0;
        if (fa_device_count(FA_DEVICE_CUDA, &ndev) != FA_OK || ndev == 0) {
            printf("SKIP: no CUDA device: %s\n", fa_last_error_message());
            return 77;
        }
        g_cuda = 1;
    }
    tu_seed_init(g_cuda ? "test_combine --cuda" : "test_combine");
    const int dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        merge_case(1, 1, 3, 2, 8, dts[t], 1, 1);
        merge_case(2, 2, 5, 3, 64, dts[t], 0, 1);
        merge_case(3, 1, 7, 4, 7, dts[t], 1, 0);
        merge_case(8, 2, 4, 2, 130, dts[t], 0, 1);
        merge_case(33, 1, 3, 2, 256, dts[t], 1, 1);
    }
    merge_case(5, 1, 1, 1, 1, FA_DTYPE_F32, 0, 1);
    const int64_t c3[4] = {0, 30, 64, 100}, c2[3] = {0, 1, 17}, c5[6] = {0, 9, 10, 40, 41, 77};
    split_case(2, 37, 100, 4, 2, 32, c3, 3, 0.0f);
    split_case(1, 5, 17, 2, 1, 64, c2, 2, 0.0f);
    split_case(2, 3, 77, 6, 3, 40, c5, 5, 4.0f);
    errors();
    /* fp32 out of the forward: fixed length and varlen (lengths with an empty sequence and
     * rows before and after every sequence), causal, window, softcap, GQA, ALiBi, Sk = 0, rows
     * that see no key, dropout (rounding check only); on CUDA D = 36 and 20 take stage 1 */
    static const int32_t lq[3] = {37, 0, 90}, lk[3] = {50, 7, 90};
    const fwdcfg fcs[] = {
        /* B, Sq, Sk, H, Hk, D, lq, lk, causal, wl, wr, alibi, softcap, dropout_p */
        {2, 64, 96, 4, 2, 64, NULL, NULL, 1, -1, -1, 0, 0.0f, 0.0f},
        {1, 80, 120, 2, 2, 36, NULL, NULL, 0, 30, 10, 0, 5.0f, 0.0f},
        {2, 70, 70, 3, 1, 128, NULL, NULL, 1, -1, -1, 1, 0.0f, 0.0f},
        {3, 90, 90, 4, 2, 32, lq, lk, 1, -1, -1, 0, 0.0f, 0.0f},
        {3, 90, 90, 2, 1, 72, lq, lk, 0, 20, 5, 1, 3.0f, 0.0f},
        {1, 40, 20, 2, 2, 16, NULL, NULL, 1, -1, -1, 0, 0.0f, 0.0f},
        {2, 5, 0, 2, 1, 8, NULL, NULL, 0, -1, -1, 0, 0.0f, 0.0f},
        {1, 33, 47, 2, 2, 20, NULL, NULL, 0, -1, -1, 0, 0.0f, 0.3f},
    };
    for (int t = 1; t < 3; t++)
        for (size_t i = 0; i < sizeof fcs / sizeof *fcs; i++)
            f32out_case(dts[t], &fcs[i]);
    f32out_errors();
    return TEST_REPORT();
}
