/* SPDX-License-Identifier: MIT */
/*
 * dispatch.c — chooses the CPU microkernel set once per process: the best one compiled in that
 * this CPU supports, or the one named by the FA_CPU_ISA environment variable (avx512bf16: the
 * avx512 set with its vdpbf16ps products, which it otherwise has only where they are fast;
 * refbf16: the ref set with portable bf16 products, on every CPU, never chosen by itself). A
 * value it cannot follow (unknown, not compiled in, or not supported here) is reported once on
 * stderr and in the note fa_build_info() shows.
 */
#include "cpu.h"
#include "features.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kernel_entry {
    const fa__cpu_kernels *kernels;
    int (*usable)(const fa__cpu_features *f);
} kernel_entry;

#if defined(FA_HAVE_AVX512)
static int has_avx512(const fa__cpu_features *f) { return f->avx512f; }
#endif
#if defined(FA_HAVE_AVX2)
static int has_avx2(const fa__cpu_features *f) { return f->avx2 && f->f16c; }
#endif
#if defined(FA_HAVE_NEON)
static int has_neon(const fa__cpu_features *f) { return f->neon; }
#endif
static int always(const fa__cpu_features *f) { return f != NULL; }

/* Every kernel set compiled in, best first; ref last, usable everywhere. */
static const kernel_entry kernel_sets[] = {
#if defined(FA_HAVE_AVX512)
    {&fa__cpu_kernels_avx512, has_avx512},
#endif
#if defined(FA_HAVE_AVX2)
    {&fa__cpu_kernels_avx2, has_avx2},
#endif
#if defined(FA_HAVE_NEON)
    {&fa__cpu_kernels_neon, has_neon},
#endif
    {&fa__cpu_kernels_ref, always},
};
enum { N_SETS = sizeof kernel_sets / sizeof kernel_sets[0] };

static const fa__cpu_kernels *chosen;
#if defined(FA_HAVE_AVX512)
static fa__cpu_kernels tuned; /* the avx512 set with this CPU's entries: bf16, L2 asks */
#endif
/* The avx512 set's vdpbf16ps products: 1 wherever AVX512_BF16 is (FA_CPU_ISA=avx512bf16), 0
 * where they are also fast (features.h: bf16_dot_fast), -1 never (FA_CPU_ISA named a set). */
static int bf16_mode;
static char choice_note[320];
static char compiled[64];
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

/* Every name FA_CPU_ISA can take in some build. */
static const char *const known_sets[] = {"ref", "refbf16", "avx2", "avx512", "avx512bf16", "neon"};

/* FA_CPU_ISA=want cannot be followed: says why in the note and, once per process, on stderr
 * (the value shortened and with control characters replaced). */
static void ignore_isa(const char *want, const char *why) {
    char shown[33];
    size_t n = 0;
    for (; want[n] && n + 1 < sizeof shown; n++)
        shown[n] = isprint((unsigned char)want[n]) ? want[n] : '?';
    shown[n] = '\0';
    snprintf(choice_note, sizeof choice_note, " (FA_CPU_ISA=%s ignored: %s)", shown, why);
    fprintf(stderr, "flashattn: warning: FA_CPU_ISA=%s ignored: %s; using %s\n", shown, why,
            chosen->name);
}

