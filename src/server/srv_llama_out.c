/* llama-server's own completion API, response side (the request side is
 * srv_llama.c): engine events -> its object (content, tokens, stop_type,
 * stopping_word, timings, completion_probabilities, generation_settings,
 * response_fields; an array for several choices) and its stream, one data:
 * line a token and a final one with stop: true, and no [DONE]. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

/* ----------------------------------------------------------- response -- */

/* One token's entry: its log-probability, or with post_sampling_probs (post)
 * its probability after the sampler chain, by llama's names for each. */
static cJSON *token_entry(srv *s, int32_t id, float logprob, bool post) {
    char buf[256];
    size_t n = tok_token_bytes(s->vocab, id, true, buf, sizeof buf);
    if (n > sizeof buf) n = sizeof buf;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "id", id);
    size_t valid = n; /* llama cuts the text at an incomplete UTF-8 sequence */
    while (valid > 0 && !utf8_valid(buf, valid)) valid--;
    cJSON_AddItemToObject(e, "token", json_text(buf, valid));
    cJSON *bytes = cJSON_AddArrayToObject(e, "bytes");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)buf[i]));
    cJSON_AddNumberToObject(e, post ? "prob" : "logprob", logprob);
    return e;
}

static cJSON *probs_entry(srv *s, const llama_req *q, const srv_event *ev) {
    const bool post = q->post_sampling;
    cJSON *e = token_entry(s, ev->token, ev->logprob, post);
    cJSON *top = cJSON_AddArrayToObject(e, post ? "top_probs" : "top_logprobs");
    for (int k = 0; k < ev->n_top; k++)
        cJSON_AddItemToArray(top, token_entry(s, ev->top_ids[k], ev->top_lps[k], post));
    return e;
}

static const char *stop_type(const srv_event *ev) {
    switch (ev->finish) {
    case ENGINE_FINISH_STOP: return ev->stats.stop_index >= 0 ? "word" : "eos";
    case ENGINE_FINISH_LENGTH: return "limit";
    default: return "none";
    }
}

