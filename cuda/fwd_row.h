/* SPDX-License-Identifier: MIT */
/*
 * fwd_row.h — the forward pass one query row at a time, written in the common subset of C11 and
 * CUDA C++. It is the body of the stage-1 CUDA kernels (fwd_simple.cu runs one task per thread)
 * and, compiled as C, what tests/test_cuda_row.c runs on the CPU: the GPU's arithmetic is
 * checked against the fp64 reference and the CPU backend without a GPU.
 *
 * K and V rows are addressed through a KV cache's indirections (fa__view_at) and a cache's
 * lengths are seqlens_k, so the same row serves fa_forward_kvcache.
 *
 * Row i of query head h in batch b (Sq_b queries, Sk_b keys, off = Sk_b - Sq_b), in fp32, with
 * q and k rows of D elements, v and out rows of Dv (D or not):
 *   q' = q * qscale   (scores come out in the exp2 domain, or as the softcap's tanh argument)
 *   for each key j of the row's causal/window band [lo, hi):
 *     s = q'.k_j
 *     softcap: s = c * log2(e) * tanh(s)
 *     ALiBi (in fp64): s -= slope * log2(e) * |i + off - j|
 *     online softmax: a new maximum m scales l and o by 2^(m_old - m)
 *     p = 2^(s - m) (0 at s = -inf);  l += p;  o += drop(p) * v_j
 *                                          (drop: p / (1 - dropout_p) if kept, else 0)
 *   out = o / l,  lse = (m + log2 l) * ln 2;  l = 0 (no visible key, or every score -inf):
 *   out = 0, lse = -inf.
 *   A sink s_h (p->sinks, finite) joins the row after the key loop (fa__sink_join), in fp64 as
 *   src/cpu/fwd.c's write_row: lse = logaddexp(L, s_h) with L the keys' lse, out = o / l ·
 *   exp(L - lse); l = 0: out = 0, lse = s_h.
 * Non-finite scores (docs/semantics.md): a NaN is never a maximum, but its p = 2^NaN is NaN, and
 * a +Inf score becomes m, with p = 2^(inf - inf) = NaN; either makes l, o, out and lse NaN.
 * This is the arithmetic of src/cpu/fwd.c (fa__score_scales, fa__score_epilogue, the band of
 * fa__key_lo/fa__key_hi, the dropout mask of philox.h), one key at a time instead of in blocks.
 *
 * Tasks (one GPU thread each; the host computes the counts from its copy of cu_q):
 *   forward   t in [0, rows·H): head h = t / rows, row r = t % rows, where rows = B·Sq, or for
 *             varlen the rows of all sequences, cu_q[B] - cu_q[0]. Neighbouring threads take
 *             neighbouring rows of one head, so a warp reads the same keys.
 *   clear     varlen only: out = 0, lse = -inf for the rows outside every sequence, [0, cu_q[0])
 *             and [cu_q[B], total_q), times H heads.
 *   mask      the dropout mask, four columns (one Philox draw) per task.
 */
#ifndef FA_CUDA_FWD_ROW_H
#define FA_CUDA_FWD_ROW_H

#include "convert.h"
#include "flashattn.h"
#include "hd.h"
#include "philox.h"
#include "problem.h"

#include <math.h>
#include <stdint.h>

#define FA_ROW_MAX_D 256 /* FA_MAX_HEAD_DIM */
#define FA_ROW_LOG2E 1.4426950408889634f
#define FA_ROW_LN2 0.69314718055994531

/* Offset in elements of element (b, s, h, 0) of a view without KV-cache indirections. */
FA_HD int64_t fa__row_at(const fa__view *x, int64_t b, int64_t s, int64_t h) {
    return b * x->sb + s * x->ss + h * x->sh;
}

/* Word `lane` (0..3) of a Philox draw, without indexing (which would put it in local memory). */
FA_HD uint32_t fa__row_word(fa__philox4 w, int64_t lane) {
    return lane == 0 ? w.v[0] : lane == 1 ? w.v[1] : lane == 2 ? w.v[2] : w.v[3];
}

/* The sink of query head h, -inf for none. */
FA_HD double fa__sink_of(const fa__problem *p, int64_t h) {
    return p->sinks ? (double)p->sinks[h * p->sinks_sh] : -INFINITY;
}

/* Joins a finite sink to a row whose keys' lse is *lse (-inf at l = 0, or NaN) and whose
 * softmax sum is l: *lse becomes logaddexp(*lse, sink) and the result is the factor out = o ·
 * factor, exp(L - lse) / l in fp64 rounded once (0 at l = 0, where out = 0 and lse = sink). */
