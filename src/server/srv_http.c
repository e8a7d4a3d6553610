/* HTTP layer (libmicrohttpd: a few epoll worker threads): routing, the header
 * stage (authentication, framing, size) before any body is read, bodies, error
 * responses, non-streaming and SSE responses (startup and drain: srv_start.c).
 * No callback
 * blocks: a connection waiting for the engine is suspended, and the engine
 * thread resumes it when its job has something (job_wake_locked). */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <ctype.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "srv_internal.h"

typedef enum route {
    R_NONE,
    R_HEALTH,
    R_VERSION,
    R_METRICS,
    R_MODELS,
    R_MODEL,
    R_COMPLETIONS,
    R_LLAMA_COMPLETION,
    R_LLAMA_INFILL,
    R_CHAT,
    R_RESPONSES,
    R_RESPONSE_GET,
    R_RESPONSE_DELETE,
    R_MESSAGES,
    R_MESSAGES_COUNT,
    R_EMBEDDINGS,
    R_LLAMA_EMBEDDING,
    R_RERANK,
    R_SCORE,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_PROPS,
    R_PROPS_SET,
    R_APPLY_TEMPLATE,
    R_KV_SAVE,
    R_KV_UNPIN,
    R_KV_STATE,
    R_SLOTS,
    R_SLOTS_ACTION,
    R_CHAT_CONTROL,
    R_INVOCATIONS,
    R_INPUT_TOKENS_CHAT,
    R_INPUT_TOKENS_RESP,
    R_LORA_GET,
    R_LORA_SET,
    R_LORA_LOAD,
    R_LORA_UNLOAD,
    R_STREAM_GET,
    R_STREAM_DELETE,
    R_STREAMS_LOOKUP,
    R_PREDICT,
    R_DISABLED,
    R_PAGE
} route;

/* Who may call a route when keys are set: anyone (the health probe), key
 * holders, or key holders unless --metrics-public (operational data: what is
 * cached and how busy the server is says something about other tenants). */
typedef enum route_auth { AUTH_NONE, AUTH_KEY, AUTH_OPS } route_auth;

static const struct {
    const char *path, *method;
    route r;
    route_auth auth;
    bool prefix; /* path is a prefix; the rest of the URL is the argument */
} ROUTES[] = {
    {"/health", "GET", R_HEALTH, AUTH_NONE, false},
    {"/v1/health", "GET", R_HEALTH, AUTH_NONE, false},
    {"/ping", "GET", R_HEALTH, AUTH_NONE, false}, /* vLLM's (SageMaker's) liveness */
    {"/ping", "POST", R_HEALTH, AUTH_NONE, false},
    {"/version", "GET", R_VERSION, AUTH_NONE, false}, /* vLLM's */
    {"/metrics", "GET", R_METRICS, AUTH_OPS, false},
    {"/v1/models", "GET", R_MODELS, AUTH_KEY, false},
    /* llama-server's paths without /v1: clients whose base URL is the bare host */
    {"/models", "GET", R_MODELS, AUTH_KEY, false},
    {"/chat/completions", "POST", R_CHAT, AUTH_KEY, false},
    {"/responses", "POST", R_RESPONSES, AUTH_KEY, false},
    {"/v1/models/", "GET", R_MODEL, AUTH_KEY, true},
    {"/v1/completions", "POST", R_COMPLETIONS, AUTH_KEY, false},
    {"/completion", "POST", R_LLAMA_COMPLETION, AUTH_KEY, false}, /* llama-server's own */
    {"/completions", "POST", R_LLAMA_COMPLETION, AUTH_KEY, false},
    {"/infill", "POST", R_LLAMA_INFILL, AUTH_KEY, false},
    {"/v1/chat/completions", "POST", R_CHAT, AUTH_KEY, false},
    {"/v1/responses", "POST", R_RESPONSES, AUTH_KEY, false},
    {"/v1/responses/", "GET", R_RESPONSE_GET, AUTH_KEY, true},
    {"/v1/responses/", "DELETE", R_RESPONSE_DELETE, AUTH_KEY, true},
    {"/v1/messages", "POST", R_MESSAGES, AUTH_KEY, false},
    {"/v1/messages/count_tokens", "POST", R_MESSAGES_COUNT, AUTH_KEY, false},
    {"/v1/embeddings", "POST", R_EMBEDDINGS, AUTH_KEY, false},
    {"/embedding", "POST", R_LLAMA_EMBEDDING, AUTH_KEY, false}, /* llama-server's shape */
    {"/embeddings", "POST", R_LLAMA_EMBEDDING, AUTH_KEY, false},
    {"/rerank", "POST", R_RERANK, AUTH_KEY, false}, /* llama-server's four, vLLM's v2 */
    {"/reranking", "POST", R_RERANK, AUTH_KEY, false},
    {"/v1/rerank", "POST", R_RERANK, AUTH_KEY, false},
    {"/v1/reranking", "POST", R_RERANK, AUTH_KEY, false},
    {"/v2/rerank", "POST", R_RERANK, AUTH_KEY, false},
    {"/score", "POST", R_SCORE, AUTH_KEY, false}, /* vLLM's Score API */
    {"/v1/score", "POST", R_SCORE, AUTH_KEY, false},
    {"/v1/kv/save", "POST", R_KV_SAVE, AUTH_KEY, false},
    {"/v1/kv/unpin", "POST", R_KV_UNPIN, AUTH_KEY, false},
    {"/tokenize", "POST", R_TOKENIZE, AUTH_KEY, false},
    {"/detokenize", "POST", R_DETOKENIZE, AUTH_KEY, false},
    {"/props", "GET", R_PROPS, AUTH_KEY, false},
    {"/props", "POST", R_PROPS_SET, AUTH_KEY, false}, /* llama-server's, with --props */
    {"/apply-template", "POST", R_APPLY_TEMPLATE, AUTH_KEY, false},
    {"/v1/kv/state", "GET", R_KV_STATE, AUTH_KEY, false},
    {"/slots", "GET", R_SLOTS, AUTH_OPS, false}, /* llama-server's monitoring */
    {"/slots/", "POST", R_SLOTS_ACTION, AUTH_KEY, true},
    {"/v1/chat/completions/control", "POST", R_CHAT_CONTROL, AUTH_KEY, false}, /* llama's */
    {"/chat/completions/control", "POST", R_CHAT_CONTROL, AUTH_KEY, false},
    {"/invocations", "POST", R_INVOCATIONS, AUTH_KEY, false}, /* vLLM's (SageMaker's) */
    /* the input tokens a request would take (llama-server's, OpenAI's input_tokens) */
    {"/v1/chat/completions/input_tokens", "POST", R_INPUT_TOKENS_CHAT, AUTH_KEY, false},
    {"/chat/completions/input_tokens", "POST", R_INPUT_TOKENS_CHAT, AUTH_KEY, false},
    {"/v1/responses/input_tokens", "POST", R_INPUT_TOKENS_RESP, AUTH_KEY, false},
    {"/responses/input_tokens", "POST", R_INPUT_TOKENS_RESP, AUTH_KEY, false},
    {"/lora-adapters", "GET", R_LORA_GET, AUTH_KEY, false},
    {"/lora-adapters", "POST", R_LORA_SET, AUTH_KEY, false},
    /* vLLM's, with VLLM_ALLOW_RUNTIME_LORA_UPDATING (else as no route) */
    {"/v1/load_lora_adapter", "POST", R_LORA_LOAD, AUTH_KEY, false},
    {"/v1/unload_lora_adapter", "POST", R_LORA_UNLOAD, AUTH_KEY, false},
    /* llama-server's resumable streams (srv_streams.c) */
    {"/v1/stream/", "GET", R_STREAM_GET, AUTH_KEY, true},
    {"/v1/stream/", "DELETE", R_STREAM_DELETE, AUTH_KEY, true},
    {"/v1/streams/lookup", "POST", R_STREAMS_LOOKUP, AUTH_KEY, false},
    /* llama-server's experimental agent features, off there by default and
     * not in kvllm: its answer when off */
    {"/tools", "GET", R_DISABLED, AUTH_KEY, false},
    {"/tools", "POST", R_DISABLED, AUTH_KEY, false},
    {"/cors-proxy", "GET", R_DISABLED, AUTH_KEY, false},
    {"/cors-proxy", "POST", R_DISABLED, AUTH_KEY, false},
    /* Vertex AI's routes, at the paths its variables name (check_headers;
     * "" matches no URL) */
    {"", "POST", R_PREDICT, AUTH_KEY, false},
    {"", "GET", R_HEALTH, AUTH_NONE, false},
    /* The built-in pages hold no data: they ask for the key themselves. */
    {"/", "GET", R_PAGE, AUTH_NONE, false},
    {"/kv", "GET", R_PAGE, AUTH_NONE, false},
    {"/web/", "GET", R_PAGE, AUTH_NONE, true},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

/* Per request state, from the first callback to MHD's completion notice. */
typedef struct conn_ctx {
    kvl_buf body;
    size_t route;       /* index in ROUTES (the header stage answered unknown ones) */
    const srv_key *key; /* the caller's key; NULL without keys */
    double t_arrival;
    bool too_large;
    bool refused;   /* answered with early (after the body, which is dropped) */
    bool preflight; /* a CORS preflight, answered from the headers */
    api_error early;
    bool received;   /* the whole request is in */
    bool generating; /* r holds a queued job not yet handed to a response */
    api_req r;
    struct predict_ctx *pred; /* Vertex AI's prediction request under way */
} conn_ctx;

/* ---------------------------------------------------------- responses -- */

/* --cors ORIGIN. One server runs per process (it owns the signals), so the
 * functions that build responses read it here rather than taking the server everywhere. */
const char *srv_cors_origin;

static void add_cors(struct MHD_Response *r) {
    if (!srv_cors_origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", srv_cors_origin);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate");
    if (strcmp(srv_cors_origin, "*") != 0) MHD_add_response_header(r, "Vary", "Origin");
}

/* A response owning body (a malloc'd string, freed here if none can be made),
 * with its Content-Type; NULL when body is NULL or on failure. */
static struct MHD_Response *text_response(char *body, const char *ctype) {
    if (!body) return NULL;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    return r;
}

/* Queues r and drops this function's reference to it. */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r) {
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype,
                                 char *body, const char *hdr, const char *hdr_val) {
    struct MHD_Response *r = text_response(body, ctype);
    if (!r) return MHD_NO;
    if (hdr) MHD_add_response_header(r, hdr, hdr_val);
    add_cors(r);
    return queue(c, status, r);
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, char *body) {
    return send_text(c, status, "application/json", body, NULL, NULL);
}

