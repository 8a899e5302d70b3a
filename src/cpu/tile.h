/* SPDX-License-Identifier: MIT */
/*
 * tile.h — the blocking layer's shared pieces, used by the forward and the backward: loading and
 * storing rows of any dtype as fp32, packing K/V blocks, the causal/window band, and the score
 * epilogue (softcap, ALiBi, mask) in the exp2 domain.
 */
#ifndef FA_CPU_TILE_H
#define FA_CPU_TILE_H

#include "../problem.h"
#include "flashattn.h"
#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>

enum {
    FA_BC = 128,   /* keys per block */
    FA_ALIGN = 16  /* scratch arrays start on 64-byte boundaries (16 floats) */
};

#define FA_LOG2E 1.4426950408889634f

static inline size_t fa__round_up(size_t n) { return (n + FA_ALIGN - 1) / FA_ALIGN * FA_ALIGN; }

/* The batch a task belongs to, given each batch's first task start[0..B] (start[B] = total);
 * batches without tasks are skipped. */
static inline int64_t fa__task_batch(const int64_t *start, int64_t B, int64_t task) {
    int64_t lo = 0, hi = B; /* start[lo] <= task < start[hi] */
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (start[mid] <= task) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Address of element (b, s, h, 0) of a view. */
void *fa__elem(const fa__view *x, int64_t b, int64_t s, int64_t h);

/* n elements of any floating dtype, 8-bit ones included (stride `stride`), into fp32 times
 * `scale` at dst[t * ld]. */
void fa__load_f32(float *dst, int64_t ld, const void *src, int32_t dtype, int64_t n,
                  int64_t stride, float scale);

/* n fp32 values times `scale` into elements of any dtype with stride `stride` (contiguous ones
 * through kern->from_f32). */
void fa__store_f32(const fa__cpu_kernels *kern, void *dst, int32_t dtype, const float *src,
                   int64_t n, int64_t stride, float scale);

/* Writes zeros to rows [begin, end) of every head of a varlen view (sb = 0) with H heads. */
void fa__zero_rows(const fa__view *x, int64_t H, int64_t D, int64_t begin, int64_t end);

/* n keys (or values) of head hk from row `row0`, D elements each (the view's head dim: D for
 * k, Dv for v), as fp32 in `pack` (8-bit caches: times each row's scale): rows [n, D] when
 * transposed == 0, else [D, n], with row stride ld (>= D, or >= n when transposed). tmp
 * ([n, D]) holds converted rows on the way to a transpose. Returns pack. */
const float *fa__kv_block(int64_t D, const fa__cpu_kernels *kern, const fa__view *x, int64_t b,
                          int64_t row0, int64_t hk, int64_t n, int transposed, float *pack,
                          int64_t ld, float *tmp);

/* The row stride (floats) of a packed right operand whose rows hold n floats: n rounded up to
 * whole 64-byte lines and then to an odd count of them (128 -> 144, 64 -> 80, 4096 -> 4112).
 * The products read one or two lines of it per k step; rows a power of two apart put all of
 * those in a few L1 sets, and a panel then cannot stay in L1 (on Zen 3, qk in L2 at D = 128:
 * 68-71 GFLOP/s at a stride of 128 floats, 78-79 at 144, a core's peak being 98-101). */
static inline int64_t fa__packed_ld(int64_t n) {
    const int64_t lines = (n + 15) / 16;
    return 16 * (lines % 2 ? lines : lines + 1);
}

/* rows[j] = address of element (b, row0 + j, h, 0), j < n: one fa__elem, then a constant step,
 * unless the view is paged. */
void fa__row_ptrs(const fa__view *x, int64_t b, int64_t row0, int64_t n, int64_t h,
                  const void **rows);

/* Can fp32 rows of x feed pv as its right operand as they are (with their own row stride),
 * without a copy? Not for kernel sets whose pv slows on rows 4 KiB apart (pv_packed_b). */
static inline int fa__rows_in_place(const fa__view *x, const fa__cpu_kernels *kern) {
    return x->dtype == FA_DTYPE_F32 && x->sd == 1 && !x->block_table && !kern->pv_packed_b;
}

/* Rows of S per prefill qk call, each call followed by their softmax while they are in L1:
 * about 24, in whole register tiles of the kernel set (27 for 9-row tiles, 24 for 6 or 12). */
static inline int64_t fa__qk_chunk_rows(const fa__cpu_kernels *kern) {
    const int64_t mr = kern->gemm_rows;
    return (24 + mr - 1) / mr * mr;
}

/* Keys in the block after [j0, j0 + FA_BC) before j_end: 0 .. FA_BC (<= 0: none). */
static inline int64_t fa__next_block(int64_t j0, int64_t j_end) {
    const int64_t left = j_end - j0 - FA_BC;
    return left < FA_BC ? left : FA_BC;
}

/* Asks for rows row0..row0+n of head h to be brought into L2: blocks of keys (and, in the
 * backward, of queries) are re-read from rows a token apart that the hardware prefetchers do not
 * follow across pages, so the next block is asked for while this one is computed. */
void fa__prefetch_block(const fa__view *x, int64_t b, int64_t row0, int64_t n, int64_t h,
                        int64_t D);

/* bf16 operands for the vdpbf16ps products (kernels.h): pairs along the reduction dimension.
 * D: the head dim of x's rows (D for k, Dv for v).
 * copy_bf16_row: n bf16 of a row (stride `stride`) into dst, plus a zero when n is odd.
 * pack_k_bf16: rows row0..row0+n of head hk of x (the keys; in the backward's dO Vᵀ, the
 *   values) as [ceil(D/2), n] pairs (ld FA_BC); tmp holds [n, ceil(D/2)] pairs on the way when
 *   the rows cannot be transposed in place.
 * pack_v_bf16: rows row0..row0+n of head hk of x (the values; in the backward's dS K, the keys)
 *   as [ceil(n/2), D] pairs (ld D), an odd tail padded with 0. */
void fa__copy_bf16_row(uint16_t *dst, const void *src, int64_t n, int64_t stride);
void fa__pack_k_bf16(int64_t D, const fa__cpu_kernels *kern, const fa__view *x, int64_t b,
                     int64_t row0, int64_t hk, int64_t n, uint32_t *pack, uint16_t *tmp);
void fa__pack_v_bf16(int64_t D, const fa__cpu_kernels *kern, const fa__view *x, int64_t b,
                     int64_t row0, int64_t hk, int64_t n, uint32_t *pack);

/* Does some row of [i0, i0 + nr) see only part of keys [j0, j0 + n)? Then the block needs
 * the mask; otherwise every row sees every key of it. */
static inline int fa__block_masked(const fa__problem *p, int64_t i0, int64_t nr, int64_t j0,
                                   int64_t n, int64_t off, int64_t sk) {
    return j0 < fa__key_lo(p, i0 + nr - 1, off) || j0 + n > fa__key_hi(p, i0, off, sk);
}

/* The keys of a block [j0, j0 + n) that query i sees: [j0 + *a, j0 + *e), 0 <= *a <= *e <= n. */
static inline void fa__row_keys(const fa__problem *p, int64_t i, int64_t j0, int64_t n, int64_t off,
                                int64_t sk, int64_t *a, int64_t *e) {
    const int64_t lo = fa__key_lo(p, i, off) - j0, hi = fa__key_hi(p, i, off, sk) - j0;
    *a = lo < 0 ? 0 : lo < n ? lo : n;
    *e = hi < *a ? *a : hi < n ? hi : n;
}

/* Are the n elements of x (any floating dtype, stride `stride`) all finite (no NaN, no
 * infinity)? The non-finite rule (docs/semantics.md) asks it of the operands of a block at the
 * band's edge: a P or dS of exactly 0 times a NaN or an infinity would be NaN in a row that
 * cannot see it, and such blocks then take an exact path. */
int fa__finite(const void *x, int32_t dtype, int64_t n, int64_t stride);

/* fa__finite over rows row0..row0+n of head h of a view (D elements each), and over their
 * scales when the view is an 8-bit cache. */
int fa__rows_finite(const fa__view *x, int64_t b, int64_t row0, int64_t n, int64_t h, int64_t D);

/* The rows of [i0, i0 + nr) that see some key of [j0, j0 + n): [*lo, *hi). Rows above see only
 * earlier keys (a causal or right window's edge), rows below only later ones (a left window's).
 * Their probabilities in the block are zero, so the products may skip them: what they would add
 * is exact zeros (and a rescale by 1). */
static inline void fa__block_rows(const fa__problem *p, int64_t i0, int64_t nr, int64_t j0,
                                  int64_t n, int64_t off, int64_t *lo, int64_t *hi) {
    *lo = 0, *hi = nr;
    if (p->window_right >= 0) { /* row i sees keys < i + off + wr + 1 */
        const int64_t first = j0 - off - p->window_right - i0;
        *lo = first < 0 ? 0 : first > nr ? nr : first;
    }
    if (p->window_left >= 0) { /* row i sees keys >= i + off - wl */
        const int64_t end = j0 + n - off + p->window_left - i0;
        *hi = end < *lo ? *lo : end > nr ? nr : end;
    }
}

/* How q is scaled when loaded so that q·k comes out in the exp2 domain (or, with softcap, as
 * the tanh argument), and the softcap factor c·log2(e) (0 = off). */
void fa__score_scales(const fa__problem *p, float *qscale, float *softcap_l2);

/* On one row of scores s[0..n) of query i (head h, batch b) against keys j0..: softcap, ALiBi
 * and, when `masked`, -inf outside the band (set, so a NaN score there is dropped too). When dtanh
 * is not NULL and softcap is on, it gets the tanh derivative 1 - tanh² for the backward. */
void fa__score_epilogue(const fa__problem *p, float softcap_l2, float *s, int64_t n, int64_t i,
                        int64_t j0, int64_t off, int64_t sk, int64_t b, int64_t h, int masked,
                        float *dtanh);

/* Zeroes the entries of x[0..n) (keys j0.. of row i, head h, batch b) that dropout drops and
 * scales the kept ones by 1/(1 - p); y (may be NULL) gets the same mask from the same draw. No-op
 * without dropout. */
void fa__dropout_row(const fa__problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                     float *x, float *y);

#endif /* FA_CPU_TILE_H */
