/* synth: random-weight GGUF files with the exact shapes of real models, for
 * benchmarks. A synthetic file has real hyperparameters, real tensor names,
 * shapes and quantization types (chosen the way llama-quantize chooses them),
 * and a small byte-level BPE vocabulary of the real size, so that kvllm and
 * llama.cpp both load it and do exactly the work the real model would cost.
 * The outputs are meaningless; only the speed is.
 *
 * Tensor data is generated, quantized and written a slice at a time, so an
 * 8B model needs well under 1 GB of memory to write. Values are deterministic
 * for a given (shape, type, seed) whatever the thread count. */
#ifndef KVLLM_SYNTH_H
#define KVLLM_SYNTH_H

#include <stdio.h>

#include "base.h"

typedef struct synth_shape {
    const char *name; /* "llama-3.2-1b" */
    const char *arch; /* GGUF general.architecture: llama, qwen2, qwen3moe, deepseek2 */
    int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    int64_t n_ctx; /* context_length written (may be below the real model's) */
    float rope_base, rms_eps;
    bool tied_output; /* no output.weight: token_embd doubles as the output matrix */
    bool qkv_bias;    /* attn_{q,k,v}.bias (Qwen2) */
    /* Optional (0: off) */
    bool qk_norm; /* attn_{q,k}_norm per head (Qwen3) */
    /* Mixture of experts: n_layer_dense_lead dense layers (n_ff wide), then
     * layers of n_expert routed experts (n_ff_exp wide, n_expert_used per
     * token) plus n_shared_exp shared ones (DeepSeek's shexp, n_ff_exp each). */
    int64_t n_expert, n_expert_used, n_ff_exp, n_shared_exp, n_layer_dense_lead;
    /* MLA (DeepSeek-V2 layout in llama.cpp's current form): the cached latent
     * of kv_lora_rank + the qk_rope key; per head qk_nope + qk_rope for K,
     * v_head_dim for V (head_dim is unused). q_lora_rank > 0: q through the
     * low-rank attn_q_a / attn_q_a_norm / attn_q_b (DeepSeek-V2 / V3 full
     * size), else one attn_q (V2-Lite). */
    int64_t kv_lora_rank, qk_nope, qk_rope, v_head_dim, q_lora_rank;
    /* YaRN rope scaling (factor 0: none; yarn_log_mul 0: key not written) */
    float yarn_factor, yarn_log_mul;
    int64_t yarn_orig_ctx;
    /* gpt-oss's layout: q/k/v/o, router and expert biases, attention sinks, the
     * FFN pre-norm named post_attention_norm, sliding window n_swa on even layers */
    bool gpt_oss;
    int64_t n_swa;
} synth_shape;

/* Weight mixes, named and numbered as llama.cpp's general.file_type. */
typedef enum synth_ftype {
    SYNTH_F16 = 1,
    SYNTH_Q4_0 = 2,
    SYNTH_Q4_1 = 3,
    SYNTH_Q8_0 = 7,
    SYNTH_Q5_0 = 8,
    SYNTH_Q5_1 = 9,
    SYNTH_Q4_K_M = 15,
    SYNTH_Q2_K = 10,
    SYNTH_Q3_K_M = 12,
    SYNTH_Q4_K_S = 14,
    SYNTH_Q5_K_S = 16,
    SYNTH_Q5_K_M = 17,
    SYNTH_IQ4_XS = 30,
    SYNTH_IQ4_NL = 25,
    SYNTH_IQ2_XXS = 19,   /* random codes: kvllm has no lattice quantizer */
    SYNTH_MXFP4_MOE = 38, /* experts MXFP4, the other matrices Q8_0 */
} synth_ftype;

/* NULL if unknown. */
const synth_shape *synth_shape_find(const char *name);
/* The i-th built-in shape, NULL past the end. */
const synth_shape *synth_shape_at(int i);
/* "f16" | "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "iq4_nl" | "q4_k_m" | "q4_k_s" |
 * "q5_k_s" | "q5_k_m" | "q3_k_m" | "q2_k" | "iq4_xs" | "iq2_xxs" | "mxfp4_moe"
 * (case-insensitive). */
bool synth_ftype_parse(const char *name, synth_ftype *out);
const char *synth_ftype_name(synth_ftype t); /* "Q4_K_M" */

/* Storage type of a 2-D weight, as llama-quantize picks it for this mix:
 * `role` is the tensor name without "blk.N." ("attn_v.weight", "token_embd.weight"),
 * il its layer (-1 for non-layer tensors). */
int synth_tensor_dtype(const synth_shape *s, synth_ftype t, const char *role, int il);

/* Exact size of the file synth_write would produce. */
uint64_t synth_file_bytes(const synth_shape *s, synth_ftype t);

/* Progress: bytes of tensor data written so far out of total. */
typedef void (*synth_progress_fn)(uint64_t done, uint64_t total, void *user);

/* Writes the file (removed again on failure) and re-opens it with the GGUF
 * reader as a check. Weights ~ N(0, 0.02) (approximately), norms 1.
 * pool_rows > 0: in a tensor of more rows, the rows from pool_rows on repeat
 * the first ones (same layout, sizes and bytes read per token; quantizing
 * every row of a 30B shape to Q2_K takes hours on two cores). 0: all drawn. */
bool synth_write(const synth_shape *s, synth_ftype t, uint64_t seed, int64_t pool_rows,
                 const char *path, synth_progress_fn progress, void *user, kvl_error *err);

#endif
