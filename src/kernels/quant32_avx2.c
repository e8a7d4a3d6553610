/* kernels: AVX2 + FMA + F16C dot products of Q4_1, Q5_0, Q5_1 and IQ4_NL
 * weights, and the Q8_1 activation quantizer (quant32.h).
 *
 * Same contract as quant_avx2.c: per-function target attributes, installed by
 * kern_init after CPUID, bit-identical to quant32_ref.c. A block's 32 products
 * are summed exactly in int32 lanes; four blocks are reduced together and
 * their float steps then run in the canonical order of quant32.h. */
#include "simd.h" /* target attributes, f16_load, the canonical float steps */

/* Bit j of the 32-bit qh as 0x10 in byte j (the fifth bit of value j). */
T_AVX2_INLINE __m256i high_bits32(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    /* byte j gets byte j / 8 of h, then bit j % 8 is tested */
    const __m256i sel =
        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit),
                            _mm256_set1_epi8(0x10));
}

T_AVX2_INLINE __m256i yload(const int8_t *qs) { return _mm256_loadu_si256((const __m256i *)qs); }

/* ---- per-block lane sums ---- */

T_AVX2_INLINE __m256i q5_0_lanes(const blk_q5_0 *x, const blk_q8_0 *y) {
    const __m256i u = _mm256_or_si256(kern_nibbles32(x->qs), high_bits32(x->qh)); /* v + 16 */
    const __m256i yv = yload(y->qs);
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, yv),
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(16), yv));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

T_AVX2_INLINE __m256i iq4_nl_lanes(const blk_iq4_nl *x, const blk_q8_0 *y) {
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kern_iq4nl_values));
    const __m256i v = _mm256_shuffle_epi8(table, kern_nibbles32(x->qs)); /* signed, |v| <= 127 */
    return kern_dot_u8s8(_mm256_sign_epi8(v, v), _mm256_sign_epi8(yload(y->qs), v));
}

T_AVX2_INLINE __m256i q4_1_lanes(const blk_q4_1 *x, const blk_q8_1 *y) {
    return kern_dot_u8s8(kern_nibbles32(x->qs), yload(y->qs));
}

T_AVX2_INLINE __m256i q5_1_lanes(const blk_q5_1 *x, const blk_q8_1 *y) {
    return kern_dot_u8s8(_mm256_or_si256(kern_nibbles32(x->qs), high_bits32(x->qh)), yload(y->qs));
}

/* ---- the canonical float steps ---- */

/* KERN_Q_DOT with LANES(x, y), block x's lane sums, and STEP KERN_Q_STEP
 * (against Q8_0) or KERN_Q1_STEP (against Q8_1). */
#define FAMILY_DOT(XT, YT, LANES, STEP)                                                            \
    KERN_Q_DOT(XT, YT, KAVX2_Q_STEP4, KAVX2_Q_STEP1, LANES, KERN_F16_D4, KERN_F16_D1, STEP)

T_AVX2 void kavx2_vec_dot_q5_0(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_q5_0, blk_q8_0, q5_0_lanes, KERN_Q_STEP);
}
T_AVX2 void kavx2_vec_dot_iq4_nl(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_iq4_nl, blk_q8_0, iq4_nl_lanes, KERN_Q_STEP);
}
T_AVX2 void kavx2_vec_dot_q4_1(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_q4_1, blk_q8_1, q4_1_lanes, KERN_Q1_STEP);
}
T_AVX2 void kavx2_vec_dot_q5_1(int64_t n, float *s, const void *vx, const void *vy) {
    FAMILY_DOT(blk_q5_1, blk_q8_1, q5_1_lanes, KERN_Q1_STEP);
}

/* ======================= Q8_1 activations ======================= */

/* Same bytes as kref_from_float_q8_1: q = rint(x * (127 / amax)), s = fp16(d * sum). */
T_AVX2 void kavx2_from_float_q8_1(const float *src, void *dst, int64_t n) {
    blk_q8_1 *y = dst;
    for (int64_t b = 0; b < n / QK8_1; b++) {
        __m256 v[4];
        const float am = kern_load32_amax(src + b * QK8_1, v);
        const float d = am / 127.f;
        const float id = am != 0.0f ? 127.f / am : 0.0f;
        y[b].d = kvl_f32_to_f16(d);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] =
                _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id)),
                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const int32_t sum = kern_hsum8_i32(
            _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        y[b].s = kvl_f32_to_f16(d * (float)sum);
        _mm256_storeu_si256((__m256i *)y[b].qs, kern_pack32_i8(q[0], q[1], q[2], q[3]));
    }
}
