/* kernels: repacked Q8_0 / Q4_0 weights for AVX-512 VNNI (kern_repack_ops).
 *
 * A panel holds 16 weight rows in the 16 dword lanes of a vector, the same
 * idea as the per-call panels of gemm_avx512.c, but compact, so that it can
 * replace the GGUF rows for good and decode reads no more bytes than before:
 *
 *   Q4_0, per block b: 4 vectors, lane r = GGUF bytes qs[4g..4g+3] of row r
 *         (low nibbles: elements 4g..4g+3, high: 16+4g..), widened in the
 *         kernel; Q8_0: 8 vectors, lane r = qs[4g..4g+3] ^ 0x80 (unsigned);
 *   blocks in pairs: the 16 fp16 scales of b and of b + 1 (64 bytes), then the
 *   values of b and of b + 1, so a panel is one stream of whole cache lines
 *   read front to back (scales after the values, read first, streamed ~5-12%
 *   slower in bench_kernels).
 *
 * Q4_0 takes 288 bytes per block and 16 rows, as in the file; Q8_0 544.
 *
 * One vpdpbusd against 4 broadcast activation bytes advances 16 outputs; a
 * block's exact integer sum per output needs no horizontal reduction, and the
 * float steps are the canonical ones (kern_impl.h: s = fma(dx * dy, isum, s),
 * blocks in order), lane by lane, so every output is bit-identical to vec_dot.
 * The micro kernel is instantiated for each count of active activation rows,
 * so decode (one row) does one row's work. */
#include "gemm_avx512.h"

#include <string.h>

/* bytes of one block of one panel: quantized values, then (elsewhere) scales */
#define RQ4_VALS  256
#define RQ8_VALS  512
#define RQ_SCALES 32
/* how far ahead decode prefetches each of its two streams */
#define RQ_DECODE_AHEAD 2048

static size_t rq_panel_bytes(int64_t k, size_t vals) {
    return (size_t)((k / QK8_0 + 1) / 2) * 2 * (vals + RQ_SCALES);
}
/* Byte offsets of block b's values and scales in a panel. */
static inline size_t rq_vals_at(int64_t b, size_t vals) {
    return (size_t)(b / 2) * 2 * (vals + RQ_SCALES) + 2 * RQ_SCALES + (size_t)(b % 2) * vals;
}
static inline size_t rq_scales_at(int64_t b, size_t vals) {
    (void)vals;
    return (size_t)(b / 2) * 2 * (vals + RQ_SCALES) + (size_t)(b % 2) * RQ_SCALES;
}
static size_t rq4_panel_bytes(int64_t k) { return rq_panel_bytes(k, RQ4_VALS); }
static size_t rq8_panel_bytes(int64_t k) { return rq_panel_bytes(k, RQ8_VALS); }

/* Dword at byte offset `at` of each of `rows` rows (wrow apart), zero past them. */
T_512_INLINE __m512i gather_rows(const char *base, size_t wrow, int rows, size_t at) {
    _Alignas(64) int32_t v[16] = {0};
    for (int r = 0; r < rows; r++) memcpy(&v[r], base + (size_t)r * wrow + at, 4);
    return _mm512_load_si512(v);
}

/* The fp16 scales of block b of each row, as 16 fp16 (zero past the rows). */
T_512_INLINE __m256i gather_scales(const char *base, size_t wrow, int rows) {
    _Alignas(32) uint16_t v[16] = {0};
    for (int r = 0; r < rows; r++) memcpy(&v[r], base + (size_t)r * wrow, 2);
    return _mm256_load_si256((const __m256i *)v);
}

