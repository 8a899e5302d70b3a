/* SPDX-License-Identifier: MIT */
/*
 * test_nonfinite.c — the non-finite rule (docs/semantics.md, "Non-finite values") on the kernel
 * set in use (FA_CPU_ISA picks it: tests/CMakeLists.txt runs this program once per set), for
 * fp32, fp16 and bf16, forward and backward.
 *
 * Each case draws fresh normal inputs, plants NaN, +Inf or -Inf in one element of q, k, v or
 * dout (or in every key row no query sees: the varlen lead and tail rows, the cache positions
 * past cache_seqlens, keys left of every row's window), runs the library into poisoned outputs (a
 * finite pattern, so an element left unwritten fails a NaN expectation too) and compares every
 * element with the fp64 reference computed on the same inputs, non-finite ones included. The
 * reference is the textbook formula over each row's visible keys, so it states the rule: a NaN or
 * +Inf score at a visible key makes the row NaN, a -Inf score weighs 0 (all -Inf: out = 0, lse =
 * -inf), and keys a row cannot see never reach it. An element must be NaN where the reference's is,
 * the same infinity where the reference's is infinite, and within the usual tolerances elsewhere
 * (forward: as tu_check_attention; backward: as backward_check.h's comparison with the exact
 * gradient of the backward's actual inputs, out and lse as the library's forward wrote them).
 *
 * Keys are planted where rows of one block differ in what they see (causal diagonal blocks,
 * window edges, the last keys of a decode step, of a split cache), and the shapes reach every
 * path: prefill (packed products), decode (rows in place), split-KV (few heads, thousands of
 * keys), GQA, D odd/small and 64/128, varlen and the KV cache; the backward runs once with one
 * thread (its fused schedule) and once with four (the split one).
 *
 * Prints a table: case × dtype → passed/run, then "N passed, N failed".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "reference/attention_ref.h"
#include "reference/attention_ref_backward.h"
#include "test.h"
#include "testutil.h"

enum { API_FIXED, API_VARLEN, API_KVCACHE };
enum { T_Q, T_K, T_V, T_DOUT, T_UNSEEN, T_COUNT };
enum { MAXSEQ = 4, POISON = 0x7B }; /* 0x7B bytes: a large finite value in every dtype */

static const char *const tensor_names[T_COUNT] = {"q", "k", "v", "dout", "unseen"};
static const int k_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
static const double k_values[3] = {NAN, INFINITY, -INFINITY};
static const char *const value_names[3] = {"nan", "+inf", "-inf"};

/* A problem: sequences of (sq, sk) through one of the three APIs. */
typedef struct shape {
    const char *name;
    int api, backward;
    int nseq;
    int32_t sq[MAXSEQ], sk[MAXSEQ];
    int64_t H, Hk, D;
    int causal, wl, wr;
    float softcap;
    int32_t cache;      /* API_KVCACHE: positions per cache row (sk[b] are in use) */
    int32_t lead, tail; /* API_VARLEN: key rows before the first sequence and after the last */
} shape;

/* The rows of q and k every sequence starts at, and the totals. */
typedef struct layout {
    int64_t q0[MAXSEQ], k0[MAXSEQ], tq, tk, maxq, maxk;
} layout;

static layout make_layout(const shape *s) {
    layout L;
    memset(&L, 0, sizeof L);
    for (int b = 0; b < s->nseq; b++) {
        L.q0[b] = L.tq;
        L.tq += s->sq[b];
        L.maxq = s->sq[b] > L.maxq ? s->sq[b] : L.maxq;
        L.maxk = s->sk[b] > L.maxk ? s->sk[b] : L.maxk;
    }
    int64_t k = s->api == API_VARLEN ? s->lead : 0;
    for (int b = 0; b < s->nseq; b++) {
        L.k0[b] = k;
        k += s->api == API_KVCACHE ? s->cache : s->sk[b];
    }
    L.tk = k + (s->api == API_VARLEN ? s->tail : 0);
    return L;
}

/* Is key j visible to query i of a sequence of (sq, sk)? (as ref_visible, and within sk) */
static int visible(const shape *s, int64_t sq, int64_t sk, int64_t i, int64_t j) {
    const int64_t diag = i + sk - sq, right = s->causal ? 0 : s->wr;
    if (j < 0 || j >= sk)
        return 0;
    if (s->wl >= 0 && j < diag - s->wl)
        return 0;
    if (right >= 0 && j > diag + right)
        return 0;
    return 1;
}

