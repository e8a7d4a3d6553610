/* model reference forward: one token of one sequence through the network in
 * plain C, to be read top to bottom (as llama2.c's forward()). Every matrix-
 * vector product, norm, softmax and weighted sum accumulates in double;
 * attention is one plain softmax over every position the block table shows the
 * token, read back through kv_row_load (no chunks, runs, threads or in-place
 * kernels). The tests hold the fast path (model_forward.c) against it by
 * normalized error; it allocates per call and is slow, so it does not serve. */
#include <math.h>
#include <stdlib.h>

#include "model_internal.h"

/* y[i] = W[i] . x for the ne1 rows of W (of head `head` when W is 3-D). */
static void matvec(const mtensor *w, int64_t head, const float *x, float *y, float *row) {
    const size_t row_bytes = kern_row_bytes(w->dtype, w->ne0);
    const uint8_t *base = (const uint8_t *)w->data + (size_t)head * w->ne1 * row_bytes;
    for (int64_t i = 0; i < w->ne1; i++) {
        const float *r = row; /* f32 rows are read in place, others widened into row */
        if (w->dtype == GGUF_DT_F32) r = (const float *)(base + (size_t)i * row_bytes);
        else kern_get_row(base, w->dtype, w->ne0, i, row);
        double s = 0;
        for (int64_t k = 0; k < w->ne0; k++) s += (double)r[k] * x[k];
        y[i] = (float)s;
    }
}

static void add_bias(float *y, const mtensor *b, int64_t n) {
    for (int64_t i = 0; b->data && i < n; i++) y[i] += ((const float *)b->data)[i];
}

static void rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const double scale = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = (float)(x[i] * scale * w[i]);
}

/* Rotates dims [offset, offset + n_rot) of n_heads heads `stride` apart by pos. */
static void rope(const model *m, const layer_weights *L, float *v, int64_t n_heads, int64_t stride,
                 int64_t offset, int32_t pos) {
    const int64_t n_rot = L->n_rot;
    const bool neox = m->hp.rope_type == MODEL_ROPE_NEOX;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < n_rot / 2; i++) {
            double theta = pos * pow(L->rope_base, -2.0 * i / n_rot);
            if (L->rope_freqs) theta /= m->rope_freqs[i];
            theta *= L->rope_freq_scale;
            float *a = v + h * stride + offset + (neox ? i : 2 * i),
                  *b = neox ? a + n_rot / 2 : a + 1;
            const double x0 = *a, x1 = *b;
            *a = (float)(x0 * cos(theta) - x1 * sin(theta));
            *b = (float)(x0 * sin(theta) + x1 * cos(theta));
        }
}

/* One position's K (or V) row of every KV head, as floats, wherever the layout put it. */
static void load_row(const kv_pool *kv, const kv_seq *s, int slot, int32_t j, bool v, float *dst) {
    const kv_pool_config *c = kv_pool_cfg(kv);
    const int bs = c->block_size, dtype = v ? kv_pool_dtype_v(kv) : c->dtype;
    const int64_t width = v ? c->head_dim_v : c->head_dim_k;
    const kv_block_layout *L = v ? kv_pool_v_layout(kv) : kv_pool_k_layout(kv);
    const int32_t blk = s->blocks[j / bs];
    const uint8_t *area = v ? kv_block_v_const(kv, blk, slot) : kv_block_k_const(kv, blk, slot);
    area += (size_t)(j % bs) * L->row_stride;
    if (!L->split) {
        kv_row_load(dtype, area, dst, c->n_kv_heads * width);
        return;
    }
    for (int h = 0; h < c->n_kv_heads; h++)
        kv_row_load(dtype, area + h * L->head_stride, dst + h * width, width);
}

/* out[dv] = softmax(scale * q . K_j) . V_j over the positions j the window
 * shows the token at pos, for KV head kvh; V is the first dv values of the K
 * row where the pool keeps none (MLA). p holds pos + 1 + dv doubles. */
