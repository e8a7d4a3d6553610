/* srv_lora_info: the LoRA adapters as the engine's model holds them, for
 * the server's start (their scales), GET /lora-adapters and /v1/models, and
 * vLLM's runtime loading and unloading (srv_lora.c has the request side).
 *
 * A load or unload runs on the engine thread between two steps (no forward
 * reads the adapters then) and under lora_mu (no request is being matched to
 * a name then). An unloaded adapter's index stays empty, never reused: a
 * request parsed before the unload still holds its scale at that index, and
 * the engine refuses it ("has been unloaded") instead of applying another
 * adapter there. So at most MODEL_MAX_LORA adapters are loaded over a
 * server's life. */
#define _GNU_SOURCE /* asprintf */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

void srv_lora_init(srv *s) {
    pthread_mutex_init(&s->lora_mu, NULL);
    const char *env = getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"); /* vLLM's: "1" or "true" */
    s->lora_runtime = env && (!strcmp(env, "1") || !strcasecmp(env, "true"));
    s->n_lora = model_lora_count(engine_model(s->e));
    for (int i = 0; i < s->n_lora; i++) {
        model_lora_info info;
        model_lora_get(engine_model(s->e), i, &info);
        s->lora_scale[i] = info.scale;
    }
}

void srv_lora_free(srv *s) {
    for (int i = 0; i < MODEL_MAX_LORA; i++) free(s->lora_owned[i]);
    pthread_mutex_destroy(&s->lora_mu);
}

char *srv_lora_list(srv *s) {
    cJSON *a = cJSON_CreateArray();
    const model *m = engine_model(s->e);
    pthread_mutex_lock(&s->lora_mu);
    for (int i = 0; i < s->n_lora; i++) {
        model_lora_info info;
        if (!model_lora_get(m, i, &info)) continue; /* unloaded */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddStringToObject(o, "path", info.path);
        cJSON_AddNumberToObject(o, "scale", s->lora_scale[i]);
        /* llama.cpp's members: the adapter's own metadata, "" when it has none */
        char text[1024];
        const gguf_file *f = model_lora_gguf(m, i);
        cJSON_AddStringToObject(
            o, "task_name",
            gguf_get_str_buf(f, "adapter.lora.task_name", text, sizeof text) ? text : "");
        cJSON_AddStringToObject(
            o, "prompt_prefix",
            gguf_get_str_buf(f, "adapter.lora.prompt_prefix", text, sizeof text) ? text : "");
        if (s->cfg.lora_names[i]) cJSON_AddStringToObject(o, "name", s->cfg.lora_names[i]);
        cJSON_AddNumberToObject(o, "alpha", info.alpha);
        cJSON_AddNumberToObject(o, "rank", (double)info.rank);
        cJSON_AddNumberToObject(o, "n_tensors", info.n_pairs);
        cJSON_AddItemToArray(a, o);
    }
    pthread_mutex_unlock(&s->lora_mu);
    char *out = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return out;
}

void srv_lora_models(const srv *s, cJSON *data, cJSON *(*object)(const srv *, const char *)) {
    pthread_mutex_lock((pthread_mutex_t *)&s->lora_mu);
    for (int i = 0; i < s->n_lora; i++) {
        model_lora_info info;
        if (!s->cfg.lora_names[i] || !model_lora_get(engine_model(s->e), i, &info)) continue;
        cJSON *o = object(s, s->cfg.lora_names[i]);
        /* vLLM's adapter entries: the file, and the base model they adapt */
        cJSON_AddStringToObject(o, "root", info.path);
        cJSON_AddStringToObject(o, "parent", s->cfg.model_id);
        cJSON_AddItemToArray(data, o);
    }
    pthread_mutex_unlock((pthread_mutex_t *)&s->lora_mu);
}

/* ------------------------------------------------- loading at run time -- */

typedef struct lora_task {
    srv_engine_task task;
    const char *name;
    gguf_file *f; /* load: the opened file (the model's once added) */
    bool inplace; /* load_inplace: an adapter of that name is replaced */
    bool unload;
} lora_task;

/* Takes adapter i out (lora_mu held): 409 while requests still use it. */
static bool remove_locked(srv *s, int i, api_error *err) {
    int users = 0;
    if (!engine_lora_remove(s->e, i, &users))
        return api_fail(err, 409, "lora_name",
                        "The lora adapter '%.200s' is in use by %d request%s: unload it once they "
                        "have finished",
                        s->cfg.lora_names[i], users, users == 1 ? "" : "s");
    s->cfg.lora_names[i] = NULL;
    s->lora_scale[i] = 0.0f;
    s->lora_gone[i] = true;
    return true;
}