static enum MHD_Result send_error(struct MHD_Connection *c, const api_error *e) {
    const char *hdr = NULL, *val = NULL;
    if (e->status == 401) hdr = "WWW-Authenticate", val = "Bearer";
    if (e->status == 429 || e->status == 503) hdr = "Retry-After", val = "1";
    kvl_log(KVL_LOG_INFO, "-> %d %s", e->status, e->msg);
    return send_text(c, (unsigned)e->status, "application/json", api_error_json(e), hdr, val);
}

/* An error of a route answering in Anthropic's shape, or OpenAI's. */
static enum MHD_Result send_error_as(struct MHD_Connection *c, route rt, const api_error *e) {
    if (rt != R_MESSAGES && rt != R_MESSAGES_COUNT) return send_error(c, e);
    const char *hdr = NULL, *val = NULL;
    if (e->status == 429 || e->status == 503) hdr = "Retry-After", val = "1";
    kvl_log(KVL_LOG_INFO, "-> %d %s", e->status, e->msg);
    return send_text(c, (unsigned)e->status, "application/json", anthropic_error_json(e), hdr, val);
}

static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *param,
                            const char *msg) {
    api_error e;
    api_fail(&e, status, param, "%s", msg);
    return send_error(c, &e);
}

/* ----------------------------------------------------------- waiting -- */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static bool admitted(const srv_job *j) { return j->state != JOB_QUEUED; }
static bool answered(const srv_job *j) { return j->state == JOB_REJECTED || j->n_finished >= j->n; }
static bool has_output(const srv_job *j) { return j->head || j->n_finished >= j->n; }

/* Whether the job failed, and then the answer in *e. */
static bool job_failed(srv_job *j, api_error *e) {
    pthread_mutex_lock(&j->mu);
    bool f = j->failed;
    if (f) *e = j->fail;
    pthread_mutex_unlock(&j->mu);
    if (f && !e->status) api_fail(e, 500, NULL, "the engine failed while generating this response");
    return f;
}

/* The job was admitted or rejected: false with *err on rejection. */
static bool job_accepted(srv_job *j, api_error *err) {
    pthread_mutex_lock(&j->mu);
    bool rejected = j->state == JOB_REJECTED;
    if (rejected) *err = j->reject;
    pthread_mutex_unlock(&j->mu);
    return !rejected;
}

/* ------------------------------------------------------------ streams -- */

typedef struct stream_ctx {
    srv *s;
    struct MHD_Connection *conn;
    api_req r;
    stream_state st;
    kvl_buf out;
    size_t off;
    bool done;
} stream_ctx;

