/* engine: requests, the continuous-batching scheduler, sampling, stop
 * conditions and streaming callbacks. The engine owns the KV pool; the model
 * only computes. One thread drives engine_step(); callbacks run on that thread.
 *
 * Each step builds one ragged batch: first one decode token for every running
 * sequence, then prefill chunks (of sequences still prefilling, then newly
 * admitted ones) up to the token budget. When blocks run out, the newest
 * running sequence is preempted by recompute and re-queued at the front. */
#ifndef KVLLM_ENGINE_H
#define KVLLM_ENGINE_H

#include "base.h"
#include "kv.h"
#include "kv_disk.h"
#include "model.h"
#include "tokenizer.h"
#include "sampler.h"
#include "grammar.h"
#include "stop_match.h"

typedef enum engine_finish {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP,      /* end-of-generation token or stop string */
    ENGINE_FINISH_LENGTH,    /* max_tokens or the context limit */
    ENGINE_FINISH_CANCELLED, /* engine_cancel */
    ENGINE_FINISH_ERROR,     /* the request cannot go on: engine_event.error says why (a
                                grammar over its matching bounds, grammar.h) */
} engine_finish;

typedef struct engine_req_stats {
    int64_t n_prompt, n_generated;
    int64_t n_cached_prompt; /* prompt tokens served from the prefix cache */
    int64_t n_disk_prompt;   /* of those, read from its disk tier */
    int64_t n_preemptions;
    double t_submit, t_first_token, t_end; /* kvl_time_s() */
    double t_scheduled;                    /* first step that computed any of it (0: never) */
    double t_prefill_s;                    /* time in steps until the first token */
    kv_usage kv;                           /* at the end, before the blocks were freed */
    int stop_index;    /* the request's stop string that ended it (engine_request.stop), -1: none */
    int32_t eog_token; /* the end-of-generation token that ended it (not an event's), -1: none */
    int32_t stop_token; /* the request's stop_ids entry that ended it, -1: none */
    int n_kv_groups;    /* per KV group (full / sliding-window / chunked layers): */
    kv_usage kv_group[MODEL_MAX_KV_GROUPS];
    int32_t kv_group_window[MODEL_MAX_KV_GROUPS];
    int32_t kv_group_chunk[MODEL_MAX_KV_GROUPS];
} engine_req_stats;

typedef struct engine_event {
    int64_t request_id;
    int32_t token;    /* generated id, or -1 for a text-only/final event */
    const char *text; /* UTF-8 text released by this event (not NUL-terminated) */
    size_t text_len;
    float logprob; /* of token under the model's distribution (NaN unless the
                                 request set logprobs or top_logprobs) */
    int n_top;
    const int32_t *top_ids; /* n_top alternatives, by descending logit */
    const float *top_logprobs;
    engine_finish finish;          /* != NONE on the request's last event */
    const char *error;             /* ENGINE_FINISH_ERROR: why (valid during the callback) */
    const engine_req_stats *stats; /* set on the last event */
    const engine_req_stats *live;  /* every event: the request's stats as they stand (t_end
                                      is set on the last event only) */
    /* engine_request.progress: an event of the prompt's progress instead of
     * output (token -1, no text): n_past of the prompt's tokens are in the
     * cache, from the prefix cache or computed; one when it is admitted, one
     * after each step that computed some of it */
    bool progress;
    int64_t n_past;
} engine_event;

typedef void (*engine_event_fn)(const engine_event *ev, void *user);

#define ENGINE_MAX_KEEP_SPECIAL 32
#define ENGINE_MAX_STOP_IDS     256
#define ENGINE_MAX_BAD          128
#define ENGINE_MAX_BAD_LEN      64
/* A token's logit bias: added to its logit before the grammar and the sampler
 * see it (OpenAI's and llama-server's logit_bias); -INFINITY bans it. */
typedef struct engine_logit_bias {
    int32_t token;
    float bias;
} engine_logit_bias;

