/* SPDX-License-Identifier: MIT */
/*
 * tools/wheel/ — `flashattn wheel`: the flash-attn wheel that fits this machine, from the release
 * table.
 *
 * wheel.c — `flashattn wheel`: the flash-attn wheel arithmetic people do by hand.
 *
 *   flashattn wheel [--flash-attn VERSION]   the release wheel (file name and URL) for this
 *                                            machine's Python tag, torch major.minor, CUDA major
 *                                            and C++ ABI, or why none exists and what instead
 *   flashattn wheel --check FILE.whl         every mismatch between a wheel's name and here
 *   flashattn wheel --build-script           a shell script that builds flash-attn from source
 *                                            correctly on this machine
 *   flashattn wheel --refresh                the release table from flash-attn's release listing,
 *                                            cached per user (refresh.c)
 *
 * The machine comes from the probes (envprobe.h); --python/--torch/--cuda/--abi/--platform/
 * --glibc describe another one (nothing is probed that is given). Only --refresh uses the
 * network: the answer comes from the release table (the cached one when --refresh wrote it, else
 * the bundled one in releases.c) and the naming rules there.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/cli.h"
#include "../cli/json.h"
#include "../probe/envprobe.h"
#include "../probe/verutil.h"
#include "flashattn.h"
#include "refresh.h"
#include "releases.h"

static void wheel_usage(FILE *f) {
    fprintf(f,
            "usage: flashattn wheel [--flash-attn VERSION] [--json]\n"
            "       flashattn wheel --check FILE.whl [--json]\n"
            "       flashattn wheel --build-script [--flash-attn VERSION]\n"
            "       flashattn wheel --refresh\n"
            "\n"
            "Names the flash-attn release wheel (file and URL) that matches this machine's Python\n"
            "tag, torch major.minor, CUDA major and C++ ABI flag, following each release line's\n"
            "naming rules, or says why none exists and what to do instead. --check lists every\n"
            "mismatch between a wheel file name and this machine. --build-script prints a shell\n"
            "script that builds flash-attn from source here (CUDA_HOME, CC/CXX, arch lists,\n"
            "MAX_JOBS/NVCC_THREADS from RAM, the ABI flag from torch, clean build, import check).\n"
            "--refresh reads flash-attn's release listing (GitHub's releases API, or the URL in\n"
            "FLASHATTN_RELEASES_URL; file:// too) with curl or wget into\n"
            "$XDG_CACHE_HOME/flashattn/releases.tsv, which later runs read first.\n"
            "\n"
            "Describe another machine instead of probing this one:\n"
            "  --python cpXY|3.Y   --torch X.Y[.Z]   --cuda X.Y|none   --abi TRUE|FALSE\n"
            "  --platform linux_x86_64|MACHINE   --glibc X.Y   --cc X.Y (newest GPU)\n"
            "  --no-python         do not run Python (give --python/--torch/--cuda/--abi)\n"
            "\n"
            "Known releases:");
    {
        size_t i;
        for (i = 0; i < rel_nreleases; i++)
            fprintf(f, " %s", rel_releases[i].version);
    }
    fprintf(f, "\n");
}

typedef struct wheel_opts {
    const char *fa_version;
    const char *check;
    int build_script, json, no_python, refresh;
    const char *python, *torch, *cuda, *abi, *platform, *glibc, *cc;
} wheel_opts;

/* ---- the target ------------------------------------------------------------------------------ */

static int apply_overrides(const wheel_opts *o, rel_target *t) {
    if (o->python) {
        int maj = 0, min = 0;
        if (!strncmp(o->python, "cp", 2) && strlen(o->python) >= 4) {
            min = atoi(o->python + 3);
            maj = o->python[2] - '0';
        } else if (env_parse_mm(o->python, &maj, &min) != 0) {
            return -1;
        }
        if (maj != 3 || min <= 0)
            return -1;
        snprintf(t->pytag, sizeof t->pytag, "cp3%d", min);
        t->py_minor = min;
    }
    if (o->torch) {
        int maj = 0, min = 0;
        if (!strcmp(o->torch, "none")) {
            t->torch_mm[0] = '\0';
        } else {
            if (env_parse_mm(o->torch, &maj, &min) != 0)
                return -1;
            snprintf(t->torch_mm, sizeof t->torch_mm, "%d.%d", maj, min);
        }
    }
    if (o->cuda) {
        int maj = 0, min = 0;
        if (!strcmp(o->cuda, "none") || !strcmp(o->cuda, "None"))
            t->torch_cuda[0] = '\0';
        else if (env_parse_mm(o->cuda, &maj, &min) == 0)
            snprintf(t->torch_cuda, sizeof t->torch_cuda, "%d.%d", maj, min);
        else
            return -1;
    }
    if (o->abi) {
        if (!strcmp(o->abi, "TRUE") || !strcmp(o->abi, "True") || !strcmp(o->abi, "1") ||
            !strcmp(o->abi, "true"))
            t->abi = 1;
        else if (!strcmp(o->abi, "FALSE") || !strcmp(o->abi, "False") || !strcmp(o->abi, "0") ||
                 !strcmp(o->abi, "false"))
            t->abi = 0;
        else
            return -1;
    }
    if (o->platform) {
        const char *m = !strncmp(o->platform, "linux_", 6) ? o->platform + 6 : o->platform;
        env_copy(t->machine, sizeof t->machine, m);
    }
    if (o->glibc)
        env_copy(t->glibc, sizeof t->glibc, o->glibc);
    if (o->cc && env_parse_mm(o->cc, &t->cc_major, &t->cc_minor) != 0)
        return -1;
    return 0;
}

