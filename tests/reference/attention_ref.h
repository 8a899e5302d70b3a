/* SPDX-License-Identifier: MIT */
/*
 * attention_ref.h — the fp64 naive attention reference every test and `flashattn verify`
 * compare against. Obviously correct rather than fast: it materializes one row of scores at a
 * time and follows the semantics in ../../include/flashattn.h literally.
 */
#ifndef FA_ATTENTION_REF_H
#define FA_ATTENTION_REF_H

#include <stdint.h>

typedef struct ref_problem {
    int64_t B, Sq, Sk, H, Hk, D;
    double scale;        /* the scale actually used (no "0 = default" here) */
    int causal;          /* bottom-right aligned; forces window_right = 0 */
    int window_left;     /* -1 = unbounded */
    int window_right;    /* -1 = unbounded */
    double softcap;      /* 0 = off */
    const double *alibi; /* NULL, or slopes: (H) if alibi_per_batch == 0, else (B, H) */
    int alibi_per_batch;
    /* Dropout, optional (zero-filled = none): dropout_mask (B, H, Sq, Sk) contiguous, nonzero =
     * keep; kept normalized probabilities are scaled by 1 / (1 - dropout_p), dropped ones are 0.
     * lse ignores dropout. */
    const uint8_t *dropout_mask;
    double dropout_p;
} ref_problem;

/* Forward in fp64 on contiguous tensors:
 *   q (B, Sq, H, D), k and v (B, Sk, Hk, D), out (B, Sq, H, D), lse (B, H, Sq) (natural log).
 * Fully masked rows and Sk = 0 give out = 0 and lse = -INFINITY; a NaN score at a visible key
 * (even the only one) makes the row NaN, as a +inf one does. lse may be NULL. */
void ref_attention_forward(const ref_problem *p, const double *q, const double *k, const double *v,
                           double *out, double *lse);

/* The size of the running sums behind each row's scores, per row (B, H, Sq): over the row's
 * visible keys, the largest scale * sqrt(sum_t P_t^2), where P_t = q_0 k_0 + ... + q_t k_t is
 * the dot product's running sum after t + 1 terms. An fp32 dot product rounds each running sum
 * by up to 2^-24 of it, so a score's rounding error is about 2^-24 times this (root mean square;
 * blocked sums or several accumulators make it smaller). When the score cancels against an
 * ALiBi bias this, not |lse|, is what the fp32 lse's error scales with. 0 for rows with no
 * visible key. */
void ref_score_sizes(const ref_problem *p, const double *q, const double *k, double *size);

/* 1 if key j is visible to query i under p's causal flag and window, else 0. */
int ref_visible(const ref_problem *p, int64_t i, int64_t j);

/* The same forward computed the way a naive implementation in a low-precision dtype would:
 * every intermediate tensor (q·kᵀ, its scaling, each softcap step, the biased scores, the
 * normalized probabilities and the output) is rounded with `round_fn` (e.g. to fp16 or bf16),
 * while each reduction (dot product, softmax, P·V) is accumulated exactly (in fp64) as a
 * matmul/softmax kernel with fp32 accumulation would. The inputs are used as given (round them
 * to the dtype first). lse (may be NULL) is the fp64 logsumexp of the rounded scores. The tests
 * use its error against ref_attention_forward as the yardstick for fp16/bf16 ("no worse than
 * 2x a naive implementation in that precision"). round_fn NULL = no rounding. */
void ref_attention_forward_rounded(const ref_problem *p, const double *q, const double *k,
                                   const double *v, double *out, double *lse,
                                   double (*round_fn)(double));

#endif /* FA_ATTENTION_REF_H */
