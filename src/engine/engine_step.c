/* engine_step: one step executed: the plan (engine_sched.c), the forward,
 * sampling under grammars, speculative verification, and finished sequences
 * given back. */
#include "engine.h"
#include "spec.h"
#include "engine_events.h"
#include "engine_internal.h"

#include <math.h>
#include <string.h>

/* Masks e->logits_tmp to the tokens s's grammar allows. When it allows none
 * (the grammar must end but the vocabulary has no end-of-generation token, or
 * the vocabulary cannot spell what the grammar needs), s finishes here; when
 * the matcher went over its bounds (grammar.h), s ends with an error. */
static bool apply_grammar(engine *e, seq *s, int32_t V) {
    int32_t n = grammar_state_mask(s->gst, e->mask, V);
    if (n < 0) {
        s->error = grammar_state_error(s->gst);
        kvl_log(KVL_LOG_WARN, "engine: request %lld: %s", (long long)s->id,
                s->error ? s->error : "grammar failed");
        eng_finish_seq(e, s, ENGINE_FINISH_ERROR, -1, 0, 0, NULL, NULL);
        return false;
    }
    if (n == 0) {
        if (!grammar_state_must_end(s->gst))
            kvl_log(KVL_LOG_WARN,
                    "engine: request %lld: no token of the vocabulary continues its grammar",
                    (long long)s->id);
        eng_finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
        return false;
    }
    float *l = e->logits_tmp;
    for (int32_t i = 0; i < V; i++)
        if (!(e->mask[i >> 5] >> (i & 31) & 1)) l[i] = -INFINITY;
    return true;
}

/* A request's own bans on the sampler's logits: allowed (vLLM's
 * allowed_token_ids), its bad words, and while fewer than min_tokens are out its stop ids
 * and the end-of-generation tokens (not under a grammar: where it must end,
 * it ends). True when they banned anything. */
static bool mask_request(engine *e, const seq *s, int32_t V) {
    float *l = e->logits_tmp;
    bool banned = false;
    if (s->allowed) {
        banned = true;
        for (int32_t i = 0; i < V; i++)
            if (!(s->allowed[i >> 5] >> (i & 31) & 1)) l[i] = -INFINITY;
    }
    /* bad words: a sequence's last token where the output ends with the rest */
    const int32_t *out = s->tokens + s->n_prompt;
    const int64_t n_out = s->n_tokens - s->n_prompt;
    for (int i = 0, at = 0; i < s->req.n_bad; at += s->bad_lens[i++]) {
        const int len = s->bad_lens[i];
        if (len - 1 > n_out ||
            memcmp(out + n_out - (len - 1), s->bad_ids + at, (size_t)(len - 1) * sizeof *out))
            continue;
        l[s->bad_ids[at + len - 1]] = -INFINITY;
        banned = true;
    }
    if (s->stats.n_generated < s->req.min_tokens) {
        for (int32_t i = 0; !s->gst && i < e->n_eog_ids; i++) l[e->eog_ids[i]] = -INFINITY;
        for (int i = 0; i < s->req.n_stop_ids; i++) l[s->stop_ids[i]] = -INFINITY;
        banned = true;
    }
    return banned;
}

/* Whether any token is left to sample. */
static bool any_token(const float *l, int32_t V) {
    for (int32_t i = 0; i < V; i++)
        if (l[i] > -INFINITY) return true;
    return false;
}

