/* kernels: repacked Q4_K / Q6_K weights for AVX-512 VNNI (kern_repack_ops).
 *
 * As in repack_avx512.c, a panel holds 16 weight rows in the 16 dword lanes
 * of a vector, so one vpdpbusd against 4 broadcast activation bytes advances
 * 16 outputs, and the quantized values stay packed (the kernel widens them),
 * so decode reads about as many bytes as from the GGUF rows. A panel is one
 * run of super-blocks, each a whole number of cache lines, its scales first,
 * so that the kernels read every super-block front to back (with the scales
 * at the end, read first, batched products streamed markedly slower):
 *
 *   Q4_K, 2368 bytes (37 lines; the GGUF rows take 2304):
 *     0     scales, u8 [8 sub-blocks][16 rows]
 *     128   mins, u8 [4 pairs t][16 rows][2]: widened to int16, lane r is
 *           the pair (min 2t, min 2t+1) for vpdpwssd against the tile's S[]
 *     256   d, fp16 [16]; 288 dmin, fp16 [16]
 *     320   32 vectors: vector v, lane r = GGUF bytes qs[4v..4v+3] of row r
 *           unchanged, v = 8c + g: low nibbles are elements 64c + 4g.. of
 *           sub-block 2c, high nibbles elements 64c + 32 + 4g.. of 2c + 1
 *
 *   Q6_K, 3392 bytes (53 lines; the GGUF rows take 3360):
 *     0     scales, int8 [16 sub-blocks][16 rows]
 *     256   d, fp16 [16]; 288..319 zero
 *     320   16 sub-blocks j of 16 elements, 3 vectors each (3j, 3j+1, 3j+2):
 *           byte i of lane r of vector 3j+q (q < 3) holds the unsigned 6-bit
 *           value (q6 + 32) of element 16j + 4q + i of row r in bits 0-5,
 *           and bits 2q, 2q+1 of the value of element 16j + 12 + i in bits
 *           6-7; the fourth group comes back with shifts and two vpternlogd
 *
 * Integer sums per output are exact (bounds below), and the float steps are
 * those of kref_vec_dot_q4_K / _q6_K, lane by lane, super-blocks in order, so
 * every output is bit-identical to vec_dot. Activations come in the tiles of
 * kavx512_gemm_q4_K / _q6_K (gemm_avx512.h: KT rows, a blk_q8_K and S[8] per
 * unit). The micro kernels are instantiated per count of active activation
 * rows, so decode does one row's work. */
#include "gemm_avx512.h"

#include <string.h>

/* The two layouts above (kavx512_r_layout); Q4_K's scales, mins, d, dmin at
 * KR_SC .. (gemm_avx512.h) */
static const kavx512_r_layout R4 = {
    .sc = KR_SC, .d = KR_D, .dmin = KR_DMIN, .qs = 320, .sb = 2368, .pf_dist = 3};
static const kavx512_r_layout R6 = {.sc = 0, .d = 256, .qs = 320, .sb = 3392, .pf_dist = 2};

/* ------------------------------------------------------------- packing -- */

/* Row r of the blk_q4_K super-block o (KAVX512_R_PACK). */
KERN_K_INLINE void r4k_put(char *o, int r, const blk_q4_K *x) {
    kavx512_put_lanes(o + R4.qs, r, x->qs, 32);
    kavx512_put_mins_head(o, r, x->scales, x->d, x->dmin);
}
KAVX512_R_PACK(r4k, blk_q4_K, R4, r4k_put)

/* Row r of the blk_q6_K super-block o (KAVX512_R_PACK). */
KERN_K_INLINE void r6k_put(char *o, int r, const blk_q6_K *x) {
    /* the values q6 + 32 in element order (kref_to_float_q6_K), 8 at
     * a time in a word: every shift is masked back into its byte */
    uint8_t q[QK_K];
    const uint64_t m4 = 0x0F0F0F0F0F0F0F0Full, m2 = 0x0303030303030303ull;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l += 8) {
            uint64_t l0, l1, hb, v[4];
            memcpy(&l0, x->ql + 64 * h + l, 8);
            memcpy(&l1, x->ql + 64 * h + 32 + l, 8);
            memcpy(&hb, x->qh + 32 * h + l, 8);
            v[0] = (l0 & m4) | (hb & m2) << 4;
            v[1] = (l1 & m4) | (hb >> 2 & m2) << 4;
            v[2] = (l0 >> 4 & m4) | (hb >> 4 & m2) << 4;
            v[3] = (l1 >> 4 & m4) | (hb >> 6 & m2) << 4;
            for (int i = 0; i < 4; i++) memcpy(q + 128 * h + 32 * i + l, &v[i], 8);
        }
    char *const qs = o + R6.qs;
    for (int j = 0; j < 16; j++) {
        uint32_t d4;
        memcpy(&d4, q + 16 * j + 12, 4);
        for (int qq = 0; qq < 3; qq++) {
            uint32_t v;
            memcpy(&v, q + 16 * j + 4 * qq, 4);
            v |= (d4 >> 2 * qq & 0x03030303u) << 6;
            memcpy(qs + 64 * (3 * j + qq) + 4 * r, &v, 4);
        }
        o[R6.sc + 16 * j + r] = (char)x->scales[j];
    }
    memcpy(o + R6.d + 2 * r, &x->d, 2);
}
KAVX512_R_PACK(r6k, blk_q6_K, R6, r6k_put)

/* ------------------------------------------------------------- kernels -- */

/* Unit a of the current super-block of the tile. */
#define UNIT(a) (A + (size_t)(a)*KT_UNIT)

/* Sub-blocks 2c + h, h0 <= h < h1 (h = 0: the low nibbles of vectors
 * 8c..8c+7, h = 1: the high ones, taken in place as v & 0xF0), into s16[a]. */
