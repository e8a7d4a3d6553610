/* Tool calls in chat output, per format (srv_tools_int.h): where a call
 * region starts and ends in each format's markup, and how its calls are read
 * into tool_call_out (JSON, XML-like, GLM and the others listed in
 * srv_tools.h). The streaming parser that finds the regions in generated text
 * is srv_tool_stream.c; split from srv_tools.c to keep files under 800 lines. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "srv_tools_int.h"

/* "call_" + 24 letters and digits, as OpenAI's ids look. */
static void call_id(char out[40]) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(out, "call_", 5);
    uint64_t r = 0;
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0) r = kvl_random_u64(); /* 8 digits use 48 of its 64 bits */
        out[5 + i] = alphabet[r % 62];
        r /= 62;
    }
    out[29] = 0;
}

void parse_out_reset(parse_out *o) {
    o->content.len = 0;
    o->reasoning.len = 0;
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    o->n_calls = 0;
}

void parse_out_free(parse_out *o) {
    parse_out_reset(o);
    kvl_buf_free(&o->content);
    kvl_buf_free(&o->reasoning);
    free(o->calls);
    memset(o, 0, sizeof *o);
}

bool tools_add_call(out_parser *p, parse_out *o, const char *name, size_t name_len,
                    const cJSON *args) {
    if (!p->tools->parallel && p->n_calls > 0)
        return true; /* parallel_tool_calls false: the first only */
    if (!kvl_grow((void **)&o->calls, &o->cap_calls, (size_t)o->n_calls + 1, sizeof *o->calls, 4))
        return false;
    tool_call_out *c = &o->calls[o->n_calls];
    call_id(c->id);
    c->name = strndup(name, name_len);
    c->arguments = args ? cJSON_PrintUnformatted(args) : strdup("{}");
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return false;
    }
    o->n_calls++;
    p->n_calls++;
    return true;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* End of the JSON object or array at s[0..n) (just after its closing bracket);
 * 0 while it is incomplete. Brackets inside strings do not count. */
size_t tools_json_extent(const char *s, size_t n) {
    int depth = 0;
    bool str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') str = false;
            continue;
        }
        if (c == '"') str = true;
        else if (c == '{' || c == '[') depth++;
        else if ((c == '}' || c == ']') && --depth <= 0) return i + 1;
    }
    return 0;
}

cJSON *tools_parse_json(const char *s, size_t n) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, false);
    if (!v) return NULL;
    while (end < s + n && is_ws(*end)) end++;
    if (end != s + n) {
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

/* A call given as arguments JSON (an object, or a string that holds one). */
static bool add_call_json_args(out_parser *p, parse_out *o, const char *name, size_t nlen,
                               const cJSON *args) {
    if (cJSON_IsString(args)) {
        cJSON *inner = tools_parse_json(args->valuestring, strlen(args->valuestring));
        bool ok = cJSON_IsObject(inner) && tools_add_call(p, o, name, nlen, inner);
        cJSON_Delete(inner);
        return ok;
    }
    if (!args) return tools_add_call(p, o, name, nlen, NULL);
    return cJSON_IsObject(args) && tools_add_call(p, o, name, nlen, args);
}

static bool known_name(const out_parser *p, const char *name) {
    for (int i = 0; i < p->tools->n; i++)
        if (!strcmp(p->tools->names[i], name)) return true;
    return false;
}

/* {"name": N, "arguments"|"parameters": {...}} (also {"function": {...}}). */
static bool add_call_object(out_parser *p, parse_out *o, const cJSON *obj, bool need_known) {
    if (!cJSON_IsObject(obj)) return false;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(obj, "function");
    if (cJSON_IsObject(fn)) obj = fn;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    if (!name) name = cJSON_GetObjectItemCaseSensitive(obj, "tool_name"); /* Command R7B */
    if (!name && p->fmt == TOOL_FMT_APERTUS && obj->child &&
        !obj->child->next) /* Apertus: {NAME: {...}} */
        return add_call_json_args(p, o, obj->child->string, strlen(obj->child->string), obj->child);
    if (!cJSON_IsString(name) || !name->valuestring[0]) return false;
    if (need_known && !known_name(p, name->valuestring)) return false;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    return add_call_json_args(p, o, name->valuestring, strlen(name->valuestring), args);
}

/* A JSON text of one call object or an array of them. Returns calls added. */
int tools_add_calls_json(out_parser *p, parse_out *o, const char *s, size_t n, bool need_known) {
    cJSON *v = tools_parse_json(s, n);
    int before = o->n_calls;
    if (cJSON_IsArray(v)) {
        for (const cJSON *c = v->child; c; c = c->next)
            if (!add_call_object(p, o, c, need_known)) break;
    } else if (cJSON_IsObject(v)) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, "tool_calls");
        if (cJSON_IsArray(list)) {
            for (const cJSON *c = list->child; c; c = c->next)
                if (!add_call_object(p, o, c, need_known)) break;
        } else {
            add_call_object(p, o, v, need_known);
        }
    }
    cJSON_Delete(v);
    return o->n_calls - before;
}