typedef struct engine_request {
    const int32_t *prompt; /* copied */
    int64_t n_prompt;
    int64_t max_tokens; /* < 0: until the context is full */
    sampler_params sampling;
    const char *const *stop; /* stop strings (copied); at most ENGINE_MAX_STOP, each at most
                              * ENGINE_MAX_STOP_BYTES (stop_match.h) */
    int n_stop;
    int top_logprobs; /* alternatives per event, 0..20 */
    bool logprobs;    /* report each token's logprob (a pass over the vocabulary) */
    /* llama-server's post_sampling_probs: the events' logprob and top_logprobs
     * are probabilities after the sampler chain instead (the general chain's
     * candidates, by descending probability; sampler_chain_top) */
    bool post_sampling_probs;
    bool ignore_eos;
    /* Control tokens whose text is part of the output (e.g. a tool-call marker
     * such as Mistral's [TOOL_CALLS], which a parser needs to see); other
     * control tokens print as nothing. */
    int32_t keep_special[ENGINE_MAX_KEEP_SPECIAL];
    int n_keep_special;
    const char *cache_salt; /* prefix-cache isolation key (copied); NULL: none */
    /* Biases (copied; at most one per token): what is sampled changes, the
     * reported logprobs and top_logprobs stay the model's. */
    const engine_logit_bias *logit_bias;
    int n_logit_bias;
    /* The penalties' window (sampling.penalty_last_n) starts with the prompt,
     * as llama-server's does; otherwise it holds the generated tokens only. */
    bool penalize_prompt;
    /* llama-server's code-completion stops (its /infill and /completion
     * fields): with n_indent > 0, a line after the first newline whose
     * indentation (spaces, tabs) is shorter ends the output there, its
     * indentation kept; with max_predict_s > 0, a newline generated later than
     * that after the first token ends it after that token. ENGINE_FINISH_LENGTH. */
    int n_indent;
    double max_predict_s;
    /* vLLM's sampling extras. stop_ids (stop_token_ids; copied): generating one
     * ends the request (ENGINE_FINISH_STOP, stats.stop_token), its text left out
     * unless include_stop. min_tokens: until this many tokens are out,
     * end-of-generation tokens and stop_ids are masked and stop strings do not
     * end it (one that ends later still does). include_stop
     * (include_stop_str_in_output): the stop string or stop id that ended it
     * stays in the text. allowed (allowed_token_ids; copied; NULL: all): only
     * these may be sampled. keep_all_special (skip_special_tokens false): every
     * control token prints its text. */
    const int32_t *stop_ids;
    int n_stop_ids;
    int64_t min_tokens;
    bool include_stop;
    const int32_t *allowed;
    int n_allowed;
    bool keep_all_special;
    /* The end-of-generation token that ends it prints its text too (with
     * keep_all_special: llama-server's --special, "...</s>"). */
    bool eog_text;
    /* vLLM's bad_words as token sequences (copied): bad_ids holds them one after
     * another, bad_lens[i] the length of the i-th. The last token of a sequence
     * is banned wherever the generated tokens end with the rest of it (a
     * one-token sequence always). At most ENGINE_MAX_BAD sequences of at most
     * ENGINE_MAX_BAD_LEN tokens. */
    const int32_t *bad_ids;
    const int32_t *bad_lens;
    int n_bad;
    /* The model's LoRA adapters (model_lora_add): NULL for their default scales
     * as they are at submit, else model_lora_count() scales (copied). The
     * request's cached prefix blocks are shared only with requests of the same
     * adapters and scales: K and V depend on them. */
    const float *lora;
    /* For n > 1 completions of one prompt: the id of the request whose prompt
     * this one shares (set 0 for none; ids start at 1). It is admitted only once
     * the leader's full prompt blocks are in the prefix cache, so it reuses them
     * instead of computing them again. */
    int64_t prefix_leader;
    /* Constrained decoding: NULL = none. Borrowed (the caller keeps it alive until
     * the request's final event); compiled with the engine's vocabulary. Each step
     * the sampler sees only tokens that keep the output a valid prefix, and an
     * end-of-generation token only where the grammar can end (then it always
     * ends the request, ignore_eos or not). Reported logprobs and top_logprobs
     * stay those of the unconstrained distribution. */
    const grammar *grammar;
    bool no_speculative; /* opt out of speculative decoding (engine_config.spec) */
    /* Under ENGINE_SCHED_PRIORITY: lower values are admitted first and
     * preempted last (vLLM's semantics); must be 0 under ENGINE_SCHED_FCFS. */
    int priority;
    bool progress; /* prompt progress events (engine_event.progress; llama-server's
                      return_progress) */
    /* llama-server's reasoning budget (thinking_budget_tokens; reasoning_budget.h),
     * when budget: inside a block opened by budget_start's tokens (or by the
     * prompt: budget_inside), after budget_tokens tokens budget_forced's tokens
     * come next (a message and budget_end's tokens). Copied. Under a grammar
     * the grammar decides alone. */
    bool budget;
    int32_t budget_tokens;
    const int32_t *budget_start, *budget_end, *budget_forced;
    int n_budget_start, n_budget_end, n_budget_forced;
    bool budget_inside;
    engine_event_fn on_event;
    void *user;
} engine_request;

