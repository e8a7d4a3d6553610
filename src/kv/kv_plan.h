/* kv_plan: the KV cache capacity planner. Pure arithmetic over a model's
 * attention shape: the calculated lower bound (2 x L x n_kv x d_head x T x B x
 * dtype_bytes, generalised to MLA, sliding windows and quantized KV), the paged
 * allocation with block rounding and per-sequence metadata, weights + KV against
 * a budget, and what GQA / MLA / SWA / KV quantization save against their
 * baselines. The shape is a plain description (kv_plan_model) that the
 * model layer's one hyperparameter reader fills from a GGUF or a Hugging Face
 * config.json (model/hparams.h), or that flags give by hand.
 *
 * The figures are kvllm's: its pool's KV types and row sizes (kv.h), its KV
 * groups (full-attention, sliding-window and chunked layers paged apart, sliding
 * blocks dropped as they leave the window, chunked ones when the next chunk
 * begins), its block tables. Everything is in exact
 * bytes (uint64_t, overflow-checked). kv_plan_measure is the one function that
 * touches the engine: it replays sequences through the real block pools (kv.h)
 * so that the planner's allocation can be checked against them. */
#ifndef KVLLM_KV_PLAN_H
#define KVLLM_KV_PLAN_H

#include "base.h"
#include "gguf.h"
#include "kv.h"

/* KV element types the planner knows: exactly the engine pool's (kv.h). Sizes
 * come from kv_row_bytes, so the planner and the pool cannot disagree:
 *   f32 4 B, f16 / bf16 2 B per value;
 *   q8_0: ggml Q8_0 blocks of 32 values along a token's whole K row or V row (all
 *         KV heads of a layer together), 34 B per 32 values; a row whose value
 *         count is not a multiple of 32 is refused (the pool refuses it too);
 *   fp8:  E4M3, exactly 1 B per value with a static scale of 1 (vLLM's default
 *         fp8 cache). There are no per-block scale bytes: the planner used to
 *         count one f32 scale per K/V tensor per layer per block
 *         (KV_PLAN_FP8_SCALE_BYTES 4); that constant is gone because the
 *         engine's pool stores none. */
typedef enum kv_plan_dtype {
    KV_PLAN_F32 = 0,
    KV_PLAN_F16,
    KV_PLAN_BF16,
    KV_PLAN_FP8,  /* the pool's KV_DT_FP8_E4M3 */
    KV_PLAN_Q8_0, /* the pool's GGUF_DT_Q8_0 */
    /* llama.cpp's 4- and 5-bit cache types, blocks of 32 values as q8_0's: q5_0
     * 22 B, q4_0 and iq4_nl 18 B per 32 values */
    KV_PLAN_Q5_0,
    KV_PLAN_Q4_0,
    KV_PLAN_IQ4_NL,
    KV_PLAN_DTYPE_COUNT
} kv_plan_dtype;

/* Per-sequence metadata: the block table holds one int32 block id per block, and
 * each sequence has a fixed header. The header is defined as one 64-byte cache
 * line: kv_seq itself (pointer, count, capacity: 24 bytes on LP64) plus the
 * scheduler's per-sequence state (position, length, state, request id), rounded
 * up to a line so the figure does not depend on the build. */
#define KV_PLAN_BLOCK_ENTRY_BYTES 4
#define KV_PLAN_SEQ_HEADER_BYTES  64

