/* SPDX-License-Identifier: MIT */
/*
 * test_releases.c — flash-attn release knowledge behind `flashattn wheel` and the doctor
 * (tools/wheel/releases.c and envutil.c, compiled into this test): setup.py's wheel name for
 * each release line (cu118/cu122 before 2.6.1, cu123 until 2.7.0, major only after, cu13 only
 * from 2.8.3.post1; the platform tag hard-coded before 2.5.7), which releases published a wheel
 * for a machine and why not, runtime traps (glibc 2.32, Blackwell before 2.8.0, 2.8.1 fatbins),
 * wheel-name parsing, version comparison, and the build rules (MAX_JOBS, arch lists, gcc).
 */
#include "../../../tools/probe/envutil.c"
#include "../../../tools/wheel/releases.c"

#include "../../test.h"

static rel_target target(const char *py, const char *torch, const char *cuda, int abi) {
    rel_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.pytag, sizeof t.pytag, "%s", py);
    t.py_minor = atoi(py + 3);
    snprintf(t.torch_mm, sizeof t.torch_mm, "%s", torch);
    snprintf(t.torch_cuda, sizeof t.torch_cuda, "%s", cuda);
    t.abi = abi;
    snprintf(t.machine, sizeof t.machine, "x86_64");
    snprintf(t.glibc, sizeof t.glibc, "2.35");
    return t;
}

static void name(const char *version, const rel_target *t, char *out, size_t cap) {
    char cu[16], plat[48];
    rel_cuda_tag(version, t->torch_cuda, cu, sizeof cu, NULL, 0);
    rel_platform_tag(version, t->machine, plat, sizeof plat);
    rel_wheel_name(version, cu, t->torch_mm, t->abi, t->pytag, plat, out, cap);
}

static void test_names(void) {
    static const struct {
        const char *version, *py, *torch, *cuda;
        int abi;
        const char *expected;
    } c[] = {
        {"2.8.3", "cp312", "2.8", "12.8", 1,
         "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"},
        {"2.7.4.post1", "cp311", "2.6", "12.4", 0,
         "flash_attn-2.7.4.post1+cu12torch2.6cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"},
        {"2.7.0", "cp310", "2.4", "11.8", 0,
         "flash_attn-2.7.0+cu11torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"},
        {"2.6.3", "cp310", "2.4", "12.1", 0,
         "flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"},
        {"2.6.0", "cp310", "2.3", "12.1", 1,
         "flash_attn-2.6.0+cu122torch2.3cxx11abiTRUE-cp310-cp310-linux_x86_64.whl"},
        {"2.5.8", "cp39", "2.1", "11.7", 0,
         "flash_attn-2.5.8+cu118torch2.1cxx11abiFALSE-cp39-cp39-linux_x86_64.whl"},
        {"2.5.0", "cp38", "2.0", "11.8", 0,
         "flash_attn-2.5.0+cu118torch2.0cxx11abiFALSE-cp38-cp38-linux_x86_64.whl"},
        /* a CUDA 13 torch: guessed as cu12 until 2.8.3.post1 */
        {"2.8.3", "cp312", "2.9", "13.0", 1,
         "flash_attn-2.8.3+cu12torch2.9cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"},
        {"2.8.3.post1", "cp312", "2.9", "13.0", 1,
         "flash_attn-2.8.3.post1+cu13torch2.9cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"},
    };
    size_t i;
    char out[256];
    for (i = 0; i < sizeof c / sizeof c[0]; i++) {
        rel_target t = target(c[i].py, c[i].torch, c[i].cuda, c[i].abi);
        CASE_BEGIN("wheel name for flash-attn %s, torch %s cu%s", c[i].version, c[i].torch,
                   c[i].cuda);
        name(c[i].version, &t, out, sizeof out);
        CHECK_EQ_STR(out, c[i].expected);
        CASE_END();
    }
    CASE_BEGIN("platform tags and URLs");
    rel_platform_tag("2.5.6", "aarch64", out, sizeof out);
    CHECK_EQ_STR(out, "linux_x86_64"); /* hard-coded before 2.5.7 */
    rel_platform_tag("2.5.7", "aarch64", out, sizeof out);
    CHECK_EQ_STR(out, "linux_aarch64");
    rel_wheel_url("2.8.3", "x.whl", out, sizeof out);
    CHECK_EQ_STR(out,
                 "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/x.whl");
    {
        char cu[16], note[256];
        CHECK_EQ_INT(rel_cuda_tag("2.8.3", "None", cu, sizeof cu, note, sizeof note), -1);
        CHECK(strstr(note, "CPU-only") != NULL);
        CHECK_EQ_INT(rel_cuda_tag("2.8.3", "13.0", cu, sizeof cu, note, sizeof note), 0);
        CHECK(strstr(note, "cu12") != NULL);
    }
    CASE_END();
}

