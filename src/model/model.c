/* model: loading hyperparameters and weights from GGUF, and the KV layout.
 * The forward pass is in model_forward.c, the ops in model_ops.c. Weights are
 * pointers into the read-only mapping; every shape and type is checked here so
 * the forward pass can trust them. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvl_pool.h"
#include "model_internal.h"
#include "units.h"

/* ---------------------------------------------------------------- loading -- */

/* The shape as the one reader (hparams.c) gives it, checked for what kvllm
 * runs: a supported architecture, plausible sizes, MLA in llama.cpp's
 * absorbed form or the uncompressed form of older files, dense layers, a rope
 * scaling it implements. */
static bool check_mla_hparams(const model *m, kvl_error *err) {
    const gguf_file *f = m->gguf;
    const model_hparams *hp = &m->hp;
    const char *a = hp->arch;
    int64_t k_mla = hp->n_rot_mla_nope + hp->n_rot, v_mla = hp->v_head_dim_mla;
    if (!hp->mla) { /* uncompressed: one KV head per query head of key_length + value_length */
        if (hp->kv_lora_rank <= 0 || hp->n_head_kv != hp->n_head || hp->n_rot_mla_nope <= 0)
            return kvl_fail(
                err,
                "%s: key '%s.attention.key_length_mla' missing, and the file is not in the "
                "uncompressed form either (kv_lora %lld, kv heads %lld of %lld, key %lld, rope "
                "%lld)",
                gguf_path(f), a, (long long)hp->kv_lora_rank, (long long)hp->n_head_kv,
                (long long)hp->n_head, (long long)hp->head_dim_k, (long long)hp->n_rot);
        return true;
    }
    if (hp->n_head_kv != 1 || hp->head_dim_k != hp->kv_lora_rank + hp->n_rot ||
        hp->head_dim_v != hp->kv_lora_rank || k_mla <= hp->n_rot || v_mla <= 0 || v_mla > 4096)
        return kvl_fail(err,
                        "%s: MLA shape not in llama.cpp's absorbed form (kv heads %lld, key %lld, "
                        "value %lld, kv_lora %lld, rope %lld, key_mla %lld)",
                        gguf_path(f), (long long)hp->n_head_kv, (long long)hp->head_dim_k,
                        (long long)hp->head_dim_v, (long long)hp->kv_lora_rank,
                        (long long)hp->n_rot, (long long)k_mla);
    return true;
}

static bool read_hparams(model *m, kvl_error *err) {
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    if (!model_hparams_from_gguf(f, hp, err)) return false;
    if (m->mp.yarn_override &&
        !model_hparams_set_yarn(hp, m->mp.yarn_ext_factor, m->mp.yarn_attn_factor,
                                m->mp.yarn_beta_fast, m->mp.yarn_beta_slow, err))
        return false;
    if (m->mp.attn_chunk > 0 && hp->n_chunk > 0) hp->n_chunk = m->mp.attn_chunk; /* tests */
    m->arch = arch_find(hp->arch);
    if (!m->arch)
        return kvl_fail(err, "%s: architecture '%s' is not supported (supported: %s)", gguf_path(f),
                        hp->arch, arch_supported_list());
    const char *a = hp->arch;
    if (hp->n_embd == 0)
        return kvl_fail(err, "%s: key '%s.embedding_length' missing", gguf_path(f), a);
    if (hp->n_ff == 0)
        return kvl_fail(err, "%s: key '%s.feed_forward_length' missing", gguf_path(f), a);
    if (hp->n_embd > (1 << 20) || hp->n_layer > 4096 || hp->n_head > 4096 || hp->n_ff > (1 << 22))
        return kvl_fail(
            err, "%s: implausible hyperparameters (embd %lld, layers %lld, heads %lld, ff %lld)",
            gguf_path(f), (long long)hp->n_embd, (long long)hp->n_layer, (long long)hp->n_head,
            (long long)hp->n_ff);
    for (int swa = 0; swa < 2; swa++) { /* the full layers' shape, then the sliding ones' */
        const model_layer_attn la = model_hparams_kind_attn(hp, swa);
        const int64_t h = la.n_head_kv, k = la.head_dim_k, v = la.head_dim_v, r = la.n_rot;
        if (h <= 0 || hp->n_head % h != 0)
            return kvl_fail(err, "%s: head_count %lld is not a multiple of head_count_kv %lld%s",
                            gguf_path(f), (long long)hp->n_head, (long long)h,
                            swa ? " (sliding layers)" : "");
        if (k <= 0 || k > 1024 || v <= 0 || v > 1024 || r > k || r % 2)
            return kvl_fail(err, "%s: bad head dims%s (k %lld, v %lld, rope %lld)", gguf_path(f),
                            swa ? " of the sliding layers" : "", (long long)k, (long long)v,
                            (long long)r);
    }
    for (int64_t il = hp->n_layer_kv; il < hp->n_layer; il++) {
        const int64_t src = model_hparams_kv_source(hp, il);
        if (src < 0 || hp->swa_layers[src] != hp->swa_layers[il])
            return kvl_fail(err,
                            "%s: key '%s.attention.shared_kv_layers': layer %lld would read the "
                            "cache of layer %lld, which is not of its kind (sliding or full)",
                            gguf_path(f), a, (long long)il, (long long)src);
    }
    if (hp->n_embd_per_layer > 0 && !m->arch->gemma4)
        return kvl_fail(err,
                        "%s: key '%s.embedding_length_per_layer_input' = %lld: per-layer "
                        "embeddings are supported for gemma4 only",
                        gguf_path(f), a, (long long)hp->n_embd_per_layer);
    const char *rs = hp->rope_scaling;
    if (rs[0] && strcmp(rs, "none") != 0 && strcmp(rs, "linear") != 0 && strcmp(rs, "yarn") != 0)
        return kvl_fail(
            err,
            "%s: key '%s.rope.scaling.type': rope scaling '%s' is not supported (supported: none, "
            "linear, yarn)",
            gguf_path(f), a, rs);
    if (m->arch->norm == ARCH_NORM_LAYER && !(hp->norm_eps > 0))
        return kvl_fail(err, "%s: key '%s.attention.layer_norm_epsilon' missing", gguf_path(f), a);
    if ((m->arch->granite_scales || strcmp(a, "cohere2") == 0) && hp->logit_scale == 0)
        return kvl_fail(err, "%s: key '%s.logit_scale' missing", gguf_path(f), a);
    if (strcmp(a, "cohere2") == 0 && hp->n_swa == 0)
        return kvl_fail(err, "%s: key '%s.attention.sliding_window' missing", gguf_path(f), a);
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
    if (strcmp(a, "glm4moe") == 0 && gguf_find_key(f, key) >= 0)
        return kvl_fail(err, "%s: key '%s': multimodal rope sections are not supported",
                        gguf_path(f), key);
    if (m->arch->chunked && hp->n_rot != hp->head_dim_k)
        return kvl_fail(err,
                        "%s: key '%s.rope.dimension_count' = %lld: llama4 rotates whole heads "
                        "(%lld)",
                        gguf_path(f), a, (long long)hp->n_rot, (long long)hp->head_dim_k);
    if (m->arch->attn == ARCH_ATTN_MLA && !check_mla_hparams(m, err)) return false;
    return moe_check_support(m, err);
}

