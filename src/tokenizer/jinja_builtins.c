/* jinja_builtins: jinja2's filters and tests, the Python str/dict/list methods
 * templates call, and the globals (range, namespace, dict, raise_exception,
 * strftime_now). Each behaves as its jinja2 3.1 / Python 3 counterpart on the
 * values chat templates pass, failing where that one fails; transformers'
 * tojson replaces jinja2's (json.dumps, ensure_ascii=False, no sorting). The
 * ImmutableSandboxedEnvironment refuses the mutating methods (list.append,
 * dict.update, ...) with a SecurityError when they are called.
 *
 * Over 800 lines on purpose: about 120 small independent builtins and the one
 * lookup table that names them, in the order jinja2's documentation lists them;
 * each is read on its own against its Python counterpart. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

jv *jarg(jargs *a, int pos, const char *kw) {
    if (pos >= 0 && pos < a->npos) return a->pos[pos];
    if (kw)
        for (int i = 0; i < a->nkw; i++)
            if (!strcmp(a->kwname[i], kw)) return a->kwval[i];
    return NULL;
}

static jv *S(jx *x, const char *s, size_t n) { return jv_str_nocopy(x, s, n); }
static jv *SB(jx *x, jbuf *b) { return jv_str_nocopy(x, b->p ? b->p : "", b->n); }
static bool opt_bool(jargs *a, int pos, const char *kw, bool def) {
    jv *v = jarg(a, pos, kw);
    return v ? jv_truthy(v) : def;
}
static jv *need_str(jx *x, jv *v, const char *what) {
    if (v->type == JV_UNDEF) jx_undef_fail(x, v);
    if (v->type != JV_STR)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: %s must be str, not %s", what, jv_type_name(v));
    return v;
}

/* ---------------- string helpers ---------------- */
static bool in_chars(uint32_t c, jv *chars) {
    if (!chars) return ju_isspace(c);
    size_t i = 0;
    while (i < chars->u.str.n)
        if (ju_decode(chars->u.str.s, chars->u.str.n, &i) == c) return true;
    return false;
}

static jv *str_strip(jx *x, jv *s, jv *chars, bool left, bool right) {
    if (chars && chars->type == JV_NONE) chars = NULL;
    if (chars) need_str(x, chars, "strip arg");
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, b = 0, e = n;
    if (left)
        while (b < n) {
            size_t q = b;
            if (!in_chars(ju_decode(p, n, &q), chars)) break;
            b = q;
        }
    if (right)
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t q = st;
            if (!in_chars(ju_decode(p, n, &q), chars)) break;
            e = st;
        }
    jv *r = S(x, p + b, e - b);
    r->markup = s->markup;
    return r;
}

/* Simple case mappings of the scripts text usually carries (Latin-1,
 * Latin Extended-A, Greek, Cyrillic); other code points have no case. */
static uint32_t cp_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c == 0xB5) return 0x39C;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0x131) return 'I';
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
    if (c == 0x17F) return 'S';
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c >= 0x3AC && c <= 0x3AF) return c == 0x3AC ? 0x386 : c - 37;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}
static uint32_t cp_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}
static bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xDF; }

static void put_upper(jbuf *b, uint32_t c) {
    if (c == 0xDF) jb_puts(b, "SS"); /* Python: 'ß'.upper() == 'SS' */
    else ju_encode(b, cp_upper(c));
}

/* mode 0 lower, 1 upper, 2 str.title(), 3 str.capitalize(), 4 jinja2's title
 * filter (each word split at whitespace, '-', '(', '{', '[', '<' capitalized) */
static jv *str_case(jx *x, jv *s, int mode) {
    jbuf b = {.arena = &x->arena};
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, i = 0;
    bool prev_cased = false, first = true, word_start = true;
    while (i < n) {
        uint32_t c = ju_decode(p, n, &i);
        switch (mode) {
        case 0: ju_encode(&b, cp_lower(c)); break;
        case 1: put_upper(&b, c); break;
        case 2:
            if (prev_cased) ju_encode(&b, cp_lower(c));
            else put_upper(&b, c);
            prev_cased = cp_cased(c);
            break;
        case 3:
            if (first) put_upper(&b, c);
            else ju_encode(&b, cp_lower(c));
            break;
        case 4: {
            bool sep = ju_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
            if (sep) ju_encode(&b, c);
            else if (word_start) put_upper(&b, c);
            else ju_encode(&b, cp_lower(c));
            word_start = sep;
            break;
        }
        }
        first = false;
    }
    return SB(x, &b);
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

static jv *str_replace(jx *x, jv *s, jv *old, jv *new, int64_t count) {
    jbuf b = {.arena = &x->arena};
    const char *p = s->u.str.s;
    size_t n = s->u.str.n;
    if (old->u.str.n == 0) { /* Python inserts new between every character */
        size_t i = 0;
        int64_t k = 0;
        if (count != 0) {
            jb_put(&b, new->u.str.s, new->u.str.n);
            k++;
        }
        while (i < n) {
            size_t st = i;
            ju_decode(p, n, &i);
            jb_put(&b, p + st, i - st);
            if (count < 0 || k < count) {
                jb_put(&b, new->u.str.s, new->u.str.n);
                k++;
            }
        }
        return SB(x, &b);
    }
    size_t i = 0;
    int64_t k = 0;
    while (i < n) {
        const char *f =
            (count < 0 || k < count) ? memfind(p + i, n - i, old->u.str.s, old->u.str.n) : NULL;
        if (!f) {
            jb_put(&b, p + i, n - i);
            break;
        }
        jb_put(&b, p + i, (size_t)(f - (p + i)));
        jb_put(&b, new->u.str.s, new->u.str.n);
        i = (size_t)(f - p) + old->u.str.n;
        k++;
    }
    return SB(x, &b);
}

static jv *str_split(jx *x, jv *s, jv *sep, int64_t maxsplit, bool from_right) {
    jv *r = jv_list(x, JL_LIST);
    const char *p = s->u.str.s;
    size_t n = s->u.str.n;
    if (!sep || sep->type == JV_NONE) { /* runs of whitespace, no empty strings */
        size_t i = 0;
        int64_t k = 0;
        jv *tmp = jv_list(x, JL_LIST);
        if (!from_right) {
            while (i < n) {
                size_t q = i;
                while (q < n) {
                    size_t t = q;
                    if (!ju_isspace(ju_decode(p, n, &t))) break;
                    q = t;
                }
                i = q;
                if (i >= n) break;
                if (maxsplit >= 0 && k >= maxsplit) { /* the rest as it is */
                    jv_list_push(x, r, S(x, p + i, n - i));
                    return r;
                }
                size_t st = i;
                while (i < n) {
                    size_t t = i;
                    if (ju_isspace(ju_decode(p, n, &t))) break;
                    i = t;
                }
                jv_list_push(x, r, S(x, p + st, i - st));
                k++;
            }
            return r;
        }
        /* rsplit(None): split fully, then join the leading part back if maxsplit */
        jv *all = str_split(x, s, NULL, -1, false);
        if (maxsplit < 0 || (size_t)maxsplit >= all->u.list.n) return all;
        (void)tmp;
        size_t keep = all->u.list.n - (size_t)maxsplit;
        jv *last_head = all->u.list.items[keep - 1];
        size_t head_end = (size_t)(last_head->u.str.s + last_head->u.str.n - p);
        jv *head = str_strip(x, S(x, p, head_end), NULL, true, false);
        jv_list_push(x, r, head);
        for (size_t j = keep; j < all->u.list.n; j++) jv_list_push(x, r, all->u.list.items[j]);
        return r;
    }
    need_str(x, sep, "sep");
    if (sep->u.str.n == 0) jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || k < maxsplit)
                                ? memfind(p + i, n - i, sep->u.str.s, sep->u.str.n)
                                : NULL;
            if (!f) {
                jv_list_push(x, r, S(x, p + i, n - i));
                return r;
            }
            jv_list_push(x, r, S(x, p + i, (size_t)(f - (p + i))));
            i = (size_t)(f - p) + sep->u.str.n;
            k++;
        }
    }
    /* rsplit with a separator: find from the right */
    jv *rev = jv_list(x, JL_LIST);
    size_t e = n;
    int64_t k = 0;
    for (;;) {
        const char *f = NULL;
        if ((maxsplit < 0 || k < maxsplit) && e >= sep->u.str.n)
            for (size_t i = e - sep->u.str.n + 1; i-- > 0;)
                if (memcmp(p + i, sep->u.str.s, sep->u.str.n) == 0) {
                    f = p + i;
                    break;
                }
        if (!f) {
            jv_list_push(x, rev, S(x, p, e));
            break;
        }
        size_t st = (size_t)(f - p) + sep->u.str.n;
        jv_list_push(x, rev, S(x, p + st, e - st));
        e = (size_t)(f - p);
        k++;
    }
    for (size_t j = rev->u.list.n; j-- > 0;) jv_list_push(x, r, rev->u.list.items[j]);
    return r;
}

