/* Regular expressions -> GBNF (regex_to_gbnf in grammar.h).
 *
 * GBNF already has groups, alternation and the same repetition operators, so
 * the translation is mostly one of syntax; what needs care is the character
 * level. In json_string mode the text produced is the inside of a JSON
 * string, so a `"`, a backslash or a control character that the regex allows
 * is produced in its escaped form (\" \\ \n ...) and never raw.
 *
 * Refused with an error naming them: backreferences, lookaround, \b \B,
 * inline flags, Unicode properties, possessive quantifiers, anchors anywhere
 * but at the ends. Lazy quantifiers are accepted: for a whole-string match
 * they describe the same strings as the greedy ones. */
#include "grammar.h"
#include "grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rx {
    const char *src, *p;
    bool json;
    kvl_error *err;
    bool failed;
} rx;

static bool rx_fail(rx *r, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool rx_fail(rx *r, const char *at, const char *fmt, ...) {
    char where[48];
    snprintf(where, sizeof where, "regex at offset %d", (int)(at - r->src));
    va_list ap;
    va_start(ap, fmt);
    kvl_vfail_first(r->err, &r->failed, where, fmt, ap);
    va_end(ap);
    return false;
}

/* A set of code points: ranges, maybe negated. */
typedef struct cpset {
    uint32_t lo[64], hi[64];
    int n;
    bool negate;
} cpset;

static bool set_add(rx *r, cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == 64) return rx_fail(r, r->p, "character class with more than 64 ranges");
    s->lo[s->n] = lo;
    s->hi[s->n++] = hi;
    return true;
}

static bool set_has(const cpset *s, uint32_t c) {
    bool in = false;
    for (int i = 0; i < s->n && !in; i++) in = c >= s->lo[i] && c <= s->hi[i];
    return in != s->negate;
}

/* A code point inside a GBNF class or literal. */
static void put_cp(kvl_buf *o, uint32_t c) {
    if (c >= 0x20 && c < 0x7F && !strchr("]\\-^\"[", (int)c)) kvl_buf_printf(o, "%c", (int)c);
    else if (c < 0x80) kvl_buf_printf(o, "\\x%02X", c);
    else if (c < 0x10000) kvl_buf_printf(o, "\\u%04X", c);
    else kvl_buf_printf(o, "\\U%08X", c);
}

static void put_class(kvl_buf *o, const cpset *s, bool exclude_json_specials) {
    kvl_buf_puts(o, s->negate ? "[^" : "[");
    for (int i = 0; i < s->n; i++) {
        put_cp(o, s->lo[i]);
        if (s->hi[i] != s->lo[i]) {
            kvl_buf_puts(o, "-");
            put_cp(o, s->hi[i]);
        }
    }
    if (exclude_json_specials && s->negate) kvl_buf_puts(o, "\"\\\\\\x00-\\x1F");
    kvl_buf_puts(o, "]");
}

/* The JSON-escaped form of a special character, as a GBNF literal. */
static void put_json_escape(kvl_buf *o, uint32_t c) {
    switch (c) {
    case '"': kvl_buf_puts(o, "\"\\\\\\\"\""); return;  /* the two characters \" */
    case '\\': kvl_buf_puts(o, "\"\\\\\\\\\""); return; /* \\ */
    case '\n': kvl_buf_puts(o, "\"\\\\n\""); return;
    case '\t': kvl_buf_puts(o, "\"\\\\t\""); return;
    case '\r': kvl_buf_puts(o, "\"\\\\r\""); return;
    case '\b': kvl_buf_puts(o, "\"\\\\b\""); return;
    case '\f': kvl_buf_puts(o, "\"\\\\f\""); return;
    default: kvl_buf_printf(o, "\"\\\\u%04X\"", c); return;
    }
}

/* A set as a GBNF expression. In JSON mode: the class without the characters
 * that must be escaped, and their escaped forms as alternatives. */
