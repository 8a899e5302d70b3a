/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * verutil.h — comparing version strings the way pip and the dynamic loader do, small enough
 * to be static inline: dotted numbers compared numerically ("3.4.30" > "3.4.9"), then a PEP 440
 * suffix (".devN" < release < ".postN"); a local part ("+cu128") is ignored.
 */
#ifndef FA_TOOLS_VERUTIL_H
#define FA_TOOLS_VERUTIL_H

#include <stdlib.h>
#include <string.h>

typedef struct ver_parts {
    long num[6];
    int n;
    int kind;   /* -2 dev, -1 pre-release (a/b/rc), 0 release, 1 post */
    long extra; /* the number after dev/post/rc */
} ver_parts;

static inline void ver_split(const char *s, ver_parts *v) {
    memset(v, 0, sizeof *v);
    if (!s)
        return;
    while (*s && (*s < '0' || *s > '9'))
        s++;
    while (*s >= '0' && *s <= '9' && v->n < 6) {
        char *end;
        v->num[v->n++] = strtol(s, &end, 10);
        s = end;
        if (*s == '.' && s[1] >= '0' && s[1] <= '9')
            s++;
        else
            break;
    }
    if (*s == '.')
        s++;
    if (!strncmp(s, "post", 4)) {
        v->kind = 1;
        v->extra = strtol(s + 4, NULL, 10);
    } else if (!strncmp(s, "dev", 3)) {
        v->kind = -2;
        v->extra = strtol(s + 3, NULL, 10);
    } else if (!strncmp(s, "rc", 2) || *s == 'a' || *s == 'b') {
        v->kind = -1;
        v->extra = strtol(s + (*s == 'r' ? 2 : 1), NULL, 10);
    }
}

/* <0, 0, >0 like strcmp. NULL sorts first. */
static inline int ver_cmp(const char *a, const char *b) {
    ver_parts x, y;
    int i, n;
    if (!a || !b)
        return (a != NULL) - (b != NULL);
    ver_split(a, &x);
    ver_split(b, &y);
    n = x.n > y.n ? x.n : y.n;
    for (i = 0; i < n; i++) {
        long p = i < x.n ? x.num[i] : 0, q = i < y.n ? y.num[i] : 0;
        if (p != q)
            return p < q ? -1 : 1;
    }
    if (x.kind != y.kind)
        return x.kind < y.kind ? -1 : 1;
    if (x.extra != y.extra)
        return x.extra < y.extra ? -1 : 1;
    return 0;
}

/* The version part after a prefix: "GLIBCXX_3.4.30" with "GLIBCXX_" -> "3.4.30", else NULL. */
static inline const char *ver_after(const char *s, const char *prefix) {
    size_t n = strlen(prefix);
    if (!s || strncmp(s, prefix, n) != 0 || s[n] < '0' || s[n] > '9')
        return NULL;
    return s + n;
}

#endif /* FA_TOOLS_VERUTIL_H */
