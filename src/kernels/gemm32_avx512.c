/* kernels: packed GEMM for Q5_0 and IQ4_NL weights (AVX-512 VNNI), by way of
 * the Q8_0 one of gemm_avx512.c; and for Q4_1 and Q5_1 (against Q8_1), the
 * same panels with a min per row and a kernel of their own (below).
 *
 * Both types multiply Q8_0 activations in the Q family's canonical order
 * (quant32.h), exactly as Q8_0 weights do. So their panels are Q8_0 panels:
 * per block, 8 groups of 16 dwords (group g, lane r: the values 4g..4g+3 of
 * row r as unsigned bytes v + 128), then the 16 rows' scales as floats; and
 * the Q8_0 activation tiles, their preparation and the Q8_0 kernel (which
 * adds c = -128 * sum(q) to each block's vpdpbusd sums) do the rest. Only
 * the packing differs: the 5-bit or non-linear values are widened to bytes
 * once per panel. Every output is bit-identical to vec_dot. */
#include "gemm_avx512.h"

/* The Q8_0 panel's block (QP_BLK): 8 x 64 bytes of values, then 16 floats. */
#define P8_VALS 512

/* Q5_0 block values v (-16..15) as v + 128. */
T_512_INLINE __m256i q5_0_bytes(const void *blk) {
    const blk_q5_0 *x = blk;
    const __m256i u = _mm256_or_si256(kern_nibbles32(x->qs), kern_q5_high_bits(x->qh));
    return _mm256_add_epi8(u, _mm256_set1_epi8(112)); /* v + 16 -> v + 128 */
}

/* IQ4_NL block values (the levels) as level + 128. */
T_512_INLINE __m256i iq4_nl_bytes(const void *blk) {
    return kern_iq4nl_u8(((const blk_iq4_nl *)blk)->qs);
}

/* rows (<= 16) rows of W into Q8_0 panels (with_min: Q8_1 panels, QP1_BLK,
 * the block's m from its bytes 2..3 after d); rows past `rows` read as 0. The
 * block's fp16 scale is its first two bytes in every type. */
T_512_INLINE void pack32(const void *w, size_t wrow, int rows, int64_t k, void *panel, size_t bb,
                         __m256i (*bytes)(const void *), bool with_min) {
    _Alignas(64) uint8_t tmp[KERN_PANEL_ROWS][32];
    _Alignas(64) float sd[KERN_PANEL_ROWS], sm[KERN_PANEL_ROWS];
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(32));
    memset(tmp, 0, sizeof tmp);
    memset(sd, 0, sizeof sd);
    if (with_min) memset(sm, 0, sizeof sm);
    char *out = panel;
    for (int64_t b = 0; b < k / QK8_0; b++, out += with_min ? QP1_BLK : QP_BLK) {
        for (int r = 0; r < rows; r++) {
            const char *blk = (const char *)w + r * wrow + b * bb;
            _mm256_store_si256((__m256i *)tmp[r], bytes(blk));
            kvl_f16 h[2];
            memcpy(h, blk, with_min ? 4 : 2);
            sd[r] = f16_load(h[0]);
            if (with_min) sm[r] = f16_load(h[1]);
        }
        UNROLL(8)
        for (int g = 0; g < 8; g++)
            _mm512_storeu_si512(out + 64 * g,
                                _mm512_i32gather_epi32(idx, (const void *)(&tmp[0][4 * g]), 1));
        _mm512_storeu_ps(out + P8_VALS, _mm512_load_ps(sd));
        if (with_min) _mm512_storeu_ps(out + P8_VALS + 64, _mm512_load_ps(sm));
    }
}

T_512 static void q5_0_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack32(w, wrow, rows, k, panel, sizeof(blk_q5_0), q5_0_bytes, false);
}
T_512 static void iq4_nl_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack32(w, wrow, rows, k, panel, sizeof(blk_iq4_nl), iq4_nl_bytes, false);
}

/* The Q8_0 GEMM's pieces. */
static size_t panel_bytes(int64_t k) { return (size_t)(k / QK8_0) * QP_BLK; }
static void prepare(const float *x, void *tile, int slot, int rows, int64_t k) {
    kavx512_gemm_q8_0.prepare(x, tile, slot, rows, k);
}
static void kernel(int64_t k, const void *w, size_t wstride, int n_rows, const void *tiles,
                   int64_t m, float *y, size_t ldy) {
    kavx512_gemm_q8_0.kernel(k, w, wstride, n_rows, tiles, m, y, ldy);
}

/* Below this many activation rows vec_dot is cheaper than packing (as Q8_0's). */
#define GEMM32_MIN_M 4

const kern_gemm_ops kavx512_gemm_q5_0 = {
    QT, GEMM32_MIN_M, kavx512_q_tile_bytes, prepare, panel_bytes, q5_0_pack, kernel};
const kern_gemm_ops kavx512_gemm_iq4_nl = {
    QT, GEMM32_MIN_M, kavx512_q_tile_bytes, prepare, panel_bytes, iq4_nl_pack, kernel};

/* ======================= Q4_1, Q5_1 against Q8_1 =======================
 * Panel, per block: the values (0..15 or 0..31) as unsigned bytes in the
 * dword-group layout above, then the 16 rows' d, then their m, as floats.
 * Activation tile (QT rows), per block: qs[QT][32] int8, then d[QT] and
 * s[QT], the Q8_1 block's fp16 d and s widened to float. A lane then runs the
 * canonical steps of quant32.h: v = fma(d_x * d_y, isum, m_x * s_y), f = f + v. */

static size_t q1_panel_bytes(int64_t k) { return (size_t)(k / QK8_1) * QP1_BLK; }

T_512_INLINE __m256i q4_1_bytes(const void *blk) {
    return kern_nibbles32(((const blk_q4_1 *)blk)->qs);
}
T_512_INLINE __m256i q5_1_bytes(const void *blk) {
    const blk_q5_1 *x = blk;
    return _mm256_or_si256(kern_nibbles32(x->qs), kern_q5_high_bits(x->qh));
}

T_512 static void q4_1_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack32(w, wrow, rows, k, panel, sizeof(blk_q4_1), q4_1_bytes, true);
}
T_512 static void q5_1_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack32(w, wrow, rows, k, panel, sizeof(blk_q5_1), q5_1_bytes, true);
}

/* Row x into slot `slot` of a tile: kavx2_from_float_q8_1's bytes, block by block. */
T_512 static void q1_prepare(const float *x, void *tile, int slot, int rows, int64_t k) {
    char *t = tile;
    for (int64_t b = 0; b < k / QK8_1; b++, t += QT_BLK, x += QK8_1) {
        blk_q8_1 q;
        kavx2_from_float_q8_1(x, &q, QK8_1);
        memcpy(t + QK8_1 * slot, q.qs, QK8_1);
        const float d = f16_load(q.d), s = f16_load(q.s);
        memcpy(t + QT * QK8_1 + 4 * slot, &d, 4);
        memcpy(t + QT * (QK8_1 + 4) + 4 * slot, &s, 4);
    }
}

KAVX512_KERNEL_ENTRY(q1_kernel, kavx512_q_kernel, true)

const kern_gemm_ops kavx512_gemm_q4_1 = {
    QT, GEMM32_MIN_M, kavx512_q_tile_bytes, q1_prepare, q1_panel_bytes, q4_1_pack, q1_kernel};
const kern_gemm_ops kavx512_gemm_q5_1 = {
    QT, GEMM32_MIN_M, kavx512_q_tile_bytes, q1_prepare, q1_panel_bytes, q5_1_pack, q1_kernel};
