/* SPDX-License-Identifier: MIT */
/*
 * test_device_describe.c — fa_device_describe: the one-line description of a device.
 *
 * test_device_describe (no argument) points FA_CUDA_PLUGIN at a file that does not exist, as
 * test_cuda_errors does, and checks the CPU's line (the kernel set fa_build_info names, "; compiled
 * in: ..."), truncation at every small cap, and every argument error; CUDA fails with FA_ERR_DEVICE
 * naming that path. test_device_describe --cuda runs against the plug-in FA_CUDA_PLUGIN names
 * (skipped, 77, without a device): every device's line, truncation, index and device errors.
 * --fake adds what only tests/fake_cuda_plugin.c gives: its exact line, and an error of the
 * plug-in's own (FA_FAKE_DESCRIBE_FAIL) passed on with its message.
 * Every failing call must leave buf (poisoned with 0xA5) unchanged.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashattn.h"
#include "test.h"
#include "testutil.h"

#define POISON 0xA5
#define BUF 2048

static int poisoned(const char *buf, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if ((unsigned char)buf[i] != POISON)
            return 0;
    return 1;
}

/* A failing call: status `want`, buf untouched, a message containing `word` (when not NULL). */
static void check_fails(fa_device device, int32_t index, fa_status want, const char *word) {
    char buf[64];
    memset(buf, POISON, sizeof buf);
    CHECK_EQ_INT(fa_device_describe(device, index, buf, sizeof buf), want);
    CHECK_MSG(poisoned(buf, 0, sizeof buf), "device %d index %d: buf written on error", (int)device,
              (int)index);
    const char *m = fa_last_error_message();
    CHECK_MSG(m[0] != '\0', "device %d index %d: no error message", (int)device, (int)index);
    if (word)
        CHECK_MSG(strstr(m, word) != NULL, "message \"%s\" does not contain \"%s\"", m, word);
}

/* Describes (device, index) whole into line (cap BUF); checks it is one non-empty line and that
 * every smaller cap gives its prefix, NUL-terminated, with nothing written past cap. */
static void check_line(fa_device device, int32_t index, char *line) {
    memset(line, POISON, BUF);
    CHECK_EQ_INT(fa_device_describe(device, index, line, BUF), FA_OK);
    CHECK_EQ_STR(fa_last_error_message(), "");
    const size_t len = strnlen(line, BUF);
    REQUIRE(len < BUF);
    CHECK_MSG(len > 0, "device %d index %d: an empty line", (int)device, (int)index);
    CHECK_MSG(strchr(line, '\n') == NULL, "\"%s\" is more than one line", line);
    CHECK_MSG(poisoned(line, len + 1, BUF), "written past the line's NUL");
    char buf[BUF];
    for (size_t cap = 0; cap <= len + 1; cap++) {
        memset(buf, POISON, sizeof buf);
        CHECK_EQ_INT(fa_device_describe(device, index, buf, cap), FA_OK);
        if (cap == 0) {
            CHECK_MSG(poisoned(buf, 0, sizeof buf), "cap 0: buf written");
            continue;
        }
        CHECK_MSG(memcmp(buf, line, cap - 1) == 0 && buf[cap - 1] == '\0',
                  "cap %zu: \"%.*s\" is not the line's first %zu characters, NUL-terminated", cap,
                  (int)(cap - 1), buf, cap - 1);
        CHECK_MSG(poisoned(buf, cap, sizeof buf), "cap %zu: written past cap", cap);
    }
    CHECK_EQ_INT(fa_device_describe(device, index, NULL, 0), FA_OK);
}

/* Argument errors that do not depend on the plug-in. */
static void argument_errors(void) {
    CASE_BEGIN("argument errors");
    CHECK_EQ_INT(fa_device_describe(FA_DEVICE_CPU, 0, NULL, 16), FA_ERR_NULL_POINTER);
    CHECK_MSG(tu_contains_word(fa_last_error_message(), "buf"), "message \"%s\"",
              fa_last_error_message());
    CHECK_EQ_INT(fa_device_describe(FA_DEVICE_CUDA, 0, NULL, 1), FA_ERR_NULL_POINTER);
    check_fails((fa_device)7, 0, FA_ERR_DEVICE, "7");
    check_fails((fa_device)-1, 0, FA_ERR_DEVICE, "-1");
    check_fails(FA_DEVICE_CPU, 1, FA_ERR_DEVICE, "device_index 1");
    check_fails(FA_DEVICE_CPU, -1, FA_ERR_DEVICE, "device_index -1");
    CASE_END();
}