/* Formats whatever events are queued into sc->out. */
static void stream_fill(stream_ctx *sc) {
    srv_job *j = sc->r.job;
    pthread_mutex_lock(&j->mu);
    bool ended = j->n_finished >= j->n;
    sc->st.failed = j->failed;
    if (j->failed) sc->st.fail = j->fail;
    pthread_mutex_unlock(&j->mu);
    srv_event *ev = job_take(j);
    if (sc->r.resp) responses_stream_events(sc->s, &sc->r, &sc->st, ev, &sc->out);
    else if (sc->r.anth) anthropic_stream_events(sc->s, &sc->r, &sc->st, ev, &sc->out);
    else if (sc->r.llama) llama_stream_events(sc->s, &sc->r, &sc->st, ev, &sc->out);
    else openai_stream_events(sc->s, &sc->r, &sc->st, ev, &sc->out);
    if (sc->st.n_finished >= j->n) {
        sc->done = true;
    } else if (!ev && ended) { /* final events lost to an allocation failure */
        sc->st.failed = true;
        if (sc->r.resp) responses_stream_end(sc->s, &sc->r, &sc->st, &sc->out);
        else if (sc->r.anth) anthropic_stream_end(sc->s, &sc->r, &sc->st, &sc->out);
        else if (sc->r.llama) llama_stream_end(sc->s, &sc->r, &sc->st, &sc->out);
        else openai_stream_end(sc->s, &sc->r, &sc->st, &sc->out);
        sc->done = true;
    }
    events_free(ev);
}

/* libmicrohttpd's content reader. With nothing to send it suspends the
 * connection and returns 0; the engine thread resumes it with the next event.
 * A client that leaves is noticed by the engine thread (watch_clients). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *sc = cls;
    (void)pos;
    while (sc->off == sc->out.len) {
        if (sc->done) return MHD_CONTENT_READER_END_OF_STREAM;
        sc->out.len = 0;
        sc->off = 0;
        if (!job_ready_or_suspend(sc->r.job, sc->conn, has_output)) return 0;
        stream_fill(sc);
        if (sc->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = sc->out.len - sc->off;
    if (n > max) n = max;
    memcpy(buf, sc->out.p + sc->off, n);
    sc->off += n;
    return (ssize_t)n;
}

/* Called when MHD is done with the response: normally after [DONE], or when
 * the client went away mid-stream, in which case the job is cancelled. */
static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    job_detach(sc->r.job);
    if (!sc->done) {
        kvl_log(KVL_LOG_INFO, "client left mid-stream: cancelling %s", sc->r.id);
        job_cancel(sc->r.job, true);
    }
    atomic_fetch_sub(&sc->s->n_busy, 1);
    api_req_free(&sc->r);
    stream_state_free(&sc->st);
    kvl_buf_free(&sc->out);
    free(sc);
}

/* A resumable stream's producer (srv_streams.c), on the pump thread: the
 * events queued so far, formatted as stream_read would send them. */
static bool pump_stream(void *ctx, kvl_buf *out) {
    stream_ctx *sc = ctx;
    srv_job *j = sc->r.job;
    pthread_mutex_lock(&j->mu);
    const bool ready = has_output(j);
    pthread_mutex_unlock(&j->mu);
    if (ready) {
        sc->out.len = 0;
        stream_fill(sc);
        if (sc->out.oom) return true;
        kvl_buf_put(out, sc->out.p, sc->out.len);
    }
    return sc->done || out->oom;
}

/* The producer's end: as stream_free, but nothing to cancel (it ran to its end
 * or was cancelled through its session). */
static void pump_drop(void *ctx) {
    stream_ctx *sc = ctx;
    sc->done = true;
    stream_free(sc);
}

/* Hands cc->r to a streaming response (which then owns it and n_busy). With
 * X-Conversation-Id the answer goes through a resumable stream: produced into
 * the conversation's session, the response one of its readers. */
static enum MHD_Result start_stream(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    cc->generating = false;
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
        job_detach(cc->r.job);
        job_cancel(cc->r.job, false);
        api_req_free(&cc->r);
        atomic_fetch_sub(&s->n_busy, 1);
        return fail(c, 500, NULL, "out of memory");
    }
    sc->s = s;
    sc->conn = c;
    sc->r = cc->r;
    memset(&cc->r, 0, sizeof cc->r);
    const char *conv = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Conversation-Id");
    if (conv && *conv) {
        srv_job *j = sc->r.job;
        job_detach(j); /* its client may leave: the generation goes on into the session */
        sc->conn = NULL;
        api_error err;
        rstream *st =
            rstream_open(s, cc->key ? cc->key->ns : "", conv, j, sc, pump_stream, pump_drop, &err);
        if (!st) {
            /* not a client leaving: stream_free's own cancel is then a no-op */
            job_cancel(j, false);
            stream_free(sc);
            return send_error_as(c, ROUTES[cc->route].r, &err);
        }
        struct MHD_Response *resp = rstream_response(s, st, c, 0);
        rstream_release(s, st);
        if (!resp) return MHD_NO; /* the session runs on, for a later GET */
        add_cors(resp);
        return queue(c, MHD_HTTP_OK, resp);
    }
    struct MHD_Response *resp = srv_sse_response(stream_read, sc, stream_free);
    if (!resp) return MHD_NO;
    add_cors(resp);
    return queue(c, MHD_HTTP_OK, resp); /* stream_free runs when MHD drops its reference */
}

/* --------------------------------------------------------- generation -- */

/* Ends cc's generation without a stream: the job is dropped (cancelled if
 * still running) and its place in n_busy given back. */
/* A job that no response will carry further: dropped (cancelled if still
 * running: its client went away) and its place in n_busy given back. */
static void end_job(srv *s, api_req *r) {
    srv_job *j = r->job;
    job_detach(j);
    pthread_mutex_lock(&j->mu);
    bool running = j->state != JOB_REJECTED && j->n_finished < j->n;
    pthread_mutex_unlock(&j->mu);
    if (running) job_cancel(j, true); /* the connection ended before the answer */
    api_req_free(r);
    atomic_fetch_sub(&s->n_busy, 1);
}

static void end_generation(srv *s, conn_ctx *cc) {
    if (!cc->generating) return;
    cc->generating = false;
    end_job(s, &cc->r);
}

/* The answer of a job not streamed, once answered: its JSON, or NULL with
 * err (rejected, failed, or no memory). */
static char *generation_answer(srv *s, api_req *r, api_error *err) {
    srv_job *j = r->job;
    if (!job_accepted(j, err) || job_failed(j, err)) return NULL;
    srv_event *ev = job_take(j);
    api_fail(err, 500, NULL, "the engine failed while generating this response");
    char *body = r->resp    ? responses_response(s, r, ev)
                 : r->anth  ? anthropic_response(s, r, ev, err)
                 : r->llama ? llama_response(s, r, ev)
                            : openai_response(s, r, ev);
    events_free(ev);
    return body;
}

