/* srv_chat_jinja: /v1/chat/completions prompts rendered by the model's Jinja
 * chat template (the GGUF's tokenizer.chat_template, or --chat-template-file),
 * as transformers' apply_chat_template renders them.
 *
 * The renderer is exact; what OpenAI clients send is normalised first, as vLLM
 * and llama-server do: a content array of text parts becomes one string (the
 * parts joined with "\n"), and a tool call's "arguments" JSON string becomes
 * the object it encodes (templates index and tojson it). Template variables:
 * messages, tools (the request's OpenAI list as sent, as transformers passes
 * it; None without tools), documents (None), add_generation_prompt, bos_token,
 * eos_token, reasoning_effort (when the request sets it), and the request's
 * chat_template_kwargs (e.g. enable_thinking), which win over the others.
 *
 * What the client sent is never markup: roles must be one of CHAT_ROLES, and
 * every other string (content, names, tool calls, tools, kwargs) is marked by
 * srv_guard_json so that it tokenizes as text (srv_guard.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"
#include "jinja.h"

bool srv_jinja_setup(srv *s, const char *src, const char *origin) {
    char err[512];
    s->jinja = jinja_template_create(src, strlen(src), err, sizeof err);
    if (!s->jinja) {
        kvl_log(KVL_LOG_WARN, "the %s does not compile (%s)", origin, err);
        return false;
    }
    fprintf(stderr, "kvllm serve: chat template: Jinja, from the %s\n", origin);
    jinja_template_caps(s->jinja, &s->tmpl_caps); /* once: a few probe renders */
    return true;
}

void srv_jinja_free(srv *s) {
    jinja_template_destroy(s->jinja);
    s->jinja = NULL;
}

/* content: text parts -> one string; anything else as sent. */
static bool normalise_content(cJSON *msg, int i, api_error *err) {
    cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!cJSON_IsArray(c)) return true;
    size_t len = 0;
    for (cJSON *p = c->child; p; p = p->next) {
        cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text))
            return api_fail(err, 400, "messages",
                            "messages[%d]: only text content parts are supported", i);
        len += strlen(text->valuestring) + 1;
    }
    char *joined = malloc(len + 1), *o = joined;
    if (!joined) return api_fail(err, 500, NULL, "out of memory");
    for (cJSON *p = c->child; p; p = p->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        if (p != c->child) *o++ = '\n';
        size_t n = strlen(t);
        memcpy(o, t, n);
        o += n;
    }
    *o = 0;
    bool ok = cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(joined));
    free(joined);
    return ok || api_fail(err, 500, NULL, "out of memory");
}

/* tool_calls[].function.arguments: a JSON string -> the object it encodes. */
static void normalise_tool_calls(cJSON *msg) {
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (!cJSON_IsArray(calls)) return;
    for (cJSON *call = calls->child; call; call = call->next) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(args)) continue;
        cJSON *obj = jinja_json_parse(args->valuestring, strlen(args->valuestring), NULL);
        if (cJSON_IsObject(obj)) cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj);
        else cJSON_Delete(obj);
    }
}

/* Adds text to the first message if it is the system message, else puts a
 * system message first (the tools description of templates without tools). */
static bool add_system_text(cJSON *msgs, const char *text) {
    cJSON *first = msgs->child;
    const cJSON *role = first ? cJSON_GetObjectItemCaseSensitive(first, "role") : NULL;
    const cJSON *content = first ? cJSON_GetObjectItemCaseSensitive(first, "content") : NULL;
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "system") && cJSON_IsString(content)) {
        size_t n = strlen(content->valuestring);
        char *joined = malloc(n + strlen(text) + 3);
        if (!joined) return false;
        sprintf(joined, "%s%s%s", content->valuestring, n ? "\n\n" : "", text);
        bool ok =
            cJSON_ReplaceItemInObjectCaseSensitive(first, "content", cJSON_CreateString(joined));
        free(joined);
        return ok;
    }
    cJSON *sys = cJSON_CreateObject();
    if (!sys || !cJSON_AddStringToObject(sys, "role", "system") ||
        !cJSON_AddStringToObject(sys, "content", text)) {
        cJSON_Delete(sys);
        return false;
    }
    return cJSON_InsertItemInArray(msgs, 0, sys);
}

/* llama-server's way with a template that takes no system role (its caps):
 * the system message's text goes in front of the next message's, on a line
 * of its own; alone, it is dropped. */
static bool merge_system(cJSON *msgs) {
    cJSON *first = msgs->child;
    const cJSON *role = first ? cJSON_GetObjectItemCaseSensitive(first, "role") : NULL;
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "system") != 0) return true;
    cJSON *next = first->next;
    if (next) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(first, "content");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(next, "content");
        const char *sa = cJSON_IsString(a) ? a->valuestring : "";
        const char *sb = cJSON_IsString(b) ? b->valuestring : "";
        char *joined = malloc(strlen(sa) + strlen(sb) + 2);
        if (!joined) return false;
        sprintf(joined, "%s\n%s", sa, sb);
        cJSON *c = cJSON_CreateString(joined);
        free(joined);
        if (!c) return false;
        if (cJSON_GetObjectItemCaseSensitive(next, "content"))
            cJSON_ReplaceItemInObjectCaseSensitive(next, "content", c);
        else cJSON_AddItemToObject(next, "content", c);
    }
    cJSON_Delete(cJSON_DetachItemViaPointer(msgs, first));
    return true;
}

