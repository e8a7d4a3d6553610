/* model forward: one ragged batch through the network.
 *
 * Per ubatch (a slice of the batch that fits the scratch): embed -> for each
 * layer: RMSNorm, attention (standard or MLA) whose K/V go into the layer's
 * KV group's blocks, residual, RMSNorm, gated FFN, residual -> final RMSNorm and
 * LM head for the tokens whose logits are wanted. Every op treats tokens
 * independently except attention, which reads only the token's own sequence, so
 * a token's result does not depend on its batch mates. */
#include <math.h>
#include <string.h>

#include "kvl_pool.h"
#include "model_internal.h"
#include "model_phases.h"

typedef struct fwd_ctx {
    model *m;
    kv_pool *const *pools;
    const model_batch *b;
    int64_t t0, n; /* the ubatch: batch tokens [t0, t0+n) */
} fwd_ctx;

static const kv_seq *seq_table(const fwd_ctx *c, int64_t t, int group) {
    return c->b->seqs[(size_t)c->b->seq[c->t0 + t] * c->m->n_groups + group];
}

static bool check_batch(const model *m, kv_pool *const *pools, const model_batch *b,
                        kvl_error *err) {
    for (int g = 0; g < m->n_groups; g++) {
        kv_pool_config want;
        model_kv_group_shape(m, g, &want, NULL);
        const kv_pool_config *c = kv_pool_cfg(pools[g]);
        if (c->n_layers != want.n_layers || c->n_kv_heads != want.n_kv_heads ||
            c->head_dim_k != want.head_dim_k || c->head_dim_v != want.head_dim_v)
            return kvl_fail(err, "model: KV pool %d shape does not match the model", g);
    }
    for (int64_t i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab)
            return kvl_fail(err, "batch token %lld: id %d out of range [0, %lld)", (long long)i,
                            b->tokens[i], (long long)m->hp.n_vocab);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return kvl_fail(err, "batch token %lld: sequence %d out of range", (long long)i,
                            b->seq[i]);
        int32_t p = b->pos[i];
        if (p < 0 || p >= m->mp.max_ctx)
            return kvl_fail(err, "batch token %lld: position %d outside the context of %lld",
                            (long long)i, p, (long long)m->mp.max_ctx);
        /* Every block the attention will read for this token (kv.h's rule,
         * the one the attention follows) must be in the table. */
        for (int g = 0; g < m->n_groups; g++) {
            const kv_seq *s = b->seqs[(size_t)b->seq[i] * m->n_groups + g];
            const kv_attn a = m->groups[g].attn;
            int64_t miss = kv_seq_attn_missing(pools[g], s, p, a);
            if (miss >= 0)
                return kvl_fail(err,
                                "batch token %lld: position %d attends to positions %lld..%d (KV "
                                "group %d, window %d, chunk %d), but the block of position %lld "
                                "is not in its block table",
                                (long long)i, p, (long long)kv_attn_first(a, p), p, g, a.window,
                                a.chunk, (long long)miss);
        }
    }
    return true;
}

/* Writes one token's K (and V, unless the pool keeps none) into its block. */
static void kv_store(kv_pool *kv, const kv_seq *s, int slot, int32_t pos, const float *k,
                     const float *v) {
    const int bs = kv_pool_cfg(kv)->block_size;
    kv_store_token(kv, s->blocks[pos / bs], slot, pos % bs, k, v);
}

/* Grows the per-thread attention scratch to what the pools need; this happens
 * on the first forward with a given pool layout, not per token. */
static bool ensure_attn_scratch(model *m, kv_pool *const *pools, kvl_error *err) {
    const model_hparams *hp = &m->hp;
    size_t need = 0;
    for (int g = 0; g < m->n_groups; g++) {
        const kv_pool_config *pc = kv_pool_cfg(pools[g]);
        /* MLA's pool keeps no V: its attention's V is the K row's latent */
        size_t n = op_attend_scratch_floats(pc, (int)(hp->n_head / pc->n_kv_heads), pc->head_dim_k,
                                            pc->head_dim_v ? pc->head_dim_v : hp->head_dim_v,
                                            m->mp.max_ctx);
        need = n > need ? n : need;
    }
    /* The pool may have been resized (-t) since the model was loaded. */
    int nt = kvl_pool_threads();
    if (need <= m->attn_scratch_len && nt <= m->n_threads_max) return true;
    if (nt > m->n_threads_max) m->n_threads_max = nt;
    if (need < m->attn_scratch_len) need = m->attn_scratch_len;
    kvl_free(m->attn_scratch);
    m->attn_scratch = kvl_calloc((size_t)m->n_threads_max * need, sizeof(float));
    m->attn_scratch_len = m->attn_scratch ? need : 0;
    return m->attn_scratch ? true : kvl_fail(err, "model: out of memory for attention scratch");
}

/* Where attention reads the ubatch's queries and writes its outputs: token t's
 * q rows start at q + t * q_stride (heads a->dk apart), its outputs at
 * out + t * out_stride (heads a->dv apart). */
typedef struct attn_io {
    const float *q;
    int64_t q_stride;
    float *out;
    int64_t out_stride;
} attn_io;

/* A pool thread's share of the attention scratch. */
static float *thread_scratch(const model *m, int thread) {
    return m->attn_scratch + (size_t)thread * m->attn_scratch_len;
}

/* Attention of (token, KV head) pair w of the ubatch (token w / n_kv, KV head
 * w % n_kv), its chunks spread over up to max_threads threads. */
static void attend_pair(const fwd_ctx *c, const layer_weights *L, const attn_args *a,
                        const attn_io *io, int64_t w, float *scratch, int max_threads) {
    const int64_t G = c->m->hp.n_head / L->n_head_kv, n_kv = L->n_head_kv, t = w / n_kv,
                  g = w % n_kv;
    op_attend_group(a, seq_table(c, t, L->kv_group), c->b->pos[c->t0 + t], (int)g, (int)G,
                    io->q + t * io->q_stride + g * G * a->dk, a->dk,
                    io->out + t * io->out_stride + g * G * a->dv, a->dv, scratch, max_threads);
}

