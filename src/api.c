/* SPDX-License-Identifier: MIT */
/*
 * api.c — the public entry points: defaults, complete argument validation, then dispatch to a
 * backend. Nothing is written to an output before every check has passed.
 */
#include "cpu/cpu.h"
#include "internal.h"
#include "validate.h"

#include <stdlib.h>

enum { FA_MAX_HEAD_DIM = 256 };

void fa_params_init(fa_params *params) {
    if (!params) return;
    *params = (fa_params){
        .struct_size = sizeof *params,
        .softmax_scale = 0.0f,
        .window_left = -1,
        .window_right = -1,
    };
}

/* Dimension positions shared by both layouts: fixed (B, S, H, D) and varlen (total, H, D). */
typedef struct layout {
    int ndim;
    const char *q_dims, *kv_dims;
} layout;

static fa__view make_view(const fa_tensor *t, int varlen) {
    fa__view v = {.data = t->data, .dtype = t->dtype};
    const int o = varlen ? -1 : 0; /* varlen has no batch dimension */
    v.sb = varlen ? 0 : t->stride[0];
    v.ss = t->stride[1 + o];
    v.sh = t->stride[2 + o];
    v.sd = t->stride[3 + o];
    return v;
}

/* q, k, v, out: ranks, dtypes, shapes and head counts; fills p's sizes and views, the spans
 * of q, k, v in ins[0..2] and of out in *out_span. */
static fa_status check_qkv(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                           const fa_tensor *out, const layout *lay, fa__problem *p,
                           fa__span ins[3], fa__span *out_span) {
    fa_status st;
    if ((st = fa__check_view(q, "q", lay->ndim, lay->q_dims, 0, &ins[0])) ||
        (st = fa__check_view(k, "k", lay->ndim, lay->kv_dims, 0, &ins[1])) ||
        (st = fa__check_view(v, "v", lay->ndim, lay->kv_dims, 0, &ins[2])) ||
        (st = fa__check_view(out, "out", lay->ndim, lay->q_dims, 1, out_span)))
        return st;
    if (q->dtype != FA_DTYPE_F32 && q->dtype != FA_DTYPE_F16 && q->dtype != FA_DTYPE_BF16)
        return fa__error(FA_ERR_DTYPE, "q: dtype is %s; expected f32, f16 or bf16",
                         fa__dtype_name(q->dtype));
    const fa_tensor *same[] = {k, v, out};
    const char *names[] = {"k", "v", "out"};
    for (int i = 0; i < 3; i++)
        if (same[i]->dtype != q->dtype)
            return fa__error(FA_ERR_DTYPE, "%s: dtype is %s but q is %s; q, k, v and out must "
                             "share one dtype", names[i], fa__dtype_name(same[i]->dtype),
                             fa__dtype_name(q->dtype));

    const int hd = lay->ndim - 2, dd = lay->ndim - 1;
    p->H = q->shape[hd];
    p->Hk = k->shape[hd];
    p->D = q->shape[dd];
    if (p->D == 0)
        return fa__error(FA_ERR_SHAPE, "q: head dim D (shape[%d]) is 0; expected 1..%d", dd,
                         FA_MAX_HEAD_DIM);
    if (p->D > FA_MAX_HEAD_DIM)
        return fa__error(FA_ERR_UNSUPPORTED, "q: head dim D (shape[%d]) is %lld; supported: "
                         "1..%d", dd, (long long)p->D, FA_MAX_HEAD_DIM);
    if (p->H == 0)
        return fa__error(FA_ERR_SHAPE, "q: heads H (shape[%d]) is 0; expected >= 1", hd);
    if (p->Hk == 0 || p->H % p->Hk != 0)
        return fa__error(FA_ERR_SHAPE, "k: shape[%d] (KV heads) is %lld, which does not divide "
                         "q's %lld heads", hd, (long long)p->Hk, (long long)p->H);
    if (k->shape[dd] != p->D)
        return fa__error(FA_ERR_SHAPE, "k: head dim (shape[%d]) is %lld; expected q's %lld", dd,
                         (long long)k->shape[dd], (long long)p->D);
    if (lay->ndim == 4 && k->shape[0] != q->shape[0])
        return fa__error(FA_ERR_SHAPE, "k: batch (shape[0]) is %lld; expected q's %lld",
                         (long long)k->shape[0], (long long)q->shape[0]);
    for (int i = 0; i < lay->ndim; i++) {
        if (v->shape[i] != k->shape[i])
            return fa__error(FA_ERR_SHAPE, "v: shape[%d] is %lld; expected k's %lld", i,
                             (long long)v->shape[i], (long long)k->shape[i]);
        if (out->shape[i] != q->shape[i])
            return fa__error(FA_ERR_SHAPE, "out: shape[%d] is %lld; expected q's %lld", i,
                             (long long)out->shape[i], (long long)q->shape[i]);
    }
    const int varlen = lay->ndim == 3;
    p->q = make_view(q, varlen);
    p->k = make_view(k, varlen);
    p->v = make_view(v, varlen);
    p->out = make_view(out, varlen);
    return FA_OK;
}

