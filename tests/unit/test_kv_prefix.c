/* The prefix cache (kv_prefix_match / kv_prefix_commit): hits across salts and
 * partial blocks, forced hash collisions (the re-check of parent and tokens
 * turns them into misses), eviction in LRU order, revival of cached blocks,
 * and a long random run checked step by step against a plain model of the
 * pool (arrays and linear searches), with the pool's own invariants. Each
 * block's K row holds the token ids it was computed from, so a wrong block
 * served by a hit shows in its data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

#include "check.h"

enum { BS = 2 }; /* tokens per block */

/* One layer, one head of width 1, f32: row r of a block holds the token id
 * computed there. */
static kv_pool *make_pool(int64_t n_blocks) {
    kv_pool_config c = {.n_layers = 1,
                        .n_kv_heads = 1,
                        .head_dim_k = 1,
                        .head_dim_v = 0,
                        .block_size = BS,
                        .dtype = GGUF_DT_F32,
                        .n_blocks = n_blocks};
    kvl_error err;
    kv_pool *p = kv_pool_create(&c, &err);
    if (!p) fprintf(stderr, "pool: %s\n", err.msg);
    return p;
}

static void pool_ok(const kv_pool *p) {
    kvl_error err;
    bool ok = kv_pool_check(p, &err);
    if (!ok) fprintf(stderr, "%s\n", err.msg);
    CHECK(ok);
}

/* "Computes" tokens[from..to) of s: their ids go into the K rows. */
static void compute(kv_pool *p, const kv_seq *s, const int32_t *tokens, int64_t from, int64_t to) {
    for (int64_t t = from; t < to; t++) {
        float k = (float)tokens[t];
        kv_store_token(p, s->blocks[t / BS], 0, (int)(t % BS), &k, NULL);
    }
}

/* Whether block b holds tokens[0..BS). */
static bool holds(const kv_pool *p, int32_t b, const int32_t *tokens) {
    const float *k = kv_block_k_const(p, b, 0);
    for (int r = 0; r < BS; r++)
        if (k[r] != (float)tokens[r]) return false;
    return true;
}

/* A sequence that computes all n tokens and commits its full blocks. */
static void run_seq(kv_pool *p, kv_seq *s, const char *salt, const int32_t *tokens, int64_t n) {
    kv_seq_init(s);
    kv_seq_set_cache_salt(s, salt);
    int64_t have = kv_prefix_match(p, s, tokens, n - 1);
    CHECK(kv_seq_reserve(p, s, n));
    compute(p, s, tokens, have, n);
    kv_prefix_commit(p, s, tokens, n);
}

/* Tokens a fresh sequence with this salt finds cached (the probe is released again). */
static int64_t probe(kv_pool *p, const char *salt, const int32_t *tokens, int64_t n) {
    kv_seq s;
    kv_seq_init(&s);
    kv_seq_set_cache_salt(&s, salt);
    int64_t got = kv_prefix_match(p, &s, tokens, n);
    for (int64_t i = 0; i < s.n_blocks; i++) CHECK(holds(p, s.blocks[i], tokens + i * BS));
    kv_seq_free(p, &s);
    return got;
}

