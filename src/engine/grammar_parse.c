/* GBNF parser: text -> the flat rule tables of grammar_internal.h.
 *
 * Syntax (llama.cpp's GBNF): `name ::= alternatives`, names of letters,
 * digits, '-' and '_'; "literals" and [classes] (ranges a-z, negation [^...])
 * with the escapes \n \r \t \\ \" \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH; `.` any
 * code point; ( ) groups; | alternatives; postfix * + ? {m} {m,} {m,n} {,n};
 * # comments to the end of the line. A rule's body runs until the next
 * `name ::=` or the end, so line breaks inside a body are free. */
#include "grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ELEMS (4 << 20) /* elements over all rules */

typedef struct rbody {
    gelem *e;
    int32_t n;
    size_t cap;
} rbody;

typedef struct parser {
    const char *src, *p;
    kvl_error *err;
    bool failed;
    char **names;
    rbody *bodies;
    int32_t *def_at, *ref_at; /* source offsets, -1: none */
    int32_t *n_gen;           /* generated rules made under each rule (for names) */
    int32_t n_rules, cap_rules;
    uint32_t *ranges;
    int32_t n_ranges; /* pairs */
    size_t cap_ranges;
    gset *sets;
    int32_t n_sets;
    size_t cap_sets;
    int64_t n_elems;
    int32_t *name_ht; /* open addressing over rule ids by name (-1: empty), cap_ht a power of two */
    int32_t cap_ht;
    int32_t *
        reps; /* (generated rule, segment length) per repetition that can match its segment twice */
    int32_t n_reps;
    size_t cap_reps;
    int32_t nest; /* groups open around the current position */
} parser;

