/* kernels: AVX-512 (F, BW, VL, VNNI) implementations of the dot products.
 *
 * Same contract as quant_avx2.c: per-function target attributes, selected at
 * run time, bit-identical to the scalar reference (orders in kern_impl.h).
 * Q family: one zmm holds two blocks, so accumulator zmm0 = lanes of blocks
 * b%4 = 0,1 and zmm1 = b%4 = 2,3; their sum is already the (A0+A2 | A1+A3)
 * step of kern_reduce32. */
#include "gemm_avx512.h" /* and through it simd.h */

#include <string.h>

/* ======================= FP family ======================= */

/* 16 lanes in one vector (kern_impl.h); lanes past n keep their value. */
T_512_INLINE float fp_dot(int kind, int64_t n, const void *x, const void *y) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + KERN_FP_LANES <= n; i += KERN_FP_LANES)
        acc = _mm512_fmadd_ps(kern_load16_ps(kind, x, i, 0xFFFF),
                              kern_load16_ps(kind, y, i, 0xFFFF), acc);
    if (i < n) {
        const __mmask16 k = kern_mask16(n - i);
        acc = _mm512_mask3_fmadd_ps(kern_load16_ps(kind, x, i, k), kern_load16_ps(kind, y, i, k),
                                    acc, k);
    }
    return kern_hsum16_ps(acc);
}

T_512 void kavx512_vec_dot_f32(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(GGUF_DT_F32, n, x, y);
}
T_512 void kavx512_vec_dot_f16(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(GGUF_DT_F16, n, x, y);
}
T_512 void kavx512_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(GGUF_DT_BF16, n, x, y);
}

/* ======================= Q family ======================= */

/* Two 32-byte blocks' values in one vector. */
T_512_INLINE __m512i load_pair256(const void *p0, const void *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* The fp16 scales of 4 consecutive Q8_0 blocks (34 bytes apart: words 0 and 17
 * of two 64-byte loads), as floats. Loads stay inside the 4 blocks. */
T_512_INLINE __m128 q8_0_quad_d(const blk_q8_0 *p) {
    const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 2);
    const __m512i idx = _mm512_setr_epi32(0x00110000, 0x00310020, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, 0); /* words 0, 17, 32+0, 32+17 */
    return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(a, idx, b)));
}

/* int32 lane sums of x*y for a Q8_0 block pair (signed x times signed y). */
T_512_INLINE __m512i q8_0_pair_isum(__m512i xv, __m512i yv) {
    /* |x| times y with x's sign; |-128| reads as unsigned 128 */
    const __m512i sy =
        _mm512_mask_sub_epi8(yv, _mm512_movepi8_mask(xv), _mm512_setzero_si512(), yv);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(xv), sy);
}

T_512_INLINE int32_t q8_0_block_isum(const blk_q8_0 *x, const blk_q8_0 *y) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256i sy =
        _mm256_mask_sub_epi8(yv, _mm256_movepi8_mask(xv), _mm256_setzero_si256(), yv);
    return kern_hsum8_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(xv), sy));
}

/* KERN_Q_DOT's steps for Q8_0 (KERN_Q_STEP's float steps). Macros: as
 * inline functions they compile to other registers and order. */
#define Q8_0_STEP4(acc, x, y)                                                                      \
    ({                                                                                             \
        const __m512i a_ = q8_0_pair_isum(load_pair256((x)[0].qs, (x)[1].qs),                      \
                                          load_pair256((y)[0].qs, (y)[1].qs));                     \
        const __m512i c_ = q8_0_pair_isum(load_pair256((x)[2].qs, (x)[3].qs),                      \
                                          load_pair256((y)[2].qs, (y)[3].qs));                     \
        kern_q_fma4(acc, _mm_mul_ps(q8_0_quad_d(x), q8_0_quad_d(y)), kern_red4_i32(a_, c_));       \
    })
#define Q8_0_STEP1(acc, x, y)                                                                      \
    fmaf(f16_load((x)->d) * f16_load((y)->d), (float)q8_0_block_isum(x, y), acc)

/* Canonical Q order: one float accumulator, exact block sums (kern_impl.h). */
T_512 void kavx512_vec_dot_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_Q_DOT(blk_q8_0, blk_q8_0, Q8_0_STEP4, Q8_0_STEP1);
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

