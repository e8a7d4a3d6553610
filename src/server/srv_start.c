/* Server startup and shutdown: the chat template, the libmicrohttpd daemon
 * (its request callbacks are in srv_http.c), the server's state, and the
 * drain on SIGINT/SIGTERM. */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "srv_internal.h"

static void setup_chat(srv *s) {
    const tok_vocab *v = s->vocab;
    s->bos_text = tok_bos(v) >= 0 ? tok_piece(v, tok_bos(v)) : "";
    s->eos_text = tok_eos(v) >= 0 ? tok_piece(v, tok_eos(v)) : "";
    if (s->cfg.chat_template) {
        s->chat = chat_family_from_name(s->cfg.chat_template);
    } else if (s->cfg.chat_template_src && s->cfg.chat_template_src[0]) {
        /* the Jinja template itself; the built-in families only if it does not compile */
        char origin[300];
        snprintf(origin, sizeof origin, "%s%s",
                 s->cfg.chat_template_inline ? "--chat-template's text"
                 : s->cfg.chat_template_file ? "file "
                                             : "model's tokenizer.chat_template",
                 s->cfg.chat_template_file ? s->cfg.chat_template_file : "");
        if (srv_jinja_setup(s, s->cfg.chat_template_src, origin)) {
            s->chat = CHAT_TMPL_FALLBACK; /* unused while s->jinja is set */
            chat_caps_detect(s->cfg.chat_template_src, &s->caps);
            fprintf(stderr, "kvllm serve: tool calls: %s format%s%s\n",
                    tool_format_name(s->caps.format),
                    s->caps.reads_tools
                        ? ""
                        : " (the template does not render tools: they go in the system message)",
                    s->caps.thinks ? "; reasoning: <think>" : "");
            return;
        }
        s->chat = chat_template_detect(s->cfg.chat_template_src);
        if (s->chat == CHAT_TMPL_UNKNOWN) {
            snprintf(s->chat_error, sizeof s->chat_error,
                     "unsupported chat template: the model's tokenizer.chat_template matches none "
                     "of the known "
                     "families; use /v1/completions or restart with --chat-template NAME");
            kvl_log(KVL_LOG_WARN,
                    "the model's chat template is not recognised: /v1/chat/completions will "
                    "answer 400 (use --chat-template chatml|llama3|llama2|mistral|gemma|"
                    "deepseek3|deepseek2)");
            return;
        }
    } else {
        s->chat = CHAT_TMPL_FALLBACK;
        kvl_log(KVL_LOG_WARN,
                "the model has no tokenizer.chat_template: chat requests use the %s format",
                chat_family_name(s->chat));
        return;
    }
    fprintf(stderr, "kvllm serve: chat template: %s\n", chat_family_name(s->chat));
}

/* epoll worker threads; connections arrive from the acceptor (srv_conn.c).
 * MHD's own limit sits above ours so that ours, with its 503, is the one met.
 * Its inactivity timeout ends connections whose client stopped reading a
 * response; suspended connections (waiting for the engine) never time out. */
static struct MHD_Daemon *start_daemon(srv *s) {
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG;
    unsigned timeout = s->cfg.request_timeout_s > 120 ? (unsigned)s->cfg.request_timeout_s : 120;
    /* HTTPS: libmicrohttpd's TLS (GnuTLS) on the connections the acceptor hands it */
    struct MHD_OptionItem tls[] = {{MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key},
                                   {MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert},
                                   {MHD_OPTION_END, 0, NULL}};
    if (s->tls_key) flags |= MHD_USE_TLS;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, srv_on_request, s, MHD_OPTION_NOTIFY_COMPLETED, srv_on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, conns_notify, s, MHD_OPTION_CONNECTION_TIMEOUT, timeout,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->cfg.max_connections + 256),
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads, MHD_OPTION_ARRAY,
        s->tls_key ? tls : tls + 2, MHD_OPTION_END);
    if (!d && s->tls_key)
        fprintf(stderr,
                "kvllm serve: cannot start the HTTPS server: the TLS library refused the "
                "key or the certificate (--ssl-key-file %s, --ssl-cert-file %s: PEM, the "
                "key the certificate's; the library's reason above)\n",
                s->cfg.tls_key_file, s->cfg.tls_cert_file);
    else if (!d) fprintf(stderr, "kvllm serve: cannot start the HTTP server\n");
    return d;
}

