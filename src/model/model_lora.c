/* model LoRA: adapters in llama.cpp's GGUF adapter format, attached to the
 * base model's matrices and applied per token (model.h, "LoRA adapters").
 *
 * An adapter's pairs are validated as a whole before any is attached, so a
 * refused file leaves the model as it was. Each adapted mtensor points to a
 * list of links (one per adapter that adapts it, in adapter order); op_matmul
 * adds each link's product after the base one, as llama.cpp's build_lora_mm
 * adds ggml_scale(B (A x), s) to W x. The rows op_matmul sees are the
 * ubatch's tokens (or, for the head, its wanted ones), and each row carries
 * its sequence's scales, so sequences with different adapters share a batch:
 * a run of rows with the same scale is one pair of products. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include <xxhash.h>

#include "model_internal.h"

/* Rows per pair of products: as many as the ubatch has, unless B's outputs
 * would take more than LORA_OUT_FLOATS (the head's are as wide as the
 * vocabulary), but at least LORA_MIN_ROWS. The kernels give each row the
 * same bits whatever the row count, so the passes change no result; few
 * passes keep prefill's products the blocked GEMMs they are meant to be. */
#define LORA_MIN_ROWS   16
#define LORA_OUT_FLOATS ((int64_t)1 << 22)

typedef struct lora_link {
    int adapter;
    float alpha, rank; /* llama.cpp's get_scale: alpha ? scale * alpha / rank : scale */
    mtensor a, b;    /* a: [n_in -> rank] (token_embd: [rank] rows by token), b: [rank -> n_out] */
    mtensor *target; /* the adapted matrix; NULL for the token embedding */
    struct lora_link *next;
} lora_link;

typedef struct lora_adapter {
    gguf_file *f;
    float alpha, scale;
    int64_t max_rank;
    int n_pairs;
    size_t bytes;
    uint64_t fingerprint; /* of its pairs' data and alpha */
    lora_link *links;     /* [n_pairs] */
} lora_adapter;

struct lora_state {
    lora_adapter ad[MODEL_MAX_LORA];
    int n;
    float defaults[MODEL_MAX_LORA];
    const float **tok, **out; /* [max_ubatch] each token's / wanted row's scales */
    const float *const *rows; /* what op_matmul's rows are now: tok or out */
    lora_link *embd;          /* the token embedding's links */
    float *ta, *tb;           /* A's and B's outputs of one pass (pass_rows) */
    int64_t ta_len, tb_len;   /* their lengths in floats */
};

/* The layer matrices an adapter may adapt: those op_matmul runs over the
 * ubatch's rows in token order. */
