/* jinja_parse: tokens to a syntax tree, with jinja2's grammar and operator
 * precedence (parser.py): condexpr < or < and < not < compare (==, in, ...)
 * < + - < ~ < * / // % < ** < unary - + < postfix (. [] ()) < filters and
 * tests (| is). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

typedef struct parser {
    jarena *a;
    jtok *t;
    size_t n, i;
    jmp_buf jmp;
    int loops; /* for loops open around the statement being parsed (break/continue) */
    int depth; /* expression / block nesting, bounded so hostile input cannot exhaust the stack */
    char *err;
    size_t err_cap;
} parser;

typedef struct nvec {
    jnode **v;
    int n, cap;
    const char **names;
} nvec;

static _Noreturn void p_fail(parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void p_fail(parser *P, const char *fmt, ...) {
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(P->err, P->err_cap, "template syntax error at line %d: %s", P->t[P->i].line, m);
    longjmp(P->jmp, 1);
}

static void nv_push(parser *P, nvec *v, jnode *x, const char *name) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        v->v = ja_grow(P->a, v->v, (size_t)v->n, (size_t)cap, sizeof *v->v);
        v->names = ja_grow(P->a, v->names, (size_t)v->n, (size_t)cap, sizeof *v->names);
        v->cap = cap;
    }
    v->names[v->n] = name;
    v->v[v->n++] = x;
}

static jnode *nn(parser *P, jnode_kind k) {
    jnode *x = ja_alloc(P->a, sizeof *x);
    x->kind = k;
    x->line = P->t[P->i].line;
    return x;
}

static jtok *cur(parser *P) { return &P->t[P->i]; }
static jtok *peek(parser *P, int k) {
    size_t j = P->i + (size_t)k;
    return j < P->n ? &P->t[j] : &P->t[P->n - 1];
}
static bool is_op(jtok *t, const char *op) { return t->type == JT_OP && strcmp(t->s, op) == 0; }
static bool is_name(jtok *t, const char *nm) { return t->type == JT_NAME && strcmp(t->s, nm) == 0; }
static bool accept_op(parser *P, const char *op) {
    if (is_op(cur(P), op)) {
        P->i++;
        return true;
    }
    return false;
}
static bool accept_name(parser *P, const char *nm) {
    if (is_name(cur(P), nm)) {
        P->i++;
        return true;
    }
    return false;
}
static const char *tok_desc(jtok *t) {
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_TEXT: return "text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_STRING: return "a string";
    case JT_INT:
    case JT_FLOAT: return "a number";
    default: return t->s;
    }
}
static void expect_op(parser *P, const char *op) {
    if (!accept_op(P, op)) p_fail(P, "expected '%s', got %s", op, tok_desc(cur(P)));
}
static const char *expect_name(parser *P) {
    if (cur(P)->type != JT_NAME) p_fail(P, "expected a name, got %s", tok_desc(cur(P)));
    return P->t[P->i++].s;
}
static void expect_block_end(parser *P) {
    if (cur(P)->type != JT_BLOCK_END)
        p_fail(P, "expected end of statement '%%}', got %s", tok_desc(cur(P)));
    P->i++;
}

static jnode *parse_expr(parser *P, bool condexpr);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_or(parser *P);

static void set_vec(jnode *x, nvec *v, int which) {
    if (which == 1) {
        x->v1 = v->v;
        x->n1 = v->n;
        x->names = v->names;
        x->nnames = v->n;
    } else {
        x->v2 = v->v;
        x->n2 = v->n;
    }
}

/* In a comma-separated list ended by close (left for the caller to take),
 * after n items: whether another item follows, its comma taken; a trailing
 * comma is allowed. */
static bool next_item(parser *P, int n, const char *close) {
    if (is_op(cur(P), close)) return false;
    if (n) {
        expect_op(P, ",");
        if (is_op(cur(P), close)) return false;
    }
    return true;
}

