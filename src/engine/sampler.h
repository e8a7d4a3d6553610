/* sampler: turns logits into a token, like llama.cpp's default chain:
 * penalties -> top-k -> top-p -> min-p -> temperature -> draw (or argmax when
 * temperature <= 0). llama.cpp's other samplers (locally typical, top-n-sigma,
 * XTC, dynamic temperature, min_keep, mirostat 1 and 2, DRY) and its chains in any
 * order run through a general chain over the whole candidate array, as
 * llama.cpp's own samplers compute them. Each sequence owns one sampler (its
 * own RNG, history and mirostat state). */
#ifndef KVLLM_SAMPLER_H
#define KVLLM_SAMPLER_H

#include "base.h"

#define SAMPLER_DRY_BREAKERS    256 /* bytes of the DRY sequence breakers' texts */
#define SAMPLER_DRY_BREAKER_MAX 40  /* bytes of one (llama cuts longer ones there) */

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
    /* llama.cpp's samplers beyond the default chain; zero is off for each
     * (typical_p >= 1, xtc_threshold > 0.5 and mirostat 0 are off too) */
    float typical_p;         /* locally typical sampling (llama's typ_p) */
    float top_n_sigma;       /* keep logits within n standard deviations of the top */
    float xtc_probability;   /* XTC: how often the likeliest tokens are excluded */
    float xtc_threshold;     /* ... those at or above this probability but the last */
    float dynatemp_range;    /* dynamic temperature: temperature +- range by entropy */
    float dynatemp_exponent; /* its curve (1: linear) */
    int32_t min_keep;        /* top-p, min-p, typical and XTC keep at least this many */
    int32_t mirostat;        /* 1 or 2: temperature then mirostat instead of the chain */
    float mirostat_tau, mirostat_eta;
    /* DRY ("don't repeat yourself"): a token that would extend a repeat of
     * the history longer than allowed_length loses multiplier *
     * base^(length - allowed_length) of its logit; the repeats are looked for
     * in the last penalty_last_n tokens (-1: context of them), and do not run
     * across a sequence breaker (each a text; SAMPLER_DRY_BREAKERS holds
     * them one after another, NUL-terminated, an empty one last) */
    float dry_multiplier; /* 0: off */
    float dry_base;
    int32_t dry_allowed_length;
    int32_t dry_penalty_last_n;
    int32_t dry_context; /* the window -1 (0: the engine sets the model's training context) */
    char dry_breakers[SAMPLER_DRY_BREAKERS];
    /* llama's sampler letters in the order they run (e penalties, d DRY,
     * s top-n-sigma, k top-k, y typical, p top-p, m min-p, x XTC, t
     * temperature); empty: the default order "edskypmxt" */
    char order[16];
    uint64_t seed;
} sampler_params;
#define SAMPLER_INFILL_MAX_K 1024

void sampler_params_default(sampler_params *p);

/* DRY's sequence breakers in p->dry_breakers: the one after prev (NULL: the
 * first), NULL after the last; and one more appended, cut at
 * SAMPLER_DRY_BREAKER_MAX bytes as llama cuts it (false: no room left). */
const char *sampler_dry_breaker_next(const sampler_params *p, const char *prev);
bool sampler_dry_breaker_add(sampler_params *p, const char *text);

/* llama's typ_p as sampler_params keeps it, and back: at or below 0 llama
 * keeps the single most typical token (its cut passes at the first step), but
 * 0 is "off" here, so such a value is kept as the smallest positive one. */
#define SAMPLER_TYPICAL_ONE 1e-30f
static inline float sampler_typical_from_llama(float typ_p) {
    return typ_p <= 0.0f ? SAMPLER_TYPICAL_ONE : typ_p;
}
static inline float sampler_typical_to_llama(float typical_p) {
    return typical_p == SAMPLER_TYPICAL_ONE ? 0.0f : typical_p;
}

/* llama's letter of a sampler by any of its names and aliases, in any case
 * ("top_k", "top-k", "topk" -> 'k'; "typ_p", "typ" -> 'y'; "temp" -> 't';
 * also 'i' infill and 'a' adaptive_p); 0 for a name it does not have. */
char sampler_letter(const char *name);

/* Which fields of sampler_params a front end set (a server's command-line
 * sampling flags: each request's default for those fields, as llama-server
 * takes its own). */
