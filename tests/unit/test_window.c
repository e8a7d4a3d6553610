/* The attention rule (kv.h: kv_attn_first, from a sliding window, attention
 * chunks or both, and the functions built on it), checked against its
 * definition (position p is seen from pos iff 0 <= pos - p < w and p is in
 * pos's chunk), the blocks dropped by it (counted around multiples of a small
 * chunk), and the model's batch check built on it: a token whose window or
 * chunk reaches a block the table does not hold (dropped too early, never
 * reserved, or an earlier block of a full-attention group gone) is refused
 * with a message naming the position, not read. Run from the source root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_plan.h"
#include "model.h"

#include "check.h"

/* The definition, position by position. */
/* A pool of one layer and one F32 KV head of width d: the rules under test
 * depend only on block_size and n_blocks. */
static kv_pool *one_layer_pool(int d, int block_size, int64_t n_blocks) {
    kvl_error err;
    kv_pool_config c = {.n_layers = 1,
                        .n_kv_heads = 1,
                        .head_dim_k = d,
                        .head_dim_v = d,
                        .block_size = block_size,
                        .dtype = GGUF_DT_F32,
                        .n_blocks = n_blocks};
    return kv_pool_create(&c, &err);
}

static bool sees(int64_t pos, int64_t p, int64_t w) { return p <= pos && (w == 0 || pos - p < w); }
static bool sees2(int64_t pos, int64_t p, kv_attn a) {
    return sees(pos, p, a.window) && (a.chunk == 0 || p / a.chunk == pos / a.chunk);
}

static void test_rule(void) {
    for (int64_t w = 0; w <= 40; w += (w < 5 ? 1 : 7)) {
        for (int64_t pos = 0; pos < 100; pos++) {
            int64_t first = kv_window_first(pos, w);
            CHECK(sees(pos, first, w) && (first == 0 || !sees(pos, first - 1, w)));
            int64_t n = pos + 1, kept = 0;
            for (int64_t p = 0; p < n; p++) kept += sees(pos, p, w);
            CHECK(kv_attn_kept((kv_attn){.window = (int32_t)w}, n) == kept);
        }
    }
    CHECK(kv_attn_kept((kv_attn){16, 0}, 0) == 0 && kv_window_first(5, 0) == 0);
    /* the generalised rule: window, chunk or both, the later first applies;
     * every position from it to pos is seen, none before it */
    for (int32_t w = 0; w <= 30; w += 6)
        for (int32_t c = 0; c <= 27; c += (c < 4 ? 1 : 9)) {
            const kv_attn a = {w, c};
            CHECK(kv_attn_limited(a) == (w > 0 || c > 0));
            for (int64_t pos = 0; pos < 90; pos++) {
                int64_t first = kv_attn_first(a, pos), kept = 0;
                CHECK(first >= kv_window_first(pos, w) && first >= kv_chunk_first(pos, c));
                for (int64_t p = 0; p <= pos; p++) {
                    CHECK(sees2(pos, p, a) == (p >= first));
                    kept += sees2(pos, p, a);
                }
                CHECK(kv_attn_kept(a, pos + 1) == kept);
                CHECK(pos == 0 || kv_attn_first(a, pos - 1) <= first); /* never decreases */
            }
        }
    /* chunked attention (llama.cpp's is_masked_swa, CHUNKED: p is masked iff
     * p < (pos / c) * c): the first position seen is the chunk's start */
    for (int64_t c = 0; c <= 40; c += (c < 5 ? 1 : 7))
        for (int64_t pos = 0; pos < 100; pos++) {
            int64_t first = 0;
            while (c > 0 && first < pos && first < (pos / c) * c) first++;
            CHECK(kv_chunk_first(pos, c) == first);
            CHECK(c == 0 || (pos - kv_chunk_first(pos, c) < c && kv_chunk_first(pos, c) % c == 0));
        }
}

/* Drop and check against a real pool: after dropping for next_pos, every
 * token from next_pos on still finds its window, and each dropped block held
 * only positions no such token sees. */
