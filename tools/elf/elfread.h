/* SPDX-License-Identifier: MIT */
/*
 * tools/elf/ — reading shared objects for the doctor: the ELF reader, and C++ names through the
 * system's demangler.
 *
 * elfread.h — reads what the dynamic loader sees in a 64-bit little-endian ELF shared object,
 * straight from the file: DT_NEEDED, SONAME, RPATH/RUNPATH, the dynamic symbols (defined or
 * undefined, binding, symbol version), the versions it needs from each library (GLIBC_2.32,
 * GLIBCXX_3.4.30, ...) and the versions it defines (libstdc++'s GLIBCXX_*). Every offset and
 * size read from the file is checked against the file before use, so a truncated or hostile
 * file gives an error message, never a crash. Only the needed tables are read (pread), so a
 * 1 GB libtorch_cuda.so costs a few MB of memory.
 */
#ifndef FA_TOOLS_ELFREAD_H
#define FA_TOOLS_ELFREAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct elfr_sym {
    const char *name;    /* never NULL ("" when the name offset is invalid) */
    const char *version; /* symbol version ("GLIBCXX_3.4.21"), or NULL */
    unsigned char bind;  /* 0 local, 1 global, 2 weak, other: as in the file */
    unsigned char type;  /* 0 none, 1 object, 2 func, 6 TLS, 10 GNU ifunc ... */
    unsigned char defined;
    unsigned char hidden_version; /* a non-default version (name@VER, not name@@VER) */
} elfr_sym;

typedef struct elfr_vneed {
    const char *file;    /* "libstdc++.so.6" */
    const char *version; /* "GLIBCXX_3.4.30" */
} elfr_vneed;

typedef struct elfr_file {
    char error[200];  /* why parsing stopped; "" when everything was read */
    uint16_t machine; /* e_machine: 62 x86-64, 183 aarch64 */
    uint16_t type;    /* e_type: 2 executable, 3 shared object / PIE */
    const char **needed;
    size_t n_needed;
    const char *soname, *rpath, *runpath; /* NULL when absent */
    elfr_sym *syms;
    size_t n_syms;
    elfr_vneed *vneeds;
    size_t n_vneeds;
    const char **vdefs; /* version names this object defines */
    size_t n_vdefs;
    /* owned storage */
    char *strtab;
    size_t strtab_size;
    char *strtab2; /* the dynamic section's string table when it is a different one */
    size_t strtab2_size;
} elfr_file;

/* Reads `path`. Returns 0 when the file is an ELF64 LE object whose dynamic tables were read
 * (some may be absent), -1 otherwise; in both cases out->error says what went wrong, if
 * anything, and elfr_free(out) must be called. Anything but a regular file (a FIFO, a
 * directory, a device) is refused at once, without waiting for a writer. */
int elfr_open(const char *path, elfr_file *out);

/* The same for an image in memory (tests and the fuzzer). */
int elfr_parse_mem(const void *data, size_t size, elfr_file *out);

void elfr_free(elfr_file *f);

/* "x86_64", "aarch64", ... or "machine N". Static storage or `buf`. */
const char *elfr_machine_name(uint16_t machine, char *buf, size_t bufsize);

#endif /* FA_TOOLS_ELFREAD_H */
