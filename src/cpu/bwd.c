/* SPDX-License-Identifier: MIT */
/*
 * bwd.c — the CPU backward pass, deterministic and free of atomics: every gradient element is
 * written by exactly one task, from sums taken in a fixed order.
 *
 * With P = softmax(S) (S the scores after softcap, ALiBi and mask), Pd = P∘M/(1-p) the dropped
 * probabilities (M the dropout mask) and Δ_i = Σ_d dO_id O_id:
 *   dV = Pdᵀ dO,   dPd = dO Vᵀ,   dS = P∘(dPd∘M/(1-p) − Δ)  (∘ (1 − tanh²) with softcap),
 *   dQ = scale · dS K,   dK = scale · dSᵀ Q.
 * P is recomputed from the saved lse, so no O(Sq·Sk) state is kept. Pass 0 computes Δ for every
 * (batch, head, row), tasks (b, h); then one of two schedules computes the gradients from tiles
 * (S, P, dPd, dS: [Br, Bc]) of query blocks at multiples of Br and key blocks at multiples of Bc:
 *   split (three passes, any number of tasks):
 *     1. dK, dV of FA_KV_TASK key blocks of one KV head,          tasks: (b, hk, key blocks)
 *        summed over the query heads that share it and every query block that sees it
 *     2. dQ of one query block of one head                         tasks: (b, h, query block)
 *     Each tile is built twice, once per pass: 7 products per tile.
 *   fused (when there are enough (b, hk) to keep the threads busy and its scratch is small):
 *     one task per (b, hk) builds each tile once and feeds dK, dV and dQ from it: 5 products.
 *     It keeps the head's dK, dV sums and packed Kᵀ, Vᵀ in scratch, O(Sk·(D + Dv)) per thread.
 * Both schedules visit the same tiles and add each one's terms to every gradient row in the same
 * order (query heads, then query blocks, for dK and dV; key blocks for dQ), so they give bitwise
 * the same gradients and the choice, which depends on the thread count, never shows in results.
 * Both feed P and dS to dK and dV's products as transposed left operands: read in place by pv_t
 * where the kernel set has it, else transposed into scratch for pv.
 * q, k, dq and dk have head dim D; v, out, dout and dv have Dv (D or not): S and dQ, dK sum
 * over D, dPd, Δ and dV over Dv.
 * bf16 inputs on a CPU with a bf16 dot product run all five products on bf16 pairs: S and dPd
 * from the inputs (exact products), dV, dK and dQ from Pd and dS rounded to bf16, as flash-attn
 * and PyTorch round them. dK and dV read Pdᵀ and dSᵀ as pairs of query rows (r, r + 1), built
 * from rows aligned to the query block; a row of a pair outside the tile's rows counts as 0.
 * Without dropout or softcap one kernel step per pair of rows (bwd_pair_bf16) turns S and dP
 * into those pairs and dS's bf16 rows, bitwise as the separate steps do.
 */
#include "cpu.h"
#include "../convert.h"
#include "../size.h"
#include "tile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    FA_KV_TASK = 4, /* key blocks per dK/dV task: Q and dO are loaded once for all of them */
    /* Query rows per tile: 126 = 14 x 9 = 21 x 6 (the avx512 and avx2 tiles' rows), or 252
     * once some query sequence has FA_BR_LONG_FROM rows: twice the rows per dK, dV product halve
     * the loads and stores of their sums per FLOP (1-2.7% faster at S = 2048 and 4096), where at
     * S = 512 and 1024 causal tiles that long compute more of the masked corner (1% slower). */
    FA_BR_SHORT = 126,
    FA_BR_LONG = 252,
    FA_BR_LONG_FROM = 2048,
    FA_ONES = FA_BR_LONG > (int)FA_BC ? FA_BR_LONG : (int)FA_BC, /* length of the ones vector */
    FA_FUSED_TASKS = 2, /* fused when every thread gets at least this many (b, hk) tasks */
    FA_DELTA_AHEAD = 16 /* rows of out and dout the Δ pass asks for ahead of its reads */
};

/* Most floats of per-thread head scratch the fused schedule may take (64 MiB). */
#define FA_FUSED_MAX_FLOATS ((size_t)16 << 20)

typedef struct bwd_plan {
    const fa__problem *p;
    const fa__cpu_kernels *kern;
    int64_t g;                  /* query heads per KV head */
    int64_t br;                 /* query rows per tile: FA_BR_SHORT or FA_BR_LONG */
    float qscale, softcap_l2;   /* fa__score_scales */
    float *delta;               /* Δ, indexed by delta_index */
    int64_t *start[3];          /* per pass: [B + 1] first task of each batch */
    float *scratch;             /* [threads][scratch_floats] */
    size_t scratch_floats;
    int bf16;                   /* bf16 inputs, bf16 dot product: every product on bf16 pairs */
    int pair_step;              /* bf16 without dropout or softcap: tile() calls bwd_pair_bf16 */
    float *head;                /* fused only: [threads][head_floats] */
    size_t head_floats;
    const int32_t *cancel;      /* the call's cancel flag (fa__call_cancel), read per query block */
} bwd_plan;

/* Per-worker scratch, carved in a fixed order. */
typedef struct bwd_scratch {
    float *Q, *dO;      /* [Br, D], [Br, Dv]: q pre-scaled as in the forward, dout (plan bf16:
                           unused) */
    uint32_t *Q2, *dO2; /* [Br, D/2], [Br, Dv/2] pairs: q (unscaled) and dout as bf16 (plan bf16
                           only) */
    uint32_t *Qp, *dOp; /* plan bf16 only: [Br/2, D], [Br/2, Dv] pairs of rows (2t, 2t + 1) of
                           Q2, dO2 */
    uint32_t *PX, *dSX; /* plan bf16 only: [Br/2, Bc] pairs of rows of Pd, dS (as Qp) */
    uint32_t *dS2;      /* plan bf16 only: [Br, Bc/2] dS as bf16 pairs along keys (tile()) */
    float *zeros;       /* plan bf16 only: [max(Bc, D, Dv)] a row outside the tile */
    float *P, *dS;      /* [Br, Bc] */
    float *PT, *dST;    /* [Bc, Br]: transposes for pass 1 (plan bf16: unused) */
    float *Kt, *Vt;     /* [FA_KV_TASK][D, Bc], [FA_KV_TASK][Dv, Bc] (bf16: [D/2, Bc] pairs);
                           pass 2 uses the first */
    float *K;           /* [Bc, D] (pass 2) */
    float *tmp;         /* [Bc, max(D, Dv)]: rows on their way to a transpose */
    float *acc1, *acc2; /* pass 1: dK [FA_KV_TASK·Bc, D], dV [FA_KV_TASK·Bc, Dv]; pass 2: dQ
                           [Br, D] in acc1 */
    float *lse2, *dlt;  /* [Br]: lse in the exp2 domain, Δ */
    float *dtanh;       /* [Bc] */
    float *praw;        /* [Bc]: one row of P before dropout */
    float *ones;        /* [FA_ONES] */
    uint8_t *row_finite; /* [Br]: q and dout of a loaded row: 1 finite, 2 not, 0 not looked at */
} bwd_scratch;

/* The larger of two sizes. */
static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

