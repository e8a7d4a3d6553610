/* kernels: quantized block formats, dot products, matmul, and the small
 * elementwise ops of a transformer.
 *
 * Every weight type has a scalar reference implementation; SIMD variants plug
 * in through the per-type table returned by kern_traits_of(), which kern_init()
 * fills once at start-up from CPUID (AVX-512, AVX2, scalar). Like llama.cpp,
 * quantized weights are multiplied against activations that were first
 * quantized to the type's `vec_dot_type` (Q8_0, Q8_1 or Q8_K), so integer dot
 * products reproduce llama.cpp's numbers closely.
 *
 * Batch invariance: a matmul output element y[i][j] always goes through the
 * same float operations as vec_dot on row j of W and row i of the (quantized)
 * activations, in the canonical order of its type (kern_impl.h), whichever
 * path computes it (vec_dot, a rows kernel, the packed GEMM), so it does not
 * depend on the batch size, the thread count or which thread runs it. */
#ifndef KVLLM_KERNELS_H
#define KVLLM_KERNELS_H

#include "base.h"
#include "gguf.h"

/* Block layouts, byte-compatible with GGUF / ggml. */
#define QK8_0        32
#define QK4_0        32
#define QK_K         256
#define K_SCALE_SIZE 12

typedef struct {
    kvl_f16 d;
    int8_t qs[QK8_0];
} blk_q8_0;
typedef struct {
    kvl_f16 d;
    uint8_t qs[QK4_0 / 2];
} blk_q4_0;
typedef struct {
    kvl_f16 d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} blk_q4_K;
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    kvl_f16 d;
} blk_q6_K;
/* Q2_K: 16 groups of 16, 2-bit values; scales[g] = scale (low 4 bits) | min << 4. */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    kvl_f16 d, dmin;
} blk_q2_K;
/* Q3_K: 16 groups of 16, values -4..3 (2 low bits in qs, high bit in hmask),
 * 6-bit signed scales packed in 12 bytes. */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    kvl_f16 d;
} blk_q3_K;
/* Q5_K: Q4_K with a fifth bit per value in qh. */
typedef struct {
    kvl_f16 d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} blk_q5_K;
/* IQ4_XS: 8 groups of 32, 4-bit indices into a non-linear table, 6-bit scales. */
typedef struct {
    kvl_f16 d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} blk_iq4_xs;
/* The lattice ("i-quant") types: runs of 8 (IQ3: 4) values are indices into a
 * codebook of magnitudes (kern_iq_grids, quant_iq_ref.c) with a sign per
 * value, 8 groups of 32 with odd integer scales; quant_iq_ref.c gives each
 * bit's meaning.
 * IQ2_XXS: per group, 4 one-byte grid indices then 4 x 7 sign bits and a
 * 4-bit scale, as two little-endian uint32. */
typedef struct {
    kvl_f16 d;
    uint16_t qs[QK_K / 8];
} blk_iq2_xxs;
/* IQ2_XS: per 8 values a 9-bit grid index and 7 sign bits; 4-bit scales per 16. */
typedef struct {
    kvl_f16 d;
    uint16_t qs[QK_K / 8];
    uint8_t scales[QK_K / 32];
} blk_iq2_xs;
/* IQ2_S: 10-bit grid indices (low 8 in qs, 2 high bits in qh), the 8 sign
 * bits of each 8 values stored whole after them in qs; 4-bit scales per 16. */
typedef struct {
    kvl_f16 d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
} blk_iq2_s;
/* IQ3_XXS: one-byte grid indices of 4 values, then per group 4 x 7 sign bits
 * and a 4-bit scale (uint32). */
typedef struct {
    kvl_f16 d;
    uint8_t qs[3 * QK_K / 8];
} blk_iq3_xxs;
/* IQ3_S: 9-bit grid indices of 4 values (high bits in qh), signs stored
 * whole, 4-bit scales per 32. */
typedef struct {
    kvl_f16 d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
} blk_iq3_s;
/* IQ1_S: 11-bit indices into a codebook of -1 / 0 / 1 (low 8 bits in qs; qh per
 * group: 3 x 4 high bits, a 3-bit scale, the sign of the group's +-1/8 shift). */
typedef struct {
    kvl_f16 d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];
} blk_iq1_s;
/* IQ1_M: IQ1_S's codebook, a shift sign per 8 values, 3-bit scales per 16; the
 * fp16 super-block scale is spread over the scales' top 4 bits. */
typedef struct {
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];
    uint8_t scales[QK_K / 32];
} blk_iq1_m;
/* Activation format for K-quants: float scale, int8 values, sums of 16. */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} blk_q8_K;

/* n is the number of elements; it must be a multiple of the type's
 * block_elems (gguf_dtype_traits_of). vec_dot: *s = dot(x, y) where x is a row
 * of this type and y a row of its vec_dot_type (same n). The signatures as
 * function types (the implementations are declared with them: kern_impl.h),
 * then as the pointers of the tables. */
