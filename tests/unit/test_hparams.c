/* The one hyperparameter reader (model/hparams.h) and its two users agree:
 *  - for every vendored GGUF, the KV planner's bytes per token (through
 *    model_hparams_plan_model) equal the bytes per token of the pools the
 *    loaded model asks for, for every KV type, and the planner's KV groups are
 *    the model's (window, layers);
 *  - for the config.json fixtures, the planner's figure equals the per-layer
 *    layout the model derives from the same struct;
 *  - the two shapes the planner and the model used to read differently, as
 *    llama.cpp reads them: an array-valued sliding_window_pattern (one flag per
 *    layer: the model loads it, its KV groups follow the flags, the flags of
 *    pattern 2 give bit-identical logits to the scalar 2; a wrong length is
 *    refused by both), and a DeepSeek-V2 file without key_length_mla /
 *    value_length_mla (plain multi-head attention with its KV heads: planned
 *    as that cache, and the model runs it so, computing what the absorbed form
 *    of the same weights computes, up to rounding).
 * The modified files are the golden ones rewritten with other metadata. Run
 * from the source root (CTest does). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_plan.h"
#include "model.h"

#include "check.h"

#define GOLDEN "tests/data/golden/models/"

static const char *const GGUFS[] = {
    "models/stories260K.gguf", GOLDEN "llama-gqa-bpe-f32.gguf", GOLDEN "llama-gqa-bpe-q8_0.gguf",
    GOLDEN "qwen3-f32.gguf",   GOLDEN "gemma3-swa-f32.gguf",    GOLDEN "deepseek2-mla-f32.gguf",
    GOLDEN "llama4-f32.gguf"};
static const char *const CONFIGS[] = {
    "deepseek-v3.json",     "llama-2-7b.json", "llama-3-70b.json",           "llama-3-8b.json",
    "mistral-7b-v0.1.json", "qwen3-32b.json",  "synthetic-layer-types.json", "gpt-oss-20b.json",
    "llama4-scout.json"};

static model *load(const char *path, kvl_error *err) {
    gguf_file *f = gguf_open(path, err);
    model_params mp = {.max_ctx = 64, .max_ubatch = 64, .no_repack = true};
    return f ? model_load(f, &mp, err) : NULL;
}

static bool plan_of(const model_hparams *hp, int dtype, kv_plan_model *pm, kv_plan *p) {
    kvl_error err = {{0}};
    kv_plan_request r = {.context = 100, .concurrency = 1, .dtype = dtype, .block_size = 16};
    return model_hparams_plan_model(hp, pm, &err) && kv_plan_compute(pm, &r, p, &err);
}

/* ------------------------------------------------ planner == model -- */

/* Bytes per token of the model's pools with K/V stored as pool dtype dt; 0
 * when a pool refuses the rows. */
static uint64_t model_pool_bytes_per_token(const model *m, int dt) {
    uint64_t sum = 0;
    for (int g = 0; g < model_kv_n_groups(m); g++) {
        kv_pool_config c = {0};
        model_kv_group_shape(m, g, &c, NULL);
        c.block_size = 16;
        c.dtype = dt;
        c.n_blocks = 1;
        kvl_error err;
        kv_pool *p = kv_pool_create(&c, &err);
        if (!p) return 0;
        sum += kv_pool_geometry(p)->token_bytes;
        kv_pool_destroy(p);
    }
    return sum;
}

