/* SPDX-License-Identifier: MIT */
// test_cuda_emu_decode.cpp — runs the split-KV decode (cuda/decode.cu) on the CPU through the
// emulator in emu.h, through its host entry points fa__decode_supported, fa__decode_splits,
// fa__decode_scratch_bytes and fa__decode_forward, and compares out and lse with an fp64
// attention over the same inputs, the cache read through its own addressing (leftpad,
// batch_idx, pages of 1, 3, 16 and 256 keys with a shuffled block table), not fa__view_at.
//
// Every case runs with splits 1, 2, 3, 7 and the automatic choice (num_splits = 0, 132 SMs),
// and each run must give out and lse with the same bits as the first. Also fails on unwritten
// or stray output (out starts as a NaN sentinel, canaries around out, lse and the scratch), on
// a changed cache, and on anything the emulator reports (shared-memory races, reads of cp.async
// data before its wait, cp.async sources outside the cache). Cache rows outside every sequence
// hold NaN, so a read of one shows. Non-finite cases plant NaN and infinities in k and v at
// keys some rows see and others do not, under the rule of docs/semantics.md; one case has
// scores up to about 300 in the exp2 domain, past fp32's range as 2^s, so the maxima must be
// the true ones. Last, the negative: fa__decode_supported says 0 for what the kernel does not
// handle.
#include "emu.h"

#include "decode_emu.cu" /* cuda/decode.cu as emu_kernel.cmake copies it */
#include "ref_attn.h"

#include <algorithm>
#include <random>
#include <string>

struct Plant {
    char t; // 'k' or 'v'
    int b, key, hk, d;
    float val;
};

struct Cfg {
    int dt = FA_DTYPE_BF16; // the cache's (and out's) dtype
    bool q_f32 = false;     // q in fp32 over a 2-byte cache
    int D = 64, H = 4, Hk = 1, Sq = 1;
    std::vector<int> sk = {200}; // keys of each batch (B = its size)
    bool no_seqlens = false;     // seqlens_k NULL: every batch has sk[0] keys
    int extra_b = 0;             // contiguous cache: B_cache = B + extra_b, with batch_idx
    bool leftpad = false;
    int page = 0;        // paged with pages of `page` keys (0: contiguous)
    bool v_wide = false; // v's head, row and page strides differ from k's
    int q_sd = 1;        // q's element stride
    int extra_max = 0;   // max_sk passed as the most keys plus this
    float mag = 1;       // q's magnitude: scores far from 0 need the true maxima
    bool causal = false, lse = true;
    int wl = -1, wr = -1;
    float softcap = 0, alibi = 0;
    float sink = NAN; // the sinks' base (ref_sinks; NaN: no sinks)
    int sm = 90;      // the emulated device (75: Turing's 64 KB a block, synchronous copies)
    std::vector<Plant> plants;
};

static std::mt19937 rng(4321);

static size_t es_of(int dt) { return dt == FA_DTYPE_F32 ? 4 : 2; }
static uint32_t to_bits(int dt, float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return dt == FA_DTYPE_F32 ? u : dt == FA_DTYPE_BF16 ? emu::f2bf(x) : emu::f2h(x);
}
static double from_bits(int dt, uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return dt == FA_DTYPE_F32    ? f
           : dt == FA_DTYPE_BF16 ? emu::bf2f((uint16_t)u)
                                 : emu::h2f((uint16_t)u);
}
static uint32_t get_bits(int dt, const char *x, size_t i) {
    if (dt == FA_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, x + 4 * i, 4);
        return u;
    }
    return ((const uint16_t *)x)[i];
}
static void set_bits(int dt, char *x, size_t i, uint32_t u) {
    if (dt == FA_DTYPE_F32)
        memcpy(x + 4 * i, &u, 4);
    else
        ((uint16_t *)x)[i] = (uint16_t)u;
}
static char *alloc_bytes(size_t n) { return (char *)aligned_alloc(256, (n + 255) / 256 * 256); }

