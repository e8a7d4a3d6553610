/* JSON Schema -> GBNF (json_schema_to_gbnf in grammar.h).
 *
 * Every value rule ends with optional whitespace `<prefix>space`, which allows
 * nothing, one space, or one line break and up to 20 spaces/tabs: enough for
 * pretty-printed JSON, bounded so that a model cannot loop on whitespace.
 * Numbers are bounded too (16 integer digits, 16 fraction digits, 3 exponent
 * digits).
 *
 * Supported: type (also as an array), properties / required /
 * additionalProperties (true, false or a schema), items / prefixItems /
 * minItems / maxItems, enum, const, minLength / maxLength, pattern (a regex
 * subset, json_regex.c), format date / time / date-time / uuid / email / ipv4, integer
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum, number minimum 0,
 * anyOf, oneOf (as anyOf), allOf of objects, $ref to #, #/$defs/... and
 * #/definitions/... (recursive, but a $ref that reaches itself through $ref,
 * anyOf and oneOf alone, before any value begins, is refused: it would be a
 * left-recursive grammar). Annotations (title, description, default, examples, ...)
 * are ignored; any other keyword is an error naming it.
 *
 * Where JSON Schema allows more than a grammar can say simply, the grammar
 * allows a subset that always validates: properties come in schema order
 * (required ones first); an object schema that names properties gets no
 * others unless additionalProperties is true or a schema (an object schema
 * without properties gets any); additional property names never equal a
 * named one and use no escapes; a pattern is matched as if anchored;
 * February has 28 days.
 *
 * This file walks the schema (objects, arrays, anyOf/oneOf/allOf, $ref); the
 * scalar leaf rules and the primitive rules are in json_schema_formats.c. */
#include "json_schema_internal.h"

#include <stdlib.h>
#include <string.h>

static void json_literal(kvl_buf *o, const cJSON *v) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) {
        o->oom = true;
        return;
    }
    gbnf_append_literal(o, s, strlen(s));
    cJSON_free(s);
}

static bool is_annotation(const char *k) {
    static const char *const ann[] = {
        "title",         "description",      "default",         "examples", "$schema",
        "$id",           "$comment",         "deprecated",      "readOnly", "writeOnly",
        "discriminator", "contentMediaType", "contentEncoding", "$anchor",  "example"};
    for (size_t i = 0; i < sizeof ann / sizeof *ann; i++)
        if (strcmp(k, ann[i]) == 0) return true;
    return strncmp(k, "x-", 2) == 0;
}

static bool is_supported(const char *k) {
    static const char *const sup[] = {"type",
                                      "properties",
                                      "required",
                                      "additionalProperties",
                                      "items",
                                      "prefixItems",
                                      "minItems",
                                      "maxItems",
                                      "enum",
                                      "const",
                                      "minLength",
                                      "maxLength",
                                      "pattern",
                                      "format",
                                      "minimum",
                                      "maximum",
                                      "exclusiveMinimum",
                                      "exclusiveMaximum",
                                      "anyOf",
                                      "oneOf",
                                      "allOf",
                                      "$ref",
                                      "$defs",
                                      "definitions",
                                      "uniqueItems"};
    for (size_t i = 0; i < sizeof sup / sizeof *sup; i++)
        if (strcmp(k, sup[i]) == 0) return true;
    return false;
}

static bool visit(conv *c, const cJSON *s, const char *path, kvl_buf *expr);

/* A sub-schema as a rule of its own; its name is appended to expr. */
static bool sub_rule(conv *c, const cJSON *s, const char *path, const char *hint, kvl_buf *expr) {
    char name[96];
    new_name(c, hint, name, sizeof name);
    kvl_buf body = {0};
    bool ok = visit(c, s, path, &body);
    if (ok) kvl_buf_printf(c->out, "%s ::= %s\n", name, body.p ? body.p : "\"\"");
    kvl_buf_free(&body);
    kvl_buf_puts(expr, name);
    return ok;
}

/* ----------------------------------------------------------- objects -- */

/* Property names other than the named ones: a trie of the names, each node a
 * rule that may end the name (unless a named one ends there), take a child's
 * character, or any other character and then anything. No escapes, so that
 * "\u0061ge" cannot spell "age". Built breadth-first from the sorted names
 * (a node is a range of them and a depth) with a queue, not a call per
 * character: that recursion overflowed the stack on a 100 KB name, and
 * measuring every name at every depth was quadratic in its length. */
typedef struct {
    const char *s;
    size_t n;
} okey;

static int okey_cmp(const void *a, const void *b) {
    return strcmp(((const okey *)a)->s, ((const okey *)b)->s);
}

