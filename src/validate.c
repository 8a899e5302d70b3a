/* SPDX-License-Identifier: MIT */
/*
 * validate.c — argument checks shared by the entry points: tensor views (rank, shape, strides,
 * pointers, device), output aliasing, and the attention parameters.
 */
#include "validate.h"

#include "philox.h"
#include "plugin.h"
#include "size.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *fa__dtype_name(int32_t dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_I32: return "i32";
    case FA_DTYPE_U8: return "u8";
    case FA_DTYPE_I8: return "i8";
    case FA_DTYPE_F8_E4M3: return "f8_e4m3";
    case FA_DTYPE_F8_E5M2: return "f8_e5m2";
    }
    return "unknown";
}

fa_tensor fa_tensor_contiguous(void *data, fa_dtype dtype, int32_t ndim, const int64_t *shape) {
    fa_tensor t = {.data = data, .dtype = dtype, .device = FA_DEVICE_CPU, .ndim = ndim};
    if (ndim < 1 || ndim > FA_MAX_DIMS || !shape) return t;
    /* A product of shapes that overflows leaves INT64_MAX strides, which fa__check_view
     * rejects ("beyond the addressable range") instead of a wrapped stride that looks valid. */
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = stride < 0 ? INT64_MAX : stride;
        stride = fa__size_mul(stride, shape[i] > 0 ? shape[i] : 1);
    }
    return t;
}

/* Would two distinct elements of the view share an address? Sufficient test: ordered by
 * stride, each dimension's stride must exceed the span of all smaller-stride dimensions. */
static int aliases_itself(const fa_tensor *t) {
    int order[FA_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1) order[n++] = i;
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && t->stride[order[b]] < t->stride[order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    int64_t span = 0;
    for (int a = 0; a < n; a++) {
        const int64_t s = t->stride[order[a]];
        if (s <= span) return 1;
        span += (t->shape[order[a]] - 1) * s; /* cannot overflow: the extent was checked */
    }
    return 0;
}

fa_status fa__check_view(const fa_tensor *t, const char *name, int ndim, const char *dims,
                         int is_output, fa__span *span) {
    if (!t) return fa__error(FA_ERR_NULL_POINTER, "%s: NULL; expected a tensor %s", name, dims);
    if (t->ndim != ndim)
        return fa__error(FA_ERR_RANK, "%s: ndim is %d; expected %d %s", name, t->ndim, ndim, dims);
    const int esize = fa__dtype_size(t->dtype);
    if (esize == 0)
        return fa__error(FA_ERR_DTYPE, "%s: dtype %d is not a fa_dtype", name, t->dtype);
    if (t->device != FA_DEVICE_CPU && t->device != FA_DEVICE_CUDA)
        return fa__error(FA_ERR_DEVICE, "%s: device %d is not a fa_device", name, t->device);
    if (t->device == FA_DEVICE_CUDA && t->device_index < 0)
        return fa__error(FA_ERR_DEVICE, "%s: device_index is %d; expected a CUDA ordinal >= 0",
                         name, t->device_index);

    int empty = 0;
    int64_t extent = 0;
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 0)
            return fa__error(FA_ERR_SHAPE, "%s: shape[%d] is %lld; expected >= 0 %s", name, i,
                             (long long)t->shape[i], dims);
        if (t->stride[i] < 0)
            return fa__error(FA_ERR_STRIDE, "%s: stride[%d] is %lld; strides must be >= 0", name,
                             i, (long long)t->stride[i]);
        empty |= t->shape[i] == 0;
    }
    if (empty) {
        *span = (fa__span){0, 0, name};
        return FA_OK;
    }
    for (int i = 0; i < ndim; i++) {
        extent = fa__size_add(extent, fa__size_mul(t->shape[i] - 1, t->stride[i]));
        if (extent < 0)
            return fa__error(FA_ERR_STRIDE, "%s: stride[%d] = %lld puts elements beyond the "
                             "addressable range", name, i, (long long)t->stride[i]);
    }
    const int64_t bytes = fa__size_mul(fa__size_add(extent, 1), esize);
    if (bytes < 0 || bytes > (int64_t)PTRDIFF_MAX)
        return fa__error(FA_ERR_STRIDE, "%s: shape and strides span more than the addressable "
                         "range", name);
    if (!t->data)
        return fa__error(FA_ERR_NULL_POINTER, "%s: data is NULL for a non-empty tensor", name);
    const uintptr_t begin = (uintptr_t)t->data;
    if (t->device == FA_DEVICE_CUDA && begin % (uintptr_t)esize != 0)
        return fa__error(FA_ERR_STRIDE, "%s: data %p is not aligned to its %d-byte elements, which "
                         "CUDA requires", name, t->data, esize);
    if (begin + (uintptr_t)bytes < begin)
        return fa__error(FA_ERR_STRIDE, "%s: data + extent wraps around the address space", name);
    if (is_output && aliases_itself(t))
        return fa__error(FA_ERR_STRIDE, "%s: strides (%lld, %lld, %lld, %lld) make two elements "
                         "share an address", name, (long long)t->stride[0],
                         (long long)(ndim > 1 ? t->stride[1] : 0),
                         (long long)(ndim > 2 ? t->stride[2] : 0),
                         (long long)(ndim > 3 ? t->stride[3] : 0));
    *span = (fa__span){begin, begin + (uintptr_t)bytes, name};
    return FA_OK;
}