FA_HD float fa__sink_join(double *lse, float l, double sink) {
    const double keys = *lse;
    if (l == 0.0f) {
        *lse = sink;
        return 0.0f;
    }
    *lse = fmax(keys, sink) + log1p(exp(-fabs(keys - sink))); /* NaN keys: NaN */
    return (float)(exp(keys - *lse) / (double)l);
}

/* Out row i of query head h in batch b, and its lse when p->lse is set. cu_q/cu_k: the varlen
 * offsets, readable where this runs (device copies on the GPU); NULL for fixed length. */
FA_HD void fa__fwd_row(const fa__problem *p, const int32_t *cu_q, const int32_t *cu_k, int64_t b,
                       int64_t h, int64_t i) {
    const int64_t D = p->D, Dv = p->Dv, hk = h / (p->H / p->Hk);
    const int64_t rq = cu_q ? cu_q[b] : 0, rk = cu_k ? cu_k[b] : 0;
    const int64_t sq = cu_q ? cu_q[b + 1] - rq : p->Sq;
    const int64_t sk = p->seqlens_k ? p->seqlens_k[b] : cu_k ? cu_k[b + 1] - rk : p->Sk;
    const int64_t off = sk - sq;
    /* as fa__score_scales */
    const float qscale = p->softcap > 0.0f ? p->scale / p->softcap : p->scale * FA_ROW_LOG2E;
    const float softcap_l2 = p->softcap > 0.0f ? p->softcap * FA_ROW_LOG2E : 0.0f;
    /* In fp64 like fa__score_epilogue: in fp32 the rounding of slope·log2(e) tilts long rows. */
    const double slope =
        p->alibi ? p->alibi[b * p->alibi_sb + h * p->alibi_sh] * 1.4426950408889634 : 0.0;
    const int64_t lo = fa__key_lo(p, i, off), hi = fa__key_hi(p, i, off, sk); /* visible keys */

    float q[FA_ROW_MAX_D], o[FA_ROW_MAX_D]; // q: [D], o: [Dv]
    const int64_t q_at = fa__row_at(&p->q, b, rq + i, h);
    for (int64_t d = 0; d < D; d++)
        q[d] = fa__row_load(p->q.data, p->q.dtype, q_at + d * p->q.sd) * qscale;
    for (int64_t d = 0; d < Dv; d++)
        o[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    fa__philox4 words = {{0u, 0u, 0u, 0u}}; /* the draw for columns 4·words_of .. 4·words_of+3 */
    int64_t words_of = -1;
    for (int64_t j = lo; j < hi; j++) {
        const int64_t k_at = fa__view_at(&p->k, b, rk + j, hk);
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++)
            s += q[d] * fa__row_load(p->k.data, p->k.dtype, k_at + d * p->k.sd);
        if (softcap_l2 != 0.0f)
            s = softcap_l2 * tanhf(s);
        if (p->alibi)
            s = (float)((double)s - slope * fabs((double)(i + off - j)));
        if (s > m) { /* a new maximum (the first finite score scales l = 0 and o = 0 by 0) */
            const float alpha = exp2f(m - s);
            l *= alpha;
            for (int64_t d = 0; d < Dv; d++)
                o[d] *= alpha;
            m = s;
        }
        /* weight 0 at s = -inf, also while m = -inf (where 2^(s - m) would be NaN) */
        const float e = s == -INFINITY ? 0.0f : exp2f(s - m);
        l += e; /* l is the sum before dropout, as lse ignores dropout */
        float w = e;
        if (p->dropout_p != 0.0f) {
            if (j >> 2 != words_of) {
                words_of = j >> 2;
                words =
                    fa__dropout_words(p->dropout_seed, p->dropout_offset, (uint32_t)(b * p->H + h),
                                      (uint32_t)i, (uint32_t)words_of);
            }
            w = fa__row_word(words, j & 3) >= p->dropout_threshold ? e * p->dropout_scale : 0.0f;
        }
        const int64_t v_at = fa__view_at(&p->v, b, rk + j, hk);
        for (int64_t d = 0; d < Dv; d++)
            o[d] += w * fa__row_load(p->v.data, p->v.dtype, v_at + d * p->v.sd);
    }

    /* l = 0: no key weighs anything, out = 0 (also where o is 0 times a non-finite v); l = NaN:
     * out and lse NaN */
    const int none = l == 0.0f;
    double lse = none ? -INFINITY : ((double)m + log2((double)l)) * FA_ROW_LN2;
    const double sink = fa__sink_of(p, h);
    const float inv = sink != -INFINITY ? fa__sink_join(&lse, l, sink) : none ? 0.0f : 1.0f / l;
    const int64_t out_at = fa__row_at(&p->out, b, rq + i, h);
    for (int64_t d = 0; d < Dv; d++)
        fa__row_store(p->out.data, p->out.dtype, out_at + d * p->out.sd, none ? 0.0f : o[d] * inv);
    if (p->lse)
        p->lse[b * p->lse_sb + h * p->lse_sh + (rq + i) * p->lse_ss] = (float)lse;
}

