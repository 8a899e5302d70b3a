/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * driver.c — the NVIDIA driver and its GPUs, asked through the driver library itself
 * (libcuda.so.1, dlopen'ed at run time; nothing links against it): cuDriverGetVersion, cuInit,
 * and per device its name, compute capability and memory. The driver's version string
 * ("550.54.15") comes from NVML (libnvidia-ml.so.1) when that loads. No driver is a result.
 *
 * FLASHATTN_DOCTOR_LIBCUDA / FLASHATTN_DOCTOR_LIBNVML replace the libraries (tests load a fake
 * driver built from tests/tools/probe/fake_driver.c); see envprobe.h.
 */
#define _GNU_SOURCE /* dladdr */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envprobe.h"

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_int_fn)(int *);
typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_device_name_fn)(char *, int, int);
typedef int (*cu_device_attr_fn)(int *, int, int);
typedef int (*cu_device_mem_fn)(size_t *, int);
typedef int (*cu_error_name_fn)(int, const char **);
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_version_fn)(char *, unsigned);

static void *driver_handle; /* kept loaded (see probe_driver) */

#define CU_ATTR_CC_MAJOR 75
#define CU_ATTR_CC_MINOR 76

/* dlsym into a function pointer without the object/function pointer cast (POSIX idiom). */
static void load(void *h, const char *name, void *fnptr) {
    void *p = dlsym(h, name);
    memcpy(fnptr, &p, sizeof p);
}

static const char *cu_error_name(int rc) {
    switch (rc) {
    case 0:
        return "CUDA_SUCCESS";
    case 3:
        return "CUDA_ERROR_NOT_INITIALIZED";
    case 34:
        return "CUDA_ERROR_STUB_LIBRARY";
    case 35:
        return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 46:
        return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case 100:
        return "CUDA_ERROR_NO_DEVICE";
    case 101:
        return "CUDA_ERROR_INVALID_DEVICE";
    case 304:
        return "CUDA_ERROR_OPERATING_SYSTEM";
    case 802:
        return "CUDA_ERROR_SYSTEM_NOT_READY";
    case 803:
        return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case 804:
        return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case 999:
        return "CUDA_ERROR_UNKNOWN";
    default:
        return "CUDA_ERROR";
    }
}

static void probe_nvml(env_driver *d, const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    nvml_init_fn init = NULL, shutdown = NULL;
    nvml_version_fn version = NULL;
    if (!h)
        return;
    load(h, "nvmlInit_v2", &init);
    if (!init)
        load(h, "nvmlInit", &init);
    load(h, "nvmlSystemGetDriverVersion", &version);
    load(h, "nvmlShutdown", &shutdown);
    if (init && version && init() == 0) {
        char buf[96] = {0};
        if (version(buf, sizeof buf - 1) == 0) {
            buf[sizeof buf - 1] = '\0';
            env_copy(d->version, sizeof d->version, buf);
        }
        if (shutdown)
            shutdown();
    }
    dlclose(h);
}

void probe_driver(env_driver *d) {
    const char *lib = getenv("FLASHATTN_DOCTOR_LIBCUDA");
    const char *nvml = getenv("FLASHATTN_DOCTOR_LIBNVML");
    void *h;
    cu_init_fn init = NULL;
    cu_int_fn driver_version = NULL, count = NULL;
    cu_device_get_fn device_get = NULL;
    cu_device_name_fn device_name = NULL;
    cu_device_attr_fn device_attr = NULL;
    cu_device_mem_fn device_mem = NULL;
    cu_error_name_fn error_name = NULL;
    int n = 0, i;

    memset(d, 0, sizeof *d);
    d->init_rc = -1;
    if (lib && *lib) {
        if (!nvml || !*nvml)
            nvml = lib; /* the fake driver exports both */
    } else {
        lib = "libcuda.so.1";
        if (!nvml || !*nvml)
            nvml = "libnvidia-ml.so.1";
    }
    env_copy(d->lib, sizeof d->lib, lib);
    if (!strcmp(lib, "none")) {
        env_copy(d->error, sizeof d->error, "FLASHATTN_DOCTOR_LIBCUDA=none");
        return;
    }
    h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        env_copy(d->error, sizeof d->error, e ? e : "dlopen failed");
        return;
    }
    d->found = 1;
    load(h, "cuInit", &init);
    load(h, "cuDriverGetVersion", &driver_version);
    load(h, "cuDeviceGetCount", &count);
    load(h, "cuDeviceGet", &device_get);
    load(h, "cuDeviceGetName", &device_name);
    load(h, "cuDeviceGetAttribute", &device_attr);
    load(h, "cuDeviceTotalMem_v2", &device_mem);
    load(h, "cuGetErrorName", &error_name);
    if (init) {
        Dl_info info;
        void *p;
        memcpy(&p, &init, sizeof p);
        if (dladdr(p, &info) && info.dli_fname && strcmp(info.dli_fname, lib) != 0) {
            char both[ENV_PATH_LEN];
            snprintf(both, sizeof both, "%s", info.dli_fname);
            env_copy(d->lib, sizeof d->lib, both);
        }
    }
    if (!init || !driver_version || !count || !device_get) {
        env_copy(d->error, sizeof d->error,
                 "the library lacks cuInit/cuDriverGetVersion/"
                 "cuDeviceGetCount: not an NVIDIA driver library");
        dlclose(h);
        return;
    }
    if (driver_version(&d->cuda_version) != 0)
        d->cuda_version = 0;
    d->init_rc = init(0);
    {
        const char *name = NULL;
        if (d->init_rc != 0 && error_name && error_name(d->init_rc, &name) == 0 && name)
            env_copy(d->init_name, sizeof d->init_name, name);
        else
            env_copy(d->init_name, sizeof d->init_name, cu_error_name(d->init_rc));
    }
    /* The driver stays loaded once cuInit ran: unloading it under its own threads is unsafe. */
    driver_handle = h;
    if (d->init_rc == 0 && count(&n) == 0) {
        if (n > ENV_MAX_GPUS)
            n = ENV_MAX_GPUS;
        for (i = 0; i < n; i++) {
            env_gpu *g = &d->gpus[d->ngpus];
            int dev = 0;
            size_t bytes = 0;
            if (device_get(&dev, i) != 0)
                continue;
            if (device_name) {
                char buf[256] = {0};
                if (device_name(buf, (int)sizeof buf - 1, dev) == 0) {
                    buf[sizeof buf - 1] = '\0';
                    env_copy(g->name, sizeof g->name, buf);
                }
            }
            if (device_attr) {
                device_attr(&g->cc_major, CU_ATTR_CC_MAJOR, dev);
                device_attr(&g->cc_minor, CU_ATTR_CC_MINOR, dev);
            }
            if (device_mem && device_mem(&bytes, dev) == 0)
                g->mem_gb = (double)bytes / 1073741824.0;
            d->ngpus++;
        }
    }
    probe_nvml(d, nvml);
}
