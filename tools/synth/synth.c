/* synth (tools/synth): random-weight GGUF files of real model shapes. See synth.h.
 *
 * The file goes through the library's GGUF writer in its streaming mode:
 * metadata and tensor descriptors first, then each tensor generated,
 * quantized and appended a slice at a time, so an 8B F16 model is written in
 * well under 1 GB. The finished file is re-opened with the strict reader as a
 * check. */
#define _GNU_SOURCE
#include "synth.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gguf.h"
#include "kernels.h"

enum { ALIGN = 32, CHUNK_FLOATS = 8 << 20 /* floats generated per slice: 32 MB */ };

/* ------------------------------------------------------------- shapes -- */

/* A small deepseek2 for tests, with and without the low-rank q. */
#define TINY_DEEPSEEK2_FIELDS                                                                      \
    "deepseek2", 256, 3, 4, 1, 0, 768, 1024, 2048, 10000.f, 1e-6f, false, false,                   \
        .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_shared_exp = 1,                     \
        .n_layer_dense_lead = 1, .kv_lora_rank = 256, .qk_nope = 64, .qk_rope = 32,                \
        .v_head_dim = 64, .yarn_factor = 4.f, .yarn_log_mul = 0.0707f, .yarn_orig_ctx = 512

/* Hyperparameters from the models' config.json. context_length is written
 * as 8192 for all: kvllm sizes scratch from it, and no benchmark goes further. */
