/* Attention against the reference forward and against itself. The logits of
 * a 600-token prompt (three attention chunks of 256, two ubatches) agree with
 * the reference forward (model_ref.c: a token at a time, double accumulation,
 * a plain softmax over the block table) within a normalized error set per
 * model from what activation rounding explains (measured: f16 weights 2.5e-3,
 * q4_0 with q8_0 activations 5.2e-2, MLA 5.9e-4, sliding window 2.9e-4,
 * Qwen3 8.5e-5; a window one position too wide gives 0.22); and they are
 * bit-identical whether the prompt runs in one batch (runs of tokens share
 * each K/V row: op_attend_run), one token per forward (op_attend_group, the
 * decode path), in slices of 100 that cut runs at odd places, or batched with
 * a second sequence. For GQA with f16 and q8_0 KV (q8_0 rows are widened in
 * runs of 64 positions; Qwen3's heads of 64 with the cache's Hadamard rotation,
 * which the reference forward does not apply: 1.9e-2 against it), MLA,
 * sliding-window, Qwen3 and mixture-of-experts
 * models (whose tokens are grouped by expert: a different grouping each way). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "synth.h"

#define N_TOK  600
#define N_CTX  1024
#define BLOCK  16
#define N_WANT 12

static int failures;
/* The condition, and what it means when it fails. */
#define EXPECT(c, ...)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

typedef struct setup {
    model *m;
    int n_groups, kv_dtype;
    int64_t vocab;
    int32_t tokens[N_TOK], pos[N_TOK];
    uint8_t want[N_TOK];
} setup;

/* Pools for the model's KV groups and two sequences' tables covering the prompt. */
typedef struct kv_state {
    kv_pool *pools[MODEL_MAX_KV_GROUPS];
    kv_seq seqs[2][MODEL_MAX_KV_GROUPS];
    const kv_seq *tables[2 * MODEL_MAX_KV_GROUPS]; /* [seq * n_groups + group] */
} kv_state;

static void kv_close(const setup *su, kv_state *kv) {
    for (int g = 0; g < su->n_groups; g++)
        if (kv->pools[g]) {
            for (int s = 0; s < 2; s++) kv_seq_free(kv->pools[g], &kv->seqs[s][g]);
            kv_pool_destroy(kv->pools[g]);
        }
}

static bool kv_open(const setup *su, kv_state *kv) {
    kvl_error err;
    memset(kv, 0, sizeof *kv);
    for (int s = 0; s < 2; s++)
        for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) kv_seq_init(&kv->seqs[s][g]);
    for (int g = 0; g < su->n_groups; g++) {
        kv_pool_config kc;
        model_kv_group_shape(su->m, g, &kc, NULL);
        kc.block_size = BLOCK;
        kc.dtype = su->kv_dtype;
        kc.split_v = false;
        kc.n_blocks = 2 * (N_CTX / BLOCK);
        kv->pools[g] = kv_pool_create(&kc, &err);
        if (!kv->pools[g]) {
            fprintf(stderr, "kv_pool_create: %s\n", err.msg);
            kv_close(su, kv);
            return false;
        }
        for (int s = 0; s < 2; s++)
            if (!kv_seq_reserve(kv->pools[g], &kv->seqs[s][g], N_TOK)) {
                kv_close(su, kv);
                return false;
            }
    }
    for (int s = 0; s < 2; s++)
        for (int g = 0; g < su->n_groups; g++) kv->tables[s * su->n_groups + g] = &kv->seqs[s][g];
    return true;
}

/* Runs tokens [0, N_TOK) of the prompt in forwards of `slice` tokens; with
 * `twin`, every forward also carries the same tokens of a second sequence
 * first (its logits are not kept). Logits of the wanted tokens go to out in
 * order. */
