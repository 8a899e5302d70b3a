/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_errors.c — CUDA tensors and the fa_device_* helpers when the CUDA plug-in cannot be
 * loaded. Runs on every machine: before the first library call it points FA_CUDA_PLUGIN at a
 * file that does not exist (the plug-in is looked for once per process, on first use), so the
 * plug-in is missing whatever is installed.
 *
 * Checked:
 *  - fa_device_count(FA_DEVICE_CUDA) is FA_ERR_DEVICE with a message naming that path (and
 *    stays so on a second call); FA_DEVICE_CPU gives 1;
 *  - fa_device_alloc/free/copy with CUDA fail with FA_ERR_DEVICE and leave *ptr and host
 *    memory alone; on the CPU they work; their argument errors (NULL, bytes == 0, device 7);
 *  - fa_forward, fa_varlen_forward, fa_dropout_mask with CUDA tensors (fake device pointers,
 *    never dereferenced) are FA_ERR_DEVICE with a message naming the path; a CPU output next to
 *    CUDA inputs stays poisoned;
 *  - argument errors on CUDA tensors (rank, dtype, shape, stride, values, mixed devices) are
 *    reported as on the CPU, before the plug-in is needed;
 *  - fa_build_info() mentions CUDA and why the plug-in is not loaded; the CPU still works.
 * Every failing call must leave every buffer (host outputs poisoned with 0xA5) unchanged.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashattn.h"
#include "test.h"
#include "testutil.h"

static char g_path[256]; /* FA_CUDA_PLUGIN: a file that does not exist */

/* Fake device addresses: never dereferenced (the plug-in is missing), distinct and far apart so
 * no overlap check fires. */
#define FAKE_DEV(i) ((void *)(uintptr_t)(0x7f0000000000ull + (uint64_t)(i) * 0x100000ull))

