/* hparams: the one reader of model shape. This file: GGUF metadata, the
 * defaults and checks both readers share (hparams_internal.h: window pattern,
 * per-family MoE defaults), and the users of the struct. config.json is read
 * by hparams_hf.c. See hparams.h. */
#include "hparams.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "hparams_internal.h"

#define MAX_HEADS 65536

void hparams_init(model_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_ctx_train = 2048;
    hp->rope_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    hp->rms_eps = 1e-5f;
    hp->param_dtype = -1;
}

/* The sliding-window pattern length of a family whose files may not carry one:
 * the architecture table's, under its GGUF name or a config.json model_type
 * naming the same family. */
int64_t hparams_default_swa_pattern(const char *arch) {
    static const char *const ALIASES[][2] = {{"gemma3_text", "gemma3"}};
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (strcmp(arch, ALIASES[i][0]) == 0) arch = ALIASES[i][1];
    const arch_desc *a = arch_find(arch);
    return a ? a->swa_pattern : 0;
}

/* llama.cpp's set_swa_pattern(n): layer il slides iff n == 0 or il % n < n - 1. */
void hparams_set_swa_pattern(model_hparams *hp, int64_t n) {
    for (int64_t il = 0; il < hp->n_layer; il++) hp->swa_layers[il] = n <= 0 || il % n < n - 1;
}

/* Counts the sliding layers; no window means none. Where a reader set no
 * sliding-layer shape or KV sharing: the full layers' shape, every layer its
 * own cache. */
void hparams_finish_swa(model_hparams *hp) {
    if (!hp->n_head_kv_swa) hp->n_head_kv_swa = hp->n_head_kv;
    if (!hp->head_dim_k_swa) hp->head_dim_k_swa = hp->head_dim_k;
    if (!hp->head_dim_v_swa) hp->head_dim_v_swa = hp->head_dim_v;
    if (!hp->n_rot_swa) hp->n_rot_swa = hp->n_rot;
    if (!hp->n_layer_kv) hp->n_layer_kv = hp->n_layer;
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
            kvl_fail(err,
                     "%s: key '%s' differs between layers (%lld, then %lld at layer %llu); "
                     "per-layer values are not supported",
                     gguf_path(f), key, (long long)*out, (long long)v, (unsigned long long)i);
            return -1;
        }
        *out = v;
    }
    return 1;
}

static bool gguf_is_array(const gguf_file *f, const char *arch, const char *name) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    int64_t idx = gguf_find_key(f, key);
    gguf_vtype et;
    uint64_t n;
    return idx >= 0 && gguf_kv_array(f, idx, &et, &n);
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

/* "<arch>.<name>" given per layer: 1 for an array of block_count entries (key
 * holds its name), 0 when absent or a scalar, -1 (err set) for an array of
 * another length (llama.cpp's get_key_or_arr). */
static int gguf_layer_array(const gguf_file *f, const model_hparams *hp, const char *name,
                            char key[128], kvl_error *err) {
    snprintf(key, 128, "%s.%s", hp->arch, name);
    int64_t idx = gguf_find_key(f, key);
    gguf_vtype et;
    uint64_t n;
    if (idx < 0 || !gguf_kv_array(f, idx, &et, &n)) return 0;
    if (n != (uint64_t)hp->n_layer) {
        kvl_fail(err, "%s: key '%s' has %llu entries, expected one per layer (%lld)", gguf_path(f),
                 key, (unsigned long long)n, (long long)hp->n_layer);
        return -1;
    }
    return 1;
}

/* Which layers slide: attention.sliding_window_pattern as per-layer flags (an
 * array of block_count entries) or a pattern length; else the family's. */
static bool gguf_swa_layers(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    char key[128];
    const int per_layer = gguf_layer_array(f, hp, "attention.sliding_window_pattern", key, err);
    int64_t n = hparams_default_swa_pattern(hp->arch);
    if (per_layer < 0) return false;
    if (per_layer) {
        for (int64_t i = 0; i < hp->n_layer; i++) {
            int64_t v;
            if (!gguf_get_arr_i64(f, key, (uint64_t)i, &v))
                return kvl_fail(err, "%s: key '%s': entry %lld is not a flag", gguf_path(f), key,
                                (long long)i);
            hp->swa_layers[i] = v != 0;
        }
        return true;
    }
    if (gguf_find_key(f, key) >= 0 && (!gguf_get_i64(f, key, &n) || n < 0))
        return kvl_fail(err, "%s: key '%s' is not a pattern length", gguf_path(f), key);
    hparams_set_swa_pattern(hp, n);
    return true;
}

/* llama4 as llama.cpp's loader sets it up. Unless the file says
 * attention.sliding_window = 0, the layers of the sliding-window pattern
 * (default 4: three of every four) attend within chunks of 8192 positions
 * (fixed: llama.cpp reads no chunk-size key), every 4th layer does not rotate
 * and scales q by a temperature that grows every 8192 positions. With it set
 * to 0: no chunks, no temperature, and every layer but the last rotates
 * (llama.cpp's n_no_rope_layer_step = n_layer). No window either way. */
