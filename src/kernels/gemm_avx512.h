/* kernels, private to the AVX-512 files: the activation tile layouts that gemm_avx512.c prepares (kern_gemm_ops.prepare)
 * and both its per-call packed kernels and the repacked ones
 * (repack_avx512.c, repack_k_avx512.c) read. */
#ifndef KVLLM_GEMM_AVX512_H
#define KVLLM_GEMM_AVX512_H

#include "simd.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* v, held in a register: the compiler may no longer fold the load that made
 * it into each instruction that reads it (a 64-byte load per use, two when
 * it straddles a cache line). */
T_512_INLINE __m512i kavx512_in_reg(__m512i v) {
    __asm__("" : "+v"(v));
    return v;
}

/* Q family (Q8_0, Q4_0 weights) activation tile of QT rows, per 32-element
 * block: qs[QT][32] int8, d[QT] float (the fp16 scale widened), c[QT] int32
 * with c = -bias * sum(qs), bias 128 for Q8_0 weights (stored as x ^ 0x80,
 * unsigned) and 8 for Q4_0 (nibbles 0..15), so that a block's exact integer
 * dot is c + sum(unsigned weight * qs). Rows past m read as zeros. */
#define QT     6
#define QT_BLK (QT * (QK8_0 + 4 + 4))
/* A Q-family panel's block: 8 x 64 bytes of values, the 16 rows' float d,
 * and for the types with a min (QP1_BLK) their float m. */
#define QP_BLK  (8 * 64 + 64)
#define QP1_BLK (QP_BLK + 64)
size_t kavx512_q_tile_bytes(int64_t k);

/* One 32-value block of a Q-family micro-kernel (gemm_avx512.c,
 * gemm32_avx512.c): i0[a] (and i1[a] when two) += the dpbusd of the 16-row
 * weight panel block at p0 (p1) with tile row a's 32 int8 at t + QK8_0 * a (QK8_1 = QK8_0). */
T_512_INLINE void kavx512_q_block_dots(__m512i *i0, __m512i *i1, const char *p0, const char *p1,
                                       bool two, const char *t) {
    UNROLL(8)
    for (int g = 0; g < 8; g++) {
        const __m512i u0 = _mm512_loadu_si512(p0 + 64 * g);
        const __m512i u1 = two ? _mm512_loadu_si512(p1 + 64 * g) : u0;
        UNROLL(6)
        for (int a = 0; a < QT; a++) {
            const __m512i x = _mm512_set1_epi32(*(const int32_t *)(t + QK8_0 * a + 4 * g));
            i0[a] = _mm512_dpbusd_epi32(i0[a], u0, x);
            if (two) i1[a] = _mm512_dpbusd_epi32(i1[a], u1, x);
        }
    }
}

/* The na (<= QT) output rows of a Q-family micro-kernel, ldy floats apart:
 * columns 0..15 under mask m0 from f0, 16..31 under m1 from f1 when two. */
T_512_INLINE void kavx512_q_store(float *y, size_t ldy, int na, bool two, __mmask16 m0,
                                  __mmask16 m1, const __m512 *f0, const __m512 *f1) {
    UNROLL(6)
    for (int a = 0; a < QT; a++) {
        if (a >= na) break;
        _mm512_mask_storeu_ps(y + a * ldy, m0, f0[a]);
        if (two) _mm512_mask_storeu_ps(y + a * ldy + 16, m1, f1[a]);
    }
}

/* 16 (or 32 with two) weight rows x QT activation rows over all nb blocks of
 * a Q-family panel: per block the 8 x 64 bytes of values, 16 float d, and
 * with min (Q4_1, Q5_1 against Q8_1 tiles, gemm32_avx512.c) 16 float m.
 * Without min (Q8_0, Q4_0 and the types on their panels, gemm_avx512.c) a
 * block's sums start from the tile's c and f = fma(d * dy, isum, f); with
 * min they start from 0 and f = f + fma(d * dy, isum, m * sy) (quant32.h). */
T_512_INLINE void kavx512_q_micro(bool min, int64_t nb, const char *p0, const char *p1, bool two,
                                  const char *t, float *y, size_t ldy, int na, __mmask16 m0,
                                  __mmask16 m1) {
    const size_t pb = min ? QP1_BLK : QP_BLK;
    __m512 f0[QT], f1[QT];
    UNROLL(6)
    for (int a = 0; a < QT; a++) f0[a] = f1[a] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p0 += pb, p1 += pb, t += QT_BLK) {
        const int32_t *c = (const int32_t *)(t + QT * (QK8_0 + 4));
        __m512i i0[QT], i1[QT];
        UNROLL(6)
        for (int a = 0; a < QT; a++)
            i0[a] = i1[a] = min ? _mm512_setzero_si512() : _mm512_set1_epi32(c[a]);
        kavx512_q_block_dots(i0, i1, p0, p1, two, t);
        const float *dy = (const float *)(t + QT * QK8_0),
                    *sy = (const float *)(t + QT * (QK8_0 + 4));
        const __m512 d0 = _mm512_loadu_ps(p0 + 512);
        const __m512 n0 = min ? _mm512_loadu_ps(p0 + 576) : d0; /* the m (unused without) */
        const __m512 d1 = two ? _mm512_loadu_ps(p1 + 512) : d0;
        const __m512 n1 = min && two ? _mm512_loadu_ps(p1 + 576) : n0;
        if (min) {
            UNROLL(6)
            for (int a = 0; a < QT; a++) {
                const __m512 dd = _mm512_set1_ps(dy[a]), ss = _mm512_set1_ps(sy[a]);
                f0[a] = _mm512_add_ps(f0[a], _mm512_fmadd_ps(_mm512_mul_ps(d0, dd),
                                                             _mm512_cvtepi32_ps(i0[a]),
                                                             _mm512_mul_ps(n0, ss)));
                if (two)
                    f1[a] = _mm512_add_ps(f1[a], _mm512_fmadd_ps(_mm512_mul_ps(d1, dd),
                                                                 _mm512_cvtepi32_ps(i1[a]),
                                                                 _mm512_mul_ps(n1, ss)));
            }
        } else {
            UNROLL(6)
            for (int a = 0; a < QT; a++) {
                const __m512 dd = _mm512_set1_ps(dy[a]);
                f0[a] = _mm512_fmadd_ps(_mm512_mul_ps(d0, dd), _mm512_cvtepi32_ps(i0[a]), f0[a]);
                if (two)
                    f1[a] =
                        _mm512_fmadd_ps(_mm512_mul_ps(d1, dd), _mm512_cvtepi32_ps(i1[a]), f1[a]);
            }
        }
    }
    kavx512_q_store(y, ldy, na, two, m0, m1, f0, f1);
}

