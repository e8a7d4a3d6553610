/* Hash maps for the tokenizer (see tok_hash.h). */
#include "tok_hash.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* The (uninitialised) slots of a table for up to max_keys keys, and its mask. */
static void *table_new(size_t max_keys, size_t slot_size, size_t *mask) {
    size_t n = 16;
    while (n < max_keys * 2 + 1) n *= 2;
    *mask = n - 1;
    return malloc(n * slot_size);
}

bool tok_strmap_init(tok_strmap *m, size_t max_keys) {
    m->slots = table_new(max_keys, sizeof *m->slots, &m->mask);
    if (!m->slots) return false;
    for (size_t i = 0; i <= m->mask; i++) m->slots[i].id = -1;
    return true;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static uint32_t str_hash(const char *s, size_t len) { return (uint32_t)XXH3_64bits(s, len); }

int32_t tok_strmap_get(const tok_strmap *m, const char *const *strs, const uint32_t *lens,
                       const char *key, size_t len) {
    uint32_t h = str_hash(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const tok_strslot *s = &m->slots[i];
        if (s->id < 0) return -1;
        if (s->hash == h && lens[s->id] == len && memcmp(strs[s->id], key, len) == 0) return s->id;
    }
}

int32_t tok_strmap_put(tok_strmap *m, const char *const *strs, const uint32_t *lens, int32_t id) {
    uint32_t h = str_hash(strs[id], lens[id]);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        tok_strslot *s = &m->slots[i];
        if (s->id < 0) {
            s->hash = h;
            s->id = id;
            return -1;
        }
        if (s->hash == h && lens[s->id] == lens[id] && memcmp(strs[s->id], strs[id], lens[id]) == 0)
            return s->id;
    }
}

bool tok_pairmap_init(tok_pairmap *m, size_t max_keys) {
    m->slots = table_new(max_keys, sizeof *m->slots, &m->mask);
    if (!m->slots) return false;
    for (size_t i = 0; i <= m->mask; i++) m->slots[i].key = UINT64_MAX;
    return true;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* splitmix64 finaliser: ids are small and dense, so mix before masking. */
static size_t pair_hash(uint64_t k) {
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebULL;
    k ^= k >> 31;
    return (size_t)k;
}

void tok_pairmap_put_first(tok_pairmap *m, int32_t a, int32_t b, int32_t val) {
    uint64_t k = pair_key(a, b);
    for (size_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        tok_pairslot *s = &m->slots[i];
        if (s->key == k) return;
        if (s->key == UINT64_MAX) {
            s->key = k;
            s->val = val;
            return;
        }
    }
}

int32_t tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    if (!m->slots) return -1;
    uint64_t k = pair_key(a, b);
    for (size_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        const tok_pairslot *s = &m->slots[i];
        if (s->key == k) return s->val;
        if (s->key == UINT64_MAX) return -1;
    }
}