/* Looks up a weight and checks its shape and type. ne1 = 0 means a 1-D tensor;
 * ne2 > 1 a stack of per-head matrices. */
static bool bind3(model *m, mtensor *t, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                  bool required, kvl_error *err) {
    const gguf_tensor *gt = gguf_find_tensor(m->gguf, name);
    memset(t, 0, sizeof *t);
    if (!gt)
        return required ? kvl_fail(err, "%s: tensor '%s' missing", gguf_path(m->gguf), name) : true;
    int64_t want1 = ne1 ? ne1 : 1;
    if (gt->ne[0] != ne0 || gt->ne[1] != want1 || gt->ne[2] != ne2 || gt->ne[3] != 1)
        return kvl_fail(
            err, "%s: tensor '%s': shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]",
            gguf_path(m->gguf), name, (long long)gt->ne[0], (long long)gt->ne[1],
            (long long)gt->ne[2], (long long)gt->ne[3], (long long)ne0, (long long)want1,
            (long long)ne2);
    const kern_traits *tr = kern_traits_of(gt->dtype);
    bool is_vector = ne1 == 0;
    if (is_vector ? gt->dtype != GGUF_DT_F32 : (!tr || !tr->vec_dot || !tr->to_float))
        return kvl_fail(err, "%s: tensor '%s': type %s is not supported here", gguf_path(m->gguf),
                        name, gguf_dtype_name(gt->dtype));
    if (!gt->data) return kvl_fail(err, "%s: tensor '%s' has no data", gguf_path(m->gguf), name);
    *t = (mtensor){.data = gt->data, .dtype = gt->dtype, .ne0 = ne0, .ne1 = want1, .ne2 = ne2};
    return true;
}

bool model_bind(model *m, mtensor *t, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                bool required, kvl_error *err) {
    return bind3(m, t, name, ne0, ne1, ne2, required, err);
}

static bool bind(model *m, mtensor *t, const char *name, int64_t ne0, int64_t ne1, bool required,
                 kvl_error *err) {
    return bind3(m, t, name, ne0, ne1, 1, required, err);
}

/* A fused tensor (attn_qkv, phi3's gate + up) as n consecutive row ranges:
 * each part is a view of rows[i] rows (a 1-D bias: rows[i] values), so the
 * forward pass and the kernels see separate tensors and each output row is
 * the same dot product the fused matmul computes. False (err set) when the
 * tensor is there with the wrong shape; *found tells whether it is there. */
static bool bind_split(model *m, const char *name, int64_t ne0, int n, const int64_t *rows,
                       mtensor *const *parts, bool *found, kvl_error *err) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += rows[i];
    mtensor whole;
    *found = gguf_find_tensor(m->gguf, name) != NULL;
    if (!*found) return true;
    if (!bind3(m, &whole, name, ne0 ? ne0 : total, ne0 ? total : 0, 1, true, err)) return false;
    const size_t row_bytes = ne0 ? kern_row_bytes(whole.dtype, ne0) : sizeof(float);
    const uint8_t *p = whole.data;
    for (int i = 0; i < n; i++) {
        *parts[i] = whole;
        parts[i]->data = p;
        if (ne0) parts[i]->ne1 = rows[i];
        else parts[i]->ne0 = rows[i];
        p += (size_t)rows[i] * row_bytes;
    }
    return true;
}

/* Layer il's weight blk.<il>.<suffix> (see bind). */
bool model_bind_blk(model *m, int il, mtensor *t, const char *suffix, int64_t ne0, int64_t ne1,
                    int64_t ne2, bool required, kvl_error *err) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return bind3(m, t, name, ne0, ne1, ne2, required, err);
}

static bool bind_blk(model *m, int il, mtensor *t, const char *suffix, int64_t ne0, int64_t ne1,
                     bool required, kvl_error *err) {
    return model_bind_blk(m, il, t, suffix, ne0, ne1, 1, required, err);
}

/* Q/K/V/O of standard multi-head (MHA/GQA/MQA) attention. */
static bool bind_attn_mha(model *m, int il, layer_weights *L, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    const model_layer_attn la = model_hparams_layer_attn(hp, il);
    int64_t E = hp->n_embd, dk = la.head_dim_k, qd = hp->n_head * dk, kd = la.n_head_kv * dk,
            vd = la.n_head_kv * la.head_dim_v, od = hp->n_head * la.head_dim_v;
    char n[96];
    /* llama.cpp takes a fused attn_qkv (phi3's layout) wherever q, k and v may be */
    const int64_t rows[3] = {qd, kd, vd};
    mtensor *w3[3] = {&L->wq, &L->wk, &L->wv}, *b3[3] = {&L->bq, &L->bk, &L->bv};
    bool fused, fused_bias;
    snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", il);
    if (!bind_split(m, n, E, 3, rows, w3, &fused, err)) return false;
    if (fused) {
        snprintf(n, sizeof n, "blk.%d.attn_qkv.bias", il);
        if (!bind_split(m, n, 0, 3, rows, b3, &fused_bias, err)) return false;
    } else {
        /* gemma4: a layer sharing another's cache needs no K; V is K where
         * attn_v is absent (llama.cpp's use_alternative_attention) */
        const bool own_kv = model_hparams_kv_source(hp, il) == il;
        if (!bind_blk(m, il, &L->wq, "attn_q.weight", E, qd, true, err)) return false;
        if (!bind_blk(m, il, &L->wk, "attn_k.weight", E, kd, own_kv || !m->arch->gemma4, err))
            return false;
        if (!bind_blk(m, il, &L->wv, "attn_v.weight", E, vd, !m->arch->gemma4, err)) return false;
        if (!own_kv && m->arch->gemma4) { /* present or not, never read */
            memset(&L->wk, 0, sizeof L->wk);
            memset(&L->wv, 0, sizeof L->wv);
        }
        if (!L->wv.data && own_kv && m->arch->gemma4 && la.head_dim_v != dk)
            return kvl_fail(err,
                            "%s: tensor 'blk.%d.attn_v.weight' missing (V is K only where "
                            "the head widths agree: K %lld, V %lld)",
                            gguf_path(m->gguf), il, (long long)dk, (long long)la.head_dim_v);
        if (m->arch->qkv_bias_allowed) {
            if (!bind_blk(m, il, &L->bq, "attn_q.bias", qd, 0, false, err)) return false;
            if (!bind_blk(m, il, &L->bk, "attn_k.bias", kd, 0, false, err)) return false;
            if (!bind_blk(m, il, &L->bv, "attn_v.bias", vd, 0, false, err)) return false;
        }
    }
    if (!bind_blk(m, il, &L->wo, "attn_output.weight", od, E, true, err)) return false;
    if (m->arch->granite_scales && !bind_blk(m, il, &L->bo, "attn_output.bias", E, 0, false, err))
        return false;
    if (m->arch->gpt_oss) {
        if (!bind_blk(m, il, &L->bo, "attn_output.bias", E, 0, true, err)) return false;
        if (!bind_blk(m, il, &L->attn_sinks, "attn_sinks.weight", hp->n_head, 0, true, err))
            return false;
    }
    if (m->arch->qk_norm || m->arch->qk_norm_optional) {
        if (!bind_blk(m, il, &L->q_norm, "attn_q_norm.weight", dk, 0, m->arch->qk_norm, err))
            return false;
        if (!bind_blk(m, il, &L->k_norm, "attn_k_norm.weight", dk, 0,
                      (m->arch->qk_norm || L->q_norm.data) && L->wk.data, err))
            return false;
    }
    if (strcmp(hp->arch, "command-r") == 0 && hp->n_layer >= 64) {
        /* Command R+ (llama.cpp: command-r of 64 layers or more): q and k LayerNorm per
         * head, with one weight row per head */
        if (!bind_blk(m, il, &L->q_norm, "attn_q_norm.weight", dk, hp->n_head, true, err))
            return false;
        if (!bind_blk(m, il, &L->k_norm, "attn_k_norm.weight", dk, la.n_head_kv, true, err))
            return false;
        if (L->q_norm.dtype != GGUF_DT_F32 || L->k_norm.dtype != GGUF_DT_F32)
            return kvl_fail(err, "%s: blk.%d.attn_q_norm / attn_k_norm: expected F32",
                            gguf_path(m->gguf), il);
    }
    if (m->arch->qk_norm_full) {
        if (!bind_blk(m, il, &L->q_norm, "attn_q_norm.weight", qd, 0, true, err)) return false;
        if (!bind_blk(m, il, &L->k_norm, "attn_k_norm.weight", kd, 0, true, err)) return false;
    }
    return true;
}

