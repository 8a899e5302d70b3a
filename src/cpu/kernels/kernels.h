/* SPDX-License-Identifier: MIT */
/*
 * kernels.h — the CPU microkernel contract. A kernel set works on fp32 tiles already in cache;
 * it knows nothing of masks, batches, heads or dtypes (the blocking layer in fwd.c does). One
 * set per ISA, each in its own folder and built with its own flags; dispatch.c picks one.
 */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H

#include <stdint.h>

typedef struct fa__cpu_kernels {
    const char *name; /* "ref", "avx2", ... as accepted by FA_CPU_ISA */

    /* S = Q Kᵀ.  Q: [m, d] (row stride ldq), Kt: [d, n] (K packed transposed, row stride ldk),
     * S: [m, n] (row stride lds). */
    void (*qk)(int m, int n, int d, const float *q, int64_t ldq, const float *kt, int64_t ldk,
               float *s, int64_t lds);

    /* O = diag(alpha) O + P V.  P: [m, n] (ldp), V: [n, d] (ldv), alpha: [m], O: [m, d] (ldo). */
    void (*pv)(int m, int n, int d, const float *p, int64_t ldp, const float *v, int64_t ldv,
               const float *alpha, float *o, int64_t ldo);

    /* Dst = Srcᵀ.  Src: [n, d] (row stride lds), Dst: [d, n] (row stride ldd). Packs K as Kᵀ. */
    void (*transpose)(int n, int d, const float *src, int64_t lds, float *dst, int64_t ldd);

    /* max over x[0..n); -INFINITY when n == 0 or every element is -INFINITY. */
    float (*row_max)(int n, const float *x);

    /* x[i] = 2^(x[i] - m) in place, returning the sum. x[i] = -INFINITY or m = +INFINITY gives
     * 0, never NaN; x[i] - m <= 0 is all the callers need. */
    float (*exp2_sum)(int n, float *x, float m);
} fa__cpu_kernels;

extern const fa__cpu_kernels fa__cpu_kernels_ref;
extern const fa__cpu_kernels fa__cpu_kernels_avx2;   /* FA_HAVE_AVX2 builds */
extern const fa__cpu_kernels fa__cpu_kernels_avx512; /* FA_HAVE_AVX512 builds */

#endif /* FA_CPU_KERNELS_H */
