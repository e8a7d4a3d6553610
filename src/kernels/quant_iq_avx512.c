/* kernels: AVX-512 (F, BW, VL, VNNI) dot products of the lattice types
 * (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against Q8_K, one
 * weight row against 1..KERN_ROWS_MAX activation rows.
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

static inline uint32_t le32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t le64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* 8 entries of an 8-byte codebook, idx[r] for run r of the chunk. */
T_512_INLINE __m512i gather8(const uint64_t *grid, const uint32_t *idx) {
    return _mm512_i32gather_epi64(_mm256_loadu_si256((const __m256i *)idx), (const void *)grid, 8);
}
/* 16 entries of a 4-byte codebook. */
T_512_INLINE __m512i gather16(const uint32_t *grid, __m512i idx) {
    return _mm512_i32gather_epi32(idx, (const void *)grid, 4);
}

/* The 64 signs of a chunk from 8 stored 7-bit indices into kern_iq_grids.signs. */
T_512_INLINE __mmask64 signs7(const uint32_t *s7) {
    uint64_t m = 0;
    for (int r = 0; r < 8; r++) m |= (uint64_t)kern_iq_grids.signs[s7[r]] << (8 * r);
    return (__mmask64)m;
}

/* 16 int16 scales 2 s + 1 from 16 4-bit fields s (nibbles of 8 bytes, low first). */
T_512_INLINE __m512i scales_nib16(const uint8_t *b) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)b);
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0xF));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0xF));
    const __m256i s = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi));
    return _mm512_castsi256_si512(_mm256_add_epi16(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1)));
}

/* Scales of groups of 32 (sc[g], g < 8) or 16 (g < 16) into the chunk vectors. */
T_512_INLINE void put_scales(kx_dec *d, __m512i sc, bool g16) {
    UNROLL(4)
    for (int c = 0; c < 4; c++)
        d->sc[c] = _mm512_permutexvar_epi16(g16 ? idx_g16(c) : idx_g32(c), sc);
}
T_512_INLINE __m512i scales_list(const int16_t *s) {
    return _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)s));
}

/* ======================= IQ2_XXS ======================= */

T_512_INLINE float iq2xxs_decode(const blk_iq2_xxs *x, kx_dec *d) {
    int16_t sc[16] = {0};
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        uint32_t idx[8], s7[8];
        for (int h = 0; h < 2; h++) {
            const int g = 2 * c + h;
            const uint32_t a = le32(&x->qs[4 * g]), b = le32(&x->qs[4 * g + 2]);
            for (int l = 0; l < 4; l++)
                idx[4 * h + l] = a >> (8 * l) & 0xFF, s7[4 * h + l] = b >> (7 * l) & 127;
            sc[g] = (int16_t)(2 * (b >> 28) + 1);
        }
        d->u[c] = gather8(kern_iq_grids.iq2xxs, idx);
        d->neg[c] = signs7(s7);
    }
    put_scales(d, scales_list(sc), false);
    return f16_load(x->d);
}

/* ======================= IQ2_XS ======================= */

T_512_INLINE float iq2xs_decode(const blk_iq2_xs *x, kx_dec *d) {
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)&x->qs[8 * c]));
        uint32_t idx[8], s7[8];
        _mm256_storeu_si256((__m256i *)idx, _mm256_and_si256(q, _mm256_set1_epi32(511)));
        _mm256_storeu_si256((__m256i *)s7, _mm256_srli_epi32(q, 9));
        d->u[c] = gather8(kern_iq_grids.iq2xs, idx);
        d->neg[c] = signs7(s7);
    }
    put_scales(d, scales_nib16(x->scales), true);
    return f16_load(x->d);
}

/* ======================= IQ2_S ======================= */