static void test_matrix(void) {
    char why[512];
    rel_target t;
    CASE_BEGIN("which releases published a wheel, and why not");
    t = target("cp312", "2.8", "12.8", 1);
    CHECK(rel_has_wheel(rel_find("2.8.3"), &t, why, sizeof why));
    CHECK(!rel_has_wheel(rel_find("2.8.2"), &t, why, sizeof why));
    CHECK(strstr(why, "torch 2.8") != NULL);
    t = target("cp313", "2.4", "12.4", 0);
    CHECK(!rel_has_wheel(rel_find("2.8.3"), &t, why, sizeof why));
    CHECK(strstr(why, "no Python 3.13 build") != NULL);
    t = target("cp310", "2.4", "11.8", 0);
    CHECK(!rel_has_wheel(rel_find("2.7.4.post1"), &t, why, sizeof why));
    CHECK(strstr(why, "CUDA 11") != NULL);
    CHECK(rel_has_wheel(rel_find("2.7.2"), &t, why, sizeof why));
    t = target("cp311", "2.6", "", 1);
    CHECK(!rel_has_wheel(rel_find("2.8.3"), &t, why, sizeof why));
    CHECK(strstr(why, "CPU-only") != NULL);
    t = target("cp312", "2.7", "12.6", 1);
    snprintf(t.machine, sizeof t.machine, "aarch64");
    CHECK(!rel_has_wheel(rel_find("2.8.3"), &t, why, sizeof why));
    CHECK(strstr(why, "x86_64") != NULL);
    t = target("cp314", "2.8", "12.8", 1);
    CHECK(!rel_has_wheel(rel_find("2.8.3"), &t, why, sizeof why));
    CASE_END();

    CASE_BEGIN("runtime traps of a published wheel");
    t = target("cp310", "2.6", "12.4", 0);
    snprintf(t.glibc, sizeof t.glibc, "2.31");
    CHECK(rel_runtime_issues("2.8.3", &t, why, sizeof why) > 0);
    CHECK(strstr(why, "GLIBC_2.32") != NULL);
    CHECK_EQ_INT(rel_runtime_issues("2.7.4.post1", &t, why, sizeof why), 0);
    t = target("cp312", "2.6", "12.6", 1);
    t.cc_major = 12;
    CHECK(rel_runtime_issues("2.7.4.post1", &t, why, sizeof why) > 0);
    CHECK(strstr(why, "no kernel image") != NULL);
    t.driver_cuda = 12020;
    CHECK(rel_runtime_issues("2.8.1", &t, why, sizeof why) > 0);
    CHECK(strstr(why, "550") != NULL);
    t = target("cp311", "2.5", "12.4", 0);
    CHECK(rel_runtime_issues("2.8.3", &t, why, sizeof why) > 0);
    CHECK(strstr(why, "wrap_triton") != NULL);
    t = target("cp311", "2.6", "12.4", 0);
    t.cc_major = 7;
    t.cc_minor = 5;
    CHECK(rel_runtime_issues("2.7.4.post1", &t, why, sizeof why) > 0);
    CHECK(strstr(why, "sm_80") != NULL);
    CASE_END();

    CASE_BEGIN("choosing the newest release that fits");
    {
        rel_choice c;
        t = target("cp312", "2.8", "12.8", 1);
        CHECK(rel_choose(&t, &c) && !strcmp(c.rel->version, "2.8.3.post1"));
        t = target("cp310", "2.6", "12.4", 0);
        snprintf(t.glibc, sizeof t.glibc, "2.31"); /* Ubuntu 20.04: skips the 2.8.x wheels */
        CHECK(rel_choose(&t, &c) && !strcmp(c.rel->version, "2.7.4.post1"));
        CHECK_EQ_STR(
            c.wheel,
            "flash_attn-2.7.4.post1+cu12torch2.6cxx11abiFALSE-cp310-cp310-linux_x86_64.whl");
        t = target("cp312", "2.9", "12.8", 1);
        CHECK(!rel_choose(&t, &c));
        t = target("cp39", "1.13", "11.7", 0);
        CHECK(rel_choose(&t, &c) && !strcmp(c.rel->version, "2.5.9.post1"));
    }
    CASE_END();
}

