/* OpenAI API, request side: a request body -> a job (openai_parse): the known
 * fields, the prompt or chat messages and their tokens, tools and constrained
 * decoding, sampling, stop and logprobs options. The response side (response
 * bodies and SSE chunks) is srv_response.c; the two were one file of 1072
 * lines. Only translation lives here; no model logic. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "srv_internal.h"

/* ------------------------------------------------------ known fields -- */

/* Every top-level request field is either read by a parser below (or on its
 * way in: the ones marked "own parser" are read by the tool-calling,
 * reasoning and constrained-decoding parsers), or on the short list of
 * harmless fields that are accepted and ignored (README, "Request fields").
 * Anything else is a 400 naming it: a field that changes what the client gets
 * must never be silently dropped. JSON null counts as absent everywhere. */
enum { F_CHAT = 1, F_COMPL = 2, F_BOTH = 3 };
typedef struct known_field {
    const char *name;
    int where;
} known_field;

// clang-format off
static const known_field KNOWN_FIELDS[] = {
    /* OpenAI, read here */
    {"model", F_BOTH}, {"messages", F_CHAT}, {"prompt", F_COMPL},
    {"max_tokens", F_BOTH}, {"max_completion_tokens", F_CHAT},
    {"temperature", F_BOTH}, {"top_p", F_BOTH}, {"n", F_BOTH}, {"seed", F_BOTH},
    {"stop", F_BOTH}, {"stream", F_BOTH}, {"stream_options", F_BOTH},
    {"frequency_penalty", F_BOTH}, {"presence_penalty", F_BOTH},
    {"logprobs", F_BOTH}, {"top_logprobs", F_CHAT},
    {"logit_bias", F_BOTH},
    {"echo", F_COMPL}, {"best_of", F_COMPL}, /* best_of: only 1 (parse_unsupported) */
    /* vLLM / llama-server extensions, read here */
    {"top_k", F_BOTH}, {"min_p", F_BOTH}, {"repetition_penalty", F_BOTH},
    /* llama-server's other samplers (srv_parse_llama_samplers) */
    {"typical_p", F_BOTH}, {"top_n_sigma", F_BOTH}, {"xtc_probability", F_BOTH},
    {"xtc_threshold", F_BOTH}, {"dynatemp_range", F_BOTH}, {"dynatemp_exponent", F_BOTH},
    {"min_keep", F_BOTH}, {"mirostat", F_BOTH}, {"mirostat_tau", F_BOTH}, {"mirostat_eta", F_BOTH},
    {"dry_multiplier", F_BOTH}, {"dry_base", F_BOTH}, {"dry_allowed_length", F_BOTH},
    {"dry_penalty_last_n", F_BOTH}, {"dry_sequence_breakers", F_BOTH}, {"samplers", F_BOTH},
    {"ignore_eos", F_BOTH}, {"cache_salt", F_BOTH}, {"lora", F_BOTH}, {"return_tokens_as_token_ids", F_BOTH},
    {"speculative", F_BOTH}, /* own: false opts out of --spec (same output, plain decode) */
    /* llama-server's extras, which llama.cpp's web UI sends: stream extras,
     * per-request reasoning format, llama's penalty names, typ_p (typical_p) */
    {"timings_per_token", F_BOTH}, {"return_progress", F_BOTH},
    {"reasoning_format", F_CHAT}, {"thinking_budget_tokens", F_CHAT},
    {"repeat_penalty", F_BOTH}, {"repeat_last_n", F_BOTH}, {"typ_p", F_BOTH},
    {"backend_sampling", F_BOTH}, /* where llama samples (its GPU or not): the same draw */
    {"reasoning_control", F_CHAT}, /* arms POST /v1/chat/completions/control (srv_control.c) */
    {"sse_ping_interval", F_BOTH}, /* keep-alive comments between chunks: no content */
    {"add_generation_prompt", F_CHAT}, {"continue_final_message", F_CHAT},
    {"priority", F_BOTH},
    {"parse_special", F_BOTH}, /* completions only: chat refuses it with its reason (parse_chat_prompt) */
    /* own parser: tool calling and reasoning */
    {"tools", F_CHAT}, {"tool_choice", F_CHAT}, {"parallel_tool_calls", F_CHAT},
    {"reasoning_effort", F_CHAT}, {"chat_template_kwargs", F_CHAT},
    /* own parser: constrained decoding */
    {"response_format", F_BOTH}, {"grammar", F_BOTH}, {"json_schema", F_BOTH},
    {"guided_json", F_BOTH}, {"guided_choice", F_BOTH}, {"guided_regex", F_BOTH},
    {"guided_grammar", F_BOTH}, {"structured_outputs", F_BOTH},
    /* vLLM's sampling extras, read here (parse_vllm) */
    {"stop_token_ids", F_BOTH}, {"min_tokens", F_BOTH}, {"include_stop_str_in_output", F_BOTH},
    {"allowed_token_ids", F_BOTH}, {"skip_special_tokens", F_BOTH},
    {"truncate_prompt_tokens", F_BOTH}, {"bad_words", F_BOTH}, {"prompt_logprobs", F_BOTH},
    /* accepted and ignored: bookkeeping and routing hints of hosted APIs that
     * do not change the output (README's list) */
    {"user", F_BOTH}, {"metadata", F_BOTH}, {"store", F_BOTH}, {"service_tier", F_BOTH},
    {"prompt_cache_key", F_BOTH}, {"safety_identifier", F_BOTH},
    {"cache_prompt", F_BOTH}, /* llama-server's; the prefix cache is always on here, and exact */
};
// clang-format on

/* Fields of a chat message; the template sees the whole message object. */
static const char *const MESSAGE_FIELDS[] = {
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    /* in assistant messages the OpenAI SDKs hand back verbatim; ignored */
    "refusal",
    "annotations",
};
static const char *const STREAM_OPTION_FIELDS[] = {
    "include_usage", "include_obfuscation", /* OpenAI's anti side-channel padding; ignored */
    "continuous_usage_stats",               /* vLLM's: usage in every chunk */
};

static bool in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return true;
    return false;
}

static bool known_field_for(const char *k, bool chat) {
    for (size_t i = 0; i < sizeof KNOWN_FIELDS / sizeof KNOWN_FIELDS[0]; i++)
        if (strcmp(k, KNOWN_FIELDS[i].name) == 0)
            return (KNOWN_FIELDS[i].where & (chat ? F_CHAT : F_COMPL)) != 0;
    return false;
}

static bool check_fields(const cJSON *b, bool chat, api_error *err) {
    const char *ep = chat ? "/v1/chat/completions" : "/v1/completions";
    for (const cJSON *v = b->child; v; v = v->next) {
        if (cJSON_IsNull(v) || known_field_for(v->string, chat)) continue;
        return api_fail(err, 400, v->string,
                        "unsupported field '%.60s' for %s (kvllm does not implement it)", v->string,
                        ep);
    }
    const cJSON *so = req_field(b, "stream_options");
    if (cJSON_IsObject(so))
        for (const cJSON *v = so->child; v; v = v->next)
            if (!cJSON_IsNull(v) &&
                !in_list(v->string, STREAM_OPTION_FIELDS,
                         sizeof STREAM_OPTION_FIELDS / sizeof *STREAM_OPTION_FIELDS))
                return api_fail(err, 400, "stream_options",
                                "unsupported field 'stream_options.%.60s'", v->string);
    const cJSON *msgs = chat ? req_field(b, "messages") : NULL;
    int i = 0;
    for (const cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) continue; /* the message parser explains */
        for (const cJSON *v = m->child; v; v = v->next)
            if (!cJSON_IsNull(v) &&
                !in_list(v->string, MESSAGE_FIELDS, sizeof MESSAGE_FIELDS / sizeof *MESSAGE_FIELDS))
                return api_fail(err, 400, "messages", "unsupported field 'messages[%d].%.60s'", i,
                                v->string);
    }
    return true;
}

