/* SPDX-License-Identifier: MIT */
/*
 * test_kvcache_q8.c — fa_forward_kvcache over 8-bit KV caches (int8, fp8 e4m3fn, fp8 e5m2; a
 * scale per token or per (batch, KV head)) against the fp64 reference.
 *
 * Each case draws a cache's content in fp64, quantizes it with this file's own quantizer (the
 * rule of include/flashattn.h, fa_kvcache.k_scale: int8 by nearbyint, fp8 by the nearest of the
 * format's 256 decoded codes, ties to the even code) into a contiguous (B_cache, S_cache, Hk, D)
 * cache or a paged one behind a shuffled block table, and calls the library with q (and k_new,
 * v_new, appended and quantized by the library) in fp32, fp16 or bf16. Checks:
 *  - the append: without rotary, the stored bytes and scales equal this file's quantization of
 *    the new rows, bit for bit; with rotary (rows rotated in fp32 by the library, in fp64 here),
 *    each dequantized value within half a quantization step (plus fp32 noise) of the rotated row;
 *    every other byte of both caches and their scales untouched;
 *  - out and lse against ref_attention_forward over the cache as it is after the call,
 *    dequantized in fp64 (so only the kernels' own rounding counts: tu_check_attention's
 *    tolerances, as test_kvcache);
 *  - the format's error: the reference over the dequantized cache against the reference over
 *    the unquantized values (both fp64), reported per format (not a check of the library: the
 *    accuracy table of `flashattn bench-decode --accuracy` measures it at serving sizes);
 *  - bitwise equality of out and lse between the contiguous and the paged layout and between
 *    1 and 2 threads over a cache long enough to be split (3000 keys; 1500 under qemu);
 *  - a new key with a NaN: its row's scale is NaN and the rows that see it are NaN;
 *  - every error (missing or misshapen scales, scales with a 16-bit cache, a fixed scale <= 0 or
 *    NaN, mixed 8-bit dtypes, 8-bit q, 8-bit tensors in fa_forward) with nothing written, and a
 *    caller's fa_kvcache from before the scales (struct_size without them) accepted.
 * Cache positions outside [leftpad, cache_seqlens + S_new) hold NaN scales, so a stray read
 * shows up in out.
 */
#include "flashattn.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

#include <stddef.h>

#define MAXB 4

typedef struct qcase {
    int qdt, cdt, token;          /* q's dtype, the caches' 8-bit dtype, scales per token */
    int64_t B, Sq, H, Hk, D, cap; /* cap: positions per cache row */
    int64_t page;                 /* 0: contiguous, else the page size */
    int64_t S_new;                /* new keys appended by the call */
    int causal, wl, wr;
    double softcap;
    int rotary;         /* 0: none, 1: interleaved, 2: GPT-NeoX, rotary_dim = D/2 */
    int leftpad;        /* contiguous only: each batch starts at b */
    int64_t lens[MAXB]; /* cache_seqlens before the append */
    int threads;        /* 0: the library's default context */
} qcase;

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

/* ---- this file's 8-bit formats, from their definitions ---- */

static double qmax(int cdt) {
    return cdt == FA_DTYPE_I8 ? 127.0 : cdt == FA_DTYPE_F8_E4M3 ? 448.0 : 57344.0;
}

/* The value of code c: sign, exponent bits E with bias, mantissa bits M. */
static double f8_value(int cdt, int c) {
    const int M = cdt == FA_DTYPE_F8_E4M3 ? 3 : 2, bias = cdt == FA_DTYPE_F8_E4M3 ? 7 : 15;
    const int e = (c & 0x7f) >> M, m = c & ((1 << M) - 1), emax = (1 << (7 - M)) - 1;
    if (cdt == FA_DTYPE_F8_E4M3 && e == emax && m == (1 << M) - 1)
        return NAN;
    if (cdt == FA_DTYPE_F8_E5M2 && e == emax)
        return m ? NAN : (c & 0x80 ? -INFINITY : INFINITY);
    const double v =
        e ? ldexp(1.0 + m / (double)(1 << M), e - bias) : ldexp(m / (double)(1 << M), 1 - bias);
    return c & 0x80 ? -v : v;
}

static double stored_value(int cdt, uint8_t c) {
    return cdt == FA_DTYPE_I8 ? (double)(int8_t)c : f8_value(cdt, c);
}

