/* Batch invariance of the engine: greedy ids of each request are identical
 * whether it runs alone, batched with others, one token per step (a sequence
 * resumed across many steps), or preempted and recomputed under a tiny pool;
 * and whether the weights were repacked or, short of memory, left in the
 * file's layout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "test_model.h"

#include "check.h"

#define N_REQ 6
#define N_GEN 40

typedef struct collected {
    int32_t ids[N_GEN + 8];
    int n;
    bool done;
} collected;

static void on_event(const engine_event *ev, void *user) {
    collected *c = user;
    if (ev->token >= 0 && c->n < N_GEN + 8) c->ids[c->n++] = ev->token;
    if (ev->finish) c->done = true;
}

typedef struct setup {
    const char *name;
    int max_seqs;
    int64_t batch_tokens;
    int64_t kv_blocks;
    int kv_dtype;
    bool expect_preemption;
    bool twice;     /* run every request a second time after the first round (prefix cache) */
    bool no_prefix; /* disable the prefix cache */
} setup;

static bool run_setup(model *m, tok_vocab *v, const setup *s, int32_t prompts[N_REQ][48],
                      const int *lens, int only, collected out[N_REQ]) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    c.max_seqs = s->max_seqs;
    c.max_batch_tokens = s->batch_tokens;
    c.n_blocks = s->kv_blocks;
    c.kv_dtype = s->kv_dtype;
    c.prefix_cache = !s->no_prefix;
    kvl_error err;
    engine *e = engine_create(m, v, &c, &err);
    if (!e) {
        fprintf(stderr, "%s: %s\n", s->name, err.msg);
        return false;
    }
    for (int round = 0; round < (s->twice ? 2 : 1); round++)
        for (int i = 0; i < N_REQ; i++) {
            if (only >= 0 && i != only) continue;
            if (round == 1 && i == 0) { /* drain the first round so its blocks are cached */
                while (engine_has_work(e)) engine_step(e, &err);
            }
            memset(&out[i], 0, sizeof out[i]);
            engine_request r = {.prompt = prompts[i],
                                .n_prompt = lens[i],
                                .max_tokens = N_GEN,
                                .ignore_eos = true,
                                .on_event = on_event,
                                .user = &out[i]};
            sampler_params_default(&r.sampling);
            r.sampling.temperature = 0;
            if (engine_submit(e, &r, &err) < 0) {
                fprintf(stderr, "%s: submit: %s\n", s->name, err.msg);
                engine_destroy(e);
                return false;
            }
        }
    int steps = 0;
    while (engine_has_work(e) && steps++ < 100000)
        if (!engine_step(e, &err)) {
            fprintf(stderr, "%s: step: %s\n", s->name, err.msg);
            break;
        }
    engine_metrics mt = engine_get_metrics(e);
    if (s->expect_preemption && mt.n_preemptions == 0) {
        fprintf(stderr, "%s: expected preemptions, saw none\n", s->name);
        failures++;
    }
    if (s->twice && engine_prefix_cache_enabled(e) &&
        (mt.prefix_cache_hits == 0 || mt.kv_blocks_cached == 0)) {
        fprintf(stderr,
                "%s: expected prefix-cache hits and cached blocks (hits %lld, cached %lld)\n",
                s->name, (long long)mt.prefix_cache_hits, (long long)mt.kv_blocks_cached);
        failures++;
    }
    if (kv_pool_n_used(engine_kv(e)) != 0) {
        fprintf(stderr, "%s: %lld blocks still used after all requests finished\n", s->name,
                (long long)kv_pool_n_used(engine_kv(e)));
        failures++;
    }
    printf("  %-28s steps %5lld, preemptions %lld, prefix hits %lld/%lld tokens\n", s->name,
           (long long)mt.steps, (long long)mt.n_preemptions, (long long)mt.prefix_cache_hits,
           (long long)mt.prefix_cache_queries);
    engine_destroy(e);
    return true;
}

/* N_REQ prompts of 3 to 46 random ids (above the first three) from seed. */
static void random_prompts(int64_t n_vocab, unsigned seed, int32_t prompts[N_REQ][48],
                           int lens[N_REQ]) {
    srand(seed);
    for (int i = 0; i < N_REQ; i++) {
        lens[i] = 3 + (i * 11) % 44;
        for (int k = 0; k < lens[i]; k++) prompts[i][k] = 3 + rand() % (int)(n_vocab - 3);
    }
}

