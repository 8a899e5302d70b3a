/* SPDX-License-Identifier: MIT */
/*
 * test_fuzz_replay.c — a short, deterministic replay of the fuzz targets in tests/fuzz/
 * (explain's log reader and classifier, the ELF reader, wheel --refresh's listing and cache
 * readers) in `make test`, so the
 * harnesses keep compiling and the seed corpora, the log fixtures, any crash inputs saved in
 * tests/fuzz/corpus/ and a few thousand generated inputs keep passing without clang. The real
 * fuzzing is `make fuzz` (libFuzzer).
 */
#define FA_FUZZ_NO_ENTRY 1

#include "../../tools/cli/json.c"
#include "../../tools/elf/demangle.c"
#include "../../tools/elf/elfread.c"
#include "../../tools/explain/logclass.c"
#include "../../tools/explain/logmsg.c"
#include "../../tools/explain/logread.c"
#include "../../tools/probe/envutil.c"
#include "../../tools/wheel/releases.c"
#include "fuzz_elf.c"
#include "fuzz_explain.c"
#include "fuzz_listing.c"

#include <dirent.h>

#include "../test.h"

typedef int (*target_fn)(const uint8_t *, size_t);

static unsigned char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Runs the target on every regular file of a directory; returns how many. */
static int replay_dir(const char *dir, target_fn fn) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!d)
        return 0;
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        unsigned char *data;
        size_t size = 0;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        data = slurp(path, &size);
        if (!data)
            continue;
        fn(data, size);
        free(data);
        n++;
    }
    closedir(d);
    return n;
}

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}

int main(void) {
    const char *src = getenv("FA_TEST_SRC_DIR");
    char dir[4096];
    int n, i;
    if (!src)
        src = "..";

    CASE_BEGIN("replay the explain fuzz corpus, the log fixtures and the real-log corpus");
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/explain", src);
    n = replay_dir(dir, fa_fuzz_explain);
    snprintf(dir, sizeof dir, "%s/tests/tools/explain/logs", src);
    n += replay_dir(dir, fa_fuzz_explain);
    snprintf(dir, sizeof dir, "%s/tests/tools/explain/corpus", src);
    n += replay_dir(dir, fa_fuzz_explain);
    CHECK_MSG(n >= 30, "only %d inputs found under %s", n, src);
    CASE_END();

    CASE_BEGIN("replay the elf corpus");
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/elf", src);
    replay_dir(dir, fa_fuzz_elf); /* optional: crash inputs saved by `make fuzz` */
    {
        size_t size = 0;
        unsigned char *self = slurp("/proc/self/exe", &size);
        if (self) {
            fa_fuzz_elf(self, size);
            for (i = 0; i < 200; i++) { /* corrupted copies of a real executable */
                size_t k, at;
                unsigned char *copy = malloc(size);
                memcpy(copy, self, size);
                for (k = 0; k < 4; k++) {
                    at = rnd() % (size < 8192 ? size : 8192); /* the headers */
                    copy[at] = (unsigned char)rnd();
                }
                fa_fuzz_elf(copy, i % 2 ? size : rnd() % size);
                free(copy);
            }
            free(self);
        }
    }
    CASE_END();

    CASE_BEGIN("replay the release listing fixtures");
    snprintf(dir, sizeof dir, "%s/tests/tools/wheel", src);
    n = replay_dir(dir, fa_fuzz_listing);
    CHECK_MSG(n >= 1, "no listing fixture under %s", dir);
    CASE_END();

    CASE_BEGIN("generated inputs");
    for (i = 0; i < 3000; i++) {
        unsigned char buf[512];
        size_t len = rnd() % sizeof buf, k;
        static const char *const words[] = {"error: ",
                                            "undefined symbol: _ZN3c10",
                                            "Killed\n",
                                            "No module named '",
                                            "fatal error: ",
                                            "\r",
                                            "\n",
                                            "version `GLIBC_",
                                            "\x1b[",
                                            "Error:",
                                            "_ZSt",
                                            "S_"};
        for (k = 0; k < len; k++)
            buf[k] = (unsigned char)rnd();
        for (k = 0; k + 32 < len && k < 8; k++) {
            const char *w = words[rnd() % 12];
            size_t at = rnd() % (len - 32);
            memcpy(buf + at, w, strlen(w));
        }
        fa_fuzz_explain(buf, len);
        fa_fuzz_elf(buf, len);
        fa_fuzz_listing(buf, len);
    }
    CHECK(1);
    CASE_END();
    return TEST_REPORT();
}
