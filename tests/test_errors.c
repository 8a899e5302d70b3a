/* SPDX-License-Identifier: MIT */
/*
 * test_errors.c — every error path of the public API.
 *
 * Each case starts from a valid call (which must succeed), breaks one thing, and checks that
 *  - the documented status comes back,
 *  - fa_last_error_message() names the offending argument (as a whole word),
 *  - no byte of any tensor (outputs poisoned with 0xA5, inputs random) has changed.
 * Plus: status names and texts for every code, the empty message after a success, its
 * thread-locality, the version functions, fa_tensor_contiguous and the context options.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "test.h"
#include "testutil.h"

#define NBUF (1 << 14) /* floats per buffer: room for every mutated shape below */

enum { BUF_Q, BUF_K, BUF_V, BUF_OUT, BUF_LSE, BUF_SLOPES, BUF_CUQ, BUF_CUK, NBUFS };

typedef struct env {
    int varlen;
    float *buf[NBUFS]; /* cu_seqlens live in BUF_CUQ/BUF_CUK as int32 */
    unsigned char *snap[NBUFS];
    fa_tensor q, k, v, out, lse, cuq, cuk;
    const fa_tensor *pq, *pk, *pv, *pout, *plse, *pcuq, *pcuk;
    fa_params params;
    const fa_params *pp;
    int64_t maxq, maxk;
} env;

/* A valid problem: fixed B=2 Sq=3 Sk=4 H=4 Hk=2 D=8, or varlen with cu_seqlens_q = {0,3,5}
 * (total_q 6), cu_seqlens_k = {0,4,6} (total_k 7); fp32, contiguous, (B, H) ALiBi off. */
static void env_init(env *e, int varlen) {
    memset(e, 0, sizeof *e);
    e->varlen = varlen;
    for (int i = 0; i < NBUFS; i++) {
        e->buf[i] = malloc(NBUF * sizeof(float));
        e->snap[i] = malloc(NBUF * sizeof(float));
        if (!e->buf[i] || !e->snap[i])
            abort();
        for (int j = 0; j < NBUF; j++)
            e->buf[i][j] = (float)tu_normal();
    }
    memset(e->buf[BUF_OUT], 0xA5, NBUF * sizeof(float));
    memset(e->buf[BUF_LSE], 0xA5, NBUF * sizeof(float));
    for (int j = 0; j < NBUF; j++)
        e->buf[BUF_SLOPES][j] = 0.1f + 0.01f * (float)(j % 7);
    if (!varlen) {
        int64_t qs[4] = {2, 3, 4, 8}, ks[4] = {2, 4, 2, 8}, ls[3] = {2, 4, 3};
        e->q = fa_tensor_contiguous(e->buf[BUF_Q], FA_DTYPE_F32, 4, qs);
        e->k = fa_tensor_contiguous(e->buf[BUF_K], FA_DTYPE_F32, 4, ks);
        e->v = fa_tensor_contiguous(e->buf[BUF_V], FA_DTYPE_F32, 4, ks);
        e->out = fa_tensor_contiguous(e->buf[BUF_OUT], FA_DTYPE_F32, 4, qs);
        e->lse = fa_tensor_contiguous(e->buf[BUF_LSE], FA_DTYPE_F32, 3, ls);
    } else {
        int32_t *cq = (int32_t *)e->buf[BUF_CUQ], *ck = (int32_t *)e->buf[BUF_CUK];
        cq[0] = 0, cq[1] = 3, cq[2] = 5;
        ck[0] = 0, ck[1] = 4, ck[2] = 6;
        int64_t qs[3] = {6, 4, 8}, ks[3] = {7, 2, 8}, ls[2] = {4, 6}, cs = 3;
        e->q = fa_tensor_contiguous(e->buf[BUF_Q], FA_DTYPE_F32, 3, qs);
        e->k = fa_tensor_contiguous(e->buf[BUF_K], FA_DTYPE_F32, 3, ks);
        e->v = fa_tensor_contiguous(e->buf[BUF_V], FA_DTYPE_F32, 3, ks);
        e->out = fa_tensor_contiguous(e->buf[BUF_OUT], FA_DTYPE_F32, 3, qs);
        e->lse = fa_tensor_contiguous(e->buf[BUF_LSE], FA_DTYPE_F32, 2, ls);
        e->cuq = fa_tensor_contiguous(cq, FA_DTYPE_I32, 1, &cs);
        e->cuk = fa_tensor_contiguous(ck, FA_DTYPE_I32, 1, &cs);
        e->maxq = 3;
        e->maxk = 4;
    }
    e->pq = &e->q;
    e->pk = &e->k;
    e->pv = &e->v;
    e->pout = &e->out;
    e->plse = &e->lse;
    e->pcuq = &e->cuq;
    e->pcuk = &e->cuk;
    fa_params_init(&e->params);
    e->pp = &e->params;
}

static void env_free(env *e) {
    for (int i = 0; i < NBUFS; i++) {
        free(e->buf[i]);
        free(e->snap[i]);
    }
}

static void set_alibi(env *e, int ndim, int64_t s0, int64_t s1) {
    int64_t sh[2] = {s0, s1};
    e->params.alibi_slopes = fa_tensor_contiguous(e->buf[BUF_SLOPES], FA_DTYPE_F32, ndim, sh);
}

/* Contiguous strides for t's (mutated) shape. */
static void recontig(fa_tensor *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        t->stride[d] = st;
        st *= t->shape[d] > 0 ? t->shape[d] : 1;
    }
}

static fa_status env_call(env *e) {
    if (e->varlen)
        return fa_varlen_forward(NULL, e->pp, e->pq, e->pk, e->pv, e->pcuq, e->pcuk, e->maxq,
                                 e->maxk, e->pout, e->plse);
    return fa_forward(NULL, e->pp, e->pq, e->pk, e->pv, e->pout, e->plse);
}

