/* kv_plan: the KV cache capacity planner. Pure arithmetic over a model's
 * attention shape: the calculated lower bound (2 x L x n_kv x d_head x T x B x
 * dtype_bytes, generalised to MLA, sliding windows and quantized KV), the paged
 * allocation with block rounding and per-sequence metadata, weights + KV against
 * a budget, and what GQA / MLA / SWA / KV quantization save against their
 * baselines. The shape comes from a GGUF's metadata or a Hugging Face
 * config.json (parsed from memory; the caller reads files).
 *
 * Everything is in exact bytes (uint64_t, overflow-checked). kv_plan_measure is
 * the one function that touches the engine: it allocates through the real block
 * pool (kv.h) so that the planner's allocation can be checked against it. */
#ifndef KVLLM_KV_PLAN_H
#define KVLLM_KV_PLAN_H

#include "../base/base.h"
#include "../gguf/gguf.h"
#include "kv.h"

/* KV element types the planner knows. The engine's pool stores F32/F16/BF16 today. */
typedef enum kv_plan_dtype {
    KV_PLAN_F32 = 0,
    KV_PLAN_F16,
    KV_PLAN_BF16,
    KV_PLAN_FP8,  /* E4M3/E5M2: 1 byte per value + KV_PLAN_FP8_SCALE_BYTES per block (below) */
    KV_PLAN_Q8_0, /* ggml q8_0: 32 int8 values + one f16 scale = 34 bytes per 32 values */
    KV_PLAN_DTYPE_COUNT
} kv_plan_dtype;

/* fp8's scale: one f32 per K tensor and per V tensor of each layer in each block,
 * so that a block can be requantized on its own (a per-tensor scale would need
 * the whole cache rescanned). It lives beside the block's data: only the
 * allocation counts it; the lower bound is the formula's 1 byte per value. */
#define KV_PLAN_FP8_SCALE_BYTES 4

/* Per-sequence metadata: the block table holds one int32 block id per block, and
 * each sequence has a fixed header. The header is defined as one 64-byte cache
 * line: kv_seq itself (pointer, count, capacity: 24 bytes on LP64) plus the
 * scheduler's per-sequence state (position, length, state, request id), rounded
 * up to a line so the figure does not depend on the build. */
#define KV_PLAN_BLOCK_ENTRY_BYTES 4
#define KV_PLAN_SEQ_HEADER_BYTES 64

/* Attention shape. All per-layer widths are uniform across layers. */
typedef struct kv_plan_model {
    char arch[32];          /* general.architecture / model_type (informational) */
    int64_t n_layers;
    int64_t n_head;         /* query heads: the MHA baseline has this many KV heads */
    int64_t n_kv_heads;
    int64_t head_dim_k, head_dim_v;
    /* MLA (DeepSeek): each layer caches one latent of kv_lora_rank values plus the
     * decoupled RoPE key of rope_dim values per token, instead of per-head K/V.
     * mha_head_dim_k/v are the per-head widths of the MHA it replaces. */
    int64_t kv_lora_rank;   /* > 0: MLA */
    int64_t rope_dim;
    int64_t mha_head_dim_k, mha_head_dim_v;
    /* Sliding window: n_swa_layers layers keep only the last sliding_window tokens. */
    int64_t sliding_window; /* 0: none */
    int64_t n_swa_layers;
    /* Where the file says so: the weights' bytes (GGUF tensor data), the bytes
     * per parameter (config.json torch_dtype) and the natural KV dtype. */
    uint64_t weights_bytes; /* 0: unknown */
    int64_t param_bytes;    /* 0: unknown */
    int kv_dtype;           /* kv_plan_dtype; -1: not given */
} kv_plan_model;

typedef struct kv_plan_request {
    int64_t context;        /* T: tokens per sequence */
    int64_t concurrency;    /* B: sequences */
    int dtype;              /* kv_plan_dtype */
    int64_t block_size;     /* tokens per block */
    uint64_t weights_bytes; /* 0: unknown / not counted */
    uint64_t budget_bytes;  /* 0: no budget */
} kv_plan_request;

typedef struct kv_plan {
    uint64_t k_row_bytes, v_row_bytes; /* one token, one layer, as stored */
    uint64_t bytes_per_token;          /* all layers, K + V (the formula, no window) */
    uint64_t seq_lower_bound_bytes;    /* one sequence of T tokens, windows applied */
    uint64_t lower_bound_bytes;        /* x B */
    /* Allocation: full-attention layers and sliding layers are paged separately
     * (a block holds block_size tokens of every layer of its group; with no
     * sliding layers this is the engine's block: L x block_size x (K + V row)). */
    uint64_t block_bytes;              /* full-attention group's block (0: no such layers) */
    uint64_t swa_block_bytes;          /* sliding group's block (0: none) */
    int64_t blocks_per_seq;            /* ceil(T / block_size) */
    int64_t swa_blocks_per_seq;        /* min(ceil(T/bs), ceil((W-1)/bs) + 1) */
    uint64_t seq_allocated_bytes;
    uint64_t allocated_bytes;          /* x B */
    uint64_t seq_metadata_bytes;       /* table entries x 4 + header */
    uint64_t metadata_bytes;           /* x B */
    uint64_t weights_bytes;
    uint64_t total_bytes;              /* weights + allocated + metadata */
    /* With a budget: */
    bool fits;
    int64_t max_concurrency;           /* largest B at this T whose total fits */
} kv_plan;

