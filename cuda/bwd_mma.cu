/* SPDX-License-Identifier: MIT */
/*
 * bwd_mma.cu — the stage-2 backward: attention gradients on tensor cores for sm_80 and later
 * (fp16/bf16) and Turing (fp16, D <= 128), any head dim D <= 256 that is a multiple of 8, with
 * causal/sliding windows, GQA, varlen, softcap, ALiBi and dropout. The rows outside every varlen
 * sequence are cleared by fa__bwd_clear_outside, not here.
 *
 * With s the final score in the exp2 domain (as the forward computes it), lse2 and Δ from
 * fa__bwd_prepare (kernels.h), P = 2^(s - lse2):
 *   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P∘(dP - Δ) (∘ (1 - tanh²) with softcap),
 *   dQ = scale·dS K,  dK = scale·dSᵀ Q.
 * With dropout (M the forward's mask of philox.h, drawn again per element from (seed, offset,
 * b·H + h, i, j), r = 1 / (1 - p)): dV = (P∘M·r)ᵀ dO and dS = P∘(dP∘M·r - Δ), as src/cpu/bwd.c.
 * P and dS are rounded to the input dtype before they enter a product (as flash-attn does); a P
 * or dS at a key the row cannot see, or of a row that saw no key (lse2 = +inf), is exactly 0.
 *
 * Deterministic, no atomics: two kernels (the FA2 "split" scheme), each gradient element summed
 * by one thread in a fixed order. 4 warps a CTA, tiles XOR-swizzled and loaded by cp.async as in
 * fwd_mma.cu (the helpers both share are in mma_tile.cuh). Like the forward, a kernel runs every
 * D in (kD - 32, kD], with columns [D, kD) zero in shared memory.
 *
 * dK/dV kernel: one CTA per (64-key block, batch, KV head, column half). Warp w owns keys
 * [16w, 16w + 16) as the M dimension, so that Pᵀ and dSᵀ come out in accumulator layout and feed
 * the next products as A operands from registers:
 *   K, V of the key block once; for each query head of the group, for each query block that
 *   sees the key block (double-buffered Q, dO, kBlockM rows each):
 *     Sᵀ = K Qᵀ, dPᵀ = V dOᵀ        K, V as A (ldmatrix), Q, dO as B (ldmatrix)
 *     Pᵀ, dSᵀ                       lse2 and Δ per column (query)
 *     dV += Pᵀ dO, dK += dSᵀ Q      dO, Q as B (ldmatrix.trans)
 *   dK·scale, dV stored once. dK, dV stay in fp32 registers: [16, kCols] each a warp; above
 *   kD = 128 the CTA owns half of the columns (kCols = kD / 2) and recomputes Sᵀ and dPᵀ.
 * dQ kernel: one CTA per (64-query block, batch, head); warp w owns rows [16w, 16w + 16):
 *   Q, dO once; for each key block of the band (double-buffered K, V, kBlockN keys each):
 *     S = Q Kᵀ, dP = dO Vᵀ, P, dS, dQ += dS K (K as B by ldmatrix.trans)
 *   dQ·scale stored once.
 * Tiles: the dK/dV kernel takes 64 query rows a step for kD = 32, 64 and 32 for kD = 96, 128, on
 * every column; above, it takes half the columns (kCols = kD / 2: dK and dV are 2 x kCols / 2
 * fp32 a thread) and 16 rows a step (with 32 it spills on sm_90 at kD = 256, and takes 128 KB of
 * shared memory, more than the 99 KB a block has on sm_86, sm_89 and sm_120). The dQ kernel takes
 * 64 keys a step up to kD = 128 and 16 above (with 32 it spills, the dropout mask's Philox rounds
 * included). Shared memory: 48 KB up to kD = 64, then 64 KB (dK/dV) and 96 KB (dQ) up to
 * kD = 128, 96 KB above. Turing's kind (mma_kind.h; fp16 on sm_75, whose blocks have 64 KB) runs
 * up to kD = 128 with 32 keys a step in the dQ kernel (64 KB); above, Turing takes stage 1.
 *
 * Non-finite inputs (notes/nan-rule.md): P and dS are set to 0 by a select where the row does
 * not see the key (never 0 times a value), but the next products multiply those zeros by the
 * row's Q or dO (dK/dV kernel) or the key's K (dQ kernel), and 0 times a NaN or an infinity is
 * NaN. Each CTA checks, while its first tiles load, the operands that could do so: Q and dO of
 * the query blocks that straddle the band's edge (and of rows that saw no key) for the dK/dV
 * kernel, K of the key blocks that straddle it for the dQ kernel. Where one holds a NaN or an
 * infinity, the CTA takes an exact path instead (one thread a key or row, scalar, from the
 * pairs that see each other only): slow, and only then. A row that saw no key gets dq = 0.
 */
#include "flashattn.h"
#include "kernels.h"
#include "mma.cuh"
#include "mma_tile.cuh"
#include "philox.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

enum { kBwdWarps = 4, kBwdThreads = 32 * kBwdWarps, kBwdKeys = 64, kBwdRows = 64 };

#define FA_BWD_LOG2E_F 1.4426950408889634f

/* Both kernels' dynamic shared memory (their layouts are at their tops). */
extern __shared__ __align__(128) unsigned char smem[];

/* The problem as the kernels read it: byte strides for the tensors. */
typedef struct fa_bwd_params {
    const char *q, *k, *v, *dout;
    char *dq, *dk, *dv;
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh;
    int64_t dq_sb, dq_ss, dq_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    const float *delta, *lse2; /* [H, R] */
    int64_t R;
    const int32_t *cu_q, *cu_k; /* NULL: fixed length */
    const float *alibi;         /* NULL: none */
    int64_t alibi_sb, alibi_sh;
    int Sq, Sk, H, Hk, group; /* group = H / Hk */
    int nblk;                 /* query blocks (dQ) or key blocks (dK/dV) per (batch, head) */
    int dch;                  /* D / 8: the 16-byte chunks of a row that hold data */
    int window_left, window_right;
    float scale, scale_l2; /* scale, scale·log2(e) */
    float softcap_in;      /* 2·log2(e)·scale/c: tanh(x) = 1 - 2 / (2^(s·softcap_in) + 1) */
    float softcap_l2;      /* c·log2(e); 0 = off */
    int dropout;           /* dropout_p != 0: the mask of philox.h, as the forward drew it */
    uint32_t drop_threshold;
    float drop_scale; /* 1 / (1 - dropout_p) */
    uint64_t drop_seed, drop_offset;
} fa_bwd_params;

/* Dropout's factor at row i, key j of head bh = b·H + h (rows and keys counted in the
 * sequence): 0 where the forward dropped P, else 1 / (1 - dropout_p); 1 without dropout. */
