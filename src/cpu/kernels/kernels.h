/* SPDX-License-Identifier: MIT */
/*
 * kernels.h — the CPU microkernel contract. A kernel set works on fp32 tiles already in cache;
 * it knows nothing of masks, batches, heads or dtypes (the blocking layer in fwd.c does). One
 * set per ISA, each in its own folder and built with its own flags; dispatch.c picks one.
 */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>

/* Rows to bring into cache while a decode product runs: rows[0..n), `bytes` bytes each; rows
 * NULL: the n rows lie back to back from base (fa__prefetch_row). */
typedef struct fa__prefetch {
    const void *const *rows;
    int n, bytes;
    const char *base;
} fa__prefetch;

/* Row r (< pf->n) of pf. */
static inline const char *fa__prefetch_row(const fa__prefetch *pf, int r) {
    return pf->rows ? (const char *)pf->rows[r] : pf->base + (int64_t)r * pf->bytes;
}

typedef struct fa__cpu_kernels {
    const char *name; /* "ref", "avx2", ... as accepted by FA_CPU_ISA */

    /* S = Q Kᵀ.  Q: [m, d] (row stride ldq), Kt: [d, n] (K packed transposed, row stride ldk),
     * S: [m, n] (row stride lds). */
    void (*qk)(int m, int n, int d, const float *q, int64_t ldq, const float *kt, int64_t ldk,
               float *s, int64_t lds);

    /* O = diag(alpha) O + P V.  P: [m, n] (ldp), V: [n, d] (ldv), alpha: [m], O: [m, d] (ldo).
     * P V is summed on its own before it is added, so a long sum over many calls (keys) keeps
     * its rounding error to about (n + calls) ulps instead of growing with every key. */
    void (*pv)(int m, int n, int d, const float *p, int64_t ldp, const float *v, int64_t ldv,
               const float *alpha, float *o, int64_t ldo);

    /* pv with P given transposed: O = diag(alpha) O + Pᵀ V.  Pt: [n, m] (ldp), V: [n, d] (ldv),
     * O: [m, d] (ldo); the same sums as pv on the transpose of Pt, bit for bit. NULL where a set
     * has none (callers transpose into a buffer and call pv then). */
    void (*pv_t)(int m, int n, int d, const float *pt, int64_t ldp, const float *v, int64_t ldv,
                 const float *alpha, float *o, int64_t ldo);

    /* Rows of the products' register tile (qk, pv and the bf16 ones): calls of a multiple of
     * it run every row in whole tiles, where a remainder goes through smaller, slower ones. */
    int gemm_rows;

    /* Nonzero when pv runs markedly slower on right-operand rows that lie 4 KiB apart (BSHD V
     * or K rows, read in place): they set-conflict in L1. Callers then copy such rows into a
     * contiguous block first. */
    int pv_packed_b;

    /* dst[t] = scale · src[t] for n contiguous elements of dtype f32, f16 or bf16, or of an
     * 8-bit cache (i8, f8_e4m3, f8_e5m2: the stored value times scale). */
    void (*to_f32)(int n, const void *src, int32_t dtype, float scale, float *dst);
    /* The way back: dst[t] = dtype(scale · src[t]) for n contiguous elements of dtype f32, f16
     * or bf16, rounded to nearest even as convert.h rounds (NaN payloads may differ). */
    void (*from_f32)(int n, const float *src, float scale, int32_t dtype, void *dst);

    /* Decode products on K/V rows read in place (no packing), for m <= 64 query rows; NULL
     * where a set has none (the packed products above serve then). Rows are given by pointers
     * (any dtype: f32, f16, bf16, or an 8-bit cache's stored values, before their scale, which
     * the caller applies to S and P; converted in registers), so paged caches need no copy.
     *   qk_rows: S[i, j] = Q[i] · K[j].  Q: [m, d] fp32 (ldq), S: [m, n] (lds).
     *   pv_rows: O = diag(alpha) O + P V.  P: [m, n] (ldp), O: [m, d] (ldo).
     * pf: rows the caller reads next (NULL or pf->n == 0: none), the call's share of the next
     * group of keys' rows (every head's) in memory order, a group ahead (32 KiB for fp32, 32-64
     * KiB for fp16/bf16 in decode's shape); each product spreads their prefetches over its
     * loads, a few lines at a time, so they do not queue up in a burst (on Zen 5 the cache then
     * reads near its front-to-back rate; neon: not measured). A contiguous cache's share comes
     * as a base (pf->rows NULL). */
    void (*qk_rows)(int m, int n, int d, const float *q, int64_t ldq, const void *const *k,
                    int32_t dtype, float *s, int64_t lds, const fa__prefetch *pf);
    void (*pv_rows)(int m, int n, int d, const float *p, int64_t ldp, const void *const *v,
                    int32_t dtype, const float *alpha, float *o, int64_t ldo,
                    const fa__prefetch *pf);
    /* Keys per decode call of qk_rows, then of pv_rows, on fp16/bf16 rows (1..64; fp32 rows go 8
     * at a time): longer calls save per-call work (row pointers, prefetch loops, pv's accumulator
     * loads and stores) where decode is bound by the cores; shorter ones read the cache in
     * smaller groups, head by head, and ask less far ahead, where it is bound by the reads
     * (Zen 3: 32, Zen 5: 16). */
    int decode_keys_half[2];
    /* Most query rows per KV head (g·Sq, 1..64) that take the decode products on fp32 rows:
     * beyond, the prefill's packed products are faster (AVX2 on Zen 4: 32; AVX-512 on
     * Zen 4: 64; bench/results/2026-12-05-decode-f32-rows.md). */
    int decode_rows_f32;

    /* Dst = Srcᵀ.  Src: [n, d] (row stride lds), Dst: [d, n] (row stride ldd). Packs K as Kᵀ. */
    void (*transpose)(int n, int d, const float *src, int64_t lds, float *dst, int64_t ldd);

    /* bf16 products, NULL where the CPU has no bf16 dot product. Operands hold bf16 pairs along
     * the reduction dimension in 32-bit words (an odd tail padded with a bf16 zero):
     *   qk_bf16: S = scale · Q Kᵀ.  Q: [m, d2] pairs (ldq), K packed as [d2, n] pairs (ldk),
     *            S: [m, n] fp32 (lds).
     *   pv_bf16: O = diag(alpha) O + P V.  P: [m, n2] pairs (ldp), V: [n2, d] pairs (ldv).
     *   pv_bf16_t: pv_bf16 with P given as [n2, m] pairs (ldp): word (t, i) holds P[i, 2t] and
     *            P[i, 2t + 1]. */
    void (*qk_bf16)(int m, int n, int d2, const uint32_t *q, int64_t ldq, const uint32_t *k,
                    int64_t ldk, float scale, float *s, int64_t lds);
    void (*pv_bf16)(int m, int n2, int d, const uint32_t *p, int64_t ldp, const uint32_t *v,
                    int64_t ldv, const float *alpha, float *o, int64_t ldo);
    void (*pv_bf16_t)(int m, int n2, int d, const uint32_t *pt, int64_t ldp, const uint32_t *v,
                      int64_t ldv, const float *alpha, float *o, int64_t ldo);
    /* Decode's qk_rows on bf16 Q and K rows: S = scale · Q Kᵀ.  Q: [m, d2] pairs (ldq), k: n row
     * pointers of d2 pairs each (a bf16 row of even length as it is), S: [m, n] (lds), pf as
     * qk_rows's. */
    void (*qk_rows_bf16)(int m, int n, int d2, const uint32_t *q, int64_t ldq,
                         const void *const *k, float scale, float *s, int64_t lds,
                         const fa__prefetch *pf);
    /* Decode's pv_rows with P as bf16 pairs: O = diag(alpha) O + P V.  P: [m, ceil(n/2)] pairs
     * (ldp), v: n bf16 row pointers of d values, m a multiple of 4, pf as pv_rows's. */
    void (*pv_rows_bf16)(int m, int n, int d, const uint32_t *p, int64_t ldp,
                         const void *const *v, const float *alpha, float *o, int64_t ldo,
                         const fa__prefetch *pf);
    /* y = bf16(x), round to nearest even; an odd n also writes y[n] = 0. */
    void (*to_bf16)(int n, const float *x, uint16_t *y);
    /* dst[t] = a[t] | b[t] << 16: two rows of bf16 as pairs (packs V for pv_bf16). */
    void (*interleave_bf16)(int n, const uint16_t *a, const uint16_t *b, uint32_t *dst);
    /* dst[t] = bf16(a[t]) | bf16(b[t]) << 16, rounded as to_bf16: two fp32 rows as pairs. */
    void (*pair_bf16)(int n, const float *a, const float *b, uint32_t *dst);

    /* The bf16 backward's step on rows (r, r + 1) of a tile, n keys each: P = 2^(S - lse) (as
     * exp2_sum) and dS = P∘(dP - Δ), both rounded to bf16 as to_bf16 rounds; ds2[k] gets row
     * k's dS (n bf16, a zero after an odd n), px and dsx the two rows' P and dS as pairs (as
     * pair_bf16 writes them). s, dp: the rows' scores and dP (s[k] NULL: row k is outside the
     * tile's rows and counts as 0); lse, dlt: [2]; ds2[k], px, dsx NULL: not written. NULL where
     * a set has none (the separate steps serve then). */
    void (*bwd_pair_bf16)(int n, const float *const s[2], const float *const dp[2],
                          const float lse[2], const float dlt[2], uint16_t *const ds2[2],
                          uint32_t *px, uint32_t *dsx);

    /* x[i] = 2^(x[i] - m) in place, returning the sum. x[i] = -INFINITY or m = +INFINITY gives
     * 0; x[i] - m NaN (a NaN operand, or +INFINITY - +INFINITY) gives NaN, never a number (the
     * non-finite rule, docs/semantics.md); x[i] - m <= 0 is all the callers need. */
    float (*exp2_sum)(int n, float *x, float m);

    /* The online softmax's step on rows of scores, rows x[r·ldx + 0..n), r < rows: per row
     * m[r] = max(m[r], max of its scores), then its scores x[t] = 2^(x[t] - mu) in place, mu
     * being the new m[r], or 0 while that is -INFINITY (a row that sees no key yet: P = 0;
     * fa__softmax_mu); sum[r] = the sum of the row's new values. A row with a NaN or +INFINITY
     * score (or a NaN m[r]) gets a NaN sum and m[r] = NaN (fa__softmax_nan): the max
     * instructions may drop a NaN operand, the exp2 of a NaN (or of inf - inf) never does. */
    void (*softmax_rows)(int rows, int n, float *x, int64_t ldx, float *m, float *sum);
} fa__cpu_kernels;

