/* kernels: packed AVX-512 GEMM (prefill) for Q2_K, Q3_K, Q5_K and IQ4_XS weights.
 *
 * These types pack into the panel layouts gemm_avx512.c defines for Q4_K and
 * Q6_K, so its micro-kernels and Q8_K activation tiles do the work:
 *  - Q5_K is Q4_K with 5-bit values: the Q4_K panel (u = 0..31, the same
 *    scales, mins and d / dmin);
 *  - Q3_K and IQ4_XS take the Q6_K panel (groups of 16: u = q + bias, int32
 *    group scale sc, and int16 pairs -bias * sc against the bsums): Q3_K with
 *    u = q + 4, sc = scale - 32; IQ4_XS with u = value + 128 and each 32-value
 *    group's scale - 32 on both of its halves;
 *  - Q2_K adds its mins and dmin to the Q6_K panel and has its own micro-kernel.
 * Per output the integer total is exactly the reference's (sum_g sc_g * sum
 * (u - bias) * q8) and the float steps are those of its vec_dot (one fma with
 * d * yd; Q5_K a second with -dmin * yd), so results are bit-identical.
 * Packing decodes row by row; the kernels are shared. */
#include "gemm_avx512.h"

#include <string.h>

/* Panel bytes per super-block (gemm_avx512.h) */
#define PB_G32 KPC_PB(8, true)
#define PB_G16 KPC_PB(16, false)

/* Smallest batch the packed GEMM takes (below, the rows kernels decode the
 * weights once per 4 rows, cheaper than packing them). */
#define KX_GEMM_MIN_M 16

static size_t g32_panel_bytes(int64_t k) { return (size_t)(k / QK_K) * PB_G32; }
static size_t g16_panel_bytes(int64_t k) { return (size_t)(k / QK_K) * PB_G16; }

/* One row's super-block in panel form: the 256 unsigned values, 16 (or 8)
 * int32 group scales, 16 int16 bias factors (or 8 mins), d and dmin. */
typedef struct {
    uint8_t u[QK_K];
    int32_t sc[16];
    int16_t bias[16];
    float d, dmin;
} kx_row;

/* Writes row r (0..15) of a super-block's panel of G groups (8: the Q4_K
 * layout, 16: the Q6_K one; KPC_SC .. in gemm_avx512.h): the values, the
 * int32 group scales, the G / 2 int16 pairs of bias factors (or mins), then
 * the float d and, with dmin, dmin 64 bytes on. */
static inline __attribute__((always_inline)) void put_groups(char *out, int r, const kx_row *x,
                                                             int G, bool dmin) {
    kavx512_put_lanes(out, r, x->u, 64);
    for (int g = 0; g < G; g++) memcpy(out + KPC_SC + 64 * g + 4 * r, &x->sc[g], 4);
    char *o = out + KPC_PAIRS(G);
    for (int t = 0; t < G / 2; t++) {
        const int32_t bp =
            (int32_t)((uint16_t)x->bias[2 * t] | ((uint32_t)(uint16_t)x->bias[2 * t + 1] << 16));
        memcpy(o + 64 * t + 4 * r, &bp, 4);
    }
    o = out + KPC_D(G);
    memcpy(o + 4 * r, &x->d, 4);
    if (dmin) memcpy(o + 64 + 4 * r, &x->dmin, 4);
}
static void put_g32(char *out, int r, const kx_row *x) { put_groups(out, r, x, 8, true); }
static void put_g16(char *out, int r, const kx_row *x) { put_groups(out, r, x, 16, false); }

static void decode_q5_K(const blk_q5_K *x, kx_row *o) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t q = x->qs[32 * c + l], h = x->qh[l];
            o->u[64 * c + l] = (uint8_t)((q & 0xF) | (((h >> (2 * c)) & 1) << 4));
            o->u[64 * c + 32 + l] = (uint8_t)((q >> 4) | (((h >> (2 * c + 1)) & 1) << 4));
        }
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kern_q4k_scale_min(j, x->scales, &sc, &m);
        o->sc[j] = sc;
        o->bias[j] = m;
    }
    o->d = kvl_f16_to_f32(x->d);
    o->dmin = kvl_f16_to_f32(x->dmin);
}

static void decode_q3_K(const blk_q3_K *x, kx_row *o) {
    for (int e = 0; e < QK_K; e++) {
        const int h = e / 128, j = (e % 128) / 32, l = e % 32;
        const int low = (x->qs[32 * h + l] >> (2 * j)) & 3;
        const int hb = (x->hmask[l] >> (4 * h + j)) & 1;
        o->u[e] = (uint8_t)(low | (hb << 2)); /* q + 4 */
    }
    for (int g = 0; g < 16; g++) {
        o->sc[g] = kern_q3k_scale(g, x->scales) - 32;
        o->bias[g] = (int16_t)(-4 * o->sc[g]);
    }
    o->d = kvl_f16_to_f32(x->d);
    o->dmin = 0;
}

