/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * naive.c — naive (materialized) attention for `flashattn bench`; see naive.h.
 *
 * Each (batch, head) pair is one task; threads take tasks from an atomic counter. A task packs
 * its head's q, k, v into contiguous per-thread buffers (k and v also transposed, so every inner
 * loop is a unit-stride "row += a * row" that the compiler vectorizes without -ffast-math), then
 * runs three plain matrix products blocked for the caches (inner loops unrolled by 4 in the
 * summed dimension, nothing more), writing the scores into that head's
 * slice of the one (B, H, Sq, Sk) tensor allocated for the call.
 */
#define _POSIX_C_SOURCE 200809L

#include "naive.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BLK_I 32   /* rows of the left operand per block */
#define BLK_J 512  /* columns of a score block (k^T block: D x 512 floats, <= 512 KiB at D=256) */
#define BLK_V 128  /* rows of v (or of the dk/dv accumulator) per block: <= 128 KiB at D=256 */

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* ---- the three products ---------------------------------------------------------------------- */

/* C (M x N, row stride ldc) = A (M x D) . Bt (D x N), i.e. A times B^T where Bt = B^T. The
 * d loop is unrolled by 4 (four rows of Bt per pass over a row of C) to cut loads and stores. */
static void mm_a_bt(const float *restrict A, const float *restrict Bt, float *restrict C, int64_t M,
                    int64_t N, int64_t D, int64_t ldc) {
    int64_t i0, j0, i, j, d;
    for (i0 = 0; i0 < M; i0 += BLK_I) {
        const int64_t i1 = min64(i0 + BLK_I, M);
        for (j0 = 0; j0 < N; j0 += BLK_J) {
            const int64_t nj = min64(BLK_J, N - j0);
            for (i = i0; i < i1; i++) {
                float *restrict c = C + i * ldc + j0;
                const float *restrict a = A + i * D;
                for (j = 0; j < nj; j++)
                    c[j] = 0.0f;
                for (d = 0; d + 4 <= D; d += 4) {
                    const float a0 = a[d], a1 = a[d + 1], a2 = a[d + 2], a3 = a[d + 3];
                    const float *restrict b0 = Bt + d * N + j0;
                    const float *restrict b1 = b0 + N, *restrict b2 = b1 + N, *restrict b3 = b2 + N;
                    for (j = 0; j < nj; j++)
                        c[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
                }
                for (; d < D; d++) {
                    const float ad = a[d];
                    const float *restrict b = Bt + d * N + j0;
                    for (j = 0; j < nj; j++)
                        c[j] += ad * b[j];
                }
            }
        }
    }
}

/* O (M x D) = P (M x N, row stride ldp) . V (N x D). */
static void mm_p_v(const float *restrict P, const float *restrict V, float *restrict O, int64_t M,
                   int64_t N, int64_t D, int64_t ldp) {
    int64_t i0, j0, i, j, d;
    for (i0 = 0; i0 < M; i0 += BLK_I) {
        const int64_t i1 = min64(i0 + BLK_I, M);
        memset(O + i0 * D, 0, (size_t)((i1 - i0) * D) * sizeof(float));
        for (j0 = 0; j0 < N; j0 += BLK_V) {
            const int64_t j1 = min64(j0 + BLK_V, N);
            for (i = i0; i < i1; i++) {
                float *restrict o = O + i * D;
                const float *restrict p = P + i * ldp;
                for (j = j0; j + 4 <= j1; j += 4) { /* four rows of V per pass over o */
                    const float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
                    const float *restrict v0 = V + j * D;
                    const float *restrict v1 = v0 + D, *restrict v2 = v1 + D, *restrict v3 = v2 + D;
                    for (d = 0; d < D; d++)
                        o[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
                }
                for (; j < j1; j++) {
                    const float pj = p[j];
                    const float *restrict vr = V + j * D;
                    for (d = 0; d < D; d++)
                        o[d] += pj * vr[d];
                }
            }
        }
    }
}

/* O (N x D) = P^T . X, with P (M x N, row stride ldp) and X (M x D). */
static void mm_pt_x(const float *restrict P, const float *restrict X, float *restrict O, int64_t M,
                    int64_t N, int64_t D, int64_t ldp) {
    int64_t i, j0, j, d;
    memset(O, 0, (size_t)(N * D) * sizeof(float));
    for (j0 = 0; j0 < N; j0 += BLK_V) {
        const int64_t j1 = min64(j0 + BLK_V, N);
        for (i = 0; i + 4 <= M; i += 4) { /* four rows of P and X per pass over o */
            const float *restrict p0 = P + i * ldp;
            const float *restrict p1 = p0 + ldp, *restrict p2 = p1 + ldp, *restrict p3 = p2 + ldp;
            const float *restrict x0 = X + i * D;
            const float *restrict x1 = x0 + D, *restrict x2 = x1 + D, *restrict x3 = x2 + D;
            for (j = j0; j < j1; j++) {
                const float q0 = p0[j], q1 = p1[j], q2 = p2[j], q3 = p3[j];
                float *restrict o = O + j * D;
                for (d = 0; d < D; d++)
                    o[d] += q0 * x0[d] + q1 * x1[d] + q2 * x2[d] + q3 * x3[d];
            }
        }
        for (; i < M; i++) {
            const float *restrict p = P + i * ldp;
            const float *restrict x = X + i * D;
            for (j = j0; j < j1; j++) {
                const float pj = p[j];
                float *restrict o = O + j * D;
                for (d = 0; d < D; d++)
                    o[d] += pj * x[d];
            }
        }
    }
}

/* Row i of the scores (Sk long): causal mask (after the fact), then softmax in place. Returns
 * the row's natural-log logsumexp (-inf for a fully masked row, whose probabilities are 0). */
static float softmax_row(float *row, int64_t i, int64_t Sq, int64_t Sk, int causal) {
    int64_t j, last = Sk - 1;
    float m = -INFINITY, sum = 0.0f, inv;
    if (causal) {
        last = i + Sk - Sq;
        for (j = last + 1 < 0 ? 0 : last + 1; j < Sk; j++)
            row[j] = -INFINITY;
    }
    for (j = 0; j < Sk; j++)
        m = row[j] > m ? row[j] : m;
    if (m == -INFINITY) {
        memset(row, 0, (size_t)Sk * sizeof(float));
        return -INFINITY;
    }
    for (j = 0; j < Sk; j++) {
        const float e = expf(row[j] - m);
        row[j] = e;
        sum += e;
    }
    inv = 1.0f / sum;
    for (j = 0; j < Sk; j++)
        row[j] *= inv;
    return m + logf(sum);
}

/* ---- threads --------------------------------------------------------------------------------- */

typedef struct naive_job {
    const naive_problem *p;
    const float *q, *k, *v, *out, *dout;
    float *o, *lse, *dq, *dk, *dv;
    float *scores, *dscores; /* (B, H, Sq, Sk) */
    int backward;
    atomic_long next;
    atomic_int failed;
} naive_job;

/* Copies head (b, h) of a BSHD tensor with S rows into dst (S x D); times scale. */
static void pack_rows(float *dst, const float *src, const naive_problem *p, int64_t S, int64_t b,
                      int64_t h, float scale) {
    int64_t s, d;
    for (s = 0; s < S; s++) {
        const float *r = src + ((b * S + s) * p->H + h) * p->D;
        for (d = 0; d < p->D; d++)
            dst[s * p->D + d] = r[d] * scale;
    }
}

/* Copies head (b, h) of a BSHD tensor with S rows into dst transposed (D x S). */
static void pack_cols(float *dst, const float *src, const naive_problem *p, int64_t S, int64_t b,
                      int64_t h) {
    int64_t s, d;
    for (s = 0; s < S; s++) {
        const float *r = src + ((b * S + s) * p->H + h) * p->D;
        for (d = 0; d < p->D; d++)
            dst[d * S + s] = r[d];
    }
}

/* Writes dst (S x D) into head (b, h) of a BSHD tensor; times scale. */
static void unpack_rows(float *dst, const float *src, const naive_problem *p, int64_t S, int64_t b,
                        int64_t h, float scale) {
    int64_t s, d;
    for (s = 0; s < S; s++) {
        float *r = dst + ((b * S + s) * p->H + h) * p->D;
        for (d = 0; d < p->D; d++)
            r[d] = src[s * p->D + d] * scale;
    }
}

static void *naive_worker(void *arg) {
    naive_job *job = arg;
    const naive_problem *p = job->p;
    const int64_t Sq = p->Sq, Sk = p->Sk, D = p->D, ntasks = p->B * p->H;
    const int64_t S = Sq > Sk ? Sq : Sk;
    /* Per-thread scratch, first touched by its owner: 7 buffers of S x D (the forward uses 3). */
    const int nbuf = job->backward ? 7 : 3;
    float *buf = malloc((size_t)nbuf * (size_t)(S * D) * sizeof(float) + (size_t)Sq * sizeof(float));
    if (!buf) {
        atomic_store(&job->failed, 1);
        return NULL;
    }
    for (;;) {
        const long t = atomic_fetch_add(&job->next, 1);
        int64_t b, h, i;
        float *sc;
        if (t >= ntasks || atomic_load(&job->failed))
            break;
        b = t / p->H;
        h = t % p->H;
        sc = job->scores + (size_t)t * (size_t)(Sq * Sk);
        if (!job->backward) {
            float *qh = buf, *kt = buf + S * D, *vh = buf + 2 * S * D;
            pack_rows(qh, job->q, p, Sq, b, h, p->scale);
            pack_cols(kt, job->k, p, Sk, b, h);
            pack_rows(vh, job->v, p, Sk, b, h, 1.0f);
            mm_a_bt(qh, kt, sc, Sq, Sk, D, Sk); /* S = scale q k^T */
            for (i = 0; i < Sq; i++) {
                const float l = softmax_row(sc + i * Sk, i, Sq, Sk, p->causal);
                if (job->lse)
                    job->lse[(b * p->H + h) * Sq + i] = l;
            }
            mm_p_v(sc, vh, qh, Sq, Sk, D, Sk); /* O = P v, into qh (free now) */
            unpack_rows(job->o, qh, p, Sq, b, h, 1.0f);
        } else {
            float *qh = buf, *kh = buf + S * D, *kt = buf + 2 * S * D, *vt = buf + 3 * S * D;
            float *doh = buf + 4 * S * D, *x = buf + 5 * S * D, *y = buf + 6 * S * D;
            float *di = buf + 7 * S * D, *ds = job->dscores + (size_t)t * (size_t)(Sq * Sk);
            int64_t j, d;
            pack_rows(qh, job->q, p, Sq, b, h, p->scale);
            pack_cols(kt, job->k, p, Sk, b, h);
            pack_cols(vt, job->v, p, Sk, b, h);
            pack_rows(doh, job->dout, p, Sq, b, h, 1.0f);
            pack_rows(x, job->out, p, Sq, b, h, 1.0f);
            /* P, recomputed */
            mm_a_bt(qh, kt, sc, Sq, Sk, D, Sk);
            for (i = 0; i < Sq; i++)
                softmax_row(sc + i * Sk, i, Sq, Sk, p->causal);
            /* Di = rowsum(dout * out) */
            for (i = 0; i < Sq; i++) {
                float s = 0.0f;
                for (d = 0; d < D; d++)
                    s += doh[i * D + d] * x[i * D + d];
                di[i] = s;
            }
            /* dv = P^T dout */
            mm_pt_x(sc, doh, y, Sq, Sk, D, Sk);
            unpack_rows(job->dv, y, p, Sk, b, h, 1.0f);
            /* dP = dout v^T, then dS = P * (dP - Di) in place */
            mm_a_bt(doh, vt, ds, Sq, Sk, D, Sk);
            for (i = 0; i < Sq; i++) {
                float *dsr = ds + i * Sk;
                const float *pr = sc + i * Sk;
                const float dii = di[i];
                for (j = 0; j < Sk; j++)
                    dsr[j] = pr[j] * (dsr[j] - dii);
            }
            /* dq = scale * dS k */
            pack_rows(kh, job->k, p, Sk, b, h, 1.0f);
            mm_p_v(ds, kh, x, Sq, Sk, D, Sk);
            unpack_rows(job->dq, x, p, Sq, b, h, p->scale);
            /* dk = scale * dS^T q (qh holds scale * q already) */
            mm_pt_x(ds, qh, y, Sq, Sk, D, Sk);
            unpack_rows(job->dk, y, p, Sk, b, h, 1.0f);
        }
    }
    free(buf);
    return NULL;
}

/* Runs the job on p->threads threads (the caller is one of them). */
static int naive_run(naive_job *job) {
    const naive_problem *p = job->p;
    const size_t n = (size_t)(p->B * p->H) * (size_t)(p->Sq * p->Sk);
    pthread_t tid[1024];
    int nthreads = p->threads < 1 ? 1 : p->threads > 1024 ? 1024 : p->threads, started = 0, i;

    job->scores = malloc(n * sizeof(float) + 1);
    job->dscores = job->backward ? malloc(n * sizeof(float) + 1) : NULL;
    if (!job->scores || (job->backward && !job->dscores)) {
        free(job->scores);
        free(job->dscores);
        return -1;
    }
    atomic_init(&job->next, 0);
    atomic_init(&job->failed, 0);
    for (i = 1; i < nthreads; i++) {
        if (pthread_create(&tid[started], NULL, naive_worker, job) != 0)
            break; /* fewer threads is still correct */
        started++;
    }
    naive_worker(job);
    for (i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    free(job->scores);
    free(job->dscores);
    return atomic_load(&job->failed) ? -1 : 0;
}

double naive_bytes_needed(const naive_problem *p, int backward) {
    const double scores = (double)p->B * (double)p->H * (double)p->Sq * (double)p->Sk * 4.0;
    const double S = (double)(p->Sq > p->Sk ? p->Sq : p->Sk);
    const double scratch = (double)p->threads * ((backward ? 7.0 : 3.0) * S * (double)p->D + S) * 4.0;
    return (backward ? 2.0 : 1.0) * scores + scratch;
}

int naive_forward(const naive_problem *p, const float *q, const float *k, const float *v,
                  float *out, float *lse) {
    naive_job job;
    memset(&job, 0, sizeof job);
    job.p = p;
    job.q = q;
    job.k = k;
    job.v = v;
    job.o = out;
    job.lse = lse;
    return naive_run(&job);
}

int naive_backward(const naive_problem *p, const float *q, const float *k, const float *v,
                   const float *out, const float *dout, float *dq, float *dk, float *dv) {
    naive_job job;
    memset(&job, 0, sizeof job);
    job.p = p;
    job.q = q;
    job.k = k;
    job.v = v;
    job.out = out;
    job.dout = dout;
    job.dq = dq;
    job.dk = dk;
    job.dv = dv;
    job.backward = 1;
    return naive_run(&job);
}