static int64_t row_keys(const shape *s, int b, int64_t i) {
    int64_t n = 0;
    for (int64_t j = 0; j < s->sk[b]; j++)
        n += visible(s, s->sq[b], s->sk[b], i, j);
    return n;
}

/* Does some query see key row r (of the k and v tensors)? Not the rows outside every sequence
 * (varlen lead and tail rows, cache positions past cache_seqlens), nor those left of every
 * row's window. */
static int key_seen(const shape *s, const layout *L, int64_t r) {
    for (int b = 0; b < s->nseq; b++) {
        const int64_t j = r - L->k0[b];
        if (j < 0 || j >= s->sk[b])
            continue;
        for (int64_t i = 0; i < s->sq[b]; i++)
            if (visible(s, s->sq[b], s->sk[b], i, j))
                return 1;
    }
    return 0;
}

/* ---- the table ---- */

enum { MAX_LABELS = 64 };
static char labels[MAX_LABELS][48];
static long table_pass[MAX_LABELS][3], table_run[MAX_LABELS][3];
static int nlabels;

static void table_add(const char *label, int dt, int ok) {
    int at = 0;
    while (at < nlabels && strcmp(labels[at], label) != 0)
        at++;
    if (at == nlabels) {
        if (nlabels == MAX_LABELS)
            abort();
        snprintf(labels[nlabels++], sizeof labels[0], "%s", label);
    }
    table_pass[at][dt] += ok;
    table_run[at][dt]++;
}

static void table_print(void) {
    const char *info = fa_build_info(), *set = strstr(info, "kernels: ");
    set = set ? set : info;
    const char *end = strstr(set, "; cuda"); /* the kernel sets only */
    printf("\nnon-finite rule, cpu %.*s\n", end ? (int)(end - set) : (int)strlen(set), set);
    printf("%-28s %9s %9s %9s\n", "case", "fp32", "fp16", "bf16");
    for (int at = 0; at < nlabels; at++) {
        printf("%-28s", labels[at]);
        for (int dt = 0; dt < 3; dt++) {
            char cell[32];
            snprintf(cell, sizeof cell, "%ld/%ld", table_pass[at][dt], table_run[at][dt]);
            printf(" %9s", table_run[at][dt] ? cell : "-");
        }
        printf("\n");
    }
    fflush(stdout);
}

/* ---- buffers ---- */

typedef struct buf {
    void *data;
    int64_t n;
    int dtype;
} buf;

static buf buf_new(int dtype, int64_t n) {
    buf x = {malloc((size_t)(n > 0 ? n : 1) * tu_dtype_size(dtype)), n, dtype};
    if (!x.data)
        abort();
    memset(x.data, POISON, (size_t)(n > 0 ? n : 1) * tu_dtype_size(dtype));
    return x;
}

static void buf_poison(buf *x) {
    memset(x->data, POISON, (size_t)(x->n > 0 ? x->n : 1) * tu_dtype_size(x->dtype));
}

static void buf_put(buf *x, const double *src) {
    for (int64_t t = 0; t < x->n; t++)
        tu_store(x->data, x->dtype, t, src[t]);
}

static void buf_get(const buf *x, double *dst) {
    for (int64_t t = 0; t < x->n; t++)
        dst[t] = tu_load(x->data, x->dtype, t);
}

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

/* ---- comparison ---- */

/* Counts a mismatch of element `at` of `what` (printing the first few of the case). */
static long mismatch(long bad, const char *what, int64_t at, double got, double want, double tol) {
    if (bad < 4)
        CHECK_MSG(0, "%s[%lld] = %.9g, want %.9g (tol %.3g)", what, (long long)at, got, want, tol);
    return bad + 1;
}

/* got matches want: NaN where want is NaN, the same infinity, else within tol. */
static int matches(double got, double want, double tol) {
    if (isnan(want))
        return isnan(got);
    if (isinf(want))
        return got == want;
    return isfinite(got) && fabs(got - want) <= tol;
}

/* The forward's out ([tq, H, D]) and lse ([tq, H] here) against the reference and, for fp16 and
 * bf16, the naive rounded reference: tolerances as tu_check_attention's over the finite
 * elements. Returns the number of mismatches. */
