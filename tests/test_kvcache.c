/* SPDX-License-Identifier: MIT */
/*
 * test_kvcache.c — fa_forward_kvcache (flash-attn's flash_attn_with_kvcache) against the fp64
 * reference.
 *
 * Every case describes one call in logical terms (kcfg: sizes, per-batch cache lengths,
 * leftpad, batch index, rotary, masks) and draws its data once (kdata: q, the new keys and
 * values, and each batch's cache sequence in fp64, already rounded to the dtype). A run (krun)
 * lays the same data out in memory — a contiguous cache (B_cache, S_cache, Hk, D) in some layout
 * or a paged one (num_pages, page_size, Hk, D) behind a scattered, non-monotonic block table —
 * makes the call, and checks
 *  - the cache after the call byte for byte against an expected copy of the whole buffer (the
 *    new rows written at cache_seqlens[b] + i, rotated when rotary is given; every other byte,
 *    including the rows of other sequences, unused pages and layout gaps, untouched). Rotated
 *    elements are computed in fp64 here and may differ from the library's fp32 rotation by
 *    rounding, so they are compared within a tolerance first (then the library's bytes are
 *    adopted for the byte comparison and for the attention reference);
 *  - out and lse against ref_attention_forward over each batch's concatenated keys
 *    [leftpad[b], cache_seqlens[b] + S_new) (B = 1 per batch), with q rotated by this file's own
 *    fp64 rotary; tolerances as in test_forward (tu_check_attention: fp32 ~1e-5 relative,
 *    fp16/bf16 no worse than 2x a naive implementation in that precision);
 *  - that inputs (q, k_new, v_new, the int32 tensors) are unchanged and out/lse gaps untouched.
 * Results of runs that must agree (paged vs contiguous, thread counts, num_splits) are compared
 * bitwise: out, lse and each sequence's cache content read back through its mapping.
 *
 * Cache positions a call must never read (before leftpad, at and after the end) hold NaN, so a
 * stray read shows up in out.
 *
 * Error cases start from a valid call, break one thing, and check the status, that
 * fa_last_error_message() names the argument, and that no byte of any buffer (out, lse, both
 * caches, every input) changed.
 *
 * Note: rotary_dim is 2 * rotary_cos.shape[1] in this API, so an odd rotary_dim cannot be
 * expressed; the tests cover rotary_dim > D, rotary_dim < D and rotary_dim = D.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "test.h"
#include "testutil.h"

#define MAXB 8

enum { SEQ_TENSOR = 0, SEQ_SCALAR = 1, SEQ_WHOLE = 2 };

static tu_errstats g_stats[3]; /* per dtype */
static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

static double *dalloc(int64_t n) {
    double *p = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!p)
        abort();
    return p;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

static int64_t off4(const fa_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * t->stride[0] + b * t->stride[1] + c * t->stride[2] + d * t->stride[3];
}

/* Bitwise equality of two fp64 arrays, NaN equal to NaN. Returns the first differing index or -1.
 */
static int64_t first_diff(const double *a, const double *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i]))
            continue;
        if (memcmp(&a[i], &b[i], sizeof(double)) != 0)
            return i;
    }
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Rotary embedding, fp64, written here from the semantics: pairs (2t, 2t+1) when interleaved,
 * else (t, t + rd/2) (GPT-NeoX), each rotated by the angle whose cosine and sine are the table
 * values at row pos, column t. Only the first rd dims change.
 * ------------------------------------------------------------------------------------------- */

static void ref_rotary(double *x, int64_t rd, int interleaved, const double *cosr,
                       const double *sinr) {
    const int64_t half = rd / 2;
    for (int64_t t = 0; t < half; t++) {
        const int64_t a = interleaved ? 2 * t : t, b = interleaved ? 2 * t + 1 : t + half;
        const double x1 = x[a], x2 = x[b];
        x[a] = x1 * cosr[t] - x2 * sinr[t];
        x[b] = x1 * sinr[t] + x2 * cosr[t];
    }
}

/* ---------------------------------------------------------------------------------------------
 * A case: the logical problem, its data, and one way of laying it out and calling
 * ------------------------------------------------------------------------------------------- */

/* The pair (a, b) that dim d of a rotary_dim-rd rotation belongs to. */
static void rotary_pair(int64_t d, int64_t rd, int interleaved, int64_t *a, int64_t *b) {
    const int64_t half = rd / 2, t = interleaved ? d / 2 : d % half;
    *a = interleaved ? 2 * t : t;
    *b = interleaved ? 2 * t + 1 : t + half;
}

/* How far the library's rotation (fp32, then rounded to the dtype) may be from the fp64 one:
 * one ulp of the dtype at the result plus fp32 rounding of x1*c -+ x2*s. */
static double rotary_tol(int dtype, double exact, double x1, double x2) {
    return tu_ulp(dtype, exact) + 8.0 * 0x1p-24 * (fabs(x1) + fabs(x2));
}

typedef struct kcfg {
    int dtype;
    int64_t B, Sq, H, Hk, D;
    int new_given;   /* pass k_new/v_new (S_new rows, possibly 0) */
    int64_t S_new;   /* 0 unless new_given */
    int64_t rows;    /* contiguous B_cache; 0 = B */
    int64_t S_cache; /* contiguous capacity; paged: max_pages = ceil(S_cache / page) */
    int32_t seqlens[MAXB];
    int seqlen_mode; /* SEQ_TENSOR, SEQ_SCALAR (seqlens[0] for all), SEQ_WHOLE (-1) */
    int use_bidx;
    int32_t bidx[MAXB];
    int use_leftpad;
    int32_t leftpad[MAXB];
    int64_t rd; /* rotary dim, 0 = none */
    int interleaved;
    int ro_f32;        /* rotary tables fp32 (else q's dtype) */
    int64_t seqlen_ro; /* 0 = long enough for anything */
    int causal, wl, wr;
    float softcap;
    int alibi; /* 0 none, 1 (H), 2 (B, H) */
} kcfg;

static kcfg kbase(int dtype, int64_t B, int64_t Sq, int64_t H, int64_t Hk, int64_t D, int64_t S_new,
                  int64_t S_cache) {
    kcfg c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.B = B;
    c.Sq = Sq;
    c.H = H;
    c.Hk = Hk;
    c.D = D;
    c.new_given = S_new > 0;
    c.S_new = S_new;
    c.S_cache = S_cache;
    c.wl = c.wr = -1;
    c.interleaved = 1;
    return c;
}

typedef struct kdata {
    int64_t cap; /* positions per sequence held here: S_cache + 256 covers any paged capacity */
    double *q, *knew, *vnew; /* (B, Sq, H, D), (B, S_new, Hk, D) */
    double *kseq, *vseq;     /* (B, cap, Hk, D): each sequence before the call, NaN where unused */
    void *cos, *sin;         /* (seqlen_ro, rd/2) in the table dtype */
    double *dcos, *dsin;     /* the same values */
    int64_t seqlen_ro;
    float slopes[MAXB * 64];
    double dslopes[MAXB * 64];
} kdata;

/* ---------------------------------------------------------------------------------------------
 * --cuda: every call on CUDA device 0 (the plug-in: a GPU, or the emulated one under ctest).
 * kv_call copies the bytes every tensor of the call spans to the device (tensors whose spans
 * overlap share one device region, so aliasing is kept), calls fa_forward_kvcache on the device
 * views, and copies every region back: the host buffers then hold what the device holds, and
 * each check of this file applies unchanged (cache byte for byte, inputs unchanged, nothing
 * written on error). The int32 index tensors lie on the device in one call and stay on the host
 * in the next (both are accepted). A tensor a case marks as CUDA is one it wants on the other
 * device than q: in this mode it stays on the host. A view whose span cannot be computed (the error
 * cases' malformed shapes and strides) keeps its host pointer, marked as a device tensor: the core
 * must refuse it before reading it.
 * ------------------------------------------------------------------------------------------- */
static int g_cuda;
static long g_cuda_calls;

enum { KV_NT = 14 };
typedef struct kv_region {
    uintptr_t lo, hi;
    void *dev;
} kv_region;

/* [*lo, *hi): the bytes t spans; 0 when there is none or it cannot be computed. */
static int kv_span(const fa_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    if (!t->data || t->ndim < 1 || t->ndim > FA_MAX_DIMS || tu_dtype_size(t->dtype) == 0)
        return 0;
    int64_t last = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] <= 0 || t->stride[d] < 0 || t->shape[d] > (1 << 24) ||
            t->stride[d] > (1 << 24))
            return 0;
        last += (t->shape[d] - 1) * t->stride[d];
    }
    const int64_t bytes = (last + 1) * (int64_t)tu_dtype_size(t->dtype);
    if (bytes > (64 << 20))
        return 0;
    *lo = (uintptr_t)t->data;
    *hi = *lo + (uintptr_t)bytes;
    return 1;
}

static void kv_dev_fatal(const char *what, fa_status st) {
    printf("FATAL: %s: %s: %s\n", what, fa_status_name(st), fa_last_error_message());
    fflush(stdout);
    exit(1);
}

/* fa_last_error_message() of the last kv_call (the copies back clear the library's). */
static char g_kv_msg[1024];
static const char *kv_msg(void) { return g_cuda ? g_kv_msg : fa_last_error_message(); }

static fa_status kv_call(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                         const fa_kvcache *kv, const fa_tensor *out, const fa_tensor *lse) {
    /* NULL arguments and unknown struct sizes are refused before any device is looked at */
    if (!g_cuda || !q || !out || !kv || kv->struct_size != sizeof *kv ||
        (params && params->struct_size != sizeof *params)) {
        const fa_status st = fa_forward_kvcache(ctx, params, q, kv, out, lse);
        snprintf(g_kv_msg, sizeof g_kv_msg, "%s", fa_last_error_message());
        return st;
    }
    fa_tensor tq = *q, to = *out, tl = lse ? *lse : *out;
    fa_kvcache tkv = *kv;
    fa_params tp;
    if (params)
        tp = *params;
    fa_tensor *ts[KV_NT] = {&tq,
                            &to,
                            lse ? &tl : NULL,
                            &tkv.k_cache,
                            &tkv.v_cache,
                            &tkv.k_new,
                            &tkv.v_new,
                            &tkv.rotary_cos,
                            &tkv.rotary_sin,
                            params ? &tp.alibi_slopes : NULL,
                            &tkv.cache_seqlens,
                            &tkv.cache_batch_idx,
                            &tkv.cache_leftpad,
                            &tkv.block_table};
    const int host_indices = g_cuda_calls++ % 2; /* the last four stay on the host */
    kv_region reg[KV_NT];
    int nreg = 0, at[KV_NT];
    for (int i = 0; i < KV_NT; i++) {
        at[i] = -1;
        uintptr_t lo, hi;
        if (!ts[i] || !ts[i]->data)
            continue;
        if (ts[i]->device == FA_DEVICE_CUDA) { /* a case put it on the other device */
            ts[i]->device = FA_DEVICE_CPU;
            continue;
        }
        if (host_indices && i >= KV_NT - 4)
            continue;
        ts[i]->device = FA_DEVICE_CUDA;
        ts[i]->device_index = 0;
        if (!kv_span(ts[i], &lo, &hi))
            continue;
        for (int r = 0; r < nreg && at[i] < 0; r++) /* overlapping spans: one region */
            if (lo < reg[r].hi && reg[r].lo < hi) {
                reg[r].lo = lo < reg[r].lo ? lo : reg[r].lo;
                reg[r].hi = hi > reg[r].hi ? hi : reg[r].hi;
                at[i] = r;
            }
        if (at[i] < 0)
            reg[at[i] = nreg++] = (kv_region){lo, hi, NULL};
    }
    for (int r = 0; r < nreg; r++) { /* a merge can make two regions overlap: merge again */
        for (int o = r + 1; o < nreg; o++)
            if (reg[o].lo < reg[r].hi && reg[r].lo < reg[o].hi) {
                reg[r].lo = reg[o].lo < reg[r].lo ? reg[o].lo : reg[r].lo;
                reg[r].hi = reg[o].hi > reg[r].hi ? reg[o].hi : reg[r].hi;
                for (int i = 0; i < KV_NT; i++)
                    at[i] = at[i] == o ? r : at[i] == nreg - 1 ? o : at[i];
                reg[o] = reg[--nreg];
                o = r; /* rescan */
            }
    }
    for (int r = 0; r < nreg; r++) {
        const size_t bytes = reg[r].hi - reg[r].lo;
        fa_status st = fa_device_alloc(FA_DEVICE_CUDA, 0, bytes, &reg[r].dev);
        if (st == FA_OK)
            st = fa_device_copy(reg[r].dev, FA_DEVICE_CUDA, (void *)reg[r].lo, FA_DEVICE_CPU, 0,
                                bytes);
        if (st != FA_OK)
            kv_dev_fatal("copying a test tensor to the device", st);
    }
    for (int i = 0; i < KV_NT; i++)
        if (at[i] >= 0)
            ts[i]->data = (char *)reg[at[i]].dev + ((uintptr_t)ts[i]->data - reg[at[i]].lo);
    const fa_status st =
        fa_forward_kvcache(ctx, params ? &tp : NULL, &tq, &tkv, &to, lse ? &tl : NULL);
    snprintf(g_kv_msg, sizeof g_kv_msg, "%s", fa_last_error_message());
    for (int r = 0; r < nreg; r++) {
        fa_status s2 = fa_device_copy((void *)reg[r].lo, FA_DEVICE_CPU, reg[r].dev, FA_DEVICE_CUDA,
                                      0, reg[r].hi - reg[r].lo);
        if (s2 == FA_OK)
            s2 = fa_device_free(FA_DEVICE_CUDA, 0, reg[r].dev);
        if (s2 != FA_OK)
            kv_dev_fatal("copying a test tensor back from the device", s2);
    }
    return st;
}

static int ro_dtype(const kcfg *c) { return c->ro_f32 ? FA_DTYPE_F32 : c->dtype; }