/* The rows [0, m) of a product in AVX-512's tiles: RUN(MR) runs the tile of MR rows at row i and
 * adds MR to i (which starts at 0). m = 9a + 8e (every m >= 56) runs as a tiles of 9 rows and
 * e of 8, so no call ends on a 4-, 2- or 1-row tile, which keep too few accumulators to fill both
 * FMA pipes (a 2-row tile runs at about half the rate); smaller m as 9-row tiles and the last
 * m % 9 rows as 8 + 4 + 2 + 1. */
#define FA_TILES_9(m, i, RUN)                                                                      \
    do {                                                                                           \
        const int eights_ = (m) % 9 * 8 % 9; /* 8·eights_ = m (mod 9) */                          \
        if (8 * eights_ <= (m)) {                                                                  \
            while ((i) < (m) - 8 * eights_) { RUN(9); }                                            \
            while ((i) < (m)) { RUN(8); }                                                          \
            break;                                                                                 \
        }                                                                                          \
        while ((i) + 9 <= (m)) { RUN(9); }                                                         \
        if ((m) - (i) >= 8) { RUN(8); }                                                            \
        if ((m) - (i) >= 4) { RUN(4); }                                                            \
        if ((m) - (i) >= 2) { RUN(2); }                                                            \
        if ((m) - (i) >= 1) { RUN(1); }                                                            \
    } while (0)

