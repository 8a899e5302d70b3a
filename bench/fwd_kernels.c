/* SPDX-License-Identifier: MIT */
/*
 * fwd_kernels.c — the fp32 forward's work on one block of keys, timed alone with every operand
 * in cache, against the FMA peak probed in the same run: the most the forward's design can reach
 * on this machine, with memory, masks and scheduling taken out, and the share each step takes.
 *
 * One block as fwd.c runs it on a non-causal task (FA_ROWS = 252 query rows, FA_BC = 128 keys,
 * head dim D): K's rows are packed transposed (transpose), S = Q Kᵀ (qk) in chunks of about 24
 * rows (whole register tiles), each chunk's rows then getting their max and P = 2^(S - max)
 * with its sum (softmax_rows), and O = diag(alpha) O + P V (pv) with V read
 * in place as BSHD rows H·D floats apart where the kernel set allows it (fa__rows_in_place), else
 * from a packed copy; packs have the forward's row strides (fa__packed_ld). The forward packs a
 * key once per thread and head (its head packs), so "pack K" costs it far less than a block's. K and V are [FA_BC keys, H = 16 heads, D] like a BSHD tensor, so their rows
 * lie as far apart as in `flashattn bench`'s B=1, H=16 runs; one head's block is 64 or 128 KiB
 * and stays in L2. Each thread works on its own copies.
 *
 * Per D and step it prints the median of 5 timings (about 0.2 s each) in µs per block, the rate
 * in flash-attn's FLOP convention (2·rows·keys·D for each of qk and pv, so the other steps read 0)
 * and the % of the peak that `flashattn bench` probes (peak.c), measured here on the same thread count.
 * "step" runs all four in sequence, as the forward does: its % is the in-cache ceiling of the
 * whole forward at that D, and qk+pv's the ceiling of its two GEMMs alone.
 *
 * Uses the library's internal kernel table, so it links the static library:
 *   cmake --build build --target bench_fwd_kernels && build/bench_fwd_kernels [threads]
 * FA_CPU_ISA picks the kernel set, as for the library.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/cpu/cpu.h"
#include "../src/cpu/tile.h"
#include "../tools/bench/peak.h"

enum { ROWS = 252, H = 16, REPS = 5, MAX_THREADS = 64 };
enum { STEP_PACK = 1, STEP_QK = 2, STEP_SOFTMAX = 4, STEP_PV = 8, STEP_ALL = 15 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One thread's operands for one block at head dim d. */
typedef struct block {
    const fa__cpu_kernels *kern;
    int d, steps, v_in_place;
    long blocks; /* blocks per timing */
    float *k, *v; // K, V: [FA_BC, H, d] (head 0 is used)
    float *kt;    // Kᵀ: [d, FA_BC]
    float *vp;    // V packed: [FA_BC, d]
    float *q;     // Q: [ROWS, d]
    float *s;     // S: [ROWS, FA_BC]
    float *o;     // O: [ROWS, d]
    float *alpha; // alpha: [ROWS]
    float *m;     // m, sum: [ROWS], the softmax's max and sum per row
    float *sum;
    pthread_barrier_t *start;
    double seconds;
} block;

static float *floats(size_t n, float scale, unsigned seed) {
    float *x = aligned_alloc(64, fa__round_up(n) * sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_fwd_kernels: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)((i * 2654435761u + seed) % 997) / 997.0f;
    return x;
}

static void block_init(block *w, const fa__cpu_kernels *kern, int d, unsigned seed) {
    memset(w, 0, sizeof *w);
    w->kern = kern;
    w->d = d;
    w->v_in_place = !kern->pv_packed_b;
    w->k = floats((size_t)FA_BC * H * d, 1.0f, seed);
    w->v = floats((size_t)FA_BC * H * d, 1.0f, seed + 1);
    w->kt = floats((size_t)d * fa__packed_ld(FA_BC), 0.0f, 0);
    w->vp = floats((size_t)FA_BC * fa__packed_ld(d), 0.0f, 0);
    w->q = floats((size_t)ROWS * d, 0.1f, seed + 2);
    w->s = floats((size_t)ROWS * FA_BC, 0.0f, 0);
    w->o = floats((size_t)ROWS * d, 0.0f, 0);
    w->alpha = floats(ROWS, 0.0f, 0);
    for (int r = 0; r < ROWS; r++) w->alpha[r] = 1.0f;
    w->m = floats(ROWS, 0.0f, 0);
    w->sum = floats(ROWS, 0.0f, 0);
}

static void block_free(block *w) {
    free(w->k), free(w->v), free(w->kt), free(w->vp), free(w->q), free(w->s), free(w->o);
    free(w->alpha), free(w->m), free(w->sum);
}

