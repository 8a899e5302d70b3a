/* SPDX-License-Identifier: MIT */
/*
 * test_dropout.c — dropout: the generator, the mask, the forward and backward with dropout, their
 * determinism, and the errors of the new entry points (fa_backward, fa_varlen_backward,
 * fa_dropout_mask, params.dropout_p).
 *
 *  1. Philox-4x32-10 against Random123's known-answer vectors, both a Philox written here from
 *     the paper and the library's own (src/philox.h is internal but header-only plain C).
 *  2. fa_dropout_mask against the formula documented in src/philox.h, computed with the Philox
 *     written here: key (lo32(seed), hi32(seed) ^ hi32(offset)), counter (j/4, i, b*H + h,
 *     lo32(offset)), word j%4, dropped iff word < floor(p * 2^32).
 *  3. Its statistics: the keep rate on a large tensor within 4 sigma of 1 - p (p = 0.1, 0.5,
 *     0.9 and more), per column lane as well; p = 0 keeps everything; same (seed, offset) gives
 *     the same bits, another seed or offset another mask (agreement near p² + (1-p)², as for
 *     independent masks); a mask is the corner of a bigger call's (a pure function of
 *     (seed, offset, b, h, i, j)); strided mask views.
 *  4. Forward and backward with dropout against the fp64 reference built from fa_dropout_mask's
 *     mask (backward_check.h), for fp32, fp16 and bf16, with causal, GQA, softcap, ALiBi,
 *     windows and varlen (sequence b uses mask[b, h, :Sq_b, :Sk_b]).
 *  5. Determinism: forward + backward with dropout bitwise identical on contexts of 1, 2, 3 and
 *     8 threads, the default context, and repeated runs.
 *  6. Errors: dropout_p out of [0, 1) on every entry point, fa_dropout_mask's arguments, and the
 *     backward's own argument checks — each naming the argument, with every output untouched.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/philox.h" /* internal, header-only: only for the known-answer test */
#include "backward_check.h"
#include "flashattn.h"
#include "test.h"
#include "testutil.h"

static void group_line(const char *group, long cases, long failed) {
    printf("%-36s %4ld cases, %ld failed\n", group, cases, failed);
    fflush(stdout);
}

#define GROUP_BEGIN()                                                                              \
    long group_before_ = test_state_g_.cases_passed + test_state_g_.cases_failed;                  \
    long group_failed_ = test_state_g_.cases_failed
#define GROUP_END(name)                                                                            \
    group_line(name, test_state_g_.cases_passed + test_state_g_.cases_failed - group_before_,      \
               test_state_g_.cases_failed - group_failed_)

/* ---------------------------------------------------------------------------------------------
 * 1. Philox-4x32-10, written here from Salmon et al. (SC'11) / Random123
 * ------------------------------------------------------------------------------------------- */

typedef struct ph4 {
    uint32_t x[4];
} ph4;

/* Ten rounds; the key is bumped by the Weyl constants between rounds. */
static ph4 my_philox(ph4 ctr, uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u; /* PHILOX_W32_0 */
            k1 += 0xBB67AE85u; /* PHILOX_W32_1 */
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * ctr.x[0]; /* PHILOX_M4x32_0 */
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr.x[2]; /* PHILOX_M4x32_1 */
        ph4 n;
        n.x[0] = (uint32_t)(p1 >> 32) ^ ctr.x[1] ^ k0;
        n.x[1] = (uint32_t)p1;
        n.x[2] = (uint32_t)(p0 >> 32) ^ ctr.x[3] ^ k1;
        n.x[3] = (uint32_t)p0;
        ctr = n;
    }
    return ctr;
}

static void group_philox(void) {
    GROUP_BEGIN();
    /* Random123 kat_vectors: philox4x32 10 <ctr> <key> <expected> */
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (int t = 0; t < 3; t++) {
        CASE_BEGIN("Philox-4x32-10 known-answer vector %d", t);
        ph4 c = {{kat[t].ctr[0], kat[t].ctr[1], kat[t].ctr[2], kat[t].ctr[3]}};
        ph4 mine = my_philox(c, kat[t].key[0], kat[t].key[1]);
        fa__philox4 lc = {{kat[t].ctr[0], kat[t].ctr[1], kat[t].ctr[2], kat[t].ctr[3]}};
        fa__philox4 lib = fa__philox4x32_10(lc, kat[t].key[0], kat[t].key[1]);
        for (int w = 0; w < 4; w++) {
            CHECK_MSG(mine.x[w] == kat[t].want[w], "this test's Philox word %d: %08x, want %08x", w,
                      mine.x[w], kat[t].want[w]);
            CHECK_MSG(lib.v[w] == kat[t].want[w], "src/philox.h word %d: %08x, want %08x", w,
                      lib.v[w], kat[t].want[w]);
        }
        CASE_END();
    }
    /* the two agree on random inputs too */
    CASE_BEGIN("Philox: src/philox.h == this test's on 10000 random (counter, key)");
    int64_t bad = 0;
    for (int t = 0; t < 10000; t++) {
        const uint64_t a = tu_next_u64(), b = tu_next_u64(), k = tu_next_u64();
        ph4 c = {{(uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b, (uint32_t)(b >> 32)}};
        fa__philox4 lc = {{c.x[0], c.x[1], c.x[2], c.x[3]}};
        ph4 m = my_philox(c, (uint32_t)k, (uint32_t)(k >> 32));
        fa__philox4 l = fa__philox4x32_10(lc, (uint32_t)k, (uint32_t)(k >> 32));
        bad += memcmp(m.x, l.v, sizeof m.x) != 0;
    }
    CHECK_MSG(bad == 0, "%lld of 10000 differ", (long long)bad);
    CASE_END();
    GROUP_END("Philox known answers");
}

/* ---------------------------------------------------------------------------------------------
 * 2. fa_dropout_mask against the documented formula
 * ------------------------------------------------------------------------------------------- */

/* The documented keep bit of element (b, h, i, j) for a problem with H heads. */
static int doc_keep(uint64_t seed, uint64_t offset, float p, int64_t H, int64_t b, int64_t h,
                    int64_t i, int64_t j) {
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32);
    ph4 c = {{(uint32_t)(j / 4), (uint32_t)i, (uint32_t)(b * H + h), (uint32_t)offset}};
    const ph4 w = my_philox(c, k0, k1);
    const double t = floor((double)p * 4294967296.0); /* p < 1, so t <= 2^32 - 256 */
    return (double)w.x[j % 4] >= t;
}

