/* SPDX-License-Identifier: MIT */
/*
 * api_kvcache.c — fa_forward_kvcache: validation of the cache, its indices and the rotary
 * tables (all before anything is written, the cache included), then append, rotary and the
 * forward over the cache's view, on the CPU or by the CUDA plug-in. With CUDA tensors the
 * indices (cache_seqlens, cache_batch_idx, cache_leftpad, block_table) may lie on the host or
 * on the device; device ones are copied to the host for the checks (a wait on the stream).
 * 8-bit caches (CPU only) carry scales, checked here and given to the views (fa__view.scale).
 */
#include "cpu/cpu.h"
#include "internal.h"
#include "plugin.h"
#include "size.h"
#include "validate.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { FA_MAX_SPLITS = 128, MAX_SPANS = 16 };

void fa_kvcache_init(fa_kvcache *kv) {
    if (!kv) return;
    *kv = (fa_kvcache){.struct_size = sizeof *kv, .cache_seqlen = -1, .rotary_interleaved = 1};
}

static int given(const fa_tensor *t) { return t->data != NULL; }

/* Everything validated, and the per-batch integers copied out of their tensors. */
typedef struct kvcall {
    int64_t B, Sq, H, Hk, D, Dv, S_new, capacity, rows; /* rows: B_cache or number of pages */
    int paged, append;
    int q8;          /* 8-bit caches: scale views below */
    int scale_token[2]; /* k, v: a scale per token (the append writes it), else per (b, hk) */
    fa__view scale_fwd[2], scale_app[2]; /* the forward's (from leftpad on), the append's */
    int32_t *ints; /* one allocation: seqlens, seqlens_k, batch_idx, leftpad [B] each */
    int32_t *seqlens, *seqlens_k, *batch_idx, *leftpad;
    const int32_t *bt;  /* the block table's entries on the host (paged) */
    int32_t *bt_copy;   /* ... when copied from the device */
    const fa_tensor *q; /* the call's device */
    const fa__plugin_api *api; /* CUDA calls: the plug-in; NULL on the CPU */
    void *stream;
    fa__span in[MAX_SPANS], out[6];
    int n_in, n_out;
} kvcall;

static fa__span *span(kvcall *c, int is_output) {
    return is_output ? &c->out[c->n_out++] : &c->in[c->n_in++];
}

/* The entries of index tensor t (checked by fa__check_view) on the host: t->data, or a copy
 * of a CUDA tensor in *copy (the caller frees it). An index tensor lies on the host or on the
 * call's device. */
static fa_status host_ints(kvcall *c, const fa_tensor *t, const char *name, int32_t **copy,
                           const int32_t **data) {
    *copy = NULL;
    *data = t->data;
    if (t->device == FA_DEVICE_CPU) return FA_OK;
    fa_status st = fa__check_same_device(t, name, c->q, "q");
    if (st == FA_OK) st = fa__plugin_download(c->api, t, name, c->stream, (void **)copy);
    *data = *copy;
    return st;
}

/* A (B) int32 tensor, copied into dst. */
static fa_status read_ints(kvcall *c, const fa_tensor *t, const char *name, int32_t *dst) {
    fa_status st = fa__check_vector(t, name, "(B)", FA_DTYPE_I32, c->B, 0, span(c, 0));
    if (st != FA_OK) return st;
    int32_t *copy;
    const int32_t *src;
    if ((st = host_ints(c, t, name, &copy, &src))) return st;
    for (int64_t b = 0; b < c->B; b++) dst[b] = src[b * t->stride[0]];
    free(copy);
    return FA_OK;
}