T_512_INLINE void rq_pack(bool q4, const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    const int64_t nb = k / QK8_0;
    const size_t bb = q4 ? sizeof(blk_q4_0) : sizeof(blk_q8_0), vals = q4 ? RQ4_VALS : RQ8_VALS;
    const int ng = q4 ? 4 : 8;
    char *out = panel;
    /* an odd block count leaves the last pair half used: zeros, never read */
    memset((char *)panel + rq_panel_bytes(k, vals) - 2 * (vals + RQ_SCALES), 0,
           2 * (vals + RQ_SCALES));
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        const char *base = (const char *)w + b * bb;
        for (int g = 0; g < ng; g++) {
            __m512i v = gather_rows(base, wrow, rows, 2 + 4 * (size_t)g);
            if (!q4) v = _mm512_maskz_xor_epi32(kern_mask16(rows), v, flip);
            _mm512_storeu_si512(out + rq_vals_at(b, vals) + 64 * g, v);
        }
        _mm256_storeu_si256((__m256i *)(out + rq_scales_at(b, vals)),
                            gather_scales(base, wrow, rows));
    }
}

T_512 static void rq4_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    rq_pack(true, w, wrow, rows, k, panel);
}
T_512 static void rq8_pack(const void *w, size_t wrow, int rows, int64_t k, void *panel) {
    rq_pack(false, w, wrow, rows, k, panel);
}

/* 16 (or 32 with two) weight rows x NA activation rows of one tile, all blocks. */
T_512_INLINE void rq_micro(bool q4, int NA, int64_t nb, const char *p0, const char *p1, bool two,
                           const char *t, float *y, float *y1, size_t ldy, __mmask16 m0,
                           __mmask16 m1, const char *pf, bool dpf) {
    const size_t vals = q4 ? RQ4_VALS : RQ8_VALS;
    const char *const q0 = p0, *const q1 = p1;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const bool nta = kavx512_decode_nta;
    __m512 f0[QT], f1[QT];
    UNROLL(6)
    for (int a = 0; a < NA; a++) f0[a] = f1[a] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, t += QT_BLK) {
        p0 = q0 + rq_vals_at(b, vals), p1 = q1 + rq_vals_at(b, vals);
        if (pf) /* the next two panels, as much of them as this block takes of these two */
            for (size_t l = 0; l < 2 * (vals + RQ_SCALES); l += 64)
                _mm_prefetch(pf + (size_t)b * 2 * (vals + RQ_SCALES) + l, _MM_HINT_T1);
        if (dpf && b % 2 == 0) /* decode: each stream RQ_DECODE_AHEAD bytes ahead */
            for (size_t l = 0; l < 2 * (vals + RQ_SCALES); l += 64) {
                kavx512_decode_prefetch(q0 + rq_scales_at(b, vals) + RQ_DECODE_AHEAD + l, nta);
                if (two)
                    kavx512_decode_prefetch(q1 + rq_scales_at(b, vals) + RQ_DECODE_AHEAD + l, nta);
            }
        const int32_t *c = (const int32_t *)(t + QT * (QK8_0 + 4));
        /* With few activation rows the dpbusd chains are short of work to
         * overlap: split each block's sum over two accumulators (integers,
         * so the result is the same). */
        const int SPLIT = NA <= 2 ? 2 : 1;
        __m512i i0[2][QT], i1[2][QT];
        UNROLL(6)
        for (int a = 0; a < NA; a++) {
            i0[0][a] = i1[0][a] = _mm512_set1_epi32(c[a]);
            if (SPLIT > 1) i0[SPLIT - 1][a] = i1[SPLIT - 1][a] = _mm512_setzero_si512();
        }
        if (q4) {
            UNROLL(4)
            for (int g = 0; g < 4; g++) {
                const int h = g % SPLIT;
                const __m512i v0 = _mm512_loadu_si512(p0 + 64 * g);
                const __m512i v1 = two ? _mm512_loadu_si512(p1 + 64 * g) : v0;
                const __m512i lo0 = _mm512_and_si512(v0, m4),
                              hi0 = _mm512_and_si512(_mm512_srli_epi32(v0, 4), m4);
                const __m512i lo1 = _mm512_and_si512(v1, m4),
                              hi1 = _mm512_and_si512(_mm512_srli_epi32(v1, 4), m4);
                UNROLL(6)
                for (int a = 0; a < NA; a++) {
                    const __m512i xl = _mm512_set1_epi32(*(const int32_t *)(t + QK8_0 * a + 4 * g));
                    const __m512i xh =
                        _mm512_set1_epi32(*(const int32_t *)(t + QK8_0 * a + 16 + 4 * g));
                    i0[h][a] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i0[h][a], lo0, xl), hi0, xh);
                    if (two)
                        i1[h][a] =
                            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i1[h][a], lo1, xl), hi1, xh);
                }
            }
        } else {
            UNROLL(8)
            for (int g = 0; g < 8; g++) {
                const int h = g % SPLIT;
                const __m512i u0 = _mm512_loadu_si512(p0 + 64 * g);
                const __m512i u1 = two ? _mm512_loadu_si512(p1 + 64 * g) : u0;
                UNROLL(6)
                for (int a = 0; a < NA; a++) {
                    const __m512i x = _mm512_set1_epi32(*(const int32_t *)(t + QK8_0 * a + 4 * g));
                    i0[h][a] = _mm512_dpbusd_epi32(i0[h][a], u0, x);
                    if (two) i1[h][a] = _mm512_dpbusd_epi32(i1[h][a], u1, x);
                }
            }
        }
        if (SPLIT > 1) {
            UNROLL(6)
            for (int a = 0; a < NA; a++) {
                i0[0][a] = _mm512_add_epi32(i0[0][a], i0[SPLIT - 1][a]);
                if (two) i1[0][a] = _mm512_add_epi32(i1[0][a], i1[SPLIT - 1][a]);
            }
        }
        const float *dy = (const float *)(t + QT * QK8_0);
        const __m512 d0 =
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q0 + rq_scales_at(b, vals))));
        const __m512 d1 =
            two ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q1 + rq_scales_at(b, vals))))
                : d0;
        UNROLL(6)
        for (int a = 0; a < NA; a++) {
            const __m512 dd = _mm512_set1_ps(dy[a]);
            f0[a] = _mm512_fmadd_ps(_mm512_mul_ps(d0, dd), _mm512_cvtepi32_ps(i0[0][a]), f0[a]);
            if (two)
                f1[a] = _mm512_fmadd_ps(_mm512_mul_ps(d1, dd), _mm512_cvtepi32_ps(i1[0][a]), f1[a]);
        }
    }
    UNROLL(6)
    for (int a = 0; a < NA; a++) {
        _mm512_mask_storeu_ps(y + a * ldy, m0, f0[a]);
        if (two) _mm512_mask_storeu_ps(y1 + a * ldy, m1, f1[a]);
    }
}