static int contains_ci(const char *s, const char *sub) {
    size_t n = strlen(sub);
    for (; s && *s; s++) {
        size_t i = 0;
        while (i < n && s[i] && tolower((unsigned char)s[i]) == tolower((unsigned char)sub[i]))
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

static void check_msg_names_path(void) {
    const char *m = fa_last_error_message();
    CHECK_MSG(m && strstr(m, g_path) != NULL, "message \"%s\" does not name FA_CUDA_PLUGIN's %s",
              m ? m : "(null)", g_path);
}

/* ---------------------------------------------------------------------------------------------
 * fa_device_count / alloc / free / copy
 * ------------------------------------------------------------------------------------------- */

static void device_helpers(void) {
    void *const sentinel = (void *)(uintptr_t)0x1234;

    CASE_BEGIN("fa_device_count(CUDA) without the plug-in");
    int32_t n = -5;
    fa_status st = fa_device_count(FA_DEVICE_CUDA, &n);
    CHECK_EQ_INT(st, FA_ERR_DEVICE);
    CHECK_EQ_INT(n, -5);
    check_msg_names_path();
    /* loaded once per process: the same answer again */
    char first[1024];
    snprintf(first, sizeof first, "%s", fa_last_error_message());
    n = -5;
    CHECK_EQ_INT(fa_device_count(FA_DEVICE_CUDA, &n), FA_ERR_DEVICE);
    CHECK_EQ_INT(n, -5);
    CHECK_EQ_STR(fa_last_error_message(), first);
    CASE_END();

    CASE_BEGIN("fa_device_count(CPU) is 1");
    n = -5;
    CHECK_EQ_INT(fa_device_count(FA_DEVICE_CPU, &n), FA_OK);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_STR(fa_last_error_message(), "");
    CASE_END();

    CASE_BEGIN("fa_device_count argument errors");
    CHECK_EQ_INT(fa_device_count(FA_DEVICE_CPU, NULL), FA_ERR_NULL_POINTER);
    CHECK_MSG(tu_contains_word(fa_last_error_message(), "count"), "message \"%s\"",
              fa_last_error_message());
    CHECK_EQ_INT(fa_device_count(FA_DEVICE_CUDA, NULL), FA_ERR_NULL_POINTER);
    CHECK_MSG(tu_contains_word(fa_last_error_message(), "count"), "message \"%s\"",
              fa_last_error_message());
    n = -5;
    CHECK_EQ_INT(fa_device_count((fa_device)7, &n), FA_ERR_DEVICE);
    CHECK_EQ_INT(n, -5);
    CHECK_MSG(tu_contains_word(fa_last_error_message(), "device") ||
                  strstr(fa_last_error_message(), "7") != NULL,
              "message \"%s\" names neither the argument nor the value", fa_last_error_message());
    CHECK_EQ_INT(fa_device_count((fa_device)-1, &n), FA_ERR_DEVICE);
    CHECK_EQ_INT(n, -5);
    CASE_END();

    CASE_BEGIN("fa_device_alloc/free/copy on the CPU");
    {
        void *p = NULL;
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CPU, 0, 1000, &p), FA_OK);
        CHECK_EQ_STR(fa_last_error_message(), "");
        CHECK(p != NULL);
        if (p) {
            unsigned char src[1000], back[1000];
            for (int i = 0; i < 1000; i++)
                src[i] = (unsigned char)(i * 7 + 3);
            memset(p, 0, 1000); /* it is ordinary host memory */
            CHECK_EQ_INT(fa_device_copy(p, FA_DEVICE_CPU, src, FA_DEVICE_CPU, 0, 1000), FA_OK);
            CHECK(memcmp(p, src, 1000) == 0);
            memset(back, 0, sizeof back);
            CHECK_EQ_INT(fa_device_copy(back, FA_DEVICE_CPU, p, FA_DEVICE_CPU, 0, 999), FA_OK);
            CHECK(memcmp(back, src, 999) == 0 && back[999] == 0);
            CHECK_EQ_INT(fa_device_free(FA_DEVICE_CPU, 0, p), FA_OK);
        }
        CHECK_EQ_INT(fa_device_free(FA_DEVICE_CPU, 0, NULL), FA_OK);
    }
    CASE_END();

    CASE_BEGIN("fa_device_alloc argument errors");
    {
        void *p = sentinel;
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CPU, 0, 0, &p), FA_ERR_VALUE);
        CHECK(p == sentinel);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "bytes"), "message \"%s\"",
                  fa_last_error_message());
        /* argument errors before the plug-in is needed */
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CUDA, 0, 0, &p), FA_ERR_VALUE);
        CHECK(p == sentinel);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "bytes"), "message \"%s\"",
                  fa_last_error_message());
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CPU, 0, 64, NULL), FA_ERR_NULL_POINTER);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "ptr"), "message \"%s\"",
                  fa_last_error_message());
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CUDA, 0, 64, NULL), FA_ERR_NULL_POINTER);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "ptr"), "message \"%s\"",
                  fa_last_error_message());
        CHECK_EQ_INT(fa_device_alloc((fa_device)7, 0, 64, &p), FA_ERR_DEVICE);
        CHECK(p == sentinel);
        CHECK(fa_last_error_message()[0] != '\0');
    }
    CASE_END();

    CASE_BEGIN("fa_device_alloc(CUDA) without the plug-in");
    {
        void *p = sentinel;
        CHECK_EQ_INT(fa_device_alloc(FA_DEVICE_CUDA, 0, 64, &p), FA_ERR_DEVICE);
        CHECK(p == sentinel);
        check_msg_names_path();
    }
    CASE_END();

    CASE_BEGIN("fa_device_free(CUDA) without the plug-in");
    /* NULL is a no-op whatever the device (like free(NULL)) */
    CHECK_EQ_INT(fa_device_free(FA_DEVICE_CUDA, 0, NULL), FA_OK);
    CHECK_EQ_INT(fa_device_free(FA_DEVICE_CUDA, 0, FAKE_DEV(1)), FA_ERR_DEVICE);
    check_msg_names_path();
    CHECK_EQ_INT(fa_device_free((fa_device)7, 0, FAKE_DEV(1)), FA_ERR_DEVICE);
    CHECK(fa_last_error_message()[0] != '\0');
    CASE_END();

    CASE_BEGIN("fa_device_copy with CUDA without the plug-in");
    {
        unsigned char h[64], z[64];
        memset(h, 0xA5, sizeof h);
        memset(z, 0xA5, sizeof z);
        CHECK_EQ_INT(fa_device_copy(h, FA_DEVICE_CPU, FAKE_DEV(1), FA_DEVICE_CUDA, 0, sizeof h),
                     FA_ERR_DEVICE);
        check_msg_names_path();
        CHECK(memcmp(h, z, sizeof h) == 0);
        CHECK_EQ_INT(fa_device_copy(FAKE_DEV(1), FA_DEVICE_CUDA, h, FA_DEVICE_CPU, 0, sizeof h),
                     FA_ERR_DEVICE);
        check_msg_names_path();
        CHECK_EQ_INT(
            fa_device_copy(FAKE_DEV(2), FA_DEVICE_CUDA, FAKE_DEV(1), FA_DEVICE_CUDA, 0, sizeof h),
            FA_ERR_DEVICE);
        check_msg_names_path();
        CHECK(memcmp(h, z, sizeof h) == 0);
    }
    CASE_END();

    CASE_BEGIN("fa_device_copy argument errors");
    {
        unsigned char h[64], z[64];
        memset(h, 0xA5, sizeof h);
        memset(z, 0xA5, sizeof z);
        CHECK_EQ_INT(fa_device_copy(NULL, FA_DEVICE_CPU, z, FA_DEVICE_CPU, 0, 8),
                     FA_ERR_NULL_POINTER);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "dst"), "message \"%s\"",
                  fa_last_error_message());
        CHECK_EQ_INT(fa_device_copy(h, FA_DEVICE_CPU, NULL, FA_DEVICE_CPU, 0, 8),
                     FA_ERR_NULL_POINTER);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "src"), "message \"%s\"",
                  fa_last_error_message());
        /* NULL before the missing plug-in */
        CHECK_EQ_INT(fa_device_copy(NULL, FA_DEVICE_CUDA, z, FA_DEVICE_CPU, 0, 8),
                     FA_ERR_NULL_POINTER);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "dst"), "message \"%s\"",
                  fa_last_error_message());
        CHECK_EQ_INT(fa_device_copy(h, FA_DEVICE_CPU, NULL, FA_DEVICE_CUDA, 0, 8),
                     FA_ERR_NULL_POINTER);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "src"), "message \"%s\"",
                  fa_last_error_message());
        CHECK_EQ_INT(fa_device_copy(h, (fa_device)7, z, FA_DEVICE_CPU, 0, 8), FA_ERR_DEVICE);
        CHECK(fa_last_error_message()[0] != '\0');
        CHECK_EQ_INT(fa_device_copy(h, FA_DEVICE_CPU, z, (fa_device)7, 0, 8), FA_ERR_DEVICE);
        CHECK(memcmp(h, z, sizeof h) == 0);
    }
    CASE_END();
}