static long check_forward(int dtype, int64_t n, int64_t nl, const double *out, const double *ref,
                          const double *naive, const double *lse, const double *lref,
                          const double *lnaive) {
    double maxref = 0.0, nerr = 0.0, lmax = 0.0, lnerr = 0.0;
    for (int64_t t = 0; t < n; t++) {
        if (!isfinite(ref[t]))
            continue;
        maxref = fabs(ref[t]) > maxref ? fabs(ref[t]) : maxref;
        if (naive && isfinite(naive[t]) && fabs(naive[t] - ref[t]) > nerr)
            nerr = fabs(naive[t] - ref[t]);
    }
    for (int64_t t = 0; t < nl; t++) {
        if (!isfinite(lref[t]))
            continue;
        lmax = fabs(lref[t]) > lmax ? fabs(lref[t]) : lmax;
        if (lnaive && isfinite(lnaive[t]) && fabs(lnaive[t] - lref[t]) > lnerr)
            lnerr = fabs(lnaive[t] - lref[t]);
    }
    const double scale1 = maxref > 1.0 ? maxref : 1.0;
    const double tol = dtype == FA_DTYPE_F32 ? 1e-5 * scale1 + 8.0 * 0x1p-24 * lmax * scale1
                                             : 2.0 * nerr + tu_ulp(dtype, maxref);
    long bad = 0;
    for (int64_t t = 0; t < n; t++)
        if (!matches(out[t], ref[t], tol))
            bad = mismatch(bad, "out", t, out[t], ref[t], tol);
    for (int64_t t = 0; t < nl; t++) {
        const double lsc = fabs(lref[t]) > 1.0 ? fabs(lref[t]) : 1.0;
        const double ltol =
            dtype == FA_DTYPE_F32 ? 1e-5 * lsc : 2.0 * lnerr + 1e-5 * (lmax > 1.0 ? lmax : 1.0);
        if (!matches(lse[t], lref[t], ltol))
            bad = mismatch(bad, "lse", t, lse[t], lref[t], ltol);
    }
    return bad;
}

/* One gradient against the exact gradient of the backward's actual inputs, element by element,
 * with backward_check.h's tolerance: half an ulp of the dtype, 1e-5 of the largest finite
 * gradient, 4 fp32 ulps of the element's bound (plus 2^-8 of it where bf16 products round P and
 * dS). */
static long check_grad(const char *what, int dtype, int64_t n, const double *got,
                       const double *want, const double *bnd) {
    const char *info = fa_build_info();
    const int products = strstr(info, "+ avx512_bf16") || strstr(info, "in use: refbf16");
    const double pds = dtype == FA_DTYPE_BF16 && products ? 0x1.0p-8 : 0.0;
    double R = 0.0;
    for (int64_t t = 0; t < n; t++)
        if (isfinite(want[t]) && fabs(want[t]) > R)
            R = fabs(want[t]);
    long bad = 0;
    for (int64_t t = 0; t < n; t++) {
        const double m = fabs(got[t]) > fabs(want[t]) ? fabs(got[t]) : fabs(want[t]);
        const double b = isfinite(bnd[t]) ? bnd[t] : 0.0;
        const double tol = 0.5 * tu_ulp(dtype, m == 0.0 || !isfinite(m) ? 0x1.0p-1000 : m) +
                           1e-5 * R + (4.0 * 0x1.0p-24 + pds) * b;
        if (!matches(got[t], want[t], tol))
            bad = mismatch(bad, what, t, got[t], want[t], tol);
    }
    return bad;
}

/* ---- planting ---- */

/* Plants value v in tensor `which` of (q, k, v, dout) of shape s: see the file comment. Returns
 * a description for messages. */
