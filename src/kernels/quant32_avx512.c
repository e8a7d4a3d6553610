/* kernels: AVX-512 (VL, BW, VNNI) dot products of Q4_1, Q5_0, Q5_1 and
 * IQ4_NL weights (quant32.h).
 *
 * Same contract as quant_avx512.c: bit-identical to quant32_ref.c. Two blocks
 * share a zmm (one per 256-bit half), their products summed exactly by
 * vpdpbusd on unsigned weight bytes: Q5_0 as v + 16 and IQ4_NL as v + 128,
 * the bias taken off again with a vpdpbusd of the bias against the
 * activations; four blocks are reduced together and the float steps then run
 * in the canonical order of quant32.h. FAMILY_DOT is the per-ISA twin of
 * quant32_avx2.c's (vpdpbusd pairs instead of maddubs lanes). */
#include "gemm_avx512.h" /* target attributes, f16_load */

T_512_INLINE __m256i yload(const int8_t *qs) { return _mm256_loadu_si256((const __m256i *)qs); }

T_512_INLINE __m512i pair(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Unsigned weight bytes of a block (biased where the values are signed). */
T_512_INLINE __m256i u_q5_0(const blk_q5_0 *x) {
    return _mm256_or_si256(kern_nibbles32(x->qs), kern_q5_high_bits(x->qh));
}
T_512_INLINE __m256i u_q5_1(const blk_q5_1 *x) {
    return _mm256_or_si256(kern_nibbles32(x->qs), kern_q5_high_bits(x->qh));
}
T_512_INLINE __m256i u_q4_1(const blk_q4_1 *x) { return kern_nibbles32(x->qs); }
T_512_INLINE __m256i u_iq4_nl(const blk_iq4_nl *x) { return kern_iq4nl_u8(x->qs); }

/* Lane sums of (u - bias) * y for two blocks. */
T_512_INLINE __m512i pair_isum(__m512i u, __m512i y, int bias) {
    const __m512i uy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y);
    if (!bias) return uy;
    return _mm512_sub_epi32(
        uy, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)bias), y));
}
T_512_INLINE int32_t one_isum(__m256i u, __m256i y, int bias) {
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y);
    if (bias)
        s = _mm256_sub_epi32(
            s, _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)bias), y));
    return kern_hsum8_i32(s);
}

/* KERN_Q_DOT's steps: U(x) gives block x's unsigned bytes (BIAS above its
 * values), STEP is KERN_Q_STEP or KERN_Q1_STEP (simd.h). */
#define FAMILY_STEP4(acc, x, y, U, BIAS, STEP)                                                     \
    ({                                                                                             \
        const __m128 d_ = KERN_F16_D4(x, y);                                                       \
        STEP##4(acc, d_,                                                                           \
                kern_red4_i32(pair_isum(pair(U(x), U((x) + 1)),                                    \
                                        pair(yload((y)[0].qs), yload((y)[1].qs)), BIAS),           \
                              pair_isum(pair(U((x) + 2), U((x) + 3)),                              \
                                        pair(yload((y)[2].qs), yload((y)[3].qs)), BIAS)),          \
                x, y);                                                                             \
    })
#define FAMILY_STEP1(acc, x, y, U, BIAS, STEP)                                                     \
    STEP##1(acc, KERN_F16_D1(x, y), (float)one_isum(U(x), yload((y)->qs), BIAS), x, y)
#define FAMILY_DOT(XT, YT, U, BIAS, STEP)                                                          \
    KERN_Q_DOT(XT, YT, FAMILY_STEP4, FAMILY_STEP1, U, BIAS, STEP)

T_512 void kavx512_vec_dot_q5_0(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_q5_0, blk_q8_0, u_q5_0, 16, KERN_Q_STEP);
}
T_512 void kavx512_vec_dot_iq4_nl(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_iq4_nl, blk_q8_0, u_iq4_nl, 128, KERN_Q_STEP);
}
T_512 void kavx512_vec_dot_q4_1(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_q4_1, blk_q8_1, u_q4_1, 0, KERN_Q1_STEP);
}
T_512 void kavx512_vec_dot_q5_1(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_q5_1, blk_q8_1, u_q5_1, 0, KERN_Q1_STEP);
}