/* The type a function's schema gives parameter key ("" if none). */
static const char *param_type(const out_parser *p, const char *fn, const char *key) {
    for (int i = 0; i < p->tools->n; i++) {
        if (strcmp(p->tools->names[i], fn) != 0 || !p->tools->params[i]) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(p->tools->params[i], "properties");
        const cJSON *type =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
        return cJSON_IsString(type) ? type->valuestring : "";
    }
    return "";
}

static cJSON *param_value(const out_parser *p, const char *fn, const char *key, const char *v,
                          size_t vn);

/* The tags of an XML-like call: fn_open NAME name_end ... (param_open KEY
 * key_end[ attributes]> VALUE param_close)* fn_close. */
typedef struct xml_tags {
    const char *fn_open, *name_end, *param_open, *key_end, *param_close, *fn_close;
} xml_tags;

static const xml_tags XML_QWEN = {"<function=",   ">",          "<parameter=", ">",
                                  "</parameter>", "</function>"};
static const xml_tags XML_MINIMAX = {"<invoke name=\"", "\">",      "<parameter name=\"", "\"",
                                     "</parameter>",    "</invoke>"};
static const xml_tags XML_MINICPM = {"<function name=\"", "\">",        "<param name=\"", "\"",
                                     "</param>",          "</function>"};
static const xml_tags XML_DSML = {DSML "invoke name=\"",       "\">",
                                  DSML "parameter name=\"",    "\"",
                                  "</" DSML_BARE "parameter>", "</" DSML_BARE "invoke>"};

/* Every call of s[0..n) written with tags t; a value is JSON unless the
 * schema says string (what Qwen3-Coder's and MiniMax's own parsers do).
 * Returns false at the first malformed call. */
static bool add_calls_xml(out_parser *p, parse_out *o, const xml_tags *t, const char *s, size_t n) {
    const char *end = s + n, *q = s;
    bool any = false;
    for (;;) {
        const char *f = find_n(q, (size_t)(end - q), t->fn_open);
        if (!f) return any;
        const char *nm = f + strlen(t->fn_open);
        const char *ne = find_n(nm, (size_t)(end - nm), t->name_end);
        const char *fe = ne ? find_n(ne, (size_t)(end - ne), t->fn_close) : NULL;
        if (!ne) return false;
        if (!fe) fe = end; /* the output ended inside the call */
        char *name = strndup(nm, (size_t)(ne - nm));
        cJSON *args = cJSON_CreateObject();
        bool ok = name && args && name[0];
        const char *r = ne + strlen(t->name_end);
        const char *body = r;
        size_t bodyn = (size_t)(fe - r);
        trim(&body, &bodyn);
        if (ok && bodyn &&
            body[0] == '{') { /* arguments as one JSON object (constrained calls write them so) */
            cJSON_Delete(args);
            args = tools_parse_json(body, bodyn);
            ok = cJSON_IsObject(args);
        }
        while (ok && !(bodyn && body[0] == '{')) {
            const char *pr = find_n(r, (size_t)(fe - r), t->param_open);
            if (!pr) break;
            const char *k = pr + strlen(t->param_open);
            const char *ke = find_n(k, (size_t)(fe - k), t->key_end);
            const char *gt = ke ? memchr(ke, '>', (size_t)(fe - ke)) : NULL;
            const char *pe = gt ? find_n(gt, (size_t)(fe - gt), t->param_close) : NULL;
            if (!pe) {
                ok = false;
                break;
            }
            char *key = strndup(k, (size_t)(ke - k));
            const char *v = gt + 1;
            size_t vn = (size_t)(pe - v);
            if (vn && v[0] == '\n') v++, vn--; /* templates write the value on its own line */
            if (vn && v[vn - 1] == '\n') vn--;
            cJSON *val = key ? param_value(p, name, key, v, vn) : NULL;
            ok = key && val && cJSON_AddItemToObject(args, key, val);
            if (!ok) cJSON_Delete(val);
            free(key);
            r = pe + strlen(t->param_close);
        }
        ok = ok && tools_add_call(p, o, name, strlen(name), args);
        free(name);
        cJSON_Delete(args);
        if (!ok) return false;
        any = true;
        q = fe;
    }
}