static void plant(const shape *s, const layout *L, int which, double v, double *q, double *k,
                  double *vv, double *dout, char *what, size_t wsize) {
    const int64_t H = s->H, Hk = s->Hk, D = s->D, g = H / Hk;
    if (which == T_UNSEEN) { /* whole key rows no query sees: K NaN, V the value */
        int64_t rows = 0;
        for (int64_t r = 0; r < L->tk; r++) {
            if (key_seen(s, L, r))
                continue;
            rows++;
            for (int64_t t = 0; t < Hk * D; t++) {
                k[r * Hk * D + t] = NAN;
                vv[r * Hk * D + t] = v;
            }
        }
        snprintf(what, wsize, "k = nan, v = %g in the %lld key rows no query sees", v,
                 (long long)rows);
        return;
    }
    int b;
    do
        b = (int)tu_randint(0, s->nseq - 1);
    while (s->sq[b] == 0 || s->sk[b] == 0);
    const int64_t sq = s->sq[b], sk = s->sk[b];
    if (which == T_K || which == T_V) {
        /* a key that some rows of the sequence see and some do not, where there is one */
        int64_t cand[8192], nc = 0, any[8192], na = 0;
        for (int64_t j = 0; j < sk && j < 8192; j++) {
            int64_t seen = 0;
            for (int64_t i = 0; i < sq; i++)
                seen += visible(s, sq, sk, i, j);
            if (seen > 0)
                any[na++] = j;
            if (seen > 0 && seen < sq)
                cand[nc++] = j;
        }
        /* where every row sees every key: the last one, which a partial block ends on and
         * which the bf16 products pair with a zero when the keys are odd */
        const int64_t j = nc ? cand[tu_randint(0, nc - 1)] : any[na - 1];
        const int64_t hk = tu_randint(0, Hk - 1), d = tu_randint(0, D - 1);
        (which == T_K ? k : vv)[((L->k0[b] + j) * Hk + hk) * D + d] = v;
        snprintf(what, wsize, "%s[seq %d, key %lld, head %lld, d %lld] = %g (seen by %s rows)",
                 tensor_names[which], b, (long long)j, (long long)hk, (long long)d, v,
                 nc ? "some" : "all");
        return;
    }
    /* q or dout: a row that sees some key; q = -inf goes to the row that sees the fewest keys,
     * with those keys' element d made positive, so that every score of the row is -inf (rule 2:
     * a fully masked row) */
    int64_t i;
    const int all_ninf = which == T_Q && v == -INFINITY;
    if (all_ninf) {
        int64_t best = -1, fewest = 0;
        for (int64_t r = 0; r < sq; r++) {
            const int64_t nk = row_keys(s, b, r);
            if (nk > 0 && (best < 0 || nk < fewest))
                best = r, fewest = nk;
        }
        i = best;
    } else {
        do
            i = tu_randint(0, sq - 1);
        while (row_keys(s, b, i) == 0);
    }
    const int64_t h = tu_randint(0, H - 1), d = tu_randint(0, D - 1);
    (which == T_Q ? q : dout)[((L->q0[b] + i) * H + h) * D + d] = v;
    if (all_ninf)
        for (int64_t j = 0; j < sk; j++)
            if (visible(s, sq, sk, i, j)) {
                double *kj = k + ((L->k0[b] + j) * Hk + h / g) * D + d;
                *kj = fabs(*kj) + 0.5;
            }
    snprintf(what, wsize, "%s[seq %d, row %lld, head %lld, d %lld] = %g%s", tensor_names[which], b,
             (long long)i, (long long)h, (long long)d, v,
             all_ninf ? " (every score of the row -inf)" : "");
}

/* ---- one case ---- */

typedef struct refs {
    double *out, *naive, *lse, *lnaive, *dq, *dk, *dv, *bq, *bk, *bv;
} refs;

/* The fp64 references, one sequence at a time: out and lse ([tq, H]) of the forward, naive ones
 * for fp16/bf16; with given (the library's out) the exact gradients of the backward's inputs and
 * their bounds. Key rows outside every sequence get zero gradients. */
static void reference(const shape *s, const layout *L, int dtype, const double *q, const double *k,
                      const double *v, const double *dout, const double *given, refs *R) {
    const int64_t H = s->H, Hk = s->Hk, D = s->D;
    for (int b = 0; b < s->nseq; b++) {
        const int64_t sq = s->sq[b], sk = s->sk[b];
        ref_problem rp;
        memset(&rp, 0, sizeof rp);
        rp.B = 1, rp.Sq = sq, rp.Sk = sk, rp.H = H, rp.Hk = Hk, rp.D = D;
        rp.scale = 1.0 / sqrt((double)D);
        rp.causal = s->causal, rp.window_left = s->wl, rp.window_right = s->wr;
        rp.softcap = s->softcap;
        const double *qb = q + L->q0[b] * H * D, *kb = k + L->k0[b] * Hk * D;
        const double *vb = v + L->k0[b] * Hk * D;
        double *lse = dalloc(H * sq), *lnaive = dalloc(H * sq);
        ref_attention_forward(&rp, qb, kb, vb, R->out + L->q0[b] * H * D, lse);
        if (dtype != FA_DTYPE_F32)
            ref_attention_forward_rounded(&rp, qb, kb, vb, R->naive + L->q0[b] * H * D, lnaive,
                                          tu_round_fn(dtype));
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sq; i++) {
                R->lse[(L->q0[b] + i) * H + h] = lse[h * sq + i];
                R->lnaive[(L->q0[b] + i) * H + h] = lnaive[h * sq + i];
            }
        free(lse);
        free(lnaive);
        if (!given)
            continue;
        const int64_t qo = L->q0[b] * H * D, ko = L->k0[b] * Hk * D;
        ref_attention_backward_given_out(&rp, qb, kb, vb, given + qo, dout + qo, R->dq + qo,
                                         R->dk + ko, R->dv + ko);
        ref_attention_backward_bound(&rp, qb, kb, vb, dout + qo, R->bq + qo, R->bk + ko,
                                     R->bv + ko);
    }
}

