/* kv: block pool, block tables and the prefix cache. See kv.h. */
#include "kv.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* One block's bookkeeping, read and written together (vLLM's KVCacheBlock):
 * its references and, for the prefix cache, its hash state and its links in
 * the LRU list of unreferenced cached blocks. */
typedef struct kv_block_meta {
    uint64_t hash, parent; /* while hashed: its chain hash and its parent's */
    int32_t refcount;
    int32_t lru_prev, lru_next;
    uint8_t hashed;
} kv_block_meta;

struct kv_pool {
    kv_pool_config cfg;
    kv_pool_geom g;
    kv_block_layout k_layout, v_layout;
    uint8_t *data;       /* n_blocks * block_bytes */
    kv_block_meta *blk;  /* [n_blocks] */
    int32_t *free_stack; /* free block ids; top at n_free-1 */
    int64_t n_free;      /* truly free (not cached) */
    /* prefix cache: the hashed blocks' token ids, an LRU list of unreferenced
     * hashed blocks (head = evicted first; linked through blk), and an
     * open-addressing map hash -> block. */
    int32_t *tokens; /* [n_blocks][block_size] ids of hashed blocks */
    int32_t lru_head, lru_tail;
    int64_t n_cached;
    int64_t n_evicted; /* cached blocks evicted so far */
    int32_t *map;      /* -1 empty */
    uint64_t map_mask;
    kv_block_hash_fn block_hash;
    kv_evict_fn evict_fn; /* sees each cached block just before eviction (disk tier) */
    void *evict_user;
};

static bool alloc_prefix_state(kv_pool *p) {
    size_t n = (size_t)p->cfg.n_blocks;
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    p->tokens = malloc(n * p->cfg.block_size * sizeof *p->tokens);
    p->map = malloc(cap * sizeof *p->map);
    if (!p->tokens || !p->map) return false;
    memset(p->map, 0xff, cap * sizeof *p->map);
    p->map_mask = cap - 1;
    p->lru_head = p->lru_tail = -1;
    p->block_hash = kv_block_hash;
    return true;
}

static void free_arrays(kv_pool *p) {
    kvl_free(p->data);
    free(p->blk);
    free(p->free_stack);
    free(p->tokens);
    free(p->map);
}

/* Head-major whenever each head's slice stores on its own (kv.h). */
static kv_block_layout block_layout(int dtype, int n_heads, int head_dim, int block_size) {
    const size_t head = kv_row_bytes(dtype, head_dim),
                 row = kv_row_bytes(dtype, (int64_t)n_heads * head_dim);
    if (head && head * (size_t)n_heads == row)
        return (kv_block_layout){.split = true,
                                 .head_bytes = head,
                                 .head_stride = head * (size_t)block_size,
                                 .row_stride = head};
    return (kv_block_layout){.split = false, .row_stride = row};
}

/* The geometry cfg implies (k_row 0 where a row cannot be stored in its type). */
static kv_pool_geom pool_geometry(const kv_pool_config *cfg) {
    const int dt_v = cfg->split_v ? cfg->dtype_v : cfg->dtype;
    const int64_t kn = (int64_t)cfg->n_kv_heads * cfg->head_dim_k,
                  vn = (int64_t)cfg->n_kv_heads * cfg->head_dim_v;
    const size_t k_row = kv_row_bytes(cfg->dtype, kn), v_row = vn ? kv_row_bytes(dt_v, vn) : 0;
    const size_t bs = cfg->block_size > 0 ? (size_t)cfg->block_size : 0,
                 nl = cfg->n_layers > 0 ? (size_t)cfg->n_layers : 0;
    return (kv_pool_geom){.k_row = k_row,
                          .v_row = v_row,
                          .layer_bytes = (k_row + v_row) * bs,
                          .block_bytes = (k_row + v_row) * bs * nl,
                          .token_bytes = (k_row + v_row) * nl};
}

size_t kv_pool_block_bytes(const kv_pool_config *cfg) { return pool_geometry(cfg).block_bytes; }