static bool str_affix(jx *x, jv *s, jv *aff, bool end) {
    if (aff->type == JV_LIST && aff->sub == JL_TUPLE) {
        for (size_t i = 0; i < aff->u.list.n; i++)
            if (str_affix(x, s, aff->u.list.items[i], end)) return true;
        return false;
    }
    if (aff->type != JV_STR)
        jx_fail(x, JINJA_ERR_RUNTIME,
                "TypeError: %s first arg must be str or a tuple of str, not %s",
                end ? "endswith" : "startswith", jv_type_name(aff));
    if (aff->u.str.n > s->u.str.n) return false;
    const char *p = end ? s->u.str.s + s->u.str.n - aff->u.str.n : s->u.str.s;
    return memcmp(p, aff->u.str.s, aff->u.str.n) == 0;
}

/* ---------------- methods ---------------- */
static int64_t int_arg(jx *x, jv *v, int64_t def) {
    if (!v || v->type == JV_NONE) return def;
    if (v->type == JV_INT) return v->u.i;
    if (v->type == JV_BOOL) return v->u.b;
    jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: '%s' object cannot be interpreted as an integer",
            jv_type_name(v));
}

static jv *m_str(jx *x, jv *self, jargs *a);
static jv *m_dict(jx *x, jv *self, jargs *a);
static jv *m_list(jx *x, jv *self, jargs *a);

/* A bound method carries its name in the function value; the dispatchers
 * below read it back through this thread-free trick: the self pointer is a
 * two-item tuple (object, name). */
static jv *bind(jx *x, jfunc_fn fn, jv *obj, const char *name) {
    jv *t = jv_list(x, JL_TUPLE);
    jv_list_push(x, t, obj);
    jv_list_push(x, t, jv_cstr(x, name));
    return jv_func(x, fn, t, name);
}

static const char *const STR_METHODS[] = {
    "strip",   "lstrip",  "rstrip",     "split",   "rsplit",     "startswith", "endswith",
    "replace", "upper",   "lower",      "title",   "capitalize", "find",       "rfind",
    "count",   "join",    "splitlines", "isdigit", "isalpha",    "isalnum",    "isspace",
    "isupper", "islower", "index",      "format",  "casefold",   "swapcase",   NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append",  "extend", "insert", "pop", "remove",
                                          "reverse", "sort",   "clear",  NULL};

static bool in_list(const char *const *l, const char *n) {
    for (; *l; l++)
        if (!strcmp(*l, n)) return true;
    return false;
}

jv *jb_method(jx *x, jv *obj, const char *name) {
    if (obj->type == JV_STR && in_list(STR_METHODS, name)) return bind(x, m_str, obj, name);
    if (obj->type == JV_DICT && obj->sub == JD_DICT) {
        if (in_list(DICT_METHODS, name)) return bind(x, m_dict, obj, name);
        if (in_list(DICT_UNSAFE, name)) {
            jv *u = jv_undef(x, "access to attribute '%s' of 'dict' object is unsafe.", name);
            u->sub = JU_SECURITY;
            return u;
        }
    }
    if (obj->type == JV_LIST && obj->sub != JL_GEN) {
        if (in_list(LIST_METHODS, name)) return bind(x, m_list, obj, name);
        if (in_list(LIST_UNSAFE, name) && obj->sub == JL_LIST) {
            jv *u = jv_undef(x, "access to attribute '%s' of 'list' object is unsafe.", name);
            u->sub = JU_SECURITY;
            return u;
        }
    }
    return NULL;
}

