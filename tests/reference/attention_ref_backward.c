/* SPDX-License-Identifier: MIT */
/*
 * attention_ref_backward.c — the fp64 naive reference for dropout and the backward pass (see
 * attention_ref_backward.h for the formulas).
 *
 * One routine does everything, literally: for each batch, KV head, query head of that KV head
 * and query row it builds the row of scores, the probabilities P, the dropped probabilities Pd,
 * the output row O, then dP, Δ and dS, and adds the row's share of dq, dk and dv. dk and dv are
 * collected per query head, then summed over the query heads of the KV head. With round_fn it
 * rounds every intermediate tensor the way a naive low-precision implementation would; without
 * it (identity) it is the fp64 reference. With `bound` it sums the absolute values of the
 * backward's terms instead (ref_attention_backward_bound). With out_given, Δ = dO·O uses the
 * given output rows instead of its own (ref_attention_backward_given_out).
 */
#include "attention_ref_backward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double identity(double x) { return x; }

static void *xcalloc(int64_t n, size_t size) {
    void *ptr = calloc((size_t)(n > 0 ? n : 1), size);
    if (!ptr)
        abort();
    return ptr;
}

static void backward_impl(const ref_problem *p, const double *q, const double *k, const double *v,
                          const double *out_given, const double *dout, double *out, double *lse,
                          double *dq, double *dk, double *dv, double (*rnd)(double),
                          double (*opnd)(double), int bound) {
    const int64_t B = p->B, Sq = p->Sq, Sk = p->Sk, H = p->H, Hk = p->Hk, D = p->D;
    const int64_t group = Hk > 0 ? H / Hk : 1;
    const int grads = dout != NULL && (dq != NULL || dk != NULL || dv != NULL);
    const uint8_t *keep = p->dropout_mask; /* (B, H, Sq, Sk), nonzero = kept; NULL = none */
    const double keep_scale = keep ? 1.0 / (1.0 - p->dropout_p) : 1.0;
    const double scale = bound ? fabs(p->scale) : p->scale;

    double *s = xcalloc(Sk, sizeof(double));       /* scores of one row */
    double *th = xcalloc(Sk, sizeof(double));      /* tanh(x_j / c) of one row (softcap) */
    double *P = xcalloc(Sk, sizeof(double));       /* probabilities of one row */
    double *Pd = xcalloc(Sk, sizeof(double));      /* dropped probabilities of one row */
    char *vis = xcalloc(Sk, 1);                    /* visible keys of one row */
    double *o = xcalloc(D, sizeof(double));        /* output row */
    double *dqa = xcalloc(D, sizeof(double));      /* dq row accumulator */
    double *hdk = xcalloc(Sk * D, sizeof(double)); /* dk, dv of one query head: (Sk, D) */
    double *hdv = xcalloc(Sk * D, sizeof(double));
    double *gdk = xcalloc(Sk * D, sizeof(double)); /* dk, dv summed over the group: (Sk, D) */
    double *gdv = xcalloc(Sk * D, sizeof(double));

    if (dq)
        memset(dq, 0, sizeof(double) * (size_t)(B * Sq * H * D));

    for (int64_t b = 0; b < B; b++) {
        for (int64_t hk = 0; hk < Hk; hk++) {
            memset(gdk, 0, sizeof(double) * (size_t)(Sk * D));
            memset(gdv, 0, sizeof(double) * (size_t)(Sk * D));
            for (int64_t hh = 0; hh < group; hh++) {
                const int64_t h = hk * group + hh;
                double slope = 0.0;
                if (p->alibi)
                    slope = p->alibi_per_batch ? p->alibi[b * H + h] : p->alibi[h];
                memset(hdk, 0, sizeof(double) * (size_t)(Sk * D));
                memset(hdv, 0, sizeof(double) * (size_t)(Sk * D));

                for (int64_t i = 0; i < Sq; i++) {
                    const double *qi = q + ((b * Sq + i) * H + h) * D;
                    const double *doi = dout ? dout + ((b * Sq + i) * H + h) * D : NULL;

                    /* scores */
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
                        if (p->softcap > 0.0) {
                            th[j] = rnd(tanh(rnd(sc / p->softcap)));
                            sc = rnd(th[j] * p->softcap);
                        }
                        if (p->alibi)
                            sc = rnd(sc - slope * fabs((double)(i + Sk - Sq - j)));
                        s[j] = sc;
                        if (sc > m || isnan(sc)) /* a NaN score makes the row NaN, even alone */
                            m = sc;
                    }
                    if (nvis == 0 || m == -INFINITY) { /* nothing visible: contributes nothing */
                        if (out)
                            for (int64_t d = 0; d < D; d++)
                                out[((b * Sq + i) * H + h) * D + d] = 0.0;
                        if (lse)
                            lse[(b * H + h) * Sq + i] = -INFINITY;
                        continue;
                    }

                    /* softmax (lse ignores dropout), dropout, output row */
                    double sum = 0.0;
                    for (int64_t j = 0; j < Sk; j++)
                        if (vis[j])
                            sum += P[j] = exp(s[j] - m); /* one exp per score: most of the time */
                    const double row_lse = m + log(sum);
                    for (int64_t d = 0; d < D; d++)
                        o[d] = 0.0;
                    for (int64_t j = 0; j < Sk; j++) {
                        if (!vis[j])
                            continue;
                        P[j] = rnd(P[j] / sum);
                        if (keep)
                            Pd[j] = rnd(P[j] * (keep[((b * H + h) * Sq + i) * Sk + j] != 0) *
                                        keep_scale);
                        else
                            Pd[j] = P[j];
                        const double *vj = v + ((b * Sk + j) * Hk + hk) * D;
                        for (int64_t d = 0; d < D; d++)
                            o[d] += Pd[j] * vj[d];
                    }
                    for (int64_t d = 0; d < D; d++)
                        o[d] = rnd(o[d]);
                    if (out)
                        for (int64_t d = 0; d < D; d++)
                            out[((b * Sq + i) * H + h) * D + d] = o[d];
                    if (lse)
                        lse[(b * H + h) * Sq + i] = row_lse;
                    if (!grads)
                        continue;

                    /* backward of this row */
                    const double *oi = out_given ? out_given + ((b * Sq + i) * H + h) * D : o;
                    double delta = 0.0; /* Δ = dO·O */
                    for (int64_t d = 0; d < D; d++)
                        delta += bound ? fabs(doi[d] * oi[d]) : doi[d] * oi[d];
                    delta = rnd(delta);
                    for (int64_t d = 0; d < D; d++)
                        dqa[d] = 0.0;
                    for (int64_t j = 0; j < Sk; j++) {
                        if (!vis[j])
                            continue;
                        const double *kj = k + ((b * Sk + j) * Hk + hk) * D;
                        const double *vj = v + ((b * Sk + j) * Hk + hk) * D;
                        double dpd = 0.0; /* (dO Vᵀ)_ij */
                        for (int64_t d = 0; d < D; d++)
                            dpd += bound ? fabs(doi[d] * vj[d]) : doi[d] * vj[d];
                        dpd = rnd(dpd);
                        double dp = dpd;
                        if (keep)
                            dp = rnd(dpd * (keep[((b * H + h) * Sq + i) * Sk + j] != 0) *
                                     keep_scale);
                        double ds = rnd(P[j] * rnd(bound ? dp + delta : dp - delta));
                        if (p->softcap > 0.0)
                            ds = rnd(ds * rnd(1.0 - th[j] * th[j]));
                        ds = opnd(ds); /* the products' operands (operand rounding) */
                        const double pdj = opnd(Pd[j]);
                        for (int64_t d = 0; d < D; d++) {
                            if (bound) { /* Σ of the absolute values of the terms */
                                dqa[d] += ds * fabs(kj[d]);
                                hdk[j * D + d] += ds * fabs(qi[d]);
                                hdv[j * D + d] += pdj * fabs(doi[d]);
                            } else {
                                dqa[d] += ds * kj[d];
                                hdk[j * D + d] += ds * qi[d];
                                hdv[j * D + d] += pdj * doi[d];
                            }
                        }
                    }
                    if (dq)
                        for (int64_t d = 0; d < D; d++)
                            dq[((b * Sq + i) * H + h) * D + d] = rnd(rnd(dqa[d]) * scale);
                }
                /* this head's dK = scale·dSᵀQ and dV = Pdᵀ dO, into the group's sums */
                for (int64_t t = 0; t < Sk * D; t++) {
                    gdk[t] += rnd(rnd(hdk[t]) * scale);
                    gdv[t] += rnd(hdv[t]);
                }
            }
            for (int64_t j = 0; j < Sk; j++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t at = ((b * Sk + j) * Hk + hk) * D + d;
                    if (grads && dk)
                        dk[at] = rnd(gdk[j * D + d]);
                    if (grads && dv)
                        dv[at] = rnd(gdv[j * D + d]);
                }
        }
    }
    free(s);
    free(th);
    free(P);
    free(Pd);
    free(vis);
    free(o);
    free(dqa);
    free(hdk);
    free(hdv);
    free(gdk);
    free(gdv);
}