/* ( args ) after the '(' : positional and name=value */
static void parse_call_args(parser *P, jnode *x) {
    nvec args = {0};
    while (next_item(P, args.n, ")")) {
        const char *kw = NULL;
        if (accept_op(P, "*")) kw = "*";
        else if (accept_op(P, "**")) kw = "**";
        else if (cur(P)->type == JT_NAME && is_op(peek(P, 1), "=")) {
            kw = cur(P)->s;
            P->i += 2;
        }
        nv_push(P, &args, parse_expr(P, true), kw);
    }
    expect_op(P, ")");
    set_vec(x, &args, 1);
}

static jnode *parse_tuple_or_expr(parser *P, bool condexpr, bool allow_empty) {
    nvec items = {0};
    bool comma = false;
    for (;;) {
        jtok *t = cur(P);
        if (items.n && (t->type == JT_BLOCK_END || t->type == JT_VAR_END || is_op(t, ")") ||
                        is_name(t, "if") || is_op(t, "=")))
            break;
        if (!items.n && allow_empty && is_op(t, ")")) break;
        nv_push(P, &items, parse_expr(P, condexpr), NULL);
        if (!accept_op(P, ",")) break;
        comma = true;
    }
    if (items.n == 1 && !comma) return items.v[0];
    jnode *x = nn(P, N_TUPLE);
    set_vec(x, &items, 1);
    return x;
}

static jnode *parse_primary(parser *P) {
    jtok *t = cur(P);
    jnode *x;
    if (t->type == JT_NAME) {
        P->i++;
        x = nn(P, N_LIT);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) x->lit = jv_bool(true);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) x->lit = jv_bool(false);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) x->lit = jv_none();
        else {
            x->kind = N_NAME;
            x->name = t->s;
        }
        return x;
    }
    if (t->type == JT_STRING) {
        jbuf b = {.arena = P->a};
        while (cur(P)->type == JT_STRING) {
            jb_put(&b, cur(P)->s, cur(P)->n);
            P->i++;
        }
        x = nn(P, N_LIT);
        x->lit = ja_alloc(P->a, sizeof(jv));
        x->lit->type = JV_STR;
        x->lit->u.str.s = b.p ? b.p : "";
        x->lit->u.str.n = b.n;
        return x;
    }
    if (t->type == JT_INT || t->type == JT_FLOAT) {
        P->i++;
        x = nn(P, N_LIT);
        x->lit = ja_alloc(P->a, sizeof(jv));
        x->lit->type = t->type == JT_INT ? JV_INT : JV_FLOAT;
        if (t->type == JT_INT) x->lit->u.i = t->i;
        else x->lit->u.f = t->f;
        return x;
    }
    if (accept_op(P, "(")) {
        x = parse_tuple_or_expr(P, true, true);
        expect_op(P, ")");
        return x;
    }
    if (accept_op(P, "[")) {
        nvec items = {0};
        while (next_item(P, items.n, "]")) {
            nv_push(P, &items, parse_expr(P, true), NULL);
        }
        expect_op(P, "]");
        x = nn(P, N_LIST);
        set_vec(x, &items, 1);
        return x;
    }
    if (accept_op(P, "{")) {
        nvec keys = {0}, vals = {0};
        while (next_item(P, keys.n, "}")) {
            nv_push(P, &keys, parse_expr(P, true), NULL);
            expect_op(P, ":");
            nv_push(P, &vals, parse_expr(P, true), NULL);
        }
        expect_op(P, "}");
        x = nn(P, N_DICT);
        set_vec(x, &keys, 1);
        set_vec(x, &vals, 2);
        return x;
    }
    p_fail(P, "unexpected %s", tok_desc(t));
}

