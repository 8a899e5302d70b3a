/* SPDX-License-Identifier: MIT */
/*
 * test_cancel.c — params.cancel and FA_ERR_CANCELLED, and the default context's errors.
 *
 * For each entry point (fa_forward, fa_varlen_forward, fa_backward, fa_varlen_backward,
 * fa_forward_kvcache) a call long enough to time (its length doubled until an uncancelled call
 * takes CALL_SECONDS) is, with one long sequence (the forward) and with BATCH sequences (every
 * entry point: many tasks even under the sanitizers' slowdown, and the backward's schedule of
 * one task per (batch, KV head)),
 *  - started with the flag already set: FA_ERR_CANCELLED, and every output (the cache too)
 *    still holds its poison;
 *  - cancelled from another thread at a tenth of its uncancelled time: FA_ERR_CANCELLED well
 *    before the uncancelled time (under half of it: the margin is 0.4 of the call, so a loaded
 *    machine does not make it flaky); the time from the flag to the return is printed;
 *  - run again on the same context: bitwise the uncancelled result.
 * Then a small forward on the contexts used matches the fp64 reference. Run under ASan/UBSan
 * and TSan (nothing leaks, no race on the flag or the pool). A malformed FA_NUM_THREADS or
 * FA_SPIN_US makes calls on the default context fail with FA_ERR_VALUE naming the variable and
 * its value (checked in a child process, before any default context exists).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, clock_gettime, nanosleep */

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attention_ref.h"
#include "flashattn.h"
#include "test.h"
#include "testutil.h"

enum { FWD, VARLEN_FWD, BWD, VARLEN_BWD, KVCACHE, N_KINDS };
static const char *const k_kind_names[] = {"fa_forward", "fa_varlen_forward", "fa_backward",
                                           "fa_varlen_backward", "fa_forward_kvcache"};

/* An uncancelled call of at least this long is what gets cancelled. */
#define CALL_SECONDS 0.3
#define S_START 64
#define S_MAX 65536

/* Under ASan or TSan calls are 10-100x slower, so a call of CALL_SECONDS is a short one. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { H = 2, HK = 1, D = 64, BATCH = 32 };

/* One long call: q (B, Sq, H, D), k and v (B, S, Hk, D), fp32; varlen: B sequences of those
 * lengths. */
typedef struct job {
    int kind;
    int64_t B, S, Sq;
    fa_context *ctx;
    fa_params params;
    int32_t flag;
    tu_tensor q, k, v, out, lse, dout, dq, dk, dv;
    int32_t cuq[BATCH + 1], cuk[BATCH + 1], seqlens[BATCH];
    fa_tensor tcuq, tcuk, tseqlens;
    fa_kvcache kv;
} job;

static void fill(tu_tensor *x) {
    double *tmp = malloc(sizeof(double) * (size_t)(x->numel + 1));
    if (!tmp)
        abort();
    tu_fill_normal(x, 1.0, tmp);
    free(tmp);
}

static int varlen(const job *j) { return j->kind == VARLEN_FWD || j->kind == VARLEN_BWD; }
static int backward(const job *j) { return j->kind == BWD || j->kind == VARLEN_BWD; }

/* The tensors the call writes. */
static int outputs(job *j, tu_tensor **o) {
    if (backward(j)) {
        o[0] = &j->dq, o[1] = &j->dk, o[2] = &j->dv;
        return 3;
    }
    o[0] = &j->out, o[1] = &j->lse;
    return 2;
}