/* The tile x panel loop of a kernel (kern_gemm_ops or kern_repack_ops
 * .kernel) whose micro-kernel takes one 16-row panel: the tiles of TR
 * activation rows (TILE_BYTES(k) bytes each, over k / QB blocks) one after
 * another, each against every panel through CALL(MICRO, na, nb, panel, tile,
 * y, ldy, mask), CALL one of the two below. MICRO may read first_pass_: true
 * on tile 0's pass, the one that meets the panels first (from memory); that
 * pass prefetches the stream KAVX512_BATCH_AHEAD bytes ahead into L2, about
 * as far as the K family's (KAVX512_R_KERNEL). */
#define KAVX512_BATCH_AHEAD 7168
/* The two-stream decode kernels' own prefetches (Q4_0 and Q8_0 in
 * repack_avx512.c, Q5_0 / IQ4_NL / Q4_1 / Q5_1 in repack32_avx512.c, MXFP4):
 * their hint is the CPU's, chosen at start-up (kavx512_decode_nta, set by
 * dispatch.c). On AMD (Zen 4) non-temporal, as the weights are read once a
 * token. Against T1 (into L2), per decode step with the two alternating step
 * by step in one process (temporary switch, 2 threads, 512 of context, 96-128
 * pairs): llama-3.2-1b synth Q5_0 time x0.968-0.975, Q4_0 x0.943-0.958, Q8_0
 * x0.939-0.953, gpt-oss-20b MXFP4 x0.939-0.947; per matrix (bench/kernel_ab.sh,
 * 4096 x 4096 from DRAM) x0.86-0.99 across those types, about 1.0 in the
 * fastest minutes. The K family's one stream (pf_lines) lost with it: per
 * step x1.12 (llama-3.2-1b Q4_K_M), x1.06 (qwen3-30b-a3b Q4_K_M). On Intel
 * (a Xeon with AVX-512 and AMX, KVM, 2 threads) NTA is the slow one: those
 * kernels read 10-13 GB/s from DRAM with it against 29-34 GB/s with T1 (the
 * stream probe 24-27; bench_kernels 4096 x 4096 Q4_0, Q8_0, Q5_0, MXFP4), and
 * 7-18 GB/s from L2 against 40-85: the lines it brings bypass L2, where that
 * core's streamer would have followed them. T0 read within a few percent of
 * T1 there. */
T_512_INLINE void kavx512_decode_prefetch(const char *p, bool nta) {
    if (nta) _mm_prefetch(p, _MM_HINT_NTA);
    else _mm_prefetch(p, _MM_HINT_T1);
}
#define KAVX512_PANEL_LOOP(TR, QB, TILE_BYTES, CALL, MICRO, k, panels, pb, n_rows, tiles, m, y,    \
                           ldy)                                                                    \
    do {                                                                                           \
        const int64_t nb_ = (k) / (QB);                                                            \
        const int np_ = ((n_rows) + 15) / 16;                                                      \
        const size_t tb_ = TILE_BYTES(k);                                                          \
        for (int64_t ti_ = 0; ti_ * (TR) < (m); ti_++) {                                           \
            const int na_ = (m)-ti_ * (TR) < (TR) ? (int)((m)-ti_ * (TR)) : (TR);                  \
            const bool first_pass_ = ti_ == 0;                                                     \
            (void)first_pass_;                                                                     \
            for (int p_ = 0; p_ < np_; p_++)                                                       \
                CALL(MICRO, na_, nb_, (const char *)(panels) + p_ * (pb),                          \
                     (const char *)(tiles) + ti_ * tb_, (y) + ti_ * (TR) * (ldy) + 16 * p_, ldy,   \
                     kern_mask16((n_rows)-16 * p_));                                               \
        }                                                                                          \
    } while (0)
/* MICRO(nb, panel, tile, y, ldy, na, mask): the per-call K-family kernels. */
#define KAVX512_CALL_NA(MICRO, na, nb, p, t, y, ldy, mask) MICRO(nb, p, t, y, ldy, na, mask)
/* MICRO(NA, nb, panel, tile, y, ldy, mask) with NA = na as a constant 1..QT,
 * so that its per-row arrays stay in registers: the repacked Q5_0, IQ4_NL,
 * Q4_1, Q5_1 and MXFP4 kernels, on Q-family tiles. */
