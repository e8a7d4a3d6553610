/* hparams: the config.json reader, a Hugging Face config into the same
 * model_hparams the GGUF reader (hparams.c) fills, with the same window and
 * MoE rules (hparams_internal.h). See hparams.h. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "hparams.h"
#include "hparams_internal.h"

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

/* Gemma 4: the full layers' own head width and KV head count (global_head_dim,
 * num_global_key_value_heads; head_dim and num_key_value_heads are the sliding
 * layers'), and the last num_kv_shared_layers layers keeping no cache, as
 * llama.cpp's converter writes them into the GGUF keys. */
static bool hf_layer_kinds(const cJSON *o, model_hparams *hp, kvl_error *err) {
    int64_t global_dim = 0, global_kv = 0, shared = 0;
    if (hf_int(o, "global_head_dim", &global_dim, err) < 0 ||
        hf_int(o, "num_global_key_value_heads", &global_kv, err) < 0 ||
        hf_int(o, "num_kv_shared_layers", &shared, err) < 0 ||
        hf_int(o, "hidden_size_per_layer_input", &hp->n_embd_per_layer, err) < 0)
        return false;
    if (global_dim > 0) {
        hp->head_dim_k_swa = hp->head_dim_v_swa = hp->n_rot_swa = hp->head_dim_k;
        hp->head_dim_k = hp->head_dim_v = hp->n_rot = global_dim;
    }
    if (global_kv > 0) {
        hp->n_head_kv_swa = hp->n_head_kv;
        hp->n_head_kv = global_kv;
    }
    if (shared >= hp->n_layer)
        return kvl_fail(err, "config.json: num_kv_shared_layers %lld: must be below %lld",
                        (long long)shared, (long long)hp->n_layer);
    hp->n_layer_kv = hp->n_layer - shared;
    return true;
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
        return kvl_fail(err, "config.json: num_hidden_layers %lld: must be 1..%d",
                        (long long)hp->n_layer, MODEL_MAX_LAYERS);
    hp->n_head_kv = hp->n_head; /* HF: absent num_key_value_heads means MHA */
    if (hf_int(o, "num_key_value_heads", &hp->n_head_kv, err) < 0 ||
        hf_int_any(o, EMBD, &hp->n_embd, err) < 0 ||
        hf_int(o, "intermediate_size", &hp->n_ff, err) < 0 ||
        hf_int(o, "max_position_embeddings", &hp->n_ctx_train, err) < 0)
        return false;
    hp->head_dim_k = hp->n_embd / hp->n_head;
    int r = hf_int(o, "head_dim", &hp->head_dim_k, err);
    if (r < 0) return false;
    if (r == 0 && (hp->n_embd == 0 || hp->n_embd % hp->n_head))
        return kvl_fail(err,
                        "config.json: no head_dim, and hidden_size %lld is not a multiple of "
                        "%lld heads",
                        (long long)hp->n_embd, (long long)hp->n_head);
    hp->head_dim_v = hp->head_dim_k;
    hp->n_rot = hp->head_dim_k;
    return hf_layer_kinds(o, hp, err);
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
    int64_t pattern = hparams_default_swa_pattern(hp->arch), mwl = -1;
    if (hf_int(o, "sliding_window", &hp->n_swa, err) < 0) return false;
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "use_sliding_window"))) hp->n_swa = 0;
    const arch_desc *ad = arch_find(hp->arch);
    if (ad && ad->no_swa) hp->n_swa = 0; /* phi3: llama.cpp runs it without the window */
    if (hp->n_swa > MAX_WINDOW)
        return kvl_fail(err, "config.json: sliding_window %lld out of range", (long long)hp->n_swa);
    if (hp->n_swa == 0) return true;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (cJSON_IsArray(types)) {
        if (cJSON_GetArraySize(types) != hp->n_layer)
            return kvl_fail(
                err, "config.json: layer_types has %d entries, expected one per layer (%lld)",
                cJSON_GetArraySize(types), (long long)hp->n_layer);
        int64_t il = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, types) hp->swa_layers[il++] =
            cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
        return true;
    }
    if (hf_int(o, "sliding_window_pattern", &pattern, err) < 0 ||
        hf_int(o, "max_window_layers", &mwl, err) < 0)
        return false;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "use_sliding_window")) && mwl >= 0)
        for (int64_t il = 0; il < hp->n_layer; il++) hp->swa_layers[il] = il >= mwl;
    else hparams_set_swa_pattern(hp, pattern);
    return true;
}

/* llama4's chunked attention as transformers decides it: the layers that rotate
 * (no_rope_layers[il] = 1; by default all but every no_rope_layer_interval-th,
 * 4) attend within chunks of attention_chunk_size positions (default 8192, the
 * value llama.cpp fixes); a layer_types list ("chunked_attention") overrides. */
