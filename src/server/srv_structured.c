/* Structured output: the request fields that constrain generation, compiled
 * into one grammar that the job owns (job_free frees it).
 *
 *   response_format  {type: text | json_object | json_schema, json_schema: {name, schema, strict}}
 *                    (OpenAI; llama-server also reads {type: json_object, schema})
 *   grammar          GBNF text (llama-server)       guided_grammar  GBNF text (vLLM)
 *   json_schema      a schema object (llama-server) guided_json     a schema, object or JSON text (vLLM)
 *   guided_choice    array of strings (vLLM)        guided_regex    a regular expression (vLLM)
 *   structured_outputs  {json | regex | choice | grammar | json_object: true} (vLLM's newer form)
 *
 * At most one of them may constrain a request; a schema, regex or grammar
 * that does not compile is a 400 naming the field and the reason. */
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

static const cJSON *present(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A schema given as an object, a boolean or JSON text, as GBNF. */
static bool schema_gbnf(const cJSON *schema, const char *param, kvl_buf *g, api_error *err) {
    char *text = NULL;
    if (cJSON_IsString(schema)) text = strdup(schema->valuestring);
    else if (cJSON_IsObject(schema) || cJSON_IsBool(schema)) text = cJSON_PrintUnformatted(schema);
    else return api_fail(err, 400, param, "'%s' must be a JSON schema (an object)", param);
    if (!text) return api_fail(err, 500, NULL, "out of memory");
    kvl_error e = {{0}};
    kvl_buf_puts(g, "root ::= j-root\n");
    bool ok = json_schema_to_gbnf(text, "j-", g, &e);
    free(text);
    if (!ok) return api_fail(err, 400, param, "'%s': %s", param, e.msg);
    return true;
}

static bool response_format(const cJSON *rf, kvl_buf *g, bool *none, api_error *err) {
    if (!cJSON_IsObject(rf))
        return api_fail(err, 400, "response_format", "'response_format' must be an object");
    const cJSON *type = present(rf, "type");
    if (!cJSON_IsString(type))
        return api_fail(
            err, 400, "response_format",
            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    const char *t = type->valuestring;
    if (strcmp(t, "text") == 0) {
        *none = true;
        return true;
    }
    if (strcmp(t, "json_object") == 0) {
        const cJSON *schema = present(rf, "schema");
        if (schema) return schema_gbnf(schema, "response_format.schema", g, err);
        cJSON *o = cJSON_Parse("{\"type\":\"object\"}"); /* any JSON object */
        bool ok = o ? schema_gbnf(o, "response_format", g, err)
                    : api_fail(err, 500, NULL, "out of memory");
        cJSON_Delete(o);
        return ok;
    }
    if (strcmp(t, "json_schema") == 0) {
        const cJSON *js = present(rf, "json_schema");
        if (!cJSON_IsObject(js))
            return api_fail(err, 400, "response_format.json_schema",
                            "'response_format.json_schema' must be an object");
        const cJSON *strict = present(js, "strict");
        if (strict && !cJSON_IsBool(strict))
            return api_fail(err, 400, "response_format.json_schema.strict",
                            "'strict' must be a boolean");
        const cJSON *schema = present(js, "schema");
        if (!schema) { /* OpenAI makes the schema optional: then any JSON value */
            cJSON *any = cJSON_CreateObject();
            bool ok = any && schema_gbnf(any, "response_format.json_schema.schema", g, err);
            cJSON_Delete(any);
            return ok;
        }
        return schema_gbnf(schema, "response_format.json_schema.schema", g, err);
    }
    return api_fail(
        err, 400, "response_format.type",
        "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got \"%s\")",
        t);
}

/* guided_choice: any one of the strings, as a tree of literals by common
 * prefix (gbnf_append_choice), so that thousands of them stay within the
 * matcher's bounds. */
static bool choice_gbnf(const cJSON *v, const char *f, kvl_buf *g, api_error *err) {
    const size_t n = (size_t)cJSON_GetArraySize(v);
    const char **s = calloc(n, sizeof *s);
    size_t *len = calloc(n, sizeof *len), i = 0;
    bool ok = s && len;
    if (!ok) api_fail(err, 500, NULL, "out of memory");
    for (const cJSON *c = v->child; ok && c; c = c->next, i++) {
        if (!cJSON_IsString(c))
            ok = api_fail(err, 400, f, "'guided_choice' must be a non-empty array of strings");
        else s[i] = c->valuestring, len[i] = strlen(c->valuestring);
    }
    if (ok) {
        kvl_buf_puts(g, "root ::= ");
        gbnf_append_choice(g, s, len, n);
        kvl_buf_puts(g, "\n");
    }
    free(s);
    free(len);
    return ok;
}

/* One constraining field f (a name of parse_structured's list) as GBNF into
 * one; *none when it constrains nothing (response_format text). */
static bool constraint_gbnf(const char *f, const cJSON *v, kvl_buf *one, bool *none,
                            api_error *err) {
    if (strcmp(f, "response_format") == 0) return response_format(v, one, none, err);
    if (strcmp(f, "grammar") == 0 || strcmp(f, "guided_grammar") == 0) {
        if (!cJSON_IsString(v)) return api_fail(err, 400, f, "'%s' must be a string (GBNF)", f);
        kvl_buf_puts(one, v->valuestring);
        return true;
    }
    if (strcmp(f, "json_schema") == 0 || strcmp(f, "guided_json") == 0)
        return schema_gbnf(v, f, one, err);
    if (strcmp(f, "guided_choice") == 0) {
        if (!cJSON_IsArray(v) || !v->child)
            return api_fail(err, 400, f, "'guided_choice' must be a non-empty array of strings");
        return choice_gbnf(v, f, one, err);
    }
    /* guided_regex */
    kvl_error e = {{0}};
    if (!cJSON_IsString(v)) return api_fail(err, 400, f, "'guided_regex' must be a string");
    kvl_buf_puts(one, "root ::= r-root\n");
    if (!regex_to_gbnf(v->valuestring, "r-", false, one, &e))
        return api_fail(err, 400, f, "'guided_regex': %s", e.msg);
    return true;
}

/* vLLM's structured_outputs object (its successor of the guided_* fields):
 * exactly one of json, regex, choice, grammar or json_object true, read as
 * the guided_* field of that name. */
static bool structured_outputs(const cJSON *so, kvl_buf *one, bool *none, api_error *err) {
    static const char *const keys[][2] = {{"json", "guided_json"},
                                          {"regex", "guided_regex"},
                                          {"choice", "guided_choice"},
                                          {"grammar", "guided_grammar"},
                                          {"json_object", "response_format"}};
    const char *f = "structured_outputs";
    if (!cJSON_IsObject(so)) return api_fail(err, 400, f, "'%s' must be an object", f);
    const cJSON *v = NULL;
    const char *as = NULL;
    for (const cJSON *m = so->child; m; m = m->next) {
        if (cJSON_IsNull(m) || (cJSON_IsFalse(m) && !strcmp(m->string, "json_object"))) continue;
        size_t k = 0;
        while (k < sizeof keys / sizeof *keys && strcmp(m->string, keys[k][0])) k++;
        if (k == sizeof keys / sizeof *keys)
            return api_fail(err, 400, f,
                            "'%s.%.60s' is not supported (json, regex, choice, "
                            "grammar or json_object)",
                            f, m->string);
        if (v)
            return api_fail(err, 400, f, "'%s' holds more than one constraint (%s and %s)", f, as,
                            keys[k][0]);
        v = m;
        as = keys[k][0];
    }
    if (!v) {
        *none = true;
        return true;
    }
    if (strcmp(as, "json_object") == 0) {
        if (!cJSON_IsTrue(v)) return api_fail(err, 400, f, "'%s.json_object' must be a boolean", f);
        cJSON *rf = cJSON_Parse("{\"type\":\"json_object\"}");
        bool ok =
            rf ? response_format(rf, one, none, err) : api_fail(err, 500, NULL, "out of memory");
        cJSON_Delete(rf);
        return ok;
    }
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        if (!strcmp(as, keys[k][0])) return constraint_gbnf(keys[k][1], v, one, none, err);
    return false; /* unreachable */
}

bool parse_structured(srv *s, const cJSON *b, srv_job *j, api_error *err) {
    static const char *const fields[] = {"response_format", "grammar",           "json_schema",
                                         "guided_json",     "guided_choice",     "guided_regex",
                                         "guided_grammar",  "structured_outputs"};
    const char *which = NULL;
    kvl_buf g = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < sizeof fields / sizeof *fields; i++) {
        const char *f = fields[i];
        const cJSON *v = present(b, f);
        if (!v) continue;
        bool none = false;
        kvl_buf one = {0};
        ok = strcmp(f, "structured_outputs") == 0 ? structured_outputs(v, &one, &none, err)
                                                  : constraint_gbnf(f, v, &one, &none, err);
        if (ok && !none) {
            if (which)
                ok = api_fail(err, 400, f, "'%s' and '%s' both constrain the output; send only one",
                              which, f);
            which = f;
            kvl_buf_free(&g);
            g = one;
        } else {
            kvl_buf_free(&one);
        }
    }
    if (ok && which) {
        if (g.oom) ok = api_fail(err, 500, NULL, "out of memory");
        kvl_error e = {{0}};
        if (ok && !(j->grammar = grammar_compile(g.p ? g.p : "", s->vocab, &e)))
            ok = api_fail(err, 400, which, "'%s': %s", which, e.msg);
    }
    kvl_buf_free(&g);
    return ok;
}
