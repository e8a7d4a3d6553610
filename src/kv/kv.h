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
 * scale, along each token's K or V row) and llama.cpp's cache types Q5_0, Q4_0
 * and IQ4_NL (blocks of 32 as well; their q.k goes through Q8_0 as ggml's;
 * Q4_1 and Q5_1, whose q.k ggml takes through Q8_1 with an f16 block sum, are
 * not offered), plus FP8 E4M3, one byte per value with a static scale of 1
 * (vLLM's default fp8 cache: values saturate at +-448). They are the entries of
 * gguf's type table with a kv_name (gguf_types.c). */
#define KV_DT_FP8_E4M3 GGUF_DT_FP8_E4M3

bool kv_dtype_parse(const char *name,
                    int *dtype); /* "f32" "f16" "bf16" "q8_0" "q5_0" "q4_0" "iq4_nl" "fp8" */
/* Whether dtype is one of ggml's block-quantized types (Q8_0, Q4_0, ...): what
 * llama.cpp rotates (Walsh-Hadamard) before storing, where a head allows. */
bool kv_dtype_blocked(int dtype);
/* q as ggml multiplies it with a K cache of dtype: converted to the type's
 * vec_dot_type (f16 or bf16 rounded; Q8_0 or Q8_1 blocks quantized and read
 * back, where n is whole blocks), else unchanged. */
void kv_query_as_k(int dtype, const float *q, float *out, int64_t n);
const char *kv_dtype_name(int dtype);
/* Bytes of a row of n values; 0 if the type is not a KV type or n does not fit its blocks. */
size_t kv_row_bytes(int dtype, int64_t n);
void kv_row_store(int dtype, const float *src, void *dst, int64_t n);
void kv_row_load(int dtype, const void *src, float *dst, int64_t n);

typedef struct kv_pool_config {
    int n_layers; /* 0: a pipeline stage with none of this group's layers (blocks of 0 bytes) */
    int n_kv_heads;
    int head_dim_k; /* per-head K width (for MLA: the latent + rope width) */
    int head_dim_v; /* per-head V width (0: V is not stored separately) */
    int block_size; /* tokens per block */
    int dtype;      /* storage type of K (and of V unless split_v) */
    bool split_v;   /* V stored as dtype_v instead of dtype */
    int dtype_v;
    int64_t n_blocks; /* blocks in the pool */
} kv_pool_config;

typedef struct kv_pool kv_pool; /* opaque */

kv_pool *kv_pool_create(const kv_pool_config *cfg, kvl_error *err);
void kv_pool_destroy(kv_pool *p);
const kv_pool_config *kv_pool_cfg(const kv_pool *p);

/* The byte sizes a pool's configuration implies, fixed at creation. */
typedef struct kv_pool_geom {
    size_t k_row, v_row; /* one token's K row / V row in one layer (v_row 0: V not stored) */
    size_t layer_bytes;  /* one layer's K and V within a block */
    size_t block_bytes;  /* one block: all layers, K and V */
    size_t token_bytes;  /* one token over all layers (K+V), as stored */
} kv_pool_geom;
const kv_pool_geom *kv_pool_geometry(const kv_pool *p);
/* The bytes of one block of a pool of cfg's shape, before creating it (what
 * kv_pool_geometry's block_bytes will be; 0 where a row cannot be stored). */
size_t kv_pool_block_bytes(const kv_pool_config *cfg);

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
 * The block manager of nano-vllm: only full blocks are cached, each identified
 * by a chained hash of (its parent block's hash, its block_size token ids); the
 * chain starts at a root that depends on the cache salt, so the hash of block i
 * covers the whole prefix up to it. A block committed to the cache keeps its
 * hash after its last user releases it: it joins an LRU list of cached blocks
 * (counted free) and can be found again until an allocation evicts it, least
 * recently released first. Every hash hit re-checks the stored parent hash and
 * tokens, so a hash collision is a miss, never a wrong block. A sequence's
 * chain state (root, last hash, blocks hashed) lives in its kv_seq. */
typedef uint64_t (*kv_block_hash_fn)(uint64_t parent, const int32_t *tokens, int n_tokens);
/* The chained block hash (XXH3 seeded with the parent's hash). */
uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int n_tokens);
/* Replaces the pool's block hash (NULL: kv_block_hash). For tests, which force
 * collisions with a weak one; call it before anything is committed. */
void kv_pool_set_block_hash(kv_pool *p, kv_block_hash_fn fn);
/* Calls fn(user, p, block) for each cached block an allocation is about to
 * evict, while its bytes and hash are still there (the disk tier copies it
 * out). NULL: none. */
typedef void (*kv_evict_fn)(void *user, kv_pool *p, int32_t block);
void kv_pool_set_evict_hook(kv_pool *p, kv_evict_fn fn, void *user);
/* A committed block's chained hash, its parent's and its block_size token ids
 * (borrowed); false when the block holds no hash. */
bool kv_block_prefix_info(const kv_pool *p, int32_t block, uint64_t *hash, uint64_t *parent,
                          const int32_t **tokens);
/* Whether the pool hashes blocks with kv_block_hash (no test override). */
bool kv_pool_default_hash(const kv_pool *p);
/* Forgets every cached hash (blocks stay allocated to their users). */
void kv_prefix_clear(kv_pool *p);
/* Checks the pool's bookkeeping: every block is free, cached (refcount 0, in
 * the LRU list) or used, exactly once; the counts agree; the hash index holds
 * exactly the cached and committed blocks, each findable by its hash. False
 * with err saying which invariant broke. O(n_blocks); for tests. */
bool kv_pool_check(const kv_pool *p, kvl_error *err);

/* A block's bytes are contiguous: block_bytes from kv_block_k(p, b, 0)
 * (layer after layer, each K then V). */
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

/* A sequence's block table: blocks[i] holds positions [i*bs, (i+1)*bs), and
 * its place in the prefix cache's hash chain. */
typedef struct kv_seq {
    int32_t *blocks;
    int64_t n_blocks;
    size_t cap;
    uint64_t chain_root; /* the chain's root: a hash of the cache salt */
    uint64_t chain_hash; /* hash of block n_hashed-1 (chain_root if none) */
    int64_t n_hashed;    /* leading blocks found in or committed to the prefix cache */
} kv_seq;

/* An empty table, its chain rooted at no salt. */
void kv_seq_init(kv_seq *s);
/* Roots the sequence's chain at this salt (NULL or "": none): sequences with
 * different salts never share cached blocks. Forgets the chain's progress. */
void kv_seq_set_cache_salt(kv_seq *s, const char *salt);
/* Roots the chain at a root taken from another sequence (a prefix file's
 * chain_root): the same salt's root. Forgets the chain's progress. */
void kv_seq_set_chain_root(kv_seq *s, uint64_t root);
/* Attaches the longest chain of cached blocks that holds full blocks of
 * tokens[0..n_tokens), taking a reference to each (reviving it from the LRU
 * list if unused), and returns the tokens the sequence's chain now covers (a
 * multiple of block_size). Only extends a table that holds nothing but its
 * chain (an empty one, typically); otherwise, and on out of memory, attaches
 * nothing more. */
int64_t kv_prefix_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int64_t n_tokens);
/* kv_prefix_match for a group that drops the blocks no later token attends to
 * (rule a, kv_attn_limited; declared with the rule below): the longest n, a
 * multiple of block_size up to n_tokens, for which the cache holds every block
 * the token at n attends to, [kv_attn_first(a, n), n); those are attached
 * (entries before them are -1, as if dropped) and the chain covers n tokens.
 * A chunked group needs none at a multiple of the chunk, so n is never below
 * the last such multiple. Only on an empty table (else its chain, unchanged);
 * 0 on out of memory. */
