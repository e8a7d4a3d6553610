/* kernels: AVX-512 (F, BW, VL, VNNI) dot products of the lattice types
 * (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against Q8_K, one
 * weight row against 1..KERN_ROWS_WIDE activation rows.
 *
 * A super-block is decoded once into the K family's four 64-value chunks
 * (quant_kx_avx512.h): the codebook entries of a chunk gathered into one
 * vector of magnitudes, its 64 signs as the chunk's negation mask (IQ1: the
 * values 8 * grid + shift, split into magnitude and sign the same way), and
 * the int16 group scales. The integer sums of the 16 lanes fold into
 * llama.cpp's 8 (lane i: values 4i..4i+3 of every 32), and the float steps
 * are quant_iq_ref.c's: bit-identical to it. */
#include "quant_kx_avx512.h"

#include <string.h>

/* Every index, sign and scale is formed in registers: a vector assembled
 * from scalar stores and read back whole stalls on store forwarding (the
 * first version of these decoders: 28-140 ns a super-block, against 10-30). */

/* 8 entries of an 8-byte codebook, lane r's index for run r of the chunk. */
T_512_INLINE __m512i gather8(const uint64_t *grid, __m256i idx) {
    return _mm512_i32gather_epi64(idx, (const void *)grid, 8);
}
/* 16 entries of a 4-byte codebook. */
T_512_INLINE __m512i gather16(const uint32_t *grid, __m512i idx) {
    return _mm512_i32gather_epi32(idx, (const void *)grid, 4);
}

/* The 64 signs of a chunk from its 8 runs' 7-bit sign fields, one per byte
 * of s7: the eighth sign of each run makes the count of minus signs even
 * (kern_iq_grids.signs), computed here as the byte's parity. */
static inline __mmask64 signs7(uint64_t s7) {
    uint64_t p = s7 ^ (s7 >> 4); /* bits 0..3 of each byte: its two nibbles xored */
    p ^= p >> 2;
    p ^= p >> 1;
    return (__mmask64)(s7 | (p & 0x0101010101010101ull) << 7);
}
/* 16 int16 scales 2 s + 1 from 16 4-bit fields s (nibbles of 8 bytes, low first). */
T_512_INLINE __m512i scales_nib16(const uint8_t *b) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)b);
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0xF));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0xF));
    const __m256i s = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi));
    return _mm512_castsi256_si512(_mm256_add_epi16(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1)));
}

/* Scales of groups of 16 (lanes of sc) into the chunk vectors. */
T_512_INLINE void put_scales16(kx_dec *d, __m512i sc) {
    UNROLL(4)
    for (int c = 0; c < 4; c++) d->sc[c] = _mm512_permutexvar_epi16(idx_g16(c), sc);
}
/* Chunk c's scale vector for its two groups of 32 with scales s0, s1. */
T_512_INLINE __m512i scale_pair(int s0, int s1) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)s0), _mm256_set1_epi16((short)s1), 1);
}

/* ======================= IQ2_XXS ======================= */

/* The 32 sign bytes of a super-block whose 8 groups' words w (4 x 7 sign bits
 * each, bits 0, 7, 14, 21) are the dwords of w8 (IQ2_XXS, IQ3_XXS): run 4g + k
 * in byte 4g + k, each with its parity as the eighth sign. */
T_512_INLINE __m256i signs7x32(__m256i w8) {
    const __m512i sh = _mm512_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21);
    const __m512i lo = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i w = _mm512_castsi256_si512(w8), m = _mm512_set1_epi32(127);
    const __m512i f0 = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(lo, w), sh), m);
    const __m512i f1 = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_permutexvar_epi32(_mm512_add_epi32(lo, _mm512_set1_epi32(4)), w),
                          sh),
        m);
    const __m256i f = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(f0)),
                                              _mm512_cvtepi32_epi8(f1), 1);
    /* parity of each byte's 7 bits: a nibble table looked up twice */
    const __m256i par = _mm256_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0,
                                         1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0);
    const __m256i nib = _mm256_set1_epi8(0xF);
    const __m256i p =
        _mm256_xor_si256(_mm256_shuffle_epi8(par, _mm256_and_si256(f, nib)),
                         _mm256_shuffle_epi8(par, _mm256_and_si256(_mm256_srli_epi16(f, 4), nib)));
    return _mm256_or_si256(f, _mm256_slli_epi16(p, 7)); /* p is 0 or 1: no carry across bytes */
}

