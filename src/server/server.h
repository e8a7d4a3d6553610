/* server: the OpenAI-compatible HTTP front end of `kvllm serve`.
 *
 * One engine thread owns the engine (model, KV pool, scheduler) and is the only
 * caller of engine_submit/engine_cancel/engine_step. HTTP connection threads
 * (libmicrohttpd, one per connection) parse and tokenize requests, queue jobs
 * for the engine thread and stream the events it hands back through each job's
 * own event queue. A client that disconnects gets its job cancelled before the
 * next engine step, so its KV blocks return to the pool. */
#ifndef KVLLM_SERVER_H
#define KVLLM_SERVER_H

#include "engine.h"
#include "tokenizer.h"

typedef struct server_config {
    const char *host;         /* address to bind (default 127.0.0.1) */
    int port;                 /* 0: any free port */
    const char *api_key;      /* NULL: no authentication (unless api_key_file) */
    const char *api_key_file; /* keys, one a line: "KEY [TENANT]" ('#' comments) */
    /* --api-prefix (llama-server's): every route under this path ("/llm";
     * NULL or "": at the root) */
    const char *api_prefix;
    /* Vertex AI's prediction protocol (llama-server's, AIP_MODE=PREDICTION):
     * POST gcp_predict_route runs each of its "instances" as the request its
     * "@requestFormat" names (NULL: off); gcp_health_route: /health's alias */
    const char *gcp_predict_route, *gcp_health_route;
    /* HTTPS (llama-server's --ssl-key-file / --ssl-cert-file): PEM files of the
     * private key and its certificate (chain); both NULL: plain HTTP */
    const char *tls_key_file, *tls_cert_file;
    bool metrics_public;      /* /metrics without a key even when keys are set */
    bool prefix_cache_shared; /* with keys: one prefix-cache namespace for all tenants */
    const char *model_id;     /* the name /v1/models lists and requests may use */
    /* more names of the model (comma-separated; NULL: none): requests may use
     * them too, /v1/models lists each (llama-server's --alias a,b; vLLM's
     * --served-model-name); answers carry model_id */
    const char *model_aliases;
    /* --tags a,b (llama-server's): informational tags /v1/models lists (NULL: none) */
    const char *model_tags;
    const char *chat_template;     /* family name overriding the GGUF template, or NULL */
    const char *chat_template_src; /* the GGUF's tokenizer.chat_template, or NULL */
    const char *
        chat_template_file; /* --chat-template-file: overrides chat_template_src (name; text in src) */
    bool chat_template_inline; /* chat_template_src is --chat-template's own text */
    /* --special (llama-server's): every control token's text is written into
     * the output, the end-of-generation token's too, unless a request sends
     * skip_special_tokens true */
    bool special;
    /* --metrics-prefix: the namespace of /metrics' series ("vllm" gives vLLM's
     * own names, vllm:num_requests_running, ...); NULL: "kvllm" */
    const char *metrics_prefix;
    bool props_endpoint; /* --props: POST /props answers success (llama-server's; 501 without) */
    /* --prefill-assistant (llama-server's default): a chat whose last message is
     * the assistant's continues it (continue_final_message) unless the request
     * sets continue_final_message or add_generation_prompt */
    bool prefill_assistant;
    /* GBNF every generation request is held to unless it constrains its output
     * itself or has tools (llama-server's --grammar, --grammar-file,
     * --json-schema); NULL: none */
    const char *grammar;
    size_t max_body_bytes;  /* larger request bodies get 413 (default 8 MiB) */
    int max_queue;          /* waiting requests beyond max_seqs before 503 */
    const char *model_path; /* the GGUF file (GET /props) */
    const char
        *cors_origin; /* --cors: Access-Control-Allow-Origin on every response; NULL: no CORS */
    engine_pooling pooling; /* /v1/embeddings: how hidden states are pooled */
    /* /rerank's prompt: the GGUF's tokenizer.chat_template.rerank, {query} and
     * {document} in it, or NULL (llama-server's layout without one) */
    const char *rerank_template;
    /* --chat-template-kwargs (llama-server's; vLLM's --default-chat-template-kwargs):
     * a JSON object of template variables every chat request gets, its own
     * chat_template_kwargs winning key by key; NULL: none */
    const char *chat_template_kwargs;
    bool reasoning_none; /* --reasoning-format none: thinking stays in the content */
    /* --reasoning-budget N > 0: every chat request's thinking budget unless it
     * sends thinking_budget_tokens (-1: none); --reasoning-budget-message: the
     * text forced before the end tag when a budget is spent */
    int32_t reasoning_budget;
    const char *reasoning_budget_message;
    bool no_webui; /* --no-webui: the built-in pages answer 404 */
    /* --ui-config JSON / --ui-config-file PATH (llama-server's): default settings
     * for llama.cpp's web UI, an object, handed out as /props' ui_settings (text;
     * NULL: {}) */
    const char *ui_config;
    bool no_slots; /* --no-slots: GET /slots answers 501, as llama-server's */
    /* --slot-save-path (llama-server's): the directory POST
     * /slots/{id}?action=save|restore writes and reads slot files in (an
     * existing, writable directory); NULL: the slot actions answer 501 */
    const char *slot_save_path;
    uint8_t slot_model_id[16];  /* the model's identity written in slot files (kv_disk_model_id) */
    int max_connections;        /* open connections in all; beyond: 503 */
    int max_connections_per_ip; /* from one client address; 0: no limit */
    double request_timeout_s;   /* to receive a whole request, headers and body */
    double shutdown_timeout_s;  /* SIGTERM: in-flight requests may finish this long */
    int http_threads;           /* libmicrohttpd worker threads */
    int responses_store;        /* /v1/responses answers kept for previous_response_id */
    /* A pipeline (--pp): each rank's bytes per KV block of each group,
     * kv_rank_block_bytes[r * MODEL_MAX_KV_GROUPS + g] for r < kv_ranks
     * (copied at start). 0 ranks: one process, the engine's pools. /metrics
     * reports the KV bytes of every rank and of the job from them. */
    int kv_ranks;
    const int64_t *kv_rank_block_bytes;
    /* The command line's sampling flags: the fields sampling_set names
     * (SAMPLER_SET_*) are every request's default for them, on /completion
     * over llama's defaults and on the OpenAI endpoints over OpenAI's (as
     * llama-server takes --temp, --top-k, ... for all its endpoints); a
     * request's own value wins */
    sampler_params sampling;
    uint32_t sampling_set;
    /* -n: a request's length when it gives none (-1: until the context is
     * full; 0: not given: /completion runs to the context, chat too,
     * /v1/completions 16 tokens, OpenAI's default) */
    int64_t n_predict;
    /* --lora-modules: adapter i's model name (vLLM's), NULL where unnamed */
    const char *lora_names[MODEL_MAX_LORA];
} server_config;

