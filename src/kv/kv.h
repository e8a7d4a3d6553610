/* kv: the paged KV cache. A pool of fixed-size blocks (block_size tokens each,
 * all layers' K and V for those tokens), per-sequence block tables, reference
 * counts (so blocks can be shared by sequences with a common prefix), and the
 * accounting that separates the calculated lower bound from what is allocated.
 *
 * The pool owns all KV memory, allocated once at creation; nothing is allocated
 * when blocks are handed out. State changes are all-or-nothing: a failed
 * allocation leaves the pool and the sequence exactly as they were. */
#ifndef KVLLM_KV_H
#define KVLLM_KV_H

#include "base.h"
#include "gguf.h"

/* KV storage types: ggml's F32, F16, BF16, Q8_0 (blocks of 32 int8 with an f16
 * scale, along each token's K or V row), plus FP8 E4M3, one byte per value with
 * a static scale of 1 (vLLM's default fp8 cache: values saturate at +-448). */
#define KV_DT_FP8_E4M3 64

bool kv_dtype_parse(const char *name, int *dtype); /* "f32" "f16" "bf16" "q8_0" "fp8" */
const char *kv_dtype_name(int dtype);
/* Bytes of a row of n values; 0 if the type is not a KV type or n does not fit its blocks. */
size_t kv_row_bytes(int dtype, int64_t n);
void kv_row_store(int dtype, const float *src, void *dst, int64_t n);
void kv_row_load(int dtype, const void *src, float *dst, int64_t n);

typedef struct kv_pool_config {
    int n_layers;
    int n_kv_heads;
    int head_dim_k;   /* per-head K width (for MLA: the latent + rope width) */
    int head_dim_v;   /* per-head V width (0: V is not stored separately) */
    int block_size;   /* tokens per block */
    int dtype;        /* storage type of K (and of V unless split_v) */
    bool split_v;     /* V stored as dtype_v instead of dtype */
    int dtype_v;
    int64_t n_blocks; /* blocks in the pool */
} kv_pool_config;

typedef struct kv_pool kv_pool; /* opaque */

kv_pool *kv_pool_create(const kv_pool_config *cfg, kvl_error *err);
void kv_pool_destroy(kv_pool *p);
const kv_pool_config *kv_pool_cfg(const kv_pool *p);

/* Bytes of one block (all layers, K and V) and of one token's K row / V row in one layer. */
size_t kv_pool_block_bytes(const kv_pool *p);
size_t kv_pool_k_row_bytes(const kv_pool *p);
size_t kv_pool_v_row_bytes(const kv_pool *p);
/* Bytes per token over all layers (K+V), as stored. */
size_t kv_pool_bytes_per_token(const kv_pool *p);

/* Blocks that can be handed out: truly free plus cached-but-unused (evictable). */
int64_t kv_pool_n_free(const kv_pool *p);
/* Blocks referenced by at least one sequence. */
int64_t kv_pool_n_used(const kv_pool *p);
/* Unreferenced blocks that still hold a hashed prefix (evictable, LRU order). */
int64_t kv_pool_n_cached(const kv_pool *p);

/* Takes n free blocks (refcount 1) into out, or returns false and changes nothing.
 * Truly free blocks are used first; then the least recently released cached
 * blocks are evicted (their hashes forgotten). */
bool kv_block_alloc(kv_pool *p, int64_t n, int32_t *out);
/* Adds a reference to an allocated block (sharing). */
void kv_block_ref(kv_pool *p, int32_t block);
/* Drops a reference; the block returns to the free list when none remain. */
void kv_block_unref(kv_pool *p, int32_t block);
int32_t kv_block_refcount(const kv_pool *p, int32_t block);

/* ---- prefix cache ----
 * A full block is identified by a chained hash of (parent block's hash, extra
 * key such as a cache salt, its block_size token ids). Registered blocks keep
 * their hash after their last user releases them and can be found again until
 * they are evicted. Lookups re-check the stored tokens and parent hash. */
uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int n_tokens);
/* The hash chain's root for a given salt (NULL or "" = no salt). */
uint64_t kv_hash_root(const char *salt);
/* Finds a cached block with this hash, parent and tokens and takes a reference
 * to it (reviving it from the evictable list if unused). -1 if absent. */
