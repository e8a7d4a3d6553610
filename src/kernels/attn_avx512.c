/* kernels: attention kernels for AVX-512, bit-identical to attn.c.
 *
 * Scores: 16 (head, position) pairs at a time (8 heads x 2 positions where
 * there are 8 heads, else 4 x 4); each pair's 16 lane sums (lane d % 16 of
 * its dot product) are reduced together by a transpose-and-add whose tree per
 * pair is kern_reduce16's. P.V: 8 heads x 48 values or up to 4 heads x 64
 * values of the output stay in registers while the positions stream past.
 * The per-ISA twin of attn_avx2.c: the same loops at 16 lanes with masks
 * instead of 8 (the 8-head tiles are this file's own: each widened K or V
 * vector serves twice the fmas; bench_kernels attn, one thread, 2026-12-07:
 * qwen3's 8 x 128 12.28 -> 11.40 us a chunk of 256, MLA's 16 x 576 87.2 ->
 * 80.7). */
#include "simd.h"

/* 16 elements from d of a cache row of type t, widened (lanes outside m: 0). */
T_512_INLINE __m512 kv_load(int t, const void *row, int64_t d, __mmask16 m) {
    if (t == GGUF_DT_Q4_0 || t == GGUF_DT_Q5_0 || t == GGUF_DT_IQ4_NL) {
        /* 16 values of one 32-value block (d is a multiple of 16): level * d as to_float */
        const size_t bb = t == GGUF_DT_Q5_0 ? sizeof(blk_q5_0) : sizeof(blk_q4_0);
        const char *blk = (const char *)row + (size_t)(d / 32) * bb;
        const __m512 v =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(kv_block_levels(t, blk, (int)(d % 32))));
        return _mm512_maskz_mul_ps(m, v, _mm512_set1_ps(f16_load(*(const kvl_f16 *)blk)));
    }
    if (t == GGUF_DT_Q8_0) { /* 16 values of one block (d is a multiple of 16): q * d as to_float */
        const blk_q8_0 *b = (const blk_q8_0 *)row + d / QK8_0;
        const __m512 v =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b->qs + d % QK8_0)));
        return _mm512_maskz_mul_ps(m, v, _mm512_set1_ps(f16_load(b->d)));
    }
    return kern_load16_ps(t, row, d, m);
}

/* Lane d % 16 of dot(q, k) over dk values. */
T_512_INLINE __m512 dot_lanes(int t, const float *q, const void *k, int64_t dk) {
    __m512 acc = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= dk; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), kv_load(t, k, d, 0xFFFF), acc);
    if (d < dk) {
        const __mmask16 m = kern_mask16(dk - d);
        acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), kv_load(t, k, d, m), acc, m);
    }
    return acc;
}

/* Rows are head slices scattered over the paged cache: the hardware
 * prefetchers lose them at every block boundary, so fetch the rows ATTN_PF
 * ahead, into L2: with 16 rows into L1 the fetches came too late, and more
 * of them into L1 did not help (its few outstanding misses). 1B Q4_K_M
 * decode, in-process A/B: 31.8 -> 27.5 ms/token at 4,096 context, 42.7 ->
 * 35.7 at 8,192; bench_kernels astream 1 thread 8.3 -> 10.1-10.5 GB/s; in
 * cache (attn) the same. */
#define ATTN_PF 32
T_512_INLINE void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)row + o, _MM_HINT_T1);
}

/* Heads h0..h0+3 x positions j0..j0+3: each K row is loaded (and widened)
 * once for the 4 heads, and the 16 lane vectors reduce together; lane 4h + j of
 * the result is head h0+h at position j0+j. Per score the steps are those of
 * dot_lanes and kern_reduce16, as below. */