/* A parameter value of the XML-like formats: JSON unless the function's
 * schema says string (what the models' own parsers do). */
/* A Python literal (what str() of a dict or list prints, as Seed-OSS's and
 * MiniCPM's templates show values: {'city': 'Paris', 'ok': True}) as JSON;
 * NULL when it is not one. */
static cJSON *parse_py_literal(const char *v, size_t n) {
    kvl_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (c == '\'' || c == '"') { /* a string: re-quoted, escapes kept, a bare " escaped */
            kvl_buf_puts(&b, "\"");
            size_t j = i + 1;
            for (; j < n && v[j] != c; j++) {
                if (v[j] == '\\' && j + 1 < n) {
                    if (v[j + 1] == '\'') kvl_buf_puts(&b, "'");
                    else kvl_buf_put(&b, v + j, 2);
                    j++;
                } else if (v[j] == '"') {
                    kvl_buf_puts(&b, "\\\"");
                } else {
                    kvl_buf_put(&b, v + j, 1);
                }
            }
            if (j >= n) break; /* unterminated */
            kvl_buf_puts(&b, "\"");
            i = j;
        } else if (!strncmp(v + i, "True", 4) &&
                   (i + 4 >= n || !isalnum((unsigned char)v[i + 4]))) {
            kvl_buf_puts(&b, "true"), i += 3;
        } else if (!strncmp(v + i, "False", 5) &&
                   (i + 5 >= n || !isalnum((unsigned char)v[i + 5]))) {
            kvl_buf_puts(&b, "false"), i += 4;
        } else if (!strncmp(v + i, "None", 4) &&
                   (i + 4 >= n || !isalnum((unsigned char)v[i + 4]))) {
            kvl_buf_puts(&b, "null"), i += 3;
        } else {
            kvl_buf_put(&b, &c, 1);
        }
    }
    cJSON *j = b.p && !b.oom ? tools_parse_json(b.p, b.len) : NULL;
    kvl_buf_free(&b);
    return j;
}

static cJSON *param_value(const out_parser *p, const char *fn, const char *key, const char *v,
                          size_t vn) {
    cJSON *val = NULL;
    if (strcmp(param_type(p, fn, key), "string") != 0) {
        val = tools_parse_json(v, vn);
        if (!val && vn && (v[0] == '{' || v[0] == '[')) val = parse_py_literal(v, vn);
    }
    if (!val) {
        char *sv = strndup(v, vn);
        val = sv ? cJSON_CreateString(sv) : NULL;
        free(sv);
    }
    return val;
}

/* NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>... (GLM 4.5/4.6) */
static bool add_call_glm(out_parser *p, parse_out *o, const char *s, size_t n) {
    const char *end = s + n, *q = s;
    while (q < end && *q != '\n' && *q != '<') q++;
    const char *name = s;
    size_t nl = (size_t)(q - s);
    trim(&name, &nl);
    char *fn = strndup(name, nl);
    cJSON *args = cJSON_CreateObject();
    bool ok = fn && args && nl;
    while (ok) {
        const char *k = find_n(q, (size_t)(end - q), "<arg_key>");
        if (!k) break;
        const char *ke = find_n(k, (size_t)(end - k), "</arg_key>");
        const char *v = ke ? find_n(ke, (size_t)(end - ke), "<arg_value>") : NULL;
        const char *ve = v ? find_n(v, (size_t)(end - v), "</arg_value>") : NULL;
        if (!ve) {
            ok = false;
            break;
        }
        char *key = strndup(k + 9, (size_t)(ke - k - 9));
        cJSON *val = key ? param_value(p, fn, key, v + 11, (size_t)(ve - v - 11)) : NULL;
        ok = key && val && cJSON_AddItemToObject(args, key, val);
        if (!ok) cJSON_Delete(val);
        free(key);
        q = ve + 12;
    }
    ok = ok && tools_add_call(p, o, fn, nl, args);
    free(fn);
    cJSON_Delete(args);
    return ok;
}

