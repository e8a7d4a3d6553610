/* model: architecture descriptions, weights (pointers into the mmap'd GGUF) and
 * the forward pass over a ragged batch: tokens of several sequences, each with its
 * position and its sequence's block table. K/V are written into and read from the
 * kv pool's blocks; the model never allocates KV memory itself. */
#ifndef KVLLM_MODEL_H
#define KVLLM_MODEL_H

#include "base.h"
#include "gguf.h"
#include "kv.h"
#include "hparams.h"

/* Layers that attend differently keep their KV in different pools: full-attention
 * layers in one, sliding-window layers (which free blocks that leave the window)
 * in another. */
#define MODEL_MAX_KV_GROUPS 2

typedef struct model model; /* opaque */

typedef struct model_params {
    int64_t
        max_ctx; /* longest sequence the scratch must support; <= 0: the file's context_length */
    int64_t max_ctx_cap; /* with max_ctx <= 0, at most this many (<= 0: no cap): a file's
                           * context_length is untrusted, and scratch grows with it */
    int64_t max_ubatch;  /* tokens processed per internal pass (scratch size) */
    bool no_repack;      /* keep matmul weights in their GGUF layout */
    /* > 0: the bytes the load may take, instead of kvl_mem_available(): the
     * weights are repacked only where their copy fits (repack_fits) */
    int64_t mem_available;
    /* Optional, called during the long part of loading (reading and repacking
     * the weights) with the fraction done, 0..1, ending with 1. */
    void (*progress)(double done, void *user);
    void *progress_user;
    /* Pipeline stage (pipeline-parallel serving, engine/pp.h): only layers
     * [layer_first, layer_end) are bound and repacked, and only their KV is in
     * the pools; the first stage also embeds, the last one also has the output
     * norm and head. The other layers' pages of the mapping are never touched.
     * Both 0: the whole model. */
    int layer_first, layer_end;
    /* > 0: the attention chunk of chunked layers (llama4) instead of llama.cpp's
     * fixed 8192. For tests, which cross chunk boundaries in a few hundred tokens;
     * a model so loaded no longer matches llama.cpp past that many positions. */
    int64_t attn_chunk;
    /* llama.cpp's --yarn-ext-factor, --yarn-attn-factor, --yarn-beta-fast,
     * --yarn-beta-slow when yarn_override (each negative: the file's);
     * model_hparams_set_yarn */
    bool yarn_override;
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    /* Chunked layers join the full-attention layers' KV group (window 0, no
     * chunk), so nothing of theirs is dropped; their attention still masks by
     * the chunk. For the disk tier, which needs a single KV group. */
    bool chunks_keep_kv;
} model_params;

/* Loads a GGUF model. The gguf_file is owned by the model afterwards. */
model *model_load(gguf_file *f, const model_params *mp, kvl_error *err);
void model_destroy(model *m);
const model_hparams *model_hp(const model *m);
const gguf_file *model_gguf(const model *m);
/* A reranker's scores from one final hidden state (model_batch.hidden, the
 * last token's: llama.cpp's rank pooling for qwen3): softmax(cls.output .
 * hidden), hp.n_cls_out floats ("yes" first in Qwen3-Reranker files). False
 * (err set) when the model has no classifier head (hp.n_cls_out 0). */
bool model_classify(const model *m, const float *hidden, float *out, kvl_error *err);
/* The routed experts' weight bytes (gate, up and down of each expert a layer's
 * tokens selected, once a layer and forward, in the file's types) read by the
 * forwards since the model was loaded: measured from the routing, where
 * moe.active_bytes counts what one token selects. 0 without experts. */
uint64_t model_moe_routed_bytes(const model *m);

/* KV groups: layouts (layers, heads, widths) for kv_pool_create, and each
 * group's attention rule (kv.h's kv_attn: sliding window, chunks, or full
 * causal). Layers of one rule share a group. Group 0 always exists. */
