/* gbnf_append_choice (grammar.h): a set of literal strings as one GBNF
 * expression shaped as a radix tree of nested groups,
 *   abc, abd, ab, b  ->  ("ab" ("c" | "d")? | "b")
 * The matcher keeps one parse stack per alternative that is still possible,
 * so "abc" | "abd" | ... with one alternative per string starts with one stack
 * per string, past GRAMMAR_MAX_STACKS for an enum or a guided_choice of more
 * than 4,096 values; the tree starts with one per distinct first character
 * and each later position has one per distinct next character. Duplicates go.
 * Branches are cut at code point boundaries (a literal holds whole UTF-8
 * sequences); a string that is not valid UTF-8 is cut at its bytes, and
 * grammar_compile says what it thinks of it, as it would of the plain literal. */
#include "grammar.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p;
    size_t n;
} lit;

static int lit_cmp(const void *a, const void *b) {
    const lit *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* The length of the UTF-8 sequence starting at p (at most left bytes). */
static size_t seq_len(const char *p, size_t left) {
    unsigned char c = (unsigned char)*p;
    size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return k < left ? k : left;
}

/* v[lo..hi) (sorted, distinct) share their first `depth` bytes, whole
 * characters. Each call below covers fewer strings or more bytes: the strings
 * of one group share their next character, so with a single group and no
 * string ending here, the common prefix would have taken that character. */
static void emit(kvl_buf *o, const lit *v, size_t lo, size_t hi, size_t depth) {
    const lit *a = &v[lo], *b = &v[hi - 1];
    size_t l = depth; /* the range's common prefix, in whole characters */
    while (l < a->n && l < b->n) {
        const size_t k = seq_len(a->p + l, a->n - l);
        if (l + k > b->n || memcmp(a->p + l, b->p + l, k) != 0) break;
        l += k;
    }
    const bool ends = a->n == l; /* the shortest one (the first, sorted) ends here */
    size_t i = lo + ends;
    if (l > depth || i == hi) gbnf_append_literal(o, a->p + depth, l - depth);
    if (i == hi) return;
    kvl_buf_puts(o, l > depth ? " (" : "(");
    while (i < hi) {
        /* the strings that go on with the same next character */
        const size_t k = seq_len(v[i].p + l, v[i].n - l);
        size_t j = i + 1;
        while (j < hi && v[j].n >= l + k && memcmp(v[j].p + l, v[i].p + l, k) == 0) j++;
        if (i > lo + ends) kvl_buf_puts(o, " | ");
        emit(o, v, i, j, l);
        i = j;
    }
    kvl_buf_puts(o, ends ? ")?" : ")");
}

void gbnf_append_choice(kvl_buf *out, const char *const *s, const size_t *n, size_t count) {
    if (count == 0) return;
    lit *v = malloc(count * sizeof *v);
    if (!v) {
        out->oom = true;
        return;
    }
    for (size_t i = 0; i < count; i++) v[i] = (lit){s[i], n[i]};
    qsort(v, count, sizeof *v, lit_cmp);
    size_t m = 1;
    for (size_t i = 1; i < count; i++)
        if (lit_cmp(&v[i], &v[m - 1]) != 0) v[m++] = v[i];
    emit(out, v, 0, m, 0);
    free(v);
}