static size_t carve(bwd_scratch *s, float *base, const fa__problem *p, int bf16, int64_t br) {
    const int64_t D = p->D, Dv = p->Dv;
    const size_t rd = fa__round_up((size_t)br * D), cd = fa__round_up((size_t)FA_BC * D);
    const size_t rdv = fa__round_up((size_t)br * Dv), cdv = fa__round_up((size_t)FA_BC * Dv);
    const size_t rc = fa__round_up((size_t)br * FA_BC), r = fa__round_up(br);
    const size_t c = fa__round_up(FA_BC), m = fa__round_up(FA_ONES), kcd = FA_KV_TASK * cd;
    const size_t kcdv = FA_KV_TASK * cdv, cdm = fa__round_up((size_t)FA_BC * max2(D, Dv));
    const size_t rdf = bf16 ? 0 : rd, rdvf = bf16 ? 0 : rdv; /* fp32 rows */
    const size_t rct = bf16 ? 0 : rc;                         /* fp32 transposes */
    const size_t rd2 = bf16 ? fa__round_up((size_t)br * ((D + 1) / 2)) : 0;
    const size_t rdv2 = bf16 ? fa__round_up((size_t)br * ((Dv + 1) / 2)) : 0;
    const size_t pd = bf16 ? fa__round_up((size_t)(br + 1) / 2 * D) : 0;
    const size_t pdv = bf16 ? fa__round_up((size_t)(br + 1) / 2 * Dv) : 0;
    const size_t pc = bf16 ? fa__round_up((size_t)(br + 1) / 2 * FA_BC) : 0;
    const size_t rc2 = bf16 ? fa__round_up((size_t)br * FA_BC / 2) : 0;
    const size_t z = bf16 ? fa__round_up((size_t)max2(max2(D, Dv), FA_BC)) : 0;
    float *at = base;
#define FA_TAKE(field, n) (s->field = (void *)at, at += (n))
    FA_TAKE(Q, rdf), FA_TAKE(dO, rdvf), FA_TAKE(Q2, rd2), FA_TAKE(dO2, rdv2);
    FA_TAKE(Qp, pd), FA_TAKE(dOp, pdv), FA_TAKE(PX, pc), FA_TAKE(dSX, pc), FA_TAKE(dS2, rc2);
    FA_TAKE(zeros, z);
    FA_TAKE(P, rc), FA_TAKE(dS, rc), FA_TAKE(PT, rct);
    FA_TAKE(dST, rct), FA_TAKE(Kt, kcd), FA_TAKE(Vt, kcdv), FA_TAKE(K, cd), FA_TAKE(tmp, cdm);
    FA_TAKE(acc1, rd > kcd ? rd : kcd), FA_TAKE(acc2, kcdv), FA_TAKE(lse2, r), FA_TAKE(dlt, r);
    FA_TAKE(dtanh, c), FA_TAKE(praw, c), FA_TAKE(ones, m), FA_TAKE(row_finite, r);
#undef FA_TAKE
    return (size_t)(at - base);
}

static int64_t delta_index(const fa__problem *p, int64_t b, int64_t h, int64_t i) {
    if (p->cu_q) return h * p->total_q + p->cu_q[b] + i;
    return (b * p->H + h) * p->Sq + i;
}

/* One row of n elements (x's head dim) of x at src as fp32 times scale: through the kernel
 * set's to_f32 when contiguous. */
static void load_row(const bwd_plan *pl, float *dst, const void *src, const fa__view *x, int64_t n,
                     float scale) {
    if (x->sd == 1) pl->kern->to_f32((int)n, src, x->dtype, scale, dst);
    else fa__load_f32(dst, 1, src, x->dtype, n, x->sd, scale);
}

/* ---- pass 0: Δ_i = Σ_d dO_id O_id ---- */

static void delta_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    const int64_t b = fa__task_batch(pl->start[0], p->B, task);
    const int64_t h = task - pl->start[0][b], rq = fa__row0_q(p, b), D = p->Dv; /* out's */
    float *o = pl->scratch + (size_t)worker * pl->scratch_floats, *d = o + fa__round_up((size_t)D);
    const int64_t sq = fa__seqlen_q(p, b);
    for (int64_t i = 0; i < sq; i++) {
        const int64_t next = i + FA_DELTA_AHEAD, left = sq - next; /* rows a head apart: asked */
        if (i % FA_DELTA_AHEAD == 0 && left > 0) {                  /* for a group ahead */
            const int64_t n = left < FA_DELTA_AHEAD ? left : FA_DELTA_AHEAD;
            fa__prefetch_block(&p->out, b, rq + next, n, h, D);
            fa__prefetch_block(&p->dout, b, rq + next, n, h, D);
        }
        load_row(pl, o, fa__elem(&p->out, b, rq + i, h), &p->out, D, 1.0f);
        load_row(pl, d, fa__elem(&p->dout, b, rq + i, h), &p->dout, D, 1.0f);
        float part[16] = {0}, acc = 0.0f; /* 16 running sums, which the compiler vectorizes */
        int64_t t = 0;
        for (; t + 16 <= D; t += 16)
            for (int u = 0; u < 16; u++) part[u] += o[t + u] * d[t + u];
        for (; t < D; t++) acc += o[t] * d[t];
        for (int u = 0; u < 16; u++) acc += part[u];
        pl->delta[delta_index(p, b, h, i)] = acc;
    }
}

/* The sink's gradient of head `task`: the sink is a key whose value is 0, so with P_s =
 * exp(s - lse) (lse including the sink) dL/ds = -Σ_{b,i} P_s Δ_bi, summed in fp64 in the order
 * b, i. Rows the forward gave lse = -inf (none without a sink, which gives lse >= s) add
 * nothing, as in the tiles. */
static void dsink_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const bwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    const int64_t h = task;
    const double s = p->sinks[h * p->sinks_sh];
    double acc = 0.0;
    for (int64_t b = 0; s != -INFINITY && b < p->B; b++) {
        const int64_t rq = fa__row0_q(p, b), sq = fa__seqlen_q(p, b);
        for (int64_t i = 0; i < sq; i++) {
            const float lse = p->lse[b * p->lse_sb + h * p->lse_sh + (rq + i) * p->lse_ss];
            if (lse != -INFINITY) acc -= exp(s - lse) * pl->delta[delta_index(p, b, h, i)];
        }
    }
    p->dsinks[h * p->dsinks_sh] = (float)acc;
}

/* ---- the shared tile ---- */

/* Loads Q (pre-scaled), dO, lse (exp2 domain; +inf for rows that saw no key, so P = 0, and their
 * q, dout and Δ as 0) and Δ of rows i0..i0+nr of head h. */
static void load_rows(const bwd_plan *pl, const bwd_scratch *s, int64_t b, int64_t h, int64_t i0,
                      int64_t nr) {
    const fa__problem *p = pl->p;
    const int64_t rq = fa__row0_q(p, b), D = p->D, Dv = p->Dv;
    const int64_t D2 = (D + 1) / 2, Dv2 = (Dv + 1) / 2;
    memset(s->row_finite, 0, (size_t)nr);
    for (int64_t r = 0; r < nr; r++) {
        const int64_t i = i0 + r;
        const void *q = fa__elem(&p->q, b, rq + i, h), *dout = fa__elem(&p->dout, b, rq + i, h);
        if (pl->bf16) { /* every product takes bf16 pairs: no fp32 rows */
            fa__copy_bf16_row((uint16_t *)(s->Q2 + r * D2), q, D, p->q.sd);
            fa__copy_bf16_row((uint16_t *)(s->dO2 + r * Dv2), dout, Dv, p->dout.sd);
        } else {
            load_row(pl, s->Q + r * D, q, &p->q, D, pl->qscale);
            load_row(pl, s->dO + r * Dv, dout, &p->dout, Dv, 1.0f);
        }
        const float lse = p->lse[b * p->lse_sb + h * p->lse_sh + (rq + i) * p->lse_ss];
        s->lse2[r] = lse == -INFINITY ? INFINITY : lse * FA_LOG2E;
        s->dlt[r] = pl->delta[delta_index(p, b, h, i)];
        if (lse == -INFINITY) { /* the row saw no key: it adds nothing, not 0 times its q or */
            s->dlt[r] = 0.0f;   /* dout, which may hold an infinity (all scores -inf) */
            if (pl->bf16) {
                memset(s->Q2 + r * D2, 0, (size_t)D2 * sizeof(uint32_t));
                memset(s->dO2 + r * Dv2, 0, (size_t)Dv2 * sizeof(uint32_t));
            } else {
                memset(s->Q + r * D, 0, (size_t)D * sizeof(float));
                memset(s->dO + r * Dv, 0, (size_t)Dv * sizeof(float));
            }
        }
    }
    if (!pl->bf16) return;
    for (int64_t r = 0; r < nr; r += 2) { /* rows (r, r + 1) as pairs; a row past nr is 0 */
        const uint16_t *zero = (const uint16_t *)s->zeros;
        pl->kern->interleave_bf16((int)D, (const uint16_t *)(s->Q2 + r * D2),
                                  r + 1 < nr ? (const uint16_t *)(s->Q2 + (r + 1) * D2) : zero,
                                  s->Qp + r / 2 * D);
        pl->kern->interleave_bf16((int)Dv, (const uint16_t *)(s->dO2 + r * Dv2),
                                  r + 1 < nr ? (const uint16_t *)(s->dO2 + (r + 1) * Dv2) : zero,
                                  s->dOp + r / 2 * Dv);
    }
}

