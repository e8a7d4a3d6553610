/* sampler: see sampler.h. */
#define _GNU_SOURCE /* memmem */
#include "sampler.h"

#include "kernels.h"
#include "tokenizer.h"

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
    /* [n_vocab] each, in the sampler's own allocation (kvl_alloc_parts) */
    cand *cands;
    float *w;        /* exp(logit - max) of every token */
    int32_t *counts; /* occurrences in the penalty window, per token */
    int32_t *history;
    int64_t n_history;
    int64_t penalty_from; /* the penalties count history[penalty_from..] only */
    size_t cap_history;
    uint64_t rng;
    const tok_vocab *vocab; /* the infill sampler's */
    float *probs;           /* [SAMPLER_INFILL_MAX_K]: its probabilities */
    struct pcand *pc;       /* [n_vocab]: the general chain's array, made on first use */
    int32_t pc_n;           /* candidates the last general chain left in it */
    float mu;               /* mirostat's running surprise bound (2 tau at start) */
    /* DRY: the sequence breakers by head token (made on first use), the repeat counts */
    struct dry_breaker *breakers;
    int32_t n_breakers;
    size_t cap_breakers;
    bool breakers_ready;
    int32_t *dry_rep;
    size_t cap_dry_rep;
};

void sampler_params_default(sampler_params *p) {
    *p = (sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .typical_p = 1.0f,
        .xtc_threshold = 0.1f,
        .dynatemp_exponent = 1.0f,
        .mirostat_tau = 5.0f,
        .mirostat_eta = 0.1f,
        .dry_base = 1.75f,
        .dry_allowed_length = 2,
        .dry_penalty_last_n = -1,
        .dry_breakers = "\n\0:\0\"\0*", /* llama's: newline, colon, quote, asterisk */
        .seed = 0xC0FFEE,
    };
}

char sampler_letter(const char *name) {
    char low[32];
    size_t n = 0;
    for (; name[n] && n + 1 < sizeof low; n++)
        low[n] = (char)(name[n] >= 'A' && name[n] <= 'Z' ? name[n] + 32 : name[n]);
    low[n] = 0;
    if (name[n]) return 0;
    static const struct {
        const char *name;
        char letter;
    } NAMES[] = {
        {"penalties", 'e'},   {"dry", 'd'},      {"top_n_sigma", 's'}, {"top-n-sigma", 's'},
        {"topnsigma", 's'},   {"top_k", 'k'},    {"top-k", 'k'},       {"topk", 'k'},
        {"typ_p", 'y'},       {"typ-p", 'y'},    {"typp", 'y'},        {"typ", 'y'},
        {"top_p", 'p'},       {"top-p", 'p'},    {"topp", 'p'},        {"nucleus", 'p'},
        {"min_p", 'm'},       {"min-p", 'm'},    {"minp", 'm'},        {"xtc", 'x'},
        {"temperature", 't'}, {"temp", 't'},     {"infill", 'i'},      {"adaptive_p", 'a'},
        {"adaptive-p", 'a'},  {"adaptivep", 'a'}};
    for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++)
        if (strcmp(low, NAMES[i].name) == 0) return NAMES[i].letter;
    return 0;
}

const char *sampler_dry_breaker_next(const sampler_params *p, const char *prev) {
    const char *end = p->dry_breakers + SAMPLER_DRY_BREAKERS;
    const char *at = prev ? prev + strnlen(prev, (size_t)(end - prev)) + 1 : p->dry_breakers;
    return at < end && *at ? at : NULL;
}

bool sampler_dry_breaker_add(sampler_params *p, const char *text) {
    size_t at = 0, n = strlen(text); /* at: just past the last one */
    for (const char *b = NULL; (b = sampler_dry_breaker_next(p, b));)
        at = (size_t)(b - p->dry_breakers) + strlen(b) + 1;
    n = n < SAMPLER_DRY_BREAKER_MAX ? n : SAMPLER_DRY_BREAKER_MAX;
    if (at + n + 2 > SAMPLER_DRY_BREAKERS) return false; /* (the list's closing NUL stays) */
    memcpy(p->dry_breakers + at, text, n);
    p->dry_breakers[at + n] = 0;
    return true;
}

void sampler_params_apply(sampler_params *p, const sampler_params *from, uint32_t set) {
#define TAKE(bit, field)                                                                           \
    if (set & (bit)) memcpy(&p->field, &from->field, sizeof p->field)
    TAKE(SAMPLER_SET_TEMPERATURE, temperature);
    TAKE(SAMPLER_SET_TOP_K, top_k);
    TAKE(SAMPLER_SET_TOP_P, top_p);
    TAKE(SAMPLER_SET_MIN_P, min_p);
    TAKE(SAMPLER_SET_REPEAT_PENALTY, repeat_penalty);
    TAKE(SAMPLER_SET_PRESENCE_PENALTY, presence_penalty);
    TAKE(SAMPLER_SET_FREQUENCY_PENALTY, frequency_penalty);
    TAKE(SAMPLER_SET_PENALTY_LAST_N, penalty_last_n);
    TAKE(SAMPLER_SET_SEED, seed);
    TAKE(SAMPLER_SET_TYPICAL_P, typical_p);
    TAKE(SAMPLER_SET_TOP_N_SIGMA, top_n_sigma);
    TAKE(SAMPLER_SET_XTC_PROBABILITY, xtc_probability);
    TAKE(SAMPLER_SET_XTC_THRESHOLD, xtc_threshold);
    TAKE(SAMPLER_SET_DYNATEMP_RANGE, dynatemp_range);
    TAKE(SAMPLER_SET_DYNATEMP_EXPONENT, dynatemp_exponent);
    TAKE(SAMPLER_SET_MIN_KEEP, min_keep);
    TAKE(SAMPLER_SET_MIROSTAT, mirostat);
    TAKE(SAMPLER_SET_MIROSTAT_TAU, mirostat_tau);
    TAKE(SAMPLER_SET_MIROSTAT_ETA, mirostat_eta);
    TAKE(SAMPLER_SET_DRY_MULTIPLIER, dry_multiplier);
    TAKE(SAMPLER_SET_DRY_BASE, dry_base);
    TAKE(SAMPLER_SET_DRY_ALLOWED_LENGTH, dry_allowed_length);
    TAKE(SAMPLER_SET_DRY_PENALTY_LAST_N, dry_penalty_last_n);
    TAKE(SAMPLER_SET_DRY_BREAKERS, dry_breakers);
    TAKE(SAMPLER_SET_ORDER, order);
#undef TAKE
}

