/* SPDX-License-Identifier: MIT */
// test_cuda_emu.cpp — runs the tensor-core forward (cuda/fwd_mma.cu) on the CPU through the
// emulator in emu.h, through its own host entry points fa__mma_supported and fa__mma_forward,
// and compares out and lse with an fp64 attention over the same fp16/bf16 inputs. Also fails on
// NaN, unwritten or stray output (out starts as a NaN sentinel, canaries around it and lse),
// and on anything the emulator reports: shared-memory races, reads of cp.async data before its
// wait, bad cp.async sources, divergent warp collectives, deadlocks. The inputs hold NaN in every
// element outside the tensors (stride padding, the tail), so a read past D or past the last row
// that reaches a product shows even where the address is mapped.
//
// fwd_mma_emu.cu is cuda/fwd_mma.cu as emu_kernel.cmake copies it at build time: the extern
// __shared__ array and the <<<>>> launch swapped for the emulator's; the rest compiled as it
// is. Suites (arguments; default: basic features edge long nonfinite f32out cache sinks): basic,
// features, edge, long, quick, nonfinite, f32out, cache, sinks, and sweep SEED N (N random
// configurations). Head dims: every kernel (kD = 32, 64, ..., 256) at its own D and at D < kD
// (zero-padded columns: 8, 40, 80, 112, 200, 248). The kD = 128 configurations (D in 97..128)
// run twice, with key blocks of 32 and of 64 (FA_CUDA_TILE_D128's two tiles); every suite first
// checks fa__mma_d128_block_n's answers. With FA_EMU_SM=75 (ctest's test_cuda_emu_kernel_sm75)
// the fp16 configurations (cache ones too) run, and only they, on an emulated sm_75: Turing's
// kind (m16n8k8, synchronous copies, its own tiles).
//
// nonfinite plants NaN and infinities in q, k and v and holds both kernels, this one and the
// stage-1 kernel (cuda/fwd_simple.cu, copied the same way; fp32/fp16/bf16), to the non-finite
// rule of docs/semantics.md; it ends with a table of kernel x dtype x case.
//
// f32out runs both kernels with an fp32 out of fp16/bf16 inputs (the forward's O / l unrounded,
// for fa_combine): each configuration runs twice, into a 16-bit out and into the fp32 one, and
// the fp32 out rounded to the dtype must equal the 16-bit out bit for bit.
//
// cache runs the kernel over KV caches read in place (contiguous with cache_batch_idx, leftpad,
// paged with pages of 1 to 256 rows; see run_cache), and checks fa__mma_supported's answers on
// cache views (check_cache_supported).
#include "emu.h"
#include "fwd_mma_emu.cu"
#include "fwd_simple_emu.cu"
#include "ref_attn.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <string>

/* A non-finite value (or a finite one) planted in q, k or v before the call: element d of row
 * `row` (varlen: the packed row) of head h in batch b. pos_col: first make column d of the other
 * operand (k for a q plant, q for a k plant) positive everywhere, so that a -Inf plant gives a
 * score of -Inf (not a NaN or +Inf from mixed signs). */
struct Plant {
    char t; // 'q', 'k' or 'v'
    int b, row, h, d;
    float val;
    bool pos_col;
};

struct Cfg {
    int B = 1, H = 2, Hk = 2, D = 64, Sq = 1, Sk = 1;
    bool bf = false, causal = false, lse = true;
    bool f32 = false;    // fp32 inputs (the stage-1 kernel only)
    bool out32 = false;  // fp32 out of fp16/bf16 inputs
    bool simple = false; // run the stage-1 kernel (fwd_simple.cu), not the tensor-core one
    int wl = -1, wr = -1;
    float softcap = 0, scale = 0, alibi = 0, mag = 1.0f;
    float sink = NAN;        // the sinks' base (ref_sinks; NaN: no sinks)
    std::vector<int> lq, lk; // varlen lengths (empty: fixed)
    int pad = 0;             // extra elements (multiple of 8) on every head and row stride
    int bn = 32;             // kD = 128: the key block (32 or 64; main runs both)
    int sm = 80;             // the device: 80 (m16n8k16), or 75 (Turing's kind, fp16 only)
    std::vector<Plant> plants;
    const char *nf_case = nullptr; // the non-finite suite's case name (table rows)
};

/* basic: every kernel, at its own D and padded; the other suites: a shorter list that still
 * reaches kD = 32, 64, 96, 128, 160, 224 and 256, two of them padded. */
static const std::vector<int> k_dims_all = {8,   32,  40,  64,  80,  96,  112,
                                            128, 160, 192, 200, 224, 248, 256};
static const std::vector<int> k_dims = {32, 64, 80, 96, 128, 160, 200, 256};

static std::mt19937 rng(1234);

