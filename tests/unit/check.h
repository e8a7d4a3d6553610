/* The unit tests' one assertion: reports file:line and the condition, counts
 * the failure and goes on, so one run lists every broken check; main returns
 * failures != 0. */
#ifndef KVLLM_TEST_CHECK_H
#define KVLLM_TEST_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); \
            failures++;                                                           \
        }                                                                         \
    } while (0)

#endif