/* softmax_rows' mu: *m becomes max(*m, mx), the row's max so far; mu is that, or 0 while it is
 * -INFINITY. A NaN *m stays NaN (mx > NaN is false), so mu is NaN and so is every 2^(x - mu). */
static inline float fa__softmax_mu(float *m, float mx) {
    if (mx > *m) *m = mx;
    return *m == -INFINITY ? 0.0f : *m;
}

/* softmax_rows' last step on a row: a NaN sum (a NaN or +INFINITY score, or a NaN max before)
 * makes the row's max *m NaN, which a max that dropped the NaN did not. Returns sum. */
static inline float fa__softmax_nan(float *m, float sum) {
    if (isnan(sum)) *m = NAN;
    return sum;
}

/* softmax_rows by two passes over each row: a set's row max, then its exp2_sum. */
static inline void fa__softmax_rows_2pass(int rows, int n, float *x, int64_t ldx, float *m,
                                          float *sum, float (*row_max)(int, const float *),
                                          float (*exp2_sum)(int, float *, float)) {
    for (int r = 0; r < rows; r++)
        sum[r] = fa__softmax_nan(
            m + r, exp2_sum(n, x + r * ldx, fa__softmax_mu(m + r, row_max(n, x + r * ldx))));
}

/* Runs CALL with FA_DT bound to dtype (f32, f16 or bf16) as a compile-time constant: a kernel
 * written for one dtype then inlines once per dtype and picks its conversion outside its loops. */