/* y (an fp32 value) into the format: nearest even, saturating at +-Q; NaN: int8 0, fp8 NaN. */
static uint8_t quantize(int cdt, float y) {
    if (cdt == FA_DTYPE_I8) {
        if (isnan(y))
            return 0;
        const double r = nearbyint((double)y);
        return (uint8_t)(int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
    }
    if (isnan(y))
        return cdt == FA_DTYPE_F8_E4M3 ? 0x7f : 0x7e;
    /* the finite positive codes in increasing order of value: the nearest by bisection (the
     * largest code at or below a, then a against the midpoint to the next), ties to even */
    static double val[2][0x80];
    static int top[2];
    const int f = cdt == FA_DTYPE_F8_E5M2;
    if (!top[f])
        for (int c = 0; c < 0x80 && isfinite(f8_value(cdt, c)); c++)
            val[f][top[f] = c] = f8_value(cdt, c);
    const double a = fmin(fabs((double)y), qmax(cdt));
    int lo = 0, hi = top[f]; /* val[lo] <= a < val[hi], or a is the largest value */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (val[f][mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    int best = lo;
    if (a > val[f][lo]) {
        const double mid = (val[f][lo] + val[f][hi]) / 2; /* exact: both have few bits */
        best = a > mid || (a == mid && !(hi & 1)) ? hi : lo;
    }
    return (uint8_t)(best | (y < 0 ? 0x80 : 0));
}

/* A row x[0..n) (fp32 values) into bytes with the per-token rule; returns the scale. */
static float quantize_row(int cdt, const float *x, int64_t n, uint8_t *dst) {
    float mx = 0.0f;
    int finite = 1;
    for (int64_t t = 0; t < n; t++) {
        finite &= isfinite(x[t]) != 0;
        mx = fabsf(x[t]) > mx ? fabsf(x[t]) : mx;
    }
    const float s = finite ? mx / (float)qmax(cdt) : NAN;
    for (int64_t t = 0; t < n; t++)
        dst[t] = s > 0.0f ? quantize(cdt, x[t] / s) : 0;
    return s;
}

/* ---- one call ---- */

typedef struct qbufs {
    uint8_t *kc, *vc;    /* caches: rows of D bytes */
    float *ks, *vs;      /* scales: per token [rows·Hk] or per (b, hk) [B·Hk] */
    int64_t rows, pages; /* positions in the cache buffers; pages (paged) */
    int32_t *bt;         /* block table [B, max_pages] */
    int64_t max_pages;
} qbufs;

/* The buffer row (position index into kc/ks, heads apart) of batch b's position s. */
static int64_t cache_row(const qcase *c, const qbufs *u, int64_t b, int64_t s) {
    if (!c->page)
        return b * c->cap + s;
    return (int64_t)u->bt[b * u->max_pages + s / c->page] * c->page + s % c->page;
}

typedef struct qresult {
    double *out, *lse; /* (B, Sq, H, D), (B, H, Sq) */
    uint8_t *kc, *vc;  /* the caches after the call, in logical order [B, cap, Hk, D] */
    float *ks, *vs;    /* their scales [B, cap, Hk] (per (b, hk): repeated) */
    fa_status st;
} qresult;

static void qresult_free(qresult *r) {
    free(r->out), free(r->lse), free(r->kc), free(r->vc), free(r->ks), free(r->vs);
}

/* Everything a case draws, in fp64 / fp32. */
typedef struct qdata {
    double *q;           /* (B, Sq, H, D), rounded to qdt */
    float *knew, *vnew;  /* (B, S_new, Hk, D), rounded to qdt */
    double *kx, *vx;     /* the exact cache values [B, cap, Hk, D] (positions < lens) */
    uint8_t *kq, *vq;    /* their quantization */
    float *kss, *vss;    /* scales [B, cap, Hk], or the fixed ones [B, Hk] */
    double *cosr, *sinr; /* rotary tables [ro, D/4] */
    int64_t ro;
} qdata;

static void qdata_free(qdata *d) {
    free(d->q), free(d->knew), free(d->vnew), free(d->kx), free(d->vx), free(d->kq), free(d->vq);
    free(d->kss), free(d->vss), free(d->cosr), free(d->sinr);
}

static float round_q(int qdt, double x) { return (float)tu_round_fn(qdt)(x); }

static void draw(const qcase *c, qdata *d) {
    const int64_t B = c->B, Hk = c->Hk, D = c->D, cap = c->cap;
    d->q = dalloc(B * c->Sq * c->H * D);
    for (int64_t i = 0; i < B * c->Sq * c->H * D; i++)
        d->q[i] = round_q(c->qdt, tu_normal());
    const int64_t nn = B * c->S_new * Hk * D;
    d->knew = malloc(sizeof(float) * (size_t)(nn + 1));
    d->vnew = malloc(sizeof(float) * (size_t)(nn + 1));
    for (int64_t i = 0; i < nn; i++) {
        d->knew[i] = round_q(c->qdt, tu_normal());
        d->vnew[i] = round_q(c->qdt, tu_normal());
    }
    d->kx = dalloc(B * cap * Hk * D);
    d->vx = dalloc(B * cap * Hk * D);
    d->kq = calloc((size_t)(B * cap * Hk * D), 1);
    d->vq = calloc((size_t)(B * cap * Hk * D), 1);
    d->kss = malloc(sizeof(float) * (size_t)(B * cap * Hk));
    d->vss = malloc(sizeof(float) * (size_t)(B * cap * Hk));
    double fixed_max = 0.0;
    for (int64_t i = 0; i < B * cap * Hk * D; i++) {
        d->kx[i] = tu_normal();
        d->vx[i] = tu_normal();
        fixed_max = fmax(fixed_max, fmax(fabs(d->kx[i]), fabs(d->vx[i])));
    }
    for (int64_t i = 0; i < nn; i++)
        fixed_max = fmax(fixed_max, fmax(fabs(d->knew[i]), fabs(d->vnew[i])));
    /* fixed scales: one per (b, hk), a little above the data's reach (rotation keeps norms) */
    for (int64_t i = 0; i < B * Hk; i++) {
        d->kss[i] = (float)(fixed_max * (1.5 + tu_uniform()) / qmax(c->cdt));
        d->vss[i] = (float)(fixed_max * (1.5 + tu_uniform()) / qmax(c->cdt));
    }
    float row[256];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < cap; s++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t r = (b * cap + s) * Hk + h;
                for (int t = 0; t < 2; t++) {
                    double *x = (t ? d->vx : d->kx) + r * D;
                    uint8_t *q = (t ? d->vq : d->kq) + r * D;
                    float *sc = t ? d->vss : d->kss;
                    for (int64_t e = 0; e < D; e++)
                        row[e] = (float)x[e];
                    if (c->token) {
                        sc[r] = quantize_row(c->cdt, row, D, q);
                    } else {
                        const float f = sc[b * Hk + h];
                        for (int64_t e = 0; e < D; e++)
                            q[e] = quantize(c->cdt, row[e] / f);
                    }
                }
            }
    d->ro = 0, d->cosr = d->sinr = NULL;
    if (c->rotary) {
        int64_t need = 0;
        for (int64_t b = 0; b < B; b++)
            need = c->lens[b] + c->S_new + c->Sq > need ? c->lens[b] + c->S_new + c->Sq : need;
        d->ro = need;
        d->cosr = dalloc(need * (D / 4));
        d->sinr = dalloc(need * (D / 4));
        for (int64_t i = 0; i < need * (D / 4); i++) {
            const double a = tu_uniform() * 6.283185307179586;
            d->cosr[i] = (float)cos(a);
            d->sinr[i] = (float)sin(a);
        }
    }
}

/* x (D) rotated in fp64 at table row pos. */
static void rotate64(const qcase *c, const qdata *d, int64_t pos, double *x) {
    const int64_t half = c->D / 4, rd = c->D / 2;
    for (int64_t t = 0; t < half; t++) {
        const int64_t a = c->rotary == 1 ? 2 * t : t, b = c->rotary == 1 ? 2 * t + 1 : t + rd / 2;
        const double co = d->cosr[pos * half + t], si = d->sinr[pos * half + t];
        const double x1 = x[a], x2 = x[b];
        x[a] = x1 * co - x2 * si;
        x[b] = x1 * si + x2 * co;
    }
}

/* Lays the data out (contiguous or paged), calls the library and reads everything back. */
static qresult run(const qcase *c, const qdata *d, int paged_as_given, fa_context *ctx) {
    const int64_t B = c->B, Hk = c->Hk, D = c->D, H = c->H, Sq = c->Sq, cap = c->cap;
    qcase cc = *c;
    if (!paged_as_given)
        cc.page = 0;
    qbufs u = {0};
    u.max_pages = cc.page ? (cap + cc.page - 1) / cc.page : 0;
    u.pages = B * u.max_pages + 3; /* 3 unused pages */
    u.rows = cc.page ? u.pages * cc.page : B * cap;
    u.kc = malloc((size_t)(u.rows * Hk * D));
    u.vc = malloc((size_t)(u.rows * Hk * D));
    u.ks = malloc(sizeof(float) * (size_t)(u.rows * Hk));
    u.vs = malloc(sizeof(float) * (size_t)(u.rows * Hk));
    for (int64_t i = 0; i < u.rows * Hk * D; i++)
        u.kc[i] = u.vc[i] = (uint8_t)tu_randint(0, 255);
    for (int64_t i = 0; i < u.rows * Hk; i++)
        u.ks[i] = u.vs[i] = NAN; /* never read */
    u.bt = malloc(sizeof(int32_t) * (size_t)(u.pages + 1));
    if (cc.page) { /* a shuffled table over the pool (pages 0..pages-1) */
        int32_t *perm = u.bt;
        for (int64_t i = 0; i < u.pages; i++)
            perm[i] = (int32_t)i;
        for (int64_t i = u.pages - 1; i > 0; i--) {
            const int64_t j = tu_randint(0, i);
            const int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = c->leftpad ? b : 0; s < c->lens[b]; s++) {
            const int64_t r = cache_row(&cc, &u, b, s), l = b * cap + s;
            memcpy(u.kc + r * Hk * D, d->kq + l * Hk * D, (size_t)(Hk * D));
            memcpy(u.vc + r * Hk * D, d->vq + l * Hk * D, (size_t)(Hk * D));
            if (c->token) {
                memcpy(u.ks + r * Hk, d->kss + l * Hk, sizeof(float) * (size_t)Hk);
                memcpy(u.vs + r * Hk, d->vss + l * Hk, sizeof(float) * (size_t)Hk);
            }
        }
    if (!c->token)
        for (int64_t i = 0; i < B * Hk; i++)
            u.ks[i] = d->kss[i], u.vs[i] = d->vss[i];

    tu_tensor q, out, lse, kn, vn;
    const int64_t qs[4] = {B, Sq, H, D}, ls[3] = {B, H, Sq}, ns[4] = {B, c->S_new, Hk, D};
    tu_alloc(&q, c->qdt, 4, qs, TU_CONTIG);
    tu_alloc(&out, c->qdt, 4, qs, TU_CONTIG);
    tu_alloc(&lse, FA_DTYPE_F32, 3, ls, TU_CONTIG);
    tu_alloc(&kn, c->qdt, 4, ns, TU_CONTIG);
    tu_alloc(&vn, c->qdt, 4, ns, TU_CONTIG);
    tu_scatter(&q, d->q);
    double *tmp = dalloc(B * c->S_new * Hk * D);
    for (int64_t i = 0; i < B * c->S_new * Hk * D; i++)
        tmp[i] = d->knew[i];
    tu_scatter(&kn, tmp);
    for (int64_t i = 0; i < B * c->S_new * Hk * D; i++)
        tmp[i] = d->vnew[i];
    tu_scatter(&vn, tmp);
    free(tmp);
    tu_poison(&out);
    tu_poison(&lse);

    fa_kvcache kv;
    fa_kvcache_init(&kv);
    const int64_t cs[4] = {cc.page ? u.pages : B, cc.page ? cc.page : cap, Hk, D};
    kv.k_cache = fa_tensor_contiguous(u.kc, c->cdt, 4, cs);
    kv.v_cache = fa_tensor_contiguous(u.vc, c->cdt, 4, cs);
    const int64_t ts[3] = {cs[0], cs[1], Hk}, fs[2] = {B, Hk};
    kv.k_scale = fa_tensor_contiguous(u.ks, FA_DTYPE_F32, c->token ? 3 : 2, c->token ? ts : fs);
    kv.v_scale = fa_tensor_contiguous(u.vs, FA_DTYPE_F32, c->token ? 3 : 2, c->token ? ts : fs);
    int32_t seqlens[MAXB], pads[MAXB];
    for (int64_t b = 0; b < B; b++)
        seqlens[b] = (int32_t)c->lens[b], pads[b] = (int32_t)b;
    const int64_t bs[1] = {B}, bts[2] = {B, u.max_pages};
    kv.cache_seqlens = fa_tensor_contiguous(seqlens, FA_DTYPE_I32, 1, bs);
    if (c->leftpad)
        kv.cache_leftpad = fa_tensor_contiguous(pads, FA_DTYPE_I32, 1, bs);
    if (cc.page)
        kv.block_table = fa_tensor_contiguous(u.bt, FA_DTYPE_I32, 2, bts);
    if (c->S_new)
        kv.k_new = kn.t, kv.v_new = vn.t;
    float *cosf_ = NULL, *sinf_ = NULL;
    if (c->rotary) {
        cosf_ = malloc(sizeof(float) * (size_t)(d->ro * (D / 4)));
        sinf_ = malloc(sizeof(float) * (size_t)(d->ro * (D / 4)));
        for (int64_t i = 0; i < d->ro * (D / 4); i++)
            cosf_[i] = (float)d->cosr[i], sinf_[i] = (float)d->sinr[i];
        const int64_t rs[2] = {d->ro, D / 4};
        kv.rotary_cos = fa_tensor_contiguous(cosf_, FA_DTYPE_F32, 2, rs);
        kv.rotary_sin = fa_tensor_contiguous(sinf_, FA_DTYPE_F32, 2, rs);
        kv.rotary_interleaved = c->rotary == 1;
    }
    fa_params pr;
    fa_params_init(&pr);
    pr.causal = c->causal;
    pr.window_left = c->wl;
    pr.window_right = c->wr;
    pr.softcap = (float)c->softcap;

    qresult r = {0};
    r.st = fa_forward_kvcache(ctx, &pr, &q.t, &kv, &out.t, &lse.t);
    CHECK_MSG(r.st == FA_OK, "fa_forward_kvcache: %s: %s", fa_status_name(r.st),
              fa_last_error_message());
    r.out = dalloc(B * Sq * H * D);
    r.lse = dalloc(B * H * Sq);
    tu_gather(&out, r.out);
    tu_gather(&lse, r.lse);
    r.kc = calloc((size_t)(B * cap * Hk * D), 1);
    r.vc = calloc((size_t)(B * cap * Hk * D), 1);
    r.ks = malloc(sizeof(float) * (size_t)(B * cap * Hk));
    r.vs = malloc(sizeof(float) * (size_t)(B * cap * Hk));
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < cap; s++) {
            const int64_t l = b * cap + s;
            if (cc.page && s / cc.page >= u.max_pages)
                continue;
            const int64_t rr = cache_row(&cc, &u, b, s);
            memcpy(r.kc + l * Hk * D, u.kc + rr * Hk * D, (size_t)(Hk * D));
            memcpy(r.vc + l * Hk * D, u.vc + rr * Hk * D, (size_t)(Hk * D));
            for (int64_t h = 0; h < Hk; h++) {
                r.ks[l * Hk + h] = c->token ? u.ks[rr * Hk + h] : u.ks[b * Hk + h];
                r.vs[l * Hk + h] = c->token ? u.vs[rr * Hk + h] : u.vs[b * Hk + h];
            }
        }
    free(u.kc), free(u.vc), free(u.ks), free(u.vs), free(u.bt), free(cosf_), free(sinf_);
    tu_free(&q), tu_free(&out), tu_free(&lse), tu_free(&kn), tu_free(&vn);
    return r;
}

static tu_errstats g_stats[3];
static double g_format_err[3][2]; /* per 8-bit dtype: max over cases, per token / per head */

static int cidx(int cdt) { return cdt == FA_DTYPE_I8 ? 0 : cdt == FA_DTYPE_F8_E4M3 ? 1 : 2; }
static int qidx(int qdt) { return qdt == FA_DTYPE_F32 ? 0 : qdt == FA_DTYPE_F16 ? 1 : 2; }

/* The append (against d) and the attention (against the fp64 reference) of result r. */
static void check_case(const qcase *c, const qdata *d, const qresult *r) {
    const int64_t B = c->B, Hk = c->Hk, D = c->D, H = c->H, Sq = c->Sq, cap = c->cap;
    /* 1. the caches: old rows as drawn, new rows the library's quantization of k_new, v_new */
    int64_t bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = c->leftpad ? b : 0; s < c->lens[b] + c->S_new; s++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t l = (b * cap + s) * Hk + h;
                for (int t = 0; t < 2; t++) {
                    const uint8_t *got = (t ? r->vc : r->kc) + l * D;
                    const float gs = (t ? r->vs : r->ks)[l];
                    uint8_t want[256];
                    float ws =
                        c->token ? (t ? d->vss : d->kss)[l] : (t ? d->vss : d->kss)[b * Hk + h];
                    if (s < c->lens[b]) {
                        memcpy(want, (t ? d->vq : d->kq) + l * D, (size_t)D);
                    } else {
                        const float *x = (t ? d->vnew : d->knew) +
                                         ((b * c->S_new + s - c->lens[b]) * Hk + h) * D;
                        if (t == 0 && c->rotary) { /* rotated in fp32 there: within a step */
                            double xr[256];
                            for (int64_t e = 0; e < D; e++)
                                xr[e] = x[e];
                            rotate64(c, d, s, xr);
                            double mx = 0.0;
                            for (int64_t e = 0; e < D; e++)
                                mx = fmax(mx, fabs(xr[e]));
                            for (int64_t e = 0; e < D; e++) {
                                const double v = stored_value(c->cdt, got[e]) * gs;
                                const double step = c->cdt == FA_DTYPE_I8
                                                        ? (double)gs
                                                        : fmax(fabs(xr[e]) / 4, (double)gs / 64);
                                if (!(fabs(v - xr[e]) <= 0.5 * step + 1e-6 * mx) && bad++ < 3)
                                    CHECK_MSG(0,
                                              "rotated k_new b=%lld s=%lld h=%lld e=%lld: "
                                              "%.9g, rotated %.9g (scale %g)",
                                              (long long)b, (long long)s, (long long)h,
                                              (long long)e, v, xr[e], (double)gs);
                            }
                            continue;
                        }
                        if (c->token)
                            ws = quantize_row(c->cdt, x, D, want);
                        else
                            for (int64_t e = 0; e < D; e++)
                                want[e] = quantize(c->cdt, x[e] / ws);
                    }
                    const int same_scale =
                        memcmp(&gs, &ws, sizeof gs) == 0 || (isnan(gs) && isnan(ws));
                    if ((memcmp(got, want, (size_t)D) || !same_scale) && bad++ < 3)
                        CHECK_MSG(0,
                                  "%s cache b=%lld s=%lld h=%lld: bytes or scale (%g, want %g) "
                                  "differ",
                                  t ? "v" : "k", (long long)b, (long long)s, (long long)h,
                                  (double)gs, (double)ws);
                }
            }
    CHECK_MSG(bad == 0, "%lld cache rows differ", (long long)bad);

    /* 2. attention per batch over the dequantized cache, and over the exact values */
    for (int64_t b = 0; b < B; b++) {
        const int64_t lo = c->leftpad ? b : 0, sk = c->lens[b] + c->S_new - lo;
        double *k = dalloc(sk * Hk * D), *v = dalloc(sk * Hk * D);
        double *kx = dalloc(sk * Hk * D), *vx = dalloc(sk * Hk * D);
        for (int64_t j = 0; j < sk; j++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t s = lo + j, l = (b * cap + s) * Hk + h, o = (j * Hk + h) * D;
                for (int64_t e = 0; e < D; e++) {
                    k[o + e] = stored_value(c->cdt, r->kc[l * D + e]) * r->ks[l];
                    v[o + e] = stored_value(c->cdt, r->vc[l * D + e]) * r->vs[l];
                    if (s < c->lens[b]) {
                        kx[o + e] = d->kx[l * D + e];
                        vx[o + e] = d->vx[l * D + e];
                    } else {
                        const int64_t n = ((b * c->S_new + s - c->lens[b]) * Hk + h) * D;
                        kx[o + e] = d->knew[n + e];
                        vx[o + e] = d->vnew[n + e];
                    }
                }
                if (c->rotary && s >= c->lens[b])
                    rotate64(c, d, s, kx + o);
            }
        double *q = dalloc(Sq * H * D);
        memcpy(q, d->q + b * Sq * H * D, sizeof(double) * (size_t)(Sq * H * D));
        if (c->rotary) {
            const int shift = c->causal || c->wl >= 0 || c->wr >= 0;
            for (int64_t i = 0; i < Sq; i++)
                for (int64_t h = 0; h < H; h++)
                    rotate64(c, d, c->lens[b] + (shift ? i : 0), q + (i * H + h) * D);
        }
        ref_problem p = {.B = 1,
                         .Sq = Sq,
                         .Sk = sk,
                         .H = H,
                         .Hk = Hk,
                         .D = D,
                         .scale = 1.0 / sqrt((double)D),
                         .causal = c->causal,
                         .window_left = c->wl,
                         .window_right = c->causal ? 0 : c->wr,
                         .softcap = c->softcap};
        double *ref = dalloc(Sq * H * D), *lref = dalloc(H * Sq), *naive = dalloc(Sq * H * D);
        double *lnaive = dalloc(H * Sq), *size = dalloc(H * Sq), *exact = dalloc(Sq * H * D);
        ref_attention_forward(&p, q, k, v, ref, lref);
        ref_attention_forward_rounded(&p, q, k, v, naive, lnaive, tu_round_fn(c->qdt));
        ref_score_sizes(&p, q, k, size);
        ref_attention_forward(&p, q, kx, vx, exact, NULL);
        if (!tu_check_attention(c->qdt, 1, Sq, H, D, r->out + b * Sq * H * D, ref, naive,
                                r->lse + b * H * Sq, lref, lnaive, size, &g_stats[qidx(c->qdt)]))
            CHECK_MSG(0, "batch %lld (Sk = %lld)", (long long)b, (long long)sk);
        double mref = 0.0, err = 0.0;
        for (int64_t i = 0; i < Sq * H * D; i++) { /* both in fp64: the format's own error */
            mref = fmax(mref, fabs(exact[i]));
            err = fmax(err, fabs(ref[i] - exact[i]));
        }
        const double rel = mref > 0 ? err / mref : err;
        double *fe = &g_format_err[cidx(c->cdt)][c->token ? 0 : 1];
        *fe = fmax(*fe, rel);
        free(k), free(v), free(kx), free(vx), free(q), free(ref), free(lref), free(naive);
        free(lnaive), free(size), free(exact);
    }
}

static const int k_cdts[3] = {FA_DTYPE_I8, FA_DTYPE_F8_E4M3, FA_DTYPE_F8_E5M2};
static const int k_qdts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

static void describe(const qcase *c) {
    CASE_BEGIN("q %s cache %s %s B=%lld Sq=%lld H=%lld Hk=%lld D=%lld cap=%lld page=%lld "
               "S_new=%lld causal=%d w=(%d,%d) softcap=%g rotary=%d leftpad=%d lens=%lld,%lld",
               tu_dtype_name(c->qdt),
               c->cdt == FA_DTYPE_I8        ? "i8"
               : c->cdt == FA_DTYPE_F8_E4M3 ? "e4m3"
                                            : "e5m2",
               c->token ? "per-token" : "per-head", (long long)c->B, (long long)c->Sq,
               (long long)c->H, (long long)c->Hk, (long long)c->D, (long long)c->cap,
               (long long)c->page, (long long)c->S_new, c->causal, c->wl, c->wr, c->softcap,
               c->rotary, c->leftpad, (long long)c->lens[0],
               (long long)(c->B > 1 ? c->lens[1] : -1));
}

/* A random case of the grid; long: a cache long enough to be split. */
static qcase random_case(int i, int long_cache) {
    static const int64_t dims[] = {8, 16, 40, 64, 100, 128, 256};
    static const int64_t pages[] = {0, 1, 3, 16};
    qcase c = {.qdt = k_qdts[i % 3], .cdt = k_cdts[(i / 3) % 3], .token = (i / 9) % 4 != 3};
    c.B = tu_randint(1, 3);
    c.Hk = tu_randint(1, 3);
    c.H = c.Hk * (int64_t[]){1, 2, 4, 5}[tu_randint(0, 3)];
    c.D = dims[tu_randint(0, 6)];
    c.Sq = tu_randint(0, 3) ? tu_randint(1, 4) : tu_randint(5, 40); /* decode, or prefill */
    c.S_new = tu_randint(0, 2) ? tu_randint(0, 3) : 0;
    c.cap = long_cache ? (tu_emulated() ? 1500 : 3000) : tu_randint(8, 300);
    c.page = pages[tu_randint(0, 3)];
    c.causal = tu_randint(0, 1);
    c.wl = c.wr = -1;
    if (tu_randint(0, 3) == 0)
        c.wl = (int)tu_randint(0, 50);
    if (!c.causal && tu_randint(0, 3) == 0)
        c.wr = (int)tu_randint(0, 20);
    c.softcap = tu_randint(0, 4) == 0 ? 5.0 : 0.0;
    c.rotary = c.S_new && tu_randint(0, 2) == 0 ? (int)tu_randint(1, 2) : 0;
    if (c.rotary && c.D % 4)
        c.rotary = 0; /* rotary_dim = D/2 must be even */
    c.leftpad = !c.page && tu_randint(0, 3) == 0;
    for (int64_t b = 0; b < c.B; b++) {
        c.lens[b] = tu_randint(c.leftpad ? b : 0, c.cap - c.S_new);
        if (long_cache)
            c.lens[b] = c.cap - c.S_new - b;
    }
    return c;
}

static void group_random(void) {
    for (int i = 0; i < (tu_emulated() ? 18 : 72); i++) { /* qemu: a quarter */
        const qcase c = random_case(i, 0);
        describe(&c);
        qdata d;
        draw(&c, &d);
        qresult r = run(&c, &d, 1, NULL);
        if (r.st == FA_OK)
            check_case(&c, &d, &r);
        qresult_free(&r);
        qdata_free(&d);
        CASE_END();
    }
}

/* Contiguous vs paged and 1 vs 2 threads over caches that split: the same bits. */
static void group_determinism(void) {
    fa_context *ctx[2];
    for (int i = 0; i < 2; i++) {
        fa_context_options o;
        fa_context_options_init(&o);
        o.num_threads = i + 1;
        REQUIRE(fa_context_create(&o, &ctx[i]) == FA_OK);
    }
    for (int i = 0; i < (tu_emulated() ? 2 : 6); i++) {
        qcase c = random_case(i * 4 + 1, 1);
        c.Sq = i % 2 ? 1 : 2;
        c.leftpad = 0;
        if (!c.page)
            c.page = 16;
        c.rotary = 0; /* the layouts are compared through the same appended bytes */
        describe(&c);
        qdata d;
        draw(&c, &d);
        qresult a = run(&c, &d, 1, ctx[0]), bq = run(&c, &d, 0, ctx[1]);
        if (a.st == FA_OK && bq.st == FA_OK) {
            check_case(&c, &d, &a);
            CHECK_MSG(!memcmp(a.out, bq.out, sizeof(double) * (size_t)(c.B * c.Sq * c.H * c.D)) &&
                          !memcmp(a.lse, bq.lse, sizeof(double) * (size_t)(c.B * c.H * c.Sq)),
                      "paged on 1 thread and contiguous on 2 threads differ");
        }
        qresult_free(&a);
        qresult_free(&bq);
        qdata_free(&d);
        CASE_END();
    }
    fa_context_destroy(ctx[0]);
    fa_context_destroy(ctx[1]);
}

/* A new key with a NaN (a scale per token): its scale is NaN and every row that sees it is NaN,
 * while a batch that does not see it stays finite. */
static void group_nan(void) {
    for (int i = 0; i < 3; i++) {
        qcase c = {.qdt = FA_DTYPE_F32,
                   .cdt = k_cdts[i],
                   .token = 1,
                   .B = 2,
                   .Sq = 1,
                   .H = 4,
                   .Hk = 2,
                   .D = 32,
                   .cap = 64,
                   .S_new = 1,
                   .wl = -1,
                   .wr = -1,
                   .lens = {10, 20}};
        describe(&c);
        qdata d;
        draw(&c, &d);
        d.knew[5] = NAN; /* batch 0, head 0 */
        qresult r = run(&c, &d, 1, NULL);
        if (r.st == FA_OK) {
            CHECK_MSG(isnan(r.ks[(0 * c.cap + 10) * c.Hk + 0]), "the NaN row's scale is %g",
                      (double)r.ks[(0 * c.cap + 10) * c.Hk + 0]);
            for (int64_t h = 0; h < c.H; h++) {
                const int sees = h / (c.H / c.Hk) == 0; /* query heads of KV head 0 */
                const double o = r.out[h * c.D], o1 = r.out[(c.H + h) * c.D];
                CHECK_MSG(sees ? isnan(o) : isfinite(o), "batch 0 head %lld: out %g", (long long)h,
                          o);
                CHECK_MSG(isfinite(o1), "batch 1 head %lld: out %g", (long long)h, o1);
            }
        }
        qresult_free(&r);
        qdata_free(&d);
        CASE_END();
    }
}

/* ---- errors: nothing written ---- */

typedef struct efix {
    int8_t kc[2 * 8 * 2 * 16], vc[2 * 8 * 2 * 16];
    float ks[2 * 8 * 2], vs[2 * 8 * 2], fixed[2 * 2];
    float q[2 * 1 * 4 * 16], kn[2 * 1 * 2 * 16], vn[2 * 1 * 2 * 16], out[2 * 1 * 4 * 16];
    int32_t lens[2];
    fa_kvcache kv;
    fa_tensor tq, tout;
} efix;

static void efix_init(efix *f) {
    for (size_t i = 0; i < sizeof f->kc; i++)
        f->kc[i] = (int8_t)tu_randint(-127, 127);
    for (size_t i = 0; i < sizeof f->vc; i++)
        f->vc[i] = (int8_t)tu_randint(-127, 127);
    for (int i = 0; i < 32; i++)
        f->ks[i] = f->vs[i] = (float)(0.01 + tu_uniform() * 0.01);
    for (int i = 0; i < 4; i++)
        f->fixed[i] = 0.02f;
    for (int i = 0; i < 128; i++)
        f->q[i] = (float)tu_normal(), f->out[i] = NAN;
    for (int i = 0; i < 64; i++)
        f->kn[i] = (float)tu_normal(), f->vn[i] = (float)tu_normal();
    f->lens[0] = 3, f->lens[1] = 5;
    const int64_t cs[4] = {2, 8, 2, 16}, ss[3] = {2, 8, 2}, qs[4] = {2, 1, 4, 16},
                  ns[4] = {2, 1, 2, 16}, bs[1] = {2};
    fa_kvcache_init(&f->kv);
    f->kv.k_cache = fa_tensor_contiguous(f->kc, FA_DTYPE_I8, 4, cs);
    f->kv.v_cache = fa_tensor_contiguous(f->vc, FA_DTYPE_I8, 4, cs);
    f->kv.k_scale = fa_tensor_contiguous(f->ks, FA_DTYPE_F32, 3, ss);
    f->kv.v_scale = fa_tensor_contiguous(f->vs, FA_DTYPE_F32, 3, ss);
    f->kv.k_new = fa_tensor_contiguous(f->kn, FA_DTYPE_F32, 4, ns);
    f->kv.v_new = fa_tensor_contiguous(f->vn, FA_DTYPE_F32, 4, ns);
    f->kv.cache_seqlens = fa_tensor_contiguous(f->lens, FA_DTYPE_I32, 1, bs);
    f->tq = fa_tensor_contiguous(f->q, FA_DTYPE_F32, 4, qs);
    f->tout = fa_tensor_contiguous(f->out, FA_DTYPE_F32, 4, qs);
}

typedef enum {
    E_NO_KSCALE,
    E_NO_VSCALE,
    E_SCALE_DTYPE,
    E_SCALE_SHAPE,
    E_SCALE_NDIM,
    E_SCALE_16BIT,
    E_FIXED_ZERO,
    E_FIXED_NAN,
    E_FIXED_INF,
    E_MIXED,
    E_V16,
    E_Q8,
    E_CUDA,
    E_SIZE,
    E_COUNT
} ekind;

static void group_errors(void) {
    static const struct {
        fa_status st;
        const char *word;
    } want[E_COUNT] = {
        [E_NO_KSCALE] = {FA_ERR_NULL_POINTER, "kv.k_scale"},
        [E_NO_VSCALE] = {FA_ERR_NULL_POINTER, "kv.v_scale"},
        [E_SCALE_DTYPE] = {FA_ERR_DTYPE, "kv.k_scale"},
        [E_SCALE_SHAPE] = {FA_ERR_SHAPE, "kv.v_scale"},
        [E_SCALE_NDIM] = {FA_ERR_SHAPE, "kv.k_scale"},
        [E_SCALE_16BIT] = {FA_ERR_VALUE, "kv.k_scale"},
        [E_FIXED_ZERO] = {FA_ERR_VALUE, "kv.k_scale"},
        [E_FIXED_NAN] = {FA_ERR_VALUE, "kv.v_scale"},
        [E_FIXED_INF] = {FA_ERR_VALUE, "kv.k_scale"},
        [E_MIXED] = {FA_ERR_DTYPE, "kv.v_cache"},
        [E_V16] = {FA_ERR_DTYPE, "kv.v_cache"},
        [E_CUDA] = {FA_ERR_UNSUPPORTED, "kv.k_cache"},
        [E_Q8] = {FA_ERR_DTYPE, "q"},
        [E_SIZE] = {FA_ERR_STRUCT_SIZE, "kv.struct_size"},
    };
    for (int e = 0; e < E_COUNT; e++) {
        CASE_BEGIN("error %d", e);
        static efix f, before;
        efix_init(&f);
        fa_tensor q = f.tq;
        const int64_t cs[4] = {2, 8, 2, 16}, fs[2] = {2, 2}, bad[3] = {2, 7, 2};
        switch ((ekind)e) {
        case E_NO_KSCALE:
            f.kv.k_scale.data = NULL;
            break;
        case E_NO_VSCALE:
            f.kv.v_scale.data = NULL;
            break;
        case E_SCALE_DTYPE:
            f.kv.k_scale.dtype = FA_DTYPE_F16;
            break;
        case E_SCALE_SHAPE:
            f.kv.v_scale = fa_tensor_contiguous(f.vs, FA_DTYPE_F32, 3, bad);
            break;
        case E_SCALE_NDIM:
            f.kv.k_scale = fa_tensor_contiguous(f.ks, FA_DTYPE_F32, 4, cs);
            break;
        case E_SCALE_16BIT: /* fp32 caches like q (too small: fails before any read) */
            f.kv.k_cache.dtype = f.kv.v_cache.dtype = FA_DTYPE_F32;
            break;
        case E_FIXED_ZERO:
        case E_FIXED_NAN:
        case E_FIXED_INF:
            f.kv.k_scale = fa_tensor_contiguous(f.fixed, FA_DTYPE_F32, 2, fs);
            f.kv.v_scale = f.kv.k_scale;
            f.fixed[3] = e == E_FIXED_ZERO ? 0.0f : e == E_FIXED_NAN ? NAN : INFINITY;
            if (e == E_FIXED_NAN) { /* k's own scales, v's the bad fixed ones */
                static float kf[4] = {0.02f, 0.02f, 0.02f, 0.02f};
                f.kv.k_scale = fa_tensor_contiguous(kf, FA_DTYPE_F32, 2, fs);
            }
            break;
        case E_MIXED:
            f.kv.v_cache.dtype = FA_DTYPE_F8_E4M3;
            break;
        case E_V16:
            f.kv.v_cache.dtype = FA_DTYPE_F32;
            break; /* like q, with an 8-bit k */
        case E_Q8:
            q.dtype = FA_DTYPE_I8;
            break;
        case E_CUDA: /* refused before any plug-in is looked for (none is loaded here) */
            q.device = f.tout.device = FA_DEVICE_CUDA;
            f.kv.k_cache.device = f.kv.v_cache.device = f.kv.k_scale.device = FA_DEVICE_CUDA;
            f.kv.v_scale.device = f.kv.k_new.device = f.kv.v_new.device = FA_DEVICE_CUDA;
            break;
        case E_SIZE:
            f.kv.struct_size = (uint32_t)offsetof(fa_kvcache, k_scale) + 8;
            break;
        case E_COUNT:
            break;
        }
        memcpy(&before, &f, sizeof f);
        const fa_status st = fa_forward_kvcache(NULL, NULL, &q, &f.kv, &f.tout, NULL);
        CHECK_MSG(st == want[e].st, "status %s, want %s (%s)", fa_status_name(st),
                  fa_status_name(want[e].st), fa_last_error_message());
        CHECK_MSG(tu_contains_word(fa_last_error_message(), want[e].word),
                  "message '%s' does not name %s", fa_last_error_message(), want[e].word);
        CHECK_MSG(!memcmp(f.kc, before.kc, sizeof f.kc) && !memcmp(f.vc, before.vc, sizeof f.vc) &&
                      !memcmp(f.ks, before.ks, sizeof f.ks) &&
                      !memcmp(f.vs, before.vs, sizeof f.vs) &&
                      !memcmp(f.out, before.out, sizeof f.out),
                  "something was written");
        CASE_END();
    }
    /* 8-bit tensors elsewhere: fa_forward refuses them */
    CASE_BEGIN("fa_forward with int8 q, k, v");
    int8_t x[64] = {0};
    float o[64];
    const int64_t s4[4] = {1, 4, 1, 16};
    const fa_tensor t8 = fa_tensor_contiguous(x, FA_DTYPE_I8, 4, s4);
    const fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, s4);
    CHECK_EQ_INT(fa_forward(NULL, NULL, &t8, &t8, &t8, &to, NULL), FA_ERR_DTYPE);
    CASE_END();
    /* a caller built before the scales: its struct_size is accepted, its caches 16-bit */
    CASE_BEGIN("fa_kvcache without the scale fields");
    float kc[1 * 4 * 1 * 16], vc[1 * 4 * 1 * 16], q1[16], out1[16];
    for (int i = 0; i < 64; i++)
        kc[i] = (float)tu_normal(), vc[i] = (float)tu_normal();
    for (int i = 0; i < 16; i++)
        q1[i] = (float)tu_normal();
    const int64_t c4[4] = {1, 4, 1, 16}, q4[4] = {1, 1, 1, 16};
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.struct_size = (uint32_t)offsetof(fa_kvcache, k_scale);
    kv.k_cache = fa_tensor_contiguous(kc, FA_DTYPE_F32, 4, c4);
    kv.v_cache = fa_tensor_contiguous(vc, FA_DTYPE_F32, 4, c4);
    kv.k_scale.data = kc; /* past the caller's struct: must not be read */
    const fa_tensor tq = fa_tensor_contiguous(q1, FA_DTYPE_F32, 4, q4);
    const fa_tensor tout = fa_tensor_contiguous(out1, FA_DTYPE_F32, 4, q4);
    const fa_status st = fa_forward_kvcache(NULL, NULL, &tq, &kv, &tout, NULL);
    CHECK_MSG(st == FA_OK, "%s: %s", fa_status_name(st), fa_last_error_message());
    CASE_END();
}

int main(int argc, char **argv) {
    tu_seed_init("test_kvcache_q8");
    const char *only = argc > 1 ? argv[1] : "";
    if (!*only || strstr(only, "random"))
        group_random();
    if (!*only || strstr(only, "determinism"))
        group_determinism();
    if (!*only || strstr(only, "nan"))
        group_nan();
    if (!*only || strstr(only, "errors"))
        group_errors();
    static const char *fmt[3] = {"i8", "e4m3", "e5m2"};
    for (int i = 0; i < 3; i++)
        printf("format error (max |out - out_exact| / max|out_exact|) %s: per token %.3g, per "
               "(batch, head) %.3g\n",
               fmt[i], g_format_err[i][0], g_format_err[i][1]);
    for (int i = 0; i < 3; i++)
        if (g_stats[i].cases)
            printf("kernel error vs the dequantized cache, q %s: max rel %.3g over %ld cases\n",
                   tu_dtype_name(k_qdts[i]), g_stats[i].max_rel, g_stats[i].cases);
    return TEST_REPORT();
}
