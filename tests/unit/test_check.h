/* Shared by the unit tests: a failure counter and a CHECK that reports the
 * file, line, condition and a printf-style explanation, then carries on. */
#ifndef KVLLM_TEST_CHECK_H
#define KVLLM_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

#endif
