/* kernels: packed GEMM for AVX-512 VNNI (prefill and batched decode).
 *
 * kern_matmul takes this path for m >= KERN_GEMM_MIN_M activation rows. Each
 * thread packs KERN_PANEL_ROWS (16) weight rows at a time into a panel where
 * the 16 rows sit in the 16 int32 lanes of a vector: group g of a block holds
 * bytes 4g..4g+3 of every row. One vpdpbusd against 4 broadcast activation
 * bytes then advances 16 outputs at once, and a block's exact integer sum per
 * output is complete after 8 of them, with no horizontal reduction; the float
 * steps are those of the canonical orders (kern_impl.h), lane by lane, so every
 * output is bit-identical to vec_dot.
 *
 * Activations are prepared once per matmul in tiles of a few rows whose data
 * for one block sits together, so a tile walks with one pointer and constant
 * offsets. The microkernel keeps 2 panels x QT rows of accumulators in
 * registers. */
#include "gemm_avx512.h"

#include <math.h>

#include <stddef.h>
#include <string.h>

/* Byte offsets of the 16 rows of a panel in W (wrow * r < 2^31 for any real k). */
T_512_INLINE __m512i row_offsets(size_t wrow) {
    return _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)wrow));
}

/* The fp16 at each lane's address (4 bytes read, the fp16 in the low half) as floats. */
T_512_INLINE __m512 gather_f16(__m512i off, __mmask16 valid, const void *base) {
    const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, off, base, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* ======================= Q family (Q8_0, Q4_0) =======================
 * Panel, per block: u[8][16] dwords (group g, row r: unsigned weight bytes
 * 4g..4g+3, Q8_0 as x ^ 0x80, Q4_0 as nibbles 0..15), then 16 float scales.
 * Activation tile (QT rows), per block: qs[QT][32], d[QT] floats, c[QT] int32
 * with c = -bias * sum(qs) as in the prepared rows of quant_avx512.c. */
size_t kavx512_q_tile_bytes(int64_t k) { return (size_t)(k / QK8_0) * QT_BLK; }
#define q_tile_bytes kavx512_q_tile_bytes
static size_t q_panel_bytes(int64_t k) { return (size_t)(k / QK8_0) * QP_BLK; }

/* Row x into slot `slot` of the tile, block by block: the bytes of the run-time
 * Q8_0 quantizer (kref_act_from_float_q8_0: d = amax/127, q = x * (127 / amax)
 * rounded half to even), d as the float of its fp16, and c = -bias * sum(q),
 * in one pass over registers. */
T_512_INLINE void q_prepare(const float *x, void *tile, int slot, int64_t k, int bias) {
    char *t = tile;
    for (int64_t b = 0; b < k / QK8_0; b++, t += QT_BLK, x += QK8_0) {
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.f;
        const __m512 vid = _mm512_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        /* cvtps rounds half to even (the default MXCSR mode) */
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)(t + QK8_0 * slot), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(t + QK8_0 * slot + 16), _mm512_cvtsepi32_epi8(q1));
        /* finite d: the F16C conversion rounds as kvl_f32_to_f16 */
        const float dh =
            f16_load(isfinite(d) ? _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT) : kvl_f32_to_f16(d));
        const int32_t c = -bias * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        memcpy(t + QT * QK8_0 + 4 * slot, &dh, 4);
        memcpy(t + QT * (QK8_0 + 4) + 4 * slot, &c, 4);
    }
}

T_512 static void q8_0_prepare(const float *x, void *tile, int slot, int rows, int64_t k) {
    q_prepare(x, tile, slot, k, 128);
}
T_512 static void q4_0_prepare(const float *x, void *tile, int slot, int rows, int64_t k) {
    q_prepare(x, tile, slot, k, 8);
}

/* In-register transpose of 8 vectors of [row p: 8 dwords | row p+8: 8 dwords]
 * into o[g] = dword g of rows 0..15 (an 8x8 transpose in each 256-bit half). */