#define KAVX512_CALL_QT(MICRO, na, nb, p, t, y, ldy, mask)                                         \
    do {                                                                                           \
        const char *p_q = (p), *t_q = (t);                                                         \
        float *y_q = (y);                                                                          \
        const __mmask16 m_q = (mask);                                                              \
        switch (na) {                                                                              \
        case 1: MICRO(1, nb, p_q, t_q, y_q, ldy, m_q); break;                                      \
        case 2: MICRO(2, nb, p_q, t_q, y_q, ldy, m_q); break;                                      \
        case 3: MICRO(3, nb, p_q, t_q, y_q, ldy, m_q); break;                                      \
        case 4: MICRO(4, nb, p_q, t_q, y_q, ldy, m_q); break;                                      \
        case 5: MICRO(5, nb, p_q, t_q, y_q, ldy, m_q); break;                                      \
        default: MICRO(QT, nb, p_q, t_q, y_q, ldy, m_q); break;                                    \
        }                                                                                          \
    } while (0)
/* The kernel of such a repacked Q-family layout. */
#define KAVX512_Q_PANEL_LOOP(MICRO, k, panels, pb, n_rows, tiles, m, y, ldy)                       \
    KAVX512_PANEL_LOOP(QT, QK8_0, kavx512_q_tile_bytes, KAVX512_CALL_QT, MICRO, k, panels, pb,     \
                       n_rows, tiles, m, y, ldy)

/* Decode (one activation row) of such a layout with a two-panel micro-kernel
 * (repack32_avx512.c, repack_mxfp4_avx512.c): panels p and p + half
 * together, two streams, through PAIR(nb, p0, p1, tile, y0, y1, mask0,
 * mask1), an odd last one alone through MICRO(1, nb, panel, tile, y, ldy, mask). */
#define KAVX512_Q_DECODE_PAIRS(PAIR, MICRO, k, panels, pb, n_rows, tiles, y, ldy)                  \
    do {                                                                                           \
        const int64_t nb_ = (k) / QK8_0;                                                           \
        const int np_ = ((n_rows) + 15) / 16, half_ = np_ / 2;                                     \
        const char *P_ = (const char *)(panels);                                                   \
        for (int p_ = 0; p_ < half_; p_++)                                                         \
            PAIR(nb_, P_ + p_ * (pb), P_ + (p_ + half_) * (pb), (const char *)(tiles),             \
                 (y) + 16 * p_, (y) + 16 * (p_ + half_), kern_mask16((n_rows)-16 * p_),            \
                 kern_mask16((n_rows)-16 * (p_ + half_)));                                         \
        if (np_ % 2)                                                                               \
            MICRO(1, nb_, P_ + (np_ - 1) * (pb), (const char *)(tiles), (y) + 16 * (np_ - 1), ldy, \
                  kern_mask16((n_rows)-16 * (np_ - 1)));                                           \
    } while (0)

/* Group g of a block of a repacked nibble panel (repack32_avx512.c,
 * repack_mxfp4_avx512.c) against the NA rows of a Q-family tile block at t:
 * i[a] += the dpbusd of lo (elements 4g..4g+3 of the 16 rows, unsigned
 * bytes) with row a's activations 4g.. and of hi (elements 16+4g..) with its
 * 16+4g..; then the float step f[a] = fma(d * dy[a], i[a], f[a]). (Macros:
 * as inline functions the compiler allocates the kernels' registers
 * differently.) */
#define KAVX512_Q_NIB_DOTS(NA, i, lo, hi, t, g)                                                    \
    UNROLL(6)                                                                                      \
    for (int a_ = 0; a_ < (NA); a_++) {                                                            \
        const __m512i xl_ = _mm512_set1_epi32(*(const int32_t *)((t) + QK8_0 * a_ + 4 * (g)));     \
        const __m512i xh_ =                                                                        \
            _mm512_set1_epi32(*(const int32_t *)((t) + QK8_0 * a_ + 16 + 4 * (g)));                \
        (i)[a_] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32((i)[a_], lo, xl_), hi, xh_);             \
    }
#define KAVX512_Q_FSTEP(NA, f, d, dy, i)                                                           \
    UNROLL(6)                                                                                      \
    for (int a_ = 0; a_ < (NA); a_++)                                                              \
    (f)[a_] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps((dy)[a_])),                          \
                              _mm512_cvtepi32_ps((i)[a_]), (f)[a_])

/* The kern_gemm_ops.kernel of a Q-family layout, with or without min as in
 * kavx512_q_micro (an entry per value: KAVX512_KERNEL_ENTRY): the tiles of
 * QT activation rows one after another, each against the panels two at a
 * time (32 weight rows) and an odd last one alone. */
T_512_INLINE void kavx512_q_kernel(bool min, int64_t k, const void *panels, size_t pb, int n_rows,
                                   const void *tiles, int64_t m, float *y, size_t ldy) {
    const int64_t nb = k / QK8_0;
    const int np = (n_rows + 15) / 16;
    const size_t tb = kavx512_q_tile_bytes(k);
    for (int64_t t = 0; t * QT < m; t++) {
        const int na = m - t * QT < QT ? (int)(m - t * QT) : QT;
        const char *tile = (const char *)tiles + t * tb;
        float *yt = y + t * QT * ldy;
        int p = 0;
        for (; p + 2 <= np; p += 2)
            kavx512_q_micro(min, nb, (const char *)panels + p * pb,
                            (const char *)panels + (p + 1) * pb, true, tile, yt + 16 * p, ldy, na,
                            kern_mask16(n_rows - 16 * p), kern_mask16(n_rows - 16 * (p + 1)));
        if (p < np)
            kavx512_q_micro(min, nb, (const char *)panels + p * pb, NULL, false, tile, yt + 16 * p,
                            ldy, na, kern_mask16(n_rows - 16 * p), 0);
    }
}