static bool fail_at(parser *ps, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool fail_at(parser *ps, const char *at, const char *fmt, ...) {
    int line = 1, col = 1;
    for (const char *q = ps->src; q < at && *q; q++) {
        if (*q == '\n') line++, col = 1;
        else if (((unsigned char)*q & 0xC0) != 0x80) col++;
    }
    char where[64];
    snprintf(where, sizeof where, "grammar: line %d, column %d", line, col);
    va_list ap;
    va_start(ap, fmt);
    kvl_vfail_first(ps->err, &ps->failed, where, fmt, ap);
    va_end(ap);
    return false;
}

static bool oom(parser *ps) { return fail_at(ps, ps->p, "out of memory"); }

static bool push_elem(parser *ps, int32_t r, int32_t kind, int32_t arg) {
    rbody *b = &ps->bodies[r];
    if (++ps->n_elems > MAX_ELEMS)
        return fail_at(ps, ps->p, "the grammar is too large (over %d elements)", MAX_ELEMS);
    if (!kvl_grow((void **)&b->e, &b->cap, (size_t)(b->n + 1), sizeof(gelem), 16)) return oom(ps);
    b->e[b->n++] = (gelem){kind, arg};
    return true;
}

static int32_t add_rule(parser *ps, const char *name, size_t len) {
    int32_t n = ps->n_rules;
    if (n == ps->cap_rules) {
        int32_t c = ps->cap_rules ? ps->cap_rules * 2 : 32;
        char **nm = realloc(ps->names, c * sizeof *nm);
        if (nm) ps->names = nm;
        rbody *bd = realloc(ps->bodies, c * sizeof *bd);
        if (bd) ps->bodies = bd;
        int32_t *d = realloc(ps->def_at, c * sizeof *d);
        if (d) ps->def_at = d;
        int32_t *rf = realloc(ps->ref_at, c * sizeof *rf);
        if (rf) ps->ref_at = rf;
        int32_t *ng = realloc(ps->n_gen, c * sizeof *ng);
        if (ng) ps->n_gen = ng;
        if (!nm || !bd || !d || !rf || !ng) return oom(ps), -1;
        ps->cap_rules = c;
    }
    ps->names[n] = strndup(name, len);
    if (!ps->names[n]) return oom(ps), -1;
    ps->bodies[n] = (rbody){0};
    ps->def_at[n] = ps->ref_at[n] = -1;
    ps->n_gen[n] = 0;
    ps->n_rules++;
    return n;
}

static uint32_t name_hash(const char *s, size_t len) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The slot of name in name_ht: its rule's, or the empty one where it would go. */
static int32_t name_slot(const parser *ps, const char *name, size_t len) {
    uint32_t m = (uint32_t)ps->cap_ht - 1, i = name_hash(name, len) & m;
    for (;; i = (i + 1) & m) {
        int32_t r = ps->name_ht[i];
        if (r < 0 || (strlen(ps->names[r]) == len && memcmp(ps->names[r], name, len) == 0))
            return (int32_t)i;
    }
}

/* Keeps name_ht at most half full; a hash table, not a scan, so that a grammar
 * of many thousands of rules compiles in linear time. */
static bool name_ht_fit(parser *ps, int32_t n_rules) {
    if (2 * n_rules < ps->cap_ht) return true;
    int32_t cap = ps->cap_ht ? ps->cap_ht * 2 : 64;
    while (2 * n_rules >= cap) cap *= 2;
    int32_t *ht = malloc((size_t)cap * sizeof *ht);
    if (!ht) return oom(ps);
    free(ps->name_ht);
    ps->name_ht = ht;
    ps->cap_ht = cap;
    for (int32_t i = 0; i < cap; i++) ht[i] = -1;
    for (int32_t r = 0; r < ps->n_rules; r++)
        if (!strchr(ps->names[r], '/')) ht[name_slot(ps, ps->names[r], strlen(ps->names[r]))] = r;
    return true;
}

static int32_t find_rule(parser *ps, const char *name, size_t len) {
    if (!name_ht_fit(ps, ps->n_rules + 1)) return -1;
    int32_t slot = name_slot(ps, name, len);
    if (ps->name_ht[slot] >= 0) return ps->name_ht[slot];
    int32_t r = add_rule(ps, name, len);
    if (r >= 0) ps->name_ht[slot] = r;
    return r;
}

/* A rule made for a group or a repetition inside `parent`; its name is not a
 * valid GBNF name, so it cannot clash with the user's. */
static int32_t gen_rule(parser *ps, int32_t parent) {
    char name[300];
    snprintf(name, sizeof name, "%.256s/%d", ps->names[parent], ++ps->n_gen[parent]);
    int32_t r = add_rule(ps, name, strlen(name)); /* never looked up by name: not in name_ht */
    if (r >= 0) ps->def_at[r] = (int32_t)(ps->p - ps->src);
    return r;
}

static int32_t add_set(parser *ps, const uint32_t *pairs, int32_t n, bool negate) {
    if (!kvl_grow((void **)&ps->sets, &ps->cap_sets, (size_t)(ps->n_sets + 1), sizeof(gset), 16) ||
        !kvl_grow((void **)&ps->ranges, &ps->cap_ranges, (size_t)(ps->n_ranges + n),
                  2 * sizeof(uint32_t), 16))
        return oom(ps), -1;
    if (n > 0) memcpy(ps->ranges + 2 * ps->n_ranges, pairs, (size_t)n * 2 * sizeof(uint32_t));
    ps->sets[ps->n_sets] = (gset){ps->n_ranges, n, negate};
    ps->n_ranges += n;
    return ps->n_sets++;
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void skip_ws(parser *ps) {
    for (;;) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            ps->p++;
        } else if (c == '#') {
            while (*ps->p && *ps->p != '\n') ps->p++;
        } else {
            return;
        }
    }
}

/* Whether the text at p is `name ::=` (the start of the next rule). */
static bool at_rule_start(parser *ps) {
    const char *save = ps->p;
    if (!is_name_char(*ps->p)) return false;
    while (is_name_char(*ps->p)) ps->p++;
    skip_ws(ps);
    bool yes = strncmp(ps->p, "::=", 3) == 0;
    ps->p = save;
    return yes;
}

/* One UTF-8 code point from the source. */
static bool decode_cp(parser *ps, uint32_t *cp) {
    const int n = grammar_utf8_decode(ps->p, true, cp);
    if (n == 0) return fail_at(ps, ps->p, "invalid UTF-8 byte 0x%02X", (unsigned char)ps->p[0]);
    if (n < 0) return fail_at(ps, ps->p, "invalid UTF-8 sequence");
    ps->p += n;
    return true;
}

