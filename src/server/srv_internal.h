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
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "server.h"
#include "chat_template.h"
#include "jinja.h"
#include "kvl_buf.h"
#include "pp.h"
#include "srv_tools.h"

#define SRV_MAX_N    16              /* choices per request */
#define SRV_MAX_TOP  20              /* top logprobs per token (the engine's limit) */
#define SRV_MAX_STOP ENGINE_MAX_STOP /* and ENGINE_MAX_STOP_BYTES each */

/* ------------------------------------------------------------ helpers -- */

/* true if p[0..n) is valid UTF-8 (no overlongs, surrogates or NUL bytes). */
bool utf8_valid(const char *p, size_t n);
/* A cJSON string of p[0..n) with invalid bytes and NULs replaced by U+FFFD. */
cJSON *json_text(const char *p, size_t n);
/* ids' bytes appended to out, control tokens as their text (a prompt echoed
 * or shown as llama-server shows it); out->oom on failure. */
typedef struct srv srv;
void srv_ids_text(srv *s, const int32_t *ids, int64_t n, kvl_buf *out);
/* Compares in time independent of where the strings differ. */
bool secret_equal(const char *a, const char *b);

/* ------------------------------------------------------------- errors -- */

typedef struct api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", ... */
    const char *code; /* NULL or a code string */
    char param[64];   /* "" for none */
    char msg[512];
} api_error;
bool api_fail(api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The field names of an error as another API names them: the param (or its
 * prefix up to a '.') and each quoted name in the message ('name' or
 * 'name.) of map[i][0] become map[i][1]; map longest first. For the
 * endpoints that translate their requests into chat requests. */
void api_error_rename(api_error *err, const char *const (*map)[2], size_t n_map);
/* A chat request's pieces, for the endpoints that build one: a tools[] entry
 * {"type": "function", "function": fn} (taking fn), and a tool_choice naming
 * one function. */
cJSON *chat_function_tool(cJSON *fn);
void chat_tool_choice_named(cJSON *chat, const char *name);
/* The first member of o whose name is not in allowed (NULL-terminated), or
 * NULL when there is none. */
const char *json_unknown_key(const cJSON *o, const char *const *allowed);
/* {"error":{"message","type","param","code"}} as a malloc'd string. */
char *api_error_json(const api_error *e);

/* Request fields, with JSON null treated as absent (the SDKs send nulls):
 * req_field returns the value or NULL; the others check an optional field's
 * type and range, set *out only when it is present, and fail with a 400
 * naming it (srv_util.c). */
const cJSON *req_field(const cJSON *o, const char *k);
bool req_number(const cJSON *o, const char *k, double lo, double hi, double *out, api_error *err);
bool req_float(const cJSON *o, const char *k, double lo, double hi, float *out, api_error *err);
bool req_int(const cJSON *o, const char *k, int64_t lo, int64_t hi, int64_t *out, api_error *err);
bool req_bool(const cJSON *o, const char *k, bool *out, api_error *err);
bool req_string(const cJSON *o, const char *k, const char **out, api_error *err);

/* How a text's special-token texts are read: never (a completion's prompt by
 * default), always (a completion with "parse_special": true, llama.cpp's
 * way), or everywhere but the guarded ranges (a rendered chat prompt: only the
 * template's markup, srv_guard.c). */
typedef struct tok_mode {
    bool parse_special;
    const tok_span *guard;
    size_t n_guard;
} tok_mode;
typedef struct rstore rstore; /* kept /v1/responses answers (srv_rstore.c) */
/* Text -> ids (malloc'd, *n of them) under the tokenizer lock, or NULL with
 * err set (400 naming param when the tokenizer refuses the text). */
int32_t *srv_encode(srv *s, const char *text, size_t len, bool add_bos, tok_mode mode, int64_t *n,
                    const char *param, api_error *err);
/* The same with llama.cpp's add_special: BOS and EOS where the vocabulary adds
 * them (tokenizer.ggml.add_bos_token / add_eos_token), as llama-server
 * tokenizes /completion prompts, embedding inputs and /tokenize. */
int32_t *srv_encode_special(srv *s, const char *text, size_t len, bool add_special, tok_mode mode,
                            int64_t *n, const char *param, api_error *err);

/* -------------------------------------------------------------- jobs -- */

typedef struct srv_job srv_job;
/* Adds a logit bias for token to j; false with a 400 naming param for an id
 * outside the vocabulary or a NaN / +infinity bias. -INFINITY bans the token.
 * job_logit_bias_finish, once all are added, sorts them and adds up the
 * biases of a token given twice (one per token, as the engine takes them;
 * O(n log n), as a body can hold a million entries). */
bool job_add_logit_bias(srv *s, srv_job *j, int64_t token, double bias, const char *param,
                        api_error *err);
void job_logit_bias_finish(srv_job *j);

typedef struct srv_event {
    struct srv_event *next;
    int index;     /* choice */
    int slot;      /* the slot its request runs on (srv_slot), -1: none */
    int32_t token; /* -1: no token (text-only or final) */
    float logprob;
    int n_top;
    int32_t top_ids[SRV_MAX_TOP];
    float top_lps[SRV_MAX_TOP];
    engine_finish finish;
    engine_req_stats stats; /* as they stand (t_end: when finish != NONE) */
    bool progress;          /* a prompt progress event: n_past of the prompt in the cache */
    int64_t n_past;
    size_t text_len;
    char text[];
} srv_event;

typedef enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_REJECTED } job_state;

typedef struct srv_choice {
    srv_job *job;
    int index;
    int64_t engine_id; /* -1 until submitted */
    bool done;
    double t_first, t_last; /* of its first / latest token (metrics) */
    /* Engine thread: the slot it runs on (-1: none was idle yet) and the ids
     * it generated so far, which become that slot's (srv_slot) when it ends. */
    int slot;
    int32_t *gen;
    int64_t n_gen;
    size_t cap_gen;
} srv_choice;

struct srv_job {
    srv *s;
    /* Set by the HTTP thread before the job is queued; read-only afterwards. */
    int32_t *prompt;
    int64_t n_prompt;
    char *prompt_text; /* chat: the rendered prompt, as tokenized (NULL for completions) */
    /* /v1/completions with several prompts (vLLM's batch): prompt k of n_prompts
     * (prompt 0 is prompt / n_prompt); choices are prompt-major, choice c of
     * prompt c / per_prompt (job_prompt) */
    int n_prompts;  /* 1 unless several */
    int per_prompt; /* choices per prompt: the request's n */
    int32_t *prompts[SRV_MAX_N];
    int64_t prompt_lens[SRV_MAX_N];
    int64_t max_tokens;
    int id_slot; /* /completion's id_slot: the slot wanted (-1: any idle; srv_slots.c) */
    sampler_params sampling;
    bool vary_seed; /* n > 1 with sampling: choice i uses seed + i */
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int top_logprobs;
    bool logprobs;
    bool ignore_eos;
    bool eog_text; /* --special: the end-of-generation token's text ends the output */
    engine_logit_bias *logit_bias; /* n_logit_bias of them (malloc'd; one per token) */
    int n_logit_bias;
    size_t cap_logit_bias;
    bool penalize_prompt;     /* the penalty window starts with the prompt (llama-server's) */
    bool post_sampling_probs; /* engine_request's (llama-server's /completion) */
    int n_indent;             /* llama-server's code-completion stops (engine_request) */
    double max_predict_s;
    bool no_speculative; /* "speculative": false */
    /* llama-server's stream extras (llama.cpp's web UI sends both): prompt
     * progress chunks (return_progress, engine_request.progress) and a
     * "timings" object in every chunk (timings_per_token) */
    bool return_progress, timings_per_token;
    /* the thinking budget (thinking_budget_tokens, engine_request.budget): its
     * tags' ids one after another (start, end, forced = message + end) */
    int32_t budget_tokens;  /* -1: none */
    bool reasoning_control; /* reasoning_control: the budget armed for POST .../control */
    char cmpl_id[40];       /* the completion's id (chatcmpl-...), what .../control names */
    int32_t *budget_ids;    /* malloc'd */
    int n_budget_start, n_budget_end, n_budget_forced;
    bool budget_inside;
    /* vLLM's sampling extras (engine_request): stop_token_ids, min_tokens,
     * include_stop_str_in_output, allowed_token_ids, skip_special_tokens false */
    int32_t *stop_ids; /* malloc'd */
    int n_stop_ids;
    int64_t min_tokens;
    bool include_stop;
    int32_t *allowed; /* malloc'd */
    int n_allowed;
    bool keep_all_special;
    int32_t *bad_ids, *bad_lens; /* bad_words as token sequences (malloc'd; engine_request) */
    int n_bad;
    char *cache_salt;
    const char *model_name;     /* the "model" answers name: the served model's or an adapter's
                                   (--lora-modules; static strings of the config), NULL: the served */
    float lora[MODEL_MAX_LORA]; /* the adapters' scales (srv_lora_job) */
    int n_lora;                 /* how many (0: the model has none) */
    int priority; /* engine_request.priority (0 unless --scheduling-policy priority) */
    grammar
        *grammar; /* structured output or a required tool call (NULL: none); freed with the job */
    int n;
    double t_arrival;
    /* Chat output beyond plain text (srv_tools.h). */
    tool_spec tools;       /* the request's tools */
    tool_format parse_fmt; /* how tool calls are parsed out of the output; NONE: not at all */
    bool think,
        in_think; /* split reasoning (caps.think_open/close); the prompt opened a think block */
    const char *think_open, *think_close;          /* the template's think tags (static strings) */
    int32_t keep_special[ENGINE_MAX_KEEP_SPECIAL]; /* control tokens printed (call markers) */
    int n_keep_special;
    /* Engine thread only. */
    srv_choice choices[SRV_MAX_N];
    int n_live; /* submitted, final event not yet seen */
    bool cancel_sent;
    bool released; /* no longer counted in srv.n_inflight */
    srv_job *next; /* in the submission queue, then the active list */
    /* Shared: under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_state state;
    api_error reject; /* when state == JOB_REJECTED */
    bool failed;      /* the engine failed while running it */
    api_error fail;   /* when failed: the answer (status 0: a 500 for an engine failure) */
    srv_event *head, *tail;
    int n_finished;
    int refs;
    /* The client's connection: fd is polled by the engine thread before each
     * step (-1 once the connection is gone); conn is resumed by whoever wakes
     * the job while suspended is set. */
    int fd;
    struct MHD_Connection *conn;
    bool suspended;
    bool pumped; /* its events wake the resumable streams' pump (srv_streams.c) */
    /* HTTP thread -> engine thread, read without the lock. */
    atomic_bool cancelled;
};

srv_job *job_new(srv *s);
/* Prompt k of j (0 .. n_prompts - 1) and its length; the prompt tokens of all. */
static inline const int32_t *job_prompt(const srv_job *j, int k, int64_t *n) {
    *n = k ? j->prompt_lens[k] : j->n_prompt;
    return k ? j->prompts[k] : j->prompt;
}
int64_t job_prompt_tokens(const srv_job *j);
void job_release(srv_job *j); /* drops one reference; frees at zero */
/* Engine thread: appends an event and wakes the HTTP thread. */
void job_push(srv_job *j, srv_event *ev);
/* HTTP thread: asks the engine thread to cancel the job (idempotent); the
 * first cancellation because its client left counts in client_disconnects
 * (the engine thread's own poll, watch_clients, counts those it finds first). */
void job_cancel(srv_job *j, bool client_left);
/* HTTP thread, inside a libmicrohttpd callback for connection c: true if
 * pred(j) holds (called under j->mu); otherwise suspends c until the engine
 * thread next wakes the job (job_wake) and returns false. */
bool job_ready_or_suspend(srv_job *j, struct MHD_Connection *c, bool (*pred)(const srv_job *j));
/* Under j->mu: wakes waiters; returns the connection to resume (NULL: none),
 * which the caller passes to job_resume after unlocking. */
struct MHD_Connection *job_wake_locked(srv_job *j);
void job_resume(struct MHD_Connection *c);
/* HTTP thread: the connection is gone; the engine thread stops polling fd. */
void job_detach(srv_job *j);
/* HTTP thread: takes all queued events (caller frees the list with events_free). */
srv_event *job_take(srv_job *j);
void events_free(srv_event *ev);
bool peer_closed(int fd);

/* --------------------------------------------------------------- JSON -- */

/* A request body as JSON: valid UTF-8, no NUL (raw or escaped: C strings
 * would silently cut there), one value and nothing after it but whitespace.
 * Top-level number members keep their source text in valuestring (exact
 * 64-bit integers, e.g. "seed"). NULL with err (400) otherwise. */
cJSON *json_parse_body(const char *p, size_t n, api_error *err);

/* A server-sent-events response whose body read produces (srv_streams.c):
 * the event-stream headers set (the caller adds CORS); NULL (cls dropped)
 * when out of memory. */
struct MHD_Response *srv_sse_response(MHD_ContentReaderCallback read, void *cls,
                                      MHD_ContentReaderFreeCallback drop);

/* -------------------------------------------------- resumable streams -- */

/* llama-server's resumable streams (srv_streams.c): a streamed answer whose
 * request names a conversation (X-Conversation-Id) is produced by the pump
 * thread into a session that outlives the connection; readers send from it. */
typedef struct rstreams rstreams;
typedef struct rstream rstream;
/* Appends to out whatever the producer has ready; true once its stream ended. */
typedef bool (*rstream_produce_fn)(void *ctx, kvl_buf *out);
rstreams *rstreams_new(void);
bool rstreams_start(srv *s); /* the pump thread */
void rstreams_kick(srv *s);  /* a pumped job has events (under the job's mu: a leaf lock) */
void rstreams_close(srv *s); /* ends every session: its readers end (before the daemon stops) */
void rstreams_free(srv *s);  /* joins the pump; frees the sessions */
bool rstream_id_ok(const char *id, api_error *err);
/* Conversation id of tenant: a new session produced from j's events by
 * produce (drop frees ctx once the stream ended), replacing and cancelling
 * the conversation's previous one. A reference for the caller; NULL with err
 * (503: every session still running). */
rstream *rstream_open(srv *s, const char *tenant, const char *id, srv_job *j, void *ctx,
                      rstream_produce_fn produce, void (*drop)(void *ctx), api_error *err);
void rstream_release(srv *s, rstream *st);
/* A text/event-stream response sending st's bytes from offset from on (it
 * takes its own reference; the caller adds CORS); NULL when out of memory. */
struct MHD_Response *rstream_response(srv *s, rstream *st, struct MHD_Connection *c, size_t from);
/* GET /v1/stream/ID?from=N: the session (a reference) and the offset; NULL
 * with err (404 unknown or expired, 400 a bad or dropped offset). */
rstream *rstream_get(srv *s, const char *tenant, const char *id, const char *from, size_t *off,
                     api_error *err);
void rstream_delete(srv *s, const char *tenant, const char *id); /* DELETE: cancels; idempotent */
char *rstreams_lookup(srv *s, const char *tenant, const char *body, size_t len, api_error *err);

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
    engine_metrics em; /* published by the engine thread after each step */
    histo ttft, tpot, itl, e2e;
    histo queue, prefill, decode; /* request phases: waiting, until the first token, after it */
    uint64_t success[3];          /* finished requests: stop, length, abort */
    /* llama-server's series (llamacpp:*): finished requests' computed prompt
     * tokens and their time until the first token, generated tokens and their
     * time after it; totals, and the same since the last /metrics (its
     * throughput gauges' bucket, reset by each read as llama-server does) */
    uint64_t llama_prompt_tokens, llama_gen_tokens, bucket_prompt_tokens, bucket_gen_tokens;
    double llama_prompt_s, llama_gen_s, bucket_prompt_s, bucket_gen_s;
    /* each rank's bytes per KV block of each group (one process: rank 0's are
     * the engine's); fixed from the start */
    int kv_ranks, kv_groups;
    int64_t kv_rank_bytes[PP_MAX_RANKS][MODEL_MAX_KV_GROUPS];
} srv_metrics;

