/* model: loading weights from GGUF and the forward pass. See model.h.
 *
 * Pipeline per ubatch (a slice of the ragged batch that fits the scratch):
 *   embed -> for each layer: RMSNorm, Q/K/V projections (+bias, +q/k norm), RoPE,
 *   write K/V into the sequences' blocks, causal attention over each sequence's
 *   blocks, output projection, residual, RMSNorm, SwiGLU FFN, residual
 *   -> final RMSNorm and LM head for the tokens whose logits are wanted.
 * Every op treats tokens independently except attention, which reads only the
 * token's own sequence, so a token's result does not depend on its batch mates. */
#include "model.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "arch.h"

typedef struct mtensor {
    const void *data;
    int dtype;
    int64_t ne0, ne1; /* ne0: row length (input dim), ne1: rows (output dim) */
} mtensor;

typedef struct layer_weights {
    mtensor attn_norm;          /* [E] */
    mtensor wq, wk, wv, wo;     /* [E -> Hq*dk], [E -> Hkv*dk], [E -> Hkv*dv], [Hq*dv -> E] */
    mtensor bq, bk, bv;         /* optional biases */
    mtensor q_norm, k_norm;     /* optional per-head norms [dk] */
    mtensor ffn_norm;           /* [E] */
    mtensor ffn_gate, ffn_up;   /* [E -> F] */
    mtensor ffn_down;           /* [F -> E] */
} layer_weights;

struct model {
    gguf_file *gguf;
    const arch_desc *arch;
    model_hparams hp;
    model_params mp;
    mtensor tok_embd;           /* [E] x n_vocab */
    mtensor output_norm;        /* [E] */
    mtensor output;             /* [E -> n_vocab] (token_embd when tied) */
    const float *rope_freqs;    /* [n_rot/2] or NULL */
    layer_weights *layers;

    /* Scratch, allocated once for max_ubatch tokens. */
    int n_threads_max;
    float *x, *xb, *q, *k, *v, *att, *ff_gate, *ff_up;
    float *scores;    /* [n_threads_max][max_ctx] */
    float *qconv;     /* [n_threads_max][dk] scratch for f16 q conversion */
    void *work;       /* matmul activation quantization */
    float *logit_rows; /* [max_ubatch][E] normed rows to project */
    int32_t *logit_idx;
};

/* ---------------------------------------------------------------- loading -- */

static bool hp_int(const gguf_file *f, const char *arch, const char *suffix, int64_t *out,
                   bool required, kvl_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_get_i64(f, key, out)) return true;
    if (gguf_find_key(f, key) >= 0)
        return kvl_fail(err, "%s: key '%s': expected an integer", gguf_path(f), key);
    if (required) return kvl_fail(err, "%s: key '%s' missing", gguf_path(f), key);
    return true;
}

static bool hp_float(const gguf_file *f, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32(f, key, out);
}