fa_status fa__check_heads(const fa_tensor *q, const fa_tensor *k, const char *k_name, int hd,
                          int dd) {
    const int64_t H = q->shape[hd], Hk = k->shape[hd], D = q->shape[dd];
    if (D == 0)
        return fa__error(FA_ERR_SHAPE, "q: head dim D (shape[%d]) is 0; expected 1..%d", dd,
                         FA_MAX_HEAD_DIM);
    if (D > FA_MAX_HEAD_DIM)
        return fa__error(FA_ERR_UNSUPPORTED, "q: head dim D (shape[%d]) is %lld; supported: 1..%d",
                         dd, (long long)D, FA_MAX_HEAD_DIM);
    if (H == 0) return fa__error(FA_ERR_SHAPE, "q: heads H (shape[%d]) is 0; expected >= 1", hd);
    if (Hk == 0 || H % Hk != 0)
        return fa__error(FA_ERR_SHAPE, "%s: shape[%d] (KV heads) is %lld, which does not divide "
                         "q's %lld heads", k_name, hd, (long long)Hk, (long long)H);
    if (k->shape[dd] != D)
        return fa__error(FA_ERR_SHAPE, "%s: head dim (shape[%d]) is %lld; expected q's %lld", k_name,
                         dd, (long long)k->shape[dd], (long long)D);
    return FA_OK;
}

fa_status fa__check_head_dim_v(const fa_tensor *v, int dd) {
    const int64_t Dv = v->shape[dd];
    if (Dv == 0)
        return fa__error(FA_ERR_SHAPE, "v: head dim Dv (shape[%d]) is 0; expected 1..%d", dd,
                         FA_MAX_HEAD_DIM);
    if (Dv > FA_MAX_HEAD_DIM)
        return fa__error(FA_ERR_UNSUPPORTED, "v: head dim Dv (shape[%d]) is %lld; supported: "
                         "1..%d", dd, (long long)Dv, FA_MAX_HEAD_DIM);
    return FA_OK;
}

static int spans_meet(const fa__span *a, const fa__span *b) {
    return a->begin < a->end && b->begin < b->end && a->begin < b->end && b->begin < a->end;
}

fa_status fa__check_overlap(const fa__span *outputs, int n_outputs, const fa__span *inputs,
                            int n_inputs) {
    for (int i = 0; i < n_outputs; i++) {
        for (int j = 0; j < n_inputs; j++)
            if (spans_meet(&outputs[i], &inputs[j]))
                return fa__error(FA_ERR_OVERLAP, "%s: overlaps the input %s; outputs need memory "
                                 "of their own", outputs[i].name, inputs[j].name);
        for (int j = i + 1; j < n_outputs; j++)
            if (spans_meet(&outputs[i], &outputs[j]))
                return fa__error(FA_ERR_OVERLAP, "%s: overlaps the output %s", outputs[i].name,
                                 outputs[j].name);
    }
    return FA_OK;
}