static void kdata_make(const kcfg *c, kdata *d) {
    memset(d, 0, sizeof *d);
    double (*rnd)(double) = tu_round_fn(c->dtype);
    const int64_t B = c->B, Hk = c->Hk, D = c->D;
    d->cap = c->S_cache + 256;
    const int64_t nq = B * c->Sq * c->H * D, nn = B * c->S_new * Hk * D, ns = B * d->cap * Hk * D;
    d->q = dalloc(nq);
    d->knew = dalloc(nn);
    d->vnew = dalloc(nn);
    d->kseq = dalloc(ns);
    d->vseq = dalloc(ns);
    for (int64_t i = 0; i < nq; i++)
        d->q[i] = rnd(tu_normal());
    for (int64_t i = 0; i < nn; i++) {
        d->knew[i] = rnd(tu_normal());
        d->vnew[i] = rnd(tu_normal());
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t lo = c->use_leftpad ? c->leftpad[b] : 0;
        const int64_t hi = c->seqlen_mode == SEQ_WHOLE    ? d->cap
                           : c->seqlen_mode == SEQ_SCALAR ? c->seqlens[0]
                                                          : c->seqlens[b];
        for (int64_t s = 0; s < d->cap; s++)
            for (int64_t t = 0; t < Hk * D; t++) {
                const int64_t i = (b * d->cap + s) * Hk * D + t;
                const int valid = s >= lo && s < hi;
                d->kseq[i] = valid ? rnd(tu_normal()) : NAN;
                d->vseq[i] = valid ? rnd(tu_normal()) : NAN;
            }
    }
    if (c->rd > 0) {
        const int rdt = ro_dtype(c);
        const int64_t half = c->rd / 2;
        d->seqlen_ro = c->seqlen_ro ? c->seqlen_ro : d->cap;
        const int64_t n = d->seqlen_ro * half;
        d->cos = xmalloc((size_t)n * tu_dtype_size(rdt));
        d->sin = xmalloc((size_t)n * tu_dtype_size(rdt));
        d->dcos = dalloc(n);
        d->dsin = dalloc(n);
        for (int64_t pos = 0; pos < d->seqlen_ro; pos++)
            for (int64_t t = 0; t < half; t++) {
                const double theta = (double)pos * pow(10000.0, -2.0 * (double)t / (double)c->rd);
                const int64_t i = pos * half + t;
                tu_store(d->cos, rdt, i, cos(theta));
                tu_store(d->sin, rdt, i, sin(theta));
                d->dcos[i] = tu_load(d->cos, rdt, i);
                d->dsin[i] = tu_load(d->sin, rdt, i);
            }
    }
    for (int64_t i = 0; i < B * c->H; i++) {
        double x = 0.02 + 0.5 * tu_uniform();
        if (i % 5 == 3)
            x = -0.05 * tu_uniform(); /* a few negative slopes (allowed) */
        d->slopes[i] = (float)x;
        d->dslopes[i] = (double)d->slopes[i];
    }
}

static void kdata_free(kdata *d) {
    free(d->q);
    free(d->knew);
    free(d->vnew);
    free(d->kseq);
    free(d->vseq);
    free(d->cos);
    free(d->sin);
    free(d->dcos);
    free(d->dsin);
}

typedef struct krun {
    int page; /* 0: contiguous cache; else paged with this page size */
    int lc, lq, lnew, lo, llse;
    int bt_garbage;      /* block-table entries past each sequence's used pages are out of range */
    int seqlens_strided; /* the int32 tensors with stride 2 */
    fa_context *ctx;
    int num_splits;
    int no_lse;
    int check; /* compare with the fp64 reference */
} krun;

typedef struct kres {
    int ok;
    double *out, *lse;   /* (B, Sq, H, D), (B, H, Sq) */
    double *kfin, *vfin; /* (B, cap, Hk, D): each sequence after the call, through its mapping */
} kres;

static void kres_free(kres *r) {
    free(r->out);
    free(r->lse);
    free(r->kfin);
    free(r->vfin);
    memset(r, 0, sizeof *r);
}

static void describe(const kcfg *c, const krun *r, char *buf, size_t n) {
    char sl[128] = "", lp[128] = "", bi[128] = "";
    int m = 0;
    for (int64_t b = 0; b < c->B && m < 100; b++)
        m += snprintf(sl + m, sizeof sl - (size_t)m, "%s%d", b ? "," : "", (int)c->seqlens[b]);
    m = 0;
    for (int64_t b = 0; c->use_leftpad && b < c->B && m < 100; b++)
        m += snprintf(lp + m, sizeof lp - (size_t)m, "%s%d",
                      b ? "," : " leftpad=", (int)c->leftpad[b]);
    m = 0;
    for (int64_t b = 0; c->use_bidx && b < c->B && m < 100; b++)
        m += snprintf(bi + m, sizeof bi - (size_t)m, "%s%d",
                      b ? "," : " batch_idx=", (int)c->bidx[b]);
    snprintf(buf, n,
             "%s B=%lld Sq=%lld H=%lld Hk=%lld D=%lld S_new=%lld%s S_cache=%lld rows=%lld "
             "seqlens=%s%s%s%s causal=%d window=(%d,%d) softcap=%g alibi=%d rotary=%lld%s%s "
             "| %s%d%s layouts c=%s q=%s new=%s out=%s lse=%s threads=%d num_splits=%d",
             tu_dtype_name(c->dtype), (long long)c->B, (long long)c->Sq, (long long)c->H,
             (long long)c->Hk, (long long)c->D, (long long)c->S_new,
             c->new_given ? "" : " (no k_new)", (long long)c->S_cache,
             (long long)(c->rows ? c->rows : c->B), c->seqlen_mode == SEQ_WHOLE ? "-1 (whole)" : sl,
             c->seqlen_mode == SEQ_SCALAR ? " (scalar)" : "", lp, bi, c->causal, c->wl, c->wr,
             (double)c->softcap, c->alibi, (long long)c->rd,
             c->rd ? (c->interleaved ? " interleaved" : " neox") : "",
             c->rd ? (c->ro_f32 ? " f32-table" : " q-dtype-table") : "",
             r->page ? "paged " : "contiguous", r->page,
             r->page && r->bt_garbage ? " (garbage unused entries)" : "", tu_layout_name(r->lc),
             tu_layout_name(r->lq), tu_layout_name(r->lnew), tu_layout_name(r->lo),
             r->no_lse ? "none" : tu_layout_name(r->llse), fa_context_num_threads(r->ctx),
             r->num_splits);
}

/* Where position pos of batch b lives in the cache tensor: (first index, second index), or
 * first index -1 where the block table does not map it. */
typedef struct kmap {
    int paged;
    int64_t page, maxp;
    const int32_t *bt; /* (B, maxp) */
    int64_t bt_s0;
    int32_t row[MAXB];
    int64_t nfirst; /* cache shape[0] */
} kmap;

static void kmap_at(const kmap *m, int64_t b, int64_t pos, int64_t *x0, int64_t *x1) {
    if (!m->paged) {
        *x0 = m->row[b];
        *x1 = pos;
        return;
    }
    const int32_t e = m->bt[b * m->bt_s0 + pos / m->page];
    *x0 = e >= 0 && e < m->nfirst ? e : -1;
    *x1 = pos % m->page;
}

typedef struct rotated_elem {
    int64_t off; /* element offset in the cache buffer */
    double exact;
    double x1, x2; /* the pair's inputs (for the tolerance) */
} rotated_elem;

