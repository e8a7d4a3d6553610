/* hparams: the one reader of model shape (GGUF metadata, config.json). See hparams.h. */
#include "hparams.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"

#define MAX_HEADS 65536
#define MAX_WINDOW (1 << 24)

static void hparams_init(model_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_ctx_train = 2048;
    hp->rope_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    hp->rms_eps = 1e-5f;
    hp->param_dtype = -1;
}

/* The sliding-window pattern length of a family whose files may not carry one:
 * the architecture table's, under its GGUF name or a config.json model_type
 * naming the same family; cohere2 is planned but not run by kvllm. */
static int64_t default_swa_pattern(const char *arch) {
    static const char *const ALIASES[][2] = {{"gemma3_text", "gemma3"}};
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (strcmp(arch, ALIASES[i][0]) == 0) arch = ALIASES[i][1];
    const arch_desc *a = arch_find(arch);
    if (a) return a->swa_pattern;
    return strcmp(arch, "cohere2") == 0 ? 4 : 0;
}

/* llama.cpp's set_swa_pattern(n): layer il slides iff n == 0 or il % n < n - 1. */
static void set_swa_pattern(model_hparams *hp, int64_t n) {
    for (int64_t il = 0; il < hp->n_layer; il++) hp->swa_layers[il] = n <= 0 || il % n < n - 1;
}

/* Counts the sliding layers; no window means none. */
static void finish_swa(model_hparams *hp) {
    hp->n_swa_layers = 0;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        if (hp->n_swa == 0) hp->swa_layers[il] = 0;
        hp->n_swa_layers += hp->swa_layers[il] != 0;
    }
}

/* ------------------------------------------------------------------ GGUF -- */

/* An integer per layer that kvllm needs uniform: a scalar, or an array whose
 * entries all agree (some files store per-layer head counts). 0: absent,
 * 1: read, -1: error. */
static int gguf_uniform(const gguf_file *f, const char *arch, const char *name, int64_t *out,
                        kvl_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    int64_t idx = gguf_find_key(f, key);
    if (idx < 0) return 0;
    gguf_vtype et;
    uint64_t n;
    if (!gguf_kv_array(f, idx, &et, &n)) {
        if (gguf_get_i64(f, key, out)) return 1;
        kvl_fail(err, "%s: key '%s': expected an integer", gguf_path(f), key);
        return -1;
    }
    if (n == 0) {
        kvl_fail(err, "%s: key '%s' is an empty array", gguf_path(f), key);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        if (!gguf_get_arr_i64(f, key, i, &v)) {
            kvl_fail(err, "%s: key '%s': entry %llu is not an integer", gguf_path(f), key,
                     (unsigned long long)i);
            return -1;
        }
        if (i > 0 && v != *out) {
            kvl_fail(err, "%s: key '%s' differs between layers (%lld, then %lld at layer %llu); "
                     "per-layer values are not supported", gguf_path(f), key, (long long)*out,
                     (long long)v, (unsigned long long)i);
            return -1;
        }
        *out = v;
    }
    return 1;
}

static bool gguf_opt(const gguf_file *f, const char *arch, const char *name, int64_t *out,
                     kvl_error *err) {
    return gguf_uniform(f, arch, name, out, err) >= 0;
}

static bool gguf_req(const gguf_file *f, const char *arch, const char *name, int64_t *out,
                     kvl_error *err) {
    int r = gguf_uniform(f, arch, name, out, err);
    if (r == 0) kvl_fail(err, "%s: key '%s.%s' missing", gguf_path(f), arch, name);
    return r > 0;
}

static void gguf_float(const gguf_file *f, const char *arch, const char *name, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    gguf_get_f32(f, key, out);
}

/* Which layers slide: attention.sliding_window_pattern as per-layer flags (an
 * array of block_count entries) or a pattern length; else the family's. */
