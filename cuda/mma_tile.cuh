/* SPDX-License-Identifier: MIT */
/*
 * mma_tile.cuh — what the tensor-core kernels (fwd_mma.cu, bwd_mma.cu) share: the causal and
 * window band, the shapes of their shared-memory tiles and the XOR swizzle that keeps ldmatrix
 * and cp.async free of bank conflicts, cp.async tile loads, fp16/bf16 chunks as fp32, and the
 * host-side conditions on views, lengths and head dims. Device code compiled by nvcc, and by
 * the warp emulator (tests/cuda_emu) with its own mma.cuh.
 */
#ifndef FA_CUDA_MMA_TILE_CUH
#define FA_CUDA_MMA_TILE_CUH

#include "mma.cuh"
#include "problem.h"

#include <stdint.h>

/* Keys [fa_key_lo, fa_key_hi) are visible to query i (off = sk - sq), clamped to [0, sk]; prm
 * is a kernel's parameter block (its window_left and window_right, -1 = unbounded).
 * No overflow: i + off < 2^29 + 128 (ragged rows included) and windows are <= 2^30. */
template <class P>
static __device__ __forceinline__ int fa_key_lo(const P &prm, int i, int off, int sk) {
    return prm.window_left < 0 ? 0 : min(max(i + off - prm.window_left, 0), sk);
}

template <class P>
static __device__ __forceinline__ int fa_key_hi(const P &prm, int i, int off, int sk) {
    return prm.window_right < 0 ? sk : min(max(i + off + prm.window_right + 1, 0), sk);
}

/* Shared-memory row width (elements) of the kernel for kD: whole 128-byte lines, and 8, 16 or 32
 * chunks a row so that fa_load_tile's passes cover whole rows. */
static __host__ __device__ constexpr int fa_tile_width(int kd) {
    return kd <= 64 ? 64 : kd <= 128 ? 128 : 256;
}

/* Byte offset of 16-byte chunk ch of row r in a [rows, kW] tile of 2-byte elements (kW, the
 * row width: 64, 128 or 256): chunk bits 0..2 are XORed with r % 8, so the 8 rows one ldmatrix
 * phase reads (same logical chunk) and the 8 chunks one cp.async phase writes (same row) hit 8
 * different bank groups. */
template <int kW> static __device__ __forceinline__ uint32_t fa_swz(int r, int ch) {
    return (uint32_t)(r * (kW * 2) + ((ch ^ (r & 7)) << 4));
}

/* fa_swz(R + lr, C + lc) for ldmatrix, given lane = fa_swz(lr, lc) of the lane's own row lr
 * and chunk lc in {0, 1}: with R a multiple of 8 and C even (compile-time after unrolling), the
 * swizzle is one XOR of lane with (C % 8) << 4, as rows are multiples of 128 bytes. */
template <int kW>
static __device__ __forceinline__ uint32_t fa_swz_at(uint32_t lane, int R, int C) {
    return (lane ^ ((C & 7) << 4)) + R * (kW * 2) + ((C & ~7) << 4);
}

/* Tile loads: 16-byte cp.async into a swizzled [kRows, kW] tile by a CTA of kThreads; a pass
 * of the CTA covers kRowStep whole rows, consecutive threads along a row: thread tid copies
 * chunk tid % kChunks of rows tid / kChunks + it·kRowStep. fa_copy_at is the shared-memory
 * offset of copy it. */
template <int kW, int kThreads>
static __device__ __forceinline__ uint32_t fa_copy_at(int tid, int it) {
    constexpr int kChunks = kW / 8, kRowStep = kThreads / kChunks;
    static_assert(kThreads % kChunks == 0 && (kRowStep % 8 == 0 || 8 % kRowStep == 0),
                  "a pass must cover whole rows: a multiple of 8 of them, or a divisor of 8");
    const int r0 = tid / kChunks, ch = tid % kChunks;
    /* Rows r0 + it·kRowStep share r0 % 8 when kRowStep is a multiple of 8 (the swizzle folds to
     * a constant offset); else it cycles with it, known after unrolling. */
    return kRowStep % 8 == 0 ? fa_swz<kW>(r0, ch) + it * kRowStep * (kW * 2)
                             : fa_swz<kW>(r0 + it * kRowStep, ch);
}