/* q, out, the caches and the new keys/values: ranks, dtypes, shapes. */
static fa_status check_tensors(kvcall *c, const fa_tensor *q, const fa_kvcache *kv,
                               const fa_tensor *out) {
    const char *qd = "(B, Sq, H, D)";
    fa_status st;
    if ((st = fa__check_view(q, "q", 4, qd, 0, span(c, 0)))) return st;
    if (q->dtype != FA_DTYPE_F32 && q->dtype != FA_DTYPE_F16 && q->dtype != FA_DTYPE_BF16)
        return fa__error(FA_ERR_DTYPE, "q: dtype is %s; expected f32, f16 or bf16",
                         fa__dtype_name(q->dtype));
    c->B = q->shape[0];
    c->Sq = q->shape[1];
    c->H = q->shape[2];
    c->D = q->shape[3];

    c->paged = given(&kv->block_table);
    c->append = given(&kv->k_new) || given(&kv->v_new);
    const char *cds[2] = {
        c->paged ? "(num_pages, page_size, Hk, D)" : "(B_cache, S_cache, Hk, D)",
        c->paged ? "(num_pages, page_size, Hk, Dv)" : "(B_cache, S_cache, Hk, Dv)"};
    const fa_tensor *caches[2] = {&kv->k_cache, &kv->v_cache};
    const char *cnames[2] = {"kv.k_cache", "kv.v_cache"};
    for (int t = 0; t < 2; t++) {
        const char *cd = cds[t];
        if (!given(caches[t]))
            return fa__error(FA_ERR_NULL_POINTER, "%s: data is NULL; the cache is required",
                             cnames[t]);
        if ((st = fa__check_view(caches[t], cnames[t], 4, cd, c->append, span(c, c->append))))
            return st;
        const int32_t cdt = caches[t]->dtype, k8 = fa__dtype_8bit(kv->k_cache.dtype);
        if (t ? cdt != (k8 ? kv->k_cache.dtype : q->dtype) : cdt != q->dtype && !k8)
            return fa__error(FA_ERR_DTYPE, "%s: dtype is %s but q is %s; expected q's dtype, or "
                             "both caches i8, f8_e4m3 or f8_e5m2 (with k_scale and v_scale)",
                             cnames[t], fa__dtype_name(cdt), fa__dtype_name(q->dtype));
        for (int i = 0; i < 3; i++) /* the head dims (Dv and D) may differ */
            if (caches[t]->shape[i] != kv->k_cache.shape[i])
                return fa__error(FA_ERR_SHAPE, "%s: shape[%d] is %lld; expected kv.k_cache's %lld",
                                 cnames[t], i, (long long)caches[t]->shape[i],
                                 (long long)kv->k_cache.shape[i]);
    }
    if ((st = fa__check_heads(q, &kv->k_cache, "kv.k_cache", 2, 3))) return st;
    c->Dv = kv->v_cache.shape[3];
    if (c->Dv == 0 || c->Dv > FA_MAX_HEAD_DIM)
        return fa__error(c->Dv ? FA_ERR_UNSUPPORTED : FA_ERR_SHAPE, "kv.v_cache: head dim Dv "
                         "(shape[3]) is %lld; supported: 1..%d", (long long)c->Dv,
                         FA_MAX_HEAD_DIM);
    c->Hk = kv->k_cache.shape[2];
    c->rows = kv->k_cache.shape[0];
    c->q8 = fa__dtype_8bit(kv->k_cache.dtype);

    if (c->append) {
        const fa_tensor *nw[2] = {&kv->k_new, &kv->v_new};
        const char *nnames[2] = {"kv.k_new", "kv.v_new"};
        for (int t = 0; t < 2; t++) {
            if (!given(nw[t]))
                return fa__error(FA_ERR_NULL_POINTER, "%s: data is NULL; k_new and v_new come "
                                 "together", nnames[t]);
            const char *nd = t ? "(B, S_new, Hk, Dv)" : "(B, S_new, Hk, D)";
            if ((st = fa__check_view(nw[t], nnames[t], 4, nd, 0, span(c, 0)))) return st;
            if (nw[t]->dtype != q->dtype)
                return fa__error(FA_ERR_DTYPE, "%s: dtype is %s but q is %s; they must match",
                                 nnames[t], fa__dtype_name(nw[t]->dtype), fa__dtype_name(q->dtype));
            const int64_t want[4] = {c->B, kv->k_new.shape[1], c->Hk, t ? c->Dv : c->D};
            for (int i = 0; i < 4; i++)
                if (nw[t]->shape[i] != want[i])
                    return fa__error(FA_ERR_SHAPE, "%s: shape[%d] is %lld; expected %lld %s",
                                     nnames[t], i, (long long)nw[t]->shape[i],
                                     (long long)want[i], nd);
        }
        c->S_new = kv->k_new.shape[1];
    }
    if ((st = fa__check_view(out, "out", 4, "(B, Sq, H, Dv)", 1, span(c, 1)))) return st;
    if (out->dtype != q->dtype)
        return fa__error(FA_ERR_DTYPE, "out: dtype is %s but q is %s; they must match",
                         fa__dtype_name(out->dtype), fa__dtype_name(q->dtype));
    for (int i = 0; i < 3; i++)
        if (out->shape[i] != q->shape[i])
            return fa__error(FA_ERR_SHAPE, "out: shape[%d] is %lld; expected q's %lld", i,
                             (long long)out->shape[i], (long long)q->shape[i]);
    if (out->shape[3] != c->Dv)
        return fa__error(FA_ERR_SHAPE, "out: head dim (shape[3]) is %lld; expected "
                         "kv.v_cache's %lld (B, Sq, H, Dv)", (long long)out->shape[3],
                         (long long)c->Dv);
    return FA_OK;
}

/* Batch b's entry e of the page table (checked to be a page). */
static int32_t page_of(const kvcall *c, const fa_kvcache *kv, int64_t b, int64_t e) {
    const fa_tensor *bt = &kv->block_table;
    return c->bt[b * bt->stride[0] + e * bt->stride[1]];
}

/* An append must not write cache rows another batch of the call uses: two batches with one
 * cache_batch_idx row, or a page that one batch's append writes in another batch's page table
 * (pages that are only read, a shared prefix, may be shared). One pass over the batches with
 * a mark per cache row or page: linear in B and the pages used. */
