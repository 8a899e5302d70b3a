/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * envutil.c — the few string helpers the probes, the checks and the release rules share
 * (declared in envprobe.h). No dependencies, so unit tests can compile it alone.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envprobe.h"

void env_copy(char *dst, unsigned cap, const char *src) {
    size_t n;
    if (!cap)
        return;
    if (!src)
        src = "";
    n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

int env_parse_mm(const char *s, int *major, int *minor) {
    char *end;
    long a, b = 0;
    if (!s)
        return -1;
    while (*s == ' ' || *s == 'v' || *s == 'V')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    a = strtol(s, &end, 10);
    if (*end == '.' && end[1] >= '0' && end[1] <= '9')
        b = strtol(end + 1, &end, 10);
    *major = (int)a;
    *minor = (int)b;
    return 0;
}

void env_cuda_version_str(int v, char *buf, unsigned cap) {
    if (v <= 0)
        snprintf(buf, cap, "unknown");
    else
        snprintf(buf, cap, "%d.%d", v / 1000, (v % 1000) / 10);
}