/* Runs one call of the case; fills res (when not NULL) and returns 1 on pass. */
static int kv_run(const kcfg *c, const kdata *dd, const krun *r, kres *res) {
    char name[1024];
    describe(c, r, name, sizeof name);
    CASE_BEGIN("%s", name);

    const int dt = c->dtype;
    const size_t es = tu_dtype_size(dt);
    const int64_t B = c->B, Sq = c->Sq, H = c->H, Hk = c->Hk, D = c->D, S_new = c->S_new;
    const int64_t cap = dd->cap, rows = c->rows ? c->rows : B;
    double (*rnd)(double) = tu_round_fn(dt);

    /* capacity, lengths and the mapping */
    kmap map;
    memset(&map, 0, sizeof map);
    int64_t cap_run, num_first;
    int32_t *bt = NULL;
    int64_t seqlen[MAXB], endp[MAXB], pad[MAXB];
    if (r->page) {
        map.paged = 1;
        map.page = r->page;
        map.maxp = (c->S_cache + r->page - 1) / r->page;
        cap_run = map.maxp * r->page;
        num_first = B * map.maxp + 3;
    } else {
        cap_run = c->S_cache;
        num_first = rows;
    }
    map.nfirst = num_first;
    for (int64_t b = 0; b < B; b++) {
        seqlen[b] = c->seqlen_mode == SEQ_WHOLE    ? cap_run
                    : c->seqlen_mode == SEQ_SCALAR ? c->seqlens[0]
                                                   : c->seqlens[b];
        endp[b] = seqlen[b] + S_new;
        pad[b] = c->use_leftpad ? c->leftpad[b] : 0;
        map.row[b] = c->use_bidx ? c->bidx[b] : (int32_t)b;
    }
    /* owner of each first index: batch * maxp + logical page (paged) or batch (rows), or -1 */
    int64_t *owner = xmalloc(sizeof(int64_t) * (size_t)num_first);
    for (int64_t i = 0; i < num_first; i++)
        owner[i] = -1;
    if (r->page) {
        int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)num_first);
        for (int64_t i = 0; i < num_first; i++)
            perm[i] = (int32_t)i;
        for (int64_t i = num_first - 1; i > 0; i--) { /* Fisher-Yates: scattered, non-monotonic */
            int64_t j = tu_randint(0, i);
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        map.bt_s0 = map.maxp + 2; /* padded rows */
        bt = xmalloc(sizeof(int32_t) * (size_t)(B * map.bt_s0));
        for (int64_t i = 0; i < B * map.bt_s0; i++)
            bt[i] = -999999; /* the gaps: never read */
        for (int64_t b = 0; b < B; b++) {
            const int64_t used = (endp[b] + r->page - 1) / r->page;
            for (int64_t lp = 0; lp < map.maxp; lp++) {
                int32_t e = perm[b * map.maxp + lp];
                if (r->bt_garbage && lp >= used)
                    e = lp % 2 ? (int32_t)(num_first + lp) : (int32_t)(-1 - lp);
                else
                    owner[e] = b * map.maxp + lp;
                bt[b * map.bt_s0 + lp] = e;
            }
        }
        map.bt = bt;
        free(perm);
    } else {
        for (int64_t b = 0; b < B; b++)
            owner[map.row[b]] = b;
    }

    /* the caches */
    int64_t cshape[4] = {num_first, r->page ? r->page : c->S_cache, Hk, D};
    tu_tensor kc, vc;
    tu_alloc(&kc, dt, 4, cshape, r->lc);
    tu_alloc(&vc, dt, 4, cshape, r->lc);
    for (int64_t x0 = 0; x0 < cshape[0]; x0++)
        for (int64_t x1 = 0; x1 < cshape[1]; x1++)
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t o = off4(&kc.t, x0, x1, h, d);
                    int64_t b = -1, pos = 0;
                    if (owner[x0] >= 0) {
                        b = r->page ? owner[x0] / map.maxp : owner[x0];
                        pos = r->page ? owner[x0] % map.maxp * r->page + x1 : x1;
                    }
                    if (b >= 0 && pos < cap) {
                        const int64_t i = ((b * cap + pos) * Hk + h) * D + d;
                        tu_store(kc.buf, dt, o, dd->kseq[i]);
                        tu_store(vc.buf, dt, o, dd->vseq[i]);
                    } else { /* another sequence's row or an unused page: any content */
                        tu_store(kc.buf, dt, o, tu_normal());
                        tu_store(vc.buf, dt, o, tu_normal());
                    }
                }
    const size_t cbytes = (size_t)kc.nbuf * es;
    unsigned char *kexp = xmalloc(cbytes), *vexp = xmalloc(cbytes);
    memcpy(kexp, kc.buf, cbytes);
    memcpy(vexp, vc.buf, cbytes);

    /* the new rows: expected cache content */
    const int64_t nrot_max = B * S_new * Hk * (c->rd > 0 ? c->rd : 1);
    rotated_elem *rot = xmalloc(sizeof *rot * (size_t)(nrot_max > 0 ? nrot_max : 1));
    int64_t nrot = 0;
    double *row = dalloc(D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S_new; i++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t pos = seqlen[b] + i, src = ((b * S_new + i) * Hk + h) * D;
                int64_t x0, x1;
                kmap_at(&map, b, pos, &x0, &x1);
                if (x0 < 0)
                    continue; /* cannot happen for a valid case */
                memcpy(row, dd->knew + src, sizeof(double) * (size_t)D);
                if (c->rd > 0)
                    ref_rotary(row, c->rd, c->interleaved, dd->dcos + pos * (c->rd / 2),
                               dd->dsin + pos * (c->rd / 2));
                for (int64_t d = 0; d < D; d++) {
                    const int64_t o = off4(&kc.t, x0, x1, h, d);
                    tu_store(kexp, dt, o, row[d]);
                    tu_store(vexp, dt, o, dd->vnew[src + d]);
                    if (d < c->rd) {
                        int64_t a, bb;
                        rotary_pair(d, c->rd, c->interleaved, &a, &bb);
                        rot[nrot++] =
                            (rotated_elem){o, row[d], dd->knew[src + a], dd->knew[src + bb]};
                    }
                }
            }

    /* q, k_new, v_new, out, lse */
    int64_t qshape[4] = {B, Sq, H, D}, nshape[4] = {B, S_new, Hk, D}, lshape[3] = {B, H, Sq};
    tu_tensor q, kn, vn, out, lse;
    tu_alloc(&q, dt, 4, qshape, r->lq);
    tu_alloc(&kn, dt, 4, nshape, r->lnew);
    tu_alloc(&vn, dt, 4, nshape, r->lnew);
    tu_alloc(&out, dt, 4, qshape, r->lo);
    tu_alloc(&lse, FA_DTYPE_F32, 3, lshape, r->llse);
    tu_scatter(&q, dd->q);
    tu_scatter(&kn, dd->knew);
    tu_scatter(&vn, dd->vnew);
    unsigned char *qsnap = xmalloc((size_t)q.nbuf * es), *knsnap = xmalloc((size_t)kn.nbuf * es);
    unsigned char *vnsnap = xmalloc((size_t)vn.nbuf * es);
    memcpy(qsnap, q.buf, (size_t)q.nbuf * es);
    memcpy(knsnap, kn.buf, (size_t)kn.nbuf * es);
    memcpy(vnsnap, vn.buf, (size_t)vn.nbuf * es);

    /* int32 tensors (stride 2 when asked: the gaps hold junk) */
    const int64_t is = r->seqlens_strided ? 2 : 1;
    int32_t ints[3][2 * MAXB];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 2 * MAXB; i++)
            ints[k][i] = -77777;
    for (int64_t b = 0; b < B; b++) {
        ints[0][b * is] = (int32_t)seqlen[b];
        ints[1][b * is] = map.row[b];
        ints[2][b * is] = (int32_t)pad[b];
    }
    int32_t ints_snap[3][2 * MAXB];
    memcpy(ints_snap, ints, sizeof ints);
    int32_t *bt_snap = NULL;
    if (bt) {
        bt_snap = xmalloc(sizeof(int32_t) * (size_t)(B * map.bt_s0));
        memcpy(bt_snap, bt, sizeof(int32_t) * (size_t)(B * map.bt_s0));
    }

    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = kc.t;
    kv.v_cache = vc.t;
    if (c->new_given) {
        kv.k_new = kn.t;
        kv.v_new = vn.t;
    }
    int64_t bshape = B;
    if (c->seqlen_mode == SEQ_TENSOR) {
        kv.cache_seqlens = fa_tensor_contiguous(ints[0], FA_DTYPE_I32, 1, &bshape);
        kv.cache_seqlens.stride[0] = is;
    } else {
        kv.cache_seqlen = c->seqlen_mode == SEQ_WHOLE ? -1 : c->seqlens[0];
    }
    if (c->use_bidx) {
        kv.cache_batch_idx = fa_tensor_contiguous(ints[1], FA_DTYPE_I32, 1, &bshape);
        kv.cache_batch_idx.stride[0] = is;
    }
    if (c->use_leftpad) {
        kv.cache_leftpad = fa_tensor_contiguous(ints[2], FA_DTYPE_I32, 1, &bshape);
        kv.cache_leftpad.stride[0] = is;
    }
    if (r->page) {
        int64_t bts[2] = {B, map.maxp};
        kv.block_table = fa_tensor_contiguous(bt, FA_DTYPE_I32, 2, bts);
        kv.block_table.stride[0] = map.bt_s0;
    }
    if (c->rd > 0) {
        int64_t rs[2] = {dd->seqlen_ro, c->rd / 2};
        kv.rotary_cos = fa_tensor_contiguous(dd->cos, (fa_dtype)ro_dtype(c), 2, rs);
        kv.rotary_sin = fa_tensor_contiguous(dd->sin, (fa_dtype)ro_dtype(c), 2, rs);
        kv.rotary_interleaved = c->interleaved;
    }
    kv.num_splits = r->num_splits;

    fa_params params;
    fa_params_init(&params);
    params.causal = c->causal;
    params.window_left = c->wl;
    params.window_right = c->wr;
    params.softcap = c->softcap;
    if (c->alibi) {
        int64_t ash[2] = {B, H};
        params.alibi_slopes =
            c->alibi == 2 ? fa_tensor_contiguous((void *)dd->slopes, FA_DTYPE_F32, 2, ash)
                          : fa_tensor_contiguous((void *)dd->slopes, FA_DTYPE_F32, 1, ash + 1);
    }

    fa_status st = kv_call(r->ctx, &params, &q.t, &kv, &out.t, r->no_lse ? NULL : &lse.t);
    CHECK_MSG(st == FA_OK, "fa_forward_kvcache returned %s (%d): %s", fa_status_name(st), (int)st,
              kv_msg());

    const int64_t nq = B * Sq * H * D, nl = B * H * Sq, ns = B * cap * Hk * D;
    double *dout = dalloc(nq), *dlse = dalloc(nl), *kfin = dalloc(ns), *vfin = dalloc(ns);
    for (int64_t i = 0; i < nl; i++)
        dlse[i] = NAN;
    for (int64_t i = 0; i < ns; i++)
        kfin[i] = vfin[i] = NAN;
    if (st == FA_OK) {
        CHECK_EQ_STR(kv_msg(), "");
        /* 1. rotated elements within rounding of the fp64 rotation; then adopt the library's */
        double worst_rot = 0.0;
        int64_t bad_rot = 0;
        for (int64_t t = 0; t < nrot; t++) {
            const double got = tu_load(kc.buf, dt, rot[t].off);
            const double tol = rotary_tol(dt, rot[t].exact, rot[t].x1, rot[t].x2);
            const double e = fabs(got - rot[t].exact);
            if (!(e <= tol)) {
                if (bad_rot++ < 3)
                    CHECK_MSG(
                        0, "rotated k element at offset %lld: %.9g, fp64 rotation %.9g (tol %.3g)",
                        (long long)rot[t].off, got, rot[t].exact, tol);
            }
            if (e > worst_rot)
                worst_rot = e;
            memcpy(kexp + (size_t)rot[t].off * es,
                   (unsigned char *)kc.buf + (size_t)rot[t].off * es, es);
        }
        /* 2. the whole cache buffers, byte for byte */
        for (int w = 0; w < 2; w++) {
            const unsigned char *got = w ? vc.buf : kc.buf, *want = w ? vexp : kexp;
            if (memcmp(got, want, cbytes) != 0) {
                int64_t first = -1, count = 0;
                for (int64_t e = 0; e < kc.nbuf; e++)
                    if (memcmp(got + e * (int64_t)es, want + e * (int64_t)es, es) != 0) {
                        if (first < 0)
                            first = e;
                        count++;
                    }
                CHECK_MSG(0,
                          "%s_cache: %lld elements differ from the expected cache (first at "
                          "offset %lld: %.9g, expected %.9g)",
                          w ? "v" : "k", (long long)count, (long long)first,
                          tu_load(got, dt, first), tu_load(want, dt, first));
            }
        }
        /* 3. inputs unchanged, gaps of out and lse untouched */
        CHECK_MSG(memcmp(qsnap, q.buf, (size_t)q.nbuf * es) == 0, "q was modified");
        CHECK_MSG(memcmp(knsnap, kn.buf, (size_t)kn.nbuf * es) == 0, "k_new was modified");
        CHECK_MSG(memcmp(vnsnap, vn.buf, (size_t)vn.nbuf * es) == 0, "v_new was modified");
        CHECK_MSG(memcmp(ints_snap, ints, sizeof ints) == 0, "an int32 tensor was modified");
        if (bt)
            CHECK_MSG(memcmp(bt_snap, bt, sizeof(int32_t) * (size_t)(B * map.bt_s0)) == 0,
                      "block_table was modified");
        int64_t gaps = tu_count_touched_gaps(&out);
        CHECK_MSG(gaps == 0, "%lld gap elements of out were written", (long long)gaps);
        if (r->no_lse) {
            const unsigned char *lb = lse.buf;
            int64_t changed = 0;
            for (int64_t i = 0; i < lse.nbuf * 4; i++)
                changed += lb[i] != 0xFF;
            CHECK_MSG(changed == 0, "lse not passed but %lld bytes changed", (long long)changed);
        } else {
            gaps = tu_count_touched_gaps(&lse);
            CHECK_MSG(gaps == 0, "%lld gap elements of lse were written", (long long)gaps);
        }

        tu_gather(&out, dout);
        if (!r->no_lse)
            tu_gather(&lse, dlse);
        /* each sequence's cache after the call, read through the mapping */
        for (int64_t b = 0; b < B; b++)
            for (int64_t pos = 0; pos < cap_run && pos < cap; pos++) {
                int64_t x0, x1;
                kmap_at(&map, b, pos, &x0, &x1);
                if (x0 < 0)
                    continue;
                for (int64_t h = 0; h < Hk; h++)
                    for (int64_t d = 0; d < D; d++) {
                        const int64_t i = ((b * cap + pos) * Hk + h) * D + d;
                        kfin[i] = tu_load(kc.buf, dt, off4(&kc.t, x0, x1, h, d));
                        vfin[i] = tu_load(vc.buf, dt, off4(&vc.t, x0, x1, h, d));
                    }
            }

        /* 4. attention against the fp64 reference, batch by batch over the concatenated keys */
        if (r->check) {
            double *qrot = dalloc(nq), *qnaive = dalloc(nq);
            const int shift = c->causal || c->wl >= 0 || c->wr >= 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < Sq; i++)
                    for (int64_t h = 0; h < H; h++) {
                        const int64_t o = ((b * Sq + i) * H + h) * D;
                        memcpy(qrot + o, dd->q + o, sizeof(double) * (size_t)D);
                        if (c->rd > 0) {
                            const int64_t pos = seqlen[b] + (shift ? i : 0);
                            ref_rotary(qrot + o, c->rd, c->interleaved,
                                       dd->dcos + pos * (c->rd / 2), dd->dsin + pos * (c->rd / 2));
                        }
                        for (int64_t d = 0; d < D; d++)
                            qnaive[o + d] = rnd(qrot[o + d]);
                    }
            double *dref = dalloc(nq), *dnaive = dalloc(nq), *lref = dalloc(nl),
                   *lnaive = dalloc(nl), *lsize = dalloc(nl);
            for (int64_t b = 0; b < B; b++) {
                ref_problem p;
                memset(&p, 0, sizeof p);
                p.B = 1;
                p.Sq = Sq;
                p.Sk = endp[b] - pad[b];
                p.H = H;
                p.Hk = Hk;
                p.D = D;
                p.scale = 1.0 / sqrt((double)D);
                p.causal = c->causal;
                p.window_left = c->wl;
                p.window_right = c->wr;
                p.softcap = c->softcap;
                p.alibi = c->alibi == 2 ? dd->dslopes + b * H : c->alibi ? dd->dslopes : NULL;
                const double *kb = kfin + (b * cap + pad[b]) * Hk * D;
                const double *vb = vfin + (b * cap + pad[b]) * Hk * D;
                ref_attention_forward(&p, qrot + b * Sq * H * D, kb, vb, dref + b * Sq * H * D,
                                      lref + b * H * Sq);
                if (dt != FA_DTYPE_F32)
                    ref_attention_forward_rounded(&p, qnaive + b * Sq * H * D, kb, vb,
                                                  dnaive + b * Sq * H * D, lnaive + b * H * Sq,
                                                  rnd);
                else
                    ref_score_sizes(&p, qrot + b * Sq * H * D, kb, lsize + b * H * Sq);
            }
            tu_check_attention(dt, B, Sq, H, D, dout, dref, dt != FA_DTYPE_F32 ? dnaive : NULL,
                               r->no_lse ? NULL : dlse, lref, dt != FA_DTYPE_F32 ? lnaive : NULL,
                               lsize, &g_stats[dt]);
            free(qrot);
            free(qnaive);
            free(dref);
            free(dnaive);
            free(lref);
            free(lnaive);
            free(lsize);
        }
    }

    if (res) {
        res->out = dout;
        res->lse = dlse;
        res->kfin = kfin;
        res->vfin = vfin;
    } else {
        free(dout);
        free(dlse);
        free(kfin);
        free(vfin);
    }
    tu_free(&kc);
    tu_free(&vc);
    tu_free(&q);
    tu_free(&kn);
    tu_free(&vn);
    tu_free(&out);
    tu_free(&lse);
    free(kexp);
    free(vexp);
    free(qsnap);
    free(knsnap);
    free(vnsnap);
    free(rot);
    free(row);
    free(owner);
    free(bt);
    free(bt_snap);
    const int ok = CASE_END();
    if (res)
        res->ok = ok;
    return ok;
}

static krun krun_default(void) {
    krun r;
    memset(&r, 0, sizeof r);
    r.check = 1;
    return r;
}

/* One case, checked against the reference, in a fresh draw of its data. */
/* --cuda: each sequence's cache after the device's call against the CPU's, bitwise (the append
 * and its rotation are the CPU's arithmetic); the largest difference of out is reported. */
static double g_out_vs_cpu[3]; /* per dtype: max |out_cuda - out_cpu| */
static void compare_caches(const kcfg *c, const kdata *d, const kres *cpu, const kres *dev) {
    CASE_BEGIN("cache after the CUDA call = after the CPU call (%s)", tu_dtype_name(c->dtype));
    const int64_t per = c->Hk * c->D, n = c->B * c->Sq * c->H * c->D;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t o = b * d->cap * per;
        const int64_t ik = first_diff(cpu->kfin + o, dev->kfin + o, d->cap * per);
        const int64_t iv = first_diff(cpu->vfin + o, dev->vfin + o, d->cap * per);
        CHECK_MSG(ik < 0, "batch %lld: k cache differs at position %lld: cpu %.9g cuda %.9g",
                  (long long)b, (long long)(ik / per), ik >= 0 ? cpu->kfin[o + ik] : 0.0,
                  ik >= 0 ? dev->kfin[o + ik] : 0.0);
        CHECK_MSG(iv < 0, "batch %lld: v cache differs at position %lld", (long long)b,
                  (long long)(iv / per));
    }
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs(cpu->out[i] - dev->out[i]);
        if (e > g_out_vs_cpu[c->dtype])
            g_out_vs_cpu[c->dtype] = e;
    }
    CASE_END();
}

static int run1(const kcfg *c, const krun *r) {
    kdata d;
    kdata_make(c, &d);
    int ok;
    if (g_cuda) { /* the CPU first, from the same data: the caches must agree bit for bit */
        kres cpu, dev;
        g_cuda = 0;
        ok = kv_run(c, &d, r, &cpu);
        g_cuda = 1;
        ok &= kv_run(c, &d, r, &dev);
        if (cpu.ok && dev.ok)
            compare_caches(c, &d, &cpu, &dev);
        kres_free(&cpu);
        kres_free(&dev);
    } else {
        ok = kv_run(c, &d, r, NULL);
    }
    kdata_free(&d);
    return ok;
}

static int run_all_dtypes(kcfg c, const krun *r) {
    int failed = 0;
    for (int t = 0; t < 3; t++) {
        c.dtype = k_dtypes[t];
        failed += !run1(&c, r);
    }
    return failed;
}