/* K family (Q4_K, Q6_K weights) activation tile of KT rows, per 256-element
 * super-block: KT units of a blk_q8_K followed by S[8] int16,
 * S[j] = bsums[2j] + bsums[2j+1] (the sums of Q4_K's 32-value sub-blocks). */
#define KT      8
#define KT_UNIT (sizeof(blk_q8_K) + 16)
/* byte offsets inside a unit */
#define KQ_D     offsetof(blk_q8_K, d)
#define KQ_QS    offsetof(blk_q8_K, qs)
#define KQ_BSUMS offsetof(blk_q8_K, bsums)
#define KQ_S     sizeof(blk_q8_K)
size_t kavx512_k_tile_bytes(int64_t k);
/* kern_gemm_ops.prepare of every K-family type (one function, so that
 * kern_repacked_share_input holds across them) */
void kavx512_k_prepare(const float *x, void *tile, int slot, int rows, int64_t k);

/* The kern_gemm_ops of a K-family type packed per call: KT-row Q8_K tiles
 * (kavx512_k_prepare), packed from MIN_M activation rows on. */
#define KAVX512_K_GEMM_OPS(MIN_M, PANEL_BYTES, PACK, KERNEL)                                       \
    { KT, MIN_M, kavx512_k_tile_bytes, kavx512_k_prepare, PANEL_BYTES, PACK, KERNEL }

/* A super-block of a per-call packed K-family panel of ng groups (8 of 32
 * values: the Q4_K layout; 16 of 16: the Q6_K one): 64 vectors of unsigned
 * values in element order, ng vectors of int32 group scales at KPC_SC, ng / 2
 * of int16 pairs at KPC_PAIRS (bias factors or mins, against the tile's sums
 * of the groups), the float d at KPC_D and, for types with mins, the float
 * dmin 64 bytes on: KPC_PB bytes in all. */
#define KPC_SC           4096
#define KPC_PAIRS(ng)    (KPC_SC + 64 * (ng))
#define KPC_D(ng)        (KPC_PAIRS(ng) + 32 * (ng))
#define KPC_PB(ng, mins) (KPC_D(ng) + 64 + ((mins) ? 64 : 0))

/* The kernels of the per-call packed Q4_K panel (groups of 32) and Q6_K panel
 * (groups of 16), gemm_avx512.c; gemm_kx_avx512.c packs Q5_K into the first
 * and Q3_K and IQ4_XS into the second. */
void kavx512_k_g32_kernel(int64_t k, const void *panels, size_t pb, int n_rows, const void *tiles,
                          int64_t m, float *y, size_t ldy);
void kavx512_k_g16_kernel(int64_t k, const void *panels, size_t pb, int n_rows, const void *tiles,
                          int64_t m, float *y, size_t ldy);

/* The dword at byte offset `at` of row a's unit of the tile super-block at
 * A, in all 16 lanes. */
#define KAVX512_ABC(A, a, at) _mm512_set1_epi32(*(const int32_t *)((A) + (a)*KT_UNIT + (at)))

/* The groups of one super-block of a per-call packed K-family panel
 * (gemm_avx512.c, gemm_kx_avx512.c: 64 vectors of unsigned values, then int32
 * scales per group at KPC_SC), G vectors a group (8: Q4_K's groups of 32, 4:
 * Q6_K's of 16), against the KT rows of a tile super-block at A:
 * sumi[a] += sc_g * dot_g. */
T_512_INLINE void kavx512_k_group_dots(int G, const char *P, const char *A, __m512i *sumi) {
    __m512i acc[KT];
    for (int g = 0; g < 64 / G; g++) {
        UNROLL(8)
        for (int a = 0; a < KT; a++) acc[a] = _mm512_setzero_si512();
        UNROLL(8)
        for (int q = 0; q < G; q++) {
            const __m512i u = _mm512_loadu_si512(P + 64 * (G * g + q));
            UNROLL(8)
            for (int a = 0; a < KT; a++)
                acc[a] =
                    _mm512_dpbusd_epi32(acc[a], u, KAVX512_ABC(A, a, KQ_QS + 4 * G * g + 4 * q));
        }
        const __m512i sc = _mm512_loadu_si512(P + KPC_SC + 64 * g);
        UNROLL(8)
        for (int a = 0; a < KT; a++)
            sumi[a] = _mm512_add_epi32(sumi[a], _mm512_mullo_epi32(acc[a], sc));
    }
}

/* The first na (<= KT) rows of a per-call packed K-family micro-kernel to y,
 * columns under mask. */
T_512_INLINE void kavx512_k_pc_store(const __m512 *f, float *y, size_t ldy, int na,
                                     __mmask16 mask) {
    UNROLL(8)
    for (int a = 0; a < KT; a++)
        if (a < na) _mm512_mask_storeu_ps(y + a * ldy, mask, f[a]);
}

/* The float steps of vec_dot for one super-block of a per-call packed Q4_K or
 * Q2_K panel (fp32 d and dmin of the 16 rows at pd, pdmin): f[a] +=
 * d * yd * sumi[a], then -= dmin * yd * summ[a], for all KT tile rows. */
T_512_INLINE void kavx512_k_pc_fstep_min(const char *pd, const char *pdmin, const char *A,
                                         const __m512i *sumi, const __m512i *summ, __m512 *f) {
    const __m512 d = _mm512_loadu_ps(pd), dmin = _mm512_loadu_ps(pdmin);
    UNROLL(8)
    for (int a = 0; a < KT; a++) {
        const __m512 yd = _mm512_set1_ps(*(const float *)(A + a * KT_UNIT + KQ_D));
        f[a] = _mm512_fmadd_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(sumi[a]), f[a]);
        f[a] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, yd), _mm512_cvtepi32_ps(summ[a]), f[a]);
    }
}

