/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * peak.h — a short probe of this machine's arithmetic peak for `flashattn bench`, so that speed
 * can be reported as a fraction of what the machine can do, measured in the same run.
 *
 * The probe runs many independent accumulator chains of one instruction (16 chains of fp32 FMA,
 * 24 of bf16 dot products: more than latency x throughput, so the FMA pipes never wait) for about
 * 0.12 s a repetition on each of `threads` pthreads at once, and reports the median aggregate
 * GFLOP/s over the repetitions (the max and min too). Which kernel runs is decided at run time
 * from CPUID + XGETBV (this file's own check; the tool does not see the library's internals):
 *
 *   fp32  AVX-512F  vfmadd231ps zmm (32 flop/instr) > AVX2+FMA vfmadd231ps ymm (16) > portable C
 *   bf16  AVX512_BF16 vdpbf16ps zmm (64 flop/instr); without it there is no bf16 dot instruction,
 *         and bf16 work is compared with the fp32 peak (peak_result.kernel says so); so it is
 *         where the library does not use vdpbf16ps (fa_build_info() lacks "+ avx512_bf16":
 *         Intel's cores, where it runs at half the FMA's products; the note says so)
 */
#ifndef FA_TOOLS_PEAK_H
#define FA_TOOLS_PEAK_H

#include <stdint.h>

typedef struct peak_result {
    double gflops;         /* median over the repetitions, all threads together */
    double gflops_min, gflops_max;
    /* The same work divided by each thread's own CPU time (CLOCK_THREAD_CPUTIME_ID), summed over
     * the threads: the rate with a whole CPU per thread, whatever else the machine runs. Equal to
     * gflops on an idle machine; gflops / gflops_cpu is the share of the CPUs the probe got.
     * 0 where thread CPU clocks are unavailable. */
    double gflops_cpu;
    int threads, chains, reps;
    const char *kernel;    /* e.g. "avx512 vfmadd231ps zmm" */
    const char *note;      /* "" or why a fallback was used */
} peak_result;

/* The CPU features the probe found usable (CPUID and OS support), e.g. "avx2 fma avx512f
 * avx512_bf16". Static storage. */
const char *peak_cpu_features(void);

/* Measures the fp32 FMA peak on `threads` threads: `reps` repetitions of about `seconds` each. */
void peak_measure_fp32(int threads, int reps, double seconds, peak_result *out);

/* Measures the bf16 dot-product peak (vdpbf16ps), or, where the CPU has none or the library
 * does not use it, copies *fp32 with a note saying so. */
void peak_measure_bf16(int threads, int reps, double seconds, const peak_result *fp32,
                       peak_result *out);

/* ---- kernels (internal to the probe) ---------------------------------------------------------
 * Each runs `iters` >= 1 loop passes on the calling thread and returns the flops it did. The
 * ISA-specific ones are defined in files compiled with their own flags (see CMakeLists.txt) and
 * are only called after the run-time check. */
double peak_kernel_avx512_fp32(uint64_t iters); /* peak_avx512.c */
double peak_kernel_avx512_bf16(uint64_t iters); /* peak_avx512.c */
double peak_kernel_avx2_fp32(uint64_t iters);   /* peak_avx2.c */
int peak_have_avx512_kernels(void);             /* 1 if peak_avx512.c was built with its flags */
int peak_have_avx2_kernels(void);               /* 1 if peak_avx2.c was built with its flags */

#endif /* FA_TOOLS_PEAK_H */