/* Compares two results bitwise (out, lse, and the cache sequences over [0, npos)). */
static void compare_results(const char *what, const kcfg *c, const kdata *d, const kres *a,
                            const kres *b, int64_t npos) {
    CASE_BEGIN("%s", what);
    const int64_t nq = c->B * c->Sq * c->H * c->D, nl = c->B * c->H * c->Sq;
    int64_t i = first_diff(a->out, b->out, nq);
    CHECK_MSG(i < 0, "out differs at flat index %lld: %.17g vs %.17g", (long long)i,
              i >= 0 ? a->out[i] : 0.0, i >= 0 ? b->out[i] : 0.0);
    i = first_diff(a->lse, b->lse, nl);
    CHECK_MSG(i < 0, "lse differs at flat index %lld: %.17g vs %.17g", (long long)i,
              i >= 0 ? a->lse[i] : 0.0, i >= 0 ? b->lse[i] : 0.0);
    const int64_t per = c->Hk * c->D;
    for (int64_t bb = 0; bb < c->B; bb++) {
        const int64_t o = bb * d->cap * per;
        int64_t ik = first_diff(a->kfin + o, b->kfin + o, npos * per);
        int64_t iv = first_diff(a->vfin + o, b->vfin + o, npos * per);
        CHECK_MSG(ik < 0, "batch %lld: k cache content differs at position %lld", (long long)bb,
                  (long long)(ik / (ik >= 0 ? per : 1)));
        CHECK_MSG(iv < 0, "batch %lld: v cache content differs at position %lld", (long long)bb,
                  (long long)(iv / (iv >= 0 ? per : 1)));
    }
    CASE_END();
}

static long g_group_cases, g_group_failed;
static void group_begin(void) {
    g_group_cases = test_state_g_.cases_passed + test_state_g_.cases_failed;
    g_group_failed = test_state_g_.cases_failed;
}
static void group_end(const char *name) {
    printf("%-44s %4ld cases, %ld failed\n", name,
           test_state_g_.cases_passed + test_state_g_.cases_failed - g_group_cases,
           test_state_g_.cases_failed - g_group_failed);
    fflush(stdout);
}

static void set_lens(kcfg *c, const int32_t *lens) {
    for (int64_t b = 0; b < c->B; b++)
        c->seqlens[b] = lens[b];
}

/* ---------------------------------------------------------------------------------------------
 * Groups
 * ------------------------------------------------------------------------------------------- */

/* Append-then-attend in every dtype: decode, a few tokens, S_new = 0 (with and without an empty
 * k_new), Sq != S_new, scalar lengths, the whole cache, an empty cache, head dims, layouts. */
static void group_append(void) {
    group_begin();
    krun r = krun_default();
    static const int32_t l2[2] = {37, 100}, l3[3] = {5, 0, 60};
    kcfg c;

    c = kbase(0, 2, 1, 8, 2, 64, 1, 160); /* decode */
    set_lens(&c, l2);
    run_all_dtypes(c, &r);
    c.causal = 1;
    run_all_dtypes(c, &r);

    c = kbase(0, 2, 4, 8, 2, 64, 4, 160); /* S_new = Sq = 4, causal */
    set_lens(&c, l2);
    c.causal = 1;
    run_all_dtypes(c, &r);
    c.causal = 0;
    run_all_dtypes(c, &r);

    c = kbase(0, 3, 3, 4, 4, 32, 5, 90); /* Sq < S_new */
    set_lens(&c, l3);
    c.causal = 1;
    run_all_dtypes(c, &r);
    c = kbase(0, 3, 5, 4, 1, 32, 2, 90); /* Sq > S_new: some rows see nothing under causal */
    set_lens(&c, l3);
    c.causal = 1;
    run_all_dtypes(c, &r);

    c = kbase(0, 2, 2, 8, 2, 64, 0, 160); /* S_new = 0, no k_new */
    set_lens(&c, l2);
    run_all_dtypes(c, &r);
    c.new_given = 1; /* S_new = 0 with an empty k_new */
    c.causal = 1;
    run_all_dtypes(c, &r);

    c = kbase(0, 3, 2, 6, 3, 16, 2, 64); /* scalar cache_seqlen */
    c.seqlen_mode = SEQ_SCALAR;
    c.seqlens[0] = 40;
    c.causal = 1;
    run_all_dtypes(c, &r);
    c.new_given = 0;
    c.S_new = 0;
    c.seqlens[0] = 64; /* scalar = the whole cache, given explicitly */
    run_all_dtypes(c, &r);
    c.seqlen_mode = SEQ_WHOLE; /* -1: the whole cache */
    run_all_dtypes(c, &r);
    c.causal = 0;
    run_all_dtypes(c, &r);

    c = kbase(0, 2, 3, 4, 2, 16, 3, 32); /* empty cache, then append */
    c.causal = 1;
    run_all_dtypes(c, &r);
    c = kbase(0, 2, 3, 4, 2, 16, 0, 32); /* empty cache, nothing appended: Sk = 0 */
    run_all_dtypes(c, &r);
    c.seqlen_mode = SEQ_SCALAR; /* cache_seqlen = 0 */
    run_all_dtypes(c, &r);

    /* fill the cache to the last position */
    c = kbase(0, 2, 2, 4, 2, 16, 2, 40);
    c.seqlens[0] = 38;
    c.seqlens[1] = 11;
    c.causal = 1;
    run_all_dtypes(c, &r);

    /* head dims */
    static const int64_t dims[] = {1, 7, 80, 128, 256};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        c = kbase(0, 2, 2, 4, 2, dims[i], 2, 50);
        set_lens(&c, l2);
        c.seqlens[1] = 30;
        c.causal = 1;
        run_all_dtypes(c, &r);
    }

    /* layouts: BHSD cache (permuted), strided everything, inner stride 2 */
    static const int lays[] = {TU_PERMUTED, TU_STRIDED, TU_INNER2};
    for (size_t i = 0; i < 3; i++) {
        krun rl = krun_default();
        rl.lc = rl.lq = rl.lnew = rl.lo = rl.llse = lays[i];
        rl.seqlens_strided = 1;
        c = kbase(0, 2, 3, 4, 2, 24, 3, 70);
        set_lens(&c, l2);
        c.seqlens[1] = 50;
        c.causal = 1;
        c.rd = 8;
        run_all_dtypes(c, &rl);
        rl.no_lse = 1;
        c.rd = 0;
        c.new_given = 0;
        c.S_new = 0;
        run_all_dtypes(c, &rl);
    }
    group_end("append, attend, layouts");
}

/* Masks and the features of fa_forward over a cache: causal, windows, softcap, ALiBi (H) and
 * (B, H), GQA ratios 1, 4, 8, with leftpad so the alignment uses each batch's own Sk. */
static void group_masks(void) {
    group_begin();
    krun r = krun_default();
    static const int64_t hks[3] = {8, 2, 1}; /* H/Hk = 1, 4, 8 */
    static const int wins[][3] = {{1, -1, -1}, {0, 7, -1}, {0, -1, 3},
                                  {0, 5, 2},   {1, 6, -1}, {0, 0, 0}};
    for (int g = 0; g < 3; g++)
        for (size_t w = 0; w < sizeof wins / sizeof wins[0]; w++) {
            kcfg c = kbase(FA_DTYPE_F32, 3, 3, 8, hks[g], 32, 2, 80);
            c.seqlens[0] = 20;
            c.seqlens[1] = 45;
            c.seqlens[2] = 3;
            c.use_leftpad = 1;
            c.leftpad[0] = 4;
            c.leftpad[1] = 0;
            c.leftpad[2] = 3;
            c.causal = wins[w][0];
            c.wl = wins[w][1];
            c.wr = wins[w][2];
            c.dtype = k_dtypes[(g + w) % 3];
            run1(&c, &r);
        }
    for (int t = 0; t < 3; t++) {
        kcfg c = kbase(k_dtypes[t], 2, 2, 8, 2, 64, 2, 100);
        c.seqlens[0] = 50;
        c.seqlens[1] = 90;
        c.causal = 1;
        c.softcap = 5.0f;
        run1(&c, &r);
        c.softcap = 0;
        c.alibi = 1;
        run1(&c, &r);
        c.alibi = 2;
        c.causal = 0;
        c.use_leftpad = 1;
        c.leftpad[0] = 10;
        c.leftpad[1] = 1;
        run1(&c, &r);
        c.softcap = 30.0f;
        c.wl = 20;
        c.causal = 1;
        run1(&c, &r);
    }
    group_end("masks, softcap, ALiBi, GQA");
}

/* Rotary: both pairings, rd = D and rd < D, tables in q's dtype and fp32, q rotated at
 * cache_seqlens + i (causal or windowed) or cache_seqlens (otherwise). */
static void group_rotary(void) {
    group_begin();
    krun r = krun_default();
    static const int64_t rdims[][2] = {{64, 64}, {64, 32}, {80, 16}, {7, 6}, {8, 2}};
    for (size_t k = 0; k < sizeof rdims / sizeof rdims[0]; k++)
        for (int il = 0; il < 2; il++)
            for (int mode = 0; mode < 3; mode++) { /* causal, non-causal, windowed non-causal */
                kcfg c = kbase(k_dtypes[(k + (size_t)il + (size_t)mode) % 3], 2, 3, 4, 2,
                               rdims[k][0], 3, 120);
                c.seqlens[0] = 17;
                c.seqlens[1] = 100;
                c.rd = rdims[k][1];
                c.interleaved = il;
                c.ro_f32 = (int)(k + (size_t)mode) % 2;
                c.causal = mode == 0;
                c.wl = mode == 2 ? 9 : -1;
                run1(&c, &r);
            }
    /* q of a decode step (Sq = S_new = 1) and Sq > S_new (q positions past the new keys) */
    for (int t = 0; t < 3; t++) {
        kcfg c = kbase(k_dtypes[t], 2, 1, 8, 1, 64, 1, 64);
        c.seqlens[0] = 0;
        c.seqlens[1] = 63;
        c.rd = 64;
        c.interleaved = t % 2;
        run1(&c, &r);
        c = kbase(k_dtypes[t], 2, 4, 4, 2, 32, 2, 64);
        c.seqlens[0] = 10;
        c.seqlens[1] = 20;
        c.rd = 32;
        c.causal = 1;
        c.interleaved = t % 2;
        run1(&c, &r);
        /* rotary with leftpad and batch_idx: positions are absolute cache positions */
        c.use_leftpad = 1;
        c.leftpad[0] = 3;
        c.leftpad[1] = 20;
        c.use_bidx = 1;
        c.rows = 4;
        c.bidx[0] = 3;
        c.bidx[1] = 1;
        run1(&c, &r);
        /* table exactly long enough: the largest position is 20 + 3 (q row 3, causal) */
        c.seqlen_ro = 24;
        run1(&c, &r);
    }
    group_end("rotary (interleaved, GPT-NeoX)");
}

/* leftpad, cache_batch_idx (non-identity permutation, more cache rows than B, duplicates when
 * only reading), lengths given as a tensor and as the scalar. */
static void group_indices(void) {
    group_begin();
    krun r = krun_default();
    for (int t = 0; t < 3; t++) {
        kcfg c = kbase(k_dtypes[t], 4, 2, 4, 2, 32, 2, 60);
        static const int32_t lens[4] = {10, 40, 0, 58};
        set_lens(&c, lens);
        c.causal = 1;
        c.use_leftpad = 1;
        c.leftpad[0] = 0;
        c.leftpad[1] = 39; /* one old key left */
        c.leftpad[2] = 0;  /* empty cache row */
        c.leftpad[3] = 58; /* leftpad = cache_seqlens: only the new keys */
        run1(&c, &r);
        c.use_bidx = 1; /* permutation of 7 rows */
        c.rows = 7;
        c.bidx[0] = 5;
        c.bidx[1] = 0;
        c.bidx[2] = 6;
        c.bidx[3] = 2;
        run1(&c, &r);
        c.use_leftpad = 0;
        run1(&c, &r);
        c.rows = 4; /* a permutation of exactly B rows */
        c.bidx[0] = 3;
        c.bidx[1] = 2;
        c.bidx[2] = 0;
        c.bidx[3] = 1;
        run1(&c, &r);
        /* no append: two batches may read one row */
        c = kbase(k_dtypes[t], 3, 2, 4, 2, 32, 0, 60);
        c.seqlens[0] = 30;
        c.seqlens[1] = 30;
        c.seqlens[2] = 12;
        c.use_bidx = 1;
        c.rows = 2;
        c.bidx[0] = 1;
        c.bidx[1] = 1;
        c.bidx[2] = 0;
        c.use_leftpad = 1;
        c.leftpad[0] = 10; /* batches 0 and 1 share row 1: batch 0 reads inside batch 1's keys */
        c.leftpad[1] = 7;
        c.leftpad[2] = 12; /* Sk = 0 */
        c.causal = t == 1;
        run1(&c, &r);
        /* leftpad with the scalar length and the whole cache */
        c = kbase(k_dtypes[t], 2, 1, 4, 1, 16, 1, 30);
        c.seqlen_mode = SEQ_SCALAR;
        c.seqlens[0] = 20;
        c.use_leftpad = 1;
        c.leftpad[0] = 5;
        c.leftpad[1] = 19;
        run1(&c, &r);
        c = kbase(k_dtypes[t], 2, 2, 4, 1, 16, 0, 30);
        c.seqlen_mode = SEQ_WHOLE;
        c.use_leftpad = 1;
        c.leftpad[0] = 29;
        c.leftpad[1] = 2;
        c.causal = 1;
        run1(&c, &r);
    }
    group_end("leftpad, cache_batch_idx, seqlens");
}

/* Paged with page sizes 1, 3, 16, 256 against the contiguous layout: bitwise equal out and lse
 * (same chunking) and the same cache content through the block table. */
