/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * runcmd.c — fork/exec with captured output and a timeout (see runcmd.h). The child gets its
 * own process group so a timeout also kills what it started (python's children, nvcc's cc1).
 * exec failures come back through a close-on-exec pipe, so "not found" and "exit 127" differ.
 */
#define _POSIX_C_SOURCE 200809L

#include "runcmd.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char *path_find(const char *name) {
    const char *path = getenv("PATH");
    const char *p;
    if (!name || !*name)
        return NULL;
    if (strchr(name, '/')) {
        return access(name, X_OK) == 0 ? strdup(name) : NULL;
    }
    if (!path)
        path = "/usr/bin:/bin";
    p = path;
    for (;;) {
        size_t n = strcspn(p, ":");
        size_t len = (n ? n : 1) + 1 + strlen(name) + 1;
        char *full = malloc(len);
        struct stat st;
        if (!full)
            return NULL;
        if (n)
            snprintf(full, len, "%.*s/%s", (int)n, p, name);
        else
            snprintf(full, len, "./%s", name);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode) && access(full, X_OK) == 0)
            return full;
        free(full);
        if (p[n] == '\0')
            break;
        p += n + 1;
    }
    return NULL;
}

void first_line(const char *s, char *buf, size_t cap) {
    size_t n;
    if (!cap)
        return;
    if (!s) {
        buf[0] = '\0';
        return;
    }
    while (*s == '\n' || *s == '\r')
        s++;
    n = strcspn(s, "\r\n");
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct cap_buf {
    char *s;
    size_t len, cap;
} cap_buf;

static void cap_add(cap_buf *b, const char *data, size_t n) {
    size_t room = b->cap - b->len;
    if (n > room)
        n = room;
    memcpy(b->s + b->len, data, n);
    b->len += n;
    b->s[b->len] = '\0';
}

int run_capture(const char *const *argv, double timeout_s, size_t cap, run_result *r) {
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, execp[2] = {-1, -1};
    pid_t pid;
    cap_buf ob, eb;
    double deadline;
    int open_fds = 2, status = 0;
    char *prog;

    memset(r, 0, sizeof *r);
    ob.s = malloc(cap + 1);
    eb.s = malloc(cap + 1);
    if (!ob.s || !eb.s) {
        free(ob.s);
        free(eb.s);
        return -1;
    }
    ob.len = eb.len = 0;
    ob.cap = eb.cap = cap;
    ob.s[0] = eb.s[0] = '\0';
    r->out = ob.s;
    r->err = eb.s;

    prog = path_find(argv[0]);
    if (!prog) {
        r->exec_errno = ENOENT;
        return 0;
    }
    if (pipe(outp) != 0 || pipe(errp) != 0 || pipe(execp) != 0) {
        free(prog);
        if (outp[0] >= 0) {
            close(outp[0]);
            close(outp[1]);
        }
        if (errp[0] >= 0) {
            close(errp[0]);
            close(errp[1]);
        }
        return -1;
    }
    fcntl(execp[1], F_SETFD, FD_CLOEXEC);
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        free(prog);
        close(outp[0]);
        close(outp[1]);
        close(errp[0]);
        close(errp[1]);
        close(execp[0]);
        close(execp[1]);
        return -1;
    }
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        int e;
        setpgid(0, 0);
        if (devnull >= 0) {
            dup2(devnull, 0);
            close(devnull);
        }
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        close(outp[0]);
        close(outp[1]);
        close(errp[0]);
        close(errp[1]);
        close(execp[0]);
        execv(prog, (char *const *)argv);
        e = errno;
        if (write(execp[1], &e, sizeof e) < 0) {
            /* nothing more to do */
        }
        _exit(127);
    }
    free(prog);
    close(outp[1]);
    close(errp[1]);
    close(execp[1]);
    {
        int e = 0;
        ssize_t n;
        do {
            n = read(execp[0], &e, sizeof e);
        } while (n < 0 && errno == EINTR);
        close(execp[0]);
        if (n == (ssize_t)sizeof e) {
            r->exec_errno = e;
            close(outp[0]);
            close(errp[0]);
            waitpid(pid, &status, 0);
            return 0;
        }
    }
    r->started = 1;
    deadline = now_s() + timeout_s;
    while (open_fds > 0) {
        struct pollfd pf[2];
        int nf = 0, k, ms;
        double left = deadline - now_s();
        if (left <= 0) {
            r->timed_out = 1;
            break;
        }
        ms = left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
        if (outp[0] >= 0) {
            pf[nf].fd = outp[0];
            pf[nf++].events = POLLIN;
        }
        if (errp[0] >= 0) {
            pf[nf].fd = errp[0];
            pf[nf++].events = POLLIN;
        }
        k = poll(pf, (nfds_t)nf, ms);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            break;
        for (k = 0; k < nf; k++) {
            char chunk[4096];
            ssize_t n;
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            n = read(pf[k].fd, chunk, sizeof chunk);
            if (n > 0) {
                cap_add(pf[k].fd == outp[0] ? &ob : &eb, chunk, (size_t)n);
            } else if (n == 0 || errno != EINTR) {
                if (pf[k].fd == outp[0]) {
                    close(outp[0]);
                    outp[0] = -1;
                } else {
                    close(errp[0]);
                    errp[0] = -1;
                }
                open_fds--;
            }
        }
    }
    if (outp[0] >= 0)
        close(outp[0]);
    if (errp[0] >= 0)
        close(errp[0]);
    if (r->timed_out) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
    }
    /* the pipes are closed; wait for the exit, but not forever (a child that closed its output
     * early and keeps running) */
    {
        double wait_deadline = now_s() + (r->timed_out ? 5.0 : timeout_s);
        for (;;) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid)
                break;
            if (w < 0 && errno != EINTR)
                break;
            if (now_s() > wait_deadline) {
                r->timed_out = 1;
                kill(-pid, SIGKILL);
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                break;
            }
            {
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
    }
    r->out_len = ob.len;
    r->err_len = eb.len;
    if (WIFEXITED(status)) {
        r->exited = 1;
        r->exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        r->signal = WTERMSIG(status);
    }
    return 0;
}

void run_free(run_result *r) {
    if (!r)
        return;
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}
