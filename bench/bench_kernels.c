/* Kernel throughput: matvec (decode) bandwidth and batched matmul rate.
 *
 * Build (not part of the CMake build), from the repo root:
 *   gcc -std=gnu11 -O2 -fopenmp -Isrc -Isrc/base -Isrc/gguf -Isrc/kernels src/base/base.c \
 *       src/base/kvl_pool.c src/gguf/gguf_types.c src/kernels/[a-z]*.c bench/bench_kernels.c \
 *       -o build/bench_kernels -lm -lpthread
 * Run:   OMP_NUM_THREADS=2 ./build/bench_kernels [isa] [k] [n_out] [types, e.g. Q8_0,Q4_K,attn]
 * Built by bench/kernel_ab.sh with -DBENCH_AB_BASE and another revision's
 * kernels, BENCH_AB=1 replaces the figures below by an A/B of the two
 * (bench_ab).
 *
 * Per type, in the GGUF layout and (where the ISA has one) repacked: m = 1
 * (decode, weights streamed from memory), then m = 4, 16, 64 and 512 (batched
 * decode, prefill) from cache-resident weights. "attn" runs
 * the attention kernels (q.k, softmax, p.v) over one 256-position chunk of f16
 * cache rows, single thread; "astream" runs decode attention over a 16-layer
 * cache of 8192 positions in memory (Llama-3.2-1B's 8 KV heads of 64), in the
 * pool's layout: BENCH_ATTN_HEAD_MAJOR=0 rows of every head (the layout before
 * kv_block_layout), =1 head-major blocks; BENCH_ATTN_BS the block size (8192:
 * contiguous); BENCH_ATTN_CHUNK_MAJOR=1 threads split positions, not heads;
 * BENCH_ATTN_SHAPE=d,n_q,n_kv,ctx,layers another model's (qwen3-30b-a3b at 512
 * of context: 128,8,4,512,48); BENCH_ATTN_EVICT_MB=N reads N MB (untimed)
 * before each layer, as decode reads the weights between two layers'
 * attention: a cache that fits the L3 is otherwise read from there.
 *
 * Weights cycle through enough copies to exceed the L3 cache, so the decode
 * figures are DRAM bandwidth, comparable to the machine's stream bandwidth
 * that the first line measures.
 *
 * Environment: BENCH_STREAM=1 batched products (m < 512) also stream their
 * weights from memory; BENCH_LAYOUT=gguf or repacked measures that layout
 * only; BENCH_M=4,8,16 replaces the batched sizes; BENCH_HUGE=1 puts the
 * weights on transparent huge pages, as the engine does; BENCH_SWEEPS and
 * BENCH_WS_KB, the decode sweeps and the bytes of weights cycled through. */
#include "kernels/kernels.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define WORKING_SET (160u << 20) /* bytes of weights cycled through */

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random codes with sane fp16 scales: speed does not depend on the values. */
static void fill_weights(int t, uint8_t *p, int64_t rows, int64_t k) {
    const gguf_dtype_traits *tr = gguf_dtype_traits_of(t);
    const size_t bytes = kern_row_bytes(t, k) * rows;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = next_u64();
        memcpy(p + i, &v, bytes - i < 8 ? bytes - i : 8);
    }
    const kvl_f16 d = kvl_f32_to_f16(0.01f);
    const int64_t nb = (int64_t)(bytes / tr->block_bytes);
    for (int64_t b = 0; b < nb && tr->block_elems > 1; b++) {
        uint8_t *blk = p + b * tr->block_bytes;
        const size_t at = t == GGUF_DT_Q6_K   ? 208
                          : t == GGUF_DT_Q3_K ? 108
                          : t == GGUF_DT_Q2_K ? 80
                                              : 0;
        if (t == GGUF_DT_MXFP4) { /* an E8M0 scale byte: 2^-7 */
            blk[0] = 120;
            continue;
        }
        if (t == GGUF_DT_IQ1_M) { /* d in the top nibbles of the four scale words */
            for (int w = 0; w < 4; w++)
                blk[48 + 2 * w + 1] =
                    (uint8_t)((blk[48 + 2 * w + 1] & 0x0F) | (d >> (4 * w) & 0xF) << 4);
            continue;
        }
        memcpy(blk + at, &d, 2);
        if (t == GGUF_DT_Q4_K || t == GGUF_DT_Q5_K || t == GGUF_DT_Q2_K || t == GGUF_DT_Q4_1 ||
            t == GGUF_DT_Q5_1)
            memcpy(blk + at + 2, &d, 2);
    }
    if (tr->block_elems == 1) { /* floats: small finite values */
        float f[256];
        for (int i = 0; i < 256; i++) f[i] = (float)((int)(next_u64() % 2001) - 1000) * 1e-4f;
        for (int64_t e = 0; e < rows * k; e += 256)
            kern_traits_of(t)->from_float(f, p + kern_row_bytes(t, e),
                                          rows * k - e < 256 ? rows * k - e : 256);
    }
}

