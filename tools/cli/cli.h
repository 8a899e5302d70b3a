/* SPDX-License-Identifier: MIT */
/*
 * tools/cli/ — the `flashattn` command's entry (main.c's table of subcommands, `info`) and the
 * helpers every subcommand shares.
 *
 * cli.h — what the subcommands of the `flashattn` command share: the subcommand signature, the
 * one way to report a library error (`flashattn: <what>: <FA_STATUS_NAME>: <message>`, exit 1),
 * option parsing helpers, a seeded random generator, a monotonic clock and element access for
 * the three attention dtypes. Everything is static inline; the tool uses only the public API in
 * flashattn.h.
 *
 * Each subcommand lives in its own file and is listed in main.c's table. A subcommand gets
 * argv[0] = its own name and returns the process exit status: 0 success, 1 failure (a failed
 * check or a library error), 2 bad usage.
 */
#ifndef FA_TOOLS_CLI_H
#define FA_TOOLS_CLI_H

/* clock_gettime and friends under -std=c11. Each .c file of the tool also defines this before
 * its first include, in case a system header comes first. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"
#include "halfconv.h"

/* ---- subcommands (one file each) ------------------------------------------------------------- */

typedef int (*cli_command_fn)(int argc, char **argv);

int cmd_verify(int argc, char **argv); /* verify.c */
int cmd_demo(int argc, char **argv);   /* demo.c */
int cmd_info(int argc, char **argv);   /* info.c */
int cmd_doctor(int argc, char **argv);  /* doctor.c */
int cmd_wheel(int argc, char **argv);   /* wheel.c */
int cmd_explain(int argc, char **argv); /* explain.c */
int cmd_bench(int argc, char **argv);  /* bench.c */
int cmd_bench_decode(int argc, char **argv); /* bench_decode.c */

/* ---- errors ---------------------------------------------------------------------------------- */

/* Reports a failed fa_* call and exits with status 1. */
static inline void cli_die_status(const char *what, fa_status st) {
    fprintf(stderr, "flashattn: %s: %s: %s\n", what, fa_status_name(st), fa_last_error_message());
    exit(1);
}

/* CLI_CHECK("fa_forward", fa_forward(...)): any status but FA_OK reports and exits. */
#define CLI_CHECK(what, call)                                                                      \
    do {                                                                                           \
        fa_status cli_st_ = (call);                                                                \
        if (cli_st_ != FA_OK)                                                                      \
            cli_die_status((what), cli_st_);                                                       \
    } while (0)

static inline void *cli_xmalloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "flashattn: out of memory allocating %zu bytes for %s\n", bytes, what);
        exit(1);
    }
    return p;
}

/* ---- option parsing -------------------------------------------------------------------------- */

/* Parses a whole decimal integer in [lo, hi]. Returns 0 on success, -1 otherwise. */
static inline int cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    long v;
    if (!s || !*s)
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Matches "--name VALUE" and "--name=VALUE" at argv[*i]. On a match stores the value (NULL if
 * "--name" was the last argument) in *value, advances *i past what it used and returns 1. */
static inline int cli_opt_value(int argc, char **argv, int *i, const char *name,
                                const char **value) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    *value = (*i + 1 < argc) ? argv[*i + 1] : NULL;
    if (*value)
        (*i)++;
    return 1;
}

/* ---- randomness and time --------------------------------------------------------------------- */

typedef struct cli_rng {
    uint64_t state;
} cli_rng;

