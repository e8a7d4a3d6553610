/* Architecture descriptions: what differs between the decoder-only families we
 * load. Adding a family is one table row, plus code only for genuinely new ops. */
#ifndef KVLLM_ARCH_H
#define KVLLM_ARCH_H

#include <stdbool.h>

typedef enum arch_act { ARCH_ACT_SILU = 0, ARCH_ACT_GELU } arch_act;
typedef enum arch_norm { ARCH_NORM_RMS = 0, ARCH_NORM_LAYER } arch_norm;
typedef enum arch_attn { ARCH_ATTN_MHA = 0, ARCH_ATTN_MLA } arch_attn;
/* Routed experts: refused, allowed when expert_count > 0, or required. */
typedef enum arch_moe { ARCH_MOE_NONE = 0, ARCH_MOE_OPTIONAL, ARCH_MOE_REQUIRED } arch_moe;

typedef struct arch_desc {
    const char *name;      /* general.architecture */
    int rope_type;         /* MODEL_ROPE_NORM or MODEL_ROPE_NEOX */
    arch_attn attn;        /* standard (MHA/GQA/MQA) or DeepSeek's multi-head latent */
    arch_act ffn_act;      /* gate activation of the gated FFN */
    bool qk_norm;          /* per-head RMSNorm of q and k before rope (qwen3, gemma3) */
    bool qkv_bias_allowed; /* optional q/k/v biases (qwen2) */
    bool embd_scale;       /* embeddings multiplied by sqrt(n_embd) (gemma) */
    bool post_norms;       /* RMSNorm after attention and after the FFN (gemma2/3) */
    int swa_pattern;       /* default sliding-window layer pattern (0: none; gemma2 2, gemma3 6) */
    int n_layer_27b;       /* layer count of the variant that scales q by 1/sqrt(E/H) (gemma) */
    bool swa_rope_scale_one; /* sliding layers ignore rope frequency scaling (gemma3) */
    arch_moe moe;            /* mixture-of-experts FFN layers (model_moe.c) */
    bool attn_temp;          /* honours attention.temperature_scale (mistral3) */
    int nope_every; /* layers il with (il + 1) % nope_every == 0 skip rope (smollm3: 4; 0: none) */
    bool yarn_beta_keys;     /* reads rope.scaling.yarn_beta_fast/slow (mistral3; others: 32 / 1) */
    arch_norm norm;          /* RMSNorm, or LayerNorm without bias (command-r, cohere2) */
    bool parallel;           /* attention and FFN read the same normed input, both added to the
                             residual; no ffn_norm (command-r, cohere2) */
    bool no_pre_norms;       /* no attn_norm / ffn_norm: post-norms only (olmo2) */
    bool qk_norm_full;       /* q and k RMSNorm over all heads at once (olmo2) */
    bool granite_scales;     /* embedding, residual, attention and logit scales (granite) */
    bool logit_scale;        /* logits multiplied by logit_scale (command-r, cohere2) */
    bool rope_swa_only;      /* only sliding-window layers rotate (cohere2) */
    bool swa_rope_plain;     /* sliding layers rotate without rope scaling (olmo2 / OLMo 3) */
    bool no_swa;             /* llama.cpp ignores attention.sliding_window (phi3) */
    bool fused_gate_up;      /* ffn_up holds the gate rows then the up rows, no ffn_gate (phi3) */
    bool tied_always;        /* the LM head is token_embd whatever the file holds (command-r) */
    bool qk_norm_optional;   /* per-head q/k RMSNorm when the file has it (glm4moe) */
    bool ffn_norm_post_attn; /* the FFN's pre-norm is named post_attention_norm (glm4moe) */
    bool nextn_layers;       /* block_count counts nextn_predict_layers (MTP, skipped; glm4moe) */
    bool gpt_oss; /* attention sinks, attn_output / router / expert biases, softmax over the
                     selected experts' logits, the clamped SwiGLU (gpt-oss; model_moe.c) */
    bool chunked; /* chunked attention, NoPE layers with attention temperature, q/k L2 norm,
                     interleaved MoE weighting the experts' input (llama4; hparams.c) */
    bool gemma4;  /* q.k unscaled, V RMS-normed (and K itself where attn_v is absent),
                    rope_freqs on the full layers only, sliding layers of their own shape,
                    KV shared by the last layers, per-layer inputs, a per-layer output scale
                    (gemma4; gemma3n shares all of it that its files use) */
    bool altup;   /* four AltUp streams of the residual, LAuReL, Gaussian top-k activation
                    sparsity on the first layers (gemma3n; model_altup.c) */
} arch_desc;

/* NULL if the architecture is not supported. */
const arch_desc *arch_find(const char *name);
/* Comma-separated list of supported names, for error messages. */
const char *arch_supported_list(void);
/* The table itself: arch_at(0 .. arch_count() - 1), NULL outside. */
int arch_count(void);
const arch_desc *arch_at(int i);

#endif
