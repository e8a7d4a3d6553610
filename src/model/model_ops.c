/* model ops: the elementwise and attention pieces of the forward pass.
 * Numerics follow ggml where it matters for agreement with llama.cpp: RMSNorm
 * squares in float and sums the squares in double, RoPE angles are built by
 * repeated multiplication, softmax sums in double, and q is converted to the
 * KV cache's type before q.k. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kvl_pool.h"
#include "model_internal.h"

/* Elementwise work below this many elements stays on the calling thread:
 * waking the team costs more (rows and elements are independent, so the split
 * does not change any result). */
#define OPS_PARALLEL_MIN (1 << 16)

typedef struct {
    float *x;
    int64_t runs, n, parts;
} hadamard_job;

static void hadamard_task(void *ctx, int64_t t, int thread) {
    (void)thread;
    const hadamard_job *j = ctx;
    const int64_t r0 = j->runs * t / j->parts, r1 = j->runs * (t + 1) / j->parts;
    kern_hadamard(j->x + r0 * j->n, r1 - r0, j->n);
}

void op_hadamard(float *x, int64_t count, int64_t n) {
    const int64_t runs = count / n;
    const int nt = kvl_pool_threads();
    if (count >= OPS_PARALLEL_MIN && nt > 1) { /* a prompt's rows: runs are independent */
        hadamard_job j = {x, runs, n, runs < 4 * nt ? runs : 4 * nt};
        kvl_pool_run(hadamard_task, &j, j.parts);
        return;
    }
    kern_hadamard(x, runs, n);
}

/* The sum of squares of a row in double, as ggml_rms_norm sums it, but in
 * RMS_LANES interleaved partial sums (element i into lane i % RMS_LANES, the
 * lanes then added pairwise): one chain of dependent double adds, 2048 of them
 * for qwen3-30b-a3b, took 3-4 us a norm at decode on the Xeon, two norms a
 * layer. The double differs from the sequential sum in its last bits only, far
 * below the float the norm takes from it (which moves only when that rounding
 * straddles a float boundary); every row is summed this way whatever its
 * batch, so a token's norm does not depend on its batch mates. */
enum { RMS_LANES = 8 };
static double sum_squares(const float *x, int64_t n) {
    double lane[RMS_LANES] = {0};
    int64_t i = 0;
    for (; i + RMS_LANES <= n; i += RMS_LANES)
        for (int l = 0; l < RMS_LANES; l++) lane[l] += (double)(x[i + l] * x[i + l]);
    for (int l = 0; i < n; i++, l++) lane[l] += (double)(x[i] * x[i]);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static void rms_rows(float *out, const float *x, const float *w, int64_t rows, int64_t n,
                     float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        const float scale = 1.0f / sqrtf((float)(sum_squares(xr, n) / n) + eps);
        if (w)
            for (int64_t i = 0; i < n; i++) o[i] = (xr[i] * scale) * w[i];
        else
            for (int64_t i = 0; i < n; i++) o[i] = xr[i] * scale;
    }
}

typedef struct {
    float *out;
    const float *x, *w;
    int64_t rows, n, parts;
    float eps;
} rms_job;

static void rms_task(void *ctx, int64_t t, int thread) {
    const rms_job *j = ctx;
    const int64_t r0 = j->rows * t / j->parts, r1 = j->rows * (t + 1) / j->parts;
    rms_rows(j->out + r0 * j->n, j->x + r0 * j->n, j->w, r1 - r0, j->n, j->eps);
}

void op_rms_norm(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps) {
    const int nt = kvl_pool_threads();
    if (rows > 1 && rows * n >= OPS_PARALLEL_MIN && nt > 1) {
        /* a few parts per thread, so a descheduled thread leaves the rest to the others */
        const int64_t parts = rows < 4 * nt ? rows : 4 * nt;
        rms_job j = {out, x, w, rows, n, parts, eps};
        kvl_pool_run(rms_task, &j, parts);
        return;
    }
    rms_rows(out, x, w, rows, n, eps);
}

float op_row_moments(const float *x, int64_t n, double *centred_ss) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i];
    const float mean = (float)sum / (float)n;
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        const float d = x[i] - mean;
        ss += (double)(d * d);
    }
    *centred_ss = ss;
    return mean;
}

/* As ggml_norm: the mean and the variance of the centred row summed in double,
 * the scale in float; then the weight. Rows are few and the op cheap next to
 * the matmuls around it, so it stays on this thread. */
void op_layer_norm(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double var;
        const float mean = op_row_moments(xr, n, &var);
        const float scale = 1.0f / sqrtf((float)(var / (double)n) + eps);
        for (int64_t i = 0; i < n; i++) o[i] = ((xr[i] - mean) * scale) * w[i];
    }
}

