/* engine: creation, the public API, request lifecycle (submit, cancel,
 * token output and stop strings), one-shot evaluation, embeddings, KV saves
 * and the live view. Scheduling: engine_sched.c; the step: engine_step.c.
 * See engine.h. */
#include "engine.h"
#include "spec.h"
#include "engine_events.h"
#include "engine_internal.h"
#include "units.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* Every field not named is zero (false, NULL, 0, ENGINE_SPEC_OFF,
 * ENGINE_SCHED_FCFS): a field added to engine_config starts off, never
 * uninitialised. */
void engine_config_default(engine_config *c) {
    *c = (engine_config){
        .block_size = 16,
        .kv_dtype = GGUF_DT_F16,
        .kv_dtype_v = -1,
        .max_batch_tokens = 2048,
        .max_seqs = 64,
        .prefix_cache = true,
        .spec = ENGINE_SPEC_OFF,
        .spec_k = 4,
        .spec_ngram = 3,
        .spec_max_batch = 32,
        .scheduling = ENGINE_SCHED_FCFS,
        .step_groups = 1,
    };
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
    /* with groups a step holds at most ceil(S / groups) sequences, a row each */
    if (e->n_slots > 1) rows = (S + e->n_slots - 1) / e->n_slots;
    for (int k = 0; k < e->n_slots; k++) {
        step_slot *b = &e->slots[k];
        b->owner = malloc(S * sizeof(seq *));
        if (!batch_buf_alloc(&b->in, T, S, e->n_groups, rows, V) || !b->owner)
            return kvl_fail(err, "engine: out of memory");
    }
    e->b = &e->slots[0];
    const kvl_part parts[] = {KVL_PART(e->running, S), KVL_PART(e->logits_tmp, V),
                              KVL_PART(e->mask, (V + 31) / 32), KVL_PART(e->events, 1),
                              KVL_PART(e->draft_jobs, e->drafter ? S : 0)};
    e->piece_cap = 1024;
    e->piece = malloc(e->piece_cap);
    if (!KVL_ALLOC_PARTS(parts) || !e->piece) return kvl_fail(err, "engine: out of memory");
    return true;
}

/* Pools are mapped whole but filled as requests come: pools larger than the
 * memory the process may still take (kvl_mem_available: MemAvailable, or a
 * memory cgroup's room) would have it killed when traffic fills them, every
 * request in flight lost. Refused before they are made instead, as llama.cpp
 * and vLLM fail at start when their KV cache does not fit. */
static bool pools_fit(const engine_config *c, const kv_pool_config *kc, int n_groups,
                      kvl_error *err) {
    uint64_t bytes = 0;
    for (int g = 0; g < n_groups; g++)
        bytes += (uint64_t)kv_pool_block_bytes(&kc[g]) * (uint64_t)c->n_blocks;
    /* a draft model's pools: as many blocks (spec_drafter_create) */
    if (c->spec == ENGINE_SPEC_DRAFT && c->draft_model && !c->no_kv_cache)
        bytes += spec_drafter_pool_bytes(c->draft_model, c->block_size, c->kv_dtype, c->n_blocks);
    const kvl_mem_status st = kvl_mem_status_at("");
    if (st.available < 0 || bytes <= (uint64_t)st.available) return true;
    char p[32], a[32];
    return kvl_fail(err,
                    "engine: the KV pool (%s: %lld blocks of %d tokens%s) is more than the %s "
                    "this process may still take (%s): filling it would get the process killed; "
                    "give fewer blocks (--kv-memory, --kv-blocks), a shorter context (-c) or a "
                    "smaller KV type (--kv-type q8_0)",
                    kvl_fmt_binary(bytes, p, sizeof p), (long long)c->n_blocks, c->block_size,
                    c->spec == ENGINE_SPEC_DRAFT && c->draft_model && !c->no_kv_cache
                        ? ", the draft model's pools included"
                        : "",
                    kvl_fmt_binary((uint64_t)st.available, a, sizeof a),
                    st.by_cgroup ? "its memory cgroup's room" : "MemAvailable");
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
    kv_pool_config kc[MODEL_MAX_KV_GROUPS];
    for (int g = 0; g < e->n_groups; g++) {
        model_kv_group_shape(m, g, &kc[g], &e->attn[g]);
        kc[g].block_size = e->cfg.block_size;
        kc[g].dtype = e->cfg.kv_dtype;
        kc[g].split_v = e->cfg.kv_dtype_v >= 0;
        kc[g].dtype_v = e->cfg.kv_dtype_v;
        kc[g].n_blocks = e->cfg.n_blocks;
    }
    if (!pools_fit(&e->cfg, kc, e->n_groups, err)) goto fail;
    for (int g = 0; g < e->n_groups; g++)
        if (!(e->kv[g] = kv_pool_create(&kc[g], err))) goto fail;
    /* Prefix caching: every group commits its blocks to its own pool's cache
     * under the same chain of hashes. A chunked group drops its earlier
     * chunks' blocks, but a hit needs only those of the chunk it resumes in
     * (kv_prefix_match_tail; none at a multiple of the chunk), so a hit never
     * relies on a dropped block. Sliding-window blocks leave one at a time
     * and a window rarely finds its run cached: no prefix cache with one. At
     * most one dropping group (so one hit length suits all groups). */
    int n_limited = 0;
    bool windowed = false;
    e->prefix_group = 0;
    for (int g = e->n_groups - 1; g >= 0; g--) {
        n_limited += kv_attn_limited(e->attn[g]);
        windowed = windowed || e->attn[g].window > 0;
        if (!kv_attn_limited(e->attn[g])) e->prefix_group = g;
    }
    e->prefix_cache =
        e->cfg.prefix_cache && !e->cfg.no_kv_cache && !windowed && n_limited <= 1 &&
        !(n_limited && e->cfg.keep_unattended_kv); /* the whole-KV path: no partial tables */
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
        if (!e->prefix_cache || e->n_groups != 1) {
            kvl_fail(err, "engine: the KV disk tier needs the prefix cache (on, a KV cache) and "
                          "one KV group (no sliding-window or chunked-attention layers)");
            goto fail;
        }
        if (!(e->disk = kv_disk_open(c->kv_disk, e->kv[0], err))) goto fail;
    }
    if (e->cfg.step_groups < 1 || e->cfg.step_groups > ENGINE_MAX_STEP_GROUPS) {
        kvl_fail(err, "engine: step groups %d: between 1 and %d", e->cfg.step_groups,
                 ENGINE_MAX_STEP_GROUPS);
        goto fail;
    }
    e->n_slots = e->cfg.step_groups;
    if (e->n_slots > 1 && (e->spec || e->disk)) {
        kvl_fail(err, "engine: step groups do not work with speculative decoding or the KV disk "
                      "tier");
        goto fail;
    }
    if (!alloc_batch(e, err)) goto fail;
    if (vocab) { /* the end-of-generation ids, which min_tokens masks */
        e->eog_ids = malloc((size_t)hp->n_vocab * sizeof *e->eog_ids);
        if (!e->eog_ids) {
            kvl_fail(err, "engine: out of memory");
            goto fail;
        }
        for (int32_t i = 0; i < (int32_t)hp->n_vocab; i++)
            if (tok_is_eog(vocab, i)) e->eog_ids[e->n_eog_ids++] = i;
        int32_t *fit = realloc(e->eog_ids, (size_t)(e->n_eog_ids ? e->n_eog_ids : 1) * sizeof *fit);
        if (fit) e->eog_ids = fit; /* a handful of the vocabulary's ids */
    }
    return e;
