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

#include "../convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    FA_BC = 64,       /* keys per block */
    FA_ROWS = 128,    /* target rows (query heads x positions) per task */
    FA_BR_MAX = 64,   /* most query positions per task */
    FA_ALIGN = 16     /* scratch arrays start on 64-byte boundaries (16 floats) */
};

#define FA_LOG2E 1.4426950408889634f

typedef struct fwd_plan {
    const fa__problem *p;
    const fa__cpu_kernels *kern;
    int64_t g;           /* query heads per KV head */
    int64_t br;          /* query positions per task */
    int64_t *task_start; /* [B + 1]: first task of each batch */
    float *scratch;      /* [threads][scratch_floats] */
    size_t scratch_floats;
    float qscale;       /* multiplies q: scores come out in the exp2 domain (or scaled by 1/softcap) */
    float softcap_l2;   /* softcap * log2(e), 0 = off */
} fwd_plan;

static size_t round_up(size_t n) { return (n + FA_ALIGN - 1) / FA_ALIGN * FA_ALIGN; }

/* n elements of any dtype (stride `stride`) into fp32 times `scale` at dst[t * ld]. */
static void load_f32(float *dst, int64_t ld, const void *src, int32_t dtype, int64_t n,
                     int64_t stride, float scale) {
    if (dtype == FA_DTYPE_F32) {
        const float *s = src;
        for (int64_t t = 0; t < n; t++) dst[t * ld] = s[t * stride] * scale;
    } else if (dtype == FA_DTYPE_F16) {
        const uint16_t *s = src;
        for (int64_t t = 0; t < n; t++) dst[t * ld] = fa__f16_to_f32(s[t * stride]) * scale;
    } else {
        const uint16_t *s = src;
        for (int64_t t = 0; t < n; t++) dst[t * ld] = fa__bf16_to_f32(s[t * stride]) * scale;
    }
}

/* One fp32 row times `scale` into n elements of any dtype with stride `stride`. */
static void store_row(void *dst, int32_t dtype, const float *src, int64_t n, int64_t stride,
                      float scale) {
    if (dtype == FA_DTYPE_F32) {
        float *d = dst;
        for (int64_t t = 0; t < n; t++) d[t * stride] = src[t] * scale;
    } else if (dtype == FA_DTYPE_F16) {
        uint16_t *d = dst;
        for (int64_t t = 0; t < n; t++) d[t * stride] = fa__f32_to_f16(src[t] * scale);
    } else {
        uint16_t *d = dst;
        for (int64_t t = 0; t < n; t++) d[t * stride] = fa__f32_to_bf16(src[t] * scale);
    }
}

static void *elem(const fa__view *x, int64_t b, int64_t s, int64_t h) {
    return (char *)x->data + (b * x->sb + s * x->ss + h * x->sh) * fa__dtype_size(x->dtype);
}

/* Keys [key_lo, key_hi) are visible to query i of a batch with key offset off = Sk - Sq. */
static int64_t key_lo(const fa__problem *p, int64_t i, int64_t off) {
    if (p->window_left < 0) return 0;
    int64_t lo = i + off - p->window_left;
    return lo > 0 ? lo : 0;
}

static int64_t key_hi(const fa__problem *p, int64_t i, int64_t off, int64_t sk) {
    if (p->window_right < 0) return sk;
    int64_t hi = i + off + p->window_right + 1;
    return hi < sk ? hi : sk;
}

/* n keys (or values) of KV head hk from row `row0` as fp32: rows [n, D] (ld = D) when
 * transposed == 0, else Kᵀ [D, n] (ld = FA_BC). fp32 rows with unit stride are used in place. */
