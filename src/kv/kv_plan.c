/* kv_plan: the KV capacity planner. See kv_plan.h. */
#include "kv_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>

/* Shapes beyond these are typos, not models; they also keep every product below
 * far from 64-bit overflow before the checked arithmetic even starts. */
#define MAX_LAYERS      100000
#define MAX_HEADS       65536
#define MAX_DIM         65536
#define MAX_CONTEXT     ((int64_t)1 << 40)
#define MAX_CONCURRENCY ((int64_t)1 << 31)
#define MAX_BLOCK_SIZE  65536

/* ------------------------------------------------------------- dtypes -- */

/* The planner's enum in the pool's ids: names and sizes are the pool's. */
static const int POOL_DTYPE[KV_PLAN_DTYPE_COUNT] = {
    [KV_PLAN_F32] = GGUF_DT_F32,    [KV_PLAN_F16] = GGUF_DT_F16,      [KV_PLAN_BF16] = GGUF_DT_BF16,
    [KV_PLAN_FP8] = KV_DT_FP8_E4M3, [KV_PLAN_Q8_0] = GGUF_DT_Q8_0,    [KV_PLAN_Q5_0] = GGUF_DT_Q5_0,
    [KV_PLAN_Q4_0] = GGUF_DT_Q4_0,  [KV_PLAN_IQ4_NL] = GGUF_DT_IQ4_NL};

int kv_plan_pool_dtype(int dtype) {
    return dtype >= 0 && dtype < KV_PLAN_DTYPE_COUNT ? POOL_DTYPE[dtype] : -1;
}

bool kv_plan_dtype_parse(const char *s, int *out) {
    char low[16];
    size_t n = strlen(s);
    if (n >= sizeof low) return false;
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)s[i]);
    int pool;
    if (!kv_dtype_parse(low, &pool)) return false;
    for (int i = 0; i < KV_PLAN_DTYPE_COUNT; i++) {
        if (POOL_DTYPE[i] == pool) {
            *out = i;
            return true;
        }
    }
    return false;
}

const char *kv_plan_dtype_name(int dtype) {
    return dtype >= 0 && dtype < KV_PLAN_DTYPE_COUNT ? kv_dtype_name(POOL_DTYPE[dtype]) : "unknown";
}

uint64_t kv_plan_row_bytes(int dtype, int64_t n_values) {
    if (dtype < 0 || dtype >= KV_PLAN_DTYPE_COUNT || n_values <= 0) return 0;
    return kv_row_bytes(POOL_DTYPE[dtype], n_values);
}

/* -------------------------------------------------------------- model -- */

void kv_plan_model_init(kv_plan_model *m) {
    memset(m, 0, sizeof *m);
    m->kv_dtype = -1;
}

static bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

bool kv_plan_model_check(const kv_plan_model *m, kvl_error *err) {
    if (!in_range(m->n_layers, 1, MAX_LAYERS))
        return kvl_fail(err, "layers must be 1..%d (got %lld)", MAX_LAYERS, (long long)m->n_layers);
    if (!in_range(m->n_layers_shared_kv, 0, MAX_LAYERS))
        return kvl_fail(err, "layers reading another layer's cache must be 0..%d (got %lld)",
                        MAX_LAYERS, (long long)m->n_layers_shared_kv);
    if (!in_range(m->n_head, 0, MAX_HEADS))
        return kvl_fail(err, "query heads must be 0..%d (got %lld)", MAX_HEADS,
                        (long long)m->n_head);
    if (kv_plan_is_mla(m)) {
        if (m->kv_lora_rank > MAX_DIM || !in_range(m->rope_dim, 0, MAX_DIM))
            return kvl_fail(err, "MLA widths out of range (kv_lora_rank %lld, rope %lld)",
                            (long long)m->kv_lora_rank, (long long)m->rope_dim);
    } else {
        if (!in_range(m->n_kv_heads, 1, MAX_HEADS))
            return kvl_fail(err, "KV heads must be 1..%d (got %lld)", MAX_HEADS,
                            (long long)m->n_kv_heads);
        if (!in_range(m->head_dim_k, 1, MAX_DIM) || !in_range(m->head_dim_v, 0, MAX_DIM))
            return kvl_fail(err, "head dims must be 1..%d (got K %lld, V %lld)", MAX_DIM,
                            (long long)m->head_dim_k, (long long)m->head_dim_v);
    }
    if (m->sliding_window < 0 || !in_range(m->n_swa_layers, 0, m->n_layers))
        return kvl_fail(err, "sliding window %lld over %lld of %lld layers is not valid",
                        (long long)m->sliding_window, (long long)m->n_swa_layers,
                        (long long)m->n_layers);
    if (m->n_swa_layers > 0 && m->sliding_window == 0)
        return kvl_fail(err, "sliding layers given without a window size");
    if (m->attn_chunk < 0 || m->attn_chunk > INT32_MAX || m->sliding_window > INT32_MAX ||
        !in_range(m->n_chunk_layers, 0, m->n_layers - m->n_swa_layers))
        return kvl_fail(err,
                        "attention chunk %lld over %lld layers (and %lld sliding) of %lld is not "
                        "valid",
                        (long long)m->attn_chunk, (long long)m->n_chunk_layers,
                        (long long)m->n_swa_layers, (long long)m->n_layers);
    if (m->n_chunk_layers > 0 && m->attn_chunk == 0)
        return kvl_fail(err, "chunked layers given without a chunk size");
    if (!in_range(m->n_kv_heads_swa, 0, MAX_HEADS) || !in_range(m->head_dim_k_swa, 0, MAX_DIM) ||
        !in_range(m->head_dim_v_swa, 0, MAX_DIM))
        return kvl_fail(err, "sliding layers' KV heads / head dims out of range (%lld, %lld, %lld)",
                        (long long)m->n_kv_heads_swa, (long long)m->head_dim_k_swa,
                        (long long)m->head_dim_v_swa);
    return true;
}

