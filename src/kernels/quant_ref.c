/* kernels: scalar reference implementations.
 *
 * Dequantization and quantization follow ggml's reference code operation by
 * operation (same float expressions in the same order), so files written by
 * llama.cpp decode identically and our quantizers produce the same bytes as
 * ggml's quantize_row_*_ref. The dot products follow the canonical orders in
 * kern_impl.h; the SIMD variants must reproduce them bit for bit. */
#include "kern_impl.h"

#include <string.h>

/* ======================= dequantization ======================= */

void kref_to_float_f32(const void *src, float *dst, int64_t n) {
    memmove(dst, src, (size_t)n * sizeof(float));
}

void kref_to_float_f16(const void *src, float *dst, int64_t n) {
    const kvl_f16 *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = kvl_f16_to_f32(x[i]);
}

void kref_to_float_bf16(const void *src, float *dst, int64_t n) {
    const kvl_bf16 *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = kvl_bf16_to_f32(x[i]);
}

/* Value l (0..127) of a Q6_K half: 4 low bits from ql, 2 high bits from qh. */
static inline int q6_value(const uint8_t *ql, const uint8_t *qh, int l) {
    const int quarter = l / 32, i = l % 32;
    const int lo = quarter & 1 ? ql[32 + i] : ql[i];
    const int low4 = quarter >= 2 ? lo >> 4 : lo & 0xF;
    const int high2 = (qh[i] >> (2 * quarter)) & 3;
    return (low4 | (high2 << 4)) - 32;
}

void kref_to_float_q8_K(const void *src, float *dst, int64_t n) {
    const blk_q8_K *x = src;
    for (int64_t b = 0; b < n / QK_K; b++)
        for (int j = 0; j < QK_K; j++) dst[b * QK_K + j] = x[b].d * x[b].qs[j];
}

/* ======================= quantization ======================= */

void kref_from_float_f32(const float *src, void *dst, int64_t n) {
    memmove(dst, src, (size_t)n * sizeof(float));
}

void kref_from_float_f16(const float *src, void *dst, int64_t n) {
    kvl_f16 *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kvl_f32_to_f16(src[i]);
}

void kref_from_float_bf16(const float *src, void *dst, int64_t n) {
    kvl_bf16 *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = kvl_f32_to_bf16(src[i]);
}

/* The largest magnitude of a Q8_0 block's 32 values. */
static float q8_0_amax(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = KERN_MAX(amax, fabsf(x[j]));
    return amax;
}

/* ggml quantize_row_q8_0_ref: d = amax/127, q = roundf(x / d). */
void kref_from_float_q8_0(const float *src, void *dst, int64_t n) {
    blk_q8_0 *y = dst;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const float *x = src + b * QK8_0;
        const float d = q8_0_amax(x) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = kvl_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ggml's x86 quantize_row_q8_0 (what llama.cpp quantizes activations and cache
 * rows with): d = amax/127, q = x * (127 / amax) rounded half to even. */
void kref_act_from_float_q8_0(const float *src, void *dst, int64_t n) {
    blk_q8_0 *y = dst;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const float *x = src + b * QK8_0, amax = q8_0_amax(x);
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[b].d = kvl_f32_to_f16(amax / 127.f);
        for (int j = 0; j < QK8_0; j++) y[b].qs[j] = (int8_t)kern_nearest_int(x[j] * id);
    }
}

/* ggml quantize_row_q4_0_ref: d = (signed max-magnitude value) / -8. */
void kref_from_float_q4_0(const float *src, void *dst, int64_t n) {
    blk_q4_0 *y = dst;
    for (int64_t b = 0; b < n / QK4_0; b++) {
        const float *x = src + b * QK4_0;
        const float max = kern_signed_absmax(x, QK4_0);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = kvl_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const uint8_t q0 = (uint8_t)KERN_MIN(15, (int8_t)(x[j] * id + 8.5f));
            const uint8_t q1 = (uint8_t)KERN_MIN(15, (int8_t)(x[j + QK4_0 / 2] * id + 8.5f));
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ggml make_qkx2_quants: weighted min/scale search for an asymmetric n-value group,
 * error measured as w * diff^2, or w * |diff| with use_mad.
 * Returns the scale; *the_min receives -min (>= 0). */
float kern_make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                            float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                            bool use_mad) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = kern_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)KERN_MAX(0, KERN_MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = kern_nearest_int(iscale * (x[i] - min));
            l = KERN_MAX(0, KERN_MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Packs 6-bit scale ls and min lm of sub-block j as get_scale_min_k4 unpacks them. */
static void q4k_pack_scale(uint8_t *s, int j, uint8_t ls, uint8_t lm) {
    if (j < 4) {
        s[j] = ls;
        s[j + 4] = lm;
    } else {
        s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] |= (uint8_t)((ls >> 4) << 6);
        s[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

void kern_q4k_quantize_groups(const float *x, int nmax, float rmin, int nstep, uint8_t *scales,
                              kvl_f16 *d, kvl_f16 *dmin, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], gscales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        gscales[j] = kern_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j],
                                           Laux, rmin, 0.1f, nstep, false);
        if (gscales[j] > max_scale) max_scale = gscales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales, 0, 12);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)kern_nearest_int(inv_scale * gscales[j]);
        uint8_t lm = (uint8_t)kern_nearest_int(inv_min * mins[j]);
        q4k_pack_scale(scales, j, KERN_MIN(63, ls), KERN_MIN(63, lm));
    }
    *d = kvl_f32_to_f16(max_scale / 63.f);
    *dmin = kvl_f32_to_f16(max_min / 63.f);
    /* Requantize against the stored (rounded) scales, as ggml does. */
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        kern_q4k_scale_min(j, scales, &sc, &m);
        const float dj = kvl_f16_to_f32(*d) * sc;
        if (!dj) continue;
        const float dm = kvl_f16_to_f32(*dmin) * m;
        for (int ii = 0; ii < 32; ii++) {
            int l = kern_nearest_int((x[32 * j + ii] + dm) / dj);
            L[32 * j + ii] = (uint8_t)KERN_MAX(0, KERN_MIN(nmax, l));
        }
    }
}