/* ---- regions: the span of text holding one format's call(s) ---- */

/* The markers that open a call region in format f (*n of them). */
const char *const *tools_start_markers(tool_format f, int *n) {
    static const char *const hermes[] = {"<tool_call>"};
    static const char *const llama3[] = {"<|python_tag|>"};
    static const char *const mistral[] = {"[TOOL_CALLS]"};
    static const char *const deepseek[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN};
    static const char *const kimi[] = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>"};
    static const char *const functionary[] = {"<function="};
    static const char *const apriel[] = {"<tool_calls>"};
    static const char *const cohere[] = {"<|START_ACTION|>"};
    static const char *const apertus[] = {"<|tools_prefix|>"};
    static const char *const granite[] = {"<|tool_call|>"};
    static const char *const seed[] = {"<seed:tool_call>"};
    static const char *const minimax[] = {"<minimax:tool_call>"};
    static const char *const minicpm[] = {"<function name=\""};
    static const char *const dsml[] = {DSML "tool_calls>"};
    static const char *const dsml_v32[] = {DSML "function_calls>"};
    static const char *const gigachat[] = {"<|function_call|>"};
    static const char *const solar[] = {"<|tool_calls|>", "<|tool_call:begin|>"};
    static const char *const gemma4[] = {"<|tool_call>"};
    switch (f) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML:
    case TOOL_FMT_GLM: *n = 1; return hermes;
    case TOOL_FMT_LLAMA3: *n = 1; return llama3;
    case TOOL_FMT_MISTRAL:
    case TOOL_FMT_MISTRAL_V11: *n = 1; return mistral;
    case TOOL_FMT_DEEPSEEK:
    case TOOL_FMT_DEEPSEEK_R1: *n = 2; return deepseek;
    case TOOL_FMT_KIMI: *n = 2; return kimi;
    case TOOL_FMT_FUNCTIONARY: *n = 1; return functionary;
    case TOOL_FMT_APRIEL: *n = 1; return apriel;
    case TOOL_FMT_COMMAND_R7B: *n = 1; return cohere;
    case TOOL_FMT_APERTUS: *n = 1; return apertus;
    case TOOL_FMT_GRANITE: *n = 1; return granite;
    case TOOL_FMT_SEED_OSS: *n = 1; return seed;
    case TOOL_FMT_MINIMAX: *n = 1; return minimax;
    case TOOL_FMT_MINICPM: *n = 1; return minicpm;
    case TOOL_FMT_DSML: *n = 1; return dsml;
    case TOOL_FMT_DSML_V32: *n = 1; return dsml_v32;
    case TOOL_FMT_GIGACHAT: *n = 1; return gigachat;
    case TOOL_FMT_SOLAR_OPEN: *n = 2; return solar;
    case TOOL_FMT_GEMMA4: *n = 1; return gemma4;
    default: *n = 0; return NULL;
    }
}

/* The marker closing a format's JSON list of calls (NULL: none). */
static const char *list_close(tool_format f) {
    switch (f) {
    case TOOL_FMT_APRIEL: return "</tool_calls>";
    case TOOL_FMT_COMMAND_R7B: return "<|END_ACTION|>";
    case TOOL_FMT_APERTUS: return "<|tools_suffix|>";
    default: return NULL;
    }
}

/* Length of the call region that starts at s (with marker m), 0 while
 * incomplete. final: the output ended, so an unclosed region runs to the end. */