sampler *sampler_create(const sampler_params *p, int32_t n_vocab) {
    sampler *s;
    cand *cands;
    float *w;
    int32_t *counts;
    const kvl_part parts[] = {KVL_PART(s, 1), KVL_PART(cands, n_vocab), KVL_PART(w, n_vocab),
                              KVL_PART(counts, n_vocab)};
    if (!KVL_ALLOC_PARTS(parts)) return NULL;
    *s = (sampler){.p = *p, .n_vocab = n_vocab, .cands = cands, .w = w, .counts = counts};
    if (p->infill && !(s->probs = malloc(SAMPLER_INFILL_MAX_K * sizeof *s->probs))) {
        kvl_free(s);
        return NULL;
    }
    s->rng = p->seed ? p->seed : 0x9E3779B97F4A7C15ull;
    s->mu = 2.0f * p->mirostat_tau;
    return s;
}

void sampler_set_vocab(sampler *s, const tok_vocab *v) { s->vocab = v; }

void sampler_destroy(sampler *s) {
    if (!s) return;
    free(s->probs);
    free(s->pc);
    free(s->breakers);
    free(s->dry_rep);
    free(s->history);
    kvl_free(s); /* and its arrays */
}

void sampler_start_penalties(sampler *s) { s->penalty_from = s->n_history; }

void sampler_accept(sampler *s, int32_t token) {
    if (!kvl_grow((void **)&s->history, &s->cap_history, (size_t)s->n_history + 1,
                  sizeof *s->history, 64))
        return; /* penalties then see a shorter history; sampling still works */
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

/* The penalty window: the last penalty_last_n tokens the penalties see
 * (after penalty_from), each counted into s->counts; returns how many (0:
 * the penalties are off or there is no history). */
static int64_t penalty_window(sampler *s, const int32_t **win) {
    const sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return 0;
    const int64_t seen = s->n_history - s->penalty_from;
    const int64_t n = p->penalty_last_n < 0 || p->penalty_last_n > seen ? seen : p->penalty_last_n;
    if (n == 0) return 0; /* no history yet (s->history may still be NULL) */
    *win = s->history + (s->n_history - n);
    for (int64_t i = 0; i < n; i++)
        if ((*win)[i] >= 0 && (*win)[i] < s->n_vocab) s->counts[(*win)[i]]++;
    return n;
}

/* llama.cpp's rule for a token seen count times: positive logits divided by
 * the repeat penalty, negative ones multiplied, then the frequency and
 * presence penalties taken off. */
static inline void penalize(const sampler_params *p, float *l, int32_t count) {
    *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
    *l -= (float)count * p->frequency_penalty + p->presence_penalty;
}

static void apply_penalties(sampler *s, float *logits) {
    const int32_t *win;
    const int64_t n = penalty_window(s, &win);
    for (int64_t i = 0; i < n; i++) {
        int32_t t = win[i];
        if (t < 0 || t >= s->n_vocab || s->counts[t] == 0) continue;
        penalize(&s->p, &logits[t], s->counts[t]);
        s->counts[t] = 0; /* apply once per distinct token */
    }
}

static int cmp_cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* The first index of the largest logit; NaN never wins (index 0 when all are
 * NaN). Four running maxima, then the first index that holds it: no branch
 * per element to mispredict. */
static int32_t argmax(const float *logits, int32_t n) {
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) m[j] = logits[i + j] > m[j] ? logits[i + j] : m[j];
    for (; i < n; i++) m[0] = logits[i] > m[0] ? logits[i] : m[0];
    const float best = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
    for (i = 0; i < n; i++)
        if (logits[i] == best) return i;
    return 0;
}

/* a sorts before b: higher logit, then lower id (cmp_cand_desc's order). */
static inline bool cand_before(cand a, cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/* The k first candidates in cmp_cand_desc's order, sorted, into c: a heap of
 * the k best so far with the worst at its root, so most tokens cost one
 * comparison (O(V log k) at worst, against O(V log V) for sorting all). */
static int32_t select_top_k(const float *logits, int32_t n, int32_t k, cand *c) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        const cand x = {i, logits[i]};
        int32_t j;
        if (m < k) {
            for (j = m++; j > 0 && cand_before(c[(j - 1) / 2], x); j = (j - 1) / 2)
                c[j] = c[(j - 1) / 2];
        } else if (cand_before(x, c[0])) {
            for (j = 0;;) {
                int32_t w = j, l = 2 * j + 1, r = l + 1;
                cand cw = x;
                if (l < m && cand_before(cw, c[l])) w = l, cw = c[l];
                if (r < m && cand_before(cw, c[r])) w = r;
                if (w == j) break;
                c[j] = c[w];
                j = w;
            }
        } else {
            continue;
        }
        c[j] = x;
    }
    qsort(c, (size_t)m, sizeof *c, cmp_cand_desc);
    return m;
}

/* The tokens with logit >= floor, sorted, into c. */
static int32_t gather_sorted(const float *logits, int32_t n, double floor, cand *c) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] >= floor) c[m++] = (cand){i, logits[i]};
    qsort(c, (size_t)m, sizeof *c, cmp_cand_desc);
    return m;
}

/* A logit floor that keeps at least `mass` of the probability: w[i] =
 * exp(logits[i] - maxl), total their sum. Masses by whole units below the
 * maximum (64 buckets, the last open); -inf when only everything will do. */
