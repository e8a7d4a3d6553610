/* base: the byte buffer (growth, NUL termination, formatted appends, the
 * sticky failure). */
#include <stdint.h>
#include <string.h>

#include "base.h"
#include "kvl_buf.h"

#include "check.h"

static void test_buf(void) {
    kvl_buf b = {0};
    kvl_buf_put(&b, "", 0);
    CHECK(b.p && b.len == 0 && b.p[0] == 0 && !b.oom); /* an empty put still gives "" */
    kvl_buf_put(&b, "a\0b", 3);
    CHECK(b.len == 3 && memcmp(b.p, "a\0b", 4) == 0);
    kvl_buf_free(&b);
    CHECK(!b.p && b.len == 0 && b.cap == 0);

    /* growth past the first allocations keeps every byte */
    char want[5001]; /* snprintf writes the NUL after the last entry */
    for (int i = 0; i < 1000; i++) kvl_buf_printf(&b, "%04d,", i);
    for (int i = 0; i < 1000; i++) snprintf(want + 5 * i, 6, "%04d,", i);
    CHECK(!b.oom && b.len == 5000 && memcmp(b.p, want, 5000) == 0 && b.p[5000] == 0 &&
          b.cap > b.len);
    kvl_buf_free(&b);

    /* a formatted append longer than any small stack buffer */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    kvl_buf_puts(&b, "<");
    kvl_buf_printf(&b, "%s>%d", big, 7);
    CHECK(b.len == 1 + 2999 + 2 && b.p[0] == '<' && b.p[3000] == '>' &&
          strcmp(b.p + 3001, "7") == 0);

    /* a size that overflows: oom, and nothing changes afterwards */
    const size_t len = b.len;
    kvl_buf_put(&b, big, SIZE_MAX - 1);
    CHECK(b.oom && b.len == len);
    kvl_buf_puts(&b, "more");
    kvl_buf_printf(&b, "%d", 1);
    CHECK(b.len == len && b.p[len] == 0);
    kvl_buf_free(&b);
    CHECK(!b.oom);
}

int main(void) {
    test_buf();
    printf("test_base: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