size_t tools_region_len(tool_format f, const char *m, const char *s, size_t n, bool final) {
    size_t ml = strlen(m), k = ml;
    const char *endm = NULL;
    switch (f) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML:
    case TOOL_FMT_GLM: endm = "</tool_call>"; break;
    case TOOL_FMT_FUNCTIONARY:
    case TOOL_FMT_MINICPM: endm = "</function>"; break;
    case TOOL_FMT_SEED_OSS: endm = "</seed:tool_call>"; break;
    case TOOL_FMT_MINIMAX: endm = "</minimax:tool_call>"; break;
    case TOOL_FMT_DSML: endm = "</" DSML_BARE "tool_calls>"; break;
    case TOOL_FMT_DSML_V32: endm = "</" DSML_BARE "function_calls>"; break;
    case TOOL_FMT_GEMMA4: endm = "<tool_call|>"; break;
    case TOOL_FMT_DEEPSEEK:
    case TOOL_FMT_DEEPSEEK_R1:
        endm = !strcmp(m, DS_CALLS_BEGIN) ? DS_CALLS_END : DS_CALL_END;
        break;
    case TOOL_FMT_KIMI:
        endm = !strcmp(m, "<|tool_calls_section_begin|>") ? "<|tool_calls_section_end|>"
                                                          : "<|tool_call_end|>";
        break;
    case TOOL_FMT_SOLAR_OPEN:
        endm = !strcmp(m, "<|tool_calls|>") ? "<|calls|>" : "<|tool_call:end|>";
        break;
    case TOOL_FMT_MISTRAL_V11: {
        while (k < n && is_ws(s[k])) k++;
        if (k < n && s[k] == '[' && (n - k < 2 || s[k + 1] == '{' || is_ws(s[k + 1])))
            break; /* the older JSON list */
        const char *a = find_n(s + ml, n - ml, "[ARGS]");
        if (!a) return final ? n : 0;
        k = (size_t)(a - s) + 6;
        break;
    }
    default: break;
    }
    if (endm) {
        const char *e = find_n(s + ml, n - ml, endm);
        return e ? (size_t)(e - s) + strlen(endm) : final ? n : 0;
    }
    /* The region is the marker and one JSON value. */
    while (k < n && is_ws(s[k])) k++;
    if (k == n) return final ? n : 0;
    /* No JSON after the marker: not a call (the marker stays text); <|python_tag|>
     * code runs to the end of the output. */
    if (s[k] != '{' && s[k] != '[') return f == TOOL_FMT_LLAMA3 ? (final ? n : 0) : k;
    size_t e = tools_json_extent(s + k, n - k);
    if (!e) return final ? n : 0;
    const char *close = list_close(f);
    if (!close) return k + e;
    /* the list's closing marker belongs to the region (wait until it is there or cannot be) */
    size_t c = k + e;
    while (c < n && is_ws(s[c])) c++;
    size_t cl = strlen(close), have = n - c < cl ? n - c : cl;
    if (memcmp(s + c, close, have) != 0) return k + e;
    if (have < cl) return final ? k + e : 0;
    return c + cl;
}

