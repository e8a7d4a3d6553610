/* Speculative decoding by prompt lookup: the proposer on hand-checked cases,
 * then the engine's output with --spec ngram against plain decoding, which
 * must be identical id for id and byte for byte: greedy and sampled (the
 * sampler draws once per token in either mode, so a seed gives the same
 * stream), alone, batched, under preemption (a tiny pool), with prefix-cache
 * hits, stop strings and max_tokens, on a sliding-window model (two KV
 * groups) and with a request that opts out. Every setup must also have
 * drafted, accepted and rejected tokens, so both sides of the rollback ran. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kvl_pool.h"
#include "spec.h"
#include "test_model.h"

#include "check.h"

static void test_propose(void) {
    int32_t out[8];
    int g;
    /* "a b c d a b" -> the last "a b" was seen followed by "c d a b" */
    const int32_t t1[] = {1, 2, 3, 4, 1, 2};
    CHECK(spec_ngram_propose(t1, 6, 3, 4, out, &g) == 4 && out[0] == 3 && out[1] == 4 &&
          out[2] == 1 && out[3] == 2 && g == 2);
    CHECK(spec_ngram_propose(t1, 6, 3, 2, out, &g) == 2 && out[0] == 3 && out[1] == 4);
    /* the most recent earlier occurrence wins: "5 1 9 1 7 1" -> after the last 1 comes 7 */
    const int32_t t2[] = {5, 1, 9, 1, 7, 1};
    CHECK(spec_ngram_propose(t2, 6, 3, 3, out, &g) == 2 && out[0] == 7 && out[1] == 1 && g == 1);
    /* the longest n-gram first: "1 2 x 2 y 1 2" -> "1 2" matched (x), not "2" (y) */
    const int32_t t3[] = {1, 2, 8, 2, 9, 1, 2};
    CHECK(spec_ngram_propose(t3, 7, 2, 1, out, &g) == 1 && out[0] == 8 && g == 2);
    CHECK(spec_ngram_propose(t3, 7, 1, 1, out, &g) == 1 && out[0] == 9 && g == 1);
    /* a draft stops at the end of the text; nothing when nothing matches */
    const int32_t t4[] = {4, 4};
    CHECK(spec_ngram_propose(t4, 2, 3, 5, out, &g) == 1 && out[0] == 4);
    const int32_t t5[] = {1, 2, 3};
    CHECK(spec_ngram_propose(t5, 3, 3, 4, out, &g) == 0 && g == 0 &&
          spec_ngram_propose(t5, 1, 3, 4, out, &g) == 0);
}

/* The index gives what the scan gives (the scan is the reference: it reads
 * the definition directly), call after call as a text grows, over alphabets
 * from 2 symbols (everything matches, long chains in the tables) to 200
 * (little does), for every n-gram length, through the tables' growth, and
 * again after the text is replaced by a shorter one (rebuilt). */
static void test_ngram_index(void) {
    enum { LEN = 700 };
    static int32_t text[LEN];
    uint32_t rng = 12345;
    const int alphabets[] = {2, 5, 30, 200};
    int compared = 0, matched_some = 0, matched_none = 0;
    for (int ai = 0; ai < 4; ai++) {
        for (int ngram = 1; ngram <= SPEC_NGRAM_MAX; ngram++) {
            spec_ngram_index *x = spec_ngram_index_create(ngram);
            CHECK(x != NULL);
            if (!x) return;
            for (int pass = 0; pass < 2; pass++) {
                const int len = pass ? LEN / 3 : LEN;
                for (int i = 0; i < len; i++) {
                    rng = rng * 1664525u + 1013904223u;
                    /* runs of repeats now and then, so that long matches occur */
                    text[i] = i > 8 && (rng >> 28) < 6 ? text[i - 7]
                                                       : (int32_t)((rng >> 8) % alphabets[ai]);
                }
                for (int n = 0; n <= len; n++) {
                    const int k = 1 + n % 5;
                    int32_t a[8] = {0}, b[8] = {0};
                    int ga = -1, gb = -2;
                    const int ma = spec_ngram_propose(text, n, ngram, k, a, &ga);
                    const int mb = spec_ngram_index_propose(x, text, n, k, b, &gb);
                    CHECK(ma == mb && ga == gb && memcmp(a, b, sizeof a) == 0);
                    if (ma != mb || ga != gb || memcmp(a, b, sizeof a) != 0) {
                        printf("  index differs: alphabet %d ngram %d n %d: %d/%d vs %d/%d\n",
                               alphabets[ai], ngram, n, ma, ga, mb, gb);
                        break;
                    }
                    compared++;
                    matched_some += ga > 1;
                    matched_none += ma == 0 && n > 1;
                }
            }
            spec_ngram_index_destroy(x);
        }
    }
    CHECK(compared > 10000 && matched_some > 1000 && matched_none > 100);
    CHECK(spec_ngram_index_create(0) == NULL &&
          spec_ngram_index_create(SPEC_NGRAM_MAX + 1) == NULL);
}

