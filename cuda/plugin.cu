/* SPDX-License-Identifier: MIT */
/*
 * plugin.cu — libflashattn_cuda.so's one exported function, fa_cuda_plugin_entry, and the
 * fa__plugin_api table it returns (src/plugin_abi.h): device queries, device memory and copies
 * for C users without the CUDA toolkit, and the forward, backward, KV-cache, combine and
 * dropout-mask launches.
 *
 * The core has validated every argument. Each call makes its device current and restores the
 * caller's current device before returning; work is enqueued on the caller's stream. A failed
 * CUDA call becomes FA_ERR_DEVICE (FA_ERR_NO_MEMORY when out of memory) with a message naming
 * the call or kernel and the CUDA error.
 */
#include "flashattn.h"
#include "kernels.h"
#include "plugin_abi.h"

#include <cuda.h> /* CUcontext and CUresult only: libcuda is not linked */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The archs the build compiled for, e.g. "sm_80 sm_90 + PTX" (set by the build). */
#ifndef FA_CUDA_ARCHS_STR
#define FA_CUDA_ARCHS_STR "archs not recorded"
#endif

/* Writes "<what>: <CUDA error description> (<CUDA error name>)" into msg and returns the status
 * for e. Also clears e from the runtime's last-error state, so a later launch check does not
 * report it again (sticky errors stay). */
static int fail(cudaError_t e, char *msg, size_t cap, const char *what_fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(cudaError_t e, char *msg, size_t cap, const char *what_fmt, ...) {
    (void)cudaGetLastError();
    if (cap > 0) {
        va_list ap;
        va_start(ap, what_fmt);
        const int n = vsnprintf(msg, cap, what_fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < cap)
            snprintf(msg + n, cap - (size_t)n, ": %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
    }
    return e == cudaErrorMemoryAllocation ? FA_ERR_NO_MEMORY : FA_ERR_DEVICE;
}

/* The driver's cuCtxGetCurrent / cuCtxSetCurrent, found through the runtime (the plug-in does
 * not link libcuda); NULL where the driver does not offer them. */
typedef CUresult (*fa_ctx_get_fn)(CUcontext *ctx);
typedef CUresult (*fa_ctx_set_fn)(CUcontext ctx);
typedef struct fa_ctx_api {
    fa_ctx_get_fn get;
    fa_ctx_set_fn set;
} fa_ctx_api;

static fa_ctx_api ctx_api_lookup(void) {
    fa_ctx_api api = {NULL, NULL};
    void *get = NULL, *set = NULL;
    cudaDriverEntryPointQueryResult qg, qs;
#if CUDART_VERSION >= 12050 /* the versioned lookup; the unversioned one is deprecated in 13 */
    const cudaError_t eg =
        cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &qg);
    const cudaError_t es =
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &qs);
#else
    const cudaError_t eg = cudaGetDriverEntryPoint("cuCtxGetCurrent", &get, cudaEnableDefault, &qg);
    const cudaError_t es = cudaGetDriverEntryPoint("cuCtxSetCurrent", &set, cudaEnableDefault, &qs);
#endif
    if (eg == cudaSuccess && es == cudaSuccess && qg == cudaDriverEntryPointSuccess &&
        qs == cudaDriverEntryPointSuccess) {
        api.get = (fa_ctx_get_fn)get;
        api.set = (fa_ctx_set_fn)set;
    }
    (void)cudaGetLastError();
    return api;
}

static const fa_ctx_api &ctx_api(void) {
    static const fa_ctx_api api = ctx_api_lookup(); /* thread-safe initialization */
    return api;
}

/* What was current on the calling thread before a call, restored by leave_device: the exact
 * context when the driver tells us (none at all included, so a thread that never used CUDA is
 * not left holding a context on device 0), else the current device. */
typedef struct fa_saved_device {
    int device, have_ctx;
    CUcontext ctx;
} fa_saved_device;