/* The read bandwidth the decode figures compare with: each thread sums its
 * share of the working set with kern_read_sum, as `kvllm bench --membw`. */
static double stream_read_gbs(void) {
    const size_t bytes = WORKING_SET;
    char *a = kvl_alloc(bytes);
    memset(a, 1, bytes);
    double best = 0;
    for (int rep = 0; rep < 10; rep++) {
        uint64_t s = 0;
        const double t0 = kvl_time_s();
#pragma omp parallel reduction(+ : s)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const size_t lo = bytes / nt * t & ~(size_t)4095,
                         hi = t == nt - 1 ? bytes : bytes / nt * (t + 1) & ~(size_t)4095;
            s += kern_read_sum(a + lo, hi - lo);
        }
        const double dt = kvl_time_s() - t0;
        if (s == 42) printf(" ");
        if (bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
    kvl_free(a);
    return best;
}

/* Weights as the engine allocates repacked ones (model.c alloc_huge) with
 * BENCH_HUGE=1: 2 MiB aligned, on transparent huge pages where allowed. */
static void *alloc_weights(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (!getenv("BENCH_HUGE") || atoi(getenv("BENCH_HUGE")) == 0 || bytes < huge)
        return kvl_alloc(bytes);
    if (posix_memalign(&p, huge, (bytes + huge - 1) & ~(huge - 1)) != 0) return NULL;
    madvise(p, (bytes + huge - 1) & ~(huge - 1), MADV_HUGEPAGE);
    return p;
}

/* GGUF rows (kern_matmul) or the repacked layout of the same weights. */
static void matmul_any(bool repacked, const void *W, int t, int64_t n_out, int64_t k,
                       const float *X, int64_t m, float *Y, void *work) {
    if (repacked) kern_matmul_repacked(W, t, n_out, k, X, m, Y, work);
    else kern_matmul(W, t, n_out, k, X, m, Y, work);
}

#ifdef BENCH_AB_BASE
/* The kernels of another revision, built by bench/kernel_ab.sh with every
 * symbol they define prefixed base_ (the layers below them are this tree's). */
void base_kern_init(const char *force);
size_t base_kern_repack_bytes(int wtype, int64_t n_out, int64_t k);
void base_kern_repack(const void *W, int wtype, int64_t n_out, int64_t k, void *dst);
size_t base_kern_matmul_work_bytes(int wtype, int64_t m, int64_t k);
void base_kern_matmul(const void *W, int wtype, int64_t n_out, int64_t k, const float *X, int64_t m,
                      float *Y, void *work);
void base_kern_matmul_repacked(const void *P, int wtype, int64_t n_out, int64_t k, const float *X,
                               int64_t m, float *Y, void *work);

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* This tree's kernels against the base revision's on the same weights (the
 * copies W, filled from ab_seed + c, and Wb repacked by the base, whose
 * layout may differ), m activation rows (BENCH_AB_M, default 1) over every
 * copy per timing, the two alternating call by call and the order swapped
 * every pair, so that the machine's drift falls on both: the median and
 * quartiles of time(this tree) / time(base) over BENCH_AB_PAIRS pairs
 * (default 400), after checking that the outputs are bit-identical (or
 * saying how many differ). */
static void bench_ab(int t, int64_t k, int64_t n_out, bool repacked, int copies, uint8_t **W,
                     uint64_t ab_seed, const float *X, float *Y, void *work) {
    const size_t wbytes = kern_row_bytes(t, k) * n_out;
    const size_t bbytes = repacked ? base_kern_repack_bytes(t, n_out, k) : wbytes;
    if (!bbytes) {
        printf("%-5s %s: the base has no such layout\n", gguf_dtype_name(t),
               repacked ? "repacked" : "gguf");
        return;
    }
    const int64_t m = getenv("BENCH_AB_M") ? atoll(getenv("BENCH_AB_M")) : 1;
    const int pairs = getenv("BENCH_AB_PAIRS") ? atoi(getenv("BENCH_AB_PAIRS")) : 400;
    if (m < 1 || m > 512 || pairs < 1) return;
    /* the same GGUF rows as W: refilled from the same seed */
    uint8_t **Wb = calloc((size_t)copies, sizeof *Wb);
    uint8_t *src = kvl_alloc(wbytes);
    void *bwork = kvl_alloc(base_kern_matmul_work_bytes(t, 512, k) + 64);
    double *r = calloc((size_t)pairs, sizeof *r);
    float *Yb = kvl_alloc((size_t)m * n_out * sizeof(float));
    for (int c = 0; c < copies; c++) {
        Wb[c] = alloc_weights(bbytes);
        rng = ab_seed + (uint64_t)c;
        fill_weights(t, src, n_out, k);
        if (repacked) base_kern_repack(src, t, n_out, k, Wb[c]);
        else memcpy(Wb[c], src, wbytes);
    }
    int differ = 0;
    matmul_any(repacked, W[0], t, n_out, k, X, m, Y, work);
    if (repacked) base_kern_matmul_repacked(Wb[0], t, n_out, k, X, m, Yb, bwork);
    else base_kern_matmul(Wb[0], t, n_out, k, X, m, Yb, bwork);
    for (int64_t i = 0; i < m * n_out; i++) differ += memcmp(&Y[i], &Yb[i], sizeof(float)) != 0;
    for (int p = 0; p < pairs; p++) {
        double dt[2];
        for (int h = 0; h < 2; h++) {
            const int base = (p + h) & 1;
            const double t0 = kvl_time_s();
            for (int c = 0; c < copies; c++) {
                if (!base) matmul_any(repacked, W[c], t, n_out, k, X, m, Y, work);
                else if (repacked) base_kern_matmul_repacked(Wb[c], t, n_out, k, X, m, Yb, bwork);
                else base_kern_matmul(Wb[c], t, n_out, k, X, m, Yb, bwork);
            }
            dt[base] = kvl_time_s() - t0;
        }
        r[p] = dt[0] / dt[1];
    }
    qsort(r, (size_t)pairs, sizeof *r, cmp_double);
    printf("%-5s %s m=%lld: time this tree / base: median %.3f, quartiles %.3f %.3f (%d pairs); "
           "outputs %s\n",
           gguf_dtype_name(t), repacked ? "repacked" : "gguf    ", (long long)m, r[pairs / 2],
           r[pairs / 4], r[3 * pairs / 4], pairs, differ ? "DIFFER" : "bit-identical");
    if (differ) printf("      %d of %lld outputs differ\n", differ, (long long)(m * n_out));
    for (int c = 0; c < copies; c++) kvl_free(Wb[c]);
    free(Wb), free(r);
    kvl_free(src), kvl_free(bwork), kvl_free(Yb);
}
#endif

static void bench_layout(int t, int64_t k, int64_t n_out, bool repacked) {
    const size_t wbytes = kern_row_bytes(t, k) * n_out;
    const size_t pbytes = repacked ? kern_repack_bytes(t, n_out, k) : wbytes;
    if (!pbytes) return;
    const size_t ws =
        getenv("BENCH_WS_KB") ? (size_t)atoll(getenv("BENCH_WS_KB")) << 10 : WORKING_SET;
    int copies = (int)(ws / pbytes) + 1;
    if (copies < 2) copies = 2;
    uint8_t **W = calloc((size_t)copies, sizeof *W);
    uint8_t *src = repacked ? kvl_alloc(wbytes) : NULL;
    const uint64_t ab_seed = rng;
    for (int c = 0; c < copies; c++) {
        W[c] = alloc_weights(pbytes);
        rng = ab_seed + (uint64_t)c; /* copy c's values again for the A/B */
        fill_weights(t, repacked ? src : W[c], n_out, k);
        if (repacked) kern_repack(src, t, n_out, k, W[c]);
    }
    kvl_free(src);
    const int64_t mmax = 512;
    float *X = kvl_alloc(mmax * k * sizeof(float)), *Y = kvl_alloc(mmax * n_out * sizeof(float));
    for (int64_t i = 0; i < mmax * k; i++) X[i] = (float)((int)(next_u64() % 2001) - 1000) * 1e-3f;
    void *work = kvl_alloc(kern_matmul_work_bytes(t, mmax, k) + 64);

#ifdef BENCH_AB_BASE
    if (getenv("BENCH_AB")) {
        bench_ab(t, k, n_out, repacked, copies, W, ab_seed, X, Y, work);
        goto done;
    }
#endif
    /* decode: m = 1, cycling through the copies; best of a few sweeps */
    double best = 1e30;
    const int sweeps = getenv("BENCH_SWEEPS") ? atoi(getenv("BENCH_SWEEPS")) : 12;
    for (int sweep = 0; sweep < sweeps; sweep++) {
        const double t0 = kvl_time_s();
        for (int c = 0; c < copies; c++) matmul_any(repacked, W[c], t, n_out, k, X, 1, Y, work);
        const double dt = (kvl_time_s() - t0) / copies;
        if (dt < best) best = dt;
    }
    printf("%-5s %s m=1 %7.1f us %6.2f GB/s", gguf_dtype_name(t),
           repacked ? "repacked" : "gguf    ", best * 1e6, pbytes / best / 1e9);
    /* batched: m = 4, 16, 64 and 512 (prefill) from cache-resident weights (compute rate) */
    int64_t ms[16] = {4, 16, 64, 512};
    int nm = 4;
    if (getenv("BENCH_M")) {
        nm = 0;
        for (const char *s = getenv("BENCH_M"); *s && nm < 16;) {
            const int64_t v = atoll(s);
            if (v >= 1 && v <= mmax) ms[nm++] = v;
            s = strchr(s, ',');
            if (!s) break;
            s++;
        }
    }
    for (int mi = 0; mi < nm; mi++) {
        double b2 = 1e30;
        /* BENCH_STREAM=1: batched products also cycle through the copies, so
         * their weights come from memory as in a real batched decode step */
        const int nc = getenv("BENCH_STREAM") && ms[mi] < 512 ? copies : 1;
        for (int rep = 0; rep < (ms[mi] >= 512 ? 3 : 5); rep++) {
            const double t0 = kvl_time_s();
            for (int c = 0; c < nc; c++)
                matmul_any(repacked, W[c], t, n_out, k, X, ms[mi], Y, work);
            const double dt = (kvl_time_s() - t0) / nc;
            if (dt < b2) b2 = dt;
        }
        printf("  m=%-3lld %6.1f GMAC/s", (long long)ms[mi], (double)n_out * k * ms[mi] / b2 / 1e9);
    }
    printf("\n");
#ifdef BENCH_AB_BASE
done:
#endif
    for (int c = 0; c < copies; c++) kvl_free(W[c]);
    free(W);
    kvl_free(X), kvl_free(Y), kvl_free(work);
}

static void bench_type(int t, int64_t k, int64_t n_out) {
    const char *only = getenv("BENCH_LAYOUT");
    if (!only || !strcmp(only, "gguf")) bench_layout(t, k, n_out, false);
    if (!only || !strcmp(only, "repacked")) bench_layout(t, k, n_out, true);
}

/* q.k + softmax + p.v of n_q heads over one chunk of n f16 rows of width d. */
static void bench_attn(int64_t d, int n_q) {
    const int64_t n = 256;
    kvl_f16 *kv = kvl_alloc(n * d * sizeof(kvl_f16));
    const void **rows = kvl_alloc(n * sizeof *rows);
    float *q = kvl_alloc(n_q * d * sizeof(float)), *s = kvl_alloc(n_q * n * sizeof(float));
    float *o = kvl_alloc(n_q * d * sizeof(float)), l;
    for (int64_t i = 0; i < n * d; i++)
        kv[i] = kvl_f32_to_f16((float)((int)(next_u64() % 2001) - 1000) * 1e-3f);
    for (int64_t i = 0; i < n_q * d; i++) q[i] = (float)((int)(next_u64() % 2001) - 1000) * 1e-3f;
    for (int64_t j = 0; j < n; j++) rows[j] = kv + j * d;
    double best = 1e30, best_s = 1e30, best_pv = 1e30;
    for (int rep = 0; rep < 200; rep++) {
        const double t0 = kvl_time_s();
        kern_attn_scores(n, d, n_q, q, (size_t)d, rows, GGUF_DT_F16, 0.125f, s, (size_t)n);
        const double t1 = kvl_time_s();
        for (int h = 0; h < n_q; h++) kern_attn_softmax(n, s + h * n, &l);
        memset(o, 0, n_q * d * sizeof(float));
        const double t2 = kvl_time_s();
        kern_attn_pv(n, d, n_q, s, (size_t)n, rows, GGUF_DT_F16, o, (size_t)d);
        const double t3 = kvl_time_s();
        if (t3 - t0 < best) best = t3 - t0;
        if (t1 - t0 < best_s) best_s = t1 - t0;
        if (t3 - t2 < best_pv) best_pv = t3 - t2;
    }
    printf("attn  d=%-4lld n_q=%d  %7.2f us per chunk of %lld  %6.1f GMAC/s (q.k %.2f us, p.v %.2f "
           "us)\n",
           (long long)d, n_q, best * 1e6, (long long)n, 2.0 * n_q * n * d / best / 1e9,
           best_s * 1e6, best_pv * 1e6);
    kvl_free(kv), kvl_free(rows), kvl_free(q), kvl_free(s), kvl_free(o);
}

/* Decode attention over a cache in memory: `layers` layers of ctx positions x
 * n_kv heads x d (f16 K and V), each KV head's n_q query heads over all
 * positions in chunks of 256, the heads split over the threads. The layout is
 * the pool's (a row per position with every head, blocks of bs rows), or with
 * BENCH_ATTN_HEAD_MAJOR=1 head-major inside each block (one head's bs rows
 * contiguous). Reports GB/s of K and V read. */
static void bench_attn_stream(int64_t d, int n_q, int n_kv, int64_t ctx, int layers, int bs,
                              bool head_major, bool chunk_major, size_t evict_mb) {
    const size_t per = (size_t)ctx * n_kv * d;
    kvl_f16 *K = alloc_weights(per * layers * sizeof(kvl_f16)),
            *V = alloc_weights(per * layers * sizeof(kvl_f16));
    for (size_t i = 0; i < per * layers; i++)
        K[i] = V[i] = kvl_f32_to_f16((float)((int)(next_u64() % 2001) - 1000) * 1e-3f);
    /* evict_mb: read between layers, untimed, as a decode step reads its
     * weights between two layers' attention: without it a cache smaller
     * than the L3 (the Xeon's 480 MiB) is read from there, not from DRAM */
    const size_t evict_n = evict_mb << 17; /* 64-bit words */
    uint64_t *evict = evict_n ? alloc_weights(evict_n * sizeof(uint64_t)) : NULL;
    for (size_t i = 0; i < evict_n; i++) evict[i] = i;
    uint64_t evict_sum = 0;
    const int nt = omp_get_max_threads();
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = 0;
        for (int L = 0; L < layers; L++) {
            if (evict_n) {
                uint64_t acc = 0;
#pragma omp parallel for reduction(+ : acc)
                for (size_t i = 0; i < evict_n; i += 8) acc += evict[i];
                evict_sum += acc;
            }
            const double t0 = kvl_time_s();
            /* chunk_major: a thread takes a chunk of positions for every head
             * (reads whole rows), else a head over every chunk */
#pragma omp parallel for schedule(dynamic, 1)
            for (int64_t w = 0; w < n_kv * (ctx / 256); w++) {
                const int g = chunk_major ? (int)(w % n_kv) : (int)(w / (ctx / 256));
                const int64_t j0 = 256 * (chunk_major ? w / n_kv : w % (ctx / 256));
                static _Thread_local const void *kr[256], *vr[256];
                static _Thread_local float q[16 * 576], s[16 * 256], o[16 * 576];
                float l;
                for (int64_t i = 0; i < n_q * d; i++) q[i] = 0.01f * (float)(i % 7);
                for (int64_t j = j0; j < j0 + 256; j++) {
                    const size_t at =
                        head_major
                            ? ((size_t)(j / bs) * n_kv * bs + (size_t)g * bs + (size_t)(j % bs)) * d
                            : ((size_t)j * n_kv + g) * d;
                    kr[j - j0] = K + (size_t)L * per + at;
                    vr[j - j0] = V + (size_t)L * per + at;
                }
                kern_attn_scores(256, d, n_q, q, (size_t)d, kr, GGUF_DT_F16, 0.125f, s, 256);
                for (int h = 0; h < n_q; h++) kern_attn_softmax(256, s + h * 256, &l);
                memset(o, 0, n_q * d * sizeof(float));
                kern_attn_pv(256, d, n_q, s, 256, vr, GGUF_DT_F16, o, (size_t)d);
            }
            t += kvl_time_s() - t0;
        }
        if (t < best) best = t;
    }
    printf("attn stream d=%lld n_q=%d n_kv=%d ctx=%lld x%d layers, block %d, %s, %s, %d threads%s: "
           "%.2f ms  %.1f GB/s  %.1f GMAC/s\n",
           (long long)d, n_q, n_kv, (long long)ctx, layers, bs,
           head_major ? "head-major blocks" : "position rows",
           chunk_major ? "chunk-major" : "head-major order", nt,
           evict_n ? ", caches evicted between layers" : "", best * 1e3,
           2.0 * per * layers * 2 / best / 1e9, 2.0 * n_q * n_kv * ctx * d * layers / best / 1e9);
    if (evict_sum == 1) printf("\n"); /* keeps the eviction reads */
    (void)K, (void)V;                 /* (alloc_weights: left to the exit) */
}