static bool hex_escape(parser *ps, int digits, uint32_t *cp) {
    int bad = 0;
    int64_t v = kvl_hex_value(ps->p, digits, &bad);
    if (v < 0) return fail_at(ps, ps->p + bad, "expected %d hex digits in the escape", digits);
    if (v > 0x10FFFF) return fail_at(ps, ps->p, "code point U+%X is beyond U+10FFFF", (unsigned)v);
    ps->p += digits;
    *cp = (uint32_t)v;
    return true;
}

/* A character of a literal or class, escapes decoded. */
static bool parse_char(parser *ps, uint32_t *cp) {
    if (*ps->p != '\\') return decode_cp(ps, cp);
    const char *at = ps->p++;
    char c = *ps->p++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case 'x': return hex_escape(ps, 2, cp);
    case 'u': return hex_escape(ps, 4, cp);
    case 'U': return hex_escape(ps, 8, cp);
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/':
    case '\'':
    case '.': *cp = (uint32_t)c; return true;
    case 0: return fail_at(ps, at, "the grammar ends inside an escape");
    default: return fail_at(ps, at, "unknown escape '\\%c'", c);
    }
}

static bool parse_literal(parser *ps, int32_t r) {
    const char *open = ps->p++;
    while (*ps->p != '"') {
        if (!*ps->p) return fail_at(ps, open, "unterminated string literal");
        uint32_t cp, pair[2];
        if (!parse_char(ps, &cp)) return false;
        pair[0] = pair[1] = cp;
        int32_t s = add_set(ps, pair, 1, false);
        if (s < 0 || !push_elem(ps, r, GE_CHARS, s)) return false;
    }
    ps->p++;
    return true;
}

static bool parse_class(parser *ps, int32_t r) {
    const char *open = ps->p++;
    bool negate = *ps->p == '^';
    if (negate) ps->p++;
    uint32_t *pairs = NULL;
    int32_t n = 0;
    size_t cap = 0;
    bool ok = true;
    while (ok && *ps->p != ']') {
        if (!*ps->p) {
            ok = fail_at(ps, open, "unterminated character class");
            break;
        }
        uint32_t lo, hi;
        const char *at = ps->p;
        ok = parse_char(ps, &lo);
        hi = lo;
        if (ok && ps->p[0] == '-' && ps->p[1] && ps->p[1] != ']') {
            ps->p++;
            ok = parse_char(ps, &hi);
            if (ok && hi < lo)
                ok = fail_at(ps, at, "range end U+%04X is below its start U+%04X", hi, lo);
        }
        if (ok && !kvl_grow((void **)&pairs, &cap, (size_t)(n + 1), 2 * sizeof(uint32_t), 16))
            ok = oom(ps);
        if (ok) pairs[2 * n] = lo, pairs[2 * n + 1] = hi, n++;
    }
    if (ok) {
        ps->p++;
        int32_t s = add_set(ps, pairs, n, negate);
        ok = s >= 0 && push_elem(ps, r, GE_CHARS, s);
    }
    free(pairs);
    return ok;
}

static bool parse_int(parser *ps, int64_t *v) {
    const int r = grammar_scan_count(&ps->p, v);
    if (r < 0) return fail_at(ps, ps->p, "repetition count above %d", GRAMMAR_MAX_REPEAT);
    return r > 0;
}

/* Remembers a generated repetition rule whose first alternative begins with
 * the repeated segment (len elements), for check_left_recursion to refuse it
 * if the segment can match the empty string. */
static bool note_repetition(parser *ps, int32_t rule, int32_t len) {
    if (!kvl_grow((void **)&ps->reps, &ps->cap_reps, (size_t)(ps->n_reps + 1), 2 * sizeof(int32_t),
                  16))
        return oom(ps);
    ps->reps[2 * ps->n_reps] = rule;
    ps->reps[2 * ps->n_reps + 1] = len;
    ps->n_reps++;
    return true;
}

/* Rewrites elements [from, n) of rule r as min..max (max < 0: unbounded)
 * repetitions of themselves. */