kv_pool *kv_pool_create(const kv_pool_config *cfg, kvl_error *err) {
    int dt_v = cfg->split_v ? cfg->dtype_v : cfg->dtype;
    if (!kv_row_bytes(cfg->dtype, 32) || !kv_row_bytes(dt_v, 32)) {
        kvl_fail(err,
                 "kv: %s is not a KV cache type (f32, f16, bf16, q8_0, q5_0, q4_0, iq4_nl, fp8)",
                 kv_dtype_name(kv_row_bytes(cfg->dtype, 32) ? dt_v : cfg->dtype));
        return NULL;
    }
    int64_t kn = (int64_t)cfg->n_kv_heads * cfg->head_dim_k,
            vn = (int64_t)cfg->n_kv_heads * cfg->head_dim_v;
    size_t k_row = kv_row_bytes(cfg->dtype, kn), v_row = vn ? kv_row_bytes(dt_v, vn) : 0;
    if (!k_row || (vn && !v_row)) {
        const int bad = k_row ? dt_v : cfg->dtype;
        int blk = 1;
        gguf_dtype_geometry(bad, &blk, NULL);
        kvl_fail(err,
                 "kv: a %s row of %lld values cannot be stored as %s (it needs a multiple of %d)",
                 k_row ? "V" : "K", (long long)(k_row ? vn : kn), kv_dtype_name(bad), blk);
        return NULL;
    }
    if (cfg->n_layers < 0 || cfg->n_kv_heads <= 0 || cfg->head_dim_k <= 0 || cfg->head_dim_v < 0 ||
        cfg->block_size <= 0 || cfg->n_blocks <= 0 || cfg->n_blocks > INT32_MAX) {
        kvl_fail(
            err,
            "kv: invalid pool shape (layers %d, kv heads %d, dims %d/%d, block %d, blocks %lld)",
            cfg->n_layers, cfg->n_kv_heads, cfg->head_dim_k, cfg->head_dim_v, cfg->block_size,
            (long long)cfg->n_blocks);
        return NULL;
    }
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail_oom;
    p->cfg = *cfg;
    p->k_layout = block_layout(cfg->dtype, cfg->n_kv_heads, cfg->head_dim_k, cfg->block_size);
    p->v_layout = vn ? block_layout(dt_v, cfg->n_kv_heads, cfg->head_dim_v, cfg->block_size)
                     : (kv_block_layout){0};
    p->g = pool_geometry(cfg);
    size_t total;
    if (!kvl_mul_ok(p->g.block_bytes, (size_t)cfg->n_blocks, &total)) goto fail_free_pool;
    p->data = kvl_alloc_huge(total ? total : 64); /* 0 layers: no storage, a valid pointer */
    p->blk = calloc((size_t)cfg->n_blocks, sizeof *p->blk);
    p->free_stack = malloc((size_t)cfg->n_blocks * sizeof *p->free_stack);
    if (!p->data || !p->blk || !p->free_stack || !alloc_prefix_state(p)) goto fail_free_arrays;
    /* Push in reverse so that block 0 is handed out first (easier to read in logs). */
    for (int64_t i = 0; i < cfg->n_blocks; i++) p->free_stack[i] = (int32_t)(cfg->n_blocks - 1 - i);
    p->n_free = cfg->n_blocks;
    return p;

fail_free_arrays:
    free_arrays(p);
fail_free_pool:
    kvl_fail(err, "kv: cannot allocate %lld blocks of %zu bytes", (long long)cfg->n_blocks,
             p->g.block_bytes);
    free(p);
    return NULL;
fail_oom:
    kvl_fail(err, "kv: out of memory");
    return NULL;
}

void kv_pool_destroy(kv_pool *p) {
    if (!p) return;
    free_arrays(p);
    free(p);
}

const kv_pool_config *kv_pool_cfg(const kv_pool *p) { return &p->cfg; }
int kv_pool_dtype_v(const kv_pool *p) { return p->cfg.split_v ? p->cfg.dtype_v : p->cfg.dtype; }
const kv_pool_geom *kv_pool_geometry(const kv_pool *p) { return &p->g; }
int64_t kv_pool_n_free(const kv_pool *p) { return p->n_free + p->n_cached; }
int64_t kv_pool_n_used(const kv_pool *p) { return p->cfg.n_blocks - p->n_free - p->n_cached; }
int64_t kv_pool_n_cached(const kv_pool *p) { return p->n_cached; }

/* ---- LRU of unreferenced cached blocks ---- */