void op_matmul(model *m, const mtensor *w, const float *x, int64_t rows, float *y) {
    if (w->packed) kern_matmul_repacked(w->packed, w->dtype, w->ne1, w->ne0, x, rows, y, m->work);
    else kern_matmul(w->data, w->dtype, w->ne1, w->ne0, x, rows, y, m->work);
    if (w->lora) lora_apply(m, w, x, rows, y);
}

/* kern_matmul runs a matrix of fewer multiply-adds than this on the calling
 * thread (matmul.c's MATMUL_PARALLEL_MIN_MACS). */
#define OPS_MATMUL_SERIAL_MACS (1 << 17)
/* Small matrices on the same x that together make at least this many
 * multiply-adds run side by side, one matrix per task, in one pool round. */
#define OPS_MATMUL_SPLIT_MACS (1 << 15)
#define OPS_MATMUL_SPLIT_MAX  4

typedef struct {
    const mtensor *const *ws;
    const float *x;
    int64_t rows;
    float *const *ys;
    char *work;
    size_t slot[OPS_MATMUL_SPLIT_MAX];
} split_job;

static void split_task(void *ctx, int64_t i, int thread) {
    const split_job *j = ctx;
    const mtensor *w = j->ws[i];
    kern_matmul(w->data, w->dtype, w->ne1, w->ne0, j->x, j->rows, j->ys[i], j->work + j->slot[i]);
}

/* Matrices that are each too small for kern_matmul to share among the threads
 * (a few tokens through stories260K-sized F32 weights, a speculative
 * verification) but worth a pool round together: each on a thread of its
 * own, with its own part of m->work. Every output is what kern_matmul gives
 * alone, so the results are the same bits. False when it does not apply. */
static bool matmul_split(model *m, int nw, const mtensor *const *ws, const float *x, int64_t rows,
                         float *const *ys) {
    if (nw < 2 || nw > OPS_MATMUL_SPLIT_MAX || kvl_pool_threads() < 2) return false;
    split_job j = {ws, x, rows, ys, m->work, {0}};
    double total = 0;
    size_t off = 0;
    for (int i = 0; i < nw; i++) {
        const double macs = (double)ws[i]->ne1 * (double)ws[i]->ne0 * (double)rows;
        if (ws[i]->packed || macs >= OPS_MATMUL_SERIAL_MACS) return false;
        total += macs;
        j.slot[i] = off;
        off += (kern_matmul_work_bytes(ws[i]->dtype, rows, ws[i]->ne0) + 63) & ~(size_t)63;
    }
    if (total < OPS_MATMUL_SPLIT_MACS || off > m->work_bytes) return false;
    kvl_pool_run(split_task, &j, nw);
    return true;
}

/* Matrices applied to the same x: one prepared x and one parallel region when
 * all are repacked with a shared activation layout, else one by one. */
void op_matmul_many(model *m, int nw, const mtensor *const *ws, const float *x, int64_t rows,
                    float *const *ys) {
    bool fused = nw <= KERN_REPACKED_MAX;
    for (int i = 0; i < nw && fused; i++)
        fused = ws[i]->packed && ws[i]->ne0 == ws[0]->ne0 &&
                kern_repacked_share_input(ws[i]->dtype, ws[0]->dtype);
    if (!fused && !matmul_split(m, nw, ws, x, rows, ys)) {
        for (int i = 0; i < nw; i++) op_matmul(m, ws[i], x, rows, ys[i]); /* adapters included */
        return;
    }
    if (fused) {
        kern_repacked_mat mats[KERN_REPACKED_MAX] = {{0}};
        for (int i = 0; i < nw; i++)
            mats[i] = (kern_repacked_mat){ws[i]->packed, ws[i]->dtype, ws[i]->ne1, ys[i]};
        kern_matmul_repacked_multi(nw, mats, ws[0]->ne0, x, rows, m->work);
    }
    for (int i = 0; i < nw; i++) /* the LoRA adapters' products, as op_matmul adds them */
        if (ws[i]->lora) lora_apply(m, ws[i], x, rows, ys[i]);
}

void op_matmul_head(model *m, const mtensor *w, int64_t head, const float *x, int64_t rows,
                    float *y) {
    const uint8_t *base =
        (const uint8_t *)w->data + (size_t)head * w->ne1 * kern_row_bytes(w->dtype, w->ne0);
    kern_matmul(base, w->dtype, w->ne1, w->ne0, x, rows, y, m->work);
}

typedef struct {
    const mtensor *w;
    const float *x;
    float *y;
    int64_t xs, ys;
    char *work;
    size_t slot;
} heads_job;

static void heads_task(void *ctx, int64_t h, int thread) {
    const heads_job *j = ctx;
    const mtensor *w = j->w;
    const uint8_t *base =
        (const uint8_t *)w->data + (size_t)h * w->ne1 * kern_row_bytes(w->dtype, w->ne0);
    /* inside a pool task the matmul runs on this thread alone */
    kern_matmul(base, w->dtype, w->ne1, w->ne0, j->x + h * j->xs, 1, j->y + h * j->ys,
                j->work + (size_t)thread * j->slot);
}

