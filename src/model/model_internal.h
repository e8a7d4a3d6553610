/* model, private: the weight structs and scratch shared by the loader
 * (model.c), the ops (model_ops.c) and the forward pass (model_forward.c). */
#ifndef KVLLM_MODEL_INTERNAL_H
#define KVLLM_MODEL_INTERNAL_H

#include "kernels.h"
#include "arch.h"
#include "model.h"

typedef struct mtensor {
    const void *data;
    void *packed; /* owned: the kernels' repacked layout of data, or NULL */
    int dtype;
    int64_t ne0, ne1, ne2; /* ne0: row length (input dim), ne1: rows (output dim), ne2: heads */
    /* bytes from one expert's (ne2 slice's) rows in data to the next; 0: ne1 rows. A view
     * into a fused gate+up expert tensor sets it (model_moe.c). */
    size_t expert_stride;
    /* LoRA adapters that adapt this matrix (model_lora.c), in adapter order;
     * NULL: none. op_matmul adds their products to its output. */
    struct lora_link *lora;
} mtensor;

/* Bytes of one 2-D slice of t (a matrix, or one expert of a 3-D tensor) in
 * its file type; 0 where absent. */
static inline double mtensor_slice_bytes(const mtensor *t) {
    return t->data ? (double)kern_row_bytes(t->dtype, t->ne0) * (double)t->ne1 : 0.0;
}

typedef struct layer_weights {
    mtensor attn_norm;        /* [E] */
    mtensor wq, wk, wv, wo;   /* [E -> Hq*dk], [E -> Hkv*dk], [E -> Hkv*dv], [Hq*dv -> E] */
    mtensor bq, bk, bv;       /* optional biases */
    mtensor bo;               /* optional attn_output bias [E] (granite) */
    mtensor q_norm, k_norm;   /* optional per-head norms [dk] */
    mtensor post_attn_norm;   /* gemma: [E] */
    mtensor ffn_norm;         /* [E] */
    mtensor ffn_gate, ffn_up; /* [E -> F] */
    mtensor ffn_down;         /* [F -> E] */
    mtensor post_ffn_norm;    /* gemma: [E] */
    mtensor out_scale;        /* gemma4: [1], the layer's output (the residual stream) scale */
    mtensor pl_inp_gate;      /* gemma4 E2B / E4B: [E -> n_pl] gate of the per-layer input */
    mtensor pl_proj;          /* [n_pl -> E] */
    mtensor pl_post_norm;     /* [E] */
    /* gemma3n: AltUp's router and coefficients, LAuReL's low-rank residual */
    mtensor altup_router, altup_router_norm;      /* [E -> 4], [E] */
    mtensor altup_predict_coef;                   /* [4 -> 16] */
    mtensor altup_correct_coef;                   /* [4 -> 4] */
    mtensor altup_correct_scale;                  /* [E] */
    mtensor laurel_l, laurel_r, laurel_post_norm; /* [E -> 64], [64 -> E], [E] */
    /* MLA (deepseek2), llama.cpp's absorbed layout */
    mtensor wq_a, q_a_norm, wq_b; /* [E -> q_lora], [q_lora], [q_lora -> H*(nope+rope)] */
    mtensor wkv_a_mqa, kv_a_norm; /* [E -> kv_lora+rope], [kv_lora] */
    mtensor wk_b;                 /* {nope, kv_lora, H}: per head kv_lora rows of nope */
    mtensor wv_b;                 /* {kv_lora, v, H}: per head v rows of kv_lora */
    mtensor wkv_b; /* uncompressed form instead of k_b/v_b: [kv_lora -> H*(nope+v)] */
    /* mixture of experts (model_moe.c); ffn_gate_inp.data NULL: a dense FFN */
    mtensor ffn_gate_inp;                 /* [E -> n_expert] router */
    mtensor exp_probs_b;                  /* [n_expert] selection bias (optional) */
    mtensor ffn_gate_exps, ffn_up_exps;   /* {E, ff_exp, n_expert} */
    mtensor ffn_down_exps;                /* {ff_exp, E, n_expert} */
    mtensor ffn_gate_shexp, ffn_up_shexp; /* [E -> ff_shexp] (optional) */
    mtensor ffn_down_shexp;               /* [ff_shexp -> E] */
    mtensor ffn_gate_inp_shexp;           /* [E -> 1] qwen2moe's shared expert gate */
    /* gpt-oss: router and expert biases (F32), attention sinks (one logit per q head) */
    mtensor ffn_gate_inp_b;                 /* [n_expert] */
    mtensor ffn_gate_exps_b, ffn_up_exps_b; /* {ff_exp, n_expert} */
    mtensor ffn_down_exps_b;                /* {E, n_expert} */
    mtensor attn_sinks;                     /* [n_head] */
    /* gemma4: the router's input scale, each expert's output scale, and the
     * norms around the experts and the dense FFN that runs beside them */
    mtensor ffn_gate_inp_s;  /* [E] */
    mtensor ffn_down_exps_s; /* [n_expert] (optional) */
    mtensor ffn_pre_norm_2;  /* [E] the experts' input */
    mtensor ffn_post_norm_1; /* [E] the dense FFN's output */
    mtensor ffn_post_norm_2; /* [E] the experts' output */
    /* attention geometry of this layer */
    bool swa;        /* sliding-window layer */
    int32_t chunk;   /* chunked attention over this many positions (llama4; 0: none) */
    bool rope;       /* q and k rotate (not a NoPE layer) */
    bool rope_plain; /* rotate without YaRN or attn_factor (olmo2's sliding layers) */
    bool rope_freqs; /* the model's rope_freqs apply (gemma4: its full layers only) */
    float rope_base, rope_freq_scale;
    int64_t n_head_kv, dk, dv, n_rot; /* model_hparams_layer_attn */
    int kv_group, kv_slot;            /* which pool and which layer within it */
    bool kv_shared; /* reads another layer's cache (that layer's group and slot), stores none */
} layer_weights;