static jnode *parse_subscript(parser *P, jnode *obj) {
    if (accept_op(P, ".")) {
        jtok *t = cur(P);
        if (t->type == JT_NAME) {
            jnode *x = nn(P, N_GETATTR);
            P->i++;
            x->a = obj;
            x->name = t->s;
            return x;
        }
        if (t->type == JT_INT) {
            jnode *x = nn(P, N_GETITEM);
            x->a = obj;
            x->b = parse_primary(P);
            return x;
        }
        p_fail(P, "expected a name after '.'");
    }
    expect_op(P, "[");
    jnode *parts[3] = {NULL, NULL, NULL};
    int np = 0;
    bool slice = false;
    if (!is_op(cur(P), ":")) parts[0] = parse_expr(P, true);
    while (accept_op(P, ":")) {
        slice = true;
        if (++np > 2) p_fail(P, "too many ':' in a slice");
        if (!is_op(cur(P), ":") && !is_op(cur(P), "]")) parts[np] = parse_expr(P, true);
    }
    jnode *x;
    if (slice) {
        x = nn(P, N_SLICE);
        x->b = parts[0];
        x->c = parts[1];
        x->d = parts[2];
    } else {
        if (is_op(cur(P), ",")) { /* x[a, b]: a tuple key */
            nvec items = {0};
            nv_push(P, &items, parts[0], NULL);
            while (accept_op(P, ",") && !is_op(cur(P), "]"))
                nv_push(P, &items, parse_expr(P, true), NULL);
            parts[0] = nn(P, N_TUPLE);
            set_vec(parts[0], &items, 1);
        }
        x = nn(P, N_GETITEM);
        x->b = parts[0];
    }
    x->a = obj;
    expect_op(P, "]");
    return x;
}

static jnode *parse_postfix(parser *P, jnode *x) {
    for (;;) {
        if (is_op(cur(P), ".") || is_op(cur(P), "[")) x = parse_subscript(P, x);
        else if (accept_op(P, "(")) {
            jnode *c = nn(P, N_CALL);
            c->a = x;
            parse_call_args(P, c);
            x = c;
        } else return x;
    }
}

static const char *dotted_name(parser *P) {
    const char *nm = expect_name(P);
    while (is_op(cur(P), ".") && peek(P, 1)->type == JT_NAME) {
        P->i++;
        const char *more = expect_name(P);
        size_t a = strlen(nm), b = strlen(more);
        char *s = ja_alloc(P->a, a + b + 2);
        memcpy(s, nm, a);
        s[a] = '.';
        memcpy(s + a + 1, more, b + 1);
        nm = s;
    }
    return nm;
}

static jnode *parse_filter_one(parser *P, jnode *operand) {
    jnode *f = nn(P, N_FILTER);
    f->a = operand;
    f->name = dotted_name(P);
    if (accept_op(P, "(")) parse_call_args(P, f);
    return f;
}

static jnode *parse_filter_expr(parser *P, jnode *x) {
    for (;;) {
        if (accept_op(P, "|")) x = parse_filter_one(P, x);
        else if (accept_name(P, "is")) {
            jnode *t = nn(P, N_TEST);
            if (accept_name(P, "not")) t->op = 1;
            t->a = x;
            t->name = dotted_name(P);
            jtok *c = cur(P);
            if (accept_op(P, "(")) parse_call_args(P, t);
            else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT ||
                      c->type == JT_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
                     !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                nvec args = {0};
                nv_push(P, &args, parse_postfix(P, parse_primary(P)), NULL);
                set_vec(t, &args, 1);
            }
            x = t;
        } else if (accept_op(P, "(")) {
            jnode *c = nn(P, N_CALL);
            c->a = x;
            parse_call_args(P, c);
            x = c;
        } else return x;
    }
}

#define JP_MAX_DEPTH 200

static jnode *parse_unary(parser *P, bool with_filter) {
    if (++P->depth > JP_MAX_DEPTH) p_fail(P, "expression nested too deeply");
    jnode *x;
    if (accept_op(P, "-")) {
        x = nn(P, N_UNARY);
        x->op = OP_NEG;
        x->a = parse_unary(P, false);
    } else if (accept_op(P, "+")) {
        x = nn(P, N_UNARY);
        x->op = OP_POS;
        x->a = parse_unary(P, false);
    } else x = parse_primary(P);
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filter_expr(P, x);
    P->depth--;
    return x;
}