/* Runs of tokens of one sequence at consecutive positions within one attention chunk. */
typedef struct attn_runs {
    const int32_t *runs; /* [n][2]: first token, count */
    int64_t n, longest;
} attn_runs;

static attn_runs find_runs(const fwd_ctx *c, int max_tokens) {
    const int32_t *pos = c->b->pos + c->t0, *seq = c->b->seq + c->t0;
    int32_t *runs = c->m->attn_runs;
    attn_runs r = {.runs = runs};
    for (int64_t t = 0; t < c->n;) {
        int64_t e = t + 1;
        while (e < c->n && e - t < max_tokens && seq[e] == seq[t] && pos[e] == pos[e - 1] + 1 &&
               pos[e] / OP_ATTN_CHUNK == pos[t] / OP_ATTN_CHUNK)
            e++;
        runs[2 * r.n] = (int32_t)t;
        runs[2 * r.n + 1] = (int32_t)(e - t);
        r.longest = e - t > r.longest ? e - t : r.longest;
        r.n++;
        t = e;
    }
    return r;
}

/* Attention of (run, KV head) item w: run w / n_kv, KV head w % n_kv. */
static void attend_run_item(const fwd_ctx *c, const layer_weights *L, const attn_args *a,
                            const attn_io *io, const attn_runs *r, int64_t w, float *scratch) {
    const int64_t G = c->m->hp.n_head / L->n_head_kv, n_kv = L->n_head_kv;
    const int64_t ri = w / n_kv, g = w % n_kv, t = r->runs[2 * ri];
    op_attend_run(a, seq_table(c, t, L->kv_group), c->b->pos[c->t0 + t], r->runs[2 * ri + 1],
                  (int)g, (int)G, io->q + t * io->q_stride + g * G * a->dk, io->q_stride,
                  io->out + t * io->out_stride + g * G * a->dv, io->out_stride, scratch);
}

/* Attention for the pool's tasks: (run, KV head) items, or (token, KV head) pairs. */
typedef struct {
    const fwd_ctx *c;
    const layer_weights *L;
    const attn_args *a;
    const attn_io *io;
    const attn_runs *r;
} attn_job;

static void attend_run_task(void *ctx, int64_t w, int thread) {
    const attn_job *j = ctx;
    attend_run_item(j->c, j->L, j->a, j->io, j->r, w, thread_scratch(j->c->m, thread));
}

static void attend_pair_task(void *ctx, int64_t w, int thread) {
    const attn_job *j = ctx;
    attend_pair(j->c, j->L, j->a, j->io, w, thread_scratch(j->c->m, thread), 1);
}

/* Strategy for prefill: the ubatch's tokens in runs of consecutive positions
 * of one sequence within one attention chunk (op_attend_run), so that the
 * block table is walked and each K and V row read once per run and KV head
 * rather than once per token (the walk alone, load_run, was 7.5% of a
 * 4096-token prefill of a 1B model). The results are the same bits. Declines
 * (false) when no run has two tokens, or when there are too few runs to share
 * among the threads. */
static bool attention_runs(const fwd_ctx *c, const layer_weights *L, const attn_args *a,
                           const attn_io *io, bool par) {
    model *m = c->m;
    const int64_t G = m->hp.n_head / L->n_head_kv, n_kv = L->n_head_kv;
    const attn_runs r = find_runs(c, op_attend_run_max_tokens((int)G, a->dv, m->mp.max_ctx));
    const int64_t total = r.n * n_kv;
    if (r.longest < 2 || (par && total < kvl_pool_threads())) return false;
    if (!par) { /* on this thread: waking the pool would cost more */
        for (int64_t w = 0; w < total; w++) attend_run_item(c, L, a, io, &r, w, m->attn_scratch);
        return true;
    }
    attn_job j = {c, L, a, io, &r};
    kvl_pool_run(attend_run_task, &j, total);
    return true;
}

/* Strategy for fewer pairs than threads (decode of one sequence with few KV
 * heads): the pairs one after the other, each spreading its fixed chunks of
 * positions over the threads. */
static void attention_split_pairs(const fwd_ctx *c, const layer_weights *L, const attn_args *a,
                                  const attn_io *io, int64_t total) {
    for (int64_t w = 0; w < total; w++)
        attend_pair(c, L, a, io, w, c->m->attn_scratch, kvl_pool_threads());
}

/* Strategy for little work: every pair on this thread, without waking the pool. */
static void attention_serial(const fwd_ctx *c, const layer_weights *L, const attn_args *a,
                             const attn_io *io, int64_t total) {
    for (int64_t w = 0; w < total; w++) attend_pair(c, L, a, io, w, c->m->attn_scratch, 1);
}

/* Strategy for many pairs: the pairs in parallel, each on one thread. */
static void attention_parallel_pairs(const fwd_ctx *c, const layer_weights *L, const attn_args *a,
                                     const attn_io *io, int64_t total) {
    attn_job j = {c, L, a, io, NULL};
    kvl_pool_run(attend_pair_task, &j, total);
}

/* Attention for every (token, KV head) pair of the ubatch, by the strategy that
 * suits the work; each computes every pair with the same arithmetic
 * (op_attend_group's fixed chunks, or op_attend_run's bit-identical runs), so
 * the choice changes no result. */
