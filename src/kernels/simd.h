/* kernels, private to the SIMD files: the target attributes, and the helpers
 * every ISA's kernels share (fp16 load, horizontal sums, the canonical exp),
 * each written once per ISA.
 *
 * The library is compiled for generic x86-64: a function that uses an ISA
 * carries its target attribute (T_AVX2, T_512; the _INLINE forms for helpers)
 * and is only called after kern_init checked CPUID for it (dispatch.c). The
 * AVX-512 set contains the AVX2 one, so AVX2 helpers inline into AVX-512 code.
 *
 * Every helper performs the operations of its scalar contract (kern_impl.h)
 * in the same order, so results stay bit-identical to the reference. */
#ifndef KVLLM_KERN_SIMD_H
#define KVLLM_KERN_SIMD_H

#include "kern_impl.h"

#include <immintrin.h>

#define KERN_AVX2_FLAGS   "avx2,fma,f16c"
#define KERN_AVX512_FLAGS "avx512f,avx512bw,avx512vl,avx512vnni," KERN_AVX2_FLAGS
#define T_AVX2            __attribute__((target(KERN_AVX2_FLAGS)))
#define T_AVX2_INLINE     static inline __attribute__((always_inline, target(KERN_AVX2_FLAGS)))
#define T_512             __attribute__((target(KERN_AVX512_FLAGS)))
#define T_512_INLINE      static inline __attribute__((always_inline, target(KERN_AVX512_FLAGS)))

/* Complete unrolling of a short loop, so arrays of vectors indexed by its
 * counter stay in registers instead of going through the stack. */
#define KERN_PRAGMA(x) _Pragma(#x)
#define UNROLL(n)      KERN_PRAGMA(GCC unroll n)

/* Calls fn(..., NR), the arguments after nr then NR = nr as a constant (1,
 * 2, 3 or KERN_ROWS_MAX), so that fn's per-row loops unroll into registers
 * (the *rows kernels of quant_avx512.c and quant_kx_avx512.c). */
#define KERN_NR_SWITCH(fn, nr, ...)                                                                \
    do {                                                                                           \
        switch (nr) {                                                                              \
        case 1: fn(__VA_ARGS__, 1); break;                                                         \
        case 2: fn(__VA_ARGS__, 2); break;                                                         \
        case 3: fn(__VA_ARGS__, 3); break;                                                         \
        default: fn(__VA_ARGS__, KERN_ROWS_MAX); break;                                            \
        }                                                                                          \
    } while (0)
#define KERN_ROWS_SWITCH(fn, n, s, ss, x, y, ys, nr) KERN_NR_SWITCH(fn, nr, n, s, ss, x, y, ys)
/* The same for the kernels that take up to KERN_ROWS_WIDE rows (the lattice
 * types): decode's and small batches' counts as constants, the rest as given. */
#define KERN_ROWS_WIDE_SWITCH(fn, n, s, ss, x, y, ys, nr)                                          \
    do {                                                                                           \
        switch (nr) {                                                                              \
        case 1: fn(n, s, ss, x, y, ys, 1); break;                                                  \
        case 2: fn(n, s, ss, x, y, ys, 2); break;                                                  \
        case 4: fn(n, s, ss, x, y, ys, 4); break;                                                  \
        case KERN_ROWS_WIDE: fn(n, s, ss, x, y, ys, KERN_ROWS_WIDE); break;                        \
        default: fn(n, s, ss, x, y, ys, nr < KERN_ROWS_WIDE ? nr : KERN_ROWS_WIDE);                \
        }                                                                                          \
    } while (0)

/* The two AVX-512 entry points of a rows kernel NAME_rows(n, s, ss, x, y, ys,
 * nr): kavx512_vec_dot_NAME (one activation row) and kavx512_rows_NAME (nr
 * rows through SWITCH: KERN_ROWS_SWITCH, or KERN_ROWS_WIDE_SWITCH), declared
 * in kern_impl.h. */
