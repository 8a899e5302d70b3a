/* SPDX-License-Identifier: MIT */
/*
 * fwd_mma.cu — the stage-2 forward kernel: FA2-class attention on tensor cores for sm_80 and
 * later (fp16/bf16) and Turing, sm_75 (fp16: the FA_IN_F16_SM75 kind of mma_kind.h), any head
 * dim D <= 256 that is a multiple of 8, with causal/sliding windows, GQA, varlen, lse, softcap,
 * ALiBi and KV caches. Everything else (and the varlen rows outside every sequence) is stage
 * 1's, as is any kernel whose shared memory the device cannot give a block.
 *
 * KV caches (fa_forward_kvcache, any number of query rows): batch b has seqlens_k[b] keys,
 * read in place through the cache's indices (problem.h, fa__view_at). The indices of a
 * contiguous cache (cache_batch_idx, leftpad) move the batch's first K/V row in the prologue,
 * and the kernel is the plain one; the paged kernel (kPaged) looks up the page of every row it
 * copies, so that a key block may span pages of any size. Its page numbers for the next block
 * are read before the barrier that precedes the block's copies.
 *
 * Like FA2, a kernel is compiled for each kD in {32, 64, ..., 256} and runs every D in
 * (kD - 32, kD]: the products run over kD, with Q, K and V zero in columns [D, kD) of shared
 * memory (the loads zero-fill them), and out is stored for columns [0, D) only. Shared-memory rows
 * are kW = 64, 128 or 256 elements wide (fa_tile_width: whole 128-byte lines, which the swizzle
 * needs); columns past kD are never read.
 *
 * One CTA of 4 warps per (query block of kBlockM rows, batch, head). With kBlockM = 128
 * (kD <= 128), warp w owns rows [32w, 32w + 32) as two m16 tiles, so every K/V fragment read
 * from shared memory feeds two MMAs; with kBlockM = 64 (kD > 128, where O alone is up to 128 fp32
 * a thread) it owns one m16 tile. Row reductions stay inside a warp (4-lane quads). Tiles
 * (kBlockM x kBlockN):
 *   kD = 32, 64: 128x128, FA2's for D = 64 (80 KB smem)
 *   kD = 96: 128x64, FA2's (96 KB smem); O (96) + S (64) fp32 a thread, like 128x32 at D = 128
 *   kD = 128: 64 keys on sm_90 and later, 32 before (fa__mma_d128_block_n). 128x64 is FA2's
 *            tile on A100 and H100: O (128) + S (64) fp32 a thread fit the 255 registers
 *            without spills on sm_90, and the per-block work (barrier, softmax, O's rescale,
 *            address arithmetic) is spread over twice the MMAs: 3.0 instructions an HMMA
 *            against 3.5 (bench/results/2026-12-06-cuda-loop-addresses.md). Its 96 KB of smem
 *            (K/V double-buffered) allow 2 CTAs an SM on sm_90 but one on A100, where 128x32
 *            (64 KB) has two. Static counts, not timings: FA_CUDA_TILE_D128 picks either
 *            (plugin.cu), and bench/gpu_bench.py times both.
 *   kD = 160 .. 256: 64x32 (96 KB smem: 2 CTAs an SM on sm_90), 244 registers without spills
 *            at D = 256. FA2 uses 64x64 with 4 warps or 128x64 with 8 there; double-buffered K/V
 *            at 64 keys would take 160 KB, one CTA an SM.
 * Every tile fits the 99 KB a block can have on sm_86, sm_89 and sm_120 (one CTA an SM there
 * above 48 KB). Turing's kind has its own tiles within its 64 KB (fa_sm75_block_n): 128x64 up to
 * kD = 64, 128x32 up to 128, 64x16 above; FA_CUDA_TILE_D128 does not apply to it.
 *
 * Per CTA: Q once, K and V double-buffered (stage = block parity); every tile XOR-swizzled so
 * ldmatrix and cp.async are free of bank conflicts:
 *   cp.async Q, K(last), V(last)
 *   for key blocks n = last .. first of the band (reverse: only the first ones straddle an edge)
 *     wait, barrier            K(n), V(n) landed; every warp is done with the other stage
 *     cp.async K(n-1), V(n-1)  into the other stage, landing while this block runs
 *     S = Q K(n)ᵀ              mma.sync m16n8k16, ldmatrix.x4 for Q and K
 *     softcap, ALiBi, mask     (the mask only on blocks that straddle the band's edge)
 *     online softmax           exp2 domain, row max over the quad; O's rescale by alpha, by
 *                              8 rows (g or g + 8 of an m16 tile), skipped where none of them
 *                              has a new max
 *     O += P V(n)              P from S's registers, ldmatrix.x4.trans for V
 *   out = O / l with 16-byte stores staged through the warp's own Q rows, lse = (m + log2 l) ln 2
 * A row that sees no key (l = 0) gets out = 0 and lse = -inf. A sink joins each row there
 * (fa_row_factor). An fp32 out (a flag of the parameters, not a kernel of its own) takes O / l
 * unrounded, stored from the registers.
 */
#include "flashattn.h"
#include "kernels.h"
#include "mma.cuh"
#include "mma_tile.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { kWarps = 4, kThreads = 32 * kWarps };

#define FA_LOG2E_F 1.4426950408889634f
#define FA_LN2_F 0.69314718055994531f

/* The problem as the kernel reads it: byte strides for q/k/v/out, element strides for lse. */
typedef struct fa_mma_params {
    const char *q, *k, *v;
    char *o;
    int o_f32; /* out is fp32 (else q's dtype) */
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    float *lse; /* NULL: not requested */
    int64_t lse_sb, lse_sh, lse_ss;
    const int32_t *cu_q, *cu_k; /* NULL: fixed length */
    const float *alibi;         /* NULL: none */
    int64_t alibi_sb, alibi_sh;
    const float *sinks; /* NULL: none; head h's at sinks[h·sinks_sh] */
    int64_t sinks_sh;
    /* KV cache (problem.h; NULL when absent): the lengths, and the indices K and V share */
    const int32_t *seqlens_k, *kv_row_off, *kv_batch, *block_table;
    int64_t bt_stride;
    int page;          /* paged: rows a page */
    uint32_t page_mul; /* paged: r / page = (umulhi(r, page_mul) + r) >> page_shift */
    int page_shift;
    int Sq, Sk, H, group, nqb; /* group = H / Hk; nqb = query blocks per (batch, head) */
    int dch;                   /* D / 8: the 16-byte chunks of a row that hold data */
    int window_left, window_right;
    float scale_l2;   /* scale·log2(e) */
    float softcap_in; /* 2·log2(e)·scale/c: tanh(x) = 1 - 2 / (2^(s·softcap_in) + 1) */
    float softcap_l2; /* c·log2(e); 0 = off */
} fa_mma_params;

