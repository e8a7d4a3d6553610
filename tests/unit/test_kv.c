/* Block pool and block tables: allocation, sharing, exhaustion that changes
 * nothing, and invariants after a random sequence of operations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

static int failures;
#define CHECK(c)                                                     \
    do {                                                             \
        if (!(c)) {                                                  \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); \
            failures++;                                              \
        }                                                            \
    } while (0)

static kv_pool *make_pool(int64_t n_blocks, int dtype) {
    kv_pool_config c = {.n_layers = 3, .n_kv_heads = 2, .head_dim_k = 8, .head_dim_v = 8,
                        .block_size = 4, .dtype = dtype, .n_blocks = n_blocks};
    kvl_error err;
    kv_pool *p = kv_pool_create(&c, &err);
    if (!p) fprintf(stderr, "pool: %s\n", err.msg);
    return p;
}

static void test_sizes(void) {
    kv_pool *p = make_pool(10, GGUF_DT_F16);
    CHECK(kv_pool_k_row_bytes(p) == 2 * 8 * 2);
    CHECK(kv_pool_block_bytes(p) == 3 * 4 * (32 + 32));
    CHECK(kv_pool_bytes_per_token(p) == 3 * 64);
    /* distinct blocks/layers do not overlap */
    uint8_t *a = kv_block_k(p, 0, 0), *b = kv_block_v(p, 0, 0), *c = kv_block_k(p, 0, 1), *d = kv_block_k(p, 1, 0);
    CHECK(b - a == 4 * 32);
    CHECK(c - a == 4 * 64);
    CHECK(d - a == (ptrdiff_t)kv_pool_block_bytes(p));
    kv_pool_destroy(p);
    kv_pool_config bad = {.n_layers = 1, .n_kv_heads = 1, .head_dim_k = 1, .head_dim_v = 1,
                          .block_size = 1, .dtype = GGUF_DT_Q4_0, .n_blocks = 1};
    kvl_error err;
    CHECK(kv_pool_create(&bad, &err) == NULL);
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
    CHECK(s.n_blocks == 3 && kv_pool_n_free(p) == 2 && memcmp(before, s.blocks, sizeof before) == 0);
    int32_t out[3];
    CHECK(!kv_block_alloc(p, 3, out));
    CHECK(kv_pool_n_free(p) == 2);
    CHECK(kv_seq_reserve(p, &s, 20)); /* exactly 5 */
    CHECK(kv_pool_n_free(p) == 0);
    kv_usage u = kv_seq_usage(p, &s, 18);
    CHECK(u.lower_bound_bytes == 18 * kv_pool_bytes_per_token(p));
    CHECK(u.allocated_bytes == 5 * kv_pool_block_bytes(p));
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

int main(void) {
    test_sizes();
    test_exhaustion();
    test_sharing();
    test_random();
    printf("test_kv: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
