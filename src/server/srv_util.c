/* Server helpers: UTF-8 checks, OpenAI error objects. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

/* Length of the valid UTF-8 sequence at p (at most n bytes), or 0. Rejects
 * overlong forms, surrogates, code points above U+10FFFF and NUL. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c == 0) return 0;
    if (c < 0x80) return 1;
    size_t len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n) return 0;
    unsigned cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; k++) {
        if ((p[k] >> 6) != 2) return 0;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

bool utf8_valid(const char *p, size_t n) {
    const unsigned char *u = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq(u + i, n - i);
        if (!l) return false;
        i += l;
    }
    return true;
}

cJSON *json_text(const char *p, size_t n) {
    kvl_buf b = {0};
    const unsigned char *u = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq(u + i, n - i);
        if (l) {
            kvl_buf_put(&b, p + i, l);
            i += l;
        } else {
            kvl_buf_puts(&b, "\xEF\xBF\xBD");
            i++;
        }
    }
    cJSON *j = cJSON_CreateString(b.p && !b.oom ? b.p : "");
    kvl_buf_free(&b);
    return j;
}

bool secret_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned diff = (unsigned)(la ^ lb);
    for (size_t i = 0; i < la; i++)
        diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (lb ? lb : 1)];
    return diff == 0 && lb > 0;
}

static const char *default_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429:
    case 503: return "server_overloaded";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

bool api_fail(api_error *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = default_type(status);
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

char *api_error_json(const api_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddItemToObject(o, "message", json_text(e->msg, strlen(e->msg)));
    cJSON_AddStringToObject(o, "type", e->type ? e->type : default_type(e->status));
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------- field access -- */

/* A field, with JSON null treated as absent (the SDKs send nulls). */
const cJSON *req_field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

bool req_number(const cJSON *o, const char *k, double lo, double hi, double *out, api_error *err) {
    const cJSON *v = req_field(o, k);
    if (!v) return true;
    if (!cJSON_IsNumber(v)) return api_fail(err, 400, k, "'%s' must be a number", k);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return api_fail(err, 400, k, "'%s' must be between %g and %g (got %g)", k, lo, hi,
                        v->valuedouble);
    *out = v->valuedouble;
    return true;
}

bool req_float(const cJSON *o, const char *k, double lo, double hi, float *out, api_error *err) {
    double d = *out;
    if (!req_number(o, k, lo, hi, &d, err)) return false;
    *out = (float)d;
    return true;
}

bool req_int(const cJSON *o, const char *k, int64_t lo, int64_t hi, int64_t *out, api_error *err) {
    const cJSON *v = req_field(o, k);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return api_fail(err, 400, k, "'%s' must be an integer", k);
    if (!(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi))
        return api_fail(err, 400, k, "'%s' must be between %lld and %lld (got %.0f)", k,
                        (long long)lo, (long long)hi, v->valuedouble);
    *out = (int64_t)v->valuedouble;
    return true;
}

