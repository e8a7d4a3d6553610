/* kernels: repacked IQ4_XS, Q3_K, Q5_K and Q2_K weights for AVX-512 VNNI
 * (kern_repack_ops), read by decode and prefill alike.
 *
 * As for Q4_K (repack_k_avx512.c): a panel holds 16 weight rows in the 16
 * dword lanes of a vector, so one vpdpbusd against 4 broadcast activation
 * bytes advances 16 outputs; the values stay packed about as tightly as in
 * the GGUF rows (the kernel widens them with a few logic ops), so decode reads
 * about as many bytes as the file holds; each super-block is a whole number of
 * cache lines, its scales first.
 *
 *   IQ4_XS, 2240 bytes (35 lines; the GGUF rows take 2176):
 *     0     scales - 32, int8 [8 groups][16 rows]
 *     128   d, fp16 [16]; 160..191 zero
 *     192   32 vectors, v = 4g + i: lane r = GGUF bytes qs[4v..4v+3] of row r
 *           unchanged: low nibbles index elements 32g + 4i.., high nibbles
 *           32g + 16 + 4i.. (both group g); widened by one vpshufb each to the
 *           level + 128
 *
 *   Q3_K, 1856 bytes (29 lines; the GGUF rows take 1760):
 *     0     scales - 32, int8 [16 groups][16 rows]
 *     256   d, fp16 [16]; 288..319 zero
 *     320   8 runs of 32 elements, 3 vectors each: in run k, u_c (c < 8) is
 *           the dword of the values q + 4 (0..7) of elements 32k + 4c ..
 *           32k + 4c + 3, one per byte; vector 3k holds u_0 in bits 0-2,
 *           u_1 in bits 3-5 and bits 0-1 of u_6 in bits 6-7 of each byte,
 *           3k + 1 likewise u_2, u_3 and u_7, 3k + 2 u_4, u_5 and bit 2 of
 *           u_6 and u_7 in bits 6 and 7
 *
 *   Q5_K, 2880 bytes (45 lines; the GGUF rows take 2816):
 *     0..319 as Q4_K's panel (scales, mins as pairs, d, dmin)
 *     320   8 runs j (sub-block j, elements 32j..32j+31), 5 vectors each:
 *           u_k (k < 8) is the dword of the values (0..31) of elements
 *           32j + 4k .. 32j + 4k + 3, one per byte; vector 5j + k (k < 5)
 *           holds u_k in bits 0-4 of each byte and in bits 5-7 pieces of
 *           u_5..u_7: bits 0-2 of u_5, u_6, u_7 in vectors 0, 2, 4; bits 3-4
 *           of u_5, u_6 in bits 5-6 of vectors 1, 3; bits 3 and 4 of u_7 in
 *           bit 7 of vectors 1 and 3. So five values come out with one and
 *           each, the other three with shifts and selects (19 ops for 8
 *           vectors of values, against 28 and 4 more loads with Q4_K's
 *           nibbles and a vector of fifth bits beside them), and each run is
 *           read front to back
 *   Q2_K, 1344 bytes (21 lines; as the GGUF rows):
 *     0     GGUF scale bytes (scale | min << 4) as pairs, u8 [8 pairs t][16 rows][2]
 *     256   d, fp16 [16]; 288 dmin, fp16 [16]
 *     320   16 vectors, v = 8h + w: lane r = GGUF bytes qs[4v..4v+3] of row r
 *           unchanged: bits 2j, 2j + 1 of byte i are the value of element
 *           128h + 32j + 4w + i (groups 8h + 2j for w < 4, 8h + 2j + 1 above)
 *
 * Values are unsigned for vpdpbusd; IQ4_XS (level + 128) and Q3_K (q + 4)
 * take the bias back through the activations' sums: each group's
 * accumulator starts at -bias * (sum of its activations), from a small table
 * of the tile's sums written a super-block ahead (as Q6_K's). Integer totals
 * per output are exact, and the float steps are those of vec_dot
 * (quant_kx_ref.c) lane by lane, super-blocks in order, so every output is
 * bit-identical to it. Activations come in the Q8_K tiles of the K-family
 * GEMM (gemm_avx512.h); the micro kernels are instantiated per count of
 * active activation rows. */
