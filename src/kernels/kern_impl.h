/* kernels, private: the implementations behind kern_traits and the
 * arithmetic contract they share.
 *
 * Canonical reduction orders. Every implementation of a vec_dot (scalar, AVX2,
 * AVX-512) performs exactly the same float operations in the same order, so the
 * results are bit-identical across ISAs, batch sizes and thread counts. Integer
 * partial sums are exact, so only the float steps need a fixed order:
 *
 *  - FP family (F32, F16, BF16; elements widened to float exactly): 16 float
 *    lanes, acc[e % 16] = fma(x[e], y[e], acc[e % 16]), starting at +0, then
 *    kern_reduce16 (below; the dot16 of attention). One accumulator register
 *    per output, so a GEMM can tile outputs in registers (gemm_avx512.c).
 *  - Q family (Q8_0, Q4_0 against Q8_0): one float accumulator s = +0; block
 *    b contributes the exact int32 sum of its 32 products q_x*q_y (|sum| < 2^24,
 *    so exact in float too): s = fma(d_b, (float)isum_b, s), blocks in order,
 *    with d_b = fp16(x.d) * fp16(y.d) (exact in float). A GEMM can hold 16
 *    outputs in the lanes of one register (gemm_avx512.c).
 *  - K family (Q4_K, Q6_K against Q8_K): one float accumulator; each super-block
 *    contributes exact int32 totals through fmaf (see quant_ref.c).
 *  - Q5_0 and IQ4_NL against Q8_0 follow the Q family; Q4_1 and Q5_1 against
 *    Q8_1 add a min term per block (quant32.h).
 *
 * Attention (attn.c) has its own canonical steps, described with kern_attn_*
 * in kernels.h.
 *
 * fmaf is used explicitly (never a*b+c), so -ffp-contract cannot change results.
 */
#ifndef KVLLM_KERN_IMPL_H
#define KVLLM_KERN_IMPL_H

#include "kernels.h"

#include <math.h>
#include <string.h>

#define KERN_FP_LANES 16

/* The scalar quantizers' rounding (quant_ref.c, quant32_ref.c, quant_kx_ref.c):
 * ggml's nearest_int, round half to even via the 1.5*2^23 trick (|f| < 2^22). */
static inline int kern_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

#define KERN_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KERN_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ggml's GROUP_MAX_EPS: a group whose largest magnitude is below it quantizes to 0. */
#define KERN_GROUP_MAX_EPS 1e-15f

/* The 16-lane tree: ((a_i + a_i+8), then + 4, + 2, + 1 apart), what a
 * 512-bit (or two 256-bit) horizontal add does. dot16 (FP family, attention
 * scores) runs 16 lanes, acc[d % 16] = fma(q[d], k[d], acc), from +0, then this
 * tree; sum16 likewise with plain adds (lane j % 16). */
static inline float kern_reduce16(const float *a) {
    float s1[8], s2[4];
    for (int i = 0; i < 8; i++) s1[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) s2[i] = s1[i] + s1[i + 4];
    return (s2[0] + s2[2]) + (s2[1] + s2[3]);
}

/* The canonical exp of attention, for x <= 0 (larger x read as 0, smaller than
 * -87 as -87, NaN as -87): Cephes' expf, every step an IEEE operation (fmaf
 * explicitly), so a SIMD copy of it is bit-identical (kern_exp8_ps,
 * kern_exp16_ps in simd.h). kern_expf(0) = 1. x = n ln2 + r with n rounded to
 * an integer (ln2 = C1 + C2, C1 exact in few bits), then
 * e^r = 1 + r + r^2 * P(r), P(r) = ((((P0 r + P1) r + P2) r + P3) r + P4) r + P5. */