static void test_gguf_agree(const char *path) {
    kvl_error err = {{0}};
    model *m = load(path, &err);
    if (!m) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        failures++;
        return;
    }
    const model_hparams *hp = model_hp(m);
    for (int d = 0; d < KV_PLAN_DTYPE_COUNT; d++) {
        kv_plan_model pm;
        kv_plan p;
        bool planned = plan_of(hp, d, &pm, &p);
        uint64_t pool = model_pool_bytes_per_token(m, kv_plan_pool_dtype(d));
        /* Both give the same bytes, or both refuse the row (q8_0 of 48 values). */
        if (planned ? p.bytes_per_token != pool : pool != 0) {
            fprintf(stderr, "%s (%s): planner %llu B/token, model pools %llu\n", path,
                    kv_plan_dtype_name(d), planned ? (unsigned long long)p.bytes_per_token : 0ull,
                    (unsigned long long)pool);
            failures++;
        }
        if (!planned) continue;
        kv_plan_request r = {.context = 100, .concurrency = 1, .dtype = d, .block_size = 16};
        kv_plan_group groups[KV_PLAN_MAX_GROUPS];
        int n = kv_plan_pool_groups(&pm, &r, groups, &err);
        CHECK(n == model_kv_n_groups(m));
        for (int g = 0; g < model_kv_n_groups(m); g++) {
            kv_pool_config c = {0};
            kv_attn a = {-1, -1};
            model_kv_group_shape(m, g, &c, &a);
            bool found = false;
            for (int k = 0; k < n; k++)
                found = found || (groups[k].window == a.window && groups[k].chunk == a.chunk &&
                                  groups[k].cfg.n_layers == c.n_layers &&
                                  groups[k].cfg.head_dim_k == c.head_dim_k &&
                                  groups[k].cfg.head_dim_v == c.head_dim_v &&
                                  groups[k].cfg.n_kv_heads == c.n_kv_heads);
            if (!found)
                fprintf(stderr,
                        "%s: model KV group %d (window %d, chunk %d) is not the planner's\n", path,
                        g, a.window, a.chunk);
            CHECK(found);
        }
    }
    model_destroy(m);
}

static void test_config_agree(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/kv_plan/%s", name);
    kvl_error err = {{0}};
    char *text = kvl_read_file(path, NULL, &err);
    model_hparams *hp = malloc(sizeof *hp);
    kv_plan_model pm;
    kv_plan p;
    bool ok = text && hp && model_hparams_from_hf_config(text, hp, &err) &&
              plan_of(hp, KV_PLAN_F16, &pm, &p);
    if (!ok) fprintf(stderr, "%s: %s\n", path, err.msg);
    CHECK(ok);
    if (ok) {
        uint64_t sum = 0;
        int64_t sliding = 0, chunked = 0;
        for (int64_t il = 0; il < hp->n_layer; il++) {
            int64_t k, v, w;
            model_hparams_layer_kv(hp, il, &k, &v, &w);
            sum += kv_row_bytes(GGUF_DT_F16, k) + (v ? kv_row_bytes(GGUF_DT_F16, v) : 0);
            sliding += w > 0;
            chunked += hp->chunk_layers[il] != 0;
            CHECK(w == 0 || w == pm.sliding_window);
        }
        CHECK(chunked == pm.n_chunk_layers && (chunked == 0 || pm.attn_chunk == hp->n_chunk));
        if (sum != p.bytes_per_token)
            fprintf(stderr, "%s: planner %llu B/token, model layout %llu\n", path,
                    (unsigned long long)p.bytes_per_token, (unsigned long long)sum);
        CHECK(sum == p.bytes_per_token);
        CHECK(sliding == pm.n_swa_layers);
    }
    free(hp);
    free(text);
}

/* ------------------------------------------- rewritten golden files -- */

typedef struct edit {
    const char *drop[4]; /* keys left out */
    const char *arr_key; /* a bool array added (NULL: none) */
    const uint8_t *arr;
    uint64_t arr_n;
    const char *u32_key[2]; /* uint32 keys set */
    uint32_t u32[2];
    const char *f32_key[4]; /* float keys set */
    float f32[4];
    const char *drop_tensor[2]; /* tensors left out: names ending so */
    int n_add;                  /* f32 tensors added: name, [ne0, ne1], data */
    char add_name[8][64];
    int64_t add_ne[8][2];
    const float *add_data[8];
} edit;

static bool tensor_dropped(const edit *e, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < 2 && e->drop_tensor[i]; i++) {
        size_t k = strlen(e->drop_tensor[i]);
        if (n >= k && strcmp(name + n - k, e->drop_tensor[i]) == 0) return true;
    }
    return false;
}

