/* engine scheduler: planning a step's batch, admission from the waiting
 * queue (FIFO, priority, prefix-aware, disk-tier reads), preemption, and the
 * speculative drafts of each step. See engine_internal.h. */
#include "engine.h"
#include "spec.h"
#include "engine_events.h"
#include "engine_internal.h"

#include <string.h>

_Static_assert(ENGINE_SPEC_MAX_NGRAM <= SPEC_NGRAM_MAX, "the n-gram index covers --spec-ngram");

/* ------------------------------------------------------------ scheduler -- */

void eng_running_remove(engine *e, int idx) {
    memmove(e->running + idx, e->running + idx + 1, (e->n_running - idx - 1) * sizeof(seq *));
    e->n_running--;
}

/* Drops the sequence's blocks (cached ones stay findable) and its progress. */
void eng_seq_forget_kv(engine *e, seq *s) {
    for (int g = 0; g < e->n_groups; g++) kv_seq_release(e->kv[g], &s->kv[g]);
    spec_dseq_release(e->drafter, &s->dseq, false);
    s->n_computed = 0;
}

/* The longest prefix every group can resume from, attached: n tokens whose
 * full-attention groups hold all their blocks and whose chunked group (at most
 * one) the blocks a token at n attends to. The full groups are probed first,
 * so a chunked group that holds less makes them attach less. */
static int64_t prefix_match_groups(engine *e, seq *s, int64_t n) {
    for (int g = 0; g < e->n_groups; g++)
        if (!kv_attn_limited(e->attn[g])) {
            int64_t h = kv_prefix_probe(e->kv[g], s->kv[g].chain_root, s->tokens, n);
            n = h < n ? h : n;
        }
    for (int g = 0; g < e->n_groups; g++)
        if (kv_attn_limited(e->attn[g]))
            n = kv_prefix_match_tail(e->kv[g], &s->kv[g], s->tokens, n, e->attn[g]);
    bool ok = true;
    for (int g = 0; g < e->n_groups; g++)
        if (!kv_attn_limited(e->attn[g]))
            ok = kv_prefix_match(e->kv[g], &s->kv[g], s->tokens, n) == n && ok;
    if (ok) return n;
    for (int g = 0; g < e->n_groups; g++) kv_seq_release(e->kv[g], &s->kv[g]); /* out of memory */
    return 0;
}

/* Attaches the longest cached prefix of full blocks to a sequence about to be
 * admitted. The last token is never taken from the cache: its logits are needed.
 * False while blocks of it are being read from the disk tier (the sequence
 * waits; the others go on). */
bool eng_prefix_attach(engine *e, seq *s) {
    if (!e->prefix_cache || s->n_computed > 0) return true;
    if (e->disk) {
        int64_t from_disk = 0, have = kv_disk_prefix_step(e->disk, &s->kv[0], s->tokens,
                                                          s->n_tokens - 1, &s->load, &from_disk);
        if (s->stats.n_generated == 0) s->stats.n_disk_prompt += from_disk;
        if (s->load) return false;
        s->n_computed = have;
    } else {
        s->n_computed = prefix_match_groups(e, s, s->n_tokens - 1);
    }
    e->metrics.prefix_cache_queries += s->n_tokens;
    e->metrics.prefix_cache_hits += s->n_computed;
    if (s->stats.n_generated == 0) {
        s->stats.n_cached_prompt = s->n_computed;
        if (s->stats.n_disk_prompt > s->n_computed) s->stats.n_disk_prompt = s->n_computed;
    }
    eng_emit_progress(s); /* what the prefix cache gave */
    return true;
}

/* Whether s waits for a read from the disk tier that is not done yet. */
bool eng_seq_loading(const engine *e, const seq *s) {
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
    const int g = e->prefix_group;
    return kv_prefix_probe(e->kv[g], s->kv[g].chain_root, s->tokens, s->n_tokens - 1);
}

/* The link of the waiting sequence to admit next (NULL: none waits). An
 * admission (admit true) counts the pass-over of the one next in order. */
static seq **pick_waiting(engine *e, bool admit) {
    enum { PREFIX_SCAN = 32 }; /* waiting requests compared by cached prefix */
    seq **best = &e->waiting;
    while (*best && eng_seq_loading(e, *best)) best = &(*best)->next;
    if (!*best) return NULL;
    if (e->cfg.scheduling ==
        ENGINE_SCHED_PRIORITY) /* the first of the lowest value: list order is arrival */
        for (seq **pp = &(*best)->next; *pp; pp = &(*pp)->next)
            if ((*pp)->req.priority < (*best)->req.priority && !eng_seq_loading(e, *pp)) best = pp;
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
    int i = e->n_running - 1;
    while (e->running[i]->flight) i--; /* with step groups: the newest with no step in flight */
    seq *s = e->running[i];
    eng_running_remove(e, i);
    ev_ring_push(e->events, ENGINE_EV_PREEMPT, s->id, kv_seq_n_held(&s->kv[0]), s->n_tokens);
    eng_seq_forget_kv(e, s);
    s->state = SEQ_WAITING;
    s->stats.n_preemptions++;
    e->metrics.n_preemptions++;
    s->next = e->waiting;
    e->waiting = s;
}

