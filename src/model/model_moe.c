/* model: mixture-of-experts feed-forward layers, as llama.cpp's loader and
 * build_moe_ffn define them (qwen3moe, qwen2moe, deepseek2, llama/Mixtral).
 *
 * Per token: router logits (ffn_gate_inp), probabilities by softmax or
 * sigmoid, selection scores = probabilities + the optional bias exp_probs_b,
 * group-limited routing (keep the expert_group_used_count groups whose two
 * best scores sum highest), the top expert_used_count experts by score, their
 * weights = the unbiased probabilities, optionally divided by their sum
 * (expert_weights_norm) and scaled (expert_weights_scale). Each selected
 * expert runs SiLU(gate . x) * (up . x) through down; the weighted results are
 * added in the order of the selection, then the shared expert's output
 * (qwen2moe: times sigmoid(gate_inp_shexp . x)). llama4 differs: the top-k
 * are taken by raw router logit, and each weight (sigmoid) multiplies the
 * expert's input instead of its output; its MoE layers are every
 * interleave_moe_layer_step-th, the others dense.
 *
 * gpt-oss (LLM_FFN_SWIGLU_OAI_MOE with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT):
 * the router has a bias; the top-k experts are chosen on the raw logits and
 * weighted by the softmax of those k logits; each expert's gate, up and down
 * have a bias per expert, and the activation is OpenAI's clamped SwiGLU,
 * g = min(gate, 7), u = clamp(up, -7, 7), g / (1 + exp(-1.702 g)) * (u + 1).
 *
 * On a ragged batch the tokens are grouped by expert, so each selected
 * expert's weights are read once per pass whatever the number of sequences,
 * and experts no token selected are not read at all. A token's result does not
 * depend on its batch mates: every matmul row is computed as it would be
 * alone, and the per-token sum runs in selection order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_grouped.h"
#include "model_internal.h"
#include "model_phases.h"

struct moe_scratch {
    float *probs;    /* [U][n_expert] router logits, then probabilities */
    float *sel;      /* [n_expert] one token's selection scores */
    float *gscore;   /* [n_group] */
    int32_t *ids;    /* [U][k] selected experts, best first */
    float *w;        /* [U][k] their weights */
    int32_t *count;  /* [n_expert] tokens per expert */
    int32_t *start;  /* [n_expert] first entry of each expert in order */
    int32_t *order;  /* [U*k] token * k + slot, grouped by expert */
    float *xg, *yg;  /* [U][E] an expert's gathered input rows, its outputs */
    float *hg, *hu;  /* [max(U, k)][max(ff_exp, ff_shexp)] */
    float *out;      /* [U*k][E] expert outputs per (token, slot), before their weights */
    float *sh;       /* [U][E] shared expert output */
    float *shg;      /* [U] qwen2moe's shared expert gate */
    void *each_work; /* decode's prepared inputs (kern_matmul_repacked_gated) */
    /* grouped_experts (a few tokens, every matrix repacked): up to gmax tokens */
    int64_t gmax;
    const float **gx; /* [gmax*K + gmax] input row pointers: experts' rows, then the shared */
    float **gh;       /* [gmax*K + gmax] the down inputs' rows (in gg) */
    float *gg, *gu;   /* [gmax*K*F + gmax*FS] gate and up outputs, grouped by expert */
    float *gy;        /* [gmax*K][E] down outputs, grouped by expert */
    void *gwork;      /* kern_matmul_repacked_rows */
    kern_repacked_rows *gmats; /* [2 * n_expert + 2] */
    int32_t *gexp;             /* [n_expert + 1] a down matrix's expert (-1: shared) */
    int64_t *goff, *gwid;      /* [n_expert + 1] its rows' offset in gg / gu, their width */
};

/* Whether the loader runs the experts the reader found (hparams.c reads and
 * checks the keys; this is the architecture's question). */
bool moe_check_support(const model *m, kvl_error *err) {
    const model_moe_hparams *mo = &m->hp.moe;
    const char *a = m->hp.arch, *path = gguf_path(m->gguf);
    if (mo->n_expert == 0 && m->arch->moe == ARCH_MOE_REQUIRED)
        return kvl_fail(
            err,
            "%s: key '%s.expert_count' missing or 0: '%s' is a mixture-of-experts architecture",
            path, a, a);
    if (mo->n_expert > 0 && m->arch->moe == ARCH_MOE_NONE)
        return kvl_fail(
            err,
            "%s: key '%s.expert_count' = %lld: mixture-of-experts layers are not supported for "
            "architecture '%s' (supported: qwen3moe, qwen2moe, deepseek2, glm4moe, granite, "
            "granitemoe, gpt-oss, olmoe, llama4, gemma4, llama)",
            path, a, (long long)mo->n_expert, a);
    return true;
}

bool moe_layer(const model *m, int il) {
    const model_moe_hparams *mo = &m->hp.moe;
    if (mo->n_expert == 0) return false;
    return mo->layer_step > 0 ? (il + 1) % mo->layer_step == 0 : il >= mo->n_layer_dense_lead;
}