static bool dropped(const edit *e, const char *key) {
    for (int i = 0; i < 4 && e->drop[i]; i++)
        if (strcmp(e->drop[i], key) == 0) return true;
    return false;
}

/* Copies one scalar or numeric-array key of f into w (string arrays, the
 * tokenizer's, are not needed by the loader and are left out). */
static bool copy_key(const gguf_file *f, int64_t i, gguf_writer *w) {
    const char *key = gguf_key_name(f, i);
    gguf_vtype t = gguf_kv_type(f, i);
    if (t == GGUF_VT_ARRAY) {
        gguf_vtype et;
        uint64_t n;
        const void *data;
        if (!gguf_get_arr(f, key, &et, &n, &data)) return false;
        return et == GGUF_VT_STRING || gguf_writer_set_arr(w, key, et, data, n);
    }
    if (t == GGUF_VT_STRING) {
        char buf[256];
        return gguf_get_str_buf(f, key, buf, sizeof buf) && gguf_writer_set_str(w, key, buf);
    }
    if (t == GGUF_VT_FLOAT32) {
        float v;
        return gguf_get_f32(f, key, &v) && gguf_writer_set_f32(w, key, v);
    }
    if (t == GGUF_VT_UINT32) {
        uint32_t v;
        return gguf_get_u32(f, key, &v) && gguf_writer_set_u32(w, key, v);
    }
    return true; /* other scalar types: only the test oracle's keys use them */
}

/* src rewritten with e applied, at a new temporary path (returned in out). */
static bool rewrite(const char *src, const edit *e, char *out, size_t cap) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(src, &err);
    gguf_writer *w = gguf_writer_create();
    bool ok = f && w;
    for (int64_t i = 0; ok && i < gguf_n_kv(f); i++)
        if (!dropped(e, gguf_key_name(f, i))) ok = copy_key(f, i, w);
    for (int k = 0; ok && k < 2 && e->u32_key[k]; k++)
        ok = gguf_writer_set_u32(w, e->u32_key[k], e->u32[k]);
    for (int k = 0; ok && k < 4 && e->f32_key[k]; k++)
        ok = gguf_writer_set_f32(w, e->f32_key[k], e->f32[k]);
    if (ok && e->arr_key) ok = gguf_writer_set_arr(w, e->arr_key, GGUF_VT_BOOL, e->arr, e->arr_n);
    for (int64_t i = 0; ok && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (!tensor_dropped(e, t->name))
            ok = gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, t->data);
    }
    for (int i = 0; ok && i < e->n_add; i++)
        ok =
            gguf_writer_add_tensor(w, e->add_name[i], GGUF_DT_F32, 2, e->add_ne[i], e->add_data[i]);
    snprintf(out, cap, "/tmp/kvllm_test_hparams_%d.gguf", (int)getpid());
    ok = ok && gguf_writer_write(w, out, &err);
    if (!ok) fprintf(stderr, "rewrite %s: %s\n", src, err.msg[0] ? err.msg : "a key did not copy");
    gguf_writer_destroy(w);
    gguf_close(f);
    return ok;
}