#define KAVX512_ROWS_ENTRIES_BY(NAME, SWITCH)                                                      \
    T_512 void kavx512_vec_dot_##NAME(int64_t n, float *s, const void *x, const void *y) {         \
        NAME##_rows(n, s, 0, x, y, 0, 1);                                                          \
    }                                                                                              \
    T_512 void kavx512_rows_##NAME(int64_t n, float *s, size_t ss, const void *x, const void *y,   \
                                   size_t ys, int nr) {                                            \
        SWITCH(NAME##_rows, n, s, ss, x, y, ys, nr);                                               \
    }
#define KAVX512_ROWS_ENTRIES(NAME) KAVX512_ROWS_ENTRIES_BY(NAME, KERN_ROWS_SWITCH)

/* NAME_rows of a K type and its entry points (quant_avx512.c,
 * quant_kx_avx512.c): each super-block of BLK is decoded once into a DEC by
 * DECODE, then sumf[r] = STEP(&dec, xd, xdmin, row r's blk_q8_K, sumf[r]) for
 * each activation row r < nr, xd the block's d as float and xdmin its dmin
 * (MIN = KAVX512_DMIN) or 0 (MIN = KAVX512_NO_DMIN). */
#define KAVX512_DMIN(xb)    f16_load((xb)->dmin)
#define KAVX512_NO_DMIN(xb) 0.0f
#define KAVX512_K_ROWS(NAME, BLK, DEC, DECODE, MIN, STEP)                                          \
    T_512_INLINE void NAME##_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,   \
                                  size_t ys, int nr) {                                             \
        const BLK *x = vx;                                                                         \
        float sumf[KERN_ROWS_MAX] = {0};                                                           \
        for (int64_t b = 0; b < n / QK_K; b++) {                                                   \
            DEC dec;                                                                               \
            DECODE(&x[b], &dec);                                                                   \
            const float xd = f16_load(x[b].d), xdmin = MIN(&x[b]);                                 \
            UNROLL(4)                                                                              \
            for (int r = 0; r < nr; r++) {                                                         \
                const blk_q8_K *yr = (const blk_q8_K *)((const char *)y + (size_t)r * ys) + b;     \
                sumf[r] = STEP(&dec, xd, xdmin, yr, sumf[r]);                                      \
            }                                                                                      \
        }                                                                                          \
        UNROLL(4)                                                                                  \
        for (int r = 0; r < nr; r++) s[r * ss] = sumf[r];                                          \
    }                                                                                              \
    KAVX512_ROWS_ENTRIES(NAME)

/* ---- AVX2 + FMA + F16C ---- */

T_AVX2_INLINE float f16_load(kvl_f16 h) { return _cvtsh_ss(h); }

/* The last three levels of kern_reduce16's tree on 8 lanes: lane i + lane
 * i+4, then i + i+2, then 0 + 1. */
T_AVX2_INLINE float kern_hsum8_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* kern_reduce16 of lanes 0..7 (a) and 8..15 (b). */
T_AVX2_INLINE float kern_hsum16_ps2(__m256 a, __m256 b) {
    return kern_hsum8_ps(_mm256_add_ps(a, b));
}

/* Sum of 8 int32 lanes (exact, any order). */
T_AVX2_INLINE int32_t kern_hsum8_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* 8 elements of a row of F32, F16 or BF16 (t, a gguf_dtype) from element i,
 * widened to float exactly. */
T_AVX2_INLINE __m256 kern_load8_ps(int t, const void *p, int64_t i) {
    switch (t) {
    case GGUF_DT_F32: return _mm256_loadu_ps((const float *)p + i);
    case GGUF_DT_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const kvl_f16 *)p + i)));
    default:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const kvl_bf16 *)p + i))),
            16));
    }
}

/* The canonical Q step for 4 blocks in order: s = fma(d_b, sum_b, s). */
T_AVX2_INLINE float kern_q_fma4(float s, __m128 d, __m128i isum) {
    _Alignas(16) float dv[4], fv[4];
    _mm_store_ps(dv, d);
    _mm_store_ps(fv, _mm_cvtepi32_ps(isum));
    s = fmaf(dv[0], fv[0], s);
    s = fmaf(dv[1], fv[1], s);
    s = fmaf(dv[2], fv[2], s);
    return fmaf(dv[3], fv[3], s);
}

/* Q4_1 / Q5_1, 4 blocks (quant32.h): v_b = fma(d_b, isum_b, ms_b) lane-wise,
 * then s += v_b in order. */