static void describe_target(const rel_target *t, char *buf, size_t cap) {
    char torch[64], gpu[32];
    if (!t->torch_mm[0])
        snprintf(torch, sizeof torch, "no torch");
    else
        snprintf(torch, sizeof torch, "torch %s with CUDA %s", t->torch_mm,
                 t->torch_cuda[0] ? t->torch_cuda : "none (CPU-only)");
    if (t->cc_major)
        snprintf(gpu, sizeof gpu, "GPU sm_%d%d", t->cc_major, t->cc_minor);
    else
        snprintf(gpu, sizeof gpu, "no GPU visible");
    snprintf(buf, cap, "Python %s, %s, C++11 ABI %s, %s, glibc %s, %s",
             t->pytag[0] ? t->pytag : "?", torch,
             t->abi < 0 ? "?"
             : t->abi   ? "TRUE"
                        : "FALSE",
             t->machine[0] ? t->machine : "?", t->glibc[0] ? t->glibc : "?", gpu);
}

/* ---- naming one release ---------------------------------------------------------------------- */

static void name_for(const char *version, const rel_target *t, char *wheel, size_t wcap, char *url,
                     size_t ucap, char *note, size_t ncap) {
    char cu[16], plat[48];
    if (rel_cuda_tag(version, t->torch_cuda, cu, sizeof cu, note, ncap) != 0)
        snprintf(cu, sizeof cu, "?");
    rel_platform_tag(version, t->machine, plat, sizeof plat);
    rel_wheel_name(version, cu, t->torch_mm[0] ? t->torch_mm : "?", t->abi != 0,
                   t->pytag[0] ? t->pytag : "cp3?", plat, wheel, wcap);
    rel_wheel_url(version, wheel, url, ucap);
}

/* A torch this flash-attn release has wheels for, closest to (and preferably below) the
 * current one: what to install instead. */
static const char *torch_instead(const rel_info *r, const rel_target *t) {
    static char best[16];
    const char *p = r->torch;
    best[0] = '\0';
    while (*p) {
        char v[16];
        size_t k = strcspn(p, " ");
        int lo, hi;
        snprintf(v, sizeof v, "%.*s", (int)k, p);
        if (!t->py_minor ||
            (rel_torch_python(v, &lo, &hi) == 0 && t->py_minor >= lo && t->py_minor <= hi))
            snprintf(best, sizeof best, "%s", v); /* the list is ascending: keep the newest */
        p += k;
        while (*p == ' ')
            p++;
    }
    return best[0] ? best : NULL;
}

