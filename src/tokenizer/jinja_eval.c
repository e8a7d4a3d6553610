/* jinja_eval: renders a syntax tree. Scoping follows jinja2: a for loop and a
 * macro body open a scope (their sets do not leak out; a namespace() carries
 * values across), if blocks do not. Names resolve through the scopes, then the
 * render variables, then the globals (range, namespace, raise_exception, ...).
 * Attribute lookup is jinja2's sandboxed getattr: obj.name tries the Python
 * attribute (a str/dict/list method) before the item, obj[k] the item first;
 * a missing one is Undefined.
 *
 * Over 800 lines on purpose: one evaluator switch per node kind (statements,
 * expressions, calls, loops, macros), each short, sharing the scope helpers at
 * the top; split across files they would need those helpers exported. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

#define JX_MAX_DEPTH 256

_Noreturn void jx_fail(jx *x, jinja_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, x->err_cap, fmt, ap);
    va_end(ap);
    x->status = st;
    longjmp(x->jmp, 1);
}

void jx_step(jx *x) {
    if (++x->steps > JX_MAX_STEPS)
        jx_fail(x, JINJA_ERR_RUNTIME, "RuntimeError: the template ran more than %llu loop steps",
                JX_MAX_STEPS);
    if (x->out && x->out->n > JX_MAX_OUTPUT)
        jx_fail(x, JINJA_ERR_RUNTIME, "RuntimeError: the template wrote more than %zu MiB",
                JX_MAX_OUTPUT >> 20);
}

_Noreturn void jx_undef_fail(jx *x, const jv *u) {
    if (u->sub == JU_SECURITY) jx_fail(x, JINJA_ERR_RUNTIME, "SecurityError: %s", u->u.undef.what);
    jx_fail(x, JINJA_ERR_RUNTIME, "UndefinedError: %s", u->u.undef.what);
}

/* ---------------- scopes ---------------- */
static jscope *scope_new(jx *x, jscope *parent) {
    jscope *s = ja_alloc(&x->arena, sizeof *s);
    s->parent = parent;
    return s;
}

static jv **scope_find(jscope *s, const char *name) {
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (strcmp(s->names[i], name) == 0) return &s->vals[i];
    return NULL;
}