static fa_status job_call(job *j) {
    const fa_params *pp = &j->params;
    switch (j->kind) {
    case FWD:
        return fa_forward(j->ctx, pp, &j->q.t, &j->k.t, &j->v.t, &j->out.t, &j->lse.t);
    case VARLEN_FWD:
        return fa_varlen_forward(j->ctx, pp, &j->q.t, &j->k.t, &j->v.t, &j->tcuq, &j->tcuk, j->Sq,
                                 j->S, &j->out.t, &j->lse.t);
    case BWD:
        return fa_backward(j->ctx, pp, &j->q.t, &j->k.t, &j->v.t, &j->out.t, &j->dout.t, &j->lse.t,
                           &j->dq.t, &j->dk.t, &j->dv.t);
    case VARLEN_BWD:
        return fa_varlen_backward(j->ctx, pp, &j->q.t, &j->k.t, &j->v.t, &j->out.t, &j->dout.t,
                                  &j->lse.t, &j->tcuq, &j->tcuk, j->Sq, j->S, &j->dq.t, &j->dk.t,
                                  &j->dv.t);
    default:
        return fa_forward_kvcache(j->ctx, pp, &j->q.t, &j->kv, &j->out.t, &j->lse.t);
    }
}

static void job_free(job *j) {
    tu_tensor *all[] = {&j->q, &j->k, &j->v, &j->out, &j->lse, &j->dout, &j->dq, &j->dk, &j->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tu_free(all[i]);
}

/* B batches of length S (the kv cache: Sq = S/4 new tokens appended after S - Sq cached ones);
 * a backward's out and lse come from an uncancelled forward. */
static void job_init(job *j, int kind, int64_t B, int64_t S, fa_context *ctx) {
    memset(j, 0, sizeof *j);
    j->kind = kind, j->B = B, j->S = S, j->Sq = kind == KVCACHE ? S / 4 : S, j->ctx = ctx;
    fa_params_init(&j->params);
    j->params.cancel = &j->flag;
    const int vl = varlen(j);
    const int64_t qs4[4] = {B, j->Sq, H, D}, ks4[4] = {B, S, HK, D}, ls3[3] = {B, H, j->Sq};
    const int64_t qs3[3] = {B * j->Sq, H, D}, ks3[3] = {B * S, HK, D}, ls2[2] = {H, B * j->Sq};
    const int nd = vl ? 3 : 4;
    const int64_t *qs = vl ? qs3 : qs4, *ks = vl ? ks3 : ks4, *ls = vl ? ls2 : ls3;
    tu_alloc(&j->q, FA_DTYPE_F32, nd, qs, TU_CONTIG);
    tu_alloc(&j->k, FA_DTYPE_F32, nd, ks, TU_CONTIG);
    tu_alloc(&j->v, FA_DTYPE_F32, nd, ks, TU_CONTIG);
    tu_alloc(&j->out, FA_DTYPE_F32, nd, qs, TU_CONTIG);
    tu_alloc(&j->lse, FA_DTYPE_F32, nd - 1, ls, TU_CONTIG);
    fill(&j->q);
    fill(&j->k);
    fill(&j->v);
    for (int64_t b = 0; b < B; b++) {
        j->cuq[b + 1] = (int32_t)((b + 1) * j->Sq), j->cuk[b + 1] = (int32_t)((b + 1) * S);
        j->seqlens[b] = (int32_t)(S - j->Sq);
    }
    const int64_t nb = B + 1;
    j->tcuq = fa_tensor_contiguous(j->cuq, FA_DTYPE_I32, 1, &nb);
    j->tcuk = fa_tensor_contiguous(j->cuk, FA_DTYPE_I32, 1, &nb);
    if (kind == KVCACHE) { /* k, v are the cache; the new tokens are dk, dv's buffers */
        const int64_t ns[4] = {B, j->Sq, HK, D};
        tu_alloc(&j->dk, FA_DTYPE_F32, 4, ns, TU_CONTIG);
        tu_alloc(&j->dv, FA_DTYPE_F32, 4, ns, TU_CONTIG);
        fill(&j->dk);
        fill(&j->dv);
        j->tseqlens = fa_tensor_contiguous(j->seqlens, FA_DTYPE_I32, 1, &B);
        fa_kvcache_init(&j->kv);
        j->kv.k_cache = j->k.t, j->kv.v_cache = j->v.t;
        j->kv.k_new = j->dk.t, j->kv.v_new = j->dv.t;
        j->kv.cache_seqlens = j->tseqlens;
    }
    if (!backward(j))
        return;
    tu_alloc(&j->dout, FA_DTYPE_F32, nd, qs, TU_CONTIG);
    tu_alloc(&j->dq, FA_DTYPE_F32, nd, qs, TU_CONTIG);
    tu_alloc(&j->dk, FA_DTYPE_F32, nd, ks, TU_CONTIG);
    tu_alloc(&j->dv, FA_DTYPE_F32, nd, ks, TU_CONTIG);
    fill(&j->dout);
    const fa_status st =
        vl ? fa_varlen_forward(ctx, &j->params, &j->q.t, &j->k.t, &j->v.t, &j->tcuq, &j->tcuk,
                               j->Sq, S, &j->out.t, &j->lse.t)
           : fa_forward(ctx, &j->params, &j->q.t, &j->k.t, &j->v.t, &j->out.t, &j->lse.t);
    CHECK_MSG(st == FA_OK, "forward for the backward: %s: %s", fa_status_name(st),
              fa_last_error_message());
}

/* Poisons the outputs, runs the call and returns its status and wall time. */
static fa_status timed_call(job *j, double *seconds) {
    tu_tensor *o[3];
    for (int i = 0, n = outputs(j, o); i < n; i++)
        tu_poison(o[i]);
    const double t0 = now_s();
    const fa_status st = job_call(j);
    *seconds = now_s() - t0;
    return st;
}

/* A copy of the outputs' bytes (free it). */
static unsigned char *snapshot(job *j, size_t *bytes) {
    tu_tensor *o[3];
    const int n = outputs(j, o);
    *bytes = 0;
    for (int i = 0; i < n; i++)
        *bytes += (size_t)o[i]->nbuf * 4;
    unsigned char *s = malloc(*bytes), *at = s;
    if (!s)
        abort();
    for (int i = 0; i < n; i++) {
        memcpy(at, o[i]->buf, (size_t)o[i]->nbuf * 4);
        at += (size_t)o[i]->nbuf * 4;
    }
    return s;
}

/* Whether every output byte still holds the poison (0xFF). */
static int untouched(job *j) {
    tu_tensor *o[3];
    for (int i = 0, n = outputs(j, o); i < n; i++)
        for (int64_t b = 0; b < o[i]->nbuf * 4; b++)
            if (((const unsigned char *)o[i]->buf)[b] != 0xFF)
                return 0;
    return 1;
}

typedef struct canceller {
    int32_t *flag;
    double delay, set_at;
} canceller;

static void *cancel_later(void *arg) {
    canceller *c = arg;
    const struct timespec d = {(time_t)c->delay,
                               (long)((c->delay - (double)(time_t)c->delay) * 1e9)};
    nanosleep(&d, NULL);
    c->set_at = now_s();
    __atomic_store_n(c->flag, 1, __ATOMIC_RELAXED);
    return NULL;
}

/* The worst time from setting the flag to the call's return, over every case (reported). */
static double g_worst_latency, g_worst_fraction;

static void check_kind(int kind, int64_t B, int64_t min_S, fa_context *ctx, const char *ctx_name) {
    CASE_BEGIN("%s, %lld batches, on %s: cancelled before and while it runs", k_kind_names[kind],
               (long long)B, ctx_name);
    job j;
    double full = 0.0;
    fa_status st = FA_OK;
    for (int64_t S = min_S;; S *= 2) { /* long enough to time */
        job_init(&j, kind, B, S, ctx);
        st = timed_call(&j, &full);
        if (st != FA_OK || full >= CALL_SECONDS || S >= S_MAX)
            break;
        job_free(&j);
    }
    CHECK_MSG(st == FA_OK, "uncancelled: %s: %s", fa_status_name(st), fa_last_error_message());
    size_t bytes;
    unsigned char *want = snapshot(&j, &bytes);

    /* the flag already set: nothing computed, nothing written (the cache's new rows included) */
    const int64_t new_at = (j.S - j.Sq) * HK * D, new_n = j.Sq * HK * D, row = j.S * HK * D;
    for (int64_t b = 0; kind == KVCACHE && b < B; b++) {
        memset((float *)j.k.buf + b * row + new_at, 0xFF, (size_t)new_n * 4);
        memset((float *)j.v.buf + b * row + new_at, 0xFF, (size_t)new_n * 4);
    }
    j.flag = 1;
    double t_pre;
    st = timed_call(&j, &t_pre);
    CHECK_MSG(st == FA_ERR_CANCELLED, "flag set before: %s", fa_status_name(st));
    CHECK_MSG(tu_contains_word(fa_last_error_message(), "params.cancel"), "message \"%s\"",
              fa_last_error_message());
    CHECK_MSG(untouched(&j), "flag set before: an output was written");
    if (kind == KVCACHE) {
        int cache_ok = 1;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < new_n * 4; i++)
                cache_ok &= ((unsigned char *)j.k.buf)[(b * row + new_at) * 4 + i] == 0xFF &&
                            ((unsigned char *)j.v.buf)[(b * row + new_at) * 4 + i] == 0xFF;
        CHECK_MSG(cache_ok, "flag set before: the cache was written");
    }

    /* set from another thread at a tenth of the uncancelled time */
    j.flag = 0;
    canceller c = {&j.flag, 0.1 * full, 0.0};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, cancel_later, &c) == 0);
    double t_cancel;
    st = timed_call(&j, &t_cancel);
    const double returned = now_s();
    pthread_join(th, NULL);
    CHECK_MSG(st == FA_ERR_CANCELLED, "cancelled while running: %s", fa_status_name(st));
    CHECK_MSG(t_cancel < 0.5 * full, "cancelled call took %.3f s, uncancelled %.3f s", t_cancel,
              full);
    const double latency = returned - c.set_at;
    printf("  %-18s %-9s B=%-2lld S=%-5lld uncancelled %.3f s; flag set at %.3f s, returned "
           "%.1f ms later (%.1f%% of the call); flag set before: returned in %.3f ms\n",
           k_kind_names[kind], ctx_name, (long long)B, (long long)j.S, full, c.delay, 1e3 * latency,
           100.0 * latency / full, 1e3 * t_pre);
    g_worst_latency = latency > g_worst_latency ? latency : g_worst_latency;
    g_worst_fraction = latency / full > g_worst_fraction ? latency / full : g_worst_fraction;

    /* the context works as before: the same bits */
    j.flag = 0;
    double t_again;
    st = timed_call(&j, &t_again);
    CHECK_MSG(st == FA_OK, "after the cancel: %s: %s", fa_status_name(st), fa_last_error_message());
    size_t bytes2;
    unsigned char *got = snapshot(&j, &bytes2);
    CHECK_MSG(bytes == bytes2 && memcmp(want, got, bytes) == 0,
              "after the cancel: the result differs from the uncancelled one");
    free(want);
    free(got);
    job_free(&j);
    CASE_END();
}