/* Runs the call; checks status, message and untouched memory. word2 (may be NULL) is an
 * alternative name the message may use instead of word. */
static void expect_error(env *e, const char *desc, fa_status want, fa_status want_alt,
                         const char *word, const char *word2) {
    CASE_BEGIN("%s: %s", e->varlen ? "varlen" : "forward", desc);
    for (int i = 0; i < NBUFS; i++)
        memcpy(e->snap[i], e->buf[i], NBUF * sizeof(float));
    fa_status st = env_call(e);
    const char *msg = fa_last_error_message();
    CHECK_MSG(st == want || st == want_alt, "status %s (%d), expected %s%s%s; message \"%s\"",
              fa_status_name(st), (int)st, fa_status_name(want), want_alt != want ? " or " : "",
              want_alt != want ? fa_status_name(want_alt) : "", msg);
    CHECK_MSG(msg != NULL && msg[0] != '\0', "empty error message");
    if (msg && word)
        CHECK_MSG(tu_contains_word(msg, word) || (word2 && tu_contains_word(msg, word2)),
                  "message \"%s\" does not name \"%s\"%s%s", msg, word, word2 ? " or " : "",
                  word2 ? word2 : "");
    for (int i = 0; i < NBUFS; i++)
        CHECK_MSG(memcmp(e->snap[i], e->buf[i], NBUF * sizeof(float)) == 0,
                  "buffer %d was modified by a failing call", i);
    CASE_END();
}

static void expect_ok(env *e, const char *desc) {
    CASE_BEGIN("%s: %s (valid)", e->varlen ? "varlen" : "forward", desc);
    fa_status st = env_call(e);
    CHECK_MSG(st == FA_OK, "status %s (%d): %s", fa_status_name(st), (int)st,
              fa_last_error_message());
    CHECK_EQ_STR(fa_last_error_message(), "");
    CASE_END();
}

/* One error case: a fresh valid env (varlen or not), the mutation statements, the expectation. */
#define ERR2(varlen_, desc, want, alt, word, word2, ...)                                           \
    do {                                                                                           \
        env e;                                                                                     \
        env_init(&e, varlen_);                                                                     \
        { __VA_ARGS__; }                                                                           \
        expect_error(&e, desc, want, alt, word, word2);                                            \
        env_free(&e);                                                                              \
    } while (0)
#define ERR(varlen_, desc, want, word, ...) ERR2(varlen_, desc, want, want, word, NULL, __VA_ARGS__)
#define OK(varlen_, desc, ...)                                                                     \
    do {                                                                                           \
        env e;                                                                                     \
        env_init(&e, varlen_);                                                                     \
        { __VA_ARGS__; }                                                                           \
        expect_ok(&e, desc);                                                                       \
        env_free(&e);                                                                              \
    } while (0)

static long g_group_cases, g_group_failed;
static void group_begin(void) {
    g_group_cases = test_state_g_.cases_passed + test_state_g_.cases_failed;
    g_group_failed = test_state_g_.cases_failed;
}
static void group_end(const char *name) {
    printf("%-40s %4ld cases, %ld failed\n", name,
           test_state_g_.cases_passed + test_state_g_.cases_failed - g_group_cases,
           test_state_g_.cases_failed - g_group_failed);
    fflush(stdout);
}

/* Errors common to fa_forward and fa_varlen_forward (dimension indices differ: the fixed
 * layout has a leading batch dim, so "o" is the offset of the S dimension). */