static void lru_push_tail(kv_pool *p, int32_t b) {
    p->blk[b].lru_prev = p->lru_tail;
    p->blk[b].lru_next = -1;
    if (p->lru_tail >= 0) p->blk[p->lru_tail].lru_next = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

static void lru_remove(kv_pool *p, int32_t b) {
    const int32_t prev = p->blk[b].lru_prev, next = p->blk[b].lru_next;
    if (prev >= 0) p->blk[prev].lru_next = next;
    else p->lru_head = next;
    if (next >= 0) p->blk[next].lru_prev = prev;
    else p->lru_tail = prev;
    p->n_cached--;
}

/* ---- hash map (linear probing, backward-shift deletion) ---- */

static int64_t map_find_slot(const kv_pool *p, uint64_t h) {
    for (uint64_t i = h & p->map_mask;; i = (i + 1) & p->map_mask) {
        int32_t b = p->map[i];
        if (b < 0) return -1;
        if (p->blk[b].hash == h) return (int64_t)i;
    }
}

static void map_insert(kv_pool *p, int32_t b) {
    uint64_t i = p->blk[b].hash & p->map_mask;
    while (p->map[i] >= 0) i = (i + 1) & p->map_mask;
    p->map[i] = b;
}

static void map_delete(kv_pool *p, uint64_t slot) {
    p->map[slot] = -1;
    for (uint64_t j = (slot + 1) & p->map_mask; p->map[j] >= 0; j = (j + 1) & p->map_mask) {
        int32_t b = p->map[j];
        uint64_t home = p->blk[b].hash & p->map_mask;
        /* move b back into the hole if its home is not in (slot, j] cyclically */
        bool between = slot <= j ? (home > slot && home <= j) : (home > slot || home <= j);
        if (!between) {
            p->map[slot] = b;
            p->map[j] = -1;
            slot = j;
        }
    }
}

static void unhash(kv_pool *p, int32_t b) {
    if (!p->blk[b].hashed) return;
    int64_t slot = map_find_slot(p, p->blk[b].hash);
    if (slot >= 0 && p->map[slot] == b) map_delete(p, (uint64_t)slot);
    p->blk[b].hashed = 0;
}

bool kv_block_alloc(kv_pool *p, int64_t n, int32_t *out) {
    if (n < 0 || n > p->n_free + p->n_cached) return false;
    for (int64_t i = 0; i < n; i++) {
        int32_t b;
        if (p->n_free > 0) {
            b = p->free_stack[--p->n_free];
        } else { /* evict the least recently released cached block */
            b = p->lru_head;
            lru_remove(p, b);
            if (p->evict_fn) p->evict_fn(p->evict_user, p, b);
            unhash(p, b);
            p->n_evicted++;
        }
        p->blk[b].refcount = 1;
        out[i] = b;
    }
    return true;
}

void kv_block_ref(kv_pool *p, int32_t block) { p->blk[block].refcount++; }

void kv_block_unref(kv_pool *p, int32_t block) {
    if (p->blk[block].refcount <= 0) return; /* double free: ignore rather than corrupt the lists */
    if (--p->blk[block].refcount > 0) return;
    if (p->blk[block].hashed) lru_push_tail(p, block); /* stays findable until evicted */
    else p->free_stack[p->n_free++] = block;
}

/* ---- prefix cache ---- */

uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int n_tokens) {
    /* The parent's hash seeds this block's: the chain covers the whole prefix. */
    return XXH3_64bits_withSeed(tokens, (size_t)n_tokens * sizeof *tokens, parent);
}

void kv_pool_set_block_hash(kv_pool *p, kv_block_hash_fn fn) {
    p->block_hash = fn ? fn : kv_block_hash;
}

void kv_pool_set_evict_hook(kv_pool *p, kv_evict_fn fn, void *user) {
    p->evict_fn = fn;
    p->evict_user = user;
}

bool kv_block_prefix_info(const kv_pool *p, int32_t block, uint64_t *hash, uint64_t *parent,
                          const int32_t **tokens) {
    if (block < 0 || block >= p->cfg.n_blocks || !p->blk[block].hashed) return false;
    *hash = p->blk[block].hash;
    *parent = p->blk[block].parent;
    *tokens = p->tokens + (size_t)block * p->cfg.block_size;
    return true;
}

bool kv_pool_default_hash(const kv_pool *p) { return p->block_hash == kv_block_hash; }

