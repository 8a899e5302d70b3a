/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * peak.c — the peak probe of `flashattn bench` (see peak.h): the run-time CPU check, the thread
 * harness and the portable fallback kernel. The ISA kernels live in peak_avx512.c and
 * peak_avx2.c, each compiled with its own flags, and run only when the check below says the CPU
 * and the OS support them.
 */
#define _POSIX_C_SOURCE 200809L

#include "peak.h"

#include "flashattn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define PEAK_X86 1
#endif

/* ---- run-time CPU check ---------------------------------------------------------------------- */

typedef struct cpu_caps {
    int avx2_fma, avx512f, avx512_bf16;
} cpu_caps;

#ifdef PEAK_X86
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static cpu_caps detect(void) {
    cpu_caps c;
    memset(&c, 0, sizeof c);
#ifdef PEAK_X86
    {
        unsigned a = 0, b = 0, cx = 0, d = 0, max_leaf = 0, max_sub7 = 0, b7 = 0;
        uint64_t xcr0;
        if (!__get_cpuid(0, &max_leaf, &b, &cx, &d) || max_leaf < 1)
            return c;
        __get_cpuid(1, &a, &b, &cx, &d);
        if (!(cx & (1u << 27))) /* OSXSAVE: the OS manages the extended state, XGETBV works */
            return c;
        xcr0 = xgetbv0();
        if (max_leaf >= 7) {
            unsigned a7 = 0, c7 = 0, d7 = 0;
            __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7);
            max_sub7 = a7;
        }
        /* AVX2 + FMA: CPUID.1:ECX.FMA[12], CPUID.7.0:EBX.AVX2[5]; XCR0 saves SSE and AVX state */
        c.avx2_fma = (cx & (1u << 12)) && (b7 & (1u << 5)) && (xcr0 & 0x6) == 0x6;
        /* AVX-512F: CPUID.7.0:EBX[16]; XCR0 also saves opmask, ZMM_Hi256 and Hi16_ZMM (bits 5-7) */
        c.avx512f = (b7 & (1u << 16)) && (xcr0 & 0xe6) == 0xe6;
        /* AVX512_BF16: CPUID.(EAX=7,ECX=1):EAX[5] */
        if (c.avx512f && max_sub7 >= 1) {
            unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
            __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
            c.avx512_bf16 = (a71 & (1u << 5)) != 0;
        }
    }
#endif
    return c;
}

const char *peak_cpu_features(void) {
    static char buf[96];
    cpu_caps c = detect();
    snprintf(buf, sizeof buf, "%s%s%s", c.avx2_fma ? "avx2 fma " : "",
             c.avx512f ? "avx512f " : "", c.avx512_bf16 ? "avx512_bf16 " : "");
    if (!buf[0])
        snprintf(buf, sizeof buf, "(none of avx2, fma, avx512f, avx512_bf16)");
    else
        buf[strlen(buf) - 1] = '\0';
    return buf;
}

/* ---- portable fallback ----------------------------------------------------------------------- */

static volatile float peak_sink;

/* 16 independent chains of acc = acc * a + b in plain C; the compiler may vectorize it. A rough
 * bound only (no FMA contraction is guaranteed), used where no ISA kernel applies. */
static double peak_kernel_generic(uint64_t iters) {
    float acc[16];
    volatile float va = 0.99999f, vb = 1e-6f;
    const float a = va, b = vb;
    uint64_t it;
    int c;
    for (c = 0; c < 16; c++)
        acc[c] = (float)c;
    for (it = 0; it < iters; it++)
        for (c = 0; c < 16; c++)
            acc[c] = acc[c] * a + b;
    for (c = 1; c < 16; c++)
        acc[0] += acc[c];
    peak_sink = acc[0];
    return (double)iters * 16.0 * 2.0;
}

/* ---- the thread harness ---------------------------------------------------------------------- */

typedef double (*peak_kernel)(uint64_t iters);

typedef struct team {
    peak_kernel kernel;
    uint64_t iters;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go;
    double flops[1024];
    double t_end[1024];
    double cpu_s[1024]; /* each thread's CPU time in the kernel */
} team;

typedef struct member {
    team *tm;
    int id;
} member;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The calling thread's CPU time in seconds, or -1 where there is no such clock. */
static double thread_cpu_s(void) {
#ifdef CLOCK_THREAD_CPUTIME_ID
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
        return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
    return -1.0;
}

/* Runs the kernel, recording its flops, end time and CPU time in slot id. */
static void member_kernel(team *tm, int id) {
    const double c0 = thread_cpu_s();
    tm->flops[id] = tm->kernel(tm->iters);
    tm->t_end[id] = now_s();
    tm->cpu_s[id] = c0 >= 0 ? thread_cpu_s() - c0 : -1.0;
}

static void *member_run(void *arg) {
    member *m = arg;
    team *tm = m->tm;
    pthread_mutex_lock(&tm->mu);
    while (!tm->go)
        pthread_cond_wait(&tm->cv, &tm->mu);
    pthread_mutex_unlock(&tm->mu);
    member_kernel(tm, m->id);
    return NULL;
}

/* Runs the kernel on n threads at once (the caller is one); returns aggregate flops per second
 * from the common start to the last thread's end, and in *cpu_rate the sum over threads of flops
 * per CPU-second (0 if unknown). If fewer threads can be started, uses those. */