/* One thread's share of op_matmul_heads1's repacked heads. */
typedef struct {
    model *m;
    const mtensor *w;
    int64_t n_heads, groups;
    const float *x;
    int64_t xs;
    float *y;
    int64_t ys;
} head_group_job;

static void head_group_task(void *ctx, int64_t g, int thread) {
    const head_group_job *j = ctx;
    const size_t stride = model_head_stride(j->w);
    void *work = (char *)j->m->head_each_work + (size_t)thread * j->m->head_each_slot;
    const int64_t end = j->n_heads * (g + 1) / j->groups;
    for (int64_t h0 = j->n_heads * g / j->groups; h0 < end; h0 += KERN_EACH_MAX) {
        const int nh = (int)(end - h0 < KERN_EACH_MAX ? end - h0 : KERN_EACH_MAX);
        kern_repacked_one mats[KERN_EACH_MAX];
        for (int i = 0; i < nh; i++)
            mats[i] = (kern_repacked_one){(const uint8_t *)j->w->packed + (size_t)(h0 + i) * stride,
                                          j->w->dtype,
                                          j->w->ne1,
                                          j->w->ne0,
                                          j->x + (h0 + i) * j->xs,
                                          j->y + (h0 + i) * j->ys};
        kern_matmul_repacked_each(nh, mats, work); /* inside a task: on this thread */
    }
}

/* MLA decode's per-head products are too small to split (16 heads x 64K
 * multiply-adds in DeepSeek-V2-Lite: each ran on one thread while the others
 * waited); the heads themselves are split instead. Repacked, each thread
 * takes one contiguous run of heads, whose slices lie one after the other,
 * so that it reads one stream: with the heads dealt out one at a time, the
 * threads' reads jumped every 37-45 KB and the products read 16-17 GB/s
 * (DeepSeek-V2-Lite Q4_K_M decode, 2 threads: 2.17-2.28 -> 1.90-1.93 ms a
 * token, phase timers, three alternating pairs). */
void op_matmul_heads1(model *m, const mtensor *w, int64_t n_heads, const float *x, int64_t xs,
                      float *y, int64_t ys) {
    if (w->packed && m->head_each_work) {
        const int nt = kvl_pool_threads();
        const int64_t groups = nt < m->n_threads_max ? nt : m->n_threads_max;
        head_group_job j = {m, w, n_heads, groups < n_heads ? groups : n_heads, x, xs, y, ys};
        kvl_pool_run_upto(head_group_task, &j, j.groups, m->n_threads_max);
        return;
    }
    heads_job j = {w, x, y, xs, ys, m->head_work, m->head_work_slot};
    kvl_pool_run_upto(heads_task, &j, n_heads, m->n_threads_max);
}

void op_add_bias(float *y, const mtensor *b, int64_t rows, int64_t n) {
    if (!b->data) return;
    const float *bias = b->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) y[r * n + i] += bias[i];
}

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ggml's YaRN correction dimension: the pair index whose frequency turns
 * n_turns times over the original context. */
static float yarn_corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_turns, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_turns * 2 * (float)M_PI)) / (2 * logf(base));
}

/* The table of one position and layer: cs[i], sn[i] of pair i, as ggml's
 * rope (YaRN's ramp and mscale included) computes them. */