static bool request_check(const kv_plan_request *r, kvl_error *err) {
    if (!in_range(r->context, 1, MAX_CONTEXT))
        return kvl_fail(err, "context must be 1..%lld tokens (got %lld)", (long long)MAX_CONTEXT,
                        (long long)r->context);
    if (!in_range(r->concurrency, 1, MAX_CONCURRENCY))
        return kvl_fail(err, "concurrency must be 1..%lld (got %lld)", (long long)MAX_CONCURRENCY,
                        (long long)r->concurrency);
    if (!in_range(r->block_size, 1, MAX_BLOCK_SIZE))
        return kvl_fail(err, "block size must be 1..%d (got %lld)", MAX_BLOCK_SIZE,
                        (long long)r->block_size);
    if (!in_range(r->dtype, 0, KV_PLAN_DTYPE_COUNT - 1) ||
        (r->split_v && !in_range(r->dtype_v, 0, KV_PLAN_DTYPE_COUNT - 1)))
        return kvl_fail(err, "unknown KV dtype (K %d, V %d)", r->dtype,
                        r->split_v ? r->dtype_v : r->dtype);
    return true;
}

/* ------------------------------------------------------------ compute -- */

/* Sticky-overflow arithmetic: one flag checked once at the end keeps the
 * formulas readable. */
static uint64_t mul(uint64_t a, uint64_t b, bool *ovf) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) *ovf = true;
    return r;
}
static uint64_t add(uint64_t a, uint64_t b, bool *ovf) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) *ovf = true;
    return r;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int v_dtype(const kv_plan_request *r) { return r->split_v ? r->dtype_v : r->dtype; }

/* Values in one token's K and V row of one layer. MLA stores the latent + RoPE
 * key as the "K" row and no V row: V (and the no-RoPE part of K) is recomputed
 * from it. */
static void layer_values(const kv_plan_model *m, bool swa, int64_t *k, int64_t *v) {
    if (kv_plan_is_mla(m)) {
        *k = m->kv_lora_rank + m->rope_dim;
        *v = 0;
        return;
    }
    int64_t h = m->n_kv_heads, dk = m->head_dim_k, dv = m->head_dim_v;
    if (swa && m->n_kv_heads_swa) h = m->n_kv_heads_swa;
    if (swa && m->head_dim_k_swa) dk = m->head_dim_k_swa;
    if (swa && m->head_dim_v_swa) dv = m->head_dim_v_swa;
    *k = h * dk;
    *v = h * dv;
}

/* Row bytes as the pool stores them (a sliding layer's when swa); false (err
 * set) for a row it refuses. */