T_AVX2_INLINE float kern_q1_add4(float s, __m128 d, __m128i isum, __m128 ms) {
    _Alignas(16) float v[4];
    _mm_store_ps(v, _mm_fmadd_ps(d, _mm_cvtepi32_ps(isum), ms));
    s = s + v[0];
    s = s + v[1];
    s = s + v[2];
    return s + v[3];
}

/* 4 fp16 values (a, b, c, d) as floats. */
T_AVX2_INLINE __m128 kern_f16x4(kvl_f16 a, kvl_f16 b, kvl_f16 c, kvl_f16 d) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)a, (short)b, (short)c, (short)d, 0, 0, 0, 0));
}

/* The float steps of the 32-value families' dot loops (FAMILY_DOT in
 * quant32_avx2.c and quant32_avx512.c), over blocks x[0..3] / y[0..3] (STEP4)
 * or x[0] / y[0] (STEP1), d the products of the scales and isum the exact
 * sums. Against Q8_0: s = fma(d, isum, s); against Q8_1 (Q4_1, Q5_1):
 * s = s + fma(d, isum, m * ys). */
#define KERN_Q_STEP4(acc, d, isum, xb, yb) kern_q_fma4(acc, d, isum)
#define KERN_Q_STEP1(acc, d, isum, xb, yb) fmaf(d, isum, acc)
#define KERN_Q1_STEP4(acc, d, isum, xb, yb)                                                        \
    kern_q1_add4(acc, d, isum,                                                                     \
                 _mm_mul_ps(kern_f16x4((xb)[0].m, (xb)[1].m, (xb)[2].m, (xb)[3].m),                \
                            kern_f16x4((yb)[0].s, (yb)[1].s, (yb)[2].s, (yb)[3].s)))
#define KERN_Q1_STEP1(acc, d, isum, xb, yb)                                                        \
    ((acc) + fmaf(d, isum, f16_load((xb)->m) * f16_load((yb)->s)))

/* The Q family's dot loop (kern_impl.h, quant32.h: one float accumulator,
 * each block's integer sum exact, blocks in order), the body of every
 * SIMD vec_dot(n, s, vx, vy) of that family: blocks x (XT) against y (YT)
 * four at a time, sumf = STEP4(sumf, x + b, y + b, ...), then one at a time
 * through STEP1 the same way; the trailing arguments go to both steps. */
#define KERN_Q_DOT(XT, YT, STEP4, STEP1, ...)                                                      \
    const XT *x = vx;                                                                              \
    const YT *y = vy;                                                                              \
    const int64_t nb = n / 32;                                                                     \
    float sumf = 0;                                                                                \
    int64_t b = 0;                                                                                 \
    for (; b + 4 <= nb; b += 4) sumf = STEP4(sumf, x + b, y + b, ##__VA_ARGS__);                   \
    for (; b < nb; b++) sumf = STEP1(sumf, x + b, y + b, ##__VA_ARGS__);                           \
    *s = sumf

/* The K family's dot loop (kern_impl.h: one float accumulator, super-blocks
 * in order), the body of a vec_dot(n, s, vx, vy) against Q8_K: sumf =
 * STEP(sumf, x + b, y + b) for super-block b of x (XT). */
#define KERN_K_DOT(XT, STEP)                                                                       \
    const XT *x = vx;                                                                              \
    const blk_q8_K *y = vy;                                                                        \
    float sumf = 0;                                                                                \
    for (int64_t b = 0; b < n / QK_K; b++) sumf = STEP(sumf, x + b, y + b);                        \
    *s = sumf

/* The float steps of a K-family super-block with mins (Q2_K, Q4_K, Q5_K;
 * kern_impl.h): s = fma(d * yd, sumi, s), then s = fma(-(dmin * yd), summ, s). */
T_AVX2_INLINE float kern_k_fma_min(float s, kvl_f16 d, kvl_f16 dmin, float yd, int32_t sumi,
                                   int32_t summ) {
    const float dall = f16_load(d) * yd, dm = f16_load(dmin) * yd;
    s = fmaf(dall, (float)sumi, s);
    return fmaf(-dm, (float)summ, s);
}

/* The AVX2 step of a Q4_K (qh NULL) or Q5_K super-block (quant_avx2.c,
 * quant_kx_avx2.c): its 8 scales and mins from the 12-byte packing, sumi =
 * sum_j sc_j * the dot of group j's 32 values (the low / high nibbles of
 * qs[32c..] for j = 2c / 2c + 1, with Q5_K's bit j of qh[l] as bit 4) with
 * q8, summ = sum_j mn_j * (bsums[2j] + bsums[2j+1]), then kern_k_fma_min (d
 * and dmin read there, last: as values the compiler held them in registers
 * through the loop, 1% more instructions). */
T_AVX2_INLINE float kern_q45k_step(float sumf, const uint8_t *scales, const uint8_t *qs,
                                   const uint8_t *qh, const kvl_f16 *d, const kvl_f16 *dmin,
                                   const blk_q8_K *y) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) kern_q4k_scale_min(j, scales, &sc[j], &mn[j]);
    const __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) {
            const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(h, 2 * c), one);
            const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(h, 2 * c + 1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
        }
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c));
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32));
        const __m256i p0 =
            _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * c]));
        const __m256i p1 =
            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(sc[2 * c + 1]));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
    }
    const int32_t sumi = kern_hsum8_i32(acc);
    const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    const __m256i m2 = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    const int32_t summ =
        kern_hsum8_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), m2));
    return kern_k_fma_min(sumf, *d, *dmin, y->d, sumi, summ);
}