static void rope_compute(const model *m, const layer_weights *L, int32_t pos, float *cs,
                         float *sn) {
    const model_hparams *hp = &m->hp;
    const model_rope_yarn *rs = &hp->rope_yarn;
    const int64_t n_rot = L->n_rot;
    const float *freqs = L->rope_freqs ? m->rope_freqs : NULL;
    float theta_scale = powf(L->rope_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    float corr0 = 0, corr1 = 0, mscale = L->rope_plain ? 1.0f : rs->attn_factor;
    const float fs = L->rope_freq_scale, ext_factor = L->rope_plain ? 0.0f : rs->ext_factor;
    if (ext_factor != 0.0f) { /* YaRN, as ggml's rope_yarn */
        corr0 = floorf(yarn_corr_dim(n_rot, rs->n_ctx_orig, rs->beta_fast, L->rope_base));
        corr1 = ceilf(yarn_corr_dim(n_rot, rs->n_ctx_orig, rs->beta_slow, L->rope_base));
        corr0 = corr0 > 0 ? corr0 : 0;
        corr1 = corr1 < (float)(n_rot - 1) ? corr1 : (float)(n_rot - 1);
        mscale *= 1.0f + 0.1f * logf(1.0f / fs);
    }
    for (int64_t i = 0; i < n_rot / 2; i++) {
        float t = theta;
        if (freqs) t /= freqs[i];
        const float extrap = t;
        t *= fs;
        if (ext_factor != 0.0f) {
            const float y = ((float)i - corr0) / fmaxf(0.001f, corr1 - corr0);
            const float ramp = (1 - fminf(1, fmaxf(0, y))) * ext_factor;
            t = t * (1 - ramp) + extrap * ramp;
        }
        cs[i] = cosf(t) * mscale;
        sn[i] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

void op_rope(model *m, const layer_weights *L, float *vec, int n_heads, int64_t stride,
             int64_t offset, int32_t pos) {
    const model_hparams *hp = &m->hp;
    const int64_t n_rot = L->n_rot;
    rope_table *tab = &m->rope_tab;
    if (!tab->valid || tab->pos != pos || tab->base != L->rope_base ||
        tab->freq_scale != L->rope_freq_scale || tab->plain != L->rope_plain ||
        tab->n_rot != n_rot || tab->freqs != L->rope_freqs) {
        rope_compute(m, L, pos, tab->cs, tab->sn);
        tab->valid = true, tab->plain = L->rope_plain, tab->pos = pos;
        tab->base = L->rope_base, tab->freq_scale = L->rope_freq_scale;
        tab->n_rot = (int32_t)n_rot, tab->freqs = L->rope_freqs;
    }
    const float *cs = tab->cs, *sn = tab->sn;
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

/* SiLU(g) * u through the kernels' SIMD version (kern_silu_mul: its own exp,
 * the same result on every ISA), in slices over the team for prefill sizes. */
typedef struct {
    float *g;
    const float *u;
    int64_t n;
} silu_job;

enum { SILU_SLICE = 1 << 14 };

static void silu_task(void *ctx, int64_t t, int thread) {
    const silu_job *j = ctx;
    const int64_t i = t * SILU_SLICE;
    kern_silu_mul(j->g + i, j->u + i, j->n - i < SILU_SLICE ? j->n - i : SILU_SLICE);
}

void op_silu_mul(float *g, const float *u, int64_t n) {
    if (n >= OPS_PARALLEL_MIN && kvl_pool_threads() > 1) {
        silu_job j = {g, u, n};
        kvl_pool_run(silu_task, &j, (n + SILU_SLICE - 1) / SILU_SLICE);
        return;
    }
    kern_silu_mul(g, u, n);
}

/* GELU, tanh approximation (what ggml_gelu computes). */
/* GELU as llama.cpp computes it (ggml's GGML_GELU_FP16, on in its CPU
 * builds): x rounded to f16, the tanh GELU of that value rounded to f16, read
 * from a table of all 65536 halves; 0 at or below -10 and x itself at or
 * above 10. The goldens are llama.cpp's outputs: an exact GELU differs from
 * them by up to a half's rounding in every FFN activation (gemma4's experts
 * moved a perplexity chunk's mean NLL by 5e-3). The table is also faster than
 * a tanhf per element. */
static kvl_f16 gelu_table[65536];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (uint32_t i = 0; i < 65536; i++) {
        const float x = kvl_f16_to_f32((kvl_f16)i);
        gelu_table[i] =
            kvl_f32_to_f16(0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x))));
    }
}

void op_gelu_mul(float *g, const float *u, int64_t n) {
    pthread_once(&gelu_once, gelu_table_init);
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        const float y = x <= -10.0f  ? 0.0f
                        : x >= 10.0f ? x
                                     : kvl_f16_to_f32(gelu_table[kvl_f32_to_f16(x)]);
        g[i] = u ? y * u[i] : y;
    }
}

/* Attention of one token over its paged KV, for the n_q query heads of one KV
 * head. Positions are processed in chunks of ATTN_CHUNK fixed by absolute
 * position (so the split does not depend on the batch or the thread count):
 * per chunk, scores q.k, their max m, e = exp(s - m), l = sum e, o = sum e v
 * (kernels of src/kernels); then the chunks merge in order. Every float step
 * is fixed by the kernels' canonical orders, so a token's result depends only
 * on its own sequence. */
#define ATTN_CHUNK OP_ATTN_CHUNK

/* Types the attention kernels read in place (and q8_0 where each head is
 * whole blocks, load_run); others (fp8, q8_0 rows spanning heads) are widened
 * to floats ATTN_RUN positions at a time. */
#define ATTN_RUN 64

static bool attn_direct_type(int dtype) {
    return dtype == GGUF_DT_F32 || dtype == GGUF_DT_F16 || dtype == GGUF_DT_BF16;
}

/* Row pointers to the K (or V) slices of kv head kvh for positions [j0, j1)
 * through the block table: into the cache itself for the types the kernels
 * read (*type is then the cache's type), else widened into dst (rows of
 * `width` floats, at most ATTN_RUN of them; *type F32). rowbuf holds one
 * head's slice, or one full row where the heads do not store apart (q8_0
 * blocks spanning heads: kv_block_layout). Returns how many positions it
 * covered. */