static bool gguf_swa_layers(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch);
    int64_t idx = gguf_find_key(f, key), n = default_swa_pattern(hp->arch);
    gguf_vtype et;
    uint64_t count;
    if (idx >= 0 && gguf_kv_array(f, idx, &et, &count)) {
        if (count != (uint64_t)hp->n_layer)
            return kvl_fail(err, "%s: key '%s' has %llu entries, expected one per layer (%lld)",
                            gguf_path(f), key, (unsigned long long)count, (long long)hp->n_layer);
        for (uint64_t i = 0; i < count; i++) {
            int64_t v;
            if (!gguf_get_arr_i64(f, key, i, &v))
                return kvl_fail(err, "%s: key '%s': entry %llu is not a flag", gguf_path(f), key,
                                (unsigned long long)i);
            hp->swa_layers[i] = v != 0;
        }
        return true;
    }
    if (idx >= 0 && (!gguf_get_i64(f, key, &n) || n < 0))
        return kvl_fail(err, "%s: key '%s' is not a pattern length", gguf_path(f), key);
    set_swa_pattern(hp, n);
    return true;
}

/* MLA as llama.cpp decides it: the file carries key_length_mla and
 * value_length_mla (is_mla); the cache then holds the latent + RoPE key. */
static bool gguf_mla(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    const char *a = hp->arch;
    int64_t k_mla = 0, v_mla = 0;
    if (!gguf_opt(f, a, "attention.kv_lora_rank", &hp->kv_lora_rank, err) ||
        !gguf_opt(f, a, "attention.q_lora_rank", &hp->q_lora_rank, err) ||
        !gguf_opt(f, a, "attention.key_length_mla", &k_mla, err) ||
        !gguf_opt(f, a, "attention.value_length_mla", &v_mla, err))
        return false;
    hp->mla = k_mla > 0 && v_mla > 0;
    if (!hp->mla) {
        /* A latent projection without the _mla keys: the uncompressed form,
         * whose per-head widths are the cached ones. */
        if (hp->kv_lora_rank > 0) {
            hp->n_rot_mla_nope = hp->head_dim_k - hp->n_rot;
            hp->v_head_dim_mla = hp->head_dim_v;
        }
        return true;
    }
    if (hp->kv_lora_rank <= 0)
        return kvl_fail(err, "%s: key '%s.attention.key_length_mla' given without a kv_lora_rank", gguf_path(f), a);
    int64_t rope = 0;
    if (!gguf_req(f, a, "rope.dimension_count", &rope, err)) return false; /* the latent's RoPE part */
    hp->n_rot_mla_nope = k_mla - hp->n_rot;
    hp->v_head_dim_mla = v_mla;
    return true;
}

static bool gguf_range(const gguf_file *f, const model_hparams *hp, kvl_error *err) {
    if (hp->n_layer < 1 || hp->n_layer > MODEL_MAX_LAYERS)
        return kvl_fail(err, "%s: key '%s.block_count' = %lld: must be 1..%d", gguf_path(f), hp->arch,
                        (long long)hp->n_layer, MODEL_MAX_LAYERS);
    if (hp->n_head < 1 || hp->n_head > MAX_HEADS)
        return kvl_fail(err, "%s: key '%s.attention.head_count' = %lld: must be 1..%d", gguf_path(f),
                        hp->arch, (long long)hp->n_head, MAX_HEADS);
    const int64_t *dims[] = {&hp->n_embd, &hp->n_ff, &hp->n_head_kv, &hp->head_dim_k, &hp->head_dim_v,
                             &hp->n_rot, &hp->n_ctx_train, &hp->kv_lora_rank, &hp->q_lora_rank};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (*dims[i] < 0) return kvl_fail(err, "%s: negative hyperparameter (%lld)", gguf_path(f), (long long)*dims[i]);
    if (hp->n_swa < 0 || hp->n_swa > MAX_WINDOW)
        return kvl_fail(err, "%s: sliding window %lld out of range", gguf_path(f), (long long)hp->n_swa);
    return true;
}