T_512_INLINE void r4k_subs(int NA, int h0, int h1, int c, const char *P, const char *A,
                           __m512i *s16) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i acc[2][KT];
    UNROLL(2)
    for (int h = h0; h < h1; h++) UNROLL(8)
    for (int a = 0; a < NA; a++) acc[h][a] = _mm512_setzero_si512();
    UNROLL(8)
    for (int g = 0; g < 8; g++) {
        const __m512i v = _mm512_loadu_si512(P + R4.qs + 64 * (8 * c + g));
        const __m512i u[2] = {_mm512_and_si512(v, m4), _mm512_andnot_si512(m4, v)};
        UNROLL(8)
        for (int a = 0; a < NA; a++) UNROLL(2)
        for (int h = h0; h < h1; h++)
            acc[h][a] = _mm512_dpbusd_epi32(acc[h][a], u[h],
                                            bc32(UNIT(a) + KQ_QS + 64 * c + 32 * h + 4 * g));
    }
    UNROLL(2)
    for (int h = h0; h < h1; h++) {
        __m512i sc = _mm512_cvtepu8_epi32(ld128(P + R4.sc + 16 * (2 * c + h)));
        if (h == 0) sc = _mm512_slli_epi32(sc, 4);
        UNROLL(8)
        for (int a = 0; a < NA; a++)
            s16[a] = _mm512_add_epi32(s16[a], _mm512_mullo_epi32(acc[h][a], sc));
    }
}

/* Q4_K: one panel x NA activation rows, all nsb super-blocks (pf: prefetch
 * ahead, KAVX512_R_KERNEL). Per sub-block
 * and row, acc = the dot of its 32 nibbles with the activations; the high
 * nibbles count 16 times (one op fewer to widen), so the low sub-blocks'
 * scales are taken 16 times too and s16 = 16 * sumi, divided exactly at the
 * end: |16 sumi| <= 16 * 256 * 63 * 15 * 128 < 2^29. fused: each weight
 * vector is loaded once for both its sub-blocks (two accumulators per row,
 * also two dpbusd chains for overlap), else once per sub-block (for many rows,
 * so the accumulators fit in registers). */
KAVX512_K_MINS_MICRO(r4k_micro, r4k_subs, R4, 10, 4)

/* Q6_K: per sub-block j (16 elements, one int8 scale) and row, acc = the dot
 * of its unsigned values q6 + 32 with the activations, from -32 bsum_j;
 * sumi += sc_j * acc (|sumi| <= 2^27). */
T_512_INLINE void r6k_steps(int NA, bool pf, const char *P, const char *A, int32_t (*nb)[16],
                            __m512i *sumi) {
    const __m512i m3f = _mm512_set1_epi8(0x3F), m03 = _mm512_set1_epi8(0x03),
                  m0f = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 16; j++) {
        if (pf) pf_lines(P, R6.sb, R6.pf_dist, 4 * j, 4 * j + 4);
        /* q[g]: the values of elements 16j + 4g .. 16j + 4g + 3 */
        const char *v = P + R6.qs + 64 * 3 * j;
        /* each vector read twice: in registers, not folded into the
         * shift as a second load (kavx512_in_reg; bench_kernels, 4096 x
         * 4096, the two builds alternating call by call, 400 pairs: folded
         * the same at m = 1 from DRAM, x1.07 as long from L2, x1.01-1.04 at
         * m = 4..64) */
        const __m512i v0 = kavx512_in_reg(_mm512_loadu_si512(v)),
                      v1 = kavx512_in_reg(_mm512_loadu_si512(v + 64)),
                      v2 = kavx512_in_reg(_mm512_loadu_si512(v + 128));
        /* bits 6-7 of v0, v1, v2 to bits 0-1, 2-3, 4-5 of q[3]: the
         * dword shifts drag in bits of the next byte, which the
         * selects (0xE4: c ? a : b) and the last and drop */
        const __m512i lo = _mm512_ternarylogic_epi32(_mm512_srli_epi32(v0, 6),
                                                     _mm512_srli_epi32(v1, 4), m03, 0xE4);
        const __m512i q[4] = {
            _mm512_and_si512(v0, m3f), _mm512_and_si512(v1, m3f), _mm512_and_si512(v2, m3f),
            _mm512_and_si512(_mm512_ternarylogic_epi32(lo, _mm512_srli_epi32(v2, 2), m0f, 0xE4),
                             m3f)};
        kavx512_k_bias_group(NA, j, q, P + R6.sc, A, nb, sumi);
    }
}

/* Q6_K: one panel x NA activation rows, all nsb super-blocks (pf: prefetch
 * ahead); the float step of kref_vec_dot_q6_K. */
KAVX512_K_BIAS_MICRO(r6k_micro, r6k_steps, R6, true, 5)
#undef UNIT

/* Q4_K: fused for up to 4 rows (2 accumulators per row), else per sub-block */
#define R4_CALL(na) r4k_micro(na, na <= 4, pf, nsb, P, tile, yt, ldy, mask)
#define R6_CALL(na) r6k_micro(na, pf, nsb, P, tile, yt, ldy, mask)
KAVX512_R_PASS(r4k_pass, R4_CALL)
KAVX512_R_PASS(r6k_pass, R6_CALL)
#undef R4_CALL
#undef R6_CALL

KAVX512_R_KERNEL(r4k_kernel, r4k_pass)
KAVX512_R_KERNEL(r6k_kernel, r6k_pass)

const kern_repack_ops kavx512_repack_q4_K = {r4k_panel_bytes, r4k_pack, r4k_kernel};
const kern_repack_ops kavx512_repack_q6_K = {r6k_panel_bytes, r6k_pack, r6k_kernel};