typedef struct mview {
    uint8_t *buf;
    size_t nbuf;
    fa_tensor t;
} mview;

/* A (B, H, Sq, Sk) u8 view: layout 0 contiguous, 1 BHSD permuted to (B, Sq, H, Sk) memory
 * order, 2 every other column with padded rows. Buffer bytes start as 0xA5. */
static void mview_alloc(mview *m, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int layout) {
    int64_t shape[4] = {B, H, Sq, Sk};
    m->t = fa_tensor_contiguous(NULL, FA_DTYPE_U8, 4, shape);
    if (layout == 1) {
        m->t.stride[3] = 1;
        m->t.stride[1] = Sk;
        m->t.stride[2] = H * Sk;
        m->t.stride[0] = Sq * H * Sk;
        m->nbuf = (size_t)(B * Sq * H * Sk);
    } else if (layout == 2) {
        const int64_t row = 2 * Sk + 3;
        m->t.stride[3] = 2;
        m->t.stride[2] = row;
        m->t.stride[1] = row * Sq;
        m->t.stride[0] = row * Sq * H;
        m->nbuf = (size_t)(B * H * Sq * row);
    } else {
        m->nbuf = (size_t)(B * H * Sq * Sk);
    }
    m->buf = malloc(m->nbuf + 1);
    if (!m->buf)
        abort();
    memset(m->buf, 0xA5, m->nbuf + 1);
    m->t.data = m->buf;
}

static uint8_t mget(const mview *m, int64_t b, int64_t h, int64_t i, int64_t j) {
    return m
        ->buf[b * m->t.stride[0] + h * m->t.stride[1] + i * m->t.stride[2] + j * m->t.stride[3]];
}

static void group_mask_formula(void) {
    GROUP_BEGIN();
    static const struct {
        int64_t B, H, Sq, Sk;
        float p;
        int layout;
    } cfg[] = {
        {2, 3, 5, 11, 0.5f, 0},   {1, 1, 1, 1, 0.3f, 0},    {3, 2, 7, 13, 0.1f, 1},
        {2, 5, 9, 4, 0.9f, 2},    {1, 4, 33, 67, 0.25f, 0}, {2, 2, 6, 3, 1e-7f, 0},
        {2, 2, 6, 10, 0.999f, 2}, {1, 2, 3, 130, 0.6f, 1},
    };
    for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
        fa_params params;
        fa_params_init(&params);
        params.dropout_p = cfg[t].p;
        /* seeds and offsets with both halves set, and the plain ones */
        params.dropout_seed = t == 1 ? 0 : tu_next_u64();
        params.dropout_offset = t == 1 ? 0 : t == 2 ? 0xFFFFFFFF00000000ull : tu_next_u64();
        CASE_BEGIN("fa_dropout_mask == documented formula: (%lld,%lld,%lld,%lld) p=%g layout %d "
                   "seed %016llx offset %016llx",
                   (long long)cfg[t].B, (long long)cfg[t].H, (long long)cfg[t].Sq,
                   (long long)cfg[t].Sk, (double)cfg[t].p, cfg[t].layout,
                   (unsigned long long)params.dropout_seed,
                   (unsigned long long)params.dropout_offset);
        mview m;
        mview_alloc(&m, cfg[t].B, cfg[t].H, cfg[t].Sq, cfg[t].Sk, cfg[t].layout);
        fa_status st = fa_dropout_mask(&params, &m.t);
        CHECK_MSG(st == FA_OK, "fa_dropout_mask: %s: %s", fa_status_name(st),
                  fa_last_error_message());
        int64_t bad = 0, kept = 0, n = 0;
        for (int64_t b = 0; b < cfg[t].B; b++)
            for (int64_t h = 0; h < cfg[t].H; h++)
                for (int64_t i = 0; i < cfg[t].Sq; i++)
                    for (int64_t j = 0; j < cfg[t].Sk; j++) {
                        const uint8_t got = mget(&m, b, h, i, j);
                        const int want = doc_keep(params.dropout_seed, params.dropout_offset,
                                                  cfg[t].p, cfg[t].H, b, h, i, j);
                        if (got != want && bad++ < 3)
                            CHECK_MSG(0, "mask[%lld,%lld,%lld,%lld] = %d, documented %d",
                                      (long long)b, (long long)h, (long long)i, (long long)j, got,
                                      want);
                        kept += got == 1;
                        n++;
                    }
        CHECK_MSG(bad == 0, "%lld of %lld elements differ from the formula", (long long)bad,
                  (long long)n);
        /* gaps of a strided view untouched */
        int64_t touched = 0;
        unsigned char *in = calloc(m.nbuf + 1, 1);
        if (!in)
            abort();
        for (int64_t b = 0; b < cfg[t].B; b++)
            for (int64_t h = 0; h < cfg[t].H; h++)
                for (int64_t i = 0; i < cfg[t].Sq; i++)
                    for (int64_t j = 0; j < cfg[t].Sk; j++)
                        in[b * m.t.stride[0] + h * m.t.stride[1] + i * m.t.stride[2] +
                           j * m.t.stride[3]] = 1;
        for (size_t i = 0; i <= m.nbuf; i++)
            touched += !in[i] && m.buf[i] != 0xA5;
        CHECK_MSG(touched == 0, "%lld bytes outside the mask view were written",
                  (long long)touched);
        free(in);
        if (cfg[t].p < 1e-6f)
            CHECK_MSG(kept == n, "p = %g dropped %lld of %lld", (double)cfg[t].p,
                      (long long)(n - kept), (long long)n);
        free(m.buf);
        CASE_END();
    }
    GROUP_END("fa_dropout_mask == formula");
}

