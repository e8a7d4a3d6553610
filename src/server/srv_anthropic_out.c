/* POST /v1/messages, the answer side: the chat answer's SSE chunks read back
 * (chat_chunks_read) and written as Anthropic's Messages events
 * (message_start; per content block content_block_start, its deltas,
 * content_block_stop; message_delta with the stop reason and usage;
 * message_stop), or, not streaming, as the message those events build. The
 * request side: srv_anthropic.c. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING, BLOCK_TOOL };

void anthropic_req_free(anth_req *q) {
    if (!q) return;
    cJSON_Delete(q->content);
    cJSON_Delete(q->block);
    cJSON_Delete(q->usage);
    kvl_buf_free(&q->sse);
    kvl_buf_free(&q->text);
    free(q);
}

static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
    }
}

char *anthropic_error_json(const api_error *e) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON *err = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(err, "type", error_type(e->status));
    cJSON_AddStringToObject(err, "message", e->msg);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return js;
}

static void emit(kvl_buf *out, const char *type, cJSON *ev) { sse_event(out, type, ev, -1); }

/* The open block as it ends (tool_use: its arguments parsed into input). */
static cJSON *block_done(const anth_req *q) {
    cJSON *b = cJSON_Duplicate(q->block, true);
    const char *text = q->text.p ? q->text.p : "";
    if (q->open == BLOCK_TEXT) {
        cJSON_ReplaceItemInObject(b, "text", cJSON_CreateString(text));
    } else if (q->open == BLOCK_THINKING) {
        cJSON_ReplaceItemInObject(b, "thinking", cJSON_CreateString(text));
    } else {
        cJSON *in = cJSON_Parse(text);
        if (!cJSON_IsObject(in)) { /* the call parser hands over whole JSON objects */
            cJSON_Delete(in);
            in = cJSON_CreateObject();
        }
        cJSON_ReplaceItemInObject(b, "input", in);
    }
    return b;
}

static void close_block(anth_req *q, kvl_buf *out) {
    if (q->open == BLOCK_NONE) return;
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "index", q->n_blocks - 1);
    emit(out, "content_block_stop", ev);
    cJSON_AddItemToArray(q->content, block_done(q));
    cJSON_Delete(q->block);
    q->block = NULL;
    q->open = BLOCK_NONE;
    q->text.len = 0;
}

static void open_block(anth_req *q, kvl_buf *out, int kind, const char *id, const char *name) {
    close_block(q, out);
    q->open = kind;
    q->block = cJSON_CreateObject();
    if (kind == BLOCK_TEXT) {
        cJSON_AddStringToObject(q->block, "type", "text");
        cJSON_AddStringToObject(q->block, "text", "");
    } else if (kind == BLOCK_THINKING) {
        cJSON_AddStringToObject(q->block, "type", "thinking");
        cJSON_AddStringToObject(q->block, "thinking", "");
        cJSON_AddStringToObject(q->block, "signature", ""); /* nothing signs it here */
    } else {
        q->called = true;
        cJSON_AddStringToObject(q->block, "type", "tool_use");
        cJSON_AddStringToObject(q->block, "id", id);
        cJSON_AddStringToObject(q->block, "name", name ? name : "");
        cJSON_AddObjectToObject(q->block, "input");
    }
    kvl_buf_puts(&q->text, ""); /* text.p is a C string from here on */
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "index", q->n_blocks++);
    cJSON_AddItemToObject(ev, "content_block", cJSON_Duplicate(q->block, true));
    emit(out, "content_block_start", ev);
}

static void add_delta(anth_req *q, kvl_buf *out, int kind, const char *text) {
    if (q->open != kind) open_block(q, out, kind, NULL, NULL);
    kvl_buf_puts(&q->text, text);
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "index", q->n_blocks - 1);
    cJSON *d = cJSON_AddObjectToObject(ev, "delta");
    static const char *const type[] = {"", "text_delta", "thinking_delta", "input_json_delta"};
    static const char *const key[] = {"", "text", "thinking", "partial_json"};
    cJSON_AddStringToObject(d, "type", type[kind]);
    cJSON_AddStringToObject(d, key[kind], text);
    emit(out, "content_block_delta", ev);
}

/* The usage as Anthropic counts it: input_tokens are the ones not read from
 * the cache. */