static void common_errors(int vl) {
    const int o = vl ? 0 : 1;         /* index of the sequence dim */
    const int hd = o + 1, dd = o + 2; /* heads, head dim */

    OK(vl, "baseline", (void)0);
    OK(vl, "lse NULL", e.plse = NULL);
    OK(vl, "params NULL", e.pp = NULL);
    OK(vl, "ALiBi (H)", set_alibi(&e, 1, 4, 0));
    OK(vl, "ALiBi (B, H)", set_alibi(&e, 2, 2, 4));
    OK(vl, "ALiBi data NULL ignores the rest", e.params.alibi_slopes.ndim = 7;
       e.params.alibi_slopes.dtype = 99);
    OK(vl, "input with zero stride (k broadcast along heads)", e.k.stride[hd] = 0;
       e.v.stride[o] = 0);
    OK(vl, "output with zero stride on a size-1 dim", e.out.shape[hd] = e.q.shape[hd] = 1;
       e.k.shape[hd] = e.v.shape[hd] = 1; e.out.stride[hd] = 0; e.lse.shape[vl ? 0 : 1] = 1;
       e.lse.stride[vl ? 0 : 1] = 0);
    OK(vl, "window and softcap at their limits", e.params.window_left = -1;
       e.params.window_right = 0; e.params.softcap = 0.0f);

    /* NULL pointers */
    ERR(vl, "q NULL", FA_ERR_NULL_POINTER, "q", e.pq = NULL);
    ERR(vl, "k NULL", FA_ERR_NULL_POINTER, "k", e.pk = NULL);
    ERR(vl, "v NULL", FA_ERR_NULL_POINTER, "v", e.pv = NULL);
    ERR(vl, "out NULL", FA_ERR_NULL_POINTER, "out", e.pout = NULL);
    ERR(vl, "q data NULL", FA_ERR_NULL_POINTER, "q", e.q.data = NULL);
    ERR(vl, "k data NULL", FA_ERR_NULL_POINTER, "k", e.k.data = NULL);
    ERR(vl, "v data NULL", FA_ERR_NULL_POINTER, "v", e.v.data = NULL);
    ERR(vl, "out data NULL", FA_ERR_NULL_POINTER, "out", e.out.data = NULL);
    ERR(vl, "lse data NULL", FA_ERR_NULL_POINTER, "lse", e.lse.data = NULL);

    /* rank */
    ERR(vl, "q wrong ndim", FA_ERR_RANK, "q", e.q.ndim = vl ? 4 : 3);
    ERR(vl, "k wrong ndim", FA_ERR_RANK, "k", e.k.ndim = 5);
    ERR(vl, "v ndim 0", FA_ERR_RANK, "v", e.v.ndim = 0);
    ERR(vl, "out wrong ndim", FA_ERR_RANK, "out", e.out.ndim = 2);
    ERR(vl, "lse wrong ndim", FA_ERR_RANK, "lse", e.lse.ndim = vl ? 3 : 2);
    ERR(vl, "ALiBi ndim 3", FA_ERR_RANK, "alibi_slopes", set_alibi(&e, 2, 2, 4);
        e.params.alibi_slopes.ndim = 3; e.params.alibi_slopes.shape[2] = 1;
        e.params.alibi_slopes.stride[2] = 1);

    /* shapes */
    if (!vl)
        ERR(vl, "k batch != q batch", FA_ERR_SHAPE, "k", e.k.shape[0] = 3; e.v.shape[0] = 3);
    ERR(vl, "v seqlen != k seqlen", FA_ERR_SHAPE, "v", e.v.shape[o] += 1; recontig(&e.v));
    ERR(vl, "v heads != k heads", FA_ERR_SHAPE, "v", e.v.shape[hd] = 1);
    ERR(vl, "v head dim != k head dim", FA_ERR_SHAPE, "v", e.v.shape[dd] = 4);
    ERR(vl, "out seqlen != q seqlen", FA_ERR_SHAPE, "out", e.out.shape[o] += 1; recontig(&e.out));
    ERR(vl, "out heads != q heads", FA_ERR_SHAPE, "out", e.out.shape[hd] = 2; recontig(&e.out));
    ERR(vl, "out head dim != q head dim", FA_ERR_SHAPE, "out", e.out.shape[dd] = 7;
        recontig(&e.out));
    if (!vl)
        ERR(vl, "out batch != q batch", FA_ERR_SHAPE, "out", e.out.shape[0] = 1; recontig(&e.out));
    ERR(vl, "k head dim != q head dim", FA_ERR_SHAPE, "k", e.k.shape[dd] = 7; e.v.shape[dd] = 7);
    ERR(vl, "Hk does not divide H", FA_ERR_SHAPE, "k", e.k.shape[hd] = 3; e.v.shape[hd] = 3);
    ERR(vl, "Hk > H", FA_ERR_SHAPE, "k", e.k.shape[hd] = 8; e.v.shape[hd] = 8);
    ERR(vl, "Hk = 0", FA_ERR_SHAPE, "k", e.k.shape[hd] = 0; e.v.shape[hd] = 0);
    ERR(vl, "H = 0", FA_ERR_SHAPE, "q", e.q.shape[hd] = 0; e.out.shape[hd] = 0;
        e.lse.shape[vl ? 0 : 1] = 0);
    ERR(vl, "D = 0", FA_ERR_SHAPE, "q", e.q.shape[dd] = e.k.shape[dd] = 0;
        e.v.shape[dd] = e.out.shape[dd] = 0);
    /* D = 257: the header says D is 1..256 but its error list names no code for it;
     * the library answers FA_ERR_UNSUPPORTED (not supported by this build) — either that or
     * FA_ERR_SHAPE is a sensible reading. */
    ERR2(
        vl, "D = 257", FA_ERR_UNSUPPORTED, FA_ERR_SHAPE, "q", NULL,
        e.q.shape[dd] = e.k.shape[dd] = 257;
        e.v.shape[dd] = e.out.shape[dd] = 257; e.q.stride[hd] = e.out.stride[hd] = 257;
        e.k.stride[hd] = e.v.stride[hd] = 257; e.q.stride[o] = e.out.stride[o] = 4 * 257;
        e.k.stride[o] = e.v.stride[o] = 2 * 257; if (!vl) {
            e.q.stride[0] = e.out.stride[0] = 3 * 4 * 257;
            e.k.stride[0] = e.v.stride[0] = 4 * 2 * 257;
        });
    ERR(vl, "negative shape", FA_ERR_SHAPE, "q", e.q.shape[o] = -1);
    if (vl) {
        ERR(vl, "lse (H, total_q + 1)", FA_ERR_SHAPE, "lse", e.lse.shape[1] = 7; recontig(&e.lse));
        ERR(vl, "lse (H + 1, total_q)", FA_ERR_SHAPE, "lse", e.lse.shape[0] = 5; recontig(&e.lse));
    } else {
        ERR(vl, "lse (B, H, Sq + 1)", FA_ERR_SHAPE, "lse", e.lse.shape[2] = 4; recontig(&e.lse));
        ERR(vl, "lse (B, H + 1, Sq)", FA_ERR_SHAPE, "lse", e.lse.shape[1] = 5; recontig(&e.lse));
        ERR(vl, "lse (B + 1, H, Sq)", FA_ERR_SHAPE, "lse", e.lse.shape[0] = 3; recontig(&e.lse));
    }
    ERR(vl, "ALiBi (H + 1)", FA_ERR_SHAPE, "alibi_slopes", set_alibi(&e, 1, 5, 0));
    ERR(vl, "ALiBi (B + 1, H)", FA_ERR_SHAPE, "alibi_slopes", set_alibi(&e, 2, 3, 4));
    ERR(vl, "ALiBi (B, H + 1)", FA_ERR_SHAPE, "alibi_slopes", set_alibi(&e, 2, 2, 5));
    ERR(vl, "ALiBi (H, B) transposed", FA_ERR_SHAPE, "alibi_slopes", set_alibi(&e, 2, 4, 2));

    /* dtypes */
    ERR(vl, "k fp16 with q fp32", FA_ERR_DTYPE, "k", e.k.dtype = FA_DTYPE_F16);
    ERR(vl, "v bf16 with q fp32", FA_ERR_DTYPE, "v", e.v.dtype = FA_DTYPE_BF16);
    ERR(vl, "out fp16 with q fp32", FA_ERR_DTYPE, "out", e.out.dtype = FA_DTYPE_F16);
    ERR(vl, "q fp16 with k, v, out fp32", FA_ERR_DTYPE, "k", e.q.dtype = FA_DTYPE_F16);
    ERR(vl, "lse fp16", FA_ERR_DTYPE, "lse", e.lse.dtype = FA_DTYPE_F16);
    ERR(vl, "lse i32", FA_ERR_DTYPE, "lse", e.lse.dtype = FA_DTYPE_I32);
    ERR(vl, "q, k, v, out all i32", FA_ERR_DTYPE, "q", e.q.dtype = e.k.dtype = FA_DTYPE_I32;
        e.v.dtype = e.out.dtype = FA_DTYPE_I32);
    ERR(vl, "q dtype 99", FA_ERR_DTYPE, "q", e.q.dtype = 99);
    ERR(vl, "q, k, v, out all u8", FA_ERR_DTYPE, "q", e.q.dtype = e.k.dtype = FA_DTYPE_U8;
        e.v.dtype = e.out.dtype = FA_DTYPE_U8);
    ERR(vl, "lse u8", FA_ERR_DTYPE, "lse", e.lse.dtype = FA_DTYPE_U8);
    ERR(vl, "ALiBi u8", FA_ERR_DTYPE, "alibi_slopes", set_alibi(&e, 1, 4, 0);
        e.params.alibi_slopes.dtype = FA_DTYPE_U8);
    ERR(vl, "k dtype -1", FA_ERR_DTYPE, "k", e.k.dtype = -1);
    ERR(vl, "ALiBi fp16", FA_ERR_DTYPE, "alibi_slopes", set_alibi(&e, 1, 4, 0);
        e.params.alibi_slopes.dtype = FA_DTYPE_F16);

    /* strides */
    ERR(vl, "q negative stride", FA_ERR_STRIDE, "q", e.q.stride[o] = -1);
    ERR(vl, "v negative stride", FA_ERR_STRIDE, "v", e.v.stride[dd] = -8);
    ERR(vl, "out negative stride", FA_ERR_STRIDE, "out", e.out.stride[dd] = -1);
    ERR(vl, "lse negative stride", FA_ERR_STRIDE, "lse", e.lse.stride[0] = -1);
    ERR(vl, "ALiBi negative stride", FA_ERR_STRIDE, "alibi_slopes", set_alibi(&e, 1, 4, 0);
        e.params.alibi_slopes.stride[0] = -1);
    ERR(vl, "k stride overflows int64", FA_ERR_STRIDE, "k", e.k.stride[o] = INT64_MAX / 2);
    ERR(vl, "q stride INT64_MAX", FA_ERR_STRIDE, "q", e.q.stride[dd] = INT64_MAX);
    ERR(vl, "v byte extent overflows", FA_ERR_STRIDE, "v", e.v.stride[o] = (int64_t)1 << 61);
    ERR(vl, "out extent sum overflows", FA_ERR_STRIDE, "out", e.out.stride[o] = INT64_MAX / 4;
        e.out.stride[hd] = INT64_MAX / 4);
    ERR(vl, "out zero stride on a dim > 1", FA_ERR_STRIDE, "out", e.out.stride[o] = 0);
    ERR(vl, "out zero head-dim stride", FA_ERR_STRIDE, "out", e.out.stride[dd] = 0);
    ERR(vl, "out strides alias (heads overlap)", FA_ERR_STRIDE, "out", e.out.stride[hd] = 4);
    ERR(vl, "lse zero stride on a dim > 1", FA_ERR_STRIDE, "lse", e.lse.stride[vl ? 1 : 2] = 0);

    /* parameter values */
    ERR(vl, "window_left = -2", FA_ERR_VALUE, "window_left", e.params.window_left = -2);
    ERR(vl, "window_right = -5", FA_ERR_VALUE, "window_right", e.params.window_right = -5);
    ERR(vl, "window_left = INT32_MIN", FA_ERR_VALUE, "window_left",
        e.params.window_left = INT32_MIN);
    ERR(vl, "softcap < 0", FA_ERR_VALUE, "softcap", e.params.softcap = -1.0f);
    ERR(vl, "softcap NaN", FA_ERR_VALUE, "softcap", e.params.softcap = NAN);
    ERR(vl, "softcap inf", FA_ERR_VALUE, "softcap", e.params.softcap = INFINITY);
    ERR(vl, "softcap so small scale/softcap overflows", FA_ERR_VALUE, "softcap",
        e.params.softcap = 1e-45f);
    ERR(vl, "softcap so large softcap*log2(e) overflows", FA_ERR_VALUE, "softcap",
        e.params.softcap = 3e38f);
    ERR(vl, "softmax_scale NaN", FA_ERR_VALUE, "softmax_scale", e.params.softmax_scale = NAN);
    ERR(vl, "softmax_scale inf", FA_ERR_VALUE, "softmax_scale", e.params.softmax_scale = INFINITY);
    ERR(vl, "softmax_scale -inf", FA_ERR_VALUE, "softmax_scale",
        e.params.softmax_scale = -INFINITY);
    ERR(vl, "dropout_p = 1", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = 1.0f);
    ERR(vl, "dropout_p < 0", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = -0.1f);
    ERR(vl, "dropout_p NaN", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = NAN);
    ERR(vl, "dropout_p inf", FA_ERR_VALUE, "dropout_p", e.params.dropout_p = INFINITY);
    OK(vl, "dropout_p just below 1", e.params.dropout_p = 0.99f);
    ERR(vl, "params.struct_size 0", FA_ERR_STRUCT_SIZE, "struct_size", e.params.struct_size = 0);
    ERR(vl, "params.struct_size too big", FA_ERR_STRUCT_SIZE, "struct_size",
        e.params.struct_size = (uint32_t)sizeof(fa_params) + 8);
    ERR(vl, "params.struct_size too small", FA_ERR_STRUCT_SIZE, "struct_size",
        e.params.struct_size = (uint32_t)sizeof(fa_params) - 4);
    /* binaries built against 0.1.0's header: fa_params without cuda_stream */
    OK(vl, "params.struct_size of 0.1.0", e.params.struct_size = offsetof(fa_params, cuda_stream));

    /* overlap */
    ERR(vl, "out is q", FA_ERR_OVERLAP, "out", e.out.data = e.q.data);
    ERR(vl, "out overlaps k partly", FA_ERR_OVERLAP, "out", e.out.data = e.buf[BUF_K] + 17);
    ERR(vl, "out overlaps v's end", FA_ERR_OVERLAP, "out",
        e.out.data = e.buf[BUF_V] + (vl ? 7 * 2 * 8 : 2 * 4 * 2 * 8) - 8); /* last 8 of v */
    ERR(vl, "lse overlaps out", FA_ERR_OVERLAP, "lse", e.lse.data = e.out.data);
    ERR(vl, "lse overlaps q", FA_ERR_OVERLAP, "lse", e.lse.data = e.buf[BUF_Q] + 3);
    ERR(vl, "out overlaps the ALiBi slopes", FA_ERR_OVERLAP, "out", set_alibi(&e, 1, 4, 0);
        e.params.alibi_slopes.data = e.buf[BUF_OUT] + 2);

    /* device */
    ERR2(vl, "q on CUDA", FA_ERR_DEVICE, FA_ERR_UNSUPPORTED, "q", NULL,
         e.q.device = FA_DEVICE_CUDA);
    ERR2(vl, "everything on CUDA", FA_ERR_DEVICE, FA_ERR_UNSUPPORTED, "q", NULL,
         e.q.device = e.k.device = e.v.device = e.out.device = e.lse.device = FA_DEVICE_CUDA);
    ERR2(vl, "out on CUDA", FA_ERR_DEVICE, FA_ERR_UNSUPPORTED, "out", NULL,
         e.out.device = FA_DEVICE_CUDA);
    ERR2(vl, "lse on CUDA", FA_ERR_DEVICE, FA_ERR_UNSUPPORTED, "lse", NULL,
         e.lse.device = FA_DEVICE_CUDA);
    ERR2(vl, "ALiBi on CUDA", FA_ERR_DEVICE, FA_ERR_UNSUPPORTED, "alibi_slopes", NULL,
         set_alibi(&e, 1, 4, 0);
         e.params.alibi_slopes.device = FA_DEVICE_CUDA);
    ERR(vl, "k device 7", FA_ERR_DEVICE, "k", e.k.device = 7);
}