static std::string describe(const Cfg &c) {
    char buf[512];
    std::string sks;
    for (int s : c.sk)
        sks += std::to_string(s) + ",";
    snprintf(buf, sizeof buf,
             "%s%s D=%d H=%d Hk=%d Sq=%d sk=%s%s extra_b=%d leftpad=%d page=%d causal=%d wl=%d "
             "wr=%d softcap=%g alibi=%g sink=%g lse=%d v_wide=%d q_sd=%d extra_max=%d mag=%g "
             "plants=%zu sm_%d",
             c.dt == FA_DTYPE_F32   ? "fp32"
             : c.dt == FA_DTYPE_F16 ? "fp16"
                                    : "bf16",
             c.q_f32 ? "(q fp32)" : "", c.D, c.H, c.Hk, c.Sq, sks.c_str(),
             c.no_seqlens ? "(no seqlens_k)" : "", c.extra_b, c.leftpad, c.page, c.causal, c.wl,
             c.wr, c.softcap, c.alibi, c.sink, c.lse, c.v_wide, c.q_sd, c.extra_max, c.mag,
             c.plants.size(), c.sm);
    return buf;
}

static int run(const Cfg &c) {
    const int B = (int)c.sk.size(), D = c.D, H = c.H, Hk = c.Hk, Sq = c.Sq, dt = c.dt;
    const int qdt = c.q_f32 ? FA_DTYPE_F32 : dt;
    const size_t es = es_of(dt), qes = es_of(qdt);
    const int gap = 16 / (int)es; // stride padding: 16 bytes, rows stay 16-byte aligned
    std::uniform_real_distribution<float> U(-1, 1);
    std::vector<int32_t> seqlens(c.sk.begin(), c.sk.end()), leftpad(B, 0), bidx(B);
    int max_sk = c.extra_max;
    for (int b = 0; b < B; ++b) {
        max_sk = std::max(max_sk, seqlens[b] + c.extra_max);
        if (c.leftpad)
            leftpad[b] = (int)(rng() % 7);
    }
    /* cache rows a batch needs: leftpad + keys */
    int rows_need = 1;
    for (int b = 0; b < B; ++b)
        rows_need = std::max(rows_need, leftpad[b] + seqlens[b]);
    // K/V cache: contiguous [Bc, Sc, Hk, D] or paged [npages, page, Hk, D], padded strides
    const int64_t sh = D + gap, ss = Hk * sh + gap;
    const int64_t vsh = c.v_wide ? D + 3 * gap : sh, vss = Hk * vsh + (c.v_wide ? 2 : 1) * gap;
    int64_t sb, vsb, nfirst, bt_stride = 0;
    std::vector<int32_t> table;
    if (c.page) {
        bt_stride = (rows_need + c.page - 1) / c.page + 1;
        nfirst = B * bt_stride + 3;
        std::vector<int32_t> perm(nfirst);
        for (int i = 0; i < nfirst; ++i)
            perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        table.assign(perm.begin(), perm.begin() + B * bt_stride);
        sb = c.page * ss + gap, vsb = c.page * vss + gap;
    } else {
        nfirst = B + c.extra_b;
        sb = (rows_need + 2) * ss + gap, vsb = (rows_need + 2) * vss + gap;
        std::vector<int32_t> perm(nfirst);
        for (int i = 0; i < nfirst; ++i)
            perm[i] = i;
        if (c.extra_b)
            std::shuffle(perm.begin(), perm.end(), rng);
        for (int b = 0; b < B; ++b)
            bidx[b] = perm[b];
    }
    const size_t nk = (size_t)nfirst * sb + 64, nv = (size_t)nfirst * vsb + 64;
    char *k = alloc_bytes(nk * es), *v = alloc_bytes(nv * es);
    const uint32_t nan_bits = dt == FA_DTYPE_F32    ? 0x7fc00000u
                              : dt == FA_DTYPE_BF16 ? 0x7fc0u
                                                    : 0x7e00u;
    for (size_t i = 0; i < nk; ++i) // NaN everywhere outside the sequences
        set_bits(dt, k, i, nan_bits);
    for (size_t i = 0; i < nv; ++i)
        set_bits(dt, v, i, nan_bits);
    /* element (b, key j, hk, 0) of k (or v), by the cache's own rules */
    auto at = [&](int b, int j, int hk, bool is_v = false) -> int64_t {
        const int64_t row = leftpad[b] + j;
        const int64_t xsb = is_v ? vsb : sb, xss = is_v ? vss : ss, xsh = is_v ? vsh : sh;
        if (c.page)
            return (int64_t)table[b * bt_stride + row / c.page] * xsb + row % c.page * xss +
                   hk * xsh;
        return (int64_t)(c.extra_b ? bidx[b] : b) * xsb + row * xss + hk * xsh;
    };
    for (int b = 0; b < B; ++b)
        for (int j = 0; j < seqlens[b]; ++j)
            for (int hk = 0; hk < Hk; ++hk)
                for (int d = 0; d < D; ++d) {
                    set_bits(dt, k, at(b, j, hk) + d, to_bits(dt, U(rng)));
                    set_bits(dt, v, at(b, j, hk, true) + d, to_bits(dt, U(rng)));
                }
    for (const Plant &pl : c.plants)
        set_bits(dt, pl.t == 'k' ? k : v, at(pl.b, pl.key, pl.hk, pl.t == 'v') + pl.d,
                 to_bits(dt, pl.val));
    std::vector<char> k0(k, k + nk * es), v0(v, v + nv * es);
    // q: [B, Sq, H, D] with padded strides; out the same in the cache's dtype, canaries around
    const int64_t qsh = D * c.q_sd + 3, qss = H * qsh + 5, qsb = Sq * qss + 7;
    const size_t nq = (size_t)B * qsb;
    char *q = alloc_bytes(nq * qes);
    for (size_t i = 0; i < nq; ++i)
        set_bits(qdt, q, i, to_bits(qdt, U(rng) * c.mag));
    const int64_t osh = D + gap, oss = H * osh + gap, osb = Sq * oss + gap;
    const size_t no = (size_t)B * osb, canary = 64;
    char *obuf = alloc_bytes((no + 2 * canary) * es), *o = obuf + canary * es;
    const size_t nl = (size_t)B * H * Sq;
    std::vector<float> lbuf(nl + 64);
    float *lse = lbuf.data() + 32;
    std::vector<float> slopes(B * H);
    for (int i = 0; i < B * H; ++i)
        slopes[i] = c.alibi * (0.25f + (float)(i % 5) / 5.0f);

    fa__problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.H = H, p.Hk = Hk, p.D = p.Dv = D, p.Sq = Sq, p.Sk = c.no_seqlens ? seqlens[0] : 0;
    p.seqlens_k = c.no_seqlens ? nullptr : seqlens.data();
    p.q = fa__view{q, qdt, qsb, qss, qsh, c.q_sd, nullptr, nullptr, nullptr, 0, 0, nullptr};
    fa__view cache{nullptr, dt, sb, ss, sh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    if (c.leftpad)
        cache.row_off = leftpad.data();
    if (c.page)
        cache.block_table = table.data(), cache.bt_stride = bt_stride, cache.page = c.page;
    else if (c.extra_b)
        cache.batch_idx = bidx.data();
    p.k = cache, p.k.data = k;
    p.v = cache, p.v.data = v, p.v.sb = vsb, p.v.ss = vss, p.v.sh = vsh;
    p.out = fa__view{o, dt, osb, oss, osh, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
    p.lse = c.lse ? lse : nullptr;
    p.lse_sb = (int64_t)H * Sq, p.lse_sh = Sq, p.lse_ss = 1;
    p.scale = 1.0f / sqrtf((float)D);
    ref_set_options(p, c.causal, c.wl, c.wr, c.softcap, c.alibi != 0 ? slopes.data() : nullptr);
    const std::vector<float> sinks = ref_sinks(c.sink, H);
    p.sinks = sinks.empty() ? nullptr : sinks.data(), p.sinks_sh = 1;
    printf("%s\n", describe(c).c_str());
    if (!fa__decode_supported(&p, emu::smem_optin(c.sm))) {
        printf("  FAIL: not supported by fa__decode_supported\n");
        return 1;
    }

    /* the reference, fp64, under the non-finite rule (ref_attn_row), reading the cache */
    std::vector<double> ref_o(no, 0.0), ref_l(nl, 0.0), qv(D);
    std::vector<char> expect(no, 0);
    long rows_finite = 0, rows_nonfinite = 0;
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < H; ++h) {
            const int hk = h / (H / Hk);
            auto kf = [&](int64_t j, int e) {
                return from_bits(dt, get_bits(dt, k, at(b, (int)j, hk) + e));
            };
            auto vf = [&](int64_t j, int e) {
                return from_bits(dt, get_bits(dt, v, at(b, (int)j, hk, true) + e));
            };
            const double slope = p.alibi ? slopes[b * H + h] : 0;
            for (int i = 0; i < Sq; ++i) {
                const int64_t qrow = b * qsb + i * qss + h * qsh;
                for (int e = 0; e < D; ++e)
                    qv[e] = from_bits(qdt, get_bits(qdt, q, qrow + e * c.q_sd));
                const RefRow r = ref_row(D, i, Sq, seqlens[b], p.window_left, p.window_right,
                                         p.scale, c.softcap, slope);
                const int64_t orow = b * osb + i * oss + h * osh;
                double lr = ref_attn_row(r, qv.data(), kf, vf, &ref_o[orow]);
                if (p.sinks && sinks[h] != -INFINITY)
                    lr = ref_sink(lr, sinks[h], D, &ref_o[orow]);
                ref_l[(b * H + h) * Sq + i] = lr;
                bool fin = true;
                for (int x = 0; x < D; ++x) {
                    expect[orow + x] = 1;
                    fin = fin && std::isfinite(ref_o[orow + x]);
                }
                (fin ? rows_finite : rows_nonfinite)++;
            }
        }
    }

    const uint32_t sentinel = dt == FA_DTYPE_F32    ? 0x7fc00001u
                              : dt == FA_DTYPE_BF16 ? 0x7fc1u
                                                    : 0x7e01u;
    const uint32_t lse_poison = 0x7fc0dead;
    const size_t scratch_n = fa__decode_scratch_bytes(&p, max_sk), scratch_canary = 256;
    char *scratch = alloc_bytes(scratch_n + scratch_canary);
    emu::g_bufs.clear();
    emu::register_global(k, nk * es);
    emu::register_global(v, nv * es);

    const int split_list[] = {1, 2, 3, 7, 0};
    std::vector<uint32_t> first_o, first_l;
    int fails = 0;
    for (int num : split_list) {
        const int splits = fa__decode_splits(&p, max_sk, num, 132);
        const int64_t chunks = (max_sk + FA_DECODE_CHUNK - 1) / FA_DECODE_CHUNK;
        if (splits < 1 || splits > std::max<int64_t>(chunks, 1) ||
            (num > 0 && splits != std::min<int64_t>(num, std::max<int64_t>(chunks, 1)))) {
            printf("  FAIL: fa__decode_splits(num_splits %d) = %d with %lld chunks\n", num, splits,
                   (long long)chunks);
            fails++;
        }
        for (size_t i = 0; i < no + 2 * canary; ++i)
            set_bits(dt, obuf, i, sentinel);
        for (auto &x : lbuf)
            memcpy(&x, &lse_poison, 4);
        memset(scratch, 0xff, scratch_n + scratch_canary); // NaN: an unwritten partial shows
        const long err0 = emu::g_errors;
        emu::g_sm = c.sm;
        const cudaError_t e =
            fa__decode_forward(&p, max_sk, splits, scratch, emu::smem_optin(c.sm), nullptr);
        emu::g_sm = 90;
        long emu_errs = emu::g_errors - err0, unwritten = 0, stray = 0, canary_bad = 0;
        long lse_bad = 0, bad_class = 0;
        double max_err = 0, max_lse_err = 0;
        for (size_t i = 0; i < no; ++i) {
            const uint32_t u = get_bits(dt, o, i);
            if (!expect[i]) {
                stray += u != sentinel;
                continue;
            }
            if (u == sentinel) {
                if (unwritten++ < 3)
                    printf("  unwritten out element %zu\n", i);
                continue;
            }
            const double got = from_bits(dt, u), ref = ref_o[i];
            if (!std::isfinite(ref) || !std::isfinite(got)) {
                const bool same = std::isnan(ref) ? std::isnan(got) : got == ref;
                if (!same && bad_class++ < 3)
                    printf("  non-finite mismatch at %zu: got %g ref %g\n", i, got, ref);
                continue;
            }
            if (fabs(got - ref) > max_err)
                max_err = fabs(got - ref);
        }
        for (size_t i = 0; i < canary; ++i)
            canary_bad +=
                (get_bits(dt, obuf, i) != sentinel) + (get_bits(dt, o, no + i) != sentinel);
        for (size_t i = 0; i < nl; ++i) {
            const float got = lse[i];
            uint32_t u;
            memcpy(&u, &got, 4);
            if (!c.lse) {
                lse_bad += u != lse_poison;
                continue;
            }
            const double ref = ref_l[i];
            double err;
            if (std::isnan(ref))
                err = std::isnan(got) && u != lse_poison ? 0 : INFINITY;
            else if (ref == -INFINITY)
                err = got == -INFINITY ? 0 : INFINITY;
            else
                err = std::isnan(got) ? INFINITY : fabs(got - ref);
            max_lse_err = std::max(max_lse_err, err);
        }
        for (int i = 0; i < 32; ++i) {
            uint32_t a, z;
            memcpy(&a, &lbuf[i], 4);
            memcpy(&z, &lbuf[32 + nl + i], 4);
            lse_bad += (a != lse_poison) + (z != lse_poison);
        }
        for (size_t i = 0; i < scratch_canary; ++i)
            canary_bad += (unsigned char)scratch[scratch_n + i] != 0xff;
        const bool cache_changed = memcmp(k, k0.data(), nk * es) || memcmp(v, v0.data(), nv * es);
        /* bits of out and lse, against the first run's */
        std::vector<uint32_t> ob(no), lb(nl);
        for (size_t i = 0; i < no; ++i)
            ob[i] = get_bits(dt, o, i);
        memcpy(lb.data(), lse, nl * 4);
        bool same_bits = true;
        if (first_o.empty())
            first_o = ob, first_l = lb;
        else
            same_bits = ob == first_o && lb == first_l;
        /* |v| <= 1, so |out| <= 1: out's rounding costs half an ulp below 1 (u), plus the fp32
         * sums' error, which grows with the scores' magnitude (q's, mag) */
        const double u = dt == FA_DTYPE_F32 ? 0.0 : ldexp(1.0, dt == FA_DTYPE_BF16 ? -9 : -12);
        const double tol = u + 1e-5 * c.mag, lse_tol = 1e-4 * c.mag;
        const bool one_sided = !c.plants.empty() && (rows_finite == 0 || rows_nonfinite == 0);
        const bool fail = e != cudaSuccess || emu_errs || unwritten || stray || canary_bad ||
                          lse_bad || bad_class || cache_changed || !same_bits || max_err > tol ||
                          max_lse_err > lse_tol || one_sided;
        printf("  splits %d (asked %d): max|out-ref| %.2e  max|lse-ref| %.2e  rows non-finite "
               "%ld/%ld  unwritten %ld stray %ld canary %ld lse_bad %ld nonfinite-mismatch %ld "
               "emu_errors %ld%s%s%s  => %s\n",
               splits, num, max_err, max_lse_err, rows_nonfinite, rows_finite + rows_nonfinite,
               unwritten, stray, canary_bad, lse_bad, bad_class, emu_errs,
               same_bits ? "" : " BITS-DIFFER", cache_changed ? " CACHE-CHANGED" : "",
               one_sided ? " ONE-SIDED" : "", fail ? "FAIL" : "ok");
        fails += fail;
    }
    free(q), free(k), free(v), free(obuf), free(scratch);
    return fails != 0;
}