static uint64_t chain_root(const char *salt) {
    static const char tag[] = "kvllm-prefix-v1";
    uint64_t root = XXH3_64bits(tag, sizeof tag - 1);
    if (salt && *salt) root = XXH3_64bits_withSeed(salt, strlen(salt), root);
    return root;
}

/* The cached block with this hash, parent and tokens, or -1. A block found by
 * its hash alone is not enough: the parent and tokens it was computed from must
 * be these too (a collision is a miss). */
static int32_t prefix_find(const kv_pool *p, uint64_t hash, uint64_t parent,
                           const int32_t *tokens) {
    int64_t slot = map_find_slot(p, hash);
    if (slot < 0) return -1;
    int32_t b = p->map[slot];
    size_t bs = (size_t)p->cfg.block_size;
    if (p->blk[b].parent != parent || memcmp(p->tokens + b * bs, tokens, bs * sizeof *tokens) != 0)
        return -1;
    return b;
}

int64_t kv_prefix_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int64_t n_tokens) {
    const int bs = p->cfg.block_size;
    if (s->n_blocks != s->n_hashed) return s->n_hashed * bs;
    while (s->n_hashed < n_tokens / bs) {
        const int32_t *toks = tokens + s->n_hashed * bs;
        uint64_t h = p->block_hash(s->chain_hash, toks, bs);
        int32_t b = prefix_find(p, h, s->chain_hash, toks);
        if (b < 0 || !kv_seq_append(s, b)) break;
        if (p->blk[b].refcount == 0) lru_remove(p, b); /* revived */
        p->blk[b].refcount++;
        s->chain_hash = h;
        s->n_hashed++;
    }
    return s->n_hashed * bs;
}

static bool seq_grow(kv_seq *s, int64_t want);

int64_t kv_prefix_match_tail(kv_pool *p, kv_seq *s, const int32_t *tokens, int64_t n_tokens,
                             kv_attn a) {
    const int bs = p->cfg.block_size;
    if (s->n_blocks != 0) return s->n_hashed * bs;
    const int64_t K = n_tokens / bs;
    /* each full block's chain hash and cached block (-1: not cached) */
    uint64_t *hash = malloc((size_t)(K + 1) * sizeof *hash);
    int32_t *found = malloc((size_t)(K + 1) * sizeof *found);
    if (!hash || !found || !seq_grow(s, K)) {
        free(hash);
        free(found);
        return 0;
    }
    uint64_t parent = s->chain_root;
    for (int64_t k = 0; k < K; k++) {
        hash[k] = p->block_hash(parent, tokens + k * bs, bs);
        found[k] = prefix_find(p, hash[k], parent, tokens + k * bs);
        parent = hash[k];
    }
    /* the largest k whose needed blocks [first / bs, k) are all cached */
    int64_t k = K, lo = 0;
    for (; k > 0; k--) {
        lo = kv_attn_first(a, k * bs) / bs;
        int64_t j = k;
        while (j > lo && found[j - 1] >= 0) j--;
        if (j == lo) break;
    }
    if (k == 0) lo = 0;
    for (int64_t j = 0; j < k; j++) {
        int32_t b = j < lo ? -1 : found[j];
        if (b >= 0) {
            if (p->blk[b].refcount == 0) lru_remove(p, b); /* revived */
            p->blk[b].refcount++;
        }
        s->blocks[j] = b;
    }
    s->n_blocks = s->n_hashed = k;
    s->chain_hash = k > 0 ? hash[k - 1] : s->chain_root;
    free(hash);
    free(found);
    return k * bs;
}

int64_t kv_prefix_probe(const kv_pool *p, uint64_t root, const int32_t *tokens, int64_t n_tokens) {
    const int bs = p->cfg.block_size;
    uint64_t parent = root;
    int64_t n = 0;
    while (n < n_tokens / bs) {
        const int32_t *toks = tokens + n * bs;
        uint64_t h = p->block_hash(parent, toks, bs);
        if (prefix_find(p, h, parent, toks) < 0) break;
        parent = h;
        n++;
    }
    return n * bs;
}