static bool gguf_chunked(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window", hp->arch);
    const bool off = gguf_find_key(f, key) >= 0 && hp->n_swa == 0;
    memset(hp->chunk_layers, 0, sizeof hp->chunk_layers);
    hp->n_chunk = hp->n_chunk_layers = 0;
    hp->n_nope_step = off ? hp->n_layer : 4;
    if (!off) {
        if (!gguf_swa_layers(f, hp, err)) return false;
        hp->n_chunk = 8192;
        for (int64_t il = 0; il < hp->n_layer; il++) {
            hp->chunk_layers[il] = hp->swa_layers[il];
            hp->n_chunk_layers += hp->chunk_layers[il] != 0;
        }
        hp->nope_temp_floor = 8192.0f;
        hp->nope_temp_scale = 0.1f;
        hp->nope_temp_offset = 1.0f;
    }
    hp->n_swa = 0;
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
        return kvl_fail(err, "%s: key '%s.attention.key_length_mla' given without a kv_lora_rank",
                        gguf_path(f), a);
    int64_t rope = 0;
    if (!gguf_req(f, a, "rope.dimension_count", &rope, err))
        return false; /* the latent's RoPE part */
    hp->n_rot_mla_nope = k_mla - hp->n_rot;
    hp->v_head_dim_mla = v_mla;
    return true;
}

static bool gguf_range(const gguf_file *f, const model_hparams *hp, kvl_error *err) {
    if (hp->n_layer < 1 || hp->n_layer > MODEL_MAX_LAYERS)
        return kvl_fail(err, "%s: key '%s.block_count' = %lld: must be 1..%d", gguf_path(f),
                        hp->arch, (long long)hp->n_layer, MODEL_MAX_LAYERS);
    if (hp->n_head < 1 || hp->n_head > MAX_HEADS)
        return kvl_fail(err, "%s: key '%s.attention.head_count' = %lld: must be 1..%d",
                        gguf_path(f), hp->arch, (long long)hp->n_head, MAX_HEADS);
    const int64_t *dims[] = {&hp->n_embd,          &hp->n_ff,           &hp->n_head_kv,
                             &hp->head_dim_k,      &hp->head_dim_v,     &hp->n_rot,
                             &hp->n_ctx_train,     &hp->kv_lora_rank,   &hp->q_lora_rank,
                             &hp->head_dim_k_swa,  &hp->head_dim_v_swa, &hp->n_rot_swa,
                             &hp->n_embd_per_layer};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (*dims[i] < 0)
            return kvl_fail(err, "%s: negative hyperparameter (%lld)", gguf_path(f),
                            (long long)*dims[i]);
    if (hp->n_swa < 0 || hp->n_swa > MAX_WINDOW)
        return kvl_fail(err, "%s: sliding window %lld out of range", gguf_path(f),
                        (long long)hp->n_swa);
    return true;
}

/* A feed_forward_length array: one width per layer, n_ff the widest. */
static bool gguf_ff_per_layer(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    char key[128];
    const int per_layer = gguf_layer_array(f, hp, "feed_forward_length", key, err);
    if (per_layer <= 0) return per_layer == 0;
    hp->n_ff = 0;
    for (int64_t i = 0; i < hp->n_layer; i++) {
        int64_t v;
        if (!gguf_get_arr_i64(f, key, (uint64_t)i, &v) || v < 1 || v > (1 << 22))
            return kvl_fail(err, "%s: key '%s': entry %lld is not a width in 1..%d", gguf_path(f),
                            key, (long long)i, 1 << 22);
        hp->n_ff_layer[i] = (int32_t)v;
        hp->n_ff = v > hp->n_ff ? v : hp->n_ff;
    }
    return true;
}

