/* kernels: attention over a chunk of KV positions, scalar reference and the
 * public entry points. The orders are in kernels.h / kern_impl.h; SIMD copies
 * (attn_avx512.c) reproduce them bit for bit. */
#include "kern_impl.h"

/* Element d of a cache row of type t (F32, F16, BF16, or a block type: Q8_0,
 * Q5_0, Q4_0, IQ4_NL), widened exactly: a block's value as its to_float
 * gives it, the integer level times the block's scale in float. */
static inline float kv_elem(const void *row, int t, int64_t d) {
    if (t == GGUF_DT_Q8_0) {
        const blk_q8_0 *b = (const blk_q8_0 *)row + d / QK8_0;
        return b->qs[d % QK8_0] * kvl_f16_to_f32(b->d);
    }
    if (t == GGUF_DT_Q4_0 || t == GGUF_DT_IQ4_NL) { /* the same 18-byte layout */
        const blk_q4_0 *b = (const blk_q4_0 *)row + d / 32;
        const int j = (int)(d % 32), nib = (b->qs[j % 16] >> (j / 16 * 4)) & 15;
        return (t == GGUF_DT_Q4_0 ? nib - 8 : kern_iq4nl_values[nib]) * kvl_f16_to_f32(b->d);
    }
    if (t == GGUF_DT_Q5_0) {
        const blk_q5_0 *b = (const blk_q5_0 *)row + d / 32;
        const int j = (int)(d % 32), hi = (b->qh[j / 8] >> (j % 8)) & 1;
        return ((((b->qs[j % 16] >> (j / 16 * 4)) & 15) | (hi << 4)) - 16) * kvl_f16_to_f32(b->d);
    }
    if (t == GGUF_DT_F16) return kvl_f16_to_f32(((const kvl_f16 *)row)[d]);
    if (t == GGUF_DT_BF16) return kvl_bf16_to_f32(((const kvl_bf16 *)row)[d]);
    return ((const float *)row)[d];
}

static void ref_scores(int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                       const void *const *k, int kt, float scale, float *s, size_t ss) {
    for (int h = 0; h < n_q; h++)
        for (int64_t j = 0; j < n; j++) {
            const float *qh = q + h * qs;
            float acc[16] = {0};
            for (int64_t d = 0; d < dk; d++)
                acc[d % 16] = fmaf(qh[d], kv_elem(k[j], kt, d), acc[d % 16]);
            s[h * ss + j] = kern_reduce16(acc) * scale;
        }
}

static float ref_softmax(int64_t n, float *s, float *l) {
    float m = s[0];
    for (int64_t j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
    float acc[16] = {0};
    for (int64_t j = 0; j < n; j++) {
        s[j] = kern_expf(s[j] - m);
        acc[j % 16] += s[j];
    }
    *l = kern_reduce16(acc);
    return m;
}

static void ref_pv(int64_t n, int64_t dv, int n_q, const float *p, size_t ps, const void *const *v,
                   int vt, float *o, size_t os) {
    for (int64_t j = 0; j < n; j++)
        for (int h = 0; h < n_q; h++)
            for (int64_t d = 0; d < dv; d++)
                o[h * os + d] = fmaf(p[h * ps + j], kv_elem(v[j], vt, d), o[h * os + d]);
}

static void ref_axpy(float *o, const float *x, float w, int64_t n) {
    for (int64_t d = 0; d < n; d++) o[d] = fmaf(x[d], w, o[d]);
}

static void ref_scale(float *o, float s, int64_t n) {
    for (int64_t d = 0; d < n; d++) o[d] *= s;
}

static void ref_merge(int nc, int n_q, int64_t dv, const float *part, float *out, size_t os) {
    kern_merge_heads(nc, n_q, dv, part, out, os, ref_axpy, ref_scale);
}

static void ref_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i], e = kern_expf(-fabsf(x)), r = 1.0f / (1.0f + e);
        g[i] = (x * (x >= 0.0f ? r : e * r)) * u[i];
    }
}

void kref_hadamard(float *x, int64_t runs, int64_t n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int64_t r = 0; r < runs; r++) {
        float *v = x + r * n;
        for (int64_t j = 0; j < n; j++) v[j] *= scale;
        for (int64_t len = 1; len < n; len <<= 1)
            for (int64_t i = 0; i < n; i += 2 * len)
                for (int64_t j = i; j < i + len; j++) {
                    const float a = v[j], b = v[j + len];
                    v[j] = a + b;
                    v[j + len] = a - b;
                }
    }
}

const kern_attn_ops kref_attn = {ref_scores, ref_softmax,  ref_pv,
                                 ref_merge,  ref_silu_mul, kref_hadamard};

void kern_attn_scores(int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                      const void *const *k, int kvtype, float scale, float *s, size_t ss) {
    if (n > 0) kern_attn_active()->scores(n, dk, n_q, q, qs, k, kvtype, scale, s, ss);
}
float kern_attn_softmax(int64_t n, float *s, float *l) {
    return kern_attn_active()->softmax(n, s, l);
}
void kern_attn_pv(int64_t n, int64_t dv, int n_q, const float *p, size_t ps, const void *const *v,
                  int kvtype, float *o, size_t os) {
    if (n > 0) kern_attn_active()->pv(n, dv, n_q, p, ps, v, kvtype, o, os);
}
void kern_attn_merge(int nc, int n_q, int64_t dv, const float *part, float *out, size_t os) {
    kern_attn_active()->merge(nc, n_q, dv, part, out, os);
}
void kern_silu_mul(float *g, const float *u, int64_t n) { kern_attn_active()->silu_mul(g, u, n); }
void kern_hadamard(float *x, int64_t runs, int64_t n) {
    if (runs > 0) kern_attn_active()->hadamard(x, runs, n);
}
