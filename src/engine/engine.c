/* engine: scheduler, sequences and streaming. See engine.h. */
#include "engine.h"
#include "spec.h"
#include "engine_events.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOP_LOGPROBS 20

typedef enum seq_state { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE } seq_state;

typedef struct seq {
    int64_t id;
    seq_state state;
    engine_request req; /* stop strings, prompt: engine-owned copies */
    char **stop;
    int32_t *tokens; /* prompt followed by generated ids */
    int64_t n_tokens, cap_tokens;
    int64_t n_prompt;
    int64_t n_computed;             /* tokens whose K/V are in the blocks */
    int64_t recompute_for;          /* --no-kv-cache: n_tokens the current recompute serves */
    kv_seq kv[MODEL_MAX_KV_GROUPS]; /* one block table per KV group (group 0: prefix chain) */
    sampler *smp;
    grammar_state *gst; /* the grammar's position (NULL: unconstrained); it lives
                                with the sequence, so preemption does not touch it */
    tok_stream stream;
    char *text; /* generated text not yet released (held for stop strings) */
    size_t text_len, text_cap;
    uint64_t text_base; /* offset of text[0] in all the text generated */
    stop_matcher stops; /* over all the text generated, one byte at a time */
    engine_req_stats stats;
    bool cancelled;
    int32_t draft[ENGINE_SPEC_MAX_K]; /* this step's drafts, after tokens[n_tokens - 1] */
    int n_draft;                      /* 0 outside a step, and for a plain decode */
    int n_accepted;                   /* of this step's drafts */
    spec_adapt adapt;
    spec_dseq dseq;     /* the draft model's KV of this sequence */
    int passed_over;    /* admissions that preferred a later request (prefix-aware) */
    kv_disk_load *load; /* its prefix being read from the disk tier: waits until ready */
    struct seq *next;   /* in the waiting queue or the running list */
} seq;

struct engine {
    model *m;
    const tok_vocab *vocab;
    engine_config cfg;
    kv_pool *kv[MODEL_MAX_KV_GROUPS]; /* one pool per KV group (full / sliding layers) */
    int32_t window[MODEL_MAX_KV_GROUPS];
    int n_groups;
    bool prefix_cache;     /* enabled and possible for this model */
    bool spec;             /* speculative decoding enabled and possible */
    int64_t spec_left;     /* draft tokens still allowed this step */
    spec_drafter *drafter; /* ENGINE_SPEC_DRAFT */
    kv_disk *disk;         /* second tier of the prefix cache (NULL: none) */
    bool disk_wake;        /* engine_set_disk_wake given: engine_step never sleeps on reads */
    bool disk_stalled;     /* the last step planned nothing while reads were in flight */
    int64_t next_id;
    seq *waiting;  /* FIFO; preempted sequences go to the front */
    seq **running; /* in admission order (newest last) */
    int n_running;
    engine_metrics metrics;
    engine_ev_ring *events; /* the live view's log (engine_events.h) */
    int64_t n_evicted_seen[MODEL_MAX_KV_GROUPS];
    /* per-step batch, sized once */
    int32_t *b_tokens, *b_pos, *b_seq;
    uint8_t *b_want;
    const kv_seq **b_seqs;
    seq **b_owner;     /* running sequence of each batch seq index */
    float *logits;     /* [max_seqs][n_vocab] */
    float *logits_tmp; /* [n_vocab] sampler input */
    uint32_t *mask;    /* [n_vocab bits] tokens a grammar allows this step */
    char *piece;       /* token text scratch */
    size_t piece_cap;

    /* speculative decoding's per-step state */
    spec_draft_job *draft_jobs; /* [max_seqs] one step's draft-model jobs */
    spec_cost cost;             /* measured step times: what drafts cost */
    double step_draft_s;        /* this step's draft-model time (counted apart) */
};

void engine_config_default(engine_config *c) {
    c->n_ctx = 0;
    c->block_size = 16;
    c->kv_dtype = GGUF_DT_F16;
    c->kv_dtype_v = -1;
    c->n_blocks = 0;
    c->max_batch_tokens = 2048;
    c->max_seqs = 64;
    c->no_kv_cache = false;
    c->prefix_cache = true;
    c->spec = ENGINE_SPEC_OFF;
    c->spec_k = 4;
    c->spec_ngram = 3;
    c->spec_max_batch = 32;
    c->spec_fixed = false;
    c->kv_disk = NULL;
    c->scheduling = ENGINE_SCHED_FCFS;
    c->prefix_admission_wait = 0;
}

bool engine_spec_parse(const char *name, engine_spec_mode *mode) {
    if (strcmp(name, "off") == 0) *mode = ENGINE_SPEC_OFF;
    else if (strcmp(name, "ngram") == 0) *mode = ENGINE_SPEC_NGRAM;
    else if (strcmp(name, "draft") == 0) *mode = ENGINE_SPEC_DRAFT;
    else return false;
    return true;
}

/* ---------------------------------------------------------- create/free -- */

static bool alloc_batch(engine *e, kvl_error *err) {
    int64_t T = e->cfg.max_batch_tokens, S = e->cfg.max_seqs, V = model_hp(e->m)->n_vocab;
    int64_t rows = S + (e->spec ? e->cfg.spec_max_batch : 0); /* a draft's logits take a row */
    e->b_tokens = malloc(T * sizeof(int32_t));
    e->b_pos = malloc(T * sizeof(int32_t));
    e->b_seq = malloc(T * sizeof(int32_t));
    e->b_want = malloc(T);
    e->b_seqs = malloc(S * e->n_groups * sizeof(kv_seq *));
    e->b_owner = malloc(S * sizeof(seq *));
    e->running = malloc(S * sizeof(seq *));
    e->logits = kvl_alloc(rows * V * sizeof(float));
    e->logits_tmp = kvl_alloc(V * sizeof(float));
    e->mask = malloc((V + 31) / 32 * sizeof(uint32_t));
    e->piece_cap = 1024;
    e->piece = malloc(e->piece_cap);
    e->events = calloc(1, sizeof *e->events);
    if (e->drafter && !(e->draft_jobs = malloc(S * sizeof *e->draft_jobs)))
        return kvl_fail(err, "engine: out of memory");
    if (!e->events || !e->b_tokens || !e->b_pos || !e->b_seq || !e->b_want || !e->b_seqs ||
        !e->b_owner || !e->running || !e->logits || !e->logits_tmp || !e->mask || !e->piece)
        return kvl_fail(err, "engine: out of memory");
    return true;
}