void metrics_init(srv_metrics *m);
/* The KV bytes per block of each rank: cfg's (--pp), else the engine's pools. */
void metrics_set_kv_ranks(srv_metrics *m, const server_config *cfg, engine *e);
void metrics_destroy(srv_metrics *m);
void histo_observe(histo *h, double v); /* caller holds m->mu */
/* Prometheus text exposition (format 0.0.4). */
void metrics_render(srv_metrics *m, const char *model_name, kvl_buf *out);
void metrics_render_conns(kvl_buf *o, const char *model_name, int open, long refused, long timeouts,
                          long evicted, long disconnects);
/* Memory: what the process may still take (kvl_mem_status), its resident set,
 * and the model's weights repacked (anonymous) or read through the mapping. */
void metrics_render_memory(kvl_buf *o, const char *model_name, const model *mdl);
/* The rendered metrics with every "kvllm:" name under "PREFIX:" instead
 * (--metrics-prefix vllm: vLLM's dashboards read kvllm's vLLM-named series). */
void metrics_prefix(const kvl_buf *in, const char *prefix, kvl_buf *out);

/* ----------------------------------------------------------- tenants -- */

/* An API key and the prefix-cache namespace of its tenant. */
/* One of llama-server's slots as its slot actions see it (POST
 * /slots/{id}?action=save|restore|erase): kvllm runs requests on the engine's
 * sequences, and numbers them into max_seqs slots only for these actions, a
 * request taking the first idle slot. A slot holds what its last request put
 * in the KV cache. Engine thread only. */