static jnode *bin(parser *P, int op, jnode *a, jnode *b) {
    jnode *x = nn(P, N_BIN);
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

/* Left-associative binary operators: a level's operators (symbols, or words
 * such as "and"), NULL-ended, and parse_left reading `operand (op operand)*`. */
typedef struct binop {
    const char *tok;
    int op;
} binop;

static const binop POW_OPS[] = {{"**", OP_POW}, {NULL, 0}};
static const binop MUL_OPS[] = {
    {"*", OP_MUL}, {"/", OP_DIV}, {"//", OP_FLOORDIV}, {"%", OP_MOD}, {NULL, 0}};
static const binop CONCAT_OPS[] = {{"~", OP_CONCAT}, {NULL, 0}};
static const binop ADD_OPS[] = {{"+", OP_ADD}, {"-", OP_SUB}, {NULL, 0}};
static const binop AND_OPS[] = {{"and", OP_AND}, {NULL, 0}};
static const binop OR_OPS[] = {{"or", OP_OR}, {NULL, 0}};

static bool accept_binop(parser *P, const char *tok) {
    return tok[0] >= 'a' && tok[0] <= 'z' ? accept_name(P, tok) : accept_op(P, tok);
}

static jnode *parse_left(parser *P, const binop *ops, jnode *(*operand)(parser *)) {
    jnode *x = operand(P);
    for (;;) {
        const binop *o = ops;
        while (o->tok && !accept_binop(P, o->tok)) o++;
        if (!o->tok) return x;
        x = bin(P, o->op, x, operand(P));
    }
}

static jnode *parse_filtered_unary(parser *P) { return parse_unary(P, true); }
static jnode *parse_pow(parser *P) { return parse_left(P, POW_OPS, parse_filtered_unary); }
static jnode *parse_math2(parser *P) { return parse_left(P, MUL_OPS, parse_pow); }
static jnode *parse_concat(parser *P) { return parse_left(P, CONCAT_OPS, parse_math2); }
static jnode *parse_math1(parser *P) { return parse_left(P, ADD_OPS, parse_concat); }
static jnode *parse_compare(parser *P) {
    jnode *x = parse_math1(P);
    for (;;) {
        int op = 0;
        jtok *t = cur(P);
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = OP_NOTIN;
            P->i++;
        }
        if (!op) return x;
        P->i++;
        x = bin(P, op, x, parse_math1(P));
    }
}
static jnode *parse_not(parser *P) {
    if (accept_name(P, "not")) {
        jnode *x = nn(P, N_UNARY);
        x->op = OP_NOT;
        x->a = parse_not(P);
        return x;
    }
    return parse_compare(P);
}
static jnode *parse_and(parser *P) { return parse_left(P, AND_OPS, parse_not); }
static jnode *parse_or(parser *P) { return parse_left(P, OR_OPS, parse_and); }
static jnode *parse_expr(parser *P, bool condexpr) {
    jnode *x = parse_or(P);
    if (!condexpr) return x;
    while (accept_name(P, "if")) {
        jnode *c = nn(P, N_COND);
        c->a = x;
        c->b = parse_or(P);
        if (accept_name(P, "else")) c->c = parse_expr(P, true);
        x = c;
    }
    return x;
}

/* ---------------- statements ---------------- */
static jnode *parse_body(parser *P, const char *const *ends);

/* assignment target: name, name.attr, or names separated by commas */
static void parse_targets(parser *P, jnode *x, bool allow_attr) {
    nvec names = {0};
    bool paren = accept_op(P, "(");
    for (;;) {
        const char *nm = expect_name(P);
        if (allow_attr && names.n == 0 && is_op(cur(P), ".")) {
            P->i++;
            jnode *t = nn(P, N_GETATTR);
            t->name = expect_name(P);
            t->a = nn(P, N_NAME);
            t->a->name = nm;
            x->a = t;
            return;
        }
        nv_push(P, &names, NULL, nm);
        if (!accept_op(P, ",")) break;
        if (paren && is_op(cur(P), ")")) break;
    }
    if (paren) expect_op(P, ")");
    x->names = names.names;
    x->nnames = names.n;
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};

