/* How close the decode kernels stream to a plain read of the same bytes: a
 * MoE layer's expert products beside a 2-thread read of as many bytes, in
 * the same pattern, the same minutes, the same process.
 *
 * Build (not part of the CMake build), from the repo root:
 *   gcc -std=gnu11 -O2 -march=native -Isrc -Isrc/base -Isrc/gguf -Isrc/kernels src/base/base.c \
 *       src/base/kvl_pool.c src/gguf/gguf_types.c src/kernels/[a-z]*.c bench/bench_expert_stream.c \
 *       -o build/bench_expert_stream -lm -lpthread
 * Run:   ./build/bench_expert_stream [rounds, default 3000] [GiB of weights, default 8]
 *
 * Each round reads the bytes of one qwen3-30b-a3b MoE layer's selected gate
 * and up matrices (8 experts x 2 x 768 x 2048 Q4_K, repacked: 14.2 MB) from a
 * random place in a region far larger than the caches, through the engine's
 * pool, in one of four ways, the four taking turns so that the machine's
 * drift falls on all of them:
 *   read alone        kern_read_sum, one stream per thread, right after 1 ms
 *                     of scalar busy work on both threads
 *   read after SIMD   the same, right after both threads multiplied a cached
 *                     (L2-resident) 768 x 2048 Q4_K matrix for about 1 ms
 *   experts           kern_matmul_repacked_each over the 16 matrices: 8 random
 *                     experts' gate and up in a random layer's 3-D tensors
 *                     (as a decode step reads them)
 *   one matrix        the same bytes as one 12288 x 2048 matrix
 * The kvllm bench probe (--membw) is a read alone of 1 GiB; the difference
 * between the experts and the read here is what the kernels themselves lose
 * (their arithmetic and loads not fully overlapping the stream), the rest of
 * a decode step's distance from the probe is outside them (bench/README.md,
 * "Where a MoE decode step goes, by phase"). "read after SIMD" asks whether
 * the arithmetic slows the memory system itself (a lower core clock after
 * SIMD work, as on some Xeons): on the Xeon of 2026-12-06 it did not. */
#include "kernels/kernels.h"
#include "kvl_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { N_EXP = 128, N_USED = 8, EMBD = 2048, FF = 768 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    const char *p;
    size_t half;
    _Atomic uint64_t sum;
} read_job;

static void read_task(void *ctx, int64_t t, int thread) {
    (void)thread;
    read_job *j = ctx;
    j->sum += kern_read_sum(j->p + (size_t)t * j->half, j->half);
}

/* Scalar busy work on both threads for about 1 ms (the threads stay awake,
 * the core clock recovers from any SIMD before it). */
static void scalar_task(void *ctx, int64_t t, int thread) {
    (void)ctx, (void)t, (void)thread;
    const double t0 = now();
    while (now() - t0 < 0.001) {}
}

int main(int argc, char **argv) {
    const long rounds = argc > 1 ? atol(argv[1]) : 3000;
    const size_t gib = argc > 2 ? (size_t)atol(argv[2]) : 8;
    kern_init(NULL);
    if (strcmp(kern_isa_name(), "avx512") != 0) {
        fprintf(stderr, "bench_expert_stream: needs AVX-512\n");
        return 1;
    }
    kvl_pool_set_threads(2);
    const int type = GGUF_DT_Q4_K;
    const size_t one = kern_repack_bytes(type, FF, EMBD), layer = 2 * N_USED * one;
    /* one repacked matrix of random values, copied over the whole region */
    float *w = malloc(sizeof(float) * FF * EMBD);
    const size_t rb = kern_row_bytes(type, EMBD);
    char *q = malloc(rb * FF), *packed = malloc(one);
    for (int64_t i = 0; i < (int64_t)FF * EMBD; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int r = 0; r < FF; r++)
        kern_traits_of(type)->from_float(w + (size_t)r * EMBD, q + r * rb, EMBD);
    kern_repack(q, type, FF, EMBD, packed);
    const size_t n_mats = (gib << 30) / one, total = n_mats * one;
    char *region = aligned_alloc(2 << 20, (total + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1));
    char *cached = aligned_alloc(64, one);
    if (!w || !q || !packed || !region || !cached || n_mats < 2 * N_EXP) {
        fprintf(stderr, "bench_expert_stream: out of memory\n");
        return 1;
    }
    madvise(region, total, MADV_HUGEPAGE);
    for (size_t m = 0; m < n_mats; m++) memcpy(region + m * one, packed, one);
    memcpy(cached, packed, one);

    float *x = malloc(sizeof(float) * EMBD), *h = malloc(sizeof(float) * 2 * N_USED * FF);
    for (int i = 0; i < EMBD; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    kern_repacked_one mats[2 * N_USED];
    for (int i = 0; i < 2 * N_USED; i++)
        mats[i] = (kern_repacked_one){cached, type, FF, EMBD, x, h};
    void *work = malloc(kern_matmul_repacked_each_work_bytes(2 * N_USED, mats));

    const char *names[] = {"read alone", "read after SIMD", "experts (16 matrices)",
                           "one matrix (12288 rows)"};
    double secs[4] = {0};
    long count[4] = {0};
    srand(7);
    for (long it = 0; it < rounds; it++) {
        const int v = (int)(it % 4);
        const size_t at = (size_t)rand() % (n_mats - 2 * N_USED) * one;
        if (v == 0) kvl_pool_run(scalar_task, NULL, 2);
        if (v == 1) { /* SIMD work with no memory traffic, on both threads, ~1 ms */
            kern_repacked_one c = {cached, type, FF, EMBD, x, h};
            for (int r = 0; r < 64; r++) kern_matmul_repacked_each(1, &c, work);
        }
        /* as a layer's 3-D gate and up tensors hold them: a random layer's
         * region of 2 x N_EXP matrices, gates in its first half, ups after */
        const char *lay = region + (size_t)rand() % (n_mats / (2 * N_EXP)) * 2 * N_EXP * one;
        for (int i = 0; i < N_USED; i++) {
            const size_t e = (size_t)rand() % N_EXP;
            mats[2 * i] = (kern_repacked_one){lay + e * one, type, FF, EMBD, x, h + 2 * i * FF};
            mats[2 * i + 1] = (kern_repacked_one){lay + (N_EXP + e) * one, type, FF, EMBD, x,
                                                  h + (2 * i + 1) * FF};
        }
        const double t0 = now();
        if (v <= 1) {
            read_job j = {region + at, layer / 2, 0};
            kvl_pool_run(read_task, &j, 2);
        } else if (v == 2) {
            kern_matmul_repacked_each(2 * N_USED, mats, work);
        } else {
            kern_repacked_one all = {region + at, type, 2 * N_USED * FF, EMBD, x, h};
            kern_matmul_repacked_each(1, &all, work);
        }
        secs[v] += now() - t0;
        count[v]++;
    }
    printf("%.1f MB a round, %ld rounds, 2 threads\n", (double)layer / 1e6, rounds);
    for (int v = 0; v < 4; v++) {
        const double gbps = (double)layer * (double)count[v] / secs[v] / 1e9;
        const double alone = (double)layer * (double)count[0] / secs[0] / 1e9;
        printf("  %-26s %6.1f us  %5.2f GB/s  %5.1f%% of read alone\n", names[v],
               1e6 * secs[v] / (double)count[v], gbps, 100 * gbps / alone);
    }
    free(work), free(h), free(x), free(cached), free(region), free(packed), free(q), free(w);
    return 0;
}
