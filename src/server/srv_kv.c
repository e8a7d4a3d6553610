/* POST /v1/kv/save: a prefix pinned to the KV disk tier on purpose (a conversation
 * saved by its content, not by a slot). The body is a completion's {prompt} or
 * a chat's {messages} (rendered by the chat template exactly as a chat
 * completion renders them, generation prompt included unless
 * add_generation_prompt is false), with the same fields and checks; the
 * engine thread computes or finds its full blocks and writes them before the
 * reply. A later request that starts with that prefix, under the same key's
 * tenant and cache_salt, reads them back, also after a restart. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

typedef struct kv_save_task {
    srv_engine_task task;
    const int32_t *ids;
    int64_t n;
    const char *salt;
    int64_t saved_blocks;
} kv_save_task;

/* Engine thread: the prefix's full blocks found or computed, then written. */
static bool run_kv_save(srv *s, srv_engine_task *t, api_error *err) {
    kv_save_task *k = (kv_save_task *)t;
    kvl_error kerr = {{0}};
    k->saved_blocks = engine_kv_save(s->e, k->ids, k->n, k->salt, &kerr);
    return k->saved_blocks >= 0 ||
           api_fail(err, engine_kv_disk(s->e) ? 503 : 400, NULL, "%s", kerr.msg);
}

char *srv_kv_save(srv *s, const char *body, size_t len, const srv_key *key, api_error *err) {
    cJSON *b = json_parse_body(body ? body : "", len, err);
    if (!b) return NULL;
    const bool chat = cJSON_IsObject(b) && cJSON_GetObjectItemCaseSensitive(b, "messages") != NULL;
    api_req r;
    bool ok = openai_parse(s, b, chat, &r, err);
    cJSON_Delete(b);
    if (!ok) return NULL;
    bool oom = false;
    char *salt = tenant_salt(s, key, r.job->cache_salt, &oom), *out = NULL;
    if (oom) {
        api_req_free(&r);
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    int32_t *ids = r.job->prompt;
    int64_t n = r.job->n_prompt;
    kv_save_task kt = {.task.run = run_kv_save, .ids = ids, .n = n, .salt = salt};
    if (srv_engine_call(s, &kt.task, err)) {
        const int64_t bs = engine_cfg(s->e)->block_size;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "kv.save");
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)n);
        cJSON_AddNumberToObject(o, "blocks", (double)kt.saved_blocks);
        cJSON_AddNumberToObject(o, "tokens", (double)(kt.saved_blocks * bs));
        out = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!out) api_fail(err, 500, NULL, "out of memory");
    }
    free(salt);
    api_req_free(&r);
    return out;
}