/* Logits of n tokens of one sequence in one forward, every token wanted. */
static bool forward_all(model *m, int n, float *out) {
    kvl_error err;
    kv_pool *pools[MODEL_MAX_KV_GROUPS] = {0};
    kv_seq seqs[MODEL_MAX_KV_GROUPS];
    const kv_seq *tables[MODEL_MAX_KV_GROUPS];
    int32_t tok[64], pos[64], seq[64];
    uint8_t want[64];
    bool ok = n <= 64;
    int ng = model_kv_n_groups(m);
    for (int g = 0; g < ng; g++) {
        kv_pool_config c;
        model_kv_group_shape(m, g, &c, NULL);
        c.block_size = 16;
        c.dtype = GGUF_DT_F32;
        c.split_v = false;
        c.n_blocks = 8;
        kv_seq_init(&seqs[g]);
        tables[g] = &seqs[g];
        pools[g] = kv_pool_create(&c, &err);
        ok = ok && pools[g] && kv_seq_reserve(pools[g], &seqs[g], n);
    }
    for (int i = 0; i < n; i++) tok[i] = 3 + 37 * i % 4000, pos[i] = i, seq[i] = 0, want[i] = 1;
    model_batch b = {n, tok, pos, seq, want, 1, tables, NULL, NULL};
    ok = ok && model_forward(m, pools, &b, out, &err);
    for (int g = 0; g < ng; g++) {
        if (pools[g]) kv_seq_free(pools[g], &seqs[g]);
        kv_pool_destroy(pools[g]);
    }
    return ok;
}

#define GEMMA3  GOLDEN "gemma3-swa-f32.gguf"
#define SWA_KEY "gemma3.attention.sliding_window_pattern"

static void test_swa_array(void) {
    char path[128];
    kvl_error err = {{0}};
    /* The flags of pattern 2 (layers 0 and 2 slide): the same model, bit for bit. */
    static const uint8_t same[4] = {1, 0, 1, 0};
    edit e = {.drop = {SWA_KEY}, .arr_key = SWA_KEY, .arr = same, .arr_n = 4};
    CHECK(rewrite(GEMMA3, &e, path, sizeof path));
    model *a = load(GEMMA3, &err), *b = load(path, &err);
    if (!b) fprintf(stderr, "array sliding_window_pattern: %s\n", err.msg);
    CHECK(a && b);
    if (a && b) {
        CHECK(model_kv_n_groups(b) == 2 && model_hp(b)->n_swa_layers == 2);
        for (int il = 0; il < 4; il++)
            CHECK(model_hp(b)->swa_layers[il] == model_hp(a)->swa_layers[il]);
        const int n = 40; /* past the window of 16 */
        size_t bytes = (size_t)n * model_hp(a)->n_vocab * sizeof(float);
        float *la = malloc(bytes), *lb = malloc(bytes);
        CHECK(la && lb && forward_all(a, n, la) && forward_all(b, n, lb) &&
              memcmp(la, lb, bytes) == 0);
        free(la);
        free(lb);
        test_gguf_agree(path);
    }
    model_destroy(a);
    model_destroy(b);
    /* Flags no pattern gives: layers 1 and 2 slide. */
    static const uint8_t odd[4] = {0, 1, 1, 0};
    e.arr = odd;
    CHECK(rewrite(GEMMA3, &e, path, sizeof path));
    b = load(path, &err);
    CHECK(b != NULL);
    if (b) {
        const model_hparams *hp = model_hp(b);
        for (int il = 0; il < 4; il++) CHECK(hp->swa_layers[il] == odd[il]);
        kv_pool_config c;
        kv_attn w0, w1;
        model_kv_group_shape(b, 0, &c,
                             &w0); /* groups in order of first layer: full, then sliding */
        model_kv_group_shape(b, 1, &c, &w1);
        CHECK(model_kv_n_groups(b) == 2 && w0.window == 0 && w1.window == 16 && c.n_layers == 2);
        test_gguf_agree(path);
    }
    model_destroy(b);
    /* A wrong length: both users get the reader's refusal. */
    e.arr_n = 3;
    CHECK(rewrite(GEMMA3, &e, path, sizeof path));
    b = load(path, &err);
    CHECK(!b && strstr(err.msg, "expected one per layer (4)"));
    model_destroy(b);
    gguf_file *f = gguf_open(path, &err);
    model_hparams *hp = malloc(sizeof *hp);
    CHECK(f && hp && !model_hparams_from_gguf(f, hp, &err) && strstr(err.msg, SWA_KEY));
    free(hp);
    gguf_close(f);
    unlink(path);
}

