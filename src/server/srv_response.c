/* OpenAI API, response side: engine events -> a response body
 * (openai_response) or SSE chunks (openai_stream_events, openai_stream_end,
 * with stream_state), with logprobs, usage and, for chat with tools or
 * reasoning, the message cut by the out_parser. The request side is
 * srv_openai.c; split from it to keep files under 800 lines. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

/* ---------------------------------------------------------- responses -- */

static const char *finish_name(engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_CANCELLED: return "abort";
    case ENGINE_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

static cJSON *token_text(srv *s, const api_req *r, int32_t id) {
    if (r->tokens_as_ids) {
        char buf[32];
        snprintf(buf, sizeof buf, "token_id:%d", id);
        return cJSON_CreateString(buf);
    }
    char buf[256];
    size_t n = tok_token_bytes(s->vocab, id, true, buf, sizeof buf);
    return json_text(buf, n < sizeof buf ? n : sizeof buf);
}

static cJSON *token_bytes(srv *s, int32_t id) {
    char buf[256];
    size_t n = tok_token_bytes(s->vocab, id, true, buf, sizeof buf);
    if (n > sizeof buf) n = sizeof buf;
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)buf[i]));
    return a;
}

/* Chat: {"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}. */
static cJSON *chat_logprob_entry(srv *s, const api_req *r, const srv_event *ev) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "token", token_text(s, r, ev->token));
    cJSON_AddNumberToObject(e, "logprob", ev->logprob);
    cJSON_AddItemToObject(e, "bytes", token_bytes(s, ev->token));
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int k = 0; k < ev->n_top; k++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToObject(t, "token", token_text(s, r, ev->top_ids[k]));
        cJSON_AddNumberToObject(t, "logprob", ev->top_lps[k]);
        cJSON_AddItemToObject(t, "bytes", token_bytes(s, ev->top_ids[k]));
        cJSON_AddItemToArray(top, t);
    }
    return e;
}

/* Completions: parallel arrays tokens / token_logprobs / top_logprobs / text_offset. */
static cJSON *completion_logprobs_new(void) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "text_offset");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    return lp;
}

static void completion_logprobs_add(srv *s, const api_req *r, cJSON *lp, const srv_event *ev,
                                    size_t off) {
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)off));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"),
                         cJSON_CreateNumber(ev->logprob));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), token_text(s, r, ev->token));
    cJSON *top = cJSON_CreateObject();
    for (int k = 0; k < ev->n_top; k++) {
        cJSON *t = token_text(s, r, ev->top_ids[k]);
        const char *key = cJSON_GetStringValue(t);
        if (key && !cJSON_GetObjectItemCaseSensitive(top, key))
            cJSON_AddNumberToObject(top, key, ev->top_lps[k]);
        cJSON_Delete(t);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
}

/* An echo's prompt in a completion's logprobs: its tokens, their
 * log-probabilities and top alternatives (none for the first token, which
 * nothing predicts: null, as OpenAI and vLLM give it). */
static cJSON *echo_logprobs(srv *s, const api_req *r, int prompt) {
    cJSON *lp = completion_logprobs_new();
    const srv_job *j = r->job;
    const int k = j->top_logprobs;
    int64_t n;
    const int32_t *ids = job_prompt(j, prompt, &n);
    const float *lps = r->echo_lp[prompt], *top_lps = r->echo_top_lps[prompt];
    const int32_t *top_ids = r->echo_top_ids[prompt];
    size_t off = 0;
    for (int64_t p = 0; p < n; p++) {
        cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"),
                             cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"),
                             p ? cJSON_CreateNumber(lps[p]) : cJSON_CreateNull());
        cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), token_text(s, r, ids[p]));
        cJSON *top = p ? cJSON_CreateObject() : cJSON_CreateNull();
        for (int i = 0; p && i < k; i++) {
            cJSON *t = token_text(s, r, top_ids[p * k + i]);
            const char *key = cJSON_GetStringValue(t);
            if (key && !cJSON_GetObjectItemCaseSensitive(top, key))
                cJSON_AddNumberToObject(top, key, top_lps[p * k + i]);
            cJSON_Delete(t);
        }
        cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
        off += tok_token_bytes(s->vocab, ids[p], true, NULL, 0); /* as srv_ids_text writes it */
    }
    return lp;
}

