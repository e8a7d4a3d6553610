/* POST /v1/responses, the response side: the chat answer's SSE chunks
 * (openai_stream_events) rewritten into the Responses API's events
 * (response.created, output items with their content parts and deltas,
 * response.completed / .incomplete / .failed), and the final response object
 * those events end with, which is also the non-streaming answer. The request
 * side and why it is built this way: srv_responses.c. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

enum { OPEN_NONE, OPEN_REASONING, OPEN_MESSAGE, OPEN_CALL };

static const char *str_member(const cJSON *o, const char *k) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* ----------------------------------------------------------- response -- */

static void echo_or(cJSON *o, const cJSON *echo, const char *k, cJSON *dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(echo, k);
    if (v) {
        cJSON_AddItemToObject(o, k, cJSON_Duplicate(v, true));
        cJSON_Delete(dflt);
    } else {
        cJSON_AddItemToObject(o, k, dflt);
    }
}

/* The chat usage as Responses names it (kvllm's KV fields kept). */
static cJSON *usage_of(const resp_req *q) {
    const cJSON *u = q->usage;
    cJSON *o = cJSON_CreateObject();
    double in = cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens")),
           out = cJSON_GetNumberValue(cJSON_GetObjectItem(u, "completion_tokens"));
    cJSON_AddNumberToObject(o, "input_tokens", u ? in : 0);
    const cJSON *pd = cJSON_GetObjectItem(u, "prompt_tokens_details");
    cJSON_AddItemToObject(o, "input_tokens_details",
                          pd ? cJSON_Duplicate(pd, true) : cJSON_CreateObject());
    cJSON_AddNumberToObject(o, "output_tokens", u ? out : 0);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "output_tokens_details"), "reasoning_tokens",
                            (double)q->reasoning_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", u ? in + out : 0);
    static const char *const kv[] = {"kv_lower_bound_bytes", "kv_allocated_bytes"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItem(u, kv[i]);
        if (v) cJSON_AddItemToObject(o, kv[i], cJSON_Duplicate(v, false));
    }
    return o;
}

/* The response object; status "in_progress" while streaming, then
 * "completed", "incomplete" (cut by max_output_tokens) or "failed". */
static cJSON *response_object(srv *s, const api_req *r, const char *status, const api_error *e) {
    const resp_req *q = r->resp;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)r->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddBoolToObject(o, "background", false);
    if (e) {
        cJSON *err = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(err, "code", e->code ? e->code : "server_error");
        cJSON_AddStringToObject(err, "message", e->msg);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason",
                                "max_output_tokens");
    else cJSON_AddNullToObject(o, "incomplete_details");
    const cJSON *echo = q->echo;
    echo_or(o, echo, "instructions", cJSON_CreateNull());
    echo_or(o, echo, "max_output_tokens", cJSON_CreateNull());
    cJSON_AddNullToObject(o, "max_tool_calls");
    cJSON_AddStringToObject(o, "model", job_model_name(s, r->job));
    cJSON_AddItemToObject(o, "output", cJSON_Duplicate(q->output, true));
    echo_or(o, echo, "parallel_tool_calls", cJSON_CreateTrue());
    if (q->previous) cJSON_AddStringToObject(o, "previous_response_id", q->previous);
    else cJSON_AddNullToObject(o, "previous_response_id");
    cJSON *rs = cJSON_CreateObject();
    const cJSON *re = cJSON_GetObjectItem(echo, "reasoning");
    const cJSON *eff = re ? cJSON_GetObjectItem(re, "effort") : NULL;
    cJSON_AddItemToObject(rs, "effort", eff ? cJSON_Duplicate(eff, false) : cJSON_CreateNull());
    cJSON_AddNullToObject(rs, "summary");
    cJSON_AddItemToObject(o, "reasoning", rs);
    cJSON_AddBoolToObject(o, "store", q->store);
    echo_or(o, echo, "temperature", cJSON_CreateNumber(1));
    cJSON *text = cJSON_CreateObject();
    const cJSON *te = cJSON_GetObjectItem(echo, "text");
    const cJSON *fmt = te ? cJSON_GetObjectItem(te, "format") : NULL;
    if (fmt && !cJSON_IsNull(fmt))
        cJSON_AddItemToObject(text, "format", cJSON_Duplicate(fmt, true));
    else cJSON_AddStringToObject(cJSON_AddObjectToObject(text, "format"), "type", "text");
    cJSON_AddItemToObject(o, "text", text);
    echo_or(o, echo, "tool_choice", cJSON_CreateString("auto"));
    echo_or(o, echo, "tools", cJSON_CreateArray());
    echo_or(o, echo, "top_logprobs", cJSON_CreateNumber(0));
    echo_or(o, echo, "top_p", cJSON_CreateNumber(1));
    cJSON_AddStringToObject(o, "truncation", "disabled");
    cJSON_AddItemToObject(o, "usage", q->usage ? usage_of(q) : cJSON_CreateNull());
    echo_or(o, echo, "user", cJSON_CreateNull());
    echo_or(o, echo, "metadata", cJSON_CreateObject());
    return o;
}

