/* sampler_sample against a plain reference of the same chain (sort the whole
 * vocabulary, then top-k, top-p, min-p, temperature, draw in sorted order, the
 * sampler's own RNG): the same token for every draw, over peaked, flat and
 * tied logits with masked (-inf) tokens. Temperature alone draws in vocabulary
 * order instead, so there the frequencies are checked against the softmax. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

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

int main(void) {
    test_penalties();
    test_greedy();
    test_temperature_only();
    test_against_reference();
    printf("test_sampler: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