static bool gguf_shape(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    const char *a = hp->arch;
    if (!gguf_req(f, a, "block_count", &hp->n_layer, err) ||
        !gguf_req(f, a, "attention.head_count", &hp->n_head, err) ||
        !gguf_opt(f, a, "embedding_length", &hp->n_embd, err) ||
        (!gguf_is_array(f, a, "feed_forward_length") &&
         !gguf_opt(f, a, "feed_forward_length", &hp->n_ff, err)) ||
        (!gguf_is_array(f, a, "attention.head_count_kv") &&
         !gguf_opt(f, a, "attention.head_count_kv", &hp->n_head_kv, err)) ||
        !gguf_opt(f, a, "attention.key_length", &hp->head_dim_k, err) ||
        !gguf_opt(f, a, "attention.value_length", &hp->head_dim_v, err) ||
        !gguf_opt(f, a, "rope.dimension_count", &hp->n_rot, err) ||
        !gguf_opt(f, a, "context_length", &hp->n_ctx_train, err) ||
        !gguf_opt(f, a, "attention.sliding_window", &hp->n_swa, err))
        return false;
    const arch_desc *ad = arch_find(a);
    if (ad && ad->nextn_layers) { /* llama.cpp's n_layer(): block_count less the MTP layers */
        if (!gguf_opt(f, a, "nextn_predict_layers", &hp->n_layer_nextn, err)) return false;
        if (hp->n_layer_nextn < 0 || hp->n_layer_nextn >= hp->n_layer)
            return kvl_fail(err, "%s: key '%s.nextn_predict_layers' = %lld: must be below %lld",
                            gguf_path(f), a, (long long)hp->n_layer_nextn, (long long)hp->n_layer);
        hp->n_layer -= hp->n_layer_nextn;
    }
    int64_t shared_kv = 0;
    if (!gguf_opt(f, a, "attention.key_length_swa", &hp->head_dim_k_swa, err) ||
        !gguf_opt(f, a, "attention.value_length_swa", &hp->head_dim_v_swa, err) ||
        !gguf_opt(f, a, "rope.dimension_count_swa", &hp->n_rot_swa, err) ||
        !gguf_opt(f, a, "attention.shared_kv_layers", &shared_kv, err) ||
        !gguf_opt(f, a, "embedding_length_per_layer_input", &hp->n_embd_per_layer, err))
        return false;
    if (!gguf_range(f, hp, err) || !gguf_ff_per_layer(f, hp, err)) return false;
    if (shared_kv < 0 || shared_kv >= hp->n_layer)
        return kvl_fail(err, "%s: key '%s.attention.shared_kv_layers' = %lld: must be below %lld",
                        gguf_path(f), a, (long long)shared_kv, (long long)hp->n_layer);
    hp->n_layer_kv = hp->n_layer - shared_kv;
    if (strcmp(a, "gemma3n") == 0) { /* llama.cpp's fixed values, not file keys */
        hp->n_layer_kv = hp->n_layer < 20 ? hp->n_layer : 20;
        hp->n_embd_per_layer = 256;
    }
    /* llama.cpp's defaults; the sliding layers' shape is the full layers' unless given */
    if (hp->n_head_kv == 0) hp->n_head_kv = hp->n_head;
    if (hp->head_dim_k == 0) hp->head_dim_k = hp->n_embd / hp->n_head;
    if (hp->head_dim_v == 0) hp->head_dim_v = hp->n_embd / hp->n_head;
    if (hp->n_rot == 0) hp->n_rot = hp->head_dim_k;
    return true; /* the sliding layers' shape: hparams_finish_swa */
}

/* A head_count_kv array (gemma4: one count for the sliding layers, another for
 * the full ones), read once the sliding flags are known: the counts must agree
 * within each kind. */
static bool gguf_kv_heads_per_layer(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    char key[128];
    const int per_layer = gguf_layer_array(f, hp, "attention.head_count_kv", key, err);
    if (per_layer <= 0) return per_layer == 0;
    int64_t kind[2] = {0, 0}; /* full, sliding */
    for (int64_t i = 0; i < hp->n_layer; i++) {
        int64_t v;
        if (!gguf_get_arr_i64(f, key, (uint64_t)i, &v) || v < 1 || v > MAX_HEADS)
            return kvl_fail(err, "%s: key '%s': entry %lld is not a head count", gguf_path(f), key,
                            (long long)i);
        int64_t *k = &kind[hp->swa_layers[i] != 0];
        if (*k && *k != v)
            return kvl_fail(err,
                            "%s: key '%s' differs between layers of one kind (%lld, then %lld at "
                            "layer %lld); per-layer values are not supported",
                            gguf_path(f), key, (long long)*k, (long long)v, (long long)i);
        *k = v;
    }
    hp->n_head_kv = kind[0] ? kind[0] : kind[1];
    hp->n_head_kv_swa = kind[1] ? kind[1] : kind[0];
    return true;
}