/* int32 lane sums of (u - 8) * y for a block pair, as u*y - 8*y. */
T_512_INLINE __m512i q4_0_pair_isum(__m512i u, __m512i yv) {
    const __m512i uy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, yv);
    const __m512i ey = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), yv);
    return _mm512_sub_epi32(uy, ey);
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

T_512_INLINE int32_t q4_0_block_isum(const blk_q4_0 *x, const blk_q8_0 *y) {
    const __m512i u = q4_0_pair_nibbles(x, x);
    const __m512i yv = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y->qs));
    const __m512i s = q4_0_pair_isum(u, yv);
    return kern_hsum8_i32(_mm512_castsi512_si256(s));
}

#define Q4_0_STEP4(acc, x, y)                                                                      \
    ({                                                                                             \
        const __m512i va_ = _mm512_loadu_si512(x);                                                 \
        const __m512i vb_ = _mm512_maskz_loadu_epi8(Q4_0_TAIL_MASK, (x) + 2);                      \
        const __m512i a_ =                                                                         \
            q4_0_pair_isum(q4_0_nibbles_from(va_), load_pair256((y)[0].qs, (y)[1].qs));            \
        const __m512i c_ =                                                                         \
            q4_0_pair_isum(q4_0_nibbles_from(vb_), load_pair256((y)[2].qs, (y)[3].qs));            \
        kern_q_fma4(acc, _mm_mul_ps(q4_0_quad_d(va_), q8_0_quad_d(y)), kern_red4_i32(a_, c_));     \
    })
#define Q4_0_STEP1(acc, x, y)                                                                      \
    fmaf(f16_load((x)->d) * f16_load((y)->d), (float)q4_0_block_isum(x, y), acc)

T_512 void kavx512_vec_dot_q4_0(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_Q_DOT(blk_q4_0, blk_q8_0, Q4_0_STEP4, Q4_0_STEP1);
}

/* ======================= rows kernels ======================= */

/* Activation row r of a rows call. */
#define YROW(type, y, ys, r) ((const type *)((const char *)(y) + (size_t)(r) * (ys)))

/* Every *rows function below computes s[r*ss] = dot(x, row r of y) for
 * 0 <= r < nr <= KERN_ROWS_MAX: the weights are decoded once and each row then
 * does exactly the operations of a single-row call, so results match vec_dot
 * bit for bit (the K-quant vec_dots are the nr = 1 case). nr is a constant
 * after inlining (KERN_ROWS_SWITCH), so the per-row loops unroll into registers. */

/* Fully unrolls a loop over the rows (nr <= KERN_ROWS_MAX is a constant there)
 * so the per-row accumulators live in registers. */
#define ROWS_LOOP UNROLL(4)

/* ============ Q family on prepared activations (matmul only) ============
 * kern_q8p_row_bytes describes the layout: the Q8_0 quantization of the row
 * split into its int8 values, its scales as floats, and per block the int32
 * c = -bias * (sum of its 32 values), bias = 8 for Q4_0 weights (nibbles are
 * stored +8) and 128 for Q8_0 weights (read as x ^ 0x80 = x + 128). A block's
 * exact sum is then c plus the dpbusd sums of the unsigned weights: the same
 * integers as vec_dot, and the same float steps. gemm_avx512.c reads the same
 * layout. */

T_512_INLINE void q8p_prepare(const float *x, void *dst, int64_t k, int bias) {
    const int64_t nb = k / QK8_0;
    kern_q8p_row r = kern_q8p_at(dst, nb);
    for (int64_t b = 0; b < nb; b++) {
        blk_q8_0 t;
        kavx2_act_from_float_q8_0(x + b * QK8_0, &t, QK8_0); /* kern_act_quantizer's bytes */
        memcpy((int8_t *)r.qs + QK8_0 * b, t.qs, QK8_0);
        r.d[b] = f16_load(t.d);
        int32_t sum = 0;
        for (int j = 0; j < QK8_0; j++) sum += t.qs[j];
        r.c[b] = -bias * sum;
    }
}

T_512 void kavx512_prepare_q4_0(const float *x, void *dst, int64_t k) { q8p_prepare(x, dst, k, 8); }
T_512 void kavx512_prepare_q8_0(const float *x, void *dst, int64_t k) {
    q8p_prepare(x, dst, k, 128);
}

