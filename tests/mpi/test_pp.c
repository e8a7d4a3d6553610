/* test_pp: a pipeline of MPI ranks (engine/pp.h) gives exactly what one process
 * gives. Run under mpirun with N ranks: for each model path on the command
 * line, every rank loads its stage, and rank 0 also loads the whole model and
 * runs the same requests through both (one request alone; then several at
 * once, with chunked prefill, shared prefixes hitting the prefix cache and a
 * pool small enough to preempt; then with a q8_0 KV cache), comparing every
 * generated id, its logprob and its top-5 alternatives bit for bit. Models
 * with fewer layers than ranks are skipped (and counted). Exit 0 only if every
 * comparison held and at least one model ran. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "pp.h"

enum { NR = 5, MAX_OUT = 12, TOPK = 5 };

static int failures;

typedef struct collected {
    int32_t ids[MAX_OUT];
    float lp[MAX_OUT];
    int32_t top[MAX_OUT][TOPK];
    float top_lp[MAX_OUT][TOPK];
    int n;
    engine_finish finish;
} collected;

static void on_event(const engine_event *ev, void *user) {
    collected *c = user;
    if (ev->token >= 0 && c->n < MAX_OUT) {
        c->ids[c->n] = ev->token;
        c->lp[c->n] = ev->logprob;
        for (int k = 0; k < ev->n_top && k < TOPK; k++) {
            c->top[c->n][k] = ev->top_ids[k];
            c->top_lp[c->n][k] = ev->top_logprobs[k];
        }
        c->n++;
    }
    if (ev->finish) c->finish = ev->finish;
}

typedef struct setup {
    const char *name;
    int n_req;
    int max_seqs;
    int64_t batch_tokens, kv_blocks;
    int kv_dtype;
    bool twice; /* the requests again: prefix-cache hits */
    int groups; /* engine_config.step_groups; 0: one per rank */
} setup;

static int32_t prompts[NR][96];
static int prompt_len[NR];

/* Runs the setup's requests to the end; false if the engine could not be made.
 * *mt: the engine's counters at the end. */
static bool run(model *m, tok_vocab *v, const setup *su, collected out[NR], engine_metrics *mt) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 160;
    c.block_size = 4;
    c.max_seqs = su->max_seqs;
    c.max_batch_tokens = su->batch_tokens;
    c.n_blocks = su->kv_blocks;
    c.kv_dtype = su->kv_dtype;
    c.step_groups = su->groups ? su->groups : pp_job_size();
    kvl_error err = {{0}};
    engine *e = engine_create(m, v, &c, &err);
    if (!e) {
        fprintf(stderr, "  %s: %s\n", su->name, err.msg);
        return false;
    }
    memset(out, 0, NR * sizeof *out);
    for (int round = 0; round < (su->twice ? 2 : 1); round++) {
        for (int i = 0; i < su->n_req; i++) {
            memset(&out[i], 0, sizeof out[i]);
            engine_request r = {.prompt = prompts[i],
                                .n_prompt = prompt_len[i],
                                .max_tokens = MAX_OUT,
                                .ignore_eos = true,
                                .logprobs = true,
                                .top_logprobs = TOPK,
                                .on_event = on_event,
                                .user = &out[i]};
            sampler_params_default(&r.sampling);
            r.sampling.temperature = 0;
            if (engine_submit(e, &r, &err) < 0) {
                fprintf(stderr, "  %s: submit: %s\n", su->name, err.msg);
                failures++;
            }
        }
        for (int steps = 0; engine_has_work(e) && steps < 100000; steps++)
            if (!engine_step(e, &err)) {
                fprintf(stderr, "  %s: step: %s\n", su->name, err.msg);
                failures++;
                break;
            }
    }
    *mt = engine_get_metrics(e);
    engine_destroy(e);
    return true;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void compare(const char *model_name, const setup *su, const collected *a, const collected *b,
                    const char *what) {
    for (int i = 0; i < su->n_req; i++) {
        bool ok = a[i].n == b[i].n && a[i].n > 0 && a[i].finish == b[i].finish;
        for (int t = 0; ok && t < a[i].n; t++) {
            ok = a[i].ids[t] == b[i].ids[t] && same_bits(a[i].lp[t], b[i].lp[t]);
            for (int k = 0; ok && k < TOPK; k++)
                ok = a[i].top[t][k] == b[i].top[t][k] &&
                     same_bits(a[i].top_lp[t][k], b[i].top_lp[t][k]);
        }
        if (!ok) {
            fprintf(stderr, "FAIL %s / %s: request %d differs from %s (%d vs %d tokens)\n",
                    model_name, su->name, i, what, a[i].n, b[i].n);
            failures++;
        }
    }
}

static void make_prompts(int64_t n_vocab) {
    uint64_t x = 0x9E3779B97F4A7C15ull;
    const int lens[NR] = {23, 41, 9, 60, 33};
    for (int i = 0; i < NR; i++) {
        prompt_len[i] = lens[i];
        for (int t = 0; t < lens[i]; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* requests 1 and 3 share request 0's first 16 tokens: prefix-cache hits */
            prompts[i][t] = (i == 1 || i == 3) && t < 16
                                ? prompts[0][t]
                                : (int32_t)(1 + (x >> 33) % (uint64_t)(n_vocab - 1));
        }
    }
}

static model *load(const char *path, int first, int end, tok_vocab **v, kvl_error *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return NULL;
    if (v && !(*v = tok_vocab_create(f, err))) {
        gguf_close(f);
        return NULL;
    }
    model_params mp = {.max_ctx = 160, .max_ubatch = 32, .layer_first = first, .layer_end = end};
    return model_load(f, &mp, err); /* takes f */
}