static bool near(double a, double b) { return a > b - 1e-9 && a < b + 1e-9; }

/* The cost model and the choice of k, against figures worked out by hand:
 * with acceptance p and cost c(n), k drafts give (1 + p + ... + p^k) tokens
 * for c(1 + k), and k is the best of these (0 when none beats plain decoding
 * by 5%). */
static void test_adapt(void) {
    spec_cost c;
    spec_cost_init(&c);
    CHECK(near(spec_cost_at(&c, 1), 1.0) && near(spec_cost_at(&c, 3), 1.1)); /* the prior slope */
    for (int r = 0; r < 3; r++) {
        spec_cost_observe(&c, 1, 1.0);
        spec_cost_observe(&c, 5, r == 0 ? 9.0 : 2.0); /* the first three: their minimum */
    }
    spec_cost_observe(&c, 9, 50.0); /* measured once: not trusted yet */
    spec_cost_observe(&c, 9, 50.0);
    CHECK(near(spec_cost_at(&c, 5), 2.0) && near(spec_cost_at(&c, 3), 1.5));
    CHECK(near(spec_cost_at(&c, 7), 2.0 * 1.1) && near(spec_cost_at(&c, 9), 2.0 * 1.2));
    spec_cost_observe(&c, 5, 2.8); /* an average that follows: 2 + (2.8 - 2) / 8 */
    CHECK(near(spec_cost_at(&c, 5), 2.1));
    spec_cost_observe(&c, 5, 100.0); /* counted as 1.5 x 2.1 at most: 2.1 + 1.05 / 8 */
    CHECK(near(spec_cost_at(&c, 5), 2.1 + 1.05 / 8));
    /* the one-token cost doubles (a longer context, a busier machine): sizes measured
     * before count double too, so that a larger step does not look cheap for having
     * been measured earlier; a new measurement of 5 is taken as it is */
    spec_cost g;
    spec_cost_init(&g);
    for (int r = 0; r < 3; r++) {
        spec_cost_observe(&g, 1, 1.0);
        spec_cost_observe(&g, 2, 1.2);
        spec_cost_observe(&g, 5, 2.0);
    }
    for (int r = 0; r < 200; r++) spec_cost_observe(&g, 1, 2.0);
    const double g1 = spec_cost_at(&g, 1);
    CHECK(g1 > 1.99 && g1 < 2.0);
    CHECK(near(spec_cost_at(&g, 2), 1.2 * g1) && near(spec_cost_at(&g, 5), 2.0 * g1) &&
          near(spec_cost_at(&g, 4), (1.2 + 0.8 * 2.0 / 3.0) * g1) &&
          near(spec_cost_at(&g, 7), 2.0 * g1 * 1.1));
    spec_cost_observe(&g, 5, 4.4); /* 4 + (4.4 - 4) / 8 */
    CHECK(near(spec_cost_at(&g, 5), 2.0 * g1 + (4.4 - 2.0 * g1) / 8));

    /* flat cost: a long match (prior p = 1.5 / 2.5 = 0.6) drafts all it has */
    spec_cost flat;
    spec_cost_init(&flat);
    for (int n = 1; n <= 5; n++)
        for (int r = 0; r < 3; r++) spec_cost_observe(&flat, n, 1.0);
    spec_adapt a;
    spec_adapt_init(&a);
    CHECK(spec_adapt_choose(&a, &flat, 1, 4, 3, false) == 4);
    /* c(n) = 1 + 0.25 (n - 1), p = 0.6: k = 1: 1.6 / 1.25 = 1.28, k = 2: 1.96 / 1.5 = 1.307,
     * k = 3: 2.176 / 1.75 = 1.243 -> 2 */
    spec_cost mid;
    spec_cost_init(&mid);
    for (int n = 1; n <= 8; n++)
        for (int r = 0; r < 3; r++) spec_cost_observe(&mid, n, 1.0 + 0.25 * (n - 1));
    CHECK(spec_adapt_choose(&a, &mid, 1, 4, 5, false) == 2);
    /* a one-token match (prior p = 1/3): 1.333 / 1.25 = 1.067 > 1.05, 1.444 / 1.5 < 1 -> 1 */
    CHECK(spec_adapt_choose(&a, &mid, 1, 4, 1, false) == 1);
    /* rejections bring p down (acc 0, rej 1 / (1 - 0.85) at most: p ~ 0.16) until drafting
     * does not pay; then a one-draft probe at once, and after 8, 16, 32 plain steps */
    CHECK(spec_adapt_choose(&a, &mid, 1, 4, 3, false) == 2);
    for (int i = 0; i < 30; i++) spec_adapt_update(&a, 2, 0);
    int probes[4], n_probes = 0, steps = 0;
    for (steps = 0; steps < 100 && n_probes < 4; steps++) {
        int k = spec_adapt_choose(&a, &mid, 1, 4, 3, false);
        CHECK(k == 0 || k == 1);
        if (k == 1) {
            probes[n_probes++] = steps;
            spec_adapt_update(&a, 1, 0);
        }
    }
    CHECK(n_probes == 4);
    if (n_probes == 4) {
        CHECK(probes[1] - probes[0] == 9 && probes[2] - probes[1] == 17 &&
              probes[3] - probes[2] == 33);
    }
    /* other classes keep their own estimate: a 2-gram match (p = 1/2) still drafts:
     * 1.5 / 1.25 = 1.2, 1.75 / 1.5 = 1.167 -> 1 */
    CHECK(spec_adapt_choose(&a, &mid, 1, 4, 2, false) == 1);
    /* in a step of 8 tokens one sequence's drafts must pay for the whole step's growth:
     * 8.6 / c(9) = 8.6 / 3 < 1.05 x 8 / 2.75 -> none (after the first probe) */
    spec_cost big = mid;
    for (int n = 9; n <= 12; n++)
        for (int r = 0; r < 3; r++) spec_cost_observe(&big, n, 1.0 + 0.25 * (n - 1));
    spec_adapt b;
    spec_adapt_init(&b);
    CHECK(spec_adapt_choose(&b, &big, 8, 4, 3, false) == 1);
    CHECK(spec_adapt_choose(&b, &big, 8, 4, 3, false) == 0);
    /* a draft model's drafts also cost their draft positions: at 0.5 per draft, k = 1 gives
     * 1.6 / 1.75 < 1: none after the probe */
    spec_cost dm = mid;
    spec_cost_observe_draft(&dm, 2, 1.0);
    spec_adapt d;
    spec_adapt_init(&d);
    CHECK(spec_adapt_choose(&d, &dm, 1, 4, 0, true) == 1);
    CHECK(spec_adapt_choose(&d, &dm, 1, 4, 0, true) == 0);
    CHECK(spec_adapt_choose(&d, &mid, 1, 4, 0, true) == 2); /* drafting free: as for a 3-gram */
    /* every 16th choice that drafts fewer than it could takes one more */
    spec_adapt x;
    spec_adapt_init(&x);
    int got3 = 0;
    for (int i = 1; i <= 32; i++) {
        int k = spec_adapt_choose(&x, &mid, 1, 4, 3, false);
        CHECK(k == (i % 16 == 0 ? 3 : 2));
        got3 += k == 3;
    }
    CHECK(got3 == 2);
}