/* acc[a] += the products of the ng / 2 vectors of int16 pairs of a per-call
 * packed K-family panel's super-block at P with the tile's sums of the
 * groups' activations (S[] of 32 for 8 groups, bsums[] of 16 for 16), for
 * all KT rows of the tile super-block at A. */
T_512_INLINE void kavx512_k_pc_pairs(int ng, const char *P, const char *A, __m512i *acc) {
    const size_t sums = ng == 8 ? KQ_S : KQ_BSUMS;
    UNROLL(8)
    for (int t = 0; t < ng / 2; t++) {
        const __m512i sp = _mm512_loadu_si512(P + KPC_PAIRS(ng) + 64 * t);
        UNROLL(8)
        for (int a = 0; a < KT; a++)
            acc[a] = _mm512_dpwssd_epi32(acc[a], sp, KAVX512_ABC(A, a, sums + 4 * t));
    }
}

/* A per-call packed K-family panel of ng groups x the KT rows of a tile,
 * all nsb super-blocks (KPC_PB(ng, mins) bytes each). The pairs' products:
 * with mins (Q4_K, Q5_K, Q2_K) the mins against the tile's sums, summ =
 * sum_g m_g * sum_g, and the float steps of kavx512_k_pc_fstep_min; without
 * (Q6_K, Q3_K, IQ4_XS) the bias folded into sumi, f = fma(d * yd, sumi, f). */
T_512_INLINE void kavx512_k_pc_micro(int ng, bool mins, int64_t nsb, const char *P, const char *A,
                                     float *y, size_t ldy, int na, __mmask16 mask) {
    __m512 f[KT];
    UNROLL(8)
    for (int a = 0; a < KT; a++) f[a] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, P += KPC_PB(ng, mins), A += KT * KT_UNIT) {
        __m512i sumi[KT], summ[KT];
        UNROLL(8)
        for (int a = 0; a < KT; a++) sumi[a] = summ[a] = _mm512_setzero_si512();
        /* (Q4_K's pairs after its groups, the others' before: the order each
         * kernel was tuned in; the sums are exact either way) */
        if (ng == 16) kavx512_k_pc_pairs(ng, P, A, mins ? summ : sumi);
        kavx512_k_group_dots(64 / ng, P, A, sumi);
        if (ng == 8) kavx512_k_pc_pairs(ng, P, A, summ);
        if (mins) {
            kavx512_k_pc_fstep_min(P + KPC_D(ng), P + KPC_D(ng) + 64, A, sumi, summ, f);
        } else {
            const __m512 d = _mm512_loadu_ps(P + KPC_D(ng));
            UNROLL(8)
            for (int a = 0; a < KT; a++) {
                const __m512 yd = _mm512_set1_ps(*(const float *)(A + a * KT_UNIT + KQ_D));
                f[a] = _mm512_fmadd_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(sumi[a]), f[a]);
            }
        }
    }
    kavx512_k_pc_store(f, y, ldy, na, mask);
}

/* NAME, the kern_gemm_ops.kernel of a per-call packed K-family layout: the
 * tiles of KT activation rows one after another, each against every panel
 * through MICRO(nsb, panel, tile, y, ldy, na, mask); LINKAGE static or
 * extern. */
#define KAVX512_K_KERNEL(LINKAGE, NAME, MICRO)                                                     \
    LINKAGE T_512 void NAME(int64_t k, const void *panels, size_t pb, int n_rows,                  \
                            const void *tiles, int64_t m, float *y, size_t ldy) {                  \
        KAVX512_PANEL_LOOP(KT, QK_K, kavx512_k_tile_bytes, KAVX512_CALL_NA, MICRO, k, panels, pb,  \
                           n_rows, tiles, m, y, ldy);                                              \
    }

/* NAME, the kernel entry point of one weight kind (kern_gemm_ops or
 * kern_repack_ops .kernel): calls the always-inlined GENERIC with its KIND
 * constant, so every kind gets its own specialised copy. */
#define KAVX512_KERNEL_ENTRY(NAME, GENERIC, KIND)                                                  \
    T_512 static void NAME(int64_t k, const void *w, size_t wb, int n_rows, const void *tiles,     \
                           int64_t m, float *y, size_t ldy) {                                      \
        GENERIC(KIND, k, w, wb, n_rows, tiles, m, y, ldy);                                         \
    }

/* ---- shared by the repacked K-family kernels (repack_k_avx512.c,
 * repack_kx_avx512.c) ---- */