static const synth_shape SHAPES[] = {
    /* name            arch     E     L   H   Hkv hd   FF     vocab   ctx   rope   eps   tied bias */
    {"tiny", "llama", 256, 2, 4, 2, 64, 768, 1024, 2048, 10000.f, 1e-5f, true, false,
     .qk_norm = false},
    {"tiny-qwen2", "qwen2", 256, 2, 4, 1, 64, 768, 1024, 2048, 1e6f, 1e-6f, true, true,
     .qk_norm = false},
    {"llama-3.2-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 8192, 500000.f, 1e-5f, true, false,
     .qk_norm = false},
    {"llama-3.2-3b", "llama", 3072, 28, 24, 8, 128, 8192, 128256, 8192, 500000.f, 1e-5f, true,
     false, .qk_norm = false},
    {"llama-3-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 8192, 500000.f, 1e-5f, false,
     false, .qk_norm = false},
    {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 8192, 1e6f, 1e-6f, true, true,
     .qk_norm = false},
    {"qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 128, 8960, 151936, 8192, 1e6f, 1e-6f, true, true,
     .qk_norm = false},
    /* Mixture of experts: Qwen/Qwen3-30B-A3B and deepseek-ai/DeepSeek-V2-Lite */
    {"qwen3-30b-a3b", "qwen3moe", 2048, 48, 32, 4, 128, 6144, 151936, 8192, 1e6f, 1e-6f, false,
     false, .qk_norm = true, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
    {"deepseek-v2-lite",
     "deepseek2",
     2048,
     27,
     16,
     1,
     0,
     10944,
     102400,
     8192,
     10000.f,
     1e-6f,
     false,
     false,
     .n_expert = 64,
     .n_expert_used = 6,
     .n_ff_exp = 1408,
     .n_shared_exp = 2,
     .n_layer_dense_lead = 1,
     .kv_lora_rank = 512,
     .qk_nope = 128,
     .qk_rope = 64,
     .v_head_dim = 128,
     .yarn_factor = 40.f,
     .yarn_log_mul = 0.0707f,
     .yarn_orig_ctx = 4096},
    /* openai/gpt-oss-20b (config.json: hidden 2880, 24 layers, 64 q / 8 kv heads of
     * head_dim 64, 32 local experts, 4 per token, intermediate 2880, vocab 201088,
     * sliding_window 128 on alternate layers, rope_theta 150000, YaRN factor 32 over
     * 4096, rms_norm_eps 1e-5); llama-quantize's MXFP4_MOE mix: 20.91 B
     * parameters, 11.27 GiB as llama-bench reports ggml-org's file */
    {"gpt-oss-20b",
     "gpt-oss",
     2880,
     24,
     64,
     8,
     64,
     2880,
     201088,
     8192,
     150000.f,
     1e-5f,
     false,
     true,
     .n_expert = 32,
     .n_expert_used = 4,
     .n_ff_exp = 2880,
     .yarn_factor = 32.f,
     .yarn_orig_ctx = 4096,
     .gpt_oss = true,
     .n_swa = 128},
    /* small ones of the same layouts, for tests */
    {"tiny-qwen3moe", "qwen3moe", 256, 2, 4, 2, 64, 768, 1024, 2048, 1e6f, 1e-6f, false, false,
     .qk_norm = true, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256},
    {"tiny-deepseek2", TINY_DEEPSEEK2_FIELDS},
    /* the same with DeepSeek-V2 / V3's low-rank q (attn_q_a, attn_q_b) */
    {"tiny-deepseek2-qlora", TINY_DEEPSEEK2_FIELDS, .q_lora_rank = 256},
    {"tiny-gpt-oss",
     "gpt-oss",
     256,
     2,
     4,
     2,
     64,
     256,
     1024,
     2048,
     150000.f,
     1e-5f,
     false,
     true,
     .n_expert = 8,
     .n_expert_used = 2,
     .n_ff_exp = 256,
     .yarn_factor = 32.f,
     .yarn_orig_ctx = 4096,
     .gpt_oss = true,
     .n_swa = 128},
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

const synth_shape *synth_shape_at(int i) { return i >= 0 && i < N_SHAPES ? &SHAPES[i] : NULL; }

const synth_shape *synth_shape_find(const char *name) {
    for (int i = 0; i < N_SHAPES; i++)
        if (strcasecmp(SHAPES[i].name, name) == 0) return &SHAPES[i];
    return NULL;
}

/* The mixes synth writes; their names are llama-quantize's (gguf_file_type_name). */
static const synth_ftype FTYPES[] = {SYNTH_F16,    SYNTH_Q8_0,   SYNTH_Q4_0,    SYNTH_Q4_1,
                                     SYNTH_Q5_0,   SYNTH_Q5_1,   SYNTH_IQ4_NL,  SYNTH_Q4_K_M,
                                     SYNTH_Q4_K_S, SYNTH_Q5_K_S, SYNTH_Q5_K_M,  SYNTH_Q3_K_M,
                                     SYNTH_Q2_K,   SYNTH_IQ4_XS, SYNTH_IQ2_XXS, SYNTH_MXFP4_MOE};

bool synth_ftype_parse(const char *name, synth_ftype *out) {
    const int id = gguf_file_type_parse(name);
    for (size_t i = 0; id >= 0 && i < sizeof FTYPES / sizeof FTYPES[0]; i++)
        if ((int)FTYPES[i] == id) {
            *out = FTYPES[i];
            return true;
        }
    return false;
}

const char *synth_ftype_name(synth_ftype t) {
    const char *name = gguf_file_type_name((uint32_t)t);
    return name ? name : "unknown";
}

/* ------------------------------------------------------- tensor types -- */

/* llama.cpp's use_more_bits: the first and last eighth of the layers and
 * every third one between keep more bits in Q4_K_M. */
static bool use_more_bits(int il, int n) {
    return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

/* The type llama-quantize falls back to when a row does not fit the type's
 * block (llama_tensor_get_type): Q2_K, Q3_K, IQ2_XXS, IQ4_XS -> IQ4_NL, Q4_K -> Q5_0,
 * Q5_K -> Q5_1, Q6_K -> Q8_0 (the only block types of 256 synth writes). */
static int fit_row(int dtype, int64_t ne0) {
    int be = 1;
    gguf_dtype_geometry(dtype, &be, NULL);
    if (ne0 % be == 0) return dtype;
    switch (dtype) {
    case GGUF_DT_Q2_K:
    case GGUF_DT_Q3_K:
    case GGUF_DT_IQ2_XXS:
    case GGUF_DT_IQ4_XS: return GGUF_DT_IQ4_NL;
    case GGUF_DT_Q4_K: return GGUF_DT_Q5_0;
    case GGUF_DT_Q5_K: return GGUF_DT_Q5_1;
    default: return GGUF_DT_Q8_0; /* Q6_K */
    }
}

/* llama.cpp's llama_tensor_get_type for the K-quant and IQ4_XS mixes of a
 * dense non-Falcon model: the base type, raised for attn_v, ffn_down and
 * attn_output as each mix does (il: the layer). */
static bool moe_layer(const synth_shape *s, int il) {
    return s->n_expert > 0 && il >= s->n_layer_dense_lead;
}

/* llama-quantize's layer count for the ffn_down rules: the number of tensors
 * named ffn_down (a MoE layer has ffn_down_exps and ffn_down_shexp), while
 * the layer index is the block's. */
static int n_ffn_down(const synth_shape *s) {
    int n = 0;
    for (int il = 0; il < s->n_layer; il++) n += moe_layer(s, il) ? 1 + (s->n_shared_exp > 0) : 1;
    return n;
}

static int kmix_dtype(const synth_shape *s, synth_ftype t, const char *role, int il, int base) {
    const int n = (int)s->n_layer;
    const bool gqa4 = s->n_head / s->n_head_kv >= 4;
    if (t == SYNTH_IQ2_XXS) { /* llama_tensor_get_type's branch of the IQ1 / IQ2 mixes */
        if (strcmp(role, "attn_v.weight") == 0)
            return gqa4 || s->n_expert >= 4 ? GGUF_DT_Q4_K : GGUF_DT_Q2_K;
        if (s->n_expert == 8 && strcmp(role, "attn_k.weight") == 0) return GGUF_DT_Q4_K;
        if (strncmp(role, "ffn_down", 8) == 0) return il < n_ffn_down(s) / 8 ? GGUF_DT_Q2_K : base;
        if (s->n_expert == 8 && strcmp(role, "attn_output.weight") == 0) return GGUF_DT_Q5_K;
        return base;
    }
    if (strcmp(role, "attn_v.weight") == 0) {
        switch (t) {
        case SYNTH_Q2_K: return gqa4 ? GGUF_DT_Q4_K : GGUF_DT_Q3_K;
        case SYNTH_Q3_K_M: return il < 2 ? GGUF_DT_Q5_K : GGUF_DT_Q4_K;
        case SYNTH_IQ4_XS: return gqa4 ? GGUF_DT_Q5_K : base;
        case SYNTH_Q4_K_M:
        case SYNTH_Q5_K_M: return use_more_bits(il, n) ? GGUF_DT_Q6_K : base;
        case SYNTH_Q4_K_S: return il < 4 ? GGUF_DT_Q5_K : base;
        default: return base;
        }
    }
    if (strncmp(role, "ffn_down", 8) == 0) {
        const int n = n_ffn_down(s);
        switch (t) {
        case SYNTH_Q2_K: return GGUF_DT_Q3_K;
        case SYNTH_Q3_K_M: return il < n / 16 ? GGUF_DT_Q5_K : GGUF_DT_Q4_K;
        case SYNTH_Q4_K_M:
        case SYNTH_Q5_K_M: return use_more_bits(il, n) ? GGUF_DT_Q6_K : base;
        case SYNTH_IQ4_XS:
        case SYNTH_Q4_K_S: return il < n / 8 ? GGUF_DT_Q5_K : base;
        default: return base;
        }
    }
    if (strcmp(role, "attn_output.weight") == 0) {
        if (t == SYNTH_Q2_K) return GGUF_DT_Q3_K;
        if (t == SYNTH_Q3_K_M) return GGUF_DT_Q4_K;
    }
    return base;
}

/* The matrices' type of a mix without K-quants (the output keeps Q6_K). */
static int legacy_base(synth_ftype t) {
    switch (t) {
    case SYNTH_Q4_0: return GGUF_DT_Q4_0;
    case SYNTH_Q4_1: return GGUF_DT_Q4_1;
    case SYNTH_Q5_0: return GGUF_DT_Q5_0;
    case SYNTH_Q5_1: return GGUF_DT_Q5_1;
    case SYNTH_IQ4_NL: return GGUF_DT_IQ4_NL;
    default: return -1;
    }
}

static int64_t role_ne0(const synth_shape *s, const char *role) {
    if (strcmp(role, "attn_output.weight") == 0)
        return s->n_head * (s->kv_lora_rank ? s->v_head_dim : s->head_dim);
    if (strcmp(role, "ffn_down.weight") == 0) return s->n_ff;
    if (strcmp(role, "ffn_down_exps.weight") == 0) return s->n_ff_exp;
    if (strcmp(role, "ffn_down_shexp.weight") == 0) return s->n_ff_exp * s->n_shared_exp;
    if (strcmp(role, "attn_k_b.weight") == 0) return s->qk_nope;
    if (strcmp(role, "attn_v_b.weight") == 0) return s->kv_lora_rank;
    if (strcmp(role, "attn_q_b.weight") == 0) return s->q_lora_rank;
    return s->n_embd;
}

int synth_tensor_dtype(const synth_shape *s, synth_ftype t, const char *role, int il) {
    if (t == SYNTH_F16) return GGUF_DT_F16;
    if (t == SYNTH_Q8_0) return GGUF_DT_Q8_0;
    if (t == SYNTH_MXFP4_MOE) /* llama-quantize: 3-D (expert) tensors MXFP4, all else Q8_0 */
        return strstr(role, "_exps.weight") ? GGUF_DT_MXFP4 : GGUF_DT_Q8_0;
    bool is_output = strcmp(role, "output.weight") == 0 ||
                     (s->tied_output && strcmp(role, "token_embd.weight") == 0);
    const int legacy = legacy_base(t);
    const int base = legacy >= 0                              ? legacy
                     : t == SYNTH_Q2_K                        ? GGUF_DT_Q2_K
                     : t == SYNTH_Q3_K_M                      ? GGUF_DT_Q3_K
                     : t == SYNTH_Q5_K_S || t == SYNTH_Q5_K_M ? GGUF_DT_Q5_K
                     : t == SYNTH_IQ4_XS                      ? GGUF_DT_IQ4_XS
                     : t == SYNTH_IQ2_XXS                     ? GGUF_DT_IQ2_XXS
                                                              : GGUF_DT_Q4_K;
    int dt = base;
    if (is_output) {
        dt = t == SYNTH_IQ2_XXS ? GGUF_DT_Q5_K : GGUF_DT_Q6_K;
    } else if (t == SYNTH_IQ2_XXS && strcmp(role, "token_embd.weight") == 0) {
        dt = GGUF_DT_Q2_K;
    } else if (legacy < 0 && il >= 0) {
        dt = kmix_dtype(s, t, role, il, base);
    } else if (t == SYNTH_IQ4_NL && il >= 0 && strcmp(role, "attn_v.weight") == 0 &&
               s->n_head >= 4 * s->n_head_kv) {
        dt = GGUF_DT_Q5_K; /* llama.cpp: IQ4_NL with n_gqa >= 4 */
    }
    return fit_row(dt, role_ne0(s, role));
}

/* ---------------------------------------------------------- the plan -- */

typedef enum { FILL_RANDOM, FILL_ONES } fill_kind;

typedef struct tplan {
    char name[64];
    int dtype, n_dims;
    int64_t ne[3];
    fill_kind fill;
    uint64_t offset, nbytes; /* within the data section */
} tplan;

typedef struct plan {
    tplan *t;
    int n, cap;
    uint64_t data_bytes; /* padded */
} plan;

static uint64_t pad_to(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* ne1 0: a vector; ne2 > 1: a stack of ne2 matrices (experts, heads). */
static bool plan_add3(plan *p, const char *name, int dtype, int64_t ne0, int64_t ne1, int64_t ne2,
                      fill_kind fill) {
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 64;
        tplan *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t) return false;
        p->t = t;
        p->cap = cap;
    }
    tplan *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->n_dims = ne2 > 1 ? 3 : ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->ne[2] = ne2 > 1 ? ne2 : 1;
    t->fill = fill;
    t->nbytes = kern_row_bytes(dtype, ne0) * (uint64_t)t->ne[1] * (uint64_t)t->ne[2];
    t->offset = p->data_bytes;
    p->data_bytes += pad_to(t->nbytes);
    return true;
}

static bool plan_add(plan *p, const char *name, int dtype, int64_t ne0, int64_t ne1,
                     fill_kind fill) {
    return plan_add3(p, name, dtype, ne0, ne1, 1, fill);
}

static bool plan_stack(plan *p, const synth_shape *s, synth_ftype ft, int il, const char *role,
                       int64_t ne1, int64_t ne2) {
    char name[64];
    if (il >= 0) snprintf(name, sizeof name, "blk.%d.%s", il, role);
    else snprintf(name, sizeof name, "%s", role);
    return plan_add3(p, name, synth_tensor_dtype(s, ft, role, il), role_ne0(s, role), ne1, ne2,
                     FILL_RANDOM);
}

static bool plan_matrix(plan *p, const synth_shape *s, synth_ftype ft, int il, const char *role,
                        int64_t ne1) {
    return plan_stack(p, s, ft, il, role, ne1, 1);
}

static bool plan_vector(plan *p, int il, const char *role, int64_t n, fill_kind fill) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s", il, role);
    return plan_add(p, name, GGUF_DT_F32, n, 0, fill);
}

/* MLA attention as llama.cpp's current converter writes it: q (or its
 * low-rank pair q_a, q_b with the norm between), the joint latent + rope
 * projection and its norm, the per-head up-projections k_b and v_b, the output. */
static bool plan_attn_mla(plan *p, const synth_shape *s, synth_ftype ft, int il) {
    const int64_t H = s->n_head, r = s->kv_lora_rank, qd = H * (s->qk_nope + s->qk_rope);
    const bool q = s->q_lora_rank ? plan_matrix(p, s, ft, il, "attn_q_a.weight", s->q_lora_rank) &&
                                        plan_vector(p, il, "attn_q_a_norm.weight", s->q_lora_rank,
                                                    FILL_ONES) &&
                                        plan_matrix(p, s, ft, il, "attn_q_b.weight", qd)
                                  : plan_matrix(p, s, ft, il, "attn_q.weight", qd);
    return q && plan_matrix(p, s, ft, il, "attn_kv_a_mqa.weight", r + s->qk_rope) &&
           plan_vector(p, il, "attn_kv_a_norm.weight", r, FILL_ONES) &&
           plan_stack(p, s, ft, il, "attn_k_b.weight", r, H) &&
           plan_stack(p, s, ft, il, "attn_v_b.weight", s->v_head_dim, H);
}

static bool plan_attn(plan *p, const synth_shape *s, synth_ftype ft, int il) {
    int64_t qd = s->n_head * s->head_dim, kvd = s->n_head_kv * s->head_dim;
    bool ok = plan_matrix(p, s, ft, il, "attn_q.weight", qd) &&
              plan_matrix(p, s, ft, il, "attn_k.weight", kvd) &&
              plan_matrix(p, s, ft, il, "attn_v.weight", kvd);
    if (ok && s->qkv_bias)
        ok = plan_vector(p, il, "attn_q.bias", qd, FILL_RANDOM) &&
             plan_vector(p, il, "attn_k.bias", kvd, FILL_RANDOM) &&
             plan_vector(p, il, "attn_v.bias", kvd, FILL_RANDOM);
    if (ok && s->qk_norm)
        ok = plan_vector(p, il, "attn_q_norm.weight", s->head_dim, FILL_ONES) &&
             plan_vector(p, il, "attn_k_norm.weight", s->head_dim, FILL_ONES);
    if (ok && s->gpt_oss) /* one sink logit per q head */
        ok = plan_vector(p, il, "attn_sinks.weight", s->n_head, FILL_RANDOM);
    return ok;
}

/* A 2-D F32 tensor of layer il (gpt-oss's expert biases, one row per expert). */
static bool plan_f32_2d(plan *p, int il, const char *role, int64_t ne0, int64_t ne1) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s", il, role);
    return plan_add(p, name, GGUF_DT_F32, ne0, ne1, FILL_RANDOM);
}