static void scope_set(jx *x, jscope *s, const char *name, jv *v) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **nn = ja_alloc(&x->arena, (size_t)cap * sizeof *nn);
        jv **nv = ja_alloc(&x->arena, (size_t)cap * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof *nn);
            memcpy(nv, s->vals, (size_t)s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

/* ---------------- attribute and item access ---------------- */
static const char *obj_desc(jx *x, const jv *obj) {
    if (obj->type == JV_NONE) return "None";
    jbuf b = {.arena = &x->arena};
    jb_printf(&b, "%s object",
              obj->type == JV_DICT && obj->sub == JD_NS ? "Namespace" : jv_type_name(obj));
    return b.p;
}

static jv *loop_cycle(jx *x, jv *self, jargs *a) {
    if (a->npos == 0) jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: no items for cycling given");
    return a->pos[self->u.loop.i % (size_t)a->npos];
}

static jv *loop_attr(jx *x, jv *l, const char *name) {
    size_t i = l->u.loop.i, n = l->u.loop.n;
    if (!strcmp(name, "index")) return jv_int(x, (int64_t)i + 1);
    if (!strcmp(name, "index0")) return jv_int(x, (int64_t)i);
    if (!strcmp(name, "revindex")) return jv_int(x, (int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return jv_int(x, (int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
    if (!strcmp(name, "length")) return jv_int(x, (int64_t)n);
    if (!strcmp(name, "depth")) return jv_int(x, 1);
    if (!strcmp(name, "depth0")) return jv_int(x, 0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? l->u.loop.items[i - 1] : jv_undef(x, "there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->u.loop.items[i + 1] : jv_undef(x, "there is no next item");
    if (!strcmp(name, "cycle")) return jv_func(x, loop_cycle, l, "cycle");
    return jv_undef(x, "'LoopContext object' has no attribute '%s'", name);
}

jv *jx_getattr(jx *x, jv *obj, const char *name) {
    if (obj->type == JV_UNDEF) jx_undef_fail(x, obj);
    if (obj->type == JV_LOOP) return loop_attr(x, obj, name);
    if (obj->type == JV_DICT && obj->sub != JD_DICT) {
        jv *v = jv_dict_get(obj, name, strlen(name));
        if (v) return v;
        return jv_undef(x, "'%s' has no attribute '%s'", obj_desc(x, obj), name);
    }
    jv *m = jb_method(x, obj, name);
    if (m) return m;
    if (obj->type == JV_DICT) {
        jv *v = jv_dict_get(obj, name, strlen(name));
        if (v) return v;
    }
    return jv_undef(x, "'%s' has no attribute '%s'", obj_desc(x, obj), name);
}

static bool index_of(jx *x, jv *key, size_t n, size_t *out) {
    if (key->type != JV_INT && key->type != JV_BOOL) return false;
    int64_t i = key->type == JV_INT ? key->u.i : key->u.b;
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

static void not_subscriptable(jx *x, jv *obj) {
    if (obj->type == JV_LIST && (obj->sub == JL_GEN || obj->view))
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: '%s' object is not subscriptable",
                jv_type_name(obj));
}

jv *jx_getitem(jx *x, jv *obj, jv *key) {
    if (obj->type == JV_UNDEF) jx_undef_fail(x, obj);
    if (key->type != JV_STR) not_subscriptable(x, obj);
    if (obj->type == JV_LOOP && key->type == JV_STR)
        return loop_attr(x, obj, ja_strndup(&x->arena, key->u.str.s, key->u.str.n));
    size_t k;
    if (obj->type == JV_DICT && key->type == JV_STR) {
        jv *v = jv_dict_get(obj, key->u.str.s, key->u.str.n);
        if (v) return v;
    } else if (obj->type == JV_DICT && obj->sub == JD_DICT) {
        for (size_t i = 0; i < obj->u.dict.n; i++)
            if (jv_equal(obj->u.dict.kv[i].key, key)) return obj->u.dict.kv[i].val;
    } else if (obj->type == JV_LIST && obj->sub != JL_GEN) {
        if (index_of(x, key, obj->u.list.n, &k)) return obj->u.list.items[k];
    } else if (obj->type == JV_STR) {
        size_t cps = ju_len(obj->u.str.s, obj->u.str.n);
        if (index_of(x, key, cps, &k)) {
            size_t st = ju_offset(obj->u.str.s, obj->u.str.n, k), e = st;
            ju_decode(obj->u.str.s, obj->u.str.n, &e);
            return jv_str_nocopy(x, obj->u.str.s + st, e - st);
        }
    }
    if (key->type == JV_STR) {
        char *nm = ja_strndup(&x->arena, key->u.str.s, key->u.str.n);
        if (obj->type != JV_DICT || obj->sub != JD_DICT) {
            jv *m = jb_method(x, obj, nm);
            if (m) return m;
        }
        return jv_undef(x, "'%s' has no attribute '%s'", obj_desc(x, obj), nm);
    }
    jbuf b = {.arena = &x->arena};
    jv_repr(x, &b, key);
    return jv_undef(x, "'%s' has no attribute %s", obj_desc(x, obj), b.p ? b.p : "");
}

static int64_t slice_bound(jv *v, int64_t n, int64_t step, bool start, jx *x) {
    if (!v || v->type == JV_NONE) return step > 0 ? (start ? 0 : n) : (start ? n - 1 : -1);
    if (v->type != JV_INT && v->type != JV_BOOL)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: slice indices must be integers or None");
    int64_t i = v->type == JV_INT ? v->u.i : v->u.b;
    if (i < 0) {
        i += n;
        if (i < 0) i = step > 0 ? 0 : -1;
    } else if (i >= n) i = step > 0 ? n : n - 1;
    return i;
}

static jv *do_slice(jx *x, jv *obj, jv *a, jv *b, jv *c) {
    if (obj->type == JV_UNDEF) jx_undef_fail(x, obj);
    not_subscriptable(x, obj);
    int64_t step = 1;
    if (c && c->type != JV_NONE) {
        if (c->type != JV_INT)
            jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: slice indices must be integers or None");
        step = c->u.i;
        if (step == 0) jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: slice step cannot be zero");
    }
    if (obj->type == JV_LIST && obj->sub != JL_GEN) {
        int64_t n = (int64_t)obj->u.list.n;
        int64_t s = slice_bound(a, n, step, true, x), e = slice_bound(b, n, step, false, x);
        jv *r = jv_list(x, obj->sub);
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step)
            jv_list_push(x, r, obj->u.list.items[i]);
        return r;
    }
    if (obj->type == JV_STR) {
        const char *str = obj->u.str.s;
        size_t sn = obj->u.str.n;
        int64_t n = (int64_t)ju_len(str, sn);
        int64_t s = slice_bound(a, n, step, true, x), e = slice_bound(b, n, step, false, x);
        if (step == 1) {
            if (e <= s) return jv_str_nocopy(x, "", 0);
            size_t bs = ju_offset(str, sn, (size_t)s);
            size_t be = bs + ju_offset(str + bs, sn - bs, (size_t)(e - s));
            jv *r = jv_str_nocopy(x, str + bs, be - bs);
            return r;
        }
        jbuf out = {.arena = &x->arena};
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step) {
            size_t o = ju_offset(str, sn, (size_t)i), q = o;
            ju_decode(str, sn, &q);
            jb_put(&out, str + o, q - o);
        }
        return jv_str_nocopy(x, out.p ? out.p : "", out.n);
    }
    return jv_undef(x, "'%s' has no attribute 'slice'", obj_desc(x, obj));
}

jv **jx_iter(jx *x, jv *v, size_t *n) {
    switch (v->type) {
    case JV_UNDEF: *n = 0; return NULL;
    case JV_LIST: *n = v->u.list.n; return v->u.list.items;
    case JV_DICT: {
        if (v->sub != JD_DICT) break;
        jv **r = ja_alloc(&x->arena, (v->u.dict.n + 1) * sizeof *r);
        for (size_t i = 0; i < v->u.dict.n; i++) r[i] = v->u.dict.kv[i].key;
        *n = v->u.dict.n;
        return r;
    }
    case JV_STR: {
        size_t cps = ju_len(v->u.str.s, v->u.str.n), i = 0, k = 0;
        jv **r = ja_alloc(&x->arena, (cps + 1) * sizeof *r);
        while (i < v->u.str.n) {
            size_t st = i;
            ju_decode(v->u.str.s, v->u.str.n, &i);
            r[k++] = jv_str_nocopy(x, v->u.str.s + st, i - st);
        }
        *n = k;
        return r;
    }
    default: break;
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: '%s' object is not iterable", jv_type_name(v));
}

/* ---------------- operators ---------------- */
static bool is_num(const jv *v) {
    return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL;
}
static double num_f(const jv *v) {
    return v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const jv *v) { return v->type == JV_INT ? v->u.i : (int64_t)v->u.b; }

static const char *OPSYM[] = {
    [OP_ADD] = "+",       [OP_SUB] = "-", [OP_MUL] = "*",          [OP_DIV] = "/",
    [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "** or pow()"};

static jv *markup_escape(jx *x, jv *s) {
    jbuf b = {.arena = &x->arena};
    jv *str = jv_stringify(x, s);
    for (size_t i = 0; i < str->u.str.n; i++) {
        char c = str->u.str.s[i];
        switch (c) {
        case '&': jb_puts(&b, "&amp;"); break;
        case '<': jb_puts(&b, "&lt;"); break;
        case '>': jb_puts(&b, "&gt;"); break;
        case '"': jb_puts(&b, "&#34;"); break;
        case '\'': jb_puts(&b, "&#39;"); break;
        default: jb_putc(&b, c);
        }
    }
    return jv_str_nocopy(x, b.p ? b.p : "", b.n);
}

/* A string made by concatenation sits after this header in a buffer with
 * room to spare; a + b extends a's buffer in place when a ends where the
 * buffer's text ends (no other string was made from it), so building a prompt
 * with ns.text = ns.text + piece in a loop costs linear memory, as in Python. */
typedef struct jstr_hdr {
    size_t cap, used;
} jstr_hdr;

static jv *str_concat(jx *x, const jv *a, const char *b, size_t bn) {
    size_t an = a->u.str.n;
    if (a->grow) {
        jstr_hdr *h = (jstr_hdr *)(void *)a->u.str.s - 1;
        if (h->used == an && h->cap - an >= bn) {
            memcpy((char *)a->u.str.s + an, b, bn);
            h->used += bn;
            jv *r = jv_str_nocopy(x, a->u.str.s, an + bn);
            r->grow = 1;
            return r;
        }
    }
    size_t cap = 2 * (an + bn) + 32;
    jstr_hdr *h = ja_alloc(&x->arena, sizeof *h + cap);
    char *p = (char *)(h + 1);
    memcpy(p, a->u.str.s, an);
    memcpy(p + an, b, bn);
    h->cap = cap;
    h->used = an + bn;
    jv *r = jv_str_nocopy(x, p, an + bn);
    r->grow = 1;
    return r;
}

jv *jx_binop(jx *x, int op, jv *a, jv *b) {
    if (op == OP_CONCAT) {
        jv *sa = jv_stringify(x, a), *sb = jv_stringify(x, b);
        return str_concat(x, sa, sb->u.str.s, sb->u.str.n);
    }
    if (a->type == JV_UNDEF) jx_undef_fail(x, a);
    if (b->type == JV_UNDEF) jx_undef_fail(x, b);
    if (is_num(a) && is_num(b)) {
        bool fl = a->type == JV_FLOAT || b->type == JV_FLOAT;
        if (op == OP_DIV) {
            if (num_f(b) == 0) jx_fail(x, JINJA_ERR_RUNTIME, "ZeroDivisionError: division by zero");
            return jv_float(x, num_f(a) / num_f(b));
        }
        if (fl) {
            double p = num_f(a), q = num_f(b);
            switch (op) {
            case OP_ADD: return jv_float(x, p + q);
            case OP_SUB: return jv_float(x, p - q);
            case OP_MUL: return jv_float(x, p * q);
            case OP_POW: return jv_float(x, pow(p, q));
            case OP_FLOORDIV:
            case OP_MOD: {
                if (q == 0) jx_fail(x, JINJA_ERR_RUNTIME, "ZeroDivisionError: float modulo");
                double m = fmod(p, q);
                if (m != 0 && ((m < 0) != (q < 0))) m += q;
                return jv_float(x, op == OP_MOD ? m : floor(p / q));
            }
            }
        } else {
            int64_t p = num_i(a), q = num_i(b);
            switch (op) {
            case OP_ADD: return jv_int(x, (int64_t)((uint64_t)p + (uint64_t)q));
            case OP_SUB: return jv_int(x, (int64_t)((uint64_t)p - (uint64_t)q));
            case OP_MUL: return jv_int(x, (int64_t)((uint64_t)p * (uint64_t)q));
            case OP_POW: {
                if (q < 0) return jv_float(x, pow((double)p, (double)q));
                int64_t r = 1, base = p;
                for (int64_t e = q; e > 0; e >>= 1) { /* wraps where Python would grow a big int */
                    if (e & 1) r = (int64_t)((uint64_t)r * (uint64_t)base);
                    base = (int64_t)((uint64_t)base * (uint64_t)base);
                }
                return jv_int(x, r);
            }
            case OP_FLOORDIV:
            case OP_MOD: {
                if (q == 0)
                    jx_fail(x, JINJA_ERR_RUNTIME,
                            "ZeroDivisionError: integer division or modulo by zero");
                int64_t d = p / q, m = p % q;
                if (m != 0 && ((m < 0) != (q < 0))) {
                    m += q;
                    d -= 1;
                }
                return jv_int(x, op == OP_MOD ? m : d);
            }
            }
        }
    }
    if (op == OP_MOD && a->type == JV_STR) { /* "%s" % x, "%s %s" % (x, y) */
        if (b->type == JV_LIST && b->sub == JL_TUPLE)
            return jb_percent_format(x, a, b->u.list.items, (int)b->u.list.n);
        return jb_percent_format(x, a, &b, 1);
    }
    if (op == OP_ADD && a->type == JV_STR && b->type == JV_STR) {
        if (a->markup != b->markup) { /* Markup + str escapes the str (markupsafe) */
            if (a->markup) b = markup_escape(x, b);
            else a = markup_escape(x, a);
        }
        jv *r = str_concat(x, a, b->u.str.s, b->u.str.n);
        r->markup = a->markup || b->markup;
        return r;
    }
    if (op == OP_ADD && a->type == JV_LIST && b->type == JV_LIST && a->sub != JL_GEN &&
        b->sub != JL_GEN && !a->view && !b->view && (a->sub == JL_TUPLE) == (b->sub == JL_TUPLE)) {
        jv *r = jv_list(x, a->sub);
        for (size_t i = 0; i < a->u.list.n; i++) jv_list_push(x, r, a->u.list.items[i]);
        for (size_t i = 0; i < b->u.list.n; i++) jv_list_push(x, r, b->u.list.items[i]);
        return r;
    }
    if (op == OP_MUL &&
        ((a->type == JV_STR || a->type == JV_LIST) && (b->type == JV_INT || b->type == JV_BOOL))) {
        int64_t k = num_i(b);
        size_t unit = a->type == JV_STR ? a->u.str.n : a->u.list.n * sizeof(jv *);
        if (k > 0 && unit && (uint64_t)k > JX_MAX_OUTPUT / unit)
            jx_fail(x, JINJA_ERR_RUNTIME, "MemoryError: repetition of %zu bytes %lld times", unit,
                    (long long)k);
        if (a->type == JV_STR) {
            jbuf buf = {.arena = &x->arena};
            for (int64_t i = 0; i < k; i++) jb_put(&buf, a->u.str.s, a->u.str.n);
            return jv_str_nocopy(x, buf.p ? buf.p : "", buf.n);
        }
        jv *r = jv_list(x, a->sub);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < a->u.list.n; j++) jv_list_push(x, r, a->u.list.items[j]);
        return r;
    }
    if (op == OP_MUL && (b->type == JV_STR || b->type == JV_LIST) &&
        (a->type == JV_INT || a->type == JV_BOOL))
        return jx_binop(x, op, b, a);
    if (op == OP_ADD && a->type == JV_STR)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: can only concatenate str (not \"%s\") to str",
                jv_type_name(b));
    if (op == OP_ADD && a->type == JV_LIST && a->sub == JL_LIST)
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: can only concatenate list (not \"%s\") to list",
                jv_type_name(b));
    jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'",
            OPSYM[op], jv_type_name(a), jv_type_name(b));
}

static bool contains(jx *x, jv *hay, jv *needle) {
    switch (hay->type) {
    case JV_UNDEF: return false;
    case JV_STR:
        if (needle->type != JV_STR)
            jx_fail(x, JINJA_ERR_RUNTIME,
                    "TypeError: 'in <string>' requires string as left operand, not %s",
                    jv_type_name(needle));
        if (needle->u.str.n == 0) return true;
        if (needle->u.str.n > hay->u.str.n) return false;
        for (size_t i = 0; i + needle->u.str.n <= hay->u.str.n; i++)
            if (memcmp(hay->u.str.s + i, needle->u.str.s, needle->u.str.n) == 0) return true;
        return false;
    case JV_LIST:
        for (size_t i = 0; i < hay->u.list.n; i++)
            if (jv_equal(hay->u.list.items[i], needle)) return true;
        return false;
    case JV_DICT:
        for (size_t i = 0; i < hay->u.dict.n; i++)
            if (jv_equal(hay->u.dict.kv[i].key, needle)) return true;
        return false;
    default:
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: argument of type '%s' is not iterable",
                jv_type_name(hay));
    }
}

/* ---------------- evaluation ---------------- */
static jv *eval(jx *x, jscope *sc, const jnode *n);
static int exec_body(jx *x, jscope *sc, jnode *const *body, int nbody);

/* Positional and keyword arguments of a call node; *xs and **kw expand. */
static void eval_args(jx *x, jscope *sc, const jnode *n, jargs *a) {
    jv *pos = jv_list(x, JL_LIST), *kwn = jv_list(x, JL_LIST), *kwv = jv_list(x, JL_LIST);
    for (int i = 0; i < n->n1; i++) {
        jv *v = eval(x, sc, n->v1[i]);
        const char *name = n->names[i];
        if (!name) jv_list_push(x, pos, v);
        else if (!strcmp(name, "*")) {
            size_t k;
            jv **it = jx_iter(x, v, &k);
            for (size_t j = 0; j < k; j++) jv_list_push(x, pos, it[j]);
        } else if (!strcmp(name, "**")) {
            if (v->type != JV_DICT || v->sub != JD_DICT)
                jx_fail(x, JINJA_ERR_RUNTIME,
                        "TypeError: argument after ** must be a mapping, not %s", jv_type_name(v));
            for (size_t j = 0; j < v->u.dict.n; j++) {
                jv_list_push(x, kwn, jv_stringify(x, v->u.dict.kv[j].key));
                jv_list_push(x, kwv, v->u.dict.kv[j].val);
            }
        } else {
            jv_list_push(x, kwn, jv_cstr(x, name));
            jv_list_push(x, kwv, v);
        }
    }
    a->pos = pos->u.list.items;
    a->npos = (int)pos->u.list.n;
    a->nkw = (int)kwn->u.list.n;
    a->kwname = ja_alloc(&x->arena, (size_t)(a->nkw + 1) * sizeof(char *));
    a->kwval = kwv->u.list.items;
    for (int i = 0; i < a->nkw; i++) {
        jv *k = kwn->u.list.items[i];
        a->kwname[i] = ja_strndup(&x->arena, k->u.str.s, k->u.str.n);
    }
}

static jv *capture(jx *x, jscope *sc, jnode *const *body, int nbody) {
    jbuf *saved = x->out;
    jbuf b = {.arena = &x->arena};
    x->out = &b;
    exec_body(x, sc, body, nbody);
    x->out = saved;
    return jv_str_nocopy(x, b.p ? b.p : "", b.n);
}

static jv *call_macro(jx *x, jv *m, jargs *a) {
    const jnode *def = m->u.mac.def;
    jx_step(x);
    if (++x->depth > JX_MAX_DEPTH)
        jx_fail(x, JINJA_ERR_RUNTIME, "RecursionError: maximum recursion depth exceeded");
    jscope *sc = scope_new(x, m->u.mac.closure);
    int np = def->nnames;
    jv *varargs = jv_list(x, JL_TUPLE), *kwargs = jv_dict(x, JD_DICT);
    jv **bound = ja_alloc(&x->arena, (size_t)(np + 1) * sizeof *bound);
    for (int i = 0; i < a->npos; i++) {
        if (i < np) bound[i] = a->pos[i];
        else jv_list_push(x, varargs, a->pos[i]);
    }
    for (int k = 0; k < a->nkw; k++) {
        int p = -1;
        for (int i = 0; i < np; i++)
            if (!strcmp(def->names[i], a->kwname[k])) p = i;
        if (p >= 0) {
            if (bound[p])
                jx_fail(x, JINJA_ERR_RUNTIME,
                        "TypeError: macro '%s' got multiple values for argument '%s'",
                        def->name ? def->name : "caller", a->kwname[k]);
            bound[p] = a->kwval[k];
        } else if (!strcmp(a->kwname[k], "caller")) scope_set(x, sc, "caller", a->kwval[k]);
        else jv_dict_set(x, kwargs, jv_cstr(x, a->kwname[k]), a->kwval[k]);
    }
    for (int i = 0; i < np; i++) {
        jv *v = bound[i];
        if (!v) {
            if (i < def->n2 && def->v2[i]) v = eval(x, sc, def->v2[i]);
            else v = jv_undef(x, "parameter '%s' was not provided", def->names[i]);
        }
        scope_set(x, sc, def->names[i], v);
    }
    scope_set(x, sc, "varargs", varargs);
    scope_set(x, sc, "kwargs", kwargs);
    jv *r = capture(x, sc, def->v1, def->n1);
    x->depth--;
    return r;
}

jv *jx_call(jx *x, jv *callee, jargs *a) {
    switch (callee->type) {
    case JV_UNDEF: jx_undef_fail(x, callee);
    case JV_MACRO: return call_macro(x, callee, a);
    case JV_FUNC: return callee->u.fn.fn(x, callee->u.fn.self, a);
    default:
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: '%s' object is not callable",
                jv_type_name(callee));
    }
}

static jv *eval_filter(jx *x, jscope *sc, const jnode *n) {
    jv *v = eval(x, sc, n->a);
    jargs a;
    eval_args(x, sc, n, &a);
    return jb_filter(x, n->name, v, &a);
}

/* A filter chain of a block set / filter block: the innermost filter has no
 * operand and takes input. */
static jv *eval_chain(jx *x, jscope *sc, const jnode *n, jv *input) {
    jv *v = n->a ? eval_chain(x, sc, n->a, input) : input;
    jargs a;
    eval_args(x, sc, n, &a);
    return jb_filter(x, n->name, v, &a);
}

static jv *eval(jx *x, jscope *sc, const jnode *n) {
    switch (n->kind) {
    case N_LIT: return n->lit;
    case N_NAME: {
        jv **p = scope_find(sc, n->name);
        if (p) return *p;
        jv *g = jb_global(x, n->name);
        if (g) return g;
        return jv_undef(x, "'%s' is undefined", n->name);
    }
    case N_LIST:
    case N_TUPLE: {
        jv *l = jv_list(x, n->kind == N_LIST ? JL_LIST : JL_TUPLE);
        for (int i = 0; i < n->n1; i++) jv_list_push(x, l, eval(x, sc, n->v1[i]));
        return l;
    }
    case N_DICT: {
        jv *d = jv_dict(x, JD_DICT);
        for (int i = 0; i < n->n1; i++) {
            jv *k = eval(x, sc, n->v1[i]);
            if (k->type != JV_STR && k->type != JV_INT && k->type != JV_NONE &&
                k->type != JV_BOOL && k->type != JV_FLOAT &&
                !(k->type == JV_LIST && k->sub == JL_TUPLE))
                jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: unhashable type: '%s'", jv_type_name(k));
            jv_dict_set(x, d, k, eval(x, sc, n->v2[i]));
        }
        return d;
    }
    case N_GETATTR: return jx_getattr(x, eval(x, sc, n->a), n->name);
    case N_GETITEM: {
        jv *obj = eval(x, sc, n->a);
        return jx_getitem(x, obj, eval(x, sc, n->b));
    }
    case N_SLICE: {
        jv *obj = eval(x, sc, n->a);
        return do_slice(x, obj, n->b ? eval(x, sc, n->b) : NULL, n->c ? eval(x, sc, n->c) : NULL,
                        n->d ? eval(x, sc, n->d) : NULL);
    }
    case N_CALL: {
        jv *f = eval(x, sc, n->a);
        jargs a;
        eval_args(x, sc, n, &a);
        return jx_call(x, f, &a);
    }
    case N_FILTER: return eval_filter(x, sc, n);
    case N_TEST: {
        jv *v = eval(x, sc, n->a);
        jargs a;
        eval_args(x, sc, n, &a);
        bool r = jb_test(x, n->name, v, &a);
        return jv_bool(n->op ? !r : r);
    }
    case N_BIN: {
        if (n->op == OP_AND) {
            jv *l = eval(x, sc, n->a);
            return jv_truthy(l) ? eval(x, sc, n->b) : l;
        }
        if (n->op == OP_OR) {
            jv *l = eval(x, sc, n->a);
            return jv_truthy(l) ? l : eval(x, sc, n->b);
        }
        jv *l = eval(x, sc, n->a), *r = eval(x, sc, n->b);
        switch (n->op) {
        case OP_EQ: return jv_bool(jv_equal(l, r));
        case OP_NE: return jv_bool(!jv_equal(l, r));
        case OP_LT: return jv_bool(jv_compare(x, l, r, "<") < 0);
        case OP_LE: return jv_bool(jv_compare(x, l, r, "<=") <= 0);
        case OP_GT: return jv_bool(jv_compare(x, l, r, ">") > 0);
        case OP_GE: return jv_bool(jv_compare(x, l, r, ">=") >= 0);
        case OP_IN: return jv_bool(contains(x, r, l));
        case OP_NOTIN: return jv_bool(!contains(x, r, l));
        default: return jx_binop(x, n->op, l, r);
        }
    }
    case N_UNARY: {
        jv *v = eval(x, sc, n->a);
        if (n->op == OP_NOT) return jv_bool(!jv_truthy(v));
        if (v->type == JV_UNDEF) jx_undef_fail(x, v);
        if (v->type == JV_FLOAT) return jv_float(x, n->op == OP_NEG ? -v->u.f : v->u.f);
        if (v->type == JV_INT || v->type == JV_BOOL)
            return jv_int(x, n->op == OP_NEG ? -num_i(v) : num_i(v));
        jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: bad operand type for unary %s: '%s'",
                n->op == OP_NEG ? "-" : "+", jv_type_name(v));
    }
    case N_COND: {
        if (jv_truthy(eval(x, sc, n->b))) return eval(x, sc, n->a);
        if (n->c) return eval(x, sc, n->c);
        return jv_undef(x,
                        "the inline if-expression on line %d evaluated to false and no else "
                        "section was defined.",
                        n->line);
    }
    default: jx_fail(x, JINJA_ERR_RUNTIME, "internal error: statement evaluated as an expression");
    }
}

/* ---------------- statements ---------------- */
static void assign_targets(jx *x, jscope *sc, const jnode *n, jv *v) {
    if (n->nnames == 1) {
        scope_set(x, sc, n->names[0], v);
        return;
    }
    size_t k;
    jv **items = jx_iter(x, v, &k);
    if (k != (size_t)n->nnames)
        jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: %s values to unpack (expected %d, got %zu)",
                k > (size_t)n->nnames ? "too many" : "not enough", n->nnames, k);
    for (int i = 0; i < n->nnames; i++) scope_set(x, sc, n->names[i], items[i]);
}

static int exec_for(jx *x, jscope *sc, const jnode *n) {
    jv *seq = eval(x, sc, n->a);
    size_t cnt;
    jv **items = jx_iter(x, seq, &cnt);
    jscope *ls = scope_new(x, sc);
    if (n->b) { /* for ... if cond: filter before counting */
        jv **kept = ja_alloc(&x->arena, (cnt + 1) * sizeof *kept);
        size_t k = 0;
        for (size_t i = 0; i < cnt; i++) {
            jx_step(x);
            assign_targets(x, ls, n, items[i]);
            if (jv_truthy(eval(x, ls, n->b))) kept[k++] = items[i];
        }
        items = kept;
        cnt = k;
    }
    jv *loop = ja_alloc(&x->arena, sizeof *loop);
    loop->type = JV_LOOP;
    loop->u.loop.items = items;
    loop->u.loop.n = cnt;
    for (size_t i = 0; i < cnt; i++) {
        jx_step(x);
        ls->n = 0; /* each iteration starts from the enclosing values, as in jinja2 */
        loop->u.loop.i = i;
        scope_set(x, ls, "loop", loop);
        assign_targets(x, ls, n, items[i]);
        int r = exec_body(x, ls, n->v1, n->n1);
        if (r == 1) break;
    }
    if (cnt == 0 && n->n2) return exec_body(x, sc, n->v2, n->n2);
    return 0;
}

static int exec_stmt(jx *x, jscope *sc, const jnode *n) {
    switch (n->kind) {
    case S_TEXT: jb_put(x->out, n->lit->u.str.s, n->lit->u.str.n); return 0;
    case S_OUT: jv_to_str(x, x->out, eval(x, sc, n->a)); return 0;
    case S_IF:
        if (jv_truthy(eval(x, sc, n->a))) return exec_body(x, sc, n->v1, n->n1);
        return exec_body(x, sc, n->v2, n->n2);
    case S_FOR: return exec_for(x, sc, n);
    case S_SET: {
        jv *v;
        if (n->op == 1) {
            v = capture(x, sc, n->v1, n->n1);
            if (n->c) v = eval_chain(x, sc, n->c, v);
        } else v = eval(x, sc, n->b);
        if (n->a) { /* ns.attr = v */
            jv *ns = eval(x, sc, n->a->a);
            if (ns->type != JV_DICT || ns->sub != JD_NS)
                jx_fail(x, JINJA_ERR_RUNTIME,
                        "TemplateRuntimeError: cannot assign attribute on non-namespace object");
            jv_dict_set(x, ns, jv_cstr(x, n->a->name), v);
        } else assign_targets(x, sc, n, v);
        return 0;
    }
    case S_MACRO: {
        jv *m = ja_alloc(&x->arena, sizeof *m);
        m->type = JV_MACRO;
        m->u.mac.def = n;
        m->u.mac.closure = sc;
        scope_set(x, sc, n->name, m);
        return 0;
    }
    case S_CALLBLOCK: {
        jv *caller = ja_alloc(&x->arena, sizeof *caller);
        caller->type = JV_MACRO;
        caller->u.mac.def = n;
        caller->u.mac.closure = sc;
        jv *f = eval(x, sc, n->a->a);
        jargs a;
        eval_args(x, sc, n->a, &a);
        jargs b = a;
        b.kwname = ja_alloc(&x->arena, (size_t)(a.nkw + 1) * sizeof(char *));
        b.kwval = ja_alloc(&x->arena, (size_t)(a.nkw + 1) * sizeof(jv *));
        if (a.nkw) {
            memcpy(b.kwname, a.kwname, (size_t)a.nkw * sizeof(char *));
            memcpy(b.kwval, a.kwval, (size_t)a.nkw * sizeof(jv *));
        }
        b.kwname[a.nkw] = "caller";
        b.kwval[a.nkw] = caller;
        b.nkw = a.nkw + 1;
        jv_to_str(x, x->out, jx_call(x, f, &b));
        return 0;
    }
    case S_FILTERBLOCK: {
        jv *v = capture(x, sc, n->v1, n->n1);
        jv_to_str(x, x->out, eval_chain(x, sc, n->a, v));
        return 0;
    }
    case S_BREAK: return 1;
    case S_CONTINUE: return 2;
    case S_BODY: return exec_body(x, sc, n->v1, n->n1);
    default: jx_fail(x, JINJA_ERR_RUNTIME, "internal error: expression executed as a statement");
    }
}

static int exec_body(jx *x, jscope *sc, jnode *const *body, int nbody) {
    for (int i = 0; i < nbody; i++) {
        int r = exec_stmt(x, sc, body[i]);
        if (r) return r;
    }
    return 0;
}

/* ---------------- API ---------------- */
static bool template_compile(jinja_template *t, const char *src, size_t n, char *err,
                             size_t err_cap) {
    jmp_buf oom;
    if (setjmp(oom)) {
        snprintf(err, err_cap, "out of memory");
        return false;
    }
    t->arena.oom = &oom;
    jtok *toks;
    size_t ntoks;
    bool ok = jinja_lex(&t->arena, src, n, &toks, &ntoks, err, err_cap) &&
              (t->root = jinja_parse(&t->arena, toks, ntoks, err, err_cap)) != NULL;
    t->arena.oom = NULL;
    return ok;
}

jinja_template *jinja_template_create(const char *src, size_t n, char *err, size_t err_cap) {
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_cap, "out of memory");
        return NULL;
    }
    if (!template_compile(t, src, n, err, err_cap)) {
        ja_free_all(&t->arena);
        free(t);
        return NULL;
    }
    return t;
}