static void quantize_q4_K_block(const float *x, blk_q4_K *y) {
    uint8_t L[QK_K];
    kern_q4k_quantize_groups(x, 15, -1.f, 20, y->scales, &y->d, &y->dmin, L);
    for (int j = 0; j < QK_K / 64; j++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
}

/* ggml quantize_row_q4_K_ref (no importance matrix). */
KREF_K_FROM_FLOAT(q4_K)

/* ggml make_qx_quants with rmse_type 1 and no weights (w = x^2): symmetric
 * n-value group in [-nmax, nmax-1]; L receives l + nmax. Returns the scale. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float sumlx, suml2;
    const float max = kern_sym_first(n, nmax, x, L, nmax, &sumlx, &suml2);
    if (max == 0.f) return 0.f;
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        const float iscale = -(nmax + 0.1f * is) / max;
        kern_sym_round(n, nmax, iscale, x, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            kern_sym_round(n, nmax, iscale, x, L, nmax, &sumlx, &suml2);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void q6k_pack(const int8_t *L, blk_q6_K *y) {
    for (int h = 0; h < 2; h++) {
        const int8_t *Lh = L + 128 * h;
        uint8_t *ql = y->ql + 64 * h, *qh = y->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = Lh[l] & 0xF, q2 = Lh[l + 32] & 0xF;
            const uint8_t q3 = Lh[l + 64] & 0xF, q4 = Lh[l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                              ((Lh[l + 96] >> 4) << 6));
        }
    }
}

static void quantize_q6_K_block(const float *x, blk_q6_K *y) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ib++) {
        scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs_scale) {
            max_abs_scale = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    memset(y, 0, sizeof *y);
    if (max_abs_scale < KERN_GROUP_MAX_EPS) return; /* all zero: d = +0 */
    const float iscale = -128.f / max_scale;
    y->d = kvl_f32_to_f16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ib++)
        y->scales[ib] = (int8_t)KERN_MIN(127, kern_nearest_int(iscale * scales[ib]));
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = kvl_f16_to_f32(y->d) * y->scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ii++) {
            int l = kern_nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(KERN_MAX(-32, KERN_MIN(31, l)) + 32);
        }
    }
    q6k_pack(L, y);
}

/* ggml quantize_row_q6_K_ref. */
KREF_K_FROM_FLOAT(q6_K)

/* ggml quantize_row_q8_K_ref: the signed max-magnitude value maps to -127. */
void kref_from_float_q8_K(const float *src, void *dst, int64_t n) {
    blk_q8_K *y = dst;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const float *x = src + b * QK_K;
        const float max = kern_signed_absmax(x, QK_K);
        if (!max) { /* ggml leaves bsums stale here; zero is their true value */
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++)
            y[b].qs[j] = (int8_t)KERN_MIN(127, kern_nearest_int(iscale * x[j]));
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[b].qs[16 * j + ii];
            y[b].bsums[j] = (int16_t)sum;
        }
        y[b].d = 1 / iscale;
    }
}

/* ======================= dot products ======================= */

/* FP family: 16 lanes of fmaf, then kern_reduce16. `widen` converts 16 elements. */
typedef void (*widen_fn)(const void *src, int64_t i0, int64_t cnt, float *dst);

static void widen_f32(const void *src, int64_t i0, int64_t cnt, float *dst) {
    memcpy(dst, (const float *)src + i0, (size_t)cnt * sizeof(float));
}
static void widen_f16(const void *src, int64_t i0, int64_t cnt, float *dst) {
    kref_to_float_f16((const kvl_f16 *)src + i0, dst, cnt);
}
static void widen_bf16(const void *src, int64_t i0, int64_t cnt, float *dst) {
    kref_to_float_bf16((const kvl_bf16 *)src + i0, dst, cnt);
}

