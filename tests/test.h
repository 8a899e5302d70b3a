/* SPDX-License-Identifier: MIT */
/*
 * test.h — a tiny test harness in the spirit of libuv's task.h, header-only.
 *
 * A test program is a sequence of cases. A case starts with CASE_BEGIN("fmt", ...) and ends
 * with CASE_END(); the checks in between (CHECK, CHECK_EQ_INT, ...) are non-fatal: a failing
 * check prints file:line, the expression and the values, marks the current case failed and
 * execution goes on (so one bad element does not hide the others). REQUIRE(...) is the fatal
 * variant: on failure it marks the case failed and `return`s from the enclosing function, so
 * use it only in functions that return void.
 *
 * At the end TEST_REPORT() prints a line "N passed, N failed" (counting cases) on its own
 * line and evaluates to the process exit status (0 when nothing failed).
 *
 * Checks made outside any case are counted as a case of their own each.
 */
#ifndef FA_TEST_H
#define FA_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct test_state_ {
    long cases_passed, cases_failed;
    long checks, checks_failed;
    int in_case;
    int case_failed;
    int case_messages; /* failure messages printed in the current case */
    char case_name[256];
} test_state_;

static test_state_ test_state_g_;

/* At most this many failure messages are printed per case (the rest are only counted). */
#ifndef TEST_MAX_MESSAGES_PER_CASE
#define TEST_MAX_MESSAGES_PER_CASE 8
#endif

static inline void test_case_begin_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(test_state_g_.case_name, sizeof test_state_g_.case_name, fmt, ap);
    va_end(ap);
    test_state_g_.in_case = 1;
    test_state_g_.case_failed = 0;
    test_state_g_.case_messages = 0;
}

static inline int test_case_end_(void) {
    int failed = test_state_g_.case_failed;
    if (failed) {
        test_state_g_.cases_failed++;
        fprintf(stdout, "  FAILED case: %s\n", test_state_g_.case_name);
    } else {
        test_state_g_.cases_passed++;
    }
    test_state_g_.in_case = 0;
    test_state_g_.case_failed = 0;
    fflush(stdout);
    return !failed;
}

/* Records one check; prints the message when it failed (limited per case). Returns ok. */
static inline int test_check_(int ok, const char *file, int line, const char *fmt, ...) {
    test_state_g_.checks++;
    if (ok)
        return 1;
    test_state_g_.checks_failed++;
    if (!test_state_g_.in_case) {
        test_state_g_.cases_failed++;
    } else {
        test_state_g_.case_failed = 1;
    }
    if (!test_state_g_.in_case || test_state_g_.case_messages < TEST_MAX_MESSAGES_PER_CASE) {
        va_list ap;
        fprintf(stdout, "%s:%d: check failed%s%s: ", file, line,
                test_state_g_.in_case ? " in " : "",
                test_state_g_.in_case ? test_state_g_.case_name : "");
        va_start(ap, fmt);
        vfprintf(stdout, fmt, ap);
        va_end(ap);
        fputc('\n', stdout);
        fflush(stdout);
    } else if (test_state_g_.case_messages == TEST_MAX_MESSAGES_PER_CASE) {
        fprintf(stdout, "  (further failures in this case are counted, not printed)\n");
    }
    if (test_state_g_.in_case)
        test_state_g_.case_messages++;
    return 0;
}

/* A check outside a case that passed counts as a passed case. */
static inline void test_standalone_pass_(int ok) {
    if (ok && !test_state_g_.in_case)
        test_state_g_.cases_passed++;
}

#define CASE_BEGIN(...) test_case_begin_(__VA_ARGS__)
#define CASE_END() test_case_end_()
#define CASE_FAILED() (test_state_g_.case_failed)

#define CHECK_MSG(cond, ...)                                                                       \
    test_standalone_pass_(test_check_(!!(cond), __FILE__, __LINE__, __VA_ARGS__))

#define CHECK(cond) CHECK_MSG(cond, "%s", #cond)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        CHECK_MSG(a_ == b_, "%s == %s (%lld vs %lld)", #a, #b, a_, b_);                            \
    } while (0)

#define CHECK_NE_INT(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        CHECK_MSG(a_ != b_, "%s != %s (both %lld)", #a, #b, a_);                                   \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        CHECK_MSG(a_ &&b_ &&strcmp(a_, b_) == 0, "%s == %s (\"%s\" vs \"%s\")", #a, #b,            \
                  a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                         \
    } while (0)

/* |a - b| <= tol, and neither is NaN. */
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                             \
        CHECK_MSG(!isnan(a_) && !isnan(b_) && fabs(a_ - b_) <= t_,                                 \
                  "%s ~= %s (%.9g vs %.9g, |diff| %.3g > tol %.3g)", #a, #b, a_, b_,               \
                  fabs(a_ - b_), t_);                                                              \
    } while (0)

/* Fatal in a void function: records the failure and returns. */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!test_check_(!!(cond), __FILE__, __LINE__, "%s (required)", #cond))                    \
            return;                                                                                \
        test_standalone_pass_(1);                                                                  \
    } while (0)

/* Prints "N passed, N failed" (cases) on its own line; evaluates to the exit status. */
#define TEST_REPORT()                                                                              \
    (fprintf(stdout, "%ld checks, %ld failed\n%ld passed, %ld failed\n", test_state_g_.checks,     \
             test_state_g_.checks_failed, test_state_g_.cases_passed, test_state_g_.cases_failed), \
     fflush(stdout), (test_state_g_.cases_failed == 0 ? 0 : 1))

#endif /* FA_TEST_H */
