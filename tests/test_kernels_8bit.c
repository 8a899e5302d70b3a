/* SPDX-License-Identifier: MIT */
/*
 * test_kernels_8bit.c — the kernel set in use (FA_CPU_ISA picks it) on 8-bit KV-cache rows
 * (int8, fp8 e4m3fn, fp8 e5m2; kernels.h: the stored values, before their scales):
 *  - to_f32 on every code, n = 1..40, scales 1, -0.75 and a random one: bit for bit
 *    scale · fa__row_load (any NaN for a NaN), 8 poisoned floats either side of dst untouched;
 *  - qk_rows and pv_rows (where the set has them), m = 1..9, n spread over 1..64, d from 1 to
 *    256, decode's strides, with and without a prefetch list, against the fp64 product of the
 *    same stored values within a worst-case bound for any summation order (gamma_L, unit
 *    roundoff u = 2^-24): qk |S - S64| <= gamma_(d+8) sum |q k|, pv |O - O64| <=
 *    gamma_(n+3) (|alpha O_old| + sum |p v|). Some fp8 rows hold a NaN or infinity code: the
 *    S column or O column it reaches is NaN (or that infinity), the rest within the bound;
 *  - over-reads: every 8-bit row, Q, P and to_f32's source end at the last byte before a
 *    PROT_NONE page, so a read past them faults; S and O are poisoned around the area written
 *    (rows past m, columns past n or d) and checked untouched.
 * Links the static library: the kernel table is internal (hidden in the shared one).
 */
#define _DEFAULT_SOURCE

#include "../src/convert.h"
#include "../src/cpu/cpu.h"
#include "test.h"
#include "testutil.h"

#include <sys/mman.h>
#include <unistd.h>

enum { NMAX = 64, DMAX = 256, MMAX = 9, LDP = 128, LDS = 128, POISON = 0x7fc0dead };

static const int32_t k_dtypes[3] = {FA_DTYPE_I8, FA_DTYPE_F8_E4M3, FA_DTYPE_F8_E5M2};
static const char *const k_names[3] = {"i8", "e4m3", "e5m2"};

/* A region whose `bytes` readable bytes end where a PROT_NONE page starts; returns their start. */
static void *guarded(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), np = (bytes + page - 1) / page;
    char *base =
        mmap(NULL, (np + 1) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || mprotect(base + np * page, page, PROT_NONE) != 0) {
        perror("test_kernels_8bit: mmap");
        exit(1);
    }
    return base + np * page - bytes;
}

/* End pointers of the guarded regions: row j of K or V ends at g_rows[j] (the last d bytes
 * before it), Q and P at g_q and g_p, to_f32's source at g_src. */
static uint8_t *g_rows[NMAX];
static float *g_q, *g_p;
static uint8_t *g_src;

static void guards_init(void) {
    for (int j = 0; j < NMAX; j++)
        g_rows[j] = (uint8_t *)guarded(DMAX) + DMAX;
    g_q = (float *)guarded(MMAX * DMAX * sizeof(float)) + MMAX * DMAX;
    g_p = (float *)guarded(MMAX * LDP * sizeof(float)) + MMAX * LDP;
    g_src = (uint8_t *)guarded(256) + 256;
}

/* The poison pattern and its test, through convert.h's bit casts. */
static float poison(void) { return fa__bits_f32(POISON); }
static int is_poison(float f) { return fa__f32_bits(f) == POISON; }

/* gamma_L = L u / (1 - L u), u = 2^-24. */
static double gamma_l(int L) {
    const double lu = L * 0x1p-24;
    return lu / (1.0 - lu);
}

/* A code of dtype whose value is finite, uniform over those codes (subnormals included). */
static uint8_t finite_code(int32_t dtype) {
    for (;;) {
        const uint8_t c = (uint8_t)tu_randint(0, 255);
        const float x = dtype == FA_DTYPE_I8        ? (float)(int8_t)c
                        : dtype == FA_DTYPE_F8_E4M3 ? fa__e4m3_to_f32(c)
                                                    : fa__e5m2_to_f32(c);
        if (isfinite(x))
            return c;
    }
}

/* The non-finite code case `which` puts into a row of dtype: e4m3 NaN (either sign); e5m2 NaN
 * or an infinity (either sign); 0 for int8 (none). */
static int special_code(int32_t dtype, int which, uint8_t *code) {
    static const uint8_t e4m3[2] = {0x7f, 0xff}, e5m2[4] = {0x7e, 0xfd, 0x7c, 0xfc};
    if (dtype == FA_DTYPE_F8_E4M3)
        *code = e4m3[which % 2];
    else if (dtype == FA_DTYPE_F8_E5M2)
        *code = e5m2[which % 4];
    else
        return 0;
    return 1;
}

/* got against the fp64 value want within tol: a NaN want needs a NaN, an infinite one the same
 * infinity. */
