/* SPDX-License-Identifier: MIT */
/*
 * test_logclass.c — `flashattn explain`'s log reader and classifier
 * (tools/explain/logread.c, logclass.c and demangle.c, compiled into this test):
 *   - the line reader: \n, \r\n and lone \r endings, ANSI escapes, NUL and control bytes,
 *     the line cap (a long line keeps its head, the rest is skipped without being stored);
 *   - the tiers: a root cause beats generic errors wherever it is, the earliest line wins
 *     within a tier, the setup.py wheel-404 traceback never beats a real error;
 *   - the handlers: which side of the C++ ABI an undefined symbol says, headers, modules,
 *     libraries and symbol versions picked out of their lines;
 *   - context: the guessed wheel URL and torch's split CUDA-mismatch message;
 *   - streaming a large log through a small buffer.
 */
#include "../../../tools/elf/demangle.c"
#include "../../../tools/explain/logclass.c"
#include "../../../tools/explain/logmsg.c"
#include "../../../tools/explain/logread.c"

#include "../../test.h"

static int classify_str(const char *log, logc_result *r) {
    return logc_classify_mem(log, strlen(log), 0, r);
}

static void check_class(const char *log, const char *cls) {
    logc_result r;
    CHECK_EQ_INT(classify_str(log, &r), 0);
    CHECK_EQ_STR(r.cls, cls);
}

static void test_reader(void) {
    static const char data[] = "one\r\ntwo\rthree\n\x1b[1;31mred\x1b[0m text\nnul\0byte\n\nlast";
    logr rd;
    const char *line;
    size_t len;
    const char *want[] = {"one", "two", "three", "red text", "nul?byte", "", "last"};
    int i = 0;
    CASE_BEGIN("line endings, ANSI escapes, control bytes");
    CHECK_EQ_INT(logr_init_mem(&rd, data, sizeof data - 1, 0), 0);
    while (logr_next(&rd, &line, &len)) {
        if (i < 7) {
            CHECK_EQ_STR(line, want[i]);
            CHECK_EQ_INT(len, strlen(want[i]));
        }
        i++;
    }
    CHECK_EQ_INT(i, 7);
    CHECK_EQ_INT(rd.line_no, 7);
    logr_free(&rd);
    CASE_END();

    CASE_BEGIN("long lines keep their head, the rest is skipped");
    {
        size_t n = 300000, k;
        char *big = malloc(n + 16);
        for (k = 0; k < n; k++)
            big[k] = (char)('a' + k % 26);
        memcpy(big + n, "\nshort\n", 7);
        CHECK_EQ_INT(logr_init_mem(&rd, big, n + 7, 100), 0);
        CHECK(logr_next(&rd, &line, &len));
        CHECK_EQ_INT(len, 100);
        CHECK(rd.truncated);
        CHECK(!strncmp(line, "abcdefghij", 10));
        CHECK(logr_next(&rd, &line, &len));
        CHECK_EQ_STR(line, "short");
        CHECK(!rd.truncated);
        CHECK(!logr_next(&rd, &line, &len));
        CHECK_EQ_INT(rd.truncated_lines, 1);
        logr_free(&rd);
        free(big);
    }
    CASE_END();

    CASE_BEGIN("empty input and a file descriptor");
    CHECK_EQ_INT(logr_init_mem(&rd, "", 0, 0), 0);
    CHECK(!logr_next(&rd, &line, &len));
    logr_free(&rd);
    CHECK_EQ_INT(logr_init_mem(&rd, NULL, 5, 0), 0);
    CHECK(!logr_next(&rd, &line, &len));
    logr_free(&rd);
    {
        FILE *f = tmpfile();
        if (f) {
            fputs("a\nb\n", f);
            fflush(f);
            rewind(f);
            CHECK_EQ_INT(logr_init_fd(&rd, fileno(f), 0), 0);
            CHECK(logr_next(&rd, &line, &len) && !strcmp(line, "a"));
            CHECK(logr_next(&rd, &line, &len) && !strcmp(line, "b"));
            CHECK(!logr_next(&rd, &line, &len));
            logr_free(&rd);
            fclose(f);
        }
    }
    CASE_END();
}