typedef enum engine_spec_mode {
    ENGINE_SPEC_OFF = 0,
    ENGINE_SPEC_NGRAM, /* prompt lookup: drafts copied from the sequence's own text */
    ENGINE_SPEC_DRAFT, /* a small draft model (engine_config.draft_model) drafts greedily */
} engine_spec_mode;
#define ENGINE_SPEC_MAX_K     16
#define ENGINE_SPEC_MAX_NGRAM 8
/* "off" / "ngram" / "draft" into *mode; false for anything else. */
bool engine_spec_parse(const char *name, engine_spec_mode *mode);
/* Which waiting request is admitted first and which running one yields:
 * FCFS (arrival order; the newest running one is preempted), or PRIORITY
 * (lowest engine_request.priority first, arrival order within a value; the
 * running one with the highest value, newest among equals, is preempted, also
 * to make room for a waiting request of a lower value). */
typedef enum engine_sched { ENGINE_SCHED_FCFS = 0, ENGINE_SCHED_PRIORITY } engine_sched;

typedef struct engine_config {
    int64_t n_ctx;    /* longest sequence (prompt + output) */
    int block_size;   /* tokens per KV block */
    int kv_dtype;     /* KV storage type (kv_dtype_parse): K, and V unless kv_dtype_v >= 0 */
    int kv_dtype_v;   /* V storage type, or -1 for the same as K */
    int64_t n_blocks; /* pool size; 0: n_ctx * max_seqs worth... see engine.c */
    int64_t max_batch_tokens; /* token budget per step */
    int max_seqs;             /* running sequences at most */
    bool no_kv_cache;         /* recompute the whole prefix at every step */
    bool prefix_cache;        /* share full blocks of identical prefixes (default on) */
    bool keep_unattended_kv;  /* keep the blocks no later token attends to (out of a sliding
                                 window or an earlier attention chunk) instead of dropping
                                 them: the whole-KV path, for tests that compare the two */
    /* Speculative decoding (spec.h): a decoding sequence proposes up to spec_k
     * tokens and one forward verifies them with its last token; the output is
     * exactly what plain decoding gives (same ids, greedy or sampled with the
     * same seed). Drafts are only added while the step has at most
     * spec_max_batch tokens (a larger batch is compute-bound already). */
    engine_spec_mode spec; /* default off */
    int spec_k;            /* most drafts per sequence and step, 1..ENGINE_SPEC_MAX_K */
    int spec_ngram;        /* longest n-gram matched, 1..ENGINE_SPEC_MAX_NGRAM */
    int spec_max_batch;    /* tokens per step up to which drafts are added */
    bool spec_fixed;       /* always spec_k drafts where there are any (else spec_adapt) */
    model *draft_model;    /* ENGINE_SPEC_DRAFT: borrowed; the same vocabulary as the model
                               * (the caller checks the texts; engine_create the size) */
    /* The disk tier of the prefix cache (kv_disk.h; copied), NULL: none.
     * Needs the prefix cache. */
    const kv_disk_config *kv_disk;
    engine_sched scheduling; /* default FCFS */
    /* Prefix-aware admission (SGLang's longest prefix match with an FCFS
     * fallback): among the first waiting requests of the best priority, admit
     * the one with the most prompt tokens in the prefix cache, unless the one
     * next in order has already been passed over this many times (so nothing
     * starves). 0: off, strict order (default). */
    int prefix_admission_wait;
    /* Steps in flight at once, 1..ENGINE_MAX_STEP_GROUPS (default 1). With G > 1
     * the running sequences form up to G groups, each step holding one group
     * (at most ceil(sequences / G) of them); a group's next step is planned
     * once its logits are back, while the other groups' steps are still in
     * flight: a pipeline (model_set_forward_async, --pp) keeps every stage
     * busy. In one process the steps simply run one after the other, in the
     * same order, so the schedule is the same. Not with speculative decoding
     * or the disk tier. */
    int step_groups;
} engine_config;

#define ENGINE_MAX_STEP_GROUPS 4

void engine_config_default(engine_config *c);

typedef struct engine engine; /* opaque */

/* The engine borrows model and vocab (they must outlive it). vocab may be NULL
 * for callers that never submit requests (evaluation). */
engine *engine_create(model *m, const tok_vocab *vocab, const engine_config *c, kvl_error *err);
void engine_destroy(engine *e);