static jv *m_str(jx *x, jv *self, jargs *a) {
    jv *s = self->u.list.items[0];
    const char *m = self->u.list.items[1]->u.str.s;
    jv *a0 = jarg(a, 0, NULL), *a1 = jarg(a, 1, NULL);
    if (!strcmp(m, "strip")) return str_strip(x, s, jarg(a, 0, "chars"), true, true);
    if (!strcmp(m, "lstrip")) return str_strip(x, s, jarg(a, 0, "chars"), true, false);
    if (!strcmp(m, "rstrip")) return str_strip(x, s, jarg(a, 0, "chars"), false, true);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit"))
        return str_split(x, s, jarg(a, 0, "sep"), int_arg(x, jarg(a, 1, "maxsplit"), -1),
                         m[0] == 'r');
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (!a0)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: %s() takes at least 1 argument (0 given)", m);
        return jv_bool(str_affix(x, s, a0, m[0] == 'e'));
    }
    if (!strcmp(m, "replace")) {
        if (!a0 || !a1)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: replace expected at least 2 arguments");
        need_str(x, a0, "replace() argument 1");
        need_str(x, a1, "replace() argument 2");
        return str_replace(x, s, a0, a1, int_arg(x, jarg(a, 2, "count"), -1));
    }
    if (!strcmp(m, "upper")) return str_case(x, s, 1);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return str_case(x, s, 0);
    if (!strcmp(m, "title")) return str_case(x, s, 2);
    if (!strcmp(m, "capitalize")) return str_case(x, s, 3);
    if (!strcmp(m, "swapcase")) {
        jbuf b = {.arena = &x->arena};
        size_t i = 0;
        while (i < s->u.str.n) {
            uint32_t c = ju_decode(s->u.str.s, s->u.str.n, &i);
            if (cp_upper(c) != c) put_upper(&b, c);
            else ju_encode(&b, cp_lower(c));
        }
        return SB(x, &b);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        if (!a0)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: %s() takes at least 1 argument (0 given)", m);
        need_str(x, a0, "substring");
        const char *p = s->u.str.s;
        size_t n = s->u.str.n;
        if (!strcmp(m, "count")) {
            int64_t k = 0;
            if (a0->u.str.n == 0) return jv_int(x, (int64_t)ju_len(p, n) + 1);
            for (const char *f = p; (f = memfind(f, n - (size_t)(f - p), a0->u.str.s, a0->u.str.n));
                 f += a0->u.str.n)
                k++;
            return jv_int(x, k);
        }
        const char *found = NULL;
        if (m[0] == 'r') {
            for (size_t i = n + 1; i-- > 0;)
                if (i + a0->u.str.n <= n && memcmp(p + i, a0->u.str.s, a0->u.str.n) == 0) {
                    found = p + i;
                    break;
                }
        } else found = memfind(p, n, a0->u.str.s, a0->u.str.n);
        if (!found && m[0] == 'i') jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: substring not found");
        return jv_int(x, found ? (int64_t)ju_len(p, (size_t)(found - p)) : -1);
    }
    if (!strcmp(m, "join")) {
        if (!a0)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: join() takes exactly one argument (0 given)");
        size_t n;
        jv **it = jx_iter(x, a0, &n);
        jbuf b = {.arena = &x->arena};
        for (size_t i = 0; i < n; i++) {
            if (it[i]->type != JV_STR)
                jx_fail(x, JINJA_ERR_RUNTIME,
                        "TypeError: sequence item %zu: expected str instance, %s found", i,
                        jv_type_name(it[i]));
            if (i) jb_put(&b, s->u.str.s, s->u.str.n);
            jb_put(&b, it[i]->u.str.s, it[i]->u.str.n);
        }
        return SB(x, &b);
    }
    if (!strcmp(m, "splitlines")) {
        jv *r = jv_list(x, JL_LIST);
        const char *p = s->u.str.s;
        size_t n = s->u.str.n, st = 0, i = 0;
        while (i < n) {
            if (p[i] == '\n' || p[i] == '\r') {
                jv_list_push(x, r, S(x, p + st, i - st));
                if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') i++;
                st = ++i;
            } else i++;
        }
        if (st < n) jv_list_push(x, r, S(x, p + st, n - st));
        return r;
    }
    if (!strncmp(m, "is", 2)) {
        if (s->u.str.n == 0) return jv_bool(false);
        bool all = true, any_cased = false;
        for (size_t i = 0; i < s->u.str.n; i++) {
            unsigned char c = (unsigned char)s->u.str.s[i];
            if (!strcmp(m, "isdigit")) all &= isdigit(c) != 0;
            else if (!strcmp(m, "isalpha")) all &= isalpha(c) != 0;
            else if (!strcmp(m, "isalnum")) all &= isalnum(c) != 0;
            else if (!strcmp(m, "isspace")) all &= isspace(c) != 0;
            else if (!strcmp(m, "isupper")) {
                all &= !islower(c);
                any_cased |= isupper(c) != 0;
            } else if (!strcmp(m, "islower")) {
                all &= !isupper(c);
                any_cased |= islower(c) != 0;
            }
        }
        if (!strcmp(m, "isupper") || !strcmp(m, "islower")) return jv_bool(all && any_cased);
        return jv_bool(all);
    }
    if (!strcmp(m, "format")) {
        /* "{}" and "{0}"-style positional fields only */
        jbuf b = {.arena = &x->arena};
        const char *p = s->u.str.s;
        size_t n = s->u.str.n;
        int auto_i = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
                jb_putc(&b, '{');
                i++;
            } else if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
                jb_putc(&b, '}');
                i++;
            } else if (p[i] == '{') {
                size_t e = i + 1;
                while (e < n && p[e] != '}') e++;
                if (e >= n)
                    jx_fail(x, JINJA_ERR_RUNTIME,
                            "ValueError: Single '{' encountered in format string");
                jv *v = NULL;
                if (e == i + 1) v = jarg(a, auto_i++, NULL);
                else if (isdigit((unsigned char)p[i + 1])) v = jarg(a, atoi(p + i + 1), NULL);
                else v = jarg(a, -1, ja_strndup(&x->arena, p + i + 1, e - i - 1));
                if (!v)
                    jx_fail(x, JINJA_ERR_RUNTIME,
                            "IndexError: Replacement index out of range for format");
                jv_to_str(x, &b, v);
                i = e;
            } else jb_putc(&b, p[i]);
        }
        return SB(x, &b);
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "AttributeError: 'str' object has no attribute '%s'", m);
}

static jv *m_dict(jx *x, jv *self, jargs *a) {
    jv *d = self->u.list.items[0];
    const char *m = self->u.list.items[1]->u.str.s;
    if (!strcmp(m, "get")) {
        jv *k = jarg(a, 0, NULL);
        if (!k) jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: get expected at least 1 argument, got 0");
        for (size_t i = 0; i < d->u.dict.n; i++)
            if (jv_equal(d->u.dict.kv[i].key, k)) return d->u.dict.kv[i].val;
        jv *def = jarg(a, 1, NULL);
        return def ? def : jv_none();
    }
    if (!strcmp(m, "copy")) {
        jv *r = jv_dict(x, JD_DICT);
        for (size_t i = 0; i < d->u.dict.n; i++)
            jv_dict_set(x, r, d->u.dict.kv[i].key, d->u.dict.kv[i].val);
        return r;
    }
    jv *r = jv_list(x, JL_LIST);
    r->view = !strcmp(m, "keys") ? JVIEW_KEYS : !strcmp(m, "values") ? JVIEW_VALUES : JVIEW_ITEMS;
    for (size_t i = 0; i < d->u.dict.n; i++) {
        if (!strcmp(m, "keys")) jv_list_push(x, r, d->u.dict.kv[i].key);
        else if (!strcmp(m, "values")) jv_list_push(x, r, d->u.dict.kv[i].val);
        else {
            jv *t = jv_list(x, JL_TUPLE);
            jv_list_push(x, t, d->u.dict.kv[i].key);
            jv_list_push(x, t, d->u.dict.kv[i].val);
            jv_list_push(x, r, t);
        }
    }
    return r;
}

static jv *m_list(jx *x, jv *self, jargs *a) {
    jv *l = self->u.list.items[0];
    const char *m = self->u.list.items[1]->u.str.s;
    if (!strcmp(m, "copy")) {
        jv *r = jv_list(x, JL_LIST);
        for (size_t i = 0; i < l->u.list.n; i++) jv_list_push(x, r, l->u.list.items[i]);
        return r;
    }
    jv *v = jarg(a, 0, NULL);
    if (!v)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: %s() takes exactly one argument (0 given)", m);
    int64_t k = 0;
    for (size_t i = 0; i < l->u.list.n; i++)
        if (jv_equal(l->u.list.items[i], v)) {
            if (!strcmp(m, "index")) return jv_int(x, (int64_t)i);
            k++;
        }
    if (!strcmp(m, "index")) jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: value is not in list");
    return jv_int(x, k);
}