static void test_model(const char *path, int kv_dtype) {
    tok_vocab *v;
    model *m = load_test_model(path, 128, 32, &v);
    if (!m) {
        failures++;
        return;
    }
    printf("%s (kv %s)\n", path, gguf_dtype_name(kv_dtype));
    int32_t prompts[N_REQ][48];
    int lens[N_REQ];
    random_prompts(model_hp(m)->n_vocab, 7, prompts, lens);
    collected alone[N_REQ], got[N_REQ];
    setup solo = {"alone", 1, 2048, 0, kv_dtype, false, false, true};
    for (int i = 0; i < N_REQ; i++) run_setup(m, v, &solo, prompts, lens, i, alone);
    /* blocks for ~2 sequences of 64 tokens: forces preemption with 6 running */
    setup setups[] = {
        {"batched (6 at once)", 8, 2048, 0, kv_dtype, false, false, false},
        {"one token per step", 8, 1, 0, kv_dtype, false, false, false},
        {"budget 7, 3 seqs", 3, 7, 0, kv_dtype, false, false, false},
        {"tiny pool (preemption)", 8, 2048, 10, kv_dtype, true, false, false},
        {"prefix cache, second round", 8, 2048, 0, kv_dtype, false, true, false},
        {"tiny pool, no prefix cache", 8, 2048, 10, kv_dtype, true, false, true},
    };
    for (size_t k = 0; k < sizeof setups / sizeof setups[0]; k++) {
        if (!run_setup(m, v, &setups[k], prompts, lens, -1, got)) {
            failures++;
            continue;
        }
        for (int i = 0; i < N_REQ; i++)
            if (got[i].n != alone[i].n ||
                memcmp(got[i].ids, alone[i].ids, got[i].n * sizeof(int32_t))) {
                int j = 0;
                while (j < got[i].n && j < alone[i].n && got[i].ids[j] == alone[i].ids[j]) j++;
                fprintf(stderr,
                        "  %s: request %d differs from its solo run at token %d (n %d vs %d)\n",
                        setups[k].name, i, j, got[i].n, alone[i].n);
                failures++;
            }
    }
    model_destroy(m);
    tok_vocab_destroy(v);
}

/* Weights whose repacked copy does not fit in the memory the load may take
 * stay in the file's layout (where a container's limit would otherwise kill
 * the process partway through the load): none of them repacked with no room,
 * all at the bound, the dense matrices and as many layers' experts as fit a
 * byte below it; the model computes the same tokens in all three. */
static void test_repack_budget(const char *path) {
    enum { TIGHT, ROOMY, PARTIAL, N_LOADS };
    tok_vocab *v[N_LOADS + 1] = {0};
    model *ms[N_LOADS] = {load_test_model_mem(path, 128, 32, 1, &v[TIGHT]),
                          load_test_model_mem(path, 128, 32, 0, &v[ROOMY])};
    const int64_t need = ms[ROOMY] ? model_hp(ms[ROOMY])->repacked_bytes : 0;
    /* the bound: the copy plus the headroom (256 MiB at these sizes) */
    model *edge = load_test_model_mem(path, 128, 32, need + (256 << 20), &v[N_LOADS]);
    ms[PARTIAL] = load_test_model_mem(path, 128, 32, need + (256 << 20) - 1, &v[PARTIAL]);
    if (!ms[TIGHT] || !ms[ROOMY] || !ms[PARTIAL] || !edge) {
        failures++;
        return;
    }
    CHECK(need > 0, "%s: repacked with the system's memory", path);
    CHECK(model_hp(ms[TIGHT])->repacked_bytes == 0, "%s: %lld bytes repacked in 1 byte", path,
          (long long)model_hp(ms[TIGHT])->repacked_bytes);
    CHECK(model_hp(edge)->repacked_bytes == need, "%s: all repacked at the bound", path);
    const int64_t part = model_hp(ms[PARTIAL])->repacked_bytes;
    CHECK(part > 0 && part < need, "%s: %lld of %lld bytes repacked a byte below it", path,
          (long long)part, (long long)need);
    model_destroy(edge);
    tok_vocab_destroy(v[N_LOADS]);
    int32_t prompts[N_REQ][48];
    int lens[N_REQ];
    random_prompts(model_hp(ms[ROOMY])->n_vocab, 11, prompts, lens);
    collected out[N_LOADS][N_REQ];
    setup batched = {"repack budget", 8, 2048, 0, GGUF_DT_F16, false, false, true};
    bool ran = true;
    for (int k = 0; k < N_LOADS; k++)
        ran &= run_setup(ms[k], v[k], &batched, prompts, lens, -1, out[k]);
    for (int k = 0; ran && k < N_LOADS; k++)
        for (int i = 0; i < N_REQ; i++)
            CHECK(out[k][i].n == out[ROOMY][i].n &&
                      memcmp(out[k][i].ids, out[ROOMY][i].ids, out[k][i].n * sizeof(int32_t)) == 0,
                  "%s: request %d differs between load %d and the repacked one", path, i, k);
    CHECK(ran, "%s: the runs", path);
    for (int k = 0; k < N_LOADS; k++) {
        model_destroy(ms[k]);
        tok_vocab_destroy(v[k]);
    }
}

