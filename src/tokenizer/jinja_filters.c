/* jinja_filters: jinja2's tests (`x is defined`) and filters (`x | trim`),
 * each as its jinja2 3.1 counterpart on the values chat templates pass,
 * failing where that one fails, in the order jinja2's documentation lists
 * them; transformers' tojson replaces jinja2's (json.dumps, ensure_ascii=False,
 * no sorting). The string work they share with the str methods (strip, case,
 * replace) is in jinja_methods.c. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

/* ---------------- tests ---------------- */
static const char *const TESTS[] = {
    "defined",     "undefined", "none",    "string", "mapping", "iterable",    "sequence", "number",
    "integer",     "float",     "boolean", "true",   "false",   "callable",    "odd",      "even",
    "divisibleby", "eq",        "equalto", "==",     "ne",      "!=",          "lt",       "<",
    "lessthan",    "le",        "<=",      "gt",     ">",       "greaterthan", "ge",       ">=",
    "in",          "lower",     "upper",   "sameas", "escaped", "filter",      "test",     NULL};

bool jb_test_exists(const char *name) { return jb_in_list(TESTS, name); }

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
        jv *c = jb_str_case(x, s, name[0] == 'u');
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
        int64_t d = jb_int_arg(x, a0, 1);
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
            return jb_memfind(a0->u.str.s, a0->u.str.n, v->u.str.s, v->u.str.n) != NULL;
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
        else key = jv_str_nocopy(x, p, (size_t)(dot - p));
        v = jx_getitem(x, v, key);
        p = dot + 1;
    }
    return v;
}