/* deepseek2 as converted before llama.cpp's MLA rework: no _mla keys, one KV
 * head per query head of key_length (nope + rope) and value_length (v), and
 * the up-projection as one attn_kv_b per layer instead of attn_k_b / attn_v_b.
 * Made from the shipped (absorbed) golden model: kv_b's rows of head h are
 * k_b[h] transposed (nope rows of kv_lora) then v_b[h] (v rows). */
#define DS2 GOLDEN "deepseek2-mla-f32.gguf"

static float *kv_b_of(const gguf_file *f, int il, int64_t H, int64_t r, int64_t nope, int64_t vd) {
    char kn[64], vn[64];
    snprintf(kn, sizeof kn, "blk.%d.attn_k_b.weight", il);
    snprintf(vn, sizeof vn, "blk.%d.attn_v_b.weight", il);
    const gguf_tensor *kb = gguf_find_tensor(f, kn), *vb = gguf_find_tensor(f, vn);
    float *out = malloc((size_t)(H * (nope + vd) * r) * sizeof(float));
    if (!kb || !vb || !out || kb->dtype != GGUF_DT_F32 || vb->dtype != GGUF_DT_F32) {
        free(out);
        return NULL;
    }
    const float *k = kb->data, *v = vb->data; /* k_b {nope, r, H}, v_b {r, vd, H} */
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < r; i++) {
            for (int64_t j = 0; j < nope; j++)
                out[(h * (nope + vd) + j) * r + i] = k[(h * r + i) * nope + j];
            for (int64_t j = 0; j < vd; j++)
                out[(h * (nope + vd) + nope + j) * r + i] = v[(h * vd + j) * r + i];
        }
    return out;
}

static void test_deepseek_without_mla_keys(void) {
    char path[128];
    kvl_error err = {{0}};
    edit e = {.drop = {"deepseek2.attention.key_length_mla", "deepseek2.attention.value_length_mla",
                       "deepseek2.attention.head_count_kv"},
              .u32_key = {"deepseek2.attention.head_count_kv"},
              .u32 = {4},
              .drop_tensor = {"attn_k_b.weight", "attn_v_b.weight"},
              .n_add = 2};
    gguf_file *src = gguf_open(DS2, &err);
    float *kvb[2] = {NULL, NULL};
    for (int il = 0; src && il < 2; il++) { /* H 4, kv_lora 32, nope 32, v 32 */
        kvb[il] = kv_b_of(src, il, 4, 32, 32, 32);
        snprintf(e.add_name[il], sizeof e.add_name[il], "blk.%d.attn_kv_b.weight", il);
        e.add_ne[il][0] = 32;
        e.add_ne[il][1] = 4 * (32 + 32);
        e.add_data[il] = kvb[il];
    }
    CHECK(kvb[0] && kvb[1] && rewrite(DS2, &e, path, sizeof path));
    free(kvb[0]);
    free(kvb[1]);
    gguf_close(src);
    gguf_file *f = gguf_open(path, &err);
    model_hparams *hp = malloc(sizeof *hp);
    kv_plan_model pm;
    kv_plan p;
    CHECK(f && hp && model_hparams_from_gguf(f, hp, &err));
    if (f && hp) {
        CHECK(!hp->mla && hp->n_head_kv == 4 && hp->head_dim_k == 48 && hp->head_dim_v == 32);
        int64_t k, v, w;
        model_hparams_layer_kv(hp, 0, &k, &v, &w);
        CHECK(k == 4 * 48 && v == 4 * 32 && w == 0);
        /* llama.cpp's cache for it: 2 layers x 4 heads x (48 + 32) x 4 B */
        CHECK(plan_of(hp, KV_PLAN_F32, &pm, &p) && pm.kv_lora_rank == 0 &&
              p.bytes_per_token == 2 * 4 * 80 * 4);
    }
    free(hp);
    gguf_close(f);
    /* The model runs it (as llama.cpp does), with the planner's cache, and
     * computes what the absorbed form computes, up to rounding. */
    test_gguf_agree(path);
    model *a = load(DS2, &err), *b = load(path, &err);
    if (!b) fprintf(stderr, "uncompressed deepseek2: %s\n", err.msg);
    CHECK(a && b);
    if (a && b) {
        const int n = 40;
        const int64_t V = model_hp(a)->n_vocab;
        float *la = malloc((size_t)n * V * sizeof(float)),
              *lb = malloc((size_t)n * V * sizeof(float));
        bool ran = la && lb && forward_all(a, n, la) && forward_all(b, n, lb);
        CHECK(ran);
        double worst = 0, scale = 0;
        int argmax_differs = 0;
        for (int t = 0; ran && t < n; t++) {
            int64_t ia = 0, ib = 0;
            for (int64_t i = 0; i < V; i++) {
                float x = la[t * V + i], y = lb[t * V + i];
                worst = fabs(x - y) > worst ? fabs(x - y) : worst;
                scale = fabs(x) > scale ? fabs(x) : scale;
                ia = x > la[t * V + ia] ? i : ia;
                ib = y > lb[t * V + ib] ? i : ib;
            }
            argmax_differs += ia != ib;
        }
        printf("deepseek2 uncompressed vs absorbed: max |logit diff| %.3g (largest |logit| %.3g), "
               "argmax differs at %d of %d\n",
               worst, scale, argmax_differs, n);
        CHECK(ran && worst <= 1e-4 * scale && argmax_differs == 0);
        free(la);
        free(lb);
    }
    model_destroy(a);
    model_destroy(b);
    unlink(path);
    /* The file as shipped: MLA, the latent + RoPE key (48 values) per layer. */
    f = gguf_open(DS2, &err);
    hp = malloc(sizeof *hp);
    CHECK(f && hp && model_hparams_from_gguf(f, hp, &err) && hp->mla &&
          plan_of(hp, KV_PLAN_F32, &pm, &p) && p.bytes_per_token == 2 * 48 * 4);
    free(hp);
    gguf_close(f);
}

