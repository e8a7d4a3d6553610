/* Constrained decoding: the token mask's cost per step on Qwen3's 151,669-token
 * vocabulary, against a decode step of a model, measured in the same run.
 *
 * Build (not part of the CMake build), from the repo root, after the build:
 *   gcc -std=gnu11 -O2 -Isrc/base -Isrc/gguf -Isrc/kernels -Isrc/tokenizer -Isrc/kv \
 *       -Isrc/model -Isrc/engine bench/bench_grammar.c build/libkvllm_engine.a \
 *       build/libkvllm_model.a build/libkvllm_kv.a build/libkvllm_kernels.a \
 *       build/libkvllm_tokenizer.a build/libkvllm_gguf.a build/libkvllm_base.a \
 *       -o build/bench_grammar -fopenmp -lcjson -lxxhash -lpcre2-8 -lpthread -lm
 * Run:   ./build/bench_grammar [reps]      (from the repo root)
 *
 * Figures:
 *  - compile: the first grammar for a vocabulary (builds its trie) and the next;
 *  - mask at fixed positions (mid-object: where a key or '}' may come;
 *    mid-string: inside a string value, where almost every token is allowed),
 *    first call (transitions not cached yet) and then the mean of `reps` calls;
 *  - a decode loop: a JSON document tokenized with Qwen3, and per token one
 *    mask and one accept, as the engine does (ms per token, cold caches
 *    included as they come);
 *  - a model's decode step (engine_step with one running sequence; greedy, no
 *    grammar) for stories260K and llama-2-tiny-random, and the same model's
 *    decode with a JSON-schema grammar on its own vocabulary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "grammar.h"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z0-9._]+@[a-z0-9]+\\\\.[a-z]{2,4}$\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"city\"],\"additionalProperties\":false},"
    "\"active\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";

static const char *DOC =
    "{\"name\": \"Ada Lovelace, Countess of Lovelace\", \"age\": 36, \"tags\": [\"mathematics\", \"poetry\", "
    "\"analytical engine\", \"Bernoulli numbers\"], \"email\": \"ada.lovelace@example.org\", "
    "\"address\": {\"street\": \"St James's Square 12\", \"city\": \"London\", \"zip\": \"12345\"}, \"active\": true}";

static grammar *schema_grammar(const tok_vocab *v) {
    kvl_buf b = {0};
    kvl_error err = {{0}};
    kvl_buf_puts(&b, "root ::= j-root\n");
    if (!json_schema_to_gbnf(SCHEMA, "j-", &b, &err)) {
        fprintf(stderr, "schema: %s\n", err.msg);
        exit(1);
    }
    grammar *g = grammar_compile(b.p, v, &err);
    if (!g) {
        fprintf(stderr, "compile: %s\n", err.msg);
        exit(1);
    }
    kvl_buf_free(&b);
    return g;
}

static tok_vocab *load_vocab(const char *path) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    gguf_close(f);
    if (!v) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        exit(1);
    }
    return v;
}

static void mask_at(grammar *g, int32_t V, uint32_t *mask, const char *prefix, int reps, const char *name) {
    grammar_state *st = grammar_state_new(g);
    if (!grammar_state_accept_bytes(st, prefix, strlen(prefix))) {
        fprintf(stderr, "prefix refused: %s\n", prefix);
        exit(1);
    }
    double t0 = kvl_time_s();
    int32_t n = grammar_state_mask(st, mask, V);
    double first = kvl_time_s() - t0;
    double sum = 0, best = 1e9;
    for (int r = 0; r < reps; r++) {
        t0 = kvl_time_s();
        n = grammar_state_mask(st, mask, V);
        double dt = kvl_time_s() - t0;
        sum += dt;
        if (dt < best) best = dt;
    }
    printf("  mask %-12s %7d tokens allowed   first %7.3f ms   again (same state, remembered) %5.1f us\n", name, n,
           first * 1e3, sum / reps * 1e6);
    (void)best;
    grammar_state_free(st);
}

/* ms per decode step of one greedy sequence of n tokens (after the first). */
static double decode_ms(const char *path, const char *schema_gbnf_for_vocab, int n, int32_t *n_vocab_out) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    model_params mp = {.max_ctx = 512, .max_ubatch = 32};
    model *m = v ? model_load(f, &mp, &err) : NULL;
    if (!m) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        exit(1);
    }
    *n_vocab_out = (int32_t)model_hp(m)->n_vocab;
    grammar *g = schema_gbnf_for_vocab ? schema_grammar(v) : NULL;
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 512;
    c.max_seqs = 1;
    engine *e = engine_create(m, v, &c, &err);
    int32_t prompt[4] = {1, 10, 20, 30};
    engine_request r = {.prompt = prompt, .n_prompt = 4, .max_tokens = n, .ignore_eos = true, .grammar = g};
    sampler_params_default(&r.sampling);
    r.sampling.temperature = g ? 1.0f : 0.0f; /* a grammar: sampled, so the document varies */
    engine_submit(e, &r, &err);
    engine_step(e, &err); /* prefill and the first token */
    int steps = 0;
    double t0 = kvl_time_s();
    while (engine_has_work(e)) {
        engine_step(e, &err);
        steps++;
    }
    double ms = (kvl_time_s() - t0) * 1e3 / (steps ? steps : 1);
    engine_destroy(e);
    grammar_free(g);
    model_destroy(m);
    tok_vocab_destroy(v);
    return ms;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    tok_vocab *v = load_vocab("tests/data/tokenizer/ggml-vocab-qwen3.gguf");
    const int32_t V = tok_n_vocab(v);
    printf("Qwen3 vocabulary: %d tokens\n", V);
    double t0 = kvl_time_s();
    grammar *g = schema_grammar(v);
    double t_first = kvl_time_s() - t0;
    t0 = kvl_time_s();
    grammar *g2 = schema_grammar(v);
    double t_next = kvl_time_s() - t0;
    grammar_free(g2);
    printf("  compile: first %.1f ms (builds the vocabulary trie), next %.2f ms\n", t_first * 1e3, t_next * 1e3);
    uint32_t *mask = malloc((size_t)(V + 31) / 32 * sizeof *mask);
    mask_at(g, V, mask, "", reps, "start");
    mask_at(g, V, mask, "{\"name\": \"Ada\", ", reps, "mid-object");
    mask_at(g, V, mask, "{\"name\": \"Ada Lov", reps, "mid-string");
    mask_at(g, V, mask, "{\"name\": \"Ada\", \"age\": 3", reps, "mid-number");

    /* the decode loop over a real document */
    int32_t ids[512];
    kvl_error err = {{0}};
    int64_t nt = tok_encode(v, DOC, strlen(DOC), false, false, ids, 512, &err);
    grammar_state *st = grammar_state_new(g);
    double tm = 0, worst = 0;
    for (int64_t i = 0; i < nt; i++) {
        double a = kvl_time_s();
        grammar_state_mask(st, mask, V);
        double dt = kvl_time_s() - a;
        tm += dt;
        if (dt > worst) worst = dt;
        if (!(mask[ids[i] >> 5] >> (ids[i] & 31) & 1) || !grammar_state_accept_token(st, ids[i])) {
            fprintf(stderr, "token %lld (%d) not allowed\n", (long long)i, ids[i]);
            return 1;
        }
    }
    printf("  decode loop: %lld tokens of a JSON document, mask %.3f ms per token (worst %.3f ms)\n", (long long)nt,
           tm * 1e3 / (double)nt, worst * 1e3);
    const double mask_ms = tm * 1e3 / (double)nt;
    grammar_state_free(st);
    grammar_free(g);
    free(mask);
    tok_vocab_destroy(v);

    static const char *models[] = {"models/stories260K.gguf", "tests/data/llama-2-tiny-random.gguf"};
    for (int i = 0; i < 2; i++) {
        int32_t mv;
        double plain = decode_ms(models[i], NULL, 128, &mv);
        double constrained = decode_ms(models[i], SCHEMA, 128, &mv);
        printf("%s (%d-token vocabulary): decode step %.3f ms; with the JSON-schema grammar %.3f ms\n", models[i], mv,
               plain, constrained);
        printf("  Qwen3-vocabulary mask / this decode step = %.2f\n", mask_ms / plain);
    }
    grammar_vocab_cache_trim();
    return 0;
}
