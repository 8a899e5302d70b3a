/* SPDX-License-Identifier: MIT */
/*
 * plugin_abi.h — the contract between libflashattn (src/plugin.c) and the CUDA plug-in
 * (cuda/, libflashattn_cuda.so). Both sides are built from this tree; the handshake checks the
 * ABI version and the size of fa__problem so a stale plug-in is refused, never misread.
 *
 * The core validates every argument first (shapes, strides, dtypes, devices, overlaps, values),
 * so the plug-in receives only well-formed problems. In a problem handed to the plug-in:
 *   - the views' data, lse, alibi, sinks and dsinks are device pointers on `device`;
 *   - cu_q, cu_k and seqlens_k (when not NULL) are HOST arrays, already validated; the plug-in
 *     copies them to the device itself. They stay valid only until the call returns. So are a
 *     KV cache's indices: the views' row_off, block_table and batch_idx, and fa__kvcache_job's
 *     seqlens.
 * Functions return an fa_status value and, on error, write a one-line message into msg
 * (capacity cap, always NUL-terminated). Work is enqueued on `stream` (a cudaStream_t; NULL = the
 * legacy default stream) and may still be running when the function returns, as with any CUDA
 * call; host memory it was given may be reused at once.
 */
#ifndef FA_PLUGIN_ABI_H
#define FA_PLUGIN_ABI_H

#include "combine.h"
#include "problem.h"

#include <stddef.h>
#include <stdint.h>

#define FA__PLUGIN_ABI_VERSION 6u /* 2: backward, 3: KV cache and combine, 4: sinks, 5: Dv,
                                     6: fa__view.scale (8-bit caches; CPU only) */

/* The symbol the core looks up in the plug-in. */
#define FA__PLUGIN_ENTRY "fa_cuda_plugin_entry"

/* Directions for copy(). */
enum { FA__COPY_H2D = 0, FA__COPY_D2H = 1, FA__COPY_D2D = 2 };

/* What fa_forward_kvcache does before its forward (every array on the host, validated):
 *   1. the append: k_new/v_new (B, S_new, Hk, D) into the caches at positions seqlens[b] + i,
 *      through the caches' page table or batch index but not their leftpad (positions are
 *      absolute); k_new rotated first when rotary.cos is set;
 *   2. with rotary, q's row i of batch b rotated at position seqlens[b] + (shift_rows ? i : 0);
 * then the forward of the problem over the cache views (batch b: seqlens_k[b] keys from its
 * leftpad on). The append writes only rows no batch of the call reads before it (checked). */
typedef struct fa__kvcache_job {
    const int32_t *seqlens; /* [B] cache_seqlens */
    int64_t bt_cols;        /* paged: the columns of the block table, [B, bt_cols] at bt_stride */
    fa__view k_new, v_new;  /* data NULL: nothing to append */
    int64_t S_new;
    fa__rotary rotary; /* cos, sin: device pointers */
    int32_t shift_rows;
    int32_t num_splits; /* the decode's splits over the keys, 0 = chosen by the plug-in */
} fa__kvcache_job;

typedef struct fa__plugin_api {
    uint32_t abi_version;  /* FA__PLUGIN_ABI_VERSION the plug-in was built with */
    uint32_t problem_size; /* sizeof(fa__problem) the plug-in was built with */
    const char *build;     /* e.g. "CUDA runtime 13.0 (static), sm_80 sm_90 + PTX" */

    /* Number of CUDA devices (0 is not an error: *count = 0 and FA_OK). An error only when the
     * driver cannot be used at all (missing, too old); msg says why. */
    int (*device_count)(int *count, char *msg, size_t cap);
    /* One line about the device: "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB". */
    int (*device_describe)(int device, char *buf, size_t bufcap, char *msg, size_t cap);

    /* Device memory for tests, tools and C users without the CUDA toolkit. */
    int (*alloc)(int device, size_t bytes, void **ptr, char *msg, size_t cap);
    int (*release)(int device, void *ptr, char *msg, size_t cap);
    /* Copies bytes in direction kind (FA__COPY_*), ordered on stream, and returns when the copy
     * has completed (it synchronizes the stream). */
    int (*copy)(void *dst, const void *src, size_t bytes, int kind, int device, void *stream,
                char *msg, size_t cap);

    /* fa_forward / fa_varlen_forward: out (and lse when not NULL) written, every feature of
     * fa__problem (causal/window, softcap, ALiBi, GQA, varlen, dropout). Errors: FA_ERR_DEVICE
     * (bad device index, launch failure), FA_ERR_NO_MEMORY, FA_ERR_UNSUPPORTED. */
    int (*forward)(const fa__problem *p, int device, void *stream, char *msg, size_t cap);

    /* fa_dropout_mask: p holds B, H, Sq, Sk and the dropout fields; the mask is p->out with dtype
     * U8 and element (b, h, i, j) at data + b*sb + h*sh + i*ss + j*sd. */
    int (*dropout_mask)(const fa__problem *p, int device, void *stream, char *msg, size_t cap);

    /* fa_backward / fa_varlen_backward: dq, dk and dv written (varlen rows outside every
     * sequence: 0) from q, k, v, out, dout and the forward's lse, every feature of the forward,
     * and dsinks when p->dsinks is set;
     * deterministic (the same bits on every run). Errors as forward. */
    int (*backward)(const fa__problem *p, int device, void *stream, char *msg, size_t cap);

    /* fa_forward_kvcache: job's append and rotary, then out (and lse) of p over the caches,
     * with causal/window, softcap, ALiBi and GQA; no dropout. Errors as forward. */
    int (*kvcache)(const fa__problem *p, const fa__kvcache_job *job, int device, void *stream,
                   char *msg, size_t cap);

    /* fa_combine: out (and lse when not NULL) of c's rows, as combine.h defines them (its
     * pointers on `device`). Errors as forward. */
    int (*combine)(const fa__combine *c, int device, void *stream, char *msg, size_t cap);
} fa__plugin_api;

/* The plug-in's one exported function: its table if it speaks abi_version, else NULL. */
typedef const fa__plugin_api *(*fa__plugin_entry_fn)(uint32_t abi_version);

#endif /* FA_PLUGIN_ABI_H */