/* Makes device current; *saved records the caller's state for leave_device. */
static int enter_device(int device, fa_saved_device *saved, char *msg, size_t cap) {
    const fa_ctx_api &api = ctx_api();
    saved->have_ctx = api.get && api.set && api.get(&saved->ctx) == CUDA_SUCCESS;
    cudaError_t e = cudaGetDevice(&saved->device);
    if (e != cudaSuccess)
        return fail(e, msg, cap, "cudaGetDevice");
    if ((saved->device != device || (saved->have_ctx && !saved->ctx)) &&
        (e = cudaSetDevice(device)) != cudaSuccess)
        return fail(e, msg, cap, "cudaSetDevice(%d)", device);
    return FA_OK;
}

static void leave_device(int device, const fa_saved_device *saved) {
    if (saved->have_ctx)
        (void)ctx_api().set(saved->ctx);
    else if (saved->device != device)
        (void)cudaSetDevice(saved->device);
}

/* What the kernel choice needs of a device: compute capability 10·major + minor, the shared
 * memory a block can have (opt-in, bytes) and the SM count; asked once per device. */
typedef struct fa_dev {
    int sm, smem, sms;
    int ksm, ksmem; /* sm and smem as the kernel choice takes them (kernel_device) */
} fa_dev;

enum { FA_DEV_CACHE = 64 };
static fa_dev dev_cache[FA_DEV_CACHE];
static int dev_state[FA_DEV_CACHE]; /* 0: not asked, 1: being written, 2: in dev_cache */

static cudaError_t device_info(int device, fa_dev *d) {
    const int cached = device < FA_DEV_CACHE;
    if (cached && __atomic_load_n(&dev_state[device], __ATOMIC_ACQUIRE) == 2) {
        *d = dev_cache[device];
        return cudaSuccess;
    }
    int major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&d->smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess)
        return e;
    d->sm = 10 * major + minor;
    d->ksm = d->sm, d->ksmem = d->smem;
    int unasked = 0; /* one thread writes the cache; the others use what they asked */
    if (cached && __atomic_compare_exchange_n(&dev_state[device], &unasked, 1, 0, __ATOMIC_ACQUIRE,
                                              __ATOMIC_RELAXED)) {
        dev_cache[device] = *d;
        __atomic_store_n(&dev_state[device], 2, __ATOMIC_RELEASE);
    }
    return cudaSuccess;
}

/* Can a device of compute capability sm run this plug-in's kernels: machine code of its major
 * version and a minor at most its own, or PTX the driver compiles for it (PTX of sm_XY runs on
 * every sm >= XY)? Read from FA_CUDA_ARCHS_STR, e.g. "sm_75 sm_80 sm_90 sm_120 + PTX 80". */
static int have_image(int sm) {
    int listed = 0;
    for (const char *at = FA_CUDA_ARCHS_STR; (at = strpbrk(at, "0123456789")) != NULL; listed++) {
        const int ptx = at >= FA_CUDA_ARCHS_STR + 4 && strncmp(at - 4, "PTX ", 4) == 0;
        char *end;
        const int a = (int)strtol(at, &end, 10);
        if (ptx ? sm >= a : a / 10 == sm / 10 && a <= sm)
            return 1;
        at = end;
    }
    return !listed; /* not recorded: the driver decides at launch */
}

/* Which kernels a device of compute capability sm runs (FA_CUDA_KERNELS unset). */
static const char *kernels_text(int sm) {
    if (!have_image(sm))
        return "none: this plug-in has no machine code or PTX for this GPU (built "
               "for " FA_CUDA_ARCHS_STR ")";
    if (sm >= 80)
        return "tensor cores for fp16 and bf16 (mma.sync m16n8k16), fp32 on CUDA cores";
    if (sm >= 75)
        return "Turing tensor cores for fp16 (mma.sync m16n8k8); bf16 and fp32 on CUDA cores";
    return "CUDA cores (fp32 arithmetic) for every dtype: no tensor-core kernels before sm_75";
}

/* FA_CUDA_KERNELS, read at every call: unset, "" or "auto" (0): the kernels for the device;
 * "sm75" (75): Turing's tensor-core kernels on any GPU from sm_75 on (fp16; bf16 on stage 1),
 * to test them on a newer one; "simple" (1): stage 1 only. -1: another value. */
