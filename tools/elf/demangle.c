/* SPDX-License-Identifier: MIT */
/*
 * tools/elf/ — reading shared objects for the doctor: the ELF reader, and C++ names through the
 * system's demangler.
 *
 * demangle.c — the system's __cxa_demangle, found at run time (see demangle.h), and the two
 * C++-ABI facts the doctor reads from a name.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "demangle.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DMG_MAX_NAME = 4096 };

typedef char *(*cxa_demangle_fn)(const char *mangled, char *buf, size_t *len, int *status);

static cxa_demangle_fn dmg_fn;
static char dmg_why[512];
static int dmg_tried;

/* The C++ runtimes that define __cxa_demangle, in the order tried. */
static const char *const dmg_runtimes[] = {"libstdc++.so.6", "libc++abi.so.1", "libc++.so.1"};

static void dmg_load_from(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(dmg_why, sizeof dmg_why, "%s", e ? e : lib);
        return;
    }
    /* dlsym returns a data pointer; POSIX guarantees it converts to a function pointer */
    *(void **)&dmg_fn = dlsym(h, "__cxa_demangle");
    if (!dmg_fn) {
        snprintf(dmg_why, sizeof dmg_why, "%s has no __cxa_demangle", lib);
        dlclose(h);
    }
}

static cxa_demangle_fn dmg_lookup(void) {
    if (dmg_tried)
        return dmg_fn;
    dmg_tried = 1;
    const char *lib = getenv("FLASHATTN_DEMANGLER");
    if (lib && *lib) {
        if (!strcmp(lib, "none"))
            snprintf(dmg_why, sizeof dmg_why, "turned off by FLASHATTN_DEMANGLER=none");
        else
            dmg_load_from(lib);
        return dmg_fn;
    }
    for (size_t i = 0; i < sizeof dmg_runtimes / sizeof dmg_runtimes[0] && !dmg_fn; i++)
        dmg_load_from(dmg_runtimes[i]);
    if (dmg_fn)
        dmg_why[0] = 0;
    return dmg_fn;
}

const char *dmg_unavailable(void) { return dmg_lookup() ? NULL : dmg_why; }

/* s contains `word` followed by a character that cannot continue a C++ name. */
static int has_word(const char *s, const char *word) {
    const size_t n = strlen(word);
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word))
        if (!isalnum((unsigned char)p[n]) && p[n] != '_')
            return 1;
    return 0;
}

/* The first len bytes of s contain `word`. */
static int has_bytes(const char *s, size_t len, const char *word) {
    const size_t n = strlen(word);
    for (size_t i = 0; i + n <= len; i++)
        if (!memcmp(s + i, word, n))
            return 1;
    return 0;
}

char *dmg_demangle_n(const char *mangled, size_t len, unsigned *flags) {
    char name[DMG_MAX_NAME + 1];
    const char *at = memchr(mangled, '@', len);
    if (flags)
        *flags = 0;
    if (at)
        len = (size_t)(at - mangled);
    /* std::__cxx11 is "St7__cxx11", the [abi:cxx11] tag "B5cxx11": read from the name as given,
     * so it needs no demangler (and holds for any name, mangled or not) */
    if (flags && (has_bytes(mangled, len, "__cxx11") || has_bytes(mangled, len, "B5cxx11")))
        *flags |= DMG_FLAG_CXX11;
    if (len < 3 || len > DMG_MAX_NAME || mangled[0] != '_' || mangled[1] != 'Z' ||
        memchr(mangled, 0, len))
        return NULL;
    memcpy(name, mangled, len);
    name[len] = 0;
    const cxa_demangle_fn fn = dmg_lookup();
    if (!fn)
        return NULL;
    int status = -1;
    char *d = fn(name, NULL, NULL, &status);
    if (status != 0 || !d) {
        free(d);
        return NULL;
    }
    /* The old-ABI string prints as std::string (Ss) or std::basic_string (Sb); the new one is
     * always std::__cxx11::basic_string. */
    if (flags && (has_word(d, "std::string") || has_word(d, "std::basic_string")))
        *flags |= DMG_FLAG_OLD_STRING;
    return d;
}

char *dmg_demangle(const char *mangled, unsigned *flags) {
    return dmg_demangle_n(mangled, strlen(mangled), flags);
}
