/* Gemma 4's tool calls (srv_tools_int.h). Its template writes a call as
 * <|tool_call>call:NAME{key:VALUE,...}<tool_call|>, one after another for
 * several, each value as its format_argument macro writes it: a string between
 * two <|"|> tokens, raw (no escapes), a number, true / false, a Python None as
 * "None", {key:VALUE,...} with bare keys in sorted order (jinja's dictsort,
 * which ignores case), [VALUE,...]; no whitespace anywhere. Here such calls
 * are read into JSON arguments (tools_gemma_call), JSON arguments are written
 * in that syntax (tools_gemma_write, a constrained call's text) and a
 * function's JSON schema becomes the grammar of its arguments in that syntax
 * (tools_gemma_rules). */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "srv_tools_int.h"

#define GQ        "<|\"|>" /* the string delimiter token */
#define GQ_LEN    5
#define MAX_DEPTH 64 /* nesting read before a value is refused */

/* ------------------------------------------------------------ reading -- */

typedef struct gin {
    const char *p, *end;
    int depth;
} gin;

static void skip_ws(gin *g) {
    while (g->p < g->end && is_ws(*g->p)) g->p++;
}

static bool at(const gin *g, const char *m) {
    size_t n = strlen(m);
    return (size_t)(g->end - g->p) >= n && !memcmp(g->p, m, n);
}

/* The word w, not followed by more of an identifier. */
static bool word(gin *g, const char *w) {
    size_t n = strlen(w);
    if (!at(g, w)) return false;
    const char *q = g->p + n;
    if (q < g->end && (isalnum((unsigned char)*q) || *q == '_')) return false;
    g->p = q;
    return true;
}

/* <|"|>text<|"|> (taken as it is), or a JSON "..." string (a model may write
 * one): its text, malloc'd; NULL if there is none or it is unterminated. */
static char *read_string(gin *g) {
    if (at(g, GQ)) {
        const char *s = g->p + GQ_LEN;
        const char *e = find_n(s, (size_t)(g->end - s), GQ);
        if (!e) return NULL;
        g->p = e + GQ_LEN;
        return strndup(s, (size_t)(e - s));
    }
    if (g->p >= g->end || *g->p != '"') return NULL;
    const char *q = g->p + 1;
    for (bool esc = false; q < g->end; q++) {
        if (esc) esc = false;
        else if (*q == '\\') esc = true;
        else if (*q == '"') break;
    }
    if (q >= g->end) return NULL;
    cJSON *v = tools_parse_json(g->p, (size_t)(q + 1 - g->p));
    char *s = cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
    cJSON_Delete(v);
    if (s) g->p = q + 1;
    return s;
}

/* Length of the JSON number at s[0..n), 0 if none. */
static size_t number_len(const char *s, size_t n) {
    size_t i = 0, k;
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0') i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && isdigit((unsigned char)s[i])) i++;
    else return 0;
    if (i < n && s[i] == '.') {
        for (k = ++i; i < n && isdigit((unsigned char)s[i]);) i++;
        if (i == k) return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        for (k = i; i < n && isdigit((unsigned char)s[i]);) i++;
        if (i == k) return 0;
    }
    return i;
}

/* A bare key (up to the ':'), a <|"|> or JSON quoted one; the ':' is read too. */
static char *read_key(gin *g) {
    skip_ws(g);
    char *k = NULL;
    if (at(g, GQ) || (g->p < g->end && *g->p == '"')) {
        k = read_string(g);
        skip_ws(g);
    } else {
        static const char stops[] = "{}[],<\"";
        const char *s = g->p;
        while (g->p < g->end && *g->p != ':' && !memchr(stops, *g->p, sizeof stops - 1)) g->p++;
        const char *e = g->p;
        while (e > s && is_ws(e[-1])) e--;
        if (e > s) k = strndup(s, (size_t)(e - s));
    }
    if (k && g->p < g->end && *g->p == ':') {
        g->p++;
        return k;
    }
    free(k);
    return NULL;
}

static cJSON *read_value(gin *g);