/* Block sums of 4 blocks (u01, u23: the unsigned weights of blocks b..b+3)
 * against prepared row y, folded into s. */
T_512_INLINE float q8p_quad(float s, __m128 dx, __m512i u01, __m512i u23, kern_q8p_row y,
                            int64_t b) {
    const __m512i a =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), u01, _mm512_loadu_si512(y.qs + QK8_0 * b));
    const __m512i c =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), u23, _mm512_loadu_si512(y.qs + QK8_0 * b + 64));
    const __m128i isum =
        _mm_add_epi32(kern_red4_i32(a, c), _mm_loadu_si128((const __m128i *)(y.c + b)));
    return kern_q_fma4(s, _mm_mul_ps(dx, _mm_loadu_ps(y.d + b)), isum);
}

/* One block (unsigned weights in the low 32 bytes of u). */
T_512_INLINE float q8p_one(float s, float dx, __m512i u, kern_q8p_row y, int64_t b) {
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(u),
                                          _mm256_loadu_si256((const __m256i *)(y.qs + QK8_0 * b)));
    return fmaf(dx * y.d[b], (float)(kern_hsum8_i32(p) + y.c[b]), s);
}

/* Q8_0 weights: x ^ 0x80 = x + 128 as unsigned bytes. */
T_512_INLINE __m512i q8_0_biased_pair(const blk_q8_0 *x0, const blk_q8_0 *x1) {
    return _mm512_xor_si512(load_pair256(x0->qs, x1->qs), _mm512_set1_epi8((char)0x80));
}

/* Blocks b..b+3 of a weight row (Q4_0 if q4, else Q8_0) as unsigned values:
 * Q4_0 nibbles as stored (0..15), Q8_0 biased by 128; and their scales. */
T_512_INLINE void q_quad_u(bool q4, const void *xrow, int64_t b, __m512i *u01, __m512i *u23,
                           __m128 *dx) {
    if (q4) {
        const blk_q4_0 *x = xrow;
        const __m512i va = _mm512_loadu_si512(x + b);
        const __m512i vb = _mm512_maskz_loadu_epi8(Q4_0_TAIL_MASK, x + b + 2);
        *u01 = q4_0_nibbles_from(va), *u23 = q4_0_nibbles_from(vb), *dx = q4_0_quad_d(va);
    } else {
        const blk_q8_0 *x = xrow;
        *u01 = q8_0_biased_pair(&x[b], &x[b + 1]), *u23 = q8_0_biased_pair(&x[b + 2], &x[b + 3]);
        *dx = q8_0_quad_d(x + b);
    }
}

/* Block b alone (in the low 32 bytes of the result), as q_quad_u. */
T_512_INLINE __m512i q_one_u(bool q4, const void *xrow, int64_t b, float *dx) {
    if (q4) {
        const blk_q4_0 *x = xrow;
        *dx = f16_load(x[b].d);
        return q4_0_pair_nibbles(&x[b], &x[b]);
    }
    const blk_q8_0 *x = xrow;
    *dx = f16_load(x[b].d);
    return q8_0_biased_pair(&x[b], &x[b]);
}

T_512_INLINE void q_prows(bool q4, int64_t n, float *s, size_t ss, const void *x, const void *y,
                          size_t ys, int nr) {
    const int64_t nb = n / QK8_0;
    kern_q8p_row yr[KERN_ROWS_MAX];
    float acc[KERN_ROWS_MAX];
    ROWS_LOOP
    for (int r = 0; r < nr; r++) {
        yr[r] = kern_q8p_at((const char *)y + r * ys, nb);
        acc[r] = 0;
    }
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        __m512i u01, u23;
        __m128 dx;
        q_quad_u(q4, x, b, &u01, &u23, &dx);
        ROWS_LOOP
        for (int r = 0; r < nr; r++) acc[r] = q8p_quad(acc[r], dx, u01, u23, yr[r], b);
    }
    for (; b < nb; b++) {
        float dx;
        const __m512i u = q_one_u(q4, x, b, &dx);
        ROWS_LOOP
        for (int r = 0; r < nr; r++) acc[r] = q8p_one(acc[r], dx, u, yr[r], b);
    }
    ROWS_LOOP
    for (int r = 0; r < nr; r++) s[r * ss] = acc[r];
}