T_512_INLINE float iq2xxs_decode(const blk_iq2_xxs *x, kx_dec *d) {
    /* group g: 4 index bytes at 8g, then its word (signs, scale) at 8g + 4 */
    const __m512i q = _mm512_loadu_si512(x->qs);
    const __m256i w8 = _mm512_cvtepi64_epi32(_mm512_srli_epi64(q, 32));
    const __m256i sg = signs7x32(w8);
    /* the index bytes of each 128-bit lane (groups 2c, 2c + 1) to its front */
    const __m512i ix = _mm512_shuffle_epi8(
        q, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0)));
    const __m512i sc8 = _mm512_castsi128_si512(_mm256_cvtepi32_epi16(
        _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(w8, 28), 1), _mm256_set1_epi32(1))));
    uint64_t m[4];
    _mm256_storeu_si256((__m256i *)m, sg); /* one store, read back as four words */
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m128i lane = c == 0   ? _mm512_castsi512_si128(ix)
                             : c == 1 ? _mm512_extracti32x4_epi32(ix, 1)
                             : c == 2 ? _mm512_extracti32x4_epi32(ix, 2)
                                      : _mm512_extracti32x4_epi32(ix, 3);
        d->u[c] = gather8(kern_iq_grids.iq2xxs, _mm256_cvtepu8_epi32(lane));
        d->neg[c] = (__mmask64)m[c];
        d->sc[c] = _mm512_permutexvar_epi16(idx_g32(c), sc8);
    }
    return f16_load(x->d);
}

/* ======================= IQ2_XS ======================= */

T_512_INLINE float iq2xs_decode(const blk_iq2_xs *x, kx_dec *d) {
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m128i q = _mm_loadu_si128((const __m128i *)&x->qs[8 * c]);
        d->u[c] = gather8(kern_iq_grids.iq2xs,
                          _mm256_cvtepu16_epi32(_mm_and_si128(q, _mm_set1_epi16(511))));
        d->neg[c] = signs7((uint64_t)_mm_cvtsi128_si64(_mm_cvtepi16_epi8(_mm_srli_epi16(q, 9))));
    }
    put_scales16(d, scales_nib16(x->scales));
    return f16_load(x->d);
}

/* ======================= IQ2_S ======================= */

T_512_INLINE float iq2s_decode(const blk_iq2_s *x, kx_dec *d) {
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        uint16_t h; /* qh of groups 2c, 2c + 1: bits 2r, 2r + 1 for run r of the chunk */
        memcpy(&h, x->qh + 2 * c, 2);
        const __m256i hi = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
            _mm256_set1_epi32(3));
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * c)));
        d->u[c] = gather8(kern_iq_grids.iq2s, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 8)));
        d->neg[c] = (__mmask64)kern_le64(x->qs + 32 + 8 * c);
    }
    put_scales16(d, scales_nib16(x->scales));
    return f16_load(x->d);
}

/* ======================= IQ3_XXS ======================= */

T_512_INLINE float iq3xxs_decode(const blk_iq3_xxs *x, kx_dec *d) {
    const __m256i w8 = _mm256_loadu_si256((const __m256i *)(x->qs + 64)); /* the groups' words */
    uint64_t m[4];
    _mm256_storeu_si256((__m256i *)m, signs7x32(w8)); /* one store, read back as four words */
    const __m512i sc8 = _mm512_castsi128_si512(_mm256_cvtepi32_epi16(
        _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(w8, 28), 1), _mm256_set1_epi32(1))));
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i idx =
            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 16 * c)));
        d->u[c] = gather16(kern_iq_grids.iq3xxs, idx);
        d->neg[c] = (__mmask64)m[c];
        d->sc[c] = _mm512_permutexvar_epi16(idx_g32(c), sc8);
    }
    return f16_load(x->d);
}

/* ======================= IQ3_S ======================= */

T_512_INLINE float iq3s_decode(const blk_iq3_s *x, kx_dec *d) {
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        uint16_t h;
        memcpy(&h, x->qh + 2 * c, 2); /* bit i: the ninth bit of index 16c + i */
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 16 * c)));
        idx = _mm512_mask_add_epi32(idx, (__mmask16)h, idx, _mm512_set1_epi32(256));
        d->u[c] = gather16(kern_iq_grids.iq3s, idx);
        d->neg[c] = (__mmask64)kern_le64(x->signs + 8 * c);
        d->sc[c] = scale_pair(2 * (x->scales[c] & 0xF) + 1, 2 * (x->scales[c] >> 4) + 1);
    }
    return f16_load(x->d);
}

/* ======================= IQ1_S, IQ1_M ======================= */

/* The shift part of an IQ1 block: IQ1_S's per-group factor shift * scale
 * for the pairs of Q8_K bsums (c16), IQ1_M's per-value shift signs with
 * the scales (sh: magnitudes 1). */
typedef struct {
    kx_dec k;
    __m512i scd[4]; /* IQ1_M: chunk c's scales, negated for the runs shifted down */
    __m256i c16;
} iq1_dec;