static __device__ __forceinline__ float fa_bwd_drop(const fa_bwd_params &prm, uint32_t bh, int i,
                                                    int j) {
    if (!prm.dropout)
        return 1.0f;
    const fa__philox4 w =
        fa__dropout_words(prm.drop_seed, prm.drop_offset, bh, (uint32_t)i, (uint32_t)j >> 2);
    const uint32_t word = (j & 3) == 0   ? w.v[0]
                          : (j & 3) == 1 ? w.v[1]
                          : (j & 3) == 2 ? w.v[2]
                                         : w.v[3];
    return word >= prm.drop_threshold ? prm.drop_scale : 0.0f;
}

/* Index of row 0 of head h's sequence of batch b (first packed row rq) in the lse2 and Δ
 * arrays ([H, R]: kernels.h). */
static __device__ __forceinline__ int64_t fa_bwd_row0(const fa_bwd_params &prm, unsigned h,
                                                      unsigned b, int rq) {
    return (int64_t)h * prm.R + (prm.cu_q ? rq : (int64_t)b * prm.Sq);
}

/* ALiBi's slope of (b, h) times log2(e); 0 without ALiBi. */
static __device__ __forceinline__ float fa_bwd_slope(const fa_bwd_params &prm, unsigned b,
                                                     unsigned h) {
    return prm.alibi ? prm.alibi[b * prm.alibi_sb + h * prm.alibi_sh] * FA_BWD_LOG2E_F : 0.0f;
}

/* C1 = A1 B1ᵀ and C2 = A2 B2ᵀ over kD columns for this warp's 16 rows of A (lane address la)
 * and the kNT n8 tiles of B (lane address lb): the two score-like products of a step, Sᵀ and
 * dPᵀ in the dK/dV kernel (A: K, V; B: Q, dO), S and dP in the dQ kernel (A: Q, dO; B: K, V).
 * Every operand is a swizzled [rows, kW] tile in shared memory. */
template <int kD, int kW, int kNT, int kIn>
static __device__ __forceinline__ void fa_bwd_two_products(float (&c1)[kNT][4], float (&c2)[kNT][4],
                                                           uint32_t a1, uint32_t a2, uint32_t b1,
                                                           uint32_t b2, uint32_t la, uint32_t lb) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            c1[nt][e] = c2[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t x1[4], x2[4]; // A: [16 rows, 16 d]
        fa_ldsm_x4(x1, a1 + fa_swz_at<kW>(la, 0, 2 * kk));
        fa_ldsm_x4(x2, a2 + fa_swz_at<kW>(la, 0, 2 * kk));
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
            uint32_t y[4]; // B: [16 rows, 16 d] = two n8 x two k halves
            fa_ldsm_x4(y, b1 + fa_swz_at<kW>(lb, nt * 8, 2 * kk));
            fa_mma16816<kIn>(c1[nt], x1, y[0], y[1]);
            fa_mma16816<kIn>(c1[nt + 1], x1, y[2], y[3]);
            fa_ldsm_x4(y, b2 + fa_swz_at<kW>(lb, nt * 8, 2 * kk));
            fa_mma16816<kIn>(c2[nt], x2, y[0], y[1]);
            fa_mma16816<kIn>(c2[nt + 1], x2, y[2], y[3]);
        }
    }
}

/* P (dropped: the factor of V's product) and dS of one score: s the raw q·k, dp = dO·V, lse2
 * and delta of the query row, bias the ALiBi term slope·log2(e)·|i + off - j| (0 without
 * ALiBi), drop = fa_bwd_drop; keep: the row sees the key and saw some key (lse2 != +inf). Else
 * both exactly 0, whatever the operands held. With dropout, dS = P∘(dP∘drop - Δ). */
static __device__ __forceinline__ void fa_bwd_pds(const fa_bwd_params &prm, float s, float dp,
                                                  float lse2, float delta, float bias, bool keep,
                                                  float drop, float &p, float &ds) {
    float x, dtanh = 1.0f;
    if (prm.softcap_l2 != 0.0f) { // as the forward: c·log2(e)·tanh, tanh = 1 - 2/(e^2x + 1)
        const float th = 1.0f - __fdividef(2.0f, fa_exp2(s * prm.softcap_in) + 1.0f);
        x = prm.softcap_l2 * th - lse2;
        dtanh = 1.0f - th * th;
    } else {
        x = fmaf(s, prm.scale_l2, -lse2);
    }
    const float pv = fa_exp2(x - bias);
    const float dsv = pv * ((drop == 0.0f ? 0.0f : dp * drop) - delta) * dtanh;
    p = keep && drop != 0.0f ? pv * drop : 0.0f;
    ds = keep ? dsv : 0.0f;
}

/* Does the 16-byte chunk at src (8 fp16/bf16) hold a NaN or an infinity? A half is one when its
 * exponent is all ones: adding the exponent's lowest bit then carries into its top bit. */
template <int kIn> static __device__ __forceinline__ bool fa_bwd_nonfinite(const char *src) {
    constexpr uint32_t kExp = FA_IN_IS_BF16(kIn) ? 0x7f807f80u : 0x7c007c00u;
    constexpr uint32_t kExpLow = FA_IN_IS_BF16(kIn) ? 0x00800080u : 0x04000400u;
    const uint4 x = *(const uint4 *)src;
    const uint32_t any = ((x.x & kExp) + kExpLow) | ((x.y & kExp) + kExpLow) |
                         ((x.z & kExp) + kExpLow) | ((x.w & kExp) + kExpLow);
    return (any & 0x80008000u) != 0;
}

/* x rounded to the dtype, as fp32. */
template <int kIn> static __device__ __forceinline__ float fa_bwd_round(float x) {
    return fa_to_f32<kIn>(fa_pack2<kIn>(x, 0.0f) & 0xffffu);
}

/* The exact paths. A P or dS that is 0 because its row cannot see the key (or saw no key) still
 * multiplies the row's Q or dO, or the key's K, in the tile products, and 0 times a NaN or an
 * infinity is NaN: a value the row or key never sees would leak into its gradients. Where a CTA
 * holds such a value at such a place (rare; checked before the products), it computes its
 * gradients by these instead, one thread a row or key, each term from the pairs that see each
 * other only, accumulating in fp32 in shared memory (the tiles are free by then). Slow, and
 * only then. */

/* dq of rows [i0, i0 + kBwdRows) ∩ [0, sq) of head h (q, dout, dq: row i0's; k, v: key 0's;
 * row0: the rows' first lse2/Δ index). Accumulators: [kD][kBwdRows] fp32. */