/* Query rows per CTA of the kernel for kD: 128 (two m16 tiles a warp) up to 128; 64 above,
 * where O alone is up to 128 fp32 a thread at one m16 tile a warp. */
static __host__ __device__ constexpr int fa_block_m(int kd) { return kd > 128 ? 64 : 128; }

/* A thread's copies of a [kRows, kW] tile (fa_copy_at): kRows / kRowStep. */
static __host__ __device__ constexpr int fa_copies(int rows, int kw) {
    return rows / (kThreads / (kw / 8));
}

/* r / page for 0 <= r < 2^31 by a multiply-high and a shift (Granlund and Montgomery; the sum
 * stays below 2^32 as umulhi(r, page_mul) <= r). */
static __device__ __forceinline__ int fa_page_div(const fa_mma_params &prm, int r) {
    const uint32_t hi = (uint32_t)(((uint64_t)(uint32_t)r * prm.page_mul) >> 32);
    return (int)((hi + (uint32_t)r) >> prm.page_shift);
}

/* Byte offset of key j's row of K or V (batch and row strides sb, ss in bytes) from the
 * kernel's pointer to it: j rows; paged, row rk + j of the batch's cache, page table bt. */
template <bool kPaged>
static __device__ __forceinline__ int64_t fa_kv_off(const fa_mma_params &prm, const int32_t *bt,
                                                    int rk, int64_t sb, int64_t ss, int j) {
    if (!kPaged)
        return j * ss;
    const int r = rk + j, pg = fa_page_div(prm, r);
    return bt[pg] * sb + (int64_t)(r - pg * prm.page) * ss;
}

/* Paged: the page pg[it] and the row in it in[it] of thread tid's copy it of a [kRows, kW] K/V
 * tile whose first row is cache row r0 (page table bt); rows >= n get page 0 (not read). */
template <int kRows, int kW>
static __device__ __forceinline__ void
fa_page_rows(const fa_mma_params &prm, const int32_t *bt, int r0, int n, int tid,
             int (&pg)[fa_copies(kRows, kW)], int (&in)[fa_copies(kRows, kW)]) {
    constexpr int kChunks = kW / 8, kRowStep = kThreads / kChunks;
#pragma unroll
    for (int it = 0; it < fa_copies(kRows, kW); ++it) {
        const int row = tid / kChunks + it * kRowStep, r = r0 + row, q = fa_page_div(prm, r);
        pg[it] = row < n ? bt[q] : 0;
        in[it] = r - q * prm.page;
    }
}

/* Paged: rows [0, n) and chunks [0, dch) of a K and a V tile ([kRows, kW] at dk and dv) from
 * the pages fa_page_rows found; k and v hold head hk of page 0, the source of the zero-filled
 * copies (rows >= n, chunks >= dch), as in fa_load_tile. */
template <int kRows, int kW>
static __device__ __forceinline__ void
fa_load_kv_paged(uint32_t dk, uint32_t dv, const fa_mma_params &prm, const char *k, const char *v,
                 const int (&pg)[fa_copies(kRows, kW)], const int (&in)[fa_copies(kRows, kW)],
                 int n, int tid) {
    constexpr int kChunks = kW / 8, kRowStep = kThreads / kChunks;
    const int ch = tid % kChunks;
#pragma unroll
    for (int it = 0; it < fa_copies(kRows, kW); ++it) {
        const bool ok = ch < prm.dch && tid / kChunks + it * kRowStep < n;
        const uint32_t at = fa_copy_at<kW, kThreads>(tid, it);
        fa_cp_async16(dk + at, ok ? k + pg[it] * prm.k_sb + in[it] * prm.k_ss + 16 * ch : k, ok);
        fa_cp_async16(dv + at, ok ? v + pg[it] * prm.v_sb + in[it] * prm.v_ss + 16 * ch : v, ok);
    }
}

/* The source of thread tid's first copy in a whole [kRows, kW] tile at src (row stride ss
 * bytes), for fa_load_block: its row tid / kChunks, its chunk, or chunk 0 of that row when the
 * chunk is past the data (ch >= dch: read nothing, from an address that exists). */
template <int kW>
static __device__ __forceinline__ const char *fa_block_src(const char *src, int64_t ss, int dch,
                                                           int tid) {
    constexpr int kChunks = kW / 8;
    const int ch = tid % kChunks;
    return src + tid / kChunks * ss + (ch < dch ? ch * 16 : 0);
}

/* fa_load_tile for a whole tile (n >= kRows: every K/V block but the first loaded one), from
 * first = fa_block_src(...): the thread's copies differ only in their row, so one predicate (its
 * chunk < dch) and one pointer stepped by kRowStep rows serve them all. */
template <int kRows, int kW>
static __device__ __forceinline__ void fa_load_block(uint32_t dst, const char *first, int64_t ss,
                                                     int dch, int tid) {
    constexpr int kChunks = kW / 8, kRowStep = kThreads / kChunks;
    static_assert(kRows % kRowStep == 0, "whole passes");
#pragma unroll
    for (int it = 0; it < kRows / kRowStep; ++it)
        fa_cp_async16(dst + fa_copy_at<kW, kThreads>(tid, it), first + it * kRowStep * ss,
                      tid % kChunks < dch);
}

/* Do thread tid's chunks of V's key block from key j0 (those it loads: chunk tid % kChunks of
 * rows tid / kChunks + it·kRowStep; keys below sk, chunks below dch) hold a NaN or an infinity?
 * A half is one when its exponent is all ones: adding the exponent's lowest bit then carries
 * into the half's top bit. v, bt, rk: V as fa_kv_off reads it. */
