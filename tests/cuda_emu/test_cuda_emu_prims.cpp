/* SPDX-License-Identifier: MIT */
// test_cuda_emu_prims.cpp — checks the emulator (emu.h, mma.cuh here) before it is trusted with
// the kernel: ldmatrix.x4 and ldmatrix.x4.trans feeding mma.sync m16n8k16 (fp16 and bf16) with
// the PTX ISA's address patterns (A row-major; B once as Bᵀ[n][k] through ldmatrix, once as
// B[k][n] through ldmatrix.trans) against a scalar matmul, shfl_xor and any; and that its race
// detector fires when the __syncwarp between the shared-memory stores and the ldmatrix reads is
// left out.
#include "emu.h"
#include "mma.cuh"
#include <random>

static uint16_t A[16][16], Bt[16][16], Bkn[16][16];
static float out_nt[16][16], out_t[16][16];
static float sh_out[32];
static int any_out[32];

static bool g_skip_sync; /* leave out the __syncwarp: the race detector must report it */

template <bool bf> static void kern(int) {
    const int l = threadIdx.x, g = l >> 2, t = l & 3;
    emu::SmemPtr smem{0};
    if (l == 0) {
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 16; ++j) {
                *(uint16_t *)(smem + 0 + i * 32 + j * 2) = A[i][j];
                *(uint16_t *)(smem + 512 + i * 32 + j * 2) = Bt[i][j];
                *(uint16_t *)(smem + 1024 + i * 32 + j * 2) = Bkn[i][j];
            }
    }
    if (!g_skip_sync)
        __syncwarp();
    uint32_t a[4], b[4], bt[4];
    fa_ldsm_x4(a, (l % 16) * 32 + (l / 16) * 16);
    fa_ldsm_x4(b, 512 + ((l / 16) * 8 + l % 8) * 32 + ((l / 8) % 2) * 16);
    fa_ldsm_x4_trans(bt, 1024 + (((l / 8) % 2) * 8 + l % 8) * 32 + (l / 16) * 16);
    float c[2][4] = {}, d[2][4] = {};
    fa_mma16816<bf>(c[0], a, b[0], b[1]);
    fa_mma16816<bf>(c[1], a, b[2], b[3]);
    fa_mma16816<bf>(d[0], a, bt[0], bt[1]);
    fa_mma16816<bf>(d[1], a, bt[2], bt[3]);
    for (int n = 0; n < 2; ++n) {
        out_nt[g][n * 8 + 2 * t] = c[n][0];
        out_nt[g][n * 8 + 2 * t + 1] = c[n][1];
        out_nt[g + 8][n * 8 + 2 * t] = c[n][2];
        out_nt[g + 8][n * 8 + 2 * t + 1] = c[n][3];
        out_t[g][n * 8 + 2 * t] = d[n][0];
        out_t[g][n * 8 + 2 * t + 1] = d[n][1];
        out_t[g + 8][n * 8 + 2 * t] = d[n][2];
        out_t[g + 8][n * 8 + 2 * t + 1] = d[n][3];
    }
    float v = (float)l;
    sh_out[l] = __shfl_xor_sync(0xffffffffu, v, 2) * 100 + __shfl_xor_sync(0xffffffffu, v, 1);
    any_out[l] = __any_sync(0xffffffffu, l == 17) * 2 + __any_sync(0xffffffffu, 0);
}

template <bool bf> static int run() {
    std::mt19937 rng(bf ? 7 : 3);
    std::uniform_real_distribution<float> U(-2, 2);
    float Bm[16][16], Af[16][16];
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
            uint16_t x = bf ? emu::f2bf(U(rng)) : emu::f2h(U(rng));
            A[i][j] = x;
            Af[i][j] = bf ? emu::bf2f(x) : emu::h2f(x);
            uint16_t y = bf ? emu::f2bf(U(rng)) : emu::f2h(U(rng));
            Bm[i][j] = bf ? emu::bf2f(y) : emu::h2f(y); // B[k=i][n=j]
            Bkn[i][j] = y;
        }
    for (int n = 0; n < 16; ++n)
        for (int k = 0; k < 16; ++k)
            Bt[n][k] = Bkn[k][n];
    emu::launch(kern<bf>, 1, 32, 2048, 0);
    double e1 = 0, e2 = 0;
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
            double r = 0;
            for (int k = 0; k < 16; ++k)
                r += (double)Af[i][k] * Bm[k][j];
            e1 = fmax(e1, fabs(out_nt[i][j] - r));
            e2 = fmax(e2, fabs(out_t[i][j] - r));
        }
    int bad = 0;
    for (int l = 0; l < 32; ++l) {
        if (sh_out[l] != (float)((l ^ 2) * 100 + (l ^ 1)))
            bad++;
        if (any_out[l] != 2)
            bad++;
    }
    printf("%s: ldmatrix.x4(A) + ldmatrix.x4(Bt) + mma: max err %.3g; ldmatrix.x4.trans(B) + mma: "
           "max err %.3g; shfl/any bad %d\n",
           bf ? "bf16" : "fp16", e1, e2, bad);
    return e1 > 1e-4 || e2 > 1e-4 || bad;
}

int main() {
    int r = run<false>() | run<true>();
    const long clean = emu::g_errors;
    printf("emu errors with the __syncwarp: %ld (want 0)\n", clean);
    g_skip_sync = true;
    emu::g_verbose_errs = 0;
    run<false>();
    const long races = emu::g_errors - clean;
    printf("emu errors without it: %ld (want > 0: the race detector)\n", races);
    const int fail = r || clean != 0 || races == 0;
    printf("%s\n", fail ? "FAIL" : "PASS");
    return fail;
}