static void varlen_errors(void) {
    const int vl = 1;
    OK(vl, "cu_seqlens starting after 0 and ending before total",
       ((int32_t *)e.buf[BUF_CUQ])[0] = 1;
       ((int32_t *)e.buf[BUF_CUK])[0] = 2);
    OK(vl, "empty sequences", ((int32_t *)e.buf[BUF_CUQ])[1] = 0;
       ((int32_t *)e.buf[BUF_CUK])[2] = 4; e.maxq = 5);
    OK(vl, "max_seqlen larger than needed", e.maxq = 1000; e.maxk = 1000000);
    OK(vl, "zero sequences (B = 0)", e.cuq.shape[0] = e.cuk.shape[0] = 1);
    ERR(vl, "cu_seqlens_q NULL", FA_ERR_NULL_POINTER, "cu_seqlens_q", e.pcuq = NULL);
    ERR(vl, "cu_seqlens_k NULL", FA_ERR_NULL_POINTER, "cu_seqlens_k", e.pcuk = NULL);
    ERR(vl, "cu_seqlens_q data NULL", FA_ERR_NULL_POINTER, "cu_seqlens_q", e.cuq.data = NULL);
    ERR(vl, "cu_seqlens_q not monotonic", FA_ERR_VALUE, "cu_seqlens_q",
        ((int32_t *)e.buf[BUF_CUQ])[1] = 6;
        ((int32_t *)e.buf[BUF_CUQ])[2] = 5; e.maxq = 6);
    ERR(vl, "cu_seqlens_k not monotonic", FA_ERR_VALUE, "cu_seqlens_k",
        ((int32_t *)e.buf[BUF_CUK])[1] = 1;
        ((int32_t *)e.buf[BUF_CUK])[0] = 2);
    ERR(vl, "cu_seqlens_q beyond total_q", FA_ERR_VALUE, "cu_seqlens_q",
        ((int32_t *)e.buf[BUF_CUQ])[2] = 7;
        e.maxq = 100);
    ERR(vl, "cu_seqlens_k beyond total_k", FA_ERR_VALUE, "cu_seqlens_k",
        ((int32_t *)e.buf[BUF_CUK])[2] = 8);
    ERR(vl, "cu_seqlens_k far beyond total_k", FA_ERR_VALUE, "cu_seqlens_k",
        ((int32_t *)e.buf[BUF_CUK])[2] = INT32_MAX;
        e.maxk = INT64_MAX);
    ERR(vl, "negative cu_seqlens_q[0]", FA_ERR_VALUE, "cu_seqlens_q",
        ((int32_t *)e.buf[BUF_CUQ])[0] = -1);
    ERR(vl, "negative cu_seqlens_k[0]", FA_ERR_VALUE, "cu_seqlens_k",
        ((int32_t *)e.buf[BUF_CUK])[0] = -3;
        e.maxk = 10);
    ERR(vl, "cu_seqlens_q fp32", FA_ERR_DTYPE, "cu_seqlens_q", e.cuq.dtype = FA_DTYPE_F32);
    ERR(vl, "cu_seqlens_k fp16", FA_ERR_DTYPE, "cu_seqlens_k", e.cuk.dtype = FA_DTYPE_F16);
    ERR(vl, "cu_seqlens_q u8", FA_ERR_DTYPE, "cu_seqlens_q", e.cuq.dtype = FA_DTYPE_U8);
    ERR(vl, "cu_seqlens_k longer than cu_seqlens_q", FA_ERR_SHAPE, "cu_seqlens_k",
        e.cuk.shape[0] = 4;
        ((int32_t *)e.buf[BUF_CUK])[3] = 7);
    ERR(vl, "cu_seqlens_q ndim 2", FA_ERR_RANK, "cu_seqlens_q", e.cuq.ndim = 2; e.cuq.shape[1] = 1;
        e.cuq.stride[1] = 1);
    ERR(vl, "cu_seqlens_q shape (0)", FA_ERR_SHAPE, "cu_seqlens_q",
        e.cuq.shape[0] = e.cuk.shape[0] = 0);
    ERR(vl, "cu_seqlens_q negative stride", FA_ERR_STRIDE, "cu_seqlens_q", e.cuq.stride[0] = -1);
    ERR2(vl, "cu_seqlens_k on CUDA", FA_ERR_DEVICE, FA_ERR_UNSUPPORTED, "cu_seqlens_k", NULL,
         e.cuk.device = FA_DEVICE_CUDA);
    ERR2(vl, "sequence longer than max_seqlen_q", FA_ERR_VALUE, FA_ERR_VALUE, "max_seqlen_q",
         "cu_seqlens_q", e.maxq = 2);
    ERR2(vl, "sequence longer than max_seqlen_k", FA_ERR_VALUE, FA_ERR_VALUE, "max_seqlen_k",
         "cu_seqlens_k", e.maxk = 3);
    ERR(vl, "max_seqlen_q negative", FA_ERR_VALUE, "max_seqlen_q", e.maxq = -1);
    ERR(vl, "max_seqlen_k negative", FA_ERR_VALUE, "max_seqlen_k", e.maxk = -7);
    ERR(vl, "out overlaps cu_seqlens_q", FA_ERR_OVERLAP, "out", e.out.data = e.buf[BUF_CUQ]);
    ERR(vl, "lse overlaps cu_seqlens_k", FA_ERR_OVERLAP, "lse", e.lse.data = e.buf[BUF_CUK]);
    ERR(vl, "ALiBi (B + 1, H) for B sequences", FA_ERR_SHAPE, "alibi_slopes",
        set_alibi(&e, 2, 3, 4));
    ERR(vl, "v total != k total", FA_ERR_SHAPE, "v", e.v.shape[0] = 8; recontig(&e.v));
    ERR(vl, "out total != q total", FA_ERR_SHAPE, "out", e.out.shape[0] = 5; recontig(&e.out));
}

