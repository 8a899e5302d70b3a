/* SPDX-License-Identifier: MIT */
/*
 * tools/cli/ — the `flashattn` command's entry (main.c's table of subcommands, `info`) and the
 * helpers every subcommand shares.
 *
 * info.c — `flashattn info`: what library this is and what it will run on. Prints the loaded
 * library's version (and whether it matches the header the tool was built with), its build
 * description, the thread count of the default context, the CUDA plug-in status (with one line
 * per CUDA device: fa_device_describe, which kernels run on it) and the FA_*
 * variables that are set (they change what runs, so a bug report should show them), with a
 * warning for one the library cannot follow (a malformed FA_NUM_THREADS or FA_SPIN_US, an
 * FA_CPU_ISA it ignores).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flashattn.h"

static void info_usage(FILE *f) {
    fprintf(f, "usage: flashattn info\n"
               "\n"
               "Prints the library version, its build description, the number of threads of the\n"
               "default context (FA_NUM_THREADS or the CPUs this process may use), whether\n"
               "the CUDA plug-in is available (and one line per CUDA device: its name,\n"
               "compute capability and the kernels flashattn runs on it), and which of the\n"
               "library's environment variables are set.\n");
}

/* The environment variables the library reads (docs/building.md, "Environment variables"). */
static const char *const k_env_vars[] = {"FA_NUM_THREADS", "FA_CPU_ISA",        "FA_SPIN_US",
                                         "FA_CUDA_PLUGIN", "FA_CUDA_TILE_D128", "FA_CUDA_KERNELS"};

int cmd_info(int argc, char **argv) {
    int i;
    int32_t ncuda = 0;
    unsigned lib;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            info_usage(stdout);
            return 0;
        }
        fprintf(stderr, "flashattn info: unknown argument '%s'\n\n", argv[i]);
        info_usage(stderr);
        return 2;
    }

    lib = fa_version();
    printf("version:      %s", fa_version_string());
    if (lib != (unsigned)FA_VERSION_HEX)
        printf("  (WARNING: this tool was built against header %d.%d.%d)", FA_VERSION_MAJOR,
               FA_VERSION_MINOR, FA_VERSION_PATCH);
    printf("\n");
    const char *build = fa_build_info();
    printf("build:        %s\n", build);
    /* The default context as fa_* calls with ctx NULL would create it (its variables checked). */
    fa_context *ctx = NULL;
    if (fa_context_create(NULL, &ctx) == FA_OK) {
        printf("threads:      %d (default context)\n", (int)fa_context_num_threads(ctx));
        fa_context_destroy(ctx);
    } else {
        printf("threads:      unavailable: %s\n", fa_last_error_message());
    }
    const char *isa = strstr(build, "(FA_CPU_ISA=");
    const char *end = isa ? strchr(isa, ')') : NULL;
    if (end && strstr(isa, " ignored: ") && strstr(isa, " ignored: ") < end)
        printf("warning:      %.*s\n", (int)(end - isa - 1), isa + 1);
    printf("backends:     cpu: available\n");
    if (fa_device_count(FA_DEVICE_CUDA, &ncuda) != FA_OK)
        printf("              cuda: unavailable: %s\n", fa_last_error_message());
    else if (ncuda == 0)
        printf("              cuda: the plug-in loaded, but no CUDA device is visible\n");
    else
        printf("              cuda: available, %d device%s (forward, backward, KV cache, combine; "
               "see the build line)\n",
               (int)ncuda, ncuda == 1 ? "" : "s");
    for (int32_t d = 0; d < ncuda; d++) {
        char line[1024];
        if (fa_device_describe(FA_DEVICE_CUDA, d, line, sizeof line) != FA_OK)
            snprintf(line, sizeof line, "unavailable: %s", fa_last_error_message());
        printf("              cuda:%d: %s\n", (int)d, line);
    }
    const size_t nvars = sizeof k_env_vars / sizeof k_env_vars[0];
    int nset = 0;
    for (size_t v = 0; v < nvars; v++) {
        const char *val = getenv(k_env_vars[v]);
        if (val)
            printf("%s%s=%s\n", nset++ ? "              " : "environment:  ", k_env_vars[v], val);
    }
    if (!nset) {
        printf("environment:  none of");
        for (size_t v = 0; v < nvars; v++)
            printf(" %s%s", k_env_vars[v], v + 1 < nvars ? "," : " is set\n");
    }
    return 0;
}