static int32_t load_run(const attn_args *a, const kv_seq *s, int32_t j0, int32_t j1, int kvh,
                        bool v, float *dst, float *rowbuf, const void **rows, int *type) {
    const kv_pool_config *c = kv_pool_cfg(a->kv);
    int bs = c->block_size;
    bool from_k = !v || a->v_in_k;
    int dtype = from_k ? c->dtype : kv_pool_dtype_v(a->kv);
    int64_t hstride = from_k ? a->dk : a->dv, width = v ? a->dv : a->dk;
    const kv_block_layout *L = from_k ? kv_pool_k_layout(a->kv) : kv_pool_v_layout(a->kv);
    bool width_whole =
        kv_row_bytes(dtype, width) != 0; /* the first `width` values convert on their own */
    /* F32/F16/BF16 always store heads apart; the block types where a head is whole blocks */
    bool direct = attn_direct_type(dtype) || (kv_dtype_blocked(dtype) && L->split && width_whole);
    size_t head_at = L->split ? (size_t)kvh * L->head_stride : 0;
    if (!direct && j1 - j0 > ATTN_RUN) j1 = j0 + ATTN_RUN;
    for (int32_t j = j0; j < j1;) {
        int32_t blk = s->blocks[j / bs];
        const uint8_t *base =
            from_k ? kv_block_k_const(a->kv, blk, a->slot) : kv_block_v_const(a->kv, blk, a->slot);
        base += head_at;
        int32_t end = (j / bs + 1) * bs < j1 ? (j / bs + 1) * bs : j1;
        const size_t stride = L->row_stride;
        if (direct) { /* a pointer per position, without a division each (that
                       * was 30% of a stories260K decode step at context 300) */
            const uint8_t *row = base + (size_t)(j % bs) * stride;
            for (; j < end; j++, row += stride) rows[j - j0] = row;
            continue;
        }
        for (; j < end; j++) {
            const uint8_t *row = base + (size_t)(j % bs) * stride;
            float *d = dst + (size_t)(j - j0) * width;
            if (L->split && width_whole) {
                kv_row_load(dtype, row, d, width);
            } else if (L->split) {
                kv_row_load(dtype, row, rowbuf, hstride);
                memcpy(d, rowbuf, width * sizeof(float));
            } else {
                kv_row_load(dtype, row, rowbuf, (int64_t)c->n_kv_heads * hstride);
                memcpy(d, rowbuf + kvh * hstride, width * sizeof(float));
            }
            rows[j - j0] = d;
        }
    }
    *type = direct ? dtype : GGUF_DT_F32;
    return j1 - j0;
}

static int64_t attn_max_chunks(int64_t max_ctx) { return max_ctx / ATTN_CHUNK + 2; }

/* Called outside a parallel region, one token's chunks may run on up to this
 * many threads (attention() does that when there are fewer (token, KV head)
 * pairs than threads, e.g. single-sequence decode with one KV head). */
#define ATTN_SPLIT_MAX 4

/* Floats of one thread's working area: a run of widened K or V, one full
 * cache row, a chunk of scores. */
static size_t attn_work_floats(const kv_pool_config *c, int n_q, int64_t w) {
    return (size_t)(ATTN_RUN * w + c->n_kv_heads * w + n_q * ATTN_CHUNK + 16);
}

/* One head's n scores: capped (Gemma 2: softcap * tanh(s / softcap)), then
 * e = exp(s - m) in place; returns m, *l = sum e. */
static float capped_softmax(const attn_args *a, int64_t n, float *row, float *l) {
    if (a->softcap > 0)
        for (int64_t j = 0; j < n; j++) row[j] = a->softcap * tanhf(row[j] / a->softcap);
    return kern_attn_softmax(n, row, l);
}

/* Chunk partial P = (m[n_q], l[n_q], o[n_q][dv]) of positions [lo, hi], for
 * heads h0 .. h0 + nh - 1 of the n_q (each head's values are the same
 * whichever heads are computed with it). */