fail:
    engine_destroy(e);
    return NULL;
}

void eng_seq_free(engine *e, seq *s) {
    if (!s) return;
    if (s->load) kv_disk_load_cancel(e->disk, s->load); /* its reserved blocks go back */
    spec_dseq_release(e->drafter, &s->dseq, true);
    spec_ngram_index_destroy(s->ngram);
    for (int g = 0; g < e->n_groups; g++) kv_seq_free(e->kv[g], &s->kv[g]);
    sampler_destroy(s->smp);
    grammar_state_free(s->gst);
    stop_matcher_free(&s->stops);
    for (int i = 0; i < s->req.n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->bias);
    free(s->stop_ids);
    rb_free(&s->rb);
    free(s->allowed);
    free(s->bad_ids);
    free(s->bad_lens);
    free(s->tokens);
    free(s->text);
    free(s);
}

void engine_destroy(engine *e) {
    if (!e) return;
    eng_drain_steps(e); /* a pipeline writes their logits into the slots */
    while (e->waiting) {
        seq *s = e->waiting;
        e->waiting = s->next;
        eng_seq_free(e, s);
    }
    for (int i = 0; i < e->n_running; i++) eng_seq_free(e, e->running[i]);
    kv_disk_close(e->disk); /* before the pool: it writes what RAM still caches */
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) kv_pool_destroy(e->kv[g]);
    spec_drafter_destroy(e->drafter);
    for (int k = 0; k < e->n_slots; k++) {
        batch_buf_free(&e->slots[k].in);
        free(e->slots[k].owner);
    }
    kvl_free(e->running); /* and the other arrays sized at creation: one block */
    free(e->piece);
    free(e->eog_ids);
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
    return e->waiting || e->n_running > 0 || e->n_flight > 0 ||
           (e->disk && kv_disk_has_loads(e->disk));
}