typedef struct kv_group_desc {
    int n_layers;
    kv_attn attn; /* the positions a token attends to (kv.h): window, chunk, or neither */
    int n_kv_heads, head_dim_k, head_dim_v; /* its layers' KV shape (head_dim_v 0: MLA) */
} kv_group_desc;

/* op_rope's cosines and sines (times mscale) for the last position and layer
 * parameters it rotated by: q and k of a token, and the layers that share a
 * base, reuse them instead of n_rot sinf/cosf each. The rest the table
 * depends on (YaRN, the rope_freqs values) is fixed at load. */
typedef struct {
    bool valid, plain, freqs;
    int32_t pos, n_rot;
    float base, freq_scale;
    float cs[512], sn[512]; /* n_rot <= head_dim <= 1024: at most 512 pairs */
} rope_table;

struct model {
    gguf_file *gguf;
    const arch_desc *arch;
    model_hparams hp;
    model_params mp;
    mtensor tok_embd;    /* [E] x n_vocab */
    mtensor output_norm; /* [E] */
    mtensor output;      /* [E -> n_vocab] (token_embd when tied) */
    mtensor cls_out;     /* [E -> n_cls_out]: qwen3 rerankers' head, or none */
    /* gemma4 E2B / E4B: per-token inputs of every layer (n_embd_per_layer each) */
    mtensor pl_tok_embd;                   /* [n_layer * n_pl] x n_vocab */
    mtensor pl_model_proj;                 /* [E -> n_layer * n_pl] */
    mtensor pl_proj_norm;                  /* [n_pl] */
    mtensor altup_proj, altup_unembd_proj; /* gemma3n: {E, E, 3}, the extra streams in and out */
    int32_t *suppress; /* gemma4: tokenizer.ggml.suppress_tokens, whose logits are -inf */
    int64_t n_suppress;
    const float *rope_freqs; /* [n_rot/2] or NULL */
    layer_weights *layers;
    kv_group_desc groups[MODEL_MAX_KV_GROUPS];
    int n_groups;

