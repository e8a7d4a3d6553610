/* Block pool and block tables: allocation, sharing, exhaustion that changes
 * nothing, and invariants after a random sequence of operations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

#include "check.h"

static kv_pool *make_pool(int64_t n_blocks, int dtype) {
    kv_pool_config c = {.n_layers = 3,
                        .n_kv_heads = 2,
                        .head_dim_k = 8,
                        .head_dim_v = 8,
                        .block_size = 4,
                        .dtype = dtype,
                        .n_blocks = n_blocks};
    kvl_error err;
    kv_pool *p = kv_pool_create(&c, &err);
    if (!p) fprintf(stderr, "pool: %s\n", err.msg);
    return p;
}

static void test_sizes(void) {
    kv_pool *p = make_pool(10, GGUF_DT_F16);
    CHECK(kv_pool_geometry(p)->k_row == 2 * 8 * 2);
    CHECK(kv_pool_geometry(p)->block_bytes == 3 * 4 * (32 + 32));
    CHECK(kv_pool_geometry(p)->token_bytes == 3 * 64);
    /* distinct blocks/layers do not overlap */
    uint8_t *a = kv_block_k(p, 0, 0), *b = kv_block_v(p, 0, 0), *c = kv_block_k(p, 0, 1),
            *d = kv_block_k(p, 1, 0);
    CHECK(b - a == 4 * 32);
    CHECK(c - a == 4 * 64);
    CHECK(d - a == (ptrdiff_t)kv_pool_geometry(p)->block_bytes);
    kv_pool_destroy(p);
    /* a pipeline stage without any layer of a group: blocks of 0 bytes, the
     * block ids handed out as by any pool (they follow rank 0's) */
    kv_pool_config none = {.n_layers = 0,
                           .n_kv_heads = 2,
                           .head_dim_k = 8,
                           .head_dim_v = 8,
                           .block_size = 4,
                           .dtype = GGUF_DT_F16,
                           .n_blocks = 3};
    kvl_error nerr;
    kv_pool *z = kv_pool_create(&none, &nerr);
    CHECK(z && kv_pool_geometry(z)->block_bytes == 0 && kv_pool_n_free(z) == 3);
    kv_pool_destroy(z);
    none.n_layers = -1;
    CHECK(kv_pool_create(&none, &nerr) == NULL);
    kv_pool_config bad = {.n_layers = 1,
                          .n_kv_heads = 1,
                          .head_dim_k = 1,
                          .head_dim_v = 1,
                          .block_size = 1,
                          .dtype = GGUF_DT_Q4_0,
                          .n_blocks = 1};
    kvl_error err;
    CHECK(kv_pool_create(&bad, &err) == NULL);
}

/* The KV storage types: their names, row sizes and nothing else. */
static void test_dtypes(void) {
    static const struct {
        const char *name;
        int dtype;
        int64_t n;
        size_t bytes;
    } want[] = {{"f32", GGUF_DT_F32, 3, 12},    {"f16", GGUF_DT_F16, 3, 6},
                {"bf16", GGUF_DT_BF16, 3, 6},   {"q8_0", GGUF_DT_Q8_0, 64, 68},
                {"q5_0", GGUF_DT_Q5_0, 64, 44}, /* llama.cpp's cache types: 22-byte blocks */
                {"q4_0", GGUF_DT_Q4_0, 64, 36}, {"iq4_nl", GGUF_DT_IQ4_NL, 64, 36},
                {"fp8", KV_DT_FP8_E4M3, 3, 3}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int dt = -1;
        CHECK(kv_dtype_parse(want[i].name, &dt) && dt == want[i].dtype);
        CHECK(strcmp(kv_dtype_name(want[i].dtype), want[i].name) == 0);
        CHECK(kv_row_bytes(want[i].dtype, want[i].n) == want[i].bytes);
        CHECK(kv_dtype_bytes(want[i].dtype) == (want[i].n == 64 ? 0 : want[i].bytes / 3));
    }
    int dt = -1;
    CHECK(kv_dtype_parse("fp8_e4m3", &dt) && dt == KV_DT_FP8_E4M3);
    /* q4_1 / q5_1: not offered (their q.k goes through Q8_1 in llama.cpp) */
    CHECK(!kv_dtype_parse("q4_1", &dt) && !kv_dtype_parse("q5_1", &dt) &&
          !kv_dtype_parse("Q8_0", &dt) && !kv_dtype_parse("", &dt));
    CHECK(kv_row_bytes(GGUF_DT_Q8_0, 48) == 0 && kv_row_bytes(GGUF_DT_Q4_1, 64) == 0 &&
          kv_row_bytes(GGUF_DT_Q4_0, 48) == 0 && kv_row_bytes(GGUF_DT_F16, -1) == 0);
    CHECK(strcmp(kv_dtype_name(GGUF_DT_Q4_K), "unknown") == 0 && kv_dtype_bytes(GGUF_DT_I8) == 0);
}