template <int kRows, int kW, int kIn, bool kPaged>
static __device__ __forceinline__ bool fa_block_nonfinite(const fa_mma_params &prm, const char *v,
                                                          const int32_t *bt, int rk, int j0, int sk,
                                                          int tid) {
    constexpr int kChunks = kW / 8, kRowStep = kThreads / kChunks;
    constexpr uint32_t kExp = FA_IN_IS_BF16(kIn) ? 0x7f807f80u : 0x7c007c00u;
    constexpr uint32_t kExpLow = FA_IN_IS_BF16(kIn) ? 0x00800080u : 0x04000400u;
    const int r0 = j0 + tid / kChunks, ch = tid % kChunks;
    uint32_t any = 0;
#pragma unroll
    for (int it = 0; it < kRows / kRowStep; ++it) {
        if (ch < prm.dch && r0 + it * kRowStep < sk) {
            const int64_t at =
                fa_kv_off<kPaged>(prm, bt, rk, prm.v_sb, prm.v_ss, r0 + it * kRowStep);
            const uint4 x = *(const uint4 *)(v + at + 16 * ch);
            any |= ((x.x & kExp) + kExpLow) | ((x.y & kExp) + kExpLow) | ((x.z & kExp) + kExpLow) |
                   ((x.w & kExp) + kExpLow);
        }
    }
    return (any & 0x80008000u) != 0;
}

/* out = O · factor and *lse for a row of head h with softmax sum l (l = 0: the caller writes
 * out = 0) and keys' lse *lse (-inf at l = 0), the head's sink joined when it has one:
 * lse = logaddexp(lse, sink), factor = 2^(L2 - lse2) / l in the exp2 domain. In fp32 with the
 * fast exp2/log2 the key loop uses (fwd_row.h joins in fp64): fp64 here spilled the kernels. */
static __device__ __forceinline__ float fa_row_factor(const fa_mma_params &prm, unsigned h, float l,
                                                      float *lse) {
    const float sink = prm.sinks ? prm.sinks[h * prm.sinks_sh] : -INFINITY;
    if (sink == -INFINITY)
        return __fdividef(1.0f, l);
    if (l == 0.0f) {
        *lse = sink;
        return 0.0f;
    }
    const float keys2 = *lse * FA_LOG2E_F, sink2 = sink * FA_LOG2E_F;
    const float mx = fmaxf(keys2, sink2); // a NaN keys2 stays NaN below
    const float joined2 = mx + __log2f(fa_exp2(keys2 - mx) + fa_exp2(sink2 - mx));
    *lse = joined2 * FA_LN2_F;
    return __fdividef(fa_exp2(keys2 - joined2), l);
}

/* The CTA's rows, one thread a row, one key at a time (the arithmetic of cuda/fwd_row.h on this
 * kernel's scores: S in the exp2 domain, softcap and ALiBi as the key loop has them), with O in
 * shared memory ([kD][kBlockM] fp32, over the tiles: the key loop is done with them). Only the
 * keys a row sees take part, so a NaN or an infinity of V at a key it cannot see stays out,
 * which P V over a whole key block cannot do (0 times NaN is NaN). The key loop's results are
 * replaced by these when an edge block's V held such a value; slow, and only then. */
template <int kBlockM, int kIn, bool kPaged, class Smem>
static __device__ void fa_rows_exact(const fa_mma_params &prm, Smem smem, const char *k,
                                     const char *v, const int32_t *bt, int rk, unsigned b,
                                     unsigned h, int rq, int sq, int sk, int i0, float slope_l2,
                                     int tid) {
    const int off = sk - sq, D = 8 * prm.dch;
    for (int r = tid; r < kBlockM && i0 + r < sq; r += kThreads) {
        const int i = i0 + r, lo = fa_key_lo(prm, i, off, sk), hi = fa_key_hi(prm, i, off, sk);
        const char *q = prm.q + b * prm.q_sb + (int64_t)(rq + i) * prm.q_ss + h * prm.q_sh;
        auto o = [&](int d) { return (float *)(smem + 4 * (d * kBlockM + r)); };
        for (int d = 0; d < D; ++d)
            *o(d) = 0.0f;
        float m = -INFINITY, l = 0.0f;
        for (int j = lo; j < hi; ++j) {
            const char *kj = k + fa_kv_off<kPaged>(prm, bt, rk, prm.k_sb, prm.k_ss, j);
            const char *vj = v + fa_kv_off<kPaged>(prm, bt, rk, prm.v_sb, prm.v_ss, j);
            float s = fa_dot_chunks<kIn>(q, kj, prm.dch);
            if (prm.softcap_l2 != 0.0f)
                s = prm.softcap_l2 * (1.0f - __fdividef(2.0f, fa_exp2(s * prm.softcap_in) + 1.0f));
            else
                s *= prm.scale_l2;
            if (prm.alibi)
                s -= slope_l2 * fabsf((float)(i + off - j));
            if (s > m) { // a new maximum (from -inf: alpha = 0 scales l = 0 and O = 0)
                const float alpha = fa_exp2(m - s);
                l *= alpha;
                for (int d = 0; d < D; ++d)
                    *o(d) *= alpha;
                m = s;
            }
            const float e = s == -INFINITY ? 0.0f : fa_exp2(s - m); // NaN stays NaN
            l += e;
            for (int ch = 0; ch < prm.dch; ++ch) {
                float vx[8];
                fa_chunk_f32<kIn>(vj + 16 * ch, vx);
#pragma unroll
                for (int x = 0; x < 8; ++x)
                    *o(8 * ch + x) += e * vx[x];
            }
        }
        const bool none = l == 0.0f; // as the key loop's epilogue
        float lse = none ? -INFINITY : (m + __log2f(l)) * FA_LN2_F;
        const float inv = fa_row_factor(prm, h, l, &lse);
        char *out = prm.o + b * prm.o_sb + (int64_t)(rq + i) * prm.o_ss + h * prm.o_sh;
        for (int d = 0; d < D; d += 2) {
            const float o0 = none ? 0.0f : *o(d) * inv, o1 = none ? 0.0f : *o(d + 1) * inv;
            if (prm.o_f32)
                *(float2 *)(out + 4 * d) = make_float2(o0, o1);
            else
                *(uint32_t *)(out + 2 * d) = fa_pack2<kIn>(o0, o1);
        }
        if (prm.lse)
            prm.lse[b * prm.lse_sb + h * prm.lse_sh + (int64_t)(rq + i) * prm.lse_ss] = lse;
    }
}