static int kernels_choice(const char *v) {
    if (!v || !*v || strcmp(v, "auto") == 0)
        return 0;
    return strcmp(v, "sm75") == 0 ? 75 : strcmp(v, "simple") == 0 ? 1 : -1;
}

/* The device, and the compute capability the kernels are chosen for (FA_CUDA_KERNELS applied):
 * FA_OK, or an error in msg. Called after enter_device. */
static int kernel_device(int device, fa_dev *d, char *msg, size_t cap) {
    const char *env = getenv("FA_CUDA_KERNELS");
    const int choice = kernels_choice(env);
    if (choice < 0) {
        snprintf(msg, cap, "FA_CUDA_KERNELS is \"%.32s\"; expected auto, sm75 or simple", env);
        return FA_ERR_VALUE;
    }
    const cudaError_t e = device_info(device, d);
    if (e != cudaSuccess)
        return fail(e, msg, cap,
                    "cudaDeviceGetAttribute(compute capability, shared memory, SMs, "
                    "%d)",
                    device);
    if (!have_image(d->sm)) {
        snprintf(msg, cap,
                 "CUDA device %d is sm_%d, for which this plug-in (built for " FA_CUDA_ARCHS_STR
                 ") has no kernels%s",
                 device, d->sm,
                 d->sm < 75 ? ": CUDA 13 cannot compile for it; build the plug-in with a CUDA 12 "
                              "toolkit, whose default FA_CUDA_ARCHS adds sm_70"
                            : ": rebuild it with FA_CUDA_ARCHS naming this GPU");
        return FA_ERR_UNSUPPORTED;
    }
    if (choice == 75 && d->sm < 75) {
        snprintf(msg, cap, "FA_CUDA_KERNELS=sm75: CUDA device %d is sm_%d, older than Turing",
                 device, d->sm);
        return FA_ERR_UNSUPPORTED;
    }
    /* "simple": no tensor-core kernel applies below sm_75, and no decode tile fits 0 bytes */
    d->ksm = choice == 75 ? 75 : choice == 1 ? 0 : d->sm;
    d->ksmem = choice == 1 ? 0 : d->smem;
    return FA_OK;
}

static int plugin_device_count(int *count, char *msg, size_t cap) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice) {
        (void)cudaGetLastError();
        n = 0;
    } else if (e != cudaSuccess) {
        return fail(e, msg, cap, "cudaGetDeviceCount");
    }
    *count = n;
    return FA_OK;
}

static int plugin_device_describe(int device, char *buf, size_t bufcap, char *msg, size_t cap) {
    cudaDeviceProp prop;
    const cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return fail(e, msg, cap, "cudaGetDeviceProperties(%d)", device);
    fa_dev d;
    const cudaError_t ea = device_info(device, &d);
    if (ea != cudaSuccess)
        return fail(ea, msg, cap, "cudaDeviceGetAttribute(%d)", device);
    snprintf(buf, bufcap, "%s, sm_%d%d, %d SMs, %.1f GiB; kernels: %s", prop.name, prop.major,
             prop.minor, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), kernels_text(d.sm));
    return FA_OK;
}

static int plugin_alloc(int device, size_t bytes, void **ptr, char *msg, size_t cap) {
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    void *mem = NULL;
    const cudaError_t e = cudaMalloc(&mem, bytes);
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "cudaMalloc of %zu bytes on device %d", bytes, device);
    else
        *ptr = mem;
    leave_device(device, &prev);
    return st;
}

static int plugin_release(int device, void *ptr, char *msg, size_t cap) {
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    const cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "cudaFree(%p) on device %d", ptr, device);
    leave_device(device, &prev);
    return st;
}

