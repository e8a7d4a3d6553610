/* kernels: scalar reference of the 32-element block types Q4_1, Q5_0, Q5_1,
 * IQ4_NL and the Q8_1 activations (quant32.h).
 *
 * Dequantization and the weight quantizers follow ggml operation by operation,
 * so the bytes are those llama-quantize writes without an importance matrix:
 * quantize_row_{q4_1,q5_0,q5_1}_ref, and for IQ4_NL quantize_iq4_nl (the
 * search over 15 scales, ntry = 7, that llama-quantize runs; the run-time
 * quantizer, kref_act_from_float_iq4_nl, skips it as quantize_row_iq4_nl_ref
 * does). The dot products follow the canonical orders in quant32.h. */
#include "kern_impl.h"

#include <float.h>
#include <string.h>

const int8_t kern_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

/* Bit j (0..31) of a block's qh as bit 4 of value j. */
static inline int q5_high(const uint8_t qh[4], int j) { return ((qh[j / 8] >> (j % 8)) & 1) << 4; }

/* ======================= dequantization ======================= */

void kref_to_float_q8_1(const void *src, float *dst, int64_t n) {
    const blk_q8_1 *x = src;
    for (int64_t b = 0; b < n / QK8_1; b++) {
        const float d = kvl_f16_to_f32(x[b].d);
        for (int j = 0; j < QK8_1; j++) dst[b * QK8_1 + j] = x[b].qs[j] * d;
    }
}

/* ======================= quantization ======================= */