template <int kD, int kBlockM, int kBlockN, int kIn, bool kPaged>
static __device__ __forceinline__ void fa_mma_fwd_body(const fa_mma_params &prm) {
    constexpr int kW = fa_tile_width(kD), kRowBytes = kW * 2;
    constexpr int kMT = kBlockM / (16 * kWarps); // m16 tiles per warp
    constexpr int kWarpRows = 16 * kMT;
    constexpr int kNT = kBlockN / 8; // n8 tiles of S
    constexpr int kDT = kD / 8;      // n8 tiles of O
    constexpr uint32_t kQBytes = kBlockM * kRowBytes, kKVBytes = kBlockN * kRowBytes;
    static_assert(kMT >= 1 && kNT % 2 == 0 && kDT % 2 == 0, "tile shape");

    extern __shared__ __align__(128) unsigned char smem[];
    // Q: [kBlockM, kW], then stages 0 and 1 of K: [kBlockN, kW] and V: [kBlockN, kW];
    // fp16/bf16, rows swizzled by fa_swz; columns [D, kW) zero
    const uint32_t sQ = fa_smem_u32(smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wrow = warp * kWarpRows; // this warp's first row in the block
    /* ldmatrix row addresses, lanes 8m..8m+7 for matrix m (fa_swz_at adds the tile offsets):
     *   Q (A, 16 rows x 16 d):  m = rows 0-7 | 8-15 x d 0-7, then the same x d 8-15
     *   K (B, 16 keys x 16 d):  m = keys 0-7 x d 0-7 | 8-15, then keys 8-15 x the same
     *   V (B, 16 keys x 16 d, transposed): m = keys 0-7 | 8-15 x d 0-7, then x d 8-15
     * Opaque, so that they are held across the key loop, not re-derived from tid in it. */
    const uint32_t lane_q = fa_opaque(fa_swz<kW>(wrow + (lane & 15), lane >> 4));
    const uint32_t lane_k = fa_opaque(fa_swz<kW>(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1));
    const uint32_t lane_v = fa_opaque(fa_swz<kW>((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4));

    /* Heaviest (last) query blocks of a head first; consecutive CTAs share a head's K/V in L2.
     * b and h are unsigned so their 64-bit offsets need no sign-extension registers. */
    const int m_block = prm.nqb - 1 - (int)(blockIdx.x % prm.nqb);
    const unsigned bh = blockIdx.x / prm.nqb, b = bh / prm.H, h = bh % prm.H;
    /* K/V: key j is row rk + j of the batch's sequence (varlen) or cache (leftpad) */
    const int rq = prm.cu_q ? prm.cu_q[b] : 0;
    const int rk = prm.cu_k ? prm.cu_k[b] : prm.kv_row_off ? prm.kv_row_off[b] : 0;
    const int sq = prm.cu_q ? prm.cu_q[b + 1] - rq : prm.Sq;
    const int sk = prm.cu_k ? prm.cu_k[b + 1] - rk : prm.seqlens_k ? prm.seqlens_k[b] : prm.Sk;
    const int i0 = m_block * kBlockM;
    if (i0 >= sq)
        return;
    const int off = sk - sq, i_last = min(i0 + kBlockM, sq) - 1;

    /* The band of keys some row of the block sees (lo and hi grow with i); key blocks
     * [n_min, n_end) cover it. A block is mask-free when every row sees all of its keys. */
    const int j_lo = fa_key_lo(prm, i0, off, sk), j_hi = fa_key_hi(prm, i_last, off, sk);
    const int lo_last = fa_key_lo(prm, i_last, off, sk), hi_first = fa_key_hi(prm, i0, off, sk);
    const int n_min = j_lo / kBlockN, n_end = j_hi > j_lo ? (j_hi + kBlockN - 1) / kBlockN : n_min;

    const unsigned hk = h / prm.group, kvb = prm.kv_batch ? prm.kv_batch[b] : b; // K/V's batch
    const char *q = prm.q + b * prm.q_sb + (int64_t)(rq + i0) * prm.q_ss + h * prm.q_sh;
    /* Key j's row of K is at k + fa_kv_off(..., j): key 0's row, or paged, head hk of page 0 */
    const char *k = prm.k + (kPaged ? 0 : kvb * prm.k_sb + (int64_t)rk * prm.k_ss) + hk * prm.k_sh;
    const char *v = prm.v + (kPaged ? 0 : kvb * prm.v_sb + (int64_t)rk * prm.v_ss) + hk * prm.v_sh;
    const int32_t *bt = kPaged ? prm.block_table + b * prm.bt_stride : nullptr; // bt: [pages]

    /* Softcap or ALiBi turn S into exp2-domain scores in place (mult = 1); otherwise S stays
     * raw q·k and the scale is folded into the exp2 argument (one FFMA per score). */
    const bool epi = prm.softcap_l2 != 0.0f || prm.alibi != nullptr;
    const float mult = epi ? 1.0f : prm.scale_l2;
    const float slope_l2 =
        prm.alibi ? prm.alibi[b * prm.alibi_sb + h * prm.alibi_sh] * FA_LOG2E_F : 0.0f;

    float acc_o[kMT][kDT][4]; // O: [kWarpRows, kD] per warp, C fragments
    float row_m[kMT][2];      // running max of rows g, g+8 of each m16 tile (S units)
    float row_l[kMT][2];      // running sum of those rows, this lane's columns only
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc_o[mt][dt][e] = 0.0f;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            row_m[mt][hf] = -INFINITY;
            row_l[mt][hf] = 0.0f;
        }
    }

    const int j_last = max(n_end - 1, 0) * kBlockN; // the last block's first key (0: empty band)
    constexpr int kCopies = fa_copies(kBlockN, kW);
    int pg[kCopies], in[kCopies]; // paged: the pages and their rows of this thread's K/V copies
    if (n_end > n_min) {
        fa_load_tile<kBlockM, kW, kThreads>(sQ, q, prm.q_ss, sq - i0, prm.dch, tid);
        if (kPaged) {
            fa_page_rows<kBlockN, kW>(prm, bt, rk + j_last, sk - j_last, tid, pg, in);
            fa_load_kv_paged<kBlockN, kW>(sQ + kQBytes, sQ + kQBytes + kKVBytes, prm, k, v, pg, in,
                                          sk - j_last, tid);
        } else {
            fa_load_tile<kBlockN, kW, kThreads>(sQ + kQBytes, k + j_last * prm.k_ss, prm.k_ss,
                                                sk - j_last, prm.dch, tid);
            fa_load_tile<kBlockN, kW, kThreads>(sQ + kQBytes + kKVBytes, v + j_last * prm.v_ss,
                                                prm.v_ss, sk - j_last, prm.dch, tid);
        }
        fa_cp_async_commit();
    }
    /* A NaN or an infinity of V at a key some row of the CTA cannot see would reach that row
     * all the same, as 0 times it in P V. Such keys lie only in the blocks that straddle the
     * band's edge (keys below lo_last, or from hi_first on), which the key loop masks: when the
     * V of one of them holds such a value, fa_rows_exact makes the CTA's rows instead, each
     * from the keys it sees. The check reads those blocks of V (the loop loads them too) while
     * the CTA's first tiles load, and costs the key loop nothing. */
    bool v_nonfinite = false;
    for (int n = n_min; n < n_end; ++n) {
        const int j0 = n * kBlockN;
        if (j0 >= lo_last && j0 + kBlockN <= hi_first) // mask-free: on to the right edge
            n = max(n, hi_first / kBlockN - 1);
        else
            v_nonfinite |=
                fa_block_nonfinite<kBlockN, kW, kIn, kPaged>(prm, v, bt, rk, j0, sk, tid);
    }
    if (__syncthreads_or(v_nonfinite)) {
        fa_cp_async_wait_all();
        __syncthreads(); // every copy landed: the tiles are free
        fa_rows_exact<kBlockM, kIn, kPaged>(prm, smem, k, v, bt, rk, b, h, rq, sq, sk, i0, slope_l2,
                                            tid);
        return;
    }
    /* This thread's sources in K(n) and V(n), stepped back a block before each load of the next
     * block (all whole: jn + kBlockN <= (n_end - 1)·kBlockN < j_hi <= sk); never read when the
     * band is empty. Paged: the pages of K(n-1), V(n-1) instead, read before the wait. */
    const char *kn = fa_block_src<kW>(k + j_last * prm.k_ss, prm.k_ss, prm.dch, tid);
    const char *vn = fa_block_src<kW>(v + j_last * prm.v_ss, prm.v_ss, prm.dch, tid);
    for (int n = n_end - 1, stage = 0; n >= n_min; --n, stage ^= 1) {
        const int j0 = n * kBlockN;
        if (kPaged && n > n_min)
            fa_page_rows<kBlockN, kW>(prm, bt, rk + j0 - kBlockN, kBlockN, tid, pg, in);
        fa_cp_async_wait_all();
        // K(n), V(n) (and Q) visible to all; every warp is done with the other stage
        __syncthreads();
        if (n > n_min) { // K(n-1), V(n-1) into the other stage, landing while this block runs
            const uint32_t next = sQ + kQBytes + (stage ^ 1) * 2 * kKVBytes;
            if (kPaged) {
                fa_load_kv_paged<kBlockN, kW>(next, next + kKVBytes, prm, k, v, pg, in, kBlockN,
                                              tid);
            } else {
                kn -= kBlockN * prm.k_ss;
                vn -= kBlockN * prm.v_ss;
                fa_load_block<kBlockN, kW>(next, kn, prm.k_ss, prm.dch, tid);
                fa_load_block<kBlockN, kW>(next + kKVBytes, vn, prm.v_ss, prm.dch, tid);
            }
            fa_cp_async_commit();
        }
        const uint32_t sK = sQ + kQBytes + stage * 2 * kKVBytes, sV = sK + kKVBytes;
        /* Opaque again in each block, so the per-tile ldmatrix addresses derived from them are
         * not all hoisted out of the loop into registers. */
        const uint32_t lq = fa_opaque(lane_q), lk = fa_opaque(lane_k), lv = fa_opaque(lane_v);

        float s[kMT][kNT][4]; // S: [kWarpRows, kBlockN] per warp, C fragments
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[mt][nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
            uint32_t qa[kMT][4]; // A: Q[16 rows, 16 d] per m16 tile
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
                fa_ldsm_x4(qa[mt], sQ + fa_swz_at<kW>(lq, mt * 16, 2 * kk));
#pragma unroll
            for (int nt = 0; nt < kNT; nt += 2) {
                uint32_t kb[4]; // B: K[16 keys, 16 d] = two n8 tiles x two k halves
                fa_ldsm_x4(kb, sK + fa_swz_at<kW>(lk, nt * 8, 2 * kk));
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    fa_mma16816<kIn>(s[mt][nt], qa[mt], kb[0], kb[1]);
                    fa_mma16816<kIn>(s[mt][nt + 1], qa[mt], kb[2], kb[3]);
                }
            }
        }

        /* Softcap, ALiBi, mask: the CPU's fa__score_epilogue, in the exp2 domain. */
        if (prm.softcap_l2 != 0.0f) { // c·log2(e)·tanh(scale·s/c), tanh(x) = 1 - 2/(e^2x + 1)
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float e2x = fa_exp2(s[mt][nt][e] * prm.softcap_in);
                        s[mt][nt][e] = prm.softcap_l2 * (1.0f - __fdividef(2.0f, e2x + 1.0f));
                    }
        } else if (epi) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        s[mt][nt][e] *= prm.scale_l2;
        }
        if (prm.alibi) { // - slope·log2(e)·|i + off - key|
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    // i + off - key at key j0 + 2t
                    const int d0 = i0 + wrow + mt * 16 + hf * 8 + g + off - j0 - 2 * t;
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            s[mt][nt][2 * hf + e] -= slope_l2 * fabsf((float)(d0 - nt * 8 - e));
                }
        }
        if (j0 < lo_last || j0 + kBlockN > hi_first) { // the block straddles the band's edge
            // a score the row cannot see is set to -inf (NaN + -inf would stay NaN)
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int i = i0 + wrow + mt * 16 + hf * 8 + g;         // this row's query
                    const int lo = fa_key_lo(prm, i, off, sk) - j0 - 2 * t; // relative to j0 + 2t
                    const int hi = fa_key_hi(prm, i, off, sk) - j0 - 2 * t;
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            if (nt * 8 + e < lo || nt * 8 + e >= hi)
                                s[mt][nt][2 * hf + e] = -INFINITY;
                }
        }

        /* Online softmax, row by row (rows g and g+8 of each m16 tile). */
        // P: [kWarpRows, kBlockN] per warp, S's C fragments packed as f16x2/bf16x2
        uint32_t p[kMT][kNT][2];
        float alpha[kMT][2];   // O's rescale factor per row
        bool grew_row[kMT][2]; // row g or g+8 of m16 tile mt has a new max
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float mx = row_m[mt][hf];
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                /* Nothing visible yet (mx = -inf): subtract 0, so P = 2^-inf = 0, not NaN. */
                const float m_use = mx == -INFINITY ? 0.0f : mx * mult;
                const bool grew = mx != row_m[mt][hf]; // growing from -inf: alpha = 2^-inf = 0
                alpha[mt][hf] = grew ? fa_exp2(row_m[mt][hf] * mult - m_use) : 1.0f;
                grew_row[mt][hf] = grew;
                row_m[mt][hf] = mx;
                float sum = 0.0f; // l takes the fp32 P, P V the rounded one
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt) {
                    const float p0 = fa_exp2(fmaf(s[mt][nt][2 * hf], mult, -m_use));
                    const float p1 = fa_exp2(fmaf(s[mt][nt][2 * hf + 1], mult, -m_use));
                    sum += p0 + p1;
                    p[mt][nt][hf] = fa_pack2<kIn>(p0, p1);
                }
                row_l[mt][hf] = row_l[mt][hf] * alpha[mt][hf] + sum;
            }
        }
        /* O's rows g (hf = 0) or g + 8 (hf = 1) of tile mt, 8 rows over the warp, rescaled
         * only where one of them grew: every alpha of the others is 1. */
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                if (__any_sync(0xffffffffu, grew_row[mt][hf])) {
#pragma unroll
                    for (int dt = 0; dt < kDT; ++dt) {
                        acc_o[mt][dt][2 * hf] *= alpha[mt][hf];
                        acc_o[mt][dt][2 * hf + 1] *= alpha[mt][hf];
                    }
                }