static double team_run(peak_kernel kernel, uint64_t iters, int n, double *cpu_rate) {
    team *tm = calloc(1, sizeof *tm);
    member mem[1024];
    pthread_t tid[1024];
    double t0, t1, flops = 0.0;
    int i, started = 1;
    if (!tm)
        return 0.0;
    if (n < 1)
        n = 1;
    if (n > 1024)
        n = 1024;
    tm->kernel = kernel;
    tm->iters = iters;
    pthread_mutex_init(&tm->mu, NULL);
    pthread_cond_init(&tm->cv, NULL);
    for (i = 1; i < n; i++) {
        mem[i].tm = tm;
        mem[i].id = i;
        if (pthread_create(&tid[i], NULL, member_run, &mem[i]) != 0)
            break;
        started++;
    }
    pthread_mutex_lock(&tm->mu);
    tm->go = 1;
    pthread_cond_broadcast(&tm->cv);
    pthread_mutex_unlock(&tm->mu);
    t0 = now_s();
    member_kernel(tm, 0);
    t1 = tm->t_end[0];
    for (i = 1; i < started; i++) {
        pthread_join(tid[i], NULL);
        if (tm->t_end[i] > t1)
            t1 = tm->t_end[i];
    }
    *cpu_rate = 0.0;
    for (i = 0; i < started; i++) {
        flops += tm->flops[i];
        if (tm->cpu_s[i] > 0 && *cpu_rate >= 0)
            *cpu_rate += tm->flops[i] / tm->cpu_s[i];
        else
            *cpu_rate = -1.0;
    }
    if (*cpu_rate < 0)
        *cpu_rate = 0.0;
    pthread_cond_destroy(&tm->cv);
    pthread_mutex_destroy(&tm->mu);
    free(tm);
    return t1 > t0 ? flops / (t1 - t0) : 0.0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void measure(peak_kernel kernel, int threads, int reps, double seconds, peak_result *out) {
    double rate, r[64], rc[64];
    uint64_t iters = 1000;
    int i;
    if (reps < 1)
        reps = 1;
    if (reps > 64)
        reps = 64;
    /* Calibrate on one thread until a call lasts >= 20 ms, then size the repetitions. */
    for (;;) {
        double t0 = now_s(), f = kernel(iters), dt = now_s() - t0;
        (void)f;
        if (dt >= 0.02 || iters > (1ull << 40)) {
            rate = (double)iters / (dt > 0 ? dt : 1e-9);
            break;
        }
        iters *= 4;
    }
    iters = (uint64_t)(rate * seconds);
    if (iters < 1)
        iters = 1;
    for (i = 0; i < reps; i++) {
        r[i] = team_run(kernel, iters, threads, &rc[i]) * 1e-9;
        rc[i] *= 1e-9;
    }
    qsort(r, (size_t)reps, sizeof r[0], cmp_d);
    qsort(rc, (size_t)reps, sizeof rc[0], cmp_d);
    out->gflops_cpu = reps % 2 ? rc[reps / 2] : 0.5 * (rc[reps / 2 - 1] + rc[reps / 2]);
    out->gflops = reps % 2 ? r[reps / 2] : 0.5 * (r[reps / 2 - 1] + r[reps / 2]);
    out->gflops_min = r[0];
    out->gflops_max = r[reps - 1];
    out->threads = threads;
    out->reps = reps;
}

void peak_measure_fp32(int threads, int reps, double seconds, peak_result *out) {
    cpu_caps c = detect();
    memset(out, 0, sizeof *out);
    out->note = "";
    if (c.avx512f && peak_have_avx512_kernels()) {
        out->kernel = "avx512 vfmadd231ps zmm";
        out->chains = 16;
        measure(peak_kernel_avx512_fp32, threads, reps, seconds, out);
    } else if (c.avx2_fma && peak_have_avx2_kernels()) {
        out->kernel = "avx2 vfmadd231ps ymm";
        out->chains = 12;
        if (c.avx512f)
            out->note = "AVX-512 kernel not compiled in; the zmm peak may be 2x higher";
        measure(peak_kernel_avx2_fp32, threads, reps, seconds, out);
    } else {
        out->kernel = "portable C multiply-add";
        out->chains = 16;
        out->note = "no ISA-specific probe for this CPU (only x86-64 AVX2/AVX-512 have one): a "
                    "rough bound from portable C, not the true peak";
        measure(peak_kernel_generic, threads, reps, seconds, out);
    }
}

void peak_measure_bf16(int threads, int reps, double seconds, const peak_result *fp32,
                       peak_result *out) {
    cpu_caps c = detect();
    const int dot = strstr(fa_build_info(), "+ avx512_bf16") != NULL; /* the library's choice */
    if (c.avx512_bf16 && peak_have_avx512_kernels() && dot) {
        memset(out, 0, sizeof *out);
        out->note = "";
        out->kernel = "avx512_bf16 vdpbf16ps zmm";
        out->chains = 24;
        measure(peak_kernel_avx512_bf16, threads, reps, seconds, out);
    } else if (c.avx512_bf16) { /* Sapphire Rapids: vdpbf16ps at half the FMA's products */
        *out = *fp32;
        out->note = "the library widens bf16 to fp32 on this CPU (its vdpbf16ps is slower; "
                    "FA_CPU_ISA=avx512bf16 uses it): bf16 is compared with the fp32 peak";
    } else {
        *out = *fp32;
        out->note = "no bf16 dot-product instruction on this CPU: bf16 is compared with the fp32 "
                    "FMA peak";
    }
}
