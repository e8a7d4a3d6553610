/* sampler_sample against a plain reference of the same chain (sort the whole
 * vocabulary, then top-k, top-p, min-p, temperature, draw in sorted order, the
 * sampler's own RNG): the same token for every draw, over peaked, flat and
 * tied logits with masked (-inf) tokens. Temperature alone draws in vocabulary
 * order instead, so there the frequencies are checked against the softmax. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "sampler.h"
#include "tokenizer.h"

#include "check.h"

/* ------------------------------------------------------------ reference -- */

typedef struct {
    int32_t id;
    float logit;
} ref_cand;

static int ref_cmp(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* The sampler's RNG (xorshift64*, seed 0 -> the golden ratio). */
static double ref_uniform(uint64_t *st) {
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return (double)((*st * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

static int32_t ref_sample(const sampler_params *p, const float *logits, int32_t V, uint64_t *rng,
                          double sum_scale) {
    ref_cand *c = malloc((size_t)V * sizeof *c);
    for (int32_t i = 0; i < V; i++) c[i] = (ref_cand){i, logits[i]};
    qsort(c, (size_t)V, sizeof *c, ref_cmp);
    int32_t n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double maxl = c[0].logit, sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp(c[i].logit - maxl);
    sum *= sum_scale;
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp(c[i].logit - maxl) / sum;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        int32_t keep = 1;
        while (keep < n && c[keep].logit >= maxl + log(p->min_p)) keep++;
        n = keep;
    }
    double total = 0;
    for (int32_t i = 0; i < n; i++) total += exp((c[i].logit - maxl) / p->temperature);
    double r = ref_uniform(rng) * total, acc = 0;
    int32_t tok = c[n - 1].id;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((c[i].logit - maxl) / p->temperature);
        if (r < acc) {
            tok = c[i].id;
            break;
        }
    }
    free(c);
    return tok;
}

/* -------------------------------------------------------------- logits -- */

static uint64_t lcg = 12345;
static double unit(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 11) * (1.0 / 9007199254740992.0);
}

/* kind 0: peaked (a few leaders over a normal-ish body, like a model's),
 * 1: flat, 2: few distinct values (ties everywhere); some tokens masked. */
static void make_logits(int kind, float *l, int32_t V) {
    for (int32_t i = 0; i < V; i++) {
        double g = unit() + unit() + unit() - 1.5; /* roughly normal, sd 0.5 */
        l[i] = kind == 0   ? (float)(5.0 * g)
               : kind == 1 ? (float)(unit() * 2.0)
                           : (float)(int)(unit() * 4.0);
    }
    if (kind == 0)
        for (int j = 0; j < 6; j++) l[(int32_t)(unit() * V)] = 8.0f + (float)j * 1.5f;
    for (int j = 0; j < V / 50; j++) l[(int32_t)(unit() * V)] = -INFINITY;
}

static void test_against_reference(void) {
    static const int32_t vocabs[] = {7, 300, 5000, 128256};
    static const int32_t top_ks[] = {0, 1, 5, 40, 1 << 20};
    static const float top_ps[] = {1.0f, 0.3f, 0.9f, 0.99f};
    static const float min_ps[] = {0.0f, 0.05f, 0.3f};
    static const float temps[] = {0.5f, 1.0f, 1.7f};
    int compared = 0, edges = 0;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        const int32_t V = vocabs[vi];
        float *l = malloc((size_t)V * sizeof *l), *w = malloc((size_t)V * sizeof *w);
        for (int kind = 0; kind < 3; kind++) {
            make_logits(kind, l, V);
            for (size_t a = 0; a < sizeof top_ks / sizeof *top_ks; a++)
                for (size_t b = 0; b < sizeof top_ps / sizeof *top_ps; b++)
                    for (size_t m = 0; m < sizeof min_ps / sizeof *min_ps; m++) {
                        if ((top_ks[a] == 0 || top_ks[a] >= V) && top_ps[b] >= 1.0f &&
                            min_ps[m] == 0.0f)
                            continue; /* temperature alone: below */
                        if (V == 128256 && (a + b + m) % 7 != 0)
                            continue; /* a sample of the big ones */
                        const float T = temps[(a + b + m) % 3];
                        sampler_params p;
                        sampler_params_default(&p);
                        p.temperature = T, p.top_k = top_ks[a], p.top_p = top_ps[b],
                        p.min_p = min_ps[m];
                        p.seed = 1000 + (uint64_t)(a * 100 + b * 10 + m);
                        sampler *s = sampler_create(&p, V);
                        uint64_t rng = p.seed;
                        for (int d = 0; d < (V > 10000 ? 3 : 8); d++) {
                            memcpy(w, l, (size_t)V * sizeof *w);
                            const uint64_t rng0 = rng;
                            const int32_t got = sampler_sample(s, w),
                                          want = ref_sample(&p, l, V, &rng, 1.0);
                            /* top-p's probabilities are float-precise: where
                             * the cut moves when the sum moves by 1e-7, either
                             * side is right */
                            uint64_t r1 = rng0, r2 = rng0;
                            const bool edge =
                                got != want && (got == ref_sample(&p, l, V, &r1, 1.0 + 1e-7) ||
                                                got == ref_sample(&p, l, V, &r2, 1.0 - 1e-7));
                            if (got != want && !edge)
                                fprintf(stderr,
                                        "V %d kind %d top_k %d top_p %g min_p %g T %g draw %d: %d, "
                                        "want %d\n",
                                        V, kind, p.top_k, p.top_p, p.min_p, T, d, got, want);
                            CHECK(got == want || edge);
                            edges += edge;
                            CHECK(got >= 0 && got < V && l[got] > -INFINITY);
                            compared++;
                        }
                        sampler_destroy(s);
                    }
        }
        free(l), free(w);
    }
    CHECK(compared > 1000);
    CHECK(edges <= 4);
    printf("sampler vs reference: %d draws, %d at a top-p edge\n", compared, edges);
}

