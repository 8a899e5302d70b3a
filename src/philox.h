/* SPDX-License-Identifier: MIT */
/*
 * philox.h — Philox-4x32-10 (Salmon et al., SC'11) and the dropout mask built on it. Header-only
 * and free of libc so the CPU backend and the CUDA plug-in compile the same code and draw the
 * same mask bit for bit.
 *
 * The mask is a pure function of (seed, offset, batch b, head h, row i, column j):
 *   key     = (lo32(seed), hi32(seed) ^ hi32(offset))
 *   counter = (j / 4, i, b * H + h, lo32(offset))
 * One Philox call gives four 32-bit words, for columns 4(j/4) .. 4(j/4)+3; word j % 4 decides
 * column j. Element (i, j) is dropped iff its word < threshold = floor(p * 2^32), so the keep
 * rate is 1 - threshold / 2^32 (within 2^-32 of 1 - p). Rows and columns count within each
 * sequence (varlen: b is the sequence index).
 */
#ifndef FA_PHILOX_H
#define FA_PHILOX_H

#include "hd.h"

#include <stdint.h>

typedef struct fa__philox4 {
    uint32_t v[4];
} fa__philox4;

FA_HD void fa__mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    const uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

/* Philox-4x32 with 10 rounds: counter c, key (k0, k1). */
FA_HD fa__philox4 fa__philox4x32_10(fa__philox4 c, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        fa__mulhilo32(0xD2511F53u, c.v[0], &hi0, &lo0);
        fa__mulhilo32(0xCD9E8D57u, c.v[2], &hi1, &lo1);
        const fa__philox4 n = {{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
        c = n;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c;
}

/* The drop threshold for probability p in [0, 1): words below it are dropped. */
FA_HD uint32_t fa__dropout_threshold(float p) {
    const double t = (double)p * 4294967296.0;
    return t >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)t;
}

/* The four words deciding columns 4*jq .. 4*jq+3 of row i of head bh = b * H + h. */
FA_HD fa__philox4 fa__dropout_words(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t i,
                                    uint32_t jq) {
    const fa__philox4 c = {{jq, i, bh, (uint32_t)offset}};
    return fa__philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32));
}

#endif /* FA_PHILOX_H */
