/* kernels: AVX-512 (F, BW, VL, VNNI) implementations of the dot products.
 *
 * Same contract as quant_avx2.c: per-function target attributes, selected at
 * run time, bit-identical to the scalar reference (orders in kern_impl.h).
 * Q family: one zmm holds two blocks, so accumulator zmm0 = lanes of blocks
 * b%4 = 0,1 and zmm1 = b%4 = 2,3; their sum is already the (A0+A2 | A1+A3)
 * step of kern_reduce32. */
#include "kern_impl.h"

#include <immintrin.h>
#include <string.h>

#define T_512_FLAGS "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define T_512 __attribute__((target(T_512_FLAGS)))
#define T_512_INLINE static inline __attribute__((always_inline, target(T_512_FLAGS)))

/* Complete unrolling of a short loop, so arrays of vectors indexed by its
 * counter stay in registers instead of going through the stack. */
#define KERN_PRAGMA(x) _Pragma(#x)
#define UNROLL(n) KERN_PRAGMA(GCC unroll n)

T_512_INLINE float f16_load(kvl_f16 h) { return _cvtsh_ss(h); }

/* kern_h8 on 8 lanes. */
T_512_INLINE float h8_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 lanes: lane i + lane i+8, then kern_h8. */
T_512_INLINE float h16_ps(__m512 v) {
    return h8_ps(_mm256_add_ps(_mm512_castps512_ps256(v),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

T_512_INLINE int32_t hsum_i32_256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

T_512_INLINE int32_t hsum_i32_512(__m512i v) {
    return hsum_i32_256(
        _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

/* ======================= FP family ======================= */

enum fp_kind { FP_F32, FP_F16, FP_BF16 };

/* 16 elements from element i, widened to float; lanes outside `k` read as 0
 * and touch no memory. */
T_512_INLINE __m512 fp_load16(enum fp_kind kind, const void *p, int64_t i, __mmask16 k) {
    switch (kind) {
    case FP_F32: return _mm512_maskz_loadu_ps(k, (const float *)p + i);
    case FP_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const kvl_f16 *)p + i));
    default:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, (const kvl_bf16 *)p + i)), 16));
    }
}

T_512_INLINE __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* acc += x*y on the lanes of group g (16 elements from i + 16g) that are below n;
 * other lanes keep their value, as in the reference. */
T_512_INLINE __m512 fp_tail(enum fp_kind kind, const void *x, const void *y, int64_t i, int64_t n,
                            int g, __m512 acc) {
    const __mmask16 k = tail_mask(n - i - 16 * g);
    return _mm512_mask3_fmadd_ps(fp_load16(kind, x, i + 16 * g, k),
                                 fp_load16(kind, y, i + 16 * g, k), acc, k);
}

/* 64 lanes as 4 named zmm accumulators (kept in registers). */
T_512_INLINE float fp_dot(enum fp_kind kind, int64_t n, const void *x, const void *y) {
    const __mmask16 all = 0xFFFF;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + KERN_FP_LANES <= n; i += KERN_FP_LANES) {
        a0 = _mm512_fmadd_ps(fp_load16(kind, x, i, all), fp_load16(kind, y, i, all), a0);
        a1 = _mm512_fmadd_ps(fp_load16(kind, x, i + 16, all), fp_load16(kind, y, i + 16, all), a1);
        a2 = _mm512_fmadd_ps(fp_load16(kind, x, i + 32, all), fp_load16(kind, y, i + 32, all), a2);
        a3 = _mm512_fmadd_ps(fp_load16(kind, x, i + 48, all), fp_load16(kind, y, i + 48, all), a3);
    }
    if (i < n) {
        a0 = fp_tail(kind, x, y, i, n, 0, a0);
        a1 = fp_tail(kind, x, y, i, n, 1, a1);
        a2 = fp_tail(kind, x, y, i, n, 2, a2);
        a3 = fp_tail(kind, x, y, i, n, 3, a3);
    }
    return h16_ps(_mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
}

