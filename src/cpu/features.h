/* SPDX-License-Identifier: MIT */
/*
 * features.h — the CPU features the kernels care about, usable by this process (CPU and OS).
 */
#ifndef FA_CPU_FEATURES_H
#define FA_CPU_FEATURES_H

#include <stdint.h>

typedef struct fa__cpu_features {
    int avx2;       /* AVX2 and FMA, with YMM state enabled */
    int fma;
    int f16c;
    int avx512f;    /* with ZMM and opmask state enabled */
    int avx512bw_vl; /* AVX512BW and AVX512VL */
    int avx512bf16;  /* with BW and VL, as the bf16 kernels use them */
    int bf16_dot_fast; /* AVX512_BF16 on a core whose vdpbf16ps beats widening + fp32 FMA */
    int asks_l2;       /* decode's prefetches read best into L2 (prefetcht1), not L1 */
    int neon;
} fa__cpu_features;

/* Detected once per process; never NULL. */
const fa__cpu_features *fa__cpu_features_get(void);

#endif /* FA_CPU_FEATURES_H */
