/* jinja_value: the arena, buffers, and Python value semantics of the Jinja
 * interpreter: str(), repr(), json.dumps() as transformers' tojson calls it,
 * float repr, equality, ordering and truthiness. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

/* ---------------- arena ---------------- */
struct ja_chunk {
    ja_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ja_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = a->limit && a->bytes + cap > a->limit ? NULL : malloc(sizeof(ja_chunk) + cap);
        if (!c) {
            if (a->oom) longjmp(*a->oom, 1);
            return NULL;
        }
        a->bytes += cap;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void *ja_grow(jarena *a, const void *p, size_t n, size_t cap, size_t elem) {
    void *q = ja_alloc(a, cap * elem);
    if (n) memcpy(q, p, n * elem);
    return q;
}

void ja_free_all(jarena *a) {
    ja_chunk *c = a->head;
    while (c) {
        ja_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
}

/* ---------------- buffers ---------------- */
/* Room for n more bytes and the NUL after them. */
static void jb_reserve(jbuf *b, size_t n) {
    if (b->n + n + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + n + 1) cap *= 2;
    b->p = ja_grow(b->arena, b->p, b->n, cap, 1);
    b->cap = cap;
}
void jb_put(jbuf *b, const char *s, size_t n) {
    jb_reserve(b, n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }
/* Formats straight into the free room; when the piece is longer, grows the
 * buffer to its length and formats it again (any length, never cut). */
void jb_printf(jbuf *b, const char *fmt, ...) {
    for (int pass = 0; pass < 2; pass++) {
        size_t room = b->cap - b->n;
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(room ? b->p + b->n : NULL, room, fmt, ap);
        va_end(ap);
        if (k < 0) {
            if (room) b->p[b->n] = 0;
            return;
        }
        if ((size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        jb_reserve(b, (size_t)k);
    }
}

/* ---------------- UTF-8 ---------------- */
uint32_t ju_decode(const char *s, size_t n, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    size_t left = n - *i;
    uint32_t c = p[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if ((size_t)len > left) len = 1;
    for (int k = 1; k < len; k++)
        if ((p[k] & 0xC0) != 0x80) len = 1;
    if (len == 1) {
        *i += 1;
        return c;
    }
    uint32_t cp = c & (0x7F >> len);
    for (int k = 1; k < len; k++) cp = (cp << 6) | (p[k] & 0x3F);
    *i += (size_t)len;
    return cp;
}

size_t ju_len(const char *s, size_t n) {
    size_t i = 0, k = 0;
    while (i < n) {
        ju_decode(s, n, &i);
        k++;
    }
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t cp) {
    size_t i = 0;
    while (i < n && cp > 0) {
        ju_decode(s, n, &i);
        cp--;
    }
    return i;
}

void ju_encode(jbuf *b, uint32_t cp) {
    char t[4];
    if (cp < 0x80) {
        t[0] = (char)cp;
        jb_put(b, t, 1);
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        jb_put(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        jb_put(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        jb_put(b, t, 4);
    }
}

bool ju_isspace(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python's str.isprintable, close enough for text: control, format,
 * separator (except ' '), surrogate and private-use code points are not. */
static bool ju_isprintable(uint32_t c) {
    if (c < 0x20 || c == 0x7F) return false;
    if (c < 0x7F) return true;
    if (c <= 0xA0 || c == 0xAD) return false;
    if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
        (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF ||
        (c >= 0xFFF9 && c <= 0xFFFB) || c == 0x061C || c == 0x180E ||
        (c >= 0xD800 && c <= 0xF8FF) || c >= 0xF0000 || (c >= 0xE0000 && c <= 0xE0FFF) ||
        c == 0x110000)
        return false;
    return true;
}

/* ---------------- constructors ---------------- */
static jv JV_NONE_V = {.type = JV_NONE};
static jv JV_TRUE_V = {.type = JV_BOOL, .u.b = true};
static jv JV_FALSE_V = {.type = JV_BOOL, .u.b = false};

static jv *jv_new(jx *x, int type) {
    jv *v = ja_alloc(&x->arena, sizeof *v);
    v->type = (uint8_t)type;
    return v;
}

jv *jv_undef(jx *x, const char *fmt, ...) {
    jv *v = jv_new(x, JV_UNDEF);
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    v->u.undef.what = ja_strndup(&x->arena, tmp, strlen(tmp));
    return v;
}
jv *jv_none(void) { return &JV_NONE_V; }
jv *jv_bool(bool b) { return b ? &JV_TRUE_V : &JV_FALSE_V; }
jv *jv_int(jx *x, int64_t i) {
    if (i >= 0 && i < JX_SMALL_INTS) {
        if (!x->small_ints) {
            x->small_ints = ja_alloc(&x->arena, JX_SMALL_INTS * sizeof(jv));
            for (int k = 0; k < JX_SMALL_INTS; k++) {
                x->small_ints[k].type = JV_INT;
                x->small_ints[k].u.i = k;
            }
        }
        return &x->small_ints[i];
    }
    jv *v = jv_new(x, JV_INT);
    v->u.i = i;
    return v;
}
jv *jv_float(jx *x, double f) {
    jv *v = jv_new(x, JV_FLOAT);
    v->u.f = f;
    return v;
}
jv *jv_str_nocopy(jx *x, const char *s, size_t n) {
    jv *v = jv_new(x, JV_STR);
    v->u.str.s = s;
    v->u.str.n = n;
    return v;
}
jv *jv_str(jx *x, const char *s, size_t n) {
    return jv_str_nocopy(x, ja_strndup(&x->arena, s, n), n);
}
jv *jv_cstr(jx *x, const char *s) { return jv_str_nocopy(x, s, strlen(s)); }
jv *jv_list(jx *x, int sub) {
    jv *v = jv_new(x, JV_LIST);
    v->sub = (uint8_t)sub;
    return v;
}
void jv_list_push(jx *x, jv *l, jv *v) {
    if (l->u.list.n == l->u.list.cap) {
        size_t cap = l->u.list.cap ? l->u.list.cap * 2 : 4;
        l->u.list.items =
            ja_grow(&x->arena, l->u.list.items, l->u.list.n, cap, sizeof *l->u.list.items);
        l->u.list.cap = cap;
    }
    l->u.list.items[l->u.list.n++] = v;
}
jv *jv_dict(jx *x, int sub) {
    jv *v = jv_new(x, JV_DICT);
    v->sub = (uint8_t)sub;
    return v;
}
jv *jv_dict_get(jv *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->u.dict.n; i++) {
        jv *key = d->u.dict.kv[i].key;
        if (key->type == JV_STR && key->u.str.n == kn && memcmp(key->u.str.s, k, kn) == 0)
            return d->u.dict.kv[i].val;
    }
    return NULL;
}
void jv_dict_set(jx *x, jv *d, jv *key, jv *val) {
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (jv_equal(d->u.dict.kv[i].key, key)) {
            d->u.dict.kv[i].val = val;
            return;
        }
    if (d->u.dict.n == d->u.dict.cap) {
        size_t cap = d->u.dict.cap ? d->u.dict.cap * 2 : 4;
        d->u.dict.kv = ja_grow(&x->arena, d->u.dict.kv, d->u.dict.n, cap, sizeof *d->u.dict.kv);
        d->u.dict.cap = cap;
    }
    d->u.dict.kv[d->u.dict.n].key = key;
    d->u.dict.kv[d->u.dict.n].val = val;
    d->u.dict.n++;
}
jv *jv_func(jx *x, jfunc_fn fn, jv *self, const char *name) {
    jv *v = jv_new(x, JV_FUNC);
    v->u.fn.fn = fn;
    v->u.fn.self = self;
    v->u.fn.name = name;
    return v;
}

jv *jv_from_json(jx *x, const cJSON *j) {
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON keeps no int/float distinction: integral values within the
         * exact range are Python ints, as json.loads gives for "3". */
        if (!(j->type & JINJA_CJSON_FLOAT) && d == floor(d) && fabs(d) < 9007199254740992.0)
            return jv_int(x, (int64_t)d);
        return jv_float(x, d);
    }
    if (cJSON_IsString(j))
        return jv_cstr(x, ja_strndup(&x->arena, j->valuestring, strlen(j->valuestring)));
    if (cJSON_IsArray(j)) {
        jv *l = jv_list(x, JL_LIST);
        for (const cJSON *c = j->child; c; c = c->next) jv_list_push(x, l, jv_from_json(x, c));
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv *d = jv_dict(x, JD_DICT);
        for (const cJSON *c = j->child; c; c = c->next)
            jv_dict_set(x, d, jv_cstr(x, ja_strndup(&x->arena, c->string, strlen(c->string))),
                        jv_from_json(x, c));
        return d;
    }
    return jv_none();
}

/* ---------------- Python semantics ---------------- */
const char *jv_type_name(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v->markup ? "Markup" : "str";
    case JV_LIST:
        if (v->view)
            return v->view == JVIEW_ITEMS  ? "dict_items"
                   : v->view == JVIEW_KEYS ? "dict_keys"
                                           : "dict_values";
        return v->sub == JL_TUPLE ? "tuple" : v->sub == JL_GEN ? "generator" : "list";
    case JV_DICT: return v->sub == JD_NS ? "Namespace" : "dict";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "builtin_function_or_method";
    }
    return "object";
}

bool jv_truthy(const jv *v) {
    switch (v->type) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.str.n != 0;
    case JV_LIST: return v->sub == JL_GEN || v->u.list.n != 0;
    case JV_DICT: return v->sub != JD_DICT || v->u.dict.n != 0;
    default: return true;
    }
}

static bool is_num(const jv *v) {
    return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL;
}
static double num_f(const jv *v) {
    return v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const jv *v) { return v->type == JV_INT ? v->u.i : (int64_t)v->u.b; }

enum { MAX_REPR_DEPTH = 500 }; /* nesting followed by equality, repr and tojson */

/* Elements compare by identity first, as in Python (so a list that holds
 * itself equals itself); past MAX_REPR_DEPTH levels two distinct structures
 * count as unequal where Python raises RecursionError. */
static bool equal_in(const jv *a, const jv *b, int depth);

bool jv_equal(const jv *a, const jv *b) { return equal_in(a, b, 0); }

static bool equal_item(const jv *a, const jv *b, int depth) {
    return a == b || (depth < MAX_REPR_DEPTH && equal_in(a, b, depth + 1));
}

static bool equal_in(const jv *a, const jv *b, int depth) {
    if (is_num(a) && is_num(b)) {
        if (a->type == JV_FLOAT || b->type == JV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->type != b->type) return false;
    switch (a->type) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a->u.str.n == b->u.str.n && memcmp(a->u.str.s, b->u.str.s, a->u.str.n) == 0;
    case JV_LIST:
        if ((a->sub == JL_TUPLE) != (b->sub == JL_TUPLE) || a->sub == JL_GEN || b->sub == JL_GEN)
            return a == b;
        if (a->u.list.n != b->u.list.n) return false;
        for (size_t i = 0; i < a->u.list.n; i++)
            if (!equal_item(a->u.list.items[i], b->u.list.items[i], depth)) return false;
        return true;
    case JV_DICT:
        if (a->sub != JD_DICT || b->sub != JD_DICT) return a == b;
        if (a->u.dict.n != b->u.dict.n) return false;
        for (size_t i = 0; i < a->u.dict.n; i++) {
            const jv *o = NULL;
            for (size_t j = 0; j < b->u.dict.n && !o; j++)
                if (jv_equal(a->u.dict.kv[i].key, b->u.dict.kv[j].key)) o = b->u.dict.kv[j].val;
            if (!o || !equal_item(a->u.dict.kv[i].val, o, depth)) return false;
        }
        return true;
    default: return a == b;
    }
}

int jv_compare(jx *x, jv *a, jv *b, const char *op) {
    if (a->type == JV_UNDEF) jx_undef_fail(x, a);
    if (b->type == JV_UNDEF) jx_undef_fail(x, b);
    if (is_num(a) && is_num(b)) {
        if (a->type == JV_FLOAT || b->type == JV_FLOAT) {
            double p = num_f(a), q = num_f(b);
            return p < q ? -1 : p > q ? 1 : 0;
        }
        int64_t p = num_i(a), q = num_i(b);
        return p < q ? -1 : p > q ? 1 : 0;
    }
    if (a->type == JV_STR && b->type == JV_STR) {
        size_t n = a->u.str.n < b->u.str.n ? a->u.str.n : b->u.str.n;
        int c = memcmp(a->u.str.s, b->u.str.s, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.str.n < b->u.str.n ? -1 : a->u.str.n > b->u.str.n ? 1 : 0;
    }
    if (a->type == JV_LIST && b->type == JV_LIST && (a->sub == JL_TUPLE) == (b->sub == JL_TUPLE) &&
        a->sub != JL_GEN && b->sub != JL_GEN) {
        for (size_t i = 0; i < a->u.list.n && i < b->u.list.n; i++) {
            if (jv_equal(a->u.list.items[i], b->u.list.items[i])) continue;
            return jv_compare(x, a->u.list.items[i], b->u.list.items[i], op);
        }
        return a->u.list.n < b->u.list.n ? -1 : a->u.list.n > b->u.list.n ? 1 : 0;
    }
    jx_fail(x, JINJA_ERR_RUNTIME,
            "TypeError: '%s' not supported between instances of '%s' and '%s'", op, jv_type_name(a),
            jv_type_name(b));
}

/* Python repr(float): the shortest digits that read back the same double;
 * fixed notation for exponents in [-4, 16), otherwise d.ddde+XX. */
void jv_float_repr(char *out, size_t cap, double f) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        snprintf(out, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d.ddde[+-]XX */
    const char *p = buf;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    char digits[32];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char res[80];
    int k = 0;
    if (neg) res[k++] = '-';
    if (e >= -5 + 1 && e < 16) {
        if (e < 0) {
            res[k++] = '0';
            res[k++] = '.';
            for (int i = 0; i < -e - 1; i++) res[k++] = '0';
            for (int i = 0; i < nd; i++) res[k++] = digits[i];
        } else {
            for (int i = 0; i <= e; i++) res[k++] = i < nd ? digits[i] : '0';
            res[k++] = '.';
            if (nd > e + 1)
                for (int i = e + 1; i < nd; i++) res[k++] = digits[i];
            else res[k++] = '0';
        }
        res[k] = 0;
    } else {
        res[k++] = digits[0];
        if (nd > 1) {
            res[k++] = '.';
            for (int i = 1; i < nd; i++) res[k++] = digits[i];
        }
        res[k] = 0;
        char ex[16];
        snprintf(ex, sizeof ex, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        strcat(res, ex);
    }
    snprintf(out, cap, "%s", res);
}

static void repr_str(jbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(b, q);
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t c = ju_decode(s, n, &i);
        if (c == (uint32_t)q || c == '\\') {
            jb_putc(b, '\\');
            jb_putc(b, (char)c);
        } else if (c == '\n') jb_puts(b, "\\n");
        else if (c == '\r') jb_puts(b, "\\r");
        else if (c == '\t') jb_puts(b, "\\t");
        else if (!ju_isprintable(c)) {
            if (c < 0x100) jb_printf(b, "\\x%02x", c);
            else if (c < 0x10000) jb_printf(b, "\\u%04x", c);
            else jb_printf(b, "\\U%08x", c);
        } else jb_put(b, s + st, i - st);
    }
    jb_putc(b, q);
}

/* Containers being printed, innermost first: one met again is printed as
 * Python prints a recursive container ([...], {...}); nesting past
 * MAX_REPR_DEPTH fails as Python's repr does (RecursionError) instead of
 * exhausting the C stack. */
typedef struct repr_frame {
    const jv *v;
    const struct repr_frame *up;
    int depth;
} repr_frame;

static void to_str_in(jx *x, jbuf *b, const jv *v, bool repr, const repr_frame *up);

/* Prints item v of the container in frame f, or its placeholder when v is
 * one of the containers around it. */
static void to_str_item(jx *x, jbuf *b, const jv *v, const repr_frame *f) {
    if (v->type == JV_LIST || v->type == JV_DICT)
        for (const repr_frame *g = f; g; g = g->up)
            if (g->v == v) {
                if (v->type == JV_DICT) jb_puts(b, v->sub == JD_NS ? "<Namespace {...}>" : "{...}");
                else jb_puts(b, v->sub == JL_TUPLE ? "(...)" : "[...]");
                return;
            }
    if (f->depth >= MAX_REPR_DEPTH)
        jx_fail(x, JINJA_ERR_RUNTIME,
                "RecursionError: maximum recursion depth exceeded while getting the repr of an "
                "object");
    to_str_in(x, b, v, true, f);
}

static void to_str(jx *x, jbuf *b, const jv *v, bool repr) { to_str_in(x, b, v, repr, NULL); }

static void to_str_in(jx *x, jbuf *b, const jv *v, bool repr, const repr_frame *up) {
    char tmp[64];
    const repr_frame f = {v, up, up ? up->depth + 1 : 1};
    switch (v->type) {
    case JV_UNDEF: break;
    case JV_NONE: jb_puts(b, "None"); break;
    case JV_BOOL: jb_puts(b, v->u.b ? "True" : "False"); break;
    case JV_INT: jb_printf(b, "%lld", (long long)v->u.i); break;
    case JV_FLOAT:
        jv_float_repr(tmp, sizeof tmp, v->u.f);
        jb_puts(b, tmp);
        break;
    case JV_STR:
        if (repr) {
            if (v->markup) jb_puts(b, "Markup(");
            repr_str(b, v->u.str.s, v->u.str.n);
            if (v->markup) jb_puts(b, ")");
        } else jb_put(b, v->u.str.s, v->u.str.n);
        break;
    case JV_LIST:
        if (v->sub == JL_GEN) {
            jb_printf(b, "<generator object at %p>", (const void *)v);
            break;
        }
        if (v->view) jb_printf(b, "%s(", jv_type_name(v));
        jb_putc(b, v->sub == JL_TUPLE ? '(' : '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jb_puts(b, ", ");
            to_str_item(x, b, v->u.list.items[i], &f);
        }
        if (v->sub == JL_TUPLE && v->u.list.n == 1) jb_putc(b, ',');
        jb_putc(b, v->sub == JL_TUPLE ? ')' : ']');
        if (v->view) jb_putc(b, ')');
        break;
    case JV_DICT:
        if (v->sub == JD_NS) jb_puts(b, "<Namespace ");
        jb_putc(b, '{');
        for (size_t i = 0; i < v->u.dict.n; i++) {
            if (i) jb_puts(b, ", ");
            to_str_item(x, b, v->u.dict.kv[i].key, &f);
            jb_puts(b, ": ");
            to_str_item(x, b, v->u.dict.kv[i].val, &f);
        }
        jb_putc(b, '}');
        if (v->sub == JD_NS) jb_putc(b, '>');
        break;
    case JV_LOOP: jb_printf(b, "<LoopContext %zu/%zu>", v->u.loop.i + 1, v->u.loop.n); break;
    case JV_MACRO:
        jb_printf(b, "<Macro '%s'>", v->u.mac.def->name ? v->u.mac.def->name : "caller");
        break;
    case JV_FUNC: jb_printf(b, "<built-in method %s>", v->u.fn.name); break;
    }
}

void jv_to_str(jx *x, jbuf *b, const jv *v) { to_str(x, b, v, false); }
void jv_repr(jx *x, jbuf *b, const jv *v) { to_str(x, b, v, true); }

jv *jv_stringify(jx *x, jv *v) {
    if (v->type == JV_STR) return v;
    jbuf b = {.arena = &x->arena};
    jv_to_str(x, &b, v);
    return jv_str_nocopy(x, b.p ? b.p : "", b.n);
}

/* ---------------- json.dumps ---------------- */
static void json_str(jbuf *b, const char *s, size_t n, bool ensure_ascii) {
    jb_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t c = ju_decode(s, n, &i);
        switch (c) {
        case '"': jb_puts(b, "\\\""); break;
        case '\\': jb_puts(b, "\\\\"); break;
        case '\n': jb_puts(b, "\\n"); break;
        case '\r': jb_puts(b, "\\r"); break;
        case '\t': jb_puts(b, "\\t"); break;
        case '\b': jb_puts(b, "\\b"); break;
        case '\f': jb_puts(b, "\\f"); break;
        default:
            if (c < 0x20) jb_printf(b, "\\u%04x", c);
            else if (ensure_ascii && c >= 0x7F) {
                if (c >= 0x10000) {
                    uint32_t v = c - 0x10000;
                    jb_printf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else jb_printf(b, "\\u%04x", c);
            } else jb_put(b, s + st, i - st);
        }
    }
    jb_putc(b, '"');
}

static void json_nl(jbuf *b, const char *indent, int level) {
    jb_putc(b, '\n');
    for (int i = 0; i < level; i++) jb_puts(b, indent);
}

/* json.dumps' key: str as is, int/float as str(), True/False/None as JSON */
static jv *json_key(jx *x, jv *k) {
    if (k->type == JV_STR) return k;
    if (k->type == JV_BOOL) return jv_cstr(x, k->u.b ? "true" : "false");
    if (k->type == JV_NONE) return jv_cstr(x, "null");
    if (k->type == JV_INT || k->type == JV_FLOAT) return jv_stringify(x, k);
    jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: keys must be str, int, float, bool or None, not %s",
            jv_type_name(k));
}

static int kv_cmp(const void *p, const void *q) {
    const jkv *a = p, *b = q;
    size_t n = a->key->u.str.n < b->key->u.str.n ? a->key->u.str.n : b->key->u.str.n;
    int c = memcmp(a->key->u.str.s, b->key->u.str.s, n);
    if (c) return c;
    return a->key->u.str.n < b->key->u.str.n ? -1 : a->key->u.str.n > b->key->u.str.n;
}

static void tojson_rec(jx *x, jbuf *b, const jv *v, bool ea, const char *indent, const char *isep,
                       const char *ksep, bool sort, int level) {
    char tmp[64];
    /* a list that holds itself (l.append(l)) would recurse forever: Python's
     * json refuses it, and anything nested this deep */
    if (level >= MAX_REPR_DEPTH)
        jx_fail(x, JINJA_ERR_RUNTIME, "ValueError: Circular reference detected");
    switch (v->type) {
    case JV_NONE: jb_puts(b, "null"); return;
    case JV_BOOL: jb_puts(b, v->u.b ? "true" : "false"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT:
        if (isnan(v->u.f)) jb_puts(b, "NaN");
        else if (isinf(v->u.f)) jb_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            jv_float_repr(tmp, sizeof tmp, v->u.f);
            jb_puts(b, tmp);
        }
        return;
    case JV_STR: json_str(b, v->u.str.s, v->u.str.n, ea); return;
    case JV_LIST:
        if (v->sub == JL_GEN || v->view) break;
        if (v->u.list.n == 0) {
            jb_puts(b, "[]");
            return;
        }
        jb_putc(b, '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jb_puts(b, isep);
            if (indent) json_nl(b, indent, level + 1);
            tojson_rec(x, b, v->u.list.items[i], ea, indent, isep, ksep, sort, level + 1);
        }
        if (indent) json_nl(b, indent, level);
        jb_putc(b, ']');
        return;
    case JV_DICT: {
        if (v->sub != JD_DICT) break;
        if (v->u.dict.n == 0) {
            jb_puts(b, "{}");
            return;
        }
        jkv *kv = ja_alloc(&x->arena, v->u.dict.n * sizeof *kv);
        for (size_t i = 0; i < v->u.dict.n; i++) {
            kv[i].key = json_key(x, v->u.dict.kv[i].key);
            kv[i].val = v->u.dict.kv[i].val;
        }
        if (sort) qsort(kv, v->u.dict.n, sizeof *kv, kv_cmp);
        jb_putc(b, '{');
        for (size_t i = 0; i < v->u.dict.n; i++) {
            if (i) jb_puts(b, isep);
            if (indent) json_nl(b, indent, level + 1);
            json_str(b, kv[i].key->u.str.s, kv[i].key->u.str.n, ea);
            jb_puts(b, ksep);
            tojson_rec(x, b, kv[i].val, ea, indent, isep, ksep, sort, level + 1);
        }
        if (indent) json_nl(b, indent, level);
        jb_putc(b, '}');
        return;
    }
    default: break;
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "TypeError: Object of type %s is not JSON serializable",
            jv_type_name(v));
}

void jv_tojson(jx *x, jbuf *b, const jv *v, bool ensure_ascii, const char *indent,
               const char *item_sep, const char *key_sep, bool sort_keys) {
    tojson_rec(x, b, v, ensure_ascii, indent, item_sep, key_sep, sort_keys, 0);
}

/* ---------------- JSON with float marks ---------------- */
/* Walks the number tokens of the text (outside strings) and the number nodes
 * of the tree in the same document order, marking the floats. */
typedef struct num_walk {
    const char *s;
    size_t n, i;
} num_walk;

static bool next_number(num_walk *w, bool *is_float) {
    while (w->i < w->n) {
        char c = w->s[w->i];
        if (c == '"') {
            w->i++;
            while (w->i < w->n && w->s[w->i] != '"') w->i += w->s[w->i] == '\\' ? 2 : 1;
            w->i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            bool f = false;
            while (w->i < w->n && strchr("+-0123456789.eE", w->s[w->i])) {
                if (strchr(".eE", w->s[w->i])) f = true;
                w->i++;
            }
            *is_float = f;
            return true;
        } else w->i++;
    }
    return false;
}

static void mark_floats(cJSON *j, num_walk *w) {
    for (; j; j = j->next) {
        if (cJSON_IsNumber(j)) {
            bool f = false;
            if (next_number(w, &f) && f) j->type |= JINJA_CJSON_FLOAT;
        }
        if (j->child) mark_floats(j->child, w);
    }
}

cJSON *jinja_json_parse(const char *s, size_t n, const char **err_at) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, false);
    if (!j) {
        if (err_at) *err_at = end;
        return NULL;
    }
    num_walk w = {.s = s, .n = n};
    mark_floats(j, &w);
    return j;
}
