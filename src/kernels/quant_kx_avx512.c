/* kernels: AVX-512 (F, BW, VL, VNNI) dot products for Q2_K, Q3_K, Q5_K and
 * IQ4_XS against Q8_K, one weight row against 1..KERN_ROWS_MAX activation rows.
 *
 * A super-block is decoded once into four 64-value chunks of unsigned bytes
 * and matching int16 scale vectors; each activation row then costs a maddubs
 * and a dpwssd per chunk. Integer totals are exact (no int16 saturation for
 * these value ranges), and the float steps are those of quant_kx_ref.c, so
 * every row is bit-identical to the reference vec_dot. */
#include "quant_kx_avx512.h"

#include <string.h>

/* 32 bytes at p in both halves, shifted right (64-bit lanes) by a in the low
 * half and b in the high one. */
T_512_INLINE __m512i bcast_shift(const uint8_t *p, int a, int b) {
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_srlv_epi64(v, _mm512_setr_epi64(a, a, a, a, b, b, b, b));
}

/* A super-block of the types with mins (Q2_K, Q5_K) against activation row
 * yr: s = fma(d*yd, sumi, s), then fma(-(dmin*yd), summ, s). */
T_512_INLINE float kx_min_step(const kx_dec *dec, float xd, float xdmin, const blk_q8_K *yr,
                               float s) {
    const __m256i mins =
        _mm256_madd_epi16(dec->s16, _mm256_loadu_si256((const __m256i *)yr->bsums));
    int32_t sumi, summ;
    kern_hsum2_i32(fold512(kx_chunks(dec, yr->qs, false)), mins, &sumi, &summ);
    const float dall = xd * yr->d, dmin = xdmin * yr->d;
    s = fmaf(dall, (float)sumi, s);
    return fmaf(-dmin, (float)summ, s);
}

/* ======================= Q2_K ======================= */

T_512_INLINE void q2k_decode(const blk_q2_K *x, kx_dec *d) {
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4)));
    d->s16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const int j0 = 2 * (c % 2);
        d->u[c] = _mm512_and_si512(bcast_shift(x->qs + 32 * (c / 2), 2 * j0, 2 * j0 + 2),
                                   _mm512_set1_epi8(3));
        d->sc[c] = _mm512_permutexvar_epi16(idx_g16(c), sc);
    }
}

KAVX512_K_ROWS(q2_K, blk_q2_K, kx_dec, q2k_decode, KAVX512_DMIN, kx_min_step)

/* ======================= Q3_K ======================= */

/* The 16 6-bit scales of a Q3_K block (0..63) in order, 4 bytes at a time. */
T_512_INLINE __m128i q3k_scales(const uint8_t *s) {
    uint32_t a0, a1, t;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&t, s + 8, 4);
    const uint32_t lo = 0x0f0f0f0f, hi = 0x03030303;
    return _mm_setr_epi32((int)((a0 & lo) | ((t & hi) << 4)),
                          (int)((a1 & lo) | (((t >> 2) & hi) << 4)),
                          (int)(((a0 >> 4) & lo) | (((t >> 4) & hi) << 4)),
                          (int)(((a1 >> 4) & lo) | (((t >> 6) & hi) << 4)));
}

/* Values stored + 4 (0..7); the -4 comes back through bsums. */
T_512_INLINE void q3k_decode(const blk_q3_K *x, kx_dec *d) {
    d->s16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3k_scales(x->scales)), _mm256_set1_epi16(32));
    const __m512i sc = _mm512_castsi256_si512(d->s16);
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const int h = c / 2, j0 = 2 * (c % 2);
        const __m512i low =
            _mm512_and_si512(bcast_shift(x->qs + 32 * h, 2 * j0, 2 * j0 + 2), _mm512_set1_epi8(3));
        const __m512i hb = _mm512_and_si512(bcast_shift(x->hmask, 4 * h + j0, 4 * h + j0 + 1),
                                            _mm512_set1_epi8(1));
        d->u[c] = _mm512_or_si512(low, _mm512_slli_epi16(hb, 2));
        d->sc[c] = _mm512_permutexvar_epi16(idx_g16(c), sc);
    }
}

T_512_INLINE float q3k_step(const kx_dec *dec, float xd, float xdmin, const blk_q8_K *yr, float s) {
    (void)xdmin;
    const __m256i off = _mm256_madd_epi16(dec->s16, _mm256_loadu_si256((const __m256i *)yr->bsums));
    const __m256i acc =
        _mm256_sub_epi32(fold512(kx_chunks(dec, yr->qs, false)), _mm256_slli_epi32(off, 2));
    return fmaf(xd * yr->d, (float)kern_hsum8_i32(acc), s);
}
KAVX512_K_ROWS(q3_K, blk_q3_K, kx_dec, q3k_decode, KAVX512_NO_DMIN, q3k_step)

/* ======================= Q5_K ======================= */

T_512_INLINE void q5k_decode(const blk_q5_K *x, kx_dec *d) {
    const __m256i sm16 = _mm256_cvtepu8_epi16(kern_q4k_scales_mins(x->scales)); /* sc0..7, m0..7 */
    /* the mins paired with bsums 2j, 2j+1 */
    d->s16 = _mm256_permutexvar_epi16(
        _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), sm16);
    const __m512i sc = _mm512_castsi256_si512(sm16);
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i lo =
            _mm512_and_si512(bcast_shift(x->qs + 32 * c, 0, 4), _mm512_set1_epi8(0xF));
        const __m512i hb =
            _mm512_and_si512(bcast_shift(x->qh, 2 * c, 2 * c + 1), _mm512_set1_epi8(1));
        d->u[c] = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
        d->sc[c] = _mm512_permutexvar_epi16(idx_g32(c), sc);
    }
}

KAVX512_K_ROWS(q5_K, blk_q5_K, kx_dec, q5k_decode, KAVX512_DMIN, kx_min_step)

/* ======================= IQ4_XS ======================= */

/* Chunk c holds groups 2c, 2c+1: 128-bit lanes = low nibbles of qs[32c..+15],
 * their high nibbles, then the same for qs[32c+16..+31]. Values are looked up
 * in the table, kept as magnitudes (|value| <= 127) and sign masks. */
T_512_INLINE void iq4xs_decode(const blk_iq4_xs *x, kx_dec *d) {
    const __m512i table =
        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kern_iq4nl_values));
    int16_t ls[16] = {0};
    for (int g = 0; g < 8; g++)
        ls[g] = (int16_t)((((x->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) |
                           (((x->scales_h >> (2 * g)) & 3) << 4)) -
                          32);
    const __m512i sc = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)ls));
    const __m512i spread = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
    const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i q = _mm512_permutexvar_epi64(
            spread, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * c))));
        const __m512i idx = _mm512_and_si512(_mm512_srlv_epi64(q, shift), _mm512_set1_epi8(0xF));
        const __m512i v = _mm512_shuffle_epi8(table, idx);
        d->u[c] = _mm512_abs_epi8(v);
        d->neg[c] = _mm512_movepi8_mask(v);
        d->sc[c] = _mm512_permutexvar_epi16(idx_g32(c), sc);
    }
}

T_512_INLINE float iq4xs_step(const kx_dec *dec, float xd, float xdmin, const blk_q8_K *yr,
                              float s) {
    (void)xdmin;
    const int32_t sumi = kern_hsum8_i32(fold512(kx_chunks(dec, yr->qs, true)));
    return fmaf(xd * yr->d, (float)sumi, s);
}
KAVX512_K_ROWS(iq4_xs, blk_iq4_xs, kx_dec, iq4xs_decode, KAVX512_NO_DMIN, iq4xs_step)