static void other_keys(conv *c, const char *base, char **keys, int nk, char *name, size_t cap) {
    struct node {
        int lo, hi, id;
        size_t depth;
    } *q = NULL;
    size_t n_q = 0, cap_q = 0;
    int next_id = 1;
    snprintf(name, cap, "%s-k0", base);
    okey *v = malloc((size_t)(nk > 0 ? nk : 1) * sizeof *v);
    if (!v || !kvl_grow((void **)&q, &cap_q, 1, sizeof *q, 64)) {
        c->out->oom = true;
        free(v);
        return;
    }
    for (int i = 0; i < nk; i++) v[i] = (okey){keys[i], strlen(keys[i])};
    qsort(v, (size_t)nk, sizeof *v, okey_cmp);
    q[n_q++] = (struct node){0, nk, 0, 0};
    for (size_t h = 0; h < n_q; h++) {
        const struct node nd = q[h];
        int i = nd.lo;
        bool ends = false, seen[128] = {0}; /* names ending here sort first */
        for (; i < nd.hi && v[i].n == nd.depth; i++) ends = true;
        kvl_buf body = {0};
        kvl_buf_puts(&body, ends ? "(" : "(\"\\\"\" | ");
        while (i < nd.hi) { /* the names going on with byte b */
            const unsigned char b = (unsigned char)v[i].s[nd.depth];
            int j = i + 1;
            while (j < nd.hi && (unsigned char)v[j].s[nd.depth] == b) j++;
            if (!kvl_grow((void **)&q, &cap_q, n_q + 1, sizeof *q, 64)) {
                c->out->oom = true;
                break;
            }
            q[n_q++] = (struct node){i, j, next_id, nd.depth + 1};
            seen[b & 0x7F] = true; /* plain names are ASCII */
            const char lit[1] = {(char)b};
            gbnf_append_literal(&body, lit, 1);
            kvl_buf_printf(&body, " %s-k%d | ", base, next_id++);
            i = j;
        }
        /* any other next character: an ASCII one not among the children
         * (names with non-ASCII characters are left out of the "other" set) */
        kvl_buf_puts(&body, "[^\"\\\\\\x00-\\x1F\\x80-\\U0010FFFF");
        for (int k = 0; k < 128; k++)
            if (seen[k]) kvl_buf_printf(&body, "\\x%02X", k);
        kvl_buf_printf(&body, "] %s-rest)", base);
        kvl_buf_printf(c->out, "%s-k%d ::= %s\n", base, nd.id, body.p);
        kvl_buf_free(&body);
    }
    free(q);
    free(v);
}

/* Name look-ups for objects of many properties without a scan per name
 * (50,000 required properties took 37 s): the member names of an object, or
 * the strings of an array, sorted for bsearch. NULL for none, or with *oom. */
static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char **sorted_names(const cJSON *x, int *n, bool *oom) {
    *n = cJSON_GetArraySize(x);
    const char **v = *n > 0 ? malloc((size_t)*n * sizeof *v) : NULL;
    *oom |= *n > 0 && !v;
    int i = 0;
    for (const cJSON *m = v ? x->child : NULL; m; m = m->next)
        v[i++] = cJSON_IsObject(x) ? m->string : m->valuestring;
    if (v) qsort(v, (size_t)*n, sizeof *v, str_cmp);
    return v;
}

static bool has_name(const char **v, int n, const char *s) {
    return v && bsearch(&s, v, (size_t)n, sizeof *v, str_cmp);
}

/* The optional properties kv[opt[lo..hi)], each present or not, in order:
 * appended to r (unless NULL), each with its comma (may be empty); to s, at least one,
 * the first without its comma. A tree of halves, s = s_lo r_hi | s_hi and
 * r = r_lo r_hi: rules linear in the number of properties, nested as deep as
 * its logarithm (one rule per k, "k then any later ones", was quadratic:
 * 4,000 properties made 479 MB of GBNF). */
static void optional_tree(conv *c, const kvl_buf *kv, const int *opt, int lo, int hi, kvl_buf *r,
                          kvl_buf *s) {
    if (hi - lo == 1) {
        if (r) kvl_buf_printf(r, "(\",\" %sspace %s)?", c->prefix, kv[opt[lo]].p);
        kvl_buf_puts(s, kv[opt[lo]].p);
        return;
    }
    const int mid = lo + (hi - lo) / 2;
    kvl_buf rl = {0}, sl = {0}, rh = {0}, sh = {0};
    optional_tree(c, kv, opt, lo, mid, r ? &rl : NULL, &sl);
    optional_tree(c, kv, opt, mid, hi, &rh, &sh);
    char name[96];
    if (r) { /* r is not needed at the top */
        new_name(c, "opt", name, sizeof name);
        kvl_buf_printf(c->out, "%s ::= %s %s\n", name, rl.p, rh.p);
        kvl_buf_puts(r, name);
    }
    new_name(c, "props", name, sizeof name);
    kvl_buf_printf(c->out, "%s ::= %s %s | %s\n", name, sl.p, rh.p, sh.p);
    kvl_buf_puts(s, name);
    kvl_buf_free(&rl), kvl_buf_free(&sl), kvl_buf_free(&rh), kvl_buf_free(&sh);
}

