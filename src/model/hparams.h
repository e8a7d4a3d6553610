/* hparams: a model's hyperparameters, read from a GGUF's metadata or from a
 * Hugging Face config.json into one struct. This is the only reader of model
 * shape: the model loader (model.c) builds its layers and KV groups from it, and
 * the KV planner's front end (kvllm kv-plan) turns it into the planner's plain
 * description (model_hparams_plan_model), so the two cannot disagree.
 *
 * The readers take what a file says and fill in llama.cpp's defaults; they
 * refuse only what is malformed (a key of the wrong type, an array of the wrong
 * length, a count out of range). Whether kvllm can run the shape (a supported
 * architecture, plausible sizes, its tensors) is the loader's question.
 *
 * Conventions, as in llama.cpp's GGUF files:
 *   - head_dim_k / head_dim_v are the widths of one cached K / V head. For MLA
 *     (DeepSeek) the cache holds one "head" (n_head_kv 1) of the compressed
 *     latent + the shared RoPE key: head_dim_k = kv_lora_rank + n_rot,
 *     head_dim_v = kv_lora_rank; the per-head widths of the attention it stands
 *     for are n_rot_mla_nope + n_rot (K) and v_head_dim_mla (V).
 *   - MLA is on when the file carries key_length_mla and value_length_mla
 *     (llama.cpp's is_mla). A DeepSeek-V2 file converted before llama.cpp's MLA
 *     rework lacks them: llama.cpp then runs it as plain multi-head attention
 *     with n_head_kv heads of key_length / value_length, and caches that
 *     (kv_lora_rank still set, mla false; n_rot_mla_nope = key_length - n_rot,
 *     v_head_dim_mla = value_length: the per-head widths in both forms).
 *   - Which layers slide is one flag per layer (swa_layers). A scalar
 *     attention.sliding_window_pattern n gives llama.cpp's set_swa_pattern(n)
 *     (layer il slides iff n == 0 or il % n < n - 1); an array gives the flags
 *     themselves, one per layer (llama.cpp's get_key_or_arr: the array must have
 *     exactly block_count entries). Without a window no layer slides.
 * Per-layer facts live in per-layer arrays of MODEL_MAX_LAYERS; a file claiming
 * more layers is refused.
 *   - Mixture-of-experts counts and widths, and the rope-scaling parameters, are
 *     read here too, with llama.cpp's per-family defaults; the loader only asks
 *     whether it runs them (model_moe.c, model.c). */
#ifndef KVLLM_HPARAMS_H
#define KVLLM_HPARAMS_H

#include "base.h"
#include "gguf.h"
#include "kv_plan.h"

#define MODEL_MAX_LAYERS  4096
#define MODEL_MAX_EXPERTS 1024

enum { MODEL_ROPE_NORM = 0, MODEL_ROPE_NEOX = 2 };

/* Mixture of experts (model_moe.c), llama.cpp's keys and build_moe_ffn. */
/* expert_gating_func; SOFTMAX_WEIGHT (gpt-oss, never in a file): top-k of the raw
 * logits, their weights the softmax of those k logits */
/* Expert gating, numbered as llama.cpp's expert_gating_func: the router
 * logits' softmax, sigmoid, the logits themselves (the chosen ones' softmax
 * weighs them), or sqrt(softplus(logit)). */
enum {
    MODEL_MOE_SOFTMAX = 1,
    MODEL_MOE_SIGMOID = 2,
    MODEL_MOE_SOFTMAX_WEIGHT = 3,
    MODEL_MOE_SQRT_SOFTPLUS = 4
};
/* "softmax", "sigmoid", "softmax of the chosen", "sqrt-softplus". */
const char *model_moe_gating_name(int gating);
typedef struct model_moe_hparams {
    int64_t n_expert, n_expert_used; /* expert_count (0: dense model), expert_used_count */
    int64_t n_layer_dense_lead;    /* leading_dense_block_count: layers before the first MoE one */
    int64_t n_ff_exp;              /* one routed expert's width */
    int64_t n_ff_shexp;            /* the shared expert's width (0: none) */
    int gating;                    /* MODEL_MOE_* */
    bool weights_norm;             /* top-k weights divided by their sum */
    float weights_scale;           /* 0 or 1: none */
    int64_t n_group, n_group_used; /* group-limited routing (DeepSeek V3; 0: off) */
    bool shexp_gated;   /* qwen2moe: shared expert scaled by sigmoid(gate_inp_shexp . x) */
    int64_t layer_step; /* interleave_moe_layer_step (llama4): layers il with (il + 1) % step
                           == 0 are MoE, the others dense (0: not this rule) */
    bool weight_input;  /* llama4: top-k by router logit, sigmoid weight multiplies the
                           expert's input, not its output */
    int64_t n_layer_moe;
    size_t expert_bytes; /* all routed experts' weights (GGUF; 0 from config.json) */
    size_t active_bytes; /* weights read per token: all but the unselected experts and
                                          an untied embedding's other rows (GGUF; 0 from config.json) */
} model_moe_hparams;