bool moe_bind_layer(model *m, int il, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    const model_moe_hparams *mo = &hp->moe;
    layer_weights *L = &m->layers[il];
    const int64_t E = hp->n_embd, NE = mo->n_expert, F = mo->n_ff_exp;
    char n[96];
    if (!model_bind_blk(m, il, &L->ffn_gate_inp, "ffn_gate_inp.weight", E, NE, 1, true, err))
        return false;
    snprintf(n, sizeof n, "blk.%d.ffn_gate_exps.weight", il);
    bool fused = false;
    if (!gguf_find_tensor(m->gguf, n)) {
        char alt[96];
        snprintf(alt, sizeof alt, "blk.%d.ffn_gate_up_exps.weight", il);
        fused = gguf_find_tensor(m->gguf, alt) != NULL;
        if (fused && m->arch->gpt_oss) /* its expert biases would be fused too */
            return kvl_fail(err,
                            "%s: tensor '%s': fused gate/up experts are not supported for "
                            "gpt-oss (expected '%s')",
                            gguf_path(m->gguf), alt, n);
        snprintf(alt, sizeof alt, "blk.%d.ffn_gate.0.weight", il);
        if (gguf_find_tensor(m->gguf, alt))
            return kvl_fail(
                err,
                "%s: tensor '%s' missing: this file stores each expert as its own tensor ('%s', "
                "the layout before experts were merged into 3-D tensors), which is not supported; "
                "convert the model again",
                gguf_path(m->gguf), n, alt);
    }
    if (fused) {
        /* convert_hf_to_gguf --fuse-gate-up-exps: each expert's F gate rows, then its F up
         * rows, in one {E, 2F, n_expert} tensor; gate and up become views of it */
        if (!model_bind_blk(m, il, &L->ffn_gate_exps, "ffn_gate_up_exps.weight", E, 2 * F, NE, true,
                            err))
            return false;
        const size_t half = kern_row_bytes(L->ffn_gate_exps.dtype, E) * (size_t)F;
        L->ffn_gate_exps.ne1 = F;
        L->ffn_gate_exps.expert_stride = 2 * half;
        L->ffn_up_exps = L->ffn_gate_exps;
        L->ffn_up_exps.data = (const uint8_t *)L->ffn_gate_exps.data + half;
    } else {
        if (!model_bind_blk(m, il, &L->ffn_gate_exps, "ffn_gate_exps.weight", E, F, NE, true, err))
            return false;
        if (!model_bind_blk(m, il, &L->ffn_up_exps, "ffn_up_exps.weight", E, F, NE, true, err))
            return false;
    }
    if (!model_bind_blk(m, il, &L->ffn_down_exps, "ffn_down_exps.weight", F, E, NE, true, err))
        return false;
    if (!model_bind_blk(m, il, &L->exp_probs_b, "exp_probs_b.bias", NE, 0, 1, false, err))
        return false;
    if (mo->n_ff_shexp > 0) {
        if (!model_bind_blk(m, il, &L->ffn_gate_shexp, "ffn_gate_shexp.weight", E, mo->n_ff_shexp,
                            1, true, err))
            return false;
        if (!model_bind_blk(m, il, &L->ffn_up_shexp, "ffn_up_shexp.weight", E, mo->n_ff_shexp, 1,
                            true, err))
            return false;
        if (!model_bind_blk(m, il, &L->ffn_down_shexp, "ffn_down_shexp.weight", mo->n_ff_shexp, E,
                            1, true, err))
            return false;
    }
    if (mo->shexp_gated && !model_bind_blk(m, il, &L->ffn_gate_inp_shexp,
                                           "ffn_gate_inp_shexp.weight", E, 0, 1, true, err))
        return false;
    if (m->arch->gemma4 &&
        (!model_bind_blk(m, il, &L->ffn_gate_inp_s, "ffn_gate_inp.scale", E, 0, 1, true, err) ||
         !model_bind_blk(m, il, &L->ffn_down_exps_s, "ffn_down_exps.scale", NE, 0, 1, false, err)))
        return false;
    if (m->arch->gpt_oss) {
        if (!model_bind_blk(m, il, &L->ffn_gate_inp_b, "ffn_gate_inp.bias", NE, 0, 1, true, err))
            return false;
        if (!model_bind_blk(m, il, &L->ffn_gate_exps_b, "ffn_gate_exps.bias", F, NE, 1, true, err))
            return false;
        if (!model_bind_blk(m, il, &L->ffn_up_exps_b, "ffn_up_exps.bias", F, NE, 1, true, err))
            return false;
        if (!model_bind_blk(m, il, &L->ffn_down_exps_b, "ffn_down_exps.bias", E, NE, 1, true, err))
            return false;
        const mtensor *bs[] = {&L->ffn_gate_exps_b, &L->ffn_up_exps_b, &L->ffn_down_exps_b};
        for (int i = 0; i < 3; i++)
            if (bs[i]->dtype != GGUF_DT_F32)
                return kvl_fail(err, "%s: blk.%d expert biases: type %s, expected F32",
                                gguf_path(m->gguf), il, gguf_dtype_name(bs[i]->dtype));
    }
    return true;
}

/* The 3-D expert tensors and the shared expert of layer il (NULL-terminated). */
static void moe_matmuls(layer_weights *L, mtensor *out[7]) {
    out[0] = &L->ffn_gate_exps;
    out[1] = &L->ffn_up_exps;
    out[2] = &L->ffn_down_exps;
    out[3] = &L->ffn_gate_shexp;
    out[4] = &L->ffn_up_shexp;
    out[5] = &L->ffn_down_shexp;
    out[6] = NULL;
}

/* Bytes between two experts' slices in t->data. */
static size_t data_stride(const mtensor *t) {
    return t->expert_stride ? t->expert_stride : kern_row_bytes(t->dtype, t->ne0) * (size_t)t->ne1;
}

/* Bytes between two experts' slices in a repacked tensor (kern_repack wants 64-byte aligned dst). */
static size_t packed_stride(const mtensor *t) {
    return (kern_repack_bytes(t->dtype, t->ne1, t->ne0) + 63) & ~(size_t)63;
}

