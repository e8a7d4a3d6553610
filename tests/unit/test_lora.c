/* LoRA adapters through the engine, on the golden llama-gqa-bpe-f32 model
 * and its llama.cpp-checked adapter (tests/data/golden/models):
 * - requests with different adapter scales batched together produce, each,
 *   exactly the ids they produce alone; scale 0 is the plain model's output,
 *   and a model without adapters gives the same;
 * - under preemption (a pool too small for all of them) the same again;
 * - the prefix cache shares blocks only between requests of the same
 *   adapters and scales: K and V depend on them;
 * - an adapter the model refuses leaves the model as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "test_model.h"

#include "check.h"

#define MODEL    "tests/data/golden/models/llama-gqa-bpe-f32.gguf"
#define ADAPTER  "tests/data/golden/models/llama-gqa-bpe-f32-lora_f32.gguf"
#define OTHER    "tests/data/golden/models/llama-moe-f32-lora_f16_x0.5.gguf"
#define N_REQ    4
#define N_GEN    24
#define N_PROMPT 40

typedef struct out {
    text_out t;
    int64_t cached;
} out;

static void on_out(const engine_event *ev, void *user) {
    out *o = user;
    on_text_event(ev, &o->t);
    if (ev->finish) o->cached = ev->stats->n_cached_prompt;
}

static const float SCALES[N_REQ] = {1.0f, 0.0f, 0.5f, -1.0f};

static void prompt_of(int i, int32_t *p) {
    for (int k = 0; k < N_PROMPT; k++) p[k] = 100 + (k * 53 + i * 7) % 3000;
}

/* Runs requests [0, n) (scales SCALES, or none when with_lora is false), all
 * submitted before the first step (batched) or each alone. */
static bool run(model *m, tok_vocab *v, int64_t n_blocks, bool batched, bool with_lora, int n,
                out *o) {
    kvl_error err = {{0}};
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    c.n_blocks = n_blocks;
    engine *e = engine_create(m, v, &c, &err);
    if (!e) {
        fprintf(stderr, "engine_create: %s\n", err.msg);
        return false;
    }
    int32_t prompts[N_REQ][N_PROMPT];
    bool ok = true;
    memset(o, 0, sizeof *o * (size_t)n);
    for (int i = 0; i < n && ok; i++) {
        prompt_of(i, prompts[i]);
        engine_request r = {.prompt = prompts[i],
                            .n_prompt = N_PROMPT,
                            .max_tokens = N_GEN,
                            .ignore_eos = true,
                            .lora = with_lora ? &SCALES[i] : NULL,
                            .on_event = on_out,
                            .user = &o[i]};
        sampler_params_default(&r.sampling);
        r.sampling.temperature = 0;
        ok = engine_submit(e, &r, &err) > 0;
        if (!batched)
            while (ok && engine_has_work(e)) ok = engine_step(e, &err);
    }
    while (ok && engine_has_work(e)) ok = engine_step(e, &err);
    if (!ok) fprintf(stderr, "engine: %s\n", err.msg);
    engine_destroy(e);
    return ok;
}

static bool same(const out *a, const out *b) {
    return a->t.n == b->t.n && memcmp(a->t.ids, b->t.ids, (size_t)a->t.n * sizeof(int32_t)) == 0;
}

static void test_batching(model *m, model *plain, tok_vocab *v) {
    out alone[N_REQ], batched[N_REQ], tight[N_REQ], base[2];
    CHECK(run(m, v, 0, false, true, N_REQ, alone));
    CHECK(run(m, v, 0, true, true, N_REQ, batched));
    /* 10 blocks of 16 for four sequences of 64 positions: preemption by recompute */
    CHECK(run(m, v, 10, true, true, N_REQ, tight));
    for (int i = 0; i < N_REQ; i++) {
        CHECK(alone[i].t.n == N_GEN, "request %d generated %d", i, alone[i].t.n);
        CHECK(same(&alone[i], &batched[i]), "scale %g: batched differs from alone",
              (double)SCALES[i]);
        CHECK(same(&alone[i], &tight[i]), "scale %g: under preemption differs from alone",
              (double)SCALES[i]);
    }
    /* the adapter matters, and scale 0 is the plain model */
    CHECK(!same(&alone[0], &alone[1]) && !same(&alone[2], &alone[1]));
    CHECK(run(plain, v, 0, false, false, 2, base));
    CHECK(same(&alone[1], &base[1]), "scale 0 differs from the model without adapters");
    printf("lora: 4 scales alone = batched = under preemption; scale 0 = no adapter\n");
}

