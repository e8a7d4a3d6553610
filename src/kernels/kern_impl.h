/* kernels, private: the implementations behind kern_traits and the
 * arithmetic contract they share.
 *
 * Canonical reduction orders. Every implementation of a vec_dot (scalar, AVX2,
 * AVX-512) performs exactly the same float operations in the same order, so the
 * results are bit-identical across ISAs, batch sizes and thread counts. Integer
 * partial sums are exact, so only the float steps need a fixed order:
 *
 *  - FP family (F32, F16, BF16; elements widened to float exactly):
 *    64 float lanes, acc[e % 64] = fma(x[e], y[e], acc[e % 64]), starting at +0,
 *    then kern_reduce64 (below).
 *  - Q family (Q8_0, Q4_0 against Q8_0): 32 float lanes. Block b contributes
 *    its 8 exact int32 sums of 4 consecutive products q_x*q_y, lane l covering
 *    elements 4l..4l+3: acc[8*(b%4) + l] = fma(d_b, (float)isum, acc[...]) with
 *    d_b = fp16(x.d) * fp16(y.d) (exact in float). Then kern_reduce32.
 *  - K family (Q4_K, Q6_K against Q8_K): one float accumulator; each super-block
 *    contributes exact int32 totals through fmaf (see quant_ref.c).
 *
 * fmaf is used explicitly (never a*b+c), so -ffp-contract cannot change results.
 */
#ifndef KVLLM_KERN_IMPL_H
#define KVLLM_KERN_IMPL_H

#include "kernels.h"

#include <math.h>

#define KERN_FP_LANES 64
#define KERN_Q_LANES 32

/* ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)): what an 8-lane horizontal add does. */
static inline float kern_h8(const float *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* 64 lanes = 8 groups G0..G7 of 8: u = ((G0+G4)+(G2+G6)) + ((G1+G5)+(G3+G7)). */
static inline float kern_reduce64(const float *acc) {
    float u[8];
    for (int j = 0; j < 8; j++) {
        float lo = (acc[j] + acc[32 + j]) + (acc[16 + j] + acc[48 + j]);
        float hi = (acc[8 + j] + acc[40 + j]) + (acc[24 + j] + acc[56 + j]);
        u[j] = lo + hi;
    }
    return kern_h8(u);
}

/* 32 lanes = 4 groups A0..A3 of 8: u = (A0+A2) + (A1+A3). */
static inline float kern_reduce32(const float *acc) {
    float u[8];
    for (int j = 0; j < 8; j++) u[j] = (acc[j] + acc[16 + j]) + (acc[8 + j] + acc[24 + j]);
    return kern_h8(u);
}

/* 6-bit scale and min j (0..7) of a Q4_K super-block, as ggml packs them. */
static inline void kern_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- scalar reference (quant_ref.c) ---- */
void kref_to_float_f32(const void *src, float *dst, int64_t n);
void kref_to_float_f16(const void *src, float *dst, int64_t n);
void kref_to_float_bf16(const void *src, float *dst, int64_t n);
void kref_to_float_q8_0(const void *src, float *dst, int64_t n);
void kref_to_float_q4_0(const void *src, float *dst, int64_t n);
void kref_to_float_q4_K(const void *src, float *dst, int64_t n);
void kref_to_float_q6_K(const void *src, float *dst, int64_t n);
void kref_to_float_q8_K(const void *src, float *dst, int64_t n);

void kref_from_float_f32(const float *src, void *dst, int64_t n);
void kref_from_float_f16(const float *src, void *dst, int64_t n);
void kref_from_float_bf16(const float *src, void *dst, int64_t n);
void kref_from_float_q8_0(const float *src, void *dst, int64_t n);
void kref_from_float_q4_0(const float *src, void *dst, int64_t n);
void kref_from_float_q4_K(const float *src, void *dst, int64_t n);
void kref_from_float_q6_K(const float *src, void *dst, int64_t n);
void kref_from_float_q8_K(const float *src, void *dst, int64_t n);

void kref_vec_dot_f32(int64_t n, float *s, const void *x, const void *y);
void kref_vec_dot_f16(int64_t n, float *s, const void *x, const void *y);
void kref_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y);
void kref_vec_dot_q8_0(int64_t n, float *s, const void *x, const void *y);
void kref_vec_dot_q4_0(int64_t n, float *s, const void *x, const void *y);
void kref_vec_dot_q4_K(int64_t n, float *s, const void *x, const void *y);
void kref_vec_dot_q6_K(int64_t n, float *s, const void *x, const void *y);

