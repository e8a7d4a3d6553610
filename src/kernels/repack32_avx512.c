/* kernels: repacked Q5_0, IQ4_NL, Q4_1 and Q5_1 weights for AVX-512 VNNI
 * (kern_repack_ops), read by decode and prefill alike.
 *
 * A panel holds 16 weight rows in the 16 dword lanes of a vector, as the
 * Q4_0 panels of repack_avx512.c do, and is as compact as the GGUF rows. Per
 * block: 4 vectors, lane r = bytes qs[4g..4g+3] of row r (low nibbles:
 * elements 4g..4g+3, high: 16+4g..); Q5_0 then one vector of fifth bits, lane
 * r byte i = those of elements 4g+i in bit g and 16+4g+i in bit 4+g (g < 4),
 * so one shift puts group g's bit at bit 4 of every byte; then the 16 rows'
 * fp16 scales. The kernel widens each group to unsigned bytes (IQ4_NL: a
 * table lookup of the levels + 128; Q5_0: nibble | fifth bit << 4, the value
 * + 16) and runs the Q8_0 activation tiles of gemm32_avx512.c (c = -128 *
 * sum; Q5_0 starts from c / 8 = -16 * sum), so a block's exact integer sum
 * and float steps are those of vec_dot: every output is bit-identical to it. Q4_1 and
 * Q5_1 keep their values unsigned, add the rows' fp16 mins, and run on the
 * Q8_1 tiles with the canonical v = fma(dx * dy, isum, mx * sy), f = f + v.
 * Bytes per row and block as in the file: Q5_0 22, IQ4_NL 18, Q4_1 20, Q5_1 24. */
#include "gemm_avx512.h"

#define RP_NIB 256 /* 4 x 64 bytes of nibbles */
#define RP_HB  64  /* Q5_0's fifth bits */
#define RP_SC  32  /* 16 fp16 scales */

/* The four layouts: Q4_1 and Q5_1 add the rows' fp16 mins after the scales
 * and run on Q8_1 tiles (gemm32_avx512.c), values unsigned as stored. */
enum rp_kind { RP_IQ4_NL, RP_Q5_0, RP_Q4_1, RP_Q5_1 };
#define HAS_HB(kind)  ((kind) == RP_Q5_0 || (kind) == RP_Q5_1)
#define HAS_MIN(kind) ((kind) == RP_Q4_1 || (kind) == RP_Q5_1)

static size_t blk_bytes(enum rp_kind kind) {
    return RP_NIB + (HAS_HB(kind) ? RP_HB : 0) + RP_SC + (HAS_MIN(kind) ? RP_SC : 0);
}
static size_t q5_panel_bytes(int64_t k) { return (size_t)(k / QK8_0) * blk_bytes(RP_Q5_0); }
static size_t nl_panel_bytes(int64_t k) { return (size_t)(k / QK8_0) * blk_bytes(RP_IQ4_NL); }
static size_t q41_panel_bytes(int64_t k) { return (size_t)(k / QK8_0) * blk_bytes(RP_Q4_1); }
static size_t q51_panel_bytes(int64_t k) { return (size_t)(k / QK8_0) * blk_bytes(RP_Q5_1); }

/* Every type starts a block with the fp16 d; Q4_1 / Q5_1 then the fp16 m;
 * then Q5_0 / Q5_1 the 4 bytes of qh; then the 16 bytes of nibbles. */
T_512_INLINE void pack(enum rp_kind kind, const void *w, size_t wrow, int rows, int64_t k,
                       void *panel) {
    static const size_t bbs[] = {sizeof(blk_iq4_nl), sizeof(blk_q5_0), sizeof(blk_q4_1),
                                 sizeof(blk_q5_1)};
    const size_t bb = bbs[kind], qh_at = HAS_MIN(kind) ? 4 : 2,
                 qs_at = qh_at + (HAS_HB(kind) ? 4 : 0);
    char *out = panel;
    for (int64_t b = 0; b < k / QK8_0; b++, out += blk_bytes(kind)) {
        _Alignas(64) int32_t v[4][16], h[16];
        _Alignas(32) uint16_t sc[16], mn[16];
        memset(v, 0, sizeof v), memset(h, 0, sizeof h), memset(sc, 0, sizeof sc),
            memset(mn, 0, sizeof mn);
        for (int r = 0; r < rows; r++) {
            const char *blk = (const char *)w + (size_t)r * wrow + (size_t)b * bb;
            for (int g = 0; g < 4; g++) memcpy(&v[g][r], blk + qs_at + 4 * g, 4);
            memcpy(&sc[r], blk, 2);
            if (HAS_MIN(kind)) memcpy(&mn[r], blk + 2, 2);
            if (HAS_HB(kind)) {
                uint32_t qh, hv = 0;
                memcpy(&qh, blk + qh_at, 4);
                for (int g = 0; g < 4; g++)
                    for (int i = 0; i < 4; i++)
                        hv |= (((qh >> (4 * g + i)) & 1) << g | ((qh >> (16 + 4 * g + i)) & 1)
                                                                    << (4 + g))
                              << (8 * i);
                h[r] = (int32_t)hv;
            }
        }
        char *o = out;
        memcpy(o, v, RP_NIB), o += RP_NIB;
        if (HAS_HB(kind)) memcpy(o, h, RP_HB), o += RP_HB;
        memcpy(o, sc, RP_SC), o += RP_SC;
        if (HAS_MIN(kind)) memcpy(o, mn, RP_SC);
    }
}