template <int kIn>
static __device__ void fa_bwd_dq_exact(const fa_bwd_params &prm, const char *q, const char *dout,
                                       const char *k, const char *v, char *dq, uint32_t bh, int i0,
                                       int sq, int sk, int64_t row0, float slope_l2, int tid) {
    const int off = sk - sq, D = 8 * prm.dch;
    for (int r = tid; r < kBwdRows && i0 + r < sq; r += kBwdThreads) {
        const int i = i0 + r, lo = fa_key_lo(prm, i, off, sk), hi = fa_key_hi(prm, i, off, sk);
        const float lse2 = prm.lse2[row0 + i], delta = prm.delta[row0 + i];
        const char *qi = q + r * prm.q_ss, *oi = dout + r * prm.do_ss;
        auto acc = [&](int d) { return (float *)(smem + 4 * (d * kBwdRows + r)); };
        for (int d = 0; d < D; ++d)
            *acc(d) = 0.0f;
        for (int j = lo; j < hi && lse2 != INFINITY; ++j) {
            float p, ds;
            fa_bwd_pds(prm, fa_dot_chunks<kIn>(qi, k + j * prm.k_ss, prm.dch),
                       fa_dot_chunks<kIn>(oi, v + j * prm.v_ss, prm.dch), lse2, delta,
                       slope_l2 * fabsf((float)(i + off - j)), true, fa_bwd_drop(prm, bh, i, j), p,
                       ds);
            ds = fa_bwd_round<kIn>(ds);
            for (int ch = 0; ch < prm.dch; ++ch) {
                float kx[8];
                fa_chunk_f32<kIn>(k + j * prm.k_ss + 16 * ch, kx);
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    *acc(8 * ch + e) += ds * kx[e];
            }
        }
        char *out = dq + r * prm.dq_ss;
        for (int d = 0; d < D; d += 2)
            *(uint32_t *)(out + 2 * d) =
                fa_pack2<kIn>(*acc(d) * prm.scale, *acc(d + 1) * prm.scale);
    }
}

/* dk, dv of keys [j0, j0 + kBwdKeys) ∩ [0, sk) of KV head hk, columns [c0, c0 + kCols) ∩ [0, D)
 * (k, v, dk, dv: key 0's). Accumulators: dK then dV, [kCols][kBwdKeys] fp32 each. */
template <int kCols, int kIn>
static __device__ void fa_bwd_dkdv_exact(const fa_bwd_params &prm, const char *k, const char *v,
                                         char *dk, char *dv, unsigned b, unsigned hk, int rq,
                                         int sq, int sk, int j0, int c0, int tid) {
    const int off = sk - sq, ce = min(c0 + kCols, 8 * prm.dch);
    for (int r = tid; r < kBwdKeys && j0 + r < sk; r += kBwdThreads) {
        const int j = j0 + r;
        /* the queries that may see key j (64-bit: the window may be up to 2^30) */
        const int64_t first = prm.window_right < 0 ? 0 : (int64_t)j - off - prm.window_right;
        const int64_t end = prm.window_left < 0 ? sq : (int64_t)j + 1 - off + prm.window_left;
        const int i_lo = first > 0 ? (int)first : 0, i_hi = end < sq ? (int)end : sq;
        auto acc = [&](int d, int x) {
            return (float *)(smem + 4 * ((x * kCols + d) * kBwdKeys + r));
        };
        for (int c = 0; c < kCols; ++c)
            *acc(c, 0) = *acc(c, 1) = 0.0f;
        for (int gh = 0; gh < prm.group; ++gh) {
            const unsigned h = hk * prm.group + gh;
            const float slope_l2 = fa_bwd_slope(prm, b, h);
            const int64_t row0 = fa_bwd_row0(prm, h, b, rq);
            for (int i = i_lo; i < i_hi; ++i) {
                const float lse2 = prm.lse2[row0 + i];
                if (j < fa_key_lo(prm, i, off, sk) || j >= fa_key_hi(prm, i, off, sk) ||
                    lse2 == INFINITY)
                    continue;
                const char *qi = prm.q + b * prm.q_sb + (int64_t)(rq + i) * prm.q_ss + h * prm.q_sh;
                const char *oi =
                    prm.dout + b * prm.do_sb + (int64_t)(rq + i) * prm.do_ss + h * prm.do_sh;
                float p, ds;
                fa_bwd_pds(prm, fa_dot_chunks<kIn>(qi, k + j * prm.k_ss, prm.dch),
                           fa_dot_chunks<kIn>(oi, v + j * prm.v_ss, prm.dch), lse2,
                           prm.delta[row0 + i], slope_l2 * fabsf((float)(i + off - j)), true,
                           fa_bwd_drop(prm, b * prm.H + h, i, j), p, ds);
                p = fa_bwd_round<kIn>(p);
                ds = fa_bwd_round<kIn>(ds);
                for (int c = c0; c < ce; c += 8) {
                    float qx[8], ox[8];
                    fa_chunk_f32<kIn>(qi + 2 * c, qx);
                    fa_chunk_f32<kIn>(oi + 2 * c, ox);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        *acc(c - c0 + e, 0) += ds * qx[e];
                        *acc(c - c0 + e, 1) += p * ox[e];
                    }
                }
            }
        }
        for (int c = c0; c < ce; c += 2) {
            *(uint32_t *)(dk + j * prm.dk_ss + 2 * c) =
                fa_pack2<kIn>(*acc(c - c0, 0) * prm.scale, *acc(c - c0 + 1, 0) * prm.scale);
            *(uint32_t *)(dv + j * prm.dv_ss + 2 * c) =
                fa_pack2<kIn>(*acc(c - c0, 1), *acc(c - c0 + 1, 1));
        }
    }
}

/* dK, dV of key block kb (kBwdKeys keys) of KV head hk in batch b, columns
 * [c0, c0 + kCols) with c0 = half·kCols; kBlockM query rows a step. */