typedef struct shared_out {
    collected c;
    int64_t cached;
} shared_out;

static void on_event_shared(const engine_event *ev, void *user) {
    shared_out *o = user;
    on_event(ev, &o->c);
    if (ev->finish) o->cached = ev->stats->n_cached_prompt;
}

/* stories260K in an engine of 128 tokens of context (NULL, counted as a
 * failure, when it does not load). */
static engine *stories_engine(model **m, tok_vocab **v) {
    kvl_error err;
    *m = load_test_model("models/stories260K.gguf", 128, 64, v);
    if (!*m) {
        failures++;
        return NULL;
    }
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    engine *e = engine_create(*m, *v, &c, &err);
    if (!e) {
        fprintf(stderr, "engine: %s\n", err.msg);
        failures++;
        model_destroy(*m);
        tok_vocab_destroy(*v);
    }
    return e;
}

/* n > 1: followers of a prefix leader reuse its prompt blocks and still produce
 * exactly the leader's greedy ids. */
static void test_prefix_leader(void) {
    kvl_error err;
    tok_vocab *v;
    model *m;
    engine *e = stories_engine(&m, &v);
    if (!e) return;
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 10 + (i * 37) % 400;
    shared_out out[3];
    memset(out, 0, sizeof out);
    int64_t leader = 0;
    for (int i = 0; i < 3; i++) {
        engine_request r = {.prompt = prompt,
                            .n_prompt = 40,
                            .max_tokens = 20,
                            .ignore_eos = true,
                            .on_event = on_event_shared,
                            .user = &out[i],
                            .prefix_leader = leader};
        sampler_params_default(&r.sampling);
        r.sampling.temperature = 0;
        int64_t id = engine_submit(e, &r, &err);
        if (i == 0) leader = id;
    }
    while (engine_has_work(e)) engine_step(e, &err);
    for (int i = 1; i < 3; i++) {
        if (out[i].cached != 32 || out[i].c.n != out[0].c.n ||
            memcmp(out[i].c.ids, out[0].c.ids, out[0].c.n * sizeof(int32_t)) != 0) {
            fprintf(stderr,
                    "prefix leader: follower %d cached %lld prompt tokens (want 32) or differs\n",
                    i, (long long)out[i].cached);
            failures++;
        }
    }
    printf("prefix leader: followers reused %lld and %lld prompt tokens\n",
           (long long)out[1].cached, (long long)out[2].cached);
    engine_destroy(e);
    model_destroy(m);
    tok_vocab_destroy(v);
}

/* The first token and its top 20 alternatives of one greedy request. */
typedef struct first_out {
    int32_t tok, top[20];
    int n_top;
} first_out;

static void on_event_first(const engine_event *ev, void *user) {
    first_out *o = user;
    if (ev->token < 0 || o->tok >= 0) return;
    o->tok = ev->token;
    o->n_top = ev->n_top;
    memcpy(o->top, ev->top_ids, (size_t)ev->n_top * sizeof *o->top);
}