static int cmd_name(const wheel_opts *o, const rel_target *t) {
    char desc[256], wheel[256], url[512], note[256], why[512], issues[512];
    const rel_info *r;
    rel_choice c;
    describe_target(t, desc, sizeof desc);

    if (o->fa_version) {
        r = rel_find(o->fa_version);
        name_for(o->fa_version, t, wheel, sizeof wheel, url, sizeof url, note, sizeof note);
        if (r) {
            int has = rel_has_wheel(r, t, why, sizeof why);
            int n_issues = rel_runtime_issues(r->version, t, issues, sizeof issues);
            if (o->json) {
                printf("{\"flash_attn\": ");
                json_string(stdout, o->fa_version);
                printf(", \"release_table_checked\": \"%s\", \"release_table\": ", rel_checked);
                json_string(stdout, rel_source);
                printf(", \"known_release\": true, \"exists\": %s, \"wheel\": ",
                       has ? "true" : "false");
                json_string(stdout, has ? wheel : NULL);
                printf(", \"url\": ");
                json_string(stdout, has ? url : NULL);
                printf(", \"guessed_by_setup_py\": ");
                json_string(stdout, wheel);
                printf(", \"why_not\": ");
                json_string(stdout, has ? NULL : why);
                printf(", \"runtime_issues\": ");
                json_string(stdout, n_issues ? issues : NULL);
                printf(", \"machine\": ");
                json_string(stdout, desc);
                printf("}\n");
                return has ? 0 : 1;
            }
            printf("this machine: %s\n\n", desc);
            if (has) {
                printf("flash-attn %s has a wheel for it:\n  %s\n  %s\n", r->version, wheel, url);
                if (n_issues)
                    printf("\nbut it will not work here: %s\n", issues);
                printf("\ninstall: pip install %s\n", url);
                return n_issues ? 1 : 0;
            }
            printf("flash-attn %s has no wheel for it: %s\n", r->version, why);
            printf("(setup.py would try %s, get HTTP 404 and compile from source)\n", wheel);
            if (note[0])
                printf("note: %s\n", note);
            if (rel_choose(t, &c))
                printf("\ninstead: flash-attn %s has one:\n  %s\n  pip install %s\n",
                       c.rel->version, c.wheel, c.url);
            else if (t->torch_mm[0] && torch_instead(r, t))
                printf("\ninstead: install torch %s, for which %s has wheels, or build from "
                       "source: flashattn wheel --build-script --flash-attn %s > build.sh\n",
                       torch_instead(r, t), r->version, r->version);
            return 1;
        }
        /* a version outside the table: the rules of its release line still name the file */
        if (o->json) {
            printf("{\"flash_attn\": ");
            json_string(stdout, o->fa_version);
            printf(", \"release_table_checked\": \"%s\", \"release_table\": ", rel_checked);
            json_string(stdout, rel_source);
            printf(", \"known_release\": false, \"exists\": null, \"wheel\": ");
            json_string(stdout, wheel);
            printf(", \"url\": ");
            json_string(stdout, url);
            printf(", \"machine\": ");
            json_string(stdout, desc);
            printf("}\n");
            return 0;
        }
        printf("this machine: %s\n\n", desc);
        printf("flash-attn %s is not in flashattn's release table, so whether it was published is "
               "unknown; by the naming rules of its release line, setup.py would download:\n  %s\n"
               "  %s\n",
               o->fa_version, wheel, url);
        if (note[0])
            printf("note: %s\n", note);
        return 0;
    }

    /* no version asked: the newest release that fits */
    if (!t->torch_mm[0] || !t->torch_cuda[0] || t->abi < 0) {
        rel_target u = *t;
        const char *why_none = !t->torch_mm[0]     ? "torch is not installed"
                               : !t->torch_cuda[0] ? "torch is a CPU-only build"
                                                   : "torch's C++ ABI flag is unknown";
        env_copy(u.torch_mm, sizeof u.torch_mm, "2.8");
        env_copy(u.torch_cuda, sizeof u.torch_cuda, "12.8");
        u.abi = 1;
        if (o->json) {
            printf("{\"exists\": false, \"wheel\": null, \"url\": null, \"why_not\": ");
            json_string(stdout, why_none);
            printf(", \"machine\": ");
            json_string(stdout, desc);
            if (rel_choose(&u, &c)) {
                printf(", \"with_torch_2_8_cu128\": ");
                json_string(stdout, c.url);
            }
            printf("}\n");
            return 1;
        }
        printf("this machine: %s\n\n", desc);
        printf("no wheel can be named: %s. flash-attn wheels are built per torch version and "
               "need a CUDA build of torch.\n",
               why_none);
        if (rel_choose(&u, &c))
            printf("\nwith torch 2.8 for CUDA 12.8 (pip install 'torch==2.8.*' --index-url "
                   "https://download.pytorch.org/whl/cu128) it would be flash-attn %s:\n  %s\n  "
                   "pip install %s\n",
                   c.rel->version, c.wheel, c.url);
        return 1;
    }
    if (rel_choose(t, &c)) {
        int latest = c.rel == &rel_releases[0];
        if (o->json) {
            printf("{\"flash_attn\": ");
            json_string(stdout, c.rel->version);
            printf(", \"release_table_checked\": \"%s\", \"release_table\": ", rel_checked);
            json_string(stdout, rel_source);
            printf(", \"known_release\": true, \"exists\": true, \"wheel\": ");
            json_string(stdout, c.wheel);
            printf(", \"url\": ");
            json_string(stdout, c.url);
            printf(", \"runtime_issues\": ");
            json_string(stdout, c.issues[0] ? c.issues : NULL);
            printf(", \"machine\": ");
            json_string(stdout, desc);
            printf("}\n");
            return c.issues[0] ? 1 : 0;
        }
        printf("this machine: %s\n\n", desc);
        printf("flash-attn %s%s:\n  %s\n  %s\n", c.rel->version,
               latest ? " (the newest release)" : " (the newest release with a wheel that fits)",
               c.wheel, c.url);
        if (!strcmp(rel_source, "bundled"))
            printf("(flashattn's release table was checked on %s; a newer release is not in it)\n",
                   rel_checked);
        else
            printf("(flashattn's release table was fetched on %s into %s; a newer release is not "
                   "in it)\n",
                   rel_checked, rel_source);
        if (!latest) {
            rel_has_wheel(&rel_releases[0], t, why, sizeof why);
            if (why[0])
                printf("\nflash-attn %s has none: %s\n", rel_releases[0].version, why);
            else if (rel_runtime_issues(rel_releases[0].version, t, issues, sizeof issues))
                printf("\nflash-attn %s has one, but: %s\n", rel_releases[0].version, issues);
        }
        if (c.issues[0])
            printf("\nbut it will not work here: %s\n", c.issues);
        if (t->glibc[0] && ver_cmp(t->glibc, c.rel->glibc) < 0)
            printf("community-built wheels for older glibc (manylinux tags; check one with "
                   "flashattn wheel --check FILE.whl): "
                   "https://github.com/mjun0812/flash-attention-prebuild-wheels\n");
        printf("\ninstall: pip install %s\n", c.url);
        return c.issues[0] ? 1 : 0;
    }
    /* none at all */
    name_for(rel_latest(), t, wheel, sizeof wheel, url, sizeof url, note, sizeof note);
    rel_has_wheel(&rel_releases[0], t, why, sizeof why);
    if (o->json) {
        printf("{\"exists\": false, \"wheel\": null, \"url\": null, \"guessed_by_setup_py\": ");
        json_string(stdout, wheel);
        printf(", \"why_not\": ");
        json_string(stdout, why);
        printf(", \"machine\": ");
        json_string(stdout, desc);
        printf("}\n");
        return 1;
    }
    printf("this machine: %s\n\n", desc);
    printf("no known flash-attn release has a wheel for it. flash-attn %s: %s\n", rel_latest(),
           why);
    printf("(pip install flash-attn would try %s, get HTTP 404 and compile from source for "
           "hours)\n",
           wheel);
    if (note[0])
        printf("note: %s\n", note);
    printf("\nwhat to do instead:\n");
    {
        const char *tv = torch_instead(&rel_releases[0], t);
        if (tv && strcmp(tv, t->torch_mm) != 0)
            printf("  - install torch %s (flash-attn %s has wheels for it), then run flashattn "
                   "wheel again\n",
                   tv, rel_latest());
    }
    printf("  - build from source here: flashattn wheel --build-script > build.sh && sh "
           "build.sh\n");
    if (t->machine[0] && strcmp(t->machine, "x86_64") != 0)
        printf("  - community-built wheels for %s (and Windows, and other torch/CUDA pairs): "
               "https://github.com/mjun0812/flash-attention-prebuild-wheels (releases; search "
               "page https://mjunya.com/flash-attention-prebuild-wheels/). Check one first: "
               "flashattn wheel --check FILE.whl\n",
               t->machine);
    printf("  - use flashattn (this project): flash_attn_func over ctypes, one py3-none wheel "
           "for every Python and torch, nothing to compile against them (every feature on the "
           "CPU; on NVIDIA GPUs its CUDA plug-in runs the forward, backward, KV cache and "
           "combine, not yet run on a GPU)\n");
    return 1;
}

