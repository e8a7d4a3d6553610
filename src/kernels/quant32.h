/* kernels, private: the 32-element block types beside Q8_0 / Q4_0 (ggml's
 * Q4_1, Q5_0, Q5_1, IQ4_NL, and the Q8_1 activations of Q4_1 / Q5_1), their
 * layouts and the implementations behind their kern_traits entries
 * (quant32_ref.c, quant32_avx2.c, quant32_avx512.c).
 *
 * Canonical orders (kern_impl.h gives the rule: every ISA performs the same
 * float operations in the same order):
 *  - Q5_0, IQ4_NL against Q8_0: the Q family of kern_impl.h. Block b adds the
 *    exact int32 sum of its 32 products: s = fma(d_x * d_y, isum_b, s), blocks
 *    in order (Q5_0 values -16..15, IQ4_NL values kvalues_iq4nl[q]; |isum| <
 *    2^24, so it is exact in float too).
 *  - Q4_1, Q5_1 against Q8_1 (values q >= 0, x = d q + m; y.s = fp16(d_y sum
 *    q_y)): block b contributes v_b = fma(d_x * d_y, isum_b, m_x * s_y), and
 *    s = s + v_b, blocks in order. The v_b of several blocks are independent,
 *    so SIMD code computes them lane-wise and adds them in order.
 *
 * Q8_1 is quantized as llama.cpp's CPU backend does on x86 (the AVX2
 * quantize_row_q8_1): d = amax / 127, q = rint(x * (127 / amax)) (half to
 * even), s = fp16(d * sum q). */
#ifndef KVLLM_QUANT32_H
#define KVLLM_QUANT32_H

#include "kern_impl.h" /* which includes this file at its end */

#define QK4_1  32
#define QK5_0  32
#define QK5_1  32
#define QK8_1  32
#define QK4_NL 32

typedef struct {
    kvl_f16 d, m;
    uint8_t qs[QK4_1 / 2];
} blk_q4_1;
typedef struct {
    kvl_f16 d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} blk_q5_0;
typedef struct {
    kvl_f16 d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} blk_q5_1;
typedef struct {
    kvl_f16 d, s;
    int8_t qs[QK8_1];
} blk_q8_1;
typedef struct {
    kvl_f16 d;
    uint8_t qs[QK4_NL / 2];
} blk_iq4_nl;

/* MXFP4 (quant_mxfp4.c): an E8M0 scale and 32 E2M1 codes. */
#define QK_MXFP4 32
typedef struct {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
} blk_mxfp4;
/* ggml's kvalues_mxfp4: the E2M1 values doubled (integers). */
extern const int8_t kern_mxfp4_values[16];
/* Half the E8M0 scale 2^(e - 127), as ggml's GGML_E8M0_TO_FP32_HALF (exact;
 * e < 2 gives the subnormals 2^-128 and 2^-127). */
static inline float kern_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
kern_to_float_sig kref_to_float_mxfp4;
kern_from_float_sig kref_from_float_mxfp4;
kern_vec_dot_sig kref_vec_dot_mxfp4, kavx2_vec_dot_mxfp4, kavx512_vec_dot_mxfp4;
/* packed GEMM and repacked weights (repack_mxfp4_avx512.c), on Q8_0 tiles */
extern const kern_gemm_ops kavx512_gemm_mxfp4;
extern const kern_repack_ops kavx512_repack_mxfp4;

/* ggml's kvalues_iq4nl: the 16 non-linear levels of IQ4_NL. */
extern const int8_t kern_iq4nl_values[16];

/* ---- scalar reference (quant32_ref.c) ---- */
kern_to_float_sig kref_to_float_q4_1, kref_to_float_q5_0, kref_to_float_q5_1, kref_to_float_q8_1,
    kref_to_float_iq4_nl;

kern_from_float_sig kref_from_float_q4_1, kref_from_float_q5_0, kref_from_float_q5_1,
    kref_from_float_q8_1, kref_from_float_iq4_nl, kref_act_from_float_iq4_nl;

kern_vec_dot_sig kref_vec_dot_q4_1, kref_vec_dot_q5_0, kref_vec_dot_q5_1, kref_vec_dot_iq4_nl;

/* ---- AVX2 + FMA + F16C (quant32_avx2.c) ---- */
kern_from_float_sig kavx2_from_float_q8_1;
kern_vec_dot_sig kavx2_vec_dot_q4_1, kavx2_vec_dot_q5_0, kavx2_vec_dot_q5_1, kavx2_vec_dot_iq4_nl;