static double top_p_floor(const float *logits, const float *w, int32_t n, float maxl, double total,
                          double mass) {
    double bucket[64] = {0};
    for (int32_t i = 0; i < n; i++) {
        const float d = maxl - logits[i];
        bucket[d < 63.0f ? (int)d : 63] += w[i]; /* (NaN: the open bucket) */
    }
    double cum = 0;
    for (int b = 0; b < 63; b++) {
        cum += bucket[b];
        if (cum >= mass * total) return (double)maxl - (double)(b + 1);
    }
    return -INFINITY;
}

/* Candidates c[0..n) that top-p keeps: the shortest prefix whose
 * probabilities exp(l - maxl) / sum reach top_p (n when none does). */
static int32_t top_p_cut(const cand *c, int32_t n, double maxl, double sum, float top_p) {
    double cum = 0;
    for (int32_t i = 0; i < n; i++) {
        cum += exp(c[i].logit - maxl) / sum;
        if (cum >= top_p) return i + 1;
    }
    return n;
}

/* Draw from c[0..n) with weights exp((logit - maxl) / T). */
static int32_t draw_sorted(sampler *s, const cand *c, int32_t n, double maxl, float T) {
    double total = 0;
    for (int32_t i = 0; i < n; i++) total += exp((c[i].logit - maxl) / T);
    double r = rng_uniform(s) * total, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((c[i].logit - maxl) / T);
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id;
}

/* A token's text as llama.cpp's infill sampler compares them (control
 * tokens print as nothing); its length, at most cap. */
static size_t piece(const sampler *s, int32_t id, char *buf, size_t cap) {
    size_t n = tok_token_bytes(s->vocab, id, false, buf, cap);
    return n < cap ? n : cap;
}

/* llama.cpp's infill sampler over the sorted candidates c[0..n) (its
 * steps, in float as it computes them): p = softmax of the logits; if end of
 * generation carries enough (3 p_eog n > p_text), only the EOG tokens stay;
 * else each token whose text is a prefix of another's is folded into the
 * likelier of the two, tokens below p 0.2 dropped (EOG kept), renormalised,
 * and those below 1 / (texts kept + 1) dropped. The candidates left are drawn
 * from by their logits, as llama's dist does; when no text token is left the
 * answer is EOT (or EOS): *forced is set to it. Returns how many are left. */
static int32_t infill_filter(sampler *s, cand *c, int32_t n, int32_t *forced) {
    float *p = s->probs, sum = 0, p_txt = 0, p_eog = 0;
    *forced = -1;
    for (int32_t i = 0; i < n; i++) sum += p[i] = expf(c[i].logit - c[0].logit);
    for (int32_t i = 0; i < n; i++) {
        p[i] /= sum;
        if (tok_is_eog(s->vocab, c[i].id)) p_eog += p[i];
        else p_txt += p[i];
    }
    int32_t m = 0;
    if (3 * p_eog * (float)n > p_txt) {
        for (int32_t i = 0; i < n; i++)
            if (tok_is_eog(s->vocab, c[i].id)) c[m++] = c[i];
        return m;
    }
    char b0[256], b1[256];
    for (int32_t i0 = 0; i0 < n; i0++) {
        for (int32_t i1 = 0; i1 < n; i1++) {
            if (c[i0].logit == -INFINITY) break;
            if (i0 == i1 || c[i1].logit == -INFINITY) continue;
            const size_t l0 = piece(s, c[i0].id, b0, sizeof b0),
                         l1 = piece(s, c[i1].id, b1, sizeof b1);
            if (l0 == 0 || l0 > l1 || memcmp(b0, b1, l0) != 0) continue;
            int32_t dst = i0, src = i1;
            if (p[i1] > p[i0]) dst = i1, src = i0;
            p[dst] += p[src];
            c[src].logit = -INFINITY;
            p[src] = 0;
        }
    }
    int32_t n_txt = 0;
    float kept = 0;
    for (int32_t i = 0; i < n; i++) {
        const bool eog = tok_is_eog(s->vocab, c[i].id);
        if (p[i] < 0.2f && !eog) continue;
        n_txt += !eog;
        kept += p[i];
        p[m] = p[i], c[m++] = c[i];
    }
    if (n_txt == 0) {
        *forced = tok_eot(s->vocab) >= 0 ? tok_eot(s->vocab) : tok_eos(s->vocab);
        return 0;
    }
    const float thold = 1.0f / (float)(n_txt + 1);
    n = m, m = 0;
    for (int32_t i = 0; i < n; i++)
        if (p[i] / kept >= thold || tok_is_eog(s->vocab, c[i].id)) c[m++] = c[i];
    return m;
}

/* ------------------------------------------------- the general chain -- */

/* llama.cpp's llama_token_data: the general chain's candidate. */
typedef struct pcand {
    int32_t id;
    float logit, p;
} pcand;

/* The candidate array the chain's steps narrow, as llama's token data array:
 * c[0..n), sorted when in cmp_pcand's order; full while it still holds the
 * whole vocabulary in id order (top-k then selects with a heap). */
typedef struct chain {
    pcand *c;
    int32_t n;
    bool sorted, full;
    pcand *spare; /* room for n_vocab more (the sort's and typical's) */
} chain;

/* Descending logit, ties by lower id (llama sorts by logit alone, in an
 * unspecified order among ties). */