static fa_status check_writers(kvcall *c, const fa_kvcache *kv) {
    if (!c->batch_idx && !c->paged) return FA_OK; /* batch b appends to row b */
    int64_t *owner = fa__alloc(c->rows, sizeof *owner); /* b + 1 of the batch writing it, or 0 */
    if (!owner)
        return fa__error(FA_ERR_NO_MEMORY, "fa_forward_kvcache: out of memory for a mark per "
                         "cache %s (%lld)", c->paged ? "page" : "row", (long long)c->rows);
    memset(owner, 0, (size_t)c->rows * sizeof *owner);
    fa_status st = FA_OK;
    if (!c->paged) {
        for (int64_t b = 0; b < c->B && st == FA_OK; b++) {
            int64_t *o = &owner[c->batch_idx[b]];
            if (*o)
                st = fa__error(FA_ERR_VALUE, "kv.cache_batch_idx[%lld] = [%lld] = %d: two "
                               "batches would append to one cache row", (long long)*o - 1,
                               (long long)b, c->batch_idx[b]);
            *o = b + 1;
        }
        free(owner);
        return st;
    }
    const int64_t page = kv->k_cache.shape[1];
    for (int64_t b = 0; b < c->B && st == FA_OK; b++) { /* the pages each append writes */
        const int64_t first = c->seqlens[b] / page, last = (c->seqlens[b] + c->S_new - 1) / page;
        for (int64_t e = first; e <= last && st == FA_OK; e++) {
            int64_t *o = &owner[page_of(c, kv, b, e)];
            if (*o && *o != b + 1)
                st = fa__error(FA_ERR_VALUE, "kv.block_table: batches %lld and %lld both append "
                               "to page %d; an appended page must belong to one batch",
                               (long long)*o - 1, (long long)b, page_of(c, kv, b, e));
            *o = b + 1;
        }
    }
    for (int64_t b = 0; b < c->B && st == FA_OK; b++) { /* and no other batch reads them */
        const int64_t used = (c->seqlens[b] + c->S_new + page - 1) / page;
        for (int64_t e = 0; e < used && st == FA_OK; e++) {
            const int64_t o = owner[page_of(c, kv, b, e)];
            if (o && o != b + 1)
                st = fa__error(FA_ERR_VALUE, "kv.block_table[%lld, %lld] = %d: batch %lld's append "
                               "writes that page, which batch %lld also uses; an appended page "
                               "must belong to one batch", (long long)b, (long long)e,
                               page_of(c, kv, b, e), (long long)o - 1, (long long)b);
        }
    }
    free(owner);
    return st;
}