static void attention(const fwd_ctx *c, const layer_weights *L, const attn_args *a, const float *q,
                      int64_t q_stride, float *out, int64_t out_stride) {
    const model *m = c->m;
    const attn_io io = {.q = q, .q_stride = q_stride, .out = out, .out_stride = out_stride};
    const int64_t total = c->n * L->n_head_kv;
    /* Waking the pool costs microseconds: only worth it for real work. */
    double macs = 0;
    for (int64_t t = 0; t < c->n; t++) macs += (double)(c->b->pos[c->t0 + t] + 1);
    macs *= (double)m->hp.n_head * (double)(a->dk + a->dv);
    const bool par = macs >= 65536.0;
    /* runs share one start: full causal, or chunks aligned to the runs' */
    if (a->window == 0 && a->chunk % OP_ATTN_CHUNK == 0 && attention_runs(c, L, a, &io, par))
        return;
    if (par && total < kvl_pool_threads()) attention_split_pairs(c, L, a, &io, total);
    else if (!par || total <= 1) attention_serial(c, L, a, &io, total);
    else attention_parallel_pairs(c, L, a, &io, total);
}

static float attn_scale(const model *m, const layer_weights *L) {
    const model_hparams *hp = &m->hp;
    if (m->arch->granite_scales && hp->attn_scale != 0.0f) return hp->attn_scale;
    if (m->arch->gemma4) return 1.0f; /* its q and k are RMS-normed instead */
    if (m->arch->n_layer_27b && hp->n_layer == m->arch->n_layer_27b)
        return 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    return 1.0f / sqrtf((float)L->dk);
}

/* The Walsh-Hadamard rotation llama.cpp applies to q and K (and V, and back on
 * the attention output) when the cache of that type is quantized and a head
 * is a multiple of 64 values: the size of each rotated run (K: the largest
 * power of two from 64 dividing the head, V: 64), or 0 for none. Rotated
 * values quantize with less error; q.k and p.V are unchanged in exact math.
 * Every ggml block type rotates (fp8 is kvllm's own: not rotated). */
static int64_t kv_rotation(int dtype, int64_t head, bool k) {
    if (!kv_dtype_blocked(dtype) || head % 64 != 0) return 0;
    int64_t n = 64;
    while (k && head % (2 * n) == 0) n *= 2;
    return n;
}

#ifdef KVLLM_PHASE_TIMERS
/* The K and V bytes one token at pos reads from the cache (the phase timers). */
static double attn_read_bytes(const kv_pool *kv, const attn_args *a, int32_t pos) {
    const kv_pool_config *cf = kv_pool_cfg(kv);
    const kv_attn rule = {.window = a->window, .chunk = a->chunk};
    const double n = (double)(pos + 1 - kv_attn_first(rule, pos));
    const double v =
        a->v_in_k ? 0.0 : (double)kv_row_bytes(kv_pool_dtype_v(kv), cf->n_kv_heads * a->dv);
    return n * ((double)kv_row_bytes(cf->dtype, cf->n_kv_heads * a->dk) + v);
}
#endif

/* Standard attention (MHA/GQA/MQA): result in m->xb [n][E], before the residual. */
static void attn_mha(fwd_ctx *c, int il) {
    model *m = c->m;
    const model_hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    const int64_t n = c->n, dk = L->dk, dv = L->dv, n_kv = L->n_head_kv;
    const int64_t qd = hp->n_head * dk, kd = n_kv * dk, vd = n_kv * dv;
    /* q, k, v as the layer has them: no k or v for a layer reading another's
     * cache, K itself as V where attn_v is absent (gemma4) */
    const mtensor *qkv[] = {&L->wq, &L->wk, &L->wv};
    float *const qkv_out[] = {m->q, m->k, m->v};
    const int n_proj = L->kv_shared ? 1 : L->wv.data ? 3 : 2;
    PHASE_BEGIN(t_qkv);
    op_matmul_many(m, n_proj, qkv, m->xb, n, qkv_out);
    PHASE_END(t_qkv, PHASE_QKV,
              mtensor_slice_bytes(&L->wq) + mtensor_slice_bytes(&L->wk) +
                  mtensor_slice_bytes(&L->wv));
    if (n_proj == 2) memcpy(m->v, m->k, (size_t)(n * kd) * sizeof(float));
    op_add_bias(m->q, &L->bq, n, qd);
    op_add_bias(m->k, &L->bk, n, kd);
    op_add_bias(m->v, &L->bv, n, vd);
    if (L->q_norm.data &&
        m->arch->norm == ARCH_NORM_LAYER) { /* Command R+: per head, per-head weights */
        for (int64_t r = 0; r < n * hp->n_head; r++)
            op_layer_norm(m->q + r * dk, m->q + r * dk,
                          (const float *)L->q_norm.data + (r % hp->n_head) * dk, 1, dk,
                          hp->norm_eps);
        for (int64_t r = 0; r < n * n_kv; r++)
            op_layer_norm(m->k + r * dk, m->k + r * dk,
                          (const float *)L->k_norm.data + (r % n_kv) * dk, 1, dk, hp->norm_eps);
    } else if (L->q_norm.data && m->arch->qk_norm_full) { /* olmo2: over all heads at once */
        op_rms_norm(m->q, m->q, L->q_norm.data, n, qd, hp->rms_eps);
        op_rms_norm(m->k, m->k, L->k_norm.data, n, kd, hp->rms_eps);
    } else if (L->q_norm.data) {
        op_rms_norm(m->q, m->q, L->q_norm.data, n * hp->n_head, dk, hp->rms_eps);
        if (!L->kv_shared) op_rms_norm(m->k, m->k, L->k_norm.data, n * n_kv, dk, hp->rms_eps);
    }
    if (m->arch->gemma4 && !L->kv_shared) /* V: a weightless RMSNorm per head */
        op_rms_norm(m->v, m->v, NULL, n * n_kv, dv, hp->rms_eps);
    kv_pool *kv = c->pools[L->kv_group];
    const int64_t rot_k = kv_rotation(kv_pool_cfg(kv)->dtype, dk, true),
                  rot_v = kv_rotation(kv_pool_dtype_v(kv), dv, false);
    for (int64_t t = 0; t < n; t++) {
        int32_t pos = c->b->pos[c->t0 + t];
        if (L->rope) {
            op_rope(m, L, m->q + t * qd, (int)hp->n_head, dk, 0, pos);
            if (!L->kv_shared) op_rope(m, L, m->k + t * kd, (int)n_kv, dk, 0, pos);
        } else if (hp->nope_temp_scale != 0.0f) {
            /* llama4's NoPE layers: q scaled by llama.cpp's attention temperature,
             * computed as it does (float position, double log) */
            const float s =
                (float)(log(floor(((float)pos + hp->nope_temp_offset) / hp->nope_temp_floor) +
                            1.0) *
                            hp->nope_temp_scale +
                        1.0);
            for (int64_t i = 0; i < qd; i++) m->q[t * qd + i] *= s;
        }
        if (L->rope && hp->kq_l2_norm) { /* llama4: weightless RMSNorm per head, after rope */
            op_rms_norm(m->q + t * qd, m->q + t * qd, NULL, hp->n_head, dk, hp->rms_eps);
            op_rms_norm(m->k + t * kd, m->k + t * kd, NULL, n_kv, dk, hp->rms_eps);
        }
        if (m->arch->attn_temp && hp->attn_temp_scale != 0.0f) {
            /* llama.cpp's attention temperature, in its precisions */
            const float s =
                (float)(log(floorf((float)pos / (float)hp->rope_yarn.n_ctx_orig) + 1.0) *
                            hp->attn_temp_scale +
                        1.0);
            for (int64_t i = 0; i < qd; i++) m->q[t * qd + i] *= s;
        }
    }
    if (rot_k) {
        op_hadamard(m->q, n * qd, rot_k);
        op_hadamard(m->k, n * kd, rot_k);
    }
    if (rot_v) op_hadamard(m->v, n * vd, rot_v);
    for (int64_t t = 0; t < n && !L->kv_shared; t++)
        kv_store(kv, seq_table(c, t, L->kv_group), L->kv_slot, c->b->pos[c->t0 + t], m->k + t * kd,
                 m->v + t * vd);
    attn_args a = {.kv = kv,
                   .slot = L->kv_slot,
                   .dk = dk,
                   .dv = dv,
                   .scale = attn_scale(m, L),
                   .softcap = hp->attn_softcap,
                   .window = m->groups[L->kv_group].attn.window,
                   .sinks = L->attn_sinks.data,
                   .chunk = L->chunk};
    PHASE_BEGIN(t_att);
    attention(c, L, &a, m->q, qd, m->att, hp->n_head * dv);
    PHASE_END(t_att, PHASE_ATTENTION, attn_read_bytes(kv, &a, c->b->pos[c->t0]));
    if (rot_v) op_hadamard(m->att, n * hp->n_head * dv, rot_v); /* back: H is its own inverse */
    PHASE_BEGIN(t_wo);
    op_matmul(m, &L->wo, m->att, n, m->xb);
    PHASE_END(t_wo, PHASE_WO, mtensor_slice_bytes(&L->wo));
    op_add_bias(m->xb, &L->bo, n, hp->n_embd);
}