static int cmp_pcand(const void *a, const void *b) {
    const pcand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* cmp_pcand's order as one unsigned key, ascending: the logit's bits made
 * to sort downwards, then the id. */
static inline uint64_t pcand_key(const pcand *c) {
    uint32_t u;
    memcpy(&u, &c->logit, sizeof u);
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending as the floats */
    return (uint64_t)~u << 32 | (uint32_t)c->id;
}

/* Sorts in cmp_pcand's order: qsort for a few, else a byte-wise radix sort
 * of pcand_key through tmp (qsort's function comparator took ~30 ms for
 * 128K candidates, the radix sort ~1 ms), skipping the bytes every key
 * shares. */
static void sort_pcand(pcand *c, int32_t n, pcand *tmp) {
    if (n <= 2048) {
        qsort(c, (size_t)n, sizeof *c, cmp_pcand);
        return;
    }
    pcand *src = c, *dst = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        int32_t count[256] = {0};
        for (int32_t i = 0; i < n; i++) count[pcand_key(&src[i]) >> shift & 255]++;
        if (count[pcand_key(&src[0]) >> shift & 255] == n) continue; /* one bucket: in order */
        for (int32_t b = 0, at = 0; b < 256; b++) {
            const int32_t k = count[b];
            count[b] = at;
            at += k;
        }
        for (int32_t i = 0; i < n; i++) dst[count[pcand_key(&src[i]) >> shift & 255]++] = src[i];
        pcand *t = src;
        src = dst, dst = t;
    }
    if (src != c) memcpy(c, src, (size_t)n * sizeof *c);
}

static void ch_sort(chain *h) {
    if (!h->sorted) sort_pcand(h->c, h->n, h->spare);
    h->sorted = true;
    h->full = false;
}

static float ch_max(const chain *h) {
    float m = h->c[0].logit;
    for (int32_t i = 1; !h->sorted && i < h->n; i++) m = h->c[i].logit > m ? h->c[i].logit : m;
    return m;
}

/* llama_sampler_softmax_impl: p = expf(logit - max) / their float sum. */
static void ch_softmax(chain *h, bool sort) {
    if (sort) ch_sort(h);
    const float m = ch_max(h);
    float sum = 0.0f;
    for (int32_t i = 0; i < h->n; i++) sum += h->c[i].p = expf(h->c[i].logit - m);
    for (int32_t i = 0; i < h->n; i++) h->c[i].p /= sum;
}

/* The repetition, frequency and presence penalties on the candidates whose
 * token is in the window (apply_penalties' rule, on the array). */
static void ch_penalties(sampler *s, chain *h) {
    const int32_t *win;
    const int64_t n = penalty_window(s, &win);
    if (n == 0) return;
    for (int32_t i = 0; i < h->n; i++)
        if (s->counts[h->c[i].id]) penalize(&s->p, &h->c[i].logit, s->counts[h->c[i].id]);
    for (int64_t i = 0; i < n; i++)
        if (win[i] >= 0 && win[i] < s->n_vocab) s->counts[win[i]] = 0;
    h->sorted = false;
}

/* llama_sampler_top_n_sigma: logits below max - n * std (of the finite
 * ones, in float as it sums them) become -inf; none is removed. */
static void ch_top_n_sigma(chain *h, float nsig) {
    if (nsig <= 0.0f || h->n <= 1) return;
    float mx = h->c[0].logit, sum = 0.0f;
    int32_t valid = 0;
    for (int32_t i = 0; i < h->n; i++)
        if (h->c[i].logit != -INFINITY) {
            mx = h->c[i].logit > mx ? h->c[i].logit : mx;
            sum += h->c[i].logit;
            valid++;
        }
    const float mean = valid > 0 ? sum / (float)valid : 0.0f;
    float acc = 0.0f;
    for (int32_t i = 0; i < h->n; i++)
        if (h->c[i].logit != -INFINITY) acc += (float)pow(h->c[i].logit - mean, 2);
    const float sd = valid > 0 ? (float)sqrt(acc / (float)valid) : 0.0f;
    for (int32_t i = 0; i < h->n; i++)
        if (h->c[i].logit < mx - nsig * sd) h->c[i].logit = -INFINITY;
}

/* top-k: the k likeliest, sorted (a heap over the whole vocabulary while the
 * array still is it: sorting 128K candidates took 18 ms). */
static void ch_top_k(sampler *s, chain *h, int32_t k) {
    if (k <= 0) return;
    if (k > h->n) k = h->n;
    if (h->full) {
        for (int32_t i = 0; i < h->n; i++) s->w[i] = h->c[i].logit;
        const int32_t m = select_top_k(s->w, h->n, k, s->cands);
        for (int32_t i = 0; i < m; i++) h->c[i] = (pcand){s->cands[i].id, s->cands[i].logit, 0};
        h->sorted = true;
        h->full = false;
    } else {
        ch_sort(h);
    }
    h->n = k;
}

/* llama_sampler_top_p: the shortest sorted prefix whose float cumulative
 * probability reaches p, at least min_keep. */
static void ch_top_p(chain *h, float top_p, int32_t min_keep) {
    if (top_p >= 1.0f) return;
    ch_softmax(h, true);
    float cum = 0.0f;
    for (int32_t i = 0; i < h->n; i++) {
        cum += h->c[i].p;
        if (cum >= top_p && i + 1 >= min_keep) {
            h->n = i + 1;
            break;
        }
    }
}

/* llama_sampler_min_p: logits at least max + log(p); unsorted, the order
 * kept, when that leaves min_keep; else over the sorted array. */
static void ch_min_p(chain *h, float min_p, int32_t min_keep) {
    if (min_p <= 0.0f || h->n == 0) return;
    if (!h->sorted) {
        const float floor_l = ch_max(h) + logf(min_p);
        int32_t m = 0;
        for (int32_t i = 0; i < h->n; i++)
            if (h->c[i].logit >= floor_l) m++;
        if (m > 0 && m >= min_keep) {
            m = 0;
            for (int32_t i = 0; i < h->n; i++)
                if (h->c[i].logit >= floor_l) h->c[m++] = h->c[i];
            h->n = m;
            h->full = false;
            return;
        }
    }
    ch_sort(h);
    const float floor_l = h->c[0].logit + logf(min_p);
    int32_t i = 1;
    while (i < h->n && !(h->c[i].logit < floor_l && i >= min_keep)) i++;
    h->n = i;
}

/* llama_sampler_typical: the candidates ordered by how far their surprise
 * is from the entropy, kept until their float cumulative probability passes
 * p (at least min_keep); the array is left in that order. */
