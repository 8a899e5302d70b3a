/* SPDX-License-Identifier: MIT */
/*
 * fake_cuda_plugin.c — a stand-in for libflashattn_cuda.so for machines without a GPU: one
 * "CUDA device" whose memory is host memory, and a forward, backward and combine that are
 * libflashattn's own CPU ones through the public API. ctest runs test_cuda against it (test_cuda_fake), so the
 * core's whole CUDA path — loading and handshake, validation of CUDA tensors, device_index,
 * cu_seqlens copied back from the device, dropout_mask routing, the stream argument — and
 * test_cuda's own checks run in CI. It says nothing about the real kernels (tests/test_cuda.c
 * against cuda/ does that on a GPU).
 */
#include "flashattn.h"
#include "plugin_abi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int device_ok(int device, char *msg, size_t cap) {
    if (device == 0) return 1;
    snprintf(msg, cap, "fake plug-in: no device %d", device);
    return 0;
}

static int status(fa_status st, char *msg, size_t cap) {
    if (st != FA_OK) snprintf(msg, cap, "fake plug-in: %s", fa_last_error_message());
    return st;
}

static int device_count(int *count, char *msg, size_t cap) {
    (void)msg, (void)cap;
    *count = 1;
    return FA_OK;
}

/* FA_FAKE_DESCRIBE_FAIL set: fails as a driver might (test_device_describe --fake). */
static int device_describe(int device, char *buf, size_t bufcap, char *msg, size_t cap) {
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    if (getenv("FA_FAKE_DESCRIBE_FAIL")) {
        snprintf(msg, cap, "fake plug-in: device_describe failed (FA_FAKE_DESCRIBE_FAIL is set)");
        return FA_ERR_INTERNAL;
    }
    snprintf(buf, bufcap, "fake device (host memory)");
    return FA_OK;
}

static int alloc(int device, size_t bytes, void **ptr, char *msg, size_t cap) {
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    *ptr = malloc(bytes);
    return *ptr ? FA_OK : FA_ERR_NO_MEMORY;
}

static int release(int device, void *ptr, char *msg, size_t cap) {
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    free(ptr);
    return FA_OK;
}

static int copy(void *dst, const void *src, size_t bytes, int kind, int device, void *stream,
                char *msg, size_t cap) {
    (void)kind, (void)stream;
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    memmove(dst, src, bytes);
    return FA_OK;
}

/* A tensor over view v with the given shape (logical dimensions (b,) s, h, d). */
static fa_tensor tensor(const fa__view *v, int ndim, int64_t b, int64_t s, int64_t h, int64_t d) {
    const int64_t shape4[4] = {b, s, h, d}, stride4[4] = {v->sb, v->ss, v->sh, v->sd};
    const int o = 4 - ndim;
    fa_tensor t = fa_tensor_contiguous(v->data, v->dtype, ndim, shape4 + o);
    for (int i = 0; i < ndim; i++) t.stride[i] = stride4[i + o];
    return t;
}

/* The call's parameters as fa_params (causal is already folded into the window). */
static fa_params params_of(const fa__problem *p) {
    fa_params prm;
    fa_params_init(&prm);
    prm.softmax_scale = p->scale;
    prm.window_left = p->window_left;
    prm.window_right = p->window_right;
    prm.softcap = p->softcap;
    prm.dropout_p = p->dropout_p;
    prm.dropout_seed = p->dropout_seed;
    prm.dropout_offset = p->dropout_offset;
    if (p->alibi) {
        const int64_t shape[2] = {p->B, p->H};
        prm.alibi_slopes = fa_tensor_contiguous((void *)p->alibi, FA_DTYPE_F32, 2, shape);
        prm.alibi_slopes.stride[0] = p->alibi_sb;
        prm.alibi_slopes.stride[1] = p->alibi_sh;
    }
    if (p->sinks) {
        prm.sinks = fa_tensor_contiguous((void *)p->sinks, FA_DTYPE_F32, 1, &p->H);
        prm.sinks.stride[0] = p->sinks_sh;
    }
    if (p->dsinks) {
        prm.dsinks = fa_tensor_contiguous(p->dsinks, FA_DTYPE_F32, 1, &p->H);
        prm.dsinks.stride[0] = p->dsinks_sh;
    }
    return prm;
}