/* A small forward on ctx against the fp64 reference: the context computes right after the
 * cancelled calls. */
static void check_small(fa_context *ctx, const char *ctx_name) {
    CASE_BEGIN("%s: a small forward after the cancelled calls matches the reference", ctx_name);
    enum { B = 2, SQ = 77, SK = 93, SH = 4, SHK = 2, SD = 40 };
    const int64_t qs[4] = {B, SQ, SH, SD}, ks[4] = {B, SK, SHK, SD}, ls[3] = {B, SH, SQ};
    tu_tensor q, k, v, out, lse;
    tu_alloc(&q, FA_DTYPE_F32, 4, qs, TU_CONTIG);
    tu_alloc(&k, FA_DTYPE_F32, 4, ks, TU_PERMUTED);
    tu_alloc(&v, FA_DTYPE_F32, 4, ks, TU_CONTIG);
    tu_alloc(&out, FA_DTYPE_F32, 4, qs, TU_CONTIG);
    tu_alloc(&lse, FA_DTYPE_F32, 3, ls, TU_CONTIG);
    double *dq = malloc(sizeof(double) * B * SQ * SH * SD),
           *dk = malloc(sizeof(double) * B * SK * SHK * SD);
    double *dv = malloc(sizeof(double) * B * SK * SHK * SD),
           *ref = malloc(sizeof(double) * B * SQ * SH * SD);
    double *lref = malloc(sizeof(double) * B * SH * SQ),
           *o = malloc(sizeof(double) * B * SQ * SH * SD);
    double *l = malloc(sizeof(double) * B * SH * SQ);
    if (!dq || !dk || !dv || !ref || !lref || !o || !l)
        abort();
    tu_fill_normal(&q, 1.0, dq);
    tu_fill_normal(&k, 1.0, dk);
    tu_fill_normal(&v, 1.0, dv);
    int32_t flag = 0;
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.cancel = &flag;
    const fa_status st = fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    CHECK_MSG(st == FA_OK, "%s: %s", fa_status_name(st), fa_last_error_message());
    const ref_problem rp = {.B = B,
                            .Sq = SQ,
                            .Sk = SK,
                            .H = SH,
                            .Hk = SHK,
                            .D = SD,
                            .scale = 1.0 / sqrt((double)SD),
                            .causal = 1,
                            .window_left = -1,
                            .window_right = -1};
    ref_attention_forward(&rp, dq, dk, dv, ref, lref);
    tu_gather(&out, o);
    tu_gather(&lse, l);
    tu_errstats es = {0};
    CHECK(tu_check_attention(FA_DTYPE_F32, B, SQ, SH, SD, o, ref, NULL, l, lref, NULL, NULL, &es));
    double *bufs[] = {dq, dk, dv, ref, lref, o, l};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    tu_tensor *ts[] = {&q, &k, &v, &out, &lse};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        tu_free(ts[i]);
    CASE_END();
}