/* ---------------------------------------------------------------------------------------------
 * 3. Statistics and properties of the mask
 * ------------------------------------------------------------------------------------------- */

static uint8_t *make_mask(const fa_params *params, int64_t B, int64_t H, int64_t Sq, int64_t Sk) {
    int64_t shape[4] = {B, H, Sq, Sk};
    uint8_t *m = malloc((size_t)(B * H * Sq * Sk + 1));
    if (!m)
        abort();
    memset(m, 0xA5, (size_t)(B * H * Sq * Sk + 1));
    fa_tensor t = fa_tensor_contiguous(m, FA_DTYPE_U8, 4, shape);
    fa_status st = fa_dropout_mask(params, &t);
    CHECK_MSG(st == FA_OK, "fa_dropout_mask: %s: %s", fa_status_name(st), fa_last_error_message());
    return m;
}

static void group_mask_stats(void) {
    GROUP_BEGIN();
    /* Keep rate on 2 x 4 x 256 x 1000 = 2,048,000 elements; fixed seeds, so the measured
     * numbers are reproducible. */
    enum { B = 2, H = 4, SQ = 256, SK = 1000 };
    const int64_t N = (int64_t)B * H * SQ * SK;
    static const float ps[] = {0.1f, 0.5f, 0.9f, 0.01f, 0.3f, 0.99f};
    for (size_t t = 0; t < sizeof ps / sizeof ps[0]; t++) {
        CASE_BEGIN("keep rate within 4 sigma of 1 - p, p = %g", (double)ps[t]);
        fa_params params;
        fa_params_init(&params);
        params.dropout_p = ps[t];
        params.dropout_seed = 0x5EED0000ull + t;
        params.dropout_offset = 1000 * t;
        uint8_t *m = make_mask(&params, B, H, SQ, SK);
        int64_t kept = 0, lane[4] = {0, 0, 0, 0}, other = 0;
        for (int64_t e = 0; e < N; e++) {
            kept += m[e] == 1;
            other += m[e] > 1;
            lane[(e % SK) % 4] += m[e] == 1;
        }
        CHECK_MSG(other == 0, "%lld mask bytes are neither 0 nor 1", (long long)other);
        const double p = (double)ps[t], q = 1.0 - p;
        const double sigma = sqrt(p * q / (double)N), rate = (double)kept / (double)N;
        const double z = (rate - q) / sigma;
        CHECK_MSG(fabs(z) <= 4.0, "keep rate %.6f, expected %.6f +- %.2g (z = %.2f)", rate, q,
                  sigma, z);
        double zl_max = 0.0;
        for (int l = 0; l < 4; l++) { /* the four words of one Philox call */
            const double nl = (double)(N / 4), zl = ((double)lane[l] / nl - q) / sqrt(p * q / nl);
            if (fabs(zl) > fabs(zl_max))
                zl_max = zl;
        }
        CHECK_MSG(fabs(zl_max) <= 4.0, "a column lane's keep rate is off by z = %.2f", zl_max);
        printf("  p = %-5g keep rate %.6f (1 - p = %.6f, sigma %.1e, z = %+.2f; worst lane z = "
               "%+.2f) over %lld elements\n",
               p, rate, q, sigma, z, zl_max, (long long)N);
        free(m);
        CASE_END();
    }

    {
        CASE_BEGIN("p = 0 keeps everything (random seed, and params NULL)");
        fa_params params;
        fa_params_init(&params);
        params.dropout_seed = tu_next_u64();
        params.dropout_offset = tu_next_u64();
        uint8_t *m = make_mask(&params, 2, 3, 17, 29);
        int64_t ones = 0;
        for (int64_t e = 0; e < 2 * 3 * 17 * 29; e++)
            ones += m[e] == 1;
        CHECK_EQ_INT(ones, 2 * 3 * 17 * 29);
        free(m);
        /* NULL params: the defaults, as for every entry point (dropout_p = 0) */
        m = make_mask(NULL, 2, 3, 17, 29);
        ones = 0;
        for (int64_t e = 0; e < 2 * 3 * 17 * 29; e++)
            ones += m[e] == 1;
        CHECK_EQ_INT(ones, 2 * 3 * 17 * 29);
        free(m);
        CASE_END();
    }

    {
        CASE_BEGIN("same (seed, offset) -> same bits; another seed or offset -> another mask");
        enum { MB = 2, MH = 3, MSQ = 40, MSK = 50 };
        const int64_t n = MB * MH * MSQ * MSK;
        fa_params a;
        fa_params_init(&a);
        a.dropout_p = 0.3f;
        a.dropout_seed = tu_next_u64();
        a.dropout_offset = tu_next_u64();
        uint8_t *m0 = make_mask(&a, MB, MH, MSQ, MSK), *m1 = make_mask(&a, MB, MH, MSQ, MSK);
        CHECK(memcmp(m0, m1, (size_t)n) == 0);
        free(m1);
        fa_params vars[5] = {a, a, a, a, a};
        const char *what[5] = {"seed + 1", "seed high half", "offset + 1", "offset high half",
                               "offset + 2^32 - 1"};
        vars[0].dropout_seed += 1;
        vars[1].dropout_seed ^= 1ull << 40;
        vars[2].dropout_offset += 1;
        vars[3].dropout_offset ^= 1ull << 33;
        vars[4].dropout_offset += 0xFFFFFFFFull;
        const double p = 0.3, expect = p * p + (1 - p) * (1 - p);
        const double sig = sqrt(expect * (1 - expect) / (double)n);
        for (int t = 0; t < 5; t++) {
            uint8_t *mv = make_mask(&vars[t], MB, MH, MSQ, MSK);
            int64_t agree = 0;
            for (int64_t e = 0; e < n; e++)
                agree += mv[e] == m0[e];
            const double rate = (double)agree / (double)n;
            /* independent masks agree with probability p² + (1-p)² */
            CHECK_MSG(fabs(rate - expect) <= 5 * sig,
                      "%s: agreement %.4f, independent masks "
                      "agree %.4f +- %.4f",
                      what[t], rate, expect, sig);
            free(mv);
        }
        free(m0);
        CASE_END();
    }

    {
        CASE_BEGIN("a mask is the corner of a bigger call's (same H), and the p = 0.5 mask "
                   "of (seed, offset) is the same for any (B, Sq, Sk)");
        fa_params params;
        fa_params_init(&params);
        params.dropout_p = 0.5f;
        params.dropout_seed = tu_next_u64();
        params.dropout_offset = tu_next_u64();
        enum { SB = 2, SH = 3, SSQ = 7, SSK = 13, BB = 4, BSQ = 20, BSK = 41 };
        uint8_t *small = make_mask(&params, SB, SH, SSQ, SSK);
        uint8_t *big = make_mask(&params, BB, SH, BSQ, BSK);
        int64_t bad = 0;
        for (int b = 0; b < SB; b++)
            for (int h = 0; h < SH; h++)
                for (int i = 0; i < SSQ; i++)
                    for (int j = 0; j < SSK; j++)
                        bad += small[((b * SH + h) * SSQ + i) * SSK + j] !=
                               big[((b * SH + h) * BSQ + i) * BSK + j];
        CHECK_MSG(bad == 0, "%lld elements differ from the bigger call's corner", (long long)bad);
        /* a single row (B = 1, Sq = 1) is row 0 of head h of batch 0 */
        uint8_t *row = make_mask(&params, 1, SH, 1, 5);
        for (int h = 0; h < SH; h++)
            for (int j = 0; j < 5; j++)
                CHECK(row[h * 5 + j] == big[(h * BSQ) * BSK + j]);
        free(small);
        free(big);
        free(row);
        CASE_END();
    }
    GROUP_END("mask statistics and properties");
}