static void test_glob(void) {
    CASE_BEGIN("glob matching");
    CHECK(glob_match("abc", "xxabcxx", 7, 0));
    CHECK(!glob_match("abc", "xxabxcx", 7, 0));
    CHECK(glob_match("a*c", "zzabbbbcz", 9, 0));
    CHECK(glob_match("version `* not found", "x: version `GLIBC_2.32' not found (req)", 39, 0));
    CHECK(!glob_match("a*c", "zzabbbb", 7, 0));
    CHECK(glob_match("MICROSOFT", "microsoft visual", 16, 1));
    CHECK(!glob_match("MICROSOFT", "microsoft visual", 16, 0));
    CHECK(!glob_match("abc", "", 0, 0));
    CHECK(glob_match("aab", "aaab", 4, 0)); /* restart after a partial match */
    CASE_END();
}

static void test_tiers(void) {
    logc_result r;
    CASE_BEGIN("a root cause beats earlier generic errors and later noise");
    CHECK_EQ_INT(classify_str("foo.cu(3): error: something odd\n"
                              "ninja: build stopped: subcommand failed.\n"
                              "c++: fatal error: Killed signal terminated program cc1plus\n"
                              "urllib.error.HTTPError: HTTP Error 404: Not Found\n"
                              "RuntimeError: Error compiling objects for extension\n",
                              &r),
                 0);
    CHECK_EQ_STR(r.cls, "build_oom");
    CHECK_EQ_INT(r.tier, 1);
    CHECK_EQ_INT(r.line_no, 3);
    CASE_END();

    CASE_BEGIN("the first of several generic errors, with the cascade as evidence");
    CHECK_EQ_INT(classify_str("[1/3] nvcc -c a.cu\n"
                              "a.cu(10): error: identifier \"x\" is undefined\n"
                              "a.cu(11): error: identifier \"y\" is undefined\n"
                              "a.cu(12): error: identifier \"z\" is undefined\n"
                              "a.cu(13): error: identifier \"w\" is undefined\n"
                              "a.cu(14): error: identifier \"v\" is undefined\n"
                              "urllib.error.HTTPError: HTTP Error 404: Not Found\n",
                              &r),
                 0);
    CHECK_EQ_STR(r.cls, "unknown");
    CHECK_EQ_INT(r.tier, 2);
    CHECK_EQ_INT(r.line_no, 2);
    CHECK_EQ_INT(r.n_evidence, LOGC_MAX_EVIDENCE);
    CHECK(strstr(r.evidence[0], "\"x\"") != NULL);
    CHECK(r.saw_wheel_404);
    CASE_END();

    CASE_BEGIN("the wheel 404 alone, the guess alone, nothing at all");
    check_class("urllib.error.HTTPError: HTTP Error 404: Not Found\n", "wheel_not_found");
    check_class("Precompiled wheel not found. Building from source...\n", "wheel_not_found");
    check_class("urllib.error.URLError: <urlopen error [Errno 111] Connection refused>\n"
                "Precompiled wheel not found. Building from source...\n",
                "wheel_download_failed");
    CHECK_EQ_INT(classify_str("all good\nSuccessfully installed flash-attn-2.8.3\n", &r), 0);
    CHECK_EQ_STR(r.cls, "unknown");
    CHECK_EQ_INT(r.tier, 0);
    CHECK_EQ_INT(r.n_evidence, 0);
    CASE_END();
}

