/* jinja_lex: template source to tokens, as jinja2's lexer splits it with
 * trim_blocks=True and lstrip_blocks=True:
 *   - newlines normalised to "\n", one final newline of the source dropped
 *     (keep_trailing_newline=False);
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag, "-%}", "-}}",
 *     "-#}" all whitespace after it;
 *   - trim_blocks: the first newline after a block or comment tag is dropped;
 *   - lstrip_blocks: spaces and tabs from the start of a line up to a block or
 *     comment tag are dropped ("{%+" keeps them);
 *   - {% raw %}...{% endraw %} is text. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

typedef struct lexer {
    jarena *a;
    const char *s; /* normalised source */
    size_t n, i;
    int line;
    bool line_starting; /* the previous tag ended a line (lstrip_blocks applies) */
    jtok *toks;
    size_t ntoks, cap;
    char *err;
    size_t err_cap;
} lexer;

static bool lx_err(lexer *L, const char *msg) {
    snprintf(L->err, L->err_cap, "template syntax error at line %d: %s", L->line, msg);
    return false;
}

static jtok *lx_push(lexer *L, jtok_type type, const char *s, size_t n) {
    if (L->ntoks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        L->toks = ja_grow(L->a, L->toks, L->ntoks, cap, sizeof *L->toks);
        L->cap = cap;
    }
    jtok *t = &L->toks[L->ntoks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = L->line;
    t->s = s;
    t->n = n;
    return t;
}

static void count_lines(lexer *L, size_t from, size_t to) {
    for (size_t k = from; k < to; k++)
        if (L->s[k] == '\n') L->line++;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Emits text s[from, to) with the strip rules of the tag that follows it. */
static void emit_text(lexer *L, size_t from, size_t to, char tag, char mod) {
    if (mod == '-') {
        while (to > from && is_ws(L->s[to - 1])) to--;
    } else if (tag != '{' && mod != '+') {
        size_t l = to;
        while (l > from && L->s[l - 1] != '\n') l--;
        bool has_nl = l > from;
        if (has_nl || L->line_starting) {
            bool all_ws = l < to;
            for (size_t k = l; k < to; k++)
                if (!(L->s[k] == ' ' || L->s[k] == '\t' || L->s[k] == '\f' || L->s[k] == '\v'))
                    all_ws = false;
            if (all_ws) to = l;
        }
    }
    if (to > from) lx_push(L, JT_TEXT, L->s + from, to - from);
}

/* After an end delimiter at L->i: '-' strips all whitespace; a block or
 * comment end drops one newline (trim_blocks). */
static void after_end(lexer *L, bool minus, bool block) {
    if (minus) {
        size_t st = L->i;
        while (L->i < L->n && is_ws(L->s[L->i])) L->i++;
        count_lines(L, st, L->i);
        L->line_starting = L->i > st && L->s[L->i - 1] == '\n';
    } else if (block && L->i < L->n && L->s[L->i] == '\n') {
        L->i++;
        L->line++;
        L->line_starting = true;
    } else L->line_starting = false;
}

static const char *decode_string(lexer *L, const char *s, size_t n, size_t *out_n) {
    char *o = ja_alloc(L->a, n * 4 + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) {
            o[k++] = c;
            continue;
        }
        char e = s[++i];
        uint32_t cp = 0;
        int hex = 0;
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '0': o[k++] = '\0'; break;
        case '\n': break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default: o[k++] = '\\'; o[k++] = e;
        }
        if (hex) {
            bool ok = i + (size_t)hex < n;
            for (int h = 0; ok && h < hex; h++)
                ok = isxdigit((unsigned char)s[i + 1 + (size_t)h]) != 0;
            if (!ok) {
                o[k++] = '\\';
                o[k++] = e;
                continue;
            }
            for (int h = 0; h < hex; h++) {
                char d = s[i + 1 + (size_t)h];
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)d)
                                              ? d - '0'
                                              : (tolower((unsigned char)d) - 'a' + 10));
            }
            i += (size_t)hex;
            jbuf b = {.arena = L->a};
            ju_encode(&b, cp);
            memcpy(o + k, b.p, b.n);
            k += b.n;
        }
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