template <int kD, int kBlockM, int kCols, int kIn>
static __device__ __forceinline__ void fa_mma_bwd_dkdv_body(const fa_bwd_params &prm) {
    constexpr int kW = fa_tile_width(kD), kRowBytes = kW * 2;
    constexpr int kNT = kBlockM / 8;   // n8 tiles of Sᵀ (queries)
    constexpr int kCT = kCols / 8;     // n8 tiles of dK, dV (columns)
    constexpr int kSplit = kD / kCols; // column parts
    constexpr uint32_t kKVBytes = kBwdKeys * kRowBytes, kQBytes = kBlockM * kRowBytes;
    static_assert(kNT % 2 == 0 && kCT % 2 == 0 && kD % kCols == 0, "tile shape");

    // K, V: [kBwdKeys, kW]; then stages 0 and 1 of Q, dO: [kBlockM, kW]; swizzled, fp16/bf16
    const uint32_t sK = fa_smem_u32(smem), sV = sK + kKVBytes;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    /* ldmatrix row addresses (fwd_mma.cu's patterns):
     *   K, V (A, this warp's 16 keys x 16 d): m = keys 0-7 | 8-15 x d 0-7, then x d 8-15
     *   Q, dO (B, 16 queries x 16 d): m = queries 0-7 x d 0-7 | 8-15, then queries 8-15
     *   Q, dO (B, 16 queries x 16 columns, transposed): m = queries 0-7 | 8-15 x cols 0-7,
     *   then x cols 8-15 */
    const uint32_t lane_a = fa_opaque(fa_swz<kW>(16 * warp + (lane & 15), lane >> 4));
    const uint32_t lane_b = fa_opaque(fa_swz<kW>(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1));
    const uint32_t lane_t = fa_opaque(fa_swz<kW>((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4));

    const int half = (int)(blockIdx.x % kSplit), c0 = half * kCols;
    const unsigned rest = blockIdx.x / kSplit, bhk = rest / prm.nblk;
    const int kb = (int)(rest % prm.nblk);
    const unsigned b = bhk / prm.Hk, hk = bhk % prm.Hk;
    const int rq = prm.cu_q ? prm.cu_q[b] : 0, rk = prm.cu_k ? prm.cu_k[b] : 0;
    const int sq = prm.cu_q ? prm.cu_q[b + 1] - rq : prm.Sq;
    const int sk = prm.cu_k ? prm.cu_k[b + 1] - rk : prm.Sk;
    const int j0 = kb * kBwdKeys;
    if (j0 >= sk)
        return;
    const int off = sk - sq, j_end = min(j0 + kBwdKeys, sk);
    /* Queries [i_lo, i_hi) see some key of the block (lo and hi grow with i); 64-bit: the
     * window may be up to 2^30. */
    const int64_t first = prm.window_right < 0 ? 0 : (int64_t)j0 - off - prm.window_right;
    const int64_t end = prm.window_left < 0 ? sq : (int64_t)j_end - off + prm.window_left;
    const int i_lo = first > 0 ? (int)first : 0, i_hi = end < sq ? (int)end : sq;
    const int qb_first = i_lo / kBlockM;
    const int nqb = i_hi > i_lo ? (i_hi + kBlockM - 1) / kBlockM - qb_first : 0;
    const int steps = nqb * prm.group; // (query head, query block) pairs, heads outer

    const char *k = prm.k + b * prm.k_sb + (int64_t)(rk + j0) * prm.k_ss + hk * prm.k_sh;
    const char *v = prm.v + b * prm.v_sb + (int64_t)(rk + j0) * prm.v_ss + hk * prm.v_sh;
    /* Does query block i0 straddle the band's edge or the sequences' ends against this key
     * block (then some of its pairs are masked)? */
    auto edge_of = [&](int i0) {
        const int i_last = i0 + kBlockM - 1;
        return i_last >= sq || j0 + kBwdKeys > sk || fa_key_lo(prm, i_last, off, sk) > j0 ||
               fa_key_hi(prm, i0, off, sk) < j0 + kBwdKeys;
    };
    /* Q and dO rows of step it into stage it % 2. */
    auto load_q = [&](int it) {
        const unsigned h = hk * prm.group + it / nqb;
        const int i0 = (qb_first + it % nqb) * kBlockM;
        const uint32_t sQ = sK + 2 * kKVBytes + (it & 1) * 2 * kQBytes;
        fa_load_tile<kBlockM, kW, kBwdThreads>(
            sQ, prm.q + b * prm.q_sb + (int64_t)(rq + i0) * prm.q_ss + h * prm.q_sh, prm.q_ss,
            sq - i0, prm.dch, tid);
        fa_load_tile<kBlockM, kW, kBwdThreads>(
            sQ + kQBytes, prm.dout + b * prm.do_sb + (int64_t)(rq + i0) * prm.do_ss + h * prm.do_sh,
            prm.do_ss, sq - i0, prm.dch, tid);
    };

    float acc_dk[kCT][4], acc_dv[kCT][4]; // dK, dV: [16 keys, kCols] per warp, C fragments
#pragma unroll
    for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            acc_dk[ct][e] = acc_dv[ct][e] = 0.0f;

    if (steps > 0) {
        fa_load_tile<kBwdKeys, kW, kBwdThreads>(sK, k, prm.k_ss, sk - j0, prm.dch, tid);
        fa_load_tile<kBwdKeys, kW, kBwdThreads>(sV, v, prm.v_ss, sk - j0, prm.dch, tid);
        load_q(0);
        fa_cp_async_commit();
    }
    /* A NaN or an infinity in Q or dO at a row that does not see some key of the block (the
     * pairs that straddle the band's edge) or saw no key: the exact path for the CTA. */
    bool nonfinite = false;
    for (int it = 0; it < steps; ++it) {
        const unsigned h = hk * prm.group + it / nqb;
        const int i0 = (qb_first + it % nqb) * kBlockM;
        const bool edge = edge_of(i0);
        /* opaque: no address arithmetic shared with the key loop, held across it */
        const int64_t at = fa_opaque((int64_t)(rq + i0));
        const char *q = prm.q + b * prm.q_sb + at * prm.q_ss + h * prm.q_sh;
        const char *dout = prm.dout + b * prm.do_sb + at * prm.do_ss + h * prm.do_sh;
        /* Every row of an edge pair; of a mask-free one (no rows past sq), one row a thread,
         * when it saw no key. */
        const int64_t row0 = fa_bwd_row0(prm, h, b, rq);
        int c_first = tid, c_end = kBlockM * prm.dch, c_step = kBwdThreads; // chunks r·dch + ch
        if (!edge) {
            const bool none = tid < kBlockM && prm.lse2[row0 + i0 + tid] == INFINITY;
            c_first = tid * prm.dch, c_end = none ? c_first + prm.dch : 0, c_step = 1;
        }
        for (int c = c_first; c < c_end; c += c_step) {
            const int r = c / prm.dch, ch = c % prm.dch;
            if (i0 + r < sq)
                nonfinite |= fa_bwd_nonfinite<kIn>(q + r * prm.q_ss + 16 * ch) ||
                             fa_bwd_nonfinite<kIn>(dout + r * prm.do_ss + 16 * ch);
        }
    }
    if (__syncthreads_or(nonfinite)) {
        fa_cp_async_wait_all();
        __syncthreads(); // every copy landed: the tiles are free
        fa_bwd_dkdv_exact<kCols, kIn>(
            prm, prm.k + b * prm.k_sb + (int64_t)rk * prm.k_ss + hk * prm.k_sh,
            prm.v + b * prm.v_sb + (int64_t)rk * prm.v_ss + hk * prm.v_sh,
            prm.dk + b * prm.dk_sb + (int64_t)rk * prm.dk_ss + hk * prm.dk_sh,
            prm.dv + b * prm.dv_sb + (int64_t)rk * prm.dv_ss + hk * prm.dv_sh, b, hk, rq, sq, sk,
            j0, c0, tid);
        return;
    }
    for (int it = 0; it < steps; ++it) {
        fa_cp_async_wait_all();
        // Q, dO of this step visible to all; every warp is done with the other stage
        __syncthreads();
        if (it + 1 < steps) {
            load_q(it + 1);
            fa_cp_async_commit();
        }
        const unsigned h = hk * prm.group + it / nqb;
        const int i0 = (qb_first + it % nqb) * kBlockM;
        const uint32_t sQ = sK + 2 * kKVBytes + (it & 1) * 2 * kQBytes, sO = sQ + kQBytes;
        const uint32_t la = fa_opaque(lane_a), lb = fa_opaque(lane_b), lt = fa_opaque(lane_t);

        float st[kNT][4], dpt[kNT][4]; // Sᵀ, dPᵀ: [16 keys, kBlockM queries] per warp
        fa_bwd_two_products<kD, kW, kNT, kIn>(st, dpt, sK, sV, sQ, sO, la, lb);

        /* Pᵀ and dSᵀ: element (key j, query i) of C fragment e is key 16w + g + 8(e / 2),
         * query nt·8 + 2t + e % 2. The band's mask only where the block pair straddles it. */
        const bool edge = edge_of(i0);
        const float slope_l2 = fa_bwd_slope(prm, b, h);
        const int64_t row0 = fa_bwd_row0(prm, h, b, rq);
        const int jw = j0 + 16 * warp + g; // this lane's key of rows g (+ 8)
        uint32_t pt[kNT][2], dst[kNT][2];  // Pᵀ, dSᵀ packed f16x2/bf16x2, as S's C fragments
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            float pv[4], dv[4];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = i0 + nt * 8 + 2 * t + e;
                const float lse2 = i < sq ? prm.lse2[row0 + i] : INFINITY;
                const float delta = i < sq ? prm.delta[row0 + i] : 0.0f;
                const int lo = edge ? fa_key_lo(prm, i, off, sk) : 0;
                const int hi = edge ? fa_key_hi(prm, i, off, sk) : sk;
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int j = jw + 8 * hf;
                    const float bias = slope_l2 * fabsf((float)(i + off - j));
                    const bool keep = j >= lo && j < hi && lse2 != INFINITY;
                    fa_bwd_pds(prm, st[nt][2 * hf + e], dpt[nt][2 * hf + e], lse2, delta, bias,
                               keep, fa_bwd_drop(prm, b * prm.H + h, i, j), pv[2 * hf + e],
                               dv[2 * hf + e]);
                }
            }
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                pt[nt][hf] = fa_pack2<kIn>(pv[2 * hf], pv[2 * hf + 1]);
                dst[nt][hf] = fa_pack2<kIn>(dv[2 * hf], dv[2 * hf + 1]);
            }
        }

        /* dV += Pᵀ dO, dK += dSᵀ Q over this step's queries, columns [c0, c0 + kCols). */
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk) {
            // A: Pᵀ, dSᵀ[16 keys, 16 queries] = tiles 2kk and 2kk+1
            const uint32_t pa[4] = {pt[2 * kk][0], pt[2 * kk][1], pt[2 * kk + 1][0],
                                    pt[2 * kk + 1][1]};
            const uint32_t da[4] = {dst[2 * kk][0], dst[2 * kk][1], dst[2 * kk + 1][0],
                                    dst[2 * kk + 1][1]};
#pragma unroll
            for (int ct = 0; ct < kCT; ct += 2) {
                uint32_t ob[4], qb[4]; // B: dO, Q[16 queries, 16 columns], transposed
                fa_ldsm_x4_trans(ob, sO + fa_swz_at<kW>(lt, kk * 16, c0 / 8 + ct));
                fa_mma16816<kIn>(acc_dv[ct], pa, ob[0], ob[1]);
                fa_mma16816<kIn>(acc_dv[ct + 1], pa, ob[2], ob[3]);
                fa_ldsm_x4_trans(qb, sQ + fa_swz_at<kW>(lt, kk * 16, c0 / 8 + ct));
                fa_mma16816<kIn>(acc_dk[ct], da, qb[0], qb[1]);
                fa_mma16816<kIn>(acc_dk[ct + 1], da, qb[2], qb[3]);
            }
        }
    }

    /* dk = scale·dK, dv = dV: rows g, g + 8 of the warp's keys, columns c0 + 8ct + 2t, +1;
     * keys below sk and columns below D. No cp.async is in flight: the last step loaded
     * nothing. */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int j = j0 + 16 * warp + g + 8 * hf;
        if (j >= sk)
            continue;
        char *dk = prm.dk + b * prm.dk_sb + (int64_t)(rk + j) * prm.dk_ss + hk * prm.dk_sh;
        char *dv = prm.dv + b * prm.dv_sb + (int64_t)(rk + j) * prm.dv_ss + hk * prm.dv_sh;
