/* SPDX-License-Identifier: MIT */
/*
 * flashattn.h — the one public header of libflashattn: exact, fused, tiled attention
 * (FlashAttention) behind a plain C ABI.
 *
 * Everything here is C types only. The library exports exactly the fa_* functions below and
 * depends only on libc, libm, libpthread and libdl, so there is no C++ ABI to match.
 *
 * Conventions
 *  - Every entry point returns fa_status: FA_OK (0) on success, a negative code on error.
 *    fa_strerror() names the code; fa_last_error_message() gives the calling thread's message
 *    for its most recent failed call, naming the offending argument and what was expected.
 *  - Arguments are validated completely before anything is written: on any error, no output
 *    (out, lse) has been touched.
 *  - Tensors are strided views (fa_tensor): shapes and strides are in elements, not bytes, so
 *    BSHD (flash-attn) and BHSD (PyTorch SDPA) layouts work without copies.
 *  - Structs that may grow (fa_params, fa_context_options) begin with struct_size and must be
 *    filled by their *_init function first; fields are only ever appended.
 *
 * Semantics follow flash-attn 2.x; see README.md and docs/semantics.md for the differences
 * (fp32 support, any head dim 1..256, lse = -inf for fully masked rows).
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FA_BUILDING_SHARED)
#define FA_API __declspec(dllexport)
#elif defined(_WIN32) && defined(FA_USING_SHARED)
#define FA_API __declspec(dllimport)
#elif defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0
#define FA_VERSION_HEX ((FA_VERSION_MAJOR << 16) | (FA_VERSION_MINOR << 8) | FA_VERSION_PATCH)

/* The version of the library actually loaded, as FA_VERSION_HEX. Compare it with the macro to
 * detect a header/library mismatch. Thread-safe. */
FA_API unsigned fa_version(void);

/* The same version as "MAJOR.MINOR.PATCH". Static storage; never NULL. Thread-safe. */
FA_API const char *fa_version_string(void);

/* A one-line, human-readable description of the build: version, compiler, CPU kernels compiled
 * in and the one chosen for this machine, and the CUDA plug-in (loaded, or why not). Static
 * storage; never NULL. Thread-safe. */
FA_API const char *fa_build_info(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */

/* XX(NAME, value, description): one list generates the enum, fa_status_name and fa_strerror. */
#define FA_STATUS_MAP(XX)                                                                          \
    XX(OK, 0, "success")                                                                           \
    XX(ERR_NULL_POINTER, -1, "a required pointer is NULL")                                         \
    XX(ERR_RANK, -2, "a tensor has the wrong number of dimensions")                                \
    XX(ERR_SHAPE, -3, "a tensor has the wrong shape")                                              \
    XX(ERR_DTYPE, -4, "a tensor has an unsupported or mismatched dtype")                           \
    XX(ERR_STRIDE, -5, "a tensor has invalid strides")                                             \
    XX(ERR_OVERLAP, -6, "an output overlaps an input or another output")                           \
    XX(ERR_VALUE, -7, "a parameter has an invalid value")                                          \
    XX(ERR_DEVICE, -8, "a tensor is on an unsupported or mismatched device")                       \
    XX(ERR_STRUCT_SIZE, -9, "a struct's struct_size is not one this library knows")                \
    XX(ERR_NO_MEMORY, -10, "out of memory")                                                        \
    XX(ERR_UNSUPPORTED, -11, "the configuration is not supported by this build")                   \
    XX(ERR_INTERNAL, -12, "internal error")                                                        \
    XX(ERR_CANCELLED, -13, "the call was cancelled through params.cancel")

typedef enum fa_status {
#define FA_STATUS_ENUM_(name, value, text) FA_##name = value,
    FA_STATUS_MAP(FA_STATUS_ENUM_)
#undef FA_STATUS_ENUM_
} fa_status;

/* "FA_OK", "FA_ERR_SHAPE", ...; "FA_ERR_UNKNOWN" for a value not in the list. Static storage. */
FA_API const char *fa_status_name(fa_status status);

/* A short English description of the code; "unknown status code" for a value not in the list.
 * Static storage. Thread-safe. */
FA_API const char *fa_strerror(fa_status status);

/* The message of the calling thread's most recent failed call, e.g.
 * "k: shape[2] (KV heads) is 3, which does not divide q's 8 heads". After a successful call it
 * is the empty string. Thread-local storage, valid until the thread's next call into the
 * library; never NULL. */
FA_API const char *fa_last_error_message(void);

/* ---------------------------------------------------------------------------------------------
 * Tensor views
 * ------------------------------------------------------------------------------------------- */

/* Element types. Stored as int32_t in structs so their size does not depend on the compiler. */
typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,  /* IEEE binary32 */
    FA_DTYPE_F16 = 1,  /* IEEE binary16 */
    FA_DTYPE_BF16 = 2, /* bfloat16 (the upper half of a binary32) */
    FA_DTYPE_I32 = 3,  /* int32, for cu_seqlens */
    FA_DTYPE_U8 = 4,   /* uint8, for the dropout mask */
    /* 8-bit KV caches only (fa_kvcache.k_scale says how a stored value is read) */
    FA_DTYPE_I8 = 5,      /* int8, two's complement (-128 reads as -128; the append writes
                             -127..127) */
    FA_DTYPE_F8_E4M3 = 6, /* fp8 e4m3fn (OCP FP8): sign, 4 exponent bits (bias 7), 3 mantissa
                             bits, subnormals, no infinity, NaN = S.1111.111, largest 448 */
    FA_DTYPE_F8_E5M2 = 7  /* fp8 e5m2 (OCP FP8): the upper byte of an fp16 (bias 15),
                             infinities and NaN, largest 57344 */
} fa_dtype;