static void test_drop_and_missing(void) {
    kv_pool *p = one_layer_pool(8, 5, 64);
    CHECK(p != NULL);
    /* windows, chunks (block-aligned 10 and 15, and not: 7, 12) and both */
    static const kv_attn RULES[] = {{1, 0},  {4, 0},  {7, 0},  {10, 0},  {13, 0},
                                    {16, 0}, {19, 0}, {22, 0}, {0, 7},   {0, 10},
                                    {0, 12}, {0, 15}, {9, 12}, {13, 10}, {0, 1}};
    for (size_t r = 0; p && r < sizeof RULES / sizeof RULES[0]; r++) {
        const kv_attn a = RULES[r];
        kv_seq s;
        kv_seq_init(&s);
        for (int64_t next = 0; next < 120; next++) {
            kv_seq_drop_unattended(p, &s, next, a);
            CHECK(kv_seq_reserve(p, &s, next + 1));
            CHECK(kv_seq_attn_missing(p, &s, next, a) == -1);
            for (int64_t b = 0; b < s.n_blocks; b++) {
                if (s.blocks[b] < 0)
                    CHECK(!sees2(next, b * 5 + 4, a));           /* its last position is out */
                else CHECK(b * 5 + 4 >= kv_attn_first(a, next)); /* and no block is kept longer */
            }
            /* a token past the reserved table, or a window reaching dropped blocks */
            CHECK(kv_seq_attn_missing(p, &s, s.n_blocks * 5, a) == s.n_blocks * 5);
            if (kv_attn_first(a, next) >= 5)
                CHECK(kv_seq_attn_missing(p, &s, next, (kv_attn){0, 0}) == 0);
        }
        kv_seq_free(p, &s);
    }
    kv_pool_destroy(p);
}

/* Block counts around multiples of a small chunk: blocks of 4 positions,
 * chunks of 12 (block-aligned) and of 10 (not). A chunked group frees the
 * whole previous chunk at once when the first token of a new one comes. */
static void test_chunk_counts(void) {
    kv_pool *p = one_layer_pool(4, 4, 32);
    CHECK(p != NULL);
    if (!p) return;
    /* held after decoding positions [0, next] one a step (drop for next, reserve) */
    static const struct {
        int32_t chunk;
        int64_t next, held, freed; /* freed: by the drop for next */
    } CASES[] = {
        {12, 0, 1, 0},  {12, 11, 3, 0}, {12, 12, 1, 3}, {12, 13, 1, 0}, {12, 15, 1, 0},
        {12, 16, 2, 0}, {12, 23, 3, 0}, {12, 24, 1, 3}, {12, 35, 3, 0}, {12, 36, 1, 3},
        {10, 9, 3, 0},  {10, 10, 1, 2}, {10, 11, 1, 0}, {10, 12, 2, 0}, {10, 19, 3, 0},
        {10, 20, 1, 3}, {10, 29, 3, 0}, {10, 30, 1, 2}, {10, 40, 1, 3},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const kv_attn a = {0, CASES[i].chunk};
        kv_seq s;
        kv_seq_init(&s);
        int64_t freed = 0, total = 0;
        for (int64_t next = 0; next <= CASES[i].next; next++) {
            freed = kv_seq_drop_unattended(p, &s, next, a);
            total += freed;
            CHECK(kv_seq_reserve(p, &s, next + 1));
        }
        if (kv_seq_n_held(&s) != CASES[i].held || freed != CASES[i].freed)
            fprintf(stderr, "chunk %d, next %lld: held %lld (want %lld), freed %lld (want %lld)\n",
                    CASES[i].chunk, (long long)CASES[i].next, (long long)kv_seq_n_held(&s),
                    (long long)CASES[i].held, (long long)freed, (long long)CASES[i].freed);
        CHECK(kv_seq_n_held(&s) == CASES[i].held && freed == CASES[i].freed);
        CHECK(total + kv_seq_n_held(&s) == s.n_blocks && kv_pool_n_used(p) == CASES[i].held);
        /* what the planner counts for this state, and its peak over the run */
        CHECK(kv_plan_blocks_held(a, 4, CASES[i].next + 1, 1) == CASES[i].held);
        kv_seq_free(p, &s);
    }
    /* a prefill chunk that crosses a chunk boundary keeps the earlier chunk for
     * its tokens before the boundary: drop for its first position only */
    kv_seq s;
    kv_seq_init(&s);
    const kv_attn a = {0, 12};
    CHECK(kv_seq_reserve(p, &s, 10));                 /* positions 0..9 computed */
    CHECK(kv_seq_drop_unattended(p, &s, 10, a) == 0); /* next step: 10..17 */
    CHECK(kv_seq_reserve(p, &s, 18) && kv_seq_n_held(&s) == 5);
    for (int64_t pos = 10; pos < 18; pos++) CHECK(kv_seq_attn_missing(p, &s, pos, a) == -1);
    CHECK(kv_seq_drop_unattended(p, &s, 18, a) == 3 && kv_seq_n_held(&s) == 2); /* 12..17 */
    kv_seq_free(p, &s);
    /* the planner's peak: c / bs blocks when chunks start on blocks, else
     * what the worst chunk start within a block spans (7 from 7: blocks 1..3) */
    CHECK(kv_plan_blocks_peak(a, 4, 1000) == 3 &&
          kv_plan_blocks_peak((kv_attn){0, 10}, 4, 1000) == 3);
    CHECK(kv_plan_blocks_peak((kv_attn){0, 7}, 4, 1000) == 3 &&
          kv_plan_blocks_peak((kv_attn){0, 7}, 4, 8) == 2);
    CHECK(kv_plan_blocks_peak((kv_attn){0, 10}, 4, 9) == 3 && kv_plan_blocks_peak(a, 4, 5) == 2);
    kv_pool_destroy(p);
}