static int plugin_copy(void *dst, const void *src, size_t bytes, int kind, int device, void *stream,
                       char *msg, size_t cap) {
    static const cudaMemcpyKind kinds[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                            cudaMemcpyDeviceToDevice};
    if (kind < FA__COPY_H2D || kind > FA__COPY_D2D) {
        snprintf(msg, cap, "copy: direction %d is not one of FA__COPY_H2D/D2H/D2D", kind);
        return FA_ERR_VALUE;
    }
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kinds[kind], (cudaStream_t)stream);
    if (e != cudaSuccess) {
        st = fail(e, msg, cap, "cudaMemcpyAsync of %zu bytes on device %d", bytes, device);
    } else if ((e = cudaStreamSynchronize((cudaStream_t)stream)) != cudaSuccess) {
        st = fail(e, msg, cap, "cudaStreamSynchronize after a copy of %zu bytes on device %d",
                  bytes, device);
    }
    leave_device(device, &prev);
    return st;
}

/* Device memory ordered on a stream: stream-ordered allocation where the device has memory
 * pools, else cudaMalloc, whose cudaFree waits for the device. */
typedef struct fa_stream_mem {
    int pools;
    cudaStream_t stream;
} fa_stream_mem;

static fa_stream_mem stream_mem(int device, cudaStream_t stream) {
    fa_stream_mem m = {0, stream};
    if (cudaDeviceGetAttribute(&m.pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess)
        m.pools = 0;
    (void)cudaGetLastError();
    return m;
}

static cudaError_t mem_alloc(const fa_stream_mem *m, void **ptr, size_t bytes) {
    return m->pools ? cudaMallocAsync(ptr, bytes, m->stream) : cudaMalloc(ptr, bytes);
}

static cudaError_t mem_free(const fa_stream_mem *m, void *ptr) {
    return !ptr ? cudaSuccess : m->pools ? cudaFreeAsync(ptr, m->stream) : cudaFree(ptr);
}

/* The device copies of a varlen problem's offsets: mem ([2, B + 1]: cu_q, then cu_k; freed
 * with mem_free), q and k pointing into it; all NULL for fixed length. */
typedef struct fa_cu_dev {
    int32_t *mem;
    const int32_t *q, *k;
} fa_cu_dev;

/* Copies the host offsets cu_q and cu_k into *cu. From pageable memory the copies return once
 * the host arrays are read, so they may be reused as soon as the call returns (plugin_abi.h). */
static int upload_cu(const fa__problem *p, const fa_stream_mem *m, int device, fa_cu_dev *cu_dev,
                     char *msg, size_t cap) {
    cu_dev->mem = NULL, cu_dev->q = cu_dev->k = NULL;
    if (!p->cu_q)
        return FA_OK;
    const size_t ncu = (size_t)(p->B + 1), cu_bytes = ncu * sizeof(int32_t);
    int32_t *cu = NULL;
    cudaError_t e = mem_alloc(m, (void **)&cu, 2 * cu_bytes);
    if (e != cudaSuccess)
        return fail(e, msg, cap, "allocating %zu bytes (cu_seqlens) on device %d", 2 * cu_bytes,
                    device);
    e = cudaMemcpyAsync(cu, p->cu_q, cu_bytes, cudaMemcpyHostToDevice, m->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(cu + ncu, p->cu_k, cu_bytes, cudaMemcpyHostToDevice, m->stream);
    if (e != cudaSuccess) {
        const int st = fail(e, msg, cap, "cudaMemcpyAsync of cu_seqlens to device %d", device);
        (void)mem_free(m, cu);
        return st;
    }
    cu_dev->mem = cu, cu_dev->q = cu, cu_dev->k = cu + ncu;
    return FA_OK;
}

/* Frees mem (when not NULL) and returns st, or the free's error when st is FA_OK. */
static int free_after(const fa_stream_mem *m, void *mem, int st, int device, const char *what,
                      char *msg, size_t cap) {
    const cudaError_t e = mem_free(m, mem);
    if (e != cudaSuccess && st == FA_OK)
        return fail(e, msg, cap, "freeing %s on device %d", what, device);
    return st;
}

/* The forward on the current device d: clears the varlen rows outside every sequence, uploads
 * cu_q/cu_k (varlen) and runs the stage-2 kernel where it applies, else stage 1. */
static int run_forward(const fa__problem *p, int device, const fa_dev &d, int d128_block_n,
                       cudaStream_t stream, char *msg, size_t cap) {
    cudaError_t e = fa__clear_outside(p, stream);
    if (e != cudaSuccess)
        return fail(e, msg, cap, "clear_outside_kernel launch on device %d", device);
    if (fa__fwd_rows(p) == 0)
        return FA_OK;
    const fa_stream_mem m = stream_mem(device, stream);
    fa_cu_dev cu;
    int st = upload_cu(p, &m, device, &cu, msg, cap);
    if (st != FA_OK)
        return st;
    const int mma = fa__mma_supported(p, d.ksm, d.ksmem);
    e = mma ? fa__mma_forward(p, d.ksm, d128_block_n, cu.q, cu.k, stream)
            : fa__simple_forward(p, cu.q, cu.k, stream);
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "%s kernel launch on device %d (sm_%d)",
                  mma ? "fa__mma_forward" : "fa__simple_forward", device, d.sm);
    return free_after(&m, cu.mem, st, device, "cu_seqlens", msg, cap);
}

/* The backward on the current device d: zeroes the varlen rows outside every sequence, then Δ and
 * lse2 of every row into scratch ([2, H, R] fp32), then dq, dk and dv by the stage-2 kernels where
 * they apply, else stage 1, and dsinks when asked for. */
static int run_backward(const fa__problem *p, int device, const fa_dev &d, cudaStream_t stream,
                        char *msg, size_t cap) {
    cudaError_t e = fa__bwd_clear_outside(p, stream);
    if (e != cudaSuccess)
        return fail(e, msg, cap, "bwd_clear_kernel launch on device %d", device);
    if (fa__fwd_rows(p) == 0 && fa__bwd_key_rows(p) == 0) {
        const fa__bwd_rows_in none = {NULL, NULL, 0};
        e = p->dsinks ? fa__bwd_dsinks(p, &none, stream) : cudaSuccess;
        if (e != cudaSuccess)
            return fail(e, msg, cap, "fa__bwd_dsinks kernel launch on device %d", device);
        return FA_OK;
    }
    const fa_stream_mem m = stream_mem(device, stream);
    fa_cu_dev cu;
    int st = upload_cu(p, &m, device, &cu, msg, cap);
    if (st != FA_OK)
        return st;
    fa__bwd_rows_in rows = {NULL, NULL, fa__bwd_rows(p)};
    const size_t bytes = 2 * (size_t)(p->H * rows.R) * sizeof(float) + 1;
    void *scratch = NULL;
    e = mem_alloc(&m, &scratch, bytes);
    if (e != cudaSuccess) {
        st = fail(e, msg, cap, "allocating %zu bytes (backward scratch: delta, lse) on device %d",
                  bytes, device);
        return free_after(&m, cu.mem, st, device, "cu_seqlens", msg, cap);
    }
    rows.delta = (float *)scratch;
    rows.lse2 = rows.delta + p->H * rows.R;
    const char *what = "fa__bwd_prepare";
    e = fa__bwd_prepare(p, &rows, cu.q, stream);
    if (e == cudaSuccess) {
        const int mma = fa__mma_bwd_supported(p, d.ksm, d.ksmem);
        what = mma ? "fa__mma_backward" : "fa__simple_backward";
        e = mma ? fa__mma_backward(p, d.ksm, &rows, cu.q, cu.k, stream)
                : fa__simple_backward(p, &rows, cu.q, cu.k, stream);
    }
    if (e == cudaSuccess && p->dsinks) {
        what = "fa__bwd_dsinks";
        e = fa__bwd_dsinks(p, &rows, stream);
    }
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "%s kernel launch on device %d (sm_%d)", what, device, d.sm);
    st = free_after(&m, scratch, st, device, "backward scratch", msg, cap);
    return free_after(&m, cu.mem, st, device, "cu_seqlens", msg, cap);
}