T_512_INLINE void transpose_8x16(__m512i *z) {
    __m512i t[8], u[8];
    UNROLL(4)
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    /* t[2i] lane L: p=2i,2i+1 of dwords 4L', 4L'+1; t[2i+1]: dwords +2, +3 */
    UNROLL(2)
    for (int i = 0; i < 2; i++) UNROLL(2)
    for (int h = 0; h < 2; h++) {
        u[4 * i + 2 * h] = _mm512_unpacklo_epi64(t[4 * i + h], t[4 * i + 2 + h]);
        u[4 * i + 2 * h + 1] = _mm512_unpackhi_epi64(t[4 * i + h], t[4 * i + 2 + h]);
    }
    /* u[4i + j], 128-bit lane L: rows 4i..4i+3 of dword (4 * (L % 2) + j) for the
     * half L / 2; combine rows 0-3 (i = 0) and 4-7 (i = 1) per half */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    UNROLL(4)
    for (int j = 0; j < 4; j++) {
        z[j] = _mm512_permutex2var_epi64(u[j], lo, u[4 + j]);
        z[4 + j] = _mm512_permutex2var_epi64(u[j], hi, u[4 + j]);
    }
}

/* Bytes at..at+31 of 16 full rows' blocks (base + r * wrow), as v[g] = dword g
 * of rows 0..15. */
T_512_INLINE void load_t32(const char *base, size_t wrow, int at, __m512i *v) {
    UNROLL(8)
    for (int p = 0; p < 8; p++)
        v[p] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(base + p * wrow + at))),
            _mm256_loadu_si256((const __m256i *)(base + (p + 8) * wrow + at)), 1);
    transpose_8x16(v);
}

T_512 static void q8_0_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    const __mmask16 valid = kern_mask16(rows);
    const __m512i off = row_offsets(wrow);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const char *wc = w;
    char *out = panel;
    for (int64_t b = 0; b < k / QK8_0; b++, out += QP_BLK) {
        const char *base = wc + b * sizeof(blk_q8_0);
        if (rows == 16) {
            __m512i z[8];
            load_t32(base, wrow, 2, z);
            UNROLL(8)
            for (int g = 0; g < 8; g++)
                _mm512_storeu_si512(out + 64 * g, _mm512_xor_si512(z[g], bias));
        } else {
            UNROLL(8)
            for (int g = 0; g < 8; g++) {
                const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, off,
                                                              base + 2 + 4 * g, 1);
                _mm512_storeu_si512(out + 64 * g, _mm512_maskz_xor_epi32(valid, v, bias));
            }
        }
        _mm512_storeu_ps(out + 512, gather_f16(off, valid, base));
    }
}

T_512 static void q4_0_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    const __mmask16 valid = kern_mask16(rows);
    const __m512i off = row_offsets(wrow);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const char *wc = w;
    char *out = panel;
    for (int64_t b = 0; b < k / QK4_0; b++, out += QP_BLK) {
        const char *base = wc + b * sizeof(blk_q4_0);
        __m512i v[4]; /* v[g]: bytes 4g..4g+3 of every row */
        if (rows == 16) {
            __m512i z[4]; /* z[q], 128-bit lane L: row q + 4L */
            UNROLL(4)
            for (int q = 0; q < 4; q++) {
                __m512i t =
                    _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(base + q * wrow + 2)));
                t = _mm512_inserti32x4(
                    t, _mm_loadu_si128((const __m128i *)(base + (q + 4) * wrow + 2)), 1);
                t = _mm512_inserti32x4(
                    t, _mm_loadu_si128((const __m128i *)(base + (q + 8) * wrow + 2)), 2);
                z[q] = _mm512_inserti32x4(
                    t, _mm_loadu_si128((const __m128i *)(base + (q + 12) * wrow + 2)), 3);
            }
            /* 4x4 dword transpose in each 128-bit lane */
            const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]),
                          t1 = _mm512_unpackhi_epi32(z[0], z[1]);
            const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]),
                          t3 = _mm512_unpackhi_epi32(z[2], z[3]);
            v[0] = _mm512_unpacklo_epi64(t0, t2), v[1] = _mm512_unpackhi_epi64(t0, t2);
            v[2] = _mm512_unpacklo_epi64(t1, t3), v[3] = _mm512_unpackhi_epi64(t1, t3);
        } else {
            UNROLL(4)
            for (int g = 0; g < 4; g++)
                v[g] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, off,
                                                   base + 2 + 4 * g, 1);
        }
        UNROLL(4)
        for (int g = 0; g < 4; g++) {
            /* bytes 4g..4g+3: low nibbles are elements 4g.., high ones 16+4g.. */
            _mm512_storeu_si512(out + 64 * g, _mm512_and_si512(v[g], m4));
            _mm512_storeu_si512(out + 64 * (g + 4),
                                _mm512_and_si512(_mm512_srli_epi32(v[g], 4), m4));
        }
        _mm512_storeu_ps(out + 512, gather_f16(off, valid, base));
    }
}