/* The bf16 step without dropout or softcap (plan pair_step), from S (masked) and dP in s->P and
 * s->dS over rows [lo, hi) and n keys: dS as bf16 in s->dS2, and when dkdv, Pd and dS as pairs
 * of rows (r, r + 1) from an even r in s->PX, s->dSX (a row outside [lo, hi) counts as 0). */
static void pair_step(const bwd_plan *pl, const bwd_scratch *s, int64_t lo, int64_t hi, int64_t n,
                      int dkdv) {
    const int64_t r0 = lo & ~(int64_t)1;
    for (int64_t r = r0; r < hi; r += 2) {
        const float *sc[2] = {NULL, NULL}, *dp[2] = {NULL, NULL};
        float lse[2] = {0.0f, 0.0f}, dlt[2] = {0.0f, 0.0f};
        uint16_t *ds2[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            const int64_t row = r + k;
            if (row < lo || row >= hi) continue;
            if (s->lse2[row] == INFINITY) { /* saw no key: a row of zeros (see tile()) */
                memset(s->dS2 + row * (FA_BC / 2), 0, FA_BC / 2 * sizeof(uint32_t));
                continue;
            }
            sc[k] = s->P + row * FA_BC, dp[k] = s->dS + row * FA_BC;
            lse[k] = s->lse2[row], dlt[k] = s->dlt[row];
            ds2[k] = (uint16_t *)(s->dS2 + row * (FA_BC / 2));
        }
        const int64_t t = (r - r0) / 2;
        pl->kern->bwd_pair_bf16((int)n, sc, dp, lse, dlt, ds2, dkdv ? s->PX + t * FA_BC : NULL,
                                dkdv ? s->dSX + t * FA_BC : NULL);
    }
}

/* The pairs add_dkdv takes after the separate steps (plan bf16, not pair_step): Pd and dS as
 * pairs of rows (r, r + 1) from an even r in s->PX, s->dSX, over rows [lo, hi) and n keys (a row
 * outside them counts as 0). */
static void pair_rows(const bwd_plan *pl, const bwd_scratch *s, int64_t lo, int64_t hi, int64_t n) {
    const int64_t r0 = lo & ~(int64_t)1, pairs = (hi - r0 + 1) / 2;
    const uint16_t *zero = (const uint16_t *)s->zeros, *ds2 = (const uint16_t *)s->dS2;
    for (int64_t t = 0; t < pairs; t++) { // PX, dSX: [pairs, n]
        const int64_t r = r0 + 2 * t;
        const float *p0 = r >= lo ? s->P + r * FA_BC : s->zeros;
        const float *p1 = r + 1 < hi ? s->P + (r + 1) * FA_BC : s->zeros;
        const uint16_t *d0 = r >= lo ? ds2 + r * FA_BC : zero; // dS as bf16: [Br, Bc]
        const uint16_t *d1 = r + 1 < hi ? ds2 + (r + 1) * FA_BC : zero;
        pl->kern->pair_bf16((int)n, p0, p1, s->PX + t * FA_BC);
        pl->kern->interleave_bf16((int)n, d0, d1, s->dSX + t * FA_BC); /* dS is bf16 already */
    }
}

/* S of the tile's rows [r0, r1) (positions i0 + r of head h) against keys j0..j0+n into s->P,
 * each row by the products the forward summed its scores with (fa__fwd_score_rows): P is
 * 2^(S - lse) with the forward's lse, so a score summed in another order would leave P off by
 * its rounding. Packed: Kt ([D, Bc]; plan bf16: pairs, exact products). Decode's: K's rows in
 * place, on fp32 Q (in plan bf16, converted here into s->tmp, as the forward converted it) or
 * on the bf16 pairs of plan bf16. */
static void scores(const bwd_plan *pl, const bwd_scratch *s, const float *Kt, int64_t b, int64_t h,
                   int64_t i0, int64_t r0, int64_t r1, int64_t j0, int64_t n) {
    const fa__problem *p = pl->p;
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t D = p->D, D2 = (D + 1) / 2;
    int64_t from; /* rows [split, r1) are on decode's products, the ones before on the prefill's */
    const fa__score_path path = fa__fwd_score_rows(p, kern, b, &from);
    const int64_t split = from - i0 < r0 ? r0 : from - i0 > r1 ? r1 : from - i0;
    if (split > r0) { // S: [split - r0, n]
        if (pl->bf16)
            kern->qk_bf16((int)(split - r0), (int)n, (int)D2, s->Q2 + r0 * D2, D2,
                          (const uint32_t *)Kt, FA_BC, pl->qscale, s->P + r0 * FA_BC, FA_BC);
        else
            kern->qk((int)(split - r0), (int)n, (int)D, s->Q + r0 * D, D, Kt, FA_BC,
                     s->P + r0 * FA_BC, FA_BC);
    }
    if (split == r1)
        return;
    /* at most 64 rows (the forward's decode rows), as the row products take them */
    const int m = (int)(r1 - split);
    float *S = s->P + split * FA_BC; // S: [m, n]
    const void *k[FA_BC];            /* key j0 + j's row of KV head h / g */
    fa__row_ptrs(&p->k, b, fa__row0_k(p, b) + j0, n, h / pl->g, k);
    if (path == FA_SCORES_ROWS_BF16) { /* the forward's case only where plan bf16 is */
        kern->qk_rows_bf16(m, (int)n, (int)(D / 2), s->Q2 + split * D2, D2, k, pl->qscale, S, FA_BC,
                           NULL);
    } else if (!pl->bf16) {
        kern->qk_rows(m, (int)n, (int)D, s->Q + split * D, D, k, p->k.dtype, S, FA_BC, NULL);
    } else { /* bf16 rows the forward widened: fp32 Q, as the forward converted it */
        const int64_t rq = fa__row0_q(p, b);
        for (int64_t r = 0; r < m; r++) // s->tmp: [m, D], m <= 64 < FA_BC
            load_row(pl, s->tmp + r * D, fa__elem(&p->q, b, rq + i0 + split + r, h), &p->q, D,
                     pl->qscale);
        kern->qk_rows(m, (int)n, (int)D, s->tmp, D, k, p->k.dtype, S, FA_BC, NULL);
    }
}

/* The tile tile() built last, for add_dkdv and add_dq: batch b, query rows i0..i0+nr (head h),
 * keys [j0, j0 + n), the rows [lo, hi) of it that see some key, and whether it crosses the
 * band's edge (masked: some of those rows do not see every key; then keys [ka, ke) are those
 * every one of them sees, ka >= ke when none is). */
typedef struct bwd_tile {
    int64_t b, i0, nr, j0, n, lo, hi, ka, ke;
    int masked;
} bwd_tile;

/* A P or dS of row i at a key it cannot see is exactly 0, whatever the product of its operands
 * gave (0 times a NaN V or dout, 2^(-inf - NaN) of a NaN row's lse): the non-finite rule. On the
 * masked keys of one fp32 row of P and dS (a -0 of dS is left as it is). */
static void clear_masked(const fa__problem *p, const bwd_tile *tl, int64_t r, float *pr,
                         float *ds) {
    const int64_t sq = fa__seqlen_q(p, tl->b), sk = fa__seqlen_k(p, tl->b);
    int64_t a, e;
    fa__row_keys(p, tl->i0 + r, tl->j0, tl->n, sk - sq, sk, &a, &e);
    const int64_t runs[2][2] = {{0, a}, {e, tl->n}}; /* the masked keys */
    for (int u = 0; u < 2; u++)
        for (int64_t j = runs[u][0]; j < runs[u][1]; j++) { /* a select, which vectorizes */
            pr[j] = 0.0f;
            ds[j] = ds[j] == 0.0f ? ds[j] : 0.0f;
        }
}

/* clear_masked on the bf16 values of the pair step: dS's bf16 rows (s->dS2) and, when dkdv, P
 * and dS as pairs of rows (s->PX, s->dSX, rows from lo & ~1). */