/* ------------------------------------------------------------ prompts -- */

static bool tokenize(srv *s, const char *text, size_t len, bool add_bos, tok_mode mode, srv_job *j,
                     const char *param, api_error *err) {
    /* A token covers at least one byte, so a text this long could not fit the
     * context anyway; refusing it early bounds the tokenizer's work. */
    if (len > (size_t)s->n_ctx * 256)
        return api_fail(err, 400, param,
                        "the prompt is too long (%zu bytes) for the context of %lld tokens", len,
                        (long long)s->n_ctx);
    j->prompt = srv_encode(s, text, len, add_bos, mode, &j->n_prompt, param, err);
    return j->prompt != NULL;
}

static bool set_ids(srv *s, const cJSON *arr, srv_job *j, api_error *err) {
    int n = cJSON_GetArraySize(arr);
    j->prompt = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!j->prompt) return api_fail(err, 500, NULL, "out of memory");
    int32_t n_vocab = tok_n_vocab(s->vocab);
    int i = 0;
    for (const cJSON *v = arr->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= n_vocab)
            return api_fail(err, 400, "prompt", "prompt[%d] is not a token id (0..%d)", i,
                            n_vocab - 1);
        j->prompt[i] = (int32_t)v->valuedouble;
    }
    j->n_prompt = n;
    return true;
}

/* One prompt, a string or ids, into j->prompt / j->n_prompt. */
static bool one_prompt(srv *s, const cJSON *p, bool add_bos, tok_mode mode, srv_job *j,
                       api_error *err) {
    if (cJSON_IsString(p))
        return tokenize(s, p->valuestring, strlen(p->valuestring), add_bos, mode, j, "prompt", err);
    if (cJSON_IsArray(p) && p->child && cJSON_IsNumber(p->child)) return set_ids(s, p, j, err);
    return api_fail(err, 400, "prompt",
                    "'prompt' must be a string, token ids, or an array of strings or of token "
                    "id arrays");
}

/* prompt: "text", [ids], or an array of them: several prompts (vLLM's batch),
 * each with its own n choices, prompt-major (j->prompts; at most SRV_MAX_N
 * choices in all). A text prompt is plain text: "</s>" in it is four
 * characters, not EOS, unless the request sets "parse_special": true
 * (llama.cpp's /completion always parses them) for prompts formatted by the
 * client. */
static bool parse_prompt(srv *s, const cJSON *body, srv_job *j, api_error *err) {
    const cJSON *p = req_field(body, "prompt");
    if (!p) return api_fail(err, 400, "prompt", "'prompt' is required");
    tok_mode mode = {0};
    if (!req_bool(body, "parse_special", &mode.parse_special, err)) return false;
    bool add_bos = tok_add_bos(s->vocab) && tok_bos(s->vocab) >= 0;
    if (cJSON_IsString(p) || (cJSON_IsArray(p) && cJSON_IsNumber(p->child)))
        return one_prompt(s, p, add_bos, mode, j, err);
    if (!cJSON_IsArray(p) || !p->child)
        return api_fail(err, 400, "prompt",
                        "'prompt' must be a string or a non-empty array of token ids");
    const int np = cJSON_GetArraySize(p);
    if ((int64_t)np * j->n > SRV_MAX_N)
        return api_fail(err, 400, "prompt",
                        "%d prompts of %d choices each: at most %d choices in one request", np,
                        j->n, SRV_MAX_N);
    int32_t *first = NULL;
    int64_t n_first = 0;
    int k = 0;
    for (const cJSON *e = p->child; e; e = e->next, k++) {
        j->prompt = NULL, j->n_prompt = 0;
        bool ok = one_prompt(s, e, add_bos, mode, j, err);
        if (ok && j->n_prompt == 0) ok = api_fail(err, 400, "prompt", "prompt %d is empty", k);
        if (!ok) {
            if (k) free(j->prompt); /* the first stays in j->prompt for job_free */
            j->prompt = first ? first : j->prompt;
            j->n_prompt = n_first;
            return false;
        }
        if (k == 0) first = j->prompt, n_first = j->n_prompt;
        j->prompts[k] = j->prompt, j->prompt_lens[k] = j->n_prompt;
        j->n_prompts = k + 1;
    }
    j->prompt = first, j->n_prompt = n_first;
    return true;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts
 * (joined with newlines, as vLLM does). Returns a malloc'd string. */
static char *message_text(const cJSON *c, int i, api_error *err) {
    if (!c) return strdup("");
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        api_fail(err, 400, "messages", "messages[%d].content must be a string or an array of parts",
                 i);
        return NULL;
    }
    kvl_buf b = {0};
    kvl_buf_puts(&b, "");
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            kvl_buf_free(&b);
            api_fail(err, 400, "messages", "messages[%d]: only text content parts are supported",
                     i);
            return NULL;
        }
        if (part != c->child) kvl_buf_puts(&b, "\n");
        kvl_buf_puts(&b, text->valuestring);
    }
    if (b.oom) {
        kvl_buf_free(&b);
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    return b.p;
}

static void free_msgs(chat_msg *m, int n) {
    for (int i = 0; i < n; i++) free((char *)m[i].content);
    free(m);
}

/* An assistant message's tool_calls as the generic call JSON the built-in
 * families show them in: {"name": ..., "arguments": {...}} per call. */
static char *append_calls_text(char *content, const cJSON *calls) {
    kvl_buf b = {0};
    kvl_buf_puts(&b, content);
    free(content);
    for (const cJSON *c = calls->child; c; c = c->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", cJSON_IsString(name) ? name->valuestring : "");
        cJSON *a =
            cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : cJSON_Duplicate(args, true);
        cJSON_AddItemToObject(o, "arguments", a ? a : cJSON_CreateObject());
        char *js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (b.len) kvl_buf_puts(&b, "\n");
        if (js) kvl_buf_puts(&b, js);
        else b.oom = true;
        free(js);
    }
    if (b.oom) {
        kvl_buf_free(&b);
        return NULL;
    }
    return b.p ? b.p : strdup("");
}

/* system_extra: text for the system message (added to the first message if it
 * is one, else a system message of its own first). */
