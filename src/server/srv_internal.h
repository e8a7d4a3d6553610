/* Server internals shared by the files in src/server (not a public API).
 *
 * Ownership: a job (one HTTP request, n engine requests) is reference counted.
 * The HTTP thread that created it holds one reference; the engine thread holds
 * one from admission until every engine request it submitted has sent its final
 * event. Fields are grouped by who may touch them. */
#ifndef KVLLM_SRV_INTERNAL_H
#define KVLLM_SRV_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <cjson/cJSON.h>

#include "server.h"
#include "chat_template.h"
#include "kvl_buf.h"

#define SRV_MAX_N 16   /* choices per request */
#define SRV_MAX_TOP 20 /* top logprobs per token (the engine's limit) */
#define SRV_MAX_STOP ENGINE_MAX_STOP /* and ENGINE_MAX_STOP_BYTES each */

/* ------------------------------------------------------------ helpers -- */

/* true if p[0..n) is valid UTF-8 (no overlongs, surrogates or NUL bytes). */
bool utf8_valid(const char *p, size_t n);
/* A cJSON string of p[0..n) with invalid bytes and NULs replaced by U+FFFD. */
cJSON *json_text(const char *p, size_t n);
/* Compares in time independent of where the strings differ. */
bool secret_equal(const char *a, const char *b);

/* ------------------------------------------------------------- errors -- */

typedef struct api_error {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", ... */
    const char *code;    /* NULL or a code string */
    char param[64];      /* "" for none */
    char msg[512];
} api_error;
bool api_fail(api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* {"error":{"message","type","param","code"}} as a malloc'd string. */
char *api_error_json(const api_error *e);

/* -------------------------------------------------------------- jobs -- */

typedef struct srv srv;
typedef struct srv_job srv_job;

typedef struct srv_event {
    struct srv_event *next;
    int index;               /* choice */
    int32_t token;           /* -1: no token (text-only or final) */
    float logprob;
    int n_top;
    int32_t top_ids[SRV_MAX_TOP];
    float top_lps[SRV_MAX_TOP];
    engine_finish finish;
    engine_req_stats stats;  /* valid when finish != NONE */
    size_t text_len;
    char text[];
} srv_event;

typedef enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_REJECTED } job_state;

typedef struct srv_choice {
    srv_job *job;
    int index;
    int64_t engine_id;  /* -1 until submitted */
    bool done;
    double t_first, t_last; /* of its first / latest token (metrics) */
} srv_choice;

struct srv_job {
    srv *s;
    /* Set by the HTTP thread before the job is queued; read-only afterwards. */
    int32_t *prompt;
    int64_t n_prompt;
    int64_t max_tokens;
    sampler_params sampling;
    bool vary_seed;      /* n > 1 with sampling: choice i uses seed + i */
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int top_logprobs;
    bool logprobs;
    bool ignore_eos;
    char *cache_salt;
    int n;
    double t_arrival;
    /* Engine thread only. */
    srv_choice choices[SRV_MAX_N];
    int n_live;          /* submitted, final event not yet seen */
    bool cancel_sent;
    bool released;       /* no longer counted in srv.n_inflight */
    srv_job *next;       /* in the submission queue, then the active list */
    /* Shared: under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_state state;
    api_error reject;    /* when state == JOB_REJECTED */
    bool failed;         /* the engine failed while running it */
    srv_event *head, *tail;
    int n_finished;
    int refs;
    /* HTTP thread -> engine thread, read without the lock. */
    atomic_bool cancelled;
};

srv_job *job_new(srv *s);
void job_release(srv_job *j); /* drops one reference; frees at zero */
/* Engine thread: appends an event and wakes the HTTP thread. */
void job_push(srv_job *j, srv_event *ev);
/* HTTP thread: asks the engine thread to cancel the job (idempotent). */
void job_cancel(srv_job *j);
/* HTTP thread: waits until pred(j) holds (called under j->mu), checking every
 * 100 ms whether the client at fd hung up. Returns false on hang-up. */
bool job_wait(srv_job *j, int fd, bool (*pred)(const srv_job *j));
/* HTTP thread: takes all queued events (caller frees the list with events_free). */
srv_event *job_take(srv_job *j);
void events_free(srv_event *ev);
bool peer_closed(int fd);

/* ------------------------------------------------------------ metrics -- */

