/* SPDX-License-Identifier: MIT */
/*
 * bwd_row.h — the backward pass one row at a time, in the common subset of C11 and CUDA C++:
 * the body of the stage-1 CUDA backward kernels (bwd_simple.cu runs one task per thread), the
 * oracle for the tensor-core backward and the fallback for everything it does not take (fp32,
 * head dims that are not multiples of 8, dropout, strided rows).
 *
 * With P = 2^(s - lse2) recomputed from the forward's lse (s: the score of fwd_row.h in the
 * exp2 domain, softcap and ALiBi applied; lse2 = lse·log2(e)), M the dropout mask, r = 1/(1-p):
 *   dV_j = Σ_i P_ij·M_ij·r dO_i,   dP_ij = M_ij·r (dO_i · V_j),   dS_ij = P_ij (dP_ij - Δ_i)
 *   (times 1 - tanh² with softcap),   dQ_i = scale Σ_j dS_ij K_j,   dK_j = scale Σ_i dS_ij Q_i,
 * Δ_i = dO_i · O_i (fa__bwd_prepare_task). q, k, dq and dk rows have D elements, v, out, dout
 * and dv rows Dv (D or not): Δ, dP and dV run over Dv, the scores, dQ and dK over D.
 * Only pairs (i, j) in the causal/window band are visited, so a masked pair adds exactly nothing
 * whatever its operands hold, and a row whose lse is -inf (it saw no key) adds nothing and gets
 * dq = 0 (the non-finite rule, docs/semantics.md). Every sum runs in a fixed order (keys for dq;
 * query heads, then queries, for dk and dv), with no atomics: the gradients do not depend on the
 * launch.
 *
 * Tasks (one GPU thread each; the host computes the counts):
 *   prepare  t in [0, rows·H): Δ and lse2 of one (head, row), rows as fwd_row.h's forward tasks.
 *   dq       t in [0, rows·H): dq of one (head, row).
 *   dkdv     t in [0, krows·Hk): dk and dv of one (KV head, key row), krows = B·Sk or, for
 *            varlen, cu_k[B] - cu_k[0].
 *   clear    varlen only: dq = 0 on the query rows outside every sequence, dk = dv = 0 on the
 *            key rows outside every sequence.
 */
#ifndef FA_CUDA_BWD_ROW_H
#define FA_CUDA_BWD_ROW_H

#include "fwd_row.h"

/* The backward's per-row inputs, computed once by fa__bwd_prepare (the prepare tasks) into
 * device memory: for row r of query head h, at [h·R + r], with R = fa__bwd_rows(p) and
 * r = b·Sq + i (fixed length) or the packed row cu_q[b] + i (varlen; rows outside every
 * sequence are not written):
 *   delta = Σ_d dO[r, h, d]·O[r, h, d] (fp32, d < Dv, summed in d order),
 *   lse2  = lse·log2(e), or +inf where lse = -inf (a row that saw no key: 2^(s - lse2) = 0);
 *           NaN where the forward's lse was. */
typedef struct fa__bwd_rows_in {
    float *delta, *lse2; /* each [H, R] */
    int64_t R;
} fa__bwd_rows_in;

/* Host side: R, the rows of one head of q (B·Sq, or total_q for varlen). */
static inline int64_t fa__bwd_rows(const fa__problem *p) {
    return p->cu_q ? p->total_q : p->B * p->Sq;
}

/* One visible pair's score in the exp2 domain (fwd_row.h's arithmetic: q pre-scaled by qscale,
 * then softcap, then ALiBi in fp64) and, with softcap, 1 - tanh² in *dtanh (else 1). */
typedef struct fa__bwd_scores {
    float qscale, softcap_l2;
    double slope; /* ALiBi slope·log2(e) of the row's (batch, head); 0 without ALiBi */
} fa__bwd_scores;

FA_HD fa__bwd_scores fa__bwd_scores_of(const fa__problem *p, int64_t b, int64_t h) {
    fa__bwd_scores sc;
    sc.qscale = p->softcap > 0.0f ? p->scale / p->softcap : p->scale * FA_ROW_LOG2E;
    sc.softcap_l2 = p->softcap > 0.0f ? p->softcap * FA_ROW_LOG2E : 0.0f;
    sc.slope = p->alibi ? p->alibi[b * p->alibi_sb + h * p->alibi_sh] * 1.4426950408889634 : 0.0;
    return sc;
}

