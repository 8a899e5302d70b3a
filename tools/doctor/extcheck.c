/* SPDX-License-Identifier: MIT */
/*
 * tools/doctor/ — the install doctor: `flashattn doctor`, its findings and the extension-module
 * check.
 *
 * extcheck.c — resolves an extension module's undefined symbols against the libraries it needs,
 * like the dynamic loader would, but from the files (see extcheck.h).
 *
 * Library search, in the loader's order: the module's DT_RPATH (when it has no DT_RUNPATH),
 * LD_LIBRARY_PATH, its DT_RUNPATH, the caller's directories (torch/lib), the module's own
 * directory, the run paths of libraries already found ($ORIGIN expanded: this is how torch's
 * libraries find pip's nvidia/<package>/lib), then the usual system directories. Libraries are
 * followed two levels deep. Symbols Python itself provides (Py*, _Py*) and weak references are not
 * counted as missing.
 */
#define _POSIX_C_SOURCE 200809L

#include "extcheck.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../elf/demangle.h"
#include "../elf/elfread.h"
#include "../probe/verutil.h"

#define MAX_DIRS 96

/* ---- a set of symbol names (pointers into the ELF string tables) ---------------------------- */

typedef struct symset {
    const char **slots;
    size_t cap, count;
} symset;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ull;
    }
    return h;
}

static int symset_grow(symset *s) {
    size_t ncap = s->cap ? s->cap * 2 : 4096, i;
    const char **slots = calloc(ncap, sizeof *slots);
    if (!slots)
        return -1;
    for (i = 0; i < s->cap; i++) {
        if (s->slots[i]) {
            size_t j = (size_t)hash_str(s->slots[i]) & (ncap - 1);
            while (slots[j])
                j = (j + 1) & (ncap - 1);
            slots[j] = s->slots[i];
        }
    }
    free(s->slots);
    s->slots = slots;
    s->cap = ncap;
    return 0;
}

static void symset_add(symset *s, const char *name) {
    size_t j;
    if ((s->count + 1) * 2 > s->cap && symset_grow(s) != 0)
        return;
    j = (size_t)hash_str(name) & (s->cap - 1);
    while (s->slots[j]) {
        if (!strcmp(s->slots[j], name))
            return;
        j = (j + 1) & (s->cap - 1);
    }
    s->slots[j] = name;
    s->count++;
}

static int symset_has(const symset *s, const char *name) {
    size_t j;
    if (!s->cap)
        return 0;
    j = (size_t)hash_str(name) & (s->cap - 1);
    while (s->slots[j]) {
        if (!strcmp(s->slots[j], name))
            return 1;
        j = (j + 1) & (s->cap - 1);
    }
    return 0;
}

/* ---- search directories ---------------------------------------------------------------------- */

typedef struct dirlist {
    char *d[MAX_DIRS];
    int n;
} dirlist;

static void dir_add(dirlist *l, const char *dir, size_t len) {
    int i;
    if (!len || l->n >= MAX_DIRS)
        return;
    for (i = 0; i < l->n; i++)
        if (strlen(l->d[i]) == len && !strncmp(l->d[i], dir, len))
            return;
    l->d[l->n] = malloc(len + 1);
    if (!l->d[l->n])
        return;
    memcpy(l->d[l->n], dir, len);
    l->d[l->n][len] = '\0';
    l->n++;
}

/* Adds each ':'-separated entry, with $ORIGIN / ${ORIGIN} replaced by `origin`. */
static void dir_add_path(dirlist *l, const char *list, const char *origin) {
    const char *p = list;
    while (p && *p) {
        size_t n = strcspn(p, ":");
        char buf[ENV_PATH_LEN * 2];
        size_t o = 0, i = 0;
        while (i < n && o + 1 < sizeof buf) {
            if (p[i] == '$' && (!strncmp(p + i, "$ORIGIN", 7) || !strncmp(p + i, "${ORIGIN}", 9))) {
                size_t k = strlen(origin);
                if (o + k >= sizeof buf)
                    break;
                memcpy(buf + o, origin, k);
                o += k;
                i += p[i + 1] == '{' ? 9 : 7;
            } else {
                buf[o++] = p[i++];
            }
        }
        dir_add(l, buf, o);
        p += n;
        if (*p == ':')
            p++;
    }
}

