/* kernels: AVX2 dot products of the lattice types (IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against Q8_K.
 *
 * 32 values at a time: their codebook magnitudes (unsigned bytes) times the
 * Q8_K values negated where the weight is negative, summed in pairs
 * (maddubs; no int16 saturation for magnitudes <= 62) and then times the
 * group scales (madd), which leaves llama.cpp's 8 lanes (lane i: values
 * 4i..4i+3 of every 32). The integer sums are exact and the float steps are
 * quant_iq_ref.c's: bit-identical to it. */
#include "simd.h"

#include <string.h>

/* Byte i of the result: 0xFF where bit i of m is set, else 0. */
T_AVX2_INLINE __m256i bits_to_bytes(uint32_t m) {
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                         2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), sel);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* sum over 32 values of sc * (u * y) with y negated where bit i of signs is
 * set; u unsigned magnitudes; sc the int16 scale of each pair. */
T_AVX2_INLINE __m256i dot32(__m256i u, uint32_t signs, const int8_t *yq, __m256i sc) {
    const __m256i m = bits_to_bytes(signs);
    const __m256i y = _mm256_loadu_si256((const __m256i *)yq);
    const __m256i ys = _mm256_sub_epi8(_mm256_xor_si256(y, m), m);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, ys), sc);
}

/* 4 entries of an 8-byte codebook (runs of 8 values, in order). */
T_AVX2_INLINE __m256i grid4(const uint64_t *g, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    return _mm256_setr_epi64x((long long)g[i0], (long long)g[i1], (long long)g[i2],
                              (long long)g[i3]);
}
/* 8 entries of a 4-byte codebook: indices i8[0..7], with bit j of hi as the
 * ninth bit of index j. */
T_AVX2_INLINE __m256i grid8(const uint32_t *g, const uint8_t *i8, unsigned hi) {
    const __m256i bit9 = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32((int)hi), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
        _mm256_set1_epi32(1));
    const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)i8)),
                                        _mm256_slli_epi32(bit9, 8));
    return _mm256_i32gather_epi32((const int *)g, idx, 4);
}

/* Scales: one per 32 values, or the first and second 16 apart. */
T_AVX2_INLINE __m256i sc32(int s) { return _mm256_set1_epi16((short)s); }
T_AVX2_INLINE __m256i sc16(int s0, int s1) {
    return _mm256_setr_m128i(_mm_set1_epi16((short)s0), _mm_set1_epi16((short)s1));
}

/* The 4 runs' signs of a 32-value group from their 7-bit fields in b (IQ3_XXS:
 * as bits for dot32, which measured faster there than dot32s). */
T_AVX2_INLINE uint32_t signs4(const uint8_t *t, uint32_t b) {
    return t[b & 127] | (uint32_t)t[b >> 7 & 127] << 8 | (uint32_t)t[b >> 14 & 127] << 16 |
           (uint32_t)t[b >> 21 & 127] << 24;
}

/* sum over 32 values of sc * (u * y) with the 4 runs' signs given as +-1
 * bytes (kern_iq_grids.signs64 of their 7-bit fields s0..s3). */
T_AVX2_INLINE __m256i dot32s(__m256i u, uint32_t s0, uint32_t s1, uint32_t s2, uint32_t s3,
                             const int8_t *yq, __m256i sc) {
    const uint64_t *t = kern_iq_grids.signs64;
    const __m256i sg =
        _mm256_setr_epi64x((long long)t[s0], (long long)t[s1], (long long)t[s2], (long long)t[s3]);
    const __m256i y = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)yq), sg);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), sc);
}

/* ======================= IQ2_XXS ======================= */

T_AVX2_INLINE __m256i iq2xxs_lanes(const blk_iq2_xxs *x, const blk_q8_K *y) {
    const uint64_t *g = kern_iq_grids.iq2xxs;
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const uint32_t a = kern_le32(&x->qs[4 * k]), b = kern_le32(&x->qs[4 * k + 2]);
        const __m256i u = grid4(g, a & 0xFF, a >> 8 & 0xFF, a >> 16 & 0xFF, a >> 24);
        acc = _mm256_add_epi32(acc, dot32s(u, b & 127, b >> 7 & 127, b >> 14 & 127, b >> 21 & 127,
                                           y->qs + 32 * k, sc32((int)(2 * (b >> 28) + 1))));
    }
    return acc;
}