static bool repeat(parser *ps, int32_t r, int32_t from, int64_t min, int64_t max) {
    int32_t len = ps->bodies[r].n - from;
    if (len <= 0) return true; /* "" repeated is still "" */
    gelem *seg = malloc((size_t)len * sizeof *seg);
    if (!seg) return oom(ps);
    memcpy(seg, ps->bodies[r].e + from, (size_t)len * sizeof *seg);
    ps->bodies[r].n = from;
    ps->n_elems -= len;
    bool ok = true;
    for (int64_t i = 0; ok && i < min; i++)
        for (int32_t k = 0; ok && k < len; k++) ok = push_elem(ps, r, seg[k].kind, seg[k].arg);
    if (ok && max < 0) { /* star ::= seg star | (empty) */
        int32_t star = gen_rule(ps, r);
        ok = star >= 0;
        for (int32_t k = 0; ok && k < len; k++) ok = push_elem(ps, star, seg[k].kind, seg[k].arg);
        ok = ok && push_elem(ps, star, GE_REF, star) && push_elem(ps, star, GE_END, 0) &&
             push_elem(ps, star, GE_END, 0) && push_elem(ps, r, GE_REF, star);
        ok = ok && note_repetition(ps, star, len);
    } else if (ok && max > min) { /* opt_k ::= seg opt_(k-1) | (empty) */
        int32_t prev = -1;
        for (int64_t k = 0; ok && k < max - min; k++) {
            int32_t o = gen_rule(ps, r);
            ok = o >= 0;
            for (int32_t j = 0; ok && j < len; j++) ok = push_elem(ps, o, seg[j].kind, seg[j].arg);
            if (ok && prev >= 0) ok = push_elem(ps, o, GE_REF, prev);
            ok = ok && push_elem(ps, o, GE_END, 0) && push_elem(ps, o, GE_END, 0);
            if (ok && k == 1) ok = note_repetition(ps, o, len); /* a chain of two or more */
            prev = o;
        }
        ok = ok && push_elem(ps, r, GE_REF, prev);
    }
    free(seg);
    return ok;
}

static bool parse_alternates(parser *ps, int32_t r, bool nested);

static bool parse_postfix(parser *ps, int32_t r, int32_t from) {
    for (;;) {
        skip_ws(ps);
        const char *at = ps->p;
        int64_t min, max;
        if (*ps->p == '*') min = 0, max = -1, ps->p++;
        else if (*ps->p == '+') min = 1, max = -1, ps->p++;
        else if (*ps->p == '?') min = 0, max = 1, ps->p++;
        else if (*ps->p == '{') {
            ps->p++;
            skip_ws(ps);
            min = 0;
            bool has_min = parse_int(ps, &min);
            if (ps->failed) return false;
            skip_ws(ps);
            if (*ps->p == '}') {
                if (!has_min) return fail_at(ps, at, "empty repetition {}");
                max = min;
            } else if (*ps->p == ',') {
                ps->p++;
                skip_ws(ps);
                max = -1;
                if (!parse_int(ps, &max) && ps->failed) return false;
                skip_ws(ps);
                if (*ps->p != '}')
                    return fail_at(ps, ps->p, "expected '}' to close the repetition");
                if (max >= 0 && max < min)
                    return fail_at(ps, at,
                                   "repetition {%lld,%lld}: the maximum is below the minimum",
                                   (long long)min, (long long)max);
            } else {
                return fail_at(ps, ps->p, "expected a number, ',' or '}' in the repetition");
            }
            ps->p++;
        } else {
            return true;
        }
        if (ps->bodies[r].n == from)
            return fail_at(ps, at, "a repetition operator must follow an element");
        /* Consecutive *, + and ? fold into one: (x+)+ is x+, (x?)+ and (x+)? are
         * x*. Nested instead, they make an ambiguous grammar whose matcher keeps
         * a number of stacks exponential in the nesting (found by fuzzing: a
         * class followed by 21 '+' took seconds per byte). */
        while (min <= 1 && (max == 1 || max < 0)) {
            skip_ws(ps);
            int64_t min2, max2;
            if (*ps->p == '*') min2 = 0, max2 = -1;
            else if (*ps->p == '+') min2 = 1, max2 = -1;
            else if (*ps->p == '?') min2 = 0, max2 = 1;
            else break;
            ps->p++;
            min *= min2;
            max = max == 1 && max2 == 1 ? 1 : -1;
        }
        if (!repeat(ps, r, from, min, max)) return false;
        /* a second operator applies to the repetition as a whole: make it one element */
        if (ps->bodies[r].n - from > 1) {
            skip_ws(ps);
            if (*ps->p == '*' || *ps->p == '+' || *ps->p == '?' || *ps->p == '{') {
                int32_t g = gen_rule(ps, r);
                if (g < 0) return false;
                for (int32_t k = from; k < ps->bodies[r].n; k++)
                    if (!push_elem(ps, g, ps->bodies[r].e[k].kind, ps->bodies[r].e[k].arg))
                        return false;
                ps->n_elems -= ps->bodies[r].n - from;
                ps->bodies[r].n = from;
                if (!push_elem(ps, g, GE_END, 0) || !push_elem(ps, r, GE_REF, g)) return false;
            }
        }
    }
}