typedef struct srv_slot {
    int64_t holder;  /* the engine id of the request running on it, -1: idle */
    int32_t *tokens; /* its last request's prompt and generated ids (or a restored file's) */
    int64_t n_tokens;
    char *salt;    /* that request's cache salt (tenant namespace first), NULL: none */
    bool has_lora; /* its adapters' scales are in lora (else the defaults) */
    float lora[MODEL_MAX_LORA];
    bool restored;       /* tokens came from a slot file: chain_root, not salt, names its chain */
    uint64_t chain_root; /* restored only */
} srv_slot;

typedef struct srv_key {
    char *key;
    char *tenant; /* the file's name for it, or NULL */
    char ns[17];  /* hex of a hash of the tenant (or of the key): the salt prefix */
} srv_key;

/* Loads --api-key and --api-key-file into s->keys; false with a message. */
bool keys_load(srv *s);
void keys_free(srv *s);
/* The key an Authorization header names (NULL: none matches). */
const srv_key *keys_match(const srv *s, const char *authorization);
/* The key itself (an x-api-key header, as the Anthropic SDKs send it). */
const srv_key *keys_match_key(const srv *s, const char *key);
/* The cache salt for a tenant's request: "ns:salt" (or ns alone), or a copy
 * of salt when tenants share the cache (k NULL). NULL on no memory. */