/* ---------------- tests ---------------- */
static const char *const TESTS[] = {
    "defined",     "undefined", "none",    "string", "mapping", "iterable",    "sequence", "number",
    "integer",     "float",     "boolean", "true",   "false",   "callable",    "odd",      "even",
    "divisibleby", "eq",        "equalto", "==",     "ne",      "!=",          "lt",       "<",
    "lessthan",    "le",        "<=",      "gt",     ">",       "greaterthan", "ge",       ">=",
    "in",          "lower",     "upper",   "sameas", "escaped", "filter",      "test",     NULL};

bool jb_test_exists(const char *name) { return in_list(TESTS, name); }

static bool filter_exists(const char *name);

bool jb_test(jx *x, const char *name, jv *v, jargs *a) {
    if (!jb_test_exists(name))
        jx_fail(x, JINJA_ERR_RUNTIME, "TemplateRuntimeError: No test named '%s' found.", name);
    jv *a0 = jarg(a, 0, NULL);
    int t = v->type;
    if (!strcmp(name, "defined")) return t != JV_UNDEF;
    if (!strcmp(name, "undefined")) return t == JV_UNDEF;
    if (!strcmp(name, "none")) return t == JV_NONE;
    if (!strcmp(name, "string")) return t == JV_STR;
    if (!strcmp(name, "mapping")) return t == JV_DICT && v->sub == JD_DICT;
    if (!strcmp(name, "iterable"))
        return t == JV_UNDEF || t == JV_STR || t == JV_LIST || (t == JV_DICT && v->sub == JD_DICT);
    if (!strcmp(name, "sequence"))
        return t == JV_UNDEF || t == JV_STR || (t == JV_LIST && v->sub != JL_GEN) ||
               (t == JV_DICT && v->sub == JD_DICT);
    if (!strcmp(name, "number")) return t == JV_INT || t == JV_FLOAT || t == JV_BOOL;
    if (!strcmp(name, "integer")) return t == JV_INT;
    if (!strcmp(name, "float")) return t == JV_FLOAT;
    if (!strcmp(name, "boolean")) return t == JV_BOOL;
    if (!strcmp(name, "true")) return t == JV_BOOL && v->u.b;
    if (!strcmp(name, "false")) return t == JV_BOOL && !v->u.b;
    if (!strcmp(name, "callable")) return t == JV_MACRO || t == JV_FUNC;
    if (!strcmp(name, "escaped")) return t == JV_STR && v->markup;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        jv *s = jv_stringify(x, v);
        jv *c = str_case(x, s, name[0] == 'u');
        return jv_equal(s, c);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (t == JV_UNDEF) jx_undef_fail(x, v);
        if (t != JV_INT && t != JV_BOOL)
            jx_fail(x, JINJA_ERR_RUNTIME,
                    "TypeError: unsupported operand type(s) for %%: '%s' and 'int'",
                    jv_type_name(v));
        int64_t i = t == JV_INT ? v->u.i : v->u.b;
        if (name[0] == 'o') return (i % 2 + 2) % 2 == 1;
        if (name[0] == 'e') return i % 2 == 0;
        int64_t d = int_arg(x, a0, 1);
        if (d == 0)
            jx_fail(x, JINJA_ERR_RUNTIME, "ZeroDivisionError: integer division or modulo by zero");
        return i % d == 0;
    }
    if (!a0 && strcmp(name, "filter") && strcmp(name, "test"))
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: test '%s' needs an argument", name);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "=="))
        return jv_equal(v, a0);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_equal(v, a0);
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan"))
        return jv_compare(x, v, a0, "<") < 0;
    if (!strcmp(name, "le") || !strcmp(name, "<=")) return jv_compare(x, v, a0, "<=") <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan"))
        return jv_compare(x, v, a0, ">") > 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return jv_compare(x, v, a0, ">=") >= 0;
    if (!strcmp(name, "sameas")) {
        if (v->type != a0->type) return false;
        if (v->type == JV_NONE || v->type == JV_BOOL) return jv_equal(v, a0);
        return v == a0;
    }
    if (!strcmp(name, "in")) {
        jv *l = jv_list(x, JL_LIST);
        jv_list_push(x, l, v);
        (void)l;
        size_t n;
        if (a0->type == JV_STR) {
            if (v->type != JV_STR)
                jx_fail(x, JINJA_ERR_RUNTIME,
                        "TypeError: 'in <string>' requires string as left operand, not %s",
                        jv_type_name(v));
            return memfind(a0->u.str.s, a0->u.str.n, v->u.str.s, v->u.str.n) != NULL;
        }
        jv **it = jx_iter(x, a0, &n);
        for (size_t i = 0; i < n; i++)
            if (jv_equal(it[i], v)) return true;
        return false;
    }
    if (!strcmp(name, "filter"))
        return v->type == JV_STR && filter_exists(ja_strndup(&x->arena, v->u.str.s, v->u.str.n));
    if (!strcmp(name, "test"))
        return v->type == JV_STR && jb_test_exists(ja_strndup(&x->arena, v->u.str.s, v->u.str.n));
    jx_fail(x, JINJA_ERR_RUNTIME, "TemplateRuntimeError: No test named '%s' found.", name);
}

/* ---------------- filters ---------------- */
static jv *attr_path(jx *x, jv *v, jv *attr) {
    /* jinja2's make_attrgetter: "a.b.0" walks items, integer parts as indices */
    if (attr->type == JV_INT) return jx_getitem(x, v, attr);
    jv *s = jv_stringify(x, attr);
    const char *p = s->u.str.s, *end = p + s->u.str.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        jv *key;
        bool digits = dot > p;
        for (const char *q = p; q < dot; q++) digits &= isdigit((unsigned char)*q) != 0;
        if (digits) key = jv_int(x, strtoll(p, NULL, 10));
        else key = S(x, p, (size_t)(dot - p));
        v = jx_getitem(x, v, key);
        p = dot + 1;
    }
    return v;
}

static jv *lower_key(jx *x, jv *v, bool case_sensitive) {
    if (!case_sensitive && v->type == JV_STR) return str_case(x, v, 0);
    return v;
}

typedef struct sort_ctx {
    jx *x;
    jv **keys;
} sort_ctx;

/* stable merge sort of idx by keys[idx] */
static void msort(jx *x, jv **keys, size_t *idx, size_t *tmp, size_t n, bool rev) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(x, keys, idx, tmp, h, rev);
    msort(x, keys, idx + h, tmp, n - h, rev);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        /* jinja2's sort keys are one-item lists: equal items never reach '<' */
        int c = jv_equal(keys[idx[j]], keys[idx[i]])
                    ? 0
                    : jv_compare(x, keys[idx[j]], keys[idx[i]], "<");
        if (rev ? c > 0 : c < 0) tmp[k++] = idx[j++];
        else tmp[k++] = idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static jv *sorted(jx *x, jv **items, jv **keys, size_t n, bool rev) {
    size_t *idx = ja_alloc(&x->arena, (n + 1) * sizeof *idx),
           *tmp = ja_alloc(&x->arena, (n + 1) * sizeof *tmp);
    for (size_t i = 0; i < n; i++) idx[i] = i;
    msort(x, keys, idx, tmp, n, rev);
    jv *r = jv_list(x, JL_LIST);
    for (size_t i = 0; i < n; i++) jv_list_push(x, r, items[idx[i]]);
    return r;
}

