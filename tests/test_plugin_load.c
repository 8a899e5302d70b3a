/* SPDX-License-Identifier: MIT */
/*
 * test_plugin_load.c — what `flashattn doctor` reports as the CUDA plug-in's state comes from
 * the core's loader (src/plugin.c): a plug-in file that is cut short or is not a regular file
 * must give FA_ERR_DEVICE with a message naming the path and what is wrong, never a crash
 * (dlopen maps a truncated file's segments as described, and touching a page past its end is a
 * SIGBUS) nor a wait (opening a FIFO). Each case runs in a child process, since the library
 * tries to load the plug-in once per process: copies of a real shared object truncated at every
 * size that matters (inside the ELF header, the program headers, each segment, the section
 * headers), one with a program header table moved past the end, a FIFO, a directory, and the
 * intact file as the control. The shared object is the fake plug-in built next to this test
 * (tests/fake_cuda_plugin.c) when it is there, and libflashattn.so itself always.
 */
#define _GNU_SOURCE /* dladdr */

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashattn.h"
#include "test.h"

static char g_dir[] = "/tmp/fa_test_plugin_XXXXXX";

typedef struct outcome {
    int exited, signal; /* how the child ended */
    int status, count;  /* fa_device_count's answer */
    char message[2048]; /* fa_last_error_message() */
} outcome;

/* fa_device_count(FA_DEVICE_CUDA) in a child with FA_CUDA_PLUGIN=path, 20 s at most. */
static outcome load_in_child(const char *path) {
    outcome o;
    int fds[2];
    memset(&o, 0, sizeof o);
    o.status = -1;
    if (pipe(fds) != 0)
        return o;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        outcome c;
        memset(&c, 0, sizeof c);
        close(fds[0]);
        alarm(20);
        setenv("FA_CUDA_PLUGIN", path, 1);
        int32_t n = -1;
        c.status = (int)fa_device_count(FA_DEVICE_CUDA, &n);
        c.count = n;
        snprintf(c.message, sizeof c.message, "%s", fa_last_error_message());
        _exit(write(fds[1], &c, sizeof c) == (ssize_t)sizeof c ? 0 : 3);
    }
    close(fds[1]);
    if (pid > 0) {
        outcome c;
        size_t got = 0;
        ssize_t r;
        while (got < sizeof c && (r = read(fds[0], (char *)&c + got, sizeof c - got)) > 0)
            got += (size_t)r;
        int ws = 0;
        waitpid(pid, &ws, 0);
        if (got == sizeof c)
            o = c;
        o.exited = WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && got == sizeof c;
        o.signal = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
    }
    close(fds[0]);
    return o;
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n)) != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = buf ? (size_t)n : 0;
    return buf;
}

static int write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(data, 1, size, f) == size;
    if (f && fclose(f) != 0)
        ok = 0;
    return ok ? 0 : -1;
}

/* The copy of `data` cut at `size` bytes must be refused cleanly, the message naming it and (for
 * files with a whole ELF identification) saying it is truncated or damaged. */
static void expect_refused(const char *label, const char *path, const unsigned char *data,
                           size_t size, const char *why) {
    CASE_BEGIN("%s: %s (%zu bytes)", label, why, size);
    REQUIRE(write_file(path, data, size) == 0);
    const outcome o = load_in_child(path);
    CHECK_MSG(o.exited, "the child did not return: signal %d (%s)", o.signal,
              o.signal ? strsignal(o.signal) : "no answer");
    if (o.exited) {
        CHECK_EQ_INT(o.status, FA_ERR_DEVICE);
        CHECK_MSG(strstr(o.message, path) != NULL, "message \"%s\" does not name %s", o.message,
                  path);
        if (size >= EI_NIDENT)
            CHECK_MSG(strstr(o.message, "truncated or damaged ELF file") != NULL,
                      "message \"%s\" does not say the file is truncated", o.message);
    }
    CASE_END();
}