/* One feature's saving: the plan against the same plan without the feature. */
typedef struct kv_plan_saving {
    char what[16];        /* "GQA", "MQA", "MLA", "SWA", "fp8", "q8_0" */
    char baseline[64];    /* "MHA, 64 KV heads", "no window", "f16" ... */
    bool in_plan;         /* the feature is part of this plan (not hypothetical) */
    uint64_t bytes_per_token, base_bytes_per_token;
    uint64_t lower_bound_bytes, base_lower_bound_bytes;
    uint64_t allocated_bytes, base_allocated_bytes;
} kv_plan_saving;
#define KV_PLAN_MAX_SAVINGS 6

/* "f16" <-> KV_PLAN_F16 ... Parse returns false for unknown names. */
bool kv_plan_dtype_parse(const char *s, int *out);
const char *kv_plan_dtype_name(int dtype);
/* Bytes of n values stored as dtype (q8_0 rounds up to whole 32-value blocks). */
uint64_t kv_plan_row_bytes(int dtype, int64_t n_values);

/* Fills m from a GGUF's metadata (arch-prefixed keys) and its tensor bytes. */
bool kv_plan_model_from_gguf(const gguf_file *f, kv_plan_model *m, kvl_error *err);
/* Fills m from the text of a Hugging Face config.json (NUL-terminated). */
bool kv_plan_model_from_hf_config(const char *json, kv_plan_model *m, kvl_error *err);
/* An empty model (all zero, kv_dtype -1), for shapes given by hand. */
void kv_plan_model_init(kv_plan_model *m);
/* Checks that the shape is complete and within sane bounds. */
bool kv_plan_model_check(const kv_plan_model *m, kvl_error *err);
static inline bool kv_plan_is_mla(const kv_plan_model *m) { return m->kv_lora_rank > 0; }

/* The plan for r. False (err set) on an invalid shape/request or on overflow. */
bool kv_plan_compute(const kv_plan_model *m, const kv_plan_request *r, kv_plan *out,
                     kvl_error *err);
/* What each applicable feature saves; returns how many were written (<= cap). */
int kv_plan_savings(const kv_plan_model *m, const kv_plan_request *r, kv_plan_saving *out,
                    int cap);

/* The engine pool's shape for this model (layers, heads, widths, dtype) with no
 * sliding-window cap: the pool pages every layer together. False for KV dtypes
 * the pool does not store. n_blocks is left 0. */
bool kv_plan_pool_config(const kv_plan_model *m, const kv_plan_request *r, kv_pool_config *cfg,
                         kvl_error *err);

/* What the engine allocated for B sequences of T tokens, measured. */
typedef struct kv_plan_measured {
    uint64_t block_bytes;
    int64_t blocks;               /* all sequences */
    uint64_t lower_bound_bytes;   /* kv_seq_usage, summed */
    uint64_t allocated_bytes;     /* kv_seq_usage, summed */
    uint64_t table_bytes;         /* block tables as allocated (capacity x 4) */
} kv_plan_measured;
/* Creates a pool of exactly B x ceil(T/bs) blocks of shape cfg (at most
 * max_pool_bytes), reserves B sequences of T tokens, reads kv_seq_usage, frees all. */
bool kv_plan_measure(const kv_pool_config *cfg, int64_t context, int64_t concurrency,
                     uint64_t max_pool_bytes, kv_plan_measured *out, kvl_error *err);

/* Sizes as people write them: "80GiB", "16GB", "1.5 TiB", "123456" (bytes).
 * KB/MB/GB/TB are decimal, KiB/MiB/GiB/TiB binary (case-insensitive). The result
 * must be a whole number of bytes. */
bool kv_plan_parse_size(const char *s, uint64_t *out);
/* Counts: "8192", "32K" (x1024, for token counts), "8B"/"7.24B", "70e9" (x1000
 * suffixes K/M/B/T when thousand is true, for parameter counts). Whole, >= 0. */
bool kv_plan_parse_count(const char *s, bool thousand, int64_t *out);
/* "171,798,691,840 B (160 GiB, 171.8 GB)": exact bytes, then the binary and the
 * decimal unit, each rounded to 2 decimals with trailing zeros dropped. */
const char *kv_plan_fmt_bytes(uint64_t bytes, char *buf, size_t cap);
/* The parts alone: "160 GiB" and "171.8 GB" ("640 B" below 1 KiB / 1 KB). */
const char *kv_plan_fmt_binary(uint64_t bytes, char *buf, size_t cap);
const char *kv_plan_fmt_decimal(uint64_t bytes, char *buf, size_t cap);

#endif