/* ---- AVX-512 VNNI (quant32_avx512.c) ---- */
kern_vec_dot_sig kavx512_vec_dot_q4_1, kavx512_vec_dot_q5_0, kavx512_vec_dot_q5_1,
    kavx512_vec_dot_iq4_nl;
/* packed GEMM (gemm32_avx512.c): Q5_0 and IQ4_NL through Q8_0's panels,
 * tiles and kernel; Q4_1 and Q5_1 with Q8_1 tiles */
extern const kern_gemm_ops kavx512_gemm_q5_0, kavx512_gemm_iq4_nl, kavx512_gemm_q4_1,
    kavx512_gemm_q5_1;
/* repacked weights (repack32_avx512.c), on the tiles of the GEMMs above */
extern const kern_repack_ops kavx512_repack_q5_0, kavx512_repack_iq4_nl, kavx512_repack_q4_1,
    kavx512_repack_q5_1;

/* The scalar reference of the 32-value block types (Q8_0, Q4_0 in
 * quant_ref.c; Q4_1, Q5_0, Q5_1, IQ4_NL in quant32_ref.c; MXFP4), one
 * dequantization and one dot for all, as the K family's (kern_impl.h): each
 * type only unpacks a block into its 32 values as integers in element
 * order, its scale d and, for the types with a min (Q4_1, Q5_1, against
 * Q8_1), m. Always inlined with the unpack and with_min constant. */
typedef struct kern_q32_block {
    int8_t v[32]; /* every type's values fit: -128..127 */
    float d, m;
} kern_q32_block;
typedef void (*kern_q32_unpack_fn)(const void *x, kern_q32_block *u);

/* y_e = v_e * d (+ m): ggml's float steps. */
KERN_K_INLINE void kern_q32_to_float(const void *vx, float *dst, int64_t n, size_t x_bytes,
                                     kern_q32_unpack_fn unpack, bool with_min) {
    for (int64_t b = 0; b < n / 32; b++) {
        kern_q32_block u;
        unpack((const char *)vx + b * x_bytes, &u);
        float *y = dst + b * 32;
        for (int j = 0; j < 32; j++)
            y[j] = with_min ? (float)u.v[j] * u.d + u.m : (float)u.v[j] * u.d;
    }
}

/* Against Q8_0 (with_min false: s = fma(d * yd, isum, s)) or Q8_1 (with_min:
 * s = s + fma(d * yd, isum, m * ys)), blocks in order, isum exact. */
KERN_K_INLINE void kern_q32_vec_dot(int64_t n, float *s, const void *vx, size_t x_bytes,
                                    kern_q32_unpack_fn unpack, bool with_min, const void *vy) {
    float sumf = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        kern_q32_block u;
        unpack((const char *)vx + b * x_bytes, &u);
        const int8_t *yq = with_min ? ((const blk_q8_1 *)vy)[b].qs : ((const blk_q8_0 *)vy)[b].qs;
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += u.v[j] * yq[j];
        if (with_min) {
            const blk_q8_1 *y = (const blk_q8_1 *)vy + b;
            sumf = sumf + fmaf(u.d * kvl_f16_to_f32(y->d), (float)isum, u.m * kvl_f16_to_f32(y->s));
        } else {
            const blk_q8_0 *y = (const blk_q8_0 *)vy + b;
            sumf = fmaf(u.d * kvl_f16_to_f32(y->d), (float)isum, sumf);
        }
    }
    *s = sumf;
}

/* kref_to_float_<t> of a 32-value type t from its unpack_<t>, and
 * kref_vec_dot_<t> (Q4_1, Q5_0, Q5_1, IQ4_NL: Q8_0, Q4_0 and MXFP4 keep
 * their own loops, which take their values in place: through the unpack
 * they cost 2-10% more instructions, callgrind). */
#define KREF_Q32_TO_FLOAT(t, with_min)                                                             \
    void kref_to_float_##t(const void *src, float *dst, int64_t n) {                               \
        kern_q32_to_float(src, dst, n, sizeof(blk_##t), unpack_##t, with_min);                     \
    }
#define KREF_Q32_KERNELS(t, with_min)                                                              \
    KREF_Q32_TO_FLOAT(t, with_min)                                                                 \
    void kref_vec_dot_##t(int64_t n, float *s, const void *vx, const void *vy) {                   \
        kern_q32_vec_dot(n, s, vx, sizeof(blk_##t), unpack_##t, with_min, vy);                     \
    }

#endif