static bool parse_messages(srv *s, const cJSON *body, const char *system_extra, chat_msg **out,
                           int *n_out, api_error *err) {
    const cJSON *arr = req_field(body, "messages");
    if (!cJSON_IsArray(arr) || !arr->child)
        return api_fail(err, 400, "messages", "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(arr), i = 0;
    chat_msg *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) return api_fail(err, 500, NULL, "out of memory");
    for (const cJSON *v = arr->child; v; v = v->next, i++) {
        const cJSON *role = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "role") : NULL;
        if (!cJSON_IsString(role)) {
            free_msgs(m, i);
            return api_fail(err, 400, "messages",
                            "messages[%d] must be an object with a string 'role'", i);
        }
        m[i].role = role->valuestring;
        char *text = message_text(req_field(v, "content"), i, err);
        if (!text) {
            free_msgs(m, i);
            return false;
        }
        const cJSON *calls = req_field(v, "tool_calls");
        if (cJSON_IsArray(calls) && calls->child && !(text = append_calls_text(text, calls))) {
            free_msgs(m, i);
            return api_fail(err, 500, NULL, "out of memory");
        }
        size_t guarded_len = 0; /* the client's text, calls included, is never markup */
        m[i].content = srv_guard_string(s->vocab, text, strlen(text), &guarded_len);
        free(text);
        if (!m[i].content) {
            free_msgs(m, i);
            return api_fail(err, 500, NULL, "out of memory");
        }
    }
    char *extra = NULL; /* it quotes the client's tool definitions */
    size_t extra_len = 0;
    if (system_extra &&
        !(extra = srv_guard_string(s->vocab, system_extra, strlen(system_extra), &extra_len))) {
        free_msgs(m, n);
        return api_fail(err, 500, NULL, "out of memory");
    }
    if (extra) {
        bool merge = !strcmp(m[0].role, "system");
        size_t l = merge ? strlen(m[0].content) : 0;
        char *t = malloc(l + strlen(extra) + 3);
        if (!t) {
            free(extra);
            free_msgs(m, n);
            return api_fail(err, 500, NULL, "out of memory");
        }
        sprintf(t, "%s%s%s", merge ? m[0].content : "", l ? "\n\n" : "", extra);
        free(extra);
        if (merge) {
            free((char *)m[0].content);
        } else {
            memmove(m + 1, m, (size_t)n * sizeof *m);
            m[0].role = "system";
            n++;
        }
        m[0].content = t;
    }
    *out = m;
    *n_out = n;
    return true;
}

static bool starts_with(const char *s, const char *prefix) {
    return prefix[0] && strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool schema_rules(const char *schema, const char *prefix, kvl_buf *out, char *e,
                         size_t cap) {
    kvl_error ke = {{0}};
    if (json_schema_to_gbnf(schema, prefix, out, &ke)) return true;
    snprintf(e, cap, "%s", ke.msg);
    return false;
}

/* tool_choice "required" or a named function: the output is constrained to
 * calls in the model's own format, each function's arguments to its schema. */
static bool build_tool_grammar(srv *s, srv_job *j, api_error *err) {
    if (j->grammar)
        return api_fail(err, 400, "tool_choice",
                        "'tool_choice' \"required\" or a named function cannot be combined with a "
                        "structured output "
                        "format (response_format, grammar, json_schema, guided_*)");
    kvl_buf g = {0};
    char msg[512] = "";
    if (!tool_grammar(j->parse_fmt, &j->tools, j->think && j->in_think ? s->caps.think_close : NULL,
                      schema_rules, &g, msg, sizeof msg)) {
        kvl_buf_free(&g);
        return api_fail(err, 400, "tools", "cannot constrain the tool call: %s", msg);
    }
    kvl_error ke = {{0}};
    j->grammar = grammar_compile(g.p, s->vocab, &ke);
    kvl_buf_free(&g);
    if (!j->grammar)
        return api_fail(err, 400, "tools", "cannot constrain the tool call: %s", ke.msg);
    return true;
}

/* The control tokens of the call format's markers (and <think>) are printed,
 * so that the parser sees them: a marker that is one token is kept. */
static void keep_marker_tokens(srv *s, srv_job *j) {
    const char *m[ENGINE_MAX_KEEP_SPECIAL];
    int n = tool_format_markers(j->parse_fmt, m, ENGINE_MAX_KEEP_SPECIAL);
    for (int i = 0; i < n && j->n_keep_special < ENGINE_MAX_KEEP_SPECIAL; i++) {
        int32_t ids[4];
        kvl_error kerr = {{0}};
        pthread_mutex_lock(&s->tok_mu);
        int64_t got = tok_encode(s->vocab, m[i], strlen(m[i]), false, true, ids, 4, &kerr);
        pthread_mutex_unlock(&s->tok_mu);
        if (got == 1) j->keep_special[j->n_keep_special++] = ids[0];
    }
}

/* tools, tool_choice, parallel_tool_calls, reasoning_effort: what the template
 * sees, how the output is parsed. */
static bool parse_tools(srv *s, const cJSON *body, srv_job *j, api_error *err) {
    char param[64], msg[400];
    if (!tool_spec_parse(body, &j->tools, param, sizeof param, msg, sizeof msg))
        return api_fail(err, 400, param, "%s", msg);
    const cJSON *effort = req_field(body, "reasoning_effort");
    if (effort) {
        static const char *const ok[] = {"minimal", "low", "medium", "high"};
        bool known = false;
        for (int i = 0; cJSON_IsString(effort) && i < 4; i++)
            known |= !strcmp(effort->valuestring, ok[i]);
        if (!known)
            return api_fail(err, 400, "reasoning_effort",
                            "'reasoning_effort' must be \"minimal\", \"low\", "
                            "\"medium\" or \"high\"");
    }
    /* llama-server's per-request reasoning_format (its web UI sends none or auto) */
    bool reasoning_none = s->cfg.reasoning_none;
    const cJSON *rf = req_field(body, "reasoning_format");
    if (rf) {
        const char *v = cJSON_IsString(rf) ? rf->valuestring : "";
        if (!strcmp(v, "none")) reasoning_none = true;
        else if (!strcmp(v, "auto") || !strcmp(v, "deepseek")) reasoning_none = false;
        else
            return api_fail(err, 400, "reasoning_format",
                            "'reasoning_format' must be \"none\" (thinking stays in the content), "
                            "\"auto\" or \"deepseek\" (thinking in reasoning_content)");
    }
    /* llama-server's thinking_budget_tokens: -1 the server's (--reasoning-budget), N the
     * tokens a thinking block may take before its end is forced (setup_budget) */
    int64_t budget = -1;
    if (!req_int(body, "thinking_budget_tokens", -1, INT32_MAX, &budget, err)) return false;
    j->budget_tokens = budget >= 0 ? (int32_t)budget : s->cfg.reasoning_budget;
    if (!req_bool(body, "reasoning_control", &j->reasoning_control, err)) return false;
    j->think = s->jinja && s->caps.thinks && !reasoning_none;
    j->think_open = s->caps.think_open;
    j->think_close = s->caps.think_close;
    if (j->tools.n > 0 && j->tools.choice != TOOL_CHOICE_NONE)
        j->parse_fmt = s->jinja ? s->caps.format : TOOL_FMT_GENERIC;
    /* harmony's channels (gpt-oss) are split with or without tools */
    if (s->jinja && s->caps.format == TOOL_FMT_GPT_OSS) j->parse_fmt = TOOL_FMT_GPT_OSS;
    if (j->parse_fmt != TOOL_FMT_NONE || j->think) keep_marker_tokens(s, j);
    return true;
}

/* The thinking budget's tags as token ids (llama-server's: the template's
 * think tags, the forced text being --reasoning-budget-message and the end
 * tag), and whether the prompt opened a block. Nothing for a template that
 * does not think (no block to limit), or under a grammar, which decides alone. */
static bool setup_budget(srv *s, srv_job *j, const char *text, size_t len, api_error *err) {
    if (!s->jinja || !s->caps.thinks || j->grammar) return true;
    const char *open = s->caps.think_open, *close = s->caps.think_close;
    const char *msg = s->cfg.reasoning_budget_message ? s->cfg.reasoning_budget_message : "";
    char *forced = malloc(strlen(msg) + strlen(close) + 1);
    if (!forced) return api_fail(err, 500, NULL, "out of memory");
    strcpy(forced, msg);
    strcat(forced, close);
    const char *tags[3] = {open, close, forced};
    int32_t ids[3][256];
    int64_t n[3];
    kvl_error kerr = {{0}};
    pthread_mutex_lock(&s->tok_mu);
    for (int k = 0; k < 3; k++)
        n[k] = tok_encode(s->vocab, tags[k], strlen(tags[k]), false, true, ids[k], 256, &kerr);
    pthread_mutex_unlock(&s->tok_mu);
    free(forced);
    for (int k = 0; k < 3; k++)
        if (n[k] < (k < 2 ? 1 : 0) || n[k] > 256)
            return api_fail(err, 400, "thinking_budget_tokens",
                            "the thinking tags (or --reasoning-budget-message) are not 1..256 "
                            "tokens");
    if (!(j->budget_ids = malloc((size_t)(n[0] + n[1] + n[2]) * sizeof *j->budget_ids)))
        return api_fail(err, 500, NULL, "out of memory");
    memcpy(j->budget_ids, ids[0], (size_t)n[0] * sizeof(int32_t));
    memcpy(j->budget_ids + n[0], ids[1], (size_t)n[1] * sizeof(int32_t));
    memcpy(j->budget_ids + n[0] + n[1], ids[2], (size_t)n[2] * sizeof(int32_t));
    j->n_budget_start = (int)n[0], j->n_budget_end = (int)n[1], j->n_budget_forced = (int)n[2];
    j->budget_inside = prompt_opens_think(text, len, open, close);
    return true;
}

/* Tokenizes a rendered chat prompt: the client's strings were marked before
 * rendering (srv_guard.c), so only the template's markup becomes special
 * tokens. BOS only if the template did not write it already. */
static bool tokenize_chat(srv *s, char *text, size_t *text_len, srv_job *j, api_error *err) {
    tok_span *guard = NULL;
    size_t n_guard = 0, len = *text_len;
    const bool unguarded = srv_unguard(text, &len, &guard, &n_guard);
    *text_len = len;
    if (!unguarded) return api_fail(err, 500, NULL, "out of memory");
    bool template_bos = starts_with(text, s->bos_text) && !(n_guard > 0 && guard[0].off == 0);
    bool add_bos = tok_add_bos(s->vocab) && tok_bos(s->vocab) >= 0 && !template_bos;
    tok_mode mode = {
        .parse_special = true, .guard = guard, .n_guard = n_guard}; /* guard NULL: none */
    bool ok = tokenize(s, text, len, add_bos, mode, j, "messages", err);
    free(guard);
    return ok;
}

/* Python's str.isspace for the one character at p (UTF-8, left bytes): its
 * length, 0 when it is not white space. */
static size_t py_space(const unsigned char *p, size_t left) {
    if (left >= 1 && ((p[0] >= 0x09 && p[0] <= 0x0D) || (p[0] >= 0x1C && p[0] <= 0x20))) return 1;
    if (left >= 2 && p[0] == 0xC2 && (p[1] == 0x85 || p[1] == 0xA0)) return 2;
    if (left >= 3 && p[0] == 0xE1 && p[1] == 0x9A && p[2] == 0x80) return 3; /* U+1680 */
    if (left >= 3 && p[0] == 0xE2 && p[1] == 0x80 &&
        (p[2] <= 0x8A || p[2] == 0xA8 || p[2] == 0xA9 || p[2] == 0xAF))
        return 3; /* U+2000..200A, 2028, 2029, 202F */
    if (left >= 3 && p[0] == 0xE2 && p[1] == 0x81 && p[2] == 0x9F) return 3; /* U+205F */
    if (left >= 3 && p[0] == 0xE3 && p[1] == 0x80 && p[2] == 0x80) return 3; /* U+3000 */
    return 0;
}

/* [*b, *e): s[0..n) without Python's strip() white space at either end. */
static void py_strip(const char *s, size_t n, size_t *b, size_t *e) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, k;
    while (i < n && (k = py_space(u + i, n - i)) > 0) i += k;
    size_t j = n;
    for (bool more = true; more && j > i;) {
        more = false;
        for (k = 1; k <= 3 && k <= j - i; k++) /* the last character, 1 to 3 bytes */
            if (py_space(u + j - k, k) == k) {
                j -= k;
                more = true;
                break;
            }
    }
    *b = i;
    *e = j;
}