static first_out first_token(engine *e, const int32_t *prompt, int n, const engine_logit_bias *b,
                             int nb, float presence, int32_t last_n, bool penalize_prompt) {
    first_out o = {.tok = -1};
    engine_request r = {.prompt = prompt,
                        .n_prompt = n,
                        .max_tokens = 1,
                        .ignore_eos = true,
                        .top_logprobs = 20,
                        .logit_bias = b,
                        .n_logit_bias = nb,
                        .penalize_prompt = penalize_prompt,
                        .on_event = on_event_first,
                        .user = &o};
    sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    r.sampling.presence_penalty = presence;
    r.sampling.penalty_last_n = last_n;
    kvl_error err;
    if (engine_submit(e, &r, &err) < 0) fprintf(stderr, "first token: %s\n", err.msg);
    while (engine_has_work(e)) engine_step(e, &err);
    return o;
}

static bool in_ids(int32_t t, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] == t) return true;
    return false;
}

/* Logit biases and llama-server's penalty window, predicted from the
 * unbiased request's own ranking (top_logprobs are the model's, before any
 * bias): a banned top token gives way to the second, a +50 bias makes the
 * 6th the choice, and a presence penalty of 1000 over the prompt's last n
 * tokens picks the best-ranked token outside them (none without
 * penalize_prompt: the history is empty at the first token). */
static void test_logit_bias(void) {
    kvl_error err;
    tok_vocab *v;
    model *m;
    engine *e = stories_engine(&m, &v);
    if (!e) return;
    /* a prompt whose greedy token is in it, but not among its last 2 tokens */
    static const char *const texts[] = {
        "One day, a little girl named Lily went to the park. She saw a big tree. She",
        "Tom had a red ball. He liked to play with his ball. One day, Tom",
        "Lily and Tom were friends. They liked to play. Lily said to Tom, \"Let's",
        "The sun was hot. The dog was hot too. The dog",
    };
    int32_t prompt[64];
    int n = 0;
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        n = (int)tok_encode(v, texts[k], strlen(texts[k]), true, false, prompt, 64, &err);
        first_out o = first_token(e, prompt, n, NULL, 0, 0, -1, false);
        if (n > 2 && in_ids(o.tok, prompt, n - 2) && !in_ids(o.tok, prompt + n - 2, 2)) break;
        n = 0;
    }
    if (n == 0) {
        fprintf(stderr, "logit bias: no prompt has its greedy token early in it\n");
        failures++;
        n = 3;
    }
    first_out base = first_token(e, prompt, n, NULL, 0, 0, -1, false);
    int bad = base.tok < 0 || base.n_top < 20 || base.top[0] != base.tok;
    engine_logit_bias ban = {base.tok, -INFINITY}, lift = {base.top[5], 50.0f};
    bad += first_token(e, prompt, n, &ban, 1, 0, -1, false).tok != base.top[1];
    bad += first_token(e, prompt, n, &lift, 1, 0, -1, false).tok != base.top[5];
    bad += first_token(e, prompt, n, NULL, 0, 1000, -1, false).tok != base.tok;
    for (int last_n = 2; last_n <= n; last_n += n - 2) {
        int32_t want = -1;
        for (int k = 0; k < base.n_top && want < 0; k++)
            if (!in_ids(base.top[k], prompt + n - last_n, last_n)) want = base.top[k];
        int32_t got = first_token(e, prompt, n, NULL, 0, 1000, last_n, true).tok;
        if (got != want) {
            fprintf(stderr, "penalty window %d: token %d, want %d\n", last_n, got, want);
            bad++;
        }
    }
    if (bad) {
        fprintf(stderr, "logit bias / penalty window: %d wrong first tokens\n", bad);
        failures++;
    }
    printf("logit bias and penalty window: %s (first token %d)\n", bad ? "FAIL" : "ok", base.tok);
    engine_destroy(e);
    model_destroy(m);
    tok_vocab_destroy(v);
}

/* A grammar constrains sampled and greedy decoding alike, and survives
 * preemption by recompute: the same requests under a pool too small for them
 * all give the same ids as each alone, and every output is a sentence. */
