/* spec: speculative decoding's proposers. The engine verifies what they
 * propose (engine.c: plan_step drafts, sample_outputs accepts or rejects).
 *
 * Prompt lookup (n-gram): the last n tokens of a sequence are searched for in
 * its earlier text (prompt and output); the tokens that followed the most
 * recent earlier occurrence are the draft. n falls back from ngram_max to 1. */
#ifndef KVLLM_SPEC_H
#define KVLLM_SPEC_H

#include "base.h"

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

#endif
