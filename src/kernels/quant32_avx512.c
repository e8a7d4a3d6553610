/* kernels: AVX-512 (VL, BW, VNNI) dot products of Q4_1, Q5_0, Q5_1 and
 * IQ4_NL weights (quant32.h).
 *
 * Same contract as quant_avx512.c: bit-identical to quant32_ref.c. Two blocks
 * share a zmm (one per 256-bit half), their products summed exactly by
 * vpdpbusd on unsigned weight bytes: Q5_0 as v + 16 and IQ4_NL as v + 128,
 * the bias taken off again with a vpdpbusd of the bias against the
 * activations; four blocks are reduced together and the float steps then run
 * in the canonical order of quant32.h. */
#include "gemm_avx512.h" /* target attributes, f16_load */

T_512_INLINE int32_t hsum_i32_256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* The exact sums of 4 blocks from a = [b0: 8 lanes | b1: 8 lanes] and c = [b2 | b3]. */
T_512_INLINE __m128i red4_i32(__m512i a, __m512i c) {
    const __m512i lo = _mm512_permutex2var_epi32(
        a, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27), c);
    const __m512i hi = _mm512_permutex2var_epi32(
        a, _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31), c);
    __m512i s = _mm512_add_epi32(lo, hi); /* 128-bit lane L: block L's 4 partial sums */
    s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_BADC));
    s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_CDAB));
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
}

T_512_INLINE __m128 f16x4(kvl_f16 a, kvl_f16 b, kvl_f16 c, kvl_f16 d) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)a, (short)b, (short)c, (short)d, 0, 0, 0, 0));
}

/* The 32 nibbles of a block's 16 bytes in element order. */
T_512_INLINE __m256i nibbles32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* Value j's fifth bit (bit j of qh) as 0x10 in byte j. */
T_512_INLINE __m256i high_bits32(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(0x10));
}

T_512_INLINE __m256i yload(const int8_t *qs) { return _mm256_loadu_si256((const __m256i *)qs); }

T_512_INLINE __m512i pair(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Unsigned weight bytes of a block (biased where the values are signed). */
T_512_INLINE __m256i u_q5_0(const blk_q5_0 *x) { return _mm256_or_si256(nibbles32(x->qs), high_bits32(x->qh)); }
T_512_INLINE __m256i u_q5_1(const blk_q5_1 *x) { return _mm256_or_si256(nibbles32(x->qs), high_bits32(x->qh)); }
T_512_INLINE __m256i u_q4_1(const blk_q4_1 *x) { return nibbles32(x->qs); }
T_512_INLINE __m256i u_iq4_nl(const blk_iq4_nl *x) {
    /* the levels + 128, as unsigned bytes (1..241) */
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)kern_iq4nl_values), _mm_set1_epi8((char)0x80)));
    return _mm256_shuffle_epi8(table, nibbles32(x->qs));
}

/* Lane sums of (u - bias) * y for two blocks. */
T_512_INLINE __m512i pair_isum(__m512i u, __m512i y, int bias) {
    const __m512i uy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y);
    if (!bias) return uy;
    return _mm512_sub_epi32(uy, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)bias), y));
}
T_512_INLINE int32_t one_isum(__m256i u, __m256i y, int bias) {
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y);
    if (bias) s = _mm256_sub_epi32(s, _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)bias), y));
    return hsum_i32_256(s);
}

T_512_INLINE float q_fma4(float s, __m128 d, __m128i isum) {
    _Alignas(16) float dv[4], fv[4];
    _mm_store_ps(dv, d);
    _mm_store_ps(fv, _mm_cvtepi32_ps(isum));
    s = fmaf(dv[0], fv[0], s);
    s = fmaf(dv[1], fv[1], s);
    s = fmaf(dv[2], fv[2], s);
    return fmaf(dv[3], fv[3], s);
}