static int run(const Cfg &c) {
    const bool varlen = !c.lq.empty();
    const int B = varlen ? (int)c.lq.size() : c.B;
    std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0);
    int maxq = c.Sq, maxk = c.Sk;
    if (varlen) {
        maxq = maxk = 0;
        for (int b = 0; b < B; ++b) {
            cu_q[b + 1] = cu_q[b] + c.lq[b];
            cu_k[b + 1] = cu_k[b] + c.lk[b];
            maxq = std::max(maxq, c.lq[b]);
            maxk = std::max(maxk, c.lk[b]);
        }
    }
    const int totq = varlen ? cu_q[B] : B * c.Sq, totk = varlen ? cu_k[B] : B * c.Sk;
    const int64_t D = c.D;
    auto mkview = [&](int H, int rows_per_b, int64_t &sb, int64_t &ss, int64_t &sh, size_t &n) {
        sh = D + c.pad;
        ss = H * sh + c.pad;
        sb = varlen ? 0 : rows_per_b * ss + c.pad;
        n = varlen ? (size_t)(rows_per_b)*ss + 64 : (size_t)B * sb + 64;
    };
    int64_t qsb, qss, qsh, ksb, kss, ksh, osb, oss, osh;
    size_t nq, nk, no;
    mkview(c.H, varlen ? totq : c.Sq, qsb, qss, qsh, nq);
    mkview(c.Hk, varlen ? totk : c.Sk, ksb, kss, ksh, nk);
    mkview(c.H, varlen ? totq : c.Sq, osb, oss, osh, no);
    /* Elements of es bytes: fp32, or fp16/bf16 bits. */
    const size_t es = c.f32 ? 4 : 2;
    auto alloc = [&](size_t n) { return (char *)aligned_alloc(256, ((n * es + 255) / 256) * 256); };
    char *q = alloc(nq), *k = alloc(nk), *v = alloc(nk);
    const size_t canary = 128;
    const size_t eo = c.out32 ? 4 : es; // out's element size
    char *obuf = (char *)aligned_alloc(256, (((no + 2 * canary) * eo + 255) / 256) * 256);
    char *o = obuf + canary * eo;
    auto bits = [&](const char *x, size_t i) -> uint32_t {
        if (c.f32) {
            uint32_t u;
            memcpy(&u, x + 4 * i, 4);
            return u;
        }
        return ((const uint16_t *)x)[i];
    };
    auto set_bits = [&](char *x, size_t i, uint32_t u) {
        if (c.f32)
            memcpy(x + 4 * i, &u, 4);
        else
            ((uint16_t *)x)[i] = (uint16_t)u;
    };
    auto cvt = [&](float x) -> uint32_t {
        uint32_t u;
        memcpy(&u, &x, 4);
        return c.f32 ? u : c.bf ? emu::f2bf(x) : emu::f2h(x);
    };
    auto put = [&](char *x, size_t i, float f) { set_bits(x, i, cvt(f)); };
    auto get = [&](const char *x, size_t i) -> double {
        const uint32_t u = bits(x, i);
        float f;
        memcpy(&f, &u, 4);
        return c.f32 ? (double)f : (double)(c.bf ? emu::bf2f((uint16_t)u) : emu::h2f((uint16_t)u));
    };
    /* out's elements: fp32 bits when c.out32, else as the inputs' */
    auto obits = [&](const char *x, size_t i) -> uint32_t {
        if (!c.out32)
            return bits(x, i);
        uint32_t u;
        memcpy(&u, x + 4 * i, 4);
        return u;
    };
    auto oget = [&](const char *x, size_t i) -> double {
        if (!c.out32)
            return get(x, i);
        float f;
        memcpy(&f, x + 4 * i, 4);
        return f;
    };
    std::uniform_real_distribution<float> U(-1, 1);
    for (size_t i = 0; i < nq; ++i)
        put(q, i, U(rng) * c.mag);
    for (size_t i = 0; i < nk; ++i)
        put(k, i, U(rng) * c.mag), put(v, i, U(rng));
    /* NaN in every element outside the tensors (stride padding, the tail): a kernel that reads
     * one into a product (columns past D, rows past the end) gets NaN, not a finite error. */
    const uint32_t gap_nan = c.f32 ? 0x7fc00000u : c.bf ? 0x7fc0u : 0x7e00u;
    auto poison_gaps = [&](char *x, size_t n, int H, int rows_per_b, int64_t sb, int64_t ss,
                           int64_t sh) {
        std::vector<char> used(n, 0);
        for (int b = 0; b < (varlen ? 1 : B); ++b)
            for (int r = 0; r < rows_per_b; ++r)
                for (int h = 0; h < H; ++h)
                    memset(&used[b * sb + r * ss + h * sh], 1, (size_t)D);
        for (size_t i = 0; i < n; ++i)
            if (!used[i])
                set_bits(x, i, gap_nan);
    };
    poison_gaps(q, nq, c.H, varlen ? totq : c.Sq, qsb, qss, qsh);
    poison_gaps(k, nk, c.Hk, varlen ? totk : c.Sk, ksb, kss, ksh);
    poison_gaps(v, nk, c.Hk, varlen ? totk : c.Sk, ksb, kss, ksh);
    for (const Plant &pl : c.plants) {
        char *x = pl.t == 'q' ? q : pl.t == 'k' ? k : v;
        const int64_t sb = pl.t == 'q' ? qsb : ksb, ss = pl.t == 'q' ? qss : kss,
                      sh = pl.t == 'q' ? qsh : ksh;
        if (pl.pos_col) { // column d of the other operand positive, in every row and head
            char *y = pl.t == 'q' ? k : q;
            const int64_t ysb = pl.t == 'q' ? ksb : qsb, yss = pl.t == 'q' ? kss : qss,
                          ysh = pl.t == 'q' ? ksh : qsh;
            const int rows = pl.t == 'q' ? (varlen ? totk : c.Sk) : (varlen ? totq : c.Sq);
            const int heads = pl.t == 'q' ? c.Hk : c.H;
            for (int b = 0; b < (varlen ? 1 : B); ++b)
                for (int r = 0; r < rows; ++r)
                    for (int h = 0; h < heads; ++h) {
                        const size_t at = b * ysb + r * yss + h * ysh + pl.d;
                        put(y, at, 0.125f + (float)fabs(get(y, at)));
                    }
        }
        put(x, pl.b * sb + (int64_t)pl.row * ss + pl.h * sh + pl.d, pl.val);
    }
    const uint32_t sentinel = c.f32 ? 0x7fc00001u : c.bf ? 0x7fc1u : 0x7e01u;
    const uint32_t osentinel = c.out32 ? 0x7fc00001u : sentinel;
    for (size_t i = 0; i < no + 2 * canary; ++i)
        if (c.out32)
            memcpy(obuf + 4 * i, &osentinel, 4);
        else
            set_bits(obuf, i, sentinel);
    std::vector<char> o16(c.out32 ? no * es : 0); // out32: the 16-bit out of the same call
    // lse: [B, H, Sq] or varlen [H, total_q]; canaries around
    const size_t nl = (size_t)c.H * (varlen ? totq : B * c.Sq);
    std::vector<float> lbuf(nl + 64, NAN);
    float *lse = lbuf.data() + 32;
    /* lse's NaN poison: a NaN the kernel writes (its non-finite rows) is another NaN */
    {
        const uint32_t poison = 0x7fc0dead;
        for (auto &x : lbuf)
            memcpy(&x, &poison, 4);
    }
    auto lse_untouched = [](float x) {
        uint32_t u;
        memcpy(&u, &x, 4);
        return u == 0x7fc0deadu;
    };
    std::vector<float> slopes(B * c.H);
    for (int i = 0; i < B * c.H; ++i)
        slopes[i] = c.alibi * (0.5f + (float)(i % 7) / 7.0f);

    emu::g_bufs.clear();
    emu::register_global(q, nq * es);
    emu::register_global(k, nk * es);
    emu::register_global(v, nk * es);

    fa__problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.H = c.H, p.Hk = c.Hk, p.D = p.Dv = D, p.Sq = maxq, p.Sk = maxk;
    p.cu_q = varlen ? cu_q.data() : nullptr;
    p.cu_k = varlen ? cu_k.data() : nullptr;
    p.total_q = totq, p.total_k = totk;
    const int32_t dt = c.f32 ? FA_DTYPE_F32 : c.bf ? FA_DTYPE_BF16 : FA_DTYPE_F16;
    p.q = fa__view{q, dt, qsb, qss, qsh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    p.k = fa__view{k, dt, ksb, kss, ksh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    p.v = fa__view{v, dt, ksb, kss, ksh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    p.out = fa__view{
        c.out32 ? o16.data() : o, dt, osb, oss, osh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    p.lse = c.lse ? lse : nullptr;
    if (varlen)
        p.lse_sb = 0, p.lse_sh = totq, p.lse_ss = 1;
    else
        p.lse_sb = (int64_t)c.H * c.Sq, p.lse_sh = c.Sq, p.lse_ss = 1;
    p.scale = c.scale > 0 ? c.scale : 1.0f / sqrtf((float)D);
    ref_set_options(p, c.causal, c.wl, c.wr, c.softcap, c.alibi != 0 ? slopes.data() : nullptr);
    const std::vector<float> sinks = ref_sinks(c.sink, c.H);
    p.sinks = sinks.empty() ? nullptr : sinks.data(), p.sinks_sh = 1;
    const long err0 = emu::g_errors;
    for (int pass = 0; pass < (c.out32 ? 2 : 1); ++pass) { // out32: the 16-bit out, then fp32
        if (pass == 1)
            p.out.data = o, p.out.dtype = FA_DTYPE_F32;
        if (c.simple) {
            fa__simple_forward(&p, p.cu_q, p.cu_k, nullptr);
        } else {
            emu::g_sm = c.sm;
            const int ok = fa__mma_supported(&p, c.sm, emu::smem_optin(c.sm));
            if (ok)
                fa__mma_forward(&p, c.sm, c.bn, p.cu_q, p.cu_k, nullptr);
            emu::g_sm = 90;
            if (!ok) {
                printf("  not supported by fa__mma_supported\n");
                return 1;
            }
        }
    }

    /* The reference, in fp64 on the same inputs, under the non-finite rule (ref_attn_row). Where
     * it is not finite, out and lse must be the same (NaN, or the same infinity). */
    double max_err = 0, max_lse_err = 0;
    long bad_nan = 0, unwritten = 0, n_rows = 0, bad_class = 0, bad_round = 0;
    long rows_finite = 0, rows_nonfinite = 0; // by what the reference expects of them
    std::vector<char> expect(no, 0);
    std::vector<double> qv(D), ro(D);
    for (int b = 0; b < B; ++b) {
        const int rq = varlen ? cu_q[b] : 0, rk = varlen ? cu_k[b] : 0;
        const int sq = varlen ? cu_q[b + 1] - rq : c.Sq, sk = varlen ? cu_k[b + 1] - rk : c.Sk;
        const int64_t k0 = b * ksb + (int64_t)rk * kss; // key 0 of batch b
        for (int h = 0; h < c.H; ++h) {
            const int64_t kh = k0 + (h / (c.H / c.Hk)) * ksh;
            auto kf = [&](int64_t j, int e) { return get(k, kh + j * kss + e); };
            auto vf = [&](int64_t j, int e) { return get(v, kh + j * kss + e); };
            const double slope = p.alibi ? slopes[b * c.H + h] : 0;
            for (int i = 0; i < sq; ++i) {
                n_rows++;
                const int64_t qrow = b * qsb + (int64_t)(rq + i) * qss + h * qsh;
                for (int e = 0; e < D; ++e)
                    qv[e] = get(q, qrow + e);
                const RefRow r =
                    ref_row(D, i, sq, sk, p.window_left, p.window_right, p.scale, c.softcap, slope);
                double ref_lse = ref_attn_row(r, qv.data(), kf, vf, ro.data());
                if (p.sinks && sinks[h] != -INFINITY)
                    ref_lse = ref_sink(ref_lse, sinks[h], D, ro.data());
                const int64_t orow = b * osb + (int64_t)(rq + i) * oss + h * osh;
                bool row_finite = true;
                for (int x = 0; x < D; ++x) {
                    expect[orow + x] = 1;
                    const double ref = ro[x];
                    row_finite = row_finite && std::isfinite(ref);
                    if (obits(o, orow + x) == osentinel) {
                        if (unwritten++ < 5)
                            printf("  unwritten out: b %d h %d i %d d %d\n", b, h, i, x);
                        continue;
                    }
                    const double gv = oget(o, orow + x);
                    if (c.out32) { // rounded to the dtype: the 16-bit out, NaN for NaN
                        const uint32_t rd = cvt((float)gv), r16 = bits(o16.data(), orow + x);
                        const bool nans = std::isnan(gv) && std::isnan(get(o16.data(), orow + x));
                        if (rd != r16 && !nans && bad_round++ < 5)
                            printf("  fp32 out %.9g rounds to %#x, 16-bit out %#x: b %d h %d i "
                                   "%d d %d\n",
                                   gv, rd, r16, b, h, i, x);
                    }
                    if (!std::isfinite(ref) || !std::isfinite(gv)) {
                        const bool same = std::isnan(ref) ? std::isnan(gv) : gv == ref;
                        if (same)
                            continue;
                        if (std::isnan(gv) && std::isfinite(ref)) {
                            if (bad_nan++ < 5)
                                printf("  NaN out: b %d h %d i %d d %d (ref %g)\n", b, h, i, x,
                                       ref);
                        } else if (bad_class++ < 5) {
                            printf("  non-finite mismatch: b %d h %d i %d d %d got %g ref %g\n", b,
                                   h, i, x, gv, ref);
                        }
                        continue;
                    }
                    const double err = fabs(gv - ref);
                    if (err > max_err)
                        max_err = err;
                    if (err > 2.0 * ldexp(1.0, c.bf ? -9 : -12) && max_err == err)
                        printf("  big err: b %d h %d i %d d %d got %g ref %g\n", b, h, i, x, gv,
                               ref);
                }
                (row_finite ? rows_finite : rows_nonfinite)++;
                if (c.lse) {
                    const float got =
                        lse[b * p.lse_sb + h * p.lse_sh + (int64_t)(rq + i) * p.lse_ss];
                    double e;
                    if (std::isnan(ref_lse))
                        e = std::isnan(got) && !lse_untouched(got) ? 0 : INFINITY;
                    else if (ref_lse == -INFINITY)
                        e = got == -INFINITY ? 0 : INFINITY;
                    else
                        e = std::isnan(got) ? INFINITY : fabs(got - ref_lse);
                    if (e > max_lse_err) {
                        max_lse_err = e;
                        if (e > 1e-3)
                            printf("  lse err: b %d h %d i %d got %g ref %g\n", b, h, i, got,
                                   ref_lse);
                    }
                }
            }
        }
    }
    long stray = 0, canary_bad = 0;
    for (size_t i = 0; i < no; ++i)
        if (!expect[i] && obits(o, i) != osentinel)
            stray++;
    for (size_t i = 0; i < canary; ++i)
        canary_bad += (obits(obuf, i) != osentinel) + (obits(o, no + i) != osentinel);
    long lse_stray = 0;
    if (c.lse) {
        // positions the kernel may write: rows inside sequences
        std::vector<char> le(nl, 0);
        for (int b = 0; b < B; ++b) {
            const int rq = varlen ? cu_q[b] : 0, sq = varlen ? cu_q[b + 1] - rq : c.Sq;
            for (int h = 0; h < c.H; ++h)
                for (int i = 0; i < sq; ++i)
                    le[b * p.lse_sb + h * p.lse_sh + (rq + i) * p.lse_ss] = 1;
        }
        for (size_t i = 0; i < nl; ++i)
            if (!le[i] && !lse_untouched(lse[i]))
                lse_stray++;
        for (int i = 0; i < 32; ++i)
            lse_stray += !lse_untouched(lbuf[i]) + !lse_untouched(lbuf[32 + nl + i]);
    } else {
        for (auto x : lbuf)
            lse_stray += !lse_untouched(x);
    }
    const long emu_errs = emu::g_errors - err0;
    /* |v| <= 1, so |out| <= 1: rounding out to the dtype costs at most half an ulp at 1 (u), and
     * P rounded to the dtype for the PV product at most u * sum(p |v|) / l <= u again; 1e-5 for
     * the fp32 sums. u = 2^-9 (bf16), 2^-12 (fp16), 0 (fp32 inputs). An fp32 out of 16-bit
     * inputs has no rounding of its own: u for P alone. */
    const double u = c.f32 ? 0.0 : ldexp(1.0, c.bf ? -9 : -12);
    const double tol = (c.out32 ? u : 2.0 * u) + 1e-5;
    /* A planted configuration must check both directions: rows the rule makes non-finite and
     * rows that must come out finite. */
    const bool one_sided = !c.plants.empty() && (rows_finite == 0 || rows_nonfinite == 0);
    const bool fail = bad_nan || bad_class || unwritten || stray || canary_bad || lse_stray ||
                      bad_round || emu_errs || max_err > tol || max_lse_err > 2e-3 || one_sided;
    printf("  rows %ld (non-finite %ld)  max|out-ref| %.3e  max|lse-ref| %.3e  NaN %ld "
           "non-finite mismatch %ld unwritten %ld stray %ld canary %ld lse_stray %ld "
           "emu_errors %ld%s%s  => %s\n",
           n_rows, rows_nonfinite, max_err, max_lse_err, bad_nan, bad_class, unwritten, stray,
           canary_bad, lse_stray, emu_errs, one_sided ? " ONE-SIDED" : "",
           c.out32 ? (" fp32 out, rounding mismatches " + std::to_string(bad_round)).c_str() : "",
           fail ? "FAIL" : "ok");
    free(q), free(k), free(v), free(obuf);
    return fail;
}

static std::string describe(const Cfg &c) {
    char buf[512];
    std::string vl;
    if (!c.lq.empty()) {
        vl = " varlen q/k=";
        for (size_t i = 0; i < c.lq.size(); ++i)
            vl += std::to_string(c.lq[i]) + "/" + std::to_string(c.lk[i]) + ",";
    }
    snprintf(buf, sizeof buf,
             "%s D=%d B=%d H=%d Hk=%d Sq=%d Sk=%d causal=%d wl=%d wr=%d softcap=%g alibi=%g lse=%d "
             "pad=%d mag=%g scale=%g sink=%g%s%s%s",
             c.f32  ? "fp32"
             : c.bf ? "bf16"
                    : "fp16",
             c.D, c.B, c.H, c.Hk, c.Sq, c.Sk, c.causal, c.wl, c.wr, c.softcap, c.alibi, c.lse,
             c.pad, c.mag, c.scale, c.sink, vl.c_str(), c.out32 ? " out=fp32" : "",
             c.simple                ? " stage-1"
             : c.sm == 75            ? " sm_75 (m16n8k8)"
             : fa_mma_kd(c.D) == 128 ? (c.bn == 64 ? " tile=128x64" : " tile=128x32")
                                     : "");
    std::string r = buf;
    if (c.nf_case)
        r += std::string(" case=") + c.nf_case;
    for (const Plant &pl : c.plants) {
        snprintf(buf, sizeof buf, " %c[b%d,%d,h%d,d%d]=%g%s", pl.t, pl.b, pl.row, pl.h, pl.d,
                 pl.val, pl.pos_col ? "(+col)" : "");
        r += buf;
    }
    return r;
}

/* fa__mma_d128_block_n: FA_CUDA_TILE_D128's two names, the default by compute capability (64
 * keys from sm_90 on), and 0 for anything else. Returns the number of wrong answers. */
static int check_tile_names() {
    static const struct {
        const char *tile;
        int sm, block_n;
    } cases[] = {{nullptr, 90, 64},  {"", 100, 64},      {nullptr, 89, 32},  {"", 80, 32},
                 {"128x32", 90, 32}, {"128x64", 80, 64}, {"128x64", 90, 64}, {"128x48", 90, 0},
                 {"128X64", 90, 0},  {"128x64 ", 80, 0}, {"64", 90, 0}};
    int wrong = 0;
    for (const auto &c : cases) {
        const int got = fa__mma_d128_block_n(c.tile, c.sm);
        if (got != c.block_n) {
            printf("FAIL: fa__mma_d128_block_n(%s, %d) = %d, expected %d\n",
                   c.tile ? c.tile : "NULL", c.sm, got, c.block_n);
            wrong++;
        }
    }
    return wrong;
}

/* The non-finite suite: values planted in q, k and v (see Plant) under the rule of
 * docs/semantics.md, for the tensor-core kernel (fp16/bf16, kD = 32, 64, 96, 128 with both key
 * blocks, 256) and the stage-1 kernel (fp32/fp16/bf16). Each case plants several values, at
 * keys some rows see and others do not (the causal diagonal, window edges, varlen sequences,
 * a partial last key block), so that every run checks both directions: the rows the rule
 * names come out non-finite as the reference says, and every other row, including rows whose
 * key blocks hold the planted keys, matches the reference as if they were finite. */
static void add_nonfinite(std::vector<Cfg> &cfgs) {
    const float inf = INFINITY, nan = NAN;
    struct Kern {
        bool simple;
        std::vector<int> dims;
        std::vector<int> dtypes; // 0 fp16, 1 bf16, 2 fp32
    };
    const Kern kerns[] = {{false, {32, 64, 96, 128, 256}, {0, 1}}, {true, {8, 64, 128}, {2, 0, 1}}};
    for (const Kern &kn : kerns)
        for (int D : kn.dims)
            for (int dtc : kn.dtypes) {
                Cfg c0;
                c0.D = D, c0.simple = kn.simple, c0.bf = dtc == 1, c0.f32 = dtc == 2;
                auto add = [&](Cfg c, const char *name, std::vector<Plant> pl) {
                    c.nf_case = name;
                    c.plants = std::move(pl);
                    cfgs.push_back(c);
                };
                /* q: NaN; +Inf; -Inf with the keys' column positive (every score -Inf: a
                 * fully masked row); -Inf against mixed signs */
                Cfg c = c0;
                c.Sq = c.Sk = 130, c.H = 2, c.Hk = 1;
                add(c, "q",
                    {{'q', 0, 3, 0, 1, nan, false},
                     {'q', 0, 70, 1, 2, inf, false},
                     {'q', 0, 100, 0, 0, -inf, true},
                     {'q', 0, 129, 1, 5, -inf, false}});
                /* k, causal: rows from the planted key on see it, the rows before do not. Key
                 * 50 scores -Inf (weight 0) and its v is +Inf: 0 times +Inf is NaN. */
                c = c0;
                c.Sq = c.Sk = 130, c.H = 2, c.Hk = 1, c.causal = true;
                add(c, "k",
                    {{'k', 0, 100, 0, 3, nan, false},
                     {'k', 0, 120, 0, 4, inf, false},
                     {'k', 0, 50, 0, 6, -inf, true},
                     {'v', 0, 50, 0, 2, inf, false}});
                /* v, causal */
                c = c0;
                c.Sq = c.Sk = 130, c.H = 2, c.Hk = 2, c.causal = true;
                add(c, "v",
                    {{'v', 0, 30, 0, 1, nan, false},
                     {'v', 0, 90, 0, 2, inf, false},
                     {'v', 0, 129, 1, 7, -inf, false}});
                /* both edges of a sliding window: row i sees keys i .. i + 57 */
                c = c0;
                c.Sq = 260, c.Sk = 300, c.wl = 40, c.wr = 17;
                add(c, "window",
                    {{'k', 0, 150, 0, 0, nan, false},
                     {'v', 0, 200, 1, 3, inf, false},
                     {'v', 0, 60, 0, 5, nan, false}});
                /* varlen, causal (packed key rows): sequence 0's last key (seen by its row 4
                 * only), sequence 1's key 100 (its rows >= 101) and its last key (its row 129),
                 * sequence 2's first key (all its rows), just past sequence 1's last block */
                c = c0;
                c.lq = {5, 130, 64}, c.lk = {9, 129, 70}, c.causal = true, c.Hk = 1;
                add(c, "varlen",
                    {{'v', 0, 8, 0, 0, nan, false},
                     {'k', 0, 9 + 100, 0, 1, nan, false},
                     {'v', 0, 9 + 128, 0, 2, inf, false},
                     {'v', 0, 9 + 129, 0, 3, nan, false}});
                /* a partial last key block (Sk = 200), causal: row i sees keys <= i + 123 */
                c = c0;
                c.Sq = 77, c.Sk = 200, c.causal = true;
                add(c, "partial",
                    {{'k', 0, 199, 0, 2, nan, false},
                     {'v', 0, 150, 0, 1, nan, false},
                     {'v', 0, 190, 1, 4, -inf, false}});
                /* softcap (tanh of an infinite score is finite) and ALiBi, causal */
                c = c0;
                c.Sq = c.Sk = 140, c.causal = true, c.softcap = 5, c.alibi = 0.3f, c.mag = 2;
                add(c, "softcap",
                    {{'q', 0, 50, 0, 1, inf, false},
                     {'k', 0, 100, 1, 3, nan, false},
                     {'v', 0, 120, 0, 0, inf, false}});
            }
}

/* The sinks suite: attention sinks (ref_sinks: a head without one among them) on both kernels,
 * fixed and varlen, causal and not, GQA, windows that leave rows without a visible key (out = 0,
 * lse = the sink), softcap and ALiBi, an fp32 out. */
static void add_sinks(std::vector<Cfg> &cfgs) {
    for (int simple : {0, 1})
        for (int D : {64, 128, 256})
            for (int bf : {0, 1}) {
                Cfg c;
                c.simple = simple, c.D = D, c.bf = bf, c.sink = 1.5f;
                c.Sq = 90, c.Sk = 130, c.H = 6, c.Hk = 2, c.causal = true; // GQA, causal
                cfgs.push_back(c);
                c.causal = false, c.Sq = 40, c.Sk = 70, c.sink = -2.0f;
                cfgs.push_back(c);
                c.Sq = 100, c.Sk = 60, c.wl = 3, c.wr = 0, c.sink = 4.0f; // rows with no key
                c.H = 3, c.Hk = 3;
                cfgs.push_back(c);
                c.wl = c.wr = -1, c.causal = true, c.sink = 2.0f, c.softcap = 4, c.alibi = 0.2f;
                c.lq = {0, 37, 70, 5}, c.lk = {9, 50, 40, 120}; // varlen, empty sequence
                cfgs.push_back(c);
            }
    Cfg c;
    c.D = 128, c.bf = true, c.out32 = true, c.sink = 3.0f, c.Sq = 70, c.Sk = 140, c.H = 3;
    c.Hk = 1, c.causal = true;
    cfgs.push_back(c);
    c.simple = true, c.f32 = true, c.out32 = false, c.bf = false;
    cfgs.push_back(c);
}

/* The f32out suite: fp32 out of fp16/bf16 inputs (by turns) on the tensor-core kernel (every kD
 * from 32 to 256 but 160 and 192, D = 80 and 200 padded to 96 and 224: only the columns below D
 * stored) under GQA with causal, varlen, a sliding window, softcap, ALiBi, padded strides, rows
 * that see no key, Sk = 0 and a V with an infinity at a band's edge (the exact row path), and on
 * the stage-1 kernel. */
static void add_f32out(std::vector<Cfg> &cfgs) {
    bool bf16 = false; // bf16 and fp16 by turns: the store does not depend on the dtype
    for (int D : {32, 64, 80, 128, 200, 256}) {
        bf16 = !bf16;
        Cfg c0;
        c0.D = D, c0.bf = bf16, c0.out32 = true;
        Cfg c = c0;
        c.Sq = 150, c.Sk = 170, c.H = 4, c.Hk = 2, c.causal = true; // GQA + causal
        cfgs.push_back(c);
        c = c0;
        c.lq = {5, 0, 130, 64}, c.lk = {9, 4, 129, 0}, c.causal = true, c.Hk = 1; // varlen
        cfgs.push_back(c);
        c = c0;
        c.Sq = 140, c.Sk = 160, c.wl = 40, c.wr = 17, c.softcap = 5, c.mag = 2, c.pad = 8;
        cfgs.push_back(c);
        c = c0;
        c.Sq = 140, c.Sk = 160, c.alibi = 0.3f, c.causal = true, c.lse = false;
        cfgs.push_back(c);
        c = c0;
        c.Sq = 300, c.Sk = 40, c.causal = true; // rows that see no key
        cfgs.push_back(c);
        c = c0;
        c.Sq = 5, c.Sk = 0;
        cfgs.push_back(c);
        c = c0;
        c.Sq = c.Sk = 130, c.causal = true;
        c.plants = {{'v', 0, 90, 0, 2, INFINITY, false}}; // rows >= 90 see it
        cfgs.push_back(c);
    }
    for (int D : {8, 64, 128})
        for (int bf : {0, 1}) {
            Cfg c;
            c.D = D, c.bf = bf, c.out32 = true, c.simple = true;
            c.Sq = 70, c.Sk = 90, c.H = 4, c.Hk = 2, c.causal = true, c.alibi = 0.2f;
            cfgs.push_back(c);
            c.lq = {5, 0, 60}, c.lk = {9, 4, 70}, c.alibi = 0;
            cfgs.push_back(c);
        }
}

/* ---- cache: the kernel over KV caches read in place (fa_forward_kvcache's attention) ----
 * B = 3 batches with seqlens_k[b] keys each, K and V in one of these layouts:
 *   'c' contiguous, B_cache = B + 2 rows, cache_batch_idx naming them out of order
 *   'l' contiguous, each batch's keys from its own leftpad on (cache_leftpad)
 *   'b' both
 *   'p' paged, `page` rows a page, a shuffled block table
 *   'q' paged with leftpad
 * Every cache element that is not one of a batch's keys (the rows before leftpad and from
 * leftpad + seqlens_k on, unused pages, stride padding) is NaN, and so are the spare pages the
 * block table names past a batch's last one: a row read from the wrong place shows. K and V have
 * different strides. The fp64 reference reads each batch's keys from plain arrays, from which
 * the caches were filled, never from the caches. nan_v plants a NaN in V at batch 1's last key
 * (causal: only its last row sees it, whose column 3 must be NaN; the other rows must not be,
 * which the kernel's exact row path guarantees). */
struct CacheCfg {
    int D = 64, G = 1, Sq = 1, bn = 32, page = 16, sm = 80;
    bool bf = false, causal = false, lse = true;
    bool nan_v = false; // V NaN at batch 1's last key, head 0, column 3
    char layout = 'c';
    std::vector<int> sk = {0, 65, 700};
    int wl = -1, wr = -1;
    float softcap = 0, alibi = 0;
};

static std::string describe_cache(const CacheCfg &c) {
    char buf[256];
    snprintf(buf, sizeof buf,
             "cache %s D=%d G=%d Sq=%d sk=%d,%d,%d layout=%c page=%d causal=%d wl=%d wr=%d "
             "softcap=%g alibi=%g lse=%d%s%s",
             c.bf ? "bf16" : "fp16", c.D, c.G, c.Sq, c.sk[0], c.sk[1], c.sk[2], c.layout,
             c.layout == 'p' || c.layout == 'q' ? c.page : 0, c.causal, c.wl, c.wr, c.softcap,
             c.alibi, c.lse, c.nan_v ? " nan_v" : "",
             c.sm == 75              ? " sm_75 (m16n8k8)"
             : fa_mma_kd(c.D) != 128 ? ""
             : c.bn == 64            ? " tile=128x64"
                                     : " tile=128x32");
    return buf;
}

static int run_cache(const CacheCfg &c) {
    const int B = 3, Hk = 2, H = Hk * c.G, D = c.D, Sq = c.Sq;
    const bool paged = c.layout == 'p' || c.layout == 'q';
    const bool leftpad = c.layout == 'l' || c.layout == 'b' || c.layout == 'q';
    const bool bidx = c.layout == 'c' || c.layout == 'b';
    const uint16_t nan16 = c.bf ? 0x7fc0 : 0x7e00;
    auto cvt = [&](float x) -> uint16_t { return c.bf ? emu::f2bf(x) : emu::f2h(x); };
    auto val = [&](uint16_t u) -> double { return c.bf ? emu::bf2f(u) : emu::h2f(u); };
    std::uniform_real_distribution<float> U(-1, 1);

    /* The keys and values of batch b, plain: kv[b][(j * Hk + hk) * D + d], as dtype bits */
    std::vector<std::vector<uint16_t>> kp(B), vp(B);
    for (int b = 0; b < B; ++b) {
        kp[b].resize((size_t)c.sk[b] * Hk * D), vp[b].resize((size_t)c.sk[b] * Hk * D);
        for (size_t i = 0; i < kp[b].size(); ++i)
            kp[b][i] = cvt(U(rng)), vp[b][i] = cvt(U(rng));
    }
    if (c.nan_v && c.sk[1] > 0)
        vp[1][((size_t)(c.sk[1] - 1) * Hk + 0) * D + 3] = nan16;
    std::vector<int32_t> lp(B, 0), seqlens(c.sk.begin(), c.sk.end());
    for (int b = 0; b < B; ++b)
        lp[b] = leftpad ? std::uniform_int_distribution<int>(0, 40)(rng) : 0;

    /* The caches' first dimension: rows of the batches (contiguous) or pages, and where each
     * batch's cache row r lives: first-dimension entry, row in it */
    int n_first, rows_per; // entries of the first dimension, rows in each
    std::vector<int32_t> batch_idx(B), table;
    int64_t bt_stride = 0;
    if (paged) {
        rows_per = c.page;
        std::vector<int> need(B);
        int total = 0, maxp = 0;
        for (int b = 0; b < B; ++b) {
            need[b] = (lp[b] + c.sk[b] + c.page - 1) / c.page;
            total += need[b], maxp = std::max(maxp, need[b]);
        }
        const int spare = 3;
        n_first = total + spare;
        std::vector<int32_t> perm(n_first);
        for (int i = 0; i < n_first; ++i)
            perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        bt_stride = maxp + 2;
        table.assign((size_t)B * bt_stride, 0);
        int next = 0;
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < bt_stride; ++i) // past the batch's pages: a spare (NaN) page
                table[b * bt_stride + i] = i < need[b] ? perm[next++] : perm[total + i % spare];
    } else {
        int rows = 1;
        for (int b = 0; b < B; ++b)
            rows = std::max(rows, lp[b] + c.sk[b]);
        rows_per = rows + 5;
        n_first = B + 2;
        const int32_t order[B] = {3, 0, 4}; // rows 1 and 2 stay NaN
        for (int b = 0; b < B; ++b)
            batch_idx[b] = bidx ? order[b] : b;
    }
    auto place = [&](int b, int r, int &first, int &row) {
        if (paged)
            first = table[b * bt_stride + r / c.page], row = r % c.page;
        else
            first = batch_idx[b], row = r;
    };
    /* K and V: element (first, row, hk, d) at first*sb + row*ss + hk*sh + d; v padded more */
    struct Cache {
        int64_t sb, ss, sh;
        size_t n;
        uint16_t *data;
    } kc, vc;
    for (int w = 0; w < 2; ++w) {
        Cache &x = w ? vc : kc;
        const int pad = 8 * (w + 1);
        x.sh = D + pad, x.ss = Hk * x.sh + pad, x.sb = rows_per * x.ss + pad;
        x.n = (size_t)n_first * x.sb + 64;
        x.data = (uint16_t *)aligned_alloc(256, (x.n * 2 + 255) / 256 * 256);
        for (size_t i = 0; i < x.n; ++i)
            x.data[i] = nan16;
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < c.sk[b]; ++j) {
                int first, row;
                place(b, lp[b] + j, first, row);
                for (int hk = 0; hk < Hk; ++hk)
                    memcpy(x.data + first * x.sb + row * x.ss + hk * x.sh,
                           (w ? vp : kp)[b].data() + ((size_t)j * Hk + hk) * D, 2 * (size_t)D);
            }
    }
    const std::vector<uint16_t> k_copy(kc.data, kc.data + kc.n), v_copy(vc.data, vc.data + vc.n);

    /* q, out: [B, Sq, H, D] padded by 8; out NaN-sentinel with canaries; lse: [B, H, Sq] */
    const int64_t qsh = D + 8, qss = H * qsh + 8, qsb = Sq * qss + 8;
    const size_t nq = (size_t)B * qsb + 64, canary = 128;
    std::vector<uint16_t> q(nq, nan16), obuf(nq + 2 * canary);
    for (int b = 0; b < B; ++b)
        for (int i = 0; i < Sq; ++i)
            for (int h = 0; h < H; ++h)
                for (int d = 0; d < D; ++d)
                    q[b * qsb + i * qss + h * qsh + d] = cvt(U(rng));
    const uint16_t sentinel = c.bf ? 0x7fc1 : 0x7e01;
    std::fill(obuf.begin(), obuf.end(), sentinel);
    uint16_t *o = obuf.data() + canary;
    const uint32_t poison = 0x7fc0dead;
    std::vector<uint32_t> lbuf((size_t)B * H * Sq + 64, poison);
    float *lse = (float *)(lbuf.data() + 32);
    std::vector<float> slopes(B * H);
    for (int i = 0; i < B * H; ++i)
        slopes[i] = c.alibi * (0.5f + (float)(i % 7) / 7.0f);

    emu::g_bufs.clear();
    emu::register_global(q.data(), nq * 2);
    emu::register_global(kc.data, kc.n * 2);
    emu::register_global(vc.data, vc.n * 2);

    fa__problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.H = H, p.Hk = Hk, p.D = p.Dv = D, p.Sq = Sq, p.Sk = 0;
    p.seqlens_k = seqlens.data();
    const int32_t dt = c.bf ? FA_DTYPE_BF16 : FA_DTYPE_F16;
    p.q = fa__view{q.data(), dt, qsb, qss, qsh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    p.out = fa__view{o, dt, qsb, qss, qsh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    for (int w = 0; w < 2; ++w) {
        const Cache &x = w ? vc : kc;
        fa__view cv{x.data,  dt,      x.sb,    x.ss,      x.sh, 1,
                    nullptr, nullptr, nullptr, bt_stride, 0,    nullptr};
        cv.row_off = leftpad ? lp.data() : nullptr;
        cv.block_table = paged ? table.data() : nullptr;
        cv.batch_idx = bidx ? batch_idx.data() : nullptr;
        cv.page = paged ? c.page : 0;
        (w ? p.v : p.k) = cv;
    }
    p.lse = c.lse ? lse : nullptr;
    p.lse_sb = (int64_t)H * Sq, p.lse_sh = Sq, p.lse_ss = 1;
    p.scale = 1.0f / sqrtf((float)D);
    ref_set_options(p, c.causal, c.wl, c.wr, c.softcap, c.alibi != 0 ? slopes.data() : nullptr);
    const long err0 = emu::g_errors;
    emu::g_sm = c.sm;
    const int ok = fa__mma_supported(&p, c.sm, emu::smem_optin(c.sm));
    if (ok)
        fa__mma_forward(&p, c.sm, c.bn, nullptr, nullptr, nullptr);
    emu::g_sm = 90;
    if (!ok) {
        printf("  not supported by fa__mma_supported\n");
        return 1;
    }

    /* |v| <= 1: out rounded to the dtype and P rounded for P V, half an ulp at 1 each (as run) */
    const double tol = 2.0 * ldexp(1.0, c.bf ? -9 : -12) + 1e-5;
    double max_err = 0, max_lse_err = 0;
    long bad = 0, unwritten = 0, n_nan = 0; // n_nan: out elements the reference makes NaN
    std::vector<double> qv(D), ro(D);
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < H; ++h) {
            const int hk = h / c.G;
            /* the plain arrays; the scores are finite (q and k are), so the rule only passes on
             * nan_v's NaN */
            auto kf = [&](int64_t j, int e) { return val(kp[b][((size_t)j * Hk + hk) * D + e]); };
            auto vf = [&](int64_t j, int e) { return val(vp[b][((size_t)j * Hk + hk) * D + e]); };
            const double slope = p.alibi ? slopes[b * H + h] : 0;
            for (int i = 0; i < Sq; ++i) {
                const uint16_t *qr = q.data() + b * qsb + i * qss + h * qsh;
                for (int e = 0; e < D; ++e)
                    qv[e] = val(qr[e]);
                const RefRow r = ref_row(D, i, Sq, c.sk[b], p.window_left, p.window_right, p.scale,
                                         c.softcap, slope);
                const double ref_lse = ref_attn_row(r, qv.data(), kf, vf, ro.data());
                const uint16_t *orow = o + b * qsb + i * qss + h * qsh;
                for (int x = 0; x < D; ++x) {
                    if (orow[x] == sentinel) {
                        if (unwritten++ < 5)
                            printf("  unwritten out: b %d h %d i %d d %d\n", b, h, i, x);
                        continue;
                    }
                    const double ref = ro[x], got = val(orow[x]);
                    const double err = std::isnan(ref)      ? (std::isnan(got) ? 0 : INFINITY)
                                       : std::isfinite(got) ? fabs(got - ref)
                                                            : INFINITY;
                    n_nan += std::isnan(ref);
                    if (err > tol && bad++ < 5)
                        printf("  err: b %d h %d i %d d %d got %g ref %g\n", b, h, i, x, got, ref);
                    max_err = std::max(max_err, err);
                }
                if (c.lse) {
                    const float got = lse[b * p.lse_sb + h * p.lse_sh + i];
                    const double e = ref_lse == -INFINITY ? (got == -INFINITY ? 0 : INFINITY)
                                     : std::isfinite(got) ? fabs(got - ref_lse)
                                                          : INFINITY;
                    if (e > max_lse_err && e > 1e-3)
                        printf("  lse err: b %d h %d i %d got %g ref %g\n", b, h, i, got, ref_lse);
                    max_lse_err = std::max(max_lse_err, e);
                }
            }
        }
    }
    /* out's padding and canaries keep the sentinel; lse's canaries (and all of it when not
     * requested) the poison; the caches are unchanged */
    long stray = 0;
    for (size_t i = 0; i < obuf.size(); ++i) {
        const int64_t e = (int64_t)i - (int64_t)canary;
        const int64_t b = e / qsb, r = e % qsb, row = r / qss, h = r % qss / qsh, d = r % qss % qsh;
        const bool inside = e >= 0 && b < B && row < Sq && h < H && r % qss < H * qsh && d < D;
        if (!inside && obuf[i] != sentinel && stray++ < 5)
            printf("  stray out at %lld (b %lld row %lld h %lld d %lld)\n", (long long)e,
                   (long long)b, (long long)row, (long long)h, (long long)d);
    }
    for (size_t i = 0; i < lbuf.size(); ++i)
        stray += (!c.lse || i < 32 || i >= 32 + (size_t)B * H * Sq) && lbuf[i] != poison;
    const bool cache_changed = memcmp(k_copy.data(), kc.data, kc.n * 2) != 0 ||
                               memcmp(v_copy.data(), vc.data, vc.n * 2) != 0;
    const long emu_errs = emu::g_errors - err0;
    const bool fail =
        unwritten || stray || cache_changed || emu_errs || max_err > tol || max_lse_err > 2e-3;
    printf("  max|out-ref| %.3e  max|lse-ref| %.3e  NaN (as the reference) %ld  unwritten %ld "
           "stray %ld cache_changed %d emu_errors %ld  => %s\n",
           max_err, max_lse_err, n_nan, unwritten, stray, (int)cache_changed, emu_errs,
           fail ? "FAIL" : "ok");
    free(kc.data), free(vc.data);
    return fail;
}

/* fa__mma_supported on caches (host views): a valid paged problem, then one defect each: a page
 * stride, a row stride or data not 16-byte aligned, K and V with different page tables or page
 * sizes, varlen with a cache, a leftpad past 2^31 rows. Returns the wrong answers. */
static int check_cache_supported() {
    static uint16_t kbuf[4096] __attribute__((aligned(16))),
        vbuf[4096] __attribute__((aligned(16)));
    int32_t seqlens[2] = {5, 9}, table[4] = {0, 1, 2, 3}, table2[4] = {0, 1, 2, 3};
    int32_t lp[2] = {0, 3}, big_lp[2] = {0, INT32_MAX - 100}, cu[3] = {0, 1, 2};
    fa__problem p0;
    memset(&p0, 0, sizeof p0);
    p0.B = 2, p0.H = 2, p0.Hk = 1, p0.D = p0.Dv = 64, p0.Sq = 3;
    p0.seqlens_k = seqlens;
    p0.q =
        fa__view{kbuf, FA_DTYPE_F16, 3 * 128, 128, 64, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    p0.out = p0.q;
    p0.k = fa__view{kbuf, FA_DTYPE_F16, 5 * 64, 64, 64, 1, lp, table, nullptr, 2, 5, nullptr};
    p0.v = p0.k;
    p0.v.data = vbuf;
    p0.scale = 0.125f;
    p0.window_left = p0.window_right = -1;
    struct Case {
        const char *what;
        int want;
        fa__problem p;
    };
    std::vector<Case> cases;
    cases.push_back({"valid paged cache", 1, p0});
    Case c = {"page stride 5*64 + 4 (not 16-byte aligned)", 0, p0};
    c.p.k.sb = 5 * 64 + 4;
    cases.push_back(c);
    c = {"v's page stride 5*64 + 2", 0, p0};
    c.p.v.sb = 5 * 64 + 2;
    cases.push_back(c);
    c = {"row stride 68 (not 16-byte aligned)", 0, p0};
    c.p.k.ss = 72 - 4, c.p.k.sb = 5 * 68;
    cases.push_back(c);
    c = {"cache data 8-byte aligned", 0, p0};
    c.p.v.data = vbuf + 4;
    cases.push_back(c);
    c = {"K and V with different page tables", 0, p0};
    c.p.v.block_table = table2;
    cases.push_back(c);
    c = {"K and V with different page sizes", 0, p0};
    c.p.v.page = 4;
    cases.push_back(c);
    c = {"varlen q with a cache", 0, p0};
    c.p.cu_q = cu;
    cases.push_back(c);
    c = {"leftpad + seqlens_k past 2^31 - 256", 0, p0};
    c.p.k.row_off = c.p.v.row_off = big_lp;
    cases.push_back(c);
    c = {"valid contiguous cache", 1, p0};
    c.p.k.block_table = c.p.v.block_table = nullptr, c.p.k.page = c.p.v.page = 0;
    cases.push_back(c);
    c = {"batch stride not 16-byte aligned (contiguous)", 0, c.p};
    c.p.k.sb = 5 * 64 + 4;
    cases.push_back(c);
    int wrong = 0;
    for (const Case &x : cases) {
        const int got = fa__mma_supported(&x.p, 80, emu::smem_optin(80));
        if (got != x.want) {
            printf("FAIL: fa__mma_supported, %s: %d, expected %d\n", x.what, got, x.want);
            wrong++;
        }
    }
    printf("fa__mma_supported on caches: %zu cases, %d wrong\n", cases.size(), wrong);
    return wrong;
}

/* The label of c's kernel in the non-finite table. */
static std::string kernel_label(const Cfg &c) {
    if (c.simple)
        return "stage-1";
    const int kd = fa_mma_kd(c.D);
    if (c.sm == 75)
        return "mma sm_75 kD=" + std::to_string(kd);
    return "mma kD=" + std::to_string(kd) + (kd == 128 ? (c.bn == 64 ? " 128x64" : " 128x32") : "");
}

/* The cache suite: each kernel (kD = 64, 128 with both key blocks, 256, and D = 80 padded to
 * 96) in fp16 and bf16 under every layout (contiguous with cache_batch_idx, leftpad, both, pages
 * of 1, 3, 16, 64, 256, pages of 3 with leftpad), the features, G, Sq and the lengths
 * (0, 1, 63, 64, 65, 700 keys) taking turns over the list. */
static void add_cache(std::vector<CacheCfg> &out) {
    const struct { int D, bn; } kerns[] = {{64, 32}, {128, 32}, {128, 64}, {256, 32}, {80, 32}};
    const struct {
        char layout;
        int page;
    } layouts[] = {{'c', 0},  {'l', 0},  {'b', 0},   {'p', 1}, {'p', 3},
                   {'p', 16}, {'p', 64}, {'p', 256}, {'q', 3}};
    const std::vector<int> lens[] = {{0, 65, 700}, {1, 63, 64}, {700, 64, 0}, {65, 1, 63}};
    const int sqs[] = {1, 17, 128};
    int i = 0;
    for (const auto &kn : kerns)
        for (int bf : {0, 1})
            for (const auto &ly : layouts) {
                CacheCfg c;
                c.D = kn.D, c.bn = kn.bn, c.bf = bf, c.layout = ly.layout, c.page = ly.page;
                c.G = i % 2 ? 4 : 1;
                c.Sq = sqs[i % 3];
                c.sk = lens[i / 3 % 4];
                switch (i % 6) {
                case 1:
                    c.causal = true, c.nan_v = true;
                    break;
                case 2:
                    c.wl = 50, c.wr = 10;
                    break;
                case 3:
                    c.softcap = 5;
                    break;
                case 4:
                    c.alibi = 0.3f, c.causal = true;
                    break;
                case 5:
                    c.causal = true, c.wl = 100, c.lse = false, c.nan_v = true;
                    break;
                }
                out.push_back(c);
                i++;
            }
}

int main(int argc, char **argv) {
    std::vector<Cfg> cfgs;
    std::vector<CacheCfg> cache_cfgs;
    auto add = [&](Cfg c) { cfgs.push_back(c); };
    auto mk = [](int D, bool bf, int Sq, int Sk) {
        Cfg c;
        c.D = D, c.bf = bf, c.Sq = Sq, c.Sk = Sk;
        return c;
    };
    struct Suite {
        std::string name;
        int seed, n; /* sweep only */
    };
    std::vector<Suite> suites;
    for (int a = 1; a < argc; ++a) {
        Suite su{argv[a], 99, 60};
        if (su.name == "sweep" && a + 2 < argc)
            su.seed = atoi(argv[a + 1]), su.n = atoi(argv[a + 2]), a += 2;
        suites.push_back(su);
    }
    if (suites.empty())
        suites = {{"basic", 0, 0},     {"features", 0, 0}, {"edge", 0, 0},  {"long", 0, 0},
                  {"nonfinite", 0, 0}, {"f32out", 0, 0},   {"cache", 0, 0}, {"sinks", 0, 0}};
    for (const Suite &su : suites) {
        const std::string &suite = su.name;
        if (suite == "quick") {
            Cfg c;
            c.Sq = 5, c.Sk = 7;
            add(c);
        } else if (suite == "basic") {
            for (int D : k_dims_all)
                for (int bf : {0, 1})
                    for (int causal : {0, 1})
                        for (auto sz : std::vector<std::pair<int, int>>{
                                 {1, 1}, {37, 37}, {130, 130}, {77, 200}, {200, 77}, {1, 300}}) {
                            Cfg c;
                            c.D = D, c.bf = bf, c.causal = causal, c.Sq = sz.first,
                            c.Sk = sz.second;
                            add(c);
                        }
        } else if (suite == "features") {
            for (int D : k_dims)
                for (int bf : {0, 1}) {
                    Cfg c = mk(D, bf, 150, 170);
                    c.H = 4, c.Hk = 2, c.causal = true; // GQA + causal
                    add(c);
                    c = mk(D, bf, 70, 70);
                    c.H = 3, c.Hk = 1, c.pad = 8; // MQA, padded strides
                    add(c);
                    c = mk(D, bf, 260, 300);
                    c.wl = 40, c.wr = 17; // sliding window
                    add(c);
                    c = mk(D, bf, 140, 140);
                    c.softcap = 5, c.mag = 2;
                    add(c);
                    c = mk(D, bf, 140, 160);
                    c.alibi = 0.3f, c.causal = true;
                    add(c);
                    c = mk(D, bf, 100, 130);
                    c.alibi = 0.2f, c.softcap = 3, c.mag = 2;
                    add(c);
                    c = mk(D, bf, 0, 0);
                    c.lq = {5, 0, 130, 64}, c.lk = {9, 4, 129, 0}, c.causal = true, c.H = 2,
                    c.Hk = 1;
                    add(c); // varlen
                    c = mk(D, bf, 300, 40);
                    c.causal = true; // rows that see no key
                    add(c);
                    c = mk(D, bf, 129, 257);
                    c.mag = 4, c.scale = 1.0f, c.lse = false; // large scores, no lse
                    add(c);
                    c = mk(D, bf, 50, 300);
                    c.wl = 0, c.wr = 0;
                    add(c);
                }
        } else if (suite == "sweep") {
            std::mt19937 r2(su.seed);
            const int n = su.n;
            auto R = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(r2); };
            const int edges[] = {1,  2,   7,   8,   15,  16,  17,  31,  32,  33,  63,  64,
                                 65, 127, 128, 129, 160, 255, 256, 257, 300, 383, 384, 385};
            for (int it = 0; it < n; ++it) {
                Cfg c;
                c.D = R(0, 1) ? 64 << R(0, 2) : 8 * R(1, 32); // 64, 128, 256, or any
                c.bf = R(0, 1);
                c.B = R(1, 2);
                c.Hk = R(1, 2);
                c.H = c.Hk * R(1, 2);
                c.Sq = R(0, 1) ? edges[R(0, 23)] : R(1, 400);
                c.Sk = R(0, 1) ? edges[R(0, 23)] : R(1, 400);
                const int mode = R(0, 5);
                if (mode == 1)
                    c.causal = true;
                if (mode == 2)
                    c.wl = R(0, 200), c.wr = R(-1, 50);
                if (mode == 3)
                    c.wl = R(-1, 100), c.wr = R(0, 100);
                if (mode == 4)
                    c.causal = true, c.wl = R(0, 150);
                if (R(0, 3) == 0)
                    c.softcap = 0.5f + R(0, 20) * 0.5f;
                if (R(0, 3) == 0)
                    c.alibi = R(1, 10) * 0.05f;
                c.lse = R(0, 4) != 0;
                c.pad = R(0, 3) == 0 ? 8 * R(1, 3) : 0;
                c.mag = R(0, 3) == 0 ? 3.0f : 1.0f;
                if (R(0, 4) == 0) { // varlen
                    const int nb = R(1, 4);
                    for (int b = 0; b < nb; ++b) {
                        c.lq.push_back(R(0, 6) == 0 ? 0 : R(1, 300));
                        c.lk.push_back(R(0, 6) == 0 ? 0 : R(1, 300));
                    }
                }
                add(c);
            }
        } else if (suite == "long") {
            for (int D : k_dims)
                for (int bf : {0, 1}) {
                    Cfg c;
                    c.D = D, c.bf = bf, c.Sq = 3, c.Sk = 1500, c.mag = 2;
                    add(c);
                    c.causal = true, c.Sq = 260, c.Sk = 1100, c.H = 1, c.Hk = 1;
                    add(c);
                }
        } else if (suite == "edge") {
            for (int D : k_dims)
                for (int bf : {0, 1}) {
                    add(mk(D, bf, 5, 0)); // no keys at all
                    Cfg c = mk(D, bf, 70, 150);
                    c.wl = 0x7fffffff, c.wr = 0x7fffffff; // huge windows
                    add(c);
                    c = mk(D, bf, 70, 150);
                    c.wl = 0x7fffffff, c.causal = true;
                    add(c);
                    c = mk(D, bf, 90, 200);
                    c.softcap = 1, c.scale = 1, c.mag = 4; // saturating softcap
                    add(c);
                    c = mk(D, bf, 90, 200);
                    c.scale = 1e-3f; // flat
                    add(c);
                    c = mk(D, bf, 90, 200);
                    c.scale = 4, c.mag = 4; // very peaked
                    add(c);
                    c = mk(D, bf, 131, 67);
                    c.B = 3, c.H = 3, c.Hk = 3, c.pad = 16, c.causal = true;
                    add(c);
                    c = mk(D, bf, 256, 256);
                    c.wl = 3, c.wr = 200, c.alibi = 2.0f; // strong ALiBi
                    add(c);
                    c = mk(D, bf, 0, 0);
                    c.lq = {0, 0, 3}, c.lk = {0, 5, 0}; // varlen: empty and keyless sequences
                    add(c);
                }
        } else if (suite == "sinks") {
            add_sinks(cfgs);
        } else if (suite == "f32out") {
            add_f32out(cfgs);
        } else if (suite == "nonfinite") {
            add_nonfinite(cfgs);
        } else if (suite == "cache") {
            add_cache(cache_cfgs);
        } else {
            fprintf(stderr,
                    "suites: basic features edge long nonfinite f32out cache quick | sweep SEED "
                    "N\n");
            return 2;
        }
    }
    /* With FA_EMU_SM=75: every fp16 configuration on an emulated sm_75 (Turing's kind: m16n8k8,
     * synchronous copies, its own tiles), and nothing else. Otherwise every kD = 128
     * configuration under both key blocks (fa__mma_d128_block_n's tiles). */
    const bool turing = emu::g_sm == 75;
    std::vector<Cfg> listed;
    listed.swap(cfgs);
    for (const Cfg &c0 : listed) {
        Cfg c = c0;
        if (turing) {
            if (c.simple || c.bf || c.f32)
                continue;
            c.sm = 75;
        }
        cfgs.push_back(c);
        if (!turing && !c.simple && fa_mma_kd(c.D) == 128) {
            c.bn = 64;
            cfgs.push_back(c);
        }
    }
    std::vector<CacheCfg> cache_listed;
    cache_listed.swap(cache_cfgs);
    for (const CacheCfg &c0 : cache_listed) {
        CacheCfg c = c0;
        if (turing && (c.bf || c.bn != 32))
            continue;
        c.sm = turing ? 75 : c.sm;
        cache_cfgs.push_back(c);
    }
    int fails = check_tile_names();
    /* the non-finite table: (kernel, dtype) -> case -> (runs, failed) */
    std::map<std::string, std::map<std::string, std::pair<int, int>>> table;
    std::vector<std::string> case_names;
    for (auto &c : cfgs) {
        printf("%s\n", describe(c).c_str());
        fflush(stdout);
        const auto t0 = std::chrono::steady_clock::now();
        const long nb = emu::g_blocks_run;
        const int failed = run(c);
        fails += failed;
        if (c.nf_case) {
            auto &cell = table[kernel_label(c) + (c.f32  ? " | fp32"
                                                  : c.bf ? " | bf16"
                                                         : " | fp16")][c.nf_case];
            cell.first++;
            cell.second += failed;
            if (std::find(case_names.begin(), case_names.end(), c.nf_case) == case_names.end())
                case_names.push_back(c.nf_case);
        }
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("  %.2f s, %ld CTAs emulated\n", secs, emu::g_blocks_run - nb);
        fflush(stdout);
    }
    if (!cache_cfgs.empty()) {
        fails += check_cache_supported();
        const auto t0 = std::chrono::steady_clock::now();
        for (const CacheCfg &c : cache_cfgs) {
            printf("%s\n", describe_cache(c).c_str());
            fflush(stdout);
            fails += run_cache(c);
        }
        printf("cache suite: %zu configurations, %.1f s\n", cache_cfgs.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (!table.empty()) {
        printf("\nnon-finite rule (kernel x dtype x case -> pass):\n| kernel | dtype |");
        for (const auto &n : case_names)
            printf(" %s |", n.c_str());
        printf("\n|---|---|");
        for (size_t i = 0; i < case_names.size(); ++i)
            printf("---|");
        printf("\n");
        for (const auto &row : table) {
            const size_t bar = row.first.find(" | ");
            printf("| %s | %s |", row.first.substr(0, bar).c_str(),
                   row.first.substr(bar + 3).c_str());
            for (const auto &n : case_names) {
                const auto it = row.second.find(n);
                if (it == row.second.end())
                    printf(" - |");
                else if (it->second.second == 0)
                    printf(" pass |");
                else
                    printf(" FAIL |");
            }
            printf("\n");
        }
        printf("\n");
    }
    printf("ldmatrix 8-lane phases: %ld, with a bank conflict: %ld\n", emu::g_ldsm_phases,
           emu::g_ldsm_conflicted);
    printf("%d of %zu configurations failed; emulator errors total %ld\n", fails,
           cfgs.size() + cache_cfgs.size(), emu::g_errors);
    /* fwd_mma.cu swizzles every tile so that ldmatrix is free of bank conflicts: hold it to it */
    if (emu::g_ldsm_conflicted)
        printf("FAIL: ldmatrix bank conflicts\n");
    return fails != 0 || emu::g_ldsm_conflicted != 0;
}
