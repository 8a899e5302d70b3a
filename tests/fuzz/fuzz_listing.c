/* SPDX-License-Identifier: MIT */
/*
 * fuzz_listing.c — libFuzzer target for `flashattn wheel --refresh`'s readers: any bytes as the
 * release listing (the JSON reader, then the table built from the wheel names it collects) and
 * as the rows of the cache file. Build and run with `make fuzz`; tests/fuzz/test_fuzz_replay.c
 * replays it in `make test`.
 *
 * It includes tools/wheel/refresh.c for its static readers; link with tools/wheel/releases.c and
 * tools/probe/envutil.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/wheel/refresh.c"

int fa_fuzz_listing(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1), summary[256], *line, *save = NULL;
    jreader j;
    size_t i = 0;
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    memset(&j, 0, sizeof j);
    j.p = buf;
    j.end = buf + size;
    j.names = malloc(sizeof *j.names * MAX_NAMES);
    if (j.names && jvalue(&j, NULL, 0) == 0)
        build_table(j.names, j.n, summary, sizeof summary);
    free(j.names);
    for (line = strtok_r(buf, "\n", &save); line && i < MAX_ROWS;
         line = strtok_r(NULL, "\n", &save))
        parse_row(line, i++); /* the same bytes as cache rows */
    free(buf);
    return 0;
}

#ifndef FA_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fa_fuzz_listing(data, size); }
#endif