static jv *lower_key(jx *x, jv *v, bool case_sensitive) {
    if (!case_sensitive && v->type == JV_STR) return jb_str_case(x, v, 0);
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
            jv *tname = jb_need_str(x, tn, "test name");
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
static bool filter_exists(const char *name) { return jb_in_list(FILTERS, name); }

jv *jb_filter(jx *x, const char *name, jv *v, jargs *a) {
    jv *a0 = jarg(a, 0, NULL);
    if (x->track) { /* llama.cpp's: its input read; tojson and string read all of it */
        jx_mark_used(x, v, !strcmp(name, "tojson") || !strcmp(name, "string"));
        if (!strcmp(name, "selectattr")) v->ops |= JV_OP_SELECTATTR;
    }
    if (!strcmp(name, "tojson")) {
        /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        bool ea = jb_opt_bool(a, 0, "ensure_ascii", false);
        jv *ind = jarg(a, 1, "indent"), *sep = jarg(a, 2, "separators");
        bool sk = jb_opt_bool(a, 3, "sort_keys", false);
        const char *indent = NULL;
        char spaces[64];
        if (ind && ind->type != JV_NONE) {
            if (ind->type == JV_STR) indent = ja_strndup(&x->arena, ind->u.str.s, ind->u.str.n);
            else {
                int64_t k = jb_int_arg(x, ind, 0);
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
        return jv_buf(x, &b);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) return jv_int(x, py_len(x, v));
    if (!strcmp(name, "trim"))
        return jb_str_strip(x, jv_stringify(x, v), jarg(a, 0, "chars"), true, true);
    if (!strcmp(name, "string")) {
        jv *s = jv_stringify(x, v);
        return s;
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv *def = jarg(a, 0, "default_value");
        bool boolean = jb_opt_bool(a, 1, "boolean", false);
        if (v->type == JV_UNDEF || (boolean && !jv_truthy(v)))
            return def ? def : jv_str_nocopy(x, "", 0);
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
        return jv_buf(x, &b);
    }
    if (!strcmp(name, "safe")) {
        jv *s = jv_stringify(x, v);
        jv *r = jv_str_nocopy(x, s->u.str.s, s->u.str.n);
        r->markup = 1;
        return r;
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) {
        if (v->type == JV_STR && v->markup && name[0] != 'f') return v;
        jv *plain = jv_str_nocopy(x, "", 0), *mk = jv_str_nocopy(x, "", 0);
        mk->markup = 1;
        (void)plain;
        return jx_binop(x, OP_ADD, mk, jv_stringify(x, v));
    }
    if (!strcmp(name, "items")) {
        if (v->type == JV_UNDEF) return jv_list(x, JL_GEN);
        if (v->type != JV_DICT || v->sub != JD_DICT)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: Can only get item pairs from a mapping.");
        jv *r = jb_dict_items(x, v);
        r->sub = JL_GEN;
        r->view = JVIEW_NONE;
        return r;
    }
    if (!strcmp(name, "upper")) return jb_str_case(x, jv_stringify(x, v), 1);
    if (!strcmp(name, "lower")) return jb_str_case(x, jv_stringify(x, v), 0);
    if (!strcmp(name, "title")) return jb_str_case(x, jv_stringify(x, v), 4);
    if (!strcmp(name, "capitalize")) return jb_str_case(x, jv_stringify(x, v), 3);
    if (!strcmp(name, "dictsort")) {
        bool cs = jb_opt_bool(a, 0, "case_sensitive", false);
        jv *by = jarg(a, 1, "by");
        bool rev = jb_opt_bool(a, 2, "reverse", false);
        if (v->type == JV_UNDEF) jx_undef_fail(x, v);
        if (v->type != JV_DICT || v->sub != JD_DICT)
            jx_fail(x, JINJA_ERR_RUNTIME, "AttributeError: '%s' object has no attribute 'items'",
                    jv_type_name(v));
        int pos = by && by->type == JV_STR && by->u.str.n == 5 && !memcmp(by->u.str.s, "value", 5)
                      ? 1
                      : 0;
        jv *items = jb_dict_items(x, v);
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
        bool first = jb_opt_bool(a, 1, "first", false), blank = jb_opt_bool(a, 2, "blank", false);
        jv *ind;
        if (w && w->type == JV_STR) ind = w;
        else {
            int64_t k = jb_int_arg(x, w, 4);
            char *sp = ja_alloc(&x->arena, (size_t)(k > 0 ? k : 0) + 1);
            for (int64_t i = 0; i < k; i++) sp[i] = ' ';
            ind = jv_str_nocopy(x, sp, (size_t)(k > 0 ? k : 0));
        }
        /* s += "\n"; lines = s.splitlines() */
        jbuf src = {.arena = &x->arena};
        jb_put(&src, v->u.str.s, v->u.str.n);
        jb_putc(&src, '\n');
        jv *lines = jb_str_splitlines(x, jv_buf(x, &src));
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
        return jv_buf(x, &b);
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
        jv *fname = jb_need_str(x, a0, "filter name");
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
        bool rev = is_sort ? jb_opt_bool(a, 0, "reverse", false) : false;
        bool cs = jb_opt_bool(a, is_sort ? 1 : 0, "case_sensitive", false);
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
            return jv_buf(x, &b);
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
        return jb_str_replace(x, s, jv_stringify(x, o), jv_stringify(x, nw),
                              jb_int_arg(x, jarg(a, 2, "count"), -1));
    }
    if (!strcmp(name, "round")) {
        int64_t prec = jb_int_arg(x, jarg(a, 0, "precision"), 0);
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
        jv *n = jb_need_str(x, a0 ? a0 : jv_none(), "attribute name");
        return jx_getattr(x, v, ja_strndup(&x->arena, n->u.str.s, n->u.str.n));
    }
    if (!strcmp(name, "center")) {
        jv *s = jv_stringify(x, v);
        int64_t w = jb_int_arg(x, jarg(a, 0, "width"), 80),
                len = (int64_t)ju_len(s->u.str.s, s->u.str.n);
        if (w <= len) return s;
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        jbuf b = {.arena = &x->arena};
        for (int64_t i = 0; i < left; i++) jb_putc(&b, ' ');
        jb_put(&b, s->u.str.s, s->u.str.n);
        for (int64_t i = 0; i < pad - left; i++) jb_putc(&b, ' ');
        return jv_buf(x, &b);
    }
    if (!strcmp(name, "wordcount")) { /* len(re.findall(r"\w+", s)) */
        jv *str = jv_stringify(x, v);
        int64_t k = 0;
        bool in_word = false;
        size_t i = 0;
        while (i < str->u.str.n) {
            uint32_t c = ju_decode(str->u.str.s, str->u.str.n, &i);
            bool w = c == '_' || (c < 0x80 ? isalnum((int)c) != 0
                                           : (jb_cp_cased(c) || (c >= 0x3040 && c <= 0x9FFF) ||
                                              (c >= 0xAC00 && c <= 0xD7AF)));
            if (w && !in_word) k++;
            in_word = w;
        }
        return jv_int(x, k);
    }
    if (!strcmp(name, "batch") || !strcmp(name, "slice")) {
        int64_t k = jb_int_arg(x, a0, 1);
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
        return jv_buf(x, &b);
    }
    if (!strcmp(name, "format")) return jb_percent_format(x, jv_stringify(x, v), a->pos, a->npos);
    if (!strcmp(name, "truncate")) {
        jv *s = jv_stringify(x, v);
        int64_t len = jb_int_arg(x, jarg(a, 0, "length"), 255);
        if ((int64_t)ju_len(s->u.str.s, s->u.str.n) <= len + 5) return s;
        size_t off = ju_offset(s->u.str.s, s->u.str.n, (size_t)(len - 3 > 0 ? len - 3 : 0));
        jbuf b = {.arena = &x->arena};
        jb_put(&b, s->u.str.s, off);
        jb_puts(&b, "...");
        return jv_buf(x, &b);
    }
    if (!strcmp(name, "striptags")) return jv_stringify(x, v);
    jx_fail(x, JINJA_ERR_RUNTIME, "TemplateRuntimeError: No filter named '%s' found.", name);
}