/* ------------------------------------------------------------- events -- */

static void emit(resp_req *q, kvl_buf *out, const char *type, cJSON *ev) {
    sse_event(out, type, ev, q->seq++);
}

static cJSON *item_event(const resp_req *q, bool with_content_index) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "item_id", str_member(q->item, "id"));
    cJSON_AddNumberToObject(ev, "output_index", cJSON_GetArraySize(q->output));
    if (with_content_index) cJSON_AddNumberToObject(ev, "content_index", 0);
    return ev;
}

static cJSON *text_part(const char *type, const char *text, const resp_req *q) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddStringToObject(p, "text", text);
    if (!strcmp(type, "output_text")) {
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddItemToObject(
            p, "logprobs", q->item_lps ? cJSON_Duplicate(q->item_lps, true) : cJSON_CreateArray());
    }
    return p;
}

/* The open item as it stands (status: in_progress, completed or incomplete). */
static cJSON *item_now(const resp_req *q, const char *status, bool with_text) {
    cJSON *it = cJSON_Duplicate(q->item, true);
    const char *text = q->text.p ? q->text.p : "";
    if (q->open == OPEN_CALL) cJSON_AddStringToObject(it, "arguments", with_text ? text : "");
    cJSON_AddStringToObject(it, "status", status);
    if (q->open == OPEN_MESSAGE) {
        cJSON *c = cJSON_AddArrayToObject(it, "content");
        if (with_text) cJSON_AddItemToArray(c, text_part("output_text", text, q));
    } else if (q->open == OPEN_REASONING) {
        cJSON_AddArrayToObject(it, "summary");
        cJSON *c = cJSON_AddArrayToObject(it, "content");
        if (with_text) cJSON_AddItemToArray(c, text_part("reasoning_text", text, q));
        cJSON_AddNullToObject(it, "encrypted_content");
    }
    return it;
}

