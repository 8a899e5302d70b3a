/* SPDX-License-Identifier: MIT */
/*
 * cuda_peak.cu — fa_cuda_peak: the rates of the forward kernel's two hot instructions on the GPU
 * at hand, so that bench/gpu_bench.py quotes flashattn's TFLOP/s against ceilings measured in the
 * same run (what `flashattn bench`'s peak probe is to the CPU forward):
 *   mma  mma.sync.m16n8k16 bf16 -> fp32 (cuda/mma.cuh's fa_mma16816, the instruction of both of
 *        the forward's products, FA2's too): TFLOP/s, every SM busy, 8 independent
 *        accumulators a warp;
 *   ex2  ex2.approx.ftz.f32 (fa_exp2, one per score in the softmax): Gop/s.
 * Each is timed with CUDA events: after a warm-up, a timed launch sizes the grid for about 20 ms,
 * then the median of 7 launches. The results are checked, so an instruction the compiler dropped
 * would show: the mma accumulators must have grown by exactly iters times what one iteration
 * adds (small dyadic operands: every partial sum is exact in fp32), and every ex2 chain must stay
 * in [1/2, 1].
 *
 *     fa_cuda_peak        one JSON object on stdout, a readable line on stderr
 *
 * Exit status: 0; 1 a CUDA error or a wrong result; 2 no CUDA device (or no driver).
 */
#include "mma.cuh"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

enum { kThreads = 128, kChains = 8, kIters = 4096, kRuns = 7 };
static const float kTargetMs = 20.0f;

/* Operand k of thread x: one of ±1/4, ±1/2, ±3/4, ±1, so that products are multiples of 1/16
 * and a 16-term dot product is at most 16: kIters of them stay below 2^20, exact in fp32. */
static __device__ float fa_operand(int x, int k) {
    const int v = (x * 37 + k * 11 + 5) & 7;
    return (v < 4 ? 1.0f : -1.0f) * (float)((v & 3) + 1) * 0.25f;
}

/* kChains accumulators a thread (started at 0..kChains-1, so no two MMAs are the same expression
 * to merge), iters MMAs each on fixed operands. one == NULL: block 0 writes its sums over the
 * chains to first[4·thread + e]; else every thread compares its sums with those of one iteration
 * (one[], from such a launch) and counts a mismatch in *bad. */
__global__ void __launch_bounds__(kThreads)
    fa_peak_mma(float *first, const float *one, int iters, unsigned *bad) {
    const int x = threadIdx.x;
    uint32_t a[4], b[2]; // A: [16, 16] and B: [16, 8] fragments, bf16x2
    for (int r = 0; r < 4; ++r)
        a[r] = fa_pack2<FA_IN_BF16>(fa_operand(x, 2 * r), fa_operand(x, 2 * r + 1));
    for (int r = 0; r < 2; ++r)
        b[r] = fa_pack2<FA_IN_BF16>(fa_operand(x, 8 + 2 * r), fa_operand(x, 9 + 2 * r));
    float c[kChains][4]; // C: [16, 8] fp32 fragments
#pragma unroll
    for (int j = 0; j < kChains; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            c[j][e] = (float)j;
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int j = 0; j < kChains; ++j)
            fa_mma16816<FA_IN_BF16>(c[j], a, b[0], b[1]);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}; // exact: every term is a multiple of 1/16 < 2^20
#pragma unroll
    for (int j = 0; j < kChains; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            sum[e] += c[j][e];
    const float base = kChains * (kChains - 1) / 2; // the chains' starting values
    if (!one) {
        if (blockIdx.x == 0)
            for (int e = 0; e < 4; ++e)
                first[4 * x + e] = sum[e];
        return;
    }
    for (int e = 0; e < 4; ++e)
        if (sum[e] != base + (float)iters * (one[4 * x + e] - base))
            atomicAdd(bad, 1u);
}

/* kChains chains y <- 2^-y a thread, iters steps each: y stays in [1/2, 1]. */
__global__ void __launch_bounds__(kThreads) fa_peak_ex2(int iters, unsigned *bad) {
    float y[kChains];
#pragma unroll
    for (int j = 0; j < kChains; ++j)
        y[j] = (float)(threadIdx.x * kChains + j) / (kThreads * kChains);
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int j = 0; j < kChains; ++j)
            y[j] = fa_exp2(-y[j]);
    for (int j = 0; j < kChains; ++j)
        if (!(y[j] >= 0.5f && y[j] <= 1.0f))
            atomicAdd(bad, 1u);
}

static int fa_check(cudaError_t err, const char *what) {
    if (err == cudaSuccess)
        return 0;
    fprintf(stderr, "fa_cuda_peak: %s: %s (%s)\n", what, cudaGetErrorString(err),
            cudaGetErrorName(err));
    return 1;
}

