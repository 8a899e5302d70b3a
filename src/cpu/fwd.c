/* SPDX-License-Identifier: MIT */
/*
 * fwd.c — the CPU forward pass: blocking, masks and the online softmax around the microkernels.
 *
 * A task is (batch b, KV head hk, block of br query rows[, key chunk]) and covers the g = H/Hk
 * query heads that share hk, so each K/V block is read once for all of them: R = g*nr rows,
 * row r is query head hk*g + r/nr at query position i0 + r%nr. Per task:
 *   load Q (converted to fp32, pre-scaled so scores come out in the exp2 domain)
 *   for each block of Bc keys inside the task's causal/window band:
 *     S = Q Kᵀ                                  (microkernel)
 *     softcap, ALiBi, mask (only on blocks that cross the band's edge)
 *     online softmax: m' = max(m, rowmax S), P = 2^(S - m'), alpha = 2^(m - m'), l = alpha l + ΣP
 *     O = diag(alpha) O + P V                   (microkernel)
 *   out = O / l, lse = (m + log2 l) ln 2;  l = 0 (nothing visible) gives out = 0, lse = -inf.
 * Non-finite values follow docs/semantics.md: a NaN or +inf score makes m, l and the row NaN (the
 * kernels' softmax step sees to m); on a block at the band's edge whose V holds a NaN or an
 * infinity, each row sums only its own keys (pv_exact), as 0 · NaN in the products would leak.
 *
 * Split-KV (decode): a batch whose g·Sq rows are few (FA_DECODE_ROWS: a step of one or a few
 * tokens; in a call of few (batch, KV head) pairs, up to FA_SPLIT_ROWS_MAX) has too little work
 * per task to use the threads, so its keys are cut into chunks (split_chunk: their size depends
 * only on the batch's key count), each computed for all KV heads (so the cache is read front to
 * back) into a partial holding every head's unnormalized (m, l, O); a second pass merges the
 * partials of each (batch, KV head) in chunk order. A task takes a run of consecutive chunks
 * (how many depends on the thread count): inside a run the next chunk's first block is
 * prefetched like any next block, where a task per chunk started each chunk on cold rows.
 *
 * K and V blocks reach the products packed (Kᵀ, and V where its rows cannot serve in place): from
 * the thread's head pack, where each key of a (batch, KV head) is packed once per thread for all
 * of that head's query blocks (fwd_plan.hp), or, for heads too long for it, packed per block.
 *
 * 8-bit KV caches (a scale per row, fa__view.scale): the packs hold scale times stored value
 * (fa__kv_block); decode's products read the stored values and the scales multiply the columns
 * of S and of P (scale_columns).
 *
 * Tasks never share outputs and neither the blocking nor the chunks depend on the thread count,
 * so results are bitwise identical for any number of threads.
 */
#include "cpu.h"

#include "../size.h"
#include "tile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    FA_ROWS = 252,              /* target rows (query heads x positions) per task: 28 x 9, 42 x 6 */
    FA_BR_MAX = 252,            /* most query positions per task */
    FA_ROWS_IN_PLACE = 16,      /* tasks of at most this many rows read K/V rows in place */
    FA_DECODE_ROWS = 64,        /* batches with g·Sq <= this many rows are decodes (keys split,
                                   rows in place) where the prefill widens fp16/bf16 rows */
    FA_DECODE_ROWS_PACKED = 32, /* the same where its products are bf16 dot products (fp32
                                   rows: the kernel set's decode_rows_f32; fa__cpu_forward) */
    FA_FEW_HEADS = 16,          /* fewer (batch, KV head) pairs: few tasks, so split wider */
    FA_SPLIT_ROWS_MAX = 128,    /* most rows of a split batch (there) */
    FA_CHUNK = 1024,            /* most keys per split chunk, a multiple of FA_BC */
    FA_CHUNKS = 8, /* chunks a shorter cache is cut into (chunks of at least FA_BC keys) */
    FA_RUNS = 4,   /* runs grow only while every thread keeps this many split tasks */
    FA_RUN_MAX = 8 /* most chunks per split task */
};

/* Most bytes of one thread's head pack (fwd_plan.hp): longer heads are packed block by block. */
#define FA_HEAD_PACK_MAX ((size_t)16 << 20)

#define FA_LN2 0.69314718055994531

typedef struct fwd_plan {
    const fa__problem *p;
    const fa__cpu_kernels *kern;
    int64_t g;           /* query heads per KV head */
    int64_t br;          /* query positions per task */
    int64_t *task_start; /* [B + 1]: first task of each batch */
    int64_t *split;      /* [B]: key chunks per (batch, KV head); 0 = not split */
    int64_t run;         /* consecutive chunks per split task */
    int64_t *part_start; /* [B + 1]: first partial of each batch */
    int64_t decode_rows; /* batches with g·Sq <= this many rows are decodes (FA_DECODE_ROWS,
                            FA_DECODE_ROWS_PACKED, decode_rows_f32) */
    int64_t split_rows;  /* batches with g·Sq <= this many rows split their keys */
    int64_t part_rows;   /* rows of a partial: at least g·Sq of every split batch */
    float *partial;      /* per partial: m, l [part_rows] then O [part_rows, Dv] */
    float *scratch;      /* [threads][scratch_floats] */
    size_t scratch_floats;
    float qscale, softcap_l2; /* fa__score_scales */
    int64_t ldk, ldv;         /* row strides of the packed fp32 Kᵀ and V (fa__packed_ld) */
    /* Head packs (fp32 products on packed K/V): each thread keeps the packed Kᵀ (per chunk of
     * FA_BC keys a block pack's [D, FA_BC], ld ldk, one after the other) and V ([Sk, Dv], ld ldv)
     * of the last (batch, KV head) it worked on, filled a chunk at a time as its tasks reach
     * them. The query blocks of a head then
     * pack each key once per thread instead of once per block (K and V rows lie H·D apart, so
     * every pack reads them from memory: 17 times per head at S = 4096 before). hp = NULL:
     * heads longer than FA_HEAD_PACK_MAX allows (or no memory for them), packed per block. */
    float *hp;        /* [threads][hp_floats]: Kᵀ, then V (none where V serves in place) */
    size_t hp_floats;
    int64_t hp_chunks;
    int64_t *hp_head; /* [threads]: b·Hk + hk whose chunks hp holds, -1: none */
    uint8_t *hp_done; /* [threads][hp_chunks]: chunk packed */
    const int32_t *cancel; /* the call's cancel flag (fa__call_cancel), read per key block */
} fwd_plan;

static size_t partial_floats(const fwd_plan *pl) {
    return fa__round_up((size_t)(pl->part_rows * (pl->p->Dv + 2)));
}

/* Query positions per task: FA_ROWS rows of g query heads each, within [1, FA_BR_MAX]. */
static int64_t block_positions(int64_t g) {
    const int64_t br = FA_ROWS / g;
    return br < 1 ? 1 : br > FA_BR_MAX ? FA_BR_MAX : br;
}

/* How many rows decode's products take before the prefill's packed ones do better (on Zen 4,
 * bench/results/2026-12-04-decode-few-tokens.md): fp16 rows (and 8-bit ones), which the prefill
 * widens to fp32 packs, up to 64 (at 64: 0.81-1.00 of the prefill's time); bf16 on the bf16 dot
 * product up to 32 (at 64, 1.14-1.27 of the prefill's time with one or eight query heads per KV
 * head); fp32 rows, which serve the prefill's packs as they are, as the kernel set says
 * (decode_rows_f32). */