/* Temperature alone: frequencies within 0.01 of softmax(l / T) (over 5
 * standard deviations at 40000 draws); masked tokens never. */
static void test_temperature_only(void) {
    const float l[6] = {1.0f, 2.0f, -INFINITY, 0.5f, 2.0f, -1.0f};
    const float T = 1.3f;
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = T, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f, p.seed = 7;
    sampler *s = sampler_create(&p, 6);
    int count[6] = {0};
    const int N = 40000;
    for (int d = 0; d < N; d++) {
        float w[6];
        memcpy(w, l, sizeof w);
        const int32_t t = sampler_sample(s, w);
        CHECK(t >= 0 && t < 6);
        if (t >= 0 && t < 6) count[t]++;
    }
    double z = 0;
    for (int i = 0; i < 6; i++) z += l[i] > -INFINITY ? exp(l[i] / T) : 0;
    for (int i = 0; i < 6; i++) {
        const double want = l[i] > -INFINITY ? exp(l[i] / T) / z : 0;
        CHECK(fabs((double)count[i] / N - want) < 0.01);
    }
    CHECK(count[2] == 0);
    sampler_destroy(s);
}

/* Greedy: the first of the largest logits; NaN never wins. */
static void test_greedy(void) {
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0;
    float l[9] = {0.5f, NAN, 3.0f, -INFINITY, 3.0f, 2.0f, NAN, 1.0f, 3.0f};
    sampler *s = sampler_create(&p, 9);
    CHECK(sampler_sample(s, l) == 2);
    float m[5] = {NAN, -1.0f, -INFINITY, -0.5f, NAN};
    sampler_destroy(s);
    s = sampler_create(&p, 5);
    CHECK(sampler_sample(s, m) == 3);
    sampler_destroy(s);
}

/* Penalties, llama.cpp's rule written out: a token seen c times in the last
 * penalty_last_n has its logit divided by repeat_penalty if positive (else
 * multiplied), then c * frequency_penalty + presence_penalty subtracted.
 * Greedy, so the modified logits are read back from the array. Also the first
 * draw, with no history at all (s->history still NULL: once a UBSan report,
 * "applying zero offset to null pointer"). */
