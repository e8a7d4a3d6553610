/* kernels: attention kernels for AVX2 + FMA, bit-identical to attn.c.
 *
 * The 16 lanes of dot16 / sum16 are two 8-lane vectors (lanes 0..7, 8..15);
 * their sum then kern_hsum8_ps is kern_reduce16's tree. */
#include "simd.h"

#include <string.h>

/* Lanes i < n of 8 set (n may be <= 0 or >= 8). */
T_AVX2_INLINE __m256i lanes(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int c = n < 0 ? 0 : n > 8 ? 8 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), idx);
}

/* 8 elements from d of a cache row of type t, widened (lanes outside m: 0). */
T_AVX2_INLINE __m256 kv_load8(int t, const void *row, int64_t d, __m256i m, bool full) {
    if (t == GGUF_DT_Q4_0 || t == GGUF_DT_Q5_0 || t == GGUF_DT_IQ4_NL) {
        /* 8 values of one 32-value block (d is a multiple of 8): level * d as to_float */
        const size_t bb = t == GGUF_DT_Q5_0 ? sizeof(blk_q5_0) : sizeof(blk_q4_0);
        const char *blk = (const char *)row + (size_t)(d / 32) * bb;
        const __m256 v = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(kv_block_levels(t, blk, (int)(d % 32)))),
            _mm256_set1_ps(f16_load(*(const kvl_f16 *)blk)));
        return full ? v : _mm256_and_ps(v, _mm256_castsi256_ps(m));
    }
    if (t == GGUF_DT_Q8_0) { /* 8 values of one block (d is a multiple of 8): q * d as to_float */
        const blk_q8_0 *b = (const blk_q8_0 *)row + d / QK8_0;
        int64_t qv;
        memcpy(&qv, b->qs + d % QK8_0, 8);
        const __m256 v =
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(qv))),
                          _mm256_set1_ps(f16_load(b->d)));
        return full ? v : _mm256_and_ps(v, _mm256_castsi256_ps(m));
    }
    if (t == GGUF_DT_F32)
        return full ? _mm256_loadu_ps((const float *)row + d)
                    : _mm256_maskload_ps((const float *)row + d, m);
    __m128i h;
    if (full) {
        h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d));
    } else {
        uint16_t tmp[8] = {0};
        int32_t mm[8];
        _mm256_storeu_si256((__m256i *)mm, m);
        for (int i = 0; i < 8; i++)
            if (mm[i]) tmp[i] = ((const uint16_t *)row)[d + i];
        h = _mm_loadu_si128((const __m128i *)tmp);
    }
    if (t == GGUF_DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

T_AVX2_INLINE void scores_t(int t, int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                            const void *const *k, float scale, float *s, size_t ss) {
    const __m256i all = _mm256_set1_epi32(-1);
    for (int h = 0; h < n_q; h++) {
        const float *qh = q + h * qs;
        for (int64_t j = 0; j < n; j++) {
            const void *kj = k[j];
            __m256 a = _mm256_setzero_ps(), b = a;
            int64_t d = 0;
            for (; d + 16 <= dk; d += 16) {
                a = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), kv_load8(t, kj, d, all, true), a);
                b = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d + 8), kv_load8(t, kj, d + 8, all, true),
                                    b);
            }
            if (d < dk) { /* masked lanes: 0 * 0 leaves them as they are */
                const __m256i m0 = lanes(dk - d), m1 = lanes(dk - d - 8);
                a = _mm256_fmadd_ps(_mm256_maskload_ps(qh + d, m0), kv_load8(t, kj, d, m0, false),
                                    a);
                b = _mm256_fmadd_ps(_mm256_maskload_ps(qh + d + 8, m1),
                                    kv_load8(t, kj, d + 8, m1, false), b);
            }
            s[h * ss + j] = kern_hsum16_ps2(a, b) * scale;
        }
    }
}

T_AVX2 static void scores(int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                          const void *const *k, int kt, float scale, float *s, size_t ss) {
    if (kt == GGUF_DT_F16) scores_t(GGUF_DT_F16, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_Q8_0) scores_t(GGUF_DT_Q8_0, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_Q4_0) scores_t(GGUF_DT_Q4_0, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_Q5_0) scores_t(GGUF_DT_Q5_0, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_IQ4_NL) scores_t(GGUF_DT_IQ4_NL, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_BF16) scores_t(GGUF_DT_BF16, n, dk, n_q, q, qs, k, scale, s, ss);
    else scores_t(GGUF_DT_F32, n, dk, n_q, q, qs, k, scale, s, ss);
}

