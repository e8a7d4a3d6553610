/* jinja_ops: what the evaluator does to values, apart from the syntax tree
 * and the scopes: attribute and item access (jinja2's sandboxed getattr and
 * getitem, a for loop's loop.* attributes), slices, iteration, and the
 * operators (arithmetic, concatenation, Markup escaping, unary, `in`), each
 * with Python's result and Python's TypeError where Python fails.
 * Attribute lookup is jinja2's sandboxed getattr: obj.name tries the Python
 * attribute (a str/dict/list method) before the item, obj[k] the item first;
 * a missing one is Undefined. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

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

static jv *getattr_plain(jx *x, jv *obj, const char *name);
static jv *getitem_plain(jx *x, jv *obj, jv *key);

void jx_mark_used(jx *x, jv *v, bool deep) {
    if (!v || (v->used && !deep)) return;
    v->used = 1;
    if (!deep) return;
    jx_step(x); /* (a bound on the walk, as on any loop) */
    if (v->type == JV_LIST)
        for (size_t i = 0; i < v->u.list.n; i++) jx_mark_used(x, v->u.list.items[i], true);
    else if (v->type == JV_DICT)
        for (size_t i = 0; i < v->u.dict.n; i++) {
            jx_mark_used(x, v->u.dict.kv[i].key, true);
            jx_mark_used(x, v->u.dict.kv[i].val, true);
        }
}

/* A tracked member access: the object and what it gave were read. */
static jv *accessed(jx *x, jv *obj, jv *got, bool by_index) {
    if (!x->track) return got;
    jx_mark_used(x, obj, false);
    jx_mark_used(x, got, false);
    if (by_index) obj->ops |= JV_OP_ARRAY;
    return got;
}

jv *jx_getattr(jx *x, jv *obj, const char *name) {
    if (x->track) return accessed(x, obj, getattr_plain(x, obj, name), false);
    return getattr_plain(x, obj, name);
}

static jv *getattr_plain(jx *x, jv *obj, const char *name) {
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
    if (x->track)
        return accessed(x, obj, getitem_plain(x, obj, key),
                        key->type == JV_INT || key->type == JV_BOOL);
    return getitem_plain(x, obj, key);
}

static jv *getitem_plain(jx *x, jv *obj, jv *key) {
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

jv *jx_slice(jx *x, jv *obj, jv *a, jv *b, jv *c) {
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
        if (unit == 0) k = 0; /* '' * 10**18 is '' at once, not 10**18 empty steps */
        if (k > 0 && (uint64_t)k > JX_MAX_OUTPUT / unit)
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

jv *jx_unop(jx *x, int op, jv *v) {
    if (op == OP_NOT) return jv_bool(!jv_truthy(v));
    if (v->type == JV_UNDEF) jx_undef_fail(x, v);
    if (v->type == JV_FLOAT) return jv_float(x, op == OP_NEG ? -v->u.f : v->u.f);
    if (v->type == JV_INT || v->type == JV_BOOL)
        return jv_int(x, op == OP_NEG ? -num_i(v) : num_i(v));
    jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: bad operand type for unary %s: '%s'",
            op == OP_NEG ? "-" : "+", jv_type_name(v));
}

bool jx_contains(jx *x, jv *hay, jv *needle) {
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
