/* HTTP layer (libmicrohttpd, a thread per connection): routing, bodies,
 * authentication, error responses, blocking and SSE responses, startup and
 * shutdown. Connection threads may block: on a job's condition variable while
 * the engine thread works, checking every 100 ms whether the client left. */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <omp.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "srv_internal.h"

typedef enum route {
    R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT,
    R_EMBEDDINGS, R_TOKENIZE, R_DETOKENIZE, R_PROPS
} route;

static const struct {
    const char *path, *method;
    route r;
    bool auth;   /* like vLLM, --api-key protects /v1 only */
    bool prefix; /* path is a prefix; the rest of the URL is the argument */
} ROUTES[] = {
    {"/health", "GET", R_HEALTH, false, false},
    {"/metrics", "GET", R_METRICS, false, false},
    {"/v1/models", "GET", R_MODELS, true, false},
    {"/v1/models/", "GET", R_MODEL, true, true},
    {"/v1/completions", "POST", R_COMPLETIONS, true, false},
    {"/v1/chat/completions", "POST", R_CHAT, true, false},
    {"/v1/embeddings", "POST", R_EMBEDDINGS, true, false},
    {"/tokenize", "POST", R_TOKENIZE, false, false},
    {"/detokenize", "POST", R_DETOKENIZE, false, false},
    {"/props", "GET", R_PROPS, false, false},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

/* Per request state, from the first callback to MHD's completion notice. */
typedef struct conn_ctx {
    kvl_buf body;
    bool too_large;
    double t_arrival;
} conn_ctx;

/* ---------------------------------------------------------- responses -- */

/* --cors ORIGIN. One server runs per process (it owns the signals), so the
 * functions that build responses read it here rather than taking the server everywhere. */
static const char *cors_origin;

static void add_cors(struct MHD_Response *r) {
    if (!cors_origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", cors_origin);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate");
    if (strcmp(cors_origin, "*") != 0) MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype, char *body,
                                 const char *hdr, const char *hdr_val) {
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (hdr) MHD_add_response_header(r, hdr, hdr_val);
    add_cors(r);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
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

static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *param, const char *msg) {
    api_error e;
    api_fail(&e, status, param, "%s", msg);
    return send_error(c, &e);
}

/* -------------------------------------------------------------- auth --- */

static bool authorized(const srv *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return secret_equal(h, s->cfg.api_key);
}

/* ----------------------------------------------------------- waiting -- */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static bool admitted(const srv_job *j) { return j->state != JOB_QUEUED; }
static bool all_finished(const srv_job *j) { return j->n_finished >= j->n; }
static bool has_output(const srv_job *j) { return j->head || j->n_finished >= j->n; }

static bool job_failed(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    bool f = j->failed;
    pthread_mutex_unlock(&j->mu);
    return f;
}

/* ------------------------------------------------------------ streams -- */

typedef struct stream_ctx {
    srv *s;
    api_req r;
    stream_state st;
    kvl_buf out;
    size_t off;
    int fd;
    bool done;
} stream_ctx;

/* Formats whatever events are queued into sc->out. */
static void stream_fill(stream_ctx *sc) {
    srv_job *j = sc->r.job;
    pthread_mutex_lock(&j->mu);
    bool ended = j->n_finished >= j->n;
    sc->st.failed = j->failed;
    pthread_mutex_unlock(&j->mu);
    srv_event *ev = job_take(j);
    openai_stream_events(sc->s, &sc->r, &sc->st, ev, &sc->out);
    if (sc->st.n_finished >= j->n) {
        sc->done = true;
    } else if (!ev && ended) { /* final events lost to an allocation failure */
        sc->st.failed = true;
        openai_stream_end(sc->s, &sc->r, &sc->st, &sc->out);
        sc->done = true;
    }
    events_free(ev);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *sc = cls;
    (void)pos;
    while (sc->off == sc->out.len) {
        if (sc->done) return MHD_CONTENT_READER_END_OF_STREAM;
        /* A write into a closed connection can still succeed once; asking the
         * socket catches the hang-up before the next token instead. */
        if (peer_closed(sc->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;
        sc->out.len = 0;
        sc->off = 0;
        if (!job_wait(sc->r.job, sc->fd, has_output)) return MHD_CONTENT_READER_END_WITH_ERROR;
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
    if (!sc->done) {
        kvl_log(KVL_LOG_INFO, "client left mid-stream: cancelling %s", sc->r.id);
        job_cancel(sc->r.job);
    }
    atomic_fetch_sub(&sc->s->n_busy, 1);
    api_req_free(&sc->r);
    stream_state_free(&sc->st);
    kvl_buf_free(&sc->out);
    free(sc);
}

static enum MHD_Result start_stream(srv *s, struct MHD_Connection *c, api_req *r, int fd) {
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
        job_cancel(r->job);
        api_req_free(r);
        return fail(c, 500, NULL, "out of memory");
    }
    atomic_fetch_add(&s->n_busy, 1); /* until stream_free */
    sc->s = s;
    sc->r = *r;
    sc->fd = fd;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read,
                                                                  sc, stream_free);
    if (!resp) {
        stream_free(sc);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    add_cors(resp);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp); /* stream_free runs when MHD drops its reference */
    return ret;
}

/* --------------------------------------------------------- generation -- */

static enum MHD_Result finish_blocking(srv *s, struct MHD_Connection *c, api_req *r, int fd) {
    if (!job_wait(r->job, fd, all_finished)) {
        kvl_log(KVL_LOG_INFO, "client left: cancelling %s", r->id);
        job_cancel(r->job);
        api_req_free(r);
        return MHD_NO;
    }
    srv_event *ev = job_take(r->job);
    char *body = job_failed(r->job) ? NULL : openai_response(s, r, ev);
    events_free(ev);
    api_req_free(r);
    if (!body) return fail(c, 500, NULL, "the engine failed while generating this response");
    return send_json(c, MHD_HTTP_OK, body);
}

/* Body -> api_req: UTF-8 check, JSON parse, OpenAI fields. */
static bool parse_request(srv *s, const conn_ctx *cc, bool chat, api_req *r, api_error *err) {
    const char *p = cc->body.p ? cc->body.p : "";
    if (!utf8_valid(p, cc->body.len))
        return api_fail(err, 400, NULL, "the request body is not valid UTF-8 (or contains NUL bytes)");
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithLengthOpts(p, cc->body.len, &end, false);
    if (!body)
        return api_fail(err, 400, NULL, "the request body is not valid JSON (error at byte %zu)",
                        end && end >= p ? (size_t)(end - p) : (size_t)0);
    bool ok = openai_parse(s, body, chat, r, err);
    cJSON_Delete(body);
    return ok;
}

/* Queues the job and waits until the engine thread admitted or rejected it,
 * so that a rejection is still a plain JSON error, not an SSE stream. */
static bool submit(srv *s, api_req *r, int fd, api_error *err, bool *client_left) {
    *client_left = false;
    if (!srv_enqueue(s, r->job, err)) return false;
    if (!job_wait(r->job, fd, admitted)) {
        job_cancel(r->job);
        *client_left = true;
        return false;
    }
    pthread_mutex_lock(&r->job->mu);
    bool rejected = r->job->state == JOB_REJECTED;
    *err = r->job->reject;
    pthread_mutex_unlock(&r->job->mu);
    return !rejected;
}

static enum MHD_Result handle_generate(srv *s, struct MHD_Connection *c, conn_ctx *cc, bool chat) {
    api_req r;
    api_error err;
    if (!parse_request(s, cc, chat, &r, &err)) return send_error(c, &err);
    r.job->t_arrival = cc->t_arrival;
    int fd = conn_fd(c);
    bool client_left;
    atomic_fetch_add(&s->n_busy, 1);
    enum MHD_Result ret;
    if (!submit(s, &r, fd, &err, &client_left)) {
        api_req_free(&r);
        ret = client_left ? MHD_NO : send_error(c, &err);
    } else {
        ret = r.stream ? start_stream(s, c, &r, fd) : finish_blocking(s, c, &r, fd);
    }
    atomic_fetch_sub(&s->n_busy, 1);
    return ret;
}

/* ------------------------------------------------------------ routing -- */

/* A CORS preflight: which methods and headers the browser may use. */
static enum MHD_Result send_preflight(struct MHD_Connection *c, const char *method) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    add_cors(r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", method);
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    return ret;
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

static enum MHD_Result dispatch(srv *s, struct MHD_Connection *c, const char *url, const char *method,
                                conn_ctx *cc) {
    kvl_log(KVL_LOG_INFO, "%s %s (%zu bytes)", method, url, cc->body.len);
    size_t i = 0;
    while (i < N_ROUTES && !route_matches(i, url)) i++;
    if (i == N_ROUTES) {
        api_error e;
        api_fail(&e, 404, NULL, "no route for %.200s", url);
        return send_error(c, &e);
    }
    if (cors_origin && strcmp(method, "OPTIONS") == 0) return send_preflight(c, ROUTES[i].method);
    if (strcmp(method, ROUTES[i].method) != 0) {
        api_error e;
        api_fail(&e, 405, NULL, "%s is not allowed on %s (use %s)", method, url, ROUTES[i].method);
        return send_text(c, 405, "application/json", api_error_json(&e), "Allow", ROUTES[i].method);
    }
    if (ROUTES[i].auth && !authorized(s, c)) {
        api_error e;
        api_fail(&e, 401, NULL, "invalid or missing API key (send 'Authorization: Bearer KEY')");
        e.code = "invalid_api_key";
        return send_error(c, &e);
    }
    if (cc->too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->cfg.max_body_bytes);
        return fail(c, 413, NULL, msg);
    }
    kvl_buf m = {0};
    api_error err;
    const char *body = cc->body.p ? cc->body.p : "";
    switch (ROUTES[i].r) {
    case R_HEALTH: return send_json(c, MHD_HTTP_OK, strdup("{\"status\":\"ok\"}"));
    case R_METRICS:
        metrics_render(&s->metrics, s->cfg.model_id, &m);
        if (m.oom) {
            kvl_buf_free(&m);
            return MHD_NO;
        }
        return send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", m.p, NULL, NULL);
    case R_MODELS: return send_json(c, MHD_HTTP_OK, openai_models(s));
    case R_MODEL: return send_result(c, openai_model_get(s, url + strlen(ROUTES[i].path), &err), &err);
    case R_TOKENIZE: return send_result(c, srv_tokenize(s, body, cc->body.len, &err), &err);
    case R_DETOKENIZE: return send_result(c, srv_detokenize(s, body, cc->body.len, &err), &err);
    case R_EMBEDDINGS: return send_result(c, srv_embeddings(s, body, cc->body.len, &err), &err);
    case R_PROPS: return send_json(c, MHD_HTTP_OK, srv_props(s));
    case R_COMPLETIONS: return handle_generate(s, c, cc, false);
    case R_CHAT: return handle_generate(s, c, cc, true);
    default: return MHD_NO;
    }
}

/* MHD calls this first with *con_cls NULL (headers only), then once per piece
 * of the body, then once more with *upload_size 0 to produce the response. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls) {
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    (void)version;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        cc->t_arrival = kvl_time_s();
        *con_cls = cc;
        return MHD_YES;
    }
    if (*upload_size) {
        /* Past the limit the rest is read and dropped, so the client still gets
         * a clean 413 rather than a reset connection. */
        if (!cc->too_large && cc->body.len + *upload_size > s->cfg.max_body_bytes) {
            cc->too_large = true;
            kvl_buf_free(&cc->body);
        }
        if (!cc->too_large) kvl_buf_put(&cc->body, upload, *upload_size);
        if (cc->body.oom) cc->too_large = true;
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(s, c, url, method, cc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    kvl_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ------------------------------------------------------------ startup -- */

static void setup_chat(srv *s) {
    const tok_vocab *v = s->vocab;
    s->bos_text = tok_bos(v) >= 0 ? tok_piece(v, tok_bos(v)) : "";
    s->eos_text = tok_eos(v) >= 0 ? tok_piece(v, tok_eos(v)) : "";
    if (s->cfg.chat_template) {
        s->chat = chat_family_from_name(s->cfg.chat_template);
    } else if (s->cfg.chat_template_src && s->cfg.chat_template_src[0]) {
        /* the Jinja template itself; the built-in families only if it does not compile */
        char origin[300];
        snprintf(origin, sizeof origin, "%s%s", s->cfg.chat_template_file ? "file " : "model's tokenizer.chat_template",
                 s->cfg.chat_template_file ? s->cfg.chat_template_file : "");
        if (srv_jinja_setup(s, s->cfg.chat_template_src, origin)) {
            s->chat = CHAT_TMPL_FALLBACK; /* unused while s->jinja is set */
            chat_caps_detect(s->cfg.chat_template_src, &s->caps);
            fprintf(stderr, "kvllm serve: tool calls: %s format%s%s\n", tool_format_name(s->caps.format),
                    s->caps.reads_tools ? "" : " (the template does not render tools: they go in the system message)",
                    s->caps.thinks ? "; reasoning: <think>" : "");
            return;
        }
        s->chat = chat_template_detect(s->cfg.chat_template_src);
        if (s->chat == CHAT_TMPL_UNKNOWN) {
            snprintf(s->chat_error, sizeof s->chat_error,
                     "unsupported chat template: the model's tokenizer.chat_template matches none of the known "
                     "families; use /v1/completions or restart with --chat-template NAME");
            kvl_log(KVL_LOG_WARN, "the model's chat template is not recognised: /v1/chat/completions will "
                                  "answer 400 (use --chat-template chatml|llama3|llama2|mistral|gemma|"
                                  "deepseek3|deepseek2)");
            return;
        }
    } else {
        s->chat = CHAT_TMPL_FALLBACK;
        kvl_log(KVL_LOG_WARN, "the model has no tokenizer.chat_template: chat requests use the %s format",
                chat_family_name(s->chat));
        return;
    }
    fprintf(stderr, "kvllm serve: chat template: %s\n", chat_family_name(s->chat));
}

static struct MHD_Daemon *start_daemon(srv *s) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        fprintf(stderr, "kvllm serve: cannot resolve host '%s': %s\n", s->cfg.host, gai_strerror(rc));
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)1024, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) fprintf(stderr, "kvllm serve: cannot listen on %s:%d\n", s->cfg.host, s->cfg.port);
    return d;
}