cJSON *srv_timings_json(const engine_req_stats *st) {
    cJSON *t = cJSON_CreateObject();
    /* mid-stream (timings_per_token) the generation runs until now */
    const double end = st->t_end > 0 ? st->t_end : kvl_time_s();
    const double prompt_n = (double)(st->n_prompt - st->n_cached_prompt),
                 prompt_ms = st->t_prefill_s * 1e3, pred_n = (double)st->n_generated,
                 pred_ms = st->t_first_token > 0 ? (end - st->t_first_token) * 1e3 : 0;
    cJSON_AddNumberToObject(t, "cache_n", (double)st->n_cached_prompt);
    cJSON_AddNumberToObject(t, "prompt_n", prompt_n);
    cJSON_AddNumberToObject(t, "prompt_ms", prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", prompt_n > 0 ? prompt_ms / prompt_n : 0);
    cJSON_AddNumberToObject(t, "prompt_per_second", prompt_ms > 0 ? prompt_n * 1e3 / prompt_ms : 0);
    cJSON_AddNumberToObject(t, "predicted_n", pred_n);
    cJSON_AddNumberToObject(t, "predicted_ms", pred_ms);
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", pred_n > 0 ? pred_ms / pred_n : 0);
    cJSON_AddNumberToObject(t, "predicted_per_second", pred_ms > 0 ? pred_n * 1e3 / pred_ms : 0);
    return t;
}

cJSON *srv_prompt_progress_json(const srv_event *ev) {
    cJSON *p = cJSON_CreateObject();
    const engine_req_stats *st = &ev->stats;
    cJSON_AddNumberToObject(p, "total", (double)st->n_prompt);
    cJSON_AddNumberToObject(p, "cache", (double)st->n_cached_prompt);
    cJSON_AddNumberToObject(p, "processed", (double)ev->n_past);
    cJSON_AddNumberToObject(p, "time_ms",
                            st->t_scheduled > 0 ? (kvl_time_s() - st->t_scheduled) * 1e3 : 0);
    return p;
}

/* response_fields: only those paths ("a/b" reads b inside a), each under its
 * path as the key; a path that is not there is left out. */
static cJSON *pick_fields(cJSON *o, const cJSON *fields) {
    if (!fields) return o;
    cJSON *out = cJSON_CreateObject();
    for (const cJSON *f = fields->child; f; f = f->next) {
        const cJSON *cur = o;
        char *path = strdup(f->valuestring), *save = NULL;
        for (char *k = path ? strtok_r(path, "/", &save) : NULL; cur && k;
             k = strtok_r(NULL, "/", &save))
            cur = cJSON_IsObject(cur) ? cJSON_GetObjectItemCaseSensitive(cur, k) : NULL;
        if (cur && path && !cJSON_GetObjectItemCaseSensitive(out, f->valuestring))
            cJSON_AddItemToObject(out, f->valuestring, cJSON_Duplicate(cur, true));
        free(path);
    }
    cJSON_Delete(o);
    return out;
}

/* The object of a finished choice (its text, ids and probabilities: the
 * whole answer's, or nothing at the end of a stream, as llama's). */
static cJSON *final_object(srv *s, const api_req *r, const srv_event *ev, const char *content,
                           size_t len, cJSON *tokens, cJSON *probs) {
    const llama_req *q = r->llama;
    const srv_job *j = r->job;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", ev->index);
    cJSON_AddItemToObject(o, "content", json_text(content, len));
    cJSON_AddItemToObject(o, "tokens", tokens && (q->return_tokens) ? tokens : cJSON_CreateArray());
    if (tokens && !q->return_tokens) cJSON_Delete(tokens);
    cJSON_AddNumberToObject(o, "id_slot", ev->slot); /* the slot it ran on (srv_slots.c) */
    cJSON_AddBoolToObject(o, "stop", true);
    cJSON_AddStringToObject(o, "model", job_model_name(s, j));
    engine_req_stats st = ev->stats; /* n_predict 0: its one token is not part of the answer */
    if (q->prompt_only) st.n_generated = 0, st.t_end = st.t_first_token;
    cJSON_AddNumberToObject(o, "tokens_predicted", (double)st.n_generated);
    const int k = ev->index / j->per_prompt; /* the choice's prompt */
    int64_t n_prompt;
    job_prompt(j, k, &n_prompt);
    cJSON_AddNumberToObject(o, "tokens_evaluated", (double)n_prompt);
    cJSON_AddItemToObject(o, "generation_settings", cJSON_Duplicate(q->settings, true));
    cJSON_AddItemToObject(o, "prompt", cJSON_Duplicate(q->prompt_text[k], true));
    cJSON_AddBoolToObject(o, "has_new_line", len && memchr(content, '\n', len));
    cJSON_AddBoolToObject(o, "truncated", false);
    cJSON_AddStringToObject(o, "stop_type", q->prompt_only ? "limit" : stop_type(ev));
    const int si = ev->stats.stop_index;
    cJSON_AddStringToObject(
        o, "stopping_word",
        ev->finish == ENGINE_FINISH_STOP && si >= 0 && si < j->n_stop ? j->stop[si] : "");
    const int64_t cached = n_prompt + st.n_generated - (st.n_generated > 0);
    cJSON_AddNumberToObject(o, "tokens_cached", (double)cached);
    cJSON_AddItemToObject(o, "timings", srv_timings_json(&st));
    if (probs) cJSON_AddItemToObject(o, "completion_probabilities", probs);
    return pick_fields(o, q->fields);
}

static void take_event(srv *s, const api_req *r, const srv_event *ev) {
    llama_req *q = r->llama;
    const int i = ev->index;
    if (q->prompt_only) return;
    kvl_buf_put(&q->content[i], ev->text, ev->text_len);
    if (ev->token < 0) return;
    q->n_decoded[i]++;
    if (!q->tokens[i]) q->tokens[i] = cJSON_CreateArray();
    cJSON_AddItemToArray(q->tokens[i], cJSON_CreateNumber(ev->token));
    if (q->n_probs > 0) {
        if (!q->probs[i]) q->probs[i] = cJSON_CreateArray();
        cJSON_AddItemToArray(q->probs[i], probs_entry(s, q, ev));
    }
}

char *llama_response(srv *s, const api_req *r, srv_event *events) {
    llama_req *q = r->llama;
    cJSON *out = r->job->n > 1 ? cJSON_CreateArray() : NULL, *one = NULL;
    for (const srv_event *ev = events; ev; ev = ev->next) {
        take_event(s, r, ev);
        if (ev->finish == ENGINE_FINISH_NONE) continue;
        const int i = ev->index;
        cJSON *ids = q->tokens[i] ? q->tokens[i] : cJSON_CreateArray();
        if (ev->stats.eog_token >= 0 && !q->prompt_only) /* llama lists it with the others */
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(ev->stats.eog_token));
        one = final_object(s, r, ev, q->content[i].p ? q->content[i].p : "", q->content[i].len, ids,
                           q->probs[i]);
        q->tokens[i] = q->probs[i] = NULL;
        if (out) cJSON_AddItemToArray(out, one);
    }
    cJSON *o = out ? out : one;
    char *js = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return js;
}