engine_metrics engine_get_metrics(const engine *e) {
    engine_metrics m = e->metrics;
    m.n_running = e->n_running;
    m.kv_blocks_total = m.kv_blocks_free = m.kv_blocks_used = m.kv_blocks_cached = 0;
    m.n_kv_groups = e->n_groups;
    for (int g = 0; g < e->n_groups; g++) {
        m.kv_group_blocks[g] = kv_pool_cfg(e->kv[g])->n_blocks;
        m.kv_group_used[g] = kv_pool_n_used(e->kv[g]);
        m.kv_group_cached[g] = kv_pool_n_cached(e->kv[g]);
        m.kv_blocks_total += m.kv_group_blocks[g];
        m.kv_blocks_free += kv_pool_n_free(e->kv[g]);
        m.kv_blocks_used += m.kv_group_used[g];
        m.kv_blocks_cached += m.kv_group_cached[g];
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
    if (r->lora && model_lora_count(e->m) == 0)
        return kvl_fail(err, "LoRA scales given, but the model has no adapter");
    model_lora_info info;
    for (int i = 0; r->lora && i < model_lora_count(e->m); i++) {
        if (!isfinite(r->lora[i])) return kvl_fail(err, "LoRA adapter %d: scale is not finite", i);
        if (r->lora[i] != 0.0f && !model_lora_get(e->m, i, &info))
            return kvl_fail(err, "LoRA adapter %d has been unloaded", i);
    }
    if (r->n_stop < 0 || r->n_stop > ENGINE_MAX_STOP)
        return kvl_fail(err, "%d stop strings: at most %d are supported", r->n_stop,
                        ENGINE_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++)
        if (strlen(r->stop[i]) > ENGINE_MAX_STOP_BYTES)
            return kvl_fail(err, "stop string %d is %zu bytes long: at most %d are supported", i,
                            strlen(r->stop[i]), ENGINE_MAX_STOP_BYTES);
    if (r->n_logit_bias < 0 || r->n_logit_bias > hp->n_vocab || (r->n_logit_bias && !r->logit_bias))
        return kvl_fail(err, "%d logit biases: between 0 and the vocabulary size (%lld)",
                        r->n_logit_bias, (long long)hp->n_vocab);
    for (int i = 0; i < r->n_logit_bias; i++) {
        const engine_logit_bias *b = &r->logit_bias[i];
        if (b->token < 0 || b->token >= hp->n_vocab)
            return kvl_fail(err, "logit bias %d: id %d is not in the vocabulary (0..%lld)", i,
                            b->token, (long long)hp->n_vocab - 1);
        if (isnan(b->bias) || b->bias == INFINITY)
            return kvl_fail(err, "logit bias %d (token %d): not a number or +infinity", i,
                            b->token);
    }
    if (r->n_stop_ids < 0 || r->n_stop_ids > ENGINE_MAX_STOP_IDS || (r->n_stop_ids && !r->stop_ids))
        return kvl_fail(err, "%d stop token ids: at most %d are supported", r->n_stop_ids,
                        ENGINE_MAX_STOP_IDS);
    if (r->n_allowed < 0 || r->n_allowed > hp->n_vocab || (r->n_allowed && !r->allowed))
        return kvl_fail(err, "%d allowed token ids: between 0 and the vocabulary size (%lld)",
                        r->n_allowed, (long long)hp->n_vocab);
    for (int i = 0; i < r->n_stop_ids + r->n_allowed; i++) {
        const int32_t id = i < r->n_stop_ids ? r->stop_ids[i] : r->allowed[i - r->n_stop_ids];
        if (id < 0 || id >= hp->n_vocab)
            return kvl_fail(err, "%s token id %d is not in the vocabulary (0..%lld)",
                            i < r->n_stop_ids ? "stop" : "allowed", id, (long long)hp->n_vocab - 1);
    }
    if (r->budget) { /* the reasoning budget's tags */
        if (r->budget_tokens < 0)
            return kvl_fail(err, "reasoning budget: %d tokens", r->budget_tokens);
        const int32_t *tags[3] = {r->budget_start, r->budget_end, r->budget_forced};
        const int lens[3] = {r->n_budget_start, r->n_budget_end, r->n_budget_forced};
        for (int k = 0; k < 3; k++) {
            if (lens[k] < (k < 2 ? 1 : 0) || lens[k] > 256 || (lens[k] && !tags[k]))
                return kvl_fail(err, "reasoning budget: its tags need 1..256 tokens");
            for (int i = 0; i < lens[k]; i++)
                if (tags[k][i] < 0 || tags[k][i] >= hp->n_vocab)
                    return kvl_fail(err, "reasoning budget: token id %d is not in the vocabulary",
                                    tags[k][i]);
        }
    }
    if (r->n_bad < 0 || r->n_bad > ENGINE_MAX_BAD || (r->n_bad && (!r->bad_ids || !r->bad_lens)))
        return kvl_fail(err, "%d bad-word sequences: at most %d are supported", r->n_bad,
                        ENGINE_MAX_BAD);
    for (int i = 0, at = 0; i < r->n_bad; at += r->bad_lens[i++]) {
        if (r->bad_lens[i] < 1 || r->bad_lens[i] > ENGINE_MAX_BAD_LEN)
            return kvl_fail(err, "bad-word sequence %d: 1 to %d tokens", i, ENGINE_MAX_BAD_LEN);
        for (int k = 0; k < r->bad_lens[i]; k++)
            if (r->bad_ids[at + k] < 0 || r->bad_ids[at + k] >= hp->n_vocab)
                return kvl_fail(err, "bad-word sequence %d: id %d is not in the vocabulary", i,
                                r->bad_ids[at + k]);
    }
    if (r->min_tokens < 0 || (r->max_tokens > 0 && r->min_tokens > r->max_tokens))
        return kvl_fail(err, "min_tokens (%lld) must be between 0 and max_tokens (%lld)",
                        (long long)r->min_tokens, (long long)r->max_tokens);
    if (r->sampling.infill &&
        (!e->vocab || r->sampling.top_k < 1 || r->sampling.top_k > SAMPLER_INFILL_MAX_K))
        return kvl_fail(err, "the infill sampler needs the vocabulary and top_k 1..%d before it",
                        SAMPLER_INFILL_MAX_K);
    if (r->n_indent < 0 || !(r->max_predict_s >= 0))
        return kvl_fail(err, "n_indent and the prediction time limit must not be negative");
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

/* Whether tok's own text ends a whole UTF-8 character (the reasoning budget
 * forces only there, as llama.cpp's). */
static bool token_whole_utf8(const tok_vocab *v, int32_t tok) {
    char piece[256]; /* a longer token is taken as whole: none ends mid-character in practice */
    const size_t nb = tok_token_bytes(v, tok, false, piece, sizeof piece);
    return nb > sizeof piece || rb_utf8_complete(piece, nb);
}

static bool copy_request(seq *s, const engine_request *r, int32_t n_vocab, const tok_vocab *e_vocab,
                         int64_t n_ctx_train) {
    s->req = *r;
    /* DRY's window -1 is the model's training context (llama's), unless the
     * front end named one */
    if (s->req.sampling.dry_context <= 0)
        s->req.sampling.dry_context = (int32_t)(n_ctx_train < INT32_MAX ? n_ctx_train : INT32_MAX);
    s->req.n_stop = 0; /* counts the copies made, for eng_seq_free */
    s->cap_tokens = (size_t)(r->n_prompt + (r->max_tokens > 0 ? r->max_tokens : 256) + 1);
    s->tokens = malloc(s->cap_tokens * sizeof(int32_t));
    s->smp = sampler_create(&s->req.sampling, n_vocab);
    s->stop = calloc(r->n_stop > 0 ? r->n_stop : 1, sizeof(char *));
    if (r->grammar && !(s->gst = grammar_state_new(r->grammar))) return false;
    if (!s->tokens || !s->smp || !s->stop) return false;
    if (r->sampling.infill || r->sampling.dry_multiplier != 0.0f) /* DRY: its breakers' tokens */
        sampler_set_vocab(s->smp, e_vocab);
    s->cut_at = -1;
    memcpy(s->tokens, r->prompt, r->n_prompt * sizeof(int32_t));
    s->n_tokens = s->n_prompt = r->n_prompt;
    if (r->n_logit_bias) {
        if (!(s->bias = malloc((size_t)r->n_logit_bias * sizeof *s->bias))) return false;
        memcpy(s->bias, r->logit_bias, (size_t)r->n_logit_bias * sizeof *s->bias);
    }
    if (r->n_stop_ids) {
        if (!(s->stop_ids = malloc((size_t)r->n_stop_ids * sizeof *s->stop_ids))) return false;
        memcpy(s->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof *s->stop_ids);
    }
    if (!rb_init(&s->rb, r->budget ? r->budget_tokens : -1, r->budget_start, r->n_budget_start,
                 r->budget_end, r->n_budget_end, r->budget_forced, r->n_budget_forced))
        return false;
    if (s->rb.active && r->budget_inside) { /* the prompt opened a block: its tail counts */
        const int64_t from = rb_prompt_tail(&s->rb, r->prompt, r->n_prompt);
        for (int64_t i = from < 0 ? r->n_prompt : from; i < r->n_prompt; i++)
            rb_accept(&s->rb, r->prompt[i], token_whole_utf8(e_vocab, r->prompt[i]));
    }
    if (r->n_bad) {
        int total = 0;
        for (int i = 0; i < r->n_bad; i++) total += r->bad_lens[i];
        s->bad_ids = malloc((size_t)total * sizeof *s->bad_ids);
        s->bad_lens = malloc((size_t)r->n_bad * sizeof *s->bad_lens);
        if (!s->bad_ids || !s->bad_lens) return false;
        memcpy(s->bad_ids, r->bad_ids, (size_t)total * sizeof *s->bad_ids);
        memcpy(s->bad_lens, r->bad_lens, (size_t)r->n_bad * sizeof *s->bad_lens);
    }
    if (r->n_allowed) {
        if (!(s->allowed = calloc(((size_t)n_vocab + 31) / 32, sizeof *s->allowed))) return false;
        for (int i = 0; i < r->n_allowed; i++)
            s->allowed[r->allowed[i] >> 5] |= 1u << (r->allowed[i] & 31);
    }
    /* the prompt's last tokens, as far as a window can reach: the penalties'
     * (penalize_prompt: llama-server's window) and DRY's (-1: the context;
     * llama's DRY sees the prompt on every API) */
    const sampler_params *sp = &s->req.sampling;
    const bool dry = sp->dry_multiplier != 0.0f;
    int64_t w = r->penalize_prompt ? sp->penalty_last_n : 0;
    if (dry && w >= 0) {
        const int64_t d = sp->dry_penalty_last_n == -1 ? sp->dry_context : sp->dry_penalty_last_n;
        w = d > w ? d : w;
    }
    if (r->penalize_prompt || dry) {
        for (int64_t i = w < 0 || w > r->n_prompt ? 0 : r->n_prompt - w; i < r->n_prompt; i++)
            sampler_accept(s->smp, r->prompt[i]);
        if (!r->penalize_prompt) sampler_start_penalties(s->smp);
    }
    for (int i = 0; i < r->n_stop; i++) {
        if (!(s->stop[i] = strdup(r->stop[i]))) return false;
        s->req.n_stop = i + 1; /* eng_seq_free frees the strings copied so far */
    }
    if (!stop_matcher_init(&s->stops, (const char *const *)s->stop, r->n_stop)) return false;
    s->req.prompt = NULL;
    s->req.stop = NULL;
    s->req.cache_salt = NULL;
    s->req.logit_bias = NULL;                                              /* s->bias */
    s->req.stop_ids = NULL;                                                /* s->stop_ids */
    s->req.budget_start = s->req.budget_end = s->req.budget_forced = NULL; /* s->rb */
    s->req.allowed = NULL;                                                 /* s->allowed */
    s->req.bad_ids = NULL; /* s->bad_ids, s->bad_lens */
    s->req.bad_lens = NULL;
    s->req.lora = NULL;    /* the scales are in s->lora (engine_submit) */
    s->req.grammar = NULL; /* the state holds it */
    return true;
}

char *engine_cache_salt(const engine *e, const char *salt, const float *lora, float *scales,
                        int *n_scales) {
    const int n = model_lora_count(e->m);
    const char *user = salt ? salt : "";
    const size_t cap = strlen(user) + 8 + (size_t)n * 64;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t at = (size_t)snprintf(out, cap, "%s", user);
    for (int i = 0; i < n; i++) {
        model_lora_info info;
        if (!model_lora_get(e->m, i, &info)) { /* removed: no scale (validate_request) */
            if (scales) scales[i] = 0.0f;
            continue;
        }
        const float sc = lora ? lora[i] : info.scale;
        if (scales) scales[i] = sc;
        if (sc != 0.0f)
            at += (size_t)snprintf(out + at, cap - at, "\x1flora %016llx %a",
                                   (unsigned long long)info.fingerprint, (double)sc);
    }
    if (n_scales) *n_scales = n;
    return out;
}

int64_t engine_submit(engine *e, const engine_request *r, kvl_error *err) {
    if (!validate_request(e, r, err)) return -1;
    seq *s = calloc(1, sizeof *s);
    if (!s || !copy_request(s, r, (int32_t)model_hp(e->m)->n_vocab, e->vocab,
                            model_hp(e->m)->n_ctx_train)) {
        eng_seq_free(e, s);
        kvl_fail(err, "engine: out of memory");
        return -1;
    }
    char *salt = engine_cache_salt(e, r->cache_salt, r->lora, s->lora, &s->n_lora);
    if (!salt) {
        eng_seq_free(e, s);
        kvl_fail(err, "engine: out of memory");
        return -1;
    }
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) {
        kv_seq_init(&s->kv[g]);
        kv_seq_set_cache_salt(&s->kv[g], salt);
    }
    free(salt);
    tok_stream_init(&s->stream);
    s->id = ++e->next_id; /* ids start at 1 so that 0 can mean "none" */
    s->state = SEQ_WAITING;
    s->stats.n_prompt = r->n_prompt;
    s->stats.t_submit = kvl_time_s();
    s->stats.stop_index = -1;
    s->stats.eog_token = -1;
    s->stats.stop_token = -1;
    spec_adapt_init(&s->adapt);
    spec_dseq_init(&s->dseq);
    seq **tail = &e->waiting;
    while (*tail) tail = &(*tail)->next;
    *tail = s;
    e->metrics.prompt_tokens += r->n_prompt;
    return s->id;
}

/* The waiting or running sequence of request id, or NULL (finished or unknown). */
static seq *find_seq(engine *e, int64_t id) {
    for (seq *s = e->waiting; s; s = s->next)
        if (s->id == id) return s;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) return e->running[i];
    return NULL;
}