T_512_INLINE float iq2s_decode(const blk_iq2_s *x, kx_dec *d) {
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        uint32_t idx[8];
        for (int r = 0; r < 8; r++) {
            const int g = 2 * c + r / 4, l = r % 4;
            idx[r] = x->qs[8 * c + r] | (uint32_t)(x->qh[g] >> (2 * l) & 3) << 8;
        }
        d->u[c] = gather8(kern_iq_grids.iq2s, idx);
        d->neg[c] = (__mmask64)le64(x->qs + 32 + 8 * c);
    }
    put_scales(d, scales_nib16(x->scales), true);
    return f16_load(x->d);
}

/* ======================= IQ3_XXS ======================= */

/* 8 runs' signs (two groups' words, 4 runs each). */
T_512_INLINE __mmask64 iq3xxs_signs(uint32_t b0, uint32_t b1) {
    uint32_t s7[8];
    for (int l = 0; l < 4; l++) s7[l] = b0 >> (7 * l) & 127, s7[4 + l] = b1 >> (7 * l) & 127;
    return signs7(s7);
}

T_512_INLINE float iq3xxs_decode(const blk_iq3_xxs *x, kx_dec *d) {
    int16_t sc[16] = {0};
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i idx =
            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 16 * c)));
        d->u[c] = gather16(kern_iq_grids.iq3xxs, idx);
        const uint32_t b0 = le32(x->qs + 64 + 8 * c), b1 = le32(x->qs + 68 + 8 * c);
        d->neg[c] = iq3xxs_signs(b0, b1);
        sc[2 * c] = (int16_t)(2 * (b0 >> 28) + 1), sc[2 * c + 1] = (int16_t)(2 * (b1 >> 28) + 1);
    }
    put_scales(d, scales_list(sc), false);
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
        d->neg[c] = (__mmask64)le64(x->signs + 8 * c);
    }
    int16_t sc[16] = {0};
    for (int g = 0; g < 8; g++)
        sc[g] = (int16_t)(2 * (x->scales[g / 2] >> (4 * (g % 2)) & 0xF) + 1);
    put_scales(d, scales_list(sc), false);
    return f16_load(x->d);
}

/* ======================= IQ1_S, IQ1_M ======================= */

/* The shift part of an IQ1 block: IQ1_S's per-group factor shift * scale
 * for the pairs of Q8_K bsums (c16), IQ1_M's per-value shift signs with
 * the scales (sh: magnitudes 1). */
typedef struct {
    kx_dec k, sh;
    __m256i c16;
} iq1_dec;

/* 8 IQ1 codebook entries (bytes -1, 0, 1) as magnitudes and signs. */
T_512_INLINE void iq1_chunk(kx_dec *d, int c, const uint32_t *idx) {
    const __m512i g = gather8(kern_iq_grids.iq1s, idx);
    d->u[c] = _mm512_abs_epi8(g);
    d->neg[c] = _mm512_movepi8_mask(g);
}

T_512_INLINE float iq1s_decode(const blk_iq1_s *x, iq1_dec *d) {
    int16_t sc[16] = {0}, c[16];
    UNROLL(4)
    for (int ch = 0; ch < 4; ch++) {
        uint32_t idx[8];
        for (int h = 0; h < 2; h++) {
            const int g = 2 * ch + h;
            const unsigned q = x->qh[g];
            for (int l = 0; l < 4; l++) idx[4 * h + l] = x->qs[4 * g + l] | (q >> (3 * l) & 7) << 8;
            sc[g] = (int16_t)(2 * (q >> 12 & 7) + 1);
            c[2 * g] = c[2 * g + 1] = (int16_t)(q & 0x8000 ? -sc[g] : sc[g]);
        }
        iq1_chunk(&d->k, ch, idx);
    }
    put_scales(&d->k, scales_list(sc), false);
    d->c16 = _mm256_loadu_si256((const __m256i *)c);
    return f16_load(x->d);
}