static void test_exhaustion(void) {
    kv_pool *p = make_pool(5, GGUF_DT_F32);
    kv_seq s;
    kv_seq_init(&s);
    CHECK(kv_seq_reserve(p, &s, 9)); /* 3 blocks */
    CHECK(s.n_blocks == 3 && kv_pool_n_free(p) == 2);
    int32_t before[3];
    memcpy(before, s.blocks, sizeof before);
    CHECK(!kv_seq_reserve(p, &s, 21)); /* needs 6 in total: must fail and change nothing */
    CHECK(s.n_blocks == 3 && kv_pool_n_free(p) == 2 &&
          memcmp(before, s.blocks, sizeof before) == 0);
    int32_t out[3];
    CHECK(!kv_block_alloc(p, 3, out));
    CHECK(kv_pool_n_free(p) == 2);
    CHECK(kv_seq_reserve(p, &s, 20)); /* exactly 5 */
    CHECK(kv_pool_n_free(p) == 0);
    kv_usage u = kv_seq_usage(p, &s, 18);
    CHECK(u.lower_bound_bytes == 18 * kv_pool_geometry(p)->token_bytes);
    CHECK(u.allocated_bytes == 5 * kv_pool_geometry(p)->block_bytes);
    kv_seq_free(p, &s);
    CHECK(kv_pool_n_free(p) == 5);
    kv_pool_destroy(p);
}

static void test_sharing(void) {
    kv_pool *p = make_pool(4, GGUF_DT_F16);
    int32_t b;
    CHECK(kv_block_alloc(p, 1, &b));
    kv_block_ref(p, b);
    CHECK(kv_block_refcount(p, b) == 2);
    kv_block_unref(p, b);
    CHECK(kv_pool_n_free(p) == 3);
    kv_block_unref(p, b);
    CHECK(kv_pool_n_free(p) == 4 && kv_block_refcount(p, b) == 0);
    kv_block_unref(p, b); /* double free is ignored, not corrupting */
    CHECK(kv_pool_n_free(p) == 4);
    kv_pool_destroy(p);
}

/* Random reserve/release over several sequences; every block is either free or
 * held by exactly one sequence. */
static void test_random(void) {
    enum { NS = 6, NB = 40 };
    kv_pool *p = make_pool(NB, GGUF_DT_F16);
    kv_seq s[NS];
    for (int i = 0; i < NS; i++) kv_seq_init(&s[i]);
    srand(42);
    for (int it = 0; it < 5000; it++) {
        int i = rand() % NS;
        if (rand() % 4 == 0) kv_seq_release(p, &s[i]);
        else kv_seq_reserve(p, &s[i], s[i].n_blocks * 4 + rand() % 13);
        int held[NB] = {0};
        int64_t total = 0;
        for (int k = 0; k < NS; k++)
            for (int64_t j = 0; j < s[k].n_blocks; j++) held[s[k].blocks[j]]++, total++;
        for (int b = 0; b < NB; b++)
            if (held[b] > 1 || held[b] != kv_block_refcount(p, b)) {
                CHECK(!"block held twice or refcount mismatch");
                it = 1 << 30;
                break;
            }
        if (total + kv_pool_n_free(p) != NB) {
            CHECK(!"blocks lost");
            break;
        }
    }
    for (int i = 0; i < NS; i++) kv_seq_free(p, &s[i]);
    CHECK(kv_pool_n_free(p) == NB);
    kv_pool_destroy(p);
}