/* The numeric settings of server_config, each once: the `kvllm serve` flag
 * that sets it, its default (server_config_default), its range and its line
 * of help, "DESC (default N; NOTE)". The field is an int or a double. */
typedef struct server_setting {
    const char *flag, *metavar; /* "--port", "N" */
    size_t offset;              /* in server_config */
    bool is_double;
    int64_t def, lo, hi;
    const char *desc, *note; /* note: NULL for none */
} server_setting;
extern const server_setting server_settings[];
extern const int server_n_settings;
/* Sets setting st of c to v (in st's range). */
void server_setting_set(server_config *c, const server_setting *st, int64_t v);

void server_config_default(server_config *c);

/* What can be told before the model loads: the files cfg names can be read
 * (--api-key-file, --ssl-key-file, --ssl-cert-file) and HTTPS has both of its
 * files. False with the message printed; server_run checks again. */
bool server_config_check(const server_config *cfg);
/* Whether the server answers path itself (Vertex AI's routes must not hide one). */
bool server_route_taken(const char *path);

/* Serves until SIGINT/SIGTERM, then drains: new requests get 503, those in
 * flight may finish for shutdown_timeout_s, the rest are cancelled. Borrows
 * the engine, which must be idle and is used only by the server's engine
 * thread until this returns. Returns 0 after a clean shutdown, 1 if the server
 * could not start (message printed). */
int server_run(engine *e, const tok_vocab *vocab, const server_config *cfg);

#endif