T_512_INLINE void scores_4x4(int t, int64_t nj, int64_t dk, const float *q, size_t qs,
                             const void *const *k, __m512 vs, float *s, size_t ss) {
    __m512 v[16];
    if (nj == 4) {
        /* the same fma chain per (head, position), 16 values of the 4 heads'
         * q loaded once for the 4 rows: 8 loads per 16 fmas instead of 20
         * (the loads, not the fmas, bounded it: MLA's 16 heads x 576) */
        UNROLL(16)
        for (int i = 0; i < 16; i++) v[i] = _mm512_setzero_ps();
        int64_t d = 0;
        for (; d + 16 <= dk; d += 16) {
            __m512 qv[4];
            UNROLL(4)
            for (int h = 0; h < 4; h++) qv[h] = _mm512_loadu_ps(q + h * qs + d);
            UNROLL(4)
            for (int j = 0; j < 4; j++) {
                const __m512 kv = kv_load(t, k[j], d, 0xFFFF);
                UNROLL(4)
                for (int h = 0; h < 4; h++) v[4 * h + j] = _mm512_fmadd_ps(qv[h], kv, v[4 * h + j]);
            }
        }
        if (d < dk) {
            const __mmask16 m = kern_mask16(dk - d);
            __m512 qv[4];
            UNROLL(4)
            for (int h = 0; h < 4; h++) qv[h] = _mm512_maskz_loadu_ps(m, q + h * qs + d);
            UNROLL(4)
            for (int j = 0; j < 4; j++) {
                const __m512 kv = kv_load(t, k[j], d, m);
                UNROLL(4)
                for (int h = 0; h < 4; h++)
                    v[4 * h + j] = _mm512_mask3_fmadd_ps(qv[h], kv, v[4 * h + j], m);
            }
        }
    } else UNROLL(4)
    for (int j = 0; j < 4; j++) {
        UNROLL(4)
        for (int h = 0; h < 4; h++) v[4 * h + j] = _mm512_setzero_ps();
        if (j >= nj) continue;
        const void *kj = k[j];
        int64_t d = 0;
        for (; d + 16 <= dk; d += 16) {
            const __m512 kv = kv_load(t, kj, d, 0xFFFF);
            UNROLL(4)
            for (int h = 0; h < 4; h++)
                v[4 * h + j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * qs + d), kv, v[4 * h + j]);
        }
        if (d < dk) {
            const __mmask16 m = kern_mask16(dk - d);
            const __m512 kv = kv_load(t, kj, d, m);
            UNROLL(4)
            for (int h = 0; h < 4; h++)
                v[4 * h + j] = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, q + h * qs + d), kv,
                                                     v[4 * h + j], m);
        }
    }
    /* reduce16x16 puts vector i in lane i: head h's 4 positions in quarter h */
    const __m512 r = _mm512_mul_ps(kern_reduce16x16_ps(v), vs);
    const __mmask16 m = kern_mask16(nj);
    _mm_mask_storeu_ps(s, (__mmask8)m, _mm512_castps512_ps128(r));
    _mm_mask_storeu_ps(s + ss, (__mmask8)m, _mm512_extractf32x4_ps(r, 1));
    _mm_mask_storeu_ps(s + 2 * ss, (__mmask8)m, _mm512_extractf32x4_ps(r, 2));
    _mm_mask_storeu_ps(s + 3 * ss, (__mmask8)m, _mm512_extractf32x4_ps(r, 3));
}

/* Heads h0..h0+7 x positions j0, j0+1 (nj of them): each K row is widened
 * once for 8 heads, half as often as in scores_4x4 (the widening, not the
 * fmas, bounded that tile: qwen3's 8 heads x 128, MLA's 16 x 576). Lane
 * 2h + j of the reduced vector is head h0+h at position j0+j. */