typedef enum fa_device {
    FA_DEVICE_CPU = 0, /* host memory */
    FA_DEVICE_CUDA = 1 /* CUDA device memory of device device_index (needs the CUDA plug-in,
                          libflashattn_cuda.so, found next to libflashattn.so at run time) */
} fa_device;

#define FA_MAX_DIMS 4

/* A strided view of memory the caller owns; the library never frees or retains it.
 * Element (i0, i1, ..) lives at data + sum_k i_k * stride[k] elements. Only the first ndim
 * entries of shape and stride are read. Strides must be >= 0. An output's dimensions must nest:
 * taken in order of increasing stride (ignoring dimensions of size 1), each stride must exceed
 * the span of the dimensions before it, so no two elements share an address (this rejects a zero
 * stride on a dimension of size > 1, and a few exotic interleavings that would not alias). */
typedef struct fa_tensor {
    void *data;
    int32_t dtype;  /* fa_dtype */
    int32_t device; /* fa_device */
    int32_t device_index;
    int32_t ndim; /* 1..FA_MAX_DIMS */
    int64_t shape[FA_MAX_DIMS];
    int64_t stride[FA_MAX_DIMS];
} fa_tensor;

/* A view of contiguous (row-major) memory of the given dtype and shape: strides are computed,
 * device is CPU. ndim must be 1..FA_MAX_DIMS; extra shape entries are ignored. */
FA_API fa_tensor fa_tensor_contiguous(void *data, fa_dtype dtype, int32_t ndim,
                                      const int64_t *shape);

/* ---------------------------------------------------------------------------------------------
 * Context: thread pool and scratch
 * ------------------------------------------------------------------------------------------- */

typedef struct fa_context fa_context;

typedef struct fa_context_options {
    uint32_t struct_size; /* sizeof(fa_context_options), set by fa_context_options_init */
    /* Worker threads, the calling thread included. 0 = the FA_NUM_THREADS environment variable
     * if set, else the number of CPUs this process may run on. */
    int32_t num_threads;
} fa_context_options;

/* Fills *opts with the defaults and sets struct_size. */
FA_API void fa_context_options_init(fa_context_options *opts);

