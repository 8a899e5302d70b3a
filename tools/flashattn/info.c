/* SPDX-License-Identifier: MIT */
/*
 * info.c — `flashattn info`: what library this is and what it will run on. Prints the loaded
 * library's version (and whether it matches the header the tool was built with), its build
 * description, the thread count of the default context and the CUDA plug-in status.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "flashattn.h"

static void info_usage(FILE *f) {
    fprintf(f, "usage: flashattn info\n"
               "\n"
               "Prints the library version, its build description, the number of threads of the\n"
               "default context (FA_NUM_THREADS or the CPUs this process may use) and whether\n"
               "the CUDA plug-in is available.\n");
}

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
    printf("build:        %s\n", fa_build_info());
    printf("threads:      %d (default context)\n", (int)fa_context_num_threads(NULL));
    printf("backends:     cpu: available\n");
    if (fa_device_count(FA_DEVICE_CUDA, &ncuda) != FA_OK)
        printf("              cuda: unavailable: %s\n", fa_last_error_message());
    else if (ncuda == 0)
        printf("              cuda: the plug-in loaded, but no CUDA device is visible\n");
    else
        printf("              cuda: available, %d device%s (forward; see the build line)\n",
               (int)ncuda, ncuda == 1 ? "" : "s");
    return 0;
}