    /* Scratch, allocated once for max_ubatch tokens. */
    int n_threads_max;
    float *x, *xb, *xb2, *q, *k, *v, *att, *ff_gate, *ff_up;
    float *mla_a, *mla_b; /* MLA per-head gather buffers */
    void *head_work;      /* [n_threads_max][head_work_slot]: op_matmul_heads1 */
    size_t head_work_slot;
    void *head_each_work; /* [n_threads_max][head_each_slot]: op_matmul_heads1 on repacked heads */
    size_t head_each_slot;
    float *par;          /* command-r: the attention output while the FFN runs; gemma4: the
                            router's input */
    float *pl_in;        /* [max_ubatch][n_layer][n_pl] gemma4's per-layer inputs */
    float *pl_row;       /* [n_layer * n_pl] one token's per-layer embedding row */
    float *pl_tmp;       /* [max_ubatch][n_pl] */
    float *alt;          /* gemma3n (model_altup.c): streams, predictions, LAuReL rows */
    float *attn_scratch; /* [n_threads_max][attn_scratch_len], sized for the pools in use */
    size_t attn_scratch_len;
    int32_t *attn_runs;        /* [max_ubatch][2]: first token, count of each run (attention) */
    void *work;                /* matmul activation quantization */
    size_t work_bytes;         /* its size */
    float *logit_rows;         /* [max_ubatch][E] normed rows to project */
    struct moe_scratch *moe;   /* model_moe.c; NULL for a dense model */
    uint64_t moe_routed_bytes; /* model_moe_routed_bytes */
    rope_table rope_tab;       /* op_rope's last table */
    struct lora_state *lora;   /* model_lora.c; NULL: no adapter attached */
    float *cvec;               /* model_cvec.c: [n_layer][E] control vectors, or NULL */
    int cvec_first, cvec_last; /* the layers they apply to, inclusive */

    /* Pipeline stage: layers [layer_first, layer_end) are bound; the others'
     * layer_weights stay zero. */
    int layer_first, layer_end;
    model_forward_fn forward_hook;
    void *forward_hook_user;
    model_forward_fn launch_hook;
    model_wait_fn wait_hook;
    void *async_user;
};

static inline bool model_first_stage(const model *m) { return m->layer_first == 0; }
static inline bool model_last_stage(const model *m) { return m->layer_end == m->hp.n_layer; }

/* ---- loading helpers (model.c) ---- */
/* Looks up a weight and checks its shape and type (ne1 0: a 1-D F32 vector). */
bool model_bind(model *m, mtensor *t, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                bool required, kvl_error *err);
/* model_bind of layer il's weight blk.<il>.<suffix>. */
bool model_bind_blk(model *m, int il, mtensor *t, const char *suffix, int64_t ne0, int64_t ne1,
                    int64_t ne2, bool required, kvl_error *err);

/* ---- mixture of experts (model_moe.c) ---- */
/* Refuses experts the architecture lacks, and a MoE architecture without them. */
bool moe_check_support(const model *m, kvl_error *err);
/* Whether layer il has a routed-expert FFN. */
bool moe_layer(const model *m, int il);
/* Binds layer il's router, experts and shared expert. */
bool moe_bind_layer(model *m, int il, kvl_error *err);
/* One walk over the repackable weights (model.c repack_weights, then
 * moe_repack): with count_only it adds up what the copies would take; else it
 * repacks each weight whose copy still fits in budget. */
typedef struct repack_walk {
    bool count_only;
    bool reclaim;   /* the file's pages freed, not only unmapped (kvl_drop_file_pages) */
    size_t budget;  /* bytes the copies may take (SIZE_MAX: every one) */
    size_t total;   /* bytes of the copies made (count_only: they would take) */
    size_t skipped; /* bytes of the copies left out for the budget */
} repack_walk;
/* Whether a copy of bytes is to be made now: adds them to total, or to
 * skipped where they would pass the budget; false with count_only. */
bool repack_walk_take(repack_walk *w, size_t bytes);
/* Repacks the experts (each expert's slice in the kernels' layout), a layer's
 * expert and shared-expert matrices all or none (the fused decode wants them
 * all); the file's pages are given back as each tensor is done. */
bool moe_repack(model *m, repack_walk *w, kvl_error *err);
/* Reports loading progress (mp.progress) if the caller asked for it. */
void model_progress(const model *m, double done);
size_t moe_work_bytes(const model *m, int64_t rows);
bool moe_alloc_scratch(model *m, kvl_error *err);
void moe_free(model *m);
/* The MoE FFN of layer il on n normed rows x [n][E]: result in y [n][E]. The
 * router reads router_x [n][E] (gemma4's own input), or x when NULL. */