/* 8 IQ1 codebook entries (bytes -1, 0, 1) as magnitudes and signs. */
T_512_INLINE void iq1_chunk(kx_dec *d, int c, __m256i idx) {
    const __m512i g = gather8(kern_iq_grids.iq1s, idx);
    d->u[c] = _mm512_abs_epi8(g);
    d->neg[c] = _mm512_movepi8_mask(g);
}

T_512_INLINE float iq1s_decode(const blk_iq1_s *x, iq1_dec *d) {
    /* qh: per group 3 x 3 high index bits, the scale in bits 12..14, the shift's sign in 15 */
    const __m128i qh = _mm_loadu_si128((const __m128i *)x->qh);
    const __m128i sc =
        _mm_add_epi16(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1),
                      _mm_set1_epi16(1));
    const __m128i neg = _mm_srai_epi16(qh, 15); /* -1 where the shift is negative */
    const __m256i c8 = _mm256_cvtepu16_epi32(_mm_sub_epi16(_mm_xor_si128(sc, neg), neg));
    d->c16 = _mm256_or_si256(c8, _mm256_slli_epi32(c8, 16)); /* each for its two bsums */
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m256i h = _mm256_setr_epi32(x->qh[2 * c], x->qh[2 * c], x->qh[2 * c], x->qh[2 * c],
                                            x->qh[2 * c + 1], x->qh[2 * c + 1], x->qh[2 * c + 1],
                                            x->qh[2 * c + 1]);
        const __m256i hi = _mm256_and_si256(
            _mm256_srlv_epi32(h, _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9)), _mm256_set1_epi32(7));
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * c)));
        iq1_chunk(&d->k, c, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 8)));
    }
    const __m512i sc16 = _mm512_castsi128_si512(sc);
    UNROLL(4)
    for (int c = 0; c < 4; c++) d->k.sc[c] = _mm512_permutexvar_epi16(idx_g32(c), sc16);
    return f16_load(x->d);
}

T_512_INLINE float iq1m_decode(const blk_iq1_m *x, iq1_dec *d) {
    __mmask32 minus[4];
    uint64_t s64;
    memcpy(&s64, x->scales, 8);
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        /* run r of the chunk: nibble r of qh[4c..4c+3], its low 3 bits the index's high
         * bits, bit 3 the shift's sign */
        const __m256i nib =
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)kern_le32(x->qh + 4 * c)),
                                               _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                             _mm256_set1_epi32(0xF));
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * c)));
        iq1_chunk(
            &d->k, c,
            _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(7)), 8)));
        /* the runs shifted down: their 4 int16 pairs each */
        minus[c] = _mm512_movepi16_mask(_mm512_maskz_mov_epi64(
            _mm256_test_epi32_mask(nib, _mm256_set1_epi32(8)), _mm512_set1_epi8(-1)));
    }
    /* the 16 3-bit scales: scale j at bit 16 (j / 4) + 6 ((j / 2) % 2) + 3 (j % 2) */
    const __m256i w =
        _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm256_castsi128_si256(_mm_cvtsi64_si128((long long)s64)));
    const __m256i f = _mm256_and_si256(
        _mm256_srlv_epi16(w, _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
        _mm256_set1_epi16(7));
    const __m512i sc =
        _mm512_castsi256_si512(_mm256_add_epi16(_mm256_slli_epi16(f, 1), _mm256_set1_epi16(1)));
    put_scales16(&d->k, sc);
    UNROLL(4)
    for (int c = 0; c < 4; c++)
        d->scd[c] = _mm512_mask_sub_epi16(d->k.sc[c], minus[c], _mm512_setzero_si512(), d->k.sc[c]);
    const kvl_f16 dh = (kvl_f16)((s64 >> 12 & 0x000F) | (s64 >> 24 & 0x00F0) |
                                 (s64 >> 36 & 0x0F00) | (s64 >> 48 & 0xF000));
    return f16_load(dh);
}

/* The 8 lanes of a decoded super-block against Q8_K values yq. */
T_512_INLINE __m256 iq_lanes(const kx_dec *d, const int8_t *yq) {
    return _mm256_cvtepi32_ps(fold512(kx_chunks(d, yq, true)));
}

/* The entry points of a lattice rows kernel: up to KERN_ROWS_WIDE rows, the
 * counts of decode and small batches as constants (their loops unroll). */
#define IQ_ROWS_ENTRIES(NAME) KAVX512_ROWS_ENTRIES_BY(NAME, KERN_ROWS_WIDE_SWITCH)

/* NAME_rows of a lattice type: each super-block decoded once (DECODE returns
 * its fp16 d), then per activation row the lanes acc = fma(d * yd, lanes,
 * acc), and at the end POST * hsum8(acc) (quant_iq_ref.c). */
