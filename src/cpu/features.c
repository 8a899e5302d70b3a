/* SPDX-License-Identifier: MIT */
/*
 * features.c — what this CPU and its OS support, read once: CPUID for the instruction sets and
 * XGETBV for whether the OS saves the wider registers (a CPU with AVX-512 under an OS that does
 * not enable ZMM state must not run AVX-512 code).
 */
#include "features.h"

#include <pthread.h>

static fa__cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const unsigned base_family = (a >> 8) & 0xf; /* family: base, plus extended where base is 0xf */
    const unsigned family = base_family == 0xf ? 0xf + ((a >> 20) & 0xff) : base_family;
    const int osxsave = (c >> 27) & 1;
    features.fma = (c >> 12) & 1;
    features.f16c = (c >> 29) & 1;
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const int ymm_state = (xcr0 & 0x6) == 0x6;     /* SSE and AVX state */
    const int zmm_state = (xcr0 & 0xe6) == 0xe6;   /* plus opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    features.avx2 = ymm_state && ((b >> 5) & 1) && features.fma;
    features.avx512f = zmm_state && ((b >> 16) & 1);
    features.avx512bw_vl = features.avx512f && ((b >> 30) & 1) && ((b >> 31) & 1);
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        features.avx512bf16 = features.avx512bw_vl && ((a >> 5) & 1);
    /* vdpbf16ps does two products per lane at the FMA's rate on AMD's cores (Zen 4: decode's
     * scores in 0.58 of the widening path's time), at half that rate on Sapphire Rapids, where
     * the bf16 forward took 1.5x and the backward 1.4x the widening path's time
     * (bench/results/2026-12-02-cpu-spr-bf16-dot.md). Vendor, not a timing at start-up: a
     * process's choice of products, and so its results, must not depend on the host's load. */
    __get_cpuid(0, &a, &b, &c, &d);
    const int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* AuthenticAMD */
    features.bf16_dot_fast = features.avx512bf16 && amd;
    /* Decode's prefetches of the next rows (dispatch.c: add_l2_asks): on Sapphire Rapids AVX-512
     * decode took 0.78-0.95 of its time at 16k-64k tokens asking into L2 rather than L1
     * (bench/results/2026-12-03-decode-spr-l2.md); on Zen 5 asking into L1 took 0.75-0.93 of
     * the time into L2 (2026-12-02-decode-zen5-order.md); on Zen 4 (family 0x19) asking into
     * L2 took 0.62-0.74 of the time into L1 at 16k and 64k tokens, fp32, fp16 and bf16
     * (2026-12-04-decode-zen4-l2.md). By vendor and family, as above. */
    const int intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu; /* GenuineIntel */
    features.asks_l2 = intel || (amd && family < 0x1a); /* Zen 5 is family 0x1a */
    features.fma = features.fma && ymm_state;
    features.f16c = features.f16c && ymm_state;
}
#elif defined(__aarch64__)
static void detect(void) { features.neon = 1; /* Advanced SIMD is mandatory on AArch64 */ }
#else
static void detect(void) {}
#endif

const fa__cpu_features *fa__cpu_features_get(void) {
    pthread_once(&features_once, detect);
    return &features;
}