void server_config_default(server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->model_id = "kvllm";
    c->max_body_bytes = 8u << 20;
    c->max_queue = 1024;
}

static srv *srv_new(engine *e, const tok_vocab *vocab, const server_config *cfg) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    s->e = e;
    s->vocab = vocab;
    const engine_config *ec = engine_cfg(e);
    s->n_ctx = ec->n_ctx;
    s->n_blocks = ec->n_blocks;
    s->block_size = ec->block_size;
    s->max_seqs = ec->max_seqs;
    s->n_embd = model_hp(engine_model(e))->n_embd;
    s->t_start = time(NULL);
    s->omp_threads = omp_get_max_threads();
    atomic_init(&s->n_busy, 0);
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    pthread_cond_init(&s->embed_cv, NULL);
    metrics_init(&s->metrics);
    setup_chat(s);
    return s;
}

static void srv_free(srv *s) {
    srv_jinja_free(s);
    metrics_destroy(&s->metrics);
    pthread_cond_destroy(&s->q_cv);
    pthread_cond_destroy(&s->embed_cv);
    pthread_mutex_destroy(&s->q_mu);
    pthread_mutex_destroy(&s->tok_mu);
    free(s);
}

int server_run(engine *e, const tok_vocab *vocab, const server_config *cfg) {
    srv *s = srv_new(e, vocab, cfg);
    if (!s) return 1;
    cors_origin = cfg->cors_origin;
    /* Signals go to this thread's sigwait only: block them before any thread
     * starts so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (!engine_thread_start(s)) {
        fprintf(stderr, "kvllm serve: cannot start the engine thread\n");
        srv_free(s);
        return 1;
    }
    struct MHD_Daemon *d = start_daemon(s);
    if (!d) {
        engine_thread_stop(s);
        srv_free(s);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "kvllm serve: listening on http://%s:%u (model '%s')\n", cfg->host,
            di ? di->port : (unsigned)cfg->port, cfg->model_id);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvllm serve: signal %d, shutting down\n", sig);
    engine_thread_stop(s); /* running requests end as "abort"; new ones get 503 */
    /* Let connection threads send those last chunks before MHD closes every
     * connection (at most 5 s, for clients that stopped reading). */
    for (int i = 0; i < 500 && atomic_load(&s->n_busy) > 0; i++) usleep(10 * 1000);
    MHD_stop_daemon(d);
    srv_free(s);
    return 0;
}
