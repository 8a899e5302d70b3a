/* SPDX-License-Identifier: MIT */
/*
 * tile.c — the blocking layer's shared pieces: dtype conversion of rows, K/V block packing, the
 * score epilogue and dropout, used by fwd.c and bwd.c alike.
 */
#include "tile.h"

#include "../convert.h"
#include "../internal.h"
#include "../philox.h"

#include <math.h>
#include <string.h>

void *fa__elem(const fa__view *x, int64_t b, int64_t s, int64_t h) {
    return (char *)x->data + fa__view_at(x, b, s, h) * fa__dtype_size(x->dtype);
}

void fa__load_f32(float *dst, int64_t ld, const void *src, int32_t dtype, int64_t n,
                  int64_t stride, float scale) {
    if (dtype == FA_DTYPE_F32 && ld == 1 && stride == 1) { /* the common case, vectorized */
        const float *s = src;
        for (int64_t t = 0; t < n; t++) dst[t] = s[t] * scale;
    } else if (dtype == FA_DTYPE_F32) {
        const float *s = src;
        for (int64_t t = 0; t < n; t++) dst[t * ld] = s[t * stride] * scale;
    } else if (dtype == FA_DTYPE_F16) {
        const uint16_t *s = src;
        for (int64_t t = 0; t < n; t++) dst[t * ld] = fa__f16_to_f32(s[t * stride]) * scale;
    } else if (dtype == FA_DTYPE_BF16) {
        const uint16_t *s = src;
        for (int64_t t = 0; t < n; t++) dst[t * ld] = fa__bf16_to_f32(s[t * stride]) * scale;
    } else { /* 8-bit cache rows */
        for (int64_t t = 0; t < n; t++) dst[t * ld] = fa__row_load(src, dtype, t * stride) * scale;
    }
}