/* fa__decode_supported says 0 for what the kernel does not handle. */
static int check_negative() {
    static char buf[4096] __attribute__((aligned(256)));
    static int32_t seq[2] = {10, 10}, cu[3] = {0, 1, 2};
    auto base = [&]() {
        fa__problem p;
        memset(&p, 0, sizeof p);
        p.B = 2, p.H = 8, p.Hk = 2, p.D = p.Dv = 64, p.Sq = 1, p.Sk = 0;
        p.seqlens_k = seq;
        const int32_t dt = FA_DTYPE_BF16;
        p.q = fa__view{buf, dt, 8 * 64, 8 * 64, 64, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
        p.k =
            fa__view{buf, dt, 16 * 2 * 64, 2 * 64, 64, 1, nullptr, nullptr, nullptr, 0, 0, nullptr};
        p.v = p.k;
        p.out = p.q;
        p.scale = 0.125f;
        p.window_left = p.window_right = -1;
        return p;
    };
    struct Neg {
        const char *what;
        void (*edit)(fa__problem &);
    };
    const Neg negs[] = {
        {"k data not 16-byte aligned", [](fa__problem &p) { p.k.data = buf + 2; }},
        {"v row stride not 16 bytes", [](fa__problem &p) { p.v.ss = 2 * 64 + 4; }},
        {"k head stride not 16 bytes", [](fa__problem &p) { p.k.sh = 68; }},
        {"v page/batch stride not 16 bytes", [](fa__problem &p) { p.v.sb = 16 * 2 * 64 + 1; }},
        {"k sd != 1", [](fa__problem &p) { p.k.sd = 2; }},
        {"D = 60 (bf16: not whole 16 bytes)", [](fa__problem &p) { p.D = p.Dv = 60; }},
        {"Dv = 128 != D", [](fa__problem &p) { p.Dv = 128; }},
        {"fp32 D = 6",
         [](fa__problem &p) {
             p.D = p.Dv = 6, p.q.dtype = p.k.dtype = p.v.dtype = p.out.dtype = FA_DTYPE_F32;
         }},
        {"D = 264", [](fa__problem &p) { p.D = p.Dv = 264; }},
        {"G·Sq = 32 rows", [](fa__problem &p) { p.Sq = 8; }},
        {"G·Sq = 17 rows", [](fa__problem &p) { p.H = 17, p.Hk = 1; }},
        {"varlen q", [](fa__problem &p) { p.cu_q = cu; }},
        {"varlen k", [](fa__problem &p) { p.cu_k = cu; }},
        {"dropout", [](fa__problem &p) { p.dropout_p = 0.1f; }},
        {"q fp16 over a bf16 cache", [](fa__problem &p) { p.q.dtype = FA_DTYPE_F16; }},
        {"out fp32 over a bf16 cache", [](fa__problem &p) { p.out.dtype = FA_DTYPE_F32; }},
        {"v fp16, k bf16", [](fa__problem &p) { p.v.dtype = FA_DTYPE_F16; }},
        {"H not a multiple of Hk", [](fa__problem &p) { p.H = 7; }},
        {"u8 cache",
         [](fa__problem &p) { p.q.dtype = p.k.dtype = p.v.dtype = p.out.dtype = FA_DTYPE_U8; }},
    };
    int wrong = 0;
    fa__problem ok = base();
    if (!fa__decode_supported(&ok, 227 * 1024)) {
        printf("FAIL: the negative suite's base problem is not supported\n");
        wrong++;
    }
    ok.Sq = 4, ok.H = 16, ok.Hk = 4; // 16 rows: the most
    if (!fa__decode_supported(&ok, 227 * 1024)) {
        printf("FAIL: G·Sq = 16 is not supported\n");
        wrong++;
    }
    if (fa__decode_supported(&ok, 16 * 1024)) { // no tile fits 16 KB of shared memory
        printf("FAIL: supported within 16 KB of shared memory\n");
        wrong++;
    }
    fa__problem f = base(); // fp32 at D = 256 on Turing: two stages of 16 keys take 66 KB
    f.q.dtype = f.k.dtype = f.v.dtype = f.out.dtype = FA_DTYPE_F32, f.D = f.Dv = 256;
    if (!fa__decode_supported(&f, 227 * 1024) || fa__decode_supported(&f, 64 * 1024)) {
        printf("FAIL: fp32 D = 256: supported within 227 KB %d, within 64 KB %d (want 1, 0)\n",
               fa__decode_supported(&f, 227 * 1024), fa__decode_supported(&f, 64 * 1024));
        wrong++;
    }
    for (const Neg &n : negs) {
        fa__problem p = base();
        n.edit(p);
        const int got = fa__decode_supported(&p, 227 * 1024);
        printf("negative: %-36s supported %d%s\n", n.what, got, got ? "  FAIL" : "");
        wrong += got != 0;
    }
    return wrong;
}

int main() {
    std::vector<Cfg> cfgs;
    const float inf = INFINITY, nan = NAN;
    /* dtypes x head dims: seqlens 0, 1, 255, 256, 257 (a chunk's edges), G = 4 */
    const int dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16, -1}; // -1: fp32 q, bf16 cache
    for (int dtc : dts)
        for (int D : {0, 40, 64, 128, 256}) {
            Cfg c;
            c.dt = dtc < 0 ? FA_DTYPE_BF16 : dtc;
            c.q_f32 = dtc < 0;
            c.D = D ? D : c.dt == FA_DTYPE_F32 ? 4 : 8;
            c.sk = {0, 1, 255, 256, 257};
            cfgs.push_back(c);
        }
    /* G x Sq (G·Sq <= 16), causal where Sq > 1 */
    for (int G : {1, 4, 8})
        for (int Sq : {1, 2, 4}) {
            if (G * Sq > 16)
                continue;
            Cfg c;
            c.H = 2 * G, c.Hk = 2, c.Sq = Sq, c.causal = Sq > 1, c.D = 40;
            c.sk = {3, 300, 1};
            cfgs.push_back(c);
        }
    const size_t n_grid = cfgs.size(); // the two sets above
    /* layouts: batch_idx into a larger cache, leftpad, pages of 1, 3, 16, 256 (shuffled) */
    {
        Cfg c;
        c.D = 64, c.H = 4, c.Hk = 2, c.Sq = 2, c.causal = true;
        c.sk = {70, 0, 300};
        c.extra_b = 3;
        cfgs.push_back(c);
        c.leftpad = true;
        cfgs.push_back(c);
        c.extra_b = 0;
        for (int pg : {1, 3, 16, 256}) {
            c.page = pg;
            c.leftpad = pg == 3;
            c.sk = {pg == 1 ? 40 : 300, 0, 513};
            cfgs.push_back(c);
        }
    }
    /* long caches (~1500 keys): paged 16, fp16 and bf16, D = 128, G = 4 */
    {
        Cfg c;
        c.dt = FA_DTYPE_F16, c.D = 128, c.H = 4, c.Hk = 1, c.page = 16;
        c.sk = {1500, 700};
        cfgs.push_back(c);
        c.dt = FA_DTYPE_BF16, c.page = 0, c.sk = {1537}, c.Sq = 2, c.H = 8, c.causal = true;
        c.v_wide = true, c.q_sd = 2, c.extra_max = 300;
        cfgs.push_back(c);
        /* 16 rows (G = 8, Sq = 2), D = 256, pages of 3 with leftpad; fp32 D = 256 */
        c = Cfg();
        c.D = 256, c.H = 8, c.Hk = 1, c.Sq = 2, c.causal = true, c.page = 3, c.leftpad = true;
        c.sk = {1300, 17, 900};
        cfgs.push_back(c);
        c.dt = FA_DTYPE_F32, c.page = 0, c.leftpad = false, c.v_wide = true, c.sk = {1800};
        cfgs.push_back(c);
        /* a window far from the cache's start: leading chunks skipped, q fp32 */
        c = Cfg();
        c.dt = FA_DTYPE_F16, c.q_f32 = true, c.D = 128, c.H = 8, c.Hk = 2, c.Sq = 4;
        c.wl = 700, c.wr = 0, c.sk = {2000, 650}, c.alibi = 0.05f, c.page = 16;
        cfgs.push_back(c);
        /* scores up to about +-300 in the exp2 domain: 2^300 overflows fp32 */
        c = Cfg();
        c.mag = 200, c.D = 64, c.H = 4, c.sk = {1400, 3};
        cfgs.push_back(c);
    }
    /* features: sliding windows, softcap, ALiBi, no lse, no seqlens_k (a plain forward) */
    {
        Cfg c;
        c.D = 64, c.H = 4, c.Hk = 1, c.Sq = 4, c.sk = {600, 9, 300};
        c.causal = true, c.wl = 100;
        cfgs.push_back(c);
        c.causal = false, c.wl = 50, c.wr = 20;
        cfgs.push_back(c);
        c.wl = 0, c.wr = 0; // one key a row
        cfgs.push_back(c);
        c.wl = c.wr = -1, c.softcap = 0.5f, c.dt = FA_DTYPE_F16, c.sk = {400, 2};
        cfgs.push_back(c);
        c.softcap = 0, c.alibi = 0.7f, c.causal = true, c.dt = FA_DTYPE_F32, c.D = 40;
        cfgs.push_back(c);
        c.softcap = 3.0f, c.lse = false, c.dt = FA_DTYPE_BF16, c.q_f32 = true;
        cfgs.push_back(c);
        c = Cfg();
        c.no_seqlens = true, c.sk = {300, 300}, c.Sq = 3, c.H = 6, c.Hk = 2, c.causal = true;
        cfgs.push_back(c);
    }
    /* non-finite plants in k and v at keys some rows see and others do not (causal, Sq = 4:
     * key sk - 1 only by row 3, key sk - 4 by every row); batch 1's plants in a window */
    for (int dt : {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16}) {
        Cfg c;
        c.dt = dt, c.D = dt == FA_DTYPE_F32 ? 12 : 16, c.H = 4, c.Hk = 2, c.Sq = 4;
        c.causal = true, c.sk = {300, 260};
        c.plants = {{'k', 0, 299, 0, 1, nan}, {'v', 0, 298, 1, 2, inf},  {'v', 0, 100, 1, 3, nan},
                    {'k', 0, 20, 1, 0, -inf}, {'v', 1, 259, 0, 0, -inf}, {'k', 1, 258, 1, 5, inf}};
        cfgs.push_back(c);
    }
    /* sinks (a head without one among them), counted once after the chunks' merge: empty caches
     * and rows without a visible key (lse = the sink), windows, GQA, several chunks, pages */
    {
        Cfg c;
        c.sink = 2.5f, c.D = 64, c.H = 6, c.Hk = 2, c.Sq = 2, c.causal = true;
        c.sk = {0, 1, 700, 257};
        cfgs.push_back(c);
        c.causal = false, c.wl = 2, c.wr = 0, c.Sq = 4, c.H = 3, c.Hk = 1, c.sk = {900, 3};
        c.dt = FA_DTYPE_F16, c.sink = -1.0f, c.page = 16;
        cfgs.push_back(c);
        c.wl = c.wr = -1, c.dt = FA_DTYPE_F32, c.D = 40, c.softcap = 3.0f, c.alibi = 0.1f;
        c.page = 0, c.sink = 6.0f, c.sk = {1300, 40};
        cfgs.push_back(c);
    }
    /* the dtypes x head dims and G x Sq sets again on an emulated sm_75: smaller tiles where
     * 64 KB a block asks for them (D = 256), synchronous copies; fp32 at D = 256 does not fit
     * (two stages of 16 keys are 66 KB: check_negative) */
    for (size_t i = 0; i < n_grid; ++i) {
        if (cfgs[i].dt == FA_DTYPE_F32 && !cfgs[i].q_f32 && cfgs[i].D > 128)
            continue;
        Cfg c = cfgs[i];
        c.sm = 75;
        cfgs.push_back(c);
    }
    int fails = 0;
    for (const Cfg &c : cfgs)
        fails += run(c);
    fails += check_negative();
    printf("%s: %zu cases, %d failed\n", fails ? "FAIL" : "PASS", cfgs.size(), fails);
    return fails != 0;
}
