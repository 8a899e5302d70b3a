/* SPDX-License-Identifier: MIT */
/*
 * test_elfread.c — the doctor's ELF reader (tools/elf/elfread.c, compiled into this
 * test). A small ELF64 shared object is assembled in memory with every table the reader uses
 * (.dynstr, .dynsym, .gnu.version, .gnu.version_r, .gnu.version_d, .dynamic) and read back
 * field by field; then every truncation of it and thousands of random corruptions must give an
 * error or a partial result, never a crash (run under ASan in `make asan`). Finally the reader
 * reads this test's own executable and the libstdc++ on the system, if there is one.
 */
#include "../../../tools/elf/elfread.c"

#include "../../test.h"

#define IMG_SIZE 4096

static unsigned char img[IMG_SIZE];
static size_t img_len;

static void p16(size_t off, unsigned v) {
    img[off] = (unsigned char)v;
    img[off + 1] = (unsigned char)(v >> 8);
}
static void p32(size_t off, uint32_t v) {
    p16(off, v & 0xffff);
    p16(off + 2, v >> 16);
}
static void p64(size_t off, uint64_t v) {
    p32(off, (uint32_t)v);
    p32(off + 4, (uint32_t)(v >> 32));
}

/* The string table; returns each string's offset. */
static const char *const strs[] = {"",
                                   "libc.so.6",
                                   "libfoo.so.1",
                                   "$ORIGIN/../lib",
                                   "mylib.so",
                                   "_ZN3c104cuda9SetDeviceEi",
                                   "puts",
                                   "my_func",
                                   "GLIBC_2.2.5",
                                   "GLIBC_2.34",
                                   "GLIBCXX_3.4.30",
                                   "libstdc++.so.6",
                                   "VERS_1.0",
                                   "weak_thing",
                                   NULL};
static uint32_t soff[16];

static void section(int i, size_t shoff, uint32_t type, uint64_t off, uint64_t size, uint32_t link,
                    uint64_t entsize) {
    size_t h = shoff + (size_t)i * 64;
    p32(h + 4, type);
    p64(h + 24, off);
    p64(h + 32, size);
    p32(h + 40, link);
    p64(h + 56, entsize);
}

static void build_image(void) {
    size_t dynstr = 0x100, dynsym = 0x200, versym = 0x300, verneed = 0x340, verdef = 0x3c0,
           dynamic = 0x400, shoff = 0x500, o = 0;
    int i;
    memset(img, 0, sizeof img);
    memcpy(img, "\177ELF", 4);
    img[4] = 2; /* 64-bit */
    img[5] = 1; /* little-endian */
    img[6] = 1;
    p16(16, 3);  /* ET_DYN */
    p16(18, 62); /* x86-64 */
    p64(40, shoff);
    p16(58, 64);
    p16(60, 7);
    /* .dynstr */
    for (i = 0; strs[i]; i++) {
        soff[i] = (uint32_t)o;
        memcpy(img + dynstr + o, strs[i], strlen(strs[i]) + 1);
        o += strlen(strs[i]) + 1;
    }
    /* .dynsym: null, undefined c10 symbol, undefined puts@GLIBC_2.2.5, defined my_func@@VERS_1.0,
     * weak undefined */
    p32(dynsym + 24 * 1, soff[5]);
    img[dynsym + 24 * 1 + 4] = (1 << 4) | 2; /* global func */
    p32(dynsym + 24 * 2, soff[6]);
    img[dynsym + 24 * 2 + 4] = (1 << 4) | 2;
    p32(dynsym + 24 * 3, soff[7]);
    img[dynsym + 24 * 3 + 4] = (1 << 4) | 2;
    p16(dynsym + 24 * 3 + 6, 9); /* defined in section 9 */
    p32(dynsym + 24 * 4, soff[13]);
    img[dynsym + 24 * 4 + 4] = (2 << 4) | 1; /* weak object */
    /* .gnu.version */
    p16(versym + 0, 0);
    p16(versym + 2, 1);
    p16(versym + 4, 2);
    p16(versym + 6, 4);
    p16(versym + 8, 0x8000 | 3); /* hidden */
    /* .gnu.version_r: libc.so.6 {GLIBC_2.2.5=2, GLIBC_2.34=3}, libstdc++.so.6 {GLIBCXX_3.4.30=5} */
    p16(verneed + 0, 1);
    p16(verneed + 2, 2);
    p32(verneed + 4, soff[1]);
    p32(verneed + 8, 16);
    p32(verneed + 12, 48);
    p16(verneed + 16 + 6, 2);
    p32(verneed + 16 + 8, soff[8]);
    p32(verneed + 16 + 12, 16);
    p16(verneed + 32 + 6, 3);
    p32(verneed + 32 + 8, soff[9]);
    p32(verneed + 32 + 12, 0);
    p16(verneed + 48 + 0, 1);
    p16(verneed + 48 + 2, 1);
    p32(verneed + 48 + 4, soff[11]);
    p32(verneed + 48 + 8, 16);
    p32(verneed + 48 + 12, 0);
    p16(verneed + 64 + 6, 5);
    p32(verneed + 64 + 8, soff[10]);
    /* .gnu.version_d: base (the file), VERS_1.0 = 4 */
    p16(verdef + 0, 1);
    p16(verdef + 2, 1);
    p16(verdef + 4, 1);
    p16(verdef + 6, 1);
    p32(verdef + 12, 20);
    p32(verdef + 16, 28);
    p32(verdef + 20, soff[4]);
    p16(verdef + 28 + 0, 1);
    p16(verdef + 28 + 4, 4);
    p16(verdef + 28 + 6, 1);
    p32(verdef + 28 + 12, 20);
    p32(verdef + 28 + 16, 0);
    p32(verdef + 48, soff[12]);
    /* .dynamic */
    p64(dynamic + 0, 1);
    p64(dynamic + 8, soff[1]);
    p64(dynamic + 16, 1);
    p64(dynamic + 24, soff[2]);
    p64(dynamic + 32, 29);
    p64(dynamic + 40, soff[3]);
    p64(dynamic + 48, 14);
    p64(dynamic + 56, soff[4]);
    /* section headers */
    section(1, shoff, 3, dynstr, o, 0, 0);
    section(2, shoff, 11, dynsym, 24 * 5, 1, 24);
    section(3, shoff, 0x6fffffff, versym, 10, 2, 2);
    section(4, shoff, 0x6ffffffe, verneed, 80, 1, 0);
    section(5, shoff, 0x6ffffffd, verdef, 56, 1, 0);
    section(6, shoff, 6, dynamic, 16 * 5, 1, 16);
    img_len = shoff + 7 * 64;
}