/* The exact int32 sums of 4 blocks' 8-lane vectors, as [s0, s1, s2, s3]. */
T_AVX2_INLINE __m128i kern_hsum4x8_i32(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* KERN_Q_DOT's AVX2 steps: LANES(x, y) gives block x's 8 int32 lane sums
 * against y (exact), D4(x, y) the d_x * d_y of 4 blocks and D1 of one
 * (KERN_F16_D4 / D1 for fp16 scales), STEP is KERN_Q_STEP or KERN_Q1_STEP. */
#define KAVX2_Q_STEP4(acc, x, y, LANES, D4, D1, STEP)                                              \
    ({                                                                                             \
        const __m128i isum_ = kern_hsum4x8_i32(LANES(x, y), LANES((x) + 1, (y) + 1),               \
                                               LANES((x) + 2, (y) + 2), LANES((x) + 3, (y) + 3));  \
        const __m128 d_ = D4(x, y);                                                                \
        STEP##4(acc, d_, isum_, x, y);                                                             \
    })
#define KAVX2_Q_STEP1(acc, x, y, LANES, D4, D1, STEP)                                              \
    STEP##1(acc, D1(x, y), (float)kern_hsum8_i32(LANES(x, y)), x, y)
#define KERN_F16_D4(x, y)                                                                          \
    _mm_mul_ps(kern_f16x4((x)[0].d, (x)[1].d, (x)[2].d, (x)[3].d),                                 \
               kern_f16x4((y)[0].d, (y)[1].d, (y)[2].d, (y)[3].d))
#define KERN_F16_D1(x, y) (f16_load((x)->d) * f16_load((y)->d))

/* 8 int32 lane sums of u * y, u unsigned (0..255), y signed: no int16
 * saturation where |u * y| + |u' * y'| <= 32767, true for every caller. */
T_AVX2_INLINE __m256i kern_dot_u8s8(__m256i u, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
}

/* The largest of 8 lanes. */
T_AVX2_INLINE float kern_hmax8_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The 32 floats of a block at x into v[0..3], and their largest magnitude
 * (the first step of the Q8_0 and Q8_1 activation quantizers). */
T_AVX2_INLINE float kern_load32_amax(const float *x, __m256 *v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    return kern_hmax8_ps(amax);
}

/* 32 int32 (four vectors, in order) -> 32 int8 with signed saturation. */
T_AVX2_INLINE __m256i kern_pack32_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    /* the packs work per 128-bit lane: restore element order */
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Two 8-lane int32 vectors reduced together: {sum a, sum b} (exact). */
T_AVX2_INLINE void kern_hsum2_i32(__m256i a, __m256i b, int32_t *sa, int32_t *sb) {
    const __m256i h = _mm256_hadd_epi32(a, b); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_hadd_epi32(s, s);
    *sa = _mm_cvtsi128_si32(s);
    *sb = _mm_extract_epi32(s, 1);
}

/* Q4_K / Q5_K scales and mins as bytes: sc[0..7] in the low 8 bytes, mins in
 * the high 8 (the 12-byte packing of kern_q4k_scale_min, 4 bytes at a time). */
T_AVX2_INLINE __m128i kern_q4k_scales_mins(const uint8_t *s) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint32_t sc_lo = w0 & 0x3f3f3f3f, mn_lo = w1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0f) | (((w0 >> 6) & 0x03030303) << 4);
    const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0f) | (((w1 >> 6) & 0x03030303) << 4);
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
}