int main(int argc, char **argv) {
    int rank = 0, size = 0, ran = 0, skipped = 0;
    kvl_error err = {{0}};
    if (!pp_init(0, &rank, &err)) {
        fprintf(stderr, "test_pp: %s\n", err.msg);
        return 1;
    }
    size = pp_job_size();
    for (int a = 1; a < argc; a++) {
        const char *path = argv[a];
        const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        gguf_file *f = gguf_open(path, &err);
        int first[PP_MAX_RANKS], end[PP_MAX_RANKS];
        bool ok = f && pp_split(f, size, NULL, first, end, &err);
        gguf_close(f);
        if (!ok) { /* every rank decides the same */
            if (rank == 0) printf("skip %s: %s\n", name, err.msg);
            skipped++;
            continue;
        }
        tok_vocab *v = NULL;
        model *stage = load(path, first[rank], end[rank], rank == 0 ? &v : NULL, &err);
        pp_config pc = {.timeout_s = 60};
        pp_stage *p = stage ? pp_stage_create(stage, &pc, &err) : NULL;
        if (!p) {
            fprintf(stderr, "test_pp: rank %d: %s: %s\n", rank, name, err.msg);
            pp_abort(1);
        }
        if (rank != 0) {
            if (!pp_worker_run(p, &err)) {
                fprintf(stderr, "test_pp: rank %d: %s: %s\n", rank, name, err.msg);
                pp_abort(1);
            }
            pp_stage_destroy(p);
            model_destroy(stage);
            continue;
        }
        model *whole = load(path, 0, 0, NULL, &err);
        if (!whole) {
            fprintf(stderr, "test_pp: %s: %s\n", name, err.msg);
            pp_abort(1);
        }
        make_prompts(model_hp(whole)->n_vocab);
        /* with step groups (one per rank) the steps of different groups are
         * in flight at once: the schedule is another one than with one step
         * at a time, so the pipeline is compared with one process running
         * the same groups (same steps, in the same order), and that one with
         * the plain schedule ("one group" below) */
        const setup setups[] = {
            {"alone", 1, 4, 2048, 0, GGUF_DT_F16, false, 1},
            {"batched", NR, 4, 48, 0, GGUF_DT_F16, true, 1},
            {"batched, step groups", NR, 4, 48, 0, GGUF_DT_F16, true, 0},
            {"preempted", NR, 4, 64, 28, GGUF_DT_F32, false, 1},
            {"preempted, step groups", NR, 4, 64, 28, GGUF_DT_F32, false, 0},
            {"q8_0 KV", 3, 4, 2048, 0, GGUF_DT_Q8_0, false, 1},
        };
        static collected one[NR], pipe[NR], one_group[NR];
        int64_t preempted = 0, hits = 0, grouped_preempted = 0;
        for (size_t s = 0; s < sizeof setups / sizeof setups[0]; s++) {
            engine_metrics m1 = {0}, m2 = {0};
            bool r1 = run(whole, v, &setups[s], one, &m1);
            bool r2 = run(stage, v, &setups[s], pipe, &m2);
            if (r1 != r2) {
                fprintf(stderr, "FAIL %s / %s: engine made in one process only\n", name,
                        setups[s].name);
                failures++;
            } else if (r1) {
                compare(name, &setups[s], one, pipe, "one process");
                if (setups[s].groups == 1) memcpy(one_group, one, sizeof one);
                else { /* the setup before it: the same requests, one group */
                    compare(name, &setups[s], one_group, one, "one group");
                    grouped_preempted += m1.n_preemptions;
                }
                /* the same decisions: same steps, preemptions, prefix hits */
                if (m1.steps != m2.steps || m1.n_preemptions != m2.n_preemptions ||
                    m1.prefix_cache_hits != m2.prefix_cache_hits) {
                    fprintf(stderr, "FAIL %s / %s: the schedules differ\n", name, setups[s].name);
                    failures++;
                }
                preempted += m1.n_preemptions;
                hits += m1.prefix_cache_hits;
            }
        }
        pp_stats st;
        pp_stage_stats(p, &st);
        /* the setups must reach what they are meant to cover */
        if (preempted == 0 || grouped_preempted == 0) {
            fprintf(stderr, "FAIL %s: no request was preempted%s\n", name,
                    preempted ? " with step groups" : "");
            failures++;
        }
        if (st.most_in_flight < 2) { /* step groups overlapped */
            fprintf(stderr, "FAIL %s: never two steps in flight\n", name);
            failures++;
        }
        printf("%s: %lld preemptions, %lld prefix-cache tokens; layers", name, (long long)preempted,
               (long long)hits);
        for (int r = 0; r < size; r++) printf("%s %d-%d", r ? "," : "", first[r], end[r] - 1);
        printf(": %lld steps (%d in flight at most), %lld tokens, %lld hidden bytes sent by rank "
               "0 (%lld per token)\n",
               (long long)st.steps, st.most_in_flight, (long long)st.tokens,
               (long long)st.hidden_bytes,
               st.tokens ? (long long)(st.hidden_bytes / st.tokens) : 0);
        fflush(stdout);
        pp_stage_destroy(p);
        model_destroy(stage);
        model_destroy(whole);
        tok_vocab_destroy(v);
        ran++;
    }
    if (rank == 0) {
        printf(
            "%d models compared with %d ranks, %d skipped (fewer layers than ranks), %d failures\n",
            ran, size, skipped, failures);
        if (ran == 0) failures++;
    }
    pp_finalize();
    return failures ? 1 : 0;
}