/* Callers built against earlier headers pass a shorter fa_params: those sizes are accepted, and
 * the bytes past them (here a set flag) are not read. */
static void check_earlier_struct_sizes(void) {
    CASE_BEGIN("params.struct_size of earlier releases: accepted, cancel not read");
    float x[2 * 3 * 2 * 8], o[2 * 3 * 2 * 8], l[2 * 2 * 3];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = (float)tu_normal();
    const int64_t s4[4] = {2, 3, 2, 8}, s3[3] = {2, 2, 3};
    const fa_tensor t = fa_tensor_contiguous(x, FA_DTYPE_F32, 4, s4);
    const fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, s4);
    const fa_tensor tl = fa_tensor_contiguous(l, FA_DTYPE_F32, 3, s3);
    int32_t flag = 1;
    fa_params p;
    fa_params_init(&p);
    CHECK_EQ_INT(p.struct_size, sizeof p);
    CHECK(p.cancel == NULL);
    p.cancel = &flag;
    CHECK_EQ_INT(fa_forward(NULL, &p, &t, &t, &t, &to, &tl), FA_ERR_CANCELLED);
    const uint32_t sizes[2] = {offsetof(fa_params, cancel), offsetof(fa_params, cuda_stream)};
    for (int i = 0; i < 2; i++) {
        p.struct_size = sizes[i];
        const fa_status st = fa_forward(NULL, &p, &t, &t, &t, &to, &tl);
        CHECK_MSG(st == FA_OK, "struct_size %u: %s: %s", sizes[i], fa_status_name(st),
                  fa_last_error_message());
    }
    CASE_END();
}