/* vLLM's prompt_logprobs of prompt k: null for the first token (nothing
 * predicts it), then per position {id: {logprob, rank, decoded_token}}, the
 * prompt's own token first (its rank among all tokens), then the top k with
 * ranks 1..k (the prompt token once if it is among them), -inf as -9999.0. */
static cJSON *prompt_logprobs_json(srv *s, const api_req *r, int prompt) {
    cJSON *a = cJSON_CreateArray();
    int64_t n;
    const int32_t *ids = job_prompt(r->job, prompt, &n);
    const int k = r->prompt_logprobs;
    cJSON_AddItemToArray(a, cJSON_CreateNull());
    for (int64_t p = 1; p < n; p++) {
        cJSON *pos = cJSON_CreateObject();
        for (int i = -1; i < k; i++) {
            const int32_t id = i < 0 ? ids[p] : r->plp_top_ids[prompt][p * k + i];
            const float lp = i < 0 ? r->plp_lp[prompt][p] : r->plp_top_lps[prompt][p * k + i];
            char key[16];
            snprintf(key, sizeof key, "%d", (int)id);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "logprob", lp > -9999.0f ? lp : -9999.0);
            cJSON_AddNumberToObject(e, "rank", i < 0 ? r->plp_rank[prompt][p] : i + 1);
            kvl_buf t = {0};
            srv_ids_text(s, &id, 1, &t);
            cJSON_AddItemToObject(e, "decoded_token", json_text(t.p ? t.p : "", t.len));
            kvl_buf_free(&t);
            if (cJSON_GetObjectItemCaseSensitive(pos, key)) cJSON_ReplaceItemInObject(pos, key, e);
            else cJSON_AddItemToObject(pos, key, e);
        }
        cJSON_AddItemToArray(a, pos);
    }
    return a;
}

static cJSON *usage_json(int64_t prompt, int64_t completion, int64_t cached, int64_t disk,
                         int64_t lb, int64_t alloc) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens",
                            (double)cached);
    /* of the cached tokens, those read back from the KV disk tier (the rest were in RAM) */
    cJSON_AddNumberToObject(cJSON_GetObjectItem(u, "prompt_tokens_details"), "disk_cached_tokens",
                            (double)disk);
    cJSON_AddNumberToObject(u, "kv_lower_bound_bytes", (double)lb);
    cJSON_AddNumberToObject(u, "kv_allocated_bytes", (double)alloc);
    return u;
}

static void add_stats(stream_state *st, const srv_event *ev) {
    st->completion_tokens += ev->stats.n_generated;
    st->kv_lb += (int64_t)ev->stats.kv.lower_bound_bytes;
    st->kv_alloc += (int64_t)ev->stats.kv.allocated_bytes;
    if (ev->index == 0) st->cached = ev->stats.n_cached_prompt;
    if (ev->index == 0) st->disk = ev->stats.n_disk_prompt;
    st->n_finished++;
}

static cJSON *envelope(srv *s, const api_req *r, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", job_model_name(s, r->job));
    return o;
}

typedef struct choice_acc {
    kvl_buf text;
    cJSON *logprobs;
    engine_finish finish;
    int stop_index;     /* the stop string that ended it, -1: none */
    int32_t stop_token; /* the stop_token_ids entry that ended it, -1: none */
} choice_acc;

/* vLLM's stop_reason beside finish_reason: the stop string that ended the
 * choice, or the stop_token_ids entry (a number), null for anything else
 * (end of generation, length). On the last chunk of a stream and in a whole
 * answer. */
static void add_stop_reason(cJSON *ch, const srv_job *j, engine_finish f, int stop_index,
                            int32_t stop_token) {
    if (f == ENGINE_FINISH_STOP && stop_index >= 0 && stop_index < j->n_stop)
        cJSON_AddStringToObject(ch, "stop_reason", j->stop[stop_index]);
    else if (f == ENGINE_FINISH_STOP && stop_token >= 0)
        cJSON_AddNumberToObject(ch, "stop_reason", stop_token);
    else cJSON_AddNullToObject(ch, "stop_reason");
}

static bool job_parses(const srv_job *j) { return j->parse_fmt != TOOL_FMT_NONE || j->think; }

/* One tool call as message.tool_calls[i] (OpenAI's shape). */
static cJSON *call_json(const tool_call_out *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(o, "function");
    cJSON_AddStringToObject(fn, "name", c->name);
    cJSON_AddStringToObject(fn, "arguments", c->arguments);
    return o;
}