static void test_handlers(void) {
    logc_result r;
    CASE_BEGIN("undefined symbols: which side has which ABI");
    classify_str("ImportError: x.so: undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationESs\n",
                 &r);
    CHECK_EQ_STR(r.detail, "_ZN3c105ErrorC2ENS_14SourceLocationESs");
    if (dmg_unavailable()) { /* the old std::string is seen only in the demangled name */
        printf("  no C++ demangler here (%s): the old-ABI case is not checked\n",
               dmg_unavailable());
    } else {
        CHECK_EQ_STR(r.cls, "cxx11_abi_mismatch");
        CHECK_EQ_INT(r.ext_abi, 0);
        CHECK_EQ_STR(r.demangled, "c10::Error::Error(c10::SourceLocation, std::string)");
    }
    classify_str(
        "ImportError: x.so: undefined symbol: _ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__"
        "cxx1112basic_stringIcSt11char_traitsIcESaIcEEE\n",
        &r);
    CHECK_EQ_STR(r.cls, "cxx11_abi_mismatch");
    CHECK_EQ_INT(r.ext_abi, 1);
    classify_str("ImportError: x.so: undefined symbol: _ZN2at4_ops5zeros4callEv, version TORCH\n",
                 &r);
    CHECK_EQ_STR(r.cls, "torch_version_mismatch");
    CHECK_EQ_STR(r.detail, "_ZN2at4_ops5zeros4callEv");
    classify_str("ImportError: x.so: undefined symbol: cudaGetDriverEntryPointByVersion, version "
                 "libcudart.so.12\n",
                 &r);
    CHECK_EQ_STR(r.cls, "cuda_version_mismatch");
    classify_str("ImportError: x.so: undefined symbol: PyUnicode_AsUTF8AndSize\n", &r);
    CHECK_EQ_STR(r.cls, "unknown");
    CASE_END();

    CASE_BEGIN("headers, modules, libraries, symbol versions");
    classify_str("x.h:7:10: fatal error: cusparse.h: No such file or directory\n", &r);
    CHECK_EQ_STR(r.cls, "missing_cuda_headers");
    CHECK_EQ_STR(r.detail, "cusparse.h");
    check_class("x.h:9:10: fatal error: cutlass/numeric_types.h: No such file or directory\n",
                "submodule_missing");
    check_class("x.c:1:10: fatal error: Python.h: No such file or directory\n",
                "build_deps_missing");
    check_class("x.c:1:10: fatal error: some_other.h: No such file or directory\n", "unknown");
    check_class("catastrophic error: cannot open source file \"cuda_runtime_api.h\"\n",
                "missing_cuda_headers");
    check_class("ModuleNotFoundError: No module named 'torch'\n", "torch_missing_at_build");
    check_class("ModuleNotFoundError: No module named 'torch._dynamo'\n", "torch_version_mismatch");
    check_class("ModuleNotFoundError: No module named 'psutil'\n", "build_deps_missing");
    check_class("ModuleNotFoundError: No module named 'flash_attn'\n", "extension_missing");
    check_class("ModuleNotFoundError: No module named 'rotary_emb'\n", "extension_missing");
    check_class("ModuleNotFoundError: No module named 'triton'\n", "triton_mismatch");
    check_class("ImportError: libcudart.so.11.0: cannot open shared object file: No such file\n",
                "cuda_version_mismatch");
    check_class("ImportError: libc10.so: cannot open shared object file: No such file\n",
                "torch_version_mismatch");
    check_class("OSError: libcuda.so.1: cannot open shared object file: No such file\n",
                "driver_too_old");
    classify_str("/lib/libc.so.6: version `GLIBC_2.32' not found (required by x.so)\n", &r);
    CHECK_EQ_STR(r.cls, "glibc_too_old");
    CHECK_EQ_STR(r.detail, "GLIBC_2.32");
    check_class("libstdc++.so.6: version 'CXXABI_1.3.15' not found (required by x)\n",
                "glibcxx_too_old");
    check_class("Killed\n", "build_oom");
    check_class("  Killed  \n", "build_oom");
    check_class("Killed the process group 123\n", "unknown");
    CASE_END();

    CASE_BEGIN("exception lines count only at the start of a line");
    check_class("ValueError: bad value\n", "unknown");
    CHECK_EQ_INT(classify_str("note: not an Error: just text\n", &r), 0);
    CHECK_EQ_INT(r.tier, 0);
    CASE_END();
}

