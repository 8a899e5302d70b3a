/* SPDX-License-Identifier: MIT */
/*
 * tools/wheel/ — `flashattn wheel`: the flash-attn wheel that fits this machine, from the release
 * table.
 *
 * releases.c — the flash-attn release table and naming rules (see releases.h).
 *
 * The table holds the releases whose publish.yml matrix is known exactly; for any other
 * version the naming rules of its release line still apply, and the callers say that the
 * matrix is unknown. Both C++ ABIs were built for every row. Per-row Python lists are further
 * cut by what each torch version supports (rel_torch_python), as publish.yml's excludes do.
 */
#define _POSIX_C_SOURCE 200809L

#include "releases.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../probe/verutil.h"

/* Read from .github/workflows/publish.yml at each tag of Dao-AILab/flash-attention, newest
 * first; checked on rel_bundled_checked's day. The v2.* tags since v2.8.3: only v2.8.3.post1
 * (2026-06-10), cut from v2.8.3 with setup.py's CUDA 13 wheel name and the version bump; its
 * publish.yml is 2.8.3's (torch 2.4-2.8, CUDA 12.9.1, Python 3.9-3.13, both ABIs, x86_64 only),
 * and the assets users install match it. The main branch's workflow (torch 2.6-2.10, CUDA 12.9
 * and 13.0, aarch64, ABI TRUE only from torch 2.7) is in no v2 tag yet. fa4-v4.* tags publish
 * flash-attn-4, not these wheels. */
const rel_info rel_bundled[] = {
    {"2.8.3.post1", 9, 13, "2.4 2.5 2.6 2.7 2.8", "12.9", "2.32", 1, "x86_64"},
    {"2.8.3", 9, 13, "2.4 2.5 2.6 2.7 2.8", "12.9", "2.32", 1, "x86_64"},
    {"2.8.2", 9, 13, "2.4 2.5 2.6 2.7", "12.9", "2.32", 1, "x86_64"},
    {"2.8.1", 9, 13, "2.4 2.5 2.6 2.7", "12.9", "2.32", 1, "x86_64"},
    {"2.8.0.post2", 9, 13, "2.4 2.5 2.6 2.7", "12.9", "2.32", 1, "x86_64"},
    {"2.7.4.post1", 9, 13, "2.2 2.3 2.4 2.5 2.6", "12.4", "2.31", 0, "x86_64"},
    {"2.7.2.post1", 9, 13, "2.1 2.2 2.3 2.4 2.5 2.6", "11.8 12.3", "2.31", 0, "x86_64"},
    {"2.7.2", 9, 13, "2.1 2.2 2.3 2.4 2.5 2.6", "11.8 12.3", "2.31", 0, "x86_64"},
    {"2.7.0", 8, 12, "2.1 2.2 2.3 2.4 2.5", "11.8 12.3", "2.31", 0, "x86_64"},
    {"2.6.3", 8, 12, "2.0 2.1 2.2 2.3 2.4", "11.8 12.3", "2.31", 0, "x86_64"},
    {"2.6.0", 8, 12, "2.0 2.1 2.2 2.3 2.4", "11.8 12.2", "2.31", 0, "x86_64"},
    {"2.5.9.post1", 7, 12, "1.12 1.13 2.0 2.1 2.2 2.3 2.4", "11.8 12.2", "2.31", 0, "x86_64"},
    {"2.5.8", 7, 11, "1.12 1.13 2.0 2.1 2.2 2.3", "11.8 12.2", "2.31", 0, "x86_64"},
    {"2.5.0", 7, 11, "1.12 1.13 2.0 2.1 2.2", "11.8 12.2", "2.31", 0, "x86_64"},
};
const size_t rel_nbundled = sizeof rel_bundled / sizeof rel_bundled[0];
const char rel_bundled_checked[] = "2026-12-07";

const rel_info *rel_releases = rel_bundled;
size_t rel_nreleases = sizeof rel_bundled / sizeof rel_bundled[0];
const char *rel_checked = rel_bundled_checked;
const char *rel_source = "bundled";

void rel_use_table(const rel_info *rows, size_t n, const char *checked, const char *source) {
    rel_releases = rows;
    rel_nreleases = n;
    rel_checked = checked;
    rel_source = source;
}

const char *rel_latest(void) { return rel_releases[0].version; }

const rel_info *rel_find(const char *version) {
    size_t i;
    if (!version)
        return NULL;
    for (i = 0; i < rel_nreleases; i++)
        if (!strcmp(rel_releases[i].version, version))
            return &rel_releases[i];
    return NULL;
}

