/* jinja_eval: renders a syntax tree: expressions (eval), calls and macros,
 * statements (exec_stmt, for loops, assignments) and the public API
 * (jinja_template_create / jinja_template_render). Scoping follows jinja2: a
 * for loop and a macro body open a scope (their sets do not leak out; a
 * namespace() carries values across), if blocks do not. Names resolve through
 * the scopes, then the render variables, then the globals (range, namespace,
 * raise_exception, ...). What is done to the values themselves (attributes,
 * items, slices, operators) is in jinja_ops.c; the builtins are in
 * jinja_builtins.c, jinja_filters.c and jinja_methods.c. */
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
        s->names = ja_grow(&x->arena, s->names, (size_t)s->n, (size_t)cap, sizeof *s->names);
        s->vals = ja_grow(&x->arena, s->vals, (size_t)s->n, (size_t)cap, sizeof *s->vals);
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
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
        if (p && x->track) jx_mark_used(x, *p, false);
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
        return jx_slice(x, obj, n->b ? eval(x, sc, n->b) : NULL, n->c ? eval(x, sc, n->c) : NULL,
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
        case OP_IN: return jv_bool(jx_contains(x, r, l));
        case OP_NOTIN: return jv_bool(!jx_contains(x, r, l));
        default: return jx_binop(x, n->op, l, r);
        }
    }
    case N_UNARY: return jx_unop(x, n->op, eval(x, sc, n->a));
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
    if (x->track) {
        jx_mark_used(x, seq, false);
        seq->ops |= JV_OP_ARRAY;
    }
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

/* The callable that a {% macro %} defines, or the `caller` of a {% call %}
 * block: node n, closed over the scope sc it is defined in. */
static jv *macro_value(jx *x, jscope *sc, const jnode *n) {
    jv *m = ja_alloc(&x->arena, sizeof *m);
    m->type = JV_MACRO;
    m->u.mac.def = n;
    m->u.mac.closure = sc;
    return m;
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
    case S_MACRO: scope_set(x, sc, n->name, macro_value(x, sc, n)); return 0;
    case S_CALLBLOCK: {
        jv *caller = macro_value(x, sc, n);
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
    if (x->track) {
        jv **m = scope_find(x->globals, "messages"), **t = scope_find(x->globals, "tools");
        x->in_messages = m ? *m : NULL;
        x->in_tools = t ? *t : NULL;
    }
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

void jx_render_tracked(const jinja_template *t, const cJSON *vars,
                       void (*look)(void *ctx, jinja_status st, jx *x, const char *out),
                       void *ctx) {
    char err[256];
    jx x = {.err = err, .err_cap = sizeof err, .track = true, .now = {2026, 1, 1}};
    err[0] = 0;
    char *out = NULL;
    const jinja_status st = render(&x, t, vars, &out, NULL);
    look(ctx, st, &x, out);
    free(out);
    ja_free_all(&x.arena);
}

jv *jx_global_get(jx *x, const char *name) {
    return !strcmp(name, "messages") ? x->in_messages : !strcmp(name, "tools") ? x->in_tools : NULL;
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