/* Attention shape. All per-layer widths are uniform across layers. */
typedef struct kv_plan_model {
    char arch[32];    /* general.architecture / model_type (informational) */
    int64_t n_layers; /* layers that keep a KV cache */
    /* Layers that read an earlier layer's cache and keep none (Gemma 4 E2B / E4B,
     * Gemma 3n: shared_kv_layers); informational, not in n_layers. */
    int64_t n_layers_shared_kv;
    int64_t n_head; /* query heads: the MHA baseline has this many KV heads */
    int64_t n_kv_heads;
    int64_t head_dim_k, head_dim_v;
    /* MLA (DeepSeek): each layer caches one latent of kv_lora_rank values plus the
     * decoupled RoPE key of rope_dim values per token, instead of per-head K/V.
     * mha_head_dim_k/v are the per-head widths of the MHA it replaces. */
    int64_t kv_lora_rank; /* > 0: MLA */
    int64_t rope_dim;
    int64_t mha_head_dim_k, mha_head_dim_v;
    /* Sliding window: n_swa_layers layers keep only the last sliding_window tokens. */
    int64_t sliding_window; /* 0: none */
    int64_t n_swa_layers;   /* kvllm pages these apart (a second KV group; see kv_plan) */
    /* The sliding layers' own KV heads and head widths (gemma4); 0: the values above */
    int64_t n_kv_heads_swa, head_dim_k_swa, head_dim_v_swa;
    /* Chunked attention (llama4): n_chunk_layers other layers attend only within
     * their chunk of attn_chunk positions (kv.h's kv_chunk_first). kvllm pages
     * them apart too, and drops a chunk's blocks when the next chunk begins. */
    int64_t attn_chunk; /* 0: none */
    int64_t n_chunk_layers;
    /* Where the file says so: the weights' bytes (GGUF tensor data), the bytes
     * per parameter (config.json torch_dtype) and the natural KV dtype. */
    uint64_t weights_bytes; /* 0: unknown */
    int64_t param_bytes;    /* 0: unknown */
    int kv_dtype;           /* kv_plan_dtype; -1: not given */
    /* Mixture of experts (informational: all experts must be resident, so the
     * budget counts weights_bytes whole; a token reads only active_bytes). */
    int64_t n_expert, n_expert_used; /* 0: dense */
    uint64_t active_weights_bytes;   /* weights read per token (GGUF); 0: unknown */
} kv_plan_model;

typedef struct kv_plan_request {
    int64_t context;     /* T: tokens per sequence */
    int64_t concurrency; /* B: sequences */
    int dtype;           /* kv_plan_dtype of K (and of V unless split_v) */
    bool split_v;        /* V stored as dtype_v (--kv-type-v) */
    int dtype_v;
    int64_t block_size;     /* tokens per block */
    uint64_t weights_bytes; /* 0: unknown / not counted */
    uint64_t budget_bytes;  /* 0: no budget */
} kv_plan_request;

typedef struct kv_plan {
    uint64_t k_row_bytes, v_row_bytes;         /* one token, one layer, as stored */
    uint64_t swa_k_row_bytes, swa_v_row_bytes; /* a sliding layer's (= the above unless the
                                                  model gives sliding layers their own shape) */
    uint64_t bytes_per_token;                  /* all layers, K + V (the formula, no window) */
    uint64_t seq_lower_bound_bytes;            /* one sequence of T tokens, windows applied */
    uint64_t lower_bound_bytes;                /* x B */
    /* Allocation, as kvllm's engine pages it: full-attention layers and sliding
     * layers are separate KV groups, each with its own pool (a block holds
     * block_size tokens of every layer of its group). A sliding group drops a
     * sequence's blocks once they leave the window (kv_seq_drop_before before
     * each step), so while decoding one token per step it holds at most
     * ceil((W-1)/bs) + 1 blocks: the allocation (what each pool must have room
     * for) counts that peak. A prefill chunk of c tokens past the window holds
     * its c tokens' blocks as well for that step. */
    uint64_t block_bytes;       /* full-attention group's block (0: no such layers) */
    uint64_t swa_block_bytes;   /* sliding group's block (0: none) */
    int64_t blocks_per_seq;     /* ceil(T / block_size) */
    int64_t swa_blocks_per_seq; /* peak: min(ceil(T/bs), ceil((W-1)/bs) + 1) */
    /* A chunked group (llama4) drops the previous chunk's blocks when a token
     * starts a new one: it holds the blocks of the current chunk's positions,
     * at most c + bs - 1 positions' worth (c / bs blocks when c is a multiple
     * of bs), never more than the whole sequence: kv_plan_blocks_peak. */
    uint64_t chunk_block_bytes;   /* chunked group's block (0: none) */
    int64_t chunk_blocks_per_seq; /* peak */
    uint64_t seq_allocated_bytes; /* peak per sequence (the groups' peaks summed) */
    uint64_t allocated_bytes;     /* x B */
    /* What a sequence holds right after its T-th token's KV is written in a
     * one-token step (the engine's kv_allocated_bytes at the end of a run whose
     * kv_tokens is T): the sliding group keeps only the blocks of positions
     * [T-W, T), which can be one block fewer than the peak when the window is
     * block-aligned. Equal to the peak without sliding layers. */
    int64_t swa_blocks_held;
    int64_t
        chunk_blocks_held; /* the chunked group's: blocks of positions [T-1 rounded down to c, T) */
    uint64_t seq_held_bytes;
    uint64_t seq_metadata_bytes; /* table entries x 4 + header */
    uint64_t metadata_bytes;     /* x B */
    uint64_t weights_bytes;
    uint64_t total_bytes; /* weights + allocated + metadata */
    /* With a budget: */
    bool fits;
    int64_t max_concurrency; /* largest B at this T whose total fits */
} kv_plan;