bool req_bool(const cJSON *o, const char *k, bool *out, api_error *err) {
    const cJSON *v = req_field(o, k);
    if (!v) return true;
    if (!cJSON_IsBool(v)) return api_fail(err, 400, k, "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(v);
    return true;
}

bool req_string(const cJSON *o, const char *k, const char **out, api_error *err) {
    const cJSON *v = req_field(o, k);
    if (!v) return true;
    if (!cJSON_IsString(v)) return api_fail(err, 400, k, "'%s' must be a string", k);
    *out = v->valuestring;
    return true;
}

int32_t *srv_encode(srv *s, const char *text, size_t len, bool add_bos, tok_mode mode, int64_t *n,
                    const char *param, api_error *err) {
    kvl_error kerr = {{0}};
    pthread_mutex_lock(&s->tok_mu);
    int32_t *ids = tok_encode_alloc(s->vocab, text, len, add_bos, mode.parse_special, mode.guard,
                                    mode.n_guard, n, &kerr);
    pthread_mutex_unlock(&s->tok_mu);
    if (!ids) api_fail(err, 400, param, "cannot tokenize the text: %s", kerr.msg);
    return ids;
}

int32_t *srv_encode_special(srv *s, const char *text, size_t len, bool add_special, tok_mode mode,
                            int64_t *n, const char *param, api_error *err) {
    const bool bos = add_special && tok_add_bos(s->vocab) && tok_bos(s->vocab) >= 0,
               eos = add_special && tok_add_eos(s->vocab) && tok_eos(s->vocab) >= 0;
    int32_t *ids = srv_encode(s, text, len, bos, mode, n, param, err);
    if (!ids || !eos) return ids;
    int32_t *grown = realloc(ids, (size_t)(*n + 1) * sizeof *ids);
    if (!grown) {
        free(ids);
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    grown[(*n)++] = tok_eos(s->vocab);
    return grown;
}

/* s with each quoted name ('name' or 'name.) of map[i][0] written as
 * map[i][1], in place (cut at cap). */
static void rename_quoted(char *s, size_t cap, const char *const (*map)[2], size_t n_map) {
    char out[sizeof((api_error *)0)->msg];
    size_t n = 0;
    for (const char *p = s; *p && n + 1 < sizeof out;) {
        size_t i = 0, len = 0;
        if (*p == '\'')
            for (; i < n_map; i++) {
                len = strlen(map[i][0]);
                if (!strncmp(p + 1, map[i][0], len) && (p[1 + len] == '\'' || p[1 + len] == '.'))
                    break;
            }
        if (*p == '\'' && i < n_map) {
            n += (size_t)snprintf(out + n, sizeof out - n, "'%s", map[i][1]);
            if (n >= sizeof out) n = sizeof out - 1;
            p += 1 + len;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    snprintf(s, cap, "%s", out);
}

void api_error_rename(api_error *err, const char *const (*map)[2], size_t n_map) {
    for (size_t i = 0; i < n_map; i++) {
        size_t len = strlen(map[i][0]);
        if (!strncmp(err->param, map[i][0], len) &&
            (err->param[len] == 0 || err->param[len] == '.')) {
            char rest[sizeof err->param];
            snprintf(rest, sizeof rest, "%s", err->param + len);
            snprintf(err->param, sizeof err->param, "%s%s", map[i][1], rest);
            break;
        }
    }
    rename_quoted(err->msg, sizeof err->msg, map, n_map);
}

const char *json_unknown_key(const cJSON *o, const char *const *allowed) {
    for (const cJSON *v = o ? o->child : NULL; v; v = v->next) {
        const char *const *a = allowed;
        while (*a && strcmp(v->string, *a)) a++;
        if (!*a) return v->string;
    }
    return NULL;
}

cJSON *chat_function_tool(cJSON *fn) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddItemToObject(c, "function", fn);
    return c;
}

void chat_tool_choice_named(cJSON *chat, const char *name) {
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name);
}

bool job_add_logit_bias(srv *s, srv_job *j, int64_t token, double bias, const char *param,
                        api_error *err) {
    const int32_t n_vocab = tok_n_vocab(s->vocab);
    if (token < 0 || token >= n_vocab)
        return api_fail(err, 400, param, "'%s': %lld is not a token id (0..%d)", param,
                        (long long)token, n_vocab - 1);
    if (isnan(bias) || bias == INFINITY)
        return api_fail(err, 400, param, "'%s': token %lld's bias is not a number", param,
                        (long long)token);
    size_t cap = j->cap_logit_bias;
    if (!kvl_grow((void **)&j->logit_bias, &cap, (size_t)j->n_logit_bias + 1, sizeof *j->logit_bias,
                  16))
        return api_fail(err, 500, NULL, "out of memory");
    j->cap_logit_bias = cap;
    j->logit_bias[j->n_logit_bias++] = (engine_logit_bias){(int32_t)token, (float)bias};
    return true;
}

static int cmp_bias(const void *a, const void *b) {
    const engine_logit_bias *x = a, *y = b;
    return (x->token > y->token) - (x->token < y->token);
}

void job_logit_bias_finish(srv_job *j) {
    if (j->n_logit_bias < 2) return;
    /* stable for equal tokens is not needed: their biases add up */
    qsort(j->logit_bias, (size_t)j->n_logit_bias, sizeof *j->logit_bias, cmp_bias);
    int m = 0;
    for (int i = 0; i < j->n_logit_bias; i++) {
        if (m > 0 && j->logit_bias[m - 1].token == j->logit_bias[i].token)
            j->logit_bias[m - 1].bias += j->logit_bias[i].bias;
        else j->logit_bias[m++] = j->logit_bias[i];
    }
    j->n_logit_bias = m;
}

void srv_ids_text(srv *s, const int32_t *ids, int64_t n, kvl_buf *out) {
    char buf[256];
    for (int64_t i = 0; i < n; i++) {
        const size_t len = tok_token_bytes(s->vocab, ids[i], true, buf, sizeof buf);
        if (len <= sizeof buf) {
            kvl_buf_put(out, buf, len);
            continue;
        }
        char *big = malloc(len); /* a piece longer than buf (rare) */
        if (!big) {
            out->oom = true;
            return;
        }
        tok_token_bytes(s->vocab, ids[i], true, big, len);
        kvl_buf_put(out, big, len);
        free(big);
    }
}

/* Same rule as the generation endpoints: a field nobody reads is a 400. */
bool srv_only_fields(const cJSON *b, const char *const *names, int n, const char *ep,
                     api_error *err) {
    for (const cJSON *v = b->child; v; v = v->next) {
        int i = 0;
        while (i < n && strcmp(v->string, names[i]) != 0) i++;
        if (i == n && !cJSON_IsNull(v))
            return api_fail(err, 400, v->string, "unsupported field '%.60s' for %s", v->string, ep);
    }
    return true;
}

bool srv_check_model(srv *s, const cJSON *b, api_error *err) {
    const cJSON *m = req_field(b, "model");
    if (!m) return true;
    if (!cJSON_IsString(m)) return api_fail(err, 400, "model", "'model' must be a string");
    if (srv_model_known(s, m->valuestring)) return true; /* an adapter: the same vocabulary */
    api_fail(err, 404, "model", "The model `%.200s` does not exist.", m->valuestring);
    err->code = "model_not_found";
    return false;
}

/* The same strict parse as generation requests (json_parse_body: UTF-8, no
 * NUL, nothing after the value), then an object. */
bool srv_parse_object(const char *p, size_t n, cJSON **out, api_error *err) {
    *out = json_parse_body(p, n, err);
    if (!*out) return false;
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        return api_fail(err, 400, NULL, "the request body must be a JSON object");
    }
    return true;
}