/* Adds tokens [n_computed, n_computed + n) of s to the batch. */
static void plan_add(engine *e, step_plan *p, seq *s, int64_t n) {
    step_slot *b = e->b;
    int si = p->n_seqs++;
    batch_buf_set_seq(&b->in, si, s->kv);
    batch_buf_set_lora(&b->in, si, s->n_lora ? s->lora : NULL);
    b->owner[si] = s;
    for (int64_t i = 0; i < n; i++) {
        int64_t pos = s->n_computed + i;
        int32_t tok = pos < s->n_tokens ? s->tokens[pos] : s->draft[pos - s->n_tokens];
        /* the last token's logits are wanted, and every draft's */
        batch_buf_set_token(&b->in, p->n_tokens++, tok, pos, si, pos >= s->n_tokens - 1);
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
        /* A sliding or chunked group keeps only what the next token can see
         * (later tokens of this chunk see no less: kv_attn_first never decreases). */
        int64_t dropped =
            e->cfg.keep_unattended_kv
                ? 0
                : kv_seq_drop_unattended(e->kv[g], &s->kv[g], s->n_computed, e->attn[g]);
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

void eng_drop_cancelled(engine *e) {
    for (int i = 0; i < e->n_running;) {
        seq *s = e->running[i];
        if (!s->cancelled || s->flight) { /* in flight: once its step is back */
            i++;
            continue;
        }
        eng_running_remove(e, i);
        eng_finish_seq(e, s, ENGINE_FINISH_CANCELLED, -1, 0, 0, NULL, NULL);
        eng_seq_free(e, s);
    }
    for (seq **pp = &e->waiting; *pp;) {
        seq *s = *pp;
        if (!s->cancelled) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        eng_finish_seq(e, s, ENGINE_FINISH_CANCELLED, -1, 0, 0, NULL, NULL);
        eng_seq_free(e, s);
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
            return l->kv[e->prefix_group].n_hashed < want && l->n_computed < l->n_prompt;
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
        int matched, m;
        if (!s->ngram) s->ngram = spec_ngram_index_create(e->cfg.spec_ngram);
        if (s->ngram)
            m = spec_ngram_index_propose(s->ngram, s->tokens, s->n_tokens, (int)k, s->draft,
                                         &matched);
        else /* out of memory: the scan needs none */
            m = spec_ngram_propose(s->tokens, s->n_tokens, e->cfg.spec_ngram, (int)k, s->draft,
                                   &matched);
        return e->cfg.spec_fixed ? m
                                 : spec_adapt_choose(&s->adapt, &e->cost, base, m, matched, false);
    }
    if (!e->cfg.spec_fixed) k = spec_adapt_choose(&s->adapt, &e->cost, base, (int)k, 0, true);
    if (k <= 0) return 0;
    /* The draft model drafts for every sequence at once once the step is
     * planned (eng_draft_all); until then a valid placeholder. */
    for (int i = 0; i < k; i++) s->draft[i] = s->tokens[s->n_tokens - 1];
    return spec_drafter_reserve(e->drafter, &s->dseq, s->n_tokens, (int)k);
}

/* Draft model: the drafts of every sequence in the step from one set of
 * draft forwards (all sequences in each), written into the planned batch. */
void eng_draft_all(engine *e, const step_plan *p) {
    int n = 0;
    for (int si = 0; si < p->n_seqs; si++) {
        seq *s = e->b->owner[si];
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
    batch_buf *in = &e->b->in;
    for (int64_t t = 0; t < p->n_tokens; t++) {
        const seq *s = e->b->owner[in->seq[t]];
        if (in->pos[t] >= s->n_tokens) in->tokens[t] = s->draft[in->pos[t] - s->n_tokens];
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
    for (;;) {
        int i = e->n_running - 1;
        while (i >= 0 && e->running[i]->flight) i--;
        if (i < 0 || e->running[i]->req.priority <= w->req.priority ||
            (e->n_running < e->cfg.max_seqs && kv_pool_n_free(e->kv[0]) >= need))
            break;
        preempt_newest(e);
    }
}

/* Sequences one step may hold: with step groups, an equal share of those
 * running and those that could be admitted, so the groups stay even (a group
 * left small by finished sequences grows back as the others wait a step). */
static int step_seq_cap(const engine *e) {
    if (e->n_slots <= 1) return e->cfg.max_seqs;
    int n = e->n_running;
    for (const seq *s = e->waiting; s && n < e->cfg.max_seqs; s = s->next) n++;
    return n == 0 ? 1 : (n + e->n_slots - 1) / e->n_slots;
}

void eng_plan_step(engine *e, step_plan *p) {
    int64_t budget = e->cfg.max_batch_tokens;
    e->spec_left = e->cfg.spec_max_batch;
    p->n_tokens = 0;
    p->n_seqs = 0;
    preempt_for_priority(e);
    const int cap = step_seq_cap(e);
    /* Running sequences, oldest first: decodes (and unfinished prefills);
     * with step groups those with no step in flight. */
    for (int i = 0; i < e->n_running && budget > 0 && p->n_seqs < cap;) {
        seq *s = e->running[i];
        if (s->flight) {
            i++;
            continue;
        }
        /* No cache: once per new token, forget everything and recompute the prefix
         * (a chunked recompute that happens to stop at n_tokens-1 must go on). */
        if (e->cfg.no_kv_cache && s->n_computed == s->n_tokens - 1 && s->n_computed > 0 &&
            s->recompute_for != s->n_tokens) {
            eng_seq_forget_kv(e, s);
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
    while (budget > 0 && e->n_running < e->cfg.max_seqs && p->n_seqs < cap &&
           (link = pick_waiting(e, true))) {
        seq *s = *link;
        if (leader_prefilling(e, s)) break;     /* keeps FIFO order; the leader finishes first */
        if (!eng_prefix_attach(e, s)) continue; /* reading from disk: pick_waiting skips it now */
        int64_t n = reserve_chunk(e, s, budget);
        if (n == 0) {
            eng_seq_forget_kv(e, s); /* give the cached blocks back; retry next step */
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
                             s->kv[e->prefix_group].n_blocks);
        }
        ev_ring_push(e->events, ENGINE_EV_ADMIT, s->id, n, s->n_computed);
        plan_add(e, p, s, n);
        budget -= n;
    }
}
