/* SPDX-License-Identifier: MIT */
/*
 * tools/cli/ — the `flashattn` command's entry (main.c's table of subcommands, `info`) and the
 * helpers every subcommand shares.
 *
 * main.c — the `flashattn` command: a table of subcommands and the dispatch to them.
 *
 *   flashattn <subcommand> [options]      flashattn <subcommand> --help for its options
 *   flashattn --help | --version
 *
 * A subcommand is one function in its own file (declared in cli.h). To add one, write the file
 * and add a row to the table below. An unknown subcommand prints the usage and exits with 2.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "flashattn.h"

typedef struct cli_command {
    const char *name;
    cli_command_fn run;
    const char *summary;
} cli_command;

static const cli_command commands[] = {
    {"verify", cmd_verify, "check every backend against the fp64 reference (exit 0 = all pass)"},
    {"demo", cmd_demo, "one long-sequence forward: time, GFLOP/s, memory vs naive attention"},
    {"bench", cmd_bench, "flash vs naive attention over a grid: time, GFLOP/s, % of peak, memory"},
    {"bench-decode", cmd_bench_decode, "decode step against a KV cache: time, GB/s, % of read bandwidth"},
    {"info", cmd_info, "version, build, threads and CUDA plug-in status"},
    {"doctor", cmd_doctor, "check this machine for flash-attn: driver, CUDA, gcc, torch, C++ ABI"},
    {"wheel", cmd_wheel, "name the flash-attn wheel for this machine, check one, or a build script"},
    {"explain", cmd_explain, "find the first real error in a flash-attn build log and its fix"},
};

#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    size_t i;
    fprintf(f, "usage: flashattn <subcommand> [options]\n"
               "       flashattn --help | --version\n"
               "\n"
               "FlashAttention in C: exact, fused, tiled attention with O(N) memory.\n"
               "\n"
               "subcommands:\n");
    for (i = 0; i < NUM_COMMANDS; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'flashattn <subcommand> --help' lists a subcommand's options.\n");
}

int main(int argc, char **argv) {
    size_t i;
    const char *name;

    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        if (argc > 2 && strcmp(name, "help") == 0) { /* "flashattn help verify" */
            for (i = 0; i < NUM_COMMANDS; i++) {
                if (!strcmp(argv[2], commands[i].name)) {
                    char help[] = "--help";
                    char *sub_argv[] = {argv[2], help, NULL};
                    return commands[i].run(2, sub_argv);
                }
            }
            fprintf(stderr, "flashattn: unknown subcommand '%s'\n\n", argv[2]);
            usage(stderr);
            return 2;
        }
        usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) {
        printf("flashattn %s (header %d.%d.%d)\n", fa_version_string(), FA_VERSION_MAJOR,
               FA_VERSION_MINOR, FA_VERSION_PATCH);
        return 0;
    }
    for (i = 0; i < NUM_COMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);

    fprintf(stderr, "flashattn: unknown subcommand '%s'\n\n", name);
    usage(stderr);
    return 2;
}