/* Tokens of tokens[0..n_tokens) whose full blocks the cache holds now, for a
 * chain rooted at root (kv_seq.chain_root); attaches nothing. */
int64_t kv_prefix_probe(const kv_pool *p, uint64_t root, const int32_t *tokens, int64_t n_tokens);
/* Commits to the cache the sequence's blocks that are full now that the K/V of
 * tokens[0..n_computed) are in them, extending its chain. A block whose hash is
 * already cached (another sequence computed the same prefix) stays uncached.
 * Stops at a block the table dropped (-1). */
void kv_prefix_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int64_t n_computed);
/* Makes the table cover n_tokens positions, allocating blocks as needed.
 * All-or-nothing: on false (pool exhausted or out of memory) nothing changed. */
bool kv_seq_reserve(kv_pool *p, kv_seq *s, int64_t n_tokens);
/* Blocks kv_seq_reserve would need to allocate to cover n_tokens. */
int64_t kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int64_t n_tokens);
/* Appends a block the caller holds a reference to;
 * the table takes over that reference. False on out of memory (nothing changed). */
bool kv_seq_append(kv_seq *s, int32_t block);
/* Drops the blocks from index n_blocks on (undoing a reserve); a chain that
 * reached past them restarts at the root (the next commit walks it again). */
void kv_seq_truncate(kv_pool *p, kv_seq *s, int64_t n_blocks);
/* Rolls the table back to hold positions [0, n_tokens) only (speculative
 * decoding: rejected draft positions), freeing the blocks past them. The rows
 * after n_tokens in the last kept block are overwritten when those positions
 * are computed again. A block in the prefix cache is never kept partly: rolling
 * back into a hashed block drops it too (its cached contents stay valid), so the
 * result is the positions still held: n_tokens, or less in that case. */
int64_t kv_seq_truncate_tokens(kv_pool *p, kv_seq *s, int64_t n_tokens);
/* Unrefs the blocks holding only positions < first_pos and marks their table
 * entries -1 (positions keep their indices). Returns blocks freed. */
