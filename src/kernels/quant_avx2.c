/* kernels: AVX2 + FMA + F16C implementations.
 *
 * Compiled with generic x86-64 flags; each function enables the ISA it needs
 * through a target attribute and is only called after kern_init checked CPUID.
 * Results are bit-identical to quant_ref.c (kern_impl.h gives the orders). */
#include "simd.h"

#include <string.h>

/* ======================= conversions ======================= */

T_AVX2 void kavx2_to_float_f16(const void *src, float *dst, int64_t n) {
    const kvl_f16 *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) dst[i] = f16_load(x[i]);
}

T_AVX2 void kavx2_from_float_f16(const float *src, void *dst, int64_t n) {
    kvl_f16 *y = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = kvl_f32_to_f16(src[i]);
}

/* roundf (half away from zero) of 8 floats, exactly: v - trunc(v) is exact. */
T_AVX2_INLINE __m256 roundf_ps(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 big = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(sign, v));
    return _mm256_add_ps(t, _mm256_and_ps(big, one));
}

/* Same bytes as kref_from_float_q8_0 (d = amax/127, id = 1/d, roundf). */
T_AVX2 void kavx2_from_float_q8_0(const float *src, void *dst, int64_t n) {
    blk_q8_0 *y = dst;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        __m256 v[4];
        const float d = kern_load32_amax(src + b * QK8_0, v) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = kvl_f32_to_f16(d);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(roundf_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id))));
        _mm256_storeu_si256((__m256i *)y[b].qs, kern_pack32_i8(q[0], q[1], q[2], q[3]));
    }
}

/* Same bytes as kref_act_from_float_q8_0 (id = 127/amax, half to even). */
T_AVX2 void kavx2_act_from_float_q8_0(const float *src, void *dst, int64_t n) {
    blk_q8_0 *y = dst;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        __m256 v[4];
        const float amax = kern_load32_amax(src + b * QK8_0, v);
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        y[b].d = kvl_f32_to_f16(amax / 127.f);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(_mm256_round_ps(
                _mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm256_storeu_si256((__m256i *)y[b].qs, kern_pack32_i8(q[0], q[1], q[2], q[3]));
    }
}

/* Sums of 16 int8: bias to unsigned so psadbw can add them, then unbias. */
T_AVX2_INLINE void q8k_bsums(const int8_t *qs, int16_t *bsums) {
    for (int j = 0; j < QK_K / 32; j++) {
        const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 32 * j)),
                                           _mm256_set1_epi8((char)0x80));
        const __m256i s = _mm256_sad_epu8(u, _mm256_setzero_si256()); /* 4 sums of 8 */
        bsums[2 * j] = (int16_t)(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) - 2048);
        bsums[2 * j + 1] =
            (int16_t)(_mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3) - 2048);
    }
}

/* The first element of largest magnitude (ties keep the earliest, as ggml). */
T_AVX2_INLINE float q8k_signed_max(const float *x, float *amax_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    const float amax = kern_hmax8_ps(m);
    *amax_out = amax;
    for (int j = 0; j < QK_K; j++)
        if (fabsf(x[j]) == amax) return x[j];
    return 0.0f; /* only reached for NaN input */
}

/* Same bytes as kref_from_float_q8_K: q = min(127, rint(-127/max * x)). */
T_AVX2 void kavx2_from_float_q8_K(const float *src, void *dst, int64_t n) {
    blk_q8_K *y = dst;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const float *x = src + b * QK_K;
        float amax;
        const float max = q8k_signed_max(x, &amax);
        if (!amax) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i hi = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            /* cvtps rounds to nearest even under the default MXCSR, as nearest_int */
            for (int k = 0; k < 4; k++)
                q[k] = _mm256_min_epi32(
                    hi, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vs)));
            _mm256_storeu_si256((__m256i *)(y[b].qs + j), kern_pack32_i8(q[0], q[1], q[2], q[3]));
        }
        q8k_bsums(y[b].qs, y[b].bsums);
        y[b].d = 1 / iscale;
    }
}

/* ======================= FP family dot products ======================= */

/* 8 elements starting at element i, widened to float. */
/* 16 lanes as 2 vectors; a short tail goes through a zero-padded copy. The
 * final a0 + a1 and kern_hsum8_ps are kern_reduce16's tree. */
T_AVX2_INLINE float fp_dot(int kind, int64_t n, const void *x0, const void *y0) {
    const size_t esz = kind == GGUF_DT_F32 ? 4 : 2;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + KERN_FP_LANES <= n; i += KERN_FP_LANES) {
        a0 = _mm256_fmadd_ps(kern_load8_ps(kind, x0, i), kern_load8_ps(kind, y0, i), a0);
        a1 = _mm256_fmadd_ps(kern_load8_ps(kind, x0, i + 8), kern_load8_ps(kind, y0, i + 8), a1);
    }
    if (i < n) {
        _Alignas(32) unsigned char tx[KERN_FP_LANES * 4] = {0}, ty[KERN_FP_LANES * 4] = {0};
        memcpy(tx, (const char *)x0 + i * esz, (size_t)(n - i) * esz);
        memcpy(ty, (const char *)y0 + i * esz, (size_t)(n - i) * esz);
        a0 = _mm256_fmadd_ps(kern_load8_ps(kind, tx, 0), kern_load8_ps(kind, ty, 0), a0);
        a1 = _mm256_fmadd_ps(kern_load8_ps(kind, tx, 8), kern_load8_ps(kind, ty, 8), a1);
    }
    return kern_hsum8_ps(_mm256_add_ps(a0, a1));
}