/* Expert counts under transformers' names (DeepSeek-V3's published config). */
static void test_moe_config(void) {
    kvl_error err = {{0}};
    char *text = kvl_read_file("tests/kv_plan/deepseek-v3.json", NULL, &err);
    model_hparams *hp = malloc(sizeof *hp);
    bool ok = text && hp && model_hparams_from_hf_config(text, hp, &err);
    if (!ok) fprintf(stderr, "deepseek-v3.json: %s\n", err.msg);
    CHECK(ok);
    if (ok) {
        const model_moe_hparams *mo = &hp->moe;
        CHECK(mo->n_expert == 256 && mo->n_expert_used == 8);
        CHECK(mo->n_ff_exp == 2048 && mo->n_ff_shexp == 2048); /* one shared expert */
        CHECK(mo->n_layer_dense_lead == 3 && mo->n_layer_moe == 58);
        CHECK(mo->gating == MODEL_MOE_SIGMOID && mo->n_group == 8 && mo->n_group_used == 4);
        CHECK(mo->weights_norm && mo->weights_scale == 2.5f);
    }
    free(hp);
    free(text);
    /* gpt-oss and llama4 (nested text_config): experts intermediate_size wide */
    static const struct {
        const char *path;
        int64_t n_expert, used, ff_exp, ff_shexp, n_ff, step, n_moe, swa_layers, chunk_layers;
    } more[] = {{"tests/kv_plan/gpt-oss-20b.json", 32, 4, 2880, 0, 2880, 0, 24, 12, 0},
                /* llama4: all but every 4th layer (no_rope_layers empty) chunked */
                {"tests/kv_plan/llama4-scout.json", 16, 1, 8192, 8192, 16384, 1, 48, 0, 36}};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        char *t = kvl_read_file(more[i].path, NULL, &err);
        model_hparams *h = malloc(sizeof *h);
        const bool good = t && h && model_hparams_from_hf_config(t, h, &err);
        if (!good) fprintf(stderr, "%s: %s\n", more[i].path, err.msg);
        CHECK(good);
        if (good) {
            const model_moe_hparams *mo = &h->moe;
            CHECK(mo->n_expert == more[i].n_expert && mo->n_expert_used == more[i].used);
            CHECK(mo->n_ff_exp == more[i].ff_exp && mo->n_ff_shexp == more[i].ff_shexp &&
                  h->n_ff == more[i].n_ff);
            CHECK(mo->layer_step == more[i].step && mo->n_layer_moe == more[i].n_moe);
            CHECK(h->n_swa_layers == more[i].swa_layers);
            CHECK(h->n_chunk_layers == more[i].chunk_layers &&
                  (h->n_chunk_layers == 0 || (h->n_chunk == 8192 && !h->chunk_layers[3] &&
                                              h->chunk_layers[0] && h->chunk_layers[46])));
        }
        free(h);
        free(t);
    }
    /* used > count is malformed, named by its config.json key */
    const char *bad =
        "{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":2,\"num_attention_heads\":4,"
        "\"hidden_size\":64,\"intermediate_size\":128,\"num_experts\":4,\"num_experts_per_tok\":5}";
    model_hparams *h2 = malloc(sizeof *h2);
    CHECK(h2 && !model_hparams_from_hf_config(bad, h2, &err) &&
          strstr(err.msg, "'num_experts_per_tok' = 5"));
    free(h2);
}