int model_kv_n_groups(const model *m);
void model_kv_group_shape(const model *m, int group, kv_pool_config *cfg, kv_attn *attn);
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
    /* Optional: the final hidden state (after the output norm, before the LM
     * head) of the tokens with want_logits set, n_embd floats each, in batch
     * order. With hidden set, logits may be NULL: the LM head is skipped.
     * This is what embeddings pool. */
    float *hidden;
    /* LoRA adapters (model_lora_add): NULL, or per sequence (n_seqs entries)
     * model_lora_count() scales, one per adapter, 0 leaving it out; an entry
     * NULL, or lora NULL, means the model's default scales. */
    const float *const *lora;
} model_batch;

/* Runs the batch. Logits of the tokens with want_logits set are written to
 * logits in batch order, n_vocab floats each (and their hidden states to
 * b->hidden when set; logits NULL skips the LM head). Returns false (err set) on invalid
 * input, such as a token id out of range or a position beyond the block table. */
bool model_forward(model *m, kv_pool *const *pools, const model_batch *b, float *logits,
                   kvl_error *err);

/* One sequence's tokens at positions [from, to) (model_span.c), computed
 * MODEL_SPAN_CHUNK tokens per model_forward; positions before from must already
 * be in its blocks. The rows of the positions in [want_from, want_to) are
 * computed (an empty range: none, the LM head is skipped): logits and hidden,
 * either may be NULL, need room for min(MODEL_SPAN_CHUNK, want_to - want_from)
 * rows and hold the last chunk's rows afterwards. */
enum { MODEL_SPAN_CHUNK = 64 };
typedef struct model_span {
    const int32_t *tokens;      /* tokens[p]: the token at position p */
    int64_t from, to;           /* the positions computed */
    int64_t want_from, want_to; /* the positions whose rows are wanted */
    const kv_seq *const *seqs;  /* the sequence's table per KV group, covering [0, to) */
    float *logits;              /* n_vocab floats a row, or NULL */
    float *hidden;              /* n_embd floats a row (see model_batch.hidden), or NULL */
    /* Optional: before each chunk, with its first position (e.g. to free the
     * blocks a sliding window no longer needs, or to count progress). */
    void (*before_chunk)(void *user, int64_t pos);
    /* Optional: after each chunk with wanted rows: n rows, the first at pos. */
    void (*on_rows)(void *user, int64_t pos, int64_t n, const float *logits, const float *hidden);
    void *user;
    const float *lora; /* the adapters' scales (see model_batch.lora); NULL: the defaults */
} model_span;

/* Runs the span; false (err set) as model_forward, with the chunks before the
 * failing one computed. */
bool model_forward_span(model *m, kv_pool *const *pools, const model_span *s, kvl_error *err);

/* ---- LoRA adapters ----
 * llama.cpp's GGUF adapter files (convert_lora_to_gguf.py): general.type
 * "adapter", adapter.type "lora", adapter.lora.alpha, and for each adapted
 * base tensor NAME a pair NAME.lora_a {n_in, rank}, NAME.lora_b {rank, n_out}
 * (token_embd: lora_a {rank, n_vocab}, rows looked up by token). Every
 * adapted matrix W gives W x + s B (A x) per token, s = scale * alpha / rank
 * (scale when alpha is 0), for each adapter whose scale is not 0: the
 * arithmetic of llama.cpp's graph. Adapted here: attention projections (q, k,
 * v, output; MLA's q_a, q_b, kv_a_mqa, kv_b), dense FFN projections, the MoE
 * router and shared expert, the output head and the token embedding; an adapter naming any
 * other tensor is refused by name, as is one whose architecture or shapes
 * do not match the model. */
#define MODEL_MAX_LORA 16
/* Attaches the adapter in f (owned by the model afterwards, closed on
 * failure too) with this default scale. Its index (0, 1, ...) or -1 (err
 * set). Not while a forward runs. */
int model_lora_add(model *m, gguf_file *f, float scale, kvl_error *err);
/* Detaches adapter i and frees it (not while a forward runs); its index stays
 * taken, empty: the others keep theirs, model_lora_get says false for it and
 * a batch must give it scale 0. False if there is no adapter i. */
