/* POST /v1/messages and /v1/messages/count_tokens, the request side:
 * Anthropic's Messages API (Claude Code's, and the Anthropic SDKs'), served
 * by the chat-completions path as /v1/responses is (srv_responses.c): the
 * body is rewritten as the chat request that means the same and parsed by
 * openai_parse. system -> a system message; content blocks: text -> text
 * parts, tool_use -> the assistant message's tool_calls (input as its JSON
 * arguments), tool_result -> a tool message, thinking -> reasoning_content;
 * tools (name, description, input_schema) -> function tools; tool_choice
 * auto / any / tool / none -> auto / required / the function / none;
 * stop_sequences -> stop; thinking enabled / disabled -> the template's
 * enable_thinking, its budget_tokens -> the thinking budget. The answer side is srv_anthropic_out.c. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static bool listed(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return true;
    return false;
}

static const char *str_member(const cJSON *o, const char *k) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* Copied unchanged into the chat request (the chat endpoint's extensions
 * pass through as in /v1/responses). */
// clang-format off
static const char *const PASS_FIELDS[] = {
    "model", "temperature", "top_p", "top_k", "stream", "service_tier",
    "seed", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "ignore_eos", "cache_salt", "lora", "priority", "speculative",
};
static const char *const OWN_FIELDS[] = {
    "messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice", "thinking",
    "metadata",
};
// clang-format on

/* Members a content block may have, by type (cache_control: prompt caching
 * is automatic here, every prefix is cached). */
static const char *const BLOCK_KEYS[][7] = {
    {"text", "type", "text", "cache_control", "citations"},
    {"tool_use", "type", "id", "name", "input", "cache_control"},
    {"tool_result", "type", "tool_use_id", "content", "is_error", "cache_control"},
    {"thinking", "type", "thinking", "signature", "cache_control"},
};

static bool block_known(const cJSON *b, const char *where, api_error *err) {
    const char *type = str_member(b, "type");
    for (size_t t = 0; type && t < N_OF(BLOCK_KEYS); t++) {
        if (strcmp(type, BLOCK_KEYS[t][0])) continue;
        const char *bad = json_unknown_key(b, BLOCK_KEYS[t] + 1);
        if (bad)
            return api_fail(err, 400, "messages", "%s: unsupported field '%.60s' in a %s block",
                            where, bad, type);
        return true;
    }
    return api_fail(err, 400, "messages",
                    "%s: block type '%.40s' is not supported (kvllm serves text: text, "
                    "tool_use, tool_result and thinking blocks)",
                    where, type ? type : "(none)");
}

/* A text, or the text blocks of content, as one chat content value. */
static cJSON *text_content(const cJSON *content, const char *where, api_error *err) {
    if (cJSON_IsString(content)) return cJSON_CreateString(content->valuestring);
    if (!cJSON_IsArray(content)) {
        api_fail(err, 400, "messages", "%s must be a string or an array of text blocks", where);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *b = content->child; b; b = b->next, i++) {
        char w[64];
        snprintf(w, sizeof w, "%s[%d]", where, i);
        const bool known = block_known(b, w, err);
        if (!known || strcmp(str_member(b, "type"), "text") || !str_member(b, "text")) {
            if (known)
                api_fail(err, 400, "messages", "%s must be a text block with a string text", w);
            cJSON_Delete(parts);
            return NULL;
        }
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "text");
        cJSON_AddStringToObject(p, "text", str_member(b, "text"));
        cJSON_AddItemToArray(parts, p);
    }
    return parts;
}

static void add_text_part(cJSON **parts, const char *text) {
    if (!*parts) *parts = cJSON_CreateArray();
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddItemToArray(*parts, p);
}

/* An assistant message: thinking -> reasoning_content, text -> content,
 * tool_use -> tool_calls. */
