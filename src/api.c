/* SPDX-License-Identifier: MIT */
/*
 * api.c — the public entry points: complete argument validation, then dispatch to a backend
 * (fa_params_init's defaults are in params.c). Nothing is written to an output before every
 * check has passed.
 */
#include "cpu/cpu.h"
#include "internal.h"
#include "plugin.h"
#include "size.h"
#include "validate.h"

#include <stdlib.h>

/* The tensors of one call. Forward: out and lse are outputs; backward: they are inputs and
 * dq, dk, dv are the outputs. Varlen calls have cu_q/cu_k and no batch dimension. */
typedef struct call {
    int backward, varlen;
    const fa_tensor *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *cu_q, *cu_k;
    int64_t max_seqlen_q, max_seqlen_k;
} call;

enum { MAX_SPANS = 10 };

typedef struct spans {
    fa__span in[MAX_SPANS], out[MAX_SPANS];
    int n_in, n_out;
} spans;

static fa__span *add_span(spans *sp, int is_output) {
    return is_output ? &sp->out[sp->n_out++] : &sp->in[sp->n_in++];
}

static fa__view make_view(const fa_tensor *t, int varlen) {
    const int o = varlen ? -1 : 0; /* varlen has no batch dimension */
    return (fa__view){.data = t->data, .dtype = t->dtype, .sb = varlen ? 0 : t->stride[0],
                      .ss = t->stride[1 + o], .sh = t->stride[2 + o], .sd = t->stride[3 + o]};
}

/* t must be a view like `ref` (already checked): same rank, dtype and shape, but for the head
 * dim (the last dimension), which is that of `dref` (named dref_name: v for out, dout and dv);
 * f32_ok also takes an f32 t for an f16/bf16 ref (the forward's out). */
static fa_status check_like(const fa_tensor *t, const char *name, const fa_tensor *ref,
                            const char *ref_name, const fa_tensor *dref, const char *dref_name,
                            const char *dims, int is_output, int f32_ok, spans *sp) {
    fa_status st = fa__check_view(t, name, ref->ndim, dims, is_output, add_span(sp, is_output));
    if (st != FA_OK) return st;
    const int half = ref->dtype == FA_DTYPE_F16 || ref->dtype == FA_DTYPE_BF16;
    if (t->dtype != ref->dtype && !(f32_ok && half && t->dtype == FA_DTYPE_F32))
        return fa__error(FA_ERR_DTYPE, "%s: dtype is %s but %s is %s; %s", name,
                         fa__dtype_name(t->dtype), ref_name, fa__dtype_name(ref->dtype),
                         f32_ok && half ? "expected the same, or f32 for the unrounded result"
                                        : "they must match");
    const int dd = ref->ndim - 1;
    for (int i = 0; i < dd; i++)
        if (t->shape[i] != ref->shape[i])
            return fa__error(FA_ERR_SHAPE, "%s: shape[%d] is %lld; expected %s's %lld %s", name, i,
                             (long long)t->shape[i], ref_name, (long long)ref->shape[i], dims);
    if (t->shape[dd] != dref->shape[dd])
        return fa__error(FA_ERR_SHAPE, "%s: head dim (shape[%d]) is %lld; expected %s's %lld %s",
                         name, dd, (long long)t->shape[dd], dref_name,
                         (long long)dref->shape[dd], dims);
    return FA_OK;
}