int engine_lora_add(engine *e, gguf_file *f, float scale, kvl_error *err) {
    return model_lora_add(e->m, f, scale, err);
}

bool engine_lora_remove(engine *e, int adapter, int *users) {
    int n = 0;
    for (const seq *s = e->waiting; s; s = s->next)
        n += adapter < s->n_lora && s->lora[adapter] != 0.0f;
    for (int i = 0; i < e->n_running; i++)
        n += adapter < e->running[i]->n_lora && e->running[i]->lora[adapter] != 0.0f;
    *users = n;
    return n == 0 && model_lora_remove(e->m, adapter);
}

void engine_cancel(engine *e, int64_t id) {
    seq *s = find_seq(e, id);
    if (s) s->cancelled = true;
}

bool engine_end_reasoning(engine *e, int64_t id) {
    seq *s = find_seq(e, id);
    return s && rb_force(&s->rb);
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
                       .error = finish == ENGINE_FINISH_ERROR ? s->error : NULL,
                       .stats = finish != ENGINE_FINISH_NONE ? &s->stats : NULL,
                       .live = &s->stats};
    s->req.on_event(&ev, s->req.user);
}

void eng_emit_progress(seq *s) {
    if (!s->req.on_event || !s->req.progress || s->stats.n_generated > 0) return;
    const engine_event ev = {.request_id = s->id,
                             .token = -1,
                             .logprob = NAN,
                             .live = &s->stats,
                             .progress = true,
                             .n_past = s->n_computed < s->n_prompt ? s->n_computed : s->n_prompt};
    s->req.on_event(&ev, s->req.user);
}