/* ---------------------------------------------------------------------------------------------
 * fa_dropout_mask
 * ------------------------------------------------------------------------------------------- */

static void mask_case(const char *desc, fa_status want, const char *word, const fa_params *p,
                      const fa_tensor *m, const unsigned char *buf, size_t n) {
    CASE_BEGIN("fa_dropout_mask: %s", desc);
    fa_status st = fa_dropout_mask(p, m);
    CHECK_MSG(st == want, "status %s, expected %s; message \"%s\"", fa_status_name(st),
              fa_status_name(want), fa_last_error_message());
    if (want == FA_OK) {
        CHECK_EQ_STR(fa_last_error_message(), "");
    } else {
        CHECK_MSG(tu_contains_word(fa_last_error_message(), word),
                  "message \"%s\" does not name \"%s\"", fa_last_error_message(), word);
        size_t changed = 0;
        for (size_t i = 0; i < n; i++)
            changed += buf[i] != 0xA5;
        CHECK_MSG(changed == 0, "%zu bytes of the mask buffer changed", changed);
    }
    CASE_END();
}

static void reset_mask_case(unsigned char *buf, size_t n, fa_params *p, fa_tensor *m,
                            const int64_t *shape) {
    memset(buf, 0xA5, n);
    fa_params_init(p);
    p->dropout_p = 0.5f;
    *m = fa_tensor_contiguous(buf, FA_DTYPE_U8, 4, shape);
}