static bool run(setup *su, int slice, bool twin, float *out) {
    kvl_error err;
    kv_state kv;
    if (!kv_open(su, &kv)) return false;
    bool ok = false;
    int32_t tok[2 * N_TOK], pos[2 * N_TOK], seq[2 * N_TOK];
    uint8_t want[2 * N_TOK];
    int64_t n_out = 0;
    for (int t0 = 0; t0 < N_TOK; t0 += slice) {
        const int n = N_TOK - t0 < slice ? N_TOK - t0 : slice;
        int k = 0;
        for (int copy = twin ? 0 : 1; copy < 2; copy++)
            for (int i = 0; i < n; i++, k++) {
                tok[k] = su->tokens[t0 + i];
                pos[k] = su->pos[t0 + i];
                seq[k] = copy == 0 ? 1 : 0;
                want[k] = copy == 1 && su->want[t0 + i];
            }
        model_batch b = {k, tok, pos, seq, want, 2, kv.tables, NULL, NULL};
        if (!model_forward(su->m, kv.pools, &b, out + n_out * su->vocab, &err)) {
            fprintf(stderr, "model_forward: %s\n", err.msg);
            goto done;
        }
        for (int i = 0; i < k; i++) n_out += want[i];
    }
    ok = n_out == N_WANT;
done:
    kv_close(su, &kv);
    return ok;
}

/* The same prompt through the reference forward, a token at a time. */
static bool run_ref(setup *su, float *out) {
    kvl_error err;
    kv_state kv;
    if (!kv_open(su, &kv)) return false;
    float *logits = malloc((size_t)su->vocab * sizeof *logits);
    int64_t n_out = 0;
    bool ok = logits != NULL;
    for (int t = 0; ok && t < N_TOK; t++) {
        ok = model_forward_ref(su->m, kv.pools, kv.tables, su->tokens[t], su->pos[t],
                               su->want[t] ? logits : NULL, &err);
        if (!ok) fprintf(stderr, "model_forward_ref: %s\n", err.msg);
        if (ok && su->want[t])
            memcpy(out + n_out++ * su->vocab, logits, (size_t)su->vocab * sizeof *logits);
    }
    free(logits);
    kv_close(su, &kv);
    return ok && n_out == N_WANT;
}

/* The largest over the wanted tokens of |got - want| / |want| (Euclidean norms of the logit rows). */
static double max_normalized_error(const float *got, const float *want, int64_t vocab) {
    double worst = 0;
    for (int r = 0; r < N_WANT; r++) {
        double d = 0, n = 0;
        for (int64_t i = 0; i < vocab; i++) {
            const double x = (double)got[r * vocab + i] - want[r * vocab + i];
            d += x * x;
            n += (double)want[r * vocab + i] * want[r * vocab + i];
        }
        const double e = sqrt(d / (n > 0 ? n : 1));
        worst = e > worst || e != e ? e : worst;
    }
    return worst;
}

static void test_model(const char *path, int kv_dtype, double tol) {
    kvl_error err;
    gguf_file *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "%s\n", err.msg);
        failures++;
        return;
    }
    model_params mp = {.max_ctx = N_CTX, .max_ubatch = 512};
    setup *su = calloc(1, sizeof *su);
    if (su) su->m = model_load(f, &mp, &err);
    else gguf_close(f);
    if (!su || !su->m) {
        fprintf(stderr, "%s: %s\n", path, su ? err.msg : "out of memory");
        failures++;
        free(su);
        return;
    }
    su->n_groups = model_kv_n_groups(su->m);
    su->kv_dtype = kv_dtype;
    su->vocab = model_hp(su->m)->n_vocab;
    srand(11);
    for (int i = 0; i < N_TOK; i++) {
        su->tokens[i] = 1 + rand() % (int)(su->vocab - 1);
        su->pos[i] = i;
    }
    /* at chunk edges (255, 256, 511, 512: also the ubatch edge) and inside */
    const int wanted[N_WANT] = {0, 17, 100, 199, 255, 256, 300, 411, 511, 512, 555, 599};
    for (int i = 0; i < N_WANT; i++) su->want[wanted[i]] = 1;
    const size_t bytes = (size_t)N_WANT * su->vocab * sizeof(float);
    float *ref = malloc(bytes), *got = malloc(bytes);
    EXPECT(ref && got && run(su, N_TOK, false, ref), "%s: one batch", path);
    const struct {
        const char *name;
        int slice;
        bool twin;
    } ways[] = {{"one token per forward", 1, false},
                {"slices of 100", 100, false},
                {"with a second sequence", 300, true},
                /* a batched decode's few tokens (mixture of experts: grouped_experts) */
                {"slices of 7 with a second sequence", 7, true},
                {"slices of 40", 40, false}, /* several activation tiles per expert */
                {"slices of 2", 2, false}};
    for (size_t w = 0; w < sizeof ways / sizeof ways[0] && ref && got; w++) {
        memset(got, 0, bytes);
        const bool ok = run(su, ways[w].slice, ways[w].twin, got);
        EXPECT(ok, "%s: %s ran", path, ways[w].name);
        EXPECT(!ok || memcmp(ref, got, bytes) == 0, "%s (kv %s): %s: logits differ from one batch",
               path, gguf_dtype_name(kv_dtype), ways[w].name);
    }
    if (tol < 0) {
        printf("%s (kv %s): checked (no reference forward for this model)\n", path,
               gguf_dtype_name(kv_dtype));
        goto done;
    }
    double err_ref = NAN;
    if (ref && got && run_ref(su, got)) err_ref = max_normalized_error(ref, got, su->vocab);
    EXPECT(err_ref <= tol,
           "%s (kv %s): logits differ from the reference forward by %.3g (tolerance %.3g)", path,
           gguf_dtype_name(kv_dtype), err_ref, tol);
    printf("%s (kv %s): checked; against the reference forward %.3g\n", path,
           gguf_dtype_name(kv_dtype), err_ref);