/* ======================= IQ2_XS ======================= */

T_AVX2_INLINE __m256i iq2xs_lanes(const blk_iq2_xs *x, const blk_q8_K *y) {
    const uint64_t *g = kern_iq_grids.iq2xs;
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const uint16_t *q = x->qs + 4 * k;
        const __m256i u = grid4(g, q[0] & 511, q[1] & 511, q[2] & 511, q[3] & 511);
        acc = _mm256_add_epi32(
            acc, dot32s(u, q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9, y->qs + 32 * k,
                        sc16(2 * (x->scales[k] & 0xF) + 1, 2 * (x->scales[k] >> 4) + 1)));
    }
    return acc;
}

/* ======================= IQ2_S ======================= */

T_AVX2_INLINE __m256i iq2s_lanes(const blk_iq2_s *x, const blk_q8_K *y) {
    const uint64_t *g = kern_iq_grids.iq2s;
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const uint8_t *q = x->qs + 4 * k;
        const unsigned h = x->qh[k];
        const __m256i u = grid4(g, q[0] | (h & 3) << 8, q[1] | (h >> 2 & 3) << 8,
                                q[2] | (h >> 4 & 3) << 8, q[3] | (h >> 6 & 3) << 8);
        acc = _mm256_add_epi32(
            acc, dot32(u, kern_le32(x->qs + 32 + 4 * k), y->qs + 32 * k,
                       sc16(2 * (x->scales[k] & 0xF) + 1, 2 * (x->scales[k] >> 4) + 1)));
    }
    return acc;
}

/* ======================= IQ3_XXS ======================= */

T_AVX2_INLINE __m256i iq3xxs_lanes(const blk_iq3_xxs *x, const blk_q8_K *y) {
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const uint32_t b = kern_le32(x->qs + 64 + 4 * k);
        acc = _mm256_add_epi32(acc, dot32(grid8(kern_iq_grids.iq3xxs, x->qs + 8 * k, 0),
                                          signs4(kern_iq_grids.signs, b), y->qs + 32 * k,
                                          sc32((int)(2 * (b >> 28) + 1))));
    }
    return acc;
}

/* ======================= IQ3_S ======================= */

T_AVX2_INLINE __m256i iq3s_lanes(const blk_iq3_s *x, const blk_q8_K *y) {
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const int ls = x->scales[k / 2] >> (4 * (k % 2)) & 0xF;
        acc = _mm256_add_epi32(acc, dot32(grid8(kern_iq_grids.iq3s, x->qs + 8 * k, x->qh[k]),
                                          kern_le32(x->signs + 4 * k), y->qs + 32 * k,
                                          sc32(2 * ls + 1)));
    }
    return acc;
}

/* ======================= IQ1_S, IQ1_M ======================= */

/* sum over 32 values of sc * (g * y), g the 4 entries' bytes (-1, 0, 1). */
T_AVX2_INLINE __m256i iq1_dot32(__m256i g, const int8_t *yq, __m256i sc) {
    const __m256i y = _mm256_loadu_si256((const __m256i *)yq);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(g), _mm256_sign_epi8(y, g)), sc);
}
static inline long long iq1_shift(bool minus) {
    return minus ? -1LL /* 0xFF bytes */ : 0x0101010101010101LL;
}

/* The codebook lanes, and in *sh the shifts' sum sum_g shift_g sc_g (bsums). */
T_AVX2_INLINE __m256i iq1s_lanes(const blk_iq1_s *x, const blk_q8_K *y, int32_t *sh) {
    const uint64_t *g = kern_iq_grids.iq1s;
    __m256i acc = _mm256_setzero_si256();
    int32_t sum = 0;
    for (int k = 0; k < 8; k++) {
        const uint8_t *q = x->qs + 4 * k;
        const unsigned h = x->qh[k];
        const int ls = (int)(2 * (h >> 12 & 7) + 1);
        const __m256i e = grid4(g, q[0] | (h & 7) << 8, q[1] | (h >> 3 & 7) << 8,
                                q[2] | (h >> 6 & 7) << 8, q[3] | (h >> 9 & 7) << 8);
        acc = _mm256_add_epi32(acc, iq1_dot32(e, y->qs + 32 * k, sc32(ls)));
        sum += (h & 0x8000 ? -ls : ls) * (y->bsums[2 * k] + y->bsums[2 * k + 1]);
    }
    *sh = sum;
    return acc;
}