static void clear_masked_pairs(const bwd_plan *pl, const bwd_scratch *s, const bwd_tile *tl,
                               int dkdv) {
    const fa__problem *p = pl->p;
    const int64_t sq = fa__seqlen_q(p, tl->b), sk = fa__seqlen_k(p, tl->b), r0 = tl->lo & ~1;
    for (int64_t r = tl->lo; r < tl->hi; r++) {
        int64_t a, e;
        fa__row_keys(p, tl->i0 + r, tl->j0, tl->n, sk - sq, sk, &a, &e);
        uint16_t *ds = (uint16_t *)(s->dS2 + r * (FA_BC / 2));
        const int shift = (int)(r - r0) % 2 * 16; /* the row's half of a pair */
        uint32_t *px = s->PX + (r - r0) / 2 * FA_BC, *dsx = s->dSX + (r - r0) / 2 * FA_BC;
        const int64_t runs[2][2] = {{0, a}, {e, tl->n}}; /* the masked keys */
        for (int u = 0; u < 2; u++)
            for (int64_t j = runs[u][0]; j < runs[u][1]; j++) {
                if (ds[j] & 0x7FFF) ds[j] = 0;
                if (!dkdv) continue;
                if (px[j] >> shift & 0x7FFF) px[j] &= ~(0xFFFFu << shift);
                if (dsx[j] >> shift & 0x7FFF) dsx[j] &= ~(0xFFFFu << shift);
            }
    }
}

/* Rows i0..i0+nr of head h against keys j0..j0+n (Kt: [D, Bc], Vt: [Dv, Bc] packed): leaves
 * Pd in s->P and dS (with respect to the scaled, uncapped score) in s->dS, both [nr, Bc], for the rows
 * [tl->lo, tl->hi) that see any of the keys (fa__block_rows); the others are not computed. Plan
 * bf16: also dS as bf16 in s->dS2 and, when dkdv, the pairs add_dkdv takes in s->PX, s->dSX;
 * plan pair_step: only those, in place of the fp32 Pd and dS (s->P, s->dS keep S and dP). Pd
 * and dS are exactly 0 at keys a row cannot see. */
static void tile(const bwd_plan *pl, const bwd_scratch *s, const float *Kt, const float *Vt,
                 int64_t b, int64_t h, int64_t i0, int64_t nr, int64_t j0, int64_t n, bwd_tile *tl,
                 int dkdv) {
    const fa__problem *p = pl->p;
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq, Dv = p->Dv;
    *tl = (bwd_tile){.b = b, .i0 = i0, .nr = nr, .j0 = j0, .n = n};
    fa__block_rows(p, i0, nr, j0, n, off, &tl->lo, &tl->hi);
    const int64_t r0 = tl->lo, rows = tl->hi - tl->lo;
    if (rows == 0) return;
    scores(pl, s, Kt, b, h, i0, r0, tl->hi, j0, n);
    const int64_t Dv2 = (Dv + 1) / 2;
    if (pl->bf16) // dPd: [rows, n]
        kern->qk_bf16((int)rows, (int)n, (int)Dv2, s->dO2 + r0 * Dv2, Dv2, (const uint32_t *)Vt,
                      FA_BC, 1.0f, s->dS + r0 * FA_BC, FA_BC);
    else
        kern->qk((int)rows, (int)n, (int)Dv, s->dO + r0 * Dv, Dv, Vt, FA_BC, s->dS + r0 * FA_BC,
                 FA_BC);
    const int masked = tl->masked = fa__block_masked(p, i0, nr, j0, n, off, sk);
    tl->ka = 0, tl->ke = n;
    for (int64_t r = r0; masked && r < tl->hi; r++) {
        int64_t a, e;
        fa__row_keys(p, i0 + r, j0, n, off, sk, &a, &e);
        tl->ka = a > tl->ka ? a : tl->ka, tl->ke = e < tl->ke ? e : tl->ke;
    }
    if (pl->pair_step) { /* the masks and ALiBi, then one step per pair of rows */
        for (int64_t r = r0; r < tl->hi; r++)
            fa__score_epilogue(p, 0.0f, s->P + r * FA_BC, n, i0 + r, j0, off, sk, b, h, masked,
                               NULL);
        pair_step(pl, s, r0, tl->hi, n, dkdv);
        if (masked) clear_masked_pairs(pl, s, tl, dkdv);
        return;
    }
    for (int64_t r = r0; r < tl->hi; r++) {
        float *pr = s->P + r * FA_BC, *ds = s->dS + r * FA_BC; // pr, ds: [n]
        fa__score_epilogue(p, pl->softcap_l2, pr, n, i0 + r, j0, off, sk, b, h, masked, s->dtanh);
        kern->exp2_sum((int)n, pr, s->lse2[r]); /* P = 2^(S - lse); the sum is 1 or less */
        /* Pd = P∘M/(1-p) and dP = dPd∘M/(1-p) from one draw of the mask; dS needs P itself. */
        memcpy(s->praw, pr, (size_t)n * sizeof *pr);
        fa__dropout_row(p, b, h, i0 + r, j0, n, pr, ds);
        for (int64_t j = 0; j < n; j++) ds[j] = s->praw[j] * (ds[j] - s->dlt[r]);
        if (pl->softcap_l2 != 0.0f)
            for (int64_t j = 0; j < n; j++) ds[j] *= s->dtanh[j];
        if (masked) clear_masked(p, tl, r, pr, ds);
        if (s->lse2[r] == INFINITY) { /* the row saw no key (every score -inf): its q is 0 */
            memset(pr, 0, (size_t)n * sizeof *pr); /* (load_rows), but 0 times an infinity */
            memset(ds, 0, (size_t)n * sizeof *ds); /* of K in S is NaN: it adds nothing */
        }
        if (pl->bf16) /* dS rounded once, for dQ's pairs along keys and dK's pairs of rows */
            kern->to_bf16((int)n, ds, (uint16_t *)(s->dS2 + r * (FA_BC / 2)));
    }
    if (pl->bf16 && dkdv) pair_rows(pl, s, r0, tl->hi, n);
}

/* Floats between packed blocks of Kᵀ ([D, Bc] each; Vᵀ: [Dv, Bc], pack_stride(Dv)). */
static size_t pack_stride(int64_t D) { return fa__round_up((size_t)FA_BC * D); }

/* Kᵀ and Vᵀ of keys row0..row0+n into the kb-th blocks of Kt and Vt. */
static void pack_kv(const bwd_plan *pl, const bwd_scratch *s, float *Kt, float *Vt, int64_t kb,
                    int64_t b, int64_t hk, int64_t row0, int64_t n) {
    const fa__problem *p = pl->p;
    const size_t at = (size_t)kb * pack_stride(p->D), atv = (size_t)kb * pack_stride(p->Dv);
    if (pl->bf16) { /* Kᵀ and Vᵀ as [D/2, n] and [Dv/2, n] bf16 pairs */
        fa__pack_k_bf16(p->D, pl->kern, &p->k, b, row0, hk, n, (uint32_t *)(Kt + at),
                        (uint16_t *)s->tmp);
        fa__pack_k_bf16(p->Dv, pl->kern, &p->v, b, row0, hk, n, (uint32_t *)(Vt + atv),
                        (uint16_t *)s->tmp);
        return;
    }
    fa__kv_block(p->D, pl->kern, &p->k, b, row0, hk, n, 1, Kt + at, FA_BC, s->tmp);
    fa__kv_block(p->Dv, pl->kern, &p->v, b, row0, hk, n, 1, Vt + atv, FA_BC, s->tmp);
}

/* A bf16 value of a row: element t of a bf16 row (u) or half k of word t of pairs (w). */
static float bf16_at(const uint16_t *u, int64_t t) { return fa__bf16_to_f32(u[t]); }
static float pair_at(const uint32_t *w, int64_t t, int64_t k) {
    return fa__bf16_to_f32((uint16_t)(w[t] >> (16 * k)));
}

/* Do q or dout hold a NaN or an infinity in a row of the tile that misses some key? Only a tile
 * at the band's edge has such rows, and there a masked Pd or dS of exactly 0 would meet it in
 * the products (0 times it is NaN): add_dkdv_exact then. Plan bf16's products take the rows in
 * pairs (r, r + 1) from an even r, so the loaded row beside an odd lo or hi, which sees none of
 * the keys, meets each of them with its Pd and dS of 0 too. A loaded row is looked at once. */
