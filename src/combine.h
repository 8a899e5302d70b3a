/* SPDX-License-Identifier: MIT */
/*
 * combine.h — fa_combine's problem after validation and the merge of one row's partials,
 * written in the common subset of C11 and CUDA C++ (FA_HD): the CPU (src/combine.c) and the
 * CUDA plug-in (cuda/combine.cu) run the same arithmetic.
 *
 * Row (b, s, h) has n partial results o_i[D] (fp32) with log-sum-exps lse_i (natural log), in
 * the order i = 0..n-1:
 *   a NaN lse_i                  -> out = NaN, lse = NaN
 *   every lse_i = -inf (or n = 0) -> out = 0,   lse = -inf (every partial fully masked)
 *   else  M = max lse_i,  w_i = exp(lse_i - M) (partials with lse_i = -inf skipped, so their
 *         o_i is never read),  L = sum w_i,  out = (sum w_i·o_i) / L,  lse = M + log L,
 *         every sum in the order i = 0..n-1 in fp32 (a +inf lse_i makes w NaN: out and lse NaN).
 */
#ifndef FA_COMBINE_H
#define FA_COMBINE_H

#include "convert.h"
#include "flashattn.h"
#include "hd.h"
#include "problem.h"

#include <math.h>
#include <stdint.h>

/* n partials of B·S·H rows of D. Element (i, b, s, h, d) of the partial outputs is
 * op[i·op_s[0] + b·op_s[1] + s·op_s[2] + h·op_s[3] + d·op_s[4]], (i, b, s, h) of their lse
 * lp[i·lp_s[0] + ...]; out is a (B, S, H, D) view (sb, ss, sh, sd; fp32, fp16 or bf16), lse
 * (b, s, h) at lse[b·lse_s[0] + s·lse_s[1] + h·lse_s[2]], NULL when not requested. */
typedef struct fa__combine {
    int64_t n, B, S, H, D;
    const float *op, *lp;
    int64_t op_s[5], lp_s[4];
    fa__view out;
    float *lse;
    int64_t lse_s[3];
} fa__combine;

/* Columns a task merges: its weights are computed once for that many columns. */
#define FA_COMBINE_COLS 8

/* Task t of the rows' ceil(D / FA_COMBINE_COLS) column groups (t = row·groups + group, row =
 * (b·S + s)·H + h): out's columns of that group, and lse with group 0. */
FA_HD void fa__combine_task(const fa__combine *c, int64_t t) {
    const int64_t groups = (c->D + FA_COMBINE_COLS - 1) / FA_COMBINE_COLS;
    const int64_t row = t / groups, d0 = t % groups * FA_COMBINE_COLS;
    const int64_t h = row % c->H, s = row / c->H % c->S, b = row / c->H / c->S;
    const int64_t lat = b * c->lp_s[1] + s * c->lp_s[2] + h * c->lp_s[3];
    const int64_t oat = b * c->op_s[1] + s * c->op_s[2] + h * c->op_s[3] + d0 * c->op_s[4];
    float m = -INFINITY, acc[FA_COMBINE_COLS];
    int nan = 0;
    for (int64_t i = 0; i < c->n; i++) {
        const float x = c->lp[i * c->lp_s[0] + lat];
        nan |= x != x;
        m = x > m ? x : m;
    }
    for (int e = 0; e < FA_COMBINE_COLS; e++)
        acc[e] = 0.0f;
    float l = 0.0f;
    if (!nan && m != -INFINITY)
        for (int64_t i = 0; i < c->n; i++) {
            const float x = c->lp[i * c->lp_s[0] + lat];
            if (x == -INFINITY)
                continue; /* fully masked: o_i is not read */
            const float w = expf(x - m);
            const float *o = c->op + i * c->op_s[0] + oat;
            l += w;
            for (int e = 0; e < FA_COMBINE_COLS; e++)
                if (d0 + e < c->D)
                    acc[e] += w * o[e * c->op_s[4]];
        }
    const float none = nan ? NAN : 0.0f; /* out where no partial counts */
    const int64_t out_at = b * c->out.sb + s * c->out.ss + h * c->out.sh;
    for (int e = 0; e < FA_COMBINE_COLS && d0 + e < c->D; e++)
        fa__row_store(c->out.data, c->out.dtype, out_at + (d0 + e) * c->out.sd,
                      nan || m == -INFINITY ? none : acc[e] / l);
    if (c->lse && d0 == 0)
        c->lse[b * c->lse_s[0] + s * c->lse_s[1] + h * c->lse_s[2]] = nan ? NAN
                                                                      : m == -INFINITY
                                                                          ? -INFINITY
                                                                          : m + logf(l);
}

#endif /* FA_COMBINE_H */