/* Creates a context owning a pool of num_threads - 1 worker threads (the caller is the last).
 * Idle threads poll for more work for FA_SPIN_US microseconds (0..100000, default 50) before
 * they sleep. opts may be NULL for the defaults. On success *out is the new context; on error
 * *out is left unchanged. Errors: FA_ERR_NULL_POINTER (out), FA_ERR_STRUCT_SIZE, FA_ERR_VALUE
 * (num_threads < 0 or > 1024, or a malformed FA_NUM_THREADS or FA_SPIN_US), FA_ERR_NO_MEMORY. */
FA_API fa_status fa_context_create(const fa_context_options *opts, fa_context **out);

/* Stops the context's threads and frees it. NULL is a no-op. Must not be called while another
 * thread is inside a call that uses the context. */
FA_API void fa_context_destroy(fa_context *ctx);

/* The number of threads the context computes with (the calling thread included). NULL means the
 * default context, which is created on first use. Returns a value >= 1. */
FA_API int32_t fa_context_num_threads(fa_context *ctx);

/* Thread safety: a context may be shared by several threads; calls that use it run one at a
 * time (each call uses all of its threads). Passing NULL as the context uses a process-wide
 * default context, created on first use in a thread-safe way and sized as for
 * num_threads = 0. For concurrent independent calls, give each calling thread its own context. */

/* ---------------------------------------------------------------------------------------------
 * Attention parameters
 * ------------------------------------------------------------------------------------------- */

typedef struct fa_params {
    uint32_t struct_size; /* sizeof(fa_params), set by fa_params_init */
    /* Scale applied to q·k. 0 = the default 1/sqrt(D). Any other finite value is used as is. */
    float softmax_scale;
    /* Nonzero = causal, bottom-right aligned: key j is visible to query i iff j <= i + Sk - Sq.
     * It forces window_right to 0 and combines with window_left. */
    int32_t causal;
    /* Sliding window: query i sees keys in [i + Sk - Sq - window_left, i + Sk - Sq + window_right].
     * -1 = unbounded on that side. Values < -1 are an error. */
    int32_t window_left;
    int32_t window_right;
    /* Softcap c: the score becomes c * tanh(softmax_scale * q·k / c). 0 = off; < 0 or non-finite
     * is an error. */
    float softcap;
    /* ALiBi slopes, fp32 on the same device as q, shape (H) or (B, H); data == NULL = none.
     * Adds -slope * |i + Sk - Sq - j| to the (scaled, softcapped) score. */
    fa_tensor alibi_slopes;
    /* Dropout on the normalized probabilities: each is dropped with probability dropout_p and
     * kept ones are scaled by 1/(1 - dropout_p). 0 = off; must be in [0, 1). The mask is a pure
     * function of (dropout_seed, dropout_offset, batch, head, row, column) through
     * Philox-4x32-10, so the backward, fa_dropout_mask and the CUDA plug-in reproduce it exactly,
     * on any thread count. The forward's lse ignores dropout. */
    float dropout_p;
    uint64_t dropout_seed;
    uint64_t dropout_offset;
    /* CUDA tensors only: the cudaStream_t the work is enqueued on. NULL = the legacy default
     * stream. Calls return once the work is enqueued (like any CUDA call), except that
     * varlen calls with cu_seqlens in device memory first wait for the stream to read them. */
    void *cuda_stream;
    /* Cancellation: NULL, or a flag the caller owns and may set to nonzero from any thread while
     * the call runs (an atomic store: C11 atomic_store on an _Atomic int32_t, or
     * __atomic_store_n). The library only reads it: between its tasks and, inside them, before
     * each block of keys (forward) or query rows (backward), so a call stops within about one
     * block's time and returns FA_ERR_CANCELLED. A flag already set when the call starts returns FA_ERR_CANCELLED after
     * the arguments are checked and before anything is written. After a cancelled call its
     * outputs are unspecified (fa_forward_kvcache has appended k_new/v_new), memory is released
     * and the context is usable. fa_forward, fa_varlen_forward, fa_backward, fa_varlen_backward,
     * fa_forward_kvcache and fa_combine honour it; the CUDA plug-in and fa_dropout_mask ignore
     * it. */
    const int32_t *cancel;
    /* Attention sinks (gpt-oss's `sinks`, flash-attn's learnable_sink): fp32 (H) on q's device,
     * data == NULL = none. sinks[h] is one more logit in every softmax row of query head h, with
     * no value vector, compared as is (not scaled, softcapped or biased):
     *   out_i = sum_j exp(S_ij - M) v_j / (sum_j exp(S_ij - M) + exp(sinks[h] - M)),
     * and lse includes it: lse_i = log(sum_j exp(S_ij) + exp(sinks[h])). A row that sees no key
     * gets out = 0 and lse = sinks[h]; varlen rows outside every sequence stay 0 and -inf.
     * Values must be finite or -inf (-inf: no sink for that head). The backward needs the
     * forward's out and lse computed with the same sinks. fa_forward, fa_varlen_forward,
     * fa_forward_kvcache, fa_backward and fa_varlen_backward honour it on CPU and CUDA
     * tensors. fa_combine knows no sinks: combine partials
     * computed without sinks (each partial with the sink would count it once per partial). */
    fa_tensor sinks;
    /* The sinks' gradient: fp32 (H) on q's device, written by fa_backward and
     * fa_varlen_backward when sinks and dsinks.data are given (data NULL = not wanted; an error
     * without sinks); ignored by the forwards. dsinks[h] = -sum_{b,i} exp(sinks[h] - lse_bhi) ·
     * sum_d dout_bihd out_bihd (the inner sum the backward's fp32 one), summed in fp64 in the
     * order b, i, so the result is the same on any thread count. Must not overlap any other
     * tensor of the call. */
    fa_tensor dsinks;
} fa_params;