static void test_grammar_preemption(void) {
    kvl_error err = {{0}};
    tok_vocab *v;
    model *m = load_test_model("models/stories260K.gguf", 128, 32, &v);
    grammar *g =
        m ? grammar_compile("root ::= \"[\" [a-z ]{20,40} (\",\" [0-9]{1,3}){3,6} \"]\"", v, &err)
          : NULL;
    if (!g) {
        fprintf(stderr, "grammar preemption: %s\n", m ? err.msg : "no model");
        failures++;
        model_destroy(m);
        tok_vocab_destroy(v);
        return;
    }
    enum { NR = 6 };
    static text_out alone[NR], together[NR];
    int32_t prompt[4] = {1, 400, 300, 200};
    for (int round = 0; round < 2; round++) {
        engine_config c;
        engine_config_default(&c);
        c.n_ctx = 128;
        c.max_seqs = 8;
        c.n_blocks = round == 0 ? 0 : 10; /* 160 tokens for 6 requests of ~60: preemption */
        text_out *out = round == 0 ? alone : together;
        for (int i = 0; i < NR; i++) {
            engine *e = round == 0 || i == 0 ? engine_create(m, v, &c, &err) : NULL;
            static engine *shared;
            if (e) shared = e;
            engine_request r = {.prompt = prompt,
                                .n_prompt = 4,
                                .max_tokens = 100,
                                .grammar = g,
                                .on_event = on_text_event,
                                .user = &out[i]};
            sampler_params_default(&r.sampling);
            r.sampling.temperature = i % 3 == 0 ? 0.0f : 1.0f; /* greedy and sampled */
            r.sampling.top_k = 0;
            r.sampling.top_p = 1.0f;
            r.sampling.min_p = 0.0f;
            r.sampling.seed = 100 + (uint64_t)i;
            memset(&out[i], 0, sizeof out[i]);
            if (engine_submit(shared, &r, &err) < 0) {
                fprintf(stderr, "grammar preemption: submit: %s\n", err.msg);
                failures++;
            }
            if (round == 0 || i == NR - 1) {
                while (engine_has_work(shared)) engine_step(shared, &err);
                engine_metrics mt = engine_get_metrics(shared);
                if (round == 1 && mt.n_preemptions == 0) {
                    fprintf(stderr, "grammar preemption: expected preemptions, saw none\n");
                    failures++;
                }
                engine_destroy(shared);
            }
        }
    }
    for (int i = 0; i < NR; i++) {
        if (alone[i].finish != ENGINE_FINISH_STOP ||
            !grammar_match_text(g, alone[i].text, alone[i].len)) {
            fprintf(stderr, "grammar preemption: request %d (finish %d) is not a sentence: %.*s\n",
                    i, alone[i].finish, (int)alone[i].len, alone[i].text);
            failures++;
        }
        if (together[i].n != alone[i].n ||
            memcmp(together[i].ids, alone[i].ids, (size_t)alone[i].n * sizeof(int32_t))) {
            fprintf(stderr, "grammar preemption: request %d differs after preemption\n", i);
            failures++;
        }
    }
    printf("  grammar: %d constrained requests alike alone and preempted, e.g. %.*s\n", NR,
           (int)alone[1].len, alone[1].text);
    grammar_free(g);
    model_destroy(m);
    tok_vocab_destroy(v);
    grammar_vocab_cache_trim();
}

typedef struct err_out {
    engine_finish finish;
    char msg[256];
    int n_tokens;
} err_out;

static void on_err_event(const engine_event *ev, void *user) {
    err_out *o = user;
    if (ev->token >= 0) o->n_tokens++;
    if (ev->finish) {
        o->finish = ev->finish;
        snprintf(o->msg, sizeof o->msg, "%s", ev->error ? ev->error : "");
    }
}

/* A grammar past the matcher's bounds (grammar.h) ends its request with
 * ENGINE_FINISH_ERROR and the reason, never a silent stop; the request beside
 * it finishes as usual. r owes one of two letters per character read: 3 * 2^n
 * parse stacks after n bytes, over 4,096 by the 11th byte of output (or of a
 * token the mask looks at), whatever the model picks. */