/* One feature's saving: the plan against the same plan without the feature. */
typedef struct kv_plan_saving {
    char what[16];     /* "GQA", "MQA", "MLA", "SWA", "chunked", "fp8", "q8_0" */
    char baseline[64]; /* "MHA, 64 KV heads", "no window", "f16" ... */
    bool in_plan;      /* the feature is part of this plan (not hypothetical) */
    uint64_t bytes_per_token, base_bytes_per_token;
    uint64_t lower_bound_bytes, base_lower_bound_bytes;
    uint64_t allocated_bytes, base_allocated_bytes;
} kv_plan_saving;
#define KV_PLAN_MAX_SAVINGS 9

/* "f16" <-> KV_PLAN_F16 ... (the pool's names, kv_dtype_parse; case-insensitive).
 * Parse returns false for unknown names. */
bool kv_plan_dtype_parse(const char *s, int *out);
const char *kv_plan_dtype_name(int dtype);
/* The pool's dtype id (GGUF_DT_F16, KV_DT_FP8_E4M3...) of a kv_plan_dtype; -1 if none. */
int kv_plan_pool_dtype(int dtype);
/* Bytes of a row of n values stored as dtype: kv_row_bytes. 0 when the pool
 * refuses the row (q8_0 and n not a multiple of 32). */
uint64_t kv_plan_row_bytes(int dtype, int64_t n_values);
/* Blocks a group with attention rule a (kv.h) holds for one sequence once
 * positions [0, tokens) are written, the last step having computed last_chunk
 * tokens: the engine drops the blocks holding only positions before
 * kv_attn_first(a, tokens - last_chunk) before that step. With last_chunk 1
 * (decoding) and a window W this is the blocks of the last W positions; with
 * chunks of c, those of positions [(tokens-1) / c * c, tokens). */
int64_t kv_plan_blocks_held(kv_attn a, int64_t block_size, int64_t tokens, int64_t last_chunk);
/* The most blocks such a group holds for one sequence while decoding positions
 * [0, tokens) one per step: a window's min(ceil(T/bs), ceil((W-1)/bs) + 1), a
 * chunk's most blocks touched by one chunk's positions; with both, the smaller
 * of the two (a bound). ceil(T/bs) under full attention. */
int64_t kv_plan_blocks_peak(kv_attn a, int64_t block_size, int64_t tokens);