#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            uint32_t pa[kMT][4]; // A: P[16 rows, 16 keys] = P tiles 2kk and 2kk+1
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                pa[mt][0] = p[mt][2 * kk][0];
                pa[mt][1] = p[mt][2 * kk][1];
                pa[mt][2] = p[mt][2 * kk + 1][0];
                pa[mt][3] = p[mt][2 * kk + 1][1];
            }
#pragma unroll
            for (int dt = 0; dt < kDT; dt += 2) {
                uint32_t vb[4]; // B: V[16 keys, 16 d] = two k halves x two n8 tiles, transposed
                fa_ldsm_x4_trans(vb, sV + fa_swz_at<kW>(lv, kk * 16, dt));
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    fa_mma16816<kIn>(acc_o[mt][dt], pa[mt], vb[0], vb[1]);
                    fa_mma16816<kIn>(acc_o[mt][dt + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
    }

    /* Epilogue. No cp.async is in flight: the last iteration waited for its stage and loaded
     * nothing, and an empty band loaded nothing at all. Each warp reads only its own Q rows, so it
     * may overwrite them once its lanes are past their last ldmatrix. */
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float l = row_l[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            /* l = 0: no key weighs anything, out = 0 (also where O is 0 times a non-finite V)
             * and lse = -inf. l = NaN (a NaN or +Inf score it sees: 2^NaN, 2^(inf - inf)):
             * out and lse NaN. Else l >= 1. */
            const bool none = l == 0.0f;
            float lse = none ? -INFINITY : (row_m[mt][hf] * mult + __log2f(l)) * FA_LN2_F;
            const float inv = fa_row_factor(prm, h, l, &lse);
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt) {
                acc_o[mt][dt][2 * hf] = none ? 0.0f : acc_o[mt][dt][2 * hf] * inv;
                acc_o[mt][dt][2 * hf + 1] = none ? 0.0f : acc_o[mt][dt][2 * hf + 1] * inv;
            }
            const int i = i0 + wrow + mt * 16 + hf * 8 + g;
            if (prm.lse && t == 0 && i < sq)
                prm.lse[b * prm.lse_sb + h * prm.lse_sh + (int64_t)(rq + i) * prm.lse_ss] = lse;
        }
    }
    char *o = prm.o + b * prm.o_sb + ((int64_t)rq + i0 + wrow) * prm.o_ss + h * prm.o_sh;
    if (prm.o_f32) { // each quad's 8 columns of an n8 tile: one 32-byte sector of a row
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = mt * 16 + hf * 8 + g;
                float *orow = (float *)(o + r * prm.o_ss) + 2 * t; // orow: [kD] from column 2t
#pragma unroll
                for (int dt = 0; dt < kDT; ++dt)
                    if (i0 + wrow + r < sq && dt < prm.dch)
                        *(float2 *)(orow + 8 * dt) =
                            make_float2(acc_o[mt][dt][2 * hf], acc_o[mt][dt][2 * hf + 1]);
            }
        return;
    }
    __syncwarp();
    // O tile: [kWarpRows, kD] in this warp's Q rows, same swizzle
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                *(uint32_t *)(smem + fa_swz<kW>(wrow + mt * 16 + hf * 8 + g, dt) + 4 * t) =
                    fa_pack2<kIn>(acc_o[mt][dt][2 * hf], acc_o[mt][dt][2 * hf + 1]);
    __syncwarp();
    constexpr int kChunks = kD / 8;
    static_assert(kWarpRows * kChunks % 32 == 0, "the warp's O chunks in whole passes");