int64_t kv_seq_drop_before(kv_pool *p, kv_seq *s, int64_t first_pos);
/* ---- what a token attends to: the one rule ----
 * A KV group's attention rule. Sliding window (llama.cpp's standard SWA:
 * position p is masked from pos iff pos - p >= window): a token at pos attends
 * to [kv_window_first(pos, w), pos]. Chunked attention (llama4's rope layers;
 * llama.cpp's LLAMA_SWA_TYPE_CHUNKED: p is masked iff p < pos / c * c): to
 * [kv_chunk_first(pos, c), pos], the start of its chunk of c positions. Both:
 * the later of the two firsts applies (kv_attn_first). 0 is none of either;
 * neither is full causal attention. The attention reads by it, the engine drops
 * blocks by it, the model checks a batch against it and the planner counts by it.
 * Both firsts never decrease with pos, so what a token cannot see no later token
 * sees either: a sliding group frees a block at a time as the window moves on,
 * a chunked one all of the previous chunk's at once at each multiple of c. */
typedef struct kv_attn {
    int32_t window; /* 0: no sliding window */
    int32_t chunk;  /* 0: no chunks */
} kv_attn;
static inline int64_t kv_window_first(int64_t pos, int64_t window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}
static inline int64_t kv_chunk_first(int64_t pos, int64_t chunk) {
    return chunk > 0 ? pos / chunk * chunk : 0;
}
/* The first position a token at pos attends to under rule a. */
static inline int64_t kv_attn_first(kv_attn a, int64_t pos) {
    const int64_t w = kv_window_first(pos, a.window), c = kv_chunk_first(pos, a.chunk);
    return w > c ? w : c;
}
/* Whether the rule ever hides a position (else full causal: nothing is dropped). */
static inline bool kv_attn_limited(kv_attn a) { return a.window > 0 || a.chunk > 0; }
/* Positions the last of n_tokens written tokens attends to (sliding window w
 * alone: min(n_tokens, w)). */
static inline int64_t kv_attn_kept(kv_attn a, int64_t n_tokens) {
    return n_tokens > 0 ? n_tokens - kv_attn_first(a, n_tokens - 1) : 0;
}
/* Drops the blocks no token at next_pos or later can attend to: those holding
 * only positions before kv_attn_first(a, next_pos) (kv_seq_drop_before).
 * Nothing under full attention. Returns blocks freed. */
int64_t kv_seq_drop_unattended(kv_pool *p, kv_seq *s, int64_t next_pos, kv_attn a);
int64_t kv_prefix_match_tail(kv_pool *p, kv_seq *s, const int32_t *tokens, int64_t n_tokens,
                             kv_attn a);
/* The first position the token at pos attends to under a whose block the table
 * does not hold (beyond it, or dropped), or -1 when it holds them all. */
int64_t kv_seq_attn_missing(const kv_pool *p, const kv_seq *s, int64_t pos, kv_attn a);
/* Blocks actually held (entries that are not -1). */
int64_t kv_seq_n_held(const kv_seq *s);
/* Unrefs every block and empties the table (keeps its memory and salt). */
void kv_seq_release(kv_pool *p, kv_seq *s);
void kv_seq_free(kv_pool *p, kv_seq *s); /* release + free the table itself */

/* Accounting. Lower bound (calculated): 2 * L * n_kv * d_head * T * dtype_bytes
 * generalised to K and V widths; allocated (measured): blocks held * block bytes. */
typedef struct kv_usage {
    int64_t tokens; /* positions held */
    int64_t blocks; /* blocks held */
    size_t lower_bound_bytes;
    size_t allocated_bytes;
} kv_usage;
kv_usage kv_seq_usage(const kv_pool *p, const kv_seq *s, int64_t n_tokens);
/* Adds b into a (sums over KV groups). */
void kv_usage_add(kv_usage *a, const kv_usage *b);

/* ---- snapshot (for the live KV view) ----
 * One block's bookkeeping, copied as it is: a snapshot is a plain copy of the
 * pool's per-block arrays, O(n_blocks), no allocation (the caller sizes out). */
typedef enum kv_block_state { KV_BLOCK_FREE, KV_BLOCK_USED, KV_BLOCK_CACHED } kv_block_state;
typedef struct kv_block_info {
    uint64_t hash, parent; /* the block's prefix-chain hash and its parent's (hashed blocks only) */
    int32_t refcount;
    int32_t lru_rank; /* cached blocks: 0 is evicted next; -1 otherwise */
    uint8_t state;    /* kv_block_state */
    uint8_t hashed;   /* in the prefix cache (findable by hash) */
} kv_block_info;
/* Fills out[0..n_blocks). */
void kv_pool_snapshot(const kv_pool *p, kv_block_info *out);
/* Cached blocks evicted by allocations since the pool was created. */
int64_t kv_pool_n_evicted(const kv_pool *p);

/* Bytes per element of a plain KV dtype (F32 4, F16 2, BF16 2, FP8 1); 0 for block types. */
size_t kv_dtype_bytes(int dtype);
/* The V storage type of a pool. */
int kv_pool_dtype_v(const kv_pool *p);

#endif