/* Queues a request. Returns its id (>= 0), or -1 with err set if it can never
 * run (empty prompt, bad token ids, prompt + max_tokens beyond the context or the pool). */
int64_t engine_submit(engine *e, const engine_request *r, kvl_error *err);
/* Cancels a queued or running request; its final event is sent during the next step. */
void engine_cancel(engine *e, int64_t request_id);
/* LoRA adapters of the engine's model at run time, from the thread that
 * steps it, between steps: add attaches f (model_lora_add: the index, or -1
 * with err set; f is the model's either way); remove takes adapter `adapter`
 * away (model_lora_remove) unless queued or running requests give it a scale
 * other than 0: then false with *users their count (0: no such adapter). */
int engine_lora_add(engine *e, gguf_file *f, float scale, kvl_error *err);
bool engine_lora_remove(engine *e, int adapter, int *users);
/* Ends request_id's thinking block now (llama-server's reasoning_end control
 * action): its budget's forced tokens (message, end tag) come next. False
 * when it has no budget (engine_request.budget) or no block is being counted. */
bool engine_end_reasoning(engine *e, int64_t request_id);
/* Runs one scheduler step. Returns false with err set on an internal failure. */
bool engine_step(engine *e, kvl_error *err);
/* Requests waiting or running, or a cancelled request's disk read whose
 * blocks a later step still has to take back. */
bool engine_has_work(const engine *e);

/* KV group 0's pool (the only one unless the model has sliding-window or chunked layers). */
kv_pool *engine_kv(engine *e);
int engine_kv_n_groups(const engine *e);
/* Whether prefix caching is on (asked for, and the model has no sliding-window group and at
 * most one chunked one). */
bool engine_prefix_cache_enabled(const engine *e);
kv_pool *engine_kv_group(engine *e, int group);
const engine_config *engine_cfg(const engine *e);
const model *engine_model(const engine *e);

/* The disk tier (NULL: none). Its counters are safe to read from any thread;
 * kv_disk_save must run on the thread that drives engine_step. */
kv_disk *engine_kv_disk(engine *e);
/* A request whose prefix is on the disk tier waits while a reader thread
 * loads it; engine_step goes on with the others meanwhile. fn(user) is called
 * on that thread whenever a read finishes (to wake the thread that steps;
 * it must not call the engine). With fn set, engine_step never sleeps on a
 * read: the caller sleeps while engine_waiting_on_disk and fn wakes it; without,
 * a step that has nothing else to do sleeps until one is done. NULL: none (it
 * returns once no earlier call of fn runs). */
void engine_set_disk_wake(engine *e, void (*fn)(void *user), void *user);
/* The last step computed nothing and only reads in flight can change that. */
bool engine_waiting_on_disk(engine *e);

/* The prefix-chain salt of a request with this cache salt and these LoRA
 * scales (engine_request.lora; NULL: the model's defaults): the salt, then
 * each adapter in use by its data's hash and scale, so that blocks computed
 * under other adapters, or none, are never shared. The scales used go to
 * scales[] and their count to *n_scales when those are not NULL. malloc'd;
 * NULL when out of memory. */
char *engine_cache_salt(const engine *e, const char *salt, const float *lora, float *scales,
                        int *n_scales);

/* Puts the full blocks of ids (a prefix, under this cache salt and these LoRA
 * scales, engine_cache_salt's) in the disk
 * tier: blocks RAM or the tier holds are reused, the rest computed, then all
 * written synchronously, and pinned as one saved prefix (kv_disk_save).
 * Returns the blocks on disk, or -1 with err (no tier, bad ids, no free blocks
 * now, a write failure), or KV_DISK_OVER_PIN_CAP with err. Same thread rule
 * as engine_embed. */
int64_t engine_kv_save(engine *e, const int32_t *ids, int64_t n, const char *salt,
                       const float *lora, kvl_error *err);
/* Drops the pin an engine_kv_save of exactly these ids (full blocks, same
 * salt and LoRA scales) put on the disk tier (engine_kv_pin.c). Returns the
 * blocks it pinned, or -1 with err (no tier, or no such saved prefix). */
int64_t engine_kv_unpin(engine *e, const int32_t *ids, int64_t n, const char *salt,
                        const float *lora, kvl_error *err);