#pragma unroll
    for (int it = 0; it < kWarpRows * kChunks / 32; ++it) {
        const int c = lane + it * 32, r = c / kChunks, ch = c % kChunks;
        if (i0 + wrow + r < sq && ch < prm.dch)
            *(uint4 *)(o + r * prm.o_ss + ch * 16) =
                *(const uint4 *)(smem + fa_swz<kW>(wrow + r, ch));
    }
}

/* The kernel: compiled for sm_75, only the Turing kind has a body (fa__mma_supported never
 * picks another there). */
template <int kD, int kBlockM, int kBlockN, int kIn, bool kPaged>
__global__ void __launch_bounds__(kThreads, 2) fa_mma_fwd_kernel(const fa_mma_params prm) {
    if constexpr (FA_SM80 || kIn == FA_IN_F16_SM75)
        fa_mma_fwd_body<kD, kBlockM, kBlockN, kIn, kPaged>(prm);
    else
        __trap();
}

/* One launch: blocks CTAs of kThreads, Q plus two K/V stages of shared memory. */
template <int kD, int kBlockM, int kBlockN, int kIn, bool kPaged>
static cudaError_t fa_mma_launch(const fa_mma_params &prm, int64_t blocks, cudaStream_t stream) {
    constexpr int smem = (kBlockM + 4 * kBlockN) * fa_tile_width(kD) * 2;
    if (smem > 48 * 1024) {
        const cudaError_t err =
            cudaFuncSetAttribute(fa_mma_fwd_kernel<kD, kBlockM, kBlockN, kIn, kPaged>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess)
            return err;
    }
    fa_mma_fwd_kernel<kD, kBlockM, kBlockN, kIn, kPaged>
        <<<(unsigned)blocks, kThreads, smem, stream>>>(prm);
    return cudaGetLastError();
}