enum {
    SAMPLER_SET_TEMPERATURE = 1u << 0,
    SAMPLER_SET_TOP_K = 1u << 1,
    SAMPLER_SET_TOP_P = 1u << 2,
    SAMPLER_SET_MIN_P = 1u << 3,
    SAMPLER_SET_REPEAT_PENALTY = 1u << 4,
    SAMPLER_SET_PRESENCE_PENALTY = 1u << 5,
    SAMPLER_SET_FREQUENCY_PENALTY = 1u << 6,
    SAMPLER_SET_PENALTY_LAST_N = 1u << 7,
    SAMPLER_SET_SEED = 1u << 8,
    SAMPLER_SET_TYPICAL_P = 1u << 9,
    SAMPLER_SET_TOP_N_SIGMA = 1u << 10,
    SAMPLER_SET_XTC_PROBABILITY = 1u << 11,
    SAMPLER_SET_XTC_THRESHOLD = 1u << 12,
    SAMPLER_SET_DYNATEMP_RANGE = 1u << 13,
    SAMPLER_SET_DYNATEMP_EXPONENT = 1u << 14,
    SAMPLER_SET_MIN_KEEP = 1u << 15,
    SAMPLER_SET_MIROSTAT = 1u << 16,
    SAMPLER_SET_MIROSTAT_TAU = 1u << 17,
    SAMPLER_SET_MIROSTAT_ETA = 1u << 18,
    SAMPLER_SET_DRY_MULTIPLIER = 1u << 19,
    SAMPLER_SET_DRY_BASE = 1u << 20,
    SAMPLER_SET_DRY_ALLOWED_LENGTH = 1u << 21,
    SAMPLER_SET_DRY_PENALTY_LAST_N = 1u << 22,
    SAMPLER_SET_DRY_BREAKERS = 1u << 23,
    SAMPLER_SET_ORDER = 1u << 24,
};
/* The fields of from that set names, into p. */
void sampler_params_apply(sampler_params *p, const sampler_params *from, uint32_t set);
/* Whether p runs the general chain: an order of its own, or a sampler the
 * fast chain lacks (typical, top-n-sigma, XTC, dynamic temperature,
 * min_keep, mirostat). */
bool sampler_params_general(const sampler_params *p);

typedef struct sampler sampler; /* opaque */

/* n_vocab sizes the scratch; NULL on out of memory. */
sampler *sampler_create(const sampler_params *p, int32_t n_vocab);
void sampler_destroy(sampler *s);
/* The vocabulary the infill sampler reads (token texts, end of generation),
 * and DRY (its sequence breakers' tokens). */
struct tok_vocab;
void sampler_set_vocab(sampler *s, const struct tok_vocab *v);
/* Records a token in the penalty history: the generated ones, and the
 * prompt's first when the request asks for llama-server's window
 * (engine_request.penalize_prompt). */
void sampler_accept(sampler *s, int32_t token);
/* The tokens accepted so far are DRY's only: the penalties count what comes
 * after (the OpenAI APIs' penalties see the output, llama's DRY the prompt). */
void sampler_start_penalties(sampler *s);
/* Samples from logits (modified in place by penalties). */
int32_t sampler_sample(sampler *s, float *logits);
/* The candidates the general chain leaves for the draw, as llama.cpp's token
 * data array holds them after its dist sampler: in the chain's order, each
 * with its probability. */
typedef struct sampler_probs {
    int32_t cap;  /* room in ids / probs */
    int32_t n;    /* candidates left (may exceed cap: the first cap are stored) */
    int32_t *ids; /* [cap] */
    float *probs; /* [cap] */
} sampler_probs;
/* sampler_sample through the general chain (whatever the parameters), the
 * candidates it drew from into out (NULL: not wanted). */
int32_t sampler_sample_chain(sampler *s, float *logits, sampler_probs *out);
/* After sampler_sample_chain: the k likeliest candidates it left, by
 * descending probability (ties in the chain's order), none of probability 0,
 * as llama-server's post_sampling_probs lists them; *p_token the probability
 * of token among them (0 when the chain removed it). Returns how many. */
int sampler_chain_top(const sampler *s, int k, int32_t token, int32_t *ids, float *probs,
                      float *p_token);

/* Log-softmax helpers for reporting: logprob of id, and the top k (sorted by
 * logit, ties by lower id) with their log-probabilities. */
double logits_logsumexp(const float *logits, int32_t n);
int logits_top_k(const float *logits, int32_t n, int k, int32_t *ids, float *logprobs);

#endif