/* ---------------------------------------------------------------------------------------------
 * 4. Forward and backward with dropout against the reference built from the mask
 * ------------------------------------------------------------------------------------------- */

static void with_dropout(bcfg c, float p, long *n, long *failed) {
    static const int dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    c.dropout_p = p;
    for (int t = 0; t < 3; t++) {
        c.dtype = dts[t];
        c.dropout_seed = tu_next_u64();
        c.dropout_offset = tu_next_u64();
        *failed += !bc_run(&c, NULL);
        (*n)++;
    }
}

static void group_reference(void) {
    long n = 0, failed = 0;
    bcfg c = bc_cfg(2, 37, 53, 4, 4, 32);
    with_dropout(c, 0.1f, &n, &failed);
    with_dropout(c, 0.5f, &n, &failed);
    with_dropout(c, 0.9f, &n, &failed);
    c.causal = 1; /* causal + GQA + softcap */
    c.Hk = 2;
    c.softcap = 4.0f;
    with_dropout(c, 0.2f, &n, &failed);
    c = bc_cfg(1, 70, 70, 8, 1, 64); /* GQA 8, multi-block, causal + ALiBi */
    c.causal = 1;
    c.alibi = 2;
    with_dropout(c, 0.3f, &n, &failed);
    c = bc_cfg(2, 29, 19, 2, 1, 7); /* Sq > Sk causal (masked rows), odd D, window */
    c.causal = 1;
    c.wl = 3;
    with_dropout(c, 0.4f, &n, &failed);
    c = bc_cfg(1, 1, 130, 4, 2, 80); /* decode-like */
    with_dropout(c, 0.25f, &n, &failed);
    c = bc_cfg(2, 23, 31, 4, 2, 16); /* views */
    c.lq = TU_PERMUTED;
    c.lk = TU_STRIDED;
    c.lo = TU_INNER2;
    c.ldo = TU_STRIDED;
    c.ldq = TU_PERMUTED;
    c.ldk = TU_INNER2;
    c.ldv = TU_STRIDED;
    c.wl = 5;
    c.wr = 5;
    with_dropout(c, 0.35f, &n, &failed);
    /* varlen: sequence b uses mask[b, h, :Sq_b, :Sk_b] */
    c = bc_cfg(0, 0, 0, 4, 2, 32);
    c.nseq = 4;
    static const int32_t sq[4] = {17, 0, 40, 5}, sk[4] = {30, 8, 33, 0};
    memcpy(c.seq_q, sq, sizeof sq);
    memcpy(c.seq_k, sk, sizeof sk);
    c.lead_q = 2;
    c.tail_q = 1;
    c.lead_k = 1;
    c.tail_k = 3;
    with_dropout(c, 0.2f, &n, &failed);
    c.causal = 1;
    c.softcap = 3.0f;
    c.Hk = 1;
    c.extra_max = 4;
    with_dropout(c, 0.6f, &n, &failed);
    group_line("forward/backward == reference(mask)", n, failed);
}

