/* SPDX-License-Identifier: MIT */
/*
 * plugin.cu — libflashattn_cuda.so's one exported function, fa_cuda_plugin_entry, and the
 * fa__plugin_api table it returns (src/plugin_abi.h): device queries, device memory and copies
 * for C users without the CUDA toolkit, and the forward and dropout-mask launches.
 *
 * The core has validated every argument. Each call makes its device current and restores the
 * caller's current device before returning; work is enqueued on the caller's stream. A failed
 * CUDA call becomes FA_ERR_DEVICE (FA_ERR_NO_MEMORY when out of memory) with a message naming
 * the call or kernel and the CUDA error.
 */
#include "flashattn.h"
#include "kernels.h"
#include "plugin_abi.h"

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

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

/* Makes device current; *prev gets the caller's current device for leave_device. */
static int enter_device(int device, int *prev, char *msg, size_t cap) {
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess)
        return fail(e, msg, cap, "cudaGetDevice");
    if (*prev != device && (e = cudaSetDevice(device)) != cudaSuccess)
        return fail(e, msg, cap, "cudaSetDevice(%d)", device);
    return FA_OK;
}

static void leave_device(int device, int prev) {
    if (prev != device)
        (void)cudaSetDevice(prev);
}

/* Compute capability 10·major + minor of each device, asked once (0 = not yet). */
enum { FA_SM_CACHE = 64 };
static int sm_cache[FA_SM_CACHE];

static cudaError_t device_sm(int device, int *sm) {
    if (device < FA_SM_CACHE && (*sm = __atomic_load_n(&sm_cache[device], __ATOMIC_RELAXED)) != 0)
        return cudaSuccess;
    int major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e != cudaSuccess)
        return e;
    *sm = 10 * major + minor;
    if (device < FA_SM_CACHE)
        __atomic_store_n(&sm_cache[device], *sm, __ATOMIC_RELAXED);
    return cudaSuccess;
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
    snprintf(buf, bufcap, "%s, sm_%d%d, %d SMs, %.1f GiB", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return FA_OK;
}

static int plugin_alloc(int device, size_t bytes, void **ptr, char *msg, size_t cap) {
    int prev, st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    void *mem = NULL;
    const cudaError_t e = cudaMalloc(&mem, bytes);
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "cudaMalloc of %zu bytes on device %d", bytes, device);
    else
        *ptr = mem;
    leave_device(device, prev);
    return st;
}

static int plugin_release(int device, void *ptr, char *msg, size_t cap) {
    int prev, st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    const cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "cudaFree(%p) on device %d", ptr, device);
    leave_device(device, prev);
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
    int prev, st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kinds[kind], (cudaStream_t)stream);
    if (e != cudaSuccess) {
        st = fail(e, msg, cap, "cudaMemcpyAsync of %zu bytes on device %d", bytes, device);
    } else if ((e = cudaStreamSynchronize((cudaStream_t)stream)) != cudaSuccess) {
        st = fail(e, msg, cap, "cudaStreamSynchronize after a copy of %zu bytes on device %d",
                  bytes, device);
    }
    leave_device(device, prev);
    return st;
}

/* The forward on the current device (compute capability sm): clears the varlen rows outside
 * every sequence, uploads cu_q/cu_k (varlen) and runs the stage-2 kernel where it applies, else
 * stage 1. */
static int run_forward(const fa__problem *p, int device, int sm, cudaStream_t stream, char *msg,
                       size_t cap) {
    cudaError_t e = fa__clear_outside(p, stream);
    if (e != cudaSuccess)
        return fail(e, msg, cap, "clear_outside_kernel launch on device %d", device);
    const int varlen = p->cu_q != NULL;
    if (varlen ? p->cu_q[p->B] == p->cu_q[0] : p->B * p->Sq == 0)
        return FA_OK; /* no rows */

    int32_t *cu_dev = NULL; // cu_dev: [2, B + 1], cu_q then cu_k
    const size_t ncu = (size_t)(p->B + 1), cu_bytes = ncu * sizeof(int32_t);
    if (varlen) {
        /* From pageable memory the copies return once the host arrays are read, so they may be
         * reused as soon as this call returns (plugin_abi.h). */
        if ((e = cudaMallocAsync((void **)&cu_dev, 2 * cu_bytes, stream)) != cudaSuccess)
            return fail(e, msg, cap, "cudaMallocAsync of %zu bytes (cu_seqlens) on device %d",
                        2 * cu_bytes, device);
        e = cudaMemcpyAsync(cu_dev, p->cu_q, cu_bytes, cudaMemcpyHostToDevice, stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(cu_dev + ncu, p->cu_k, cu_bytes, cudaMemcpyHostToDevice, stream);
        if (e != cudaSuccess) {
            const int st = fail(e, msg, cap, "cudaMemcpyAsync of cu_seqlens to device %d", device);
            (void)cudaFreeAsync(cu_dev, stream);
            return st;
        }
    }
    const int32_t *cu_q_dev = cu_dev, *cu_k_dev = cu_dev ? cu_dev + ncu : NULL;
    const int mma = fa__mma_supported(p, sm);
    e = mma ? fa__mma_forward(p, cu_q_dev, cu_k_dev, stream)
            : fa__simple_forward(p, cu_q_dev, cu_k_dev, stream);
    int st = FA_OK;
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "%s kernel launch on device %d (sm_%d)",
                  mma ? "fa__mma_forward" : "fa__simple_forward", device, sm);
    if (cu_dev && (e = cudaFreeAsync(cu_dev, stream)) != cudaSuccess && st == FA_OK)
        st = fail(e, msg, cap, "cudaFreeAsync of cu_seqlens on device %d", device);
    return st;
}

static int plugin_forward(const fa__problem *p, int device, void *stream, char *msg, size_t cap) {
    if (p->seqlens_k || p->k.row_off || p->k.block_table || p->k.batch_idx) {
        snprintf(msg, cap,
                 "forward: KV caches (seqlens_k, leftpad, block_table, batch_idx) are "
                 "not supported on CUDA");
        return FA_ERR_UNSUPPORTED;
    }
    int prev, sm, st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    const cudaError_t e = device_sm(device, &sm);
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "cudaDeviceGetAttribute(compute capability, %d)", device);
    else
        st = run_forward(p, device, sm, (cudaStream_t)stream, msg, cap);
    leave_device(device, prev);
    return st;
}

static int plugin_dropout_mask(const fa__problem *p, int device, void *stream, char *msg,
                               size_t cap) {
    int prev, st = enter_device(device, &prev, msg, cap);
    if (st != FA_OK)
        return st;
    const cudaError_t e = fa__dropout_mask_kernel(p, (cudaStream_t)stream);
    if (e != cudaSuccess)
        st = fail(e, msg, cap, "dropout_mask_kernel launch on device %d", device);
    leave_device(device, prev);
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
};

extern "C" __attribute__((visibility("default"))) const fa__plugin_api *
fa_cuda_plugin_entry(uint32_t abi_version) {
    return abi_version == FA__PLUGIN_ABI_VERSION ? &plugin_api : NULL;
}
