/* SPDX-License-Identifier: MIT */
/*
 * attention_ref.c — the fp64 naive attention reference (see attention_ref.h).
 *
 * For each (batch, query head, query row) it computes the whole row of scores
 *     s_j = scale * q·k_j                  (k_j from KV head h / (H / Hk))
 *     s_j = softcap * tanh(s_j / softcap)  (softcap > 0)
 *     s_j = s_j - slope * |i + Sk - Sq - j| (ALiBi)
 * keeps the keys visible under the causal flag and the window, and takes
 *     lse = log sum_j exp(s_j),  out = sum_j exp(s_j - lse) v_j
 * (with dropout, each exp(s_j - lse) is multiplied by keep_j / (1 - p); lse is unchanged).
 * A row with no visible key (or Sk = 0) gives out = 0 and lse = -inf.
 */
#include "attention_ref.h"

#include <math.h>
#include <stdlib.h>

int ref_visible(const ref_problem *p, int64_t i, int64_t j) {
    int64_t diag = i + p->Sk - p->Sq; /* the key aligned with query i (bottom-right) */
    int64_t left = p->window_left;
    int64_t right = p->causal ? 0 : p->window_right;
    if (left >= 0 && j < diag - left)
        return 0;
    if (right >= 0 && j > diag + right)
        return 0;
    return 1;
}

static double identity(double x) { return x; }

static void forward_impl(const ref_problem *p, const double *q, const double *k, const double *v,
                         double *out, double *lse, double (*rnd)(double)) {
    const int64_t B = p->B, Sq = p->Sq, Sk = p->Sk, H = p->H, Hk = p->Hk, D = p->D;
    const int64_t group = (Hk > 0) ? H / Hk : 1;
    double *s = malloc(sizeof(double) * (size_t)(Sk > 0 ? Sk : 1));
    char *vis = malloc((size_t)(Sk > 0 ? Sk : 1));
    double *acc = malloc(sizeof(double) * (size_t)(D > 0 ? D : 1));
    if (!s || !vis || !acc)
        abort();

    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / group;
            double slope = 0.0;
            if (p->alibi)
                slope = p->alibi_per_batch ? p->alibi[b * H + h] : p->alibi[h];
            for (int64_t i = 0; i < Sq; i++) {
                const double *qi = q + ((b * Sq + i) * H + h) * D;
                double *oi = out + ((b * Sq + i) * H + h) * D;
                double m = -INFINITY;
                int64_t nvis = 0;
                for (int64_t j = 0; j < Sk; j++) {
                    vis[j] = (char)ref_visible(p, i, j);
                    if (!vis[j])
                        continue;
                    nvis++;
                    const double *kj = k + ((b * Sk + j) * Hk + hk) * D;
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        dot += qi[d] * kj[d];
                    double sc = rnd(rnd(dot) * p->scale);
                    if (p->softcap > 0.0)
                        sc = rnd(rnd(tanh(rnd(sc / p->softcap))) * p->softcap);
                    if (p->alibi) {
                        double dist = fabs((double)(i + Sk - Sq - j));
                        sc = rnd(sc - slope * dist);
                    }
                    s[j] = sc;
                    if (sc > m || isnan(sc)) /* a NaN score makes the row NaN, even alone */
                        m = sc;
                }
                for (int64_t d = 0; d < D; d++)
                    acc[d] = 0.0;
                if (nvis == 0 || m == -INFINITY) {
                    for (int64_t d = 0; d < D; d++)
                        oi[d] = 0.0;
                    if (lse)
                        lse[(b * H + h) * Sq + i] = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < Sk; j++)
                    if (vis[j])
                        sum += s[j] = exp(s[j] - m); /* one exp per score: most of the time */
                const double row_lse = m + log(sum);
                const uint8_t *keep =
                    p->dropout_mask ? p->dropout_mask + ((b * H + h) * Sq + i) * Sk : NULL;
                const double keep_scale = keep ? 1.0 / (1.0 - p->dropout_p) : 1.0;
                for (int64_t j = 0; j < Sk; j++) {
                    if (!vis[j])
                        continue;
                    double pj = rnd(s[j] / sum);
                    if (keep)
                        pj = keep[j] ? rnd(pj * keep_scale) : 0.0;
                    const double *vj = v + ((b * Sk + j) * Hk + hk) * D;
                    for (int64_t d = 0; d < D; d++)
                        acc[d] += pj * vj[d];
                }
                for (int64_t d = 0; d < D; d++)
                    oi[d] = rnd(acc[d]);
                if (lse)
                    lse[(b * H + h) * Sq + i] = row_lse;
            }
        }
    }
    free(s);
    free(vis);
    free(acc);
}

void ref_attention_forward(const ref_problem *p, const double *q, const double *k, const double *v,
                           double *out, double *lse) {
    forward_impl(p, q, k, v, out, lse, identity);
}

void ref_attention_forward_rounded(const ref_problem *p, const double *q, const double *k,
                                   const double *v, double *out, double *lse,
                                   double (*round_fn)(double)) {
    forward_impl(p, q, k, v, out, lse, round_fn ? round_fn : identity);
}

void ref_score_sizes(const ref_problem *p, const double *q, const double *k, double *size) {
    const int64_t Sq = p->Sq, Sk = p->Sk, H = p->H, Hk = p->Hk, D = p->D;
    const int64_t group = Hk > 0 ? H / Hk : 1;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const double *qi = q + ((b * Sq + i) * H + h) * D;
                double row = 0.0;
                for (int64_t j = 0; j < Sk; j++) {
                    if (!ref_visible(p, i, j))
                        continue;
                    const double *kj = k + ((b * Sk + j) * Hk + h / group) * D;
                    double run = 0.0, squares = 0.0; /* P_t and sum_t P_t^2 */
                    for (int64_t d = 0; d < D; d++) {
                        run += qi[d] * kj[d];
                        squares += run * run;
                    }
                    const double s = p->scale * sqrt(squares);
                    if (s > row)
                        row = s;
                }
                size[(b * H + h) * Sq + i] = row;
            }
}