bool moe_repack(model *m, repack_walk *w, kvl_error *err) {
    if (!m->hp.moe.n_expert) return true;
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (!w->count_only) model_progress(m, 0.1 + 0.9 * (double)il / (double)m->hp.n_layer);
        mtensor *ts[7];
        moe_matmuls(&m->layers[il], ts);
        size_t layer = 0;
        for (int i = 0; ts[i]; i++)
            if (ts[i]->data && kern_repack_bytes(ts[i]->dtype, ts[i]->ne1, ts[i]->ne0))
                layer += packed_stride(ts[i]) * (size_t)ts[i]->ne2;
        if (!layer || !repack_walk_take(w, layer)) continue;
        for (int i = 0; ts[i]; i++) {
            mtensor *t = ts[i];
            if (!t->data || !kern_repack_bytes(t->dtype, t->ne1, t->ne0)) continue;
            const size_t stride = packed_stride(t), slice = data_stride(t);
            t->packed = kvl_alloc_huge(stride * (size_t)t->ne2);
            if (!t->packed)
                return kvl_fail(
                    err,
                    "model: out of memory repacking experts (%zu bytes; --no-repack avoids it)",
                    stride * (size_t)t->ne2);
            for (int64_t e = 0; e < t->ne2; e++)
                kern_repack((const uint8_t *)t->data + (size_t)e * slice, t->dtype, t->ne1, t->ne0,
                            (uint8_t *)t->packed + (size_t)e * stride);
            /* the GGUF pages are read again from the page cache only if touched (a fused
             * gate+up tensor's up view is repacked next, from pages dropped here) */
            kvl_drop_file_pages(t->data,
                                slice * (size_t)(t->ne2 - 1) +
                                    kern_row_bytes(t->dtype, t->ne0) * (size_t)t->ne1,
                                w->reclaim);
        }
    }
    return true;
}

size_t moe_work_bytes(const model *m, int64_t rows) {
    size_t best = 0;
    for (int il = 0; m->hp.moe.n_expert && il < m->hp.n_layer; il++) {
        mtensor *ts[7];
        moe_matmuls((layer_weights *)&m->layers[il], ts);
        const mtensor *more[] = {&m->layers[il].ffn_gate_inp, &m->layers[il].ffn_gate_inp_shexp};
        for (int i = 0; i < 8; i++) {
            const mtensor *t = i < 6 ? ts[i] : more[i - 6];
            if (!t->data) continue;
            const size_t b = kern_matmul_work_bytes(t->dtype, rows, t->ne0);
            best = b > best ? b : best;
        }
    }
    return best;
}

static int decode_mats(const model *m, const layer_weights *L, const struct moe_scratch *s,
                       const float *x, kern_repacked_one *gu, kern_repacked_one *down);

/* Work for decode_experts: a prepared input per matrix of its region, at most
 * (the types and widths are the same in every layer but the leading dense ones). */
static size_t each_work_bytes(const model *m) {
    size_t best = 64;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        if (!moe_layer(m, il) || !L->ffn_gate_exps.data) continue; /* (before the repack) */
        kern_repacked_one gu[KERN_EACH_MAX], down[KERN_EACH_MAX];
        const int ne = decode_mats(m, L, NULL, NULL, gu, down);
        const size_t bytes = kern_matmul_repacked_gated_work_bytes(ne, gu, down);
        best = bytes > best ? bytes : best;
    }
    return best;
}

/* Tokens up to which a step runs its experts through grouped_experts (a
 * batched decode); more (prefill) go expert by expert, each a GEMM of many rows. */
#define MOE_GROUPED_MAX_TOKENS 64

/* Work for grouped_experts of up to t tokens: the larger of its two calls. */
static size_t grouped_work_bytes(const model *m, int64_t t) {
    const model_moe_hparams *mo = &m->hp.moe;
    const int64_t E = m->hp.n_embd, F = mo->n_ff_exp, FS = mo->n_ff_shexp, K = mo->n_expert_used;
    const int64_t pairs = t * K, inputs = pairs < mo->n_expert ? pairs : mo->n_expert;
    size_t best = 64;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        if (!moe_layer(m, il) || !L->ffn_gate_exps.data) continue;
        size_t a = kern_matmul_repacked_rows_work_bound(L->ffn_gate_exps.dtype, E, pairs, inputs) +
                   kern_matmul_repacked_rows_work_bound(L->ffn_up_exps.dtype, E, pairs, inputs);
        size_t b = kern_matmul_repacked_rows_work_bound(L->ffn_down_exps.dtype, F, pairs, inputs);
        if (L->ffn_gate_shexp.data) {
            a += kern_matmul_repacked_rows_work_bound(L->ffn_gate_shexp.dtype, E, t, 1) +
                 kern_matmul_repacked_rows_work_bound(L->ffn_up_shexp.dtype, E, t, 1);
            b += kern_matmul_repacked_rows_work_bound(L->ffn_down_shexp.dtype, FS, t, 1);
        }
        best = a > best ? a : best;
        best = b > best ? b : best;
    }
    return best;
}