static int64_t py_len(jx *x, jv *v) {
    switch (v->type) {
    case JV_UNDEF: return 0;
    case JV_STR: return (int64_t)ju_len(v->u.str.s, v->u.str.n);
    case JV_LIST:
        if (v->sub != JL_GEN) return (int64_t)v->u.list.n;
        break;
    case JV_DICT: return (int64_t)v->u.dict.n;
    default: break;
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: object of type '%s' has no len()", jv_type_name(v));
}

static jv *select_impl(jx *x, jv *v, jargs *a, bool attr, bool keep) {
    size_t n = 0;
    jv **it = jv_truthy(v) ? jx_iter(x, v, &n) : NULL; /* jinja2: "if value:" first */
    jv *r = jv_list(x, JL_GEN);
    int first = attr ? 1 : 0;
    jv *at = attr ? jarg(a, 0, NULL) : NULL;
    if (attr && !at)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: selectattr/rejectattr need an attribute");
    jv *tn = jarg(a, first, NULL);
    jargs rest = {.pos = a->pos ? a->pos + (a->npos > first + 1 ? first + 1 : a->npos) : NULL,
                  .npos = a->npos > first + 1 ? a->npos - first - 1 : 0,
                  .kwname = a->kwname,
                  .kwval = a->kwval,
                  .nkw = a->nkw};
    for (size_t i = 0; i < n; i++) {
        jv *item = attr ? attr_path(x, it[i], at) : it[i];
        bool ok;
        if (!tn) ok = jv_truthy(item);
        else {
            jv *tname = need_str(x, tn, "test name");
            ok = jb_test(x, ja_strndup(&x->arena, tname->u.str.s, tname->u.str.n), item, &rest);
        }
        if (ok == keep) jv_list_push(x, r, it[i]);
    }
    return r;
}

static const char *const FILTERS[] = {
    "tojson",   "length", "count",   "trim",       "string",      "default", "d",
    "join",     "safe",   "items",   "upper",      "lower",       "title",   "capitalize",
    "dictsort", "list",   "indent",  "selectattr", "rejectattr",  "select",  "reject",
    "map",      "int",    "float",   "sort",       "min",         "max",     "first",
    "last",     "unique", "reverse", "replace",    "round",       "abs",     "sum",
    "attr",     "e",      "escape",  "center",     "wordcount",   "batch",   "slice",
    "truncate", "pprint", "format",  "striptags",  "forceescape", NULL};
static bool filter_exists(const char *name) { return in_list(FILTERS, name); }

jv *jb_filter(jx *x, const char *name, jv *v, jargs *a) {
    jv *a0 = jarg(a, 0, NULL);
    if (!strcmp(name, "tojson")) {
        /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        bool ea = opt_bool(a, 0, "ensure_ascii", false);
        jv *ind = jarg(a, 1, "indent"), *sep = jarg(a, 2, "separators");
        bool sk = opt_bool(a, 3, "sort_keys", false);
        const char *indent = NULL;
        char spaces[64];
        if (ind && ind->type != JV_NONE) {
            if (ind->type == JV_STR) indent = ja_strndup(&x->arena, ind->u.str.s, ind->u.str.n);
            else {
                int64_t k = int_arg(x, ind, 0);
                if (k < 0) k = 0;
                if (k > 60) k = 60;
                memset(spaces, ' ', (size_t)k);
                spaces[k] = 0;
                indent = spaces;
            }
        }
        const char *isep = indent ? "," : ", ", *ksep = ": ";
        if (sep && sep->type != JV_NONE) {
            if (sep->type != JV_LIST || sep->u.list.n != 2 ||
                sep->u.list.items[0]->type != JV_STR || sep->u.list.items[1]->type != JV_STR)
                jx_fail(x, JINJA_ERR_RUNTIME,
                        "ValueError: tojson separators must be a pair of strings");
            isep =
                ja_strndup(&x->arena, sep->u.list.items[0]->u.str.s, sep->u.list.items[0]->u.str.n);
            ksep =
                ja_strndup(&x->arena, sep->u.list.items[1]->u.str.s, sep->u.list.items[1]->u.str.n);
        }
        jbuf b = {.arena = &x->arena};
        jv_tojson(x, &b, v, ea, indent, isep, ksep, sk);
        return SB(x, &b);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) return jv_int(x, py_len(x, v));
    if (!strcmp(name, "trim"))
        return str_strip(x, jv_stringify(x, v), jarg(a, 0, "chars"), true, true);
    if (!strcmp(name, "string")) {
        jv *s = jv_stringify(x, v);
        return s;
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv *def = jarg(a, 0, "default_value");
        bool boolean = opt_bool(a, 1, "boolean", false);
        if (v->type == JV_UNDEF || (boolean && !jv_truthy(v))) return def ? def : S(x, "", 0);
        return v;
    }
    if (!strcmp(name, "join")) {
        jv *d = jarg(a, 0, "d"), *attr = jarg(a, 1, "attribute");
        size_t n;
        jv **it = jx_iter(x, v, &n);
        jbuf b = {.arena = &x->arena};
        jv *ds = d ? jv_stringify(x, d) : NULL;
        for (size_t i = 0; i < n; i++) {
            if (i && ds) jb_put(&b, ds->u.str.s, ds->u.str.n);
            jv_to_str(x, &b, attr ? attr_path(x, it[i], attr) : it[i]);
        }
        return SB(x, &b);
    }
    if (!strcmp(name, "safe")) {
        jv *s = jv_stringify(x, v);
        jv *r = S(x, s->u.str.s, s->u.str.n);
        r->markup = 1;
        return r;
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) {
        if (v->type == JV_STR && v->markup && name[0] != 'f') return v;
        jv *plain = S(x, "", 0), *mk = S(x, "", 0);
        mk->markup = 1;
        (void)plain;
        return jx_binop(x, OP_ADD, mk, jv_stringify(x, v));
    }
    if (!strcmp(name, "items")) {
        if (v->type == JV_UNDEF) return jv_list(x, JL_GEN);
        if (v->type != JV_DICT || v->sub != JD_DICT)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: Can only get item pairs from a mapping.");
        jargs none = {0};
        jv *r = m_dict(x, bind(x, m_dict, v, "items")->u.fn.self, &none);
        r->sub = JL_GEN;
        r->view = JVIEW_NONE;
        return r;
    }
    if (!strcmp(name, "upper")) return str_case(x, jv_stringify(x, v), 1);
    if (!strcmp(name, "lower")) return str_case(x, jv_stringify(x, v), 0);
    if (!strcmp(name, "title")) return str_case(x, jv_stringify(x, v), 4);
    if (!strcmp(name, "capitalize")) return str_case(x, jv_stringify(x, v), 3);
    if (!strcmp(name, "dictsort")) {
        bool cs = opt_bool(a, 0, "case_sensitive", false);
        jv *by = jarg(a, 1, "by");
        bool rev = opt_bool(a, 2, "reverse", false);
        if (v->type == JV_UNDEF) jx_undef_fail(x, v);
        if (v->type != JV_DICT || v->sub != JD_DICT)
            jx_fail(x, JINJA_ERR_RUNTIME, "AttributeError: '%s' object has no attribute 'items'",
                    jv_type_name(v));
        int pos = by && by->type == JV_STR && by->u.str.n == 5 && !memcmp(by->u.str.s, "value", 5)
                      ? 1
                      : 0;
        jargs none = {0};
        jv *items = m_dict(x, bind(x, m_dict, v, "items")->u.fn.self, &none);
        size_t n = items->u.list.n;
        jv **keys = ja_alloc(&x->arena, (n + 1) * sizeof *keys);
        for (size_t i = 0; i < n; i++)
            keys[i] = lower_key(x, items->u.list.items[i]->u.list.items[pos], cs);
        return sorted(x, items->u.list.items, keys, n, rev);
    }
    if (!strcmp(name, "list")) {
        size_t n;
        jv **it = jx_iter(x, v, &n);
        jv *r = jv_list(x, JL_LIST);
        for (size_t i = 0; i < n; i++) jv_list_push(x, r, it[i]);
        return r;
    }
    if (!strcmp(name, "indent")) {
        if (v->type == JV_UNDEF) jx_undef_fail(x, v);
        if (v->type != JV_STR)
            jx_fail(x, JINJA_ERR_RUNTIME,
                    "TypeError: unsupported operand type(s) for +=: '%s' and 'str'",
                    jv_type_name(v));
        jv *w = jarg(a, 0, "width");
        bool first = opt_bool(a, 1, "first", false), blank = opt_bool(a, 2, "blank", false);
        jv *ind;
        if (w && w->type == JV_STR) ind = w;
        else {
            int64_t k = int_arg(x, w, 4);
            char *sp = ja_alloc(&x->arena, (size_t)(k > 0 ? k : 0) + 1);
            for (int64_t i = 0; i < k; i++) sp[i] = ' ';
            ind = S(x, sp, (size_t)(k > 0 ? k : 0));
        }
        /* s += "\n"; lines = s.splitlines() */
        jbuf src = {.arena = &x->arena};
        jb_put(&src, v->u.str.s, v->u.str.n);
        jb_putc(&src, '\n');
        jargs none = {0};
        jv *lines = m_str(x, bind(x, m_str, SB(x, &src), "splitlines")->u.fn.self, &none);
        jbuf b = {.arena = &x->arena};
        if (first) jb_put(&b, ind->u.str.s, ind->u.str.n);
        for (size_t i = 0; i < lines->u.list.n; i++) {
            jv *ln = lines->u.list.items[i];
            if (i) {
                jb_putc(&b, '\n');
                if (blank || ln->u.str.n) jb_put(&b, ind->u.str.s, ind->u.str.n);
            }
            jb_put(&b, ln->u.str.s, ln->u.str.n);
        }
        return SB(x, &b);
    }
    if (!strcmp(name, "selectattr")) return select_impl(x, v, a, true, true);
    if (!strcmp(name, "rejectattr")) return select_impl(x, v, a, true, false);
    if (!strcmp(name, "select")) return select_impl(x, v, a, false, true);
    if (!strcmp(name, "reject")) return select_impl(x, v, a, false, false);
    if (!strcmp(name, "map")) {
        size_t n = 0;
        jv **it = jv_truthy(v) ? jx_iter(x, v, &n) : NULL; /* jinja2: "if value:" first */
        jv *r = jv_list(x, JL_GEN);
        jv *attr = jarg(a, -1, "attribute");
        if (attr) {
            jv *def = jarg(a, -1, "default");
            for (size_t i = 0; i < n; i++) {
                jv *e = attr_path(x, it[i], attr);
                if (e->type == JV_UNDEF && def) e = def;
                jv_list_push(x, r, e);
            }
            return r;
        }
        if (!a0)
            jx_fail(x, JINJA_ERR_RUNTIME, "FilterArgumentError: map requires a filter argument");
        jv *fname = need_str(x, a0, "filter name");
        const char *fn = ja_strndup(&x->arena, fname->u.str.s, fname->u.str.n);
        jargs rest = {.pos = a->pos + 1,
                      .npos = a->npos - 1,
                      .kwname = a->kwname,
                      .kwval = a->kwval,
                      .nkw = a->nkw};
        for (size_t i = 0; i < n; i++) jv_list_push(x, r, jb_filter(x, fn, it[i], &rest));
        return r;
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        bool is_int = name[0] == 'i';
        jv *def = jarg(a, 0, "default");
        if (v->type == JV_INT) return is_int ? v : jv_float(x, (double)v->u.i);
        if (v->type == JV_BOOL) return is_int ? jv_int(x, v->u.b) : jv_float(x, v->u.b);
        if (v->type == JV_FLOAT) return is_int ? jv_int(x, (int64_t)v->u.f) : v;
        if (v->type == JV_STR) {
            char *s = ja_strndup(&x->arena, v->u.str.s, v->u.str.n), *end;
            while (*s && isspace((unsigned char)*s)) s++;
            if (*s) {
                if (is_int) {
                    long long k = strtoll(s, &end, 10);
                    while (*end && isspace((unsigned char)*end)) end++;
                    if (!*end) return jv_int(x, k);
                }
                double d = strtod(s, &end);
                while (*end && isspace((unsigned char)*end)) end++;
                if (!*end) return is_int ? jv_int(x, (int64_t)d) : jv_float(x, d);
            }
        }
        if (def) return def;
        return is_int ? jv_int(x, 0) : jv_float(x, 0.0);
    }
    if (!strcmp(name, "sort") || !strcmp(name, "min") || !strcmp(name, "max") ||
        !strcmp(name, "unique")) {
        bool is_sort = name[0] == 's', is_unique = name[0] == 'u';
        bool rev = is_sort ? opt_bool(a, 0, "reverse", false) : false;
        bool cs = opt_bool(a, is_sort ? 1 : 0, "case_sensitive", false);
        jv *attr = jarg(a, is_sort ? 2 : 1, "attribute");
        size_t n;
        jv **it = jx_iter(x, v, &n);
        jv **keys = ja_alloc(&x->arena, (n + 1) * sizeof *keys);
        for (size_t i = 0; i < n; i++)
            keys[i] = lower_key(x, attr ? attr_path(x, it[i], attr) : it[i], cs);
        if (is_unique) {
            jv *r = jv_list(x, JL_GEN);
            for (size_t i = 0; i < n; i++) {
                bool seen = false;
                for (size_t j = 0; j < i && !seen; j++) seen = jv_equal(keys[j], keys[i]);
                if (!seen) jv_list_push(x, r, it[i]);
            }
            return r;
        }
        jv *s = sorted(x, it, keys, n, rev);
        if (is_sort) return s;
        if (n == 0) return jv_undef(x, "No aggregated item, sequence was empty.");
        return name[1] == 'i' ? s->u.list.items[0] : s->u.list.items[n - 1];
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        size_t n;
        jv **it = jx_iter(x, v, &n);
        if (n == 0) return jv_undef(x, "No %s item, sequence was empty.", name);
        return name[0] == 'f' ? it[0] : it[n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v->type == JV_STR) {
            size_t n;
            jv **it = jx_iter(x, v, &n);
            jbuf b = {.arena = &x->arena};
            for (size_t i = n; i-- > 0;) jb_put(&b, it[i]->u.str.s, it[i]->u.str.n);
            return SB(x, &b);
        }
        size_t n;
        jv **it = jx_iter(x, v, &n);
        jv *r = jv_list(x, JL_GEN);
        for (size_t i = n; i-- > 0;) jv_list_push(x, r, it[i]);
        return r;
    }
    if (!strcmp(name, "replace")) {
        jv *s = jv_stringify(x, v), *o = jarg(a, 0, "old"), *nw = jarg(a, 1, "new");
        if (!o || !nw) jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: replace needs old and new");
        return str_replace(x, s, jv_stringify(x, o), jv_stringify(x, nw),
                           int_arg(x, jarg(a, 2, "count"), -1));
    }
    if (!strcmp(name, "round")) {
        int64_t prec = int_arg(x, jarg(a, 0, "precision"), 0);
        jv *m = jarg(a, 1, "method");
        if (v->type == JV_UNDEF) jx_undef_fail(x, v);
        if (v->type != JV_INT && v->type != JV_FLOAT && v->type != JV_BOOL)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: round() needs a number, not %s",
                    jv_type_name(v));
        double f = v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : v->u.b;
        double p = pow(10.0, (double)prec), r;
        const char *ms = m && m->type == JV_STR ? m->u.str.s : "common";
        if (!strncmp(ms, "ceil", 4)) r = ceil(f * p) / p;
        else if (!strncmp(ms, "floor", 5)) r = floor(f * p) / p;
        else r = nearbyint(f * p) / p; /* Python's round: half to even */
        return jv_float(x, r);
    }
    if (!strcmp(name, "abs")) {
        if (v->type == JV_INT) return jv_int(x, v->u.i < 0 ? -v->u.i : v->u.i);
        if (v->type == JV_BOOL) return jv_int(x, v->u.b);
        if (v->type == JV_FLOAT) return jv_float(x, fabs(v->u.f));
        if (v->type == JV_UNDEF) jx_undef_fail(x, v);
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: bad operand type for abs(): '%s'",
                jv_type_name(v));
    }
    if (!strcmp(name, "sum")) {
        jv *attr = jarg(a, 0, "attribute"), *acc = jarg(a, 1, "start");
        if (!acc) acc = jv_int(x, 0);
        size_t n;
        jv **it = jx_iter(x, v, &n);
        for (size_t i = 0; i < n; i++)
            acc = jx_binop(x, OP_ADD, acc, attr ? attr_path(x, it[i], attr) : it[i]);
        return acc;
    }
    if (!strcmp(name, "attr")) {
        jv *n = need_str(x, a0 ? a0 : jv_none(), "attribute name");
        return jx_getattr(x, v, ja_strndup(&x->arena, n->u.str.s, n->u.str.n));
    }
    if (!strcmp(name, "center")) {
        jv *s = jv_stringify(x, v);
        int64_t w = int_arg(x, jarg(a, 0, "width"), 80),
                len = (int64_t)ju_len(s->u.str.s, s->u.str.n);
        if (w <= len) return s;
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        jbuf b = {.arena = &x->arena};
        for (int64_t i = 0; i < left; i++) jb_putc(&b, ' ');
        jb_put(&b, s->u.str.s, s->u.str.n);
        for (int64_t i = 0; i < pad - left; i++) jb_putc(&b, ' ');
        return SB(x, &b);
    }
    if (!strcmp(name, "wordcount")) { /* len(re.findall(r"\w+", s)) */
        jv *str = jv_stringify(x, v);
        int64_t k = 0;
        bool in_word = false;
        size_t i = 0;
        while (i < str->u.str.n) {
            uint32_t c = ju_decode(str->u.str.s, str->u.str.n, &i);
            bool w = c == '_' || (c < 0x80 ? isalnum((int)c) != 0
                                           : (cp_cased(c) || (c >= 0x3040 && c <= 0x9FFF) ||
                                              (c >= 0xAC00 && c <= 0xD7AF)));
            if (w && !in_word) k++;
            in_word = w;
        }
        return jv_int(x, k);
    }
    if (!strcmp(name, "batch") || !strcmp(name, "slice")) {
        int64_t k = int_arg(x, a0, 1);
        if (k <= 0) jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: %s count must be positive", name);
        jv *fill = jarg(a, 1, "fill_with");
        size_t n;
        jv **it = jx_iter(x, v, &n);
        jv *r = jv_list(x, JL_GEN);
        if (name[0] == 'b') {
            for (size_t i = 0; i < n; i += (size_t)k) {
                jv *chunk = jv_list(x, JL_LIST);
                for (size_t j = i; j < i + (size_t)k; j++)
                    if (j < n) jv_list_push(x, chunk, it[j]);
                    else if (fill) jv_list_push(x, chunk, fill);
                jv_list_push(x, r, chunk);
            }
            return r;
        }
        size_t per = n / (size_t)k, extra = n % (size_t)k, off = 0;
        for (size_t s = 0; s < (size_t)k; s++) {
            size_t start = off, end = off + per + (s < extra ? 1 : 0);
            jv *chunk = jv_list(x, JL_LIST);
            for (size_t j = start; j < end; j++) jv_list_push(x, chunk, it[j]);
            if (fill && s >= extra) jv_list_push(x, chunk, fill);
            off = end;
            jv_list_push(x, r, chunk);
        }
        return r;
    }
    if (!strcmp(name, "pprint")) {
        jbuf b = {.arena = &x->arena};
        jv_repr(x, &b, v);
        return SB(x, &b);
    }
    if (!strcmp(name, "format")) return jb_percent_format(x, jv_stringify(x, v), a->pos, a->npos);
    if (!strcmp(name, "truncate")) {
        jv *s = jv_stringify(x, v);
        int64_t len = int_arg(x, jarg(a, 0, "length"), 255);
        if ((int64_t)ju_len(s->u.str.s, s->u.str.n) <= len + 5) return s;
        size_t off = ju_offset(s->u.str.s, s->u.str.n, (size_t)(len - 3 > 0 ? len - 3 : 0));
        jbuf b = {.arena = &x->arena};
        jb_put(&b, s->u.str.s, off);
        jb_puts(&b, "...");
        return SB(x, &b);
    }
    if (!strcmp(name, "striptags")) return jv_stringify(x, v);
    jx_fail(x, JINJA_ERR_RUNTIME, "TemplateRuntimeError: No filter named '%s' found.", name);
}

