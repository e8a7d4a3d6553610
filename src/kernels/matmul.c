/* kernels: matrix multiply against a quantized weight matrix, and row lookup.
 *
 * Every output element is one vec_dot call on (W row j, quantized X row i), so
 * results do not depend on m, the thread count or the chunking: only on the
 * vec_dot, whose reduction order is fixed (kern_impl.h). */
#include "kern_impl.h"

#include <omp.h>

/* W rows are processed in chunks of about this many bytes: a chunk stays in L2
 * while all m activation rows stream past it, so W is read from memory once. */
#define MATMUL_CHUNK_BYTES (48 * 1024)
/* Below this many multiply-adds a matmul runs on the calling thread: waking
 * the team would cost more than it saves. */
#define MATMUL_PARALLEL_MIN_MACS (1 << 17)

size_t kern_matmul_work_bytes(int wtype, int64_t m, int64_t k) {
    const kern_traits *t = kern_traits_of(wtype);
    if (!t || !t->vec_dot || m <= 0) return 0;
    if (t->vec_dot_type == GGUF_DT_F32) return 0; /* X is used in place */
    return (size_t)m * kern_row_bytes(t->vec_dot_type, k);
}

static int64_t chunk_rows(size_t wrow_bytes, int64_t n_out) {
    int64_t rows = wrow_bytes ? (int64_t)(MATMUL_CHUNK_BYTES / wrow_bytes) : n_out;
    if (rows < 1) rows = 1;
    if (rows > 64) rows = 64;
    return rows;
}

static void matmul_fail(int wtype, int64_t n_out, int64_t m, float *Y) {
    kvl_log(KVL_LOG_ERROR, "kern_matmul: no kernel for weight type %d", wtype);
    for (int64_t i = 0; i < n_out * m; i++) Y[i] = NAN;
}

void kern_matmul(const void *W, int wtype, int64_t n_out, int64_t k, const float *X, int64_t m,
                 float *Y, void *work) {
    const kern_traits *t = kern_traits_of(wtype);
    if (!t || !t->vec_dot || k % t->block_elems) {
        matmul_fail(wtype, n_out, m, Y);
        return;
    }
    const kern_traits *qt = kern_traits_of(t->vec_dot_type);
    const kern_vec_dot_fn dot = t->vec_dot;
    const size_t wrow = kern_row_bytes(wtype, k), xrow = kern_row_bytes(t->vec_dot_type, k);
    const bool in_place = t->vec_dot_type == GGUF_DT_F32;
    const char *xq = in_place ? (const char *)X : (const char *)work;
    const char *w = W;
    const int64_t crows = chunk_rows(wrow, n_out);
    const int64_t nchunks = (n_out + crows - 1) / crows;
    const bool par = (double)n_out * (double)k * (double)m >= MATMUL_PARALLEL_MIN_MACS;

#pragma omp parallel if (par)
    {
        if (!in_place) {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < m; i++) qt->from_float(X + i * k, (char *)work + i * xrow, k);
        }
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            const int64_t j0 = c * crows, j1 = j0 + crows < n_out ? j0 + crows : n_out;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = j0; j < j1; j++)
                    dot(k, &Y[i * n_out + j], w + (size_t)j * wrow, xq + (size_t)i * xrow);
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
