/* kernels, private to the AVX-512 files: the activation tile layouts that gemm_avx512.c prepares (kern_gemm_ops.prepare)
 * and both its per-call packed kernels and the repacked ones
 * (repack_avx512.c, repack_k_avx512.c) read. */
#ifndef KVLLM_GEMM_AVX512_H
#define KVLLM_GEMM_AVX512_H

#include "simd.h"

#include <stdbool.h>
#include <stddef.h>

/* Q family (Q8_0, Q4_0 weights) activation tile of QT rows, per 32-element
 * block: qs[QT][32] int8, d[QT] float (the fp16 scale widened), c[QT] int32
 * with c = -bias * sum(qs), bias 128 for Q8_0 weights (stored as x ^ 0x80,
 * unsigned) and 8 for Q4_0 (nibbles 0..15), so that a block's exact integer
 * dot is c + sum(unsigned weight * qs). Rows past m read as zeros. */
#define QT     6
#define QT_BLK (QT * (QK8_0 + 4 + 4))
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

/* NAME, the kernel entry point of one weight kind (kern_gemm_ops or
 * kern_repack_ops .kernel): calls the always-inlined GENERIC with its KIND
 * constant, so every kind gets its own specialised copy. */
#define KAVX512_KERNEL_ENTRY(NAME, GENERIC, KIND)                                                  \
    T_512 static void NAME(int64_t k, const void *w, size_t wb, int n_rows, const void *tiles,     \
                           int64_t m, float *y, size_t ldy) {                                      \
        GENERIC(KIND, k, w, wb, n_rows, tiles, m, y, ldy);                                         \
    }

#endif