KAVX512_KERNEL_ENTRY(q_kernel, kavx512_q_kernel, false)

/* Below this many activation rows, packing costs more than it saves. */
#define PACKED_MIN_M 4

const kern_gemm_ops kavx512_gemm_q8_0 = {
    QT, PACKED_MIN_M, q_tile_bytes, q8_0_prepare, q_panel_bytes, q8_0_pack, q_kernel};
const kern_gemm_ops kavx512_gemm_q4_0 = {
    QT, PACKED_MIN_M, q_tile_bytes, q4_0_prepare, q_panel_bytes, q4_0_pack, q_kernel};

/* ======================= K family (Q4_K, Q6_K) =======================
 * Activation tile (KT rows), per super-block: KT units of a blk_q8_K followed
 * by S[8] int16, S[j] = bsums[2j] + bsums[2j+1] (the sums of Q4_K's 32-value
 * sub-blocks). Panels, per super-block: u[64][16] dwords (the weights as
 * unsigned bytes in element order, Q6_K as q + 32), the per-sub-block int32
 * scales, int16 pairs for the bias terms, then the float scales. The integer
 * sums are exact, so per output the float steps are those of vec_dot. */
#define Q4K_PB KPC_PB(8, true)
#define Q6K_PB KPC_PB(16, false)

size_t kavx512_k_tile_bytes(int64_t k) { return (size_t)(k / QK_K) * KT * KT_UNIT; }
static size_t q4k_panel_bytes(int64_t k) { return (size_t)(k / QK_K) * Q4K_PB; }
static size_t q6k_panel_bytes(int64_t k) { return (size_t)(k / QK_K) * Q6K_PB; }

/* Row x into slot `slot` of the tile, super-block by super-block: the bytes
 * of every Q8_K quantizer (kref_from_float_q8_K: the first value of largest
 * magnitude maps to -127, q = min(127, rint(-127 / max * x)), bsums per 16)
 * and S[j] = bsums[2j] + bsums[2j + 1], in one pass over registers. */
T_512 void kavx512_k_prepare(const float *x, void *tile, int slot, int rows, int64_t k) {
    (void)rows;
    for (int64_t sb = 0; sb < k / QK_K; sb++, x += QK_K) {
        char *u = (char *)tile + (sb * KT + slot) * KT_UNIT;
        __m512 v[QK_K / 16];
        __m512 am = _mm512_setzero_ps();
        UNROLL(16)
        for (int i = 0; i < QK_K / 16; i++) {
            v[i] = _mm512_loadu_ps(x + 16 * i);
            am = _mm512_max_ps(am, _mm512_abs_ps(v[i]));
        }
        const float amax = _mm512_reduce_max_ps(am);
        blk_q8_K q;
        int16_t S[8];
        if (!(amax > 0)) { /* all zero (or NaN: no value is larger than 0, as in the reference) */
            memset(&q, 0, sizeof q);
            memset(S, 0, sizeof S);
        } else {
            float max = 0;
            for (int i = 0; i < QK_K / 16; i++) {
                const __mmask16 hit =
                    _mm512_cmp_ps_mask(_mm512_abs_ps(v[i]), _mm512_set1_ps(amax), _CMP_EQ_OQ);
                if (hit) {
                    max = x[16 * i + __builtin_ctz(hit)];
                    break;
                }
            }
            const float iscale = -127.f / max;
            const __m512 vs = _mm512_set1_ps(iscale);
            const __m512i hi = _mm512_set1_epi32(127);
            UNROLL(16)
            for (int i = 0; i < QK_K / 16; i++) {
                /* cvtps rounds to nearest even under the default MXCSR, as nearest_int */
                const __m512i qi =
                    _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(v[i], vs)));
                _mm_storeu_si128((__m128i *)(q.qs + 16 * i), _mm512_cvtsepi32_epi8(qi));
                q.bsums[i] = (int16_t)_mm512_reduce_add_epi32(qi);
            }
            q.d = 1 / iscale;
            for (int j = 0; j < 8; j++) S[j] = (int16_t)(q.bsums[2 * j] + q.bsums[2 * j + 1]);
        }
        memcpy(u, &q, sizeof q);
        memcpy(u + sizeof q, S, sizeof S);
    }
}