T_512_INLINE void scores_8x2(int t, int64_t nj, int64_t dk, const float *q, size_t qs,
                             const void *const *k, __m512 vs, float *s, size_t ss) {
    __m512 v[16];
    UNROLL(16)
    for (int i = 0; i < 16; i++) v[i] = _mm512_setzero_ps();
    const void *k1 = nj > 1 ? k[1] : k[0]; /* a lone position: its row twice, one kept */
    int64_t d = 0;
    for (; d + 16 <= dk; d += 16) {
        const __m512 k0v = kv_load(t, k[0], d, 0xFFFF), k1v = kv_load(t, k1, d, 0xFFFF);
        UNROLL(8)
        for (int h = 0; h < 8; h++) {
            const __m512 qv = _mm512_loadu_ps(q + h * qs + d);
            v[2 * h] = _mm512_fmadd_ps(qv, k0v, v[2 * h]);
            v[2 * h + 1] = _mm512_fmadd_ps(qv, k1v, v[2 * h + 1]);
        }
    }
    if (d < dk) {
        const __mmask16 m = kern_mask16(dk - d);
        const __m512 k0v = kv_load(t, k[0], d, m), k1v = kv_load(t, k1, d, m);
        UNROLL(8)
        for (int h = 0; h < 8; h++) {
            const __m512 qv = _mm512_maskz_loadu_ps(m, q + h * qs + d);
            v[2 * h] = _mm512_mask3_fmadd_ps(qv, k0v, v[2 * h], m);
            v[2 * h + 1] = _mm512_mask3_fmadd_ps(qv, k1v, v[2 * h + 1], m);
        }
    }
    const __m512 r = _mm512_mul_ps(kern_reduce16x16_ps(v), vs);
    if (nj == 2) {
        UNROLL(4)
        for (int c = 0; c < 4; c++) { /* quarter c: heads 2c, 2c+1 */
            const __m128 x = _mm512_extractf32x4_ps(r, c);
            _mm_storel_pi((__m64 *)(s + 2 * c * ss), x);
            _mm_storeh_pi((__m64 *)(s + (2 * c + 1) * ss), x);
        }
    } else {
        float tmp[16];
        _mm512_storeu_ps(tmp, r);
        UNROLL(8)
        for (int h = 0; h < 8; h++) s[h * ss] = tmp[2 * h];
    }
}

T_512_INLINE void scores_t(int t, int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                           const void *const *k, float scale, float *s, size_t ss) {
    const __m512 vs = _mm512_set1_ps(scale);
    const int64_t bytes = (int64_t)kern_row_bytes(t, dk);
    /* every 8 heads' tile on a pair of rows before the next pair: the rows
     * are read from L1 for all of them (MLA's 16 heads x 576: a second pass
     * over 256 rows read them from L2 at half the rate) */
    const int h8 = n_q / 8 * 8;
    if (h8)
        for (int64_t j0 = 0; j0 < n; j0 += 2) {
            /* the rows ATTN_PF ahead, two a tile: in bursts of 16 rows (288
             * lines of MLA's) the prefetches waited on each other and held
             * the arithmetic (DeepSeek-V2-Lite decode, 530 positions: MLA
             * attention 3.79-3.91 -> 3.49-3.50 ms a token) */
            for (int64_t j = j0 + ATTN_PF; j < j0 + ATTN_PF + 2 && j < n; j++)
                prefetch_row(k[j], bytes);
            for (int h0 = 0; h0 < h8; h0 += 8)
                scores_8x2(t, n - j0 < 2 ? n - j0 : 2, dk, q + h0 * qs, qs, k + j0, vs,
                           s + h0 * ss + j0, ss);
        }
    int h0 = h8;
    for (; h0 + 4 <= n_q; h0 += 4)
        for (int64_t j0 = 0; j0 < n; j0 += 4) {
            if (h0 == 0 && j0 % 16 == 0)
                for (int64_t j = j0 + ATTN_PF; j < j0 + ATTN_PF + 16 && j < n; j++)
                    prefetch_row(k[j], bytes);
            scores_4x4(t, n - j0 < 4 ? n - j0 : 4, dk, q + h0 * qs, qs, k + j0, vs,
                       s + h0 * ss + j0, ss);
        }
    for (int h = h0; h < n_q; h++) {
        const float *qh = q + h * qs;
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const int64_t nj = n - j0 < 16 ? n - j0 : 16;
            if (h == 0)
                for (int64_t j = j0 + ATTN_PF; j < j0 + ATTN_PF + 16 && j < n; j++)
                    prefetch_row(k[j], bytes);
            __m512 v[16];
            UNROLL(16)
            for (int j = 0; j < 16; j++)
                v[j] = j < nj ? dot_lanes(t, qh, k[j0 + j], dk) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(s + h * ss + j0, kern_mask16(nj),
                                  _mm512_mul_ps(kern_reduce16x16_ps(v), vs));
        }
    }
}