static const elfr_sym *find_sym(const elfr_file *f, const char *name) {
    size_t i;
    for (i = 0; i < f->n_syms; i++)
        if (!strcmp(f->syms[i].name, name))
            return &f->syms[i];
    return NULL;
}

static void test_synthetic(void) {
    elfr_file f;
    const elfr_sym *s;
    CASE_BEGIN("a synthetic ELF64 read back");
    build_image();
    CHECK_EQ_INT(elfr_parse_mem(img, img_len, &f), 0);
    CHECK_EQ_STR(f.error, "");
    CHECK_EQ_INT(f.machine, 62);
    CHECK_EQ_INT(f.type, 3);
    CHECK_EQ_INT(f.n_needed, 2);
    if (f.n_needed == 2) {
        CHECK_EQ_STR(f.needed[0], "libc.so.6");
        CHECK_EQ_STR(f.needed[1], "libfoo.so.1");
    }
    CHECK_EQ_STR(f.runpath, "$ORIGIN/../lib");
    CHECK_EQ_STR(f.soname, "mylib.so");
    CHECK(f.rpath == NULL);
    CHECK_EQ_INT(f.n_syms, 4);
    s = find_sym(&f, "_ZN3c104cuda9SetDeviceEi");
    CHECK(s && !s->defined && s->bind == 1 && s->type == 2 && s->version == NULL);
    s = find_sym(&f, "puts");
    CHECK(s && !s->defined && s->version && !strcmp(s->version, "GLIBC_2.2.5"));
    s = find_sym(&f, "my_func");
    CHECK(s && s->defined && s->version && !strcmp(s->version, "VERS_1.0") && !s->hidden_version);
    s = find_sym(&f, "weak_thing");
    CHECK(s && s->bind == 2 && s->hidden_version && s->version &&
          !strcmp(s->version, "GLIBC_2.34"));
    CHECK_EQ_INT(f.n_vneeds, 3);
    if (f.n_vneeds == 3) {
        CHECK_EQ_STR(f.vneeds[0].file, "libc.so.6");
        CHECK_EQ_STR(f.vneeds[1].version, "GLIBC_2.34");
        CHECK_EQ_STR(f.vneeds[2].file, "libstdc++.so.6");
        CHECK_EQ_STR(f.vneeds[2].version, "GLIBCXX_3.4.30");
    }
    CHECK_EQ_INT(f.n_vdefs, 1); /* the base entry names the file, not a version */
    if (f.n_vdefs == 1)
        CHECK_EQ_STR(f.vdefs[0], "VERS_1.0");
    elfr_free(&f);
    CASE_END();
}