static bool layer_rows(const kv_plan_model *m, const kv_plan_request *r, bool swa, uint64_t *k,
                       uint64_t *v, kvl_error *err) {
    int64_t kn, vn;
    layer_values(m, swa, &kn, &vn);
    *k = kv_plan_row_bytes(r->dtype, kn);
    *v = vn > 0 ? kv_plan_row_bytes(v_dtype(r), vn) : 0;
    if (*k && (vn == 0 || *v)) return true;
    bool bad_k = *k == 0;
    return kvl_fail(err,
                    "a %s row of %lld values (all KV heads of a layer) cannot be stored as %s: "
                    "its blocks need a multiple of 32 values",
                    bad_k ? "K" : "V", (long long)(bad_k ? kn : vn),
                    kv_plan_dtype_name(bad_k ? r->dtype : v_dtype(r)));
}

/* One layer's share of a block: block_size rows of K and V (no scale bytes:
 * q8_0's scales are inside its rows, fp8's scale is a static 1). */
static uint64_t layer_block_bytes(int64_t bs, uint64_t k, uint64_t v) {
    return (uint64_t)bs * (k + v);
}

/* Peak blocks of a sliding layer group: the last W positions touch at most
 * ceil((W-1)/bs) + 1 blocks when the window is not block-aligned, and never
 * more than the whole sequence. */
static int64_t swa_blocks(int64_t window, int64_t bs, int64_t full_blocks) {
    int64_t b = ceil_div(window - 1, bs) + 1;
    return b < full_blocks ? b : full_blocks;
}

/* Peak blocks of a chunked group over positions [0, tokens): the most blocks
 * the positions [k c, min((k+1) c, tokens)) of one chunk touch. A chunk's
 * count depends only on where it starts within a block, which repeats after
 * at most bs chunks: the first bs full chunks and the last one say it all. At
 * most c / bs + 1 (c / bs when c is a multiple of bs: chunks start on blocks). */
static int64_t chunk_blocks(int64_t c, int64_t bs, int64_t tokens) {
    int64_t peak = 0, n_full = tokens / c;
    for (int64_t k = 0; k <= n_full && k <= bs; k++) { /* chunk n_full: partial (or empty) */
        int64_t s = k * c, e = s + c < tokens ? s + c : tokens;
        if (e > s && (e - 1) / bs - s / bs + 1 > peak) peak = (e - 1) / bs - s / bs + 1;
    }
    int64_t s = n_full * c; /* the last, partial chunk */
    if (s < tokens && (tokens - 1) / bs - s / bs + 1 > peak) peak = (tokens - 1) / bs - s / bs + 1;
    return peak;
}

int64_t kv_plan_blocks_peak(kv_attn a, int64_t bs, int64_t tokens) {
    if (tokens <= 0 || bs <= 0) return 0;
    int64_t peak = ceil_div(tokens, bs), w, c;
    if (a.window > 0 && (w = swa_blocks(a.window, bs, peak)) < peak) peak = w;
    if (a.chunk > 0 && (c = chunk_blocks(a.chunk, bs, tokens)) < peak) peak = c;
    return peak;
}

int64_t kv_plan_blocks_held(kv_attn a, int64_t bs, int64_t tokens, int64_t last_chunk) {
    if (tokens <= 0 || bs <= 0) return 0;
    if (last_chunk < 1) last_chunk = 1;
    if (last_chunk > tokens) last_chunk = tokens;
    /* engine_sched.c reserve_chunk: kv_seq_drop_unattended(n_computed, rule),
     * n_computed being the tokens before the step; that frees blocks [0, first / bs). */
    int64_t dropped = kv_attn_first(a, tokens - last_chunk) / bs;
    return ceil_div(tokens, bs) - dropped;
}

