/* SPDX-License-Identifier: MIT */
// test_cuda_emu_bwd.cpp — runs the tensor-core backward (cuda/bwd_mma.cu) on the CPU through the
// emulator in emu.h, through its host entry points fa__mma_bwd_supported and fa__mma_backward,
// and compares dq, dk and dv with an fp64 backward over the same fp16/bf16 inputs.
//
// Per configuration the test draws q, k, v and dout, computes in fp64 what the forward and
// fa__bwd_prepare would leave (out rounded to the dtype, lse in fp32, Δ = Σ dO·out summed in fp32
// in d order, lse2 = lse·log2(e), +inf for a row that saw no key), runs the kernels and checks:
//   error: max |got - ref| of each gradient <= tol · max |ref| of that gradient + 1e-6, with
//          tol = 2e-2 for bf16 and 4e-3 for fp16 (ref: the exact gradient of the fp64 attention
//          on the rounded inputs, given the Δ the kernels get: Δ is their input, and where the
//          gradient cancels to about 0, as with one key, its rounding would be all the error;
//          the kernels round P and dS to the dtype, as flash-attn does);
//   coverage: every gradient element inside a sequence written and finite; every other element
//          (stride padding, columns past D, varlen rows outside every sequence) untouched;
//   the emulator: no shared-memory race, cp.async misuse, divergence or ldmatrix bank conflict.
// Inputs hold NaN in every element outside the tensors, outputs start as a NaN sentinel. The
// "determinism" configurations run the kernels twice and require bitwise equal gradients.
//
// bwd_mma_emu.cu is cuda/bwd_mma.cu as emu_kernel.cmake copies it. Suites (arguments; default
// all but sweep): dims, features, edge, nonfinite, and sweep SEED N (N random configurations).
// Every fp16 configuration up to D = 128 runs again on an emulated sm_75 (Turing's kind).
//
// nonfinite plants NaN and infinities in q, k, v and dout and holds the kernels to the rule of
// notes/nan-rule.md: where the fp64 reference (the formula over the pairs that see each other,
// with NaN rows, fully masked rows and -Inf scores as the rule has them) is not finite, the
// gradient must be NaN or an infinity; everywhere else it must match as if nothing had been
// planted. Every case must have both kinds of elements.
#include "emu.h"
// the kernels' copy, after the emulator it is written for
#include "bwd_mma_emu.cu"
#include "ref_attn.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

/* A value planted in q, k, v or dout ('o') before the call: element d of packed row `row` of
 * head h (batch 0). pos_col: first make column d of the other operand of the score (k for a q
 * plant, q for a k plant) positive, so that a -Inf plant gives a score of -Inf everywhere. */
struct Plant {
    char t;
    int row, h, d;
    float val;
    bool pos_col;
};

struct Cfg {
    int B = 1, H = 2, Hk = 2, D = 64, Sq = 1, Sk = 1;
    bool bf = false, causal = false, twice = false;
    int wl = -1, wr = -1;
    float softcap = 0, scale = 0, alibi = 0, mag = 1.0f;
    float dropout = 0;       // dropout_p (seed and offset fixed below)
    std::vector<int> lq, lk; // varlen lengths (empty: fixed)
    int pad = 0;             // extra elements (multiple of 8) on every head and row stride
    int sm = 80;             // the device: 80 (m16n8k16), or 75 (Turing's kind, fp16, D <= 128)
    std::vector<Plant> plants;
    const char *nf_case = nullptr; // the non-finite suite's case name
};

static std::mt19937 rng(4321);

static std::string describe(const Cfg &c) {
    char buf[512];
    std::string vl;
    if (!c.lq.empty()) {
        vl = " varlen q/k=";
        for (size_t i = 0; i < c.lq.size(); ++i)
            vl += std::to_string(c.lq[i]) + "/" + std::to_string(c.lk[i]) + ",";
    }
    snprintf(buf, sizeof buf,
             "%s D=%d B=%d H=%d Hk=%d Sq=%d Sk=%d causal=%d wl=%d wr=%d softcap=%g alibi=%g "
             "dropout=%g pad=%d mag=%g scale=%g%s%s%s",
             c.bf ? "bf16" : "fp16", c.D, c.B, c.H, c.Hk, c.Sq, c.Sk, c.causal, c.wl, c.wr,
             c.softcap, c.alibi, c.dropout, c.pad, c.mag, c.scale, vl.c_str(),
             c.twice ? " twice" : "", c.sm == 75 ? " sm_75 (m16n8k8)" : "");
    std::string r = buf;
    if (c.nf_case)
        r += std::string(" case=") + c.nf_case;
    for (const Plant &pl : c.plants) {
        snprintf(buf, sizeof buf, " %c[%d,h%d,d%d]=%g%s", pl.t, pl.row, pl.h, pl.d, pl.val,
                 pl.pos_col ? "(+col)" : "");
        r += buf;
    }
    return r;
}