bool moe_alloc_scratch(model *m, kvl_error *err) {
    const model_moe_hparams *mo = &m->hp.moe;
    if (!mo->n_expert) return true;
    const int64_t U = m->mp.max_ubatch, E = m->hp.n_embd, K = mo->n_expert_used, NE = mo->n_expert;
    const int64_t ffw = mo->n_ff_exp > mo->n_ff_shexp ? mo->n_ff_exp : mo->n_ff_shexp;
    struct moe_scratch *s = calloc(1, sizeof *s);
    m->moe = s;
    if (!s) return kvl_fail(err, "model: out of memory");
    s->probs = kvl_calloc((size_t)(U * NE), sizeof(float));
    s->sel = kvl_calloc((size_t)NE, sizeof(float));
    s->gscore = kvl_calloc((size_t)(mo->n_group + 1), sizeof(float));
    s->ids = kvl_calloc((size_t)(U * K), sizeof(int32_t));
    s->w = kvl_calloc((size_t)(U * K), sizeof(float));
    s->count = kvl_calloc((size_t)NE, sizeof(int32_t));
    s->start = kvl_calloc((size_t)NE, sizeof(int32_t));
    s->order = kvl_calloc((size_t)(U * K), sizeof(int32_t));
    s->xg = kvl_calloc((size_t)(U * E), sizeof(float));
    s->yg = kvl_calloc((size_t)(U * E), sizeof(float));
    /* decode holds all K experts' rows and the shared expert's at once */
    const int64_t hrows = U > K + 1 ? U : K + 1;
    s->hg = kvl_calloc((size_t)(hrows * ffw), sizeof(float));
    s->hu = kvl_calloc((size_t)(hrows * ffw), sizeof(float));
    s->out = kvl_calloc((size_t)(U * K * E), sizeof(float));
    s->sh = kvl_calloc((size_t)(U * E), sizeof(float));
    s->shg = kvl_calloc((size_t)U, sizeof(float));
    s->each_work = kvl_alloc(each_work_bytes(m));
    const int64_t G = U < MOE_GROUPED_MAX_TOKENS ? U : MOE_GROUPED_MAX_TOKENS;
    s->gmax = G;
    s->gx = kvl_calloc((size_t)(G * K + G), sizeof *s->gx);
    s->gh = kvl_calloc((size_t)(G * K + G), sizeof *s->gh);
    s->gg = kvl_calloc((size_t)(G * K * mo->n_ff_exp + G * mo->n_ff_shexp), sizeof(float));
    s->gu = kvl_calloc((size_t)(G * K * mo->n_ff_exp + G * mo->n_ff_shexp), sizeof(float));
    s->gy = kvl_calloc((size_t)(G * K * E), sizeof(float));
    s->gwork = kvl_alloc(grouped_work_bytes(m, G));
    s->gmats = kvl_calloc((size_t)(2 * NE + 2), sizeof *s->gmats);
    s->gexp = kvl_calloc((size_t)(NE + 1), sizeof *s->gexp);
    s->goff = kvl_calloc((size_t)(NE + 1), sizeof *s->goff);
    s->gwid = kvl_calloc((size_t)(NE + 1), sizeof *s->gwid);
    if (!s->probs || !s->sel || !s->gscore || !s->ids || !s->w || !s->count || !s->start ||
        !s->order || !s->xg || !s->yg || !s->hg || !s->hu || !s->out || !s->sh || !s->shg ||
        !s->each_work || !s->gx || !s->gh || !s->gg || !s->gu || !s->gy || !s->gwork || !s->gmats ||
        !s->gexp || !s->goff || !s->gwid)
        return kvl_fail(err, "model: cannot allocate expert scratch for %lld tokens", (long long)U);
    return true;
}

void moe_free(model *m) {
    for (int il = 0; m->layers && il < m->hp.n_layer; il++) {
        mtensor *ts[7];
        moe_matmuls(&m->layers[il], ts);
        for (int i = 0; ts[i]; i++) kvl_free(ts[i]->packed);
    }
    struct moe_scratch *s = m->moe;
    if (!s) return;
    void *bufs[] = {s->probs, s->sel,       s->gscore,     s->ids,  s->w,   s->count, s->start,
                    s->order, s->xg,        s->yg,         s->hg,   s->hu,  s->out,   s->sh,
                    s->shg,   s->each_work, (void *)s->gx, s->gh,   s->gg,  s->gu,    s->gy,
                    s->gwork, s->gmats,     s->gexp,       s->goff, s->gwid};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvl_free(bufs[i]);
    free(s);
    m->moe = NULL;
}

/* Index of the largest of v[0..n) not yet taken (ties: the lowest index). */
static int64_t argmax_free(const float *v, int64_t n, const uint8_t *taken) {
    int64_t best = -1;
    for (int64_t j = 0; j < n; j++)
        if (!taken[j] && (best < 0 || v[j] > v[best])) best = j;
    return best;
}

/* ggml's soft_max: exp(x - max), summed in double, times the float of 1/sum. */
static void soft_max(float *v, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) mx = v[j] > mx ? v[j] : mx;
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        v[j] = expf(v[j] - mx);
        sum += (double)v[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < n; j++) v[j] *= inv;
}

/* One token's routing: p holds its router logits and becomes its probabilities;
 * ids and w receive the selected experts (best first) and their weights. */
