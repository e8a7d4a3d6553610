/* gemma3n's AltUp and LAuReL, as llama.cpp's gemma3n graph computes them.
 *
 * The residual is four streams of E values a token. Stream 0 is the one the
 * layer runs on: before the layer, a router (tanh of a projection of the
 * RMS-normed stream 0) gives 16 coefficients that predict every stream from
 * all four; the layer runs on the prediction of stream 0; after it, the
 * router of the layer's output gives 4 coefficients that spread the
 * innovation (output - prediction) over the predictions. LAuReL adds a
 * low-rank (64) branch beside attention. The streams come from the embedding
 * through altup_proj (magnitudes kept) and go back to one row through
 * altup_unembd_proj, averaged.
 *
 * Products of 4 values (the coefficients, the predictions) are computed as
 * ggml's vec_dot_f32 leaves them for so short a row: one float sum, fused
 * multiply-adds in order; sums of rows (magnitudes, means) in double, as
 * ggml_vec_sum_f32. */
#include <math.h>
#include <string.h>

#include "model_internal.h"

/* m->alt: streams S [U][4][E], predictions P [U][4][E], LAuReL rows [U][64],
 * two row buffers [U][E], router outputs [U][4], coefficients [U][16]. */
typedef struct {
    float *s, *p, *lr, *t, *q, *mod, *coef;
} altup_bufs;

static altup_bufs bufs(const model *m) {
    const int64_t U = m->mp.max_ubatch, E = m->hp.n_embd;
    altup_bufs b;
    b.s = m->alt;
    b.p = b.s + U * ALTUP_N * E;
    b.lr = b.p + U * ALTUP_N * E;
    b.t = b.lr + U * LAUREL_RANK;
    b.q = b.t + U * E;
    b.mod = b.q + U * E;
    b.coef = b.mod + U * ALTUP_N;
    return b;
}

size_t altup_scratch_floats(const model *m) {
    const int64_t U = m->mp.max_ubatch, E = m->hp.n_embd;
    return (size_t)(U * (2 * ALTUP_N * E + LAUREL_RANK + 2 * E + ALTUP_N + ALTUP_N * ALTUP_N));
}