static void ch_typical(chain *h, float typ_p, int32_t min_keep) {
    if (typ_p >= 1.0f) return;
    ch_softmax(h, true);
    /* (a candidate of probability 0, masked before: no part of the entropy,
     * and the least typical; llama's sums turn NaN there) */
    float entropy = 0.0f;
    for (int32_t i = 0; i < h->n; i++)
        if (h->c[i].p > 0.0f) entropy += -h->c[i].p * logf(h->c[i].p);
    /* The order by ascending |-log p - H| (ties by position), without a sort:
     * along the sorted array -log p - H only grows, so the scores fall to the
     * first candidate where it turns >= 0 and rise after; the two runs merge
     * from there (a left run of equal scores taken in ascending position). */
    const int32_t n = h->n;
    pcand *out = h->spare;
#define SCORE(i) (h->c[i].p > 0.0f ? fabsf(-logf(h->c[i].p) - entropy) : INFINITY)
    int32_t right = 0;
    while (right < n && h->c[right].p > 0.0f && -logf(h->c[right].p) - entropy < 0.0f) right++;
    int32_t left = right - 1, m = 0;
    float cum = 0.0f;
    bool done = false;
    while (!done && (left >= 0 || right < n)) {
        int32_t from, to; /* the positions taken next, ascending */
        if (left >= 0 && (right >= n || SCORE(left) <= SCORE(right))) {
            const float sc = SCORE(left);
            from = left;
            while (from > 0 && SCORE(from - 1) == sc) from--;
            to = left;
            left = from - 1;
        } else {
            from = to = right++;
        }
        for (int32_t i = from; i <= to && !done; i++) {
            out[m] = h->c[i];
            cum += out[m].p;
            done = cum > typ_p && (min_keep == 0 || m >= min_keep - 1);
            m++;
        }
    }
#undef SCORE
    memcpy(h->c, out, (size_t)m * sizeof *out);
    h->n = m;
    h->sorted = false;
}

/* llama's XTC: with probability xtc_probability, the likeliest tokens at or
 * above the threshold are removed but the last of them (min_keep left). */
static void ch_xtc(sampler *s, chain *h) {
    const sampler_params *p = &s->p;
    if (p->xtc_probability <= 0.0f || p->xtc_threshold > 0.5f || h->n < 2) return;
    if ((float)rng_uniform(s) > p->xtc_probability) return;
    ch_softmax(h, true);
    int32_t last = 0;
    for (int32_t i = 0; i < h->n && h->c[i].p >= p->xtc_threshold; i++) last = i;
    if (h->n - last >= p->min_keep && last > 0) {
        memmove(h->c, h->c + last, (size_t)(h->n - last) * sizeof *h->c);
        h->n -= last;
    }
}

/* llama_sampler_temp_impl: logits / t, or at t <= 0 the first largest kept
 * and every other -inf. */
static void ch_temp(chain *h, float t) {
    if (t > 0.0f) {
        for (int32_t i = 0; i < h->n; i++) h->c[i].logit /= t;
        return;
    }
    int32_t best = 0;
    for (int32_t i = 1; i < h->n; i++)
        if (h->c[i].logit > h->c[best].logit) {
            h->c[best].logit = -INFINITY;
            best = i;
        } else {
            h->c[i].logit = -INFINITY;
        }
}

/* llama_sampler_temp_ext: with a range, the temperature is set by the
 * normalised entropy of the candidates (min + (max - min) * H^exponent). */
static void ch_temp_ext(sampler *s, chain *h) {
    const sampler_params *p = &s->p;
    if (p->dynatemp_range <= 0.0f) {
        ch_temp(h, p->temperature);
        return;
    }
    if (h->n <= 1) return;
    const float lo = fmaxf(0.0f, p->temperature - p->dynatemp_range),
                hi = p->temperature + p->dynatemp_range;
    const float max_entropy = -logf(1.0f / (float)h->n);
    ch_softmax(h, true);
    float entropy = 0.0f;
    for (int32_t i = 0; i < h->n; i++)
        if (h->c[i].p > 0.0f) entropy -= h->c[i].p * logf(h->c[i].p);
    ch_temp(h, lo + (hi - lo) * powf(entropy / max_entropy, p->dynatemp_exponent));
}

/* llama's dist: p = expf(logit - max) summed in double, drawn by the running
 * sum, then normalised. */
static int32_t ch_dist(sampler *s, chain *h) {
    if (h->n == 1) {
        h->c[0].p = 1.0f;
        return 0;
    }
    const float m = ch_max(h);
    double sum = 0;
    for (int32_t i = 0; i < h->n; i++) sum += h->c[i].p = expf(h->c[i].logit - m);
    const double target = sum * rng_uniform(s);
    double run = 0;
    int32_t sel = -1;
    for (int32_t i = 0; i < h->n; i++) {
        run += h->c[i].p;
        if (sel < 0 && run >= target && h->c[i].p > 0.0f) sel = i;
        h->c[i].p = (float)(h->c[i].p / sum);
    }
    return sel >= 0 ? sel : h->n - 1;
}

/* A draw from the normalised p (llama_sample_dist's discrete distribution). */
static int32_t ch_draw_p(sampler *s, const chain *h) {
    double sum = 0;
    for (int32_t i = 0; i < h->n; i++) sum += h->c[i].p;
    const double target = sum * rng_uniform(s);
    double run = 0;
    for (int32_t i = 0; i < h->n; i++) {
        run += h->c[i].p;
        if (run > target) return i;
    }
    return h->n - 1;
}

/* llama's mirostat (1: k from the estimated Zipf exponent over the top 100;
 * 2: the tokens whose surprise is at most mu), then the running bound. */