#include "gemm_avx512.h"

/* The four layouts above (kavx512_r_layout); Q5_K's scales, mins, d, dmin
 * at KR_SC .. (gemm_avx512.h) */
static const kavx512_r_layout XS = {.sc = 0, .d = 128, .qs = 192, .sb = 2240, .pf_dist = 3};
static const kavx512_r_layout Q3 = {.sc = 0, .d = 256, .qs = 320, .sb = 1856, .pf_dist = 4};
static const kavx512_r_layout Q5 = {
    .sc = KR_SC, .d = KR_D, .dmin = KR_DMIN, .qs = 320, .sb = 2880, .pf_dist = 3};
static const kavx512_r_layout Q2 = {
    .sc = 0, .d = 256, .dmin = 288, .qs = 320, .sb = 1344, .pf_dist = 5};

/* ------------------------------------------------------------- packing -- */

/* Row r of the blk_iq4_xs super-block o (KAVX512_R_PACK). */
KERN_K_INLINE void xs_put(char *o, int r, const blk_iq4_xs *x) {
    kavx512_put_lanes(o + XS.qs, r, x->qs, 32);
    for (int g = 0; g < 8; g++) {
        const int ls =
            ((x->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((x->scales_h >> (2 * g)) & 3) << 4);
        o[XS.sc + 16 * g + r] = (char)(ls - 32);
    }
    memcpy(o + XS.d + 2 * r, &x->d, 2);
}
KAVX512_R_PACK(xs, blk_iq4_xs, XS, xs_put)

/* Row r of the blk_q3_K super-block o (KAVX512_R_PACK). */
KERN_K_INLINE void q3_put(char *o, int r, const blk_q3_K *x) {
    uint8_t u[QK_K]; /* q + 4 in element order (quant_kx_ref.c) */
    for (int e = 0; e < QK_K; e++) {
        const int h = e / 128, j = (e % 128) / 32, l = e % 32;
        const int low = (x->qs[32 * h + l] >> (2 * j)) & 3;
        const int hb = (x->hmask[l] >> (4 * h + j)) & 1;
        u[e] = (uint8_t)(low | (hb << 2));
    }
    for (int run = 0; run < 8; run++)
        for (int i = 0; i < 4; i++) {
            const uint8_t *c = u + 32 * run + i; /* c[4 * n]: u_n, byte i */
            const uint8_t b0 = (uint8_t)(c[0] | c[4] << 3 | (c[24] & 3) << 6);
            const uint8_t b1 = (uint8_t)(c[8] | c[12] << 3 | (c[28] & 3) << 6);
            const uint8_t b2 =
                (uint8_t)(c[16] | c[20] << 3 | (c[24] >> 2) << 6 | (c[28] >> 2) << 7);
            o[Q3.qs + 64 * (3 * run) + 4 * r + i] = (char)b0;
            o[Q3.qs + 64 * (3 * run + 1) + 4 * r + i] = (char)b1;
            o[Q3.qs + 64 * (3 * run + 2) + 4 * r + i] = (char)b2;
        }
    for (int g = 0; g < 16; g++) o[Q3.sc + 16 * g + r] = (char)(kern_q3k_scale(g, x->scales) - 32);
    memcpy(o + Q3.d + 2 * r, &x->d, 2);
}
KAVX512_R_PACK(q3, blk_q3_K, Q3, q3_put)

/* Row r of the blk_q5_K super-block o (KAVX512_R_PACK). */
KERN_K_INLINE void q5_put(char *o, int r, const blk_q5_K *x) {
    for (int j = 0; j < 8; j++) {
        /* sub-block j: nibble j % 2 of qs[32 (j / 2) + l], fifth
         * bit j of qh[l] (quant_kx_ref.c) */
        uint8_t u[32];
        for (int l = 0; l < 32; l++)
            u[l] = (uint8_t)(((x->qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) |
                             (((x->qh[l] >> j) & 1) << 4));
        for (int i = 0; i < 4; i++) {
            const uint8_t *c = u + i; /* c[4 * n]: u_n, byte i */
            const uint8_t b[5] = {(uint8_t)(c[0] | (c[20] & 7) << 5),
                                  (uint8_t)(c[4] | (c[20] >> 3) << 5 | (c[28] >> 3 & 1) << 7),
                                  (uint8_t)(c[8] | (c[24] & 7) << 5),
                                  (uint8_t)(c[12] | (c[24] >> 3) << 5 | (c[28] >> 4) << 7),
                                  (uint8_t)(c[16] | (c[28] & 7) << 5)};
            for (int v = 0; v < 5; v++) o[Q5.qs + 64 * (5 * j + v) + 4 * r + i] = (char)b[v];
        }
    }
    kavx512_put_mins_head(o, r, x->scales, x->d, x->dmin);
}
KAVX512_R_PACK(q5, blk_q5_K, Q5, q5_put)

/* Row r of the blk_q2_K super-block o (KAVX512_R_PACK). */
KERN_K_INLINE void q2_put(char *o, int r, const blk_q2_K *x) {
    kavx512_put_lanes(o + Q2.qs, r, x->qs, 16);
    for (int g = 0; g < 16; g++) o[Q2.sc + 32 * (g / 2) + 2 * r + g % 2] = (char)x->scales[g];
    memcpy(o + Q2.d + 2 * r, &x->d, 2);
    memcpy(o + Q2.dmin + 2 * r, &x->dmin, 2);
}
KAVX512_R_PACK(q2, blk_q2_K, Q2, q2_put)

/* ------------------------------------------------------------- kernels -- */

/* Unit a of the current super-block of the tile. */
#define UNIT(a) (A + (size_t)(a)*KT_UNIT)

/* IQ4_XS: one panel x NA activation rows, all nsb super-blocks. Per group g
 * and row, acc = -128 S_g + the dot of its 32 values + 128 with the
 * activations = the exact dot of the levels; sumi = sum_g (ls_g - 32) acc
 * (|sumi| < 2^28). For few rows two dpbusd chains per row (low and high
 * nibbles), added before the scale. */
T_512_INLINE void xs_micro(int NA, bool pf, int64_t nsb, const char *P, const char *A, float *y,
                           size_t ldy, __mmask16 mask) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lv = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)kern_iq4nl_values), _mm_set1_epi8((char)0x80)));
    const bool two = NA <= 4;
    __m512 f[KT];
    UNROLL(8)
    for (int a = 0; a < NA; a++) f[a] = _mm512_setzero_ps();
    _Alignas(64) int32_t nbuf[2][KT][16];
    kavx512_k_neg_sums(NA, false, 7, A, nbuf[0]);
    for (int64_t sb = 0; sb < nsb; sb++, P += XS.sb, A += KT * KT_UNIT) {
        if (sb + 1 < nsb) kavx512_k_neg_sums(NA, false, 7, A + KT * KT_UNIT, nbuf[(sb + 1) & 1]);
        __asm__ volatile("" ::: "memory"); /* read back as broadcasts */
        int32_t(*nb)[16] = nbuf[sb & 1];
        __m512i sumi[KT];
        UNROLL(8)
        for (int a = 0; a < NA; a++) sumi[a] = _mm512_setzero_si512();
        for (int g = 0; g < 8; g++) {
            if (pf) pf_lines(P, XS.sb, XS.pf_dist, 5 * g, 5 * g + 5);
            __m512i acc[KT], acc2[KT];
            UNROLL(8)
            for (int a = 0; a < NA; a++) {
                acc[a] = _mm512_set1_epi32(nb[a][g]);
                acc2[a] = _mm512_setzero_si512();
            }
            UNROLL(4)
            for (int i = 0; i < 4; i++) {
                const __m512i v = _mm512_loadu_si512(P + XS.qs + 64 * (4 * g + i));
                const __m512i lo = _mm512_shuffle_epi8(lv, _mm512_and_si512(v, m4));
                const __m512i hi =
                    _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                UNROLL(8)
                for (int a = 0; a < NA; a++) {
                    const char *q = UNIT(a) + KQ_QS + 32 * g + 4 * i;
                    acc[a] = _mm512_dpbusd_epi32(acc[a], lo, bc32(q));
                    if (two) acc2[a] = _mm512_dpbusd_epi32(acc2[a], hi, bc32(q + 16));
                    else acc[a] = _mm512_dpbusd_epi32(acc[a], hi, bc32(q + 16));
                }
            }
            const __m512i sc = _mm512_cvtepi8_epi32(ld128(P + XS.sc + 16 * g));
            UNROLL(8)
            for (int a = 0; a < NA; a++) {
                const __m512i t = two ? _mm512_add_epi32(acc[a], acc2[a]) : acc[a];
                sumi[a] = _mm512_add_epi32(sumi[a], _mm512_mullo_epi32(t, sc));
            }
        }
        /* the float step of kref_vec_dot_iq4_xs */
        kavx512_k_fstep(NA, P + XS.d, A, sumi, f);
    }
    kavx512_k_store(NA, f, y, ldy, mask);
}