/* The dword at p, in all 16 lanes (one broadcast load). */
T_512_INLINE __m512i bc32(const char *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
T_512_INLINE __m512 bcf(const char *p) {
    float v;
    memcpy(&v, p, 4);
    return _mm512_set1_ps(v);
}
T_512_INLINE __m256i ld256(const char *p) { return _mm256_loadu_si256((const __m256i *)p); }
T_512_INLINE __m128i ld128(const char *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Lines l0 .. l1 - 1 of the super-block `dist` ahead of P (sb bytes each), into L2. */
T_512_INLINE void pf_lines(const char *P, size_t sb, int dist, int l0, int l1) {
    for (int l = l0; l < l1 && 64 * (size_t)l < sb; l++)
        _mm_prefetch(P + dist * sb + 64 * (size_t)l, _MM_HINT_T1);
}

/* The micro-kernels' common steps, for rows 0..NA-1 of the tile
 * super-block at A (row a's unit at A + a * KT_UNIT). */

/* -(sums << shift) into nb[a][j]: with g16 the bsums[16] of the groups of
 * 16, else the S[8] of the groups of 32 (the rest of the row is zero). */
T_512_INLINE void kavx512_k_neg_sums(int NA, bool g16, int shift, const char *A,
                                     int32_t (*nb)[16]) {
    UNROLL(8)
    for (int a = 0; a < NA; a++) {
        const __m512i b = g16 ? _mm512_cvtepi16_epi32(ld256(A + (size_t)a * KT_UNIT + KQ_BSUMS))
                              : _mm512_zextsi256_si512(
                                    _mm256_cvtepi16_epi32(ld128(A + (size_t)a * KT_UNIT + KQ_S)));
        _mm512_store_si512(nb[a],
                           _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(b, shift)));
    }
}

/* mm[a] = sum_j min_j S_j from the panel's 8 mins of 16 rows at mn (two
 * sub-blocks per vpdpwssd): Q4_K, Q5_K. */
T_512_INLINE void kavx512_k_min_sums(int NA, const char *mn, const char *A, __m512i *mm) {
    UNROLL(8)
    for (int a = 0; a < NA; a++) mm[a] = _mm512_setzero_si512();
    UNROLL(4)
    for (int t = 0; t < 4; t++) {
        const __m512i mp = _mm512_cvtepu8_epi16(ld256(mn + 32 * t));
        UNROLL(8)
        for (int a = 0; a < NA; a++)
            mm[a] = _mm512_dpwssd_epi32(mm[a], mp, bc32(A + (size_t)a * KT_UNIT + KQ_S + 4 * t));
    }
}

/* f[a] += d * d_a * sumi[a], d the panel's 16 fp16 scales at pd. */
T_512_INLINE void kavx512_k_fstep(int NA, const char *pd, const char *A, const __m512i *sumi,
                                  __m512 *f) {
    const __m512 d = _mm512_cvtph_ps(ld256(pd));
    UNROLL(8)
    for (int a = 0; a < NA; a++)
        f[a] = _mm512_fmadd_ps(_mm512_mul_ps(d, bcf(A + (size_t)a * KT_UNIT + KQ_D)),
                               _mm512_cvtepi32_ps(sumi[a]), f[a]);
}

/* f[a] += d * d_a * sumi[a] - dmin * d_a * summ[a] (types with mins), with
 * sumi[a] = si[a] >> si_shift (a constant: Q4_K sums 16 sumi). */
T_512_INLINE void kavx512_k_fstep_min(int NA, const char *pd, const char *pdmin, const char *A,
                                      const __m512i *si, int si_shift, const __m512i *summ,
                                      __m512 *f) {
    const __m512 d = _mm512_cvtph_ps(ld256(pd)), dmin = _mm512_cvtph_ps(ld256(pdmin));
    UNROLL(8)
    for (int a = 0; a < NA; a++) {
        const __m512 yd = bcf(A + (size_t)a * KT_UNIT + KQ_D);
        const __m512i sumi = si_shift ? _mm512_srai_epi32(si[a], si_shift) : si[a];
        f[a] = _mm512_fmadd_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(sumi), f[a]);
        f[a] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, yd), _mm512_cvtepi32_ps(summ[a]), f[a]);
    }
}

/* The 16 columns (mask: those that exist) of rows 0..NA-1 to y. */
T_512_INLINE void kavx512_k_store(int NA, const __m512 *f, float *y, size_t ldy, __mmask16 mask) {
    UNROLL(8)
    for (int a = 0; a < NA; a++) _mm512_mask_storeu_ps(y + a * ldy, mask, f[a]);
}

/* The first 320 bytes of a repacked super-block of a type with 8 sub-blocks
 * of 32, 8 mins and a d and dmin per row (Q4_K, Q5_K): scales, u8 [8
 * sub-blocks][16 rows]; mins, u8 [4 pairs t][16 rows][2] (widened to int16,
 * lane r is the pair (min 2t, min 2t+1) for vpdpwssd against the tile's S[]);
 * d, fp16 [16]; dmin, fp16 [16]. */
#define KR_SC   0
#define KR_MN   128
#define KR_D    256
#define KR_DMIN 288

/* The layout of a repacked K-family panel (repack_k_avx512.c,
 * repack_kx_avx512.c), the one place its numbers are written: byte offsets in
 * a super-block of the int8 scales, the fp16 d and dmin (0 for the types
 * without) and the values; the super-block's bytes, a whole number of cache
 * lines; and how many super-blocks ahead batched products prefetch into L2
 * (about 7 KiB, see KAVX512_R_KERNEL). Read as constants: the kernels fold
 * them. */
typedef struct {
    int sc, d, dmin, qs;
    int sb;
    int pf_dist;
} kavx512_r_layout;

/* NAME(NA, fused, pf, nsb, P, A, y, ldy, mask): one panel x NA activation
 * rows, all nsb super-blocks, of such a type, laid out as L (a
 * kavx512_r_layout). SUBS(NA, h0, h1, c, P, A, s) adds sub-blocks 2c + h,
 * h0 <= h < h1, times their scales into s[a]; fused: both of a step at once,
 * else one at a time. pf: prefetch PF_STEP lines per step, L.pf_dist
 * super-blocks ahead; sumi = s >> SHIFT. (A macro: as a function taking SUBS
 * the compiler schedules the result differently.) */