static void dropout_mask_errors(void) {
    static unsigned char buf[4096];
    int64_t shape[4] = {2, 3, 5, 7};
    fa_params p;
    fa_tensor m;
#define RESET() reset_mask_case(buf, sizeof buf, &p, &m, shape)
    RESET();
    mask_case("valid", FA_OK, NULL, &p, &m, buf, 0);
    RESET();
    mask_case("params NULL (p = 0)", FA_OK, NULL, NULL, &m, buf, 0);
    RESET();
    mask_case("mask NULL", FA_ERR_NULL_POINTER, "mask", &p, NULL, buf, sizeof buf);
    RESET();
    m.data = NULL;
    mask_case("mask data NULL", FA_ERR_NULL_POINTER, "mask", &p, &m, buf, sizeof buf);
    RESET();
    m.dtype = FA_DTYPE_F32;
    mask_case("mask fp32", FA_ERR_DTYPE, "mask", &p, &m, buf, sizeof buf);
    RESET();
    m.ndim = 3;
    mask_case("mask ndim 3", FA_ERR_RANK, "mask", &p, &m, buf, sizeof buf);
    RESET();
    m.stride[3] = -1;
    mask_case("mask negative stride", FA_ERR_STRIDE, "mask", &p, &m, buf, sizeof buf);
    RESET();
    m.stride[2] = 0;
    mask_case("mask zero stride on a dim > 1", FA_ERR_STRIDE, "mask", &p, &m, buf, sizeof buf);
    RESET();
    m.stride[2] = INT64_MAX / 2; /* (5 - 1) * INT64_MAX / 2 overflows */
    mask_case("mask stride overflow", FA_ERR_STRIDE, "mask", &p, &m, buf, sizeof buf);
    RESET();
    m.device = FA_DEVICE_CUDA;
    mask_case("mask on CUDA", FA_ERR_DEVICE, "mask", &p, &m, buf, sizeof buf);
    RESET();
    p.dropout_p = 1.0f;
    mask_case("dropout_p = 1", FA_ERR_VALUE, "dropout_p", &p, &m, buf, sizeof buf);
    RESET();
    p.dropout_p = NAN;
    mask_case("dropout_p NaN", FA_ERR_VALUE, "dropout_p", &p, &m, buf, sizeof buf);
    RESET();
    p.struct_size = 1;
    mask_case("params.struct_size wrong", FA_ERR_STRUCT_SIZE, "struct_size", &p, &m, buf,
              sizeof buf);
#undef RESET
}