T_512 void kavx512_vec_dot_f32(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(FP_F32, n, x, y);
}
T_512 void kavx512_vec_dot_f16(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(FP_F16, n, x, y);
}
T_512 void kavx512_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(FP_BF16, n, x, y);
}

/* ======================= Q family ======================= */

/* Scale vector for a block pair: d0 in lanes 0..7, d1 in lanes 8..15. */
T_512_INLINE __m512 pair_scale(float d0, float d1) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(d0), 0xFF00, _mm_set_ss(d1));
}

T_512_INLINE __m512i load_pair256(const void *p0, const void *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* Expands 4 block scales d[0..3] into the pair vectors [d0 x8 | d1 x8] and
 * [d2 x8 | d3 x8]. */
T_512_INLINE void quad_scales(__m128 d, __m512 *d01, __m512 *d23) {
    const __m512 w = _mm512_castps128_ps512(d);
    *d01 =
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), w);
    *d23 =
        _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), w);
}

/* The fp16 scales of 4 consecutive Q8_0 blocks (34 bytes apart: words 0 and 17
 * of two 64-byte loads), as floats. Loads stay inside the 4 blocks. */
T_512_INLINE __m128 q8_0_quad_d(const blk_q8_0 *p) {
    const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 2);
    const __m512i idx = _mm512_setr_epi32(0x00110000, 0x00310020, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, 0); /* words 0, 17, 32+0, 32+17 */
    return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(a, idx, b)));
}

/* Blocks b (low half) and b+1 (high half, absent when !two) into acc. */
T_512_INLINE __m512 q8_0_step(__m512 acc, const blk_q8_0 *x, const blk_q8_0 *y, bool two) {
    const blk_q8_0 *x1 = two ? &x[1] : &x[0], *y1 = two ? &y[1] : &y[0];
    const __m512i xv = load_pair256(x[0].qs, x1->qs), yv = load_pair256(y[0].qs, y1->qs);
    /* |x| times y with x's sign; |-128| reads as unsigned 128 */
    const __m512i sy =
        _mm512_mask_sub_epi8(yv, _mm512_movepi8_mask(xv), _mm512_setzero_si512(), yv);
    const __m512 f =
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(xv), sy));
    const float d0 = f16_load(x[0].d) * f16_load(y[0].d);
    if (!two) return _mm512_mask3_fmadd_ps(_mm512_set1_ps(d0), f, acc, 0x00FF);
    return _mm512_fmadd_ps(pair_scale(d0, f16_load(x1->d) * f16_load(y1->d)), f, acc);
}

/* int32 lane sums of x*y for a Q8_0 block pair given |x| and x's sign mask. */
T_512_INLINE __m512 q8_0_pair_dot(__m512i ax, __mmask64 neg, const blk_q8_0 *y) {
    const __m512i yv = load_pair256(y[0].qs, y[1].qs);
    const __m512i sy = _mm512_mask_sub_epi8(yv, neg, _mm512_setzero_si512(), yv);
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
}

/* Canonical Q order: block b into acc0 (b%4 = 0,1) or acc1 (2,3), see top. */
T_512 void kavx512_vec_dot_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const blk_q8_0 *x = vx, *y = vy;
    const int64_t nb = n / QK8_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const __m512i x01 = load_pair256(x[b].qs, x[b + 1].qs);
        const __m512i x23 = load_pair256(x[b + 2].qs, x[b + 3].qs);
        __m512 d01, d23;
        quad_scales(_mm_mul_ps(q8_0_quad_d(x + b), q8_0_quad_d(y + b)), &d01, &d23);
        acc0 = _mm512_fmadd_ps(
            d01, q8_0_pair_dot(_mm512_abs_epi8(x01), _mm512_movepi8_mask(x01), y + b), acc0);
        acc1 = _mm512_fmadd_ps(
            d23, q8_0_pair_dot(_mm512_abs_epi8(x23), _mm512_movepi8_mask(x23), y + b + 2), acc1);
    }
    if (b < nb) acc0 = q8_0_step(acc0, x + b, y + b, nb - b >= 2);
    if (b + 2 < nb) acc1 = q8_0_step(acc1, x + b + 2, y + b + 2, false);
    *s = h16_ps(_mm512_add_ps(acc0, acc1));
}