static int rows_nonfinite(const bwd_plan *pl, const bwd_scratch *s, const bwd_tile *tl) {
    if (!tl->masked) return 0;
    const fa__problem *p = pl->p;
    const int64_t D = p->D, D2 = (D + 1) / 2, Dv = p->Dv, Dv2 = (Dv + 1) / 2;
    const int64_t sq = fa__seqlen_q(p, tl->b), sk = fa__seqlen_k(p, tl->b);
    const int64_t lo = pl->bf16 ? tl->lo & ~(int64_t)1 : tl->lo; /* the pairs' rows */
    const int64_t hi = pl->bf16 && tl->hi % 2 && tl->hi < tl->nr ? tl->hi + 1 : tl->hi;
    for (int64_t r = lo; r < hi; r++) {
        int64_t a, e;
        fa__row_keys(p, tl->i0 + r, tl->j0, tl->n, sk - sq, sk, &a, &e);
        if (a == 0 && e == tl->n) continue; /* it sees every key: no masked 0 */
        if (!s->row_finite[r]) {
            const int ok = pl->bf16 ? fa__finite(s->Q2 + r * D2, FA_DTYPE_BF16, D, 1) &&
                                          fa__finite(s->dO2 + r * Dv2, FA_DTYPE_BF16, Dv, 1)
                                    : fa__finite(s->Q + r * D, FA_DTYPE_F32, D, 1) &&
                                          fa__finite(s->dO + r * Dv, FA_DTYPE_F32, Dv, 1);
            s->row_finite[r] = ok ? 1 : 2;
        }
        if (s->row_finite[r] == 2) return 1;
    }
    return 0;
}

/* Does K hold a NaN or an infinity at a key of the tile that some row misses (add_dq_exact then,
 * as rows_nonfinite)? K: fp32 rows, ldk floats apart; plan bf16: pairs of keys, ldk words. */
static int keys_nonfinite(const bwd_plan *pl, const bwd_tile *tl, const float *K, int64_t ldk) {
    if (!tl->masked) return 0;
    const int64_t D = pl->p->D, pairs = pl->bf16 ? 2 : 1, n = (tl->n + pairs - 1) / pairs;
    /* the rows of K whose keys every row sees (pairs: both keys): [ka, ke) */
    const int64_t ka = (tl->ka + pairs - 1) / pairs, ke = tl->ka < tl->ke ? tl->ke / pairs : ka;
    for (int64_t r = 0; r < n; r++) {
        if (r >= ka && r < ke) continue;
        if (pl->bf16 ? !fa__finite((const uint32_t *)K + r * ldk, FA_DTYPE_BF16, 2 * D, 1)
                     : !fa__finite(K + r * ldk, FA_DTYPE_F32, D, 1))
            return 1;
    }
    return 0;
}

/* add_dkdv's sums over the tile's rows [lo, hi), each row adding only to the keys it sees. */
static void add_dkdv_exact(const bwd_plan *pl, const bwd_scratch *s, const bwd_tile *tl, float *dk,
                           float *dv) {
    const fa__problem *p = pl->p;
    const int64_t D = p->D, D2 = (D + 1) / 2, Dv = p->Dv, Dv2 = (Dv + 1) / 2, r0 = tl->lo & ~1;
    const int64_t sq = fa__seqlen_q(p, tl->b), sk = fa__seqlen_k(p, tl->b);
    for (int64_t r = tl->lo; r < tl->hi; r++) {
        float qb[256], db[256]; /* plan bf16: the row's q and dout (D, Dv <= 256) */
        const float *q = s->Q + r * D, *d = s->dO + r * Dv;
        if (pl->bf16) {
            for (int64_t t = 0; t < D; t++) qb[t] = bf16_at((const uint16_t *)(s->Q2 + r * D2), t);
            for (int64_t t = 0; t < Dv; t++)
                db[t] = bf16_at((const uint16_t *)(s->dO2 + r * Dv2), t);
            q = qb, d = db;
        }
        int64_t a, e;
        fa__row_keys(p, tl->i0 + r, tl->j0, tl->n, sk - sq, sk, &a, &e);
        for (int64_t j = a; j < e; j++) {
            const int64_t at = (r - r0) / 2 * FA_BC + j, k = (r - r0) % 2; /* PX, dSX: pairs */
            const float pj = pl->bf16 ? pair_at(s->PX, at, k) : s->P[r * FA_BC + j];
            const float dsj = pl->bf16 ? pair_at(s->dSX, at, k) : s->dS[r * FA_BC + j];
            for (int64_t t = 0; t < D; t++) dk[j * D + t] += dsj * q[t];
            for (int64_t t = 0; t < Dv; t++) dv[j * Dv + t] += pj * d[t];
        }
    }
}

/* dK += dSᵀ Q and dV += Pdᵀ dO for the tile just built, over its rows [lo, hi) and n keys;
 * dk: [n, D], dv: [n, Dv]. */
static void add_dkdv(const bwd_plan *pl, const bwd_scratch *s, const bwd_tile *tl, float *dk,
                     float *dv) {
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t D = pl->p->D, Dv = pl->p->Dv, lo = tl->lo, hi = tl->hi, rows = hi - lo;
    const int64_t nb = tl->n;
    if (rows == 0) return;
    if (rows_nonfinite(pl, s, tl)) {
        add_dkdv_exact(pl, s, tl, dk, dv);
        return;
    }
    if (pl->bf16) { /* pairs of rows (r, r + 1) from an even r; rows outside [lo, hi) count as 0 */
        const int64_t r0 = lo & ~(int64_t)1, pairs = (hi - r0 + 1) / 2; /* PX, dSX from tile() */
        kern->pv_bf16_t((int)nb, (int)pairs, (int)D, s->dSX, FA_BC, s->Qp + r0 / 2 * D, D, s->ones,
                        dk, D);
        kern->pv_bf16_t((int)nb, (int)pairs, (int)Dv, s->PX, FA_BC, s->dOp + r0 / 2 * Dv, Dv,
                        s->ones, dv, Dv);
        return;
    }
    if (kern->pv_t) { /* P and dS as they are: the kernel reads them transposed */
        kern->pv_t((int)nb, (int)rows, (int)D, s->dS + lo * FA_BC, FA_BC, s->Q + lo * D, D,
                   s->ones, dk, D);
        kern->pv_t((int)nb, (int)rows, (int)Dv, s->P + lo * FA_BC, FA_BC, s->dO + lo * Dv, Dv,
                   s->ones, dv, Dv);
        return;
    }
    kern->transpose((int)rows, (int)nb, s->P + lo * FA_BC, FA_BC, s->PT, pl->br); // PT: [nb, rows]
    kern->transpose((int)rows, (int)nb, s->dS + lo * FA_BC, FA_BC, s->dST, pl->br); // dST
    kern->pv((int)nb, (int)rows, (int)D, s->dST, pl->br, s->Q + lo * D, D, s->ones, dk, D);
    kern->pv((int)nb, (int)rows, (int)Dv, s->PT, pl->br, s->dO + lo * Dv, Dv, s->ones, dv, Dv);
}

/* add_dq's sums over the tile's rows [lo, hi), each row summing only the keys it sees. */
static void add_dq_exact(const bwd_plan *pl, const bwd_scratch *s, const bwd_tile *tl,
                         const float *K, int64_t ldk, float *dq) {
    const fa__problem *p = pl->p;
    const int64_t D = p->D, sq = fa__seqlen_q(p, tl->b), sk = fa__seqlen_k(p, tl->b);
    for (int64_t r = tl->lo; r < tl->hi; r++) {
        int64_t a, e;
        fa__row_keys(p, tl->i0 + r, tl->j0, tl->n, sk - sq, sk, &a, &e);
        for (int64_t j = a; j < e; j++) {
            if (pl->bf16) { /* dS2: bf16 rows; K: pairs of rows (j, j + 1) */
                const float dsj = bf16_at((const uint16_t *)(s->dS2 + r * (FA_BC / 2)), j);
                const uint32_t *kw = (const uint32_t *)K + j / 2 * ldk;
                for (int64_t t = 0; t < D; t++) dq[r * D + t] += dsj * pair_at(kw, t, j % 2);
            } else {
                const float dsj = s->dS[r * FA_BC + j], *kj = K + j * ldk;
                for (int64_t t = 0; t < D; t++) dq[r * D + t] += dsj * kj[t];
            }
        }
    }
}