static bool text_append(seq *s, const char *p, size_t n) {
    if (!kvl_grow((void **)&s->text, &s->text_cap, s->text_len + n + 1, 1, 256)) return false;
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

/* KV held by a sequence over all groups; a sliding or chunked group's lower
 * bound counts only the positions its last token attends to (kv_attn_kept). */
static kv_usage seq_usage(const engine *e, seq *s) {
    kv_usage u = {.tokens = s->n_computed};
    s->stats.n_kv_groups = e->n_groups;
    for (int g = 0; g < e->n_groups; g++) {
        s->stats.kv_group[g] =
            kv_seq_usage(e->kv[g], &s->kv[g], kv_attn_kept(e->attn[g], s->n_computed));
        s->stats.kv_group_window[g] = e->attn[g].window;
        s->stats.kv_group_chunk[g] = e->attn[g].chunk;
        kv_usage_add(&u, &s->stats.kv_group[g]);
    }
    return u;
}

void eng_finish_seq(engine *e, seq *s, engine_finish why, int32_t token, float lp, int n_top,
                    const int32_t *ids, const float *lps) {
    char tail[16];
    size_t nt = tok_stream_flush(&s->stream, tail, sizeof tail);
    text_append(s, tail, nt);
    int64_t stop_at = why == ENGINE_FINISH_CANCELLED ? -1 : find_stop(s);
    size_t len = stop_at >= 0 ? (size_t)stop_at : s->text_len;
    if (stop_at >= 0 && s->req.include_stop) { /* the stop string too */
        len += strlen(s->stops.first_pat);
        if (len > s->text_len) len = s->text_len;
    }
    if (s->cut_at >= 0 && (size_t)s->cut_at < len) len = (size_t)s->cut_at;
    for (int i = 0; stop_at >= 0 && i < s->req.n_stop; i++)
        if (s->stop[i] == s->stops.first_pat) s->stats.stop_index = i;
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

/* llama-server's code-completion stops (engine_request.n_indent,
 * max_predict_s) over the bytes [from, text_len) the token added: true when
 * they end the request, s->cut_at set where a short indentation cut it. */
static bool completion_stops(seq *s, size_t from) {
    bool newline = false;
    for (size_t i = from; i < s->text_len; i++) {
        const char ch = s->text[i];
        if (s->req.n_indent > 0 && s->line_start) {
            if (ch == ' ' || ch == '\t') {
                s->indent++;
                continue;
            }
            s->line_start = false;
            if (s->indent < s->req.n_indent) {
                s->cut_at = (int64_t)i;
                return true;
            }
        }
        if (ch == '\n') newline = true, s->line_start = true, s->indent = 0;
    }
    return newline && s->req.max_predict_s > 0 &&
           kvl_time_s() - s->stats.t_first_token > s->req.max_predict_s;
}

/* The text tok adds to s's stream (a control token's own text when special),
 * in e->piece; returns its bytes. */
static size_t token_text(engine *e, seq *s, int32_t tok, bool special) {
    size_t need =
        3 * tok_token_bytes(e->vocab, tok, special, NULL, 0) + 16; /* U+FFFD may triple bytes */
    if (need > e->piece_cap) {
        char *p = realloc(e->piece, need);
        if (p) {
            e->piece = p;
            e->piece_cap = need;
        }
    }
    return tok_stream_push(&s->stream, e->vocab, tok, special, e->piece, e->piece_cap);
}

/* Handles one sampled token: stop conditions, text streaming. */
void eng_on_token(engine *e, seq *s, int32_t tok, float lp, int n_top, const int32_t *ids,
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
        s->stats.eog_token = tok;
        if (!s->req.eog_text) {
            eng_finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
            return;
        }
        /* its text goes out with the end (never fed back: not in s->tokens) */
        text_append(s, e->piece, token_text(e, s, tok, true));
        eng_finish_seq(e, s, ENGINE_FINISH_STOP, tok, lp, n_top, ids, lps);
        return;
    }
    for (int i = 0; i < s->req.n_stop_ids; i++)
        if (s->stop_ids[i] == tok && s->stats.n_generated >= s->req.min_tokens) {
            s->stats.stop_token = tok;
            if (s->req.include_stop) break; /* its text goes out first: below */
            eng_finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
            return;
        }
    if (s->gst && !grammar_state_accept_token(s->gst, tok)) {
        if ((s->error = grammar_state_error(s->gst))) { /* over a matching bound */
            kvl_log(KVL_LOG_WARN, "engine: request %lld: %s", (long long)s->id, s->error);
            eng_finish_seq(e, s, ENGINE_FINISH_ERROR, -1, 0, 0, NULL, NULL);
            return;
        }
        /* the mask allowed it: cannot happen */
        kvl_log(KVL_LOG_WARN, "engine: request %lld: token %d does not continue its grammar",
                (long long)s->id, tok);
        eng_finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
        return;
    }
    s->tokens[s->n_tokens++] = tok;
    sampler_accept(s->smp, tok);
    if (s->rb.active) rb_accept(&s->rb, tok, token_whole_utf8(e->vocab, tok));
    const size_t n = token_text(e, s, tok, s->req.keep_all_special || keeps_special(s, tok));
    const size_t from = s->text_len;
    text_append(s, e->piece, n);
    /* min_tokens: a stop string found this early does not count (one that
     * ends later still does: the matcher's states carry on) */
    if (s->stats.n_generated < s->req.min_tokens) stop_matcher_forget(&s->stops);
    if (find_stop(s) >= 0 || s->stats.stop_token >= 0) {
        eng_finish_seq(e, s, ENGINE_FINISH_STOP, tok, lp, n_top, ids, lps);
        return;
    }
    if ((s->req.n_indent > 0 || s->req.max_predict_s > 0) && completion_stops(s, from)) {
        eng_finish_seq(e, s, ENGINE_FINISH_LENGTH, tok, lp, n_top, ids, lps);
        return;
    }
    bool at_max = s->req.max_tokens > 0 && s->stats.n_generated >= s->req.max_tokens;
    bool at_ctx = s->n_tokens >= e->cfg.n_ctx;
    if (at_max || at_ctx) {
        eng_finish_seq(e, s, ENGINE_FINISH_LENGTH, tok, lp, n_top, ids, lps);
        return;
    }
    /* full only when max_tokens < 0 (admission sized it for the prompt and max_tokens) */
    if (!kvl_grow((void **)&s->tokens, &s->cap_tokens, (size_t)s->n_tokens + 1, sizeof *s->tokens,
                  256)) {
        eng_finish_seq(e, s, ENGINE_FINISH_LENGTH, tok, lp, n_top, ids, lps);
        return;
    }
    size_t out = s->text_len - stop_holdback(s); /* the rest may still become a stop string */
    emit(s, tok, s->text, out, lp, n_top, ids, lps, ENGINE_FINISH_NONE);
    consume_text(s, out);
}
/* ----------------------------------------------------------------- eval -- */

/* Runs span on a sequence of its own in each of the engine's pools (span->seqs
 * set here, for the call only), reserved for span->to tokens and given back at once: never
 * committed to the prefix cache. Fails with "what: not enough free KV blocks"
 * when the pools cannot hold it, else with model_forward_span's error. */
static bool forward_alone(engine *e, model_span *span, const char *what, kvl_error *err) {
    char no_room[96];
    snprintf(no_room, sizeof no_room, "%s: not enough free KV blocks for %lld tokens right now",
             what, (long long)span->to);
    kv_seq s[MODEL_MAX_KV_GROUPS];
    const kv_seq *seqs[MODEL_MAX_KV_GROUPS];
    bool ok = true;
    for (int g = 0; g < e->n_groups; g++) {
        kv_seq_init(&s[g]);
        seqs[g] = &s[g];
        if (ok && !kv_seq_reserve(e->kv[g], &s[g], span->to)) ok = kvl_fail(err, "%s", no_room);
    }
    span->seqs = seqs;
    ok = ok && model_forward_span(e->m, e->kv, span, err);
    span->seqs = NULL; /* they end here */
    for (int g = 0; g < e->n_groups; g++) kv_seq_free(e->kv[g], &s[g]);
    return ok;
}

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
    bool ok = logits != NULL;
    if (!ok) kvl_fail(err, "eval: out of memory");
    eval_ctx ec = {.on_logits = on_logits, .user = user, .n_vocab = hp->n_vocab};
    model_span span = {
        .tokens = ids, .to = n, .want_to = n, .logits = logits, .on_rows = eval_rows, .user = &ec};
    ok = ok && forward_alone(e, &span, "eval", err);
    kvl_free(logits);
    engine_destroy(e);
    return ok;
}