static void dir_free(dirlist *l) {
    int i;
    for (i = 0; i < l->n; i++)
        free(l->d[i]);
    l->n = 0;
}

static void dirname_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

static int find_in(const dirlist *l, const char *name, char *out, size_t cap) {
    int i;
    for (i = 0; i < l->n; i++) {
        struct stat st;
        snprintf(out, cap, "%s/%s", l->d[i], name);
        if (stat(out, &st) == 0 && S_ISREG(st.st_mode))
            return 1;
    }
    out[0] = '\0';
    return 0;
}

/* ---- the check ------------------------------------------------------------------------------- */

static int is_python_symbol(const char *s) { return !strncmp(s, "Py", 2) || !strncmp(s, "_Py", 3); }

static int is_torch_lib(const char *name) {
    return !strncmp(name, "libc10", 6) || !strncmp(name, "libtorch", 8);
}

/* Appends ", name" (or the first name) to a list, if it fits whole. */
static void list_add(char *list, size_t cap, const char *name) {
    size_t used = strlen(list), n = strlen(name);
    if (used + n + 3 > cap)
        return;
    snprintf(list + used, cap - used, "%s%s", used ? ", " : "", name);
}

static void keep_max(char *dst, size_t cap, const char *v, const char *prefix) {
    if (!ver_after(v, prefix))
        return;
    if (!dst[0] || ver_cmp(v, dst) > 0)
        snprintf(dst, cap, "%s", v);
}