/* MLA: low-rank q (or a plain q), the joint latent + rope projection, and the
 * per-head up-projections absorbed into q (k_b) and applied after attention (v_b). */
static bool bind_attn_mla(model *m, int il, layer_weights *L, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, H = hp->n_head, nope = hp->n_rot_mla_nope, rope = hp->n_rot;
    int64_t r = hp->kv_lora_rank, vd = hp->v_head_dim_mla, qd = H * (nope + rope);
    char n[96];
    if (hp->q_lora_rank > 0) {
        if (!bind_blk(m, il, &L->wq_a, "attn_q_a.weight", E, hp->q_lora_rank, true, err))
            return false;
        if (!bind_blk(m, il, &L->q_a_norm, "attn_q_a_norm.weight", hp->q_lora_rank, 0, true, err))
            return false;
        if (!bind_blk(m, il, &L->wq_b, "attn_q_b.weight", hp->q_lora_rank, qd, true, err))
            return false;
    } else {
        if (!bind_blk(m, il, &L->wq, "attn_q.weight", E, qd, true, err)) return false;
    }
    if (!bind_blk(m, il, &L->wkv_a_mqa, "attn_kv_a_mqa.weight", E, r + rope, true, err))
        return false;
    if (!bind_blk(m, il, &L->kv_a_norm, "attn_kv_a_norm.weight", r, 0, true, err)) return false;
    if (!bind_blk(m, il, &L->wo, "attn_output.weight", H * vd, E, true, err)) return false;
    if (!hp->mla) { /* uncompressed (older files): the joint up-projection, per head [nope | v] rows */
        if (!bind_blk(m, il, &L->wkv_b, "attn_kv_b.weight", r, H * (nope + vd), true, err))
            return false;
        return true;
    }
    snprintf(n, sizeof n, "blk.%d.attn_k_b.weight", il);
    if (!bind3(m, &L->wk_b, n, nope, r, H, true, err)) return false;
    snprintf(n, sizeof n, "blk.%d.attn_v_b.weight", il);
    return bind3(m, &L->wv_b, n, r, vd, H, true, err);
}

