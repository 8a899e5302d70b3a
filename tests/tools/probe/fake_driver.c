/* SPDX-License-Identifier: MIT */
/*
 * fake_driver.c — a stand-in for libcuda.so.1 and libnvidia-ml.so.1, built by the doctor tests
 * and loaded through FLASHATTN_DOCTOR_LIBCUDA. Its answers come from environment variables:
 *
 *   FAKE_CUDA_DRIVER_VERSION  cuDriverGetVersion's value (default 12080 = CUDA 12.8)
 *   FAKE_CUDA_INIT            cuInit's CUresult (default 0; 100 = no device, 34 = stub, 803 ...)
 *   FAKE_CUDA_GPUS            "name:major.minor:GB;name:major.minor:GB" (default: one H100)
 *   FAKE_NVML_VERSION         nvmlSystemGetDriverVersion's string (default 570.86.15;
 *                             "fail" makes nvmlInit fail)
 */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_MAX 16

typedef struct fake_gpu {
    char name[128];
    int major, minor;
    double gb;
} fake_gpu;

static int fake_gpus(fake_gpu *g) {
    const char *spec = getenv("FAKE_CUDA_GPUS");
    int n = 0;
    if (!spec)
        spec = "NVIDIA H100 80GB HBM3:9.0:80";
    while (*spec && n < FAKE_MAX) {
        size_t len = strcspn(spec, ";");
        char item[256];
        char *c1, *c2;
        snprintf(item, sizeof item, "%.*s", (int)len, spec);
        c1 = strchr(item, ':');
        c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c1 && c2) {
            *c1 = *c2 = '\0';
            snprintf(g[n].name, sizeof g[n].name, "%s", item);
            g[n].major = atoi(c1 + 1);
            g[n].minor = strchr(c1 + 1, '.') ? atoi(strchr(c1 + 1, '.') + 1) : 0;
            g[n].gb = atof(c2 + 1);
            n++;
        }
        spec += len;
        if (*spec == ';')
            spec++;
    }
    return n;
}

int cuInit(unsigned flags) {
    const char *e = getenv("FAKE_CUDA_INIT");
    (void)flags;
    return e ? atoi(e) : 0;
}

int cuDriverGetVersion(int *v) {
    const char *e = getenv("FAKE_CUDA_DRIVER_VERSION");
    *v = e ? atoi(e) : 12080;
    return 0;
}

int cuDeviceGetCount(int *n) {
    fake_gpu g[FAKE_MAX];
    *n = fake_gpus(g);
    return 0;
}

int cuDeviceGet(int *dev, int ordinal) {
    *dev = ordinal;
    return 0;
}

int cuDeviceGetName(char *name, int len, int dev) {
    fake_gpu g[FAKE_MAX];
    int n = fake_gpus(g);
    if (dev < 0 || dev >= n || len <= 0)
        return 101;
    snprintf(name, (size_t)len, "%s", g[dev].name);
    return 0;
}

int cuDeviceGetAttribute(int *v, int attr, int dev) {
    fake_gpu g[FAKE_MAX];
    int n = fake_gpus(g);
    if (dev < 0 || dev >= n)
        return 101;
    if (attr == 75)
        *v = g[dev].major;
    else if (attr == 76)
        *v = g[dev].minor;
    else
        *v = 0;
    return 0;
}

int cuDeviceTotalMem_v2(size_t *bytes, int dev) {
    fake_gpu g[FAKE_MAX];
    int n = fake_gpus(g);
    if (dev < 0 || dev >= n)
        return 101;
    *bytes = (size_t)(g[dev].gb * 1073741824.0);
    return 0;
}

int cuGetErrorName(int rc, const char **name) {
    switch (rc) {
    case 100:
        *name = "CUDA_ERROR_NO_DEVICE";
        return 0;
    case 34:
        *name = "CUDA_ERROR_STUB_LIBRARY";
        return 0;
    case 803:
        *name = "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
        return 0;
    default:
        return 1;
    }
}

int nvmlInit_v2(void) {
    const char *e = getenv("FAKE_NVML_VERSION");
    return e && !strcmp(e, "fail") ? 1 : 0;
}

int nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    const char *e = getenv("FAKE_NVML_VERSION");
    snprintf(buf, len, "%s", e ? e : "570.86.15");
    return 0;
}

int nvmlShutdown(void) { return 0; }