static void gguf_floats(const gguf_file *f, model_hparams *hp) {
    const char *a = hp->arch;
    gguf_float(f, a, "rope.freq_base", &hp->rope_base);
    gguf_float(f, a, "rope.freq_base_swa", &hp->rope_base_swa);
    gguf_float(f, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    gguf_float(f, a, "attn_logit_softcapping", &hp->attn_softcap);
    /* llama.cpp's default of 30 where its loader leaves the key optional (gemma4) or does
     * not read it (gemma3n) */
    char sc_key[128];
    snprintf(sc_key, sizeof sc_key, "%s.final_logit_softcapping", a);
    if (strcmp(a, "gemma3n") == 0 || (strcmp(a, "gemma4") == 0 && gguf_find_key(f, sc_key) < 0))
        hp->final_softcap = 30.0f;
    else gguf_float(f, a, "final_logit_softcapping", &hp->final_softcap);
    gguf_float(f, a, "attention.temperature_scale", &hp->attn_temp_scale);
    gguf_float(f, a, "attention.layer_norm_epsilon", &hp->norm_eps);
    gguf_float(f, a, "embedding_scale", &hp->embd_scale);
    gguf_float(f, a, "residual_scale", &hp->residual_scale);
    gguf_float(f, a, "attention.scale", &hp->attn_scale);
    gguf_float(f, a, "logit_scale", &hp->logit_scale);
    /* granite turns rope off with rope.scaling.finetuned = false (llama.cpp's
     * rope_finetuned switch; true when absent) */
    char key[128];
    bool finetuned = true;
    snprintf(key, sizeof key, "%s.rope.scaling.finetuned", a);
    if ((strcmp(a, "granite") == 0 || strcmp(a, "granitemoe") == 0) &&
        gguf_get_bool(f, key, &finetuned))
        hp->rope_off = !finetuned;
}

/* ggml's magnitude correction for a context stretched by `scale`. */
static float yarn_get_mscale(float scale, float mscale) {
    return scale <= 1.0f ? 1.0f : 0.1f * mscale * logf(scale) + 1.0f;
}

/* ext_factor and attn_factor as llama.cpp's context prepares them (ext < 0:
 * 1 for YaRN, else 0; attn_yarn: its yarn_attn_factor, which YaRN's own
 * correction replaces), times the file's rope.scaling.attn_factor. */
static void yarn_prepare(model_hparams *hp, float ext, float attn_yarn) {
    model_rope_yarn *rs = &hp->rope_yarn;
    const char *a = hp->arch;
    rs->ext_factor = ext < 0.0f ? (rs->yarn ? 1.0f : 0.0f) : ext;
    rs->attn_factor = attn_yarn;
    if (rs->ext_factor != 0.0f) {
        const float fct = 1.0f / hp->rope_freq_scale;
        if (rs->log_mul != 0.0f) {
            float mscale = 1.0f;
            if (strcmp(a, "deepseek2") == 0 && rs->log_mul != 1.0f) mscale = rs->log_mul;
            rs->attn_factor = yarn_get_mscale(fct, mscale) / yarn_get_mscale(fct, rs->log_mul);
        } else {
            rs->attn_factor = yarn_get_mscale(fct, 1.0f);
        }
        /* ggml's rope multiplies by 1 + 0.1 ln(factor) again when ext_factor is set */
        rs->attn_factor *= 1.0f / (1.0f + 0.1f * logf(fct));
    }
    rs->attn_factor *= rs->attn_key;
}

/* Rope scaling (rope.scaling.*) as llama.cpp reads it and prepares ggml's rope.
 * The factor applies whatever the type (llama.cpp's default type is linear,
 * and it divides the frequencies by rope.scaling.factor, or by the older
 * rope.scale_linear, in every case); YaRN then mixes divided and undivided
 * frequencies along a ramp between the dimensions that turn beta_fast and
 * beta_slow times over the original context (ext_factor), and scales cos and
 * sin by attn_factor. deepseek2 folds its magnitude correction into the q.k
 * scale instead (attn_mla). Whether kvllm runs the type is the loader's
 * question (hp->rope_scaling holds it as written). */
static bool gguf_rope_scaling(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    const char *a = hp->arch;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    gguf_get_str_buf(f, key, hp->rope_scaling, sizeof hp->rope_scaling);
    float factor = 0;
    gguf_float(f, a, "rope.scaling.factor", &factor);
    if (factor == 0) gguf_float(f, a, "rope.scale_linear", &factor);
    if (factor != 0) {
        if (!(factor > 0) || !isfinite(factor))
            return kvl_fail(err, "%s: key '%s.rope.scaling.factor' = %g: must be positive",
                            gguf_path(f), a, factor);
        hp->rope_freq_scale = 1.0f / factor;
    }
    model_rope_yarn *rs = &hp->rope_yarn;
    const bool yarn = strcmp(hp->rope_scaling, "yarn") == 0;
    float ext = -1.0f, attn = 1.0f, attn_yarn = 1.0f;
    rs->beta_fast = 32.0f;
    rs->beta_slow = 1.0f;
    rs->n_ctx_orig = hp->n_ctx_train;
    rs->log_mul = 0.0f;
    gguf_float(f, a, "rope.scaling.attn_factor", &attn);
    /* llama.cpp's loaders read the YaRN betas only for some families (of kvllm's,
     * mistral3), and yarn_ext_factor / yarn_attn_factor for none of kvllm's: the
     * others run with the defaults whatever the file says. */
    const arch_desc *ad = arch_find(a);
    if (ad && ad->yarn_beta_keys) {
        gguf_float(f, a, "rope.scaling.yarn_beta_fast", &rs->beta_fast);
        gguf_float(f, a, "rope.scaling.yarn_beta_slow", &rs->beta_slow);
    }
    gguf_float(f, a, "rope.scaling.yarn_log_multiplier", &rs->log_mul);
    /* Of kvllm's architectures only deepseek2 and mistral3 read the key in llama.cpp; deepseek2's
     * converter stores 0.1 * mscale_all_dim and llama.cpp undoes the 0.1, mistral3 takes it as is. */
    if (strcmp(a, "deepseek2") == 0) rs->log_mul /= 0.1f;
    else if (strcmp(a, "mistral3") != 0) rs->log_mul = 0.0f;
    if (!gguf_opt(f, a, "rope.scaling.original_context_length", &rs->n_ctx_orig, err)) return false;
    /* The original context matters only to YaRN's ramp (and defaults to
     * context_length, which a file may set to anything: the run's context is
     * sized elsewhere, from -c), so only YaRN needs it plausible. */
    const bool uses_orig = yarn || ext > 0.0f;
    if ((uses_orig && (rs->n_ctx_orig <= 0 || rs->n_ctx_orig > (1 << 30))) || !isfinite(attn) ||
        !isfinite(ext) || !isfinite(attn_yarn) || !isfinite(rs->beta_fast) ||
        !isfinite(rs->beta_slow) || !isfinite(rs->log_mul) || !isfinite(hp->attn_temp_scale) ||
        (hp->attn_temp_scale != 0.0f && rs->n_ctx_orig <= 0))
        return kvl_fail(err, "%s: implausible rope scaling keys (original context %lld)",
                        gguf_path(f), (long long)rs->n_ctx_orig);
    rs->yarn = yarn;
    rs->attn_key = attn;
    yarn_prepare(hp, ext, attn_yarn);
    return true;
}

bool model_hparams_set_yarn(model_hparams *hp, float ext, float attn, float beta_fast,
                            float beta_slow, kvl_error *err) {
    model_rope_yarn *rs = &hp->rope_yarn;
    const float v[4] = {ext, attn, beta_fast, beta_slow};
    for (int i = 0; i < 4; i++)
        if (!isfinite(v[i])) return kvl_fail(err, "the YaRN settings must be finite numbers");
    if (beta_fast >= 0.0f) rs->beta_fast = beta_fast;
    if (beta_slow >= 0.0f) rs->beta_slow = beta_slow;
    if (ext > 0.0f && (rs->n_ctx_orig <= 0 || rs->n_ctx_orig > (1 << 30)))
        return kvl_fail(err,
                        "a YaRN ext_factor needs an original context (rope.scaling."
                        "original_context_length or --yarn-orig-ctx), not %lld",
                        (long long)rs->n_ctx_orig);
    yarn_prepare(hp, ext, attn >= 0.0f ? attn : 1.0f);
    return true;
}

/* ----------------------------------------------------------------- MoE -- */

/* An optional integer "<arch>.<name>": false (err set) only when it is there
 * with another type. */
static bool gguf_int(const gguf_file *f, const char *arch, const char *name, int64_t *out,
                     kvl_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    if (gguf_get_i64(f, key, out)) return true;
    if (gguf_find_key(f, key) >= 0)
        return kvl_fail(err, "%s: key '%s': expected an integer", gguf_path(f), key);
    return true;
}

const char *model_moe_gating_name(int gating) {
    switch (gating) {
    case MODEL_MOE_SIGMOID: return "sigmoid";
    case MODEL_MOE_SOFTMAX_WEIGHT: return "softmax of the chosen";
    case MODEL_MOE_SQRT_SOFTPLUS: return "sqrt-softplus";
    default: return "softmax";
    }
}

/* Expert widths, shared experts and gating as llama.cpp's loader sets them per
 * family (llama = Mixtral, qwen2moe, qwen3moe, deepseek2), and the counts'
 * consistency. Called only for files with experts. */
bool hparams_moe_defaults(const char *path, moe_names nm, const char *a, int64_t n_ff,
                          int64_t n_layer, int64_t n_shared, int64_t gating, model_moe_hparams *mo,
                          kvl_error *err) {
    const bool ds2 = strcmp(a, "deepseek2") == 0 || strcmp(a, "deepseek_v2") == 0 ||
                     strcmp(a, "deepseek_v3") == 0;
    const bool q2 = strcmp(a, "qwen2moe") == 0 || strcmp(a, "qwen2_moe") == 0;
    const bool q3 = strcmp(a, "qwen3moe") == 0 || strcmp(a, "qwen3_moe") == 0;
    const bool mixtral = strcmp(a, "llama") == 0 || strcmp(a, "mixtral") == 0;
    const bool glm = strcmp(a, "glm4moe") == 0 || strcmp(a, "glm4_moe") == 0;
    const bool granite = strcmp(a, "granite") == 0 || strcmp(a, "granitemoe") == 0;
    const bool oss = strcmp(a, "gpt-oss") == 0 || strcmp(a, "gpt_oss") == 0;
    const bool olmoe = strcmp(a, "olmoe") == 0;
    const bool llama4 = strcmp(a, "llama4") == 0;
    const bool gemma4 = strcmp(a, "gemma4") == 0;
    if (!ds2 && !q2 && !q3 && !mixtral && !glm && !granite && !oss && !olmoe && !llama4 &&
        !gemma4) {
        /* A family whose expert layout is not known here: the counts as
         * written, for reports; the loader refuses to run it. */
        mo->n_layer_moe = n_layer;
        return true;
    }
    if (mo->n_expert < 1 || mo->n_expert > MODEL_MAX_EXPERTS || mo->n_expert_used < 1 ||
        mo->n_expert_used > mo->n_expert)
        return kvl_fail(err, "%s: %s = %lld, %s = %lld: need 1 <= used <= count <= %d", path,
                        nm[MOE_COUNT], (long long)mo->n_expert, nm[MOE_USED],
                        (long long)mo->n_expert_used, MODEL_MAX_EXPERTS);
    if (!ds2 && !glm) mo->n_layer_dense_lead = 0; /* only these loaders read it */
    if (mo->n_layer_dense_lead < 0 || mo->n_layer_dense_lead > n_layer)
        return kvl_fail(err, "%s: %s = %lld out of range [0, %lld]", path, nm[MOE_LEAD],
                        (long long)mo->n_layer_dense_lead, (long long)n_layer);
    if (q2 || q3) {
        if (mo->n_ff_exp == 0) mo->n_ff_exp = n_ff / mo->n_expert_used;
        if (q2 && mo->n_ff_shexp == 0) mo->n_ff_shexp = n_ff;
        if (q3) mo->n_ff_shexp = 0;
        mo->shexp_gated = q2;
    } else if (ds2 || glm) {
        if (mo->n_ff_exp == 0) return kvl_fail(err, "%s: %s missing", path, nm[MOE_FF_EXP]);
        if (n_shared < 0 || n_shared > 64)
            return kvl_fail(err, "%s: %s = %lld out of range", path, nm[MOE_SHARED],
                            (long long)n_shared);
        mo->n_ff_shexp = mo->n_ff_exp * n_shared;
    } else if (oss) { /* gpt-oss: expert_feed_forward_length required, no shared expert */
        if (mo->n_ff_exp == 0) return kvl_fail(err, "%s: %s missing", path, nm[MOE_FF_EXP]);
        mo->n_ff_shexp = 0;
    } else if (olmoe) { /* OLMoE: every expert feed_forward_length wide, no shared one */
        mo->n_ff_exp = n_ff;
        mo->n_ff_shexp = 0;
    } else if (gemma4) { /* the layer's dense FFN runs beside the experts (model_forward.c) */
        if (mo->n_ff_exp == 0) return kvl_fail(err, "%s: %s missing", path, nm[MOE_FF_EXP]);
        mo->n_ff_shexp = 0;
    } else if (llama4) { /* a shared expert as wide as a routed one */
        if (mo->n_ff_exp == 0) return kvl_fail(err, "%s: %s missing", path, nm[MOE_FF_EXP]);
        mo->n_ff_shexp = mo->n_ff_exp;
    } else if (granite) { /* experts feed_forward_length wide; granitemoeshared's shared one */
        mo->n_ff_exp = n_ff;
    } else {
        mo->n_ff_exp = n_ff; /* Mixtral: every expert is feed_forward_length wide */
        mo->n_ff_shexp = 0;
    }
    if (mo->n_ff_exp <= 0 || mo->n_ff_exp > (1 << 20) || mo->n_ff_shexp < 0 ||
        mo->n_ff_shexp > (1 << 22))
        return kvl_fail(err, "%s: expert widths out of range (expert %lld, shared %lld)", path,
                        (long long)mo->n_ff_exp, (long long)mo->n_ff_shexp);
    /* glm4moe: sigmoid unless set; llama4: always */
    mo->gating = glm || llama4 ? MODEL_MOE_SIGMOID : MODEL_MOE_SOFTMAX;
    if ((ds2 || glm) && gating != 0) { /* any of llama.cpp's, as its loaders take them */
        if (gating < MODEL_MOE_SOFTMAX || gating > MODEL_MOE_SQRT_SOFTPLUS)
            return kvl_fail(err,
                            "%s: %s = %lld is not supported (1 softmax, 2 sigmoid, 3 softmax of "
                            "the chosen logits, 4 sqrt-softplus)",
                            path, nm[MOE_GATING], (long long)gating);
        mo->gating = (int)gating;
    }
    if (!isfinite(mo->weights_scale))
        return kvl_fail(err, "%s: %s is not finite", path, nm[MOE_SCALE]);
    if (mo->n_group > 1) {
        if (mo->n_expert % mo->n_group != 0 || mo->n_group_used < 1 ||
            mo->n_group_used > mo->n_group ||
            mo->n_group_used * (mo->n_expert / mo->n_group) < mo->n_expert_used)
            return kvl_fail(err, "%s: %s = %lld, %s = %lld do not fit %lld experts, %lld used",
                            path, nm[MOE_GROUP], (long long)mo->n_group, nm[MOE_GROUP_USED],
                            (long long)mo->n_group_used, (long long)mo->n_expert,
                            (long long)mo->n_expert_used);
    } else {
        mo->n_group = mo->n_group_used = 0;
    }
    if (glm || oss || llama4 || gemma4) /* their loaders read no groups */
        mo->n_group = mo->n_group_used = 0;
    if (gemma4) { /* build_moe_ffn as gemma4 calls it: softmax, renormalised, no scale */
        mo->weights_norm = true;
        mo->weights_scale = 0.0f;
    }
    if (olmoe) { /* softmax, top-k weights not renormalised, no scale */
        mo->weights_norm = false;
        mo->weights_scale = 0.0f;
    }
    if (oss) { /* build_moe_ffn as gpt-oss calls it: softmax of the selected logits, no norm */
        mo->gating = MODEL_MOE_SOFTMAX_WEIGHT;
        mo->weights_norm = false;
        mo->weights_scale = 0.0f;
    }
    mo->n_layer_moe = n_layer - mo->n_layer_dense_lead;
    if (llama4) { /* MoE every layer_step layers, the input weighted (llama.cpp's llama4) */
        if (mo->layer_step < 1 || mo->layer_step > n_layer)
            return kvl_fail(err, "%s: key '%s.interleave_moe_layer_step' %s", path, a,
                            mo->layer_step < 0 ? "missing" : "out of range [1, block_count]");
        mo->n_layer_moe = n_layer / mo->layer_step;
        mo->weight_input = true;
        mo->weights_norm = false;
        mo->weights_scale = 0.0f;
    } else {
        mo->layer_step = 0;
    }
    return true;
}

size_t model_hparams_read_bytes(const gguf_file *f, const model_hparams *hp) {
    const model_moe_hparams *mo = &hp->moe;
    size_t unread = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        int il = -1;
        char what[32] = "";
        if (strncmp(t->name, "blk.", 4) == 0) sscanf(t->name, "blk.%d.%31s", &il, what);
        if (il >= hp->n_layer) {
            unread += t->nbytes; /* an MTP layer past n_layer (glm4moe): never run */
        } else if (il >= 0 && mo->n_expert > 0 && strstr(what, "_exps.weight")) {
            unread += t->nbytes / (size_t)mo->n_expert * (size_t)(mo->n_expert - mo->n_expert_used);
        } else if (il >= hp->n_layer_kv &&
                   (strcmp(what, "attn_k.weight") == 0 || strcmp(what, "attn_v.weight") == 0)) {
            unread += t->nbytes; /* a layer reading another's KV cache (gemma4) */
        } else if (strcmp(t->name, "per_layer_token_embd.weight") == 0 && t->ne[1] > 0) {
            unread += t->nbytes - t->nbytes / (size_t)t->ne[1]; /* one row a token */
        }
    }
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (emb && gguf_find_tensor(f, "output.weight") && emb->ne[1] > 0)
        unread += emb->nbytes - emb->nbytes / (size_t)emb->ne[1];
    return hp->weights_bytes > unread ? hp->weights_bytes - unread : 0;
}