static void put_set(rx *r, kvl_buf *o, const cpset *s) {
    if (!r->json) {
        put_class(o, s, false);
        return;
    }
    kvl_buf_puts(o, "(");
    if (s->negate) {
        put_class(o, s, true);
    } else {
        /* the positive ranges minus '"', '\\' and 0x00-0x1F */
        cpset t = {.n = 0};
        for (int i = 0; i < s->n; i++) {
            uint32_t lo = s->lo[i], hi = s->hi[i];
            if (lo < 0x20) lo = 0x20;
            for (uint32_t cut = 0; lo <= hi && cut < 2; cut++) {
                uint32_t x = cut == 0 ? '"' : '\\';
                if (x >= lo && x <= hi) {
                    if (x > lo && t.n < 64) t.lo[t.n] = lo, t.hi[t.n++] = x - 1;
                    lo = x + 1;
                }
            }
            if (lo <= hi && t.n < 64) t.lo[t.n] = lo, t.hi[t.n++] = hi;
        }
        if (t.n) put_class(o, &t, false);
        else kvl_buf_puts(o, "[^\\x00-\\U0010FFFF]"); /* nothing: only the escapes below */
    }
    static const uint32_t specials[] = {'"', '\\', '\n', '\t', '\r', '\b', '\f'};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
        if (set_has(s, specials[i])) {
            kvl_buf_puts(o, " | ");
            put_json_escape(o, specials[i]);
        }
    for (uint32_t c = 0; c < 0x20; c++)
        if (c != '\n' && c != '\t' && c != '\r' && c != '\b' && c != '\f' && set_has(s, c)) {
            kvl_buf_puts(o, " | ");
            put_json_escape(o, c);
        }
    kvl_buf_puts(o, ")");
}

static void put_char(rx *r, kvl_buf *o, uint32_t c) {
    cpset s = {.n = 1, .lo = {c}, .hi = {c}};
    if (r->json && (c == '"' || c == '\\' || c < 0x20)) {
        put_json_escape(o, c);
        return;
    }
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
        kvl_buf_printf(o, "\"%c\"", (int)c);
        return;
    }
    put_set(r, o, &s);
}

static bool decode_utf8(rx *r, uint32_t *cp) {
    const int n = grammar_utf8_decode(r->p, false, cp);
    if (n <= 0) return rx_fail(r, r->p, "invalid UTF-8");
    r->p += n;
    return true;
}

static bool hex(rx *r, int digits, uint32_t *cp) {
    int bad = 0;
    int64_t v = kvl_hex_value(r->p, digits, &bad);
    if (v < 0) return rx_fail(r, r->p, "expected %d hex digits", digits);
    r->p += digits;
    *cp = (uint32_t)v;
    return true;
}

/* Class escapes \d \w \s and their negations, added to s (negated ones only
 * outside a class: a negated shorthand inside [...] is refused). Returns 0 if
 * c is not one, 1 if added, -1 on error. */
static int shorthand(rx *r, char c, cpset *s, bool in_class) {
    bool neg = c == 'D' || c == 'W' || c == 'S';
    char k = (char)(neg ? c + 32 : c);
    if (k != 'd' && k != 'w' && k != 's') return 0;
    if (neg && in_class)
        return rx_fail(r, r->p, "negated shorthand \\%c inside a class is not supported", c) ? 1
                                                                                             : -1;
    if (neg) s->negate = true;
    bool ok = true;
    if (k == 'd') ok = set_add(r, s, '0', '9');
    if (k == 'w')
        ok = set_add(r, s, '0', '9') && set_add(r, s, 'a', 'z') && set_add(r, s, 'A', 'Z') &&
             set_add(r, s, '_', '_');
    if (k == 's') ok = set_add(r, s, ' ', ' ') && set_add(r, s, '\t', '\r');
    return ok ? 1 : -1;
}

/* An escaped literal character after '\' (the backslash already read). */
static bool escape_char(rx *r, uint32_t *cp) {
    const char *at = r->p - 1;
    char c = *r->p++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0': *cp = 0; return true;
    case 'x': return hex(r, 2, cp);
    case 'u': return hex(r, 4, cp);
    case 'b':
    case 'B': return rx_fail(r, at, "word boundaries (\\%c) are not supported", c);
    case 'p':
    case 'P': return rx_fail(r, at, "Unicode properties (\\%c) are not supported", c);
    case 'A':
    case 'z':
    case 'Z':
    case 'G': return rx_fail(r, at, "anchor \\%c is not supported", c);
    case 0: return rx_fail(r, at, "the pattern ends with a backslash");
    default:
        if (c >= '1' && c <= '9')
            return rx_fail(r, at, "backreferences (\\%c) are not supported", c);
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rx_fail(r, at, "unknown escape \\%c", c);
        *cp = (uint32_t)(unsigned char)c;
        return true;
    }
}

