/* SPDX-License-Identifier: MIT */
/*
 * decode.cu — the split-KV decode for fa_forward_kvcache (and a plain fixed-length forward with
 * few query rows): every query row that shares a KV head in one CTA, so each cache byte is read
 * from HBM once, and results with the same bits for every split count.
 *
 * Work. CTA (b, hk, split) of a 1-D grid of B·Hk·splits holds the R = G·Sq query rows of KV head
 * hk (G = H / Hk query heads times Sq rows; R <= kDecMaxRows = 16: the per-thread register
 * arrays are sized for it). The keys every row of the CTA sees, [lo_u, hi_u), fall into chunks
 * of FA_DECODE_CHUNK = 256 keys; the splits take consecutive runs of those chunks. For each
 * chunk the CTA writes every row's partial (m, l, o[D]) in fp32 to scratch, from the chunk's
 * keys alone; the combine kernel (a warp a row) merges the chunks that meet the row's band in
 * chunk order: global max first, then l and o summed in chunk order, out = o / l,
 * lse = (m + log2 l) ln 2, and then the sink, once (fwd_row.h's fa__sink_join). A chunk's
 * partial does not depend on which CTA makes it and the combine always runs, so out and lse
 * have the same bits for any split count. No atomics.
 *
 * Inside a chunk, tiles of T keys (T·D·sizeof(elem) <= 16 KB, T in 16..128, a power of two)
 * go through shared memory, K and V double-buffered by cp.async: the 16-byte copies of a tile
 * run along the rows (coalesced) and the next tile's 16-32 KB are in flight while this one is
 * computed. Each key row's address comes from fa__view_at (leftpad, pages of any size,
 * batch_idx), computed once per key by one thread two tiles ahead and kept in shared memory, so
 * a paged cache costs what a contiguous one does. Per tile, 128 threads:
 *   S    thread (key j = tid % T, rows tid / T + k·128/T): s = q'·k_j over D in order, from the
 *        K tile and q' (fp32, pre-scaled, in shared memory; a warp reads one q' address);
 *        softcap, ALiBi (fp64), -inf outside the row's band; S: [R, T] in shared memory
 *   max  warp w, rows w + 4k: the tile max (fmaxf: a NaN is never a max), alpha = 2^(m - m'),
 *        p = 2^(s - m') (0 at s = -inf), l = l·alpha + sum p (lane sums, then an xor tree)
 *   PV   thread (16-byte column group c, row group, key part): o[rows][cols] = o·alpha +
 *        p·v over its keys of the tile, skipping keys outside each row's band (a non-finite
 *        v there stays out, as in cuda/fwd_row.h)
 * At a chunk's end the key parts' o are summed in part order through shared memory and
 * written with (m, l). Every reduction has a fixed order. Arithmetic as cuda/fwd_row.h: q
 * scaled by qscale, exp2 domain, softcap c·log2(e)·tanh, ALiBi slope·log2(e)·|i + off - j| in
 * fp64, the non-finite rule, fp32 accumulation.
 *
 * Bandwidth (the design's arithmetic, not measured: no GPU has run this file). At D = 128, bf16,
 * R = 4: T = 64, 73 KB of shared memory and 127 registers a thread, so 3 CTAs an SM on an H100
 * (2 on an A100), each with one 34 KB K+V tile in flight: about 100 KB an SM against the ~20 KB
 * Little's law asks at 3.35 TB/s. A tile's compute (about 1000 instructions a thread, latency
 * bound at roughly 2500 cycles) is shorter than the ~6800 cycles three CTAs' tiles take to
 * arrive at an SM's share of HBM bandwidth, so the loads should set the pace. Shared memory
 * holds each cache byte once; K rows are read by 128 / T threads (S) and V rows once (PV).
 *
 * Scratch: B·Hk·ceil(max_sk / 256)·R records of (m, l) and o[D], fp32: 4·R·(D + 2) bytes per
 * 256 keys of (b, hk), 1.6% of the cache at R = 4, D = 128, bf16, written once and read once.
 */
#include "flashattn.h"
#include "fwd_row.h"
#include "kernels.h"
#include "mma.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define FA_DECODE_CHUNK 256 /* keys a partial (m, l, o) covers */