static void test_penalties(void) {
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 3;
    sampler *s = sampler_create(&p, 5);
    float fresh[5] = {1, 2, 3, -1, 0};
    CHECK(sampler_sample(s, fresh) == 2);
    CHECK(fresh[0] == 1 && fresh[1] == 2 && fresh[2] == 3 && fresh[3] == -1 && fresh[4] == 0,
          "no history: unchanged");
    const int32_t hist[] = {4, 2, 2, 3}; /* the window is the last 3: 2, 2, 3 */
    for (int i = 0; i < 4; i++) sampler_accept(s, hist[i]);
    float l[5] = {1, 2, 3, -1, 0};
    int32_t got = sampler_sample(s, l);
    const float want[5] = {1, 2, 3.0f / 2 - 2 * 0.25f - 0.5f, -1 * 2.0f - 0.25f - 0.5f, 0};
    for (int i = 0; i < 5; i++) CHECK(l[i] == want[i], "logit %d: %g, want %g", i, l[i], want[i]);
    CHECK(got == 1, "greedy after penalties: %d", got);
    sampler_destroy(s);
}

/* The tokens a sampler draws from logits over many seeds (bit t of seen[t / 64]). */
static void draws(const sampler_params *p, const tok_vocab *v, const float *logits, int32_t V,
                  uint64_t *seen, int n_seen_words) {
    memset(seen, 0, (size_t)n_seen_words * sizeof *seen);
    float *l = malloc((size_t)V * sizeof *l);
    for (uint64_t seed = 1; l && seed <= 400; seed++) {
        sampler_params q = *p;
        q.seed = seed * 0x9E3779B97F4A7C15ull;
        sampler *s = sampler_create(&q, V);
        if (!s) break;
        sampler_set_vocab(s, v);
        memcpy(l, logits, (size_t)V * sizeof *l);
        const int32_t t = sampler_sample(s, l);
        if (t >= 0 && t < 64 * n_seen_words) seen[t / 64] |= 1ull << (t % 64);
        sampler_destroy(s);
    }
    free(l);
}
#define SEEN(t) (seen[(t) / 64] >> ((t) % 64) & 1)

/* llama.cpp's infill sampler, its steps worked out by hand on stories260K's
 * pieces: " th" (308) is a prefix of " the" (265). Five candidates, " th" and
 * " the" at logit 0 (p 0.165 each), " a" / " b" / " c" at 0.3 (0.223): " the"
 * folds into " th" (the first of two equals keeps it), which then holds 0.33
 * and stays; alone each would fall under the 0.2 floor. So " th", " a", " b",
 * " c" are drawn and " the" never; without the sampler " the" is. With </s>
 * at -0.3 among six (p 0.109: 3 x 0.109 x 6 > 0.89) only end of generation is
 * left. */
static void test_infill(void) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open("models/stories260K.gguf", &err);
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    CHECK(v, "stories260K's vocabulary: %s", err.msg);
    if (!v) {
        gguf_close(f);
        return;
    }
    const int32_t V = tok_n_vocab(v), TH = 308, THE = 265, A = 261, B = 268, C = 280, EOS = 2;
    uint64_t seen[16];
    CHECK(V <= 64 * 16, "vocabulary of %d", V);
    float *l = malloc((size_t)V * sizeof *l);
    for (int32_t i = 0; i < V; i++) l[i] = -INFINITY;
    l[TH] = l[THE] = 0.0f, l[A] = l[B] = l[C] = 0.3f;
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1, p.top_k = 5, p.top_p = 1, p.min_p = 0, p.infill = true;
    draws(&p, v, l, V, seen, 16);
    CHECK(SEEN(TH) && SEEN(A) && SEEN(B) && SEEN(C) && !SEEN(THE),
          "merged: th %d a %d b %d c %d the %d", (int)SEEN(TH), (int)SEEN(A), (int)SEEN(B),
          (int)SEEN(C), (int)SEEN(THE));
    p.infill = false;
    draws(&p, v, l, V, seen, 16);
    CHECK(SEEN(THE), "without the infill sampler \" the\" is drawn");
    l[EOS] = -0.3f;
    p.infill = true, p.top_k = 6;
    draws(&p, v, l, V, seen, 16);
    int others = 0;
    for (int32_t t = 0; t < V; t++) others += t != EOS && SEEN(t);
    CHECK(SEEN(EOS) && others == 0, "end of generation outweighs the text: %d others", others);
    free(l);
    tok_vocab_destroy(v);
    gguf_close(f);
}