/* Copies `width` floats at `offset` of each of n rows (stride) into dst[n][width], or back. */
static void gather(float *dst, const float *src, int64_t n, int64_t stride, int64_t offset,
                   int64_t width) {
    for (int64_t t = 0; t < n; t++)
        memcpy(dst + t * width, src + t * stride + offset, width * sizeof(float));
}
static void scatter(float *dst, const float *src, int64_t n, int64_t stride, int64_t offset,
                    int64_t width) {
    for (int64_t t = 0; t < n; t++)
        memcpy(dst + t * stride + offset, src + t * width, width * sizeof(float));
}

/* deepseek2's q.k scale: llama.cpp folds the YaRN magnitude correction
 * (with rope.scaling.yarn_log_multiplier) into it, squared, after undoing the
 * one its rope's attn_factor carries; 1/sqrt(nope + rope) without scaling. */
static float mla_kq_scale(const model *m, int64_t qh) {
    const model_hparams *hp = &m->hp;
    const float inv = 1.0f / hp->rope_freq_scale;
    const float attn_org = hp->rope_yarn.attn_factor * (1.0f + 0.1f * logf(inv));
    const float mscale = attn_org * (1.0f + 0.1f * hp->rope_yarn.log_mul * logf(inv));
    return 1.0f * mscale * mscale / sqrtf((float)qh);
}

/* MLA (DeepSeek-V2/V3), absorbed: q_nope is mapped into the latent space by
 * k_b, attention runs over the cached [latent, rope] rows of one shared head,
 * and v_b maps each head's latent result to its value space. */
