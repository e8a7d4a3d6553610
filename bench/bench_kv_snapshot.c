/* Cost of the live KV view's copy of a pool (kv_pool_snapshot), the part of
 * GET /v1/kv/state that runs on the engine thread, at 8,192 blocks.
 *
 * Build (not part of the CMake build), from the repo root, after `make`:
 *   gcc -std=gnu11 -O2 -Isrc/base -Isrc/gguf -Isrc/kernels -Isrc/kv bench/bench_kv_snapshot.c \
 *       build/libkvllm_kv.a build/libkvllm_kernels.a build/libkvllm_gguf.a build/libkvllm_base.a \
 *       -o build/bench_kv_snapshot -fopenmp -lxxhash -lcjson -lm
 * Run:   ./build/bench_kv_snapshot [blocks] [reps]
 *
 * The pool is set up as a busy server's looks: a third of the blocks held by
 * 64 sequences whose first blocks share a prefix, a third cached on the LRU,
 * the rest free. The tiny block shape keeps the pool's K/V memory small; the
 * snapshot reads only the bookkeeping, whose size does not depend on it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kv.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : 8192;
    const int reps = argc > 2 ? atoi(argv[2]) : 2000;
    kv_pool_config c = {.n_layers = 1,
                        .n_kv_heads = 1,
                        .head_dim_k = 32,
                        .head_dim_v = 32,
                        .block_size = 16,
                        .dtype = GGUF_DT_F16,
                        .n_blocks = n};
    kvl_error err = {{0}};
    kv_pool *p = kv_pool_create(&c, &err);
    if (!p) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    enum { SEQS = 64 };
    static kv_seq s[SEQS], gone[SEQS];
    int64_t per = n / 3 / SEQS, toks = per * 16;
    int32_t *tokens = malloc((size_t)toks * sizeof *tokens);
    for (int i = 0; i < SEQS; i++) { /* finished sequences: their blocks end up cached */
        for (int64_t t = 0; t < toks; t++) tokens[t] = (int32_t)(t < 64 ? t : 1000 * (i + 100) + t);
        kv_seq_init(&gone[i]);
        kv_prefix_match(p, &gone[i], tokens, toks);
        kv_seq_reserve(p, &gone[i], toks);
        kv_prefix_commit(p, &gone[i], tokens, toks);
    }
    for (int i = 0; i < SEQS; i++) kv_seq_release(p, &gone[i]);
    for (int i = 0; i < SEQS; i++) { /* running sequences sharing a 4-block prefix */
        for (int64_t t = 0; t < toks; t++) tokens[t] = (int32_t)(t < 64 ? t : 1000 * i + t);
        kv_seq_init(&s[i]);
        kv_prefix_match(p, &s[i], tokens, toks);
        kv_seq_reserve(p, &s[i], toks);
    }
    kv_block_info *out = malloc((size_t)n * sizeof *out);
    kv_pool_snapshot(p, out);
    int64_t cnt[3] = {0};
    for (int64_t b = 0; b < n; b++) cnt[out[b].state]++;
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        for (int i = 0; i < reps; i++) kv_pool_snapshot(p, out);
        double us = (now_s() - t0) / reps * 1e6;
        if (us < best) best = us;
    }
    printf("blocks %lld (free %lld, used %lld, cached %lld): %.2f us per kv_pool_snapshot (best of "
           "5 x %d)\n",
           (long long)n, (long long)cnt[KV_BLOCK_FREE], (long long)cnt[KV_BLOCK_USED],
           (long long)cnt[KV_BLOCK_CACHED], best, reps);
    for (int i = 0; i < SEQS; i++) kv_seq_free(p, &s[i]), kv_seq_free(p, &gone[i]);
    free(out);
    free(tokens);
    kv_pool_destroy(p);
    return 0;
}