/* NAME, the kern_gemm_ops.pack of a per-call packed K-family type: the
 * panel's super-blocks (PB bytes each) one after another, each through
 * SB(base, wrow, rows, valid, off, out) from the rows' BLK blocks, base row
 * 0's: all 16 rows are loaded whole and transposed, fewer gathered (the lanes
 * under valid, at base + off). */
#define KPC_PACK(NAME, BLK, PB, SB)                                                                \
    T_512 static void NAME(const void *w, size_t wrow, int rows, int64_t k, void *panel) {         \
        const __mmask16 valid = kern_mask16(rows);                                                 \
        const __m512i off = row_offsets(wrow);                                                     \
        char *out = panel;                                                                         \
        for (int64_t sb = 0; sb < k / QK_K; sb++, out += (PB))                                     \
            SB((const char *)w + sb * sizeof(BLK), wrow, rows, valid, off, out);                   \
    }

/* Gathered dword at byte offset `at` of each row's block. */
#define GATHER(at) _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, off, base + (at), 1)

/* One super-block of the Q4_K panel (KPC_PACK). */
T_512_INLINE void q4k_pack_sb(const char *base, size_t wrow, int rows, __mmask16 valid, __m512i off,
                              char *out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi32(63);
    for (int c = 0; c < 4; c++) {
        __m512i v[8];
        if (rows == 16) {
            load_t32(base, wrow, 16 + 32 * c, v);
        } else {
            UNROLL(8)
            for (int gg = 0; gg < 8; gg++) v[gg] = GATHER(16 + 32 * c + 4 * gg);
        }
        UNROLL(8)
        for (int gg = 0; gg < 8; gg++) {
            _mm512_storeu_si512(out + 64 * (16 * c + gg), _mm512_and_si512(v[gg], m4));
            _mm512_storeu_si512(out + 64 * (16 * c + 8 + gg),
                                _mm512_and_si512(_mm512_srli_epi32(v[gg], 4), m4));
        }
    }
    /* kern_q4k_scale_min on 16 rows at once */
    const __m512i w0 = GATHER(4), w1 = GATHER(8), w2 = GATHER(12);
    __m512i sc[8], mn[8];
    UNROLL(4)
    for (int j = 0; j < 4; j++) {
        sc[j] = _mm512_and_si512(_mm512_srli_epi32(w0, 8 * j), m6);
        mn[j] = _mm512_and_si512(_mm512_srli_epi32(w1, 8 * j), m6);
        const __m512i lo4 = _mm512_and_si512(_mm512_srli_epi32(w2, 8 * j), _mm512_set1_epi32(15));
        const __m512i hi4 =
            _mm512_and_si512(_mm512_srli_epi32(w2, 8 * j + 4), _mm512_set1_epi32(15));
        const __m512i s2 = _mm512_and_si512(_mm512_srli_epi32(w0, 8 * j + 6), _mm512_set1_epi32(3));
        const __m512i m2 = _mm512_and_si512(_mm512_srli_epi32(w1, 8 * j + 6), _mm512_set1_epi32(3));
        sc[j + 4] = _mm512_or_si512(lo4, _mm512_slli_epi32(s2, 4));
        mn[j + 4] = _mm512_or_si512(hi4, _mm512_slli_epi32(m2, 4));
    }
    UNROLL(8)
    for (int j = 0; j < 8; j++) _mm512_storeu_si512(out + KPC_SC + 64 * j, sc[j]);
    UNROLL(4)
    for (int t = 0; t < 4; t++)
        _mm512_storeu_si512(out + KPC_PAIRS(8) + 64 * t,
                            _mm512_or_si512(mn[2 * t], _mm512_slli_epi32(mn[2 * t + 1], 16)));
    const __m512i dd = GATHER(0);
    _mm512_storeu_ps(out + KPC_D(8), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_storeu_ps(out + KPC_D(8) + 64,
                     _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
}

/* One super-block of the Q6_K panel (KPC_PACK). */
T_512_INLINE void q6k_pack_sb(const char *base, size_t wrow, int rows, __mmask16 valid, __m512i off,
                              char *out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
    for (int h = 0; h < 2; h++) {
        __m512i L0[8], L1[8], HB[8];
        if (rows == 16) {
            load_t32(base, wrow, 64 * h, L0);
            load_t32(base, wrow, 64 * h + 32, L1);
            load_t32(base, wrow, 128 + 32 * h, HB);
        } else {
            UNROLL(8)
            for (int i4 = 0; i4 < 8; i4++) {
                L0[i4] = GATHER(64 * h + 4 * i4), L1[i4] = GATHER(64 * h + 32 + 4 * i4);
                HB[i4] = GATHER(128 + 32 * h + 4 * i4);
            }
        }
        UNROLL(8)
        for (int i4 = 0; i4 < 8; i4++) {
            const __m512i l0 = L0[i4], l1 = L1[i4], hb = HB[i4];
            /* element 128h + 32q + 4i4.. is group 32h + 8q + i4 */
            const __m512i q[4] = {
                _mm512_or_si512(_mm512_and_si512(l0, m4),
                                _mm512_slli_epi32(_mm512_and_si512(hb, m2), 4)),
                _mm512_or_si512(
                    _mm512_and_si512(l1, m4),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2), m2), 4)),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32(l0, 4), m4),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 4), m2), 4)),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32(l1, 4), m4),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 6), m2), 4))};
            UNROLL(4)
            for (int qq = 0; qq < 4; qq++)
                _mm512_storeu_si512(out + 64 * (32 * h + 8 * qq + i4), q[qq]);
        }
    }
    __m512i sc[16];
    UNROLL(4)
    for (int i = 0; i < 4; i++) {
        const __m512i v = GATHER(192 + 4 * i);
        UNROLL(4)
        for (int b = 0; b < 4; b++) /* sign-extended byte b */
            sc[4 * i + b] = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * b), 24);
    }
    UNROLL(16)
    for (int g = 0; g < 16; g++) _mm512_storeu_si512(out + KPC_SC + 64 * g, sc[g]);
    UNROLL(8)
    for (int t = 0; t < 8; t++) { /* (-32 sc_2t, -32 sc_2t+1) as int16 */
        const __m512i lo = _mm512_and_si512(_mm512_mullo_epi32(sc[2 * t], _mm512_set1_epi32(-32)),
                                            _mm512_set1_epi32(0xFFFF));
        const __m512i hi =
            _mm512_slli_epi32(_mm512_mullo_epi32(sc[2 * t + 1], _mm512_set1_epi32(-32)), 16);
        _mm512_storeu_si512(out + KPC_PAIRS(16) + 64 * t, _mm512_or_si512(lo, hi));
    }
    /* d is the last 2 bytes of the 210-byte block: read the dword ending there */
    _mm512_storeu_ps(out + KPC_D(16),
                     _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(GATHER(206), 16))));
}
#undef GATHER
KPC_PACK(q4k_pack, blk_q4_K, Q4K_PB, q4k_pack_sb)
KPC_PACK(q6k_pack, blk_q6_K, Q6K_PB, q6k_pack_sb)
#undef KPC_PACK

