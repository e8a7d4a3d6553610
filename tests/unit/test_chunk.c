/* Chunked attention (llama4) end to end, on the vendored tiny llama4 model:
 * its 3 chunked layers are a KV group of their own, and the engine drops that
 * group's blocks of earlier chunks (kv.h's rule) as a sequence crosses each
 * multiple of the chunk. llama.cpp fixes the chunk at 8192; the model loader's
 * test override (model_params.attn_chunk) makes it 64 or 256 here, so a few
 * hundred tokens cross several boundaries. Greedy ids must be identical with
 * dropping and on the whole-KV path (engine_config.keep_unattended_kv), alone,
 * batched, one token per step, in prefill chunks that straddle a boundary,
 * preempted and recomputed, and with prefix-cache hits (the chunked group
 * resumes from the cached blocks of the chunk it stops in, never from a
 * dropped one: a missing block would be refused by the model's batch check);
 * and the blocks held at the end must be exactly the current chunk's, fewer
 * than the whole KV's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv_plan.h"
#include "test_model.h"

#define MODEL   "tests/data/golden/models/llama4-f32.gguf"
#define N_REQ   5
#define N_GEN   48
#define MAX_LEN 600
#define BS      16

static int failures;

typedef struct result {
    int32_t ids[N_GEN];
    int n;
    bool done;
    engine_req_stats st; /* at the end, before the blocks were freed */
} result;

static void on_event(const engine_event *ev, void *user) {
    result *r = user;
    if (ev->token >= 0 && r->n < N_GEN) r->ids[r->n++] = ev->token;
    if (ev->finish) {
        r->done = true;
        if (ev->stats) r->st = *ev->stats;
    }
}

typedef struct variant {
    const char *name;
    bool keep; /* the whole-KV path */
    int max_seqs;
    int64_t batch_tokens, n_blocks;
    bool twice;   /* every request again after the first round (prefix-cache hits) */
    bool preempt; /* expect preemptions */
} variant;

static bool run(model *m, tok_vocab *v, const variant *x, int32_t prompts[N_REQ][MAX_LEN],
                const int *lens, int only, result out[N_REQ]) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = MAX_LEN + N_GEN;
    c.block_size = BS;
    c.max_seqs = x->max_seqs;
    c.max_batch_tokens = x->batch_tokens;
    c.n_blocks = x->n_blocks;
    c.kv_dtype = GGUF_DT_F32;
    c.prefix_cache = true;
    c.keep_unattended_kv = x->keep;
    kvl_error err = {{0}};
    engine *e = engine_create(m, v, &c, &err);
    if (!e) {
        fprintf(stderr, "%s: %s\n", x->name, err.msg);
        return false;
    }
    /* on with dropping; the whole-KV path keeps no partial tables: off */
    if (engine_prefix_cache_enabled(e) == x->keep) {
        fprintf(stderr, "%s: the prefix cache is %s\n", x->name, x->keep ? "on" : "off");
        failures++;
    }
    for (int round = 0; round < (x->twice ? 2 : 1); round++) {
        for (int i = 0; i < N_REQ; i++) {
            if (only >= 0 && i != only) continue;
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
                fprintf(stderr, "%s: submit: %s\n", x->name, err.msg);
                engine_destroy(e);
                return false;
            }
        }
        int steps = 0;
        while (engine_has_work(e) && steps++ < 100000)
            if (!engine_step(e, &err)) {
                fprintf(stderr, "%s: step: %s\n", x->name, err.msg);
                failures++;
                break;
            }
    }
    engine_metrics mt = engine_get_metrics(e);
    if (x->twice && mt.prefix_cache_hits < BS) {
        fprintf(stderr, "%s: only %lld prefix-cache hits\n", x->name,
                (long long)mt.prefix_cache_hits);
        failures++;
    }
    if (x->preempt && mt.n_preemptions == 0) {
        fprintf(stderr, "%s: expected preemptions, saw none\n", x->name);
        failures++;
    }
    for (int g = 0; g < engine_kv_n_groups(e); g++)
        if (kv_pool_n_used(engine_kv_group(e, g)) != 0) {
            fprintf(stderr, "%s: blocks of group %d still used at the end\n", x->name, g);
            failures++;
        }
    printf("  %-36s steps %5lld, preemptions %lld, prefix hits %lld tokens\n", x->name,
           (long long)mt.steps, (long long)mt.n_preemptions, (long long)mt.prefix_cache_hits);
    engine_destroy(e);
    return true;
}