static bool hf_chunk(const cJSON *o, model_hparams *hp, kvl_error *err) {
    if (strcmp(hp->arch, "llama4_text") != 0 && strcmp(hp->arch, "llama4") != 0) return true;
    int64_t chunk = 8192, every = 4;
    if (hf_int(o, "attention_chunk_size", &chunk, err) < 0 ||
        hf_int(o, "no_rope_layer_interval", &every, err) < 0)
        return false;
    if (chunk <= 0 || chunk > MAX_WINDOW)
        return kvl_fail(err, "config.json: attention_chunk_size %lld out of range",
                        (long long)chunk);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    const cJSON *nope = cJSON_GetObjectItemCaseSensitive(o, "no_rope_layers");
    const cJSON *list = cJSON_IsArray(types) ? types : nope;
    if (cJSON_IsArray(list) && cJSON_GetArraySize(list) > 0 &&
        cJSON_GetArraySize(list) != hp->n_layer)
        return kvl_fail(err, "config.json: %s has %d entries, expected one per layer (%lld)",
                        list == types ? "layer_types" : "no_rope_layers", cJSON_GetArraySize(list),
                        (long long)hp->n_layer);
    hp->n_chunk = chunk;
    hp->n_chunk_layers = 0;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const cJSON *t = cJSON_IsArray(list) ? cJSON_GetArrayItem(list, (int)il) : NULL;
        bool on = list == types && t
                      ? cJSON_IsString(t) && strcmp(t->valuestring, "chunked_attention") == 0
                  : t ? cJSON_IsNumber(t) && t->valuedouble != 0
                      : every <= 0 || (il + 1) % every != 0;
        hp->chunk_layers[il] = on;
        hp->n_chunk_layers += on;
    }
    return true;
}

/* Mixture of experts under transformers' names (Mixtral num_local_experts,
 * Qwen num_experts, DeepSeek n_routed_experts...). */
static bool hf_moe(const cJSON *o, model_hparams *hp, kvl_error *err) {
    static const char *const COUNT[3] = {"num_experts", "num_local_experts", "n_routed_experts"};
    model_moe_hparams *mo = &hp->moe;
    memset(mo, 0, sizeof *mo);
    int r = hf_int_any(o, COUNT, &mo->n_expert, err);
    if (r < 0) return false;
    if (mo->n_expert == 0) return true;
    int64_t n_shared = 0, gating = 0;
    if (!hf_need(hf_int(o, "num_experts_per_tok", &mo->n_expert_used, err), "num_experts_per_tok",
                 err) ||
        hf_int(o, "moe_intermediate_size", &mo->n_ff_exp, err) < 0 ||
        hf_int(o, "shared_expert_intermediate_size", &mo->n_ff_shexp, err) < 0 ||
        hf_int(o, "n_shared_experts", &n_shared, err) < 0 ||
        hf_int(o, "first_k_dense_replace", &mo->n_layer_dense_lead, err) < 0 ||
        hf_int(o, "n_group", &mo->n_group, err) < 0 ||
        hf_int(o, "topk_group", &mo->n_group_used, err) < 0)
        return false;
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(o, "scoring_func");
    if (cJSON_IsString(sf))
        gating = !strcmp(sf->valuestring, "sigmoid")        ? MODEL_MOE_SIGMOID
                 : !strcmp(sf->valuestring, "sqrtsoftplus") ? MODEL_MOE_SQRT_SOFTPLUS
                                                            : MODEL_MOE_SOFTMAX;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(o, "norm_topk_prob");
    mo->weights_norm = cJSON_IsBool(norm) ? cJSON_IsTrue(norm) : strcmp(hp->arch, "mixtral") == 0;
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(o, "routed_scaling_factor");
    if (cJSON_IsNumber(scale)) mo->weights_scale = (float)scale->valuedouble;
    static const char *const NAMES[MOE_NAMES] = {"num_experts",
                                                 "num_experts_per_tok",
                                                 "first_k_dense_replace",
                                                 "moe_intermediate_size",
                                                 "n_shared_experts",
                                                 "scoring_func",
                                                 "n_group",
                                                 "topk_group",
                                                 "routed_scaling_factor"};
    moe_names nm;
    for (int i = 0; i < MOE_NAMES; i++) snprintf(nm[i], sizeof nm[i], "'%s'", NAMES[i]);
    /* gpt-oss and llama4: the experts are intermediate_size wide (their converters'
     * expert_feed_forward_length); llama4's dense layers intermediate_size_mlp,
     * its MoE layers every interleave_moe_layer_step (transformers' default 1) */
    const bool l4 = strcmp(hp->arch, "llama4_text") == 0 || strcmp(hp->arch, "llama4") == 0;
    if ((l4 || strcmp(hp->arch, "gpt_oss") == 0) && mo->n_ff_exp == 0) mo->n_ff_exp = hp->n_ff;
    mo->layer_step = 1;
    if (l4 && (hf_int(o, "interleave_moe_layer_step", &mo->layer_step, err) < 0 ||
               hf_int(o, "intermediate_size_mlp", &hp->n_ff, err) < 0))
        return false;
    return hparams_moe_defaults("config.json", nm, l4 ? "llama4" : hp->arch, hp->n_ff, hp->n_layer,
                                n_shared, gating, mo, err);
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
    if (!hf_heads(o, hp, err) || !hf_mla(o, hp, err) || !hf_swa(o, hp, err) ||
        !hf_chunk(o, hp, err) || !hf_moe(o, hp, err))
        return false;
    hparams_finish_swa(hp);
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