static void attn_mla(fwd_ctx *c, int il) {
    model *m = c->m;
    const model_hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    int64_t n = c->n, H = hp->n_head, r = hp->kv_lora_rank, rope = hp->n_rot;
    int64_t nope = hp->n_rot_mla_nope, qh = nope + rope, dk = r + rope, vd = hp->v_head_dim_mla;
    float *qraw = m->xb; /* the normed input is not needed once q and kv are projected */
    /* the latent (+ rope key) and q (or q's low-rank half) from the same input:
     * one prepared input, one parallel region when both are repacked alike */
    const mtensor *proj[] = {&L->wkv_a_mqa, L->wq_a.data ? &L->wq_a : &L->wq};
    float *const proj_out[] = {m->k /* [n][r + rope] */, m->xb2 /* [n][q_lora or H * qh] */};
    PHASE_BEGIN(t_qkv);
    op_matmul_many(m, 2, proj, m->xb, n, proj_out);
    if (L->wq_a.data) {
        op_rms_norm(m->xb2, m->xb2, L->q_a_norm.data, n, hp->q_lora_rank, hp->rms_eps);
        op_matmul(m, &L->wq_b, m->xb2, n, qraw);
    } else {
        memcpy(qraw, m->xb2, n * H * qh * sizeof(float));
    }
    PHASE_END(t_qkv, PHASE_QKV,
              mtensor_slice_bytes(&L->wkv_a_mqa) + mtensor_slice_bytes(&L->wq_a) +
                  mtensor_slice_bytes(&L->wq_b) + mtensor_slice_bytes(&L->wq));
    kv_pool *kv = c->pools[L->kv_group];
    for (int64_t t = 0; t < n; t++) {
        int32_t pos = c->b->pos[c->t0 + t];
        float *krow = m->k + t * dk;
        op_rms_norm(krow, krow, L->kv_a_norm.data, 1, r, hp->rms_eps);
        op_rope(m, L, krow, 1, dk, r, pos);
        op_rope(m, L, qraw + t * H * qh, (int)H, qh, nope, pos);
        kv_store(kv, seq_table(c, t, L->kv_group), L->kv_slot, pos, krow, NULL);
    }
    float *qa = m->mla_a, *qb = m->mla_b;
    const bool heads1 = n == 1 && m->head_work; /* one row: no gathering, heads in parallel */
    PHASE_BEGIN(t_kb);
    if (heads1) op_matmul_heads1(m, &L->wk_b, H, qraw, qh, m->q, dk);
    PHASE_END(t_kb, PHASE_MLA_HEADS, (double)H * mtensor_slice_bytes(&L->wk_b));
    for (int64_t h = 0; h < H; h++) {
        if (!heads1) {
            gather(qa, qraw, n, H * qh, h * qh, nope);
            op_matmul_head(m, &L->wk_b, h, qa, n, qb); /* [n][r] */
            scatter(m->q, qb, n, H * dk, h * dk, r);
        }
        gather(qa, qraw, n, H * qh, h * qh + nope, rope);
        scatter(m->q, qa, n, H * dk, h * dk + r, rope);
    }
    attn_args a = {.kv = kv,
                   .slot = L->kv_slot,
                   .dk = dk,
                   .dv = r,
                   .v_in_k = true,
                   .scale = mla_kq_scale(m, qh),
                   .window = m->groups[L->kv_group].attn.window};
    PHASE_BEGIN(t_att);
    attention(c, L, &a, m->q, H * dk, m->att, H * r);
    PHASE_END(t_att, PHASE_ATTENTION, attn_read_bytes(kv, &a, c->b->pos[c->t0]));
    PHASE_BEGIN(t_vb);
    if (heads1) op_matmul_heads1(m, &L->wv_b, H, m->att, r, m->xb2, vd);
    for (int64_t h = 0; h < H && !heads1; h++) {
        gather(qa, m->att, n, H * r, h * r, r);
        op_matmul_head(m, &L->wv_b, h, qa, n, qb); /* [n][vd] */
        scatter(m->xb2, qb, n, H * vd, h * vd, vd);
    }
    PHASE_END(t_vb, PHASE_MLA_HEADS, (double)H * mtensor_slice_bytes(&L->wv_b));
    PHASE_BEGIN(t_wo);
    op_matmul(m, &L->wo, m->xb2, n, m->xb);
    PHASE_END(t_wo, PHASE_WO, mtensor_slice_bytes(&L->wo));
}

/* MLA as files converted before llama.cpp's MLA rework store it (llama.cpp's
 * is_mla false): the latent is expanded by kv_b into per-head K (nope, then
 * the shared rope key) and V, cached and attended as plain multi-head
 * attention, one KV head per query head. */
static void attn_mla_uncompressed(fwd_ctx *c, int il) {
    model *m = c->m;
    const model_hparams *hp = &m->hp;
    const layer_weights *L = &m->layers[il];
    int64_t n = c->n, H = hp->n_head, r = hp->kv_lora_rank, rope = hp->n_rot;
    int64_t nope = hp->n_rot_mla_nope, qh = nope + rope, vd = hp->v_head_dim_mla, kvb = nope + vd;
    if (L->wq_a.data) {
        op_matmul(m, &L->wq_a, m->xb, n, m->xb2); /* [n][q_lora] */
        op_rms_norm(m->xb2, m->xb2, L->q_a_norm.data, n, hp->q_lora_rank, hp->rms_eps);
        op_matmul(m, &L->wq_b, m->xb2, n, m->q); /* [n][H][nope + rope] */
    } else {
        op_matmul(m, &L->wq, m->xb, n, m->q);
    }
    float *kvc = m->xb2, *lat = m->mla_a,
          *kv = m->xb;                          /* the normed input is done with after this */
    op_matmul(m, &L->wkv_a_mqa, m->xb, n, kvc); /* [n][r + rope] */
    for (int64_t t = 0; t < n; t++) {
        int32_t pos = c->b->pos[c->t0 + t];
        float *row = kvc + t * (r + rope);
        op_rms_norm(row, row, L->kv_a_norm.data, 1, r, hp->rms_eps);
        op_rope(m, L, row, 1, r + rope, r, pos);
        op_rope(m, L, m->q + t * H * qh, (int)H, qh, nope, pos);
    }
    gather(lat, kvc, n, r + rope, 0, r);
    op_matmul(m, &L->wkv_b, lat, n, kv); /* [n][H][nope + v] */
    kv_pool *pool = c->pools[L->kv_group];
    /* a plain K/V cache in llama.cpp too: rotated where it is quantized */
    const int64_t rot_k = kv_rotation(kv_pool_cfg(pool)->dtype, qh, true),
                  rot_v = kv_rotation(kv_pool_dtype_v(pool), vd, false);
    for (int64_t t = 0; t < n; t++) {
        float *k = m->k + t * H * qh, *v = m->v + t * H * vd;
        for (int64_t h = 0; h < H; h++) {
            memcpy(k + h * qh, kv + (t * H + h) * kvb, nope * sizeof(float));
            memcpy(k + h * qh + nope, kvc + t * (r + rope) + r, rope * sizeof(float));
            memcpy(v + h * vd, kv + (t * H + h) * kvb + nope, vd * sizeof(float));
        }
    }
    if (rot_k) {
        op_hadamard(m->q, n * H * qh, rot_k);
        op_hadamard(m->k, n * H * qh, rot_k);
    }
    if (rot_v) op_hadamard(m->v, n * H * vd, rot_v);
    for (int64_t t = 0; t < n; t++)
        kv_store(pool, seq_table(c, t, L->kv_group), L->kv_slot, c->b->pos[c->t0 + t],
                 m->k + t * H * qh, m->v + t * H * vd);
    attn_args a = {.kv = pool,
                   .slot = L->kv_slot,
                   .dk = qh,
                   .dv = vd,
                   .scale = 1.0f / sqrtf((float)qh),
                   .window = m->groups[L->kv_group].attn.window};
    attention(c, L, &a, m->q, H * qh, m->att, H * vd);
    if (rot_v) op_hadamard(m->att, n * H * vd, rot_v);
    op_matmul(m, &L->wo, m->att, n, m->xb);
}

