/* SPDX-License-Identifier: MIT */
/*
 * fwd.c — the CPU forward pass: blocking, masks and the online softmax around the microkernels.
 *
 * A task is (batch b, KV head hk, block of br query rows) and covers the g = H/Hk query heads
 * that share hk, so each K/V block is read once for all of them: R = g*br rows, row r is query
 * head hk*g + r/nr at query position i0 + r%nr. Per task:
 *   load Q (converted to fp32, pre-scaled so scores come out in the exp2 domain)
 *   for each block of Bc keys inside the task's causal/window band:
 *     S = Q Kᵀ                                  (microkernel)
 *     softcap, ALiBi, mask (only on blocks that cross the band's edge)
 *     online softmax: m' = max(m, rowmax S), P = 2^(S - m'), alpha = 2^(m - m'), l = alpha l + ΣP
 *     O = diag(alpha) O + P V                   (microkernel)
 *   out = O / l, lse = (m + log2 l) ln 2;  l = 0 (nothing visible) gives out = 0, lse = -inf.
 * Tasks never share outputs and the blocking does not depend on the thread count, so results
 * are bitwise identical for any number of threads.
 */
#include "cpu.h"

#include "tile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    FA_ROWS = 126,   /* target rows (query heads x positions) per task: 9 x 14 and 21 x 6 */
    FA_BR_MAX = 126  /* most query positions per task */
};

typedef struct fwd_plan {
    const fa__problem *p;
    const fa__cpu_kernels *kern;
    int64_t g;           /* query heads per KV head */
    int64_t br;          /* query positions per task */
    int64_t *task_start; /* [B + 1]: first task of each batch */
    float *scratch;      /* [threads][scratch_floats] */
    size_t scratch_floats;
    float qscale, softcap_l2; /* fa__score_scales */
} fwd_plan;

static void fwd_task(void *arg, int64_t task, int worker) {
    const fwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t D = p->D;

    /* Which batch, KV head and query block; heavier (later) query blocks first. */
    const int64_t b = fa__task_batch(pl->task_start, p->B, task), local = task - pl->task_start[b];
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    const int64_t nqb = (sq + pl->br - 1) / pl->br;
    const int64_t hk = local / nqb, qb = nqb - 1 - local % nqb;
    const int64_t i0 = qb * pl->br, nr = sq - i0 < pl->br ? sq - i0 : pl->br;
    const int64_t R = pl->g * nr, rq = fa__row0_q(p, b), rk = fa__row0_k(p, b);
    const int64_t Rmax = pl->g * pl->br;

    float *Q = pl->scratch + (size_t)worker * pl->scratch_floats; // Q: [R, D]
    float *S = Q + fa__round_up((size_t)Rmax * D);                    // S: [R, Bc]
    float *O = S + fa__round_up((size_t)Rmax * FA_BC);                // O: [R, D]
    float *m = O + fa__round_up((size_t)Rmax * D);                    // m, l, alpha: [R]
    float *l = m + fa__round_up((size_t)Rmax);
    float *alpha = l + fa__round_up((size_t)Rmax);
    float *Kpack = alpha + fa__round_up((size_t)Rmax);                // Kᵀ: [D, Bc]
    float *Vpack = Kpack + fa__round_up((size_t)FA_BC * D);           // V: [Bc, D]
    float *tmp = Vpack + fa__round_up((size_t)FA_BC * D);             // [Bc, D]
    uint32_t *P2 = (uint32_t *)(tmp + fa__round_up((size_t)FA_BC * D)); // bf16 P: [R, Bc/2] pairs

    /* bf16 inputs on a CPU with a bf16 dot product stay bf16 in both products (Q unscaled:
     * qk_bf16 applies the scale in fp32); everything else computes in fp32. */
    const int bf16 = p->q.dtype == FA_DTYPE_BF16 && kern->qk_bf16 != NULL;
    const int64_t D2 = (D + 1) / 2;
    for (int64_t r = 0; r < R; r++) {
        const int64_t h = hk * pl->g + r / nr, i = i0 + r % nr;
        const void *src = fa__elem(&p->q, b, rq + i, h);
        if (bf16) fa__copy_bf16_row((uint16_t *)((uint32_t *)Q + r * D2), src, D, p->q.sd);
        else fa__load_f32(Q + r * D, 1, src, p->q.dtype, D, p->q.sd, pl->qscale);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(O, 0, (size_t)R * D * sizeof *O);

    /* The band of keys any row of this block can see; blocks outside it are never visited. */
    const int64_t j_begin = fa__key_lo(p, i0, off), j_end = fa__key_hi(p, i0 + nr - 1, off, sk);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += FA_BC) {
        const int64_t n = j_end - j0 < FA_BC ? j_end - j0 : FA_BC;
        if (bf16) {
            fa__pack_k_bf16(p, kern, b, rk + j0, hk, n, (uint32_t *)Kpack, (uint16_t *)tmp); // [D2, n]
            fa__pack_v_bf16(p, kern, b, rk + j0, hk, n, (uint32_t *)Vpack);                      // [n/2, D]
            kern->qk_bf16((int)R, (int)n, (int)D2, (const uint32_t *)Q, D2, (const uint32_t *)Kpack,
                          FA_BC, pl->qscale, S, FA_BC);
        } else {
            fa__kv_block(p, kern, &p->k, b, rk + j0, hk, n, 1, Kpack, tmp); // Kᵀ: [D, n]
            fa__kv_block(p, kern, &p->v, b, rk + j0, hk, n, 0, Vpack, tmp); // V: [n, D]
            kern->qk((int)R, (int)n, (int)D, Q, D, Kpack, FA_BC, S, FA_BC);
        }

        /* Only blocks that cross the band's edge for some row need the mask. */
        const int masked = fa__block_masked(p, i0, nr, j0, n, off, sk);
        for (int64_t r = 0; r < R; r++) {
            float *s = S + r * FA_BC; // s: [n]
            const int64_t i = i0 + r % nr, h = hk * pl->g + r / nr;
            fa__score_epilogue(p, pl->softcap_l2, s, n, i, j0, off, sk, b, h, masked, NULL);
            const float mx = kern->row_max((int)n, s);
            const float m_new = mx > m[r] ? mx : m[r];
            const float m_use = m_new == -INFINITY ? 0.0f : m_new; // all masked so far: P = 0
            alpha[r] = exp2f(m[r] - m_use);
            l[r] = alpha[r] * l[r] + kern->exp2_sum((int)n, s, m_use);
            m[r] = m_new;
            fa__dropout_row(p, b, h, i, j0, n, s); /* l keeps the undropped sum */
            if (bf16) kern->to_bf16((int)n, s, (uint16_t *)(P2 + r * (FA_BC / 2)));
        }
        if (bf16)
            kern->pv_bf16((int)R, (int)(n + 1) / 2, (int)D, P2, FA_BC / 2, (const uint32_t *)Vpack, D,
                          alpha, O, D);
        else
            kern->pv((int)R, (int)n, (int)D, S, FA_BC, Vpack, D, alpha, O, D);
    }

    for (int64_t r = 0; r < R; r++) {
        const int64_t h = hk * pl->g + r / nr, i = i0 + r % nr;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        fa__store_f32(fa__elem(&p->out, b, rq + i, h), p->out.dtype, O + r * D, D, p->out.sd, inv);
        if (p->lse) {
            const double lse = l[r] > 0.0f ? ((double)m[r] + log2((double)l[r])) * 0.69314718055994531 : -INFINITY;
            p->lse[b * p->lse_sb + h * p->lse_sh + (rq + i) * p->lse_ss] = (float)lse;
        }
    }
}

