/* sampler: turns logits into a token, like llama.cpp's default chain:
 * penalties -> top-k -> top-p -> min-p -> temperature -> draw (or argmax when
 * temperature <= 0). Each sequence owns one sampler (its own RNG and history). */
#ifndef KVLLM_SAMPLER_H
#define KVLLM_SAMPLER_H

#include "base.h"

typedef struct sampler_params {
    float temperature;    /* <= 0: greedy */
    int32_t top_k;        /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    float presence_penalty;
    float frequency_penalty;
    int32_t penalty_last_n; /* tokens of history the penalties look at (-1: all) */
    /* llama.cpp's infill sampler, after min-p (code completion): end the text
     * when end-of-generation outweighs it, fold tokens that are prefixes of
     * others into the likelier, keep the likely ones. Needs the vocabulary
     * (sampler_set_vocab) and top_k in 1..SAMPLER_INFILL_MAX_K before it. */
    bool infill;
    uint64_t seed;
} sampler_params;
#define SAMPLER_INFILL_MAX_K 1024

void sampler_params_default(sampler_params *p);

typedef struct sampler sampler; /* opaque */

/* n_vocab sizes the scratch; NULL on out of memory. */
sampler *sampler_create(const sampler_params *p, int32_t n_vocab);
void sampler_destroy(sampler *s);
/* The vocabulary the infill sampler reads (token texts, end of generation). */
struct tok_vocab;
void sampler_set_vocab(sampler *s, const struct tok_vocab *v);
/* Records a token in the penalty history: the generated ones, and the
 * prompt's first when the request asks for llama-server's window
 * (engine_request.penalize_prompt). */
void sampler_accept(sampler *s, int32_t token);
/* Samples from logits (modified in place by penalties). */
int32_t sampler_sample(sampler *s, float *logits);

/* Log-softmax helpers for reporting: logprob of id, and the top k (sorted by
 * logit, ties by lower id) with their log-probabilities. */
double logits_logsumexp(const float *logits, int32_t n);
int logits_top_k(const float *logits, int32_t n, int k, int32_t *ids, float *logprobs);

#endif
