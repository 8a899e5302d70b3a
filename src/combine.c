/* SPDX-License-Identifier: MIT */
/*
 * combine.c — fa_combine: the partial attentions' checks, then their merge (combine.h) on the
 * CPU's threads or by the CUDA plug-in.
 */
#include "combine.h"

#include "internal.h"
#include "plugin.h"
#include "size.h"
#include "validate.h"

#include <stddef.h>
#include <stdint.h>

enum { COMBINE_TASKS_PER_JOB = 1024 }; /* combine.h tasks one pool task runs */

/* Part 0's view t checked as `name`, then its span stretched over the n parts (part i at
 * + i·stride elements). */
static fa_status check_parts(const fa_tensor *t, const char *name, int ndim, const char *dims,
                             int64_t n, int64_t stride, fa__span *span) {
    fa_status st = fa__check_view(t, name, ndim, dims, 0, span);
    if (st != FA_OK)
        return st;
    if (t->dtype != FA_DTYPE_F32)
        return fa__error(FA_ERR_DTYPE, "%s: dtype is %s; expected f32 (partial results are fp32)",
                         name, fa__dtype_name(t->dtype));
    const int64_t bytes = fa__size_mul(fa__size_mul(n - 1, stride), 4);
    if (stride < 0 || bytes < 0 || (uintptr_t)bytes > UINTPTR_MAX - span->end)
        return fa__error(FA_ERR_STRIDE,
                         "%s_stride is %lld; expected >= 0 with every one of the "
                         "%lld parts addressable",
                         name, (long long)stride, (long long)n);
    if (span->end > span->begin)
        span->end += (uintptr_t)bytes; /* empty views span nothing */
    return FA_OK;
}

/* The arguments' views, ranks, dtypes, shapes, devices and overlaps; c filled in. */
static fa_status check(int64_t n, const fa_tensor *op, int64_t op_stride, const fa_tensor *lp,
                       int64_t lp_stride, const fa_tensor *out, const fa_tensor *lse,
                       fa__combine *c) {
    fa__span spans[4];
    fa_status st;
    if (n < 1)
        return fa__error(FA_ERR_VALUE, "n is %lld; expected >= 1 partial result", (long long)n);
    if ((st = check_parts(op, "out_partial", 4, "(B, S, H, D)", n, op_stride, &spans[0])) ||
        (st = check_parts(lp, "lse_partial", 3, "(B, S, H)", n, lp_stride, &spans[1])) ||
        (st = fa__check_view(out, "out", 4, "(B, S, H, D)", 1, &spans[2])))
        return st;
    if (out->dtype != FA_DTYPE_F32 && out->dtype != FA_DTYPE_F16 && out->dtype != FA_DTYPE_BF16)
        return fa__error(FA_ERR_DTYPE, "out: dtype is %s; expected f32, f16 or bf16",
                         fa__dtype_name(out->dtype));
    for (int i = 0; i < 4; i++) {
        if (i < 3 && lp->shape[i] != op->shape[i])
            return fa__error(FA_ERR_SHAPE,
                             "lse_partial: shape[%d] is %lld; expected "
                             "out_partial's %lld (B, S, H)",
                             i, (long long)lp->shape[i], (long long)op->shape[i]);
        if (out->shape[i] != op->shape[i])
            return fa__error(FA_ERR_SHAPE,
                             "out: shape[%d] is %lld; expected out_partial's %lld "
                             "(B, S, H, D)",
                             i, (long long)out->shape[i], (long long)op->shape[i]);
    }
    if (lse) {
        if ((st = fa__check_view(lse, "lse", 3, "(B, S, H)", 1, &spans[3])))
            return st;
        if (lse->dtype != FA_DTYPE_F32)
            return fa__error(FA_ERR_DTYPE, "lse: dtype is %s; expected f32",
                             fa__dtype_name(lse->dtype));
        for (int i = 0; i < 3; i++)
            if (lse->shape[i] != op->shape[i])
                return fa__error(FA_ERR_SHAPE,
                                 "lse: shape[%d] is %lld; expected out_partial's "
                                 "%lld (B, S, H)",
                                 i, (long long)lse->shape[i], (long long)op->shape[i]);
    }
    const fa_tensor *const others[] = {lp, out, lse};
    static const char *const names[] = {"lse_partial", "out", "lse"};
    for (int i = 0; i < 3; i++)
        if (others[i] && (st = fa__check_same_device(others[i], names[i], op, "out_partial")))
            return st;
    if ((st = fa__check_overlap(&spans[2], lse ? 2 : 1, spans, 2)))
        return st;

    *c = (fa__combine){.n = n,
                       .B = op->shape[0],
                       .S = op->shape[1],
                       .H = op->shape[2],
                       .D = op->shape[3],
                       .op = op->data,
                       .lp = lp->data,
                       .out = {.data = out->data,
                               .dtype = out->dtype,
                               .sb = out->stride[0],
                               .ss = out->stride[1],
                               .sh = out->stride[2],
                               .sd = out->stride[3]},
                       .lse = lse ? lse->data : NULL};
    c->op_s[0] = op_stride;
    c->lp_s[0] = lp_stride;
    for (int i = 0; i < 4; i++)
        c->op_s[i + 1] = op->stride[i];
    for (int i = 0; i < 3; i++)
        c->lp_s[i + 1] = lp->stride[i];
    for (int i = 0; lse && i < 3; i++)
        c->lse_s[i] = lse->stride[i];
    return FA_OK;
}