/* splitmix64: small, fast, good enough for test inputs, reproducible from a seed. */
static inline uint64_t cli_rng_next(cli_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float cli_rng_uniform(cli_rng *r) {
    return (float)((double)(cli_rng_next(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* A fresh seed from the clock and the address space (different each run). */
static inline uint64_t cli_fresh_seed(void) {
    struct timespec ts;
    uint64_t s;
    cli_rng r;
    clock_gettime(CLOCK_REALTIME, &ts);
    s = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)&ts;
    r.state = s;
    return cli_rng_next(&r);
}

/* Seconds from a monotonic clock. */
static inline double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- reading memory -------------------------------------------------------------------------- */

/* Sum of the 64-bit words of [p, p + bytes) (bytes a multiple of 8) with 8 independent
 * accumulators, so that it vectorizes: the read probes of bench-decode and bench_paged_layouts. */
static inline uint64_t cli_sum_words(const unsigned char *p, size_t bytes) {
    const uint64_t *w = (const uint64_t *)(const void *)p;
    const size_t n = bytes / 8, n8 = n - n % 8;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t i = 0; i < n8; i += 8) {
        a0 += w[i];
        a1 += w[i + 1];
        a2 += w[i + 2];
        a3 += w[i + 3];
        a4 += w[i + 4];
        a5 += w[i + 5];
        a6 += w[i + 6];
        a7 += w[i + 7];
    }
    for (size_t i = n8; i < n; i++)
        a0 += w[i];
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

/* cli_sum_words that, with each 256 bytes it reads, asks for the 256 bytes `ahead` further on
 * (software prefetch, none past p + bytes): into every cache level (to_l2 0: prefetcht0 on x86)
 * or to L2 and beyond (1: prefetcht1), as a decode kernel asks for its next keys. On some
 * machines it reads memory much faster than the plain sum (an Intel Xeon VM: 1.5 times), on
 * others slower (a Zen 4 VM). Without GCC's builtins it is the plain sum. */
static inline uint64_t cli_sum_words_asking(const unsigned char *p, size_t bytes, size_t ahead,
                                            int to_l2) {
    const size_t n = bytes / 8, n32 = n - n % 32;
    const size_t last = bytes >= ahead + 256 ? bytes - ahead - 256 : 0; /* asks up to here */
    uint64_t sum = 0;
    for (size_t i = 0; i < n32; i += 32) {
#if defined(__GNUC__)
        if (bytes >= ahead + 256 && i * 8 <= last) {
            const unsigned char *a = p + i * 8 + ahead;
            for (int l = 0; l < 256; l += 64) {
                if (to_l2)
                    __builtin_prefetch(a + l, 0, 2);
                else
                    __builtin_prefetch(a + l, 0, 3);
            }
        }
#else
        (void)ahead;
        (void)to_l2;
        (void)last;
#endif
        sum += cli_sum_words(p + i * 8, 256);
    }
    return sum + cli_sum_words(p + n32 * 8, bytes - n32 * 8);
}

/* ---- dtypes ---------------------------------------------------------------------------------- */

/* Bytes per element of the attention dtypes (and int32). If-chains rather than a switch, so a
 * dtype added to the header later does not warn here. */
static inline size_t cli_dtype_size(fa_dtype t) {
    return t == FA_DTYPE_F16 || t == FA_DTYPE_BF16 ? 2 : 4;
}

static inline const char *cli_dtype_name(fa_dtype t) {
    if (t == FA_DTYPE_F32)
        return "fp32";
    if (t == FA_DTYPE_F16)
        return "fp16";
    if (t == FA_DTYPE_BF16)
        return "bf16";
    if (t == FA_DTYPE_I32)
        return "int32";
    return "?";
}

/* "f32"/"fp32"/"float32", "f16"/"fp16"/"float16"/"half", "bf16"/"bfloat16". 0 on success. */
static inline int cli_parse_dtype(const char *s, fa_dtype *out) {
    if (!s)
        return -1;
    if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32"))
        *out = FA_DTYPE_F32;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16") || !strcmp(s, "half"))
        *out = FA_DTYPE_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        *out = FA_DTYPE_BF16;
    else
        return -1;
    return 0;
}

/* Stores v (rounded to nearest even) as element i of a buffer of dtype t. */
static inline void cli_store(void *buf, fa_dtype t, size_t i, float v) {
    if (t == FA_DTYPE_F16)
        ((uint16_t *)buf)[i] = fa_tool_f32_to_f16(v);
    else if (t == FA_DTYPE_BF16)
        ((uint16_t *)buf)[i] = fa_tool_f32_to_bf16(v);
    else
        ((float *)buf)[i] = v;
}

/* Element i of a buffer of dtype t, exactly, as a double. */
static inline double cli_load(const void *buf, fa_dtype t, size_t i) {
    if (t == FA_DTYPE_F16)
        return (double)fa_tool_f16_to_f32(((const uint16_t *)buf)[i]);
    if (t == FA_DTYPE_BF16)
        return (double)fa_tool_bf16_to_f32(((const uint16_t *)buf)[i]);
    return (double)((const float *)buf)[i];
}

/* Fills n elements with a quiet NaN so an element the library forgets to write shows up. */
static inline void cli_poison(void *buf, fa_dtype t, size_t n) {
    size_t i;
    if (t == FA_DTYPE_F16 || t == FA_DTYPE_BF16) {
        uint16_t nan16 = t == FA_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
        for (i = 0; i < n; i++)
            ((uint16_t *)buf)[i] = nan16;
    } else {
        uint32_t nan32 = 0x7fc00000u;
        for (i = 0; i < n; i++)
            memcpy((char *)buf + 4 * i, &nan32, 4);
    }
}

#endif /* FA_TOOLS_CLI_H */