/* Lengths, batch indices, leftpad and page table: shapes and values. */
static fa_status check_indices(kvcall *c, const fa_kvcache *kv) {
    fa_status st;
    const int64_t B = c->B;
    if (c->paged) {
        if (given(&kv->cache_batch_idx) || given(&kv->cache_leftpad))
            return fa__error(FA_ERR_UNSUPPORTED, "kv.%s: not supported with a paged cache "
                             "(block_table); index pages through block_table instead",
                             given(&kv->cache_batch_idx) ? "cache_batch_idx" : "cache_leftpad");
        const fa_tensor *bt = &kv->block_table;
        if ((st = fa__check_view(bt, "kv.block_table", 2, "(B, max_pages)", 0, span(c, 0))))
            return st;
        if (bt->dtype != FA_DTYPE_I32)
            return fa__error(FA_ERR_DTYPE, "kv.block_table: dtype is %s; expected i32",
                             fa__dtype_name(bt->dtype));
        if (bt->shape[0] != B)
            return fa__error(FA_ERR_SHAPE, "kv.block_table: shape[0] is %lld; expected B = %lld",
                             (long long)bt->shape[0], (long long)B);
        if (bt->shape[1] > 1 && bt->stride[1] != 1)
            return fa__error(FA_ERR_STRIDE, "kv.block_table: stride[1] is %lld; expected 1 (pages "
                             "of a row are contiguous)", (long long)bt->stride[1]);
        if (kv->k_cache.shape[1] < 1)
            return fa__error(FA_ERR_SHAPE, "kv.k_cache: page_size (shape[1]) is 0; expected >= 1");
        if ((st = host_ints(c, bt, "kv.block_table", &c->bt_copy, &c->bt))) return st;
        c->capacity = fa__size_mul(bt->shape[1], kv->k_cache.shape[1]);
        if (c->capacity < 0) c->capacity = INT64_MAX; /* more than any int32 length reaches */
    } else {
        c->capacity = kv->k_cache.shape[1];
    }

    c->ints = fa__alloc(fa__size_mul(4, B), sizeof *c->ints);
    if (!c->ints)
        return fa__error(FA_ERR_NO_MEMORY, "fa_forward_kvcache: out of memory for the %lld "
                         "batches' lengths and indices", (long long)B);
    c->seqlens = c->ints;
    c->seqlens_k = c->ints + B;
    c->batch_idx = c->leftpad = NULL;

    if (given(&kv->cache_seqlens)) {
        if ((st = read_ints(c, &kv->cache_seqlens, "kv.cache_seqlens", c->seqlens))) return st;
    } else {
        if (kv->cache_seqlen < -1)
            return fa__error(FA_ERR_VALUE, "kv.cache_seqlen is %lld; expected -1 (the whole cache) "
                             "or >= 0", (long long)kv->cache_seqlen);
        if (c->append && kv->cache_seqlen < 0)
            return fa__error(FA_ERR_VALUE, "kv.cache_seqlens: absent (and cache_seqlen = -1) while "
                             "k_new is given; say where the new keys go");
        const int64_t len = kv->cache_seqlen < 0 ? c->capacity : kv->cache_seqlen;
        if (len > INT32_MAX)
            return fa__error(FA_ERR_VALUE, "kv.cache_seqlen is %lld; expected <= %d",
                             (long long)len, INT32_MAX);
        for (int64_t b = 0; b < B; b++) c->seqlens[b] = (int32_t)len;
    }
    if (given(&kv->cache_batch_idx)) {
        c->batch_idx = c->ints + 2 * B;
        if ((st = read_ints(c, &kv->cache_batch_idx, "kv.cache_batch_idx", c->batch_idx))) return st;
    }
    if (given(&kv->cache_leftpad)) {
        c->leftpad = c->ints + 3 * B;
        if ((st = read_ints(c, &kv->cache_leftpad, "kv.cache_leftpad", c->leftpad))) return st;
    }
    if (!c->paged && !c->batch_idx && c->rows < B)
        return fa__error(FA_ERR_SHAPE, "kv.k_cache: shape[0] (B_cache) is %lld, fewer than q's %lld "
                         "batches; pass cache_batch_idx to choose rows", (long long)c->rows,
                         (long long)B);

    for (int64_t b = 0; b < B; b++) {
        const int64_t len = c->seqlens[b], end = len + c->S_new;
        if (len < 0)
            return fa__error(FA_ERR_VALUE, "kv.cache_seqlens[%lld] is %lld; expected >= 0",
                             (long long)b, (long long)len);
        if (end > INT32_MAX)
            return fa__error(FA_ERR_VALUE, "kv.cache_seqlens[%lld] + S_new = %lld + %lld is more "
                             "than %d positions; cache positions are int32", (long long)b,
                             (long long)len, (long long)c->S_new, INT32_MAX);
        if (end > c->capacity) {
            if (!given(&kv->cache_seqlens))
                return fa__error(FA_ERR_VALUE, "kv.cache_seqlen + S_new = %lld + %lld exceeds the "
                                 "cache's %lld positions", (long long)len, (long long)c->S_new,
                                 (long long)c->capacity);
            return fa__error(FA_ERR_VALUE, "kv.cache_seqlens[%lld] + S_new = %lld + %lld exceeds the "
                             "cache's %lld positions", (long long)b, (long long)len,
                             (long long)c->S_new, (long long)c->capacity);
        }
        const int64_t pad = c->leftpad ? c->leftpad[b] : 0;
        if (pad < 0 || pad > len)
            return fa__error(FA_ERR_VALUE, "kv.cache_leftpad[%lld] is %lld; expected 0..cache_seqlens "
                             "= %lld", (long long)b, (long long)pad, (long long)len);
        c->seqlens_k[b] = (int32_t)(end - pad);
        if (c->batch_idx) {
            const int64_t row = c->batch_idx[b];
            if (row < 0 || row >= c->rows)
                return fa__error(FA_ERR_VALUE, "kv.cache_batch_idx[%lld] is %lld; expected 0..%lld",
                                 (long long)b, (long long)row, (long long)c->rows - 1);
        }
        if (c->paged) {
            const fa_tensor *bt = &kv->block_table;
            const int64_t page = kv->k_cache.shape[1], used = (end + page - 1) / page;
            for (int64_t pg = 0; pg < used; pg++) {
                const int32_t e = c->bt[b * bt->stride[0] + pg * bt->stride[1]];
                if (e < 0 || e >= c->rows)
                    return fa__error(FA_ERR_VALUE, "kv.block_table[%lld, %lld] is %d; expected a "
                                     "page in 0..%lld", (long long)b, (long long)pg, e,
                                     (long long)c->rows - 1);
            }
        }
    }
    return c->S_new > 0 ? check_writers(c, kv) : FA_OK;
}

/* The scales of 8-bit caches: present exactly with them, fp32, of a shape of their own. Before
 * the indices are read, so a call with nothing to do is refused as well. */