static const struct {
    const char *suffix;
    size_t off;
} ADAPTABLE[] = {
    {"attn_q.weight", offsetof(layer_weights, wq)},
    {"attn_k.weight", offsetof(layer_weights, wk)},
    {"attn_v.weight", offsetof(layer_weights, wv)},
    {"attn_output.weight", offsetof(layer_weights, wo)},
    {"ffn_gate.weight", offsetof(layer_weights, ffn_gate)},
    {"ffn_up.weight", offsetof(layer_weights, ffn_up)},
    {"ffn_down.weight", offsetof(layer_weights, ffn_down)},
    {"attn_q_a.weight", offsetof(layer_weights, wq_a)},
    {"attn_q_b.weight", offsetof(layer_weights, wq_b)},
    {"attn_kv_a_mqa.weight", offsetof(layer_weights, wkv_a_mqa)},
    {"attn_kv_b.weight", offsetof(layer_weights, wkv_b)},
    {"ffn_gate_inp.weight", offsetof(layer_weights, ffn_gate_inp)},
    /* the shared expert: the fused decode of the experts leaves out a layer whose shared
     * expert is adapted (moe_ffn's general path runs it through op_matmul) */
    {"ffn_gate_shexp.weight", offsetof(layer_weights, ffn_gate_shexp)},
    {"ffn_up_shexp.weight", offsetof(layer_weights, ffn_up_shexp)},
    {"ffn_down_shexp.weight", offsetof(layer_weights, ffn_down_shexp)},
    {"ffn_gate_inp_shexp.weight", offsetof(layer_weights, ffn_gate_inp_shexp)},
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The model matrix an adapter's base tensor name stands for; NULL with a
 * reason in err otherwise. The name is the base model's tensor name. */
static mtensor *adapted_target(model *m, const char *path, const char *name, kvl_error *err) {
    const gguf_tensor *gt = gguf_find_tensor(m->gguf, name);
    if (!gt) {
        kvl_fail(err,
                 "%s: LoRA tensor '%s' does not exist in the base model %s (another base model?)",
                 path, name, gguf_path(m->gguf));
        return NULL;
    }
    mtensor *t = NULL;
    if (strcmp(name, "output.weight") == 0) t = &m->output;
    int il = -1, used = 0;
    if (!t && sscanf(name, "blk.%d.%n", &il, &used) == 1 && used > 0 && il >= 0 &&
        il < m->hp.n_layer)
        for (size_t i = 0; i < sizeof ADAPTABLE / sizeof ADAPTABLE[0]; i++)
            if (strcmp(name + used, ADAPTABLE[i].suffix) == 0)
                t = (mtensor *)((char *)&m->layers[il] + ADAPTABLE[i].off);
    /* the tensor must be the one the forward reads as it is (not split, not a stack) */
    if (!t || t->data != gt->data || t->ne2 != 1) {
        kvl_fail(err,
                 "%s: LoRA on '%s' is not supported (kvllm adapts the attention projections, "
                 "the dense FFN projections, the MoE router and shared expert, the output head "
                 "and the token embedding)",
                 path, name);
        return NULL;
    }
    return t;
}

static bool check_matrix(const char *path, const gguf_tensor *t, kvl_error *err) {
    const kern_traits *tr = kern_traits_of(t->dtype);
    if (t->ne[2] != 1 || t->ne[3] != 1)
        return kvl_fail(err, "%s: LoRA tensor '%s' has %d dimensions, expected 2", path, t->name,
                        t->n_dims);
    if (!tr || !tr->vec_dot || !tr->to_float)
        return kvl_fail(err, "%s: LoRA tensor '%s': type %s is not supported here", path, t->name,
                        gguf_dtype_name(t->dtype));
    if (!t->data) return kvl_fail(err, "%s: LoRA tensor '%s' has no data", path, t->name);
    return true;
}

static mtensor matrix_of(const gguf_tensor *t) {
    return (mtensor){
        .data = t->data, .dtype = t->dtype, .ne0 = t->ne[0], .ne1 = t->ne[1], .ne2 = 1};
}

/* Pairs up the file's NAME.lora_a / NAME.lora_b tensors into ad->links,
 * checked against the model; nothing is attached yet. */
static bool pair_tensors(model *m, lora_adapter *ad, int index, kvl_error *err) {
    const char *path = gguf_path(ad->f);
    const int64_t n = gguf_n_tensors(ad->f);
    ad->links = kvl_calloc((size_t)(n > 0 ? n : 1), sizeof *ad->links);
    if (!ad->links) return kvl_fail(err, "%s: out of memory", path);
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *a = gguf_tensor_at(ad->f, i);
        if (ends_with(a->name, "_norm.weight")) {
            /* llama.cpp loads no norm vectors from adapters either: say so */
            kvl_log(KVL_LOG_WARN, "%s: tensor '%s' left out: adapters adapt matrices only", path,
                    a->name);
            continue;
        }
        if (ends_with(a->name, ".lora_b")) continue; /* found from its lora_a */
        if (!ends_with(a->name, ".lora_a"))
            return kvl_fail(err,
                            "%s: LoRA tensor '%s' has an unexpected suffix (.lora_a or "
                            ".lora_b expected)",
                            path, a->name);
        char base[256], bname[264];
        const size_t len = strlen(a->name) - strlen(".lora_a");
        if (len >= sizeof base)
            return kvl_fail(err, "%s: LoRA tensor name '%s' is too long", path, a->name);
        memcpy(base, a->name, len);
        base[len] = '\0';
        snprintf(bname, sizeof bname, "%s.lora_b", base);
        const gguf_tensor *b = gguf_find_tensor(ad->f, bname);
        if (!b) return kvl_fail(err, "%s: LoRA pair for '%s' is missing '%s'", path, base, bname);
        if (!check_matrix(path, a, err) || !check_matrix(path, b, err)) return false;
        if (b->ne[0] < 1)
            return kvl_fail(err, "%s: LoRA tensor '%s' has rank %lld", path, b->name,
                            (long long)b->ne[0]);
        lora_link *l = &ad->links[ad->n_pairs];
        const bool embd = strcmp(base, "token_embd.weight") == 0;
        const gguf_tensor *w = gguf_find_tensor(m->gguf, base);
        if (embd) {
            if (!w)
                return kvl_fail(err, "%s: LoRA tensor '%s' does not exist in the base model %s",
                                path, base, gguf_path(m->gguf));
            if (m->pl_tok_embd.data || m->arch->altup)
                return kvl_fail(err,
                                "%s: LoRA on 'token_embd.weight' is not supported for "
                                "per-layer-input models (gemma3n, gemma4 E2B / E4B)",
                                path);
            /* llama.cpp's layout for the embedding: A's rows are looked up by token */
            if (w->ne[0] != b->ne[1] || w->ne[1] != a->ne[1] || a->ne[0] != b->ne[0])
                return kvl_fail(err,
                                "%s: LoRA pair for '%s': shapes A [%lld, %lld], B [%lld, %lld] "
                                "do not fit the base [%lld, %lld] (expected A [rank, %lld], B "
                                "[rank, %lld])",
                                path, base, (long long)a->ne[0], (long long)a->ne[1],
                                (long long)b->ne[0], (long long)b->ne[1], (long long)w->ne[0],
                                (long long)w->ne[1], (long long)w->ne[1], (long long)w->ne[0]);
            l->target = NULL;
        } else {
            l->target = adapted_target(m, path, base, err);
            if (!l->target) return false;
            if (l->target->ne0 != a->ne[0] || l->target->ne1 != b->ne[1] || a->ne[1] != b->ne[0])
                return kvl_fail(err,
                                "%s: LoRA pair for '%s': shapes A [%lld, %lld], B [%lld, %lld] "
                                "do not fit the base [%lld, %lld] (expected A [%lld, rank], B "
                                "[rank, %lld])",
                                path, base, (long long)a->ne[0], (long long)a->ne[1],
                                (long long)b->ne[0], (long long)b->ne[1], (long long)l->target->ne0,
                                (long long)l->target->ne1, (long long)l->target->ne0,
                                (long long)l->target->ne1);
        }
        l->adapter = index;
        l->alpha = ad->alpha;
        l->rank = (float)b->ne[0];
        l->a = matrix_of(a);
        l->b = matrix_of(b);
        ad->max_rank = b->ne[0] > ad->max_rank ? b->ne[0] : ad->max_rank;
        ad->bytes += a->nbytes + b->nbytes;
        ad->n_pairs++;
    }
    /* every lora_b must have been taken by its lora_a */
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(ad->f, i);
        if (!ends_with(t->name, ".lora_b")) continue;
        char aname[264];
        snprintf(aname, sizeof aname, "%.*s.lora_a", (int)(strlen(t->name) - strlen(".lora_b")),
                 t->name);
        if (!gguf_find_tensor(ad->f, aname))
            return kvl_fail(err, "%s: LoRA pair for '%s' is missing '%s'", path, t->name, aname);
    }
    if (ad->n_pairs == 0) return kvl_fail(err, "%s: the adapter holds no LoRA pair", path);
    return true;
}

