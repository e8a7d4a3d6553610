/* spec_ngram: prompt lookup from an index (see spec.h). One hash table per
 * n-gram length g maps each g-gram of the text to the latest position where
 * it ends; the text only grows, so each step adds the g-grams ending at the
 * positions new since the last one (a constant amount of work per token
 * instead of a scan of the whole text per step). Slots hold end positions
 * only: the tokens themselves are compared in the text. */
#include "spec.h"

#include <stdlib.h>
#include <string.h>

typedef struct gram_table {
    int32_t *slot; /* end position, or -1 */
    uint32_t cap;  /* a power of two, 0 before the first insert */
    uint32_t used;
} gram_table;

struct spec_ngram_index {
    int ngram_max;
    int64_t next_end; /* ends before this are in the tables */
    gram_table t[SPEC_NGRAM_MAX];
};

spec_ngram_index *spec_ngram_index_create(int ngram_max) {
    if (ngram_max < 1 || ngram_max > SPEC_NGRAM_MAX) return NULL;
    spec_ngram_index *x = calloc(1, sizeof *x);
    if (x) x->ngram_max = ngram_max;
    return x;
}

static void clear_tables(spec_ngram_index *x) {
    for (int g = 0; g < SPEC_NGRAM_MAX; g++) {
        free(x->t[g].slot);
        x->t[g] = (gram_table){0};
    }
    x->next_end = 0;
}

void spec_ngram_index_destroy(spec_ngram_index *x) {
    if (!x) return;
    clear_tables(x);
    free(x);
}

/* The hash of the g tokens ending at toks[e]. */
static uint32_t gram_hash(const int32_t *toks, int64_t e, int g) {
    uint64_t h = 0x243F6A8885A308D3ull ^ (uint64_t)g;
    for (int i = 0; i < g; i++) h = (h ^ (uint32_t)toks[e - i]) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h ^ h >> 32);
}

static bool same_gram(const int32_t *toks, int64_t a, int64_t b, int g) {
    return memcmp(toks + a - g + 1, toks + b - g + 1, (size_t)g * sizeof *toks) == 0;
}

/* The slot of the g-gram ending at e: its entry, or the empty slot where it goes. */
static uint32_t find_slot(const gram_table *t, const int32_t *toks, int64_t e, int g) {
    uint32_t i = gram_hash(toks, e, g) & (t->cap - 1);
    while (t->slot[i] >= 0 && !same_gram(toks, t->slot[i], e, g)) i = (i + 1) & (t->cap - 1);
    return i;
}

/* Doubles t (at least 16 slots), re-inserting its entries (distinct g-grams). */
static bool grow_table(gram_table *t, const int32_t *toks, int g) {
    gram_table n = {.cap = t->cap ? 2 * t->cap : 16, .used = t->used};
    if (!(n.slot = malloc((size_t)n.cap * sizeof *n.slot))) return false;
    memset(n.slot, 0xff, (size_t)n.cap * sizeof *n.slot);
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->slot[i] >= 0) n.slot[find_slot(&n, toks, t->slot[i], g)] = t->slot[i];
    free(t->slot);
    *t = n;
    return true;
}

/* Indexes the g-grams ending at positions up to n - 2 (a match must be
 * followed by something). False when out of memory. */
static bool index_upto(spec_ngram_index *x, const int32_t *toks, int64_t n) {
    if (n - 1 < x->next_end) clear_tables(x); /* not the text indexed before */
    for (int64_t e = x->next_end; e <= n - 2; e++) {
        for (int g = 1; g <= x->ngram_max && g <= e + 1; g++) {
            gram_table *t = &x->t[g - 1];
            if (2 * (t->used + 1) > t->cap && !grow_table(t, toks, g)) return false;
            uint32_t i = find_slot(t, toks, e, g);
            t->used += t->slot[i] < 0;
            t->slot[i] = (int32_t)e; /* the latest end: e grows */
        }
        x->next_end = e + 1;
    }
    return true;
}

int spec_ngram_index_propose(spec_ngram_index *x, const int32_t *toks, int64_t n, int k,
                             int32_t *out, int *matched) {
    *matched = 0;
    if (k <= 0 || n < 2) return 0;
    if (n > INT32_MAX || !index_upto(x, toks, n)) {
        clear_tables(x); /* rebuilt at the next call */
        return spec_ngram_propose(toks, n, x->ngram_max, k, out, matched);
    }
    for (int g = x->ngram_max < n - 1 ? x->ngram_max : (int)n - 1; g >= 1; g--) {
        const gram_table *t = &x->t[g - 1];
        if (t->cap == 0) continue;
        const int32_t e = t->slot[find_slot(t, toks, n - 1, g)];
        if (e < 0) continue;
        const int64_t from = (int64_t)e + 1, m = n - from < k ? n - from : k;
        memcpy(out, toks + from, (size_t)m * sizeof *out);
        *matched = g;
        return (int)m;
    }
    return 0;
}