engine *engine_create(model *m, const tok_vocab *vocab, const engine_config *c, kvl_error *err) {
    engine *e = calloc(1, sizeof *e);
    if (!e) {
        kvl_fail(err, "engine: out of memory");
        return NULL;
    }
    e->m = m;
    e->vocab = vocab;
    e->cfg = *c;
    const model_hparams *hp = model_hp(m);
    if (e->cfg.n_ctx <= 0) e->cfg.n_ctx = hp->n_ctx_train;
    if (e->cfg.block_size <= 0 || e->cfg.max_seqs <= 0 || e->cfg.max_batch_tokens <= 0) {
        kvl_fail(err, "engine: block size, max seqs and batch tokens must be positive");
        goto fail;
    }
    /* Default pool: every running sequence can reach the full context. */
    if (e->cfg.n_blocks <= 0)
        e->cfg.n_blocks =
            (e->cfg.n_ctx + e->cfg.block_size - 1) / e->cfg.block_size * e->cfg.max_seqs;
    e->n_groups = model_kv_n_groups(m);
    for (int g = 0; g < e->n_groups; g++) {
        kv_pool_config kc;
        model_kv_group_shape(m, g, &kc, &e->window[g]);
        kc.block_size = e->cfg.block_size;
        kc.dtype = e->cfg.kv_dtype;
        kc.split_v = e->cfg.kv_dtype_v >= 0;
        kc.dtype_v = e->cfg.kv_dtype_v;
        kc.n_blocks = e->cfg.n_blocks;
        e->kv[g] = kv_pool_create(&kc, err);
        if (!e->kv[g]) goto fail;
    }
    /* Sliding-window blocks are dropped as they leave the window, so a chain of
     * full blocks cannot be rebuilt from them: prefix caching needs one full-attention group. */
    e->prefix_cache =
        e->cfg.prefix_cache && !e->cfg.no_kv_cache && e->n_groups == 1 && e->window[0] == 0;
    if (e->cfg.spec != ENGINE_SPEC_OFF &&
        (e->cfg.spec_k < 1 || e->cfg.spec_k > ENGINE_SPEC_MAX_K || e->cfg.spec_ngram < 1 ||
         e->cfg.spec_ngram > ENGINE_SPEC_MAX_NGRAM || e->cfg.spec_max_batch < 2)) {
        kvl_fail(err,
                 "engine: speculative decoding needs 1 <= spec_k <= %d, 1 <= spec_ngram <= %d and "
                 "spec_max_batch >= 2 (got %d, %d, %d)",
                 ENGINE_SPEC_MAX_K, ENGINE_SPEC_MAX_NGRAM, e->cfg.spec_k, e->cfg.spec_ngram,
                 e->cfg.spec_max_batch);
        goto fail;
    }
    e->spec = e->cfg.spec != ENGINE_SPEC_OFF &&
              !e->cfg.no_kv_cache; /* recomputing everything: nothing to gain */
    spec_cost_init(&e->cost);
    if (e->spec && e->cfg.spec == ENGINE_SPEC_DRAFT) {
        if (!e->cfg.draft_model) {
            kvl_fail(err, "engine: draft speculation needs a draft model");
            goto fail;
        }
        if (model_hp(e->cfg.draft_model)->n_vocab != hp->n_vocab) {
            kvl_fail(err, "engine: the draft model's vocabulary has %lld tokens, the model's %lld",
                     (long long)model_hp(e->cfg.draft_model)->n_vocab, (long long)hp->n_vocab);
            goto fail;
        }
        e->drafter = spec_drafter_create(e->cfg.draft_model, e->cfg.block_size, e->cfg.kv_dtype,
                                         e->cfg.n_blocks, err);
        if (!e->drafter) goto fail;
    }
    e->cfg.kv_disk = NULL; /* the caller's config is not kept */
    if (c->kv_disk) {
        if (!e->prefix_cache) {
            kvl_fail(err, "engine: the KV disk tier needs the prefix cache (on, a KV cache, and no "
                          "sliding-window layers)");
            goto fail;
        }
        if (!(e->disk = kv_disk_open(c->kv_disk, e->kv[0], err))) goto fail;
    }
    if (!alloc_batch(e, err)) goto fail;
    return e;
fail:
    engine_destroy(e);
    return NULL;
}

static void seq_free(engine *e, seq *s) {
    if (!s) return;
    if (s->load) kv_disk_load_cancel(e->disk, s->load); /* its reserved blocks go back */
    spec_dseq_release(e->drafter, &s->dseq, true);
    for (int g = 0; g < e->n_groups; g++) kv_seq_free(e->kv[g], &s->kv[g]);
    sampler_destroy(s->smp);
    grammar_state_free(s->gst);
    stop_matcher_free(&s->stops);
    for (int i = 0; i < s->req.n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->tokens);
    free(s->text);
    free(s);
}

void engine_destroy(engine *e) {
    if (!e) return;
    while (e->waiting) {
        seq *s = e->waiting;
        e->waiting = s->next;
        seq_free(e, s);
    }
    for (int i = 0; i < e->n_running; i++) seq_free(e, e->running[i]);
    kv_disk_close(e->disk); /* before the pool: it writes what RAM still caches */
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) kv_pool_destroy(e->kv[g]);
    spec_drafter_destroy(e->drafter);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_want);
    free(e->b_seqs);
    free(e->b_owner);
    free(e->running);
    kvl_free(e->logits);
    kvl_free(e->logits_tmp);
    free(e->mask);
    free(e->piece);
    free(e->events);
    free(e->draft_jobs);
    free(e);
}

kv_pool *engine_kv(engine *e) { return e->kv[0]; }
int engine_kv_n_groups(const engine *e) { return e->n_groups; }
bool engine_prefix_cache_enabled(const engine *e) { return e->prefix_cache; }
kv_disk *engine_kv_disk(engine *e) { return e->disk; }

void engine_set_disk_wake(engine *e, void (*fn)(void *user), void *user) {
    if (!e->disk) return;
    kv_disk_set_notify(e->disk, fn, user);
    e->disk_wake = fn != NULL;
}

bool engine_waiting_on_disk(engine *e) { return e->disk_stalled && kv_disk_loads_pending(e->disk); }
kv_pool *engine_kv_group(engine *e, int group) { return e->kv[group]; }
const engine_config *engine_cfg(const engine *e) { return &e->cfg; }
bool engine_has_work(const engine *e) {
    /* a cancelled request's read still in flight: a later step gives its blocks back */
    return e->waiting || e->n_running > 0 || (e->disk && kv_disk_has_loads(e->disk));
}

engine_metrics engine_get_metrics(const engine *e) {
    engine_metrics m = e->metrics;
    m.n_running = e->n_running;
    m.kv_blocks_total = m.kv_blocks_free = m.kv_blocks_used = m.kv_blocks_cached = 0;
    for (int g = 0; g < e->n_groups; g++) {
        m.kv_blocks_total += kv_pool_cfg(e->kv[g])->n_blocks;
        m.kv_blocks_free += kv_pool_n_free(e->kv[g]);
        m.kv_blocks_used += kv_pool_n_used(e->kv[g]);
        m.kv_blocks_cached += kv_pool_n_cached(e->kv[g]);
    }
    m.n_waiting = 0;
    for (seq *s = e->waiting; s; s = s->next) m.n_waiting++;
    if (e->disk) m.kv_disk = kv_disk_get_stats(e->disk);
    return m;
}

/* --------------------------------------------------------------- submit -- */