bool model_lora_remove(model *m, int i);
/* Indices in use so far, removed ones included (scale arrays have this many). */
int model_lora_count(const model *m);
typedef struct model_lora_info {
    const char *path;
    float alpha;
    int64_t rank;         /* the largest of its pairs' ranks */
    int n_pairs;          /* tensors it adapts */
    size_t bytes;         /* its A and B data */
    uint64_t fingerprint; /* a hash of its data: what a cache of K and V computed with it
                           * is keyed by */
    float scale;          /* the default scale */
} model_lora_info;
bool model_lora_get(const model *m, int i, model_lora_info *out);
/* Adapter i's file (its metadata: adapter.lora.task_name, ...), or NULL. */
const gguf_file *model_lora_gguf(const model *m, int i);
/* The default scale of adapter i (what batches without their own use). */
void model_lora_set_scale(model *m, int i, float scale);

/* ---- control vectors ----
 * llama.cpp's --control-vector files (its cvector-generator's output): F32
 * tensors direction.N of n_embd values, N >= 1, the vector added to every
 * token's output of layer N (counted from 0; layer 0 never has one). Files
 * add up, each scaled; the sum applies to layers [first, last] of the range.
 * Adds the directions of f (borrowed: read now) times scale to the model's;
 * false (err set, the model's vectors unchanged) for a tensor that is not a
 * finite F32 direction.N of the model's width. Not while a forward runs. */
bool model_cvec_add(model *m, const gguf_file *f, float scale, kvl_error *err);
/* The layers that get the vectors, inclusive; 0 or less: llama.cpp's
 * defaults (1 and n_layer). */
void model_cvec_set_range(model *m, int first, int last);
bool model_cvec_active(const model *m);
/* The vector added after layer il, or NULL (none, or outside the range). */
const float *model_cvec_layer(const model *m, int il);

/* ---- pipeline stages ----
 * The layers this model holds: [first, end) (all of them unless loaded as a
 * stage). */
int model_layer_first(const model *m);
int model_layer_end(const model *m);
/* Runs the batch through this stage's layers only. x_in: the hidden states
 * entering the first layer (n_tokens x n_embd floats, the previous stage's
 * x_out), NULL to embed the tokens (first stage only). x_out: where the
 * hidden states after the last layer go, NULL to project the wanted rows to
 * logits as model_forward does (last stage only). Every token's numbers are
 * the ones model_forward computes for it, so a pipeline of stages gives the
 * whole model's logits bit for bit. */
bool model_forward_stage(model *m, kv_pool *const *pools, const model_batch *b, const float *x_in,
                         float *x_out, float *logits, kvl_error *err);
/* Replaces what model_forward does for this model (NULL: the plain forward):
 * the pipeline's first stage runs the whole pipeline from it, so every caller
 * of model_forward (engine steps, evaluation) goes through the pipeline. The
 * hook calls model_forward_stage for its own layers. */
typedef bool (*model_forward_fn)(void *user, model *m, kv_pool *const *pools, const model_batch *b,
                                 float *logits, kvl_error *err);
void model_set_forward_hook(model *m, model_forward_fn fn, void *user);
/* Forwards in flight at once (the pipeline's stages busy with several
 * steps): launch starts the forward of b, whose logits are in logits (which
 * must stay valid) once wait has returned for it; waits finish forwards in
 * launch order. launch may return before the forward is done, but b is not
 * read after it returns. Without these hooks model_forward_launch is
 * model_forward and model_forward_wait does nothing. */
typedef bool (*model_wait_fn)(void *user, kvl_error *err);
void model_set_forward_async(model *m, model_forward_fn launch, model_wait_fn wait, void *user);
bool model_forward_launch(model *m, kv_pool *const *pools, const model_batch *b, float *logits,
                          kvl_error *err);
bool model_forward_wait(model *m, kvl_error *err);

/* The reference forward (model_ref.c): one token at pos of one sequence, whose
 * table in KV group g is seqs[g], in plain C with double accumulation and a
 * plain softmax over the block table. Stores the token's K/V like
 * model_forward and writes its n_vocab logits (none when logits is NULL: the
 * output head, the largest matrix, is skipped). For tests: slow, and it
 * allocates per call. False (err set) on a token or position out of range. */
bool model_forward_ref(model *m, kv_pool *const *pools, const kv_seq *const *seqs, int32_t token,
                       int32_t pos, float *logits, kvl_error *err);

#endif