static int close_to(float got, double want, double tol) {
    if (isnan(want))
        return isnan(got);
    if (isinf(want))
        return (double)got == want;
    return isfinite(got) && fabs((double)got - want) <= tol;
}

/* ---- to_f32 ---- */

static void test_to_f32(const fa__cpu_kernels *kern) {
    float buf[40 + 16];
    for (int di = 0; di < 3; di++) {
        const int32_t dt = k_dtypes[di];
        const float scales[3] = {1.0f, -0.75f,
                                 (float)ldexp(1.0 + tu_uniform(), (int)tu_randint(-12, 12))};
        for (int si = 0; si < 3; si++) {
            const float scale = scales[si];
            CASE_BEGIN("to_f32 %s scale %g", k_names[di], (double)scale);
            for (int n = 1; n <= 40; n++) {
                const uint8_t *src = g_src - n; /* ends at the guard page */
                for (int start = 0; start < 256; start += n) {
                    for (int t = 0; t < n; t++)
                        g_src[t - n] = (uint8_t)(start + t);
                    for (int t = 0; t < 40 + 16; t++)
                        buf[t] = poison();
                    kern->to_f32(n, src, dt, scale, buf + 8);
                    for (int t = 0; t < n; t++) {
                        const float want = scale * fa__row_load(src, dt, t), got = buf[8 + t];
                        CHECK_MSG(
                            isnan(want) ? isnan(got) : fa__f32_bits(got) == fa__f32_bits(want),
                            "n %d code 0x%02x: %a, want %a", n, src[t], (double)got, (double)want);
                    }
                    for (int t = 0; t < 8; t++)
                        CHECK_MSG(is_poison(buf[t]) && is_poison(buf[8 + n + t]),
                                  "n %d: canary %d before or after dst written", n, t);
                }
            }
            CASE_END();
        }
    }
}

/* ---- qk_rows and pv_rows ---- */

/* K or V: n rows of d codes of dtype, row j ending at g_rows[j]; with `special` >= 0, one code
 * of a random row becomes special_code(dtype, special). Fills rows[] and returns it. */
static const void **fill_rows(int n, int d, int32_t dtype, int special, const void **rows) {
    for (int j = 0; j < n; j++) {
        uint8_t *r = g_rows[j] - d;
        for (int t = 0; t < d; t++)
            r[t] = finite_code(dtype);
        rows[j] = r;
    }
    uint8_t code;
    if (special >= 0 && special_code(dtype, special, &code))
        ((uint8_t *)rows[tu_randint(0, n - 1)])[tu_randint(0, d - 1)] = code;
    return rows;
}

/* The prefetch list of case `which`: none, rows by pointers (K's rows, last first) or rows back
 * to back from a base. */
static const fa__prefetch *prefetch_of(int which, int n, int d, const void **rows,
                                       fa__prefetch *pf) {
    static char block[NMAX * DMAX];
    static const void *rev[NMAX];
    if (which % 3 == 0)
        return NULL;
    for (int j = 0; j < n; j++)
        rev[j] = rows[n - 1 - j];
    *pf = (fa__prefetch){.rows = which % 3 == 1 ? rev : NULL, .n = n, .bytes = d, .base = block};
    return pf;
}

/* S = Q Kᵀ on one case: Q [m, d] (ldq = d), S [m, n] in an [m + 2, LDS] block from row 1. */
static void qk_case(const fa__cpu_kernels *kern, int di, int m, int n, int d, int which) {
    const int32_t dt = k_dtypes[di];
    const void *rows[NMAX];
    fa__prefetch pfs;
    fill_rows(n, d, dt, which % 4 == 3 ? which / 4 : -1, rows);
    float *q = g_q - m * d; /* ends at the guard page */
    for (int t = 0; t < m * d; t++)
        q[t] = (float)tu_normal();
    static float sbuf[(MMAX + 2) * LDS];
    for (int t = 0; t < (m + 2) * LDS; t++)
        sbuf[t] = poison();
    float *s = sbuf + LDS;
    kern->qk_rows(m, n, d, q, d, rows, dt, s, LDS, prefetch_of(which, n, d, rows, &pfs));
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double want = 0.0, mag = 0.0;
            for (int t = 0; t < d; t++) {
                const double x = (double)q[i * d + t] * fa__row_load(rows[j], dt, t);
                want += x;
                mag += fabs(x);
            }
            const double tol = gamma_l(d + 8) * mag + 1e-30;
            CHECK_MSG(close_to(s[i * LDS + j], want, tol), "S[%d, %d] = %.9g, fp64 %.9g (tol %.3g)",
                      i, j, (double)s[i * LDS + j], want, tol);
        }
    for (int i = -1; i < m + 1; i++)
        for (int j = 0; j < LDS; j++)
            if (i < 0 || i >= m || j >= n)
                CHECK_MSG(is_poison(s[i * LDS + j]), "S[%d, %d] outside [%d, %d] written", i, j, m,
                          n);
}