/* The codebook lanes, and in *sh2 the shifts' lanes. */
T_AVX2_INLINE __m256i iq1m_lanes(const blk_iq1_m *x, const blk_q8_K *y, const uint16_t *s,
                                 __m256i *sh2) {
    const uint64_t *g = kern_iq_grids.iq1s;
    __m256i acc = _mm256_setzero_si256(), acc2 = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const uint8_t *q = x->qs + 4 * k;
        const unsigned h0 = x->qh[2 * k], h1 = x->qh[2 * k + 1];
        const __m256i e = grid4(g, q[0] | (h0 & 7) << 8, q[1] | (h0 >> 4 & 7) << 8,
                                q[2] | (h1 & 7) << 8, q[3] | (h1 >> 4 & 7) << 8);
        const __m256i sh = _mm256_setr_epi64x(iq1_shift(h0 & 0x08), iq1_shift(h0 & 0x80),
                                              iq1_shift(h1 & 0x08), iq1_shift(h1 & 0x80));
        const int w = s[k / 2] >> (6 * (k % 2));
        const __m256i sc = sc16(2 * (w & 7) + 1, 2 * (w >> 3 & 7) + 1);
        acc = _mm256_add_epi32(acc, iq1_dot32(e, y->qs + 32 * k, sc));
        acc2 = _mm256_add_epi32(acc2, iq1_dot32(sh, y->qs + 32 * k, sc));
    }
    *sh2 = acc2;
    return acc;
}

/* kavx2_vec_dot_<t> of a type without shifts: acc = fma(d * yd, lanes, acc)
 * per super-block, POST * hsum8(acc) (quant_iq_ref.c). */
#define IQ_AVX2_DOT(t, LANES, POST)                                                                \
    T_AVX2 void kavx2_vec_dot_##t(int64_t n, float *s, const void *vx, const void *vy) {           \
        const blk_##t *x = vx;                                                                     \
        const blk_q8_K *y = vy;                                                                    \
        __m256 acc = _mm256_setzero_ps();                                                          \
        for (int64_t b = 0; b < n / QK_K; b++)                                                     \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[b].d) * y[b].d),                      \
                                  _mm256_cvtepi32_ps(LANES(x + b, y + b)), acc);                   \
        *s = POST * kern_hsum8_ps(acc);                                                            \
    }
IQ_AVX2_DOT(iq2_xxs, iq2xxs_lanes, 0.125f)
IQ_AVX2_DOT(iq2_xs, iq2xs_lanes, 0.125f)
IQ_AVX2_DOT(iq2_s, iq2s_lanes, 0.125f)
IQ_AVX2_DOT(iq3_xxs, iq3xxs_lanes, 0.25f)
IQ_AVX2_DOT(iq3_s, iq3s_lanes, 1.0f)

T_AVX2 void kavx2_vec_dot_iq1_s(int64_t n, float *s, const void *vx, const void *vy) {
    const blk_iq1_s *x = vx;
    const blk_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float acc1 = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int32_t sh;
        const __m256i lanes = iq1s_lanes(x + b, y + b, &sh);
        const float d = _cvtsh_ss(x[b].d) * y[b].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
        acc1 = fmaf(d, (float)sh, acc1);
    }
    *s = fmaf(0.125f, acc1, kern_hsum8_ps(acc));
}

T_AVX2 void kavx2_vec_dot_iq1_m(int64_t n, float *s, const void *vx, const void *vy) {
    const blk_iq1_m *x = vx;
    const blk_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        uint16_t sc[4];
        memcpy(sc, x[b].scales, sizeof sc);
        __m256i sh2;
        const __m256i lanes = iq1m_lanes(x + b, y + b, sc, &sh2);
        const kvl_f16 dh = (kvl_f16)((sc[0] >> 12) | (sc[1] >> 8 & 0x00F0) | (sc[2] >> 4 & 0x0F00) |
                                     (sc[3] & 0xF000));
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(dh) * y[b].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc);
        acc2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sh2), acc2);
    }
    *s = fmaf(0.125f, kern_hsum8_ps(acc2), kern_hsum8_ps(acc));
}