static bool parse_sequence(parser *ps, int32_t r, bool nested) {
    for (;;) {
        skip_ws(ps);
        char c = *ps->p;
        if (!c || c == '|' || c == ')') return true;
        if (at_rule_start(ps))
            return nested ? fail_at(ps, ps->p, "unclosed '(' before the next rule") : true;
        int32_t from = ps->bodies[r].n;
        const char *at = ps->p;
        if (c == '"') {
            if (!parse_literal(ps, r)) return false;
        } else if (c == '[') {
            if (!parse_class(ps, r)) return false;
        } else if (c == '.') {
            ps->p++;
            int32_t s = add_set(ps, NULL, 0, true);
            if (s < 0 || !push_elem(ps, r, GE_CHARS, s)) return false;
        } else if (c == '(') {
            /* the parser recurses per group: bounded, so that a deep nesting
             * fails here rather than overflow the stack (200,000 '(' did) */
            if (ps->nest == GRAMMAR_MAX_NEST)
                return fail_at(ps, at, "groups nested more than %d deep", GRAMMAR_MAX_NEST);
            ps->p++;
            int32_t g = gen_rule(ps, r);
            ps->nest++;
            if (g < 0 || !parse_alternates(ps, g, true)) return false;
            ps->nest--;
            skip_ws(ps);
            if (*ps->p != ')') return fail_at(ps, at, "unclosed '('");
            ps->p++;
            if (!push_elem(ps, r, GE_REF, g)) return false;
        } else if (is_name_char(c)) {
            const char *s = ps->p;
            while (is_name_char(*ps->p)) ps->p++;
            int32_t t = find_rule(ps, s, (size_t)(ps->p - s));
            if (t < 0) return false;
            if (ps->ref_at[t] < 0) ps->ref_at[t] = (int32_t)(s - ps->src);
            if (!push_elem(ps, r, GE_REF, t)) return false;
        } else if (c == ':' && strncmp(ps->p, "::=", 3) == 0) {
            return fail_at(ps, at, "'::=' without a rule name before it");
        } else {
            return fail_at(ps, at, "unexpected character '%c'", c);
        }
        if (!parse_postfix(ps, r, from)) return false;
    }
}

static bool parse_alternates(parser *ps, int32_t r, bool nested) {
    for (;;) {
        if (!parse_sequence(ps, r, nested) || !push_elem(ps, r, GE_END, 0)) return false;
        skip_ws(ps);
        if (*ps->p != '|') return true;
        ps->p++;
    }
}

static bool parse_rules(parser *ps) {
    skip_ws(ps);
    while (*ps->p) {
        const char *s = ps->p;
        if (!is_name_char(*s)) return fail_at(ps, s, "expected a rule name");
        while (is_name_char(*ps->p)) ps->p++;
        size_t len = (size_t)(ps->p - s);
        skip_ws(ps);
        if (strncmp(ps->p, "::=", 3) != 0)
            return fail_at(ps, ps->p, "expected '::=' after the rule name '%.*s'", (int)len, s);
        ps->p += 3;
        int32_t r = find_rule(ps, s, len);
        if (r < 0) return false;
        if (ps->def_at[r] >= 0) return fail_at(ps, s, "rule '%.*s' is defined twice", (int)len, s);
        ps->def_at[r] = (int32_t)(s - ps->src);
        if (!parse_alternates(ps, r, false)) return false;
        skip_ws(ps);
        if (*ps->p == ')') return fail_at(ps, ps->p, "unmatched ')'");
    }
    return true;
}