/* The routed experts' bytes, and (model_hparams_read_bytes) the weights one token reads. */
static void gguf_moe_bytes(const gguf_file *f, model_hparams *hp) {
    model_moe_hparams *mo = &hp->moe;
    mo->expert_bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (strncmp(t->name, "blk.", 4) == 0 && atoll(t->name + 4) < hp->n_layer &&
            strstr(t->name, "_exps.weight"))
            mo->expert_bytes += t->nbytes;
    }
    mo->active_bytes = model_hparams_read_bytes(f, hp);
}

static bool gguf_moe(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    model_moe_hparams *mo = &hp->moe;
    const char *a = hp->arch, *path = gguf_path(f);
    int64_t n_shared = 0, gating = 0;
    memset(mo, 0, sizeof *mo);
    if (!gguf_int(f, a, "expert_count", &mo->n_expert, err) ||
        !gguf_int(f, a, "expert_used_count", &mo->n_expert_used, err) ||
        !gguf_int(f, a, "leading_dense_block_count", &mo->n_layer_dense_lead, err) ||
        !gguf_int(f, a, "expert_feed_forward_length", &mo->n_ff_exp, err) ||
        !gguf_int(f, a, "expert_shared_feed_forward_length", &mo->n_ff_shexp, err) ||
        !gguf_int(f, a, "expert_shared_count", &n_shared, err) ||
        !gguf_int(f, a, "expert_gating_func", &gating, err) ||
        !gguf_int(f, a, "expert_group_count", &mo->n_group, err) ||
        !gguf_int(f, a, "expert_group_used_count", &mo->n_group_used, err))
        return false;
    mo->layer_step = -1; /* absent */
    if (!gguf_int(f, a, "interleave_moe_layer_step", &mo->layer_step, err)) return false;
    if (mo->n_expert == 0) {
        if (strcmp(a, "deepseek2") == 0 && mo->n_layer_dense_lead < hp->n_layer &&
            gguf_find_key(f, "deepseek2.leading_dense_block_count") >= 0)
            return kvl_fail(
                err,
                "%s: key 'deepseek2.leading_dense_block_count' = %lld < %lld layers, but key "
                "'deepseek2.expert_count' is missing or 0",
                path, (long long)mo->n_layer_dense_lead, (long long)hp->n_layer);
        memset(mo, 0, sizeof *mo);
        return true;
    }
    /* llama.cpp's defaults when a key is absent */
    const bool ds2_like = strcmp(a, "deepseek2") == 0 || strcmp(a, "glm4moe") == 0;
    mo->weights_norm = !ds2_like && strcmp(a, "qwen2moe") != 0; /* qwen3moe, Mixtral: renormalise */
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    if (ds2_like) gguf_get_bool(f, key, &mo->weights_norm);
    if (ds2_like || strcmp(a, "qwen2moe") == 0)
        gguf_float(f, a, "expert_weights_scale", &mo->weights_scale);
    static const char *const KEYS[MOE_NAMES] = {"expert_count",
                                                "expert_used_count",
                                                "leading_dense_block_count",
                                                "expert_feed_forward_length",
                                                "expert_shared_count",
                                                "expert_gating_func",
                                                "expert_group_count",
                                                "expert_group_used_count",
                                                "expert_weights_scale"};
    moe_names nm;
    for (int i = 0; i < MOE_NAMES; i++) snprintf(nm[i], sizeof nm[i], "key '%s.%s'", a, KEYS[i]);
    if (!hparams_moe_defaults(path, nm, a, hp->n_ff, hp->n_layer, n_shared, gating, mo, err))
        return false;
    gguf_moe_bytes(f, hp);
    /* llama4: q/k L2 norm unless it is the 128-expert model (Maverick), as llama.cpp */
    hp->kq_l2_norm = strcmp(a, "llama4") == 0 && mo->n_expert != 128;
    return true;
}