static int64_t decode_rows(const fa__problem *p, const fa__cpu_kernels *kern) {
    const int widened = p->k.dtype == FA_DTYPE_F16 || p->k.scale != NULL ||
                        (p->k.dtype == FA_DTYPE_BF16 && kern->qk_bf16 == NULL);
    return widened                      ? FA_DECODE_ROWS
           : p->k.dtype == FA_DTYPE_F32 ? kern->decode_rows_f32
                                        : FA_DECODE_ROWS_PACKED;
}

/* The products of a task of nr query positions (R = g·nr rows) of a batch of sq: decode's, on
 * the K/V rows in place, where its rows are few (a step of one or a few tokens, g·sq <= drows,
 * the problem's decode_rows; or a short last block), both on the bf16 dot product where q, K
 * and V are bf16, D is even and R tiles by 4; else the prefill's, on packed blocks. */
static fa__score_path score_path(const fa__problem *p, const fa__cpu_kernels *kern, int64_t drows,
                                 int64_t g, int64_t sq, int64_t nr) {
    const int rows = kern->qk_rows != NULL && (g * nr <= FA_ROWS_IN_PLACE || g * sq <= drows) &&
                     p->k.sd == 1 && p->v.sd == 1;
    if (!rows)
        return FA_SCORES_PACKED;
    const int dbf = p->q.dtype == FA_DTYPE_BF16 && p->k.dtype == FA_DTYPE_BF16 &&
                    p->v.dtype == FA_DTYPE_BF16 && kern->qk_rows_bf16 != NULL &&
                    kern->pv_rows_bf16 != NULL && p->D % 2 == 0 && g * nr % 4 == 0;
    return dbf ? FA_SCORES_ROWS_BF16 : FA_SCORES_ROWS;
}

fa__score_path fa__fwd_score_rows(const fa__problem *p, const fa__cpu_kernels *kern, int64_t b,
                                  int64_t *from) {
    const int64_t g = p->H / p->Hk, br = block_positions(g), sq = fa__seqlen_q(p, b);
    const int64_t drows = decode_rows(p, kern);
    fa__score_path path = FA_SCORES_PACKED;
    *from = sq;
    for (int64_t i0 = (sq - 1) / br * br; i0 >= 0; i0 -= br) { /* tasks as fwd_task cuts them */
        const fa__score_path here = score_path(p, kern, drows, g, sq, sq - i0 < br ? sq - i0 : br);
        if (here == FA_SCORES_PACKED || (path != FA_SCORES_PACKED && here != path))
            break;
        path = here, *from = i0;
    }
    return path;
}

/* One task's rows: KV heads [hk0, hk0 + nh), each with R = g·nr rows (query head
 * hk·g + r/nr at position i0 + r%nr) whose state (Q, O, m, l) sits at row offset (hk-hk0)·R. */
typedef struct fwd_rows {
    int worker;
    int64_t b, hk0, nh, i0, nr, R;
    float *Q, *S, *O, *m, *l, *alpha, *Kpack, *Vpack, *tmp;
    uint32_t *P2;
} fwd_rows;

/* Rows of state a task may need: a query block of one KV head, or every KV head of a split
 * batch's chunk. */
static size_t state_rows(const fwd_plan *pl) {
    const int64_t block = pl->g * pl->br, split = pl->p->Hk * pl->part_rows;
    return (size_t)(block > split ? block : split);
}

/* Floats of a row on its way to a transpose (K: D) or of pv_exact's V (Dv). */
static int64_t tmp_cols(const fa__problem *p) { return p->D > p->Dv ? p->D : p->Dv; }

static void carve(const fwd_plan *pl, fwd_rows *t, int worker) {
    const int64_t D = pl->p->D, Dv = pl->p->Dv, Rmax = (int64_t)state_rows(pl);
    const int64_t Rblk = pl->g * pl->br;
    float *at = pl->scratch + (size_t)worker * pl->scratch_floats;
    t->worker = worker;
#define FA_TAKE(field, n) (t->field = at, at += fa__round_up((size_t)(n)))
    FA_TAKE(Q, Rmax * D);      // Q: [heads·R, D] (bf16: [heads·R, D/2] pairs)
    FA_TAKE(S, Rblk * FA_BC);  // S: [R, Bc]
    FA_TAKE(O, Rmax * Dv);     // O: [heads·R, Dv]
    FA_TAKE(m, Rmax);          // m, l: [heads·R]
    FA_TAKE(l, Rmax);
    FA_TAKE(alpha, Rblk);      // alpha: [R]
    FA_TAKE(Kpack, D * pl->ldk);     // Kᵀ: [D, Bc] (ld ldk; bf16: [D/2, Bc] pairs, ld Bc)
    FA_TAKE(Vpack, FA_BC * pl->ldv); // V: [Bc, Dv] (ld ldv; bf16: [Bc/2, Dv] pairs, ld Dv)
    FA_TAKE(tmp, FA_BC * tmp_cols(pl->p)); // K rows on their way to a transpose, pv_exact's V
    t->P2 = (uint32_t *)at;    // bf16 P: [R, Bc/2] pairs
#undef FA_TAKE
}

/* The floats carve() takes, term by term; FA_SIZE_OVERFLOW when they do not fit (size.h). */
static int64_t scratch_floats(const fwd_plan *pl) {
    /* R: state_rows(), checked */
    const int64_t D = pl->p->D, Dv = pl->p->Dv, Rblk = fa__size_mul(pl->g, pl->br);
    const int64_t Rsplit = fa__size_mul(pl->p->Hk, pl->part_rows);
    const int64_t R = Rblk < 0 || Rsplit < 0 ? FA_SIZE_OVERFLOW : Rblk > Rsplit ? Rblk : Rsplit;
    const int64_t terms[][2] = {{R, D},     {R, Dv},    {Rblk, FA_BC},     {R, 1},
                                {R, 1},     {Rblk, 1},  {D, pl->ldk},      {FA_BC, pl->ldv},
                                {FA_BC, tmp_cols(pl->p)},                  {Rblk, FA_BC / 2}};
    int64_t n = 0;
    for (size_t i = 0; i < sizeof terms / sizeof *terms; i++)
        n = fa__size_add(n, fa__size_round_up(fa__size_mul(terms[i][0], terms[i][1]), FA_ALIGN));
    return n;
}

/* The online softmax step of head hk's rows [r0, r1) over keys [j0, j0 + n): their scores
 * (rows of S, [R, Bc]) become the (dropped) probabilities, m and l are updated and alpha ([R])
 * gets the factor the rows of O must be rescaled by. */
static void softmax_block(const fwd_plan *pl, fwd_rows *t, int64_t hk, float *S, float *alpha,
                          int64_t j0, int64_t n, int masked, int64_t r0, int64_t r1) {
    const fa__problem *p = pl->p;
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t b = t->b, nr = t->nr, R = t->R, base = (hk - t->hk0) * R;
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    float *m = t->m + base, *l = t->l + base;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i = t->i0 + r % nr, h = hk * pl->g + r / nr;
        fa__score_epilogue(p, pl->softcap_l2, S + r * FA_BC, n, i, j0, off, sk, b, h, masked, NULL);
        alpha[r] = m[r]; /* the max before this block, until the factor replaces it */
    }
    for (int64_t q0 = r0, q1; q0 < r1; q0 = q1) { /* a chunk of rows at a time */
        enum { CHUNK = 32 };
        float sum[CHUNK];
        q1 = r1 - q0 < CHUNK ? r1 : q0 + CHUNK;
        kern->softmax_rows((int)(q1 - q0), (int)n, S + q0 * FA_BC, FA_BC, m + q0, sum);
        for (int64_t r = q0; r < q1; r++) {
            alpha[r] = exp2f(alpha[r] - fa__softmax_mu(&m[r], -INFINITY)); /* the row's mu */
            l[r] = alpha[r] * l[r] + sum[r - q0];
            const int64_t i = t->i0 + r % nr, h = hk * pl->g + r / nr;
            fa__dropout_row(p, b, h, i, j0, n, S + r * FA_BC, NULL); /* l: the undropped sum */
        }
    }
}