/* The bytes a token reads: from the layer shapes (F32 experts of n_embd x
 * n_ff_exp, three matrices each), not from tensor names. */
static void test_moe_gguf_bytes(void) {
    kvl_error err = {{0}};
    model *m = load(GOLDEN "qwen3moe-f32.gguf", &err);
    CHECK(m != NULL);
    if (!m) return;
    const model_hparams *hp = model_hp(m);
    const model_moe_hparams *mo = &hp->moe;
    const uint64_t per_expert = 3ull * (uint64_t)hp->n_embd * (uint64_t)mo->n_ff_exp * 4;
    CHECK(mo->expert_bytes == per_expert * (uint64_t)mo->n_expert * (uint64_t)mo->n_layer_moe);
    uint64_t unread =
        per_expert * (uint64_t)(mo->n_expert - mo->n_expert_used) * (uint64_t)mo->n_layer_moe;
    if (!hp->tied_output) unread += (uint64_t)(hp->n_vocab - 1) * (uint64_t)hp->n_embd * 4;
    CHECK(mo->active_bytes == hp->weights_bytes - unread);
    model_destroy(m);
}

/* llama.cpp reads rope.scaling.yarn_beta_fast / _slow only in some loaders (of
 * kvllm's families, mistral3's) and yarn_ext_factor / yarn_attn_factor in none of
 * kvllm's: a deepseek2 file carrying all four runs as it would without them; a
 * mistral3 file takes the betas and ignores the other two. */
static void test_yarn_keys_per_family(void) {
    static const char *const SRC[2] = {GOLDEN "deepseek2-yarn-f32.gguf",
                                       GOLDEN "mistral3-f32.gguf"};
    static const char *const ARCH[2] = {"deepseek2", "mistral3"};
    static const char *const KEY[4] = {"yarn_beta_fast", "yarn_beta_slow", "yarn_ext_factor",
                                       "yarn_attn_factor"};
    for (int i = 0; i < 2; i++) {
        char keys[4][96], path[128];
        edit e = {.f32 = {8.0f, 4.0f, 0.5f, 2.0f}};
        for (int k = 0; k < 4; k++) {
            snprintf(keys[k], sizeof keys[k], "%s.rope.scaling.%s", ARCH[i], KEY[k]);
            e.drop[k] = e.f32_key[k] = keys[k];
        }
        CHECK(rewrite(SRC[i], &e, path, sizeof path));
        kvl_error err = {{0}};
        gguf_file *fa = gguf_open(SRC[i], &err), *fb = gguf_open(path, &err);
        model_hparams *a = malloc(sizeof *a), *b = malloc(sizeof *b);
        CHECK(fa && fb && a && b && model_hparams_from_gguf(fa, a, &err) &&
              model_hparams_from_gguf(fb, b, &err));
        if (fa && fb && a && b) {
            const model_rope_yarn *ya = &a->rope_yarn, *yb = &b->rope_yarn;
            CHECK(ya->yarn && yb->yarn && yb->ext_factor == ya->ext_factor &&
                  yb->attn_factor == ya->attn_factor && yb->log_mul == ya->log_mul);
            if (i == 0) CHECK(yb->beta_fast == 32.0f && yb->beta_slow == 1.0f);
            else CHECK(yb->beta_fast == 8.0f && yb->beta_slow == 4.0f);
        }
        free(a);
        free(b);
        gguf_close(fa);
        gguf_close(fb);
        unlink(path);
    }
}

