/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * envprobe.c — runs every probe once, in the order a person debugging an install would look:
 * machine, driver, toolkit, compilers, C/C++ runtime, then Python (the slow one).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "envprobe.h"

void env_probe(fa_env *e, const env_options *o) {
    env_options opts;
    const char *t = getenv("FLASHATTN_DOCTOR_TIMEOUT");
    double tool_timeout;
    memset(e, 0, sizeof *e);
    memset(&opts, 0, sizeof opts);
    if (o)
        opts = *o;
    if (opts.timeout_s <= 0)
        opts.timeout_s = t && strtod(t, NULL) > 0 ? strtod(t, NULL) : 60.0;
    tool_timeout = opts.timeout_s < 20.0 ? opts.timeout_s : 20.0;
    probe_cpu(&e->cpu);
    probe_mem(&e->mem);
    probe_driver(&e->drv);
    probe_cuda(&e->cuda, tool_timeout);
    probe_cxx(&e->cxx, tool_timeout);
    probe_libc(&e->libc);
    probe_python(&e->py, &opts);
}