static jnode *parse_if(parser *P) {
    jnode *x = nn(P, S_IF);
    x->a = parse_expr(P, true);
    expect_block_end(P);
    jnode *body = parse_body(P, END_IF);
    x->v1 = body->v1;
    x->n1 = body->n1;
    const char *kw = expect_name(P);
    if (!strcmp(kw, "elif")) {
        jnode *e = parse_if(P);
        x->v2 = ja_alloc(P->a, sizeof(jnode *));
        x->v2[0] = e;
        x->n2 = 1;
        return x;
    }
    if (!strcmp(kw, "else")) {
        expect_block_end(P);
        static const char *const END[] = {"endif", NULL};
        jnode *eb = parse_body(P, END);
        x->v2 = eb->v1;
        x->n2 = eb->n1;
        expect_name(P);
    }
    expect_block_end(P);
    return x;
}

static jnode *parse_block_named(parser *P, const char *end) {
    const char *const ends[] = {end, NULL};
    jnode *b = parse_body(P, ends);
    expect_name(P);
    expect_block_end(P);
    return b;
}

/* The rest of a block statement's tag ('%}'), then its body up to {% end %}
 * into x's statements. */
static void parse_block_into(parser *P, jnode *x, const char *end) {
    expect_block_end(P);
    jnode *b = parse_block_named(P, end);
    x->v1 = b->v1;
    x->n1 = b->n1;
}

static jnode *parse_macro_params(parser *P, jnode *x) {
    nvec params = {0};
    nvec defaults = {0};
    expect_op(P, "(");
    while (next_item(P, params.n, ")")) {
        const char *nm = expect_name(P);
        jnode *d = NULL;
        if (accept_op(P, "=")) d = parse_expr(P, true);
        nv_push(P, &params, NULL, nm);
        nv_push(P, &defaults, d, NULL);
    }
    expect_op(P, ")");
    x->names = params.names;
    x->nnames = params.n;
    x->v2 = defaults.v;
    x->n2 = defaults.n;
    return x;
}