/* llama4 as llama.cpp's loader sets it up: chunks of 8192 on the sliding-window
 * pattern's layers (default 4), NoPE with temperature on every 4th (the chunked
 * layers are a KV group of their own: test_window); attention.sliding_window = 0 turns chunks and
 * temperature off and leaves only the last layer without rope; a pattern key
 * moves the chunks; 128 experts (Maverick) drop the q/k L2 norm. */
static void test_llama4(void) {
    static const char *const SRC = GOLDEN "llama4-f32.gguf";
    struct {
        edit e;
        int64_t chunk, nope;
        uint8_t layers[4];
        bool l2;
    } cases[] = {
        {{.drop = {NULL}}, 8192, 4, {1, 1, 1, 0}, true},
        {{.u32_key = {"llama4.attention.sliding_window"}, .u32 = {0}}, 0, 4, {0, 0, 0, 0}, true},
        {{.u32_key = {"llama4.attention.sliding_window_pattern"}, .u32 = {2}},
         8192,
         4,
         {1, 0, 1, 0},
         true},
        {{.u32_key = {"llama4.expert_count"}, .u32 = {128}}, 8192, 4, {1, 1, 1, 0}, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[128];
        kvl_error err = {{0}};
        CHECK(rewrite(SRC, &cases[i].e, path, sizeof path));
        gguf_file *f = gguf_open(path, &err);
        model_hparams *hp = malloc(sizeof *hp);
        const bool ok = f && hp && model_hparams_from_gguf(f, hp, &err);
        if (!ok) fprintf(stderr, "llama4 case %zu: %s\n", i, err.msg);
        CHECK(ok);
        if (ok) {
            CHECK(hp->n_chunk == cases[i].chunk && hp->n_nope_step == cases[i].nope &&
                  hp->n_swa == 0 && hp->n_swa_layers == 0 && hp->kq_l2_norm == cases[i].l2);
            for (int il = 0; il < 4; il++) CHECK(hp->chunk_layers[il] == cases[i].layers[il]);
            CHECK(cases[i].chunk ? hp->nope_temp_scale == 0.1f && hp->nope_temp_floor == 8192.0f &&
                                       hp->nope_temp_offset == 1.0f
                                 : hp->nope_temp_scale == 0.0f);
            CHECK(hp->moe.layer_step == 2 && hp->moe.n_layer_moe == 2 && hp->moe.weight_input &&
                  hp->moe.n_ff_shexp == hp->moe.n_ff_exp && hp->moe.gating == MODEL_MOE_SIGMOID);
        }
        free(hp);
        gguf_close(f);
        unlink(path);
    }
}

int main(void) {
    for (size_t i = 0; i < sizeof GGUFS / sizeof GGUFS[0]; i++) test_gguf_agree(GGUFS[i]);
    for (size_t i = 0; i < sizeof CONFIGS / sizeof CONFIGS[0]; i++) test_config_agree(CONFIGS[i]);
    test_swa_array();
    test_deepseek_without_mla_keys();
    test_moe_config();
    test_moe_gguf_bytes();
    test_yarn_keys_per_family();
    test_llama4();
    if (failures) {
        fprintf(stderr, "test_hparams: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_hparams: ok\n");
    return 0;
}