static bool object_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    const cJSON *props = get(s, "properties"), *req = get(s, "required"),
                *add = get(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return cfail(c, path, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return cfail(c, path, "'required' must be an array");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r)) return cfail(c, path, "'required' must list strings");
    int np = cJSON_GetArraySize(props), n_pn = 0, n_rn = 0;
    bool oom = false;
    const char **pn = props ? sorted_names(props, &n_pn, &oom) : NULL,
               **rn = req ? sorted_names(req, &n_rn, &oom) : NULL;
    kvl_buf *kv = calloc((size_t)np + 1, sizeof *kv);
    bool *is_req = calloc((size_t)np + 1, 1);
    char **keys = calloc((size_t)np + 1, sizeof *keys);
    bool ok = kv && is_req && keys && !oom;
    if (!ok) cfail(c, path, "out of memory");
    for (const cJSON *r = ok && req ? req->child : NULL; ok && r; r = r->next)
        if (!has_name(pn, n_pn, r->valuestring))
            ok = cfail(c, path, "required property '%s' is not in 'properties'", r->valuestring);
    free(pn);
    if (!ok) {
        free(rn), free(kv), free(is_req), free(keys);
        return false;
    }
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; ok && p; p = p->next, i++) {
        keys[i] = p->string;
        is_req[i] = has_name(rn, n_rn, p->string);
        cJSON *k = cJSON_CreateString(p->string);
        json_literal(&kv[i], k);
        cJSON_Delete(k);
        kvl_buf_printf(&kv[i], " %sspace \":\" %sspace ", c->prefix, c->prefix);
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, p->string);
        ok = sub_rule(c, p, sub, p->string, &kv[i]);
    }
    /* the additional properties' key-value rule, if any */
    char addkv[96] = "";
    /* Additional properties are generated only when the schema asks for them
     * (additionalProperties true or a schema) or names no property at all:
     * leaving out what a schema merely allows still validates. */
    if (ok && (add ? !cJSON_IsFalse(add) : np == 0)) {
        if (add && !cJSON_IsTrue(add) && !cJSON_IsObject(add))
            ok = cfail(c, path, "'additionalProperties' must be a boolean or a schema");
        new_name(c, "additional", addkv, sizeof addkv);
        kvl_buf val = {0};
        if (ok && add && cJSON_IsObject(add)) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            ok = sub_rule(c, add, sub, "additional", &val);
        } else {
            kvl_buf_printf(&val, "%svalue", c->prefix);
        }
        if (ok && np == 0) {
            kvl_buf_printf(c->out, "%s ::= %sstring \":\" %sspace %s\n", addkv, c->prefix,
                           c->prefix, val.p);
        } else if (ok) {
            char base[100], first[128];
            snprintf(base, sizeof base, "%s", addkv);
            /* only names an unescaped ASCII name could equal need excluding */
            char **plain = malloc((size_t)np * sizeof *plain);
            int n_plain = 0;
            for (int k = 0; plain && k < np; k++) {
                bool simple = true;
                for (const unsigned char *q = (const unsigned char *)keys[k]; *q; q++)
                    simple &= *q >= 0x20 && *q < 0x80 && *q != '"' && *q != '\\';
                if (simple) plain[n_plain++] = keys[k];
            }
            other_keys(c, base, plain, n_plain, first, sizeof first);
            free(plain);
            kvl_buf_printf(c->out, "%s-rest ::= [^\"\\\\\\x00-\\x1F]* \"\\\"\"\n", base);
            kvl_buf_printf(c->out, "%s ::= \"\\\"\" %s %sspace \":\" %sspace %s\n", addkv, first,
                           c->prefix, c->prefix, val.p);
        }
        kvl_buf_free(&val);
    }
    if (ok) {
        /* required ones in order, then each optional one maybe, then additional ones */
        kvl_buf_printf(e, "\"{\" %sspace ", c->prefix);
        bool any_req = false;
        for (i = 0; i < np; i++)
            if (is_req[i]) {
                if (any_req) kvl_buf_printf(e, "\",\" %sspace ", c->prefix);
                kvl_buf_printf(e, "%s ", kv[i].p);
                any_req = true;
            }
        int n_opt = 0, *opt = malloc((size_t)np * sizeof *opt + 1);
        for (i = 0; opt && i < np; i++)
            if (!is_req[i]) opt[n_opt++] = i;
        if (any_req) {
            for (int k = 0; k < n_opt; k++)
                kvl_buf_printf(e, "(\",\" %sspace %s)? ", c->prefix, kv[opt[k]].p);
            if (addkv[0]) kvl_buf_printf(e, "(\",\" %sspace %s)* ", c->prefix, addkv);
        } else if (n_opt > 0 || addkv[0]) {
            /* no required property: the first one present has no comma */
            kvl_buf_puts(e, "(");
            if (n_opt > 0) {
                optional_tree(c, kv, opt, 0, n_opt, NULL, e);
                if (addkv[0]) kvl_buf_printf(e, " (\",\" %sspace %s)* | ", c->prefix, addkv);
            }
            if (addkv[0]) kvl_buf_printf(e, "%s (\",\" %sspace %s)*", addkv, c->prefix, addkv);
            kvl_buf_puts(e, ")? ");
        }
        kvl_buf_printf(e, "\"}\" %sspace", c->prefix);
        free(opt);
    }
    for (i = 0; i < np; i++) kvl_buf_free(&kv[i]);
    free(kv);
    free(is_req);
    free(keys);
    free(rn);
    return ok;
}