/* transformers' continue_final_message (vLLM's): the rendered prompt ends
 * right after the final message's text (its last text part), so the model
 * continues it instead of starting a turn: the last place its stripped text
 * appears, then its length as sent where the template kept it whole, else
 * without trailing white space. Both texts carry the guard marks. */
static bool continue_final(char *text, size_t *len, const char *final, api_error *err) {
    const size_t fl = strlen(final);
    size_t b, e;
    py_strip(final, fl, &b, &e);
    const char *loc = NULL;
    for (const char *p = text;
         e > b && (p = memmem(p, *len - (size_t)(p - text), final + b, e - b)) != NULL; p++)
        loc = p;
    if (e == b) loc = text + *len; /* "" is found at the end (Python's rindex) */
    if (!loc)
        return api_fail(err, 400, "continue_final_message",
                        "continue_final_message: the final message does not appear in the "
                        "prompt the chat template renders");
    const size_t at = (size_t)(loc - text), keep = fl - b; /* len(final.lstrip()) */
    size_t cut = at + (e - b);
    if (b == 0 && at + keep <= *len && memcmp(loc, final, keep) == 0) cut = at + keep;
    *len = cut;
    text[cut] = 0;
    return true;
}

/* The final message's text as continue_final message reads it (a string, or
 * the last text part), guarded as the template saw it; malloc'd. */
static char *final_text(srv *s, const cJSON *body, api_error *err) {
    const cJSON *msgs = req_field(body, "messages"), *last = NULL;
    for (const cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL; m; m = m->next) last = m;
    const cJSON *c = last ? req_field(last, "content") : NULL;
    const char *t = cJSON_IsString(c) ? c->valuestring : NULL;
    for (const cJSON *p = cJSON_IsArray(c) ? c->child : NULL; p; p = p->next) {
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(pt)) t = pt->valuestring;
    }
    if (!t) {
        api_fail(err, 400, "continue_final_message",
                 "continue_final_message: the final message has no text to continue");
        return NULL;
    }
    size_t n = 0;
    char *g = srv_guard_string(s->vocab, t, strlen(t), &n);
    if (!g) api_fail(err, 500, NULL, "out of memory");
    return g;
}

/* Renders the conversation with the model's template and tokenizes it with
 * tokenize_chat.
 * With tools, a template that renders them gets the request's list; one that
 * does not (or the built-in families) gets them described in the system
 * message. tool_choice "none" renders them but parses nothing (as vLLM). */