static bool validate_request(engine *e, const engine_request *r, kvl_error *err) {
    const model_hparams *hp = model_hp(e->m);
    if (r->n_prompt <= 0) return kvl_fail(err, "the prompt is empty");
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= hp->n_vocab)
            return kvl_fail(err, "prompt token %lld: id %d is not in the vocabulary (0..%lld)",
                            (long long)i, r->prompt[i], (long long)hp->n_vocab - 1);
    if (r->grammar && !e->vocab) return kvl_fail(err, "a grammar needs the engine's vocabulary");
    if (r->n_stop < 0 || r->n_stop > ENGINE_MAX_STOP)
        return kvl_fail(err, "%d stop strings: at most %d are supported", r->n_stop,
                        ENGINE_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++)
        if (strlen(r->stop[i]) > ENGINE_MAX_STOP_BYTES)
            return kvl_fail(err, "stop string %d is %zu bytes long: at most %d are supported", i,
                            strlen(r->stop[i]), ENGINE_MAX_STOP_BYTES);
    if (r->top_logprobs < 0 || r->top_logprobs > MAX_TOP_LOGPROBS)
        return kvl_fail(err, "top_logprobs must be between 0 and %d", MAX_TOP_LOGPROBS);
    if (r->priority != 0 && e->cfg.scheduling != ENGINE_SCHED_PRIORITY)
        return kvl_fail(err,
                        "priority %d given, but priority scheduling is off (the policy is fcfs)",
                        r->priority);
    int64_t want = r->n_prompt + (r->max_tokens > 0 ? r->max_tokens : 1);
    if (r->n_prompt >= e->cfg.n_ctx || (r->max_tokens > 0 && want > e->cfg.n_ctx))
        return kvl_fail(err,
                        "prompt (%lld tokens) + max_tokens (%lld) exceeds the context size %lld",
                        (long long)r->n_prompt, (long long)(r->max_tokens > 0 ? r->max_tokens : 0),
                        (long long)e->cfg.n_ctx);
    int64_t blocks = (want + e->cfg.block_size - 1) / e->cfg.block_size;
    if (blocks > e->cfg.n_blocks)
        return kvl_fail(err, "request needs %lld KV blocks but the pool has only %lld",
                        (long long)blocks, (long long)e->cfg.n_blocks);
    return true;
}

static bool copy_request(seq *s, const engine_request *r, int32_t n_vocab) {
    s->req = *r;
    s->req.n_stop = 0; /* counts the copies made, for seq_free */
    s->cap_tokens = r->n_prompt + (r->max_tokens > 0 ? r->max_tokens : 256) + 1;
    s->tokens = malloc(s->cap_tokens * sizeof(int32_t));
    s->smp = sampler_create(&r->sampling, n_vocab);
    s->stop = calloc(r->n_stop > 0 ? r->n_stop : 1, sizeof(char *));
    if (r->grammar && !(s->gst = grammar_state_new(r->grammar))) return false;
    if (!s->tokens || !s->smp || !s->stop) return false;
    memcpy(s->tokens, r->prompt, r->n_prompt * sizeof(int32_t));
    s->n_tokens = s->n_prompt = r->n_prompt;
    for (int i = 0; i < r->n_stop; i++) {
        if (!(s->stop[i] = strdup(r->stop[i]))) return false;
        s->req.n_stop = i + 1; /* seq_free frees the strings copied so far */
    }
    if (!stop_matcher_init(&s->stops, (const char *const *)s->stop, r->n_stop)) return false;
    s->req.prompt = NULL;
    s->req.stop = NULL;
    s->req.cache_salt = NULL;
    s->req.grammar = NULL; /* the state holds it */
    return true;
}

int64_t engine_submit(engine *e, const engine_request *r, kvl_error *err) {
    if (!validate_request(e, r, err)) return -1;
    seq *s = calloc(1, sizeof *s);
    if (!s || !copy_request(s, r, (int32_t)model_hp(e->m)->n_vocab)) {
        seq_free(e, s);
        kvl_fail(err, "engine: out of memory");
        return -1;
    }
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) {
        kv_seq_init(&s->kv[g]);
        kv_seq_set_cache_salt(&s->kv[g], r->cache_salt);
    }
    tok_stream_init(&s->stream);
    s->id = ++e->next_id; /* ids start at 1 so that 0 can mean "none" */
    s->state = SEQ_WAITING;
    s->stats.n_prompt = r->n_prompt;
    s->stats.t_submit = kvl_time_s();
    spec_adapt_init(&s->adapt);
    spec_dseq_init(&s->dseq);
    seq **tail = &e->waiting;
    while (*tail) tail = &(*tail)->next;
    *tail = s;
    e->metrics.prompt_tokens += r->n_prompt;
    return s->id;
}

void engine_cancel(engine *e, int64_t id) {
    for (seq *s = e->waiting; s; s = s->next)
        if (s->id == id) s->cancelled = true;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) e->running[i]->cancelled = true;
}

/* -------------------------------------------------------------- outputs -- */

static void emit(seq *s, int32_t token, const char *text, size_t len, float logprob, int n_top,
                 const int32_t *top_ids, const float *top_lp, engine_finish finish) {
    if (!s->req.on_event) return;
    engine_event ev = {.request_id = s->id,
                       .token = token,
                       .text = text,
                       .text_len = len,
                       .logprob = logprob,
                       .n_top = n_top,
                       .top_ids = top_ids,
                       .top_logprobs = top_lp,
                       .finish = finish,
                       .stats = finish != ENGINE_FINISH_NONE ? &s->stats : NULL};
    s->req.on_event(&ev, s->req.user);
}

static bool text_append(seq *s, const char *p, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 256;
        while (cap < s->text_len + n + 1) cap *= 2;
        char *t = realloc(s->text, cap);
        if (!t) return false;
        s->text = t;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    stop_matcher_feed(&s->stops, p, n);
    return true;
}

/* Offset in the held text of the earliest stop string found, or -1. A match
 * never starts before the held text: its prefix was held back (stop_holdback). */
static int64_t find_stop(const seq *s) {
    if (s->stops.first < 0) return -1;
    int64_t at = s->stops.first - (int64_t)s->text_base;
    return at < 0 ? 0 : at;
}

/* Bytes at the end of the held text that could still grow into a stop string. */
static size_t stop_holdback(const seq *s) {
    size_t hold = stop_matcher_pending(&s->stops);
    return hold < s->text_len ? hold : s->text_len;
}

static void consume_text(seq *s, size_t n) {
    memmove(s->text, s->text + n, s->text_len - n);
    s->text_len -= n;
    s->text_base += n;
    if (s->text) s->text[s->text_len] = 0;
}

/* KV held by a sequence over all groups; a sliding group's lower bound counts
 * only the window it must keep. */
static kv_usage seq_usage(const engine *e, seq *s) {
    kv_usage u = {.tokens = s->n_computed};
    s->stats.n_kv_groups = e->n_groups;
    for (int g = 0; g < e->n_groups; g++) {
        s->stats.kv_group[g] =
            kv_seq_usage(e->kv[g], &s->kv[g], kv_window_kept(s->n_computed, e->window[g]));
        s->stats.kv_group_window[g] = e->window[g];
        kv_usage_add(&u, &s->stats.kv_group[g]);
    }
    return u;
}

static void finish_seq(engine *e, seq *s, engine_finish why, int32_t token, float lp, int n_top,
                       const int32_t *ids, const float *lps) {
    char tail[16];
    size_t nt = tok_stream_flush(&s->stream, tail, sizeof tail);
    text_append(s, tail, nt);
    int64_t stop_at = why == ENGINE_FINISH_CANCELLED ? -1 : find_stop(s);
    size_t len = stop_at >= 0 ? (size_t)stop_at : s->text_len;
    s->stats.t_end = kvl_time_s();
    if (s->stats.t_first_token == 0) s->stats.t_first_token = s->stats.t_end;
    s->stats.kv = seq_usage(e, s);
    ev_ring_push(e->events, ENGINE_EV_FINISH, s->id, s->stats.n_generated, why);
    emit(s, token, s->text, len, lp, n_top, ids, lps, why);
    s->state = SEQ_DONE;
    for (int g = 0; g < e->n_groups; g++) kv_seq_release(e->kv[g], &s->kv[g]);
    spec_dseq_release(e->drafter, &s->dseq, false);
}

