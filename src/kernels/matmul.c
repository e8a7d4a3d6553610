/* kernels: matrix multiply against a quantized weight matrix, and row lookup.
 *
 * Every output element y[i][j] is computed with the canonical reduction order
 * of kern_impl.h for (W row j, quantized X row i), so results do not depend on
 * m, the thread count, the chunking or the path taken (plain vec_dot, a rows
 * kernel on prepared activations, or the packed GEMM): all are bit-identical.
 *
 * Paths: m >= KERN_GEMM_MIN_M with a packed GEMM for the type (prefill, batched
 * decode): X is prepared once in tiles, each thread packs chunks of weight rows
 * into panels in a buffer of its own and runs all m rows past them. Otherwise
 * (decode) W rows stream from memory once through a rows kernel or vec_dot. */
#include "kern_impl.h"

#include "kvl_pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* W rows are processed in chunks of about this many bytes: a chunk stays in L2
 * while all m activation rows stream past it, so W is read from memory once. */
#define MATMUL_CHUNK_BYTES (48 * 1024)
/* With a four-row kernel (decode), chunks of about this many bytes: each of
 * its four streams then runs through a quarter of the chunk. */
#define MATMUL_CHUNK4_BYTES (256 * 1024)
/* Packed panels per GEMM chunk (and at most per guided chunk of a repacked
 * matrix of several tiles, kern_guided_spans): about this many bytes, so the
 * chunk stays in L2 while the activation tiles stream past it. */
#define GEMM_CHUNK_BYTES (256 * 1024)
/* Below this many multiply-adds a matmul runs on the calling thread: waking
 * the pool would cost more than it saves. */
#define MATMUL_PARALLEL_MIN_MACS (1 << 17)
/* Decode's guided chunks are at least this many bytes of panels (64 KiB and
 * 160 KiB measured alike; 160 a little ahead). */
#define DECODE_MIN_CHUNK_BYTES (160 * 1024)
#define DECODE_MAX_SPANS       256

/* How one matmul runs: how X is quantized, its row size, and the kernel. */
typedef struct {
    kern_from_float_fn quantize; /* NULL: X is used in place (F32) */
    size_t xrow, wrow;
    kern_vec_dot_fn dot; /* used when rows is NULL */
    kern_vec_dot_rows_fn rows;
    kern_rows4_fn rows4;       /* four weight rows at once, when set */
    const kern_gemm_ops *gemm; /* the packed path, when set */
    int rows_max;              /* activation rows per call of rows */
} mm_plan;

static bool mm_make_plan(int wtype, int64_t k, int64_t m, mm_plan *p) {
    const kern_traits *t = kern_traits_of(wtype);
    if (!t || !t->vec_dot || k <= 0 || k % gguf_dtype_traits_of(wtype)->block_elems) return false;
    const int vdt = gguf_dtype_traits_of(wtype)->vec_dot_type;
    const kern_prep_ops *prep = kern_prep_of(wtype);
    const kern_vec_dot_rows_fn rows = kern_rows_of(wtype);
    const kern_gemm_ops *gemm = kern_gemm_of(wtype);
    *p = (mm_plan){kern_act_quantizer(kern_traits_of(vdt)),
                   kern_row_bytes(vdt, k),
                   kern_row_bytes(wtype, k),
                   t->vec_dot,
                   rows && m > 1 ? rows : NULL,
                   NULL,
                   gemm && m >= gemm->min_m ? gemm : NULL,
                   rows ? kern_rows_max_of(wtype) : KERN_ROWS_MAX};
    if (prep) {
        p->quantize = prep->prepare;
        p->xrow = kern_q8p_row_bytes(k);
        p->rows = prep->rows;
        p->rows4 = prep->rows4;
        p->rows_max = KERN_ROWS_MAX;
    } else if (vdt == GGUF_DT_F32) {
        p->quantize = NULL;
        p->xrow = (size_t)k * sizeof(float);
    }
    return true;
}

/* Generous for every ISA and type: tiles of at most 16 rows, per row at most
 * 40 bytes per 32 elements (Q), a Q8_K row plus 32 bytes per 256 (K) or 4 bytes
 * per element rounded up to 16 elements (FP). */