static bool read_hparams(model *m, kvl_error *err) {
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    if (!gguf_get_str_buf(f, "general.architecture", hp->arch, sizeof hp->arch))
        return kvl_fail(err, "%s: key 'general.architecture' missing", gguf_path(f));
    m->arch = arch_find(hp->arch);
    if (!m->arch)
        return kvl_fail(err, "%s: architecture '%s' is not supported (supported: %s)", gguf_path(f),
                        hp->arch, arch_supported_list());
    const char *a = hp->arch;
    hp->n_head_kv = 0;
    hp->head_dim_k = hp->head_dim_v = 0;
    hp->n_rot = 0;
    hp->n_ctx_train = 2048;
    if (!hp_int(f, a, "embedding_length", &hp->n_embd, true, err) ||
        !hp_int(f, a, "block_count", &hp->n_layer, true, err) ||
        !hp_int(f, a, "feed_forward_length", &hp->n_ff, true, err) ||
        !hp_int(f, a, "attention.head_count", &hp->n_head, true, err) ||
        !hp_int(f, a, "attention.head_count_kv", &hp->n_head_kv, false, err) ||
        !hp_int(f, a, "attention.key_length", &hp->head_dim_k, false, err) ||
        !hp_int(f, a, "attention.value_length", &hp->head_dim_v, false, err) ||
        !hp_int(f, a, "rope.dimension_count", &hp->n_rot, false, err) ||
        !hp_int(f, a, "context_length", &hp->n_ctx_train, false, err))
        return false;
    if (hp->n_embd <= 0 || hp->n_embd > (1 << 20) || hp->n_layer <= 0 || hp->n_layer > 4096 ||
        hp->n_head <= 0 || hp->n_head > 4096 || hp->n_ff <= 0 || hp->n_ff > (1 << 22))
        return kvl_fail(err, "%s: implausible hyperparameters (embd %lld, layers %lld, heads %lld, ff %lld)",
                        gguf_path(f), (long long)hp->n_embd, (long long)hp->n_layer,
                        (long long)hp->n_head, (long long)hp->n_ff);
    if (hp->n_head_kv == 0) hp->n_head_kv = hp->n_head;
    if (hp->head_dim_k == 0) hp->head_dim_k = hp->n_embd / hp->n_head;
    if (hp->head_dim_v == 0) hp->head_dim_v = hp->n_embd / hp->n_head;
    if (hp->n_rot == 0) hp->n_rot = hp->head_dim_k;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return kvl_fail(err, "%s: head_count %lld is not a multiple of head_count_kv %lld",
                        gguf_path(f), (long long)hp->n_head, (long long)hp->n_head_kv);
    if (hp->head_dim_k <= 0 || hp->head_dim_k > 1024 || hp->head_dim_v <= 0 ||
        hp->head_dim_v > 1024 || hp->n_rot > hp->head_dim_k || hp->n_rot % 2)
        return kvl_fail(err, "%s: bad head dims (k %lld, v %lld, rope %lld)", gguf_path(f),
                        (long long)hp->head_dim_k, (long long)hp->head_dim_v, (long long)hp->n_rot);
    hp->rope_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    hp->rms_eps = 1e-5f;
    hp_float(f, a, "rope.freq_base", &hp->rope_base);
    hp_float(f, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    char key[128], stype[32] = "";
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    gguf_get_str_buf(f, key, stype, sizeof stype);
    float factor = 0;
    if (strcmp(stype, "linear") == 0 && hp_float(f, a, "rope.scaling.factor", &factor) && factor > 0)
        hp->rope_freq_scale = 1.0f / factor;
    else if (stype[0] && strcmp(stype, "none") != 0 && strcmp(stype, "linear") != 0)
        return kvl_fail(err, "%s: key '%s': rope scaling '%s' is not supported", gguf_path(f), key,
                        stype);
    hp->rope_type = m->arch->rope_type;
    return true;
}

/* Looks up a weight and checks its shape and type. ne1 = 0 means a 1-D tensor. */
static bool bind(model *m, mtensor *t, const char *name, int64_t ne0, int64_t ne1, bool required,
                 kvl_error *err) {
    const gguf_tensor *gt = gguf_find_tensor(m->gguf, name);
    memset(t, 0, sizeof *t);
    if (!gt) return required ? kvl_fail(err, "%s: tensor '%s' missing", gguf_path(m->gguf), name) : true;
    int64_t want1 = ne1 ? ne1 : 1;
    if (gt->ne[0] != ne0 || gt->ne[1] != want1 || gt->ne[2] != 1 || gt->ne[3] != 1)
        return kvl_fail(err, "%s: tensor '%s': shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                        gguf_path(m->gguf), name, (long long)gt->ne[0], (long long)gt->ne[1],
                        (long long)gt->ne[2], (long long)gt->ne[3], (long long)ne0,
                        (long long)want1);
    const kern_traits *tr = kern_traits_of(gt->dtype);
    bool is_vector = ne1 == 0;
    if (is_vector ? gt->dtype != GGUF_DT_F32 : (!tr || !tr->vec_dot || !tr->to_float))
        return kvl_fail(err, "%s: tensor '%s': type %s is not supported here", gguf_path(m->gguf),
                        name, gguf_dtype_name(gt->dtype));
    if (!gt->data) return kvl_fail(err, "%s: tensor '%s' has no data", gguf_path(m->gguf), name);
    t->data = gt->data;
    t->dtype = gt->dtype;
    t->ne0 = ne0;
    t->ne1 = want1;
    return true;
}

static bool bind_layer(model *m, int il, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    layer_weights *L = &m->layers[il];
    int64_t E = hp->n_embd, qd = hp->n_head * hp->head_dim_k, kd = hp->n_head_kv * hp->head_dim_k,
            vd = hp->n_head_kv * hp->head_dim_v, od = hp->n_head * hp->head_dim_v;
    char n[96];
#define W(field, suffix, ne0, ne1, req)                                      \
    do {                                                                     \
        snprintf(n, sizeof n, "blk.%d.%s", il, suffix);                      \
        if (!bind(m, &L->field, n, ne0, ne1, req, err)) return false;        \
    } while (0)
    W(attn_norm, "attn_norm.weight", E, 0, true);
    W(wq, "attn_q.weight", E, qd, true);
    W(wk, "attn_k.weight", E, kd, true);
    W(wv, "attn_v.weight", E, vd, true);
    W(wo, "attn_output.weight", od, E, true);
    if (m->arch->qkv_bias_allowed) {
        W(bq, "attn_q.bias", qd, 0, false);
        W(bk, "attn_k.bias", kd, 0, false);
        W(bv, "attn_v.bias", vd, 0, false);
    }
    if (m->arch->qk_norm) {
        W(q_norm, "attn_q_norm.weight", hp->head_dim_k, 0, true);
        W(k_norm, "attn_k_norm.weight", hp->head_dim_k, 0, true);
    }
    W(ffn_norm, "ffn_norm.weight", E, 0, true);
    W(ffn_gate, "ffn_gate.weight", E, hp->n_ff, true);
    W(ffn_up, "ffn_up.weight", E, hp->n_ff, true);
    W(ffn_down, "ffn_down.weight", hp->n_ff, E, true);
#undef W
    snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", il);
    if (gguf_find_tensor(m->gguf, n))
        return kvl_fail(err, "%s: tensor '%s': mixture-of-experts layers are not supported yet",
                        gguf_path(m->gguf), n);
    return true;
}

static bool bind_weights(model *m, kvl_error *err) {
    model_hparams *hp = &m->hp;
    const gguf_tensor *te = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te) return kvl_fail(err, "%s: tensor 'token_embd.weight' missing", gguf_path(m->gguf));
    hp->n_vocab = te->ne[1];
    if (!bind(m, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, true, err) ||
        !bind(m, &m->output_norm, "output_norm.weight", hp->n_embd, 0, true, err) ||
        !bind(m, &m->output, "output.weight", hp->n_embd, hp->n_vocab, false, err))
        return false;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    const gguf_tensor *rf = gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (rf) {
        if (rf->dtype != GGUF_DT_F32 || rf->ne[0] != hp->n_rot / 2 || !rf->data)
            return kvl_fail(err, "%s: tensor 'rope_freqs.weight': expected F32 [%lld]",
                            gguf_path(m->gguf), (long long)hp->n_rot / 2);
        m->rope_freqs = rf->data;
        hp->has_rope_freqs = true;
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kvl_fail(err, "model: out of memory");
    for (int il = 0; il < hp->n_layer; il++)
        if (!bind_layer(m, il, err)) return false;
    hp->n_params = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        hp->n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    hp->weights_bytes = gguf_tensor_data_bytes(m->gguf);
    return true;
}

static size_t max_work_bytes(const model *m, int64_t rows) {
    const model_hparams *hp = &m->hp;
    size_t best = kern_matmul_work_bytes(m->output.dtype, rows, hp->n_embd);
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        const mtensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            size_t b = kern_matmul_work_bytes(ts[i]->dtype, rows, ts[i]->ne0);
            if (b > best) best = b;
        }
    }
    return best;
}

