/* SPDX-License-Identifier: MIT */
/*
 * kvcache.c — the CPU side of fa_forward_kvcache before attention: rotary embedding, and the
 * in-place append of new keys and values to the cache (quantized into 8-bit caches). Attention
 * itself is fa__cpu_forward over the cache's view.
 */
#include "cpu.h"
#include "tile.h"

#include "../convert.h"

#include <math.h>

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

/* The largest stored magnitude of an 8-bit dtype: 127, 448 (e4m3), 57344 (e5m2). */
static float q8_max(int32_t dtype) {
    return dtype == FA_DTYPE_I8 ? 127.0f : dtype == FA_DTYPE_F8_E4M3 ? 448.0f : 57344.0f;
}

/* x[0..n) into row (b, pos, h) of the 8-bit cache c (include/flashattn.h, fa_kvcache.k_scale):
 * with a scale per token, s = max|x| / Q is computed and written (0 for a zero row, NaN for a row
 * with a NaN or an infinity, which then stores zeros); else s is the (b, h) scale. Stored: x / s,
 * rounded to nearest even, saturating. */
static void store_q8(const fa__view *c, int token, int64_t b, int64_t pos, int64_t h,
                     const float *x, int64_t n) {
    float *sp = (float *)c->scale->data + fa__view_at(c->scale, b, token ? pos : 0, h);
    float s = *sp;
    if (token) {
        float mx = 0.0f;
        int finite = 1;
        for (int64_t t = 0; t < n; t++) { /* a compare, not fmaxf: a call per element */
            const float a = fabsf(x[t]);
            finite &= isfinite(a) != 0;
            mx = a > mx ? a : mx;
        }
        s = *sp = finite ? mx / q8_max(c->dtype) : NAN;
    }
    const int zero = !(s > 0.0f); /* a zero or non-finite row stores zeros */
    uint8_t *dst = fa__elem(c, b, pos, h);
    for (int64_t t = 0; t < n; t++) {
        const float y = zero ? 0.0f : x[t] / s;
        dst[t * c->sd] = c->dtype == FA_DTYPE_I8 ? (uint8_t)fa__f32_to_i8(y)
                         : c->dtype == FA_DTYPE_F8_E4M3 ? fa__f32_to_e4m3(y)
                                                        : fa__f32_to_e5m2(y);
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
                if (a->k_cache.scale)
                    store_q8(&a->k_cache, a->scale_token[0], b, pos, h, row, D);
                else
                    fa__store_f32(kern, fa__elem(&a->k_cache, b, pos, h), a->k_cache.dtype, row,
                                  D, a->k_cache.sd, 1.0f);
                fa__load_f32(row, 1, fa__elem(&a->v_new, b, i, h), a->v_new.dtype, a->Dv,
                             a->v_new.sd, 1.0f);
                if (a->v_cache.scale)
                    store_q8(&a->v_cache, a->scale_token[1], b, pos, h, row, a->Dv);
                else
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