/* dQ += dS K over the tile's rows [lo, hi); K: [n, D] (ld ldk; plan bf16: [n/2, D] pairs, ld
 * D), dq: [nr, D]. */
static void add_dq(const bwd_plan *pl, const bwd_scratch *s, const bwd_tile *tl, const float *K,
                   int64_t ldk, float *dq) {
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t D = pl->p->D, lo = tl->lo, hi = tl->hi, n = tl->n;
    if (hi == lo) return;
    if (keys_nonfinite(pl, tl, K, ldk)) {
        add_dq_exact(pl, s, tl, K, ldk, dq);
        return;
    }
    if (pl->bf16) { /* dS2: [rows, n/2], rounded by tile() */
        kern->pv_bf16((int)(hi - lo), (int)(n + 1) / 2, (int)D, s->dS2 + lo * (FA_BC / 2),
                      FA_BC / 2, (const uint32_t *)K, D, s->ones, dq + lo * D, D);
        return;
    }
    kern->pv((int)(hi - lo), (int)n, (int)D, s->dS + lo * FA_BC, FA_BC, K, ldk, s->ones,
             dq + lo * D, D);
}

/* K rows j0..j0+n of head hk as dS K's operand: in place for fp32 rows, else converted into
 * `rows` ([n, D]; plan bf16: [n/2, D] pairs); *ld gets the row stride. */
static const float *k_rows(const bwd_plan *pl, const bwd_scratch *s, int64_t b, int64_t hk,
                           int64_t row0, int64_t n, float *rows, int64_t *ld) {
    const fa__problem *p = pl->p;
    if (pl->bf16) {
        *ld = p->D;
        fa__pack_v_bf16(p->D, pl->kern, &p->k, b, row0, hk, n, (uint32_t *)rows);
        return rows;
    }
    if (fa__rows_in_place(&p->k, pl->kern)) {
        *ld = p->k.ss;
        return fa__elem(&p->k, b, row0, hk);
    }
    *ld = p->D;
    return fa__kv_block(p->D, pl->kern, &p->k, b, row0, hk, n, 0, rows, p->D, s->tmp);
}

/* Where key j of a block starts in k_rows's operand (row stride ldk). */
static int64_t k_at(const bwd_plan *pl, int64_t j, int64_t ldk) {
    return pl->bf16 ? j / 2 * ldk : j * ldk; /* bf16: pairs of rows (j: a block or half start) */
}

static void store_dkdv(const bwd_plan *pl, int64_t b, int64_t hk, int64_t j0, int64_t n,
                       const float *dk, const float *dv) {
    const fa__problem *p = pl->p;
    const int64_t D = p->D, Dv = p->Dv, rk = fa__row0_k(p, b);
    const float dk_scale = pl->bf16 ? p->scale : p->scale / pl->qscale; /* fp32 Q: times qscale */
    for (int64_t j = 0; j < n; j++) {
        fa__store_f32(pl->kern, fa__elem(&p->dk, b, rk + j0 + j, hk), p->dk.dtype, dk + j * D, D,
                      p->dk.sd, dk_scale);
        fa__store_f32(pl->kern, fa__elem(&p->dv, b, rk + j0 + j, hk), p->dv.dtype, dv + j * Dv,
                      Dv, p->dv.sd, 1.0f);
    }
}

/* dq of rows i0..i0+nr of head h; a row that saw no key (lse2 +inf) gets 0, not its sum of
 * 0 times K, which may hold an infinity (a key whose score was -inf). */
static void store_dq(const bwd_plan *pl, const float *lse2, int64_t b, int64_t h, int64_t i0,
                     int64_t nr, const float *dq) {
    static const float zeros[256]; /* D <= 256 */
    const fa__problem *p = pl->p;
    const int64_t D = p->D, rq = fa__row0_q(p, b);
    for (int64_t r = 0; r < nr; r++)
        fa__store_f32(pl->kern, fa__elem(&p->dq, b, rq + i0 + r, h), p->dq.dtype,
                      lse2[r] == INFINITY ? zeros : dq + r * D, D, p->dq.sd, p->scale);
}

/* Asks for the query block after i0 (or the next query head's first, i_begin) of head h. */
static void prefetch_next_rows(const bwd_plan *pl, int64_t b, int64_t hk, int64_t h, int64_t i0,
                               int64_t i_begin, int64_t i_end) {
    const fa__problem *p = pl->p;
    const int64_t sq = fa__seqlen_q(p, b);
    const int64_t ni = i0 + pl->br < i_end ? i0 + pl->br : i_begin;
    const int64_t nh = i0 + pl->br < i_end ? h : h + 1;
    if (nh < (hk + 1) * pl->g) {
        const int64_t nn = sq - ni < pl->br ? sq - ni : pl->br;
        fa__prefetch_block(&p->q, b, fa__row0_q(p, b) + ni, nn, nh, p->D);
        fa__prefetch_block(&p->dout, b, fa__row0_q(p, b) + ni, nn, nh, p->Dv);
    }
}

/* The key blocks query rows i0..i0+nr see: [*lo, *hi), *lo a multiple of Bc; the last block
 * may end before *hi (tiles run to min(j0 + Bc, sk) so the grid is the same in every pass). */
static void key_band(const fa__problem *p, int64_t i0, int64_t nr, int64_t off, int64_t sk,
                     int64_t *lo, int64_t *hi) {
    *lo = fa__key_lo(p, i0, off) / FA_BC * FA_BC;
    *hi = fa__key_hi(p, i0 + nr - 1, off, sk);
}

/* Keys of the tile grid's next part of a block, from key j0 with n of the block's keys left: a
 * block at the band's edge runs as two halves, each on the rows that see its keys (fewer
 * masked scores computed); every schedule cuts blocks the same way. */
static int64_t part_keys(const fa__problem *p, int64_t i0, int64_t nr, int64_t j0, int64_t n,
                         int64_t off, int64_t sk) {
    return n > FA_BC / 2 && fa__block_masked(p, i0, nr, j0, n, off, sk) ? FA_BC / 2 : n;
}

/* ---- split pass 1: dK, dV ---- */

static void dkdv_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    bwd_scratch s;
    carve(&s, pl->scratch + (size_t)worker * pl->scratch_floats, p, pl->bf16, pl->br);

    const int64_t b = fa__task_batch(pl->start[1], p->B, task), local = task - pl->start[1][b];
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq, D = p->D;
    const int64_t span = (int64_t)FA_KV_TASK * FA_BC, nkt = (sk + span - 1) / span;
    const int64_t hk = local / nkt, j0 = local % nkt * span, rk = fa__row0_k(p, b);
    const int64_t n = sk - j0 < span ? sk - j0 : span, nblocks = (n + FA_BC - 1) / FA_BC;
    const int64_t Dv = p->Dv;
    const size_t stride = pack_stride(D), vstride = pack_stride(Dv);

    for (int kb = 0; kb < nblocks; kb++) {
        const int64_t jb = j0 + kb * FA_BC, nb = j0 + n - jb < FA_BC ? j0 + n - jb : FA_BC;
        pack_kv(pl, &s, s.Kt, s.Vt, kb, b, hk, rk + jb, nb);
    }
    memset(s.acc1, 0, (size_t)n * D * sizeof(float)); // dK: [n, D]
    memset(s.acc2, 0, (size_t)n * Dv * sizeof(float)); // dV: [n, Dv]

    /* Query rows that see any key of the task: [i_begin, i_end). */
    int64_t i_begin = p->window_right < 0 ? 0 : j0 - off - p->window_right;
    int64_t i_end = p->window_left < 0 ? sq : j0 + n - off + p->window_left;
    i_begin = i_begin > 0 ? i_begin / pl->br * pl->br : 0; /* the tile grid's query blocks */
    i_end = i_end < sq ? i_end : sq;
    for (int64_t hh = 0; hh < pl->g; hh++) {
        const int64_t h = hk * pl->g + hh;
        for (int64_t i0 = i_begin; i0 < i_end; i0 += pl->br) {
            if (fa__cancelled(pl->cancel)) return; /* the call ends with FA_ERR_CANCELLED */
            const int64_t nr = sq - i0 < pl->br ? sq - i0 : pl->br;
            load_rows(pl, &s, b, h, i0, nr);
            prefetch_next_rows(pl, b, hk, h, i0, i_begin, i_end);
            for (int kb = 0; kb < nblocks; kb++) {
                const int64_t jb = j0 + kb * FA_BC, nb = j0 + n - jb < FA_BC ? j0 + n - jb : FA_BC;
                for (int64_t jp = jb, np; jp < jb + nb; jp += np) { // part [jp, jp + np)
                    np = part_keys(p, i0, nr, jp, jb + nb - jp, off, sk);
                    const size_t at = (size_t)kb * stride + (size_t)(jp - jb);
                    const size_t atv = (size_t)kb * vstride + (size_t)(jp - jb);
                    bwd_tile tl;
                    tile(pl, &s, s.Kt + at, s.Vt + atv, b, h, i0, nr, jp, np, &tl, 1);
                    add_dkdv(pl, &s, &tl, s.acc1 + (jp - j0) * D, s.acc2 + (jp - j0) * Dv);
                }
            }
        }
    }
    store_dkdv(pl, b, hk, j0, n, s.acc1, s.acc2);
}