void moe_ffn(model *m, const layer_weights *L, const float *x, const float *router_x, int64_t n,
             float *y);

/* The per-layer input branch of gemma4 E2B / E4B and gemma3n (model_forward.c):
 * out [n][E] = RMSNorm(proj (GELU(inp_gate g) x layer il's slice of m->pl_in)). */
void per_layer_branch(model *m, const layer_weights *L, int il, const float *g, int64_t n,
                      float *out);

/* ---- gemma3n's AltUp and LAuReL (model_altup.c) ---- */
#define ALTUP_N     4  /* streams (llama.cpp's n_altup) */
#define LAUREL_RANK 64 /* llama.cpp's laurel_rank */
/* The scratch the functions below need for max_ubatch tokens (floats). */
size_t altup_scratch_floats(const model *m);
/* The four streams [n][4][E] of a ubatch from its embeddings x [n][E]. */
void altup_embed(model *m, const float *x, int64_t n);
/* The layer's predictions of every stream (into the predictions buffer); the
 * active one (stream 0) into x [n][E]. */
void altup_predict(model *m, const layer_weights *L, int64_t n, float *x);
/* LAuReL of the normed rows h [n][E]: out = RMSNorm(r (l h)) + h. */
void altup_laurel(model *m, const layer_weights *L, const float *h, int64_t n, float *out);
/* The streams corrected by the layer's output y [n][E], then the per-layer
 * input added to streams 1-3 (m->pl_in). */
void altup_correct(model *m, const layer_weights *L, int il, const float *y, int64_t n);
/* The streams merged back into x [n][E] (the model's output rows). */
void altup_unembed(model *m, float *x, int64_t n);
/* The streams [n][ALTUP_N][E] a layer leaves (what its control vector adds to). */
float *altup_streams(model *m);
/* The FFN gate's Gaussian top-k: x - (mean + 1.6448533 std), floored at 0, per row. */
void altup_gaussian_topk(float *x, int64_t rows, int64_t n);

/* ---- control vectors (model_cvec.c) ---- */
/* Adds layer il's control vector (if any) to rows x [rows][E]. */
void cvec_apply(const model *m, int il, float *x, int64_t rows);

/* ---- LoRA adapters (model_lora.c) ---- */
/* Before a ubatch's layers: each of its n tokens' adapter scales (the batch's
 * per-sequence ones, or the model's defaults), the rows op_matmul's adapted
 * matrices see until lora_rows_head. Nothing without adapters. */
void lora_rows_tokens(model *m, const model_batch *b, int64_t t0, int64_t n);
/* Before the LM head: the rows are the wanted tokens of the ubatch, in order. */
void lora_rows_head(model *m, const model_batch *b, int64_t t0, int64_t n);
/* y [rows][w->ne1] += every adapter's scale * B (A x) for each row whose scale
 * for it is not 0 (llama.cpp's build_lora_mm), x [rows][w->ne0]. */
void lora_apply(model *m, const mtensor *w, const float *x, int64_t rows, float *y);
/* The token embedding's adapters for the ubatch's rows x [n][E] (before any
 * embedding scale, as llama.cpp's build_inp_embd adds them). */
void lora_embed(model *m, const int32_t *tokens, int64_t n, float *x);
void lora_free(model *m);

/* ---- ops (model_ops.c) ---- */
/* w NULL: no weight (llama4's q/k L2 norm is a weightless RMSNorm). */
void op_rms_norm(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps);
/* A row's mean as ggml takes it (double sum, float divide), and the double sum of
 * its centred values' float squares (ggml_norm's variance, gemma3n's Gaussian top-k). */
float op_row_moments(const float *x, int64_t n, double *centred_ss);
/* LayerNorm without bias (ggml_norm then the weight): (x - mean) / sqrt(var + eps) * w. */
void op_layer_norm(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps);
void op_matmul(model *m, const mtensor *w, const float *x, int64_t rows, float *y);
void op_matmul_many(model *m, int nw, const mtensor *const *ws, const float *x, int64_t rows,
                    float *const *ys);
