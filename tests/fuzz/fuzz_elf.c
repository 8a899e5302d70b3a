/* SPDX-License-Identifier: MIT */
/*
 * fuzz_elf.c — libFuzzer target for the doctor's ELF reader: any bytes as an ELF image; every
 * name it returns is walked (so a string pointer outside the tables would be caught by ASan).
 * Link with tools/elf/elfread.c.
 */
#include <stdint.h>
#include <string.h>

#include "../../tools/elf/elfread.h"

int fa_fuzz_elf(const uint8_t *data, size_t size) {
    elfr_file f;
    size_t i, total = 0;
    elfr_parse_mem(data, size, &f);
    for (i = 0; i < f.n_needed; i++)
        total += strlen(f.needed[i]);
    for (i = 0; i < f.n_syms; i++)
        total += strlen(f.syms[i].name) + (f.syms[i].version ? strlen(f.syms[i].version) : 0);
    for (i = 0; i < f.n_vneeds; i++)
        total += strlen(f.vneeds[i].file) + strlen(f.vneeds[i].version);
    for (i = 0; i < f.n_vdefs; i++)
        total += strlen(f.vdefs[i]);
    if (f.soname)
        total += strlen(f.soname);
    if (f.runpath)
        total += strlen(f.runpath);
    if (f.rpath)
        total += strlen(f.rpath);
    elfr_free(&f);
    return (int)(total & 0);
}

#ifndef FA_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fa_fuzz_elf(data, size); }
#endif