/* Rows [0, n) and chunks [0, dch) (elements [0, 8·dch)) of a [kRows, kW] tile from global
 * (first row src, row stride ss bytes) into the tile at dst; rows >= n and chunks >= dch
 * zero-filled (n >= 1). Each copy selects its source between its row and a row that exists.
 * (The forward loads Q and its first K/V block so; fa_load_block loads the others.) */
template <int kRows, int kW, int kThreads>
static __device__ __forceinline__ void fa_load_tile(uint32_t dst, const char *src, int64_t ss,
                                                    int n, int dch, int tid) {
    constexpr int kChunks = kW / 8, kRowStep = kThreads / kChunks;
    static_assert(kRows % kRowStep == 0, "whole passes");
    const int r0 = tid / kChunks, ch = tid % kChunks, rows = ch < dch ? n - r0 : 0;
    const char *first = src + r0 * ss + ch * 16;
#pragma unroll
    for (int it = 0; it < kRows / kRowStep; ++it) {
        const bool ok = it * kRowStep < rows; // else zero-fill, from a row that exists
        fa_cp_async16(dst + fa_copy_at<kW, kThreads>(tid, it),
                      ok ? first + it * kRowStep * ss : src, ok);
    }
}

/* The 8 fp16/bf16 values of a 16-byte chunk, as fp32. */
template <int kIn>
static __device__ __forceinline__ void fa_chunk_f32(const char *src, float (&x)[8]) {
    const uint4 c = *(const uint4 *)src;
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        x[e] = fa_to_f32<kIn>((w[e / 2] >> (16 * (e % 2))) & 0xffffu);
    }
}

/* Σ a_d·b_d over the first dch 16-byte chunks of two fp16/bf16 rows, in d order (the exact
 * scalar paths of the forward and the backward). */
template <int kIn>
static __device__ __forceinline__ float fa_dot_chunks(const char *a, const char *b, int dch) {
    float s = 0.0f;
    for (int ch = 0; ch < dch; ++ch) {
        float ax[8], bx[8];
        fa_chunk_f32<kIn>(a + 16 * ch, ax);
        fa_chunk_f32<kIn>(b + 16 * ch, bx);
#pragma unroll
        for (int e = 0; e < 8; ++e)
            s = fmaf(ax[e], bx[e], s);
    }
    return s;
}

/* fp16/bf16 with unit-stride rows and 16-byte aligned data, rows, heads and batches (a paged
 * cache's pages); KV-cache indirections allowed (fwd_mma.cu reads them). */
static int fa_mma_cache_view_ok(const fa__view *x, int32_t dtype) {
    return x->dtype == dtype && x->sd == 1 && x->ss % 8 == 0 && x->sh % 8 == 0 && x->sb % 8 == 0 &&
           ((uintptr_t)x->data & 15) == 0;
}

/* fa_mma_cache_view_ok without cache indirection. */
static int fa_mma_view_ok(const fa__view *x, int32_t dtype) {
    return fa_mma_cache_view_ok(x, dtype) && !x->row_off && !x->block_table && !x->batch_idx;
}

/* The kernels' input kind for p's dtype on a device of compute capability sm: sm_80 and later
 * take fp16 and bf16 on m16n8k16; sm_75 fp16 on m16n8k8; -1 where none applies. */
static int fa_mma_kind(const fa__problem *p, int sm) {
    const int32_t dt = p->q.dtype;
    if (sm >= 80 && (dt == FA_DTYPE_F16 || dt == FA_DTYPE_BF16))
        return dt == FA_DTYPE_BF16 ? FA_IN_BF16 : FA_IN_F16;
    return sm >= 75 && dt == FA_DTYPE_F16 ? FA_IN_F16_SM75 : -1;
}

/* Indices stay in int: |i + off| < 2^29 for every row, windows are clamped to 2^30. */
enum { kMaxLen = 1 << 29, kMaxWindow = 1 << 30 };

/* The kernels' head dim for D: the multiple of 32 they run in (D is zero-padded up to it). */
static int fa_mma_kd(int64_t D) { return (int)(D + 31) / 32 * 32; }

#endif /* FA_CUDA_MMA_TILE_CUH */