/* One head slice of a 3-D weight {ne0, ne1, H}: rows ne1 of ne0. */
void op_matmul_head(model *m, const mtensor *w, int64_t head, const float *x, int64_t rows,
                    float *y);
/* One row (decode): every head's slice of w applied to x + h * xs into
 * y + h * ys, the heads split over the pool; the same as op_matmul_head per
 * head. Needs m->head_work. */
/* Bytes between two heads' repacked slices of a 3-D weight (64-byte aligned). */
static inline size_t model_head_stride(const mtensor *t) {
    return (kern_repack_bytes(t->dtype, t->ne1, t->ne0) + 63) & ~(size_t)63;
}
void op_matmul_heads1(model *m, const mtensor *w, int64_t n_heads, const float *x, int64_t xs,
                      float *y, int64_t ys);
void op_add_bias(float *y, const mtensor *b, int64_t rows, int64_t n);
/* Rotates dims [offset, offset+n_rot) of each of n_heads heads spaced stride apart. */
void op_rope(model *m, const layer_weights *L, float *vec, int n_heads, int64_t stride,
             int64_t offset, int32_t pos);
/* g = GELU(g) * u, or GELU(g) with u NULL (llama.cpp's f16-table GELU). */
void op_gelu_mul(float *g, const float *u, int64_t n);
/* Each run of n values of x[count] (n a power of two) times the orthonormal
 * Walsh-Hadamard matrix, in place, as ggml's fwht computes it. */
void op_hadamard(float *x, int64_t count, int64_t n);
void op_silu_mul(float *g, const float *u, int64_t n);

/* Attention of one query head over its sequence's paged KV. */
typedef struct attn_args {
    const kv_pool *kv;
    int slot; /* layer within the pool */
    int64_t dk, dv;
    bool v_in_k;    /* MLA: V is the first dv values of the K row */
    float scale;    /* applied to q.k */
    float softcap;  /* 0: off; else scores = softcap * tanh(scores / softcap) */
    int32_t window; /* 0: full causal; else positions (pos - window, pos] */
    /* NULL, or per query head (all heads) a logit added to the softmax's
     * denominator (gpt-oss): a chunk of weight exp(sink) and no value */
    const float *sinks;
    int32_t chunk; /* 0: none; else positions from kv_chunk_first(pos, chunk) (llama4) */
} attn_args;
/* Attention of the n_q query heads that share KV head kvh, for one token at pos:
 * each block's K and V slice is widened once and used by all n_q heads. q rows
 * are q_stride apart, outputs out_stride apart. scratch holds
 * op_attend_scratch_floats(...) floats. */
/* max_threads: how many threads its chunks may spread over (1: this thread). */
void op_attend_group(const attn_args *a, const kv_seq *s, int32_t pos, int kvh, int n_q,
                     const float *q, int64_t q_stride, float *out, int64_t out_stride,
                     float *scratch, int max_threads);
/* Positions are attended in chunks of this many, fixed by absolute position. */
#define OP_ATTN_CHUNK 256
/* The same for ntok consecutive tokens of one sequence at positions pos0,
 * pos0 + 1, ..., all within one chunk, full causal attention (no window; an
 * attention chunk (a->chunk) only if it is a multiple of OP_ATTN_CHUNK):
 * every result is bit-identical to op_attend_group's for each token alone,
 * but each K and V row is read once for all of them (prefill). Token t's q
 * rows start at q + t * q_tok_stride (heads dk apart), its outputs at
 * out + t * out_tok_stride (heads dv apart). ntok at most
 * op_attend_run_max_tokens(n_q, dv, max_ctx); one thread. */
void op_attend_run(const attn_args *a, const kv_seq *s, int32_t pos0, int ntok, int kvh, int n_q,
                   const float *q, int64_t q_tok_stride, float *out, int64_t out_tok_stride,
                   float *scratch);
int op_attend_run_max_tokens(int n_q, int64_t dv, int64_t max_ctx);
size_t op_attend_scratch_floats(const kv_pool_config *c, int n_q, int64_t dk, int64_t dv,
                                int64_t max_ctx);

#endif