/* O = diag(alpha) O + P V on rows [r0, r1) of head hk over keys [j0, j0 + n), each row summing
 * only the keys it sees: S and alpha are indexed by the head's rows r, O is the head's [R, Dv].
 * The products take a masked P of exactly 0 times V, and 0 times a NaN or an infinity is NaN:
 * blocks at the band's edge whose V holds one take this path instead (the non-finite rule, rule
 * 3), so a key a row cannot see never reaches it. */
static void pv_exact(const fwd_plan *pl, fwd_rows *t, int64_t hk, const float *S,
                     const float *alpha, float *O, int64_t j0, int64_t n, int64_t r0, int64_t r1) {
    const fa__problem *p = pl->p;
    const int64_t Dv = p->Dv, b = t->b, rk = fa__row0_k(p, b);
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    float *v = t->tmp; // v: [n, Dv]
    for (int64_t j = 0; j < n; j++)
        fa__load_f32(v + j * Dv, 1, fa__elem(&p->v, b, rk + j0 + j, hk), p->v.dtype, Dv, p->v.sd,
                     fa__row_scale(&p->v, b, rk + j0 + j, hk));
    for (int64_t r = r0; r < r1; r++) {
        float acc[256]; /* Dv <= 256 */
        int64_t a, e;
        fa__row_keys(p, t->i0 + r % t->nr, j0, n, off, sk, &a, &e);
        for (int64_t u = 0; u < Dv; u++) acc[u] = 0.0f;
        for (int64_t j = a; j < e; j++)
            for (int64_t u = 0; u < Dv; u++) acc[u] += S[r * FA_BC + j] * v[j * Dv + u];
        for (int64_t u = 0; u < Dv; u++) O[r * Dv + u] = alpha[r] * O[r * Dv + u] + acc[u];
    }
}

/* Does V hold a NaN or an infinity at a key of the block [j0, j0 + n) that some query position
 * of the task misses (only there can a masked P of 0 meet it)? V is the products' operand: fp32
 * rows (ld floats apart; pairs = 1), bf16 pairs of keys (ld words apart; pairs = 2), or NULL:
 * head hk's rows of the input, read in place. */
static int v_nonfinite(const fwd_plan *pl, const fwd_rows *t, int64_t hk, const void *V, int pairs,
                       int64_t ld, int64_t j0, int64_t n) {
    const fa__problem *p = pl->p;
    const int64_t b = t->b, sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    int64_t a, e, ka, ke; /* keys every position sees: [ka, ke), from the first and last ones */
    fa__row_keys(p, t->i0 + t->nr - 1, j0, n, off, sk, &ka, &e);
    fa__row_keys(p, t->i0, j0, n, off, sk, &a, &ke);
    const int64_t runs[2][2] = {{0, ka < ke ? ka : n}, {ka < ke ? ke : n, n}}; /* the others */
    for (int u = 0; u < 2; u++) {
        const int64_t lo = runs[u][0] / pairs, hi = (runs[u][1] + pairs - 1) / pairs;
        if (!V && lo < hi &&
            !fa__rows_finite(&p->v, b, fa__row0_k(p, b) + j0 + lo, hi - lo, hk, p->Dv))
            return 1;
        for (int64_t r = lo; V && r < hi; r++) /* fp32 rows, or pair rows of 2·Dv bf16 */
            if (pairs == 1 ? !fa__finite((const float *)V + r * ld, FA_DTYPE_F32, p->Dv, 1)
                           : !fa__finite((const uint32_t *)V + r * ld, FA_DTYPE_BF16, 2 * p->Dv,
                                         1))
                return 1;
    }
    return 0;
}

/* Keys per decode product call. Calls take 8 keys of fp32 K or V (reading the cache in small
 * groups, front to back, keeps fp32 decode at its best read rate), and the kernel set's
 * decode_keys_half of fp16/bf16 rows (at most FA_DECODE_KEYS). */
enum { FA_QK_KEYS_F32 = 8, FA_PV_KEYS_F32 = 8, FA_DECODE_KEYS = 64 };

/* A group of cache rows: keys [j0, j0 + c) of heads [ha, hb), from rows0, the rows of head h0
 * (step: bytes from one head's row to the next head's), `bytes` each; c = 0: none. range: the
 * group's rows lie back to back in memory order (every head of a contiguous BSHD cache, or of
 * a paged one's keys within a page: group_range), so a share of them is a base and a count of
 * rows. */
typedef struct decode_group {
    const void *const *rows0;
    int64_t j0, ha, hb, h0, step;
    int c, bytes, range;
} decode_group;

/* Part `part` of `parts` of group gr's rows in memory order (key by key, each key's heads in
 * turn: a BSHD cache front to back): its first row's index into *lo; returns how many rows, at
 * most FA_DECODE_KEYS. As many parts as heads (decode's case): c rows each, no divisions. */
static int group_share(const decode_group *gr, int64_t part, int64_t parts, int64_t *lo) {
    const int64_t nh = gr->hb - gr->ha;
    int64_t n = gr->c;
    *lo = part * gr->c;
    if (nh != parts) {
        const int64_t total = gr->c * nh;
        *lo = total * part / parts;
        n = total * (part + 1) / parts - *lo;
    }
    return (int)(n < FA_DECODE_KEYS ? n : FA_DECODE_KEYS);
}

/* group_share's rows, as pointers into rows; returns how many. */
static int group_part(const decode_group *gr, int64_t part, int64_t parts, const void **rows) {
    const int64_t nh = gr->hb - gr->ha;
    int64_t lo;
    const int na = group_share(gr, part, parts, &lo);
    int64_t j = gr->j0 + lo / nh, h = lo % nh; /* row lo's key and head (from ha) */
    const char *row = (const char *)gr->rows0[j] + (gr->ha - gr->h0) * gr->step;
    for (int r = 0; r < na; r++) {
        rows[r] = row + h * gr->step;
        if (++h == nh && r + 1 < na) /* the next key's first head */
            h = 0, row = (const char *)gr->rows0[++j] + (gr->ha - gr->h0) * gr->step;
    }
    return na;
}

/* Group gr's first c rows of head hk, key by key, into rows; returns c. */
static int head_rows(const decode_group *gr, int64_t hk, int c, const void **rows) {
    for (int j = 0; j < c; j++)
        rows[j] = (const char *)gr->rows0[gr->j0 + j] + (hk - gr->h0) * gr->step;
    return c;
}

/* The range flag (decode_group) of keys [j0, j0 + c) of rows (the rows of one head, ts bytes
 * from a key to the next within the cache's storage): dense (every head of the task, heads back
 * to back, keys ts bytes apart) and, where paged, no jump between the keys: a group within one
 * page, or in pages that follow each other, asks as one span like a contiguous cache's group. */