/* ggml_vec_dot_f32 of 4 values: below its SIMD step, one float sum of fmas. */
static float dot4(const float *a, const float *b) {
    float s = 0.0f;
    for (int i = 0; i < ALTUP_N; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* sqrt of the sum of squares: ggml_sqr, ggml_sum_rows (double), ggml_sqrt. */
static float magnitude(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)(x[i] * x[i]);
    return sqrtf((float)s);
}

/* tanh(router (RMSNorm(x) / E)) for each row of x [n][E], into mod [n][4]. */
static void route(model *m, const layer_weights *L, const float *x, int64_t n, float *tmp,
                  float *mod) {
    const int64_t E = m->hp.n_embd;
    op_rms_norm(tmp, x, L->altup_router_norm.data, n, E, m->hp.rms_eps);
    const float inv_e = 1.0f / (float)E;
    for (int64_t i = 0; i < n * E; i++) tmp[i] *= inv_e;
    op_matmul(m, &L->altup_router, tmp, n, mod);
    for (int64_t i = 0; i < n * ALTUP_N; i++) mod[i] = tanhf(mod[i]);
}

/* The rows of x, each scaled to the magnitude of the matching row of ref
 * (altup_proj's and altup_unembd_proj's outputs): x * |ref| / |x|. */
static void match_magnitude(float *x, const float *ref, int64_t E) {
    const float want = magnitude(ref, E), have = magnitude(x, E);
    for (int64_t e = 0; e < E; e++) x[e] = x[e] * want / have;
}

void altup_embed(model *m, const float *x, int64_t n) {
    const int64_t E = m->hp.n_embd;
    const altup_bufs b = bufs(m);
    for (int64_t t = 0; t < n; t++) memcpy(b.s + t * ALTUP_N * E, x + t * E, E * sizeof(float));
    for (int i = 1; i < ALTUP_N; i++) {
        op_matmul_head(m, &m->altup_proj, i - 1, x, n, b.t);
        for (int64_t t = 0; t < n; t++) {
            match_magnitude(b.t + t * E, x + t * E, E);
            memcpy(b.s + (t * ALTUP_N + i) * E, b.t + t * E, E * sizeof(float));
        }
    }
}

void altup_predict(model *m, const layer_weights *L, int64_t n, float *x) {
    const int64_t E = m->hp.n_embd;
    const altup_bufs b = bufs(m);
    for (int64_t t = 0; t < n; t++) memcpy(b.q + t * E, b.s + t * ALTUP_N * E, E * sizeof(float));
    route(m, L, b.q, n, b.t, b.mod);
    const float *pc = L->altup_predict_coef.data; /* [16][4] */
    for (int64_t t = 0; t < n; t++) {
        float *co = b.coef + t * ALTUP_N * ALTUP_N;
        for (int r = 0; r < ALTUP_N * ALTUP_N; r++)
            co[r] = dot4(pc + r * ALTUP_N, b.mod + t * ALTUP_N);
        const float *s = b.s + t * ALTUP_N * E;
        float *p = b.p + t * ALTUP_N * E;
        for (int j = 0; j < ALTUP_N; j++)
            for (int64_t e = 0; e < E; e++) {
                const float v[ALTUP_N] = {s[e], s[E + e], s[2 * E + e], s[3 * E + e]};
                p[j * E + e] = dot4(v, co + j * ALTUP_N) + s[j * E + e];
            }
        memcpy(x + t * E, p, E * sizeof(float));
    }
}

void altup_laurel(model *m, const layer_weights *L, const float *h, int64_t n, float *out) {
    const int64_t E = m->hp.n_embd;
    const altup_bufs b = bufs(m);
    op_matmul(m, &L->laurel_l, h, n, b.lr);
    op_matmul(m, &L->laurel_r, b.lr, n, out);
    op_rms_norm(out, out, L->laurel_post_norm.data, n, E, m->hp.rms_eps);
    for (int64_t i = 0; i < n * E; i++) out[i] = out[i] + h[i];
}

void altup_correct(model *m, const layer_weights *L, int il, const float *y, int64_t n) {
    const int64_t E = m->hp.n_embd;
    const altup_bufs b = bufs(m);
    route(m, L, y, n, b.t, b.mod);
    const float *cc = L->altup_correct_coef.data, *cs = L->altup_correct_scale.data; /* [4][4] */
    for (int64_t t = 0; t < n; t++) {
        float co[ALTUP_N];
        for (int j = 0; j < ALTUP_N; j++)
            co[j] = dot4(cc + j * ALTUP_N, b.mod + t * ALTUP_N) + 1.0f;
        const float *p = b.p + t * ALTUP_N * E, *yt = y + t * E;
        float *s = b.s + t * ALTUP_N * E;
        for (int j = 0; j < ALTUP_N; j++)
            for (int64_t e = 0; e < E; e++) s[j * E + e] = (yt[e] - p[e]) * co[j] + p[j * E + e];
        for (int64_t e = 0; e < E; e++) b.t[t * E + e] = s[e] * cs[e];
    }
    /* the per-layer input, gated by the corrected stream 0, into streams 1-3 */
    per_layer_branch(m, L, il, b.t, n, b.q);
    for (int64_t t = 0; t < n; t++)
        for (int j = 1; j < ALTUP_N; j++)
            for (int64_t e = 0; e < E; e++)
                b.s[(t * ALTUP_N + j) * E + e] = b.s[(t * ALTUP_N + j) * E + e] + b.q[t * E + e];
}

float *altup_streams(model *m) { return bufs(m).s; }

void altup_unembed(model *m, float *x, int64_t n) {
    const int64_t E = m->hp.n_embd;
    const altup_bufs b = bufs(m);
    for (int64_t t = 0; t < n; t++) memcpy(x + t * E, b.s + t * ALTUP_N * E, E * sizeof(float));
    for (int i = 1; i < ALTUP_N; i++) {
        for (int64_t t = 0; t < n; t++)
            memcpy(b.q + t * E, b.s + (t * ALTUP_N + i) * E, E * sizeof(float));
        op_matmul_head(m, &m->altup_unembd_proj, i - 1, b.q, n, b.t);
        for (int64_t t = 0; t < n; t++) {
            match_magnitude(b.t + t * E, b.s + t * ALTUP_N * E, E);
            for (int64_t e = 0; e < E; e++) x[t * E + e] = x[t * E + e] + b.t[t * E + e];
        }
    }
    const float inv = 1.0f / (float)ALTUP_N;
    for (int64_t i = 0; i < n * E; i++) x[i] *= inv;
}

void altup_gaussian_topk(float *x, int64_t rows, int64_t n) {
    const float std_mul = 1.6448533535003662f; /* the normal distribution's 95% point */
    for (int64_t r = 0; r < rows; r++) {
        float *v = x + r * n;
        double ss;
        const float mean = op_row_moments(v, n, &ss);
        const float sd = sqrtf((float)ss * (1.0f / (float)(n - 1)));
        const float cut = mean + sd * std_mul;
        for (int64_t i = 0; i < n; i++) {
            const float d = v[i] - cut;
            v[i] = d > 0.0f ? d : 0.0f;
        }
    }
}