/* Head sizes up to 8 (stories260K's 8): 16 positions in the 16 lanes. The
 * K rows of 16 positions are transposed once for all n_q heads into
 * T[d] = (element d of each position), and a head's scores are then
 * p_d = fma(q[d], T[d], +0), which is lane d of dot_lanes' accumulator
 * (lanes d >= dk and 8..15 being +0), followed by kern_reduce16's tree on
 * those lanes: lane l + lane l+8 is p_l + 0, then
 * ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). The same float steps
 * per score as the general path, in 15 vector operations per head and 16
 * positions instead of about 50: stories260K, 5-token verify at context
 * 300, scores 57 -> ~20 us. */
static const float ZERO_ROW[8];

/* Rows r0 and r1 (dk <= 8 elements of type t), widened, in the two halves. */
T_512_INLINE __m512 kv_load2(int t, const void *r0, const void *r1, __mmask8 m) {
    if (t == GGUF_DT_F32)
        return _mm512_castpd_ps(_mm512_insertf64x4(
            _mm512_castps_pd(_mm512_castps256_ps512(_mm256_maskz_loadu_ps(m, r0))),
            _mm256_castps_pd(_mm256_maskz_loadu_ps(m, r1)), 1));
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_maskz_loadu_epi16(m, r0)),
                                              _mm_maskz_loadu_epi16(m, r1), 1);
    if (t == GGUF_DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* BF16 */
}

T_512_INLINE __m512 unpack_pd(__m512 a, __m512 b, bool hi) {
    const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
    return _mm512_castpd_ps(hi ? _mm512_unpackhi_pd(x, y) : _mm512_unpacklo_pd(x, y));
}

/* T[d] = element d of positions 0..15 (r[j]: position j's row), lane j. */
T_512_INLINE void transpose16x8(int t, const void *const *r, __mmask8 m, __m512 *T) {
    /* Slot 2i / 2i+1 = the low / high half of kv[i]; the network below puts
     * slot (0,2,4,6,1,3,5,7,8,10,12,14,9,11,13,15)[j] in lane j, so slot s
     * is loaded with position INV[s]. */
    static const int INV[16] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};
    __m512 kv[8], u[8], w[8];
    UNROLL(8)
    for (int i = 0; i < 8; i++) kv[i] = kv_load2(t, r[INV[2 * i]], r[INV[2 * i + 1]], m);
    UNROLL(4)
    for (int i = 0; i < 4; i++) { /* 32-bit interleave of slot pairs */
        u[2 * i] = _mm512_unpacklo_ps(kv[2 * i], kv[2 * i + 1]);
        u[2 * i + 1] = _mm512_unpackhi_ps(kv[2 * i], kv[2 * i + 1]);
    }
    UNROLL(2)
    for (int g = 0; g < 2; g++) /* 64-bit: w[4g + d'] holds elements d' and d' + 4 */
        UNROLL(2)
    for (int c = 0; c < 2; c++) {
        w[4 * g + 2 * c] = unpack_pd(u[4 * g + c], u[4 * g + 2 + c], false);
        w[4 * g + 2 * c + 1] = unpack_pd(u[4 * g + c], u[4 * g + 2 + c], true);
    }
    UNROLL(4)
    for (int d = 0; d < 4; d++) {
        T[d] = _mm512_shuffle_f32x4(w[d], w[4 + d], 0x88);
        T[d + 4] = _mm512_shuffle_f32x4(w[d], w[4 + d], 0xDD);
    }
}