static bool check_header(const model *m, gguf_file *f, float *alpha, kvl_error *err) {
    const char *path = gguf_path(f);
    char s[64];
    if (!gguf_get_str_buf(f, "general.type", s, sizeof s) || strcmp(s, "adapter") != 0)
        return kvl_fail(err, "%s: not an adapter (key 'general.type' must be \"adapter\")", path);
    if (!gguf_get_str_buf(f, "adapter.type", s, sizeof s) || strcmp(s, "lora") != 0)
        return kvl_fail(err, "%s: key 'adapter.type' must be \"lora\"", path);
    char base[64] = "";
    gguf_get_str_buf(m->gguf, "general.architecture", base, sizeof base);
    if (!gguf_get_str_buf(f, "general.architecture", s, sizeof s)) strcpy(s, "(none)");
    if (strcmp(s, base) != 0)
        return kvl_fail(err, "%s: adapter architecture '%s' differs from the model's '%s'", path, s,
                        base);
    if (gguf_find_key(f, "adapter.alora.invocation_tokens") >= 0)
        return kvl_fail(err,
                        "%s: key 'adapter.alora.invocation_tokens': activated LoRA (aLoRA) is "
                        "not supported",
                        path);
    *alpha = 0.0f;
    if (gguf_find_key(f, "adapter.lora.alpha") >= 0 &&
        !gguf_get_f32(f, "adapter.lora.alpha", alpha))
        return kvl_fail(err, "%s: key 'adapter.lora.alpha' is not a number", path);
    if (!isfinite(*alpha)) return kvl_fail(err, "%s: key 'adapter.lora.alpha' is not finite", path);
    return true;
}