static bool assistant_blocks(const cJSON *content, int i, cJSON *msgs, api_error *err) {
    cJSON *m = cJSON_CreateObject(), *parts = NULL, *calls = NULL;
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddItemToArray(msgs, m);
    kvl_buf thinking = {0};
    bool ok = true;
    int j = 0;
    for (const cJSON *b = content->child; ok && b; b = b->next, j++) {
        char w[64];
        snprintf(w, sizeof w, "messages[%d].content[%d]", i, j);
        if (!(ok = block_known(b, w, err))) break;
        const char *type = str_member(b, "type");
        if (!strcmp(type, "text") && str_member(b, "text")) {
            add_text_part(&parts, str_member(b, "text"));
        } else if (!strcmp(type, "thinking") && str_member(b, "thinking")) {
            kvl_buf_puts(&thinking, str_member(b, "thinking"));
        } else if (!strcmp(type, "tool_use") && str_member(b, "id") && str_member(b, "name") &&
                   cJSON_IsObject(cJSON_GetObjectItem(b, "input"))) {
            char *args = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "input"));
            if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", str_member(b, "id"));
            cJSON_AddStringToObject(c, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(fn, "name", str_member(b, "name"));
            cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
            free(args);
            cJSON_AddItemToArray(calls, c);
        } else {
            ok = api_fail(err, 400, "messages",
                          "%s: a %s block of an assistant message is malformed or misplaced", w,
                          type);
        }
    }
    /* no text: "" (templates such as Qwen3's fail on a None content) */
    cJSON_AddItemToObject(m, "content", parts ? parts : cJSON_CreateString(""));
    if (thinking.len) cJSON_AddStringToObject(m, "reasoning_content", thinking.p);
    kvl_buf_free(&thinking);
    return ok;
}

/* A user message: each tool_result becomes a tool message, in order; the
 * text blocks around them one user message each run. */
static bool user_blocks(const cJSON *content, int i, cJSON *msgs, api_error *err) {
    cJSON *parts = NULL;
    bool ok = true;
    int j = 0;
    for (const cJSON *b = content->child; ok && b; b = b->next, j++) {
        char w[80];
        snprintf(w, sizeof w, "messages[%d].content[%d]", i, j);
        if (!(ok = block_known(b, w, err))) break;
        const char *type = str_member(b, "type");
        if (!strcmp(type, "text") && str_member(b, "text")) {
            add_text_part(&parts, str_member(b, "text"));
            continue;
        }
        if (strcmp(type, "tool_result") || !str_member(b, "tool_use_id")) {
            ok = api_fail(err, 400, "messages",
                          "%s: a %s block of a user message is malformed or misplaced", w, type);
            break;
        }
        if (parts) { /* text before the result: its own user message */
            cJSON *u = cJSON_CreateObject();
            cJSON_AddStringToObject(u, "role", "user");
            cJSON_AddItemToObject(u, "content", parts);
            cJSON_AddItemToArray(msgs, u);
            parts = NULL;
        }
        const cJSON *rc = cJSON_GetObjectItem(b, "content");
        snprintf(w + strlen(w), sizeof w - strlen(w), ".content");
        cJSON *c = rc ? text_content(rc, w, err) : cJSON_CreateString("");
        if (!(ok = c != NULL)) break;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "role", "tool");
        cJSON_AddStringToObject(t, "tool_call_id", str_member(b, "tool_use_id"));
        cJSON_AddItemToObject(t, "content", c);
        cJSON_AddItemToArray(msgs, t);
    }
    if (parts && ok) {
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddItemToObject(u, "content", parts);
        cJSON_AddItemToArray(msgs, u);
    } else {
        cJSON_Delete(parts);
    }
    return ok;
}