/* Nibbles of two Q4_0 blocks as bytes 0..15, in the order of their Q8_0 partners:
 * [lo(x0) | hi(x0) | lo(x1) | hi(x1)], 16 bytes each. */
T_512_INLINE __m512i q4_0_pair_nibbles(const blk_q4_0 *x0, const blk_q4_0 *x1) {
    const __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)x1->qs),
                                       _mm_loadu_si128((const __m128i *)x0->qs));
    const __m512i dup = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                                 _mm512_castsi256_si512(q));
    const __m512i sh = _mm512_srlv_epi64(dup, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(sh, _mm512_set1_epi8(0x0F));
}

/* The same arrangement from a 64-byte load that starts at a block (its qs at
 * words 1..8, the next block's at words 10..17). */
T_512_INLINE __m512i q4_0_nibbles_from(__m512i v) {
    const __m512i idx =
        _mm512_setr_epi32(0x00020001, 0x00040003, 0x00060005, 0x00080007, 0x00020001, 0x00040003,
                          0x00060005, 0x00080007, 0x000B000A, 0x000D000C, 0x000F000E, 0x00110010,
                          0x000B000A, 0x000D000C, 0x000F000E, 0x00110010);
    const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                         0x0004000400040004LL, 0x0004000400040004LL);
    return _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi16(idx, v), sh),
                            _mm512_set1_epi8(0x0F));
}

/* int32 lane sums of (u - 8) * y for a block pair, as u*y - 8*y, as floats. */
T_512_INLINE __m512 q4_0_pair_dot(__m512i u, const blk_q8_0 *y0, const blk_q8_0 *y1) {
    const __m512i yv = load_pair256(y0->qs, y1->qs);
    const __m512i uy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, yv);
    const __m512i ey = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), yv);
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(uy, ey));
}

T_512_INLINE __m512 q4_0_step(__m512 acc, const blk_q4_0 *x, const blk_q8_0 *y, bool two) {
    const blk_q4_0 *x1 = two ? &x[1] : &x[0];
    const blk_q8_0 *y1 = two ? &y[1] : &y[0];
    const __m512 f = q4_0_pair_dot(q4_0_pair_nibbles(&x[0], x1), &y[0], y1);
    const float d0 = f16_load(x[0].d) * f16_load(y[0].d);
    if (!two) return _mm512_mask3_fmadd_ps(_mm512_set1_ps(d0), f, acc, 0x00FF);
    return _mm512_fmadd_ps(pair_scale(d0, f16_load(x1->d) * f16_load(y1->d)), f, acc);
}

/* The fp16 scales of Q4_0 blocks b..b+3 (words 0, 9, 18, 27 of a load at x[b]). */
T_512_INLINE __m128 q4_0_quad_d(__m512i va) {
    const __m512i idx =
        _mm512_setr_epi32(0x00090000, 0x001B0012, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(idx, va)));
}

/* Four Q4_0 blocks are 72 bytes: one full 64-byte load from x[b] holds the four
 * scales and the first two blocks, a 36-byte masked load from x[b+2] the rest. */
#define Q4_0_TAIL_MASK 0xFFFFFFFFFULL