/* The router stays F32 (llama-quantize never quantizes ffn_gate_inp); the
 * experts are 3-D stacks typed like their dense counterparts. */
static bool plan_ffn_moe(plan *p, const synth_shape *s, synth_ftype ft, int il) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
    const int64_t E = s->n_embd, NE = s->n_expert, F = s->n_ff_exp,
                  SH = s->n_ff_exp * s->n_shared_exp;
    bool ok = plan_add(p, name, GGUF_DT_F32, E, NE, FILL_RANDOM) &&
              (!s->gpt_oss || plan_vector(p, il, "ffn_gate_inp.bias", NE, FILL_RANDOM)) &&
              plan_stack(p, s, ft, il, "ffn_gate_exps.weight", F, NE) &&
              plan_stack(p, s, ft, il, "ffn_up_exps.weight", F, NE) &&
              plan_stack(p, s, ft, il, "ffn_down_exps.weight", E, NE);
    if (ok && s->gpt_oss)
        ok = plan_f32_2d(p, il, "ffn_gate_exps.bias", F, NE) &&
             plan_f32_2d(p, il, "ffn_up_exps.bias", F, NE) &&
             plan_f32_2d(p, il, "ffn_down_exps.bias", E, NE);
    if (ok && SH)
        ok = plan_matrix(p, s, ft, il, "ffn_gate_shexp.weight", SH) &&
             plan_matrix(p, s, ft, il, "ffn_up_shexp.weight", SH) &&
             plan_matrix(p, s, ft, il, "ffn_down_shexp.weight", E);
    return ok;
}