/* The roles of OpenAI's API, and Llama 3.1's ipython; a template decides what
 * it does with each (raise_exception -> 400). */
static const char *const CHAT_ROLES[] = {"system", "developer", "user",   "assistant",
                                         "tool",   "function",  "ipython"};

static bool known_role(const char *r) {
    for (size_t i = 0; i < sizeof CHAT_ROLES / sizeof CHAT_ROLES[0]; i++)
        if (strcmp(r, CHAT_ROLES[i]) == 0) return true;
    return false;
}

/* Marks every string of a message but its (checked) role. */
static bool guard_message(srv *s, cJSON *msg) {
    for (cJSON *f = msg->child; f; f = f->next) {
        if (f->string && strcmp(f->string, "role") == 0) continue;
        cJSON *next = f->next;
        f->next = NULL; /* srv_guard_json walks siblings */
        bool ok = srv_guard_json(s->vocab, f);
        f->next = next;
        if (!ok) return false;
    }
    return true;
}

char *srv_jinja_render(srv *s, const cJSON *body, bool add_gen, const cJSON *tools,
                       const char *system_extra, size_t *len, api_error *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw) && !cJSON_IsNull(kw)) {
        api_fail(err, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        return NULL;
    }
    cJSON *vars = cJSON_CreateObject();
    cJSON *m = cJSON_Duplicate(msgs, true);
    if (!vars || !m) {
        cJSON_Delete(vars);
        cJSON_Delete(m);
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    int i = 0;
    for (cJSON *msg = m->child; msg; msg = msg->next, i++) {
        const cJSON *role =
            cJSON_IsObject(msg) ? cJSON_GetObjectItemCaseSensitive(msg, "role") : NULL;
        if (!cJSON_IsString(role)) {
            api_fail(err, 400, "messages", "messages[%d] must be an object with a string 'role'",
                     i);
            goto fail;
        }
        if (!known_role(role->valuestring)) {
            api_fail(err, 400, "messages",
                     "messages[%d].role '%.64s' is not a role (system, developer, user, assistant, "
                     "tool, function, "
                     "ipython)",
                     i, role->valuestring);
            goto fail;
        }
        if (!normalise_content(msg, i, err)) goto fail;
        normalise_tool_calls(msg);
        if (!guard_message(s, msg)) {
            api_fail(err, 500, NULL, "out of memory");
            goto fail;
        }
    }
    if (system_extra) { /* it quotes the client's tool definitions: marked as a whole */
        size_t n = 0;
        char *guarded = srv_guard_string(s->vocab, system_extra, strlen(system_extra), &n);
        bool ok = guarded && add_system_text(m, guarded);
        free(guarded);
        if (!ok) {
            api_fail(err, 500, NULL, "out of memory");
            goto fail;
        }
    }
    if (!s->tmpl_caps.supports_system_role && !merge_system(m)) {
        api_fail(err, 500, NULL, "out of memory");
        goto fail;
    }
    cJSON_AddItemToObject(vars, "messages", m);
    m = NULL;
    cJSON *tools_var = tools ? cJSON_Duplicate(tools, true) : cJSON_CreateNull();
    if (!tools_var || (tools && !srv_guard_json(s->vocab, tools_var))) {
        cJSON_Delete(tools_var);
        api_fail(err, 500, NULL, "out of memory");
        goto fail;
    }
    cJSON_AddItemToObject(vars, "tools", tools_var);
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(body, "reasoning_effort");
    if (cJSON_IsString(effort))
        cJSON_AddStringToObject(vars, "reasoning_effort", effort->valuestring);
    cJSON_AddItemToObject(vars, "documents", cJSON_CreateNull());
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_gen);
    cJSON_AddStringToObject(vars, "bos_token", s->bos_text);
    cJSON_AddStringToObject(vars, "eos_token", s->eos_text);
    /* the server's defaults (--chat-template-kwargs), then the request's */
    const cJSON *layers[2] = {s->default_kwargs, cJSON_IsObject(kw) ? kw : NULL};
    for (int l = 0; l < 2; l++)
        for (const cJSON *c = layers[l] ? layers[l]->child : NULL; c; c = c->next) {
            if (!strcmp(c->string, "messages")) continue; /* the conversation is the request's */
            cJSON_DeleteItemFromObjectCaseSensitive(vars, c->string);
            cJSON *copy = cJSON_Duplicate(c, true);
            if (!copy || !srv_guard_json(s->vocab, copy)) { /* a client's strings too */
                cJSON_Delete(copy);
                api_fail(err, 500, NULL, "out of memory");
                cJSON_Delete(vars);
                return NULL;
            }
            cJSON_AddItemToObject(vars, c->string, copy);
        }
    char *out = NULL, msg_err[512];
    jinja_status st =
        jinja_template_render(s->jinja, vars, NULL, &out, len, msg_err, sizeof msg_err);
    cJSON_Delete(vars);
    if (st == JINJA_ERR_RAISED) {
        api_fail(err, 400, "messages", "the chat template refused the conversation: %s", msg_err);
        return NULL;
    }
    if (st != JINJA_OK) {
        api_fail(err, st == JINJA_ERR_NOMEM ? 500 : 400, "messages",
                 "the chat template failed on this conversation: %s", msg_err);
        return NULL;
    }
    return out;
fail:
    cJSON_Delete(m);
    cJSON_Delete(vars);
    return NULL;
}