/* ------------------------------------------ llama.cpp's sampler vectors -- */

/* One step of llama.cpp's tests/test-sampling.cpp: candidates whose logits are
 * log(probs), one sampler (order: its letter), then the dist sampler; the
 * candidates left, in order, with their probabilities (within 1e-5, as there).
 * Where llama's test skips the dist sampler (XTC, typical) its expected
 * probabilities are those before normalising: the normalised ones are given
 * here (each over their sum), with the comment's figures. penalize: tokens
 * accepted first (the penalty window is all of them). */
static void chain_case(const char *what, const sampler_params *p, const float *probs, int n,
                       const int32_t *penalize, int n_pen, const float *expect, int n_expect) {
    float logits[8];
    int32_t ids[8];
    float got[8];
    for (int i = 0; i < n; i++) logits[i] = logf(probs[i]);
    sampler *s = sampler_create(p, n);
    for (int i = 0; i < n_pen; i++) sampler_accept(s, penalize[i]);
    sampler_probs out = {.cap = 8, .ids = ids, .probs = got};
    sampler_sample_chain(s, logits, &out);
    bool ok = out.n == n_expect;
    for (int i = 0; ok && i < n_expect; i++) ok = fabsf(got[i] - expect[i]) < 1e-5f;
    CHECK(ok, "%s: %d candidates left (want %d), first p %g (want %g)", what, out.n, n_expect,
          out.n > 0 ? got[0] : -1.0, expect[0]);
    sampler_destroy(s);
}

static sampler_params one_sampler(const char *order) {
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1, p.seed = 1234;
    snprintf(p.order, sizeof p.order, "%s", order);
    return p;
}

#define F(...)   ((const float[]){__VA_ARGS__})
#define COUNT(a) (int)(sizeof(a) / sizeof(float))
#define CASE(what, p, probs, expect)                                                               \
    chain_case(what, &p, probs, COUNT(probs), NULL, 0, expect, COUNT(expect))