/* Q4_K panels hold 8 groups of 32 and the mins; Q6_K panels 16 groups of 16
 * with the -32 offset folded into bsums. */
T_512_INLINE void q4k_micro(int64_t nsb, const char *P, const char *A, float *y, size_t ldy, int na,
                            __mmask16 mask) {
    kavx512_k_pc_micro(8, true, nsb, P, A, y, ldy, na, mask);
}
T_512_INLINE void q6k_micro(int64_t nsb, const char *P, const char *A, float *y, size_t ldy, int na,
                            __mmask16 mask) {
    kavx512_k_pc_micro(16, false, nsb, P, A, y, ldy, na, mask);
}

KAVX512_K_KERNEL(extern, kavx512_k_g32_kernel, q4k_micro)
KAVX512_K_KERNEL(extern, kavx512_k_g16_kernel, q6k_micro)

const kern_gemm_ops kavx512_gemm_q4_K =
    KAVX512_K_GEMM_OPS(PACKED_MIN_M, q4k_panel_bytes, q4k_pack, kavx512_k_g32_kernel);
const kern_gemm_ops kavx512_gemm_q6_K =
    KAVX512_K_GEMM_OPS(PACKED_MIN_M, q6k_panel_bytes, q6k_pack, kavx512_k_g16_kernel);