/* ---------------------------------------------------------------------------------------------
 * Attention calls with CUDA tensors
 *
 * A valid fp32 problem (fixed: B=2 Sq=3 Sk=4 H=4 Hk=2 D=8; varlen: cu_seqlens_q {0,3,5} over 6
 * rows, cu_seqlens_k {0,4,6} over 7 rows) whose tensors are all on CUDA device 0 at fake
 * addresses, with host twins (inputs random, outputs poisoned with 0xA5) for the mixed cases.
 * ------------------------------------------------------------------------------------------- */

enum { B_Q, B_K, B_V, B_OUT, B_LSE, B_SLOPES, B_CUQ, B_CUK, NB };
enum { CALL_FWD, CALL_VARLEN, CALL_KVCACHE, CALL_MASK };
#define NBYTES 4096

typedef struct env {
    int kind;
    unsigned char *host[NB], *snap[NB];
    fa_tensor ht[NB], dt[NB], t[NB];
    const fa_tensor *pt[NB];
    fa_params params;
    int64_t maxq, maxk;
} env;

static void env_init(env *e, int kind) {
    memset(e, 0, sizeof *e);
    e->kind = kind;
    for (int i = 0; i < NB; i++) {
        e->host[i] = malloc(NBYTES);
        e->snap[i] = malloc(NBYTES);
        if (!e->host[i] || !e->snap[i])
            abort();
        for (int j = 0; j < NBYTES / 4; j++)
            ((float *)e->host[i])[j] = (float)tu_normal();
    }
    memset(e->host[B_OUT], 0xA5, NBYTES);
    memset(e->host[B_LSE], 0xA5, NBYTES);
    for (int j = 0; j < NBYTES / 4; j++)
        ((float *)e->host[B_SLOPES])[j] = 0.25f;
    const int vl = kind == CALL_VARLEN;
    if (kind == CALL_MASK) {
        int64_t ms[4] = {2, 3, 5, 7};
        e->ht[B_OUT] = fa_tensor_contiguous(e->host[B_OUT], FA_DTYPE_U8, 4, ms);
    } else if (!vl) {
        int64_t qs[4] = {2, 3, 4, 8}, ks[4] = {2, 4, 2, 8}, ls[3] = {2, 4, 3};
        e->ht[B_Q] = fa_tensor_contiguous(e->host[B_Q], FA_DTYPE_F32, 4, qs);
        e->ht[B_K] = fa_tensor_contiguous(e->host[B_K], FA_DTYPE_F32, 4, ks);
        e->ht[B_V] = fa_tensor_contiguous(e->host[B_V], FA_DTYPE_F32, 4, ks);
        e->ht[B_OUT] = fa_tensor_contiguous(e->host[B_OUT], FA_DTYPE_F32, 4, qs);
        e->ht[B_LSE] = fa_tensor_contiguous(e->host[B_LSE], FA_DTYPE_F32, 3, ls);
    } else {
        int32_t *cq = (int32_t *)e->host[B_CUQ], *ck = (int32_t *)e->host[B_CUK];
        cq[0] = 0, cq[1] = 3, cq[2] = 5;
        ck[0] = 0, ck[1] = 4, ck[2] = 6;
        int64_t qs[3] = {6, 4, 8}, ks[3] = {7, 2, 8}, ls[2] = {4, 6}, cs = 3;
        e->ht[B_Q] = fa_tensor_contiguous(e->host[B_Q], FA_DTYPE_F32, 3, qs);
        e->ht[B_K] = fa_tensor_contiguous(e->host[B_K], FA_DTYPE_F32, 3, ks);
        e->ht[B_V] = fa_tensor_contiguous(e->host[B_V], FA_DTYPE_F32, 3, ks);
        e->ht[B_OUT] = fa_tensor_contiguous(e->host[B_OUT], FA_DTYPE_F32, 3, qs);
        e->ht[B_LSE] = fa_tensor_contiguous(e->host[B_LSE], FA_DTYPE_F32, 2, ls);
        e->ht[B_CUQ] = fa_tensor_contiguous(cq, FA_DTYPE_I32, 1, &cs);
        e->ht[B_CUK] = fa_tensor_contiguous(ck, FA_DTYPE_I32, 1, &cs);
        e->maxq = 3;
        e->maxk = 4;
    }
    int64_t h4 = 4;
    e->ht[B_SLOPES] = fa_tensor_contiguous(e->host[B_SLOPES], FA_DTYPE_F32, 1, &h4);
    for (int i = 0; i < NB; i++) {
        e->dt[i] = e->ht[i];
        e->dt[i].data = FAKE_DEV(i + 1);
        e->dt[i].device = FA_DEVICE_CUDA;
        e->dt[i].device_index = 0;
        e->t[i] = e->dt[i];
        e->pt[i] = &e->t[i];
    }
    e->t[B_CUQ] = e->ht[B_CUQ];
    e->t[B_CUK] = e->ht[B_CUK];
    fa_params_init(&e->params);
}