char *tenant_salt(const srv *s, const srv_key *k, const char *salt, bool *oom);

/* ------------------------------------------------------ connections -- */

typedef struct conn_rec conn_rec;
bool conns_listen(srv *s);
bool conns_start(srv *s);
void conns_stop(srv *s);
int conns_open(srv *s);
void conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                  enum MHD_ConnectionNotificationCode code);
/* The request on c was fully received / its response was sent. */
void conns_request_received(srv *s, struct MHD_Connection *c);
void conns_response_done(srv *s, struct MHD_Connection *c);

/* ------------------------------------------------------------------ HTTP -- */

/* --cors ORIGIN (NULL: no CORS), set by server_run (srv_start.c); read by
 * the functions that build responses (srv_http.c). */
extern const char *srv_cors_origin;
/* libmicrohttpd's request callbacks (srv_http.c), given to the daemon by
 * server_run (srv_start.c). */
enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls);
void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe);

/* ------------------------------------------------- engine-thread work -- */

/* Work an HTTP thread hands to the engine thread, the only one that drives the
 * engine: embeddings, /v1/kv/save, KV view snapshots. The HTTP thread owns the
 * task (on its stack, as the first member of its own struct) and waits; the
 * engine thread runs every queued task between two steps, also while stopping. */
typedef struct srv_engine_task {
    bool (*run)(srv *s, struct srv_engine_task *t, api_error *err); /* on the engine thread */
    /* run sets it to be run again after the next step instead of finishing
     * (a slot action waiting for its slot's request); a stopping server
     * fails it with 503 instead */
    bool defer;
    bool done, ok;
    api_error err; /* when !ok */
    struct srv_engine_task *next;
} srv_engine_task;

/* Queues t and waits until the engine thread has run it. False with err
 * filled when it failed, or when the server is shutting down (it did not run). */
bool srv_engine_call(srv *s, srv_engine_task *t, api_error *err);

/* One rerank request (srv_rerank.c): rerank_parse reads the body b (which
 * must outlive it: docs points into it) into one prompt a document, the
 * engine task scores them, rerank_answer writes the answer (malloc'd JSON,
 * NULL when out of memory); rerank_req_free frees what parse made, also
 * after a refusal. */
typedef struct rerank_req {
    srv_engine_task task;
    int n_docs;
    int32_t **ids; /* [n_docs]: each document's prompt */
    int64_t *n_ids;
    float *score;               /* [n_docs] */
    float lora[MODEL_MAX_LORA]; /* the adapters' scales (srv_lora_scales) */
    int n_lora;
    const cJSON *docs;   /* the body's documents (or texts) */
    bool tei, with_text; /* TEI's answer; the texts in it */
    int64_t top_n;       /* results kept */
} rerank_req;
bool rerank_parse(srv *s, const cJSON *b, rerank_req *rj, api_error *err);
char *rerank_answer(srv *s, const cJSON *b, const rerank_req *rj);
/* vLLM's Score API the same way: text_1 / text_2 paired 1:1, 1:N or N:N. */
bool score_parse(srv *s, const cJSON *b, rerank_req *rj, api_error *err);
char *score_answer(srv *s, const cJSON *b, const rerank_req *rj);
void rerank_req_free(rerank_req *rj);

/* One /v1/embeddings request (srv_endpoints.c). */
typedef struct srv_embed {
    srv_engine_task task;
    int n_inputs;
    int32_t **ids; /* [n_inputs] */
    int64_t *n_ids;
    float *out;                 /* [n_inputs][n_embd] */
    float lora[MODEL_MAX_LORA]; /* the adapters' scales (srv_lora_scales) */
    int n_lora;
    const char *field; /* the request's "input", or llama-server's "content" */
    int normalize;     /* embd_normalize (engine_embed) */
} srv_embed;

/* ------------------------------------------------------------- server -- */