/* The ids a sequence of its own runs (forward_alone): 1..n_ctx of them, each
 * in the vocabulary; what names the caller in the message. */
static bool check_alone_ids(const engine *e, const char *what, const int32_t *ids, int64_t n,
                            kvl_error *err) {
    const int64_t V = model_hp(e->m)->n_vocab;
    if (n < 1) return kvl_fail(err, "%s: the input is empty", what);
    if (n > e->cfg.n_ctx)
        return kvl_fail(err, "%s: the input has %lld tokens, more than the context of %lld", what,
                        (long long)n, (long long)e->cfg.n_ctx);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return kvl_fail(err, "%s: token %lld (id %d) is not in the vocabulary", what,
                            (long long)i, ids[i]);
    return true;
}

/* Each logits row of a prompt's span -> the next token's logprob and the top k. */
typedef struct prompt_lp_ctx {
    const int32_t *ids;
    int64_t n_vocab;
    int top_k;
    float *lp;
    int32_t *top_ids;
    float *top_lps;
    int32_t *rank; /* NULL: not wanted */
} prompt_lp_ctx;

static void prompt_lp_rows(void *user, int64_t pos, int64_t n, const float *logits,
                           const float *hidden) {
    (void)hidden;
    const prompt_lp_ctx *c = user;
    for (int64_t r = 0; r < n; r++) {
        const float *row = logits + r * c->n_vocab;
        const int64_t p = pos + r + 1; /* the row predicts the token after pos + r */
        c->lp[p] = (float)(row[c->ids[p]] - logits_logsumexp(row, (int32_t)c->n_vocab));
        if (c->rank) { /* vLLM's: how many tokens are at least as likely, itself included */
            const float x = row[c->ids[p]];
            int32_t k = 0;
            for (int64_t v = 0; v < c->n_vocab; v++) k += row[v] >= x;
            c->rank[p] = k;
        }
        if (c->top_k > 0)
            logits_top_k(row, (int32_t)c->n_vocab, c->top_k, c->top_ids + p * c->top_k,
                         c->top_lps + p * c->top_k);
    }
}