/* {key:value,...} or [value,...] at g->p (its opening bracket). */
static cJSON *read_container(gin *g) {
    bool obj = *g->p == '{';
    char close = obj ? '}' : ']';
    g->p++;
    g->depth++;
    cJSON *v = obj ? cJSON_CreateObject() : cJSON_CreateArray();
    for (bool first = true; v; first = false) {
        skip_ws(g);
        if (g->p < g->end && *g->p == close && (first || obj)) { /* {} [] (and a last ',' in {}) */
            g->p++;
            g->depth--;
            return v;
        }
        char *key = obj ? read_key(g) : NULL;
        cJSON *item = !obj || key ? read_value(g) : NULL;
        bool ok = item != NULL;
        if (ok && obj) {
            cJSON_DeleteItemFromObjectCaseSensitive(v, key); /* a repeated key: the last one */
            ok = cJSON_AddItemToObject(v, key, item);
        } else if (ok) {
            ok = cJSON_AddItemToArray(v, item);
        }
        free(key);
        if (!ok) {
            cJSON_Delete(item);
            break;
        }
        skip_ws(g);
        if (g->p < g->end && *g->p == ',') {
            g->p++;
            continue;
        }
        if (g->p < g->end && *g->p == close) {
            g->p++;
            g->depth--;
            return v;
        }
        break;
    }
    cJSON_Delete(v);
    return NULL;
}

static cJSON *read_value(gin *g) {
    skip_ws(g);
    if (g->p >= g->end || g->depth >= MAX_DEPTH) return NULL;
    if (*g->p == '{' || *g->p == '[') return read_container(g);
    if (at(g, GQ) || *g->p == '"') {
        char *s = read_string(g);
        cJSON *v = s ? cJSON_CreateString(s) : NULL;
        free(s);
        return v;
    }
    if (word(g, "true") || word(g, "True")) return cJSON_CreateTrue();
    if (word(g, "false") || word(g, "False")) return cJSON_CreateFalse();
    if (word(g, "null") || word(g, "None")) return cJSON_CreateNull();
    size_t n = number_len(g->p, (size_t)(g->end - g->p));
    const char *after = g->p + n;
    if (!n || (after < g->end && !is_ws(*after) && !strchr(",}]", *after))) return NULL;
    char *t = strndup(g->p, n);
    cJSON *v = t ? cJSON_CreateRaw(t) : NULL; /* the number as written (no rounding) */
    free(t);
    if (v) g->p = after;
    return v;
}

int tools_gemma_call(out_parser *p, parse_out *o, const char *s, size_t n) {
    static const char open[] = "<|tool_call>", close[] = "<tool_call|>";
    size_t ol = sizeof open - 1, cl = sizeof close - 1;
    if (n < ol || memcmp(s, open, ol) != 0) return 0;
    gin g = {s + ol, s + n, 0};
    if (n - ol >= cl && !memcmp(s + n - cl, close, cl)) g.end -= cl;
    skip_ws(&g);
    if (!at(&g, "call:")) return 0;
    g.p += 5;
    const char *name = g.p;
    while (g.p < g.end && *g.p != '{' && !is_ws(*g.p) && !strchr("}<>,:[]\"", *g.p)) g.p++;
    size_t nl = (size_t)(g.p - name);
    skip_ws(&g);
    if (!nl || g.p >= g.end || *g.p != '{') return 0;
    cJSON *args = read_container(&g);
    skip_ws(&g);
    bool ok = args && g.p == g.end && tools_add_call(p, o, name, nl, args);
    cJSON_Delete(args);
    return ok ? 1 : 0;
}

/* ------------------------------------------------------------ writing -- */

/* jinja's dictsort: keys compared without case. */
static int key_cmp(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    int c = strcasecmp(x, y);
    return c ? c : strcmp(x, y);
}

/* The names of an object's members, sorted as the template writes them
 * (malloc'd; *n of them; NULL on none or out of memory). */
static const char **sorted_keys(const cJSON *obj, int *n) {
    *n = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        if (c->string) (*n)++;
    const char **k = *n ? malloc((size_t)*n * sizeof *k) : NULL;
    if (!k) return *n = 0, NULL;
    int i = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        if (c->string) k[i++] = c->string;
    qsort(k, (size_t)*n, sizeof *k, key_cmp);
    return k;
}

static void write_value(kvl_buf *out, const cJSON *v) {
    if (cJSON_IsString(v)) {
        kvl_buf_puts(out, GQ);
        kvl_buf_puts(out, v->valuestring);
        kvl_buf_puts(out, GQ);
    } else if (cJSON_IsObject(v)) {
        int n;
        const char **k = sorted_keys(v, &n);
        kvl_buf_puts(out, "{");
        for (int i = 0; i < n; i++) {
            kvl_buf_printf(out, "%s%s:", i ? "," : "", k[i]);
            write_value(out, cJSON_GetObjectItemCaseSensitive(v, k[i]));
        }
        kvl_buf_puts(out, "}");
        free(k);
    } else if (cJSON_IsArray(v)) {
        kvl_buf_puts(out, "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            write_value(out, c);
            if (c->next) kvl_buf_puts(out, ",");
        }
        kvl_buf_puts(out, "]");
    } else if (cJSON_IsRaw(v)) {
        kvl_buf_puts(out, v->valuestring);
    } else {
        char *t = cJSON_PrintUnformatted(v); /* numbers, true, false, null */
        if (t) kvl_buf_puts(out, t);
        free(t);
    }
}