static void env_free(env *e) {
    for (int i = 0; i < NB; i++) {
        free(e->host[i]);
        free(e->snap[i]);
    }
}

static fa_status env_call(env *e) {
    const fa_tensor *const *t = e->pt;
    switch (e->kind) {
    case CALL_FWD:
        return fa_forward(NULL, &e->params, t[B_Q], t[B_K], t[B_V], t[B_OUT], t[B_LSE]);
    case CALL_VARLEN:
        return fa_varlen_forward(NULL, &e->params, t[B_Q], t[B_K], t[B_V], t[B_CUQ], t[B_CUK],
                                 e->maxq, e->maxk, t[B_OUT], t[B_LSE]);
    case CALL_KVCACHE: {
        fa_kvcache kv;
        fa_kvcache_init(&kv);
        kv.k_cache = *t[B_K];
        kv.v_cache = *t[B_V];
        return fa_forward_kvcache(NULL, &e->params, t[B_Q], &kv, t[B_OUT], t[B_LSE]);
    }
    case CALL_MASK:
        return fa_dropout_mask(&e->params, t[B_OUT]);
    }
    return FA_ERR_INTERNAL;
}

static const char *kind_name(int kind) {
    static const char *names[] = {"fa_forward", "fa_varlen_forward", "fa_forward_kvcache",
                                  "fa_dropout_mask"};
    return names[kind];
}

/* want_alt: another acceptable status (= want when none). word/word2: the message must name one
 * of them as a whole word; path: or (path != 0) it must contain FA_CUDA_PLUGIN's path. */