/* lse (NULL allowed): fp32 with the given shape. */
static fa_status check_lse(const fa_tensor *lse, int ndim, const int64_t *shape, const char *dims,
                           fa__span *span) {
    *span = (fa__span){0, 0, "lse"};
    if (!lse) return FA_OK;
    fa_status st = fa__check_view(lse, "lse", ndim, dims, 1, span);
    if (st != FA_OK) return st;
    if (lse->dtype != FA_DTYPE_F32)
        return fa__error(FA_ERR_DTYPE, "lse: dtype is %s; expected f32", fa__dtype_name(lse->dtype));
    for (int i = 0; i < ndim; i++)
        if (lse->shape[i] != shape[i])
            return fa__error(FA_ERR_SHAPE, "lse: shape[%d] is %lld; expected %lld %s", i,
                             (long long)lse->shape[i], (long long)shape[i], dims);
    return FA_OK;
}

/* Dispatch after validation: every call so far is a CPU call. */
static fa_status run_forward(fa_context *ctx, const fa__problem *p) {
    ctx = fa__context_resolve(ctx);
    if (!ctx) return FA_ERR_NO_MEMORY; /* message set by fa__context_resolve */
    return fa__cpu_forward(ctx, p);
}

fa_status fa_forward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                     const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                     const fa_tensor *lse) {
    fa__clear_error();
    static const layout lay = {4, "(B, Sq, H, D)", "(B, Sk, Hk, D)"};
    fa__problem p = {0};
    fa__span ins[4], outs[2]; /* ins: q, k, v, alibi; outs: out, lse */
    fa_status st = check_qkv(q, k, v, out, &lay, &p, ins, &outs[0]);
    if (st != FA_OK) return st;
    p.B = q->shape[0];
    p.Sq = q->shape[1];
    p.Sk = k->shape[1];
    const int64_t lse_shape[3] = {p.B, p.H, p.Sq};
    if ((st = check_lse(lse, 3, lse_shape, "(B, H, Sq)", &outs[1])) ||
        (st = fa__resolve_params(params, &p)) || (st = fa__resolve_alibi(params, &p, &ins[3])) ||
        (st = fa__check_overlap(outs, 2, ins, 4)))
        return st;
    if (lse) {
        p.lse = lse->data;
        p.lse_sb = lse->stride[0];
        p.lse_sh = lse->stride[1];
        p.lse_ss = lse->stride[2];
    }
    return run_forward(ctx, &p);
}

/* cu_seqlens: an int32 vector of B + 1 offsets, copied into cu[] (caller frees) and checked:
 * starts >= 0, never decreases, ends within `total` rows, no sequence longer than max_seqlen. */