/* Q3_K: per group g of 16 and row, acc = -4 bsum_g + the dot of its values
 * q + 4 = the exact dot of q; sumi += (sc_g - 32) acc (|sumi| < 2^23). */
T_512_INLINE void q3_steps(int NA, bool pf, const char *P, const char *A, int32_t (*nb)[16],
                           __m512i *sumi) {
    const __m512i m7 = _mm512_set1_epi8(0x07), m3 = _mm512_set1_epi8(0x03);
    for (int run = 0; run < 8; run++) {
        if (pf) pf_lines(P, Q3.sb, Q3.pf_dist, 4 * run, 4 * run + 4);
        const char *v = P + Q3.qs + 64 * 3 * run;
        /* each vector read three or four times: in registers, not folded
         * into the shifts as more loads (kavx512_in_reg; bench_kernels, 4096 x
         * 4096, the two builds alternating call by call, 400 pairs: folded
         * x1.02-1.04 as long at m = 1 from DRAM, x1.16-1.18 at m = 4,
         * x1.04-1.06 at m = 16..64; Q4_K, Q5_K, IQ4_XS and Q2_K gained
         * nothing or lost, so keep the compiler's choice) */
        const __m512i v0 = kavx512_in_reg(_mm512_loadu_si512(v)),
                      v1 = kavx512_in_reg(_mm512_loadu_si512(v + 64)),
                      v2 = kavx512_in_reg(_mm512_loadu_si512(v + 128));
        /* the dword shifts drag in bits of the next byte, which the
         * selects (0xE4: c ? a : b) and the ands drop */
        const __m512i u[8] = {
            _mm512_and_si512(v0, m7),
            _mm512_and_si512(_mm512_srli_epi32(v0, 3), m7),
            _mm512_and_si512(v1, m7),
            _mm512_and_si512(_mm512_srli_epi32(v1, 3), m7),
            _mm512_and_si512(v2, m7),
            _mm512_and_si512(_mm512_srli_epi32(v2, 3), m7),
            _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(v0, 6),
                                                       _mm512_srli_epi32(v2, 4), m3, 0xE4),
                             m7),
            _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(v1, 6),
                                                       _mm512_srli_epi32(v2, 5), m3, 0xE4),
                             m7)};
        UNROLL(2)
        for (int h = 0; h < 2; h++)
            kavx512_k_bias_group(NA, 2 * run + h, u + 4 * h, P + Q3.sc, A, nb, sumi);
    }
}