static const char *OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-*/%~()[]{},.:|=<>";

/* Tokens of one {{ }} or {% %} tag, from L->i up to and including its end. */
static bool lex_tag(lexer *L, bool block) {
    int depth = 0;
    for (;;) {
        while (L->i < L->n && is_ws(L->s[L->i])) {
            if (L->s[L->i] == '\n') L->line++;
            L->i++;
        }
        if (L->i >= L->n) return lx_err(L, block ? "missing '%}'" : "missing '}}'");
        const char *p = L->s + L->i;
        size_t left = L->n - L->i;
        if (depth == 0) {
            char e = block ? '%' : '}';
            bool minus = p[0] == '-' && left >= 3 && p[1] == e && p[2] == '}';
            bool plus = block && p[0] == '+' && left >= 3 && p[1] == e && p[2] == '}';
            if (minus || plus || (left >= 2 && p[0] == e && p[1] == '}')) {
                lx_push(L, block ? JT_BLOCK_END : JT_VAR_END, p, 0);
                L->i += (minus || plus) ? 3 : 2;
                if (plus) L->line_starting = false;
                else after_end(L, minus, block);
                return true;
            }
        }
        unsigned char c = (unsigned char)p[0];
        if (isalpha(c) || c == '_') {
            size_t k = 1;
            while (k < left && (isalnum((unsigned char)p[k]) || p[k] == '_')) k++;
            lx_push(L, JT_NAME, ja_strndup(L->a, p, k), k);
            L->i += k;
        } else if (isdigit(c)) {
            size_t k = 0;
            bool is_float = false;
            while (k < left && (isdigit((unsigned char)p[k]) || p[k] == '_')) k++;
            /* jinja2: no float right after a '.' (x.0.1 is two subscripts) */
            bool after_dot = L->i > 0 && L->s[L->i - 1] == '.';
            if (!after_dot && k + 1 < left && p[k] == '.' && isdigit((unsigned char)p[k + 1])) {
                is_float = true;
                k++;
                while (k < left && (isdigit((unsigned char)p[k]) || p[k] == '_')) k++;
            }
            if (!after_dot && k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t m = k + 1;
                if (m < left && (p[m] == '+' || p[m] == '-')) m++;
                if (m < left && isdigit((unsigned char)p[m])) {
                    is_float = true;
                    k = m;
                    while (k < left && isdigit((unsigned char)p[k])) k++;
                }
            }
            char num[64];
            size_t nn = 0;
            for (size_t q = 0; q < k && nn < sizeof num - 1; q++)
                if (p[q] != '_') num[nn++] = p[q];
            num[nn] = 0;
            jtok *t = lx_push(L, is_float ? JT_FLOAT : JT_INT, p, k);
            if (is_float) t->f = strtod(num, NULL);
            else t->i = strtoll(num, NULL, 10);
            L->i += k;
        } else if (c == '\'' || c == '"') {
            size_t k = 1;
            while (k < left && p[k] != (char)c) {
                if (p[k] == '\\') k++;
                k++;
            }
            if (k >= left) return lx_err(L, "unterminated string");
            size_t dn;
            const char *d = decode_string(L, p + 1, k - 1, &dn);
            jtok *t = lx_push(L, JT_STRING, d, dn);
            (void)t;
            count_lines(L, L->i, L->i + k);
            L->i += k + 1;
        } else {
            size_t k = 0;
            for (int o = 0; OPS2[o]; o++)
                if (left >= 2 && p[0] == OPS2[o][0] && p[1] == OPS2[o][1]) k = 2;
            if (!k && strchr(OPS1, c)) k = 1;
            if (!k) {
                char m[64];
                snprintf(m, sizeof m, "unexpected character '%c'", c);
                return lx_err(L, m);
            }
            if (k == 1 && (c == '(' || c == '[' || c == '{')) depth++;
            if (k == 1 && (c == ')' || c == ']' || c == '}')) {
                if (depth == 0) return lx_err(L, "unbalanced bracket");
                depth--;
            }
            lx_push(L, JT_OP, ja_strndup(L->a, p, k), k);
            L->i += k;
        }
    }
}