T_512 void kavx512_vec_dot_q4_0(int64_t n, float *s, const void *vx, const void *vy) {
    const blk_q4_0 *x = vx;
    const blk_q8_0 *y = vy;
    const int64_t nb = n / QK4_0;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const __m512i va = _mm512_loadu_si512(x + b);
        const __m512i vb = _mm512_maskz_loadu_epi8(Q4_0_TAIL_MASK, x + b + 2);
        __m512 d01, d23;
        quad_scales(_mm_mul_ps(q4_0_quad_d(va), q8_0_quad_d(y + b)), &d01, &d23);
        acc0 = _mm512_fmadd_ps(d01, q4_0_pair_dot(q4_0_nibbles_from(va), &y[b], &y[b + 1]), acc0);
        acc1 =
            _mm512_fmadd_ps(d23, q4_0_pair_dot(q4_0_nibbles_from(vb), &y[b + 2], &y[b + 3]), acc1);
    }
    if (b < nb) acc0 = q4_0_step(acc0, x + b, y + b, nb - b >= 2);
    if (b + 2 < nb) acc1 = q4_0_step(acc1, x + b + 2, y + b + 2, false);
    *s = h16_ps(_mm512_add_ps(acc0, acc1));
}

/* ======================= rows kernels ======================= */

/* Activation row r of a rows call. */
#define YROW(type, y, ys, r) ((const type *)((const char *)(y) + (size_t)(r) * (ys)))

/* Every *rows function below computes s[r*ss] = dot(x, row r of y) for
 * 0 <= r < nr <= KERN_ROWS_MAX: the weights are decoded once and each row then
 * does exactly the operations of a single-row call, so results match vec_dot
 * bit for bit (the K-quant vec_dots are the nr = 1 case). nr is a constant
 * after inlining, so the per-row loops unroll into registers. */
#define ROWS_SWITCH(fn, n, s, ss, x, y, ys, nr)                                                    \
    do {                                                                                           \
        switch (nr) {                                                                              \
        case 1: fn(n, s, ss, x, y, ys, 1); break;                                                  \
        case 2: fn(n, s, ss, x, y, ys, 2); break;                                                  \
        case 3: fn(n, s, ss, x, y, ys, 3); break;                                                  \
        default: fn(n, s, ss, x, y, ys, KERN_ROWS_MAX); break;                                     \
        }                                                                                          \
    } while (0)

/* Fully unrolls a loop over the rows (nr <= KERN_ROWS_MAX is a constant there)
 * so the per-row accumulators live in registers. */
#define ROWS_LOOP UNROLL(4)

/* ============ Q family on prepared activations (matmul only) ============
 * kern_q8p_row_bytes describes the layout: the Q8_0 quantization of the row
 * split into its int8 values, its scales as floats, and per block the 8 int32
 * lanes off = -c * (sum of 4 values), c = 8 for Q4_0 weights (nibbles are
 * stored +8) and 128 for Q8_0 weights (read as x ^ 0x80 = x + 128). The lane
 * sums then come from one dpbusd started at `off`: the same exact integers as
 * above, and the same float steps, so the results equal vec_dot's. */

/* Pointers into a prepared row of nb blocks (byte offsets: loads are unaligned). */
typedef struct {
    const int8_t *qs;
    const char *d, *off;
} q8p_row;

T_512_INLINE q8p_row q8p_at(const void *row, int64_t nb) {
    const char *p = row;
    return (q8p_row){(const int8_t *)p, p + QK8_0 * nb, p + (QK8_0 + 4) * nb};
}

T_512_INLINE void q8p_prepare(const float *x, void *dst, int64_t k, int c) {
    const int64_t nb = k / QK8_0;
    char *p = dst;
    for (int64_t b = 0; b < nb; b++) {
        blk_q8_0 t;
        kavx2_from_float_q8_0(x + b * QK8_0, &t, QK8_0); /* same bytes as every Q8_0 quantizer */
        memcpy(p + b * QK8_0, t.qs, QK8_0);
        const float d = f16_load(t.d);
        memcpy(p + QK8_0 * nb + 4 * b, &d, 4);
        int32_t off[8];
        for (int l = 0; l < 8; l++)
            off[l] = -c * (t.qs[4 * l] + t.qs[4 * l + 1] + t.qs[4 * l + 2] + t.qs[4 * l + 3]);
        memcpy(p + (QK8_0 + 4) * nb + 32 * b, off, sizeof off);
    }
}