static bool bind_layer(model *m, int il, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    layer_weights *L = &m->layers[il];
    const int64_t E = hp->n_embd, n_ff = model_hparams_n_ff(hp, il);
    char n[96];
    const bool pre_norms = !m->arch->no_pre_norms;
    if (pre_norms && !bind_blk(m, il, &L->attn_norm, "attn_norm.weight", E, 0, true, err))
        return false;
    if (!(m->arch->attn == ARCH_ATTN_MLA ? bind_attn_mla(m, il, L, err)
                                         : bind_attn_mha(m, il, L, err)))
        return false;
    if (pre_norms && !m->arch->parallel &&
        !bind_blk(m, il, &L->ffn_norm,
                  m->arch->ffn_norm_post_attn ? "post_attention_norm.weight" : "ffn_norm.weight", E,
                  0, true, err))
        return false;
    snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", il);
    if (!moe_layer(m, il) && gguf_find_tensor(m->gguf, n))
        return kvl_fail(err, "%s: tensor '%s': a router in a layer that key '%s.%s' makes dense",
                        gguf_path(m->gguf), n, hp->arch,
                        hp->moe.n_expert ? "leading_dense_block_count" : "expert_count");
    if (moe_layer(m, il)) {
        if (!moe_bind_layer(m, il, err)) return false;
        if (m->arch->gemma4) { /* the dense FFN beside the experts, and their norms */
            if (!bind_blk(m, il, &L->ffn_gate, "ffn_gate.weight", E, n_ff, true, err) ||
                !bind_blk(m, il, &L->ffn_up, "ffn_up.weight", E, n_ff, true, err) ||
                !bind_blk(m, il, &L->ffn_down, "ffn_down.weight", n_ff, E, true, err) ||
                !bind_blk(m, il, &L->ffn_pre_norm_2, "pre_ffw_norm_2.weight", E, 0, true, err) ||
                !bind_blk(m, il, &L->ffn_post_norm_1, "post_ffw_norm_1.weight", E, 0, true, err) ||
                !bind_blk(m, il, &L->ffn_post_norm_2, "post_ffw_norm_2.weight", E, 0, true, err))
                return false;
        }
    } else if (m->arch->fused_gate_up) { /* phi3: ffn_up is [gate; up], 2 * n_ff rows */
        const int64_t rows[2] = {n_ff, n_ff};
        mtensor *parts[2] = {&L->ffn_gate, &L->ffn_up};
        bool found;
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", il);
        if (!bind_split(m, n, E, 2, rows, parts, &found, err)) return false;
        if (!found) return kvl_fail(err, "%s: tensor '%s' missing", gguf_path(m->gguf), n);
        if (!bind_blk(m, il, &L->ffn_down, "ffn_down.weight", n_ff, E, true, err)) return false;
    } else {
        if (!bind_blk(m, il, &L->ffn_gate, "ffn_gate.weight", E, n_ff, true, err)) return false;
        if (!bind_blk(m, il, &L->ffn_up, "ffn_up.weight", E, n_ff, true, err)) return false;
        if (!bind_blk(m, il, &L->ffn_down, "ffn_down.weight", n_ff, E, true, err)) return false;
    }
    if (m->arch->post_norms) {
        if (!bind_blk(m, il, &L->post_attn_norm, "post_attention_norm.weight", E, 0, true, err))
            return false;
        if (!bind_blk(m, il, &L->post_ffn_norm, "post_ffw_norm.weight", E, 0, true, err))
            return false;
    }
    if (m->arch->gemma4 &&
        !bind_blk(m, il, &L->out_scale, "layer_output_scale.weight", 1, 0, false, err))
        return false;
    const int64_t np = hp->n_embd_per_layer;
    if (np > 0 && (!bind_blk(m, il, &L->pl_inp_gate, "inp_gate.weight", E, np, true, err) ||
                   !bind_blk(m, il, &L->pl_proj, "proj.weight", np, E, true, err) ||
                   !bind_blk(m, il, &L->pl_post_norm, "post_norm.weight", E, 0, true, err)))
        return false;
    const int A = ALTUP_N;
    if (m->arch->altup &&
        (!bind_blk(m, il, &L->altup_router, "altup_router.weight", E, A, true, err) ||
         !bind_blk(m, il, &L->altup_router_norm, "altup_router_norm.weight", E, 0, true, err) ||
         !bind_blk(m, il, &L->altup_predict_coef, "altup_predict_coef.weight", A, A * A, true,
                   err) ||
         !bind_blk(m, il, &L->altup_correct_coef, "altup_correct_coef.weight", A, A, true, err) ||
         !bind_blk(m, il, &L->altup_correct_scale, "altup_correct_scale.weight", E, 0, true, err) ||
         !bind_blk(m, il, &L->laurel_l, "laurel_l.weight", E, LAUREL_RANK, true, err) ||
         !bind_blk(m, il, &L->laurel_r, "laurel_r.weight", LAUREL_RANK, E, true, err) ||
         !bind_blk(m, il, &L->laurel_post_norm, "laurel_post_norm.weight", E, 0, true, err)))
        return false;
    /* the coefficients are read as floats (4-value products, model_altup.c) */
    if (m->arch->altup &&
        (L->altup_predict_coef.dtype != GGUF_DT_F32 || L->altup_correct_coef.dtype != GGUF_DT_F32))
        return kvl_fail(err, "%s: blk.%d.altup_predict_coef / altup_correct_coef: expected F32",
                        gguf_path(m->gguf), il);
    return true;
}

/* Each layer's rope and KV group, from the reader's per-layer sliding flags. */
static void assign_layer_geometry(model *m) {
    model_hparams *hp = &m->hp;
    float base_swa = hp->rope_base_swa > 0 ? hp->rope_base_swa : hp->rope_base;
    if (hp->rope_base_swa <= 0 && m->arch->swa_rope_scale_one)
        base_swa = 10000.0f; /* gemma3's local layers: fixed base when the key is absent */
    m->n_groups = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        layer_weights *L = &m->layers[il];
        int64_t k, v, window;
        model_hparams_layer_kv(hp, il, &k, &v, &window);
        L->swa = window > 0;
        L->chunk = hp->chunk_layers[il] ? (int32_t)hp->n_chunk : 0;
        const int64_t nope = hp->n_nope_step ? hp->n_nope_step : m->arch->nope_every;
        L->rope = !hp->rope_off && !(nope && (il + 1) % nope == 0) &&
                  !(m->arch->rope_swa_only && !L->swa);
        L->rope_plain = L->swa && m->arch->swa_rope_plain;
        /* llama.cpp's is_swa layers (sliding or chunked) take rope.freq_base_swa */
        L->rope_base = L->swa || L->chunk ? base_swa : hp->rope_base;
        L->rope_freq_scale = L->swa && (m->arch->swa_rope_scale_one || m->arch->swa_rope_plain)
                                 ? 1.0f
                                 : hp->rope_freq_scale;
        L->rope_freqs = m->rope_freqs && !(L->swa && m->arch->gemma4);
        const model_layer_attn la = model_hparams_layer_attn(hp, il);
        L->n_head_kv = la.n_head_kv, L->dk = la.head_dim_k, L->dv = la.head_dim_v;
        L->n_rot = la.n_rot;
        const int64_t src = model_hparams_kv_source(hp, il);
        if (src != il) { /* gemma4: attends over an earlier layer's cache */
            L->kv_shared = true;
            L->kv_group = m->layers[src].kv_group;
            L->kv_slot = m->layers[src].kv_slot;
            continue;
        }
        int g = 0;
        /* one group per attention rule and KV shape: its blocks are dropped by
         * the rule (kv.h), and a pool's layers share one row layout */
        const kv_group_desc want = {
            .attn = {.window = (int32_t)window, .chunk = m->mp.chunks_keep_kv ? 0 : L->chunk},
            .n_kv_heads = (int)L->n_head_kv,
            .head_dim_k = (int)L->dk,
            .head_dim_v = hp->mla ? 0 : (int)L->dv};
        while (g < m->n_groups && (m->groups[g].attn.window != want.attn.window ||
                                   m->groups[g].attn.chunk != want.attn.chunk ||
                                   m->groups[g].n_kv_heads != want.n_kv_heads ||
                                   m->groups[g].head_dim_k != want.head_dim_k ||
                                   m->groups[g].head_dim_v != want.head_dim_v))
            g++;
        if (g == m->n_groups) m->groups[m->n_groups++] = want;
        L->kv_group = g;
        /* a stage keeps the KV of its own layers only; every stage has the
         * same groups in the same order, so block ids mean the same on all */
        if (il >= m->layer_first && il < m->layer_end) L->kv_slot = m->groups[g].n_layers++;
    }
    /* a stage without any layer of a group keeps a pool of 0-byte blocks for it
     * (the block ids still follow rank 0's) */
}

/* gemma4: tokenizer.ggml.suppress_tokens, the ids llama.cpp's gemma4 graph
 * gives a logit of -inf (Gemma 4's unified checkpoints list their image and
 * audio markers there, as transformers' generation config does). */