static void test_llama_vectors(void) {
    sampler_params p = one_sampler("t");
    p.temperature = 1;
    CASE("temp 1", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.1f, 0.2f, 0.3f, 0.4f));
    p.temperature = 0;
    CASE("temp 0", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.0f, 0.0f, 0.0f, 1.0f));
    p = one_sampler("k");
    p.top_k = 1;
    CASE("top_k 1", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(1.0f));
    p.top_k = 3;
    CASE("top_k 3", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.44444f, 0.33333f, 0.22222f));
    p.top_k = 4;
    CASE("top_k 4", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.4f, 0.3f, 0.2f, 0.1f));
    p.top_k = 0;
    CASE("top_k 0", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.1f, 0.2f, 0.3f, 0.4f));
    p = one_sampler("p");
    p.top_p = 0;
    CASE("top_p 0", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(1.0f));
    p.top_p = 0.7f;
    CASE("top_p 0.7", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.571429f, 0.428571f));
    p.top_p = 0.8f;
    CASE("top_p 0.8", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.44444f, 0.33333f, 0.22222f));
    p.top_p = 1.0f;
    CASE("top_p 1", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.1f, 0.2f, 0.3f, 0.4f));
    p = one_sampler("m");
    const float mins[] = {0.0f, 0.24f, 0.26f, 0.49f, 0.51f, 0.74f, 0.76f, 1.0f, 1.05f};
    for (int i = 0; i < 9; i++) {
        char what[32];
        snprintf(what, sizeof what, "min_p %.2f", mins[i]);
        p.min_p = mins[i];
        const float *e = i < 2   ? F(0.1f, 0.2f, 0.3f, 0.4f)
                         : i < 4 ? F(0.2f / 0.9f, 0.3f / 0.9f, 0.4f / 0.9f)
                         : i < 6 ? F(0.3f / 0.7f, 0.4f / 0.7f)
                                 : F(1.0f);
        chain_case(what, &p, F(0.1f, 0.2f, 0.3f, 0.4f), 4, NULL, 0, e,
                   i < 2   ? 4
                   : i < 4 ? 3
                   : i < 6 ? 2
                           : 1);
    }
    /* XTC (llama: {0.1}, {0.2, 0.1}, {0.3, 0.2, 0.1}; and not at 0.39) */
    p = one_sampler("x");
    p.xtc_probability = 0.99f, p.xtc_threshold = 0.09f;
    CASE("xtc 0.09", p, F(0.4f, 0.3f, 0.2f, 0.1f), F(1.0f));
    p.xtc_threshold = 0.19f;
    CASE("xtc 0.19", p, F(0.4f, 0.3f, 0.2f, 0.1f), F(0.2f / 0.3f, 0.1f / 0.3f));
    p.xtc_threshold = 0.29f;
    CASE("xtc 0.29", p, F(0.4f, 0.3f, 0.2f, 0.1f), F(0.5f, 0.2f / 0.6f, 0.1f / 0.6f));
    p.xtc_threshold = 0.39f;
    CASE("xtc 0.39", p, F(0.4f, 0.3f, 0.2f, 0.1f), F(0.4f, 0.3f, 0.2f, 0.1f));
    /* typical (llama: {0.97}; {0.2, 0.2, 0.2}) */
    p = one_sampler("y");
    p.typical_p = 0.5f;
    CASE("typical 0.5", p, F(0.97f, 0.01f, 0.01f, 0.01f), F(1.0f));
    CASE("typical 0.5 flat", p, F(0.4f, 0.2f, 0.2f, 0.2f), F(1 / 3.0f, 1 / 3.0f, 1 / 3.0f));
    /* penalties over the accepted tokens (window: all of them) */
    p = one_sampler("e");
    p.repeat_penalty = 50, p.penalty_last_n = -1;
    chain_case("repeat 50", &p, F(0.2f, 0.2f, 0.2f, 0.2f, 0.2f), 5, (const int32_t[]){0}, 1,
               F(0, 0.25f, 0.25f, 0.25f, 0.25f), 5);
    chain_case("repeat 50, 3 tokens", &p, F(0.2f, 0.2f, 0.2f, 0.2f, 0.2f), 5,
               (const int32_t[]){0, 1, 2, 0, 0}, 5, F(0, 0, 0, 0.5f, 0.5f), 5);
    p.repeat_penalty = 1, p.frequency_penalty = 5, p.presence_penalty = 5;
    chain_case("frequency and presence", &p, F(0.2f, 0.2f, 0.2f, 0.2f, 0.2f), 5,
               (const int32_t[]){0, 1, 2}, 3,
               F(0.000023f, 0.000023f, 0.000023f, 0.499966f, 0.499966f), 5);
    chain_case("frequency and presence, repeats", &p, F(0.2f, 0.2f, 0.2f, 0.2f, 0.2f), 5,
               (const int32_t[]){0, 1, 2, 0, 0}, 5,
               F(0.000000f, 0.000023f, 0.000023f, 0.499977f, 0.499977f), 5);
    /* top-n-sigma (llama: 1 -> {0, 0, 0.428571, 0.571429}; 0 and 3 change nothing) */
    p = one_sampler("s");
    p.top_n_sigma = 1;
    CASE("top_n_sigma 1", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.0f, 0.0f, 0.428571f, 0.571429f));
    p.top_n_sigma = 0;
    CASE("top_n_sigma 0", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.1f, 0.2f, 0.3f, 0.4f));
    p.top_n_sigma = 3;
    CASE("top_n_sigma 3", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.1f, 0.2f, 0.3f, 0.4f));
    /* dynamic temperature (no llama vector: its formula by hand, in double:
     * T = max(0, t - r) + 2r (H / log n)^e, then p^(1 / T) normalised; the
     * entropy's softmax leaves the candidates sorted) */
    p = one_sampler("t");
    p.dynatemp_range = 0.5f, p.dynatemp_exponent = 1;
    CASE("dynatemp 0.5", p, F(0.1f, 0.2f, 0.3f, 0.4f),
         F(0.356000614f, 0.290847118f, 0.218744616f, 0.134407653f));
    p.dynatemp_exponent = 2;
    CASE("dynatemp 0.5 ^2", p, F(0.1f, 0.2f, 0.3f, 0.4f),
         F(0.361520696f, 0.292244077f, 0.216537404f, 0.129697823f));
    p.dynatemp_range = 0, p.temperature = 0;
    CASE("temp_ext 0", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.0f, 0.0f, 0.0f, 1.0f));
    /* orders: top-k then top-p against top-p then top-k (llama's chain
     * applies them as listed) */
    p = one_sampler("kp");
    p.top_k = 3, p.top_p = 0.5f;
    CASE("top_k 3, top_p 0.5", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.571429f, 0.428571f));
    snprintf(p.order, sizeof p.order, "pk");
    p.top_k = 1, p.top_p = 0.8f;
    CASE("top_p 0.8, top_k 1", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(1.0f));
    /* min_keep holds top-p's cut open */
    p = one_sampler("p");
    p.top_p = 0.1f, p.min_keep = 3;
    CASE("top_p 0.1, min_keep 3", p, F(0.1f, 0.2f, 0.3f, 0.4f), F(0.44444f, 0.33333f, 0.22222f));
}