/* Called on every callback while a job is queued or running: answers once
 * the job has an answer, else suspends the connection until it may. */
static enum MHD_Result continue_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    srv_job *j = cc->r.job;
    api_error err;
    if (!job_ready_or_suspend(j, c, cc->r.stream ? admitted : answered)) return MHD_YES;
    const route rt = ROUTES[cc->route].r;
    if (!job_accepted(j, &err)) {
        end_generation(s, cc);
        return send_error_as(c, rt, &err);
    }
    if (cc->r.stream) return start_stream(s, c, cc);
    if (atomic_load(&j->cancelled)) { /* the client left */
        end_generation(s, cc);
        return MHD_NO;
    }
    char *body = generation_answer(s, &cc->r, &err);
    end_generation(s, cc);
    if (!body) return send_error_as(c, rt, &err);
    return send_json(c, MHD_HTTP_OK, body);
}

/* Body -> api_req: JSON checks (srv_json.c), then the OpenAI fields. */
static bool parse_request(srv *s, const conn_ctx *cc, const char *text, size_t len, route rt,
                          api_req *r, api_error *err) {
    cJSON *body = json_parse_body(text, len, err);
    if (!body) return false;
    const char *tenant = cc->key ? cc->key->ns : ""; /* whose kept responses it may continue */
    bool ok = rt == R_RESPONSES          ? responses_parse(s, body, tenant, r, err)
              : rt == R_MESSAGES         ? anthropic_parse(s, body, r, err)
              : rt == R_LLAMA_COMPLETION ? llama_parse(s, body, r, err)
              : rt == R_LLAMA_INFILL     ? llama_infill_parse(s, body, r, err)
                                         : openai_parse(s, body, rt == R_CHAT, r, err);
    cJSON_Delete(body);
    return ok;
}

/* A generation request's body -> its job, queued (n_busy taken), in *r.
 * False with err; or true with *now set when the answer needs no job (echo
 * with max_tokens 0: the prompt alone, as SSE when *now_sse). */
static bool submit_generation(srv *s, struct MHD_Connection *c, const conn_ctx *cc,
                              const char *text, size_t len, route rt, api_req *r, char **now,
                              bool *now_sse, api_error *err) {
    *now = NULL;
    *now_sse = false;
    if (!parse_request(s, cc, text, len, rt, r, err)) return false;
    /* the prompt's text and log-probabilities, before the job is queued */
    if (r->echo || r->prompt_logprobs >= 0) {
        if (!srv_echo_prepare(s, r, err)) {
            api_req_free(r);
            return false;
        }
        if (r->echo && r->job->max_tokens == 0) { /* the prompt alone: nothing to generate */
            *now = openai_echo_only(s, r);
            *now_sse = r->stream;
            api_req_free(r);
            return *now || api_fail(err, 500, NULL, "out of memory");
        }
    }
    const char *conv = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Conversation-Id");
    if (r->stream && conv && !rstream_id_ok(conv, err)) {
        api_req_free(r);
        return false;
    }
    srv_job *j = r->job;
    /* The tenant's namespace goes in front of the request's own cache_salt. */
    bool oom;
    char *salt = tenant_salt(s, cc->key, j->cache_salt, &oom);
    free(j->cache_salt);
    j->cache_salt = salt;
    if (oom) {
        api_req_free(r);
        return api_fail(err, 500, NULL, "out of memory");
    }
    j->t_arrival = cc->t_arrival;
    j->fd = conn_fd(c); /* before the engine thread can see the job */
    if (!srv_enqueue(s, j, err)) {
        api_req_free(r);
        return false;
    }
    atomic_fetch_add(&s->n_busy, 1);
    return true;
}

static enum MHD_Result handle_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc, route rt) {
    api_error err;
    char *now;
    bool sse;
    if (!submit_generation(s, c, cc, cc->body.p ? cc->body.p : "", cc->body.len, rt, &cc->r, &now,
                           &sse, &err))
        return send_error_as(c, rt, &err);
    if (now)
        return sse ? send_text(c, MHD_HTTP_OK, "text/event-stream", now, NULL, NULL)
                   : send_json(c, MHD_HTTP_OK, now);
    cc->generating = true;
    return continue_generate(s, c, cc);
}

/* ------------------------------------------------------------ predict -- */

/* Vertex AI's prediction route (llama-server's, with AIP_MODE=PREDICTION):
 * {"instances": [...]}, at most PREDICT_MAX, each an object whose
 * "@requestFormat" names the request it is: a route's path or its camelCase
 * alias as llama-server derives it ("chatCompletions" for
 * /v1/chat/completions, "applyTemplate" for /apply-template; where two paths
 * share an alias, the /v1 one). Each instance, less that member and never
 * streamed, runs as its route runs a body, the generations side by side; the
 * answer is {"predictions": [...]} in order, each the route's JSON answer or
 * {"error": {...}}. */
#define PREDICT_MAX 128

typedef struct predict_item {
    cJSON *result; /* the answer, once there is one */
    api_req r;     /* a generation's, while pending */
    bool pending;
} predict_item;

typedef struct predict_ctx {
    int n;
    predict_item it[];
} predict_ctx;

/* llama-server's alias of a path: without a leading /v1, the first letter
 * after each '/', '-' or '_' in upper case and those dropped. */
static void gcp_alias(const char *path, char *out, size_t cap) {
    if (!strncmp(path, "/v1", 3) && path[3]) path += 3;
    if (*path == '/') path++;
    size_t n = 0;
    bool up = false;
    for (; *path && n + 1 < cap; path++) {
        if (*path == '/' || *path == '-' || *path == '_') {
            up = true;
            continue;
        }
        out[n++] = up ? (char)toupper((unsigned char)*path) : *path;
        up = false;
    }
    out[n] = 0;
}

/* The route an instance's "@requestFormat" names: its path exactly, else its
 * alias (POST before GET, /v1 paths first); -1 for none. */
static int predict_route(const char *fmt) {
    int best = -1, best_rank = -1;
    for (size_t i = 0; i < N_ROUTES; i++) {
        if (ROUTES[i].prefix || !ROUTES[i].path[0] || ROUTES[i].r == R_PREDICT) continue;
        char alias[64];
        gcp_alias(ROUTES[i].path, alias, sizeof alias);
        const bool exact = !strcmp(fmt, ROUTES[i].path);
        if (!exact && strcmp(fmt, alias) != 0) continue;
        const int rank =
            4 * exact + 2 * !strcmp(ROUTES[i].method, "POST") + !strncmp(ROUTES[i].path, "/v1/", 4);
        if (rank > best_rank) best = (int)i, best_rank = rank;
    }
    return best;
}