/* q, k, v: ranks, dtypes, shapes and head counts; fills p's sizes. */
static fa_status check_qkv(const call *c, fa__problem *p, spans *sp) {
    const int nd = c->varlen ? 3 : 4;
    const char *qd = c->varlen ? "(total_q, H, D)" : "(B, Sq, H, D)";
    const char *kd = c->varlen ? "(total_k, Hk, D)" : "(B, Sk, Hk, D)";
    const char *od = c->varlen ? "(total_q, H, Dv)" : "(B, Sq, H, Dv)";
    const char *vd = c->varlen ? "(total_k, Hk, Dv)" : "(B, Sk, Hk, Dv)";
    const fa_tensor *q = c->q, *k = c->k, *v = c->v;
    fa_status st;
    if ((st = fa__check_view(q, "q", nd, qd, 0, add_span(sp, 0))) ||
        (st = fa__check_view(k, "k", nd, kd, 0, add_span(sp, 0))))
        return st;
    if (q->dtype != FA_DTYPE_F32 && q->dtype != FA_DTYPE_F16 && q->dtype != FA_DTYPE_BF16)
        return fa__error(FA_ERR_DTYPE, "q: dtype is %s; expected f32, f16 or bf16",
                         fa__dtype_name(q->dtype));
    if (k->dtype != q->dtype)
        return fa__error(FA_ERR_DTYPE, "k: dtype is %s but q is %s; q, k and v must share one "
                         "dtype", fa__dtype_name(k->dtype), fa__dtype_name(q->dtype));
    const int hd = nd - 2, dd = nd - 1;
    p->H = q->shape[hd];
    p->Hk = k->shape[hd];
    p->D = q->shape[dd];
    if ((st = fa__check_heads(q, k, "k", hd, dd))) return st;
    if (!c->varlen && k->shape[0] != q->shape[0])
        return fa__error(FA_ERR_SHAPE, "k: batch (shape[0]) is %lld; expected q's %lld",
                         (long long)k->shape[0], (long long)q->shape[0]);
    /* v's head dim Dv is its own (1..FA_MAX_HEAD_DIM); out, dout and dv have it too. The
     * forward's out may be f32 for f16/bf16 q; the backward's out is q's dtype. */
    if ((st = check_like(v, "v", k, "k", v, "v", vd, 0, 0, sp)) ||
        (st = fa__check_head_dim_v(v, dd)) ||
        (st = check_like(c->out, "out", q, "q", v, "v", od, !c->backward, !c->backward, sp)))
        return st;
    p->Dv = v->shape[dd];
    if (c->backward &&
        ((st = check_like(c->dout, "dout", q, "q", v, "v", od, 0, 0, sp)) ||
         (st = check_like(c->dq, "dq", q, "q", q, "q", qd, 1, 0, sp)) ||
         (st = check_like(c->dk, "dk", k, "k", k, "k", kd, 1, 0, sp)) ||
         (st = check_like(c->dv, "dv", k, "k", v, "v", vd, 1, 0, sp))))
        return st;
    return FA_OK;
}

/* lse: fp32 (B, H, Sq) or varlen (H, total_q); optional only as a forward output. */
static fa_status check_lse(const call *c, const fa__problem *p, spans *sp) {
    if (!c->lse && !c->backward) return FA_OK;
    if (!c->lse)
        return fa__error(FA_ERR_NULL_POINTER, "lse: NULL; the backward needs the forward's lse");
    const int nd = c->varlen ? 2 : 3;
    const char *dims = c->varlen ? "(H, total_q)" : "(B, H, Sq)";
    const int64_t shape[3] = {c->varlen ? p->H : p->B, c->varlen ? p->total_q : p->H, p->Sq};
    fa_status st = fa__check_view(c->lse, "lse", nd, dims, !c->backward, add_span(sp, !c->backward));
    if (st != FA_OK) return st;
    if (c->lse->dtype != FA_DTYPE_F32)
        return fa__error(FA_ERR_DTYPE, "lse: dtype is %s; expected f32",
                         fa__dtype_name(c->lse->dtype));
    for (int i = 0; i < nd; i++)
        if (c->lse->shape[i] != shape[i])
            return fa__error(FA_ERR_SHAPE, "lse: shape[%d] is %lld; expected %lld %s", i,
                             (long long)c->lse->shape[i], (long long)shape[i], dims);
    return FA_OK;
}

