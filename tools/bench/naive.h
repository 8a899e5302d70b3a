/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * naive.h — naive attention for `flashattn bench`: the textbook algorithm that materializes the
 * whole score matrix, as a framework does with `softmax(q @ k.T * scale) @ v`. It is the baseline
 * flashattn's time and memory are compared against, so it is deliberately plain: fp32 throughout,
 * the full (B, H, Sq, Sk) fp32 score tensor in memory at once (twice that for the backward: P and
 * dP), simple cache-blocked loops that the compiler vectorizes with the build's ordinary flags
 * (-O3, no -march), libm expf, the causal mask applied after computing every score. To be
 * fair-ish it runs on the same number of threads as the library, over (batch, head) pairs.
 *
 * Layout: q, k, v, out, dout, dq, dk, dv are contiguous fp32 (B, S, H, D) (flash-attn's BSHD);
 * lse is (B, H, Sq). H query heads = H KV heads. Causal is bottom-right aligned (key j visible to
 * query i iff j <= i + Sk - Sq), as in flashattn.
 */
#ifndef FA_TOOLS_NAIVE_H
#define FA_TOOLS_NAIVE_H

#include <stdint.h>

typedef struct naive_problem {
    int64_t B, H, Sq, Sk, D;
    int causal;
    float scale;  /* softmax scale, e.g. 1/sqrt(D) */
    int threads;  /* >= 1 */
} naive_problem;

/* Bytes of the materialized score tensors: B*H*Sq*Sk*4 for the forward, twice that for the
 * backward (P and dP/dS), plus the per-thread packed copies of one head's q, k, v. */
double naive_bytes_needed(const naive_problem *p, int backward);

/* out = softmax(scale * q k^T + mask) v; lse may be NULL. Returns 0, or -1 if memory could not
 * be allocated (nothing useful is written then). */
int naive_forward(const naive_problem *p, const float *q, const float *k, const float *v,
                  float *out, float *lse);

/* Gradients dq, dk, dv of the forward, given its output out and dout = dL/dout. P is recomputed
 * from q and k (as flashattn does), then dP = dout v^T, dS = P * (dP - rowsum(dout * out)),
 * dv = P^T dout, dq = scale * dS k, dk = scale * dS^T q. Returns 0, or -1 on allocation
 * failure. */
int naive_backward(const naive_problem *p, const float *q, const float *k, const float *v,
                   const float *out, const float *dout, float *dq, float *dk, float *dv);

#endif /* FA_TOOLS_NAIVE_H */