/* fa_mma_launch of the kernel for kD (fa_block_m(kD) query rows a CTA) and input kind kIn, for a
 * paged cache or not. */
template <int kD, int kBlockN, int kIn>
static cudaError_t fa_mma_launch_paged(bool paged, const fa_mma_params &prm, int64_t blocks,
                                       cudaStream_t stream) {
    constexpr int kM = fa_block_m(kD);
    return paged ? fa_mma_launch<kD, kM, kBlockN, kIn, true>(prm, blocks, stream)
                 : fa_mma_launch<kD, kM, kBlockN, kIn, false>(prm, blocks, stream);
}

/* The same for the sm_80 kinds, bf16 or fp16. */
template <int kD, int kBlockN>
static cudaError_t fa_mma_launch_as(bool bf16, bool paged, const fa_mma_params &prm, int64_t blocks,
                                    cudaStream_t stream) {
    return bf16 ? fa_mma_launch_paged<kD, kBlockN, FA_IN_BF16>(paged, prm, blocks, stream)
                : fa_mma_launch_paged<kD, kBlockN, FA_IN_F16>(paged, prm, blocks, stream);
}

/* Key-block size of the Turing kind's kernel for kD: tiles within the 64 KB of shared memory a
 * Turing block can have (128x64 at kD <= 64: 48 KB; 128x32 up to 128, 64x16 above: 64 KB). */
static __host__ __device__ constexpr int fa_sm75_block_n(int kd) {
    return kd <= 64 ? 64 : kd <= 128 ? 32 : 16;
}

/* The shared memory of the kernel for D of kind kind: Q plus two K/V stages; at kD = 128 of the
 * sm_80 kinds, the larger of the two key blocks (fa__mma_d128_block_n). */
static int fa_mma_smem_bytes(int64_t D, int kind) {
    const int kd = fa_mma_kd(D);
    const int bn = kind == FA_IN_F16_SM75 ? fa_sm75_block_n(kd)
                   : kd <= 64             ? 128
                   : kd <= 128            ? 64
                                          : 32;
    return (fa_block_m(kd) + 4 * bn) * fa_tile_width(kd) * 2;
}

/* Query rows per CTA for D: those of the kernel that runs it. */
static int fa_mma_block_m(int64_t D) { return fa_block_m(fa_mma_kd(D)); }

/* A KV cache (host view p) the kernels read: fixed length; K and V share their indices (the
 * kernel reads k's); page < 2^31; each batch's keys <= kMaxLen, and its cache rows (leftpad +
 * keys) below 2^31 - 256 so that the kernel's row indices stay in int and fa_page_div. */
static int fa_mma_cache_ok(const fa__problem *p) {
    const fa__view *k = &p->k, *v = &p->v;
    const int cache = p->seqlens_k || k->row_off || k->block_table || k->batch_idx;
    if (!cache)
        return 1;
    if (p->cu_q || p->cu_k || k->row_off != v->row_off || k->block_table != v->block_table ||
        k->batch_idx != v->batch_idx)
        return 0;
    if (k->block_table &&
        (k->page != v->page || k->bt_stride != v->bt_stride || k->page < 1 || k->page > INT32_MAX))
        return 0;
    for (int64_t b = 0; b < p->B; ++b) {
        const int64_t sk = p->seqlens_k ? p->seqlens_k[b] : p->Sk;
        const int64_t off = k->row_off ? k->row_off[b] : 0;
        if (sk < 0 || sk > kMaxLen || off < 0 || off + sk > INT32_MAX - 256)
            return 0;
    }
    return 1;
}

int fa__mma_supported(const fa__problem *p, int sm, int smem) {
    const int32_t dt = p->q.dtype, kind = fa_mma_kind(p, sm);
    if (kind < 0)
        return 0;
    if (p->D < 8 || p->D > 256 || p->D % 8 != 0 || p->Dv != p->D) /* Dv != D: stage 1 */
        return 0;
    if (p->dropout_p != 0.0f)
        return 0;
    const fa__view *o = &p->out; /* fp32: 8-byte stores of column pairs */
    const int o_ok = o->dtype == FA_DTYPE_F32 ? o->sd == 1 && o->ss % 2 == 0 && o->sh % 2 == 0 &&
                                                    o->sb % 2 == 0 && ((uintptr_t)o->data & 7) == 0
                                              : fa_mma_view_ok(o, dt);
    if (!fa_mma_view_ok(&p->q, dt) || !o_ok || !fa_mma_cache_view_ok(&p->k, dt) ||
        !fa_mma_cache_view_ok(&p->v, dt))
        return 0;
    if (!fa_mma_cache_ok(p))
        return 0;
    /* The row max is taken on raw q·k and scaled after, which needs scale > 0. */
    if (fa_mma_smem_bytes(p->D, kind) > smem) /* a GPU with less shared memory: stage 1 */
        return 0;
    if (!(p->scale > 0.0f) ||
        (p->softcap > 0.0f && !isfinite(2.0f * FA_LOG2E_F * (p->scale / p->softcap))))
        return 0;
    if (p->Sq > kMaxLen || (!p->seqlens_k && p->Sk > kMaxLen) || p->Hk < 1 || p->H % p->Hk != 0)
        return 0;
    /* The grid is one dimension: query blocks x batch x heads CTAs. */
    const int64_t nqb = (p->Sq + fa_mma_block_m(p->D) - 1) / fa_mma_block_m(p->D);
    return p->H <= INT32_MAX && p->B <= INT32_MAX && p->B * p->H <= INT32_MAX &&
           (nqb == 0 || p->B * p->H <= INT32_MAX / nqb);
}