#pragma unroll
        for (int ct = 0; ct < kCT; ++ct) {
            const int col = c0 + ct * 8 + 2 * t;
            if (c0 / 8 + ct < prm.dch) {
                *(uint32_t *)(dk + 2 * col) = fa_pack2<kIn>(acc_dk[ct][2 * hf] * prm.scale,
                                                            acc_dk[ct][2 * hf + 1] * prm.scale);
                *(uint32_t *)(dv + 2 * col) =
                    fa_pack2<kIn>(acc_dv[ct][2 * hf], acc_dv[ct][2 * hf + 1]);
            }
        }
    }
}

/* The kernel: compiled for sm_75, only the Turing kind has a body. */
template <int kD, int kBlockM, int kCols, int kIn>
__global__ void __launch_bounds__(kBwdThreads, 1) fa_mma_bwd_dkdv_kernel(const fa_bwd_params prm) {
    if constexpr (FA_SM80 || kIn == FA_IN_F16_SM75)
        fa_mma_bwd_dkdv_body<kD, kBlockM, kCols, kIn>(prm);
    else
        __trap();
}

/* dQ of query block kBwdRows·m of head h in batch b; kBlockN keys a step. */
template <int kD, int kBlockN, int kIn>
static __device__ __forceinline__ void fa_mma_bwd_dq_body(const fa_bwd_params &prm) {
    constexpr int kW = fa_tile_width(kD), kRowBytes = kW * 2;
    constexpr int kNT = kBlockN / 8; // n8 tiles of S (keys)
    constexpr int kDT = kD / 8;      // n8 tiles of dQ
    constexpr uint32_t kQBytes = kBwdRows * kRowBytes, kKVBytes = kBlockN * kRowBytes;
    static_assert(kNT % 2 == 0 && kDT % 2 == 0, "tile shape");

    // Q, dO: [kBwdRows, kW]; then stages 0 and 1 of K, V: [kBlockN, kW]; swizzled
    const uint32_t sQ = fa_smem_u32(smem), sO = sQ + kQBytes;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    /* ldmatrix row addresses (fwd_mma.cu's): Q, dO as A (this warp's 16 rows); K, V as B;
     * K as B transposed (16 keys x 16 d), like V in the forward. */
    const uint32_t lane_a = fa_opaque(fa_swz<kW>(16 * warp + (lane & 15), lane >> 4));
    const uint32_t lane_b = fa_opaque(fa_swz<kW>(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1));
    const uint32_t lane_t = fa_opaque(fa_swz<kW>((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4));

    const int m_block = prm.nblk - 1 - (int)(blockIdx.x % prm.nblk); // heaviest first
    const unsigned bh = blockIdx.x / prm.nblk, b = bh / prm.H, h = bh % prm.H;
    const int rq = prm.cu_q ? prm.cu_q[b] : 0, rk = prm.cu_k ? prm.cu_k[b] : 0;
    const int sq = prm.cu_q ? prm.cu_q[b + 1] - rq : prm.Sq;
    const int sk = prm.cu_k ? prm.cu_k[b + 1] - rk : prm.Sk;
    const int i0 = m_block * kBwdRows;
    if (i0 >= sq)
        return;
    const int off = sk - sq, i_last = min(i0 + kBwdRows, sq) - 1;
    const int j_lo = fa_key_lo(prm, i0, off, sk), j_hi = fa_key_hi(prm, i_last, off, sk);
    const int lo_last = fa_key_lo(prm, i_last, off, sk);
    const int hi_first = fa_key_hi(prm, i0, off, sk);
    const int n_min = j_lo / kBlockN, n_end = j_hi > j_lo ? (j_hi + kBlockN - 1) / kBlockN : n_min;

    const unsigned hk = h / prm.group;
    const char *k = prm.k + b * prm.k_sb + (int64_t)rk * prm.k_ss + hk * prm.k_sh;
    const char *v = prm.v + b * prm.v_sb + (int64_t)rk * prm.v_ss + hk * prm.v_sh;
    /* K, V of key block n into stage s. */
    auto load_kv = [&](int n, int s) {
        const int jn = n * kBlockN;
        const uint32_t sK = sQ + 2 * kQBytes + s * 2 * kKVBytes;
        fa_load_tile<kBlockN, kW, kBwdThreads>(sK, k + jn * prm.k_ss, prm.k_ss, sk - jn, prm.dch,
                                               tid);
        fa_load_tile<kBlockN, kW, kBwdThreads>(sK + kKVBytes, v + jn * prm.v_ss, prm.v_ss, sk - jn,
                                               prm.dch, tid);
    };

    /* This lane's rows g, g + 8 of the warp: band, lse2, Δ (rows past sq: none, P = 0). */
    const int64_t row0 = fa_bwd_row0(prm, h, b, rq);
    int lo[2], hi[2], irow[2];
    float lse2[2], delta[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int i = irow[hf] = i0 + 16 * warp + g + 8 * hf;
        lo[hf] = fa_key_lo(prm, i, off, sk);
        hi[hf] = fa_key_hi(prm, i, off, sk);
        lse2[hf] = i < sq ? prm.lse2[row0 + i] : INFINITY;
        delta[hf] = i < sq ? prm.delta[row0 + i] : 0.0f;
    }
    const float slope_l2 = fa_bwd_slope(prm, b, h);

    float acc_dq[kDT][4]; // dQ: [16 rows, kD] per warp, C fragments
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            acc_dq[dt][e] = 0.0f;

    if (n_end > n_min) {
        const char *q = prm.q + b * prm.q_sb + (int64_t)(rq + i0) * prm.q_ss + h * prm.q_sh;
        const char *dout =
            prm.dout + b * prm.do_sb + (int64_t)(rq + i0) * prm.do_ss + h * prm.do_sh;
        fa_load_tile<kBwdRows, kW, kBwdThreads>(sQ, q, prm.q_ss, sq - i0, prm.dch, tid);
        fa_load_tile<kBwdRows, kW, kBwdThreads>(sO, dout, prm.do_ss, sq - i0, prm.dch, tid);
        load_kv(n_min, 0);
        fa_cp_async_commit();
    }
    /* A NaN or an infinity in K at a key that some row does not see (the blocks that straddle
     * the band's edge): the exact path for the CTA. */
    bool nonfinite = false;
    for (int n = n_min; n < n_end; ++n) {
        const int j0 = n * kBlockN;
        if (j0 >= lo_last && j0 + kBlockN <= hi_first) { // mask-free: on to the right edge
            n = max(n, hi_first / kBlockN - 1);
            continue;
        }
        for (int c = tid; c < kBlockN * prm.dch; c += kBwdThreads) {
            const int j = j0 + c / prm.dch;
            if (j < sk)
                nonfinite |= fa_bwd_nonfinite<kIn>(k + j * prm.k_ss + 16 * (c % prm.dch));
        }
    }
    if (__syncthreads_or(nonfinite)) {
        fa_cp_async_wait_all();
        __syncthreads(); // every copy landed: the tiles are free
        fa_bwd_dq_exact<kIn>(
            prm, prm.q + b * prm.q_sb + (int64_t)(rq + i0) * prm.q_ss + h * prm.q_sh,
            prm.dout + b * prm.do_sb + (int64_t)(rq + i0) * prm.do_ss + h * prm.do_sh, k, v,
            prm.dq + b * prm.dq_sb + (int64_t)(rq + i0) * prm.dq_ss + h * prm.dq_sh, b * prm.H + h,
            i0, sq, sk, row0, slope_l2, tid);
        return;
    }
    for (int n = n_min, stage = 0; n < n_end; ++n, stage ^= 1) {
        const int j0 = n * kBlockN;
        fa_cp_async_wait_all();
        // K(n), V(n) (and Q, dO) visible to all; every warp is done with the other stage
        __syncthreads();
        if (n + 1 < n_end) {
            load_kv(n + 1, stage ^ 1);
            fa_cp_async_commit();
        }
        const uint32_t sK = sQ + 2 * kQBytes + stage * 2 * kKVBytes, sV = sK + kKVBytes;
        const uint32_t la = fa_opaque(lane_a), lb = fa_opaque(lane_b), lt = fa_opaque(lane_t);

        float s[kNT][4], dp[kNT][4]; // S, dP: [16 rows, kBlockN keys] per warp
        fa_bwd_two_products<kD, kW, kNT, kIn>(s, dp, sQ, sO, sK, sV, la, lb);

        /* dS: element e of n8 tile nt is row g + 8(e / 2), key j0 + nt·8 + 2t + e % 2. */
        const bool edge = j0 < lo_last || j0 + kBlockN > hi_first;
        uint32_t ds[kNT][2]; // dS packed f16x2/bf16x2, as S's C fragments
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            float pv[4], dv[4];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = j0 + nt * 8 + 2 * t + e;
                    const float bias = slope_l2 * fabsf((float)(irow[hf] + off - j));
                    const bool keep =
                        (!edge || (j >= lo[hf] && j < hi[hf])) && lse2[hf] != INFINITY;
                    fa_bwd_pds(prm, s[nt][2 * hf + e], dp[nt][2 * hf + e], lse2[hf], delta[hf],
                               bias, keep, fa_bwd_drop(prm, b * prm.H + h, irow[hf], j),
                               pv[2 * hf + e], dv[2 * hf + e]);
                }
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                ds[nt][hf] = fa_pack2<kIn>(dv[2 * hf], dv[2 * hf + 1]);
        }

        /* dQ += dS K */
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            // A: dS[16 rows, 16 keys] = tiles 2kk and 2kk+1
            const uint32_t da[4] = {ds[2 * kk][0], ds[2 * kk][1], ds[2 * kk + 1][0],
                                    ds[2 * kk + 1][1]};
#pragma unroll
            for (int dt = 0; dt < kDT; dt += 2) {
                uint32_t kb[4]; // B: K[16 keys, 16 d], transposed
                fa_ldsm_x4_trans(kb, sK + fa_swz_at<kW>(lt, kk * 16, dt));
                fa_mma16816<kIn>(acc_dq[dt], da, kb[0], kb[1]);
                fa_mma16816<kIn>(acc_dq[dt + 1], da, kb[2], kb[3]);
            }
        }
    }

    /* dq = scale·dQ: rows g, g + 8, columns 8dt + 2t, +1; rows below sq, columns below D. A row
     * that saw no key gets 0 (not 0 times a non-finite K). */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        if (irow[hf] >= sq)
            continue;
        const bool none = lse2[hf] == INFINITY;
        char *dq = prm.dq + b * prm.dq_sb + (int64_t)(rq + irow[hf]) * prm.dq_ss + h * prm.dq_sh;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
            if (dt < prm.dch)
                *(uint32_t *)(dq + 2 * (dt * 8 + 2 * t)) =
                    fa_pack2<kIn>(none ? 0.0f : acc_dq[dt][2 * hf] * prm.scale,
                                  none ? 0.0f : acc_dq[dt][2 * hf + 1] * prm.scale);
    }
}