/* The prefix cache of a chunked group (chunks of 12, blocks of 4): a sequence
 * commits each block before dropping it, and a later one with the same tokens
 * attaches only the blocks of the chunk it resumes in (kv_prefix_match_tail),
 * the earlier entries -1: no hit relies on a block the group dropped. */
static void test_chunk_prefix(void) {
    kvl_error err;
    kv_pool *p = one_layer_pool(4, 4, 16);
    CHECK(p != NULL);
    if (!p) return;
    const kv_attn a = {0, 12};
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 100 + i;
    kv_seq s, t;
    kv_seq_init(&s);
    kv_seq_init(&t);
    for (int64_t next = 0; next < 42; next++) { /* decode 0..41, committing each step */
        kv_seq_drop_unattended(p, &s, next, a);
        CHECK(kv_seq_reserve(p, &s, next + 1));
        kv_prefix_commit(p, &s, toks, next + 1);
    }
    CHECK(s.n_hashed == 10 && kv_seq_n_held(&s) == 2); /* 36..41: blocks 9, 10 */
    kv_seq_release(p, &s);
    CHECK(kv_pool_n_used(p) == 0 && kv_pool_n_cached(p) == 10);
    /* 41 tokens of prompt: 40 from the cache, resuming in chunk 36..47 */
    CHECK(kv_prefix_match_tail(p, &t, toks, 41, a) == 40);
    CHECK(t.n_blocks == 10 && t.n_hashed == 10 && kv_seq_n_held(&t) == 1 && t.blocks[8] < 0 &&
          t.blocks[9] >= 0);
    CHECK(kv_seq_reserve(p, &t, 41) && kv_seq_attn_missing(p, &t, 40, a) == -1);
    kv_prefix_commit(p, &t, toks, 41); /* nothing new: the chain is there */
    CHECK(kv_pool_check(p, &err));
    kv_seq_release(p, &t);
    /* at a multiple of the chunk no block is needed: 36 of 37 */
    CHECK(kv_prefix_match_tail(p, &t, toks, 37, a) == 36 && kv_seq_n_held(&t) == 0);
    kv_seq_release(p, &t);
    /* another token in block 9 (36..39): falls back to 36 */
    toks[38] = 7;
    CHECK(kv_prefix_match_tail(p, &t, toks, 41, a) == 36 && t.n_blocks == 9);
    kv_seq_release(p, &t);
    toks[38] = 138;
    /* block 0 evicted: the chain is gone from its start, but a resume at 40
     * needs block 9 only */
    int32_t all[16];
    CHECK(kv_pool_n_free(p) - kv_pool_n_cached(p) == 6);
    CHECK(kv_block_alloc(p, 6 + 1, all)); /* the 6 free blocks, then the oldest cached: 0 */
    for (int i = 0; i < 7; i++) kv_block_unref(p, all[i]);
    CHECK(kv_prefix_match_tail(p, &t, toks, 41, a) == 40 && kv_seq_n_held(&t) == 1);
    CHECK(kv_prefix_probe(p, t.chain_root, toks, 41) == 0); /* the whole chain is not there */
    CHECK(kv_pool_check(p, &err));
    kv_seq_free(p, &t);
    kv_seq_free(p, &s);
    kv_pool_destroy(p);
}