static void route(const model_moe_hparams *mo, const layer_weights *L, struct moe_scratch *s,
                  float *p, int32_t *ids, float *w) {
    const int64_t NE = mo->n_expert, K = mo->n_expert_used;
    float logits[MODEL_MAX_EXPERTS];
    if (mo->weight_input) memcpy(logits, p, (size_t)NE * sizeof *p);
    if (mo->gating == MODEL_MOE_SOFTMAX_WEIGHT) { /* the raw logits choose */
    } else if (mo->gating == MODEL_MOE_SIGMOID) {
        for (int64_t j = 0; j < NE; j++) p[j] = 1.0f / (1.0f + expf(-p[j]));
    } else if (mo->gating == MODEL_MOE_SQRT_SOFTPLUS) { /* ggml's softplus: x past 20 */
        for (int64_t j = 0; j < NE; j++)
            p[j] = sqrtf(p[j] > 20.0f ? p[j] : logf(1.0f + expf(p[j])));
    } else {
        soft_max(p, NE);
    }
    float *sel = s->sel;
    const float *bias = L->exp_probs_b.data;
    for (int64_t j = 0; j < NE; j++) sel[j] = bias ? p[j] + bias[j] : p[j];
    if (mo->weight_input) memcpy(sel, logits, (size_t)NE * sizeof *sel); /* llama4: by logit */
    uint8_t taken[MODEL_MAX_EXPERTS];
    if (mo->n_group > 1) { /* keep the groups whose two best scores sum highest */
        const int64_t G = mo->n_group, per = NE / G;
        for (int64_t g = 0; g < G; g++) {
            const float *v = sel + g * per;
            int64_t b0 = 0;
            for (int64_t j = 1; j < per; j++) b0 = v[j] > v[b0] ? j : b0;
            int64_t b1 = -1;
            for (int64_t j = 0; j < per; j++)
                if (j != b0 && (b1 < 0 || v[j] > v[b1])) b1 = j;
            s->gscore[g] = b1 < 0 ? v[b0] : v[b0] + v[b1];
        }
        memset(taken, 0, (size_t)G);
        for (int64_t i = 0; i < mo->n_group_used; i++) taken[argmax_free(s->gscore, G, taken)] = 1;
        for (int64_t g = 0; g < G; g++)
            if (!taken[g])
                for (int64_t j = 0; j < per; j++) sel[g * per + j] = -INFINITY;
    }
    memset(taken, 0, (size_t)NE);
    for (int64_t i = 0; i < K; i++) {
        const int64_t e = argmax_free(sel, NE, taken);
        taken[e] = 1;
        ids[i] = (int32_t)e;
        w[i] = p[e];
    }
    if (mo->gating == MODEL_MOE_SOFTMAX_WEIGHT) soft_max(w, K); /* over the k weights */
    if (mo->weights_norm) { /* ggml: sum_rows (double), clamped to F16's smallest normal, divide */
        double sum = 0;
        for (int64_t i = 0; i < K; i++) sum += (double)w[i];
        float fs = (float)sum;
        fs = fs < 6.103515625e-5f ? 6.103515625e-5f : fs;
        for (int64_t i = 0; i < K; i++) w[i] = w[i] / fs;
    }
    if (mo->weights_scale != 0.0f && mo->weights_scale != 1.0f)
        for (int64_t i = 0; i < K; i++) w[i] *= mo->weights_scale;
}

/* Expert e's 2-D slice of a 3-D expert tensor, repacked or not. */
static mtensor expert_slice(const mtensor *t, int64_t e) {
    mtensor s = *t;
    s.data = (const uint8_t *)t->data + (size_t)e * data_stride(t);
    s.packed = t->packed ? (uint8_t *)t->packed + (size_t)e * packed_stride(t) : NULL;
    s.ne2 = 1;
    return s;
}

/* Adds row e of a {n, n_expert} bias (NULL data: none) to each of rows rows of y. */
static void add_expert_bias(float *y, const mtensor *b, int64_t e, int64_t rows) {
    if (!b->data) return;
    const float *be = (const float *)b->data + e * b->ne0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < b->ne0; i++) y[r * b->ne0 + i] += be[i];
}

/* ggml's swiglu_oai (alpha 1.702, limit 7, as llama.cpp's gpt-oss graph sets
 * them), in its operations: g = min(g, 7), u = clamp(u, -7, 7), g / (1 +
 * exp(alpha * -g)) * (u + 1), into g. */
static void swiglu_oai(float *g, const float *u, int64_t n) {
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i] < limit ? g[i] : limit;
        const float y = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
        g[i] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
    }
}

/* The activation of rows rows of expert e (e < 0: the shared expert, no
 * biases) from its gate g and up u, into g. */
static void expert_act(const model *m, const layer_weights *L, int64_t e, float *g, float *u,
                       int64_t rows, int64_t width) {
    if (e >= 0 && m->arch->gpt_oss) {
        add_expert_bias(u, &L->ffn_up_exps_b, e, rows);
        add_expert_bias(g, &L->ffn_gate_exps_b, e, rows);
        swiglu_oai(g, u, rows * width);
        return;
    }
    if (m->arch->ffn_act == ARCH_ACT_GELU) op_gelu_mul(g, u, rows * width); /* gemma4 */
    else op_silu_mul(g, u, rows * width);
}

/* gate and up of the same input (one prepared x when both are repacked), then
 * expert_act into g. */
static void gated(model *m, const layer_weights *L, int64_t e, const mtensor *gate,
                  const mtensor *up, const float *x, int64_t rows, float *g, float *u) {
    const mtensor *ws[] = {gate, up};
    float *const ys[] = {g, u};
    op_matmul_many(m, 2, ws, x, rows, ys);
    expert_act(m, L, e, g, u, rows, gate->ne1);
}

/* Whether decode can run the layer's experts in one region (decode_experts)
 * or two (grouped_experts): every expert and shared-expert matrix repacked. */