#define FA_BY_DTYPE(dtype, CALL)                                                                   \
    do {                                                                                           \
        if ((dtype) == FA_DTYPE_F32) {                                                             \
            enum { FA_DT = FA_DTYPE_F32 };                                                         \
            CALL;                                                                                  \
        } else if ((dtype) == FA_DTYPE_F16) {                                                      \
            enum { FA_DT = FA_DTYPE_F16 };                                                         \
            CALL;                                                                                  \
        } else {                                                                                   \
            enum { FA_DT = FA_DTYPE_BF16 };                                                        \
            CALL;                                                                                  \
        }                                                                                          \
    } while (0)

/* FA_BY_DTYPE for the decode products (qk_rows, pv_rows), whose rows may also be an 8-bit
 * cache's: i8, f8_e4m3 or f8_e5m2 (FA_DT then one of those). */
#define FA_BY_ROW_DTYPE(dtype, CALL)                                                               \
    do {                                                                                           \
        if ((dtype) == FA_DTYPE_I8) {                                                              \
            enum { FA_DT = FA_DTYPE_I8 };                                                          \
            CALL;                                                                                  \
        } else if ((dtype) == FA_DTYPE_F8_E4M3) {                                                  \
            enum { FA_DT = FA_DTYPE_F8_E4M3 };                                                     \
            CALL;                                                                                  \
        } else if ((dtype) == FA_DTYPE_F8_E5M2) {                                                  \
            enum { FA_DT = FA_DTYPE_F8_E5M2 };                                                     \
            CALL;                                                                                  \
        } else {                                                                                   \
            FA_BY_DTYPE(dtype, CALL);                                                              \
        }                                                                                          \
    } while (0)

extern const fa__cpu_kernels fa__cpu_kernels_ref;
/* ref with portable bf16 products (refbf16/refbf16.c): every build, only by FA_CPU_ISA */
extern const fa__cpu_kernels fa__cpu_kernels_refbf16;

/* The ref set's entries, which the refbf16 set shares (ref/ref.c). */
void fa__qk_ref(int m, int n, int d, const float *q, int64_t ldq, const float *kt, int64_t ldk,
                float *s, int64_t lds);
