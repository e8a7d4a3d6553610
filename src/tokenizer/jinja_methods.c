/* jinja_methods: the Python str/dict/list methods templates call
 * (s.strip(), d.items(), l.index(x), ...), the string helpers behind them
 * (also used by the filters) and Python's printf-style `fmt % args`. The
 * ImmutableSandboxedEnvironment refuses the mutating methods (list.append,
 * dict.update, ...) with a SecurityError when they are called. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

/* ---------------- string helpers ---------------- */
static bool in_chars(uint32_t c, jv *chars) {
    if (!chars) return ju_isspace(c);
    size_t i = 0;
    while (i < chars->u.str.n)
        if (ju_decode(chars->u.str.s, chars->u.str.n, &i) == c) return true;
    return false;
}

jv *jb_str_strip(jx *x, jv *s, jv *chars, bool left, bool right) {
    if (chars && chars->type == JV_NONE) chars = NULL;
    if (chars) jb_need_str(x, chars, "strip arg");
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
    jv *r = jv_str_nocopy(x, p + b, e - b);
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
bool jb_cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xDF; }

static void put_upper(jbuf *b, uint32_t c) {
    if (c == 0xDF) jb_puts(b, "SS"); /* Python: 'ß'.upper() == 'SS' */
    else ju_encode(b, cp_upper(c));
}

/* mode 0 lower, 1 upper, 2 str.title(), 3 str.capitalize(), 4 jinja2's title
 * filter (each word split at whitespace, '-', '(', '{', '[', '<' capitalized) */
jv *jb_str_case(jx *x, jv *s, int mode) {
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
            prev_cased = jb_cp_cased(c);
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
    return jv_buf(x, &b);
}

const char *jb_memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