/* A KV-cache call's indices on the device: one buffer (mem, freed with mem_free) holding
 * seqlens, seqlens_k, batch_idx and leftpad ([B] each, when given) and the block table's span,
 * and pd, p with its indices pointing into it. */
typedef struct fa_kv_dev {
    int32_t *mem;
    const int32_t *seqlens;
    fa__problem pd;
} fa_kv_dev;

static int upload_kv(const fa__problem *p, const fa__kvcache_job *job, const fa_stream_mem *m,
                     int device, fa_kv_dev *kd, char *msg, size_t cap) {
    const int64_t B = p->B;
    const int64_t bt_n = p->k.block_table ? (B - 1) * p->k.bt_stride + job->bt_cols : 0;
    const int64_t n = 2 * B + (p->k.batch_idx ? B : 0) + (p->k.row_off ? B : 0) + bt_n;
    const size_t bytes = (size_t)n * sizeof(int32_t);
    int32_t *host = (int32_t *)malloc(bytes);
    if (!host) {
        snprintf(msg, cap, "kvcache: out of host memory for %zu bytes of cache indices", bytes);
        return FA_ERR_NO_MEMORY;
    }
    kd->pd = *p;
    kd->mem = NULL;
    cudaError_t e = mem_alloc(m, (void **)&kd->mem, bytes);
    if (e != cudaSuccess) {
        free(host);
        return fail(e, msg, cap, "allocating %zu bytes (cache indices) on device %d", bytes,
                    device);
    }
    /* Packed in that order; each device pointer of pd follows its host array. */
    int64_t at = 0;
    const int32_t *const src[5] = {job->seqlens, p->seqlens_k, p->k.batch_idx, p->k.row_off,
                                   p->k.block_table};
    const int32_t **const dst[5] = {&kd->seqlens, &kd->pd.seqlens_k, &kd->pd.k.batch_idx,
                                    &kd->pd.k.row_off, &kd->pd.k.block_table};
    for (int i = 0; i < 5; i++) {
        const int64_t len = i < 4 ? B : bt_n;
        if (!src[i] || len == 0)
            continue;
        memcpy(host + at, src[i], (size_t)len * sizeof(int32_t));
        *dst[i] = kd->mem + at;
        at += len;
    }
    kd->pd.v.batch_idx = kd->pd.k.batch_idx;
    kd->pd.v.row_off = kd->pd.k.row_off;
    kd->pd.v.block_table = kd->pd.k.block_table;
    /* From pageable memory the copy returns once host is read. */
    e = cudaMemcpyAsync(kd->mem, host, bytes, cudaMemcpyHostToDevice, m->stream);
    free(host);
    if (e != cudaSuccess) {
        const int st = fail(e, msg, cap, "cudaMemcpyAsync of cache indices to device %d", device);
        (void)mem_free(m, kd->mem);
        return st;
    }
    return FA_OK;
}