/* ---------------------------------------------------------------------------------------------
 * 5. Determinism across thread counts and runs
 * ------------------------------------------------------------------------------------------- */

static void group_determinism(void) {
    GROUP_BEGIN();
    bcfg c = bc_cfg(2, 150, 170, 4, 2, 40);
    c.causal = 1;
    c.softcap = 5.0f;
    c.dropout_p = 0.2f;
    bc_determinism_case("fp32 causal GQA softcap p=0.2", c);
    c = bc_cfg(1, 130, 200, 8, 1, 64);
    c.dtype = FA_DTYPE_F16;
    c.dropout_p = 0.5f;
    c.alibi = 1;
    c.wl = 50;
    bc_determinism_case("fp16 GQA 8 ALiBi window p=0.5", c);
    c = bc_cfg(0, 0, 0, 4, 2, 32);
    c.nseq = 3;
    c.seq_q[0] = 90;
    c.seq_q[1] = 0;
    c.seq_q[2] = 70;
    c.seq_k[0] = 100;
    c.seq_k[1] = 20;
    c.seq_k[2] = 65;
    c.lead_q = 1;
    c.tail_k = 2;
    c.causal = 1;
    c.dtype = FA_DTYPE_BF16;
    c.dropout_p = 0.3f;
    bc_determinism_case("bf16 varlen causal p=0.3", c);
    GROUP_END("determinism (threads and runs)");
}

/* ---------------------------------------------------------------------------------------------
 * 6. Errors
 * ------------------------------------------------------------------------------------------- */

/* A small valid backward problem with every buffer separately allocated and poisoned. */
typedef struct eprob {
    tu_tensor q, k, v, out, dout, lse, dq, dk, dv;
    int32_t cuq[3], cuk[3];
    fa_tensor tcuq, tcuk;
    int64_t ncu;
    fa_params params;
} eprob;

static void eprob_init(eprob *e, int varlen) {
    memset(e, 0, sizeof *e);
    double *tmp = bc_dalloc(4 * 6 * 4 * 8);
    if (varlen) {
        int64_t qs[3] = {9, 4, 8}, ks[3] = {11, 2, 8}, ls[2] = {4, 9};
        tu_alloc(&e->q, FA_DTYPE_F32, 3, qs, TU_CONTIG);
        tu_alloc(&e->k, FA_DTYPE_F32, 3, ks, TU_CONTIG);
        tu_alloc(&e->v, FA_DTYPE_F32, 3, ks, TU_CONTIG);
        tu_alloc(&e->out, FA_DTYPE_F32, 3, qs, TU_CONTIG);
        tu_alloc(&e->dout, FA_DTYPE_F32, 3, qs, TU_CONTIG);
        tu_alloc(&e->lse, FA_DTYPE_F32, 2, ls, TU_CONTIG);
        tu_alloc(&e->dq, FA_DTYPE_F32, 3, qs, TU_CONTIG);
        tu_alloc(&e->dk, FA_DTYPE_F32, 3, ks, TU_CONTIG);
        tu_alloc(&e->dv, FA_DTYPE_F32, 3, ks, TU_CONTIG);
        e->cuq[0] = 0;
        e->cuq[1] = 4;
        e->cuq[2] = 9;
        e->cuk[0] = 0;
        e->cuk[1] = 6;
        e->cuk[2] = 11;
        e->ncu = 3;
        e->tcuq = fa_tensor_contiguous(e->cuq, FA_DTYPE_I32, 1, &e->ncu);
        e->tcuk = fa_tensor_contiguous(e->cuk, FA_DTYPE_I32, 1, &e->ncu);
    } else {
        int64_t qs[4] = {2, 5, 4, 8}, ks[4] = {2, 6, 2, 8}, ls[3] = {2, 4, 5};
        tu_alloc(&e->q, FA_DTYPE_F32, 4, qs, TU_CONTIG);
        tu_alloc(&e->k, FA_DTYPE_F32, 4, ks, TU_CONTIG);
        tu_alloc(&e->v, FA_DTYPE_F32, 4, ks, TU_CONTIG);
        tu_alloc(&e->out, FA_DTYPE_F32, 4, qs, TU_CONTIG);
        tu_alloc(&e->dout, FA_DTYPE_F32, 4, qs, TU_CONTIG);
        tu_alloc(&e->lse, FA_DTYPE_F32, 3, ls, TU_CONTIG);
        tu_alloc(&e->dq, FA_DTYPE_F32, 4, qs, TU_CONTIG);
        tu_alloc(&e->dk, FA_DTYPE_F32, 4, ks, TU_CONTIG);
        tu_alloc(&e->dv, FA_DTYPE_F32, 4, ks, TU_CONTIG);
    }
    tu_fill_normal(&e->q, 1.0, tmp);
    tu_fill_normal(&e->k, 1.0, tmp);
    tu_fill_normal(&e->v, 1.0, tmp);
    tu_fill_normal(&e->out, 1.0, tmp);
    tu_fill_normal(&e->dout, 1.0, tmp);
    tu_fill_normal(&e->lse, 1.0, tmp);
    free(tmp);
    fa_params_init(&e->params);
    e->params.dropout_p = 0.25f;
    e->params.dropout_seed = 7;
}

