/* SPDX-License-Identifier: MIT */
// ref_attn.h — the fp64 attention reference of the warp-emulator tests (test_cuda_emu.cpp,
// test_cuda_emu_decode.cpp, test_cuda_emu_bwd.cpp): one query row over its band of keys, with
// softcap, ALiBi and the non-finite rule of docs/semantics.md; and the mask and score options of
// an fa__problem as those tests set them. The band is drawn here, not by fa__key_lo/fa__key_hi:
// the reference does not reuse the code under test.
#pragma once

#include "problem.h"

#include <algorithm>
#include <cmath>
#include <stdint.h>
#include <vector>

/* p's mask and score options: causal (window_right 0), the window (-1: unbounded side),
 * softcap (0: off), ALiBi slopes [B, H] (NULL: none). */
static inline void ref_set_options(fa__problem &p, bool causal, int wl, int wr, float softcap,
                                   const float *slopes) {
    p.causal = causal;
    p.window_left = wl;
    p.window_right = causal ? 0 : wr;
    p.softcap = softcap;
    p.alibi = slopes;
    p.alibi_sb = p.H, p.alibi_sh = 1;
}

/* One query row: its visible keys and how its scores are formed. */
struct RefRow {
    int D;
    int64_t lo, hi;               // the visible keys [lo, hi); none when hi <= lo
    int64_t pos;                  // the row's place on the key axis, i + sk - sq
    double scale, softcap, slope; // softcap 0: off; slope 0: no ALiBi
};

/* Row i of sq queries over sk keys, bottom-right aligned, under the window wl, wr (-1: unbounded
 * side; causal is wr = 0). */
static inline RefRow ref_row(int D, int64_t i, int64_t sq, int64_t sk, int64_t wl, int64_t wr,
                             double scale, double softcap, double slope) {
    const int64_t pos = i + sk - sq;
    const int64_t lo = std::max<int64_t>(wl < 0 ? 0 : pos - wl, 0);
    const int64_t hi = std::min<int64_t>(wr < 0 ? sk : pos + wr + 1, sk);
    return RefRow{D, lo, hi, pos, scale, softcap, slope};
}

/* Row r's scores s[j - lo], j in [lo, hi): scale * q.k_j, then softcap * tanh(x / softcap) where
 * softcap > 0 (th[j - lo], th not NULL: that tanh), then - slope * |pos - j|. q: the row's D
 * elements; k(j, e): element e of key j. Sets *row_nan when a score is NaN or +Inf (the rule's
 * NaN row); returns the largest of the other scores (-inf if none). */
template <class Kf>
static double ref_scores(const RefRow &r, const double *q, Kf k, double *s, double *th,
                         bool *row_nan) {
    double m = -INFINITY;
    *row_nan = false;
    for (int64_t j = r.lo; j < r.hi; ++j) {
        double d = 0;
        for (int e = 0; e < r.D; ++e)
            d += q[e] * k(j, e);
        d *= r.scale;
        if (r.softcap > 0) {
            const double t = tanh(d / r.softcap);
            if (th)
                th[j - r.lo] = t;
            d = r.softcap * t;
        }
        d -= r.slope * fabs((double)(r.pos - j));
        s[j - r.lo] = d;
        if (std::isnan(d) || d == INFINITY)
            *row_nan = true;
        else
            m = std::max(m, d);
    }
    return m;
}

/* Row r's attention in fp64 under the non-finite rule: a NaN or +Inf score makes out and lse
 * NaN; a -Inf score weighs 0 (times v: 0 times a non-finite v is NaN); a row that sees no key,
 * or only -Inf scores, gets out = 0 and lse = -inf. q, k as ref_scores; v(j, x): element x of
 * value j. Writes out[D]; returns lse, NaN exactly for the rule's NaN rows. */
template <class Kf, class Vf>
static double ref_attn_row(const RefRow &r, const double *q, Kf k, Vf v, double *out) {
    std::vector<double> s(std::max<int64_t>(r.hi - r.lo, 0));
    bool row_nan;
    const double m = ref_scores(r, q, k, s.data(), nullptr, &row_nan);
    double l = 0;
    std::fill(out, out + r.D, 0.0);
    if (!row_nan && m != -INFINITY)
        for (int64_t j = r.lo; j < r.hi; ++j) {
            const double e = exp(s[j - r.lo] - m); // 0 at a -Inf score
            l += e;
            for (int x = 0; x < r.D; ++x)
                out[x] += e * v(j, x);
        }
    for (int x = 0; x < r.D; ++x)
        out[x] = row_nan ? NAN : l > 0 ? out[x] / l : 0.0;
    return row_nan ? NAN : l > 0 ? m + log(l) : -INFINITY;
}

/* A sink s (finite) joined to a row of ref_attn_row (out[D], its lse): one more logit with a
 * zero value vector, so lse' = log(e^lse + e^s) and out · e^(lse - lse'); a row that saw no key
 * gets lse' = s and keeps out = 0, a NaN row stays NaN. Returns lse'. */
static inline double ref_sink(double lse, double s, int D, double *out) {
    if (std::isnan(lse))
        return lse;
    const double m = std::max(lse, s), joined = m + log(exp(lse - m) + exp(s - m));
    for (int x = 0; x < D; ++x)
        out[x] *= exp(lse - joined);
    return joined;
}

/* The sinks of the emulator tests' H heads for a base value: base + 0.7·(h % 4), and -inf (no
 * sink) for every third head. Empty for base NaN: no sinks. */
static inline std::vector<float> ref_sinks(float base, int H) {
    std::vector<float> s;
    for (int h = 0; !std::isnan(base) && h < H; ++h)
        s.push_back(h % 3 == 2 ? -INFINITY : base + 0.7f * (float)(h % 4));
    return s;
}