static bool keeps_special(const seq *s, int32_t tok) {
    for (int i = 0; i < s->req.n_keep_special && i < ENGINE_MAX_KEEP_SPECIAL; i++)
        if (s->req.keep_special[i] == tok) return true;
    return false;
}

/* Handles one sampled token: stop conditions, text streaming. */
static void on_token(engine *e, seq *s, int32_t tok, float lp, int n_top, const int32_t *ids,
                     const float *lps) {
    s->stats.n_generated++;
    e->metrics.generation_tokens++;
    if (s->stats.t_first_token == 0) {
        s->stats.t_first_token = kvl_time_s();
        s->stats.t_prefill_s = s->stats.t_first_token - s->stats.t_submit;
    }
    /* Under a grammar, an end-of-generation token was only sampled because the
     * grammar can end here: it ends the request even with ignore_eos. */
    if ((s->gst || !s->req.ignore_eos) && tok_is_eog(e->vocab, tok)) {
        finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
        return;
    }
    if (s->gst &&
        !grammar_state_accept_token(s->gst, tok)) { /* the mask allowed it: cannot happen */
        kvl_log(KVL_LOG_WARN, "engine: request %lld: token %d does not continue its grammar",
                (long long)s->id, tok);
        finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
        return;
    }
    s->tokens[s->n_tokens++] = tok;
    sampler_accept(s->smp, tok);
    bool special = keeps_special(s, tok);
    size_t need =
        3 * tok_token_bytes(e->vocab, tok, special, NULL, 0) + 16; /* U+FFFD may triple bytes */
    if (need > e->piece_cap) {
        char *p = realloc(e->piece, need);
        if (p) {
            e->piece = p;
            e->piece_cap = need;
        }
    }
    size_t n = tok_stream_push(&s->stream, e->vocab, tok, special, e->piece, e->piece_cap);
    text_append(s, e->piece, n);
    if (find_stop(s) >= 0) {
        finish_seq(e, s, ENGINE_FINISH_STOP, tok, lp, n_top, ids, lps);
        return;
    }
    bool at_max = s->req.max_tokens > 0 && s->stats.n_generated >= s->req.max_tokens;
    bool at_ctx = s->n_tokens >= e->cfg.n_ctx;
    if (at_max || at_ctx) {
        finish_seq(e, s, ENGINE_FINISH_LENGTH, tok, lp, n_top, ids, lps);
        return;
    }
    if (s->n_tokens == s->cap_tokens) { /* only when max_tokens < 0 */
        int32_t *t = realloc(s->tokens, s->cap_tokens * 2 * sizeof(int32_t));
        if (!t) {
            finish_seq(e, s, ENGINE_FINISH_LENGTH, tok, lp, n_top, ids, lps);
            return;
        }
        s->tokens = t;
        s->cap_tokens *= 2;
    }
    size_t out = s->text_len - stop_holdback(s); /* the rest may still become a stop string */
    emit(s, tok, s->text, out, lp, n_top, ids, lps, ENGINE_FINISH_NONE);
    consume_text(s, out);
}

/* ------------------------------------------------------------ scheduler -- */

static void running_remove(engine *e, int idx) {
    memmove(e->running + idx, e->running + idx + 1, (e->n_running - idx - 1) * sizeof(seq *));
    e->n_running--;
}

/* Drops the sequence's blocks (cached ones stay findable) and its progress. */
static void seq_forget_kv(engine *e, seq *s) {
    for (int g = 0; g < e->n_groups; g++) kv_seq_release(e->kv[g], &s->kv[g]);
    spec_dseq_release(e->drafter, &s->dseq, false);
    s->n_computed = 0;
}

/* Attaches the longest cached prefix of full blocks to a sequence about to be
 * admitted. The last token is never taken from the cache: its logits are needed.
 * False while blocks of it are being read from the disk tier (the sequence
 * waits; the others go on). */
static bool prefix_attach(engine *e, seq *s) {
    if (!e->prefix_cache || s->n_computed > 0) return true;
    if (e->disk) {
        int64_t from_disk = 0, have = kv_disk_prefix_step(e->disk, &s->kv[0], s->tokens,
                                                          s->n_tokens - 1, &s->load, &from_disk);
        if (s->stats.n_generated == 0) s->stats.n_disk_prompt += from_disk;
        if (s->load) return false;
        s->n_computed = have;
    } else {
        s->n_computed = kv_prefix_match(e->kv[0], &s->kv[0], s->tokens, s->n_tokens - 1);
    }
    e->metrics.prefix_cache_queries += s->n_tokens;
    e->metrics.prefix_cache_hits += s->n_computed;
    if (s->stats.n_generated == 0) {
        s->stats.n_cached_prompt = s->n_computed;
        if (s->stats.n_disk_prompt > s->n_computed) s->stats.n_disk_prompt = s->n_computed;
    }
    return true;
}

/* Whether s waits for a read from the disk tier that is not done yet. */
static bool seq_loading(const engine *e, const seq *s) {
    return s->load && !kv_disk_load_ready(e->disk, s->load);
}

/* Adds s to the running list. Under priority scheduling the list stays sorted
 * by priority (admission order within a value), so the last one is always the
 * one to preempt and the plan serves the most urgent first. */
static void running_add(engine *e, seq *s) {
    int at = e->n_running;
    if (e->cfg.scheduling == ENGINE_SCHED_PRIORITY)
        while (at > 0 && e->running[at - 1]->req.priority > s->req.priority) at--;
    memmove(e->running + at + 1, e->running + at, (e->n_running - at) * sizeof(seq *));
    e->running[at] = s;
    e->n_running++;
}

/* Prompt tokens of s the RAM prefix cache holds now (nothing attached). */
static int64_t cached_prefix(const engine *e, const seq *s) {
    return kv_prefix_probe(e->kv[0], s->kv[0].chain_root, s->tokens, s->n_tokens - 1);
}

/* The link of the waiting sequence to admit next (NULL: none waits). An
 * admission (admit true) counts the pass-over of the one next in order. */
static seq **pick_waiting(engine *e, bool admit) {
    enum { PREFIX_SCAN = 32 }; /* waiting requests compared by cached prefix */
    seq **best = &e->waiting;
    while (*best && seq_loading(e, *best)) best = &(*best)->next;
    if (!*best) return NULL;
    if (e->cfg.scheduling ==
        ENGINE_SCHED_PRIORITY) /* the first of the lowest value: list order is arrival */
        for (seq **pp = &(*best)->next; *pp; pp = &(*pp)->next)
            if ((*pp)->req.priority < (*best)->req.priority && !seq_loading(e, *pp)) best = pp;
    if (e->cfg.prefix_admission_wait <= 0 || !e->prefix_cache ||
        (*best)->passed_over >= e->cfg.prefix_admission_wait)
        return best;
    seq **pick = best;
    int64_t most = cached_prefix(e, *best);
    int n = 0;
    for (seq **pp = &e->waiting; *pp && n < PREFIX_SCAN; pp = &(*pp)->next, n++) {
        if (*pp == *best || (*pp)->req.priority != (*best)->req.priority || (*pp)->n_computed > 0 ||
            (*pp)->load)
            continue;
        int64_t h = cached_prefix(e, *pp);
        if (h > most) {
            most = h;
            pick = pp;
        }
    }
    if (pick != best && admit) (*best)->passed_over++;
    return pick;
}