int main(int argc, char **argv) {
    kern_init(argc > 1 ? argv[1] : NULL);
#ifdef BENCH_AB_BASE
    base_kern_init(argc > 1 ? argv[1] : NULL);
#endif
    const int64_t k = argc > 2 ? atoll(argv[2]) : 4096, n_out = argc > 3 ? atoll(argv[3]) : 4096;
    printf("isa %s, %d threads, W %lldx%lld; stream read %.1f GB/s\n", kern_isa_name(),
           omp_get_max_threads(), (long long)n_out, (long long)k, stream_read_gbs());
    static const int types[] = {GGUF_DT_Q4_0,    GGUF_DT_Q4_K,   GGUF_DT_Q6_K,   GGUF_DT_Q8_0,
                                GGUF_DT_F16,     GGUF_DT_BF16,   GGUF_DT_F32,    GGUF_DT_Q4_1,
                                GGUF_DT_Q5_0,    GGUF_DT_Q5_1,   GGUF_DT_IQ4_NL, GGUF_DT_Q2_K,
                                GGUF_DT_Q3_K,    GGUF_DT_Q5_K,   GGUF_DT_IQ4_XS, GGUF_DT_MXFP4,
                                GGUF_DT_IQ2_XXS, GGUF_DT_IQ2_XS, GGUF_DT_IQ2_S,  GGUF_DT_IQ3_XXS,
                                GGUF_DT_IQ3_S,   GGUF_DT_IQ1_S,  GGUF_DT_IQ1_M};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (argc <= 4 || strstr(argv[4], gguf_dtype_name(types[i]))) bench_type(types[i], k, n_out);
    if (argc <= 4 || strstr(argv[4], "attn")) {
        bench_attn(64, 4);
        bench_attn(128, 4);
        bench_attn(128, 8);
        bench_attn(576, 16);
    }
    if (argc > 4 && strstr(argv[4], "astream")) {
        const char *hm = getenv("BENCH_ATTN_HEAD_MAJOR");
        const char *cm = getenv("BENCH_ATTN_CHUNK_MAJOR");
        const char *bs = getenv("BENCH_ATTN_BS");
        const char *shape = getenv("BENCH_ATTN_SHAPE"); /* d,n_q,n_kv,ctx,layers */
        int d = 64, nq = 4, nkv = 8, ctx = 8192, layers = 16;
        if (shape) sscanf(shape, "%d,%d,%d,%d,%d", &d, &nq, &nkv, &ctx, &layers);
        const char *ev = getenv("BENCH_ATTN_EVICT_MB");
        bench_attn_stream(d, nq, nkv, ctx, layers, bs ? atoi(bs) : 16, hm && atoi(hm),
                          cm && atoi(cm), ev ? (size_t)atoll(ev) : 0);
    }
    return 0;
}