void tools_gemma_write(const char *json, kvl_buf *out) {
    cJSON *v = tools_parse_json(json, strlen(json));
    if (cJSON_IsObject(v)) write_value(out, v);
    else kvl_buf_puts(out, json); /* not JSON (a placeholder): as it is */
    cJSON_Delete(v);
}

/* ------------------------------------------------------------ grammar -- */

/* The arguments' grammar follows the schema where it says: the types, enum and
 * const, anyOf / oneOf, an object's properties (in the template's sorted order,
 * the required ones always there, no others) and an array's items. Anything
 * else (a $ref, allOf, string lengths and patterns, number bounds, item
 * counts) allows any value of the type, or any value at all. */
typedef struct gconv {
    const char *prefix;
    kvl_buf *out;
    int counter;
} gconv;

static void expr_of(gconv *c, const cJSON *s, int depth, kvl_buf *e);

static const cJSON *get(const cJSON *s, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(s, k);
}

/* A new rule name <prefix>g<N>, written to name. */
static void rule_name(gconv *c, char *name, size_t cap) {
    snprintf(name, cap, "%sg%d", c->prefix, ++c->counter);
}

/* name ::= the schema's expression; the name is written to e. */
static void sub_rule(gconv *c, const cJSON *s, int depth, kvl_buf *e) {
    char name[48];
    rule_name(c, name, sizeof name);
    kvl_buf body = {0};
    expr_of(c, s, depth, &body);
    kvl_buf_printf(c->out, "%s ::= %s\n", name, body.p ? body.p : "\"\"");
    kvl_buf_free(&body);
    kvl_buf_puts(e, name);
}

static bool is_required(const cJSON *req, const char *k) {
    for (const cJSON *r = cJSON_IsArray(req) ? req->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, k)) return true;
    return false;
}

/* {k0:v0,k1:v1,...} with the keys sorted, the optional ones each left out or
 * not: for each i, R(i) is the rest after something was written, F(i) the
 * rest before anything was. */
static void object_expr(gconv *c, const cJSON *s, const cJSON *props, int depth, kvl_buf *e) {
    int n;
    const char **k = sorted_keys(props, &n);
    const cJSON *req = get(s, "required");
    char rest[48] = "", first[48] = ""; /* R(i+1), F(i+1); "" is empty */
    for (int i = n - 1; i >= 0; i--) {
        char kv[48];
        rule_name(c, kv, sizeof kv);
        kvl_buf body = {0};
        char *lit = NULL;
        if (asprintf(&lit, "%s:", k[i]) > 0) tools_gbnf_literal(&body, lit);
        free(lit);
        kvl_buf_puts(&body, " ");
        sub_rule(c, cJSON_GetObjectItemCaseSensitive(props, k[i]), depth + 1, &body);
        kvl_buf_printf(c->out, "%s ::= %s\n", kv, body.p ? body.p : "\"\"");
        kvl_buf_free(&body);
        bool must = is_required(req, k[i]);
        char r[48] = "", f[48] = ""; /* R(0) is never used, F(i) only after an optional key */
        if (i > 0) {
            rule_name(c, r, sizeof r);
            if (must) kvl_buf_printf(c->out, "%s ::= \",\" %s %s\n", r, kv, rest);
            else kvl_buf_printf(c->out, "%s ::= (\",\" %s)? %s\n", r, kv, rest);
        }
        if (i == 0 || !is_required(req, k[i - 1])) {
            rule_name(c, f, sizeof f);
            if (must) kvl_buf_printf(c->out, "%s ::= %s %s\n", f, kv, rest);
            else
                kvl_buf_printf(c->out, "%s ::= %s %s | %s\n", f, kv, rest,
                               first[0] ? first : "\"\"");
        }
        memcpy(rest, r, sizeof rest);
        memcpy(first, f, sizeof first);
    }
    free(k);
    kvl_buf_printf(e, "\"{\" %s \"}\"", first[0] ? first : "");
}

