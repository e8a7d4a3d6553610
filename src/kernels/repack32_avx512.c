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

#define RP_NIB      256  /* 4 x 64 bytes of nibbles */
#define RP_HB       64   /* Q5_0's fifth bits */
#define RP_SC       32   /* 16 fp16 scales */
#define RP_PF_AHEAD 2048 /* bytes decode prefetches ahead (micro_pair) */

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

/* Group g of a block: the 16 rows' values of elements 4g..4g+3 (lo) and
 * 16+4g.. (hi) as unsigned bytes, from the nibble vector v and (Q5_0, Q5_1)
 * the block's fifth-bit vector hb. */
T_512_INLINE void widen(enum rp_kind kind, int g, __m512i v, __m512i hb, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m5 = _mm512_set1_epi8(0x1F);
    if (HAS_HB(kind)) {
        /* the fifth bits (bit g, bit 4 + g of each byte) to bit 4; the
         * select (0xE4: c ? a : b) keeps the nibble in bits 0-3 */
        const __m512i bl = _mm512_slli_epi32(hb, 4 - g);
        const __m512i bh = g ? _mm512_srli_epi32(hb, g) : hb;
        *lo = _mm512_and_si512(_mm512_ternarylogic_epi32(v, bl, m4, 0xE4), m5);
        *hi =
            _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 4), bh, m4, 0xE4), m5);
    } else {
        *lo = _mm512_and_si512(v, m4);
        *hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
        if (kind == RP_IQ4_NL) {
            /* the levels + 128 in every 128-bit lane (vpshufb looks up per lane) */
            const __m512i lv = _mm512_broadcast_i32x4(_mm_xor_si128(
                _mm_loadu_si128((const __m128i *)kern_iq4nl_values), _mm_set1_epi8((char)0x80)));
            *lo = _mm512_shuffle_epi8(lv, *lo);
            *hi = _mm512_shuffle_epi8(lv, *hi);
        }
    }
}

/* The float step of one block for NA rows: f[a] += the block's sum i[a] with
 * the panel's scales (and mins) at ps. */
T_512_INLINE void fstep(enum rp_kind kind, int NA, const char *ps, const char *t, const __m512i *i,
                        __m512 *f) {
    /* Q8_0 tiles: d[QT] then c[QT]; Q8_1 tiles: d[QT] then s[QT], as floats */
    const float *dy = (const float *)(t + QT * QK8_0), *sy = (const float *)(t + QT * (QK8_0 + 4));
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ps));
    if (HAS_MIN(kind)) {
        const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ps + RP_SC)));
        UNROLL(6)
        for (int a = 0; a < NA; a++)
            f[a] = _mm512_add_ps(f[a], _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dy[a])),
                                                       _mm512_cvtepi32_ps(i[a]),
                                                       _mm512_mul_ps(mn, _mm512_set1_ps(sy[a]))));
    } else {
        KAVX512_Q_FSTEP(NA, f, d, dy, i);
    }
}

/* A block's integer sum starts from the tile's c (Q5_0 from c / 8 = -16 *
 * sum, exact), or 0 for the types with a min. */
T_512_INLINE __m512i isum0(enum rp_kind kind, int32_t c) {
    return HAS_MIN(kind)  ? _mm512_setzero_si512()
           : HAS_HB(kind) ? _mm512_set1_epi32(c >> 3)
                          : _mm512_set1_epi32(c);
}

/* 16 weight rows x NA activation rows of one tile, all blocks. pf: the pass
 * that meets the panel first fetches the stream KAVX512_BATCH_AHEAD bytes ahead
 * into L2 (running on into the next panel), as the K family's does; per
 * matrix (bench_kernels, 4096 x 4096 from DRAM, with and without alternating
 * call by call in one process, median of 400 pairs), without it m = 4 took
 * x1.19 as long (Q5_0), x1.37 (IQ4_NL); m = 16 x1.05, x1.18. */
T_512_INLINE void micro(enum rp_kind kind, int NA, int64_t nb, const char *p, const char *t,
                        float *y, size_t ldy, __mmask16 m0, bool pf) {
    const size_t bb = blk_bytes(kind);
    __m512 f[QT];
    UNROLL(6)
    for (int a = 0; a < NA; a++) f[a] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += bb, t += QT_BLK) {
        if (pf)
            for (size_t l = 0; l < bb; l += 64)
                _mm_prefetch(p + KAVX512_BATCH_AHEAD + l, _MM_HINT_T1);
        const int32_t *c = (const int32_t *)(t + QT * (QK8_0 + 4));
        __m512i i[QT];
        UNROLL(6)
        for (int a = 0; a < NA; a++) i[a] = isum0(kind, c[a]);
        const __m512i hb = HAS_HB(kind) ? _mm512_loadu_si512(p + RP_NIB) : _mm512_setzero_si512();
        UNROLL(4)
        for (int g = 0; g < 4; g++) {
            __m512i lo, hi;
            widen(kind, g, _mm512_loadu_si512(p + 64 * g), hb, &lo, &hi);
            KAVX512_Q_NIB_DOTS(NA, i, lo, hi, t, g);
        }
        fstep(kind, NA, p + RP_NIB + (HAS_HB(kind) ? RP_HB : 0), t, i, f);
    }
    UNROLL(6)
    for (int a = 0; a < NA; a++) _mm512_mask_storeu_ps(y + a * ldy, m0, f[a]);
}

