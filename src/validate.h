/* SPDX-License-Identifier: MIT */
/*
 * validate.h — checks of tensor views and parameters shared by every entry point. Each check
 * records a message naming the argument and returns its status; none writes to a tensor.
 */
#ifndef FA_VALIDATE_H
#define FA_VALIDATE_H

#include "internal.h"
#include "plugin_abi.h"
#include "problem.h"

/* The bytes a view spans, for overlap checks; empty when the view has no elements. */
typedef struct fa__span {
    uintptr_t begin, end;
    const char *name;
} fa__span;

/* A view of rank `ndim` (on the CPU, or CUDA with device_index >= 0) with non-negative shape and strides whose addresses do not
 * overflow, and non-NULL data unless it is empty. `dims` names the dimensions for messages,
 * e.g. "(B, Sq, H, D)". An output must also not map two elements to one address. */
fa_status fa__check_view(const fa_tensor *t, const char *name, int ndim, const char *dims,
                         int is_output, fa__span *span);

enum { FA_MAX_HEAD_DIM = 256 };

/* q's heads H (dimension hd) >= 1 and head dim D (dimension dd) in 1..FA_MAX_HEAD_DIM; k (named
 * k_name) with Hk heads dividing H and q's head dim. Records the message and returns its status. */
fa_status fa__check_heads(const fa_tensor *q, const fa_tensor *k, const char *k_name, int hd,
                          int dd);

/* v's head dim Dv (dimension dd) in 1..FA_MAX_HEAD_DIM, independent of q's D. */
fa_status fa__check_head_dim_v(const fa_tensor *v, int dd);

/* An error unless every output span is disjoint from every other span. */
fa_status fa__check_overlap(const fa__span *outputs, int n_outputs, const fa__span *inputs,
                            int n_inputs);

/* Resolves params (NULL = defaults) into p->scale, window, softcap, and checks their values.
 * Needs p->D. ALiBi is checked separately, once B and H are known. */
fa_status fa__resolve_params(const fa_params *params, fa__problem *p);

/* Checks params->alibi_slopes against (H) or (B, H) and fills p->alibi; records its span. */
fa_status fa__resolve_alibi(const fa_params *params, fa__problem *p, fa__span *span);

/* t: a 1-D view (dims names its length, e.g. "(H)") of `dtype` and length n, checked as an input
 * or an output view and recorded in span. */
fa_status fa__check_vector(const fa_tensor *t, const char *name, const char *dims, int32_t dtype,
                           int64_t n, int is_output, fa__span *span);

/* Checks params->sinks (and, for a backward, params->dsinks) against fp32 (H) and fills
 * p->sinks (p->dsinks); records their spans (in: sinks, out: dsinks; empty when absent). Structs
 * from before sinks have none. Needs p->H. */
fa_status fa__resolve_sinks(const fa_params *params, fa__problem *p, int backward,
                            fa__span *in, fa__span *out);

/* With p->sinks: FA_ERR_DEVICE unless sinks (and dsinks) are on q's device, FA_ERR_VALUE for a
 * NaN or +inf sink. O(H); reads the sinks, through api's copy when they are on a CUDA device
 * (api: the plug-in, NULL for CPU tensors). */
fa_status fa__check_sinks(const fa_params *params, const fa__problem *p, const fa_tensor *q,
                          const fa__plugin_api *api);

/* FA_ERR_VALUE unless every slope of p->alibi (if any) is finite; api: the plug-in when the
 * slopes (params->alibi_slopes) are on a CUDA device, copied to the host for the check, else
 * NULL. O(B·H): called once the call has output elements. */
fa_status fa__check_slopes(const fa_params *params, const fa__problem *p,
                           const fa__plugin_api *api);

/* params->cuda_stream, or NULL for NULL params and for structs from before it existed. */
void *fa__params_stream(const fa_params *params);

/* FA_ERR_DEVICE unless t (named `name`, already checked by fa__check_view) is on ref's device
 * (and, for CUDA, ref's device_index). */
fa_status fa__check_same_device(const fa_tensor *t, const char *name, const fa_tensor *ref,
                                const char *ref_name);

#endif /* FA_VALIDATE_H */