bool server_config_check(const server_config *c) {
    const char *routes[] = {c->gcp_predict_route, c->gcp_health_route};
    for (int i = 0; i < 2; i++)
        if (routes[i] && ((!i && server_route_taken(routes[i])) || strlen(routes[i]) > 200 ||
                          strpbrk(routes[i], "?# \t\r\n"))) {
            fprintf(stderr, "kvllm serve: %s=%s: %s\n",
                    i ? "AIP_HEALTH_ROUTE" : "AIP_PREDICT_ROUTE", routes[i],
                    strlen(routes[i]) > 200 || strpbrk(routes[i], "?# \t\r\n")
                        ? "not a plain path (at most 200 bytes; no '?', '#' or spaces)"
                        : "one of kvllm's own routes (llama-server refuses it too)");
            return false;
        }
    const char *p = c->api_prefix;
    if (p && *p &&
        (p[0] != '/' || p[strlen(p) - 1] == '/' || strpbrk(p, "?#% \t\r\n") || strstr(p, "//"))) {
        fprintf(stderr,
                "kvllm serve: --api-prefix '%s': a path such as /llm (a leading '/', none "
                "at the end, no '?', '#', '%%' or spaces)\n",
                p);
        return false;
    }
    if (!c->tls_key_file != !c->tls_cert_file) {
        fprintf(stderr,
                "kvllm serve: HTTPS needs both --ssl-key-file and --ssl-cert-file (%s "
                "given alone)\n",
                c->tls_key_file ? "--ssl-key-file" : "--ssl-cert-file");
        return false;
    }
    const char *files[] = {c->api_key_file, c->tls_key_file, c->tls_cert_file};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        if (files[i] && access(files[i], R_OK) != 0) {
            fprintf(stderr, "kvllm serve: %s: cannot read: %s\n", files[i], strerror(errno));
            return false;
        }
    return true;
}

/* --ssl-key-file / --ssl-cert-file, read whole (PEM). */
static bool tls_load(srv *s) {
    const server_config *c = &s->cfg;
    if (!server_config_check(c)) return false;
    if (!c->tls_key_file) return true;
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        fprintf(stderr, "kvllm serve: this libmicrohttpd was built without TLS: no HTTPS (put a "
                        "TLS proxy in front)\n");
        return false;
    }
    kvl_error err = {{0}};
    s->tls_key = kvl_read_file(c->tls_key_file, NULL, &err);
    if (s->tls_key) s->tls_cert = kvl_read_file(c->tls_cert_file, NULL, &err);
    if (!s->tls_cert) {
        fprintf(stderr, "kvllm serve: %s\n", err.msg);
        return false;
    }
    return true;
}

/* 1000+ connections need as many descriptors; the soft limit is often 1024. */
static void raise_fd_limit(int want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= (rlim_t)want) return;
    rl.rlim_cur =
        rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (rlim_t)want ? (rlim_t)want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)want)
        kvl_log(KVL_LOG_WARN,
                "open-files limit %llu is below --max-connections + 64; raise it (ulimit -n)",
                (unsigned long long)rl.rlim_cur);
}

#define SETTING(flag, metavar, field, def, lo, hi, desc, note)                                     \
    {                                                                                              \
        flag, metavar, offsetof(server_config, field),                                             \
            _Generic(((server_config *)0)->field, int                                              \
                     : false, double                                                               \
                     : true),                                                                      \
            def, lo, hi, desc, note                                                                \
    }
const server_setting server_settings[] = {
    SETTING("--port", "N", port, 8080, 0, 65535, "port", "0: any free port, printed at start"),
    SETTING("--max-queue", "N", max_queue, 1024, 0, 1 << 20,
            "waiting requests beyond --max-seqs before 503", NULL),
    SETTING("--max-connections", "N", max_connections, 1024, 1, 1 << 20, "open connections at most",
            "beyond: 503 + Retry-After"),
    SETTING("--max-connections-per-ip", "N", max_connections_per_ip, 256, 0, 1 << 20,
            "from one client address", "0: no limit"),
    SETTING("--request-timeout", "S", request_timeout_s, 30, 1, 86400,
            "seconds to send a whole request, headers and body", NULL),
    SETTING("--shutdown-timeout", "S", shutdown_timeout_s, 30, 0, 86400,
            "on SIGTERM, seconds running requests may finish", NULL),
    SETTING("--http-threads", "N", http_threads, 4, 1, 256, "HTTP worker threads", NULL),
    SETTING("--responses-store", "N", responses_store, 1024, 0, 1 << 20,
            "/v1/responses answers kept in memory for previous_response_id and GET",
            "the oldest dropped first; 0: none kept"),
};
#undef SETTING
const int server_n_settings = sizeof server_settings / sizeof server_settings[0];

void server_setting_set(server_config *c, const server_setting *st, int64_t v) {
    char *at = (char *)c + st->offset;
    if (st->is_double) *(double *)at = (double)v;
    else *(int *)at = (int)v;
}

/* Every field neither named nor in server_settings is zero or NULL (no key,
 * no CORS, no pipeline ranks). */
void server_config_default(server_config *c) {
    *c = (server_config){.host = "127.0.0.1",
                         .model_id = "kvllm",
                         .max_body_bytes = 8u << 20,
                         .reasoning_budget = -1};
    for (int i = 0; i < server_n_settings; i++)
        server_setting_set(c, &server_settings[i], server_settings[i].def);
}