/* The gated FFN of the normed rows in m->xb, in place. */
static void dense_ffn(fwd_ctx *c, const layer_weights *L) {
    model *m = c->m;
    const int64_t n = c->n, F = L->ffn_gate.ne1; /* this layer's width */
    const mtensor *gate_up[] = {&L->ffn_gate, &L->ffn_up};
    float *const gate_up_out[] = {m->ff_gate, m->ff_up};
    PHASE_BEGIN(t_dense);
    op_matmul_many(m, 2, gate_up, m->xb, n, gate_up_out);
    if (m->arch->altup && L - m->layers < 10) /* gemma3n's first 10 layers (llama.cpp's) */
        altup_gaussian_topk(m->ff_gate, n, F);
    if (m->arch->ffn_act == ARCH_ACT_GELU) op_gelu_mul(m->ff_gate, m->ff_up, n * F);
    else op_silu_mul(m->ff_gate, m->ff_up, n * F);
    op_matmul(m, &L->ffn_down, m->ff_gate, n, m->xb);
    PHASE_END(t_dense, PHASE_FFN_DENSE,
              mtensor_slice_bytes(&L->ffn_gate) + mtensor_slice_bytes(&L->ffn_up) +
                  mtensor_slice_bytes(&L->ffn_down));
}

/* gemma4's MoE layer, from the residual stream m->x into m->xb: the dense FFN
 * (ffn_norm, post_ffw_norm_1) plus the experts (pre_ffw_norm_2 on their input,
 * post_ffw_norm_2 on their sum), the router reading the weightless RMSNorm of
 * m->x / sqrt(E) times ffn_gate_inp.scale, as llama.cpp's gemma4 graph. */
static void gemma4_moe_ffn(fwd_ctx *c, const layer_weights *L) {
    model *m = c->m;
    const int64_t n = c->n, E = m->hp.n_embd;
    const float eps = m->hp.rms_eps, inv_sqrt_e = 1.0f / sqrtf((float)E);
    const float *gs = L->ffn_gate_inp_s.data;
    float *mlp = m->xb2, *rx = m->par;
    op_rms_norm(m->xb, m->x, L->ffn_norm.data, n, E, eps);
    dense_ffn(c, L);
    op_rms_norm(mlp, m->xb, L->ffn_post_norm_1.data, n, E, eps);
    op_rms_norm(rx, m->x, NULL, n, E, eps);
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < E; i++) rx[t * E + i] = rx[t * E + i] * inv_sqrt_e * gs[i];
    op_rms_norm(m->xb, m->x, L->ffn_pre_norm_2.data, n, E, eps);
    moe_ffn(m, L, m->xb, rx, n, m->xb);
    op_rms_norm(m->xb, m->xb, L->ffn_post_norm_2.data, n, E, eps);
    for (int64_t i = 0; i < n * E; i++) m->xb[i] = mlp[i] + m->xb[i];
}

static void ffn(fwd_ctx *c, const layer_weights *L) {
    if (L->ffn_gate_inp.data) moe_ffn(c->m, L, c->m->xb, NULL, c->n, c->m->xb);
    else dense_ffn(c, L);
}

static void add_residual(model *m, const mtensor *post_norm, int64_t n) {
    int64_t E = m->hp.n_embd;
    if (post_norm->data) op_rms_norm(m->xb, m->xb, post_norm->data, n, E, m->hp.rms_eps);
    if (m->arch->granite_scales && m->hp.residual_scale != 0.0f)
        for (int64_t i = 0; i < n * E; i++) m->xb[i] *= m->hp.residual_scale;
    for (int64_t i = 0; i < n * E; i++) m->x[i] += m->xb[i];
}

/* The family's norm of n rows of x into out: RMSNorm, or LayerNorm (command-r);
 * a layer without the pre-norm (olmo2) passes x through. */
static void norm_rows(const model *m, float *out, const float *x, const mtensor *w, int64_t n) {
    const int64_t E = m->hp.n_embd;
    if (!w->data) {
        if (out != x) memcpy(out, x, (size_t)(n * E) * sizeof(float));
    } else if (m->arch->norm == ARCH_NORM_LAYER)
        op_layer_norm(out, x, w->data, n, E, m->hp.norm_eps);
    else op_rms_norm(out, x, w->data, n, E, m->hp.rms_eps);
}