static fa_context *ctx_one, *ctx_four; /* the backward's fused and split schedules */

/* A row whose every score is -inf because K holds an infinity (q·k = -1 · inf) saw no key (rule
 * 2): its lse is -inf and it adds nothing to the gradients. The backward zeroes such a row's q,
 * and 0 times that infinity in its scores was NaN in dk and dv. Window (0, 0): row i of 2 sees
 * key 63 + i alone; k[63][0] = +inf and q[0][0] = -1. */
static void check_dead_row_inf_k(int dt) {
    enum { SQ = 2, SK = 65, D = 4 };
    const int dtype = k_dtypes[dt];
    CASE_BEGIN("bwd: a row whose only score is -1 * inf adds nothing, %s", tu_dtype_name(dtype));
    double q[SQ * D], k[SK * D], v[SK * D], dout[SQ * D];
    for (int t = 0; t < SQ * D; t++)
        q[t] = 0.25 * (t % 3) + 0.125, dout[t] = tu_normal();
    for (int t = 0; t < SK * D; t++)
        k[t] = 0.0625 * (t % 7), v[t] = tu_normal();
    q[0] = -1.0, k[63 * D] = INFINITY;
    buf bq = buf_new(dtype, SQ * D), bk = buf_new(dtype, SK * D), bv = buf_new(dtype, SK * D);
    buf bo = buf_new(dtype, SQ * D), bdo = buf_new(dtype, SQ * D), bdq = buf_new(dtype, SQ * D);
    buf bdk = buf_new(dtype, SK * D), bdv = buf_new(dtype, SK * D), bl = buf_new(FA_DTYPE_F32, SQ);
    buf_put(&bq, q), buf_put(&bk, k), buf_put(&bv, v), buf_put(&bdo, dout);
    const int64_t qs[4] = {1, SQ, 1, D}, ks[4] = {1, SK, 1, D}, ls[3] = {1, 1, SQ};
    fa_tensor tq = fa_tensor_contiguous(bq.data, dtype, 4, qs);
    fa_tensor tk = fa_tensor_contiguous(bk.data, dtype, 4, ks);
    fa_tensor tv = fa_tensor_contiguous(bv.data, dtype, 4, ks);
    fa_tensor to = fa_tensor_contiguous(bo.data, dtype, 4, qs);
    fa_tensor tdo = fa_tensor_contiguous(bdo.data, dtype, 4, qs);
    fa_tensor tdq = fa_tensor_contiguous(bdq.data, dtype, 4, qs);
    fa_tensor tdk = fa_tensor_contiguous(bdk.data, dtype, 4, ks);
    fa_tensor tdv = fa_tensor_contiguous(bdv.data, dtype, 4, ks);
    fa_tensor tl = fa_tensor_contiguous(bl.data, FA_DTYPE_F32, 3, ls);
    fa_params p;
    fa_params_init(&p);
    p.window_left = 0, p.window_right = 0;
    fa_context *ctxs[2] = {ctx_one, ctx_four};
    for (int c = 0; c < 2; c++) {
        buf_poison(&bo), buf_poison(&bl), buf_poison(&bdq), buf_poison(&bdk), buf_poison(&bdv);
        fa_status st = fa_forward(ctxs[c], &p, &tq, &tk, &tv, &to, &tl);
        if (st == FA_OK)
            st = fa_backward(ctxs[c], &p, &tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv);
        CHECK_MSG(st == FA_OK, "%s: %s", fa_status_name(st), fa_last_error_message());
        double lse[SQ], dq[SQ * D], dk[SK * D], dv[SK * D];
        buf_get(&bl, lse), buf_get(&bdq, dq), buf_get(&bdk, dk), buf_get(&bdv, dv);
        CHECK_MSG(lse[0] == -INFINITY && isfinite(lse[1]), "lse %g %g", lse[0], lse[1]);
        long bad = 0;
        for (int t = 0; t < D; t++) /* row 0 and the key only it sees: exactly 0 */
            bad += dq[t] != 0.0 || dk[63 * D + t] != 0.0 || dv[63 * D + t] != 0.0;
        for (int t = 0; t < SK * D; t++) /* and nothing else is NaN or infinite */
            bad += !isfinite(dk[t]) || !isfinite(dv[t]);
        CHECK_MSG(bad == 0, "%ld elements of dq[0], dk, dv wrong on %d thread(s): dk[63] = %g, "
                  "dv[63] = %g", bad, c ? 4 : 1, dk[63 * D], dv[63 * D]);
    }
    buf *all[] = {&bq, &bk, &bv, &bo, &bdo, &bdq, &bdk, &bdv, &bl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]->data);
    table_add("bwd dead row, k inf", dt, CASE_END());
}