T_AVX2 void kavx2_vec_dot_f32(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(GGUF_DT_F32, n, x, y);
}
T_AVX2 void kavx2_vec_dot_f16(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(GGUF_DT_F16, n, x, y);
}
T_AVX2 void kavx2_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y) {
    *s = fp_dot(GGUF_DT_BF16, n, x, y);
}

/* ======================= Q family dot products ======================= */

T_AVX2_INLINE __m256i q8_0_lanes(const blk_q8_0 *x, const blk_q8_0 *y) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y->qs);
    /* |x| * (y with x's sign); |-128| reads as unsigned 128 */
    return kern_dot_u8s8(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv));
}

T_AVX2_INLINE __m256i q4_0_lanes(const blk_q4_0 *x, const blk_q8_0 *y) {
    const __m128i q = _mm_loadu_si128((const __m128i *)x->qs);
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y->qs);
    /* (u - 8) * y = u*y - 8*y */
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, yv),
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(8), yv));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Block b of a Q8_0 (q4 false) or Q4_0 weight row against block b of y: the
 * 8 lanes of its exact integer sum, and its fp16 scale. */
T_AVX2_INLINE __m256i q_lanes(bool q4, const void *x, const blk_q8_0 *y, int64_t b) {
    return q4 ? q4_0_lanes((const blk_q4_0 *)x + b, y + b)
              : q8_0_lanes((const blk_q8_0 *)x + b, y + b);
}
T_AVX2_INLINE kvl_f16 q_scale(bool q4, const void *x, int64_t b) {
    return q4 ? ((const blk_q4_0 *)x)[b].d : ((const blk_q8_0 *)x)[b].d;
}

/* One float accumulator, block sums exact (kern_impl.h): the steps of
 * KERN_Q_DOT written out, since through it (blocks by pointer, not index)
 * GCC's code for these two runs 2.5% more instructions (callgrind). */
T_AVX2_INLINE float q_dot(bool q4, int64_t n, const void *x, const blk_q8_0 *y) {
    const int64_t nb = n / QK8_0;
    float sumf = 0;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const __m128i isum = kern_hsum4x8_i32(q_lanes(q4, x, y, b), q_lanes(q4, x, y, b + 1),
                                              q_lanes(q4, x, y, b + 2), q_lanes(q4, x, y, b + 3));
        const __m128 dx = kern_f16x4(q_scale(q4, x, b), q_scale(q4, x, b + 1),
                                     q_scale(q4, x, b + 2), q_scale(q4, x, b + 3));
        sumf = kern_q_fma4(
            sumf, _mm_mul_ps(dx, kern_f16x4(y[b].d, y[b + 1].d, y[b + 2].d, y[b + 3].d)), isum);
    }
    for (; b < nb; b++)
        sumf = fmaf(f16_load(q_scale(q4, x, b)) * f16_load(y[b].d),
                    (float)kern_hsum8_i32(q_lanes(q4, x, y, b)), sumf);
    return sumf;
}

T_AVX2 void kavx2_vec_dot_q8_0(int64_t n, float *s, const void *x, const void *y) {
    *s = q_dot(false, n, x, y);
}
T_AVX2 void kavx2_vec_dot_q4_0(int64_t n, float *s, const void *x, const void *y) {
    *s = q_dot(true, n, x, y);
}

/* ======================= K family dot products ======================= */

T_AVX2_INLINE float q4k_step(float sumf, const blk_q4_K *x, const blk_q8_K *y) {
    return kern_q45k_step(sumf, x->scales, x->qs, NULL, &x->d, &x->dmin, y);
}
T_AVX2 void kavx2_vec_dot_q4_K(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_K_DOT(blk_q4_K, q4k_step);
}

/* The four 32-value quarters of a Q6_K half as unsigned 0..63 bytes. */
T_AVX2_INLINE void q6k_quarters(const uint8_t *ql, const uint8_t *qh, __m256i *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    const __m256i a = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i b = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    /* 16-bit shifts leak bits across bytes; the masks drop them */
    u[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
    u[1] = _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
    u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(h, m2));
    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
}

/* Sum over the super-block of sc_g * sum_16 (q6 + 32) * q8, minus 32 * sum_g sc_g * bsum_g. */
T_AVX2_INLINE int32_t q6k_sumi(const blk_q6_K *x, const blk_q8_K *y) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m256i bs = _mm256_loadu_si256((const __m256i *)y->bsums);
    __m256i sum =
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
    for (int h = 0; h < 2; h++) {
        __m256i u[4];
        q6k_quarters(x->ql + 64 * h, x->qh + 32 * h, u);
        /* both 128-bit lanes hold the 8 int16 scales of this half */
        const __m256i sh =
            h ? _mm256_permute4x64_epi64(sc16, 0xEE) : _mm256_permute4x64_epi64(sc16, 0x44);
        for (int k = 0; k < 4; k++) {
            /* int16 scale 2k in the low lane, 2k+1 in the high lane */
            const char lo = (char)(4 * k), hi = (char)(4 * k + 2);
            /* clang-format off */
            const __m256i sel = _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                                 lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                                 hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                                                 hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1);
            /* clang-format on */
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * k));
            const __m256i p = _mm256_maddubs_epi16(u[k], yv);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sh, sel)));
        }
    }
    return kern_hsum8_i32(sum);
}

T_AVX2_INLINE float q6k_step(float sumf, const blk_q6_K *x, const blk_q8_K *y) {
    return fmaf(f16_load(x->d) * y->d, (float)q6k_sumi(x, y), sumf);
}
T_AVX2 void kavx2_vec_dot_q6_K(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_K_DOT(blk_q6_K, q6k_step);
}