static void test_parse(void) {
    rel_wheel w;
    char err[256];
    CASE_BEGIN("parsing wheel file names");
    CHECK_EQ_INT(rel_parse_wheel("/tmp/dl/flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-"
                                 "linux_x86_64.whl",
                                 &w, err, sizeof err),
                 0);
    CHECK_EQ_STR(w.dist, "flash_attn");
    CHECK_EQ_STR(w.version, "2.8.3");
    CHECK_EQ_STR(w.cu, "12");
    CHECK_EQ_STR(w.torch_mm, "2.8");
    CHECK_EQ_INT(w.abi, 1);
    CHECK_EQ_STR(w.pytag, "cp312");
    CHECK_EQ_STR(w.plat, "linux_x86_64");
    CHECK_EQ_INT(rel_parse_wheel("flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp310-cp310-linux_"
                                 "x86_64.whl",
                                 &w, err, sizeof err),
                 0);
    CHECK_EQ_STR(w.cu, "123");
    CHECK_EQ_INT(rel_cu_major(w.cu), 12);
    CHECK_EQ_INT(w.abi, 0);
    CHECK_EQ_INT(
        rel_parse_wheel("flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", &w, err, sizeof err), 0);
    CHECK_EQ_STR(w.local, "");
    CHECK_EQ_INT(w.abi, -1);
    CHECK_EQ_INT(rel_parse_wheel("flash_attn-2.7.4+rocm62torch2.5cxx11abiTRUE-cp311-cp311-"
                                 "linux_x86_64.whl",
                                 &w, err, sizeof err),
                 0);
    CHECK_EQ_STR(w.rocm, "62");
    CHECK_EQ_INT(rel_parse_wheel("flash_attn-2.8.3.tar.gz", &w, err, sizeof err), -1);
    CHECK_EQ_INT(rel_parse_wheel("a-b.whl", &w, err, sizeof err), -1);
    CHECK_EQ_INT(rel_parse_wheel(".whl", &w, err, sizeof err), -1);
    CHECK_EQ_INT(rel_parse_wheel("a-b-c-d-e-f-g.whl", &w, err, sizeof err), -1);
    CHECK_EQ_INT(rel_parse_wheel("x-1.0-1-py3-none-any.whl", &w, err, sizeof err), 0);
    CHECK_EQ_STR(w.plat, "any");
    CASE_END();
}

static void test_versions(void) {
    CASE_BEGIN("version comparison");
    CHECK(ver_cmp("3.4.30", "3.4.9") > 0);
    CHECK(ver_cmp("GLIBCXX_3.4.30", "GLIBCXX_3.4.29") > 0);
    CHECK(ver_cmp("2.8.3.post1", "2.8.3") > 0);
    CHECK(ver_cmp("2.2.0.dev20231130", "2.2.0") < 0);
    CHECK(ver_cmp("2.6.0+cu124", "2.6") == 0);
    CHECK(ver_cmp("2.5.6", "2.5.7") < 0);
    CHECK(ver_cmp("2.32", "2.4") > 0);
    CHECK(ver_cmp(NULL, "1") < 0);
    CHECK_EQ_STR(ver_after("GLIBC_2.32", "GLIBC_"), "2.32");
    CHECK(ver_after("GLIBCXX_3.4", "GLIBC_") == NULL);
    CASE_END();
}