/* Fills *params with the defaults (no causal mask, no window, no softcap, no ALiBi, no sinks,
 * default scale) and sets struct_size. */
FA_API void fa_params_init(fa_params *params);

/* ---------------------------------------------------------------------------------------------
 * Forward
 * ------------------------------------------------------------------------------------------- */

/* Attention forward over fixed-length batches: out = softmax(scale · q kᵀ + masks) v.
 *
 *   q    (B, Sq, H, D)    fp32 | fp16 | bf16
 *   k    (B, Sk, Hk, D)   same dtype as q; Hk divides H (query head h uses KV head h / (H/Hk))
 *   v    (B, Sk, Hk, Dv)  same dtype as k, k's shape but for its head dim Dv (1..256, D or not;
 *                         on CUDA, Dv != D runs the plug-in's stage-1 kernels)
 *   out  (B, Sq, H, Dv)   same dtype as q, or fp32 for fp16/bf16 q; written
 *   lse  (B, H, Sq)       fp32, may be NULL; written with the natural-log logsumexp of each row
 *                         of the scores (after scale, softcap and ALiBi)
 *
 * An fp32 out of fp16/bf16 inputs holds the fp32 accumulator's O / l without the rounding to 16
 * bits: for partial results that fa_combine will merge (ring attention), whose error the rounding
 * of each part would add to.
 *
 * Dimensions are in this logical order whatever the memory layout: pass a BHSD tensor by
 * permuting its strides. D is 1..256. Any dimension but H, Hk and D may be 0. Sk = 0 or a row
 * with every key masked gives out = 0 and lse = -inf for that row.
 *
 * ctx may be NULL (the default context). params may be NULL (the defaults). No pointer is
 * retained after the call returns. out and lse must not overlap each other or any input.
 *
 * Scores are computed in fp32: scale, softcap and inputs must keep scale·q·k (and, with softcap,
 * scale/softcap) within fp32 range.
 *
 * Errors: FA_ERR_NULL_POINTER, FA_ERR_RANK, FA_ERR_SHAPE, FA_ERR_DTYPE, FA_ERR_STRIDE,
 * FA_ERR_OVERLAP, FA_ERR_VALUE (window, softcap, scale, dropout_p; with ctx NULL a malformed
 * FA_NUM_THREADS or FA_SPIN_US; on CUDA tensors a malformed FA_CUDA_TILE_D128 or
 * FA_CUDA_KERNELS), FA_ERR_DEVICE, FA_ERR_STRUCT_SIZE, FA_ERR_UNSUPPORTED (D > 256; a CUDA GPU
 * the plug-in has no code for), FA_ERR_NO_MEMORY, FA_ERR_CANCELLED (params.cancel). On error
 * nothing has been written, except by a call cancelled while it ran. */