/* Packs 5-bit values L[0..31] into a block's qs and qh. */
static void q5_pack(const uint8_t *L, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
        h |= (uint32_t)((L[j] >> 4) & 1) << j;
        h |= (uint32_t)((L[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(h >> (8 * i));
}

/* Smallest and largest of a block, from +-FLT_MAX as ggml starts. */
static void block_min_max(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo, *mx = hi;
}

/* The scale step of Q4_1 and Q5_1: d = (max - min) / nmax and m = min of
 * the block stored; returns 1 / d (0 when d is) and the min in *min. */
static float block_min_scale(const float *x, int n, int nmax, kvl_f16 *d16, kvl_f16 *m16,
                             float *min) {
    float max;
    block_min_max(x, n, min, &max);
    const float d = (max - *min) / nmax;
    *d16 = kvl_f32_to_f16(d);
    *m16 = kvl_f32_to_f16(*min);
    return d ? 1.0f / d : 0.0f;
}

/* The values of ggml quantize_row_q4_1_ref (nmax 15) and _q5_1_ref (31): d =
 * (max - min) / nmax, m = min, L = (x - min) / d + 0.5 truncated (clamped to
 * 15 for Q4_1; ggml leaves Q5_1's unclamped). Inlined with nmax constant:
 * called, it cost the two quantizers 16% and 39% more instructions. */
KERN_K_INLINE void min_block_levels(const float *x, int nmax, kvl_f16 *d16, kvl_f16 *m16,
                                    uint8_t *L) {
    float min;
    const float id = block_min_scale(x, 32, nmax, d16, m16, &min);
    for (int j = 0; j < 32; j++) {
        const int l = (int)((x[j] - min) * id + 0.5f);
        L[j] = (uint8_t)(nmax == 15 ? KERN_MIN(15, l) : l);
    }
}

void kref_from_float_q4_1(const float *src, void *dst, int64_t n) {
    blk_q4_1 *y = dst;
    for (int64_t b = 0; b < n / QK4_1; b++) {
        uint8_t L[QK4_1];
        min_block_levels(src + b * QK4_1, 15, &y[b].d, &y[b].m, L);
        for (int j = 0; j < QK4_1 / 2; j++) y[b].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

/* ggml quantize_row_q5_0_ref: d = (signed max-magnitude value) / -16. */
void kref_from_float_q5_0(const float *src, void *dst, int64_t n) {
    blk_q5_0 *y = dst;
    for (int64_t b = 0; b < n / QK5_0; b++) {
        const float *x = src + b * QK5_0;
        const float d = kern_signed_absmax(x, QK5_0) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = kvl_f32_to_f16(d);
        uint8_t L[QK5_0];
        for (int j = 0; j < QK5_0; j++) L[j] = (uint8_t)KERN_MIN(31, (int)(x[j] * id + 16.5f));
        q5_pack(L, y[b].qs, y[b].qh);
    }
}

void kref_from_float_q5_1(const float *src, void *dst, int64_t n) {
    blk_q5_1 *y = dst;
    for (int64_t b = 0; b < n / QK5_1; b++) {
        uint8_t L[QK5_1];
        min_block_levels(src + b * QK5_1, 31, &y[b].d, &y[b].m, L);
        q5_pack(L, y[b].qs, y[b].qh);
    }
}

/* llama.cpp's x86 quantize_row_q8_1 (quant32.h). */
void kref_from_float_q8_1(const float *src, void *dst, int64_t n) {
    blk_q8_1 *y = dst;
    for (int64_t b = 0; b < n / QK8_1; b++) {
        const float *x = src + b * QK8_1;
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[b].d = kvl_f32_to_f16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[b].qs[j] = (int8_t)kern_nearest_int(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].s = kvl_f32_to_f16(d * (float)sum);
    }
}

int kern_iq4nl_best_index(float x) {
    const int8_t *val = kern_iq4nl_values;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* The weighted fit of levels to xb at inverse scale id: sum w q x and sum w q^2
 * (w = x^2, the weights without an importance matrix), and the indices. */
static void iq4nl_fit(const float *xb, float id, uint8_t *L, float *sumqx, float *sumq2) {
    float sx = 0, s2 = 0;
    for (int j = 0; j < QK4_NL; j++) {
        const int l = kern_iq4nl_best_index(id * xb[j]);
        if (L) L[j] = (uint8_t)l;
        const float q = kern_iq4nl_values[l];
        const float w = xb[j] * xb[j];
        sx += w * q * xb[j];
        s2 += w * q * q;
    }
    *sumqx = sx, *sumq2 = s2;
}

/* ggml quantize_row_iq4_nl_impl for one 32-value block, no importance
 * matrix: ntry 7 as llama-quantize runs it (quantize_iq4_nl), or -1, no
 * search, as its CPU backend quantizes at run time (quantize_row_iq4_nl_ref:
 * a cache row). */
static void quantize_iq4_nl_block(const float *x, blk_iq4_nl *y, int ntry) {
    const int8_t *values = kern_iq4nl_values;
    uint8_t L[QK4_NL];
    const float max = kern_signed_absmax(x, QK4_NL);
    float d = 0;
    if (fabsf(max) >= KERN_GROUP_MAX_EPS) {
        /* ggml's first scale takes the opposite sign without the search */
        d = ntry > 0 ? -max / values[0] : max / values[0];
        float sumqx, sumq2;
        iq4nl_fit(x, 1 / d, L, &sumqx, &sumq2);
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            iq4nl_fit(x, (float)(itry + values[0]) / max, NULL, &sumqx, &sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
    } else {
        memset(L, 8, sizeof L); /* any index: d is 0 */
    }
    y->d = kvl_f32_to_f16(d);
    /* with the search the indices are taken again for the scale it chose;
     * without it they stay those of the first fit, as in ggml */
    const float id = d ? 1 / d : 0;
    for (int j = 0; ntry > 0 && j < QK4_NL; j++) L[j] = (uint8_t)kern_iq4nl_best_index(id * x[j]);
    for (int j = 0; j < QK4_NL / 2; j++) y->qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

void kref_from_float_iq4_nl(const float *src, void *dst, int64_t n) {
    blk_iq4_nl *y = dst;
    for (int64_t b = 0; b < n / QK4_NL; b++) quantize_iq4_nl_block(src + b * QK4_NL, &y[b], 7);
}

void kref_act_from_float_iq4_nl(const float *src, void *dst, int64_t n) {
    blk_iq4_nl *y = dst;
    for (int64_t b = 0; b < n / QK4_NL; b++) quantize_iq4_nl_block(src + b * QK4_NL, &y[b], -1);
}

/* ======================= dot products ======================= */

/* Each type's block as a kern_q32_block (quant32.h): dequantization and dot. */
KERN_K_INLINE void unpack_q5_0(const void *blk, kern_q32_block *u) {
    const blk_q5_0 *x = blk;
    for (int j = 0; j < 16; j++) {
        u->v[j] = (int8_t)(((x->qs[j] & 0x0F) | q5_high(x->qh, j)) - 16);
        u->v[j + 16] = (int8_t)(((x->qs[j] >> 4) | q5_high(x->qh, j + 16)) - 16);
    }
    u->d = kvl_f16_to_f32(x->d), u->m = 0;
}
KERN_K_INLINE void unpack_iq4_nl(const void *blk, kern_q32_block *u) {
    const blk_iq4_nl *x = blk;
    for (int j = 0; j < 16; j++) {
        u->v[j] = kern_iq4nl_values[x->qs[j] & 0x0F];
        u->v[j + 16] = kern_iq4nl_values[x->qs[j] >> 4];
    }
    u->d = kvl_f16_to_f32(x->d), u->m = 0;
}
KERN_K_INLINE void unpack_q4_1(const void *blk, kern_q32_block *u) {
    const blk_q4_1 *x = blk;
    for (int j = 0; j < 16; j++) {
        u->v[j] = (int8_t)(x->qs[j] & 0x0F);
        u->v[j + 16] = (int8_t)(x->qs[j] >> 4);
    }
    u->d = kvl_f16_to_f32(x->d), u->m = kvl_f16_to_f32(x->m);
}
KERN_K_INLINE void unpack_q5_1(const void *blk, kern_q32_block *u) {
    const blk_q5_1 *x = blk;
    for (int j = 0; j < 16; j++) {
        u->v[j] = (int8_t)((x->qs[j] & 0x0F) | q5_high(x->qh, j));
        u->v[j + 16] = (int8_t)((x->qs[j] >> 4) | q5_high(x->qh, j + 16));
    }
    u->d = kvl_f16_to_f32(x->d), u->m = kvl_f16_to_f32(x->m);
}
KREF_Q32_KERNELS(q5_0, false)
KREF_Q32_KERNELS(iq4_nl, false)
KREF_Q32_KERNELS(q4_1, true)
KREF_Q32_KERNELS(q5_1, true)