static bool run_lora_task(srv *s, srv_engine_task *t, api_error *err) {
    lora_task *l = (lora_task *)t;
    pthread_mutex_lock(&s->lora_mu);
    const int had = srv_lora_named_locked(s, l->name);
    bool ok = true;
    if (l->unload) {
        ok = had >= 0 ? remove_locked(s, had, err)
                      : api_fail(err, 404, "lora_name",
                                 "The lora adapter '%.200s' cannot be found.", l->name);
        if (had < 0) err->type = "NotFoundError";
    } else if (had >= 0 && !l->inplace) {
        ok = api_fail(err, 400, "lora_name", "The lora adapter '%.200s' has already been loaded.",
                      l->name);
    } else if (model_lora_count(engine_model(s->e)) >= MODEL_MAX_LORA) {
        ok = api_fail(err, 400, "lora_path",
                      "at most %d LoRA adapters over the server's life (unloaded ones keep their "
                      "place)",
                      MODEL_MAX_LORA);
    } else {
        /* the new one first: a file the model refuses leaves the old one in place */
        kvl_error ke = {{0}};
        gguf_file *f = l->f;
        l->f = NULL; /* the model's from here, closed by it on failure */
        const int i = engine_lora_add(s->e, f, 0.0f, &ke);
        char *name = i >= 0 ? strdup(l->name) : NULL;
        s->n_lora = model_lora_count(engine_model(s->e));
        if (i < 0) ok = api_fail(err, 400, "lora_path", "%s", ke.msg);
        else if (!name || (had >= 0 && !remove_locked(s, had, err))) {
            int users; /* (none: just added) */
            engine_lora_remove(s->e, i, &users);
            s->lora_gone[i] = true;
            ok = name ? false : api_fail(err, 500, NULL, "out of memory");
            free(name);
        } else {
            s->lora_owned[i] = name;
            s->cfg.lora_names[i] = name;
            s->lora_scale[i] = 0.0f; /* applied where a request names it */
        }
    }
    pthread_mutex_unlock(&s->lora_mu);
    return ok;
}

/* Parses {"lora_name", "lora_path", ...} of either route into l. */
static bool parse_lora_body(srv *s, const cJSON *b, bool unload, lora_task *l, api_error *err) {
    static const char *const load_keys[] = {"lora_name", "lora_path", "load_inplace", NULL};
    static const char *const unload_keys[] = {"lora_name", NULL};
    const char *bad =
        cJSON_IsObject(b) ? json_unknown_key(b, unload ? unload_keys : load_keys) : NULL;
    if (!cJSON_IsObject(b))
        return api_fail(err, 400, NULL, "the request body must be a JSON object");
    if (bad) return api_fail(err, 400, bad, "unknown member '%.64s'", bad);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "lora_name");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(b, "lora_path");
    const cJSON *inplace = cJSON_GetObjectItemCaseSensitive(b, "load_inplace");
    if (!cJSON_IsString(name) || !*name->valuestring)
        return api_fail(err, 400, "lora_name",
                        unload ? "'lora_name' needs to be provided to unload a LoRA adapter."
                               : "Both 'lora_name' and 'lora_path' must be provided.");
    if (!unload && (!cJSON_IsString(path) || !*path->valuestring))
        return api_fail(err, 400, "lora_path",
                        "Both 'lora_name' and 'lora_path' must be provided.");
    if (inplace && !cJSON_IsBool(inplace))
        return api_fail(err, 400, "load_inplace", "'load_inplace' must be true or false");
    if (!unload &&
        (!strcmp(name->valuestring, s->cfg.model_id) || srv_model_alias(s, name->valuestring)))
        return api_fail(err, 400, "lora_name", "'%.200s' is the served model's own name",
                        name->valuestring);
    *l = (lora_task){.name = name->valuestring, .inplace = cJSON_IsTrue(inplace), .unload = unload};
    l->task.run = run_lora_task;
    if (unload) return true;
    kvl_error ke = {{0}};
    if (!(l->f = gguf_open(path->valuestring, &ke)))
        return api_fail(err, 400, "lora_path", "%s", ke.msg);
    return true;
}

static char *lora_route(srv *s, const char *body, size_t len, bool unload, api_error *err) {
    cJSON *b = json_parse_body(body, len, err);
    if (!b) return NULL;
    lora_task l = {0};
    char *out = NULL;
    if (parse_lora_body(s, b, unload, &l, err) && srv_engine_call(s, &l.task, err) &&
        asprintf(&out, "Success: LoRA adapter '%s' %s successfully.", l.name,
                 unload ? "removed" : "added") < 0) {
        out = NULL;
        api_fail(err, 500, NULL, "out of memory");
    }
    if (!unload) gguf_close(l.f); /* still here when the task did not run */
    cJSON_Delete(b);
    return out;
}

char *srv_lora_load(srv *s, const char *body, size_t len, api_error *err) {
    return lora_route(s, body, len, false, err);
}

char *srv_lora_unload(srv *s, const char *body, size_t len, api_error *err) {
    return lora_route(s, body, len, true, err);
}