#define KAVX512_K_MINS_MICRO(NAME, SUBS, L, PF_STEP, SHIFT)                                        \
    T_512_INLINE void NAME(int NA, bool fused, bool pf, int64_t nsb, const char *P, const char *A, \
                           float *y, size_t ldy, __mmask16 mask) {                                 \
        __m512 f[KT];                                                                              \
        UNROLL(8)                                                                                  \
        for (int a = 0; a < NA; a++) f[a] = _mm512_setzero_ps();                                   \
        for (int64_t sb = 0; sb < nsb; sb++, P += (L).sb, A += KT * KT_UNIT) {                     \
            __m512i s[KT], mm[KT];                                                                 \
            UNROLL(8)                                                                              \
            for (int a = 0; a < NA; a++) s[a] = _mm512_setzero_si512();                            \
            for (int c = 0; c < 4; c++) {                                                          \
                if (pf) pf_lines(P, (L).sb, (L).pf_dist, PF_STEP *c, PF_STEP *c + PF_STEP);        \
                if (fused) {                                                                       \
                    SUBS(NA, 0, 2, c, P, A, s);                                                    \
                } else {                                                                           \
                    SUBS(NA, 0, 1, c, P, A, s);                                                    \
                    SUBS(NA, 1, 2, c, P, A, s);                                                    \
                }                                                                                  \
            }                                                                                      \
            kavx512_k_min_sums(NA, P + KR_MN, A, mm);                                              \
            kavx512_k_fstep_min(NA, P + (L).d, P + (L).dmin, A, s, SHIFT, mm, f);                  \
        }                                                                                          \
        kavx512_k_store(NA, f, y, ldy, mask);                                                      \
    }

/* One group g of 16 values of such a type (Q6_K, Q3_K), its 4 vectors u[0..3]
 * (elements 16g + 4c .. of the 16 rows, unsigned bytes) and its int8 scales
 * at sc16 + 16g: per row, acc = nb[a][g] + the dot with the activations,
 * sumi[a] += sc_g * acc. */
T_512_INLINE void kavx512_k_bias_group(int NA, int g, const __m512i *u, const char *sc16,
                                       const char *A, int32_t (*nb)[16], __m512i *sumi) {
    const __m512i sc = _mm512_cvtepi8_epi32(ld128(sc16 + 16 * g));
    UNROLL(8)
    for (int a = 0; a < NA; a++) {
        __m512i acc = _mm512_set1_epi32(nb[a][g]);
        UNROLL(4)
        for (int c = 0; c < 4; c++)
            acc = _mm512_dpbusd_epi32(acc, u[c],
                                      bc32(A + (size_t)a * KT_UNIT + KQ_QS + 16 * g + 4 * c));
        sumi[a] = _mm512_add_epi32(sumi[a], _mm512_mullo_epi32(acc, sc));
    }
}

/* NAME(NA, pf, nsb, P, A, y, ldy, mask): one panel x NA activation rows, all
 * nsb super-blocks, of a type whose values are stored biased to be unsigned
 * for vpdpbusd (Q6_K q + 32, Q3_K q + 4, IQ4_XS level + 128). Each group's
 * accumulator starts at -(bias x the sum of its activations), one broadcast
 * load from a small table (kavx512_k_neg_sums(G16, SHIFT): no multiply, the
 * dpbusd port is the bottleneck, and vpmulld, vpdpwssd and the FMAs take it
 * too), written a super-block ahead so that the loads never wait for the
 * stores. STEPS(NA, pf, P, A, nb, sumi) adds the super-block's groups, from
 * their accumulators' starts nb[a][g], times their scales into sumi[a]; the
 * panel is laid out as L, its fp16 d at L.d. (A macro, as
 * KAVX512_K_MINS_MICRO.) */
#define KAVX512_K_BIAS_MICRO(NAME, STEPS, L, G16, SHIFT)                                           \
    T_512_INLINE void NAME(int NA, bool pf, int64_t nsb, const char *P, const char *A, float *y,   \
                           size_t ldy, __mmask16 mask) {                                           \
        __m512 f[KT];                                                                              \
        UNROLL(8)                                                                                  \
        for (int a = 0; a < NA; a++) f[a] = _mm512_setzero_ps();                                   \
        _Alignas(64) int32_t nbuf[2][KT][16];                                                      \
        kavx512_k_neg_sums(NA, G16, SHIFT, A, nbuf[0]);                                            \
        for (int64_t sb = 0; sb < nsb; sb++, P += (L).sb, A += KT * KT_UNIT) {                     \
            if (sb + 1 < nsb)                                                                      \
                kavx512_k_neg_sums(NA, G16, SHIFT, A + KT * KT_UNIT, nbuf[(sb + 1) & 1]);          \
            /* read back as broadcasts, not taken apart in registers */                            \
            __asm__ volatile("" ::: "memory");                                                     \
            __m512i sumi[KT];                                                                      \
            UNROLL(8)                                                                              \
            for (int a = 0; a < NA; a++) sumi[a] = _mm512_setzero_si512();                         \
            STEPS(NA, pf, P, A, nbuf[sb & 1], sumi);                                               \
            kavx512_k_fstep(NA, P + (L).d, A, sumi, f);                                            \
        }                                                                                          \
        kavx512_k_store(NA, f, y, ldy, mask);                                                      \
    }

/* Row r's part of nv panel vectors at dst (64 bytes each): lane r of vector
 * v = the dword v of src (the packers of gemm_kx_avx512.c, repack_k_avx512.c,
 * repack_kx_avx512.c). */
static inline __attribute__((always_inline)) void kavx512_put_lanes(char *dst, int r,
                                                                    const uint8_t *src, int nv) {
    for (int v = 0; v < nv; v++) memcpy(dst + 64 * v + 4 * r, src + 4 * v, 4);
}