#define KERN_EXP_LOG2E 1.44269504088896341f
#define KERN_EXP_C1    0.693359375f
#define KERN_EXP_C2    (-2.12194440e-4f)
#define KERN_EXP_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define KERN_EXP_P0    1.9875691500e-4f
#define KERN_EXP_P1    1.3981999507e-3f
#define KERN_EXP_P2    8.3334519073e-3f
#define KERN_EXP_P3    4.1665795894e-2f
#define KERN_EXP_P4    1.6666665459e-1f
#define KERN_EXP_P5    5.0000001201e-1f
static inline float kern_expf(float x) {
    x = x > -87.0f ? x : -87.0f;
    x = x < 0.0f ? x : 0.0f;
    const float t = fmaf(x, KERN_EXP_LOG2E, KERN_EXP_MAGIC);
    const float n = t - KERN_EXP_MAGIC;
    float r = fmaf(n, -KERN_EXP_C1, x);
    r = fmaf(n, -KERN_EXP_C2, r);
    float p = KERN_EXP_P0;
    p = fmaf(p, r, KERN_EXP_P1);
    p = fmaf(p, r, KERN_EXP_P2);
    p = fmaf(p, r, KERN_EXP_P3);
    p = fmaf(p, r, KERN_EXP_P4);
    p = fmaf(p, r, KERN_EXP_P5);
    const float y = fmaf(p, r * r, r) + 1.0f;
    int32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const int32_t eb = (tb - 0x4B400000 + 127) << 23; /* 2^n, n >= -126 */
    float e;
    memcpy(&e, &eb, sizeof e);
    return y * e;
}

typedef struct kern_attn_ops {
    void (*scores)(int64_t n, int64_t dk, int n_q, const float *q, size_t qs, const void *const *k,
                   int kvtype, float scale, float *s, size_t ss);
    float (*softmax)(int64_t n, float *s, float *l);
    void (*pv)(int64_t n, int64_t dv, int n_q, const float *p, size_t ps, const void *const *v,
               int kvtype, float *o, size_t os);
    void (*merge)(int nc, int n_q, int64_t dv, const float *part, float *out, size_t os);
    void (*silu_mul)(float *g, const float *u, int64_t n); /* kern_silu_mul */
    void (*hadamard)(float *x, int64_t runs, int64_t n);   /* kern_hadamard */
} kern_attn_ops;
extern const kern_attn_ops kref_attn, kavx2_attn, kavx512_attn;
/* The reference Walsh-Hadamard transform (attn.c), also AVX2's. */
void kref_hadamard(float *x, int64_t runs, int64_t n);

/* kern_attn_merge's order, the one every ISA follows (part holds per chunk
 * cs = n_q * (dv + 2) floats: the n_q maxima m, the n_q sums l, then the n_q
 * outputs of dv): per head h, M is the largest chunk maximum; each chunk in
 * order weighs w = expf(m - M), adds l * w to L and w * its output to o
 * (axpy: o[d] = fmaf(x[d], w, o[d])); then o is scaled by 1 / L (scale:
 * o[d] *= s). The ISAs differ only in axpy and scale. */
typedef void (*kern_axpy_fn)(float *o, const float *x, float w, int64_t n);
typedef void (*kern_scale_fn)(float *o, float s, int64_t n);
static inline __attribute__((always_inline)) void kern_merge_heads(int nc, int n_q, int64_t dv,
                                                                   const float *part, float *out,
                                                                   size_t os, kern_axpy_fn axpy,
                                                                   kern_scale_fn scale) {
    const size_t cs = (size_t)n_q * (size_t)(dv + 2);
    for (int h = 0; h < n_q; h++) {
        float M = part[h], L = 0, *o = out + h * os;
        for (int c = 1; c < nc; c++) M = part[c * cs + h] > M ? part[c * cs + h] : M;
        for (int64_t d = 0; d < dv; d++) o[d] = 0;
        for (int c = 0; c < nc; c++) {
            const float *P = part + c * cs;
            const float w = kern_expf(P[h] - M);
            L = fmaf(P[n_q + h], w, L);
            axpy(o, P + 2 * n_q + h * dv, w, dv);
        }
        scale(o, 1.0f / L, dv);
    }
}
/* The active attention kernels. */
const kern_attn_ops *kern_attn_active(void);