/* One layer, in the order llama.cpp's converter writes them. */
static bool plan_layer(plan *p, const synth_shape *s, synth_ftype ft, int il) {
    bool ok = plan_vector(p, il, "attn_norm.weight", s->n_embd, FILL_ONES) &&
              (s->kv_lora_rank ? plan_attn_mla(p, s, ft, il) : plan_attn(p, s, ft, il));
    ok = ok && plan_matrix(p, s, ft, il, "attn_output.weight", s->n_embd) &&
         (!s->gpt_oss || plan_vector(p, il, "attn_output.bias", s->n_embd, FILL_RANDOM)) &&
         plan_vector(p, il, s->gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight",
                     s->n_embd, FILL_ONES);
    if (moe_layer(s, il)) return ok && plan_ffn_moe(p, s, ft, il);
    return ok && plan_matrix(p, s, ft, il, "ffn_gate.weight", s->n_ff) &&
           plan_matrix(p, s, ft, il, "ffn_up.weight", s->n_ff) &&
           plan_matrix(p, s, ft, il, "ffn_down.weight", s->n_embd);
}

static bool plan_build(plan *p, const synth_shape *s, synth_ftype ft) {
    memset(p, 0, sizeof *p);
    bool ok = plan_matrix(p, s, ft, -1, "token_embd.weight", s->n_vocab);
    for (int il = 0; ok && il < s->n_layer; il++) ok = plan_layer(p, s, ft, il);
    ok = ok && plan_add(p, "output_norm.weight", GGUF_DT_F32, s->n_embd, 0, FILL_ONES);
    if (ok && !s->tied_output) ok = plan_matrix(p, s, ft, -1, "output.weight", s->n_vocab);
    return ok;
}