static bool parse_chat_prompt(srv *s, const cJSON *body, srv_job *j, api_error *err) {
    bool add_gen = true, cont = false;
    if (!req_bool(body, "add_generation_prompt", &add_gen, err) ||
        !req_bool(body, "continue_final_message", &cont, err))
        return false;
    if (cont && add_gen && req_field(body, "add_generation_prompt"))
        return api_fail(err, 400, "continue_final_message",
                        "continue_final_message and add_generation_prompt cannot both be true");
    /* --prefill-assistant (llama-server's default): a final assistant message
     * is continued unless the request says otherwise */
    if (s->cfg.prefill_assistant && !req_field(body, "continue_final_message") &&
        !req_field(body, "add_generation_prompt")) {
        const cJSON *msgs = req_field(body, "messages");
        const cJSON *last =
            cJSON_IsArray(msgs) ? cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1) : NULL;
        const cJSON *role = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
        cont = cJSON_IsString(role) && strcmp(role->valuestring, "assistant") == 0;
    }
    if (cont) add_gen = false; /* the final message is left open instead */
    if (req_field(body, "parse_special"))
        return api_fail(err, 400, "parse_special",
                        "'parse_special' is for /v1/completions: chat messages are text");
    if (!parse_tools(s, body, j, err)) return false;
    bool template_tools = s->jinja && s->caps.reads_tools && j->tools.n > 0;
    char *system_extra = NULL;
    if (j->tools.n > 0 && j->tools.choice != TOOL_CHOICE_NONE && !template_tools) {
        system_extra = tool_system_prompt(j->parse_fmt, &j->tools);
        if (!system_extra) return api_fail(err, 500, NULL, "out of memory");
    }
    char *text = NULL;
    size_t len = 0;
    if (s->jinja) {
        const cJSON *arr = req_field(body, "messages");
        if (!cJSON_IsArray(arr) || !arr->child) {
            free(system_extra);
            return api_fail(err, 400, "messages", "'messages' must be a non-empty array");
        }
        text = srv_jinja_render(s, body, add_gen, template_tools ? j->tools.tools : NULL,
                                system_extra, &len, err);
        free(system_extra);
        if (!text) return false;
    } else {
        chat_msg *msgs = NULL;
        int n = 0;
        bool ok = parse_messages(s, body, system_extra, &msgs, &n, err);
        free(system_extra);
        if (!ok) return false;
        if (s->chat == CHAT_TMPL_UNKNOWN) {
            free_msgs(msgs, n);
            return api_fail(err, 400, "messages", "%s", s->chat_error);
        }
        kvl_error kerr = {{0}};
        int64_t l =
            chat_template_render(s->chat, s->bos_text, s->eos_text, msgs, n, add_gen, &text, &kerr);
        free_msgs(msgs, n);
        if (l < 0) return api_fail(err, 400, "messages", "%s", kerr.msg);
        len = (size_t)l;
    }
    if (cont) {
        char *final = final_text(s, body, err);
        bool ok = final && continue_final(text, &len, final, err);
        free(final);
        if (!ok) {
            free(text);
            return false;
        }
    }
    j->in_think =
        j->think && prompt_opens_think(text, len, s->caps.think_open, s->caps.think_close);
    bool ok = tokenize_chat(s, text, &len, j, err);
    j->prompt_text = text; /* unguarded: the text tokenized */
    text[len] = 0;
    if (ok && (j->tools.choice == TOOL_CHOICE_REQUIRED || j->tools.choice == TOOL_CHOICE_NAMED))
        ok = build_tool_grammar(s, j, err);
    if (ok && (j->budget_tokens >= 0 || j->reasoning_control))
        ok = setup_budget(s, j, text, len, err);
    return ok;
}

/* ----------------------------------------------------------- sampling -- */

/* Any integer from -2^63 to 2^64 - 1 (clients send 64-bit seeds), as uint64.
 * Read from the number's source text when the body parser kept it
 * (json_parse_body), since a double holds integers exactly only to 2^53. */
static bool seed_from_text(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (s[0] == '-') {
        long long x = strtoll(s, &end, 10);
        if (errno || *end || end == s) return false;
        *out = (uint64_t)x;
    } else {
        unsigned long long x = strtoull(s, &end, 10);
        if (errno || *end || end == s) return false;
        *out = (uint64_t)x;
    }
    return true;
}

static bool opt_seed(const cJSON *o, uint64_t *out, api_error *err) {
    const cJSON *v = req_field(o, "seed");
    if (!v) return true;
    /* Else (1e3, 5.0, out of range) the double decides. */
    if (cJSON_IsNumber(v) && v->valuestring && seed_from_text(v->valuestring, out)) return true;
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0.5;
    if (d != floor(d) || d < -9223372036854775808.0 || d >= 18446744073709551616.0)
        return api_fail(err, 400, "seed", "'seed' must be an integer");
    *out = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    return true;
}

/* llama-server's names on the OpenAI endpoints (llama.cpp's web UI sends them):
 * repeat_penalty over the last repeat_last_n tokens of the prompt and output
 * (64 unless given; -1 all), llama's penalty, instead of vLLM's
 * repetition_penalty; typ_p for typical_p. */
static bool parse_llama_names(const cJSON *b, srv_job *j, api_error *err) {
    sampler_params *p = &j->sampling;
    const cJSON *rp = req_field(b, "repeat_penalty"), *rl = req_field(b, "repeat_last_n");
    if (req_field(b, "typ_p")) {
        if (req_field(b, "typical_p"))
            return api_fail(err, 400, "typ_p", "give 'typical_p' or 'typ_p' (its alias), not both");
        if (!req_float(b, "typ_p", -1e30, 1e30, &p->typical_p, err)) return false;
        p->typical_p = sampler_typical_from_llama(p->typical_p);
    }
    if (!rp && !rl) return true;
    if (req_field(b, "repetition_penalty"))
        return api_fail(err, 400, "repeat_penalty",
                        "give 'repeat_penalty' (llama-server's, over the last repeat_last_n "
                        "tokens) or 'repetition_penalty' (vLLM's), not both");
    int64_t last_n = 64;
    p->repeat_penalty = 1.0f;
    if (!req_float(b, "repeat_penalty", 0, 1e30, &p->repeat_penalty, err) ||
        !req_int(b, "repeat_last_n", -1, INT32_MAX, &last_n, err))
        return false;
    if (p->repeat_penalty <= 0)
        return api_fail(err, 400, "repeat_penalty", "'repeat_penalty' must be positive");
    p->penalty_last_n = (int32_t)last_n;
    j->penalize_prompt = true; /* llama's window reaches into the prompt */
    return true;
}