static void plan_sequence(const kv_plan_model *m, const kv_plan_request *r, kv_plan *p, bool *ovf) {
    int64_t L = m->n_layers, S = m->n_swa_layers, C = m->n_chunk_layers, T = r->context,
            bs = r->block_size;
    uint64_t layer_tok = p->k_row_bytes + p->v_row_bytes,
             swa_tok = p->swa_k_row_bytes + p->swa_v_row_bytes;
    uint64_t lbb = layer_block_bytes(bs, p->k_row_bytes, p->v_row_bytes),
             swa_lbb = layer_block_bytes(bs, p->swa_k_row_bytes, p->swa_v_row_bytes);
    const kv_attn sw = {.window = (int32_t)m->sliding_window},
                  ch = {.chunk = (int32_t)m->attn_chunk};
    int64_t t_swa = S > 0 ? kv_attn_kept(sw, T) : T, t_chunk = C > 0 ? kv_attn_kept(ch, T) : T;

    p->bytes_per_token =
        add(mul(layer_tok, (uint64_t)(L - S), ovf), mul(swa_tok, (uint64_t)S, ovf), ovf);
    p->seq_lower_bound_bytes =
        add(add(mul(mul(layer_tok, (uint64_t)(L - S - C), ovf), (uint64_t)T, ovf),
                mul(mul(swa_tok, (uint64_t)S, ovf), (uint64_t)t_swa, ovf), ovf),
            mul(mul(layer_tok, (uint64_t)C, ovf), (uint64_t)t_chunk, ovf), ovf);
    p->block_bytes = mul(lbb, (uint64_t)(L - S - C), ovf);
    p->swa_block_bytes = mul(swa_lbb, (uint64_t)S, ovf);
    p->chunk_block_bytes = mul(lbb, (uint64_t)C, ovf);
    p->blocks_per_seq = ceil_div(T, bs);
    p->swa_blocks_per_seq = S > 0 ? kv_plan_blocks_peak(sw, bs, T) : 0;
    p->swa_blocks_held = S > 0 ? kv_plan_blocks_held(sw, bs, T, 1) : 0;
    p->chunk_blocks_per_seq = C > 0 ? kv_plan_blocks_peak(ch, bs, T) : 0;
    p->chunk_blocks_held = C > 0 ? kv_plan_blocks_held(ch, bs, T, 1) : 0;
    uint64_t full = mul(p->block_bytes, (uint64_t)p->blocks_per_seq, ovf);
    p->seq_allocated_bytes =
        add(add(full, mul(p->swa_block_bytes, (uint64_t)p->swa_blocks_per_seq, ovf), ovf),
            mul(p->chunk_block_bytes, (uint64_t)p->chunk_blocks_per_seq, ovf), ovf);
    p->seq_held_bytes =
        add(add(full, mul(p->swa_block_bytes, (uint64_t)p->swa_blocks_held, ovf), ovf),
            mul(p->chunk_block_bytes, (uint64_t)p->chunk_blocks_held, ovf), ovf);
    /* Each group's block table covers every position (a sliding or chunked
     * group's dropped blocks stay as -1 entries: positions keep their indices). */
    int64_t groups = (L - S - C > 0) + (S > 0) + (C > 0);
    p->seq_metadata_bytes =
        add(mul((uint64_t)(groups * p->blocks_per_seq), KV_PLAN_BLOCK_ENTRY_BYTES, ovf),
            KV_PLAN_SEQ_HEADER_BYTES, ovf);
}

static void plan_budget(const kv_plan_request *r, kv_plan *p) {
    if (!r->budget_bytes) return;
    p->fits = p->total_bytes <= r->budget_bytes;
    uint64_t per_seq =
        p->seq_allocated_bytes + p->seq_metadata_bytes; /* cannot overflow: x B did not */
    uint64_t room = r->budget_bytes > p->weights_bytes ? r->budget_bytes - p->weights_bytes : 0;
    uint64_t n = room / per_seq;
    p->max_concurrency = n > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)n;
}

bool kv_plan_compute(const kv_plan_model *m, const kv_plan_request *r, kv_plan *out,
                     kvl_error *err) {
    if (!kv_plan_model_check(m, err) || !request_check(r, err)) return false;
    kv_plan p;
    memset(&p, 0, sizeof p);
    bool ovf = false;
    if (!layer_rows(m, r, false, &p.k_row_bytes, &p.v_row_bytes, err) ||
        !layer_rows(m, r, true, &p.swa_k_row_bytes, &p.swa_v_row_bytes, err))
        return false;
    plan_sequence(m, r, &p, &ovf);
    uint64_t B = (uint64_t)r->concurrency;
    p.lower_bound_bytes = mul(p.seq_lower_bound_bytes, B, &ovf);
    p.allocated_bytes = mul(p.seq_allocated_bytes, B, &ovf);
    p.metadata_bytes = mul(p.seq_metadata_bytes, B, &ovf);
    p.weights_bytes = r->weights_bytes;
    p.total_bytes = add(add(p.weights_bytes, p.allocated_bytes, &ovf), p.metadata_bytes, &ovf);
    if (ovf)
        return kvl_fail(
            err, "the plan does not fit in 64-bit byte counts (context x concurrency too large)");
    plan_budget(r, &p);
    *out = p;
    return true;
}

