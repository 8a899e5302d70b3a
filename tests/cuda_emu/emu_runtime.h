/* SPDX-License-Identifier: MIT */
// emu_runtime.h — the CUDA runtime calls cuda/plugin.cu makes, for the emulated plug-in
// (tests/cuda_emu/plugin_emu.cpp): one device, of compute capability emu::g_sm (FA_EMU_SM, default
// sm_90) and that GPU's shared memory a block (emu::smem_optin), whose memory is host memory. Every
// allocation is registered with emu.h so cp.async sources are checked against it; copies must
// stay inside allocations on the device side; kernels run to completion at launch, so streams
// and synchronization are trivially ordered. Driver entry points are not offered (the plug-in
// then falls back to cudaGetDevice / cudaSetDevice).
#pragma once
#include "emu.h"

#define CUDART_VERSION 13000
#define __CUDACC_VER_MAJOR__ 13
#define __CUDACC_VER_MINOR__ 0

enum cudaMemcpyKind {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
};
enum cudaDeviceAttr {
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMemoryPoolsSupported = 115,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0 };
enum { cudaEnableDefault = 0 };
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount;
    size_t totalGlobalMem;
};

namespace emu {
static int g_device = 0;
} // namespace emu

/* The emulated device's SM count: small, so that choices made from it (the decode's splits)
 * differ from a GPU's and are exercised. */
enum { kEmuSMs = 4 };

static inline cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int *d) {
    *d = emu::g_device;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d) {
    if (d != 0)
        return cudaErrorInvalidDevice;
    emu::g_device = d;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int device) {
    if (device != 0)
        return cudaErrorInvalidDevice;
    *v = attr == cudaDevAttrComputeCapabilityMajor   ? emu::g_sm / 10
         : attr == cudaDevAttrComputeCapabilityMinor ? emu::g_sm % 10
         : attr == cudaDevAttrMultiProcessorCount    ? (int)kEmuSMs
         : attr == cudaDevAttrMaxSharedMemoryPerBlockOptin
             ? emu::smem_optin(emu::g_sm)
             : attr == cudaDevAttrMemoryPoolsSupported;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    if (device != 0)
        return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "emulated GPU (tests/cuda_emu)");
    prop->major = emu::g_sm / 10, prop->minor = emu::g_sm % 10, prop->multiProcessorCount = kEmuSMs;
    prop->totalGlobalMem = (size_t)1 << 30;
    return cudaSuccess;
}
static inline cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    if (!*p)
        return cudaErrorMemoryAllocation;
    emu::register_global(*p, n);
    return cudaSuccess;
}
static inline cudaError_t cudaFree(void *p) {
    if (!p)
        return cudaSuccess;
    for (size_t i = 0; i < emu::g_bufs.size(); ++i)
        if (emu::g_bufs[i].p == p) {
            emu::g_bufs.erase(emu::g_bufs.begin() + (long)i);
            free(p);
            return cudaSuccess;
        }
    return cudaErrorInvalidValue;
}
static inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) {
    return cudaMalloc(p, n);
}
static inline cudaError_t cudaFreeAsync(void *p, cudaStream_t) { return cudaFree(p); }
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                                          cudaStream_t) {
    const bool dst_dev = kind != cudaMemcpyDeviceToHost, src_dev = kind != cudaMemcpyHostToDevice;
    if ((dst_dev && !emu::global_ok(dst, n)) || (src_dev && !emu::global_ok(src, n)))
        return cudaErrorInvalidValue;
    memmove(dst, src, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
static inline cudaError_t cudaGetDriverEntryPointByVersion(const char *, void **fn, unsigned, int,
                                                           cudaDriverEntryPointQueryResult *) {
    *fn = nullptr;
    return cudaErrorNotSupported;
}
static inline const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    default:
        return "cudaErrorNotSupported";
    }
}
static inline const char *cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