/* gemma3 golden: layers 0 and 2 slide (W 16), 1 and 3 attend fully. */
static void test_check_batch(void) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open("tests/data/golden/models/gemma3-swa-f32.gguf", &err);
    model_params mp = {.max_ctx = 128, .max_ubatch = 8, .no_repack = true};
    model *m = f ? model_load(f, &mp, &err) : NULL;
    CHECK(m && model_kv_n_groups(m) == 2);
    if (!m) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    kv_pool *pools[2];
    kv_seq seqs[2];
    const kv_seq *tables[2] = {&seqs[0], &seqs[1]};
    kv_attn windows[2];
    for (int g = 0; g < 2; g++) {
        kv_pool_config c;
        model_kv_group_shape(m, g, &c, &windows[g]);
        c.block_size = 4;
        c.dtype = GGUF_DT_F32;
        c.split_v = false;
        c.n_blocks = 64;
        pools[g] = kv_pool_create(&c, &err);
        kv_seq_init(&seqs[g]);
    }
    int sw = windows[0].window > 0 ? 0 : 1, full = 1 - sw;
    float *logits = malloc((size_t)model_hp(m)->n_vocab * sizeof(float));
    int32_t tok = 7, pos = 0, seq = 0;
    uint8_t want = 1;
    model_batch b = {1, &tok, &pos, &seq, &want, 1, tables, NULL, NULL};
    /* Decode 40 tokens as the engine does: drop for the next position, reserve. */
    bool ok = pools[0] && pools[1] && logits;
    for (pos = 0; ok && pos < 40; pos++) {
        for (int g = 0; g < 2; g++) {
            kv_seq_drop_unattended(pools[g], &seqs[g], pos, windows[g]);
            ok = ok && kv_seq_reserve(pools[g], &seqs[g], pos + 1);
        }
        ok = ok && model_forward(m, pools, &b, logits, &err);
    }
    if (!ok) fprintf(stderr, "decode: %s\n", err.msg);
    CHECK(ok && pos == 40);
    /* Dropping one step too early: position 40 still sees 25..40, so the
     * block of 24..27 must stay; dropping for 44 frees it. */
    kv_seq_drop_unattended(pools[sw], &seqs[sw], 44, windows[sw]);
    CHECK(kv_seq_reserve(pools[sw], &seqs[sw], 41) && kv_seq_reserve(pools[full], &seqs[full], 41));
    pos = 40;
    CHECK(!model_forward(m, pools, &b, logits, &err) &&
          strstr(err.msg, "position 40 attends to positions 25..40") &&
          strstr(err.msg, "block of position 25"));
    /* A full-attention group missing an early block. */
    kv_seq_release(pools[sw], &seqs[sw]);
    CHECK(kv_seq_reserve(pools[sw], &seqs[sw], 41));
    kv_seq_drop_before(pools[full], &seqs[full], 4);
    CHECK(!model_forward(m, pools, &b, logits, &err) && strstr(err.msg, "window 0, chunk 0") &&
          strstr(err.msg, "block of position 0"));
    free(logits);
    for (int g = 0; g < 2; g++) {
        kv_seq_free(pools[g], &seqs[g]);
        kv_pool_destroy(pools[g]);
    }
    model_destroy(m);
}

int main(void) {
    test_rule();
    test_drop_and_missing();
    test_chunk_counts();
    test_chunk_prefix();
    test_check_batch();
    if (failures) {
        fprintf(stderr, "test_window: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_window: ok\n");
    return 0;
}