enum { NR = 6 };

typedef struct req_set {
    int32_t prompt[NR][160];
    int len[NR];
    int max_tokens[NR];
    float temp[NR];
    const char *stop[NR];
    bool opt_out[NR];
} req_set;

typedef struct setup {
    const char *name;
    int max_seqs;
    int64_t batch_tokens, kv_blocks;
    bool twice; /* every request again after the first round: prefix-cache hits */
    bool fixed; /* spec_fixed: every proposal verified whole */
} setup;

static bool prefix_enabled; /* of the last run's engine */

static model *draft_model; /* for ENGINE_SPEC_DRAFT */
static bool spec_fixed;    /* always spec_k drafts, whatever they cost */

static engine_metrics run(model *m, tok_vocab *v, const setup *su, const req_set *rs,
                          engine_spec_mode spec, int only, text_out out[NR]) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 256;
    c.max_seqs = su->max_seqs;
    c.max_batch_tokens = su->batch_tokens;
    c.n_blocks = su->kv_blocks;
    c.spec = spec;
    c.draft_model = draft_model;
    c.spec_fixed = spec_fixed || su->fixed;
    kvl_error err = {{0}};
    engine *e = engine_create(m, v, &c, &err);
    engine_metrics mt = {0};
    if (!e) {
        fprintf(stderr, "%s: %s\n", su->name, err.msg);
        failures++;
        return mt;
    }
    for (int round = 0; round < (su->twice ? 2 : 1); round++) {
        for (int i = 0; i < NR; i++) {
            if (only >= 0 && i != only) continue;
            memset(&out[i], 0, sizeof out[i]);
            engine_request r = {.prompt = rs->prompt[i],
                                .n_prompt = rs->len[i],
                                .max_tokens = rs->max_tokens[i],
                                .stop = &rs->stop[i],
                                .n_stop = rs->stop[i] ? 1 : 0,
                                .no_speculative = rs->opt_out[i],
                                .on_event = on_text_event,
                                .user = &out[i]};
            sampler_params_default(&r.sampling);
            r.sampling.temperature = rs->temp[i];
            r.sampling.seed = 1000 + (uint64_t)i;
            if (engine_submit(e, &r, &err) < 0) {
                fprintf(stderr, "%s: submit: %s\n", su->name, err.msg);
                failures++;
            }
        }
        int steps = 0;
        while (engine_has_work(e) && steps++ < 100000)
            if (!engine_step(e, &err)) {
                fprintf(stderr, "%s: step: %s\n", su->name, err.msg);
                failures++;
                break;
            }
    }
    mt = engine_get_metrics(e);
    prefix_enabled = engine_prefix_cache_enabled(e);
    for (int g = 0; g < engine_kv_n_groups(e); g++) {
        kvl_error ce = {{0}};
        if (kv_pool_n_used(engine_kv_group(e, g)) != 0 ||
            !kv_pool_check(engine_kv_group(e, g), &ce)) {
            fprintf(stderr, "%s: pool %d: %lld blocks still used, check: %s\n", su->name, g,
                    (long long)kv_pool_n_used(engine_kv_group(e, g)), ce.msg);
            failures++;
        }
    }
    engine_destroy(e);
    return mt;
}

