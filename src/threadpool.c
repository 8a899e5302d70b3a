/* SPDX-License-Identifier: MIT */
/*
 * threadpool.c — the persistent worker pool behind a context. Workers sleep on a condition
 * variable between batches; within a batch every thread, the caller included, takes the next
 * task from an atomic counter until none are left.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct fa__pool {
    int nthreads; /* workers + the caller */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a new batch, or stop */
    pthread_cond_t done; /* the last worker left the batch */
    uint64_t batch;      /* incremented for every batch */
    int busy;            /* workers still inside the current batch */
    int stop;
    fa__task_fn fn;
    void *arg;
    int64_t ntasks;
    atomic_int_fast64_t next;
};

typedef struct worker_arg {
    fa__pool *pool;
    int id;
} worker_arg;

static void drain(fa__pool *pool, int worker) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (t >= pool->ntasks) return;
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
        pthread_mutex_unlock(&pool->mu);
        drain(pool, wa.id);
        pthread_mutex_lock(&pool->mu);
        if (--pool->busy == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

fa__pool *fa__pool_create(int nthreads) {
    fa__pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->nthreads = nthreads;
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

void fa__pool_run(fa__pool *pool, int64_t ntasks, fa__task_fn fn, void *arg) {
    const int caller = pool->nthreads - 1;
    if (pool->nthreads == 1 || ntasks == 1) {
        for (int64_t t = 0; t < ntasks; t++) fn(arg, t, caller);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->arg = arg;
    pool->ntasks = ntasks;
    atomic_store(&pool->next, 0);
    pool->busy = pool->nthreads - 1;
    pool->batch++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);

    drain(pool, caller);

    pthread_mutex_lock(&pool->mu);
    while (pool->busy > 0) pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}