T_512_INLINE void scores8_t(int t, int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                            const void *const *k, float scale, float *s, size_t ss) {
    const __m512 vs = _mm512_set1_ps(scale), z = _mm512_setzero_ps();
    const __mmask8 m8 = (__mmask8)((1u << dk) - 1);
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t nj = n - j0 < 16 ? n - j0 : 16;
        const void *pad[16], *const *r = k + j0;
        if (nj < 16) { /* past n: rows of zeros (+0 in every type) */
            for (int j = 0; j < 16; j++) pad[j] = j < nj ? k[j0 + j] : ZERO_ROW;
            r = pad;
        }
        __m512 T[8];
        transpose16x8(t, r, m8, T);
        for (int h = 0; h < n_q; h++) {
            const float *qh = q + h * qs;
            __m512 p[8];
            UNROLL(8)
            for (int d = 0; d < 8; d++) {
                p[d] = d < dk ? _mm512_fmadd_ps(_mm512_set1_ps(qh[d]), T[d], z) : z;
                /* An F16 cache's q is rounded to f16 (query_row): a product
                 * of two f16 values is exact in float, so p_d is -0 only
                 * when the exact sum is, and fma then gives +0: adding +0
                 * changes nothing. Other types keep the add (a product that
                 * underflows to -0). */
                if (t != GGUF_DT_F16) p[d] = _mm512_add_ps(p[d], z);
            }
            const __m512 r4 = _mm512_add_ps(_mm512_add_ps(p[0], p[4]), _mm512_add_ps(p[2], p[6]));
            const __m512 r5 = _mm512_add_ps(_mm512_add_ps(p[1], p[5]), _mm512_add_ps(p[3], p[7]));
            _mm512_mask_storeu_ps(s + h * ss + j0, kern_mask16(nj),
                                  _mm512_mul_ps(_mm512_add_ps(r4, r5), vs));
        }
    }
}

T_512 static void scores(int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                         const void *const *k, int kt, float scale, float *s, size_t ss) {
    if (dk <= 8 && !kern_is_block_kv(kt)) {
        if (kt == GGUF_DT_F16) scores8_t(GGUF_DT_F16, n, dk, n_q, q, qs, k, scale, s, ss);
        else if (kt == GGUF_DT_BF16) scores8_t(GGUF_DT_BF16, n, dk, n_q, q, qs, k, scale, s, ss);
        else scores8_t(GGUF_DT_F32, n, dk, n_q, q, qs, k, scale, s, ss);
        return;
    }
    if (kt == GGUF_DT_F16) scores_t(GGUF_DT_F16, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_Q8_0) scores_t(GGUF_DT_Q8_0, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_Q4_0) scores_t(GGUF_DT_Q4_0, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_Q5_0) scores_t(GGUF_DT_Q5_0, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_IQ4_NL) scores_t(GGUF_DT_IQ4_NL, n, dk, n_q, q, qs, k, scale, s, ss);
    else if (kt == GGUF_DT_BF16) scores_t(GGUF_DT_BF16, n, dk, n_q, q, qs, k, scale, s, ss);
    else scores_t(GGUF_DT_F32, n, dk, n_q, q, qs, k, scale, s, ss);
}

T_512 static float softmax(int64_t n, float *s, float *l) {
    /* the max is exact in any order; only the sign of a zero maximum can differ
     * from the reference, and s - m then differs only in the sign of zeros,
     * which kern_expf maps to the same 1 */
    __m512 mv = _mm512_set1_ps(s[0]);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = kern_mask16(n - j);
        mv = _mm512_mask_max_ps(mv, m, _mm512_maskz_loadu_ps(m, s + j), mv);
    }
    __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(mv),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(mv), 1)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const __m512 vm = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = kern_mask16(n - j);
        const __m512 e = kern_exp16_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vm));
        _mm512_mask_storeu_ps(s + j, m, e);
        acc = _mm512_mask_add_ps(acc, m, acc, e);
    }
    *l = kern_hsum16_ps(acc);
    return mx;
}

/* NH heads x NC vectors (16 values each) of the output from d0, all positions,
 * NH <= MH and NC <= MC: pv_tile up to 4 x 4, pv_tile8 up to 8 x 3 (24
 * accumulators; one function with room for 8 x 4 slowed the 4-head tiles by
 * 3%). */