/* Python's printf-style "fmt % args": %[flags][width][.prec](s|r|d|i|f|F|e|E|g|G|x|X|o|c|%) */
jv *jb_percent_format(jx *x, jv *fmt, jv **args, int nargs) {
    jbuf b = {.arena = &x->arena};
    const char *p = fmt->u.str.s;
    size_t n = fmt->u.str.n;
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            jb_putc(&b, p[i]);
            continue;
        }
        char spec[32];
        size_t sl = 0;
        spec[sl++] = '%';
        i++;
        while (i < n && strchr("-+ #0", p[i]) && sl < 8) spec[sl++] = p[i++];
        while (i < n && isdigit((unsigned char)p[i]) && sl < 16) spec[sl++] = p[i++];
        if (i < n && p[i] == '.') {
            spec[sl++] = p[i++];
            while (i < n && isdigit((unsigned char)p[i]) && sl < 24) spec[sl++] = p[i++];
        }
        if (i >= n) jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: incomplete format");
        char conv = p[i];
        if (conv == '%') {
            jb_putc(&b, '%');
            continue;
        }
        if (k >= nargs)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: not enough arguments for format string");
        jv *v = args[k++];
        char out[512];
        if (conv == 's' || conv == 'r') {
            jbuf t = {.arena = &x->arena};
            if (conv == 's') jv_to_str(x, &t, v);
            else jv_repr(x, &t, v);
            spec[sl++] = 's';
            spec[sl] = 0;
            if (sl == 2) jb_put(&b, t.p ? t.p : "", t.n);
            else {
                snprintf(out, sizeof out, spec, t.p ? t.p : "");
                jb_puts(&b, out);
            }
            continue;
        }
        bool num = v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL;
        if (!num)
            jx_fail(x, JINJA_ERR_RUNTIME,
                    "TypeError: %%%c format: a real number is required, not %s", conv,
                    jv_type_name(v));
        double f = v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : v->u.b;
        long long iv = v->type == JV_FLOAT ? (long long)v->u.f
                       : v->type == JV_INT ? v->u.i
                                           : v->u.b;
        if (strchr("di", conv)) {
            spec[sl++] = 'l';
            spec[sl++] = 'l';
            spec[sl++] = 'd';
            spec[sl] = 0;
            snprintf(out, sizeof out, spec, iv);
        } else if (strchr("xXo", conv)) {
            spec[sl++] = 'l';
            spec[sl++] = 'l';
            spec[sl++] = conv;
            spec[sl] = 0;
            snprintf(out, sizeof out, spec, iv);
        } else if (strchr("fFeEgG", conv)) {
            spec[sl++] = conv;
            spec[sl] = 0;
            snprintf(out, sizeof out, spec, f);
        } else if (conv == 'c') {
            jbuf t = {.arena = &x->arena};
            ju_encode(&t, (uint32_t)iv);
            jb_put(&b, t.p, t.n);
            continue;
        } else jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: unsupported format character '%c'", conv);
        jb_puts(&b, out);
    }
    if (k < nargs)
        jx_fail(x, JINJA_ERR_RUNTIME,
                "TypeError: not all arguments converted during string formatting");
    return SB(x, &b);
}