typedef void kern_to_float_sig(const void *src, float *dst, int64_t n);
typedef void kern_from_float_sig(const float *src, void *dst, int64_t n);
typedef void kern_vec_dot_sig(int64_t n, float *s, const void *x, const void *y);
typedef kern_to_float_sig *kern_to_float_fn;
typedef kern_from_float_sig *kern_from_float_fn;
typedef kern_vec_dot_sig *kern_vec_dot_fn;

/* The kernels of one type, indexed by its gguf_dtype. The facts about the type
 * (name, block geometry, vec_dot_type) are gguf's (gguf_dtype_traits_of). */
typedef struct kern_traits {
    kern_to_float_fn to_float;     /* dequantize */
    kern_from_float_fn from_float; /* quantize as llama-quantize does (NULL if not supported) */
    kern_vec_dot_fn vec_dot;       /* NULL if this type cannot be a matmul weight */
    /* quantize as llama.cpp's CPU backend does at run time (activations, cache rows), where
     * that differs from from_float (NULL: the same). Q8_0: its x86 quantize_row_q8_0 takes
     * 127 / amax and rounds half to even, the reference (weights) 1 / (amax / 127) and half
     * away from zero; a byte that differs from llama.cpp's flips a product in every row. */
    kern_from_float_fn act_from_float;
} kern_traits;

/* The run-time quantizer of t (activations, cache rows). */
static inline kern_from_float_fn kern_act_quantizer(const kern_traits *t) {
    return t->act_from_float ? t->act_from_float : t->from_float;
}

/* Chooses the best implementation for this CPU. Idempotent, thread-safe after
 * the first call returns. `force` = "scalar" | "avx2" | "avx512" | NULL (auto). */
void kern_init(const char *force);
const char *kern_isa_name(void); /* what kern_init chose */
/* The CPU's brand string (CPUID), "" where it has none: benchmark reports
 * name the machine their figures come from. */
const char *kern_cpu_name(void);
/* The hint of the two-stream decode kernels' own prefetches as kern_init set
 * it for this CPU: "nta" (non-temporal), "t1" (into L2), or "none" where the
 * chosen kernels do not prefetch themselves (below AVX-512). */
const char *kern_decode_prefetch_name(void);
/* The memory-bandwidth probe's read (kvllm bench --membw, the decode
 * roofline): the wrapping sum of the 64-bit words of bytes (a multiple of
 * 64) at p (64-byte aligned), which only keeps the loads alive; four
 * accumulators of the widest loads the chosen ISA has, with 512-bit loads in
 * two streams. With 128-bit loads the probe read 42-48 GB/s where 512-bit
 * loads read 51-57 (Zen 4, 2 threads, the two alternating): less than the
 * prefetching decode kernels reach, so no roofline; one 512-bit stream reads
 * 5-7% less than two. */
uint64_t kern_read_sum(const void *p, size_t bytes);
/* NULL for types without kernels. */
const kern_traits *kern_traits_of(int dtype);
/* The scalar reference table, always available (for tests). */
const kern_traits *kern_traits_ref(int dtype);

/* Bytes of one row of n elements of dtype (n a multiple of the block size). */
size_t kern_row_bytes(int dtype, int64_t n);

/* Y[m][n_out] = X[m][k] . W[n_out][k]^T, W rows of dtype wtype.
 * X is quantized once to W's vec_dot_type into `work` (size from
 * kern_matmul_work_bytes; its layout depends on the path) and the output rows
 * are split over the kvl_pool threads (a call from inside a pool task runs
 * on its thread alone). */
size_t kern_matmul_work_bytes(int wtype, int64_t m, int64_t k);
void kern_matmul(const void *W, int wtype, int64_t n_out, int64_t k, const float *X, int64_t m,
                 float *Y, void *work);

/* Repacked weights (the active ISA's compact panel layout, written once at
 * load): kern_repack_bytes is 0 when wtype has no such layout on this ISA or
 * the shape does not fit it; kern_repack fills dst (64-byte aligned, that many
 * bytes) from GGUF rows, splitting the work over the kvl_pool threads; then
 * kern_matmul_repacked computes exactly what kern_matmul computes on W, with
 * the same work buffer. The layout belongs to the ISA chosen at kern_init:
 * repack again after changing it. */
size_t kern_repack_bytes(int wtype, int64_t n_out, int64_t k);
void kern_repack(const void *W, int wtype, int64_t n_out, int64_t k, void *dst);
void kern_matmul_repacked(const void *P, int wtype, int64_t n_out, int64_t k, const float *X,
                          int64_t m, float *Y, void *work);
/* Several repacked matrices applied to the same X (Q, K, V; gate and up): X
 * is prepared once and all products run in one parallel region. Their types
 * must share an activation layout (kern_repacked_share_input). */