struct srv {
    server_config cfg;
    cJSON *default_kwargs; /* cfg.chat_template_kwargs parsed (an object), or NULL */
    engine *e;
    bool
        priority_sched; /* the engine schedules by request priority (else FCFS: priority refused) */
    const tok_vocab *vocab;
    /* Engine facts read by HTTP threads (immutable while serving). */
    int64_t n_ctx, n_blocks, block_size, n_embd;
    int max_seqs;
    time_t t_start;   /* "created" of the model object */
    chat_family chat; /* CHAT_TMPL_UNKNOWN: chat requests get 400 */
    chat_caps caps;   /* tool-call format and reasoning of the chat template */
    struct jinja_template
        *jinja;           /* the Jinja chat template; NULL: the family's built-in rendering */
    jinja_caps tmpl_caps; /* what it can do, as llama-server reports it (/props) */
    char chat_error[256];
    const char *bos_text, *eos_text;
    pthread_mutex_t tok_mu; /* the tokenizer is not documented as thread-safe */
    /* Submission queue: HTTP threads -> engine thread. */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    srv_job *q_head, *q_tail;
    srv_engine_task *task_head; /* work waiting for the engine thread (srv_engine_call) */
    pthread_cond_t task_cv;     /* the engine thread finished a task (under q_mu) */
    int64_t n_inflight;         /* engine requests queued or active */
    bool cancel_pending;
    bool stopping;
    /* Generation responses not yet fully sent (shutdown waits for them). */
    atomic_int n_busy;
    /* SIGTERM received: new requests and connections get 503. */
    atomic_bool draining;
    /* Keys (empty: no authentication). */
    srv_key *keys;
    int n_keys;
    /* HTTPS: the PEM texts of --ssl-key-file / --ssl-cert-file (NULL: HTTP). */
    char *tls_key, *tls_cert;
    /* Connections (srv_conn.c). */
    struct MHD_Daemon *daemon;
    int listen_fd, bound_port;
    int wake_pipe[2];
    pthread_t acceptor;
    atomic_bool acceptor_stop;
    pthread_mutex_t conns_mu;
    conn_rec *conns;
    int n_conns;
    atomic_long n_refused;   /* connections answered 503 by the acceptor */
    atomic_long n_timed_out; /* connections cut for missing the request deadline */
    atomic_long n_evicted;   /* receiving connections cut to make room when every slot was taken */
    atomic_long n_client_gone; /* jobs cancelled because their client left */
    rstore *responses;         /* kept /v1/responses answers; NULL: none kept */
    rstreams *streams;         /* resumable streams (srv_streams.c) */
    /* LoRA adapters (srv_lora.c): their count, names (cfg.lora_names) and
     * the scales of requests that name none, read and changed under lora_mu */
    pthread_mutex_t lora_mu;
    float lora_scale[MODEL_MAX_LORA];
    int n_lora;                       /* the model's adapter indices (model_lora_count) */
    bool lora_gone[MODEL_MAX_LORA];   /* unloaded (/v1/unload_lora_adapter): index left empty */
    char *lora_owned[MODEL_MAX_LORA]; /* names given at run time, freed at the end only (a
                                        * job's model_name may point to one) */
    bool lora_runtime;                /* VLLM_ALLOW_RUNTIME_LORA_UPDATING: the two routes */
    /* Engine thread only. */
    srv_job *active;
    srv_slot *slots; /* [max_seqs]: llama-server's slots, for its slot actions (srv_slots.c) */
    pthread_t engine_thread;
    srv_metrics metrics;
};

/* Engine thread (srv_engine.c). */
bool engine_thread_start(srv *s);
/* The slot a choice just submitted runs on: want (/completion's id_slot) if
 * that one is idle, else the first idle one (-1: none);
 * and the end of its request (the slot keeps its prompt and generated ids). */
int slot_take(srv *s, int64_t engine_id, int want);
void slot_finish(srv *s, srv_choice *c);
void slots_free(srv *s);
void engine_thread_stop(srv *s);
/* HTTP thread: queues j (taking a reference for the engine thread), or fills
 * err (503, queue full or shutting down) and returns false. */
bool srv_enqueue(srv *s, srv_job *j, api_error *err);
/* HTTP thread: runs em on the engine thread and waits for it; false with err set. */

/* srv_kv_view.c: the live KV view. Engine thread: serves the queued snapshot
 * requests (a copy each). HTTP thread: GET /v1/kv/state's JSON (NULL with err),
 * and the built-in pages and their assets (NULL: no such page). */
char *srv_kv_state(srv *s, const char *since, size_t *len, api_error *err);
/* GET /slots (llama-server's shape); fail_on_no_slot: its query parameter or NULL. */
char *srv_slots(srv *s, const char *fail_on_no_slot, api_error *err);
typedef struct srv_asset {
    const char *path, *ctype;
    const unsigned char *data;
    size_t len;
} srv_asset;
const srv_asset *srv_asset_find(const char *url);
/* Built from src/server/web/ at build time (cmake/embed_web.cmake). */
extern const srv_asset SRV_WEB_ASSETS[];
extern const int SRV_WEB_N_ASSETS;

/* ------------------------------------------------------------- OpenAI -- */

typedef struct resp_req resp_req;   /* a /v1/responses request's own state (below) */
typedef struct anth_req anth_req;   /* a /v1/messages request's own state (below) */
typedef struct llama_req llama_req; /* a /completion request's own state (srv_llama.c) */

typedef struct api_req {
    bool chat;
    bool stream, include_usage;
    bool continuous_usage; /* vLLM's stream_options.continuous_usage_stats (with include_usage) */
    bool logprobs;         /* return logprobs */
    bool tokens_as_ids;    /* "token_id:N" instead of token text (vLLM extension) */
    char id[40];
    long created;
    srv_job *job;
    resp_req *resp;   /* NULL but for /v1/responses */
    anth_req *anth;   /* NULL but for /v1/messages */
    llama_req *llama; /* NULL but for /completion */
    /* /v1/completions "echo": each choice's text starts with its prompt, and
     * with logprobs that prompt's tokens come first (srv_echo_prepare); per
     * prompt k of the job (job_prompt): */
    bool echo;
    char *echo_text[SRV_MAX_N]; /* the prompt as text: as sent, or its ids' bytes (any bytes) */
    size_t echo_len[SRV_MAX_N];
    float *echo_lp[SRV_MAX_N];        /* [its length]: log P(token p | the ones before), [0] NAN */
    int32_t *echo_top_ids[SRV_MAX_N]; /* [its length][job->top_logprobs] */
    float *echo_top_lps[SRV_MAX_N];
    /* vLLM's prompt_logprobs (-1: none to compute): per prompt, its positions'
     * log-probabilities, top k and the prompt token's rank (srv_echo_prepare) */
    int prompt_logprobs;
    float *plp_lp[SRV_MAX_N];
    int32_t *plp_top_ids[SRV_MAX_N]; /* [its length][prompt_logprobs] */
    float *plp_top_lps[SRV_MAX_N];
    int32_t *plp_rank[SRV_MAX_N];
} api_req;