/* An empty model (all zero, kv_dtype -1), for shapes given by hand. */
void kv_plan_model_init(kv_plan_model *m);
/* Checks that the shape is complete and within sane bounds. */
bool kv_plan_model_check(const kv_plan_model *m, kvl_error *err);
static inline bool kv_plan_is_mla(const kv_plan_model *m) { return m->kv_lora_rank > 0; }
/* Whether the sliding layers have a KV shape of their own (gemma4). */
static inline bool kv_plan_swa_own_shape(const kv_plan_model *m) {
    return m->n_swa_layers > 0 && (m->n_kv_heads_swa || m->head_dim_k_swa || m->head_dim_v_swa);
}

/* The plan for r. False (err set) on an invalid shape/request or on overflow. */
bool kv_plan_compute(const kv_plan_model *m, const kv_plan_request *r, kv_plan *out,
                     kvl_error *err);
/* What each applicable feature saves; returns how many were written (<= cap). */
int kv_plan_savings(const kv_plan_model *m, const kv_plan_request *r, kv_plan_saving *out, int cap);

/* ---- agreement with the engine ----
 * A KV group as the engine builds it: a pool layout (layers, heads, widths,
 * block size, K/V types; n_blocks left 0) and its attention window (0: full). */
#define KV_PLAN_MAX_GROUPS 3
typedef struct kv_plan_group {
    kv_pool_config cfg;
    int64_t window; /* the group's kv_attn: 0, or a sliding window */
    int64_t chunk;  /* 0, or an attention chunk */
} kv_plan_group;

/* The planner's own KV groups for (m, r): the full-attention layers (if any),
 * then the sliding layers (if any), then the chunked ones (if any), as kvllm
 * pages them. Returns how many (1 to 3), or 0 with err set on an invalid
 * shape/request or a row the KV type cannot store. (The engine orders its
 * groups by first layer; match by window and chunk.) */
int kv_plan_pool_groups(const kv_plan_model *m, const kv_plan_request *r, kv_plan_group *out,
                        kvl_error *err);

/* What the engine's pools held, measured, summed over the sequences. */
typedef struct kv_plan_measured_group {
    int64_t window, chunk;
    int n_layers;
    uint64_t block_bytes;
    int64_t peak_blocks;           /* the most held at once (all sequences) */
    uint64_t peak_allocated_bytes; /* peak_blocks x block_bytes */
    int64_t blocks;                /* held after the T-th token (kv_seq_usage) */
    uint64_t allocated_bytes;
    uint64_t lower_bound_bytes; /* kv_seq_usage of min(T, W) tokens, as the engine counts */
} kv_plan_measured_group;

typedef struct kv_plan_measured {
    int n_groups;
    kv_plan_measured_group group[KV_PLAN_MAX_GROUPS];
    /* Sums over the groups. Each group has a pool of its own, so the pools
     * together need the sum of the groups' peaks. */
    uint64_t peak_allocated_bytes;
    uint64_t allocated_bytes; /* held after the T-th token */
    uint64_t lower_bound_bytes;
    int64_t peak_blocks, blocks;
    uint64_t table_bytes; /* block tables as allocated (capacity x 4) */
} kv_plan_measured;

/* Runs B sequences of T tokens through real pools of these groups the way the
 * engine's scheduler does while decoding: one token per sequence per step, a
 * sliding group first dropping the blocks that left the window
 * (kv_seq_drop_before), then kv_seq_reserve. (Steps at which no block can
 * change are skipped: their calls would be no-ops.) Records each group's peak
 * and its kv_seq_usage after the T-th token, then frees everything. Each pool
 * is sized B x ceil(T/bs) blocks, a sliding one B x min(ceil(T/bs),
 * ceil(W/bs) + 1); all together at most max_pool_bytes. False (err set) when
 * that is exceeded, when the run would take too long, or when a reservation
 * fails (the pool was too small: the engine needs more than that bound). */
bool kv_plan_measure(const kv_plan_group *groups, int n_groups, int64_t context,
                     int64_t concurrency, uint64_t max_pool_bytes, kv_plan_measured *out,
                     kvl_error *err);

#endif