bool model_hparams_from_gguf(const gguf_file *f, model_hparams *hp, kvl_error *err) {
    hparams_init(hp);
    if (!gguf_get_str_buf(f, "general.architecture", hp->arch, sizeof hp->arch))
        return kvl_fail(err, "%s: key 'general.architecture' missing", gguf_path(f));
    const arch_desc *ad = arch_find(hp->arch);
    hp->rope_type = ad ? ad->rope_type : 0;
    if (!gguf_shape(f, hp, err)) return false;
    gguf_floats(f, hp);
    if (!gguf_rope_scaling(f, hp, err) || !gguf_mla(f, hp, err)) return false;
    if (ad && ad->no_swa) hp->n_swa = 0; /* phi3: llama.cpp disables the window */
    if (ad && ad->chunked && !gguf_chunked(f, hp, err)) return false;
    if (hp->n_swa > 0 && !gguf_swa_layers(f, hp, err)) return false;
    hparams_finish_swa(hp);
    if (!gguf_kv_heads_per_layer(f, hp, err)) return false;
    hp->weights_bytes = gguf_tensor_data_bytes(f);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        hp->n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    return gguf_moe(f, hp, err);
}

/* ---------------------------------------------------------------- users -- */

int64_t model_hparams_n_ff(const model_hparams *hp, int64_t il) {
    return il >= 0 && il < hp->n_layer && hp->n_ff_layer[il] ? hp->n_ff_layer[il] : hp->n_ff;
}