#define PV_TILE(NAME, MH, MC)                                                                      \
    T_512_INLINE void NAME(int t, int64_t n, int NH, int NC, __mmask16 last, const float *p,       \
                           size_t ps, const void *const *v, int64_t d0, float *o, size_t os,       \
                           int64_t pf) {                                                           \
        __m512 acc[MH][MC];                                                                        \
        UNROLL(MH)                                                                                 \
        for (int h = 0; h < NH; h++) UNROLL(MC)                                                    \
        for (int c = 0; c < NC; c++)                                                               \
            acc[h][c] = _mm512_maskz_loadu_ps(c == NC - 1 ? last : 0xFFFF, o + h * os + 16 * c);   \
        for (int64_t j = 0; j < n; j++) {                                                          \
            if (pf && j + ATTN_PF < n) prefetch_row(v[j + ATTN_PF], pf);                           \
            __m512 vv[MC];                                                                         \
            UNROLL(MC)                                                                             \
            for (int c = 0; c < NC; c++)                                                           \
                vv[c] = kv_load(t, v[j], d0 + 16 * c, c == NC - 1 ? last : 0xFFFF);                \
            UNROLL(MH)                                                                             \
            for (int h = 0; h < NH; h++) {                                                         \
                const __m512 pj = _mm512_set1_ps(p[h * ps + j]);                                   \
                UNROLL(MC)                                                                         \
                for (int c = 0; c < NC; c++) acc[h][c] = _mm512_fmadd_ps(pj, vv[c], acc[h][c]);    \
            }                                                                                      \
        }                                                                                          \
        UNROLL(MH)                                                                                 \
        for (int h = 0; h < NH; h++) UNROLL(MC)                                                    \
        for (int c = 0; c < NC; c++)                                                               \
            _mm512_mask_storeu_ps(o + h * os + 16 * c, c == NC - 1 ? last : 0xFFFF, acc[h][c]);    \
    }
PV_TILE(pv_tile, 4, 4)
PV_TILE(pv_tile8, 8, 3)
#undef PV_TILE

T_512_INLINE void pv_tile_nh(int t, int64_t n, int nh, int nc, __mmask16 last, const float *p,
                             size_t ps, const void *const *v, int64_t d0, float *o, size_t os,
                             int64_t pf) {
    /* NH and NC become constants so the accumulators stay in registers */
#define PV_CALL(NH, NC)                                                                            \
    case NC:                                                                                       \
        pv_tile(t, n, NH, NC, last, p, ps, v, d0, o, os, pf);                                      \
        break;
#define PV_CALL8(NC)                                                                               \
    case NC:                                                                                       \
        pv_tile8(t, n, 8, NC, last, p, ps, v, d0, o, os, pf);                                      \
        break;
#define PV_HEADS(NH)                                                                               \
    case NH:                                                                                       \
        switch (nc) { PV_CALL(NH, 1) PV_CALL(NH, 2) PV_CALL(NH, 3) default : PV_CALL(NH, 4) }      \
        break;
    if (nh == 8) { /* 8 heads x up to 3 vectors: 24 accumulators */
        switch (nc) { PV_CALL8(1) PV_CALL8(2) default : PV_CALL8(3) }
        return;
    }
    switch (nh) { PV_HEADS(1) PV_HEADS(2) PV_HEADS(3) default : PV_HEADS(4) }
#undef PV_HEADS
#undef PV_CALL8
#undef PV_CALL
}

T_512_INLINE void pv_t(int t, int64_t n, int64_t dv, int n_q, const float *p, size_t ps,
                       const void *const *v, float *o, size_t os) {
    for (int h0 = 0; h0 < n_q;) {
        /* 8 heads x 48 values a pass where there are 8 heads: each V vector
         * widened once for 8 heads instead of 4 */
        const int nh = n_q - h0 >= 8 ? 8 : n_q - h0 < 4 ? n_q - h0 : 4;
        const int64_t span = nh == 8 ? 48 : 64;
        for (int64_t d0 = 0; d0 < dv; d0 += span) {
            const int64_t w = dv - d0 < span ? dv - d0 : span;
            const int nc = (int)((w + 15) / 16);
            /* the first pass over the rows prefetches them (bytes of a row, else 0) */
            const int64_t pf = h0 == 0 && d0 == 0 ? (int64_t)kern_row_bytes(t, dv) : 0;
            pv_tile_nh(t, n, nh, nc, kern_mask16(w - 16 * (nc - 1)), p + h0 * ps, ps, v, d0,
                       o + h0 * os + d0, os, pf);
        }
        h0 += nh;
    }
}