static float dot_fp(int64_t n, widen_fn widen, const void *x, const void *y) {
    float acc[KERN_FP_LANES] = {0};
    float xa[KERN_FP_LANES], ya[KERN_FP_LANES];
    for (int64_t i0 = 0; i0 < n; i0 += KERN_FP_LANES) {
        const int64_t cnt = n - i0 < KERN_FP_LANES ? n - i0 : KERN_FP_LANES;
        widen(x, i0, cnt, xa);
        widen(y, i0, cnt, ya);
        for (int64_t l = 0; l < cnt; l++) acc[l] = fmaf(xa[l], ya[l], acc[l]);
    }
    return kern_reduce16(acc);
}

void kref_vec_dot_f32(int64_t n, float *s, const void *x, const void *y) {
    *s = dot_fp(n, widen_f32, x, y);
}
void kref_vec_dot_f16(int64_t n, float *s, const void *x, const void *y) {
    *s = dot_fp(n, widen_f16, x, y);
}
void kref_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y) {
    *s = dot_fp(n, widen_bf16, x, y);
}

/* Q family (kern_q32_block, quant32.h): the exact int32 sum of block b's
 * 32 products enters one float accumulator through s = fma(d_x * d_y, sum,
 * s), blocks in order. */
KERN_K_INLINE void unpack_q8_0(const void *blk, kern_q32_block *u) {
    const blk_q8_0 *x = blk;
    for (int j = 0; j < QK8_0; j++) u->v[j] = x->qs[j];
    u->d = kvl_f16_to_f32(x->d), u->m = 0;
}
KERN_K_INLINE void unpack_q4_0(const void *blk, kern_q32_block *u) {
    const blk_q4_0 *x = blk;
    for (int j = 0; j < QK4_0 / 2; j++) {
        u->v[j] = (int8_t)((x->qs[j] & 0x0F) - 8);
        u->v[j + QK4_0 / 2] = (int8_t)((x->qs[j] >> 4) - 8);
    }
    u->d = kvl_f16_to_f32(x->d), u->m = 0;
}
KREF_Q32_TO_FLOAT(q8_0, false)
KREF_Q32_TO_FLOAT(q4_0, false)

static inline int32_t q_block_isum(const int8_t *xq, const int8_t *yq) {
    int32_t isum = 0;
    for (int j = 0; j < QK8_0; j++) isum += xq[j] * yq[j];
    return isum;
}

void kref_vec_dot_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const blk_q8_0 *x = vx, *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / QK8_0; b++)
        sumf = fmaf(kvl_f16_to_f32(x[b].d) * kvl_f16_to_f32(y[b].d),
                    (float)q_block_isum(x[b].qs, y[b].qs), sumf);
    *s = sumf;
}

void kref_vec_dot_q4_0(int64_t n, float *s, const void *vx, const void *vy) {
    const blk_q4_0 *x = vx;
    const blk_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / QK4_0; b++) {
        int8_t xq[QK4_0];
        for (int j = 0; j < QK4_0 / 2; j++) {
            xq[j] = (int8_t)((x[b].qs[j] & 0x0F) - 8);
            xq[j + QK4_0 / 2] = (int8_t)((x[b].qs[j] >> 4) - 8);
        }
        sumf = fmaf(kvl_f16_to_f32(x[b].d) * kvl_f16_to_f32(y[b].d),
                    (float)q_block_isum(xq, y[b].qs), sumf);
    }
    *s = sumf;
}

/* K family (Q4_K, Q6_K here; the others in quant_kx_ref.c): each type's
 * super-block unpacked for the family's one dot and one dequantization
 * (kern_k_vec_dot, kern_k_to_float in kern_impl.h). */

/* Q4_K: sub-block 2c is the low nibbles of qs[32c..], 2c + 1 the high ones
 * (values 0..15); 6-bit scales and mins per 32. */
KERN_K_INLINE void unpack_q4_K(const void *vx, kern_k_block *u) {
    const blk_q4_K *x = vx;
    for (int c = 0; c < QK_K / 64; c++)
        for (int l = 0; l < 32; l++) {
            u->v[64 * c + l] = (int8_t)(x->qs[32 * c + l] & 0xF);
            u->v[64 * c + 32 + l] = (int8_t)(x->qs[32 * c + l] >> 4);
        }
    kern_k_q4k_scales(x->scales, x->d, x->dmin, u);
}
KREF_K_KERNELS(q4_K)

/* Q6_K: values -32..31, an int8 scale per 16. */
KERN_K_INLINE void unpack_q6_K(const void *vx, kern_k_block *u) {
    const blk_q6_K *x = vx;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 128; l++)
            u->v[128 * h + l] = (int8_t)q6_value(x->ql + 64 * h, x->qh + 32 * h, l);
    for (int g = 0; g < QK_K / 16; g++) u->sc[g] = x->scales[g];
    u->group = 16, u->mins = false, u->d = x->d;
}
KREF_K_KERNELS(q6_K)