/* llama.cpp's DRY vectors (test-sampling.cpp, its context 1024): penalties on
 * the tokens that would extend a repeat of the history. Its breaker case
 * names token 3 itself; here the breaker is a text, "</s>", which only
 * token 2 of stories260K's vocabulary holds: that case's tokens 2 and 3 are
 * swapped (the probabilities are all equal). */
static void dry_case(const char *what, const tok_vocab *v, const char *breaker, const float *probs,
                     int n, const int32_t *hist, int n_hist, const float *expect, float mult,
                     float base, int allowed, int last_n) {
    sampler_params p = one_sampler("d");
    p.dry_multiplier = mult, p.dry_base = base, p.dry_allowed_length = allowed;
    p.dry_penalty_last_n = last_n, p.dry_context = 1024;
    memset(p.dry_breakers, 0, sizeof p.dry_breakers);
    if (breaker) snprintf(p.dry_breakers, sizeof p.dry_breakers, "%s", breaker);
    float logits[8], got[8];
    int32_t ids[8];
    for (int i = 0; i < n; i++) logits[i] = logf(probs[i]);
    sampler *s = sampler_create(&p, n);
    if (v) sampler_set_vocab(s, v);
    for (int i = 0; i < n_hist; i++) sampler_accept(s, hist[i]);
    sampler_probs out = {.cap = 8, .ids = ids, .probs = got};
    sampler_sample_chain(s, logits, &out);
    bool ok = out.n == n;
    for (int i = 0; ok && i < n; i++) ok = fabsf(got[i] - expect[i]) < 1e-5f;
    CHECK(ok, "DRY %s: %d left, p %g %g %g (want %g %g %g)", what, out.n, got[0], got[1], got[2],
          expect[0], expect[1], expect[2]);
    sampler_destroy(s);
}