/* Parses one region into calls; returns how many it held. */
int tools_parse_region(out_parser *p, parse_out *o, const char *m, const char *s, size_t n) {
    int before = o->n_calls;
    size_t ml = strlen(m);
    const char *b = s + ml;
    size_t bn = n - ml;
    switch (p->fmt) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML: {
        const char *e = find_n(b, bn, "</tool_call>");
        if (e) bn = (size_t)(e - b);
        trim(&b, &bn);
        if (bn && b[0] == '{') tools_add_calls_json(p, o, b, bn, false);
        else add_calls_xml(p, o, &XML_QWEN, b, bn);
        break;
    }
    case TOOL_FMT_SEED_OSS: add_calls_xml(p, o, &XML_QWEN, s, n); break;
    case TOOL_FMT_MINIMAX: add_calls_xml(p, o, &XML_MINIMAX, s, n); break;
    case TOOL_FMT_MINICPM: add_calls_xml(p, o, &XML_MINICPM, s, n); break;
    case TOOL_FMT_DSML:
    case TOOL_FMT_DSML_V32: add_calls_xml(p, o, &XML_DSML, s, n); break;
    case TOOL_FMT_GEMMA4: tools_gemma_call(p, o, s, n); break;
    case TOOL_FMT_GLM: {
        const char *e = find_n(b, bn, "</tool_call>");
        if (e) bn = (size_t)(e - b);
        trim(&b, &bn);
        if (bn && b[0] == '{') tools_add_calls_json(p, o, b, bn, false);
        else add_call_glm(p, o, b, bn);
        break;
    }
    case TOOL_FMT_FUNCTIONARY: {
        const char *gt = memchr(b, '>', bn);
        if (!gt) break;
        const char *a = gt + 1;
        size_t an = (size_t)(s + n - a);
        const char *e = find_n(a, an, "</function>");
        if (e) an = (size_t)(e - a);
        cJSON *args = tools_parse_json(a, an);
        if (cJSON_IsObject(args)) tools_add_call(p, o, b, (size_t)(gt - b), args);
        cJSON_Delete(args);
        break;
    }
    case TOOL_FMT_LLAMA3:
    case TOOL_FMT_MISTRAL:
    case TOOL_FMT_GRANITE:
    case TOOL_FMT_GIGACHAT: tools_add_calls_json(p, o, b, bn, false); break;
    case TOOL_FMT_APRIEL:
    case TOOL_FMT_COMMAND_R7B:
    case TOOL_FMT_APERTUS: {
        const char *close = list_close(p->fmt);
        const char *e = find_n(b, bn, close);
        if (e && e + strlen(close) == s + n) bn = (size_t)(e - b); /* the region ends with it */
        tools_add_calls_json(p, o, b, bn, false);
        break;
    }
    case TOOL_FMT_MISTRAL_V11: {
        const char *a = find_n(b, bn, "[ARGS]");
        if (!a) {
            tools_add_calls_json(p, o, b, bn, false);
            break;
        }
        const char *name = b;
        size_t nl = (size_t)(a - b);
        const char *cid = find_n(name, nl, "[CALL_ID]");
        if (cid) nl = (size_t)(cid - name);
        trim(&name, &nl);
        cJSON *args = tools_parse_json(a + 6, (size_t)(s + n - a - 6));
        if (nl && cJSON_IsObject(args)) tools_add_call(p, o, name, nl, args);
        cJSON_Delete(args);
        break;
    }
    case TOOL_FMT_DEEPSEEK:
    case TOOL_FMT_DEEPSEEK_R1:
    case TOOL_FMT_KIMI:
    case TOOL_FMT_SOLAR_OPEN: {
        bool kimi = p->fmt == TOOL_FMT_KIMI, solar = p->fmt == TOOL_FMT_SOLAR_OPEN;
        const char *cb = kimi    ? "<|tool_call_begin|>"
                         : solar ? "<|tool_call:name|>"
                                 : DS_CALL_BEGIN;
        const char *sep = kimi    ? "<|tool_call_argument_begin|>"
                          : solar ? "<|tool_call:args|>"
                                  : DS_SEP;
        const char *ce = kimi ? "<|tool_call_end|>" : solar ? "<|tool_call:end|>" : DS_CALL_END;
        const char *q = s, *end = s + n;
        for (;;) { /* (Solar Open: from the name on, past <|tool_call:begin|> and the id) */
            const char *c = find_n(q, (size_t)(end - q), cb);
            if (!c) break;
            c += strlen(cb);
            const char *sp = find_n(c, (size_t)(end - c), sep);
            if (!sp) break;
            const char *a = sp + strlen(sep);
            const char *e = find_n(a, (size_t)(end - a), ce);
            size_t an = e ? (size_t)(e - a) : (size_t)(end - a);
            const char *name = c;
            size_t nl = (size_t)(sp - c);
            if (kimi) { /* functions.NAME:IDX */
                if (nl > 10 && !memcmp(name, "functions.", 10)) name += 10, nl -= 10;
                const char *colon = memrchr(name, ':', nl);
                if (colon) nl = (size_t)(colon - name);
            } else if (nl == 8 && !memcmp(name, "function",
                                          8)) { /* R1: function<sep>NAME\n```json\n{...}\n``` */
                const char *nlp = memchr(a, '\n', an);
                if (!nlp) break;
                name = a;
                nl = (size_t)(nlp - a);
                const char *j = find_n(nlp, an - (size_t)(nlp - a), "```json");
                if (j) {
                    a = j + 7;
                    an = (size_t)((e ? e : end) - a);
                    const char *fence = find_n(a, an, "```");
                    if (fence) an = (size_t)(fence - a);
                } else {
                    an -= (size_t)(nlp - a);
                    a = nlp;
                }
            }
            trim(&name, &nl);
            cJSON *args = tools_parse_json(a, an);
            bool ok = nl && cJSON_IsObject(args) && tools_add_call(p, o, name, nl, args);
            cJSON_Delete(args);
            if (!ok || !e) break;
            q = e + strlen(ce);
        }
        break;
    }
    default: break;
    }
    return o->n_calls - before;
}