static bool read_suppressed(model *m, kvl_error *err) {
    const char *key = "tokenizer.ggml.suppress_tokens";
    const int64_t idx = gguf_find_key(m->gguf, key);
    gguf_vtype et;
    uint64_t n;
    if (idx < 0) return true;
    if (!gguf_kv_array(m->gguf, idx, &et, &n) || n > (uint64_t)m->hp.n_vocab)
        return kvl_fail(err, "%s: key '%s': expected an array of at most %lld token ids",
                        gguf_path(m->gguf), key, (long long)m->hp.n_vocab);
    m->suppress = kvl_calloc(n ? n : 1, sizeof *m->suppress);
    if (!m->suppress) return kvl_fail(err, "model: out of memory");
    for (uint64_t i = 0; i < n; i++) {
        int64_t id;
        if (!gguf_get_arr_i64(m->gguf, key, i, &id) || id < 0 || id >= m->hp.n_vocab)
            return kvl_fail(err, "%s: key '%s': entry %llu is not a token id below %lld",
                            gguf_path(m->gguf), key, (unsigned long long)i,
                            (long long)m->hp.n_vocab);
        m->suppress[m->n_suppress++] = (int32_t)id;
    }
    return true;
}

/* Qwen3-Reranker's classifier head, llama.cpp's cls_out (which it reads for
 * qwen3 alone): its converter copies the LM head's rows of the labels in
 * <arch>.classifier.output_labels ("yes", "no") into cls.output, and rank
 * pooling scores the last token's hidden state with them (model_classify). */
static bool bind_classifier(model *m, kvl_error *err) {
    const char *name = "cls.output.weight";
    if (strcmp(m->hp.arch, "qwen3") != 0 || !gguf_find_tensor(m->gguf, name)) return true;
    char key[128];
    snprintf(key, sizeof key, "%s.classifier.output_labels", m->hp.arch);
    int64_t n = 1; /* llama.cpp's count without labels */
    const int64_t idx = gguf_find_key(m->gguf, key);
    gguf_vtype et;
    uint64_t count;
    if (idx >= 0) {
        if (!gguf_kv_array(m->gguf, idx, &et, &count) || et != GGUF_VT_STRING || count == 0 ||
            count > 4096)
            return kvl_fail(err, "%s: key '%s': expected 1 to 4096 label strings",
                            gguf_path(m->gguf), key);
        n = (int64_t)count;
    }
    m->hp.n_cls_out = n; /* also on a pipeline's other stages: the model is a reranker */
    return !model_last_stage(m) || bind(m, &m->cls_out, name, m->hp.n_embd, n, true, err);
}

static bool bind_weights(model *m, kvl_error *err) {
    model_hparams *hp = &m->hp;
    const gguf_tensor *te = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te) return kvl_fail(err, "%s: tensor 'token_embd.weight' missing", gguf_path(m->gguf));
    hp->n_vocab = te->ne[1];
    if (!bind(m, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, true, err) ||
        !bind(m, &m->output_norm, "output_norm.weight", hp->n_embd, 0, true, err) ||
        (!m->arch->tied_always &&
         !bind(m, &m->output, "output.weight", hp->n_embd, hp->n_vocab, false, err)))
        return false;
    const int64_t np = hp->n_embd_per_layer, npl = np * hp->n_layer;
    if (np > 0 &&
        (!bind(m, &m->pl_tok_embd, "per_layer_token_embd.weight", npl, hp->n_vocab, true, err) ||
         !bind(m, &m->pl_model_proj, "per_layer_model_proj.weight", hp->n_embd, npl, true, err) ||
         !bind(m, &m->pl_proj_norm, "per_layer_proj_norm.weight", np, 0, true, err)))
        return false;
    if (m->arch->gemma4 && !read_suppressed(m, err)) return false;
    if (!bind_classifier(m, err)) return false;
    if (m->arch->altup && (!bind3(m, &m->altup_proj, "altup_proj.weight", hp->n_embd, hp->n_embd,
                                  ALTUP_N - 1, true, err) ||
                           !bind3(m, &m->altup_unembd_proj, "altup_unembd_proj.weight", hp->n_embd,
                                  hp->n_embd, ALTUP_N - 1, true, err)))
        return false;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    if (!model_last_stage(
            m)) /* binding touches no page; leaving it unbound keeps repacking off it */
        memset(&m->output, 0, sizeof m->output);
    /* Frequency factors: rope_freqs, else (phi3's LongRoPE) the long factors when a
     * sequence's context is longer than the original one, the short ones otherwise.
     * llama.cpp compares its n_ctx_seq, the context per sequence rounded up to a
     * multiple of 256; kvllm's max_ctx is the context of one sequence, so it is
     * rounded the same way (a -c 100 run with an original context of 64 takes the
     * long factors in both). */
    const char *rf_name = "rope_freqs.weight";
    const int64_t ctx_seq = (m->mp.max_ctx + 255) / 256 * 256;
    if (!gguf_find_tensor(m->gguf, rf_name) &&
        gguf_find_tensor(m->gguf, "rope_factors_long.weight"))
        rf_name = ctx_seq > hp->rope_yarn.n_ctx_orig ? "rope_factors_long.weight"
                                                     : "rope_factors_short.weight";
    const gguf_tensor *rf = gguf_find_tensor(m->gguf, rf_name);
    if (rf) {
        if (rf->dtype != GGUF_DT_F32 || rf->ne[0] != hp->n_rot / 2 || rf->ne[1] != 1 || !rf->data)
            return kvl_fail(err, "%s: tensor '%s': expected F32 [%lld]", gguf_path(m->gguf),
                            rf_name, (long long)hp->n_rot / 2);
        m->rope_freqs = rf->data; /* a missing short (or long) set: none, as in llama.cpp */
        hp->has_rope_freqs = true;
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kvl_fail(err, "model: out of memory");
    for (int il = m->layer_first; il < m->layer_end; il++)
        if (!bind_layer(m, il, err)) return false;
    assign_layer_geometry(m);
    return true;
}

static size_t max_work_bytes(const model *m, int64_t rows) {
    const model_hparams *hp = &m->hp;
    size_t best = kern_matmul_work_bytes(m->output.dtype, rows, hp->n_embd);
    if (m->pl_model_proj.data) {
        const size_t b = kern_matmul_work_bytes(m->pl_model_proj.dtype, rows, hp->n_embd);
        best = b > best ? b : best;
    }
    const size_t moe = moe_work_bytes(m, rows);
    best = moe > best ? moe : best;
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        const mtensor *ts[] = {&L->wq,     &L->wk,       &L->wv,    &L->wo,          &L->ffn_gate,
                               &L->ffn_up, &L->ffn_down, &L->wq_a,  &L->wq_b,        &L->wkv_a_mqa,
                               &L->wk_b,   &L->wv_b,     &L->wkv_b, &L->pl_inp_gate, &L->pl_proj};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            if (!ts[i]->data) continue;
            size_t b = kern_matmul_work_bytes(ts[i]->dtype, rows, ts[i]->ne0);
            if (b > best) best = b;
        }
    }
    return best;
}

/* The layer tensors that go through op_matmul (not the per-head MLA ones,
 * which op_matmul_head slices by rows); with m->output, what is repacked. */