static srv *srv_new(engine *e, const tok_vocab *vocab, const server_config *cfg) {
    srv *s = calloc(1, sizeof *s);
    if (s && !(s->streams = rstreams_new())) {
        free(s);
        s = NULL;
    }
    if (!s) return NULL;
    s->cfg = *cfg;
    s->e = e;
    s->priority_sched = engine_cfg(e)->scheduling == ENGINE_SCHED_PRIORITY;
    s->vocab = vocab;
    s->listen_fd = -1;
    const engine_config *ec = engine_cfg(e);
    s->n_ctx = ec->n_ctx;
    s->n_blocks = ec->n_blocks;
    s->block_size = ec->block_size;
    s->max_seqs = ec->max_seqs;
    s->n_embd = model_hp(engine_model(e))->n_embd;
    s->t_start = time(NULL);
    atomic_init(&s->n_busy, 0);
    atomic_init(&s->draining, false);
    atomic_init(&s->acceptor_stop, false);
    atomic_init(&s->n_refused, 0);
    atomic_init(&s->n_timed_out, 0);
    atomic_init(&s->n_evicted, 0);
    atomic_init(&s->n_client_gone, 0);
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    pthread_cond_init(&s->task_cv, NULL);
    pthread_mutex_init(&s->conns_mu, NULL);
    metrics_init(&s->metrics);
    metrics_set_kv_ranks(&s->metrics, cfg, e);
    setup_chat(s);
    /* checked by the front end: an object */
    if (cfg->chat_template_kwargs) s->default_kwargs = cJSON_Parse(cfg->chat_template_kwargs);
    s->responses = rstore_new(cfg->responses_store); /* NULL when 0: refused as unkept */
    srv_lora_init(s);
    return s;
}

static void srv_free(srv *s) {
    free(s->tls_key);
    free(s->tls_cert);
    cJSON_Delete(s->default_kwargs);
    rstore_free(s->responses);
    rstreams_free(s);
    srv_lora_free(s);
    srv_jinja_free(s);
    keys_free(s);
    slots_free(s);
    metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->conns_mu);
    pthread_cond_destroy(&s->q_cv);
    pthread_cond_destroy(&s->task_cv);
    pthread_mutex_destroy(&s->q_mu);
    pthread_mutex_destroy(&s->tok_mu);
    free(s);
}

static bool idle(srv *s) {
    pthread_mutex_lock(&s->q_mu);
    bool none = s->n_inflight == 0;
    pthread_mutex_unlock(&s->q_mu);
    return none && atomic_load(&s->n_busy) == 0;
}

/* SIGTERM/SIGINT: stop admitting (new connections and requests get 503),
 * let what runs finish for up to shutdown_timeout_s, cancel the rest (their
 * clients get finish_reason "abort"), give the last chunks a moment to go out,
 * then close. A second signal skips the wait. */
static void drain(srv *s, sigset_t *sigs) {
    atomic_store(&s->draining, true);
    double t0 = kvl_time_s();
    struct timespec tick = {0, 20 * 1000 * 1000};
    bool again = false;
    while (!idle(s) && kvl_time_s() - t0 < s->cfg.shutdown_timeout_s) {
        if (sigtimedwait(sigs, NULL, &tick) > 0) {
            again = true;
            break;
        }
    }
    bool finished = idle(s);
    fprintf(stderr, "kvllm serve: %s after %.1f s%s\n", finished ? "drained" : "shutdown timeout",
            kvl_time_s() - t0,
            finished ? ""
            : again  ? " (second signal): cancelling the rest"
                     : ": cancelling the rest");
    engine_thread_stop(s); /* cancels what still runs; every job gets its final event */
    /* Those final events still have to reach their clients (at most 5 s, for
     * clients that stopped reading). */
    for (int i = 0; i < 500 && atomic_load(&s->n_busy) > 0; i++) usleep(10 * 1000);
}

int server_run(engine *e, const tok_vocab *vocab, const server_config *cfg) {
    srv *s = srv_new(e, vocab, cfg);
    if (!s) return 1;
    srv_cors_origin = cfg->cors_origin;
    if (!keys_load(s) || !tls_load(s)) {
        srv_free(s);
        return 1;
    }
    raise_fd_limit(s->cfg.max_connections + 64 + 64);
    /* Signals go to this thread's sigwait only: block them before any thread
     * starts so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (!conns_listen(s)) {
        srv_free(s);
        return 1;
    }
    if (!engine_thread_start(s)) {
        fprintf(stderr, "kvllm serve: cannot start the engine thread\n");
        close(s->listen_fd);
        srv_free(s);
        return 1;
    }
    s->daemon = start_daemon(s);
    if (!s->daemon || !conns_start(s) || !rstreams_start(s)) {
        if (s->daemon) MHD_stop_daemon(s->daemon);
        engine_thread_stop(s);
        close(s->listen_fd);
        srv_free(s);
        return 1;
    }
    fprintf(stderr, "kvllm serve: listening on %s://%s:%d%s (model '%s'%s)\n",
            s->tls_key ? "https" : "http", cfg->host, s->bound_port,
            cfg->api_prefix ? cfg->api_prefix : "", cfg->model_id,
            s->n_keys ? ", API keys required" : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvllm serve: signal %d, draining (at most %.0f s)\n", sig,
            s->cfg.shutdown_timeout_s);
    drain(s, &sigs);
    conns_stop(s);
    rstreams_close(s); /* no reader may stay suspended past this */
    MHD_stop_daemon(s->daemon);
    srv_free(s);
    return 0;
}