/* ---- AVX2 + FMA + F16C (quant_avx2.c) ---- */
void kavx2_to_float_f16(const void *src, float *dst, int64_t n);
void kavx2_from_float_f16(const float *src, void *dst, int64_t n);
void kavx2_from_float_q8_0(const float *src, void *dst, int64_t n);
void kavx2_from_float_q8_K(const float *src, void *dst, int64_t n);
void kavx2_vec_dot_f32(int64_t n, float *s, const void *x, const void *y);
void kavx2_vec_dot_f16(int64_t n, float *s, const void *x, const void *y);
void kavx2_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y);
void kavx2_vec_dot_q8_0(int64_t n, float *s, const void *x, const void *y);
void kavx2_vec_dot_q4_0(int64_t n, float *s, const void *x, const void *y);
void kavx2_vec_dot_q4_K(int64_t n, float *s, const void *x, const void *y);
void kavx2_vec_dot_q6_K(int64_t n, float *s, const void *x, const void *y);

/* One weight row against up to KERN_ROWS_MAX activation rows:
 * s[r * ss] = dot(x, y + r * ys) for r < nr, each bit-identical to vec_dot.
 * matmul uses it for m > 1 so the weights are decoded once per group of rows. */
#define KERN_ROWS_MAX 4
typedef void (*kern_vec_dot_rows_fn)(int64_t n, float *s, size_t ss, const void *x, const void *y,
                                     size_t ys, int nr);
/* The active rows kernel of a weight type, or NULL (then matmul loops vec_dot). */
kern_vec_dot_rows_fn kern_rows_of(int dtype);

/* Prepared activations: a matmul-internal layout of the quantized activations
 * that a kernel reads faster than GGUF blocks (quantization and results are
 * identical to from_float + vec_dot). `rows` works on prepared rows. */
typedef struct kern_prep_ops {
    void (*prepare)(const float *x, void *dst, int64_t k);
    kern_vec_dot_rows_fn rows;
} kern_prep_ops;
/* The active prepared path of a weight type, or NULL. */
const kern_prep_ops *kern_prep_of(int dtype);

/* Bytes of one prepared Q8_0-family row ("q8p": int8 values, float scales,
 * 8 int32 offsets per block), rounded to 64 so rows stay cache-line aligned. */
static inline size_t kern_q8p_row_bytes(int64_t k) {
    return ((size_t)(k / QK8_0) * (QK8_0 + 4 + 32) + 63) & ~(size_t)63;
}

/* ---- AVX-512 F/BW/VL + VNNI (quant_avx512.c) ---- */
void kavx512_vec_dot_f32(int64_t n, float *s, const void *x, const void *y);
void kavx512_vec_dot_f16(int64_t n, float *s, const void *x, const void *y);
void kavx512_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y);
void kavx512_vec_dot_q8_0(int64_t n, float *s, const void *x, const void *y);
void kavx512_vec_dot_q4_0(int64_t n, float *s, const void *x, const void *y);
void kavx512_vec_dot_q4_K(int64_t n, float *s, const void *x, const void *y);
void kavx512_vec_dot_q6_K(int64_t n, float *s, const void *x, const void *y);
void kavx512_prepare_q8_0(const float *x, void *dst, int64_t k);
void kavx512_prepare_q4_0(const float *x, void *dst, int64_t k);
void kavx512_prows_q8_0(int64_t n, float *s, size_t ss, const void *x, const void *y, size_t ys,
                        int nr);
void kavx512_prows_q4_0(int64_t n, float *s, size_t ss, const void *x, const void *y, size_t ys,
                        int nr);
void kavx512_rows_q4_K(int64_t n, float *s, size_t ss, const void *x, const void *y, size_t ys,
                       int nr);
void kavx512_rows_q6_K(int64_t n, float *s, size_t ss, const void *x, const void *y, size_t ys,
                       int nr);

#endif