static bool same(const text_out *a, const text_out *b) {
    return a->n == b->n && memcmp(a->ids, b->ids, (size_t)a->n * sizeof(int32_t)) == 0 &&
           a->len == b->len && memcmp(a->text, b->text, a->len) == 0 && a->finish == b->finish;
}

static void compare_model(const char *path, bool story) {
    kvl_error err = {{0}};
    tok_vocab *v;
    model *m = load_test_model(path, 256, 32, &v);
    if (!m) {
        failures++;
        return;
    }
    static req_set rs;
    memset(&rs, 0, sizeof rs);
    static const char *stories[NR] = {
        "Lily had a red ball. She liked to play with her red ball in the park. One day, Lily lost "
        "her red ball "
        "in the park. She was sad. Lily had a red ball.",
        "Once upon a time, there was a little boy named Tim. Tim had a big dog. The dog was named "
        "Max. Tim and "
        "Max liked to run. Once upon a time, there was a little boy named Tim.",
        "The cat sat on the mat. The dog sat on the mat. The bird sat on the",
        "Sue went to the store. She bought an apple. Sue went to the store again. She bought",
        "Once upon a time",
        "Tom and Sam were friends. They played every day. Tom said, \"Let's play ball!\" Sam said, "
        "\"Yes!\" Tom and Sam",
    };
    srand(11);
    for (int i = 0; i < NR; i++) {
        if (story) {
            int64_t n =
                tok_encode(v, stories[i], strlen(stories[i]), true, false, rs.prompt[i], 160, &err);
            rs.len[i] = n > 0 && n <= 160 ? (int)n : 1;
        } else { /* a random sequence said twice: lookup proposes its second half */
            int half = 5 + i * 7;
            for (int k = 0; k < half; k++)
                rs.prompt[i][k] = rs.prompt[i][half + k] = 3 + rand() % 200;
            rs.len[i] = 2 * half;
        }
        rs.max_tokens[i] = 30 + 14 * i;
        rs.temp[i] = i == 2 || i == 5 ? 0.9f : 0.0f; /* sampled too */
    }
    rs.stop[3] = story ? "apple" : NULL;
    rs.opt_out[4] = true;
    static text_out plain[NR], alone[NR], got[NR];
    setup solo = {"alone", 1, 2048, 0, false, false};
    for (int i = 0; i < NR; i++) {
        run(m, v, &solo, &rs, ENGINE_SPEC_OFF, i, plain);
        run(m, v, &solo, &rs, ENGINE_SPEC_NGRAM, i, alone);
        if (!same(&plain[i], &alone[i])) {
            fprintf(stderr, "%s: alone: request %d differs with speculation (n %d vs %d)\n", path,
                    i, alone[i].n, plain[i].n);
            failures++;
        }
    }
    setup setups[] = {
        {"batched", 8, 2048, 0, false, false},
        {"budget 7", 3, 7, 0, false, false},
        {"tiny pool (preemption)", 8, 2048, 14, false, false},
        {"prefix cache, second round", 8, 2048, 0, true, false},
        {"batched, fixed k", 8, 2048, 0, false, true},
    };
    int64_t drafted = 0, accepted = 0;
    for (size_t k = 0; k < sizeof setups / sizeof setups[0]; k++) {
        engine_metrics mt = run(m, v, &setups[k], &rs, ENGINE_SPEC_NGRAM, -1, got);
        for (int i = 0; i < NR; i++)
            if (!same(&plain[i], &got[i])) {
                fprintf(stderr, "%s: %s: request %d differs with speculation (n %d vs %d)\n", path,
                        setups[k].name, i, got[i].n, plain[i].n);
                failures++;
            }
        if (setups[k].kv_blocks && mt.n_preemptions == 0) {
            fprintf(stderr, "%s: %s: expected preemptions\n", path, setups[k].name);
            failures++;
        }
        if (setups[k].twice && prefix_enabled && mt.prefix_cache_hits == 0) {
            fprintf(stderr, "%s: %s: expected prefix-cache hits\n", path, setups[k].name);
            failures++;
        }
        printf("  %-28s drafts %lld, drafted %lld, accepted %lld, preemptions %lld, prefix hits "
               "%lld\n",
               setups[k].name, (long long)mt.spec_drafts, (long long)mt.spec_draft_tokens,
               (long long)mt.spec_accepted_tokens, (long long)mt.n_preemptions,
               (long long)mt.prefix_cache_hits);
        drafted += mt.spec_draft_tokens;
        accepted += mt.spec_accepted_tokens;
    }
    if (drafted == 0 || (story && accepted == 0) || accepted == drafted) {
        fprintf(stderr,
                "%s: drafted %lld, accepted %lld: both acceptance and rejection must happen\n",
                path, (long long)drafted, (long long)accepted);
        failures++;
    }
    if (story) {
        /* the opted-out request alone drafts nothing */
        engine_metrics mt = run(m, v, &solo, &rs, ENGINE_SPEC_NGRAM, 4, got);
        CHECK(mt.spec_draft_tokens == 0);
        /* Draft model = the model itself: every greedy draft is accepted, and
         * the output is still the plain one (batched, and under preemption,
         * where the draft KV is freed and computed again). */
        draft_model = m;
        spec_fixed = true; /* drafting with the model itself never pays: drafts all the same */
        for (int greedy = 0; greedy < NR; greedy++) rs.temp[greedy] = 0.0f;
        rs.stop[3] = NULL;
        setup dsets[] = {{"draft: batched", 8, 2048, 0, false, false},
                         {"draft: tiny pool", 8, 2048, 14, false, false}};
        for (size_t k = 0; k < 2; k++) {
            run(m, v, &solo, &rs, ENGINE_SPEC_OFF, -1, plain); /* max_seqs 1: one after another */
            mt = run(m, v, &dsets[k], &rs, ENGINE_SPEC_DRAFT, -1, got);
            for (int i = 0; i < NR; i++)
                if (!same(&plain[i], &got[i])) {
                    fprintf(stderr, "%s: request %d differs with a draft model\n", dsets[k].name,
                            i);
                    failures++;
                }
            printf("  %-28s drafted %lld, accepted %lld, preemptions %lld\n", dsets[k].name,
                   (long long)mt.spec_draft_tokens, (long long)mt.spec_accepted_tokens,
                   (long long)mt.n_preemptions);
            CHECK(mt.spec_draft_tokens > 100 && mt.spec_accepted_tokens == mt.spec_draft_tokens);
        }
        CHECK(mt.n_preemptions > 0);
        draft_model = NULL;
        spec_fixed = false;
    }
    printf("%s: identical with speculation; drafted %lld, accepted %lld\n", path,
           (long long)drafted, (long long)accepted);
    model_destroy(m);
    tok_vocab_destroy(v);
}