void jinja_template_destroy(jinja_template *t) {
    if (!t) return;
    ja_free_all(&t->arena);
    free(t);
}

const char *jinja_status_name(jinja_status s) {
    switch (s) {
    case JINJA_OK: return "ok";
    case JINJA_ERR_SYNTAX: return "syntax error";
    case JINJA_ERR_RAISED: return "raised by the template";
    case JINJA_ERR_RUNTIME: return "runtime error";
    case JINJA_ERR_NOMEM: return "out of memory";
    }
    return "?";
}

static jinja_status render(jx *x, const jinja_template *t, const cJSON *vars, char **out,
                           size_t *out_len) {
    jmp_buf oom;
    if (setjmp(oom)) {
        snprintf(x->err, x->err_cap, "out of memory (the render may use at most %zu MiB)",
                 JX_MAX_MEMORY >> 20);
        return JINJA_ERR_NOMEM;
    }
    x->arena.oom = &oom;
    x->arena.limit = JX_MAX_MEMORY;
    if (setjmp(x->jmp)) return x->status;
    x->globals = scope_new(x, NULL);
    if (vars && cJSON_IsObject(vars))
        for (const cJSON *c = vars->child; c; c = c->next)
            scope_set(x, x->globals, ja_strndup(&x->arena, c->string, strlen(c->string)),
                      jv_from_json(x, c));
    jbuf b = {.arena = &x->arena};
    x->out = &b;
    exec_body(x, x->globals, t->root->v1, t->root->n1);
    char *r = malloc(b.n + 1);
    if (!r) {
        snprintf(x->err, x->err_cap, "out of memory");
        return JINJA_ERR_NOMEM;
    }
    if (b.n) memcpy(r, b.p, b.n);
    r[b.n] = 0;
    *out = r;
    if (out_len) *out_len = b.n;
    return JINJA_OK;
}

jinja_status jinja_template_render(const jinja_template *t, const cJSON *vars,
                                   const jinja_date *now, char **out, size_t *out_len, char *err,
                                   size_t err_cap) {
    char dummy[1];
    jx x = {.err = err && err_cap ? err : dummy, .err_cap = err && err_cap ? err_cap : 1};
    *out = NULL;
    if (out_len) *out_len = 0;
    x.err[0] = 0;
    if (now) x.now = *now;
    else {
        time_t tt = time(NULL);
        struct tm tm;
        localtime_r(&tt, &tm);
        x.now.year = tm.tm_year + 1900;
        x.now.month = tm.tm_mon + 1;
        x.now.day = tm.tm_mday;
    }
    jinja_status st = render(&x, t, vars, out, out_len);
    ja_free_all(&x.arena);
    return st;
}
