/* SPDX-License-Identifier: MIT */
/*
 * mma.cuh — inline-PTX wrappers for the tensor-core kernels: cp.async (16-byte global ->
 * shared copies with zero fill), ldmatrix (.x4 and .x4.trans), mma.sync m16n8k16 (and m16n8k8)
 * with fp32 accumulators, fp32 -> f16x2/bf16x2 packing and back, and ex2.approx, for each input
 * kind of mma_kind.h. Fragment layouts are the PTX ISA's (g = lane / 4, t = lane % 4):
 *   A (16x16, 4 regs): row g cols 2t, 2t+1 | row g+8 same | row g cols 2t+8, 2t+9 | row g+8 same
 *   B (16x8, 2 regs):  k rows 2t, 2t+1 col g | k rows 2t+8, 2t+9 col g
 *   C (16x8, 4 fp32):  row g cols 2t, 2t+1, then row g+8 cols 2t, 2t+1
 * m16n8k8 (f16): A is the first two registers' layout (cols 2t, 2t+1 of rows g, g+8), B one
 * register (k rows 2t, 2t+1 col g), C the same; so m16n8k16 = m16n8k8 on (a0, a1, b0), then on
 * (a2, a3, b1).
 * Compiled for sm_75, cp.async is a synchronous 16-byte copy (ld.global, st.shared; commit and
 * wait do nothing), and the sm_80 instructions (m16n8k16, bf16, cvt to f16x2) trap: their
 * kernels are never launched there. Every asm that reads or writes shared memory is volatile:
 * the same smem address holds a new tile each iteration, so none may be merged or hoisted.
 */
#ifndef FA_CUDA_MMA_CUH
#define FA_CUDA_MMA_CUH

#include "mma_kind.h"

#include <stdint.h>

/* 1 where the code is compiled for sm_80 or later (or for the host), 0 for sm_75. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define FA_SM80 0
#else
#define FA_SM80 1
#endif

static __device__ __forceinline__ uint32_t fa_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* x, opaque to the optimizer: what a loop derives from it is recomputed in the loop instead of
 * hoisted out and held in registers across it (cheap address arithmetic, scarce registers), and
 * x itself is held, not re-derived from its inputs wherever it is used. */
static __device__ __forceinline__ uint32_t fa_opaque(uint32_t x) {
    asm volatile("" : "+r"(x));
    return x;
}

static __device__ __forceinline__ int64_t fa_opaque(int64_t x) {
    asm volatile("" : "+l"(x));
    return x;
}

/* 16 bytes from global src to shared dst, bypassing L1; !valid: 16 zero bytes, nothing read
 * (src must still be a mapped address). */
static __device__ __forceinline__ void fa_cp_async16(uint32_t dst, const void *src, bool valid) {
#if FA_SM80
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
#else
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (valid)
        asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                     : "l"(src));
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(x.x), "r"(x.y),
                 "r"(x.z), "r"(x.w)
                 : "memory");
#endif
}

static __device__ __forceinline__ void fa_cp_async_commit(void) {
#if FA_SM80
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Waits for every cp.async this thread issued; other threads' copies need a barrier after. */
static __device__ __forceinline__ void fa_cp_async_wait_all(void) {
#if FA_SM80
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

/* Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, r[m] gets its
 * fragment (lane holds row lane/4, cols 2(lane%4), +1). */
static __device__ __forceinline__ void fa_ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* The same, each matrix transposed (lane holds col lane/4, rows 2(lane%4), +1). */
static __device__ __forceinline__ void fa_ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a·b on one 16x8x8 fp16 tile (sm_75 and later). */
static __device__ __forceinline__ void fa_mma1688(float (&c)[4], uint32_t a0, uint32_t a1,
                                                  uint32_t b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}

/* c += a·b on one 16x8x16 tile of input kind kIn. */
template <int kIn>
static __device__ __forceinline__ void fa_mma16816(float (&c)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
    if constexpr (kIn == FA_IN_F16_SM75) {
        fa_mma1688(c, a[0], a[1], b0);
        fa_mma1688(c, a[2], a[3], b1);
    } else {
#if FA_SM80
        if constexpr (kIn == FA_IN_BF16)
            asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        else
            asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        __trap();
#endif
    }
}

/* Two fp32 rounded to nearest-even into one f16x2/bf16x2 register of kind kIn, lo in the low
 * half. */
template <int kIn> static __device__ __forceinline__ uint32_t fa_pack2(float lo, float hi) {
    uint32_t r;
    if constexpr (kIn == FA_IN_F16_SM75) {
        unsigned short l, h;
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(l) : "f"(lo));
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(hi));
        asm("mov.b32 %0, {%1, %2};\n" : "=r"(r) : "h"(l), "h"(h));
    } else {
#if FA_SM80
        if constexpr (kIn == FA_IN_BF16)
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        else
            asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
        __trap();
        r = 0;
#endif
    }
    return r;
}

/* An fp16 or bf16 value of kind kIn (the low 16 bits of h) as fp32, exactly. */
template <int kIn> static __device__ __forceinline__ float fa_to_f32(uint32_t h) {
    if constexpr (FA_IN_IS_BF16(kIn))
        return __uint_as_float(h << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"((unsigned short)h));
    return f;
}

/* 2^x, about 2 ulp; 2^-inf = +0, results below 2^-126 flush to 0. */
static __device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif /* FA_CUDA_MMA_CUH */