/* ------------------------------------------------------- validation -- */

/* Refuses rules that can reach themselves without consuming a character:
 * the matcher would expand them forever. Also refuses repeating something
 * that can match the empty string ((x?)*, ([a-z]*){0,30}): every way of
 * splitting the input among the copies is a separate parse stack, so the
 * matcher's work grows combinatorially with the text (seconds per character
 * for ([b-d]*){0,30}); the same language is written without the ambiguity
 * by repeating the non-empty part. */
static bool check_left_recursion(parser *ps, grammar *g) {
    int32_t R = g->n_rules;
    bool *nullable = calloc((size_t)R, 1);
    int8_t *color = calloc((size_t)R, 1);
    int32_t *path = malloc((size_t)R * sizeof *path), *ialt = malloc((size_t)R * sizeof *ialt),
            *ipos = malloc((size_t)R * sizeof *ipos);
    bool ok = nullable && color && path && ialt && ipos;
    if (!ok) oom(ps);
    for (bool changed = ok; changed;) {
        changed = false;
        for (int32_t r = 0; r < R; r++) {
            if (nullable[r]) continue;
            for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !nullable[r]; a++) {
                int32_t p = g->alt_start[a];
                while (g->elems[p].kind == GE_REF && nullable[g->elems[p].arg]) p++;
                if (g->elems[p].kind == GE_END) nullable[r] = changed = true;
            }
        }
    }
    for (int32_t i = 0; ok && i < ps->n_reps; i++) {
        int32_t q = ps->reps[2 * i], len = ps->reps[2 * i + 1], p = g->alt_start[g->rule_alt[q]];
        bool empty_ok = true;
        for (int32_t k = 0; k < len && empty_ok; k++)
            empty_ok = g->elems[p + k].kind == GE_REF && nullable[g->elems[p + k].arg];
        if (empty_ok)
            ok = fail_at(
                ps, ps->src + ps->def_at[q],
                "a repetition of something that can match the empty string (rule %s): every "
                "split of the text among the copies is a separate parse; repeat its non-empty "
                "part instead",
                g->rule_names[q]);
    }
    /* Iterative DFS over "r can begin with t" edges: the references at the
     * start of each alternative, and the one after each nullable one. r's
     * walk resumes at alternative ialt[r], element ipos[r] (-1: its start),
     * so a rule of A alternatives costs O(A), not O(A^2) (64,000 alternatives
     * took 4 s). */
    for (int32_t start = 0; ok && start < R; start++) {
        if (color[start]) continue;
        int32_t depth = 0;
        path[depth] = start;
        ialt[start] = g->rule_alt[start];
        ipos[start] = -1;
        color[start] = 1;
        while (ok && depth >= 0) {
            int32_t r = path[depth], next = -1;
            while (next < 0 && ialt[r] < g->rule_alt[r + 1]) {
                const int32_t a = ialt[r], p = ipos[r] < 0 ? g->alt_start[a] : ipos[r];
                if (g->elems[p].kind == GE_REF) next = g->elems[p].arg;
                if (next >= 0 && nullable[next]) {
                    ipos[r] = p + 1;
                } else {
                    ialt[r] = a + 1;
                    ipos[r] = -1;
                }
            }
            if (next < 0) {
                color[r] = 2;
                depth--;
                continue;
            }
            if (color[next] == 1) {
                kvl_buf b = {0};
                int32_t from = depth;
                while (path[from] != next) from--;
                for (int32_t i = from; i <= depth; i++)
                    kvl_buf_printf(&b, "%s -> ", g->rule_names[path[i]]);
                kvl_buf_puts(&b, g->rule_names[next]);
                ok = fail_at(ps, ps->src + ps->def_at[next],
                             "left recursion (a rule reaches itself without consuming input: %s)",
                             b.p ? b.p : "?");
                kvl_buf_free(&b);
            } else if (color[next] == 0) {
                color[next] = 1;
                ialt[next] = g->rule_alt[next];
                ipos[next] = -1;
                path[++depth] = next;
            }
        }
    }
    free(nullable);
    free(color);
    free(path);
    free(ialt);
    free(ipos);
    return ok;
}