/* ---- split pass 2: dQ ---- */

static void dq_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    bwd_scratch s;
    carve(&s, pl->scratch + (size_t)worker * pl->scratch_floats, p, pl->bf16, pl->br);

    const int64_t b = fa__task_batch(pl->start[2], p->B, task), local = task - pl->start[2][b];
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq, D = p->D;
    const int64_t nqb = (sq + pl->br - 1) / pl->br, h = local / nqb, i0 = local % nqb * pl->br;
    const int64_t nr = sq - i0 < pl->br ? sq - i0 : pl->br, hk = h / pl->g, rk = fa__row0_k(p, b);

    load_rows(pl, &s, b, h, i0, nr);
    memset(s.acc1, 0, (size_t)nr * D * sizeof(float)); // dQ: [nr, D]
    int64_t j_begin, j_end;
    key_band(p, i0, nr, off, sk, &j_begin, &j_end);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += FA_BC) {
        const int64_t n = sk - j0 < FA_BC ? sk - j0 : FA_BC;
        pack_kv(pl, &s, s.Kt, s.Vt, 0, b, hk, rk + j0, n);
        int64_t ldk;
        const float *K = k_rows(pl, &s, b, hk, rk + j0, n, s.K, &ldk); // K: [n, D]
        const int64_t nn = fa__next_block(j0, j_end);
        if (nn > 0) { /* the next key block arrives while this one runs */
            fa__prefetch_block(&p->k, b, rk + j0 + FA_BC, nn, hk, D);
            fa__prefetch_block(&p->v, b, rk + j0 + FA_BC, nn, hk, p->Dv);
        }
        for (int64_t jp = j0, np; jp < j0 + n; jp += np) { // part [jp, jp + np)
            np = part_keys(p, i0, nr, jp, j0 + n - jp, off, sk);
            bwd_tile tl;
            tile(pl, &s, s.Kt + (jp - j0), s.Vt + (jp - j0), b, h, i0, nr, jp, np, &tl, 0);
            add_dq(pl, &s, &tl, K + k_at(pl, jp - j0, ldk), ldk, s.acc1);
        }
    }
    store_dq(pl, s.lse2, b, h, i0, nr, s.acc1);
}

/* ---- fused: dK, dV and dQ of one (batch, KV head) ---- */

/* The head scratch of a batch with sk keys: Kᵀ, Vᵀ packed for every key block, the dK and dV
 * sums, and (unless K is used in place) K as fp32 rows. */
typedef struct bwd_head {
    float *Kt, *Vt; /* [nkb][D, Bc], [nkb][Dv, Bc] */
    float *dk, *dv; /* [sk, D], [sk, Dv] */
    float *krows;   /* [sk, D] */
} bwd_head;

/* Carves h from `at` (NULL: only counts); returns the floats it takes. */
static size_t carve_head(const bwd_plan *pl, float *at, int64_t sk, bwd_head *h) {
    const int64_t nkb = (sk + FA_BC - 1) / FA_BC;
    const int64_t packed = fa__size_mul(nkb, (int64_t)pack_stride(pl->p->D));
    const int64_t vpacked = fa__size_mul(nkb, (int64_t)pack_stride(pl->p->Dv));
    const int64_t rows =
        fa__size_round_up(fa__size_mul(fa__size_mul(nkb, FA_BC), pl->p->D), FA_ALIGN);
    const int64_t vrows =
        fa__size_round_up(fa__size_mul(fa__size_mul(nkb, FA_BC), pl->p->Dv), FA_ALIGN);
    const int64_t total = fa__size_add(
        fa__size_add(fa__size_add(packed, vpacked), vrows),
        fa__size_mul(fa__rows_in_place(&pl->p->k, pl->kern) ? 1 : 2, rows));
    memset(h, 0, sizeof *h);
    if (at) {
        h->Kt = at, h->Vt = at + packed, h->dk = h->Vt + vpacked, h->dv = h->dk + rows;
        h->krows = h->dv + vrows;
    }
    return total < 0 ? SIZE_MAX : (size_t)total; /* SIZE_MAX: too long to fuse (size.h) */
}

/* Asks for n floats from x into L2. The fused schedule's head scratch (packed Kᵀ, Vᵀ and the dK,
 * dV sums: 8 MiB per thread at S = 4096, D = 128) lies beyond L2, so each tile asks for the next
 * key block's parts while it runs (the five GEMMs of a tile lose about 7% of their rate when
 * these come from L3; asking ahead wins back about half). */
static void prefetch_floats(const float *x, size_t n, int write) {
    for (size_t at = 0; at < n; at += 16) {
        if (write) __builtin_prefetch(x + at, 1, 2);
        else __builtin_prefetch(x + at, 0, 2);
    }
}

