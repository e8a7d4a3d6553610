/* The unit tests' one assertion. CHECK(cond) or CHECK(cond, "fmt", args...):
 * when cond is false, reports file:line, the condition and the optional
 * printf-style explanation, counts the failure and goes on, so one run lists
 * every broken check; main returns failures != 0. The explanation, when
 * given, must start with a string literal. */
#ifndef KVLLM_TEST_CHECK_H
#define KVLLM_TEST_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: CHECK(%s) failed", __FILE__, __LINE__, #cond);                 \
            fprintf(stderr, " " __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#endif
