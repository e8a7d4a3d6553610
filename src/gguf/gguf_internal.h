/* gguf internals shared by the reader and the writer (not part of the API). */
#ifndef KVLLM_GGUF_INTERNAL_H
#define KVLLM_GGUF_INTERNAL_H

#include "gguf.h"

/* Open-addressing hash from NUL-terminated names to indices. Keys and tensor
 * names are looked up by string, and a hostile file can hold ~len/14 of them,
 * so duplicate detection must not be quadratic. Names are borrowed, not copied. */
typedef struct gguf_strindex {
    struct gguf_strslot *slots;
    size_t cap; /* power of two, or 0 */
    size_t used;
} gguf_strindex;

int64_t gguf_strindex_find(const gguf_strindex *ix, const char *name);    /* -1 if absent */
bool gguf_strindex_add(gguf_strindex *ix, const char *name, int64_t idx); /* false: out of memory */
void gguf_strindex_free(gguf_strindex *ix);

/* Byte size of a tensor of dtype (must be supported) and shape ne[4] (unused
 * dims 1, all >= 0). Fails with GGUF_SHAPE_ROW when ne[0] is not a whole number
 * of blocks and GGUF_SHAPE_OVERFLOW when the element count (int64) or the
 * byte count (size_t) overflows. */
enum { GGUF_SHAPE_OK = 0, GGUF_SHAPE_ROW, GGUF_SHAPE_OVERFLOW };
int gguf_shape_nbytes(int dtype, const int64_t ne[GGUF_MAX_DIMS], size_t *nbytes);

#endif