static void test_grammar_bound(void) {
    kvl_error err = {{0}};
    tok_vocab *v;
    model *m = load_test_model("models/stories260K.gguf", 128, 32, &v);
    grammar *bad =
        m ? grammar_compile("root ::= r\nr ::= [^\\x00] r [a-m] | [^\\x00] r [n-z]\n", v, &err)
          : NULL;
    grammar *good = bad ? grammar_compile("root ::= [a-z ]{5,20} \".\"", v, &err) : NULL;
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    engine *e = good ? engine_create(m, v, &c, &err) : NULL;
    if (!e) {
        fprintf(stderr, "grammar bound: %s\n", m ? err.msg : "no model");
        failures++;
    } else {
        int32_t prompt[4] = {1, 400, 300, 200};
        err_out out[2] = {{0}};
        for (int i = 0; i < 2; i++) {
            engine_request r = {.prompt = prompt,
                                .n_prompt = 4,
                                .max_tokens = 100,
                                .grammar = i == 0 ? bad : good,
                                .on_event = on_err_event,
                                .user = &out[i]};
            sampler_params_default(&r.sampling);
            r.sampling.temperature = 0;
            if (engine_submit(e, &r, &err) < 0) {
                fprintf(stderr, "grammar bound: submit: %s\n", err.msg);
                failures++;
            }
        }
        for (int steps = 0; engine_has_work(e) && steps < 1000; steps++)
            if (!engine_step(e, &err)) break;
        if (out[0].finish != ENGINE_FINISH_ERROR ||
            !strstr(out[0].msg, "grammar too ambiguous: more than 4096 parse stacks")) {
            fprintf(stderr, "grammar bound: finish %d '%s' (expected the error)\n", out[0].finish,
                    out[0].msg);
            failures++;
        }
        if (out[1].finish != ENGINE_FINISH_STOP || out[1].n_tokens == 0) {
            fprintf(stderr, "grammar bound: the other request: finish %d after %d tokens\n",
                    out[1].finish, out[1].n_tokens);
            failures++;
        }
        printf("  grammar bound: ended with '%s' after %d tokens; the other request %d tokens\n",
               out[0].msg, out[0].n_tokens, out[1].n_tokens);
        engine_destroy(e);
    }
    grammar_free(bad);
    grammar_free(good);
    model_destroy(m);
    tok_vocab_destroy(v);
    grammar_vocab_cache_trim();
}

typedef struct last_logits {
    int64_t want;
    float *out;
    int64_t n_vocab;
} last_logits;

static void keep_last(int64_t pos, const float *logits, void *user) {
    last_logits *l = user;
    if (pos == l->want) memcpy(l->out, logits, (size_t)l->n_vocab * sizeof(float));
}

/* engine_embed: the pooled final hidden state, L2-normalised. Checked against
 * the LM head: with the output matrix W read from the file, W . embedding
 * must be the logits engine_eval computes at the last position divided by one
 * constant (the hidden state's norm). Mean pooling differs from last; the
 * pool gets every block back; bad ids are refused. */