static void choose_set(void) {
    const fa__cpu_features *f = fa__cpu_features_get();
    for (int i = N_SETS - 1; i >= 0; i--) {
        strcat(compiled, kernel_sets[i].kernels->name);
        if (kernel_sets[i].kernels == &fa__cpu_kernels_ref) strcat(compiled, " refbf16");
        if (i) strcat(compiled, " ");
    }
#if defined(FA_HAVE_AVX512)
    strcat(compiled, " avx512bf16");
#endif
    for (int i = 0; i < N_SETS && !chosen; i++)
        if (kernel_sets[i].usable(f)) chosen = kernel_sets[i].kernels;
    const char *want = getenv("FA_CPU_ISA");
    if (!want || !*want) return;
    if (strcmp(want, "refbf16") == 0) { /* portable: every CPU runs it */
        chosen = &fa__cpu_kernels_refbf16, bf16_mode = -1;
        snprintf(choice_note, sizeof choice_note, " (forced by FA_CPU_ISA)");
        return;
    }
#if defined(FA_HAVE_AVX512)
    if (strcmp(want, "avx512bf16") == 0) {
        if (f->avx512bf16) {
            chosen = &fa__cpu_kernels_avx512, bf16_mode = 1;
            snprintf(choice_note, sizeof choice_note, " (forced by FA_CPU_ISA)");
        } else {
            ignore_isa(want, "this CPU or OS does not support it");
        }
        return;
    }
#endif
    for (int i = 0; i < N_SETS; i++) {
        if (strcmp(kernel_sets[i].kernels->name, want) != 0) continue;
        if (kernel_sets[i].usable(f)) {
            chosen = kernel_sets[i].kernels, bf16_mode = -1;
            snprintf(choice_note, sizeof choice_note, " (forced by FA_CPU_ISA)");
        } else {
            ignore_isa(want, "this CPU or OS does not support it");
        }
        return;
    }
    char why[120];
    snprintf(why, sizeof why, "not compiled in; this build has %s", compiled);
    for (size_t i = 0; i < sizeof known_sets / sizeof known_sets[0]; i++)
        if (strcmp(want, known_sets[i]) == 0) {
            ignore_isa(want, why);
            return;
        }
    snprintf(why, sizeof why, "not a kernel set; valid: %s", compiled);
    ignore_isa(want, why);
}

/* The avx512 set gains the vdpbf16ps products as bf16_mode says. */
static void add_bf16(void) {
#if defined(FA_HAVE_AVX512)
    const fa__cpu_features *f = fa__cpu_features_get();
    if (chosen != &fa__cpu_kernels_avx512 || !f->avx512bf16 || bf16_mode < 0) return;
    char note[sizeof choice_note];
    if (bf16_mode == 0 && !f->bf16_dot_fast) {
        snprintf(note, sizeof note, " (vdpbf16ps not used: slower than fp32 FMA on this CPU; "
                 "FA_CPU_ISA=avx512bf16 uses it)%.200s", choice_note);
        memcpy(choice_note, note, sizeof note);
        return;
    }
    tuned = *chosen;
    tuned.qk_bf16 = fa__qk_bf16_avx512;
    tuned.pv_bf16 = fa__pv_bf16_avx512;
    tuned.pv_bf16_t = fa__pv_bf16_t_avx512;
    tuned.to_bf16 = fa__to_bf16_avx512;
    tuned.interleave_bf16 = fa__interleave_bf16_avx512;
    tuned.pair_bf16 = fa__pair_bf16_avx512;
    tuned.bwd_pair_bf16 = fa__bwd_pair_bf16_avx512;
    tuned.qk_rows_bf16 = fa__qk_rows_bf16_avx512;
    tuned.pv_rows_bf16 = fa__pv_rows_bf16_avx512;
    chosen = &tuned;
    snprintf(note, sizeof note, " + avx512_bf16%.280s", choice_note);
    memcpy(choice_note, note, sizeof note);
#endif
}

/* The avx512 set's decode products ask for the next rows into L2 where this CPU reads best so
 * (features.h: asks_l2), as the avx2 and neon sets' always do. */
static void add_l2_asks(void) {
#if defined(FA_HAVE_AVX512)
    if (!fa__cpu_features_get()->asks_l2) return;
    if (chosen == &fa__cpu_kernels_avx512) tuned = *chosen, chosen = &tuned;
    if (chosen != &tuned) return;
    tuned.qk_rows = fa__qk_rows_l2_avx512;
    tuned.pv_rows = fa__pv_rows_l2_avx512;
    if (tuned.qk_rows_bf16) tuned.qk_rows_bf16 = fa__qk_rows_bf16_l2_avx512;
    if (tuned.pv_rows_bf16) tuned.pv_rows_bf16 = fa__pv_rows_bf16_l2_avx512;
#endif
}

static void choose(void) {
    choose_set();
    add_bf16();
    add_l2_asks();
}

const fa__cpu_kernels *fa__cpu_kernels_get(void) {
    pthread_once(&choose_once, choose);
    return chosen;
}

const char *fa__cpu_kernels_note(void) {
    pthread_once(&choose_once, choose);
    return choice_note;
}

const char *fa__cpu_kernels_compiled(void) {
    pthread_once(&choose_once, choose);
    return compiled;
}
