/* kernels: MXFP4 weights (OCP microscaling FP4, ggml type 39; OpenAI
 * gpt-oss's experts), its scalar reference and AVX2 / AVX-512 dot products
 * against Q8_0 (quant32.h).
 *
 * A block holds 32 values: one E8M0 scale byte e (2^(e - 127)) and 16 bytes of
 * 4-bit E2M1 codes, element j in the low nibble of qs[j] and element j + 16 in
 * the high one (ggml's block_mxfp4, the order llama.cpp's converter writes).
 * As in ggml the codes are read as doubled E2M1 values (kern_mxfp4_values, all
 * integers) and the scale as half of 2^(e - 127), so value = v * d exactly.
 *
 * The dot against Q8_0 follows the Q family of kern_impl.h: block b adds the
 * exact int32 sum of its 32 products, s = fma(d_x * d_y, isum_b, s), blocks in
 * order, d_x = kern_e8m0_half(e). The SIMD versions sum the products in
 * integer lanes (exact) and run the same float steps, so all three are
 * bit-identical. The quantizer is ggml's quantize_row_mxfp4_ref. */
#include "simd.h"

const int8_t kern_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ======================= scalar reference ======================= */

/* The codes as their doubled E2M1 values, d = kern_e8m0_half(e). */
KERN_K_INLINE void unpack_mxfp4(const void *blk, kern_q32_block *u) {
    const blk_mxfp4 *x = blk;
    for (int j = 0; j < QK_MXFP4 / 2; j++) {
        u->v[j] = kern_mxfp4_values[x->qs[j] & 0x0F];
        u->v[j + QK_MXFP4 / 2] = kern_mxfp4_values[x->qs[j] >> 4];
    }
    u->d = kern_e8m0_half(x->e), u->m = 0;
}
KREF_Q32_TO_FLOAT(mxfp4, false)

/* ggml's best_index_mxfp4: the first code whose value * d is nearest to x. */
static int mxfp4_best_index(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)kern_mxfp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)kern_mxfp4_values[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void kref_from_float_mxfp4(const float *src, void *dst, int64_t n) {
    blk_mxfp4 *y = dst;
    for (int64_t b = 0; b < n / QK_MXFP4; b++) {
        const float *x = src + b * QK_MXFP4;
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++) amax = amax < fabsf(x[j]) ? fabsf(x[j]) : amax;
        /* ggml: (uint8_t)(floor(log2(amax)) - 2 + 127), amax > 0; clamped here
         * where that conversion would be undefined */
        int e = 0;
        if (amax > 0.0f) {
            const float fe = floorf(log2f(amax)) - 2.0f + 127.0f;
            e = fe < 0.0f ? 0 : fe > 255.0f ? 255 : (int)fe;
        }
        const float d = kern_e8m0_half((uint8_t)e);
        y[b].e = (uint8_t)e;
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            y[b].qs[j] = (uint8_t)(mxfp4_best_index(x[j], d) |
                                   (mxfp4_best_index(x[j + QK_MXFP4 / 2], d) << 4));
    }
}

void kref_vec_dot_mxfp4(int64_t n, float *s, const void *vx, const void *vy) {
    const blk_mxfp4 *x = vx;
    const blk_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_MXFP4; b++) {
        int32_t isum = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            isum += kern_mxfp4_values[x[b].qs[j] & 0x0F] * y[b].qs[j];
            isum += kern_mxfp4_values[x[b].qs[j] >> 4] * y[b].qs[j + QK_MXFP4 / 2];
        }
        const float d = kern_e8m0_half(x[b].e) * kvl_f16_to_f32(y[b].d);
        sumf = fmaf(d, (float)isum, sumf);
    }
    *s = sumf;
}

/* ======================= AVX2 + FMA + F16C ======================= */

/* The scales of 4 blocks as floats, times the activations' fp16 scales. */
T_AVX2_INLINE __m128 mxfp4_d4(const blk_mxfp4 *x, const blk_q8_0 *y) {
    return _mm_mul_ps(_mm_setr_ps(kern_e8m0_half(x[0].e), kern_e8m0_half(x[1].e),
                                  kern_e8m0_half(x[2].e), kern_e8m0_half(x[3].e)),
                      kern_f16x4(y[0].d, y[1].d, y[2].d, y[3].d));
}

/* A block's 32 values (signed bytes, |v| <= 12) in element order. */
T_AVX2_INLINE __m256i mxfp4_values32(const uint8_t *qs) {
    const __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kern_mxfp4_values));
    return _mm256_shuffle_epi8(table, kern_nibbles32(qs));
}

/* 8 int32 lane sums of a block's products (|v| * sign(y, v): no int16
 * saturation, since |v| <= 12 and |y| <= 127 for the Q8_0 quantizer). */
T_AVX2_INLINE __m256i mxfp4_lanes(const blk_mxfp4 *x, const blk_q8_0 *y) {
    const __m256i v = mxfp4_values32(x->qs);
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y->qs);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(yv, v)),
                             _mm256_set1_epi16(1));
}

/* d_x * d_y of one block. */
#define MXFP4_D1(x, y) (kern_e8m0_half((x)->e) * f16_load((y)->d))

T_AVX2 void kavx2_vec_dot_mxfp4(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_Q_DOT(blk_mxfp4, blk_q8_0, KAVX2_Q_STEP4, KAVX2_Q_STEP1, mxfp4_lanes, mxfp4_d4, MXFP4_D1,
               KERN_Q_STEP);
}

/* ======================= AVX-512 VNNI ======================= */

/* Two blocks' lane sums in one zmm: vpdpbusd of the values + 128 (unsigned)
 * against the activations, less 128 * the activations' sums. */
T_512_INLINE __m512i mxfp4_pair_isum(const blk_mxfp4 *x, const blk_q8_0 *y) {
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    const __m512i u =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_xor_si256(mxfp4_values32(x[0].qs), bias)),
                           _mm256_xor_si256(mxfp4_values32(x[1].qs), bias), 1);
    const __m512i yv =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[0].qs)),
                           _mm256_loadu_si256((const __m256i *)y[1].qs), 1);
    const __m512i uy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, yv);
    return _mm512_sub_epi32(
        uy, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), yv));
}

/* KERN_Q_DOT's steps (the float steps of KERN_Q_STEP). */
T_512_INLINE float mxfp4_step4(float sumf, const blk_mxfp4 *x, const blk_q8_0 *y) {
    const __m128i isum = kern_red4_i32(mxfp4_pair_isum(x, y), mxfp4_pair_isum(x + 2, y + 2));
    return kern_q_fma4(sumf, mxfp4_d4(x, y), isum);
}
T_512_INLINE float mxfp4_step1(float sumf, const blk_mxfp4 *x, const blk_q8_0 *y) {
    const __m256i u = _mm256_xor_si256(mxfp4_values32(x->qs), _mm256_set1_epi8((char)0x80));
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256i si = _mm256_sub_epi32(
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, yv),
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), yv));
    return fmaf(MXFP4_D1(x, y), (float)kern_hsum8_i32(si), sumf);
}

T_512 void kavx512_vec_dot_mxfp4(int64_t n, float *s, const void *vx, const void *vy) {
    KERN_Q_DOT(blk_mxfp4, blk_q8_0, mxfp4_step4, mxfp4_step1);
}
