/* kernels: scalar reference for Q2_K, Q3_K, Q5_K and IQ4_XS (super-blocks of
 * 256, multiplied against Q8_K activations).
 *
 * As in quant_ref.c: dequantization and quantization follow ggml operation by
 * operation, so our quantizers write the bytes llama-quantize writes (without
 * an importance matrix it calls quantize_row_{q2,q3,q5}_K_ref, and for IQ4_XS
 * the non-linear search with weights x^2 and 7 tries each way); dot products
 * follow the canonical K-family order of kern_impl.h: per super-block, exact
 * int32 totals enter one float accumulator through fmaf.
 *
 * Value order inside a super-block (element e = 0..255):
 *  Q2_K, Q3_K: e = 128h + 32j + l: 2 bits at shift 2j of qs[32h + l]; Q3_K's
 *              third bit is bit 4h + j of hmask[l]; group e / 16.
 *  Q5_K:       e = 64c + 32t + l: nibble t of qs[32c + l], fifth bit 2c + t
 *              of qh[l]; group e / 32 (Q4_K's 12-byte scales and mins).
 *  IQ4_XS:     e = 32g + 16t + l: nibble t of qs[16g + l]; group g. */
#include "kern_impl.h"

#include <string.h>

/* kern_iq4nl_values (IQ4_XS shares IQ4_NL's 16 levels) is defined in quant32_ref.c. */

/* 2-bit field of element e (Q2_K, Q3_K layout). */
static inline int q2_bits(const uint8_t *qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}
/* Q3_K value of element e, -4..3. */
static inline int q3_value(const blk_q3_K *x, int e) {
    const int hbit = (x->hmask[e % 32] >> (4 * (e / 128) + (e % 128) / 32)) & 1;
    return q2_bits(x->qs, e) - (hbit ? 0 : 4);
}
/* Q5_K value of element e, 0..31. */
static inline int q5_value(const blk_q5_K *x, int e) {
    const int c = e / 64, t = (e % 64) / 32, l = e % 32;
    const int lo = t ? x->qs[32 * c + l] >> 4 : x->qs[32 * c + l] & 0xF;
    return lo | (((x->qh[l] >> (2 * c + t)) & 1) << 4);
}
/* IQ4_XS table index of element e, and the 6-bit scale of group g (0..63). */
static inline int iq4_index(const blk_iq4_xs *x, int e) {
    const int g = e / 32, t = (e % 32) / 16, l = e % 16;
    return t ? x->qs[16 * g + l] >> 4 : x->qs[16 * g + l] & 0xF;
}
static inline int iq4xs_scale(const blk_iq4_xs *x, int g) {
    return ((x->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((x->scales_h >> (2 * g)) & 3) << 4);
}

/* ======================= quantization ======================= */

/* Packs 256 2-bit values in the Q2_K / Q3_K order. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *Lh = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(Lh[0] | (Lh[32] << 2) | (Lh[64] << 4) | (Lh[96] << 6));
        }
}

static void quantize_q2_K_block(const float *x, blk_q2_K *y) {
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = kern_make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                          -0.5f, 0.1f, 15, true);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
        const float iscale = q4scale / max_scale;
        for (int j = 0; j < QK_K / 16; j++)
            y->scales[j] = (uint8_t)kern_nearest_int(iscale * scales[j]);
        y->d = kvl_f32_to_f16(max_scale / q4scale);
    } else {
        memset(y->scales, 0, sizeof y->scales);
        y->d = kvl_f32_to_f16(0.f);
    }
    if (max_min > 0) {
        const float iscale = q4scale / max_min;
        for (int j = 0; j < QK_K / 16; j++)
            y->scales[j] |= (uint8_t)(kern_nearest_int(iscale * mins[j]) << 4);
        y->dmin = kvl_f32_to_f16(max_min / q4scale);
    } else {
        y->dmin = kvl_f32_to_f16(0.f);
    }
    /* Requantize against the stored scales, as ggml does. */
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = kvl_f16_to_f32(y->d) * (y->scales[j] & 0xF);
        if (!d) continue;
        const float dm = kvl_f16_to_f32(y->dmin) * (y->scales[j] >> 4);
        for (int ii = 0; ii < 16; ii++) {
            const int l = kern_nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = (uint8_t)KERN_MAX(0, KERN_MIN(3, l));
        }
    }
    pack_2bit(L, y->qs);
}

