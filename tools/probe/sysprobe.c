/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * sysprobe.c — the machine below the toolchain: CPU model and SIMD features (/proc/cpuinfo),
 * CPU count, RAM available to a build (MemAvailable and the cgroup v2/v1 memory limit, which is
 * what kills container builds), the glibc version (confstr) and the libstdc++ the loader finds
 * (dlopen + dladdr, then its GLIBCXX_/CXXABI_ version definitions read from the ELF file).
 */
#define _GNU_SOURCE /* dladdr, confstr(_CS_GNU_LIBC_VERSION) */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "../elf/elfread.h"
#include "envprobe.h"
#include "verutil.h"

/* ---- CPU ------------------------------------------------------------------------------------- */

void probe_cpu(env_cpu *c) {
    static const char *const wanted[] = {
        "sse4_2",   "avx",      "avx2",        "fma",         "f16c",     "avx512f",
        "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
        "asimd",    "asimdhp",  "sve",         "sve2",        "bf16",     NULL};
    struct utsname u;
    FILE *f;
    char line[4096];
    const char *env = getenv("FLASHATTN_DOCTOR_NCPU");
    long n;

    memset(c, 0, sizeof *c);
    if (uname(&u) == 0)
        env_copy(c->arch, sizeof c->arch, u.machine);
    n = sysconf(_SC_NPROCESSORS_ONLN);
    c->ncpu = n > 0 ? (int)n : 1;
    if (env && atoi(env) > 0)
        c->ncpu = atoi(env);

    f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        if (!c->model[0] && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5))) {
            char *v = colon + 1;
            v += strspn(v, " \t");
            v[strcspn(v, "\n")] = '\0';
            env_copy(c->model, sizeof c->model, v);
        }
        if (!c->simd[0] && (!strncmp(line, "flags", 5) || !strncmp(line, "Features", 8))) {
            int i;
            size_t len = 0;
            char padded[4200];
            snprintf(padded, sizeof padded, " %s ", colon + 1);
            padded[strcspn(padded, "\n")] = ' ';
            for (i = 0; wanted[i]; i++) {
                char needle[40];
                snprintf(needle, sizeof needle, " %s ", wanted[i]);
                if (strstr(padded, needle) && len + strlen(wanted[i]) + 2 < sizeof c->simd) {
                    len += (size_t)snprintf(c->simd + len, sizeof c->simd - len, "%s%s",
                                            len ? " " : "", wanted[i]);
                }
            }
            if (!c->simd[0])
                env_copy(c->simd, sizeof c->simd, "(none of the AVX/NEON features)");
        }
    }
    fclose(f);
}

/* ---- memory ---------------------------------------------------------------------------------- */

static double read_limit_bytes(const char *path) {
    FILE *f = fopen(path, "r");
    char buf[64];
    double v = 0;
    if (!f)
        return 0;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3) != 0)
        v = strtod(buf, NULL);
    fclose(f);
    /* v1 reports "no limit" as a huge number */
    if (v <= 0 || v > 1e17)
        return 0;
    return v;
}

void probe_mem(env_mem *m) {
    const char *env = getenv("FLASHATTN_DOCTOR_MEM_GB");
    FILE *f;
    char line[256];
    double cg;
    memset(m, 0, sizeof *m);
    if (env && strtod(env, NULL) > 0) {
        m->total_gb = m->avail_gb = m->build_gb = strtod(env, NULL);
        env_copy(m->source, sizeof m->source, "FLASHATTN_DOCTOR_MEM_GB");
        return;
    }
    f = fopen("/proc/meminfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            double kb = 0;
            if (sscanf(line, "MemTotal: %lf", &kb) == 1)
                m->total_gb = kb / (1024.0 * 1024.0);
            else if (sscanf(line, "MemAvailable: %lf", &kb) == 1)
                m->avail_gb = kb / (1024.0 * 1024.0);
        }
        fclose(f);
        env_copy(m->source, sizeof m->source, "/proc/meminfo");
    } else {
        long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psize > 0)
            m->total_gb = m->avail_gb = (double)pages * (double)psize / 1073741824.0;
        env_copy(m->source, sizeof m->source, "sysconf");
    }
    cg = read_limit_bytes("/sys/fs/cgroup/memory.max");
    if (cg <= 0)
        cg = read_limit_bytes("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    m->cgroup_gb = cg / 1073741824.0;
    m->build_gb = m->avail_gb;
    if (m->cgroup_gb > 0 && m->cgroup_gb < m->build_gb)
        m->build_gb = m->cgroup_gb;
}

