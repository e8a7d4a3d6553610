/* The sliding-window rule (kv.h: kv_window_first and the functions built on
 * it), checked against its definition (position p is seen from pos iff
 * 0 <= pos - p < w), and the model's batch check built on it: a token whose
 * window reaches a block the table does not hold (dropped too early, never
 * reserved, or an earlier block of a full-attention group gone) is refused
 * with a message naming the position, not read. Run from the source root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#include "check.h"

/* The definition, position by position. */
static bool sees(int64_t pos, int64_t p, int64_t w) { return p <= pos && (w == 0 || pos - p < w); }

static void test_rule(void) {
    for (int64_t w = 0; w <= 40; w += (w < 5 ? 1 : 7)) {
        for (int64_t pos = 0; pos < 100; pos++) {
            int64_t first = kv_window_first(pos, w);
            CHECK(sees(pos, first, w) && (first == 0 || !sees(pos, first - 1, w)));
            int64_t n = pos + 1, kept = 0;
            for (int64_t p = 0; p < n; p++) kept += sees(pos, p, w);
            CHECK(kv_window_kept(n, w) == kept);
        }
    }
    CHECK(kv_window_kept(0, 16) == 0 && kv_window_first(5, 0) == 0);
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
    kvl_error err;
    kv_pool_config c = {.n_layers = 1,
                        .n_kv_heads = 1,
                        .head_dim_k = 8,
                        .head_dim_v = 8,
                        .block_size = 5,
                        .dtype = GGUF_DT_F32,
                        .n_blocks = 64};
    kv_pool *p = kv_pool_create(&c, &err);
    CHECK(p != NULL);
    for (int64_t w = 1; p && w <= 23; w += 3) {
        kv_seq s;
        kv_seq_init(&s);
        for (int64_t next = 0; next < 120; next++) {
            kv_seq_drop_outside_window(p, &s, next, w);
            CHECK(kv_seq_reserve(p, &s, next + 1));
            for (int64_t pos = next; pos < next + 1; pos++)
                CHECK(kv_seq_window_missing(p, &s, pos, w) == -1);
            for (int64_t b = 0; b < s.n_blocks; b++)
                if (s.blocks[b] < 0)
                    CHECK(!sees(next, b * 5 + 4, w)); /* its last position is out */
            /* a token past the reserved table, or a window reaching dropped blocks */
            CHECK(kv_seq_window_missing(p, &s, s.n_blocks * 5, w) == s.n_blocks * 5);
            if (kv_window_first(next, w) >= 5) CHECK(kv_seq_window_missing(p, &s, next, 0) == 0);
        }
        kv_seq_free(p, &s);
    }
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
    int32_t windows[2];
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
    int sw = windows[0] > 0 ? 0 : 1, full = 1 - sw;
    float *logits = malloc((size_t)model_hp(m)->n_vocab * sizeof(float));
    int32_t tok = 7, pos = 0, seq = 0;
    uint8_t want = 1;
    model_batch b = {1, &tok, &pos, &seq, &want, 1, tables, NULL};
    /* Decode 40 tokens as the engine does: drop for the next position, reserve. */
    bool ok = pools[0] && pools[1] && logits;
    for (pos = 0; ok && pos < 40; pos++) {
        for (int g = 0; g < 2; g++) {
            kv_seq_drop_outside_window(pools[g], &seqs[g], pos, windows[g]);
            ok = ok && kv_seq_reserve(pools[g], &seqs[g], pos + 1);
        }
        ok = ok && model_forward(m, pools, &b, logits, &err);
    }
    if (!ok) fprintf(stderr, "decode: %s\n", err.msg);
    CHECK(ok && pos == 40);
    /* Dropping one step too early: position 40 still sees 25..40, so the
     * block of 24..27 must stay; dropping for 44 frees it. */
    kv_seq_drop_outside_window(pools[sw], &seqs[sw], 44, windows[sw]);
    CHECK(kv_seq_reserve(pools[sw], &seqs[sw], 41) && kv_seq_reserve(pools[full], &seqs[full], 41));
    pos = 40;
    CHECK(!model_forward(m, pools, &b, logits, &err) &&
          strstr(err.msg, "position 40 attends to positions 25..40") &&
          strstr(err.msg, "block of position 25"));
    /* A full-attention group missing an early block. */
    kv_seq_release(pools[sw], &seqs[sw]);
    CHECK(kv_seq_reserve(pools[sw], &seqs[sw], 41));
    kv_seq_drop_before(pools[full], &seqs[full], 4);
    CHECK(!model_forward(m, pools, &b, logits, &err) && strstr(err.msg, "window 0") &&
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
    test_check_batch();
    if (failures) {
        fprintf(stderr, "test_window: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_window: ok\n");
    return 0;
}