static void attend_heads(const attn_args *a, const kv_seq *s, int32_t lo, int32_t hi, int kvh,
                         int n_q, int h0, int nh, const float *qr, float *P, float *work) {
    const kv_pool_config *c = kv_pool_cfg(a->kv);
    int64_t dk = a->dk, dv = a->dv, w = dk > dv ? dk : dv;
    float *kbuf = work;                     /* [ATTN_RUN][w] widened K or V of a run */
    float *rowbuf = kbuf + ATTN_RUN * w;    /* one full cache row */
    float *sc = rowbuf + c->n_kv_heads * w; /* [n_q][ATTN_CHUNK] scores, then exp */
    const void *rows[ATTN_CHUNK];
    for (int32_t j0 = lo; j0 <= hi;) { /* scores, a run at a time */
        int type;
        int32_t got = load_run(a, s, j0, hi + 1, kvh, false, kbuf, rowbuf, rows, &type);
        kern_attn_scores(got, dk, nh, qr + (size_t)h0 * dk, (size_t)dk, rows, type, a->scale,
                         sc + (j0 - lo), ATTN_CHUNK);
        j0 += got;
    }
    for (int h = 0; h < nh; h++)
        P[h0 + h] = capped_softmax(a, hi - lo + 1, sc + h * ATTN_CHUNK, &P[n_q + h0 + h]);
    float *o = P + 2 * n_q + (size_t)h0 * dv;
    memset(o, 0, (size_t)nh * dv * sizeof(float));
    for (int32_t j0 = lo; j0 <= hi;) { /* e . V, a run at a time */
        int type;
        int32_t got = load_run(a, s, j0, hi + 1, kvh, true, kbuf, rowbuf, rows, &type);
        kern_attn_pv(got, dv, nh, sc + (j0 - lo), ATTN_CHUNK, rows, type, o, (size_t)dv);
        j0 += got;
    }
}

static void attend_chunk(const attn_args *a, const kv_seq *s, int32_t lo, int32_t hi, int kvh,
                         int n_q, const float *qr, float *P, float *work) {
    attend_heads(a, s, lo, hi, kvh, n_q, 0, n_q, qr, P, work);
}

/* Attention sinks (gpt-oss): one more partial after the n_c chunks at part,
 * m = the head's sink logit, l = 1, o = 0, so that the merge adds exp(sink - M)
 * to the denominator only, as ggml's soft_max with sinks does. Row r of the
 * nr rows is query head kvh * n_q + r % n_q. Returns the partials to merge. */
static int32_t add_sink_chunk(const attn_args *a, int kvh, int n_q, int nr, int64_t dv, float *part,
                              int32_t n_c) {
    if (!a->sinks) return n_c;
    float *P = part + (size_t)n_c * (size_t)nr * (size_t)(dv + 2);
    for (int r = 0; r < nr; r++) {
        P[r] = a->sinks[kvh * n_q + r % n_q];
        P[nr + r] = 1.0f;
    }
    memset(P + 2 * nr, 0, (size_t)nr * (size_t)dv * sizeof(float));
    return n_c + 1;
}

/* op_attend_group's positions [first, pos] of one token, in chunks c0..c1,
 * and where each chunk's partial and working area go. */
typedef struct group_chunks {
    const attn_args *a;
    const kv_seq *s;
    int32_t first, pos, c0, c1;
    int kvh, n_q;
    const float *qr; /* [n_q][dk] */
    float *part;     /* per chunk: m[n_q], l[n_q], o[n_q][dv] (cs floats) */
    size_t cs;
    float *work; /* one working area of wf floats per thread */
    size_t wf;
    int hsplit; /* tasks per chunk, each a share of the heads */
} group_chunks;

/* Share hg of the heads of chunk ci's partial, in the working area of thread th. */
static void attend_group_chunk(const group_chunks *g, int32_t ci, int hg, int th) {
    const int32_t lo = ci * ATTN_CHUNK > g->first ? ci * ATTN_CHUNK : g->first;
    const int32_t hi = (ci + 1) * ATTN_CHUNK - 1 < g->pos ? (ci + 1) * ATTN_CHUNK - 1 : g->pos;
    const int h0 = g->n_q * hg / g->hsplit, h1 = g->n_q * (hg + 1) / g->hsplit;
    attend_heads(g->a, g->s, lo, hi, g->kvh, g->n_q, h0, h1 - h0, g->qr,
                 g->part + (size_t)(ci - g->c0) * g->cs, g->work + (size_t)th * g->wf);
}

static void group_chunk_task(void *ctx, int64_t t, int thread) {
    const group_chunks *g = ctx;
    attend_group_chunk(g, g->c0 + (int32_t)(t / g->hsplit), (int)(t % g->hsplit), thread);
}