/* One forward of n tokens of one sequence after a prefill of ctx (every row's
 * logits, as a verification asks), on the given thread count, into logits. */
static bool forward_threads(model *m, int threads, int ctx, int n, float *logits) {
    kvl_pool_set_threads(threads);
    kvl_error err = {{0}};
    const int ng = model_kv_n_groups(m);
    kv_pool *pools[MODEL_MAX_KV_GROUPS] = {0};
    kv_seq seqs[MODEL_MAX_KV_GROUPS];
    const kv_seq *tables[MODEL_MAX_KV_GROUPS];
    bool ok = true;
    for (int g = 0; g < ng && ok; g++) {
        kv_pool_config kc;
        model_kv_group_shape(m, g, &kc, NULL);
        kc.block_size = 16;
        kc.dtype = GGUF_DT_F16;
        kc.split_v = false;
        kc.n_blocks = (ctx + n) / 16 + 2;
        kv_seq_init(&seqs[g]);
        ok = (pools[g] = kv_pool_create(&kc, &err)) && kv_seq_reserve(pools[g], &seqs[g], ctx + n);
        tables[g] = &seqs[g];
    }
    int32_t tok[256], pos[256], sq[256] = {0};
    uint8_t want[256];
    for (int i = 0; i < ctx + n; i++) {
        tok[i] = 1 + (i * 37 + 11) % 500;
        pos[i] = i;
        want[i] = i >= ctx - 1;
    }
    model_batch pre = {ctx, tok, pos, sq, want, 1, tables, NULL, NULL};
    model_batch b = {n, tok + ctx, pos + ctx, sq, want + ctx, 1, tables, NULL, NULL};
    ok = ok && model_forward(m, pools, &pre, logits, &err) &&
         model_forward(m, pools, &b, logits, &err);
    if (!ok) fprintf(stderr, "forward on %d threads: %s\n", threads, err.msg);
    for (int g = 0; g < ng; g++)
        if (pools[g]) {
            kv_seq_free(pools[g], &seqs[g]);
            kv_pool_destroy(pools[g]);
        }
    return ok;
}