model_layer_attn model_hparams_kind_attn(const model_hparams *hp, bool sliding) {
    if (sliding)
        return (model_layer_attn){hp->n_head_kv_swa, hp->head_dim_k_swa, hp->head_dim_v_swa,
                                  hp->n_rot_swa};
    return (model_layer_attn){hp->n_head_kv, hp->head_dim_k, hp->head_dim_v, hp->n_rot};
}

model_layer_attn model_hparams_layer_attn(const model_hparams *hp, int64_t il) {
    return model_hparams_kind_attn(hp, il >= 0 && il < hp->n_layer && hp->swa_layers[il]);
}

int64_t model_hparams_kv_source(const model_hparams *hp, int64_t il) {
    if (il < hp->n_layer_kv || il >= hp->n_layer) return il;
    /* llama.cpp's rule (gemma3n / gemma4 files end their cached layers with a
     * sliding one, then a full one); the loader checks the kinds agree */
    return hp->n_layer_kv - (hp->swa_layers[il] ? 2 : 1);
}

void model_hparams_layer_kv(const model_hparams *hp, int64_t il, int64_t *k_values,
                            int64_t *v_values, int64_t *window) {
    const model_layer_attn la = model_hparams_layer_attn(hp, il);
    const bool own = model_hparams_kv_source(hp, il) == il;
    *k_values = own ? la.n_head_kv * la.head_dim_k : 0;
    /* MLA: V is the latent in K's row */
    *v_values = own && !hp->mla ? la.n_head_kv * la.head_dim_v : 0;
    *window = il >= 0 && il < hp->n_layer && hp->swa_layers[il] ? hp->n_swa : 0;
}