fa_status fa__resolve_params(const fa_params *params, fa__problem *p) {
    fa_params d;
    fa_params_init(&d);
    if (params) {
        /* Binaries built against 0.1.0's header pass the struct without cuda_stream, later ones
         * without cancel, then without sinks. */
        const size_t v1 = offsetof(fa_params, cuda_stream), v2 = offsetof(fa_params, cancel);
        const size_t v3 = offsetof(fa_params, sinks);
        if (params->struct_size != sizeof d && params->struct_size != v1 &&
            params->struct_size != v2 && params->struct_size != v3)
            return fa__error(FA_ERR_STRUCT_SIZE, "params.struct_size is %u; expected %zu (call "
                             "fa_params_init first)", params->struct_size, sizeof d);
        memcpy(&d, params, params->struct_size);
        d.struct_size = sizeof d;
    }
    if (!isfinite(d.softmax_scale))
        return fa__error(FA_ERR_VALUE, "params.softmax_scale is %g; expected a finite value "
                         "(0 = the default 1/sqrt(D))", (double)d.softmax_scale);
    if (d.window_left < -1)
        return fa__error(FA_ERR_VALUE, "params.window_left is %d; expected -1 (unbounded) or >= 0",
                         d.window_left);
    if (d.window_right < -1)
        return fa__error(FA_ERR_VALUE, "params.window_right is %d; expected -1 (unbounded) or >= 0",
                         d.window_right);
    if (!isfinite(d.softcap) || d.softcap < 0.0f)
        return fa__error(FA_ERR_VALUE, "params.softcap is %g; expected 0 (off) or a finite value "
                         "> 0", (double)d.softcap);
    const float scale = d.softmax_scale != 0.0f ? d.softmax_scale : (float)(1.0 / sqrt((double)p->D));
    if (d.softcap > 0.0f && (!isfinite(scale / d.softcap) || !isfinite(d.softcap * 1.4426950f)))
        return fa__error(FA_ERR_VALUE, "params.softcap is %g; softmax_scale / softcap or "
                         "softcap * log2(e) overflows fp32", (double)d.softcap);
    if (!(d.dropout_p >= 0.0f && d.dropout_p < 1.0f))
        return fa__error(FA_ERR_VALUE, "params.dropout_p is %g; expected a probability in [0, 1)",
                         (double)d.dropout_p);
    p->dropout_p = d.dropout_p;
    p->dropout_threshold = fa__dropout_threshold(d.dropout_p);
    p->dropout_scale = (float)(1.0 / (1.0 - (double)d.dropout_p));
    p->dropout_seed = d.dropout_seed;
    p->dropout_offset = d.dropout_offset;
    p->scale = scale;
    p->causal = d.causal != 0;
    p->window_left = d.window_left;
    p->window_right = p->causal ? 0 : d.window_right;
    p->softcap = d.softcap;
    return FA_OK;
}

fa_status fa__resolve_alibi(const fa_params *params, fa__problem *p, fa__span *span) {
    *span = (fa__span){0, 0, "params.alibi_slopes"};
    if (!params || !params->alibi_slopes.data) return FA_OK;
    const fa_tensor *a = &params->alibi_slopes;
    const char *name = "params.alibi_slopes";
    if (a->ndim != 1 && a->ndim != 2)
        return fa__error(FA_ERR_RANK, "%s: ndim is %d; expected 1 (H) or 2 (B, H)", name, a->ndim);
    fa_status st = fa__check_view(a, name, a->ndim, a->ndim == 1 ? "(H)" : "(B, H)", 0, span);
    if (st != FA_OK) return st;
    if (a->dtype != FA_DTYPE_F32)
        return fa__error(FA_ERR_DTYPE, "%s: dtype is %s; expected f32", name,
                         fa__dtype_name(a->dtype));
    if (a->ndim == 1 && a->shape[0] != p->H)
        return fa__error(FA_ERR_SHAPE, "%s: shape is (%lld); expected (H) = (%lld) or (B, H) = "
                         "(%lld, %lld)", name, (long long)a->shape[0], (long long)p->H,
                         (long long)p->B, (long long)p->H);
    if (a->ndim == 2 && (a->shape[0] != p->B || a->shape[1] != p->H))
        return fa__error(FA_ERR_SHAPE, "%s: shape is (%lld, %lld); expected (B, H) = (%lld, %lld) "
                         "or (H) = (%lld)", name, (long long)a->shape[0], (long long)a->shape[1],
                         (long long)p->B, (long long)p->H, (long long)p->H);
    p->alibi = a->data;
    p->alibi_sb = a->ndim == 2 ? a->stride[0] : 0;
    p->alibi_sh = a->stride[a->ndim - 1];
    return FA_OK;
}

fa_status fa__check_vector(const fa_tensor *t, const char *name, const char *dims, int32_t dtype,
                           int64_t n, int is_output, fa__span *span) {
    fa_status st = fa__check_view(t, name, 1, dims, is_output, span);
    if (st != FA_OK) return st;
    if (t->dtype != dtype)
        return fa__error(FA_ERR_DTYPE, "%s: dtype is %s; expected %s", name,
                         fa__dtype_name(t->dtype), fa__dtype_name(dtype));
    if (t->shape[0] != n)
        return fa__error(FA_ERR_SHAPE, "%s: shape is (%lld); expected %s = (%lld)", name,
                         (long long)t->shape[0], dims, (long long)n);
    return FA_OK;
}