/* ---- --check --------------------------------------------------------------------------------- */

/* One platform tag of a wheel name (a name may hold several, '.'-separated). */
typedef struct plat_tag {
    enum { PLAT_OTHER, PLAT_ANY, PLAT_LINUX, PLAT_MANYLINUX, PLAT_MUSLLINUX } kind;
    char arch[32];  /* "x86_64"; "" for any and for other platforms */
    char glibc[16]; /* the glibc a manylinux tag needs ("2.17"); "" for the others */
} plat_tag;

/* Parses tag[0..len): linux_ARCH (built for this kind of machine, no floor), manylinux_X_Y_ARCH
 * (PEP 600: glibc >= X.Y) and its legacy aliases manylinux1 (2.5), manylinux2010 (2.12) and
 * manylinux2014 (2.17), musllinux_X_Y_ARCH (musl libc, not glibc), any. */
static void parse_plat(const char *tag, size_t len, plat_tag *p) {
    static const struct {
        const char *prefix, *glibc;
    } legacy[] = {{"manylinux1_", "2.5"}, {"manylinux2010_", "2.12"}, {"manylinux2014_", "2.17"}};
    char t[64];
    const char *rest = NULL;
    size_t i;
    memset(p, 0, sizeof p[0]);
    p->kind = PLAT_OTHER;
    snprintf(t, sizeof t, "%.*s", (int)len, tag);
    if (!strcmp(t, "any")) {
        p->kind = PLAT_ANY;
        return;
    }
    for (i = 0; i < sizeof legacy / sizeof legacy[0] && !rest; i++) {
        if (!strncmp(t, legacy[i].prefix, strlen(legacy[i].prefix))) {
            rest = t + strlen(legacy[i].prefix);
            p->kind = PLAT_MANYLINUX;
            env_copy(p->glibc, sizeof p->glibc, legacy[i].glibc);
        }
    }
    if (!rest && (!strncmp(t, "manylinux_", 10) || !strncmp(t, "musllinux_", 10))) {
        char *end1, *end2 = t;
        long x = strtol(t + 10, &end1, 10), y = -1;
        if (end1 != t + 10 && *end1 == '_' && end1[1] >= '0' && end1[1] <= '9')
            y = strtol(end1 + 1, &end2, 10);
        if (y >= 0 && *end2 == '_' && x >= 0 && x < 1000 && y < 1000) {
            rest = end2 + 1;
            p->kind = t[1] == 'a' ? PLAT_MANYLINUX : PLAT_MUSLLINUX;
            if (p->kind == PLAT_MANYLINUX)
                snprintf(p->glibc, sizeof p->glibc, "%ld.%ld", x, y);
        }
    }
    if (!rest && !strncmp(t, "linux_", 6)) {
        rest = t + 6;
        p->kind = PLAT_LINUX;
    }
    if (rest)
        env_copy(p->arch, sizeof p->arch, rest);
}