/* Four weight rows at once (xr bytes apart, outputs sr apart) against nr
 * prepared rows: four independent fma chains per activation row, so the
 * serial block order of each output does not bound the speed, and one
 * transposed reduction gives the 16 block sums of 4 rows x 4 blocks. */

/* a, c: the dpbusd lanes of blocks 0,1 and 2,3 of one row -> quarter b holds
 * block b's 4 partial sums. */
T_512_INLINE __m512i fold_quarters(__m512i a, __m512i c) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, c, 0x88), _mm512_shuffle_i32x4(a, c, 0xDD));
}

/* s[r] from fold_quarters for rows 0..3 -> quarter b = [row 0..3 sums of block b]. */
T_512_INLINE __m512i sums_4x4(const __m512i *s) {
    const __m512i t01 =
        _mm512_add_epi32(_mm512_unpacklo_epi64(s[0], s[1]), _mm512_unpackhi_epi64(s[0], s[1]));
    const __m512i t23 =
        _mm512_add_epi32(_mm512_unpacklo_epi64(s[2], s[3]), _mm512_unpackhi_epi64(s[2], s[3]));
    const __m512 u = _mm512_shuffle_ps(_mm512_castsi512_ps(t01), _mm512_castsi512_ps(t23), 0x88);
    const __m512 v = _mm512_shuffle_ps(_mm512_castsi512_ps(t01), _mm512_castsi512_ps(t23), 0xDD);
    return _mm512_add_epi32(_mm512_castps_si512(u), _mm512_castps_si512(v));
}

T_512_INLINE void q_prows4(bool q4, int64_t n, float *s, size_t sr, size_t ss, const void *vx,
                           size_t xr, const void *y, size_t ys, int nr) {
    const int64_t nb = n / QK8_0;
    const __m512i bcast_q = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i to_br = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    kern_q8p_row yr[KERN_ROWS_MAX];
    __m128 acc[KERN_ROWS_MAX]; /* lane r: weight row r */
    ROWS_LOOP
    for (int a = 0; a < nr; a++) {
        yr[a] = kern_q8p_at((const char *)y + a * ys, nb);
        acc[a] = _mm_setzero_ps();
    }
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        __m512i u01[4], u23[4];
        __m128 dx[4];
        UNROLL(4)
        for (int r = 0; r < 4; r++)
            q_quad_u(q4, (const char *)vx + r * xr, b, &u01[r], &u23[r], &dx[r]);
        /* dx as [block][row] */
        const __m512 dxv = _mm512_permutexvar_ps(
            to_br, _mm512_insertf32x4(
                       _mm512_insertf32x4(
                           _mm512_insertf32x4(_mm512_castps128_ps512(dx[0]), dx[1], 1), dx[2], 2),
                       dx[3], 3));
        ROWS_LOOP
        for (int a = 0; a < nr; a++) {
            const __m512i y01 = _mm512_loadu_si512(yr[a].qs + QK8_0 * b);
            const __m512i y23 = _mm512_loadu_si512(yr[a].qs + QK8_0 * b + 64);
            __m512i f[4];
            UNROLL(4)
            for (int r = 0; r < 4; r++)
                f[r] = fold_quarters(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u01[r], y01),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), u23[r], y23));
            const __m512i c = _mm512_permutexvar_epi32(
                bcast_q, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(yr[a].c + b))));
            const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(sums_4x4(f), c));
            const __m512 dd = _mm512_mul_ps(
                dxv,
                _mm512_permutexvar_ps(bcast_q, _mm512_castps128_ps512(_mm_loadu_ps(yr[a].d + b))));
            /* blocks in order: acc = fma(d_b, sum_b, acc), four rows per step */
            __m128 t = acc[a];
            t = _mm_fmadd_ps(_mm512_castps512_ps128(dd), _mm512_castps512_ps128(isum), t);
            t = _mm_fmadd_ps(_mm512_extractf32x4_ps(dd, 1), _mm512_extractf32x4_ps(isum, 1), t);
            t = _mm_fmadd_ps(_mm512_extractf32x4_ps(dd, 2), _mm512_extractf32x4_ps(isum, 2), t);
            acc[a] =
                _mm_fmadd_ps(_mm512_extractf32x4_ps(dd, 3), _mm512_extractf32x4_ps(isum, 3), t);
        }
    }
    ROWS_LOOP
    for (int a = 0; a < nr; a++) {
        _Alignas(16) float v[4];
        _mm_store_ps(v, acc[a]);
        UNROLL(4)
        for (int r = 0; r < 4; r++) s[r * sr + a * ss] = v[r];
    }
    for (; b < nb; b++) {
        UNROLL(4)
        for (int r = 0; r < 4; r++) {
            float dx;
            const __m512i u = q_one_u(q4, (const char *)vx + r * xr, b, &dx);
            ROWS_LOOP
            for (int a = 0; a < nr; a++)
                s[r * sr + a * ss] = q8p_one(s[r * sr + a * ss], dx, u, yr[a], b);
        }
    }
}

