/* Sampler cost per token on a Llama 3 sized vocabulary (128,256 logits).
 *
 * Build (not part of the CMake build), from the repo root, after `make`:
 *   gcc -std=gnu11 -O2 -Isrc -Isrc/base -Isrc/engine bench/bench_sampler.c \
 *       build/libkvllm_engine.a build/libkvllm_model.a build/libkvllm_kv.a \
 *       build/libkvllm_tokenizer.a build/libkvllm_kernels.a build/libkvllm_gguf.a \
 *       build/libkvllm_base.a -o build/bench_sampler -fopenmp -lxxhash -lpcre2-8 -lm
 * Run:   ./build/bench_sampler [reps]
 *
 * Two kinds of logits: "peaked" (a normal body, sd 2.5, and a few leaders 8-15
 * above it, as a model's logits look) and "flat" (uniform in [-10, 10]: top-p
 * and min-p then keep thousands of tokens, the worst case for them). Each
 * configuration runs on a fresh copy of the logits (the sampler applies
 * penalties in place). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

static uint64_t lcg = 42;
static double unit(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 11) * (1.0 / 9007199254740992.0);
}

int main(int argc, char **argv) {
    const int32_t V = 128256;
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    float *peaked = malloc(V * sizeof(float)), *flat = malloc(V * sizeof(float)),
          *w = malloc(V * sizeof(float));
    for (int32_t i = 0; i < V; i++) {
        const double g = (unit() + unit() + unit() + unit() - 2.0) * sqrt(3.0); /* sd 1 */
        peaked[i] = (float)(2.5 * g);
        flat[i] = (float)(unit() * 20.0 - 10.0);
    }
    for (int j = 0; j < 8; j++) peaked[(int32_t)(unit() * V)] = 8.0f + (float)j;
    static const struct {
        const char *name;
        float temp;
        int top_k;
        float top_p, min_p;
        float typical_p, top_n_sigma, xtc; /* the general chain's (0: off) */
        int mirostat;
    } cs[] = {{"greedy", 0, 0, 1, 0, 0, 0, 0, 0},
              {"temperature 1 alone (OpenAI default)", 1, 0, 1, 0, 0, 0, 0, 0},
              {"top-k 40, temperature 0.8", 0.8f, 40, 1, 0, 0, 0, 0, 0},
              {"top-p 0.95, temperature 0.8", 0.8f, 0, 0.95f, 0, 0, 0, 0, 0},
              {"min-p 0.05, temperature 0.8", 0.8f, 0, 1, 0.05f, 0, 0, 0, 0},
              {"llama.cpp default (40, 0.95, 0.05, 0.8)", 0.8f, 40, 0.95f, 0.05f, 0, 0, 0, 0},
              /* the general chain (sampler_sample_chain) */
              {"default + typical 0.9 (general chain)", 0.8f, 40, 0.95f, 0.05f, 0.9f, 0, 0, 0},
              {"top-n-sigma 1, temperature 0.8", 0.8f, 0, 1, 0, 0, 1, 0, 0},
              {"typical 0.9 alone (whole vocabulary)", 0.8f, 0, 1, 0, 0.9f, 0, 0, 0},
              {"XTC 0.5 after top-k 40", 0.8f, 40, 1, 0, 0, 0, 0.5f, 0},
              {"mirostat 2", 0.8f, 0, 1, 0, 0, 0, 0, 2}};
    printf("vocabulary %d, %d draws each\n%-42s %12s %12s\n", V, reps, "configuration", "peaked us",
           "flat us");
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        double us[2];
        for (int kind = 0; kind < 2; kind++) {
            sampler_params p;
            sampler_params_default(&p);
            p.temperature = cs[c].temp, p.top_k = cs[c].top_k, p.top_p = cs[c].top_p,
            p.min_p = cs[c].min_p;
            if (cs[c].typical_p > 0) p.typical_p = cs[c].typical_p;
            p.top_n_sigma = cs[c].top_n_sigma, p.xtc_probability = cs[c].xtc;
            p.mirostat = cs[c].mirostat;
            sampler *s = sampler_create(&p, V);
            if (!s) return 1;
            double spent = 0;
            long sum = 0;
            for (int r = 0; r < reps; r++) {
                memcpy(w, kind ? flat : peaked, V * sizeof(float));
                const double t0 = kvl_time_s();
                sum += sampler_sample(s, w);
                spent += kvl_time_s() - t0;
            }
            us[kind] = spent / reps * 1e6;
            sampler_destroy(s);
            if (sum < 0) return 1; /* (keeps the draws live) */
        }
        printf("%-42s %12.1f %12.1f\n", cs[c].name, us[0], us[1]);
    }
    free(peaked), free(flat), free(w);
    return 0;
}