/* One instantiation per (active rows, one or two panels). */
#define RQ_CASE(q4, na, two)                                                                       \
    case na:                                                                                       \
        rq_micro(q4, na, nb, p0, p1, two, tile, y, y1, ldy, m0, m1, pf, dpf);                      \
        break;
#define RQ_SWITCH(q4, two)                                                                         \
    switch (na) {                                                                                  \
        RQ_CASE(q4, 1, two)                                                                        \
        RQ_CASE(q4, 2, two)                                                                        \
        RQ_CASE(q4, 3, two)                                                                        \
        RQ_CASE(q4, 4, two)                                                                        \
        RQ_CASE(q4, 5, two)                                                                        \
    default: rq_micro(q4, QT, nb, p0, p1, two, tile, y, y1, ldy, m0, m1, pf, dpf); break;          \
    }

/* Panels p and pq (pq >= np: p alone) against tile ti. */
T_512_INLINE void rq_pass(bool q4, int64_t nb, const void *panels, size_t pb, int np, int n_rows,
                          const void *tiles, size_t tb, int64_t m, int64_t ti, int64_t p,
                          int64_t pq, float *yall, size_t ldy) {
    const int na = m - ti * QT < QT ? (int)(m - ti * QT) : QT;
    const char *tile = (const char *)tiles + ti * tb;
    const char *p0 = (const char *)panels + p * pb, *p1 = (const char *)panels + pq * pb;
    float *y = yall + ti * QT * ldy + 16 * p, *y1 = yall + ti * QT * ldy + 16 * pq;
    const __mmask16 m0 = kern_mask16(n_rows - 16 * (int)p), m1 = kern_mask16(n_rows - 16 * (int)pq);
    /* Several rows make the first pass over two panels compute-bound: it
     * fetches the next two itself, into L2, so memory works while the
     * arithmetic does (the hardware prefetchers run only a little ahead of
     * the demand). bench_kernels BENCH_STREAM=1: m = 4 about +40%, m = 16
     * +10%; into L1 instead, m = 4 gained nothing. */
    const char *pf = m > 2 && ti == 0 && pq == p + 1 && p + 3 < np ? p0 + 2 * pb : NULL;
    /* Decode's two streams (rq_kernel) each prefetch themselves
     * RQ_DECODE_AHEAD bytes ahead (kavx512_decode_prefetch; these figures are of
     * T1, into L2). Per matrix (bench_kernels from DRAM, the
     * two alternating call by call in one process, median of 400 pairs):
     * Q4_0 (4096 x 4096) -2 to -6% time on 2 threads, -13% on one; Q8_0,
     * against its earlier decode (neighbouring panels prefetching the next
     * two, as pf), -15% (4096 x 4096) and -20% (2048 x 1408, a DeepSeek
     * expert's down projection) on 2 threads, -21% on one. */
    const bool dpf = m <= 2;
    if (pq < np) {
        RQ_SWITCH(q4, true)
    } else {
        RQ_SWITCH(q4, false)
    }
}