static void layer_forward(fwd_ctx *c, int il) {
    model *m = c->m;
    const layer_weights *L = &m->layers[il];
    const int64_t n = c->n, E = m->hp.n_embd;
    const size_t bytes = (size_t)(n * E) * sizeof(float);
    PHASE_BEGIN(t_attn);
    norm_rows(m, m->xb, m->x, &L->attn_norm, n);
    if (m->arch->parallel) memcpy(m->xb2, m->xb, bytes); /* the FFN's input too */
    if (m->arch->attn == ARCH_ATTN_MLA && m->hp.mla) attn_mla(c, il);
    else if (m->arch->attn == ARCH_ATTN_MLA) attn_mla_uncompressed(c, il);
    else attn_mha(c, il);
    PHASE_END(t_attn, PHASE_ATTN_LAYER, 0);
    PHASE_BEGIN(t_ffn);
    if (m->arch->parallel) { /* command-r: x + FFN(h) + attention(h), in llama.cpp's order */
        memcpy(m->par, m->xb, bytes);
        memcpy(m->xb, m->xb2, bytes);
        ffn(c, L);
        for (int64_t i = 0; i < n * E; i++) m->x[i] = (m->xb[i] + m->x[i]) + m->par[i];
        cvec_apply(m, il, m->x, n);
        PHASE_END(t_ffn, PHASE_FFN_LAYER, 0);
        return;
    }
    add_residual(m, &L->post_attn_norm, n);
    if (m->arch->gemma4 && L->ffn_gate_inp.data) {
        gemma4_moe_ffn(c, L);
    } else {
        norm_rows(m, m->xb, m->x, &L->ffn_norm, n);
        ffn(c, L);
    }
    add_residual(m, &L->post_ffn_norm, n);
    if (L->pl_inp_gate.data) { /* gemma4 E2B / E4B: the layer's per-token input */
        per_layer_branch(m, L, il, m->x, n, m->xb);
        for (int64_t i = 0; i < n * E; i++) m->x[i] = m->x[i] + m->xb[i];
    }
    if (L->out_scale.data) { /* gemma4: the layer's whole output scaled */
        const float s = *(const float *)L->out_scale.data;
        for (int64_t i = 0; i < n * E; i++) m->x[i] *= s;
    }
    cvec_apply(m, il, m->x, n);
    PHASE_END(t_ffn, PHASE_FFN_LAYER, 0);
}

/* gemma3n's layer (llama.cpp's gemma3n graph): on stream 0's prediction,
 * attention beside LAuReL, their mean (x 1/sqrt(2)) through the FFN (with
 * its activation sparsity), then the streams corrected (model_altup.c). */
static void layer_forward_altup(fwd_ctx *c, int il) {
    model *m = c->m;
    const layer_weights *L = &m->layers[il];
    const int64_t n = c->n, E = m->hp.n_embd;
    const float inv_sqrt2 = 1.0f / sqrtf(2.0f);
    float *active = m->x, *laurel = m->xb2;
    altup_predict(m, L, n, active);
    norm_rows(m, m->xb, active, &L->attn_norm, n);
    altup_laurel(m, L, m->xb, n, laurel);
    attn_mha(c, il);
    op_rms_norm(m->xb, m->xb, L->post_attn_norm.data, n, E, m->hp.rms_eps);
    for (int64_t i = 0; i < n * E; i++) /* (attention + its input) with LAuReL, averaged */
        m->x[i] = ((m->xb[i] + active[i]) + laurel[i]) * inv_sqrt2;
    norm_rows(m, m->xb, m->x, &L->ffn_norm, n);
    dense_ffn(c, L);
    op_rms_norm(m->xb, m->xb, L->post_ffn_norm.data, n, E, m->hp.rms_eps);
    for (int64_t i = 0; i < n * E; i++) m->xb[i] = m->xb[i] + m->x[i];
    altup_correct(m, L, il, m->xb, n);
    cvec_apply(m, il, altup_streams(m), n * ALTUP_N); /* every stream, as llama.cpp adds it */
}

static bool wants_logits(const model_batch *b, int64_t i) {
    return b->want_logits ? b->want_logits[i] != 0 : i == b->n_tokens - 1;
}

static void embed(fwd_ctx *c) {
    model *m = c->m;
    int64_t E = m->hp.n_embd;
    for (int64_t t = 0; t < c->n; t++)
        kern_get_row(m->tok_embd.data, m->tok_embd.dtype, E, c->b->tokens[c->t0 + t], m->x + t * E);
    lora_embed(m, c->b->tokens + c->t0, c->n, m->x);
    if (m->arch->embd_scale) {
        float s = sqrtf((float)E);
        for (int64_t i = 0; i < c->n * E; i++) m->x[i] *= s;
    }
    if (m->arch->granite_scales && m->hp.embd_scale != 0.0f)
        for (int64_t i = 0; i < c->n * E; i++) m->x[i] *= m->hp.embd_scale;
}

void per_layer_branch(model *m, const layer_weights *L, int il, const float *g, int64_t n,
                      float *out) {
    const int64_t np = m->hp.n_embd_per_layer, npl = np * m->hp.n_layer;
    op_matmul(m, &L->pl_inp_gate, g, n, m->pl_tmp);
    op_gelu_mul(m->pl_tmp, NULL, n * np);
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < np; i++) m->pl_tmp[t * np + i] *= m->pl_in[t * npl + il * np + i];
    op_matmul(m, &L->pl_proj, m->pl_tmp, n, out);
    op_rms_norm(out, out, L->pl_post_norm.data, n, m->hp.n_embd, m->hp.rms_eps);
}

/* gemma4 E2B / E4B: every layer's input for each token of the ubatch, into
 * m->pl_in [n][n_layer][n_pl], as llama.cpp's gemma4 graph computes them: the
 * token's row of per_layer_token_embd times sqrt(n_pl), plus the scaled input
 * embedding projected by per_layer_model_proj, times 1/sqrt(E), RMS-normed per
 * layer by per_layer_proj_norm; the sum times 1/sqrt(2). Every stage of a
 * pipeline computes them from the token ids (the embedding rows are bound on
 * all stages). */