/* "tool_calls" when the answer holds calls (and was not cut off by a cancel). */
static const char *finish_reason(engine_finish f, int n_calls) {
    return n_calls > 0 && f != ENGINE_FINISH_CANCELLED && f != ENGINE_FINISH_ERROR &&
                   f != ENGINE_FINISH_NONE
               ? "tool_calls"
               : finish_name(f);
}

/* The message of a chat answer whose text is split into content, reasoning
 * and tool calls; content is null when calls took all of it, as OpenAI's. */
static void parsed_message(const srv_job *j, cJSON *msg, const char *text, size_t len,
                           int *n_calls) {
    out_parser p;
    parse_out o = {0};
    out_parser_init(&p, j->parse_fmt, &j->tools, j->think, j->in_think);
    if (j->think_open) p.think_open = j->think_open, p.think_close = j->think_close;
    out_parser_feed(&p, text, len, true, &o);
    if (o.content.len == 0 && o.n_calls > 0) cJSON_AddNullToObject(msg, "content");
    else
        cJSON_AddItemToObject(msg, "content",
                              json_text(o.content.p ? o.content.p : "", o.content.len));
    if (o.reasoning.len)
        cJSON_AddItemToObject(msg, "reasoning_content", json_text(o.reasoning.p, o.reasoning.len));
    if (o.n_calls) {
        cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
        for (int i = 0; i < o.n_calls; i++) cJSON_AddItemToArray(calls, call_json(&o.calls[i]));
    }
    *n_calls = o.n_calls;
    parse_out_free(&o);
    out_parser_free(&p);
}

static cJSON *final_choice(const api_req *r, int i, choice_acc *c) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    int n_calls = 0;
    if (r->chat && job_parses(r->job)) {
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        parsed_message(r->job, msg, c->text.p ? c->text.p : "", c->text.len, &n_calls);
    } else {
        cJSON *text = json_text(c->text.p ? c->text.p : "", c->text.len);
        if (r->chat) {
            cJSON *msg = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddItemToObject(msg, "content", text);
        } else {
            cJSON_AddItemToObject(ch, "text", text);
        }
    }
    if (c->logprobs) cJSON_AddItemToObject(ch, "logprobs", c->logprobs);
    else cJSON_AddNullToObject(ch, "logprobs");
    const char *fin = finish_reason(c->finish, n_calls);
    if (fin) cJSON_AddStringToObject(ch, "finish_reason", fin);
    else cJSON_AddNullToObject(ch, "finish_reason");
    add_stop_reason(ch, r->job, c->finish, c->stop_index, c->stop_token);
    c->logprobs = NULL;
    return ch;
}

static void accumulate(srv *s, const api_req *r, choice_acc *acc, stream_state *st,
                       const srv_event *ev) {
    choice_acc *c = &acc[ev->index];
    if (r->logprobs && ev->token >= 0) {
        if (!c->logprobs) {
            c->logprobs = r->chat ? cJSON_CreateObject() : completion_logprobs_new();
            if (r->chat) cJSON_AddArrayToObject(c->logprobs, "content");
        }
        if (r->chat)
            cJSON_AddItemToArray(cJSON_GetObjectItem(c->logprobs, "content"),
                                 chat_logprob_entry(s, r, ev));
        else completion_logprobs_add(s, r, c->logprobs, ev, c->text.len);
    }
    kvl_buf_put(&c->text, ev->text, ev->text_len);
    if (ev->finish != ENGINE_FINISH_NONE) {
        c->finish = ev->finish;
        c->stop_index = ev->stats.stop_index;
        c->stop_token = ev->stats.stop_token;
        add_stats(st, ev);
    }
}