static bool decode_fused(const model *m, const layer_weights *L) {
    const mtensor *ts[] = {&L->ffn_gate_exps,  &L->ffn_up_exps,  &L->ffn_down_exps,
                           &L->ffn_gate_shexp, &L->ffn_up_shexp, &L->ffn_down_shexp};
    const bool shared = L->ffn_gate_shexp.data != NULL;
    /* llama4 (each expert's input weighted) goes the general way */
    if (m->hp.moe.weight_input) return false;
    if (2 * m->hp.moe.n_expert_used + 2 > KERN_EACH_MAX) return false;
    /* an adapted shared expert (model_lora.c) goes through op_matmul */
    if (L->ffn_gate_shexp.lora || L->ffn_up_shexp.lora || L->ffn_down_shexp.lora) return false;
    for (int i = 0; i < (shared ? 6 : 3); i++)
        if (!ts[i]->packed) return false;
    return true;
}

/* decode_experts' matrices for layer L: gu[2e] and gu[2e + 1] the gate and up
 * of expert slot e (s->ids[e] of token 0; the shared expert last), down[e]
 * its down, on x and s's buffers; with s NULL their types and shapes only
 * (sizing the work before the weights are repacked). Returns the slots. */
static int decode_mats(const model *m, const layer_weights *L, const struct moe_scratch *s,
                       const float *x, kern_repacked_one *gu, kern_repacked_one *down) {
    const model_moe_hparams *mo = &m->hp.moe;
    const int64_t E = m->hp.n_embd, K = mo->n_expert_used, F = mo->n_ff_exp, FS = mo->n_ff_shexp;
    const bool shared = L->ffn_gate_shexp.data != NULL;
    const mtensor *gt = &L->ffn_gate_exps, *ut = &L->ffn_up_exps, *dt = &L->ffn_down_exps;
    int ne = 0;
    for (int64_t i = 0; i < K; i++, ne++) {
        const int64_t e = s ? s->ids[i] : 0;
        float *g = s ? s->hg + i * F : NULL, *u = s ? s->hu + i * F : NULL;
        gu[2 * ne] =
            (kern_repacked_one){s ? expert_slice(gt, e).packed : NULL, gt->dtype, F, E, x, g};
        gu[2 * ne + 1] =
            (kern_repacked_one){s ? expert_slice(ut, e).packed : NULL, ut->dtype, F, E, x, u};
        down[ne] = (kern_repacked_one){
            s ? expert_slice(dt, e).packed : NULL, dt->dtype, E, F, g, s ? s->out + i * E : NULL};
    }
    if (shared) {
        const mtensor *g = &L->ffn_gate_shexp, *u = &L->ffn_up_shexp, *d = &L->ffn_down_shexp;
        float *hg = s ? s->hg + K * F : NULL, *hu = s ? s->hu + K * F : NULL;
        gu[2 * ne] = (kern_repacked_one){g->packed, g->dtype, FS, E, x, hg};
        gu[2 * ne + 1] = (kern_repacked_one){u->packed, u->dtype, FS, E, x, hu};
        down[ne++] = (kern_repacked_one){d->packed, d->dtype, E, FS, hg, s ? s->sh : NULL};
    }
    return ne;
}

/* Bytes of one routed expert's gate, up and down slices in layer L (file types). */
static double expert_bytes(const layer_weights *L) {
    return mtensor_slice_bytes(&L->ffn_gate_exps) + mtensor_slice_bytes(&L->ffn_up_exps) +
           mtensor_slice_bytes(&L->ffn_down_exps);
}

/* decode_experts' activation of expert slot e (the shared expert after the
 * K selected ones), called by kern_matmul_repacked_gated once its gate and up
 * are done. */
typedef struct {
    const model *m;
    const layer_weights *L;
    struct moe_scratch *s;
} decode_act_ctx;

static void decode_act(void *vctx, int e) {
    const decode_act_ctx *a = vctx;
    const int64_t K = a->m->hp.moe.n_expert_used, F = a->m->hp.moe.n_ff_exp;
    const bool shared = e == K;
    expert_act(a->m, a->L, shared ? -1 : a->s->ids[e], a->s->hg + e * F, a->s->hu + e * F, 1,
               shared ? a->m->hp.moe.n_ff_shexp : F);
}

/* Decode's selected experts (s->ids of token 0) and shared expert: s->out[i]
 * = down_i(act(gate_i x, up_i x)) (SiLU, or gpt-oss's biases and swiglu_oai
 * as expert_act applies them; the weight s->w[i] comes in moe_ffn's sum), s->sh
 * the shared expert's output (before qwen2moe's gate), each element computed
 * exactly as by op_matmul one matrix at a time, all in one parallel region
 * (kern_matmul_repacked_gated). */
static void decode_experts(model *m, const layer_weights *L, const float *x) {
    struct moe_scratch *s = m->moe;
    const int64_t E = m->hp.n_embd, K = m->hp.moe.n_expert_used;
    kern_repacked_one gu[KERN_EACH_MAX], down[KERN_EACH_MAX];
    const int ne = decode_mats(m, L, s, x, gu, down);
    decode_act_ctx act = {m, L, s};
    PHASE_BEGIN(t_experts);
    kern_matmul_repacked_gated(ne, gu, down, decode_act, &act, s->each_work);
    PHASE_END(t_experts, PHASE_EXPERTS,
              K * expert_bytes(L) + mtensor_slice_bytes(&L->ffn_gate_shexp) +
                  mtensor_slice_bytes(&L->ffn_up_shexp) + mtensor_slice_bytes(&L->ffn_down_shexp));
    for (int64_t i = 0; i < K; i++)
        add_expert_bias(s->out + i * E, &L->ffn_down_exps_b, s->ids[i], 1);
}

/* grouped_experts' hook: the activation of one down input row (mat: the
 * matrix of that input in the down call), in place, as expert_act gives it. */