/* srv_structured.c: response_format, grammar, json_schema, guided_json,
 * guided_choice, guided_regex, guided_grammar -> j->grammar (400 when bad or
 * when two of them are given). */
bool parse_structured(srv *s, const cJSON *body, srv_job *j, api_error *err);

/* Parses a request body (a cJSON object) into r and a new job (r->job). */
bool openai_parse(srv *s, const cJSON *body, bool chat, api_req *r, api_error *err);
/* HTTP thread, for an "echo" request: the prompt's text, and with logprobs
 * its log-probabilities computed on the engine thread (engine_prompt_logprobs);
 * for prompt_logprobs those of vLLM's answer; false with err (503 when the
 * pool has no room right now). */
bool srv_echo_prepare(srv *s, api_req *r, api_error *err);
/* The answer of an echo request with max_tokens 0 (no generation): the
 * prompt alone in each choice, as JSON or (stream) as SSE chunks and [DONE]. */
char *openai_echo_only(srv *s, const api_req *r);

/* srv_chat_jinja.c: the Jinja chat template. setup compiles src (origin names
 * it in messages) and returns false, with a warning, if it does not compile;
 * render returns the prompt of a chat request (malloc'd, *len bytes) or NULL
 * with err set (400 when the template refuses or fails on the conversation). */
bool srv_jinja_setup(srv *s, const char *src, const char *origin);
void srv_jinja_free(srv *s);
/* tools: the array the template sees as `tools` (NULL: None); system_extra:
 * text added to the system message (NULL: none). */
char *srv_jinja_render(srv *s, const cJSON *body, bool add_gen, const cJSON *tools,
                       const char *system_extra, size_t *len, api_error *err);

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
    bool started[SRV_MAX_N];      /* chat: the role delta was sent */
    bool echoed[SRV_MAX_N];       /* completions with echo: the prompt was sent */
    out_parser parser[SRV_MAX_N]; /* chat with tools or reasoning: set up with the role delta */
    int n_calls[SRV_MAX_N];       /* tool calls sent per choice */
    parse_out po;                 /* scratch */
    size_t text_off[SRV_MAX_N];
    int64_t n_tok[SRV_MAX_N]; /* tokens streamed per choice (continuous usage) */
    int n_finished;
    const srv_event *cur; /* the event being written (timings_per_token) */
    int64_t completion_tokens, kv_lb, kv_alloc, cached, disk;
    bool failed;
    api_error fail; /* when failed (status 0: a 500 for an engine failure) */
} stream_state;
void openai_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                          kvl_buf *out);
void stream_state_free(stream_state *st);
/* Ends a stream early: an error chunk if st->failed, the usage chunk, [DONE]. */
void openai_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out);

/* srv_chunks.c: chat SSE chunks (as openai_stream_events writes them) read
 * back, part by part, for the endpoints that answer in another API's shape.
 * content gets "" with a token's logprobs when the parser held its text
 * back; end gets NULL at [DONE], else the error chunk's message. */
typedef struct chunk_sink {
    void *ctx;
    void (*reasoning)(void *ctx, const char *text);
    void (*content)(void *ctx, const char *text, const cJSON *logprobs);
    void (*call)(void *ctx, const char *id, const char *name); /* a new tool call */
    void (*call_args)(void *ctx, const char *text);
    void (*end)(void *ctx, const char *error);
    cJSON **usage; /* the usage chunk's usage is kept here (replacing what was) */
} chunk_sink;
/* Reads (and consumes) the complete chunks of sse until the end (*ended set);
 * false when out of memory. */
bool chat_chunks_read(kvl_buf *sse, const chunk_sink *k, bool *ended);
/* An SSE "data: JSON" event of o (taken), as the OpenAI API and llama-server
 * write their streams; out->oom set when out of memory. */
void sse_data(kvl_buf *out, cJSON *o);
/* llama-server's "timings" object of a request's stats (mid-stream: until now). */
cJSON *srv_timings_json(const engine_req_stats *st);
/* llama-server's "prompt_progress" object of a progress event. */
cJSON *srv_prompt_progress_json(const srv_event *ev);
/* An SSE event "event: TYPE" whose data is ev (taken) with "type" (and, when
 * seq >= 0, "sequence_number") as its first members, as the Responses and
 * Messages APIs write their events. */
void sse_event(kvl_buf *out, const char *type, cJSON *ev, int64_t seq);

/* srv_rstore.c: kept /v1/responses answers (the last --responses-store of
 * them, per tenant). rstore_new(0) is NULL: nothing kept; every function
 * takes a NULL store. put takes conversation, input (the request's input items
 * with their ids) and response (freed on failure). */
rstore *rstore_new(int cap);
void rstore_free(rstore *r);
bool rstore_put(rstore *r, const char *tenant, const char *id, cJSON *conversation, cJSON *input,
                char *response);
cJSON *rstore_input(rstore *r, const char *tenant, const char *id); /* a copy, or NULL */
/* GET /v1/responses/{id}/input_items: the list object (order "desc" by default,
 * limit 1..100, default 20, after an item id), or NULL with err. */
char *rstore_input_list(rstore *r, const char *tenant, const char *id, const char *order,
                        const char *limit, const char *after, api_error *err);
cJSON *rstore_conversation(rstore *r, const char *tenant, const char *id); /* a copy, or NULL */
char *rstore_response(rstore *r, const char *tenant, const char *id);      /* a copy, or NULL */
bool rstore_delete(rstore *r, const char *tenant, const char *id);

/* srv_responses.c, srv_responses_out.c: POST /v1/responses on the chat path.
 * responses_parse is openai_parse for a Responses body (r->resp set); the
 * others stand for openai_response, openai_stream_events and
 * openai_stream_end, writing the Responses API's object and events. A
 * request's own state: what the chat request does not carry (echoed in the
 * response object), and the conversion of its chunks. */