static void group_paged(void) {
    group_begin();
    static const int pages[4] = {1, 3, 16, 256};
    for (int v = 0; v < 6; v++) {
        kcfg c;
        if (v == 0) { /* decode, split (Sk > 1024) */
            c = kbase(FA_DTYPE_F32, 2, 1, 8, 2, 64, 1, 1500);
            c.seqlens[0] = 1400;
            c.seqlens[1] = 300;
        } else if (v == 1) { /* a few new tokens, rotary, causal */
            c = kbase(FA_DTYPE_F16, 3, 3, 4, 2, 32, 3, 300);
            c.seqlens[0] = 100;
            c.seqlens[1] = 0;
            c.seqlens[2] = 255;
            c.rd = 16;
            c.interleaved = 0;
            c.causal = 1;
        } else if (v == 2) { /* no append, window, ALiBi */
            c = kbase(FA_DTYPE_BF16, 2, 2, 8, 1, 48, 0, 500);
            c.seqlens[0] = 499;
            c.seqlens[1] = 257;
            c.wl = 30;
            c.wr = 4;
            c.alibi = 2;
        } else if (v == 3) { /* whole cache (-1): capacity 768 is a multiple of every page */
            c = kbase(FA_DTYPE_F32, 2, 2, 4, 4, 16, 0, 768);
            c.seqlen_mode = SEQ_WHOLE;
            c.causal = 1;
        } else if (v == 4) { /* scalar length, append, softcap */
            c = kbase(FA_DTYPE_BF16, 2, 2, 4, 2, 16, 2, 200);
            c.seqlen_mode = SEQ_SCALAR;
            c.seqlens[0] = 150;
            c.softcap = 10.0f;
            c.causal = 1;
        } else { /* fp16 decode, split, rotary interleaved */
            c = kbase(FA_DTYPE_F16, 2, 1, 8, 2, 64, 1, 2100);
            c.seqlens[0] = 2050;
            c.seqlens[1] = 1025;
            c.rd = 64;
        }
        kdata d;
        kdata_make(&c, &d);
        krun r0 = krun_default();
        kres base;
        memset(&base, 0, sizeof base);
        kv_run(&c, &d, &r0, &base);
        for (int p = 0; p < 4; p++) {
            krun rp = krun_default();
            rp.page = pages[p];
            rp.bt_garbage = (p + v) % 2;
            rp.check = 0; /* bitwise equal to the checked contiguous run */
            if (p == 2)
                rp.lc = TU_PERMUTED;
            kres res;
            memset(&res, 0, sizeof res);
            kv_run(&c, &d, &rp, &res);
            char what[160];
            snprintf(what, sizeof what, "paged %d (variant %d) equals contiguous, bitwise",
                     pages[p], v);
            if (base.out && res.out)
                compare_results(what, &c, &d, &base, &res, c.S_cache);
            kres_free(&res);
        }
        kres_free(&base);
        kdata_free(&d);
    }
    group_end("paged (1, 3, 16, 256) = contiguous");
}

/* Caches long enough to split (Sk > 1024 with g·Sq <= 16) and around the boundary, and the
 * same lengths with too many rows to split. */
static void group_split(void) {
    group_begin();
    krun r = krun_default();
    for (int t = 0; t < 3; t++) {
        kcfg c = kbase(k_dtypes[t], 3, 1, 8, 2, 64, 1, 5000);
        c.seqlens[0] = 1023; /* 1024 keys: one chunk, not split */
        c.seqlens[1] = 1024; /* 1025 keys: a last chunk of one key */
        c.seqlens[2] = 4990;
        run1(&c, &r);
        c = kbase(k_dtypes[t], 2, 4, 8, 2, 64, 4, 2600); /* g·Sq = 16: split, causal */
        c.seqlens[0] = 2500;
        c.seqlens[1] = 1100;
        c.causal = 1;
        c.rd = 32;
        run1(&c, &r);
        c.Sq = 5; /* 20 rows: split, decode's products (up to FA_DECODE_ROWS = 64 rows) */
        run1(&c, &r);
        c.Sq = 16; /* 64 rows: the most that decode takes */
        run1(&c, &r);
        c.Sq = 17; /* 68 rows: the prefill's packed products, split (4 batch x KV head pairs) */
        run1(&c, &r);
        c = kbase(k_dtypes[t], 2, 17, 64, 16, 32, 4, 2600); /* 68 rows, 32 pairs: not split */
        c.seqlens[0] = 2500;
        c.seqlens[1] = 1100;
        c.causal = 1;
        run1(&c, &r);
        c = kbase(k_dtypes[t], 1, 1, 71, 1, 64, 1, 3000); /* MQA, 71 rows: split, packed */
        c.seqlens[0] = 2990;
        run1(&c, &r);
        c.Sq = 2; /* 142 rows: not split */
        c.S_new = 2;
        run1(&c, &r);
        c = kbase(k_dtypes[t], 1, 64, 4, 4, 32, 0, 3000); /* MHA: 64 rows of one head, split */
        c.seqlens[0] = 2990;
        c.causal = 1;
        run1(&c, &r);
        c.Sq = 65; /* 65 rows: split (4 pairs), the prefill's products */
        run1(&c, &r);
        for (int64_t sq = 6; sq <= 11;
             sq +=
             sq == 9
                 ? 2
                 : 1) { /* 18, 21, 24, 27 rows (3 query
                         * heads per KV head): every row count mod 4, paged; 33: bf16 past its 32 */
            krun pr = krun_default();
            pr.page = sq == 7 ? 3 : 16;
            c = kbase(k_dtypes[t], 2, sq, 6, 2, 48, sq, 2500);
            c.seqlens[0] = 2400;
            c.seqlens[1] = 1300;
            c.causal = sq % 2;
            c.softcap = sq == 8 ? 5.0f : 0.0f;
            run1(&c, &pr);
        }
        c = kbase(k_dtypes[t], 2, 2, 8, 1, 32, 2, 3000); /* g·Sq = 16 with leftpad and window */
        c.seqlens[0] = 2900;
        c.seqlens[1] = 1500;
        c.use_leftpad = 1;
        c.leftpad[0] = 100;
        c.leftpad[1] = 600; /* 902 keys: not split, batch 0 is */
        c.wl = 1500;
        c.causal = 1;
        c.alibi = 1;
        run1(&c, &r);
        c.wl = 300; /* a window that leaves most chunks empty */
        c.use_leftpad = 0;
        run1(&c, &r);
    }
    group_end("split-KV lengths");
}

/* 64 decode steps: one token per step appended at cache_seqlens, each step's output against full
 * attention over the sequence so far, the final cache against the full K/V. Lengths cross the
 * 1024-key split threshold during the loop. */
static void decode_loop(int dt, int page, int64_t rd, int interleaved) {
    CASE_BEGIN("decode loop %s %s%d rotary=%lld%s", tu_dtype_name(dt),
               page ? "paged " : "contiguous", page, (long long)rd,
               rd ? (interleaved ? " interleaved" : " neox") : "");
    const int64_t B = 2, H = 8, Hk = 2, D = 64, steps = 64, cap = 1100;
    const int64_t L0[2] = {975, 1000};
    const size_t es = tu_dtype_size(dt);
    double (*rnd)(double) = tu_round_fn(dt);
    const int64_t per = Hk * D;

    /* the full sequences (what the cache should hold), NaN past the end */
    double *full_k = dalloc(B * cap * per), *full_v = dalloc(B * cap * per);
    for (int64_t i = 0; i < B * cap * per; i++)
        full_k[i] = full_v[i] = NAN;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L0[b] * per; i++) {
            full_k[b * cap * per + i] = rnd(tu_normal());
            full_v[b * cap * per + i] = rnd(tu_normal());
        }
    /* the cache buffers: contiguous (B, cap, Hk, D) or pages behind a shuffled table */
    const int64_t maxp = page ? (cap + page - 1) / page : 0, npages = B * maxp + 1;
    int64_t cshape[4] = {page ? npages : B, page ? page : cap, Hk, D};
    const int64_t celems = cshape[0] * cshape[1] * per;
    void *kc = xmalloc((size_t)celems * es), *vc = xmalloc((size_t)celems * es);
    int32_t *bt = page ? xmalloc(sizeof(int32_t) * (size_t)(B * maxp)) : NULL;
    if (page) {
        for (int64_t i = 0; i < B * maxp; i++)
            bt[i] = (int32_t)((i * 7919 + 13) % npages); /* 7919 is prime: a permutation */
        int32_t used[4096] = {0};
        for (int64_t i = 0; i < B * maxp; i++)
            used[bt[i]]++;
        for (int64_t i = 0; i < npages; i++)
            CHECK(used[i] <= 1);
    }
#define CACHE_OFF(b, pos, h)                                                                       \
    (page ? ((int64_t)bt[(b)*maxp + (pos) / page] * page + (pos) % page) * per + (h)*D             \
          : ((b)*cap + (pos)) * per + (h)*D)
    for (int64_t i = 0; i < celems; i++) { /* unused rows and pages: junk */
        tu_store(kc, dt, i, tu_normal());
        tu_store(vc, dt, i, tu_normal());
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t pos = 0; pos < cap; pos++)
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t o = CACHE_OFF(b, pos, h) + d,
                                  i = (b * cap + pos) * per + h * D + d;
                    tu_store(kc, dt, o, full_k[i]);
                    tu_store(vc, dt, o, full_v[i]);
                }
    unsigned char *kexp = xmalloc((size_t)celems * es), *vexp = xmalloc((size_t)celems * es);
    memcpy(kexp, kc, (size_t)celems * es);
    memcpy(vexp, vc, (size_t)celems * es);

    /* rotary tables (fp32) */
    const int64_t half = rd / 2 > 0 ? rd / 2 : 1;
    float *cosf = xmalloc(sizeof(float) * (size_t)(cap * half)),
          *sinf = xmalloc(sizeof(float) * (size_t)(cap * half));
    double *dcos = dalloc(cap * half), *dsin = dalloc(cap * half);
    for (int64_t pos = 0; pos < cap; pos++)
        for (int64_t t = 0; t < half; t++) {
            const double th = (double)pos * pow(10000.0, -2.0 * (double)t / (double)(rd ? rd : 2));
            cosf[pos * half + t] = (float)cos(th);
            sinf[pos * half + t] = (float)sin(th);
            dcos[pos * half + t] = cosf[pos * half + t];
            dsin[pos * half + t] = sinf[pos * half + t];
        }

    const int64_t nq = B * H * D;
    double *dq = dalloc(nq), *qrot = dalloc(nq), *qn = dalloc(nq), *dkn = dalloc(B * per),
           *dvn = dalloc(B * per), *dout = dalloc(nq), *dref = dalloc(nq), *dnaive = dalloc(nq);
    double dlse[16], lref[16], lnaive[16], lsize[16];
    void *qb = xmalloc((size_t)nq * es), *kn = xmalloc((size_t)(B * per) * es),
         *vn = xmalloc((size_t)(B * per) * es), *ob = xmalloc((size_t)nq * es);
    float lseb[16];
    int32_t lens[2];
    int64_t qs[4] = {B, 1, H, D}, ns[4] = {B, 1, Hk, D}, ls[3] = {B, H, 1}, bs = B,
            bts[2] = {B, maxp}, rs[2] = {cap, half};
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = fa_tensor_contiguous(kc, (fa_dtype)dt, 4, cshape);
    kv.v_cache = fa_tensor_contiguous(vc, (fa_dtype)dt, 4, cshape);
    kv.k_new = fa_tensor_contiguous(kn, (fa_dtype)dt, 4, ns);
    kv.v_new = fa_tensor_contiguous(vn, (fa_dtype)dt, 4, ns);
    kv.cache_seqlens = fa_tensor_contiguous(lens, FA_DTYPE_I32, 1, &bs);
    if (page)
        kv.block_table = fa_tensor_contiguous(bt, FA_DTYPE_I32, 2, bts);
    if (rd) {
        kv.rotary_cos = fa_tensor_contiguous(cosf, FA_DTYPE_F32, 2, rs);
        kv.rotary_sin = fa_tensor_contiguous(sinf, FA_DTYPE_F32, 2, rs);
        kv.rotary_interleaved = interleaved;
    }
    fa_tensor tq = fa_tensor_contiguous(qb, (fa_dtype)dt, 4, qs);
    fa_tensor to = fa_tensor_contiguous(ob, (fa_dtype)dt, 4, qs);
    fa_tensor tl = fa_tensor_contiguous(lseb, FA_DTYPE_F32, 3, ls);
    fa_params params;
    fa_params_init(&params);
    params.causal = 1;
    long bad_steps = 0, bad_rot = 0;
    tu_errstats st_loop = {0};

    for (int64_t step = 0; step < steps; step++) {
        for (int64_t b = 0; b < B; b++)
            lens[b] = (int32_t)(L0[b] + step);
        for (int64_t i = 0; i < nq; i++) {
            dq[i] = rnd(tu_normal());
            tu_store(qb, dt, i, dq[i]);
        }
        for (int64_t i = 0; i < B * per; i++) {
            dkn[i] = rnd(tu_normal());
            dvn[i] = rnd(tu_normal());
            tu_store(kn, dt, i, dkn[i]);
            tu_store(vn, dt, i, dvn[i]);
        }
        memset(ob, 0xFF, (size_t)nq * es);
        memset(lseb, 0xFF, sizeof lseb);
        fa_status s = kv_call(NULL, &params, &tq, &kv, &to, &tl);
        CHECK_MSG(s == FA_OK, "step %lld: %s: %s", (long long)step, fa_status_name(s), kv_msg());
        if (s != FA_OK) {
            bad_steps++;
            break;
        }
        /* the new token in the full sequence: rotated in fp64; the library's bytes adopted
         * after a tolerance check */
        for (int64_t b = 0; b < B; b++) {
            const int64_t pos = lens[b];
            for (int64_t h = 0; h < Hk; h++) {
                double x[256];
                memcpy(x, dkn + b * per + h * D, sizeof(double) * (size_t)D);
                if (rd)
                    ref_rotary(x, rd, interleaved, dcos + pos * half, dsin + pos * half);
                const int64_t o = CACHE_OFF(b, pos, h);
                for (int64_t d = 0; d < D; d++) {
                    const double got = tu_load(kc, dt, o + d);
                    double want = rnd(x[d]);
                    if (d < rd) {
                        int64_t pa, pb;
                        rotary_pair(d, rd, interleaved, &pa, &pb);
                        const double *kr = dkn + b * per + h * D;
                        const double tol = rotary_tol(dt, x[d], kr[pa], kr[pb]);
                        if (!(fabs(got - x[d]) <= tol) && bad_rot++ < 3)
                            CHECK_MSG(0, "step %lld: rotated k[%lld][%lld] %.9g vs %.9g",
                                      (long long)step, (long long)b, (long long)d, got, x[d]);
                        want = got;
                    }
                    full_k[(b * cap + pos) * per + h * D + d] = want;
                    full_v[(b * cap + pos) * per + h * D + d] = dvn[b * per + h * D + d];
                    tu_store(kexp, dt, o + d, want);
                    tu_store(vexp, dt, o + d, dvn[b * per + h * D + d]);
                }
            }
        }
        for (int64_t i = 0; i < nq; i++)
            dout[i] = tu_load(ob, dt, i);
        for (int64_t i = 0; i < B * H; i++)
            dlse[i] = lseb[i];
        for (int64_t b = 0; b < B; b++) {
            const int64_t pos = lens[b];
            for (int64_t h = 0; h < H; h++) {
                const int64_t o = (b * H + h) * D;
                memcpy(qrot + o, dq + o, sizeof(double) * (size_t)D);
                if (rd)
                    ref_rotary(qrot + o, rd, interleaved, dcos + pos * half, dsin + pos * half);
                for (int64_t d = 0; d < D; d++)
                    qn[o + d] = rnd(qrot[o + d]);
            }
            ref_problem p;
            memset(&p, 0, sizeof p);
            p.B = 1;
            p.Sq = 1;
            p.Sk = pos + 1;
            p.H = H;
            p.Hk = Hk;
            p.D = D;
            p.scale = 1.0 / sqrt((double)D);
            p.causal = 1;
            p.window_left = p.window_right = -1;
            ref_attention_forward(&p, qrot + b * H * D, full_k + b * cap * per,
                                  full_v + b * cap * per, dref + b * H * D, lref + b * H);
            if (dt != FA_DTYPE_F32)
                ref_attention_forward_rounded(&p, qn + b * H * D, full_k + b * cap * per,
                                              full_v + b * cap * per, dnaive + b * H * D,
                                              lnaive + b * H, rnd);
            else
                ref_score_sizes(&p, qrot + b * H * D, full_k + b * cap * per, lsize + b * H);
        }
        if (!tu_check_attention(dt, B, 1, H, D, dout, dref, dt != FA_DTYPE_F32 ? dnaive : NULL,
                                dlse, lref, dt != FA_DTYPE_F32 ? lnaive : NULL, lsize, &st_loop)) {
            printf("  (decode step %lld, cache lengths %d, %d)\n", (long long)step, lens[0],
                   lens[1]);
            if (bad_steps++ > 3)
                break;
        }
    }
    /* the final cache: the whole buffers byte for byte */
    CHECK_MSG(memcmp(kexp, kc, (size_t)celems * es) == 0, "final k cache differs from the full K");
    CHECK_MSG(memcmp(vexp, vc, (size_t)celems * es) == 0, "final v cache differs from the full V");