/* In a child process (no default context yet): with `var` set to `value`, every call on the
 * default context fails with FA_ERR_VALUE naming the variable and its value. Returns the
 * number of failed checks (the child's exit status). */
static int default_context_child(const char *var, const char *value) {
    setenv(var, value, 1);
    float x[4] = {1, 2, 3, 4}, o[4], l[1], dq[4], dk[4], dv[4];
    const int64_t s4[4] = {1, 1, 1, 4}, s3[3] = {1, 1, 1};
    const fa_tensor t = fa_tensor_contiguous(x, FA_DTYPE_F32, 4, s4);
    const fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, s4);
    const fa_tensor tl = fa_tensor_contiguous(l, FA_DTYPE_F32, 3, s3);
    const fa_tensor tdq = fa_tensor_contiguous(dq, FA_DTYPE_F32, 4, s4);
    const fa_tensor tdk = fa_tensor_contiguous(dk, FA_DTYPE_F32, 4, s4);
    const fa_tensor tdv = fa_tensor_contiguous(dv, FA_DTYPE_F32, 4, s4);
    fa_kvcache kv;
    fa_kvcache_init(&kv);
    kv.k_cache = t, kv.v_cache = t;
    char want[64];
    snprintf(want, sizeof want, "\"%s\"", value);
    int bad = 0;
    for (int call = 0; call < 3; call++) {
        const fa_status st =
            call == 0   ? fa_forward(NULL, NULL, &t, &t, &t, &to, &tl)
            : call == 1 ? fa_backward(NULL, NULL, &t, &t, &t, &t, &t, &tl, &tdq, &tdk, &tdv)
                        : fa_forward_kvcache(NULL, NULL, &t, &kv, &to, &tl);
        const char *msg = fa_last_error_message();
        const int ok = st == FA_ERR_VALUE && tu_contains_word(msg, var) && strstr(msg, want);
        if (!ok)
            printf("  %s=%s: call %d: %s: %s\n", var, value, call, fa_status_name(st), msg);
        bad += !ok;
    }
    return bad;
}