static void fused_task(void *arg, int64_t task, int worker) {
    const bwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    bwd_scratch s;
    carve(&s, pl->scratch + (size_t)worker * pl->scratch_floats, p, pl->bf16, pl->br);

    const int64_t b = task / p->Hk, hk = task % p->Hk, D = p->D, rk = fa__row0_k(p, b);
    const int64_t Dv = p->Dv, sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    const int64_t nkb = (sk + FA_BC - 1) / FA_BC;
    const size_t stride = pack_stride(D), vstride = pack_stride(Dv);
    const size_t packed = (size_t)(pl->bf16 ? (D + 1) / 2 : D) * FA_BC; /* words used per block */
    const size_t vpacked = (size_t)(pl->bf16 ? (Dv + 1) / 2 : Dv) * FA_BC;
    bwd_head hd;
    carve_head(pl, pl->head + (size_t)worker * pl->head_floats, sk, &hd);
    float *Kt = hd.Kt, *Vt = hd.Vt, *dk = hd.dk, *dv = hd.dv, *krows = hd.krows;

    const int k_in_place = fa__rows_in_place(&p->k, pl->kern);
    int64_t ldk = D; /* K rows: in the input (ld ldk) or converted into krows ([sk, D]) */
    for (int64_t kb = 0; kb < nkb; kb++) {
        const int64_t j0 = kb * FA_BC, n = sk - j0 < FA_BC ? sk - j0 : FA_BC;
        pack_kv(pl, &s, Kt, Vt, kb, b, hk, rk + j0, n);
        if (!k_in_place) k_rows(pl, &s, b, hk, rk + j0, n, krows + k_at(pl, j0, D), &ldk);
    }
    memset(dk, 0, (size_t)(sk * D) * sizeof(float)); // dK: [sk, D]
    memset(dv, 0, (size_t)(sk * Dv) * sizeof(float)); // dV: [sk, Dv]
    for (int64_t hh = 0; hh < pl->g; hh++) {
        const int64_t h = hk * pl->g + hh;
        for (int64_t i0 = 0; i0 < sq; i0 += pl->br) {
            /* one task is a whole (batch, KV head): it stops between its query blocks */
            if (fa__cancelled(pl->cancel)) return; /* the call ends with FA_ERR_CANCELLED */
            const int64_t nr = sq - i0 < pl->br ? sq - i0 : pl->br;
            load_rows(pl, &s, b, h, i0, nr);
            prefetch_next_rows(pl, b, hk, h, i0, 0, sq);
            memset(s.acc1, 0, (size_t)nr * D * sizeof(float)); // dQ: [nr, D]
            int64_t j_begin, j_end;
            key_band(p, i0, nr, off, sk, &j_begin, &j_end);
            for (int64_t j0 = j_begin; j0 < j_end; j0 += FA_BC) {
                const int64_t n = sk - j0 < FA_BC ? sk - j0 : FA_BC, kb = j0 / FA_BC;
                const float *K = k_in_place ? k_rows(pl, &s, b, hk, rk + j0, n, NULL, &ldk)
                                            : krows + k_at(pl, j0, D); // K: [n, D]
                const int64_t nn = fa__next_block(j0, j_end);
                if (nn > 0 && k_in_place) /* read from the input: ask ahead */
                    fa__prefetch_block(&p->k, b, rk + j0 + FA_BC, nn, hk, D);
                if (nn > 0) { /* the next tile's head scratch */
                    prefetch_floats(Kt + (kb + 1) * stride, packed, 0);
                    prefetch_floats(Vt + (kb + 1) * vstride, vpacked, 0);
                    prefetch_floats(dk + (j0 + FA_BC) * D, (size_t)(nn * D), 1);
                    prefetch_floats(dv + (j0 + FA_BC) * Dv, (size_t)(nn * Dv), 1);
                }
                for (int64_t jp = j0, np; jp < j0 + n; jp += np) { // part [jp, jp + np)
                    np = part_keys(p, i0, nr, jp, j0 + n - jp, off, sk);
                    const size_t at = (size_t)kb * stride + (size_t)(jp - j0);
                    const size_t atv = (size_t)kb * vstride + (size_t)(jp - j0);
                    bwd_tile tl;
                    tile(pl, &s, Kt + at, Vt + atv, b, h, i0, nr, jp, np, &tl, 1);
                    add_dkdv(pl, &s, &tl, dk + jp * D, dv + jp * Dv);
                    add_dq(pl, &s, &tl, K + k_at(pl, jp - j0, ldk), ldk, s.acc1);
                }
            }
            store_dq(pl, s.lse2, b, h, i0, nr, s.acc1);
        }
    }
    store_dkdv(pl, b, hk, 0, sk, dk, dv);
}

/* Varlen rows outside every sequence get zero gradients. */
static void clear_outside(const fa__problem *p) {
        fa__zero_rows(&p->dq, p->H, p->D, 0, p->cu_q[0]);
    fa__zero_rows(&p->dq, p->H, p->D, p->cu_q[p->B], p->total_q);
    const fa__view *kv[2] = {&p->dk, &p->dv};
    const int64_t dims[2] = {p->D, p->Dv};
    for (int t = 0; t < 2; t++) {
        fa__zero_rows(kv[t], p->Hk, dims[t], 0, p->cu_k[0]);
        fa__zero_rows(kv[t], p->Hk, dims[t], p->cu_k[p->B], p->total_k);
    }
}

fa_status fa__cpu_backward(fa_context *ctx, const fa__problem *p) {
    bwd_plan pl = {.p = p, .kern = fa__cpu_kernels_get(), .g = p->H / p->Hk,
                   .cancel = fa__call_cancel()};
    pl.bf16 = p->q.dtype == FA_DTYPE_BF16 && pl.kern->qk_bf16 != NULL;
    fa__score_scales(p, &pl.qscale, &pl.softcap_l2);
    pl.pair_step = pl.bf16 && pl.kern->bwd_pair_bf16 != NULL && p->dropout_p == 0.0f &&
                   pl.softcap_l2 == 0.0f;
    int64_t max_sq = 0, max_sk = 0; /* the tiles and the head scratch follow the longest ones */
    for (int64_t b = 0; b < p->B; b++) {
        max_sq = fa__seqlen_q(p, b) > max_sq ? fa__seqlen_q(p, b) : max_sq;
        max_sk = fa__seqlen_k(p, b) > max_sk ? fa__seqlen_k(p, b) : max_sk;
    }
    pl.br = max_sq >= FA_BR_LONG_FROM ? FA_BR_LONG : FA_BR_SHORT;

    bwd_scratch probe;
    pl.scratch_floats = carve(&probe, NULL, p, pl.bf16, pl.br);
    const int nthreads = fa__context_threads(ctx);
    /* Fused when the threads get enough (b, hk) tasks and the head scratch is small enough. */
    bwd_head none;
    pl.head_floats = carve_head(&pl, NULL, max_sk, &none);
    const int64_t pairs = fa__size_mul(p->B, p->Hk); /* varlen's B is cu_seqlens' (2^61?) */
    const int fused = (nthreads == 1 || pairs < 0 || pairs >= (int64_t)FA_FUSED_TASKS * nthreads) &&
                      pl.head_floats > 0 && pl.head_floats <= FA_FUSED_MAX_FLOATS;
    /* rows · H fits: dq holds that many rows of H heads (B·Sq ones without varlen) */
    const int64_t rows = p->cu_q ? p->total_q : p->B * p->Sq;
    const int64_t scratch_floats = fa__size_mul(nthreads, (int64_t)pl.scratch_floats);
    const int64_t head_floats = fused ? fa__size_mul(nthreads, (int64_t)pl.head_floats) : 0;
    pl.delta = fa__alloc(fa__size_add(fa__size_mul(rows, p->H), 1), sizeof(float));
    pl.start[0] = fa__alloc(fa__size_mul(3, fa__size_add(p->B, 1)), sizeof(int64_t));
    pl.scratch = fa__alloc_aligned(scratch_floats, sizeof(float));
    pl.head = fused ? fa__alloc_aligned(head_floats, sizeof(float)) : NULL;
    if (!pl.delta || !pl.start[0] || !pl.scratch || (fused && !pl.head)) {
        free(pl.delta);
        free(pl.start[0]);
        free(pl.scratch);
        free(pl.head);
        return fa__error(FA_ERR_NO_MEMORY, "backward: cannot allocate scratch for %d threads "
                         "(%lld + %lld floats)", nthreads, (long long)scratch_floats,
                         (long long)head_floats);
    }
    for (int pass = 0; pass < 3; pass++) {
        pl.start[pass] = pl.start[0] + pass * (p->B + 1);
        pl.start[pass][0] = 0;
    }
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b);
        pl.start[0][b + 1] = pl.start[0][b] + (sq > 0 ? p->H : 0);
        const int64_t span = (int64_t)FA_KV_TASK * FA_BC;
        pl.start[1][b + 1] = pl.start[1][b] + p->Hk * ((sk + span - 1) / span);
        pl.start[2][b + 1] = pl.start[2][b] + p->H * ((sq + pl.br - 1) / pl.br);
    }
    bwd_scratch s0;
    for (int w = 0; w < nthreads; w++) { /* the ones vector never changes */
        carve(&s0, pl.scratch + (size_t)w * pl.scratch_floats, p, pl.bf16, pl.br);
        for (int t = 0; t < FA_ONES; t++) s0.ones[t] = 1.0f;
        if (pl.bf16)
            memset(s0.zeros, 0, (size_t)max2(max2(p->D, p->Dv), FA_BC) * sizeof(float));
    }
    if (p->cu_q) clear_outside(p);
    fa__context_run(ctx, pl.start[0][p->B], delta_task, &pl);
    if (p->dsinks) fa__context_run(ctx, p->H, dsink_task, &pl);
    if (fused) {
        fa__context_run(ctx, p->B * p->Hk, fused_task, &pl);
    } else {
        fa__context_run(ctx, pl.start[1][p->B], dkdv_task, &pl);
        fa__context_run(ctx, pl.start[2][p->B], dq_task, &pl);
    }

    free(pl.delta);
    free(pl.start[0]);
    free(pl.scratch);
    free(pl.head);
    return FA_OK;
}