static const float *kv_block(const fa__problem *p, const fa__view *x, int64_t b, int64_t row0,
                             int64_t hk, int64_t n, int transposed, float *pack, int64_t *ld) {
    if (!transposed && x->dtype == FA_DTYPE_F32 && x->sd == 1) {
        *ld = x->ss;
        return elem(x, b, row0, hk);
    }
    if (!transposed) {
        for (int64_t j = 0; j < n; j++)
            load_f32(pack + j * p->D, 1, elem(x, b, row0 + j, hk), x->dtype, p->D, x->sd, 1.0f);
        *ld = p->D;
        return pack;
    }
    for (int64_t j = 0; j < n; j++) /* a column of Kᵀ per key */
        load_f32(pack + j, FA_BC, elem(x, b, row0 + j, hk), x->dtype, p->D, x->sd, 1.0f);
    *ld = FA_BC;
    return pack;
}

/* Softcap, ALiBi and the band mask on one row of scores s[0..n) for query i, keys j0.. */
static void score_epilogue(const fwd_plan *pl, float *s, int64_t n, int64_t i, int64_t j0,
                           int64_t off, int64_t sk, int64_t b, int64_t h, int masked) {
    const fa__problem *p = pl->p;
    if (pl->softcap_l2 != 0.0f)
        for (int64_t j = 0; j < n; j++) s[j] = pl->softcap_l2 * tanhf(s[j]);
    if (p->alibi) {
        const float slope = p->alibi[b * p->alibi_sb + h * p->alibi_sh] * FA_LOG2E;
        for (int64_t j = 0; j < n; j++) s[j] -= slope * fabsf((float)(i + off - (j0 + j)));
    }
    if (masked) {
        const int64_t lo = key_lo(p, i, off), hi = key_hi(p, i, off, sk);
        for (int64_t j = 0; j < n; j++)
            if (j0 + j < lo || j0 + j >= hi) s[j] = -INFINITY;
    }
}

static void fwd_task(void *arg, int64_t task, int worker) {
    const fwd_plan *pl = arg;
    const fa__problem *p = pl->p;
    const fa__cpu_kernels *kern = pl->kern;
    const int64_t D = p->D;

    /* Which batch, KV head and query block; heavier (later) query blocks first. */
    int64_t lo = 0, hi = p->B;
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (pl->task_start[mid] <= task) lo = mid; else hi = mid;
    }
    const int64_t b = lo, local = task - pl->task_start[b];
    const int64_t sq = fa__seqlen_q(p, b), sk = fa__seqlen_k(p, b), off = sk - sq;
    const int64_t nqb = (sq + pl->br - 1) / pl->br;
    const int64_t hk = local / nqb, qb = nqb - 1 - local % nqb;
    const int64_t i0 = qb * pl->br, nr = sq - i0 < pl->br ? sq - i0 : pl->br;
    const int64_t R = pl->g * nr, rq = fa__row0_q(p, b), rk = fa__row0_k(p, b);
    const int64_t Rmax = pl->g * pl->br;

    float *Q = pl->scratch + (size_t)worker * pl->scratch_floats; // Q: [R, D]
    float *S = Q + round_up((size_t)Rmax * D);                    // S: [R, Bc]
    float *O = S + round_up((size_t)Rmax * FA_BC);                // O: [R, D]
    float *m = O + round_up((size_t)Rmax * D);                    // m, l, alpha: [R]
    float *l = m + round_up((size_t)Rmax);
    float *alpha = l + round_up((size_t)Rmax);
    float *Kpack = alpha + round_up((size_t)Rmax);                // K: [Bc, D]
    float *Vpack = Kpack + round_up((size_t)FA_BC * D);           // V: [Bc, D]

    for (int64_t r = 0; r < R; r++) {
        const int64_t h = hk * pl->g + r / nr, i = i0 + r % nr;
        load_f32(Q + r * D, 1, elem(&p->q, b, rq + i, h), p->q.dtype, D, p->q.sd, pl->qscale);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(O, 0, (size_t)R * D * sizeof *O);

    /* The band of keys any row of this block can see; blocks outside it are never visited. */
    const int64_t j_begin = key_lo(p, i0, off), j_end = key_hi(p, i0 + nr - 1, off, sk);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += FA_BC) {
        const int64_t n = j_end - j0 < FA_BC ? j_end - j0 : FA_BC;
        int64_t ldk, ldv;
        const float *Kt = kv_block(p, &p->k, b, rk + j0, hk, n, 1, Kpack, &ldk); // Kt: [D, n]
        const float *V = kv_block(p, &p->v, b, rk + j0, hk, n, 0, Vpack, &ldv);  // V: [n, D]
        kern->qk((int)R, (int)n, (int)D, Q, D, Kt, ldk, S, FA_BC);

        /* Only blocks that cross the band's edge for some row need the mask. */
        const int masked = j0 < key_lo(p, i0 + nr - 1, off) || j0 + n > key_hi(p, i0, off, sk);
        for (int64_t r = 0; r < R; r++) {
            float *s = S + r * FA_BC; // s: [n]
            score_epilogue(pl, s, n, i0 + r % nr, j0, off, sk, b, hk * pl->g + r / nr, masked);
            const float mx = kern->row_max((int)n, s);
            const float m_new = mx > m[r] ? mx : m[r];
            const float m_use = m_new == -INFINITY ? 0.0f : m_new; // all masked so far: P = 0
            alpha[r] = exp2f(m[r] - m_use);
            l[r] = alpha[r] * l[r] + kern->exp2_sum((int)n, s, m_use);
            m[r] = m_new;
        }
        kern->pv((int)R, (int)n, (int)D, S, FA_BC, V, ldv, alpha, O, D);
    }

    for (int64_t r = 0; r < R; r++) {
        const int64_t h = hk * pl->g + r / nr, i = i0 + r % nr;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        store_row(elem(&p->out, b, rq + i, h), p->out.dtype, O + r * D, D, p->out.sd, inv);
        if (p->lse) {
            const double lse = l[r] > 0.0f ? ((double)m[r] + log2((double)l[r])) * 0.69314718055994531 : -INFINITY;
            p->lse[b * p->lse_sb + h * p->lse_sh + (rq + i) * p->lse_ss] = (float)lse;
        }
    }
}