/* Full blocks only, the last token never, salts apart, revived blocks are the same blocks. */
static void test_hits(void) {
    kv_pool *p = make_pool(16);
    const int32_t a[] = {1, 2, 3, 4, 5, 6, 7};
    kv_seq s;
    run_seq(p, &s, NULL, a, 7); /* blocks 0..2 full, block 3 holds token 7 alone */
    CHECK(s.n_hashed == 3);
    int32_t first[4];
    memcpy(first, s.blocks, sizeof first);
    kv_seq_release(p, &s);
    CHECK(s.n_hashed == 0 && s.chain_hash == s.chain_root);
    CHECK(kv_pool_n_cached(p) == 3 && kv_pool_n_used(p) == 0 && kv_pool_n_free(p) == 16);
    pool_ok(p);

    CHECK(probe(p, NULL, a, 7) == 6);
    CHECK(probe(p, NULL, a, 6) == 6);
    CHECK(probe(p, NULL, a, 5) == 4); /* a half block is never matched */
    CHECK(probe(p, "salt", a, 7) == 0);
    const int32_t b[] = {1, 2, 3, 9, 5, 6};
    CHECK(probe(p, NULL, b, 6) == 2); /* the chain breaks at the first differing block */

    CHECK(kv_prefix_match(p, &s, a, 6) ==
          6); /* revival (s is empty after its release): the same blocks, out of the LRU list */
    CHECK(s.n_blocks == 3 && memcmp(s.blocks, first, 3 * sizeof *first) == 0);
    CHECK(kv_pool_n_cached(p) == 0 && kv_pool_n_used(p) == 3);
    for (int i = 0; i < 3; i++) CHECK(kv_block_refcount(p, s.blocks[i]) == 1);
    kv_seq t;
    kv_seq_init(&t);
    CHECK(kv_prefix_match(p, &t, a, 4) == 4); /* sharing: a second user of the first two */
    CHECK(kv_block_refcount(p, first[0]) == 2 && kv_block_refcount(p, first[2]) == 1);
    pool_ok(p);
    kv_seq_free(p, &t);
    kv_seq_free(p, &s);

    /* a salted chain of the same tokens lives apart */
    run_seq(p, &s, "salt", a, 7);
    kv_seq_free(p, &s);
    CHECK(probe(p, "salt", a, 7) == 6 && probe(p, NULL, a, 7) == 6 && kv_pool_n_cached(p) == 6);
    kv_prefix_clear(p);
    CHECK(probe(p, NULL, a, 7) == 0 && kv_pool_n_cached(p) == 0 && kv_pool_n_free(p) == 16);
    pool_ok(p);
    kv_pool_destroy(p);
}

static uint64_t hash_constant(uint64_t parent, const int32_t *tokens, int n) { return 42; }
static uint64_t hash_tokens_only(uint64_t parent, const int32_t *tokens, int n) {
    return kv_block_hash(0, tokens, n);
}

/* Every block hashes alike: a hit must still hold this block's tokens; a block
 * committed while another holds its hash stays uncached (it is freed, not kept). */
static void test_collision_tokens(void) {
    kv_pool *p = make_pool(8);
    kv_pool_set_block_hash(p, hash_constant);
    const int32_t a[] = {1, 2, 3, 4, 5}, b[] = {7, 8, 3, 4, 5};
    kv_seq s, t;
    run_seq(p, &s, NULL, a, 5);
    CHECK(kv_pool_n_cached(p) == 0);
    run_seq(p, &t, NULL, b, 5); /* same hash as a's first block, other tokens: a miss */
    CHECK(kv_block_refcount(p, s.blocks[0]) == 1);
    for (int i = 0; i < 2; i++) CHECK(holds(p, t.blocks[i], b + i * BS));
    CHECK(t.blocks[0] != s.blocks[0]);
    kv_seq_free(p, &t); /* its blocks were not cached: truly free again */
    CHECK(kv_pool_n_cached(p) == 0 && kv_pool_n_used(p) == 3);
    kv_seq_free(p, &s);
    CHECK(kv_pool_n_cached(p) == 1); /* a's first block: the one that holds hash 42 */
    CHECK(probe(p, NULL, b, 4) == 0);
    CHECK(probe(p, NULL, a, 4) == 2); /* a's second block collides with its first: uncached */
    pool_ok(p);
    kv_pool_destroy(p);
}

/* The hash ignores the parent: a block of the same tokens under another
 * salt (another parent) hashes alike and must be a miss by its parent. */
static void test_collision_parent(void) {
    kv_pool *p = make_pool(8);
    kv_pool_set_block_hash(p, hash_tokens_only);
    const int32_t a[] = {1, 2, 3, 4, 5};
    kv_seq s;
    run_seq(p, &s, NULL, a, 5);
    kv_seq_free(p, &s);
    CHECK(kv_pool_n_cached(p) == 2);
    CHECK(probe(p, NULL, a, 4) == 4);
    CHECK(probe(p, "other", a, 4) == 0);
    /* within one chain: block 1 = {1, 2} under parent {1, 2} is not block 0 */
    const int32_t c[] = {1, 2, 1, 2, 1};
    run_seq(p, &s, NULL, c, 5);
    CHECK(s.blocks[1] != s.blocks[0]);
    kv_seq_free(p, &s);
    CHECK(probe(p, NULL, c, 4) == 2);
    pool_ok(p);
    kv_pool_destroy(p);
}

