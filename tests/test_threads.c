/* SPDX-License-Identifier: MIT */
/*
 * test_threads.c — determinism across thread counts and runs, and the context API.
 *
 * The same inputs run on contexts of 1, 2 and 3 threads, on the default (NULL) context, twice
 * on the same context, and from two application threads sharing one context must give bitwise
 * identical out and lse (DESIGN.md §3 "Determinism"). Hundreds of short calls in a row (decode
 * steps, tiny prefills) on pools of 2, 3 and 8 threads with and without polling exercise
 * batches that end before a worker wakes up. A call cancelled through its params.cancel while
 * another application thread's calls share its context stops (FA_ERR_CANCELLED) without
 * touching the other's: the flag belongs to one call, not to the context.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, nanosleep */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"
#include "test.h"
#include "testutil.h"

typedef struct tcfg {
    const char *name;
    int varlen;
    int64_t B, Sq, Sk, H, Hk, D; /* varlen: B sequences, lengths drawn up to Sq / Sk */
    int causal, wl, wr, alibi;
    float softcap;
    int dtype;
    float dropout_p;
} tcfg;

/* One problem's inputs and outputs. */
typedef struct problem {
    const tcfg *c;
    tu_tensor q, k, v, out, lse;
    int32_t cuq[17], cuk[17];
    fa_tensor tcuq, tcuk;
    int64_t maxq, maxk, nb;
    float slopes[256];
    fa_params params;
} problem;

static void problem_init(problem *p, const tcfg *c) {
    memset(p, 0, sizeof *p);
    p->c = c;
    fa_params_init(&p->params);
    p->params.causal = c->causal;
    p->params.window_left = c->wl;
    p->params.window_right = c->wr;
    p->params.softcap = c->softcap;
    p->params.dropout_p = c->dropout_p;
    p->params.dropout_seed = tu_next_u64();
    p->params.dropout_offset = tu_next_u64();
    if (c->varlen) {
        p->cuq[0] = p->cuk[0] = 0;
        for (int64_t b = 0; b < c->B; b++) {
            int64_t lq = tu_randint(0, c->Sq), lk = tu_randint(0, c->Sk);
            p->cuq[b + 1] = p->cuq[b] + (int32_t)lq;
            p->cuk[b + 1] = p->cuk[b] + (int32_t)lk;
            if (lq > p->maxq)
                p->maxq = lq;
            if (lk > p->maxk)
                p->maxk = lk;
        }
        p->nb = c->B + 1;
        p->tcuq = fa_tensor_contiguous(p->cuq, FA_DTYPE_I32, 1, &p->nb);
        p->tcuk = fa_tensor_contiguous(p->cuk, FA_DTYPE_I32, 1, &p->nb);
        int64_t tq = p->cuq[c->B], tk = p->cuk[c->B];
        int64_t qs[3] = {tq, c->H, c->D}, ks[3] = {tk, c->Hk, c->D}, ls[2] = {c->H, tq};
        tu_alloc(&p->q, c->dtype, 3, qs, TU_CONTIG);
        tu_alloc(&p->k, c->dtype, 3, ks, TU_CONTIG);
        tu_alloc(&p->v, c->dtype, 3, ks, TU_CONTIG);
        tu_alloc(&p->out, c->dtype, 3, qs, TU_CONTIG);
        tu_alloc(&p->lse, FA_DTYPE_F32, 2, ls, TU_CONTIG);
    } else {
        int64_t qs[4] = {c->B, c->Sq, c->H, c->D}, ks[4] = {c->B, c->Sk, c->Hk, c->D};
        int64_t ls[3] = {c->B, c->H, c->Sq};
        tu_alloc(&p->q, c->dtype, 4, qs, TU_CONTIG);
        tu_alloc(&p->k, c->dtype, 4, ks, TU_PERMUTED);
        tu_alloc(&p->v, c->dtype, 4, ks, TU_CONTIG);
        tu_alloc(&p->out, c->dtype, 4, qs, TU_CONTIG);
        tu_alloc(&p->lse, FA_DTYPE_F32, 3, ls, TU_CONTIG);
    }
    double *tmp = malloc(sizeof(double) * (size_t)(p->q.numel + p->k.numel + p->v.numel + 1));
    if (!tmp)
        abort();
    tu_fill_normal(&p->q, 1.0, tmp);
    tu_fill_normal(&p->k, 1.0, tmp);
    tu_fill_normal(&p->v, 1.0, tmp);
    free(tmp);
    if (c->alibi) {
        int64_t sh[2] = {c->B, c->H};
        for (int64_t i = 0; i < c->B * c->H; i++)
            p->slopes[i] = (float)(0.01 + 0.3 * tu_uniform());
        p->params.alibi_slopes = fa_tensor_contiguous(p->slopes, FA_DTYPE_F32, 2, sh);
    }
}