static void attend(const model *m, const layer_weights *L, const kv_pool *kv, const kv_seq *s,
                   int32_t pos, int kvh, const float *q, int64_t dk, int64_t dv, double scale,
                   float *out, float *krow, float *vrow, double *p) {
    /* written out, not kv_attn_first: the reference does not share the rule it checks */
    const kv_attn r = m->groups[L->kv_group].attn;
    int32_t first = r.window > 0 && pos - r.window + 1 > 0 ? pos - r.window + 1 : 0;
    if (r.chunk > 0 && pos / r.chunk * r.chunk > first) first = pos / r.chunk * r.chunk;
    const int64_t kw = kv_pool_cfg(kv)->head_dim_k, vw = kv_pool_cfg(kv)->head_dim_v;
    const double cap = m->hp.attn_softcap;
    double max = -INFINITY, sum = 0, *o = p + pos + 1;
    /* q in the K type's vec_dot_type, as ggml converts it (kv_query_as_k) */
    const int kt = kv_pool_cfg(kv)->dtype;
    float *qc = malloc((size_t)dk * sizeof(float));
    if (!qc) abort();
    kv_query_as_k(kt, q, qc, dk);
    for (int32_t j = first; j <= pos; j++) {
        load_row(kv, s, L->kv_slot, j, false, krow);
        double d = 0;
        for (int64_t i = 0; i < dk; i++) d += (double)qc[i] * krow[kvh * kw + i];
        d *= scale;
        if (cap > 0) d = cap * tanh(d / cap);
        p[j - first] = d;
        max = d > max ? d : max;
    }
    for (int32_t j = first; j <= pos; j++) sum += p[j - first] = exp(p[j - first] - max);
    for (int64_t i = 0; i < dv; i++) o[i] = 0;
    for (int32_t j = first; j <= pos; j++) {
        load_row(kv, s, L->kv_slot, j, vw > 0, vw ? vrow : krow);
        const float *vr = vw ? vrow + kvh * vw : krow + kvh * kw;
        for (int64_t i = 0; i < dv; i++) o[i] += p[j - first] / sum * vr[i];
    }
    for (int64_t i = 0; i < dv; i++) out[i] = (float)o[i];
    free(qc);
}