/* Released cached blocks are evicted oldest release first (a sequence releases
 * its tail first, so its head outlives it); revival takes a block off the list
 * and a later release puts it back at the young end. */
static void test_lru(void) {
    kv_pool *p = make_pool(8);
    const int32_t a[] = {10, 11, 12, 13, 0}, b[] = {20, 21, 22, 23, 0}, c[] = {30, 31, 32, 33, 0};
    kv_seq s;
    run_seq(p, &s, NULL, a, 5);
    int32_t a0 = s.blocks[0], a1 = s.blocks[1];
    kv_seq_free(p, &s);
    run_seq(p, &s, NULL, b, 5);
    kv_seq_free(p, &s);
    run_seq(p, &s, NULL, c, 5);
    kv_seq_free(p, &s);
    CHECK(kv_pool_n_cached(p) == 6 && kv_pool_n_free(p) == 8); /* LRU: a1 a0 b1 b0 c1 c0 */
    pool_ok(p);

    kv_seq d;
    kv_seq_init(&d);
    CHECK(kv_seq_reserve(p, &d, 3 * BS)); /* 2 truly free, then a1 */
    CHECK(d.blocks[2] == a1 && kv_pool_n_cached(p) == 5);
    CHECK(probe(p, NULL, a, 4) == 2); /* a's head is still there */
    /* the probe revived a0 and released it: LRU now b1 b0 c1 c0 a0 */
    CHECK(kv_seq_reserve(p, &d, 5 * BS)); /* evicts b1, b0 */
    CHECK(probe(p, NULL, b, 4) == 0 && probe(p, NULL, c, 4) == 4 && probe(p, NULL, a, 4) == 2);
    /* the c probe released c1 c0 after a0, the a probe a0 after them: LRU c1 c0 a0 */
    CHECK(kv_seq_reserve(p, &d, 7 * BS)); /* evicts c1, c0 */
    CHECK(probe(p, NULL, c, 4) == 0 && probe(p, NULL, a, 4) == 2);
    CHECK(kv_seq_reserve(p, &d, 8 * BS)); /* evicts a0, the last */
    CHECK(d.blocks[7] == a0 && kv_pool_n_cached(p) == 0 && kv_pool_n_free(p) == 0);
    CHECK(!kv_seq_reserve(p, &d, 9 * BS));
    CHECK(probe(p, NULL, a, 4) == 0);
    pool_ok(p);
    kv_seq_free(p, &d);
    CHECK(kv_pool_n_free(p) == 8 && kv_pool_n_cached(p) == 0);
    kv_pool_destroy(p);
}

/* ---- random operations against a model ----
 * The model keeps, per block, the references the tables hold, whether the block
 * is cached (hash, parent, tokens) and when it was last released; it predicts
 * what match finds and commit caches with the same hash function, which blocks
 * an allocation evicts (the oldest released), and every count. */

enum { MB = 14, MS = 5, MT = 13, ALPHA = 3 };

typedef struct mblock {
    int refs;
    bool cached; /* holds a hash */
    uint64_t hash, parent;
    int32_t toks[BS];
    int64_t released; /* when refs last fell to 0 (LRU order of cached blocks) */
} mblock;

typedef struct mseq {
    kv_seq kv;
    int32_t toks[MT];
    int64_t n, n_computed, n_hashed;
    bool salted;
} mseq;

typedef struct model {
    kv_pool *p;
    kv_block_hash_fn hash;
    mblock b[MB];
    mseq s[MS];
    int64_t clock;
    bool broken; /* a prediction failed: stop at the first */
} model;

static void expect(model *m, bool ok, const char *what, int it) {
    if (ok || m->broken) return;
    fprintf(stderr, "random step %d: %s\n", it, what);
    CHECK(!"the pool differs from the model");
    m->broken = true;
}

/* The cached block with this hash (at most one has it), or -1. */
static int model_find(const model *m, uint64_t h) {
    for (int b = 0; b < MB; b++)
        if (m->b[b].cached && m->b[b].hash == h) return b;
    return -1;
}

static void model_unref(model *m, int b) {
    if (--m->b[b].refs == 0) m->b[b].released = ++m->clock;
}