void fa__pv_ref(int m, int n, int d, const float *p, int64_t ldp, const float *v, int64_t ldv,
                const float *alpha, float *o, int64_t ldo);
void fa__to_f32_ref(int n, const void *src, int32_t dtype, float scale, float *dst);
void fa__from_f32_ref(int n, const float *src, float scale, int32_t dtype, void *dst);
void fa__transpose_ref(int n, int d, const float *src, int64_t lds, float *dst, int64_t ldd);
float fa__exp2_sum_ref(int n, float *x, float m);
void fa__softmax_rows_ref(int rows, int n, float *x, int64_t ldx, float *m, float *sum);
extern const fa__cpu_kernels fa__cpu_kernels_avx2;   /* FA_HAVE_AVX2 builds */
extern const fa__cpu_kernels fa__cpu_kernels_avx512; /* FA_HAVE_AVX512 builds */
extern const fa__cpu_kernels fa__cpu_kernels_neon;   /* FA_HAVE_NEON builds (AArch64) */

/* The AVX512_BF16 entries of the avx512 set (avx512bf16/bf16.c); dispatch.c fits them in only on
 * CPUs that have the instructions. */
void fa__qk_bf16_avx512(int m, int n, int d2, const uint32_t *q, int64_t ldq, const uint32_t *k,
                        int64_t ldk, float scale, float *s, int64_t lds);
void fa__pv_bf16_avx512(int m, int n2, int d, const uint32_t *p, int64_t ldp, const uint32_t *v,
                        int64_t ldv, const float *alpha, float *o, int64_t ldo);
void fa__pv_bf16_t_avx512(int m, int n2, int d, const uint32_t *pt, int64_t ldp, const uint32_t *v,
                          int64_t ldv, const float *alpha, float *o, int64_t ldo);
void fa__to_bf16_avx512(int n, const float *x, uint16_t *y);
void fa__interleave_bf16_avx512(int n, const uint16_t *a, const uint16_t *b, uint32_t *dst);
void fa__pair_bf16_avx512(int n, const float *a, const float *b, uint32_t *dst);
void fa__bwd_pair_bf16_avx512(int n, const float *const s[2], const float *const dp[2],
                              const float lse[2], const float dlt[2], uint16_t *const ds2[2],
                              uint32_t *px, uint32_t *dsx);
void fa__qk_rows_bf16_avx512(int m, int n, int d2, const uint32_t *q, int64_t ldq,
                             const void *const *k, float scale, float *s, int64_t lds,
                             const fa__prefetch *pf);
void fa__pv_rows_bf16_avx512(int m, int n, int d, const uint32_t *p, int64_t ldp,
                             const void *const *v, const float *alpha, float *o, int64_t ldo,
                             const fa__prefetch *pf);

/* The avx512 set's decode products (and their bf16 variants) asking into L2 (prefetcht1) where
 * the set's own ask into L1 (prefetcht0); dispatch.c fits them in where the CPU reads best so
 * (features.h: asks_l2). The AVX2 and NEON products always ask into L2. */
void fa__qk_rows_l2_avx512(int m, int n, int d, const float *q, int64_t ldq, const void *const *k,
                           int32_t dtype, float *s, int64_t lds, const fa__prefetch *pf);
void fa__pv_rows_l2_avx512(int m, int n, int d, const float *p, int64_t ldp, const void *const *v,
                           int32_t dtype, const float *alpha, float *o, int64_t ldo,
                           const fa__prefetch *pf);
void fa__qk_rows_bf16_l2_avx512(int m, int n, int d2, const uint32_t *q, int64_t ldq,
                                const void *const *k, float scale, float *s, int64_t lds,
                                const fa__prefetch *pf);
void fa__pv_rows_bf16_l2_avx512(int m, int n, int d, const uint32_t *p, int64_t ldp,
                                const void *const *v, const float *alpha, float *o, int64_t ldo,
                                const fa__prefetch *pf);

#endif /* FA_CPU_KERNELS_H */
