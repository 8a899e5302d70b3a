/* SPDX-License-Identifier: MIT */
/*
 * kvcache.c — the CPU side of fa_forward_kvcache before attention: rotary embedding, and the
 * in-place append of new keys and values to the cache. Attention itself is fa__cpu_forward
 * over the cache's view.
 */
#include "cpu.h"
#include "tile.h"

/* Rotates x[0..rd) in place at table row `pos`: pairs (2t, 2t+1) when interleaved, else
 * (t, t + rd/2), each by the angle whose cosine and sine are cos[pos, t], sin[pos, t]. */
static void rotate(const fa__rotary *ro, int64_t pos, float *x, float *cs) {
    const int64_t half = ro->rd / 2;
    float *c = cs, *s = cs + half; // c, s: [rd/2]
    fa__load_f32(c, 1, (const char *)ro->cos + pos * ro->s_row * ro->esize, ro->dtype, half,
                 ro->s_col, 1.0f);
    fa__load_f32(s, 1, (const char *)ro->sin + pos * ro->s_row * ro->esize, ro->dtype, half,
                 ro->s_col, 1.0f);
    for (int64_t t = 0; t < half; t++) {
        const int64_t a = ro->interleaved ? 2 * t : t, b = ro->interleaved ? 2 * t + 1 : t + half;
        const float x1 = x[a], x2 = x[b];
        x[a] = x1 * c[t] - x2 * s[t];
        x[b] = x1 * s[t] + x2 * c[t];
    }
}

void fa__cpu_kvcache_append(const fa__kvappend *a) {
    const fa__cpu_kernels *kern = fa__cpu_kernels_get();
    const int64_t D = a->D;
    float row[512]; /* D, Dv <= 256, then the rotary table row (rd <= D) */
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t i = 0; i < a->S_new; i++) {
            const int64_t pos = a->seqlens[b] + i; /* absolute position in the cache row */
            for (int64_t h = 0; h < a->Hk; h++) {
                fa__load_f32(row, 1, fa__elem(&a->k_new, b, i, h), a->k_new.dtype, D,
                             a->k_new.sd, 1.0f);
                if (a->rotary.cos) rotate(&a->rotary, pos, row, row + 256);
                fa__store_f32(kern, fa__elem(&a->k_cache, b, pos, h), a->k_cache.dtype, row, D,
                              a->k_cache.sd, 1.0f);
                fa__load_f32(row, 1, fa__elem(&a->v_new, b, i, h), a->v_new.dtype, a->Dv,
                             a->v_new.sd, 1.0f);
                fa__store_f32(kern, fa__elem(&a->v_cache, b, pos, h), a->v_cache.dtype, row,
                              a->Dv, a->v_cache.sd, 1.0f);
            }
        }
}

void fa__cpu_rotate_q(const fa__view *q, const fa__rotary *ro, const int32_t *seqlens,
                      int shift_rows, int64_t B, int64_t Sq, int64_t H, int64_t D, float *dst) {
    float cs[256];
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < H; h++) {
                float *row = dst + ((b * Sq + i) * H + h) * D; // row: [D]
                fa__load_f32(row, 1, fa__elem(q, b, i, h), q->dtype, D, q->sd, 1.0f);
                rotate(ro, seqlens[b] + (shift_rows ? i : 0), row, cs);
            }
}