/* 6-bit scale and min j (0..7) of a Q4_K super-block, as ggml packs them. */
static inline void kern_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The signatures of the rows kernels (KERN_ROWS_MAX, kern_prep_ops below), as
 * function types like kernels.h's kern_*_sig: the implementations below are
 * declared with them. */
typedef void kern_vec_dot_rows_sig(int64_t n, float *s, size_t ss, const void *x, const void *y,
                                   size_t ys, int nr);
typedef void kern_rows4_sig(int64_t n, float *s, size_t sr, size_t ss, const void *x, size_t xr,
                            const void *y, size_t ys, int nr);

/* ---- scalar reference (quant_ref.c) ---- */
kern_to_float_sig kref_to_float_f32, kref_to_float_f16, kref_to_float_bf16, kref_to_float_q8_0,
    kref_to_float_q4_0, kref_to_float_q4_K, kref_to_float_q6_K, kref_to_float_q8_K;

kern_from_float_sig kref_act_from_float_q8_0;
kern_from_float_sig kref_from_float_f32, kref_from_float_f16, kref_from_float_bf16,
    kref_from_float_q8_0, kref_from_float_q4_0, kref_from_float_q4_K, kref_from_float_q6_K,
    kref_from_float_q8_K;

kern_vec_dot_sig kref_vec_dot_f32, kref_vec_dot_f16, kref_vec_dot_bf16, kref_vec_dot_q8_0,
    kref_vec_dot_q4_0, kref_vec_dot_q4_K, kref_vec_dot_q6_K;

/* The value of largest magnitude, the first of equals (ggml's search in
 * its quantizers: q4_0, q6_K, q8_K, q3_K, iq4_nl, iq4_xs); 0 when all are 0 (NaNs are passed over). */
static inline float kern_signed_absmax(const float *x, int n) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    return max;
}

/* One rounding pass of ggml's symmetric group quantizers (make_qx_quants,
 * make_q3_quants): l_i = clamp(nearest(iscale * x_i), -nmax, nmax - 1), stored
 * as l_i + off unless L is NULL; *sumlx = sum w_i x_i l_i, *suml2 = sum w_i l_i^2
 * with w_i = x_i^2, in ggml's order. */
static inline void kern_sym_round(int n, int nmax, float iscale, const float *x, int8_t *L, int off,
                                  float *sumlx, float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kern_nearest_int(iscale * x[i]);
        l = KERN_MAX(-nmax, KERN_MIN(nmax - 1, l));
        if (L) L[i] = (int8_t)(l + off);
        const float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx, *suml2 = sl2;
}

/* Their first steps: the group's signed absmax max, then a pass at iscale
 * -nmax / max. Returns max, or 0 (L zeroed) for a group below
 * KERN_GROUP_MAX_EPS. */
