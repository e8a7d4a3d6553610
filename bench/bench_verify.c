/* Verify cost of one sequence: the time of one forward over n tokens (every
 * row's logits wanted, as a speculative verification asks) at a given
 * context, against one token, through model_forward itself (no engine), so
 * that a profiler sees only the forward.
 *
 * Build (not part of the CMake build), from the repo root, after the build:
 *   gcc -std=gnu11 -O2 -Isrc/base -Isrc/gguf -Isrc/kernels -Isrc/tokenizer -Isrc/kv \
 *       -Isrc/model -Isrc/engine bench/bench_verify.c build/libkvllm_engine.a \
 *       build/libkvllm_model.a build/libkvllm_kv.a build/libkvllm_kernels.a \
 *       build/libkvllm_tokenizer.a build/libkvllm_gguf.a build/libkvllm_base.a \
 *       -o build/bench_verify -fopenmp -lcjson -lxxhash -lpcre2-8 -lpthread -lm
 * Run:   ./build/bench_verify MODEL [context=128] [reps=2000] [threads=2] [sizes=1,2,3,5,8]
 * Prints per size: median and best microseconds per forward and the ratio to
 * one token, and the 10th percentile and its ratio (on a shared machine, where
 * a second thread is often descheduled, the lower percentiles show the
 * forwards whose threads all ran). A size's forwards write the same positions over again (the K/V
 * of [context, context + n) is rewritten, as a rejected draft's would be). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels.h"
#include "kvl_pool.h"

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [context] [reps] [threads] [sizes]\n", argv[0]);
        return 2;
    }
    const int ctx = argc > 2 ? atoi(argv[2]) : 128, reps = argc > 3 ? atoi(argv[3]) : 2000;
    kvl_pool_set_threads(argc > 4 ? atoi(argv[4]) : 2);
    const char *sizes = argc > 5 ? argv[5] : "1,2,3,5,8";
    kern_init(getenv("KVLLM_ISA"));
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(argv[1], &err);
    model_params mp = {.max_ctx = ctx + 128, .max_ubatch = 512};
    model *m = f ? model_load(f, &mp, &err) : NULL;
    if (!m) {
        fprintf(stderr, "%s: %s\n", argv[1], err.msg);
        return 1;
    }
    const int ng = model_kv_n_groups(m);
    const int64_t V = model_hp(m)->n_vocab;
    kv_pool *pools[MODEL_MAX_KV_GROUPS];
    kv_seq seqs[MODEL_MAX_KV_GROUPS];
    const kv_seq *tables[MODEL_MAX_KV_GROUPS];
    for (int g = 0; g < ng; g++) {
        kv_pool_config kc;
        model_kv_group_shape(m, g, &kc, NULL);
        kc.block_size = 16;
        kc.dtype = GGUF_DT_F16;
        kc.split_v = false;
        kc.n_blocks = (ctx + 128) / 16 + 2;
        if (!(pools[g] = kv_pool_create(&kc, &err))) {
            fprintf(stderr, "kv_pool_create: %s\n", err.msg);
            return 1;
        }
        kv_seq_init(&seqs[g]);
        if (!kv_seq_reserve(pools[g], &seqs[g], ctx + 64)) return 1;
        tables[g] = &seqs[g];
    }
    const int n_max = ctx + 64;
    int32_t *tok = malloc(n_max * sizeof *tok), *pos = malloc(n_max * sizeof *pos),
            *sq = calloc(n_max, sizeof *sq);
    uint8_t *want = malloc(n_max);
    float *logits = malloc((size_t)64 * V * sizeof(float));
    srand(7);
    for (int i = 0; i < n_max; i++) {
        tok[i] = 1 + rand() % (int)(V - 1);
        pos[i] = i;
        want[i] = 1;
    }
    /* the context, in one prefill (only its last row's logits) */
    memset(want, 0, (size_t)ctx);
    want[ctx - 1] = 1;
    model_batch pb = {ctx, tok, pos, sq, want, 1, tables, NULL};
    if (!model_forward(m, pools, &pb, logits, &err)) {
        fprintf(stderr, "prefill: %s\n", err.msg);
        return 1;
    }
    memset(want, 1, (size_t)n_max);
    double *t = malloc((size_t)reps * sizeof *t), t1 = 0, p1 = 0;
    printf("# %s, context %d, %d threads, %d reps: microseconds per forward of n tokens\n", argv[1],
           ctx, kvl_pool_threads(), reps);
    printf("n\tmedian\tbest\tmedian/t(1)\tp10\tp10/p10(1)\n");
    for (const char *p = sizes; *p;) {
        const int n = (int)strtol(p, (char **)&p, 10);
        if (*p == ',') p++;
        if (n < 1 || n > 64) continue;
        model_batch b = {n, tok + ctx, pos + ctx, sq, want, 1, tables, NULL};
        for (int r = 0; r < reps / 10 + 1; r++) model_forward(m, pools, &b, logits, &err);
        for (int r = 0; r < reps; r++) {
            const double t0 = kvl_time_s();
            if (!model_forward(m, pools, &b, logits, &err)) {
                fprintf(stderr, "forward: %s\n", err.msg);
                return 1;
            }
            t[r] = kvl_time_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        const double med = t[reps / 2] * 1e6, p10 = t[reps / 10] * 1e6;
        if (n == 1) t1 = med, p1 = p10;
        printf("%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\n", n, med, t[0] * 1e6, t1 > 0 ? med / t1 : 0, p10,
               p1 > 0 ? p10 / p1 : 0);
    }
    return 0;
}