FA_API fa_status fa_forward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                            const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                            const fa_tensor *lse);

/* Attention forward over variable-length sequences packed along the first dimension.
 *
 *   q             (total_q, H, D)
 *   k, v          (total_k, Hk, D)
 *   cu_seqlens_q  (B + 1) int32: sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
 *   cu_seqlens_k  (B + 1) int32: likewise for keys and values; both must start at >= 0, never
 *                 decrease and end at <= total_q / total_k
 *   max_seqlen_q, max_seqlen_k   upper bounds on the sequence lengths (an error if exceeded;
 *                                 any larger value is valid: the work follows cu_seqlens)
 *   out           (total_q, H, D), q's dtype or fp32 for fp16/bf16 q (as fa_forward), written
 *   lse           (H, total_q) fp32, may be NULL
 *
 * Causal alignment, windows and ALiBi use each sequence's own lengths. Sequences may be empty.
 * Rows of out and lse outside every sequence are written as 0 and -inf. ALiBi slopes are (H) or
 * (B, H). Errors as fa_forward. */
FA_API fa_status fa_varlen_forward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                                   const fa_tensor *k, const fa_tensor *v,
                                   const fa_tensor *cu_seqlens_q, const fa_tensor *cu_seqlens_k,
                                   int64_t max_seqlen_q, int64_t max_seqlen_k,
                                   const fa_tensor *out, const fa_tensor *lse);

/* ---------------------------------------------------------------------------------------------
 * KV cache (inference)
 * ------------------------------------------------------------------------------------------- */

/* The cache side of fa_forward_kvcache, flash-attn's flash_attn_with_kvcache. Fill it with
 * fa_kvcache_init, then set the tensors you use; a tensor whose data is NULL is absent. All
 * tensors are on q's device, except that the int32 ones (cache_seqlens, cache_batch_idx,
 * cache_leftpad, block_table) may be on the host with CUDA q; k/v tensors share q's dtype,
 * except 8-bit caches (k_scale). */