/* A [rows, heads, D] tensor of fp16/bf16 bits with padded strides (element strides). */
struct Tensor {
    std::vector<uint16_t> x;
    int64_t sb, ss, sh;
    uint16_t *data() { return x.data(); }
};

static int run(const Cfg &c, double *worst) {
    const bool varlen = !c.lq.empty();
    const int B = varlen ? (int)c.lq.size() : c.B, D = c.D;
    std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0);
    for (int b = 0; varlen && b < B; ++b) {
        cu_q[b + 1] = cu_q[b] + c.lq[b];
        cu_k[b + 1] = cu_k[b] + c.lk[b];
    }
    /* varlen: 3 rows past the last sequence, which the kernels must leave alone */
    const int totq = varlen ? cu_q[B] + 3 : B * c.Sq, totk = varlen ? cu_k[B] + 3 : B * c.Sk;
    const int rows_q = varlen ? totq : c.Sq, rows_k = varlen ? totk : c.Sk;
    const uint16_t nan_gap = c.bf ? 0x7fc0 : 0x7e00, sentinel = c.bf ? 0x7fc1 : 0x7e01;
    /* 256-byte aligned (cp.async wants 16), NaN-filled, 64 elements of tail */
    auto mk = [&](int heads, int rows, uint16_t fill) {
        Tensor t;
        t.sh = D + c.pad;
        t.ss = heads * t.sh + c.pad;
        t.sb = varlen ? 0 : rows * t.ss + c.pad;
        const size_t n = varlen ? (size_t)rows * t.ss + 64 : (size_t)B * t.sb + 64;
        t.x.assign(n + 128, fill);
        return t;
    };
    auto cvt = [&](float f) { return c.bf ? emu::f2bf(f) : emu::f2h(f); };
    auto val = [&](uint16_t u) { return (double)(c.bf ? emu::bf2f(u) : emu::h2f(u)); };
    /* The elements of head h, row r of batch b (varlen: b = 0, r the packed row). */
    auto at = [&](const Tensor &t, int b, int r, int h) { return b * t.sb + r * t.ss + h * t.sh; };
    Tensor q = mk(c.H, rows_q, nan_gap), k = mk(c.Hk, rows_k, nan_gap),
           v = mk(c.Hk, rows_k, nan_gap), dout = mk(c.H, rows_q, nan_gap),
           out = mk(c.H, rows_q, nan_gap);
    std::uniform_real_distribution<float> U(-1, 1);
    for (int b = 0; b < (varlen ? 1 : B); ++b) {
        for (int r = 0; r < rows_q; ++r)
            for (int h = 0; h < c.H; ++h)
                for (int d = 0; d < D; ++d) {
                    q.x[at(q, b, r, h) + d] = cvt(U(rng) * c.mag);
                    dout.x[at(dout, b, r, h) + d] = cvt(U(rng));
                }
        for (int r = 0; r < rows_k; ++r)
            for (int h = 0; h < c.Hk; ++h)
                for (int d = 0; d < D; ++d) {
                    k.x[at(k, b, r, h) + d] = cvt(U(rng) * c.mag);
                    v.x[at(v, b, r, h) + d] = cvt(U(rng));
                }
    }
    for (const Plant &pl : c.plants) {
        Tensor &x = pl.t == 'q' ? q : pl.t == 'k' ? k : pl.t == 'v' ? v : dout;
        if (pl.pos_col) { // column d of the other operand positive, in every row and head
            Tensor &y = pl.t == 'q' ? k : q;
            const int rows = pl.t == 'q' ? rows_k : rows_q, heads = pl.t == 'q' ? c.Hk : c.H;
            for (int b = 0; b < (varlen ? 1 : B); ++b)
                for (int r = 0; r < rows; ++r)
                    for (int h = 0; h < heads; ++h) {
                        uint16_t &e = y.x[at(y, b, r, h) + pl.d];
                        e = cvt(0.125f + (float)fabs(val(e)));
                    }
        }
        x.x[at(x, 0, pl.row, pl.h) + pl.d] = cvt(pl.val);
    }
    std::vector<float> slopes(B * c.H);
    for (int i = 0; i < B * c.H; ++i)
        slopes[i] = c.alibi * (0.5f + (float)(i % 7) / 7.0f);
    const double scale = c.scale > 0 ? c.scale : 1.0 / sqrt((double)D);
    const float scale_f = c.scale > 0 ? c.scale : 1.0f / sqrtf((float)D);
    const int wr = c.causal ? 0 : c.wr;
    /* dropout: the mask of philox.h; drop(b, h, i, j) is 0 or 1 / (1 - p) */
    const uint64_t seed = 0x1234567890abcdefull, offset = 0x0000000500000007ull;
    const uint32_t threshold = fa__dropout_threshold(c.dropout);
    const float drop_scale = 1.0f / (1.0f - c.dropout);
    auto drop = [&](int b, int h, int i, int64_t j) -> double {
        if (c.dropout == 0)
            return 1.0;
        const fa__philox4 w = fa__dropout_words(seed, offset, (uint32_t)(b * c.H + h), (uint32_t)i,
                                                (uint32_t)(j >> 2));
        return w.v[j & 3] >= threshold ? drop_scale : 0.0;
    };

    /* The fp64 forward and backward. ref_d*: [elements of the tensor], 0 where not written. */
    std::vector<double> rdq(q.x.size(), 0.0), rdk(k.x.size(), 0.0), rdv(k.x.size(), 0.0);
    std::vector<char> want_q(q.x.size(), 0), want_k(k.x.size(), 0);
    const int64_t R = totq;
    std::vector<float> delta((size_t)c.H * R, NAN), lse2((size_t)c.H * R, NAN);
    for (int b = 0; b < B; ++b) {
        const int rq = varlen ? cu_q[b] : 0, rk = varlen ? cu_k[b] : 0, bb = varlen ? 0 : b;
        const int sq = varlen ? c.lq[b] : c.Sq, sk = varlen ? c.lk[b] : c.Sk;
        for (int j = 0; j < sk; ++j)
            for (int hk = 0; hk < c.Hk; ++hk)
                for (int d = 0; d < D; ++d)
                    want_k[at(k, bb, rk + j, hk) + d] = 1;
        for (int h = 0; h < c.H; ++h) {
            const int hk = h / (c.H / c.Hk);
            const int64_t k0 = at(k, bb, rk, hk); // key 0 of batch b, head hk
            auto kf = [&](int64_t j, int e) { return val(k.x[k0 + j * k.ss + e]); };
            const double slope = c.alibi != 0 ? slopes[b * c.H + h] : 0;
            for (int i = 0; i < sq; ++i) {
                const RefRow r = ref_row(D, i, sq, sk, c.wl, wr, scale, c.softcap, slope);
                const int64_t lo = r.lo, hi = r.hi;
                const int64_t qa = at(q, bb, rq + i, h);
                std::vector<double> qv(D), s(sk), th(sk), p(sk, 0.0);
                for (int d = 0; d < D; ++d)
                    qv[d] = val(q.x[qa + d]);
                bool row_nan; // a NaN or +Inf score at a visible key
                const double m =
                    ref_scores(r, qv.data(), kf, s.data() + lo, th.data() + lo, &row_nan);
                /* the non-finite rule: a NaN row has NaN P, out and lse; a row whose visible
                 * scores are all -Inf (or that sees no key) is fully masked: out = 0, lse = -inf,
                 * dq = 0, and it adds nothing to dk, dv */
                const bool keyless = !row_nan && m == -INFINITY;
                double l = 0;
                for (int64_t j = lo; j < hi; ++j)
                    l += (p[j] = row_nan ? NAN : keyless ? 0.0 : exp(s[j] - m));
                std::vector<double> o(D, 0.0), dO(D);
                for (int d = 0; d < D; ++d)
                    dO[d] = val(dout.x[at(dout, bb, rq + i, h) + d]);
                for (int64_t j = lo; j < hi; ++j) {
                    p[j] /= l;
                    const int64_t va = at(v, bb, rk + (int)j, hk);
                    const double pd = drop(b, h, i, j) == 0 ? 0.0 : p[j] * drop(b, h, i, j);
                    for (int d = 0; d < D; ++d)
                        o[d] += pd * val(v.x[va + d]);
                }
                /* what the forward and fa__bwd_prepare store */
                const int64_t oa = at(out, bb, rq + i, h);
                float dl = 0.0f;
                for (int d = 0; d < D; ++d) {
                    out.x[oa + d] = cvt((float)o[d]);
                    dl += (float)dO[d] * (float)val(out.x[oa + d]);
                }
                const size_t ri = (size_t)h * R + (varlen ? rq : b * c.Sq) + i;
                const float lse = row_nan ? NAN : keyless ? -INFINITY : (float)(m + log(l));
                delta[ri] = dl;
                lse2[ri] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
                /* the exact gradients */
                for (int d = 0; d < D; ++d)
                    want_q[qa + d] = 1;
                for (int64_t j = lo; j < hi && !keyless; ++j) {
                    const int64_t ka = at(k, bb, rk + (int)j, hk), va = at(v, bb, rk + (int)j, hk);
                    const double dr = drop(b, h, i, j); // dropped: P and dP of the pair are 0
                    double dp = 0;
                    for (int d = 0; d < D; ++d) {
                        dp += dO[d] * val(v.x[va + d]);
                        rdv[va + d] += dr == 0 ? 0.0 : p[j] * dr * dO[d];
                    }
                    double ds = p[j] * ((dr == 0 ? 0.0 : dp * dr) - (double)dl);
                    if (c.softcap > 0)
                        ds *= 1 - th[j] * th[j];
                    for (int d = 0; d < D; ++d) {
                        rdq[qa + d] += scale * ds * val(k.x[ka + d]);
                        rdk[ka + d] += scale * ds * val(q.x[qa + d]);
                    }
                }
            }
        }
    }

    Tensor dq = mk(c.H, rows_q, sentinel), dk = mk(c.Hk, rows_k, sentinel),
           dv = mk(c.Hk, rows_k, sentinel);
    emu::g_bufs.clear();
    for (Tensor *t : {&q, &k, &v, &dout})
        emu::register_global(t->data(), t->x.size() * 2);
    fa__problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.H = c.H, p.Hk = c.Hk, p.D = p.Dv = D;
    p.Sq = varlen ? *std::max_element(c.lq.begin(), c.lq.end()) : c.Sq;
    p.Sk = varlen ? *std::max_element(c.lk.begin(), c.lk.end()) : c.Sk;
    p.cu_q = varlen ? cu_q.data() : nullptr;
    p.cu_k = varlen ? cu_k.data() : nullptr;
    p.total_q = totq, p.total_k = totk;
    const int32_t dt = c.bf ? FA_DTYPE_BF16 : FA_DTYPE_F16;
    auto view = [&](Tensor &t) {
        return fa__view{t.data(), dt,      t.sb,    t.ss, t.sh, 1,
                        nullptr,  nullptr, nullptr, 0,    0,    nullptr};
    };
    p.q = view(q), p.k = view(k), p.v = view(v), p.out = view(out), p.dout = view(dout);
    p.dq = view(dq), p.dk = view(dk), p.dv = view(dv);
    p.scale = scale_f;
    ref_set_options(p, c.causal, c.wl, c.wr, c.softcap, c.alibi != 0 ? slopes.data() : nullptr);
    p.dropout_p = c.dropout, p.dropout_threshold = threshold, p.dropout_scale = drop_scale;
    p.dropout_seed = seed, p.dropout_offset = offset;
    fa__bwd_rows_in rows_in = {delta.data(), lse2.data(), R};
    emu::g_sm = c.sm;
    if (!fa__mma_bwd_supported(&p, c.sm, emu::smem_optin(c.sm))) {
        printf("  not supported by fa__mma_bwd_supported\n");
        emu::g_sm = 90;
        return 1;
    }
    const long err0 = emu::g_errors;
    int fail = fa__mma_backward(&p, c.sm, &rows_in, p.cu_q, p.cu_k, nullptr) != cudaSuccess;
    const double tol = c.bf ? 2e-2 : 4e-3;
    struct Grad {
        int at; // its slot in worst
        const char *name;
        Tensor *t;
        const std::vector<double> *ref;
        const std::vector<char> *want;
    } grads[] = {{0, "dq", &dq, &rdq, &want_q},
                 {1, "dk", &dk, &rdk, &want_k},
                 {2, "dv", &dv, &rdv, &want_k}};
    printf(" ");
    long n_nonfinite = 0, n_finite = 0;
    for (const Grad &gr : grads) {
        double max_ref = 0, max_err = 0;
        long bad = 0, stray = 0, nonfinite = 0, finite = 0;
        for (size_t e = 0; e < gr.t->x.size(); ++e)
            if ((*gr.want)[e] && std::isfinite((*gr.ref)[e]))
                max_ref = std::max(max_ref, fabs((*gr.ref)[e]));
        for (size_t e = 0; e < gr.t->x.size(); ++e) {
            const uint16_t u = gr.t->x[e];
            if (!(*gr.want)[e]) {
                stray += u != sentinel;
                continue;
            }
            const double got = val(u);
            if (!std::isfinite((*gr.ref)[e])) { // the rule's non-finite: NaN or an infinity
                nonfinite++;
                if (u == sentinel || std::isfinite(got)) {
                    if (bad++ < 3)
                        printf("  %s[%zu]: %s, ref %g\n", gr.name, e,
                               u == sentinel ? "unwritten" : "finite", (*gr.ref)[e]);
                }
                continue;
            }
            finite++;
            if (!std::isfinite(got)) {
                if (bad++ < 3)
                    printf("  %s[%zu]: %s\n", gr.name, e, u == sentinel ? "unwritten" : "NaN/inf");
                continue;
            }
            max_err = std::max(max_err, fabs(got - (*gr.ref)[e]));
        }
        const double rel = max_ref > 0 ? max_err / max_ref : max_err;
        const bool f = bad || stray || max_err > tol * max_ref + 1e-6;
        if (max_ref >= 1e-4) // else the 1e-6 floor decides (gradients that cancel to about 0)
            worst[gr.at] = std::max(worst[gr.at], rel);
        printf(" %s: max|ref| %.3g err %.3g (rel %.2e) bad %ld stray %ld", gr.name, max_ref,
               max_err, rel, bad, stray);
        if (!c.plants.empty())
            printf(" non-finite %ld finite %ld", nonfinite, finite);
        printf("%s;", f ? " FAIL" : "");
        fail |= f;
        n_nonfinite += nonfinite, n_finite += finite;
    }
    if (c.twice) { // again on fresh outputs: bitwise the same gradients
        Tensor dq2 = mk(c.H, rows_q, sentinel), dk2 = mk(c.Hk, rows_k, sentinel),
               dv2 = mk(c.Hk, rows_k, sentinel);
        p.dq = view(dq2), p.dk = view(dk2), p.dv = view(dv2);
        fa__mma_backward(&p, c.sm, &rows_in, p.cu_q, p.cu_k, nullptr);
        const bool same = dq2.x == dq.x && dk2.x == dk.x && dv2.x == dv.x;
        printf(" second run %s;", same ? "bitwise equal" : "DIFFERS");
        fail |= !same;
    }
    /* a planted configuration must check both directions */
    const bool one_sided = !c.plants.empty() && (n_nonfinite == 0 || n_finite == 0);
    fail |= one_sided;
    emu::g_sm = 90;
    const long emu_errs = emu::g_errors - err0;
    printf("%s emu_errors %ld => %s\n", one_sided ? " ONE-SIDED" : "", emu_errs,
           fail || emu_errs ? "FAIL" : "ok");
    return fail || emu_errs;
}