fa_status fa__resolve_sinks(const fa_params *params, fa__problem *p, int backward,
                            fa__span *in, fa__span *out) {
    *in = (fa__span){0, 0, "params.sinks"};
    *out = (fa__span){0, 0, "params.dsinks"};
    if (!params || params->struct_size != sizeof *params) return FA_OK; /* from before sinks */
    const fa_tensor *s = &params->sinks, *ds = &params->dsinks;
    if (backward && ds->data && !s->data)
        return fa__error(FA_ERR_VALUE, "params.dsinks: given without params.sinks; the gradient "
                         "of the sinks needs the sinks");
    if (!s->data) return FA_OK;
    fa_status st = fa__check_vector(s, "params.sinks", "(H)", FA_DTYPE_F32, p->H, 0, in);
    if (st != FA_OK) return st;
    p->sinks = s->data;
    p->sinks_sh = s->stride[0];
    if (!backward || !ds->data) return FA_OK;
    if ((st = fa__check_vector(ds, "params.dsinks", "(H)", FA_DTYPE_F32, p->H, 1, out)))
        return st;
    p->dsinks = ds->data;
    p->dsinks_sh = ds->stride[0];
    return FA_OK;
}

static fa_status check_sink_values(const float *sinks, const fa__problem *p) {
    for (int64_t h = 0; h < p->H; h++) {
        const float x = sinks[h * p->sinks_sh];
        if (isnan(x) || x == INFINITY)
            return fa__error(FA_ERR_VALUE, "params.sinks[%lld] is %g; sinks must be finite or "
                             "-inf (no sink)", (long long)h, (double)x);
    }
    return FA_OK;
}

fa_status fa__check_sinks(const fa_params *params, const fa__problem *p, const fa_tensor *q,
                          const fa__plugin_api *api) {
    if (!p->sinks) return FA_OK;
    fa_status st;
    if ((st = fa__check_same_device(&params->sinks, "params.sinks", q, "q")) ||
        (p->dsinks && (st = fa__check_same_device(&params->dsinks, "params.dsinks", q, "q"))))
        return st;
    if (!api) return check_sink_values(p->sinks, p);
    float *host;
    st = fa__plugin_download(api, &params->sinks, "params.sinks", fa__params_stream(params),
                             (void **)&host);
    if (st == FA_OK) st = check_sink_values(host, p);
    free(host);
    return st;
}

static fa_status check_slopes(const float *slopes, const fa__problem *p) {
    if (!p->alibi) return FA_OK;
    const int64_t nb = p->alibi_sb ? p->B : 1; /* (H) slopes serve every batch */
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < p->H; h++) {
            const float x = slopes[b * p->alibi_sb + h * p->alibi_sh];
            if (!isfinite(x)) {
                if (p->alibi_sb)
                    return fa__error(FA_ERR_VALUE, "params.alibi_slopes[%lld, %lld] is %g; "
                                     "slopes must be finite", (long long)b, (long long)h, (double)x);
                return fa__error(FA_ERR_VALUE, "params.alibi_slopes[%lld] is %g; slopes must be "
                                 "finite", (long long)h, (double)x);
            }
        }
    return FA_OK;
}

fa_status fa__check_slopes(const fa_params *params, const fa__problem *p,
                           const fa__plugin_api *api) {
    if (!p->alibi || !api) return check_slopes(p->alibi, p);
    float *host;
    fa_status st = fa__plugin_download(api, &params->alibi_slopes, "params.alibi_slopes",
                                       fa__params_stream(params), (void **)&host);
    if (st == FA_OK) st = check_slopes(host, p);
    free(host);
    return st;
}

void *fa__params_stream(const fa_params *params) {
    return params && (params->struct_size == sizeof *params ||
                      params->struct_size == offsetof(fa_params, cancel) ||
                      params->struct_size == offsetof(fa_params, sinks))
               ? params->cuda_stream
               : NULL;
}

fa_status fa__check_same_device(const fa_tensor *t, const char *name, const fa_tensor *ref,
                                const char *ref_name) {
    if (t->device == ref->device && (t->device == FA_DEVICE_CPU ||
                                     t->device_index == ref->device_index))
        return FA_OK;
    const char *const names[] = {"the CPU", "CUDA device"};
    if (t->device != ref->device)
        return fa__error(FA_ERR_DEVICE, "%s: is on %s but %s is on %s; every tensor of a call "
                         "must be on one device", name, names[t->device], ref_name,
                         names[ref->device]);
    return fa__error(FA_ERR_DEVICE, "%s: is on CUDA device %d but %s is on CUDA device %d; every "
                     "tensor of a call must be on one device", name, t->device_index, ref_name,
                     ref->device_index);
}