static void expect(env *e, const char *desc, fa_status want, fa_status want_alt, const char *word,
                   const char *word2, int path) {
    CASE_BEGIN("%s: %s", kind_name(e->kind), desc);
    for (int i = 0; i < NB; i++)
        memcpy(e->snap[i], e->host[i], NBYTES);
    fa_status st = env_call(e);
    const char *msg = fa_last_error_message();
    CHECK_MSG(st == want || st == want_alt, "status %s (%d), expected %s%s%s; message \"%s\"",
              fa_status_name(st), (int)st, fa_status_name(want), want_alt != want ? " or " : "",
              want_alt != want ? fa_status_name(want_alt) : "", msg);
    CHECK_MSG(msg[0] != '\0', "empty error message");
    if (word)
        CHECK_MSG(tu_contains_word(msg, word) || (word2 && tu_contains_word(msg, word2)),
                  "message \"%s\" does not name \"%s\"%s%s", msg, word, word2 ? " or " : "",
                  word2 ? word2 : "");
    if (path)
        CHECK_MSG(strstr(msg, g_path) != NULL, "message \"%s\" does not say why (%s)", msg,
                  g_path);
    for (int i = 0; i < NB; i++)
        CHECK_MSG(memcmp(e->snap[i], e->host[i], NBYTES) == 0,
                  "host buffer %d was modified by a failing call", i);
    CASE_END();
}

#define ECASE(kind_, desc, want, alt, word, word2, path, ...)                                     \
    do {                                                                                           \
        env e;                                                                                     \
        env_init(&e, kind_);                                                                       \
        { __VA_ARGS__; }                                                                           \
        expect(&e, desc, want, alt, word, word2, path);                                            \
        env_free(&e);                                                                              \
    } while (0)
#define EERR(kind_, desc, want, word, ...) ECASE(kind_, desc, want, want, word, NULL, 0, __VA_ARGS__)