/* The attention kernel of a KV-cache call. */
enum { FA_KV_SIMPLE, FA_KV_DECODE, FA_KV_MMA };

/* q as the attention reads it: p's, or rotated into scratch (contiguous, of dtype). */
static fa__view q_view(const fa__problem *p, void *scratch, int32_t dtype) {
    if (!scratch)
        return p->q;
    fa__view q;
    memset(&q, 0, sizeof q);
    q.data = scratch, q.dtype = dtype;
    q.sb = p->Sq * p->H * p->D, q.ss = p->H * p->D, q.sh = p->D, q.sd = 1;
    return q;
}

/* The kernel for p on device d, with q rotated into q_rot (or not, NULL): the decode for few
 * query rows a KV head, else the tensor-core forward where it applies (q_rot in q's dtype),
 * else stage 1. */
static int kv_kernel(const fa__problem *p, void *q_rot, const fa_dev &d) {
    fa__problem h = *p;
    h.q = q_view(p, q_rot, FA_DTYPE_F32);
    if (fa__decode_supported(&h, d.ksmem))
        return FA_KV_DECODE;
    h.q = q_view(p, q_rot, p->k.dtype);
    return fa__mma_supported(&h, d.ksm, d.ksmem) ? FA_KV_MMA : FA_KV_SIMPLE;
}