/* Preempts the newest running sequence (under priority scheduling: the newest
 * of the highest priority value) by recompute: its blocks are freed and it
 * goes to the front of the queue with everything it generated so far. */
static void preempt_newest(engine *e) {
    seq *s = e->running[e->n_running - 1];
    running_remove(e, e->n_running - 1);
    ev_ring_push(e->events, ENGINE_EV_PREEMPT, s->id, kv_seq_n_held(&s->kv[0]), s->n_tokens);
    seq_forget_kv(e, s);
    s->state = SEQ_WAITING;
    s->stats.n_preemptions++;
    e->metrics.n_preemptions++;
    s->next = e->waiting;
    e->waiting = s;
}

typedef struct step_plan {
    int64_t n_tokens;
    int n_seqs;
} step_plan;

/* Adds tokens [n_computed, n_computed + n) of s to the batch. */
static void plan_add(engine *e, step_plan *p, seq *s, int64_t n) {
    int si = p->n_seqs++;
    for (int g = 0; g < e->n_groups; g++) e->b_seqs[si * e->n_groups + g] = &s->kv[g];
    e->b_owner[si] = s;
    for (int64_t i = 0; i < n; i++) {
        int64_t pos = s->n_computed + i;
        e->b_tokens[p->n_tokens] = pos < s->n_tokens ? s->tokens[pos] : s->draft[pos - s->n_tokens];
        e->b_pos[p->n_tokens] = (int32_t)pos;
        e->b_seq[p->n_tokens] = si;
        e->b_want[p->n_tokens] = pos >= s->n_tokens - 1; /* the last token's and every draft's */
        p->n_tokens++;
    }
}

/* Tokens of s to compute this step under the remaining budget, with blocks
 * reserved for them; 0 if no block can be had. */
static int64_t reserve_chunk(engine *e, seq *s, int64_t budget) {
    int64_t n = s->n_tokens + s->n_draft - s->n_computed;
    if (n > budget) n = budget;
    if (n <= 0) return 0;
    int64_t before[MODEL_MAX_KV_GROUPS];
    for (int g = 0; g < e->n_groups; g++) {
        /* A sliding group keeps only what the next token's window can see. */
        int64_t dropped =
            kv_seq_drop_outside_window(e->kv[g], &s->kv[g], s->n_computed, e->window[g]);
        if (dropped > 0) ev_ring_push(e->events, ENGINE_EV_WINDOW_RELEASE, s->id, dropped, g);
        before[g] = s->kv[g].n_blocks;
        if (!kv_seq_reserve(e->kv[g], &s->kv[g], s->n_computed + n)) {
            for (int k = 0; k < g; k++)
                kv_seq_truncate(e->kv[k], &s->kv[k], before[k]); /* all or nothing */
            return 0;
        }
    }
    return n;
}

static void drop_cancelled(engine *e) {
    for (int i = 0; i < e->n_running;) {
        seq *s = e->running[i];
        if (!s->cancelled) {
            i++;
            continue;
        }
        running_remove(e, i);
        finish_seq(e, s, ENGINE_FINISH_CANCELLED, -1, 0, 0, NULL, NULL);
        seq_free(e, s);
    }
    for (seq **pp = &e->waiting; *pp;) {
        seq *s = *pp;
        if (!s->cancelled) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        finish_seq(e, s, ENGINE_FINISH_CANCELLED, -1, 0, 0, NULL, NULL);
        seq_free(e, s);
    }
}

/* Whether s should wait for its prefix leader to put the shared prompt blocks
 * in the cache (leader queued or still prefilling them). */
static bool leader_prefilling(const engine *e, const seq *s) {
    if (!e->prefix_cache || s->req.prefix_leader <= 0 || s->n_computed > 0) return false;
    int64_t want = (s->n_prompt - 1) / e->cfg.block_size; /* full blocks the follower can reuse */
    for (int i = 0; i < e->n_running; i++) {
        const seq *l = e->running[i];
        if (l->id == s->req.prefix_leader)
            return l->kv[0].n_hashed < want && l->n_computed < l->n_prompt;
    }
    return false; /* finished, or queued behind s (after a preemption): do not wait */
}

/* Drafts for s, a sequence about to decode one token, into s->draft: only
 * while the step is small, never past max_tokens or the context, and as many
 * as pay for themselves (spec_adapt: its acceptance so far against the
 * measured cost of a larger step). later: running sequences after s. */
static int propose_drafts(engine *e, seq *s, int64_t planned, int later, int64_t budget) {
    if (s->req.no_speculative || s->n_tokens - s->n_computed != 1 || s->stats.n_generated == 0)
        return 0;
    int64_t k = e->cfg.spec_k, room = e->cfg.spec_max_batch - planned - 1;
    if (room < k) k = room;
    if (e->spec_left < k) k = e->spec_left;
    if (budget - 1 < k) k = budget - 1;
    if (e->cfg.n_ctx - s->n_tokens < k)
        k = e->cfg.n_ctx - s->n_tokens; /* drafts stay inside the context */
    if (s->req.max_tokens > 0 && s->req.max_tokens - s->stats.n_generated - 1 < k)
        k = s->req.max_tokens - s->stats.n_generated -
            1; /* with the token after them: max_tokens at most */
    if (k <= 0) return 0;
    const int64_t base = planned + 1 + later; /* the step's tokens without these drafts */
    if (!e->drafter) {
        int matched;
        int m = spec_ngram_propose(s->tokens, s->n_tokens, e->cfg.spec_ngram, (int)k, s->draft,
                                   &matched);
        return e->cfg.spec_fixed ? m
                                 : spec_adapt_choose(&s->adapt, &e->cost, base, m, matched, false);
    }
    if (!e->cfg.spec_fixed) k = spec_adapt_choose(&s->adapt, &e->cost, base, (int)k, 0, true);
    if (k <= 0) return 0;
    /* The draft model drafts for every sequence at once once the step is
     * planned (draft_all); until then a valid placeholder. */
    for (int i = 0; i < k; i++) s->draft[i] = s->tokens[s->n_tokens - 1];
    return spec_drafter_reserve(e->drafter, &s->dseq, s->n_tokens, (int)k);
}

/* Draft model: the drafts of every sequence in the step from one set of
 * draft forwards (all sequences in each), written into the planned batch. */