/* Host side: the rows a forward covers (reads the host copy of cu_q). */
static inline int64_t fa__fwd_rows(const fa__problem *p) {
    return p->cu_q ? (int64_t)p->cu_q[p->B] - p->cu_q[0] : p->B * p->Sq;
}

/* The sequence holding packed row r, cu[0] <= r < cu[B]: the last b with cu[b] <= r, so empty
 * sequences (cu[b] == cu[b + 1]) are passed over. */
FA_HD int64_t fa__row_batch(const int32_t *cu, int64_t B, int64_t r) {
    int64_t lo = 0, hi = B; /* cu[lo] <= r < cu[hi] */
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cu[mid] <= r)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Forward task t, 0 <= t < rows·H with rows = fa__fwd_rows(p). */
FA_HD void fa__fwd_task(const fa__problem *p, const int32_t *cu_q, const int32_t *cu_k,
                        int64_t rows, int64_t t) {
    const int64_t h = t / rows, r = t % rows;
    if (cu_q) {
        const int64_t row = cu_q[0] + r, b = fa__row_batch(cu_q, p->B, row);
        fa__fwd_row(p, cu_q, cu_k, b, h, row - cu_q[b]);
    } else {
        fa__fwd_row(p, NULL, NULL, r / p->Sq, h, r % p->Sq);
    }
}

/* Host side: the clear tasks of a varlen problem, (cu_q[0] + total_q - cu_q[B])·H; 0 for fixed
 * length. */
static inline int64_t fa__clear_tasks(const fa__problem *p) {
    return p->cu_q ? ((int64_t)p->cu_q[0] + p->total_q - p->cu_q[p->B]) * p->H : 0;
}

/* Clear task t: head t % H of the (t / H)-th row outside every sequence; head_end = cu_q[0],
 * tail_begin = cu_q[B]. */
FA_HD void fa__clear_task(const fa__problem *p, int64_t head_end, int64_t tail_begin, int64_t t) {
    const int64_t h = t % p->H, n = t / p->H;
    const int64_t row = n < head_end ? n : tail_begin + (n - head_end);
    const int64_t at = fa__row_at(&p->out, 0, row, h);
    for (int64_t d = 0; d < p->Dv; d++)
        fa__row_store(p->out.data, p->out.dtype, at + d * p->out.sd, 0.0f);
    if (p->lse)
        p->lse[h * p->lse_sh + row * p->lse_ss] = -INFINITY;
}

/* Host side: the dropout-mask tasks, B·H·Sq·ceil(Sk / 4). */
static inline int64_t fa__mask_tasks(const fa__problem *p) {
    return p->B * p->H * p->Sq * ((p->Sk + 3) / 4);
}

/* Mask task t: columns 4·jq .. 4·jq+3 of row i of (b, h), t = ((b·H + h)·Sq + i)·ceil(Sk/4) + jq.
 * The mask is p->out (u8, 1 = keep), element (b, h, i, j) at b·sb + h·sh + i·ss + j·sd, as
 * fa_dropout_mask writes it. */
FA_HD void fa__mask_task(const fa__problem *p, int64_t t) {
    const int64_t nq = (p->Sk + 3) / 4, jq = t % nq, i = t / nq % p->Sq, bh = t / nq / p->Sq;
    const int64_t b = bh / p->H, h = bh % p->H;
    const fa__philox4 w = fa__dropout_words(p->dropout_seed, p->dropout_offset, (uint32_t)bh,
                                            (uint32_t)i, (uint32_t)jq);
    uint8_t *row = (uint8_t *)p->out.data + b * p->out.sb + h * p->out.sh + i * p->out.ss;
    for (int64_t lane = 0; lane < 4 && 4 * jq + lane < p->Sk; lane++)
        row[(4 * jq + lane) * p->out.sd] = fa__row_word(w, lane) >= p->dropout_threshold;
}

#endif /* FA_CUDA_FWD_ROW_H */