/* Decode (one activation row): panels p0 and p1 at once, each block's sum
 * split over two accumulators (the groups alternate; integers, so the sum is
 * the same), and each stream prefetched RP_PF_AHEAD bytes ahead
 * (kavx512_decode_prefetch, the CPU's hint; the figures here are of T1, into L2).
 * Left to one panel at a time the core fetched the weights only as the
 * arithmetic reached them (perf: the samples on each block's first loads).
 * Per matrix (bench_kernels, 4096 x 4096 from DRAM; this against one panel
 * at a time, alternating call by call in one process, median of 400 pairs),
 * the old path took longer by x1.08-1.10 (Q5_0), x1.15-1.20 (IQ4_NL),
 * x1.10-1.19 (Q4_1), x1.11-1.23 (Q5_1) on 2 threads, x1.14-1.19 on one.
 * One stream with the same prefetch took x1.08-1.44 longer than two;
 * 1, 4 or 7 KiB ahead did less than 2 KiB. The nibble and fifth-bit vectors
 * are loaded once into registers (kavx512_in_reg): left to itself gcc folded
 * them into the shifts as memory operands, loading Q5_0's fifth bits 7 times
 * and each nibble vector twice a block. Against that (two builds of this
 * file alternating call by call, 400 pairs) the folded loads took Q5_0
 * x1.02-1.07 as long from DRAM on 1 and 2 threads, x1.08-1.10 from L2
 * (Q5_1 x1.05, IQ4_NL x1.03 from L2, the same from DRAM; Q4_1 the same);
 * the batched micro gained nothing from it (m = 4, 16). */
T_512_INLINE void micro_pair(enum rp_kind kind, int64_t nb, const char *p0, const char *p1,
                             const char *t, float *y0, float *y1, __mmask16 m0, __mmask16 m1) {
    const size_t bb = blk_bytes(kind);
    const bool nta = kavx512_decode_nta;
    __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p0 += bb, p1 += bb, t += QT_BLK) {
        for (size_t l = 0; l < bb; l += 64) {
            kavx512_decode_prefetch(p0 + RP_PF_AHEAD + l, nta);
            kavx512_decode_prefetch(p1 + RP_PF_AHEAD + l, nta);
        }
        const int32_t *c = (const int32_t *)(t + QT * (QK8_0 + 4));
        __m512i i0[2] = {isum0(kind, c[0]), _mm512_setzero_si512()};
        __m512i i1[2] = {i0[0], _mm512_setzero_si512()};
        const __m512i hb0 =
            kavx512_in_reg(HAS_HB(kind) ? _mm512_loadu_si512(p0 + RP_NIB) : _mm512_setzero_si512());
        const __m512i hb1 =
            kavx512_in_reg(HAS_HB(kind) ? _mm512_loadu_si512(p1 + RP_NIB) : _mm512_setzero_si512());
        UNROLL(4)
        for (int g = 0; g < 4; g++) {
            const __m512i xl = _mm512_set1_epi32(*(const int32_t *)(t + 4 * g));
            const __m512i xh = _mm512_set1_epi32(*(const int32_t *)(t + 16 + 4 * g));
            __m512i lo, hi;
            widen(kind, g, kavx512_in_reg(_mm512_loadu_si512(p0 + 64 * g)), hb0, &lo, &hi);
            i0[g & 1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i0[g & 1], lo, xl), hi, xh);
            widen(kind, g, kavx512_in_reg(_mm512_loadu_si512(p1 + 64 * g)), hb1, &lo, &hi);
            i1[g & 1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i1[g & 1], lo, xl), hi, xh);
        }
        i0[0] = _mm512_add_epi32(i0[0], i0[1]);
        i1[0] = _mm512_add_epi32(i1[0], i1[1]);
        const size_t sc = RP_NIB + (HAS_HB(kind) ? RP_HB : 0);
        fstep(kind, 1, p0 + sc, t, i0, &f0);
        fstep(kind, 1, p1 + sc, t, i1, &f1);
    }
    _mm512_mask_storeu_ps(y0, m0, f0);
    _mm512_mask_storeu_ps(y1, m1, f1);
}

#define RP_MICRO(NA, nb, p, t, y, ldy, m0)     micro(kind, NA, nb, p, t, y, ldy, m0, false)
#define RP_MICRO_PF(NA, nb, p, t, y, ldy, m0)  micro(kind, NA, nb, p, t, y, ldy, m0, first_pass_)
#define RP_PAIR(nb, p0, p1, t, y0, y1, m0, m1) micro_pair(kind, nb, p0, p1, t, y0, y1, m0, m1)
T_512_INLINE void kernel(enum rp_kind kind, int64_t k, const void *panels, size_t pb, int n_rows,
                         const void *tiles, int64_t m, float *y, size_t ldy) {
    if (m == 1) /* decode: two streams, as Q4_0's (repack_avx512.c) */
        KAVX512_Q_DECODE_PAIRS(RP_PAIR, RP_MICRO, k, panels, pb, n_rows, tiles, y, ldy);
    else KAVX512_Q_PANEL_LOOP(RP_MICRO_PF, k, panels, pb, n_rows, tiles, m, y, ldy);
}

KAVX512_KERNEL_ENTRY(q5_kernel, kernel, RP_Q5_0)
KAVX512_KERNEL_ENTRY(nl_kernel, kernel, RP_IQ4_NL)
KAVX512_KERNEL_ENTRY(q41_kernel, kernel, RP_Q4_1)
KAVX512_KERNEL_ENTRY(q51_kernel, kernel, RP_Q5_1)

const kern_repack_ops kavx512_repack_q5_0 = {q5_panel_bytes, q5_pack, q5_kernel};
const kern_repack_ops kavx512_repack_iq4_nl = {nl_panel_bytes, nl_pack, nl_kernel};
const kern_repack_ops kavx512_repack_q4_1 = {q41_panel_bytes, q41_pack, q41_kernel};
const kern_repack_ops kavx512_repack_q5_1 = {q51_panel_bytes, q51_pack, q51_kernel};
