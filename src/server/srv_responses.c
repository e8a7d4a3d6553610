/* POST /v1/responses, the request side: OpenAI's Responses API (the OpenAI Agents SDK's and
 * Codex's default), served by the chat-completions path.
 *
 * The request is rewritten as the chat request that means the same
 * (responses_parse: input items -> messages, flat function tools -> chat
 * tools, text.format -> response_format, reasoning.effort ->
 * reasoning_effort, max_output_tokens -> max_completion_tokens) and parsed by
 * openai_parse, so both endpoints share every check, the chat template, the
 * grammar and the tool-call parser. The answer is produced as chat SSE chunks
 * (openai_stream_events) and rewritten here into the Responses events of a
 * stream, or, not streaming, into the final response object those events end
 * with: one conversion for both. Nothing is stored, so previous_response_id
 * and conversation are refused: the client sends the whole conversation. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

/* ------------------------------------------------------------ request -- */

/* Copied into the chat request unchanged: the fields both APIs share, the
 * chat endpoint's extensions (seed, stop, top_k, ...) and the bookkeeping
 * fields it accepts and ignores. */
// clang-format off
static const char *const PASS_FIELDS[] = {
    "model", "temperature", "top_p", "parallel_tool_calls",
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
    "seed", "stop", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "cache_salt", "lora", "priority", "ignore_eos", "speculative",
    "chat_template_kwargs",
};
// clang-format on
/* Read here. */
static const char *const OWN_FIELDS[] = {
    "input",        "instructions",         "tools",        "tool_choice", "max_output_tokens",
    "stream",       "stream_options",       "text",         "reasoning",   "include",
    "top_logprobs", "previous_response_id", "conversation", "prompt",      "background",
    "truncation",   "max_tool_calls",
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static bool listed(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return true;
    return false;
}

/* Content parts -> chat text parts; fails on anything but text. */
static cJSON *text_parts(const cJSON *content, const char *where, const char *field,
                         api_error *err) {
    if (cJSON_IsString(content)) return cJSON_CreateString(content->valuestring);
    if (!cJSON_IsArray(content)) {
        api_fail(err, 400, "input", "%s.%s must be a string or an array of parts", where, field);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *p = content->child; p; p = p->next, i++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        const char *t = cJSON_GetStringValue(type);
        if (!t || (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") &&
                   strcmp(t, "summary_text") && strcmp(t, "reasoning_text"))) {
            api_fail(err, 400, "input",
                     "%s.%s[%d]: part type '%.40s' is not supported (kvllm serves text: "
                     "input_text and output_text parts)",
                     where, field, i, t ? t : "(none)");
            cJSON_Delete(parts);
            return NULL;
        }
        if (!cJSON_IsString(text)) {
            api_fail(err, 400, "input", "%s.%s[%d].text must be a string", where, field, i);
            cJSON_Delete(parts);
            return NULL;
        }
        /* what output_text parts carry back besides their text */
        static const char *const keys[] = {"type", "text", "annotations", "logprobs", NULL};
        const char *bad = json_unknown_key(p, keys);
        if (bad) {
            api_fail(err, 400, "input", "%s.%s[%d]: unsupported field '%.60s'", where, field, i,
                     bad);
            cJSON_Delete(parts);
            return NULL;
        }
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "type", "text");
        cJSON_AddStringToObject(q, "text", text->valuestring);
        cJSON_AddItemToArray(parts, q);
    }
    return parts;
}

/* The text of text parts joined (reasoning items' content and summary). */
static bool join_text(const cJSON *content, const char *where, const char *field, kvl_buf *out,
                      api_error *err) {
    cJSON *parts = text_parts(content, where, field, err);
    if (!parts) return false;
    if (cJSON_IsString(parts)) kvl_buf_puts(out, parts->valuestring);
    for (const cJSON *p = parts->child; p && !cJSON_IsString(parts); p = p->next)
        kvl_buf_puts(out, cJSON_GetObjectItem(p, "text")->valuestring);
    cJSON_Delete(parts);
    return true;
}