bool model_forward_ref(model *m, kv_pool *const *pools, const kv_seq *const *seqs, int32_t token,
                       int32_t pos, float *logits, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, G = H / Hkv;
    const bool mla = m->arch->attn == ARCH_ATTN_MLA;
    const int64_t dk = mla ? hp->kv_lora_rank + hp->n_rot : hp->head_dim_k, dv = hp->head_dim_v;
    const int64_t nope = hp->n_rot_mla_nope, qh = nope + hp->n_rot, r = hp->kv_lora_rank,
                  vd = hp->v_head_dim_mla;
    if (token < 0 || token >= hp->n_vocab || pos < 0 || pos >= m->mp.max_ctx)
        return kvl_fail(err, "reference forward: token %d or position %d out of range", token, pos);
    /* What it does not implement it refuses, rather than read weights that are not there. */
    if (hp->moe.n_expert > 0 || hp->rope_yarn.ext_factor != 0.0f || (mla && !hp->mla))
        return kvl_fail(
            err,
            "reference forward: %s is not implemented here (dense FFN, plain or linear rope, "
            "absorbed MLA only)",
            hp->moe.n_expert > 0               ? "mixture of experts"
            : hp->rope_yarn.ext_factor != 0.0f ? "YaRN rope scaling"
                                               : "uncompressed MLA");
    const arch_desc *ad = m->arch;
    if (ad->norm != ARCH_NORM_RMS || ad->parallel || ad->no_pre_norms || ad->qk_norm_full ||
        ad->granite_scales || ad->logit_scale || ad->fused_gate_up || ad->nope_every ||
        ad->rope_swa_only || ad->attn_temp || ad->gemma4 || hp->rope_off || hp->n_ff_layer[0])
        return kvl_fail(err, "reference forward: architecture '%s' is not implemented here",
                        ad->name);
    for (int g = 0; g < m->n_groups; g++) {
        const int64_t bi = pos / kv_pool_cfg(pools[g])->block_size;
        if (bi >= seqs[g]->n_blocks || seqs[g]->blocks[bi] < 0)
            return kvl_fail(err, "reference forward: position %d has no KV block in group %d", pos,
                            g);
    }
    /* Scratch: a row as wide as any weight row or KV row, every vector the layer needs. */
    const int64_t W =
        4 * (E + H * (qh + dk + dv + vd) + hp->n_ff + hp->q_lora_rank + Hkv * (dk + dv)) + 64;
    float *x = calloc((size_t)(9 * W), sizeof(float));
    double *p = calloc((size_t)(pos + 1 + W), sizeof(double));
    if (!x || !p) {
        free(x);
        free(p);
        return kvl_fail(err, "reference forward: out of memory");
    }
    float *xb = x + W, *q = xb + W, *k = q + W, *v = k + W, *att = v + W, *hb = att + W,
          *row = hb + W, *row2 = row + W;

    kern_get_row(m->tok_embd.data, m->tok_embd.dtype, E, token, x);
    for (int64_t i = 0; m->arch->embd_scale && i < E; i++) x[i] *= sqrtf((float)E);

    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        kv_pool *kv = pools[L->kv_group];
        const kv_seq *s = seqs[L->kv_group];
        const int bs = kv_pool_cfg(kv)->block_size;
        rmsnorm(xb, x, L->attn_norm.data, E, hp->rms_eps);
        if (!mla) { /* attention: q, k, v; per-head norms; rope; K/V into the cache; attend; out */
            matvec(&L->wq, 0, xb, q, row);
            matvec(&L->wk, 0, xb, k, row);
            matvec(&L->wv, 0, xb, v, row);
            add_bias(q, &L->bq, H * dk);
            add_bias(k, &L->bk, Hkv * dk);
            add_bias(v, &L->bv, Hkv * dv);
            for (int64_t h = 0; L->q_norm.data && h < H; h++)
                rmsnorm(q + h * dk, q + h * dk, L->q_norm.data, dk, hp->rms_eps);
            for (int64_t h = 0; L->k_norm.data && h < Hkv; h++)
                rmsnorm(k + h * dk, k + h * dk, L->k_norm.data, dk, hp->rms_eps);
            rope(m, L, q, H, dk, 0, pos);
            rope(m, L, k, Hkv, dk, 0, pos);
            kv_store_token(kv, s->blocks[pos / bs], L->kv_slot, pos % bs, k, v);
            const bool q27 = m->arch->n_layer_27b && hp->n_layer == m->arch->n_layer_27b;
            const double scale = 1.0 / sqrt(q27 ? (double)(E / H) : (double)dk);
            for (int64_t h = 0; h < H; h++)
                attend(m, L, kv, s, pos, (int)(h / G), q + h * dk, dk, dv, scale, att + h * dv, row,
                       row2, p);
            matvec(&L->wo, 0, att, xb, row);
        } else { /* MLA, absorbed: attention over the cached [latent, rope] row of one shared head */
            matvec(&L->wkv_a_mqa, 0, xb, k, row);
            rmsnorm(k, k, L->kv_a_norm.data, r, hp->rms_eps);
            rope(m, L, k, 1, dk, r, pos);
            if (L->wq_a.data) {
                matvec(&L->wq_a, 0, xb, hb, row);
                rmsnorm(hb, hb, L->q_a_norm.data, hp->q_lora_rank, hp->rms_eps);
                matvec(&L->wq_b, 0, hb, v, row);
            } else {
                matvec(&L->wq, 0, xb, v, row);
            }
            rope(m, L, v, H, qh, nope, pos); /* v holds q: [H][nope + rope] */
            kv_store_token(kv, s->blocks[pos / bs], L->kv_slot, pos % bs, k, NULL);
            for (int64_t h = 0; h < H; h++) {
                matvec(&L->wk_b, h, v + h * qh, q, row); /* q_nope into the latent space: [r] */
                for (int64_t i = 0; i < hp->n_rot; i++) q[r + i] = v[h * qh + nope + i];
                attend(m, L, kv, s, pos, 0, q, dk, r, 1.0 / sqrt((double)qh), hb, row, row2, p);
                matvec(&L->wv_b, h, hb, att + h * vd, row); /* latent result to values: [vd] */
            }
            matvec(&L->wo, 0, att, xb, row);
        }
        if (L->post_attn_norm.data) rmsnorm(xb, xb, L->post_attn_norm.data, E, hp->rms_eps);
        for (int64_t i = 0; i < E; i++) x[i] += xb[i];

        rmsnorm(xb, x, L->ffn_norm.data, E, hp->rms_eps); /* gated FFN */
        matvec(&L->ffn_gate, 0, xb, hb, row);
        matvec(&L->ffn_up, 0, xb, q, row);
        for (int64_t i = 0; i < hp->n_ff; i++) {
            const double g = hb[i];
            const double a = m->arch->ffn_act == ARCH_ACT_GELU
                                 ? 0.5 * g *
                                       (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * g *
                                                   (1.0 + 0.044715 * g * g)))
                                 : g / (1.0 + exp(-g));
            hb[i] = (float)(a * q[i]);
        }
        matvec(&L->ffn_down, 0, hb, xb, row);
        if (L->post_ffn_norm.data) rmsnorm(xb, xb, L->post_ffn_norm.data, E, hp->rms_eps);
        for (int64_t i = 0; i < E; i++) x[i] += xb[i];
        cvec_apply(m, il, x, 1);
    }

    if (logits) { /* NULL: the token only goes into the KV cache */
        rmsnorm(x, x, m->output_norm.data, E, hp->rms_eps);
        matvec(&m->output, 0, x, logits, row);
        for (int64_t i = 0; hp->final_softcap > 0 && i < hp->n_vocab; i++)
            logits[i] = (float)(hp->final_softcap * tanh(logits[i] / hp->final_softcap));
    }
    free(x);
    free(p);
    return true;
}