/* The tensors of a call over p's views: fixed length (4-d) or varlen (3-d, packed rows). */
typedef struct call_tensors {
    fa_tensor q, k, v, out, dout, dq, dk, dv, lse, cu_q, cu_k;
} call_tensors;

static call_tensors tensors_of(const fa__problem *p, int backward) {
    call_tensors t;
    memset(&t, 0, sizeof t);
    const int varlen = p->cu_q != NULL, nd = varlen ? 3 : 4;
    const int64_t sq = varlen ? p->total_q : p->Sq, sk = varlen ? p->total_k : p->Sk;
    t.q = tensor(&p->q, nd, p->B, sq, p->H, p->D);
    t.k = tensor(&p->k, nd, p->B, sk, p->Hk, p->D);
    t.v = tensor(&p->v, nd, p->B, sk, p->Hk, p->Dv);
    t.out = tensor(&p->out, nd, p->B, sq, p->H, p->Dv);
    if (backward) {
        t.dout = tensor(&p->dout, nd, p->B, sq, p->H, p->Dv);
        t.dq = tensor(&p->dq, nd, p->B, sq, p->H, p->D);
        t.dk = tensor(&p->dk, nd, p->B, sk, p->Hk, p->D);
        t.dv = tensor(&p->dv, nd, p->B, sk, p->Hk, p->Dv);
    }
    if (varlen) {
        const int64_t ls[2] = {p->H, p->total_q}, ncu = p->B + 1;
        t.lse = fa_tensor_contiguous(p->lse, FA_DTYPE_F32, 2, ls);
        t.lse.stride[0] = p->lse_sh, t.lse.stride[1] = p->lse_ss;
        /* cu_q/cu_k are the core's host copies, as the real plug-in receives them */
        t.cu_q = fa_tensor_contiguous((void *)p->cu_q, FA_DTYPE_I32, 1, &ncu);
        t.cu_k = fa_tensor_contiguous((void *)p->cu_k, FA_DTYPE_I32, 1, &ncu);
    } else {
        const int64_t ls[3] = {p->B, p->H, p->Sq};
        t.lse = fa_tensor_contiguous(p->lse, FA_DTYPE_F32, 3, ls);
        t.lse.stride[0] = p->lse_sb, t.lse.stride[1] = p->lse_sh, t.lse.stride[2] = p->lse_ss;
    }
    return t;
}

/* As cuda/plugin.cu: FA_CUDA_KERNELS must name one of its kernel choices (here it chooses
 * nothing: the work is the CPU's). */
static int kernels_ok(char *msg, size_t cap) {
    const char *k = getenv("FA_CUDA_KERNELS");
    if (!k || !*k || strcmp(k, "auto") == 0 || strcmp(k, "sm75") == 0 || strcmp(k, "simple") == 0)
        return 1;
    snprintf(msg, cap, "fake plug-in: FA_CUDA_KERNELS is \"%.32s\"; expected auto, sm75 or simple",
             k);
    return 0;
}

static int forward(const fa__problem *p, int device, void *stream, char *msg, size_t cap) {
    (void)stream;
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    /* As cuda/plugin.cu: FA_CUDA_TILE_D128 must name one of the real kernel's tiles (here it
     * chooses nothing: the forward is the CPU's). */
    const char *tile = getenv("FA_CUDA_TILE_D128");
    if (tile && *tile && strcmp(tile, "128x32") != 0 && strcmp(tile, "128x64") != 0) {
        snprintf(msg, cap,
                 "fake plug-in: FA_CUDA_TILE_D128 is \"%.32s\"; expected 128x32 or 128x64", tile);
        return FA_ERR_VALUE;
    }
    if (!kernels_ok(msg, cap)) return FA_ERR_VALUE;
    const fa_params prm = params_of(p);
    const call_tensors t = tensors_of(p, 0);
    const fa_tensor *lse = p->lse ? &t.lse : NULL;
    if (!p->cu_q) return status(fa_forward(NULL, &prm, &t.q, &t.k, &t.v, &t.out, lse), msg, cap);
    return status(fa_varlen_forward(NULL, &prm, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, p->Sq, p->Sk,
                                    &t.out, lse),
                  msg, cap);
}