/* kv_store_token puts each head where kv_block_layout says: head-major when the
 * heads store apart (every plain type; q8_0 with heads of 64), a row per token
 * otherwise (q8_0 with heads of 48: blocks of 32 span heads); reading a head
 * back from there gives what storing that head alone gives. */
static void test_layout(void) {
    static const struct {
        int dtype, head_dim;
        bool split;
    } cases[] = {{GGUF_DT_F16, 8, true},    {GGUF_DT_F32, 8, true},   {GGUF_DT_BF16, 8, true},
                 {KV_DT_FP8_E4M3, 8, true}, {GGUF_DT_Q8_0, 64, true}, {GGUF_DT_Q8_0, 48, false}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int H = 2, D = cases[ci].head_dim, BS = 4, dt = cases[ci].dtype;
        kv_pool_config c = {.n_layers = 2,
                            .n_kv_heads = H,
                            .head_dim_k = D,
                            .head_dim_v = D,
                            .block_size = BS,
                            .dtype = dt,
                            .n_blocks = 3};
        kvl_error err;
        kv_pool *p = kv_pool_create(&c, &err);
        CHECK(p != NULL);
        if (!p) continue;
        const kv_block_layout *L = kv_pool_k_layout(p);
        CHECK(L->split == cases[ci].split);
        CHECK(kv_pool_v_layout(p)->split == cases[ci].split);
        if (L->split) {
            CHECK(L->head_bytes == kv_row_bytes(dt, D) && L->row_stride == L->head_bytes);
            CHECK(L->head_stride == (size_t)BS * L->head_bytes);
        } else {
            CHECK(L->row_stride == kv_pool_geometry(p)->k_row);
        }
        for (int b = 0; b < 3; b++)
            for (int l = 0; l < 2; l++) {
                memset(kv_block_k(p, b, l), 0xA5, kv_pool_geometry(p)->k_row * BS);
                memset(kv_block_v(p, b, l), 0xA5, kv_pool_geometry(p)->v_row * BS);
            }
        float k[2 * 64], v[2 * 64], want[2 * 64], got[2 * 64];
        uint8_t tmp[2 * 64 * 4];
        for (int row = 0; row < BS; row++) {
            for (int i = 0; i < H * D; i++)
                k[i] = 0.01f * (float)((i * 7 + row * 13) % 97) - 0.4f, v[i] = -k[i];
            kv_store_token(p, 1, 1, row, k, v);
        }
        for (int row = 0; row < BS; row++) {
            for (int i = 0; i < H * D; i++)
                k[i] = 0.01f * (float)((i * 7 + row * 13) % 97) - 0.4f, v[i] = -k[i];
            for (int kvv = 0; kvv < 2; kvv++) {
                const uint8_t *area = kvv ? kv_block_v_const(p, 1, 1) : kv_block_k_const(p, 1, 1);
                const float *src = kvv ? v : k;
                if (L->split) {
                    for (int h = 0; h < H; h++) {
                        kv_row_store(dt, src + h * D, tmp, D); /* the head stored alone */
                        kv_row_load(dt, tmp, want, D);
                        kv_row_load(dt, area + h * L->head_stride + row * L->row_stride, got, D);
                        CHECK(memcmp(want, got, (size_t)D * sizeof(float)) == 0);
                    }
                } else {
                    kv_row_store(dt, src, tmp, H * D);
                    kv_row_load(dt, tmp, want, H * D);
                    kv_row_load(dt, area + row * L->row_stride, got, H * D);
                    CHECK(memcmp(want, got, (size_t)(H * D) * sizeof(float)) == 0);
                }
            }
        }
        /* nothing outside block 1, layer 1 changed */
        const size_t kb = kv_pool_geometry(p)->k_row * BS, vb = kv_pool_geometry(p)->v_row * BS;
        for (int b = 0; b < 3; b++)
            for (int l = 0; l < 2; l++) {
                if (b == 1 && l == 1) continue;
                const uint8_t *ka = kv_block_k_const(p, b, l), *va = kv_block_v_const(p, b, l);
                for (size_t i = 0; i < kb; i++) CHECK(ka[i] == 0xA5);
                for (size_t i = 0; i < vb; i++) CHECK(va[i] == 0xA5);
            }
        kv_pool_destroy(p);
    }
}