static void eprob_free(eprob *e) {
    tu_free(&e->q);
    tu_free(&e->k);
    tu_free(&e->v);
    tu_free(&e->out);
    tu_free(&e->dout);
    tu_free(&e->lse);
    tu_free(&e->dq);
    tu_free(&e->dk);
    tu_free(&e->dv);
}

static fa_status eprob_backward(eprob *e, int varlen, const fa_tensor *dout, const fa_tensor *lse,
                                const fa_tensor *dq, const fa_tensor *dk, const fa_tensor *dv) {
    if (varlen)
        return fa_varlen_backward(NULL, &e->params, &e->q.t, &e->k.t, &e->v.t, &e->out.t, dout, lse,
                                  &e->tcuq, &e->tcuk, 5, 6, dq, dk, dv);
    return fa_backward(NULL, &e->params, &e->q.t, &e->k.t, &e->v.t, &e->out.t, dout, lse, dq, dk,
                       dv);
}

/* Runs a failing backward; checks the status, that the message names `word` (and `word2`),
 * and that no byte of any buffer changed: the problem's nine tensors and `extra` (a buffer some
 * of the views passed may point into). */
static void backward_error_case(const char *desc, int varlen, fa_status want, const char *word,
                                const char *word2, eprob *e, const fa_tensor *dout,
                                const fa_tensor *lse, const fa_tensor *dq, const fa_tensor *dk,
                                const fa_tensor *dv, const void *extra, size_t extra_bytes) {
    CASE_BEGIN("%s: %s", varlen ? "fa_varlen_backward" : "fa_backward", desc);
    tu_tensor *all[9] = {&e->q, &e->k, &e->v, &e->out, &e->dout, &e->lse, &e->dq, &e->dk, &e->dv};
    void *snap[9], *extra_snap = NULL;
    for (int i = 0; i < 9; i++)
        snap[i] = bc_snapshot(all[i]);
    if (extra) {
        extra_snap = malloc(extra_bytes);
        if (!extra_snap)
            abort();
        memcpy(extra_snap, extra, extra_bytes);
    }
    fa_status st = eprob_backward(e, varlen, dout, lse, dq, dk, dv);
    CHECK_MSG(st == want, "status %s, expected %s; message \"%s\"", fa_status_name(st),
              fa_status_name(want), fa_last_error_message());
    CHECK_MSG(tu_contains_word(fa_last_error_message(), word), "message \"%s\" does not name %s",
              fa_last_error_message(), word);
    if (word2)
        CHECK_MSG(tu_contains_word(fa_last_error_message(), word2),
                  "message \"%s\" does not name %s", fa_last_error_message(), word2);
    static const char *names[9] = {"q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 9; i++) {
        CHECK_MSG(bc_unchanged(all[i], snap[i]), "%s's buffer changed", names[i]);
        free(snap[i]);
    }
    if (extra) {
        CHECK_MSG(memcmp(extra, extra_snap, extra_bytes) == 0, "the shared dq/dk buffer changed");
        free(extra_snap);
    }
    CASE_END();
}