/* ------------------------------------------------------------ arrays -- */

static bool array_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    const cJSON *items = get(s, "items"), *prefix = get(s, "prefixItems"),
                *uniq = get(s, "uniqueItems");
    long min = 0, max = -1;
    if (!get_count(c, s, "minItems", path, &min) || !get_count(c, s, "maxItems", path, &max))
        return false;
    if (max >= 0 && max < min) return cfail(c, path, "maxItems is below minItems");
    if (uniq && !cJSON_IsFalse(uniq)) return cfail(c, path, "'uniqueItems' is not supported");
    if (prefix && !cJSON_IsArray(prefix)) return cfail(c, path, "'prefixItems' must be an array");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return cfail(c, path, "'items' must be a schema");
    char sub[512];
    kvl_buf item = {0};
    bool more = !(items && cJSON_IsFalse(items)); /* items after the prefix allowed */
    bool ok = true;
    if (more) {
        snprintf(sub, sizeof sub, "%s/items", path);
        if (items && cJSON_IsObject(items)) ok = sub_rule(c, items, sub, "item", &item);
        else kvl_buf_printf(&item, "%svalue", c->prefix);
    }
    int k = cJSON_GetArraySize(prefix);
    if (max >= 0 && k > max) k = (int)max;
    if (!more && min > k) ok = ok && cfail(c, path, "minItems is larger than prefixItems allows");
    kvl_buf *pi = calloc((size_t)k + 1, sizeof *pi);
    if (!pi) ok = false;
    const cJSON *item_k = prefix ? prefix->child : NULL; /* item i (k <= the array's size) */
    for (int i = 0; ok && i < k; i++, item_k = item_k->next) {
        snprintf(sub, sizeof sub, "%s/prefixItems/%d", path, i);
        ok = sub_rule(c, item_k, sub, "prefix", &pi[i]);
    }
    if (ok) {
        /* the tail after the prefix: items, at least min - k, at most max - k */
        kvl_buf tail = {0};
        long tmin = min > k ? min - k : 0, tmax = max < 0 ? -1 : max - k;
        if (more && tmax != 0) {
            if (k == 0) { /* the first element has no comma */
                if (tmin == 0) {
                    kvl_buf_printf(&tail, "(%s (\",\" %sspace %s)", item.p, c->prefix, item.p);
                    if (tmax < 0) kvl_buf_puts(&tail, "*)?");
                    else kvl_buf_printf(&tail, "{0,%ld})?", tmax - 1);
                } else {
                    kvl_buf_printf(&tail, "%s (\",\" %sspace %s)", item.p, c->prefix, item.p);
                    if (tmax < 0) kvl_buf_printf(&tail, "{%ld,}", tmin - 1);
                    else kvl_buf_printf(&tail, "{%ld,%ld}", tmin - 1, tmax - 1);
                }
            } else {
                kvl_buf_printf(&tail, "(\",\" %sspace %s)", c->prefix, item.p);
                if (tmax < 0) kvl_buf_printf(&tail, "{%ld,}", tmin);
                else kvl_buf_printf(&tail, "{%ld,%ld}", tmin, tmax);
            }
        }
        /* element j is optional once j >= min: from the end, each optional one
         * a rule "(element j, then the rest)?" (rules, not nested groups, and
         * no copy of the rest per element: 4,000 items took 0.7 s) */
        kvl_buf rest = {0};
        kvl_buf_puts(&rest, tail.p ? tail.p : "");
        for (int j = k - 1; j >= 0 && j >= min; j--) {
            char name[96];
            new_name(c, "prefix", name, sizeof name);
            kvl_buf_printf(c->out, "%s ::= (", name);
            if (j > 0) kvl_buf_printf(c->out, "\",\" %sspace ", c->prefix);
            kvl_buf_printf(c->out, "%s %s)?\n", pi[j].p, rest.p ? rest.p : "");
            rest.len = 0;
            kvl_buf_puts(&rest, name);
        }
        kvl_buf_printf(e, "\"[\" %sspace ", c->prefix);
        for (int j = 0; j < k && j < min; j++) {
            if (j > 0) kvl_buf_printf(e, "\",\" %sspace ", c->prefix);
            kvl_buf_printf(e, "%s ", pi[j].p);
        }
        kvl_buf_printf(e, "%s \"]\" %sspace", rest.p ? rest.p : "", c->prefix);
        kvl_buf_free(&rest);
        kvl_buf_free(&tail);
    }
    for (int i = 0; pi && i < k; i++) kvl_buf_free(&pi[i]);
    free(pi);
    kvl_buf_free(&item);
    return ok;
}