static void test_build_rules(void) {
    int jobs, threads;
    char tl[64], fl[64];
    env_gpu gpus[3];
    CASE_BEGIN("MAX_JOBS and NVCC_THREADS from RAM and CPUs");
    rel_build_jobs(22.5, 2, &jobs, &threads);
    CHECK(jobs == 1 && threads == 2);
    rel_build_jobs(120.0, 32, &jobs, &threads);
    CHECK(jobs == 6 && threads == 4);
    rel_build_jobs(64.0, 64, &jobs, &threads);
    CHECK(jobs == 3 && threads == 4);
    rel_build_jobs(4.0, 8, &jobs, &threads);
    CHECK(jobs == 1 && threads == 2);
    rel_build_jobs(1000.0, 4, &jobs, &threads);
    CHECK(jobs == 2 && threads == 2);
    CASE_END();

    CASE_BEGIN("arch lists from the GPUs present");
    memset(gpus, 0, sizeof gpus);
    gpus[0].cc_major = 9;
    gpus[1].cc_major = 8;
    gpus[1].cc_minor = 6;
    gpus[2].cc_major = 8;
    gpus[2].cc_minor = 6;
    rel_arch_lists(gpus, 3, tl, sizeof tl, fl, sizeof fl);
    CHECK_EQ_STR(tl, "8.6;9.0");
    CHECK_EQ_STR(fl, "80;90");
    gpus[0].cc_major = 7;
    gpus[0].cc_minor = 5;
    rel_arch_lists(gpus, 1, tl, sizeof tl, fl, sizeof fl);
    CHECK_EQ_STR(tl, "7.5");
    CHECK_EQ_STR(fl, "");
    gpus[0].cc_major = 12;
    gpus[0].cc_minor = 0;
    rel_arch_lists(gpus, 1, tl, sizeof tl, fl, sizeof fl);
    CHECK_EQ_STR(fl, "120");
    rel_arch_lists(gpus, 0, tl, sizeof tl, fl, sizeof fl);
    CHECK_EQ_STR(tl, "");
    CASE_END();

    CASE_BEGIN("nvcc's gcc limit and arch minimums");
    CHECK_EQ_INT(rel_nvcc_gcc_max(11, 8), 11);
    CHECK_EQ_INT(rel_nvcc_gcc_max(12, 1), 12);
    CHECK_EQ_INT(rel_nvcc_gcc_max(12, 4), 13);
    CHECK_EQ_INT(rel_nvcc_gcc_max(12, 8), 14);
    CHECK_EQ_INT(rel_nvcc_gcc_max(13, 0), 15);
    CHECK_EQ_INT(rel_nvcc_min_for_cc(9, 0), 1108);
    CHECK_EQ_INT(rel_nvcc_min_for_cc(12, 0), 1208);
    CHECK_EQ_INT(rel_nvcc_min_for_cc(8, 0), 1100);
    CASE_END();

    CASE_BEGIN("the release table is ordered and consistent");
    {
        size_t i;
        for (i = 1; i < rel_nreleases; i++)
            CHECK_MSG(ver_cmp(rel_releases[i - 1].version, rel_releases[i].version) > 0,
                      "%s before %s", rel_releases[i - 1].version, rel_releases[i].version);
        for (i = 0; i < rel_nreleases; i++)
            CHECK(rel_releases[i].py_min <= rel_releases[i].py_max);
        CHECK_EQ_STR(rel_latest(), "2.8.3.post1");
        CHECK(strlen(rel_checked) == 10 && rel_checked[4] == '-' && rel_checked[7] == '-');
    }
    CASE_END();
}

int main(void) {
    test_names();
    test_matrix();
    test_parse();
    test_versions();
    test_build_rules();
    return TEST_REPORT();
}