static void per_layer_inputs(fwd_ctx *c) {
    model *m = c->m;
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, np = hp->n_embd_per_layer, npl = np * hp->n_layer;
    const float emb_scale = sqrtf((float)E), proj_scale = 1.0f / sqrtf((float)E),
                row_scale = sqrtf((float)np), in_scale = 1.0f / sqrtf(2.0f);
    float *e = m->xb; /* the scaled input embeddings, as embed() makes them */
    for (int64_t t = 0; t < c->n; t++) {
        kern_get_row(m->tok_embd.data, m->tok_embd.dtype, E, c->b->tokens[c->t0 + t], e + t * E);
        for (int64_t i = 0; i < E; i++) e[t * E + i] *= emb_scale;
    }
    op_matmul(m, &m->pl_model_proj, e, c->n, m->pl_in);
    for (int64_t t = 0; t < c->n; t++) {
        float *p = m->pl_in + t * npl;
        for (int64_t i = 0; i < npl; i++) p[i] *= proj_scale;
        op_rms_norm(p, p, m->pl_proj_norm.data, hp->n_layer, np, hp->rms_eps);
        kern_get_row(m->pl_tok_embd.data, m->pl_tok_embd.dtype, npl, c->b->tokens[c->t0 + t],
                     m->pl_row);
        for (int64_t i = 0; i < npl; i++) p[i] = (p[i] + m->pl_row[i] * row_scale) * in_scale;
    }
}

/* Final norm and LM head for the wanted rows; returns how many were written.
 * hidden (or NULL) receives the normed rows; logits NULL skips the head. */
static int64_t project_logits(fwd_ctx *c, float *logits, float *hidden) {
    model *m = c->m;
    const model_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, n_out = 0;
    for (int64_t t = 0; t < c->n; t++)
        if (wants_logits(c->b, c->t0 + t))
            memcpy(m->logit_rows + (n_out++) * E, m->x + t * E, E * sizeof(float));
    if (n_out == 0) return 0;
    PHASE_BEGIN(t_out);
    norm_rows(m, m->logit_rows, m->logit_rows, &m->output_norm, n_out);
    if (hidden) memcpy(hidden, m->logit_rows, (size_t)(n_out * E) * sizeof(float));
    if (!logits) {
        PHASE_END(t_out, PHASE_OUTPUT, 0); /* no head read */
        return n_out;
    }
    lora_rows_head(m, c->b, c->t0, c->n);
    op_matmul(m, &m->output, m->logit_rows, n_out, logits);
    /* granite divides by its logit scale, command-r multiplies (llama.cpp's ggml_scale) */
    float ls = 0.0f;
    if (m->arch->granite_scales && hp->logit_scale != 0.0f) ls = 1.0f / hp->logit_scale;
    else if (m->arch->logit_scale && hp->logit_scale != 0.0f) ls = hp->logit_scale;
    if (ls != 0.0f)
        for (int64_t i = 0; i < n_out * hp->n_vocab; i++) logits[i] *= ls;
    if (hp->final_softcap > 0)
        for (int64_t i = 0; i < n_out * hp->n_vocab; i++)
            logits[i] = hp->final_softcap * tanhf(logits[i] / hp->final_softcap);
    for (int64_t r = 0; r < n_out; r++) /* gemma4's suppressed tokens */
        for (int64_t i = 0; i < m->n_suppress; i++)
            logits[r * hp->n_vocab + m->suppress[i]] = -INFINITY;
    PHASE_END(t_out, PHASE_OUTPUT, mtensor_slice_bytes(&m->output));
    return n_out;
}

bool model_forward(model *m, kv_pool *const *pools, const model_batch *b, float *logits,
                   kvl_error *err) {
    if (m->forward_hook) return m->forward_hook(m->forward_hook_user, m, pools, b, logits, err);
    return model_forward_stage(m, pools, b, NULL, NULL, logits, err);
}

bool model_forward_launch(model *m, kv_pool *const *pools, const model_batch *b, float *logits,
                          kvl_error *err) {
    if (m->launch_hook) return m->launch_hook(m->async_user, m, pools, b, logits, err);
    return model_forward(m, pools, b, logits, err);
}

bool model_forward_wait(model *m, kvl_error *err) {
    return m->wait_hook ? m->wait_hook(m->async_user, err) : true;
}

bool model_forward_stage(model *m, kv_pool *const *pools, const model_batch *b, const float *x_in,
                         float *x_out, float *logits, kvl_error *err) {
    if (!x_in && !model_first_stage(m))
        return kvl_fail(err, "model: layers %d-%d need the hidden states of the stage before",
                        m->layer_first, m->layer_end - 1);
    if (!x_out && !model_last_stage(m))
        return kvl_fail(err, "model: layers %d-%d are not the last: their output goes on",
                        m->layer_first, m->layer_end - 1);
    if (!check_batch(m, pools, b, err) || !ensure_attn_scratch(m, pools, err)) return false;
    const int64_t E = m->hp.n_embd;
    int64_t out_rows = 0;
    PHASE_FORWARD_BEGIN(b->n_tokens);
    PHASE_BEGIN(t_fwd);
    for (int64_t t0 = 0; t0 < b->n_tokens; t0 += m->mp.max_ubatch) {
        fwd_ctx c = {.m = m,
                     .pools = pools,
                     .b = b,
                     .t0 = t0,
                     .n =
                         b->n_tokens - t0 < m->mp.max_ubatch ? b->n_tokens - t0 : m->mp.max_ubatch};
        lora_rows_tokens(m, b, t0, c.n);
        if (m->pl_tok_embd.data) per_layer_inputs(&c);
        if (x_in) memcpy(m->x, x_in + t0 * E, (size_t)(c.n * E) * sizeof(float));
        else embed(&c);
        if (m->arch->altup) { /* gemma3n: one stage (model_load), four streams */
            altup_embed(m, m->x, c.n);
            for (int il = 0; il < m->layer_end; il++) layer_forward_altup(&c, il);
            altup_unembed(m, m->x, c.n);
        }
        for (int il = m->layer_first; il < m->layer_end && !m->arch->altup; il++)
            layer_forward(&c, il);
        if (x_out) {
            memcpy(x_out + t0 * E, m->x, (size_t)(c.n * E) * sizeof(float));
            continue;
        }
        out_rows += project_logits(&c, logits ? logits + out_rows * m->hp.n_vocab : NULL,
                                   b->hidden ? b->hidden + out_rows * m->hp.n_embd : NULL);
    }
    PHASE_END(t_fwd, PHASE_FORWARD, 0);
    return true;
}