#define IQ_ROWS(NAME, BLK, DECODE, POST)                                                           \
    T_512_INLINE void NAME##_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,   \
                                  size_t ys, int nr) {                                             \
        const BLK *x = vx;                                                                         \
        __m256 acc[KERN_ROWS_WIDE];                                                                \
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();                                 \
        for (int64_t b = 0; b < n / QK_K; b++) {                                                   \
            kx_dec dec;                                                                            \
            const float xd = DECODE(&x[b], &dec);                                                  \
            UNROLL(4)                                                                              \
            for (int r = 0; r < nr; r++) {                                                         \
                const blk_q8_K *yr = (const blk_q8_K *)((const char *)y + (size_t)r * ys) + b;     \
                acc[r] =                                                                           \
                    _mm256_fmadd_ps(_mm256_set1_ps(xd * yr->d), iq_lanes(&dec, yr->qs), acc[r]);   \
            }                                                                                      \
        }                                                                                          \
        UNROLL(4)                                                                                  \
        for (int r = 0; r < nr; r++) s[r * ss] = POST * kern_hsum8_ps(acc[r]);                     \
    }                                                                                              \
    IQ_ROWS_ENTRIES(NAME)

IQ_ROWS(iq2_xxs, blk_iq2_xxs, iq2xxs_decode, 0.125f)
IQ_ROWS(iq2_xs, blk_iq2_xs, iq2xs_decode, 0.125f)
IQ_ROWS(iq2_s, blk_iq2_s, iq2s_decode, 0.125f)
IQ_ROWS(iq3_xxs, blk_iq3_xxs, iq3xxs_decode, 0.25f)
IQ_ROWS(iq3_s, blk_iq3_s, iq3s_decode, 1.0f)

/* IQ1_S: the shifts' sum S = sum_g shift_g sc_g (bsums 2g, 2g + 1) into its
 * own accumulator; the result fma(1/8, acc1, hsum8(acc)). */
T_512_INLINE void iq1_s_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,
                             size_t ys, int nr) {
    const blk_iq1_s *x = vx;
    __m256 acc[KERN_ROWS_WIDE];
    float acc1[KERN_ROWS_WIDE] = {0};
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        iq1_dec dec;
        const float xd = iq1s_decode(&x[b], &dec);
        UNROLL(4)
        for (int r = 0; r < nr; r++) {
            const blk_q8_K *yr = (const blk_q8_K *)((const char *)y + (size_t)r * ys) + b;
            const float d = xd * yr->d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), iq_lanes(&dec.k, yr->qs), acc[r]);
            const int32_t sh = kern_hsum8_i32(
                _mm256_madd_epi16(dec.c16, _mm256_loadu_si256((const __m256i *)yr->bsums)));
            acc1[r] = fmaf(d, (float)sh, acc1[r]);
        }
    }
    UNROLL(4)
    for (int r = 0; r < nr; r++) s[r * ss] = fmaf(0.125f, acc1[r], kern_hsum8_ps(acc[r]));
}
IQ_ROWS_ENTRIES(iq1_s)

/* IQ1_M: the shifts in lanes of their own, from the Q8_K pair sums times the
 * signed scales; fma(1/8, hsum8(acc2), hsum8(acc)). */
T_512_INLINE void iq1_m_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,
                             size_t ys, int nr) {
    const blk_iq1_m *x = vx;
    __m256 acc[KERN_ROWS_WIDE], acc2[KERN_ROWS_WIDE];
    for (int r = 0; r < nr; r++) acc[r] = acc2[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        iq1_dec dec;
        const float xd = iq1m_decode(&x[b], &dec);
        UNROLL(4)
        for (int r = 0; r < nr; r++) {
            const blk_q8_K *yr = (const blk_q8_K *)((const char *)y + (size_t)r * ys) + b;
            __m512i a = _mm512_setzero_si512(), sh = a;
            UNROLL(4)
            for (int c = 0; c < 4; c++) {
                const __m512i yv = _mm512_loadu_si512(yr->qs + 64 * c);
                const __m512i ys =
                    _mm512_mask_sub_epi8(yv, dec.k.neg[c], _mm512_setzero_si512(), yv);
                a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(dec.k.u[c], ys), dec.k.sc[c]);
                sh = _mm512_dpwssd_epi32(sh, _mm512_maddubs_epi16(_mm512_set1_epi8(1), yv),
                                         dec.scd[c]);
            }
            const __m256 d = _mm256_set1_ps(xd * yr->d);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold512(a)), acc[r]);
            acc2[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold512(sh)), acc2[r]);
        }
    }
    UNROLL(4)
    for (int r = 0; r < nr; r++)
        s[r * ss] = fmaf(0.125f, kern_hsum8_ps(acc2[r]), kern_hsum8_ps(acc[r]));
}
IQ_ROWS_ENTRIES(iq1_m)