static const char *str_member(const cJSON *o, const char *k) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* The chat message calls and reasoning attach to: the last one when it is an
 * assistant message that no later message followed, else a new one, its
 * content "" (not null: templates such as Qwen3's test `'</think>' in
 * content` and fail on None, in transformers as here). */
static cJSON *assistant_tail(cJSON *msgs) {
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const char *role = last ? str_member(last, "role") : NULL;
    if (role && !strcmp(role, "assistant")) return last;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", "");
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* The members each input item may have (id and status: what the SDKs hand
 * back of an output item, with no meaning here). */
static const char *const ITEM_KEYS[][8] = {
    {"message", "type", "role", "content", "id", "status"},
    {"reasoning", "type", "id", "summary", "content", "encrypted_content", "status"},
    {"function_call", "type", "call_id", "name", "arguments", "id", "status"},
    {"function_call_output", "type", "call_id", "output", "id", "status"},
};

static bool item_keys_known(const cJSON *it, const char *type, const char *where, api_error *err) {
    for (size_t t = 0; t < N_OF(ITEM_KEYS); t++) {
        if (strcmp(type, ITEM_KEYS[t][0])) continue;
        const char *bad = json_unknown_key(it, ITEM_KEYS[t] + 1);
        if (bad)
            return api_fail(err, 400, "input", "%s: unsupported field '%.60s' in a %s item", where,
                            bad, type);
    }
    return true;
}

/* One input item (index i) appended to msgs; *reasoning holds a reasoning
 * item's text until the assistant message it belongs to. */
static bool input_item(const cJSON *it, int i, cJSON *msgs, kvl_buf *reasoning, api_error *err) {
    char where[32];
    snprintf(where, sizeof where, "input[%d]", i);
    if (!cJSON_IsObject(it)) return api_fail(err, 400, "input", "%s must be an object", where);
    const cJSON *tv = cJSON_GetObjectItemCaseSensitive(it, "type");
    const char *type = cJSON_IsNull(tv) || !tv ? "message" : cJSON_GetStringValue(tv);
    if (!type) return api_fail(err, 400, "input", "%s.type must be a string", where);
    if (!item_keys_known(it, type, where, err)) return false;
    if (!strcmp(type, "message")) {
        const char *role = str_member(it, "role");
        if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
                      strcmp(role, "assistant")))
            return api_fail(err, 400, "input",
                            "%s.role must be \"user\", \"system\", \"developer\" or \"assistant\"",
                            where);
        cJSON *content =
            text_parts(cJSON_GetObjectItemCaseSensitive(it, "content"), where, "content", err);
        if (!content) return false;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", role);
        cJSON_AddItemToObject(m, "content", content);
        if (!strcmp(role, "assistant") && reasoning->len) {
            cJSON_AddStringToObject(m, "reasoning_content", reasoning->p);
            reasoning->len = 0;
        }
        cJSON_AddItemToArray(msgs, m);
        return true;
    }
    if (!strcmp(type, "reasoning")) {
        const cJSON *enc = cJSON_GetObjectItemCaseSensitive(it, "encrypted_content");
        if (enc && !cJSON_IsNull(enc))
            return api_fail(err, 400, "input",
                            "%s: encrypted reasoning is not supported (kvllm sends reasoning "
                            "as text in 'content')",
                            where);
        const char *field = "content";
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, field);
        if (!c || cJSON_IsNull(c) || !cJSON_GetArraySize(c))
            c = cJSON_GetObjectItemCaseSensitive(it, field = "summary");
        return !c || cJSON_IsNull(c) || join_text(c, where, field, reasoning, err);
    }
    if (!strcmp(type, "function_call")) {
        const char *call_id = str_member(it, "call_id"), *name = str_member(it, "name"),
                   *args = str_member(it, "arguments");
        if (!call_id || !name || !args)
            return api_fail(err, 400, "input",
                            "%s: a function_call needs string call_id, name and arguments", where);
        cJSON *m = assistant_tail(msgs);
        if (reasoning->len && !cJSON_GetObjectItem(m, "reasoning_content")) {
            cJSON_AddStringToObject(m, "reasoning_content", reasoning->p);
            reasoning->len = 0;
        }
        cJSON *calls = cJSON_GetObjectItem(m, "tool_calls");
        if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "id", call_id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", name);
        cJSON_AddStringToObject(fn, "arguments", args);
        cJSON_AddItemToArray(calls, c);
        return true;
    }
    if (!strcmp(type, "function_call_output")) {
        const char *call_id = str_member(it, "call_id");
        if (!call_id) return api_fail(err, 400, "input", "%s.call_id must be a string", where);
        cJSON *content =
            text_parts(cJSON_GetObjectItemCaseSensitive(it, "output"), where, "output", err);
        if (!content) return false;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", call_id);
        cJSON_AddItemToObject(m, "content", content);
        cJSON_AddItemToArray(msgs, m);
        return true;
    }
    return api_fail(err, 400, "input",
                    "%s.type '%.40s' is not supported (message, function_call, "
                    "function_call_output and reasoning items are)",
                    where, type);
}

/* instructions (a system message), the kept conversation this request
 * continues (previous, may be NULL: taken), then the input items. */
static bool input_messages(const cJSON *b, cJSON *previous, cJSON *msgs, api_error *err) {
    const cJSON *ins = req_field(b, "instructions");
    if (ins && !cJSON_IsString(ins)) {
        cJSON_Delete(previous);
        return api_fail(err, 400, "instructions", "'instructions' must be a string");
    }
    if (ins) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", ins->valuestring);
        cJSON_AddItemToArray(msgs, m);
    }
    while (previous && previous->child)
        cJSON_AddItemToArray(msgs, cJSON_DetachItemViaPointer(previous, previous->child));
    cJSON_Delete(previous);
    const cJSON *in = req_field(b, "input");
    if (!in) return api_fail(err, 400, "input", "'input' is required");
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", in->valuestring);
        cJSON_AddItemToArray(msgs, m);
        return true;
    }
    if (!cJSON_IsArray(in))
        return api_fail(err, 400, "input", "'input' must be a string or an array of items");
    kvl_buf reasoning = {0};
    bool ok = true;
    int i = 0;
    for (const cJSON *it = in->child; ok && it; it = it->next, i++)
        ok = input_item(it, i, msgs, &reasoning, err);
    kvl_buf_free(&reasoning); /* reasoning with no answer after it: nothing renders it */
    return ok;
}

/* tools: [{type: function, name, description?, parameters?, strict?}] -> the
 * chat shape; tool_choice likewise. */
static bool convert_tools(const cJSON *b, cJSON *chat, api_error *err) {
    const cJSON *tools = req_field(b, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return api_fail(err, 400, "tools", "'tools' must be an array");
        cJSON *out = cJSON_AddArrayToObject(chat, "tools");
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            const char *type = str_member(t, "type");
            if (!type || strcmp(type, "function"))
                return api_fail(err, 400, "tools",
                                "tools[%d].type '%.40s' is not supported (only function tools: "
                                "kvllm runs no hosted tools)",
                                i, type ? type : "(none)");
            cJSON *fn = cJSON_CreateObject();
            for (const cJSON *v = t->child; v; v = v->next)
                if (strcmp(v->string, "type"))
                    cJSON_AddItemToObject(fn, v->string, cJSON_Duplicate(v, true));
            cJSON_AddItemToArray(out, chat_function_tool(fn));
        }
    }
    const cJSON *tc = req_field(b, "tool_choice");
    if (!tc) return true;
    if (cJSON_IsString(tc)) {
        cJSON_AddItemToObject(chat, "tool_choice", cJSON_Duplicate(tc, false));
        return true;
    }
    const char *type = str_member(tc, "type"), *name = str_member(tc, "name");
    if (!type || strcmp(type, "function") || !name)
        return api_fail(err, 400, "tool_choice",
                        "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"name\": ...}");
    chat_tool_choice_named(chat, name);
    return true;
}

/* text.format -> response_format; reasoning.effort -> reasoning_effort. */
static bool convert_text_reasoning(const cJSON *b, cJSON *chat, api_error *err) {
    const cJSON *text = req_field(b, "text");
    if (text && !cJSON_IsObject(text))
        return api_fail(err, 400, "text", "'text' must be an object");
    for (const cJSON *v = text ? text->child : NULL; v; v = v->next) {
        /* verbosity "medium" is the default, what every answer here is */
        const bool medium = !strcmp(v->string, "verbosity") && cJSON_IsString(v) &&
                            !strcmp(v->valuestring, "medium");
        if (!cJSON_IsNull(v) && strcmp(v->string, "format") && !medium)
            return api_fail(err, 400, "text",
                            "text.%.40s is not supported (text.format is, and verbosity "
                            "\"medium\")",
                            v->string);
    }
    const cJSON *f = text ? req_field(text, "format") : NULL;
    const char *ft = f ? str_member(f, "type") : NULL;
    if (f && !ft) return api_fail(err, 400, "text.format", "text.format.type must be a string");
    if (ft && !strcmp(ft, "json_schema")) {
        cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
        cJSON_AddStringToObject(rf, "type", "json_schema");
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        for (const cJSON *v = f->child; v; v = v->next)
            if (strcmp(v->string, "type"))
                cJSON_AddItemToObject(js, v->string, cJSON_Duplicate(v, true));
    } else if (ft && strcmp(ft, "text")) {
        cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
        cJSON_AddStringToObject(rf, "type", ft); /* json_object, or refused by the chat parser */
    }
    const cJSON *rs = req_field(b, "reasoning");
    if (rs && !cJSON_IsObject(rs))
        return api_fail(err, 400, "reasoning", "'reasoning' must be an object");
    for (const cJSON *v = rs ? rs->child : NULL; v; v = v->next)
        if (!cJSON_IsNull(v) && strcmp(v->string, "effort") && strcmp(v->string, "summary") &&
            strcmp(v->string, "generate_summary"))
            return api_fail(err, 400, "reasoning",
                            "reasoning.%.40s is not supported (effort and summary are)", v->string);
    const cJSON *effort = rs ? req_field(rs, "effort") : NULL;
    if (effort) cJSON_AddItemToObject(chat, "reasoning_effort", cJSON_Duplicate(effort, false));
    return true;
}

/* Fields refused unless absent or at their default, with why. */
static bool refuse_unsupported(const cJSON *b, api_error *err) {
    if (req_field(b, "conversation"))
        return api_fail(err, 400, "conversation",
                        "kvllm keeps no conversation objects: continue a response with "
                        "'previous_response_id', or send the whole conversation in 'input'");
    if (req_field(b, "prompt"))
        return api_fail(err, 400, "prompt", "stored prompt templates are not supported");
    if (req_field(b, "max_tool_calls"))
        return api_fail(err, 400, "max_tool_calls", "'max_tool_calls' is not supported");
    bool background = false;
    if (!req_bool(b, "background", &background, err)) return false;
    if (background)
        return api_fail(err, 400, "background", "background responses are not supported");
    const cJSON *tr = req_field(b, "truncation");
    if (tr && !(cJSON_IsString(tr) && !strcmp(tr->valuestring, "disabled")))
        return api_fail(err, 400, "truncation",
                        "only \"disabled\" truncation is supported (an input longer than the "
                        "context is refused)");
    const cJSON *so = req_field(b, "stream_options");
    if (so && !cJSON_IsObject(so))
        return api_fail(err, 400, "stream_options", "'stream_options' must be an object");
    for (const cJSON *v = so ? so->child : NULL; v; v = v->next)
        if (!cJSON_IsNull(v) && strcmp(v->string, "include_obfuscation"))
            return api_fail(err, 400, "stream_options", "stream_options.%.40s is not supported",
                            v->string);
    return true;
}

/* include: message.output_text.logprobs (returned) and
 * reasoning.encrypted_content (reasoning comes back as text instead). */
static bool parse_include(const cJSON *b, bool *logprobs, api_error *err) {
    const cJSON *inc = req_field(b, "include");
    if (inc && !cJSON_IsArray(inc))
        return api_fail(err, 400, "include", "'include' must be an array of strings");
    for (const cJSON *v = inc ? inc->child : NULL; v; v = v->next) {
        const char *s = cJSON_GetStringValue(v);
        if (s && !strcmp(s, "message.output_text.logprobs")) *logprobs = true;
        else if (!s || strcmp(s, "reasoning.encrypted_content"))
            return api_fail(err, 400, "include",
                            "include value '%.60s' is not supported "
                            "(message.output_text.logprobs and reasoning.encrypted_content are)",
                            s ? s : "(not a string)");
    }
    return true;
}

/* Chat request names -> the Responses request's, longest first. */
static const char *const RENAMES[][2] = {
    {"response_format.json_schema", "text.format"}, {"response_format", "text.format"},
    {"max_completion_tokens", "max_output_tokens"}, {"max_tokens", "max_output_tokens"},
    {"reasoning_effort", "reasoning.effort"},       {"messages", "input"},
};

/* An error of the chat parser in the Responses request's terms. */
static void rename_error(api_error *err) { api_error_rename(err, RENAMES, N_OF(RENAMES)); }

/* The kept conversation previous_response_id names (a copy), NULL when there
 * is none to continue; *err set when it names one that is not kept. */
static bool previous_conversation(srv *s, const cJSON *b, const char *tenant, cJSON **conv,
                                  api_error *err) {
    *conv = NULL;
    const cJSON *prev = req_field(b, "previous_response_id");
    if (!prev) return true;
    if (!cJSON_IsString(prev))
        return api_fail(err, 400, "previous_response_id",
                        "'previous_response_id' must be a string");
    if (!s->responses)
        return api_fail(err, 400, "previous_response_id",
                        "this server keeps no responses (--responses-store 0): send the whole "
                        "conversation in 'input'");
    if (!(*conv = rstore_conversation(s->responses, tenant, prev->valuestring))) {
        api_fail(err, 404, "previous_response_id",
                 "no kept response '%.60s' (kvllm keeps the last %d responses stored with "
                 "store: true, in memory, per API key)",
                 prev->valuestring, s->cfg.responses_store);
        err->code = "previous_response_not_found";
        return false;
    }
    return true;
}

static cJSON *chat_request(const cJSON *b, cJSON *previous, bool *logprobs, api_error *err) {
    for (const cJSON *v = b->child; v; v = v->next)
        if (!cJSON_IsNull(v) && !listed(v->string, PASS_FIELDS, N_OF(PASS_FIELDS)) &&
            !listed(v->string, OWN_FIELDS, N_OF(OWN_FIELDS))) {
            api_fail(err, 400, v->string,
                     "unsupported field '%.60s' for /v1/responses (kvllm does not implement it)",
                     v->string);
            return NULL;
        }
    if (!refuse_unsupported(b, err) || !parse_include(b, logprobs, err)) {
        cJSON_Delete(previous);
        return NULL;
    }
    cJSON *chat = cJSON_CreateObject();
    for (const cJSON *v = b->child; v; v = v->next)
        if (listed(v->string, PASS_FIELDS, N_OF(PASS_FIELDS)))
            cJSON_AddItemToObject(chat, v->string, cJSON_Duplicate(v, true));
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *mot = req_field(b, "max_output_tokens"), *st = req_field(b, "stream"),
                *tl = req_field(b, "top_logprobs");
    if (mot) cJSON_AddItemToObject(chat, "max_completion_tokens", cJSON_Duplicate(mot, false));
    if (st) cJSON_AddItemToObject(chat, "stream", cJSON_Duplicate(st, false));
    if (tl) cJSON_AddItemToObject(chat, "top_logprobs", cJSON_Duplicate(tl, false));
    if (*logprobs || (cJSON_IsNumber(tl) && tl->valuedouble > 0)) {
        *logprobs = true;
        cJSON_AddBoolToObject(chat, "logprobs", true);
    }
    if (!input_messages(b, previous, msgs, err) || !convert_tools(b, chat, err) ||
        !convert_text_reasoning(b, chat, err)) {
        cJSON_Delete(chat);
        return NULL;
    }
    return chat;
}

/* What the response object echoes of the request (OpenAI's defaults where absent). */
static cJSON *request_echo(const cJSON *b) {
    cJSON *e = cJSON_CreateObject();
    static const char *const keys[] = {"instructions",
                                       "max_output_tokens",
                                       "tools",
                                       "tool_choice",
                                       "parallel_tool_calls",
                                       "temperature",
                                       "top_p",
                                       "top_logprobs",
                                       "metadata",
                                       "user",
                                       "text",
                                       "reasoning"};
    for (size_t i = 0; i < N_OF(keys); i++) {
        const cJSON *v = req_field(b, keys[i]);
        if (v) cJSON_AddItemToObject(e, keys[i], cJSON_Duplicate(v, true));
    }
    return e;
}

/* The request's input as items with ids, as GET /v1/responses/{id}/input_items
 * lists them: a string is one user message; an item without an id gets one. */
static cJSON *input_items(const cJSON *body) {
    const cJSON *in = req_field(body, "input");
    cJSON *items = cJSON_CreateArray();
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject(), *part = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", "message");
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(part, "type", "input_text");
        cJSON_AddStringToObject(part, "text", in->valuestring);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "content"), part);
        cJSON_AddItemToArray(items, m);
    } else {
        for (const cJSON *it = in ? in->child : NULL; it; it = it->next)
            cJSON_AddItemToArray(items, cJSON_Duplicate(it, true));
    }
    for (cJSON *it = items->child; it; it = it->next)
        if (!str_member(it, "id")) {
            char id[40];
            snprintf(id, sizeof id, "%s_%016llx%08llx",
                     str_member(it, "type") && strcmp(str_member(it, "type"), "message") ? "item"
                                                                                         : "msg",
                     (unsigned long long)kvl_random_u64(),
                     (unsigned long long)(kvl_random_u64() & 0xffffffffu));
            cJSON_DeleteItemFromObject(it, "id"); /* an explicit null */
            cJSON_AddStringToObject(it, "id", id);
        }
    return items;
}

/* The chat messages of the conversation as a continuation will see it: all
 * but the instructions' system message. */
static cJSON *conversation_of(const cJSON *body, const cJSON *chat) {
    cJSON *c = cJSON_Duplicate(cJSON_GetObjectItem(chat, "messages"), true);
    if (c && req_field(body, "instructions")) cJSON_DeleteItemFromArray(c, 0);
    return c;
}

bool responses_parse(srv *s, const cJSON *body, const char *tenant, api_req *r, api_error *err) {
    memset(r, 0, sizeof *r);
    if (!cJSON_IsObject(body))
        return api_fail(err, 400, NULL, "the request body must be a JSON object");
    bool logprobs = false, store = true;
    cJSON *previous;
    if (!req_bool(body, "store", &store, err) ||
        !previous_conversation(s, body, tenant, &previous, err))
        return false;
    cJSON *chat = chat_request(body, previous, &logprobs, err);
    if (!chat) return false;
    bool ok = openai_parse(s, chat, true, r, err);
    cJSON *conv = ok ? conversation_of(body, chat) : NULL;
    cJSON_Delete(chat);
    if (!ok) {
        rename_error(err);
        return false;
    }
    r->resp = calloc(1, sizeof *r->resp);
    const cJSON *prev = req_field(body, "previous_response_id");
    if (!r->resp || !(r->resp->echo = request_echo(body)) ||
        !(r->resp->output = cJSON_CreateArray()) || !conv || !(r->resp->tenant = strdup(tenant)) ||
        (prev && !(r->resp->previous = strdup(prev->valuestring)))) {
        cJSON_Delete(conv);
        api_req_free(r);
        return api_fail(err, 500, NULL, "out of memory");
    }
    r->resp->conversation = conv;
    if (!(r->resp->input = input_items(body))) {
        api_req_free(r);
        return api_fail(err, 500, NULL, "out of memory");
    }
    r->resp->store = store && s->responses;
    r->resp->logprobs = logprobs;
    r->include_usage = true; /* the final response carries usage */
    snprintf(r->id, sizeof r->id, "resp_%016llx%08llx", (unsigned long long)kvl_random_u64(),
             (unsigned long long)(kvl_random_u64() & 0xffffffffu));
    return true;
}

void responses_req_free(resp_req *q) {
    if (!q) return;
    cJSON_Delete(q->echo);
    cJSON_Delete(q->output);
    cJSON_Delete(q->item);
    cJSON_Delete(q->item_lps);
    cJSON_Delete(q->pending_lps);
    cJSON_Delete(q->usage);
    cJSON_Delete(q->conversation);
    cJSON_Delete(q->input);
    free(q->tenant);
    free(q->previous);
    kvl_buf_free(&q->sse);
    kvl_buf_free(&q->text);
    free(q);
}
