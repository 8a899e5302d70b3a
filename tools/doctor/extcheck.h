/* SPDX-License-Identifier: MIT */
/*
 * tools/doctor/ — the install doctor: `flashattn doctor`, its findings and the extension-module
 * check.
 *
 * extcheck.h — why a compiled extension module (flash_attn_2_cuda*.so) does or would not load,
 * read from ELF files only (nothing is loaded): which C++ ABI its std::string symbols use,
 * which libraries it needs and where the loader would find them, which of its undefined
 * symbols none of those libraries defines (demangled), and the newest GLIBC_/GLIBCXX_/CXXABI_
 * versions it needs.
 */
#ifndef FA_TOOLS_EXTCHECK_H
#define FA_TOOLS_EXTCHECK_H

#include <stddef.h>

#include "../probe/envprobe.h"

#define EXT_MAX_LIBS 64
#define EXT_MAX_SHOWN 16

typedef struct ext_lib {
    char name[128];          /* DT_NEEDED entry */
    char path[ENV_PATH_LEN]; /* where it was found, "" if not */
    int depth;               /* 1 = needed by the module itself */
} ext_lib;

typedef struct ext_missing {
    char mangled[512];
    char demangled[1024]; /* "" when it does not demangle */
    unsigned flags;       /* DMG_FLAG_* */
} ext_missing;

typedef struct ext_report {
    int ok; /* the module was read */
    char error[256];
    char path[ENV_PATH_LEN];
    char machine[32];
    size_t n_undefined;       /* undefined, non-weak symbols, not counting Python's own */
    int abi;                  /* _GLIBCXX_USE_CXX11_ABI it was built with: 1, 0, -1 unknown */
    size_t n_cxx11, n_oldstr; /* undefined symbols with std::__cxx11 / old std::string */
    ext_lib libs[EXT_MAX_LIBS];
    int nlibs;
    int n_unfound;    /* needed libraries not found */
    size_t n_missing; /* undefined symbols no library defines */
    /* of those: libtorch's (c10::, at::, torch::, caffe2::) with the libraries that define them
     * read, and with them not read (a libc10/libtorch* it needs was not found, or it needs none:
     * it relies on `import torch` having loaded them); the std::string flavours counted only
     * among the symbols whose libraries were read, since only those say anything about the ABI */
    size_t n_missing_torch, n_missing_torch_unloaded, n_missing_cxx11, n_missing_oldstr;
    char torch_unfound[200]; /* the libc10/libtorch* it needs that were not found or read */
    ext_missing missing[EXT_MAX_SHOWN];
    int n_shown;
    int torch_abi; /* ABI of the torch libraries it needs (libc10/libtorch*), -1 unknown */
    char torch_lib[ENV_PATH_LEN];
    char glibc_needed[32], glibcxx_needed[32], cxxabi_needed[32];
    int cudart_major; /* NEEDED libcudart.so.N: N; 0 if none */
} ext_report;

/* Checks the module at `path`; `dirs` (may be NULL) are searched for its libraries before the
 * system directories (torch's lib directory, for instance). Fills *rep; never fails hard. */
void ext_check(const char *path, const char *const *dirs, int ndirs, ext_report *rep);

/* The verdict in one sentence ("built with _GLIBCXX_USE_CXX11_ABI=0 but torch with 1: ..."). */
void ext_verdict(const ext_report *rep, int torch_abi, char *buf, size_t cap);

#endif /* FA_TOOLS_EXTCHECK_H */