/* Head sizes up to 8: one 256-bit accumulator per head and up to 16 heads
 * per pass over the rows (a verify run's query rows: 5 tokens x 2 heads in
 * one pass), so that enough fma chains are in flight (with 512-bit vectors
 * and 4 heads, the chains' latency held the loop; a 256-bit fma also costs
 * half a 512-bit one where the units are 256 bits wide). Each lane takes the
 * same fmas in the same order as pv_tile's. */
T_512_INLINE __m256 kv_load8(int t, const void *row, __mmask8 m) {
    if (t == GGUF_DT_F32) return _mm256_maskz_loadu_ps(m, row);
    const __m128i h = _mm_maskz_loadu_epi16(m, row);
    if (t == GGUF_DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* BF16 */
}

T_512_INLINE void pv8_tile(int t, int64_t n, int NH, __mmask8 m, const float *p, size_t ps,
                           const void *const *v, float *o, size_t os) {
    __m256 acc[16];
    UNROLL(16)
    for (int h = 0; h < NH; h++) acc[h] = _mm256_maskz_loadu_ps(m, o + h * os);
    for (int64_t j = 0; j < n; j++) {
        const __m256 vv = kv_load8(t, v[j], m);
        UNROLL(16)
        for (int h = 0; h < NH; h++)
            acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(p[h * ps + j]), vv, acc[h]);
    }
    UNROLL(16)
    for (int h = 0; h < NH; h++) _mm256_mask_storeu_ps(o + h * os, m, acc[h]);
}

T_512_INLINE void pv8_t(int t, int64_t n, int64_t dv, int n_q, const float *p, size_t ps,
                        const void *const *v, float *o, size_t os) {
    const __mmask8 m = (__mmask8)((1u << dv) - 1);
    for (int h0 = 0; h0 < n_q; h0 += 16) {
        const int nh = n_q - h0 < 16 ? n_q - h0 : 16;
        const float *ph = p + h0 * ps;
        float *oh = o + h0 * os;
        switch (nh) {
        case 1: pv8_tile(t, n, 1, m, ph, ps, v, oh, os); break;
        case 2: pv8_tile(t, n, 2, m, ph, ps, v, oh, os); break;
        case 3: pv8_tile(t, n, 3, m, ph, ps, v, oh, os); break;
        case 4: pv8_tile(t, n, 4, m, ph, ps, v, oh, os); break;
        case 5: pv8_tile(t, n, 5, m, ph, ps, v, oh, os); break;
        case 6: pv8_tile(t, n, 6, m, ph, ps, v, oh, os); break;
        case 7: pv8_tile(t, n, 7, m, ph, ps, v, oh, os); break;
        case 8: pv8_tile(t, n, 8, m, ph, ps, v, oh, os); break;
        case 9: pv8_tile(t, n, 9, m, ph, ps, v, oh, os); break;
        case 10: pv8_tile(t, n, 10, m, ph, ps, v, oh, os); break;
        case 11: pv8_tile(t, n, 11, m, ph, ps, v, oh, os); break;
        case 12: pv8_tile(t, n, 12, m, ph, ps, v, oh, os); break;
        case 13: pv8_tile(t, n, 13, m, ph, ps, v, oh, os); break;
        case 14: pv8_tile(t, n, 14, m, ph, ps, v, oh, os); break;
        case 15: pv8_tile(t, n, 15, m, ph, ps, v, oh, os); break;
        default: pv8_tile(t, n, 16, m, ph, ps, v, oh, os); break;
        }
    }
}

/* Per-ISA twin of attn_avx2.c's pv (each dispatches to its own ISA's pv_t),
 * plus a pv8_t path for heads of <= 8 values. */