/* O = diag(alpha) O + P V on one case: P [m, n] (LDP), O [m, d] (ldo = d or d + 7) in an
 * [m + 2, ldo] block from row 1, O_old normal, P and alpha in [0, 1). */
static void pv_case(const fa__cpu_kernels *kern, int di, int m, int n, int d, int which) {
    const int32_t dt = k_dtypes[di];
    const int ldo = which % 2 ? d + 7 : d;
    const void *rows[NMAX];
    fa__prefetch pfs;
    fill_rows(n, d, dt, which % 4 == 3 ? which / 4 : -1, rows);
    float *p = g_p - ((m - 1) * LDP + n); /* the last row's n-th value ends at the guard page */
    float alpha[MMAX];
    for (int i = 0; i < m; i++) {
        alpha[i] = (float)tu_uniform();
        for (int j = 0; j < n; j++)
            p[i * LDP + j] = (float)tu_uniform();
    }
    static float obuf[(MMAX + 2) * (DMAX + 7)], old[MMAX * DMAX];
    for (int t = 0; t < (m + 2) * ldo; t++)
        obuf[t] = poison();
    float *o = obuf + ldo;
    for (int i = 0; i < m; i++)
        for (int t = 0; t < d; t++)
            o[i * ldo + t] = old[i * d + t] = (float)tu_normal();
    kern->pv_rows(m, n, d, p, LDP, rows, dt, alpha, o, ldo, prefetch_of(which, n, d, rows, &pfs));
    for (int i = 0; i < m; i++)
        for (int t = 0; t < d; t++) {
            double want = (double)alpha[i] * old[i * d + t], mag = fabs(want);
            for (int j = 0; j < n; j++) {
                const double x = (double)p[i * LDP + j] * fa__row_load(rows[j], dt, t);
                want += x;
                mag += fabs(x);
            }
            const double tol = gamma_l(n + 3) * mag + 1e-30;
            CHECK_MSG(close_to(o[i * ldo + t], want, tol), "O[%d, %d] = %.9g, fp64 %.9g (tol %.3g)",
                      i, t, (double)o[i * ldo + t], want, tol);
        }
    for (int i = -1; i < m + 1; i++)
        for (int t = 0; t < ldo; t++)
            if (i < 0 || i >= m || t >= d)
                CHECK_MSG(is_poison(o[i * ldo + t]), "O[%d, %d] outside [%d, %d] written", i, t, m,
                          d);
}

static void test_products(const fa__cpu_kernels *kern) {
    static const int ns_full[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 47, 63, 64};
    static const int ds_full[] = {1, 3, 8, 15, 16, 31, 64, 96, 128, 200, 256};
    static const int ns_emu[] = {1, 3, 8, 13, 33, 64}, ds_emu[] = {1, 15, 16, 31, 128, 200};
    const int emu = tu_emulated();
    const int *ns = emu ? ns_emu : ns_full, *ds = emu ? ds_emu : ds_full;
    const int nn = emu ? 6 : 17, nd = emu ? 6 : 11;
    if (emu)
        printf("FA_TEST_EMULATED: n in {1, 3, 8, 13, 33, 64}, d in {1, 15, 16, 31, 128, 200}\n");
    for (int pv = 0; pv < 2; pv++) {
        if (pv ? !kern->pv_rows : !kern->qk_rows) {
            printf("%s: no %s (NULL): not tested\n", kern->name, pv ? "pv_rows" : "qk_rows");
            continue;
        }
        for (int di = 0; di < 3; di++)
            for (int dx = 0; dx < nd; dx++) {
                CASE_BEGIN("%s %s d %d", pv ? "pv_rows" : "qk_rows", k_names[di], ds[dx]);
                int which = 0;
                for (int m = 1; m <= MMAX; m++)
                    for (int nx = 0; nx < nn; nx++, which++) {
                        if (pv)
                            pv_case(kern, di, m, ns[nx], ds[dx], which);
                        else
                            qk_case(kern, di, m, ns[nx], ds[dx], which);
                        if (CASE_FAILED()) {
                            printf("  (m %d n %d, case %d: prefetch %s)\n", m, ns[nx], which,
                                   which % 3 == 0   ? "none"
                                   : which % 3 == 1 ? "rows"
                                                    : "base");
                            goto next;
                        }
                    }
            next:
                CASE_END();
            }
    }
}

int main(void) {
    tu_seed_init("test_kernels_8bit");
    const fa__cpu_kernels *kern = fa__cpu_kernels_get();
    printf("kernel set %s\n", kern->name);
    guards_init();
    test_to_f32(kern);
    test_products(kern);
    return TEST_REPORT();
}