/* Rows a pass of a product with out outputs a row takes (see LORA_MIN_ROWS). */
static int64_t pass_rows(const model *m, int64_t out) {
    int64_t r = LORA_OUT_FLOATS / (out > 0 ? out : 1);
    if (r > m->mp.max_ubatch) r = m->mp.max_ubatch;
    return r > LORA_MIN_ROWS ? r : LORA_MIN_ROWS;
}

/* *p holds at least need floats (a new zeroed buffer when *len is short). */
static bool grow_floats(float **p, int64_t *len, int64_t need) {
    if (need <= *len) return true;
    float *q = kvl_calloc((size_t)need, sizeof(float));
    if (!q) return false;
    kvl_free(*p);
    *p = q;
    *len = need;
    return true;
}

/* The scratch and matmul work the adapters' products need. */
static bool size_scratch(model *m, const lora_adapter *ad, kvl_error *err) {
    struct lora_state *st = m->lora;
    int64_t ta = st->ta_len, tb = st->tb_len;
    size_t work = m->work_bytes;
    for (int i = 0; i < ad->n_pairs; i++) {
        const lora_link *l = &ad->links[i];
        const int64_t rank = l->b.ne0, out = l->b.ne1, rows = pass_rows(m, out);
        ta = rows * rank > ta ? rows * rank : ta;
        tb = rows * out > tb ? rows * out : tb;
        size_t w = kern_matmul_work_bytes(l->b.dtype, rows, l->b.ne0);
        work = w > work ? w : work;
        if (l->target) {
            w = kern_matmul_work_bytes(l->a.dtype, rows, l->a.ne0);
            work = w > work ? w : work;
        }
    }
    if (!grow_floats(&st->ta, &st->ta_len, ta) || !grow_floats(&st->tb, &st->tb_len, tb))
        return kvl_fail(err, "model: out of memory for LoRA scratch");
    if (work > m->work_bytes) {
        void *p = kvl_alloc(work);
        if (!p) return kvl_fail(err, "model: out of memory for LoRA work");
        kvl_free(m->work);
        m->work = p;
        m->work_bytes = work;
    }
    return true;
}

static bool ensure_state(model *m, kvl_error *err) {
    if (m->lora) return true;
    struct lora_state *st = kvl_calloc(1, sizeof *st);
    const size_t U = (size_t)m->mp.max_ubatch;
    if (st) {
        st->tok = kvl_calloc(U, sizeof *st->tok);
        st->out = kvl_calloc(U, sizeof *st->out);
    }
    if (!st || !st->tok || !st->out) {
        if (st) {
            kvl_free(st->tok);
            kvl_free(st->out);
        }
        kvl_free(st);
        return kvl_fail(err, "model: out of memory for LoRA state");
    }
    m->lora = st;
    return true;
}

