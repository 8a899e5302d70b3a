/* SPDX-License-Identifier: MIT */
/*
 * fake_cuda_plugin.c — a stand-in for libflashattn_cuda.so for machines without a GPU: one
 * "CUDA device" whose memory is host memory, and a forward that is libflashattn's own CPU
 * forward through the public API. ctest runs test_cuda against it (test_cuda_fake), so the
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

static int device_describe(int device, char *buf, size_t bufcap, char *msg, size_t cap) {
    if (!device_ok(device, msg, cap)) return FA_ERR_DEVICE;
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
    fa_params prm;
    fa_params_init(&prm);
    prm.softmax_scale = p->scale;
    prm.window_left = p->window_left;
    prm.window_right = p->window_right; /* causal is already folded in */
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
    if (!p->cu_q) {
        const fa_tensor q = tensor(&p->q, 4, p->B, p->Sq, p->H, p->D);
        const fa_tensor k = tensor(&p->k, 4, p->B, p->Sk, p->Hk, p->D);
        const fa_tensor v = tensor(&p->v, 4, p->B, p->Sk, p->Hk, p->D);
        const fa_tensor o = tensor(&p->out, 4, p->B, p->Sq, p->H, p->D);
        const int64_t ls[3] = {p->B, p->H, p->Sq};
        fa_tensor l = fa_tensor_contiguous(p->lse, FA_DTYPE_F32, 3, ls);
        l.stride[0] = p->lse_sb, l.stride[1] = p->lse_sh, l.stride[2] = p->lse_ss;
        return status(fa_forward(NULL, &prm, &q, &k, &v, &o, p->lse ? &l : NULL), msg, cap);
    }
    const fa_tensor q = tensor(&p->q, 3, 0, p->total_q, p->H, p->D);
    const fa_tensor k = tensor(&p->k, 3, 0, p->total_k, p->Hk, p->D);
    const fa_tensor v = tensor(&p->v, 3, 0, p->total_k, p->Hk, p->D);
    const fa_tensor o = tensor(&p->out, 3, 0, p->total_q, p->H, p->D);
    const int64_t ls[2] = {p->H, p->total_q}, ncu = p->B + 1;
    fa_tensor l = fa_tensor_contiguous(p->lse, FA_DTYPE_F32, 2, ls);
    l.stride[0] = p->lse_sh, l.stride[1] = p->lse_ss;
    /* cu_q/cu_k are the core's host copies, as the real plug-in receives them */
    const fa_tensor cq = fa_tensor_contiguous((void *)p->cu_q, FA_DTYPE_I32, 1, &ncu);
    const fa_tensor ck = fa_tensor_contiguous((void *)p->cu_k, FA_DTYPE_I32, 1, &ncu);
    return status(fa_varlen_forward(NULL, &prm, &q, &k, &v, &cq, &ck, p->Sq, p->Sk, &o,
                                    p->lse ? &l : NULL),
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

static const fa__plugin_api api = {
    FA__PLUGIN_ABI_VERSION, (uint32_t)sizeof(fa__problem), "fake plug-in for tests (host memory)",
    device_count, device_describe, alloc, release, copy, forward, dropout_mask};

__attribute__((visibility("default"))) const fa__plugin_api *fa_cuda_plugin_entry(uint32_t abi) {
    return abi == FA__PLUGIN_ABI_VERSION ? &api : NULL;
}