T_AVX2 static float softmax(int64_t n, float *s, float *l) {
    /* the max is exact in any order (see attn_avx512.c) */
    float mx = s[0];
    for (int64_t j = 1; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 a = _mm256_setzero_ps(), b = a;
    for (int64_t j = 0; j < n; j += 16) {
        const __m256i m0 = lanes(n - j), m1 = lanes(n - j - 8);
        const __m256 e0 = kern_exp8_ps(_mm256_sub_ps(_mm256_maskload_ps(s + j, m0), vm));
        const __m256 e1 = kern_exp8_ps(_mm256_sub_ps(_mm256_maskload_ps(s + j + 8, m1), vm));
        _mm256_maskstore_ps(s + j, m0, e0);
        _mm256_maskstore_ps(s + j + 8, m1, e1);
        a = _mm256_add_ps(a, _mm256_and_ps(e0, _mm256_castsi256_ps(m0)));
        b = _mm256_add_ps(b, _mm256_and_ps(e1, _mm256_castsi256_ps(m1)));
    }
    *l = kern_hsum16_ps2(a, b);
    return mx;
}

T_AVX2_INLINE void pv_t(int t, int64_t n, int64_t dv, int n_q, const float *p, size_t ps,
                        const void *const *v, float *o, size_t os) {
    const __m256i all = _mm256_set1_epi32(-1);
    for (int h = 0; h < n_q; h++) {
        float *oh = o + h * os;
        int64_t d = 0;
        for (; d + 32 <= dv; d += 32) {
            __m256 a0 = _mm256_loadu_ps(oh + d), a1 = _mm256_loadu_ps(oh + d + 8);
            __m256 a2 = _mm256_loadu_ps(oh + d + 16), a3 = _mm256_loadu_ps(oh + d + 24);
            for (int64_t j = 0; j < n; j++) {
                const __m256 pj = _mm256_set1_ps(p[h * ps + j]);
                a0 = _mm256_fmadd_ps(pj, kv_load8(t, v[j], d, all, true), a0);
                a1 = _mm256_fmadd_ps(pj, kv_load8(t, v[j], d + 8, all, true), a1);
                a2 = _mm256_fmadd_ps(pj, kv_load8(t, v[j], d + 16, all, true), a2);
                a3 = _mm256_fmadd_ps(pj, kv_load8(t, v[j], d + 24, all, true), a3);
            }
            _mm256_storeu_ps(oh + d, a0), _mm256_storeu_ps(oh + d + 8, a1);
            _mm256_storeu_ps(oh + d + 16, a2), _mm256_storeu_ps(oh + d + 24, a3);
        }
        for (; d < dv; d += 8) {
            const __m256i m = lanes(dv - d);
            __m256 a = _mm256_maskload_ps(oh + d, m);
            for (int64_t j = 0; j < n; j++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(p[h * ps + j]),
                                    kv_load8(t, v[j], d, m, dv - d >= 8), a);
            _mm256_maskstore_ps(oh + d, m, a);
        }
    }
}

/* Per-ISA twin of attn_avx512.c's pv: each dispatches to its own ISA's pv_t. */
T_AVX2 static void pv(int64_t n, int64_t dv, int n_q, const float *p, size_t ps,
                      const void *const *v, int vt, float *o, size_t os) {
    if (vt == GGUF_DT_F16) pv_t(GGUF_DT_F16, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_Q8_0) pv_t(GGUF_DT_Q8_0, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_Q4_0) pv_t(GGUF_DT_Q4_0, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_Q5_0) pv_t(GGUF_DT_Q5_0, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_IQ4_NL) pv_t(GGUF_DT_IQ4_NL, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_BF16) pv_t(GGUF_DT_BF16, n, dv, n_q, p, ps, v, o, os);
    else pv_t(GGUF_DT_F32, n, dv, n_q, p, ps, v, o, os);
}

/* Per-ISA twin of attn_avx512.c's merge_axpy (kern_merge_heads' axpy). */
T_AVX2_INLINE void merge_axpy(float *o, const float *x, float w, int64_t n) {
    const __m256 vw = _mm256_set1_ps(w);
    for (int64_t d = 0; d < n; d += 8) {
        const __m256i m = lanes(n - d);
        _mm256_maskstore_ps(
            o + d, m,
            _mm256_fmadd_ps(_mm256_maskload_ps(x + d, m), vw, _mm256_maskload_ps(o + d, m)));
    }
}

T_AVX2_INLINE void merge_scale(float *o, float s, int64_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    for (int64_t d = 0; d < n; d += 8) {
        const __m256i m = lanes(n - d);
        _mm256_maskstore_ps(o + d, m, _mm256_mul_ps(_mm256_maskload_ps(o + d, m), vs));
    }
}

T_AVX2 static void merge(int nc, int n_q, int64_t dv, const float *part, float *out, size_t os) {
    kern_merge_heads(nc, n_q, dv, part, out, os, merge_axpy, merge_scale);
}

T_AVX2 static void silu_mul(float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = lanes(n - i);
        const __m256 x = _mm256_maskload_ps(g + i, m);
        /* -|x| */
        const __m256 e = kern_exp8_ps(_mm256_or_ps(x, sign));
        const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
        const __m256 sig = _mm256_blendv_ps(_mm256_mul_ps(e, r), r, pos);
        _mm256_maskstore_ps(g + i, m,
                            _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_maskload_ps(u + i, m)));
    }
}

const kern_attn_ops kavx2_attn = {scores, softmax, pv, merge, silu_mul, kref_hadamard};
