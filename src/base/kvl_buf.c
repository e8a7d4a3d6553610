/* The growable byte buffer. See kvl_buf.h. */
#include "kvl_buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvl_buf_put(kvl_buf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (n >= b->cap - b->len || !b->p) { /* room for n bytes and the NUL */
        if (n > SIZE_MAX - 1 - b->len) {
            b->oom = true;
            return;
        }
        const size_t need = b->len + n + 1;
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
}

void kvl_buf_puts(kvl_buf *b, const char *s) { kvl_buf_put(b, s, strlen(s)); }

void kvl_buf_printf(kvl_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        kvl_buf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kvl_buf_put(b, big, (size_t)n);
    free(big);
}

void kvl_buf_free(kvl_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