int32_t kv_prefix_lookup(kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Registers a block whose block_size tokens are computed under this hash. No-op
 * if an identical block is already registered. */
void kv_prefix_register(kv_pool *p, int32_t block, uint64_t hash, uint64_t parent,
                        const int32_t *tokens);
/* Forgets every cached hash (blocks stay allocated to their users). */
void kv_prefix_clear(kv_pool *p);

/* K/V storage of `block` for `layer`: block_size tokens of k_row_bytes
 * (v_row_bytes), arranged as kv_block_layout says. */
void *kv_block_k(kv_pool *p, int32_t block, int layer);
void *kv_block_v(kv_pool *p, int32_t block, int layer);
const void *kv_block_k_const(const kv_pool *p, int32_t block, int layer);
const void *kv_block_v_const(const kv_pool *p, int32_t block, int layer);

/* How one layer's K (or V) values sit in a block's area. split: every KV
 * head's slice stores on its own (always for f32/f16/bf16/fp8; for q8_0 when
 * the head width is a multiple of 32), and the area is head-major: head h of
 * the token in row r starts at h * head_stride + r * row_stride (row_stride =
 * head_bytes, head_stride = block_size * head_bytes), so attention over one
 * head reads block_size consecutive slices instead of one slice out of every
 * row of all heads (bench_kernels astream: about 1.5x the read rate). Else a
 * row per token holds every head (row_stride = the row's bytes) and is
 * converted whole. Either way a token takes k_row_bytes (v_row_bytes). */
typedef struct kv_block_layout {
    bool split;
    size_t head_bytes;  /* one head's slice (split only) */
    size_t head_stride; /* from one head to the next (split only) */
    size_t row_stride;  /* from one token to the next */
} kv_block_layout;
const kv_block_layout *kv_pool_k_layout(const kv_pool *p);
const kv_block_layout *kv_pool_v_layout(const kv_pool *p); /* zeros when V is not stored */
/* Stores one token's K (n_kv_heads x head_dim_k floats) and V (unless the pool
 * keeps none) in row `row` (position % block_size) of `block`, `layer`. */
void kv_store_token(kv_pool *p, int32_t block, int layer, int row, const float *k, const float *v);

/* A sequence's block table: blocks[i] holds positions [i*bs, (i+1)*bs). */
typedef struct kv_seq {
    int32_t *blocks;
    int64_t n_blocks;
    int64_t cap;
} kv_seq;

void kv_seq_init(kv_seq *s);
/* Makes the table cover n_tokens positions, allocating blocks as needed.
 * All-or-nothing: on false (pool exhausted or out of memory) nothing changed. */
bool kv_seq_reserve(kv_pool *p, kv_seq *s, int64_t n_tokens);
/* Blocks kv_seq_reserve would need to allocate to cover n_tokens. */
int64_t kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int64_t n_tokens);
/* Appends a block the caller holds a reference to (e.g. from kv_prefix_lookup);
 * the table takes over that reference. False on out of memory (nothing changed). */
bool kv_seq_append(kv_seq *s, int32_t block);
/* Drops the blocks from index n_blocks on (undoing a reserve). */
void kv_seq_truncate(kv_pool *p, kv_seq *s, int64_t n_blocks);
/* Sliding window: unrefs the blocks holding only positions < first_pos and marks
 * their table entries -1 (positions keep their indices). Returns blocks freed. */
int64_t kv_seq_drop_before(kv_pool *p, kv_seq *s, int64_t first_pos);
/* Blocks actually held (entries that are not -1). */
int64_t kv_seq_n_held(const kv_seq *s);
/* Unrefs every block and empties the table (keeps its memory for reuse). */
void kv_seq_release(kv_pool *p, kv_seq *s);
void kv_seq_free(kv_pool *p, kv_seq *s); /* release + free the table itself */

/* Accounting. Lower bound (calculated): 2 * L * n_kv * d_head * T * dtype_bytes
 * generalised to K and V widths; allocated (measured): blocks held * block bytes. */
typedef struct kv_usage {
    int64_t tokens;          /* positions held */
    int64_t blocks;          /* blocks held */
    size_t lower_bound_bytes;
    size_t allocated_bytes;
} kv_usage;
kv_usage kv_seq_usage(const kv_pool *p, const kv_seq *s, int64_t n_tokens);
/* Adds b into a (sums over KV groups). */
void kv_usage_add(kv_usage *a, const kv_usage *b);

/* Bytes per element of a plain KV dtype (F32 4, F16 2, BF16 2, FP8 1); 0 for block types. */
size_t kv_dtype_bytes(int dtype);
/* The V storage type of a pool. */
int kv_pool_dtype_v(const kv_pool *p);

#endif