static int32_t ch_mirostat(sampler *s, chain *h) {
    const sampler_params *p = &s->p;
    ch_softmax(h, true);
    if (p->mirostat == 1) {
        const int32_t m = 100;
        float sum_tb = 0.0f, sum_tt = 0.0f;
        for (int32_t i = 0; i < m - 1 && i < h->n - 1; i++) {
            const float t = logf((float)(i + 2) / (float)(i + 1)),
                        b = logf(h->c[i].p / h->c[i + 1].p);
            sum_tb += t * b;
            sum_tt += t * t;
        }
        const float s_hat = sum_tb / sum_tt, eps = s_hat - 1;
        const float k =
            powf((eps * powf(2, s->mu)) / (1 - powf((float)s->n_vocab, -eps)), 1 / s_hat);
        /* llama's max(int(k), 1) as x86 computes it: NaN and k past INT_MAX
         * convert to INT_MIN, so one token */
        if (k >= 1.0f && k < 2147483648.0f) h->n = (int32_t)k < h->n ? (int32_t)k : h->n;
        else h->n = 1;
    } else {
        int32_t i = 0;
        while (i < h->n && !(-log2f(h->c[i].p) > s->mu)) i++;
        h->n = i > 0 ? i : 1;
    }
    ch_softmax(h, true);
    const int32_t idx = ch_draw_p(s, h);
    s->mu -= p->mirostat_eta * (-log2f(h->c[idx].p) - p->mirostat_tau);
    return idx;
}

/* ------------------------------------------------------------------ DRY -- */

/* A sequence breaker as llama's DRY keeps it: a head token whose text
 * contains the breaker (no tail), or ends with the start of it, followed by
 * the tail tokens of the rest (at most DRY_TAIL_MAX). */
#define DRY_TAIL_MAX 20
typedef struct dry_breaker {
    int32_t head, n_tail;
    int32_t tail[DRY_TAIL_MAX];
} dry_breaker;

static int cmp_breaker(const void *a, const void *b) {
    const dry_breaker *x = a, *y = b;
    return x->head != y->head ? (x->head < y->head ? -1 : 1) : 0;
}

static bool add_breaker(sampler *s, int32_t head, const int32_t *tail, int32_t n_tail) {
    for (int32_t i = 0; i < s->n_breakers; i++) /* no duplicate (head, tail) */
        if (s->breakers[i].head == head && s->breakers[i].n_tail == n_tail &&
            (n_tail == 0 || !memcmp(s->breakers[i].tail, tail, (size_t)n_tail * sizeof *tail)))
            return true;
    if (!kvl_grow((void **)&s->breakers, &s->cap_breakers, (size_t)s->n_breakers + 1,
                  sizeof *s->breakers, 16))
        return false;
    dry_breaker *b = &s->breakers[s->n_breakers++];
    b->head = head, b->n_tail = n_tail;
    if (n_tail > 0) memcpy(b->tail, tail, (size_t)n_tail * sizeof *tail);
    return true;
}

/* llama's get_overlapping_token_sequences for one breaker text: every token
 * whose text (special tokens' included) holds it, or ends with a start of it
 * (the rest tokenized, without special tokens, as the tail). */
static bool breaker_tokens(sampler *s, const char *str, size_t len) {
    /* the tail after a matched start of i bytes is the same for every token:
     * tokenized once for each i (llama tokenizes it at each match) */
    int32_t tails[SAMPLER_DRY_BREAKER_MAX][DRY_TAIL_MAX];
    int32_t n_tails[SAMPLER_DRY_BREAKER_MAX];
    for (size_t i = 1; i < len && i < SAMPLER_DRY_BREAKER_MAX; i++) {
        kvl_error err = {{0}};
        const int64_t n =
            tok_encode(s->vocab, str + i, len - i, false, false, tails[i], DRY_TAIL_MAX, &err);
        n_tails[i] = n < 0 ? 0 : n < DRY_TAIL_MAX ? (int32_t)n : DRY_TAIL_MAX;
    }
    char word[256];
    for (int32_t id = 0; id < s->n_vocab; id++) {
        size_t wl = tok_token_bytes(s->vocab, id, true, word, sizeof word);
        if (wl > sizeof word) wl = sizeof word;
        if (memmem(word, wl, str, len)) {
            if (!add_breaker(s, id, NULL, 0)) return false;
            continue;
        }
        for (size_t pos = 0; pos < wl; pos++) {
            if (word[pos] != str[0]) continue;
            size_t i = 1;
            while (i < len && pos + i < wl && word[pos + i] == str[i]) i++;
            if (i < len && pos + i < wl) continue;                  /* a mismatch inside the word */
            if (i >= len || i >= SAMPLER_DRY_BREAKER_MAX) continue; /* (held it: above) */
            if (!add_breaker(s, id, tails[i], n_tails[i])) return false;
        }
    }
    return true;
}

/* The breakers of p, tokenized once (the first DRY step after the vocabulary
 * is set), sorted by head. False only on out of memory. */
static bool dry_prepare(sampler *s) {
    if (s->breakers_ready) return true;
    if (s->vocab)
        for (const char *b = NULL; (b = sampler_dry_breaker_next(&s->p, b));)
            if (!breaker_tokens(s, b, strlen(b))) return false;
    if (s->n_breakers > 1) /* (none: the array is NULL) */
        qsort(s->breakers, (size_t)s->n_breakers, sizeof *s->breakers, cmp_breaker);
    s->breakers_ready = true;
    return true;
}

/* The breakers whose head is token: [*first, return). */
static int32_t breakers_of(const sampler *s, int32_t token, int32_t *first) {
    int32_t lo = 0, hi = s->n_breakers;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (s->breakers[mid].head < token) lo = mid + 1;
        else hi = mid;
    }
    *first = lo;
    while (hi < s->n_breakers && s->breakers[hi].head == token) hi++;
    return hi;
}

/* llama's DRY over the history (rat(i): the i-th token from its end): the
 * longest repeat of the history's suffix that each candidate would extend
 * (by the Z-algorithm, up to the last sequence breaker), and a penalty of
 * multiplier * base^(repeat - allowed) on those that reach allowed_length. */
