/* SPDX-License-Identifier: MIT */
/*
 * internal.h — declarations shared inside libflashattn (never installed). Internal non-static
 * names use the fa__ prefix.
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "flashattn.h"

#include <stdint.h>

#if defined(__GNUC__)
#define FA__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FA__PRINTF(fmt, args)
#endif

/* Records the calling thread's error message (printf-style) and returns status. */
fa_status fa__error(fa_status status, const char *fmt, ...) FA__PRINTF(2, 3);

/* Clears the calling thread's error message (at the start of every entry point). */
void fa__clear_error(void);

/* Bytes per element of a dtype, 0 for an unknown dtype. */
static inline int fa__dtype_size(int32_t dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16: return 2;
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_I32: return 4;
    case FA_DTYPE_U8: return 1;
    case FA_DTYPE_I8: return 1;
    case FA_DTYPE_F8_E4M3: return 1;
    case FA_DTYPE_F8_E5M2: return 1;
    }
    return 0;
}

/* Is dtype one of the 8-bit cache formats (i8, f8_e4m3, f8_e5m2)? */
static inline int fa__dtype_8bit(int32_t dtype) {
    return dtype == FA_DTYPE_I8 || dtype == FA_DTYPE_F8_E4M3 || dtype == FA_DTYPE_F8_E5M2;
}

/* "f32", "f16", "bf16", "i32", "u8", "i8", "f8_e4m3", "f8_e5m2" or "unknown". */
const char *fa__dtype_name(int32_t dtype);

/* ---- context and thread pool ---- */

typedef struct fa__pool fa__pool;

/* A task body: runs task `task` (0 <= task < ntasks) on worker `worker` (0 <= worker < nthreads). */
typedef void (*fa__task_fn)(void *arg, int64_t task, int worker);

/* Begins a CPU call on the calling thread, after its arguments are checked: resolves *ctx (NULL:
 * the default context, created on first use) and arms params.cancel for the call's batches.
 * Returns the default context's creation error (FA_ERR_VALUE for a malformed FA_NUM_THREADS or
 * FA_SPIN_US), or FA_ERR_CANCELLED when the flag is already set; on FA_OK the call must end
 * with fa__call_end. */
fa_status fa__call_begin(fa_context **ctx, const fa_params *params);

/* The calling thread's cancel flag (params.cancel of its call in progress), or NULL. A long
 * task reads it between its steps, through fa__cancelled, and stops early when it is set: the
 * call then ends with FA_ERR_CANCELLED (fa__call_end checks the flag once more). */
const int32_t *fa__call_cancel(void);

static inline int fa__cancelled(const int32_t *flag) {
    return flag && __atomic_load_n(flag, __ATOMIC_RELAXED) != 0;
}

/* Ends the calling thread's call: returns st, or FA_ERR_CANCELLED (with its message) when st is
 * FA_OK but the cancel flag left tasks out. */
fa_status fa__call_end(fa_status st);

/* Runs tasks 0..ntasks-1 on the context's threads, each task exactly once, in an order and on
 * threads that are unspecified; returns when all are done. Calls on one context are serialized.
 * Within a call whose cancel flag is set, the tasks not yet started (and later batches) are
 * skipped. */
void fa__context_run(fa_context *ctx, int64_t ntasks, fa__task_fn fn, void *arg);

int fa__context_threads(const fa_context *ctx);

/* Resolves num_threads = 0 through FA_NUM_THREADS and the CPUs available. Returns FA_OK and sets
 * *out, or an error for a malformed FA_NUM_THREADS. */
fa_status fa__default_threads(int32_t *out);

#endif /* FA_INTERNAL_H */