T_512 static void q5_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack(RP_Q5_0, w, wrow, rows, k, panel);
}
T_512 static void nl_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack(RP_IQ4_NL, w, wrow, rows, k, panel);
}
T_512 static void q41_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack(RP_Q4_1, w, wrow, rows, k, panel);
}
T_512 static void q51_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    pack(RP_Q5_1, w, wrow, rows, k, panel);
}

/* 16 weight rows x NA activation rows of one tile, all blocks. */
T_512_INLINE void micro(enum rp_kind kind, int NA, int64_t nb, const char *p, const char *t,
                        float *y, size_t ldy, __mmask16 m0) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* IQ4_NL: the levels + 128 in every 128-bit lane (vpshufb looks up per lane) */
    const __m512i lv = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)kern_iq4nl_values), _mm_set1_epi8((char)0x80)));
    const __m512i m5 = _mm512_set1_epi8(0x1F);
    const size_t bb = blk_bytes(kind);
    const bool q5 = HAS_HB(kind), q1 = HAS_MIN(kind);
    __m512 f[QT];
    UNROLL(6)
    for (int a = 0; a < NA; a++) f[a] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += bb, t += QT_BLK) {
        const int32_t *c = (const int32_t *)(t + QT * (QK8_0 + 4));
        __m512i i[QT];
        UNROLL(6)
        for (int a = 0; a < NA; a++)
            i[a] = q1   ? _mm512_setzero_si512()
                   : q5 ? _mm512_set1_epi32(c[a] >> 3) /* -16 * sum, exact */
                        : _mm512_set1_epi32(c[a]);
        const __m512i hb = q5 ? _mm512_loadu_si512(p + RP_NIB) : _mm512_setzero_si512();
        UNROLL(4)
        for (int g = 0; g < 4; g++) {
            const __m512i v = _mm512_loadu_si512(p + 64 * g);
            __m512i lo = _mm512_and_si512(v, m4),
                    hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
            if (q5) {
                /* the fifth bits (bit g, bit 4 + g of each byte) to bit 4; the
                 * select (0xE4: c ? a : b) keeps the nibble in bits 0-3 */
                const __m512i bl = _mm512_slli_epi32(hb, 4 - g);
                const __m512i bh = g ? _mm512_srli_epi32(hb, g) : hb;
                lo = _mm512_and_si512(_mm512_ternarylogic_epi32(v, bl, m4, 0xE4), m5);
                hi = _mm512_and_si512(
                    _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 4), bh, m4, 0xE4), m5);
            } else if (kind == RP_IQ4_NL) {
                lo = _mm512_shuffle_epi8(lv, lo);
                hi = _mm512_shuffle_epi8(lv, hi);
            }
            KAVX512_Q_NIB_DOTS(NA, i, lo, hi, t, g);
        }
        /* Q8_0 tiles: d[QT] then c[QT]; Q8_1 tiles: d[QT] then s[QT], as floats */
        const float *dy = (const float *)(t + QT * QK8_0),
                    *sy = (const float *)(t + QT * (QK8_0 + 4));
        const char *ps = p + RP_NIB + (q5 ? RP_HB : 0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ps));
        if (q1) {
            const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ps + RP_SC)));
            UNROLL(6)
            for (int a = 0; a < NA; a++)
                f[a] =
                    _mm512_add_ps(f[a], _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dy[a])),
                                                        _mm512_cvtepi32_ps(i[a]),
                                                        _mm512_mul_ps(mn, _mm512_set1_ps(sy[a]))));
        } else {
            KAVX512_Q_FSTEP(NA, f, d, dy, i);
        }
    }
    UNROLL(6)
    for (int a = 0; a < NA; a++) _mm512_mask_storeu_ps(y + a * ldy, m0, f[a]);
}

#define RP_MICRO(NA, nb, p, t, y, ldy, m0) micro(kind, NA, nb, p, t, y, ldy, m0)
T_512_INLINE void kernel(enum rp_kind kind, int64_t k, const void *panels, size_t pb, int n_rows,
                         const void *tiles, int64_t m, float *y, size_t ldy) {
    KAVX512_Q_PANEL_LOOP(RP_MICRO, k, panels, pb, n_rows, tiles, m, y, ldy);
}

KAVX512_KERNEL_ENTRY(q5_kernel, kernel, RP_Q5_0)
KAVX512_KERNEL_ENTRY(nl_kernel, kernel, RP_IQ4_NL)
KAVX512_KERNEL_ENTRY(q41_kernel, kernel, RP_Q4_1)
KAVX512_KERNEL_ENTRY(q51_kernel, kernel, RP_Q5_1)

const kern_repack_ops kavx512_repack_q5_0 = {q5_panel_bytes, q5_pack, q5_kernel};
const kern_repack_ops kavx512_repack_iq4_nl = {nl_panel_bytes, nl_pack, nl_kernel};
const kern_repack_ops kavx512_repack_q4_1 = {q41_panel_bytes, q41_pack, q41_kernel};
const kern_repack_ops kavx512_repack_q5_1 = {q51_panel_bytes, q51_pack, q51_kernel};