/* ---------------------------------------------------------------------------------------------
 * Context creation
 * ------------------------------------------------------------------------------------------- */

static void context_errors(void) {
    fa_context *const sentinel = (fa_context *)(uintptr_t)0x1234;
    fa_context *ctx;
    fa_context_options o;
    fa_status st;

    /* make sure the default context exists before FA_NUM_THREADS is played with */
    CHECK(fa_context_num_threads(NULL) >= 1);

    CASE_BEGIN("fa_context_create: out NULL");
    fa_context_options_init(&o);
    st = fa_context_create(&o, NULL);
    CHECK_EQ_INT(st, FA_ERR_NULL_POINTER);
    CHECK_MSG(tu_contains_word(fa_last_error_message(), "out"), "message \"%s\"",
              fa_last_error_message());
    CASE_END();

    static const struct {
        int32_t n;
        const char *desc;
    } bad[] = {
        {-1, "num_threads -1"}, {INT32_MIN, "num_threads INT32_MIN"}, {1025, "num_threads 1025"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CASE_BEGIN("fa_context_create: %s", bad[i].desc);
        fa_context_options_init(&o);
        o.num_threads = bad[i].n;
        ctx = sentinel;
        st = fa_context_create(&o, &ctx);
        CHECK_EQ_INT(st, FA_ERR_VALUE);
        CHECK(ctx == sentinel);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "num_threads"), "message \"%s\"",
                  fa_last_error_message());
        CASE_END();
    }

    CASE_BEGIN("fa_context_create: struct_size wrong");
    fa_context_options_init(&o);
    o.struct_size = 3;
    ctx = sentinel;
    st = fa_context_create(&o, &ctx);
    CHECK_EQ_INT(st, FA_ERR_STRUCT_SIZE);
    CHECK(ctx == sentinel);
    CHECK_MSG(tu_contains_word(fa_last_error_message(), "struct_size"), "message \"%s\"",
              fa_last_error_message());
    CASE_END();

    static const char *bad_env[] = {"abc", "0", "-2", "4x", "99999"};
    for (size_t i = 0; i < sizeof bad_env / sizeof bad_env[0]; i++) {
        CASE_BEGIN("fa_context_create: FA_NUM_THREADS=\"%s\"", bad_env[i]);
        setenv("FA_NUM_THREADS", bad_env[i], 1);
        fa_context_options_init(&o);
        ctx = sentinel;
        st = fa_context_create(&o, &ctx);
        CHECK_EQ_INT(st, FA_ERR_VALUE);
        CHECK(ctx == sentinel);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "FA_NUM_THREADS"), "message \"%s\"",
                  fa_last_error_message());
        /* an explicit count does not read the variable */
        o.num_threads = 1;
        ctx = NULL;
        st = fa_context_create(&o, &ctx);
        CHECK_EQ_INT(st, FA_OK);
        CHECK_EQ_STR(fa_last_error_message(), "");
        fa_context_destroy(ctx);
        unsetenv("FA_NUM_THREADS");
        CASE_END();
    }

    /* FA_SPIN_US is read by every context, an explicit thread count included */
    static const char *bad_spin[] = {"abc", "-1", "100001", "5x", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_spin / sizeof bad_spin[0]; i++) {
        CASE_BEGIN("fa_context_create: FA_SPIN_US=\"%s\"", bad_spin[i]);
        setenv("FA_SPIN_US", bad_spin[i], 1);
        fa_context_options_init(&o);
        o.num_threads = 2;
        ctx = sentinel;
        st = fa_context_create(&o, &ctx);
        CHECK_EQ_INT(st, FA_ERR_VALUE);
        CHECK(ctx == sentinel);
        CHECK_MSG(tu_contains_word(fa_last_error_message(), "FA_SPIN_US"), "message \"%s\"",
                  fa_last_error_message());
        unsetenv("FA_SPIN_US");
        CASE_END();
    }

    CASE_BEGIN("fa_context_create: valid options");
    fa_context_options_init(&o);
    o.num_threads = 2;
    ctx = NULL;
    CHECK_EQ_INT(fa_context_create(&o, &ctx), FA_OK);
    CHECK(ctx != NULL);
    if (ctx) {
        CHECK_EQ_INT(fa_context_num_threads(ctx), 2);
        /* a call on it works and clears the message */
        env e;
        env_init(&e, 0);
        fa_context_create(NULL, NULL); /* leaves an error message */
        CHECK(fa_last_error_message()[0] != '\0');
        CHECK_EQ_INT(fa_forward(ctx, NULL, &e.q, &e.k, &e.v, &e.out, &e.lse), FA_OK);
        CHECK_EQ_STR(fa_last_error_message(), "");
        env_free(&e);
        fa_context_destroy(ctx);
    }
    CASE_END();
}

/* ---------------------------------------------------------------------------------------------
 * Status codes, messages, version
 * ------------------------------------------------------------------------------------------- */

static void *thread_fail(void *arg) {
    char *msg = arg;
    fa_context_options o;
    fa_context_options_init(&o);
    o.num_threads = -1;
    fa_context *c = NULL;
    fa_context_create(&o, &c); /* fails */
    snprintf(msg, 256, "%s", fa_last_error_message());
    return NULL;
}

static void *thread_read(void *arg) {
    char *msg = arg;
    snprintf(msg, 256, "%s", fa_last_error_message());
    return NULL;
}