/* ---------------------------------------------------------- metadata -- */

/* "llama.block_count" style keys. */
static bool kv_arch_u32(gguf_writer *w, const char *arch, const char *suffix, int64_t v) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_writer_set_u32(w, key, (uint32_t)v);
}
static bool kv_arch_f32(gguf_writer *w, const char *arch, const char *suffix, float v) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_writer_set_f32(w, key, v);
}

/* --------------------------------------------------------- vocabulary -- */

/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves,
 * the others are moved to U+0100 and up, in byte order. */
static uint32_t byte_cp(int b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (uint32_t)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
    return 256u + (uint32_t)n;
}

/* Byte-level form of plain text (every codepoint here is below U+0800). */
static void byte_level(const char *text, char *out) {
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        uint32_t cp = byte_cp(*p);
        if (cp < 0x80) {
            *out++ = (char)cp;
        } else {
            *out++ = (char)(0xC0 | (cp >> 6));
            *out++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *out = 0;
}

/* A few English merges so that the BPE path is exercised; each half is a
 * byte or an earlier merge's result. */
static const char *const MERGES[][2] = {
    {" ", "t"}, {"h", "e"},  {"i", "n"}, {"r", "e"}, {"o", "n"}, {" t", "he"}, {"e", "r"},
    {" ", "a"}, {" ", "s"},  {"a", "t"}, {"e", "n"}, {" ", "w"}, {"o", "r"},   {"i", "t"},
    {"e", "s"}, {" ", "o"},  {"n", "d"}, {"i", "s"}, {"e", "d"}, {" ", "c"},   {" a", "nd"},
    {"n", "g"}, {"i", "ng"}, {" ", "b"}, {"o", "u"}, {" ", "f"}, {" o", "f"},  {"a", "r"},
};
#define N_MERGES ((int)(sizeof MERGES / sizeof MERGES[0]))
#define BOS_TEXT "<|begin_of_text|>"
#define EOS_TEXT "<|end_of_text|>"

/* tokenizer.ggml.*: 256 byte tokens, the merges' results, "<tN>" fillers up
 * to the shape's vocabulary size, then BOS and EOS (control tokens). */
static bool add_vocab(gguf_writer *w, int64_t n_vocab) {
    int64_t n_fill = n_vocab - 256 - N_MERGES - 2;
    char buf[64], a[32], b[32];
    char **toks = calloc((size_t)n_vocab, sizeof *toks);
    int32_t *types = malloc((size_t)n_vocab * sizeof *types);
    char *merges[N_MERGES] = {0};
    bool ok = toks && types;
    int64_t k = 0;
    for (int c = 0; ok && c < 256; c++) {
        char t[2] = {(char)c, 0};
        byte_level(c ? t : "", buf);
        if (!c) { /* NUL cannot go through a C string: its codepoint is U+0100 */
            buf[0] = (char)0xC4;
            buf[1] = (char)0x80;
            buf[2] = 0;
        }
        ok = (toks[k++] = strdup(buf)) != NULL;
    }
    for (int i = 0; ok && i < N_MERGES; i++) {
        snprintf(a, sizeof a, "%s%s", MERGES[i][0], MERGES[i][1]);
        byte_level(a, buf);
        ok = (toks[k++] = strdup(buf)) != NULL;
    }
    for (int64_t i = 0; ok && i < n_fill; i++) {
        snprintf(buf, sizeof buf, "<t%lld>", (long long)(256 + N_MERGES + i));
        ok = (toks[k++] = strdup(buf)) != NULL;
    }
    ok = ok && (toks[k++] = strdup(BOS_TEXT)) && (toks[k++] = strdup(EOS_TEXT));
    for (int64_t i = 0; ok && i < n_vocab; i++)
        types[i] = i >= n_vocab - 2 ? 3 : 1; /* control : normal */
    for (int i = 0; ok && i < N_MERGES; i++) {
        byte_level(MERGES[i][0], a);
        byte_level(MERGES[i][1], b);
        snprintf(buf, sizeof buf, "%s %s", a, b);
        ok = (merges[i] = strdup(buf)) != NULL;
    }
    ok = ok && gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") &&
         gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2") &&
         gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks,
                                 (uint64_t)n_vocab) &&
         gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types,
                             (uint64_t)n_vocab) &&
         gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges,
                                 N_MERGES) &&
         gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(n_vocab - 2)) &&
         gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n_vocab - 1)) &&
         gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true) &&
         gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    for (int64_t i = 0; toks && i < n_vocab; i++) free(toks[i]);
    for (int i = 0; i < N_MERGES; i++) free(merges[i]);
    free(toks);
    free(types);
    return ok;
}