void ext_check(const char *path, const char *const *dirs, int ndirs, ext_report *rep) {
    elfr_file mod;
    elfr_file *libs = NULL;
    symset defined = {NULL, 0, 0};
    dirlist first = {{0}, 0}, later = {{0}, 0};
    char origin[ENV_PATH_LEN];
    const char *ldlp = getenv("LD_LIBRARY_PATH");
    size_t i;
    int k, nlibs_read = 0, torch_cxx11 = 0, torch_seen = 0;
    static const char *const sysdirs[] = {"/lib/x86_64-linux-gnu",
                                          "/usr/lib/x86_64-linux-gnu",
                                          "/lib/aarch64-linux-gnu",
                                          "/usr/lib/aarch64-linux-gnu",
                                          "/lib64",
                                          "/usr/lib64",
                                          "/lib",
                                          "/usr/lib",
                                          "/usr/local/lib",
                                          "/usr/local/cuda/lib64",
                                          NULL};

    memset(rep, 0, sizeof *rep);
    rep->abi = -1;
    rep->torch_abi = -1;
    snprintf(rep->path, sizeof rep->path, "%s", path);
    if (elfr_open(path, &mod) != 0) {
        snprintf(rep->error, sizeof rep->error, "%s", mod.error);
        elfr_free(&mod);
        return;
    }
    rep->ok = 1;
    {
        char buf[32];
        snprintf(rep->machine, sizeof rep->machine, "%s",
                 elfr_machine_name(mod.machine, buf, sizeof buf));
    }

    /* its own undefined symbols: the C++ ABI they use */
    for (i = 0; i < mod.n_syms; i++) {
        const elfr_sym *s = &mod.syms[i];
        unsigned flags = 0;
        char *d;
        if (s->defined || !s->name[0] || s->bind == 2 || is_python_symbol(s->name))
            continue;
        rep->n_undefined++;
        if (strncmp(s->name, "_Z", 2) != 0)
            continue;
        d = dmg_demangle(s->name, &flags);
        free(d);
        if (flags & DMG_FLAG_CXX11)
            rep->n_cxx11++;
        if (flags & DMG_FLAG_OLD_STRING)
            rep->n_oldstr++;
    }
    if (rep->n_cxx11 > rep->n_oldstr)
        rep->abi = 1;
    else if (rep->n_oldstr > 0)
        rep->abi = 0;
    for (i = 0; i < mod.n_vneeds; i++) {
        keep_max(rep->glibc_needed, sizeof rep->glibc_needed, mod.vneeds[i].version, "GLIBC_");
        keep_max(rep->glibcxx_needed, sizeof rep->glibcxx_needed, mod.vneeds[i].version,
                 "GLIBCXX_");
        keep_max(rep->cxxabi_needed, sizeof rep->cxxabi_needed, mod.vneeds[i].version, "CXXABI_");
    }

    /* where the loader looks */
    dirname_of(path, origin, sizeof origin);
    if (mod.rpath && !mod.runpath)
        dir_add_path(&first, mod.rpath, origin);
    if (ldlp)
        dir_add_path(&first, ldlp, ".");
    if (mod.runpath)
        dir_add_path(&first, mod.runpath, origin);
    for (k = 0; k < ndirs && dirs; k++)
        if (dirs[k] && dirs[k][0])
            dir_add(&first, dirs[k], strlen(dirs[k]));
    dir_add(&first, origin, strlen(origin));
    for (k = 0; sysdirs[k]; k++)
        dir_add(&later, sysdirs[k], strlen(sysdirs[k]));

    /* breadth-first over needed libraries, two levels */
    libs = calloc(EXT_MAX_LIBS, sizeof *libs);
    if (!libs) {
        snprintf(rep->error, sizeof rep->error, "out of memory");
        elfr_free(&mod);
        dir_free(&first);
        dir_free(&later);
        return;
    }
    for (i = 0; i < mod.n_needed && rep->nlibs < EXT_MAX_LIBS; i++) {
        ext_lib *l = &rep->libs[rep->nlibs++];
        snprintf(l->name, sizeof l->name, "%s", mod.needed[i]);
        l->depth = 1;
        if (!strncmp(l->name, "libcudart.so.", 13))
            rep->cudart_major = atoi(l->name + 13);
    }
    for (k = 0; k < rep->nlibs; k++) {
        ext_lib *l = &rep->libs[k];
        elfr_file *ef = &libs[k];
        size_t j;
        if (!find_in(&first, l->name, l->path, sizeof l->path) &&
            !find_in(&later, l->name, l->path, sizeof l->path)) {
            rep->n_unfound++;
            if (is_torch_lib(l->name))
                list_add(rep->torch_unfound, sizeof rep->torch_unfound, l->name);
            continue;
        }
        if (elfr_open(l->path, ef) != 0) {
            elfr_free(ef);
            if (is_torch_lib(l->name))
                list_add(rep->torch_unfound, sizeof rep->torch_unfound, l->name);
            continue;
        }
        nlibs_read++;
        {
            char lo[ENV_PATH_LEN];
            dirname_of(l->path, lo, sizeof lo);
            if (ef->runpath)
                dir_add_path(&later, ef->runpath, lo);
            else if (ef->rpath)
                dir_add_path(&later, ef->rpath, lo);
        }
        for (j = 0; j < ef->n_syms; j++) {
            const elfr_sym *s = &ef->syms[j];
            if (!s->defined || !s->name[0] || s->bind == 0)
                continue;
            symset_add(&defined, s->name);
            if (is_torch_lib(l->name) && !strncmp(s->name, "_Z", 2)) {
                torch_seen = 1;
                if (strstr(s->name, "__cxx11"))
                    torch_cxx11 = 1;
            }
        }
        if (is_torch_lib(l->name) && !rep->torch_lib[0])
            snprintf(rep->torch_lib, sizeof rep->torch_lib, "%s", l->path);
        if (l->depth < 2) {
            for (j = 0; j < ef->n_needed && rep->nlibs < EXT_MAX_LIBS; j++) {
                int dup = 0, m;
                for (m = 0; m < rep->nlibs; m++)
                    dup |= !strcmp(rep->libs[m].name, ef->needed[j]);
                if (!dup) {
                    ext_lib *n = &rep->libs[rep->nlibs++];
                    snprintf(n->name, sizeof n->name, "%s", ef->needed[j]);
                    n->depth = l->depth + 1;
                }
            }
        }
    }
    if (torch_seen)
        rep->torch_abi = torch_cxx11 ? 1 : 0;

    /* undefined symbols nobody defines */
    if (nlibs_read > 0) {
        const int torch_read = rep->torch_lib[0] && !rep->torch_unfound[0];
        for (i = 0; i < mod.n_syms; i++) {
            const elfr_sym *s = &mod.syms[i];
            unsigned flags = 0;
            char *d = NULL;
            int is_torch;
            if (s->defined || !s->name[0] || s->bind == 2 || is_python_symbol(s->name))
                continue;
            if (symset_has(&defined, s->name))
                continue;
            rep->n_missing++;
            d = dmg_demangle(s->name, &flags); /* NULL unless mangled; flags for any name */
            is_torch = d && (!strncmp(d, "c10::", 5) || !strncmp(d, "at::", 4) ||
                             !strncmp(d, "torch::", 7) || !strncmp(d, "caffe2::", 8) ||
                             strstr(d, " c10::") || strstr(d, " at::"));
            if (is_torch && !torch_read) {
                /* missing because libtorch was not read: it says nothing about the ABI */
                rep->n_missing_torch_unloaded++;
            } else {
                rep->n_missing_torch += is_torch;
                if (flags & DMG_FLAG_CXX11)
                    rep->n_missing_cxx11++;
                if (flags & DMG_FLAG_OLD_STRING)
                    rep->n_missing_oldstr++;
            }
            if (rep->n_shown < EXT_MAX_SHOWN) {
                ext_missing *m = &rep->missing[rep->n_shown++];
                snprintf(m->mangled, sizeof m->mangled, "%s", s->name);
                snprintf(m->demangled, sizeof m->demangled, "%s", d ? d : "");
                m->flags = flags;
            }
            free(d);
        }
    }
    for (k = 0; k < EXT_MAX_LIBS; k++)
        elfr_free(&libs[k]);
    free(libs);
    free(defined.slots);
    elfr_free(&mod);
    dir_free(&first);
    dir_free(&later);
}