static bool is_generation(route rt) {
    return rt == R_CHAT || rt == R_COMPLETIONS || rt == R_LLAMA_COMPLETION ||
           rt == R_LLAMA_INFILL || rt == R_RESPONSES || rt == R_MESSAGES;
}

static cJSON *error_item(route rt, const api_error *e) {
    char *js =
        rt == R_MESSAGES || rt == R_MESSAGES_COUNT ? anthropic_error_json(e) : api_error_json(e);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    free(js);
    return o ? o : cJSON_CreateNull();
}

/* A JSON answer (taken) as an item; its error where there is none. */
static cJSON *answer_item(route rt, char *js, const api_error *err) {
    if (!js) return error_item(rt, err);
    cJSON *o = cJSON_Parse(js);
    free(js);
    return o ? o : cJSON_CreateNull();
}

/* The routes answered at once (no generation): as dispatch runs them. */
static char *predict_now(srv *s, const conn_ctx *cc, route rt, const char *b, size_t n,
                         api_error *err) {
    switch (rt) {
    case R_HEALTH: return strdup("{\"status\":\"ok\"}");
    case R_MODELS: return openai_models(s);
    case R_PROPS: return srv_props(s);
    case R_TOKENIZE: return srv_tokenize(s, b, n, err);
    case R_DETOKENIZE: return srv_detokenize(s, b, n, err);
    case R_APPLY_TEMPLATE: return srv_apply_template(s, b, n, err);
    case R_EMBEDDINGS:
    case R_LLAMA_EMBEDDING: return srv_embeddings(s, b, n, rt == R_LLAMA_EMBEDDING, err);
    case R_RERANK: return srv_rerank(s, b, n, err);
    case R_SCORE: return srv_score(s, b, n, err);
    case R_MESSAGES_COUNT: return anthropic_count_tokens(s, b, n, err);
    case R_INPUT_TOKENS_CHAT:
    case R_INPUT_TOKENS_RESP:
        return srv_input_tokens(s, b, n, rt == R_INPUT_TOKENS_RESP, cc->key ? cc->key->ns : "",
                                err);
    default:
        api_fail(err, 400, "@requestFormat", "this route does not run inside a prediction request");
        return NULL;
    }
}

/* Instance k: answered now, or its generation queued (pending). */
static void predict_one(srv *s, struct MHD_Connection *c, conn_ctx *cc, const cJSON *inst,
                        predict_item *it) {
    api_error err;
    const char *fmt =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(inst, "@requestFormat"));
    if (!cJSON_IsObject(inst)) {
        api_fail(&err, 400, NULL, "each instance must be a JSON object");
        it->result = error_item(R_CHAT, &err);
        return;
    }
    if (!fmt) {
        api_fail(&err, 400, "@requestFormat", "each instance must include a string @requestFormat");
        it->result = error_item(R_CHAT, &err);
        return;
    }
    const int ri = predict_route(fmt);
    if (ri < 0) {
        api_fail(&err, 400, "@requestFormat", "no handler registered for @requestFormat: %.100s",
                 fmt);
        it->result = error_item(R_CHAT, &err);
        return;
    }
    const route rt = ROUTES[ri].r;
    cJSON *body = cJSON_Duplicate(inst, true);
    cJSON_DeleteItemFromObjectCaseSensitive(body, "@requestFormat");
    if (is_generation(rt) && cJSON_GetObjectItemCaseSensitive(body, "stream")) {
        kvl_log(KVL_LOG_INFO, "predict: an instance's \"stream\" is false here (no streaming)");
        cJSON_ReplaceItemInObjectCaseSensitive(body, "stream", cJSON_CreateFalse());
    }
    char *text = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    if (!text) {
        api_fail(&err, 500, NULL, "out of memory");
        it->result = error_item(rt, &err);
        return;
    }
    if (!is_generation(rt)) {
        it->result = answer_item(rt, predict_now(s, cc, rt, text, strlen(text), &err), &err);
    } else {
        char *now;
        bool sse;
        if (!submit_generation(s, c, cc, text, strlen(text), rt, &it->r, &now, &sse, &err))
            it->result = error_item(rt, &err);
        else if (now) it->result = answer_item(rt, now, &err);
        else it->pending = true;
    }
    free(text);
}

static void predict_free(srv *s, conn_ctx *cc) {
    predict_ctx *p = cc->pred;
    if (!p) return;
    for (int k = 0; k < p->n; k++) {
        if (p->it[k].pending) end_job(s, &p->it[k].r);
        cJSON_Delete(p->it[k].result);
    }
    free(p);
    cc->pred = NULL;
}

/* Every generation answered (else the connection waits on the first that is
 * not): the predictions. */
static enum MHD_Result continue_predict(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    predict_ctx *p = cc->pred;
    for (int k = 0; k < p->n; k++)
        if (p->it[k].pending && !job_ready_or_suspend(p->it[k].r.job, c, answered)) return MHD_YES;
    cJSON *o = cJSON_CreateObject(), *preds = cJSON_AddArrayToObject(o, "predictions");
    for (int k = 0; k < p->n; k++) {
        predict_item *it = &p->it[k];
        if (it->pending) {
            api_error err;
            const route rt = it->r.anth ? R_MESSAGES : R_CHAT; /* the error's shape */
            it->result = answer_item(rt, generation_answer(s, &it->r, &err), &err);
            end_job(s, &it->r);
            it->pending = false;
        }
        cJSON_AddItemToArray(preds, it->result ? it->result : cJSON_CreateNull());
        it->result = NULL;
    }
    predict_free(s, cc);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!js) return fail(c, 500, NULL, "out of memory");
    return send_json(c, MHD_HTTP_OK, js);
}

static enum MHD_Result handle_predict(srv *s, struct MHD_Connection *c, conn_ctx *cc) {
    api_error err;
    cJSON *b = json_parse_body(cc->body.p ? cc->body.p : "", cc->body.len, &err);
    if (!b) return send_error(c, &err);
    const cJSON *inst = cJSON_GetObjectItemCaseSensitive(b, "instances");
    const int n = cJSON_GetArraySize(inst);
    if (!cJSON_IsObject(b) || !cJSON_IsArray(inst) || n > PREDICT_MAX) {
        cJSON_Delete(b);
        if (!cJSON_IsObject(b)) return fail(c, 400, NULL, "request body must be a JSON object");
        return n > PREDICT_MAX
                   ? fail(c, 400, "instances", "instances array exceeds maximum size of 128")
                   : fail(c, 400, "instances",
                          "request body must include an array field named instances");
    }
    cc->pred = calloc(1, sizeof *cc->pred + (size_t)n * sizeof(predict_item));
    if (!cc->pred) {
        cJSON_Delete(b);
        return fail(c, 500, NULL, "out of memory");
    }
    cc->pred->n = n;
    int k = 0;
    for (const cJSON *i = inst->child; i; i = i->next) predict_one(s, c, cc, i, &cc->pred->it[k++]);
    cJSON_Delete(b);
    return continue_predict(s, c, cc);
}