static bool class_atom(rx *r, cpset *s, uint32_t *cp, bool *is_set) {
    *is_set = false;
    if (*r->p == '\\') {
        r->p++;
        int k = shorthand(r, *r->p, s, true);
        if (k < 0) return false;
        if (k > 0) {
            r->p++;
            *is_set = true;
            return true;
        }
        return escape_char(r, cp);
    }
    if (r->p[0] == '[' && r->p[1] == ':')
        return rx_fail(r, r->p, "POSIX classes ([:name:]) are not supported");
    return decode_utf8(r, cp);
}

static bool parse_class(rx *r, cpset *s) {
    const char *open = r->p++;
    if (*r->p == '^') s->negate = true, r->p++;
    bool first = true;
    while (*r->p != ']' || first) {
        if (!*r->p) return rx_fail(r, open, "unterminated character class");
        first = false;
        uint32_t lo, hi;
        bool is_set;
        if (!class_atom(r, s, &lo, &is_set)) return false;
        if (is_set) continue;
        hi = lo;
        if (r->p[0] == '-' && r->p[1] && r->p[1] != ']') {
            r->p++;
            if (!class_atom(r, s, &hi, &is_set)) return false;
            if (is_set) return rx_fail(r, r->p, "a class shorthand cannot end a range");
            if (hi < lo) return rx_fail(r, r->p, "range out of order");
        }
        if (!set_add(r, s, lo, hi)) return false;
    }
    r->p++;
    return true;
}

static bool rx_alt(rx *r, kvl_buf *o, int depth, bool *nullable);

/* *nullable: whether the atom can match the empty string (only a group can). */
static bool rx_atom(rx *r, kvl_buf *o, int depth, bool *nullable) {
    const char *at = r->p;
    char c = *r->p;
    *nullable = false;
    if (c == '(') {
        r->p++;
        if (*r->p == '?') {
            if (r->p[1] == ':') r->p += 2;
            else if (r->p[1] == '=' || r->p[1] == '!' ||
                     (r->p[1] == '<' && (r->p[2] == '=' || r->p[2] == '!')))
                return rx_fail(r, at, "lookaround assertions are not supported");
            else if (r->p[1] == '<' || (r->p[1] == 'P' && r->p[2] == '<')) {
                const char *e = strchr(r->p, '>');
                if (!e) return rx_fail(r, at, "unterminated group name");
                r->p = e + 1;
            } else {
                return rx_fail(r, at, "group syntax (?%c is not supported (inline flags?)",
                               r->p[1] ? r->p[1] : ' ');
            }
        }
        kvl_buf_puts(o, "(");
        if (!rx_alt(r, o, depth + 1, nullable)) return false;
        if (*r->p != ')') return rx_fail(r, at, "unclosed '('");
        r->p++;
        kvl_buf_puts(o, ")");
        return true;
    }
    if (c == '[') {
        cpset s = {.n = 0};
        if (!parse_class(r, &s)) return false;
        put_set(r, o, &s);
        return true;
    }
    if (c == '.') {
        r->p++;
        cpset s = {.n = 1, .lo = {'\n'}, .hi = {'\n'}, .negate = true};
        put_set(r, o, &s);
        return true;
    }
    if (c == '\\') {
        r->p++;
        cpset s = {.n = 0};
        int k = shorthand(r, *r->p, &s, false);
        if (k < 0) return false;
        if (k > 0) {
            r->p++;
            put_set(r, o, &s);
            return true;
        }
        uint32_t cp;
        if (!escape_char(r, &cp)) return false;
        put_char(r, o, cp);
        return true;
    }
    if (c == '^' || c == '$')
        return rx_fail(r, at, "anchor '%c' is only supported at the start/end of the pattern", c);
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return rx_fail(r, at, "quantifier '%c' without anything to repeat", c);
    uint32_t cp;
    if (!decode_utf8(r, &cp)) return false;
    put_char(r, o, cp);
    return true;
}