/* Q3_K: one panel x NA activation rows; the float step of kref_vec_dot_q3_K. */
KAVX512_K_BIAS_MICRO(q3_micro, q3_steps, Q3, true, 2)

/* Q5_K sub-blocks 2c + h, h0 <= h < h1 (runs 2c and 2c + 1 of the panel),
 * into s[a]: per sub-block and row the dot of its 32 values (0..31) with the
 * activations, times its scale. */
T_512_INLINE void q5_subs(int NA, int h0, int h1, int c, const char *P, const char *A, __m512i *s) {
    const __m512i m5 = _mm512_set1_epi8(0x1F), m3 = _mm512_set1_epi8(0x07),
                  m1 = _mm512_set1_epi8(0x08);
    __m512i u[2][8];
    UNROLL(2)
    for (int h = h0; h < h1; h++) {
        const char *v = P + Q5.qs + 64 * 5 * (2 * c + h);
        const __m512i v0 = _mm512_loadu_si512(v), v1 = _mm512_loadu_si512(v + 64),
                      v2 = _mm512_loadu_si512(v + 128), v3 = _mm512_loadu_si512(v + 192),
                      v4 = _mm512_loadu_si512(v + 256);
        /* the dword shifts drag in bits of the next byte, which the selects
         * (0xE4: c ? a : b) and the ands drop */
        const __m512i b34 =
            _mm512_ternarylogic_epi32(_mm512_srli_epi32(v1, 4), _mm512_srli_epi32(v3, 3), m1, 0xE4);
        u[h][0] = _mm512_and_si512(v0, m5);
        u[h][1] = _mm512_and_si512(v1, m5);
        u[h][2] = _mm512_and_si512(v2, m5);
        u[h][3] = _mm512_and_si512(v3, m5);
        u[h][4] = _mm512_and_si512(v4, m5);
        u[h][5] = _mm512_and_si512(
            _mm512_ternarylogic_epi32(_mm512_srli_epi32(v0, 5), _mm512_srli_epi32(v1, 2), m3, 0xE4),
            m5);
        u[h][6] = _mm512_and_si512(
            _mm512_ternarylogic_epi32(_mm512_srli_epi32(v2, 5), _mm512_srli_epi32(v3, 2), m3, 0xE4),
            m5);
        u[h][7] = _mm512_and_si512(
            _mm512_ternarylogic_epi32(_mm512_srli_epi32(v4, 5), b34, m3, 0xE4), m5);
    }
    UNROLL(8)
    for (int a = 0; a < NA; a++) UNROLL(2)
    for (int h = h0; h < h1; h++) {
        const char *q = UNIT(a) + KQ_QS + 64 * c + 32 * h;
        __m512i acc = _mm512_setzero_si512();
        UNROLL(8)
        for (int k = 0; k < 8; k++) acc = _mm512_dpbusd_epi32(acc, u[h][k], bc32(q + 4 * k));
        const __m512i sc = _mm512_cvtepu8_epi32(ld128(P + Q5.sc + 16 * (2 * c + h)));
        s[a] = _mm512_add_epi32(s[a], _mm512_mullo_epi32(acc, sc));
    }
}

