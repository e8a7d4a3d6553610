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

int main(void) {
    test_infill();
    test_penalties();
    test_greedy();
    test_temperature_only();
    test_against_reference();
    printf("test_sampler: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