/* Up to this many tiles (batched decode), each pair of panels meets every
 * tile while it is in L1/L2, and the stream of weights from memory runs on
 * behind the arithmetic; with more (prefill), a tile meets every panel of the
 * run, which kern_matmul_repacked sizes to stay in L2. */
#define RQ_PANEL_OUTER_TILES 4

T_512_INLINE void rq_kernel(bool q4, int64_t k, const void *panels, size_t pb, int n_rows,
                            const void *tiles, int64_t m, float *yall, size_t ldy) {
    const int64_t nb = k / QK8_0;
    const int np = (n_rows + 15) / 16;
    const size_t tb = kavx512_q_tile_bytes(k);
    const int64_t ntiles = (m + QT - 1) / QT;
    /* Two panels per pass. With many rows they are neighbours and share each
     * activation broadcast; for decode (one or two rows) they come from
     * the two halves of the run, so each thread reads two long streams at
     * once (more requests in flight than one stream gets). */
    if (m <= 2) {
        const int64_t half = (np + 1) / 2;
        for (int64_t p = 0; p < half; p++)
            rq_pass(q4, nb, panels, pb, np, n_rows, tiles, tb, m, 0, p, p + half, yall, ldy);
    } else if (ntiles <= RQ_PANEL_OUTER_TILES) {
        for (int64_t p = 0; p < np; p += 2)
            for (int64_t ti = 0; ti < ntiles; ti++)
                rq_pass(q4, nb, panels, pb, np, n_rows, tiles, tb, m, ti, p, p + 1, yall, ldy);
    } else {
        for (int64_t ti = 0; ti < ntiles; ti++)
            for (int64_t p = 0; p < np; p += 2)
                rq_pass(q4, nb, panels, pb, np, n_rows, tiles, tb, m, ti, p, p + 1, yall, ldy);
    }
}

KAVX512_KERNEL_ENTRY(rq4_kernel, rq_kernel, true)
KAVX512_KERNEL_ENTRY(rq8_kernel, rq_kernel, false)

const kern_repack_ops kavx512_repack_q4_0 = {rq4_panel_bytes, rq4_pack, rq4_kernel};
const kern_repack_ops kavx512_repack_q8_0 = {rq8_panel_bytes, rq8_pack, rq8_kernel};