/* Row r's part of the first 320 bytes (KR_SC ..) of the super-block o of a
 * repacked Q4_K or Q5_K panel, from its GGUF block's scales[12]
 * (kern_q4k_scale_min), d and dmin. */
static inline __attribute__((always_inline)) void
kavx512_put_mins_head(char *o, int r, const uint8_t *scales, kvl_f16 d, kvl_f16 dmin) {
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        kern_q4k_scale_min(j, scales, &sc, &mn);
        o[KR_SC + 16 * j + r] = (char)sc;
        o[KR_MN + 32 * (j / 2) + 2 * r + j % 2] = (char)mn;
    }
    memcpy(o + KR_D + 2 * r, &d, 2);
    memcpy(o + KR_DMIN + 2 * r, &dmin, 2);
}

/* PFX_panel_bytes and PFX_pack, the kern_repack_ops.panel_bytes and .pack of
 * a repacked K-family layout L (repack_k_avx512.c, repack_kx_avx512.c): the
 * panel zeroed (rows past `rows` read as 0), then PUT(o, r, x) for each
 * super-block o of the panel and row r's block x there (BLK). Scalar code,
 * run when a model loads. */
#define KAVX512_R_PACK(PFX, BLK, L, PUT)                                                           \
    static size_t PFX##_panel_bytes(int64_t k) { return (size_t)(k / QK_K) * (L).sb; }             \
    static void PFX##_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {         \
        const int64_t nsb = k / QK_K;                                                              \
        memset(panel, 0, (size_t)nsb *(L).sb);                                                     \
        for (int64_t sb = 0; sb < nsb; sb++) {                                                     \
            char *o = (char *)panel + sb * (L).sb;                                                 \
            for (int r = 0; r < rows; r++)                                                         \
                PUT(o, r, (const BLK *)((const char *)w + (size_t)r * wrow) + sb);                 \
        }                                                                                          \
    }

/* One panel against the active rows of one tile: one instantiation per
 * count of rows. */
#define KAVX512_R_PASS(name, CALL)                                                                 \
    T_512_INLINE void name(int na, bool pf, int64_t nsb, const char *P, const char *tile,          \
                           float *yt, size_t ldy, __mmask16 mask) {                                \
        switch (na) {                                                                              \
        case 1: CALL(1); break;                                                                    \
        case 2: CALL(2); break;                                                                    \
        case 3: CALL(3); break;                                                                    \
        case 4: CALL(4); break;                                                                    \
        case 5: CALL(5); break;                                                                    \
        case 6: CALL(6); break;                                                                    \
        case 7: CALL(7); break;                                                                    \
        default: CALL(KT); break;                                                                  \
        }                                                                                          \
    }
/* The panels one at a time: decode then reads one sequential stream (two
 * neighbouring panels at once, two streams a panel apart, read markedly
 * slower from DRAM: 11-13 against 21-22 GB/s on one Zen 4 thread), and for
 * few rows the independent sub-blocks give the overlap.
 *
 * Left to itself the core fetched the weights only as the arithmetic reached
 * them, so memory and arithmetic took turns: with several rows (bench_kernels
 * BENCH_STREAM=1, one thread: m = 8 at 60% of its rate from L2), and in
 * decode too wherever unpacking the values costs more than Q4_K's nibbles.
 * So the pass that first meets a panel, decode's only one included,
 * prefetches the stream about 7 KiB ahead into L2, a few lines per step,
 * running on into the next panel (m = 4..16 +10-80%; into L1, or one
 * super-block ahead, gained less or lost). Decode with it, per token, the
 * two alternating in one process (llama-3.2-1b synth, 2 threads, 512 of
 * context): Q5_K_M -21%, Q2_K -12%, Q3_K_M -12%, Q4_K_M -6%, IQ4_XS -6%;
 * qwen3-30b-a3b Q2_K -11%, deepseek-v2-lite Q4_K_M -7% (bench/README.md).
 * The panels of a chunk are contiguous, and so are the chunks of a matrix;
 * a prefetch past the end never faults. */
#define KAVX512_R_KERNEL(name, PASS)                                                                 \
    T_512 static void name(int64_t k, const void *panels, size_t pb, int n_rows,                     \
                           const void *tiles, int64_t m, float *y, size_t ldy) {                     \
        const int64_t nsb = k / QK_K;                                                                \
        const int np = (n_rows + 15) / 16;                                                           \
        const size_t tb = kavx512_k_tile_bytes(k);                                                   \
        const int64_t ntiles = (m + KT - 1) / KT;                                                    \
        /* few tiles (batched decode): each panel meets every tile while in                        \
         * L1/L2; many (prefill): a tile meets every panel of the run, which                        \
         * stays in L2 */ \
        const bool panel_outer = ntiles <= 4;                                                        \
        for (int64_t outer = 0; outer < (panel_outer ? np : ntiles); outer++)                        \
            for (int64_t inner = 0; inner < (panel_outer ? ntiles : np); inner++) {                  \
                const int64_t ti = panel_outer ? inner : outer, p = panel_outer ? outer : inner;     \
                const int na = m - ti * KT < KT ? (int)(m - ti * KT) : KT;                           \
                PASS(na, ti == 0, nsb, (const char *)panels + p * pb,                                \
                     (const char *)tiles + ti * tb, y + ti * KT * ldy + 16 * p, ldy,                 \
                     kern_mask16(n_rows - 16 * (int)p));                                             \
            }                                                                                        \
    }

#endif
