/* model ops: the elementwise and attention pieces of the forward pass.
 * Numerics follow ggml where it matters for agreement with llama.cpp: RMSNorm
 * sums squares in double, RoPE angles are built by repeated multiplication,
 * softmax sums in double, and q is converted to the KV cache's type before q.k. */
#include <math.h>
#include <string.h>

#include "model_internal.h"

void op_rms_norm(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float scale = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int64_t i = 0; i < n; i++) o[i] = (xr[i] * scale) * w[i];
    }
}

void op_matmul(model *m, const mtensor *w, const float *x, int64_t rows, float *y) {
    kern_matmul(w->data, w->dtype, w->ne1, w->ne0, x, rows, y, m->work);
}

void op_matmul_head(model *m, const mtensor *w, int64_t head, const float *x, int64_t rows, float *y) {
    const uint8_t *base = (const uint8_t *)w->data + (size_t)head * w->ne1 * kern_row_bytes(w->dtype, w->ne0);
    kern_matmul(base, w->dtype, w->ne1, w->ne0, x, rows, y, m->work);
}

void op_add_bias(float *y, const mtensor *b, int64_t rows, int64_t n) {
    if (!b->data) return;
    const float *bias = b->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) y[r * n + i] += bias[i];
}

void op_rope(const model *m, const layer_weights *L, float *vec, int n_heads, int64_t stride,
             int64_t offset, int32_t pos) {
    const model_hparams *hp = &m->hp;
    int64_t n_rot = hp->n_rot;
    float theta_scale = powf(L->rope_base, -2.0f / (float)n_rot);
    float cs[512], sn[512]; /* n_rot <= head_dim <= 1024: at most 512 pairs */
    float theta = (float)pos;
    for (int64_t i = 0; i < n_rot / 2; i++) {
        float t = theta;
        if (m->rope_freqs) t /= m->rope_freqs[i];
        t *= L->rope_freq_scale;
        cs[i] = cosf(t);
        sn[i] = sinf(t);
        theta *= theta_scale;
    }
    bool neox = hp->rope_type == MODEL_ROPE_NEOX;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + h * stride + offset;
        for (int64_t i = 0; i < n_rot / 2; i++) {
            int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

void op_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* GELU, tanh approximation (what ggml_gelu computes). */
void op_gelu_mul(float *g, const float *u, int64_t n) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x))) * u[i];
    }
}

static const uint8_t *kv_row(const kv_pool *kv, const kv_seq *s, int slot, int32_t j, bool v) {
    const kv_pool_config *c = kv_pool_cfg(kv);
    int32_t blk = s->blocks[j / c->block_size];
    const uint8_t *base = v ? kv_block_v_const(kv, blk, slot) : kv_block_k_const(kv, blk, slot);
    return base + (j % c->block_size) * (v ? kv_pool_v_row_bytes(kv) : kv_pool_k_row_bytes(kv));
}

/* Pointer to head kvh's K (or V) values of position j, converted to f32 into
 * rowbuf unless the type allows reading a head's slice in place (f32, f16). */
static const void *kv_head(const attn_args *a, const kv_seq *s, int32_t j, int kvh, bool v,
                           float *rowbuf) {
    const kv_pool_config *c = kv_pool_cfg(a->kv);
    bool from_k = !v || a->v_in_k;
    int dtype = from_k ? c->dtype : kv_pool_dtype_v(a->kv);
    int64_t width = from_k ? a->dk : a->dv;
    const uint8_t *row = kv_row(a->kv, s, a->slot, j, !from_k);
    if (dtype == GGUF_DT_F32 || dtype == GGUF_DT_F16)
        return row + (size_t)kvh * width * kv_dtype_bytes(dtype);
    kv_row_load(dtype, row, rowbuf, (int64_t)c->n_kv_heads * width);
    return rowbuf + kvh * width;
}

void op_attend_head(const attn_args *a, const kv_seq *s, int32_t pos, int kvh, const float *q,
                    float *out, float *scores, void *qtmp, float *rowbuf) {
    const kv_pool_config *c = kv_pool_cfg(a->kv);
    /* Like ggml's mul_mat, q is converted to the cache's dot type (f16 cache: f16 q);
     * other cache types are widened to f32 row by row. */
    int kdt = c->dtype == GGUF_DT_F16 ? GGUF_DT_F16 : GGUF_DT_F32;
    const kern_traits *tr = kern_traits_of(kdt);
    const void *qd = q;
    if (kdt == GGUF_DT_F16) {
        tr->from_float(q, qtmp, a->dk);
        qd = qtmp;
    }
    int32_t first = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    float maxv = -INFINITY;
    for (int32_t j = first; j <= pos; j++) {
        float d;
        tr->vec_dot(a->dk, &d, kv_head(a, s, j, kvh, false, rowbuf), qd);
        d *= a->scale;
        if (a->softcap > 0) d = a->softcap * tanhf(d / a->softcap);
        scores[j] = d;
        if (d > maxv) maxv = d;
    }
    double sum = 0;
    for (int32_t j = first; j <= pos; j++) {
        float e = expf(scores[j] - maxv);
        scores[j] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    bool v_f16 = (a->v_in_k ? c->dtype : kv_pool_dtype_v(a->kv)) == GGUF_DT_F16;
    memset(out, 0, a->dv * sizeof *out);
    for (int32_t j = first; j <= pos; j++) {
        const void *vr = kv_head(a, s, j, kvh, true, rowbuf);
        float p = scores[j] * inv;
        if (v_f16) {
            const kvl_f16 *vh = vr;
            for (int64_t d = 0; d < a->dv; d++) out[d] += p * kvl_f16_to_f32(vh[d]);
        } else {
            const float *vf = vr;
            for (int64_t d = 0; d < a->dv; d++) out[d] += p * vf[d];
        }
    }
}