/* fa_forward_kvcache on the current device: the indices uploaded, the append, q rotated, then
 * the attention kernel (kv_kernel) over the caches. */
static int run_kvcache(const fa__problem *p, const fa__kvcache_job *job, int device,
                       const fa_dev &d, cudaStream_t stream, char *msg, size_t cap) {
    const fa_stream_mem m = stream_mem(device, stream);
    fa_kv_dev kd;
    int st = upload_kv(p, job, &m, device, &kd, msg, cap);
    if (st != FA_OK)
        return st;
    int64_t max_sk = 0;
    for (int64_t b = 0; b < p->B; b++)
        max_sk = p->seqlens_k[b] > max_sk ? p->seqlens_k[b] : max_sk;
    /* Scratch: q rotated (fp32 at most), then the decode's partials. */
    const size_t q_bytes = job->rotary.cos ? (size_t)(p->B * p->Sq * p->H * p->D) * 4 : 0;
    void *scratch = NULL;
    cudaError_t e = cudaSuccess;
    if (q_bytes > 0 && (e = mem_alloc(&m, &scratch, q_bytes)) != cudaSuccess) {
        st = fail(e, msg, cap, "allocating %zu bytes (rotated q) on device %d", q_bytes, device);
        return free_after(&m, kd.mem, st, device, "cache indices", msg, cap);
    }
    const int kernel = kv_kernel(p, scratch, d);
    void *partials = NULL;
    if (kernel == FA_KV_DECODE && p->Sq > 0) {
        const size_t bytes = fa__decode_scratch_bytes(p, max_sk);
        if ((e = mem_alloc(&m, &partials, bytes)) != cudaSuccess)
            st = fail(e, msg, cap, "allocating %zu bytes (decode partials) on device %d", bytes,
                      device);
    }
    const char *what = "fa__kv_append";
    if (st == FA_OK)
        e = fa__kv_append(&kd.pd, job, kd.seqlens, stream);
    const int32_t q_dtype = kernel == FA_KV_MMA ? p->k.dtype : FA_DTYPE_F32;
    if (st == FA_OK && e == cudaSuccess && scratch) {
        what = "fa__kv_rotate_q";
        e = fa__kv_rotate_q(&kd.pd, job, kd.seqlens, scratch, q_dtype, stream);
        kd.pd.q = q_view(p, scratch, q_dtype);
    }
    if (st == FA_OK && e == cudaSuccess && p->Sq > 0) {
        static const char *const names[3] = {"fa__simple_forward", "fa__decode_forward",
                                             "fa__mma_forward"};
        what = names[kernel];
        if (kernel == FA_KV_DECODE)
            e = fa__decode_forward(&kd.pd, max_sk,
                                   fa__decode_splits(p, max_sk, job->num_splits, d.sms), partials,
                                   d.ksmem, stream);
        else if (kernel == FA_KV_MMA) /* the default D = 128 tile (FA_CUDA_TILE_D128 unread) */
            e = fa__mma_forward(&kd.pd, d.ksm, fa__mma_d128_block_n(NULL, d.sm), NULL, NULL,
                                stream);
        else
            e = fa__simple_forward(&kd.pd, NULL, NULL, stream);
    }
    if (st == FA_OK && e != cudaSuccess)
        st = fail(e, msg, cap, "%s kernel launch on device %d (sm_%d)", what, device, d.sm);
    st = free_after(&m, partials, st, device, "decode partials", msg, cap);
    st = free_after(&m, scratch, st, device, "rotated q", msg, cap);
    return free_after(&m, kd.mem, st, device, "cache indices", msg, cap);
}

