/* grammar internals shared by grammar_parse.c and grammar_match.c (not an API).
 *
 * A compiled grammar is a flat array of elements. Every alternative of every
 * rule is a run of elements ended by GE_END; rule r's alternatives start at
 * alt_start[rule_alt[r] .. rule_alt[r + 1]). Repetition and groups are
 * rewritten into generated rules at parse time, so the matcher only knows
 * code-point sets and rule references. */
#ifndef KVLLM_GRAMMAR_INTERNAL_H
#define KVLLM_GRAMMAR_INTERNAL_H

#include "grammar.h"

enum { GE_END = 0, GE_CHARS = 1, GE_REF = 2 };

typedef struct gelem {
    int32_t kind;
    int32_t arg; /* GE_CHARS: set index; GE_REF: rule index */
} gelem;

typedef struct gset {
    int32_t off, n; /* ranges[2*off .. 2*(off+n)): inclusive [lo, hi] pairs */
    bool negate;
} gset;

typedef struct gvocab gvocab; /* per-vocabulary trie, grammar_match.c */

struct grammar {
    gelem *elems;
    int32_t n_elems;
    int32_t *alt_start, *rule_alt; /* rule_alt has n_rules + 1 entries */
    int32_t n_rules;
    char **rule_names;
    gset *sets;
    int32_t n_sets;
    uint32_t *ranges;
    int32_t root;
    gvocab *vocab; /* NULL without a vocabulary */
};

static inline bool gset_has(const grammar *g, int32_t set, uint32_t cp) {
    const gset *s = &g->sets[set];
    const uint32_t *r =
        s->n ? g->ranges + 2 * s->off : NULL; /* a grammar may have no ranges at all */
    bool in = false;
    for (int32_t i = 0; i < s->n && !in; i++) in = cp >= r[2 * i] && cp <= r[2 * i + 1];
    return in != s->negate;
}

/* Whether some code point in [lo, hi] is in the set. */
static inline bool gset_meets(const grammar *g, int32_t set, uint32_t lo, uint32_t hi) {
    const gset *s = &g->sets[set];
    const uint32_t *r =
        s->n ? g->ranges + 2 * s->off : NULL; /* a grammar may have no ranges at all */
    if (!s->negate) {
        for (int32_t i = 0; i < s->n; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
        return false;
    }
    /* negated: some point of [lo, hi] outside every range; walk up from lo */
    uint32_t c = lo;
    for (bool moved = true; moved && c <= hi;) {
        moved = false;
        for (int32_t i = 0; i < s->n; i++)
            if (c >= r[2 * i] && c <= r[2 * i + 1]) {
                if (r[2 * i + 1] >= hi) return false;
                c = r[2 * i + 1] + 1;
                moved = true;
            }
    }
    return c <= hi;
}

/* Whether every code point in [lo, hi] is in the set. */
static inline bool gset_covers(const grammar *g, int32_t set, uint32_t lo, uint32_t hi) {
    const gset *s = &g->sets[set];
    const uint32_t *r =
        s->n ? g->ranges + 2 * s->off : NULL; /* a grammar may have no ranges at all */
    if (s->negate) {
        for (int32_t i = 0; i < s->n; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return false;
        return true;
    }
    uint32_t c = lo;
    for (bool moved = true; moved;) {
        moved = false;
        for (int32_t i = 0; i < s->n; i++)
            if (c >= r[2 * i] && c <= r[2 * i + 1]) {
                if (r[2 * i + 1] >= hi) return true;
                c = r[2 * i + 1] + 1;
                moved = true;
            }
    }
    return false;
}

/* grammar_match.c: the tables of a vocabulary (shared, reference counted). */
gvocab *gvocab_acquire(const tok_vocab *v, kvl_error *err);
void gvocab_release(gvocab *gv);

#endif