static const size_t LAYER_MATMULS[] = {
    offsetof(layer_weights, wq),       offsetof(layer_weights, wk),
    offsetof(layer_weights, wv),       offsetof(layer_weights, wo),
    offsetof(layer_weights, ffn_gate), offsetof(layer_weights, ffn_up),
    offsetof(layer_weights, ffn_down), offsetof(layer_weights, wq_a),
    offsetof(layer_weights, wq_b),     offsetof(layer_weights, wkv_a_mqa),
    offsetof(layer_weights, wkv_b),    offsetof(layer_weights, pl_inp_gate),
    offsetof(layer_weights, pl_proj)};
#define N_LAYER_MATMULS (sizeof LAYER_MATMULS / sizeof LAYER_MATMULS[0])

/* Matmul tensor i of layer il, i < N_LAYER_MATMULS. */
static mtensor *layer_matmul(model *m, int il, size_t i) {
    return (mtensor *)((char *)&m->layers[il] + LAYER_MATMULS[i]);
}

/* Repacks the matmul weights into the kernels' compact panel layout (same
 * size, read once per token by decode and prefill alike; kernels.h). The GGUF
 * pages of a repacked tensor are then dropped from memory: the mapping is
 * read-only, so the kernel reads them again from the file (page cache) if
 * they are touched later: tied embeddings' row lookups do, a row at a time. */
void model_progress(const model *m, double done) {
    if (m->mp.progress) m->mp.progress(done < 1 ? done : 1, m->mp.progress_user);
}

/* Whether the file's pages are freed as each tensor is repacked, not only
 * unmapped: when the file and its repacked copy do not fit in memory together,
 * the page cache fills it during the load, and the copy's later pages, faulted
 * in then, fall back from 2 MiB pages to 4 KiB ones, which the hardware
 * prefetchers stop at (qwen3-30b-a3b Q4_K_M synth, 18.5 GB, on 23 GiB: 86% of
 * the copy on huge pages, 99% with them freed). Smaller models leave the file
 * cached for the next load. */
static bool drop_file_cache(const model *m) {
    const int64_t avail = kvl_mem_available();
    return avail >= 0 && (double)avail < 2.0 * (double)gguf_tensor_data_bytes(m->gguf);
}

static bool repack_weights(model *m, repack_walk *w, kvl_error *err) {
    const int64_t n = m->hp.n_layer * (int64_t)N_LAYER_MATMULS;
    /* experts hold most of a mixture-of-experts model's bytes: moe_repack reports the rest */
    const double share = m->hp.moe.n_expert ? 0.1 : 1.0;
    /* the head and every layer's dense matrices first: every token reads them */
    for (int64_t i = -2; i < n; i++) { /* -2: gemma4's per_layer_model_proj, -1: the head */
        if (!w->count_only && i % (int64_t)N_LAYER_MATMULS == 0)
            model_progress(m, share * (double)i / (double)n);
        mtensor *t =
            i == -2 ? &m->pl_model_proj
            : i < 0 ? &m->output
                    : layer_matmul(m, (int)(i / N_LAYER_MATMULS), (size_t)(i % N_LAYER_MATMULS));
        if (!t->data || t->ne2 > 1) continue;
        const size_t bytes = kern_repack_bytes(t->dtype, t->ne1, t->ne0);
        if (!bytes || !repack_walk_take(w, bytes)) continue;
        t->packed = kvl_alloc_huge(bytes);
        if (!t->packed) {
            return kvl_fail(
                err, "model: out of memory repacking weights (%zu bytes; --no-repack avoids it)",
                bytes);
        }
        kern_repack(t->data, t->dtype, t->ne1, t->ne0, t->packed);
        kvl_drop_file_pages(t->data, kern_row_bytes(t->dtype, t->ne0) * (size_t)t->ne1, w->reclaim);
    }
    /* MLA's per-head wk_b / wv_b: every head's slice repacked for decode
     * (op_matmul_heads1); the GGUF rows stay for op_matmul_head (prefill) */
    for (int il = 0; il < m->hp.n_layer; il++) {
        mtensor *hw[] = {&m->layers[il].wk_b, &m->layers[il].wv_b};
        for (int i = 0; i < 2; i++) {
            mtensor *t = hw[i];
            const size_t one = t->data ? kern_repack_bytes(t->dtype, t->ne1, t->ne0) : 0;
            if (!one) continue;
            const size_t stride = model_head_stride(t),
                         slice = kern_row_bytes(t->dtype, t->ne0) * (size_t)t->ne1;
            if (!repack_walk_take(w, stride * (size_t)t->ne2)) continue;
            t->packed = kvl_alloc_huge(stride * (size_t)t->ne2);
            if (!t->packed)
                return kvl_fail(err, "model: out of memory repacking weights (%zu bytes)",
                                stride * (size_t)t->ne2);
            for (int64_t h = 0; h < t->ne2; h++)
                kern_repack((const uint8_t *)t->data + (size_t)h * slice, t->dtype, t->ne1, t->ne0,
                            (uint8_t *)t->packed + (size_t)h * stride);
        }
    }
    return moe_repack(m, w, err); /* then the experts, a layer at a time */
}

bool repack_walk_take(repack_walk *w, size_t bytes) {
    if (!w->count_only && bytes > w->budget - w->total) {
        w->skipped += bytes;
        return false;
    }
    w->total += bytes;
    return !w->count_only;
}

/* Memory kept free beside the repacked copy for what the load and the first
 * requests still allocate (KV pool, scratch, the server's buffers). */
#define REPACK_HEADROOM_FRACTION 0.1
#define REPACK_HEADROOM_MIN      ((int64_t)256 << 20)

/* Repacks the weights as far as their copy fits in the memory this process
 * may still take (kvl_mem_available: MemAvailable or a cgroup's limit), less
 * a headroom. The copy is anonymous memory, which a container's limit cannot
 * reclaim: all of a copy that does not fit would have the process killed
 * partway through the load (a qwen3-30b-a3b Q4_K_M file, 18.5 GB, in an 8 GiB
 * cgroup: SIGKILL at 44%). What does not fit stays in the file's layout, read
 * through the page cache, which the kernel can evict and read again (as
 * llama.cpp runs a model larger than memory from its mapping): the dense
 * matrices, read by every token, are repacked first, then the experts a
 * layer at a time, so the part read through the cache is the experts', of
 * which a token reads few (the file's layout decodes at about half the
 * repacked speed: qwen3-30b-a3b 7.0 against 13.5 t/s). */