size_t kern_gemm_work_bytes(int wtype, int64_t m, int64_t k) {
    const size_t rows = (size_t)m + 15; /* ceil(m / T) * T for any tile of T <= 16 rows */
    switch (wtype) {
    case GGUF_DT_Q8_0:
    case GGUF_DT_Q4_0:
    case GGUF_DT_Q4_1:
    case GGUF_DT_Q5_0:
    case GGUF_DT_Q5_1:
    case GGUF_DT_IQ4_NL:
    case GGUF_DT_MXFP4: return rows * (size_t)(k / QK8_0) * (QK8_0 + 8); /* Q8_0 / Q8_1 tiles */
    case GGUF_DT_Q2_K:
    case GGUF_DT_Q3_K:
    case GGUF_DT_Q4_K:
    case GGUF_DT_Q5_K:
    case GGUF_DT_Q6_K:
    case GGUF_DT_IQ4_XS: return rows * (size_t)(k / QK_K) * (sizeof(blk_q8_K) + 32);
    default: return rows * (size_t)((k + 15) / 16 * 16) * sizeof(float);
    }
}

/* Independent of the ISA chosen, so a buffer sized before kern_init still fits. */
size_t kern_matmul_work_bytes(int wtype, int64_t m, int64_t k) {
    const kern_traits *t = kern_traits_ref(wtype);
    if (!t || !t->vec_dot || m <= 0 || k <= 0) return 0;
    const int vdt = gguf_dtype_traits_of(wtype)->vec_dot_type;
    size_t row = kern_row_bytes(vdt, k);
    if (vdt == GGUF_DT_F32) row = 0; /* X is used in place */
    if (vdt == GGUF_DT_Q8_0 && kern_q8p_row_bytes(k) > row) row = kern_q8p_row_bytes(k);
    size_t bytes = (size_t)m * row;
    if (kern_gemm_work_bytes(wtype, m, k) > bytes) bytes = kern_gemm_work_bytes(wtype, m, k);
    return bytes;
}

static int64_t chunk_rows(const mm_plan *p, int64_t n_out, int nth) {
    if (p->rows4) { /* as large as the target, but at least two chunks per thread */
        int64_t rows = (int64_t)(MATMUL_CHUNK4_BYTES / p->wrow),
                per = (n_out + 2 * nth - 1) / (2 * nth);
        if (rows > per) rows = per;
        return rows < 4 ? 4 : rows;
    }
    int64_t rows = p->wrow ? (int64_t)(MATMUL_CHUNK_BYTES / p->wrow) : n_out;
    if (rows < 1) rows = 1;
    if (rows > 64) rows = 64;
    return rows;
}

/* Output rows j0..j1 for all m activation rows. With a rows kernel each weight
 * row is decoded once per group of up to rows_max activation rows. */
static void mm_chunk(const mm_plan *p, const char *w, int64_t j0, int64_t j1, int64_t k,
                     const char *xq, int64_t m, float *Y, int64_t n_out) {
    if (!p->rows) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = j0; j < j1; j++)
                p->dot(k, &Y[i * n_out + j], w + (size_t)j * p->wrow, xq + (size_t)i * p->xrow);
        return;
    }
    for (int64_t i = 0; i < m; i += p->rows_max) {
        const int nr = m - i < p->rows_max ? (int)(m - i) : p->rows_max;
        int64_t j = j0;
        if (p->rows4) {
            /* the four rows of a call a quarter of the chunk apart: each streams
             * on through consecutive rows (short interleaved streams of
             * adjacent rows defeat the prefetchers) */
            const int64_t q = (j1 - j0) / 4;
            for (int64_t r = 0; r < q; r++)
                p->rows4(k, &Y[i * n_out + j0 + r], (size_t)q, (size_t)n_out,
                         w + (size_t)(j0 + r) * p->wrow, (size_t)q * p->wrow,
                         xq + (size_t)i * p->xrow, p->xrow, nr);
            j = j0 + 4 * q;
        }
        for (; j < j1; j++)
            p->rows(k, &Y[i * n_out + j], (size_t)n_out, w + (size_t)j * p->wrow,
                    xq + (size_t)i * p->xrow, p->xrow, nr);
    }
}

/* The calling thread's panel buffer, grown on demand (the kvl_pool workers
 * live as long as the process). */
static _Thread_local void *tl_panels;
static _Thread_local size_t tl_panels_cap;

static void *panel_buffer(size_t bytes) {
    if (bytes > tl_panels_cap) {
        free(tl_panels);
        tl_panels = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        tl_panels_cap = tl_panels ? bytes : 0;
    }
    return tl_panels;
}

/* The activation tiles of a product: the m rows of X (k each) as g prepares
 * them, tile after tile, tb bytes each, in work. The serial loops and the
 * pool's prepare tasks read the same one. */
typedef struct {
    const kern_gemm_ops *g;
    const float *X;
    int64_t k, m;
    void *work;
    size_t tb;
} gemm_tiles;