typedef struct {
    model *m;
    const layer_weights *L;
    const int32_t *mat_expert; /* [mat] expert, -1: the shared one */
    const int64_t *mat_off;    /* [mat] offset of its first row in gg / gu */
    const int64_t *mat_width;
} grouped_act;

static void grouped_act_row(void *vctx, int mat, int64_t row) {
    const grouped_act *a = vctx;
    const int64_t w = a->mat_width[mat], off = a->mat_off[mat] + row * w;
    struct moe_scratch *s = a->m->moe;
    expert_act(a->m, a->L, a->mat_expert[mat], s->gg + off, s->gu + off, 1, w);
}

/* A few tokens (a batched decode step), every expert matrix repacked: the
 * selected experts' gate and up (and the shared expert's) in one call of
 * kern_matmul_repacked_rows, each expert on the rows of the tokens that chose
 * it; then every down, its input rows activated as they are prepared; the
 * outputs (unweighted) to s->out, the shared expert's to s->sh. Each element is
 * what the expert-by-expert path computes. */
static void grouped_experts(model *m, const layer_weights *L, const float *x, int64_t n) {
    const model_moe_hparams *mo = &m->hp.moe;
    struct moe_scratch *s = m->moe;
    const int64_t E = m->hp.n_embd, K = mo->n_expert_used, NE = mo->n_expert, F = mo->n_ff_exp,
                  FS = mo->n_ff_shexp, P = n * K;
    const bool shared = L->ffn_gate_shexp.data != NULL;
    kern_repacked_rows *mats = s->gmats;
    int32_t *mat_expert = s->gexp;
    int64_t *mat_off = s->goff, *mat_width = s->gwid;
    for (int64_t o = 0; o < P; o++) s->gx[o] = x + (s->order[o] / K) * E;
    for (int64_t t = 0; t < n; t++) s->gx[P + t] = x + t * E;
    int nw = 0;
    for (int64_t e = 0; e < NE; e++) {
        const int64_t c = s->count[e], o = s->start[e];
        if (c == 0) continue;
        const mtensor g = expert_slice(&L->ffn_gate_exps, e), u = expert_slice(&L->ffn_up_exps, e);
        mats[nw++] = (kern_repacked_rows){g.packed, g.dtype, F, E, c, s->gx + o, s->gg + o * F};
        mats[nw++] = (kern_repacked_rows){u.packed, u.dtype, F, E, c, s->gx + o, s->gu + o * F};
    }
    if (shared) {
        const mtensor *g = &L->ffn_gate_shexp, *u = &L->ffn_up_shexp;
        mats[nw++] = (kern_repacked_rows){g->packed, g->dtype, FS, E, n, s->gx + P, s->gg + P * F};
        mats[nw++] = (kern_repacked_rows){u->packed, u->dtype, FS, E, n, s->gx + P, s->gu + P * F};
    }
    kern_matmul_repacked_rows(nw, mats, NULL, NULL, s->gwork);
    for (int64_t o = 0; o < P; o++) s->gh[o] = s->gg + o * F;
    for (int64_t t = 0; t < n; t++) s->gh[P + t] = s->gg + P * F + t * FS;
    nw = 0;
    for (int64_t e = 0; e < NE; e++) {
        const int64_t c = s->count[e], o = s->start[e];
        if (c == 0) continue;
        const mtensor d = expert_slice(&L->ffn_down_exps, e);
        mat_expert[nw] = (int32_t)e, mat_off[nw] = o * F, mat_width[nw] = F;
        mats[nw++] = (kern_repacked_rows){
            d.packed, d.dtype, E, F, c, (const float *const *)s->gh + o, s->gy + o * E};
    }
    if (shared) {
        const mtensor *d = &L->ffn_down_shexp;
        mat_expert[nw] = -1, mat_off[nw] = P * F, mat_width[nw] = FS;
        mats[nw++] = (kern_repacked_rows){
            d->packed, d->dtype, E, FS, n, (const float *const *)s->gh + P, s->sh};
    }
    grouped_act act = {m, L, mat_expert, mat_off, mat_width};
    kern_matmul_repacked_rows(nw, mats, grouped_act_row, &act, s->gwork);
    for (int64_t e = 0; e < NE; e++)
        for (int64_t r = 0; r < s->count[e]; r++) {
            const int64_t o = s->start[e] + r;
            float *src = s->gy + o * E;
            add_expert_bias(src, &L->ffn_down_exps_b, e, 1);
            memcpy(s->out + (size_t)s->order[o] * E, src, (size_t)E * sizeof(float));
        }
}

/* y = sum over k in order of o[k] * w[k] (w NULL: weights 1), then + sh,
 * four lanes at a time (GCC's vector type; y and o never overlap: o is the
 * scratch's): the scalar loops were most of a prefill's moe_ffn, which the
 * compiler left scalar at -O2. Each element takes the same multiply and add
 * steps as a scalar loop would. */
