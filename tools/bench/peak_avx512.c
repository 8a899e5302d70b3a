/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * peak_avx512.c — the AVX-512 kernels of the peak probe (peak.h). Compiled with -mavx512f (set
 * for this file alone in CMakeLists.txt, x86_64 only) and called only after peak.c has checked
 * CPUID + XGETBV. Elsewhere, or without the flag, the file builds to stubs.
 *
 * The loops are inline assembly so the compiler can neither fold nor reorder them: N
 * accumulators zmm0..zmm(N-1) each get `acc_i += zmm30 * zmm31` (the two sources are never
 * written), 4 times N instructions per loop pass. vdpbf16ps needs no compiler flag of its own
 * (the assembler knows it); only the zmm16+ clobbers need -mavx512f.
 */
#define _POSIX_C_SOURCE 200809L

#include "peak.h"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX512F__)

#define PEAK_FP32_CHAINS 16
#define PEAK_BF16_CHAINS 24

int peak_have_avx512_kernels(void) {
    return 1;
}

#define Z(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define F(i) "vfmadd231ps %%zmm31, %%zmm30, %%zmm" #i "\n\t"
#define B(i) "vdpbf16ps %%zmm31, %%zmm30, %%zmm" #i "\n\t"
#define X8(M, a, b, c, d, e, f, g, h) M(a) M(b) M(c) M(d) M(e) M(f) M(g) M(h)

double peak_kernel_avx512_fp32(uint64_t iters) {
    uint64_t n = iters ? iters : 1;
    const double flops = (double)n * 4.0 * PEAK_FP32_CHAINS * 32.0;
    /* a = 1 - 2^-20, b = 2^-20: accumulators grow slowly, never overflow or go subnormal */
    const uint32_t a = 0x3f7ffff0u, b = 0x35800000u;
    __asm__ volatile(X8(Z, 0, 1, 2, 3, 4, 5, 6, 7) X8(Z, 8, 9, 10, 11, 12, 13, 14, 15)
                     "vpbroadcastd %k[a], %%zmm30\n\t"
                     "vpbroadcastd %k[b], %%zmm31\n\t"
                     "1:\n\t"
                     ".rept 4\n\t"
                     X8(F, 0, 1, 2, 3, 4, 5, 6, 7) X8(F, 8, 9, 10, 11, 12, 13, 14, 15)
                     ".endr\n\t"
                     "dec %[n]\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper\n\t"
                     : [n] "+r"(n)
                     : [a] "r"(a), [b] "r"(b)
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm30",
                       "xmm31", "cc");
    return flops;
}

double peak_kernel_avx512_bf16(uint64_t iters) {
    uint64_t n = iters ? iters : 1;
    const double flops = (double)n * 4.0 * PEAK_BF16_CHAINS * 64.0; /* 32 products + 32 adds */
    /* bf16 pairs: a = (1, 1), b = (2^-10, 2^-10) */
    const uint32_t a = 0x3f803f80u, b = 0x3a803a80u;
    __asm__ volatile(X8(Z, 0, 1, 2, 3, 4, 5, 6, 7) X8(Z, 8, 9, 10, 11, 12, 13, 14, 15)
                     X8(Z, 16, 17, 18, 19, 20, 21, 22, 23)
                     "vpbroadcastd %k[a], %%zmm30\n\t"
                     "vpbroadcastd %k[b], %%zmm31\n\t"
                     "1:\n\t"
                     ".rept 4\n\t"
                     X8(B, 0, 1, 2, 3, 4, 5, 6, 7) X8(B, 8, 9, 10, 11, 12, 13, 14, 15)
                     X8(B, 16, 17, 18, 19, 20, 21, 22, 23)
                     ".endr\n\t"
                     "dec %[n]\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper\n\t"
                     : [n] "+r"(n)
                     : [a] "r"(a), [b] "r"(b)
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",
                       "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm30",
                       "xmm31", "cc");
    return flops;
}

#else /* not x86_64, or built without -mavx512f: never called (peak.c checks) */

int peak_have_avx512_kernels(void) {
    return 0;
}

double peak_kernel_avx512_fp32(uint64_t iters) {
    (void)iters;
    return 0.0;
}

double peak_kernel_avx512_bf16(uint64_t iters) {
    (void)iters;
    return 0.0;
}

#endif