static void test_context(void) {
    logc_result r;
    CASE_BEGIN("context: wheel URL, torch version, split CUDA mismatch message");
    classify_str(
        "torch.__version__  = 2.4.0+cu121\n"
        "Guessing wheel URL:  https://example/flash_attn-2.8.3+cu12torch2.4.whl\n"
        "warning: The detected CUDA version (12.1) has a minor version mismatch with the "
        "version that was used to compile PyTorch (12.4).\n"
        "The detected CUDA version (11.8) mismatches the version that was used to compile\n"
        "PyTorch (12.1). Please make sure to use the same CUDA versions.\n",
        &r);
    CHECK_EQ_STR(r.cls, "cuda_version_mismatch");
    CHECK_EQ_STR(r.wheel_url, "https://example/flash_attn-2.8.3+cu12torch2.4.whl");
    CHECK_EQ_STR(r.torch_version, "2.4.0+cu121");
    CHECK_EQ_STR(r.cuda_detected, "11.8");
    CHECK_EQ_STR(r.cuda_torch, "12.1");
    classify_str(
        "host_config.h:143:2: error: #error -- unsupported GNU version! gcc versions later "
        "than 12 are not supported!\n",
        &r);
    CHECK_EQ_STR(r.cls, "gcc_version");
    CHECK_EQ_STR(r.gcc_max, "12");
    CASE_END();
}

static void test_every_class_named(void) {
    int i, n = 0;
    CASE_BEGIN("the class list");
    for (i = 0; logc_class_names[i]; i++)
        n++;
    CHECK_EQ_INT(n, 26);
    CHECK_EQ_STR(logc_class_names[n - 1], "unknown");
    /* every rule's class is one of them */
    {
        size_t k;
        for (k = 0; k < NUM_RULES; k++) {
            int found = rules[k].cls == NULL;
            for (i = 0; logc_class_names[i] && !found; i++)
                found = !strcmp(rules[k].cls, logc_class_names[i]);
            CHECK_MSG(found, "rule %zu has class %s", k, rules[k].cls);
        }
    }
    CASE_END();
}

static void test_stream(void) {
    /* 20 MB of build noise with the real error in the middle, through the 64 KiB buffer */
    size_t line_len, total = 20u << 20, n = 0;
    const char *noise = "[12/85] /usr/local/cuda/bin/nvcc -c flash_fwd_hdim64_fp16_sm80.cu -o "
                        "flash_fwd_hdim64_fp16_sm80.o -O3 -std=c++17 --use_fast_math\n";
    const char *err = "nvcc error   : 'cicc' died due to signal 9 (Kill signal)\n";
    char *buf;
    logc_result r;
    CASE_BEGIN("a 20 MB log streamed from memory");
    line_len = strlen(noise);
    buf = malloc(total + 256);
    REQUIRE(buf != NULL);
    while (n + line_len < total) {
        memcpy(buf + n, noise, line_len);
        n += line_len;
        if (n > total / 2 && n < total / 2 + line_len) {
            memcpy(buf + n, err, strlen(err));
            n += strlen(err);
        }
    }
    CHECK_EQ_INT(logc_classify_mem(buf, n, 0, &r), 0);
    CHECK_EQ_STR(r.cls, "build_oom");
    CHECK(r.lines > 100000);
    free(buf);
    CASE_END();
}

int main(void) {
    test_reader();
    test_glob();
    test_tiers();
    test_handlers();
    test_context();
    test_every_class_named();
    test_stream();
    return TEST_REPORT();
}