T_512_INLINE float iq1m_decode(const blk_iq1_m *x, iq1_dec *d) {
    uint16_t s[4];
    memcpy(s, x->scales, sizeof s);
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        uint32_t idx[8];
        uint64_t minus = 0;
        for (int r = 0; r < 8; r++) { /* run 8c + r: group 2c + r / 4, l = r % 4 */
            const unsigned nib = x->qh[4 * c + r / 2] >> (4 * (r % 2)) & 0xF;
            idx[r] = x->qs[8 * c + r] | (nib & 7) << 8;
            if (nib & 8) minus |= 0xFFull << (8 * r);
        }
        iq1_chunk(&d->k, c, idx);
        d->sh.u[c] = _mm512_set1_epi8(1);
        d->sh.neg[c] = (__mmask64)minus;
    }
    int16_t sc[16];
    for (int g = 0; g < 8; g++) {
        sc[2 * g] = (int16_t)(2 * (s[g / 2] >> (6 * (g % 2)) & 7) + 1);
        sc[2 * g + 1] = (int16_t)(2 * (s[g / 2] >> (6 * (g % 2) + 3) & 7) + 1);
    }
    put_scales(&d->k, scales_list(sc), true);
    put_scales(&d->sh, scales_list(sc), true);
    const kvl_f16 dh =
        (kvl_f16)((s[0] >> 12) | (s[1] >> 8 & 0x00F0) | (s[2] >> 4 & 0x0F00) | (s[3] & 0xF000));
    return f16_load(dh);
}

/* The 8 lanes of a decoded super-block against Q8_K values yq. */
T_512_INLINE __m256 iq_lanes(const kx_dec *d, const int8_t *yq) {
    return _mm256_cvtepi32_ps(fold512(kx_chunks(d, yq, true)));
}

/* NAME_rows of a lattice type: each super-block decoded once (DECODE returns
 * its fp16 d), then per activation row the lanes acc = fma(d * yd, lanes,
 * acc), and at the end POST * hsum8(acc) (quant_iq_ref.c). */
#define IQ_ROWS(NAME, BLK, DECODE, POST)                                                           \
    T_512_INLINE void NAME##_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,   \
                                  size_t ys, int nr) {                                             \
        const BLK *x = vx;                                                                         \
        __m256 acc[KERN_ROWS_MAX];                                                                 \
        UNROLL(4)                                                                                  \
        for (int r = 0; r < KERN_ROWS_MAX; r++) acc[r] = _mm256_setzero_ps();                      \
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
    KAVX512_ROWS_ENTRIES(NAME)

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
    __m256 acc[KERN_ROWS_MAX];
    float acc1[KERN_ROWS_MAX] = {0};
    UNROLL(4)
    for (int r = 0; r < KERN_ROWS_MAX; r++) acc[r] = _mm256_setzero_ps();
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
KAVX512_ROWS_ENTRIES(iq1_s)

/* IQ1_M: the shifts in lanes of their own; fma(1/8, hsum8(acc2), hsum8(acc)). */
T_512_INLINE void iq1_m_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,
                             size_t ys, int nr) {
    const blk_iq1_m *x = vx;
    __m256 acc[KERN_ROWS_MAX], acc2[KERN_ROWS_MAX];
    UNROLL(4)
    for (int r = 0; r < KERN_ROWS_MAX; r++) acc[r] = acc2[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        iq1_dec dec;
        const float xd = iq1m_decode(&x[b], &dec);
        UNROLL(4)
        for (int r = 0; r < nr; r++) {
            const blk_q8_K *yr = (const blk_q8_K *)((const char *)y + (size_t)r * ys) + b;
            const __m256 d = _mm256_set1_ps(xd * yr->d);
            acc[r] = _mm256_fmadd_ps(d, iq_lanes(&dec.k, yr->qs), acc[r]);
            acc2[r] = _mm256_fmadd_ps(d, iq_lanes(&dec.sh, yr->qs), acc2[r]);
        }
    }
    UNROLL(4)
    for (int r = 0; r < nr; r++)
        s[r * ss] = fmaf(0.125f, kern_hsum8_ps(acc2[r]), kern_hsum8_ps(acc[r]));
}
KAVX512_ROWS_ENTRIES(iq1_m)
