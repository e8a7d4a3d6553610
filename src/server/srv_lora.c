/* srv_lora: LoRA adapters over HTTP, as llama.cpp's server and vLLM offer
 * them. The adapters are attached at start (--lora, --lora-scaled,
 * --lora-modules NAME=FILE); which a request uses, and at what scale:
 *  - "lora": [{"id": N, "scale": S}, ...] (llama.cpp): those, the others at 0
 *    (an empty list counts as none, as in llama-server);
 *  - "model": a --lora-modules name (vLLM): that adapter at 1, the others at 0;
 *  - neither: the server's scales, from the flags, then POST /lora-adapters.
 * The request's scales are fixed when it is parsed; the engine keys the
 * prefix cache by them (engine_request.lora), so no answer reads K and V
 * computed under other adapters. This half reads only the server's own
 * fields (the request fuzzer runs it without an engine); srv_lora_info.c
 * reads the adapters themselves, and loads and unloads them at run time
 * (vLLM's /v1/load_lora_adapter): the names, the count and the scales are
 * read and changed under lora_mu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

static void lora_lock(const srv *s) { pthread_mutex_lock((pthread_mutex_t *)&s->lora_mu); }
static void lora_unlock(const srv *s) { pthread_mutex_unlock((pthread_mutex_t *)&s->lora_mu); }

int srv_lora_named_locked(const srv *s, const char *name) {
    for (int i = 0; name && i < s->n_lora; i++)
        if (s->cfg.lora_names[i] && strcmp(s->cfg.lora_names[i], name) == 0) return i;
    return -1;
}

bool srv_model_alias(const srv *s, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = s->cfg.model_aliases; p && *p;) {
        const size_t l = strcspn(p, ",");
        if (l == n && strncmp(p, name, n) == 0) return true;
        p += l + (p[l] == ',');
    }
    return false;
}

bool srv_model_known(const srv *s, const char *name) {
    if (strcmp(name, s->cfg.model_id) == 0 || srv_model_alias(s, name)) return true;
    lora_lock(s);
    const bool named = srv_lora_named_locked(s, name) >= 0;
    lora_unlock(s);
    return named;
}

/* [{"id": N, "scale": S}, ...] into scales (the adapters not listed at 0),
 * under lora_mu. */
static bool parse_list(const srv *s, const cJSON *list, const char *param, float *scales,
                       api_error *err) {
    const int n = s->n_lora;
    if (!cJSON_IsArray(list))
        return api_fail(err, 400, param, "'%s' must be an array of {\"id\", \"scale\"} objects",
                        param);
    if (n == 0 && cJSON_GetArraySize(list) > 0)
        return api_fail(err, 400, param,
                        "'%s': the server has no LoRA adapter (start it with --lora FILE)", param);
    for (int i = 0; i < n; i++) scales[i] = 0.0f;
    int k = 0;
    for (const cJSON *e = list->child; e; e = e->next, k++) {
        static const char *const allowed[] = {"id", "scale", NULL};
        const char *bad = cJSON_IsObject(e) ? json_unknown_key(e, allowed) : NULL;
        if (bad)
            return api_fail(err, 400, param, "'%s[%d]': unknown member '%.64s'", param, k, bad);
        const cJSON *id = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "id") : NULL;
        const cJSON *sc = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "scale") : NULL;
        if (!cJSON_IsNumber(id) || !cJSON_IsNumber(sc))
            return api_fail(err, 400, param,
                            "'%s[%d]' must be an object with a number 'id' and a number 'scale'",
                            param, k);
        const double v = id->valuedouble;
        if (v != floor(v) || v < 0 || v >= n)
            return api_fail(err, 400, param, "'%s[%d].id' %g: no such adapter (ids 0..%d)", param,
                            k, v, n - 1);
        if (!isfinite(sc->valuedouble) || fabs(sc->valuedouble) > 1e6)
            return api_fail(err, 400, param, "'%s[%d].scale' must be a finite number", param, k);
        if (s->lora_gone[(int)v] && sc->valuedouble != 0)
            return api_fail(err, 400, param, "'%s[%d].id' %g: that adapter was unloaded", param, k,
                            v);
        scales[(int)v] = (float)sc->valuedouble;
    }
    return true;
}

/* srv_lora_scales under lora_mu; *named: the adapter "model" names, or -1. */
static bool scales_locked(srv *s, const cJSON *b, const char *model, float *out, int *n_out,
                          int *named_out, api_error *err) {
    const int n = s->n_lora, named = srv_lora_named_locked(s, model);
    *named_out = named;
    for (int i = 0; i < MODEL_MAX_LORA; i++) out[i] = 0.0f; /* adapters loaded later: 0 */
    const cJSON *list = req_field(b, "lora");
    if (list && !cJSON_IsArray(list))
        return api_fail(err, 400, "lora", "'lora' must be an array of {\"id\", \"scale\"} objects");
    if (list && !list->child) list = NULL; /* llama-server's rule: an empty list is no list */
    if (list && named >= 0)
        return api_fail(err, 400, "lora",
                        "'lora' and a 'model' naming an adapter (`%.200s`) were both given: use "
                        "one",
                        model);
    if (list) {
        if (!parse_list(s, list, "lora", out, err)) return false;
    } else if (named >= 0) {
        for (int i = 0; i < n; i++) out[i] = i == named ? 1.0f : 0.0f;
    } else memcpy(out, s->lora_scale, (size_t)n * sizeof *out);
    *n_out = n;
    return true;
}

bool srv_lora_scales(srv *s, const cJSON *b, const char *model, float *out, int *n_out,
                     api_error *err) {
    int named;
    lora_lock(s);
    const bool ok = scales_locked(s, b, model, out, n_out, &named, err);
    lora_unlock(s);
    return ok;
}

bool srv_lora_job(srv *s, const cJSON *b, const char *model, srv_job *j, api_error *err) {
    int named;
    lora_lock(s);
    const bool ok = scales_locked(s, b, model, j->lora, &j->n_lora, &named, err);
    /* a name stays allocated until the server ends, unloaded or not */
    j->model_name = ok && named >= 0 ? s->cfg.lora_names[named] : NULL;
    lora_unlock(s);
    return ok;
}

char *srv_lora_set(srv *s, const char *body, size_t len, api_error *err) {
    cJSON *b = json_parse_body(body, len, err);
    if (!b) return NULL;
    float scales[MODEL_MAX_LORA];
    char *out = NULL;
    if (!cJSON_IsArray(b))
        api_fail(err, 400, NULL, "the request body must be an array of {\"id\", \"scale\"}");
    else {
        lora_lock(s);
        const bool ok = parse_list(s, b, "body", scales, err);
        if (ok) memcpy(s->lora_scale, scales, (size_t)s->n_lora * sizeof *scales);
        lora_unlock(s);
        if (ok && !(out = strdup("{\"success\":true}"))) api_fail(err, 500, NULL, "out of memory");
    }
    cJSON_Delete(b);
    return out;
}
