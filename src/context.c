/* SPDX-License-Identifier: MIT */
/*
 * context.c — the opaque fa_context: its thread count and pool, the lazily created default
 * context, the thread-count defaults (FA_NUM_THREADS, then the CPUs this process may use) and
 * how long idle threads poll before they sleep (FA_SPIN_US), and the calling thread's call in
 * progress: its cancel flag, and whether the flag made a batch skip tasks.
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "internal.h"
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

enum { FA_MAX_THREADS = 1024, FA_SPIN_US_DEFAULT = 50, FA_SPIN_US_MAX = 100000 };

struct fa_context {
    int nthreads;
    fa__pool *pool;
    pthread_mutex_t run_mu; /* one call at a time per context */
};

void fa_context_options_init(fa_context_options *opts) {
    if (!opts) return;
    *opts = (fa_context_options){.struct_size = sizeof *opts, .num_threads = 0};
}

static int available_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

fa_status fa__default_threads(int32_t *out) {
    const char *env = getenv("FA_NUM_THREADS");
    if (env && *env) {
        char *end;
        errno = 0;
        long n = strtol(env, &end, 10);
        if (errno || *end || n < 1 || n > FA_MAX_THREADS)
            return fa__error(FA_ERR_VALUE, "FA_NUM_THREADS is \"%.32s\"; expected an integer in 1..%d",
                             env, FA_MAX_THREADS);
        *out = (int32_t)n;
        return FA_OK;
    }
    int n = available_cpus();
    *out = n < FA_MAX_THREADS ? n : FA_MAX_THREADS;
    return FA_OK;
}

/* FA_SPIN_US: microseconds a thread polls for the next batch (a worker) or for the workers'
 * last tasks (the caller) before it sleeps. Polling saves the wake-ups that dominate short
 * calls (a decode step); 0 never polls, for processes that share their cores. */
static fa_status spin_ns(int64_t *out) {
    const char *env = getenv("FA_SPIN_US");
    long us = FA_SPIN_US_DEFAULT;
    if (env && *env) {
        char *end;
        errno = 0;
        us = strtol(env, &end, 10);
        if (errno || *end || us < 0 || us > FA_SPIN_US_MAX)
            return fa__error(FA_ERR_VALUE,
                             "FA_SPIN_US is \"%.32s\"; expected an integer in 0..%d (microseconds)",
                             env, FA_SPIN_US_MAX);
    }
    *out = (int64_t)us * 1000;
    return FA_OK;
}

fa_status fa_context_create(const fa_context_options *opts, fa_context **out) {
    fa__clear_error();
    if (!out) return fa__error(FA_ERR_NULL_POINTER, "out: NULL; expected a fa_context* to fill");
    fa_context_options o;
    fa_context_options_init(&o);
    if (opts) {
        if (opts->struct_size != sizeof o)
            return fa__error(FA_ERR_STRUCT_SIZE,
                             "opts.struct_size is %u; expected %zu (call fa_context_options_init)",
                             opts->struct_size, sizeof o);
        o = *opts;
    }
    if (o.num_threads < 0 || o.num_threads > FA_MAX_THREADS)
        return fa__error(FA_ERR_VALUE, "opts.num_threads is %d; expected 0 (automatic) to %d",
                         o.num_threads, FA_MAX_THREADS);
    int32_t n = o.num_threads;
    if (n == 0) {
        fa_status st = fa__default_threads(&n);
        if (st != FA_OK) return st;
    }
    int64_t spin = 0;
    fa_status st = spin_ns(&spin);
    if (st != FA_OK) return st;
    fa_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fa__error(FA_ERR_NO_MEMORY, "fa_context_create: out of memory");
    ctx->nthreads = n;
    ctx->pool = fa__pool_create(n, spin);
    if (!ctx->pool) {
        free(ctx);
        return fa__error(FA_ERR_NO_MEMORY, "fa_context_create: cannot start %d threads", n);
    }
    pthread_mutex_init(&ctx->run_mu, NULL);
    *out = ctx;
    return FA_OK;
}

void fa_context_destroy(fa_context *ctx) {
    if (!ctx) return;
    fa__pool_destroy(ctx->pool);
    pthread_mutex_destroy(&ctx->run_mu);
    free(ctx);
}

static fa_context *default_ctx;
static fa_status default_status;
static char default_message[256];
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void create_default(void) {
    default_status = fa_context_create(NULL, &default_ctx);
    if (default_status != FA_OK) {
        /* Keep the reason for every later caller: the once-function runs only once. */
        const char *msg = fa_last_error_message();
        size_t i = 0;
        for (; msg[i] && i + 1 < sizeof default_message; i++) default_message[i] = msg[i];
        default_message[i] = '\0';
    }
}

/* The context behind a handle (NULL: the default one, created on first use), or its creation
 * error. */
static fa_status resolve(fa_context **ctx) {
    if (*ctx) return FA_OK;
    pthread_once(&default_once, create_default);
    if (!default_ctx) return fa__error(default_status, "default context: %s", default_message);
    *ctx = default_ctx;
    return FA_OK;
}

int32_t fa_context_num_threads(fa_context *ctx) {
    return resolve(&ctx) == FA_OK ? ctx->nthreads : 1;
}

int fa__context_threads(const fa_context *ctx) { return ctx->nthreads; }

/* The calling thread's call between fa__call_begin and fa__call_end. */
static _Thread_local struct {
    const int32_t *cancel; /* its params.cancel, or NULL */
    int skipped;           /* a batch left tasks out for the flag: skip the rest of the call */
} call;

const int32_t *fa__call_cancel(void) { return call.cancel; }

fa_status fa__call_begin(fa_context **ctx, const fa_params *params) {
    fa_status st = resolve(ctx);
    if (st != FA_OK) return st;
    /* params was validated: its struct_size is one fa__resolve_params accepts */
    const size_t has_cancel = offsetof(fa_params, cancel) + sizeof params->cancel;
    const int32_t *flag = params && params->struct_size >= has_cancel ? params->cancel : NULL;
    if (fa__cancelled(flag))
        return fa__error(FA_ERR_CANCELLED, "params.cancel: the flag was set before the call "
                         "started; nothing was computed or written");
    call.cancel = flag;
    call.skipped = 0;
    return FA_OK;
}

fa_status fa__call_end(fa_status st) {
    /* a task that saw the flag stopped early without leaving a task out */
    const int skipped = call.skipped || fa__cancelled(call.cancel);
    call.cancel = NULL;
    call.skipped = 0;
    if (st == FA_OK && skipped)
        return fa__error(FA_ERR_CANCELLED, "params.cancel: the flag was set while the call ran; "
                         "it stopped early and its outputs are unspecified");
    return st;
}

void fa__context_run(fa_context *ctx, int64_t ntasks, fa__task_fn fn, void *arg) {
    if (ntasks <= 0) return;
    if (call.skipped || fa__cancelled(call.cancel)) { /* a later batch may read an earlier one's */
        call.skipped = 1;
        return;
    }
    pthread_mutex_lock(&ctx->run_mu);
    if (fa__pool_run(ctx->pool, ntasks, fn, arg, call.cancel)) call.skipped = 1;
    pthread_mutex_unlock(&ctx->run_mu);
}