/* ------------------------------------------------------------ savings -- */

/* Fills s from the plan of (m, r) against the plan of (base_m, base_r).
 * False when either does not compute (then the saving is not reported). */
static bool compare(const kv_plan_model *m, const kv_plan_request *r, const kv_plan_model *base_m,
                    const kv_plan_request *base_r, kv_plan_saving *s) {
    kv_plan a, b;
    if (!kv_plan_compute(m, r, &a, NULL) || !kv_plan_compute(base_m, base_r, &b, NULL))
        return false;
    s->bytes_per_token = a.bytes_per_token;
    s->base_bytes_per_token = b.bytes_per_token;
    s->lower_bound_bytes = a.lower_bound_bytes;
    s->base_lower_bound_bytes = b.lower_bound_bytes;
    s->allocated_bytes = a.allocated_bytes;
    s->base_allocated_bytes = b.allocated_bytes;
    return true;
}

static bool saving_heads(const kv_plan_model *m, const kv_plan_request *r, kv_plan_saving *s) {
    if (kv_plan_is_mla(m) || m->n_head <= m->n_kv_heads) return false;
    kv_plan_model base = *m;
    base.n_kv_heads = m->n_head;
    if (m->n_kv_heads_swa) base.n_kv_heads_swa = m->n_head;
    snprintf(s->what, sizeof s->what, "%s", m->n_kv_heads == 1 ? "MQA" : "GQA");
    snprintf(s->baseline, sizeof s->baseline, "MHA, %lld KV heads", (long long)m->n_head);
    s->in_plan = true;
    return compare(m, r, &base, r, s);
}

static bool saving_mla(const kv_plan_model *m, const kv_plan_request *r, kv_plan_saving *s) {
    if (!kv_plan_is_mla(m) || m->n_head <= 0 || m->mha_head_dim_k <= 0) return false;
    kv_plan_model base = *m;
    base.kv_lora_rank = base.rope_dim = 0;
    base.n_kv_heads = m->n_head;
    base.head_dim_k = m->mha_head_dim_k;
    base.head_dim_v = m->mha_head_dim_v;
    snprintf(s->what, sizeof s->what, "MLA");
    snprintf(s->baseline, sizeof s->baseline, "MHA, %lld heads x K %lld + V %lld",
             (long long)m->n_head, (long long)m->mha_head_dim_k, (long long)m->mha_head_dim_v);
    s->in_plan = true;
    return compare(m, r, &base, r, s);
}

/* A saving of the plan itself against the same model with every layer
 * holding its whole KV (base: m with the sliding or chunked layers off). */
static bool saving_vs_all_layers(const kv_plan_model *m, const kv_plan_request *r,
                                 const kv_plan_model *base, const char *what, const char *baseline,
                                 kv_plan_saving *s) {
    snprintf(s->what, sizeof s->what, "%s", what);
    snprintf(s->baseline, sizeof s->baseline, "%s in all %lld layers", baseline,
             (long long)m->n_layers);
    s->in_plan = true;
    return compare(m, r, base, r, s);
}

static bool saving_chunk(const kv_plan_model *m, const kv_plan_request *r, kv_plan_saving *s) {
    if (m->n_chunk_layers <= 0) return false;
    kv_plan_model base = *m;
    base.n_chunk_layers = 0;
    return saving_vs_all_layers(m, r, &base, "chunked", "whole KV", s);
}

static bool saving_swa(const kv_plan_model *m, const kv_plan_request *r, kv_plan_saving *s) {
    if (m->n_swa_layers <= 0) return false;
    kv_plan_model base = *m;
    if (kv_plan_swa_own_shape(m))
        base.sliding_window = INT32_MAX; /* each sliding layer keeps its own shape, all of T */
    else base.n_swa_layers = 0;
    return saving_vs_all_layers(m, r, &base, "SWA", "full attention", s);
}

/* KV quantization against f16, with everything else as planned. */
static bool saving_quant(const kv_plan_model *m, const kv_plan_request *r, int dtype,
                         kv_plan_saving *s) {
    kv_plan_request q = *r, base = *r;
    q.dtype = dtype;
    base.dtype = KV_PLAN_F16;
    q.split_v = base.split_v = false;
    snprintf(s->what, sizeof s->what, "%s", kv_plan_dtype_name(dtype));
    snprintf(s->baseline, sizeof s->baseline, "f16");
    s->in_plan = r->dtype == dtype && v_dtype(r) == dtype;
    return compare(m, &q, m, &base, s);
}