jv *jb_str_replace(jx *x, jv *s, jv *old, jv *new, int64_t count) {
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
        return jv_buf(x, &b);
    }
    size_t i = 0;
    int64_t k = 0;
    while (i < n) {
        const char *f =
            (count < 0 || k < count) ? jb_memfind(p + i, n - i, old->u.str.s, old->u.str.n) : NULL;
        if (!f) {
            jb_put(&b, p + i, n - i);
            break;
        }
        jb_put(&b, p + i, (size_t)(f - (p + i)));
        jb_put(&b, new->u.str.s, new->u.str.n);
        i = (size_t)(f - p) + old->u.str.n;
        k++;
    }
    return jv_buf(x, &b);
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
                    jv_list_push(x, r, jv_str_nocopy(x, p + i, n - i));
                    return r;
                }
                size_t st = i;
                while (i < n) {
                    size_t t = i;
                    if (ju_isspace(ju_decode(p, n, &t))) break;
                    i = t;
                }
                jv_list_push(x, r, jv_str_nocopy(x, p + st, i - st));
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
        jv *head = jb_str_strip(x, jv_str_nocopy(x, p, head_end), NULL, true, false);
        jv_list_push(x, r, head);
        for (size_t j = keep; j < all->u.list.n; j++) jv_list_push(x, r, all->u.list.items[j]);
        return r;
    }
    jb_need_str(x, sep, "sep");
    if (sep->u.str.n == 0) jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || k < maxsplit)
                                ? jb_memfind(p + i, n - i, sep->u.str.s, sep->u.str.n)
                                : NULL;
            if (!f) {
                jv_list_push(x, r, jv_str_nocopy(x, p + i, n - i));
                return r;
            }
            jv_list_push(x, r, jv_str_nocopy(x, p + i, (size_t)(f - (p + i))));
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
            jv_list_push(x, rev, jv_str_nocopy(x, p, e));
            break;
        }
        size_t st = (size_t)(f - p) + sep->u.str.n;
        jv_list_push(x, rev, jv_str_nocopy(x, p + st, e - st));
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
int64_t jb_int_arg(jx *x, jv *v, int64_t def) {
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

bool jb_in_list(const char *const *l, const char *n) {
    for (; *l; l++)
        if (!strcmp(*l, n)) return true;
    return false;
}

jv *jb_method(jx *x, jv *obj, const char *name) {
    if (obj->type == JV_STR && jb_in_list(STR_METHODS, name)) return bind(x, m_str, obj, name);
    if (obj->type == JV_DICT && obj->sub == JD_DICT) {
        if (jb_in_list(DICT_METHODS, name)) return bind(x, m_dict, obj, name);
        if (jb_in_list(DICT_UNSAFE, name)) {
            jv *u = jv_undef(x, "access to attribute '%s' of 'dict' object is unsafe.", name);
            u->sub = JU_SECURITY;
            return u;
        }
    }
    if (obj->type == JV_LIST && obj->sub != JL_GEN) {
        if (jb_in_list(LIST_METHODS, name)) return bind(x, m_list, obj, name);
        if (jb_in_list(LIST_UNSAFE, name) && obj->sub == JL_LIST) {
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
    if (!strcmp(m, "strip")) return jb_str_strip(x, s, jarg(a, 0, "chars"), true, true);
    if (!strcmp(m, "lstrip")) return jb_str_strip(x, s, jarg(a, 0, "chars"), true, false);
    if (!strcmp(m, "rstrip")) return jb_str_strip(x, s, jarg(a, 0, "chars"), false, true);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit"))
        return str_split(x, s, jarg(a, 0, "sep"), jb_int_arg(x, jarg(a, 1, "maxsplit"), -1),
                         m[0] == 'r');
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (!a0)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: %s() takes at least 1 argument (0 given)", m);
        return jv_bool(str_affix(x, s, a0, m[0] == 'e'));
    }
    if (!strcmp(m, "replace")) {
        if (!a0 || !a1)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: replace expected at least 2 arguments");
        jb_need_str(x, a0, "replace() argument 1");
        jb_need_str(x, a1, "replace() argument 2");
        return jb_str_replace(x, s, a0, a1, jb_int_arg(x, jarg(a, 2, "count"), -1));
    }
    if (!strcmp(m, "upper")) return jb_str_case(x, s, 1);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return jb_str_case(x, s, 0);
    if (!strcmp(m, "title")) return jb_str_case(x, s, 2);
    if (!strcmp(m, "capitalize")) return jb_str_case(x, s, 3);
    if (!strcmp(m, "swapcase")) {
        jbuf b = {.arena = &x->arena};
        size_t i = 0;
        while (i < s->u.str.n) {
            uint32_t c = ju_decode(s->u.str.s, s->u.str.n, &i);
            if (cp_upper(c) != c) put_upper(&b, c);
            else ju_encode(&b, cp_lower(c));
        }
        return jv_buf(x, &b);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        if (!a0)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: %s() takes at least 1 argument (0 given)", m);
        jb_need_str(x, a0, "substring");
        const char *p = s->u.str.s;
        size_t n = s->u.str.n;
        if (!strcmp(m, "count")) {
            int64_t k = 0;
            if (a0->u.str.n == 0) return jv_int(x, (int64_t)ju_len(p, n) + 1);
            for (const char *f = p;
                 (f = jb_memfind(f, n - (size_t)(f - p), a0->u.str.s, a0->u.str.n));
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
        } else found = jb_memfind(p, n, a0->u.str.s, a0->u.str.n);
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
        return jv_buf(x, &b);
    }
    if (!strcmp(m, "splitlines")) {
        jv *r = jv_list(x, JL_LIST);
        const char *p = s->u.str.s;
        size_t n = s->u.str.n, st = 0, i = 0;
        while (i < n) {
            if (p[i] == '\n' || p[i] == '\r') {
                jv_list_push(x, r, jv_str_nocopy(x, p + st, i - st));
                if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') i++;
                st = ++i;
            } else i++;
        }
        if (st < n) jv_list_push(x, r, jv_str_nocopy(x, p + st, n - st));
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
        return jv_buf(x, &b);
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

jv *jb_dict_items(jx *x, jv *d) {
    jargs none = {0};
    return m_dict(x, bind(x, m_dict, d, "items")->u.fn.self, &none);
}

jv *jb_str_splitlines(jx *x, jv *s) {
    jargs none = {0};
    return m_str(x, bind(x, m_str, s, "splitlines")->u.fn.self, &none);
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
    return jv_buf(x, &b);
}