/* Runs shape s in dtype dt with value k_values[val] planted in tensor `which`; returns 1 when
 * every element matched. */
static int run_case(const shape *s, int dt, int which, int val) {
    const int dtype = k_dtypes[dt];
    const layout L = make_layout(s);
    const int64_t H = s->H, Hk = s->Hk, D = s->D, nq = L.tq * H * D, nk = L.tk * Hk * D;
    const int B = s->nseq;
    char what[160];
    double *q = dalloc(nq), *k = dalloc(nk), *v = dalloc(nk), *dout = dalloc(nq);
    for (int64_t t = 0; t < nq; t++)
        q[t] = tu_normal(), dout[t] = tu_normal();
    for (int64_t t = 0; t < nk; t++)
        k[t] = tu_normal(), v[t] = tu_normal();
    plant(s, &L, which, k_values[val], q, k, v, dout, what, sizeof what);
    char label[48];
    snprintf(label, sizeof label, "%s %s %s", s->backward ? "bwd" : "fwd", s->name,
             tensor_names[which]);
    CASE_BEGIN("%s, %s, %s: %s", label, tu_dtype_name(dtype), value_names[val], what);

    buf bq = buf_new(dtype, nq), bk = buf_new(dtype, nk), bv = buf_new(dtype, nk);
    buf bo = buf_new(dtype, nq), bdo = buf_new(dtype, nq);
    buf_put(&bq, q), buf_put(&bk, k), buf_put(&bv, v), buf_put(&bdo, dout);
    buf_get(&bq, q), buf_get(&bk, k), buf_get(&bv, v), buf_get(&bdo, dout); /* as rounded */
    float *lse = malloc((size_t)(L.tq * H) * sizeof(float));
    if (!lse)
        abort();
    memset(lse, POISON, (size_t)(L.tq * H) * sizeof(float));
    int32_t cu[2][MAXSEQ + 1], lens[MAXSEQ];
    cu[0][0] = 0, cu[1][0] = s->api == API_VARLEN ? s->lead : 0;
    for (int b = 0; b < B; b++) {
        cu[0][b + 1] = cu[0][b] + s->sq[b];
        cu[1][b + 1] = cu[1][b] + s->sk[b];
        lens[b] = s->sk[b];
    }
    const int64_t bshape = B, cushape = B + 1;
    const fa_tensor cuq = fa_tensor_contiguous(cu[0], FA_DTYPE_I32, 1, &cushape);
    const fa_tensor cuk = fa_tensor_contiguous(cu[1], FA_DTYPE_I32, 1, &cushape);
    fa_tensor tq, tk, tv, to, tdo, tl;
    if (s->api == API_VARLEN) {
        const int64_t qs[3] = {L.tq, H, D}, ks[3] = {L.tk, Hk, D}, ls[2] = {H, L.tq};
        tq = fa_tensor_contiguous(bq.data, dtype, 3, qs),
        to = fa_tensor_contiguous(bo.data, dtype, 3, qs);
        tdo = fa_tensor_contiguous(bdo.data, dtype, 3, qs);
        tk = fa_tensor_contiguous(bk.data, dtype, 3, ks),
        tv = fa_tensor_contiguous(bv.data, dtype, 3, ks);
        tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 2, ls);
        tl.stride[0] = 1, tl.stride[1] = H; /* lse[h, row] at row·H + h, as the rest of the test */
    } else {
        const int64_t sk = s->api == API_KVCACHE ? s->cache : s->sk[0];
        const int64_t qs[4] = {B, s->sq[0], H, D}, ks[4] = {B, sk, Hk, D}, ls[3] = {B, H, s->sq[0]};
        tq = fa_tensor_contiguous(bq.data, dtype, 4, qs),
        to = fa_tensor_contiguous(bo.data, dtype, 4, qs);
        tdo = fa_tensor_contiguous(bdo.data, dtype, 4, qs);
        tk = fa_tensor_contiguous(bk.data, dtype, 4, ks),
        tv = fa_tensor_contiguous(bv.data, dtype, 4, ks);
        tl = fa_tensor_contiguous(lse, FA_DTYPE_F32, 3, ls);
        tl.stride[0] = s->sq[0] * H, tl.stride[1] = 1, tl.stride[2] = H; /* lse[b, h, i] likewise */
    }
    fa_params prm;
    fa_params_init(&prm);
    prm.causal = s->causal, prm.window_left = s->wl, prm.window_right = s->wr;
    prm.softcap = s->softcap;
    fa_status st;
    if (s->api == API_VARLEN) {
        st = fa_varlen_forward(NULL, &prm, &tq, &tk, &tv, &cuq, &cuk, L.maxq, L.maxk, &to, &tl);
    } else if (s->api == API_KVCACHE) {
        fa_kvcache kv;
        fa_kvcache_init(&kv);
        kv.k_cache = tk, kv.v_cache = tv;
        kv.cache_seqlens = fa_tensor_contiguous(lens, FA_DTYPE_I32, 1, &bshape);
        st = fa_forward_kvcache(NULL, &prm, &tq, &kv, &to, &tl);
    } else {
        st = fa_forward(NULL, &prm, &tq, &tk, &tv, &to, &tl);
    }
    CHECK_MSG(st == FA_OK, "forward returned %s: %s", fa_status_name(st), fa_last_error_message());

    refs R;
    R.out = dalloc(nq), R.naive = dalloc(nq), R.lse = dalloc(L.tq * H), R.lnaive = dalloc(L.tq * H);
    R.dq = dalloc(nq), R.dk = dalloc(nk), R.dv = dalloc(nk);
    R.bq = dalloc(nq), R.bk = dalloc(nk), R.bv = dalloc(nk);
    double *got = dalloc(nq > nk ? nq : nk), *glse = dalloc(L.tq * H);
    buf_get(&bo, got);
    for (int64_t t = 0; t < L.tq * H; t++)
        glse[t] = lse[t];
    reference(s, &L, dtype, q, k, v, dout, s->backward ? got : NULL, &R);
    long bad =
        check_forward(dtype, nq, L.tq * H, got, R.out, dtype == FA_DTYPE_F32 ? NULL : R.naive, glse,
                      R.lse, dtype == FA_DTYPE_F32 ? NULL : R.lnaive);

    /* Some element of the reference must be non-finite where the value reaches a visible key
     * (but an infinity in k may give every row that sees it a -inf score, of weight 0, and
     * softcap caps an infinity in q), and none where no query sees it: otherwise the case would
     * not test the rule. */
    long nonfinite = 0;
    for (int64_t t = 0; t < nq; t++)
        nonfinite += !isfinite(R.out[t]);
    for (int64_t t = 0; t < L.tq * H; t++)
        nonfinite += R.lse[t] == -INFINITY || isnan(R.lse[t]);
    if (which == T_UNSEEN)
        CHECK_MSG(nonfinite == 0, "the reference has %ld non-finite", nonfinite);
    else if (which != T_DOUT && !(which == T_K && val != 0) &&
             !(which == T_Q && val != 0 && s->softcap > 0))
        CHECK_MSG(nonfinite > 0, "the planted value reaches no row of the reference");

    if (s->backward) {
        buf bdq = buf_new(dtype, nq), bdk = buf_new(dtype, nk), bdv = buf_new(dtype, nk);
        fa_tensor gq = tq, gk = tk, gv = tv;
        gq.data = bdq.data, gk.data = bdk.data, gv.data = bdv.data;
        fa_context *ctxs[2] = {ctx_one, ctx_four};
        for (int c = 0; c < 2; c++) {
            buf_poison(&bdq), buf_poison(&bdk), buf_poison(&bdv);
            if (s->api == API_VARLEN)
                st = fa_varlen_backward(ctxs[c], &prm, &tq, &tk, &tv, &to, &tdo, &tl, &cuq, &cuk,
                                        L.maxq, L.maxk, &gq, &gk, &gv);
            else
                st = fa_backward(ctxs[c], &prm, &tq, &tk, &tv, &to, &tdo, &tl, &gq, &gk, &gv);
            CHECK_MSG(st == FA_OK, "backward (%d threads) returned %s: %s", c ? 4 : 1,
                      fa_status_name(st), fa_last_error_message());
            const char *names[2][3] = {{"dq (1 thread)", "dk (1 thread)", "dv (1 thread)"},
                                       {"dq (4 threads)", "dk (4 threads)", "dv (4 threads)"}};
            buf_get(&bdq, got);
            bad += check_grad(names[c][0], dtype, nq, got, R.dq, R.bq);
            buf_get(&bdk, got);
            bad += check_grad(names[c][1], dtype, nk, got, R.dk, R.bk);
            buf_get(&bdv, got);
            bad += check_grad(names[c][2], dtype, nk, got, R.dv, R.bv);
        }
        free(bdq.data), free(bdk.data), free(bdv.data);
    }
    CHECK_MSG(bad == 0, "%ld elements differ from the reference", bad);
    const int ok = CASE_END();
    table_add(label, dt, ok);

    free(q), free(k), free(v), free(dout), free(lse), free(got), free(glse);
    free(bq.data), free(bk.data), free(bv.data), free(bo.data), free(bdo.data);
    free(R.out), free(R.naive), free(R.lse), free(R.lnaive), free(R.dq), free(R.dk), free(R.dv);
    free(R.bq), free(R.bk), free(R.bv);
    return ok;
}