/* A verification's forward gives the same bits on 1 and 2 threads: on 2 its
 * small matrices on the same input run side by side (op_matmul_many) and its
 * attention on both threads; on 1 all in order. */
static void test_threads(void) {
    tok_vocab *v;
    model *m = load_test_model("models/stories260K.gguf", 256, 32, &v);
    if (!m) {
        failures++;
        return;
    }
    const int64_t V = model_hp(m)->n_vocab;
    const int threads = kvl_pool_threads();
    static const int ns[] = {2, 5, 8};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        float *l1 = calloc((size_t)ns[i] * V, sizeof(float));
        float *l2 = calloc((size_t)ns[i] * V, sizeof(float));
        CHECK(l1 && l2 && forward_threads(m, 1, 200, ns[i], l1) &&
              forward_threads(m, 2, 200, ns[i], l2));
        CHECK(l1 && l2 && memcmp(l1, l2, (size_t)ns[i] * V * sizeof(float)) == 0);
        free(l1);
        free(l2);
    }
    kvl_pool_set_threads(threads);
    model_destroy(m);
    tok_vocab_destroy(v);
}

int main(void) {
    test_propose();
    test_threads();
    test_ngram_index();
    test_adapt();
    compare_model("models/stories260K.gguf", true);
    compare_model("tests/data/golden/models/qwen3-f32.gguf", false);
    compare_model("tests/data/golden/models/gemma3-swa-f32.gguf", false); /* two KV groups */
    printf("test_spec: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