static void ch_dry(sampler *s, chain *h) {
    const sampler_params *p = &s->p;
    if (p->dry_multiplier == 0.0f || p->dry_base < 1.0f || p->dry_penalty_last_n == 0) return;
    const int32_t ctx = p->dry_context;
    const int64_t eff = p->dry_penalty_last_n == -1 ? ctx
                        : p->dry_penalty_last_n > 0 ? p->dry_penalty_last_n
                                                    : 0;
    int64_t n_rep = s->n_history < eff ? s->n_history : eff;
    n_rep = n_rep < ctx ? n_rep : ctx;
    if (n_rep <= p->dry_allowed_length || !dry_prepare(s)) return;
    const int32_t *hist = s->history + s->n_history - 1; /* rat(i) = hist[-i] */
#define RAT(i) hist[-(i)]
    /* 1: the last breaker limits how far back a repeat may reach */
    int64_t rep_limit = n_rep;
    for (int64_t i = 0; i < n_rep; i++) {
        int32_t b0;
        const int32_t b1 = breakers_of(s, RAT(i), &b0);
        int64_t longest = -1;
        for (int32_t b = b0; b < b1; b++) {
            const int32_t len = s->breakers[b].n_tail;
            if (len <= longest || len > i) continue;
            int32_t o = 0;
            while (o < len && s->breakers[b].tail[o] == RAT(i - o - 1)) o++;
            if (o == len) longest = len;
        }
        if (longest >= 0) {
            rep_limit = i - longest;
            break;
        }
    }
    if (rep_limit < p->dry_allowed_length) return;
    /* 2: repeat counts by the reversed Z-algorithm (llama's, from Koboldcpp) */
    if (!kvl_grow((void **)&s->dry_rep, &s->cap_dry_rep, (size_t)n_rep, sizeof *s->dry_rep, 256))
        return;
    int32_t *rc = s->dry_rep;
    memset(rc, 0, (size_t)n_rep * sizeof *rc);
    const int64_t last = n_rep - 1;
    int64_t rt = 0, lt = 0;
    for (int64_t k = 1; k < n_rep; k++) {
        if (k > rt) {
            int64_t n = 0;
            while (n + k < n_rep && RAT(n) == RAT(n + k)) n++;
            rc[last - k] = (int32_t)(n < rep_limit ? n : rep_limit);
            if (n > 0) lt = k, rt = k + n - 1;
        } else {
            const int64_t pi = k - lt, right = rt - k + 1;
            if (rc[last - pi] < right) {
                rc[last - k] = (int32_t)(rc[last - pi] < rep_limit ? rc[last - pi] : rep_limit);
            } else {
                int64_t i = rt + 1;
                while (i < n_rep && RAT(i) == RAT(i - k)) i++;
                rc[last - k] = (int32_t)(i - k < rep_limit ? i - k : rep_limit);
                lt = k, rt = i - 1;
            }
        }
    }
    /* 3: each token that would extend a repeat, its longest (counts: length + 1) */
    for (int64_t i = 0; i < n_rep - 1; i++)
        if (rc[i] >= p->dry_allowed_length) {
            const int32_t t = RAT(n_rep - 2 - i);
            if (t >= 0 && t < s->n_vocab && s->counts[t] < rc[i] + 1) s->counts[t] = rc[i] + 1;
        }
#undef RAT
    /* 4: the penalties, the exponent bounded so that the power stays finite */
    int max_exp = 0;
    if (p->dry_base > 1.000001f) max_exp = (int)(88.7228391f / logf(p->dry_base));
    for (int32_t i = 0; i < h->n; i++) {
        const int32_t rep = s->counts[h->c[i].id] - 1;
        if (rep < 0) continue;
        int32_t b0;
        const int32_t b1 = breakers_of(s, h->c[i].id, &b0);
        bool single = false;
        for (int32_t b = b0; b < b1 && !single; b++) single = s->breakers[b].n_tail == 0;
        if (single) continue;
        int exp_ = rep - p->dry_allowed_length;
        if (max_exp > 0 && exp_ > max_exp) exp_ = max_exp;
        h->c[i].logit -= (float)(p->dry_multiplier * pow(p->dry_base, exp_));
    }
    for (int64_t i = 0; i < n_rep; i++) { /* counts back to zero */
        const int32_t t = hist[-i];
        if (t >= 0 && t < s->n_vocab) s->counts[t] = 0;
    }
    h->sorted = false;
}

/* The array (twice the vocabulary: typical's reordering uses the second
 * half), made on first use. */
static pcand *sampler_chain_buf(sampler *s) {
    if (!s->pc) s->pc = malloc((size_t)s->n_vocab * 2 * sizeof *s->pc);
    return s->pc;
}

int32_t sampler_sample_chain(sampler *s, float *logits, sampler_probs *out) {
    const sampler_params *p = &s->p;
    pcand *c = sampler_chain_buf(s);
    if (!c) { /* out of memory: the likeliest token */
        if (out) out->n = 0;
        return argmax(logits, s->n_vocab);
    }
    chain h = {c, s->n_vocab, false, true, c + s->n_vocab};
    for (int32_t i = 0; i < h.n; i++) c[i] = (pcand){i, logits[i], 0.0f};
    int32_t sel;
    if (p->mirostat == 1 || p->mirostat == 2) { /* llama: temperature, then mirostat */
        ch_temp(&h, p->temperature);
        sel = ch_mirostat(s, &h);
    } else {
        const int32_t keep = p->min_keep > 0 ? p->min_keep : 0;
        for (const char *o = p->order[0] ? p->order : "edskypmxt"; *o; o++) {
            switch (*o) {
            case 'e': ch_penalties(s, &h); break;
            case 'd': ch_dry(s, &h); break;
            case 's': ch_top_n_sigma(&h, p->top_n_sigma); break;
            case 'k': ch_top_k(s, &h, p->top_k); break;
            case 'y': ch_typical(&h, p->typical_p > 0 ? p->typical_p : 1.0f, keep); break;
            case 'p': ch_top_p(&h, p->top_p, keep); break;
            case 'm': ch_min_p(&h, p->min_p, keep); break;
            case 'x': ch_xtc(s, &h); break;
            case 't': ch_temp_ext(s, &h); break;
            default: break; /* (the server passes only these) */
            }
        }
        sel = ch_dist(s, &h);
    }
    s->pc_n = h.n;
    if (out) {
        out->n = h.n;
        for (int32_t i = 0; i < h.n && i < out->cap; i++) {
            out->ids[i] = c[i].id;
            out->probs[i] = c[i].p;
        }
    }
    return c[sel].id;
}