/* ---------------- globals ---------------- */
static jv *g_range(jx *x, jv *self, jargs *a) {
    int64_t start = 0, stop, step = 1;
    if (a->npos == 0)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: range expected at least 1 argument, got 0");
    if (a->npos == 1) stop = int_arg(x, a->pos[0], 0);
    else {
        start = int_arg(x, a->pos[0], 0);
        stop = int_arg(x, a->pos[1], 0);
        if (a->npos > 2) step = int_arg(x, a->pos[2], 1);
    }
    if (step == 0) jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: range() arg 3 must not be zero");
    jv *r = jv_list(x, JL_LIST);
    int64_t count = 0;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (++count > 10000000)
            jx_fail(x, JINJA_ERR_RUNTIME, "OverflowError: range() of more than 10000000 items");
        if ((count & 1023) == 0) jx_step(x);
        jv_list_push(x, r, jv_int(x, i));
    }
    return r;
}

static jv *make_dict(jx *x, jargs *a, int sub) {
    jv *d = jv_dict(x, sub);
    if (a->npos > 0) {
        jv *src = a->pos[0];
        if (src->type == JV_DICT)
            for (size_t i = 0; i < src->u.dict.n; i++)
                jv_dict_set(x, d, src->u.dict.kv[i].key, src->u.dict.kv[i].val);
        else {
            size_t n;
            jv **it = jx_iter(x, src, &n);
            for (size_t i = 0; i < n; i++) {
                if (it[i]->type != JV_LIST || it[i]->u.list.n != 2)
                    jx_fail(x, JINJA_ERR_RUNTIME,
                            "ValueError: dictionary update sequence element has wrong length");
                jv_dict_set(x, d, jv_stringify(x, it[i]->u.list.items[0]), it[i]->u.list.items[1]);
            }
        }
    }
    for (int i = 0; i < a->nkw; i++) jv_dict_set(x, d, jv_cstr(x, a->kwname[i]), a->kwval[i]);
    return d;
}
static jv *g_namespace(jx *x, jv *self, jargs *a) { return make_dict(x, a, JD_NS); }
static jv *g_dict(jx *x, jv *self, jargs *a) { return make_dict(x, a, JD_DICT); }