/* Varlen rows before the first and after the last sequence belong to no batch: 0 and -inf. */
static void clear_rows(const fa__problem *p, int64_t row_begin, int64_t row_end) {
    for (int64_t s = row_begin; s < row_end; s++)
        for (int64_t h = 0; h < p->H; h++) {
            char *o = elem(&p->out, 0, s, h);
            const int size = fa__dtype_size(p->out.dtype);
            for (int64_t t = 0; t < p->D; t++) memset(o + t * p->out.sd * size, 0, (size_t)size);
            if (p->lse) p->lse[h * p->lse_sh + s * p->lse_ss] = -INFINITY;
        }
}

fa_status fa__cpu_forward(fa_context *ctx, const fa__problem *p) {
    fwd_plan pl = {.p = p, .kern = fa__cpu_kernels_get(), .g = p->H / p->Hk};
    pl.br = FA_ROWS / pl.g;
    if (pl.br < 1) pl.br = 1;
    if (pl.br > FA_BR_MAX) pl.br = FA_BR_MAX;
    if (p->softcap > 0.0f) {
        pl.qscale = p->scale / p->softcap;
        pl.softcap_l2 = p->softcap * FA_LOG2E;
    } else {
        pl.qscale = p->scale * FA_LOG2E;
    }

    const int nthreads = fa__context_threads(ctx);
    const size_t rows = (size_t)(pl.g * pl.br);
    pl.scratch_floats = 2 * round_up(rows * p->D) + round_up(rows * FA_BC) + 3 * round_up(rows) +
                        2 * round_up((size_t)FA_BC * p->D);
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
    if (p->cu_q) {
        clear_rows(p, 0, p->cu_q[0]);
        clear_rows(p, p->cu_q[p->B], p->total_q);
    }
    fa__context_run(ctx, pl.task_start[p->B], fwd_task, &pl);

    free(pl.task_start);
    free(pl.scratch);
    return FA_OK;
}