void ext_verdict(const ext_report *rep, int torch_abi, char *buf, size_t cap) {
    int tabi = torch_abi >= 0 ? torch_abi : rep->torch_abi;
    if (!rep->ok) {
        snprintf(buf, cap, "cannot read the module: %s", rep->error);
    } else if (rep->abi >= 0 && tabi >= 0 && rep->abi != tabi) {
        snprintf(
            buf, cap,
            "C++ ABI mismatch: the module was built with _GLIBCXX_USE_CXX11_ABI=%d, torch with "
            "%d; %s symbols cannot resolve. Use the wheel named cxx11abi%s or rebuild against "
            "this torch.",
            rep->abi, tabi, rep->abi ? "its std::__cxx11::basic_string" : "its old std::string",
            tabi ? "TRUE" : "FALSE");
    } else if (rep->n_missing_cxx11 || rep->n_missing_oldstr) {
        snprintf(
            buf, cap,
            "C++ ABI mismatch: %zu missing symbol(s) use %s, which the libraries it loads do "
            "not export: the module was built with _GLIBCXX_USE_CXX11_ABI=%d and the libraries "
            "with %d.",
            rep->n_missing_cxx11 + rep->n_missing_oldstr,
            rep->n_missing_cxx11 ? "std::__cxx11::basic_string" : "the old-ABI std::string",
            rep->n_missing_cxx11 ? 1 : 0, rep->n_missing_cxx11 ? 0 : 1);
    } else if (rep->n_missing_torch_unloaded && rep->torch_unfound[0]) {
        snprintf(buf, cap,
                 "libraries missing, not an ABI mismatch: %zu undefined symbol(s) are libtorch's "
                 "(c10::, at::, torch::) and the libraries that define them were not found or "
                 "read: %s. Pass --lib-dir <site-packages>/torch/lib to check against torch; in "
                 "Python, import torch first.",
                 rep->n_missing_torch_unloaded, rep->torch_unfound);
    } else if (rep->n_missing_torch_unloaded) {
        snprintf(buf, cap,
                 "libraries missing, not an ABI mismatch: %zu undefined symbol(s) are libtorch's "
                 "(c10::, at::, torch::) and it does not name libc10/libtorch as needed "
                 "libraries, so they resolve only once torch is loaded: import torch first.",
                 rep->n_missing_torch_unloaded);
    } else if (rep->n_missing_torch) {
        snprintf(buf, cap,
                 "built for another PyTorch: %zu torch symbol(s) it needs are not in the installed "
                 "torch (signatures change between releases). Reinstall it for this torch.",
                 rep->n_missing_torch);
    } else if (rep->n_missing) {
        snprintf(buf, cap, "%zu undefined symbol(s) are defined by none of its libraries%s.",
                 rep->n_missing, rep->n_unfound ? " (some libraries were not found)" : "");
    } else if (rep->n_unfound) {
        snprintf(buf, cap, "%d needed librar%s not found on the search path", rep->n_unfound,
                 rep->n_unfound == 1 ? "y is" : "ies are");
    } else {
        snprintf(buf, cap, "every undefined symbol resolves against the libraries it needs");
    }
}