typedef struct combine_job {
    const fa__combine *c;
    int64_t tasks;
} combine_job;

static void combine_run(void *arg, int64_t job, int worker) {
    (void)worker;
    const combine_job *j = arg;
    const int64_t end = (job + 1) * COMBINE_TASKS_PER_JOB;
    for (int64_t t = job * COMBINE_TASKS_PER_JOB; t < end && t < j->tasks; t++)
        fa__combine_task(j->c, t);
}

fa_status fa_combine(fa_context *ctx, const fa_params *params, int64_t n,
                     const fa_tensor *out_partial, int64_t out_partial_stride,
                     const fa_tensor *lse_partial, int64_t lse_partial_stride, const fa_tensor *out,
                     const fa_tensor *lse) {
    fa__clear_error();
    fa__combine c;
    fa_status st =
        check(n, out_partial, out_partial_stride, lse_partial, lse_partial_stride, out, lse, &c);
    if (st != FA_OK)
        return st;
    if (params && params->struct_size != sizeof *params &&
        params->struct_size != offsetof(fa_params, cancel) &&
        params->struct_size != offsetof(fa_params, sinks))
        return fa__error(FA_ERR_STRUCT_SIZE,
                         "params.struct_size is %u; expected %zu (call "
                         "fa_params_init first)",
                         params->struct_size, sizeof *params);
    /* every row gets a task per column group; nothing to write without rows or columns */
    const int64_t rows = fa__size_mul(fa__size_mul(c.B, c.S), c.H);
    const int64_t tasks = fa__size_mul(rows, (c.D + FA_COMBINE_COLS - 1) / FA_COMBINE_COLS);
    if (tasks == 0)
        return FA_OK;
    if (out_partial->device == FA_DEVICE_CUDA) {
        const fa__plugin_api *api;
        if ((st = fa__plugin_device("out_partial", out_partial->device_index, &api)))
            return st;
        char msg[512] = "";
        return fa__plugin_status(
            api->combine(&c, out_partial->device_index, fa__params_stream(params), msg, sizeof msg),
            msg);
    }
    if ((st = fa__call_begin(&ctx, params)))
        return st;
    const combine_job job = {&c, tasks};
    fa__context_run(ctx, (tasks + COMBINE_TASKS_PER_JOB - 1) / COMBINE_TASKS_PER_JOB, combine_run,
                    (void *)&job);
    return fa__call_end(FA_OK);
}