int kv_plan_savings(const kv_plan_model *m, const kv_plan_request *r, kv_plan_saving *out,
                    int cap) {
    kv_plan_saving s[KV_PLAN_MAX_SAVINGS];
    memset(s, 0, sizeof s);
    int n = 0;
    if (saving_heads(m, r, &s[n])) n++;
    if (saving_mla(m, r, &s[n])) n++;
    if (saving_swa(m, r, &s[n])) n++;
    if (saving_chunk(m, r, &s[n])) n++;
    if (saving_quant(m, r, KV_PLAN_FP8, &s[n])) n++;
    if (saving_quant(m, r, KV_PLAN_Q8_0, &s[n])) n++;
    /* llama.cpp's 5- and 4-bit caches (iq4_nl takes q4_0's bytes) */
    if (saving_quant(m, r, KV_PLAN_Q5_0, &s[n])) n++;
    if (saving_quant(m, r, KV_PLAN_Q4_0, &s[n])) n++;
    if (n > cap) n = cap;
    memcpy(out, s, (size_t)n * sizeof *s);
    return n;
}

/* ------------------------------------------------------ engine's pool -- */

int kv_plan_pool_groups(const kv_plan_model *m, const kv_plan_request *r, kv_plan_group *out,
                        kvl_error *err) {
    uint64_t k, v;
    if (!kv_plan_model_check(m, err) || !request_check(r, err) ||
        !layer_rows(m, r, false, &k, &v, err) || !layer_rows(m, r, true, &k, &v, err))
        return 0;
    kv_pool_config c;
    memset(&c, 0, sizeof c);
    c.n_kv_heads = kv_plan_is_mla(m) ? 1 : (int)m->n_kv_heads;
    c.head_dim_k = (int)(kv_plan_is_mla(m) ? m->kv_lora_rank + m->rope_dim : m->head_dim_k);
    c.head_dim_v = kv_plan_is_mla(m) ? 0 : (int)m->head_dim_v;
    c.block_size = (int)r->block_size;
    c.dtype = kv_plan_pool_dtype(r->dtype);
    c.split_v = r->split_v;
    c.dtype_v = r->split_v ? kv_plan_pool_dtype(r->dtype_v) : 0;
    int n = 0;
    int64_t full = m->n_layers - m->n_swa_layers - m->n_chunk_layers;
    if (full > 0) {
        out[n].cfg = c;
        out[n].cfg.n_layers = (int)full;
        out[n].chunk = 0;
        out[n++].window = 0;
    }
    if (m->n_swa_layers > 0) {
        out[n].cfg = c;
        if (!kv_plan_is_mla(m) && m->n_kv_heads_swa) out[n].cfg.n_kv_heads = (int)m->n_kv_heads_swa;
        if (!kv_plan_is_mla(m) && m->head_dim_k_swa) out[n].cfg.head_dim_k = (int)m->head_dim_k_swa;
        if (!kv_plan_is_mla(m) && m->head_dim_v_swa) out[n].cfg.head_dim_v = (int)m->head_dim_v_swa;
        out[n].cfg.n_layers = (int)m->n_swa_layers;
        out[n].chunk = 0;
        out[n++].window = m->sliding_window;
    }
    if (m->n_chunk_layers > 0) {
        out[n].cfg = c;
        out[n].cfg.n_layers = (int)m->n_chunk_layers;
        out[n].window = 0;
        out[n++].chunk = m->attn_chunk;
    }
    return n;
}

/* The pool bytes of one block of this layout, computed as kv_pool_create does
 * (0 when it will refuse the rows: it then says why). */
static uint64_t layout_block_bytes(const kv_pool_config *c) {
    int dt_v = c->split_v ? c->dtype_v : c->dtype;
    int64_t kn = (int64_t)c->n_kv_heads * c->head_dim_k,
            vn = (int64_t)c->n_kv_heads * c->head_dim_v;
    uint64_t k = kv_row_bytes(c->dtype, kn), v = vn > 0 ? kv_row_bytes(dt_v, vn) : 0;
    if (!k || (vn > 0 && !v) || c->n_layers <= 0 || c->block_size <= 0) return 0;
    return (uint64_t)c->n_layers * (uint64_t)c->block_size * (k + v);
}