/* kavx512_prows4_T and kavx512_prows_T of Q4_0 (q4) and Q8_0. */
#define Q_PROWS_ENTRIES(T, q4)                                                                     \
    T_512 void kavx512_prows4_##T(int64_t n, float *s, size_t sr, size_t ss, const void *x,        \
                                  size_t xr, const void *y, size_t ys, int nr) {                   \
        KERN_NR_SWITCH(q_prows4, nr, q4, n, s, sr, ss, x, xr, y, ys);                              \
    }                                                                                              \
    T_512 void kavx512_prows_##T(int64_t n, float *s, size_t ss, const void *x, const void *y,     \
                                 size_t ys, int nr) {                                              \
        KERN_NR_SWITCH(q_prows, nr, q4, n, s, ss, x, y, ys);                                       \
    }
Q_PROWS_ENTRIES(q4_0, true)
Q_PROWS_ENTRIES(q8_0, false)

/* ======================= K family ======================= */

/* pshufb control picking int16 scale 2c in 128-bit lanes 0,1 and 2c+1 in 2,3. */
T_512_INLINE __m512i q4k_scale_sel(int c) {
    const long long lo = 0x0100010001000100LL + 0x0404040404040404LL * c;
    const long long hi = lo + 0x0202020202020202LL;
    return _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi);
}

/* A decoded Q4_K super-block: chunk c (64 values) as bytes, low nibbles
 * (sub-block 2c) then high (2c+1); the matching int16 scale vectors; the mins
 * duplicated to pair with bsums. */
typedef struct {
    __m512i u[4], sc[4];
    __m256i mdup;
} q4k_dec;

T_512_INLINE void q4k_decode(const blk_q4_K *x, q4k_dec *d) {
    const __m256i sm16 = _mm256_cvtepu8_epi16(kern_q4k_scales_mins(x->scales)); /* sc0..7, m0..7 */
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
        if (c % 2) a1 = _mm512_dpwssd_epi32(a1, p, d->sc[c]);
        else a0 = _mm512_dpwssd_epi32(a0, p, d->sc[c]);
    }
    const __m512i a = _mm512_add_epi32(a0, a1);
    kern_hsum2_i32(_mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1)),
                   mins, sumi, summ);
}

/* K family: s = fma(d*yd, sumi, s); s = fma(-(dmin*yd), summ, s) per super-block. */
T_512_INLINE float q4k_step(const q4k_dec *dec, float xd, float xdmin, const blk_q8_K *yr,
                            float s) {
    int32_t sumi, summ;
    q4k_dot(dec, yr, &sumi, &summ);
    const float dall = xd * yr->d, dmin = xdmin * yr->d;
    s = fmaf(dall, (float)sumi, s);
    return fmaf(-dmin, (float)summ, s);
}
KAVX512_K_ROWS(q4_K, blk_q4_K, q4k_dec, q4k_decode, KAVX512_DMIN, q4k_step)

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
    return kern_hsum16_i32(acc);
}

T_512_INLINE float q6k_step(const q6k_dec *dec, float xd, float xdmin, const blk_q8_K *yr,
                            float s) {
    (void)xdmin;
    return fmaf(xd * yr->d, (float)q6k_dot(dec, yr), s);
}
KAVX512_K_ROWS(q6_K, blk_q6_K, q6k_dec, q6k_decode, KAVX512_NO_DMIN, q6k_step)