static int plugin_forward(const fa__problem *p, int device, void *stream, char *msg, size_t cap) {
    if (p->seqlens_k || p->k.row_off || p->k.block_table || p->k.batch_idx) {
        snprintf(msg, cap,
                 "forward: KV caches (seqlens_k, leftpad, block_table, batch_idx) are "
                 "not supported on CUDA");
        return FA_ERR_UNSUPPORTED;
    }
    /* Read at every call, so that one process (bench/gpu_bench.py) can time both tiles, and
     * checked before any device call (a malformed name gives 0 whatever the sm). */
    const char *tile = getenv("FA_CUDA_TILE_D128");
    if (fa__mma_d128_block_n(tile, 0) == 0) {
        snprintf(msg, cap,
                 "FA_CUDA_TILE_D128 is \"%.32s\"; expected 128x32 or 128x64 (unset: 128x64 on "
                 "sm_90 and later, 128x32 before)",
                 tile);
        return FA_ERR_VALUE;
    }
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    fa_dev d;
    st = kernel_device(device, &d, msg, cap);
    if (st == FA_OK)
        st = run_forward(p, device, d, fa__mma_d128_block_n(tile, d.sm), (cudaStream_t)stream, msg,
                         cap);
    leave_device(device, &prev);
    return st;
}

static int plugin_backward(const fa__problem *p, int device, void *stream, char *msg, size_t cap) {
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    fa_dev d;
    st = kernel_device(device, &d, msg, cap);
    if (st == FA_OK)
        st = run_backward(p, device, d, (cudaStream_t)stream, msg, cap);
    leave_device(device, &prev);
    return st;
}

static int plugin_kvcache(const fa__problem *p, const fa__kvcache_job *job, int device,
                          void *stream, char *msg, size_t cap) {
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    fa_dev d;
    st = kernel_device(device, &d, msg, cap);
    if (st == FA_OK)
        st = run_kvcache(p, job, device, d, (cudaStream_t)stream, msg, cap);
    leave_device(device, &prev);
    return st;
}

static int plugin_combine(const fa__combine *c, int device, void *stream, char *msg, size_t cap) {
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    fa_dev d;
    st = kernel_device(device, &d, msg, cap);
    if (st == FA_OK) {
        const cudaError_t e = fa__combine_launch(c, (cudaStream_t)stream);
        if (e != cudaSuccess)
            st = fail(e, msg, cap, "combine_kernel launch on device %d", device);
    }
    leave_device(device, &prev);
    return st;
}

static int plugin_dropout_mask(const fa__problem *p, int device, void *stream, char *msg,
                               size_t cap) {
    fa_saved_device prev;
    int st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    fa_dev d;
    st = kernel_device(device, &d, msg, cap);
    if (st == FA_OK) {
        const cudaError_t e = fa__dropout_mask_kernel(p, (cudaStream_t)stream);
        if (e != cudaSuccess)
            st = fail(e, msg, cap, "dropout_mask_kernel launch on device %d", device);
    }
    leave_device(device, &prev);
    return st;
}

#define FA_STR(x) #x
#define FA_XSTR(x) FA_STR(x)
/* The runtime linked in is the compiler's own (the toolkit of this nvcc). */
#if CUDART_VERSION != __CUDACC_VER_MAJOR__ * 1000 + __CUDACC_VER_MINOR__ * 10
#error "cuda_runtime.h is not from the toolkit of this nvcc"
#endif

static const fa__plugin_api plugin_api = {
    FA__PLUGIN_ABI_VERSION,
    (uint32_t)sizeof(fa__problem),
    /* e.g. "CUDA runtime 13.0 (static), sm_80 sm_90 + PTX" */
    "CUDA runtime " FA_XSTR(__CUDACC_VER_MAJOR__) "." FA_XSTR(
        __CUDACC_VER_MINOR__) " (static), " FA_CUDA_ARCHS_STR,
    plugin_device_count,
    plugin_device_describe,
    plugin_alloc,
    plugin_release,
    plugin_copy,
    plugin_forward,
    plugin_dropout_mask,
    plugin_backward,
    plugin_kvcache,
    plugin_combine,
};

extern "C" __attribute__((visibility("default"))) const fa__plugin_api *
fa_cuda_plugin_entry(uint32_t abi_version) {
    return abi_version == FA__PLUGIN_ABI_VERSION ? &plugin_api : NULL;
}