char *openai_response(srv *s, const api_req *r, srv_event *events) {
    choice_acc acc[SRV_MAX_N];
    memset(acc, 0, sizeof acc);
    stream_state st = {0};
    for (int i = 0; r->echo && i < r->job->n; i++) { /* the choice's prompt first */
        const int k = i / r->job->per_prompt;
        kvl_buf_put(&acc[i].text, r->echo_text[k], r->echo_len[k]);
        if (r->logprobs) acc[i].logprobs = echo_logprobs(s, r, k);
    }
    for (const srv_event *ev = events; ev; ev = ev->next) accumulate(s, r, acc, &st, ev);
    cJSON *o = envelope(s, r, r->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < r->job->n; i++) {
        cJSON *ch = final_choice(r, i, &acc[i]);
        if (!r->chat && r->plp_lp[i / r->job->per_prompt]) /* vLLM's: each choice */
            cJSON_AddItemToObject(ch, "prompt_logprobs",
                                  prompt_logprobs_json(s, r, i / r->job->per_prompt));
        cJSON_AddItemToArray(choices, ch);
        kvl_buf_free(&acc[i].text);
    }
    if (r->chat && r->plp_lp[0]) /* vLLM's chat answer: beside the choices */
        cJSON_AddItemToObject(o, "prompt_logprobs", prompt_logprobs_json(s, r, 0));
    cJSON_AddItemToObject(o, "usage",
                          usage_json(job_prompt_tokens(r->job), st.completion_tokens, st.cached,
                                     st.disk, st.kv_lb, st.kv_alloc));
    const srv_event *last =
        NULL; /* timings_per_token: llama-server's timings, the first choice's */
    for (const srv_event *ev = events; ev; ev = ev->next)
        if (ev->index == 0 && ev->finish != ENGINE_FINISH_NONE) last = ev;
    if (r->job->timings_per_token && last)
        cJSON_AddItemToObject(o, "timings", srv_timings_json(&last->stats));
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

/* ------------------------------------------------------------ streams -- */

void sse_data(kvl_buf *out, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) {
        out->oom = true;
        return;
    }
    kvl_buf_puts(out, "data: ");
    kvl_buf_puts(out, s);
    kvl_buf_puts(out, "\n\n");
    free(s);
}

/* A choice's chunk out; with vLLM's stream_options.continuous_usage_stats
 * each carries the usage so far: the prompt's tokens and the choice's. */
static void choice_out(const api_req *r, const stream_state *st, int index, cJSON *c,
                       kvl_buf *out) {
    if (r->continuous_usage) {
        cJSON *u = cJSON_AddObjectToObject(c, "usage");
        int64_t prompt = 0;
        job_prompt(r->job, index / r->job->per_prompt, &prompt);
        const int64_t done = st->n_tok[index];
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", (double)done);
        cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + done));
    }
    if (r->job->timings_per_token && st->cur) /* llama-server's, in every chunk */
        cJSON_AddItemToObject(c, "timings", srv_timings_json(&st->cur->stats));
    sse_data(out, c);
}

static cJSON *chunk_choice(cJSON *chunk, int index) {
    cJSON *choices = cJSON_AddArrayToObject(chunk, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    cJSON_AddItemToArray(choices, ch);
    return ch;
}

/* return_progress: llama-server's chunk of the prompt's progress (chat: an
 * assistant delta with null content; completions: empty text). */
static void progress_chunk(srv *s, const api_req *r, stream_state *st, const srv_event *ev,
                           kvl_buf *out) {
    cJSON *c = envelope(s, r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *ch = chunk_choice(c, ev->index);
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddNullToObject(d, "content");
    } else {
        cJSON_AddStringToObject(ch, "text", "");
    }
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToObject(c, "prompt_progress", srv_prompt_progress_json(ev));
    choice_out(r, st, ev->index, c, out);
}

static void put_finish(cJSON *ch, const srv_job *j, const srv_event *ev) {
    const char *fin = finish_name(ev->finish);
    if (fin) cJSON_AddStringToObject(ch, "finish_reason", fin);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (fin) add_stop_reason(ch, j, ev->finish, ev->stats.stop_index, ev->stats.stop_token);
}

/* A chat chunk of choice index with an empty delta (the caller fills it). */
static cJSON *delta_chunk(srv *s, const api_req *r, int index, cJSON **ch, cJSON **d) {
    cJSON *c = envelope(s, r, "chat.completion.chunk");
    *ch = chunk_choice(c, index);
    *d = cJSON_AddObjectToObject(*ch, "delta");
    return c;
}

/* Tool calls stream as OpenAI streams them: per call, a chunk with its index,
 * id, type, name and empty arguments, then the arguments. */
static void put_calls(srv *s, const api_req *r, stream_state *st, int index, const parse_out *o,
                      kvl_buf *out) {
    for (int i = 0; i < o->n_calls; i++) {
        for (int part = 0; part < 2; part++) {
            cJSON *ch, *d;
            cJSON *c = delta_chunk(s, r, index, &ch, &d);
            cJSON *call = cJSON_CreateObject();
            cJSON_AddNumberToObject(call, "index", st->n_calls[index]);
            cJSON *fn;
            if (part == 0) {
                cJSON_AddStringToObject(call, "id", o->calls[i].id);
                cJSON_AddStringToObject(call, "type", "function");
                fn = cJSON_AddObjectToObject(call, "function");
                cJSON_AddStringToObject(fn, "name", o->calls[i].name);
                cJSON_AddStringToObject(fn, "arguments", "");
            } else {
                fn = cJSON_AddObjectToObject(call, "function");
                cJSON_AddStringToObject(fn, "arguments", o->calls[i].arguments);
            }
            cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), call);
            cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddNullToObject(ch, "finish_reason");
            choice_out(r, st, index, c, out);
        }
        st->n_calls[index]++;
    }
}

