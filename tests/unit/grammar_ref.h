/* A reference recognizer for grammar tests and the grammar fuzzer: the set
 * of end offsets of each rule from each offset of the text, memoized, over the
 * compiled rules (no stacks, no merging, no bounds: nothing shared with the
 * matcher but the compiled grammar). Left recursion is refused by the
 * compiler, so it terminates. Texts up to 63 bytes, compared as code points
 * one byte each (ASCII texts). */
#ifndef KVLLM_TEST_GRAMMAR_REF_H
#define KVLLM_TEST_GRAMMAR_REF_H

#include <stdlib.h>

#include "grammar_internal.h"

typedef struct grammar_refm {
    const grammar *g;
    const unsigned char *s;
    int n, depth;
    bool gave_up; /* recursion too deep for the thread's stack */
    uint64_t *rule_memo, *seq_memo;
    uint8_t *rule_done, *seq_done;
} grammar_refm;

static uint64_t grammar_ref_seq(grammar_refm *c, int32_t pos, int i);

static uint64_t grammar_ref_rule(grammar_refm *c, int32_t r, int i) {
    size_t k = (size_t)r * 64 + (size_t)i;
    if (c->rule_done[k]) return c->rule_memo[k];
    if (++c->depth > 2000) {
        c->gave_up = true;
        c->depth--;
        return 0;
    }
    c->rule_done[k] = 1; /* re-entered at the same offset: left recursion, cannot happen */
    uint64_t m = 0;
    for (int32_t a = c->g->rule_alt[r]; a < c->g->rule_alt[r + 1]; a++)
        m |= grammar_ref_seq(c, c->g->alt_start[a], i);
    c->rule_memo[k] = m;
    c->depth--;
    return m;
}

static uint64_t grammar_ref_seq(grammar_refm *c, int32_t pos, int i) {
    size_t k = (size_t)pos * 64 + (size_t)i;
    if (c->seq_done[k]) return c->seq_memo[k];
    const gelem *e = &c->g->elems[pos];
    uint64_t m = 0;
    if (e->kind == GE_END) {
        m = 1ull << i;
    } else if (e->kind == GE_CHARS) {
        if (i < c->n && gset_has(c->g, e->arg, c->s[i])) m = grammar_ref_seq(c, pos + 1, i + 1);
    } else {
        uint64_t ends = grammar_ref_rule(c, e->arg, i);
        for (int j = i; j <= c->n; j++)
            if (ends >> j & 1) m |= grammar_ref_seq(c, pos + 1, j);
    }
    c->seq_done[k] = 1;
    c->seq_memo[k] = m;
    return m;
}

/* 1: s[0..n) is a sentence of g, 0: not, -1: no answer (n > 63, non-ASCII,
 * out of memory, or nesting too deep). */
static inline int grammar_ref_match(const grammar *g, const char *s, int n) {
    if (n < 0 || n > 63) return -1;
    for (int i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return -1;
    grammar_refm c = {.g = g, .s = (const unsigned char *)s, .n = n};
    c.rule_memo = calloc((size_t)g->n_rules * 64, sizeof *c.rule_memo);
    c.rule_done = calloc((size_t)g->n_rules * 64, 1);
    c.seq_memo = calloc((size_t)g->n_elems * 64 + 64, sizeof *c.seq_memo);
    c.seq_done = calloc((size_t)g->n_elems * 64 + 64, 1);
    int r = -1;
    if (c.rule_memo && c.rule_done && c.seq_memo && c.seq_done) {
        r = (int)(grammar_ref_rule(&c, g->root, 0) >> n & 1);
        if (c.gave_up) r = -1;
    }
    free(c.rule_memo);
    free(c.rule_done);
    free(c.seq_memo);
    free(c.seq_done);
    return r;
}

#endif