static void close_item(resp_req *q, kvl_buf *out, const char *status) {
    if (q->open == OPEN_NONE) return;
    const char *text = q->text.p ? q->text.p : "";
    if (q->open == OPEN_CALL) {
        cJSON *ev = item_event(q, false);
        cJSON_AddStringToObject(ev, "name", str_member(q->item, "name"));
        cJSON_AddStringToObject(ev, "arguments", text);
        emit(q, out, "response.function_call_arguments.done", ev);
    } else {
        const bool msg = q->open == OPEN_MESSAGE;
        cJSON *ev = item_event(q, true);
        cJSON_AddStringToObject(ev, "text", text);
        if (msg)
            cJSON_AddItemToObject(ev, "logprobs",
                                  q->item_lps ? cJSON_Duplicate(q->item_lps, true)
                                              : cJSON_CreateArray());
        emit(q, out, msg ? "response.output_text.done" : "response.reasoning_text.done", ev);
        ev = item_event(q, true);
        cJSON_AddItemToObject(ev, "part",
                              text_part(msg ? "output_text" : "reasoning_text", text, q));
        emit(q, out, "response.content_part.done", ev);
    }
    cJSON *done = item_now(q, status, true);
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "output_index", cJSON_GetArraySize(q->output));
    cJSON_AddItemToObject(ev, "item", cJSON_Duplicate(done, true));
    emit(q, out, "response.output_item.done", ev);
    cJSON_AddItemToArray(q->output, done);
    cJSON_Delete(q->item);
    cJSON_Delete(q->item_lps);
    q->item = q->item_lps = NULL;
    q->text.len = 0;
    q->open = OPEN_NONE;
}

/* Opens an item of kind k (closing the open one), with its added events. */
static void open_item(resp_req *q, kvl_buf *out, int k, const char *call_id, const char *name) {
    close_item(q, out, "completed");
    static const char *const prefix[] = {"", "rs", "msg", "fc"};
    static const char *const type[] = {"", "reasoning", "message", "function_call"};
    char id[48];
    snprintf(id, sizeof id, "%s_%016llx%08llx", prefix[k], (unsigned long long)kvl_random_u64(),
             (unsigned long long)(kvl_random_u64() & 0xffffffffu));
    q->open = k;
    q->item = cJSON_CreateObject();
    cJSON_AddStringToObject(q->item, "id", id);
    cJSON_AddStringToObject(q->item, "type", type[k]);
    if (k == OPEN_MESSAGE) cJSON_AddStringToObject(q->item, "role", "assistant");
    if (k == OPEN_CALL) {
        cJSON_AddStringToObject(q->item, "call_id", call_id);
        cJSON_AddStringToObject(q->item, "name", name);
    }
    kvl_buf_puts(&q->text, ""); /* text.p is a C string from here on */
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "output_index", cJSON_GetArraySize(q->output));
    cJSON_AddItemToObject(ev, "item", item_now(q, "in_progress", false));
    emit(q, out, "response.output_item.added", ev);
    if (k == OPEN_CALL) return;
    ev = item_event(q, true);
    cJSON_AddItemToObject(ev, "part",
                          text_part(k == OPEN_MESSAGE ? "output_text" : "reasoning_text", "", q));
    emit(q, out, "response.content_part.added", ev);
}

/* Text (or arguments) for the open item of kind k, opened if need be. */
static void add_text(resp_req *q, kvl_buf *out, int k, const char *text, const cJSON *lps) {
    if (q->open != k) open_item(q, out, k, NULL, NULL);
    kvl_buf_puts(&q->text, text);
    cJSON *ev = item_event(q, k != OPEN_CALL);
    cJSON_AddStringToObject(ev, "delta", text);
    if (k == OPEN_MESSAGE) {
        cJSON *l = cJSON_CreateArray();
        for (int pass = 0; pass < 2 && q->logprobs; pass++) {
            const cJSON *src = pass ? lps : q->pending_lps;
            for (const cJSON *e = src ? src->child : NULL; e; e = e->next) {
                cJSON_AddItemToArray(l, cJSON_Duplicate(e, true));
                if (!q->item_lps) q->item_lps = cJSON_CreateArray();
                cJSON_AddItemToArray(q->item_lps, cJSON_Duplicate(e, true));
            }
        }
        cJSON_Delete(q->pending_lps);
        q->pending_lps = NULL;
        cJSON_AddItemToObject(ev, "logprobs", l);
    }
    emit(q, out,
         k == OPEN_MESSAGE ? "response.output_text.delta"
         : k == OPEN_CALL  ? "response.function_call_arguments.delta"
                           : "response.reasoning_text.delta",
         ev);
}