static inline float kern_sym_first(int n, int nmax, const float *x, int8_t *L, int off,
                                   float *sumlx, float *suml2) {
    const float max = kern_signed_absmax(x, n);
    if (fabsf(max) < KERN_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    kern_sym_round(n, nmax, -nmax / max, x, L, off, sumlx, suml2);
    return max;
}

/* The scalar reference dot of the K family (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_XS) against Q8_K, one loop for all six (kern_k_vec_dot): each type only
 * unpacks a super-block into a kern_k_block, its QK_K values in element order,
 * the integer scale (and, for the types with mins, the min) of each group of
 * `group` values and the fp16 super-block scales. Per super-block, in order:
 *   sumi = sum_g sc_g * sum_{e in g} v_e * q8_e, summ = sum_g m_g * (g's bsums),
 *   s = fma(d*yd, sumi, s), and with mins s = fma(-(dmin*yd), summ, s),
 * the integer sums exact, so the SIMD kernels reproduce them in any order.
 * The lattice types (quant_iq_ref.c) unpack into it too, for the shared
 * dequantization; their dot products follow llama.cpp's steps instead. */
typedef struct kern_k_block {
    int8_t v[QK_K];
    int32_t sc[QK_K / 16], m[QK_K / 16];
    int group; /* values per scale: 16 or 32 */
    bool mins; /* m and dmin apply (Q2_K, Q4_K, Q5_K) */
    kvl_f16 d, dmin;
    /* dequantization only: a power of two the block's d is multiplied by,
     * exactly, before anything else (the lattice types' 1/8 and 1/4:
     * quant_iq_ref.c); 1 unless the unpack sets it */
    float dmul;
} kern_k_block;
typedef void (*kern_k_unpack_fn)(const void *x, kern_k_block *u);
/* An unpack_<t> and the two loops below are always inlined into the type's
 * functions, so its unpack and group size are constants there. */
#define KERN_K_INLINE static inline __attribute__((always_inline))
KERN_K_INLINE void kern_k_vec_dot(int64_t n, float *s, const void *vx, size_t x_bytes,
                                  const void *vy, kern_k_unpack_fn unpack) {
    const blk_q8_K *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        kern_k_block u;
        unpack((const char *)vx + b * x_bytes, &u);
        int32_t sumi = 0, summ = 0;
        for (int g = 0; g < QK_K / u.group; g++) {
            int32_t dot = 0;
            for (int e = u.group * g; e < u.group * (g + 1); e++) dot += u.v[e] * y[b].qs[e];
            sumi += u.sc[g] * dot;
            if (!u.mins) continue;
            int32_t bsum = 0; /* the group's Q8_K sums, one per 16 values */
            for (int k = u.group / 16 * g; k < u.group / 16 * (g + 1); k++) bsum += y[b].bsums[k];
            summ += u.m[g] * bsum;
        }
        sumf = fmaf(kvl_f16_to_f32(u.d) * y[b].d, (float)sumi, sumf);
        if (u.mins) sumf = fmaf(-(kvl_f16_to_f32(u.dmin) * y[b].d), (float)summ, sumf);
    }
    *s = sumf;
}

/* The K family's one reference dequantization, from the same unpack: per
 * group dl = d * sc_g (and ml = dmin * m_g), y_e = dl * v_e (- ml), ggml's
 * float order. */
KERN_K_INLINE void kern_k_to_float(const void *vx, float *dst, int64_t n, size_t x_bytes,
                                   kern_k_unpack_fn unpack) {
    for (int64_t b = 0; b < n / QK_K; b++) {
        kern_k_block u;
        u.dmul = 1.0f;
        unpack((const char *)vx + b * x_bytes, &u);
        const float d = kvl_f16_to_f32(u.d) * u.dmul, dmin = u.mins ? kvl_f16_to_f32(u.dmin) : 0.0f;
        float *y = dst + b * QK_K;
        for (int g = 0; g < QK_K / u.group; g++) {
            const float dl = d * u.sc[g], ml = u.mins ? dmin * u.m[g] : 0.0f;
            for (int e = u.group * g; e < u.group * (g + 1); e++)
                y[e] = u.mins ? dl * u.v[e] - ml : dl * u.v[e];
        }
    }
}

/* The scales of Q4_K and Q5_K: 6-bit scale and min pairs, one per 32 values,
 * and the super-block's d and dmin. */
static inline void kern_k_q4k_scales(const uint8_t *scales, kvl_f16 d, kvl_f16 dmin,
                                     kern_k_block *u) {
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        kern_q4k_scale_min(j, scales, &sc, &m);
        u->sc[j] = sc, u->m[j] = m;
    }
    u->group = 32, u->mins = true, u->d = d, u->dmin = dmin;
}

/* kref_from_float_<t> of a K-family type t: quantize_<t>_block per super-block. */
#define KREF_K_FROM_FLOAT(t)                                                                       \
    void kref_from_float_##t(const float *src, void *dst, int64_t n) {                             \
        blk_##t *y = dst;                                                                          \
        for (int64_t b = 0; b < n / QK_K; b++) quantize_##t##_block(src + b * QK_K, &y[b]);        \
    }