bool model_hparams_plan_model(const model_hparams *hp, kv_plan_model *m, kvl_error *err) {
    kv_plan_model_init(m);
    snprintf(m->arch, sizeof m->arch, "%s", hp->arch);
    m->n_layers = hp->n_layer_kv; /* layers sharing an earlier layer's cache keep none */
    m->n_layers_shared_kv = hp->n_layer - hp->n_layer_kv;
    m->n_head = hp->n_head;
    m->n_kv_heads = hp->n_head_kv;
    m->head_dim_k = hp->head_dim_k;
    m->head_dim_v = hp->head_dim_v;
    if (!hp->mla && (hp->n_head_kv_swa != hp->n_head_kv || hp->head_dim_k_swa != hp->head_dim_k ||
                     hp->head_dim_v_swa != hp->head_dim_v)) {
        m->n_kv_heads_swa = hp->n_head_kv_swa;
        m->head_dim_k_swa = hp->head_dim_k_swa;
        m->head_dim_v_swa = hp->head_dim_v_swa;
    }
    if (hp->mla) {
        m->kv_lora_rank = hp->kv_lora_rank;
        m->rope_dim = hp->n_rot;
        m->mha_head_dim_k = hp->n_rot_mla_nope > 0 ? hp->n_rot_mla_nope + hp->n_rot : 0;
        m->mha_head_dim_v = hp->v_head_dim_mla;
    }
    m->sliding_window = hp->n_swa;
    m->n_swa_layers = 0;
    for (int64_t il = 0; il < hp->n_layer_kv; il++) m->n_swa_layers += hp->swa_layers[il] != 0;
    m->attn_chunk = hp->n_chunk_layers ? hp->n_chunk : 0;
    m->n_chunk_layers = hp->n_chunk_layers;
    m->weights_bytes = hp->weights_bytes;
    m->n_expert = hp->moe.n_expert;
    m->n_expert_used = hp->moe.n_expert_used;
    m->active_weights_bytes = hp->moe.active_bytes;
    switch (hp->param_dtype) {
    case GGUF_DT_BF16: m->param_bytes = 2, m->kv_dtype = KV_PLAN_BF16; break;
    case GGUF_DT_F16: m->param_bytes = 2, m->kv_dtype = KV_PLAN_F16; break;
    case GGUF_DT_F32: m->param_bytes = 4, m->kv_dtype = KV_PLAN_F32; break;
    default: break;
    }
    return kv_plan_model_check(m, err);
}