/* The 32 nibbles of a 32-element block's 16 bytes in element order: [low
 * nibbles | high nibbles] (Q4_1, Q5_0, Q5_1, IQ4_NL). */
T_AVX2_INLINE __m256i kern_nibbles32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* The integer levels of 16 values of a 4-/5-bit cache block (Q4_0, Q5_0,
 * IQ4_NL: 32 values, nibble j in byte j % 16, the low half first), from value
 * p (0 or 16), as int8 in the 16 bytes: what their to_float multiplies by the
 * block's scale. Also 8 of them (the low 8 bytes) from p = 0, 8, 16 or 24. */
T_AVX2_INLINE __m128i kv_block_levels(int t, const void *blk, int p) {
    const uint8_t *qs =
        t == GGUF_DT_Q5_0 ? ((const blk_q5_0 *)blk)->qs : ((const blk_q4_0 *)blk)->qs;
    __m128i x = _mm_loadu_si128((const __m128i *)qs); /* 16 bytes: both halves */
    if (p >= 16) x = _mm_srli_epi16(x, 4);
    x = _mm_and_si128(x, _mm_set1_epi8(15));
    if (p % 16) x = _mm_srli_si128(x, 8); /* values p .. p + 7: bytes 8.. */
    if (t == GGUF_DT_Q4_0) return _mm_sub_epi8(x, _mm_set1_epi8(8));
    if (t == GGUF_DT_IQ4_NL)
        return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)kern_iq4nl_values), x);
    uint32_t qh; /* Q5_0: bit j of qh is bit 4 of value j */
    memcpy(&qh, ((const blk_q5_0 *)blk)->qh, 4);
    const __m128i bits = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    const uint32_t h = qh >> p; /* the 16 (or 8) values' bits from bit 0 */
    __m128i hb =
        _mm_setr_epi8((char)h, (char)h, (char)h, (char)h, (char)h, (char)h, (char)h, (char)h,
                      (char)(h >> 8), (char)(h >> 8), (char)(h >> 8), (char)(h >> 8),
                      (char)(h >> 8), (char)(h >> 8), (char)(h >> 8), (char)(h >> 8));
    hb = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hb, bits), bits), _mm_set1_epi8(16));
    return _mm_sub_epi8(_mm_or_si128(x, hb), _mm_set1_epi8(16));
}

/* An IQ4_NL block's values (the levels of kern_iq4nl_values) as level + 128,
 * unsigned bytes 1..241. */
T_AVX2_INLINE __m256i kern_iq4nl_u8(const uint8_t *qs) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)kern_iq4nl_values), _mm_set1_epi8((char)0x80)));
    return _mm256_shuffle_epi8(table, kern_nibbles32(qs));
}

/* kern_expf on 8 lanes, the same steps (max/min return -87 and 0 for NaN,
 * as the scalar comparisons do). Per-ISA twin of kern_exp16_ps: not shared,
 * since the two differ only in vector type and intrinsic names. */
T_AVX2_INLINE __m256 kern_exp8_ps(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    x = _mm256_min_ps(x, _mm256_setzero_ps());
    const __m256 magic = _mm256_set1_ps(KERN_EXP_MAGIC);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(KERN_EXP_LOG2E), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-KERN_EXP_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-KERN_EXP_C2), r);
    __m256 p = _mm256_set1_ps(KERN_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERN_EXP_P5));
    const __m256 y =
        _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i eb = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000)),
                         _mm256_set1_epi32(127)),
        23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(eb));
}

