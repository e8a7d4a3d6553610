/* A MoE decode layer's experts alone, in qwen3-30b-a3b's shape (8 of 128 experts of
 * 2048 x 768, gate and up Q4_K, down Q6_K; 16 layers' worth of weights, 5.9 GB, so every
 * layer comes from DRAM): the experts at random of a random layer, iterations taking turns
 * between two ways of running them, on 2 threads:
 *   two runs: gate and up of all (kern_matmul_repacked_each), the activation on the calling
 *             thread, then every down (kern_matmul_repacked_each): two parallel regions
 *   gated:    kern_matmul_repacked_gated, one region, each down once its input is made.
 * Build (not part of the CMake build), from the repo root:
 *   gcc -std=gnu11 -O2 -Isrc -Isrc/base -Isrc/gguf -Isrc/kernels src/base/base.c \
 *       src/base/kvl_pool.c src/gguf/gguf_types.c src/kernels/[a-z]*.c bench/bench_moe_region.c \
 *       -o build/bench_moe_region -lm -lpthread
 * Run:   build/bench_moe_region [iterations, default 2000] */
#include "base/kvl_pool.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static void *huge(size_t n) {
    void *p = aligned_alloc(2 << 20, (n + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1));
    if (!p) {
        fprintf(stderr, "bench_moe_region: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    madvise(p, n, MADV_HUGEPAGE);
    memset(p, 0, n);
    return p;
}
static void *mk(int type, int64_t n_out, int64_t k, int copies, size_t *each) {
    float *w = malloc(sizeof(float) * n_out * k);
    for (int64_t i = 0; i < n_out * k; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    size_t rb = kern_row_bytes(type, k);
    char *q = malloc(rb * n_out);
    for (int64_t r = 0; r < n_out; r++) kern_traits_of(type)->from_float(w + r * k, q + r * rb, k);
    *each = kern_repack_bytes(type, n_out, k);
    char *P = huge(*each * copies);
    kern_repack(q, type, n_out, k, P);
    for (int c = 1; c < copies; c++) memcpy(P + c * *each, P, *each);
    free(w);
    free(q);
    return P;
}
enum { NE = 128, K = 8, E = 2048, F = 768, LC = 16 };
static float *hg, *hu;
static void act(void *ctx, int e) {
    (void)ctx;
    kern_silu_mul(hg + e * F, hu + e * F, F);
}
int main(int argc, char **argv) {
    kern_init(NULL);
    kvl_pool_set_threads(2);
    int dtg = GGUF_DT_Q4_K, dtd = GGUF_DT_Q6_K;
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    size_t bg, bd;
    char *G = mk(dtg, F, E, 2 * NE * LC, &bg), *D = mk(dtd, E, F, NE * LC, &bd);
    float *x = malloc(4 * E), *y = malloc(4 * K * E);
    hg = malloc(4 * K * F), hu = malloc(4 * K * F);
    for (int i = 0; i < E; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    kern_repacked_one gu[2 * K], dn[K];
    for (int i = 0; i < K; i++) {
        gu[2 * i] = (kern_repacked_one){G, dtg, F, E, x, hg + i * F};
        gu[2 * i + 1] = (kern_repacked_one){G, dtg, F, E, x, hu + i * F};
        dn[i] = (kern_repacked_one){D, dtd, E, F, hg + i * F, y + i * E};
    }
    void *work = malloc(kern_matmul_repacked_gated_work_bytes(K, gu, dn) + 4096);
    double t[2] = {0};
    long n[2] = {0};
    srand(1);
    for (int it = 0; it < iters; it++) {
        int v = it % 2, l = rand() % LC;
        for (int i = 0; i < K; i++) {
            int e = rand() % NE, ed = rand() % NE;
            gu[2 * i].P = G + ((size_t)l * 2 * NE + 2 * e) * bg;
            gu[2 * i + 1].P = G + ((size_t)l * 2 * NE + 2 * e + 1) * bg;
            dn[i].P = D + ((size_t)l * NE + ed) * bd;
        }
        double t0 = now();
        if (v == 0) {
            kern_matmul_repacked_each(2 * K, gu, work);
            kern_silu_mul(hg, hu, K * F);
            kern_matmul_repacked_each(K, dn, work);
        } else {
            kern_matmul_repacked_gated(K, gu, dn, act, NULL, work);
        }
        t[v] += now() - t0;
        n[v]++;
    }
    double bytes = 2.0 * K * bg + K * bd;
    for (int v = 0; v < 2; v++)
        printf("%s: %.1f us/layer  %.2f GB/s\n", v ? "gated   " : "two runs", 1e6 * t[v] / n[v],
               bytes * n[v] / t[v] / 1e9);
    return 0;
}