static fa_status check_scales(kvcall *c, const fa_kvcache *kv) {
    const fa_tensor *sc[2] = {&kv->k_scale, &kv->v_scale};
    const char *names[2] = {"kv.k_scale", "kv.v_scale"};
    fa_status st;
    for (int t = 0; t < 2; t++) {
        if (!c->q8) {
            if (given(sc[t]))
                return fa__error(FA_ERR_VALUE, "%s: given, but the caches are %s; scales go "
                                 "with 8-bit caches (i8, f8_e4m3, f8_e5m2)", names[t],
                                 fa__dtype_name(kv->k_cache.dtype));
            continue;
        }
        if (!given(sc[t]))
            return fa__error(FA_ERR_NULL_POINTER, "%s: data is NULL; %s caches need their "
                             "scales", names[t], fa__dtype_name(kv->k_cache.dtype));
        const int token = sc[t]->ndim == 3; /* else (B, Hk) */
        const char *tdims = c->paged ? "(num_pages, page_size, Hk)" : "(B_cache, S_cache, Hk)";
        const char *dims = token ? tdims : "(B, Hk)";
        if (sc[t]->ndim != 2 && sc[t]->ndim != 3)
            return fa__error(FA_ERR_SHAPE, "%s: ndim is %d; expected 3, a scale per token %s, "
                             "or 2, one per batch and KV head (B, Hk)", names[t], sc[t]->ndim,
                             tdims);
        const int out = token && c->append; /* the append writes the new rows' scales */
        if ((st = fa__check_view(sc[t], names[t], sc[t]->ndim, dims, out, span(c, out))))
            return st;
        if (sc[t]->dtype != FA_DTYPE_F32)
            return fa__error(FA_ERR_DTYPE, "%s: dtype is %s; expected f32", names[t],
                             fa__dtype_name(sc[t]->dtype));
        const int64_t want[3] = {token ? kv->k_cache.shape[0] : c->B,
                                 token ? kv->k_cache.shape[1] : c->Hk, c->Hk};
        for (int i = 0; i < sc[t]->ndim; i++)
            if (sc[t]->shape[i] != want[i])
                return fa__error(FA_ERR_SHAPE, "%s: shape[%d] is %lld; expected %lld %s",
                                 names[t], i, (long long)sc[t]->shape[i], (long long)want[i],
                                 dims);
        c->scale_token[t] = token;
    }
    return FA_OK;
}

/* The scales' views, once the indices are known (a per-token scale goes through the cache's
 * page table, batch index and, for the forward, leftpad), and the values of per-(batch, head)
 * ones: finite and > 0. */
static fa_status scale_views(kvcall *c, const fa_kvcache *kv) {
    const fa_tensor *sc[2] = {&kv->k_scale, &kv->v_scale};
    const char *names[2] = {"kv.k_scale", "kv.v_scale"};
    for (int t = 0; c->q8 && t < 2; t++) {
        fa__view *f = &c->scale_fwd[t], *a = &c->scale_app[t];
        if (c->scale_token[t]) {
            *a = (fa__view){.data = sc[t]->data, .dtype = FA_DTYPE_F32, .sb = sc[t]->stride[0],
                            .ss = sc[t]->stride[1], .sh = sc[t]->stride[2],
                            .batch_idx = c->batch_idx};
            if (c->paged) {
                a->block_table = c->bt;
                a->bt_stride = kv->block_table.stride[0];
                a->page = kv->k_cache.shape[1];
            }
            *f = *a;
            f->row_off = c->leftpad;
            continue;
        }
        *a = (fa__view){.data = sc[t]->data, .dtype = FA_DTYPE_F32, .sb = sc[t]->stride[0],
                        .sh = sc[t]->stride[1]};
        *f = *a;
        for (int64_t b = 0; b < c->B; b++) /* on the host: 8-bit caches are CPU only */
            for (int64_t h = 0; h < c->Hk; h++) {
                const float x = ((const float *)sc[t]->data)[fa__view_at(a, b, 0, h)];
                if (!(x > 0.0f) || x == INFINITY)
                    return fa__error(FA_ERR_VALUE, "%s[%lld, %lld] is %g; a scale per batch and "
                                     "KV head must be finite and > 0", names[t], (long long)b,
                                     (long long)h, (double)x);
            }
    }
    return FA_OK;
}