static void attention_calls(void) {
    for (int vl = 0; vl < 2; vl++) {
        const int K = vl ? CALL_VARLEN : CALL_FWD;
        const int hd = vl ? 1 : 2;
        /* the plug-in is needed, and missing: says why */
        ECASE(K, "every tensor on CUDA", FA_ERR_DEVICE, FA_ERR_DEVICE, NULL, NULL, 1, (void)0);
        ECASE(K, "every tensor on CUDA, no lse", FA_ERR_DEVICE, FA_ERR_DEVICE, NULL, NULL, 1,
              e.pt[B_LSE] = NULL);
        ECASE(K, "every tensor on CUDA, ALiBi slopes too", FA_ERR_DEVICE, FA_ERR_DEVICE, NULL,
              NULL, 1, e.params.alibi_slopes = e.dt[B_SLOPES]);
        ECASE(K, "every tensor on CUDA device 1", FA_ERR_DEVICE, FA_ERR_DEVICE, NULL, NULL, 1,
              for (int i = 0; i < NB; i++) if (e.t[i].device == FA_DEVICE_CUDA)
                  e.t[i].device_index = 1);
        if (vl)
            ECASE(K, "every tensor on CUDA, cu_seqlens too", FA_ERR_DEVICE, FA_ERR_DEVICE, NULL,
                  NULL, 1, e.t[B_CUQ] = e.dt[B_CUQ];
                  e.t[B_CUK] = e.dt[B_CUK]);

        /* mixed devices: found without the plug-in; host outputs stay poisoned */
        EERR(K, "CPU out with CUDA q, k, v", FA_ERR_DEVICE, "out", e.t[B_OUT] = e.ht[B_OUT]);
        EERR(K, "CPU lse with CUDA q, k, v, out", FA_ERR_DEVICE, "lse", e.t[B_LSE] = e.ht[B_LSE]);
        EERR(K, "CPU k with CUDA q", FA_ERR_DEVICE, "k", e.t[B_K] = e.ht[B_K]);
        ECASE(K, "CPU q with CUDA k, v, out", FA_ERR_DEVICE, FA_ERR_DEVICE, "q", "k", 0,
              e.t[B_Q] = e.ht[B_Q]);
        EERR(K, "CPU q, k, v, out and a CUDA lse", FA_ERR_DEVICE, "lse",
             for (int i = 0; i < NB; i++) e.t[i] = e.ht[i];
             e.t[B_LSE] = e.dt[B_LSE]);
        EERR(K, "k on CUDA device 1, q on device 0", FA_ERR_DEVICE, "k",
             e.t[B_K].device_index = 1);
        EERR(K, "k device 7 (not a fa_device)", FA_ERR_DEVICE, "k", e.t[B_K].device = 7);
        EERR(K, "ALiBi slopes on the host with CUDA q", FA_ERR_DEVICE, "alibi_slopes",
             e.params.alibi_slopes = e.ht[B_SLOPES]);
        EERR(K, "ALiBi slopes on CUDA with CPU q", FA_ERR_DEVICE, "alibi_slopes",
             for (int i = 0; i < NB; i++) e.t[i] = e.ht[i];
             e.params.alibi_slopes = e.dt[B_SLOPES]);
        if (vl) {
            EERR(K, "cu_seqlens_q on CUDA with CPU q", FA_ERR_DEVICE, "cu_seqlens_q",
                 for (int i = 0; i < NB; i++) e.t[i] = e.ht[i];
                 e.t[B_CUQ] = e.dt[B_CUQ]);
            EERR(K, "cu_seqlens_k on CUDA device 1, q on device 0", FA_ERR_DEVICE,
                 "cu_seqlens_k", e.t[B_CUK] = e.dt[B_CUK];
                 e.t[B_CUK].device_index = 1);
        }

        /* argument errors on CUDA tensors come before the plug-in, as on the CPU */
        EERR(K, "q wrong ndim", FA_ERR_RANK, "q", e.t[B_Q].ndim = vl ? 4 : 3);
        EERR(K, "lse wrong ndim", FA_ERR_RANK, "lse", e.t[B_LSE].ndim = vl ? 3 : 2);
        EERR(K, "k fp16 with q fp32", FA_ERR_DTYPE, "k", e.t[B_K].dtype = FA_DTYPE_F16);
        EERR(K, "q dtype 99", FA_ERR_DTYPE, "q", e.t[B_Q].dtype = 99);
        EERR(K, "v heads != k heads", FA_ERR_SHAPE, "v", e.t[B_V].shape[hd] = 1);
        EERR(K, "Hk does not divide H", FA_ERR_SHAPE, "k", e.t[B_K].shape[hd] = 3;
             e.t[B_V].shape[hd] = 3);
        EERR(K, "q negative stride", FA_ERR_STRIDE, "q", e.t[B_Q].stride[hd + 1] = -1);
        EERR(K, "out zero stride on a dim > 1", FA_ERR_STRIDE, "out",
             e.t[B_OUT].stride[hd - 1] = 0);
        EERR(K, "q data NULL", FA_ERR_NULL_POINTER, "q", e.t[B_Q].data = NULL);
        EERR(K, "lse on CUDA not 4-byte aligned", FA_ERR_STRIDE, "lse",
             e.t[B_LSE].data = (char *)e.t[B_LSE].data + 2);
        EERR(K, "out overlaps q", FA_ERR_OVERLAP, "out", e.t[B_OUT].data = e.t[B_Q].data);
        EERR(K, "window_left = -2", FA_ERR_VALUE, "window_left", e.params.window_left = -2);
        EERR(K, "softcap < 0", FA_ERR_VALUE, "softcap", e.params.softcap = -1.0f);
        EERR(K, "dropout_p = 1", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = 1.0f);
        EERR(K, "params.struct_size wrong", FA_ERR_STRUCT_SIZE, "struct_size",
             e.params.struct_size = 8);
        EERR(K, "ALiBi (H + 1) on CUDA", FA_ERR_SHAPE, "alibi_slopes",
             e.params.alibi_slopes = e.dt[B_SLOPES];
             e.params.alibi_slopes.shape[0] = 5);
        if (vl) {
            EERR(K, "cu_seqlens_q fp32", FA_ERR_DTYPE, "cu_seqlens_q",
                 e.t[B_CUQ].dtype = FA_DTYPE_F32);
            EERR(K, "cu_seqlens_k ndim 2", FA_ERR_RANK, "cu_seqlens_k", e.t[B_CUK].ndim = 2;
                 e.t[B_CUK].shape[1] = 1; e.t[B_CUK].stride[1] = 1);
            EERR(K, "max_seqlen_q negative", FA_ERR_VALUE, "max_seqlen_q", e.maxq = -1);
        }
    }

    /* the CPU-only entry points: unsupported on CUDA, or the plug-in's absence; either way an
     * error, nothing written */
    ECASE(CALL_KVCACHE, "q, cache, out, lse on CUDA", FA_ERR_UNSUPPORTED, FA_ERR_DEVICE, NULL,
          NULL, 0, (void)0);
    ECASE(CALL_KVCACHE, "CUDA q, CPU out", FA_ERR_DEVICE, FA_ERR_UNSUPPORTED, NULL, NULL, 0,
          e.t[B_OUT] = e.ht[B_OUT]);

    /* fa_dropout_mask */
    ECASE(CALL_MASK, "mask on CUDA", FA_ERR_DEVICE, FA_ERR_DEVICE, NULL, NULL, 1,
          e.params.dropout_p = 0.5f);
    EERR(CALL_MASK, "mask on CUDA, rank 3", FA_ERR_RANK, "mask", e.params.dropout_p = 0.5f;
         e.t[B_OUT].ndim = 3);
    EERR(CALL_MASK, "mask on CUDA, fp32", FA_ERR_DTYPE, "mask", e.t[B_OUT].dtype = FA_DTYPE_F32);
    EERR(CALL_MASK, "mask on CUDA, dropout_p NaN", FA_ERR_VALUE, "dropout_p",
         e.params.dropout_p = NAN);
    EERR(CALL_MASK, "mask on CUDA, negative stride", FA_ERR_STRIDE, "mask",
         e.t[B_OUT].stride[3] = -1);
}

