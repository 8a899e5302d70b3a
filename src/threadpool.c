/* SPDX-License-Identifier: MIT */
/*
 * threadpool.c — the persistent worker pool behind a context. Workers sleep on a condition
 * variable between batches; within a batch every thread, the caller included, takes the next
 * task from an atomic counter until none are left. A batch is open until the caller has run
 * out of tasks: a worker that wakes after that skips it, so the caller never waits for a thread
 * to wake up only to find nothing left (small batches, e.g. a short decode step, finish on the
 * caller alone instead of paying a wake-up). A batch may carry a cancel flag: once it is set,
 * each thread leaves the batch before its next task, so the rest are skipped.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* A spinning wait's step between two polls: 0 once the clock has passed `end`. */
static int relax_until(int64_t end) {
    for (int i = 0; i < 16; i++) cpu_relax();
    return now_ns() < end;
}

struct fa__pool {
    int nthreads; /* workers + the caller */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake;        /* a new batch, or stop */
    pthread_cond_t done;        /* the last worker left the batch */
    atomic_uint_fast64_t batch; /* incremented for every batch (under mu; read while spinning) */
    int open;                   /* the current batch still takes workers */
    atomic_int busy;            /* workers that joined the batch and have not left it (changed
                                 * under mu; the caller reads it while it spins) */
    atomic_int stop;
    int64_t spin_ns;            /* how long a thread waits awake before it sleeps */
    fa__task_fn fn;
    void *arg;
    int64_t ntasks;
    const int32_t *cancel; /* the batch's cancel flag, or NULL */
    atomic_int_fast64_t next;
    atomic_int skipped; /* a thread left the batch for the flag, with tasks not run */
};

typedef struct worker_arg {
    fa__pool *pool;
    int id;
} worker_arg;

static int cancelled(const int32_t *flag) {
    return flag && __atomic_load_n(flag, __ATOMIC_RELAXED) != 0;
}

static void drain(fa__pool *pool, int worker) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (t >= pool->ntasks) return;
        if (cancelled(pool->cancel)) { /* task t and the ones after it are not run */
            atomic_store_explicit(&pool->skipped, 1, memory_order_relaxed);
            return;
        }
        pool->fn(pool->arg, t, worker);
    }
}

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    fa__pool *pool = wa.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->batch == seen) pthread_cond_wait(&pool->wake, &pool->mu);
        if (pool->stop) break;
        seen = pool->batch;
        if (!pool->open) continue; /* woke too late: the caller has taken every task */
        pool->busy++;
        pthread_mutex_unlock(&pool->mu);
        drain(pool, wa.id);
        pthread_mutex_lock(&pool->mu);
        if (--pool->busy == 0 && !pool->open) pthread_cond_signal(&pool->done);
        /* The next batch often follows at once (a forward's merge, a decode loop's next step):
         * wait for it awake for a while before sleeping. */
        pthread_mutex_unlock(&pool->mu);
        const int64_t end = now_ns() + pool->spin_ns;
        while (pool->spin_ns > 0 && atomic_load(&pool->batch) == seen && !atomic_load(&pool->stop) &&
               relax_until(end)) {
        }
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

fa__pool *fa__pool_create(int nthreads, int64_t spin_ns) {
    fa__pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->nthreads = nthreads;
    pool->spin_ns = spin_ns;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->workers = calloc((size_t)nthreads, sizeof *pool->workers);
    if (!pool->workers) {
        fa__pool_destroy(pool);
        return NULL;
    }
    for (int i = 0; i < nthreads - 1; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){pool, i};
        if (!wa || pthread_create(&pool->workers[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->nthreads = i + 1; /* the workers started so far, plus the caller */
            fa__pool_destroy(pool);
            return NULL;
        }
    }
    return pool;
}

void fa__pool_destroy(fa__pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; pool->workers && i < pool->nthreads - 1; i++)
        pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool);
}

int fa__pool_run(fa__pool *pool, int64_t ntasks, fa__task_fn fn, void *arg, const int32_t *cancel) {
    const int caller = pool->nthreads - 1;
    if (pool->nthreads == 1 || ntasks == 1) {
        for (int64_t t = 0; t < ntasks; t++) {
            if (cancelled(cancel)) return 1;
            fn(arg, t, caller);
        }
        return 0;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->arg = arg;
    pool->ntasks = ntasks;
    pool->cancel = cancel;
    atomic_store(&pool->next, 0);
    atomic_store(&pool->skipped, 0);
    pool->open = 1;
    pool->batch++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);

    drain(pool, caller);

    pthread_mutex_lock(&pool->mu);
    pool->open = 0; /* every task is taken: later wakers skip the batch */
    pthread_mutex_unlock(&pool->mu);
    /* The workers still inside are on their last task: wait for them awake for a while (a
     * sleeping caller pays one more wake-up), then sleep. */
    const int64_t end = now_ns() + pool->spin_ns;
    while (pool->spin_ns > 0 && atomic_load(&pool->busy) > 0 && relax_until(end)) {
    }
    pthread_mutex_lock(&pool->mu);
    while (atomic_load(&pool->busy) > 0) pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    return atomic_load(&pool->skipped);
}
