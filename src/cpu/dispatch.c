/* SPDX-License-Identifier: MIT */
/*
 * dispatch.c — chooses the CPU microkernel set once per process: the best one compiled in that
 * this CPU supports, or the one named by the FA_CPU_ISA environment variable.
 */
#include "cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Every kernel set compiled in, best first. The SIMD sets join this list as they are added. */
static const fa__cpu_kernels *const kernel_sets[] = {
    &fa__cpu_kernels_ref,
};

static const fa__cpu_kernels *chosen;
static char choice_note[96];
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    const size_t n = sizeof kernel_sets / sizeof kernel_sets[0];
    chosen = kernel_sets[0];
    const char *want = getenv("FA_CPU_ISA");
    if (!want || !*want) return;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(kernel_sets[i]->name, want) == 0) {
            chosen = kernel_sets[i];
            return;
        }
    }
    strcpy(choice_note, " (FA_CPU_ISA=");
    strncat(choice_note, want, 48);
    strcat(choice_note, " is not available here)");
}

const fa__cpu_kernels *fa__cpu_kernels_get(void) {
    pthread_once(&choose_once, choose);
    return chosen;
}

const char *fa__cpu_kernels_note(void) {
    pthread_once(&choose_once, choose);
    return choice_note;
}