/* "{% raw %}" at L->i (just after "{%" and its modifier)? Then emits the raw
 * text and moves past "{% endraw %}". Returns 1 if handled, 0 if not raw, -1 on error. */
static int lex_raw(lexer *L) {
    size_t k = L->i;
    while (k < L->n && is_ws(L->s[k])) k++;
    if (L->n - k < 3 || memcmp(L->s + k, "raw", 3) != 0) return 0;
    k += 3;
    while (k < L->n && is_ws(L->s[k])) k++;
    bool minus = false;
    if (k < L->n && L->s[k] == '-') {
        minus = true;
        k++;
    }
    if (L->n - k < 2 || L->s[k] != '%' || L->s[k + 1] != '}') return 0;
    k += 2;
    L->i = k;
    after_end(L, minus, true);
    size_t body = L->i;
    for (size_t q = body; q + 1 < L->n; q++) {
        if (L->s[q] != '{' || L->s[q + 1] != '%') continue;
        size_t r = q + 2;
        bool lminus = r < L->n && L->s[r] == '-';
        if (lminus) r++;
        while (r < L->n && is_ws(L->s[r])) r++;
        if (L->n - r < 6 || memcmp(L->s + r, "endraw", 6) != 0) continue;
        r += 6;
        while (r < L->n && is_ws(L->s[r])) r++;
        bool rminus = r < L->n && L->s[r] == '-';
        if (rminus) r++;
        if (L->n - r < 2 || L->s[r] != '%' || L->s[r + 1] != '}') continue;
        emit_text(L, body, q, '%', lminus ? '-' : 0);
        count_lines(L, body, r + 2);
        L->i = r + 2;
        after_end(L, rminus, true);
        return 1;
    }
    lx_err(L, "missing '{% endraw %}'");
    return -1;
}

bool jinja_lex(jarena *a, const char *src, size_t n, jtok **toks, size_t *ntoks, char *err,
               size_t err_cap) {
    lexer L = {.a = a, .line = 1, .line_starting = true, .err = err, .err_cap = err_cap};
    /* newlines to "\n"; one trailing newline dropped */
    char *s = ja_alloc(a, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else s[m++] = src[i];
    }
    if (m && s[m - 1] == '\n') m--;
    s[m] = 0;
    L.s = s;
    L.n = m;
    while (L.i < L.n) {
        size_t st = L.i, q = L.i;
        char kind = 0;
        while (q + 1 < L.n) {
            if (L.s[q] == '{' && (L.s[q + 1] == '{' || L.s[q + 1] == '%' || L.s[q + 1] == '#')) {
                kind = L.s[q + 1];
                break;
            }
            q++;
        }
        if (!kind) {
            lx_push(&L, JT_TEXT, L.s + st, L.n - st);
            count_lines(&L, st, L.n);
            break;
        }
        char mod = q + 2 < L.n ? L.s[q + 2] : 0;
        if (mod != '-' && mod != '+') mod = 0;
        emit_text(&L, st, q, kind, mod);
        count_lines(&L, st, q);
        L.i = q + 2 + (mod ? 1 : 0);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t r = L.i; r + 1 < L.n; r++)
                if (L.s[r] == '#' && L.s[r + 1] == '}') {
                    e = L.s + r;
                    break;
                }
            if (!e) return lx_err(&L, "missing '#}'");
            size_t end = (size_t)(e - L.s);
            bool minus = end > L.i && L.s[end - 1] == '-';
            count_lines(&L, L.i, end);
            L.i = end + 2;
            after_end(&L, minus, true);
            continue;
        }
        if (kind == '%') {
            int r = lex_raw(&L);
            if (r < 0) return false;
            if (r > 0) continue;
        }
        lx_push(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, L.s + q, 2);
        if (!lex_tag(&L, kind == '%')) return false;
    }
    lx_push(&L, JT_EOF, "", 0);
    *toks = L.toks;
    *ntoks = L.ntoks;
    return true;
}
