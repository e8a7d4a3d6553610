/* kernels: matrix multiply against a quantized weight matrix, and row lookup.
 *
 * Every output element y[i][j] is computed by one kernel call on (W row j,
 * quantized X row i) with the fixed reduction order of kern_impl.h, so results
 * do not depend on m, the thread count, the chunking or the path taken (plain
 * vec_dot, a rows kernel, or prepared activations): all are bit-identical. */
#include "kern_impl.h"

#include <omp.h>

/* W rows are processed in chunks of about this many bytes: a chunk stays in L2
 * while all m activation rows stream past it, so W is read from memory once. */
#define MATMUL_CHUNK_BYTES (48 * 1024)
/* Below this many multiply-adds a matmul runs on the calling thread: waking
 * the team would cost more than it saves. */
#define MATMUL_PARALLEL_MIN_MACS (1 << 17)

/* How one matmul runs: how X is quantized, its row size, and the kernel. */
typedef struct {
    kern_from_float_fn quantize; /* NULL: X is used in place (F32) */
    size_t xrow, wrow;
    kern_vec_dot_fn dot; /* used when rows is NULL */
    kern_vec_dot_rows_fn rows;
} mm_plan;

static bool mm_make_plan(int wtype, int64_t k, int64_t m, mm_plan *p) {
    const kern_traits *t = kern_traits_of(wtype);
    if (!t || !t->vec_dot || k <= 0 || k % t->block_elems) return false;
    const kern_prep_ops *prep = kern_prep_of(wtype);
    const kern_vec_dot_rows_fn rows = kern_rows_of(wtype);
    *p = (mm_plan){kern_traits_of(t->vec_dot_type)->from_float, kern_row_bytes(t->vec_dot_type, k),
                   kern_row_bytes(wtype, k), t->vec_dot, rows && m > 1 ? rows : NULL};
    if (prep) {
        p->quantize = prep->prepare;
        p->xrow = kern_q8p_row_bytes(k);
        p->rows = prep->rows;
    } else if (t->vec_dot_type == GGUF_DT_F32) {
        p->quantize = NULL;
        p->xrow = (size_t)k * sizeof(float);
    }
    return true;
}

/* Independent of the ISA chosen, so a buffer sized before kern_init still fits. */
size_t kern_matmul_work_bytes(int wtype, int64_t m, int64_t k) {
    const kern_traits *t = kern_traits_ref(wtype);
    if (!t || !t->vec_dot || m <= 0 || k <= 0) return 0;
    if (t->vec_dot_type == GGUF_DT_F32) return 0; /* X is used in place */
    size_t row = kern_row_bytes(t->vec_dot_type, k);
    if (t->vec_dot_type == GGUF_DT_Q8_0 && kern_q8p_row_bytes(k) > row) row = kern_q8p_row_bytes(k);
    return (size_t)m * row;
}

static int64_t chunk_rows(size_t wrow_bytes, int64_t n_out) {
    int64_t rows = wrow_bytes ? (int64_t)(MATMUL_CHUNK_BYTES / wrow_bytes) : n_out;
    if (rows < 1) rows = 1;
    if (rows > 64) rows = 64;
    return rows;
}

/* Output rows j0..j1 for all m activation rows. With a rows kernel each weight
 * row is decoded once per group of up to KERN_ROWS_MAX activation rows. */
static void mm_chunk(const mm_plan *p, const char *w, int64_t j0, int64_t j1, int64_t k,
                     const char *xq, int64_t m, float *Y, int64_t n_out) {
    if (!p->rows) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = j0; j < j1; j++)
                p->dot(k, &Y[i * n_out + j], w + (size_t)j * p->wrow, xq + (size_t)i * p->xrow);
        return;
    }
    for (int64_t i = 0; i < m; i += KERN_ROWS_MAX) {
        const int nr = m - i < KERN_ROWS_MAX ? (int)(m - i) : KERN_ROWS_MAX;
        for (int64_t j = j0; j < j1; j++)
            p->rows(k, &Y[i * n_out + j], (size_t)n_out, w + (size_t)j * p->wrow,
                    xq + (size_t)i * p->xrow, p->xrow, nr);
    }
}

void kern_matmul(const void *W, int wtype, int64_t n_out, int64_t k, const float *X, int64_t m,
                 float *Y, void *work) {
    mm_plan p;
    const bool ok = mm_make_plan(wtype, k, m, &p);
    if (!ok || (p.quantize && !work && m > 0)) {
        kvl_log(KVL_LOG_ERROR, "kern_matmul: %s (weight type %d, k = %lld)",
                ok ? "no work buffer" : "no kernel", wtype, (long long)k);
        for (int64_t i = 0; i < n_out * m; i++) Y[i] = NAN;
        return;
    }
    const char *xq = p.quantize ? (const char *)work : (const char *)X;
    const int64_t crows = chunk_rows(p.wrow, n_out);
    const int64_t nchunks = (n_out + crows - 1) / crows;
    const bool par = (double)n_out * (double)k * (double)m >= MATMUL_PARALLEL_MIN_MACS;

#pragma omp parallel if (par)
    {
        if (p.quantize) {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < m; i++) p.quantize(X + i * k, (char *)work + i * p.xrow, k);
        }
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            const int64_t j0 = c * crows, j1 = j0 + crows < n_out ? j0 + crows : n_out;
            mm_chunk(&p, W, j0, j1, k, xq, m, Y, n_out);
        }
    }
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
