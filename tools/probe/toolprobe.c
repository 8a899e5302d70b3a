/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * toolprobe.c — the CUDA toolkit and the host compilers a flash-attn source build uses.
 *
 * The toolkit is found the way torch.utils.cpp_extension finds it (so the doctor sees what a
 * build would see): $CUDA_HOME, else $CUDA_PATH, else the directory above the nvcc on PATH, else
 * /usr/local/cuda if it exists. For that toolkit: its nvcc's release, the headers torch's
 * extension headers include, and the newest gcc its crt/host_config.h accepts
 * ("#if __GNUC__ > N" ... "#error -- unsupported GNU version!").
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "envprobe.h"
#include "runcmd.h"

static int is_dir(const char *p) {
    struct stat st;
    return p && *p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Runs `path --version` (nvcc) and takes "release X.Y". */
static void nvcc_version(env_tool *t, double timeout_s) {
    const char *argv[3];
    run_result r;
    const char *p;
    argv[0] = t->path;
    argv[1] = "--version";
    argv[2] = NULL;
    if (run_capture(argv, timeout_s, 1 << 16, &r) != 0)
        return;
    if (!r.started) {
        snprintf(t->error, sizeof t->error, "cannot run %.200s", t->path);
    } else if (r.timed_out) {
        snprintf(t->error, sizeof t->error, "%.200s --version did not finish", t->path);
    } else if ((p = strstr(r.out, "release ")) != NULL) {
        t->ran = 1;
        p += strlen("release ");
        snprintf(t->version, sizeof t->version, "%.*s", (int)strcspn(p, ", \n"), p);
        env_parse_mm(t->version, &t->major, &t->minor);
        {
            const char *l = strstr(r.out, "Cuda compilation tools");
            first_line(l ? l : r.out, t->line, sizeof t->line);
        }
    } else {
        char line[200];
        first_line(r.err[0] ? r.err : r.out, line, sizeof line);
        snprintf(t->error, sizeof t->error, "%.100s --version printed no release: %.100s", t->path,
                 line);
    }
    run_free(&r);
}

/* "#if __GNUC__ > 15" in crt/host_config.h: the newest gcc major this nvcc accepts. */
static int host_gcc_max(const char *home, char *path, unsigned cap) {
    static const char *const rel[] = {"include/crt/host_config.h",
                                      "targets/x86_64-linux/include/crt/host_config.h",
                                      "targets/sbsa-linux/include/crt/host_config.h", NULL};
    int i;
    for (i = 0; rel[i]; i++) {
        char p[ENV_PATH_LEN + 64];
        FILE *f;
        char line[512];
        snprintf(p, sizeof p, "%s/%s", home, rel[i]);
        f = fopen(p, "r");
        if (!f)
            continue;
        env_copy(path, cap, p);
        while (fgets(line, sizeof line, f)) {
            const char *q = strstr(line, "__GNUC__ >");
            if (q && !strncmp(line, "#if", 3) && !strstr(line, "__GNUC__ >=")) {
                int v = atoi(q + strlen("__GNUC__ >"));
                if (v > 0) {
                    fclose(f);
                    return v;
                }
            }
        }
        fclose(f);
    }
    return 0;
}

void probe_cuda(env_cuda *c, double timeout_s) {
    const char *home_env = getenv("CUDA_HOME");
    const char *path_env = getenv("CUDA_PATH");
    const char *dflt = getenv("FLASHATTN_DOCTOR_DEFAULT_CUDA");
    char *nvcc;
    memset(c, 0, sizeof *c);
    env_copy(c->cuda_home_env, sizeof c->cuda_home_env, home_env);
    env_copy(c->cuda_path_env, sizeof c->cuda_path_env, path_env);
    if (!dflt || !*dflt)
        dflt = "/usr/local/cuda";

    nvcc = path_find("nvcc");
    if (nvcc) {
        c->nvcc.found = 1;
        env_copy(c->nvcc.path, sizeof c->nvcc.path, nvcc);
        nvcc_version(&c->nvcc, timeout_s);
    }

    if (home_env && *home_env) {
        env_copy(c->home, sizeof c->home, home_env);
        env_copy(c->home_source, sizeof c->home_source, "CUDA_HOME");
    } else if (path_env && *path_env) {
        env_copy(c->home, sizeof c->home, path_env);
        env_copy(c->home_source, sizeof c->home_source, "CUDA_PATH");
    } else if (nvcc) {
        char tmp[ENV_PATH_LEN], *slash;
        env_copy(tmp, sizeof tmp, nvcc);
        slash = strrchr(tmp, '/');
        if (slash)
            *slash = '\0';
        slash = strrchr(tmp, '/');
        if (slash && slash != tmp)
            *slash = '\0';
        env_copy(c->home, sizeof c->home, tmp);
        env_copy(c->home_source, sizeof c->home_source, "nvcc on PATH");
    } else if (strcmp(dflt, "none") != 0 && is_dir(dflt)) {
        env_copy(c->home, sizeof c->home, dflt);
        env_copy(c->home_source, sizeof c->home_source, "default");
    }
    free(nvcc);
    if (!c->home[0])
        return;
    c->home_exists = is_dir(c->home);
    if (!c->home_exists)
        return;
    {
        char p[ENV_PATH_LEN + 16];
        snprintf(p, sizeof p, "%s/bin/nvcc", c->home);
        if (is_file(p) && access(p, X_OK) == 0) {
            c->home_nvcc.found = 1;
            env_copy(c->home_nvcc.path, sizeof c->home_nvcc.path, p);
            if (c->nvcc.found && !strcmp(c->nvcc.path, p))
                c->home_nvcc = c->nvcc;
            else
                nvcc_version(&c->home_nvcc, timeout_s);
        }
    }
    {
        static const char *const headers[] = {"cuda_runtime.h", "cublas_v2.h", "cusparse.h",
                                              "cusolverDn.h", NULL};
        int i;
        size_t len = 0;
        c->headers_checked = 1;
        for (i = 0; headers[i]; i++) {
            char p[ENV_PATH_LEN + 32], q[ENV_PATH_LEN + 64];
            snprintf(p, sizeof p, "%s/include/%s", c->home, headers[i]);
            snprintf(q, sizeof q, "%s/targets/x86_64-linux/include/%s", c->home, headers[i]);
            if (!is_file(p) && !is_file(q))
                len += (size_t)snprintf(c->missing_headers + len, sizeof c->missing_headers - len,
                                        "%s%s", len ? " " : "", headers[i]);
            if (len >= sizeof c->missing_headers)
                len = sizeof c->missing_headers - 1;
        }
    }
    c->host_gcc_max = host_gcc_max(c->home, c->host_config, sizeof c->host_config);
}

/* `cc -dumpfullversion -dumpversion` and the first line of `cc --version`. */
static void compiler(env_tool *t, const char *name, double timeout_s) {
    char *p = path_find(name);
    const char *argv[4];
    run_result r;
    memset(t, 0, sizeof *t);
    if (!p)
        return;
    t->found = 1;
    env_copy(t->path, sizeof t->path, p);
    free(p);
    argv[0] = t->path;
    argv[1] = "-dumpfullversion";
    argv[2] = "-dumpversion";
    argv[3] = NULL;
    if (run_capture(argv, timeout_s, 4096, &r) == 0) {
        if (r.started && r.exited && r.exit_code == 0) {
            char line[64];
            first_line(r.out, line, sizeof line);
            if (env_parse_mm(line, &t->major, &t->minor) == 0) {
                env_copy(t->version, sizeof t->version, line);
                t->ran = 1;
            }
        }
        run_free(&r);
    }
    argv[1] = "--version";
    argv[2] = NULL;
    if (run_capture(argv, timeout_s, 4096, &r) == 0) {
        first_line(r.out, t->line, sizeof t->line);
        if (!t->ran)
            snprintf(t->error, sizeof t->error, "%.200s did not report a version", t->path);
        run_free(&r);
    }
}

void probe_cxx(env_cxx *x, double timeout_s) {
    int v;
    size_t len = 0;
    memset(x, 0, sizeof *x);
    compiler(&x->gcc, "gcc", timeout_s);
    compiler(&x->gxx, "g++", timeout_s);
    for (v = 7; v <= 16; v++) {
        char name[16];
        char *p;
        snprintf(name, sizeof name, "gcc-%d", v);
        p = path_find(name);
        if (p) {
            char gxx[16], *q;
            snprintf(gxx, sizeof gxx, "g++-%d", v);
            q = path_find(gxx);
            if (q && len + 8 < sizeof x->other_gcc)
                len += (size_t)snprintf(x->other_gcc + len, sizeof x->other_gcc - len, "%s%d",
                                        len ? " " : "", v);
            free(q);
            free(p);
        }
    }
}