struct resp_req {
    cJSON *echo;              /* instructions, tools, tool_choice, text, reasoning, ... as sent */
    bool logprobs;            /* include: message.output_text.logprobs */
    kvl_buf sse;              /* chat chunks not yet converted */
    int seq;                  /* sequence_number of the next event */
    bool started;             /* response.created sent */
    cJSON *output;            /* the finished output items */
    int open;                 /* the open item's kind (srv_responses_out.c), 0: none */
    cJSON *item;              /* the open item (its id, call_id, name) */
    kvl_buf text;             /* the open item's text or arguments */
    cJSON *item_lps;          /* the open message's logprobs */
    cJSON *pending_lps;       /* logprobs of tokens whose text is held back (a marker, maybe) */
    engine_finish finish;     /* why the engine stopped (the chat finish_reason says
                           * tool_calls also when max_output_tokens cut the output) */
    cJSON *usage;             /* the chat usage */
    int64_t reasoning_tokens; /* output tokens whose text went to the reasoning */
    int64_t tokens_pending;   /* tokens not yet counted with any output */
    bool ended;
    bool failed;         /* ended with an error: */
    api_error error;     /* this one */
    bool store;          /* kept when it ends (store: true and a store to keep it in) */
    char *tenant;        /* the caller's, for the store */
    cJSON *conversation; /* what it continued and its input, as chat messages */
    cJSON *input;        /* its input items, each with an id (GET .../input_items) */
    char *previous;      /* previous_response_id, or NULL */
};
/* tenant: the caller's (its key's namespace, "" without keys): what it may continue. */
bool responses_parse(srv *s, const cJSON *body, const char *tenant, api_req *r, api_error *err);
char *responses_response(srv *s, const api_req *r, srv_event *events);
void responses_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                             kvl_buf *out);
void responses_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out);
void responses_req_free(resp_req *q);

/* srv_anthropic.c, srv_anthropic_out.c: POST /v1/messages (Anthropic's
 * Messages API) on the chat path, as /v1/responses. anthropic_response
 * returns NULL with err set when the answer is an error (Anthropic's error
 * body: anthropic_error_json). count_tokens: {"input_tokens": N} of the
 * prompt the same body renders to. A request's own state: */
struct anth_req {
    kvl_buf sse;          /* chat chunks not yet converted */
    bool started, ended;  /* message_start sent; the end read */
    int n_blocks;         /* content blocks opened */
    int open;             /* the open block's kind (srv_anthropic_out.c), 0: none */
    cJSON *block;         /* the open block as content_block_start showed it */
    kvl_buf text;         /* the open block's text, thinking or arguments */
    cJSON *content;       /* the closed blocks */
    cJSON *usage;         /* the chat usage */
    bool called;          /* a tool_use block was written */
    engine_finish finish; /* why the engine stopped */
    int stop_index;       /* the request's stop string that ended it, -1: none */
    bool failed;
    api_error error; /* when failed */
};
bool anthropic_parse(srv *s, const cJSON *body, api_req *r, api_error *err);
char *anthropic_response(srv *s, const api_req *r, srv_event *events, api_error *err);
void anthropic_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                             kvl_buf *out);
void anthropic_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out);
void anthropic_req_free(anth_req *q);
char *anthropic_error_json(const api_error *e);
char *anthropic_count_tokens(srv *s, const char *body, size_t len, api_error *err);

/* srv_llama.c, srv_llama_out.c, srv_infill.c: POST /completion
 * (llama-server's own API) on the completions path, as /v1/messages on the
 * chat path: llama_parse is openai_parse for its body (r->llama set); the
 * others stand for openai_response, openai_stream_events and
 * openai_stream_end, in llama-server's shapes. A request's own state: */
struct llama_req {
    int n_probs;        /* completion_probabilities with this many alternatives (0: none) */
    bool prompt_only;   /* n_predict 0: the prompt goes into the cache, nothing is answered */
    bool return_tokens; /* "tokens" holds the ids (a stream always sends them) */
    bool random_seed;   /* no seed given: generation_settings says 4294967295, as llama's */
    bool post_sampling; /* post_sampling_probs: the probabilities after the sampler chain */
    cJSON *settings;    /* generation_settings */
    cJSON *samplers;    /* the request's sampler list by llama's names (NULL: its default) */
    cJSON *fields;      /* response_fields (NULL: every field) */
    cJSON *prompt_text[SRV_MAX_N]; /* each prompt's tokens as text, specials included */
    /* per choice, until its final event */
    kvl_buf content[SRV_MAX_N];
    cJSON *tokens[SRV_MAX_N];
    cJSON *probs[SRV_MAX_N];
    int64_t n_decoded[SRV_MAX_N];
};
bool llama_parse(srv *s, const cJSON *body, api_req *r, api_error *err);
/* generation_settings as a request that sets nothing gets them: llama's
 * defaults with the server's sampling flags and -n (/props'
 * default_generation_settings.params, as llama-server shows them). */
/* llama-server's sampler fields (temperature .. mirostat, min_keep) of p into o,
 * its -1 windows shown as n_ctx: /completion's generation_settings and
 * GET /slots' params (srv_llama.c). */
void llama_sampling_json(cJSON *o, const sampler_params *p, int64_t n_ctx);
cJSON *llama_default_settings(srv *s);
/* llama-server's fields of its samplers beyond the default chain (typical_p,
 * top_n_sigma, xtc_*, dynatemp_*, min_keep, mirostat*, dry_*) into p; 400 on a bad value. */
bool srv_parse_llama_samplers(const cJSON *b, sampler_params *p, api_error *err);
/* llama-server's `samplers` list on the OpenAI endpoints: the samplers it
 * leaves out off, the chain in its order; 400 on a bad list. */
bool srv_parse_sampler_list(const cJSON *b, sampler_params *p, api_error *err);
/* llama's tokenize_mixed: a string, or token ids and strings mixed, into ids
 * (malloc'd, *n of them): each string's tokens in its place, the first
 * element's with add_special (srv_encode_special) when it is a string; NULL
 * with a 400 naming param (an id outside the vocabulary, another kind of
 * element). */
int32_t *llama_tokenize_mixed(srv *s, const cJSON *v, bool add_special, bool parse_special,
                              const char *param, int64_t *n, api_error *err);
