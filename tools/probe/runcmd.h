/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * runcmd.h — runs a program (nvcc, gcc, python) the way the doctor needs: found on PATH like a
 * shell would, stdin from /dev/null, stdout and stderr captured separately up to a cap, killed
 * (with its process group) after a timeout. A missing or broken program is a result, not an
 * error: the caller reports it as a finding.
 */
#ifndef FA_TOOLS_RUNCMD_H
#define FA_TOOLS_RUNCMD_H

#include <stddef.h>

typedef struct run_result {
    int started;    /* the program was executed */
    int exec_errno; /* why it was not (ENOENT, EACCES, ...) */
    int exited;     /* it exited normally: exit_code is valid */
    int exit_code;
    int signal;      /* it was killed by this signal (0 if not) */
    int timed_out;   /* we killed it after the timeout */
    char *out, *err; /* NUL-terminated captures (never NULL after run_capture) */
    size_t out_len, err_len;
} run_result;

/* Runs argv[0] (searched on PATH when it has no '/') with argv. Captures at most `cap` bytes of
 * each stream (the rest is read and dropped). Returns 0 when a result was produced (check
 * r->started), -1 when the tool itself failed (out of memory, no pipes). */
int run_capture(const char *const *argv, double timeout_s, size_t cap, run_result *r);
void run_free(run_result *r);

/* The full path of an executable found on PATH (malloc'd), or NULL. */
char *path_find(const char *name);

/* The first line of s (at most cap-1 bytes) into buf; "" for NULL. */
void first_line(const char *s, char *buf, size_t cap);

#endif /* FA_TOOLS_RUNCMD_H */