static bool alloc_scratch(model *m, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    int64_t U = m->mp.max_ubatch;
    m->n_threads_max = omp_get_max_threads();
    size_t qd = hp->n_head * hp->head_dim_k, kd = hp->n_head_kv * hp->head_dim_k,
           vd = hp->n_head_kv * hp->head_dim_v, od = hp->n_head * hp->head_dim_v;
    m->x = kvl_calloc(U * hp->n_embd, sizeof(float));
    m->xb = kvl_calloc(U * (hp->n_embd > (int64_t)od ? hp->n_embd : (int64_t)od), sizeof(float));
    m->q = kvl_calloc(U * qd, sizeof(float));
    m->k = kvl_calloc(U * kd, sizeof(float));
    m->v = kvl_calloc(U * vd, sizeof(float));
    m->att = kvl_calloc(U * od, sizeof(float));
    m->ff_gate = kvl_calloc(U * hp->n_ff, sizeof(float));
    m->ff_up = kvl_calloc(U * hp->n_ff, sizeof(float));
    m->scores = kvl_calloc((size_t)m->n_threads_max * m->mp.max_ctx, sizeof(float));
    m->qconv = kvl_calloc((size_t)m->n_threads_max * (hp->head_dim_k + 64), sizeof(float));
    m->work = kvl_alloc(max_work_bytes(m, U));
    m->logit_rows = kvl_calloc(U * hp->n_embd, sizeof(float));
    m->logit_idx = kvl_calloc(U, sizeof(int32_t));
    if (!m->x || !m->xb || !m->q || !m->k || !m->v || !m->att || !m->ff_gate || !m->ff_up ||
        !m->scores || !m->qconv || !m->work || !m->logit_rows || !m->logit_idx)
        return kvl_fail(err, "model: cannot allocate scratch for %lld tokens", (long long)U);
    return true;
}