#define HISTO_MAX_BUCKETS 24
typedef struct histo {
    const char *name, *help;
    const double *bounds;
    int n_bounds;
    uint64_t counts[HISTO_MAX_BUCKETS]; /* per bucket, not cumulative; [n_bounds] = +Inf */
    double sum;
    uint64_t count;
} histo;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    engine_metrics em;  /* published by the engine thread after each step */
    histo ttft, tpot, itl, e2e;
    uint64_t success[3]; /* finished requests: stop, length, abort */
} srv_metrics;

void metrics_init(srv_metrics *m);
void metrics_destroy(srv_metrics *m);
void histo_observe(histo *h, double v); /* caller holds m->mu */
/* Prometheus text exposition (format 0.0.4). */
void metrics_render(srv_metrics *m, const char *model_name, kvl_buf *out);

/* ------------------------------------------------------------- server -- */

struct srv {
    server_config cfg;
    engine *e;
    const tok_vocab *vocab;
    /* Engine facts read by HTTP threads (immutable while serving). */
    int64_t n_ctx, n_blocks, block_size;
    int max_seqs;
    int omp_threads;           /* the main thread's OpenMP team size (-t) */
    chat_family chat;          /* CHAT_TMPL_UNKNOWN: chat requests get 400 */
    struct jinja_template *jinja; /* the Jinja chat template; NULL: the family's built-in rendering */
    char chat_error[256];
    const char *bos_text, *eos_text;
    pthread_mutex_t tok_mu;    /* the tokenizer is not documented as thread-safe */
    /* Submission queue: HTTP threads -> engine thread. */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    srv_job *q_head, *q_tail;
    int64_t n_inflight;        /* engine requests queued or active */
    bool cancel_pending;
    bool stopping;
    /* Generation responses not yet fully sent (shutdown waits for them). */
    atomic_int n_busy;
    /* Engine thread only. */
    srv_job *active;
    pthread_t engine_thread;
    srv_metrics metrics;
};

/* Engine thread (srv_engine.c). */
bool engine_thread_start(srv *s);
void engine_thread_stop(srv *s);
/* HTTP thread: queues j (taking a reference for the engine thread), or fills
 * err (503, queue full or shutting down) and returns false. */
bool srv_enqueue(srv *s, srv_job *j, api_error *err);

/* ------------------------------------------------------------- OpenAI -- */

typedef struct api_req {
    bool chat;
    bool stream, include_usage;
    bool logprobs;       /* return logprobs */
    bool tokens_as_ids;  /* "token_id:N" instead of token text (vLLM extension) */
    char id[40];
    long created;
    srv_job *job;
} api_req;

/* Parses a request body (a cJSON object) into r and a new job (r->job). */
bool openai_parse(srv *s, const cJSON *body, bool chat, api_req *r, api_error *err);

/* srv_chat_jinja.c: the Jinja chat template. setup compiles src (origin names
 * it in messages) and returns false, with a warning, if it does not compile;
 * render returns the prompt of a chat request (malloc'd, *len bytes) or NULL
 * with err set (400 when the template refuses or fails on the conversation). */
bool srv_jinja_setup(srv *s, const char *src, const char *origin);
void srv_jinja_free(srv *s);
char *srv_jinja_render(srv *s, const cJSON *body, bool add_gen, size_t *len, api_error *err);

/* srv_guard.c: client strings in a chat prompt never become control tokens.
 * srv_guard_string marks what could (malloc'd, NUL-terminated, *out_len set;
 * NULL when out of memory); srv_guard_json does it in place to every string
 * and key under node (and its siblings); srv_unguard strips the marks from a
 * rendered text in place and returns the ranges they enclosed (malloc'd), for
 * tok_encode_guarded. */
char *srv_guard_string(const tok_vocab *v, const char *s, size_t n, size_t *out_len);
bool srv_guard_json(const tok_vocab *v, cJSON *node);
bool srv_unguard(char *text, size_t *len, tok_span **spans, size_t *n_spans);
void api_req_free(api_req *r);

/* Non-streaming response from all of a finished job's events. */
char *openai_response(srv *s, const api_req *r, srv_event *events);
/* Appends the SSE chunks for events to out; when all choices are finished,
 * also the usage chunk (if asked) and "data: [DONE]". */
typedef struct stream_state {
    bool started[SRV_MAX_N];   /* chat: the role delta was sent */
    size_t text_off[SRV_MAX_N];
    int n_finished;
    int64_t completion_tokens, kv_lb, kv_alloc, cached;
    bool failed;
} stream_state;
void openai_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events, kvl_buf *out);
/* Ends a stream early: an error chunk if st->failed, the usage chunk, [DONE]. */
void openai_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out);

/* GET /v1/models */
char *openai_models(srv *s);

#endif