static int group_range(const void *const *rows, int64_t j0, int c, int64_t ts, int dense,
                       int paged) {
    if (!dense)
        return 0;
    for (int j = 1; paged && j < c; j++)
        if ((const char *)rows[j0 + j] != (const char *)rows[j0 + j - 1] + ts)
            return 0;
    return 1;
}

/* What the call for head hk of group cur asks for (kernels.h: qk_rows' pf), next being the
 * group after cur: its share of next's rows in memory order (group_share); of a `range` group,
 * as a base and a count, with no row list to build (the list took about a tenth of decode's time
 * from L3 on Zen 5; on Zen 3 AVX2 decode took 0.96-0.99 of its time without it). */
static fa__prefetch decode_ask(const decode_group *cur, const decode_group *next, int64_t hk,
                               const void **ask) {
    const int64_t part = hk - cur->ha, parts = cur->hb - cur->ha;
    if (!next->range)
        return (fa__prefetch){ask, group_part(next, part, parts, ask), next->bytes, NULL};
    int64_t lo;
    const int n = group_share(next, part, parts, &lo);
    const char *base = (const char *)next->rows0[next->j0] + (next->ha - next->h0) * next->step;
    return (fa__prefetch){NULL, n, next->bytes, base + lo * next->bytes};
}

/* alpha of decode's pv calls after a block's first: O not rescaled */
#define FA_ONES8 1, 1, 1, 1, 1, 1, 1, 1
static const float decode_ones[FA_DECODE_ROWS] = {FA_ONES8, FA_ONES8, FA_ONES8, FA_ONES8,
                                                  FA_ONES8, FA_ONES8, FA_ONES8, FA_ONES8};
#undef FA_ONES8

/* An 8-bit cache's scales in decode, whose products see stored values: S[r, j] *= the scale of
 * key j, rows r < R (stride FA_BC), keys j < n; sr[j] points at key j's scale of the block's
 * first head, off floats before head hk's. On S = Q Kᵀ before the softmax, and on P after it
 * (P·diag(s) V), except where P V is pv_exact's, which scales V itself. */
static void scale_columns(float *S, int64_t R, int64_t n, const void *const *sr, int64_t off) {
    float sc[FA_BC];
    for (int64_t j = 0; j < n; j++) sc[j] = ((const float *)sr[j])[off];
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j++) S[r * FA_BC + j] *= sc[j];
}

/* Decode (few rows, K/V rows read in place): one block of keys for every head of the task, in
 * groups of heads whose scores fit in S. The products walk the keys in groups (the keys per call
 * above), every head of a group of keys before the next group, so the cache (BSHD: a token's
 * heads side by side) is read a group at a time; inside a group, head by head. Each call asks
 * for its share of the next group's rows in memory order (decode_ask), since on Zen 5 reading
 * in decode's order alone ran at 0.6-0.75 of reading front to back
 * (bench/results/2026-12-02-decode-zen5-order.md), and on Zen 3 decode of 8k-128k tokens took
 * 0.76-0.88 of the time it took asking for the next call's rows (fp16, bf16) or for none (fp32)
 * (bench/results/2026-12-02-decode-zen3-asks.md). The group after the last qk group is the
 * first pv group; after the last pv group comes the next head group's first qk group, or that
 * of the next block, keys [jn, jn + nn) (nn = 0: none).
 * qbf16: t->Q holds bf16 pairs, and both products run on the bf16 dot product (qk_rows_bf16, then
 * pv_rows_bf16 on P rounded to bf16). */