static int cmd_check(const wheel_opts *o, const rel_target *t) {
    rel_wheel w;
    char err[256], desc[256], lines[16][600];
    int n = 0, bad = 0, i;
    int marks[16];
#define LINE(is_bad, ...)                                                                          \
    do {                                                                                           \
        if (n < 16) {                                                                              \
            snprintf(lines[n], sizeof lines[n], __VA_ARGS__);                                      \
            marks[n++] = (is_bad);                                                                 \
            bad += (is_bad);                                                                       \
        }                                                                                          \
    } while (0)

    describe_target(t, desc, sizeof desc);
    if (rel_parse_wheel(o->check, &w, err, sizeof err) != 0) {
        if (o->json) {
            printf("{\"wheel\": ");
            json_string(stdout, o->check);
            printf(", \"error\": ");
            json_string(stdout, err);
            printf("}\n");
        } else {
            fprintf(stderr, "flashattn wheel --check: %s: %s\n", o->check, err);
        }
        return 2;
    }
    if (strcmp(w.dist, "flash_attn") != 0)
        LINE(0, "not a flash-attn wheel (distribution '%s'); checking the tags anyway", w.dist);
    if (t->pytag[0]) {
        LINE(strcmp(w.pytag, t->pytag) != 0, "python tag: wheel %s, this Python %s", w.pytag,
             t->pytag);
        if (strcmp(w.abitag, w.pytag) != 0 && strcmp(w.abitag, "none") != 0 &&
            strcmp(w.abitag, "abi3") != 0)
            LINE(1, "ABI tag %s does not match its python tag %s", w.abitag, w.pytag);
    }
    if (t->machine[0]) {
        /* the wheel fits when one of its tags does (pip's rule): the tag for this machine with
         * the lowest glibc floor decides */
        const char *p = w.plat;
        plat_tag best, x;
        int have = 0, have_musl = 0;
        char want[48];
        memset(&best, 0, sizeof best);
        snprintf(want, sizeof want, "linux_%s", t->machine);
        while (*p) {
            size_t k = strcspn(p, ".");
            parse_plat(p, k, &x);
            if (x.kind == PLAT_ANY || ((x.kind == PLAT_LINUX || x.kind == PLAT_MANYLINUX) &&
                                       !strcmp(x.arch, t->machine))) {
                if (!have || ver_cmp(x.glibc, best.glibc) < 0)
                    best = x;
                have = 1;
            } else if (x.kind == PLAT_MUSLLINUX && !strcmp(x.arch, t->machine)) {
                have_musl = 1;
            }
            p += k;
            p += *p == '.';
        }
        if (have) {
            LINE(0, "platform: wheel %s, this machine %s", w.plat, want);
            if (best.glibc[0] && !t->glibc[0])
                LINE(0, "glibc: the wheel needs glibc >= %s; this machine's glibc is unknown",
                     best.glibc);
            else if (best.glibc[0] && ver_cmp(best.glibc, t->glibc) > 0)
                LINE(1,
                     "glibc: wheel %s needs glibc >= %s, this machine has glibc %s (pip refuses "
                     "it: \"not a supported wheel on this platform\"). Fix: a wheel for glibc <= "
                     "%s (`flashattn wheel` names the release wheel for this machine), or build "
                     "here: flashattn wheel --build-script > build.sh && sh build.sh",
                     w.plat, best.glibc, t->glibc, t->glibc);
            else if (best.glibc[0])
                LINE(0, "glibc: the wheel needs glibc >= %s, this machine has glibc %s", best.glibc,
                     t->glibc);
        } else if (have_musl && t->glibc[0]) {
            LINE(1, "platform: wheel %s is for musl libc (Alpine), this machine %s uses glibc %s",
                 w.plat, want, t->glibc);
        } else if (have_musl) {
            LINE(0,
                 "platform: wheel %s is for musl libc (Alpine); this machine's C library is "
                 "unknown",
                 w.plat);
        } else {
            LINE(1, "platform: wheel %s, this machine %s", w.plat, want);
        }
    }
    if (!w.local[0]) {
        LINE(0, "no local version (+cu..torch..cxx11abi..): setup.py's renamed download or a "
                "local build; the torch, CUDA and ABI it was built for are not in the name (pip's "
                "cache can reuse such a wheel for another torch)");
    } else {
        if (w.rocm[0])
            LINE(1, "a ROCm wheel (rocm%s): for AMD GPUs, not NVIDIA", w.rocm);
        if (w.torch_mm[0]) {
            if (!t->torch_mm[0])
                LINE(1, "torch: wheel built for torch %s, none installed here", w.torch_mm);
            else
                LINE(strcmp(w.torch_mm, t->torch_mm) != 0, "torch: wheel %s, installed %s",
                     w.torch_mm, t->torch_mm);
        }
        if (w.cu[0]) {
            int wm = rel_cu_major(w.cu), tm = 0, tmin = 0;
            if (!t->torch_cuda[0] || env_parse_mm(t->torch_cuda, &tm, &tmin) != 0)
                LINE(t->torch_mm[0] != 0, "CUDA: wheel cu%s (CUDA %d), torch here %s", w.cu, wm,
                     t->torch_mm[0] ? "is CPU-only" : "absent");
            else
                LINE(wm != tm, "CUDA: wheel cu%s (CUDA %d), torch's CUDA %s", w.cu, wm,
                     t->torch_cuda);
            if (t->driver_cuda && t->driver_cuda / 1000 < wm) {
                char dv[16];
                env_cuda_version_str(t->driver_cuda, dv, sizeof dv);
                LINE(1, "driver: supports CUDA %s, older than the wheel's CUDA %d", dv, wm);
            }
        }
        if (w.abi >= 0) {
            if (t->abi < 0)
                LINE(0, "C++ ABI: wheel cxx11abi%s, torch's flag unknown here",
                     w.abi ? "TRUE" : "FALSE");
            else
                LINE(w.abi != t->abi,
                     "C++ ABI: wheel cxx11abi%s, torch _GLIBCXX_USE_CXX11_ABI=%s%s",
                     w.abi ? "TRUE" : "FALSE", t->abi ? "True" : "False",
                     w.abi != t->abi ? " (import fails: undefined symbol ...)" : "");
        }
    }
    {
        char issues[512];
        const rel_info *r = rel_find(w.version);
        if (!r)
            LINE(0, "flash-attn %s is not in flashattn's release table", w.version);
        if (rel_runtime_issues(w.version, t, issues, sizeof issues))
            LINE(1, "runs here? %s", issues);
    }
    if (o->json) {
        printf("{\"wheel\": ");
        json_string(stdout, o->check);
        printf(", \"version\": ");
        json_string(stdout, w.version);
        printf(", \"cuda\": ");
        json_string(stdout, w.cu[0] ? w.cu : NULL);
        printf(", \"torch\": ");
        json_string(stdout, w.torch_mm[0] ? w.torch_mm : NULL);
        printf(", \"cxx11_abi\": %s", w.abi < 0 ? "null" : w.abi ? "true" : "false");
        printf(", \"python\": ");
        json_string(stdout, w.pytag);
        printf(", \"platform\": ");
        json_string(stdout, w.plat);
        printf(", \"machine\": ");
        json_string(stdout, desc);
        printf(", \"mismatches\": [");
        {
            int k, any = 0;
            for (k = 0; k < n; k++) {
                if (!marks[k])
                    continue;
                if (any)
                    printf(", ");
                json_string(stdout, lines[k]);
                any = 1;
            }
            printf("], \"notes\": [");
            any = 0;
            for (k = 0; k < n; k++) {
                if (marks[k])
                    continue;
                if (any)
                    printf(", ");
                json_string(stdout, lines[k]);
                any = 1;
            }
        }
        printf("]}\n");
    } else {
        printf("wheel:        %s\n", o->check);
        printf("this machine: %s\n", desc);
        for (i = 0; i < n; i++)
            printf("%s %s\n", marks[i] ? "[✗]" : "[✓]", lines[i]);
        if (bad)
            printf("\n%d mismatch%s: `flashattn wheel` names the wheel for this machine.\n", bad,
                   bad == 1 ? "" : "es");
        else
            printf("\nno mismatch: this wheel fits this machine.\n");
    }
#undef LINE
    return bad ? 1 : 0;
}