/* The blocks each group holds at the end: the whole KV's ceil(n / BS), or for
 * the chunked group with dropping the blocks of [kv_chunk_first(n - 1), n). */
static void check_held(const char *name, const result *r, bool keep, int32_t chunk, int req,
                       size_t *bytes) {
    const engine_req_stats *s = &r->st;
    const int64_t n = s->kv.tokens;
    *bytes = 0;
    for (int g = 0; g < s->n_kv_groups; g++) {
        const kv_attn a = {s->kv_group_window[g], s->kv_group_chunk[g]};
        int64_t want = keep ? (n + BS - 1) / BS : kv_plan_blocks_held(a, BS, n, 1);
        if (a.chunk != 0 && a.chunk != chunk) failures++;
        if (s->kv_group[g].blocks != want) {
            fprintf(stderr,
                    "%s: request %d group %d (chunk %d) holds %lld blocks after %lld "
                    "tokens, want %lld\n",
                    name, req, g, a.chunk, (long long)s->kv_group[g].blocks, (long long)n,
                    (long long)want);
            failures++;
        }
        *bytes += s->kv_group[g].allocated_bytes;
    }
}

static void test_chunk(int32_t chunk) {
    tok_vocab *v;
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(MODEL, &err);
    v = f ? tok_vocab_create(f, &err) : NULL;
    model_params mp = {.max_ctx = MAX_LEN + N_GEN, .max_ubatch = 64, .attn_chunk = chunk};
    model *m = v ? model_load(f, &mp, &err) : NULL;
    if (!m) {
        fprintf(stderr, "%s: %s\n", MODEL, err.msg);
        if (v) tok_vocab_destroy(v);
        else gguf_close(f);
        failures++;
        return;
    }
    /* layers 0-2 chunked, 3 full: two groups in order of first layer */
    kv_pool_config kc;
    kv_attn a0, a1;
    model_kv_group_shape(m, 0, &kc, &a0);
    const int n0 = kc.n_layers;
    model_kv_group_shape(m, 1, &kc, &a1);
    if (model_kv_n_groups(m) != 2 || a0.chunk != chunk || a0.window || n0 != 3 || a1.chunk ||
        a1.window || kc.n_layers != 1) {
        fprintf(stderr, "chunk %d: KV groups not {3 chunked, 1 full}\n", chunk);
        failures++;
    }
    printf("chunk %d (blocks of %d)\n", chunk, BS);
    int32_t prompts[N_REQ][MAX_LEN];
    /* lengths around and across multiples of the chunk; 3 shares 2's first 96 tokens */
    const int lens[N_REQ] = {chunk / 2, chunk - 1, chunk + 37, 2 * chunk + 5, 3 * chunk / 2};
    srand(11);
    for (int i = 0; i < N_REQ; i++)
        for (int k = 0; k < lens[i]; k++)
            prompts[i][k] = 3 + rand() % (int)(model_hp(m)->n_vocab - 3);
    memcpy(prompts[3], prompts[2], 96 * sizeof(int32_t));
    result ref[N_REQ], got[N_REQ];
    const variant whole = {"whole KV, alone", true, 1, 4096, 0, false, false};
    const variant alone = {"dropping, alone", false, 1, 4096, 0, false, false};
    size_t whole_bytes[N_REQ], drop_bytes[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        if (!run(m, v, &whole, prompts, lens, i, ref)) failures++;
        check_held(whole.name, &ref[i], true, chunk, i, &whole_bytes[i]);
    }
    for (int i = 0; i < N_REQ; i++) {
        if (!run(m, v, &alone, prompts, lens, i, got)) failures++;
        check_held(alone.name, &got[i], false, chunk, i, &drop_bytes[i]);
        if (got[i].n != N_GEN || memcmp(got[i].ids, ref[i].ids, sizeof got[i].ids)) {
            fprintf(stderr, "dropping, alone: request %d differs from the whole-KV run\n", i);
            failures++;
        }
        const int64_t n = got[i].st.kv.tokens;
        /* measured: what the request held at its end, whole KV against dropping */
        printf("    request %d: %lld tokens, KV held %zu B whole, %zu B dropping (measured)\n", i,
               (long long)n, whole_bytes[i], drop_bytes[i]);
        if (n > chunk + BS && drop_bytes[i] >= whole_bytes[i]) {
            fprintf(stderr, "request %d: dropping holds no less than the whole KV\n", i);
            failures++;
        }
    }
    const variant variants[] = {
        {"whole KV, batched", true, 8, 4096, 0, false, false},
        {"dropping, batched", false, 8, 4096, 0, false, false},
        {"dropping, one token per step", false, 8, 1, 0, false, false},
        /* prefill chunks that straddle chunk boundaries */
        {"dropping, budget 23, 3 seqs", false, 3, 23, 0, false, false},
        /* room for the longest request and a little more: the others wait or are preempted */
        {"dropping, tiny pool (preemption)", false, 8, 4096, (lens[3] + N_GEN + BS - 1) / BS + 8,
         false, true},
        {"dropping, prefix cache, twice", false, 8, 4096, 0, true, false},
        /* one at a time, in a pool with room for all: every second run hits */
        {"dropping, prefix cache, twice, 1 seq", false, 1, 4096, 400, true, false},
    };
    for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
        if (!run(m, v, &variants[k], prompts, lens, -1, got)) {
            failures++;
            continue;
        }
        /* a hit past the first chunk: the chunked group resumed with its
         * earlier chunks' entries -1 */
        int64_t most = 0;
        for (int i = 0; i < N_REQ; i++)
            most = got[i].st.n_cached_prompt > most ? got[i].st.n_cached_prompt : most;
        if (variants[k].twice && most <= chunk) {
            fprintf(stderr, "%s: no prefix hit past the first chunk (at most %lld)\n",
                    variants[k].name, (long long)most);
            failures++;
        }
        for (int i = 0; i < N_REQ; i++)
            if (got[i].n != N_GEN || memcmp(got[i].ids, ref[i].ids, sizeof got[i].ids)) {
                int j = 0;
                while (j < got[i].n && got[i].ids[j] == ref[i].ids[j]) j++;
                fprintf(stderr, "  %s: request %d differs from the whole-KV run at token %d\n",
                        variants[k].name, i, j);
                failures++;
            }
    }
    model_destroy(m);
    /* the disk tier's layout: one KV group, nothing dropped, the attention
     * still masked by the chunk (same ids as the whole-KV run) */
    gguf_file *f1 = gguf_open(MODEL, &err);
    model_params mp1 = mp;
    mp1.chunks_keep_kv = true;
    model *m1 = f1 ? model_load(f1, &mp1, &err) : NULL;
    if (!m1 || model_kv_n_groups(m1) != 1) {
        fprintf(stderr, "chunk %d, chunks_keep_kv: %s\n", chunk,
                m1 ? "more than one KV group" : err.msg);
        failures++;
    } else {
        const variant one = {"one KV group, batched", false, 8, 4096, 0, false, false};
        if (!run(m1, v, &one, prompts, lens, -1, got)) failures++;
        for (int i = 0; i < N_REQ; i++)
            if (got[i].n != N_GEN || memcmp(got[i].ids, ref[i].ids, sizeof got[i].ids)) {
                fprintf(stderr, "  %s: request %d differs from the whole-KV run\n", one.name, i);
                failures++;
            }
    }
    model_destroy(m1);
    tok_vocab_destroy(v);
}

int main(void) {
    test_chunk(64);  /* per-token attention path */
    test_chunk(256); /* a multiple of the attention's fixed chunk: prefill runs */
    if (failures) {
        fprintf(stderr, "test_chunk: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_chunk: ok\n");
    return 0;
}