static jnode *parse_stmt(parser *P) {
    jtok *t = cur(P);
    if (t->type != JT_NAME) p_fail(P, "expected a statement name, got %s", tok_desc(t));
    const char *kw = t->s;
    P->i++;
    if (!strcmp(kw, "if")) return parse_if(P);
    if (!strcmp(kw, "for")) {
        jnode *x = nn(P, S_FOR);
        parse_targets(P, x, false);
        if (!accept_name(P, "in")) p_fail(P, "expected 'in' in a for loop");
        x->a = parse_tuple_or_expr(P, false, false);
        if (accept_name(P, "if")) x->b = parse_expr(P, true);
        if (accept_name(P, "recursive")) x->op = 1;
        expect_block_end(P);
        P->loops++;
        jnode *body = parse_body(P, END_FOR);
        P->loops--;
        x->v1 = body->v1;
        x->n1 = body->n1;
        if (!strcmp(expect_name(P), "else")) {
            expect_block_end(P);
            jnode *eb = parse_block_named(P, "endfor");
            x->v2 = eb->v1;
            x->n2 = eb->n1;
            return x;
        }
        expect_block_end(P);
        return x;
    }
    if (!strcmp(kw, "set")) {
        jnode *x = nn(P, S_SET);
        parse_targets(P, x, true);
        if (accept_op(P, "=")) {
            x->b = parse_tuple_or_expr(P, true, false);
            expect_block_end(P);
            return x;
        }
        /* block set, optionally filtered */
        jnode *chain = NULL;
        while (accept_op(P, "|")) chain = parse_filter_one(P, chain);
        x->c = chain;
        parse_block_into(P, x, "endset");
        x->op = 1;
        return x;
    }
    if (!strcmp(kw, "macro")) {
        jnode *x = nn(P, S_MACRO);
        x->name = expect_name(P);
        parse_macro_params(P, x);
        int loops = P->loops;
        P->loops = 0; /* break/continue do not reach out of a macro */
        parse_block_into(P, x, "endmacro");
        P->loops = loops;
        return x;
    }
    if (!strcmp(kw, "call")) {
        jnode *x = nn(P, S_CALLBLOCK);
        if (is_op(cur(P), "(")) parse_macro_params(P, x);
        x->a = parse_expr(P, true);
        if (x->a->kind != N_CALL) p_fail(P, "expected a call after 'call'");
        parse_block_into(P, x, "endcall");
        return x;
    }
    if (!strcmp(kw, "filter")) {
        jnode *x = nn(P, S_FILTERBLOCK);
        jnode *chain = parse_filter_one(P, NULL);
        while (accept_op(P, "|")) chain = parse_filter_one(P, chain);
        x->a = chain;
        parse_block_into(P, x, "endfilter");
        return x;
    }
    if (!strcmp(kw, "generation")) { /* transformers' AssistantTracker: renders the body */
        expect_block_end(P);
        return parse_block_named(P, "endgeneration");
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        if (!P->loops) p_fail(P, "'%s' outside of a loop", kw);
        jnode *x = nn(P, kw[0] == 'b' ? S_BREAK : S_CONTINUE);
        expect_block_end(P);
        return x;
    }
    P->i--;
    p_fail(P, "unknown tag '%s'", kw);
}

static jnode *parse_body(parser *P, const char *const *ends) {
    if (++P->depth > JP_MAX_DEPTH) p_fail(P, "blocks nested too deeply");
    nvec body = {0};
    for (;;) {
        jtok *t = cur(P);
        if (t->type == JT_EOF) {
            if (ends) p_fail(P, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->type == JT_TEXT) {
            jnode *x = nn(P, S_TEXT);
            x->lit = ja_alloc(P->a, sizeof(jv));
            x->lit->type = JV_STR;
            x->lit->u.str.s = t->s;
            x->lit->u.str.n = t->n;
            P->i++;
            nv_push(P, &body, x, NULL);
        } else if (t->type == JT_VAR_BEGIN) {
            P->i++;
            jnode *x = nn(P, S_OUT);
            x->a = parse_expr(P, true);
            if (cur(P)->type != JT_VAR_END) p_fail(P, "expected '}}', got %s", tok_desc(cur(P)));
            P->i++;
            nv_push(P, &body, x, NULL);
        } else if (t->type == JT_BLOCK_BEGIN) {
            jtok *k = peek(P, 1);
            if (k->type == JT_NAME && ends)
                for (int e = 0; ends[e]; e++)
                    if (!strcmp(k->s, ends[e])) {
                        P->i++;
                        goto done;
                    }
            if (k->type == JT_NAME && !ends &&
                (!strncmp(k->s, "end", 3) || !strcmp(k->s, "elif") || !strcmp(k->s, "else"))) {
                P->i++;
                p_fail(P, "unexpected '%s'", k->s);
            }
            P->i++;
            nv_push(P, &body, parse_stmt(P), NULL);
        } else p_fail(P, "unexpected %s", tok_desc(t));
    }
done:;
    P->depth--;
    jnode *b = nn(P, S_BODY);
    b->v1 = body.v;
    b->n1 = body.n;
    return b;
}

jnode *jinja_parse(jarena *a, jtok *toks, size_t ntoks, char *err, size_t err_cap) {
    parser P = {.a = a, .t = toks, .n = ntoks, .err = err, .err_cap = err_cap};
    if (setjmp(P.jmp)) return NULL;
    return parse_body(&P, NULL);
}