static void app(char *buf, size_t cap, const char *fmt, ...) {
    size_t len = strlen(buf);
    va_list ap;
    if (len + 1 >= cap)
        return;
    if (len) {
        snprintf(buf + len, cap - len, "; ");
        len = strlen(buf);
    }
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

int rel_cuda_tag(const char *version, const char *torch_cuda, char *out, size_t cap, char *note,
                 size_t ncap) {
    int major = 0, minor = 0;
    if (note && ncap)
        note[0] = '\0';
    out[0] = '\0';
    if (!torch_cuda || !*torch_cuda || !strcmp(torch_cuda, "None") ||
        env_parse_mm(torch_cuda, &major, &minor) != 0) {
        if (note)
            snprintf(note, ncap,
                     "torch.version.cuda is None (a CPU-only or ROCm torch): "
                     "setup.py cannot name a CUDA wheel");
        return -1;
    }
    if (ver_cmp(version, "2.6.1") < 0) {
        snprintf(out, cap, "%s", major == 11 ? "118" : "122");
        if (major >= 13 && note)
            snprintf(note, ncap,
                     "setup.py maps every non-11 CUDA to cu122, so a CUDA %d torch "
                     "gets a CUDA 12 wheel that will not load",
                     major);
    } else if (ver_cmp(version, "2.7.0") < 0) {
        snprintf(out, cap, "%s", major == 11 ? "118" : "123");
        if (major >= 13 && note)
            snprintf(note, ncap,
                     "setup.py maps every non-11 CUDA to cu123, so a CUDA %d torch "
                     "gets a CUDA 12 wheel that will not load",
                     major);
    } else if (ver_cmp(version, "2.8.3.post1") < 0) {
        snprintf(out, cap, "%s", major == 11 ? "11" : "12");
        if (major >= 13 && note)
            snprintf(note, ncap,
                     "setup.py before 2.8.3.post1 guesses cu12 for a CUDA %d torch; "
                     "that wheel would not load",
                     major);
    } else {
        snprintf(out, cap, "%d", major);
    }
    return 0;
}

void rel_platform_tag(const char *version, const char *machine, char *out, size_t cap) {
    if (ver_cmp(version, "2.5.7") < 0 || !machine || !*machine)
        snprintf(out, cap, "linux_x86_64");
    else
        snprintf(out, cap, "linux_%s", machine);
}

void rel_wheel_name(const char *version, const char *cu, const char *torch_mm, int abi,
                    const char *pytag, const char *plat, char *out, size_t cap) {
    snprintf(out, cap, "flash_attn-%s+cu%storch%scxx11abi%s-%s-%s-%s.whl", version, cu, torch_mm,
             abi ? "TRUE" : "FALSE", pytag, pytag, plat);
}

void rel_wheel_url(const char *version, const char *wheel, char *out, size_t cap) {
    snprintf(out, cap, "https://github.com/Dao-AILab/flash-attention/releases/download/v%s/%s",
             version, wheel);
}

int rel_torch_python(const char *torch_mm, int *py_min, int *py_max) {
    static const struct {
        const char *torch;
        int lo, hi;
    } t[] = {{"1.12", 7, 10}, {"1.13", 7, 11}, {"2.0", 8, 11},  {"2.1", 8, 11}, {"2.2", 8, 12},
             {"2.3", 8, 12},  {"2.4", 8, 12},  {"2.5", 9, 13},  {"2.6", 9, 13}, {"2.7", 9, 13},
             {"2.8", 9, 13},  {"2.9", 10, 14}, {"2.10", 10, 14}};
    size_t i;
    for (i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (!strcmp(t[i].torch, torch_mm)) {
            *py_min = t[i].lo;
            *py_max = t[i].hi;
            return 0;
        }
    }
    return -1;
}

/* Is the word w in the space-separated list? */
static int in_list(const char *list, const char *w) {
    size_t n = strlen(w);
    const char *p = list;
    while (p && *p) {
        size_t k = strcspn(p, " ");
        if (k == n && !strncmp(p, w, n))
            return 1;
        p += k;
        while (*p == ' ')
            p++;
    }
    return 0;
}

int rel_cu_major(const char *cu) {
    int v;
    if (!cu || !*cu)
        return 0;
    v = atoi(cu);
    if (v >= 100)
        return v / 10; /* 118 -> 11, 122 -> 12 */
    return v;
}

/* Does a release built with these CUDA versions ("11.8 12.3") have one for CUDA major m? */
static int has_cuda_major(const char *list, int m) {
    const char *p = list;
    while (p && *p) {
        if (atoi(p) == m)
            return 1;
        p += strcspn(p, " ");
        while (*p == ' ')
            p++;
    }
    return 0;
}

int rel_has_wheel(const rel_info *r, const rel_target *t, char *why, size_t cap) {
    int lo, hi, tmaj = 0, tmin = 0;
    why[0] = '\0';
    if (t->machine[0] && !in_list(r->machines, t->machine))
        app(why, cap, "only linux_%s wheels are published (this is %s)", r->machines, t->machine);
    if (t->py_minor && (t->py_minor < r->py_min || t->py_minor > r->py_max))
        app(why, cap, "Python 3.%d (wheels: 3.%d-3.%d)", t->py_minor, r->py_min, r->py_max);
    if (!t->torch_mm[0]) {
        app(why, cap, "no torch");
    } else if (!in_list(r->torch, t->torch_mm)) {
        app(why, cap, "torch %s (wheels: %s)", t->torch_mm, r->torch);
    } else if (t->py_minor && rel_torch_python(t->torch_mm, &lo, &hi) == 0 &&
               (t->py_minor < lo || t->py_minor > hi)) {
        app(why, cap, "torch %s has no Python 3.%d build", t->torch_mm, t->py_minor);
    }
    if (t->torch_mm[0]) {
        if (!t->torch_cuda[0] || env_parse_mm(t->torch_cuda, &tmaj, &tmin) != 0)
            app(why, cap, "a CPU-only torch (wheels need a CUDA torch)");
        else if (!has_cuda_major(r->cuda, tmaj))
            app(why, cap, "CUDA %d torch (wheels built with CUDA %s)", tmaj, r->cuda);
    }
    return why[0] == '\0';
}

int rel_runtime_issues(const char *version, const rel_target *t, char *why, size_t cap) {
    const rel_info *r = rel_find(version);
    int n = 0;
    why[0] = '\0';
    if (r && t->glibc[0] && ver_cmp(t->glibc, r->glibc) < 0) {
        app(why, cap,
            "its wheels need glibc >= %s (this system has %s): the import fails with "
            "\"GLIBC_%s not found\"",
            r->glibc, t->glibc, r->glibc);
        n++;
    }
    if (t->cc_major && t->cc_major < 8) {
        app(why, cap, "the GPU is sm_%d%d; flash-attn 2 needs sm_80 or newer", t->cc_major,
            t->cc_minor);
        n++;
    } else if (t->cc_major >= 10 && ver_cmp(version, "2.8.0") < 0) {
        app(why, cap,
            "wheels before 2.8.0 have no sm_100/sm_120 code: \"no kernel image is "
            "available\" on this sm_%d%d GPU",
            t->cc_major, t->cc_minor);
        n++;
    }
    if (!strcmp(version, "2.8.1") && t->driver_cuda && t->driver_cuda < 12040) {
        app(why, cap,
            "2.8.1 wheels use compressed fatbins that drivers older than 550 cannot "
            "load (\"device kernel image is invalid\")");
        n++;
    }
    if (t->driver_cuda && r) {
        int m = atoi(r->cuda), tmaj = 0, tmin = 0;
        if (t->torch_cuda[0] && env_parse_mm(t->torch_cuda, &tmaj, &tmin) == 0 &&
            has_cuda_major(r->cuda, tmaj))
            m = tmaj; /* the variant this torch would get */
        if (m && t->driver_cuda / 1000 < m) {
            char dv[16];
            env_cuda_version_str(t->driver_cuda, dv, sizeof dv);
            app(why, cap, "the driver supports CUDA %s, older than the CUDA %d the wheel needs", dv,
                m);
            n++;
        }
    }
    if (ver_cmp(version, "2.8.0") >= 0 && t->torch_mm[0] && ver_cmp(t->torch_mm, "2.6") < 0) {
        app(why, cap, "flash_attn.ops.triton needs torch >= 2.6 (torch.library.wrap_triton)");
        n++;
    }
    return n;
}

int rel_parse_wheel(const char *filename, rel_wheel *w, char *err, size_t cap) {
    const char *base = strrchr(filename, '/');
    char name[512], *parts[8], *p, *save = NULL;
    size_t n = 0, len;
    memset(w, 0, sizeof *w);
    w->abi = -1;
    base = base ? base + 1 : filename;
    len = strlen(base);
    if (len < 5 || len >= sizeof name || strcmp(base + len - 4, ".whl") != 0) {
        snprintf(err, cap, "not a wheel file name (expected NAME-VERSION-PY-ABI-PLATFORM.whl)");
        return -1;
    }
    memcpy(name, base, len - 4);
    name[len - 4] = '\0';
    for (p = strtok_r(name, "-", &save); p && n < 8; p = strtok_r(NULL, "-", &save))
        parts[n++] = p;
    if (n != 5 && n != 6) {
        snprintf(err, cap, "a wheel name has 5 or 6 '-'-separated parts; this one has %zu", n);
        return -1;
    }
    snprintf(w->dist, sizeof w->dist, "%s", parts[0]);
    {
        char *plus = strchr(parts[1], '+');
        if (plus) {
            *plus = '\0';
            snprintf(w->local, sizeof w->local, "%s", plus + 1);
        }
        snprintf(w->version, sizeof w->version, "%s", parts[1]);
    }
    snprintf(w->pytag, sizeof w->pytag, "%s", parts[n - 3]);
    snprintf(w->abitag, sizeof w->abitag, "%s", parts[n - 2]);
    snprintf(w->plat, sizeof w->plat, "%s", parts[n - 1]);
    if (w->local[0]) {
        const char *q = w->local;
        size_t k;
        if (!strncmp(q, "cu", 2)) {
            q += 2;
            k = strspn(q, "0123456789");
            snprintf(w->cu, sizeof w->cu, "%.*s", (int)k, q);
            q += k;
        } else if (!strncmp(q, "rocm", 4)) {
            q += 4;
            k = strspn(q, "0123456789");
            snprintf(w->rocm, sizeof w->rocm, "%.*s", (int)k, q);
            q += k;
        }
        if (!strncmp(q, "torch", 5)) {
            q += 5;
            k = strspn(q, "0123456789.");
            snprintf(w->torch_mm, sizeof w->torch_mm, "%.*s", (int)k, q);
            q += k;
        }
        if (!strncmp(q, "cxx11abi", 8)) {
            q += 8;
            if (!strncmp(q, "TRUE", 4))
                w->abi = 1;
            else if (!strncmp(q, "FALSE", 5))
                w->abi = 0;
        }
    }
    return 0;
}

/* ---- building -------------------------------------------------------------------------------- */

const char rel_jobs_rule[] =
    "NVCC_THREADS = 4 with >= 64 GB and >= 16 CPUs, else 2; MAX_JOBS = min(CPUs / NVCC_THREADS, "
    "available GB / (5 GB x NVCC_THREADS)), at least 1 (flash-attn's own rule on main: each "
    "ninja job is one nvcc whose NVCC_THREADS threads peak at about 5 GB each)";

void rel_build_jobs(double avail_gb, int ncpu, int *max_jobs, int *nvcc_threads) {
    int threads = (avail_gb >= 64.0 && ncpu >= 16) ? 4 : 2;
    int by_mem = (int)(avail_gb / (5.0 * threads));
    int by_cpu = ncpu / threads;
    int jobs = by_mem < by_cpu ? by_mem : by_cpu;
    if (jobs < 1)
        jobs = 1;
    *max_jobs = jobs;
    *nvcc_threads = threads;
}

void rel_arch_lists(const env_gpu *gpus, int n, char *torch_list, size_t tcap, char *fa_archs,
                    size_t fcap) {
    int seen_cc[64], nseen = 0, seen_fa[8], nfa = 0, i, j;
    size_t tl = 0, fl = 0;
    torch_list[0] = fa_archs[0] = '\0';
    for (i = 0; i < n; i++) {
        int cc = gpus[i].cc_major * 10 + gpus[i].cc_minor, dup = 0, fa;
        for (j = 0; j < nseen; j++)
            dup |= seen_cc[j] == cc;
        if (!dup && nseen < 64)
            seen_cc[nseen++] = cc;
        fa = gpus[i].cc_major >= 8 ? gpus[i].cc_major * 10 : 0;
        dup = 0;
        for (j = 0; j < nfa; j++)
            dup |= seen_fa[j] == fa;
        if (fa && !dup && nfa < 8)
            seen_fa[nfa++] = fa;
    }
    /* ascending order */
    for (i = 0; i < nseen; i++)
        for (j = i + 1; j < nseen; j++)
            if (seen_cc[j] < seen_cc[i]) {
                int t = seen_cc[i];
                seen_cc[i] = seen_cc[j];
                seen_cc[j] = t;
            }
    for (i = 0; i < nfa; i++)
        for (j = i + 1; j < nfa; j++)
            if (seen_fa[j] < seen_fa[i]) {
                int t = seen_fa[i];
                seen_fa[i] = seen_fa[j];
                seen_fa[j] = t;
            }
    for (i = 0; i < nseen && tl + 8 < tcap; i++)
        tl += (size_t)snprintf(torch_list + tl, tcap - tl, "%s%d.%d", i ? ";" : "", seen_cc[i] / 10,
                               seen_cc[i] % 10);
    for (i = 0; i < nfa && fl + 8 < fcap; i++)
        fl += (size_t)snprintf(fa_archs + fl, fcap - fl, "%s%d", i ? ";" : "", seen_fa[i]);
}

int rel_nvcc_gcc_max(int major, int minor) {
    int v = major * 100 + minor;
    if (v >= 1300)
        return 15;
    if (v >= 1208)
        return 14;
    if (v >= 1204)
        return 13;
    if (v >= 1200)
        return 12;
    if (v >= 1104)
        return 11;
    if (v >= 1101)
        return 10;
    if (v >= 1100)
        return 9;
    return 8;
}

int rel_nvcc_min_for_cc(int cc_major, int cc_minor) {
    int cc = cc_major * 10 + cc_minor;
    if (cc >= 110 && cc < 120)
        return 1300;
    if (cc >= 100)
        return 1208;
    if (cc >= 90)
        return 1108;
    if (cc >= 89)
        return 1108;
    if (cc >= 86)
        return 1101;
    return 1100;
}

/* ---- choosing -------------------------------------------------------------------------------- */

void rel_target_from_env(const fa_env *e, rel_target *t) {
    int i;
    memset(t, 0, sizeof *t);
    t->abi = -1;
    env_copy(t->pytag, sizeof t->pytag, e->py.tag);
    t->py_minor = e->py.minor;
    if (e->py.torch_present) {
        int maj = 0, min = 0;
        if (env_parse_mm(e->py.torch_version, &maj, &min) == 0)
            snprintf(t->torch_mm, sizeof t->torch_mm, "%d.%d", maj, min);
        if (e->py.torch_cuda[0] && strcmp(e->py.torch_cuda, "None") != 0)
            env_copy(t->torch_cuda, sizeof t->torch_cuda, e->py.torch_cuda);
        t->abi = e->py.torch_abi;
    }
    env_copy(t->machine, sizeof t->machine, e->py.machine[0] ? e->py.machine : e->cpu.arch);
    env_copy(t->glibc, sizeof t->glibc, e->libc.glibc);
    for (i = 0; i < e->drv.ngpus; i++) {
        const env_gpu *g = &e->drv.gpus[i];
        if (g->cc_major * 10 + g->cc_minor > t->cc_major * 10 + t->cc_minor) {
            t->cc_major = g->cc_major;
            t->cc_minor = g->cc_minor;
        }
    }
    t->driver_cuda = e->drv.cuda_version;
}

static void fill_choice(const rel_info *r, const rel_target *t, rel_choice *c) {
    char cu[16], plat[48];
    c->rel = r;
    rel_cuda_tag(r->version, t->torch_cuda, cu, sizeof cu, NULL, 0);
    rel_platform_tag(r->version, t->machine, plat, sizeof plat);
    rel_wheel_name(r->version, cu, t->torch_mm, t->abi != 0, t->pytag, plat, c->wheel,
                   sizeof c->wheel);
    rel_wheel_url(r->version, c->wheel, c->url, sizeof c->url);
    rel_runtime_issues(r->version, t, c->issues, sizeof c->issues);
}

int rel_choose(const rel_target *t, rel_choice *c) {
    size_t i;
    char why[512];
    const rel_info *any = NULL;
    memset(c, 0, sizeof *c);
    for (i = 0; i < rel_nreleases; i++) {
        const rel_info *r = &rel_releases[i];
        if (!rel_has_wheel(r, t, why, sizeof why))
            continue;
        if (!any)
            any = r;
        if (rel_runtime_issues(r->version, t, why, sizeof why) == 0) {
            fill_choice(r, t, c);
            return 1;
        }
    }
    if (any) {
        fill_choice(any, t, c);
        return 1;
    }
    return 0;
}