/* The kernel: compiled for sm_75, only the Turing kind has a body. */
template <int kD, int kBlockN, int kIn>
__global__ void __launch_bounds__(kBwdThreads, 1) fa_mma_bwd_dq_kernel(const fa_bwd_params prm) {
    if constexpr (FA_SM80 || kIn == FA_IN_F16_SM75)
        fa_mma_bwd_dq_body<kD, kBlockN, kIn>(prm);
    else
        __trap();
}

/* The kernels for kD and input kind: the dK/dV kernel's query rows a step and columns a CTA,
 * the dQ kernel's keys a step. Within 99 KB of shared memory (sm_86, sm_89, sm_120) for the
 * sm_80 kinds; within Turing's 64 KB up to kD = 128 for its kind (none above). */
static __host__ __device__ constexpr int fa_bwd_dkdv_rows(int kd) {
    return kd <= 64 ? 64 : kd <= 128 ? 32 : 16;
}
static __host__ __device__ constexpr int fa_bwd_dkdv_cols(int kd) {
    return kd <= 128 ? kd : kd / 2;
}
static __host__ __device__ constexpr int fa_bwd_dq_keys(int kd, int kind) {
    return kd <= 64 || (kd <= 128 && kind != FA_IN_F16_SM75) ? 64 : kd <= 128 ? 32 : 16;
}
/* Their shared memory: the larger of the two. */
static int fa_bwd_smem_bytes(int kd, int kind) {
    const int w2 = fa_tile_width(kd) * 2;
    const int dkdv = (2 * kBwdKeys + 4 * fa_bwd_dkdv_rows(kd)) * w2;
    const int dq = (2 * kBwdRows + 4 * fa_bwd_dq_keys(kd, kind)) * w2;
    return dkdv > dq ? dkdv : dq;
}