int main(int argc, char **argv) {
    std::vector<std::string> suites;
    int seed = 7, n_sweep = 20;
    for (int a = 1; a < argc; ++a) {
        suites.push_back(argv[a]);
        if (suites.back() == "sweep" && a + 2 < argc)
            seed = atoi(argv[a + 1]), n_sweep = atoi(argv[a + 2]), a += 2;
    }
    if (suites.empty())
        suites = {"dims", "features", "edge", "nonfinite"};
    std::vector<Cfg> cfgs;
    auto mk = [](int D, bool bf, int Sq, int Sk) {
        Cfg c;
        c.D = D, c.bf = bf, c.Sq = Sq, c.Sk = Sk;
        return c;
    };
    for (const std::string &suite : suites) {
        if (suite == "dims") { // every kernel at its own D and a padded one
            const int dims[] = {8,   32,  40,  64,  80,  96,  112, 128,
                                136, 160, 184, 192, 200, 224, 248, 256};
            int n = 0;
            for (int D : dims) {
                Cfg c = mk(D, n % 2, 70, 90);
                c.causal = n % 3 == 0;
                cfgs.push_back(c);
                c = mk(D, n % 2 == 0, 33, 17); // Sq > Sk, causal: rows that see no key
                c.causal = true;
                cfgs.push_back(c);
                ++n;
            }
        } else if (suite == "features") {
            for (int D : {64, 128, 256})
                for (int bf : {0, 1}) {
                    Cfg c = mk(D, bf, 100, 130);
                    c.H = 4, c.Hk = 2, c.causal = true; // GQA
                    cfgs.push_back(c);
                    c = mk(D, bf, 70, 70);
                    c.H = 3, c.Hk = 1, c.pad = 8; // MQA, padded strides
                    cfgs.push_back(c);
                    c = mk(D, bf, 150, 170);
                    c.wl = 40, c.wr = 17; // sliding window
                    cfgs.push_back(c);
                    c = mk(D, bf, 80, 80);
                    c.softcap = 5, c.mag = 2;
                    cfgs.push_back(c);
                    c = mk(D, bf, 90, 100);
                    c.alibi = 0.3f, c.causal = true;
                    cfgs.push_back(c);
                    c = mk(D, bf, 60, 70);
                    c.alibi = 0.2f, c.softcap = 3, c.mag = 2, c.wl = 20;
                    cfgs.push_back(c);
                    c = mk(D, bf, 0, 0);
                    c.lq = {5, 0, 130, 1, 64}, c.lk = {9, 4, 129, 1, 0}, c.causal = true, c.H = 2,
                    c.Hk = 1; // varlen: empty, length-1 and keyless sequences
                    cfgs.push_back(c);
                    c = mk(D, bf, 90, 110);
                    c.dropout = 0.17f, c.causal = true, c.H = 4, c.Hk = 2; // dropout, GQA
                    cfgs.push_back(c);
                    c = mk(D, bf, 0, 0);
                    c.lq = {40, 77}, c.lk = {70, 50}, c.dropout = 0.3f, c.softcap = 4,
                    c.alibi = 0.2f, c.wl = 30; // dropout, varlen, softcap, ALiBi, window
                    cfgs.push_back(c);
                }
        } else if (suite == "edge") {
            for (int bf : {0, 1}) {
                Cfg c = mk(96, bf, 200, 45); // Sq > Sk, causal: many keyless rows
                c.causal = true, c.B = 2;
                cfgs.push_back(c);
                c = mk(64, bf, 13, 200); // Sq < Sk, window
                c.wl = 50, c.wr = 3;
                cfgs.push_back(c);
                c = mk(128, bf, 1, 1);
                cfgs.push_back(c);
                c = mk(40, bf, 65, 129);
                c.wl = 0, c.wr = 0; // one key a row
                cfgs.push_back(c);
                c = mk(64, bf, 90, 150);
                c.wl = 0x7fffffff, c.wr = 0x7fffffff; // huge windows
                cfgs.push_back(c);
                c = mk(80, bf, 70, 100);
                c.scale = 4, c.mag = 2; // peaked
                cfgs.push_back(c);
                c = mk(64, bf, 0, 0);
                c.lq = {0, 0, 3}, c.lk = {0, 5, 0}; // varlen: empty and keyless
                cfgs.push_back(c);
                c = mk(160, bf, 70, 130); // determinism
                c.causal = true, c.H = 4, c.Hk = 2, c.twice = true;
                cfgs.push_back(c);
                c = mk(0, bf, 0, 0);
                c.D = 48, c.lq = {100, 17}, c.lk = {60, 90}, c.wl = 30, c.twice = true;
                cfgs.push_back(c);
            }
        } else if (suite == "nonfinite") { // nan-rule.md, both directions in every case
            const float inf = INFINITY, nan = NAN;
            for (int D : {64, 256})
                for (int bf : {0, 1}) {
                    auto add = [&](Cfg c, const char *name, std::vector<Plant> pl) {
                        c.D = D, c.bf = bf, c.nf_case = name, c.plants = std::move(pl);
                        cfgs.push_back(c);
                    };
                    Cfg w = mk(D, bf, 130, 130); // row i sees keys i - 20 .. i
                    w.H = 2, w.Hk = 1, w.causal = true, w.wl = 20;
                    /* q: NaN, +Inf, -Inf against mixed signs (NaN rows), -Inf against a positive
                     * column (every score -Inf: a fully masked row, whose q must add nothing) */
                    add(w, "q",
                        {{'q', 30, 0, 1, nan, false},
                         {'q', 100, 1, 2, inf, false},
                         {'q', 120, 1, 5, -inf, false},
                         {'q', 70, 0, 0, -inf, true}});
                    /* k: NaN (rows 100..120 see it, rows 64..99 share their dQ CTA); -Inf against
                     * a positive column (key 50 weighs 0) with an infinite v */
                    add(w, "k",
                        {{'k', 100, 0, 3, nan, false},
                         {'k', 50, 0, 6, -inf, true},
                         {'v', 50, 0, 2, inf, false}});
                    add(w, "v", {{'v', 30, 0, 1, nan, false}, {'v', 90, 0, 2, inf, false}});
                    /* a fully masked row (q -Inf against a positive column) that sees +Inf in K
                     * at a key of a mask-free block (causal, no window): its score stays -Inf,
                     * its dq must be 0 */
                    Cfg m = mk(D, bf, 130, 130);
                    m.causal = true;
                    add(m, "masked",
                        {{'q', 70, 0, 0, -inf, true},
                         {'q', 70, 0, 3, -1.0f, false},
                         {'k', 10, 0, 3, inf, false}});
                    /* a fully masked row in a mask-free pair of the dK/dV kernel: its -Inf q must
                     * not reach dk (head 1 holds the case's non-finite gradients) */
                    add(m, "masked2", {{'q', 70, 0, 0, -inf, true}, {'v', 125, 1, 1, nan, false}});
                    add(w, "dout", {{'o', 40, 0, 1, nan, false}, {'o', 100, 1, 2, inf, false}});
                    Cfg c = mk(D, bf, 0, 0); // varlen, causal, packed rows
                    c.lq = {5, 130, 64}, c.lk = {9, 129, 70}, c.causal = true, c.H = 2, c.Hk = 1;
                    add(c, "varlen",
                        {{'k', 9 + 100, 0, 1, nan, false},
                         {'v', 9 + 128, 0, 2, nan, false},
                         {'q', 5 + 3, 1, 3, nan, false},
                         {'o', 5 + 129 + 10, 0, 0, inf, false}});
                    c = mk(D, bf, 130, 140); // softcap: tanh of an infinite score is finite
                    c.causal = true, c.softcap = 5, c.alibi = 0.3f, c.mag = 2;
                    add(c, "softcap", {{'q', 50, 0, 1, inf, false}, {'k', 100, 1, 3, nan, false}});
                }
        } else if (suite == "sweep") {
            std::mt19937 r2(seed);
            auto R = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(r2); };
            for (int it = 0; it < n_sweep; ++it) {
                Cfg c = mk(8 * R(1, 32), R(0, 1), R(1, 150), R(1, 150));
                c.B = R(1, 2), c.Hk = R(1, 2), c.H = c.Hk * R(1, 2);
                const int mode = R(0, 4);
                c.causal = mode == 1 || mode == 4;
                if (mode == 2)
                    c.wl = R(0, 100), c.wr = R(-1, 30);
                if (mode == 3 || mode == 4)
                    c.wl = R(0, 60), c.wr = c.causal ? -1 : R(0, 60);
                if (R(0, 3) == 0)
                    c.softcap = 0.5f + R(0, 20) * 0.5f;
                if (R(0, 3) == 0)
                    c.alibi = R(1, 10) * 0.05f;
                if (R(0, 3) == 0)
                    c.dropout = R(1, 9) * 0.1f;
                c.pad = R(0, 3) == 0 ? 8 * R(1, 3) : 0;
                if (R(0, 4) == 0)
                    for (int b = R(1, 3); b > 0; --b) {
                        c.lq.push_back(R(0, 5) == 0 ? 0 : R(1, 150));
                        c.lk.push_back(R(0, 5) == 0 ? 0 : R(1, 150));
                    }
                cfgs.push_back(c);
            }
        } else {
            fprintf(stderr, "suites: dims features edge nonfinite | sweep SEED N\n");
            return 2;
        }
    }
    /* fa__mma_bwd_supported's refusals */
    int fails = 0;
    {
        fa__problem p;
        memset(&p, 0, sizeof p);
        alignas(16) static uint16_t buf[64];
        const fa__view ok = {buf,     FA_DTYPE_F16, 0,       64, 8, 1,
                             nullptr, nullptr,      nullptr, 0,  0, nullptr};
        p.B = 1, p.H = 2, p.Hk = 1, p.D = p.Dv = 64, p.Sq = p.Sk = 4, p.scale = 0.125f;
        p.q = p.k = p.v = p.out = p.dout = p.dq = p.dk = p.dv = ok;
        auto sup = [](const fa__problem &x, int sm) {
            return fa__mma_bwd_supported(&x, sm, emu::smem_optin(sm)) != 0;
        };
        const bool yes = sup(p, 80) && sup(p, 90) && sup(p, 86) && sup(p, 75);
        const bool volta = sup(p, 70);
        fa__problem x = p;
        x.D = x.Dv = 192;
        const bool wide = sup(x, 86) && sup(x, 120) && !sup(x, 75);  // 96 KB; Turing: stage 1
        const bool small = fa__mma_bwd_supported(&x, 90, 64 * 1024); // a GPU with less smem
        x = p, x.q.dtype = x.k.dtype = x.v.dtype = x.out.dtype = x.dout.dtype = FA_DTYPE_BF16;
        x.dq.dtype = x.dk.dtype = x.dv.dtype = FA_DTYPE_BF16;
        const bool turing_bf16 = sup(x, 75); // no bf16 tensor cores on Turing
        x = p;
        x.dropout_p = 1.0f;
        const bool drop = sup(x, 90);
        x = p, x.D = 264;
        const bool big = sup(x, 90);
        x = p, x.dk.sd = 2;
        const bool strided = sup(x, 90);
        x = p, x.dv.dtype = FA_DTYPE_BF16;
        const bool mixed = sup(x, 90);
        x = p, x.dout.data = buf + 1;
        const bool misaligned = sup(x, 90);
        const bool right = yes && !volta && wide && !small && !turing_bf16 && !drop && !big &&
                           !strided && !mixed && !misaligned;
        printf("fa__mma_bwd_supported: %s\n", right ? "ok" : "FAIL");
        fails += !right;
    }
    /* every fp16 configuration up to D = 128 also on an emulated sm_75 (Turing's kind) */
    const size_t n_listed = cfgs.size();
    for (size_t i = 0; i < n_listed; ++i)
        if (!cfgs[i].bf && cfgs[i].D <= 128) {
            Cfg c = cfgs[i];
            c.sm = 75;
            cfgs.push_back(c);
        }
    double worst[3] = {0, 0, 0};
    const auto t_all = std::chrono::steady_clock::now();
    for (const Cfg &c : cfgs) {
        printf("%s\n", describe(c).c_str());
        fflush(stdout);
        const auto t0 = std::chrono::steady_clock::now();
        const long nb = emu::g_blocks_run;
        fails += run(c, worst);
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("  %.2f s, %ld CTAs emulated\n", secs, emu::g_blocks_run - nb);
        fflush(stdout);
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count();
    printf("ldmatrix 8-lane phases: %ld, with a bank conflict: %ld\n", emu::g_ldsm_phases,
           emu::g_ldsm_conflicted);
    printf("worst error / max|ref| (max|ref| >= 1e-4): dq %.2e dk %.2e dv %.2e\n", worst[0],
           worst[1], worst[2]);
    printf("%d of %zu configurations failed; emulator errors total %ld; %.1f s\n", fails,
           cfgs.size(), emu::g_errors, secs);
    if (emu::g_ldsm_conflicted)
        printf("FAIL: ldmatrix bank conflicts\n");
    return fails != 0 || emu::g_ldsm_conflicted != 0;
}