static bool repack_within_memory(model *m, kvl_error *err) {
    repack_walk count = {.count_only = true};
    if (!repack_weights(m, &count, err)) return false;
    if (count.total == 0) return true;
    const kvl_mem_status st = kvl_mem_status_at("");
    const int64_t avail = m->mp.mem_available > 0 ? m->mp.mem_available : st.available;
    int64_t headroom = (int64_t)(REPACK_HEADROOM_FRACTION * (double)avail);
    headroom = headroom > REPACK_HEADROOM_MIN ? headroom : REPACK_HEADROOM_MIN;
    repack_walk w = {.reclaim = drop_file_cache(m), .budget = SIZE_MAX};
    if (avail >= 0 && (int64_t)count.total > avail - headroom) /* unknown: all, as before */
        w.budget = avail > headroom ? (size_t)(avail - headroom) : 0;
    if (!repack_weights(m, &w, err)) return false;
    model_progress(m, 1.0);
    m->hp.repacked_bytes = (int64_t)w.total;
    if (w.total)
        kvl_log(KVL_LOG_INFO, "model: %.1f MiB of weights repacked for %s", w.total / 1048576.0,
                kern_isa_name());
    if (w.skipped) {
        const bool by_cgroup = m->mp.mem_available <= 0 && st.by_cgroup;
        char n[32], a[32], h[32], l[32], r[32];
        kvl_log(
            KVL_LOG_WARN,
            "model: the repacked copy of the weights (%s) does not fit in the %s this process "
            "may still take%s%s, less %s kept for the KV cache and buffers: %s repacked (the "
            "dense matrices first, then the experts by layer), the rest read in the file's "
            "layout through the page cache (slower decode; --no-repack leaves all of them "
            "there)",
            kvl_fmt_binary(count.total, n, sizeof n), kvl_fmt_binary((uint64_t)avail, a, sizeof a),
            by_cgroup ? " under its memory cgroup's limit of " : "",
            by_cgroup ? kvl_fmt_binary((uint64_t)st.cgroup_limit, l, sizeof l) : "",
            kvl_fmt_binary((uint64_t)headroom, h, sizeof h), kvl_fmt_binary(w.total, r, sizeof r));
    }
    return true;
}

static bool alloc_scratch(model *m, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    int64_t U = m->mp.max_ubatch, E = hp->n_embd;
    m->n_threads_max = kvl_pool_threads();
    int64_t qd = 0, kd = 0, vd = 0, od = 0; /* the widest of the full and sliding layers' */
    for (int swa = 0; swa < 2; swa++) {
        const model_layer_attn la = model_hparams_kind_attn(hp, swa);
        const int64_t h = la.n_head_kv, dk = la.head_dim_k, dv = la.head_dim_v;
        qd = hp->n_head * dk > qd ? hp->n_head * dk : qd;
        kd = h * dk > kd ? h * dk : kd;
        vd = h * dv > vd ? h * dv : vd;
        od = hp->n_head * dv > od ? hp->n_head * dv : od;
    }
    int64_t wide = E;
    if (hp->kv_lora_rank) { /* MLA: q before absorption, latent outputs, v_b outputs */
        int64_t qraw = hp->n_head * (hp->n_rot_mla_nope + hp->n_rot);
        int64_t mix[] = {qraw,
                         hp->q_lora_rank,
                         hp->n_head * hp->v_head_dim_mla,
                         kd,
                         hp->kv_lora_rank + hp->n_rot,
                         hp->n_head * (hp->n_rot_mla_nope + hp->v_head_dim_mla)};
        for (size_t i = 0; i < sizeof mix / sizeof mix[0]; i++)
            wide = mix[i] > wide ? mix[i] : wide;
        m->mla_a = kvl_calloc(U * (hp->n_rot_mla_nope + hp->kv_lora_rank + hp->v_head_dim_mla),
                              sizeof(float));
        m->mla_b = kvl_calloc(U * (hp->kv_lora_rank + hp->v_head_dim_mla), sizeof(float));
        size_t slot = 0; /* op_matmul_heads1: one row of wk_b's or wv_b's input per thread */
        for (int il = 0; il < hp->n_layer; il++) {
            const mtensor *hw[] = {&m->layers[il].wk_b, &m->layers[il].wv_b};
            for (int i = 0; i < 2; i++) {
                const size_t b =
                    hw[i]->data ? kern_matmul_work_bytes(hw[i]->dtype, 1, hw[i]->ne0) : 0;
                slot = b > slot ? b : slot;
            }
        }
        /* the repacked path (m->head_each_work): per thread, a prepared input
         * per head, at most KERN_EACH_MAX heads per call */
        size_t each = 0;
        for (int il = 0; il < hp->n_layer; il++) {
            const mtensor *hw[] = {&m->layers[il].wk_b, &m->layers[il].wv_b};
            for (int i = 0; i < 2; i++) {
                if (!hw[i]->data || !kern_repack_bytes(hw[i]->dtype, hw[i]->ne1, hw[i]->ne0))
                    continue;
                kern_repacked_one one[KERN_EACH_MAX];
                const int64_t nh = hw[i]->ne2 < KERN_EACH_MAX ? hw[i]->ne2 : KERN_EACH_MAX;
                for (int64_t h = 0; h < nh; h++)
                    one[h] =
                        (kern_repacked_one){NULL, hw[i]->dtype, hw[i]->ne1, hw[i]->ne0, NULL, NULL};
                const size_t b = kern_matmul_repacked_each_work_bytes((int)nh, one);
                each = b > each ? b : each;
            }
        }
        m->head_each_slot = (each + 63) & ~(size_t)63;
        m->head_each_work = each ? kvl_alloc(m->head_each_slot *
                                             (size_t)(m->n_threads_max > 0 ? m->n_threads_max : 1))
                                 : NULL;
        if (each && !m->head_each_work) return kvl_fail(err, "model: out of memory");
        m->head_work_slot = (slot + 63) & ~(size_t)63;
        m->head_work = slot ? kvl_alloc(m->head_work_slot *
                                        (size_t)(m->n_threads_max > 0 ? m->n_threads_max : 1))
                            : NULL;
        if (!m->mla_a || !m->mla_b || (slot && !m->head_work))
            return kvl_fail(err, "model: out of memory");
    }
    if (od > wide) wide = od;
    m->x = kvl_calloc(U * E, sizeof(float));
    m->xb = kvl_calloc(U * wide, sizeof(float));
    m->xb2 = kvl_calloc(U * wide, sizeof(float));
    m->q = kvl_calloc(U * qd, sizeof(float));
    m->k = kvl_calloc(U * kd, sizeof(float));
    m->v = kvl_calloc(U * (vd ? vd : 1), sizeof(float));
    m->att = kvl_calloc(U * od, sizeof(float));
    /* par: command-r's attention output while its FFN runs; gemma4's router input */
    if ((m->arch->parallel || (m->arch->gemma4 && hp->moe.n_expert)) &&
        !(m->par = kvl_calloc(U * E, sizeof(float))))
        return kvl_fail(err, "model: out of memory");
    m->ff_gate = kvl_calloc(U * hp->n_ff, sizeof(float));
    m->ff_up = kvl_calloc(U * hp->n_ff, sizeof(float));
    if (m->arch->altup && !(m->alt = kvl_calloc(altup_scratch_floats(m), sizeof(float))))
        return kvl_fail(err, "model: cannot allocate AltUp scratch");
    if (hp->n_embd_per_layer > 0) {
        const size_t npl = (size_t)(hp->n_embd_per_layer * hp->n_layer);
        m->pl_in = kvl_calloc((size_t)U * npl, sizeof(float));
        m->pl_row = kvl_calloc(npl, sizeof(float));
        m->pl_tmp = kvl_calloc((size_t)(U * hp->n_embd_per_layer), sizeof(float));
        if (!m->pl_in || !m->pl_row || !m->pl_tmp)
            return kvl_fail(err, "model: cannot allocate per-layer input scratch");
    }
    m->work_bytes = max_work_bytes(m, U);
    m->work = kvl_alloc(m->work_bytes);
    m->logit_rows = kvl_calloc(U * E, sizeof(float));
    m->attn_runs = kvl_calloc(2 * U, sizeof(int32_t));
    if (!m->attn_runs || !m->x || !m->xb || !m->xb2 || !m->q || !m->k || !m->v || !m->att ||
        !m->ff_gate || !m->ff_up || !m->work || !m->logit_rows)
        return kvl_fail(err, "model: cannot allocate scratch for %lld tokens", (long long)U);
    return moe_alloc_scratch(m, err);
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
    m->layer_first = mp->layer_first;
    m->layer_end = mp->layer_end;
    if (m->layer_first == 0 && m->layer_end == 0) m->layer_end = (int)m->hp.n_layer;
    if (m->layer_first < 0 || m->layer_end > m->hp.n_layer || m->layer_first >= m->layer_end) {
        kvl_fail(err, "%s: layer range %d-%d is not within the model's %lld layers", gguf_path(f),
                 m->layer_first, m->layer_end - 1, (long long)m->hp.n_layer);
        goto fail;
    }
    if (m->arch->altup && (m->layer_first != 0 || m->layer_end != m->hp.n_layer)) {
        kvl_fail(err,
                 "%s: gemma3n keeps four residual streams: its layers are not split into "
                 "pipeline stages",
                 gguf_path(f));
        goto fail;
    }
    for (int il = m->layer_first; il < m->layer_end; il++)
        if (model_hparams_kv_source(&m->hp, il) < m->layer_first) {
            kvl_fail(err, "%s: layer %d reads the KV cache of layer %lld, outside layers %d-%d",
                     gguf_path(f), il, (long long)model_hparams_kv_source(&m->hp, il),
                     m->layer_first, m->layer_end - 1);
            goto fail;
        }
    if (m->mp.max_ctx <= 0) {
        m->mp.max_ctx = m->hp.n_ctx_train;
        if (m->mp.max_ctx_cap > 0 && m->mp.max_ctx > m->mp.max_ctx_cap)
            m->mp.max_ctx = m->mp.max_ctx_cap;
    }
    if (!bind_weights(m, err) || !alloc_scratch(m, err)) goto fail;
    if (!m->mp.no_repack && !repack_within_memory(m, err)) goto fail;
    return m;
fail:
    model_destroy(m);
    return NULL;
}

