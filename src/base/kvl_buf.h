/* kvl_buf: the one growable byte buffer (text being rendered, a GGUF header
 * being serialized, an HTTP body being built).
 *
 * Zero-initialize to start (kvl_buf b = {0}). The bytes are always followed by
 * a NUL past len, so text can be read as a C string once anything was put.
 * Out of memory is sticky: every later put does nothing and b.oom stays true,
 * so a builder checks once at the end instead of after every put. */
#ifndef KVLLM_KVL_BUF_H
#define KVLLM_KVL_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kvl_buf {
    char *p;    /* NULL until the first put */
    size_t len; /* bytes put, not counting the NUL after them */
    size_t cap;
    bool oom;
} kvl_buf;

void kvl_buf_put(kvl_buf *b, const void *d, size_t n);
void kvl_buf_puts(kvl_buf *b, const char *s);
void kvl_buf_printf(kvl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees the bytes and leaves b empty (and no longer out of memory). */
void kvl_buf_free(kvl_buf *b);

#endif
