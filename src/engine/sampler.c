/* sampler: see sampler.h. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    int32_t id;
    float logit;
} cand;

struct sampler {
    sampler_params p;
    int32_t n_vocab;
    cand *cands;
    int32_t *history;
    int64_t n_history, cap_history;
    int32_t *counts; /* occurrences in the penalty window, per token */
    uint64_t rng;
};

void sampler_params_default(sampler_params *p) {
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->penalty_last_n = 64;
    p->seed = 0xC0FFEE;
}

sampler *sampler_create(const sampler_params *p, int32_t n_vocab) {
    sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cands = malloc((size_t)n_vocab * sizeof *s->cands);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->rng = p->seed ? p->seed : 0x9E3779B97F4A7C15ull;
    if (!s->cands || !s->counts) {
        sampler_destroy(s);
        return NULL;
    }
    return s;
}

void sampler_destroy(sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s->counts);
    free(s->history);
    free(s);
}

void sampler_accept(sampler *s, int32_t token) {
    if (s->n_history == s->cap_history) {
        int64_t cap = s->cap_history ? s->cap_history * 2 : 64;
        int32_t *h = realloc(s->history, (size_t)cap * sizeof *h);
        if (!h) return; /* penalties then see a shorter history; sampling still works */
        s->history = h;
        s->cap_history = cap;
    }
    s->history[s->n_history++] = token;
}

/* xorshift64*: small, fast, and reproducible across platforms for a given seed. */
static double rng_uniform(sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    uint64_t r = s->rng * 2685821657736338717ull;
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

static void apply_penalties(sampler *s, float *logits) {
    const sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    int64_t n = p->penalty_last_n < 0 || p->penalty_last_n > s->n_history ? s->n_history : p->penalty_last_n;
    const int32_t *win = s->history + (s->n_history - n);
    for (int64_t i = 0; i < n; i++)
        if (win[i] >= 0 && win[i] < s->n_vocab) s->counts[win[i]]++;
    for (int64_t i = 0; i < n; i++) {
        int32_t t = win[i];
        if (t < 0 || t >= s->n_vocab || s->counts[t] == 0) continue;
        float *l = &logits[t];
        /* Same rule as llama.cpp: divide positive logits, multiply negative ones. */
        *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= (float)s->counts[t] * p->frequency_penalty + p->presence_penalty;
        s->counts[t] = 0; /* apply once per distinct token */
    }
}

static int cmp_cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

static int32_t argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int32_t sampler_sample(sampler *s, float *logits) {
    const sampler_params *p = &s->p;
    apply_penalties(s, logits);
    if (p->temperature <= 0.0f) return argmax(logits, s->n_vocab);

    int32_t n = s->n_vocab;
    for (int32_t i = 0; i < n; i++) s->cands[i] = (cand){i, logits[i]};
    qsort(s->cands, (size_t)n, sizeof *s->cands, cmp_cand_desc);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;

    /* Probabilities of the remaining candidates (before temperature, as llama.cpp's
     * top-p and min-p see them). */
    double maxl = s->cands[0].logit, sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp(s->cands[i].logit - maxl);
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp(s->cands[i].logit - maxl) / sum;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        /* keep tokens whose probability is at least min_p times the top one's */
        double floor_l = maxl + log(p->min_p);
        int32_t keep = 1;
        while (keep < n && s->cands[keep].logit >= floor_l) keep++;
        n = keep;
    }
    double total = 0;
    for (int32_t i = 0; i < n; i++) total += exp((s->cands[i].logit - maxl) / p->temperature);
    double r = rng_uniform(s) * total, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((s->cands[i].logit - maxl) / p->temperature);
        if (r < acc) return s->cands[i].id;
    }
    return s->cands[n - 1].id;
}

double logits_logsumexp(const float *logits, int32_t n) {
    float maxl = logits[0];
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > maxl) maxl = logits[i];
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)logits[i] - maxl);
    return maxl + log(sum);
}

int logits_top_k(const float *logits, int32_t n, int k, int32_t *ids, float *logprobs) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    double lse = logits_logsumexp(logits, n);
    int found = 0;
    /* insertion into a small sorted array: k is at most a few dozen */
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        if (found == k && l <= logits[ids[k - 1]]) continue;
        int j = found < k ? found++ : k - 1;
        while (j > 0 && logits[ids[j - 1]] < l) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    for (int i = 0; i < found; i++) logprobs[i] = (float)(logits[ids[i]] - lse);
    return found;
}
