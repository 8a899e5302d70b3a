/* SPDX-License-Identifier: MIT */
/*
 * threadpool.h — a persistent pool of pthreads that runs a batch of independent tasks, handed
 * out one at a time from an atomic counter, and stopped early by a cancel flag.
 */
#ifndef FA_THREADPOOL_H
#define FA_THREADPOOL_H

#include "internal.h"

/* A pool whose batches run on `nthreads` threads: nthreads - 1 workers plus the caller. A
 * worker that has finished a batch, and the caller waiting for the workers' last tasks, poll for
 * up to spin_ns nanoseconds before they sleep (0: sleep at once). Returns NULL when threads or
 * memory cannot be had. */
fa__pool *fa__pool_create(int nthreads, int64_t spin_ns);

/* Joins the workers and frees the pool. NULL is a no-op. */
void fa__pool_destroy(fa__pool *pool);

/* Runs fn(arg, task, worker) for task = 0..ntasks-1 and returns when all are done, or, once
 * *cancel (read atomically before each task; cancel may be NULL) is nonzero, when the tasks
 * already started are done: then it returns 1 if tasks were left out, else 0. Not reentrant:
 * one batch at a time per pool (the context serializes). */
int fa__pool_run(fa__pool *pool, int64_t ntasks, fa__task_fn fn, void *arg, const int32_t *cancel);

#endif /* FA_THREADPOOL_H */