static void decode_iq4_xs(const blk_iq4_xs *x, kx_row *o) {
    for (int g = 0; g < 8; g++) {
        for (int l = 0; l < 16; l++) {
            const uint8_t q = x->qs[16 * g + l];
            o->u[32 * g + l] = (uint8_t)(kern_iq4nl_values[q & 0xF] + 128);
            o->u[32 * g + 16 + l] = (uint8_t)(kern_iq4nl_values[q >> 4] + 128);
        }
        const int ls =
            ((x->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((x->scales_h >> (2 * g)) & 3) << 4);
        o->sc[2 * g] = o->sc[2 * g + 1] = ls - 32;
        o->bias[2 * g] = o->bias[2 * g + 1] = (int16_t)(-128 * (ls - 32));
    }
    o->d = kvl_f16_to_f32(x->d);
    o->dmin = 0;
}

/* Q2_K: the Q6_K panel's groups of 16 (u = q, no bias) plus 16 mins as int16
 * pairs against the bsums, and dmin: its own micro-kernel (below). */
#define PB_Q2K KPC_PB(16, true)
static size_t q2k_panel_bytes(int64_t k) { return (size_t)(k / QK_K) * PB_Q2K; }

static void decode_q2_K(const blk_q2_K *x, kx_row *o) {
    for (int e = 0; e < QK_K; e++)
        o->u[e] = (uint8_t)((x->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
    for (int g = 0; g < 16; g++) {
        o->sc[g] = x->scales[g] & 0xF;
        o->bias[g] = (int16_t)(x->scales[g] >> 4); /* the mins, at the bias pairs' place */
    }
    o->d = kvl_f16_to_f32(x->d);
    o->dmin = kvl_f16_to_f32(x->dmin);
}

static void put_q2k(char *out, int r, const kx_row *x) { put_groups(out, r, x, 16, true); }

/* rows (<= 16) rows of W, wrow bytes apart; missing rows are zeros. */
#define KX_PACK(name, blk, decode, put, pb)                                                        \
    static void name(const void *w, size_t wrow, int rows, int64_t k, void *panel) {               \
        memset(panel, 0, (size_t)(k / QK_K) * (pb));                                               \
        kx_row x;                                                                                  \
        for (int r = 0; r < rows; r++) {                                                           \
            const blk *row = (const blk *)((const char *)w + (size_t)r * wrow);                    \
            for (int64_t sb = 0; sb < k / QK_K; sb++) {                                            \
                decode(&row[sb], &x);                                                              \
                put((char *)panel + sb * (pb), r, &x);                                             \
            }                                                                                      \
        }                                                                                          \
    }
KX_PACK(q5k_pack, blk_q5_K, decode_q5_K, put_g32, PB_G32)
KX_PACK(q3k_pack, blk_q3_K, decode_q3_K, put_g16, PB_G16)
KX_PACK(iq4xs_pack, blk_iq4_xs, decode_iq4_xs, put_g16, PB_G16)
KX_PACK(q2k_pack, blk_q2_K, decode_q2_K, put_q2k, PB_Q2K)

/* 16 weight rows (lanes) against the KT rows of a tile: per super-block
 * sumi = sum_g sc_g * dot16_g and summ = sum_g m_g * bsum_g, exact, then
 * f = fma(d * yd, sumi, f); f = fma(-(dmin * yd), summ, f) as the vec_dot. */
T_512_INLINE void q2k_micro(int64_t nsb, const char *P, const char *A, float *y, size_t ldy, int na,
                            __mmask16 mask) {
    kavx512_k_pc_micro(16, true, nsb, P, A, y, ldy, na, mask);
}
KAVX512_K_KERNEL(static, q2k_kernel, q2k_micro)

const kern_gemm_ops kavx512_gemm_q5_K =
    KAVX512_K_GEMM_OPS(KX_GEMM_MIN_M, g32_panel_bytes, q5k_pack, kavx512_k_g32_kernel);
const kern_gemm_ops kavx512_gemm_q3_K =
    KAVX512_K_GEMM_OPS(KX_GEMM_MIN_M, g16_panel_bytes, q3k_pack, kavx512_k_g16_kernel);
const kern_gemm_ops kavx512_gemm_q2_K =
    KAVX512_K_GEMM_OPS(KX_GEMM_MIN_M, q2k_panel_bytes, q2k_pack, q2k_kernel);
const kern_gemm_ops kavx512_gemm_iq4_xs =
    KAVX512_K_GEMM_OPS(KX_GEMM_MIN_M, g16_panel_bytes, iq4xs_pack, kavx512_k_g16_kernel);