static fa_status check_cu_view(const fa_tensor *t, const char *name, spans *sp) {
    fa_status st = fa__check_view(t, name, 1, "(B + 1)", 0, add_span(sp, 0));
    if (st != FA_OK) return st;
    if (t->dtype != FA_DTYPE_I32)
        return fa__error(FA_ERR_DTYPE, "%s: dtype is %s; expected i32", name,
                         fa__dtype_name(t->dtype));
    if (t->shape[0] < 1)
        return fa__error(FA_ERR_SHAPE, "%s: shape is (0); expected (B + 1) with B >= 0", name);
    return FA_OK;
}

/* cu_seqlens: copied into cu[] and checked: starts >= 0, never decreases, ends within `total`
 * rows, no sequence longer than max_seqlen. */
static fa_status read_cu_seqlens(const fa_tensor *t, const char *name, int64_t total,
                                 const char *total_name, int64_t max_seqlen, int32_t *cu,
                                 const fa__plugin_api *api, void *stream) {
    const int64_t n = t->shape[0];
    const int32_t *src = t->data;
    int32_t *host = NULL;
    if (t->device == FA_DEVICE_CUDA) { /* gathered from a host copy, then checked like host ones */
        fa_status st = fa__plugin_download(api, t, name, stream, (void **)&host);
        if (st != FA_OK) return st;
        src = host;
    }
    for (int64_t i = 0; i < n; i++) cu[i] = src[i * t->stride[0]];
    free(host);
    if (cu[0] < 0) return fa__error(FA_ERR_VALUE, "%s[0] is %d; expected >= 0", name, cu[0]);
    for (int64_t i = 1; i < n; i++) {
        if (cu[i] < cu[i - 1])
            return fa__error(FA_ERR_VALUE, "%s decreases at index %lld (%d after %d); offsets "
                             "must be non-decreasing", name, (long long)i, cu[i], cu[i - 1]);
        if ((int64_t)cu[i] - cu[i - 1] > max_seqlen)
            return fa__error(FA_ERR_VALUE, "%s: sequence %lld has length %d, more than its "
                             "max_seqlen %lld", name, (long long)(i - 1), cu[i] - cu[i - 1],
                             (long long)max_seqlen);
    }
    if (cu[n - 1] > total)
        return fa__error(FA_ERR_VALUE, "%s[%lld] is %d, beyond the %lld rows of %s", name,
                         (long long)(n - 1), cu[n - 1], (long long)total, total_name);
    return FA_OK;
}