#define KERN_REPACKED_MAX 4
typedef struct kern_repacked_mat {
    const void *P;
    int wtype;
    int64_t n_out;
    float *Y; /* [m][n_out] */
} kern_repacked_mat;
void kern_matmul_repacked_multi(int nw, const kern_repacked_mat *mats, int64_t k, const float *X,
                                int64_t m, void *work);
bool kern_repacked_share_input(int wtype_a, int wtype_b);
/* Repacked matrices each applied to one X row of its own (decode of a
 * mixture-of-experts layer: every selected expert's gate and up, or every
 * expert's down after its own gate and up): each distinct (x, k, activation
 * layout) is prepared once on the calling thread, then all products run in one
 * parallel region, chunks guided over all of them together. Each y is exactly
 * what kern_matmul_repacked gives for that matrix and x with m = 1. nw <=
 * KERN_EACH_MAX; work holds kern_matmul_repacked_each_work_bytes. */
#define KERN_EACH_MAX 40
typedef struct kern_repacked_one {
    const void *P;
    int wtype;
    int64_t n_out, k;
    const float *x; /* [k] */
    float *y;       /* [n_out] */
} kern_repacked_one;
size_t kern_matmul_repacked_each_work_bytes(int nw, const kern_repacked_one *mats);
void kern_matmul_repacked_each(int nw, const kern_repacked_one *mats, void *work);
/* The gated FFNs of ne experts (decode of a mixture-of-experts layer) in one
 * parallel region: gu[2e] and gu[2e + 1] are expert e's gate and up, then
 * act(ctx, e) makes down[e].x from their outputs, on the thread that finishes
 * the last chunk of the two, and down[e] runs once that input is prepared:
 * no barrier between the experts' gate/up and down, and the activations run
 * on both threads. Every y is exactly what kern_matmul_repacked_each gives
 * (gate and up of all, act of each, then down of all); with more than
 * KERN_EACH_MAX matrices it runs as those three steps. work holds
 * kern_matmul_repacked_gated_work_bytes. */
typedef void (*kern_gated_act_fn)(void *ctx, int e);
size_t kern_matmul_repacked_gated_work_bytes(int ne, const kern_repacked_one *gu,
                                             const kern_repacked_one *down);
void kern_matmul_repacked_gated(int ne, const kern_repacked_one *gu, const kern_repacked_one *down,
                                kern_gated_act_fn act, void *ctx, void *work);

/* Attention, over one chunk of positions of one KV head (model_ops.c). q rows
 * are floats, q_h = q + h*qs; K and V come as one row pointer per position
 * (k[j], v[j]: the head's slice in the paged cache, elements of kvtype F32,
 * F16, BF16, or a 32-value block type Q8_0, Q5_0, Q4_0, IQ4_NL, widened exactly:
 * level times scale as to_float). Canonical orders (kern_impl.h), bit-identical
 * across ISAs:
 *  kern_attn_scores  s[h*ss + j] = scale * dot16(q_h, k[j])        h < n_q, j < n
 *  kern_attn_softmax one row: m = max s; s[j] = kern_expf(s[j] - m); *l = sum16(s);
 *                    returns m
 *  kern_attn_pv      o[h*os + d] += p[h*ps + j] * v[j][d], one fma per term, j in order
 *  kern_attn_merge   nc chunk partials, each [m: n_q][l: n_q][o: n_q][dv] floats:
 *                    out[h*os + d] = (sum_c w_c o_c[d]) / (sum_c w_c l_c), w_c = expf(m_c - max m) */
void kern_attn_scores(int64_t n, int64_t dk, int n_q, const float *q, size_t qs,
                      const void *const *k, int kvtype, float scale, float *s, size_t ss);
float kern_attn_softmax(int64_t n, float *s, float *l);
void kern_attn_pv(int64_t n, int64_t dv, int n_q, const float *p, size_t ps, const void *const *v,
                  int kvtype, float *o, size_t os);
void kern_attn_merge(int nc, int n_q, int64_t dv, const float *part, float *out, size_t os);

/* g[i] = silu(g[i]) * u[i], silu(x) = x * sigmoid(x), with e = kern_expf(-|x|):
 * sigmoid = x >= 0 ? 1 / (1 + e) : e * (1 / (1 + e)); then (x * sigmoid) * u.
 * Bit-identical across ISAs. */
void kern_silu_mul(float *g, const float *u, int64_t n);

/* Each of `runs` consecutive runs of n values at x (n a power of two, >= 16)
 * times the orthonormal Walsh-Hadamard matrix, in place, as ggml's fwht:
 * scaled by 1/sqrt(n) first, then the butterflies (u + v, u - v) at spans 1,
 * 2, 4, ... Bit-identical across ISAs (each value takes the same adds). */
void kern_hadamard(float *x, int64_t runs, int64_t n);

/* Dequantize row `row` of a [rows][n] tensor of dtype into dst[n]. */
void kern_get_row(const void *data, int dtype, int64_t n, int64_t row, float *dst);

#endif