T_512 void kavx512_prepare_q4_0(const float *x, void *dst, int64_t k) { q8p_prepare(x, dst, k, 8); }
T_512 void kavx512_prepare_q8_0(const float *x, void *dst, int64_t k) {
    q8p_prepare(x, dst, k, 128);
}

/* acc += d * lanes for blocks b, b+1 (or b alone: low half only, nothing read
 * past block b) of a prepared row; u holds the matching unsigned weights. */
T_512_INLINE __m512 q8p_step(__m512 acc, __m512i u, float dx0, float dx1, q8p_row y, int64_t b,
                             bool two) {
    const __mmask16 k16 = two ? 0xFFFF : 0x00FF;
    const __m512i yv = _mm512_maskz_loadu_epi32(k16, y.qs + QK8_0 * b);
    const __m512i off = _mm512_maskz_loadu_epi32(k16, y.off + 32 * b);
    const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(off, u, yv));
    float dy[2];
    memcpy(dy, y.d + 4 * b, two ? 8 : 4);
    if (!two) return _mm512_mask3_fmadd_ps(_mm512_set1_ps(dx0 * dy[0]), f, acc, 0x00FF);
    return _mm512_fmadd_ps(pair_scale(dx0 * dy[0], dx1 * dy[1]), f, acc);
}

/* Blocks b..b+3 of all rows: acc0 (b, b+1) and acc1 (b+2, b+3). */
T_512_INLINE void q8p_quad(__m512 *acc0, __m512 *acc1, __m128 dx, __m512i u01, __m512i u23,
                           const q8p_row *y, int64_t b, int nr) {
    ROWS_LOOP
    for (int r = 0; r < nr; r++) {
        __m512 d01, d23;
        quad_scales(_mm_mul_ps(dx, _mm_loadu_ps((const float *)(y[r].d + 4 * b))), &d01, &d23);
        const __m512i i01 = _mm512_dpbusd_epi32(_mm512_loadu_si512(y[r].off + 32 * b), u01,
                                                _mm512_loadu_si512(y[r].qs + QK8_0 * b));
        const __m512i i23 = _mm512_dpbusd_epi32(_mm512_loadu_si512(y[r].off + 32 * b + 64), u23,
                                                _mm512_loadu_si512(y[r].qs + QK8_0 * b + 64));
        acc0[r] = _mm512_fmadd_ps(d01, _mm512_cvtepi32_ps(i01), acc0[r]);
        acc1[r] = _mm512_fmadd_ps(d23, _mm512_cvtepi32_ps(i23), acc1[r]);
    }
}

/* Q4_0 weights: nibbles as stored (0..15). */
T_512_INLINE void q4_0_prows(int64_t n, float *s, size_t ss, const void *vx, const void *y,
                             size_t ys, int nr) {
    const blk_q4_0 *x = vx;
    const int64_t nb = n / QK4_0;
    q8p_row yr[KERN_ROWS_MAX];
    __m512 acc0[KERN_ROWS_MAX], acc1[KERN_ROWS_MAX];
    ROWS_LOOP
    for (int r = 0; r < nr; r++) {
        yr[r] = q8p_at((const char *)y + r * ys, nb);
        acc0[r] = acc1[r] = _mm512_setzero_ps();
    }
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const __m512i va = _mm512_loadu_si512(x + b);
        const __m512i vb = _mm512_maskz_loadu_epi8(Q4_0_TAIL_MASK, x + b + 2);
        q8p_quad(acc0, acc1, q4_0_quad_d(va), q4_0_nibbles_from(va), q4_0_nibbles_from(vb), yr, b,
                 nr);
    }
    const int64_t left = nb - b; /* 0..3: pair or single into acc0, single into acc1 */
    const int64_t b1 = left >= 2 ? b + 1 : b;
    const __m512i u01 = left ? q4_0_pair_nibbles(&x[b], &x[b1]) : _mm512_setzero_si512();
    const __m512i u2 = left == 3 ? q4_0_pair_nibbles(&x[b + 2], &x[b + 2]) : _mm512_setzero_si512();
    ROWS_LOOP
    for (int r = 0; r < nr; r++) {
        if (left)
            acc0[r] =
                q8p_step(acc0[r], u01, f16_load(x[b].d), f16_load(x[b1].d), yr[r], b, left >= 2);
        if (left == 3)
            acc1[r] = q8p_step(acc1[r], u2, f16_load(x[b + 2].d), 0, yr[r], b + 2, false);
        s[r * ss] = h16_ps(_mm512_add_ps(acc0[r], acc1[r]));
    }
}