/* Q5_K: one panel x NA activation rows; as Q4_K's (repack_k_avx512.c) with
 * 5-bit values: sumi = sum_j sc_j * dot_j (|sumi| <= 256 * 31 * 128 * 63 <
 * 2^27), summ = sum_j min_j * S_j, then the float steps of
 * kref_vec_dot_q5_K. fused: both sub-blocks of a vector per pass. */
KAVX512_K_MINS_MICRO(q5_micro, q5_subs, Q5, 12, 0)

/* Q2_K: one panel x NA activation rows. Values are taken in place, masked
 * (v & 3 << 2j: the value times 4^j), so per group and row acc = 4^j * dot,
 * exact, |dot| <= 16 * 3 * 128 < 2^15; the two groups of a pair go into the
 * int16 halves of a dword (the low one shifted back, the high one into place)
 * and one vpdpwssd adds sc_2t dot_2t + sc_2t+1 dot_2t+1 to sumi; likewise
 * summ = sum_g m_g bsum_g against the bsums' pairs. Then the float steps of
 * kref_vec_dot_q2_K. */
T_512_INLINE void q2_micro(int NA, bool pf, int64_t nsb, const char *P, const char *A, float *y,
                           size_t ldy, __mmask16 mask) {
    const __m512i m16 = _mm512_set1_epi16(0x0F);
    __m512 f[KT];
    UNROLL(8)
    for (int a = 0; a < NA; a++) f[a] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, P += Q2.sb, A += KT * KT_UNIT) {
        __m512i sumi[KT], summ[KT];
        UNROLL(8)
        for (int a = 0; a < NA; a++) sumi[a] = summ[a] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            if (pf) pf_lines(P, Q2.sb, Q2.pf_dist, 11 * h, 11 * h + 11);
            __m512i v[8];
            UNROLL(8)
            for (int w = 0; w < 8; w++) v[w] = _mm512_loadu_si512(P + Q2.qs + 64 * (8 * h + w));
            UNROLL(4)
            for (int j = 0; j < 4; j++) {
                const int t = 4 * h + j; /* the pair of groups 2t, 2t + 1 */
                const __m512i sp = _mm512_cvtepu8_epi16(ld256(P + Q2.sc + 32 * t));
                const __m512i sc = _mm512_and_si512(sp, m16), mn = _mm512_srli_epi16(sp, 4);
                const __m512i msk = _mm512_set1_epi8((char)(3 << (2 * j)));
                __m512i u[8];
                UNROLL(8)
                for (int w = 0; w < 8; w++) u[w] = _mm512_and_si512(v[w], msk);
                UNROLL(8)
                for (int a = 0; a < NA; a++) {
                    const char *q = UNIT(a) + KQ_QS + 128 * h + 32 * j;
                    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
                    UNROLL(4)
                    for (int w = 0; w < 4; w++) {
                        a0 = _mm512_dpbusd_epi32(a0, u[w], bc32(q + 4 * w));
                        a1 = _mm512_dpbusd_epi32(a1, u[w + 4], bc32(q + 16 + 4 * w));
                    }
                    const __m512i pair =
                        _mm512_mask_blend_epi16(0xAAAAAAAA, _mm512_srai_epi32(a0, 2 * j),
                                                _mm512_slli_epi32(a1, 16 - 2 * j));
                    sumi[a] = _mm512_dpwssd_epi32(sumi[a], pair, sc);
                    summ[a] = _mm512_dpwssd_epi32(summ[a], mn, bc32(UNIT(a) + KQ_BSUMS + 4 * t));
                }
            }
        }
        /* the float steps of kref_vec_dot_q2_K */
        kavx512_k_fstep_min(NA, P + Q2.d, P + Q2.dmin, A, sumi, 0, summ, f);
    }
    kavx512_k_store(NA, f, y, ldy, mask);
}
#undef UNIT

