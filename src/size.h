/* SPDX-License-Identifier: MIT */
/*
 * size.h — checked size arithmetic. Every element count, byte count and scratch size of the
 * library is built with these, so none can wrap: a size is an int64_t >= 0, and FA_SIZE_OVERFLOW
 * (-1) is sticky — an operation on it, or one whose result would not fit, gives it back, and
 * allocating it fails as "out of memory" (a request that large could never be met anyway).
 */
#ifndef FA_SIZE_H
#define FA_SIZE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define FA_SIZE_OVERFLOW ((int64_t)-1)

/* a · b, or FA_SIZE_OVERFLOW when either is negative (overflowed) or the product overflows. */
static inline int64_t fa__size_mul(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
        return FA_SIZE_OVERFLOW;
    return r;
}

/* a + b, with the same rule. */
static inline int64_t fa__size_add(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r))
        return FA_SIZE_OVERFLOW;
    return r;
}

/* n rounded up to a multiple of `align` (> 0), with the same rule. */
static inline int64_t fa__size_round_up(int64_t n, int64_t align) {
    const int64_t r = fa__size_add(n, align - 1);
    return r < 0 ? r : r / align * align;
}

/* malloc of count elements of elem bytes; NULL when the size overflowed or memory is short.
 * Allocates at least one byte, so NULL always means failure. */
static inline void *fa__alloc(int64_t count, size_t elem) {
    const int64_t bytes = fa__size_mul(count, (int64_t)elem);
    if (bytes < 0 || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
        return NULL;
    return malloc(bytes > 0 ? (size_t)bytes : 1);
}

/* fa__alloc aligned to 64 bytes (the size rounded up to a multiple of 64, as aligned_alloc
 * requires); free() releases it. */
static inline void *fa__alloc_aligned(int64_t count, size_t elem) {
    const int64_t bytes = fa__size_round_up(fa__size_mul(count, (int64_t)elem), 64);
    if (bytes < 0 || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
        return NULL;
    return aligned_alloc(64, bytes > 0 ? (size_t)bytes : 64);
}

#endif /* FA_SIZE_H */