/* OpenAI defaults (temperature 1, nothing else), not llama.cpp's. */
static bool parse_sampling(const srv *s, const cJSON *b, srv_job *j, api_error *err) {
    sampler_params *p = &j->sampling;
    sampler_params_default(p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->penalty_last_n = -1;
    p->seed = kvl_random_u64();
    /* the server's sampling flags over OpenAI's defaults */
    sampler_params_apply(p, &s->cfg.sampling, s->cfg.sampling_set);
    int64_t top_k = p->top_k;
    bool ok = req_float(b, "temperature", 0, 100, &p->temperature, err) &&
              req_float(b, "top_p", 0, 1, &p->top_p, err) &&
              req_int(b, "top_k", -1, 1 << 30, &top_k, err) &&
              req_float(b, "min_p", 0, 1, &p->min_p, err) &&
              req_float(b, "presence_penalty", -2, 2, &p->presence_penalty, err) &&
              req_float(b, "frequency_penalty", -2, 2, &p->frequency_penalty, err) &&
              req_float(b, "repetition_penalty", 0, 100, &p->repeat_penalty, err) &&
              opt_seed(b, &p->seed, err) && srv_parse_llama_samplers(b, p, err);
    if (ok) p->top_k = (int32_t)(top_k < 0 ? 0 : top_k); /* (before the list switches it off) */
    ok = ok && parse_llama_names(b, j, err) && srv_parse_sampler_list(b, p, err);
    if (!ok) return false;
    if (p->top_p <= 0 && req_field(b, "top_p")) /* (a server's --top-p 0 is its own) */
        return api_fail(err, 400, "top_p", "'top_p' must be in (0, 1]");
    if (p->repeat_penalty <= 0)
        return api_fail(err, 400, "repetition_penalty", "'repetition_penalty' must be positive");
    j->vary_seed = p->temperature > 0;
    return true;
}

/* stop: a string or an array of strings, bounded in number and length (the
 * engine matches them incrementally, but holds their tables per choice). */
static bool add_stop(const cJSON *v, srv_job *j, api_error *err) {
    if (!cJSON_IsString(v))
        return api_fail(err, 400, "stop", "'stop' must be a string or an array of strings");
    if (j->n_stop == SRV_MAX_STOP)
        return api_fail(err, 400, "stop", "at most %d stop strings are supported", SRV_MAX_STOP);
    size_t len = strlen(v->valuestring);
    if (len > ENGINE_MAX_STOP_BYTES)
        return api_fail(err, 400, "stop",
                        "stop[%d] is %zu bytes long: at most %d bytes are supported", j->n_stop,
                        len, ENGINE_MAX_STOP_BYTES);
    if (!(j->stop[j->n_stop] = strdup(v->valuestring)))
        return api_fail(err, 500, NULL, "out of memory");
    j->n_stop++;
    return true;
}

static bool parse_stop(const cJSON *b, srv_job *j, api_error *err) {
    const cJSON *st = req_field(b, "stop");
    if (!st) return true;
    if (!cJSON_IsArray(st)) return add_stop(st, j, err);
    for (const cJSON *v = st->child; v; v = v->next)
        if (!add_stop(v, j, err)) return false;
    return true;
}

/* logprobs: completions take an int (alternatives per token), chat a bool plus
 * top_logprobs. */
static bool parse_logprobs(const cJSON *b, bool chat, api_req *r, api_error *err) {
    int64_t k = 0;
    if (!chat) {
        if (!req_int(b, "logprobs", 0, SRV_MAX_TOP, &k, err)) return false;
        r->logprobs = req_field(b, "logprobs") != NULL;
    } else {
        if (!req_bool(b, "logprobs", &r->logprobs, err) ||
            !req_int(b, "top_logprobs", 0, SRV_MAX_TOP, &k, err))
            return false;
        if (k > 0 && !r->logprobs)
            return api_fail(err, 400, "top_logprobs",
                            "'top_logprobs' requires 'logprobs' to be true");
    }
    r->job->top_logprobs = (int)k;
    r->job->logprobs = r->logprobs;
    return req_bool(b, "return_tokens_as_token_ids", &r->tokens_as_ids, err);
}

static bool parse_unsupported(const cJSON *b, bool chat, api_error *err) {
    /* Chat-only fields change what a completion means: refused there, not ignored. */
    static const char *const chat_only[] = {"tools", "tool_choice", "parallel_tool_calls",
                                            "reasoning_effort"};
    for (int i = 0; !chat && i < 4; i++)
        if (req_field(b, chat_only[i]))
            return api_fail(err, 400, chat_only[i],
                            "'%s' is only supported by /v1/chat/completions", chat_only[i]);
    int64_t best_of = 1;
    if (!req_int(b, "best_of", 1, SRV_MAX_N, &best_of, err)) return false;
    if (best_of > 1) return api_fail(err, 400, "best_of", "'best_of' is not supported");
    return true;
}

/* logit_bias: {"token id": bias in -100..100}, added to the logits before
 * sampling (OpenAI's rule; -100 all but bans a token, 100 all but forces it). */
static bool parse_logit_bias(srv *s, const cJSON *b, srv_job *j, api_error *err) {
    const cJSON *lb = req_field(b, "logit_bias");
    if (!lb) return true;
    if (!cJSON_IsObject(lb))
        return api_fail(err, 400, "logit_bias",
                        "'logit_bias' must be an object of token ids (as strings) and biases");
    for (const cJSON *e = lb->child; e; e = e->next) {
        char *end = NULL;
        errno = 0;
        long long id = strtoll(e->string, &end, 10);
        if (!e->string[0] || *end || errno)
            return api_fail(err, 400, "logit_bias", "'logit_bias': key \"%.40s\" is not a token id",
                            e->string);
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= -100 && e->valuedouble <= 100))
            return api_fail(err, 400, "logit_bias",
                            "'logit_bias': token %lld's bias must be a number from -100 to 100",
                            id);
        if (!job_add_logit_bias(s, j, id, e->valuedouble, "logit_bias", err)) return false;
    }
    job_logit_bias_finish(j);
    return true;
}

static bool parse_stream(const cJSON *b, api_req *r, api_error *err) {
    if (!req_bool(b, "stream", &r->stream, err)) return false;
    const cJSON *so = req_field(b, "stream_options");
    if (!so) return true;
    if (!cJSON_IsObject(so))
        return api_fail(err, 400, "stream_options", "'stream_options' must be an object");
    bool continuous = false;
    if (!req_bool(so, "include_usage", &r->include_usage, err) ||
        !req_bool(so, "continuous_usage_stats", &continuous, err))
        return false;
    r->continuous_usage = continuous && r->include_usage; /* vLLM's: only with include_usage */
    return true;
}

/* vLLM's prompt_logprobs: each prompt position's log-probability, its rank
 * and the top k there, in the answer (not in a stream, as vLLM: 400 there;
 * r->prompt_logprobs -1 when none are to be computed).
 * -1, vLLM's whole vocabulary, is beyond the 20 alternatives kvllm gives. */
static bool parse_prompt_logprobs(const cJSON *b, api_req *r, api_error *err) {
    int64_t k = -1;
    const cJSON *v = req_field(b, "prompt_logprobs");
    if (v && cJSON_IsNumber(v) && v->valuedouble == -1)
        return api_fail(err, 400, "prompt_logprobs",
                        "'prompt_logprobs' -1 (the whole vocabulary) is not supported: at most "
                        "%d alternatives a position",
                        SRV_MAX_TOP);
    if (!req_int(b, "prompt_logprobs", 0, SRV_MAX_TOP, &k, err)) return false;
    if (k > 0 && r->stream)
        return api_fail(err, 400, "prompt_logprobs",
                        "'prompt_logprobs' are not available when stream is true (vLLM's rule)");
    r->prompt_logprobs = r->stream ? -1 : (int)k; /* 0 in a stream: vLLM sends none */
    return true;
}

/* max_tokens: checked against the context; when absent, the server's -n, else
 * completions default to 16 (OpenAI's default) and chat to whatever room the
 * context and the pool leave, so that a request never needs more blocks than
 * the pool has. */