/* ======================= FP family (F32, F16, BF16) =======================
 * Weights are read in place, FW rows at a time; activation tile of na <= FT
 * rows, per 16 elements: na x 16 floats, already rounded to the weight type's
 * vec_dot type and widened (zero past k). Each output keeps one 16-lane accumulator,
 * lane e % 16, and ends in kern_reduce16: vec_dot's order. `kind` is the
 * weights' gguf_dtype. */
#define FT 6
#define FW 4

static size_t f_tile_bytes(int64_t k) { return (size_t)((k + 15) / 16) * FT * 64; }

/* The activations as vec_dot sees them: rounded to the weight type's vec_dot
 * type (F16 and BF16 through the reference conversions' bytes) and widened. */
T_512_INLINE void f_prepare(int kind, const float *x, void *tile, int slot, int rows, int64_t k) {
    float *t = (float *)tile + 16 * slot;
    for (int64_t i = 0; i < k; i += 16, t += rows * 16) {
        const __mmask16 m = kern_mask16((int)(k - i < 16 ? k - i : 16));
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        if (kind == GGUF_DT_F16) {
            v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else if (kind == GGUF_DT_BF16) {
            float r[16] = {0};
            for (int l = 0; l < 16 && i + l < k; l++)
                r[l] = kvl_bf16_to_f32(kvl_f32_to_bf16(x[i + l]));
            v = _mm512_loadu_ps(r);
        }
        _mm512_storeu_ps(t, v);
    }
}
T_512 static void f32_prepare(const float *x, void *t, int slot, int rows, int64_t k) {
    f_prepare(GGUF_DT_F32, x, t, slot, rows, k);
}
T_512 static void f16_prepare(const float *x, void *t, int slot, int rows, int64_t k) {
    f_prepare(GGUF_DT_F16, x, t, slot, rows, k);
}
T_512 static void bf16_prepare(const float *x, void *t, int slot, int rows, int64_t k) {
    f_prepare(GGUF_DT_BF16, x, t, slot, rows, k);
}

/* NW (<= FW) weight rows x NA (<= FT) activation rows of one tile, all of k. */
T_512_INLINE void f_micro(int kind, int NW, int NA, int64_t k, const char *w, size_t wrow,
                          const float *t, float *y, size_t ldy, size_t ystep) {
    __m512 acc[FW][FT];
    UNROLL(4)
    for (int r = 0; r < NW; r++) UNROLL(6)
    for (int a = 0; a < NA; a++) acc[r][a] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16, t += NA * 16) {
        UNROLL(4)
        for (int r = 0; r < NW; r++) {
            const __m512 wv = kern_load16_ps(kind, w + r * wrow, i, 0xFFFF);
            UNROLL(6)
            for (int a = 0; a < NA; a++)
                acc[r][a] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(t + 16 * a), acc[r][a]);
        }
    }
    if (i < k) { /* lanes past k: 0 * 0 leaves the accumulator as it is */
        const __mmask16 m = kern_mask16((int)(k - i));
        UNROLL(4)
        for (int r = 0; r < NW; r++) {
            const __m512 wv = kern_load16_ps(kind, w + r * wrow, i, m);
            UNROLL(6)
            for (int a = 0; a < NA; a++)
                acc[r][a] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(t + 16 * a), acc[r][a]);
        }
    }
    if (NW * NA < 8) {
        UNROLL(6)
        for (int a = 0; a < NA; a++) UNROLL(4)
        for (int r = 0; r < NW; r++) y[a * ldy + r * ystep] = kern_hsum16_ps(acc[r][a]);
        return;
    }
    /* 16 outputs at a time through one transposed reduction (kern_reduce16's
     * tree per output, as kern_hsum16_ps): about 3 instructions per output
     * instead of 8, which was half of a cache-resident GEMM's time
     * (stories260K, 5 rows: 45% of f32_kernel's samples). Output f = a * NW + r. */
    _Alignas(64) float s[16];
    UNROLL(2)
    for (int g = 0; g < NW * NA; g += 16) {
        __m512 v[16];
        UNROLL(16)
        for (int i = 0; i < 16; i++)
            v[i] = g + i < NW * NA ? acc[(g + i) % NW][(g + i) / NW] : _mm512_setzero_ps();
        _mm512_store_ps(s, kern_reduce16x16_ps(v));
        UNROLL(16)
        for (int i = 0; i < 16; i++)
            if (g + i < NW * NA) y[(g + i) / NW * ldy + (g + i) % NW * ystep] = s[i];
    }
}