static kv_attn group_attn(const kv_plan_group *g) {
    return (kv_attn){.window = (int32_t)g->window, .chunk = (int32_t)g->chunk};
}

/* The next decode step after p at which a group's table can change: a new block
 * is needed (q % bs == 0), a block leaves the window (the engine drops
 * before kv_window_first(q, W), which frees a new block when that is a
 * positive multiple of bs) or a new chunk begins (q a multiple of c: the
 * previous chunk's blocks go); at the latest the last step, T - 1. With both
 * a window and chunks the drop point is the later of theirs, so it moves only
 * at one of these steps. */
static int64_t next_event(const kv_plan_group *groups, int n_groups, int64_t p, int64_t T) {
    int64_t q = T - 1;
    for (int g = 0; g < n_groups; g++) {
        int64_t bs = groups[g].cfg.block_size, W = groups[g].window, c = groups[g].chunk;
        int64_t r = (p / bs + 1) * bs;
        if (r < q) q = r;
        if (W > 0) {
            /* the first step whose window starts in the next block, k */
            int64_t k = kv_window_first(p, W) / bs + 1, d = k * bs + W - 1;
            if (d < q) q = d;
        }
        if (c > 0 && (p / c + 1) * c < q) q = (p / c + 1) * c;
    }
    return q;
}

typedef struct measure_run {
    const kv_plan_group *groups;
    int n_groups;
    int64_t T, B;
    kv_pool *pool[KV_PLAN_MAX_GROUPS];
    kv_seq *seqs; /* [g * B + i] */
} measure_run;

/* One decode step at position p for every sequence, as engine.c's
 * reserve_chunk does it; then the groups' peaks. */
static bool measure_step(measure_run *mr, int64_t p, kv_plan_measured *out, kvl_error *err) {
    for (int64_t i = 0; i < mr->B; i++) {
        for (int g = 0; g < mr->n_groups; g++) {
            kv_seq *s = &mr->seqs[g * mr->B + i];
            const kv_attn a = group_attn(&mr->groups[g]);
            kv_seq_drop_unattended(mr->pool[g], s, p, a);
            if (!kv_seq_reserve(mr->pool[g], s, p + 1))
                return kvl_fail(err,
                                "kv-plan: the engine's pool (group %d, window %d, chunk %d, %lld "
                                "blocks) ran out at token %lld of sequence %lld",
                                g, a.window, a.chunk, (long long)kv_pool_cfg(mr->pool[g])->n_blocks,
                                (long long)p + 1, (long long)i);
        }
    }
    for (int g = 0; g < mr->n_groups; g++) {
        int64_t held = 0;
        for (int64_t i = 0; i < mr->B; i++) held += kv_seq_n_held(&mr->seqs[g * mr->B + i]);
        if (held > out->group[g].peak_blocks) out->group[g].peak_blocks = held;
    }
    return true;
}

/* After the T-th token: kv_seq_usage per sequence, with the engine's token
 * count for a sliding or chunked group (its lower bound keeps only what the
 * last token attends to). */
static void measure_end(measure_run *mr, kv_plan_measured *out) {
    for (int g = 0; g < mr->n_groups; g++) {
        kv_plan_measured_group *mg = &out->group[g];
        int64_t t = kv_attn_kept(group_attn(&mr->groups[g]), mr->T);
        mg->window = mr->groups[g].window;
        mg->chunk = mr->groups[g].chunk;
        mg->n_layers = mr->groups[g].cfg.n_layers;
        mg->block_bytes = kv_pool_geometry(mr->pool[g])->block_bytes;
        mg->peak_allocated_bytes = (uint64_t)mg->peak_blocks * mg->block_bytes;
        for (int64_t i = 0; i < mr->B; i++) {
            const kv_seq *s = &mr->seqs[g * mr->B + i];
            kv_usage u = kv_seq_usage(mr->pool[g], s, t);
            mg->blocks += u.blocks;
            mg->allocated_bytes += u.allocated_bytes;
            mg->lower_bound_bytes += u.lower_bound_bytes;
            out->table_bytes += (uint64_t)s->cap * sizeof *s->blocks;
        }
        out->peak_blocks += mg->peak_blocks;
        out->blocks += mg->blocks;
        out->peak_allocated_bytes += mg->peak_allocated_bytes;
        out->allocated_bytes += mg->allocated_bytes;
        out->lower_bound_bytes += mg->lower_bound_bytes;
    }
    out->n_groups = mr->n_groups;
}

