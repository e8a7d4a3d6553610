/* spec: speculative decoding's proposers. The engine verifies what they
 * propose (engine.c: plan_step drafts, sample_outputs accepts or rejects).
 *
 * Prompt lookup (n-gram): the last n tokens of a sequence are searched for in
 * its earlier text (prompt and output); the tokens that followed the most
 * recent earlier occurrence are the draft. n falls back from ngram_max to 1. */
#ifndef KVLLM_SPEC_H
#define KVLLM_SPEC_H

#include "base.h"
#include "kv.h"
#include "model.h"

/* Proposes up to k tokens continuing toks[0..n) into out; returns how many (0: no match). */
int spec_ngram_propose(const int32_t *toks, int64_t n, int ngram_max, int k, int32_t *out);

/* Per-sequence draft length, adapted to its acceptance: k grows by one after
 * a verification that accepted every draft, halves after one that accepted
 * none; at 0 the sequence decodes plainly for a while, then tries 1 again. */
typedef struct spec_adapt {
    int k;        /* drafts to propose next (<= the configured maximum) */
    int cooldown; /* plain steps left before trying again */
} spec_adapt;

void spec_adapt_init(spec_adapt *a, int k_max);
/* Drafts to ask for this step (0: decode plainly; counts a cooldown step). */
int spec_adapt_want(spec_adapt *a);
void spec_adapt_update(spec_adapt *a, int k_max, int drafted, int accepted);

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
void spec_drafter_destroy(spec_drafter *d);
void spec_dseq_init(spec_dseq *ds);
/* Drafts up to k tokens continuing toks[0..n) into out: computes what the
 * draft model has not seen yet, then k - 1 more forwards. Returns how many
 * (0 when its pools are full: the sequence decodes plainly), or -1 with err
 * set when the draft model fails. */
int spec_drafter_propose(spec_drafter *d, spec_dseq *ds, const int32_t *toks, int64_t n, int k,
                         int32_t *out, kvl_error *err);
/* After verification: only toks[0..n_valid) are the sequence's; the draft
 * KV past them is rolled back. */
void spec_drafter_rollback(spec_drafter *d, spec_dseq *ds, int64_t n_valid);
/* Frees the sequence's draft KV (preemption, finish); free_table also frees the tables. */
void spec_dseq_release(spec_drafter *d, spec_dseq *ds, bool free_table);

#endif