/* ------------------------------------------------------------ routing -- */

/* A CORS preflight: which methods and headers the browser may use. */
static enum MHD_Result send_preflight(struct MHD_Connection *c, const char *method) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    add_cors(r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", method);
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, X-Conversation-Id");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    return queue(c, MHD_HTTP_NO_CONTENT, r);
}

/* A body handler's answer: the JSON, or its error. */
static enum MHD_Result send_result(struct MHD_Connection *c, char *body, const api_error *err) {
    return body ? send_json(c, MHD_HTTP_OK, body) : send_error(c, err);
}

static bool route_matches(size_t i, const char *url) {
    size_t n = strlen(ROUTES[i].path);
    if (!ROUTES[i].prefix) return strcmp(url, ROUTES[i].path) == 0;
    return strncmp(url, ROUTES[i].path, n) == 0 && url[n]; /* ids may hold '/' (org/name) */
}

/* Vertex AI's prediction route must not hide one of kvllm's. */
bool server_route_taken(const char *path) {
    for (size_t i = 0; i < N_ROUTES; i++)
        if (ROUTES[i].path[0] && route_matches(i, path)) return true;
    return false;
}

/* The whole request is in: answer it. */
static enum MHD_Result dispatch(srv *s, struct MHD_Connection *c, const char *url,
                                const char *method, conn_ctx *cc) {
    kvl_log(KVL_LOG_INFO, "%s %s (%zu bytes)", method, url, cc->body.len);
    if (cc->too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes",
                 s->cfg.max_body_bytes);
        return fail(c, 413, NULL, msg);
    }
    kvl_buf m = {0};
    api_error err;
    const char *body = cc->body.p ? cc->body.p : "";
    switch (ROUTES[cc->route].r) {
    case R_HEALTH:
        if (atomic_load(&s->draining)) return fail(c, 503, NULL, "the server is shutting down");
        return send_json(c, MHD_HTTP_OK, strdup("{\"status\":\"ok\"}"));
    case R_VERSION: return send_json(c, MHD_HTTP_OK, strdup("{\"version\":\"" KVLLM_VERSION "\"}"));
    case R_METRICS:
        metrics_render(&s->metrics, s->cfg.model_id, &m);
        metrics_render_conns(&m, s->cfg.model_id, conns_open(s), atomic_load(&s->n_refused),
                             atomic_load(&s->n_timed_out), atomic_load(&s->n_evicted),
                             atomic_load(&s->n_client_gone));
        metrics_render_memory(&m, s->cfg.model_id, engine_model(s->e));
        if (s->cfg.metrics_prefix && strcmp(s->cfg.metrics_prefix, "kvllm") != 0) {
            kvl_buf renamed = {0};
            metrics_prefix(&m, s->cfg.metrics_prefix, &renamed);
            renamed.oom = renamed.oom || m.oom;
            kvl_buf_free(&m);
            m = renamed;
        }
        if (m.oom) {
            kvl_buf_free(&m);
            return MHD_NO;
        }
        return send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", m.p, NULL,
                         NULL);
    case R_MODELS: return send_json(c, MHD_HTTP_OK, openai_models(s));
    case R_MODEL:
        return send_result(c, openai_model_get(s, url + strlen(ROUTES[cc->route].path), &err),
                           &err);
    case R_TOKENIZE: return send_result(c, srv_tokenize(s, body, cc->body.len, &err), &err);
    case R_DETOKENIZE: return send_result(c, srv_detokenize(s, body, cc->body.len, &err), &err);
    case R_EMBEDDINGS:
    case R_LLAMA_EMBEDDING:
        return send_result(
            c,
            srv_embeddings(s, body, cc->body.len, ROUTES[cc->route].r == R_LLAMA_EMBEDDING, &err),
            &err);
    case R_RERANK: return send_result(c, srv_rerank(s, body, cc->body.len, &err), &err);
    case R_SCORE: return send_result(c, srv_score(s, body, cc->body.len, &err), &err);
    case R_PROPS: return send_json(c, MHD_HTTP_OK, srv_props(s));
    case R_PROPS_SET: {
        /* llama-server changes no property here either: it answers success
         * with --props, 501 without */
        if (!s->cfg.props_endpoint) {
            api_fail(&err, 501, NULL,
                     "This server does not support changing global properties. Start it with "
                     "`--props`");
            err.type = "not_supported_error";
            return send_error(c, &err);
        }
        cJSON *b = json_parse_body(body, cc->body.len, &err);
        const bool obj = cJSON_IsObject(b);
        cJSON_Delete(b);
        if (!obj) {
            if (!err.status) api_fail(&err, 400, NULL, "the request body must be a JSON object");
            return send_error(c, &err);
        }
        return send_json(c, MHD_HTTP_OK, strdup("{\"success\":true}"));
    }
    case R_APPLY_TEMPLATE:
        return send_result(c, srv_apply_template(s, body, cc->body.len, &err), &err);
    case R_LORA_GET: return send_json(c, MHD_HTTP_OK, srv_lora_list(s));
    case R_LORA_SET: return send_result(c, srv_lora_set(s, body, cc->body.len, &err), &err);
    case R_LORA_LOAD:
    case R_LORA_UNLOAD: {
        if (!s->lora_runtime) {
            api_fail(&err, 404, NULL,
                     "no route for %s (set VLLM_ALLOW_RUNTIME_LORA_UPDATING=True to load and "
                     "unload LoRA adapters at run time)",
                     ROUTES[cc->route].path);
            return send_error(c, &err);
        }
        char *msg = ROUTES[cc->route].r == R_LORA_LOAD
                        ? srv_lora_load(s, body, cc->body.len, &err)
                        : srv_lora_unload(s, body, cc->body.len, &err);
        return msg ? send_text(c, MHD_HTTP_OK, "text/plain; charset=utf-8", msg, NULL, NULL)
                   : send_error(c, &err);
    }
    case R_KV_SAVE: return send_result(c, srv_kv_save(s, body, cc->body.len, cc->key, &err), &err);
    case R_KV_UNPIN:
        return send_result(c, srv_kv_unpin(s, body, cc->body.len, cc->key, &err), &err);
    case R_KV_STATE: {
        size_t len = 0;
        char *js = srv_kv_state(s, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since"),
                                &len, &err);
        return js ? send_text(c, MHD_HTTP_OK, "application/json", js, "Cache-Control", "no-store")
                  : send_error(c, &err);
    }
    case R_SLOTS:
        return send_result(
            c,
            srv_slots(s, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot"),
                      &err),
            &err);
    case R_SLOTS_ACTION:
        return send_result(
            c,
            srv_slot_action(s, url, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action"),
                            body, cc->body.len, cc->key, &err),
            &err);
    case R_INVOCATIONS: { /* vLLM's: the kind of request its body is, tried in vLLM's order */
        cJSON *b = json_parse_body(body, cc->body.len, &err);
        if (!b) return send_error(c, &err);
        const bool chat = cJSON_GetObjectItemCaseSensitive(b, "messages") != NULL,
                   compl = cJSON_GetObjectItemCaseSensitive(b, "prompt") != NULL,
                   embed = cJSON_GetObjectItemCaseSensitive(b, "input") != NULL;
        cJSON_Delete(b);
        if (chat) return handle_generate(s, c, cc, R_CHAT);
        if (compl ) return handle_generate(s, c, cc, R_COMPLETIONS);
        if (embed) return send_result(c, srv_embeddings(s, body, cc->body.len, false, &err), &err);
        api_fail(&err, 400, NULL,
                 "/invocations takes a chat request (messages), a completion (prompt) or an "
                 "embedding request (input)");
        return send_error(c, &err);
    }
    case R_INPUT_TOKENS_CHAT:
    case R_INPUT_TOKENS_RESP:
        return send_result(c,
                           srv_input_tokens(s, body, cc->body.len,
                                            ROUTES[cc->route].r == R_INPUT_TOKENS_RESP,
                                            cc->key ? cc->key->ns : "", &err),
                           &err);
    case R_CHAT_CONTROL:
        return send_result(c, srv_chat_control(s, body, cc->body.len, cc->key, &err), &err);
    case R_PREDICT: return handle_predict(s, c, cc);
    case R_DISABLED:
        api_fail(&err, 403, NULL, "this feature is disabled");
        err.type = "feature_disabled";
        return send_error(c, &err);
    case R_STREAMS_LOOKUP:
        return send_result(
            c, rstreams_lookup(s, cc->key ? cc->key->ns : "", body, cc->body.len, &err), &err);
    case R_STREAM_DELETE: {
        rstream_delete(s, cc->key ? cc->key->ns : "", url + strlen(ROUTES[cc->route].path));
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        add_cors(r);
        return queue(c, MHD_HTTP_NO_CONTENT, r);
    }
    case R_STREAM_GET: {
        size_t from;
        rstream *st =
            rstream_get(s, cc->key ? cc->key->ns : "", url + strlen(ROUTES[cc->route].path),
                        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "from"), &from, &err);
        if (!st) return send_error(c, &err);
        struct MHD_Response *r = rstream_response(s, st, c, from);
        rstream_release(s, st);
        if (!r) return MHD_NO;
        add_cors(r);
        return queue(c, MHD_HTTP_OK, r);
    }
    case R_PAGE: {
        const srv_asset *a = s->cfg.no_webui ? NULL : srv_asset_find(url);
        if (!a) return fail(c, 404, NULL, "no such page");
        struct MHD_Response *r =
            MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", a->ctype);
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        return queue(c, MHD_HTTP_OK, r);
    }
    case R_COMPLETIONS:
    case R_LLAMA_COMPLETION:
    case R_LLAMA_INFILL:
    case R_CHAT:
    case R_RESPONSES:
    case R_MESSAGES: return handle_generate(s, c, cc, ROUTES[cc->route].r);
    case R_RESPONSE_GET:
    case R_RESPONSE_DELETE: {
        const char *id = url + strlen(ROUTES[cc->route].path), *tenant = cc->key ? cc->key->ns : "";
        const char *slash = strchr(id, '/');
        char *js = NULL;
        if (slash && ROUTES[cc->route].r == R_RESPONSE_GET && !strcmp(slash, "/input_items")) {
            char rid[64];
            snprintf(rid, sizeof rid, "%.*s", (int)(slash - id), id);
            js = rstore_input_list(s->responses, tenant, rid,
                                   MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"),
                                   MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit"),
                                   MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"),
                                   &err);
            return send_result(c, js, &err);
        }
        if (ROUTES[cc->route].r == R_RESPONSE_GET) js = rstore_response(s->responses, tenant, id);
        else if (rstore_delete(s->responses, tenant, id) &&
                 asprintf(&js, "{\"id\":\"%s\",\"object\":\"response\",\"deleted\":true}", id) < 0)
            js = NULL;
        if (js) return send_json(c, MHD_HTTP_OK, js);
        api_fail(&err, 404, NULL, "no kept response '%.60s'", id);
        return send_error(c, &err);
    }
    case R_MESSAGES_COUNT: {
        char *js = anthropic_count_tokens(s, body, cc->body.len, &err);
        return js ? send_json(c, MHD_HTTP_OK, js) : send_error_as(c, R_MESSAGES_COUNT, &err);
    }
    default: return MHD_NO;
    }
}