static bool parse_max_tokens(srv *s, const cJSON *b, bool chat, bool echo, srv_job *j,
                             api_error *err) {
    const char *key =
        chat && req_field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    int64_t unused;
    /* both given: max_completion_tokens counts (OpenAI's newer name, vLLM's
     * rule), but a max_tokens that is not a token count is still an error */
    const cJSON *mt = req_field(b, "max_tokens");
    if (strcmp(key, "max_tokens") != 0 && mt && !(cJSON_IsNumber(mt) && mt->valuedouble == -1) &&
        !req_int(b, "max_tokens", 0, INT32_MAX, &unused, err))
        return false;
    const char *pkey = chat ? "messages" : "prompt";
    const cJSON *v = req_field(b, key);
    int64_t n_prompt = 0; /* the longest of the request's prompts */
    for (int k = 0; k < j->n_prompts; k++) {
        int64_t n;
        job_prompt(j, k, &n);
        if (n > n_prompt) n_prompt = n;
    }
    if (echo && v && cJSON_IsNumber(v) && v->valuedouble == 0) { /* the prompt's logprobs alone */
        if (n_prompt > s->n_ctx)
            return api_fail(err, 400, pkey, "the prompt (%lld tokens) is longer than the context",
                            (long long)n_prompt);
        j->max_tokens = 0;
        return true;
    }
    /* -1: llama-server's "until the context is full" (llama.cpp's web UI sends it) */
    const bool unlimited = v && cJSON_IsNumber(v) && v->valuedouble == -1;
    if (v && cJSON_IsNumber(v) && v->valuedouble < 1 && !unlimited)
        return api_fail(err, 400, key,
                        "'%s' must be at least 1 (got %g), or -1 (to the end of "
                        "the context)",
                        key, v->valuedouble);
    int64_t max_tokens = -1;
    if (!unlimited && !req_int(b, key, 1, INT32_MAX, &max_tokens, err)) return false;
    if (n_prompt == 0) return api_fail(err, 400, pkey, "the prompt is empty");
    int64_t room = s->n_ctx < s->n_blocks * s->block_size ? s->n_ctx : s->n_blocks * s->block_size;
    if (n_prompt >= s->n_ctx || (max_tokens > 0 && n_prompt + max_tokens > s->n_ctx)) {
        api_fail(err, 400, max_tokens > 0 && n_prompt < s->n_ctx ? key : pkey,
                 "This model's maximum context length is %lld tokens. However, you requested %lld "
                 "tokens "
                 "(%lld in the prompt, %lld for the completion). Please reduce the prompt or the "
                 "completion.",
                 (long long)s->n_ctx, (long long)(n_prompt + (max_tokens > 0 ? max_tokens : 0)),
                 (long long)n_prompt, (long long)(max_tokens > 0 ? max_tokens : 0));
        err->code = "context_length_exceeded";
        return false;
    }
    if (max_tokens < 0) { /* the server's -n, else OpenAI's defaults */
        max_tokens = room - n_prompt;
        if (s->cfg.n_predict > 0 && max_tokens > s->cfg.n_predict) max_tokens = s->cfg.n_predict;
        else if (s->cfg.n_predict == 0 && !chat && !unlimited && max_tokens > 16) max_tokens = 16;
        if (max_tokens < 1) max_tokens = 1; /* the engine explains why it cannot run */
    }
    j->max_tokens = max_tokens;
    return true;
}

static void make_id(api_req *r) {
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", r->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)kvl_random_u64(),
             (unsigned long long)(kvl_random_u64() & 0xffffffffu));
    r->created = (long)time(NULL);
}

/* A list of token ids (1..max of them, each in the vocabulary) into *out
 * (malloc'd), as vLLM's stop_token_ids and allowed_token_ids. */
static bool id_list(srv *s, const cJSON *b, const char *k, int max, int32_t **out, int *n,
                    api_error *err) {
    const cJSON *v = req_field(b, k);
    if (!v) return true;
    const int m = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (m < 1 || m > max)
        return api_fail(err, 400, k, "'%s' must be an array of 1 to %d token ids", k, max);
    if (!(*out = malloc((size_t)m * sizeof **out)))
        return api_fail(err, 500, NULL, "out of memory");
    const int32_t V = tok_n_vocab(s->vocab);
    for (const cJSON *e = v->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= V)
            return api_fail(err, 400, k, "'%s[%d]' is not a token id (0..%d)", k, *n, V - 1);
        (*out)[(*n)++] = (int32_t)e->valuedouble;
    }
    return true;
}

/* One token sequence onto j's bad words (false: a 400 naming bad_words). */
static bool add_bad(srv_job *j, const int32_t *ids, int64_t n, const char *word, api_error *err) {
    if (n < 1 || n > ENGINE_MAX_BAD_LEN || j->n_bad == ENGINE_MAX_BAD)
        return api_fail(err, 400, "bad_words",
                        "'bad_words': '%.40s' is %lld tokens (1 to %d), or the list is over %d "
                        "token sequences",
                        word, (long long)n, ENGINE_MAX_BAD_LEN, ENGINE_MAX_BAD);
    int total = 0;
    for (int i = 0; i < j->n_bad; i++) total += j->bad_lens[i];
    int32_t *ids2 = realloc(j->bad_ids, (size_t)(total + n) * sizeof *ids2);
    if (ids2) j->bad_ids = ids2;
    int32_t *lens2 = ids2 ? realloc(j->bad_lens, (size_t)(j->n_bad + 1) * sizeof *lens2) : NULL;
    if (lens2) j->bad_lens = lens2;
    if (!ids2 || !lens2) return api_fail(err, 500, NULL, "out of memory");
    memcpy(j->bad_ids + total, ids, (size_t)n * sizeof *ids);
    j->bad_lens[j->n_bad++] = (int32_t)n;
    return true;
}

/* vLLM's bad_words: each word's tokens (stripped on the left), and those of
 * " " + word where they begin with another token and are as many (the word in
 * the middle of a text), as vLLM's update_from_tokenizer makes them. */
static bool parse_bad_words(srv *s, const cJSON *b, srv_job *j, api_error *err) {
    const cJSON *v = req_field(b, "bad_words");
    if (!v) return true;
    if (!cJSON_IsArray(v))
        return api_fail(err, 400, "bad_words", "'bad_words' must be an array of strings");
    for (const cJSON *w = v->child; w; w = w->next) {
        if (!cJSON_IsString(w))
            return api_fail(err, 400, "bad_words", "'bad_words' must be an array of strings");
        const char *word = w->valuestring;
        while (*word == ' ' || (*word >= '\t' && *word <= '\r')) word++;
        if (!*word) return api_fail(err, 400, "bad_words", "'bad_words' holds an empty word");
        char *spaced = malloc(strlen(word) + 2);
        if (!spaced) return api_fail(err, 500, NULL, "out of memory");
        spaced[0] = ' ';
        strcpy(spaced + 1, word);
        int64_t na = 0, nb = 0;
        const tok_mode mode = {.parse_special = true};
        int32_t *a = srv_encode(s, word, strlen(word), false, mode, &na, "bad_words", err);
        int32_t *c =
            a ? srv_encode(s, spaced, strlen(spaced), false, mode, &nb, "bad_words", err) : NULL;
        bool ok = a && c && add_bad(j, a, na, word, err) &&
                  (!(nb == na && c[0] != a[0]) || add_bad(j, c, nb, word, err));
        free(a), free(c), free(spaced);
        if (!ok) return false;
    }
    return true;
}

/* vLLM's sampling extras: stop_token_ids, min_tokens, include_stop_str_in_output,
 * allowed_token_ids, skip_special_tokens, bad_words (engine_request says what
 * each does). */