/* ---- --build-script -------------------------------------------------------------------------- */

static int cmd_build_script(const wheel_opts *o, const fa_env *e, const rel_target *t) {
    const char *version = o->fa_version ? o->fa_version : rel_latest();
    const env_tool *nv = e->cuda.home_nvcc.found && e->cuda.home_nvcc.ran ? &e->cuda.home_nvcc
                         : e->cuda.nvcc.ran                               ? &e->cuda.nvcc
                                                                          : NULL;
    const char *py = e->py.path[0] ? e->py.path : "python3";
    char tlist[128], falist[64], cc[32] = "", home[ENV_PATH_LEN];
    int jobs, threads, gmax = 0, i;

    rel_build_jobs(e->mem.build_gb, e->cpu.ncpu, &jobs, &threads);
    rel_arch_lists(e->drv.gpus, e->drv.ngpus, tlist, sizeof tlist, falist, sizeof falist);
    if (!e->cuda.home[0]) {
        env_copy(home, sizeof home, "/usr/local/cuda");
    } else {
        env_copy(home, sizeof home, e->cuda.home);
    }
    if (nv)
        gmax = e->cuda.host_gcc_max ? e->cuda.host_gcc_max : rel_nvcc_gcc_max(nv->major, nv->minor);
    if (nv && e->cxx.gcc.ran && e->cxx.gcc.major > gmax) {
        const char *p = e->cxx.other_gcc;
        int best = 0;
        while (*p) {
            int v = atoi(p);
            if (v >= 9 && v <= gmax && v > best)
                best = v;
            p += strcspn(p, " ");
            while (*p == ' ')
                p++;
        }
        snprintf(cc, sizeof cc, "%d", best ? best : gmax);
    }

    printf("#!/bin/sh\n");
    printf("# Builds flash-attn %s from source on this machine.\n", version);
    printf("# Written by `flashattn wheel --build-script` (flashattn %s) from what it found:\n",
           fa_version_string());
    printf("#   Python: %s %s (%s)\n", py, e->py.version[0] ? e->py.version : "?",
           t->pytag[0] ? t->pytag : "?");
    if (e->py.torch_present)
        printf("#   torch %s, CUDA %s, _GLIBCXX_USE_CXX11_ABI=%s\n", e->py.torch_version,
               e->py.torch_cuda,
               e->py.torch_abi == 1   ? "True"
               : e->py.torch_abi == 0 ? "False"
                                      : "?");
    else
        printf("#   torch: NOT INSTALLED - install a CUDA build of torch first; the checks below "
               "stop otherwise\n");
    printf("#   CUDA toolkit: %s%s (nvcc %s)\n", home,
           e->cuda.home[0] ? "" : " (assumed: none found)", nv ? nv->version : "not found");
    printf("#   gcc %s%s%s\n", e->cxx.gcc.ran ? e->cxx.gcc.version : "not found",
           nv ? "; this nvcc accepts gcc <= " : "", nv ? (gmax ? "" : "?") : "");
    if (nv && gmax)
        printf("#     (%d, from %s)\n", gmax,
               e->cuda.host_gcc_max ? e->cuda.host_config : "NVIDIA's host compiler table");
    for (i = 0; i < e->drv.ngpus; i++)
        printf("#   GPU %d: %s (sm_%d%d)\n", i, e->drv.gpus[i].name, e->drv.gpus[i].cc_major,
               e->drv.gpus[i].cc_minor);
    if (!e->drv.ngpus)
        printf("#   GPUs: none visible - edit the architecture lists below for the target GPUs\n");
    printf("#   RAM: %.1f GB available, %d CPUs\n", e->mem.build_gb, e->cpu.ncpu);
    printf("# Review it, then run: sh build.sh    (FLASH_ATTN_SRC=/path/to/checkout builds a "
           "git checkout instead of the PyPI sdist)\n");
    printf("set -eu\n\n");
    printf("PYTHON=\"${PYTHON:-%s}\"\n", py);
    printf("FLASH_ATTN_VERSION=\"${FLASH_ATTN_VERSION:-%s}\"\n\n", version);

    printf("# 1. The CUDA toolkit: its nvcc's major must equal torch.version.cuda's.\n");
    printf("export CUDA_HOME=\"${CUDA_HOME:-%s}\"\n", home);
    printf("export PATH=\"$CUDA_HOME/bin:$PATH\"\n\n");

    printf("# 2. The host compiler.\n");
    if (cc[0]) {
        printf("# The default gcc %s is newer than nvcc %s accepts (<= %d): use gcc-%s%s.\n",
               e->cxx.gcc.version, nv->version, gmax, cc,
               strstr(e->cxx.other_gcc, cc) ? "" : " (install it: apt-get install gcc-N g++-N)");
        printf("export CC=gcc-%s CXX=g++-%s   # torch passes $CC to nvcc as -ccbin\n\n", cc, cc);
    } else {
        printf("# The default gcc%s%s is accepted by this nvcc; CC/CXX stay unset.\n\n",
               e->cxx.gcc.ran ? " " : "", e->cxx.gcc.version);
    }

    printf("# 3. Compile only for the GPUs that will run it (less time, less memory).\n");
    printf(
        "# flash-attn passes its own -gencode list; FLASH_ATTN_CUDA_ARCHS (2.7.3+) narrows it.\n");
    printf("export TORCH_CUDA_ARCH_LIST=\"%s\"\n", tlist[0] ? tlist : "8.0;9.0");
    printf("export FLASH_ATTN_CUDA_ARCHS=\"%s\"\n\n", falist[0] ? falist : "80;90");

    printf("# 4. Parallelism from RAM: %s.\n", rel_jobs_rule);
    printf("export MAX_JOBS=%d NVCC_THREADS=%d\n\n", jobs, threads);

    printf("# 5. Always compile (no prebuilt-wheel guess), with torch's C++ ABI.\n");
    printf("export FLASH_ATTENTION_FORCE_BUILD=TRUE\n");
    if (e->py.torch_abi == 1)
        printf("export FLASH_ATTENTION_FORCE_CXX11_ABI=TRUE   # torch: "
               "_GLIBCXX_USE_CXX11_ABI=True\n\n");
    else
        printf("unset FLASH_ATTENTION_FORCE_CXX11_ABI   # torch: _GLIBCXX_USE_CXX11_ABI=%s; "
               "cpp_extension passes torch's flag itself\n\n",
               e->py.torch_abi == 0 ? "False" : "unknown");

    printf("# 6. Check before hours of compiling.\n");
    printf("\"$PYTHON\" -c 'import torch' || { echo \"torch does not import in $PYTHON: install "
           "a CUDA build of torch first\" >&2; exit 1; }\n");
    printf("torch_cuda=$(\"$PYTHON\" -c 'import torch; print(torch.version.cuda or \"\")')\n");
    printf("[ -n \"$torch_cuda\" ] || { echo \"torch is a CPU-only build; flash-attn needs a CUDA "
           "build of torch\" >&2; exit 1; }\n");
    printf("[ -x \"$CUDA_HOME/bin/nvcc\" ] || { echo \"no nvcc in CUDA_HOME=$CUDA_HOME\" >&2; "
           "exit 1; }\n");
    printf("nvcc_release=$(\"$CUDA_HOME/bin/nvcc\" --version | sed -n 's/.*release "
           "\\([0-9][0-9]*\\.[0-9][0-9]*\\).*/\\1/p')\n");
    printf("if [ \"${nvcc_release%%%%.*}\" != \"${torch_cuda%%%%.*}\" ]; then\n");
    printf("    echo \"nvcc $nvcc_release and torch's CUDA $torch_cuda differ in major version: "
           "point CUDA_HOME at a CUDA ${torch_cuda%%%%.*}.x toolkit\" >&2\n");
    printf("    exit 1\n");
    printf("fi\n");
    printf("echo \"building flash-attn $FLASH_ATTN_VERSION: nvcc $nvcc_release, torch CUDA "
           "$torch_cuda, MAX_JOBS=$MAX_JOBS NVCC_THREADS=$NVCC_THREADS\"\n\n");

    printf("# 7. Build dependencies: with --no-build-isolation they come from this environment.\n");
    printf(
        "\"$PYTHON\" -m pip install --upgrade packaging ninja psutil wheel setuptools einops\n\n");

    printf("# 8. Clean: the installed copy, pip's cached flash-attn wheels (one built for another "
           "torch\n#    would be reused) and old build directories.\n");
    printf("\"$PYTHON\" -m pip uninstall -y flash-attn flash_attn || true\n");
    printf("\"$PYTHON\" -m pip cache remove 'flash_attn*' >/dev/null 2>&1 || true\n");
    printf("if [ -n \"${FLASH_ATTN_SRC:-}\" ]; then\n");
    printf("    cd \"$FLASH_ATTN_SRC\"\n");
    printf("    git submodule update --init --recursive\n");
    printf("    rm -rf build dist ./*.egg-info\n");
    printf("    \"$PYTHON\" -m pip install --no-build-isolation --no-cache-dir -v .\n");
    printf("else\n");
    printf("    \"$PYTHON\" -m pip install --no-build-isolation --no-cache-dir -v "
           "\"flash-attn==$FLASH_ATTN_VERSION\"\n");
    printf("fi\n\n");

    printf("# 9. Import it and run it once against PyTorch's attention.\n");
    printf("cd /\n");
    printf("\"$PYTHON\" - <<'EOF'\n");
    printf("import torch, flash_attn\n");
    printf("from flash_attn import flash_attn_func\n");
    printf("q, k, v = (torch.randn(1, 256, 8, 64, device='cuda', dtype=torch.float16) for _ in "
           "range(3))\n");
    printf("o = flash_attn_func(q, k, v, causal=True)\n");
    printf("ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), "
           "k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)\n");
    printf("err = (o - ref).abs().max().item()\n");
    printf("print('flash-attn', flash_attn.__version__, 'works: max |flash - sdpa| =', err)\n");
    printf("assert err < 1e-2, err\n");
    printf("EOF\n");
    return 0;
}