/* The same prompt under the adapter, without it, under it again and at
 * another scale: only the third reuses the first one's blocks. */
static void test_prefix_cache(model *m, tok_vocab *v) {
    kvl_error err = {{0}};
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    engine *e = engine_create(m, v, &c, &err);
    CHECK(e != NULL);
    if (!e) return;
    int32_t p[N_PROMPT];
    prompt_of(0, p);
    const float one = 1.0f, zero = 0.0f, half = 0.5f;
    const float *const scales[] = {&one, &zero, &one, &half, &zero};
    const int64_t want[] = {0, 0, 32, 0, 32};
    out o[5];
    memset(o, 0, sizeof o);
    for (int i = 0; i < 5; i++) {
        engine_request r = {.prompt = p,
                            .n_prompt = N_PROMPT,
                            .max_tokens = 4,
                            .ignore_eos = true,
                            .lora = scales[i],
                            .on_event = on_out,
                            .user = &o[i]};
        sampler_params_default(&r.sampling);
        r.sampling.temperature = 0;
        CHECK(engine_submit(e, &r, &err) > 0);
        while (engine_has_work(e)) engine_step(e, &err);
        CHECK(o[i].cached == want[i], "request %d (scale %g): %lld prompt tokens cached, want %lld",
              i, (double)*scales[i], (long long)o[i].cached, (long long)want[i]);
    }
    /* the chain salts every prefix-cache user shares (submit, /v1/kv/save, unpin): the
     * model's default (1 here) is the explicit 1; scale 0 is no adapter at all */
    char *def = engine_cache_salt(e, "t", NULL, NULL, NULL),
         *one_s = engine_cache_salt(e, "t", &one, NULL, NULL),
         *zero_s = engine_cache_salt(e, "t", &zero, NULL, NULL),
         *half_s = engine_cache_salt(e, "t", &half, NULL, NULL);
    CHECK(def && one_s && zero_s && half_s && !strcmp(def, one_s) && !strcmp(zero_s, "t") &&
          strcmp(half_s, one_s) && strcmp(half_s, zero_s));
    free(def), free(one_s), free(zero_s), free(half_s);
    /* a request's scales must be finite and need adapters */
    const float nan = 0.0f / 0.0f;
    engine_request bad = {.prompt = p, .n_prompt = N_PROMPT, .max_tokens = 1, .lora = &nan};
    sampler_params_default(&bad.sampling);
    CHECK(engine_submit(e, &bad, &err) < 0 && strstr(err.msg, "not finite"));
    engine_destroy(e);
    printf("lora: the prefix cache keys blocks by adapter and scale\n");
}

/* A refused adapter leaves no trace: the same logits before and after. */
static void test_refused(model *m) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(OTHER, &err);
    CHECK(f != NULL);
    const int before = model_lora_count(m);
    CHECK(model_lora_add(m, f, 1.0f, &err) < 0 && strstr(err.msg, "LoRA"), "%s", err.msg);
    CHECK(model_lora_count(m) == before);
}

int main(void) {
    tok_vocab *v, *v2;
    model *m = load_test_model(MODEL, 128, 64, &v);
    model *plain = load_test_model(MODEL, 128, 64, &v2);
    kvl_error err = {{0}};
    gguf_file *f = m ? gguf_open(ADAPTER, &err) : NULL;
    if (!m || !plain || !f || model_lora_add(m, f, 1.0f, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return 1;
    }
    test_refused(m);
    test_batching(m, plain, v);
    test_prefix_cache(m, v);
    model_destroy(m);
    model_destroy(plain);
    tok_vocab_destroy(v);
    tok_vocab_destroy(v2);
    return failures != 0;
}