/* Pool sizes (blocks) and the limits: pool bytes, block-table entries, and the
 * work of kv_seq_drop_before (it scans the table from the start). */
static bool measure_sizes(const kv_plan_group *groups, int n_groups, int64_t T, int64_t B,
                          uint64_t max_pool_bytes, int64_t *n_blocks, kvl_error *err) {
    bool ovf = false;
    uint64_t pool_bytes = 0, entries = 0, work = 0;
    for (int g = 0; g < n_groups; g++) {
        int64_t bs = groups[g].cfg.block_size, W = groups[g].window, c = groups[g].chunk;
        if (bs < 1) return kvl_fail(err, "kv-plan: measure needs a positive block size");
        int64_t per_seq = ceil_div(T, bs);
        entries = add(entries, mul((uint64_t)per_seq, (uint64_t)B, &ovf), &ovf);
        if (W > 0 || c > 0) {
            int64_t cap = ceil_div(W > 0 && (c <= 0 || W < c) ? W : c, bs) + 1;
            if (cap < per_seq) {
                work = add(work,
                           mul(mul((uint64_t)per_seq, (uint64_t)per_seq, &ovf), (uint64_t)B, &ovf),
                           &ovf);
                per_seq = cap;
            }
        }
        uint64_t nb = mul((uint64_t)per_seq, (uint64_t)B, &ovf);
        n_blocks[g] = nb > INT32_MAX ? INT32_MAX : (int64_t)nb;
        if (nb > INT32_MAX) ovf = true;
        pool_bytes = add(pool_bytes, mul(layout_block_bytes(&groups[g].cfg), nb, &ovf), &ovf);
    }
    if (ovf || pool_bytes > max_pool_bytes)
        return kvl_fail(err,
                        "kv-plan: --verify would need pools of %llu bytes (limit %llu); "
                        "use a smaller context or concurrency",
                        ovf ? (unsigned long long)UINT64_MAX : (unsigned long long)pool_bytes,
                        (unsigned long long)max_pool_bytes);
    if (entries > ((uint64_t)1 << 26) || work > ((uint64_t)1 << 31))
        return kvl_fail(err,
                        "kv-plan: --verify would replay %llu block-table entries; "
                        "use a smaller context or concurrency",
                        (unsigned long long)entries);
    return true;
}

bool kv_plan_measure(const kv_plan_group *groups, int n_groups, int64_t context,
                     int64_t concurrency, uint64_t max_pool_bytes, kv_plan_measured *out,
                     kvl_error *err) {
    memset(out, 0, sizeof *out);
    if (context < 1 || concurrency < 1 || n_groups < 1 || n_groups > KV_PLAN_MAX_GROUPS)
        return kvl_fail(err,
                        "kv-plan: measure needs positive context and concurrency, 1..%d groups",
                        KV_PLAN_MAX_GROUPS);
    int64_t n_blocks[KV_PLAN_MAX_GROUPS];
    if (!measure_sizes(groups, n_groups, context, concurrency, max_pool_bytes, n_blocks, err))
        return false;
    measure_run mr = {.groups = groups, .n_groups = n_groups, .T = context, .B = concurrency};
    bool ok = true;
    for (int g = 0; ok && g < n_groups; g++) {
        kv_pool_config c = groups[g].cfg;
        c.n_blocks = n_blocks[g];
        mr.pool[g] = kv_pool_create(&c, err);
        ok = mr.pool[g] != NULL;
    }
    if (ok) {
        mr.seqs = calloc((size_t)(n_groups * concurrency), sizeof *mr.seqs);
        if (!mr.seqs) ok = kvl_fail(err, "kv-plan: out of memory");
    }
    for (int64_t p = 0; ok; p = next_event(groups, n_groups, p, context)) {
        ok = measure_step(&mr, p, out, err);
        if (p == context - 1) break;
    }
    if (ok) measure_end(&mr, out);
    for (int g = 0; g < n_groups; g++) {
        for (int64_t i = 0; mr.seqs && i < concurrency; i++)
            kv_seq_free(mr.pool[g], &mr.seqs[g * concurrency + i]);
        kv_pool_destroy(mr.pool[g]);
    }
    free(mr.seqs);
    return ok;
}