/* ------------------------------------------------------------- stream -- */

void llama_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out) {
    (void)s, (void)r;
    if (!st->failed) return; /* llama's stream just ends */
    api_error e = st->fail;
    if (!e.status) api_fail(&e, 500, NULL, "the engine failed while generating this response");
    char *js = api_error_json(&e); /* {"error": {...}}, as llama sends it */
    kvl_buf_printf(out, "data: %s\n\n", js ? js : "{}");
    free(js);
}

void llama_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                         kvl_buf *out) {
    llama_req *q = r->llama;
    for (const srv_event *ev = events; ev; ev = ev->next) {
        const int i = ev->index;
        if (ev->progress) { /* return_progress: llama-server's partial with prompt_progress */
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "index", i);
            cJSON_AddStringToObject(c, "content", "");
            cJSON_AddArrayToObject(c, "tokens");
            cJSON_AddBoolToObject(c, "stop", false);
            cJSON_AddNumberToObject(c, "id_slot", -1);
            cJSON_AddNumberToObject(c, "tokens_predicted", 0);
            cJSON_AddNumberToObject(c, "tokens_evaluated", (double)ev->stats.n_prompt);
            if (r->job->timings_per_token)
                cJSON_AddItemToObject(c, "timings", srv_timings_json(&ev->stats));
            cJSON_AddItemToObject(c, "prompt_progress", srv_prompt_progress_json(ev));
            sse_data(out, c);
            continue;
        }
        if ((ev->token >= 0 || ev->text_len) && !q->prompt_only) {
            if (ev->token >= 0) q->n_decoded[i]++;
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "index", i);
            cJSON_AddItemToObject(c, "content", json_text(ev->text, ev->text_len));
            cJSON *ids = cJSON_AddArrayToObject(c, "tokens");
            if (ev->token >= 0) cJSON_AddItemToArray(ids, cJSON_CreateNumber(ev->token));
            cJSON_AddBoolToObject(c, "stop", false);
            cJSON_AddNumberToObject(c, "id_slot", -1);
            cJSON_AddNumberToObject(c, "tokens_predicted", (double)q->n_decoded[i]);
            int64_t n_prompt;
            job_prompt(r->job, i / r->job->per_prompt, &n_prompt);
            cJSON_AddNumberToObject(c, "tokens_evaluated", (double)n_prompt);
            if (q->n_probs > 0 && ev->token >= 0)
                cJSON_AddItemToArray(cJSON_AddArrayToObject(c, "completion_probabilities"),
                                     probs_entry(s, q, ev));
            if (r->job->timings_per_token)
                cJSON_AddItemToObject(c, "timings", srv_timings_json(&ev->stats));
            sse_data(out, c);
        }
        if (ev->finish == ENGINE_FINISH_NONE) continue;
        sse_data(out, final_object(s, r, ev, "", 0, NULL, NULL));
        st->n_finished++;
        if (st->n_finished == r->job->n) llama_stream_end(s, r, st, out);
    }
}
