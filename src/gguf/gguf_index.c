/* gguf: name -> index hash table (see gguf_internal.h). */
#include "gguf_internal.h"

#include <stdlib.h>
#include <string.h>

struct gguf_strslot {
    const char *name; /* NULL: empty */
    int64_t idx;
};

/* FNV-1a: tiny and good enough for short ASCII keys. */
static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

int64_t gguf_strindex_find(const gguf_strindex *ix, const char *name) {
    if (ix->cap == 0) return -1;
    size_t mask = ix->cap - 1;
    for (size_t i = (size_t)hash_str(name) & mask;; i = (i + 1) & mask) {
        const struct gguf_strslot *s = &ix->slots[i];
        if (!s->name) return -1; /* load factor <= 1/2 guarantees an empty slot */
        if (strcmp(s->name, name) == 0) return s->idx;
    }
}

static void insert(struct gguf_strslot *slots, size_t cap, const char *name, int64_t idx) {
    size_t mask = cap - 1, i = (size_t)hash_str(name) & mask;
    while (slots[i].name) i = (i + 1) & mask;
    slots[i].name = name;
    slots[i].idx = idx;
}

/* Doubles the table, rehashing every entry. */
static bool rehash(gguf_strindex *ix) {
    size_t cap = ix->cap ? ix->cap * 2 : 32;
    struct gguf_strslot *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < ix->cap; i++)
        if (ix->slots[i].name) insert(slots, cap, ix->slots[i].name, ix->slots[i].idx);
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    return true;
}

bool gguf_strindex_add(gguf_strindex *ix, const char *name, int64_t idx) {
    if ((ix->used + 1) * 2 > ix->cap && !rehash(ix)) return false;
    insert(ix->slots, ix->cap, name, idx);
    ix->used++;
    return true;
}

void gguf_strindex_free(gguf_strindex *ix) {
    free(ix->slots);
    ix->slots = NULL;
    ix->cap = ix->used = 0;
}