/* Head widths, MLA, experts and rope scaling, under llama.cpp's keys. */
static bool add_shape_meta(gguf_writer *w, const synth_shape *s) {
    const char *a = s->arch;
    bool ok;
    if (s->kv_lora_rank) /* the cache holds one "head": the latent + the rope key */
        ok = kv_arch_u32(w, a, "attention.kv_lora_rank", s->kv_lora_rank) &&
             kv_arch_u32(w, a, "attention.key_length", s->kv_lora_rank + s->qk_rope) &&
             kv_arch_u32(w, a, "attention.value_length", s->kv_lora_rank) &&
             kv_arch_u32(w, a, "attention.key_length_mla", s->qk_nope + s->qk_rope) &&
             kv_arch_u32(w, a, "attention.value_length_mla", s->v_head_dim) &&
             kv_arch_u32(w, a, "rope.dimension_count", s->qk_rope) &&
             (!s->q_lora_rank || kv_arch_u32(w, a, "attention.q_lora_rank", s->q_lora_rank));
    else
        ok = kv_arch_u32(w, a, "attention.key_length", s->head_dim) &&
             kv_arch_u32(w, a, "attention.value_length", s->head_dim) &&
             kv_arch_u32(w, a, "rope.dimension_count", s->head_dim);
    if (ok && s->n_expert) {
        ok = kv_arch_u32(w, a, "expert_count", s->n_expert) &&
             kv_arch_u32(w, a, "expert_used_count", s->n_expert_used) &&
             kv_arch_u32(w, a, "expert_feed_forward_length", s->n_ff_exp);
        if (ok && strcmp(a, "deepseek2") == 0) /* DeepSeek-V2: softmax gating, no renormalisation */
            ok = kv_arch_u32(w, a, "leading_dense_block_count", s->n_layer_dense_lead) &&
                 kv_arch_u32(w, a, "expert_shared_count", s->n_shared_exp) &&
                 kv_arch_f32(w, a, "expert_weights_scale", 1.0f) &&
                 gguf_writer_set_bool(w, "deepseek2.expert_weights_norm", false) &&
                 kv_arch_u32(w, a, "expert_gating_func", 1);
    }
    if (ok && s->n_swa) ok = kv_arch_u32(w, a, "attention.sliding_window", s->n_swa);
    if (ok && s->yarn_factor > 0) {
        char key[96];
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        ok = gguf_writer_set_str(w, key, "yarn") &&
             kv_arch_f32(w, a, "rope.scaling.factor", s->yarn_factor) &&
             kv_arch_u32(w, a, "rope.scaling.original_context_length", s->yarn_orig_ctx) &&
             (s->yarn_log_mul == 0 ||
              kv_arch_f32(w, a, "rope.scaling.yarn_log_multiplier", s->yarn_log_mul));
    }
    return ok;
}