model *model_load(gguf_file *f, const model_params *mp, kvl_error *err) {
    kern_init(NULL);
    model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        kvl_fail(err, "model: out of memory");
        return NULL;
    }
    m->gguf = f;
    m->mp = *mp;
    if (m->mp.max_ubatch <= 0) m->mp.max_ubatch = 512;
    if (!read_hparams(m, err)) goto fail;
    if (m->mp.max_ctx <= 0) m->mp.max_ctx = m->hp.n_ctx_train;
    if (!bind_weights(m, err) || !alloc_scratch(m, err)) goto fail;
    return m;
fail:
    model_destroy(m);
    return NULL;
}

void model_destroy(model *m) {
    if (!m) return;
    free(m->layers);
    float *bufs[] = {m->x, m->xb, m->q, m->k, m->v, m->att, m->ff_gate, m->ff_up, m->scores,
                     m->qconv, m->logit_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvl_free(bufs[i]);
    kvl_free(m->work);
    kvl_free(m->logit_idx);
    gguf_close(m->gguf);
    free(m);
}

const model_hparams *model_hp(const model *m) { return &m->hp; }
const gguf_file *model_gguf(const model *m) { return m->gguf; }

void model_kv_shape(const model *m, kv_pool_config *cfg) {
    cfg->n_layers = (int)m->hp.n_layer;
    cfg->n_kv_heads = (int)m->hp.n_head_kv;
    cfg->head_dim_k = (int)m->hp.head_dim_k;
    cfg->head_dim_v = (int)m->hp.head_dim_v;
}

/* ------------------------------------------------------------------- ops -- */

/* out = x / rms(x) * w, over rows of n. The sum of squares is accumulated in
 * double, as ggml does, so results track llama.cpp closely. */
static void rms_norm_rows(float *out, const float *x, const float *w, int64_t rows, int64_t n,
                          float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float scale = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int64_t i = 0; i < n; i++) o[i] = (xr[i] * scale) * w[i];
    }
}

static void matmul(model *m, const mtensor *w, const float *x, int64_t rows, float *y) {
    kern_matmul(w->data, w->dtype, w->ne1, w->ne0, x, rows, y, m->work);
}

static void add_bias(float *y, const mtensor *b, int64_t rows, int64_t n) {
    if (!b->data) return;
    const float *bias = b->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) y[r * n + i] += bias[i];
}

/* Rotates the first n_rot dims of each head of one token, ggml's way: the angle
 * for pair i is pos * base^(-2i/n_rot), built by repeated multiplication. */