static void test_rejects(void) {
    elfr_file f;
    static const unsigned char elf32[64] = {0x7f, 'E', 'L', 'F', 1, 1, 1};
    CASE_BEGIN("not ELF, 32-bit, empty, NULL");
    CHECK_EQ_INT(elfr_parse_mem("hello world", 11, &f), -1);
    CHECK(strstr(f.error, "not an ELF") != NULL);
    elfr_free(&f);
    CHECK_EQ_INT(elfr_parse_mem(elf32, sizeof elf32, &f), -1);
    CHECK(strstr(f.error, "64-bit") != NULL);
    elfr_free(&f);
    CHECK_EQ_INT(elfr_parse_mem("", 0, &f), -1);
    elfr_free(&f);
    CHECK_EQ_INT(elfr_parse_mem(NULL, 10, &f), -1);
    elfr_free(&f);
    CHECK_EQ_INT(elfr_open("/nonexistent/file.so", &f), -1);
    CHECK(f.error[0] != '\0');
    elfr_free(&f);
    CHECK_EQ_INT(elfr_open("/", &f), -1); /* a directory */
    elfr_free(&f);
    CASE_END();
}

static void test_truncations(void) {
    size_t n;
    CASE_BEGIN("every truncation of the image");
    build_image();
    for (n = 0; n <= img_len; n++) {
        elfr_file f;
        unsigned char *copy = malloc(n ? n : 1); /* exact size: ASan sees any overread */
        memcpy(copy, img, n);
        elfr_parse_mem(copy, n, &f);
        elfr_free(&f);
        free(copy);
    }
    CHECK(1);
    CASE_END();
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd32(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}

static void test_corruptions(void) {
    int iter;
    CASE_BEGIN("random corruptions of the tables and headers");
    for (iter = 0; iter < 5000; iter++) {
        elfr_file f;
        unsigned char *copy;
        int k, nflip = 1 + (int)(rnd32() % 8);
        build_image();
        for (k = 0; k < nflip; k++) {
            size_t at = rnd32() % img_len;
            switch (rnd32() % 4) {
            case 0:
                img[at] = (unsigned char)rnd32();
                break;
            case 1:
                img[at] = 0xff;
                break;
            case 2:
                img[at] = 0;
                break;
            default: /* a plausible-looking but wrong offset */
                if (at + 8 <= img_len)
                    p64(at, rnd32() % (img_len * 2));
                break;
            }
        }
        copy = malloc(img_len);
        memcpy(copy, img, img_len);
        elfr_parse_mem(copy, img_len, &f);
        if (f.n_needed)
            CHECK(f.needed[0] != NULL);
        elfr_free(&f);
        free(copy);
    }
    CHECK(1);
    CASE_END();
}

static void test_real_files(void) {
    elfr_file f;
    size_t i;
    int libc = 0, versioned = 0;
    CASE_BEGIN("this test's own executable");
    CHECK_EQ_INT(elfr_open("/proc/self/exe", &f), 0);
    for (i = 0; i < f.n_needed; i++)
        libc |= !strcmp(f.needed[i], "libc.so.6");
    for (i = 0; i < f.n_syms; i++)
        versioned |=
            !f.syms[i].defined && f.syms[i].version && !strncmp(f.syms[i].version, "GLIBC_", 6);
    CHECK(libc);
    CHECK(versioned);
    elfr_free(&f);
    CASE_END();

    if (elfr_open("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", &f) == 0) {
        int glibcxx = 0;
        CASE_BEGIN("the system libstdc++ defines GLIBCXX_ versions");
        for (i = 0; i < f.n_vdefs; i++)
            glibcxx |= !strncmp(f.vdefs[i], "GLIBCXX_3.4", 11);
        CHECK(glibcxx);
        CHECK(f.soname && !strcmp(f.soname, "libstdc++.so.6"));
        CASE_END();
    }
    elfr_free(&f);
}

int main(void) {
    test_synthetic();
    test_rejects();
    test_truncations();
    test_corruptions();
    test_real_files();
    return TEST_REPORT();
}