static fa_status check_rotary(kvcall *c, const fa_kvcache *kv, const fa_tensor *q, int shift_rows,
                              fa__rotary *ro) {
    memset(ro, 0, sizeof *ro);
    if (!given(&kv->rotary_cos) && !given(&kv->rotary_sin)) return FA_OK;
    if (!c->append)
        return fa__error(FA_ERR_VALUE, "kv.rotary_cos: given without k_new; rotary embedding "
                         "applies to q and the new keys, so pass k_new and v_new");
    const fa_tensor *tab[2] = {&kv->rotary_cos, &kv->rotary_sin};
    const char *names[2] = {"kv.rotary_cos", "kv.rotary_sin"};
    fa_status st;
    for (int t = 0; t < 2; t++) {
        if (!given(tab[t]))
            return fa__error(FA_ERR_NULL_POINTER, "%s: data is NULL; rotary_cos and rotary_sin come "
                             "together", names[t]);
        if ((st = fa__check_view(tab[t], names[t], 2, "(seqlen_ro, rotary_dim / 2)", 0, span(c, 0))))
            return st;
        if (tab[t]->dtype != q->dtype && tab[t]->dtype != FA_DTYPE_F32)
            return fa__error(FA_ERR_DTYPE, "%s: dtype is %s; expected q's %s or f32", names[t],
                             fa__dtype_name(tab[t]->dtype), fa__dtype_name(q->dtype));
        if (tab[t]->dtype != tab[0]->dtype || tab[t]->shape[0] != tab[0]->shape[0] ||
            tab[t]->shape[1] != tab[0]->shape[1] || tab[t]->stride[0] != tab[0]->stride[0] ||
            tab[t]->stride[1] != tab[0]->stride[1])
            return fa__error(FA_ERR_SHAPE, "kv.rotary_sin: dtype, shape and strides must match "
                             "kv.rotary_cos");
    }
    const int64_t rd = 2 * kv->rotary_cos.shape[1], seqlen_ro = kv->rotary_cos.shape[0];
    if (rd == 0 || rd > c->D)
        return fa__error(FA_ERR_VALUE, "kv.rotary_cos: rotary_dim = 2 * shape[1] = %lld; expected "
                         "2..D = %lld", (long long)rd, (long long)c->D);
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t last_k = c->seqlens[b] + c->S_new - 1;
        const int64_t last_q = c->seqlens[b] + (shift_rows && c->Sq > 0 ? c->Sq - 1 : 0);
        const int64_t need = (last_k > last_q ? last_k : last_q) + 1;
        if (need > seqlen_ro)
            return fa__error(FA_ERR_VALUE, "kv.rotary_cos: %lld rows (seqlen_ro); batch %lld needs "
                             "positions up to %lld", (long long)seqlen_ro, (long long)b,
                             (long long)need - 1);
    }
    *ro = (fa__rotary){.cos = kv->rotary_cos.data, .sin = kv->rotary_sin.data,
                       .dtype = kv->rotary_cos.dtype,
                       .esize = fa__dtype_size(kv->rotary_cos.dtype),
                       .s_row = kv->rotary_cos.stride[0], .s_col = kv->rotary_cos.stride[1],
                       .rd = rd, .interleaved = kv->rotary_interleaved != 0};
    return FA_OK;
}

static fa__view cache_view(const fa_tensor *t, const kvcall *c, const fa_kvcache *kv) {
    fa__view v = {.data = t->data, .dtype = t->dtype, .sb = t->stride[0], .ss = t->stride[1],
                  .sh = t->stride[2], .sd = t->stride[3], .batch_idx = c->batch_idx};
    if (c->paged) {
        v.block_table = c->bt;
        v.bt_stride = kv->block_table.stride[0];
        v.page = t->shape[1];
    }
    return v;
}

/* The data tensors given (their views checked) on q's device; the index tensors are checked
 * where they are read (host_ints). */
static fa_status check_devices(const kvcall *c, const fa_params *params, const fa_kvcache *kv,
                               const fa_tensor *out, const fa_tensor *lse) {
    const fa_tensor *const ts[] = {out, lse, &kv->k_cache, &kv->v_cache, &kv->k_new,
                                   &kv->v_new, &kv->rotary_cos, &kv->rotary_sin,
                                   &kv->k_scale, &kv->v_scale,
                                   params ? &params->alibi_slopes : NULL};
    static const char *const names[] = {"out", "lse", "kv.k_cache", "kv.v_cache",
                                        "kv.k_new", "kv.v_new", "kv.rotary_cos",
                                        "kv.rotary_sin", "kv.k_scale", "kv.v_scale",
                                        "params.alibi_slopes"};
    fa_status st;
    for (int i = 0; i < (int)(sizeof ts / sizeof *ts); i++)
        if (ts[i] && given(ts[i]) && (st = fa__check_same_device(ts[i], names[i], c->q, "q")))
            return st;
    return FA_OK;
}

/* *kv as this library knows it in *full: a caller's struct from before the scales existed
 * (struct_size = offsetof(fa_kvcache, k_scale)) gets them absent. */
static fa_status read_kvcache(const fa_kvcache *kv, fa_kvcache *full) {
    if (!kv) return fa__error(FA_ERR_NULL_POINTER, "kv: NULL; expected a fa_kvcache");
    const size_t v1 = offsetof(fa_kvcache, k_scale);
    if (kv->struct_size != sizeof *kv && kv->struct_size != v1)
        return fa__error(FA_ERR_STRUCT_SIZE, "kv.struct_size is %u; expected %zu (call "
                         "fa_kvcache_init first)", kv->struct_size, sizeof *kv);
    memset(full, 0, sizeof *full);
    memcpy(full, kv, kv->struct_size);
    return FA_OK;
}