/* fa_backward / fa_varlen_backward with CUDA tensors: FA_ERR_UNSUPPORTED (CUDA has no backward)
 * or FA_ERR_DEVICE (the plug-in is missing) — the header promises the first on CUDA tensors and
 * the second for every CUDA call without the plug-in, so either is right here. Mixed devices and
 * argument errors are found first. */
static void backward_calls(void) {
    static float hbuf[2 * 3 * 4 * 8]; /* a host dq, poisoned */
    static unsigned char snapb[sizeof hbuf];
    int64_t qs[4] = {2, 3, 4, 8}, ks[4] = {2, 4, 2, 8}, ls[3] = {2, 4, 3};
    for (int variant = 0; variant < 5; variant++) {
        static const char *desc[] = {"every tensor on CUDA", "CPU dq with CUDA inputs",
                                     "CUDA q with a rank error", "CUDA v with a shape error",
                                     "varlen: every tensor on CUDA"};
        CASE_BEGIN("fa_backward: %s", desc[variant]);
        memset(hbuf, 0xA5, sizeof hbuf);
        fa_tensor t[11];
        const int64_t *shp[11] = {qs, ks, ks, qs, qs, ls, qs, ks, ks};
        for (int i = 0; i < 9; i++) {
            t[i] = fa_tensor_contiguous(NULL, FA_DTYPE_F32, i == 5 ? 3 : 4, shp[i]);
            t[i].data = FAKE_DEV(20 + i);
            t[i].device = FA_DEVICE_CUDA;
        }
        fa_status want = FA_ERR_UNSUPPORTED, alt = FA_ERR_DEVICE;
        const char *word = NULL;
        fa_status st;
        if (variant == 1) {
            t[6] = fa_tensor_contiguous(hbuf, FA_DTYPE_F32, 4, qs);
            want = alt = FA_ERR_DEVICE;
            word = "dq";
        } else if (variant == 2) {
            t[0].ndim = 3;
            want = alt = FA_ERR_RANK;
            word = "q";
        } else if (variant == 3) {
            t[2].shape[2] = 1;
            want = alt = FA_ERR_SHAPE;
            word = "v";
        }
        memcpy(snapb, hbuf, sizeof hbuf);
        if (variant < 4) {
            st = fa_backward(NULL, NULL, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7],
                             &t[8]);
        } else {
            int64_t q3[3] = {6, 4, 8}, k3[3] = {7, 2, 8}, l2[2] = {4, 6}, cs = 3;
            int32_t cq[3] = {0, 3, 5}, ck[3] = {0, 4, 6};
            const int64_t *shp3[9] = {q3, k3, k3, q3, q3, l2, q3, k3, k3};
            for (int i = 0; i < 9; i++) {
                t[i] = fa_tensor_contiguous(NULL, FA_DTYPE_F32, i == 5 ? 2 : 3, shp3[i]);
                t[i].data = FAKE_DEV(20 + i);
                t[i].device = FA_DEVICE_CUDA;
            }
            t[9] = fa_tensor_contiguous(cq, FA_DTYPE_I32, 1, &cs);
            t[10] = fa_tensor_contiguous(ck, FA_DTYPE_I32, 1, &cs);
            st = fa_varlen_backward(NULL, NULL, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[9],
                                    &t[10], 3, 4, &t[6], &t[7], &t[8]);
        }
        const char *msg = fa_last_error_message();
        CHECK_MSG(st == want || st == alt, "status %s, expected %s%s%s; message \"%s\"",
                  fa_status_name(st), fa_status_name(want), alt != want ? " or " : "",
                  alt != want ? fa_status_name(alt) : "", msg);
        CHECK_MSG(msg[0] != '\0', "empty error message");
        if (word)
            CHECK_MSG(tu_contains_word(msg, word), "message \"%s\" does not name \"%s\"", msg,
                      word);
        else
            CHECK_MSG(contains_ci(msg, "cuda") || strstr(msg, g_path) != NULL,
                      "message \"%s\" says nothing about CUDA", msg);
        CHECK(memcmp(snapb, hbuf, sizeof hbuf) == 0);
        CASE_END();
    }
}