/* The steps of one block, as fwd.c's run_rows takes them. */
static void run_block(block *w) {
    const fa__cpu_kernels *kern = w->kern;
    const int d = w->d;
    const int64_t ld = (int64_t)H * d; /* BSHD: a key's heads side by side */
    if (w->steps & STEP_PACK) {
        kern->transpose(FA_BC, d, w->k, ld, w->kt, fa__packed_ld(FA_BC));
        if (!w->v_in_place)
            for (int j = 0; j < FA_BC; j++) memcpy(w->vp + j * fa__packed_ld(d), w->v + j * ld, sizeof(float) * d);
    }
    /* S a chunk of rows at a time, each chunk's softmax after its qk, as fwd.c does */
    const int qr = (int)fa__qk_chunk_rows(kern);
    for (int r0 = 0; r0 < ROWS; r0 += qr) {
        const int rows = ROWS - r0 < qr ? ROWS - r0 : qr;
        float *s = w->s + r0 * FA_BC;
        if (w->steps & STEP_QK)
            kern->qk(rows, FA_BC, d, w->q + r0 * d, d, w->kt, fa__packed_ld(FA_BC), s, FA_BC);
        if (w->steps & STEP_SOFTMAX) { /* alpha stays 1: the forward's exp2f(m - m_new) per row */
            for (int r = r0; r < r0 + rows; r++) w->m[r] = -INFINITY;
            kern->softmax_rows(rows, FA_BC, s, FA_BC, w->m + r0, w->sum + r0);
        }
    }
    if (w->steps & STEP_PV) {
        const float *v = w->v_in_place ? w->v : w->vp;
        kern->pv(ROWS, FA_BC, d, w->s, FA_BC, v, w->v_in_place ? ld : fa__packed_ld(d), w->alpha, w->o, d);
    }
}

static void *timed_blocks(void *arg) {
    block *w = arg;
    pthread_barrier_wait(w->start);
    const double t0 = now();
    for (long i = 0; i < w->blocks; i++) run_block(w);
    w->seconds = now() - t0;
    return NULL;
}

/* Median over REPS timings of `steps` on every thread at once: seconds per block (the slowest
 * thread's time over its blocks). */
static double time_steps(block *w, int threads, int steps) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) w[t].steps = steps, w[t].start = &start, w[t].blocks = 1;
    /* blocks per timing: about 0.2 s, from one untimed block on the first thread */
    const double t0 = now();
    for (int i = 0; i < 3; i++) run_block(&w[0]);
    const double one = (now() - t0) / 3;
    const long blocks = one > 0 ? (long)(0.2 / one) + 1 : 1000;
    double per[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        pthread_t tid[MAX_THREADS];
        for (int t = 0; t < threads; t++) {
            w[t].blocks = blocks;
            if (pthread_create(&tid[t], NULL, timed_blocks, &w[t]) != 0) {
                fprintf(stderr, "bench_fwd_kernels: pthread_create failed\n");
                exit(1);
            }
        }
        double worst = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            worst = w[t].seconds > worst ? w[t].seconds : worst;
        }
        per[rep] = worst / (double)blocks;
    }
    pthread_barrier_destroy(&start);
    for (int i = 1; i < REPS; i++) /* median: sort the few timings */
        for (int j = i; j > 0 && per[j] < per[j - 1]; j--) {
            const double x = per[j];
            per[j] = per[j - 1], per[j - 1] = x;
        }
    return per[REPS / 2];
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2 || threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "usage: bench_fwd_kernels [threads, 1..%d, default 1]\n", MAX_THREADS);
        return 2;
    }
    const fa__cpu_kernels *kern = fa__cpu_kernels_get();
    peak_result peak;
    peak_measure_fp32(threads, 5, 0.12, &peak);
    printf("forward block alone, in cache: kernel set \"%s\", %d thread(s), %d rows x %d keys, "
           "K/V rows %d heads apart\n", kern->name, threads, ROWS, FA_BC, H);
    printf("peak fp32: %.1f GFLOP/s (%s, median of %d; %.1f-%.1f)\n", peak.gflops, peak.kernel,
           peak.reps, peak.gflops_min, peak.gflops_max);
    printf("%-4s %-10s %10s %9s %7s\n", "D", "step", "us/block", "GFLOP/s", "%peak");
    static const struct {
        const char *name;
        int steps;
    } rows[] = {{"pack K", STEP_PACK}, {"qk", STEP_QK},         {"softmax", STEP_SOFTMAX},
                {"pv", STEP_PV},       {"qk+pv", STEP_QK | STEP_PV}, {"step", STEP_ALL}};
    static const int dims[] = {64, 128};
    block w[MAX_THREADS];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int d = dims[di];
        for (int t = 0; t < threads; t++) block_init(&w[t], kern, d, 17u * (unsigned)t + 1u);
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            const int st = rows[i].steps;
            const double sec = time_steps(w, threads, st);
            /* each GEMM's 2·rows·keys·D, on every thread */
            const double flop = 2.0 * ROWS * FA_BC * d * threads *
                                ((st & STEP_QK ? 1 : 0) + (st & STEP_PV ? 1 : 0));
            const double rate = flop / sec * 1e-9;
            printf("%-4d %-10s %10.2f %9.1f %6.1f%%\n", d, rows[i].name, sec * 1e6, rate,
                   100.0 * rate / peak.gflops);
        }
        for (int t = 0; t < threads; t++) block_free(&w[t]);
    }
    peak_result again;
    peak_measure_fp32(threads, 5, 0.12, &again);
    printf("peak fp32 again: %.1f GFLOP/s (%.1f-%.1f)\n", again.gflops, again.gflops_min,
           again.gflops_max);
    return 0;
}