int model_lora_add(model *m, gguf_file *f, float scale, kvl_error *err) {
    if (!f) return -1;
    const char *path = gguf_path(f);
    lora_adapter ad = {.f = f, .scale = scale};
    if (!isfinite(scale)) {
        kvl_fail(err, "%s: LoRA scale %g is not finite", path, (double)scale);
        goto fail;
    }
    if (m->layer_first != 0 || m->layer_end != m->hp.n_layer) {
        kvl_fail(err, "%s: LoRA adapters are not supported on a pipeline stage", path);
        goto fail;
    }
    if (!ensure_state(m, err)) goto fail;
    if (m->lora->n >= MODEL_MAX_LORA) {
        kvl_fail(err, "%s: at most %d LoRA adapters", path, MODEL_MAX_LORA);
        goto fail;
    }
    const int index = m->lora->n;
    if (!check_header(m, f, &ad.alpha, err)) goto fail;
    if (!pair_tensors(m, &ad, index, err) || !size_scratch(m, &ad, err)) goto fail;
    ad.fingerprint = XXH3_64bits(&ad.alpha, sizeof ad.alpha);
    for (int i = 0; i < ad.n_pairs; i++) {
        const lora_link *l = &ad.links[i];
        ad.fingerprint = XXH3_64bits_withSeed(
            l->a.data, kern_row_bytes(l->a.dtype, l->a.ne0) * (size_t)l->a.ne1, ad.fingerprint);
        ad.fingerprint = XXH3_64bits_withSeed(
            l->b.data, kern_row_bytes(l->b.dtype, l->b.ne0) * (size_t)l->b.ne1, ad.fingerprint);
    }
    for (int i = 0; i < ad.n_pairs; i++) { /* attach: append, keeping adapter order */
        lora_link *l = &ad.links[i];
        struct lora_link **tail = l->target ? &l->target->lora : &m->lora->embd;
        while (*tail) tail = &(*tail)->next;
        *tail = l;
    }
    m->lora->ad[index] = ad;
    m->lora->defaults[index] = scale;
    m->lora->n++;
    kvl_log(KVL_LOG_INFO, "model: LoRA adapter %d: %s, %d matrices, rank %lld, alpha %g, %.1f MiB",
            index, path, ad.n_pairs, (long long)ad.max_rank, (double)ad.alpha,
            (double)ad.bytes / 1048576.0);
    return index;
fail:
    kvl_free(ad.links);
    gguf_close(f);
    return -1;
}

bool model_lora_remove(model *m, int i) {
    if (!m->lora || i < 0 || i >= m->lora->n || !m->lora->ad[i].f) return false;
    lora_adapter *ad = &m->lora->ad[i];
    for (int k = 0; k < ad->n_pairs; k++) { /* out of each adapted matrix's list */
        lora_link *l = &ad->links[k];
        struct lora_link **p = l->target ? &l->target->lora : &m->lora->embd;
        while (*p && *p != l) p = &(*p)->next;
        if (*p) *p = l->next;
    }
    kvl_free(ad->links);
    gguf_close(ad->f);
    *ad = (lora_adapter){0};
    m->lora->defaults[i] = 0.0f;
    kvl_log(KVL_LOG_INFO, "model: LoRA adapter %d removed", i);
    return true;
}

int model_lora_count(const model *m) { return m->lora ? m->lora->n : 0; }

bool model_lora_get(const model *m, int i, model_lora_info *out) {
    if (!m->lora || i < 0 || i >= m->lora->n || !m->lora->ad[i].f) return false;
    const lora_adapter *ad = &m->lora->ad[i];
    *out = (model_lora_info){.path = gguf_path(ad->f),
                             .alpha = ad->alpha,
                             .rank = ad->max_rank,
                             .n_pairs = ad->n_pairs,
                             .bytes = ad->bytes,
                             .fingerprint = ad->fingerprint,
                             .scale = m->lora->defaults[i]};
    return true;
}

const gguf_file *model_lora_gguf(const model *m, int i) {
    return m->lora && i >= 0 && i < m->lora->n ? m->lora->ad[i].f : NULL;
}