static void test_dry(void) {
    const float q4[] = {0.25f, 0.25f, 0.25f, 0.25f}, q5[] = {0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
    dry_case("short history", NULL, NULL, q4, 4, (const int32_t[]){0, 1}, 2, q4, 1, 1.1f, 2, 4);
    dry_case("a b c a b", NULL, NULL, q4, 4, (const int32_t[]){0, 1, 2, 0, 1}, 5,
             F(0.296923f, 0.296923f, 0.109232f, 0.296923f), 1, 1.1f, 2, 5);
    dry_case("multiplier 2", NULL, NULL, q5, 5, (const int32_t[]){0, 1, 2, 0, 1}, 5,
             F(0.241818f, 0.241818f, 0.032727f, 0.241818f, 0.241818f), 2, 1.1f, 2, 5);
    dry_case("allowed 4", NULL, NULL, q5, 5, (const int32_t[]){0, 1, 2, 3, 4, 0, 1}, 7, q5, 1, 1.1f,
             4, 7);
    kvl_error err = {{0}};
    gguf_file *f = gguf_open("models/stories260K.gguf", &err);
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    CHECK(v, "stories260K's vocabulary: %s", err.msg);
    if (v) {
        dry_case("a breaker", v, "</s>", q5, 5, (const int32_t[]){0, 1, 2, 4, 0, 1}, 6, q5, 1, 1.1f,
                 2, 6);
        /* without the breaker, token 2 (which would extend "0 1") loses 1 x 1.1^0 of its
         * logit: 0.2 / e over 0.8 + 0.2 / e */
        dry_case("no breaker", v, NULL, q5, 5, (const int32_t[]){0, 1, 2, 4, 0, 1}, 6,
                 F(0.2289440f, 0.2289440f, 0.0842238f, 0.2289440f, 0.2289440f), 1, 1.1f, 2, 6);
    }
    tok_vocab_destroy(v);
    gguf_close(f);
}

/* mirostat 2: a token more surprising than mu (2 tau at first) is never
 * drawn, and mu moves by eta times each draw's surprise error. */
static void test_mirostat(void) {
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1, p.mirostat = 2, p.mirostat_tau = 2, p.mirostat_eta = 0; /* mu 4: p >= 1/16 */
    float logits[6];
    const float probs[6] = {0.5f, 0.3f, 0.1f, 0.07f, 0.02f, 0.01f};
    int seen[6] = {0};
    sampler *s = sampler_create(&p, 6);
    for (int r = 0; r < 400; r++) {
        for (int i = 0; i < 6; i++) logits[i] = logf(probs[i]);
        seen[sampler_sample(s, logits)]++;
    }
    CHECK(seen[0] && seen[1] && seen[2] && seen[3] && !seen[4] && !seen[5],
          "mirostat 2, mu 4: drew %d %d %d %d %d %d", seen[0], seen[1], seen[2], seen[3], seen[4],
          seen[5]);
    sampler_destroy(s);
    /* with eta, a draw of the top token (surprise 1 < tau 2) raises mu */
    p.mirostat_eta = 1, p.temperature = 0; /* temperature 0: the top token only */
    s = sampler_create(&p, 6);
    for (int i = 0; i < 6; i++) logits[i] = logf(probs[i]);
    int32_t ids[6];
    float got[6];
    sampler_probs out = {.cap = 6, .ids = ids, .probs = got};
    const int32_t t = sampler_sample_chain(s, logits, &out);
    CHECK(t == 0 && out.n >= 1 && got[0] == 1.0f, "mirostat 2 at temperature 0: %d", t);
    sampler_destroy(s);
}

/* The general chain's sort on a large array (the radix path, past 2048
 * candidates) keeps cmp order: descending logit, ties by ascending id, with
 * negative, positive, zero and -inf logits among many ties. top-p at 1 - eps
 * sorts the whole array and keeps nearly all of it. */
static void test_chain_sort(void) {
    enum { V = 5000 };
    static float logits[V], probs[V];
    static int32_t ids[V];
    static const float levels[] = {-3.5f, -0.0f, 0.0f, 1.25f, 7.0f, -INFINITY, 2.5f, -1e-30f};
    uint64_t st = 99;
    for (int i = 0; i < V; i++) logits[i] = levels[(int)(ref_uniform(&st) * 8)];
    sampler_params p = one_sampler("p");
    p.top_p = 0.999999f, p.min_keep = V;
    sampler *s = sampler_create(&p, V);
    sampler_probs out = {.cap = V, .ids = ids, .probs = probs};
    float copy[V];
    memcpy(copy, logits, sizeof copy);
    sampler_sample_chain(s, copy, &out);
    bool ok = out.n == V;
    for (int i = 1; ok && i < V; i++) {
        const float a = logits[ids[i - 1]], b = logits[ids[i]];
        ok = a > b || (a == b && ids[i - 1] < ids[i]) || (a == b && a == 0.0f);
    }
    CHECK(ok, "the chain's sort of %d candidates: descending logit, ties by id (%d left)", V,
          out.n);
    sampler_destroy(s);
}

int main(void) {
    test_chain_sort();
    test_llama_vectors();
    test_mirostat();
    test_dry();
    test_infill();
    test_penalties();
    test_greedy();
    test_temperature_only();
    test_against_reference();
    printf("test_sampler: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
