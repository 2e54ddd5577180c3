/* test.h - the tiny test harness every tests/test_*.c uses.
 *
 * CHECK(cond, fmt, ...) counts a pass or prints the failure with file:line;
 * CHECK_NEAR(a, b, tol) for floats. Each program ends with
 * `return test_summary("name");`, which prints "name: N passed, M failed" as
 * its last line (scripts/run_tests.sh sums those) and returns the exit code.
 * Data is found through the library's search path (util/paths.h), to
 * which every test program adds, before main, the development fallbacks
 * the library itself does not know: models/ (the checkout's, from the
 * repository root where tests run) and ../shared/models, ../shared (the
 * reference data beside the checkout). Children the tests start inherit
 * them. A test whose data is absent is skipped with a message, never passed.
 */
#ifndef SPARQ_TEST_H
#define SPARQ_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/paths.h"

static int test_n_pass, test_n_fail, test_n_skip;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (cond) {                                                          \
            test_n_pass++;                                                   \
        } else {                                                             \
            test_n_fail++;                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                \
    do {                                                                     \
        double ta_ = (double)(a), tb_ = (double)(b);                         \
        CHECK(fabs(ta_ - tb_) <= (tol), "%s=%.9g %s=%.9g tol=%g", #a, ta_,   \
              #b, tb_, (double)(tol));                                       \
    } while (0)

__attribute__((constructor)) static void test_search_path(void)
{
    if (path_append_env("models:../shared/models:../shared") != 0)
        fprintf(stderr, "warning: cannot extend SPARQ_MODEL_PATH\n");
}

static inline void test_skip(const char *why)
{
    test_n_skip++;
    fprintf(stderr, "SKIP %s\n", why);
}

/* Non-zero when SPARQ_TEST_QUICK is set (the sanitizer run): tests may then
 * use fewer or smaller cases, never weaker assertions. */
static inline int test_quick(void)
{
    const char *q = getenv("SPARQ_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Reads a whole file; returns NULL (and *n = 0) if it cannot. Caller frees. */
static inline void *test_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (sz < 0) { fclose(f); return NULL; }
    void *buf = malloc((size_t)sz + 1);
    if (buf && fread(buf, 1, (size_t)sz, f) != (size_t)sz) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { ((char *)buf)[sz] = 0; *n = (size_t)sz; }
    return buf;
}

static inline int test_summary(const char *name)
{
    printf("%s: %d passed, %d failed", name, test_n_pass, test_n_fail);
    if (test_n_skip) printf(", %d skipped", test_n_skip);
    printf("\n");
    return test_n_fail ? 1 : 0;
}

#endif