void model_lora_set_scale(model *m, int i, float scale) {
    if (m->lora && i >= 0 && i < m->lora->n && m->lora->ad[i].f && isfinite(scale))
        m->lora->defaults[i] = scale;
}

void lora_free(model *m) {
    struct lora_state *st = m->lora;
    if (!st) return;
    for (int i = 0; i < st->n; i++) {
        kvl_free(st->ad[i].links);
        gguf_close(st->ad[i].f);
    }
    kvl_free(st->tok);
    kvl_free(st->out);
    kvl_free(st->ta);
    kvl_free(st->tb);
    kvl_free(st);
    m->lora = NULL;
}

static const float *seq_scales(const model *m, const model_batch *b, int64_t t) {
    const float *v = b->lora ? b->lora[b->seq[t]] : NULL;
    return v ? v : m->lora->defaults;
}

void lora_rows_tokens(model *m, const model_batch *b, int64_t t0, int64_t n) {
    if (!m->lora) return;
    for (int64_t t = 0; t < n; t++) m->lora->tok[t] = seq_scales(m, b, t0 + t);
    m->lora->rows = m->lora->tok;
}

void lora_rows_head(model *m, const model_batch *b, int64_t t0, int64_t n) {
    if (!m->lora) return;
    int64_t k = 0;
    for (int64_t t = 0; t < n; t++) {
        const int64_t i = t0 + t;
        if (b->want_logits ? b->want_logits[i] != 0 : i == b->n_tokens - 1)
            m->lora->out[k++] = seq_scales(m, b, i);
    }
    m->lora->rows = m->lora->out;
}

static float link_scale(const lora_link *l, float scale) {
    return l->alpha != 0.0f ? scale * l->alpha / l->rank : scale;
}

/* y [n][out] += s * B (A x) for n rows x [n][in], pass_rows rows a pass. */
static void rows_delta(model *m, const lora_link *l, float s, const float *x, int64_t n, float *y) {
    struct lora_state *st = m->lora;
    const int64_t in = l->a.ne0, out = l->b.ne1;
    const int64_t rows = pass_rows(m, out);
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int64_t c = n - r0 < rows ? n - r0 : rows;
        kern_matmul(l->a.data, l->a.dtype, l->a.ne1, in, x + r0 * in, c, st->ta, m->work);
        kern_matmul(l->b.data, l->b.dtype, out, l->b.ne0, st->ta, c, st->tb, m->work);
        float *restrict yr = y + r0 * out;
        const float *restrict tb = st->tb;
        for (int64_t i = 0; i < c * out; i++) yr[i] += tb[i] * s;
    }
}

void lora_apply(model *m, const mtensor *w, const float *x, int64_t rows, float *y) {
    const struct lora_state *st = m->lora;
    if (!st || !st->rows) return;
    for (const lora_link *l = w->lora; l; l = l->next)
        for (int64_t r = 0; r < rows;) {
            const float us = st->rows[r][l->adapter];
            int64_t e = r + 1;
            while (e < rows && st->rows[e][l->adapter] == us) e++;
            if (us != 0.0f)
                rows_delta(m, l, link_scale(l, us), x + r * w->ne0, e - r, y + r * w->ne1);
            r = e;
        }
}

void lora_embed(model *m, const int32_t *tokens, int64_t n, float *x) {
    struct lora_state *st = m->lora;
    if (!st) return;
    const int64_t E = m->hp.n_embd;
    for (const lora_link *l = st->embd; l; l = l->next)
        for (int64_t t = 0; t < n; t++) {
            const float us = st->tok[t][l->adapter];
            if (us == 0.0f) continue;
            const float s = link_scale(l, us);
            kern_get_row(l->a.data, l->a.dtype, l->a.ne0, tokens[t], st->ta);
            kern_matmul(l->b.data, l->b.dtype, E, l->b.ne0, st->ta, 1, st->tb, m->work);
            for (int64_t i = 0; i < E; i++) x[t * E + i] += st->tb[i] * s;
        }
}