static void check_default_context_env(const char *var, const char *value) {
    CASE_BEGIN("default context with %s=\"%s\": FA_ERR_VALUE naming it", var, value);
    fflush(stdout);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        const int bad = default_context_child(var, value);
        fflush(stdout);
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    CASE_END();
}

int main(void) {
    tu_seed_init("test_cancel");
    /* first, while no thread runs: fork is safe */
    check_default_context_env("FA_NUM_THREADS", "abc");
    check_default_context_env("FA_NUM_THREADS", "0");
    check_default_context_env("FA_SPIN_US", "-5");

    check_earlier_struct_sizes();

    CASE_BEGIN("FA_ERR_CANCELLED has a name and a text");
    CHECK(strcmp(fa_status_name(FA_ERR_CANCELLED), "FA_ERR_CANCELLED") == 0);
    CHECK(strstr(fa_strerror(FA_ERR_CANCELLED), "cancel") != NULL);
    CASE_END();

    fa_context *ctx[2] = {NULL, NULL};
    const int threads[2] = {1, 2};
    for (int c = 0; c < 2; c++) {
        fa_context_options o;
        fa_context_options_init(&o);
        o.num_threads = threads[c];
        CHECK_EQ_INT(fa_context_create(&o, &ctx[c]), FA_OK);
    }
    if (ctx[0] && ctx[1]) {
        /* one long sequence */
        check_kind(FWD, 1, S_START, ctx[0], "1 thread");
        check_kind(FWD, 1, S_START, ctx[1], "2 threads");
        check_kind(FWD, 1, S_START, NULL, "default");
        /* the backward with one (batch, KV head): on 2 threads tasks of 512 keys (dK, dV)
         * and of 252 queries (dQ); on 1 thread one task, which stops between its query blocks */
        check_kind(BWD, 1, S_START, ctx[0], "1 thread");
        check_kind(BWD, 1, S_START, ctx[1], "2 threads");
        for (int kind = 0; kind < N_KINDS; kind++)
            check_kind(kind, BATCH, S_START, ctx[1], "2 threads");
        check_small(ctx[0], "1 thread");
        check_small(ctx[1], "2 threads");
        check_small(NULL, "default context");
        printf("test_cancel: worst time from the flag to the return: %.1f ms (%.1f%% of the "
               "uncancelled call)\n",
               1e3 * g_worst_latency, 100.0 * g_worst_fraction);
    }
    fa_context_destroy(ctx[0]);
    fa_context_destroy(ctx[1]);
    return TEST_REPORT();
}