T_512 static void pv(int64_t n, int64_t dv, int n_q, const float *p, size_t ps,
                     const void *const *v, int vt, float *o, size_t os) {
    if (dv <= 8 && !kern_is_block_kv(vt)) {
        if (vt == GGUF_DT_F16) pv8_t(GGUF_DT_F16, n, dv, n_q, p, ps, v, o, os);
        else if (vt == GGUF_DT_BF16) pv8_t(GGUF_DT_BF16, n, dv, n_q, p, ps, v, o, os);
        else pv8_t(GGUF_DT_F32, n, dv, n_q, p, ps, v, o, os);
        return;
    }
    if (vt == GGUF_DT_F16) pv_t(GGUF_DT_F16, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_Q8_0) pv_t(GGUF_DT_Q8_0, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_Q4_0) pv_t(GGUF_DT_Q4_0, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_Q5_0) pv_t(GGUF_DT_Q5_0, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_IQ4_NL) pv_t(GGUF_DT_IQ4_NL, n, dv, n_q, p, ps, v, o, os);
    else if (vt == GGUF_DT_BF16) pv_t(GGUF_DT_BF16, n, dv, n_q, p, ps, v, o, os);
    else pv_t(GGUF_DT_F32, n, dv, n_q, p, ps, v, o, os);
}

/* Per-ISA twin of attn_avx2.c's merge_axpy (kern_merge_heads' axpy). */
T_512_INLINE void merge_axpy(float *o, const float *x, float w, int64_t n) {
    const __m512 vw = _mm512_set1_ps(w);
    for (int64_t d = 0; d < n; d += 16) {
        const __mmask16 m = kern_mask16(n - d);
        _mm512_mask_storeu_ps(
            o + d, m,
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + d), vw, _mm512_maskz_loadu_ps(m, o + d)));
    }
}

T_512_INLINE void merge_scale(float *o, float s, int64_t n) {
    const __m512 vs = _mm512_set1_ps(s);
    for (int64_t d = 0; d < n; d += 16) {
        const __mmask16 m = kern_mask16(n - d);
        _mm512_mask_storeu_ps(o + d, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, o + d), vs));
    }
}

T_512 static void merge(int nc, int n_q, int64_t dv, const float *part, float *out, size_t os) {
    kern_merge_heads(nc, n_q, dv, part, out, os, merge_axpy, merge_scale);
}

T_512 static void silu_mul(float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = kern_mask16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = kern_exp16_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
        const __m512 r = _mm512_div_ps(one, _mm512_add_ps(one, e));
        const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
        const __m512 sig = _mm512_mask_blend_ps(pos, _mm512_mul_ps(e, r), r);
        _mm512_mask_storeu_ps(
            g + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* The butterflies of spans 1..8 inside one vector of 16 (the partner of lane j
 * is lane j ^ span: a + b in the lower lane, a - b in the upper, as the
 * reference computes them), then those of 16 and more between vectors. */
T_512 static void hadamard(float *x, int64_t runs, int64_t n) {
    const __m512 scale = _mm512_set1_ps(1.0f / sqrtf((float)n));
    for (int64_t r = 0; r < runs; r++) {
        float *v = x + r * n;
        for (int64_t j = 0; j < n; j += 16) {
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(v + j), scale), p;
            p = _mm512_permute_ps(a, 0xB1); /* span 1 */
            a = _mm512_mask_blend_ps(0xAAAA, _mm512_add_ps(a, p), _mm512_sub_ps(p, a));
            p = _mm512_permute_ps(a, 0x4E); /* span 2 */
            a = _mm512_mask_blend_ps(0xCCCC, _mm512_add_ps(a, p), _mm512_sub_ps(p, a));
            p = _mm512_shuffle_f32x4(a, a, 0xB1); /* span 4 */
            a = _mm512_mask_blend_ps(0xF0F0, _mm512_add_ps(a, p), _mm512_sub_ps(p, a));
            p = _mm512_shuffle_f32x4(a, a, 0x4E); /* span 8 */
            a = _mm512_mask_blend_ps(0xFF00, _mm512_add_ps(a, p), _mm512_sub_ps(p, a));
            _mm512_storeu_ps(v + j, a);
        }
        for (int64_t len = 16; len < n; len <<= 1)
            for (int64_t i = 0; i < n; i += 2 * len)
                for (int64_t j = i; j < i + len; j += 16) {
                    const __m512 a = _mm512_loadu_ps(v + j), b = _mm512_loadu_ps(v + j + len);
                    _mm512_storeu_ps(v + j, _mm512_add_ps(a, b));
                    _mm512_storeu_ps(v + j + len, _mm512_sub_ps(a, b));
                }
    }
}

const kern_attn_ops kavx512_attn = {scores, softmax, pv, merge, silu_mul, hadamard};