/* Every tensor on q's device; cu_seqlens on the host or on q's device. */
static fa_status check_devices(const fa_params *params, const call *c) {
    const fa_tensor *const ts[] = {c->k, c->v, c->out, c->lse, c->dout, c->dq, c->dk, c->dv};
    static const char *const names[] = {"k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    fa_status st;
    for (int i = 0; i < (int)(sizeof ts / sizeof *ts); i++)
        if (ts[i] && (st = fa__check_same_device(ts[i], names[i], c->q, "q"))) return st;
    if (params && params->alibi_slopes.data &&
        (st = fa__check_same_device(&params->alibi_slopes, "params.alibi_slopes", c->q, "q")))
        return st;
    if (c->varlen)
        for (int i = 0; i < 2; i++) {
            const fa_tensor *cu = i ? c->cu_k : c->cu_q;
            if (cu->device != FA_DEVICE_CPU &&
                (st = fa__check_same_device(cu, i ? "cu_seqlens_k" : "cu_seqlens_q", c->q, "q")))
                return st;
        }
    return FA_OK;
}

static int empty(const fa_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 1;
    return 0;
}

/* A call whose outputs have no element has nothing to compute: it returns once the views are
 * checked, without the O(B) reads of cu_seqlens (B can be 2^61 with a stride-0 tensor). */
static int nothing_to_write(const call *c) {
    if (c->backward) return empty(c->dq) && empty(c->dk) && empty(c->dv);
    return empty(c->out); /* then lse, (B, H, Sq) or (H, total_q), is empty too */
}

/* The longest sequence of offsets cu[0..B]. */
static int64_t longest(const int32_t *cu, int64_t B) {
    int64_t m = 0;
    for (int64_t b = 0; b < B; b++) m = cu[b + 1] - cu[b] > m ? cu[b + 1] - cu[b] : m;
    return m;
}

/* Every check of a call, then the problem description. On success with varlen, *cu holds the
 * copied offsets (the caller frees it); for CUDA tensors *api is the plug-in (else NULL);
 * *none is set when the call has no output element (p is then not filled in).
 * Nothing is written to any tensor. */
static fa_status prepare(const fa_params *params, const call *c, fa__problem *p, int32_t **cu,
                         const fa__plugin_api **api, int *none) {
    spans sp = {.n_in = 0};
    fa__span alibi_span, sink_in, sink_out;
    fa_status st = check_qkv(c, p, &sp);
    if (st != FA_OK) return st;
    if (c->varlen) {
        if ((st = check_cu_view(c->cu_q, "cu_seqlens_q", &sp)) ||
            (st = check_cu_view(c->cu_k, "cu_seqlens_k", &sp)))
            return st;
        if (c->cu_k->shape[0] != c->cu_q->shape[0])
            return fa__error(FA_ERR_SHAPE, "cu_seqlens_k: shape is (%lld); expected cu_seqlens_q's"
                             " (%lld)", (long long)c->cu_k->shape[0], (long long)c->cu_q->shape[0]);
        if (c->max_seqlen_q < 0 || c->max_seqlen_k < 0)
            return fa__error(FA_ERR_VALUE, "%s is %lld; expected >= 0",
                             c->max_seqlen_q < 0 ? "max_seqlen_q" : "max_seqlen_k",
                             (long long)(c->max_seqlen_q < 0 ? c->max_seqlen_q : c->max_seqlen_k));
        p->B = c->cu_q->shape[0] - 1;
        p->Sq = c->max_seqlen_q;
        p->Sk = c->max_seqlen_k;
        p->total_q = c->q->shape[0];
        p->total_k = c->k->shape[0];
    } else {
        p->B = c->q->shape[0];
        p->Sq = c->q->shape[1];
        p->Sk = c->k->shape[1];
    }
    if ((st = check_lse(c, p, &sp)) || (st = fa__resolve_params(params, p)) ||
        (st = fa__resolve_alibi(params, p, &alibi_span)) ||
        (st = fa__resolve_sinks(params, p, c->backward, &sink_in, &sink_out)))
        return st;
    sp.in[sp.n_in++] = alibi_span;
    sp.in[sp.n_in++] = sink_in;
    sp.out[sp.n_out++] = sink_out;
    if ((st = check_devices(params, c)) ||
        (st = fa__check_overlap(sp.out, sp.n_out, sp.in, sp.n_in)))
        return st;
    *api = NULL;
    if (c->q->device == FA_DEVICE_CUDA) {
        if ((st = fa__plugin_device("q", c->q->device_index, api))) return st;
    }
    if ((st = fa__check_sinks(params, p, c->q, *api))) return st;
    if ((*none = nothing_to_write(c))) return FA_OK;
    if ((st = fa__check_slopes(params, p, *api))) return st;

    if (c->varlen) {
        *cu = fa__alloc(fa__size_mul(2, p->B + 1), sizeof **cu);
        if (!*cu)
            return fa__error(FA_ERR_NO_MEMORY, "cu_seqlens: out of memory for a copy of %lld "
                             "offsets", (long long)(p->B + 1));
        void *stream = fa__params_stream(params);
        if ((st = read_cu_seqlens(c->cu_q, "cu_seqlens_q", p->total_q, "q", c->max_seqlen_q,
                                  *cu, *api, stream)) ||
            (st = read_cu_seqlens(c->cu_k, "cu_seqlens_k", p->total_k, "k", c->max_seqlen_k,
                                  *cu + p->B + 1, *api, stream))) {
            free(*cu);
            *cu = NULL;
            return st;
        }
        p->cu_q = *cu;
        p->cu_k = *cu + p->B + 1;
        /* max_seqlen_q/k are only bounds (2^62 is valid): the backends plan from the lengths */
        p->Sq = longest(p->cu_q, p->B);
        p->Sk = longest(p->cu_k, p->B);
    }
    p->q = make_view(c->q, c->varlen);
    p->k = make_view(c->k, c->varlen);
    p->v = make_view(c->v, c->varlen);
    p->out = make_view(c->out, c->varlen);
    if (c->backward) {
        p->dout = make_view(c->dout, c->varlen);
        p->dq = make_view(c->dq, c->varlen);
        p->dk = make_view(c->dk, c->varlen);
        p->dv = make_view(c->dv, c->varlen);
    }
    if (c->lse) {
        p->lse = c->lse->data;
        p->lse_sb = c->varlen ? 0 : c->lse->stride[0];
        p->lse_sh = c->lse->stride[c->varlen ? 0 : 1];
        p->lse_ss = c->lse->stride[c->varlen ? 1 : 2];
    }
    return FA_OK;
}

/* Validates, then runs the call on its backend. */
static fa_status run(fa_context *ctx, const fa_params *params, const call *c) {
    fa__clear_error();
    fa__problem p = {0};
    int32_t *cu = NULL;
    const fa__plugin_api *api = NULL;
    int none = 0; /* no output element: nothing to compute */
    fa_status st = prepare(params, c, &p, &cu, &api, &none);
    if (st == FA_OK && !none && api) {
        char msg[512] = "";
        st = fa__plugin_status((c->backward ? api->backward : api->forward)(
                                   &p, c->q->device_index, fa__params_stream(params), msg,
                                   sizeof msg),
                               msg);
    } else if (st == FA_OK && !none) {
        st = fa__call_begin(&ctx, params);
        if (st == FA_OK)
            st = fa__call_end(c->backward ? fa__cpu_backward(ctx, &p) : fa__cpu_forward(ctx, &p));
    }
    free(cu);
    return st;
}

fa_status fa_forward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                     const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                     const fa_tensor *lse) {
    const call c = {.q = q, .k = k, .v = v, .out = out, .lse = lse};
    return run(ctx, params, &c);
}