/* -------------------------------------------------------------- refs -- */

static const cJSON *resolve(conv *c, const char *ref, const char *path) {
    if (strcmp(ref, "#") == 0) return c->root;
    const char *p = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) p = ref + 8;
    else if (strncmp(ref, "#/definitions/", 14) == 0) p = ref + 14;
    if (!p)
        return cfail(c, path,
                     "$ref '%s' is not supported (only #, #/$defs/... and #/definitions/...)", ref),
               NULL;
    const cJSON *defs = get(c->root, ref[2] == '$' ? "$defs" : "definitions");
    /* JSON pointer segments, ~1 = '/', ~0 = '~' */
    const cJSON *cur = defs;
    while (cur && *p) {
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/' && n < sizeof seg - 1; p++) {
            if (p[0] == '~' && p[1] == '1') seg[n++] = '/', p++;
            else if (p[0] == '~' && p[1] == '0') seg[n++] = '~', p++;
            else seg[n++] = *p;
        }
        seg[n] = 0;
        if (*p == '/') p++;
        cur = get(cur, seg);
    }
    if (!cur) return cfail(c, path, "$ref '%s' does not resolve", ref), NULL;
    return cur;
}

/* Notes that the rule being written reaches target `to` before consuming
 * input, from the $ref at path. */
static bool head_edge(conv *c, int to, const char *path) {
    if (!c->head || c->cur < 0) return true;
    if (!kvl_grow((void **)&c->edges, &c->cap_edges, c->n_edges + 1, sizeof *c->edges, 16))
        return cfail(c, path, "out of memory");
    char *site = strdup(path);
    if (!site) return cfail(c, path, "out of memory");
    c->edges[c->n_edges++] = (struct head_ref){c->cur, to, site};
    return true;
}

static bool ref_rule(conv *c, const char *ref, const char *path, kvl_buf *e) {
    for (int i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref) == 0) {
            kvl_buf_puts(e, c->refs[i].rule);
            return head_edge(c, i, path);
        }
    const cJSON *t = resolve(c, ref, path);
    if (!t) return false;
    if (c->n_refs == 256) return cfail(c, path, "more than 256 distinct $ref targets");
    char name[96];
    const char *slash = strrchr(ref, '/');
    new_name(c, slash ? slash + 1 : "ref", name, sizeof name);
    c->refs[c->n_refs].ref = strdup(ref);
    c->refs[c->n_refs].rule = strdup(name);
    if (!c->refs[c->n_refs].ref || !c->refs[c->n_refs].rule) return cfail(c, path, "out of memory");
    const int idx = c->n_refs++;
    if (!head_edge(c, idx, path)) return false;
    const int cur = c->cur;
    const bool head = c->head;
    c->cur = idx;
    c->head = true;
    kvl_buf body = {0};
    bool ok = visit(c, t, ref, &body);
    c->cur = cur;
    c->head = head;
    if (ok) kvl_buf_printf(c->out, "%s ::= %s\n", name, body.p);
    kvl_buf_free(&body);
    kvl_buf_puts(e, name);
    return ok;
}

/* A $ref rule that reaches itself through $refs met before any input is
 * consumed would be left-recursive GBNF (a rule that can expand forever
 * without reading a byte), which grammar_compile refuses: refuse the schema
 * instead, naming the $refs of the cycle, e.g. "#/anyOf/2 -> #". A depth-first
 * walk of the head edges; color 0 unseen, 1 on the walk, 2 done. */