/* Request framing a proxy in front could read differently (request
 * smuggling): several Content-Length headers, Transfer-Encoding other than
 * a single "chunked", or both. libmicrohttpd uses the first Content-Length and
 * lets Transfer-Encoding win; these are refused before any body is read. */
typedef struct framing {
    int n_length, n_te;
    bool te_chunked;
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value) {
    framing *f = cls;
    (void)kind;
    if (strcasecmp(key, "Content-Length") == 0) f->n_length++;
    if (strcasecmp(key, "Transfer-Encoding") == 0) {
        f->n_te++;
        f->te_chunked = value && strcasecmp(value, "chunked") == 0;
    }
    return MHD_YES;
}

static bool check_framing(struct MHD_Connection *c, api_error *e) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.n_length > 1) return api_fail(e, 400, NULL, "more than one Content-Length header");
    if (f.n_te && f.n_length)
        return api_fail(e, 400, NULL, "both Transfer-Encoding and Content-Length");
    if (f.n_te > 1 || (f.n_te && !f.te_chunked))
        return api_fail(e, 400, NULL,
                        "unsupported Transfer-Encoding (only a single 'chunked' is accepted)");
    return true;
}

/* The headers are in, the body not yet read: everything that can be decided
 * now is, so a caller without a key, or with a body too large, costs no more
 * than its headers. */