/* One activation row (decode) x 16 weight rows: rows r0 + i + s * q (i, s
 * in 0..3; the four streams of the m <= 2 path below, four rows of each),
 * outputs y[i + s * q], through one transposed reduction. */
T_512_INLINE void f_micro1x16(int kind, int64_t k, const char *w, size_t wrow, size_t q,
                              const float *t, float *y) {
    __m512 acc[16];
    UNROLL(16)
    for (int f = 0; f < 16; f++) acc[f] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16, t += 16) {
        const __mmask16 m = kern_mask16(k - i < 16 ? (int)(k - i) : 16);
        const __m512 x = _mm512_loadu_ps(t);
        UNROLL(16)
        for (int f = 0; f < 16; f++)
            acc[f] = _mm512_fmadd_ps(
                kern_load16_ps(kind, w + ((size_t)(f / 4) + (size_t)(f % 4) * q) * wrow, i, m), x,
                acc[f]);
    }
    _Alignas(64) float s[16];
    _mm512_store_ps(s, kern_reduce16x16_ps(acc));
    UNROLL(16)
    for (int f = 0; f < 16; f++) y[(size_t)(f / 4) + (size_t)(f % 4) * q] = s[f];
}

/* NA, NW as constants, so the accumulators stay in registers. */
T_512_INLINE void f_micro_na(int kind, int NW, int na, int64_t k, const char *w, size_t wrow,
                             const float *t, float *y, size_t ldy, size_t ystep) {
    switch (na) {
    case 1: f_micro(kind, NW, 1, k, w, wrow, t, y, ldy, ystep); break;
    case 2: f_micro(kind, NW, 2, k, w, wrow, t, y, ldy, ystep); break;
    case 3: f_micro(kind, NW, 3, k, w, wrow, t, y, ldy, ystep); break;
    case 4: f_micro(kind, NW, 4, k, w, wrow, t, y, ldy, ystep); break;
    case 5: f_micro(kind, NW, 5, k, w, wrow, t, y, ldy, ystep); break;
    default: f_micro(kind, NW, FT, k, w, wrow, t, y, ldy, ystep); break;
    }
}

T_512_INLINE void f_kernel(int kind, int64_t k, const void *w, size_t wrow, int n_rows,
                           const void *tiles, int64_t m, float *y, size_t ldy) {
    const size_t tb = f_tile_bytes(k);
    for (int64_t t = 0; t * FT < m; t++) {
        const int na = m - t * FT < FT ? (int)(m - t * FT) : FT;
        const float *tile = (const float *)((const char *)tiles + t * tb);
        float *yt = y + t * FT * ldy;
        const char *wc = w;
        int r = 0;
        if (m <= 2) {
            /* decode: the FW rows of a micro-tile a quarter of the chunk apart, so
             * each streams on through consecutive rows (short interleaved
             * streams of adjacent rows defeat the prefetchers) */
            const int q = n_rows / FW;
            if (na == 1)
                for (; r + 4 <= q; r += 4)
                    f_micro1x16(kind, k, wc + r * wrow, wrow, (size_t)q, tile, yt + r);
            for (; r < q; r++)
                f_micro_na(kind, FW, na, k, wc + r * wrow, q * wrow, tile, yt + r, ldy, (size_t)q);
            r = q * FW;
        }
        for (; r + FW <= n_rows; r += FW)
            f_micro_na(kind, FW, na, k, wc + r * wrow, wrow, tile, yt + r, ldy, 1);
        for (; r < n_rows; r++)
            f_micro_na(kind, 1, na, k, wc + r * wrow, wrow, tile, yt + r, ldy, 1);
    }
}
KAVX512_KERNEL_ENTRY(f32_kernel, f_kernel, GGUF_DT_F32)
KAVX512_KERNEL_ENTRY(f16_kernel, f_kernel, GGUF_DT_F16)
KAVX512_KERNEL_ENTRY(bf16_kernel, f_kernel, GGUF_DT_BF16)

const kern_gemm_ops kavx512_gemm_f32 = {FT, 1, f_tile_bytes, f32_prepare, NULL, NULL, f32_kernel};
const kern_gemm_ops kavx512_gemm_f16 = {FT, 1, f_tile_bytes, f16_prepare, NULL, NULL, f16_kernel};
const kern_gemm_ops kavx512_gemm_bf16 = {FT,   1,    f_tile_bytes, bf16_prepare,
                                         NULL, NULL, bf16_kernel};