int fa__mma_d128_block_n(const char *tile, int sm) {
    if (!tile || !*tile)
        return sm >= 90 ? 64 : 32;
    return strcmp(tile, "128x32") == 0 ? 32 : strcmp(tile, "128x64") == 0 ? 64 : 0;
}

cudaError_t fa__mma_forward(const fa__problem *p, int sm, int d128_block_n, const int32_t *cu_q_dev,
                            const int32_t *cu_k_dev, cudaStream_t stream) {
    const int block_m = fa_mma_block_m(p->D);
    const int64_t nqb = (p->Sq + block_m - 1) / block_m, blocks = nqb * p->B * p->H;
    if (blocks == 0)
        return cudaSuccess;
    fa_mma_params prm;
    prm.q = (const char *)p->q.data;
    prm.k = (const char *)p->k.data;
    prm.v = (const char *)p->v.data;
    prm.o = (char *)p->out.data;
    prm.o_f32 = p->out.dtype == FA_DTYPE_F32;
    const int64_t oes = prm.o_f32 ? 4 : 2; /* out's element size */
    prm.q_sb = 2 * p->q.sb, prm.q_ss = 2 * p->q.ss, prm.q_sh = 2 * p->q.sh;
    prm.k_sb = 2 * p->k.sb, prm.k_ss = 2 * p->k.ss, prm.k_sh = 2 * p->k.sh;
    prm.v_sb = 2 * p->v.sb, prm.v_ss = 2 * p->v.ss, prm.v_sh = 2 * p->v.sh;
    prm.o_sb = oes * p->out.sb, prm.o_ss = oes * p->out.ss, prm.o_sh = oes * p->out.sh;
    prm.lse = p->lse;
    prm.lse_sb = p->lse_sb, prm.lse_sh = p->lse_sh, prm.lse_ss = p->lse_ss;
    prm.cu_q = cu_q_dev;
    prm.cu_k = cu_k_dev;
    prm.alibi = p->alibi;
    prm.alibi_sb = p->alibi_sb, prm.alibi_sh = p->alibi_sh;
    prm.sinks = p->sinks;
    prm.sinks_sh = p->sinks_sh;
    const bool paged = p->k.block_table != nullptr;
    prm.seqlens_k = p->seqlens_k;
    prm.kv_row_off = p->k.row_off;
    prm.kv_batch = paged ? nullptr : p->k.batch_idx; // a page table names pages, not batches
    prm.block_table = p->k.block_table;
    prm.bt_stride = p->k.bt_stride;
    prm.page = paged ? (int)p->k.page : 1;
    prm.page_shift = 0; // the least with page <= 2^page_shift
    while (((int64_t)1 << prm.page_shift) < prm.page)
        prm.page_shift++;
    prm.page_mul = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << prm.page_shift) - prm.page)) /
                                  (uint64_t)prm.page +
                              1);
    prm.Sq = (int)p->Sq, prm.Sk = (int)p->Sk, prm.H = (int)p->H, prm.group = (int)(p->H / p->Hk);
    prm.nqb = (int)nqb;
    prm.dch = (int)(p->D / 8);
    /* A window wider than any |i + off - j| is unbounded either way. */
    prm.window_left = p->window_left > kMaxWindow ? kMaxWindow : p->window_left;
    prm.window_right = p->window_right > kMaxWindow ? kMaxWindow : p->window_right;
    prm.scale_l2 = p->scale * FA_LOG2E_F;
    prm.softcap_in = p->softcap > 0.0f ? 2.0f * FA_LOG2E_F * (p->scale / p->softcap) : 0.0f;
    prm.softcap_l2 = p->softcap > 0.0f ? p->softcap * FA_LOG2E_F : 0.0f;

    if (fa_mma_kind(p, sm) == FA_IN_F16_SM75) {
        constexpr int kT = FA_IN_F16_SM75;
        switch (fa_mma_kd(p->D)) {
        case 32:
            return fa_mma_launch_paged<32, fa_sm75_block_n(32), kT>(paged, prm, blocks, stream);
        case 64:
            return fa_mma_launch_paged<64, fa_sm75_block_n(64), kT>(paged, prm, blocks, stream);
        case 96:
            return fa_mma_launch_paged<96, fa_sm75_block_n(96), kT>(paged, prm, blocks, stream);
        case 128:
            return fa_mma_launch_paged<128, fa_sm75_block_n(128), kT>(paged, prm, blocks, stream);
        case 160:
            return fa_mma_launch_paged<160, fa_sm75_block_n(160), kT>(paged, prm, blocks, stream);
        case 192:
            return fa_mma_launch_paged<192, fa_sm75_block_n(192), kT>(paged, prm, blocks, stream);
        case 224:
            return fa_mma_launch_paged<224, fa_sm75_block_n(224), kT>(paged, prm, blocks, stream);
        case 256:
            return fa_mma_launch_paged<256, fa_sm75_block_n(256), kT>(paged, prm, blocks, stream);
        }
        return cudaErrorInvalidValue;
    }
    const bool bf16 = p->q.dtype == FA_DTYPE_BF16;
    switch (fa_mma_kd(p->D)) {
    case 32:
        return fa_mma_launch_as<32, 128>(bf16, paged, prm, blocks, stream);
    case 64:
        return fa_mma_launch_as<64, 128>(bf16, paged, prm, blocks, stream);
    case 96:
        return fa_mma_launch_as<96, 64>(bf16, paged, prm, blocks, stream);
    case 128:
        if (d128_block_n == 32)
            return fa_mma_launch_as<128, 32>(bf16, paged, prm, blocks, stream);
        if (d128_block_n == 64)
            return fa_mma_launch_as<128, 64>(bf16, paged, prm, blocks, stream);
        return cudaErrorInvalidValue;
    case 160:
        return fa_mma_launch_as<160, 32>(bf16, paged, prm, blocks, stream);
    case 192:
        return fa_mma_launch_as<192, 32>(bf16, paged, prm, blocks, stream);
    case 224:
        return fa_mma_launch_as<224, 32>(bf16, paged, prm, blocks, stream);
    case 256:
        return fa_mma_launch_as<256, 32>(bf16, paged, prm, blocks, stream);
    }
    return cudaErrorInvalidValue;
}