static bool gguf_shape(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    const char *a = hp->arch;
    if (!gguf_req(f, a, "block_count", &hp->n_layer, err) ||
        !gguf_req(f, a, "attention.head_count", &hp->n_head, err) ||
        !gguf_opt(f, a, "embedding_length", &hp->n_embd, err) ||
        !gguf_opt(f, a, "feed_forward_length", &hp->n_ff, err) ||
        !gguf_opt(f, a, "attention.head_count_kv", &hp->n_head_kv, err) ||
        !gguf_opt(f, a, "attention.key_length", &hp->head_dim_k, err) ||
        !gguf_opt(f, a, "attention.value_length", &hp->head_dim_v, err) ||
        !gguf_opt(f, a, "rope.dimension_count", &hp->n_rot, err) ||
        !gguf_opt(f, a, "context_length", &hp->n_ctx_train, err) ||
        !gguf_opt(f, a, "attention.sliding_window", &hp->n_swa, err))
        return false;
    hp->n_layer_dense_lead = hp->n_layer;
    if (!gguf_opt(f, a, "leading_dense_block_count", &hp->n_layer_dense_lead, err) ||
        !gguf_range(f, hp, err))
        return false;
    /* llama.cpp's defaults */
    if (hp->n_head_kv == 0) hp->n_head_kv = hp->n_head;
    if (hp->head_dim_k == 0) hp->head_dim_k = hp->n_embd / hp->n_head;
    if (hp->head_dim_v == 0) hp->head_dim_v = hp->n_embd / hp->n_head;
    if (hp->n_rot == 0) hp->n_rot = hp->head_dim_k;
    return true;
}

static void gguf_floats(const gguf_file *f, model_hparams *hp) {
    const char *a = hp->arch;
    gguf_float(f, a, "rope.freq_base", &hp->rope_base);
    gguf_float(f, a, "rope.freq_base_swa", &hp->rope_base_swa);
    gguf_float(f, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    gguf_float(f, a, "attn_logit_softcapping", &hp->attn_softcap);
    gguf_float(f, a, "final_logit_softcapping", &hp->final_softcap);
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    gguf_get_str_buf(f, key, hp->rope_scaling, sizeof hp->rope_scaling);
    float factor = 0;
    gguf_float(f, a, "rope.scaling.factor", &factor);
    if (strcmp(hp->rope_scaling, "linear") == 0 && factor > 0) hp->rope_freq_scale = 1.0f / factor;
}

bool model_hparams_from_gguf(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    hparams_init(hp);
    if (!gguf_get_str_buf(f, "general.architecture", hp->arch, sizeof hp->arch))
        return kvl_fail(err, "%s: key 'general.architecture' missing", gguf_path(f));
    const arch_desc *ad = arch_find(hp->arch);
    hp->rope_type = ad ? ad->rope_type : 0;
    if (!gguf_shape(f, hp, err)) return false;
    gguf_floats(f, hp);
    if (!gguf_mla(f, hp, err)) return false;
    if (hp->n_swa > 0 && !gguf_swa_layers(f, hp, err)) return false;
    finish_swa(hp);
    hp->weights_bytes = gguf_tensor_data_bytes(f);
    return true;
}

/* ----------------------------------------------------------- config.json -- */

/* An integer field: 0 absent or null, 1 read, -1 present but not a whole number. */
static int hf_int(const cJSON *o, const char *name, int64_t *out, kvl_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!j || cJSON_IsNull(j)) return 0;
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!(d >= 0 && d <= 9007199254740992.0 && d == floor(d))) {
        kvl_fail(err, "config.json: '%s' is not a non-negative whole number", name);
        return -1;
    }
    *out = (int64_t)d;
    return 1;
}

/* The first of up to three names present (aliases used by different families). */
static int hf_int_any(const cJSON *o, const char *const names[3], int64_t *out, kvl_error *err) {
    for (int i = 0; i < 3 && names[i]; i++) {
        int r = hf_int(o, names[i], out, err);
        if (r != 0) return r;
    }
    return 0;
}

/* A field that must be there: false with "missing" or the type error. */
static bool hf_need(int r, const char *name, kvl_error *err) {
    return r > 0 || (r == 0 && kvl_fail(err, "config.json: missing %s", name));
}

