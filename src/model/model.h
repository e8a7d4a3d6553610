/* model: architecture descriptions, weights (pointers into the mmap'd GGUF) and
 * the forward pass over a ragged batch: tokens of several sequences, each with its
 * position and its sequence's block table. K/V are written into and read from the
 * kv pool's blocks; the model never allocates KV memory itself. */
#ifndef KVLLM_MODEL_H
#define KVLLM_MODEL_H

#include "base.h"
#include "gguf.h"
#include "kv.h"

enum { MODEL_ROPE_NORM = 0, MODEL_ROPE_NEOX = 2 };
/* Layers that attend differently keep their KV in different pools: full-attention
 * layers in one, sliding-window layers (which free blocks that leave the window)
 * in another. */
#define MODEL_MAX_KV_GROUPS 2

typedef struct model_hparams {
    char arch[32];
    int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    int64_t head_dim_k, head_dim_v; /* key_length / value_length (default n_embd / n_head) */
    int64_t n_rot;                  /* rope.dimension_count */
    int rope_type;                  /* MODEL_ROPE_* */
    float rope_base, rope_freq_scale;
    float rms_eps;
    bool tied_output;
    bool has_rope_freqs; /* Llama 3.1 rope_freqs.weight frequency factors */
    int64_t n_swa;       /* sliding window (tokens), 0 if none */
    int64_t n_swa_layers;
    float attn_softcap, final_softcap; /* gemma2 logit soft-capping (0: off) */
    int64_t kv_lora_rank, q_lora_rank, n_rot_mla_nope, v_head_dim_mla; /* MLA */
    int64_t n_params;
    size_t weights_bytes;
    int64_t repacked_bytes; /* matmul weights held in the kernels' layout instead (0: none) */
} model_hparams;

typedef struct model model; /* opaque */

typedef struct model_params {
    int64_t max_ctx;      /* longest sequence the scratch must support */
    int64_t max_ubatch;   /* tokens processed per internal pass (scratch size) */
    bool no_repack;       /* keep matmul weights in their GGUF layout */
} model_params;

/* Loads a GGUF model. The gguf_file is owned by the model afterwards. */
model *model_load(gguf_file *f, const model_params *mp, kvl_error *err);
void model_destroy(model *m);
const model_hparams *model_hp(const model *m);
const gguf_file *model_gguf(const model *m);

/* KV groups: layouts (layers, heads, widths) for kv_pool_create, and each
 * group's attention window (0: full). Group 0 always exists. */
int model_kv_n_groups(const model *m);
void model_kv_group_shape(const model *m, int group, kv_pool_config *cfg, int32_t *window);
/* Group 0's layout (kept for callers that know the model has one group). */
void model_kv_shape(const model *m, kv_pool_config *cfg);

/* One ragged batch. Token i belongs to sequence seq[i] at position pos[i]; all of
 * a sequence's earlier positions must already be in its blocks or earlier in this
 * batch. Sequences' block tables must already cover their positions.
 * seqs holds n_seqs * n_groups tables: seqs[s * n_groups + g] is sequence s's
 * table in KV group g. */
typedef struct model_batch {
    int64_t n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *seq;         /* index into seqs */
    const uint8_t *want_logits; /* 1 to return logits of this token (NULL: last only) */
    int n_seqs;
    const kv_seq *const *seqs;
} model_batch;

/* Runs the batch. Logits of the tokens with want_logits set are written to
 * logits in batch order, n_vocab floats each. Returns false (err set) on invalid
 * input, such as a token id out of range or a position beyond the block table. */
bool model_forward(model *m, kv_pool *const *pools, const model_batch *b, float *logits,
                   kvl_error *err);

#endif