/* ggml quantize_row_q2_K_ref. */
KREF_K_FROM_FLOAT(q2_K)

/* ggml make_q3_quants with do_rmse: symmetric group in [-nmax, nmax-1], refined
 * value by value with weights x^2; L receives l + nmax. Returns the scale. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float sumlx, suml2;
    const float max = kern_sym_first(n, nmax, x, L, 0, &sumlx, &suml2);
    if (max == 0.f) return 0.f;
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = kern_nearest_int(x[i] * sl2 / slx);
                new_l = KERN_MAX(-nmax, KERN_MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static void quantize_q3_K_block(const float *x, blk_q3_K *y) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int j = 0; j < QK_K / 16; j++) scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
    const float max_scale = kern_signed_absmax(scales, QK_K / 16);
    memset(y->scales, 0, sizeof y->scales);
    if (max_scale) {
        const float iscale = -32.f / max_scale;
        for (int j = 0; j < QK_K / 16; j++) {
            int l = (int8_t)kern_nearest_int(iscale * scales[j]); /* ggml stores it in an int8_t */
            l = KERN_MAX(-32, KERN_MIN(31, l)) + 32;
            if (j < 8) y->scales[j] = (uint8_t)(l & 0xF);
            else y->scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
            y->scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        y->d = kvl_f32_to_f16(1 / iscale);
    } else {
        y->d = kvl_f32_to_f16(0.f);
    }
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = kvl_f16_to_f32(y->d) * (kern_q3k_scale(j, y->scales) - 32);
        if (!d) continue;
        for (int ii = 0; ii < 16; ii++) {
            const int l = kern_nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(KERN_MAX(-4, KERN_MIN(3, l)) + 4);
        }
    }
    /* third bit: element e sets bit e / 32 of hmask[e % 32] */
    uint8_t low[QK_K];
    memset(y->hmask, 0, sizeof y->hmask);
    for (int e = 0; e < QK_K; e++) {
        int l = L[e];
        if (l > 3) {
            y->hmask[e % 32] |= (uint8_t)(1 << (e / 32));
            l -= 4;
        }
        low[e] = (uint8_t)l;
    }
    pack_2bit(low, y->qs);
}

/* ggml quantize_row_q3_K_ref. */
KREF_K_FROM_FLOAT(q3_K)

static void quantize_q5_K_block(const float *x, blk_q5_K *y) {
    uint8_t L[QK_K];
    kern_q4k_quantize_groups(x, 31, -0.5f, 15, y->scales, &y->d, &y->dmin, L);
    memset(y->qh, 0, sizeof y->qh);
    for (int c = 0; c < QK_K / 64; c++)
        for (int l = 0; l < 32; l++) {
            int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
            if (l1 > 15) {
                l1 -= 16;
                y->qh[l] |= (uint8_t)(1 << (2 * c));
            }
            if (l2 > 15) {
                l2 -= 16;
                y->qh[l] |= (uint8_t)(2 << (2 * c));
            }
            y->qs[32 * c + l] = (uint8_t)(l1 | (l2 << 4));
        }
}

/* ggml quantize_row_q5_K_ref. */
KREF_K_FROM_FLOAT(q5_K)