int main(void) {
    tu_seed_init("test_nonfinite");
    fa_context_options o;
    fa_context_options_init(&o);
    o.num_threads = 1;
    if (fa_context_create(&o, &ctx_one) != FA_OK)
        return 1;
    o.num_threads = 4;
    if (fa_context_create(&o, &ctx_four) != FA_OK)
        return 1;

    /* name, api, backward, nseq, sq, sk, H, Hk, D, causal, wl, wr, softcap, cache, lead, tail */
    const shape shapes[] = {
        /* forward */
        {"prefill", API_FIXED, 0, 1, {160}, {160}, 4, 2, 64, 1, -1, -1, 0, 0, 0, 0},
        {"window D7", API_FIXED, 0, 2, {150, 150}, {250, 250}, 2, 1, 7, 0, 40, 8, 0, 0, 0, 0},
        {"decode", API_FIXED, 0, 2, {3, 3}, {300, 300}, 8, 2, 128, 1, -1, -1, 0, 0, 0, 0},
        /* every row sees all 17 keys: decode's products on an unmasked block with an odd key */
        {"decode odd", API_FIXED, 0, 1, {4}, {17}, 8, 2, 64, 0, -1, -1, 0, 0, 0, 0},
        {"split", API_KVCACHE, 0, 1, {4}, {3000}, 4, 1, 64, 1, -1, -1, 0, 3100, 0, 0},
        {"kvcache window",
         API_KVCACHE,
         0,
         2,
         {1, 1},
         {700, 410},
         8,
         8,
         128,
         0,
         100,
         -1,
         0,
         800,
         0,
         0},
        {"varlen D33",
         API_VARLEN,
         0,
         3,
         {70, 1, 140},
         {90, 130, 140},
         4,
         4,
         33,
         1,
         -1,
         -1,
         0,
         0,
         5,
         7},
        /* backward */
        {"prefill", API_FIXED, 1, 1, {150}, {150}, 4, 2, 64, 1, -1, -1, 0, 0, 0, 0},
        {"window D5", API_FIXED, 1, 2, {100, 100}, {160, 160}, 2, 1, 5, 0, 30, 10, 0, 0, 0, 0},
        {"decode", API_FIXED, 1, 2, {3, 3}, {160, 160}, 4, 2, 128, 1, -1, -1, 0, 0, 0, 0},
        {"softcap", API_FIXED, 1, 1, {130}, {140}, 2, 2, 32, 1, -1, -1, 5.0f, 0, 0, 0},
        {"varlen D32", API_VARLEN, 1, 2, {60, 100}, {80, 100}, 2, 2, 32, 1, -1, -1, 0, 0, 3, 4},
        /* row 0 sees keys 63..127, row 1 keys 64..128: the tiles of keys 0..63 and of key 128
         * are each seen by one row, beside the other of its pair (bf16 pairs rows 2t, 2t + 1) */
        {"odd edges", API_FIXED, 1, 1, {2}, {129}, 2, 1, 16, 0, 64, 0, 0, 0, 0, 0},
    };
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const shape *s = &shapes[c];
        for (int which = 0; which < T_COUNT; which++) {
            if (which == T_DOUT && !s->backward)
                continue;
            if (which == T_UNSEEN) {
                const layout L = make_layout(s);
                int64_t unseen = 0;
                for (int64_t r = 0; r < L.tk; r++)
                    unseen += !key_seen(s, &L, r);
                if (unseen == 0)
                    continue;
            }
            for (int dt = 0; dt < 3; dt++)
                for (int val = 0; val < 3; val++)
                    run_case(s, dt, which, val);
        }
    }
    for (int dt = 0; dt < 3; dt++)
        check_dead_row_inf_k(dt);
    table_print();
    fa_context_destroy(ctx_one);
    fa_context_destroy(ctx_four);
    return TEST_REPORT();
}