static bool convert_messages(const cJSON *b, cJSON *msgs, api_error *err) {
    const cJSON *sys = req_field(b, "system");
    if (sys) {
        cJSON *c = text_content(sys, "system", err);
        if (!c) {
            snprintf(err->param, sizeof err->param, "system");
            return false;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddItemToObject(m, "content", c);
        cJSON_AddItemToArray(msgs, m);
    }
    const cJSON *in = req_field(b, "messages");
    if (!cJSON_IsArray(in)) return api_fail(err, 400, "messages", "'messages' must be an array");
    int i = 0;
    for (const cJSON *m = in->child; m; m = m->next, i++) {
        const char *role = str_member(m, "role");
        const cJSON *content = cJSON_GetObjectItem(m, "content");
        if (!cJSON_IsObject(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
            return api_fail(err, 400, "messages",
                            "messages[%d] must be an object with role \"user\" or \"assistant\"",
                            i);
        for (const cJSON *v = m->child; v; v = v->next)
            if (strcmp(v->string, "role") && strcmp(v->string, "content"))
                return api_fail(err, 400, "messages", "messages[%d]: unsupported field '%.60s'", i,
                                v->string);
        if (cJSON_IsString(content)) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "role", role);
            cJSON_AddStringToObject(c, "content", content->valuestring);
            cJSON_AddItemToArray(msgs, c);
            continue;
        }
        if (!cJSON_IsArray(content))
            return api_fail(err, 400, "messages",
                            "messages[%d].content must be a string or an array of blocks", i);
        if (!(strcmp(role, "user") ? assistant_blocks : user_blocks)(content, i, msgs, err))
            return false;
    }
    return true;
}

/* tools -> function tools; tool_choice likewise (disable_parallel_tool_use:
 * parallel_tool_calls false). */
static bool convert_tools(const cJSON *b, cJSON *chat, api_error *err) {
    const cJSON *tools = req_field(b, "tools");
    if (tools && !cJSON_IsArray(tools))
        return api_fail(err, 400, "tools", "'tools' must be an array");
    cJSON *out = tools ? cJSON_AddArrayToObject(chat, "tools") : NULL;
    int i = 0;
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next, i++) {
        const char *type = str_member(t, "type");
        if (type && strcmp(type, "custom"))
            return api_fail(err, 400, "tools",
                            "tools[%d]: type '%.40s' is not supported (kvllm runs no server tools: "
                            "client tools with name and input_schema are)",
                            i, type);
        static const char *const keys[] = {"type",         "name",          "description",
                                           "input_schema", "cache_control", NULL};
        const char *bad = json_unknown_key(t, keys);
        if (bad) return api_fail(err, 400, "tools", "tools[%d]: unsupported field '%.60s'", i, bad);
        cJSON *fn = cJSON_CreateObject();
        static const char *const map[][2] = {
            {"name", "name"}, {"description", "description"}, {"input_schema", "parameters"}};
        for (size_t k = 0; k < N_OF(map); k++) {
            const cJSON *v = cJSON_GetObjectItem(t, map[k][0]);
            if (v) cJSON_AddItemToObject(fn, map[k][1], cJSON_Duplicate(v, true));
        }
        cJSON_AddItemToArray(out, chat_function_tool(fn));
    }
    const cJSON *tc = req_field(b, "tool_choice");
    if (!tc) return true;
    const char *type = str_member(tc, "type");
    if (!cJSON_IsObject(tc) || !type)
        return api_fail(err, 400, "tool_choice", "'tool_choice' must be an object with a type");
    bool no_parallel = false;
    if (!req_bool(tc, "disable_parallel_tool_use", &no_parallel, err)) return false;
    if (no_parallel) cJSON_AddFalseToObject(chat, "parallel_tool_calls");
    if (!strcmp(type, "auto") || !strcmp(type, "none")) {
        cJSON_AddStringToObject(chat, "tool_choice", type);
    } else if (!strcmp(type, "any")) {
        cJSON_AddStringToObject(chat, "tool_choice", "required");
    } else if (!strcmp(type, "tool") && str_member(tc, "name")) {
        chat_tool_choice_named(chat, str_member(tc, "name"));
    } else {
        return api_fail(err, 400, "tool_choice",
                        "tool_choice.type must be \"auto\", \"any\", \"none\" or \"tool\" (with "
                        "a name)");
    }
    return true;
}

/* stop_sequences, thinking, metadata (max_tokens: anthropic_parse). */
static bool convert_rest(const cJSON *b, cJSON *chat, api_error *err) {
    const cJSON *ss = req_field(b, "stop_sequences");
    if (ss) cJSON_AddItemToObject(chat, "stop", cJSON_Duplicate(ss, true));
    const cJSON *md = req_field(b, "metadata");
    for (const cJSON *v = cJSON_IsObject(md) ? md->child : NULL; v; v = v->next)
        if (strcmp(v->string, "user_id"))
            return api_fail(err, 400, "metadata", "metadata.%.60s is not supported (user_id is)",
                            v->string);
    const cJSON *th = req_field(b, "thinking");
    if (!th) return true;
    const char *type = str_member(th, "type");
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled")))
        return api_fail(err, 400, "thinking", "thinking.type must be \"enabled\" or \"disabled\"");
    for (const cJSON *v = th->child; v; v = v->next)
        if (strcmp(v->string, "type") && strcmp(v->string, "budget_tokens"))
            return api_fail(err, 400, "thinking", "thinking.%.60s is not supported", v->string);
    cJSON *kw = cJSON_AddObjectToObject(chat, "chat_template_kwargs");
    cJSON_AddBoolToObject(kw, "enable_thinking", !strcmp(type, "enabled"));
    /* budget_tokens: the thinking budget (reasoning_budget.h), as llama-server's
     * thinking_budget_tokens */
    const cJSON *bt = cJSON_GetObjectItemCaseSensitive(th, "budget_tokens");
    if (bt && !strcmp(type, "enabled"))
        cJSON_AddItemToObject(chat, "thinking_budget_tokens", cJSON_Duplicate(bt, true));
    return true;
}