/* Chat with tools or reasoning: the event's text goes through the choice's
 * parser; what it decided is sent as reasoning_content / content deltas and
 * tool-call chunks, the rest waits for the next token. */
static void chat_chunk_parsed(srv *s, const api_req *r, stream_state *st, const srv_event *ev,
                              kvl_buf *out) {
    parse_out *o = &st->po;
    parse_out_reset(o);
    bool final = ev->finish != ENGINE_FINISH_NONE;
    out_parser_feed(&st->parser[ev->index], ev->text, ev->text_len, final, o);
    bool lp = r->logprobs && ev->token >= 0;
    if (o->reasoning.len || o->content.len || (lp && !o->n_calls)) {
        cJSON *ch, *d;
        cJSON *c = delta_chunk(s, r, ev->index, &ch, &d);
        if (o->reasoning.len)
            cJSON_AddItemToObject(d, "reasoning_content",
                                  json_text(o->reasoning.p, o->reasoning.len));
        if (o->content.len || !o->reasoning.len)
            cJSON_AddItemToObject(d, "content", json_text(o->content.p, o->content.len));
        if (lp) {
            cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON_AddItemToArray(cJSON_AddArrayToObject(l, "content"),
                                 chat_logprob_entry(s, r, ev));
            lp = false;
        } else {
            cJSON_AddNullToObject(ch, "logprobs");
        }
        cJSON_AddNullToObject(ch, "finish_reason");
        choice_out(r, st, ev->index, c, out);
    }
    put_calls(s, r, st, ev->index, o, out);
    if (!final) return;
    cJSON *ch, *d;
    cJSON *c = delta_chunk(s, r, ev->index, &ch, &d);
    cJSON_AddNullToObject(ch, "logprobs");
    const char *fin = finish_reason(ev->finish, st->n_calls[ev->index]);
    if (fin) cJSON_AddStringToObject(ch, "finish_reason", fin);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (fin) add_stop_reason(ch, r->job, ev->finish, ev->stats.stop_index, ev->stats.stop_token);
    choice_out(r, st, ev->index, c, out);
}

static void chat_chunk(srv *s, const api_req *r, stream_state *st, const srv_event *ev,
                       kvl_buf *out) {
    bool parsed = job_parses(r->job);
    if (!st->started[ev->index]) {
        st->started[ev->index] = true;
        if (parsed) {
            out_parser *p = &st->parser[ev->index];
            out_parser_init(p, r->job->parse_fmt, &r->job->tools, r->job->think, r->job->in_think);
            if (r->job->think_open)
                p->think_open = r->job->think_open, p->think_close = r->job->think_close;
        }
        cJSON *c = envelope(s, r, "chat.completion.chunk");
        cJSON *ch = chunk_choice(c, ev->index);
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        choice_out(r, st, ev->index, c, out); /* before any token: 0 of them */
    }
    if (ev->token >= 0) st->n_tok[ev->index]++;
    if (parsed) {
        chat_chunk_parsed(s, r, st, ev, out);
        return;
    }
    cJSON *c = envelope(s, r, "chat.completion.chunk");
    cJSON *ch = chunk_choice(c, ev->index);
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    if (ev->text_len || ev->finish == ENGINE_FINISH_NONE)
        cJSON_AddItemToObject(d, "content", json_text(ev->text, ev->text_len));
    if (r->logprobs && ev->token >= 0) {
        cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(lp, "content"), chat_logprob_entry(s, r, ev));
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    put_finish(ch, r->job, ev);
    choice_out(r, st, ev->index, c, out);
}

void stream_state_free(stream_state *st) {
    for (int i = 0; i < SRV_MAX_N; i++)
        if (st->started[i]) out_parser_free(&st->parser[i]);
    parse_out_free(&st->po);
}