static void decode_block(const fwd_plan *pl, fwd_rows *t, int64_t j0, int64_t n, int64_t jn,
                         int64_t nn, int masked, int qbf16) {
    const fa__problem *p = pl->p;
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t D = p->D, Dv = p->Dv, b = t->b, R = t->R, rk = fa__row0_k(p, b), h00 = t->hk0;
    const int64_t hg = (pl->g * pl->br) / R, hend = h00 + t->nh; /* hg: heads whose S fits */
    const int64_t kes = fa__dtype_size(p->k.dtype), ves = fa__dtype_size(p->v.dtype);
    const int kb = (int)(D * kes), vb = (int)(Dv * ves); /* bytes of a row */
    const int64_t kstep = p->k.sh * kes, vstep = p->v.sh * ves;
    const int qkk = p->k.dtype == FA_DTYPE_F32 ? FA_QK_KEYS_F32 : kern->decode_keys_half[0];
    const int pvk = p->v.dtype == FA_DTYPE_F32 ? FA_PV_KEYS_F32 : kern->decode_keys_half[1];
    /* range (decode_group) of the groups asked for, the next ones (a current group's is not
     * read): every head in a group, heads and keys back to back, within a page if paged */
    const int all = hg >= p->Hk && t->nh == p->Hk;
    const int64_t kts = p->k.ss * kes, vts = p->v.ss * ves; /* key to key, within a page */
    const int kd = all && kstep == kb && kts == p->Hk * kb, kp = p->k.block_table != NULL;
    const int vd = all && vstep == vb && vts == p->Hk * vb, vp = p->v.block_table != NULL;
#define FA_KRANGE(rows, j, c) group_range(rows, j, c, kts, kd, kp)
#define FA_VRANGE(j, c) group_range(vrow, j, c, vts, vd, vp)
    const void *krow[FA_BC], *vrow[FA_BC], *knext[FA_BC]; /* the rows of head t->hk0 */
    fa__row_ptrs(&p->k, b, rk + j0, n, h00, krow);
    fa__row_ptrs(&p->v, b, rk + j0, n, h00, vrow);
    const fa__view *ksc = p->k.scale, *vsc = p->v.scale; /* 8-bit caches: their scales */
    const void *kscale[FA_BC], *vscale[FA_BC];             /* of head t->hk0 */
    if (ksc) {
        fa__row_ptrs(ksc, b, rk + j0, n, h00, kscale);
        fa__row_ptrs(vsc, b, rk + j0, n, h00, vscale);
    }
    if (nn > 0) fa__row_ptrs(&p->k, b, rk + jn, nn, h00, knext);
#define FA_KEYS(n, k) ((int)((n) < (k) ? (n) : (k)))
    for (int64_t h0 = h00; h0 < hend; h0 += hg) {
        const int64_t h1 = h0 + hg < hend ? h0 + hg : hend;
        for (int64_t jg = 0; jg < n; jg += qkk) { // S = Q Kᵀ
            const decode_group cur = {krow, jg, h0, h1, h00, kstep, FA_KEYS(n - jg, qkk), kb, 0};
            const int more = jg + qkk < n; /* next: the next qk group, or the first pv group */
            const int nc = more ? FA_KEYS(n - jg - qkk, qkk) : FA_KEYS(n, pvk);
            const int nr = more ? FA_KRANGE(krow, jg + qkk, nc) : FA_VRANGE(0, nc);
            const decode_group next =
                more ? (decode_group){krow, jg + qkk, h0, h1, h00, kstep, nc, kb, nr}
                     : (decode_group){vrow, 0, h0, h1, h00, vstep, nc, vb, nr};
            for (int64_t hk = h0; hk < h1; hk++) {
                const void *k[FA_DECODE_KEYS], *ask[FA_DECODE_KEYS];
                head_rows(&cur, hk, cur.c, k);
                const fa__prefetch pf = decode_ask(&cur, &next, hk, ask);
                float *s = t->S + (hk - h0) * R * FA_BC + jg; // s: [R, c]
                if (qbf16)
                    kern->qk_rows_bf16((int)R, cur.c, (int)(D / 2), (const uint32_t *)t->Q +
                                       (hk - h00) * R * (D / 2), D / 2, k, pl->qscale, s,
                                       FA_BC, &pf);
                else
                    kern->qk_rows((int)R, cur.c, (int)D, t->Q + (hk - h00) * R * D, D, k,
                                  p->k.dtype, s, FA_BC, &pf);
            }
        }
        uint8_t exact[FA_BR_MAX]; /* heads whose P V is pv_exact's (hg <= br heads) */
        for (int64_t hk = h0; hk < h1; hk++) {
            float *sh = t->S + (hk - h0) * R * FA_BC; // S: [R, n]
            if (ksc) scale_columns(sh, R, n, kscale, (hk - h00) * ksc->sh);
            softmax_block(pl, t, hk, sh, t->alpha + (hk - h0) * R, j0, n, masked, 0, R);
            exact[hk - h0] = masked && v_nonfinite(pl, t, hk, NULL, 1, 0, j0, n);
            if (vsc && !exact[hk - h0]) scale_columns(sh, R, n, vscale, (hk - h00) * vsc->sh);
        }
        const int64_t h2 = h1 + hg < hend ? h1 + hg : hend; /* the next head group's end */
        const int64_t hn = h00 + hg < hend ? h00 + hg : hend; /* the first head group's */
        for (int64_t jg = 0; jg < n; jg += pvk) { // O = alpha O + P V
            const decode_group cur = {vrow, jg, h0, h1, h00, vstep, FA_KEYS(n - jg, pvk), vb, 0};
            decode_group next = {krow, 0, h00, h00 + 1, h00, kstep, 0, kb, 0}; /* none */
            if (jg + pvk < n) {
                const int nc = FA_KEYS(n - jg - pvk, pvk);
                next = (decode_group){
                    vrow, jg + pvk, h0, h1, h00, vstep, nc, vb, FA_VRANGE(jg + pvk, nc)};
            } else if (h1 < hend) { /* the next head group's first qk group */
                next = (decode_group){krow, 0, h1, h2, h00, kstep, FA_KEYS(n, qkk), kb, 0};
            } else if (nn > 0) { /* the next block's first qk group */
                const int nc = FA_KEYS(nn, qkk);
                next =
                    (decode_group){knext, 0, h00, hn, h00, kstep, nc, kb, FA_KRANGE(knext, 0, nc)};
            }
            for (int64_t hk = h0; hk < h1; hk++) {
                if (exact[hk - h0]) continue;
                const void *v[FA_DECODE_KEYS], *ask[FA_DECODE_KEYS];
                head_rows(&cur, hk, cur.c, v);
                const fa__prefetch pf = decode_ask(&cur, &next, hk, ask);
                const int c = cur.c;
                const float *sp = t->S + (hk - h0) * R * FA_BC + jg; // P: [R, c]
                const float *alpha = jg == 0 ? t->alpha + (hk - h0) * R : decode_ones;
                float *o = t->O + (hk - h00) * R * Dv;
                if (qbf16) { /* P rounded to bf16 pairs, as the prefill's bf16 P V takes it */
                    enum { LD2 = FA_DECODE_KEYS / 2 };
                    uint32_t p2[FA_DECODE_ROWS * LD2]; // P: [R, c/2] pairs
                    for (int64_t r = 0; r < R; r++)
                        kern->to_bf16(c, sp + r * FA_BC, (uint16_t *)(p2 + r * LD2));
                    kern->pv_rows_bf16((int)R, c, (int)Dv, p2, LD2, v, alpha, o, Dv, &pf);
                } else {
                    kern->pv_rows((int)R, c, (int)Dv, sp, FA_BC, v, p->v.dtype, alpha, o, Dv,
                                  &pf);
                }
            }
        }
        for (int64_t hk = h0; hk < h1; hk++)
            if (exact[hk - h0])
                pv_exact(pl, t, hk, t->S + (hk - h0) * R * FA_BC, t->alpha + (hk - h0) * R,
                         t->O + (hk - h00) * R * Dv, j0, n, 0, R);
    }
#undef FA_KRANGE
#undef FA_VRANGE
#undef FA_KEYS
}

/* Head hk's packed Kᵀ and V for keys [j0, j0 + n) of batch t->b, from this thread's head pack:
 * the chunks of FA_BC keys they fall in are packed first if this thread has not packed them yet
 * (a new head starts over). V is neither packed nor set where its rows serve in place. */
static void head_pack(const fwd_plan *pl, const fwd_rows *t, int64_t hk, int64_t j0, int64_t n,
                      int v_in_place, const float **Kt, const float **V) {
    const fa__problem *p = pl->p;
    const int64_t D = p->D, b = t->b, rk = fa__row0_k(p, b), sk = fa__seqlen_k(p, b);
    float *kt = pl->hp + (size_t)t->worker * pl->hp_floats; // Kᵀ: [chunks][D, FA_BC] (ld ldk)
    float *v = kt + (size_t)(pl->hp_chunks * D * pl->ldk);  // V: [Sk, Dv] (ld ldv)
    uint8_t *done = pl->hp_done + (size_t)t->worker * pl->hp_chunks;
    if (pl->hp_head[t->worker] != b * p->Hk + hk) {
        memset(done, 0, (size_t)pl->hp_chunks);
        pl->hp_head[t->worker] = b * p->Hk + hk;
    }
    for (int64_t c = j0 / FA_BC; c <= (j0 + n - 1) / FA_BC; c++) {
        if (done[c]) continue;
        const int64_t c0 = c * FA_BC, m = sk - c0 < FA_BC ? sk - c0 : FA_BC;
        fa__kv_block(D, pl->kern, &p->k, b, rk + c0, hk, m, 1, kt + c * D * pl->ldk, pl->ldk,
                     t->tmp);
        if (!v_in_place)
            fa__kv_block(p->Dv, pl->kern, &p->v, b, rk + c0, hk, m, 0, v + c0 * pl->ldv, pl->ldv,
                         t->tmp);
        done[c] = 1;
    }
    *Kt = kt + j0 / FA_BC * D * pl->ldk + j0 % FA_BC; /* blocks stay within a chunk */
    if (!v_in_place) *V = v + j0 * pl->ldv;
}

/* Has this thread's head pack the chunk of key j of (t->b, hk)? */
static int head_packed(const fwd_plan *pl, const fwd_rows *t, int64_t hk, int64_t j) {
    return pl->hp && pl->hp_head[t->worker] == t->b * pl->p->Hk + hk &&
           pl->hp_done[(size_t)t->worker * pl->hp_chunks + j / FA_BC];
}

/* The online softmax of the task's rows over keys [j_lo, j_hi): leaves m, l and the
 * unnormalized O of every head in the scratch. Blocks are the outer loop and heads the inner
 * one, so a split chunk reads each block of the cache (all heads, contiguous in BSHD) once.
 * Keys [j_hi, j_next) come next in the same task (a split run's next chunk; j_next = j_hi when
 * none): decode prefetches the first of their blocks too. load_q: load the task's Q (a split
 * run's later chunks find it loaded). */
