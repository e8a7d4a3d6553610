/* kernels: repacked MXFP4 weights for AVX-512 VNNI (kern_repack_ops), read by
 * decode and prefill alike, and the per-call packed GEMM on the same panels
 * (kern_gemm_ops: weights that were not repacked).
 *
 * A panel holds 16 weight rows in the 16 dword lanes of a vector, as the
 * IQ4_NL panels of repack32_avx512.c do. Blocks go in groups of four: per
 * block 4 vectors, lane r = bytes qs[4g..4g+3] of row r (low nibbles:
 * elements 4g..4g+3, high: 16+4g..), then one vector of the group's E8M0
 * scale bytes (byte 16j + r: block j of the group, row r; zero past the
 * last block), so every vector is 64-byte aligned and the panel is as
 * compact as the GGUF rows: 4 x 17 x 16 = 1088 bytes per group, a shorter
 * last group (k not a multiple of 128) padded to the next 64 bytes.
 *
 * The kernel widens each group of codes to unsigned bytes with one table
 * lookup (the doubled E2M1 values + 128) and runs the Q8_0 activation tiles
 * of gemm_avx512.c (c = -128 * sum), so a block's exact integer sum is
 * that of vec_dot; its scale 2^(e - 128) (kern_e8m0_half, the subnormals of
 * e < 2 included) is built from the byte exactly, and the float steps are
 * vec_dot's, f = fma(d_x * d_y, isum, f): every output is bit-identical to
 * kref_vec_dot_mxfp4 (quant_mxfp4.c). */
#include "gemm_avx512.h"

#define MX_GROUP 4                        /* blocks per scale vector */
#define MX_NIB   256                      /* one block's 4 x 64 bytes of codes */
#define MX_GB    (MX_GROUP * MX_NIB + 64) /* a full group */

static size_t mx_panel_bytes(int64_t k) {
    const int64_t nb = k / QK_MXFP4, tail = nb % MX_GROUP;
    return (size_t)(nb / MX_GROUP) * MX_GB + (tail ? (size_t)tail * MX_NIB + 64 : 0);
}

/* rows (<= 16) rows of W into one panel; missing rows read as 0 (code 0,
 * scale byte 0). */
T_512 static void mx_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    const int64_t nb = k / QK_MXFP4;
    char *out = panel;
    for (int64_t b0 = 0; b0 < nb; b0 += MX_GROUP) {
        const int nbg = nb - b0 < MX_GROUP ? (int)(nb - b0) : MX_GROUP;
        _Alignas(64) uint8_t sc[64];
        memset(sc, 0, sizeof sc);
        for (int j = 0; j < nbg; j++, out += MX_NIB) {
            _Alignas(64) int32_t v[4][16];
            memset(v, 0, sizeof v);
            for (int r = 0; r < rows; r++) {
                const blk_mxfp4 *x =
                    (const blk_mxfp4 *)((const char *)w + (size_t)r * wrow) + b0 + j;
                for (int g = 0; g < 4; g++) memcpy(&v[g][r], x->qs + 4 * g, 4);
                sc[16 * j + r] = x->e;
            }
            memcpy(out, v, MX_NIB);
        }
        memcpy(out, sc, 64);
        out += 64;
    }
}

/* The 16 rows' scales of block j (bytes at s) as kern_e8m0_half gives them:
 * (e - 1) << 23, or 0x00200000 << e for e < 2. */
T_512_INLINE __m512 mx_scales(const char *s) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub));
}

/* 16 weight rows x NA activation rows of one tile, all blocks. pf: the pass
 * that meets the panel first fetches the stream KAVX512_BATCH_AHEAD bytes ahead
 * into L2, as repack32_avx512.c's micro does: per 2880 x 2880 matrix
 * (bench_kernels from DRAM, with and without alternating call by call in one
 * process, median of 400 pairs, 2 threads) without it m = 4 took x1.28 as
 * long, m = 16 x1.21. */
T_512_INLINE void mx_micro(int NA, int64_t nb, const char *p, const char *t, float *y, size_t ldy,
                           __mmask16 m0, bool pf) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* the doubled E2M1 values + 128 in every 128-bit lane (vpshufb looks up per lane) */
    const __m512i lv = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)kern_mxfp4_values), _mm_set1_epi8((char)0x80)));
    __m512 f[QT];
    UNROLL(6)
    for (int a = 0; a < NA; a++) f[a] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += MX_GROUP) {
        const int nbg = nb - b0 < MX_GROUP ? (int)(nb - b0) : MX_GROUP;
        const char *sc = p + (size_t)nbg * MX_NIB;
        for (int j = 0; j < nbg; j++, p += MX_NIB, t += QT_BLK) {
            if (pf) /* the group's 17 lines: 5 at its first block, 4 at the others */
                for (int l = 0; l < (j ? 4 : 5); l++)
                    _mm_prefetch(p + KAVX512_BATCH_AHEAD + 64 * l, _MM_HINT_T1);
            const int32_t *c = (const int32_t *)(t + QT * (QK8_0 + 4));
            __m512i i[QT];
            UNROLL(6)
            for (int a = 0; a < NA; a++) i[a] = _mm512_set1_epi32(c[a]);
            UNROLL(4)
            for (int g = 0; g < 4; g++) {
                const __m512i v = _mm512_loadu_si512(p + 64 * g);
                const __m512i lo = _mm512_shuffle_epi8(lv, _mm512_and_si512(v, m4));
                const __m512i hi =
                    _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_srli_epi32(v, 4), m4));
                KAVX512_Q_NIB_DOTS(NA, i, lo, hi, t, g);
            }
            const float *dy = (const float *)(t + QT * QK8_0);
            const __m512 d = mx_scales(sc + 16 * j);
            KAVX512_Q_FSTEP(NA, f, d, dy, i);
        }
        p += 64; /* the group's scales */
    }
    UNROLL(6)
    for (int a = 0; a < NA; a++) _mm512_mask_storeu_ps(y + a * ldy, m0, f[a]);
}