/* Sets the kernel's dynamic shared memory above 48 KB and launches it. */
template <class K>
static cudaError_t fa_bwd_launch(K kernel, const fa_bwd_params &prm, int64_t blocks, int bytes,
                                 cudaStream_t stream) {
    if (bytes > 48 * 1024) {
        const cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (err != cudaSuccess)
            return err;
    }
    kernel<<<(unsigned)blocks, kBwdThreads, bytes, stream>>>(prm);
    return cudaGetLastError();
}

/* Both kernels for kD: dK/dV over kb_blocks CTAs, then dQ over q_blocks. */
template <int kD, int kIn>
static cudaError_t fa_bwd_launch_kd(fa_bwd_params prm, int nkb, int64_t kv_blocks, int nqb,
                                    int64_t q_blocks, cudaStream_t stream) {
    constexpr int kW = fa_tile_width(kD), kRowsM = fa_bwd_dkdv_rows(kD);
    constexpr int kCols = fa_bwd_dkdv_cols(kD), kKeysN = fa_bwd_dq_keys(kD, kIn);
    cudaError_t err = cudaSuccess;
    if (kv_blocks > 0) {
        prm.nblk = nkb;
        err = fa_bwd_launch(fa_mma_bwd_dkdv_kernel<kD, kRowsM, kCols, kIn>, prm,
                            kv_blocks * (kD / kCols), (2 * kBwdKeys + 4 * kRowsM) * kW * 2, stream);
    }
    if (err == cudaSuccess && q_blocks > 0) {
        prm.nblk = nqb;
        err = fa_bwd_launch(fa_mma_bwd_dq_kernel<kD, kKeysN, kIn>, prm, q_blocks,
                            (2 * kBwdRows + 4 * kKeysN) * kW * 2, stream);
    }
    return err;
}

template <int kD>
static cudaError_t fa_bwd_launch_as(int kind, const fa_bwd_params &prm, int nkb, int64_t kv_blocks,
                                    int nqb, int64_t q_blocks, cudaStream_t stream) {
    if (kind == FA_IN_BF16)
        return fa_bwd_launch_kd<kD, FA_IN_BF16>(prm, nkb, kv_blocks, nqb, q_blocks, stream);
    if (kind == FA_IN_F16)
        return fa_bwd_launch_kd<kD, FA_IN_F16>(prm, nkb, kv_blocks, nqb, q_blocks, stream);
    if constexpr (kD <= 128) /* Turing's kind: none above (fa__mma_bwd_supported) */
        return fa_bwd_launch_kd<kD, FA_IN_F16_SM75>(prm, nkb, kv_blocks, nqb, q_blocks, stream);
    return cudaErrorInvalidValue;
}