/* llama-server's slot files (kv_prefix_file_write): the full blocks of
 * ids[0..n) (found or computed, as engine_kv_save does, under this salt and
 * these LoRA scales) and all n ids written to path, the model identified by
 * model_id. chain_root != 0 (a restored file's, engine_kv_import) names the
 * chain instead of salt and lora: then the blocks must all be cached (no
 * salt to compute them under). Returns the tokens whose KV the file holds
 * (whole blocks), or -1 with err (no prefix cache or several KV pools, bad
 * ids, no free blocks now, a write failure). *bytes: the file's size. Same
 * thread rule as engine_embed. */
int64_t engine_kv_export(engine *e, const int32_t *ids, int64_t n, const char *salt,
                         const float *lora, uint64_t chain_root, const char *path,
                         const uint8_t model_id[16], uint64_t *bytes, kvl_error *err);
/* Reads such a file back into the prefix cache, under the chain it was
 * computed under (blocks the cache already holds are kept); *ids (malloc'd)
 * and *n_ids: the file's token ids, *chain_root its chain. Returns the tokens
 * whose KV is now cached, or -1 with err (a file of another model or cache
 * shape, damaged, no free blocks now). *bytes: the bytes read. Same thread
 * rule. */
int64_t engine_kv_import(engine *e, const char *path, const uint8_t model_id[16], int32_t **ids,
                         int64_t *n_ids, uint64_t *chain_root, uint64_t *bytes, kvl_error *err);

typedef struct engine_metrics {
    int64_t n_running, n_waiting;
    int64_t n_preemptions;
    int64_t prompt_tokens, generation_tokens;
    int64_t prefix_cache_queries, prefix_cache_hits; /* tokens looked up / found */
    int64_t kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_blocks_free;
    /* the same for each KV group (its own pool of blocks) */
    int n_kv_groups;
    int64_t kv_group_blocks[MODEL_MAX_KV_GROUPS], kv_group_used[MODEL_MAX_KV_GROUPS],
        kv_group_cached[MODEL_MAX_KV_GROUPS];
    int64_t steps;
    int64_t step_tokens_max; /* the most tokens one step computed */
    int64_t step_seqs_total; /* sequences in each step, summed (/ steps: the mean batch) */
    /* speculative decoding: verifications with drafts, tokens drafted, drafts
     * accepted (acceptance rate = accepted / drafted) */
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    kv_disk_stats kv_disk; /* the disk tier's (zeros without one) */
} engine_metrics;
engine_metrics engine_get_metrics(const engine *e);

/* ---- the live KV view ----
 * Events the engine logs for people watching it (engine_view.events): what
 * a and b hold depends on the kind. */
typedef enum engine_ev_kind {
    ENGINE_EV_ADMIT,          /* a: tokens to compute this step, b: tokens from the prefix cache */
    ENGINE_EV_PREFIX_HIT,     /* a: tokens found in the prefix cache, b: blocks */
    ENGINE_EV_PREEMPT,        /* a: blocks given back, b: tokens to recompute */
    ENGINE_EV_EVICT,          /* request_id 0; a: cached blocks evicted, b: KV group */
    ENGINE_EV_WINDOW_RELEASE, /* a: blocks out of the sliding window freed, b: KV group */
    ENGINE_EV_FINISH,         /* a: tokens generated, b: engine_finish */
} engine_ev_kind;
const char *engine_ev_kind_name(engine_ev_kind k); /* "admit", "prefix_hit", ... */

typedef struct engine_log_event {
    uint64_t seq; /* 1, 2, ...: a reader asks for the events after the last it saw */
    double t;     /* kvl_time_s() */
    int64_t request_id;
    int64_t a, b;
    int32_t kind; /* engine_ev_kind */
} engine_log_event;

#define ENGINE_EV_RING 1024 /* events kept */

typedef enum engine_seq_phase {
    ENGINE_PHASE_WAITING,
    ENGINE_PHASE_PREFILLING,
    ENGINE_PHASE_DECODING,
    ENGINE_PHASE_PREEMPTED
} engine_seq_phase;
const char *engine_phase_name(engine_seq_phase ph);

typedef struct engine_seq_view {
    int64_t id;
    int32_t phase; /* engine_seq_phase (waiting after a preemption: preempted) */
    int64_t n_prompt, n_generated, n_cached_prompt, n_computed, n_preemptions;
    double t_submit;
    kv_usage kv; /* over all groups, as engine_req_stats.kv */
    int64_t table_off[MODEL_MAX_KV_GROUPS],
        table_len[MODEL_MAX_KV_GROUPS]; /* in engine_view.tables */
    /* the request as submitted (llama-server's GET /slots shows them) */
    sampler_params sampling;
    int64_t max_tokens;
    int top_logprobs;
    bool ignore_eos, speculative;
    int32_t last_token; /* the last generated id; -1 before the first */
} engine_seq_view;