static void completion_chunk(srv *s, const api_req *r, stream_state *st, const srv_event *ev,
                             kvl_buf *out) {
    if (r->echo && !st->echoed[ev->index]) { /* the prompt, in the choice's first chunk */
        const int k = ev->index / r->job->per_prompt;
        st->echoed[ev->index] = true;
        cJSON *c = envelope(s, r, "text_completion");
        cJSON *ch = chunk_choice(c, ev->index);
        cJSON_AddItemToObject(ch, "text", json_text(r->echo_text[k], r->echo_len[k]));
        if (r->logprobs) cJSON_AddItemToObject(ch, "logprobs", echo_logprobs(s, r, k));
        else cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        choice_out(r, st, ev->index, c, out);
        st->text_off[ev->index] = r->echo_len[k];
    }
    if (ev->token >= 0) st->n_tok[ev->index]++;
    cJSON *c = envelope(s, r, "text_completion");
    cJSON *ch = chunk_choice(c, ev->index);
    cJSON_AddItemToObject(ch, "text", json_text(ev->text, ev->text_len));
    if (r->logprobs && ev->token >= 0) {
        cJSON *lp = completion_logprobs_new();
        completion_logprobs_add(s, r, lp, ev, st->text_off[ev->index]);
        cJSON_AddItemToObject(ch, "logprobs", lp);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    put_finish(ch, r->job, ev);
    choice_out(r, st, ev->index, c, out);
    st->text_off[ev->index] += ev->text_len;
}

void openai_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out) {
    if (st->failed) {
        api_error e = st->fail;
        if (!e.status) api_fail(&e, 500, NULL, "the engine failed while generating this response");
        char *js = api_error_json(&e);
        kvl_buf_printf(out, "data: %s\n\n", js ? js : "{}");
        free(js);
    } else if (r->include_usage) {
        cJSON *c = envelope(s, r, r->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(c, "choices");
        cJSON_AddItemToObject(c, "usage",
                              usage_json(job_prompt_tokens(r->job), st->completion_tokens,
                                         st->cached, st->disk, st->kv_lb, st->kv_alloc));
        sse_data(out, c);
    }
    kvl_buf_puts(out, "data: [DONE]\n\n");
}

void openai_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                          kvl_buf *out) {
    for (const srv_event *ev = events; ev; ev = ev->next) {
        st->cur = ev;
        if (ev->progress) {
            progress_chunk(s, r, st, ev, out);
            continue;
        }
        if (r->chat) chat_chunk(s, r, st, ev, out);
        else completion_chunk(s, r, st, ev, out);
        if (ev->finish == ENGINE_FINISH_NONE) continue;
        add_stats(st, ev);
        if (st->n_finished == r->job->n) openai_stream_end(s, r, st, out);
    }
}

char *openai_echo_only(srv *s, const api_req *r) {
    const srv_job *j = r->job;
    kvl_buf sse = {0};
    cJSON *o = r->stream ? NULL : envelope(s, r, "text_completion");
    cJSON *choices = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    for (int i = 0; i < j->n; i++) {
        cJSON *c = r->stream ? envelope(s, r, "text_completion") : NULL;
        cJSON *ch = c ? chunk_choice(c, i) : cJSON_CreateObject();
        if (!c) {
            cJSON_AddNumberToObject(ch, "index", i);
            cJSON_AddItemToArray(choices, ch);
        }
        const int k = i / j->per_prompt;
        cJSON_AddItemToObject(ch, "text", json_text(r->echo_text[k], r->echo_len[k]));
        if (r->logprobs) cJSON_AddItemToObject(ch, "logprobs", echo_logprobs(s, r, k));
        else cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", "length");
        cJSON_AddNullToObject(ch, "stop_reason");
        if (c) sse_data(&sse, c);
    }
    cJSON *usage = usage_json(job_prompt_tokens(j), 0, 0, 0, 0, 0);
    if (o) {
        cJSON_AddItemToObject(o, "usage", usage);
        char *js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        return js;
    }
    if (r->include_usage) {
        cJSON *c = envelope(s, r, "text_completion");
        cJSON_AddArrayToObject(c, "choices");
        cJSON_AddItemToObject(c, "usage", usage);
        sse_data(&sse, c);
    } else {
        cJSON_Delete(usage);
    }
    kvl_buf_puts(&sse, "data: [DONE]\n\n");
    if (sse.oom) {
        kvl_buf_free(&sse);
        return NULL;
    }
    return sse.p;
}