void op_attend_group(const attn_args *a, const kv_seq *s, int32_t pos, int kvh, int n_q,
                     const float *q, int64_t q_stride, float *out, int64_t out_stride,
                     float *scratch, int max_threads) {
    const kv_pool_config *c = kv_pool_cfg(a->kv);
    int64_t dk = a->dk, dv = a->dv, w = dk > dv ? dk : dv;
    const size_t cs = (size_t)n_q * (size_t)(dv + 2);
    const kv_attn rule = {.window = a->window, .chunk = a->chunk};
    int32_t first = (int32_t)kv_attn_first(rule, pos);
    int32_t c0 = first / ATTN_CHUNK, c1 = pos / ATTN_CHUNK;
    float *qr = scratch;         /* [n_q][dk] queries as the cache's dot type sees them */
    float *part = qr + n_q * dk; /* per chunk: m[n_q], l[n_q], o[n_q][dv] */
    /* up to ATTN_SPLIT_MAX working areas, after the chunks and a sink's partial */
    float *work = part + (size_t)(c1 - c0 + 2) * cs;
    group_chunks g = {.a = a,
                      .s = s,
                      .first = first,
                      .pos = pos,
                      .c0 = c0,
                      .c1 = c1,
                      .kvh = kvh,
                      .n_q = n_q,
                      .qr = qr,
                      .part = part,
                      .cs = cs,
                      .work = work,
                      .wf = attn_work_floats(c, n_q, w),
                      .hsplit = 1};
    /* q as ggml's mul_mat (and flash attention) takes it against the cache's K
     * type: in its vec_dot_type, so the kernels multiply the same values */
    for (int h = 0; h < n_q; h++) kv_query_as_k(c->dtype, q + h * q_stride, qr + h * dk, dk);
    /* Chunks are fixed by position and merge in order, so how they are
     * scheduled does not change the result. */
    int nth = max_threads;
    nth = nth < ATTN_SPLIT_MAX ? nth : ATTN_SPLIT_MAX;
    nth = nth < c1 - c0 + 1 ? nth : c1 - c0 + 1;
    /* Alone: on this thread, without waking the pool. */
    if (nth <= 1) {
        for (int32_t ci = c0; ci <= c1; ci++) attend_group_chunk(&g, ci, 0, 0);
    } else {
        /* Many query heads over few chunks (MLA decode: 16 heads, 577
         * positions = chunks of 256, 256 and 65): each chunk in two tasks of
         * half the heads, so that the threads finish together; only where the
         * kernels read the cache in place (a widened run would be widened
         * twice). */
        const kv_pool_config *kc = kv_pool_cfg(a->kv);
        const int kt = a->v_in_k ? kc->dtype : kc->dtype == kv_pool_dtype_v(a->kv) ? kc->dtype : -1;
        if (n_q >= 8 && kt >= 0 && attn_direct_type(kt)) g.hsplit = 2;
        kvl_pool_run_upto(group_chunk_task, (void *)&g, (int64_t)(c1 - c0 + 1) * g.hsplit, nth);
    }
    kern_attn_merge(add_sink_chunk(a, kvh, n_q, n_q, dv, part, c1 - c0 + 1), n_q, dv, part, out,
                    (size_t)out_stride);
}

/* The chunk holding the run's own positions, [lo, pos0 + ntok - 1]: token t
 * sees only [lo, pos0 + t], so its scores, softmax and e.V cover its own n_t
 * positions, exactly as attend_chunk would for it alone; the K and V rows are
 * fetched once per run of positions for all tokens. */
static void attend_diagonal(const attn_args *a, const kv_seq *s, int32_t lo, int32_t pos0, int ntok,
                            int kvh, int n_q, const float *qr, float *P, float *work) {
    const kv_pool_config *c = kv_pool_cfg(a->kv);
    const int64_t dk = a->dk, dv = a->dv, w = dk > dv ? dk : dv;
    const int NQ = ntok * n_q;
    const int32_t hi = pos0 + ntok - 1;
    float *kbuf = work, *rowbuf = kbuf + ATTN_RUN * w, *sc = rowbuf + c->n_kv_heads * w;
    const void *rows[ATTN_CHUNK];
    for (int32_t j0 = lo; j0 <= hi;) {
        int type;
        const int32_t got = load_run(a, s, j0, hi + 1, kvh, false, kbuf, rowbuf, rows, &type);
        /* positions up to pos0, which every token sees: all NQ rows at once
         * (each K row widened once for them all), then each token's own */
        const int32_t shared = pos0 + 1 - j0 < got ? pos0 + 1 - j0 : got;
        if (shared > 0)
            kern_attn_scores(shared, dk, NQ, qr, (size_t)dk, rows, type, a->scale, sc + (j0 - lo),
                             ATTN_CHUNK);
        const int32_t s0 = shared > 0 ? shared : 0;
        for (int t = 1; t < ntok; t++) {
            const int32_t n_t = pos0 + t + 1 - j0; /* positions of this run token t sees */
            const int32_t e = n_t < got ? n_t : got;
            if (e > s0)
                kern_attn_scores(e - s0, dk, n_q, qr + (size_t)t * n_q * dk, (size_t)dk, rows + s0,
                                 type, a->scale, sc + (size_t)t * n_q * ATTN_CHUNK + (j0 - lo) + s0,
                                 ATTN_CHUNK);
        }
        j0 += got;
    }
    for (int t = 0; t < ntok; t++) {
        const int64_t n = pos0 + t - lo + 1;
        for (int h = t * n_q; h < (t + 1) * n_q; h++)
            P[h] = capped_softmax(a, n, sc + (size_t)h * ATTN_CHUNK, &P[NQ + h]);
    }
    float *o = P + 2 * NQ;
    memset(o, 0, (size_t)NQ * dv * sizeof(float));
    for (int32_t j0 = lo; j0 <= hi;) {
        int type;
        const int32_t got = load_run(a, s, j0, hi + 1, kvh, true, kbuf, rowbuf, rows, &type);
        /* the same split: o's sums take the positions in the same order */
        const int32_t shared = pos0 + 1 - j0 < got ? pos0 + 1 - j0 : got;
        if (shared > 0)
            kern_attn_pv(shared, dv, NQ, sc + (j0 - lo), ATTN_CHUNK, rows, type, o, (size_t)dv);
        const int32_t s0 = shared > 0 ? shared : 0;
        for (int t = 1; t < ntok; t++) {
            const int32_t n_t = pos0 + t + 1 - j0;
            const int32_t e = n_t < got ? n_t : got;
            if (e > s0)
                kern_attn_pv(e - s0, dv, n_q, sc + (size_t)t * n_q * ATTN_CHUNK + (j0 - lo) + s0,
                             ATTN_CHUNK, rows + s0, type, o + (size_t)t * n_q * dv, (size_t)dv);
        }
        j0 += got;
    }
}