static bool rx_int(rx *r, long *v) {
    int64_t x = 0;
    const int k = grammar_scan_count(&r->p, &x);
    if (k < 0) return rx_fail(r, r->p, "repetition count above %d", GRAMMAR_MAX_REPEAT);
    if (k > 0) *v = (long)x;
    return k > 0;
}

/* The quantifier after an atom, if any. *optional: it allows zero repetitions.
 * An unbounded repetition of what can match the empty string ("(a?)*") is
 * refused: its grammar rule would reach itself without consuming input. */
static bool rx_quant(rx *r, kvl_buf *o, bool atom_nullable, bool *optional) {
    const char *at = r->p;
    char c = *r->p;
    bool unbounded = false;
    *optional = false;
    if (c == '*' || c == '+' || c == '?') {
        *optional = c != '+';
        unbounded = c != '?';
        kvl_buf_printf(o, "%c", c);
        r->p++;
    } else if (c == '{' && r->p[1] >= '0' && r->p[1] <= '9') {
        r->p++;
        long m = 0, n = -1;
        rx_int(r, &m);
        if (r->failed) return false;
        if (*r->p == ',') {
            r->p++;
            if (!rx_int(r, &n) && r->failed) return false;
        } else {
            n = m;
        }
        if (*r->p != '}') return rx_fail(r, at, "malformed {m,n} quantifier");
        r->p++;
        if (n >= 0 && n < m)
            return rx_fail(r, at, "{%ld,%ld}: the maximum is below the minimum", m, n);
        *optional = m == 0;
        unbounded = n < 0;
        if (n < 0) kvl_buf_printf(o, "{%ld,}", m);
        else kvl_buf_printf(o, "{%ld,%ld}", m, n);
    } else {
        return true;
    }
    if (unbounded && atom_nullable)
        return rx_fail(
            r, at,
            "a repeated group that can match the empty string (like '(a?)*') is not supported");
    if (*r->p == '?') r->p++; /* lazy: the same strings */
    else if (*r->p == '+') return rx_fail(r, r->p, "possessive quantifiers are not supported");
    if (*r->p == '*' || *r->p == '+' || *r->p == '?' ||
        (*r->p == '{' && r->p[1] >= '0' && r->p[1] <= '9'))
        return rx_fail(r, r->p, "nested quantifier (a quantifier after a quantifier)");
    return true;
}

static bool rx_seq(rx *r, kvl_buf *o, int depth, bool *nullable) {
    bool any = false;
    *nullable = true;
    while (*r->p && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p[1] == 0 && depth == 0) break;
        kvl_buf_puts(o, any ? " (" : "(");
        bool atom_nullable = false, optional = false;
        if (!rx_atom(r, o, depth, &atom_nullable)) return false;
        kvl_buf_puts(o, ")");
        if (!rx_quant(r, o, atom_nullable, &optional)) return false;
        *nullable = *nullable && (atom_nullable || optional);
        any = true;
    }
    if (!any) kvl_buf_puts(o, "\"\"");
    return true;
}

static bool rx_alt(rx *r, kvl_buf *o, int depth, bool *nullable) {
    if (depth > 100) return rx_fail(r, r->p, "groups nested too deeply");
    if (!rx_seq(r, o, depth, nullable)) return false;
    while (*r->p == '|') {
        r->p++;
        kvl_buf_puts(o, " | ");
        bool n = false;
        if (!rx_seq(r, o, depth, &n)) return false;
        *nullable = *nullable || n;
    }
    return true;
}

bool regex_to_gbnf(const char *regex, const char *prefix, bool json_string, kvl_buf *out,
                   kvl_error *err) {
    rx r = {.src = regex, .p = regex, .json = json_string, .err = err};
    kvl_buf body = {0};
    if (*r.p == '^') r.p++;
    bool nullable = false;
    bool ok = rx_alt(&r, &body, 0, &nullable);
    if (ok && *r.p == '$' && r.p[1] == 0) r.p++;
    if (ok && *r.p == ')') ok = rx_fail(&r, r.p, "unmatched ')'");
    if (ok && *r.p) ok = rx_fail(&r, r.p, "unexpected '%c'", *r.p);
    if (ok && body.oom) ok = kvl_fail(err, "regex: out of memory");
    if (ok) kvl_buf_printf(out, "%sroot ::= %s\n", prefix, body.p);
    kvl_buf_free(&body);
    return ok;
}
