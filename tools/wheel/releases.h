/* SPDX-License-Identifier: MIT */
/*
 * tools/wheel/ — `flashattn wheel`: the flash-attn wheel that fits this machine, from the release
 * table.
 *
 * releases.h — what flashattn knows about flash-attn releases, without network access: which
 * wheels each release published (Python, torch, CUDA, glibc), how each release line's setup.py
 * names the wheel it tries to download, how to parse such a name, and the build rules the
 * doctor recommends (MAX_JOBS / NVCC_THREADS from RAM, arch lists from the GPUs, the newest gcc
 * each nvcc accepts). Source: Dao-AILab/flash-attention setup.py and publish.yml per tag
 * (see ../../docs or the research notes the project keeps).
 */
#ifndef FA_TOOLS_RELEASES_H
#define FA_TOOLS_RELEASES_H

#include <stddef.h>

#include "../probe/envprobe.h"

typedef struct rel_info {
    const char *version; /* "2.8.3" */
    int py_min, py_max;  /* CPython 3.x minors with wheels */
    const char *torch;   /* torch major.minor with wheels: "2.4 2.5 2.6 2.7 2.8" */
    const char *cuda;    /* CUDA versions the wheels were built with: "12.9" */
    const char *glibc;   /* the glibc its wheels need */
    int blackwell;       /* the wheels contain sm_100/sm_120 code */
    const char *machines; /* Linux machines with wheels: "x86_64", "x86_64 aarch64" */
} rel_info;

/* The table in use, newest first: the bundled one, or the one `flashattn wheel --refresh` cached
 * (rel_use_table). */
extern const rel_info *rel_releases;
extern size_t rel_nreleases;
extern const rel_info rel_bundled[]; /* the table built into flashattn */
extern const size_t rel_nbundled;

/* The release with this exact version, or NULL. */
const rel_info *rel_find(const char *version);

/* The machine (or the one the user describes) a wheel must fit. */
typedef struct rel_target {
    char pytag[16];         /* "cp311" */
    int py_minor;           /* 11 (3.x) */
    char torch_mm[16];      /* "2.8"; "" when torch is absent */
    char torch_cuda[16];    /* torch.version.cuda "12.8"; "" for a CPU-only torch */
    int abi;                /* torch._C._GLIBCXX_USE_CXX11_ABI: 1, 0, -1 unknown */
    char machine[32];       /* "x86_64" */
    char glibc[32];         /* "2.36"; "" unknown */
    int cc_major, cc_minor; /* the newest GPU's compute capability; 0 unknown */
    int driver_cuda;        /* the driver's CUDA version (12040); 0 unknown */
} rel_target;

/* setup.py's CUDA tag for `version` ("12", "122", "118"), from torch.version.cuda. Returns 0,
 * or -1 when setup.py would fail (no CUDA torch). `note` explains quirks (a CUDA 13 torch
 * guessed as cu12 before 2.8.3.post1). */
int rel_cuda_tag(const char *version, const char *torch_cuda, char *out, size_t cap, char *note,
                 size_t ncap);

/* setup.py's platform tag: "linux_x86_64" (hard-coded before 2.5.7), else linux_<machine>. */
void rel_platform_tag(const char *version, const char *machine, char *out, size_t cap);

/* flash_attn-{V}+cu{CU}torch{T}cxx11abi{TRUE|FALSE}-{PY}-{PY}-{PLAT}.whl */
void rel_wheel_name(const char *version, const char *cu, const char *torch_mm, int abi,
                    const char *pytag, const char *plat, char *out, size_t cap);

/* https://github.com/Dao-AILab/flash-attention/releases/download/v{V}/{wheel} */
void rel_wheel_url(const char *version, const char *wheel, char *out, size_t cap);

/* Did release r publish a wheel for t? 1 or 0; `why` lists what is missing ("; "-separated). */
int rel_has_wheel(const rel_info *r, const rel_target *t, char *why, size_t cap);

/* Problems a published wheel would still have on t (glibc, GPU architecture, driver); 0 if
 * none, else their count, described in `why`. */
int rel_runtime_issues(const char *version, const rel_target *t, char *why, size_t cap);

/* The torch versions (major.minor) whose wheels support Python 3.minor: min and max. */
int rel_torch_python(const char *torch_mm, int *py_min, int *py_max);

/* A parsed wheel file name. */
typedef struct rel_wheel {
    char dist[64];
    char version[64]; /* public version "2.8.3" */
    char local[128];  /* "cu12torch2.8cxx11abiTRUE", "" if none */
    char cu[16];      /* "12", "122", "" */
    char rocm[16];
    char torch_mm[16];
    int abi; /* 1 TRUE, 0 FALSE, -1 not in the name */
    char pytag[32], abitag[32], plat[64];
} rel_wheel;

/* 0 on success; -1 with `err` for a name that is not a wheel file name. */
int rel_parse_wheel(const char *filename, rel_wheel *w, char *err, size_t cap);

/* The CUDA major of a wheel's cu tag: "118" -> 11, "122" -> 12, "12" -> 12; 0 if none. */
int rel_cu_major(const char *cu);

/* The target for this machine, from the probed environment. */
void rel_target_from_env(const fa_env *e, rel_target *t);

typedef struct rel_choice {
    const rel_info *rel; /* NULL when no known release fits */
    char wheel[256];
    char url[512];
    char issues[512]; /* runtime issues of the chosen wheel, "" if none */
} rel_choice;

/* The newest known release with a wheel for t and no runtime issue (else the newest with a
 * wheel at all). 1 when one was found. */
int rel_choose(const rel_target *t, rel_choice *c);

/* ---- building ---- */

/* MAX_JOBS and NVCC_THREADS for a flash-attn build with this much RAM and these CPUs. */
void rel_build_jobs(double avail_gb, int ncpu, int *max_jobs, int *nvcc_threads);
/* The rule rel_build_jobs applies, in words. */
extern const char rel_jobs_rule[];

/* TORCH_CUDA_ARCH_LIST ("8.0;9.0") and FLASH_ATTN_CUDA_ARCHS ("80;90") for these GPUs. */
void rel_arch_lists(const env_gpu *gpus, int n, char *torch_list, size_t tcap, char *fa_archs,
                    size_t fcap);

/* The newest gcc major an nvcc release accepts (NVIDIA's host compiler table). */
int rel_nvcc_gcc_max(int nvcc_major, int nvcc_minor);

/* The oldest nvcc (major*100+minor) that compiles for compute capability cc_major.cc_minor. */
int rel_nvcc_min_for_cc(int cc_major, int cc_minor);

/* The newest release this tool knows. */
const char *rel_latest(void);

/* The day rel_releases was last checked against flash-attn's releases ("YYYY-MM-DD"): a release
 * made after it is missing from the table, and `flashattn wheel` says so. */
extern const char *rel_checked;
/* Where the table in use came from: "bundled" or the cache file's path. */
extern const char *rel_source;
/* The day the bundled table was checked against flash-attn's tags. */
extern const char rel_bundled_checked[];

/* Use another table (newest first; it must outlive its use), checked on `checked`, read from
 * `source`. */
void rel_use_table(const rel_info *rows, size_t n, const char *checked, const char *source);

#endif /* FA_TOOLS_RELEASES_H */