/* The whole file but the tensor data: metadata, then the plan's descriptors. */
static bool add_meta(gguf_writer *w, const synth_shape *s, synth_ftype ft, uint64_t seed,
                     const plan *p) {
    const char *a = s->arch;
    char name[96];
    snprintf(name, sizeof name, "synth %s %s", s->name, synth_ftype_name(ft));
    bool ok =
        gguf_writer_set_str(w, "general.architecture", a) &&
        gguf_writer_set_str(w, "general.name", name) &&
        gguf_writer_set_str(w, "general.description",
                            "random weights of a real model's shape, written by kvllm synth") &&
        gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft) &&
        gguf_writer_set_u32(w, "general.quantization_version", 2) &&
        gguf_writer_set_u64(w, "synth.seed", seed) && kv_arch_u32(w, a, "vocab_size", s->n_vocab) &&
        kv_arch_u32(w, a, "context_length", s->n_ctx) &&
        kv_arch_u32(w, a, "embedding_length", s->n_embd) &&
        kv_arch_u32(w, a, "block_count", s->n_layer) &&
        kv_arch_u32(w, a, "feed_forward_length", s->n_ff) &&
        kv_arch_u32(w, a, "attention.head_count", s->n_head) &&
        kv_arch_u32(w, a, "attention.head_count_kv", s->n_head_kv) &&
        kv_arch_f32(w, a, "rope.freq_base", s->rope_base) &&
        kv_arch_f32(w, a, "attention.layer_norm_rms_epsilon", s->rms_eps) && add_shape_meta(w, s) &&
        add_vocab(w, s->n_vocab);
    for (int i = 0; ok && i < p->n; i++)
        ok = gguf_writer_add_tensor(w, p->t[i].name, p->t[i].dtype, p->t[i].n_dims, p->t[i].ne,
                                    NULL);
    return ok;
}

/* -------------------------------------------------------------- values -- */

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Row r of tensor ti: N(0, 0.02) approximated by the sum of four uniform
 * 16-bit draws (Irwin-Hall), cheap and smooth enough for timing purposes.
 * Seeded per row so the file does not depend on the thread count. */
static void fill_row(float *dst, int64_t n, fill_kind fill, uint64_t seed, int ti, int64_t r) {
    if (fill == FILL_ONES) {
        for (int64_t i = 0; i < n; i++) dst[i] = 1.0f;
        return;
    }
    uint64_t st = seed * 0x100000001B3ull ^ ((uint64_t)ti << 40) ^ (uint64_t)r;
    splitmix(&st);
    const float mean = 2.0f * 65535.0f, scale = 0.02f / (65536.0f * 0.57735027f);
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = splitmix(&st);
        float sum = (float)(z & 0xFFFF) + (float)((z >> 16) & 0xFFFF) +
                    (float)((z >> 32) & 0xFFFF) + (float)(z >> 48);
        dst[i] = (sum - mean) * scale;
    }
}

/* A row of a type kvllm cannot quantize (IQ2_XXS): random codebook indices,
 * signs and scales, each block's d set so that the weights come out near the
 * N(0, 0.02) of the other rows (an IQ2_XXS value is d * (2 s + 1) / 8 * grid,
 * grid 8..43, s 0..15). Speed runs only: the weights are random either way. */
static void random_codes(int dtype, uint8_t *dst, int64_t n, uint64_t seed, int ti, int64_t r) {
    uint64_t st = seed * 0x100000001B3ull ^ ((uint64_t)ti << 40) ^ (uint64_t)r ^ 0x5A5A5A5Aull;
    const size_t bytes = kern_row_bytes(dtype, n);
    for (size_t i = 0; i < bytes; i += 8) {
        const uint64_t z = splitmix(&st);
        memcpy(dst + i, &z, bytes - i < 8 ? bytes - i : 8);
    }
    const kvl_f16 d = kvl_f32_to_f16(0.02f / (2.0f * 25.0f));
    const size_t bb = (size_t)gguf_dtype_traits_of(dtype)->block_bytes;
    for (size_t b = 0; b < bytes / bb; b++)
        memcpy(dst + b * bb, &d, sizeof d); /* d leads the block */
}

typedef struct writer {
    gguf_writer *g;
    float *f;   /* CHUNK_FLOATS */
    uint8_t *q; /* the same rows quantized */
    uint64_t done, total;
    synth_progress_fn progress;
    void *user;
    int64_t pool_rows; /* 0: every row drawn and quantized */
} writer;

/* Generates, quantizes and appends one tensor, a slice of rows at a time.
 * With w->pool_rows, rows from that index on repeat the first pool_rows rows
 * (written first as a whole slice) instead of being quantized. */
