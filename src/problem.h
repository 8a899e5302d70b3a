/* SPDX-License-Identifier: MIT */
/*
 * problem.h — one attention call after validation: sizes, strided views and the resolved
 * parameters, in a form every backend reads. Fixed-length and varlen calls share it: a batch b
 * starts at row row0(b) of its tensors and has its own Sq/Sk.
 */
#ifndef FA_PROBLEM_H
#define FA_PROBLEM_H

#include "hd.h"

#include <stdint.h>

/* A validated strided view: element (b, s, h, d) is at data + b*sb + s*ss + h*sh + d*sd.
 * KV caches add indirections (all NULL for plain tensors), applied in this order:
 *   row_off:     row s of batch b is row row_off[b] + s (cache_leftpad)
 *   block_table: paged; row r of batch b is row r % page of page block_table[b*bt_stride + r/page]
 *                (the page is the first dimension)
 *   batch_idx:   otherwise batch b is entry batch_idx[b] of the first dimension */
typedef struct fa__view {
    void *data;
    int32_t dtype;
    int64_t sb, ss, sh, sd;
    const int32_t *row_off, *block_table, *batch_idx;
    int64_t bt_stride, page;
    /* 8-bit KV caches (dtype i8, f8_e4m3, f8_e5m2; CPU only): row (b, s, h)'s value is its
     * stored values times the fp32 at scale->data + fa__view_at(scale, b, s, h) floats (a view
     * with its own indirections: a per-token scale shares the cache's, a per-(batch, head) one
     * has none and ss = 0). NULL otherwise. */
    const struct fa__view *scale;
} fa__view;

/* Offset in elements of element (b, s, h, 0) of x, through its KV-cache indirections (none for
 * plain tensors). Host and device code: the CPU and the CUDA plug-in address caches alike. */
FA_HD int64_t fa__view_at(const fa__view *x, int64_t b, int64_t s, int64_t h) {
    if (x->row_off) s += x->row_off[b];
    int64_t first = x->batch_idx ? x->batch_idx[b] : b; /* index into the first dimension */
    if (x->block_table) {
        first = x->block_table[b * x->bt_stride + s / x->page];
        s %= x->page;
    }
    return first * x->sb + s * x->ss + h * x->sh;
}

/* The scale of row (b, s, h) of x: 1 unless x is an 8-bit cache. */
static inline float fa__row_scale(const fa__view *x, int64_t b, int64_t s, int64_t h) {
    return x->scale ? ((const float *)x->scale->data)[fa__view_at(x->scale, b, s, h)] : 1.0f;
}

typedef struct fa__problem {
    /* D: head dim of q and k (and dq, dk); Dv: head dim of v and out (and dout, dv), D or not */
    int64_t B, H, Hk, D, Dv;
    /* Fixed length: every batch has Sq queries and Sk keys and cu_q == cu_k == NULL.
     * Varlen: batch b has rows [cu_q[b], cu_q[b+1]) and keys [cu_k[b], cu_k[b+1]);
     * the views' sb is 0 and total_q, total_k are the rows of q and k. */
    int64_t Sq, Sk;
    const int32_t *cu_q, *cu_k;
    int64_t total_q, total_k;
    /* KV cache: batch b has seqlens_k[b] keys (overrides Sk; NULL otherwise). */
    const int32_t *seqlens_k;

    fa__view q, k, v, out;
    fa__view dout, dq, dk, dv; /* backward only; dout is an input like out */
    /* lse: element (b, h, s) at lse + b*lse_sb + h*lse_sh + s*lse_ss; NULL = not requested. */
    float *lse;
    int64_t lse_sb, lse_sh, lse_ss;

    float scale;      /* resolved: never the 0 "default" marker */
    int32_t causal;   /* already folded into window_right */
    int32_t window_left, window_right; /* -1 = unbounded */
    float softcap;    /* 0 = off */
    const float *alibi; /* NULL = none; slope of (b, h) at alibi[b*alibi_sb + h*alibi_sh] */
    int64_t alibi_sb, alibi_sh;
    float dropout_p;             /* 0 = off */
    uint32_t dropout_threshold;  /* words below it drop (philox.h) */
    float dropout_scale;         /* 1 / (1 - dropout_p) */
    uint64_t dropout_seed, dropout_offset;
    /* Attention sinks: sink of head h at sinks[h*sinks_sh], NULL = none; the
     * backward writes the sinks' gradient to dsinks[h*dsinks_sh] when dsinks is not NULL. */
    const float *sinks;
    int64_t sinks_sh;
    float *dsinks;
    int64_t dsinks_sh;
} fa__problem;

/* fa_forward_kvcache's rotary tables: row pos at cos + pos*s_row elements, column t at
 * + t*s_col; the first rd dims rotated, pairs (2t, 2t+1) when interleaved, else (t, t + rd/2). */
typedef struct fa__rotary {
    const void *cos, *sin; /* NULL = no rotary */
    int32_t dtype, esize;
    int64_t s_row, s_col, rd;
    int interleaved;
} fa__rotary;

/* Batch b's first row and its lengths. */
static inline int64_t fa__row0_q(const fa__problem *p, int64_t b) { return p->cu_q ? p->cu_q[b] : 0; }
static inline int64_t fa__row0_k(const fa__problem *p, int64_t b) { return p->cu_k ? p->cu_k[b] : 0; }
static inline int64_t fa__seqlen_q(const fa__problem *p, int64_t b) {
    return p->cu_q ? (int64_t)p->cu_q[b + 1] - p->cu_q[b] : p->Sq;
}
static inline int64_t fa__seqlen_k(const fa__problem *p, int64_t b) {
    if (p->seqlens_k) return p->seqlens_k[b];
    return p->cu_k ? (int64_t)p->cu_k[b + 1] - p->cu_k[b] : p->Sk;
}

/* Keys [key_lo, key_hi) are visible to query i of a sequence with off = Sk - Sq (the causal and
 * window band). Host and device code (FA_HD): the CUDA plug-in draws the same band. */
FA_HD int64_t fa__key_lo(const fa__problem *p, int64_t i, int64_t off) {
    if (p->window_left < 0) return 0;
    const int64_t lo = i + off - p->window_left;
    return lo > 0 ? lo : 0;
}

FA_HD int64_t fa__key_hi(const fa__problem *p, int64_t i, int64_t off, int64_t sk) {
    if (p->window_right < 0) return sk;
    const int64_t hi = i + off + p->window_right + 1;
    return hi < sk ? hi : sk;
}

#endif /* FA_PROBLEM_H */