#undef CACHE_OFF
    g_stats[dt].cases += st_loop.cases;
    if (st_loop.max_rel > g_stats[dt].max_rel)
        g_stats[dt].max_rel = st_loop.max_rel;
    if (st_loop.max_abs > g_stats[dt].max_abs)
        g_stats[dt].max_abs = st_loop.max_abs;
    if (st_loop.max_ratio > g_stats[dt].max_ratio)
        g_stats[dt].max_ratio = st_loop.max_ratio;
    if (st_loop.max_lse_rel > g_stats[dt].max_lse_rel)
        g_stats[dt].max_lse_rel = st_loop.max_lse_rel;
    if (st_loop.max_lse_abs > g_stats[dt].max_lse_abs)
        g_stats[dt].max_lse_abs = st_loop.max_lse_abs;
    free(full_k);
    free(full_v);
    free(kc);
    free(vc);
    free(bt);
    free(kexp);
    free(vexp);
    free(cosf);
    free(sinf);
    free(dcos);
    free(dsin);
    free(dq);
    free(qrot);
    free(qn);
    free(dkn);
    free(dvn);
    free(dout);
    free(dref);
    free(dnaive);
    free(qb);
    free(kn);
    free(vn);
    free(ob);
    CASE_END();
}

static void group_decode(void) {
    group_begin();
    decode_loop(FA_DTYPE_F32, 0, 64, 0);
    decode_loop(FA_DTYPE_F16, 16, 0, 1);
    decode_loop(FA_DTYPE_BF16, 3, 32, 1);
    group_end("64-step decode loops");
}

/* Bitwise equal results with 1, 2, 3 threads and num_splits 0, 1, 7. Variant 4's 28 chunks make
 * split tasks of runs of 7, 3 and 2 chunks on 1, 2 and 3 threads, with a window that starts the
 * band inside a chunk; variant 5's chunks run on the prefill's packed products. */
static void group_determinism(void) {
    group_begin();
    fa_context *ctx[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        fa_context_options o;
        fa_context_options_init(&o);
        o.num_threads = i + 1;
        fa_status s = fa_context_create(&o, &ctx[i]);
        CHECK_MSG(s == FA_OK, "fa_context_create(%d threads): %s", i + 1, fa_last_error_message());
        if (s != FA_OK)
            return;
    }
    static const int splits[3] = {0, 1, 7};
    for (int v = 0; v < 6; v++) {
        if (v == 4 && tu_emulated()) { /* fwd.c's chunk runs: portable C, tested natively */
            printf("  determinism variant 4 (caches of 19000 tokens): left out under emulation\n");
            continue;
        }
        kcfg c;
        int page = 0;
        if (v == 0) { /* split decode-like: g·Sq = 8, long caches, append + rotary */
            c = kbase(FA_DTYPE_F32, 3, 2, 8, 2, 64, 2, 3100);
            c.seqlens[0] = 3000;
            c.seqlens[1] = 700;
            c.seqlens[2] = 1500;
            c.rd = 64;
            c.causal = 1;
        } else if (v == 1) { /* split: 32 rows, decode's bf16 products (rows in fours) */
            c = kbase(FA_DTYPE_BF16, 2, 8, 8, 2, 64, 8, 1200);
            c.seqlens[0] = 1100;
            c.seqlens[1] = 40;
            c.causal = 1;
            c.alibi = 1;
        } else if (v == 2) { /* paged, fp16 */
            c = kbase(FA_DTYPE_F16, 2, 1, 8, 1, 128, 1, 2500);
            c.seqlens[0] = 2400;
            c.seqlens[1] = 1300;
            page = 16;
        } else if (v == 5) { /* MQA, 40 rows of fp32: split on the prefill's products */
            c = kbase(FA_DTYPE_F32, 1, 1, 40, 1, 64, 1, 5000);
            c.seqlens[0] = 4990;
            c.causal = 1;
        } else if (v == 4) { /* long caches: runs of chunks, a window band */
            c = kbase(FA_DTYPE_F16, 2, 1, 8, 2, 64, 1, 19200);
            c.seqlens[0] = 19000;
            c.seqlens[1] = 9000;
            c.causal = 1;
            c.wl = 15000;
        } else { /* leftpad + batch_idx, softcap */
            c = kbase(FA_DTYPE_F32, 2, 1, 4, 4, 32, 1, 2200);
            c.seqlens[0] = 2100;
            c.seqlens[1] = 2199;
            c.use_leftpad = 1;
            c.leftpad[0] = 50;
            c.leftpad[1] = 1000;
            c.use_bidx = 1;
            c.rows = 3;
            c.bidx[0] = 2;
            c.bidx[1] = 0;
            c.softcap = 8.0f;
        }
        kdata d;
        kdata_make(&c, &d);
        kres first;
        memset(&first, 0, sizeof first);
        for (int t = 0; t < 3; t++)
            for (int s = 0; s < 3; s++) {
                krun r = krun_default();
                r.page = page;
                r.ctx = ctx[t];
                r.num_splits = splits[s];
                r.check = t == 0 && s == 0;
                kres res;
                memset(&res, 0, sizeof res);
                /* same page table each run: reseed the draw that shuffles it */
                const uint64_t saved = tu_rng_state_;
                tu_rng_state_ = 12345;
                kv_run(&c, &d, &r, &res);
                tu_rng_state_ = saved;
                if (t == 0 && s == 0) {
                    first = res;
                    continue;
                }
                char what[160];
                snprintf(what, sizeof what,
                         "variant %d: %d threads, num_splits %d equal 1 thread, "
                         "num_splits 0, bitwise",
                         v, t + 1, splits[s]);
                if (first.out && res.out)
                    compare_results(what, &c, &d, &first, &res, c.S_cache);
                kres_free(&res);
            }
        kres_free(&first);
        kdata_free(&d);
    }
    for (int i = 0; i < 3; i++)
        fa_context_destroy(ctx[i]);
    group_end("determinism (threads, num_splits)");
}

/* Random configurations of everything at once: sizes, GQA, head dims, append or not, per-batch
 * lengths (a few past the split threshold), leftpad, cache_batch_idx, rotary, masks, softcap,
 * ALiBi, the three ways to give lengths, paged caches of odd page sizes, layouts, thread counts
 * and num_splits. Each run is checked against the fp64 reference. */
static void group_random(void) {
    group_begin();
    fa_context *ctx[3] = {NULL, NULL, NULL};
    for (int i = 1; i < 3; i++) { /* ctx[0]: the default context */
        fa_context_options o;
        fa_context_options_init(&o);
        o.num_threads = i == 1 ? 1 : 3;
        fa_status s = fa_context_create(&o, &ctx[i]);
        CHECK_MSG(s == FA_OK, "fa_context_create: %s", fa_last_error_message());
        if (s != FA_OK)
            return;
    }
    static const int64_t dims[] = {1, 6, 16, 32, 40, 64, 80, 128, 256};
    static const int pages[] = {0, 0, 0, 1, 2, 5, 16, 64};
    for (int it = 0; it < 100; it++) {
        const int64_t D = dims[tu_randint(0, 8)], Hk = tu_randint(1, 3);
        const int64_t g = (int64_t[]){1, 2, 4}[tu_randint(0, 2)], B = tu_randint(1, 4);
        const int64_t Sq = tu_randint(1, 5), S_new = tu_randint(0, 1) ? tu_randint(0, Sq + 1) : 0;
        /* long caches (split decode) only for small heads, to keep the group fast */
        const int64_t S_cache = S_new + (D <= 64 && tu_randint(0, 3) == 0 ? tu_randint(1025, 2200)
                                                                          : tu_randint(1, 200));
        kcfg c = kbase(k_dtypes[it % 3], B, Sq, Hk * g, Hk, D, S_new, S_cache);
        c.new_given = S_new > 0 || tu_randint(0, 1);
        krun r = krun_default();
        r.page = pages[tu_randint(0, 7)];
        const int mode = (int)tu_randint(0, 5);
        c.seqlen_mode = mode == 4 ? SEQ_SCALAR : mode == 5 && !c.new_given ? SEQ_WHOLE : SEQ_TENSOR;
        if (c.seqlen_mode == SEQ_WHOLE && r.page) /* -1 means every page of the table */
            c.S_cache = (c.S_cache + r.page - 1) / r.page * r.page;
        for (int64_t b = 0; b < B; b++)
            c.seqlens[b] = (int32_t)tu_randint(0, c.S_cache - S_new);
        const int64_t len0 = c.seqlen_mode == SEQ_WHOLE ? c.S_cache : c.seqlens[0];
        if (!r.page) { /* leftpad and cache_batch_idx are for contiguous caches only */
            c.use_leftpad = tu_randint(0, 2) == 0;
            for (int64_t b = 0; b < B; b++) {
                const int64_t len = c.seqlen_mode == SEQ_TENSOR ? c.seqlens[b] : len0;
                c.leftpad[b] = (int32_t)tu_randint(0, len);
            }
            if (tu_randint(0, 2) == 0) { /* distinct rows of a larger cache */
                c.use_bidx = 1;
                c.rows = B + tu_randint(0, 3);
                int32_t perm[MAXB + 3];
                for (int64_t i = 0; i < c.rows; i++)
                    perm[i] = (int32_t)i;
                for (int64_t i = c.rows - 1; i > 0; i--) {
                    const int64_t j = tu_randint(0, i);
                    const int32_t t = perm[i];
                    perm[i] = perm[j];
                    perm[j] = t;
                }
                for (int64_t b = 0; b < B; b++)
                    c.bidx[b] = perm[b];
            }
        }
        if (c.new_given && tu_randint(0, 2) == 0) { /* rotary needs k_new */
            c.rd = 2 * tu_randint(1, D / 2 > 0 ? D / 2 : 1);
            if (c.rd > D)
                c.rd = 0; /* D = 1: no pair to rotate */
            c.interleaved = (int)tu_randint(0, 1);
            c.ro_f32 = (int)tu_randint(0, 1);
        }
        c.causal = (int)tu_randint(0, 1);
        if (tu_randint(0, 1)) {
            c.wl = (int)tu_randint(-1, 300);
            c.wr = (int)tu_randint(-1, 8);
        }
        c.softcap = tu_randint(0, 3) == 0 ? (float)(1.0 + 20.0 * tu_uniform()) : 0.0f;
        c.alibi = (int)tu_randint(0, 2);
        r.lc = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        r.lq = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        r.lnew = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        r.lo = (int)tu_randint(0, TU_NUM_LAYOUTS - 1);
        r.llse = (int)tu_randint(0, 2);
        r.no_lse = tu_randint(0, 4) == 0;
        r.bt_garbage = (int)tu_randint(0, 1);
        r.seqlens_strided = (int)tu_randint(0, 1);
        r.ctx = ctx[tu_randint(0, 2)];
        r.num_splits = (int)(int64_t[]){0, 0, 1, 3, 64}[tu_randint(0, 4)];
        run1(&c, &r);
    }
    for (int i = 1; i < 3; i++)
        fa_context_destroy(ctx[i]);
    group_end("random combinations");
}

/* ---------------------------------------------------------------------------------------------
 * Bad input
 * ------------------------------------------------------------------------------------------- */

#define EBUF (1 << 14) /* floats per buffer: room for every mutated shape below */

enum {
    E_Q,
    E_KC,
    E_VC,
    E_KN,
    E_VN,
    E_OUT,
    E_LSE,
    E_SEQ,
    E_BIDX,
    E_PAD,
    E_BT,
    E_COS,
    E_SIN,
    E_SLOPES,
    E_NBUF
};

typedef struct kenv {
    float *buf[E_NBUF];
    unsigned char *snap[E_NBUF];
    fa_tensor q, out, lse;
    fa_kvcache kv;
    fa_params params;
    const fa_tensor *pq, *pout, *plse;
    const fa_kvcache *pkv;
    const fa_params *pp;
} kenv;