static bool head_cycle_from(conv *c, int node, char *color, size_t *stack, int depth) {
    color[node] = 1;
    for (size_t i = 0; i < c->n_edges; i++) {
        if (c->edges[i].from != node) continue;
        const int to = c->edges[i].to;
        stack[depth] = i;
        if (color[to] == 1) {
            int first = depth;
            while (first > 0 && c->edges[stack[first]].from != to) first--;
            kvl_buf chain = {0};
            for (int k = first; k <= depth; k++)
                kvl_buf_printf(&chain, "%s -> ", c->edges[stack[k]].site);
            kvl_buf_puts(&chain, c->refs[to].ref);
            cfail(c, c->edges[stack[first]].site, "recursion without consuming input: %s",
                  chain.oom ? "?" : chain.p);
            kvl_buf_free(&chain);
            return true;
        }
        if (color[to] == 0 && head_cycle_from(c, to, color, stack, depth + 1)) return true;
    }
    color[node] = 2;
    return false;
}

static bool check_head_cycles(conv *c) {
    char color[256] = {0};
    size_t stack[256];
    for (int r = 0; r < c->n_refs; r++)
        if (color[r] == 0 && head_cycle_from(c, r, color, stack, 0)) return false;
    return true;
}

/* ------------------------------------------------------------- visit -- */

static bool alternatives(conv *c, const cJSON *arr, const char *path, const char *kw, kvl_buf *e) {
    if (!cJSON_IsArray(arr) || !arr->child)
        return cfail(c, path, "'%s' must be a non-empty array", kw);
    kvl_buf_puts(e, "(");
    int i = 0;
    for (const cJSON *x = arr->child; x; x = x->next, i++) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%s/%d", path, kw, i);
        if (i) kvl_buf_puts(e, " | ");
        if (!sub_rule(c, x, sub, kw, e)) return false;
    }
    kvl_buf_puts(e, ")");
    return true;
}

/* A property of an allOf member and its place among all members' ones. */
struct named {
    const cJSON *p;
    size_t pos;
};