static void run_rows(const fwd_plan *pl, fwd_rows *t, int64_t j_lo, int64_t j_hi,
                     int64_t j_next, int load_q) {
    const fa__problem *p = pl->p;
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t D = p->D, Dv = p->Dv, b = t->b, i0 = t->i0, nr = t->nr, R = t->R;
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    const int64_t rq = fa__row0_q(p, b), rk = fa__row0_k(p, b);

    /* Few rows (decode): products straight from the K/V rows, no packing (score_path).
     * bf16 inputs on a CPU with a bf16 dot product stay bf16 in both products (Q unscaled:
     * qk_bf16 applies the scale in fp32); everything else computes in fp32. */
    const fa__score_path path = score_path(p, kern, pl->decode_rows, pl->g, sq, nr);
    const int rows = path != FA_SCORES_PACKED, dbf = path == FA_SCORES_ROWS_BF16;
    const int bf16 =
        !rows && p->q.dtype == FA_DTYPE_BF16 && kern->qk_bf16 != NULL && !p->k.scale;
    const int64_t D2 = (D + 1) / 2, ldq = bf16 || dbf ? D2 : D;
    const int v_in_place = fa__rows_in_place(&p->v, kern);
    for (int64_t r = 0; r < t->nh * R; r++) {
        t->m[r] = -INFINITY;
        t->l[r] = 0.0f;
        if (!load_q) continue;
        const int64_t hk = t->hk0 + r / R, h = hk * pl->g + r % R / nr, i = i0 + r % nr;
        const void *src = fa__elem(&p->q, b, rq + i, h);
        if (bf16 || dbf)
            fa__copy_bf16_row((uint16_t *)((uint32_t *)t->Q + r * D2), src, D, p->q.sd);
        else if (p->q.sd == 1) kern->to_f32((int)D, src, p->q.dtype, pl->qscale, t->Q + r * D);
        else fa__load_f32(t->Q + r * D, 1, src, p->q.dtype, D, p->q.sd, pl->qscale);
    }
    memset(t->O, 0, (size_t)(t->nh * R * Dv) * sizeof *t->O);

    for (int64_t j0 = j_lo, n; j0 < j_hi; j0 += n) {
        /* a task of many rows over a long band takes up to 0.1 s or more: a cancelled call
         * stops here (its outputs are unspecified) */
        if (fa__cancelled(pl->cancel)) return;
        /* Blocks end at multiples of FA_BC (a head pack holds Kᵀ a chunk of FA_BC keys at a
         * time); only a band that starts between them (a window) makes its first block shorter */
        n = j_hi - j0 < FA_BC - j0 % FA_BC ? j_hi - j0 : FA_BC - j0 % FA_BC;
        /* Only blocks that cross the band's edge for some row need the mask. */
        int masked = fa__block_masked(p, i0, nr, j0, n, off, sk);
        if (rows) {
            const int64_t jn = j0 + n, end = jn < j_hi ? j_hi : j_next;
            decode_block(pl, t, j0, n, jn, end - jn < FA_BC ? end - jn : FA_BC, masked, dbf);
            continue;
        }
        if (masked && n > FA_BC / 2) { /* the band's edge in halves: fewer rows see each */
            n = FA_BC / 2;
            masked = fa__block_masked(p, i0, nr, j0, n, off, sk);
        }
        /* On a block at the band's edge, some positions of each query head may see none of its
         * keys: the products then run per query head on positions [lo, hi) only. */
        int64_t lo = 0, hi = nr;
        if (masked) fa__block_rows(p, i0, nr, j0, n, off, &lo, &hi);
        const int part = lo > 0 || hi < nr;
        const int64_t runs = part ? pl->g : 1, len = part ? hi - lo : R;
        for (int64_t hk = t->hk0; hk < t->hk0 + t->nh; hk++) {
            const int64_t base = (hk - t->hk0) * R; /* this head's first state row */
            float *S = t->S, *O = t->O + base * Dv;
            const float *V = t->Vpack, *Kt = t->Kpack; // V: [n, Dv] (ld ldv), Kᵀ: [D, n] (ld ldk)
            int64_t ldv = Dv, ldk = pl->ldk;
            const int hp = pl->hp && !bf16 && t->nh == 1; /* split tasks walk every head */
            if (bf16) {
                fa__pack_k_bf16(D, kern, &p->k, b, rk + j0, hk, n, (uint32_t *)t->Kpack,
                                (uint16_t *)t->tmp);
                fa__pack_v_bf16(Dv, kern, &p->v, b, rk + j0, hk, n, (uint32_t *)t->Vpack);
            } else {
                if (hp) {
                    head_pack(pl, t, hk, j0, n, v_in_place, &Kt, &V);
                } else {
                    fa__kv_block(D, kern, &p->k, b, rk + j0, hk, n, 1, t->Kpack, ldk, t->tmp);
                    if (!v_in_place)
                        fa__kv_block(Dv, kern, &p->v, b, rk + j0, hk, n, 0, t->Vpack, pl->ldv,
                                     t->tmp);
                }
                ldv = pl->ldv;
                if (v_in_place) { /* fp32 rows are P V's operand as they are */
                    V = fa__elem(&p->v, b, rk + j0, hk);
                    ldv = p->v.ss;
                }
            }
            const int64_t jn = j0 + n, nn = j_hi - jn < FA_BC ? j_hi - jn : FA_BC;
            /* the next block arrives while this one runs, unless this thread packed it already */
            if (nn > 0 && !(hp && head_packed(pl, t, hk, jn))) {
                fa__prefetch_block(&p->k, b, rk + jn, nn, hk, D);
                fa__prefetch_block(&p->v, b, rk + jn, nn, hk, Dv);
            }
            const int64_t qr = fa__qk_chunk_rows(kern);
            for (int64_t u = 0; u < runs; u++) { // S rows [u·nr + lo, end): [len, n], then softmax
                const int64_t end = u * nr + lo + len;
                for (int64_t r0 = u * nr + lo, r1; r0 < end; r0 = r1) {
                    /* a few rows at a time, so their softmax finds them in L1 */
                    r1 = r0 + qr < end ? r0 + qr : end;
                    if (bf16)
                        kern->qk_bf16((int)(r1 - r0), (int)n, (int)D2,
                                      (const uint32_t *)t->Q + (base + r0) * ldq, D2,
                                      (const uint32_t *)t->Kpack, FA_BC, pl->qscale,
                                      S + r0 * FA_BC, FA_BC);
                    else
                        kern->qk((int)(r1 - r0), (int)n, (int)D, t->Q + (base + r0) * ldq, D, Kt,
                                 ldk, S + r0 * FA_BC, FA_BC);
                    softmax_block(pl, t, hk, S, t->alpha, j0, n, masked, r0, r1);
                }
            }
            /* at the band's edge, a non-finite V takes the exact path (pv_exact) */
            const int exact = masked && (bf16 ? v_nonfinite(pl, t, hk, t->Vpack, 2, Dv, j0, n)
                                              : v_nonfinite(pl, t, hk, V, 1, ldv, j0, n));
            for (int64_t u = 0; u < runs; u++) { // O rows [r0, r0 + len) += P V
                const int64_t r0 = u * nr + lo;
                if (exact) {
                    pv_exact(pl, t, hk, S, t->alpha, O, j0, n, r0, r0 + len);
                } else if (bf16) {
                    uint32_t *P2 = t->P2 + r0 * (FA_BC / 2);
                    for (int64_t r = 0; r < len; r++)
                        kern->to_bf16((int)n, S + (r0 + r) * FA_BC,
                                      (uint16_t *)(P2 + r * (FA_BC / 2)));
                    kern->pv_bf16((int)len, (int)(n + 1) / 2, (int)Dv, P2, FA_BC / 2,
                                  (const uint32_t *)t->Vpack, Dv, t->alpha + r0, O + r0 * Dv, Dv);
                } else {
                    kern->pv((int)len, (int)n, (int)Dv, S + r0 * FA_BC, FA_BC, V, ldv,
                             t->alpha + r0, O + r0 * Dv, Dv);
                }
            }
        }
    }
}

