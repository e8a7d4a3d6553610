/* tokenizer-private: open-addressing hash maps sized once at load, because a
 * BPE vocab has up to ~10^5 tokens and ~3*10^5 merges that are looked up for
 * every symbol pair while encoding. */
#ifndef KVLLM_TOK_HASH_H
#define KVLLM_TOK_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Both maps are the same open-addressing table over their own slot type: a
 * power-of-two array of slots probed linearly from hash & mask. TOK_HASH_TABLE
 * declares the map type for a slot type. */
#define TOK_HASH_TABLE(map, slot)                                                                  \
    typedef struct map {                                                                           \
        slot *slots;                                                                               \
        size_t mask;                                                                               \
    } map

/* String -> id. The map stores ids only; strs[id]/lens[id] give the key text. */
typedef struct tok_strslot {
    uint32_t hash;
    int32_t id; /* -1: empty */
} tok_strslot;

TOK_HASH_TABLE(tok_strmap, tok_strslot);

/* Room for up to max_keys keys (load factor <= 1/2). */
bool tok_strmap_init(tok_strmap *m, size_t max_keys);
void tok_strmap_free(tok_strmap *m);
int32_t tok_strmap_get(const tok_strmap *m, const char *const *strs, const uint32_t *lens,
                       const char *key, size_t len);
/* Inserts id (whose text is strs[id]) unless its text is present; returns the id
 * already stored for that text, or -1 if id was inserted. */
int32_t tok_strmap_put(tok_strmap *m, const char *const *strs, const uint32_t *lens, int32_t id);

/* (left id, right id) -> rank. */
typedef struct tok_pairslot {
    uint64_t key; /* UINT64_MAX: empty */
    int32_t val;
} tok_pairslot;

TOK_HASH_TABLE(tok_pairmap, tok_pairslot);

bool tok_pairmap_init(tok_pairmap *m, size_t max_keys);
void tok_pairmap_free(tok_pairmap *m);
/* Keeps the first value put for a key (llama.cpp keeps the lowest merge rank). */
void tok_pairmap_put_first(tok_pairmap *m, int32_t a, int32_t b, int32_t val);
int32_t tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b); /* -1 if absent */

#endif