static int named_cmp(const void *a, const void *b) {
    const struct named *x = a, *y = b;
    int c = strcmp(x->p->string, y->p->string);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* allOf: objects merged into one (properties and required lists joined). */
static bool all_of(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    const cJSON *arr = get(s, "allOf");
    if (!cJSON_IsArray(arr) || !arr->child)
        return cfail(c, path, "'allOf' must be a non-empty array");
    cJSON *merged = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    bool ok = merged && props && req;
    for (const cJSON *k = s->child; k; k = k->next)
        if (!is_annotation(k->string) && strcmp(k->string, "allOf") && strcmp(k->string, "$defs") &&
            strcmp(k->string, "definitions")) {
            cJSON_Delete(merged), cJSON_Delete(props), cJSON_Delete(req);
            return cfail(c, path,
                         "'%s' next to 'allOf' is not supported (put it inside the allOf members)",
                         k->string);
        }
    bool add_false = false;
    struct named *all = NULL; /* every member's properties, in order */
    size_t n_all = 0, cap_all = 0;
    for (const cJSON *x = arr->child; ok && x; x = x->next) {
        const cJSON *t = x;
        const cJSON *ref = get(x, "$ref");
        if (ref && cJSON_IsString(ref)) t = resolve(c, ref->valuestring, path);
        if (!t) {
            ok = false;
            break;
        }
        const cJSON *ty = get(t, "type");
        if (!(get(t, "properties") ||
              (ty && cJSON_IsString(ty) && strcmp(ty->valuestring, "object") == 0))) {
            ok = cfail(c, path, "'allOf' is only supported for object schemas");
            break;
        }
        for (const cJSON *k = t->child; ok && k; k = k->next) {
            if (is_annotation(k->string) || strcmp(k->string, "type") == 0) continue;
            if (strcmp(k->string, "properties") == 0) {
                if (!cJSON_IsObject(k)) ok = cfail(c, path, "'properties' must be an object");
                for (const cJSON *p = ok ? k->child : NULL; ok && p; p = p->next) {
                    ok = kvl_grow((void **)&all, &cap_all, n_all + 1, sizeof *all, 64);
                    if (ok) all[n_all] = (struct named){p, n_all}, n_all++;
                    else cfail(c, path, "out of memory");
                }
            } else if (strcmp(k->string, "required") == 0 && cJSON_IsArray(k)) {
                for (const cJSON *r = k->child; r; r = r->next)
                    cJSON_AddItemToArray(req, cJSON_Duplicate(r, true));
            } else if (strcmp(k->string, "additionalProperties") == 0 && cJSON_IsFalse(k)) {
                add_false = true;
            } else if (strcmp(k->string, "$defs") != 0 && strcmp(k->string, "definitions") != 0 &&
                       strcmp(k->string, "$ref") != 0) {
                ok = cfail(c, path, "'%s' inside 'allOf' is not supported", k->string);
            }
        }
    }
    /* each name once, where it comes last (a later member's schema wins),
     * in that order; sorted by name to find them, not a scan per property */
    if (ok && n_all) {
        qsort(all, n_all, sizeof *all, named_cmp);
        bool *drop = calloc(n_all, sizeof *drop);
        ok = drop || cfail(c, path, "out of memory");
        for (size_t i = 0; ok && i + 1 < n_all; i++)
            if (strcmp(all[i].p->string, all[i + 1].p->string) == 0) drop[all[i].pos] = true;
        const cJSON **in_order = ok ? malloc(n_all * sizeof *in_order) : NULL;
        ok = ok && (in_order || cfail(c, path, "out of memory"));
        for (size_t i = 0; ok && i < n_all; i++) in_order[all[i].pos] = all[i].p;
        for (size_t i = 0; ok && i < n_all; i++)
            if (!drop[i])
                cJSON_AddItemToObject(props, in_order[i]->string,
                                      cJSON_Duplicate(in_order[i], true));
        free(in_order);
        free(drop);
    }
    free(all);
    /* a member with additionalProperties false allows only its own names: every
     * property another member names must be among them */
    for (const cJSON *x = arr->child; ok && add_false && x; x = x->next) {
        const cJSON *t = get(x, "$ref") ? resolve(c, get(x, "$ref")->valuestring, path) : x;
        if (!t || !cJSON_IsFalse(get(t, "additionalProperties"))) continue;
        int n_own = 0;
        bool oom = false;
        const cJSON *own = get(t, "properties");
        const char **names = own ? sorted_names(own, &n_own, &oom) : NULL;
        if (oom) ok = cfail(c, path, "out of memory");
        for (const cJSON *p = props->child; ok && p; p = p->next)
            if (!has_name(names, n_own, p->string))
                ok = cfail(
                    c, path,
                    "allOf: property '%s' is excluded by a member with additionalProperties false",
                    p->string);
        free(names);
    }
    if (ok) {
        cJSON_AddStringToObject(merged, "type", "object");
        cJSON_AddItemToObject(merged, "properties", props);
        cJSON_AddItemToObject(merged, "required", req);
        props = req = NULL;
        if (add_false) cJSON_AddFalseToObject(merged, "additionalProperties");
        ok = object_rule(c, merged, path, e);
    }
    cJSON_Delete(merged);
    cJSON_Delete(props);
    cJSON_Delete(req);
    return ok;
}

/* enum: the values' JSON texts, as one tree of literals by common prefix
 * (gbnf_append_choice), so that thousands of values stay within the
 * matcher's bounds. */
static bool enum_rule(conv *c, const cJSON *en, const char *path, kvl_buf *e) {
    if (!cJSON_IsArray(en) || !en->child) return cfail(c, path, "'enum' must be a non-empty array");
    const size_t n = (size_t)cJSON_GetArraySize(en);
    char **txt = calloc(n, sizeof *txt);
    size_t *len = calloc(n, sizeof *len), i = 0;
    bool ok = txt && len;
    for (const cJSON *x = en->child; ok && x; x = x->next, i++) {
        ok = (txt[i] = cJSON_PrintUnformatted(x)) != NULL;
        if (ok) len[i] = strlen(txt[i]);
    }
    if (ok) {
        kvl_buf_puts(e, "(");
        gbnf_append_choice(e, (const char *const *)txt, len, n);
        kvl_buf_printf(e, ") %sspace", c->prefix);
    }
    for (i = 0; txt && i < n; i++) cJSON_free(txt[i]);
    free(txt);
    free(len);
    return ok || cfail(c, path, "out of memory");
}

static bool typed(conv *c, const cJSON *s, const char *type, const char *path, kvl_buf *e) {
    if (strcmp(type, "object") == 0) return object_rule(c, s, path, e);
    if (strcmp(type, "array") == 0) return array_rule(c, s, path, e);
    if (strcmp(type, "string") == 0) return js_string_rule(c, s, path, e);
    if (strcmp(type, "integer") == 0) return js_integer_rule(c, s, path, e);
    if (strcmp(type, "number") == 0) return js_number_rule(c, s, path, e);
    if (strcmp(type, "boolean") == 0) return kvl_buf_printf(e, "%sboolean", c->prefix), true;
    if (strcmp(type, "null") == 0) return kvl_buf_printf(e, "%snull", c->prefix), true;
    return cfail(c, path, "unknown type '%s'", type);
}

/* The type the keywords imply when 'type' is absent. */
static const char *implied_type(const cJSON *s) {
    static const char *const obj[] = {"properties", "required", "additionalProperties"};
    static const char *const arr[] = {"items", "prefixItems", "minItems", "maxItems"};
    static const char *const str[] = {"minLength", "maxLength", "pattern", "format"};
    static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 3; i++)
        if (get(s, obj[i])) return "object";
    for (int i = 0; i < 4; i++)
        if (get(s, arr[i])) return "array";
    for (int i = 0; i < 4; i++)
        if (get(s, str[i])) return "string";
    for (int i = 0; i < 4; i++)
        if (get(s, num[i])) return "number";
    return NULL;
}