/* ---------------------------------------------------------------------------------------------
 * Build info, and the CPU still works
 * ------------------------------------------------------------------------------------------- */

static void build_info_and_cpu(void) {
    CASE_BEGIN("fa_build_info mentions CUDA and why the plug-in is not loaded");
    const char *info = fa_build_info();
    CHECK(info != NULL);
    CHECK_MSG(info && contains_ci(info, "cuda"), "build info \"%s\" does not mention CUDA",
              info ? info : "(null)");
    CHECK_MSG(info && strstr(info, g_path) != NULL,
              "build info \"%s\" does not say why the plug-in is not loaded (%s)",
              info ? info : "(null)", g_path);
    CASE_END();

    CASE_BEGIN("the CPU backend works without the plug-in");
    {
        float q[2 * 3 * 4 * 8], k[2 * 4 * 2 * 8], v[2 * 4 * 2 * 8], out[2 * 3 * 4 * 8];
        float lse[2 * 4 * 3];
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
            q[i] = (float)tu_normal();
        for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
            k[i] = (float)tu_normal();
            v[i] = (float)tu_normal();
        }
        memset(out, 0xFF, sizeof out);
        memset(lse, 0xFF, sizeof lse);
        int64_t qs[4] = {2, 3, 4, 8}, ks[4] = {2, 4, 2, 8}, ls[3] = {2, 4, 3};
        fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, qs);
        fa_tensor tk = fa_tensor_contiguous(k, FA_DTYPE_F32, 4, ks);
        fa_tensor tv = fa_tensor_contiguous(v, FA_DTYPE_F32, 4, ks);
        fa_tensor to = fa_tensor_contiguous(out, FA_DTYPE_F32, 4, qs);
        fa_tensor tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, ls);
        fa_status st = fa_forward(NULL, NULL, &tq, &tk, &tv, &to, &tl);
        CHECK_MSG(st == FA_OK, "%s: %s", fa_status_name(st), fa_last_error_message());
        CHECK_EQ_STR(fa_last_error_message(), "");
        int nan = 0;
        for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
            nan += isnan(out[i]);
        for (size_t i = 0; i < sizeof lse / sizeof lse[0]; i++)
            nan += !isfinite(lse[i]);
        CHECK_EQ_INT(nan, 0);
        /* a CPU dropout mask too */
        unsigned char m[2 * 3 * 5 * 7];
        int64_t ms[4] = {2, 3, 5, 7};
        fa_tensor tm = fa_tensor_contiguous(m, FA_DTYPE_U8, 4, ms);
        fa_params p;
        fa_params_init(&p);
        p.dropout_p = 0.5f;
        CHECK_EQ_INT(fa_dropout_mask(&p, &tm), FA_OK);
    }
    CASE_END();
}

int main(void) {
    /* before any library call: the plug-in is looked for once, on first use */
    snprintf(g_path, sizeof g_path, "/nonexistent-flashattn-%ld/libflashattn_cuda.so",
             (long)getpid());
    if (setenv("FA_CUDA_PLUGIN", g_path, 1) != 0) {
        printf("setenv failed\n");
        return 1;
    }
    device_helpers();
    tu_seed_init("test_cuda_errors");
    printf("library %s; %s\n", fa_version_string(), fa_build_info());
    attention_calls();
    backward_calls();
    build_info_and_cpu();
    return TEST_REPORT();
}