/* Decode (one activation row): panels p0 and p1 at once, each block's sum
 * split over two accumulators, each stream prefetched MX_DECODE_AHEAD bytes
 * ahead (kavx512_decode_prefetch), as repack32_avx512.c's micro_pair (which
 * see); per matrix (bench_kernels, 2880 x 2880, gpt-oss-20b's expert shape, from DRAM,
 * alternating call by call with one panel at a time in one process, median of
 * 400 pairs) the one-panel path took x1.28 as long on 2 threads, x1.34 on one. */
#define MX_DECODE_AHEAD 2048
T_512_INLINE void mx_pair(int64_t nb, const char *p0, const char *p1, const char *t, float *y0,
                          float *y1, __mmask16 m0, __mmask16 m1) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lv = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)kern_mxfp4_values), _mm_set1_epi8((char)0x80)));
    const bool nta = kavx512_decode_nta;
    __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += MX_GROUP) {
        const int nbg = nb - b0 < MX_GROUP ? (int)(nb - b0) : MX_GROUP;
        const char *sc0 = p0 + (size_t)nbg * MX_NIB, *sc1 = p1 + (size_t)nbg * MX_NIB;
        for (int j = 0; j < nbg; j++, p0 += MX_NIB, p1 += MX_NIB, t += QT_BLK) {
            /* the group's 17 lines: 5 at its first block, 4 at the others */
            for (int l = 0; l < (j ? 4 : 5); l++) {
                kavx512_decode_prefetch(p0 + MX_DECODE_AHEAD + 64 * l, nta);
                kavx512_decode_prefetch(p1 + MX_DECODE_AHEAD + 64 * l, nta);
            }
            const int32_t c = *(const int32_t *)(t + QT * (QK8_0 + 4));
            __m512i i0[2] = {_mm512_set1_epi32(c), _mm512_setzero_si512()};
            __m512i i1[2] = {i0[0], _mm512_setzero_si512()};
            UNROLL(4)
            for (int g = 0; g < 4; g++) {
                const __m512i xl = _mm512_set1_epi32(*(const int32_t *)(t + 4 * g));
                const __m512i xh = _mm512_set1_epi32(*(const int32_t *)(t + 16 + 4 * g));
                const __m512i v0 = _mm512_loadu_si512(p0 + 64 * g),
                              v1 = _mm512_loadu_si512(p1 + 64 * g);
                i0[g & 1] = _mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(i0[g & 1],
                                        _mm512_shuffle_epi8(lv, _mm512_and_si512(v0, m4)), xl),
                    _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_srli_epi32(v0, 4), m4)), xh);
                i1[g & 1] = _mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(i1[g & 1],
                                        _mm512_shuffle_epi8(lv, _mm512_and_si512(v1, m4)), xl),
                    _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_srli_epi32(v1, 4), m4)), xh);
            }
            i0[0] = _mm512_add_epi32(i0[0], i0[1]);
            i1[0] = _mm512_add_epi32(i1[0], i1[1]);
            const float *dy = (const float *)(t + QT * QK8_0);
            KAVX512_Q_FSTEP(1, (&f0), mx_scales(sc0 + 16 * j), dy, i0);
            KAVX512_Q_FSTEP(1, (&f1), mx_scales(sc1 + 16 * j), dy, i1);
        }
        p0 += 64, p1 += 64; /* the groups' scales */
    }
    _mm512_mask_storeu_ps(y0, m0, f0);
    _mm512_mask_storeu_ps(y1, m1, f1);
}

#define MX_MICRO(NA, nb, p, t, y, ldy, m0)    mx_micro(NA, nb, p, t, y, ldy, m0, false)
#define MX_MICRO_PF(NA, nb, p, t, y, ldy, m0) mx_micro(NA, nb, p, t, y, ldy, m0, first_pass_)
T_512 static void mx_kernel(int64_t k, const void *panels, size_t pb, int n_rows, const void *tiles,
                            int64_t m, float *y, size_t ldy) {
    if (m == 1) /* decode */
        KAVX512_Q_DECODE_PAIRS(mx_pair, MX_MICRO, k, panels, pb, n_rows, tiles, y, ldy);
    else KAVX512_Q_PANEL_LOOP(MX_MICRO_PF, k, panels, pb, n_rows, tiles, m, y, ldy);
}

/* The Q8_0 GEMM's activation tiles (c = -128 * sum). */
static void mx_prepare(const float *x, void *tile, int slot, int rows, int64_t k) {
    kavx512_gemm_q8_0.prepare(x, tile, slot, rows, k);
}

/* Below this many activation rows vec_dot is cheaper than packing per call. */
#define MX_GEMM_MIN_M 4

const kern_gemm_ops kavx512_gemm_mxfp4 = {
    QT, MX_GEMM_MIN_M, kavx512_q_tile_bytes, mx_prepare, mx_panel_bytes, mx_pack, mx_kernel};
const kern_repack_ops kavx512_repack_mxfp4 = {mx_panel_bytes, mx_pack, mx_kernel};