/* ---- the release table ----------------------------------------------------------------------- */

/* The cached table, when there is one; a bad one is named and the bundled table used. */
static void load_cache(void) {
    char path[512], err[600];
    if (rel_cache_path(path, sizeof path) == 0 && rel_cache_load(path, err, sizeof err) < 0)
        fprintf(stderr,
                "flashattn wheel: ignoring the release cache (%s); using the bundled table. "
                "flashattn wheel --refresh rewrites it\n",
                err);
}

static int cmd_refresh(void) {
    char path[512], msg[1024];
    const char *url = getenv("FLASHATTN_RELEASES_URL");
    if (rel_cache_path(path, sizeof path) != 0) {
        fprintf(stderr, "flashattn wheel --refresh: neither XDG_CACHE_HOME nor HOME is set; "
                        "nowhere to keep the table\n");
        return 1;
    }
    if (rel_refresh(url && *url ? url : rel_listing_url, path, msg, sizeof msg) != 0) {
        fprintf(stderr, "flashattn wheel --refresh: %s; the release table is unchanged\n", msg);
        return 1;
    }
    printf("release table refreshed on %s: %s\n", rel_checked, msg);
    printf("newest release: flash-attn %s (torch %s; CUDA %s; Python 3.%d-3.%d; %s)\n",
           rel_releases[0].version, rel_releases[0].torch, rel_releases[0].cuda,
           rel_releases[0].py_min, rel_releases[0].py_max, rel_releases[0].machines);
    return 0;
}

