/* kernels: many repacked matrices, each on a few rows of its own, in one
 * parallel region (kernels_grouped.h).
 *
 * Why: a 16-sequence decode step of gpt-oss-20b (32 experts, 4 used) selects
 * nearly every expert with about two rows each; run expert by expert, each
 * expert's gate+up and down were a parallel region of their own (~60 per
 * layer), the caller quantizing the rows and applying the activation between
 * them while the other threads waited. Here a layer's experts take two
 * regions of products, each after one region of preparing (and, for down,
 * activating) rows. The kernels and the prepared tiles are the ones
 * kern_matmul_repacked uses, so every output is bit-identical to it. */
#include "kern_impl.h"
#include "kernels_grouped.h"

#include "kvl_pool.h"

#include <string.h>

/* As matmul.c: below this many multiply-adds all runs on the calling thread. */
#define ROWS_PARALLEL_MIN_MACS (1 << 17)
/* One-tile matrices stream in guided runs of at least this many bytes. */
#define ROWS_MIN_CHUNK_BYTES (160 * 1024)
#define ROWS_MAX_SPANS       4096

/* An input's tiles lie tile_bytes apart (as the kernels step through them),
 * each input's first at a 64-byte boundary. */
static size_t input_bytes(int wtype, int64_t k, int64_t m) {
    const kern_gemm_ops *g = kern_gemm_of(wtype);
    return ((size_t)((m + g->tile_rows - 1) / g->tile_rows) * g->tile_bytes(k) + 63) & ~(size_t)63;
}

bool kern_repacked_rows_ok(int wtype, int64_t n_out, int64_t k) {
    return kern_repack_bytes(wtype, n_out, k) > 0;
}

size_t kern_matmul_repacked_rows_work_bound(int wtype, int64_t k, int64_t rows, int64_t inputs) {
    const kern_gemm_ops *g = kern_gemm_of(wtype);
    if (!g || rows <= 0 || inputs <= 0) return 64;
    /* sum of ceil(m_i / T) <= rows / T + inputs */
    const int64_t tiles = rows / g->tile_rows + inputs;
    return 64 + (size_t)tiles * g->tile_bytes(k) + (size_t)inputs * 64;
}

typedef struct {
    const kern_repacked_rows *mats;
    const void *const *tiles; /* [nw] the prepared input of each matrix */
    const int32_t *owner;     /* [nw] the first matrix with the same input */
    /* preparing: the rows of the owners, task t -> (matrix, row) */
    const int64_t *row0; /* [nw + 1] first task of each matrix (0 rows if not an owner) */
    int nw;
    kern_rows_hook hook;
    void *ctx;
    const kern_span *spans;
} rows_job;

static void prepare_task(void *vctx, int64_t t, int thread) {
    const rows_job *j = vctx;
    int w = 0;
    while (t >= j->row0[w + 1]) w++; /* (nw is small; a step's inputs) */
    const int64_t i = t - j->row0[w];
    const kern_repacked_rows *mt = &j->mats[w];
    if (j->hook) j->hook(j->ctx, w, i);
    const kern_gemm_ops *g = kern_gemm_of(mt->wtype);
    const int T = g->tile_rows;
    const int64_t t0 = i / T * T;
    g->prepare(mt->x[i], (char *)j->tiles[w] + (size_t)(i / T) * g->tile_bytes(mt->k),
               (int)(i - t0), mt->m - t0 < T ? (int)(mt->m - t0) : T, mt->k);
}

static void product_task(void *vctx, int64_t c, int thread) {
    const rows_job *j = vctx;
    const kern_span *sp = &j->spans[c];
    const kern_repacked_rows *mt = &j->mats[sp->mat];
    kern_repacked_panels(mt->wtype, mt->P, mt->n_out, mt->k, sp->p0, sp->p1, j->tiles[sp->mat],
                         mt->m, mt->y);
}

static void rows_fail(int nw, const kern_repacked_rows *mats, const char *why) {
    kvl_log(KVL_LOG_ERROR, "kern_matmul_repacked_rows: %s", why);
    for (int w = 0; w < nw; w++)
        for (int64_t i = 0; i < mats[w].n_out * mats[w].m; i++) mats[w].y[i] = NAN;
}

void kern_matmul_repacked_rows(int nw, const kern_repacked_rows *mats, kern_rows_hook hook,
                               void *ctx, void *work) {
    if (nw <= 0) return;
    if (nw > KERN_ROWS_MAX_MATS || !work) {
        rows_fail(nw, mats, work ? "too many matrices" : "no work buffer");
        return;
    }
    for (int w = 0; w < nw; w++)
        if (!kern_repacked_rows_ok(mats[w].wtype, mats[w].n_out, mats[w].k) || mats[w].m <= 0) {
            rows_fail(nw, mats, "no repacked layout, or no rows");
            return;
        }
    /* the distinct inputs: tiles laid out in the work buffer */
    const void *tiles[KERN_ROWS_MAX_MATS];
    int32_t owner[KERN_ROWS_MAX_MATS];
    int64_t row0[KERN_ROWS_MAX_MATS + 1];
    char *next = (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    double macs = 0;
    row0[0] = 0;
    for (int w = 0; w < nw; w++) {
        const kern_repacked_rows *mt = &mats[w];
        const kern_gemm_ops *g = kern_gemm_of(mt->wtype);
        macs += (double)mt->n_out * (double)mt->k * (double)mt->m;
        owner[w] = w;
        for (int v = 0; v < w && owner[w] == w; v++)
            if (mats[v].x == mt->x && mats[v].m == mt->m && mats[v].k == mt->k &&
                kern_gemm_of(mats[v].wtype)->prepare == g->prepare)
                owner[w] = owner[v];
        if (owner[w] != w) {
            tiles[w] = tiles[owner[w]];
            row0[w + 1] = row0[w];
            continue;
        }
        tiles[w] = next;
        next += input_bytes(mt->wtype, mt->k, mt->m);
        row0[w + 1] = row0[w] + mt->m;
    }
    const int nth = macs >= ROWS_PARALLEL_MIN_MACS ? kvl_pool_threads() : 1;
    /* the chunks, guided over all matrices (bytes of panels x tiles) */
    kern_span_mat sm[KERN_ROWS_MAX_MATS];
    for (int w = 0; w < nw; w++) {
        const int T = kern_gemm_of(mats[w].wtype)->tile_rows;
        sm[w] = (kern_span_mat){(mats[w].n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS,
                                (double)kern_repack_of(mats[w].wtype)->panel_bytes(mats[w].k),
                                (mats[w].m + T - 1) / T};
    }
    kern_span spans[ROWS_MAX_SPANS];
    const int64_t n = kern_guided_spans(nw, sm, nth, ROWS_MIN_CHUNK_BYTES, ROWS_MAX_SPANS, spans);
    rows_job j = {mats, tiles, owner, row0, nw, hook, ctx, spans};
    if (nth == 1) {
        for (int64_t t = 0; t < row0[nw]; t++) prepare_task(&j, t, 0);
        for (int64_t c = 0; c < n; c++) product_task(&j, c, 0);
        return;
    }
    kvl_pool_run(prepare_task, &j, row0[nw]);
    kvl_pool_run(product_task, &j, n);
}