/* Varlen rows outside every sequence: out = 0, lse = -inf. */
static void clear_outside(const fa__problem *p) {
    const int64_t ranges[2][2] = {{0, p->cu_q[0]}, {p->cu_q[p->B], p->total_q}};
    for (int r = 0; r < 2; r++) {
        fa__zero_rows(&p->out, p->H, p->D, ranges[r][0], ranges[r][1]);
        for (int64_t s = ranges[r][0]; p->lse && s < ranges[r][1]; s++)
            for (int64_t h = 0; h < p->H; h++) p->lse[h * p->lse_sh + s * p->lse_ss] = -INFINITY;
    }
}

fa_status fa__cpu_forward(fa_context *ctx, const fa__problem *p) {
    fwd_plan pl = {.p = p, .kern = fa__cpu_kernels_get(), .g = p->H / p->Hk};
    pl.br = FA_ROWS / pl.g;
    if (pl.br < 1) pl.br = 1;
    if (pl.br > FA_BR_MAX) pl.br = FA_BR_MAX;
    fa__score_scales(p, &pl.qscale, &pl.softcap_l2);

    const int nthreads = fa__context_threads(ctx);
    const size_t rows = (size_t)(pl.g * pl.br);
    pl.scratch_floats = 2 * fa__round_up(rows * p->D) + fa__round_up(rows * FA_BC) + 3 * fa__round_up(rows) +
                        3 * fa__round_up((size_t)FA_BC * p->D) + fa__round_up(rows * FA_BC / 2);
    pl.task_start = malloc((size_t)(p->B + 1) * sizeof *pl.task_start);
    pl.scratch = aligned_alloc(64, (size_t)nthreads * pl.scratch_floats * sizeof(float));
    if (!pl.task_start || !pl.scratch) {
        free(pl.task_start);
        free(pl.scratch);
        return fa__error(FA_ERR_NO_MEMORY, "forward: cannot allocate %zu bytes of scratch",
                         (size_t)nthreads * pl.scratch_floats * sizeof(float));
    }

    pl.task_start[0] = 0;
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t nqb = (fa__seqlen_q(p, b) + pl.br - 1) / pl.br;
        pl.task_start[b + 1] = pl.task_start[b] + p->Hk * nqb;
    }
    if (p->cu_q) clear_outside(p);
    fa__context_run(ctx, pl.task_start[p->B], fwd_task, &pl);

    free(pl.task_start);
    free(pl.scratch);
    return FA_OK;
}