/* The score of row i (q_at) against key j (k_at); dist = i + off - j. */
FA_HD float fa__bwd_score(const fa__problem *p, const fa__bwd_scores *sc, int64_t q_at,
                          int64_t k_at, int64_t dist, float *dtanh) {
    float s = 0.0f;
    for (int64_t d = 0; d < p->D; d++)
        s += fa__row_load(p->q.data, p->q.dtype, q_at + d * p->q.sd) * sc->qscale *
             fa__row_load(p->k.data, p->k.dtype, k_at + d * p->k.sd);
    *dtanh = 1.0f;
    if (sc->softcap_l2 != 0.0f) {
        const float t = tanhf(s);
        s = sc->softcap_l2 * t;
        *dtanh = 1.0f - t * t;
    }
    if (p->alibi)
        s = (float)((double)s - sc->slope * fabs((double)dist));
    return s;
}

/* x · y over the n elements of two rows (fp32, in d order). */
FA_HD float fa__bwd_dot(int64_t n, const fa__view *x, int64_t x_at, const fa__view *y,
                        int64_t y_at) {
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++)
        s += fa__row_load(x->data, x->dtype, x_at + d * x->sd) *
             fa__row_load(y->data, y->dtype, y_at + d * y->sd);
    return s;
}

/* The dropout factor of pair (i, j) of (b, h): 1 without dropout, else M_ij / (1 - p). */
FA_HD float fa__bwd_keep(const fa__problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (p->dropout_p == 0.0f)
        return 1.0f;
    const fa__philox4 w =
        fa__dropout_words(p->dropout_seed, p->dropout_offset, (uint32_t)(b * p->H + h), (uint32_t)i,
                          (uint32_t)(j >> 2));
    return fa__row_word(w, j & 3) >= p->dropout_threshold ? p->dropout_scale : 0.0f;
}

/* The (batch, row-in-sequence) of task row r, as fa__fwd_task reads it: packed rows from cu[0]
 * for varlen, b·S + i for fixed length. */
FA_HD void fa__bwd_locate(const int32_t *cu, int64_t B, int64_t S, int64_t r, int64_t *b,
                          int64_t *i) {
    if (cu) {
        const int64_t row = cu[0] + r;
        *b = fa__row_batch(cu, B, row);
        *i = row - cu[*b];
    } else {
        *b = r / S;
        *i = r % S;
    }
}

/* Index of (head h, row i of batch b) in fa__bwd_rows_in's arrays. */
FA_HD int64_t fa__bwd_rows_at(const fa__problem *p, const fa__bwd_rows_in *rows,
                              const int32_t *cu_q, int64_t b, int64_t h, int64_t i) {
    return h * rows->R + (cu_q ? cu_q[b] + i : b * p->Sq + i);
}

/* Prepare task t, 0 <= t < rows·H: Δ and lse2 of one row. */
FA_HD void fa__bwd_prepare_task(const fa__problem *p, const fa__bwd_rows_in *rows,
                                const int32_t *cu_q, int64_t nrows, int64_t t) {
    const int64_t h = t / nrows;
    int64_t b, i;
    fa__bwd_locate(cu_q, p->B, p->Sq, t % nrows, &b, &i);
    const int64_t rq = cu_q ? cu_q[b] : 0, at = fa__bwd_rows_at(p, rows, cu_q, b, h, i);
    const int64_t o_at = fa__row_at(&p->out, b, rq + i, h),
                  d_at = fa__row_at(&p->dout, b, rq + i, h);
    rows->delta[at] = fa__bwd_dot(p->Dv, &p->out, o_at, &p->dout, d_at);
    const float lse = p->lse[b * p->lse_sb + h * p->lse_sh + (rq + i) * p->lse_ss];
    rows->lse2[at] = lse == -INFINITY ? INFINITY : lse * FA_ROW_LOG2E;
}