/* Q8_0 weights: x ^ 0x80 = x + 128 as unsigned bytes. */
T_512_INLINE __m512i q8_0_biased_pair(const blk_q8_0 *x0, const blk_q8_0 *x1) {
    return _mm512_xor_si512(load_pair256(x0->qs, x1->qs), _mm512_set1_epi8((char)0x80));
}

T_512_INLINE void q8_0_prows(int64_t n, float *s, size_t ss, const void *vx, const void *y,
                             size_t ys, int nr) {
    const blk_q8_0 *x = vx;
    const int64_t nb = n / QK8_0;
    q8p_row yr[KERN_ROWS_MAX];
    __m512 acc0[KERN_ROWS_MAX], acc1[KERN_ROWS_MAX];
    ROWS_LOOP
    for (int r = 0; r < nr; r++) {
        yr[r] = q8p_at((const char *)y + r * ys, nb);
        acc0[r] = acc1[r] = _mm512_setzero_ps();
    }
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4)
        q8p_quad(acc0, acc1, q8_0_quad_d(x + b), q8_0_biased_pair(&x[b], &x[b + 1]),
                 q8_0_biased_pair(&x[b + 2], &x[b + 3]), yr, b, nr);
    const int64_t left = nb - b;
    const int64_t b1 = left >= 2 ? b + 1 : b;
    const __m512i u01 = left ? q8_0_biased_pair(&x[b], &x[b1]) : _mm512_setzero_si512();
    const __m512i u2 = left == 3 ? q8_0_biased_pair(&x[b + 2], &x[b + 2]) : _mm512_setzero_si512();
    ROWS_LOOP
    for (int r = 0; r < nr; r++) {
        if (left)
            acc0[r] =
                q8p_step(acc0[r], u01, f16_load(x[b].d), f16_load(x[b1].d), yr[r], b, left >= 2);
        if (left == 3)
            acc1[r] = q8p_step(acc1[r], u2, f16_load(x[b + 2].d), 0, yr[r], b + 2, false);
        s[r * ss] = h16_ps(_mm512_add_ps(acc0[r], acc1[r]));
    }
}

T_512 void kavx512_prows_q4_0(int64_t n, float *s, size_t ss, const void *x, const void *y,
                              size_t ys, int nr) {
    ROWS_SWITCH(q4_0_prows, n, s, ss, x, y, ys, nr);
}
T_512 void kavx512_prows_q8_0(int64_t n, float *s, size_t ss, const void *x, const void *y,
                              size_t ys, int nr) {
    ROWS_SWITCH(q8_0_prows, n, s, ss, x, y, ys, nr);
}

/* ======================= K family ======================= */

/* Q4_K scales and mins as bytes: sc[0..7] in the low 8 bytes, mins in the high 8
 * (the 12-byte packing of kern_q4k_scale_min, done 4 bytes at a time). */
T_512_INLINE __m128i q4k_scales_mins(const uint8_t *s) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint32_t sc_lo = w0 & 0x3f3f3f3f, mn_lo = w1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0f) | (((w0 >> 6) & 0x03030303) << 4);
    const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0f) | (((w1 >> 6) & 0x03030303) << 4);
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
}

/* pshufb control picking int16 scale 2c in 128-bit lanes 0,1 and 2c+1 in 2,3. */
T_512_INLINE __m512i q4k_scale_sel(int c) {
    const long long lo = 0x0100010001000100LL + 0x0404040404040404LL * c;
    const long long hi = lo + 0x0202020202020202LL;
    return _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi);
}