static void sample_outputs(engine *e, const step_plan *p) {
    int64_t V = model_hp(e->m)->n_vocab, row = 0;
    int32_t ids[MAX_TOP_LOGPROBS];
    float lps[MAX_TOP_LOGPROBS];
    const batch_buf *in = &e->b->in;
    for (int64_t t = 0; t < p->n_tokens; t++) {
        if (!in->want[t]) continue;
        seq *s = e->b->owner[in->seq[t]];
        const float *lg = in->logits + row++ * V;
        /* A draft's row counts only while every token before it was accepted:
         * the sequence's text must be exactly what the row was computed on. */
        const int64_t pos = in->pos[t];
        if (s->state == SEQ_DONE || pos != s->n_tokens - 1 || s->tokens[pos] != in->tokens[t])
            continue;
        if (pos >= s->n_computed) { /* an accepted draft: its K/V is the sequence's now */
            s->n_computed = pos + 1;
            s->n_accepted++;
            e->metrics.spec_accepted_tokens++;
        }
        /* exp over the whole vocabulary (128K for Llama 3) only when asked */
        const bool post = s->req.post_sampling_probs;
        const bool want_lp = !post && (s->req.logprobs || s->req.top_logprobs > 0);
        double lse = want_lp ? logits_logsumexp(lg, (int32_t)V) : NAN;
        int n_top = post ? 0 : logits_top_k(lg, (int32_t)V, s->req.top_logprobs, ids, lps);
        memcpy(e->logits_tmp, lg, V * sizeof(float));
        for (int i = 0; i < s->req.n_logit_bias; i++)
            e->logits_tmp[s->bias[i].token] += s->bias[i].bias;
        const int32_t forced = s->gst ? -1 : rb_forced(&s->rb); /* the thinking budget spent */
        if (forced >= 0) {
            eng_on_token(e, s, forced, want_lp ? (float)(lg[forced] - lse) : NAN, n_top, ids, lps);
            continue;
        }
        const bool banned = mask_request(e, s, (int32_t)V);
        if (s->gst && !apply_grammar(e, s, (int32_t)V)) continue;
        if (banned && !any_token(e->logits_tmp, (int32_t)V)) { /* the bans left nothing */
            kvl_log(KVL_LOG_WARN, "engine: request %lld: no token is allowed here",
                    (long long)s->id);
            eng_finish_seq(e, s, ENGINE_FINISH_STOP, -1, 0, 0, NULL, NULL);
            continue;
        }
        if (post) { /* the chain's candidates and their probabilities */
            float p_tok;
            const int32_t tok = sampler_sample_chain(s->smp, e->logits_tmp, NULL);
            n_top = sampler_chain_top(s->smp, s->req.top_logprobs, tok, ids, lps, &p_tok);
            eng_on_token(e, s, tok, p_tok, n_top, ids, lps);
            continue;
        }
        int32_t tok = sampler_sample(s->smp, e->logits_tmp);
        eng_on_token(e, s, tok, want_lp ? (float)(lg[tok] - lse) : NAN, n_top, ids, lps);
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
    for (int g = 0; e->prefix_cache && g < e->n_groups; g++)
        kv_prefix_commit(e->kv[g], &s->kv[g], s->tokens, s->n_computed);
    if (e->drafter) spec_drafter_rollback(e->drafter, &s->dseq, s->n_computed);
}

/* Allocations evict inside kv: logs how many. */
static void log_evictions(engine *e) {
    for (int g = 0; g < e->n_groups; g++) {
        int64_t ev = kv_pool_n_evicted(e->kv[g]);
        if (ev > e->n_evicted_seen[g])
            ev_ring_push(e->events, ENGINE_EV_EVICT, 0, ev - e->n_evicted_seen[g], g);
        e->n_evicted_seen[g] = ev;
    }
}

/* The step's forward is done: its tokens are computed, the outputs sampled and
 * the sequences that finished given back. */
static void step_done(engine *e, const step_plan *p) {
    e->metrics.steps++;
    if (p->n_tokens > e->metrics.step_tokens_max) e->metrics.step_tokens_max = p->n_tokens;
    e->metrics.step_seqs_total += p->n_seqs;
    for (int si = 0; si < p->n_seqs; si++) {
        seq *s = e->b->owner[si];
        for (int64_t t = 0; t < p->n_tokens; t++)
            if (e->b->in.seq[t] == si) s->n_computed++;
        s->n_computed -= s->n_draft; /* drafts count once accepted (sample_outputs) */
        for (int g = 0; e->prefix_cache && g < e->n_groups; g++)
            kv_prefix_commit(e->kv[g], &s->kv[g], s->tokens, s->n_computed);
        eng_emit_progress(s); /* a prompt chunk computed (nothing once it generates) */
    }
    sample_outputs(e, p);
    if (e->spec)
        for (int si = 0; si < p->n_seqs; si++) finish_drafts(e, e->b->owner[si]);
    for (int i = 0; i < e->n_running;) {
        seq *s = e->running[i];
        if (s->state == SEQ_DONE) {
            eng_running_remove(e, i);
            eng_seq_free(e, s);
        } else {
            i++;
        }
    }
}

/* Finishes the oldest step in flight. */
static bool finish_oldest(engine *e, kvl_error *err) {
    const int k = e->fl_head;
    const bool ok = model_forward_wait(e->m, err);
    e->fl_head = (k + 1) % e->n_slots;
    e->n_flight--;
    e->b = &e->slots[k];
    const step_plan *p = &e->slots[k].plan;
    for (int si = 0; si < p->n_seqs; si++) e->b->owner[si]->flight = 0;
    if (ok) step_done(e, p);
    return ok;
}

void eng_drain_steps(engine *e) {
    kvl_error err = {{0}};
    while (e->n_flight > 0)
        if (!finish_oldest(e, &err)) kvl_log(KVL_LOG_WARN, "engine: %s", err.msg);
}

/* Step groups: plans and launches a step for every free slot (each over the
 * sequences with no step in flight), then finishes the oldest step in
 * flight. In a pipeline the stages compute the launched steps while this
 * samples the oldest one's outputs and plans its group's next step. */
static bool step_groups(engine *e, kvl_error *err) {
    eng_drop_cancelled(e);
    while (e->n_flight < e->n_slots) {
        const int k = (e->fl_head + e->n_flight) % e->n_slots;
        e->b = &e->slots[k];
        step_plan *p = &e->slots[k].plan;
        eng_plan_step(e, p);
        log_evictions(e);
        if (p->n_tokens == 0) break;
        for (int si = 0; si < p->n_seqs; si++) e->b->owner[si]->flight = k + 1;
        e->n_flight++;
        model_batch b = batch_buf_batch(&e->b->in, p->n_tokens, p->n_seqs);
        if (!model_forward_launch(e->m, e->kv, &b, e->b->in.logits, err)) {
            e->n_flight--;
            for (int si = 0; si < p->n_seqs; si++) e->b->owner[si]->flight = 0;
            return false;
        }
    }
    if (e->n_flight == 0) {
        if (e->waiting && e->n_running == 0)
            return kvl_fail(err, "engine: no KV blocks free for the next request");
        return true;
    }
    return finish_oldest(e, err);
}

bool engine_step(engine *e, kvl_error *err) {
    if (e->n_slots > 1) return step_groups(e, err);
    const double t_step = e->spec ? kvl_time_s() : 0; /* the whole step: what drafts cost */
    e->step_draft_s = 0;
    eng_drop_cancelled(e);
    if (e->disk) kv_disk_reap(e->disk); /* blocks of reads cancelled mid-way */
    step_plan p;
    eng_plan_step(e, &p);
    e->disk_stalled = p.n_tokens == 0 && e->disk && kv_disk_has_loads(e->disk);
    log_evictions(e);
    if (p.n_tokens == 0) {
        if (e->disk_stalled) { /* nothing to compute until a read finishes */
            /* Reads done but not admitted (the head of the queue waits for
             * blocks) go to the RAM cache, where they are evictable, rather than
             * hold their blocks meanwhile. */
            for (seq *s = e->waiting; s; s = s->next)
                if (s->load && !eng_seq_loading(e, s) && eng_prefix_attach(e, s))
                    eng_seq_forget_kv(e, s);
            if (!e->disk_wake) kv_disk_wait_loads(e->disk);
            return true;
        }
        if (e->waiting && e->n_running == 0)
            return kvl_fail(err, "engine: no KV blocks free for the next request");
        return true;
    }
    if (e->drafter) eng_draft_all(e, &p);
    model_batch b = batch_buf_batch(&e->b->in, p.n_tokens, p.n_seqs);
    if (!model_forward(e->m, e->kv, &b, e->b->in.logits, err)) return false;
    step_done(e, &p);
    if (e->spec) spec_cost_observe(&e->cost, p.n_tokens, kvl_time_s() - t_step - e->step_draft_s);
    return true;
}