void ref_attention_backward(const ref_problem *p, const double *q, const double *k, const double *v,
                            const double *dout, double *out, double *lse, double *dq, double *dk,
                            double *dv) {
    backward_impl(p, q, k, v, NULL, dout, out, lse, dq, dk, dv, identity, identity, 0);
}

void ref_attention_backward_rounded(const ref_problem *p, const double *q, const double *k,
                                    const double *v, const double *dout, double *out, double *lse,
                                    double *dq, double *dk, double *dv,
                                    double (*round_fn)(double)) {
    backward_impl(p, q, k, v, NULL, dout, out, lse, dq, dk, dv, round_fn ? round_fn : identity,
                  identity, 0);
}

void ref_attention_backward_given_out(const ref_problem *p, const double *q, const double *k,
                                      const double *v, const double *out, const double *dout,
                                      double *dq, double *dk, double *dv) {
    backward_impl(p, q, k, v, out, dout, NULL, NULL, dq, dk, dv, identity, identity, 0);
}

void ref_attention_backward_given_out_operands(const ref_problem *p, const double *q,
                                               const double *k, const double *v, const double *out,
                                               const double *dout, double *dq, double *dk,
                                               double *dv, double (*round_fn)(double)) {
    backward_impl(p, q, k, v, out, dout, NULL, NULL, dq, dk, dv, identity,
                  round_fn ? round_fn : identity, 0);
}

void ref_attention_backward_bound(const ref_problem *p, const double *q, const double *k,
                                  const double *v, const double *dout, double *dq, double *dk,
                                  double *dv) {
    backward_impl(p, q, k, v, NULL, dout, NULL, NULL, dq, dk, dv, identity, identity, 1);
}