static void cpu_line(void) {
    CASE_BEGIN("FA_DEVICE_CPU");
    char line[BUF];
    check_line(FA_DEVICE_CPU, 0, line);
    const char *prefix = "CPU, kernels ";
    CHECK_MSG(strncmp(line, prefix, strlen(prefix)) == 0, "\"%s\" does not start \"%s\"", line,
              prefix);
    CHECK_MSG(strstr(line, "; compiled in: ref") != NULL, "\"%s\" lists no kernel sets", line);
    /* the set in use is the one fa_build_info names */
    char want[96];
    snprintf(want, sizeof want, "in use: %.*s", (int)strcspn(line + strlen(prefix), " ;"),
             line + strlen(prefix));
    CHECK_MSG(strstr(fa_build_info(), want) != NULL, "fa_build_info \"%s\" lacks \"%s\"",
              fa_build_info(), want);
    CASE_END();
}

static int no_plugin(void) {
    char path[256];
    snprintf(path, sizeof path, "/nonexistent-flashattn-%ld/libflashattn_cuda.so", (long)getpid());
    if (setenv("FA_CUDA_PLUGIN", path, 1) != 0) {
        printf("setenv failed\n");
        return 1;
    }
    argument_errors();
    cpu_line();
    CASE_BEGIN("FA_DEVICE_CUDA without the plug-in");
    check_fails(FA_DEVICE_CUDA, 0, FA_ERR_DEVICE, path);
    check_fails(FA_DEVICE_CUDA, -1, FA_ERR_DEVICE, path);
    CASE_END();
    return TEST_REPORT();
}

static int with_plugin(int fake) {
    int32_t n = -1;
    const fa_status st = fa_device_count(FA_DEVICE_CUDA, &n);
    if (st != FA_OK || n <= 0) {
        printf("SKIP: no CUDA device: %s\n", st != FA_OK ? fa_last_error_message() : "0 devices");
        return TU_SKIP;
    }
    printf("%s\n", fa_build_info());
    argument_errors();
    cpu_line();
    for (int32_t i = 0; i < n; i++) {
        CASE_BEGIN("CUDA device %d", (int)i);
        char line[BUF];
        check_line(FA_DEVICE_CUDA, i, line);
        printf("cuda:%d: %s\n", (int)i, line);
        if (fake)
            CHECK_EQ_STR(line, "fake device (host memory)");
        CASE_END();
    }
    CASE_BEGIN("CUDA device_index outside 0..%d", (int)n - 1);
    check_fails(FA_DEVICE_CUDA, n, FA_ERR_DEVICE, "does not exist");
    check_fails(FA_DEVICE_CUDA, -1, FA_ERR_DEVICE, "does not exist");
    CASE_END();
    if (fake) {
        CASE_BEGIN("the plug-in's own error");
        setenv("FA_FAKE_DESCRIBE_FAIL", "1", 1);
        check_fails(FA_DEVICE_CUDA, 0, FA_ERR_INTERNAL, "fake plug-in: device_describe failed");
        unsetenv("FA_FAKE_DESCRIBE_FAIL");
        char line[BUF];
        check_line(FA_DEVICE_CUDA, 0, line); /* and it works again */
        CASE_END();
    }
    return TEST_REPORT();
}

int main(int argc, char **argv) {
    if (argc == 1)
        return no_plugin();
    if (argc == 2 && (!strcmp(argv[1], "--cuda") || !strcmp(argv[1], "--fake")))
        return with_plugin(!strcmp(argv[1], "--fake"));
    fprintf(stderr, "usage: %s [--cuda | --fake]\n", argv[0]);
    return 2;
}