fa_status fa_varlen_forward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                            const fa_tensor *k, const fa_tensor *v, const fa_tensor *cu_seqlens_q,
                            const fa_tensor *cu_seqlens_k, int64_t max_seqlen_q,
                            int64_t max_seqlen_k, const fa_tensor *out, const fa_tensor *lse) {
    const call c = {.varlen = 1, .q = q, .k = k, .v = v, .out = out, .lse = lse,
                    .cu_q = cu_seqlens_q, .cu_k = cu_seqlens_k, .max_seqlen_q = max_seqlen_q,
                    .max_seqlen_k = max_seqlen_k};
    return run(ctx, params, &c);
}

fa_status fa_backward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                      const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *dout, const fa_tensor *lse, const fa_tensor *dq,
                      const fa_tensor *dk, const fa_tensor *dv) {
    const call c = {.backward = 1, .q = q, .k = k, .v = v, .out = out, .lse = lse, .dout = dout,
                    .dq = dq, .dk = dk, .dv = dv};
    return run(ctx, params, &c);
}

fa_status fa_varlen_backward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                             const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                             const fa_tensor *dout, const fa_tensor *lse,
                             const fa_tensor *cu_seqlens_q, const fa_tensor *cu_seqlens_k,
                             int64_t max_seqlen_q, int64_t max_seqlen_k, const fa_tensor *dq,
                             const fa_tensor *dk, const fa_tensor *dv) {
    const call c = {.backward = 1, .varlen = 1, .q = q, .k = k, .v = v, .out = out, .lse = lse,
                    .dout = dout, .dq = dq, .dk = dk, .dv = dv, .cu_q = cu_seqlens_q,
                    .cu_k = cu_seqlens_k, .max_seqlen_q = max_seqlen_q,
                    .max_seqlen_k = max_seqlen_k};
    return run(ctx, params, &c);
}
