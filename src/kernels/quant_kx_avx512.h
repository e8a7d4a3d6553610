/* kernels, private to the AVX-512 K-family files (quant_kx_avx512.c,
 * quant_iq_avx512.c): a super-block decoded into 64-value chunks of unsigned
 * bytes (magnitudes, with sign masks where values are signed) and int16
 * group scales, and its exact integer dot with a Q8_K row. */
#ifndef KVLLM_QUANT_KX_AVX512_H
#define KVLLM_QUANT_KX_AVX512_H

#include "gemm_avx512.h" /* target attributes, UNROLL, f16_load */

T_512_INLINE __m256i fold512(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* int16 index vectors into a vector of 16 group scales: groups of 16 values
 * (128-bit lane i of chunk c -> scale 4c + i), groups of 32 (the low 256 bits
 * of chunk c -> scale 2c, the high ones -> 2c + 1). */
T_512_INLINE __m512i idx_g16(int c) {
    const long long q = 0x0001000100010001LL;
    return _mm512_add_epi16(_mm512_setr_epi64(0, 0, q, q, 2 * q, 2 * q, 3 * q, 3 * q),
                            _mm512_set1_epi16((short)(4 * c)));
}
T_512_INLINE __m512i idx_g32(int c) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)),
                              _mm256_set1_epi16((short)(2 * c + 1)), 1);
}

/* A decoded super-block: chunk c (values 64c .. 64c+63) as unsigned bytes (for
 * IQ4_XS and the lattice types their magnitudes, the negative ones in neg[c]), the int16 scale
 * of each pair, and 16 int16 factors for the bsums term. */
typedef struct {
    __m512i u[4], sc[4];
    __mmask64 neg[4];
    __m256i s16;
} kx_dec;

/* sum over chunks of sc * (u * q8) pairs, 16 int32 lanes; with neg, q8 is
 * negated where the value is negative. */
T_512_INLINE __m512i kx_chunks(const kx_dec *d, const int8_t *yq, bool neg) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0; /* two chains so latencies overlap */
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        __m512i yv = _mm512_loadu_si512(yq + 64 * c);
        if (neg) yv = _mm512_mask_sub_epi8(yv, d->neg[c], _mm512_setzero_si512(), yv);
        const __m512i p = _mm512_maddubs_epi16(d->u[c], yv);
        if (c % 2) a1 = _mm512_dpwssd_epi32(a1, p, d->sc[c]);
        else a0 = _mm512_dpwssd_epi32(a0, p, d->sc[c]);
    }
    return _mm512_add_epi32(a0, a1);
}

#endif