/* Two 8-lane int32 vectors reduced together: returns {sum a, sum b}. */
T_512_INLINE void hsum2_i32(__m256i a, __m256i b, int32_t *sa, int32_t *sb) {
    const __m256i h = _mm256_hadd_epi32(a, b); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_hadd_epi32(s, s);
    *sa = _mm_cvtsi128_si32(s);
    *sb = _mm_extract_epi32(s, 1);
}

/* A decoded Q4_K super-block: chunk c (64 values) as bytes, low nibbles
 * (sub-block 2c) then high (2c+1); the matching int16 scale vectors; the mins
 * duplicated to pair with bsums. */
typedef struct {
    __m512i u[4], sc[4];
    __m256i mdup;
} q4k_dec;

T_512_INLINE void q4k_decode(const blk_q4_K *x, q4k_dec *d) {
    const __m256i sm16 = _mm256_cvtepu8_epi16(q4k_scales_mins(x->scales)); /* sc0..7, m0..7 */
    d->mdup = _mm256_permutexvar_epi16(
        _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), sm16);
    const __m512i sc8 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sm16));
    const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i q =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * c)));
        d->u[c] = _mm512_and_si512(_mm512_srlv_epi64(q, shift), _mm512_set1_epi8(0x0F));
        d->sc[c] = _mm512_shuffle_epi8(sc8, q4k_scale_sel(c));
    }
}

/* sumi = sum_j sc_j * dot(q4, q8) over sub-blocks of 32, summ = sum_j m_j * bsums. */
T_512_INLINE void q4k_dot(const q4k_dec *d, const blk_q8_K *y, int32_t *sumi, int32_t *summ) {
    const __m256i mins = _mm256_madd_epi16(d->mdup, _mm256_loadu_si256((const __m256i *)y->bsums));
    __m512i a0 = _mm512_setzero_si512(), a1 = a0; /* two chains so latencies overlap */
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i p = _mm512_maddubs_epi16(d->u[c], _mm512_loadu_si512(y->qs + 64 * c));
        if (c % 2)
            a1 = _mm512_dpwssd_epi32(a1, p, d->sc[c]);
        else
            a0 = _mm512_dpwssd_epi32(a0, p, d->sc[c]);
    }
    const __m512i a = _mm512_add_epi32(a0, a1);
    hsum2_i32(_mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1)), mins,
              sumi, summ);
}

/* K family: s = fma(d*yd, sumi, s); s = fma(-(dmin*yd), summ, s) per super-block. */
T_512_INLINE void q4_K_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,
                            size_t ys, int nr) {
    const blk_q4_K *x = vx;
    float sumf[KERN_ROWS_MAX] = {0};
    for (int64_t b = 0; b < n / QK_K; b++) {
        q4k_dec dec;
        q4k_decode(&x[b], &dec);
        const float xd = f16_load(x[b].d), xdmin = f16_load(x[b].dmin);
        ROWS_LOOP
        for (int r = 0; r < nr; r++) {
            const blk_q8_K *yr = YROW(blk_q8_K, y, ys, r) + b;
            int32_t sumi, summ;
            q4k_dot(&dec, yr, &sumi, &summ);
            const float dall = xd * yr->d, dmin = xdmin * yr->d;
            sumf[r] = fmaf(dall, (float)sumi, sumf[r]);
            sumf[r] = fmaf(-dmin, (float)summ, sumf[r]);
        }
    }
    ROWS_LOOP
    for (int r = 0; r < nr; r++) s[r * ss] = sumf[r];
}

T_512 void kavx512_vec_dot_q4_K(int64_t n, float *s, const void *x, const void *y) {
    q4_K_rows(n, s, 0, x, y, 0, 1);
}
T_512 void kavx512_rows_q4_K(int64_t n, float *s, size_t ss, const void *x, const void *y,
                             size_t ys, int nr) {
    ROWS_SWITCH(q4_K_rows, n, s, ss, x, y, ys, nr);
}