/* A valid call: fp32, B=2 Sq=2 H=4 Hk=2 D=8, S_new=2, causal, ALiBi (H), rotary (rd 4, 16 rows).
 * Contiguous: cache (3, 16, 2, 8), cache_seqlens {3, 5}, batch_idx {2, 0}, leftpad {1, 2}.
 * Paged: cache (10, 4, 2, 8), block_table {7, 2, 9, 0 / 5, 1, 8, 3}, no batch_idx/leftpad. */
static void kenv_init(kenv *e, int paged) {
    memset(e, 0, sizeof *e);
    for (int i = 0; i < E_NBUF; i++) {
        e->buf[i] = xmalloc(EBUF * sizeof(float));
        e->snap[i] = xmalloc(EBUF * sizeof(float));
        for (int j = 0; j < EBUF; j++)
            e->buf[i][j] = (float)tu_normal();
    }
    memset(e->buf[E_OUT], 0xA5, EBUF * sizeof(float));
    memset(e->buf[E_LSE], 0xA5, EBUF * sizeof(float));
    int32_t *seq = (int32_t *)e->buf[E_SEQ], *bidx = (int32_t *)e->buf[E_BIDX];
    int32_t *pad = (int32_t *)e->buf[E_PAD], *bt = (int32_t *)e->buf[E_BT];
    seq[0] = 3, seq[1] = 5;
    bidx[0] = 2, bidx[1] = 0;
    pad[0] = 1, pad[1] = 2;
    static const int32_t table[8] = {7, 2, 9, 0, 5, 1, 8, 3};
    memcpy(bt, table, sizeof table);
    for (int j = 0; j < EBUF; j++)
        e->buf[E_SLOPES][j] = 0.1f + 0.01f * (float)(j % 7);
    int64_t qs[4] = {2, 2, 4, 8}, ls[3] = {2, 4, 2}, ns[4] = {2, 2, 2, 8}, cs[4] = {3, 16, 2, 8},
            ps[4] = {10, 4, 2, 8}, b2 = 2, bts[2] = {2, 4}, rs[2] = {16, 2}, h4 = 4;
    e->q = fa_tensor_contiguous(e->buf[E_Q], FA_DTYPE_F32, 4, qs);
    e->out = fa_tensor_contiguous(e->buf[E_OUT], FA_DTYPE_F32, 4, qs);
    e->lse = fa_tensor_contiguous(e->buf[E_LSE], FA_DTYPE_F32, 3, ls);
    fa_kvcache_init(&e->kv);
    e->kv.k_cache = fa_tensor_contiguous(e->buf[E_KC], FA_DTYPE_F32, 4, paged ? ps : cs);
    e->kv.v_cache = fa_tensor_contiguous(e->buf[E_VC], FA_DTYPE_F32, 4, paged ? ps : cs);
    e->kv.k_new = fa_tensor_contiguous(e->buf[E_KN], FA_DTYPE_F32, 4, ns);
    e->kv.v_new = fa_tensor_contiguous(e->buf[E_VN], FA_DTYPE_F32, 4, ns);
    e->kv.cache_seqlens = fa_tensor_contiguous(seq, FA_DTYPE_I32, 1, &b2);
    if (paged) {
        e->kv.block_table = fa_tensor_contiguous(bt, FA_DTYPE_I32, 2, bts);
    } else {
        e->kv.cache_batch_idx = fa_tensor_contiguous(bidx, FA_DTYPE_I32, 1, &b2);
        e->kv.cache_leftpad = fa_tensor_contiguous(pad, FA_DTYPE_I32, 1, &b2);
    }
    e->kv.rotary_cos = fa_tensor_contiguous(e->buf[E_COS], FA_DTYPE_F32, 2, rs);
    e->kv.rotary_sin = fa_tensor_contiguous(e->buf[E_SIN], FA_DTYPE_F32, 2, rs);
    fa_params_init(&e->params);
    e->params.causal = 1;
    e->params.alibi_slopes = fa_tensor_contiguous(e->buf[E_SLOPES], FA_DTYPE_F32, 1, &h4);
    e->pq = &e->q;
    e->pout = &e->out;
    e->plse = &e->lse;
    e->pkv = &e->kv;
    e->pp = &e->params;
}

static void kenv_free(kenv *e) {
    for (int i = 0; i < E_NBUF; i++) {
        free(e->buf[i]);
        free(e->snap[i]);
    }
}

static void no_new(kenv *e) {
    e->kv.k_new.data = NULL;
    e->kv.v_new.data = NULL;
    e->kv.rotary_cos.data = NULL;
    e->kv.rotary_sin.data = NULL;
}

static void recontig(fa_tensor *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        t->stride[d] = st;
        st *= t->shape[d] > 0 ? t->shape[d] : 1;
    }
}

static void expect_status(kenv *e, int paged, const char *desc, fa_status want, const char *word,
                          const char *word2) {
    CASE_BEGIN("kvcache error (%s): %s", paged ? "paged" : "contiguous", desc);
    for (int i = 0; i < E_NBUF; i++)
        memcpy(e->snap[i], e->buf[i], EBUF * sizeof(float));
    fa_status st = kv_call(NULL, e->pp, e->pq, e->pkv, e->pout, e->plse);
    const char *msg = kv_msg();
    if (want == FA_OK) {
        CHECK_MSG(st == FA_OK, "status %s (%d): %s", fa_status_name(st), (int)st, msg);
        CHECK_EQ_STR(msg, "");
    } else {
        CHECK_MSG(st == want, "status %s (%d), expected %s; message \"%s\"", fa_status_name(st),
                  (int)st, fa_status_name(want), msg);
        CHECK_MSG(msg != NULL && msg[0] != '\0', "empty error message");
        if (msg && word)
            CHECK_MSG(tu_contains_word(msg, word) || (word2 && tu_contains_word(msg, word2)),
                      "message \"%s\" does not name \"%s\"%s%s", msg, word, word2 ? " or " : "",
                      word2 ? word2 : "");
        for (int i = 0; i < E_NBUF; i++)
            CHECK_MSG(memcmp(e->snap[i], e->buf[i], EBUF * sizeof(float)) == 0,
                      "buffer %d was modified by a failing call", i);
    }
    CASE_END();
}

#define KERR2(paged_, desc, want, word, word2, ...)                                                \
    do {                                                                                           \
        kenv e;                                                                                    \
        kenv_init(&e, paged_);                                                                     \
        { __VA_ARGS__; }                                                                           \
        expect_status(&e, paged_, desc, want, word, word2);                                        \
        kenv_free(&e);                                                                             \
    } while (0)
#define KERR(paged_, desc, want, word, ...) KERR2(paged_, desc, want, word, NULL, __VA_ARGS__)
#define KOK(paged_, desc, ...) KERR2(paged_, desc " (valid)", FA_OK, NULL, NULL, __VA_ARGS__)