/* The longest query and key sequences: the grid's blocks per (batch, head). */
static void fa_bwd_max_len(const fa__problem *p, int64_t *sq, int64_t *sk) {
    *sq = p->Sq, *sk = p->Sk;
    if (!p->cu_q)
        return;
    *sq = *sk = 0;
    for (int64_t b = 0; b < p->B; ++b) {
        const int64_t lq = (int64_t)p->cu_q[b + 1] - p->cu_q[b];
        const int64_t lk = (int64_t)p->cu_k[b + 1] - p->cu_k[b];
        *sq = lq > *sq ? lq : *sq;
        *sk = lk > *sk ? lk : *sk;
    }
}

int fa__mma_bwd_supported(const fa__problem *p, int sm, int smem_optin) {
    const int32_t dt = p->q.dtype, kind = fa_mma_kind(p, sm);
    if (kind < 0)
        return 0;
    if (p->D < 8 || p->D > 256 || p->D % 8 != 0 || p->Dv != p->D) /* Dv != D: stage 1 */
        return 0;
    if ((kind == FA_IN_F16_SM75 && p->D > 128) ||
        fa_bwd_smem_bytes(fa_mma_kd(p->D), kind) > smem_optin)
        return 0; /* a GPU with less shared memory: stage 1 */
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f) || p->seqlens_k)
        return 0;
    const fa__view *views[] = {&p->q, &p->k, &p->v, &p->out, &p->dout, &p->dq, &p->dk, &p->dv};
    for (int i = 0; i < 8; ++i)
        if (!fa_mma_view_ok(views[i], dt))
            return 0;
    if (!isfinite(p->scale) ||
        (p->softcap > 0.0f && !isfinite(2.0f * FA_BWD_LOG2E_F * (p->scale / p->softcap))))
        return 0;
    if (p->Hk < 1 || p->H % p->Hk != 0)
        return 0;
    int64_t sq, sk;
    fa_bwd_max_len(p, &sq, &sk);
    if (sq > kMaxLen || sk > kMaxLen)
        return 0;
    /* The grids are one dimension: (query blocks x B x H) and (key blocks x B x Hk x 2). */
    const int64_t nqb = (sq + kBwdRows - 1) / kBwdRows, nkb = (sk + kBwdKeys - 1) / kBwdKeys;
    return p->H <= INT32_MAX && p->B <= INT32_MAX && p->B * p->H <= INT32_MAX &&
           (nqb == 0 || p->B * p->H <= INT32_MAX / nqb) &&
           (nkb == 0 || p->B * p->Hk <= INT32_MAX / 2 / nkb);
}

cudaError_t fa__mma_backward(const fa__problem *p, int sm, const fa__bwd_rows_in *rows,
                             const int32_t *cu_q_dev, const int32_t *cu_k_dev,
                             cudaStream_t stream) {
    int64_t sq, sk;
    fa_bwd_max_len(p, &sq, &sk);
    const int64_t nqb = (sq + kBwdRows - 1) / kBwdRows, nkb = (sk + kBwdKeys - 1) / kBwdKeys;
    const int64_t q_blocks = nqb * p->B * p->H, kv_blocks = nkb * p->B * p->Hk;
    if (q_blocks == 0 && kv_blocks == 0)
        return cudaSuccess;
    fa_bwd_params prm;
    prm.q = (const char *)p->q.data;
    prm.k = (const char *)p->k.data;
    prm.v = (const char *)p->v.data;
    prm.dout = (const char *)p->dout.data;
    prm.dq = (char *)p->dq.data;
    prm.dk = (char *)p->dk.data;
    prm.dv = (char *)p->dv.data;
    prm.q_sb = 2 * p->q.sb, prm.q_ss = 2 * p->q.ss, prm.q_sh = 2 * p->q.sh;
    prm.k_sb = 2 * p->k.sb, prm.k_ss = 2 * p->k.ss, prm.k_sh = 2 * p->k.sh;
    prm.v_sb = 2 * p->v.sb, prm.v_ss = 2 * p->v.ss, prm.v_sh = 2 * p->v.sh;
    prm.do_sb = 2 * p->dout.sb, prm.do_ss = 2 * p->dout.ss, prm.do_sh = 2 * p->dout.sh;
    prm.dq_sb = 2 * p->dq.sb, prm.dq_ss = 2 * p->dq.ss, prm.dq_sh = 2 * p->dq.sh;
    prm.dk_sb = 2 * p->dk.sb, prm.dk_ss = 2 * p->dk.ss, prm.dk_sh = 2 * p->dk.sh;
    prm.dv_sb = 2 * p->dv.sb, prm.dv_ss = 2 * p->dv.ss, prm.dv_sh = 2 * p->dv.sh;
    prm.delta = rows->delta;
    prm.lse2 = rows->lse2;
    prm.R = rows->R;
    prm.cu_q = cu_q_dev;
    prm.cu_k = cu_k_dev;
    prm.alibi = p->alibi;
    prm.alibi_sb = p->alibi_sb, prm.alibi_sh = p->alibi_sh;
    prm.Sq = (int)p->Sq, prm.Sk = (int)p->Sk, prm.H = (int)p->H, prm.Hk = (int)p->Hk;
    prm.group = (int)(p->H / p->Hk);
    prm.nblk = 0;
    prm.dch = (int)(p->D / 8);
    /* A window wider than any |i + off - j| is unbounded either way. */
    prm.window_left = p->window_left > kMaxWindow ? kMaxWindow : p->window_left;
    prm.window_right = p->window_right > kMaxWindow ? kMaxWindow : p->window_right;
    prm.scale = p->scale;
    prm.scale_l2 = p->scale * FA_BWD_LOG2E_F;
    prm.softcap_in = p->softcap > 0.0f ? 2.0f * FA_BWD_LOG2E_F * (p->scale / p->softcap) : 0.0f;
    prm.softcap_l2 = p->softcap > 0.0f ? p->softcap * FA_BWD_LOG2E_F : 0.0f;
    prm.dropout = p->dropout_p != 0.0f;
    prm.drop_threshold = p->dropout_threshold;
    prm.drop_scale = p->dropout_scale;
    prm.drop_seed = p->dropout_seed, prm.drop_offset = p->dropout_offset;

    const int kind = fa_mma_kind(p, sm);
    const int ikb = (int)nkb, iqb = (int)nqb;
    switch (fa_mma_kd(p->D)) {
    case 32:
        return fa_bwd_launch_as<32>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    case 64:
        return fa_bwd_launch_as<64>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    case 96:
        return fa_bwd_launch_as<96>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    case 128:
        return fa_bwd_launch_as<128>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    case 160:
        return fa_bwd_launch_as<160>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    case 192:
        return fa_bwd_launch_as<192>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    case 224:
        return fa_bwd_launch_as<224>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    case 256:
        return fa_bwd_launch_as<256>(kind, prm, ikb, kv_blocks, iqb, q_blocks, stream);
    }
    return cudaErrorInvalidValue;
}