enum {
    kDecThreads = 128,
    kDecMaxRows = 16,                   /* G·Sq rows a CTA holds */
    kDecTileBytes = 16384,              /* the most bytes of one K (or V) tile */
    kDecRedBytes = kDecThreads * 32 * 4 /* the key parts' o at a chunk's end: 32 fp32 a thread */
};

/* The problem and the launch's shape; scratch as ml (m, l pairs) and po (o rows), record
 * ((b·Hk + hk)·nc + chunk)·R + r for row r = g·Sq + i (query head hk·G + g, query row i). */
typedef struct fa_dec_params {
    fa__problem p;
    int R, G, Sq, splits;
    int64_t nc;              /* chunks a (b, hk) has room for in scratch */
    int T, log_t;            /* tile keys, log2 */
    int nch, nchp, log_nchp; /* 16-byte column groups of a row; nch rounded up to a power of 2 */
    int log_ng;              /* row groups of the PV phase: 1, 2 or 4 */
    int pitch;               /* bytes of a K/V row in shared memory */
    uint32_t stage, q_at, s_at, a_at, slope_at, band_at, offs_at; /* shared-memory layout */
    float qscale, softcap_l2;
    float *ml, *po;
} fa_dec_params;

/* The kEl = 16 / sizeof(elem) values of a 16-byte group of fp32, fp16 or bf16 at `at`, as fp32. */
template <int kDt, class Ptr>
static __device__ __forceinline__ void fa_dec_group(Ptr at,
                                                    float (&x)[kDt == FA_DTYPE_F32 ? 4 : 8]) {
    const uint4 c = *(const uint4 *)at;
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
    if constexpr (kDt == FA_DTYPE_F32) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            x[e] = fa__bits_f32(w[e]);
    } else {
        constexpr int kIn = kDt == FA_DTYPE_BF16 ? FA_IN_BF16 : FA_IN_F16;
#pragma unroll
        for (int e = 0; e < 8; ++e)
            x[e] = fa_to_f32<kIn>((w[e / 2] >> (16 * (e % 2))) & 0xffffu);
    }
}

/* Offsets in elements of the K and V rows of tile `tile`'s keys, -1 for keys outside
 * [k0, k1) (not loaded), into offs[par] ([2 (k, v), T] int64); one thread a key. */
template <class Smem>
static __device__ __forceinline__ void fa_dec_offsets(const fa_dec_params &prm, Smem smem,
                                                      int64_t tile, int par, int64_t b, int64_t hk,
                                                      int64_t k0, int64_t k1, int tid) {
    if (tid >= prm.T)
        return;
    const int64_t key = tile * prm.T + tid;
    const bool ok = key >= k0 && key < k1;
    const uint32_t at = prm.offs_at + 8 * (uint32_t)(2 * par * prm.T + tid);
    *(int64_t *)(smem + at) = ok ? fa__view_at(&prm.p.k, b, key, hk) : -1;
    *(int64_t *)(smem + at + 8 * prm.T) = ok ? fa__view_at(&prm.p.v, b, key, hk) : -1;
}

/* cp.async of the tile whose offsets are offs[par] into the stage at dst (K: [T, pitch] bytes,
 * then V); thread tid copies column group tid % nchp of rows tid / nchp + k·(128 / nchp). Keys
 * not loaded are zero-filled from a row that exists (k_any, v_any). */
template <int kEs, class Smem>
static __device__ __forceinline__ void fa_dec_issue(const fa_dec_params &prm, Smem smem,
                                                    uint32_t dst, int par, const char *k_any,
                                                    const char *v_any, int tid) {
    const int ch = tid & (prm.nchp - 1), step = kDecThreads >> prm.log_nchp;
    if (ch >= prm.nch)
        return;
    const char *k = (const char *)prm.p.k.data, *v = (const char *)prm.p.v.data;
    const uint32_t offs = prm.offs_at + 16 * (uint32_t)(par * prm.T);
    for (int j = tid >> prm.log_nchp; j < prm.T; j += step) {
        const int64_t ko = *(const int64_t *)(smem + offs + 8 * j);
        const int64_t vo = *(const int64_t *)(smem + offs + 8 * (prm.T + j));
        const uint32_t at = dst + (uint32_t)(j * prm.pitch + 16 * ch);
        fa_cp_async16(at, ko >= 0 ? k + ko * kEs + 16 * ch : k_any, ko >= 0);
        fa_cp_async16(at + prm.T * prm.pitch, vo >= 0 ? v + vo * kEs + 16 * ch : v_any, vo >= 0);
    }
    fa_cp_async_commit();
}