/* dq task t, 0 <= t < rows·H. */
FA_HD void fa__bwd_dq_task(const fa__problem *p, const fa__bwd_rows_in *rows, const int32_t *cu_q,
                           const int32_t *cu_k, int64_t nrows, int64_t t) {
    const int64_t h = t / nrows, hk = h / (p->H / p->Hk), D = p->D;
    int64_t b, i;
    fa__bwd_locate(cu_q, p->B, p->Sq, t % nrows, &b, &i);
    const int64_t rq = cu_q ? cu_q[b] : 0, rk = cu_k ? cu_k[b] : 0;
    const int64_t sq = cu_q ? cu_q[b + 1] - rq : p->Sq, sk = cu_k ? cu_k[b + 1] - rk : p->Sk;
    const int64_t off = sk - sq, at = fa__bwd_rows_at(p, rows, cu_q, b, h, i);
    const float lse2 = rows->lse2[at], delta = rows->delta[at];
    const fa__bwd_scores sc = fa__bwd_scores_of(p, b, h);
    const int64_t q_at = fa__row_at(&p->q, b, rq + i, h), d_at = fa__row_at(&p->dout, b, rq + i, h);

    float dq[FA_ROW_MAX_D]; // dq: [D]
    for (int64_t d = 0; d < D; d++)
        dq[d] = 0.0f;
    const int64_t lo = fa__key_lo(p, i, off),
                  hi = lse2 == INFINITY ? lo : fa__key_hi(p, i, off, sk);
    for (int64_t j = lo; j < hi; j++) {
        const int64_t k_at = fa__row_at(&p->k, b, rk + j, hk);
        const int64_t v_at = fa__row_at(&p->v, b, rk + j, hk);
        float dtanh;
        const float s = fa__bwd_score(p, &sc, q_at, k_at, i + off - j, &dtanh);
        const float pr = s == -INFINITY ? 0.0f : exp2f(s - lse2);
        const float dp =
            fa__bwd_keep(p, b, h, i, j) * fa__bwd_dot(p->Dv, &p->dout, d_at, &p->v, v_at);
        const float ds = pr * (dp - delta) * dtanh;
        for (int64_t d = 0; d < D; d++)
            dq[d] += ds * fa__row_load(p->k.data, p->k.dtype, k_at + d * p->k.sd);
    }
    const int64_t dq_at = fa__row_at(&p->dq, b, rq + i, h);
    for (int64_t d = 0; d < D; d++)
        fa__row_store(p->dq.data, p->dq.dtype, dq_at + d * p->dq.sd, dq[d] * p->scale);
}

/* Host side: the key rows a dkdv task covers per KV head (reads the host copy of cu_k). */
static inline int64_t fa__bwd_key_rows(const fa__problem *p) {
    return p->cu_k ? (int64_t)p->cu_k[p->B] - p->cu_k[0] : p->B * p->Sk;
}

/* dkdv task t, 0 <= t < krows·Hk: dk and dv of key j of KV head hk, summed over the query heads
 * hk·g .. hk·g + g - 1 and, in each, the queries that see key j. */