typedef struct fa_kvcache {
    uint32_t struct_size; /* sizeof(fa_kvcache), set by fa_kvcache_init */
    /* (B_cache, S_cache, Hk, D); or, with block_table, paged: (num_pages, page_size, Hk, D)
     * with any page_size >= 1; v_cache (and v_new) with Dv, v's head dim, in place of D (CUDA:
     * Dv = D only).
     * Written in place when k_new/v_new are given. */
    fa_tensor k_cache, v_cache;
    /* Optional new keys and values (B, S_new, Hk, D), written into the cache at positions
     * [cache_seqlens[b], cache_seqlens[b] + S_new) before attending. Need cache_seqlens. */
    fa_tensor k_new, v_new;
    /* (B) int32: the tokens already in each cache row. Absent: cache_seqlen for every row. */
    fa_tensor cache_seqlens;
    /* Used when cache_seqlens is absent: the same length for every row; -1 (the default) means
     * the whole cache (S_cache, or max_pages * page_size when paged). */
    int64_t cache_seqlen;
    /* (B) int32: the cache row of batch b (default: row b). Not with block_table. With k_new,
     * two batches may not share a row. */
    fa_tensor cache_batch_idx;
    /* (B) int32: the first valid position of each row; keys before it are ignored. Not with
     * block_table. */
    fa_tensor cache_leftpad;
    /* (B, max_pages) int32: page p of batch b's sequence is block_table[b, p]. With k_new, a
     * page an append writes must not be in another batch's table (read-only pages, such as a
     * shared prefix, may be shared). Positions are int32: cache_seqlens + S_new < 2^31. */
    fa_tensor block_table;
    /* (seqlen_ro, rotary_dim / 2), q's dtype or fp32: rotary embedding of q and k_new (so it
     * needs k_new). k_new row i is rotated at position cache_seqlens[b] + i; q row i at
     * cache_seqlens[b] + i with causal or a window, else at cache_seqlens[b]. Only the first
     * rotary_dim dims are rotated. */
    fa_tensor rotary_cos, rotary_sin;
    /* 1 (the default): rotate pairs (2t, 2t+1); 0: pairs (t, t + rotary_dim/2) (GPT-NeoX). */
    int32_t rotary_interleaved;
    /* flash-attn's split count, 0 (automatic) to 128. Accepted for compatibility: the CPU always
     * splits a cache into chunks whose size depends only on its length (1024 keys, or an eighth
     * of a cache shorter than 8192 keys), so results never depend on it. */
    int32_t num_splits;
    /* 8-bit caches (CPU only): k_cache and v_cache both of dtype FA_DTYPE_I8, FA_DTYPE_F8_E4M3
     * or FA_DTYPE_F8_E5M2 (q, k_new, v_new and out keep f32/f16/bf16). A cached value is its
     * stored value times its scale, fp32; scales are required with 8-bit caches, one of:
     *   (B_cache, S_cache, Hk), paged (num_pages, page_size, Hk): a scale per token and KV head,
     *     which the append writes: s = max|x| / Q over the new row x (Q = 127, 448, 57344 for
     *     i8, e4m3, e5m2), stored = x / s rounded to nearest even (s = 0: stored 0; a row with a
     *     NaN or an infinity: s = NaN, stored 0);
     *   (B, Hk): one scale per batch and KV head, finite and > 0 (flash-attn 3's k_descale and
     *     v_descale); the append stores x / s rounded to nearest even.
     * Stores saturate at +-Q (infinities too); a NaN stores as NaN in fp8, 0 in int8. Rotary
     * applies before the new keys are quantized. Absent fields of a caller built before they
     * existed (struct_size = offsetof(fa_kvcache, k_scale)) read as absent. */
    fa_tensor k_scale, v_scale;
} fa_kvcache;

/* Fills *kv with "nothing given", cache_seqlen = -1, rotary_interleaved = 1, and sets
 * struct_size. */
FA_API void fa_kvcache_init(fa_kvcache *kv);

/* Attention of q against a KV cache, after appending k_new/v_new to it in place:
 *
 *   q    (B, Sq, H, D)   fp32 | fp16 | bf16
 *   kv   the cache, see fa_kvcache; Hk divides H
 *   out  (B, Sq, H, Dv)  q's dtype, written (Dv: v_cache's head dim)
 *   lse  (B, H, Sq)      fp32, may be NULL
 *
 * Batch b attends over its cache positions [leftpad_b, cache_seqlens[b] + S_new): Sk_b of them,
 * with the causal and window alignment of fa_forward (key j visible iff j <= i + Sk_b - Sq).
 * params as for fa_forward except dropout (must be 0). Everything is validated before anything
 * (the cache included) is written: page and batch indices in range, cache_seqlens + S_new
 * within the cache, leftpad <= cache_seqlens, rotary tables long enough with an even
 * rotary_dim <= D. Errors as fa_forward. */
FA_API fa_status fa_forward_kvcache(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                                    const fa_kvcache *kv, const fa_tensor *out,
                                    const fa_tensor *lse);

/* ---------------------------------------------------------------------------------------------
 * Backward
 * ------------------------------------------------------------------------------------------- */

