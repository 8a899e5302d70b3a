/* SPDX-License-Identifier: MIT */
// mma.cuh (emulated) — cuda/mma.cuh's wrappers with the same names and signatures, carried out
// by emu.h on the host. The kernel copy the tests build includes "mma.cuh" and finds this one
// first (tests/CMakeLists.txt puts this folder ahead of cuda/).
#ifndef FA_CUDA_MMA_CUH
#define FA_CUDA_MMA_CUH
#include <stdint.h>

static inline uint32_t fa_smem_u32(const emu::SmemPtr &p) { return p.off; }
static inline uint32_t fa_opaque(uint32_t x) { return x; }
static inline int64_t fa_opaque(int64_t x) { return x; }
static inline void fa_cp_async16(uint32_t dst, const void *src, bool valid) {
    emu::cp_async16(dst, src, valid);
}
static inline void fa_cp_async_commit(void) { emu::cp_async_commit(); }
static inline void fa_cp_async_wait_all(void) { emu::cp_async_wait_all(); }
static inline void emu_ldsm(uint32_t (&r)[4], uint32_t addr, int op) {
    emu::CIn x{};
    x.op = op;
    x.u[0] = addr;
    const emu::COut o = emu::collective(x);
    for (int i = 0; i < 4; ++i)
        r[i] = o.r[i];
}
static inline void fa_ldsm_x4(uint32_t (&r)[4], uint32_t addr) { emu_ldsm(r, addr, emu::OP_LDSM); }
static inline void fa_ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    emu_ldsm(r, addr, emu::OP_LDSM_T);
}
template <bool kBf16>
static inline void fa_mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::CIn x{};
    x.op = kBf16 ? emu::OP_MMA_BF16 : emu::OP_MMA_F16;
    for (int i = 0; i < 4; ++i)
        x.u[i] = a[i], x.c[i] = c[i];
    x.b0 = b0;
    x.b1 = b1;
    const emu::COut o = emu::collective(x);
    for (int i = 0; i < 4; ++i)
        c[i] = o.c[i];
}
template <bool kBf16> static inline uint32_t fa_pack2(float lo, float hi) {
    if (kBf16)
        return (uint32_t)emu::f2bf(lo) | ((uint32_t)emu::f2bf(hi) << 16);
    return (uint32_t)emu::f2h(lo) | ((uint32_t)emu::f2h(hi) << 16);
}
template <bool kBf16> static inline float fa_to_f32(uint32_t h) {
    return kBf16 ? emu::bf2f((uint16_t)h) : emu::h2f((uint16_t)h);
}
static inline float fa_exp2(float x) { // ex2.approx.ftz.f32
    if (fpclassify(x) == FP_SUBNORMAL)
        x = 0.0f;
    float y = exp2f(x);
    if (fpclassify(y) == FP_SUBNORMAL)
        y = 0.0f;
    return y;
}
#endif