typedef float f32x4 __attribute__((vector_size(16)));
static inline f32x4 ld4(const float *p) {
    f32x4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static void combine_experts(float *y, const float *o, const float *w, int64_t K, int64_t E,
                            const float *sh) {
    int64_t i = 0;
    for (; i + 4 <= E; i += 4) {
        f32x4 acc = w ? ld4(o + i) * w[0] : ld4(o + i);
        for (int64_t k = 1; k < K; k++) acc += w ? ld4(o + k * E + i) * w[k] : ld4(o + k * E + i);
        if (sh) acc += ld4(sh + i);
        memcpy(y + i, &acc, sizeof acc);
    }
    for (; i < E; i++) {
        float acc = w ? o[i] * w[0] : o[i];
        for (int64_t k = 1; k < K; k++) acc += w ? o[k * E + i] * w[k] : o[k * E + i];
        y[i] = sh ? acc + sh[i] : acc;
    }
}

void moe_ffn(model *m, const layer_weights *L, const float *x, const float *router_x, int64_t n,
             float *y) {
    const model_moe_hparams *mo = &m->hp.moe;
    struct moe_scratch *s = m->moe;
    const int64_t E = m->hp.n_embd, K = mo->n_expert_used, NE = mo->n_expert;
    PHASE_BEGIN(t_router);
    op_matmul(m, &L->ffn_gate_inp, router_x ? router_x : x, n, s->probs);
    if (L->ffn_gate_inp_b.data)
        for (int64_t t = 0; t < n; t++)
            for (int64_t j = 0; j < NE; j++)
                s->probs[t * NE + j] += ((const float *)L->ffn_gate_inp_b.data)[j];
    for (int64_t t = 0; t < n; t++)
        route(mo, L, s, s->probs + t * NE, s->ids + t * K, s->w + t * K);
    /* group the (token, slot) pairs by expert, in token order */
    memset(s->count, 0, (size_t)NE * sizeof *s->count);
    for (int64_t i = 0; i < n * K; i++) s->count[s->ids[i]]++;
    for (int64_t e = 0, acc = 0; e < NE; e++) {
        s->start[e] = (int32_t)acc;
        acc += s->count[e];
    }
    for (int64_t i = 0; i < n * K; i++) s->order[s->start[s->ids[i]]++] = (int32_t)i;
    for (int64_t e = 0; e < NE; e++) s->start[e] -= s->count[e];
    const uint64_t per_expert = (uint64_t)expert_bytes(L);
    for (int64_t e = 0; e < NE; e++) /* each selected expert's weights are read once */
        if (s->count[e]) m->moe_routed_bytes += per_expert;
    /* One token (decode): one parallel region for the whole layer, gate and up
     * of every selected expert and of the shared expert on one prepared x, each
     * down on its own input as soon as its expert's activation is made; a few
     * tokens: two (grouped_experts); the sums below are unchanged. */
    const int64_t sel = n * K < NE ? n * K : NE; /* at most this many experts selected */
    const bool fused = n <= s->gmax && 2 * sel + 2 <= KERN_ROWS_MAX_MATS && decode_fused(m, L);
    PHASE_END(t_router, PHASE_ROUTER, mtensor_slice_bytes(&L->ffn_gate_inp));
    if (fused && n == 1) decode_experts(m, L, x);
    else if (fused) grouped_experts(m, L, x, n);
    for (int64_t e = 0; e < NE && !fused; e++) {
        const int64_t c = s->count[e];
        if (c == 0) continue; /* not read at all */
        const int32_t *rows = s->order + s->start[e];
        for (int64_t r = 0; r < c; r++)
            if (mo->weight_input) { /* llama4: the weight scales the expert's input */
                const float wr = s->w[rows[r]], *xr = x + (rows[r] / K) * E;
                for (int64_t i = 0; i < E; i++) s->xg[r * E + i] = xr[i] * wr;
            } else {
                memcpy(s->xg + r * E, x + (rows[r] / K) * E, (size_t)E * sizeof(float));
            }
        const mtensor gate = expert_slice(&L->ffn_gate_exps, e),
                      up = expert_slice(&L->ffn_up_exps, e),
                      down = expert_slice(&L->ffn_down_exps, e);
        gated(m, L, e, &gate, &up, s->xg, c, s->hg, s->hu);
        op_matmul(m, &down, s->hg, c, s->yg);
        add_expert_bias(s->yg, &L->ffn_down_exps_b, e, c);
        for (int64_t r = 0; r < c; r++)
            memcpy(s->out + (size_t)rows[r] * E, s->yg + r * E, (size_t)E * sizeof(float));
    }
    const bool shared = L->ffn_gate_shexp.data != NULL;
    if (shared) {
        if (!fused) {
            gated(m, L, -1, &L->ffn_gate_shexp, &L->ffn_up_shexp, x, n, s->hg, s->hu);
            op_matmul(m, &L->ffn_down_shexp, s->hg, n, s->sh);
        }
        if (L->ffn_gate_inp_shexp.data) { /* qwen2moe: sigmoid as ggml writes it, silu(v) / v */
            op_matmul(m, &L->ffn_gate_inp_shexp, x, n, s->shg);
            for (int64_t t = 0; t < n; t++) {
                const float v = s->shg[t], g = (v / (1.0f + expf(-v))) / v;
                for (int64_t i = 0; i < E; i++) s->sh[t * E + i] *= g;
            }
        }
    }
    /* the experts' outputs times their weights (llama4 weighted the input
     * instead), added in selection order, then the shared expert (y may alias
     * x: no longer read). The weights are applied here, in the one pass over
     * the outputs the workers wrote, not in one of their own. */
    const float *down_s = L->ffn_down_exps_s.data; /* gemma4: each expert's output scaled */
    for (int64_t t = 0; t < n; t++) {
        float *o = s->out + (size_t)t * K * E;
        const float *wt = s->w + t * K;
        float *yt = y + t * E;
        for (int64_t k = 0; k < K && down_s; k++) {
            const float sc = down_s[s->ids[t * K + k]];
            for (int64_t i = 0; i < E; i++) o[k * E + i] *= sc;
        }
        combine_experts(yt, o, mo->weight_input ? NULL : wt, K, E, shared ? s->sh + t * E : NULL);
    }
}