static void problem_free(problem *p) {
    tu_free(&p->q);
    tu_free(&p->k);
    tu_free(&p->v);
    tu_free(&p->out);
    tu_free(&p->lse);
}

/* Bytes of a copy of out and of lse: at least one element each, so an empty problem (a varlen
 * batch whose sequences all drew 0 queries) still has buffers, poisoned and compared whole. */
static size_t out_bytes(const problem *p) {
    return (size_t)(p->out.nbuf ? p->out.nbuf : 1) * tu_dtype_size(p->c->dtype);
}
static size_t lse_bytes(const problem *p) { return (size_t)(p->lse.nbuf ? p->lse.nbuf : 1) * 4; }

/* Runs the problem on ctx into fresh out/lse copies (poisoned first); returns the status. */
static fa_status problem_run(const problem *p, fa_context *ctx, void *out_buf, void *lse_buf) {
    memset(out_buf, 0xFF, out_bytes(p));
    memset(lse_buf, 0xFF, lse_bytes(p));
    fa_tensor out = p->out.t, lse = p->lse.t;
    out.data = out_buf;
    lse.data = lse_buf;
    if (p->c->varlen)
        return fa_varlen_forward(ctx, &p->params, &p->q.t, &p->k.t, &p->v.t, &p->tcuq, &p->tcuk,
                                 p->maxq, p->maxk, &out, &lse);
    return fa_forward(ctx, &p->params, &p->q.t, &p->k.t, &p->v.t, &out, &lse);
}

typedef struct worker_arg {
    const problem *p;
    fa_context *ctx;
    void *out, *lse;
    fa_status st;
    int reps;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *w = arg;
    for (int r = 0; r < w->reps; r++)
        w->st = problem_run(w->p, w->ctx, w->out, w->lse);
    return NULL;
}

/* Calls until one fails (its status in w->st) or w->reps calls succeed. */
static void *run_until_error(void *arg) {
    worker_arg *w = arg;
    for (int r = 0; r < w->reps; r++)
        if ((w->st = problem_run(w->p, w->ctx, w->out, w->lse)) != FA_OK)
            break;
    return NULL;
}

/* An application thread that calls until told to stop, each result checked against want. */
typedef struct steady_arg {
    worker_arg w;
    const unsigned char *want_o, *want_l;
    int stop;   /* atomic: set by the main thread */
    long calls; /* atomic: calls made so far */
    int bad;    /* atomic: a call failed or differed (then it stops) */
} steady_arg;