FA_HD void fa__bwd_dkdv_task(const fa__problem *p, const fa__bwd_rows_in *rows, const int32_t *cu_q,
                             const int32_t *cu_k, int64_t krows, int64_t t) {
    const int64_t hk = t / krows, g = p->H / p->Hk, D = p->D, Dv = p->Dv;
    int64_t b, j;
    fa__bwd_locate(cu_k, p->B, p->Sk, t % krows, &b, &j);
    const int64_t rq = cu_q ? cu_q[b] : 0, rk = cu_k ? cu_k[b] : 0;
    const int64_t sq = cu_q ? cu_q[b + 1] - rq : p->Sq, sk = cu_k ? cu_k[b + 1] - rk : p->Sk;
    const int64_t off = sk - sq;
    /* queries i with key_lo(i) <= j < key_hi(i) */
    int64_t i_lo = p->window_right < 0 ? 0 : j - off - p->window_right;
    int64_t i_hi = p->window_left < 0 ? sq : j - off + p->window_left + 1;
    i_lo = i_lo > 0 ? i_lo : 0;
    i_hi = i_hi < sq ? i_hi : sq;
    const int64_t k_at = fa__row_at(&p->k, b, rk + j, hk), v_at = fa__row_at(&p->v, b, rk + j, hk);

    float dk[FA_ROW_MAX_D], dv[FA_ROW_MAX_D]; // dk: [D], dv: [Dv]
    for (int64_t d = 0; d < D; d++)
        dk[d] = 0.0f;
    for (int64_t d = 0; d < Dv; d++)
        dv[d] = 0.0f;
    for (int64_t h = hk * g; h < (hk + 1) * g; h++) {
        const fa__bwd_scores sc = fa__bwd_scores_of(p, b, h);
        for (int64_t i = i_lo; i < i_hi; i++) {
            const int64_t at = fa__bwd_rows_at(p, rows, cu_q, b, h, i);
            const float lse2 = rows->lse2[at];
            if (lse2 == INFINITY)
                continue; /* the row saw no key */
            const int64_t q_at = fa__row_at(&p->q, b, rq + i, h);
            const int64_t d_at = fa__row_at(&p->dout, b, rq + i, h);
            float dtanh;
            const float s = fa__bwd_score(p, &sc, q_at, k_at, i + off - j, &dtanh);
            const float pr = s == -INFINITY ? 0.0f : exp2f(s - lse2);
            const float keep = fa__bwd_keep(p, b, h, i, j);
            const float dp = keep * fa__bwd_dot(Dv, &p->dout, d_at, &p->v, v_at);
            const float ds = pr * (dp - rows->delta[at]) * dtanh, pd = pr * keep;
            for (int64_t d = 0; d < D; d++)
                dk[d] += ds * fa__row_load(p->q.data, p->q.dtype, q_at + d * p->q.sd);
            for (int64_t d = 0; d < Dv; d++)
                dv[d] += pd * fa__row_load(p->dout.data, p->dout.dtype, d_at + d * p->dout.sd);
        }
    }
    const int64_t dk_at = fa__row_at(&p->dk, b, rk + j, hk),
                  dv_at = fa__row_at(&p->dv, b, rk + j, hk);
    for (int64_t d = 0; d < D; d++)
        fa__row_store(p->dk.data, p->dk.dtype, dk_at + d * p->dk.sd, dk[d] * p->scale);
    for (int64_t d = 0; d < Dv; d++)
        fa__row_store(p->dv.data, p->dv.dtype, dv_at + d * p->dv.sd, dv[d]);
}

/* Host side: the clear tasks of a varlen backward: the query rows outside every sequence times
 * H, then the key rows outside every sequence times Hk; 0 for fixed length. */
static inline int64_t fa__bwd_clear_q_tasks(const fa__problem *p) {
    return p->cu_q ? ((int64_t)p->cu_q[0] + p->total_q - p->cu_q[p->B]) * p->H : 0;
}
static inline int64_t fa__bwd_clear_k_tasks(const fa__problem *p) {
    return p->cu_k ? ((int64_t)p->cu_k[0] + p->total_k - p->cu_k[p->B]) * p->Hk : 0;
}

/* Zeroes the n elements of row `row`, head h, of x. */
FA_HD void fa__bwd_zero_row(int64_t n, const fa__view *x, int64_t row, int64_t h) {
    const int64_t at = fa__row_at(x, 0, row, h);
    for (int64_t d = 0; d < n; d++)
        fa__row_store(x->data, x->dtype, at + d * x->sd, 0.0f);
}

/* Clear task t: below nq = fa__bwd_clear_q_tasks, head t % H of the (t / H)-th query row
 * outside every sequence (q_end = cu_q[0], q_begin = cu_q[B]); from nq on, the same for the key
 * rows and Hk (k_end = cu_k[0], k_begin = cu_k[B]). */
FA_HD void fa__bwd_clear_task(const fa__problem *p, int64_t nq, int64_t q_end, int64_t q_begin,
                              int64_t k_end, int64_t k_begin, int64_t t) {
    if (t < nq) {
        const int64_t n = t / p->H;
        fa__bwd_zero_row(p->D, &p->dq, n < q_end ? n : q_begin + (n - q_end), t % p->H);
        return;
    }
    t -= nq;
    const int64_t n = t / p->Hk, row = n < k_end ? n : k_begin + (n - k_end);
    fa__bwd_zero_row(p->D, &p->dk, row, t % p->Hk);
    fa__bwd_zero_row(p->Dv, &p->dv, row, t % p->Hk);
}

#endif /* FA_CUDA_BWD_ROW_H */
