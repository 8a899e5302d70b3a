/* SPDX-License-Identifier: MIT */
/*
 * testutil.h — header-only helpers shared by the C tests (kept header-only so every
 * tests/test_*.c builds alone): a seeded PRNG, fp16/bf16 <-> fp64 conversion with
 * round-to-nearest-even (written here, independent of src/), strided test tensors in several
 * memory layouts with poisoned gaps, and gather/scatter between those tensors and contiguous
 * fp64 arrays in logical order.
 */
#ifndef FA_TESTUTIL_H
#define FA_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * PRNG: splitmix64. The seed comes from FA_TEST_SEED when set, else from the clock; tests print
 * it so a failure can be replayed with FA_TEST_SEED=<seed>.
 * ------------------------------------------------------------------------------------------- */

static uint64_t tu_rng_state_;
static double tu_normal_spare_; /* tu_normal's second value, when tu_normal_have_spare_ */
static int tu_normal_have_spare_;

static inline uint64_t tu_next_u64(void) {
    uint64_t z = (tu_rng_state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Exit code ctest reads as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
#define TU_SKIP 77

/* Also skips the program when FA_CPU_ISA asks for kernels this build or CPU cannot run: the
 * library would quietly fall back to another set, and the run would test the wrong kernels. */
static inline uint64_t tu_seed_init(const char *program) {
    const char *isa = getenv("FA_CPU_ISA");
    if (isa && *isa && strstr(fa_build_info(), "ignored")) {
        printf("%s: SKIP: %s\n", program, fa_build_info());
        exit(TU_SKIP);
    }
    uint64_t seed;
    const char *env = getenv("FA_TEST_SEED");
    if (env && *env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        timespec_get(&ts, TIME_UTC);
        seed = ((uint64_t)ts.tv_sec * 1000003ull) ^ (uint64_t)ts.tv_nsec;
        seed &= 0xFFFFFFFFull; /* short enough to type back */
    }
    tu_rng_state_ = seed;
    tu_normal_have_spare_ = 0;
    printf("%s: seed %llu (replay with FA_TEST_SEED=%llu)\n", program, (unsigned long long)seed,
           (unsigned long long)seed);
    fflush(stdout);
    return seed;
}

/* Set (FA_TEST_EMULATED, by tests/CMakeLists.txt in cross builds) when the tests run under an
 * emulator such as qemu-user, which is 20-40x slower: a suite may then leave out cases whose code
 * has nothing specific to an ISA and which every native run covers, saying which. */
static inline int tu_emulated(void) {
    const char *env = getenv("FA_TEST_EMULATED");
    return env && *env && strcmp(env, "0") != 0;
}

/* Uniform in [0, 1). */
static inline double tu_uniform(void) { return (double)(tu_next_u64() >> 11) * 0x1.0p-53; }

/* Uniform integer in [lo, hi]. */
static inline int64_t tu_randint(int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_next_u64() % (uint64_t)(hi - lo + 1));
}

/* Standard normal, by Marsaglia's polar method: each accepted pair of uniforms gives two, the
 * second kept for the next call (one log and one sqrt per two values, no cos: generating the
 * inputs was a fifth of test_kvcache's time under ThreadSanitizer). */
static inline double tu_normal(void) {
    if (tu_normal_have_spare_) {
        tu_normal_have_spare_ = 0;
        return tu_normal_spare_;
    }
    double u, v, s;
    do {
        u = 2.0 * tu_uniform() - 1.0;
        v = 2.0 * tu_uniform() - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = sqrt(-2.0 * log(s) / s);
    tu_normal_spare_ = v * f;
    tu_normal_have_spare_ = 1;
    return u * f;
}

/* ---------------------------------------------------------------------------------------------
 * Rounding to a binary floating-point format, from fp64, round-to-nearest-even.
 * p = significand bits including the implicit one, emin = exponent of the smallest normal,
 * maxval = largest finite value. Overflow gives ±inf; NaN and ±inf pass through.
 * ------------------------------------------------------------------------------------------- */

static inline double tu_round_fmt(double x, int p, int emin, double maxval) {
    if (x == 0.0 || !isfinite(x))
        return x;
    int e;
    frexp(x, &e); /* x = m * 2^e, 0.5 <= |m| < 1: the leading bit has exponent e - 1 */
    int lead = e - 1;
    if (lead < emin)
        lead = emin; /* subnormal: fixed spacing 2^(emin - p + 1) */
    double ulp = ldexp(1.0, lead - (p - 1));
    double r = nearbyint(x / ulp) * ulp; /* default rounding mode: to nearest, ties to even */
    if (fabs(r) > maxval)
        r = copysign(INFINITY, x);
    return r;
}

static inline double tu_round_f16(double x) { return tu_round_fmt(x, 11, -14, 65504.0); }
static inline double tu_round_bf16(double x) { return tu_round_fmt(x, 8, -126, 0x1.FEp127); }
static inline double tu_round_f32(double x) { return tu_round_fmt(x, 24, -126, 0x1.FFFFFEp127); }

/* Encode a value already exactly representable in fp16 (or ±inf/NaN) as binary16 bits. */
static inline uint16_t tu_f16_bits_exact(double r) {
    uint16_t sign = signbit(r) ? 0x8000 : 0;
    double a = fabs(r);
    if (isnan(r))
        return 0x7E00;
    if (isinf(r))
        return (uint16_t)(sign | 0x7C00);
    if (a == 0.0)
        return sign;
    if (a < 0x1.0p-14) /* subnormal: a = mant * 2^-24 */
        return (uint16_t)(sign | (uint16_t)(a * 0x1.0p24));
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int lead = e - 1;
    uint16_t mant = (uint16_t)((m * 2.0 - 1.0) * 1024.0);
    return (uint16_t)(sign | (uint16_t)((lead + 15) << 10) | mant);
}

static inline uint16_t tu_f16_from_double(double x) { return tu_f16_bits_exact(tu_round_f16(x)); }

static inline double tu_f16_to_double(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    double v;
    if (exp == 0)
        v = ldexp((double)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp((double)(mant | 0x400), exp - 25);
    return sign ? -v : v;
}

static inline uint16_t tu_bf16_from_double(double x) {
    double r = tu_round_bf16(x);
    if (isnan(r))
        return 0x7FC0;
    float f = (float)r; /* exact: every bf16 value is a float */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static inline double tu_bf16_to_double(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

/* The rounding function of a floating dtype (NULL for fp32 is not used: fp32 rounds too). */
static inline double (*tu_round_fn(int dtype))(double) {
    switch (dtype) {
    case FA_DTYPE_F16:
        return tu_round_f16;
    case FA_DTYPE_BF16:
        return tu_round_bf16;
    default:
        return tu_round_f32;
    }
}

/* The spacing of the dtype's values at magnitude |x| (its ulp there); for x = 0 the spacing
 * at 1. */
static inline double tu_ulp(int dtype, double x) {
    int p = dtype == FA_DTYPE_F16 ? 11 : dtype == FA_DTYPE_BF16 ? 8 : 24;
    int emin = dtype == FA_DTYPE_F16 ? -14 : -126;
    int e;
    if (x == 0.0)
        x = 1.0;
    frexp(fabs(x), &e);
    int lead = e - 1 < emin ? emin : e - 1;
    return ldexp(1.0, lead - (p - 1));
}

static inline const char *tu_dtype_name(int dtype) {
    switch (dtype) {
    case FA_DTYPE_F32:
        return "fp32";
    case FA_DTYPE_F16:
        return "fp16";
    case FA_DTYPE_BF16:
        return "bf16";
    case FA_DTYPE_I32:
        return "i32";
    default:
        return "?";
    }
}

static inline size_t tu_dtype_size(int dtype) {
    return dtype == FA_DTYPE_F16 || dtype == FA_DTYPE_BF16 ? 2 : 4;
}

/* Store x (rounded to the dtype) / load element `idx` of a buffer of the dtype. */
static inline void tu_store(void *base, int dtype, int64_t idx, double x) {
    switch (dtype) {
    case FA_DTYPE_F32:
        ((float *)base)[idx] = (float)x;
        break;
    case FA_DTYPE_F16:
        ((uint16_t *)base)[idx] = tu_f16_from_double(x);
        break;
    case FA_DTYPE_BF16:
        ((uint16_t *)base)[idx] = tu_bf16_from_double(x);
        break;
    case FA_DTYPE_I32:
        ((int32_t *)base)[idx] = (int32_t)x;
        break;
    default:
        abort();
    }
}

static inline double tu_load(const void *base, int dtype, int64_t idx) {
    switch (dtype) {
    case FA_DTYPE_F32:
        return (double)((const float *)base)[idx];
    case FA_DTYPE_F16:
        return tu_f16_to_double(((const uint16_t *)base)[idx]);
    case FA_DTYPE_BF16:
        return tu_bf16_to_double(((const uint16_t *)base)[idx]);
    case FA_DTYPE_I32:
        return (double)((const int32_t *)base)[idx];
    default:
        abort();
    }
}

/* ---------------------------------------------------------------------------------------------
 * Test tensors: a strided view (fa_tensor) over a buffer the test owns.
 *
 * Layout of a view with logical dims 0..ndim-1:
 *   perm[]: memory order of the logical dims, outermost first (identity = row-major);
 *   step[]: the view takes every step[d]-th index along dim d of the buffer;
 *   pad[]:  extra buffer extent along dim d beyond shape[d] * step[d].
 * Everything in the buffer that is not an element of the view is a "gap".
 * ------------------------------------------------------------------------------------------- */

typedef enum tu_layout {
    TU_CONTIG = 0, /* row-major in logical order */
    TU_PERMUTED,   /* dims 1 and 2 swapped in memory: BHSD for a (B, S, H, D) view, (H, S, D)... */
    TU_STRIDED,    /* every other element of dim ndim-2 (e.g. every other head), padded rows */
    TU_INNER2,     /* last dim with stride 2, plus padding */
    TU_NUM_LAYOUTS
} tu_layout;

static inline const char *tu_layout_name(int layout) {
    switch (layout) {
    case TU_CONTIG:
        return "contig";
    case TU_PERMUTED:
        return "permuted";
    case TU_STRIDED:
        return "strided";
    case TU_INNER2:
        return "inner2";
    default:
        return "?";
    }
}

typedef struct tu_tensor {
    fa_tensor t;   /* the view */
    void *buf;     /* the whole buffer */
    int64_t nbuf;  /* elements in buf */
    int64_t numel; /* elements in the view */
} tu_tensor;

/* Allocates a view of the given logical shape and layout. Buffer bytes start as 0xFF
 * (NaN for every float dtype). Aborts on out of memory. */
static inline void tu_alloc(tu_tensor *x, int dtype, int ndim, const int64_t *shape, int layout) {
    int perm[FA_MAX_DIMS];
    int64_t step[FA_MAX_DIMS], pad[FA_MAX_DIMS], ext[FA_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        perm[d] = d;
        step[d] = 1;
        pad[d] = 0;
    }
    if (layout == TU_PERMUTED && ndim >= 3) {
        perm[1] = 2;
        perm[2] = 1;
    } else if (layout == TU_PERMUTED && ndim == 2) {
        perm[0] = 1;
        perm[1] = 0;
    } else if (layout == TU_STRIDED) {
        if (ndim >= 2)
            step[ndim - 2] = 2;
        pad[ndim - 1] = 3;
        if (ndim >= 3)
            pad[1] = 1;
    } else if (layout == TU_INNER2) {
        step[ndim - 1] = 2;
        pad[ndim - 1] = 1;
    }
    memset(&x->t, 0, sizeof x->t);
    x->t.dtype = dtype;
    x->t.device = FA_DEVICE_CPU;
    x->t.ndim = ndim;
    int64_t total = 1, numel = 1;
    for (int d = 0; d < ndim; d++) {
        ext[d] = shape[d] * step[d] + pad[d];
        numel *= shape[d];
    }
    /* strides: innermost memory dim first */
    int64_t acc = 1;
    for (int m = ndim - 1; m >= 0; m--) {
        int d = perm[m];
        x->t.shape[d] = shape[d];
        x->t.stride[d] = acc * step[d];
        acc *= ext[d];
    }
    total = acc;
    x->nbuf = total;
    x->numel = numel;
    size_t bytes = (size_t)(total > 0 ? total : 1) * tu_dtype_size(dtype);
    x->buf = malloc(bytes);
    if (!x->buf) {
        fprintf(stderr, "out of memory\n");
        abort();
    }
    memset(x->buf, 0xFF, bytes);
    x->t.data = x->buf;
}

static inline void tu_free(tu_tensor *x) {
    free(x->buf);
    x->buf = NULL;
    x->t.data = NULL;
}

/* Buffer offset (in elements) of the logical element with flat row-major index `flat`. */
static inline int64_t tu_offset(const fa_tensor *t, int64_t flat) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (flat % n) * t->stride[d];
        flat /= n;
    }
    return off;
}

/* Copies the view into a contiguous fp64 array in logical (row-major) order. */
static inline void tu_gather(const tu_tensor *x, double *dst) {
    for (int64_t f = 0; f < x->numel; f++)
        dst[f] = tu_load(x->buf, x->t.dtype, tu_offset(&x->t, f));
}

/* Writes src (logical order) into the view, rounding to the dtype. */
static inline void tu_scatter(tu_tensor *x, const double *src) {
    for (int64_t f = 0; f < x->numel; f++)
        tu_store(x->buf, x->t.dtype, tu_offset(&x->t, f), src[f]);
}

/* Fills the view with standard normal values times `amp`, rounded to the dtype, and returns
 * them (exactly as stored) in dst (logical order, numel doubles). The gaps stay NaN (0xFF..),
 * so reading outside the view poisons the result. */
static inline void tu_fill_normal(tu_tensor *x, double amp, double *dst) {
    for (int64_t f = 0; f < x->numel; f++) {
        int64_t off = tu_offset(&x->t, f);
        tu_store(x->buf, x->t.dtype, off, amp * tu_normal());
        dst[f] = tu_load(x->buf, x->t.dtype, off);
    }
}

/* Marks which buffer elements belong to the view (1) and which are gaps (0). */
static inline unsigned char *tu_view_mask(const tu_tensor *x) {
    unsigned char *m = calloc((size_t)(x->nbuf > 0 ? x->nbuf : 1), 1);
    if (!m)
        abort();
    for (int64_t f = 0; f < x->numel; f++)
        m[tu_offset(&x->t, f)] = 1;
    return m;
}

/* Number of gap elements whose bytes are no longer all 0xFF. */
static inline int64_t tu_count_touched_gaps(const tu_tensor *x) {
    unsigned char *m = tu_view_mask(x);
    size_t es = tu_dtype_size(x->t.dtype);
    int64_t bad = 0;
    const unsigned char *b = (const unsigned char *)x->buf;
    for (int64_t i = 0; i < x->nbuf; i++) {
        if (m[i])
            continue;
        for (size_t c = 0; c < es; c++)
            if (b[(size_t)i * es + c] != 0xFF) {
                bad++;
                break;
            }
    }
    free(m);
    return bad;
}

/* Re-poisons the whole buffer (0xFF bytes). */
static inline void tu_poison(tu_tensor *x) {
    memset(x->buf, 0xFF, (size_t)(x->nbuf > 0 ? x->nbuf : 1) * tu_dtype_size(x->t.dtype));
}

/* 1 when s contains `word` delimited by non-identifier characters (or the string ends). */
static inline int tu_contains_word(const char *s, const char *word) {
    size_t n = strlen(word);
    if (!s || n == 0)
        return 0;
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word)) {
        int before_ok =
            p == s || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                        (p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= '0' && p[-1] <= '9'));
        char a = p[n];
        int after_ok = !(a == '_' || (a >= 'a' && a <= 'z') || (a >= 'A' && a <= 'Z') ||
                         (a >= '0' && a <= '9'));
        if (before_ok && after_ok)
            return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Checking an attention result against the fp64 reference.
 *
 * out, ref, naive: (B, Sq, H, D) in logical order; lse, lse_ref, lse_naive, score_size:
 * (B, H, Sq), lse may be NULL (not checked). naive is ref_attention_forward_rounded in the dtype
 * (unused for fp32); score_size is ref_score_sizes (used for fp32; NULL = 0).
 *
 * Criteria (DESIGN.md §9):
 *  - always: no NaN/inf in out; a row whose reference lse is -inf (fully masked, or Sk = 0) must
 *    have out exactly 0 and lse exactly -inf; every other lse finite;
 *  - fp32: max|out - ref| <= 1e-5 * max(1, max|ref|) (inputs are O(1) normals, so 1 is the
 *    scale of v), and per row |lse - lse_ref| <= 1e-5 * max(1, |lse_ref|) + 8 * 2^-24 *
 *    score_size: the second term is the rounding of the row's fp32 dot products, which |lse_ref|
 *    does not show when the scores cancel against an ALiBi bias (lse 0.48 from q·k ~ 20 and a
 *    bias ~ -20 at D = 256 erred by up to 1.8e-5 on ref, avx2 and neon alike over 110,000 rows,
 *    and by 2.3e-5 on avx2 over 220,000, the worst of them 2.5x 2^-24 score_size);
 *  - fp16/bf16 (flash-attn's criterion): max|out - ref| <= 2 * max|naive - ref| + ulp(max|ref|),
 *    where ulp is the dtype's spacing at max|ref|: rounding the output alone costs up to 0.5 ulp,
 *    and a correctly rounded fp32 result within fp32 noise of a tie can land on the other
 *    neighbour, another 0.5 ulp. For lse (fp32 output computed from the same dtype inputs):
 *    max|lse - lse_ref| <= 2 * max|lse_naive - lse_ref| + 1e-5 * max(1, max|lse_ref|).
 * ------------------------------------------------------------------------------------------- */

typedef struct tu_errstats {
    double max_rel;     /* max over cases of max|out - ref| / max|ref| */
    double max_abs;     /* max over cases of max|out - ref| */
    double max_ratio;   /* fp16/bf16: max over cases of max|out-ref| / max|naive-ref| */
    double max_lse_abs; /* max over cases of max|lse - lse_ref| */
    double max_lse_rel; /* max over cases of max|lse - lse_ref| / max(1, |lse_ref|) */
    long cases;
} tu_errstats;

/* Returns 1 when the result passes; prints the first few offending elements otherwise (through
 * the harness's CHECK_MSG from test.h). */
static inline int tu_check_attention(int dtype, int64_t B, int64_t Sq, int64_t H, int64_t D,
                                     const double *out, const double *ref, const double *naive,
                                     const double *lse, const double *lse_ref,
                                     const double *lse_naive, const double *score_size,
                                     tu_errstats *st) {
    int ok = 1;
    int64_t n = B * Sq * H * D;
    double maxref = 0.0, err = 0.0, nerr = 0.0;
    int64_t worst = -1, nonfinite = 0, first_nonfinite = -1;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) {
            if (first_nonfinite < 0)
                first_nonfinite = i;
            nonfinite++;
            continue;
        }
        double a = fabs(ref[i]);
        if (a > maxref)
            maxref = a;
        double e = fabs(out[i] - ref[i]);
        if (e > err) {
            err = e;
            worst = i;
        }
        if (dtype != FA_DTYPE_F32 && naive) {
            double ne = fabs(naive[i] - ref[i]);
            if (ne > nerr)
                nerr = ne;
        }
    }
    if (nonfinite) {
        CHECK_MSG(0, "out has %lld non-finite elements (first at flat index %lld: %g)",
                  (long long)nonfinite, (long long)first_nonfinite, out[first_nonfinite]);
        ok = 0;
    }
    /* fully masked rows: exactly 0 and -inf */
    int64_t bad_masked = 0, bad_finite = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                double lr = lse_ref[(b * H + h) * Sq + i];
                const double *o = out + ((b * Sq + i) * H + h) * D;
                if (lr == -INFINITY) {
                    int row_ok = 1;
                    for (int64_t d = 0; d < D; d++)
                        if (o[d] != 0.0)
                            row_ok = 0;
                    if (lse && lse[(b * H + h) * Sq + i] != -INFINITY)
                        row_ok = 0;
                    if (!row_ok && bad_masked++ < 3)
                        CHECK_MSG(0,
                                  "fully masked row (b=%lld h=%lld i=%lld): out[0]=%g lse=%g, "
                                  "want 0 and -inf",
                                  (long long)b, (long long)h, (long long)i, o[0],
                                  lse ? lse[(b * H + h) * Sq + i] : -INFINITY);
                } else if (lse && !isfinite(lse[(b * H + h) * Sq + i])) {
                    if (bad_finite++ < 3)
                        CHECK_MSG(0, "lse (b=%lld h=%lld i=%lld) is %g, reference %.9g",
                                  (long long)b, (long long)h, (long long)i,
                                  lse[(b * H + h) * Sq + i], lr);
                }
            }
    if (bad_masked || bad_finite)
        ok = 0;

    double tol;
    if (dtype == FA_DTYPE_F32) {
        /* Any fp32 implementation rounds each score s to about 2^-24 |s| (in the exp2 domain,
         * ×1.44), which moves each probability by that relative amount and the output by up to
         * twice that times max|v|. ALiBi with negative slopes or huge logits make |s|, and so
         * this term, large; for ordinary inputs (|s| ≲ 10) it stays below 1e-6. max|lse|
         * stands in for max|s| over the keys that matter. */
        double max_lse = 0.0;
        for (int64_t t = 0; t < B * H * Sq; t++)
            if (isfinite(lse_ref[t]) && fabs(lse_ref[t]) > max_lse)
                max_lse = fabs(lse_ref[t]);
        const double scale1 = maxref > 1.0 ? maxref : 1.0;
        tol = 1e-5 * scale1 + 8.0 * 0x1p-24 * max_lse * scale1;
    } else
        tol = 2.0 * nerr + tu_ulp(dtype, maxref);
    if (!(err <= tol)) {
        int64_t w = worst;
        int64_t d = w % D, h = (w / D) % H, i = (w / D / H) % Sq, b = w / D / H / Sq;
        CHECK_MSG(0,
                  "out error %.3g > tol %.3g (max|ref| %.3g, naive error %.3g) worst at "
                  "b=%lld i=%lld h=%lld d=%lld: %.9g vs ref %.9g",
                  err, tol, maxref, nerr, (long long)b, (long long)i, (long long)h, (long long)d,
                  out[w], ref[w]);
        ok = 0;
    }

    double lerr = 0.0, lrel = 0.0, lnerr = 0.0, lmax = 0.0, lexcess = 0.0; /* lexcess: fp32 */
    if (lse) {
        int64_t m = B * H * Sq, lworst = -1;
        for (int64_t r = 0; r < m; r++) {
            if (!isfinite(lse_ref[r]) || !isfinite(lse[r]))
                continue;
            double e = fabs(lse[r] - lse_ref[r]);
            double sc = fabs(lse_ref[r]) > 1.0 ? fabs(lse_ref[r]) : 1.0;
            const double tol_r =
                1e-5 * sc +
                (dtype == FA_DTYPE_F32 && score_size ? 8.0 * 0x1p-24 * score_size[r] : 0.0);
            if (e / tol_r > lexcess) {
                lexcess = e / tol_r;
                lworst = r;
            }
            if (fabs(lse_ref[r]) > lmax)
                lmax = fabs(lse_ref[r]);
            if (e > lerr)
                lerr = e;
            if (e / sc > lrel)
                lrel = e / sc;
            if (dtype != FA_DTYPE_F32 && lse_naive) {
                double ne = fabs(lse_naive[r] - lse_ref[r]);
                if (ne > lnerr)
                    lnerr = ne;
            }
        }
        if (dtype == FA_DTYPE_F32) {
            if (!(lexcess <= 1.0)) {
                CHECK_MSG(0,
                          "lse error %.3g > tol %.3g (1e-5 max(1, |ref|) + 8 2^-24 score size "
                          "%.3g) at flat (b,h,i) index %lld: %.9g vs ref %.9g",
                          fabs(lse[lworst] - lse_ref[lworst]),
                          fabs(lse[lworst] - lse_ref[lworst]) / lexcess,
                          score_size ? score_size[lworst] : 0.0, (long long)lworst, lse[lworst],
                          lse_ref[lworst]);
                ok = 0;
            }
        } else {
            double ltol = 2.0 * lnerr + 1e-5 * (lmax > 1.0 ? lmax : 1.0);
            if (!(lerr <= ltol)) {
                CHECK_MSG(0, "lse error %.3g > tol %.3g (naive lse error %.3g)", lerr, ltol, lnerr);
                ok = 0;
            }
        }
    }
    if (st) {
        double rel = maxref > 0 ? err / maxref : err;
        if (rel > st->max_rel)
            st->max_rel = rel;
        if (err > st->max_abs)
            st->max_abs = err;
        if (dtype != FA_DTYPE_F32 && nerr > 0 && err / nerr > st->max_ratio)
            st->max_ratio = err / nerr;
        if (lerr > st->max_lse_abs)
            st->max_lse_abs = lerr;
        if (lrel > st->max_lse_rel)
            st->max_lse_rel = lrel;
        st->cases++;
    }
    return ok;
}

#endif /* FA_TESTUTIL_H */