void fa__store_f32(const fa__cpu_kernels *kern, void *dst, int32_t dtype, const float *src,
                   int64_t n, int64_t stride, float scale) {
    if (stride == 1) { /* the common case */
        kern->from_f32((int)n, src, scale, dtype, dst);
    } else if (dtype == FA_DTYPE_F32) {
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

void fa__zero_rows(const fa__view *x, int64_t H, int64_t D, int64_t begin, int64_t end) {
    const int size = fa__dtype_size(x->dtype);
    for (int64_t s = begin; s < end; s++)
        for (int64_t h = 0; h < H; h++) {
            char *row = fa__elem(x, 0, s, h);
            for (int64_t t = 0; t < D; t++) memset(row + t * x->sd * size, 0, (size_t)size);
        }
}

const float *fa__kv_block(int64_t D, const fa__cpu_kernels *kern, const fa__view *x, int64_t b,
                          int64_t row0, int64_t hk, int64_t n, int transposed, float *pack,
                          int64_t ld, float *tmp) {
    if (transposed && x->dtype == FA_DTYPE_F32 && x->sd == 1 && !x->block_table) {
        kern->transpose((int)n, (int)D, fa__elem(x, b, row0, hk), x->ss, pack, ld);
        return pack;
    }
    float *rows = transposed ? tmp : pack; // rows: [n, D] (ld D on the way to a transpose)
    const int64_t ldr = transposed ? D : ld;
    for (int64_t j = 0; j < n; j++) {
        const void *src = fa__elem(x, b, row0 + j, hk);
        const float scale = fa__row_scale(x, b, row0 + j, hk); /* 1 but in 8-bit caches */
        if (x->sd == 1) kern->to_f32((int)D, src, x->dtype, scale, rows + j * ldr);
        else fa__load_f32(rows + j * ldr, 1, src, x->dtype, D, x->sd, scale);
    }
    if (transposed) kern->transpose((int)n, (int)D, rows, D, pack, ld);
    return pack;
}

void fa__row_ptrs(const fa__view *x, int64_t b, int64_t row0, int64_t n, int64_t h,
                  const void **rows) {
    if (x->block_table) {
        for (int64_t j = 0; j < n; j++) rows[j] = fa__elem(x, b, row0 + j, h);
        return;
    }
    const char *first = fa__elem(x, b, row0, h);
    const int64_t step = x->ss * fa__dtype_size(x->dtype);
    for (int64_t j = 0; j < n; j++) rows[j] = first + j * step;
}

void fa__prefetch_block(const fa__view *x, int64_t b, int64_t row0, int64_t n, int64_t h,
                        int64_t D) {
    const void *rows[FA_BC];
    const int64_t bytes = D * fa__dtype_size(x->dtype);
    for (int64_t j0 = 0; j0 < n; j0 += FA_BC) {
        const int64_t m = n - j0 < FA_BC ? n - j0 : FA_BC;
        fa__row_ptrs(x, b, row0 + j0, m, h, rows);
        for (int64_t j = 0; j < m; j++)
            for (int64_t at = 0; at < bytes; at += 64)
                __builtin_prefetch((const char *)rows[j] + at, 0, 2);
    }
}

int fa__finite(const void *x, int32_t dtype, int64_t n, int64_t stride) {
    /* A value is NaN or infinite when its exponent bits are all ones. The flags are or-ed, not
     * branched on, so the loops vectorize. */
    unsigned bad = 0;
    if (dtype == FA_DTYPE_F32) {
        const uint32_t *u = x;
        for (int64_t t = 0; t < n; t++) bad |= (u[t * stride] & 0x7F800000u) == 0x7F800000u;
    } else if (dtype == FA_DTYPE_I8) {
        return 1;
    } else if (dtype == FA_DTYPE_F8_E4M3 || dtype == FA_DTYPE_F8_E5M2) { /* e4m3: NaN only */
        const uint8_t *u = x, e = dtype == FA_DTYPE_F8_E4M3 ? 0x7Fu : 0x7Cu;
        for (int64_t t = 0; t < n; t++) bad |= (u[t * stride] & e) == e;
    } else {
        const uint16_t *u = x, e = dtype == FA_DTYPE_F16 ? 0x7C00u : 0x7F80u;
        for (int64_t t = 0; t < n; t++) bad |= (u[t * stride] & e) == e;
    }
    return !bad;
}

int fa__rows_finite(const fa__view *x, int64_t b, int64_t row0, int64_t n, int64_t h, int64_t D) {
    const void *rows[FA_BC];
    for (int64_t j0 = 0; j0 < n; j0 += FA_BC) {
        const int64_t m = n - j0 < FA_BC ? n - j0 : FA_BC;
        fa__row_ptrs(x, b, row0 + j0, m, h, rows);
        for (int64_t j = 0; j < m; j++) /* an 8-bit row's value: stored times scale */
            if (!fa__finite(rows[j], x->dtype, D, x->sd) ||
                !isfinite(fa__row_scale(x, b, row0 + j0 + j, h)))
                return 0;
    }
    return 1;
}

void fa__copy_bf16_row(uint16_t *dst, const void *src, int64_t n, int64_t stride) {
    const uint16_t *s = src;
    if (stride == 1) memcpy(dst, s, (size_t)n * sizeof *dst);
    else
        for (int64_t t = 0; t < n; t++) dst[t] = s[t * stride];
    if (n & 1) dst[n] = 0;
}

void fa__pack_k_bf16(int64_t D, const fa__cpu_kernels *kern, const fa__view *x, int64_t b,
                     int64_t row0, int64_t hk, int64_t n, uint32_t *pack, uint16_t *tmp) {
    const int64_t D2 = (D + 1) / 2;
    /* A pair is one 32-bit word, so Kᵀ in pairs is a 32-bit transpose of the key rows. */
    if (x->sd == 1 && D % 2 == 0 && x->ss % 2 == 0 && !x->block_table) {
        kern->transpose((int)n, (int)D2, fa__elem(x, b, row0, hk), x->ss / 2, (float *)pack, FA_BC);
        return;
    }
    for (int64_t j = 0; j < n; j++)
        fa__copy_bf16_row(tmp + j * 2 * D2, fa__elem(x, b, row0 + j, hk), D, x->sd);
    kern->transpose((int)n, (int)D2, (const float *)tmp, D2, (float *)pack, FA_BC);
}

void fa__pack_v_bf16(int64_t D, const fa__cpu_kernels *kern, const fa__view *x, int64_t b,
                     int64_t row0, int64_t hk, int64_t n, uint32_t *pack) {
    for (int64_t j = 0; j < n; j += 2) {
        const uint16_t *r0 = fa__elem(x, b, row0 + j, hk);                          // r0: [D]
        const uint16_t *r1 = j + 1 < n ? fa__elem(x, b, row0 + j + 1, hk) : NULL; // r1: [D]
        uint32_t *dst = pack + (j / 2) * D;                                         // dst: [D]
        if (r1 && x->sd == 1) kern->interleave_bf16((int)D, r0, r1, dst);
        else if (r1)
            for (int64_t t = 0; t < D; t++)
                dst[t] = (uint32_t)r0[t * x->sd] | (uint32_t)r1[t * x->sd] << 16;
        else
            for (int64_t t = 0; t < D; t++) dst[t] = r0[t * x->sd];
    }
}

void fa__score_scales(const fa__problem *p, float *qscale, float *softcap_l2) {
    if (p->softcap > 0.0f) {
        *qscale = p->scale / p->softcap;
        *softcap_l2 = p->softcap * FA_LOG2E;
    } else {
        *qscale = p->scale * FA_LOG2E;
        *softcap_l2 = 0.0f;
    }
}

void fa__score_epilogue(const fa__problem *p, float softcap_l2, float *s, int64_t n, int64_t i,
                        int64_t j0, int64_t off, int64_t sk, int64_t b, int64_t h, int masked,
                        float *dtanh) {
    if (softcap_l2 != 0.0f) {
        for (int64_t j = 0; j < n; j++) {
            const float t = tanhf(s[j]);
            s[j] = softcap_l2 * t;
            if (dtanh) dtanh[j] = 1.0f - t * t;
        }
    }
    if (p->alibi) {
        /* In double: in fp32 the rounding of slope·log2(e) alone grows with the distance into a
         * tilt of the whole row, visible in fp32 outputs once rows reach thousands of keys. */
        const double slope = p->alibi[b * p->alibi_sb + h * p->alibi_sh] * 1.4426950408889634;
        for (int64_t j = 0; j < n; j++)
            s[j] = (float)((double)s[j] - slope * fabs((double)(i + off - (j0 + j))));
    }
    if (masked) { /* keys [a, e) stay: the rest of the block, two runs at most, is masked */
        int64_t a, e;
        fa__row_keys(p, i, j0, n, off, sk, &a, &e);
        for (int64_t j = 0; j < a; j++) s[j] = -INFINITY;
        for (int64_t j = e; j < n; j++) s[j] = -INFINITY;
    }
}

void fa__dropout_row(const fa__problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                     float *x, float *y) {
    if (p->dropout_p == 0.0f) return;
    const uint32_t bh = (uint32_t)(b * p->H + h);
    for (int64_t j = j0; j < j0 + n;) {
        const fa__philox4 w = fa__dropout_words(p->dropout_seed, p->dropout_offset, bh,
                                                (uint32_t)i, (uint32_t)(j >> 2));
        for (int lane = (int)(j & 3); lane < 4 && j < j0 + n; lane++, j++) {
            const int keep = w.v[lane] >= p->dropout_threshold;
            x[j - j0] = keep ? x[j - j0] * p->dropout_scale : 0.0f;
            if (y) y[j - j0] = keep ? y[j - j0] * p->dropout_scale : 0.0f;
        }
    }
}