static void group_errors(void) {
    group_begin();
    int32_t *SEQ, *BT, *PAD, *BIDX;
#define INTS(e)                                                                                    \
    SEQ = (int32_t *)e.buf[E_SEQ], BT = (int32_t *)e.buf[E_BT], PAD = (int32_t *)e.buf[E_PAD],     \
    BIDX = (int32_t *)e.buf[E_BIDX]
    for (int pg = 0; pg < 2; pg++) {
        KOK(pg, "baseline", (void)0);
        KOK(pg, "lse NULL", e.plse = NULL);
        KOK(pg, "params NULL", e.pp = NULL);
        KOK(pg, "no k_new, no rotary", no_new(&e));
        KOK(pg, "rotary table exactly long enough (7 rows)", e.kv.rotary_cos.shape[0] = 7;
            e.kv.rotary_sin.shape[0] = 7);
        KERR(pg, "rotary table one row short (6 rows)", FA_ERR_VALUE, "rotary_cos",
             e.kv.rotary_cos.shape[0] = 6;
             e.kv.rotary_sin.shape[0] = 6);
        KERR(pg, "rotary too short for q rows past the new keys (Sq 3 > S_new 2, causal)",
             FA_ERR_VALUE, "rotary_cos", e.q.shape[1] = 3;
             e.out.shape[1] = 3; e.lse.shape[2] = 3; recontig(&e.q); recontig(&e.out);
             recontig(&e.lse); e.kv.rotary_cos.shape[0] = 7; e.kv.rotary_sin.shape[0] = 7);
        KERR(pg, "rotary_dim > D (cos with D/2 + 1 columns)", FA_ERR_VALUE, "rotary_cos",
             e.kv.rotary_cos.shape[1] = 5;
             e.kv.rotary_sin.shape[1] = 5; recontig(&e.kv.rotary_cos); recontig(&e.kv.rotary_sin));
        KOK(pg, "rotary_dim = D", e.kv.rotary_cos.shape[1] = 4; e.kv.rotary_sin.shape[1] = 4;
            recontig(&e.kv.rotary_cos); recontig(&e.kv.rotary_sin));
        KERR(pg, "rotary_dim 0", FA_ERR_VALUE, "rotary_cos", e.kv.rotary_cos.shape[1] = 0;
             e.kv.rotary_sin.shape[1] = 0);
        KERR(pg, "rotary without k_new", FA_ERR_VALUE, "rotary_cos", e.kv.k_new.data = NULL;
             e.kv.v_new.data = NULL);
        KERR(pg, "only rotary_cos", FA_ERR_NULL_POINTER, "rotary_sin", e.kv.rotary_sin.data = NULL);
        KERR(pg, "only rotary_sin", FA_ERR_NULL_POINTER, "rotary_cos", e.kv.rotary_cos.data = NULL);
        KERR(pg, "rotary_cos f16 with f32 q", FA_ERR_DTYPE, "rotary_cos",
             e.kv.rotary_cos.dtype = FA_DTYPE_F16);
        KERR(pg, "rotary_sin bf16 with f32 q", FA_ERR_DTYPE, "rotary_sin",
             e.kv.rotary_sin.dtype = FA_DTYPE_BF16);
        KERR(pg, "rotary_cos i32", FA_ERR_DTYPE, "rotary_cos", e.kv.rotary_cos.dtype = FA_DTYPE_I32;
             e.kv.rotary_sin.dtype = FA_DTYPE_I32);
        KERR(pg, "rotary_sin shape differs from rotary_cos", FA_ERR_SHAPE, "rotary_sin",
             e.kv.rotary_sin.shape[0] = 15);
        KERR(pg, "rotary_cos rank 1", FA_ERR_RANK, "rotary_cos", e.kv.rotary_cos.ndim = 1);
        KERR(pg, "k_new without v_new", FA_ERR_NULL_POINTER, "v_new", e.kv.v_new.data = NULL);
        KERR(pg, "v_new without k_new", FA_ERR_NULL_POINTER, "k_new", e.kv.k_new.data = NULL;
             e.kv.rotary_cos.data = NULL; e.kv.rotary_sin.data = NULL);
        KERR2(pg, "k_new with cache_seqlen = -1 (no cache_seqlens)", FA_ERR_VALUE, "cache_seqlens",
              "cache_seqlen", e.kv.cache_seqlens.data = NULL);
        KERR(pg, "cache_seqlen = -2", FA_ERR_VALUE, "cache_seqlen", e.kv.cache_seqlens.data = NULL;
             e.kv.cache_seqlen = -2; no_new(&e));
        KERR(pg, "negative cache_seqlens", FA_ERR_VALUE, "cache_seqlens", INTS(e); SEQ[1] = -1);
        KERR2(pg, "scalar cache_seqlen + S_new beyond the cache", FA_ERR_VALUE, "cache_seqlen",
              "cache_seqlens", e.kv.cache_seqlens.data = NULL;
              e.kv.cache_seqlen = 15);
        KOK(
            pg, "scalar cache_seqlen + S_new = capacity", e.kv.cache_seqlens.data = NULL;
            e.kv.cache_seqlen = 14; e.kv.rotary_cos.data = e.kv.rotary_sin.data = NULL; if (!pg) {
                INTS(e);
                PAD[0] = PAD[1] = 0;
            });
        KERR(pg, "cache_seqlens + S_new one past the capacity (batch 1)", FA_ERR_VALUE,
             "cache_seqlens", INTS(e);
             SEQ[1] = 15);
        KOK(pg, "cache_seqlens + S_new = capacity (batch 1)", INTS(e); SEQ[1] = 14;
            e.kv.rotary_cos.data = e.kv.rotary_sin.data = NULL);
        KERR(pg, "cache_seqlens dtype f32", FA_ERR_DTYPE, "cache_seqlens",
             e.kv.cache_seqlens.dtype = FA_DTYPE_F32);
        KERR(pg, "cache_seqlens shape (3)", FA_ERR_SHAPE, "cache_seqlens",
             e.kv.cache_seqlens.shape[0] = 3);
        KERR(pg, "cache_seqlens rank 2", FA_ERR_RANK, "cache_seqlens", e.kv.cache_seqlens.ndim = 2;
             e.kv.cache_seqlens.shape[1] = 1; e.kv.cache_seqlens.stride[1] = 1);
        KERR(pg, "dropout_p > 0", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = 0.1f);
        KERR(pg, "num_splits 129", FA_ERR_VALUE, "num_splits", e.kv.num_splits = 129);
        KERR(pg, "num_splits -1", FA_ERR_VALUE, "num_splits", e.kv.num_splits = -1);
        KOK(pg, "num_splits 128", e.kv.num_splits = 128);
        KERR(pg, "kv NULL", FA_ERR_NULL_POINTER, "kv", e.pkv = NULL);
        KERR(pg, "kv.struct_size wrong", FA_ERR_STRUCT_SIZE, "struct_size", e.kv.struct_size -= 8);
        KERR(pg, "params.struct_size wrong", FA_ERR_STRUCT_SIZE, "struct_size",
             e.params.struct_size = 4);
        KERR(pg, "window_left -2", FA_ERR_VALUE, "window_left", e.params.window_left = -2);
        KERR(pg, "softcap negative", FA_ERR_VALUE, "softcap", e.params.softcap = -1.0f);
        KERR(pg, "alibi_slopes shape (3)", FA_ERR_SHAPE, "alibi_slopes",
             e.params.alibi_slopes.shape[0] = 3);
        /* tensors: NULL, ranks, dtypes, shapes */
        KERR(pg, "q NULL", FA_ERR_NULL_POINTER, "q", e.pq = NULL);
        KERR(pg, "out NULL", FA_ERR_NULL_POINTER, "out", e.pout = NULL);
        KERR(pg, "q rank 3", FA_ERR_RANK, "q", e.q.ndim = 3);
        KERR(pg, "q dtype i32", FA_ERR_DTYPE, "q", e.q.dtype = FA_DTYPE_I32);
        KERR(pg, "q D = 0", FA_ERR_SHAPE, "q", e.q.shape[3] = 0);
        KERR(pg, "q D = 257", FA_ERR_UNSUPPORTED, "q", e.q.shape[3] = 257; recontig(&e.q));
        KERR(pg, "q H = 3 (Hk 2 does not divide)", FA_ERR_SHAPE, "k_cache", e.q.shape[2] = 3;
             recontig(&e.q); e.out.shape[2] = 3; recontig(&e.out));
        KERR(pg, "k_cache NULL", FA_ERR_NULL_POINTER, "k_cache", e.kv.k_cache.data = NULL);
        KERR(pg, "v_cache NULL", FA_ERR_NULL_POINTER, "v_cache", e.kv.v_cache.data = NULL);
        KERR(pg, "k_cache rank 3", FA_ERR_RANK, "k_cache", e.kv.k_cache.ndim = 3);
        KERR(pg, "k_cache dtype f16 (q f32)", FA_ERR_DTYPE, "k_cache",
             e.kv.k_cache.dtype = FA_DTYPE_F16);
        KERR(pg, "v_cache dtype bf16 (q f32)", FA_ERR_DTYPE, "v_cache",
             e.kv.v_cache.dtype = FA_DTYPE_BF16);
        KERR(pg, "v_cache shape[1] differs from k_cache", FA_ERR_SHAPE, "v_cache",
             e.kv.v_cache.shape[1] -= 1;
             recontig(&e.kv.v_cache));
        KERR(pg, "caches' head dim 9 (q 8)", FA_ERR_SHAPE, "k_cache", e.kv.k_cache.shape[3] = 9;
             recontig(&e.kv.k_cache); e.kv.v_cache.shape[3] = 9; recontig(&e.kv.v_cache));
        /* FA_DEVICE_CUDA here means "the device q is not on" (see kv_call) */
        KERR(pg, "k_cache on the other device", FA_ERR_DEVICE, "k_cache",
             e.kv.k_cache.device = FA_DEVICE_CUDA);
        KERR(pg, "v_new on the other device", FA_ERR_DEVICE, "v_new",
             e.kv.v_new.device = FA_DEVICE_CUDA);
        KERR(pg, "rotary_sin on the other device", FA_ERR_DEVICE, "rotary_sin",
             e.kv.rotary_sin.device = FA_DEVICE_CUDA);
        KERR(pg, "alibi_slopes on the other device", FA_ERR_DEVICE, "alibi_slopes",
             e.params.alibi_slopes.device = FA_DEVICE_CUDA);
        KERR(pg, "lse on the other device", FA_ERR_DEVICE, "lse", e.lse.device = FA_DEVICE_CUDA);
        /* indices: CUDA ones with CPU q are refused, host ones with CUDA q accepted */
        KERR(pg, "cache_seqlens on the other device", g_cuda ? FA_OK : FA_ERR_DEVICE,
             g_cuda ? NULL : "cache_seqlens", e.kv.cache_seqlens.device = FA_DEVICE_CUDA);
        if (pg)
            KERR(pg, "block_table on the other device", g_cuda ? FA_OK : FA_ERR_DEVICE,
                 g_cuda ? NULL : "block_table", e.kv.block_table.device = FA_DEVICE_CUDA);
        KERR(pg, "k_cache negative stride", FA_ERR_STRIDE, "k_cache", e.kv.k_cache.stride[1] = -16);
        KERR(pg, "k_new shape[0] = 3 (B 2)", FA_ERR_SHAPE, "k_new", e.kv.k_new.shape[0] = 3);
        KERR(pg, "k_new shape[2] = 1 (Hk 2)", FA_ERR_SHAPE, "k_new", e.kv.k_new.shape[2] = 1);
        KERR(pg, "k_new head dim 7", FA_ERR_SHAPE, "k_new", e.kv.k_new.shape[3] = 7;
             recontig(&e.kv.k_new));
        KERR(pg, "v_new S_new 1 (k_new 2)", FA_ERR_SHAPE, "v_new", e.kv.v_new.shape[1] = 1);
        KERR(pg, "k_new dtype f16", FA_ERR_DTYPE, "k_new", e.kv.k_new.dtype = FA_DTYPE_F16);
        KERR(pg, "v_new rank 3", FA_ERR_RANK, "v_new", e.kv.v_new.ndim = 3);
        KERR(pg, "out shape Sq 3", FA_ERR_SHAPE, "out", e.out.shape[1] = 3; recontig(&e.out));
        KERR(pg, "out dtype f16", FA_ERR_DTYPE, "out", e.out.dtype = FA_DTYPE_F16);
        KERR(pg, "lse dtype f16", FA_ERR_DTYPE, "lse", e.lse.dtype = FA_DTYPE_F16);
        KERR(pg, "lse shape (2, 4, 3)", FA_ERR_SHAPE, "lse", e.lse.shape[2] = 3; recontig(&e.lse));
        KERR(pg, "lse rank 2", FA_ERR_RANK, "lse", e.lse.ndim = 2);
        /* overlaps */
        KERR(pg, "k_cache overlaps q while appending", FA_ERR_OVERLAP, "k_cache",
             e.kv.k_cache.data = e.buf[E_Q]);
        KOK(pg, "k_cache overlaps q without appending (both only read)", no_new(&e);
            e.kv.k_cache.data = e.buf[E_Q]);
        KERR2(pg, "out overlaps v_cache (appending)", FA_ERR_OVERLAP, "out", "v_cache",
              e.out.data = e.buf[E_VC] + 100);
        KERR2(pg, "out overlaps k_cache (not appending)", FA_ERR_OVERLAP, "out", "k_cache",
              no_new(&e);
              e.out.data = e.buf[E_KC] + 8);
        KERR2(pg, "lse overlaps k_cache", FA_ERR_OVERLAP, "lse", "k_cache",
              e.lse.data = e.buf[E_KC] + 3);
        KERR2(pg, "k_cache == v_cache while appending", FA_ERR_OVERLAP, "k_cache", "v_cache",
              e.kv.v_cache.data = e.buf[E_KC]);
        KOK(pg, "k_cache == v_cache without appending", no_new(&e);
            e.kv.v_cache.data = e.buf[E_KC]);
        KERR2(pg, "k_new inside k_cache while appending", FA_ERR_OVERLAP, "k_cache", "k_new",
              e.kv.k_new.data = e.buf[E_KC] + 200);
        KERR2(pg, "v_cache overlaps rotary_sin", FA_ERR_OVERLAP, "v_cache", "rotary_sin",
              e.kv.rotary_sin.data = e.buf[E_VC] + 5);
    }
    /* contiguous only */
    KERR(0, "leftpad > cache_seqlens (batch 1)", FA_ERR_VALUE, "cache_leftpad", INTS(e);
         PAD[1] = 6);
    KOK(0, "leftpad = cache_seqlens", INTS(e); PAD[1] = 5);
    KERR(0, "negative leftpad", FA_ERR_VALUE, "cache_leftpad", INTS(e); PAD[0] = -1);
    KERR(0, "cache_leftpad dtype f32", FA_ERR_DTYPE, "cache_leftpad",
         e.kv.cache_leftpad.dtype = FA_DTYPE_F32);
    KERR(0, "cache_leftpad shape (1)", FA_ERR_SHAPE, "cache_leftpad",
         e.kv.cache_leftpad.shape[0] = 1);
    KERR(0, "cache_batch_idx = 3 (B_cache 3)", FA_ERR_VALUE, "cache_batch_idx", INTS(e);
         BIDX[1] = 3);
    KERR(0, "cache_batch_idx negative", FA_ERR_VALUE, "cache_batch_idx", INTS(e); BIDX[0] = -1);
    KERR(0, "cache_batch_idx duplicated while appending", FA_ERR_VALUE, "cache_batch_idx", INTS(e);
         BIDX[1] = 2);
    KOK(0, "cache_batch_idx duplicated without appending", no_new(&e); INTS(e); BIDX[1] = 2);
    KERR(0, "cache_batch_idx dtype f16", FA_ERR_DTYPE, "cache_batch_idx",
         e.kv.cache_batch_idx.dtype = FA_DTYPE_F16);
    KERR(0, "cache_batch_idx shape (3)", FA_ERR_SHAPE, "cache_batch_idx",
         e.kv.cache_batch_idx.shape[0] = 3);
    KERR(0, "B_cache 1 < B 2 without cache_batch_idx", FA_ERR_SHAPE, "k_cache",
         e.kv.cache_batch_idx.data = NULL;
         e.kv.k_cache.shape[0] = 1; e.kv.v_cache.shape[0] = 1);
    KOK(0, "B_cache 3 > B 2 without cache_batch_idx", e.kv.cache_batch_idx.data = NULL);
    /* paged only */
    KERR(1, "block_table entry negative (used page, batch 1)", FA_ERR_VALUE, "block_table", INTS(e);
         BT[5] = -1);
    KERR(1, "block_table entry = num_pages (used page, batch 1)", FA_ERR_VALUE, "block_table",
         INTS(e);
         BT[5] = 10);
    KOK(1, "block_table garbage in unused entries", INTS(e); BT[2] = -1; BT[3] = 10; BT[6] = 99999;
        BT[7] = -5);
    KERR(1, "block_table entry out of range for a page only the append uses", FA_ERR_VALUE,
         "block_table", INTS(e);
         SEQ[0] = 3; BT[1] = 10);
    KERR(1, "cache_batch_idx with block_table", FA_ERR_UNSUPPORTED, "cache_batch_idx",
         int64_t b2 = 2;
         e.kv.cache_batch_idx = fa_tensor_contiguous(e.buf[E_BIDX], FA_DTYPE_I32, 1, &b2));
    KERR(1, "cache_leftpad with block_table", FA_ERR_UNSUPPORTED, "cache_leftpad", int64_t b2 = 2;
         e.kv.cache_leftpad = fa_tensor_contiguous(e.buf[E_PAD], FA_DTYPE_I32, 1, &b2));
    KERR(1, "block_table dtype f32", FA_ERR_DTYPE, "block_table",
         e.kv.block_table.dtype = FA_DTYPE_F32);
    KERR(1, "block_table shape[0] = 3", FA_ERR_SHAPE, "block_table", e.kv.block_table.shape[0] = 3;
         recontig(&e.kv.block_table));
    KERR(1, "block_table rank 1", FA_ERR_RANK, "block_table", e.kv.block_table.ndim = 1);
    KERR(1, "block_table stride[1] = 2", FA_ERR_STRIDE, "block_table", INTS(e); BT[8] = 4;
         BT[10] = 6; e.kv.block_table.stride[1] = 2; e.kv.block_table.stride[0] = 8);
    KERR2(1, "page_size 0", FA_ERR_SHAPE, "k_cache", "page_size", e.kv.k_cache.shape[1] = 0;
          e.kv.v_cache.shape[1] = 0);
#undef INTS
    group_end("bad input");
}

/* Every group by default; the ones named on the command line otherwise (make tsan runs the
 * determinism group beside the others, in two processes). */
static const struct {
    const char *name;
    void (*run)(void);
} k_groups[] = {
    {"append", group_append}, {"masks", group_masks},
    {"rotary", group_rotary}, {"indices", group_indices},
    {"paged", group_paged},   {"split", group_split},
    {"decode", group_decode}, {"determinism", group_determinism},
    {"random", group_random}, {"errors", group_errors},
};
#define K_NGROUPS (int)(sizeof k_groups / sizeof k_groups[0])

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--cuda") == 0) {
        g_cuda = 1;
        argv[1] = argv[0];
        argv++, argc--;
        int32_t n = 0;
        const fa_status st = fa_device_count(FA_DEVICE_CUDA, &n);
        if (st != FA_OK || n == 0) {
            printf("SKIP: no CUDA device: %s\n",
                   st != FA_OK ? fa_last_error_message() : "fa_device_count found none");
            return 77;
        }
    }
    for (int a = 1; a < argc; a++) {
        int g = 0;
        while (g < K_NGROUPS && strcmp(argv[a], k_groups[g].name) != 0)
            g++;
        if (g == K_NGROUPS) {
            fprintf(stderr, "test_kvcache: no group '%s'; the groups:", argv[a]);
            for (g = 0; g < K_NGROUPS; g++)
                fprintf(stderr, " %s", k_groups[g].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    tu_seed_init(g_cuda ? "test_kvcache --cuda" : "test_kvcache");
    printf("library %s; %s\n", fa_version_string(), fa_build_info());
    for (int g = 0; g < K_NGROUPS; g++) {
        int named = argc == 1;
        for (int a = 1; a < argc; a++)
            named |= strcmp(argv[a], k_groups[g].name) == 0;
        if (named)
            k_groups[g].run();
    }
    for (int t = 0; t < 3; t++) {
        const tu_errstats *s = &g_stats[t]; /* k_dtypes[t] == t */
        if (k_dtypes[t] == FA_DTYPE_F32)
            printf("max error %s vs fp64 over %ld checks: out rel %.3g (abs %.3g), lse rel %.3g "
                   "(abs %.3g)\n",
                   tu_dtype_name(k_dtypes[t]), s->cases, s->max_rel, s->max_abs, s->max_lse_rel,
                   s->max_lse_abs);
        else
            printf("max error %s vs fp64 over %ld checks: out rel %.3g (abs %.3g, at most %.2fx "
                   "the naive %s implementation's), lse rel %.3g (abs %.3g)\n",
                   tu_dtype_name(k_dtypes[t]), s->cases, s->max_rel, s->max_abs, s->max_ratio,
                   tu_dtype_name(k_dtypes[t]), s->max_lse_rel, s->max_lse_abs);
    }
    if (g_cuda)
        printf("max |out cuda - out cpu|: fp32 %.3g, fp16 %.3g, bf16 %.3g\n",
               g_out_vs_cpu[FA_DTYPE_F32], g_out_vs_cpu[FA_DTYPE_F16], g_out_vs_cpu[FA_DTYPE_BF16]);
    return TEST_REPORT();
}