static void quantize_iq4_xs_block(const float *x, blk_iq4_xs *y) {
    const int8_t *values = kern_iq4nl_values;
    const int ntry = 7;
    uint8_t L[QK_K];
    float scales[QK_K / 32], weight[32];
    memset(y->qs, 0, sizeof y->qs);
    y->d = kvl_f32_to_f16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *Lb = L + 32 * ib;
        for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        const float max = kern_signed_absmax(xb, 32);
        if (fabsf(max) < KERN_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float al = id * xb[j];
            const int l = kern_iq4nl_best_index(al);
            Lb[j] = (uint8_t)l;
            const float q = values[l], w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const float al = id * xb[j];
                const int l = kern_iq4nl_best_index(al);
                const float q = values[l], w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    y->scales_h = 0;
    const float d = -max_scale / 32;
    y->d = kvl_f32_to_f16(d);
    const float id = d ? 1 / d : 0.f;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        int l = kern_nearest_int(id * scales[ib]);
        l = KERN_MAX(-32, KERN_MIN(31, l));
        const float dl = d * l;
        const float idl = dl ? 1 / dl : 0.f;
        for (int j = 0; j < 32; j++)
            L[32 * ib + j] = (uint8_t)kern_iq4nl_best_index(idl * x[32 * ib + j]);
        l += 32;
        if (ib % 2 == 0) y->scales_l[ib / 2] = (uint8_t)(l & 0xF);
        else y->scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
        y->scales_h |= (uint16_t)((l >> 4) << (2 * ib));
    }
    for (int i = 0; i < QK_K / 32; i++)
        for (int j = 0; j < 16; j++)
            y->qs[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

/* ggml quantize_iq4_xs without an importance matrix (=
 * quantize_row_iq4_xs_ref). */
KREF_K_FROM_FLOAT(iq4_xs)

/* ================= dot products and dequantization ================= */

/* Each type's super-block unpacked for the K family's one dot and one
 * dequantization (kern_k_vec_dot, kern_k_to_float in kern_impl.h). */

/* Q2_K: values 0..3, a 4-bit scale and min per 16. */
KERN_K_INLINE void unpack_q2_K(const void *vx, kern_k_block *u) {
    const blk_q2_K *x = vx;
    for (int e = 0; e < QK_K; e++) u->v[e] = (int8_t)q2_bits(x->qs, e);
    for (int g = 0; g < QK_K / 16; g++) u->sc[g] = x->scales[g] & 0xF, u->m[g] = x->scales[g] >> 4;
    u->group = 16, u->mins = true, u->d = x->d, u->dmin = x->dmin;
}
KREF_K_KERNELS(q2_K)

/* Q3_K: values -4..3, a 6-bit scale - 32 per 16. */
KERN_K_INLINE void unpack_q3_K(const void *vx, kern_k_block *u) {
    const blk_q3_K *x = vx;
    for (int e = 0; e < QK_K; e++) u->v[e] = (int8_t)q3_value(x, e);
    for (int g = 0; g < QK_K / 16; g++) u->sc[g] = kern_q3k_scale(g, x->scales) - 32;
    u->group = 16, u->mins = false, u->d = x->d;
}
KREF_K_KERNELS(q3_K)

/* Q5_K: as Q4_K (values 0..31). */
KERN_K_INLINE void unpack_q5_K(const void *vx, kern_k_block *u) {
    const blk_q5_K *x = vx;
    for (int e = 0; e < QK_K; e++) u->v[e] = (int8_t)q5_value(x, e);
    kern_k_q4k_scales(x->scales, x->d, x->dmin, u);
}
KREF_K_KERNELS(q5_K)

/* IQ4_XS: the IQ4_NL table's values, a 6-bit scale - 32 per 32. */
KERN_K_INLINE void unpack_iq4_xs(const void *vx, kern_k_block *u) {
    const blk_iq4_xs *x = vx;
    for (int e = 0; e < QK_K; e++) u->v[e] = kern_iq4nl_values[iq4_index(x, e)];
    for (int g = 0; g < QK_K / 32; g++) u->sc[g] = iq4xs_scale(x, g) - 32;
    u->group = 32, u->mins = false, u->d = x->d;
}
KREF_K_KERNELS(iq4_xs)