/* Rope scaling beyond linear (rope.scaling.*), as llama.cpp sets up ggml's rope. */
typedef struct model_rope_yarn {
    bool yarn;         /* rope.scaling.type = yarn */
    float ext_factor;  /* YaRN ramp mix (0: off, 1 for yarn files) */
    float attn_factor; /* ggml's attn_factor: multiplies rope's cos and sin */
    float beta_fast, beta_slow;
    int64_t n_ctx_orig; /* rope.scaling.original_context_length */
    float log_mul;      /* rope.scaling.yarn_log_multiplier / 0.1 (deepseek2) */
    float attn_key;     /* rope.scaling.attn_factor (1 without it) */
} model_rope_yarn;

typedef struct model_hparams {
    char arch[32];   /* general.architecture, or config.json's model_type */
    int64_t n_vocab; /* rows of token_embd (the loader's; 0 from a reader) */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    int64_t head_dim_k, head_dim_v; /* key_length / value_length (default n_embd / n_head) */
    int64_t n_rot;                  /* rope.dimension_count (default head_dim_k) */
    /* The sliding layers' own attention shape where the file gives one (gemma4:
     * attention.key_length_swa / value_length_swa, rope.dimension_count_swa, a
     * head_count_kv array), else the values above, which are the full layers'.
     * model_hparams_layer_attn gives layer il's. */
    int64_t n_head_kv_swa, head_dim_k_swa, head_dim_v_swa, n_rot_swa;
    /* Layers [n_layer_kv, n_layer) keep no KV of their own: each attends over an
     * earlier layer's cache (model_hparams_kv_source; gemma4's
     * attention.shared_kv_layers; n_layer when absent). */
    int64_t n_layer_kv;
    int64_t n_embd_per_layer; /* embedding_length_per_layer_input: each layer's per-token
                                 input (gemma4 E2B / E4B; 0: none) */
    /* feed_forward_length given per layer (gemma4 E2B's wider FFN on its shared-KV
     * layers): each layer's width, n_ff then being the widest; all 0 for a scalar.
     * model_hparams_n_ff gives layer il's. */
    int32_t n_ff_layer[MODEL_MAX_LAYERS];
    int rope_type; /* MODEL_ROPE_*: the architecture's (arch.c); 0 if unknown */
    float rope_base, rope_freq_scale;
    float rope_base_swa;   /* rope.freq_base_swa; 0: absent */
    char rope_scaling[16]; /* rope.scaling.type as written ("" absent: linear); the factor
                                       is in rope_freq_scale whatever the type, as in llama.cpp */
    float rms_eps;
    float attn_softcap, final_softcap; /* gemma2 logit soft-capping (0: off) */
    float attn_temp_scale;             /* attention.temperature_scale (0: off): q is multiplied by
                                       1 + scale * ln(floor(pos / rope_yarn.n_ctx_orig) + 1) */
    float norm_eps;        /* attention.layer_norm_epsilon (LayerNorm families; 0: absent) */
    float embd_scale;      /* embedding_scale (granite; 0: none) */
    float residual_scale;  /* residual_scale (granite; 0: none) */
    float attn_scale;      /* attention.scale (granite: the q.k scale; 0: 1/sqrt(head_dim)) */
    float logit_scale;     /* logit_scale (granite divides by it, command-r multiplies; 0: none) */
    bool rope_off;         /* granite's rope.scaling.finetuned = false: no rope at all */
    int64_t n_layer_nextn; /* nextn_predict_layers: MTP layers after the n_layer run (glm4moe;
                              not counted in n_layer, their tensors unused) */
    /* llama4 (llama.cpp's fixed values, not file keys): chunk_layers attend only
     * within their chunk of n_chunk positions (kv.h's kv_chunk_first); layers il with
     * (il + 1) % n_nope_step == 0 do not rotate (0: the architecture's nope_every) and
     * scale q by 1 + nope_temp_scale * ln(floor((pos + nope_temp_offset) /
     * nope_temp_floor) + 1) (0: off); kq_l2_norm: the rotating layers' q and k get a
     * weightless RMSNorm per head after rope. */
    int64_t n_chunk, n_chunk_layers, n_nope_step;
    uint8_t chunk_layers[MODEL_MAX_LAYERS];
    float nope_temp_scale, nope_temp_floor, nope_temp_offset;
    bool kq_l2_norm;
    /* Sliding window */
    int64_t n_swa;        /* window in tokens; 0: none */
    int64_t n_swa_layers; /* layers with swa_layers[il] set */
    uint8_t swa_layers[MODEL_MAX_LAYERS];
    /* MLA (see above) */
    bool mla;
    int64_t kv_lora_rank, q_lora_rank, n_rot_mla_nope, v_head_dim_mla;
    model_moe_hparams moe; /* mixture of experts (moe.n_expert 0: dense) */
    model_rope_yarn rope_yarn;
    /* Whole-file facts */
    int64_t n_params;       /* elements of all tensors (GGUF) */
    size_t weights_bytes;   /* GGUF tensor data (0 from config.json) */
    int64_t repacked_bytes; /* the loader's: weights held in the kernels' layout */
    int param_dtype;        /* config.json torch_dtype as GGUF_DT_F32/F16/BF16; -1 unknown */
    bool tied_output, has_rope_freqs; /* the loader's (from tensors) */
    /* The loader's: classes the classifier head (cls.output, model_classify)
     * scores, 0 without one */
    int64_t n_cls_out;
} model_hparams;