static cJSON *usage_of(const api_req *r) {
    const cJSON *u = r->anth->usage;
    double in = u ? cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens"))
                  : (double)r->job->n_prompt,
           outn = u ? cJSON_GetNumberValue(cJSON_GetObjectItem(u, "completion_tokens")) : 0,
           cached = u ? cJSON_GetNumberValue(cJSON_GetObjectItem(
                            cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"))
                      : 0;
    if (!(cached >= 0)) cached = 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", in - cached);
    cJSON_AddNumberToObject(o, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(o, "cache_read_input_tokens", cached);
    cJSON_AddNumberToObject(o, "output_tokens", outn);
    return o;
}

static const char *stop_reason(const api_req *r) {
    const anth_req *q = r->anth;
    if (q->finish == ENGINE_FINISH_LENGTH) return "max_tokens";
    if (q->called) return "tool_use";
    if (q->stop_index >= 0 && q->stop_index < r->job->n_stop) return "stop_sequence";
    return "end_turn";
}

static void add_stop(cJSON *o, const api_req *r) {
    const char *why = stop_reason(r);
    cJSON_AddStringToObject(o, "stop_reason", why);
    if (!strcmp(why, "stop_sequence"))
        cJSON_AddStringToObject(o, "stop_sequence", r->job->stop[r->anth->stop_index]);
    else cJSON_AddNullToObject(o, "stop_sequence");
}

/* The message; content and stop reason as far as they are known. */
static cJSON *message(srv *s, const api_req *r, bool final) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", r->id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "model", job_model_name(s, r->job));
    cJSON_AddItemToObject(m, "content",
                          final ? cJSON_Duplicate(r->anth->content, true) : cJSON_CreateArray());
    if (final) {
        add_stop(m, r);
    } else {
        cJSON_AddNullToObject(m, "stop_reason");
        cJSON_AddNullToObject(m, "stop_sequence");
    }
    cJSON_AddItemToObject(m, "usage", usage_of(r));
    return m;
}

/* ---------------------------------------------------- the chunks' sink -- */

typedef struct conv {
    srv *s;
    const api_req *r;
    anth_req *q;
    kvl_buf *out;
} conv;

static void on_reasoning(void *ctx, const char *text) {
    conv *c = ctx;
    add_delta(c->q, c->out, BLOCK_THINKING, text);
}

static void on_content(void *ctx, const char *text, const cJSON *lps) {
    conv *c = ctx;
    (void)lps; /* the Messages API has no logprobs */
    if (text[0]) add_delta(c->q, c->out, BLOCK_TEXT, text);
}

static void on_call(void *ctx, const char *id, const char *name) {
    conv *c = ctx;
    open_block(c->q, c->out, BLOCK_TOOL, id, name);
}

static void on_call_args(void *ctx, const char *text) {
    conv *c = ctx;
    add_delta(c->q, c->out, BLOCK_TOOL, text);
}

/* The end: the open block closed, then message_delta and message_stop, or
 * an error event. */
static void on_end(void *ctx, const char *error) {
    conv *c = ctx;
    anth_req *q = c->q;
    close_block(q, c->out);
    if (error || q->finish == ENGINE_FINISH_ERROR) {
        api_fail(&q->error, 500, NULL, "%s",
                 error ? error : "the engine failed while generating this response");
        q->failed = true;
        cJSON *ev = cJSON_CreateObject();
        cJSON *e = cJSON_AddObjectToObject(ev, "error");
        cJSON_AddStringToObject(e, "type", "api_error");
        cJSON_AddStringToObject(e, "message", q->error.msg);
        emit(c->out, "error", ev);
        return;
    }
    cJSON *ev = cJSON_CreateObject();
    add_stop(cJSON_AddObjectToObject(ev, "delta"), c->r);
    cJSON_AddItemToObject(ev, "usage", usage_of(c->r));
    emit(c->out, "message_delta", ev);
    emit(c->out, "message_stop", cJSON_CreateObject());
}

static void convert(srv *s, const api_req *r, kvl_buf *out) {
    anth_req *q = r->anth;
    if (!q->started) {
        q->started = true;
        q->content = cJSON_CreateArray();
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddItemToObject(ev, "message", message(s, r, false));
        emit(out, "message_start", ev);
    }
    conv c = {s, r, q, out};
    const chunk_sink k = {&c, on_reasoning, on_content, on_call, on_call_args, on_end, &q->usage};
    if (!chat_chunks_read(&q->sse, &k, &q->ended)) out->oom = true;
}

void anthropic_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                             kvl_buf *out) {
    for (const srv_event *ev = events; ev; ev = ev->next)
        if (ev->finish != ENGINE_FINISH_NONE) {
            r->anth->finish = ev->finish;
            r->anth->stop_index = ev->stats.stop_index;
        }
    openai_stream_events(s, r, st, events, &r->anth->sse);
    convert(s, r, out);
}

void anthropic_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out) {
    openai_stream_end(s, r, st, &r->anth->sse);
    convert(s, r, out);
}

char *anthropic_response(srv *s, const api_req *r, srv_event *events, api_error *err) {
    stream_state st = {0};
    kvl_buf events_out = {0};
    anthropic_stream_events(s, r, &st, events, &events_out);
    stream_state_free(&st);
    const bool oom = events_out.oom;
    kvl_buf_free(&events_out);
    if (r->anth->failed || oom) {
        if (oom) api_fail(err, 500, NULL, "out of memory");
        else *err = r->anth->error;
        return NULL;
    }
    cJSON *m = message(s, r, true);
    char *js = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    if (!js) api_fail(err, 500, NULL, "out of memory");
    return js;
}
