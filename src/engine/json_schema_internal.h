/* JSON Schema -> GBNF internals shared by json_schema.c (the walk over
 * objects, arrays, anyOf/allOf and $ref) and json_schema_formats.c (the
 * leaf rules: integer ranges, numbers, string formats/patterns/lengths, and
 * the primitive rules every grammar ends with). Not an API. The helpers are
 * static inline so both files use one definition without exporting generic
 * names such as get() from the library. */
#ifndef KVLLM_JSON_SCHEMA_INTERNAL_H
#define KVLLM_JSON_SCHEMA_INTERNAL_H

#include "grammar.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#define MAX_LEN   10000
#define INT_BOUND 9999999999999999LL /* 16 digits, as the unconstrained integer rule */

typedef struct conv {
    const char *prefix;
    kvl_buf *out;
    kvl_error *err;
    bool failed;
    const cJSON *root;
    struct {
        char *ref, *rule;
    } refs[256];
    int n_refs;
    int counter;
    /* Left recursion: while a $ref target's rule is being written, cur is its
     * index in refs (-1 in the root rule) and head says nothing consumes
     * input yet at this point of it (only $ref and anyOf/oneOf lead there);
     * every $ref met at the head is an edge of the graph that must have no
     * cycle. */
    int cur;
    bool head;
    struct head_ref {
        int from, to;
        char *site; /* the path of the schema holding the $ref */
    } * edges;
    size_t n_edges, cap_edges;
    bool date, time, uuid, email, ipv4;
} conv;

static inline bool cfail(conv *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline bool cfail(conv *c, const char *path, const char *fmt, ...) {
    char where[sizeof c->err->msg];
    snprintf(where, sizeof where, "JSON schema at %s", path);
    va_list ap;
    va_start(ap, fmt);
    kvl_vfail_first(c->err, &c->failed, where, fmt, ap);
    va_end(ap);
    return false;
}

/* A fresh rule name: prefix, a sanitized hint, a number. */
static inline void new_name(conv *c, const char *hint, char *name, size_t cap) {
    char h[40];
    size_t k = 0;
    for (const char *p = hint; *p && k < sizeof h - 1; p++)
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))
            h[k++] = *p;
    h[k] = 0;
    snprintf(name, cap, "%s%s-%d", c->prefix, k ? h : "v", ++c->counter);
}

static inline const cJSON *get(const cJSON *s, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(s, k);
}

static inline bool get_count(conv *c, const cJSON *s, const char *k, const char *path, long *v) {
    const cJSON *x = get(s, k);
    if (!x) return true;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble))
        return cfail(c, path, "'%s' must be a non-negative integer", k);
    if (x->valuedouble > MAX_LEN)
        return cfail(c, path, "'%s' above %d is not supported", k, MAX_LEN);
    *v = (long)x->valuedouble;
    return true;
}

/* json_schema_formats.c */
bool js_integer_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e);
bool js_number_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e);
bool js_string_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e);
/* The shared rules (space, value, string, ...) and the format rules the
 * schema used, appended to c->out after the root rule. */
void js_primitives(conv *c);

#endif