/* Speculative rollback: drafted positions past the accepted ones are dropped
 * in place; the blocks past them go back to the pool; the prefix cache only
 * ever holds blocks of accepted tokens, and a rollback into a committed block
 * drops that block whole rather than let its cached contents change. */
static void test_truncate_tokens(void) {
    kv_pool *p = make_pool(8, GGUF_DT_F16); /* block_size 4 */
    kv_seq s, t;
    kv_seq_init(&s);
    kv_seq_init(&t);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 100 + i;
    kvl_error err = {{0}};
    /* 6 accepted tokens (one full block committed), then 5 drafts: 11 positions, 3 blocks */
    CHECK(kv_seq_reserve(p, &s, 11) && s.n_blocks == 3 && kv_pool_n_free(p) == 5);
    kv_prefix_commit(p, &s, toks, 6);
    CHECK(s.n_hashed == 1);
    /* 1 draft accepted: 7 positions held, block 2 (positions 8..10) back in the pool */
    CHECK(kv_seq_truncate_tokens(p, &s, 7) == 7 && s.n_blocks == 2 && kv_pool_n_free(p) == 6);
    CHECK(s.n_hashed == 1 && kv_pool_check(p, &err));
    kv_prefix_commit(p, &s, toks, 7); /* block 1 is not full: stays uncached */
    CHECK(s.n_hashed == 1 && kv_pool_n_cached(p) == 0);
    /* nothing to drop: the same table */
    CHECK(kv_seq_truncate_tokens(p, &s, 8) == 8 && s.n_blocks == 2);
    /* exactly at a block edge: no partial block kept */
    CHECK(kv_seq_truncate_tokens(p, &s, 4) == 4 && s.n_blocks == 1 && s.n_hashed == 1);
    /* into the committed block: it goes whole, the chain restarts, the cache still finds it */
    CHECK(kv_seq_truncate_tokens(p, &s, 2) == 0 && s.n_blocks == 0 && s.n_hashed == 0);
    CHECK(kv_pool_n_cached(p) == 1 && kv_pool_check(p, &err));
    CHECK(kv_prefix_match(p, &t, toks, 7) == 4 && t.n_blocks == 1);
    /* a draft that differed from the tokens later accepted never reaches the cache */
    CHECK(kv_seq_reserve(p, &t, 9));
    int32_t drafted[9];
    memcpy(drafted, toks, sizeof drafted);
    drafted[5] = 7; /* rejected draft at position 5 */
    CHECK(kv_seq_truncate_tokens(p, &t, 5) == 5 && t.n_blocks == 2);
    kv_prefix_commit(p, &t, toks, 5);
    CHECK(kv_seq_reserve(p, &t, 9));
    kv_prefix_commit(p, &t, toks, 9); /* the accepted tokens, computed again */
    CHECK(t.n_hashed == 2 && kv_pool_check(p, &err));
    kv_seq u;
    kv_seq_init(&u);
    CHECK(kv_prefix_match(p, &u, toks, 9) == 8);
    CHECK(kv_prefix_match(p, &s, drafted, 9) == 4); /* the drafted block 1 was never cached */
    kv_seq_free(p, &s);
    kv_seq_free(p, &t);
    kv_seq_free(p, &u);
    CHECK(kv_pool_n_used(p) == 0 && kv_pool_check(p, &err));
    kv_pool_destroy(p);
}

int main(void) {
    test_truncate_tokens();
    test_layout();
    test_sizes();
    test_dtypes();
    test_exhaustion();
    test_sharing();
    test_random();
    printf("test_kv: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