/* ---- glibc and libstdc++ --------------------------------------------------------------------- */

/* The highest GLIBCXX_3.4.N and CXXABI_1.3.N a libstdc++ file defines. */
static int libstdcxx_versions(const char *path, char *glibcxx, unsigned gcap, char *cxxabi,
                              unsigned ccap, char *err, unsigned ecap) {
    elfr_file ef;
    size_t i;
    const char *best = NULL, *best_abi = NULL;
    if (elfr_open(path, &ef) != 0) {
        env_copy(err, ecap, ef.error);
        elfr_free(&ef);
        return -1;
    }
    for (i = 0; i < ef.n_vdefs; i++) {
        const char *v = ef.vdefs[i];
        if (ver_after(v, "GLIBCXX_") && (!best || ver_cmp(v, best) > 0))
            best = v;
        if (ver_after(v, "CXXABI_") && !ver_after(v, "CXXABI_TM_") &&
            (!best_abi || ver_cmp(v, best_abi) > 0))
            best_abi = v;
    }
    env_copy(glibcxx, gcap, best ? best : "");
    env_copy(cxxabi, ccap, best_abi ? best_abi : "");
    if (!best)
        env_copy(err, ecap, "no GLIBCXX_ version definitions (not a libstdc++?)");
    elfr_free(&ef);
    return best ? 0 : -1;
}

void probe_libc(env_libc *l) {
    const char *env = getenv("FLASHATTN_DOCTOR_GLIBC");
    const char *cxx = getenv("FLASHATTN_DOCTOR_LIBSTDCXX");
    const char *conda = getenv("CONDA_PREFIX");
    memset(l, 0, sizeof *l);
    if (env && *env) {
        env_copy(l->glibc, sizeof l->glibc, env);
    } else {
#ifdef _CS_GNU_LIBC_VERSION
        char buf[64];
        size_t n = confstr(_CS_GNU_LIBC_VERSION, buf, sizeof buf);
        if (n > 0 && n <= sizeof buf) {
            const char *sp = strchr(buf, ' '); /* "glibc 2.36" */
            env_copy(l->glibc, sizeof l->glibc, sp ? sp + 1 : buf);
        }
#endif
    }

    if (cxx && *cxx) {
        if (strcmp(cxx, "none") != 0)
            env_copy(l->libstdcxx, sizeof l->libstdcxx, cxx);
    } else {
        void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
        if (h) {
            void *sym = dlsym(h, "_ZSt9terminatev");
            Dl_info info;
            if (sym && dladdr(sym, &info) && info.dli_fname)
                env_copy(l->libstdcxx, sizeof l->libstdcxx, info.dli_fname);
            dlclose(h);
        } else {
            const char *e = dlerror();
            env_copy(l->libstdcxx_error, sizeof l->libstdcxx_error, e ? e : "not found");
        }
    }
    if (l->libstdcxx[0])
        libstdcxx_versions(l->libstdcxx, l->glibcxx_max, sizeof l->glibcxx_max, l->cxxabi_max,
                           sizeof l->cxxabi_max, l->libstdcxx_error, sizeof l->libstdcxx_error);
    if (conda && *conda) {
        char p[ENV_PATH_LEN], dummy[32], err[64];
        snprintf(p, sizeof p, "%s/lib/libstdc++.so.6", conda);
        if (access(p, R_OK) == 0) {
            env_copy(l->conda_libstdcxx, sizeof l->conda_libstdcxx, p);
            libstdcxx_versions(p, l->conda_glibcxx_max, sizeof l->conda_glibcxx_max, dummy,
                               sizeof dummy, err, sizeof err);
        }
    }
}
