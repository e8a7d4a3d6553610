/* server: POST /v1/chat/completions/control, llama-server's control of a
 * running chat completion (its web UI's stop-thinking button). The one action,
 * reasoning_end, forces the end of the completion's thinking block now (the
 * budget's forced tokens come next, reasoning_budget.h); the request must
 * have armed it with "reasoning_control": true. The completion is found by its
 * id among the jobs the engine runs; with per-tenant keys only the tenant's
 * own (another's is as unknown). The answers are llama-server's: 200 with
 * {"success": true}, or {"success": false, "message": why}. Also the
 * input_tokens counts of a chat or responses request. */
#define _GNU_SOURCE /* asprintf */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

typedef struct control_task {
    srv_engine_task task;
    const char *id;
    const char *tenant; /* the caller's namespace prefix, NULL: no tenants */
    bool found, armed;
} control_task;

static bool run_control(srv *s, srv_engine_task *t, api_error *err) {
    (void)err;
    control_task *c = (control_task *)t;
    for (srv_job *j = s->active; j; j = j->next) {
        if (strcmp(j->cmpl_id, c->id) != 0 || j->n_live == 0) continue;
        if (c->tenant && !(j->cache_salt && !strncmp(j->cache_salt, c->tenant, strlen(c->tenant))))
            continue;
        c->found = true;
        c->armed = j->reasoning_control;
        for (int i = 0; c->armed && i < j->n; i++)
            if (!j->choices[i].done && j->choices[i].engine_id >= 0)
                engine_end_reasoning(s->e, j->choices[i].engine_id);
    }
    return true;
}

char *srv_chat_control(srv *s, const char *body, size_t len, const srv_key *key, api_error *err) {
    cJSON *b = json_parse_body(body ? body : "", len, err);
    if (!b) return NULL;
    static const char *const NAMES[] = {"id", "action", "model"};
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
    const cJSON *action = cJSON_GetObjectItemCaseSensitive(b, "action");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(b, "model");
    char *out = NULL, *tenant = NULL;
    bool oom = false;
    const bool ok =
        (cJSON_IsObject(b) || api_fail(err, 400, NULL, "the request body must be a JSON object")) &&
        srv_only_fields(b, NAMES, 3, "/v1/chat/completions/control", err) &&
        ((cJSON_IsString(id) && id->valuestring[0]) ||
         api_fail(err, 400, "id", "missing completion id")) &&
        ((cJSON_IsString(action) && !strcmp(action->valuestring, "reasoning_end")) ||
         api_fail(err, 400, "action",
                  "unknown control action (the one action is reasoning_end)")) &&
        (!model || cJSON_IsNull(model) ||
         (cJSON_IsString(model) && srv_model_known(s, model->valuestring)) ||
         api_fail(err, 404, "model", "The model `%.200s` does not exist.",
                  cJSON_IsString(model) ? model->valuestring : "?"));
    if (ok) {
        tenant = tenant_salt(s, key, NULL, &oom);
        control_task t = {.task.run = run_control, .id = id->valuestring, .tenant = tenant};
        if (oom) api_fail(err, 500, NULL, "out of memory");
        else if (srv_engine_call(s, &t.task, err)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "success", t.found && t.armed);
            if (!t.found) cJSON_AddStringToObject(o, "message", "no active completion for this id");
            else if (!t.armed)
                cJSON_AddStringToObject(o, "message",
                                        "reasoning control not enabled for this completion");
            out = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
            if (!out) api_fail(err, 500, NULL, "out of memory");
        }
    }
    free(tenant);
    cJSON_Delete(b);
    return out;
}

char *srv_input_tokens(srv *s, const char *body, size_t len, bool responses, const char *tenant,
                       api_error *err) {
    cJSON *b = json_parse_body(body ? body : "", len, err);
    if (!b) return NULL;
    api_req r;
    const bool ok =
        responses ? responses_parse(s, b, tenant, &r, err) : openai_parse(s, b, true, &r, err);
    cJSON_Delete(b);
    if (!ok) return NULL;
    char *out = NULL;
    if (asprintf(&out, "{\"object\":\"response.input_tokens\",\"input_tokens\":%lld}",
                 (long long)job_prompt_tokens(r.job)) < 0)
        out = NULL;
    api_req_free(&r);
    if (!out) api_fail(err, 500, NULL, "out of memory");
    return out;
}