/* Releases blocks [keep, n_blocks) of s, the tail first, as kv_seq_truncate does. */
static void model_truncate(model *m, mseq *s, int64_t keep) {
    for (int64_t i = s->kv.n_blocks - 1; i >= keep; i--) model_unref(m, s->kv.blocks[i]);
    kv_seq_truncate(m->p, &s->kv, keep);
    if (s->n_computed > keep * BS) s->n_computed = keep * BS;
    if (s->n_hashed > keep) s->n_hashed = 0;
}

static uint64_t chain_hash_at(const model *m, const mseq *s, int64_t blocks) {
    uint64_t h = s->kv.chain_root;
    for (int64_t i = 0; i < blocks; i++) h = m->hash(h, s->toks + i * BS, BS);
    return h;
}

static void op_admit(model *m, mseq *s, int it) {
    const mseq *o = &m->s[rand() % MS];
    s->n = 1 + rand() % MT;
    int64_t shared = o != s && o->n > 0 && rand() % 2 ? rand() % (o->n + 1) : 0;
    for (int64_t i = 0; i < s->n; i++) s->toks[i] = i < shared ? o->toks[i] : rand() % ALPHA;
    s->salted = rand() % 4 == 0;
    kv_seq_set_cache_salt(&s->kv, s->salted ? "salt" : NULL);
    /* the model's walk: stop at the first block whose hash is uncached, or
     * whose cached block has another parent or other tokens */
    int64_t want = 0;
    int32_t ids[MT];
    uint64_t h = s->kv.chain_root;
    while (want < (s->n - 1) / BS) {
        const int32_t *t = s->toks + want * BS;
        uint64_t nh = m->hash(h, t, BS);
        int b = model_find(m, nh);
        if (b < 0 || m->b[b].parent != h || memcmp(m->b[b].toks, t, sizeof m->b[b].toks) != 0)
            break;
        ids[want++] = b;
        h = nh;
    }
    int64_t got = kv_prefix_match(m->p, &s->kv, s->toks, s->n - 1);
    expect(m, got == want * BS && s->kv.n_blocks == want, "match found another number of blocks",
           it);
    for (int64_t i = 0; i < s->kv.n_blocks && !m->broken; i++) {
        expect(m, s->kv.blocks[i] == ids[i], "match attached another block", it);
        expect(m, holds(m->p, s->kv.blocks[i], s->toks + i * BS),
               "a matched block holds other tokens", it);
    }
    for (int64_t i = 0; i < s->kv.n_blocks; i++) m->b[s->kv.blocks[i]].refs++;
    s->n_computed = got;
    s->n_hashed = s->kv.n_blocks;
}

static void op_compute(model *m, mseq *s, int it) {
    int64_t r = 1 + rand() % 5;
    if (r > s->n - s->n_computed) r = s->n - s->n_computed;
    if (r <= 0) return;
    int64_t need = kv_seq_blocks_needed(m->p, &s->kv, s->n_computed + r), truly = 0, cached = 0;
    for (int b = 0; b < MB; b++)
        truly += m->b[b].refs == 0 && !m->b[b].cached,
            cached += m->b[b].refs == 0 && m->b[b].cached;
    int64_t before = s->kv.n_blocks;
    bool ok = kv_seq_reserve(m->p, &s->kv, s->n_computed + r);
    expect(m, ok == (need <= truly + cached), "reserve succeeded or failed against the counts", it);
    if (!ok) {
        expect(m, s->kv.n_blocks == before, "a failed reserve changed the table", it);
        return;
    }
    /* evicted: exactly the need - truly cached blocks released longest ago */
    int64_t evict = need > truly ? need - truly : 0, n_evicted = 0, newest_evicted = 0;
    for (int64_t i = before; i < s->kv.n_blocks; i++) {
        mblock *b = &m->b[s->kv.blocks[i]];
        expect(m, b->refs == 0, "reserve handed out a used block", it);
        if (b->cached) {
            n_evicted++;
            if (b->released > newest_evicted) newest_evicted = b->released;
        }
    }
    expect(m, n_evicted == evict, "reserve evicted cached blocks while free ones remained", it);
    for (int b = 0; b < MB; b++) {
        bool taken = false;
        for (int64_t i = before; i < s->kv.n_blocks; i++) taken |= s->kv.blocks[i] == b;
        if (!taken && m->b[b].refs == 0 && m->b[b].cached)
            expect(m, m->b[b].released > newest_evicted, "eviction spared an older cached block",
                   it);
    }
    for (int64_t i = before; i < s->kv.n_blocks; i++) {
        mblock *b = &m->b[s->kv.blocks[i]];
        b->cached = false;
        b->refs = 1;
    }
    compute(m->p, &s->kv, s->toks, s->n_computed, s->n_computed + r);
    s->n_computed += r;
    /* the model's commit: cache each newly full block unless its hash is cached */
    uint64_t h = chain_hash_at(m, s, s->n_hashed);
    for (; (s->n_hashed + 1) * BS <= s->n_computed && s->n_hashed < s->kv.n_blocks; s->n_hashed++) {
        const int32_t *t = s->toks + s->n_hashed * BS;
        uint64_t nh = m->hash(h, t, BS);
        mblock *b = &m->b[s->kv.blocks[s->n_hashed]];
        if (!b->cached && model_find(m, nh) < 0) {
            b->cached = true;
            b->hash = nh;
            b->parent = h;
            memcpy(b->toks, t, sizeof b->toks);
        }
        h = nh;
    }
    kv_prefix_commit(m->p, &s->kv, s->toks, s->n_computed);
    expect(m, s->kv.chain_hash == h, "commit's chain hash differs", it);
}

