/* kernels: many repacked matrices, each applied to a few activation rows of
 * its own, in one parallel region (a batched decode step of a
 * mixture-of-experts layer: every selected expert's gate and up on the rows of
 * the tokens that chose it, then every expert's down).
 *
 * kern_matmul_repacked_each (kernels.h) does this for one row per matrix;
 * here each matrix has m >= 1 rows, given as row pointers (no gather). The
 * rows of every distinct input (the same row-pointer array, k and activation
 * layout: an expert's gate and up share one) are prepared once, in parallel,
 * optionally after a caller's hook has written the row (an activation
 * computed from the previous products); then all products run as one set of
 * chunks of panels: a matrix of one activation tile in guided runs that
 * stream its weights, a matrix of several tiles in chunks that stay in L2
 * while its tiles pass. Each output element is exactly what
 * kern_matmul_repacked gives for that matrix and those rows. */
#ifndef KVLLM_KERNELS_GROUPED_H
#define KVLLM_KERNELS_GROUPED_H

#include "kernels.h"

#define KERN_ROWS_MAX_MATS 512 /* matrices in one call */

typedef struct kern_repacked_rows {
    const void *P; /* repacked (kern_repack) */
    int wtype;
    int64_t n_out, k, m;
    const float *const *x; /* m row pointers, k floats each */
    float *y;              /* [m][n_out] */
} kern_repacked_rows;

/* Called for row `row` of matrix `mat`'s input before it is prepared (the
 * first matrix that has that input); may write the row. Runs on any thread. */
typedef void (*kern_rows_hook)(void *ctx, int mat, int64_t row);

/* Work for kern_matmul_repacked_rows: at most `inputs` distinct inputs of
 * wtype and width k holding `rows` rows in all. */
size_t kern_matmul_repacked_rows_work_bound(int wtype, int64_t k, int64_t rows, int64_t inputs);
/* Whether wtype has a repacked layout for an n_out x k matrix on this ISA. */
bool kern_repacked_rows_ok(int wtype, int64_t n_out, int64_t k);
/* All products; work holds the bound of the matrices' inputs (summed over
 * their types and widths). hook may be NULL. */
void kern_matmul_repacked_rows(int nw, const kern_repacked_rows *mats, kern_rows_hook hook,
                               void *ctx, void *work);

#endif