static void status_and_version(void) {
    CASE_BEGIN("fa_status_name and fa_strerror for every code");
    int count = 0;
#define CHECK_STATUS_(name, value, text)                                                           \
    CHECK_EQ_STR(fa_status_name(FA_##name), "FA_" #name);                                          \
    CHECK_EQ_STR(fa_strerror(FA_##name), text);                                                    \
    CHECK_EQ_INT(FA_##name, value);                                                                \
    CHECK((value) == 0 || (value) < 0);                                                            \
    count++;
    FA_STATUS_MAP(CHECK_STATUS_)
#undef CHECK_STATUS_
    CHECK_EQ_INT(count, 14);
    CASE_END();

    CASE_BEGIN("fa_status_name and fa_strerror for unknown codes");
    static const int unknown[] = {1, 5, -14, -99, 1000, INT32_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK_EQ_STR(fa_status_name((fa_status)unknown[i]), "FA_ERR_UNKNOWN");
        CHECK_EQ_STR(fa_strerror((fa_status)unknown[i]), "unknown status code");
    }
    CASE_END();

    CASE_BEGIN("fa_last_error_message: empty after success, thread-local");
    {
        env e;
        env_init(&e, 0);
        CHECK(fa_last_error_message() != NULL);
        e.params.window_left = -3;
        CHECK_EQ_INT(fa_forward(NULL, &e.params, &e.q, &e.k, &e.v, &e.out, &e.lse), FA_ERR_VALUE);
        char mine[256];
        snprintf(mine, sizeof mine, "%s", fa_last_error_message());
        CHECK(mine[0] != '\0');
        /* another thread has its own (empty) message, and its failure does not touch ours */
        char other[256] = "x", other2[256] = "x";
        pthread_t t;
        CHECK(pthread_create(&t, NULL, thread_read, other) == 0);
        pthread_join(t, NULL);
        CHECK_EQ_STR(other, "");
        CHECK(pthread_create(&t, NULL, thread_fail, other2) == 0);
        pthread_join(t, NULL);
        CHECK(tu_contains_word(other2, "num_threads"));
        CHECK_EQ_STR(fa_last_error_message(), mine);
        /* success clears it */
        e.params.window_left = -1;
        CHECK_EQ_INT(fa_forward(NULL, &e.params, &e.q, &e.k, &e.v, &e.out, &e.lse), FA_OK);
        CHECK_EQ_STR(fa_last_error_message(), "");
        /* and a varlen success too */
        env f;
        env_init(&f, 1);
        CHECK_EQ_INT(fa_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL), FA_ERR_NULL_POINTER);
        CHECK(fa_last_error_message()[0] != '\0');
        CHECK_EQ_INT(
            fa_varlen_forward(NULL, NULL, &f.q, &f.k, &f.v, &f.cuq, &f.cuk, 3, 4, &f.out, NULL),
            FA_OK);
        CHECK_EQ_STR(fa_last_error_message(), "");
        env_free(&f);
        env_free(&e);
    }
    CASE_END();

    CASE_BEGIN("version");
    CHECK_EQ_INT(fa_version(), FA_VERSION_HEX);
    CHECK_EQ_INT(FA_VERSION_HEX,
                 (FA_VERSION_MAJOR << 16) | (FA_VERSION_MINOR << 8) | FA_VERSION_PATCH);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    CHECK_EQ_STR(fa_version_string(), want);
    const char *info = fa_build_info();
    CHECK(info != NULL && info[0] != '\0');
    CHECK_MSG(info && strstr(info, want) != NULL, "build info \"%s\" lacks the version %s",
              info ? info : "(null)", want);
    CASE_END();

    CASE_BEGIN("fa_tensor_contiguous and *_init");
    {
        float x[24];
        int64_t sh[3] = {2, 3, 4};
        fa_tensor t = fa_tensor_contiguous(x, FA_DTYPE_BF16, 3, sh);
        CHECK(t.data == x);
        CHECK_EQ_INT(t.dtype, FA_DTYPE_BF16);
        CHECK_EQ_INT(t.device, FA_DEVICE_CPU);
        CHECK_EQ_INT(t.ndim, 3);
        CHECK_EQ_INT(t.shape[0], 2);
        CHECK_EQ_INT(t.shape[2], 4);
        CHECK_EQ_INT(t.stride[0], 12);
        CHECK_EQ_INT(t.stride[1], 4);
        CHECK_EQ_INT(t.stride[2], 1);
        fa_params p;
        memset(&p, 0x5A, sizeof p);
        fa_params_init(&p);
        CHECK_EQ_INT(p.struct_size, sizeof p);
        CHECK(p.softmax_scale == 0.0f && p.causal == 0 && p.window_left == -1 &&
              p.window_right == -1 && p.softcap == 0.0f && p.alibi_slopes.data == NULL &&
              p.dropout_p == 0.0f);
        fa_context_options o;
        memset(&o, 0x5A, sizeof o);
        fa_context_options_init(&o);
        CHECK_EQ_INT(o.struct_size, sizeof o);
        CHECK_EQ_INT(o.num_threads, 0);
    }
    CASE_END();
}

int main(void) {
    /* The device cases tag host buffers as CUDA memory: keep them away from a real plug-in and GPU
     * (tests/test_cuda.c covers those), so they always meet the missing-plug-in error. */
    setenv("FA_CUDA_PLUGIN", "/nonexistent/flashattn-test_errors/libflashattn_cuda.so", 1);
    tu_seed_init("test_errors");
    group_begin();
    common_errors(0);
    group_end("fa_forward argument errors");
    group_begin();
    common_errors(1);
    varlen_errors();
    group_end("fa_varlen_forward argument errors");
    group_begin();
    dropout_mask_errors();
    group_end("fa_dropout_mask errors");
    group_begin();
    context_errors();
    group_end("context errors");
    group_begin();
    status_and_version();
    group_end("status codes, messages, version");
    return TEST_REPORT();
}