/* Gradients of fa_forward: from q, k, v, the forward's out and lse, and dout = dL/dout, computes
 * dq = dL/dq, dk = dL/dk and dv = dL/dv, for every feature of the forward (causal, window, ALiBi,
 * softcap, GQA, dropout with the same params as the forward).
 *
 *   q, dq              (B, Sq, H, D)   one dtype (fp32 | fp16 | bf16) for every tensor but lse
 *   out, dout          (B, Sq, H, Dv)  Dv: v's head dim, as in fa_forward
 *   k, dk              (B, Sk, Hk, D)
 *   v, dv              (B, Sk, Hk, Dv)
 *   lse                (B, H, Sq) fp32, as written by fa_forward with the same params
 *
 * Accumulation is fp32 and GQA gradients are summed over the query heads of each KV head without
 * an H-sized temporary. Memory is O(threads x blocks) plus an fp32 (B, H, Sq) buffer. Results are
 * bitwise identical for every thread count (no atomics). dq, dk, dv must not overlap any input or
 * each other. Errors as fa_forward; lse is required. */
FA_API fa_status fa_backward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                             const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                             const fa_tensor *dout, const fa_tensor *lse, const fa_tensor *dq,
                             const fa_tensor *dk, const fa_tensor *dv);

/* Gradients of fa_varlen_forward: the tensors of fa_backward in varlen layout (q, out, dout, dq
 * (total_q, H, D); k, v, dk, dv (total_k, Hk, D); lse (H, total_q)) with the forward's
 * cu_seqlens and max_seqlen. Rows outside every sequence get zero gradients. */
FA_API fa_status fa_varlen_backward(fa_context *ctx, const fa_params *params, const fa_tensor *q,
                                    const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                                    const fa_tensor *dout, const fa_tensor *lse,
                                    const fa_tensor *cu_seqlens_q, const fa_tensor *cu_seqlens_k,
                                    int64_t max_seqlen_q, int64_t max_seqlen_k,
                                    const fa_tensor *dq, const fa_tensor *dk, const fa_tensor *dv);

/* Merges n >= 1 partial attentions of the same queries, each over its own part of the keys
 * (ring attention's steps, split-KV's splits), into the attention over all of them, as
 * flash-attn 3's flash_attn_combine:
 *   out_partial  (B, S, H, D) fp32: part 0's output; part i's at out_partial->data +
 *                i·out_partial_stride elements (flash-attn 3's (n, B, S, H, D) tensor: its
 *                [0] and stride(0))
 *   lse_partial  (B, S, H) fp32: part 0's log-sum-exp (-inf: the part saw no key); part i's at
 *                + i·lse_partial_stride elements
 *   out          (B, S, H, D) fp32, fp16 or bf16, written
 *   lse          (B, S, H) fp32, written; NULL = not wanted
 * Per row, with M = max_i lse_i and w_i = exp(lse_i - M): out = sum w_i·o_i / sum w_i and
 * lse = M + log(sum w_i), summed in the order i = 0..n-1 in fp32. Parts with lse = -inf are
 * skipped (their out_partial is never read); a row whose parts all have lse = -inf gets out = 0
 * and lse = -inf; a NaN or +inf lse makes the row NaN. Any non-negative strides; every tensor on
 * one device (CUDA: on params->cuda_stream; params may be NULL, only its stream is read); out
 * and lse must not overlap the partials or each other. ctx: the CPU's threads (NULL: the
 * default context). Errors: FA_ERR_NULL_POINTER, FA_ERR_RANK, FA_ERR_SHAPE, FA_ERR_DTYPE,
 * FA_ERR_STRIDE, FA_ERR_VALUE (n < 1), FA_ERR_OVERLAP, FA_ERR_DEVICE, FA_ERR_STRUCT_SIZE. */
FA_API fa_status fa_combine(fa_context *ctx, const fa_params *params, int64_t n,
                            const fa_tensor *out_partial, int64_t out_partial_stride,
                            const fa_tensor *lse_partial, int64_t lse_partial_stride,
                            const fa_tensor *out, const fa_tensor *lse);

/* The dropout mask the forward and backward use for params (dropout_p, dropout_seed,
 * dropout_offset): mask (B, H, Sq, Sk) uint8 gets 1 where the probability at (b, h, i, j) is kept
 * and 0 where it is dropped. For varlen, sequence b's mask is mask[b, h, :Sq_b, :Sk_b].
 * dropout_p = 0 gives all ones. Errors: FA_ERR_NULL_POINTER, FA_ERR_RANK, FA_ERR_DTYPE,
 * FA_ERR_STRIDE, FA_ERR_VALUE, FA_ERR_STRUCT_SIZE, FA_ERR_DEVICE. */