/* Chat request names in an error as the Messages request names them. */
static void rename_error(api_error *err) {
    static const char *const map[][2] = {{"max_completion_tokens", "max_tokens"},
                                         {"chat_template_kwargs", "thinking"},
                                         {"thinking_budget_tokens", "thinking"},
                                         {"stop", "stop_sequences"}};
    api_error_rename(err, map, N_OF(map));
}

static cJSON *chat_request(const cJSON *b, bool counting, api_error *err) {
    if (!cJSON_IsObject(b)) {
        api_fail(err, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    for (const cJSON *v = b->child; v; v = v->next)
        if (!cJSON_IsNull(v) && !listed(v->string, PASS_FIELDS, N_OF(PASS_FIELDS)) &&
            !listed(v->string, OWN_FIELDS, N_OF(OWN_FIELDS))) {
            api_fail(err, 400, v->string, "unsupported field '%.60s' for /v1/messages%s", v->string,
                     counting ? "/count_tokens" : "");
            return NULL;
        }
    cJSON *chat = cJSON_CreateObject();
    for (const cJSON *v = b->child; v; v = v->next)
        if (listed(v->string, PASS_FIELDS, N_OF(PASS_FIELDS)) &&
            !(counting && !strcmp(v->string, "stream")))
            cJSON_AddItemToObject(chat, v->string, cJSON_Duplicate(v, true));
    if (!convert_messages(b, cJSON_AddArrayToObject(chat, "messages"), err) ||
        !convert_tools(b, chat, err) || !(counting || convert_rest(b, chat, err))) {
        cJSON_Delete(chat);
        return NULL;
    }
    /* Anthropic's prefill: a final assistant message is continued, not closed */
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages"), *last = NULL;
    for (const cJSON *m = msgs ? msgs->child : NULL; m; m = m->next) last = m;
    const cJSON *role = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant"))
        cJSON_AddTrueToObject(chat, "continue_final_message");
    if (counting) { /* thinking changes the prompt; the answer's limits do not */
        cJSON *only = cJSON_CreateObject();
        if (req_field(b, "thinking") && !convert_rest(b, only, err)) {
            cJSON_Delete(only);
            cJSON_Delete(chat);
            return NULL;
        }
        cJSON *kw = cJSON_DetachItemFromObject(only, "chat_template_kwargs");
        if (kw) cJSON_AddItemToObject(chat, "chat_template_kwargs", kw);
        cJSON_Delete(only);
        cJSON_AddNumberToObject(chat, "max_completion_tokens", 1);
    }
    return chat;
}

/* max_tokens is a bound on the answer, not a demand for room: clients send
 * their model's largest (Claude Code: 32,000 and more), so it is capped at
 * what the context leaves after the prompt (the chat default) instead of
 * refused as a chat request asking for more than the context would be. */
bool anthropic_parse(srv *s, const cJSON *body, api_req *r, api_error *err) {
    memset(r, 0, sizeof *r);
    int64_t max_tokens = -1;
    if (cJSON_IsObject(body) && !req_int(body, "max_tokens", 1, INT32_MAX, &max_tokens, err))
        return false;
    cJSON *chat = chat_request(body, false, err);
    if (!chat) return false;
    bool ok = openai_parse(s, chat, true, r, err);
    cJSON_Delete(chat);
    if (!ok) {
        rename_error(err);
        return false;
    }
    if (max_tokens > 0 && max_tokens < r->job->max_tokens) r->job->max_tokens = max_tokens;
    if (!(r->anth = calloc(1, sizeof *r->anth))) {
        api_req_free(r);
        return api_fail(err, 500, NULL, "out of memory");
    }
    r->anth->stop_index = -1;
    r->include_usage = true;
    snprintf(r->id, sizeof r->id, "msg_%016llx%08llx", (unsigned long long)kvl_random_u64(),
             (unsigned long long)(kvl_random_u64() & 0xffffffffu));
    return true;
}

char *anthropic_count_tokens(srv *s, const char *body, size_t len, api_error *err) {
    cJSON *b = json_parse_body(body, len, err);
    if (!b) return NULL;
    cJSON *chat = chat_request(b, true, err);
    cJSON_Delete(b);
    if (!chat) return NULL;
    api_req r;
    bool ok = openai_parse(s, chat, true, &r, err);
    cJSON_Delete(chat);
    if (!ok) {
        rename_error(err);
        return NULL;
    }
    char *out = NULL;
    if (asprintf(&out, "{\"input_tokens\":%lld}", (long long)r.job->n_prompt) < 0) out = NULL;
    api_req_free(&r);
    if (!out) api_fail(err, 500, NULL, "out of memory");
    return out;
}
