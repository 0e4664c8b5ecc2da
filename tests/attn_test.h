/* attn_test.h - a tiny test harness for attn.h (stb style, no fork).

   Each test is a function; a suite registers its tests explicitly:

       ATTN_TEST(test_something) { EXPECT_TRUE(1 + 1 == 2); }
       void suite_example(void) { ATTN_RUN(test_something); }

   Checks record failures and continue; REQUIRE / REQUIRE_OK record a failure and end the
   test (a precondition the rest needs); SKIP(reason) ends a test as skipped. The
   environment variable ATTN_TEST_SKIP (comma-separated test names) skips whole tests,
   for slow builds such as ThreadSanitizer's; ATTN_TEST_ONLY (the same form) runs only the
   tests it names (e.g. a few under compute-sanitizer). Some tests read their own knobs:
   ATTN_TEST_SCALE (test_forward.c, the test_mla_*.c suites), ATTN_TEST_8BIT_CASES and
   ATTN_TEST_8BIT_DEBUG (test_cuda_forward.c's 8-bit tests: fewer cases; one-request cases
   that print rows on a mismatch).
   attn_test_summary() prints the closing line "N passed, N failed, N skipped" and
   returns the process exit code. Define ATTN_TEST_IMPLEMENTATION in one file. */
#ifndef ATTN_TEST_H
#define ATTN_TEST_H

#include <math.h>
#include <stdio.h>

typedef void (*attn_test_fn)(void);

void attn_test_run(const char *name, attn_test_fn fn);
int attn_test_summary(void);
void attn_test_fail(const char *file, int line, const char *fmt, ...);
void attn_test_skip(const char *reason);
int attn_test_current_failed(void);
int attn_test_near(double a, double b, double abs_tol, double rel_tol);

#define ATTN_TEST(name) static void name(void)
#define ATTN_RUN(name) attn_test_run(#name, name)

#define EXPECT_TRUE(cond)                                                          \
    do {                                                                           \
        if (!(cond)) attn_test_fail(__FILE__, __LINE__, "expected: %s", #cond);    \
    } while (0)
#define EXPECT_EQ_INT(a, b)                                                        \
    do {                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                        \
        if (a_ != b_)                                                              \
            attn_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b,   \
                           a_, b_);                                                \
    } while (0)
/* |a - b| <= abs_tol + rel_tol * |b|; NaN or inf on either side fails. */
#define EXPECT_NEAR(a, b, abs_tol, rel_tol)                                        \
    do {                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                 \
        if (!attn_test_near(a_, b_, abs_tol, rel_tol))                             \
            attn_test_fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g", #a, #b,    \
                           a_, b_);                                                \
    } while (0)
#define EXPECT_STATUS(expr, status)                                                \
    do {                                                                           \
        attn_status s_ = (expr);                                                   \
        if (s_ != (status))                                                        \
            attn_test_fail(__FILE__, __LINE__, "%s: got %s, expected %s", #expr,   \
                           attn_status_string(s_), attn_status_string(status));    \
    } while (0)
#define EXPECT_OK(expr) EXPECT_STATUS(expr, ATTN_OK)
/* Fatal checks: a failed precondition ends the test (it returns), instead of cascading
   into checks that cannot mean anything (a NULL layer, an unbuilt metadata). Use them in
   the test function itself; a helper that cleans up uses EXPECT_* and returns a flag. */
#define REQUIRE(cond)                                                              \
    do {                                                                           \
        if (!(cond)) {                                                             \
            attn_test_fail(__FILE__, __LINE__, "required: %s", #cond);            \
            return;                                                                \
        }                                                                          \
    } while (0)
#define REQUIRE_OK(expr)                                                           \
    do {                                                                           \
        attn_status r_ = (expr);                                                   \
        if (r_ != ATTN_OK) {                                                       \
            attn_test_fail(__FILE__, __LINE__, "required: %s: got %s", #expr,      \
                           attn_status_string(r_));                                \
            return;                                                                \
        }                                                                          \
    } while (0)
#define SKIP(reason)                                                               \
    do {                                                                           \
        attn_test_skip(reason);                                                    \
        return;                                                                    \
    } while (0)

#endif

#ifdef ATTN_TEST_IMPLEMENTATION
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int attn_test__passed, attn_test__failed, attn_test__skipped;
static int attn_test__cur_failed, attn_test__cur_skipped;
static const char *attn_test__cur_name = "";

int attn_test_near(double a, double b, double abs_tol, double rel_tol) {
    if (a != a || b != b) return 0;
    if (a - a != 0.0 || b - b != 0.0) return a == b; /* infinities must match exactly */
    return fabs(a - b) <= abs_tol + rel_tol * fabs(b);
}

void attn_test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    if (attn_test__cur_failed < 5) {
        fprintf(stdout, "  FAIL %s (%s:%d): ", attn_test__cur_name, file, line);
        va_start(ap, fmt);
        vfprintf(stdout, fmt, ap);
        va_end(ap);
        fputc('\n', stdout);
    }
    attn_test__cur_failed++;
}

void attn_test_skip(const char *reason) {
    attn_test__cur_skipped = 1;
    fprintf(stdout, "  SKIP %s: %s\n", attn_test__cur_name, reason);
}

int attn_test_current_failed(void) { return attn_test__cur_failed; }

/* Whether name is listed in the comma-separated environment variable var. */
static int attn_test__listed(const char *var, const char *name) {
    const char *p = getenv(var);
    size_t n = strlen(name);
    while (p && *p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

void attn_test_run(const char *name, attn_test_fn fn) {
    attn_test__cur_name = name;
    attn_test__cur_failed = 0;
    attn_test__cur_skipped = 0;
    if (attn_test__listed("ATTN_TEST_SKIP", name)) attn_test_skip("listed in ATTN_TEST_SKIP");
    else if (getenv("ATTN_TEST_ONLY") && !attn_test__listed("ATTN_TEST_ONLY", name))
        attn_test_skip("not listed in ATTN_TEST_ONLY"); /* e.g. one test under a sanitizer */
    else fn();
    if (attn_test__cur_failed) {
        attn_test__failed++;
        fprintf(stdout, "FAIL %s (%d checks failed)\n", name, attn_test__cur_failed);
    } else if (attn_test__cur_skipped) {
        attn_test__skipped++;
    } else {
        attn_test__passed++;
        fprintf(stdout, "ok   %s\n", name);
    }
    fflush(stdout);
}

int attn_test_summary(void) {
    fprintf(stdout, "%d passed, %d failed, %d skipped\n", attn_test__passed, attn_test__failed,
            attn_test__skipped);
    return attn_test__failed ? 1 : 0;
}
#endif