/* Partials of a run: per chunk [m: NQ][l: NQ][o: NQ][dv], then the merged
 * outputs [NQ][dv]. A run keeps them within this many bytes. */
#define ATTN_RUN_PART_BYTES (2u << 20)
#define ATTN_RUN_MAX_TOKENS 32

int op_attend_run_max_tokens(int n_q, int64_t dv, int64_t max_ctx) {
    const size_t per_token = (size_t)attn_max_chunks(max_ctx) * n_q * (dv + 2) * sizeof(float);
    const size_t t = ATTN_RUN_PART_BYTES / (per_token ? per_token : 1);
    return t < 1 ? 1 : t > ATTN_RUN_MAX_TOKENS ? ATTN_RUN_MAX_TOKENS : (int)t;
}

void op_attend_run(const attn_args *a, const kv_seq *s, int32_t pos0, int ntok, int kvh, int n_q,
                   const float *q, int64_t q_tok_stride, float *out, int64_t out_tok_stride,
                   float *scratch) {
    const kv_pool_config *c = kv_pool_cfg(a->kv);
    const int64_t dk = a->dk, dv = a->dv;
    const int NQ = ntok * n_q;
    const size_t cs = (size_t)NQ * (size_t)(dv + 2);
    const int32_t c1 = pos0 / ATTN_CHUNK; /* every token's last chunk */
    /* the first: 0, or where the attention chunk of all the run's tokens starts */
    const int32_t c0 = (int32_t)(kv_chunk_first(pos0, a->chunk) / ATTN_CHUNK);
    float *qr = scratch;                /* [NQ][dk]: token t's heads from row t * n_q */
    float *part = qr + (size_t)NQ * dk; /* per chunk, from c0 */
    /* the merged outputs, after the chunks and a sink's partial */
    float *merged = part + (size_t)(c1 - c0 + 2) * cs;
    float *work = merged + (size_t)NQ * dv;
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < n_q; h++)
            kv_query_as_k(c->dtype, q + t * q_tok_stride + h * dk, qr + ((size_t)t * n_q + h) * dk,
                          dk); /* in the K type's vec_dot_type, as above */
    /* every token sees the whole of the earlier chunks: all NQ rows at once */
    for (int32_t ci = c0; ci < c1; ci++)
        attend_chunk(a, s, ci * ATTN_CHUNK, ci * ATTN_CHUNK + ATTN_CHUNK - 1, kvh, NQ, qr,
                     part + (size_t)(ci - c0) * cs, work);
    attend_diagonal(a, s, c1 * ATTN_CHUNK, pos0, ntok, kvh, n_q, qr, part + (size_t)(c1 - c0) * cs,
                    work);
    kern_attn_merge(add_sink_chunk(a, kvh, n_q, NQ, dv, part, c1 - c0 + 1), NQ, dv, part, merged,
                    (size_t)dv);
    for (int t = 0; t < ntok; t++)
        memcpy(out + t * out_tok_stride, merged + (size_t)t * n_q * dv,
               (size_t)n_q * dv * sizeof(float));
}

size_t op_attend_scratch_floats(const kv_pool_config *c, int n_q, int64_t dk, int64_t dv,
                                int64_t max_ctx) {
    int64_t w = dk > dv ? dk : dv;
    const size_t one = (size_t)(n_q * dk + attn_max_chunks(max_ctx) * n_q * (dv + 2)) +
                       ATTN_SPLIT_MAX * attn_work_floats(c, n_q, w) + 64;
    const int T = op_attend_run_max_tokens(n_q, dv, max_ctx), NQ = T * n_q;
    const size_t run = (size_t)NQ * dk + (size_t)attn_max_chunks(max_ctx) * NQ * (dv + 2) +
                       (size_t)NQ * dv + attn_work_floats(c, NQ, w) + 64;
    return run > one ? run : one;
}