static void typed_expr(gconv *c, const cJSON *s, const char *t, int depth, kvl_buf *e) {
    const char *p = c->prefix;
    const cJSON *props = get(s, "properties"), *items = get(s, "items");
    if (!strcmp(t, "string")) kvl_buf_printf(e, "%sgstr", p);
    else if (!strcmp(t, "integer")) kvl_buf_printf(e, "%sgint", p);
    else if (!strcmp(t, "number")) kvl_buf_printf(e, "%sgnum", p);
    else if (!strcmp(t, "boolean")) kvl_buf_puts(e, "(\"true\" | \"false\")");
    else if (!strcmp(t, "null")) kvl_buf_puts(e, "\"null\"");
    else if (!strcmp(t, "object") && cJSON_IsObject(props) && props->child)
        object_expr(c, s, props, depth, e);
    else if (!strcmp(t, "object")) kvl_buf_printf(e, "%sgdict", p);
    else if (!strcmp(t, "array") && cJSON_IsObject(items)) {
        kvl_buf item = {0};
        sub_rule(c, items, depth + 1, &item);
        kvl_buf_printf(e, "\"[\" (%s (\",\" %s)*)? \"]\"", item.p, item.p);
        kvl_buf_free(&item);
    } else if (!strcmp(t, "array")) kvl_buf_printf(e, "%sgarr", p);
    else kvl_buf_printf(e, "%sgval", p);
}

static void expr_of(gconv *c, const cJSON *s, int depth, kvl_buf *e) {
    const char *p = c->prefix;
    if (!cJSON_IsObject(s) || depth > 32) {
        kvl_buf_printf(e, "%sgval", p);
        return;
    }
    const cJSON *en = get(s, "enum"), *cn = get(s, "const");
    const cJSON *any = get(s, "anyOf");
    if (!any) any = get(s, "oneOf");
    if (cn || (cJSON_IsArray(en) && en->child)) { /* the values as the template writes them */
        kvl_buf_puts(e, "(");
        for (const cJSON *v = cn ? cn : en->child; v; v = cn ? NULL : v->next) {
            kvl_buf lit = {0};
            write_value(&lit, v);
            kvl_buf_puts(&lit, "");
            if (v != (cn ? cn : en->child)) kvl_buf_puts(e, " | ");
            if (lit.p) tools_gbnf_literal(e, lit.p);
            kvl_buf_free(&lit);
        }
        kvl_buf_puts(e, ")");
        return;
    }
    if (cJSON_IsArray(any) && any->child) {
        kvl_buf_puts(e, "(");
        for (const cJSON *a = any->child; a; a = a->next) {
            if (a != any->child) kvl_buf_puts(e, " | ");
            sub_rule(c, a, depth + 1, e);
        }
        kvl_buf_puts(e, ")");
        return;
    }
    const cJSON *type = get(s, "type");
    if (cJSON_IsArray(type) && type->child) {
        kvl_buf_puts(e, "(");
        for (const cJSON *t = type->child; t; t = t->next) {
            if (t != type->child) kvl_buf_puts(e, " | ");
            typed_expr(c, s, cJSON_IsString(t) ? t->valuestring : "", depth, e);
        }
        kvl_buf_puts(e, ")");
        return;
    }
    const char *t = cJSON_IsString(type)   ? type->valuestring
                    : get(s, "properties") ? "object"
                    : get(s, "items")      ? "array"
                                           : "";
    typed_expr(c, s, t, depth, e);
}

bool tools_gemma_rules(const char *schema_json, const char *prefix, kvl_buf *out, char *err,
                       size_t err_cap) {
    cJSON *s = cJSON_Parse(schema_json);
    if (!s) {
        snprintf(err, err_cap, "the parameters schema is not JSON");
        return false;
    }
    gconv c = {prefix, out, 0};
    kvl_buf root = {0};
    expr_of(&c, s, 0, &root);
    cJSON_Delete(s);
    kvl_buf_printf(out, "%sroot ::= %s\n", prefix, root.p ? root.p : "\"\"");
    kvl_buf_free(&root);
    const char *p = prefix;
    /* A string's text never holds "<|" (so <|"|> always ends it). */
    kvl_buf_printf(out, "%sgstr ::= \"<|\\\"|>\" ([^<] | \"<\"+ [^<|])* \"<\"* \"<|\\\"|>\"\n", p);
    kvl_buf_printf(out, "%sgint ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n", p);
    kvl_buf_printf(out, "%sgnum ::= %sgint (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n", p, p);
    kvl_buf_printf(out,
                   "%sgval ::= %sgstr | %sgnum | \"true\" | \"false\" | \"null\" | %sgdict | "
                   "%sgarr\n",
                   p, p, p, p, p);
    kvl_buf_printf(out, "%sgkey ::= [a-zA-Z0-9_.\\-]{1,64}\n", p);
    kvl_buf_printf(out,
                   "%sgdict ::= \"{\" (%sgkey \":\" %sgval (\",\" %sgkey \":\" %sgval)*)? \"}\"\n",
                   p, p, p, p, p);
    kvl_buf_printf(out, "%sgarr ::= \"[\" (%sgval (\",\" %sgval)*)? \"]\"\n", p, p, p);
    if (out->oom) snprintf(err, err_cap, "out of memory");
    return !out->oom;
}