static void rope_token(const model *m, float *vec, int n_heads, int64_t head_dim, int32_t pos) {
    const model_hparams *hp = &m->hp;
    int64_t n_rot = hp->n_rot;
    float theta_scale = powf(hp->rope_base, -2.0f / (float)n_rot);
    float cs[512], sn[512]; /* n_rot <= head_dim <= 1024: pairs <= 512 */
    float theta = (float)pos;
    for (int64_t i = 0; i < n_rot / 2; i++) {
        float t = theta;
        if (m->rope_freqs) t /= m->rope_freqs[i];
        t *= hp->rope_freq_scale;
        cs[i] = cosf(t);
        sn[i] = sinf(t);
        theta *= theta_scale;
    }
    bool neox = hp->rope_type == MODEL_ROPE_NEOX;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + h * head_dim;
        for (int64_t i = 0; i < n_rot / 2; i++) {
            int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

/* Writes this token's K and V rows (all kv heads) into its sequence's block. */
static void kv_store(kv_pool *kv, const kv_seq *s, int layer, int32_t pos, const float *k,
                     const float *v, int64_t kd, int64_t vd) {
    const kv_pool_config *c = kv_pool_cfg(kv);
    int32_t blk = s->blocks[pos / c->block_size];
    int slot = pos % c->block_size;
    uint8_t *kr = (uint8_t *)kv_block_k(kv, blk, layer) + slot * kv_pool_k_row_bytes(kv);
    uint8_t *vr = (uint8_t *)kv_block_v(kv, blk, layer) + slot * kv_pool_v_row_bytes(kv);
    if (c->dtype == GGUF_DT_F32) {
        memcpy(kr, k, kd * sizeof(float));
        memcpy(vr, v, vd * sizeof(float));
    } else {
        const kern_traits *tr = kern_traits_of(c->dtype);
        tr->from_float(k, kr, kd);
        tr->from_float(v, vr, vd);
    }
}

/* Causal attention of one query head over positions [0, pos] of its sequence.
 * scores is scratch of at least pos+1 floats; qtmp of head_dim_k. */
static void attend_head(const model *m, const kv_pool *kv, const kv_seq *s, int layer, int32_t pos,
                        int kvh, const float *q, float *out, float *scores, void *qtmp) {
    const model_hparams *hp = &m->hp;
    const kv_pool_config *c = kv_pool_cfg(kv);
    const kern_traits *tr = kern_traits_of(c->dtype);
    int64_t dk = hp->head_dim_k, dv = hp->head_dim_v;
    size_t es = kv_dtype_bytes(c->dtype);
    size_t krow = kv_pool_k_row_bytes(kv), vrow = kv_pool_v_row_bytes(kv);
    /* Like ggml's mul_mat, q is converted to the cache's dot type (f16 cache: f16 q). */
    const void *qd = q;
    if (c->dtype != GGUF_DT_F32) {
        tr->from_float(q, qtmp, dk);
        qd = qtmp;
    }
    float scale = 1.0f / sqrtf((float)dk);
    int bs = c->block_size;
    float maxv = -INFINITY;
    for (int32_t j = 0; j <= pos; j++) {
        const uint8_t *kb = kv_block_k_const(kv, s->blocks[j / bs], layer);
        const void *kr = kb + (j % bs) * krow + (size_t)kvh * dk * es;
        float d;
        tr->vec_dot(dk, &d, kr, qd);
        scores[j] = d * scale;
        if (scores[j] > maxv) maxv = scores[j];
    }
    double sum = 0;
    for (int32_t j = 0; j <= pos; j++) {
        float e = expf(scores[j] - maxv);
        scores[j] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int64_t d = 0; d < dv; d++) out[d] = 0;
    for (int32_t j = 0; j <= pos; j++) {
        const uint8_t *vb = kv_block_v_const(kv, s->blocks[j / bs], layer);
        const uint8_t *vr = vb + (j % bs) * vrow + (size_t)kvh * dv * es;
        float p = scores[j] * inv;
        if (c->dtype == GGUF_DT_F32) {
            const float *vf = (const float *)vr;
            for (int64_t d = 0; d < dv; d++) out[d] += p * vf[d];
        } else {
            const kvl_f16 *vh = (const kvl_f16 *)vr;
            for (int64_t d = 0; d < dv; d++) out[d] += p * kvl_f16_to_f32(vh[d]);
        }
    }
}

/* --------------------------------------------------------------- forward -- */

static bool check_batch(const model *m, const kv_pool *kv, const model_batch *b, kvl_error *err) {
    const kv_pool_config *c = kv_pool_cfg(kv);
    if (c->n_layers != m->hp.n_layer || c->n_kv_heads != m->hp.n_head_kv ||
        c->head_dim_k != m->hp.head_dim_k || c->head_dim_v != m->hp.head_dim_v)
        return kvl_fail(err, "model: KV pool shape does not match the model");
    for (int64_t i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab)
            return kvl_fail(err, "batch token %lld: id %d out of range [0, %lld)", (long long)i,
                            b->tokens[i], (long long)m->hp.n_vocab);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return kvl_fail(err, "batch token %lld: sequence %d out of range", (long long)i, b->seq[i]);
        int32_t p = b->pos[i];
        if (p < 0 || p >= m->mp.max_ctx)
            return kvl_fail(err, "batch token %lld: position %d outside the context of %lld",
                            (long long)i, p, (long long)m->mp.max_ctx);
        if (p / c->block_size >= b->seqs[b->seq[i]]->n_blocks)
            return kvl_fail(err, "batch token %lld: position %d has no KV block", (long long)i, p);
    }
    return true;
}

static void attention_layer(model *m, kv_pool *kv, const model_batch *b, int64_t t0, int64_t n,
                            int il) {
    const model_hparams *hp = &m->hp;
    int64_t H = hp->n_head, group = hp->n_head / hp->n_head_kv;
    int64_t qd = H * hp->head_dim_k, od = H * hp->head_dim_v;
    int64_t total = n * H;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t w = 0; w < total; w++) {
        int64_t t = w / H, h = w % H;
        int tid = omp_get_thread_num();
        const kv_seq *s = b->seqs[b->seq[t0 + t]];
        attend_head(m, kv, s, il, b->pos[t0 + t], (int)(h / group), m->q + t * qd + h * hp->head_dim_k,
                    m->att + t * od + h * hp->head_dim_v, m->scores + (size_t)tid * m->mp.max_ctx,
                    m->qconv + (size_t)tid * (hp->head_dim_k + 64));
    }
}