static void draft_all(engine *e, const step_plan *p) {
    int n = 0;
    for (int si = 0; si < p->n_seqs; si++) {
        seq *s = e->b_owner[si];
        if (s->n_draft > 0)
            e->draft_jobs[n++] = (spec_draft_job){.ds = &s->dseq,
                                                  .toks = s->tokens,
                                                  .n = s->n_tokens,
                                                  .k = s->n_draft,
                                                  .out = s->draft};
    }
    if (n == 0) return;
    kvl_error err = {{0}};
    int most = 0;
    for (int j = 0; j < n; j++) most = e->draft_jobs[j].k > most ? e->draft_jobs[j].k : most;
    const double t0 = kvl_time_s();
    const bool ok = spec_drafter_run(e->drafter, e->draft_jobs, n, &err);
    e->step_draft_s = kvl_time_s() - t0;
    if (ok) {
        spec_cost_observe_draft(&e->cost, most, e->step_draft_s);
    } else {
        /* the output stays right whatever the drafts are: verification decides */
        kvl_log(KVL_LOG_WARN, "engine: draft model: %s", err.msg);
        for (int j = 0; j < n; j++) spec_dseq_release(e->drafter, e->draft_jobs[j].ds, false);
    }
    for (int64_t t = 0; t < p->n_tokens; t++) {
        const seq *s = e->b_owner[e->b_seq[t]];
        if (e->b_pos[t] >= s->n_tokens) e->b_tokens[t] = s->draft[e->b_pos[t] - s->n_tokens];
    }
}

/* Priority scheduling: running sequences of a higher value than the most
 * urgent waiting one yield while it cannot be admitted (no seat or no blocks
 * for its prompt). */
static void preempt_for_priority(engine *e) {
    if (e->cfg.scheduling != ENGINE_SCHED_PRIORITY) return;
    seq **pp = pick_waiting(e, false);
    if (!pp) return;
    const seq *w = *pp;
    int64_t need = (w->n_tokens - cached_prefix(e, w) + e->cfg.block_size - 1) / e->cfg.block_size;
    while (e->n_running > 0 && e->running[e->n_running - 1]->req.priority > w->req.priority &&
           (e->n_running >= e->cfg.max_seqs || kv_pool_n_free(e->kv[0]) < need))
        preempt_newest(e);
}

static void plan_step(engine *e, step_plan *p) {
    int64_t budget = e->cfg.max_batch_tokens;
    e->spec_left = e->cfg.spec_max_batch;
    p->n_tokens = 0;
    p->n_seqs = 0;
    preempt_for_priority(e);
    /* Running sequences, oldest first: decodes (and unfinished prefills). */
    for (int i = 0; i < e->n_running && budget > 0;) {
        seq *s = e->running[i];
        /* No cache: once per new token, forget everything and recompute the prefix
         * (a chunked recompute that happens to stop at n_tokens-1 must go on). */
        if (e->cfg.no_kv_cache && s->n_computed == s->n_tokens - 1 && s->n_computed > 0 &&
            s->recompute_for != s->n_tokens) {
            seq_forget_kv(e, s);
            s->recompute_for = s->n_tokens;
        }
        s->n_draft = e->spec ? propose_drafts(e, s, p->n_tokens, e->n_running - 1 - i, budget) : 0;
        int64_t n = reserve_chunk(e, s, budget);
        if (n == 0 && s->n_draft > 0) { /* no room for the drafts: decode plainly */
            s->n_draft = 0;
            if (e->drafter)
                spec_drafter_rollback(e->drafter, &s->dseq, s->n_tokens); /* drafts it computed */
            n = reserve_chunk(e, s, budget);
        }
        if (n == 0) {
            /* Out of blocks: the newest running sequence yields (possibly s itself,
             * which ends the loop). */
            preempt_newest(e);
            continue;
        }
        plan_add(e, p, s, n);
        budget -= n;
        e->spec_left -= s->n_draft;
        i++;
    }
    /* Admit waiting sequences while there is budget, room and memory. */
    seq **link;
    while (budget > 0 && e->n_running < e->cfg.max_seqs && (link = pick_waiting(e, true))) {
        seq *s = *link;
        if (leader_prefilling(e, s)) break; /* keeps FIFO order; the leader finishes first */
        if (!prefix_attach(e, s)) continue; /* reading from disk: pick_waiting skips it now */
        int64_t n = reserve_chunk(e, s, budget);
        if (n == 0) {
            seq_forget_kv(e, s); /* give the cached blocks back; retry next step */
            break;
        }
        *link = s->next;
        s->next = NULL;
        s->state = SEQ_RUNNING;
        if (s->stats.t_scheduled == 0)
            s->stats.t_scheduled = kvl_time_s(); /* not again after a preemption */
        running_add(e, s);
        if (e->prefix_cache) { /* logged once admitted: a sequence may look up again every step until then */
            e->events->prefix_lookups++;
            e->events->prefix_hits += s->n_computed > 0;
            if (s->n_computed > 0)
                ev_ring_push(e->events, ENGINE_EV_PREFIX_HIT, s->id, s->n_computed,
                             s->kv[0].n_blocks);
        }
        ev_ring_push(e->events, ENGINE_EV_ADMIT, s->id, n, s->n_computed);
        plan_add(e, p, s, n);
        budget -= n;
    }
}

/* Masks e->logits_tmp to the tokens s's grammar allows. When it allows none
 * (the grammar must end but the vocabulary has no end-of-generation token, or
 * the vocabulary cannot spell what the grammar needs), s finishes here. */
static bool apply_grammar(engine *e, seq *s, int32_t V) {
    int32_t n = grammar_state_mask(s->gst, e->mask, V);
    if (n == 0) {
        if (!grammar_state_must_end(s->gst))
            kvl_log(KVL_LOG_WARN,
                    "engine: request %lld: no token of the vocabulary continues its grammar",
                    (long long)s->id);
        finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
        return false;
    }
    float *l = e->logits_tmp;
    for (int32_t i = 0; i < V; i++)
        if (!(e->mask[i >> 5] >> (i & 31) & 1)) l[i] = -INFINITY;
    return true;
}

static void sample_outputs(engine *e, const step_plan *p) {
    int64_t V = model_hp(e->m)->n_vocab, row = 0;
    int32_t ids[MAX_TOP_LOGPROBS];
    float lps[MAX_TOP_LOGPROBS];
    for (int64_t t = 0; t < p->n_tokens; t++) {
        if (!e->b_want[t]) continue;
        seq *s = e->b_owner[e->b_seq[t]];
        const float *lg = e->logits + row++ * V;
        /* A draft's row counts only while every token before it was accepted:
         * the sequence's text must be exactly what the row was computed on. */
        const int64_t pos = e->b_pos[t];
        if (s->state == SEQ_DONE || pos != s->n_tokens - 1 || s->tokens[pos] != e->b_tokens[t])
            continue;
        if (pos >= s->n_computed) { /* an accepted draft: its K/V is the sequence's now */
            s->n_computed = pos + 1;
            s->n_accepted++;
            e->metrics.spec_accepted_tokens++;
        }
        /* exp over the whole vocabulary (128K for Llama 3) only when asked */
        const bool want_lp = s->req.logprobs || s->req.top_logprobs > 0;
        double lse = want_lp ? logits_logsumexp(lg, (int32_t)V) : NAN;
        int n_top = logits_top_k(lg, (int32_t)V, s->req.top_logprobs, ids, lps);
        memcpy(e->logits_tmp, lg, V * sizeof(float));
        if (s->gst && !apply_grammar(e, s, (int32_t)V)) continue;
        int32_t tok = sampler_sample(s->smp, e->logits_tmp);
        on_token(e, s, tok, want_lp ? (float)(lg[tok] - lse) : NAN, n_top, ids, lps);
    }
}

