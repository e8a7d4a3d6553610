/* kernels, private to the AVX-512 files: the activation tile layouts that gemm_avx512.c prepares (kern_gemm_ops.prepare)
 * and both its per-call packed kernels and the repacked ones
 * (repack_avx512.c, repack_k_avx512.c) read. */
#ifndef KVLLM_GEMM_AVX512_H
#define KVLLM_GEMM_AVX512_H

#include "simd.h"

#include <stddef.h>

/* Q family (Q8_0, Q4_0 weights) activation tile of QT rows, per 32-element
 * block: qs[QT][32] int8, d[QT] float (the fp16 scale widened), c[QT] int32
 * with c = -bias * sum(qs), bias 128 for Q8_0 weights (stored as x ^ 0x80,
 * unsigned) and 8 for Q4_0 (nibbles 0..15), so that a block's exact integer
 * dot is c + sum(unsigned weight * qs). Rows past m read as zeros. */
#define QT 6
#define QT_BLK (QT * (QK8_0 + 4 + 4))
size_t kavx512_q_tile_bytes(int64_t k);

/* K family (Q4_K, Q6_K weights) activation tile of KT rows, per 256-element
 * super-block: KT units of a blk_q8_K followed by S[8] int16,
 * S[j] = bsums[2j] + bsums[2j+1] (the sums of Q4_K's 32-value sub-blocks). */
#define KT 8
#define KT_UNIT (sizeof(blk_q8_K) + 16)
/* byte offsets inside a unit */
#define KQ_D offsetof(blk_q8_K, d)
#define KQ_QS offsetof(blk_q8_K, qs)
#define KQ_BSUMS offsetof(blk_q8_K, bsums)
#define KQ_S sizeof(blk_q8_K)
size_t kavx512_k_tile_bytes(int64_t k);

#endif