/* ---- the command ----------------------------------------------------------------------------- */

int cmd_wheel(int argc, char **argv) {
    wheel_opts o;
    env_options eo;
    fa_env *e;
    rel_target t;
    int i, rc, need_python;

    memset(&o, 0, sizeof o);
    for (i = 1; i < argc; i++) {
        const char *v = NULL;
        const char **slot = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            wheel_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            o.json = 1;
            continue;
        } else if (!strcmp(argv[i], "--build-script")) {
            o.build_script = 1;
            continue;
        } else if (!strcmp(argv[i], "--refresh")) {
            o.refresh = 1;
            continue;
        } else if (!strcmp(argv[i], "--no-python")) {
            o.no_python = 1;
            continue;
        } else if (cli_opt_value(argc, argv, &i, "--flash-attn", &v)) {
            slot = &o.fa_version;
        } else if (cli_opt_value(argc, argv, &i, "--check", &v)) {
            slot = &o.check;
        } else if (cli_opt_value(argc, argv, &i, "--python", &v)) {
            slot = &o.python;
        } else if (cli_opt_value(argc, argv, &i, "--torch", &v)) {
            slot = &o.torch;
        } else if (cli_opt_value(argc, argv, &i, "--cuda", &v)) {
            slot = &o.cuda;
        } else if (cli_opt_value(argc, argv, &i, "--abi", &v)) {
            slot = &o.abi;
        } else if (cli_opt_value(argc, argv, &i, "--platform", &v)) {
            slot = &o.platform;
        } else if (cli_opt_value(argc, argv, &i, "--glibc", &v)) {
            slot = &o.glibc;
        } else if (cli_opt_value(argc, argv, &i, "--cc", &v)) {
            slot = &o.cc;
        } else {
            fprintf(stderr, "flashattn wheel: unknown argument '%s'\n\n", argv[i]);
            wheel_usage(stderr);
            return 2;
        }
        if (!v || !*v) {
            fprintf(stderr, "flashattn wheel: %s needs a value\n", argv[i]);
            return 2;
        }
        *slot = v;
    }
    if (o.fa_version && !strchr(o.fa_version, '.')) {
        fprintf(stderr, "flashattn wheel: --flash-attn wants a version like 2.8.3\n");
        return 2;
    }
    if (o.refresh && argc != 2) {
        fprintf(stderr, "flashattn wheel: --refresh takes no other argument\n");
        return 2;
    }
    if (o.refresh)
        return cmd_refresh();
    load_cache();

    e = calloc(1, sizeof *e);
    if (!e) {
        fprintf(stderr, "flashattn wheel: out of memory\n");
        return 1;
    }
    memset(&eo, 0, sizeof eo);
    need_python = !o.no_python && (o.build_script || !o.python || !o.torch || !o.cuda || !o.abi);
    probe_cpu(&e->cpu);
    probe_libc(&e->libc);
    if (!o.cc)
        probe_driver(&e->drv);
    if (o.build_script) {
        probe_mem(&e->mem);
        probe_cuda(&e->cuda, 20.0);
        probe_cxx(&e->cxx, 20.0);
    }
    if (need_python) {
        probe_python(&e->py, &eo);
    } else {
        e->py.torch_abi = -1;
        e->py.torch_cuda_available = -1;
    }
    rel_target_from_env(e, &t);
    if (apply_overrides(&o, &t) != 0) {
        fprintf(stderr, "flashattn wheel: bad --python/--torch/--cuda/--abi/--cc value\n");
        free(e);
        return 2;
    }
    if (o.check)
        rc = cmd_check(&o, &t);
    else if (o.build_script)
        rc = cmd_build_script(&o, e, &t);
    else
        rc = cmd_name(&o, &t);
    free(e);
    return rc;
}