/* o = 0: a chunk's output sums start over. */
template <int kR, int kE> static __device__ __forceinline__ void fa_dec_zero(float (&o)[kR][kE]) {
#pragma unroll
    for (int x = 0; x < kR; ++x)
#pragma unroll
        for (int e = 0; e < kE; ++e)
            o[x][e] = 0.0f;
}

template <int kDt>
static __global__ void __launch_bounds__(kDecThreads) fa_decode_kernel(const fa_dec_params prm) {
    constexpr int kEs = kDt == FA_DTYPE_F32 ? 4 : 2, kEl = 16 / kEs; /* a column group */
    constexpr int kRpt = 32 / kEl; /* PV rows a thread: o is 32 fp32 */
    extern __shared__ __align__(128) unsigned char smem[];
    /* stages 0 and 1: K [T, pitch] then V [T, pitch] bytes (a chunk's end: the key parts' o);
     * q': [R, D] fp32; S/P: [R, T] fp32; alpha: [16] fp32; slope: [16] fp64;
     * band: [16][lo, hi] int32; offs: [2 tiles][2 (k, v)][T] int64 */
    const fa__problem &p = prm.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int R = prm.R, Sq = prm.Sq, T = prm.T;
    const int64_t D = p.D;
    const int64_t split = blockIdx.x % prm.splits, bh = blockIdx.x / prm.splits;
    const int64_t b = bh / p.Hk, hk = bh % p.Hk;
    const int64_t sk = p.seqlens_k ? p.seqlens_k[b] : p.Sk, off = sk - Sq;
    /* the keys some row sees (lo and hi grow with the row) and this split's chunks of them */
    const int64_t lo_u = fa__key_lo(&p, 0, off), hi_u = fa__key_hi(&p, Sq - 1, off, sk);
    if (hi_u <= lo_u)
        return;
    const int64_t c_lo = lo_u / FA_DECODE_CHUNK, n = (hi_u - 1) / FA_DECODE_CHUNK + 1 - c_lo;
    const int64_t c0 = c_lo + n * split / prm.splits, c1 = c_lo + n * (split + 1) / prm.splits;
    if (c0 >= c1)
        return;
    const int64_t k0 = c0 * FA_DECODE_CHUNK > lo_u ? c0 * FA_DECODE_CHUNK : lo_u;
    const int64_t k1 = c1 * FA_DECODE_CHUNK < hi_u ? c1 * FA_DECODE_CHUNK : hi_u;
    const int64_t t0 = k0 >> prm.log_t, ntiles = ((k1 - 1) >> prm.log_t) + 1 - t0;
    const char *k_any = (const char *)p.k.data + fa__view_at(&p.k, b, k0, hk) * kEs;
    const char *v_any = (const char *)p.v.data + fa__view_at(&p.v, b, k0, hk) * kEs;

    /* q' = q·qscale; each row's ALiBi slope·log2(e) and band */
    for (int64_t x = tid; x < R * D; x += kDecThreads) {
        const int64_t r = x / D, d = x % D, h = hk * prm.G + r / Sq, i = r % Sq;
        const float qv = fa__row_load(p.q.data, p.q.dtype, fa__row_at(&p.q, b, i, h) + d * p.q.sd);
        *(float *)(smem + prm.q_at + 4 * x) = qv * prm.qscale;
    }
    if (tid < R) {
        const int64_t h = hk * prm.G + tid / Sq, i = tid % Sq;
        *(double *)(smem + prm.slope_at + 8 * tid) =
            p.alibi ? p.alibi[b * p.alibi_sb + h * p.alibi_sh] * 1.4426950408889634 : 0.0;
        const int64_t lo = fa__key_lo(&p, i, off), hi = fa__key_hi(&p, i, off, sk);
        *(int *)(smem + prm.band_at + 8 * tid) = (int)lo;
        *(int *)(smem + prm.band_at + 8 * tid + 4) = (int)(hi > lo ? hi : lo);
    }
    fa_dec_offsets(prm, smem, t0, 0, b, hk, k0, k1, tid);
    if (ntiles > 1)
        fa_dec_offsets(prm, smem, t0 + 1, 1, b, hk, k0, k1, tid);
    __syncthreads();
    const uint32_t base = fa_smem_u32(smem);
    fa_dec_issue<kEs>(prm, smem, base, 0, k_any, v_any, tid);

    /* the max phase: warp w's rows w + 4x; m and l the same in every lane */
    float m[kDecMaxRows / 4], l[kDecMaxRows / 4];
    /* the PV phase: column group c of rows g·kRpt + x, keys kp, kp + KP, ... of each tile */
    const int c = tid & (prm.nchp - 1), u = tid >> prm.log_nchp;
    const int g = u & ((1 << prm.log_ng) - 1), kp = u >> prm.log_ng;
    const int KP = (kDecThreads >> prm.log_nchp) >> prm.log_ng;
    float o[kRpt][kEl]; // o: [kRpt rows, kEl columns]
#pragma unroll
    for (int x = 0; x < kDecMaxRows / 4; ++x)
        m[x] = -INFINITY, l[x] = 0.0f;
    fa_dec_zero(o);

    for (int64_t t = 0; t < ntiles; ++t) {
        const int par = (int)(t & 1);
        const uint32_t sK = prm.stage * par, sV = sK + T * prm.pitch;
        const int64_t key0 = (t0 + t) * T; /* the tile's first key */
        fa_cp_async_wait_all();
        /* tile t landed and is visible; every thread is done with the other stage and offs */
        __syncthreads();
        if (t + 1 < ntiles)
            fa_dec_issue<kEs>(prm, smem, base + prm.stage * (par ^ 1), par ^ 1, k_any, v_any, tid);
        if (t + 2 < ntiles)
            fa_dec_offsets(prm, smem, t0 + t + 2, par, b, hk, k0, k1, tid);

        { /* S: scores of key j for rows rg, rg + nrg, ... */
            const int j = tid & (T - 1), rg = tid >> prm.log_t, nrg = kDecThreads >> prm.log_t;
            float s[kDecMaxRows];
#pragma unroll
            for (int x = 0; x < kDecMaxRows; ++x)
                s[x] = 0.0f;
            for (int ch = 0; ch < prm.nch; ++ch) {
                float kx[kEl];
                fa_dec_group<kDt>(smem + sK + j * prm.pitch + 16 * ch, kx);
#pragma unroll
                for (int x = 0; x < kDecMaxRows; ++x) {
                    const int r = rg + x * nrg;
                    if (r < R) {
                        const uint32_t q_at = prm.q_at + 4 * (uint32_t)(r * D + ch * kEl);
#pragma unroll
                        for (int e4 = 0; e4 < kEl; e4 += 4) {
                            float qx[4];
                            fa_dec_group<FA_DTYPE_F32>(smem + q_at + 4 * e4, qx);
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                s[x] = fmaf(qx[e], kx[e4 + e], s[x]);
                        }
                    }
                }
            }
            const int64_t key = key0 + j;
#pragma unroll
            for (int x = 0; x < kDecMaxRows; ++x) {
                const int r = rg + x * nrg;
                if (r < R) {
                    const int lo = *(const int *)(smem + prm.band_at + 8 * r);
                    const int hi = *(const int *)(smem + prm.band_at + 8 * r + 4);
                    float sv = s[x];
                    if (key >= lo && key < hi) {
                        if (prm.softcap_l2 != 0.0f)
                            sv = prm.softcap_l2 * tanhf(sv);
                        if (p.alibi) {
                            const double slope = *(const double *)(smem + prm.slope_at + 8 * r);
                            const int64_t dist = (int64_t)(r % Sq) + off - key;
                            sv = (float)((double)sv - slope * fabs((double)dist));
                        }
                    } else {
                        sv = -INFINITY;
                    }
                    *(float *)(smem + prm.s_at + 4 * (uint32_t)(r * T + j)) = sv;
                }
            }
        }
        __syncthreads();

        /* max: the tile's row max, alpha, P in place of S, l */
#pragma unroll
        for (int x = 0; x < kDecMaxRows / 4; ++x) {
            const int r = warp + 4 * x;
            if (r < R) {
                const uint32_t row = prm.s_at + 4 * (uint32_t)(r * T);
                float mx = -INFINITY;
                for (int j = lane; j < T; j += 32)
                    mx = fmaxf(mx, *(const float *)(smem + row + 4 * j));
#pragma unroll
                for (int sh = 16; sh >= 1; sh >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
                const float mn = fmaxf(m[x], mx);
                const float alpha = mn > m[x] ? exp2f(m[x] - mn) : 1.0f; /* -inf to finite: 0 */
                float sum = 0.0f;
                for (int j = lane; j < T; j += 32) {
                    const float sv = *(const float *)(smem + row + 4 * j);
                    const float pv = sv == -INFINITY ? 0.0f : exp2f(sv - mn); /* NaN stays */
                    *(float *)(smem + row + 4 * j) = pv;
                    sum += pv;
                }
#pragma unroll
                for (int sh = 16; sh >= 1; sh >>= 1)
                    sum += __shfl_xor_sync(0xffffffffu, sum, sh);
                l[x] = l[x] * alpha + sum;
                m[x] = mn;
                if (lane == 0)
                    *(float *)(smem + prm.a_at + 4 * r) = alpha;
            }
        }
        __syncthreads();

        /* PV: o = o·alpha + sum of p·v over this thread's keys, each row's band only */
        if (c < prm.nch) {
            int lo[kRpt], hi[kRpt];
#pragma unroll
            for (int x = 0; x < kRpt; ++x) {
                const int r = g * kRpt + x;
                lo[x] = hi[x] = 0;
                if (r < R) {
                    const float alpha = *(const float *)(smem + prm.a_at + 4 * r);
#pragma unroll
                    for (int e = 0; e < kEl; ++e)
                        o[x][e] *= alpha;
                    lo[x] = *(const int *)(smem + prm.band_at + 8 * r);
                    hi[x] = *(const int *)(smem + prm.band_at + 8 * r + 4);
                }
            }
            for (int j = kp; j < T; j += KP) {
                const int64_t key = key0 + j;
                if (key < k0 || key >= k1)
                    continue;
                float vx[kEl];
                fa_dec_group<kDt>(smem + sV + j * prm.pitch + 16 * c, vx);
#pragma unroll
                for (int x = 0; x < kRpt; ++x) {
                    const int r = g * kRpt + x;
                    if (r < R && key >= lo[x] && key < hi[x]) {
                        const float pv =
                            *(const float *)(smem + prm.s_at + 4 * (uint32_t)(r * T + j));
#pragma unroll
                        for (int e = 0; e < kEl; ++e)
                            o[x][e] = fmaf(pv, vx[e], o[x][e]);
                    }
                }
            }
        }

        const int64_t chunk = key0 / FA_DECODE_CHUNK;
        if (t + 1 == ntiles || (key0 + T) % FA_DECODE_CHUNK == 0) { /* the chunk's last tile */
            __syncthreads(); /* every thread is done with this stage: it holds the key parts' o */
            const uint32_t red = sK; /* [KP·NG·kRpt rows][nchp·kEl] fp32, u = kp·NG + g */
            const int w = prm.nchp * kEl;
            if (c < prm.nch) {
#pragma unroll
                for (int x = 0; x < kRpt; ++x)
#pragma unroll
                    for (int e = 0; e < kEl; ++e)
                        *(float *)(smem + red + 4 * (uint32_t)((u * kRpt + x) * w + c * kEl + e)) =
                            o[x][e];
            }
            __syncthreads();
            const int64_t rec0 = ((b * p.Hk + hk) * prm.nc + chunk) * R;
            for (int x = tid; x < R * (int)D; x += kDecThreads) {
                const int r = x / (int)D, d = x % (int)D, xr = r % kRpt, gr = r / kRpt;
                float sum = 0.0f;
                for (int q = 0; q < KP; ++q) {
                    const int uu = (q << prm.log_ng) + gr;
                    sum += *(const float *)(smem + red + 4 * (uint32_t)((uu * kRpt + xr) * w + d));
                }
                prm.po[rec0 * D + x] = sum;
            }
#pragma unroll
            for (int x = 0; x < kDecMaxRows / 4; ++x) {
                const int r = warp + 4 * x;
                if (r < R && lane == 0) {
                    prm.ml[2 * (rec0 + r)] = m[x];
                    prm.ml[2 * (rec0 + r) + 1] = l[x];
                }
                m[x] = -INFINITY, l[x] = 0.0f;
            }
            fa_dec_zero(o);
        }
    }
}

/* One warp a row (b, h, i): the chunks that meet its band merged in chunk order. */
static __global__ void __launch_bounds__(kDecThreads)
    fa_decode_combine_kernel(const fa_dec_params prm) {
    const fa__problem &p = prm.p;
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (kDecThreads / 32) + (threadIdx.x >> 5);
    if (row >= p.B * p.H * prm.Sq)
        return;
    const int64_t b = row / (p.H * prm.Sq), h = row / prm.Sq % p.H, i = row % prm.Sq;
    const int64_t hk = h / prm.G, r = (h % prm.G) * prm.Sq + i, D = p.D;
    const int64_t sk = p.seqlens_k ? p.seqlens_k[b] : p.Sk, off = sk - prm.Sq;
    const int64_t lo = fa__key_lo(&p, i, off), hi = fa__key_hi(&p, i, off, sk);
    float o[FA_ROW_MAX_D / 32]; // o: [D / 32] columns lane + 32e
#pragma unroll
    for (int e = 0; e < FA_ROW_MAX_D / 32; ++e)
        o[e] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    if (hi > lo) {
        const int64_t ca = lo / FA_DECODE_CHUNK, cb = (hi - 1) / FA_DECODE_CHUNK + 1;
        const int64_t rec0 = (b * p.Hk + hk) * prm.nc * prm.R + r; /* chunk c: + c·R */
        for (int64_t ch = ca + lane; ch < cb; ch += 32)
            mx = fmaxf(mx, prm.ml[2 * (rec0 + ch * prm.R)]);
#pragma unroll
        for (int sh = 16; sh >= 1; sh >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
        for (int64_t ch = ca; ch < cb; ++ch) {
            const int64_t rec = rec0 + ch * prm.R;
            const float mc = prm.ml[2 * rec], lc = prm.ml[2 * rec + 1];
            if (mc == -INFINITY) /* l = 0 and o = 0: the chunk's keys weigh nothing */
                continue;
            const float f = exp2f(mc - mx); /* NaN at mc = mx = +inf, as the rule wants */
            l = fmaf(lc, f, l);
#pragma unroll
            for (int e = 0; e < FA_ROW_MAX_D / 32; ++e)
                if (lane + 32 * e < D)
                    o[e] = fmaf(prm.po[rec * D + lane + 32 * e], f, o[e]);
        }
    }
    /* l = 0: no key weighs anything, out = 0 and lse = -inf (the sink's, with one); l = NaN:
     * out and lse NaN */
    const bool none = l == 0.0f;
    double lse = none ? -INFINITY : ((double)mx + log2((double)l)) * FA_ROW_LN2;
    const double sink = fa__sink_of(&p, h);
    const float inv = sink != -INFINITY ? fa__sink_join(&lse, l, sink) : none ? 0.0f : 1.0f / l;
    const int64_t at = fa__row_at(&p.out, b, i, h);
#pragma unroll
    for (int e = 0; e < FA_ROW_MAX_D / 32; ++e)
        if (lane + 32 * e < D)
            fa__row_store(p.out.data, p.out.dtype, at + (lane + 32 * e) * p.out.sd,
                          none ? 0.0f : o[e] * inv);
    if (p.lse && lane == 0)
        p.lse[b * p.lse_sb + h * p.lse_sh + i * p.lse_ss] = (float)lse;
}

static int fa_dec_es(int32_t dt) { return dt == FA_DTYPE_F32 ? 4 : 2; }

/* Is x a K/V view the kernel's 16-byte copies read: unit stride, data, rows, heads and batches
 * (or pages) on 16-byte boundaries? */
static int fa_dec_view_ok(const fa__view *x, int es) {
    return x->sd == 1 && ((uintptr_t)x->data & 15) == 0 && (x->ss * es) % 16 == 0 &&
           (x->sh * es) % 16 == 0 && (x->sb * es) % 16 == 0 && (!x->block_table || x->page >= 1);
}

static int64_t fa_dec_chunks(int64_t max_sk) {
    return max_sk > 0 ? (max_sk - 1) / FA_DECODE_CHUNK + 1 : 0;
}

static int fa_dec_log2(int x) {
    int n = 0;
    while ((1 << n) < x)
        n++;
    return n;
}

/* The shared-memory layout of prm for pd (prm->R set): tiles of T keys, the largest power of two
 * from 128 down to 16 with T·D·sizeof(elem) <= kDecTileBytes whose layout fits smem bytes.
 * Returns the layout's bytes, 0 when none fits. */
static uint32_t fa_dec_layout(const fa__problem *pd, int smem, fa_dec_params *prm) {
    const int es = fa_dec_es(pd->k.dtype);
    prm->nch = (int)(pd->D * es / 16), prm->log_nchp = fa_dec_log2(prm->nch);
    prm->nchp = 1 << prm->log_nchp;
    const int rpt = 2 * es; /* the kernel's kRpt: 32 fp32 of o are kRpt rows of 16 / es */
    const int ng = (prm->R + rpt - 1) / rpt;
    prm->log_ng = fa_dec_log2(ng);
    prm->pitch = 16 * (prm->nch | 1); /* an odd count of 16-byte groups: no bank conflicts */
    int T = 128;
    while (T > 16 && T * pd->D * es > kDecTileBytes)
        T /= 2;
    for (;; T /= 2) {
        prm->T = T, prm->log_t = fa_dec_log2(T);
        uint32_t stage = 2u * T * prm->pitch;
        stage = stage > (uint32_t)kDecRedBytes ? (stage + 127) / 128 * 128 : (uint32_t)kDecRedBytes;
        prm->stage = stage;
        prm->q_at = 2 * stage;
        prm->s_at = prm->q_at + (uint32_t)(4 * prm->R * pd->D);
        prm->a_at = prm->s_at + 4u * prm->R * T;
        prm->slope_at = prm->a_at + 4 * kDecMaxRows;
        prm->band_at = prm->slope_at + 8 * kDecMaxRows;
        prm->offs_at = prm->band_at + 8 * kDecMaxRows;
        const uint32_t bytes = prm->offs_at + 32u * T;
        if (bytes <= (uint32_t)smem)
            return bytes;
        if (T == 16)
            return 0;
    }
}

int fa__decode_supported(const fa__problem *p, int smem) {
    const int32_t dt = p->k.dtype;
    if (dt != FA_DTYPE_F32 && dt != FA_DTYPE_F16 && dt != FA_DTYPE_BF16)
        return 0;
    if (p->v.dtype != dt || p->out.dtype != dt || (p->q.dtype != dt && p->q.dtype != FA_DTYPE_F32))
        return 0;
    if (p->cu_q || p->cu_k || p->dropout_p != 0.0f)
        return 0;
    const int es = fa_dec_es(dt);
    if (p->D < 1 || p->D > FA_ROW_MAX_D || (p->D * es) % 16 != 0 || p->Dv != p->D)
        return 0;
    if (p->Hk < 1 || p->H < 1 || p->H % p->Hk != 0 || p->Sq < 1 ||
        (p->H / p->Hk) * p->Sq > kDecMaxRows)
        return 0;
    if (!fa_dec_view_ok(&p->k, es) || !fa_dec_view_ok(&p->v, es))
        return 0;
    fa_dec_params prm; /* its tiles fit the device's shared memory (64 KB a block on sm_75) */
    prm.R = (int)(p->H / p->Hk * p->Sq);
    if (fa_dec_layout(p, smem, &prm) == 0)
        return 0;
    /* keys in int32 (seqlens_k are); the grids: B·Hk CTAs a split, B·H·Sq / 4 combine blocks */
    return p->Sk <= INT32_MAX - FA_DECODE_CHUNK && p->B <= INT32_MAX / p->H &&
           p->B * p->H * p->Sq <= INT32_MAX;
}

int fa__decode_splits(const fa__problem *p, int64_t max_sk, int num_splits, int sms) {
    const int64_t nc = fa_dec_chunks(max_sk), groups = p->B * p->Hk;
    if (nc == 0 || groups == 0)
        return 1;
    /* 0: about 4 CTAs an SM (3 fit on an H100 at D = 128, bf16, R = 4: 73 KB of shared
     * memory and 127 registers a thread), at most one split a chunk */
    int64_t s =
        num_splits > 0 ? num_splits : (4 * (int64_t)(sms > 0 ? sms : 1) + groups - 1) / groups;
    if (s > nc)
        s = nc;
    if (s > INT32_MAX / groups)
        s = INT32_MAX / groups;
    return s < 1 ? 1 : (int)s;
}

size_t fa__decode_scratch_bytes(const fa__problem *p, int64_t max_sk) {
    const int64_t recs = p->B * p->Hk * fa_dec_chunks(max_sk) * (p->H / p->Hk) * p->Sq;
    return (size_t)recs * (size_t)(8 + 4 * p->D) + 16;
}

template <int kDt>
static cudaError_t fa_dec_launch(const fa_dec_params &prm, int64_t blocks, uint32_t smem_bytes,
                                 cudaStream_t stream) {
    if (smem_bytes > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(
            fa_decode_kernel<kDt>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
        if (err != cudaSuccess)
            return err;
    }
    fa_decode_kernel<kDt><<<(unsigned)blocks, kDecThreads, smem_bytes, stream>>>(prm);
    return cudaGetLastError();
}

cudaError_t fa__decode_forward(const fa__problem *pd, int64_t max_sk, int splits, void *scratch,
                               int smem, cudaStream_t stream) {
    const int64_t rows = pd->B * pd->H * pd->Sq, nc = fa_dec_chunks(max_sk);
    if (rows == 0)
        return cudaSuccess;
    fa_dec_params prm;
    prm.p = *pd;
    prm.G = (int)(pd->H / pd->Hk), prm.Sq = (int)pd->Sq, prm.R = prm.G * prm.Sq;
    const int64_t most = nc < INT32_MAX / (pd->B * pd->Hk) ? nc : INT32_MAX / (pd->B * pd->Hk);
    prm.splits = splits < 1 ? 1 : splits > most ? (int)(most > 0 ? most : 1) : splits;
    prm.nc = nc;
    const uint32_t smem_bytes = fa_dec_layout(pd, smem, &prm);
    if (smem_bytes == 0) /* fa__decode_supported said no */
        return cudaErrorInvalidValue;
    prm.qscale = pd->softcap > 0.0f ? pd->scale / pd->softcap : pd->scale * FA_ROW_LOG2E;
    prm.softcap_l2 = pd->softcap > 0.0f ? pd->softcap * FA_ROW_LOG2E : 0.0f;
    prm.ml = (float *)scratch;
    prm.po =
        (float *)(((uintptr_t)(prm.ml + 2 * pd->B * pd->Hk * nc * prm.R) + 15) & ~(uintptr_t)15);

    if (nc > 0) {
        const int64_t blocks = pd->B * pd->Hk * prm.splits;
        cudaError_t err = cudaSuccess;
        if (pd->k.dtype == FA_DTYPE_F32)
            err = fa_dec_launch<FA_DTYPE_F32>(prm, blocks, smem_bytes, stream);
        else if (pd->k.dtype == FA_DTYPE_F16)
            err = fa_dec_launch<FA_DTYPE_F16>(prm, blocks, smem_bytes, stream);
        else
            err = fa_dec_launch<FA_DTYPE_BF16>(prm, blocks, smem_bytes, stream);
        if (err != cudaSuccess)
            return err;
    }
    const int64_t per = kDecThreads / 32;
    fa_decode_combine_kernel<<<(unsigned)((rows + per - 1) / per), kDecThreads, 0, stream>>>(prm);
    return cudaGetLastError();
}