/* Every check, then the problem over the cache's view; *none: the call has nothing to do. */
static fa_status prepare(kvcall *c, const fa_params *params, const fa_tensor *q,
                         const fa_kvcache *kv, const fa_tensor *out, const fa_tensor *lse,
                         fa__problem *p, fa__rotary *ro, int *none) {
    fa_status st;
    if (kv->num_splits < 0 || kv->num_splits > FA_MAX_SPLITS)
        return fa__error(FA_ERR_VALUE, "kv.num_splits is %d; expected 0 (automatic) to %d",
                         kv->num_splits, FA_MAX_SPLITS);
    if ((st = check_tensors(c, q, kv, out)) || (st = check_scales(c, kv))) return st;
    c->q = q;
    c->stream = fa__params_stream(params);
    if (q->device == FA_DEVICE_CUDA && c->q8)
        return fa__error(FA_ERR_UNSUPPORTED, "kv.k_cache: dtype %s; 8-bit KV caches are CPU only "
                         "(on CUDA tensors the caches take q's dtype)",
                         fa__dtype_name(kv->k_cache.dtype));
    if (q->device == FA_DEVICE_CUDA && c->Dv != c->D) /* the plug-in's decode reads D only */
        return fa__error(FA_ERR_UNSUPPORTED, "kv.v_cache: head dim Dv = %lld differs from q's "
                         "D = %lld; the KV cache on CUDA tensors takes Dv = D only (fa_forward "
                         "and fa_backward take any Dv)", (long long)c->Dv, (long long)c->D);
    if (q->device == FA_DEVICE_CUDA && (st = fa__plugin_device("q", q->device_index, &c->api)))
        return st;

    p->B = c->B;
    p->Sq = c->Sq;
    p->H = c->H;
    p->Hk = c->Hk;
    p->D = c->D;
    p->Dv = c->Dv;
    if ((st = fa__resolve_params(params, p))) return st;
    if (p->dropout_p != 0.0f)
        return fa__error(FA_ERR_VALUE, "params.dropout_p is %g; the KV cache forward has no "
                         "dropout (set it to 0)", (double)p->dropout_p);
    /* Nothing to attend and nothing to append: done, without the O(B) reads of the lengths
     * and indices (B can be 2^60 when q has no element). */
    if ((*none = c->B == 0 || (c->Sq == 0 && c->S_new == 0))) return FA_OK;
    if ((st = check_indices(c, kv)) || (st = scale_views(c, kv))) return st;
    const int shift_rows = p->causal || p->window_left >= 0 || p->window_right >= 0;
    if ((st = check_rotary(c, kv, q, shift_rows, ro)) ||
        (st = fa__resolve_alibi(params, p, span(c, 0))))
        return st;
    fa__span no_dsinks; /* a forward: dsinks is ignored */
    if ((st = fa__resolve_sinks(params, p, 0, span(c, 0), &no_dsinks))) return st;
    if (lse) {
        if ((st = fa__check_view(lse, "lse", 3, "(B, H, Sq)", 1, span(c, 1)))) return st;
        if (lse->dtype != FA_DTYPE_F32)
            return fa__error(FA_ERR_DTYPE, "lse: dtype is %s; expected f32",
                             fa__dtype_name(lse->dtype));
        const int64_t want[3] = {c->B, c->H, c->Sq};
        for (int i = 0; i < 3; i++)
            if (lse->shape[i] != want[i])
                return fa__error(FA_ERR_SHAPE, "lse: shape[%d] is %lld; expected %lld (B, H, Sq)",
                                 i, (long long)lse->shape[i], (long long)want[i]);
        p->lse = lse->data;
        p->lse_sb = lse->stride[0];
        p->lse_sh = lse->stride[1];
        p->lse_ss = lse->stride[2];
    }
    if ((st = check_devices(c, params, kv, out, lse)) ||
        (st = fa__check_sinks(params, p, q, c->api)) || (st = fa__check_slopes(params, p, c->api)) ||
        (st = fa__check_overlap(c->out, c->n_out, c->in, c->n_in)))
        return st;

    p->seqlens_k = c->seqlens_k;
    p->q = (fa__view){.data = q->data, .dtype = q->dtype, .sb = q->stride[0], .ss = q->stride[1],
                      .sh = q->stride[2], .sd = q->stride[3]};
    p->out = (fa__view){.data = out->data, .dtype = out->dtype, .sb = out->stride[0],
                        .ss = out->stride[1], .sh = out->stride[2], .sd = out->stride[3]};
    p->k = cache_view(&kv->k_cache, c, kv);
    p->v = cache_view(&kv->v_cache, c, kv);
    p->k.row_off = p->v.row_off = c->leftpad; /* attention starts at each row's leftpad */
    if (c->q8) {
        p->k.scale = &c->scale_fwd[0];
        p->v.scale = &c->scale_fwd[1];
    }
    return FA_OK;
}