bool engine_prompt_logprobs(engine *e, const int32_t *ids, int64_t n, const float *lora, int top_k,
                            float *lp, int32_t *top_ids, float *top_lps, int32_t *rank,
                            kvl_error *err) {
    const model_hparams *hp = model_hp(e->m);
    if (!check_alone_ids(e, "prompt logprobs", ids, n, err)) return false;
    if (top_k < 0 || top_k > MAX_TOP_LOGPROBS || top_k > hp->n_vocab)
        return kvl_fail(err, "prompt logprobs: top_k %d (0..%d)", top_k, MAX_TOP_LOGPROBS);
    lp[0] = NAN;
    if (rank) rank[0] = 0;
    if (n == 1) return true;
    float *rows = kvl_alloc(MODEL_SPAN_CHUNK * hp->n_vocab * sizeof(float));
    if (!rows) return kvl_fail(err, "prompt logprobs: out of memory");
    prompt_lp_ctx c = {.ids = ids,
                       .n_vocab = hp->n_vocab,
                       .top_k = top_k,
                       .lp = lp,
                       .top_ids = top_ids,
                       .top_lps = top_lps,
                       .rank = rank};
    model_span span = {.tokens = ids,
                       .to = n,
                       .want_from = 0,
                       .want_to = n - 1,
                       .logits = rows,
                       .on_rows = prompt_lp_rows,
                       .user = &c,
                       .lora = lora};
    bool ok = forward_alone(e, &span, "prompt logprobs", err);
    kvl_free(rows);
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

/* llama.cpp's common_embd_normalize, its float and double steps: the scale
 * is -1 none, 0 the largest magnitude to 32760 (int16's range), 2 the
 * Euclidean norm (squares in float, summed in double), p the p-norm. */
static void embd_normalize(const float *in, float *out, int64_t n, int p) {
    double sum = 0.0;
    if (p == -1) sum = 1.0;
    else if (p == 0) {
        for (int64_t i = 0; i < n; i++)
            if (sum < fabsf(in[i])) sum = fabsf(in[i]);
        sum /= 32760.0;
    } else if (p == 2) {
        for (int64_t i = 0; i < n; i++) sum += in[i] * in[i];
        sum = sqrt(sum);
    } else {
        for (int64_t i = 0; i < n; i++) sum += pow(fabsf(in[i]), p);
        sum = pow(sum, 1.0 / p);
    }
    const float scale = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int64_t i = 0; i < n; i++) out[i] = in[i] * scale;
}

bool engine_embed(engine *e, const int32_t *ids, int64_t n, engine_pooling pooling, int normalize,
                  const float *lora, float *out, kvl_error *err) {
    const model_hparams *hp = model_hp(e->m);
    const int64_t E = hp->n_embd;
    if (normalize < -1)
        return kvl_fail(err, "embedding: normalisation %d is not -1, 0 or p > 0", normalize);
    if (!check_alone_ids(e, "embedding", ids, n, err)) return false;
    float *rows = kvl_alloc(MODEL_SPAN_CHUNK * E * sizeof(float));
    double *acc = calloc((size_t)E, sizeof *acc);
    bool ok = rows && acc;
    if (!ok) kvl_fail(err, "embedding: out of memory");
    embed_ctx ec = {.acc = acc, .n_embd = E};
    model_span span = {.tokens = ids,
                       .to = n,
                       .want_from = pooling == ENGINE_POOL_LAST ? n - 1 : 0,
                       .want_to = pooling == ENGINE_POOL_CLS ? 1 : n,
                       .hidden = rows,
                       .on_rows = embed_rows,
                       .user = &ec,
                       .lora = lora};
    ok = ok && forward_alone(e, &span, "embedding", err);
    if (ok) {
        /* the pooled row (one row's values exactly; a mean summed in double) */
        const double div = pooling == ENGINE_POOL_MEAN ? (double)n : 1.0;
        for (int64_t k = 0; k < E; k++) rows[k] = (float)(acc[k] / div);
        embd_normalize(rows, out, E, normalize);
    }
    kvl_free(rows);
    free(acc);
    return ok;
}

bool engine_rank(engine *e, const int32_t *ids, int64_t n, const float *lora, float *out,
                 kvl_error *err) {
    const model_hparams *hp = model_hp(e->m);
    if (hp->n_cls_out == 0)
        return kvl_fail(err, "rerank: the model has no classifier head (tensor "
                             "'cls.output.weight', as Qwen3-Reranker files carry)");
    if (!check_alone_ids(e, "rerank", ids, n, err)) return false;
    float *row = kvl_alloc((size_t)hp->n_embd * sizeof(float));
    if (!row) return kvl_fail(err, "rerank: out of memory");
    /* one wanted row: the last token's, left in row after the span */
    model_span span = {
        .tokens = ids, .to = n, .want_from = n - 1, .want_to = n, .hidden = row, .lora = lora};
    bool ok = forward_alone(e, &span, "rerank", err) && model_classify(e->m, row, out, err);
    kvl_free(row);
    return ok;
}

const model *engine_model(const engine *e) { return e->m; }

/* The full blocks of ids[0..n) under this salt and these LoRA scales in s
 * (initialised here; the caller frees it), committed to the prefix cache:
 * what RAM (or the disk tier) holds attached, the rest computed like a
 * prompt. Returns the tokens the blocks hold, or -1 with err. */
static int64_t prefix_blocks(engine *e, const int32_t *ids, int64_t n, const char *salt,
                             const float *lora, uint64_t root, kv_seq *s, kvl_error *err) {
    kv_seq_init(s);
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
    if (root) {
        kv_seq_set_chain_root(s, root);
    } else {
        char *chain = engine_cache_salt(e, salt, lora, NULL, NULL); /* as engine_submit salts */
        if (!chain) {
            kvl_fail(err, "engine: out of memory");
            return -1;
        }
        kv_seq_set_cache_salt(s, chain);
        free(chain);
    }
    const kv_seq *seqs[1] = {s};
    int64_t done = e->disk ? kv_disk_prefix_match(e->disk, s, ids, full)
                           : kv_prefix_match(e->kv[0], s, ids, full);
    if (root && done < full) { /* its salt and adapters are not known: nothing to compute with */
        kvl_fail(err, "%lld of its %lld tokens' KV blocks are no longer cached",
                 (long long)(full - done), (long long)full);
        return -1;
    }
    if (!kv_seq_reserve(e->kv[0], s, full)) {
        kvl_fail(err, "not enough free KV blocks for %lld tokens right now", (long long)full);
        return -1;
    }
    model_span span = {.tokens = ids, .from = done, .to = full, .seqs = seqs, .lora = lora};
    if (!model_forward_span(e->m, e->kv, &span, err)) return -1;
    kv_prefix_commit(e->kv[0], s, ids, full);
    return full;
}

int64_t engine_kv_save(engine *e, const int32_t *ids, int64_t n, const char *salt,
                       const float *lora, kvl_error *err) {
    if (!e->disk) {
        kvl_fail(err, "the KV disk tier is off (start with --kv-disk DIR)");
        return -1;
    }
    kv_seq s;
    const int64_t full = prefix_blocks(e, ids, n, salt, lora, 0, &s, err);
    const int64_t saved = full < 0 ? -1 : kv_disk_save(e->disk, &s, full / e->cfg.block_size, err);
    kv_seq_free(e->kv[0], &s);
    return saved;
}