static bool write_tensor(writer *w, const tplan *t, int ti, uint64_t seed, kvl_error *err) {
    const kern_traits *tr = kern_traits_of(t->dtype);
    size_t rb = kern_row_bytes(t->dtype, t->ne[0]);
    int64_t rows = CHUNK_FLOATS / t->ne[0] > 0 ? CHUNK_FLOATS / t->ne[0] : 1;
    const int64_t n_rows = t->ne[1] * t->ne[2];
    int64_t pool = w->pool_rows > 0 && w->pool_rows < n_rows ? w->pool_rows : 0;
    if (pool > rows) pool = rows; /* the pool is the first slice, still in w->q */
    if (pool) rows = pool;
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows) {
        int64_t nr = n_rows - r0 < rows ? n_rows - r0 : rows;
        if (pool && r0 > 0) { /* w->q still holds the pool: write its first nr rows again */
            if (!gguf_writer_put(w->g, w->q, rb * (size_t)nr, err)) return false;
            w->done += rb * (uint64_t)nr;
            if (w->progress) w->progress(w->done, w->total, w->user);
            continue;
        }
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < nr; r++) {
            if (!tr->from_float) {
                random_codes(t->dtype, w->q + r * rb, t->ne[0], seed, ti, r0 + r);
                continue;
            }
            float *row = w->f + r * t->ne[0];
            fill_row(row, t->ne[0], t->fill, seed, ti, r0 + r);
            tr->from_float(row, w->q + r * rb, t->ne[0]);
        }
        if (!gguf_writer_put(w->g, w->q, rb * (size_t)nr, err)) return false;
        w->done += rb * (uint64_t)nr;
        if (w->progress) w->progress(w->done, w->total, w->user);
    }
    return true;
}

static bool write_data(writer *w, const plan *p, uint64_t seed, kvl_error *err) {
    int64_t max_ne0 = 0;
    for (int i = 0; i < p->n; i++)
        if (p->t[i].ne[0] > max_ne0) max_ne0 = p->t[i].ne[0];
    /* A slice is at most max(CHUNK_FLOATS, one row) floats; quantized it is
     * no larger than as F32. */
    size_t nf = (size_t)(CHUNK_FLOATS > max_ne0 ? CHUNK_FLOATS : max_ne0);
    w->f = kvl_alloc(nf * sizeof(float));
    w->q = kvl_alloc(nf * sizeof(float));
    bool ok = (w->f && w->q) || kvl_fail(err, "synth: out of memory");
    for (int i = 0; ok && i < p->n; i++) ok = write_tensor(w, &p->t[i], i, seed, err);
    kvl_free(w->f);
    kvl_free(w->q);
    return ok;
}

/* -------------------------------------------------------------- write -- */

uint64_t synth_file_bytes(const synth_shape *s, synth_ftype t) {
    plan p;
    gguf_writer *g = gguf_writer_create();
    uint64_t total = 0;
    if (plan_build(&p, s, t) && g && add_meta(g, s, t, 0, &p)) total = gguf_writer_file_bytes(g);
    free(p.t);
    gguf_writer_destroy(g);
    return total;
}

/* Re-opens the file with the strict reader: the layout must match the plan. */
static bool verify(const char *path, const plan *p, uint64_t size, kvl_error *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return false;
    bool ok = gguf_n_tensors(f) == p->n && gguf_file_layout(f)->file_size == size;
    gguf_close(f);
    return ok || kvl_fail(err, "%s: written file does not read back as planned", path);
}

bool synth_write(const synth_shape *s, synth_ftype t, uint64_t seed, int64_t pool_rows,
                 const char *path, synth_progress_fn progress, void *user, kvl_error *err) {
    kern_init(NULL);
    if (s->n_vocab < 256 + N_MERGES + 2)
        return kvl_fail(err, "synth: shape '%s' has too small a vocabulary", s->name);
    plan p;
    bool ok = plan_build(&p, s, t);
    for (int i = 0; ok && i < p.n; i++) {
        const kern_traits *tr = kern_traits_of(p.t[i].dtype);
        if (!tr || (!tr->from_float && p.t[i].dtype != GGUF_DT_IQ2_XXS)) {
            kvl_fail(err, "synth: %s of the %s mix is %s, which this build cannot quantize",
                     p.t[i].name, synth_ftype_name(t), gguf_dtype_name(p.t[i].dtype));
            free(p.t);
            return false;
        }
    }
    gguf_writer *g = ok ? gguf_writer_create() : NULL;
    if (!g || !add_meta(g, s, t, seed, &p)) {
        kvl_fail(err, "synth: out of memory");
        ok = false;
    } else {
        writer w = {.g = g,
                    .total = p.data_bytes,
                    .progress = progress,
                    .user = user,
                    .pool_rows = pool_rows};
        uint64_t size = gguf_writer_file_bytes(g);
        ok = gguf_writer_begin(g, path, err) && write_data(&w, &p, seed, err) &&
             gguf_writer_finish(g, err) && verify(path, &p, size, err);
    }
    gguf_writer_destroy(g); /* removes the file if it was begun and not finished */
    free(p.t);
    return ok;
}
