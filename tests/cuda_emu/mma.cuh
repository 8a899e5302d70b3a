/* SPDX-License-Identifier: MIT */
// mma.cuh (emulated) — cuda/mma.cuh's wrappers with the same names and signatures, carried out
// by emu.h on the host. The kernel copy the tests build includes "mma.cuh" and finds this one
// first (tests/CMakeLists.txt puts this folder ahead of cuda/).
#ifndef FA_CUDA_MMA_CUH
#define FA_CUDA_MMA_CUH
#include "mma_kind.h"

#include <stdint.h>

#define FA_SM80 1 /* the kernels' sm_80 code is compiled; emu::g_sm says what may run */

static inline uint32_t fa_smem_u32(const emu::SmemPtr &p) { return p.off; }
static inline uint32_t fa_opaque(uint32_t x) { return x; }
static inline int64_t fa_opaque(int64_t x) { return x; }
static inline void fa_cp_async16(uint32_t dst, const void *src, bool valid) {
    if (emu::g_sm < 80) // the sm_75 build: a synchronous copy
        emu::copy16_sync(dst, src, valid);
    else
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
static inline void fa_mma1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    emu::CIn x{};
    x.op = emu::OP_MMA_F16_K8;
    x.u[0] = a0, x.u[1] = a1;
    for (int i = 0; i < 4; ++i)
        x.c[i] = c[i];
    x.b0 = b;
    const emu::COut o = emu::collective(x);
    for (int i = 0; i < 4; ++i)
        c[i] = o.c[i];
}
template <int kIn>
static inline void fa_mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (kIn == FA_IN_F16_SM75) { // cuda/mma.cuh: two m16n8k8
        fa_mma1688(c, a[0], a[1], b0);
        fa_mma1688(c, a[2], a[3], b1);
        return;
    }
    emu::CIn x{};
    x.op = kIn == FA_IN_BF16 ? emu::OP_MMA_BF16 : emu::OP_MMA_F16;
    for (int i = 0; i < 4; ++i)
        x.u[i] = a[i], x.c[i] = c[i];
    x.b0 = b0;
    x.b1 = b1;
    const emu::COut o = emu::collective(x);
    for (int i = 0; i < 4; ++i)
        c[i] = o.c[i];
}
template <int kIn> static inline uint32_t fa_pack2(float lo, float hi) {
    if (kIn != FA_IN_F16_SM75 && emu::g_sm < 80)
        EMU_ERR("cvt.rn.%s.f32 on an emulated sm_%d (needs sm_80)",
                kIn == FA_IN_BF16 ? "bf16x2" : "f16x2", emu::g_sm);
    if (kIn == FA_IN_BF16)
        return (uint32_t)emu::f2bf(lo) | ((uint32_t)emu::f2bf(hi) << 16);
    return (uint32_t)emu::f2h(lo) | ((uint32_t)emu::f2h(hi) << 16);
}
template <int kIn> static inline float fa_to_f32(uint32_t h) {
    return kIn == FA_IN_BF16 ? emu::bf2f((uint16_t)h) : emu::h2f((uint16_t)h);
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