/* out = O / l and lse for one row (m, l already merged). l = 0: the row saw no key with a score
 * above -inf, so out = 0 (whatever O holds: 0 times a NaN in V is NaN) and lse = -inf; a NaN l
 * (a NaN or +inf score) gives NaN in both. A sink s (finite) joins the row in fp64, before the
 * rounding to out's dtype: with L the keys' lse, lse = logaddexp(L, s) and out = O / l ·
 * exp(L - lse); a row with no key gets out = 0 and lse = s. */
static void write_row(const fwd_plan *pl, int64_t b, int64_t h, int64_t i, const float *o,
                      float m, float l) {
    static const float zeros[256]; /* Dv <= 256 */
    const fa__problem *p = pl->p;
    const int64_t rq = fa__row0_q(p, b);
    const int none = l == 0.0f;
    const double sink = p->sinks ? (double)p->sinks[h * p->sinks_sh] : -INFINITY;
    double lse = none ? -INFINITY : ((double)m + log2((double)l)) * FA_LN2;
    float scale = none ? 1.0f : 1.0f / l;
    if (sink != -INFINITY) {
        const double keys = lse; /* -inf, a number or NaN */
        lse = none ? sink : fmax(keys, sink) + log1p(exp(-fabs(keys - sink)));
        if (!none) scale = (float)(exp(keys - lse) / (double)l);
    }
    fa__store_f32(pl->kern, fa__elem(&p->out, b, rq + i, h), p->out.dtype, none ? zeros : o, p->Dv,
                  p->out.sd, scale);
    if (p->lse) p->lse[b * p->lse_sb + h * p->lse_sh + (rq + i) * p->lse_ss] = (float)lse;
}

/* Keys per split chunk of a cache of sk keys: FA_CHUNKS chunks of at least FA_BC keys, at most
 * FA_CHUNK. Chunks of 1024 keys left caches of 1024 or fewer unsplit, a task per KV head reading
 * its rows 2-4 KiB apart (on Zen 5 that took twice the time of 1025 keys split in two), and
 * caches of a few thousand keys with as few tasks as chunks. */
static int64_t split_chunk(int64_t sk) {
    const int64_t c = ((sk + FA_CHUNKS - 1) / FA_CHUNKS + FA_BC - 1) / FA_BC * FA_BC;
    return c < FA_BC ? FA_BC : c > FA_CHUNK ? FA_CHUNK : c;
}

static void fwd_task(void *arg, int64_t task, int worker) {
    const fwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    const int64_t Dv = p->Dv;
    fwd_rows t;
    carve(pl, &t, worker);

    /* Which batch and: KV head and query block (heavier, later blocks first), or key chunk. */
    const int64_t b = fa__task_batch(pl->task_start, p->B, task), local = task - pl->task_start[b];
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    const int64_t nc = pl->split[b], nqb = nc ? 1 : (sq + pl->br - 1) / pl->br;
    const int64_t qb = nc ? 0 : nqb - 1 - local % nqb;
    t.b = b;
    t.hk0 = nc ? 0 : local / nqb;
    t.nh = nc ? p->Hk : 1;
    t.i0 = qb * pl->br;
    t.nr = sq - t.i0 < pl->br ? sq - t.i0 : pl->br;
    t.R = pl->g * t.nr;

    /* The band of keys any row of this block can see; blocks outside it are never visited. */
    int64_t j_lo = fa__key_lo(p, t.i0, off), j_hi = fa__key_hi(p, t.i0 + t.nr - 1, off, sk);
    if (nc) { /* this task's run of chunks: each leaves every head's (m, l, O) in its partial */
        const int64_t c0 = local * pl->run, c1 = c0 + pl->run < nc ? c0 + pl->run : nc;
        const int64_t ck = split_chunk(sk); /* keys per chunk, as fa__cpu_forward cut them */
        for (int64_t c = c0; c < c1; c++) {
            const int64_t lo = j_lo > c * ck ? j_lo : c * ck;
            const int64_t hi = j_hi < (c + 1) * ck ? j_hi : (c + 1) * ck;
            int64_t next = hi; /* the next chunk's keys start at hi when it has any */
            if (c + 1 < c1 && j_hi > hi) next = j_hi < hi + ck ? j_hi : hi + ck;
            run_rows(pl, &t, lo, hi, next, c == c0);
            for (int64_t hk = 0; hk < p->Hk; hk++) {
                const size_t at = (size_t)(pl->part_start[b] + hk * nc + c) * partial_floats(pl);
                float *part = pl->partial + at;
                memcpy(part, t.m + hk * t.R, (size_t)t.R * sizeof(float));
                memcpy(part + pl->part_rows, t.l + hk * t.R, (size_t)t.R * sizeof(float));
                memcpy(part + 2 * pl->part_rows, t.O + hk * t.R * Dv,
                       (size_t)(t.R * Dv) * sizeof(float));
            }
        }
        return;
    }
    run_rows(pl, &t, j_lo, j_hi, j_hi, 1);
    for (int64_t r = 0; r < t.R; r++)
        write_row(pl, b, t.hk0 * pl->g + r / t.nr, t.i0 + r % t.nr, t.O + r * Dv, t.m[r], t.l[r]);
}

/* Merges the chunk partials of one (batch, KV head) in chunk order. Task = b * Hk + hk. */
static void merge_task(void *arg, int64_t task, int worker) {
    const fwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    const int64_t Dv = p->Dv, b = task / p->Hk, hk = task % p->Hk, nc = pl->split[b];
    if (!nc) return;
    const int64_t sq = fa__seqlen_q(p, b), R = pl->g * sq;
    const size_t pf = partial_floats(pl);
    const float *first = pl->partial + (size_t)(pl->part_start[b] + hk * nc) * pf;
    float *o = pl->scratch + (size_t)worker * pl->scratch_floats; // o: [Dv]
    for (int64_t r = 0; r < R; r++) {
        float m = -INFINITY; /* NaN once a chunk's is (a NaN or +inf score there) */
        for (int64_t c = 0; c < nc; c++) {
            const float mc = first[c * pf + r];
            m = mc > m || isnan(mc) ? mc : m;
        }
        const float m_use = m == -INFINITY ? 0.0f : m;
        float l = 0.0f;
        memset(o, 0, (size_t)Dv * sizeof *o);
        for (int64_t c = 0; c < nc; c++) {
            /* An empty chunk (m = -inf) weighs w = 0; a NaN m makes every w NaN. No chunk is
             * passed over, so a NaN in one (l, or O: 0 times a NaN V) reaches the row. */
            const float *part = first + c * pf;
            const float w = exp2f(part[r] - m_use);
            l += w * part[pl->part_rows + r];
            const float *oc = part + 2 * pl->part_rows + r * Dv;
            for (int64_t t = 0; t < Dv; t++) o[t] += w * oc[t];
        }
        write_row(pl, b, hk * pl->g + r / sq, r % sq, o, m, l);
    }
}