static fa_status read_cu_seqlens(const fa_tensor *t, const char *name, int64_t total,
                                 const char *total_name, int64_t max_seqlen, int32_t *cu) {
    const int64_t n = t->shape[0];
    for (int64_t i = 0; i < n; i++) cu[i] = ((const int32_t *)t->data)[i * t->stride[0]];
    if (cu[0] < 0)
        return fa__error(FA_ERR_VALUE, "%s[0] is %d; expected >= 0", name, cu[0]);
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

static fa_status check_cu_view(const fa_tensor *t, const char *name, fa__span *span) {
    fa_status st = fa__check_view(t, name, 1, "(B + 1)", 0, span);
    if (st != FA_OK) return st;
    if (t->dtype != FA_DTYPE_I32)
        return fa__error(FA_ERR_DTYPE, "%s: dtype is %s; expected i32", name,
                         fa__dtype_name(t->dtype));
    if (t->shape[0] < 1)
        return fa__error(FA_ERR_SHAPE, "%s: shape is (0); expected (B + 1) with B >= 0", name);
    return FA_OK;
}

fa_status fa_varlen_forward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                            const fa_tensor *k, const fa_tensor *v, const fa_tensor *cu_seqlens_q,
                            const fa_tensor *cu_seqlens_k, int64_t max_seqlen_q,
                            int64_t max_seqlen_k, const fa_tensor *out, const fa_tensor *lse) {
    fa__clear_error();
    static const layout lay = {3, "(total_q, H, D)", "(total_k, Hk, D)"};
    fa__problem p = {0};
    fa__span ins[6], outs[2]; /* ins: q, k, v, alibi, cu_seqlens_q, cu_seqlens_k */
    fa_status st = check_qkv(q, k, v, out, &lay, &p, ins, &outs[0]);
    if (st != FA_OK) return st;
    if ((st = check_cu_view(cu_seqlens_q, "cu_seqlens_q", &ins[4])) ||
        (st = check_cu_view(cu_seqlens_k, "cu_seqlens_k", &ins[5])))
        return st;
    if (cu_seqlens_k->shape[0] != cu_seqlens_q->shape[0])
        return fa__error(FA_ERR_SHAPE, "cu_seqlens_k: shape is (%lld); expected cu_seqlens_q's "
                         "(%lld)", (long long)cu_seqlens_k->shape[0],
                         (long long)cu_seqlens_q->shape[0]);
    if (max_seqlen_q < 0)
        return fa__error(FA_ERR_VALUE, "max_seqlen_q is %lld; expected >= 0", (long long)max_seqlen_q);
    if (max_seqlen_k < 0)
        return fa__error(FA_ERR_VALUE, "max_seqlen_k is %lld; expected >= 0", (long long)max_seqlen_k);
    p.B = cu_seqlens_q->shape[0] - 1;
    p.Sq = max_seqlen_q;
    p.Sk = max_seqlen_k;
    p.total_q = q->shape[0];
    const int64_t lse_shape[2] = {p.H, p.total_q};
    if ((st = check_lse(lse, 2, lse_shape, "(H, total_q)", &outs[1])) ||
        (st = fa__resolve_params(params, &p)) || (st = fa__resolve_alibi(params, &p, &ins[3])) ||
        (st = fa__check_overlap(outs, 2, ins, 6)))
        return st;

    int32_t *cu = malloc(2 * (size_t)(p.B + 1) * sizeof *cu);
    if (!cu) return fa__error(FA_ERR_NO_MEMORY, "cu_seqlens: out of memory");
    if ((st = read_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", p.total_q, "q", max_seqlen_q, cu)) ||
        (st = read_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k->shape[0], "k", max_seqlen_k,
                              cu + p.B + 1))) {
        free(cu);
        return st;
    }
    p.cu_q = cu;
    p.cu_k = cu + p.B + 1;
    if (lse) {
        p.lse = lse->data;
        p.lse_sh = lse->stride[0];
        p.lse_ss = lse->stride[1];
    }
    st = run_forward(ctx, &p);
    free(cu);
    return st;
}