static void group_errors(void) {
    GROUP_BEGIN();
    /* dropout_p out of [0, 1) on every entry point */
    static const float bad_p[] = {-0.1f, -0.0001f, 1.0f, 1.5f, NAN, INFINITY, -INFINITY};
    for (size_t t = 0; t < sizeof bad_p / sizeof bad_p[0]; t++)
        for (int entry = 0; entry < 5; entry++) {
            static const char *names[5] = {"fa_forward", "fa_varlen_forward", "fa_backward",
                                           "fa_varlen_backward", "fa_dropout_mask"};
            CASE_BEGIN("%s: dropout_p = %g -> FA_ERR_VALUE naming dropout_p", names[entry],
                       (double)bad_p[t]);
            const int varlen = entry == 1 || entry == 3;
            eprob e;
            eprob_init(&e, varlen);
            e.params.dropout_p = bad_p[t];
            tu_tensor *outs[5] = {&e.out, &e.lse, &e.dq, &e.dk, &e.dv};
            void *snap[5];
            for (int i = 0; i < 5; i++)
                snap[i] = bc_snapshot(outs[i]);
            uint8_t mbuf[2 * 4 * 5 * 6];
            memset(mbuf, 0xA5, sizeof mbuf);
            int64_t ms[4] = {2, 4, 5, 6};
            fa_tensor tm = fa_tensor_contiguous(mbuf, FA_DTYPE_U8, 4, ms);
            fa_status st;
            switch (entry) {
            case 0:
                st = fa_forward(NULL, &e.params, &e.q.t, &e.k.t, &e.v.t, &e.out.t, &e.lse.t);
                break;
            case 1:
                st = fa_varlen_forward(NULL, &e.params, &e.q.t, &e.k.t, &e.v.t, &e.tcuq, &e.tcuk, 5,
                                       6, &e.out.t, &e.lse.t);
                break;
            case 4:
                st = fa_dropout_mask(&e.params, &tm);
                break;
            default:
                st = eprob_backward(&e, varlen, &e.dout.t, &e.lse.t, &e.dq.t, &e.dk.t, &e.dv.t);
                break;
            }
            CHECK_MSG(st == FA_ERR_VALUE, "status %s: %s", fa_status_name(st),
                      fa_last_error_message());
            CHECK_MSG(strstr(fa_last_error_message(), "dropout_p") != NULL,
                      "message \"%s\" does not name dropout_p", fa_last_error_message());
            int untouched = 1;
            for (int i = 0; i < 5; i++) {
                untouched &= bc_unchanged(outs[i], snap[i]);
                free(snap[i]);
            }
            for (size_t i = 0; i < sizeof mbuf; i++)
                untouched &= mbuf[i] == 0xA5;
            CHECK_MSG(untouched, "an output changed");
            eprob_free(&e);
            CASE_END();
        }
    {
        CASE_BEGIN("dropout_p just below 1 and tiny are accepted");
        eprob e;
        eprob_init(&e, 0);
        const float ok_p[3] = {0.99999994f /* largest float < 1 */, 1e-30f, 0.0f};
        for (int t = 0; t < 3; t++) {
            e.params.dropout_p = ok_p[t];
            fa_status st = fa_forward(NULL, &e.params, &e.q.t, &e.k.t, &e.v.t, &e.out.t, &e.lse.t);
            CHECK_MSG(st == FA_OK, "forward p=%g: %s", (double)ok_p[t], fa_last_error_message());
            st = eprob_backward(&e, 0, &e.dout.t, &e.lse.t, &e.dq.t, &e.dk.t, &e.dv.t);
            CHECK_MSG(st == FA_OK, "backward p=%g: %s", (double)ok_p[t], fa_last_error_message());
        }
        eprob_free(&e);
        CASE_END();
    }

    /* fa_dropout_mask's own arguments (test_errors.c has the complete list) */
    {
        uint8_t mbuf[2 * 3 * 4 * 5 + 1];
        float fbuf[2 * 3 * 4 * 5];
        int64_t ms[4] = {2, 3, 4, 5};
        fa_params params;
        fa_params_init(&params);
        params.dropout_p = 0.5f;
        struct {
            const char *desc;
            fa_status want;
            const char *word;
            int kind;
        } mc[] = {
            {"mask dtype f32", FA_ERR_DTYPE, "mask", 0},
            {"mask dtype f16", FA_ERR_DTYPE, "mask", 1},
            {"mask rank 3", FA_ERR_RANK, "mask", 2},
            {"mask rank 5", FA_ERR_RANK, "mask", 3},
            {"mask NULL", FA_ERR_NULL_POINTER, "mask", 4},
            {"params.struct_size 0", FA_ERR_STRUCT_SIZE, "struct_size", 5},
            {"mask with a zero stride (an output whose elements share bytes)", FA_ERR_STRIDE,
             "mask", 6},
        };
        for (size_t t = 0; t < sizeof mc / sizeof mc[0]; t++) {
            CASE_BEGIN("fa_dropout_mask: %s", mc[t].desc);
            memset(mbuf, 0xA5, sizeof mbuf);
            memset(fbuf, 0xA5, sizeof fbuf);
            fa_tensor m = fa_tensor_contiguous(mbuf, FA_DTYPE_U8, 4, ms);
            fa_params pp = params;
            fa_status st;
            switch (mc[t].kind) {
            case 0:
                m = fa_tensor_contiguous(fbuf, FA_DTYPE_F32, 4, ms);
                break;
            case 1:
                m.dtype = FA_DTYPE_F16;
                break;
            case 2:
                m = fa_tensor_contiguous(mbuf, FA_DTYPE_U8, 3, ms);
                break;
            case 3:
                m.ndim = 5;
                break;
            case 5:
                pp.struct_size = 0;
                break;
            case 6:
                m.stride[2] = 0;
                break;
            }
            st = fa_dropout_mask(&pp, mc[t].kind == 4 ? NULL : &m);
            CHECK_MSG(st == mc[t].want, "status %s, expected %s: %s", fa_status_name(st),
                      fa_status_name(mc[t].want), fa_last_error_message());
            CHECK_MSG(tu_contains_word(fa_last_error_message(), mc[t].word),
                      "message \"%s\" does not name %s", fa_last_error_message(), mc[t].word);
            int untouched = 1;
            for (size_t i = 0; i < sizeof mbuf; i++)
                untouched &= mbuf[i] == 0xA5;
            for (size_t i = 0; i < sizeof fbuf; i++)
                untouched &= ((unsigned char *)fbuf)[i] == 0xA5;
            CHECK_MSG(untouched, "the mask buffer changed");
            CASE_END();
        }
        CASE_BEGIN("fa_dropout_mask: params NULL means the defaults (p = 0: all ones); an "
                   "empty mask is fine");
        memset(mbuf, 0xA5, sizeof mbuf);
        fa_tensor m = fa_tensor_contiguous(mbuf, FA_DTYPE_U8, 4, ms);
        CHECK_EQ_INT(fa_dropout_mask(NULL, &m), FA_OK);
        int ones = 0;
        for (int i = 0; i < 2 * 3 * 4 * 5; i++)
            ones += mbuf[i] == 1;
        CHECK_EQ_INT(ones, 2 * 3 * 4 * 5);
        CHECK(mbuf[2 * 3 * 4 * 5] == 0xA5);
        int64_t es[4] = {2, 3, 0, 5};
        fa_tensor me = fa_tensor_contiguous(NULL, FA_DTYPE_U8, 4, es);
        CHECK_EQ_INT(fa_dropout_mask(&params, &me), FA_OK);
        CASE_END();
    }

    /* the backward's argument checks: status, the argument named, nothing written */
    for (int varlen = 0; varlen < 2; varlen++) {
        eprob e;
        eprob_init(&e, varlen);
        const fa_tensor *DO = &e.dout.t, *L = &e.lse.t, *DQ = &e.dq.t, *DK = &e.dk.t;
        const fa_tensor *DV = &e.dv.t;
        fa_tensor t;
        backward_error_case("lse NULL", varlen, FA_ERR_NULL_POINTER, "lse", NULL, &e, DO, NULL, DQ,
                            DK, DV, NULL, 0);
        t = e.lse.t;
        t.dtype = FA_DTYPE_F16;
        backward_error_case("lse fp16", varlen, FA_ERR_DTYPE, "lse", NULL, &e, DO, &t, DQ, DK, DV,
                            NULL, 0);
        t = e.lse.t;
        t.shape[t.ndim - 1] -= 1;
        backward_error_case("lse one row short", varlen, FA_ERR_SHAPE, "lse", NULL, &e, DO, &t, DQ,
                            DK, DV, NULL, 0);
        t = e.dq.t;
        t.shape[varlen ? 1 : 2] = 2; /* heads */
        backward_error_case("dq with 2 heads instead of 4", varlen, FA_ERR_SHAPE, "dq", NULL, &e,
                            DO, L, &t, DK, DV, NULL, 0);
        t = e.dq.t;
        t.shape[0] -= 1;
        backward_error_case("dq one row/batch short", varlen, FA_ERR_SHAPE, "dq", NULL, &e, DO, L,
                            &t, DK, DV, NULL, 0);
        t = e.dq.t;
        t.ndim = varlen ? 4 : 3;
        backward_error_case("dq of the wrong rank", varlen, FA_ERR_RANK, "dq", NULL, &e, DO, L, &t,
                            DK, DV, NULL, 0);
        t = e.dk.t;
        t.dtype = FA_DTYPE_F16;
        backward_error_case("dk fp16 with fp32 q", varlen, FA_ERR_DTYPE, "dk", NULL, &e, DO, L, DQ,
                            &t, DV, NULL, 0);
        t = e.dv.t;
        t.data = e.k.buf; /* dv over k: same shape, same dtype */
        backward_error_case("dv overlapping k", varlen, FA_ERR_OVERLAP, "dv", "k", &e, DO, L, DQ,
                            DK, &t, NULL, 0);
        t = e.dv.t;
        t.data = NULL;
        backward_error_case("dv data NULL", varlen, FA_ERR_NULL_POINTER, "dv", NULL, &e, DO, L, DQ,
                            DK, &t, NULL, 0);
        {
            /* dq and dk in one buffer, dk's first 8 floats being dq's last 8 */
            const size_t nq = (size_t)e.dq.numel, nk = (size_t)e.dk.numel;
            float *both = malloc((nq + nk) * sizeof(float));
            if (!both)
                abort();
            memset(both, 0xFF, (nq + nk) * sizeof(float));
            fa_tensor tq = e.dq.t, tk = e.dk.t;
            tq.data = both;
            tk.data = both + nq - 8;
            backward_error_case("dq overlapping dk", varlen, FA_ERR_OVERLAP, "dq", "dk", &e, DO, L,
                                &tq, &tk, DV, both, (nq + nk) * sizeof(float));
            free(both);
        }
        t = e.dout.t;
        t.shape[t.ndim - 1] = 4; /* D = 4 instead of 8 */
        backward_error_case("dout with D = 4 instead of 8", varlen, FA_ERR_SHAPE, "dout", NULL, &e,
                            &t, L, DQ, DK, DV, NULL, 0);
        t = e.dout.t;
        t.dtype = FA_DTYPE_BF16;
        backward_error_case("dout bf16 with fp32 q", varlen, FA_ERR_DTYPE, "dout", NULL, &e, &t, L,
                            DQ, DK, DV, NULL, 0);
        backward_error_case("dout NULL", varlen, FA_ERR_NULL_POINTER, "dout", NULL, &e, NULL, L, DQ,
                            DK, DV, NULL, 0);
        t = e.dq.t;
        t.stride[1] = 0; /* two dq elements at one address */
        backward_error_case("dq with a zero stride", varlen, FA_ERR_STRIDE, "dq", NULL, &e, DO, L,
                            &t, DK, DV, NULL, 0);
        eprob_free(&e);
    }
    GROUP_END("errors");
}

int main(void) {
    tu_seed_init("test_dropout");
    printf("library %s; %s\n", fa_version_string(), fa_build_info());
    group_philox();
    group_mask_formula();
    group_mask_stats();
    group_reference();
    group_determinism();
    group_errors();
    bc_print_table("test_dropout");
    return TEST_REPORT();
}