/* Row i of X into its slot of its tile. */
static inline void tiles_prepare_row(const gemm_tiles *t, int64_t i) {
    const int T = t->g->tile_rows;
    const int64_t t0 = i / T * T;
    t->g->prepare(t->X + i * t->k, (char *)t->work + (i / T) * t->tb, (int)(i - t0),
                  t->m - t0 < T ? (int)(t->m - t0) : T, t->k);
}

/* The same for the pool: one task per row of the gemm_tiles at ctx. */
static void prepare_task(void *ctx, int64_t i, int thread) { tiles_prepare_row(ctx, i); }

/* Chunk c of nchunks: its panels packed into this thread's buffer, then all m rows past them. */
static void gemm_chunk(const kern_gemm_ops *g, const char *W, size_t wrow, int64_t n_out, int64_t k,
                       int64_t m, float *Y, const void *work, size_t pb, int64_t npanels,
                       int64_t nchunks, int64_t c) {
    const int64_t p0 = npanels * c / nchunks, p1 = npanels * (c + 1) / nchunks;
    const int64_t j0 = p0 * KERN_PANEL_ROWS;
    const int64_t j1 = p1 * KERN_PANEL_ROWS < n_out ? p1 * KERN_PANEL_ROWS : n_out;
    if (!g->panel_bytes) {
        g->kernel(k, W + (size_t)j0 * wrow, wrow, (int)(j1 - j0), work, m, Y + j0, (size_t)n_out);
        return;
    }
    char *panels = panel_buffer((size_t)(p1 - p0) * pb);
    if (!panels) {
        kvl_log(KVL_LOG_ERROR, "kern_matmul: out of memory for packed weights");
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = j0; j < j1; j++) Y[i * n_out + j] = NAN;
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        const int64_t r0 = p * KERN_PANEL_ROWS;
        const int rows = n_out - r0 < KERN_PANEL_ROWS ? (int)(n_out - r0) : KERN_PANEL_ROWS;
        g->pack(W + (size_t)r0 * wrow, wrow, rows, k, panels + (p - p0) * pb);
    }
    g->kernel(k, panels, pb, (int)(j1 - j0), work, m, Y + j0, (size_t)n_out);
}

/* The chunks of one packed GEMM for the pool's tasks. */
typedef struct {
    const kern_gemm_ops *g;
    const char *W;
    size_t wrow;
    int64_t n_out, k, m;
    float *Y;
    void *work;
    size_t pb;
    int64_t npanels, nchunks;
} gemm_job;

static void gemm_chunk_task(void *ctx, int64_t c, int thread) {
    const gemm_job *j = ctx;
    gemm_chunk(j->g, j->W, j->wrow, j->n_out, j->k, j->m, j->Y, j->work, j->pb, j->npanels,
               j->nchunks, c);
}

