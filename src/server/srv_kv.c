/* POST /v1/kv/save: a prefix pinned to the KV disk tier on purpose (a conversation
 * saved by its content, not by a slot). The body is a completion's {prompt} or
 * a chat's {messages} (rendered by the chat template exactly as a chat
 * completion renders them, generation prompt included unless
 * add_generation_prompt is false), with the same fields and checks; the
 * engine thread computes or finds its full blocks and writes them before the
 * reply. A later request that starts with that prefix, under the same key's
 * tenant and cache_salt, reads them back, also after a restart. The saved
 * blocks are pinned: the tier's size limit does not delete them until
 * POST /v1/kv/unpin with the same body, and pins take at most
 * --kv-disk-pin-max bytes (a save past it is a 413). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

typedef struct kv_save_task {
    srv_engine_task task;
    const int32_t *ids;
    int64_t n;
    const char *salt;
    const float *lora; /* the request's adapter scales (srv_lora_job), NULL: none */
    bool unpin;
    int64_t blocks;
} kv_save_task;

/* Engine thread: the prefix's full blocks found or computed, then written and
 * pinned; or its pin dropped. */
static bool run_kv_task(srv *s, srv_engine_task *t, api_error *err) {
    kv_save_task *k = (kv_save_task *)t;
    kvl_error kerr = {{0}};
    if (k->unpin) {
        k->blocks = engine_kv_unpin(s->e, k->ids, k->n, k->salt, k->lora, &kerr);
        return k->blocks >= 0 ||
               api_fail(err, engine_kv_disk(s->e) ? 404 : 400, NULL, "%s", kerr.msg);
    }
    k->blocks = engine_kv_save(s->e, k->ids, k->n, k->salt, k->lora, &kerr);
    if (k->blocks == KV_DISK_OVER_PIN_CAP) {
        api_fail(err, 413, NULL, "%s", kerr.msg);
        err->code = "kv_pin_limit";
        return false;
    }
    return k->blocks >= 0 || api_fail(err, engine_kv_disk(s->e) ? 503 : 400, NULL, "%s", kerr.msg);
}

static char *kv_request(srv *s, const char *body, size_t len, const srv_key *key, bool unpin,
                        api_error *err) {
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
    if (r.job->n_prompts > 1) {
        api_req_free(&r);
        free(salt);
        api_fail(err, 400, "prompt", "one prompt at a time: this saves one prefix");
        return NULL;
    }
    int32_t *ids = r.job->prompt;
    int64_t n = r.job->n_prompt;
    kv_save_task kt = {.task.run = run_kv_task,
                       .ids = ids,
                       .n = n,
                       .salt = salt,
                       .lora = r.job->n_lora ? r.job->lora : NULL,
                       .unpin = unpin};
    if (srv_engine_call(s, &kt.task, err)) {
        const int64_t bs = engine_cfg(s->e)->block_size;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", unpin ? "kv.unpin" : "kv.save");
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)n);
        cJSON_AddNumberToObject(o, "blocks", (double)kt.blocks);
        cJSON_AddNumberToObject(o, "tokens", (double)(kt.blocks * bs));
        out = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!out) api_fail(err, 500, NULL, "out of memory");
    }
    free(salt);
    api_req_free(&r);
    return out;
}

char *srv_kv_save(srv *s, const char *body, size_t len, const srv_key *key, api_error *err) {
    return kv_request(s, body, len, key, false, err);
}

char *srv_kv_unpin(srv *s, const char *body, size_t len, const srv_key *key, api_error *err) {
    return kv_request(s, body, len, key, true, err);
}