/* A copy of the engine's KV state: every block of every pool, every sequence
 * (running, then waiting in queue order) with its block tables, the metrics
 * and the events after a given number. Taken by the thread that drives
 * engine_step (a plain copy: O(blocks + table entries)); read anywhere after. */
typedef struct engine_view {
    double t;
    engine_metrics metrics;
    bool prefix_cache;
    int n_groups, block_size;
    int64_t n_blocks;                    /* per pool */
    int32_t window[MODEL_MAX_KV_GROUPS]; /* 0: no sliding window */
    int32_t chunk[MODEL_MAX_KV_GROUPS];  /* 0: no attention chunks */
    size_t block_bytes[MODEL_MAX_KV_GROUPS];
    int64_t n_evicted[MODEL_MAX_KV_GROUPS];
    kv_block_info *blocks[MODEL_MAX_KV_GROUPS]; /* n_blocks each */
    engine_seq_view *seqs;
    int n_seqs;
    size_t cap_seqs;
    int32_t *tables; /* block ids, -1: dropped (out of the window or chunk) */
    int64_t n_tables;
    size_t cap_tables;
    int64_t prefix_lookups, prefix_hits; /* admissions that looked up / found cached blocks */
    engine_log_event events[ENGINE_EV_RING];
    int n_events;
    uint64_t next_event; /* number the next event will get */
} engine_view;

/* Sizes the block arrays (any thread: reads only the engine's fixed shape). */
bool engine_view_prepare(const engine *e, engine_view *v);
/* Fills v (prepared) with events numbered above events_since. False on out of memory. */
bool engine_view_take(const engine *e, engine_view *v, uint64_t events_since);
void engine_view_free(engine_view *v);

/* Teacher-forced evaluation (no sampling): runs ids[0..n) through the model in
 * one fresh sequence and calls on_logits(pos, logits, user) for every position,
 * in order. Used by `score` and `perplexity`. */
typedef void (*engine_logits_fn)(int64_t pos, const float *logits, void *user);
bool engine_eval(model *m, int kv_dtype, int kv_dtype_v, int block_size, const int32_t *ids,
                 int64_t n, engine_logits_fn on_logits, void *user, kvl_error *err);

/* Prompt log-probabilities (OpenAI's echo with logprobs, vLLM's
 * prompt_logprobs): for each position p in 1..n-1, lp[p] = log P(ids[p] |
 * ids[0..p)), lp[0] = NAN, the top_k likeliest tokens there into top_ids /
 * top_lps (rows of top_k, by descending logit; row 0 unused) and, unless rank
 * is NULL, rank[p] = how many tokens are at least as likely as ids[p] (vLLM's
 * rank; rank[0] = 0). lora as engine_embed. Runs like engine_embed: on the
 * thread that drives engine_step, between steps, in a sequence of its own
 * (the prefix cache is not touched). */
bool engine_prompt_logprobs(engine *e, const int32_t *ids, int64_t n, const float *lora, int top_k,
                            float *lp, int32_t *top_ids, float *top_lps, int32_t *rank,
                            kvl_error *err);

/* Embeddings: the model's final hidden state (after the output norm) pooled
 * over ids and normalised into out (n_embd floats) as llama.cpp's
 * embd_normalize says: 2 L2 (what embedding endpoints return by default), -1
 * none, 0 the largest magnitude to 32760, p > 0 the p-norm. Runs one sequence of
 * its own through this engine's pools and frees its blocks before returning,
 * so it must be called by the thread that drives engine_step, between steps.
 * False with err set when ids are invalid or the pool has no room right now. */
typedef enum engine_pooling { ENGINE_POOL_LAST, ENGINE_POOL_MEAN, ENGINE_POOL_CLS } engine_pooling;
/* lora: the LoRA adapters' scales (model_batch.lora), NULL for the model's defaults. */
bool engine_embed(engine *e, const int32_t *ids, int64_t n, engine_pooling pooling, int normalize,
                  const float *lora, float *out, kvl_error *err);
/* Reranking (llama.cpp's rank pooling): the scores of the model's classifier
 * head on the last token's final hidden state, model_hp()->n_cls_out floats
 * into out (model_classify). Called as engine_embed. */
bool engine_rank(engine *e, const int32_t *ids, int64_t n, const float *lora, float *out,
                 kvl_error *err);

#endif