/* ---- AVX-512 F/BW/VL + VNNI ---- */

/* The exact sums of 4 blocks from two dpbusd results a = [b0: 8 lanes | b1: 8
 * lanes] and c = [b2 | b3], as [s0, s1, s2, s3]. */
/* Bit j of a Q5_0 / Q5_1 block's 32-bit qh as 0x10 in byte j (value j's fifth bit). */
T_512_INLINE __m256i kern_q5_high_bits(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(0x10));
}

T_512_INLINE __m128i kern_red4_i32(__m512i a, __m512i c) {
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

/* The first n of 16 lanes (n may be <= 0 or >= 16). */
T_512_INLINE __mmask16 kern_mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* 16 elements of a row of F32, F16 or BF16 (t) from element i, widened to
 * float exactly; lanes outside m read as 0 and touch no memory. */
T_512_INLINE __m512 kern_load16_ps(int t, const void *p, int64_t i, __mmask16 m) {
    switch (t) {
    case GGUF_DT_F32: return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    case GGUF_DT_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const kvl_f16 *)p + i));
    default:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const kvl_bf16 *)p + i)), 16));
    }
}

/* kern_reduce16 of one vector: lane i + lane i+8, then kern_hsum8_ps. */
T_512_INLINE float kern_hsum16_ps(__m512 v) {
    return kern_hsum8_ps(
        _mm256_add_ps(_mm512_castps512_ps256(v),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

/* Level 1 and 2 of the transposed reduction: a, b -> [a lanes i + i+8 | b ...]. */
T_512_INLINE __m512 kern_fold8_ps(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
T_512_INLINE __m512 kern_fold4_ps(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

/* The rest of kern_reduce16x16_ps from its first level: a[i] holds s1 (lane
 * l + lane l+8, l < 8) of sum 2i in lanes 0..7 and of sum 2i+1 in lanes 8..15. */
T_512_INLINE __m512 kern_reduce16x16_s1_ps(const __m512 *a) {
    __m512 b[4], c[2];
    UNROLL(4)
    for (int i = 0; i < 4; i++)
        b[i] = kern_fold4_ps(a[2 * i], a[2 * i + 1]); /* quarter p: s2 of position 4i+p */
    UNROLL(2)
    for (int i = 0; i < 2; i++) /* s3: quarter q holds positions 8i+q, 8i+q+4 */
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]),
                                                                 _mm512_castps_pd(b[2 * i + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]),
                                                                 _mm512_castps_pd(b[2 * i + 1]))));
    /* quarter q: positions q, q+4, q+8, q+12 */
    const __m512 r =
        _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
    /* position j = q + 4r sits in lane 4q + r */
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* kern_reduce16 of 16 vectors at once (a transpose-and-add whose tree per vector is
 * kern_reduce16's): v[j] holds the 16 lanes of sum j; returns the 16 sums, sum j in lane j. */
T_512_INLINE __m512 kern_reduce16x16_ps(const __m512 *v) {
    __m512 a[8];
    UNROLL(8)
    for (int i = 0; i < 8; i++)
        a[i] = kern_fold8_ps(v[2 * i], v[2 * i + 1]); /* s1: lanes i + i+8 */
    return kern_reduce16x16_s1_ps(a);
}

/* Sum of 16 int32 lanes (exact). */
T_512_INLINE int32_t kern_hsum16_i32(__m512i v) {
    return kern_hsum8_i32(
        _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

/* kern_expf on 16 lanes, the same steps as kern_exp8_ps (its per-ISA twin:
 * not shared, since the two differ only in vector type and intrinsic names). */
T_512_INLINE __m512 kern_exp16_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    x = _mm512_min_ps(x, _mm512_setzero_ps());
    const __m512 magic = _mm512_set1_ps(KERN_EXP_MAGIC);
    const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(KERN_EXP_LOG2E), magic);
    const __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-KERN_EXP_C1), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-KERN_EXP_C2), r);
    __m512 p = _mm512_set1_ps(KERN_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERN_EXP_P5));
    const __m512 y =
        _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i eb = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)),
                         _mm512_set1_epi32(127)),
        23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(eb));
}

#endif