/* kref_vec_dot_<t> and kref_to_float_<t> of a K-family type t from its unpack_<t>. */
#define KREF_K_KERNELS(t)                                                                          \
    void kref_vec_dot_##t(int64_t n, float *s, const void *vx, const void *vy) {                   \
        kern_k_vec_dot(n, s, vx, sizeof(blk_##t), vy, unpack_##t);                                 \
    }                                                                                              \
    void kref_to_float_##t(const void *src, float *dst, int64_t n) {                               \
        kern_k_to_float(src, dst, n, sizeof(blk_##t), unpack_##t);                                 \
    }

/* Q2_K, Q3_K, Q5_K, IQ4_XS (quant_kx_ref.c, quant_kx_avx2.c, quant_kx_avx512.c). */
float kern_make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                            float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                            bool use_mad); /* quant_ref.c */
/* The scale step shared by ggml's Q4_K and Q5_K quantizers (quant_ref.c): per
 * group of 32, make_qkx2_quants (weights av_x + |x|, rdelta 0.1), the 6-bit
 * scales and mins packed into scales[12] as get_scale_min_k4 unpacks them, d
 * and dmin stored, then L (values 0..nmax) requantized against the stored scales. */
void kern_q4k_quantize_groups(const float *x, int nmax, float rmin, int nstep, uint8_t *scales,
                              kvl_f16 *d, kvl_f16 *dmin, uint8_t *L);
extern const int8_t kern_iq4nl_values[16];
/* The block types the attention kernels read in place from the cache (32
 * values a block; kernels.h's kern_attn_*). */
static inline bool kern_is_block_kv(int t) {
    return t == GGUF_DT_Q8_0 || t == GGUF_DT_Q5_0 || t == GGUF_DT_Q4_0 || t == GGUF_DT_IQ4_NL;
}
/* ggml best_index_int8 over kern_iq4nl_values: the index of the level nearest
 * to x, ties to the upper (quant32_ref.c; IQ4_NL and IQ4_XS quantizers). */
int kern_iq4nl_best_index(float x);
/* 6-bit scale g (0..15) of a Q3_K super-block, as stored (0..63; subtract 32). */
static inline int kern_q3k_scale(int g, const uint8_t *s) {
    const int lo = g < 8 ? s[g] & 0xF : s[g - 8] >> 4;
    return lo | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}
kern_to_float_sig kref_to_float_q2_K, kref_to_float_q3_K, kref_to_float_q5_K, kref_to_float_iq4_xs;
kern_from_float_sig kref_from_float_q2_K, kref_from_float_q3_K, kref_from_float_q5_K,
    kref_from_float_iq4_xs;
kern_vec_dot_sig kref_vec_dot_q2_K, kref_vec_dot_q3_K, kref_vec_dot_q5_K, kref_vec_dot_iq4_xs;
kern_vec_dot_sig kavx2_vec_dot_q2_K, kavx2_vec_dot_q3_K, kavx2_vec_dot_q5_K, kavx2_vec_dot_iq4_xs;
kern_vec_dot_sig kavx512_vec_dot_q2_K, kavx512_vec_dot_q3_K, kavx512_vec_dot_q5_K,
    kavx512_vec_dot_iq4_xs;
kern_vec_dot_rows_sig kavx512_rows_q2_K, kavx512_rows_q3_K, kavx512_rows_q5_K, kavx512_rows_iq4_xs;

/* The lattice types (quant_iq_ref.c, quant_iq_avx2.c, quant_iq_avx512.c): their
 * codebooks, filled before main, and signs[i] = the 8 signs of 7 stored bits i
 * (the eighth makes their count even). */
typedef struct kern_iq_grids_t {
    uint64_t iq2xxs[256], iq2xs[512], iq2s[1024], iq1s[2048];
    uint32_t iq3xxs[256], iq3s[512];
    uint8_t signs[128];
    uint64_t signs64[128]; /* the same 8 signs as bytes, +1 (0x01) or -1 (0xFF) */
} kern_iq_grids_t;
extern kern_iq_grids_t kern_iq_grids;
/* Little-endian words of a block at any alignment (the lattice blocks' packed fields). */
static inline uint32_t kern_le32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t kern_le64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
#define KERN_IQ_TYPES(X)                                                                           \
    X(IQ2_XXS, iq2_xxs)                                                                            \
    X(IQ2_XS, iq2_xs)                                                                              \
    X(IQ2_S, iq2_s) X(IQ3_XXS, iq3_xxs) X(IQ3_S, iq3_s) X(IQ1_S, iq1_s) X(IQ1_M, iq1_m)
#define KERN_IQ_DECLARE(T, t)                                                                      \
    kern_to_float_sig kref_to_float_##t;                                                           \
    kern_vec_dot_sig kref_vec_dot_##t, kavx2_vec_dot_##t, kavx512_vec_dot_##t;                     \
    kern_vec_dot_rows_sig kavx512_rows_##t;
KERN_IQ_TYPES(KERN_IQ_DECLARE)
#undef KERN_IQ_DECLARE

/* ---- AVX2 + FMA + F16C (quant_avx2.c) ---- */
kern_to_float_sig kavx2_to_float_f16;
kern_from_float_sig kavx2_from_float_f16, kavx2_from_float_q8_0, kavx2_act_from_float_q8_0,
    kavx2_from_float_q8_K;
kern_vec_dot_sig kavx2_vec_dot_f32, kavx2_vec_dot_f16, kavx2_vec_dot_bf16, kavx2_vec_dot_q8_0,
    kavx2_vec_dot_q4_0, kavx2_vec_dot_q4_K, kavx2_vec_dot_q6_K;

/* One weight row against up to KERN_ROWS_MAX activation rows:
 * s[r * ss] = dot(x, y + r * ys) for r < nr, each bit-identical to vec_dot.
 * matmul uses it for m > 1 so the weights are decoded once per group of rows. */
#define KERN_ROWS_MAX 4
/* The lattice types' AVX-512 rows kernels take up to this many: their decode
 * (codebook gathers, signs) costs more than a row's dot products, so prefill
 * shares it among more rows (kern_rows_max_of). */
#define KERN_ROWS_WIDE 16
typedef kern_vec_dot_rows_sig *kern_vec_dot_rows_fn;
/* The active rows kernel of a weight type, or NULL (then matmul loops vec_dot),
 * and the most activation rows it takes in one call. */
kern_vec_dot_rows_fn kern_rows_of(int dtype);
int kern_rows_max_of(int dtype);

/* Prepared activations: a matmul-internal layout of the quantized activations
 * that a kernel reads faster than GGUF blocks (quantization and results are
 * identical to from_float + vec_dot). `rows` works on prepared rows. */
/* rows4: four weight rows at once, xr bytes apart, s[r * sr + i * ss] for
 * weight row r and activation row i. */
typedef kern_rows4_sig *kern_rows4_fn;
typedef struct kern_prep_ops {
    void (*prepare)(const float *x, void *dst, int64_t k);
    kern_vec_dot_rows_fn rows;
    kern_rows4_fn rows4;
} kern_prep_ops;
/* The active prepared path of a weight type, or NULL. */
const kern_prep_ops *kern_prep_of(int dtype);

/* A prepared Q8_0-family row ("q8p"): the int8 values of its nb blocks, then
 * their scales as floats, then per block c = -bias * (sum of its values), bias
 * 128 for Q8_0 weights and 8 for Q4_0 weights (quant_avx512.c). Rows are
 * rounded to 64 bytes so they stay cache-line aligned. */
static inline size_t kern_q8p_row_bytes(int64_t k) {
    return ((size_t)(k / QK8_0) * (QK8_0 + 4 + 4) + 63) & ~(size_t)63;
}
typedef struct {
    const int8_t *qs;
    float *d;
    int32_t *c;
} kern_q8p_row;
static inline kern_q8p_row kern_q8p_at(const void *row, int64_t nb) {
    char *p = (char *)row;
    return (kern_q8p_row){(const int8_t *)p, (float *)(p + QK8_0 * nb),
                          (int32_t *)(p + (QK8_0 + 4) * nb)};
}

/* GEMM, for m >= min_m activation rows. Activations are prepared in tiles of
 * `tile_rows` rows (a row's slot in its tile). Quantized weights are packed
 * per thread, KERN_PANEL_ROWS rows at a time, into panels whose layout puts 16
 * rows in the lanes of a vector, so each output element keeps the canonical
 * order of its vec_dot while the kernel broadcasts activations; float weights
 * (panel_bytes NULL) are read in place. Results are bit-identical to vec_dot
 * (tests/unit/test_kernels.c). */
#define KERN_PANEL_ROWS 16
typedef struct kern_gemm_ops {
    int tile_rows, min_m;
    size_t (*tile_bytes)(int64_t k);
    /* x into slot `slot` of a tile that holds `rows` rows */
    void (*prepare)(const float *x, void *tile, int slot, int rows, int64_t k);
    size_t (*panel_bytes)(int64_t k); /* NULL: no packing */
    /* rows (<= KERN_PANEL_ROWS) rows of W, wrow bytes apart; missing rows read as 0 */
    void (*pack)(const void *w, size_t wrow, int rows, int64_t k, void *panel);
    /* Y[i * ldy + r] for the m activation rows (in ceil(m / tile_rows) tiles)
     * and weight rows r < n_rows: consecutive panels wstride bytes apart, or
     * (no packing) the rows themselves, wstride bytes apart */
    void (*kernel)(int64_t k, const void *w, size_t wstride, int n_rows, const void *tiles,
                   int64_t m, float *y, size_t ldy);
} kern_gemm_ops;
/* The active packed GEMM of a weight type, or NULL. */
const kern_gemm_ops *kern_gemm_of(int dtype);

/* Repacked weights: a whole matrix packed once, at load, into consecutive
 * KERN_PANEL_ROWS-row panels of a compact layout (about the size of the GGUF
 * rows: quantized values stay packed, the kernel widens them), read in place
 * by one kernel for every m, decode and prefill alike. Activations come in the
 * tiles of the type's kern_gemm_ops (tile_rows, tile_bytes, prepare). Results
 * are bit-identical to vec_dot. */
typedef struct kern_repack_ops {
    size_t (*panel_bytes)(int64_t k); /* one panel, a multiple of 64 */
    /* rows (<= KERN_PANEL_ROWS) rows of W, wrow bytes apart; missing rows read as 0 */
    void (*pack)(const void *w, size_t wrow, int rows, int64_t k, void *panel);
    /* Y[i * ldy + r] for the m activation rows (in ceil(m / tile_rows) tiles)
     * and rows r < n_rows of consecutive panels pb bytes apart */
    void (*kernel)(int64_t k, const void *panels, size_t pb, int n_rows, const void *tiles,
                   int64_t m, float *y, size_t ldy);
} kern_repack_ops;
/* The active repacked layout of a weight type, or NULL. */
const kern_repack_ops *kern_repack_of(int dtype);
/* Panels [p0, p1) of a repacked matrix (n_out rows of k) times the m prepared
 * activation rows in tiles: y[i * n_out + r] for those panels' rows r. The one
 * chunk step of every repacked product (matmul.c, matmul_grouped.c). */
static inline void kern_repacked_panels(int wtype, const void *P, int64_t n_out, int64_t k,
                                        int64_t p0, int64_t p1, const void *tiles, int64_t m,
                                        float *y) {
    const kern_repack_ops *r = kern_repack_of(wtype);
    const size_t pb = r->panel_bytes(k);
    const int64_t j0 = p0 * KERN_PANEL_ROWS;
    const int64_t j1 = p1 * KERN_PANEL_ROWS < n_out ? p1 * KERN_PANEL_ROWS : n_out;
    r->kernel(k, (const char *)P + (size_t)p0 * pb, pb, (int)(j1 - j0), tiles, m, y + j0,
              (size_t)n_out);
}
/* One chunk of a repacked product: panels [p0, p1) of matrix mat. */
typedef struct kern_span {
    int32_t mat, p0, p1;
} kern_span;
/* A matrix to split into chunks: np panels of pb bytes, ntiles tiles of
 * activation rows. */
typedef struct kern_span_mat {
    int64_t np;
    double pb;
    int64_t ntiles;
} kern_span_mat;
/* The guided chunks of nw matrices (matmul.c): over the matrices in order,
 * each about 1/(2 nth) of the work left in total (bytes of panels x tiles)
 * and at least min_bytes of panels, a matrix of several tiles at most an L2's
 * share; so the first chunks are long and the last short, and the threads
 * reach the barrier together. min_bytes is doubled until they fit in max;
 * returns their count. */
int64_t kern_guided_spans(int nw, const kern_span_mat *mats, int nth, size_t min_bytes, int64_t max,
                          kern_span *out);
/* Bytes of work buffer a GEMM of m rows may need (any ISA). */
size_t kern_gemm_work_bytes(int wtype, int64_t m, int64_t k);

/* ---- AVX-512 F/BW/VL + VNNI (quant_avx512.c) ---- */
kern_vec_dot_sig kavx512_vec_dot_f32, kavx512_vec_dot_f16, kavx512_vec_dot_bf16,
    kavx512_vec_dot_q8_0, kavx512_vec_dot_q4_0, kavx512_vec_dot_q4_K, kavx512_vec_dot_q6_K;
void kavx512_prepare_q8_0(const float *x, void *dst, int64_t k);
void kavx512_prepare_q4_0(const float *x, void *dst, int64_t k);
kern_vec_dot_rows_sig kavx512_prows_q8_0, kavx512_prows_q4_0;
kern_rows4_sig kavx512_prows4_q8_0, kavx512_prows4_q4_0;
kern_vec_dot_rows_sig kavx512_rows_q4_K, kavx512_rows_q6_K;

/* ---- AVX-512 packed GEMM (gemm_avx512.c) ---- */
extern const kern_gemm_ops kavx512_gemm_q8_0, kavx512_gemm_q4_0, kavx512_gemm_q4_K,
    kavx512_gemm_q6_K;
extern const kern_gemm_ops kavx512_gemm_f32, kavx512_gemm_f16, kavx512_gemm_bf16;
/* (gemm_kx_avx512.c) */
extern const kern_gemm_ops kavx512_gemm_q2_K, kavx512_gemm_q3_K, kavx512_gemm_q5_K,
    kavx512_gemm_iq4_xs;

/* ---- AVX-512 repacked weights (repack_avx512.c, repack_k_avx512.c, repack_kx_avx512.c) ---- */
extern const kern_repack_ops kavx512_repack_q8_0, kavx512_repack_q4_0;
extern const kern_repack_ops kavx512_repack_q4_K, kavx512_repack_q6_K;
/* (repack_kx_avx512.c) */
extern const kern_repack_ops kavx512_repack_iq4_xs, kavx512_repack_q3_K, kavx512_repack_q5_K,
    kavx512_repack_q2_K;
/* The two-stream decode kernels' prefetch hint: non-temporal (true) or into
 * L2; set by kern_init for this CPU (gemm_avx512.h, kavx512_decode_prefetch). */
extern bool kavx512_decode_nta;

/* Q4_1, Q5_0, Q5_1, IQ4_NL and Q8_1 (their blocks and implementations) */
#include "quant32.h"

#endif