done:
    free(ref);
    free(got);
    model_destroy(su->m);
    free(su);
}

int main(void) {
    const char *dir = "tests/data/golden/models/";
    char path[512];
    const struct {
        const char *file;
        int kv;
        double tol;
    } cases[] = {{"llama-gqa-bpe-f16.gguf", GGUF_DT_F16, 1e-2},
                 {"llama-gqa-bpe-q4_0.gguf", GGUF_DT_Q8_0, 0.15},
                 {"deepseek2-mla-f32.gguf", GGUF_DT_F16, 3e-3},
                 {"gemma3-swa-f32.gguf", GGUF_DT_F16, 2e-3},
                 {"qwen3-f32.gguf", GGUF_DT_BF16, 5e-4},
                 /* heads of 64: q, K and V Hadamard-rotated around the Q8_0 cache */
                 {"qwen3-f32.gguf", GGUF_DT_Q8_0, 0.15},
                 /* mixture of experts: the ubatch's tokens grouped by expert, a few or many per
                  * expert (the reference forward is dense only: tolerance < 0 skips it) */
                 {"qwen3moe-q8_0.gguf", GGUF_DT_F16, -1},
                 {"deepseek2-moe-f32.gguf", GGUF_DT_F16, -1},
                 {"llama-moe-f32.gguf", GGUF_DT_F16, -1},
                 /* gpt-oss: MXFP4 experts with biases, clamped SwiGLU, sinks, sliding window */
                 {"gpt-oss-mxfp4.gguf", GGUF_DT_F16, -1},
                 /* llama4: input-weighted experts, NoPE layer with temperature, q/k L2 norm,
                  * chunked layers (chunks of 8192: the masking itself is in its golden) */
                 {"llama4-f32.gguf", GGUF_DT_F16, -1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s%s", dir, cases[i].file);
        test_model(path, cases[i].kv, cases[i].tol);
    }
    /* Repacked experts with a shared expert (decode runs all selected experts
     * and the shared one in two parallel regions, a few tokens all their
     * experts in two calls of grouped products): DeepSeek-shaped files written
     * here (experts differ: a pool of repeated rows would hide a wrong
     * expert), Q8_0 and the Q4_K_M mix of types; and gpt-oss's MXFP4 experts. */
    const struct {
        const char *shape;
        synth_ftype type;
    } synths[] = {{"tiny-deepseek2", SYNTH_Q8_0},
                  {"tiny-deepseek2", SYNTH_Q4_K_M},
                  {"tiny-gpt-oss", SYNTH_MXFP4_MOE}};
    for (size_t i = 0; i < sizeof synths / sizeof synths[0]; i++) {
        char tmp[] = "/tmp/kvllm-test-attn-XXXXXX";
        const int fd = mkstemp(tmp);
        kvl_error err = {{0}};
        const bool ok = fd >= 0 && synth_write(synth_shape_find(synths[i].shape), synths[i].type, 7,
                                               0, tmp, NULL, NULL, &err);
        EXPECT(ok, "synth %s %s: %s", synths[i].shape, synth_ftype_name(synths[i].type), err.msg);
        if (ok) test_model(tmp, GGUF_DT_F16, -1);
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
    }
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
