/* Instruction-count driver for callgrind: runs each weight type's vec_dot
 * and a small matmul (m = 1 and 4) plus the attention merge, on fixed data,
 * single-threaded, so `valgrind --tool=callgrind` gives repeatable per-kernel
 * instruction counts to compare a kernel change against (valgrind runs the
 * scalar and AVX2 paths; it has no AVX-512).
 *
 * Build (not part of the CMake build), from the repo root:
 *   gcc -std=gnu11 -O2 -g -fopenmp -Isrc src/base/[a-z]*.c src/gguf/gguf_types.c \
 *       src/kernels/[a-z]*.c bench/kern_ir.c -o build/kern_ir -lm
 * Run:   OMP_NUM_THREADS=1 valgrind --tool=callgrind ./build/kern_ir scalar|avx2
 *        callgrind_annotate callgrind.out.PID */
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K     1024
#define N_OUT 16

static uint64_t rng = 88172645463325252ull;
static float next_f(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xFFFF) / 32768.0f - 1.0f;
}

int main(int argc, char **argv) {
    kern_init(argc > 1 ? argv[1] : NULL);
    printf("isa %s\n", kern_isa_name());
    static const int types[] = {GGUF_DT_Q4_0, GGUF_DT_Q4_1,   GGUF_DT_Q5_0, GGUF_DT_Q5_1,
                                GGUF_DT_Q8_0, GGUF_DT_IQ4_NL, GGUF_DT_Q2_K, GGUF_DT_Q3_K,
                                GGUF_DT_Q4_K, GGUF_DT_Q5_K,   GGUF_DT_Q6_K, GGUF_DT_IQ4_XS};
    float *w = malloc(sizeof(float) * K * N_OUT), *x = malloc(sizeof(float) * K * 4);
    float *y = malloc(sizeof(float) * N_OUT * 4);
    for (int i = 0; i < K * N_OUT; i++) w[i] = next_f();
    for (int i = 0; i < K * 4; i++) x[i] = next_f();
    double check = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const kern_traits *tr = kern_traits_ref(types[t]);
        if (!tr || !tr->from_float) continue;
        const size_t rb = kern_row_bytes(types[t], K);
        uint8_t *q = malloc(rb * N_OUT);
        for (int r = 0; r < N_OUT; r++) tr->from_float(w + r * K, q + r * rb, K);
        void *work = malloc(kern_matmul_work_bytes(types[t], 4, K));
        for (int rep = 0; rep < 20; rep++) {
            kern_matmul(q, types[t], N_OUT, K, x, 1, y, work);
            check += y[0];
            kern_matmul(q, types[t], N_OUT, K, x, 4, y, work);
            check += y[N_OUT * 3];
        }
        free(work);
        free(q);
    }
    enum { NC = 4, NQ = 8, DV = 64 };
    float *part = malloc(sizeof(float) * NC * NQ * (DV + 2)),
          *out = malloc(sizeof(float) * NQ * DV);
    for (int i = 0; i < NC * NQ * (DV + 2); i++)
        part[i] = next_f() + (i % (NQ * (DV + 2)) >= NQ ? 1.5f : 0);
    for (int rep = 0; rep < 50; rep++) {
        kern_attn_merge(NC, NQ, DV, part, out, DV);
        check += out[5];
    }
    printf("check %.6f\n", check);
    return 0;
}