static int backward(const fa__problem *p, int device, void *stream, char *msg, size_t cap) {
    (void)stream;
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    if (!kernels_ok(msg, cap)) return FA_ERR_VALUE;
    const fa_params prm = params_of(p);
    const call_tensors t = tensors_of(p, 1);
    if (!p->cu_q)
        return status(fa_backward(NULL, &prm, &t.q, &t.k, &t.v, &t.out, &t.dout, &t.lse, &t.dq,
                                  &t.dk, &t.dv),
                      msg, cap);
    return status(fa_varlen_backward(NULL, &prm, &t.q, &t.k, &t.v, &t.out, &t.dout, &t.lse,
                                     &t.cu_q, &t.cu_k, p->Sq, p->Sk, &t.dq, &t.dk, &t.dv),
                  msg, cap);
}

static int dropout_mask(const fa__problem *p, int device, void *stream, char *msg, size_t cap) {
    (void)stream;
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    fa_params prm;
    fa_params_init(&prm);
    prm.dropout_p = p->dropout_p;
    prm.dropout_seed = p->dropout_seed;
    prm.dropout_offset = p->dropout_offset;
    const int64_t shape[4] = {p->B, p->H, p->Sq, p->Sk};
    fa_tensor m = fa_tensor_contiguous(p->out.data, FA_DTYPE_U8, 4, shape);
    m.stride[0] = p->out.sb, m.stride[1] = p->out.sh, m.stride[2] = p->out.ss, m.stride[3] = p->out.sd;
    return status(fa_dropout_mask(&prm, &m), msg, cap);
}

/* The KV cache needs device kernels (append, rotary, page table) that this stand-in does not
 * imitate: the emulated plug-in (tests/cuda_emu) and a GPU test fa_forward_kvcache on CUDA. */
static int kvcache(const fa__problem *p, const fa__kvcache_job *job, int device, void *stream,
                   char *msg, size_t cap) {
    (void)p, (void)job, (void)stream;
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    snprintf(msg, cap, "fake plug-in: no KV cache (run the emulated plug-in)");
    return FA_ERR_UNSUPPORTED;
}

static int combine(const fa__combine *c, int device, void *stream, char *msg, size_t cap) {
    (void)stream;
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
    const int64_t ps[4] = {c->B, c->S, c->H, c->D};
    fa_tensor op = fa_tensor_contiguous((void *)c->op, FA_DTYPE_F32, 4, ps);
    fa_tensor lp = fa_tensor_contiguous((void *)c->lp, FA_DTYPE_F32, 3, ps);
    fa_tensor out = fa_tensor_contiguous(c->out.data, (fa_dtype)c->out.dtype, 4, ps);
    fa_tensor lse = fa_tensor_contiguous(c->lse, FA_DTYPE_F32, 3, ps);
    for (int i = 0; i < 4; i++) op.stride[i] = c->op_s[i + 1];
    for (int i = 0; i < 3; i++) lp.stride[i] = c->lp_s[i + 1], lse.stride[i] = c->lse_s[i];
    out.stride[0] = c->out.sb, out.stride[1] = c->out.ss, out.stride[2] = c->out.sh;
    out.stride[3] = c->out.sd;
    return status(fa_combine(NULL, NULL, c->n, &op, c->op_s[0], &lp, c->lp_s[0], &out,
                             c->lse ? &lse : NULL),
                  msg, cap);
}

static const fa__plugin_api api = {
    FA__PLUGIN_ABI_VERSION, (uint32_t)sizeof(fa__problem), "fake plug-in for tests (host memory)",
    device_count, device_describe, alloc,   release,      copy,     forward,
    dropout_mask, backward,        kvcache, combine};

__attribute__((visibility("default"))) const fa__plugin_api *fa_cuda_plugin_entry(uint32_t abi) {
    return abi == FA__PLUGIN_ABI_VERSION ? &api : NULL;
}