/* Why a prefix file cannot be written or read here (NULL: it can). */
static const char *no_prefix_files(const engine *e) {
    if (e->n_groups > 1)
        return "this model's sliding-window or chunked layers keep KV in pools of their own, "
               "which slot files do not hold";
    if (!engine_prefix_cache_enabled(e)) return "the prefix cache is off (--no-prefix-cache)";
    return NULL;
}

int64_t engine_kv_export(engine *e, const int32_t *ids, int64_t n, const char *salt,
                         const float *lora, uint64_t chain_root, const char *path,
                         const uint8_t model_id[16], uint64_t *bytes, kvl_error *err) {
    const char *why = no_prefix_files(e);
    if (why) {
        kvl_fail(err, "%s", why);
        return -1;
    }
    kv_seq s;
    int64_t full = prefix_blocks(e, ids, n, salt, lora, chain_root, &s, err);
    if (full >= 0 &&
        !kv_prefix_file_write(path, e->kv[0], model_id, s.chain_root, ids, n, s.blocks, bytes, err))
        full = -1;
    kv_seq_free(e->kv[0], &s);
    return full;
}

int64_t engine_kv_import(engine *e, const char *path, const uint8_t model_id[16], int32_t **ids,
                         int64_t *n_ids, uint64_t *chain_root, uint64_t *bytes, kvl_error *err) {
    *ids = NULL;
    *n_ids = 0;
    *chain_root = 0;
    const char *why = no_prefix_files(e);
    if (why) {
        kvl_fail(err, "%s", why);
        return -1;
    }
    kv_prefix_file *f = kv_prefix_file_open(path, e->kv[0], model_id, e->cfg.n_ctx, err);
    if (!f) return -1;
    int64_t n = 0, full = -1;
    const int32_t *tok = kv_prefix_file_tokens(f, &n);
    const int64_t nb = kv_prefix_file_blocks(f), bs = e->cfg.block_size;
    const int64_t n_vocab = model_hp(e->m)->n_vocab;
    uint8_t **dst = calloc((size_t)(nb > 0 ? nb : 1), sizeof *dst);
    int32_t *copy = malloc((size_t)n * sizeof *copy);
    kv_seq s;
    kv_seq_init(&s);
    kv_seq_set_chain_root(&s, kv_prefix_file_chain_root(f)); /* the chain it was computed under */
    bool ok = dst && copy;
    if (!ok) kvl_fail(err, "engine: out of memory");
    for (int64_t i = 0; ok && i < n; i++)
        if (tok[i] < 0 || tok[i] >= n_vocab)
            ok = kvl_fail(err, "%s is damaged: token %lld (id %d) is not in the vocabulary", path,
                          (long long)i, tok[i]);
    if (ok) {
        /* blocks the cache holds already stay as they are; fresh ones take the file's bytes */
        const int64_t have = kv_prefix_match(e->kv[0], &s, tok, nb * bs) / bs;
        if (!kv_seq_reserve(e->kv[0], &s, nb * bs))
            ok = kvl_fail(err, "not enough free KV blocks for %lld tokens right now",
                          (long long)(nb * bs));
        for (int64_t i = have; ok && i < nb; i++) dst[i] = kv_block_k(e->kv[0], s.blocks[i], 0);
    }
    ok = ok && kv_prefix_file_read_blocks(f, dst, bytes, err);
    if (ok) {
        kv_prefix_commit(e->kv[0], &s, tok, nb * bs);
        memcpy(copy, tok, (size_t)n * sizeof *copy);
        *ids = copy;
        *n_ids = n;
        *chain_root = s.chain_root;
        copy = NULL;
        full = nb * bs;
    }
    kv_seq_free(e->kv[0],
                &s); /* the blocks stay in the prefix cache (or, if not committed, free) */
    free(copy);
    free(dst);
    kv_prefix_file_close(f);
    return full;
}

/* ------------------------------------------------------------ live view -- */

static bool view_add_seq(const engine *e, engine_view *v, const seq *s) {
    if (!kvl_grow((void **)&v->seqs, &v->cap_seqs, (size_t)v->n_seqs + 1, sizeof *v->seqs, 64))
        return false;
    engine_seq_view *o = &v->seqs[v->n_seqs++];
    bool running = s->state == SEQ_RUNNING;
    *o = (engine_seq_view){.id = s->id,
                           .n_prompt = s->n_prompt,
                           .n_generated = s->stats.n_generated,
                           .n_cached_prompt = s->stats.n_cached_prompt,
                           .n_computed = s->n_computed,
                           .n_preemptions = s->stats.n_preemptions,
                           .t_submit = s->stats.t_submit,
                           .kv = {.tokens = s->n_computed},
                           .sampling = s->req.sampling,
                           .max_tokens = s->req.max_tokens,
                           .top_logprobs = s->req.top_logprobs,
                           .ignore_eos = s->req.ignore_eos,
                           .speculative = e->cfg.spec != ENGINE_SPEC_OFF && !s->req.no_speculative,
                           .last_token = s->stats.n_generated > 0 && s->n_tokens > s->n_prompt
                                             ? s->tokens[s->n_tokens - 1]
                                             : -1};
    o->phase = !running ? (s->stats.n_preemptions ? ENGINE_PHASE_PREEMPTED : ENGINE_PHASE_WAITING)
               : s->n_computed < s->n_tokens - 1 || s->stats.n_generated == 0
                   ? ENGINE_PHASE_PREFILLING
                   : ENGINE_PHASE_DECODING;
    for (int g = 0; g < e->n_groups; g++) {
        kv_usage u = kv_seq_usage(e->kv[g], &s->kv[g], kv_attn_kept(e->attn[g], s->n_computed));
        kv_usage_add(&o->kv, &u);
        const kv_seq *k = &s->kv[g];
        if (!kvl_grow((void **)&v->tables, &v->cap_tables, (size_t)(v->n_tables + k->n_blocks),
                      sizeof *v->tables, 1024))
            return false;
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
        v->window[g] = e->attn[g].window;
        v->chunk[g] = e->attn[g].chunk;
        v->block_bytes[g] = kv_pool_geometry(e->kv[g])->block_bytes;
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