static void test_embed(void) {
    kvl_error err = {{0}};
    tok_vocab *v;
    model *m = load_test_model("models/stories260K.gguf", 128, 16, &v);
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    engine *e = m ? engine_create(m, v, &c, &err) : NULL;
    const gguf_tensor *w = m ? gguf_find_tensor(model_gguf(m), "output.weight") : NULL;
    if (!e || !w || w->dtype != GGUF_DT_F32) {
        fprintf(stderr, "embed: setup failed: %s\n", err.msg);
        failures++;
        return;
    }
    const int64_t E = model_hp(m)->n_embd, V = model_hp(m)->n_vocab,
                  n = 40; /* 40: chunks and ubatches split it */
    int32_t ids[40];
    for (int i = 0; i < n; i++) ids[i] = 10 + (i * 53) % 400;
    float *last = malloc(E * sizeof(float)), *mean = malloc(E * sizeof(float)),
          *again = malloc(E * sizeof(float));
    float *logits = malloc(V * sizeof(float));
    int64_t free0 = kv_pool_n_free(engine_kv(e));
    bool ok = engine_embed(e, ids, n, ENGINE_POOL_LAST, 2, NULL, last, &err) &&
              engine_embed(e, ids, n, ENGINE_POOL_MEAN, 2, NULL, mean, &err) &&
              engine_embed(e, ids, n, ENGINE_POOL_LAST, 2, NULL, again, &err);
    last_logits ll = {.want = n - 1, .out = logits, .n_vocab = V};
    ok = ok && engine_eval(m, GGUF_DT_F16, -1, 16, ids, n, keep_last, &ll, &err);
    if (!ok) {
        fprintf(stderr, "embed: %s\n", err.msg);
        failures++;
    } else {
        double nl = 0, nm = 0, diff = 0, ratio = 0, worst = 0;
        for (int64_t k = 0; k < E; k++) {
            nl += (double)last[k] * last[k];
            nm += (double)mean[k] * mean[k];
            diff += fabs((double)last[k] - mean[k]);
        }
        const float *W = w->data; /* [V][E] */
        for (int64_t t = 0; t < V; t++) {
            double dot = 0;
            for (int64_t k = 0; k < E; k++) dot += (double)W[t * E + k] * last[k];
            if (t == 0) ratio = logits[0] / dot;
            double err_t = fabs(logits[t] - ratio * dot) / (1.0 + fabs(logits[t]));
            if (err_t > worst) worst = err_t;
        }
        if (fabs(nl - 1) > 1e-5 || fabs(nm - 1) > 1e-5 || diff < 1e-3 || worst > 1e-3 ||
            !(ratio > 0) || memcmp(last, again, E * sizeof(float)) != 0 ||
            kv_pool_n_free(engine_kv(e)) != free0) {
            fprintf(
                stderr,
                "embed: norms %g %g, last-mean %g, logits vs W.h worst %g (ratio %g), repeat %s, "
                "free blocks %lld -> %lld\n",
                nl, nm, diff, worst, ratio,
                memcmp(last, again, E * sizeof(float)) ? "differs" : "same", (long long)free0,
                (long long)kv_pool_n_free(engine_kv(e)));
            failures++;
        }
    }
    int32_t bad = (int32_t)V;
    if (engine_embed(e, &bad, 1, ENGINE_POOL_LAST, 2, NULL, last, &err) ||
        engine_embed(e, ids, 0, ENGINE_POOL_LAST, 2, NULL, last, &err)) {
        fprintf(stderr, "embed: a bad id or an empty input was accepted\n");
        failures++;
    }
    free(last);
    free(mean);
    free(again);
    free(logits);
    engine_destroy(e);
    model_destroy(m);
    tok_vocab_destroy(v);
}

int main(void) {
    test_grammar_preemption();
    test_grammar_bound();
    test_embed();
    test_prefix_leader();
    test_logit_bias();
    test_repack_budget("tests/data/golden/models/llama-gqa-bpe-q4_k_m.gguf");
    test_repack_budget("tests/data/golden/models/qwen3moe-q8_0.gguf"); /* the experts too */
    test_model("models/stories260K.gguf", GGUF_DT_F16);
    test_model("tests/data/golden/models/llama-gqa-bpe-q8_0.gguf", GGUF_DT_F32);
    test_model("tests/data/golden/models/qwen3-f32.gguf", GGUF_DT_F16);
    test_model("tests/data/golden/models/gemma3-swa-f32.gguf", GGUF_DT_F16);    /* sliding window */
    test_model("tests/data/golden/models/deepseek2-mla-f32.gguf", GGUF_DT_F32); /* MLA */
    /* mixture of experts: tokens grouped by expert, q8_0 experts, sigmoid group routing + shared expert */
    test_model("tests/data/golden/models/qwen3moe-q8_0.gguf", GGUF_DT_F16);
    test_model("tests/data/golden/models/deepseek2-moe-f32.gguf", GGUF_DT_F16);
    test_model("tests/data/golden/models/llama-moe-f32.gguf", GGUF_DT_F16);
    /* gpt-oss: attention sinks, sliding window, MXFP4 experts with biases */
    test_model("tests/data/golden/models/gpt-oss-mxfp4.gguf", GGUF_DT_F16);
    test_model("tests/data/golden/models/llama4-f32.gguf", GGUF_DT_F16); /* input-weighted */
    printf("test_engine: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