/* POST /infill: the fill-in-the-middle prompt llama-server lays out from
 * input_prefix, input_suffix, input_extra and prompt, then as /completion. */
bool llama_infill_parse(srv *s, const cJSON *body, api_req *r, api_error *err);
char *llama_response(srv *s, const api_req *r, srv_event *events);
void llama_stream_events(srv *s, const api_req *r, stream_state *st, srv_event *events,
                         kvl_buf *out);
void llama_stream_end(srv *s, const api_req *r, stream_state *st, kvl_buf *out);
void llama_req_free(llama_req *q);

/* srv_endpoints.c. Each returns a malloc'd JSON body, or NULL with err set. */
/* Request helpers of theirs and /rerank's (srv_util.c): a field outside names (n of them) is a 400 naming
 * it (ep: the endpoint, for the message); "model" must be the served model or
 * an adapter's name (404 otherwise); the body must be one JSON object. */
bool srv_only_fields(const cJSON *b, const char *const *names, int n, const char *ep,
                     api_error *err);
bool srv_check_model(srv *s, const cJSON *b, api_error *err);
bool srv_parse_object(const char *p, size_t n, cJSON **out, api_error *err);
char *openai_models(srv *s);                                              /* GET /v1/models */
char *openai_model_get(srv *s, const char *id, api_error *err);           /* GET /v1/models/{id} */
char *srv_tokenize(srv *s, const char *body, size_t len, api_error *err); /* POST /tokenize */
char *srv_detokenize(srv *s, const char *body, size_t len, api_error *err); /* POST /detokenize */
/* POST /v1/embeddings; llama: /embedding and /embeddings, llama-server's shape */
char *srv_embeddings(srv *s, const char *body, size_t len, bool llama, api_error *err);
/* POST /v1/kv/save: {prompt} or {messages} -> its full blocks in the disk tier (srv_kv.c) */
char *srv_kv_save(srv *s, const char *body, size_t len, const srv_key *key, api_error *err);
/* POST /v1/kv/unpin: the same body -> that saved prefix's pin dropped (srv_kv.c) */
char *srv_kv_unpin(srv *s, const char *body, size_t len, const srv_key *key, api_error *err);
/* POST /slots/{id}?action=save|restore|erase (srv_slots.c): url is the path
 * after the API prefix, action the query's. */
char *srv_slot_action(srv *s, const char *url, const char *action, const char *body, size_t len,
                      const srv_key *key, api_error *err);
char *srv_props(srv *s); /* GET /props */
/* POST /rerank, /v1/rerank, ...: a query and documents -> their scores (srv_rerank.c) */
char *srv_rerank(srv *s, const char *body, size_t len, api_error *err);
/* POST /score, /v1/score: vLLM's Score API over the same scoring (srv_rerank.c) */
char *srv_score(srv *s, const char *body, size_t len, api_error *err);
/* POST /apply-template: a chat request's body -> {"prompt": the text its template renders} */
char *srv_apply_template(srv *s, const char *body, size_t len, api_error *err);

/* LoRA adapters (srv_lora.c). */
void srv_lora_init(srv *s);
void srv_lora_free(srv *s);
/* POST /v1/chat/completions/input_tokens and /v1/responses/input_tokens
 * (llama-server's; OpenAI's for responses): {"object": "response.input_tokens",
 * "input_tokens": N}, the prompt the request would run, rendered and
 * tokenized as it would be; responses: a /v1/responses body (tenant: whose
 * stored responses it may continue). NULL with err as the request would get. */
char *srv_input_tokens(srv *s, const char *body, size_t len, bool responses, const char *tenant,
                       api_error *err);

/* POST /v1/chat/completions/control (llama-server's, which its web UI's stop-thinking
 * button posts): {"id": a running chat completion's id, "action": "reasoning_end"}
 * ends its thinking block now; {"success": ...} (malloc'd JSON) or NULL with err. */
char *srv_chat_control(srv *s, const char *body, size_t len, const srv_key *key, api_error *err);

/* Whether a request's "model" may be name: the served model or an adapter's
 * --lora-modules name. */
bool srv_model_known(const srv *s, const char *name);
/* Whether name is one of the model's other names (server_config.model_aliases). */
bool srv_model_alias(const srv *s, const char *name);
/* The request's adapter scales into j (its "lora", the adapter its "model"
 * names, or the server's); false with a 400 naming the field. */
bool srv_lora_job(srv *s, const cJSON *b, const char *model, srv_job *j, api_error *err);
/* The model name a job's answers carry (vLLM's: an adapter's when the request named it). */
static inline const char *job_model_name(const srv *s, const srv_job *j) {
    return j && j->model_name ? j->model_name : s->cfg.model_id;
}
/* The same into out (MODEL_MAX_LORA floats), *n of them (0: no adapters). */
bool srv_lora_scales(srv *s, const cJSON *b, const char *model, float *out, int *n, api_error *err);
/* The adapter named name (cfg.lora_names), or -1; the caller holds lora_mu. */
int srv_lora_named_locked(const srv *s, const char *name);
/* vLLM's runtime adapters (with VLLM_ALLOW_RUNTIME_LORA_UPDATING): POST
 * /v1/load_lora_adapter {"lora_name", "lora_path"[, "load_inplace"]} and
 * /v1/unload_lora_adapter {"lora_name"}; vLLM's plain-text success line
 * (malloc'd) or NULL with err (400, 404 for an unknown name, 409 while
 * requests use it). */
char *srv_lora_load(srv *s, const char *body, size_t len, api_error *err);
char *srv_lora_unload(srv *s, const char *body, size_t len, api_error *err);
char *srv_lora_list(srv *s);                                              /* GET /lora-adapters */
char *srv_lora_set(srv *s, const char *body, size_t len, api_error *err); /* POST */
/* /v1/models' entries for the named adapters, each object(s, name) plus
 * vLLM's root and parent, appended to data. */
void srv_lora_models(const srv *s, cJSON *data, cJSON *(*object)(const srv *, const char *));

#endif