/* The writes before the forward, run once its memory is allocated: the append of k_new/v_new
 * into the cache, then q rotated into q_rot (when rotary is on). */
typedef struct kvwrites {
    const fa__kvappend *append; /* NULL: nothing to append */
    const fa__view *q;          /* q as given */
    float *q_rot;
    const fa__rotary *ro;
    const kvcall *c;
    int shift_rows;
} kvwrites;

static void kv_writes(void *arg) {
    const kvwrites *w = arg;
    if (w->append) fa__cpu_kvcache_append(w->append);
    if (w->q_rot)
        fa__cpu_rotate_q(w->q, w->ro, w->c->seqlens, w->shift_rows, w->c->B, w->c->Sq, w->c->H,
                         w->c->D, w->q_rot);
}

/* k_new or v_new (B, S_new, Hk, D) as a view. */
static fa__view new_view(const fa_tensor *t) {
    return (fa__view){.data = t->data, .dtype = t->dtype, .sb = t->stride[0],
                      .ss = t->stride[1], .sh = t->stride[2], .sd = t->stride[3]};
}

/* The append, rotary and forward by the CUDA plug-in (every index on the host). */
static fa_status run_cuda(const kvcall *c, const fa__problem *p, const fa_kvcache *kv,
                          const fa__rotary *ro) {
    const int32_t shift_rows = p->causal || p->window_left >= 0 || p->window_right >= 0;
    fa__kvcache_job job = {.seqlens = c->seqlens, .S_new = c->S_new, .rotary = *ro,
                           .shift_rows = shift_rows, .num_splits = kv->num_splits};
    if (c->paged) job.bt_cols = kv->block_table.shape[1];
    if (c->append) {
        job.k_new = new_view(&kv->k_new);
        job.v_new = new_view(&kv->v_new);
    }
    char msg[512] = "";
    return fa__plugin_status(c->api->kvcache(p, &job, c->q->device_index, c->stream, msg,
                                             sizeof msg),
                             msg);
}

fa_status fa_forward_kvcache(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                             const fa_kvcache *kv_given, const fa_tensor *out,
                             const fa_tensor *lse) {
    fa__clear_error();
    kvcall c = {.n_in = 0};
    fa__problem p = {0};
    fa__rotary ro;
    float *q_rot = NULL; /* rotated q, fp32 */
    int none = 0;
    fa_kvcache full;
    const fa_kvcache *kv = &full;
    fa_status st = read_kvcache(kv_given, &full);
    if (st != FA_OK) return st;
    st = prepare(&c, params, q, kv, out, lse, &p, &ro, &none);
    if (st != FA_OK || none || c.api) {
        if (st == FA_OK && !none) st = run_cuda(&c, &p, kv, &ro);
        free(c.ints);
        free(c.bt_copy);
        return st;
    }
    /* Everything that can fail comes first (q_rot, the context, the forward's scratch): the
     * cache is written only once nothing can. c.B·c.Sq·c.H·c.D fits: out holds that many. */
    if (ro.cos && c.B * c.Sq > 0) {
        q_rot = fa__alloc(c.B * c.Sq * c.H * c.D, sizeof *q_rot);
        if (!q_rot) st = fa__error(FA_ERR_NO_MEMORY, "fa_forward_kvcache: out of memory for q");
    }
    if (st == FA_OK) st = fa__call_begin(&ctx, params);
    if (st == FA_OK) {
        fa__kvappend a = {
            .k_new = new_view(&kv->k_new),
            .v_new = new_view(&kv->v_new),
            .k_cache = cache_view(&kv->k_cache, &c, kv),
            .v_cache = cache_view(&kv->v_cache, &c, kv),
            .seqlens = c.seqlens, .B = c.B, .S_new = c.S_new, .Hk = c.Hk, .D = c.D, .Dv = c.Dv,
            .rotary = ro, .scale_token = {c.scale_token[0], c.scale_token[1]}};
        if (c.q8) {
            a.k_cache.scale = &c.scale_app[0];
            a.v_cache.scale = &c.scale_app[1];
        }
        const fa__view q_given = p.q;
        const kvwrites w = {.append = c.append ? &a : NULL, .q = &q_given, .q_rot = q_rot,
                            .ro = &ro, .c = &c,
                            .shift_rows = p.causal || p.window_left >= 0 || p.window_right >= 0};
        if (q_rot)
            p.q = (fa__view){.data = q_rot, .dtype = FA_DTYPE_F32, .sb = c.Sq * c.H * c.D,
                             .ss = c.H * c.D, .sh = c.D, .sd = 1};
        st = fa__call_end(fa__cpu_forward_after(ctx, &p, kv_writes, (void *)&w));
    }
    free(q_rot);
    free(c.ints);
    free(c.bt_copy);
    return st;
}