/* The route path of url: url itself, or under --api-prefix what follows the
 * prefix ("/llm/v1/models" -> "/v1/models"; the prefix alone is its root
 * page); NULL for a URL outside it. */
static const char *route_path(const srv *s, const char *url) {
    const char *p = s->cfg.api_prefix;
    if (!p || !*p) return url;
    const size_t n = strlen(p);
    if (strncmp(url, p, n) != 0 || (url[n] && url[n] != '/')) return NULL;
    return url[n] ? url + n : "/";
}

static bool check_headers(srv *s, struct MHD_Connection *c, const char *url, const char *method,
                          conn_ctx *cc, api_error *e) {
    if (!url) return api_fail(e, 404, NULL, "no route outside %.200s", s->cfg.api_prefix);
    size_t i = 0;
    const char *predict = s->cfg.gcp_predict_route, *health = s->cfg.gcp_health_route;
    if ((predict && !strcmp(url, predict)) || (health && !strcmp(url, health))) {
        const route want = predict && !strcmp(url, predict) ? R_PREDICT : R_HEALTH;
        while (ROUTES[i].path[0] || ROUTES[i].r != want) i++; /* its "" entry */
    } else {
        while (i < N_ROUTES && !route_matches(i, url)) i++;
    }
    if (i == N_ROUTES) return api_fail(e, 404, NULL, "no route for %.200s", url);
    for (size_t j = i; j < N_ROUTES && ROUTES[i].path[0]; j++) /* a path with a route per method */
        if (route_matches(j, url) && !strcmp(method, ROUTES[j].method)) {
            i = j;
            break;
        }
    cc->route = i;
    if (!check_framing(c, e)) return false;
    if (srv_cors_origin && strcmp(method, "OPTIONS") == 0) { /* a CORS preflight: no key, no body */
        cc->preflight = true;
        return true;
    }
    if (strcmp(method, ROUTES[i].method) != 0) {
        api_fail(e, 405, NULL, "%s is not allowed on %s (use %s)", method, url, ROUTES[i].method);
        e->code = "method_not_allowed";
        return false;
    }
    bool needs_key =
        ROUTES[i].auth == AUTH_KEY || (ROUTES[i].auth == AUTH_OPS && !s->cfg.metrics_public);
    if (s->n_keys > 0) {
        cc->key = keys_match(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"));
        if (!cc->key) /* the Anthropic SDKs' header */
            cc->key =
                keys_match_key(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"));
        if (needs_key && !cc->key) {
            api_fail(e, 401, NULL,
                     "invalid or missing API key (send 'Authorization: Bearer KEY' or "
                     "'x-api-key: KEY')");
            e->code = "invalid_api_key";
            return false;
        }
    }
    const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (len && strtoull(len, NULL, 10) > s->cfg.max_body_bytes)
        return api_fail(e, 413, NULL, "the request body is larger than %zu bytes",
                        s->cfg.max_body_bytes);
    if (atomic_load(&s->draining) && ROUTES[i].r != R_METRICS)
        return api_fail(e, 503, NULL, "the server is shutting down");
    return true;
}

/* A refusal decided from the headers; the connection is closed after it, as
 * its client has shown nothing worth keeping it open for. */
static enum MHD_Result send_early(struct MHD_Connection *c, conn_ctx *cc) {
    const api_error *e = &cc->early;
    struct MHD_Response *r = text_response(api_error_json(e), "application/json");
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Connection", "close");
    add_cors(r);
    if (e->status == 405) MHD_add_response_header(r, "Allow", ROUTES[cc->route].method);
    if (e->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (e->status == 503) MHD_add_response_header(r, "Retry-After", "1");
    kvl_log(KVL_LOG_INFO, "-> %d %s", e->status, e->msg);
    return queue(c, (unsigned)e->status, r);
}

/* Whether a refusal decided from the headers is sent before the body. An
 * answer sent while the client is still sending makes libmicrohttpd close with
 * unread input, which resets the connection and usually loses the answer; so
 * the body is read and dropped (it is never stored, and the request deadline
 * bounds how long that takes) unless there is none, the client waits for
 * "100 Continue", or it is too large to be worth reading. */
static bool answer_now(struct MHD_Connection *c, const api_error *e) {
    if (e->status == 413) return true;
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0) return true;
    const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
    if (e->status == 400)
        return true; /* bad framing: the body cannot be trusted to end where it says */
    return !te && (!len || strtoull(len, NULL, 10) == 0);
}

/* MHD calls this first with *con_cls NULL (headers only), then once per piece
 * of the body, then with *upload_size 0 to produce the response, and again
 * each time a suspended connection is resumed. */
enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    (void)version;
    const char *prefix = s->cfg.api_prefix;
    if (!cc && prefix && *prefix && strcmp(url, prefix) == 0 && strcmp(method, "GET") == 0) {
        /* the prefix alone: to its root page, "/llm/", against which the
         * page's relative links resolve */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        char to[512];
        snprintf(to, sizeof to, "%s/", prefix);
        MHD_add_response_header(r, "Location", to);
        return queue(c, MHD_HTTP_PERMANENT_REDIRECT, r);
    }
    url = route_path(s, url); /* NULL outside --api-prefix: refused by check_headers */
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        cc->t_arrival = kvl_time_s();
        *con_cls = cc;
        if (!check_headers(s, c, url, method, cc, &cc->early)) {
            cc->refused = true;
            if (answer_now(c, &cc->early)) return send_early(c, cc);
        }
        if (cc->preflight) return send_preflight(c, ROUTES[cc->route].method);
        return MHD_YES;
    }
    if (*upload_size && cc->refused) { /* dropped as it arrives: never stored */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        /* Past the limit (chunked bodies have no Content-Length to check
         * early) the rest is read and dropped, so the client still gets a
         * clean 413 rather than a reset connection. */
        if (!cc->too_large && cc->body.len + *upload_size > s->cfg.max_body_bytes) {
            cc->too_large = true;
            kvl_buf_free(&cc->body);
        }
        if (!cc->too_large) kvl_buf_put(&cc->body, upload, *upload_size);
        if (cc->body.oom) cc->too_large = true;
        *upload_size = 0;
        return MHD_YES;
    }
    if (!cc->received) {
        cc->received = true;
        conns_request_received(s, c);
        if (cc->refused) return send_early(c, cc);
        return dispatch(s, c, url, method, cc);
    }
    if (cc->generating) return continue_generate(s, c, cc);
    if (cc->pred) return continue_predict(s, c, cc);
    return MHD_NO;
}

void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    (void)toe;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    end_generation(s, cc);
    predict_free(s, cc);
    kvl_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
    conns_response_done(s, c); /* the next request on this connection has its own deadline */
}