static jv *g_raise(jx *x, jv *self, jargs *a) {
    jv *m = jarg(a, 0, "message");
    jbuf b = {.arena = &x->arena};
    if (m) jv_to_str(x, &b, m);
    jx_fail(x, JINJA_ERR_RAISED, "%s", b.p ? b.p : "");
}

static jv *g_strftime(jx *x, jv *self, jargs *a) {
    jv *f = jarg(a, 0, "format");
    if (!f || f->type != JV_STR)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: strftime_now() needs a format string");
    struct tm tm = {0};
    tm.tm_year = x->now.year - 1900;
    tm.tm_mon = x->now.month - 1;
    tm.tm_mday = x->now.day;
    time_t t = timegm(&tm);
    gmtime_r(&t, &tm);
    char *fmt = ja_strndup(&x->arena, f->u.str.s, f->u.str.n);
    char out[512];
    size_t n = strftime(out, sizeof out, fmt, &tm);
    return jv_str(x, out, n);
}

static jv *g_joiner_call(jx *x, jv *self, jargs *a) {
    jv *used = self->u.list.items[1];
    if (!used->u.b) {
        self->u.list.items[1] = jv_bool(true);
        return S(x, "", 0);
    }
    return self->u.list.items[0];
}
static jv *g_joiner(jx *x, jv *self, jargs *a) {
    jv *st = jv_list(x, JL_LIST);
    jv *sep = jarg(a, 0, "sep");
    jv_list_push(x, st, sep ? sep : S(x, ", ", 2));
    jv_list_push(x, st, jv_bool(false));
    return jv_func(x, g_joiner_call, st, "joiner");
}

jv *jb_global(jx *x, const char *name) {
    if (!strcmp(name, "range")) return jv_func(x, g_range, NULL, "range");
    if (!strcmp(name, "namespace")) return jv_func(x, g_namespace, NULL, "namespace");
    if (!strcmp(name, "dict")) return jv_func(x, g_dict, NULL, "dict");
    if (!strcmp(name, "raise_exception")) return jv_func(x, g_raise, NULL, "raise_exception");
    if (!strcmp(name, "strftime_now")) return jv_func(x, g_strftime, NULL, "strftime_now");
    if (!strcmp(name, "joiner")) return jv_func(x, g_joiner, NULL, "joiner");
    return NULL;
}