static void *run_steadily(void *arg) {
    steady_arg *s = arg;
    const size_t ob = out_bytes(s->w.p), lb = lse_bytes(s->w.p);
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        s->w.st = problem_run(s->w.p, s->w.ctx, s->w.out, s->w.lse);
        if (s->w.st != FA_OK || memcmp(s->want_o, s->w.out, ob) != 0 ||
            memcmp(s->want_l, s->w.lse, lb) != 0) {
            __atomic_store_n(&s->bad, 1, __ATOMIC_RELEASE);
            break;
        }
        __atomic_fetch_add(&s->calls, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void wait_calls(const steady_arg *s, long n) {
    const struct timespec pause = {0, 200000};
    while (__atomic_load_n(&s->calls, __ATOMIC_ACQUIRE) < n &&
           !__atomic_load_n(&s->bad, __ATOMIC_ACQUIRE))
        nanosleep(&pause, NULL);
}

/* Application thread B calls on ctx steadily with a flag of its own, never set, while thread A
 * calls on the same context until its flag is set (by this thread, with B's calls going on
 * before, while and after A stops): A ends with FA_ERR_CANCELLED, every call of B gives the
 * uncancelled result. */
static void check_cancel_beside(const tcfg *ca, const tcfg *cb, fa_context *ctx) {
    problem a, b;
    problem_init(&a, ca);
    problem_init(&b, cb);
    int32_t flag_a = 0, flag_b = 0;
    a.params.cancel = &flag_a;
    b.params.cancel = &flag_b;
    const size_t oa = out_bytes(&a), la = lse_bytes(&a), ob = out_bytes(&b), lb = lse_bytes(&b);
    unsigned char *ao = malloc(oa), *al = malloc(la), *bo = malloc(ob), *bl = malloc(lb);
    unsigned char *want_o = malloc(ob), *want_l = malloc(lb);
    if (!ao || !al || !bo || !bl || !want_o || !want_l)
        abort();
    CHECK_EQ_INT(problem_run(&b, ctx, want_o, want_l), FA_OK);
    worker_arg wa = {&a, ctx, ao, al, FA_OK, 1 << 30};
    steady_arg sb = {{&b, ctx, bo, bl, FA_OK, 0}, want_o, want_l, 0, 0, 0};
    pthread_t ta, tb;
    REQUIRE(pthread_create(&tb, NULL, run_steadily, &sb) == 0);
    REQUIRE(pthread_create(&ta, NULL, run_until_error, &wa) == 0);
    wait_calls(&sb, 5);
    __atomic_store_n(&flag_a, 1, __ATOMIC_RELAXED);
    pthread_join(ta, NULL);
    wait_calls(&sb, __atomic_load_n(&sb.calls, __ATOMIC_ACQUIRE) + 5);
    __atomic_store_n(&sb.stop, 1, __ATOMIC_RELEASE);
    pthread_join(tb, NULL);
    CHECK_MSG(wa.st == FA_ERR_CANCELLED, "A: %s", fa_status_name(wa.st));
    CHECK_MSG(!sb.bad, "B beside a cancelled A, call %ld: status %s or result differs", sb.calls,
              fa_status_name(sb.w.st));
    unsigned char *bufs[] = {ao, al, bo, bl, want_o, want_l};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    problem_free(&a);
    problem_free(&b);
}

/* Runs problem c `reps` times on a fresh context of `threads` threads created with FA_SPIN_US set
 * to `spin`; every run must give bitwise the result on ref (1 thread). Stops at the first
 * difference. */
static void check_spin_pool(const tcfg *c, fa_context *ref, int threads, const char *spin,
                            int reps) {
    problem p;
    problem_init(&p, c);
    const size_t ob = out_bytes(&p), lb = lse_bytes(&p);
    unsigned char *o1 = malloc(ob), *l1 = malloc(lb), *on = malloc(ob), *ln = malloc(lb);
    if (!o1 || !l1 || !on || !ln)
        abort();
    CHECK_EQ_INT(problem_run(&p, ref, o1, l1), FA_OK);
    setenv("FA_SPIN_US", spin, 1);
    fa_context_options o;
    fa_context_options_init(&o);
    o.num_threads = threads;
    fa_context *ctx = NULL;
    CHECK_EQ_INT(fa_context_create(&o, &ctx), FA_OK);
    unsetenv("FA_SPIN_US");
    int bad = 0;
    for (int rep = 0; ctx && rep < reps && !bad; rep++) {
        const fa_status st = problem_run(&p, ctx, on, ln);
        bad = st != FA_OK || memcmp(o1, on, ob) != 0 || memcmp(l1, ln, lb) != 0;
        CHECK_MSG(!bad, "call %d: status %s or result differs from 1 thread", rep,
                  fa_status_name(st));
    }
    fa_context_destroy(ctx);
    free(o1);
    free(l1);
    free(on);
    free(ln);
    problem_free(&p);
}

static const tcfg k_cfgs[] = {
    {"fp32 plain", 0, 2, 130, 130, 4, 2, 64, 0, -1, -1, 0, 0.0f, FA_DTYPE_F32, 0.0f},
    {"bf16 causal GQA 8/2 + ALiBi", 0, 1, 200, 260, 8, 2, 64, 1, -1, -1, 1, 0.0f, FA_DTYPE_BF16,
     0.0f},
    {"fp16 causal window softcap", 0, 2, 97, 150, 2, 1, 80, 1, 20, -1, 0, 5.0f, FA_DTYPE_F16, 0.0f},
    {"fp32 decode Sq=1 Sk=700", 0, 2, 1, 700, 8, 1, 128, 0, -1, -1, 0, 0.0f, FA_DTYPE_F32, 0.0f},
    {"bf16 split-KV decode Sk=3500 GQA 4", 0, 2, 1, 3500, 8, 2, 64, 0, -1, -1, 1, 0.0f,
     FA_DTYPE_BF16, 0.0f},
    {"fp32 varlen split-KV decode", 1, 4, 2, 2600, 4, 1, 32, 1, -1, -1, 0, 0.0f, FA_DTYPE_F32,
     0.2f},
    {"fp32 varlen causal GQA", 1, 6, 90, 120, 4, 2, 32, 1, -1, -1, 1, 0.0f, FA_DTYPE_F32, 0.0f},
    {"bf16 varlen window", 1, 5, 150, 150, 2, 2, 64, 0, 16, 8, 0, 0.0f, FA_DTYPE_BF16, 0.0f},
    {"fp32 dropout 0.3 causal", 0, 2, 140, 140, 4, 2, 64, 1, -1, -1, 0, 0.0f, FA_DTYPE_F32, 0.3f},
    {"fp16 varlen dropout 0.5", 1, 5, 100, 130, 4, 1, 32, 0, -1, -1, 1, 0.0f, FA_DTYPE_F16, 0.5f},
};

int main(void) {
    tu_seed_init("test_threads");

    /* ---- context API ---- */
    long f0 = test_state_g_.cases_failed, c0 = test_state_g_.cases_passed + f0;
    fa_context *ctx[4] = {NULL, NULL, NULL, NULL};
    for (int n = 1; n <= 3; n++) {
        CASE_BEGIN("context with %d threads", n);
        fa_context_options o;
        fa_context_options_init(&o);
        CHECK_EQ_INT(o.struct_size, sizeof o);
        CHECK_EQ_INT(o.num_threads, 0);
        o.num_threads = n;
        fa_status st = fa_context_create(&o, &ctx[n]);
        CHECK_MSG(st == FA_OK && ctx[n] != NULL, "fa_context_create(%d) -> %s: %s", n,
                  fa_status_name(st), fa_last_error_message());
        if (ctx[n])
            CHECK_EQ_INT(fa_context_num_threads(ctx[n]), n);
        CASE_END();
    }
    CASE_BEGIN("default context");
    int32_t ndef = fa_context_num_threads(NULL);
    CHECK(ndef >= 1);
    CHECK_EQ_INT(fa_context_num_threads(NULL), ndef); /* created once */
    fa_context *dflt = NULL;
    CHECK_EQ_INT(fa_context_create(NULL, &dflt), FA_OK); /* opts NULL = defaults */
    if (dflt) {
        CHECK(fa_context_num_threads(dflt) >= 1);
        fa_context_destroy(dflt);
    }
    fa_context_destroy(NULL); /* no-op */
    CASE_END();
    printf("default context: %d threads\n", (int)ndef);
    printf("%-36s %4ld cases, %ld failed\n", "context API",
           test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
           test_state_g_.cases_failed - f0);

    /* ---- bitwise identical results on 1, 2, 3 threads, the default context, and repeats ---- */
    f0 = test_state_g_.cases_failed;
    c0 = test_state_g_.cases_passed + f0;
    for (size_t ci = 0; ci < sizeof k_cfgs / sizeof k_cfgs[0]; ci++) {
        const tcfg *c = &k_cfgs[ci];
        CASE_BEGIN("determinism: %s", c->name);
        problem p;
        problem_init(&p, c);
        const size_t ob = out_bytes(&p), lb = lse_bytes(&p);
        unsigned char *out1 = malloc(ob), *lse1 = malloc(lb), *outn = malloc(ob),
                      *lsen = malloc(lb);
        if (!out1 || !lse1 || !outn || !lsen)
            abort();
        fa_status st = problem_run(&p, ctx[1], out1, lse1);
        CHECK_MSG(st == FA_OK, "1 thread: %s: %s", fa_status_name(st), fa_last_error_message());
        /* sanity: every element written (no NaN left from the poison) */
        int64_t nan_count = 0;
        tu_tensor chk = p.out;
        chk.buf = out1;
        chk.t.data = out1;
        for (int64_t f = 0; f < chk.numel; f++)
            nan_count += isnan(tu_load(out1, c->dtype, tu_offset(&chk.t, f)));
        CHECK_MSG(nan_count == 0, "%lld NaN in out", (long long)nan_count);
        for (int run = 0; run < 5; run++) {
            fa_context *cx = run < 2 ? ctx[2] : run == 2 ? ctx[3] : run == 3 ? NULL : ctx[1];
            const char *what = run < 2    ? "2 threads"
                               : run == 2 ? "3 threads"
                               : run == 3 ? "default context"
                                          : "1 thread again";
            st = problem_run(&p, cx, outn, lsen);
            CHECK_MSG(st == FA_OK, "%s: %s: %s", what, fa_status_name(st), fa_last_error_message());
            CHECK_MSG(memcmp(out1, outn, ob) == 0, "out on %s differs bitwise from 1 thread", what);
            CHECK_MSG(memcmp(lse1, lsen, lb) == 0, "lse on %s differs bitwise from 1 thread", what);
        }
        /* two application threads sharing one context (calls are serialized) */
        worker_arg w[2];
        pthread_t th[2];
        unsigned char *wo[2], *wl[2];
        for (int t = 0; t < 2; t++) {
            wo[t] = malloc(ob);
            wl[t] = malloc(lb);
            if (!wo[t] || !wl[t])
                abort();
            w[t].p = &p;
            w[t].ctx = ctx[2];
            w[t].out = wo[t];
            w[t].lse = wl[t];
            w[t].st = FA_ERR_INTERNAL;
            w[t].reps = 3;
        }
        for (int t = 0; t < 2; t++)
            CHECK(pthread_create(&th[t], NULL, worker, &w[t]) == 0);
        for (int t = 0; t < 2; t++) {
            pthread_join(th[t], NULL);
            CHECK_MSG(w[t].st == FA_OK, "shared context, app thread %d: %s", t,
                      fa_status_name(w[t].st));
            CHECK_MSG(memcmp(out1, wo[t], ob) == 0 && memcmp(lse1, wl[t], lb) == 0,
                      "shared context, app thread %d: result differs", t);
        }
        /* and two application threads on the default context */
        for (int t = 0; t < 2; t++) {
            w[t].ctx = NULL;
            CHECK(pthread_create(&th[t], NULL, worker, &w[t]) == 0);
        }
        for (int t = 0; t < 2; t++) {
            pthread_join(th[t], NULL);
            CHECK_MSG(w[t].st == FA_OK && memcmp(out1, wo[t], ob) == 0 &&
                          memcmp(lse1, wl[t], lb) == 0,
                      "default context, app thread %d: status %s or result differs", t,
                      fa_status_name(w[t].st));
            free(wo[t]);
            free(wl[t]);
        }
        free(out1);
        free(lse1);
        free(outn);
        free(lsen);
        problem_free(&p);
        CASE_END();
    }
    printf("%-36s %4ld cases, %ld failed\n", "bitwise determinism (1/2/3/default)",
           test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
           test_state_g_.cases_failed - f0);

    /* ---- FA_NUM_THREADS for num_threads = 0 ---- */
    f0 = test_state_g_.cases_failed;
    c0 = test_state_g_.cases_passed + f0;
    CASE_BEGIN("FA_NUM_THREADS sets the count for num_threads = 0");
    setenv("FA_NUM_THREADS", "3", 1);
    fa_context *e = NULL;
    fa_context_options o;
    fa_context_options_init(&o);
    fa_status st = fa_context_create(&o, &e);
    CHECK_EQ_INT(st, FA_OK);
    if (e) {
        CHECK_EQ_INT(fa_context_num_threads(e), 3);
        fa_context_destroy(e);
    }
    e = NULL;
    o.num_threads = 2; /* an explicit count wins over the variable */
    CHECK_EQ_INT(fa_context_create(&o, &e), FA_OK);
    if (e) {
        CHECK_EQ_INT(fa_context_num_threads(e), 2);
        fa_context_destroy(e);
    }
    unsetenv("FA_NUM_THREADS");
    CASE_END();
    /* FA_SPIN_US: threads that never poll (0) or poll long give the same bits */
    static const char *spins[] = {"0", "100000"};
    for (int si = 0; si < 2; si++) {
        CASE_BEGIN("FA_SPIN_US=%s: 3 threads, bitwise equal", spins[si]);
        check_spin_pool(&k_cfgs[0], ctx[1], 3, spins[si], 3);
        CASE_END();
    }
    printf("%-36s %4ld cases, %ld failed\n", "FA_NUM_THREADS, FA_SPIN_US",
           test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
           test_state_g_.cases_failed - f0);

    /* ---- many short calls: batches that end before (or just as) workers wake up ---- */
    f0 = test_state_g_.cases_failed;
    c0 = test_state_g_.cases_passed + f0;
    static const tcfg shorts[] = {
        {"decode Sk=1", 0, 1, 1, 1, 8, 2, 64, 0, -1, -1, 0, 0.0f, FA_DTYPE_F16, 0.0f},
        {"decode Sk=40 GQA 4", 0, 1, 1, 40, 8, 2, 64, 0, -1, -1, 0, 0.0f, FA_DTYPE_BF16, 0.0f},
        {"split decode Sk=1100", 0, 2, 1, 1100, 4, 4, 32, 0, -1, -1, 0, 0.0f, FA_DTYPE_F32,
         0.0f},
        {"prefill 9 x 9", 0, 1, 9, 9, 2, 1, 16, 1, -1, -1, 0, 0.0f, FA_DTYPE_F32, 0.0f},
    };
    static const struct {
        int threads;
        const char *spin;
    } pools[] = {{2, "0"}, {2, "50"}, {3, "5"}, {8, "50"}};
    for (size_t ci = 0; ci < sizeof shorts / sizeof shorts[0]; ci++)
        for (size_t pi = 0; pi < sizeof pools / sizeof pools[0]; pi++) {
            CASE_BEGIN("%s: 500 calls on %d threads, FA_SPIN_US=%s", shorts[ci].name,
                       pools[pi].threads, pools[pi].spin);
            check_spin_pool(&shorts[ci], ctx[1], pools[pi].threads, pools[pi].spin, 500);
            CASE_END();
        }
    printf("%-36s %4ld cases, %ld failed\n", "many short calls, bitwise",
           test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
           test_state_g_.cases_failed - f0);

    /* ---- a call cancelled beside another application thread's calls ---- */
    f0 = test_state_g_.cases_failed;
    c0 = test_state_g_.cases_passed + f0;
    for (int n = 1; n <= 3; n++) {
        CASE_BEGIN("cancel one of two application threads on a %d-thread context", n);
        check_cancel_beside(&k_cfgs[1], &k_cfgs[2], ctx[n]);
        CASE_END();
    }
    CASE_BEGIN("cancel one of two application threads on the default context");
    check_cancel_beside(&k_cfgs[6], &k_cfgs[5], NULL);
    CASE_END();
    printf("%-36s %4ld cases, %ld failed\n", "cancel beside another thread",
           test_state_g_.cases_passed + test_state_g_.cases_failed - c0,
           test_state_g_.cases_failed - f0);

    for (int n = 1; n <= 3; n++)
        fa_context_destroy(ctx[n]);
    return TEST_REPORT();
}