int sampler_chain_top(const sampler *s, int k, int32_t token, int32_t *ids, float *probs,
                      float *p_token) {
    int m = 0;
    *p_token = 0.0f;
    for (int32_t i = 0; s->pc && i < s->pc_n; i++) {
        const pcand c = s->pc[i];
        if (c.id == token) *p_token = c.p;
        if (k <= 0 || !(c.p > 0.0f) || (m == k && !(c.p > probs[k - 1]))) continue;
        int j = m < k ? m++ : k - 1; /* insertion into the k best so far */
        while (j > 0 && probs[j - 1] < c.p) {
            ids[j] = ids[j - 1], probs[j] = probs[j - 1];
            j--;
        }
        ids[j] = c.id, probs[j] = c.p;
    }
    return m;
}

/* Whether the parameters need the general chain: an order of their own, or
 * a sampler the fast chain lacks. */
bool sampler_params_general(const sampler_params *p) {
    return p->order[0] || p->mirostat == 1 || p->mirostat == 2 ||
           (p->typical_p > 0.0f && p->typical_p < 1.0f) || p->top_n_sigma > 0.0f ||
           (p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f) || p->dynatemp_range > 0.0f ||
           p->min_keep > 0 || (p->dry_multiplier != 0.0f && p->dry_base >= 1.0f);
}

/* Penalties -> top-k -> top-p -> min-p -> temperature -> draw, as llama.cpp's
 * chain, without sorting the vocabulary: top-k selects its k with a heap; top-p
 * and min-p only ever keep a prefix of the sorted order, so only the tokens
 * above a floor that contains that prefix are sorted (a floor found from the
 * probability masses; if rounding leaves top-p short inside it, everything
 * below is taken after all); temperature alone draws in vocabulary order.
 * Sorting all 128K candidates of a Llama 3 vocabulary took 18 ms per token. */
int32_t sampler_sample(sampler *s, float *logits) {
    const sampler_params *p = &s->p;
    if (sampler_params_general(p) && !p->infill) return sampler_sample_chain(s, logits, NULL);
    apply_penalties(s, logits);
    const bool infill =
        p->infill && s->vocab && s->probs && p->top_k > 0 && p->top_k <= SAMPLER_INFILL_MAX_K;
    if (p->temperature <= 0.0f && !infill) return argmax(logits, s->n_vocab);

    const int32_t V = s->n_vocab;
    const bool top_p = p->top_p<1.0f, min_p = p->min_p> 0.0f;
    cand *c = s->cands;
    int32_t n;
    double maxl, sum = 0;
    if (p->top_k > 0 && p->top_k < V) {
        n = select_top_k(logits, V, p->top_k, c);
        maxl = c[0].logit;
        for (int32_t i = 0; i < n; i++) sum += exp(c[i].logit - maxl);
        if (top_p) n = top_p_cut(c, n, maxl, sum, p->top_p);
    } else if (!top_p && !min_p && !infill) {
        /* temperature alone: weights exp((l - max) / T) of every token, drawn
         * in vocabulary order (masked tokens, -inf, never) */
        const float inv_t = 1.0f / p->temperature;
        for (int32_t i = 0; i < V; i++) s->w[i] = logits[i] * inv_t;
        float total;
        if (!(kern_attn_softmax(V, s->w, &total) > -INFINITY)) return argmax(logits, V);
        double r = rng_uniform(s) * total, acc = 0;
        int32_t last = -1;
        for (int32_t i = 0; i < V; i++) {
            if (!(logits[i] > -INFINITY)) continue;
            acc += s->w[i];
            last = i;
            if (r < acc) return i;
        }
        return last >= 0 ? last : argmax(logits, V);
    } else {
        memcpy(s->w, logits, (size_t)V * sizeof *s->w);
        float total; /* (the kernel's float sum; top-p divides by the double one below) */
        const float mx = kern_attn_softmax(V, s->w, &total);
        if (!(mx > -INFINITY)) return argmax(logits, V);
        maxl = mx;
        for (int32_t i = 0; i < V; i++) sum += s->w[i]; /* top-p divides by every token's */
        const double floor = min_p ? maxl + log(p->min_p) : -INFINITY;
        const double pf =
            top_p ? top_p_floor(logits, s->w, V, mx, sum, p->top_p * (1.0 + 1e-5)) : -INFINITY;
        n = gather_sorted(logits, V, pf > floor ? pf : floor, c);
        if (top_p) {
            int32_t cut = top_p_cut(c, n, maxl, sum, p->top_p);
            if (cut == n && pf > floor) { /* short inside the floor by rounding: take the rest */
                n = gather_sorted(logits, V, floor, c);
                cut = top_p_cut(c, n, maxl, sum, p->top_p);
            }
            n = cut;
        }
    }
    if (min_p) {
        /* keep tokens whose probability is at least min_p times the top one's */
        double floor_l = maxl + log(p->min_p);
        int32_t keep = 1;
        while (keep < n && c[keep].logit >= floor_l) keep++;
        n = keep;
    }
    if (infill) { /* llama's temperature 0 then keeps the likeliest left */
        int32_t forced;
        n = infill_filter(s, c, n, &forced);
        if (n == 0) return forced >= 0 ? forced : c[0].id;
        if (p->temperature <= 0.0f) return c[0].id;
        maxl = c[0].logit;
    }
    return draw_sorted(s, c, n, maxl, p->temperature);
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