static bool parse_vllm(srv *s, const cJSON *b, srv_job *j, api_error *err) {
    bool skip_special = !s->cfg.special; /* (the server's --special) */
    if (!id_list(s, b, "stop_token_ids", ENGINE_MAX_STOP_IDS, &j->stop_ids, &j->n_stop_ids, err) ||
        !id_list(s, b, "allowed_token_ids", tok_n_vocab(s->vocab), &j->allowed, &j->n_allowed,
                 err) ||
        !req_int(b, "min_tokens", 0, s->n_ctx, &j->min_tokens, err) ||
        !req_bool(b, "include_stop_str_in_output", &j->include_stop, err) ||
        !req_bool(b, "skip_special_tokens", &skip_special, err) || !parse_bad_words(s, b, j, err))
        return false;
    j->keep_all_special = !skip_special;
    /* llama-server's --special prints the end-of-generation token too; vLLM's
     * skip_special_tokens false alone does not */
    j->eog_text = s->cfg.special && j->keep_all_special;
    return true;
}

/* vLLM's truncate_prompt_tokens: k keeps each prompt's last k tokens (-1: as
 * many as the context holds). After the prompts are made. */
static bool truncate_prompts(srv *s, const cJSON *b, srv_job *j, api_error *err) {
    int64_t k = 0;
    if (!req_int(b, "truncate_prompt_tokens", -1, s->n_ctx, &k, err)) return false;
    if (k == 0 && req_field(b, "truncate_prompt_tokens"))
        return api_fail(err, 400, "truncate_prompt_tokens",
                        "'truncate_prompt_tokens' must be -1 (the context) or at least 1");
    if (k == -1) k = s->n_ctx;
    for (int p = 0; k > 0 && p < j->n_prompts; p++) {
        int32_t *ids = p ? j->prompts[p] : j->prompt;
        int64_t *n = p ? &j->prompt_lens[p] : &j->n_prompt;
        if (*n <= k) continue;
        memmove(ids, ids + (*n - k), (size_t)k * sizeof *ids);
        *n = k;
    }
    return true;
}

static bool parse_body(srv *s, const cJSON *b, bool chat, api_req *r, api_error *err) {
    srv_job *j = r->job;
    const char *model = NULL, *salt = NULL;
    int64_t n = 1, prio = 0;
    if (!req_string(b, "model", &model, err)) return false;
    if (model && !srv_model_known(s, model)) {
        api_fail(err, 404, "model", "The model `%s` does not exist.", model);
        err->code = "model_not_found";
        return false;
    }
    bool ok = parse_unsupported(b, chat, err) && parse_sampling(s, b, j, err) &&
              parse_logit_bias(s, b, j, err) && parse_stop(b, j, err) && parse_stream(b, r, err) &&
              parse_logprobs(b, chat, r, err) && req_int(b, "n", 1, SRV_MAX_N, &n, err) &&
              req_bool(b, "ignore_eos", &j->ignore_eos, err) &&
              req_string(b, "cache_salt", &salt, err) && parse_structured(s, b, j, err) &&
              req_int(b, "priority", -2147483647, 2147483647, &prio, err) &&
              parse_vllm(s, b, j, err);
    bool speculative = true, progress = false;
    ok = ok && req_bool(b, "speculative", &speculative, err) &&
         req_bool(b, "timings_per_token", &j->timings_per_token, err) &&
         req_bool(b, "return_progress", &progress, err);
    j->return_progress = progress && r->stream; /* llama-server sends progress in streams only */
    ok = ok && srv_lora_job(s, b, model, j, err);
    if (!ok) return false;
    j->no_speculative = !speculative;
    /* vLLM's rule: a priority means nothing to first-come-first-served, so it is refused */
    if (prio != 0 && !s->priority_sched)
        return api_fail(err, 400, "priority",
                        "'priority' is %lld but the server schedules first-come-first-served "
                        "(start it with --scheduling-policy priority)",
                        (long long)prio);
    j->priority = (int)prio;
    if (salt && !salt[0])
        return api_fail(err, 400, "cache_salt", "'cache_salt' must be a non-empty string");
    if (salt && !(j->cache_salt = strdup(salt))) return api_fail(err, 500, NULL, "out of memory");
    j->n = (int)n;
    ok = chat ? parse_chat_prompt(s, b, j, err) : parse_prompt(s, b, j, err);
    ok = ok && truncate_prompts(s, b, j, err);
    j->per_prompt = j->n;
    j->n *= j->n_prompts; /* several prompts: n choices each, prompt-major */
    ok = ok && req_bool(b, "echo", &r->echo, err);
    if (ok && r->echo) { /* a text prompt is echoed as sent; ids as their text (srv_echo_prepare) */
        const cJSON *p = req_field(b, "prompt");
        const cJSON *e = cJSON_IsArray(p) && !cJSON_IsNumber(p->child) ? p->child : p;
        for (int k = 0; e && k < j->n_prompts; e = e->next, k++) {
            if (!cJSON_IsString(e)) continue;
            if (!(r->echo_text[k] = strdup(e->valuestring)))
                return api_fail(err, 500, NULL, "out of memory");
            r->echo_len[k] = strlen(e->valuestring);
        }
    }
    ok = ok && parse_prompt_logprobs(b, r, err);
    ok = ok && parse_max_tokens(s, b, chat, r->echo, j, err);
    if (ok && j->max_tokens > 0 && j->min_tokens > j->max_tokens)
        return api_fail(err, 400, "min_tokens",
                        "'min_tokens' (%lld) is more than max_tokens (%lld)",
                        (long long)j->min_tokens, (long long)j->max_tokens);
    return ok;
}

/* The server's grammar (--grammar, --grammar-file, --json-schema, as
 * llama-server takes them) for a request that constrains nothing itself and
 * has no tools (whose calls follow their own format). */
static bool default_grammar(srv *s, srv_job *j, api_error *err) {
    if (!s->cfg.grammar || j->grammar || j->tools.n > 0) return true;
    kvl_error ke = {{0}};
    j->grammar = grammar_compile(s->cfg.grammar, s->vocab, &ke);
    return j->grammar || api_fail(err, 500, NULL, "the server's grammar: %s", ke.msg);
}

bool openai_parse(srv *s, const cJSON *body, bool chat, api_req *r, api_error *err) {
    memset(r, 0, sizeof *r);
    r->prompt_logprobs = -1;
    r->chat = chat;
    if (!cJSON_IsObject(body))
        return api_fail(err, 400, NULL, "the request body must be a JSON object");
    r->job = job_new(s);
    if (!r->job) return api_fail(err, 500, NULL, "out of memory");
    make_id(r);
    memcpy(r->job->cmpl_id, r->id, sizeof r->job->cmpl_id); /* what .../control names */
    if (check_fields(body, chat, err) && parse_body(s, body, chat, r, err) &&
        default_grammar(s, r->job, err))
        return true;
    api_req_free(r); /* the job, and what parse_body made beside it (echo texts) */
    return false;
}

void api_req_free(api_req *r) {
    job_release(r->job);
    r->job = NULL;
    responses_req_free(r->resp);
    r->resp = NULL;
    anthropic_req_free(r->anth);
    r->anth = NULL;
    llama_req_free(r->llama);
    r->llama = NULL;
    for (int k = 0; k < SRV_MAX_N; k++) {
        free(r->echo_text[k]), free(r->echo_lp[k]), free(r->echo_top_ids[k]),
            free(r->echo_top_lps[k]);
        r->echo_text[k] = NULL, r->echo_lp[k] = NULL, r->echo_top_ids[k] = NULL;
        r->echo_top_lps[k] = NULL;
        free(r->plp_lp[k]), free(r->plp_top_ids[k]), free(r->plp_top_lps[k]), free(r->plp_rank[k]);
        r->plp_lp[k] = NULL, r->plp_top_ids[k] = NULL, r->plp_top_lps[k] = NULL;
        r->plp_rank[k] = NULL;
    }
}