static bool visit_node(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    if (c->failed) return false;
    if (cJSON_IsTrue(s)) return kvl_buf_printf(e, "%svalue", c->prefix), true;
    if (cJSON_IsFalse(s)) return cfail(c, path, "the schema 'false' allows no value");
    if (!cJSON_IsObject(s)) return cfail(c, path, "a schema must be an object or a boolean");
    for (const cJSON *k = s->child; k; k = k->next)
        if (!is_annotation(k->string) && !is_supported(k->string))
            return cfail(c, path, "unsupported JSON Schema keyword '%s'", k->string);
    const cJSON *ref = get(s, "$ref"), *cst = get(s, "const"), *en = get(s, "enum"),
                *type = get(s, "type");
    const cJSON *any = get(s, "anyOf") ? get(s, "anyOf") : get(s, "oneOf");
    const char *kw = get(s, "anyOf") ? "anyOf" : "oneOf";
    int combinators = !!ref + !!cst + !!en + !!any + !!get(s, "allOf");
    if (combinators > 1)
        return cfail(
            c, path,
            "combining $ref, const, enum, anyOf/oneOf and allOf in one schema is not supported");
    if (combinators == 1 && type && !(en || cst))
        return cfail(c, path, "'type' next to $ref/anyOf/oneOf/allOf is not supported");
    if (ref) {
        if (!cJSON_IsString(ref)) return cfail(c, path, "'$ref' must be a string");
        return ref_rule(c, ref->valuestring, path, e);
    }
    if (cst) {
        kvl_buf_puts(e, "(");
        json_literal(e, cst);
        kvl_buf_printf(e, ") %sspace", c->prefix);
        return true;
    }
    if (en) return enum_rule(c, en, path, e);
    if (any) return alternatives(c, any, path, kw, e);
    if (get(s, "allOf")) return all_of(c, s, path, e);
    if (type && cJSON_IsArray(type)) {
        if (!type->child) return cfail(c, path, "'type' must not be an empty array");
        kvl_buf_puts(e, "(");
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) return cfail(c, path, "'type' must list strings");
            if (t != type->child) kvl_buf_puts(e, " | ");
            if (!typed(c, s, t->valuestring, path, e)) return false;
        }
        kvl_buf_puts(e, ")");
        return true;
    }
    if (type && !cJSON_IsString(type))
        return cfail(c, path, "'type' must be a string or an array of strings");
    const char *t = type ? type->valuestring : implied_type(s);
    if (!t) return kvl_buf_printf(e, "%svalue", c->prefix), true;
    return typed(c, s, t, path, e);
}

/* Every schema but a $ref or an anyOf/oneOf begins by consuming input (a
 * value's first character): below it, a $ref is no longer at the head. */
static bool visit(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    const bool head = c->head;
    if (head && !(cJSON_IsObject(s) && (get(s, "$ref") || get(s, "anyOf") || get(s, "oneOf"))))
        c->head = false;
    bool ok = visit_node(c, s, path, e);
    c->head = head;
    return ok;
}

bool json_schema_to_gbnf(const char *schema_json, const char *prefix, kvl_buf *out,
                         kvl_error *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(schema_json, &end, true);
    if (!root) {
        return kvl_fail(err, "JSON schema: not valid JSON (near offset %d)",
                        end ? (int)(end - schema_json) : 0);
    }
    conv c = {.prefix = prefix ? prefix : "", .out = out, .err = err, .root = root, .cur = -1};
    kvl_buf body = {0};
    bool ok = visit(&c, root, "#", &body) && check_head_cycles(&c);
    if (ok) {
        kvl_buf_printf(out, "%sroot ::= %s\n", c.prefix, body.p);
        js_primitives(&c);
        if (out->oom) ok = kvl_fail(err, "JSON schema: out of memory");
    }
    kvl_buf_free(&body);
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref), free(c.refs[i].rule);
    for (size_t i = 0; i < c.n_edges; i++) free(c.edges[i].site);
    free(c.edges);
    cJSON_Delete(root);
    return ok;
}