void kv_prefix_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int64_t n_computed) {
    const int bs = p->cfg.block_size;
    while ((s->n_hashed + 1) * bs <= n_computed && s->n_hashed < s->n_blocks) {
        int32_t b = s->blocks[s->n_hashed];
        if (b < 0) return;
        const int32_t *toks = tokens + s->n_hashed * bs;
        uint64_t h = p->block_hash(s->chain_hash, toks, bs);
        /* A block already cached stays as it is; so does this one if another
         * block holds its hash (the same prefix computed twice, or a collision). */
        if (!p->blk[b].hashed && map_find_slot(p, h) < 0) {
            p->blk[b].hash = h;
            p->blk[b].parent = s->chain_hash;
            memcpy(p->tokens + (size_t)b * bs, toks, (size_t)bs * sizeof *toks);
            p->blk[b].hashed = 1;
            map_insert(p, b);
        }
        s->chain_hash = h;
        s->n_hashed++;
    }
}

void kv_prefix_clear(kv_pool *p) {
    while (p->lru_head >= 0) {
        int32_t b = p->lru_head;
        lru_remove(p, b);
        unhash(p, b);
        p->free_stack[p->n_free++] = b;
    }
    for (int64_t b = 0; b < p->cfg.n_blocks; b++) unhash(p, (int32_t)b);
}