/* Reads a GGUF's metadata. False (err names the file and key) on a malformed
 * or missing required key (general.architecture, block_count, head_count). */
bool model_hparams_from_gguf(const gguf_file *f, model_hparams *hp, kvl_error *err);
/* llama.cpp's --yarn-ext-factor, --yarn-attn-factor, --yarn-beta-fast and
 * --yarn-beta-slow (its context parameters): each >= 0 replaces the file's
 * value or llama.cpp's default, a negative one keeps it, and the rope's
 * attention factor is prepared again as llama.cpp's context does (YaRN's own
 * correction replaces yarn_attn_factor whenever ext_factor is not 0). False
 * (err) on a value that is not finite, or an ext_factor without a plausible
 * original context. */
bool model_hparams_set_yarn(model_hparams *hp, float ext, float attn, float beta_fast,
                            float beta_slow, kvl_error *err);
/* The weights one decoded token reads (GGUF): all tensor data but the experts it
 * does not select, the rows of an untied embedding and of gemma4's per-layer
 * embedding table other than its own, layers past n_layer (MTP), and the k / v
 * projections of layers that read another layer's cache. */
size_t model_hparams_read_bytes(const gguf_file *f, const model_hparams *hp);
/* Reads the text of a Hugging Face config.json (NUL-terminated); messages
 * start with "config.json: ". Multimodal configs: the text_config's fields. */
bool model_hparams_from_hf_config(const char *json, model_hparams *hp, kvl_error *err);

/* The KV planner's description of this shape (kv_plan.h): layers, heads,
 * widths, MLA latent, window and the number of sliding layers, weight bytes and
 * the config's dtype. Checked with kv_plan_model_check. */
bool model_hparams_plan_model(const model_hparams *hp, kv_plan_model *out, kvl_error *err);

/* Layer il's attention shape: KV heads, K and V head widths, rotated dims. */
typedef struct model_layer_attn {
    int64_t n_head_kv, head_dim_k, head_dim_v, n_rot;
} model_layer_attn;
model_layer_attn model_hparams_layer_attn(const model_hparams *hp, int64_t il);
/* The attention shape of the full layers (sliding false) or of the sliding ones. */
model_layer_attn model_hparams_kind_attn(const model_hparams *hp, bool sliding);
/* Layer il's FFN width. */
int64_t model_hparams_n_ff(const model_hparams *hp, int64_t il);
/* The layer whose cache layer il reads: il itself, or for a layer past
 * n_layer_kv llama.cpp's choice, n_layer_kv - 2 for a sliding layer and
 * n_layer_kv - 1 for a full one. */
int64_t model_hparams_kv_source(const model_hparams *hp, int64_t il);

/* The KV layout the model gives layer il's cache: K and V values per token
 * (all heads; 0 for a layer that shares another's), and its attention window
 * (0: full). */
void model_hparams_layer_kv(const model_hparams *hp, int64_t il, int64_t *k_values,
                            int64_t *v_values, int64_t *window);

#endif