void model_destroy(model *m) {
    if (!m) return;
    kvl_free(m->output.packed);
    kvl_free(m->pl_model_proj.packed);
    for (int il = 0; m->layers && il < m->hp.n_layer; il++)
        for (size_t i = 0; i < N_LAYER_MATMULS; i++) kvl_free(layer_matmul(m, il, i)->packed);
    for (int il = 0; m->layers && il < m->hp.n_layer; il++) {
        kvl_free(m->layers[il].wk_b.packed);
        kvl_free(m->layers[il].wv_b.packed);
    }
    kvl_free(m->head_each_work);
    lora_free(m);
    kvl_free(m->cvec);
    moe_free(m);
    free(m->layers);
    float *bufs[] = {m->x,          m->xb,     m->xb2,     m->q,     m->k,
                     m->v,          m->att,    m->ff_gate, m->ff_up, m->attn_scratch,
                     m->logit_rows, m->mla_a,  m->mla_b,   m->par,   m->pl_in,
                     m->pl_row,     m->pl_tmp, m->alt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvl_free(bufs[i]);
    kvl_free(m->work);
    kvl_free(m->suppress);
    kvl_free(m->head_work);
    kvl_free(m->attn_runs);
    gguf_close(m->gguf);
    free(m);
}

bool model_classify(const model *m, const float *hidden, float *out, kvl_error *err) {
    const mtensor *w = &m->cls_out;
    if (!w->data) return kvl_fail(err, "model: no classifier head (tensor 'cls.output.weight')");
    void *work = kvl_alloc(kern_matmul_work_bytes(w->dtype, 1, w->ne0) + 64);
    if (!work) return kvl_fail(err, "model: out of memory");
    kern_matmul(w->data, w->dtype, w->ne1, w->ne0, hidden, 1, out, work);
    kvl_free(work);
    /* llama.cpp's soft_max over the scores: exp in float, the sum in double,
     * then one scale by its float reciprocal */
    float mx = -INFINITY;
    for (int64_t i = 0; i < w->ne1; i++) mx = out[i] > mx ? out[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < w->ne1; i++) sum += (double)(out[i] = expf(out[i] - mx));
    const float scale = (float)(1.0 / sum);
    for (int64_t i = 0; i < w->ne1; i++) out[i] *= scale;
    return true;
}

const model_hparams *model_hp(const model *m) { return &m->hp; }
const gguf_file *model_gguf(const model *m) { return m->gguf; }
uint64_t model_moe_routed_bytes(const model *m) { return m->moe_routed_bytes; }
int model_kv_n_groups(const model *m) { return m->n_groups; }
int model_layer_first(const model *m) { return m->layer_first; }
int model_layer_end(const model *m) { return m->layer_end; }
void model_set_forward_hook(model *m, model_forward_fn fn, void *user) {
    m->forward_hook = fn;
    m->forward_hook_user = user;
}
void model_set_forward_async(model *m, model_forward_fn launch, model_wait_fn wait, void *user) {
    m->launch_hook = launch;
    m->wait_hook = wait;
    m->async_user = user;
}

void model_kv_group_shape(const model *m, int group, kv_pool_config *cfg, kv_attn *attn) {
    cfg->n_layers = m->groups[group].n_layers;
    cfg->n_kv_heads = m->groups[group].n_kv_heads;
    cfg->head_dim_k = m->groups[group].head_dim_k;
    /* MLA: V is the latent already stored at the start of each K row (0 here). */
    cfg->head_dim_v = m->groups[group].head_dim_v;
    if (attn) *attn = m->groups[group].attn;
}

void model_kv_shape(const model *m, kv_pool_config *cfg) { model_kv_group_shape(m, 0, cfg, NULL); }
