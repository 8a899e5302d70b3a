/* SPDX-License-Identifier: MIT */
/*
 * version.c — the runtime version and the one-line build description.
 */
#include "cpu/cpu.h"
#include "internal.h"
#include "plugin.h"

#include <pthread.h>
#include <stdio.h>

#define FA_STR_(x) #x
#define FA_STR(x) FA_STR_(x)

unsigned fa_version(void) { return FA_VERSION_HEX; }

const char *fa_version_string(void) {
    return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}

static char build_info[2048];
static pthread_once_t build_info_once = PTHREAD_ONCE_INIT;

static void make_build_info(void) {
#if defined(__clang__)
    const char *compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *compiler = "gcc " __VERSION__;
#else
    const char *compiler = "unknown compiler";
#endif
    char cuda[1536];
    snprintf(build_info, sizeof build_info, "flashattn %s; %s; cpu kernels: %s; in use: %s%s; %s",
             fa_version_string(), compiler, fa__cpu_kernels_compiled(), fa__cpu_kernels_get()->name,
             fa__cpu_kernels_note(), fa__plugin_summary(cuda, sizeof cuda));
}

const char *fa_build_info(void) {
    pthread_once(&build_info_once, make_build_info);
    return build_info;
}
