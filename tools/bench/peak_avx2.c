/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * peak_avx2.c — the AVX2 + FMA kernel of the peak probe (peak.h), for x86-64 CPUs without
 * AVX-512. Compiled with -mavx2 -mfma (set for this file alone in CMakeLists.txt, x86_64 only)
 * and called only after peak.c has checked CPUID + XGETBV; elsewhere it builds to a stub.
 * 12 accumulators ymm0..ymm11 (VEX encoding has 16 registers; two hold the sources).
 */
#define _POSIX_C_SOURCE 200809L

#include "peak.h"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__)

#define PEAK_AVX2_CHAINS 12

int peak_have_avx2_kernels(void) {
    return 1;
}

#define Z(i) "vpxor %%ymm" #i ", %%ymm" #i ", %%ymm" #i "\n\t"
#define F(i) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #i "\n\t"
#define X6(M, a, b, c, d, e, f) M(a) M(b) M(c) M(d) M(e) M(f)

double peak_kernel_avx2_fp32(uint64_t iters) {
    uint64_t n = iters ? iters : 1;
    const double flops = (double)n * 4.0 * PEAK_AVX2_CHAINS * 16.0;
    const uint32_t a = 0x3f7ffff0u, b = 0x35800000u;
    __asm__ volatile(X6(Z, 0, 1, 2, 3, 4, 5) X6(Z, 6, 7, 8, 9, 10, 11)
                     "vmovd %k[a], %%xmm14\n\t"
                     "vpbroadcastd %%xmm14, %%ymm14\n\t"
                     "vmovd %k[b], %%xmm15\n\t"
                     "vpbroadcastd %%xmm15, %%ymm15\n\t"
                     "1:\n\t"
                     ".rept 4\n\t"
                     X6(F, 0, 1, 2, 3, 4, 5) X6(F, 6, 7, 8, 9, 10, 11)
                     ".endr\n\t"
                     "dec %[n]\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper\n\t"
                     : [n] "+r"(n)
                     : [a] "r"(a), [b] "r"(b)
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm14", "xmm15", "cc");
    return flops;
}

#else

int peak_have_avx2_kernels(void) {
    return 0;
}

double peak_kernel_avx2_fp32(uint64_t iters) {
    (void)iters;
    return 0.0;
}

#endif