bool kv_pool_check(const kv_pool *p, kvl_error *err) {
    const int64_t n = p->cfg.n_blocks;
    uint8_t *seen = calloc((size_t)n, 1); /* 1: on the free stack, 2: in the LRU list */
    if (!seen) return kvl_fail(err, "kv check: out of memory");
    bool ok = false;
    if (p->n_free < 0 || p->n_free > n || p->n_cached < 0 || p->n_free + p->n_cached > n) {
        kvl_fail(err, "kv check: %lld free + %lld cached of %lld blocks", (long long)p->n_free,
                 (long long)p->n_cached, (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < p->n_free; i++) {
        int32_t b = p->free_stack[i];
        if (b < 0 || b >= n || seen[b] || p->blk[b].refcount != 0 || p->blk[b].hashed) {
            kvl_fail(err,
                     "kv check: free stack entry %lld (block %d) is out of range, twice there, "
                     "referenced or hashed",
                     (long long)i, b);
            goto done;
        }
        seen[b] = 1;
    }
    int64_t n_lru = 0;
    for (int32_t b = p->lru_head, prev = -1; b >= 0; prev = b, b = p->blk[b].lru_next) {
        if (b >= n || seen[b] || p->blk[b].lru_prev != prev || p->blk[b].refcount != 0 ||
            !p->blk[b].hashed || ++n_lru > p->n_cached) {
            kvl_fail(
                err,
                "kv check: LRU entry %lld (block %d) is out of range, listed twice, badly linked, "
                "referenced, unhashed or beyond the %lld cached",
                (long long)n_lru, b, (long long)p->n_cached);
            goto done;
        }
        seen[b] = 2;
        if (p->blk[b].lru_next < 0 && p->lru_tail != b) {
            kvl_fail(err, "kv check: the LRU list ends at block %d, not at its tail %d", b,
                     p->lru_tail);
            goto done;
        }
    }
    if (n_lru != p->n_cached || (n_lru == 0 && p->lru_tail != -1)) {
        kvl_fail(err, "kv check: %lld blocks in the LRU list, %lld counted cached",
                 (long long)n_lru, (long long)p->n_cached);
        goto done;
    }
    int64_t n_hashed = 0;
    for (int64_t b = 0; b < n; b++) {
        if (p->blk[b].refcount < 0 || (p->blk[b].refcount == 0) != (seen[b] != 0)) {
            kvl_fail(err, "kv check: block %lld has refcount %d but is%s free or cached",
                     (long long)b, p->blk[b].refcount, seen[b] ? "" : " neither");
            goto done;
        }
        if (!p->blk[b].hashed) continue;
        n_hashed++;
        int64_t slot = map_find_slot(p, p->blk[b].hash);
        if (slot < 0 || p->map[slot] != b) {
            kvl_fail(err, "kv check: hashed block %lld is not what its hash finds", (long long)b);
            goto done;
        }
    }
    int64_t n_map = 0;
    for (uint64_t i = 0; i <= p->map_mask; i++) {
        int32_t b = p->map[i];
        if (b < 0) continue;
        n_map++;
        if (b >= n || !p->blk[b].hashed) {
            kvl_fail(err, "kv check: hash index slot %llu holds block %d, which is not hashed",
                     (unsigned long long)i, b);
            goto done;
        }
    }
    if (n_map != n_hashed) {
        kvl_fail(err, "kv check: hash index holds %lld blocks, %lld are hashed", (long long)n_map,
                 (long long)n_hashed);
        goto done;
    }
    ok = true;
done:
    free(seen);
    return ok;
}

int32_t kv_block_refcount(const kv_pool *p, int32_t block) { return p->blk[block].refcount; }

void *kv_block_k(kv_pool *p, int32_t block, int layer) {
    return p->data + (size_t)block * p->g.block_bytes + (size_t)layer * p->g.layer_bytes;
}
void *kv_block_v(kv_pool *p, int32_t block, int layer) {
    return (uint8_t *)kv_block_k(p, block, layer) + p->g.k_row * p->cfg.block_size;
}
const kv_block_layout *kv_pool_k_layout(const kv_pool *p) { return &p->k_layout; }
const kv_block_layout *kv_pool_v_layout(const kv_pool *p) { return &p->v_layout; }

/* One token's n_heads x head_dim values into row `row` of a block's K or V area. */
static void store_token_part(const kv_block_layout *L, int dtype, uint8_t *area, int row,
                             const float *x, int n_heads, int head_dim) {
    if (!L->split) {
        kv_row_store(dtype, x, area + (size_t)row * L->row_stride, (int64_t)n_heads * head_dim);
        return;
    }
    for (int h = 0; h < n_heads; h++)
        kv_row_store(dtype, x + (size_t)h * head_dim,
                     area + (size_t)h * L->head_stride + (size_t)row * L->row_stride, head_dim);
}

void kv_store_token(kv_pool *p, int32_t block, int layer, int row, const float *k, const float *v) {
    const kv_pool_config *c = &p->cfg;
    store_token_part(&p->k_layout, c->dtype, kv_block_k(p, block, layer), row, k, c->n_kv_heads,
                     c->head_dim_k);
    if (p->g.v_row)
        store_token_part(&p->v_layout, kv_pool_dtype_v(p), kv_block_v(p, block, layer), row, v,
                         c->n_kv_heads, c->head_dim_v);
}

const void *kv_block_k_const(const kv_pool *p, int32_t block, int layer) {
    return kv_block_k((kv_pool *)p, block, layer);
}
const void *kv_block_v_const(const kv_pool *p, int32_t block, int layer) {
    return kv_block_v((kv_pool *)p, block, layer);
}

void kv_seq_init(kv_seq *s) {
    memset(s, 0, sizeof *s);
    s->chain_root = s->chain_hash = chain_root(NULL);
}

void kv_seq_set_cache_salt(kv_seq *s, const char *salt) {
    s->chain_root = s->chain_hash = chain_root(salt);
    s->n_hashed = 0;
}

void kv_seq_set_chain_root(kv_seq *s, uint64_t root) {
    s->chain_root = s->chain_hash = root;
    s->n_hashed = 0;
}

int64_t kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int64_t n_tokens) {
    int64_t want = (n_tokens + p->cfg.block_size - 1) / p->cfg.block_size;
    return want > s->n_blocks ? want - s->n_blocks : 0;
}

static bool seq_grow(kv_seq *s, int64_t want) {
    return kvl_grow((void **)&s->blocks, &s->cap, (size_t)want, sizeof *s->blocks, 8);
}

bool kv_seq_append(kv_seq *s, int32_t block) {
    if (!seq_grow(s, s->n_blocks + 1)) return false;
    s->blocks[s->n_blocks++] = block;
    return true;
}

bool kv_seq_reserve(kv_pool *p, kv_seq *s, int64_t n_tokens) {
    int64_t need = kv_seq_blocks_needed(p, s, n_tokens);
    if (need == 0) return true;
    if (need > kv_pool_n_free(p)) return false;
    int64_t want = s->n_blocks + need;
    if (!seq_grow(s, want)) return false;
    kv_block_alloc(p, need, s->blocks + s->n_blocks);
    s->n_blocks = want;
    return true;
}

void kv_seq_truncate(kv_pool *p, kv_seq *s, int64_t n_blocks) {
    /* The tail goes first: released cached blocks are evicted in release order,
     * so a sequence's head (the likeliest shared prefix) survives longest. */
    for (int64_t i = s->n_blocks - 1; i >= n_blocks; i--)
        if (s->blocks[i] >= 0) kv_block_unref(p, s->blocks[i]);
    if (n_blocks < s->n_blocks) s->n_blocks = n_blocks < 0 ? 0 : n_blocks;
    if (s->n_hashed > s->n_blocks) { /* the hash of the new last block is not kept: walk again */
        s->n_hashed = 0;
        s->chain_hash = s->chain_root;
    }
}

int64_t kv_seq_truncate_tokens(kv_pool *p, kv_seq *s, int64_t n_tokens) {
    const int64_t bs = p->cfg.block_size;
    if (n_tokens < 0) n_tokens = 0;
    int64_t keep = (n_tokens + bs - 1) / bs;
    /* A hashed block is committed full: writing other tokens into its tail
     * would make the cache lie about it, so it goes whole. */
    if (keep > 0 && keep - 1 < s->n_hashed && n_tokens % bs != 0) keep--;
    if (keep < s->n_blocks) kv_seq_truncate(p, s, keep);
    int64_t held = keep * bs;
    return held < n_tokens ? held : n_tokens;
}

int64_t kv_seq_drop_before(kv_pool *p, kv_seq *s, int64_t first_pos) {
    int64_t freed = 0, last = first_pos / p->cfg.block_size; /* blocks [0, last) are out */
    for (int64_t i = 0; i < last && i < s->n_blocks; i++)
        if (s->blocks[i] >= 0) {
            kv_block_unref(p, s->blocks[i]);
            s->blocks[i] = -1;
            freed++;
        }
    return freed;
}

int64_t kv_seq_drop_unattended(kv_pool *p, kv_seq *s, int64_t next_pos, kv_attn a) {
    return kv_attn_limited(a) ? kv_seq_drop_before(p, s, kv_attn_first(a, next_pos)) : 0;
}

int64_t kv_seq_attn_missing(const kv_pool *p, const kv_seq *s, int64_t pos, kv_attn a) {
    const int64_t bs = p->cfg.block_size, first = kv_attn_first(a, pos);
    for (int64_t b = first / bs; b <= pos / bs; b++)
        if (b >= s->n_blocks || s->blocks[b] < 0) return b * bs > first ? b * bs : first;
    return -1;
}

int64_t kv_seq_n_held(const kv_seq *s) {
    int64_t n = 0;
    for (int64_t i = 0; i < s->n_blocks; i++) n += s->blocks[i] >= 0;
    return n;
}

void kv_seq_release(kv_pool *p, kv_seq *s) { kv_seq_truncate(p, s, 0); }

void kv_seq_free(kv_pool *p, kv_seq *s) {
    kv_seq_release(p, s);
    free(s->blocks);
    s->blocks = NULL;
    s->cap = 0;
}

kv_usage kv_seq_usage(const kv_pool *p, const kv_seq *s, int64_t n_tokens) {
    kv_usage u;
    u.tokens = n_tokens;
    u.blocks = kv_seq_n_held(s);
    u.lower_bound_bytes = p->g.token_bytes * (size_t)n_tokens;
    u.allocated_bytes = p->g.block_bytes * (size_t)u.blocks;
    return u;
}

void kv_usage_add(kv_usage *a, const kv_usage *b) {
    a->blocks += b->blocks;
    a->lower_bound_bytes += b->lower_bound_bytes;
    a->allocated_bytes += b->allocated_bytes;
}

int64_t kv_pool_n_evicted(const kv_pool *p) { return p->n_evicted; }

void kv_pool_snapshot(const kv_pool *p, kv_block_info *out) {
    const int64_t n = p->cfg.n_blocks;
    for (int64_t b = 0; b < n; b++) {
        kv_block_info *o = &out[b];
        o->refcount = p->blk[b].refcount;
        o->hashed = p->blk[b].hashed;
        o->hash = o->hashed ? p->blk[b].hash : 0;
        o->parent = o->hashed ? p->blk[b].parent : 0;
        o->state = o->refcount > 0 ? KV_BLOCK_USED : KV_BLOCK_FREE; /* cached ones below */
        o->lru_rank = -1;
    }
    int32_t rank = 0;
    for (int32_t b = p->lru_head; b >= 0; b = p->blk[b].lru_next) {
        out[b].state = KV_BLOCK_CACHED;
        out[b].lru_rank = rank++;
    }
}