static void layer_forward(model *m, kv_pool *kv, const model_batch *b, int64_t t0, int64_t n, int il) {
    const model_hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    int64_t E = hp->n_embd, dk = hp->head_dim_k;
    int64_t qd = hp->n_head * dk, kd = hp->n_head_kv * dk, vd = hp->n_head_kv * hp->head_dim_v;
    int64_t od = hp->n_head * hp->head_dim_v;

    rms_norm_rows(m->xb, m->x, L->attn_norm.data, n, E, hp->rms_eps);
    matmul(m, &L->wq, m->xb, n, m->q);
    matmul(m, &L->wk, m->xb, n, m->k);
    matmul(m, &L->wv, m->xb, n, m->v);
    add_bias(m->q, &L->bq, n, qd);
    add_bias(m->k, &L->bk, n, kd);
    add_bias(m->v, &L->bv, n, vd);
    if (L->q_norm.data) {
        rms_norm_rows(m->q, m->q, L->q_norm.data, n * hp->n_head, dk, hp->rms_eps);
        rms_norm_rows(m->k, m->k, L->k_norm.data, n * hp->n_head_kv, dk, hp->rms_eps);
    }
    for (int64_t t = 0; t < n; t++) {
        int32_t pos = b->pos[t0 + t];
        rope_token(m, m->q + t * qd, (int)hp->n_head, dk, pos);
        rope_token(m, m->k + t * kd, (int)hp->n_head_kv, dk, pos);
        kv_store(kv, b->seqs[b->seq[t0 + t]], il, pos, m->k + t * kd, m->v + t * vd, kd, vd);
    }
    attention_layer(m, kv, b, t0, n, il);
    matmul(m, &L->wo, m->att, n, m->xb);
    for (int64_t i = 0; i < n * E; i++) m->x[i] += m->xb[i];

    rms_norm_rows(m->xb, m->x, L->ffn_norm.data, n, E, hp->rms_eps);
    matmul(m, &L->ffn_gate, m->xb, n, m->ff_gate);
    matmul(m, &L->ffn_up, m->xb, n, m->ff_up);
    int64_t F = hp->n_ff;
    for (int64_t i = 0; i < n * F; i++) {
        float g = m->ff_gate[i];
        m->ff_gate[i] = g / (1.0f + expf(-g)) * m->ff_up[i];
    }
    matmul(m, &L->ffn_down, m->ff_gate, n, m->xb);
    for (int64_t i = 0; i < n * E; i++) m->x[i] += m->xb[i];
    (void)od;
}

static bool wants_logits(const model_batch *b, int64_t i) {
    return b->want_logits ? b->want_logits[i] != 0 : i == b->n_tokens - 1;
}

bool model_forward(model *m, kv_pool *kv, const model_batch *b, float *logits, kvl_error *err) {
    if (!check_batch(m, kv, b, err)) return false;
    const model_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, out_row = 0;
    for (int64_t t0 = 0; t0 < b->n_tokens; t0 += m->mp.max_ubatch) {
        int64_t n = b->n_tokens - t0;
        if (n > m->mp.max_ubatch) n = m->mp.max_ubatch;
        for (int64_t t = 0; t < n; t++)
            kern_get_row(m->tok_embd.data, m->tok_embd.dtype, E, b->tokens[t0 + t], m->x + t * E);
        for (int il = 0; il < hp->n_layer; il++) layer_forward(m, kv, b, t0, n, il);
        int64_t n_out = 0;
        for (int64_t t = 0; t < n; t++)
            if (wants_logits(b, t0 + t)) memcpy(m->logit_rows + (n_out++) * E, m->x + t * E, E * sizeof(float));
        if (n_out == 0) continue;
        rms_norm_rows(m->logit_rows, m->logit_rows, m->output_norm.data, n_out, E, hp->rms_eps);
        matmul(m, &m->output, m->logit_rows, n_out, logits + out_row * hp->n_vocab);
        out_row += n_out;
    }
    return true;
}