#define XS_CALL(na) xs_micro(na, pf, nsb, P, tile, yt, ldy, mask)
#define Q3_CALL(na) q3_micro(na, pf, nsb, P, tile, yt, ldy, mask)
#define Q5_CALL(na) q5_micro(na, na <= 4, pf, nsb, P, tile, yt, ldy, mask)
#define Q2_CALL(na) q2_micro(na, pf, nsb, P, tile, yt, ldy, mask)
KAVX512_R_PASS(xs_pass, XS_CALL)
KAVX512_R_PASS(q3_pass, Q3_CALL)
KAVX512_R_PASS(q5_pass, Q5_CALL)
KAVX512_R_PASS(q2_pass, Q2_CALL)
#undef XS_CALL
#undef Q3_CALL
#undef Q5_CALL
#undef Q2_CALL

KAVX512_R_KERNEL(xs_kernel, xs_pass)
KAVX512_R_KERNEL(q3_kernel, q3_pass)
KAVX512_R_KERNEL(q5_kernel, q5_pass)
KAVX512_R_KERNEL(q2_kernel, q2_pass)

const kern_repack_ops kavx512_repack_iq4_xs = {xs_panel_bytes, xs_pack, xs_kernel};
const kern_repack_ops kavx512_repack_q3_K = {q3_panel_bytes, q3_pack, q3_kernel};
const kern_repack_ops kavx512_repack_q5_K = {q5_panel_bytes, q5_pack, q5_kernel};
const kern_repack_ops kavx512_repack_q2_K = {q2_panel_bytes, q2_pack, q2_kernel};