T_512_INLINE float q1_add4(float s, __m128 d, __m128i isum, __m128 ms) {
    _Alignas(16) float v[4];
    _mm_store_ps(v, _mm_fmadd_ps(d, _mm_cvtepi32_ps(isum), ms));
    s = s + v[0];
    s = s + v[1];
    s = s + v[2];
    return s + v[3];
}

/* Four blocks' exact sums from their unsigned bytes U(x + i) and activations. */
#define ISUM4(U, BIAS)                                                                             \
    red4_i32(pair_isum(pair(U(x + b), U(x + b + 1)), pair(yload(y[b].qs), yload(y[b + 1].qs)), BIAS), \
             pair_isum(pair(U(x + b + 2), U(x + b + 3)), pair(yload(y[b + 2].qs), yload(y[b + 3].qs)), BIAS))

#define Q_FAMILY_DOT(XT, U, BIAS)                                                                  \
    const XT *x = vx;                                                                              \
    const blk_q8_0 *y = vy;                                                                        \
    const int64_t nb = n / QK8_0;                                                                  \
    float sumf = 0;                                                                                \
    int64_t b = 0;                                                                                 \
    for (; b + 4 <= nb; b += 4) {                                                                  \
        const __m128 d = _mm_mul_ps(f16x4(x[b].d, x[b + 1].d, x[b + 2].d, x[b + 3].d),             \
                                    f16x4(y[b].d, y[b + 1].d, y[b + 2].d, y[b + 3].d));            \
        sumf = q_fma4(sumf, d, ISUM4(U, BIAS));                                                    \
    }                                                                                              \
    for (; b < nb; b++)                                                                            \
        sumf = fmaf(f16_load(x[b].d) * f16_load(y[b].d), (float)one_isum(U(x + b), yload(y[b].qs), BIAS), sumf); \
    *s = sumf

#define Q1_FAMILY_DOT(XT, U)                                                                       \
    const XT *x = vx;                                                                              \
    const blk_q8_1 *y = vy;                                                                        \
    const int64_t nb = n / QK8_1;                                                                  \
    float sumf = 0;                                                                                \
    int64_t b = 0;                                                                                 \
    for (; b + 4 <= nb; b += 4) {                                                                  \
        const __m128 d = _mm_mul_ps(f16x4(x[b].d, x[b + 1].d, x[b + 2].d, x[b + 3].d),             \
                                    f16x4(y[b].d, y[b + 1].d, y[b + 2].d, y[b + 3].d));            \
        const __m128 ms = _mm_mul_ps(f16x4(x[b].m, x[b + 1].m, x[b + 2].m, x[b + 3].m),            \
                                     f16x4(y[b].s, y[b + 1].s, y[b + 2].s, y[b + 3].s));           \
        sumf = q1_add4(sumf, d, ISUM4(U, 0), ms);                                                  \
    }                                                                                              \
    for (; b < nb; b++) {                                                                          \
        const float vb = fmaf(f16_load(x[b].d) * f16_load(y[b].d), (float)one_isum(U(x + b), yload(y[b].qs), 0), \
                              f16_load(x[b].m) * f16_load(y[b].s));                                \
        sumf = sumf + vb;                                                                          \
    }                                                                                              \
    *s = sumf

T_512 void kavx512_vec_dot_q5_0(int64_t n, float *s, const void *vx, const void *vy) {
    Q_FAMILY_DOT(blk_q5_0, u_q5_0, 16);
}
T_512 void kavx512_vec_dot_iq4_nl(int64_t n, float *s, const void *vx, const void *vy) {
    Q_FAMILY_DOT(blk_iq4_nl, u_iq4_nl, 128);
}
T_512 void kavx512_vec_dot_q4_1(int64_t n, float *s, const void *vx, const void *vy) {
    Q1_FAMILY_DOT(blk_q4_1, u_q4_1);
}
T_512 void kavx512_vec_dot_q5_1(int64_t n, float *s, const void *vx, const void *vy) {
    Q1_FAMILY_DOT(blk_q5_1, u_q5_1);
}