/* Index vector selecting int16 scales 4c..4c+3, each for 8 consecutive lanes. */
T_512_INLINE __m512i q6k_scale_idx(int c) {
    const __m512i quarter =
        _mm512_setr_epi64(0, 0, 0x0001000100010001LL, 0x0001000100010001LL, 0x0002000200020002LL,
                          0x0002000200020002LL, 0x0003000300030003LL, 0x0003000300030003LL);
    return _mm512_add_epi16(quarter, _mm512_set1_epi16((short)(4 * c)));
}

/* A decoded Q6_K super-block: chunk c (64 values) as unsigned bytes q6 + 32,
 * the matching int16 scale vectors, and the 16 scales for the bsums term. */
typedef struct {
    __m512i u[4], sc[4];
    __m256i sc16;
} q6k_dec;

T_512_INLINE void q6k_decode(const blk_q6_K *x, q6k_dec *d) {
    d->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m512i sc = _mm512_castsi256_si512(d->sc16);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
    const __m512i hshift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    UNROLL(2)
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(x->ql + 64 * h);
        /* [qh | qh >> 2]: the 2-bit fields of quarters 0,1 at bits 0-1, of 2,3 at bits 4-5;
         * 16-bit shifts leak bits across bytes, the masks drop them */
        const __m512i hh = _mm512_srlv_epi16(
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * h))), hshift);
        d->u[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4),
                                      _mm512_and_si512(_mm512_slli_epi16(hh, 4), m2));
        d->u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                          _mm512_and_si512(hh, m2));
        d->sc[2 * h] = _mm512_permutexvar_epi16(q6k_scale_idx(2 * h), sc);
        d->sc[2 * h + 1] = _mm512_permutexvar_epi16(q6k_scale_idx(2 * h + 1), sc);
    }
}

/* sum_g sc_g * sum_16 (q6 - 32) * q8, with the -32 folded in through bsums. */
T_512_INLINE int32_t q6k_dot(const q6k_dec *d, const blk_q8_K *y) {
    const __m256i bs = _mm256_loadu_si256((const __m256i *)y->bsums);
    const __m256i off = _mm256_sub_epi32(_mm256_setzero_si256(),
                                         _mm256_slli_epi32(_mm256_madd_epi16(d->sc16, bs), 5));
    __m512i acc = _mm512_inserti64x4(_mm512_setzero_si512(), off, 0);
    UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i p = _mm512_maddubs_epi16(d->u[c], _mm512_loadu_si512(y->qs + 64 * c));
        acc = _mm512_dpwssd_epi32(acc, p, d->sc[c]);
    }
    return hsum_i32_512(acc);
}

T_512_INLINE void q6_K_rows(int64_t n, float *s, size_t ss, const void *vx, const void *y,
                            size_t ys, int nr) {
    const blk_q6_K *x = vx;
    float sumf[KERN_ROWS_MAX] = {0};
    for (int64_t b = 0; b < n / QK_K; b++) {
        q6k_dec dec;
        q6k_decode(&x[b], &dec);
        const float xd = f16_load(x[b].d);
        ROWS_LOOP
        for (int r = 0; r < nr; r++) {
            const blk_q8_K *yr = YROW(blk_q8_K, y, ys, r) + b;
            sumf[r] = fmaf(xd * yr->d, (float)q6k_dot(&dec, yr), sumf[r]);
        }
    }
    ROWS_LOOP
    for (int r = 0; r < nr; r++) s[r * ss] = sumf[r];
}

T_512 void kavx512_vec_dot_q6_K(int64_t n, float *s, const void *x, const void *y) {
    q6_K_rows(n, s, 0, x, y, 0, 1);
}
T_512 void kavx512_rows_q6_K(int64_t n, float *s, size_t ss, const void *x, const void *y,
                             size_t ys, int nr) {
    ROWS_SWITCH(q6_K_rows, n, s, ss, x, y, ys, nr);
}