static bool hf_heads(const cJSON *o, model_hparams *hp, kvl_error *err) {
    static const char *const LAYERS[3] = {"num_hidden_layers", "n_layer", "num_layers"};
    static const char *const HEADS[3] = {"num_attention_heads", "n_head", NULL};
    static const char *const EMBD[3] = {"hidden_size", "n_embd", "d_model"};
    if (!hf_need(hf_int_any(o, LAYERS, &hp->n_layer, err), "num_hidden_layers", err) ||
        !hf_need(hf_int_any(o, HEADS, &hp->n_head, err), "num_attention_heads", err))
        return false;
    if (hp->n_head == 0) return kvl_fail(err, "config.json: num_attention_heads is 0");
    if (hp->n_layer < 1 || hp->n_layer > MODEL_MAX_LAYERS)
        return kvl_fail(err, "config.json: num_hidden_layers %lld: must be 1..%d", (long long)hp->n_layer,
                        MODEL_MAX_LAYERS);
    hp->n_head_kv = hp->n_head; /* HF: absent num_key_value_heads means MHA */
    if (hf_int(o, "num_key_value_heads", &hp->n_head_kv, err) < 0 ||
        hf_int_any(o, EMBD, &hp->n_embd, err) < 0 || hf_int(o, "intermediate_size", &hp->n_ff, err) < 0 ||
        hf_int(o, "max_position_embeddings", &hp->n_ctx_train, err) < 0)
        return false;
    hp->head_dim_k = hp->n_embd / hp->n_head;
    int r = hf_int(o, "head_dim", &hp->head_dim_k, err);
    if (r < 0) return false;
    if (r == 0 && (hp->n_embd == 0 || hp->n_embd % hp->n_head))
        return kvl_fail(err, "config.json: no head_dim, and hidden_size %lld is not a multiple of "
                        "%lld heads", (long long)hp->n_embd, (long long)hp->n_head);
    hp->head_dim_v = hp->head_dim_k;
    hp->n_rot = hp->head_dim_k;
    hp->n_layer_dense_lead = hp->n_layer;
    return true;
}

/* DeepSeek's MLA, in the form llama.cpp's converter writes it: one cached
 * "head" of kv_lora_rank + qk_rope_head_dim (K) and kv_lora_rank (V); the
 * attention it stands for has per-head K of qk_nope + qk_rope, V of v_head_dim. */
static bool hf_mla(const cJSON *o, model_hparams *hp, kvl_error *err) {
    if (hf_int(o, "kv_lora_rank", &hp->kv_lora_rank, err) < 0) return false;
    if (hp->kv_lora_rank == 0) return true;
    hp->mla = true;
    if (!hf_need(hf_int(o, "qk_rope_head_dim", &hp->n_rot, err), "qk_rope_head_dim (MLA)", err))
        return false;
    if (hf_int(o, "qk_nope_head_dim", &hp->n_rot_mla_nope, err) < 0 ||
        hf_int(o, "v_head_dim", &hp->v_head_dim_mla, err) < 0 ||
        hf_int(o, "q_lora_rank", &hp->q_lora_rank, err) < 0)
        return false;
    hp->n_head_kv = 1;
    hp->head_dim_k = hp->kv_lora_rank + hp->n_rot;
    hp->head_dim_v = hp->kv_lora_rank;
    return true;
}

/* Which layers slide, in the order transformers itself decides it: an explicit
 * layer_types list; use_sliding_window false (Qwen2) disables the window;
 * Qwen2's max_window_layers (layers from that one on slide); a pattern length;
 * the family's default pattern. */
static bool hf_swa(const cJSON *o, model_hparams *hp, kvl_error *err) {
    int64_t pattern = default_swa_pattern(hp->arch), mwl = -1;
    if (hf_int(o, "sliding_window", &hp->n_swa, err) < 0) return false;
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "use_sliding_window"))) hp->n_swa = 0;
    if (hp->n_swa > MAX_WINDOW)
        return kvl_fail(err, "config.json: sliding_window %lld out of range", (long long)hp->n_swa);
    if (hp->n_swa == 0) return true;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (cJSON_IsArray(types)) {
        if (cJSON_GetArraySize(types) != hp->n_layer)
            return kvl_fail(err, "config.json: layer_types has %d entries, expected one per layer (%lld)",
                            cJSON_GetArraySize(types), (long long)hp->n_layer);
        int64_t il = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, types) hp->swa_layers[il++] =
            cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
        return true;
    }
    if (hf_int(o, "sliding_window_pattern", &pattern, err) < 0 || hf_int(o, "max_window_layers", &mwl, err) < 0)
        return false;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "use_sliding_window")) && mwl >= 0)
        for (int64_t il = 0; il < hp->n_layer; il++) hp->swa_layers[il] = il >= mwl;
    else
        set_swa_pattern(hp, pattern);
    return true;
}

