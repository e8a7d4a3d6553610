/* Scheduling policies of the engine: priority order (lower value first,
 * arrival order within a value), fcfs refusing priorities, a running request
 * preempted for a more urgent one (and still producing its own greedy ids),
 * and prefix-aware admission preferring cached prefixes without starving a
 * request whose prefix is not cached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine.h"
#include "test_model.h"

#define N_GEN    12
#define N_PROMPT 40

static model *g_model;
static tok_vocab *g_vocab;
static int g_order[64], g_n_done;

typedef struct out {
    int tag;
    int32_t ids[N_GEN];
    int n;
} out;

static void on_event(const engine_event *ev, void *user) {
    out *o = user;
    if (ev->token >= 0 && o->n < N_GEN) o->ids[o->n++] = ev->token;
    if (ev->finish) g_order[g_n_done++] = o->tag;
}

static engine *make(engine_sched pol, int wait, int max_seqs) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    c.max_seqs = max_seqs;
    c.scheduling = pol;
    c.prefix_admission_wait = wait;
    kvl_error err;
    engine *e = engine_create(g_model, g_vocab, &c, &err);
    if (!e) fprintf(stderr, "%s\n", err.msg);
    return e;
}

static int64_t submit(engine *e, const int32_t *prompt, int prio, out *o, int tag) {
    memset(o, 0, sizeof *o);
    o->tag = tag;
    engine_request r = {.prompt = prompt,
                        .n_prompt = N_PROMPT,
                        .max_tokens = N_GEN,
                        .ignore_eos = true,
                        .priority = prio,
                        .on_event = on_event,
                        .user = o};
    sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    kvl_error err;
    int64_t id = engine_submit(e, &r, &err);
    return id;
}

static void drain(engine *e) {
    kvl_error err;
    while (engine_has_work(e))
        if (!engine_step(e, &err)) {
            fprintf(stderr, "step: %s\n", err.msg);
            failures++;
            return;
        }
}

static int position(int tag) {
    for (int i = 0; i < g_n_done; i++)
        if (g_order[i] == tag) return i;
    return -1;
}

int main(void) {
    kvl_error err;
    g_model = load_test_model("models/stories260K.gguf", 128, 64, &g_vocab);
    if (!g_model) return 1;
    int32_t prompts[8][N_PROMPT];
    srand(5);
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < N_PROMPT; k++) prompts[i][k] = 3 + rand() % 500;

    /* solo runs: the reference ids */
    out solo[8], o[8];
    engine *e = make(ENGINE_SCHED_FCFS, 0, 1);
    for (int i = 0; i < 8; i++) {
        submit(e, prompts[i], 0, &solo[i], i);
        drain(e);
    }
    /* fcfs refuses a priority */
    CHECK(submit(e, prompts[0], 1, &o[0], 0) < 0, "fcfs accepted priority 1");
    engine_destroy(e);

    /* 1: priority order, arrival order within a value */
    const int prio[6] = {3, 1, 2, 0, 1, 3};
    const int want[6] = {3, 1, 4, 2, 0, 5};
    e = make(ENGINE_SCHED_PRIORITY, 0, 1);
    g_n_done = 0;
    for (int i = 0; i < 6; i++) submit(e, prompts[i], prio[i], &o[i], i);
    drain(e);
    for (int i = 0; i < 6; i++) {
        CHECK(g_order[i] == want[i], "priority: finish %d is request %d, want %d", i, g_order[i],
              want[i]);
        CHECK(o[i].n == solo[i].n && !memcmp(o[i].ids, solo[i].ids, sizeof o[i].ids),
              "request %d ids differ", i);
    }
    engine_destroy(e);

    /* 2: a running request of value 5 yields to one of value 0 submitted later */
    e = make(ENGINE_SCHED_PRIORITY, 0, 1);
    g_n_done = 0;
    submit(e, prompts[6], 5, &o[6], 6);
    for (int k = 0; k < 4; k++) engine_step(e, &err);
    submit(e, prompts[7], 0, &o[7], 7);
    drain(e);
    engine_metrics mt = engine_get_metrics(e);
    CHECK(g_order[0] == 7 && mt.n_preemptions >= 1,
          "urgent request finished at %d, %lld preemptions", position(7),
          (long long)mt.n_preemptions);
    for (int i = 6; i < 8; i++)
        CHECK(o[i].n == solo[i].n && !memcmp(o[i].ids, solo[i].ids, sizeof o[i].ids),
              "request %d ids differ", i);
    engine_destroy(e);

    /* 3: prefix-aware admission prefers cached prefixes, within its bound.
     * Request 0's prompt is cached; then a request with no cached prefix
     * arrives before five that share request 0's prompt. */
    for (int wait = 2; wait <= 100; wait += 98) {
        e = make(ENGINE_SCHED_FCFS, wait, 1);
        submit(e, prompts[0], 0, &o[0], 0);
        drain(e);
        g_n_done = 0;
        submit(e, prompts[1], 0, &o[1], 100); /* nothing cached */
        out shared[5];
        for (int i = 0; i < 5; i++) submit(e, prompts[0], 0, &shared[i], 200 + i);
        drain(e);
        int pos = position(100);
        if (wait == 2)
            CHECK(pos == 2, "bounded wait 2: the uncached request finished at %d, want 2", pos);
        else CHECK(pos == 5, "wait 100: the uncached request finished at %d, want last (5)", pos);
        CHECK(o[1].n == solo[1].n && !memcmp(o[1].ids, solo[1].ids, sizeof o[1].ids),
              "uncached request ids differ");
        for (int i = 0; i < 5; i++)
            CHECK(!memcmp(shared[i].ids, solo[0].ids, sizeof shared[i].ids),
                  "shared request %d ids differ", i);
        engine_destroy(e);
    }
    model_destroy(g_model);
    tok_vocab_destroy(g_vocab);
    printf("test_sched: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