static void start(srv *s, const api_req *r, kvl_buf *out) {
    resp_req *q = r->resp;
    if (q->started) return;
    q->started = true;
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "response", response_object(s, r, "in_progress", NULL));
    emit(q, out, "response.created", ev);
    ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "response", response_object(s, r, "in_progress", NULL));
    emit(q, out, "response.in_progress", ev);
}

/* The response's status from why the engine stopped. */
static const char *status_of(const resp_req *q) {
    switch (q->finish) {
    case ENGINE_FINISH_LENGTH: return "incomplete";
    case ENGINE_FINISH_ERROR: return "failed";
    case ENGINE_FINISH_CANCELLED: return "cancelled";
    default: return "completed";
    }
}

/* The answer as the chat message a continuation will see: reasoning,
 * text and calls of the output items in one assistant message. */
static cJSON *answer_message(const resp_req *q) {
    cJSON *m = cJSON_CreateObject(), *calls = NULL;
    kvl_buf text = {0}, reasoning = {0};
    kvl_buf_puts(&text, "");
    for (const cJSON *it = q->output->child; it; it = it->next) {
        const char *type = str_member(it, "type");
        const cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItem(it, "content"), 0);
        if (!strcmp(type, "function_call")) {
            if (!calls) calls = cJSON_CreateArray();
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", str_member(it, "call_id"));
            cJSON_AddStringToObject(c, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(fn, "name", str_member(it, "name"));
            cJSON_AddStringToObject(fn, "arguments", str_member(it, "arguments"));
            cJSON_AddItemToArray(calls, c);
        } else if (str_member(part, "text")) {
            kvl_buf_puts(!strcmp(type, "reasoning") ? &reasoning : &text, str_member(part, "text"));
        }
    }
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", text.p);
    if (reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", reasoning.p);
    if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
    kvl_buf_free(&text);
    kvl_buf_free(&reasoning);
    return m;
}

/* A finished response with store: true is kept: its conversation with the
 * answer, and its response object. */
static void keep(srv *s, const api_req *r, const char *status) {
    resp_req *q = r->resp;
    if (!q->store) return;
    cJSON *o = response_object(s, r, status, NULL);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_AddItemToArray(q->conversation, answer_message(q));
    if (!js || !rstore_put(s->responses, q->tenant, r->id, q->conversation, q->input, js))
        kvl_log(KVL_LOG_WARN, "responses: %s could not be kept (out of memory)", r->id);
    q->conversation = q->input = NULL; /* taken */
}

/* The end: the open item closed, then response.completed / .incomplete
 * (cut by max_output_tokens) or an error and response.failed. */
static void finish(srv *s, const api_req *r, const api_error *e, kvl_buf *out) {
    resp_req *q = r->resp;
    if (q->open == OPEN_REASONING) q->reasoning_tokens += q->tokens_pending; /* cut inside it */
    const char *status = status_of(q);
    api_error engine_err;
    if (!e && !strcmp(status, "failed")) {
        api_fail(&engine_err, 500, NULL, "the engine failed while generating this response");
        e = &engine_err;
    }
    close_item(q, out, strcmp(status, "completed") ? "incomplete" : "completed");
    cJSON *ev = cJSON_CreateObject();
    if (e) {
        cJSON *err = cJSON_AddObjectToObject(ev, "error"); /* the SDKs raise it */
        cJSON_AddStringToObject(err, "message", e->msg);
        cJSON_AddStringToObject(err, "type", e->type ? e->type : "server_error");
        cJSON_AddItemToObject(err, "param",
                              e->param[0] ? cJSON_CreateString(e->param) : cJSON_CreateNull());
        cJSON_AddItemToObject(err, "code",
                              e->code ? cJSON_CreateString(e->code) : cJSON_CreateNull());
        cJSON_AddStringToObject(ev, "message", e->msg);
        emit(q, out, "error", ev);
        q->failed = true;
        q->error = *e;
        ev = cJSON_CreateObject();
        cJSON_AddItemToObject(ev, "response", response_object(s, r, "failed", e));
        emit(q, out, "response.failed", ev);
        return;
    }
    keep(s, r, status);
    cJSON_AddItemToObject(ev, "response", response_object(s, r, status, NULL));
    emit(q, out, strcmp(status, "incomplete") ? "response.completed" : "response.incomplete", ev);
}

/* The sink's side of a conversion. */
typedef struct conv {
    srv *s;
    const api_req *r;
    resp_req *q;
    kvl_buf *out;
} conv;

static void on_reasoning(void *ctx, const char *text) {
    conv *c = ctx;
    add_text(c->q, c->out, OPEN_REASONING, text, NULL);
    c->q->reasoning_tokens += c->q->tokens_pending;
    c->q->tokens_pending = 0;
}

static void on_content(void *ctx, const char *text, const cJSON *lps) {
    conv *c = ctx;
    resp_req *q = c->q;
    if (text[0]) {
        q->tokens_pending = 0;
        add_text(q, c->out, OPEN_MESSAGE, text, lps);
    } else if (q->logprobs) {
        /* a token whose text the parser holds back: its logprobs go with the
         * text when it comes (dropped if it turns out to be a call's) */
        if (!q->pending_lps) q->pending_lps = cJSON_CreateArray();
        for (const cJSON *e = lps->child; e; e = e->next)
            cJSON_AddItemToArray(q->pending_lps, cJSON_Duplicate(e, true));
    }
}

static void on_call(void *ctx, const char *id, const char *name) {
    conv *c = ctx;
    c->q->tokens_pending = 0;
    open_item(c->q, c->out, OPEN_CALL, id, name ? name : "");
    cJSON_Delete(c->q->pending_lps);
    c->q->pending_lps = NULL;
}

static void on_call_args(void *ctx, const char *text) {
    conv *c = ctx;
    c->q->tokens_pending = 0;
    add_text(c->q, c->out, OPEN_CALL, text, NULL);
}

static void on_end(void *ctx, const char *error) {
    conv *c = ctx;
    api_error ae;
    if (error) {
        api_fail(&ae, 500, NULL, "%s", error);
        ae.code = "server_error";
    }
    finish(c->s, c->r, error ? &ae : NULL, c->out);
}

/* The chat chunks in q->sse -> Responses events in out. */
static void convert(srv *s, const api_req *r, kvl_buf *out) {
    start(s, r, out);
    conv c = {s, r, r->resp, out};
    const chunk_sink k = {&c,           on_reasoning, on_content,     on_call,
                          on_call_args, on_end,       &r->resp->usage};
    if (!chat_chunks_read(&r->resp->sse, &k, &r->resp->ended)) out->oom = true;
}

/* Event by event, so that each token is counted with the output its text
 * went to (reasoning_tokens): a token whose text the parser held back counts
 * with the next one that produced a delta. */
void responses_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                             kvl_buf *out) {
    resp_req *q = r->resp;
    for (srv_event *ev = events; ev;) {
        srv_event *next = ev->next;
        ev->next = NULL;
        if (ev->finish != ENGINE_FINISH_NONE) q->finish = ev->finish;
        if (ev->token >= 0) q->tokens_pending++;
        openai_stream_events(s, r, st, ev, &q->sse);
        convert(s, r, out);
        ev->next = next;
        ev = next;
    }
}

void responses_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out) {
    openai_stream_end(s, r, st, &r->resp->sse);
    convert(s, r, out);
}

char *responses_response(srv *s, const api_req *r, srv_event *events) {
    stream_state st = {0};
    kvl_buf events_out = {0};
    responses_stream_events(s, r, &st, events, &events_out);
    stream_state_free(&st);
    kvl_buf_free(&events_out);
    cJSON *o = response_object(s, r, r->resp->failed ? "failed" : status_of(r->resp),
                               r->resp->failed ? &r->resp->error : NULL);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return js;
}