/* torch_dtype (newer files: dtype): the weights' type, and the KV type servers
 * default to ("auto": the model's). */
static void hf_dtype(const cJSON *o, model_hparams *hp) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "torch_dtype");
    if (!cJSON_IsString(d)) d = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    if (!cJSON_IsString(d)) return;
    const char *s = d->valuestring;
    if (strcmp(s, "bfloat16") == 0) hp->param_dtype = GGUF_DT_BF16;
    else if (strcmp(s, "float16") == 0) hp->param_dtype = GGUF_DT_F16;
    else if (strcmp(s, "float32") == 0) hp->param_dtype = GGUF_DT_F32;
}

/* Multimodal configs (Gemma 3, Llama 4...) nest the language model's fields. */
static const cJSON *hf_text_config(const cJSON *root) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    bool flat = cJSON_GetObjectItemCaseSensitive(root, "num_hidden_layers") != NULL;
    return !flat && cJSON_IsObject(t) ? t : root;
}

static bool hf_fill(const cJSON *root, model_hparams *hp, kvl_error *err) {
    const cJSON *o = hf_text_config(root);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(type)) snprintf(hp->arch, sizeof hp->arch, "%s", type->valuestring);
    hf_dtype(o, hp);
    if (hp->param_dtype < 0) hf_dtype(root, hp);
    if (!hf_heads(o, hp, err) || !hf_mla(o, hp, err) || !hf_swa(o, hp, err)) return false;
    finish_swa(hp);
    return true;
}

bool model_hparams_from_hf_config(const char *json, model_hparams *hp, kvl_error *err) {
    hparams_init(hp);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kvl_fail(err, "config.json: not a JSON object");
    }
    bool ok = hf_fill(root, hp, err);
    cJSON_Delete(root);
    return ok;
}

/* ---------------------------------------------------------------- users -- */

void model_hparams_layer_kv(const model_hparams *hp, int64_t il, int64_t *k_values, int64_t *v_values,
                            int64_t *window) {
    *k_values = hp->n_head_kv * hp->head_dim_k;
    *v_values = hp->mla ? 0 : hp->n_head_kv * hp->head_dim_v; /* MLA: V is the latent in K's row */
    *window = il >= 0 && il < hp->n_layer && hp->swa_layers[il] ? hp->n_swa : 0;
}

bool model_hparams_plan_model(const model_hparams *hp, kv_plan_model *m, kvl_error *err) {
    kv_plan_model_init(m);
    snprintf(m->arch, sizeof m->arch, "%s", hp->arch);
    m->n_layers = hp->n_layer;
    m->n_head = hp->n_head;
    m->n_kv_heads = hp->n_head_kv;
    m->head_dim_k = hp->head_dim_k;
    m->head_dim_v = hp->head_dim_v;
    if (hp->mla) {
        m->kv_lora_rank = hp->kv_lora_rank;
        m->rope_dim = hp->n_rot;
        m->mha_head_dim_k = hp->n_rot_mla_nope > 0 ? hp->n_rot_mla_nope + hp->n_rot : 0;
        m->mha_head_dim_v = hp->v_head_dim_mla;
    }
    m->sliding_window = hp->n_swa;
    m->n_swa_layers = hp->n_swa_layers;
    m->weights_bytes = hp->weights_bytes;
    switch (hp->param_dtype) {
    case GGUF_DT_BF16: m->param_bytes = 2, m->kv_dtype = KV_PLAN_BF16; break;
    case GGUF_DT_F16: m->param_bytes = 2, m->kv_dtype = KV_PLAN_F16; break;
    case GGUF_DT_F32: m->param_bytes = 4, m->kv_dtype = KV_PLAN_F32; break;
    default: break;
    }
    return kv_plan_model_check(m, err);
}