/* After a verification: the rejected drafts' K/V is rolled back (the blocks
 * past the accepted positions go back to the pool) and the blocks the
 * accepted ones filled join the prefix cache. */
static void finish_drafts(engine *e, seq *s) {
    if (s->n_draft == 0) return;
    const int drafted = s->n_draft, accepted = s->n_accepted;
    s->n_draft = s->n_accepted = 0;
    e->metrics.spec_drafts++;
    e->metrics.spec_draft_tokens += drafted;
    if (s->state == SEQ_DONE) return; /* its blocks are released already */
    spec_adapt_update(&s->adapt, drafted, accepted);
    for (int g = 0; g < e->n_groups; g++) {
        int64_t held = kv_seq_truncate_tokens(e->kv[g], &s->kv[g], s->n_computed);
        if (held < s->n_computed)
            s->n_computed = held; /* cannot happen: commits cover accepted tokens only */
    }
    if (e->prefix_cache) kv_prefix_commit(e->kv[0], &s->kv[0], s->tokens, s->n_computed);
    if (e->drafter) spec_drafter_rollback(e->drafter, &s->dseq, s->n_computed);
}

bool engine_step(engine *e, kvl_error *err) {
    const double t_step = e->spec ? kvl_time_s() : 0; /* the whole step: what drafts cost */
    e->step_draft_s = 0;
    drop_cancelled(e);
    if (e->disk) kv_disk_reap(e->disk); /* blocks of reads cancelled mid-way */
    step_plan p;
    plan_step(e, &p);
    e->disk_stalled = p.n_tokens == 0 && e->disk && kv_disk_has_loads(e->disk);
    for (int g = 0; g < e->n_groups; g++) { /* allocations evict inside kv: log how many */
        int64_t ev = kv_pool_n_evicted(e->kv[g]);
        if (ev > e->n_evicted_seen[g])
            ev_ring_push(e->events, ENGINE_EV_EVICT, 0, ev - e->n_evicted_seen[g], g);
        e->n_evicted_seen[g] = ev;
    }
    if (p.n_tokens == 0) {
        if (e->disk_stalled) { /* nothing to compute until a read finishes */
            /* Reads done but not admitted (the head of the queue waits for
             * blocks) go to the RAM cache, where they are evictable, rather than
             * hold their blocks meanwhile. */
            for (seq *s = e->waiting; s; s = s->next)
                if (s->load && !seq_loading(e, s) && prefix_attach(e, s)) seq_forget_kv(e, s);
            if (!e->disk_wake) kv_disk_wait_loads(e->disk);
            return true;
        }
        if (e->waiting && e->n_running == 0)
            return kvl_fail(err, "engine: no KV blocks free for the next request");
        return true;
    }
    if (e->drafter) draft_all(e, &p);
    model_batch b = {.n_tokens = p.n_tokens,
                     .tokens = e->b_tokens,
                     .pos = e->b_pos,
                     .seq = e->b_seq,
                     .want_logits = e->b_want,
                     .n_seqs = p.n_seqs,
                     .seqs = e->b_seqs};
    if (!model_forward(e->m, e->kv, &b, e->logits, err)) return false;
    e->metrics.steps++;
    for (int si = 0; si < p.n_seqs; si++) {
        seq *s = e->b_owner[si];
        for (int64_t t = 0; t < p.n_tokens; t++)
            if (e->b_seq[t] == si) s->n_computed++;
        s->n_computed -= s->n_draft; /* drafts count once accepted (sample_outputs) */
        if (e->prefix_cache) kv_prefix_commit(e->kv[0], &s->kv[0], s->tokens, s->n_computed);
    }
    sample_outputs(e, &p);
    if (e->spec)
        for (int si = 0; si < p.n_seqs; si++) finish_drafts(e, e->b_owner[si]);
    for (int i = 0; i < e->n_running;) {
        seq *s = e->running[i];
        if (s->state == SEQ_DONE) {
            running_remove(e, i);
            seq_free(e, s);
        } else {
            i++;
        }
    }
    if (e->spec) spec_cost_observe(&e->cost, p.n_tokens, kvl_time_s() - t_step - e->step_draft_s);
    return true;
}

/* ----------------------------------------------------------------- eval -- */

/* Hands model_forward_span's logits rows to the caller's on_logits one by one. */
typedef struct eval_ctx {
    engine_logits_fn on_logits;
    void *user;
    int64_t n_vocab;
} eval_ctx;

static void eval_rows(void *user, int64_t pos, int64_t n, const float *logits,
                      const float *hidden) {
    (void)hidden;
    const eval_ctx *c = user;
    for (int64_t i = 0; i < n; i++) c->on_logits(pos + i, logits + i * c->n_vocab, c->user);
}

bool engine_eval(model *m, int kv_dtype, int kv_dtype_v, int block_size, const int32_t *ids,
                 int64_t n, engine_logits_fn on_logits, void *user, kvl_error *err) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = n;
    c.block_size = block_size;
    c.kv_dtype = kv_dtype;
    c.kv_dtype_v = kv_dtype_v;
    c.max_seqs = 1;
    c.prefix_cache = false;
    engine *e = engine_create(m, NULL, &c, err);
    if (!e) return false;
    const model_hparams *hp = model_hp(m);
    float *logits = kvl_alloc(MODEL_SPAN_CHUNK * hp->n_vocab * sizeof(float));
    kv_seq s[MODEL_MAX_KV_GROUPS];
    const kv_seq *seqs[MODEL_MAX_KV_GROUPS];
    bool ok = logits != NULL;
    if (!ok) kvl_fail(err, "eval: out of memory");
    for (int g = 0; g < e->n_groups; g++) {
        kv_seq_init(&s[g]);
        seqs[g] = &s[g];
        if (ok && !kv_seq_reserve(e->kv[g], &s[g], n))
            ok = kvl_fail(err, "eval: cannot reserve KV");
    }
    eval_ctx ec = {.on_logits = on_logits, .user = user, .n_vocab = hp->n_vocab};
    model_span span = {.tokens = ids,
                       .to = n,
                       .want_to = n,
                       .seqs = seqs,
                       .logits = logits,
                       .on_rows = eval_rows,
                       .user = &ec};
    ok = ok && model_forward_span(m, e->kv, &span, err);
    for (int g = 0; g < e->n_groups; g++) kv_seq_free(e->kv[g], &s[g]);
    kvl_free(logits);
    engine_destroy(e);
    return ok;
}

/* Sums model_forward_span's hidden rows for pooling. */
typedef struct embed_ctx {
    double *acc;
    int64_t n_embd;
} embed_ctx;

static void embed_rows(void *user, int64_t pos, int64_t n, const float *logits,
                       const float *hidden) {
    (void)pos, (void)logits;
    const embed_ctx *c = user;
    for (int64_t r = 0; r < n; r++)
        for (int64_t k = 0; k < c->n_embd; k++) c->acc[k] += hidden[r * c->n_embd + k];
}

