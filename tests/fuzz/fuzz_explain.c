/* SPDX-License-Identifier: MIT */
/*
 * fuzz_explain.c — libFuzzer target for `flashattn explain`'s log reader and classifier: any
 * bytes go through the line reader (at the default line cap and at a tiny one, so the cut-off
 * paths run on short inputs), the classifier and its detail handlers (which demangle symbols),
 * the fix text and the JSON writer. Build and run with `make fuzz`; tests/fuzz/test_fuzz_replay.c
 * replays the seed corpus in `make test`.
 *
 * Link with tools/explain/{logclass,logread}.c, tools/elf/demangle.c,
 * tools/cli/json.c, tools/wheel/releases.c and tools/probe/envutil.c (and -ldl).
 */
#include <stdint.h>
#include <stdio.h>

#include "../../tools/explain/explain.c"

static logc *fz_classifier;
static FILE *fz_null;

static void fz_one(const uint8_t *data, size_t size, size_t max_line) {
    logr rd;
    const char *line;
    size_t len;
    logc_result r;
    char fix[4096];
    fixbuf fb;
    int i;
    if (logr_init_mem(&rd, data, size, max_line) != 0)
        return;
    logc_reset(fz_classifier);
    while (logr_next(&rd, &line, &len))
        logc_feed(fz_classifier, line, len, rd.line_no);
    logc_result_get(fz_classifier, &r);
    r.lines = rd.line_no;
    r.truncated_lines = rd.truncated_lines;
    logr_free(&rd);
    fb.s = fix;
    fb.len = 0;
    fb.cap = sizeof fix;
    fix[0] = '\0';
    fix_for(&r, &fb);
    json_string(fz_null, r.cls);
    json_string(fz_null, fix);
    for (i = 0; i < r.n_evidence; i++)
        json_string(fz_null, r.evidence[i]);
}

int fa_fuzz_explain(const uint8_t *data, size_t size) {
    if (!fz_classifier)
        fz_classifier = logc_new();
    if (!fz_null)
        fz_null = fopen("/dev/null", "w");
    if (!fz_classifier || !fz_null)
        return 0;
    fz_one(data, size, 0);
    fz_one(data, size, 97);
    return 0;
}

#ifndef FA_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fa_fuzz_explain(data, size); }
#endif