/* Truncations of one shared object at the sizes where each part of it ends or begins. */
static void truncations(const char *label, const char *src, int loads) {
    size_t size = 0;
    unsigned char *data = read_file(src, &size);
    char path[256];
    snprintf(path, sizeof path, "%s/cut.so", g_dir);
    CASE_BEGIN("%s: read %s", label, src);
    CHECK_MSG(data && size > sizeof(Elf64_Ehdr), "cannot read %s", src);
    CASE_END();
    if (!data || size <= sizeof(Elf64_Ehdr))
        return;
    Elf64_Ehdr eh;
    memcpy(&eh, data, sizeof eh);

    /* the intact file: the control */
    CASE_BEGIN("%s: the intact file", label);
    REQUIRE(write_file(path, data, size) == 0);
    outcome o = load_in_child(path);
    CHECK(o.exited);
    if (loads) {
        CHECK_EQ_INT(o.status, FA_OK);
        CHECK_EQ_INT(o.count, 1);
    } else {
        CHECK_EQ_INT(o.status, FA_ERR_DEVICE); /* loads, but is no plug-in */
        CHECK_MSG(strstr(o.message, "not a flashattn plug-in") != NULL, "message \"%s\"",
                  o.message);
    }
    CASE_END();

    static const size_t small[] = {0, 1, 15, 16, 17, 63, 64, 65};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        expect_refused(label, path, data, small[i], "inside the ELF header");
    const size_t ph_end = (size_t)eh.e_phoff + (size_t)eh.e_phnum * sizeof(Elf64_Phdr);
    expect_refused(label, path, data, ph_end - 1, "inside the program headers");
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        memcpy(&ph, data + eh.e_phoff + (size_t)i * sizeof ph, sizeof ph);
        if (ph.p_type != PT_LOAD || ph.p_filesz == 0)
            continue;
        const size_t end = (size_t)(ph.p_offset + ph.p_filesz);
        char why[64];
        snprintf(why, sizeof why, "inside PT_LOAD segment %u", i);
        if (end - 1 >= ph_end)
            expect_refused(label, path, data, end - 1, why);
        if (ph.p_offset + ph.p_filesz / 2 >= ph_end)
            expect_refused(label, path, data, (size_t)(ph.p_offset + ph.p_filesz / 2), why);
    }
    if (eh.e_shoff && eh.e_shoff < size) {
        expect_refused(label, path, data, (size_t)eh.e_shoff + 1, "inside the section headers");
        expect_refused(label, path, data, size - 1, "one byte short");
    }

    /* whole, but its program header table points past the end */
    Elf64_Ehdr bent = eh;
    bent.e_phoff = (Elf64_Off)size - 8;
    memcpy(data, &bent, sizeof bent);
    expect_refused(label, path, data, size, "program headers moved past the end");
    free(data);
    unlink(path);
}

/* A FIFO (dlopen would wait for a writer forever) and a directory. */
static void file_types(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/fifo.so", g_dir);
    CASE_BEGIN("a FIFO as the plug-in");
    REQUIRE(mkfifo(path, 0600) == 0);
    outcome o = load_in_child(path);
    CHECK_MSG(o.exited, "the child did not return: signal %d (SIGALRM: it blocked)", o.signal);
    CHECK_EQ_INT(o.status, FA_ERR_DEVICE);
    CHECK_MSG(strstr(o.message, "a FIFO, not a regular file") != NULL, "message \"%s\"", o.message);
    CASE_END();
    unlink(path);

    CASE_BEGIN("a directory as the plug-in");
    o = load_in_child(g_dir);
    CHECK(o.exited);
    CHECK_EQ_INT(o.status, FA_ERR_DEVICE);
    CHECK_MSG(strstr(o.message, "a directory, not a regular file") != NULL, "message \"%s\"",
              o.message);
    CASE_END();
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* the fake plug-in, built in this directory (the tests' working directory) */
    char fake[1024];
    if (getcwd(fake, sizeof fake - 32)) {
        strcat(fake, "/libfa_fake_cuda_plugin.so");
        if (access(fake, R_OK) == 0)
            truncations("fake plug-in", fake, 1);
        else
            printf("note: %s not built; truncating libflashattn.so only\n", fake);
    }
    /* libflashattn.so itself: a real shared object everywhere this test runs */
    Dl_info info;
    memset(&info, 0, sizeof info);
    unsigned (*fn)(void) = fa_version;
    void *sym;
    memcpy(&sym, &fn, sizeof sym);
    CASE_BEGIN("find libflashattn.so");
    CHECK(dladdr(sym, &info) && info.dli_fname);
    CASE_END();
    if (info.dli_fname)
        truncations("libflashattn.so", info.dli_fname, 0);
    file_types();
    rmdir(g_dir);
    return TEST_REPORT();
}