void grammar_free(grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_rules; i++) free(g->rule_names[i]);
    free(g->rule_names);
    kvl_free(g->elems); /* and the other tables: one block */
    gvocab_release(g->vocab);
    free(g);
}

static grammar *build(parser *ps) {
    grammar *g = calloc(1, sizeof *g);
    if (!g) return oom(ps), NULL;
    int64_t n_alts = 0;
    for (int32_t r = 0; r < ps->n_rules; r++)
        for (int32_t i = 0; i < ps->bodies[r].n; i++) n_alts += ps->bodies[r].e[i].kind == GE_END;
    const kvl_part parts[] = {KVL_PART(g->elems, ps->n_elems + 1),
                              KVL_PART(g->alt_start, n_alts + 1),
                              KVL_PART(g->rule_alt, ps->n_rules + 1), KVL_PART(g->sets, ps->n_sets),
                              KVL_PART(g->ranges, 2 * (int64_t)ps->n_ranges)};
    if (!KVL_ALLOC_PARTS(parts)) {
        free(g);
        return oom(ps), NULL;
    }
    int32_t ne = 0, na = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        g->rule_alt[r] = na;
        const rbody *b = &ps->bodies[r];
        for (int32_t i = 0; i < b->n; i++) {
            if (i == 0 || b->e[i - 1].kind == GE_END) g->alt_start[na++] = ne;
            g->elems[ne++] = b->e[i];
        }
    }
    g->rule_alt[ps->n_rules] = na;
    g->n_elems = ne;
    g->n_rules = ps->n_rules;
    g->rule_names = ps->names;
    ps->names = NULL;
    g->n_sets = ps->n_sets;
    if (ps->n_sets) memcpy(g->sets, ps->sets, (size_t)ps->n_sets * sizeof *g->sets);
    if (ps->n_ranges) memcpy(g->ranges, ps->ranges, 2 * (size_t)ps->n_ranges * sizeof *g->ranges);
    return g;
}

grammar *grammar_compile(const char *gbnf, const tok_vocab *vocab, kvl_error *err) {
    parser ps = {.src = gbnf ? gbnf : "", .err = err};
    ps.p = ps.src;
    grammar *g = NULL;
    bool ok = parse_rules(&ps);
    int32_t root = -1;
    for (int32_t r = 0; ok && r < ps.n_rules; r++) {
        if (ps.def_at[r] < 0)
            ok = fail_at(&ps, ps.src + ps.ref_at[r], "undefined rule '%s'", ps.names[r]);
        if (strcmp(ps.names[r], "root") == 0) root = r;
    }
    if (ok && root < 0)
        ok = kvl_fail(err, "grammar: no 'root' rule (the start rule must be named root)");
    if (ok) g = build(&ps);
    if (g) {
        g->root = root;
        if (!check_left_recursion(&ps, g) || !grammar_check_start(g, err)) {
            grammar_free(g);
            g = NULL;
        }
    }
    if (g && vocab && !(g->vocab = gvocab_acquire(vocab, err))) {
        grammar_free(g);
        g = NULL;
    }
    for (int32_t r = 0; r < ps.n_rules; r++) {
        if (ps.names) free(ps.names[r]);
        free(ps.bodies[r].e);
    }
    free(ps.names);
    free(ps.bodies);
    free(ps.def_at);
    free(ps.ref_at);
    free(ps.n_gen);
    free(ps.name_ht);
    free(ps.reps);
    free(ps.sets);
    free(ps.ranges);
    return g;
}

void gbnf_append_literal(kvl_buf *out, const char *s, size_t n) {
    kvl_buf_put(out, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') kvl_buf_puts(out, "\\\"");
        else if (c == '\\') kvl_buf_puts(out, "\\\\");
        else if (c == '\n') kvl_buf_puts(out, "\\n");
        else if (c == '\r') kvl_buf_puts(out, "\\r");
        else if (c == '\t') kvl_buf_puts(out, "\\t");
        else if (c < 0x20 || c == 0x7F) kvl_buf_printf(out, "\\x%02X", c);
        else kvl_buf_put(out, &s[i], 1);
    }
    kvl_buf_put(out, "\"", 1);
}