static void check_model(model *m, int it) {
    kvl_error err;
    if (!kv_pool_check(m->p, &err)) expect(m, false, err.msg, it);
    int64_t truly = 0, cached = 0, used = 0;
    for (int b = 0; b < MB; b++) {
        expect(m, kv_block_refcount(m->p, b) == m->b[b].refs, "a refcount differs", it);
        truly += m->b[b].refs == 0 && !m->b[b].cached;
        cached += m->b[b].refs == 0 && m->b[b].cached;
        used += m->b[b].refs > 0;
    }
    expect(m, kv_pool_n_cached(m->p) == cached, "the cached count differs", it);
    expect(m, kv_pool_n_free(m->p) == truly + cached && kv_pool_n_used(m->p) == used,
           "the free/used counts differ", it);
    for (int i = 0; i < MS; i++)
        expect(m, m->s[i].kv.n_hashed == m->s[i].n_hashed, "a sequence's chain length differs", it);
}

static void run_random(kv_block_hash_fn hash, unsigned seed, int steps) {
    model m = {.hash = hash ? hash : kv_block_hash};
    m.p = make_pool(MB);
    kv_pool_set_block_hash(m.p, hash);
    for (int i = 0; i < MS; i++) kv_seq_init(&m.s[i].kv);
    srand(seed);
    for (int it = 0; it < steps && !m.broken; it++) {
        mseq *s = &m.s[rand() % MS];
        int op = rand() % 100;
        if (s->kv.n_blocks == 0 && s->n_computed == 0 && op < 60) {
            op_admit(&m, s, it);
        } else if (op < 80) {
            op_compute(&m, s, it);
        } else if (op < 92) {
            model_truncate(&m, s, 0);
            s->n = 0;
        } else if (op < 99) {
            model_truncate(&m, s, s->kv.n_blocks ? rand() % s->kv.n_blocks : 0);
        } else {
            kv_prefix_clear(m.p);
            for (int b = 0; b < MB; b++) m.b[b].cached = false;
        }
        check_model(&m, it);
    }
    for (int i = 0; i < MS; i++) kv_seq_free(m.p, &m.s[i].kv);
    CHECK(kv_pool_n_used(m.p) == 0 && kv_pool_n_free(m.p) == MB);
    pool_ok(m.p);
    kv_pool_destroy(m.p);
}

/* Four hash values: collisions on most commits and lookups. */
static uint64_t hash_weak(uint64_t parent, const int32_t *tokens, int n) {
    return kv_block_hash(parent, tokens, n) & 3;
}

int main(void) {
    test_hits();
    test_collision_tokens();
    test_collision_parent();
    test_lru();
    run_random(NULL, 1, 20000);
    run_random(hash_weak, 2, 20000);
    run_random(hash_tokens_only, 3, 20000);
    printf("test_kv_prefix: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
