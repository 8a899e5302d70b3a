/* SPDX-License-Identifier: MIT */
/*
 * fuzz_demangle.c — libFuzzer target for the doctor's demangler: any bytes as a symbol name
 * (with and without a "_Z" prefix forced on). Link with tools/flashattn/demangle.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/flashattn/demangle.h"

int fa_fuzz_demangle(const uint8_t *data, size_t size) {
    unsigned flags;
    char *d = dmg_demangle_n((const char *)data, size, &flags);
    free(d);
    if (size < 4096) {
        char buf[4100];
        buf[0] = '_';
        buf[1] = 'Z';
        memcpy(buf + 2, data, size);
        d = dmg_demangle_n(buf, size + 2, &flags);
        free(d);
    }
    return 0;
}

#ifndef FA_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fa_fuzz_demangle(data, size);
}
#endif
