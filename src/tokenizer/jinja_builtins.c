/* jinja_builtins: the globals templates call (range, namespace, dict,
 * raise_exception, strftime_now, joiner) and the argument helpers every
 * builtin uses. The builtins are split by what they apply to: jinja_filters.c
 * holds jinja2's filters and tests, jinja_methods.c the Python str/dict/list
 * methods and Python's % formatting. Each behaves as its jinja2 3.1 / Python 3
 * counterpart on the values chat templates pass, failing where that one fails. */
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

bool jb_opt_bool(jargs *a, int pos, const char *kw, bool def) {
    jv *v = jarg(a, pos, kw);
    return v ? jv_truthy(v) : def;
}
jv *jb_need_str(jx *x, jv *v, const char *what) {
    if (v->type == JV_UNDEF) jx_undef_fail(x, v);
    if (v->type != JV_STR)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: %s must be str, not %s", what, jv_type_name(v));
    return v;
}

/* ---------------- globals ---------------- */
static jv *g_range(jx *x, jv *self, jargs *a) {
    int64_t start = 0, stop, step = 1;
    if (a->npos == 0)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: range expected at least 1 argument, got 0");
    if (a->npos == 1) stop = jb_int_arg(x, a->pos[0], 0);
    else {
        start = jb_int_arg(x, a->pos[0], 0);
        stop = jb_int_arg(x, a->pos[1], 0);
        if (a->npos > 2) step = jb_int_arg(x, a->pos[2], 1);
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
        return jv_str_nocopy(x, "", 0);
    }
    return self->u.list.items[0];
}
static jv *g_joiner(jx *x, jv *self, jargs *a) {
    jv *st = jv_list(x, JL_LIST);
    jv *sep = jarg(a, 0, "sep");
    jv_list_push(x, st, sep ? sep : jv_str_nocopy(x, ", ", 2));
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