#define FA_TRY(call)                                                                               \
    do {                                                                                           \
        if (fa_check((call), #call))                                                               \
            return -1.0;                                                                           \
    } while (0)

static int fa_cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void fa_launch(int mma, int blocks, const float *one, unsigned *bad) {
    if (mma)
        fa_peak_mma<<<blocks, kThreads>>>(NULL, one, kIters, bad);
    else
        fa_peak_ex2<<<blocks, kThreads>>>(kIters, bad);
}

/* Operations a second (FLOP for mma, ex2 for ex2), the median of kRuns launches sized for about
 * kTargetMs each; *ms gets that median. -1 on a CUDA error or a wrong result (said on stderr). */
static double fa_measure(int mma, int sms, float *ms) {
    float *first = NULL;
    unsigned *bad = NULL, nbad = 0;
    double rate = -1.0;
    cudaEvent_t ev[kRuns + 1] = {0};
    FA_TRY(cudaMalloc(&first, 4 * kThreads * sizeof(float)));
    FA_TRY(cudaMalloc(&bad, sizeof(unsigned)));
    FA_TRY(cudaMemset(bad, 0, sizeof(unsigned)));
    for (int i = 0; i <= kRuns; ++i)
        FA_TRY(cudaEventCreate(&ev[i]));
    if (mma) { // the sums of one iteration, which the timed launches check theirs against
        fa_peak_mma<<<1, kThreads>>>(first, NULL, 1, bad);
        FA_TRY(cudaGetLastError());
    }
    /* A warm-up launch of 16 CTAs an SM (the kernel's first: lazy module loading happens
     * here), a timed one of the same size, then enough CTAs for kTargetMs. */
    int blocks = 16 * sms;
    float t = 0.0f, times[kRuns];
    fa_launch(mma, blocks, first, bad);
    FA_TRY(cudaEventRecord(ev[0]));
    fa_launch(mma, blocks, first, bad);
    FA_TRY(cudaGetLastError());
    FA_TRY(cudaEventRecord(ev[1]));
    FA_TRY(cudaEventSynchronize(ev[1]));
    FA_TRY(cudaEventElapsedTime(&t, ev[0], ev[1]));
    const double want = (double)blocks * kTargetMs / (t > 0.01f ? t : 0.01f);
    blocks = want > 1 << 24 ? 1 << 24 : want < blocks ? blocks : (int)want;
    FA_TRY(cudaEventRecord(ev[0]));
    for (int i = 0; i < kRuns; ++i) {
        fa_launch(mma, blocks, first, bad);
        FA_TRY(cudaEventRecord(ev[i + 1]));
    }
    FA_TRY(cudaGetLastError());
    FA_TRY(cudaEventSynchronize(ev[kRuns]));
    for (int i = 0; i < kRuns; ++i)
        FA_TRY(cudaEventElapsedTime(&times[i], ev[i], ev[i + 1]));
    FA_TRY(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
    if (nbad) {
        fprintf(stderr,
                "fa_cuda_peak: %s: %u wrong results: the instruction did not compute "
                "what it should\n",
                mma ? "mma" : "ex2", nbad);
    } else {
        qsort(times, kRuns, sizeof times[0], fa_cmp_float);
        *ms = times[kRuns / 2];
        const double per_thread = (double)kIters * kChains * (mma ? 2.0 * 16 * 8 * 16 / 32 : 1.0);
        rate = (double)blocks * kThreads * per_thread / (*ms * 1e-3);
    }
    for (int i = 0; i <= kRuns; ++i)
        cudaEventDestroy(ev[i]);
    cudaFree(first);
    cudaFree(bad);
    return rate;
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "usage: fa_cuda_peak (no arguments): mma.sync bf16 and ex2.approx rates "
                        "of GPU 0, as JSON on stdout\n");
        return 1;
    }
    int n = 0, sms = 0, major = 0, minor = 0, khz = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        fprintf(stderr, "fa_cuda_peak: no CUDA device: %s\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "the driver sees no GPU");
        return 2;
    }
    cudaDeviceProp prop;
    if (fa_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties") ||
        fa_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count") ||
        fa_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "major") ||
        fa_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), "minor") ||
        fa_check(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0), "clock rate"))
        return 1;
    if (major < 8) {
        fprintf(stderr, "fa_cuda_peak: %s is sm_%d%d; bf16 mma.sync needs sm_80 or later\n",
                prop.name, major, minor);
        return 1;
    }
    float mma_ms = 0.0f, ex2_ms = 0.0f;
    const double mma = fa_measure(1, sms, &mma_ms);
    const double ex2 = mma < 0 ? -1.0 : fa_measure(0, sms, &ex2_ms);
    if (mma < 0 || ex2 < 0)
        return 1;
    fprintf(stderr,
            "fa_cuda_peak: %s (sm_%d%d, %d SMs, clock %d MHz): mma.sync m16n8k16 bf16 %.1f "
            "TFLOP/s, ex2.approx %.1f Gop/s (medians of %d launches of %.1f / %.1f ms)\n",
            prop.name, major, minor, sms, khz / 1000, mma * 1e-12, ex2 * 1e-9, kRuns, mma_ms,
            ex2_ms);
    printf("{\"device\": \"%s\", \"capability\": \"sm_%d%d\", \"sms\": %d, \"clock_mhz\": %d, "
           "\"mma_bf16_tflops\": %.2f, \"mma_ms\": %.3f, \"ex2_gops\": %.1f, \"ex2_ms\": %.3f, "
           "\"runs\": %d}\n",
           prop.name, major, minor, sms, khz / 1000, mma * 1e-12, mma_ms, ex2 * 1e-9, ex2_ms,
           kRuns);
    return 0;
}