/* Varlen rows outside every sequence: out = 0, lse = -inf. */
static void clear_outside(const fa__problem *p) {
    const int64_t ranges[2][2] = {{0, p->cu_q[0]}, {p->cu_q[p->B], p->total_q}};
    for (int r = 0; r < 2; r++) {
        fa__zero_rows(&p->out, p->H, p->Dv, ranges[r][0], ranges[r][1]);
        for (int64_t s = ranges[r][0]; p->lse && s < ranges[r][1]; s++)
            for (int64_t h = 0; h < p->H; h++) p->lse[h * p->lse_sh + s * p->lse_ss] = -INFINITY;
    }
}

/* Sets up the threads' head packs (fwd_plan.hp) where the problem packs fp32 K/V blocks for
 * prefill and a head fits FA_HEAD_PACK_MAX. Without the memory for them the forward packs per
 * block, as it does for longer heads. */
static void head_packs(fwd_plan *pl, int nthreads) {
    const fa__problem *p = pl->p;
    int64_t sk = 0;
    for (int64_t b = 0; b < p->B; b++) sk = fa__seqlen_k(p, b) > sk ? fa__seqlen_k(p, b) : sk;
    pl->hp = NULL, pl->hp_head = NULL;
    /* decode reads K/V rows in place, and bf16 products pack bf16 pairs block by block */
    const int bf16 =
        p->q.dtype == FA_DTYPE_BF16 && pl->kern->qk_bf16 != NULL && !p->k.scale;
    if (sk == 0 || bf16 || (pl->kern->qk_rows && pl->g * p->Sq <= pl->decode_rows))
        return;
    pl->hp_chunks = (sk + FA_BC - 1) / FA_BC;
    const int64_t v =
        fa__rows_in_place(&p->v, pl->kern) ? 0 : fa__size_mul(sk, pl->ldv); /* V rows */
    const int64_t floats = fa__size_round_up(
        fa__size_add(fa__size_mul(fa__size_mul(pl->hp_chunks, p->D), pl->ldk), v), FA_ALIGN);
    if (floats < 0 || fa__size_mul(floats, sizeof(float)) > (int64_t)FA_HEAD_PACK_MAX) return;
    pl->hp_floats = (size_t)floats;
    pl->hp = fa__alloc_aligned(fa__size_mul(nthreads, floats), sizeof(float));
    pl->hp_head = fa__alloc(fa__size_mul(nthreads, (int64_t)sizeof(int64_t) + pl->hp_chunks), 1);
    if (!pl->hp || !pl->hp_head) {
        free(pl->hp);
        free(pl->hp_head);
        pl->hp = NULL, pl->hp_head = NULL;
        return;
    }
    pl->hp_done = (uint8_t *)(pl->hp_head + nthreads);
    for (int i = 0; i < nthreads; i++) pl->hp_head[i] = -1;
}

fa_status fa__cpu_forward(fa_context *ctx, const fa__problem *p) {
    return fa__cpu_forward_after(ctx, p, NULL, NULL);
}

fa_status fa__cpu_forward_after(fa_context *ctx, const fa__problem *p, void (*first)(void *),
                                void *arg) {
    fwd_plan pl = {.p = p, .kern = fa__cpu_kernels_get(), .g = p->H / p->Hk,
                   .cancel = fa__call_cancel()};
    pl.br = block_positions(pl.g);
    fa__score_scales(p, &pl.qscale, &pl.softcap_l2);
    pl.ldk = fa__packed_ld(FA_BC);
    pl.ldv = fa__packed_ld(p->Dv);

    const int nthreads = fa__context_threads(ctx);
    pl.decode_rows = decode_rows(p, pl.kern);
    /* With fewer than FA_FEW_HEADS (batch, KV head) pairs, the prefill's path has that few
     * tasks (one per pair where the query fits one): a batch of up to FA_SPLIT_ROWS_MAX rows
     * then splits its keys too, its chunks on the prefill's products, so that more threads have
     * work (MQA: one KV head, 71 query heads in Falcon-7B; on two threads 0.50-0.58 of the time
     * at one token, on one 1.02-1.04). Splits depend on the shapes only. Every split batch has
     * g·sq <= g·Sq (Sq: the longest query) and <= split_rows rows: part_rows bounds them. */
    const int64_t pairs = fa__size_mul(p->B, p->Hk); /* varlen's B is cu_seqlens' (2^61?) */
    pl.split_rows = pairs >= 0 && pairs < FA_FEW_HEADS ? FA_SPLIT_ROWS_MAX : pl.decode_rows;
    /* g·Sq <= H·Sq fits: Sq is the longest query (api.c plans from the lengths, not the
     * max_seqlen_q bound) and out holds H·Sq elements */
    pl.part_rows = pl.g * p->Sq < pl.split_rows ? pl.g * p->Sq : pl.split_rows;
    const int64_t floats = scratch_floats(&pl);
    pl.scratch_floats = (size_t)floats;
    pl.task_start = fa__alloc(fa__size_add(fa__size_mul(3, p->B), 2), sizeof(int64_t));
    pl.scratch = fa__alloc_aligned(fa__size_mul(nthreads, floats), sizeof(float));
    if (!pl.task_start || !pl.scratch) goto no_memory;
    head_packs(&pl, nthreads);
    pl.split = pl.task_start + p->B + 1;
    pl.part_start = pl.split + p->B;

    int64_t chunks = 0;
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b);
        const int64_t ck = split_chunk(sk);
        const int split = sq > 0 && sq <= pl.br && pl.g * sq <= pl.split_rows && sk > ck;
        pl.split[b] = split ? (sk + ck - 1) / ck : 0;
        chunks += pl.split[b];
    }
    /* Runs of up to FA_RUN_MAX chunks, as long as every thread still gets FA_RUNS of them. */
    pl.run = chunks / ((int64_t)nthreads * FA_RUNS);
    pl.run = pl.run < 1 ? 1 : pl.run > FA_RUN_MAX ? FA_RUN_MAX : pl.run;
    pl.task_start[0] = pl.part_start[0] = 0;
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t sq = fa__seqlen_q(p, b), nc = pl.split[b];
        /* split: one task per run of chunks (all KV heads); else one per KV head and query block */
        const int64_t tasks = nc ? (nc + pl.run - 1) / pl.run : p->Hk * ((sq + pl.br - 1) / pl.br);
        pl.task_start[b + 1] = pl.task_start[b] + tasks;
        pl.part_start[b + 1] = pl.part_start[b] + p->Hk * nc;
    }
    pl.partial = NULL;
    if (pl.part_start[p->B] > 0) {
        pl.partial = fa__alloc(fa__size_mul(pl.part_start[p->B], (int64_t)partial_floats(&pl)),
                               sizeof(float));
        if (!pl.partial) goto no_memory;
    }
    if (first) first(arg); /* every allocation has succeeded: the caller's writes may start */
    if (p->cu_q) clear_outside(p);
    fa__context_run(ctx, pl.task_start[p->B], fwd_task, &pl);
    if (pl.partial) fa__context_run(ctx, p->B * p->Hk, merge_task, &pl);

    free(pl.partial);
    free(pl.task_start);
    free(pl.scratch);
    free(pl.hp);
    free(pl.hp_head);
    return FA_OK;

no_memory:
    free(pl.task_start);
    free(pl.scratch);
    free(pl.hp);
    free(pl.hp_head);
    return fa__error(FA_ERR_NO_MEMORY, "forward: cannot allocate scratch for %d threads",
                     nthreads);
}