FA_API fa_status fa_dropout_mask(const fa_params *params, const fa_tensor *mask);

/* ---------------------------------------------------------------------------------------------
 * Devices
 *
 * Tensors may live in CUDA device memory (device = FA_DEVICE_CUDA, device_index = the CUDA
 * ordinal). Every tensor of a call must be on the same device, except the int32 cu_seqlens and
 * KV-cache indices, which may be on the host or on that device. The CUDA plug-in, libflashattn_cuda.so, is loaded
 * on first use: from the path in the environment variable FA_CUDA_PLUGIN if set, else from the
 * directory of libflashattn.so, else from the dynamic loader's search path. It needs only the
 * NVIDIA driver (the CUDA runtime is linked into it). When it is missing, a call with CUDA
 * tensors returns FA_ERR_DEVICE and fa_last_error_message() says why.
 *
 * On CUDA tensors: fa_forward, fa_varlen_forward, fa_backward, fa_varlen_backward,
 * fa_forward_kvcache, fa_combine and fa_dropout_mask run on the GPU (the backward
 * deterministic, as on the CPU). fa_forward_kvcache's int32 indices may stay on the host;
 * device ones are copied back to be checked, which waits for the stream.
 *
 * The helpers below give C programs device memory without linking the CUDA toolkit (the tests
 * and `flashattn verify` use them). Each loads the plug-in as above.
 * ------------------------------------------------------------------------------------------- */

/* The number of devices of that kind: FA_DEVICE_CPU gives 1. FA_DEVICE_CUDA gives the CUDA
 * device count (0 when the plug-in loads but no GPU is visible) or FA_ERR_DEVICE when the
 * plug-in or the driver cannot be loaded. Errors: FA_ERR_NULL_POINTER, FA_ERR_DEVICE. */
FA_API fa_status fa_device_count(fa_device device, int32_t *count);

/* One line about device device_index and what flashattn runs on it, written into buf (cap
 * bytes, NUL-terminated, truncated to cap - 1 characters when longer; cap 0 writes nothing and
 * buf may then be NULL). FA_DEVICE_CPU (index 0) gives the CPU kernel set in use, e.g.
 * "CPU, kernels avx2; compiled in: ref refbf16 avx2 avx512"; FA_DEVICE_CUDA gives the plug-in's
 * line, e.g. "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB; kernels: tensor cores for fp16
 * and bf16 (mma.sync m16n8k16), fp32 on CUDA cores". buf is unchanged on error. Thread-safe.
 * Errors: FA_ERR_NULL_POINTER (buf NULL with cap > 0), FA_ERR_DEVICE (not a fa_device, an index
 * outside 0..count-1, no plug-in or driver), or the plug-in's error for that device. */
FA_API fa_status fa_device_describe(fa_device device, int32_t device_index, char *buf, size_t cap);

/* Allocates bytes (> 0) of memory on a device; *ptr is unchanged on error. CPU memory comes from
 * malloc. Errors: FA_ERR_NULL_POINTER, FA_ERR_VALUE (bytes == 0), FA_ERR_DEVICE,
 * FA_ERR_NO_MEMORY. */
FA_API fa_status fa_device_alloc(fa_device device, int32_t device_index, size_t bytes,
                                 void **ptr);

/* Frees memory from fa_device_alloc. NULL is a no-op. Errors: FA_ERR_DEVICE. */
FA_API fa_status fa_device_free(fa_device device, int32_t device_index, void *ptr);

/* Copies bytes between host memory and CUDA device device_index, in either direction or within
 * the device, and returns when the copy is complete. One of the two sides may be FA_DEVICE_CPU;
 * CPU to CPU is a memcpy. Errors: FA_ERR_NULL_POINTER, FA_ERR_DEVICE. */
FA_API fa_status fa_device_copy(void *dst, fa_device dst_device, const void *src,
                                fa_device src_device, int32_t device_index, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
