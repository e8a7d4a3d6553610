/* kernels: AVX2 dot products for Q2_K, Q3_K, Q5_K and IQ4_XS against Q8_K.
 *
 * Each super-block's integer totals are exact (the int16 pair sums of
 * maddubs cannot saturate for these value ranges), so the float steps, one or
 * two fmaf per super-block, are those of quant_kx_ref.c: bit-identical. */
#include "simd.h" /* target attributes, horizontal sums */

/* sc16 holds 16 int16 group scales (groups of 16 values). For the 32 values
 * 128h + 32j .. +31 (groups 8h + 2j and 8h + 2j + 1), a vector with the first
 * group's scale in the low 128-bit lane and the second's in the high one. */
T_AVX2_INLINE __m256i scale_pair16(__m256i sc16, int h, int j) {
    const __m256i sh =
        h ? _mm256_permute4x64_epi64(sc16, 0xEE) : _mm256_permute4x64_epi64(sc16, 0x44);
    const char lo = (char)(4 * j), hi = (char)(4 * j + 2);
    /* clang-format off */
    const __m256i sel = _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                         lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                         hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                                         hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1);
    /* clang-format on */
    return _mm256_shuffle_epi8(sh, sel);
}

/* acc + the 8 runs of 32 values (128h + 32j ..) of a super-block of 2-bit
 * codes, bits 2j..2j+1 of qs[32h + l] (Q2_K; Q3_K with bit 4h + j of
 * hmask[l] as bit 2, q3: the value + 4), times their group scales. */
T_AVX2_INLINE __m256i k23_dots(__m256i acc, bool q3, const uint8_t *qs, const uint8_t *hmask,
                               __m256i sc16, const int8_t *yq) {
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)hmask) : _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        for (int j = 0; j < 4; j++) {
            __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
            if (q3)
                u = _mm256_or_si256(
                    u,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2));
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(yq + 128 * h + 32 * j));
            acc = _mm256_add_epi32(
                acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, yv), scale_pair16(sc16, h, j)));
        }
    }
    return acc;
}

/* ======================= Q2_K ======================= */

T_AVX2_INLINE float q2k_step(float sumf, const blk_q2_K *x, const blk_q8_K *y) {
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, _mm_set1_epi8(0xF)));
    const __m256i mn16 =
        _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0xF)));
    const int32_t summ =
        kern_hsum8_i32(_mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)y->bsums)));
    const __m256i acc = k23_dots(_mm256_setzero_si256(), false, x->qs, NULL, sc16, y->qs);
    return kern_k_fma_min(sumf, x->d, x->dmin, y->d, kern_hsum8_i32(acc), summ);
}
T_AVX2 void kavx2_vec_dot_q2_K(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_K_DOT(blk_q2_K, q2k_step);
}

/* ======================= Q3_K ======================= */

/* The 16 scales of a Q3_K block minus 32, as int16. */
T_AVX2_INLINE __m256i q3k_scales16(const uint8_t *s) {
    int16_t v[16];
    for (int g = 0; g < 16; g++) v[g] = (int16_t)(kern_q3k_scale(g, s) - 32);
    return _mm256_loadu_si256((const __m256i *)v);
}

/* sum_g sc_g * sum_16 (q3 + 4) * q8, minus 4 * sum_g sc_g * bsum_g. */
T_AVX2_INLINE float q3k_step(float sumf, const blk_q3_K *x, const blk_q8_K *y) {
    const __m256i sc16 = q3k_scales16(x->scales);
    const __m256i bias = _mm256_sub_epi32(
        _mm256_setzero_si256(),
        _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y->bsums)),
                          2));
    const __m256i acc = k23_dots(bias, true, x->qs, x->hmask, sc16, y->qs);
    sumf = fmaf(_cvtsh_ss(x->d) * y->d, (float)kern_hsum8_i32(acc), sumf);
    return sumf;
}
T_AVX2 void kavx2_vec_dot_q3_K(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_K_DOT(blk_q3_K, q3k_step);
}

/* ======================= Q5_K ======================= */
/* Q4_K's step with the fifth bits (simd.h). */
T_AVX2_INLINE float q5k_step(float sumf, const blk_q5_K *x, const blk_q8_K *y) {
    return kern_q45k_step(sumf, x->scales, x->qs, x->qh, &x->d, &x->dmin, y);
}
T_AVX2 void kavx2_vec_dot_q5_K(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_K_DOT(blk_q5_K, q5k_step);
}

/* ======================= IQ4_XS ======================= */

/* value * q8 summed in pairs: |value|, |q8| <= 127, so no int16 saturation. */
T_AVX2_INLINE __m256i mul_pairs_i8(__m256i v, __m256i q8) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q8, v));
}

T_AVX2_INLINE float iq4xs_step(float sumf, const blk_iq4_xs *x, const blk_q8_K *y) {
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kern_iq4nl_values));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint16_t h = x->scales_h;
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) { /* groups 2p, 2p+1 */
        const int ls0 = ((x->scales_l[p] & 0xF) | (((h >> (4 * p)) & 3) << 4)) - 32;
        const int ls1 = ((x->scales_l[p] >> 4) | (((h >> (4 * p + 2)) & 3) << 4)) - 32;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * p));
        const __m256i lo = _mm256_and_si256(q, m4),
                      hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        const __m256i v0 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20));
        const __m256i v1 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31));
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * p));
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * p + 32));
        const __m256i p0 = _mm256_madd_epi16(mul_pairs_i8(v0, y0), _mm256_set1_epi16((short)ls0));
        const __m256i p1 = _mm256_madd_epi16(mul_pairs_i8(v1, y1), _mm256_set1_epi16((short)ls1));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
    }
    sumf = fmaf(_cvtsh_ss(x->d) * y->d, (float)kern_hsum8_i32(acc), sumf);
    return sumf;
}
T_AVX2 void kavx2_vec_dot_iq4_xs(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_K_DOT(blk_iq4_xs, iq4xs_step);
}
