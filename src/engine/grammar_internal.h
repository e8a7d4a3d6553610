/* grammar internals shared by grammar_parse.c, grammar_match.c and grammar_vocab.c
 * (not an API).
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

/* The {m,n} bound of GBNF repetitions (each unit is a copy) and of the regexes
 * json_regex.c turns into them. */
#define GRAMMAR_MAX_REPEAT 10000
/* How deep groups ( ) may nest in GBNF text (the parser recurses per group). */
#define GRAMMAR_MAX_NEST 1024

/* Decodes the UTF-8 code point at s into *cp: its length in bytes, 0 for a
 * byte that cannot start one, -1 for a bad continuation byte or (strict) an
 * overlong 3-byte form, a surrogate or a value past U+10FFFF. */
static inline int grammar_utf8_decode(const char *p, bool strict, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)p;
    int n = s[0] < 0x80                    ? 1
            : s[0] >= 0xC2 && s[0] <= 0xDF ? 2
            : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
            : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4
                                           : 0;
    if (!n) return 0;
    uint32_t c = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        c = c << 6 | (s[i] & 0x3F);
    }
    if (strict && ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
                   (c >= 0xD800 && c <= 0xDFFF)))
        return -1;
    *cp = c;
    return n;
}

/* Reads the decimal digits at *p as a repetition count: 0 when there are
 * none, 1 with *v set, -1 once it exceeds GRAMMAR_MAX_REPEAT (*p just past
 * the digit that made it). */
static inline int grammar_scan_count(const char **p, int64_t *v) {
    if (**p < '0' || **p > '9') return 0;
    int64_t x = 0;
    while (**p >= '0' && **p <= '9') {
        x = x * 10 + (*(*p)++ - '0');
        if (x > GRAMMAR_MAX_REPEAT) return -1;
    }
    *v = x;
    return 1;
}

typedef struct gelem {
    int32_t kind;
    int32_t arg; /* GE_CHARS: set index; GE_REF: rule index */
} gelem;

typedef struct gset {
    int32_t off, n; /* ranges[2*off .. 2*(off+n)): inclusive [lo, hi] pairs */
    bool negate;
} gset;

/* The tables of one vocabulary, built in grammar_vocab.c and walked by the mask
 * in grammar_match.c. All token texts sorted and laid out as a trie in
 * preorder: node i's subtree is [i, end[i]); node 0 is the root (the empty
 * prefix). Walking it is a linear scan that jumps to end[i] when byte[i] is
 * refused. */
typedef struct gnode {
    uint32_t end;   /* first node after the subtree */
    uint16_t depth; /* bytes of the text */
    uint8_t byte;   /* the last one */
    uint8_t has_tok;
} gnode;

typedef struct gvocab {
    uint64_t uid;
    int refs;
    int32_t n_vocab;
    int32_t n_nodes;
    gnode *node;
    int32_t *tok_off; /* tokens ending at node i: toks[tok_off[i] .. tok_off[i + 1]) */
    int32_t *toks;
    int32_t *eog;
    int32_t n_eog;
    int32_t max_depth;
    char **text; /* each token's bytes (NULL: never matches text) */
    uint32_t *text_len;
    struct gvocab *next;
} gvocab;

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

/* The set's ranges, lo and hi inclusive, in pairs (NULL when it has none: a
 * grammar may have no ranges at all). */
static inline const uint32_t *gset_ranges(const grammar *g, const gset *s) {
    return s->n ? g->ranges + 2 * s->off : NULL;
}

/* Whether one of the n ranges at r holds some code point of [lo, hi]. */
static inline bool granges_overlap(const uint32_t *r, int32_t n, uint32_t lo, uint32_t hi) {
    for (int32_t i = 0; i < n; i++)
        if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
    return false;
}

/* Whether the n ranges at r together hold every code point of [lo, hi]: walks
 * up from lo, over each range that holds the point reached, till one reaches
 * hi or none holds the point (which is then outside them all). */
static inline bool granges_cover(const uint32_t *r, int32_t n, uint32_t lo, uint32_t hi) {
    uint32_t c = lo;
    for (bool moved = true; moved;) {
        moved = false;
        for (int32_t i = 0; i < n; i++)
            if (c >= r[2 * i] && c <= r[2 * i + 1]) {
                if (r[2 * i + 1] >= hi) return true;
                c = r[2 * i + 1] + 1;
                moved = true;
            }
    }
    return false;
}

static inline bool gset_has(const grammar *g, int32_t set, uint32_t cp) {
    const gset *s = &g->sets[set];
    const uint32_t *r = gset_ranges(g, s);
    bool in = false;
    for (int32_t i = 0; i < s->n && !in; i++) in = cp >= r[2 * i] && cp <= r[2 * i + 1];
    return in != s->negate;
}

/* Whether some code point in [lo, hi] is in the set (negated: some point of
 * [lo, hi] outside every range). */
static inline bool gset_meets(const grammar *g, int32_t set, uint32_t lo, uint32_t hi) {
    const gset *s = &g->sets[set];
    const uint32_t *r = gset_ranges(g, s);
    return s->negate ? lo <= hi && !granges_cover(r, s->n, lo, hi)
                     : granges_overlap(r, s->n, lo, hi);
}

/* Whether every code point in [lo, hi] is in the set. */
static inline bool gset_covers(const grammar *g, int32_t set, uint32_t lo, uint32_t hi) {
    const gset *s = &g->sets[set];
    const uint32_t *r = gset_ranges(g, s);
    return s->negate ? !granges_overlap(r, s->n, lo, hi) : granges_cover(r, s->n, lo, hi);
}

/* grammar_match.c: false with err when the start position is already over a
 * bound of grammar.h (grammar_compile refuses such a grammar). */
bool grammar_check_start(const grammar *g, kvl_error *err);

/* grammar_vocab.c: the tables of a vocabulary (shared, reference counted). */
gvocab *gvocab_acquire(const tok_vocab *v, kvl_error *err);
void gvocab_release(gvocab *gv);

#endif
