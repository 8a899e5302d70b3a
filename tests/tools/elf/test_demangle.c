/* SPDX-License-Identifier: MIT */
/*
 * test_demangle.c — tools/elf/demangle.c (compiled into this test): names demangled by the
 * system's __cxa_demangle, the two C++-ABI flags the doctor's verdict rests on (std::__cxx11 and
 * the old std::string, and not std::string_view), "@VERSION" suffixes, names that are not
 * mangled or too long; then, in child processes, FLASHATTN_DEMANGLER=none and a missing runtime:
 * no name demangled, the reason given, and DMG_FLAG_CXX11 still read from the mangled name.
 */
#include "../../../tools/elf/demangle.c"

#include <sys/wait.h>
#include <unistd.h>

#include "../../test.h"

typedef struct dm_case {
    const char *mangled, *expected; /* expected NULL: must not demangle */
    unsigned flags;
} dm_case;

static const dm_case cases[] = {
    {"_ZN3c106detail14torchCheckFailEPKcS2_jRKSs",
     "c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::string const&)",
     DMG_FLAG_OLD_STRING},
    {"_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
     "c10::detail::torchCheckFail(char const*, char const*, unsigned int, "
     "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&)",
     DMG_FLAG_CXX11},
    {"_ZN3c104cuda9SetDeviceEa@@TORCH_2", "c10::cuda::SetDevice(signed char)", 0},
    {"_ZN3c104cuda9SetDeviceEa", "c10::cuda::SetDevice(signed char)", 0},
    {"_ZN2at4nameB5cxx11Ev", "at::name[abi:cxx11]()", DMG_FLAG_CXX11},
    {"_ZNKSt17basic_string_viewIcSt11char_traitsIcEE4sizeEv",
     "std::basic_string_view<char, std::char_traits<char> >::size() const", 0},
    {"_ZN3fooC1ESb", "foo::foo(std::basic_string)", DMG_FLAG_OLD_STRING},
    {"not_mangled", NULL, 0},
    {"_Z", NULL, 0},
    {"_Zxx", NULL, 0},
    {"", NULL, 0},
};

/* Runs body() in a child with FLASHATTN_DEMANGLER=value; the child's CHECK failures make it exit 1.
 */
static int in_child(const char *value, int (*body)(void)) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        setenv("FLASHATTN_DEMANGLER", value, 1);
        dmg_tried = 0; /* the parent's lookup is inherited: look again */
        dmg_fn = NULL;
        _exit(body());
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int without_demangler(void) {
    const char *why = dmg_unavailable();
    unsigned f = 0;
    char *d = dmg_demangle(cases[1].mangled, &f);
    int bad = why == NULL || d != NULL || f != DMG_FLAG_CXX11;
    if (why)
        printf("  reason given: %s\n", why);
    free(d);
    d = dmg_demangle(cases[0].mangled, &f); /* the old string needs the demangled name */
    bad |= d != NULL || f != 0;
    free(d);
    return bad;
}

static int turned_off(void) {
    const char *why = dmg_unavailable();
    return without_demangler() || !why || !strstr(why, "FLASHATTN_DEMANGLER=none");
}

static int missing_runtime(void) {
    const char *why = dmg_unavailable();
    return without_demangler() || !why || !strstr(why, "/nonexistent/libstdc++.so.6");
}

int main(void) {
    CASE_BEGIN("the system's demangler");
    const char *why = dmg_unavailable();
    if (why) {
        printf("  no C++ runtime here (%s): only the cases without one run\n", why);
    } else {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            unsigned f = 0xffu;
            char *d = dmg_demangle(cases[i].mangled, &f);
            if (cases[i].expected) {
                CHECK_MSG(d && !strcmp(d, cases[i].expected), "%s: got \"%s\", want \"%s\"",
                          cases[i].mangled, d ? d : "(NULL)", cases[i].expected);
                CHECK_MSG(f == cases[i].flags, "%s: flags %u, want %u", cases[i].mangled, f,
                          cases[i].flags);
            } else {
                CHECK_MSG(!d, "%s demangled to \"%s\"", cases[i].mangled, d);
            }
            free(d);
        }
    }
    CASE_END();

    CASE_BEGIN("lengths: n bytes only, too long, embedded NUL");
    {
        const char *s = "_ZN3c104cuda9SetDeviceEaGARBAGE";
        char *d = dmg_demangle_n(s, strlen("_ZN3c104cuda9SetDeviceEa"), NULL);
        CHECK(why ? !d : d && !strcmp(d, "c10::cuda::SetDevice(signed char)"));
        free(d);
        static char big[DMG_MAX_NAME + 2];
        memset(big, 'a', sizeof big - 1);
        big[0] = '_', big[1] = 'Z', big[2] = '1', big[3] = 'f', big[4] = 'v';
        CHECK(dmg_demangle(big, NULL) == NULL);
        CHECK(dmg_demangle_n("_Z1f\0v", 6, NULL) == NULL);
    }
    CASE_END();

    CASE_BEGIN("FLASHATTN_DEMANGLER=none");
    CHECK_EQ_INT(in_child("none", turned_off), 0);
    CASE_END();

    CASE_BEGIN("FLASHATTN_DEMANGLER names a missing runtime");
    CHECK_EQ_INT(in_child("/nonexistent/libstdc++.so.6", missing_runtime), 0);
    CASE_END();
    return TEST_REPORT();
}
