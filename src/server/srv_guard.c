/* srv_guard: the text a client sent, inside a rendered chat prompt, never
 * becomes control tokens; only the template's own markup does.
 *
 * A template renders strings; which bytes of its output came from the client
 * is lost on the way. So before rendering, every client string is marked
 * where it could form a control token: each occurrence of a control token's
 * text, a head that could finish one the template started, a tail that could
 * start one the template finishes. A mark is a pair of Unicode noncharacters
 * (U+FDD0 opens, U+FDD1 closes; U+FDD2 escapes a client's own U+FDD0..2),
 * which templates pass through as they pass any text. After rendering,
 * srv_unguard removes the marks and returns the byte ranges they enclosed,
 * and tok_encode_guarded tokenizes the whole text with special tokens parsed
 * everywhere except in those ranges. Marking only what could match (rather
 * than wrapping every string) keeps a template's tests on content (empty,
 * startswith, split) seeing the client's text. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

#define MARK_OPEN  "\xEF\xB7\x90" /* U+FDD0 */
#define MARK_CLOSE "\xEF\xB7\x91" /* U+FDD1 */
#define MARK_ESC   "\xEF\xB7\x92" /* U+FDD2 */

static bool is_mark(const char *p, size_t left) {
    return left >= 3 && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xB7 &&
           (unsigned char)p[2] >= 0x90 && (unsigned char)p[2] <= 0x92;
}

typedef struct spanvec {
    tok_span *v;
    size_t n, cap;
} spanvec;

static bool span_push(spanvec *a, size_t off, size_t len) {
    if (!kvl_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v, 8)) return false;
    a->v[a->n++] = (tok_span){off, len};
    return true;
}

static int cmp_span(const void *a, const void *b) {
    const tok_span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Ranges of s[0..n) that could take part in a control token. */
static bool find_ranges(const tok_vocab *v, const char *s, size_t n, spanvec *out) {
    size_t head = 0, tail = 0;
    const int32_t ns = tok_n_special(v);
    for (int32_t k = 0; k < ns; k++) {
        const int32_t id = tok_special_id(v, k);
        if (!tok_is_parse_special(v, id)) continue;
        const char *t = tok_piece(v, id);
        const size_t tl = strlen(t);
        if (tl == 0) continue;
        for (const char *m = s; (m = memmem(m, n - (size_t)(m - s), t, tl)) != NULL; m++)
            if (!span_push(out, (size_t)(m - s), tl)) return false;
        /* a head of s that ends the token: its last k bytes; a tail that begins it */
        for (size_t q = tl - 1 < n ? tl - 1 : n; q > head; q--)
            if (memcmp(s, t + tl - q, q) == 0) {
                head = q;
                break;
            }
        for (size_t q = tl - 1 < n ? tl - 1 : n; q > tail; q--)
            if (memcmp(s + n - q, t, q) == 0) {
                tail = q;
                break;
            }
    }
    if ((head && !span_push(out, 0, head)) || (tail && !span_push(out, n - tail, tail)))
        return false;
    if (out->n > 1) qsort(out->v, out->n, sizeof *out->v, cmp_span);
    size_t w = 0; /* merge overlapping and touching ranges */
    for (size_t i = 0; i < out->n; i++) {
        if (w > 0 && out->v[i].off <= out->v[w - 1].off + out->v[w - 1].len) {
            size_t end = out->v[i].off + out->v[i].len;
            if (end > out->v[w - 1].off + out->v[w - 1].len)
                out->v[w - 1].len = end - out->v[w - 1].off;
        } else {
            out->v[w++] = out->v[i];
        }
    }
    out->n = w;
    return true;
}

char *srv_guard_string(const tok_vocab *v, const char *s, size_t n, size_t *out_len) {
    spanvec r = {0};
    if (!find_ranges(v, s, n, &r)) {
        free(r.v);
        return NULL;
    }
    size_t marks = 0;
    for (size_t i = 0; i + 2 < n; i++) marks += is_mark(s + i, n - i);
    char *out = malloc(n + 3 * marks + 6 * r.n + 1), *o = out;
    if (!out) {
        free(r.v);
        return NULL;
    }
    size_t next = 0; /* the next range */
    bool open = false;
    for (size_t i = 0; i <= n; i++) {
        if (open && i == r.v[next].off + r.v[next].len) {
            memcpy(o, MARK_CLOSE, 3), o += 3;
            open = false;
            next++;
        }
        if (i == n) break;
        if (!open && next < r.n && i == r.v[next].off) {
            memcpy(o, MARK_OPEN, 3), o += 3;
            open = true;
        }
        if (i + 2 < n && is_mark(s + i, n - i)) memcpy(o, MARK_ESC, 3), o += 3;
        *o++ = s[i];
    }
    *o = 0;
    *out_len = (size_t)(o - out);
    free(r.v);
    return out;
}

/* Replaces one cJSON string (a value or a key) by its guarded form. */
static bool guard_str(const tok_vocab *v, char **str) {
    size_t n = strlen(*str), len = 0;
    char *g = srv_guard_string(v, *str, n, &len);
    if (!g) return false;
    if (len == n) { /* nothing marked */
        free(g);
        return true;
    }
    char *c = cJSON_malloc(len + 1);
    if (!c) {
        free(g);
        return false;
    }
    memcpy(c, g, len + 1);
    free(g);
    cJSON_free(*str);
    *str = c;
    return true;
}

bool srv_guard_json(const tok_vocab *v, cJSON *node) {
    for (; node; node = node->next) {
        if (node->string && !(node->type & cJSON_StringIsConst) && !guard_str(v, &node->string))
            return false;
        if (cJSON_IsString(node) && node->valuestring && !guard_str(v, &node->valuestring))
            return false;
        if ((cJSON_IsArray(node) || cJSON_IsObject(node)) && !srv_guard_json(v, node->child))
            return false;
    }
    return true;
}

bool srv_unguard(char *text, size_t *len, tok_span **spans, size_t *n_spans) {
    spanvec r = {0};
    size_t n = *len, o = 0, start = 0;
    int depth = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < n;) {
        if (!is_mark(text + i, n - i)) {
            text[o++] = text[i++];
            continue;
        }
        const unsigned char which = (unsigned char)text[i + 2];
        i += 3;
        if (which == 0x92) { /* escaped: the next character is the client's */
            for (int k = 0; k < 3 && i < n; k++) text[o++] = text[i++];
        } else if (which == 0x90) {
            if (depth++ == 0) start = o;
        } else if (depth > 0 && --depth == 0 && o > start) {
            ok = span_push(&r, start, o - start);
        }
    }
    if (ok && depth > 0 && o > start)
        ok = span_push(&r, start, o - start); /* a template cut the close mark */
    text[o] = 0;
    *len = o;
    if (!ok) {
        free(r.v);
        return false;
    }
    *spans = r.v;
    *n_spans = r.n;
    return true;
}