static void mm_gemm(const kern_gemm_ops *g, const char *W, size_t wrow, int64_t n_out, int64_t k,
                    const float *X, int64_t m, float *Y, void *work, bool par) {
    const int T = g->tile_rows;
    const int64_t ntiles = (m + T - 1) / T;
    const size_t tb = g->tile_bytes(k);
    gemm_tiles tiles = {g, X, k, m, work, tb};
    /* bytes of KERN_PANEL_ROWS weight rows as the kernel reads them */
    const size_t pb = g->panel_bytes ? g->panel_bytes(k) : KERN_PANEL_ROWS * wrow;
    /* panels per chunk: about GEMM_CHUNK_BYTES, and a chunk count that is a
     * multiple of the pool size so that static shares come out even */
    const int64_t npanels = (n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
    int64_t per = (int64_t)(GEMM_CHUNK_BYTES / pb);
    if (per < 1) per = 1;
    const int nth = par ? kvl_pool_threads() : 1;
    int64_t nchunks = (npanels + per - 1) / per;
    nchunks = (nchunks + nth - 1) / nth * nth;
    if (nchunks > npanels) nchunks = npanels;
    /* padded rows of the last tile read as zeros */
    memset((char *)work + (ntiles - 1) * tb, 0, tb);

    /* one tile (decode: an F32 MoE router, an F16 model) is prepared here,
     * saving the pool a round, as is everything without the pool */
    if (ntiles == 1 || !par)
        for (int64_t i = 0; i < m; i++) tiles_prepare_row(&tiles, i);
    else kvl_pool_run(prepare_task, &tiles, m);
    if (!par) { /* on this thread: waking the pool would cost more */
        for (int64_t c = 0; c < nchunks; c++)
            gemm_chunk(g, W, wrow, n_out, k, m, Y, work, pb, npanels, nchunks, c);
        return;
    }
    gemm_job j = {g, W, wrow, n_out, k, m, Y, work, pb, npanels, nchunks};
    kvl_pool_run(gemm_chunk_task, &j, nchunks);
}

/* One matmul for the pool's tasks: rows of X to quantize, then chunks of
 * crows output rows. */
typedef struct {
    const mm_plan *p;
    const void *W;
    int64_t n_out, k;
    const float *X;
    const char *xq;
    int64_t m;
    float *Y;
    void *work;
    int64_t crows;
} mm_job;

static void mm_quantize_task(void *ctx, int64_t i, int thread) {
    const mm_job *j = ctx;
    j->p->quantize(j->X + i * j->k, (char *)j->work + i * j->p->xrow, j->k);
}

static void mm_chunk_task(void *ctx, int64_t c, int thread) {
    const mm_job *j = ctx;
    const int64_t j0 = c * j->crows, j1 = j0 + j->crows < j->n_out ? j0 + j->crows : j->n_out;
    mm_chunk(j->p, j->W, j0, j1, j->k, j->xq, j->m, j->Y, j->n_out);
}

void kern_matmul(const void *W, int wtype, int64_t n_out, int64_t k, const float *X, int64_t m,
                 float *Y, void *work) {
    mm_plan p;
    const bool ok = mm_make_plan(wtype, k, m, &p);
    if (!ok || ((p.quantize || p.gemm) && !work && m > 0)) {
        kvl_log(KVL_LOG_ERROR, "kern_matmul: %s (weight type %d, k = %lld)",
                ok ? "no work buffer" : "no kernel", wtype, (long long)k);
        for (int64_t i = 0; i < n_out * m; i++) Y[i] = NAN;
        return;
    }
    const bool par = (double)n_out * (double)k * (double)m >= MATMUL_PARALLEL_MIN_MACS;
    if (p.gemm) {
        mm_gemm(p.gemm, W, p.wrow, n_out, k, X, m, Y, work, par);
        return;
    }
    const char *xq = p.quantize ? (const char *)work : (const char *)X;
    const int64_t crows = chunk_rows(&p, n_out, par ? kvl_pool_threads() : 1);
    const int64_t nchunks = (n_out + crows - 1) / crows;

    /* A few rows (decode) are quantized here, saving the pool a round. */
    const bool serial_quantize = m <= KERN_ROWS_MAX || !par;
    if (p.quantize && serial_quantize)
        for (int64_t i = 0; i < m; i++) p.quantize(X + i * k, (char *)work + i * p.xrow, k);
    if (!par) { /* on this thread: waking the pool would cost more */
        for (int64_t c = 0; c < nchunks; c++) {
            const int64_t j0 = c * crows, j1 = j0 + crows < n_out ? j0 + crows : n_out;
            mm_chunk(&p, W, j0, j1, k, xq, m, Y, n_out);
        }
        return;
    }
    mm_job j = {&p, W, n_out, k, X, xq, m, Y, work, crows};
    if (p.quantize && !serial_quantize) kvl_pool_run(mm_quantize_task, &j, m);
    kvl_pool_run(mm_chunk_task, &j, nchunks);
}

void kern_get_row(const void *data, int dtype, int64_t n, int64_t row, float *dst) {
    const kern_traits *t = kern_traits_of(dtype);
    if (!t) {
        kvl_log(KVL_LOG_ERROR, "kern_get_row: no kernel for type %d", dtype);
        for (int64_t i = 0; i < n; i++) dst[i] = NAN;
        return;
    }
    t->to_float((const char *)data + (size_t)row * kern_row_bytes(dtype, n), dst, n);
}

/* ---------------------------------------------------------- repacked -- */

size_t kern_repack_bytes(int wtype, int64_t n_out, int64_t k) {
    const kern_repack_ops *r = kern_repack_of(wtype);
    const kern_gemm_ops *g = kern_gemm_of(wtype);
    const kern_traits *t = kern_traits_of(wtype);
    if (!r || !g || !t || n_out <= 0 || k <= 0 || k % gguf_dtype_traits_of(wtype)->block_elems)
        return 0;
    return (size_t)((n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS) * r->panel_bytes(k);
}

/* Panels per task of kern_repack. */
#define REPACK_TASK_PANELS 8

typedef struct {
    const kern_repack_ops *r;
    const void *W;
    void *dst;
    int64_t n_out, k;
    size_t wrow, pb;
    int64_t np;
} repack_job;

static void repack_task(void *ctx, int64_t task, int thread) {
    const repack_job *j = ctx;
    const int64_t pend =
        (task + 1) * REPACK_TASK_PANELS < j->np ? (task + 1) * REPACK_TASK_PANELS : j->np;
    for (int64_t p = task * REPACK_TASK_PANELS; p < pend; p++) {
        const int64_t r0 = p * KERN_PANEL_ROWS;
        const int rows = j->n_out - r0 < KERN_PANEL_ROWS ? (int)(j->n_out - r0) : KERN_PANEL_ROWS;
        j->r->pack((const char *)j->W + (size_t)r0 * j->wrow, j->wrow, rows, j->k,
                   (char *)j->dst + (size_t)p * j->pb);
    }
}

void kern_repack(const void *W, int wtype, int64_t n_out, int64_t k, void *dst) {
    const kern_repack_ops *r = kern_repack_of(wtype);
    if (!kern_repack_bytes(wtype, n_out, k)) return;
    const size_t wrow = kern_row_bytes(wtype, k), pb = r->panel_bytes(k);
    const int64_t np = (n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
    repack_job j = {r, W, dst, n_out, k, wrow, pb, np};
    kvl_pool_run(repack_task, &j, (np + REPACK_TASK_PANELS - 1) / REPACK_TASK_PANELS);
}

static void repacked_chunk(const kern_repacked_mat *mats, const kern_span *sp, int64_t k, int64_t m,
                           const void *work) {
    const kern_repacked_mat *mt = &mats[sp->mat];
    kern_repacked_panels(mt->wtype, mt->P, mt->n_out, k, sp->p0, sp->p1, work, m, mt->Y);
}

/* Chunk c of matrices split evenly, first[w] being matrix w's first chunk. */
static kern_span linear_span(int nw, const kern_repacked_mat *mats, const int64_t *first,
                             int64_t c) {
    int w = 0;
    while (w + 1 < nw && c >= first[w + 1]) w++;
    const int64_t np = (mats[w].n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS,
                  nc = first[w + 1] - first[w];
    return (kern_span){w, (int32_t)(np * (c - first[w]) / nc),
                       (int32_t)(np * (c - first[w] + 1) / nc)};
}

/* Decode's chunks, guided (kern_guided_spans): each a 1/(2 nth) share of
 * what is left of all the matrices, at least DECODE_MIN_CHUNK_BYTES, so that
 * the first ones stream long and the last are short and the threads reach
 * the barrier together (with 4 even chunks per thread the one that took the
 * last waited on average half a chunk: 1B decode, in-process A/B, 2 threads:
 * Q4_0, Q8_0, Q4_K_M 1-4% faster, F16 14%). Shares of the whole, not of each
 * matrix: a matrix of several (q, k and v) no longer ends in short chunks
 * of its own before the next begins. */
static int64_t guided_spans(int nw, const kern_repacked_mat *mats, int64_t k, int nth,
                            kern_span *out) {
    kern_span_mat sm[KERN_REPACKED_MAX];
    for (int w = 0; w < nw; w++)
        sm[w] = (kern_span_mat){(mats[w].n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS,
                                (double)kern_repack_of(mats[w].wtype)->panel_bytes(k), 1};
    return kern_guided_spans(nw, sm, nth, DECODE_MIN_CHUNK_BYTES, DECODE_MAX_SPANS, out);
}

/* Products over one prepared activation set for the pool's tasks. */
typedef struct {
    int nw;
    const kern_repacked_mat *mats;
    int64_t k, m;
    void *work;
    const int64_t *first;
    const kern_span *guided; /* NULL: linear_span */
} repacked_job;

static void repacked_task(void *ctx, int64_t c, int thread) {
    const repacked_job *j = ctx;
    const kern_span sp = j->guided ? j->guided[c] : linear_span(j->nw, j->mats, j->first, c);
    repacked_chunk(j->mats, &sp, j->k, j->m, j->work);
}

/* Products over one prepared activation set, in one run of the pool: a
 * run of panels of one matrix per chunk. */
static void repacked_run(int nw, const kern_repacked_mat *mats, int64_t k, const float *X,
                         int64_t m, void *work) {
    const kern_gemm_ops *g = kern_gemm_of(mats[0].wtype);
    const int T = g->tile_rows;
    const int64_t ntiles = (m + T - 1) / T;
    const size_t tb = g->tile_bytes(k);
    gemm_tiles tiles = {g, X, k, m, work, tb};
    double macs = 0;
    for (int w = 0; w < nw; w++) macs += (double)mats[w].n_out * (double)k * (double)m;
    const bool par = macs >= MATMUL_PARALLEL_MIN_MACS;
    const int nth = par ? kvl_pool_threads() : 1;
    /* Chunks of panels: for one tile (decode) contiguous runs that stream the
     * weights (guided_spans), taken dynamically so a thread slowed down by the
     * rest of the machine does not hold the others at the barrier; for several
     * tiles, chunks of about GEMM_CHUNK_BYTES stay in L2 while the tiles
     * stream past. */
    int64_t first[KERN_REPACKED_MAX + 1];
    first[0] = 0;
    for (int w = 0; w < nw; w++) {
        const int64_t np = (mats[w].n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
        int64_t nc;
        if (ntiles == 1) {
            nc = 4 * nth;
        } else {
            int64_t per =
                (int64_t)(GEMM_CHUNK_BYTES / kern_repack_of(mats[w].wtype)->panel_bytes(k));
            if (per < 1) per = 1;
            nc = (np + per - 1) / per;
            nc = (nc + nth - 1) / nth * nth;
        }
        first[w + 1] = first[w] + (nc < np ? nc : np);
    }
    kern_span guided[DECODE_MAX_SPANS];
    const int64_t n_guided = ntiles == 1 && par ? guided_spans(nw, mats, k, nth, guided) : 0;
    const int64_t n_chunks = n_guided ? n_guided : first[nw];
    /* (no zeroing of the last tile's unused rows: the repacked kernels are
     * instantiated per count of rows and never read them) */
    /* one tile is prepared here, saving the pool a round */
    const bool serial_prepare = ntiles == 1 || !par;
    if (serial_prepare)
        for (int64_t i = 0; i < m; i++) tiles_prepare_row(&tiles, i);
    repacked_job j = {nw, mats, k, m, work, first, n_guided ? guided : NULL};
    if (!par) { /* on this thread: waking the pool would cost more */
        for (int64_t c = 0; c < n_chunks; c++) repacked_task(&j, c, 0);
        return;
    }
    if (!serial_prepare) kvl_pool_run(prepare_task, &tiles, m);
    kvl_pool_run(repacked_task, &j, n_chunks);
}

static void repacked_fail(int nw, const kern_repacked_mat *mats, int64_t m, const char *why) {
    kvl_log(KVL_LOG_ERROR, "kern_matmul_repacked: %s", why);
    for (int w = 0; w < nw; w++)
        for (int64_t i = 0; i < mats[w].n_out * m; i++) mats[w].Y[i] = NAN;
}

void kern_matmul_repacked_multi(int nw, const kern_repacked_mat *mats, int64_t k, const float *X,
                                int64_t m, void *work) {
    if (nw <= 0 || m <= 0) return;
    if (nw > KERN_REPACKED_MAX || !work) {
        repacked_fail(nw, mats, m, work ? "too many matrices" : "no work buffer");
        return;
    }
    for (int w = 0; w < nw; w++)
        if (!kern_repack_bytes(mats[w].wtype, mats[w].n_out, k) ||
            kern_gemm_of(mats[w].wtype)->prepare != kern_gemm_of(mats[0].wtype)->prepare) {
            repacked_fail(nw, mats, m, "no repacked layout, or activations prepared differently");
            return;
        }
    repacked_run(nw, mats, k, X, m, work);
}

bool kern_repacked_share_input(int wtype_a, int wtype_b) {
    const kern_gemm_ops *a = kern_gemm_of(wtype_a), *b = kern_gemm_of(wtype_b);
    return a && b && kern_repack_of(wtype_a) && kern_repack_of(wtype_b) && a->prepare == b->prepare;
}

/* ------------------------------------------ repacked, one X each -- */

static size_t each_tile_bytes(const kern_repacked_one *mt) {
    return (kern_gemm_of(mt->wtype)->tile_bytes(mt->k) + 63) & ~(size_t)63;
}

size_t kern_matmul_repacked_each_work_bytes(int nw, const kern_repacked_one *mats) {
    size_t b = 64; /* alignment slack */
    for (int w = 0; w < nw; w++)
        if (kern_gemm_of(mats[w].wtype)) b += each_tile_bytes(&mats[w]);
    return b;
}

typedef struct {
    const kern_repacked_one *mats;
    const void *const *tiles; /* the prepared x of each matrix */
    const kern_span *spans;
} each_job;

static void each_task(void *ctx, int64_t c, int thread) {
    const each_job *j = ctx;
    const kern_span *sp = &j->spans[c];
    const kern_repacked_one *mt = &j->mats[sp->mat];
    kern_repacked_panels(mt->wtype, mt->P, mt->n_out, mt->k, sp->p0, sp->p1, j->tiles[sp->mat], 1,
                         mt->y);
}

/* kern_guided_spans for one min_bytes: the count, or 0 if more than max. */
static int64_t guided_spans_at(int nw, const kern_span_mat *mats, int nth, size_t min_bytes,
                               int64_t max, kern_span *out) {
    double left = 0;
    for (int w = 0; w < nw; w++) left += (double)mats[w].np * mats[w].pb * (double)mats[w].ntiles;
    int64_t n = 0;
    for (int w = 0; w < nw; w++) {
        const kern_span_mat *mt = &mats[w];
        for (int64_t p = 0; p < mt->np;) {
            double want = left / (2.0 * nth) / (double)mt->ntiles; /* bytes of panels */
            if (mt->ntiles > 1 && want > GEMM_CHUNK_BYTES) want = GEMM_CHUNK_BYTES;
            if (want < (double)min_bytes) want = (double)min_bytes;
            int64_t len = (int64_t)(want / mt->pb + 0.5);
            if (len < 1) len = 1;
            if (len > mt->np - p) len = mt->np - p;
            if (n == max) return 0;
            out[n++] = (kern_span){w, (int32_t)p, (int32_t)(p + len)};
            p += len;
            left -= (double)len * mt->pb * (double)mt->ntiles;
        }
    }
    return n;
}

int64_t kern_guided_spans(int nw, const kern_span_mat *mats, int nth, size_t min_bytes, int64_t max,
                          kern_span *out) {
    int64_t n = 0;
    for (; !n; min_bytes *= 2) n = guided_spans_at(nw, mats, nth, min_bytes, max, out);
    return n;
}

/* Whether kern_matmul_repacked_each can run mats (else their y are NaN and the error logged). */
static bool each_usable(int nw, const kern_repacked_one *mats, const void *work, const char *who) {
    bool ok = nw <= KERN_EACH_MAX && work;
    for (int w = 0; ok && w < nw; w++)
        ok = kern_repack_bytes(mats[w].wtype, mats[w].n_out, mats[w].k) > 0;
    if (ok) return true;
    kvl_log(KVL_LOG_ERROR, "%s: too many matrices, no work buffer or no repacked layout", who);
    for (int w = 0; w < nw; w++)
        for (int64_t i = 0; i < mats[w].n_out; i++) mats[w].y[i] = NAN;
    return false;
}

/* Prepares each distinct input of mats once, from *next on (64-byte
 * aligned), into tiles[w]; returns the multiply-adds of all. */
static double each_prepare(int nw, const kern_repacked_one *mats, const void **tiles, char **next) {
    double macs = 0;
    for (int w = 0; w < nw; w++) {
        const kern_gemm_ops *g = kern_gemm_of(mats[w].wtype);
        macs += (double)mats[w].n_out * (double)mats[w].k;
        tiles[w] = NULL;
        for (int v = 0; v < w && !tiles[w]; v++)
            if (mats[v].x == mats[w].x && mats[v].k == mats[w].k &&
                kern_gemm_of(mats[v].wtype)->prepare == g->prepare)
                tiles[w] = tiles[v];
        if (tiles[w]) continue;
        g->prepare(mats[w].x, *next, 0, 1, mats[w].k);
        tiles[w] = *next;
        *next += each_tile_bytes(&mats[w]);
    }
    return macs;
}

/* Decode's guided chunks over mats (in order); returns how many. */
static int64_t each_spans(int nw, const kern_repacked_one *mats, int nth, kern_span *spans) {
    kern_span_mat sm[KERN_EACH_MAX];
    for (int w = 0; w < nw; w++)
        sm[w] = (kern_span_mat){(mats[w].n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS,
                                (double)kern_repack_of(mats[w].wtype)->panel_bytes(mats[w].k), 1};
    return kern_guided_spans(nw, sm, nth, DECODE_MIN_CHUNK_BYTES, DECODE_MAX_SPANS, spans);
}

void kern_matmul_repacked_each(int nw, const kern_repacked_one *mats, void *work) {
    if (nw <= 0 || !each_usable(nw, mats, work, "kern_matmul_repacked_each")) return;
    /* each distinct input prepared once, here */
    const void *tiles[KERN_EACH_MAX];
    char *next = (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    const double macs = each_prepare(nw, mats, tiles, &next);
    const int nth = macs >= MATMUL_PARALLEL_MIN_MACS ? kvl_pool_threads() : 1;
    kern_span spans[DECODE_MAX_SPANS];
    const int64_t n = each_spans(nw, mats, nth, spans);
    each_job j = {mats, tiles, spans};
    if (nth == 1) {
        for (int64_t c = 0; c < n; c++) each_task(&j, c, 0);
        return;
    }
    kvl_pool_run(each_task, &j, n);
}

size_t kern_matmul_repacked_gated_work_bytes(int ne, const kern_repacked_one *gu,
                                             const kern_repacked_one *down) {
    return kern_matmul_repacked_each_work_bytes(2 * ne, gu) +
           kern_matmul_repacked_each_work_bytes(ne, down);
}

/* kern_matmul_repacked_gated's region: the chunks of gu's matrices, then
 * those of down's (mat 2 ne + e: down[e]). */
typedef struct {
    const kern_repacked_one *mats; /* gu[0 .. 2 ne), then down[0 .. ne) */
    const void **tiles;            /* each matrix's prepared x (down's: once ready) */
    const kern_span *spans;
    int ne;
    _Atomic int32_t *left;  /* [ne]: chunks of expert e's gate and up not yet done */
    _Atomic int32_t *ready; /* [ne]: down[e]'s input prepared in tiles[2 ne + e] */
    kern_gated_act_fn act;
    void *ctx;
} gated_job;

static inline void spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void gated_task(void *vctx, int64_t c, int thread) {
    const gated_job *j = vctx;
    const kern_span *sp = &j->spans[c];
    const kern_repacked_one *mt = &j->mats[sp->mat];
    const int down = sp->mat >= 2 * j->ne, e = down ? sp->mat - 2 * j->ne : sp->mat / 2;
    /* Every gate/up chunk comes before any down chunk in the region's order,
     * so when a thread takes a down chunk each chunk it may wait for is
     * running on another thread, or done: the wait always ends. */
    if (down)
        while (!atomic_load_explicit(&j->ready[e], memory_order_acquire)) spin_pause();
    kern_repacked_panels(mt->wtype, mt->P, mt->n_out, mt->k, sp->p0, sp->p1, j->tiles[sp->mat], 1,
                         mt->y);
    /* the last of expert e's gate/up chunks (acq_rel: it sees the others' y) */
    if (!down && atomic_fetch_sub_explicit(&j->left[e], 1, memory_order_acq_rel) == 1) {
        const kern_repacked_one *d = &j->mats[2 * j->ne + e];
        j->act(j->ctx, e);
        kern_gemm_of(d->wtype)->prepare(d->x, (void *)j->tiles[2 * j->ne + e], 0, 1, d->k);
        atomic_store_explicit(&j->ready[e], 1, memory_order_release);
    }
    (void)thread;
}

void kern_matmul_repacked_gated(int ne, const kern_repacked_one *gu, const kern_repacked_one *down,
                                kern_gated_act_fn act, void *ctx, void *work) {
    if (ne <= 0) return;
    if (3 * ne > KERN_EACH_MAX) { /* the three steps, each in its own region */
        const size_t first = kern_matmul_repacked_each_work_bytes(2 * ne, gu);
        kern_matmul_repacked_each(2 * ne, gu, work);
        for (int e = 0; e < ne; e++) act(ctx, e);
        kern_matmul_repacked_each(ne, down, work ? (char *)work + first : NULL);
        return;
    }
    kern_repacked_one mats[KERN_EACH_MAX];
    memcpy(mats, gu, (size_t)(2 * ne) * sizeof *mats);
    memcpy(mats + 2 * ne, down, (size_t)ne * sizeof *mats);
    if (!each_usable(3 * ne, mats, work, "kern_matmul_repacked_gated")) return;
    /* gate and up's inputs prepared here; each down input gets its place */
    const void *tiles[KERN_EACH_MAX];
    char *next = (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    double macs = each_prepare(2 * ne, mats, tiles, &next);
    for (int e = 0; e < ne; e++) {
        tiles[2 * ne + e] = next;
        next += each_tile_bytes(&mats[2 * ne + e]);
        macs += (double)down[e].n_out * (double)down[e].k;
    }
    const int nth = macs >= MATMUL_PARALLEL_MIN_MACS ? kvl_pool_threads() : 1;
    kern_span spans[DECODE_MAX_SPANS];
    const int64_t n = each_spans(3 * ne, mats, nth, spans);
    _Atomic int32_t left[KERN_EACH_MAX], ready[KERN_EACH_MAX];
    for (int e = 0; e < ne; e++) {
        atomic_init(&left[e], 0);
        atomic_init(&ready[e], 0);
    }
    for (int64_t c = 0; c < n && spans[c].mat < 2 * ne; c++)
        atomic_fetch_add(&left[spans[c].mat / 2], 1);
    gated_job j = {mats, tiles, spans, ne, left, ready, act, ctx};
    if (nth == 1) { /* in order: every gate/up chunk before any down chunk */
        for (int64_t c = 0; c < n; c++) gated_task(&j, c, 0);
        return;
    }
    kvl_pool_run(gated_task, &j, n);
}

void kern_matmul_repacked(const void *P, int wtype, int64_t n_out, int64_t k, const float *X,
                          int64_t m, float *Y, void *work) {
    const kern_repacked_mat mat = {P, wtype, n_out, Y};
    kern_matmul_repacked_multi(1, &mat, k, X, m, work);
}