bool engine_embed(engine *e, const int32_t *ids, int64_t n, engine_pooling pooling, float *out,
                  kvl_error *err) {
    const model_hparams *hp = model_hp(e->m);
    const int64_t E = hp->n_embd;
    if (n < 1) return kvl_fail(err, "embedding: the input is empty");
    if (n > e->cfg.n_ctx)
        return kvl_fail(err, "embedding: the input has %lld tokens, more than the context of %lld",
                        (long long)n, (long long)e->cfg.n_ctx);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->n_vocab)
            return kvl_fail(err, "embedding: token %lld (id %d) is not in the vocabulary",
                            (long long)i, ids[i]);
    float *rows = kvl_alloc(MODEL_SPAN_CHUNK * E * sizeof(float));
    double *acc = calloc((size_t)E, sizeof *acc);
    kv_seq s[MODEL_MAX_KV_GROUPS];
    const kv_seq *seqs[MODEL_MAX_KV_GROUPS];
    bool ok = rows && acc;
    if (!ok) kvl_fail(err, "embedding: out of memory");
    /* A sequence of its own in the engine's pools, computed in full and given
     * back at once; never committed to the prefix cache. */
    for (int g = 0; g < e->n_groups; g++) {
        kv_seq_init(&s[g]);
        seqs[g] = &s[g];
        if (ok && !kv_seq_reserve(e->kv[g], &s[g], n))
            ok = kvl_fail(err, "embedding: not enough free KV blocks for %lld tokens right now",
                          (long long)n);
    }
    embed_ctx ec = {.acc = acc, .n_embd = E};
    model_span span = {.tokens = ids,
                       .to = n,
                       .want_from = pooling == ENGINE_POOL_LAST ? n - 1 : 0,
                       .want_to = pooling == ENGINE_POOL_CLS ? 1 : n,
                       .seqs = seqs,
                       .hidden = rows,
                       .on_rows = embed_rows,
                       .user = &ec};
    ok = ok && model_forward_span(e->m, e->kv, &span, err);
    for (int g = 0; g < e->n_groups; g++) kv_seq_free(e->kv[g], &s[g]);
    if (ok) {
        double div = pooling == ENGINE_POOL_MEAN ? (double)n : 1.0, norm = 0;
        for (int64_t k = 0; k < E; k++) norm += (acc[k] / div) * (acc[k] / div);
        norm = sqrt(norm);
        /* L2-normalised, as llama-server and vLLM return them */
        for (int64_t k = 0; k < E; k++) out[k] = (float)(norm > 0 ? acc[k] / div / norm : 0.0);
    }
    kvl_free(rows);
    free(acc);
    return ok;
}

const model *engine_model(const engine *e) { return e->m; }

int64_t engine_kv_save(engine *e, const int32_t *ids, int64_t n, const char *salt, kvl_error *err) {
    if (!e->disk) {
        kvl_fail(err, "the KV disk tier is off (start with --kv-disk DIR)");
        return -1;
    }
    const model_hparams *hp = model_hp(e->m);
    if (n > e->cfg.n_ctx) {
        kvl_fail(err, "the prefix has %lld tokens, more than the context of %lld", (long long)n,
                 (long long)e->cfg.n_ctx);
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->n_vocab) {
            kvl_fail(err, "token %lld (id %d) is not in the vocabulary", (long long)i, ids[i]);
            return -1;
        }
    const int64_t bs = e->cfg.block_size, full = n / bs * bs; /* only full blocks are cached */
    kv_seq s;
    kv_seq_init(&s);
    kv_seq_set_cache_salt(&s, salt);
    const kv_seq *seqs[1] = {&s};
    /* What RAM or the tier holds already is attached, the rest computed like
     * a prompt, committed to the prefix cache and written out. */
    int64_t done = kv_disk_prefix_match(e->disk, &s, ids, full), saved = -1;
    bool ok = kv_seq_reserve(e->kv[0], &s, full);
    if (!ok) kvl_fail(err, "not enough free KV blocks for %lld tokens right now", (long long)full);
    model_span span = {.tokens = ids, .from = done, .to = full, .seqs = seqs};
    ok = ok && model_forward_span(e->m, e->kv, &span, err);
    if (ok) {
        kv_prefix_commit(e->kv[0], &s, ids, full);
        saved = kv_disk_save(e->disk, &s, full / bs, err);
    }
    kv_seq_free(e->kv[0], &s);
    return saved;
}

/* ------------------------------------------------------------ live view -- */

static bool view_add_seq(const engine *e, engine_view *v, const seq *s) {
    if (v->n_seqs == v->cap_seqs) {
        int cap = v->cap_seqs ? 2 * v->cap_seqs : 64;
        engine_seq_view *n = realloc(v->seqs, (size_t)cap * sizeof *n);
        if (!n) return false;
        v->seqs = n;
        v->cap_seqs = cap;
    }
    engine_seq_view *o = &v->seqs[v->n_seqs++];
    bool running = s->state == SEQ_RUNNING;
    *o = (engine_seq_view){.id = s->id,
                           .n_prompt = s->n_prompt,
                           .n_generated = s->stats.n_generated,
                           .n_cached_prompt = s->stats.n_cached_prompt,
                           .n_computed = s->n_computed,
                           .n_preemptions = s->stats.n_preemptions,
                           .t_submit = s->stats.t_submit,
                           .kv = {.tokens = s->n_computed}};
    o->phase = !running ? (s->stats.n_preemptions ? ENGINE_PHASE_PREEMPTED : ENGINE_PHASE_WAITING)
               : s->n_computed < s->n_tokens - 1 || s->stats.n_generated == 0
                   ? ENGINE_PHASE_PREFILLING
                   : ENGINE_PHASE_DECODING;
    for (int g = 0; g < e->n_groups; g++) {
        kv_usage u = kv_seq_usage(e->kv[g], &s->kv[g], kv_window_kept(s->n_computed, e->window[g]));
        kv_usage_add(&o->kv, &u);
        const kv_seq *k = &s->kv[g];
        if (v->n_tables + k->n_blocks > v->cap_tables) {
            int64_t cap = v->cap_tables ? v->cap_tables : 1024;
            while (cap < v->n_tables + k->n_blocks) cap *= 2;
            int32_t *n = realloc(v->tables, (size_t)cap * sizeof *n);
            if (!n) return false;
            v->tables = n;
            v->cap_tables = cap;
        }
        o->table_off[g] = v->n_tables;
        o->table_len[g] = k->n_blocks;
        if (k->n_blocks)
            memcpy(v->tables + v->n_tables, k->blocks, (size_t)k->n_blocks * sizeof *k->blocks);
        v->n_tables += k->n_blocks;
    }
    return true;
}

bool engine_view_take(const engine *e, engine_view *v, uint64_t events_since) {
    v->t = kvl_time_s();
    v->metrics = engine_get_metrics(e);
    v->prefix_cache = e->prefix_cache;
    v->block_size = e->cfg.block_size;
    for (int g = 0; g < e->n_groups; g++) {
        v->window[g] = e->window[g];
        v->block_bytes[g] = kv_pool_block_bytes(e->kv[g]);
        v->n_evicted[g] = kv_pool_n_evicted(e->kv[g]);
        kv_pool_snapshot(e->kv[g], v->blocks[g]);
    }
    v->n_seqs = 0;
    v->n_tables = 0;
    for (int i = 0; i < e->n_running; i++)
        if (!view_add_seq(e, v, e->running[i])) return false;
    for (const seq *s = e->waiting; s; s = s->next)
        if (!view_add_seq(e, v, s)) return false;
    ev_ring_copy(e->events, events_since, v);
    return true;
}
