/* spec: speculative decoding's proposers. The engine verifies what they
 * propose (engine_sched.c: eng_plan_step drafts; engine_step.c: sample_outputs accepts or rejects).
 *
 * Prompt lookup (n-gram): the last n tokens of a sequence are searched for in
 * its earlier text (prompt and output); the tokens that followed the most
 * recent earlier occurrence are the draft. n falls back from ngram_max to 1.
 * How many drafts a sequence verifies is decided per step from its
 * acceptance so far and the measured cost of larger steps (spec_adapt). */
#ifndef KVLLM_SPEC_H
#define KVLLM_SPEC_H

#include "base.h"
#include "kv.h"
#include "model.h"

/* Proposes up to k tokens continuing toks[0..n) into out; returns how many
 * (0: no match). *matched gets the length of the n-gram that matched. */
int spec_ngram_propose(const int32_t *toks, int64_t n, int ngram_max, int k, int32_t *out,
                       int *matched);

/* The same proposals from an index of the text's n-grams, kept up to date as
 * the text grows: the work per step does not grow with the text (the scan
 * above reads all of it when nothing matches). One per sequence; toks must
 * extend the text of the previous call (a shorter text rebuilds the index).
 * Out of memory it answers by the scan. ngram_max: 1..SPEC_NGRAM_MAX. */
#define SPEC_NGRAM_MAX 8
typedef struct spec_ngram_index spec_ngram_index;         /* opaque */
spec_ngram_index *spec_ngram_index_create(int ngram_max); /* NULL: out of memory or bad n */
void spec_ngram_index_destroy(spec_ngram_index *x);
int spec_ngram_index_propose(spec_ngram_index *x, const int32_t *toks, int64_t n, int k,
                             int32_t *out, int *matched);

/* What a step costs: the measured forward time of steps by their token
 * count (an average that follows drift), and of the draft model per drafted
 * position. One per engine; speculation adds tokens only where the
 * measured cost says the expected extra tokens pay for them. */
#define SPEC_COST_N 65 /* steps of up to 64 tokens are measured */
typedef struct spec_cost {
    double s[SPEC_COST_N];    /* seconds per forward of n tokens */
    double ref1[SPEC_COST_N]; /* the one-token estimate when s[n] was last set (0: none) */
    int n_obs[SPEC_COST_N];
    double draft_s; /* seconds per draft-model position (all sequences at once) */
    int draft_obs;
    bool frozen; /* given, not measured */
} spec_cost;

/* Empty; or, for benchmarks, the fixed table of KVLLM_SPEC_COST="n:time,..."
 * (e.g. another machine's or model's measured verify costs, so that the
 * drafting decisions are the ones that model would make). */
void spec_cost_init(spec_cost *c);
void spec_cost_observe(spec_cost *c, int64_t n_tokens, double seconds);
void spec_cost_observe_draft(spec_cost *c, int positions, double seconds);
/* Estimated seconds (or, before any measurement, relative units) of a
 * forward of n tokens: measured, interpolated between measured sizes, or
 * extrapolated with a small per-token slope, which makes a size not yet
 * measured worth trying once. A size measured a while ago counts in
 * proportion to the one-token cost now against then: a step's cost grows
 * with the context (attention) and with a neighbour's load, and a size
 * seen rarely must not look cheap for having been measured earlier. */
double spec_cost_at(const spec_cost *c, int64_t n);

/* Per sequence: its acceptance so far, by how long the n-gram match was
 * (1, 2, 3 or more; a draft model's drafts count as the last class), as
 * decayed counts of accepted drafts and of rejections. Drafted tokens are
 * taken as accepted one after another with probability p until the first
 * rejection, p estimated from these counts. */
#define SPEC_CLASSES 3
typedef struct spec_adapt {
    float acc[SPEC_CLASSES], rej[SPEC_CLASSES];
    int wait[SPEC_CLASSES];    /* plain steps left before a one-token probe */
    int backoff[SPEC_CLASSES]; /* the wait after the next probe that fails */
    int cls;                   /* the class of the drafts being verified */
    int explore;               /* choices since the last one-more-than-pays */
} spec_adapt;

void spec_adapt_init(spec_adapt *a);
/* Of m drafts proposed after a match of length matched (0: a draft model),
 * how many to verify in a step that already holds base tokens (one per other
 * decoding sequence at least): the count that maximises expected tokens per
 * second under the cost model (measured whole engine steps), 0 when none gains
 * 5%. When drafting does not pay, a one-draft probe now and then (waits
 * doubling while probes fail) keeps the estimate current, and every 16th
 * choice that drafts takes one more than pays, so that the larger step's cost
 * is measured again. draft_model: each draft also costs a draft position. */
int spec_adapt_choose(spec_adapt *a, const spec_cost *c, int64_t base, int m, int matched,
                      bool draft_model);
void spec_adapt_update(spec_adapt *a, int drafted, int accepted);

/* Draft-model speculation: a small model with the target's vocabulary drafts
 * k tokens greedily. It has pools of its own; each sequence keeps a table per
 * draft KV group and how many of its tokens the draft model has computed. */
typedef struct spec_drafter spec_drafter; /* opaque */
typedef struct spec_dseq {
    kv_seq kv[MODEL_MAX_KV_GROUPS];
    int64_t n_computed;
} spec_dseq;

/* Pools of n_blocks blocks of block_size tokens for the draft model (borrowed). */
spec_drafter *spec_drafter_create(model *draft, int block_size, int kv_dtype, int64_t n_blocks,
                                  kvl_error *err);
/* The bytes those pools take (before creating them: engine_create's memory check). */
uint64_t spec_drafter_pool_bytes(model *draft, int block_size, int kv_dtype, int64_t n_blocks);
void spec_drafter_destroy(spec_drafter *d);
void spec_dseq_init(spec_dseq *ds);
/* Reserves the draft KV for drafting k tokens after toks[0..n) (rolling back
 * what it computed past n - 1 first); returns k, or 0 when its pools are full
 * (the sequence then decodes plainly). */
int spec_drafter_reserve(spec_drafter *d, spec_dseq *ds, int64_t n, int k);
/* One sequence's drafting: k reserved by spec_drafter_reserve, out gets k ids. */
typedef struct spec_draft_job {
    spec_dseq *ds;
    const int32_t *toks;
    int64_t n;
    int k;
    int32_t *out;
} spec_draft_job;
/* Drafts every job's k tokens greedily, all sequences in each forward: ragged
 * forwards compute what the draft model has not seen yet of every sequence,
 * then one forward per draft position holds one token of each sequence still
 * drafting. False with err set when the draft model fails (outs are then
 * partly written; the caller releases the jobs' draft KV). */
bool spec_drafter_run(spec_drafter *d, spec_draft_job *jobs, int n_jobs, kvl_error *err);
/* spec_drafter_reserve and spec_drafter_run for one sequence: returns how
 * many drafts (0: pools full), or -1 with err set. */
int spec_drafter_propose(spec_drafter *d, spec_dseq *ds, const int32_t *toks, int64_t n, int k,
                         int32_t *out, kvl_error *err);
/* After verification: only toks[0..n_valid) are the sequence's; the draft
 * KV past them is rolled back. */
void spec_drafter_rollback(spec_drafter *d, spec_dseq *ds, int64_t n_valid);
/* Frees the sequence's draft KV (preemption, finish); free_table also frees the tables. */
void spec_dseq_release(spec_drafter *d, spec_dseq *ds, bool free_table);

#endif
