/* Unit tests for src/kernels: quantization round trips, SIMD against the
 * scalar reference (bit for bit), dot products against exact math, matmul
 * batch / thread / ISA invariance, and byte-exactness against files that
 * llama-quantize wrote (tests/data/golden/models). Run from the repo root. */
#include "kern_impl.h" /* to call every SIMD variant directly */
#include "kernels.h"
#include "kernels_grouped.h"
#include "kvl_pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* ---------- helpers ---------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
static float rng_gauss(void) {
    double u = rng_unit(), v = rng_unit();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

/* Gaussian data with some structure that exercises the quantizers' edge
 * cases: a zero block, an outlier, a negative extreme, equal-magnitude ties. */
static void fill_data(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * rng_gauss();
    if (n >= 512) {
        for (int i = 256; i < 288; i++) x[i] = 0.0f;
        x[300] = 40.0f * scale;
        x[400] = -35.0f * scale;
        x[401] = 35.0f * scale; /* tie in magnitude with x[400]: first one wins */
    }
}

static const int weight_types[] = {GGUF_DT_F32,  GGUF_DT_F16,  GGUF_DT_BF16,   GGUF_DT_Q8_0,
                                   GGUF_DT_Q4_0, GGUF_DT_Q4_K, GGUF_DT_Q6_K,   GGUF_DT_Q4_1,
                                   GGUF_DT_Q5_0, GGUF_DT_Q5_1, GGUF_DT_IQ4_NL, GGUF_DT_Q2_K,
                                   GGUF_DT_Q3_K, GGUF_DT_Q5_K, GGUF_DT_IQ4_XS, GGUF_DT_MXFP4};
#define N_WEIGHT_TYPES ((int)(sizeof weight_types / sizeof weight_types[0]))

static const char *isa_list[] = {"scalar", "avx2", "avx512"};
static bool isa_ok[3] = {true}; /* which of isa_list this CPU runs (probed once in main) */

/* kern_init falls back (with a warning) when the CPU lacks the ISA asked for. */
static bool probe_isa(int a) {
    kern_init(isa_list[a]);
    const bool ok = strcmp(kern_isa_name(), isa_list[a]) == 0;
    kern_init("auto");
    return ok;
}

/* Selects isa_list[a]; false if this CPU lacks it. */
static bool use_isa(int a) {
    if (!isa_ok[a]) return false;
    kern_init(isa_list[a]);
    return true;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void *quantize_ref(int dtype, const float *x, int64_t n) {
    void *q = kvl_calloc(1, kern_row_bytes(dtype, n) + 64);
    kern_traits_ref(dtype)->from_float(x, q, n);
    return q;
}

static float *dequantize_ref(int dtype, const void *q, int64_t n) {
    float *y = kvl_alloc((size_t)n * sizeof(float));
    kern_traits_ref(dtype)->to_float(q, y, n);
    return y;
}

static double nrmse(const float *a, const float *b, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

/* ---------- tables ---------- */

static void test_tables(void) {
    static const struct {
        int t, be;
        size_t bb;
        int vdt;
    } want[] = {
        {GGUF_DT_F32, 1, 4, GGUF_DT_F32},       {GGUF_DT_F16, 1, 2, GGUF_DT_F16},
        {GGUF_DT_BF16, 1, 2, GGUF_DT_BF16},     {GGUF_DT_Q8_0, 32, 34, GGUF_DT_Q8_0},
        {GGUF_DT_Q4_0, 32, 18, GGUF_DT_Q8_0},   {GGUF_DT_Q4_K, 256, 144, GGUF_DT_Q8_K},
        {GGUF_DT_Q6_K, 256, 210, GGUF_DT_Q8_K}, {GGUF_DT_Q4_1, 32, 20, GGUF_DT_Q8_1},
        {GGUF_DT_Q5_0, 32, 22, GGUF_DT_Q8_0},   {GGUF_DT_Q5_1, 32, 24, GGUF_DT_Q8_1},
        {GGUF_DT_IQ4_NL, 32, 18, GGUF_DT_Q8_0}, {GGUF_DT_Q6_K, 256, 210, GGUF_DT_Q8_K},
        {GGUF_DT_Q2_K, 256, 84, GGUF_DT_Q8_K},  {GGUF_DT_Q3_K, 256, 110, GGUF_DT_Q8_K},
        {GGUF_DT_Q5_K, 256, 176, GGUF_DT_Q8_K}, {GGUF_DT_IQ4_XS, 256, 136, GGUF_DT_Q8_K},
        {GGUF_DT_MXFP4, 32, 17, GGUF_DT_Q8_0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kern_traits *t = kern_traits_of(want[i].t), *r = kern_traits_ref(want[i].t);
        const gguf_dtype_traits *f = gguf_dtype_traits_of(want[i].t);
        CHECK(t && r && f, "type %d missing", want[i].t);
        if (!t || !r || !f) continue;
        CHECK(f->block_elems == want[i].be && f->block_bytes == want[i].bb, "%s geometry", f->name);
        CHECK(f->vec_dot_type == want[i].vdt, "%s vec_dot_type %d", f->name, f->vec_dot_type);
        CHECK(t->to_float && t->from_float && t->vec_dot, "%s functions", f->name);
    }
    /* The block structs are the layouts the type table describes. */
    static const struct {
        int t;
        size_t size;
    } blocks[] = {{GGUF_DT_Q8_0, sizeof(blk_q8_0)},
                  {GGUF_DT_Q4_0, sizeof(blk_q4_0)},
                  {GGUF_DT_Q4_K, sizeof(blk_q4_K)},
                  {GGUF_DT_Q6_K, sizeof(blk_q6_K)},
                  {GGUF_DT_Q8_K, sizeof(blk_q8_K)}};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        CHECK(gguf_dtype_traits_of(blocks[i].t)->block_bytes == blocks[i].size, "%s block struct",
              gguf_dtype_name(blocks[i].t));
    CHECK(gguf_dtype_traits_of(GGUF_DT_MXFP4)->block_bytes == sizeof(blk_mxfp4), "MXFP4 block");
    /* Every type with kernels has geometry; a weight type's activations have kernels too. */
    for (int t = 0; t < GGUF_DT_COUNT; t++) {
        const kern_traits *r = kern_traits_ref(t);
        if (!r) continue;
        const gguf_dtype_traits *f = gguf_dtype_traits_of(t);
        CHECK(f && f->block_elems > 0, "type %d has kernels but no geometry", t);
        if (!r->vec_dot || !f) continue;
        const kern_traits *a = kern_traits_ref(f->vec_dot_type);
        CHECK(a && a->from_float, "%s: its vec_dot_type %d has no from_float", f->name,
              f->vec_dot_type);
    }
    const kern_traits *q8k = kern_traits_of(GGUF_DT_Q8_K);
    CHECK(q8k && q8k->from_float && q8k->to_float && !q8k->vec_dot, "Q8_K is activation-only");
    const kern_traits *q81 = kern_traits_of(GGUF_DT_Q8_1);
    CHECK(q81 && gguf_dtype_traits_of(GGUF_DT_Q8_1)->block_bytes == 36 && q81->from_float &&
              q81->to_float && !q81->vec_dot,
          "Q8_1 is activation-only");
    CHECK(!kern_traits_of(GGUF_DT_I8) && !kern_traits_of(-1) && !kern_traits_of(GGUF_DT_COUNT),
          "unsupported types have no traits");
    CHECK(kern_row_bytes(GGUF_DT_Q4_K, 4096) == 16 * 144, "row bytes q4_K");
    CHECK(kern_row_bytes(GGUF_DT_F16, 10) == 20, "row bytes f16");
    CHECK(kern_matmul_work_bytes(GGUF_DT_Q4_0, 3, 64) >= 3 * 2 * 34, "work bytes q4_0");
    CHECK(kern_matmul_work_bytes(GGUF_DT_F32, 3, 64) >= kern_gemm_work_bytes(GGUF_DT_F32, 3, 64),
          "work bytes f32 (the GEMM's activation tiles)");
}

/* ---------- quantization round trip ---------- */

/* (the 32-element types likewise: Q4_1 7.8e-2, IQ4_NL 7.7e-2, Q5_0 4.2e-2,
 * Q5_1 3.8e-2) */
#define BOUND_Q4_1   9.5e-2
#define BOUND_IQ4_NL 9.3e-2
#define BOUND_Q5_0   5.1e-2
#define BOUND_Q5_1   4.6e-2

/* Normalized RMS error of a round trip on unit Gaussian data (measured values
 * with about 20% headroom: F16 2.0e-4, BF16 1.7e-3, Q8_0 5.3e-3, Q8_K 6.8e-3,
 * Q6_K 1.8e-2, Q4_K 7.1e-2, Q4_0 8.4e-2, Q5_K 3.6e-2, IQ4_XS 7.7e-2, Q3_K 1.5e-1,
 * Q2_K 3.0e-1). */
static double roundtrip_bound(int t) {
    switch (t) {
    case GGUF_DT_F32: return 0.0;
    case GGUF_DT_F16: return 2.5e-4;
    case GGUF_DT_BF16: return 2.1e-3;
    case GGUF_DT_Q8_0: return 6.5e-3;
    case GGUF_DT_Q8_K: return 8.5e-3;
    case GGUF_DT_Q6_K: return 2.2e-2;
    case GGUF_DT_Q4_K: return 8.5e-2;
    case GGUF_DT_Q8_1: return 6.5e-3;
    case GGUF_DT_Q5_0: return BOUND_Q5_0;
    case GGUF_DT_Q5_1: return BOUND_Q5_1;
    case GGUF_DT_Q4_1: return BOUND_Q4_1;
    case GGUF_DT_IQ4_NL: return BOUND_IQ4_NL;
    case GGUF_DT_Q5_K: return 4.2e-2;
    case GGUF_DT_Q3_K: return 1.9e-1;
    case GGUF_DT_Q2_K: return 3.6e-1;
    case GGUF_DT_IQ4_XS: return 9.5e-2;
    /* MXFP4 measured 1.2e-1: power-of-two scales, 15 levels */
    case GGUF_DT_MXFP4: return 1.5e-1;
    default: return 1.0e-1; /* Q4_0 */
    }
}

/* Every ISA's from_float / act_from_float / to_float is byte-identical to the reference. */
static void check_isa_conversions(int t, const float *x, const void *q, const float *y, int64_t n) {
    const size_t rb = kern_row_bytes(t, n);
    void *q2 = kvl_calloc(1, rb + 64), *qa = kvl_calloc(1, rb + 64), *qa2 = kvl_calloc(1, rb + 64);
    float *y2 = kvl_alloc(n * sizeof(float));
    kern_act_quantizer(kern_traits_ref(t))(x, qa, n);
    for (int a = 1; a < 3; a++) {
        if (!use_isa(a)) continue;
        kern_traits_of(t)->from_float(x, q2, n);
        kern_act_quantizer(kern_traits_of(t))(x, qa2, n);
        kern_traits_of(t)->to_float(q, y2, n);
        CHECK(memcmp(q, q2, rb) == 0, "%s from_float %s differs from reference", gguf_dtype_name(t),
              isa_list[a]);
        CHECK(memcmp(qa, qa2, rb) == 0, "%s act_from_float %s differs from reference",
              gguf_dtype_name(t), isa_list[a]);
        CHECK(memcmp(y, y2, n * sizeof(float)) == 0, "%s to_float %s differs", gguf_dtype_name(t),
              isa_list[a]);
    }
    kern_init("auto");
    kvl_free(q2), kvl_free(qa), kvl_free(qa2);
    kvl_free(y2);
}

static void test_roundtrip(void) {
    const int64_t n = 4096;
    float *x = kvl_alloc(n * sizeof(float)), *xe = kvl_alloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = 0.7f * rng_gauss();
    fill_data(xe, n, 0.7f);
    const int types[] = {GGUF_DT_F32,  GGUF_DT_F16,    GGUF_DT_BF16,   GGUF_DT_Q8_0, GGUF_DT_Q4_0,
                         GGUF_DT_Q4_K, GGUF_DT_Q6_K,   GGUF_DT_Q8_K,   GGUF_DT_Q4_1, GGUF_DT_Q5_0,
                         GGUF_DT_Q5_1, GGUF_DT_Q8_1,   GGUF_DT_IQ4_NL, GGUF_DT_Q2_K, GGUF_DT_Q3_K,
                         GGUF_DT_Q5_K, GGUF_DT_IQ4_XS, GGUF_DT_MXFP4};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti];
        const char *name = gguf_dtype_name(t);
        void *q = quantize_ref(t, x, n);
        float *y = dequantize_ref(t, q, n);
        const double e = nrmse(x, y, n);
        printf("  round trip %-5s nrmse %.2e (gaussian)\n", name, e);
        CHECK(e <= roundtrip_bound(t), "%s round trip nrmse %g", name, e);
        check_isa_conversions(t, x, q, y, n);
        kvl_free(q), kvl_free(y);
        /* edge data: zero block, outliers, ties */
        q = quantize_ref(t, xe, n);
        y = dequantize_ref(t, q, n);
        for (int i = 256; i < 288; i++) CHECK(y[i] == 0.0f, "%s zero block", name);
        check_isa_conversions(t, xe, q, y, n);
        kvl_free(q), kvl_free(y);
    }
    kvl_free(x), kvl_free(xe);
}

/* Q8_K specifics: d = max/-127 of the signed extreme, bsums consistent. */
static void test_q8_K_layout(void) {
    float x[QK_K];
    for (int i = 0; i < QK_K; i++) x[i] = 0.01f * (float)(i % 37) - 0.2f;
    x[10] = -3.0f;
    x[20] = 3.0f;
    blk_q8_K b;
    kern_traits_ref(GGUF_DT_Q8_K)->from_float(x, &b, QK_K);
    /* the first extreme (-3) maps to -127, so d = -3/-127 > 0 */
    CHECK(b.qs[10] == -127 && b.qs[20] == 127, "q8_K sign follows the first extreme (%d %d)",
          b.qs[10], b.qs[20]);
    CHECK(fabsf(b.d - -3.0f / -127.f) < 1e-7f, "q8_K d = max/-127 (%g)", b.d);
    for (int j = 0; j < QK_K / 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += b.qs[16 * j + i];
        CHECK(s == b.bsums[j], "q8_K bsums[%d]", j);
    }
    blk_q8_0 q;
    float z[QK8_0];
    for (int i = 0; i < QK8_0; i++) z[i] = (float)i - 12.7f;
    kern_traits_ref(GGUF_DT_Q8_0)->from_float(z, &q, QK8_0);
    const float d = kvl_f16_to_f32(q.d);
    CHECK(fabsf(d - 18.3f / 127) < 1e-4f, "q8_0 d = amax/127 (%g)", d);
    const float id = 1.0f / (18.3f / 127);
    for (int i = 0; i < QK8_0; i++)
        CHECK(q.qs[i] == (int8_t)roundf(z[i] * id), "q8_0 rounds with roundf (%d)", i);
    /* at run time (activations, cache rows) llama.cpp's x86 quantize_row_q8_0 rounds
     * x * (127 / amax) half to even: amax 127 makes the ties exact */
    for (int i = 0; i < QK8_0; i++) z[i] = 0.5f * (float)(i - 16);
    z[31] = 127.0f;
    kern_act_quantizer(kern_traits_ref(GGUF_DT_Q8_0))(z, &q, QK8_0);
    CHECK(kvl_f16_to_f32(q.d) == kvl_f16_to_f32(kvl_f32_to_f16(1.0f)), "q8_0 act d = 127/127");
    for (int i = 0; i < 31; i++)
        CHECK(q.qs[i] == (int8_t)rintf(z[i]), "q8_0 act rounds half to even (%d: %g -> %d)", i,
              (double)z[i], q.qs[i]);
    CHECK(q.qs[1] == -8 && q.qs[3] == -6 && q.qs[17] == 0 && q.qs[19] == 2,
          "q8_0 act ties: -7.5 -> -8, -6.5 -> -6, 0.5 -> 0, 1.5 -> 2");
}

/* MXFP4 as ggml defines it: E8M0 scale, E2M1 codes (element j low nibble,
 * j + 16 high), the quantizer's scale floor(log2(amax)) - 2 + 127 and nearest
 * code (the first of equals). */
static void test_mxfp4_layout(void) {
    blk_mxfp4 b = {.e = 127};
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    kern_traits_ref(GGUF_DT_MXFP4)->to_float(&b, y, 32);
    static const float e2m1[16] = {0,    0.5f,  1,  1.5f,  2,  3,  4,  6,
                                   -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; j++)
        CHECK(y[j] == e2m1[j] && y[j + 16] == e2m1[15 - j], "mxfp4 value %d: %g %g", j, y[j],
              y[j + 16]);
    b.e = 0;
    kern_traits_ref(GGUF_DT_MXFP4)->to_float(&b, y, 32);
    CHECK(y[7] == 6.0f * ldexpf(1.0f, -127), "mxfp4 e = 0 is 2^-127 (%g)", y[7]);
    b.e = 1;
    kern_traits_ref(GGUF_DT_MXFP4)->to_float(&b, y, 32);
    CHECK(y[1] == ldexpf(1.0f, -127), "mxfp4 e = 1 is 2^-126 (%g)", y[1]);
    float x[32] = {0};
    x[3] = 5.0f;   /* amax 5: e = 2 - 2 + 127, d = 0.5; 4 and 6 tie: code 6 (4), the first */
    x[20] = -1.2f; /* nearest is -1: code 10 (-2 * 0.5) */
    blk_mxfp4 q;
    kern_traits_ref(GGUF_DT_MXFP4)->from_float(x, &q, 32);
    CHECK(q.e == 127, "mxfp4 scale byte %d", q.e);
    CHECK((q.qs[3] & 15) == 6 && (q.qs[4] >> 4) == 10 && q.qs[0] == 0, "mxfp4 codes %02x %02x %02x",
          q.qs[3], q.qs[4], q.qs[0]);
}

/* ---------- dot products ---------- */

static double dot_double(const float *a, const float *b, int64_t n, double *abs_sum) {
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        as += fabs((double)a[i] * b[i]);
    }
    *abs_sum = as;
    return s;
}

/* Raw random weight rows cover every code (q8 -128, all 6-bit scales, q6 scale
 * -128) that a quantizer never writes but a file may contain. */
static void randomize_codes(int t, void *q, int64_t n) {
    const size_t rb = kern_row_bytes(t, n);
    uint8_t *p = q;
    for (size_t i = 0; i < rb; i++) p[i] = (uint8_t)rng_u64();
    const gguf_dtype_traits *tr = gguf_dtype_traits_of(t);
    for (int64_t b = 0; b < n / tr->block_elems; b++) {
        uint8_t *blk = p + b * tr->block_bytes;
        const kvl_f16 d = kvl_f32_to_f16(0.01f * (float)(1 + rng_u64() % 100));
        if (t == GGUF_DT_Q8_0 || t == GGUF_DT_Q4_0 || t == GGUF_DT_Q5_0 || t == GGUF_DT_IQ4_NL)
            memcpy(blk, &d, 2);
        if (t == GGUF_DT_Q4_1 || t == GGUF_DT_Q5_1) { /* d, then a min of either sign */
            const kvl_f16 m = kvl_f32_to_f16(0.02f * ((float)(rng_u64() % 101) - 50.0f));
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &m, 2);
        }
        if (t == GGUF_DT_Q4_K) {
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &d, 2);
        }
        if (t == GGUF_DT_Q6_K) memcpy(blk + 208, &d, 2);
        if (t == GGUF_DT_Q2_K) {
            memcpy(blk + 80, &d, 2);
            memcpy(blk + 82, &d, 2);
        }
        if (t == GGUF_DT_Q3_K) memcpy(blk + 108, &d, 2);
        if (t == GGUF_DT_Q5_K) {
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &d, 2);
        }
        if (t == GGUF_DT_IQ4_XS) memcpy(blk, &d, 2);
        if (t == GGUF_DT_MXFP4) blk[0] = (uint8_t)(110 + rng_u64() % 24); /* 2^-17 .. 2^6 */
    }
    if (t == GGUF_DT_F16 || t == GGUF_DT_BF16 || t == GGUF_DT_F32) {
        float *f = kvl_alloc(n * sizeof(float));
        fill_data(f, n, 1.0f);
        kern_traits_ref(t)->from_float(f, q, n);
        kvl_free(f);
    }
}

/* Every SIMD vec_dot, whether or not dispatch installs it on this CPU. */
static const struct {
    int t, isa;
    kern_vec_dot_fn dot;
} variants[] = {
    /* clang-format off */
    {GGUF_DT_F32, 1, kavx2_vec_dot_f32},     {GGUF_DT_F16, 1, kavx2_vec_dot_f16},
    {GGUF_DT_BF16, 1, kavx2_vec_dot_bf16},   {GGUF_DT_Q8_0, 1, kavx2_vec_dot_q8_0},
    {GGUF_DT_Q4_0, 1, kavx2_vec_dot_q4_0},   {GGUF_DT_Q4_K, 1, kavx2_vec_dot_q4_K},
    {GGUF_DT_Q6_K, 1, kavx2_vec_dot_q6_K},   {GGUF_DT_F32, 2, kavx512_vec_dot_f32},
    {GGUF_DT_F16, 2, kavx512_vec_dot_f16},   {GGUF_DT_BF16, 2, kavx512_vec_dot_bf16},
    {GGUF_DT_Q8_0, 2, kavx512_vec_dot_q8_0}, {GGUF_DT_Q4_0, 2, kavx512_vec_dot_q4_0},
    {GGUF_DT_Q4_K, 2, kavx512_vec_dot_q4_K}, {GGUF_DT_Q6_K, 2, kavx512_vec_dot_q6_K},
    {GGUF_DT_Q4_1, 1, kavx2_vec_dot_q4_1},   {GGUF_DT_Q5_0, 1, kavx2_vec_dot_q5_0},
    {GGUF_DT_Q5_1, 1, kavx2_vec_dot_q5_1},   {GGUF_DT_IQ4_NL, 1, kavx2_vec_dot_iq4_nl},
    {GGUF_DT_Q4_1, 2, kavx512_vec_dot_q4_1}, {GGUF_DT_Q5_0, 2, kavx512_vec_dot_q5_0},
    {GGUF_DT_Q5_1, 2, kavx512_vec_dot_q5_1}, {GGUF_DT_IQ4_NL, 2, kavx512_vec_dot_iq4_nl},
    {GGUF_DT_Q2_K, 1, kavx2_vec_dot_q2_K},   {GGUF_DT_Q3_K, 1, kavx2_vec_dot_q3_K},
    {GGUF_DT_Q5_K, 1, kavx2_vec_dot_q5_K},   {GGUF_DT_IQ4_XS, 1, kavx2_vec_dot_iq4_xs},
    {GGUF_DT_Q2_K, 2, kavx512_vec_dot_q2_K}, {GGUF_DT_Q3_K, 2, kavx512_vec_dot_q3_K},
    {GGUF_DT_Q5_K, 2, kavx512_vec_dot_q5_K}, {GGUF_DT_IQ4_XS, 2, kavx512_vec_dot_iq4_xs},
    {GGUF_DT_MXFP4, 1, kavx2_vec_dot_mxfp4}, {GGUF_DT_MXFP4, 2, kavx512_vec_dot_mxfp4},
    /* clang-format on */
};

/* Q4_1 / Q5_1 against Q8_1 use the block's stored s = fp16(d * sum q), not
 * the sum of the dequantized values: what that changes in sum_b m_b * s_b
 * (and the magnitude of those terms, added to *abs_sum). */
static double q8_1_min_terms(size_t block_bytes, const void *qx, const void *qy, int64_t n,
                             double *abs_sum) {
    double diff = 0;
    for (int64_t b = 0; b < n / QK8_1; b++) {
        const blk_q8_1 *yb = (const blk_q8_1 *)qy + b;
        kvl_f16 mh;
        memcpy(&mh, (const char *)qx + b * block_bytes + 2, 2); /* m follows d */
        const double m = kvl_f16_to_f32(mh), dy = kvl_f16_to_f32(yb->d);
        double sum = 0;
        for (int j = 0; j < QK8_1; j++) sum += yb->qs[j];
        diff += m * ((double)kvl_f16_to_f32(yb->s) - dy * sum);
        *abs_sum += fabs(m * kvl_f16_to_f32(yb->s));
    }
    return diff;
}

static void check_dot_case(int t, int64_t n, bool raw_codes) {
    const kern_traits *r = kern_traits_ref(t);
    const int vdt = gguf_dtype_traits_of(t)->vec_dot_type;
    float *x = kvl_alloc(n * sizeof(float)), *y = kvl_alloc(n * sizeof(float));
    fill_data(x, n, 1.0f);
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] + rng_gauss();
    void *qx = quantize_ref(t, x, n);
    if (raw_codes) randomize_codes(t, qx, n);
    void *qy = quantize_ref(vdt, y, n);
    float *dx = dequantize_ref(t, qx, n), *dy = dequantize_ref(vdt, qy, n);
    float s_ref;
    r->vec_dot(n, &s_ref, qx, qy);
    /* the integer math is exact: only float rounding separates it from exact math */
    double abs_sum;
    double exact = dot_double(dx, dy, n, &abs_sum);
    if (vdt == GGUF_DT_Q8_1)
        exact += q8_1_min_terms(gguf_dtype_traits_of(t)->block_bytes, qx, qy, n, &abs_sum);
    CHECK(fabs(s_ref - exact) <= 2e-6 * abs_sum + 1e-30, "%s n=%lld: ref %.9g exact %.9g",
          gguf_dtype_name(t), (long long)n, s_ref, exact);
    if (!raw_codes) { /* and the quantized dot is close to the float dot */
        double abs_xy;
        const double want = dot_double(x, y, n, &abs_xy);
        const double tol = (2.0 * (roundtrip_bound(t) + roundtrip_bound(vdt)) + 1e-5) * abs_xy;
        CHECK(fabs(s_ref - want) <= tol + 1e-6, "%s n=%lld: quantized %.6g float %.6g",
              gguf_dtype_name(t), (long long)n, s_ref, want);
    }
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        if (variants[v].t != t || !isa_ok[variants[v].isa]) continue;
        float s;
        variants[v].dot(n, &s, qx, qy);
        CHECK(same_bits(s, s_ref), "%s n=%lld %s: %.9g vs reference %.9g", gguf_dtype_name(t),
              (long long)n, isa_list[variants[v].isa], s, s_ref);
    }
    kvl_free(x), kvl_free(y), kvl_free(qx), kvl_free(qy), kvl_free(dx), kvl_free(dy);
}

/* Rows kernels: nr activation rows at a stride, each equal to the reference;
 * for the prepared path the rows are in the matmul-internal layout. */
static void test_rows_kernels(void) {
    static const struct {
        int t;
        kern_vec_dot_rows_fn rows;
        void (*prepare)(const float *, void *, int64_t);
    } rk[] = {{GGUF_DT_Q8_0, kavx512_prows_q8_0, kavx512_prepare_q8_0},
              {GGUF_DT_Q4_0, kavx512_prows_q4_0, kavx512_prepare_q4_0},
              {GGUF_DT_Q4_K, kavx512_rows_q4_K, NULL},
              {GGUF_DT_Q6_K, kavx512_rows_q6_K, NULL},
              {GGUF_DT_Q2_K, kavx512_rows_q2_K, NULL},
              {GGUF_DT_Q3_K, kavx512_rows_q3_K, NULL},
              {GGUF_DT_Q5_K, kavx512_rows_q5_K, NULL},
              {GGUF_DT_IQ4_XS, kavx512_rows_iq4_xs, NULL}};
    if (!isa_ok[2]) return;
    for (size_t v = 0; v < sizeof rk / sizeof rk[0]; v++) {
        const kern_traits *r = kern_traits_ref(rk[v].t);
        const gguf_dtype_traits *f = gguf_dtype_traits_of(rk[v].t);
        const kern_traits *qt = kern_traits_ref(f->vec_dot_type);
        for (int nbk = 1; nbk <= 11; nbk++) {
            const int64_t n = (int64_t)nbk * f->block_elems;
            const size_t qrow = kern_row_bytes(f->vec_dot_type, n);
            /* an odd stride on purpose: kernels must not assume alignment */
            const size_t ys = (rk[v].prepare ? kern_q8p_row_bytes(n) : qrow) + 40;
            float *x = kvl_alloc(n * sizeof(float)), *yf = kvl_alloc(n * sizeof(float));
            char *qy = kvl_calloc(KERN_ROWS_MAX, ys), *qstd = kvl_calloc(KERN_ROWS_MAX, qrow);
            fill_data(x, n, 1.0f);
            void *qx = quantize_ref(rk[v].t, x, n);
            for (int i = 0; i < KERN_ROWS_MAX; i++) {
                fill_data(yf, n, 1.0f + i);
                kern_act_quantizer(qt)(yf, qstd + i * qrow, n);
                if (rk[v].prepare) rk[v].prepare(yf, qy + i * ys, n);
                else memcpy(qy + i * ys, qstd + i * qrow, qrow);
            }
            for (int nr = 1; nr <= KERN_ROWS_MAX; nr++) {
                float s[2 * KERN_ROWS_MAX] = {0}, want;
                rk[v].rows(n, s, 2, qx, qy, ys, nr);
                for (int i = 0; i < nr; i++) {
                    r->vec_dot(n, &want, qx, qstd + i * qrow);
                    CHECK(same_bits(s[2 * i], want), "%s rows nr=%d row %d n=%lld: %g vs %g",
                          f->name, nr, i, (long long)n, s[2 * i], want);
                }
            }
            kvl_free(x), kvl_free(yf), kvl_free(qy), kvl_free(qstd), kvl_free(qx);
        }
    }
}

static void test_vec_dot(void) {
    static const int64_t fp_sizes[] = {1, 7, 16, 63, 64, 65, 100, 200, 4096, 4109};
    static const int64_t blocks[] = {1, 2, 3, 4, 5, 6, 7, 9, 16, 128};
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int t = weight_types[ti];
        const int be = gguf_dtype_traits_of(t)->block_elems;
        for (int si = 0; si < 10; si++) {
            const int64_t n = be == 1 ? fp_sizes[si] : blocks[si] * be;
            /* small cases are cheap: repeat them so rare rounding-order slips show up */
            const int reps = n <= 1024 ? 8 : 1;
            for (int r = 0; r < reps; r++) {
                check_dot_case(t, n, false);
                check_dot_case(t, n, true);
            }
        }
    }
}

/* ---------- matmul ---------- */

/* Y rows via direct vec_dot calls on the active table (the definition). */
/* An n x k weight matrix of type t: *wf gets the floats (Gaussian, scale
 * 0.05), the return value their rows quantized by the reference. */
static char *random_weights(int t, int64_t n, int64_t k, float **wf) {
    *wf = kvl_alloc(n * k * sizeof(float));
    fill_data(*wf, n * k, 0.05f);
    const size_t wrow = kern_row_bytes(t, k);
    char *W = kvl_alloc(n * wrow);
    for (int64_t j = 0; j < n; j++) kern_traits_ref(t)->from_float(*wf + j * k, W + j * wrow, k);
    return W;
}

static void matmul_direct(const void *W, int t, int64_t n_out, int64_t k, const float *X, int64_t m,
                          float *Y) {
    const kern_traits *tr = kern_traits_of(t);
    const int vdt = gguf_dtype_traits_of(t)->vec_dot_type;
    const kern_traits *qt = kern_traits_of(vdt);
    const size_t xrow = kern_row_bytes(vdt, k), wrow = kern_row_bytes(t, k);
    char *xq = kvl_alloc(xrow + 64);
    for (int64_t i = 0; i < m; i++) {
        kern_act_quantizer(qt)(X + i * k, xq, k);
        for (int64_t j = 0; j < n_out; j++)
            tr->vec_dot(k, &Y[i * n_out + j], (const char *)W + j * wrow, xq);
    }
    kvl_free(xq);
}

static void run_matmul(const void *W, int t, int64_t n_out, int64_t k, const float *X, int64_t m,
                       float *Y) {
    void *work = kvl_alloc(kern_matmul_work_bytes(t, m, k));
    kern_matmul(W, t, n_out, k, X, m, Y, work);
    kvl_free(work);
}

static void test_matmul_type(int t) {
    const int64_t n_out = 301, k = 512, M = 17;
    float *wf, *X = kvl_alloc(M * k * sizeof(float));
    char *W = random_weights(t, n_out, k, &wf);
    fill_data(X, M * k, 1.0f);
    /* even rows of halves with 127 in every block: x * (127 / amax) is then exact and
     * often a tie, where a quantizer that rounds half away from zero (the weights' one)
     * or scales by 1 / (amax / 127) gives other bytes than the run-time one */
    for (int64_t i = 0; i < M; i += 2)
        for (int64_t j = 0; j < k; j++)
            X[i * k + j] =
                j % 32 == 0 ? 127.0f : 0.5f * (float)((int)((i * 131 + j * 29) % 255) - 127);
    float *Y = kvl_alloc(M * n_out * sizeof(float)), *Yd = kvl_alloc(M * n_out * sizeof(float));
    float *Y1 = kvl_alloc(n_out * sizeof(float)), *Ys = kvl_alloc(M * n_out * sizeof(float));
    const char *name = gguf_dtype_name(t);

    static const int64_t ms[] = {1, 3, 17};
    for (int mi = 0; mi < 3; mi++) {
        const int64_t m = ms[mi];
        run_matmul(W, t, n_out, k, X, m, Y);
        matmul_direct(W, t, n_out, k, X, m, Yd);
        CHECK(memcmp(Y, Yd, m * n_out * sizeof(float)) == 0, "%s m=%lld: matmul != vec_dot", name,
              (long long)m);
        /* against float math on the unquantized values */
        double err = 0, mag = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n_out; j++) {
                double abs_sum;
                const double want = dot_double(X + i * k, wf + j * k, k, &abs_sum);
                err = fmax(err, fabs(Y[i * n_out + j] - want));
                mag = fmax(mag, abs_sum);
            }
        const double tol = 2.0 * (roundtrip_bound(t) + roundtrip_bound(GGUF_DT_Q8_0)) * mag + 1e-6;
        CHECK(err <= tol, "%s m=%lld: max error %g > %g", name, (long long)m, err, tol);
    }
    /* batch invariance: row i of an m=17 product equals the m=1 product of row i */
    run_matmul(W, t, n_out, k, X, M, Y);
    for (int64_t i = 0; i < M; i++) {
        run_matmul(W, t, n_out, k, X + i * k, 1, Y1);
        CHECK(memcmp(Y1, Y + i * n_out, n_out * sizeof(float)) == 0, "%s: row %lld batch-variant",
              name, (long long)i);
    }
    /* thread-count invariance */
    const int nthreads = kvl_pool_threads();
    kvl_pool_set_threads(1);
    run_matmul(W, t, n_out, k, X, M, Ys);
    kvl_pool_set_threads(2);
    run_matmul(W, t, n_out, k, X, M, Yd);
    kvl_pool_set_threads(nthreads);
    CHECK(memcmp(Ys, Y, M * n_out * sizeof(float)) == 0, "%s: 1 thread differs", name);
    CHECK(memcmp(Yd, Y, M * n_out * sizeof(float)) == 0, "%s: 2 threads differ", name);
    /* ISA invariance */
    for (int a = 0; a < 3; a++) {
        if (!use_isa(a)) continue;
        run_matmul(W, t, n_out, k, X, M, Ys);
        CHECK(memcmp(Ys, Y, M * n_out * sizeof(float)) == 0, "%s: matmul on %s differs", name,
              isa_list[a]);
    }
    kern_init("auto");
    kvl_free(wf), kvl_free(X), kvl_free(W), kvl_free(Y), kvl_free(Yd), kvl_free(Y1), kvl_free(Ys);
}

static void test_matmul(void) {
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) test_matmul_type(weight_types[ti]);
}

/* Every GEMM path (packed quantized, in-place float) against vec_dot over
 * shapes that hit partial panels, partial tiles, odd k and single rows. */
static void test_matmul_shapes(void) {
    static const int64_t ms[] = {1, 2, 4, 5, 6, 7, 8, 9, 13, 16, 25};
    static const int64_t ns[] = {1, 4, 15, 16, 17, 33};
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int t = weight_types[ti];
        const int be = gguf_dtype_traits_of(t)->block_elems;
        const int64_t ks[] = {be == 1 ? 7 : be, be == 1 ? 40 : 3 * be, be == 1 ? 256 : 8 * be};
        for (int ki = 0; ki < 3; ki++) {
            const int64_t k = ks[ki], nmax = 33, mmax = 25;
            float *wf, *X = kvl_alloc(mmax * k * sizeof(float));
            char *W = random_weights(t, nmax, k, &wf);
            fill_data(X, mmax * k, 1.0f);
            float *Y = kvl_alloc(mmax * nmax * sizeof(float)),
                  *Yd = kvl_alloc(mmax * nmax * sizeof(float));
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                    const int64_t m = ms[mi], n = ns[ni];
                    run_matmul(W, t, n, k, X, m, Y);
                    matmul_direct(W, t, n, k, X, m, Yd);
                    CHECK(memcmp(Y, Yd, m * n * sizeof(float)) == 0,
                          "%s k=%lld n=%lld m=%lld: matmul != vec_dot", gguf_dtype_name(t),
                          (long long)k, (long long)n, (long long)m);
                }
            kvl_free(wf), kvl_free(X), kvl_free(W), kvl_free(Y), kvl_free(Yd);
        }
    }
}

/* Repacked weights (where the active ISA has a layout for the type): the
 * repacked matmul against vec_dot, bit for bit, over shapes with partial
 * panels and tiles, m = 1 (decode) to several tiles, and 1 or 2 threads. */
/* Weights of type t from pool (valid quantized blocks, quantized once per
 * type: the reference quantizers of the K types are slow), n rows of k. */
static char *pool_weights(const char *pool, int t, int64_t n, int64_t k) {
    const size_t bytes = (size_t)n * kern_row_bytes(t, k);
    char *W = kvl_alloc(bytes);
    memcpy(W, pool, bytes);
    return W;
}
#define REPACK_POOL_ROWS 301
#define REPACK_POOL_K    2048

static void repack_case(int t, int64_t n, int64_t k, const int64_t *ms, size_t nm,
                        const char *pool) {
    const int64_t mmax = ms[nm - 1];
    float *X = kvl_alloc(mmax * k * sizeof(float));
    char *W = pool_weights(pool, t, n, k);
    fill_data(X, mmax * k, 1.0f);
    /* row 0: values whose quantization ties (x / d = n + 0.5: roundf's half
     * away from zero for Q8_0, rint's half to even for Q8_K); row 1 starts
     * with an all-zero block and super-block (d = 0) */
    for (int64_t j = 0; j < k; j++) X[j] = (float)(j % 32 - 16) * 0.5f;
    if (mmax > 1)
        for (int64_t j = 0; j < 256 && j < k; j++) X[k + j] = 0.0f;
    if (t == GGUF_DT_MXFP4) /* the scale bytes 0, 1 (subnormal scales) and 2, here and there */
        for (int64_t b = 0; b < n * (k / QK_MXFP4); b += 5)
            ((blk_mxfp4 *)W)[b].e = (uint8_t)(b % 3);
    const size_t pbytes = kern_repack_bytes(t, n, k);
    void *P = kvl_alloc(pbytes);
    kern_repack(W, t, n, k, P);
    float *Y = kvl_alloc(mmax * n * sizeof(float)), *Yd = kvl_alloc(mmax * n * sizeof(float));
    void *work = kvl_alloc(kern_matmul_work_bytes(t, mmax, k));
    const int nthreads = kvl_pool_threads();
    for (size_t mi = 0; mi < nm; mi++) {
        const int64_t m = ms[mi];
        matmul_direct(W, t, n, k, X, m, Yd);
        for (int th = 1; th <= 2; th++) {
            kvl_pool_set_threads(th);
            for (int64_t i = 0; i < m * n; i++) Y[i] = -1.0f;
            kern_matmul_repacked(P, t, n, k, X, m, Y, work);
            CHECK(memcmp(Y, Yd, m * n * sizeof(float)) == 0,
                  "%s repacked k=%lld n=%lld m=%lld threads=%d: != vec_dot", gguf_dtype_name(t),
                  (long long)k, (long long)n, (long long)m, th);
        }
    }
    kvl_pool_set_threads(nthreads);
    kvl_free(X), kvl_free(W), kvl_free(P), kvl_free(Y), kvl_free(Yd), kvl_free(work);
}

/* kern_matmul_repacked_each (decode of a mixture-of-experts layer): matrices
 * of type t, each with an x of its own or one shared with the one before it
 * (gate and up), of two widths (gate/up and down), one after the other: each
 * y bit-identical to vec_dot, on 1 and 2 threads. */
static void test_repack_each(int t, const char *pool) {
    const int be = gguf_dtype_traits_of(t)->block_elems;
    const int64_t k1 = 8 * be, k2 = 3 * be, n1 = 77, n2 = 33;
    enum { NW = 9 };
    kern_repacked_one mats[NW];
    char *W[NW];
    void *P[NW];
    float *X[NW], *Y[NW], *Yd = kvl_alloc((n1 > n2 ? n1 : n2) * sizeof(float));
    for (int w = 0; w < NW; w++) {
        const bool wide = w < 6;
        const int64_t n = wide ? n1 : n2, k = wide ? k1 : k2;
        W[w] = kvl_alloc((size_t)n * kern_row_bytes(t, k));
        /* a different slice of the pool per matrix */
        memcpy(W[w], pool + (size_t)w * 16 * kern_row_bytes(t, k),
               (size_t)n * kern_row_bytes(t, k));
        P[w] = kvl_alloc(kern_repack_bytes(t, n, k));
        kern_repack(W[w], t, n, k, P[w]);
        X[w] = kvl_alloc(k * sizeof(float));
        fill_data(X[w], k, 1.0f + 0.25f * (float)w);
        Y[w] = kvl_alloc(n * sizeof(float));
        const float *x = wide && w % 2 ? X[w - 1] : X[w]; /* gate and up share x */
        mats[w] = (kern_repacked_one){P[w], t, n, k, x, Y[w]};
    }
    void *work = kvl_alloc(kern_matmul_repacked_each_work_bytes(NW, mats));
    const int nthreads = kvl_pool_threads();
    for (int th = 1; th <= 2; th++) {
        kvl_pool_set_threads(th);
        for (int w = 0; w < NW; w++)
            for (int64_t i = 0; i < mats[w].n_out; i++) Y[w][i] = -1.0f;
        kern_matmul_repacked_each(NW, mats, work);
        for (int w = 0; w < NW; w++) {
            matmul_direct(W[w], t, mats[w].n_out, mats[w].k, mats[w].x, 1, Yd);
            CHECK(memcmp(Y[w], Yd, mats[w].n_out * sizeof(float)) == 0,
                  "%s repacked each, matrix %d, threads=%d: != vec_dot", gguf_dtype_name(t), w, th);
        }
    }
    kvl_pool_set_threads(nthreads);
    for (int w = 0; w < NW; w++) kvl_free(W[w]), kvl_free(P[w]), kvl_free(X[w]), kvl_free(Y[w]);
    kvl_free(Yd), kvl_free(work);
}

/* kern_matmul_repacked_gated (decode of a mixture-of-experts layer in one
 * region): ne experts of type t, the last one twice as wide (a shared
 * expert), each gate and up on one shared x, an activation made by the hook,
 * then down on it; in one region (3 experts) and past KERN_EACH_MAX matrices
 * (14: the three steps). Every y bit-identical to vec_dot of the same steps,
 * on 1 and 2 threads. */
typedef struct {
    float *const *g, *const *u;
    const int64_t *width;
} gated_hook_ctx;

static void gated_hook(void *vctx, int e) {
    const gated_hook_ctx *c = vctx;
    for (int64_t i = 0; i < c->width[e]; i++) c->g[e][i] = c->g[e][i] * 0.5f + c->u[e][i];
}

static void test_repack_gated(int t, const char *pool) {
    const int be = gguf_dtype_traits_of(t)->block_elems;
    enum { NE_MAX = 14 };
    const int64_t E = 2 * be, n_down = 33;
    static const int nes[] = {3, NE_MAX};
    float *x = kvl_alloc(E * sizeof(float));
    fill_data(x, E, 1.0f);
    for (size_t ci = 0; ci < sizeof nes / sizeof nes[0]; ci++) {
        const int ne = nes[ci];
        kern_repacked_one gu[2 * NE_MAX], down[NE_MAX];
        char *W[3 * NE_MAX];
        void *P[3 * NE_MAX];
        float *G[NE_MAX], *U[NE_MAX], *D[NE_MAX], *Gd = kvl_alloc(2 * be * sizeof(float)),
                                                  *Ud = kvl_alloc(2 * be * sizeof(float)),
                                                  *Dd = kvl_alloc(n_down * sizeof(float));
        int64_t width[NE_MAX];
        for (int w = 0; w < 3 * ne; w++) {
            const int e = w < 2 * ne ? w / 2 : w - 2 * ne;
            const int64_t F = e == ne - 1 ? 2 * be : be;
            const int64_t n = w < 2 * ne ? F : n_down, k = w < 2 * ne ? E : F;
            width[e] = F;
            W[w] = kvl_alloc((size_t)n * kern_row_bytes(t, k));
            memcpy(W[w], pool + (size_t)(w % 3) * 16 * kern_row_bytes(t, k),
                   (size_t)n * kern_row_bytes(t, k));
            P[w] = kvl_alloc(kern_repack_bytes(t, n, k));
            kern_repack(W[w], t, n, k, P[w]);
        }
        for (int e = 0; e < ne; e++) {
            G[e] = kvl_alloc(width[e] * sizeof(float));
            U[e] = kvl_alloc(width[e] * sizeof(float));
            D[e] = kvl_alloc(n_down * sizeof(float));
            gu[2 * e] = (kern_repacked_one){P[2 * e], t, width[e], E, x, G[e]};
            gu[2 * e + 1] = (kern_repacked_one){P[2 * e + 1], t, width[e], E, x, U[e]};
            down[e] = (kern_repacked_one){P[2 * ne + e], t, n_down, width[e], G[e], D[e]};
        }
        void *work = kvl_alloc(kern_matmul_repacked_gated_work_bytes(ne, gu, down));
        gated_hook_ctx hc = {G, U, width};
        const int nthreads = kvl_pool_threads();
        for (int th = 1; th <= 2; th++) {
            kvl_pool_set_threads(th);
            for (int e = 0; e < ne; e++)
                for (int64_t i = 0; i < n_down; i++) D[e][i] = -1.0f;
            kern_matmul_repacked_gated(ne, gu, down, gated_hook, &hc, work);
            for (int e = 0; e < ne; e++) {
                matmul_direct(W[2 * e], t, width[e], E, x, 1, Gd);
                matmul_direct(W[2 * e + 1], t, width[e], E, x, 1, Ud);
                for (int64_t i = 0; i < width[e]; i++) Gd[i] = Gd[i] * 0.5f + Ud[i];
                CHECK(memcmp(G[e], Gd, width[e] * sizeof(float)) == 0,
                      "%s repacked gated, %d experts, expert %d's activation, threads=%d: != "
                      "vec_dot",
                      gguf_dtype_name(t), ne, e, th);
                matmul_direct(W[2 * ne + e], t, n_down, width[e], Gd, 1, Dd);
                CHECK(memcmp(D[e], Dd, n_down * sizeof(float)) == 0,
                      "%s repacked gated, %d experts, expert %d's down, threads=%d: != vec_dot",
                      gguf_dtype_name(t), ne, e, th);
            }
        }
        kvl_pool_set_threads(nthreads);
        for (int w = 0; w < 3 * ne; w++) kvl_free(W[w]), kvl_free(P[w]);
        for (int e = 0; e < ne; e++) kvl_free(G[e]), kvl_free(U[e]), kvl_free(D[e]);
        kvl_free(Gd), kvl_free(Ud), kvl_free(Dd), kvl_free(work);
    }
    kvl_free(x);
}

/* kern_matmul_repacked_rows (a batched decode step of a mixture-of-experts
 * layer): matrices of type t, each on m rows of its own given as pointers into
 * one X in scattered order, pairs sharing their rows (gate and up), m from 1
 * to past two tiles, two widths; the second call with a hook that writes each
 * row before it is prepared (the activation). Each y bit-identical to vec_dot
 * on the gathered rows, on 1 and 2 threads. */
typedef struct {
    float *const *rows; /* per matrix: its rows, written by the hook */
    int64_t k;
} rows_hook_ctx;

static void rows_hook(void *vctx, int mat, int64_t row) {
    const rows_hook_ctx *c = vctx;
    float *x = c->rows[mat] + row * c->k;
    for (int64_t i = 0; i < c->k; i++) x[i] = x[i] * 0.5f + (float)(row + mat) * 0.01f;
}

static void test_repack_rows(int t, const char *pool) {
    const int be = gguf_dtype_traits_of(t)->block_elems;
    enum { NW = 8, XR = 40 };
    static const int64_t ms[NW] = {2, 2, 1, 1, 7, 7, 13, 3};
    for (int pass = 0; pass < 2; pass++) {
        const bool hook = pass == 1;
        const int64_t k = hook ? 3 * be : 8 * be;
        const int64_t nouts[2] = {77, 33};
        float *X = kvl_alloc(XR * k * sizeof(float));
        fill_data(X, XR * k, 1.0f);
        kern_repacked_rows mats[NW];
        char *W[NW];
        void *P[NW];
        float *Y[NW], *G[NW], *Yd = kvl_alloc(16 * 77 * sizeof(float));
        const float *ptrs[NW][16];
        float *grows[NW]; /* the hook's rows (gathered, one block per matrix) */
        size_t bytes = 64;
        for (int w = 0; w < NW; w++) {
            const int64_t n = nouts[w % 2], m = ms[w];
            W[w] = kvl_alloc((size_t)n * kern_row_bytes(t, k));
            memcpy(W[w], pool + (size_t)w * 16 * kern_row_bytes(t, k),
                   (size_t)n * kern_row_bytes(t, k));
            P[w] = kvl_alloc(kern_repack_bytes(t, n, k));
            kern_repack(W[w], t, n, k, P[w]);
            Y[w] = kvl_alloc(m * n * sizeof(float));
            G[w] = kvl_alloc(m * k * sizeof(float));
            grows[w] = G[w];
            /* gate and up: the same pointers (the last pair: the first 3 of 13, not shared) */
            const bool share = !hook && w % 2 == 1;
            for (int64_t i = 0; i < m; i++) {
                const int64_t xr = (w * 7 + i * 13) % XR; /* scattered, repeated rows */
                if (hook) {
                    memcpy(G[w] + i * k, X + xr * k, k * sizeof(float));
                    ptrs[w][i] = G[w] + i * k;
                } else {
                    ptrs[w][i] = X + xr * k;
                }
            }
            mats[w] = (kern_repacked_rows){P[w], t, n, k, m, share ? ptrs[w - 1] : ptrs[w], Y[w]};
            bytes += kern_matmul_repacked_rows_work_bound(t, k, m, 1);
        }
        void *work = kvl_alloc(bytes);
        rows_hook_ctx hc = {grows, k};
        const int nthreads = kvl_pool_threads();
        for (int th = 1; th <= 2; th++) {
            kvl_pool_set_threads(th);
            for (int w = 0; w < NW; w++) {
                for (int64_t i = 0; i < ms[w] * mats[w].n_out; i++) Y[w][i] = -1.0f;
                if (hook)
                    for (int64_t i = 0; i < ms[w]; i++)
                        memcpy(G[w] + i * k, X + ((w * 7 + i * 13) % XR) * k, k * sizeof(float));
            }
            kern_matmul_repacked_rows(NW, mats, hook ? rows_hook : NULL, &hc, work);
            for (int w = 0; w < NW; w++) {
                float *xg = kvl_alloc(ms[w] * k * sizeof(float));
                for (int64_t i = 0; i < ms[w]; i++) {
                    memcpy(xg + i * k, X + ((w * 7 + i * 13) % XR) * k, k * sizeof(float));
                    if (hook) /* what the hook wrote */
                        for (int64_t j = 0; j < k; j++)
                            xg[i * k + j] = xg[i * k + j] * 0.5f + (float)(i + w) * 0.01f;
                }
                const float *src = mats[w].x == ptrs[w] ? xg : NULL;
                float *xs = NULL;
                if (!src) { /* the pair's rows */
                    xs = kvl_alloc(ms[w] * k * sizeof(float));
                    for (int64_t i = 0; i < ms[w]; i++)
                        memcpy(xs + i * k, mats[w].x[i], k * sizeof(float));
                    src = xs;
                }
                matmul_direct(W[w], t, mats[w].n_out, k, src, ms[w], Yd);
                CHECK(memcmp(Y[w], Yd, ms[w] * mats[w].n_out * sizeof(float)) == 0,
                      "%s repacked rows%s, matrix %d (m=%lld), threads=%d: != vec_dot",
                      gguf_dtype_name(t), hook ? " with hook" : "", w, (long long)ms[w], th);
                kvl_free(xg), kvl_free(xs);
            }
        }
        kvl_pool_set_threads(nthreads);
        for (int w = 0; w < NW; w++) kvl_free(W[w]), kvl_free(P[w]), kvl_free(Y[w]), kvl_free(G[w]);
        kvl_free(X), kvl_free(Yd), kvl_free(work);
    }
}

static void test_repack(void) {
    int tested = 0;
    char *pool[N_WEIGHT_TYPES] = {0};
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int t = weight_types[ti];
        const int be = gguf_dtype_traits_of(t)->block_elems;
        if (!kern_repack_bytes(t, 16, be)) continue;
        float *wf;
        pool[ti] = random_weights(t, REPACK_POOL_ROWS, REPACK_POOL_K, &wf);
        kvl_free(wf);
        tested++;
        static const int64_t ms[] = {1, 2, 3, 5, 6, 7, 8, 9, 13, 16, 25};
        static const int64_t ns[] = {1, 15, 16, 17, 33};
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (int kb = 1; kb <= 8; kb *= 2)
                repack_case(t, ns[ni], kb * be, ms, sizeof ms / sizeof ms[0], pool[ti]);
        static const int64_t big_ms[] = {1, 4, 17, 64};
        repack_case(t, REPACK_POOL_ROWS, REPACK_POOL_K, big_ms, 4, pool[ti]);
    }
    /* several matrices over one prepared input (Q/K/V, gate/up), mixed types
     * where they share an activation layout */
    for (int ta = 0; ta < N_WEIGHT_TYPES; ta++)
        for (int tb = 0; tb < N_WEIGHT_TYPES; tb++) {
            const int t0 = weight_types[ta], t1 = weight_types[tb];
            if (!kern_repacked_share_input(t0, t1)) continue;
            const int64_t k = 512, ns[3] = {301, 17, 64}, mlist[] = {1, 7};
            const int types[3] = {t0, t1, t0};
            const char *pools[3] = {pool[ta], pool[tb], pool[ta]};
            float *X = kvl_alloc(7 * k * sizeof(float));
            fill_data(X, 7 * k, 1.0f);
            char *W[3];
            void *P[3];
            float *Y[3], *Yd[3];
            for (int i = 0; i < 3; i++) {
                W[i] = pool_weights(pools[i], types[i], ns[i], k);
                P[i] = kvl_alloc(kern_repack_bytes(types[i], ns[i], k));
                kern_repack(W[i], types[i], ns[i], k, P[i]);
                Y[i] = kvl_alloc(7 * ns[i] * sizeof(float));
                Yd[i] = kvl_alloc(7 * ns[i] * sizeof(float));
            }
            void *work =
                kvl_alloc(kern_matmul_work_bytes(t0, 7, k) + kern_matmul_work_bytes(t1, 7, k));
            for (int mi = 0; mi < 2; mi++) {
                const int64_t m = mlist[mi];
                kern_repacked_mat mats[3];
                for (int i = 0; i < 3; i++)
                    mats[i] = (kern_repacked_mat){P[i], types[i], ns[i], Y[i]};
                kern_matmul_repacked_multi(3, mats, k, X, m, work);
                for (int i = 0; i < 3; i++) {
                    matmul_direct(W[i], types[i], ns[i], k, X, m, Yd[i]);
                    CHECK(memcmp(Y[i], Yd[i], m * ns[i] * sizeof(float)) == 0,
                          "%s+%s multi m=%lld: matrix %d != vec_dot", gguf_dtype_name(t0),
                          gguf_dtype_name(t1), (long long)m, i);
                }
            }
            for (int i = 0; i < 3; i++)
                kvl_free(W[i]), kvl_free(P[i]), kvl_free(Y[i]), kvl_free(Yd[i]);
            kvl_free(X), kvl_free(work);
        }
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++)
        if (pool[ti]) test_repack_each(weight_types[ti], pool[ti]);
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++)
        if (pool[ti]) test_repack_rows(weight_types[ti], pool[ti]);
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++)
        if (pool[ti]) test_repack_gated(weight_types[ti], pool[ti]);
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) kvl_free(pool[ti]);
    printf("repacked layouts tested: %d type(s) on %s\n", tested, kern_isa_name());
}

/* ---------- attention ---------- */

static void test_attn_exp(void) {
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        const float x = -87.0f * (float)i / 200000.0f;
        const double want = exp((double)x), got = kern_expf(x);
        worst = fmax(worst, fabs(got - want) / want);
    }
    CHECK(worst < 4e-7, "kern_expf relative error %g", worst);
    CHECK(kern_expf(0.0f) == 1.0f && kern_expf(-0.0f) == 1.0f, "kern_expf(0) is 1");
    CHECK(kern_expf(5.0f) == 1.0f && kern_expf(-1000.0f) == kern_expf(-87.0f), "kern_expf clamps");
}

static bool same_floats(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* kern_read_sum (the bandwidth probe's stream) on every ISA: the wrapping
 * sum of the 64-bit words, whatever the loads (lengths with and without a
 * partial step of 256 bytes). */
static void test_read_sum(void) {
    const size_t n = 4096 + 192;
    uint64_t *w = kvl_alloc(n);
    for (size_t i = 0; i < n / 8; i++) w[i] = rng_u64();
    for (size_t len = 0; len <= n; len += 64) {
        uint64_t want = 0;
        for (size_t i = 0; i < len / 8; i++) want += w[i];
        for (int a = 0; a < 3; a++)
            if (use_isa(a))
                CHECK(kern_read_sum(w, len) == want, "read_sum on %s, %zu bytes", isa_list[a], len);
    }
    kern_init("auto");
    kvl_free(w);
}

/* kern_silu_mul against double math, and every ISA against the reference. */
static void test_silu(void) {
    const int64_t n = 1037;
    float *g = kvl_alloc(n * sizeof(float)), *u = kvl_alloc(n * sizeof(float));
    float *r0 = kvl_alloc(n * sizeof(float)), *r1 = kvl_alloc(n * sizeof(float));
    fill_data(g, n, 4.0f);
    fill_data(u, n, 1.0f);
    g[0] = 0.0f, g[1] = -0.0f, g[2] = 90.0f, g[3] = -90.0f, g[4] = 1e-30f;
    memcpy(r0, g, n * sizeof(float));
    kref_attn.silu_mul(r0, u, n);
    double err = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i], want = x / (1.0 + exp(-x)) * u[i];
        err = fmax(err, fabs(r0[i] - want) / (fabs(x * u[i]) + 1e-30));
    }
    CHECK(err < 1e-6, "silu_mul: relative error %g", err);
    for (int isa = 1; isa <= 2; isa++) {
        if (!isa_ok[isa]) continue;
        for (int64_t len = n; len > n - 20; len--) { /* every tail length */
            memcpy(r1, g, n * sizeof(float));
            (isa == 1 ? &kavx2_attn : &kavx512_attn)->silu_mul(r1, u, len);
            CHECK(same_floats(r0, r1, len) && same_floats(g + len, r1 + len, n - len),
                  "silu_mul on %s (n=%lld) differs", isa_list[isa], (long long)len);
        }
    }
    kvl_free(g), kvl_free(u), kvl_free(r0), kvl_free(r1);
}

/* kern_hadamard: the reference against the Sylvester matrix in double (and
 * twice = the identity), every ISA against the reference bit for bit. */
static void test_hadamard(void) {
    static const int64_t sizes[] = {16, 64, 128, 256, 512};
    for (int si = 0; si < 5; si++) {
        const int64_t n = sizes[si], runs = 3;
        float *x = kvl_alloc(runs * n * sizeof(float)), *r0 = kvl_alloc(runs * n * sizeof(float)),
              *r1 = kvl_alloc(runs * n * sizeof(float));
        fill_data(x, runs * n, 2.0f);
        memcpy(r0, x, runs * n * sizeof(float));
        kref_attn.hadamard(r0, runs, n);
        double err = 0;
        for (int64_t r = 0; r < runs; r++)
            for (int64_t i = 0; i < n; i++) {
                double want = 0; /* H[i][j] = (-1)^popcount(i & j) / sqrt(n) */
                for (int64_t j = 0; j < n; j++)
                    want += (__builtin_popcountll((unsigned long long)(i & j)) & 1 ? -1.0 : 1.0) *
                            x[r * n + j];
                err = fmax(err, fabs(r0[r * n + i] - want / sqrt((double)n)));
            }
        CHECK(err < 1e-5, "hadamard n=%lld: |error| %g against the matrix", (long long)n, err);
        memcpy(r1, r0, runs * n * sizeof(float));
        kref_attn.hadamard(r1, runs, n);
        double back = 0;
        for (int64_t i = 0; i < runs * n; i++) back = fmax(back, fabs(r1[i] - x[i]));
        CHECK(back < 1e-5, "hadamard n=%lld twice: |error| %g", (long long)n, back);
        for (int isa = 1; isa <= 2; isa++) {
            if (!isa_ok[isa]) continue;
            memcpy(r1, x, runs * n * sizeof(float));
            (isa == 1 ? &kavx2_attn : &kavx512_attn)->hadamard(r1, runs, n);
            CHECK(same_floats(r0, r1, runs * n), "hadamard on %s (n=%lld) differs", isa_list[isa],
                  (long long)n);
        }
        kvl_free(x), kvl_free(r0), kvl_free(r1);
    }
}

/* Each attention kernel on every ISA against the reference, bit for bit, and
 * the reference against double-precision math. */
/* A SIMD set's scores and e.V over cache rows of type kt read in place,
 * against the reference's s0 and o0 (o starting from oinit), bit for bit. */
static void check_rows_in_place(const kern_attn_ops *simd, int64_t n, int64_t d, int nq,
                                const float *q, size_t qs, const void **rows, int kt,
                                const float *s0, size_t ss, const float *o0, const float *oinit,
                                float *s1, float *o1) {
    simd->scores(n, d, nq, q, qs, rows, kt, 0.125f, s1, ss);
    memcpy(o1, oinit, nq * qs * sizeof(float));
    simd->pv(n, d, nq, s0, ss, rows, kt, o1, qs);
    for (int h = 0; h < nq; h++)
        CHECK(same_floats(s0 + h * ss, s1 + h * ss, n) && same_floats(o0 + h * qs, o1 + h * qs, d),
              "attn %s rows d=%lld n=%lld nq=%d: %s differs from the reference",
              gguf_dtype_name(kt), (long long)d, (long long)n, nq,
              simd == &kavx2_attn ? "avx2" : "avx512");
}

static void test_attn(void) {
    static const int64_t dks[] = {1, 5, 8, 15, 16, 33, 64, 128, 576};
    static const int64_t npos[] = {1, 5, 16, 17, 40, 256};
    static const int nqs[] = {1, 3, 4, 7, 9, 12, 16, 17}; /* 8-head tiles: 9 and up; m0.. hold 32 */
    const kern_attn_ops *simd[] = {isa_ok[1] ? &kavx2_attn : NULL,
                                   isa_ok[2] ? &kavx512_attn : NULL};
    for (size_t di = 0; di < sizeof dks / sizeof dks[0]; di++)
        for (size_t pi = 0; pi < sizeof npos / sizeof npos[0]; pi++)
            for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++) {
                const int64_t d = dks[di], n = npos[pi];
                const int nq = nqs[qi];
                const size_t qs = (size_t)d + 3, ks = (size_t)d + 5, ss = (size_t)n + 2;
                float *q = kvl_alloc(nq * qs * sizeof(float)),
                      *k = kvl_alloc(n * ks * sizeof(float));
                float *s0 = kvl_alloc(nq * ss * sizeof(float)),
                      *s1 = kvl_alloc(nq * ss * sizeof(float));
                float *o0 = kvl_alloc(nq * qs * sizeof(float)),
                      *o1 = kvl_alloc(nq * qs * sizeof(float));
                fill_data(q, nq * qs, 1.0f);
                fill_data(k, n * ks, 1.0f);
                fill_data(o0, nq * qs, 1.0f);
                float *oinit = kvl_alloc(nq * qs * sizeof(float));
                memcpy(oinit, o0, nq * qs * sizeof(float));
                const void **kr = kvl_alloc(n * sizeof *kr);
                for (int64_t j = 0; j < n; j++) kr[j] = k + j * ks;
                kref_attn.scores(n, d, nq, q, qs, kr, GGUF_DT_F32, 0.125f, s0, ss);
                double err = 0;
                for (int h = 0; h < nq; h++)
                    for (int64_t j = 0; j < n; j++) {
                        double abs_sum;
                        const double want = 0.125 * dot_double(q + h * qs, k + j * ks, d, &abs_sum);
                        err = fmax(err, fabs(s0[h * ss + j] - want) / (0.125 * abs_sum + 1e-30));
                    }
                CHECK(err < 1e-5, "attn scores d=%lld n=%lld: relative error %g", (long long)d,
                      (long long)n, err);
                /* softmax of the scores row by row, pv with them as weights, v = k */
                float m0[32], l0[32], m1[32], l1[32]; /* nqs up to 32 */
                for (int h = 0; h < nq; h++) m0[h] = kref_attn.softmax(n, s0 + h * ss, &l0[h]);
                kref_attn.pv(n, d, nq, s0, ss, kr, GGUF_DT_F32, o0, qs);
                for (size_t v = 0; v < sizeof simd / sizeof simd[0]; v++) {
                    if (!simd[v]) continue;
                    simd[v]->scores(n, d, nq, q, qs, kr, GGUF_DT_F32, 0.125f, s1, ss);
                    for (int h = 0; h < nq; h++) {
                        kref_attn.scores(n, d, 1, q + h * qs, qs, kr, GGUF_DT_F32, 0.125f,
                                         s0 + h * ss, ss);
                        CHECK(same_floats(s0 + h * ss, s1 + h * ss, n),
                              "attn scores d=%lld n=%lld nq=%d differ", (long long)d, (long long)n,
                              nq);
                        m0[h] = kref_attn.softmax(n, s0 + h * ss, &l0[h]);
                        m1[h] = simd[v]->softmax(n, s1 + h * ss, &l1[h]);
                        CHECK(same_bits(m0[h], m1[h]) && same_bits(l0[h], l1[h]) &&
                                  same_floats(s0 + h * ss, s1 + h * ss, n),
                              "attn softmax n=%lld differs", (long long)n);
                    }
                    memcpy(o1, oinit, nq * qs * sizeof(float));
                    simd[v]->pv(n, d, nq, s1, ss, kr, GGUF_DT_F32, o1, qs);
                    for (int h = 0; h < nq; h++)
                        CHECK(same_floats(o0 + h * qs, o1 + h * qs, d),
                              "attn pv d=%lld n=%lld nq=%d differs", (long long)d, (long long)n,
                              nq);
                }
                /* F16 and BF16 rows, read in place */
                for (int ti = 0; ti < 2; ti++) {
                    const int kt = ti ? GGUF_DT_BF16 : GGUF_DT_F16;
                    uint16_t *kh = kvl_alloc(n * ks * sizeof(uint16_t));
                    const void **khr = kvl_alloc(n * sizeof *khr);
                    for (int64_t i = 0; i < (int64_t)(n * ks); i++)
                        kh[i] = ti ? kvl_f32_to_bf16(k[i]) : kvl_f32_to_f16(k[i]);
                    for (int64_t j = 0; j < n; j++) khr[j] = kh + j * ks;
                    kref_attn.scores(n, d, nq, q, qs, khr, kt, 0.125f, s0, ss);
                    memcpy(o0, oinit, nq * qs * sizeof(float));
                    kref_attn.pv(n, d, nq, s0, ss, khr, kt, o0, qs);
                    for (size_t v = 0; v < sizeof simd / sizeof simd[0]; v++)
                        if (simd[v])
                            check_rows_in_place(simd[v], n, d, nq, q, qs, khr, kt, s0, ss, o0,
                                                oinit, s1, o1);
                    kvl_free(kh), kvl_free(khr);
                }
                /* block-type rows (Q8_0 and the 4- / 5-bit cache types), read in
                 * place: the same as the rows widened by to_float (what attention
                 * reads for the other types) */
                static const int block_kv[] = {GGUF_DT_Q8_0, GGUF_DT_Q5_0, GGUF_DT_Q4_0,
                                               GGUF_DT_IQ4_NL};
                for (size_t bi = 0; d % 32 == 0 && bi < sizeof block_kv / sizeof *block_kv; bi++) {
                    const int bt = block_kv[bi];
                    const kern_traits *tr = kern_traits_of(bt);
                    const size_t rb = kern_row_bytes(bt, d);
                    char *kq = kvl_alloc(n * rb);
                    float *kw = kvl_alloc(n * d * sizeof(float)),
                          *s2 = kvl_alloc(nq * ss * sizeof(float));
                    const void **kqr = kvl_alloc(n * sizeof *kqr),
                               **kwr = kvl_alloc(n * sizeof *kwr);
                    for (int64_t j = 0; j < n; j++) {
                        kern_act_quantizer(tr)(k + j * ks, kq + j * rb, d);
                        tr->to_float(kq + j * rb, kw + j * d, d);
                        kqr[j] = kq + j * rb, kwr[j] = kw + j * d;
                    }
                    kref_attn.scores(n, d, nq, q, qs, kqr, bt, 0.125f, s0, ss);
                    kref_attn.scores(n, d, nq, q, qs, kwr, GGUF_DT_F32, 0.125f, s2, ss);
                    memcpy(o0, oinit, nq * qs * sizeof(float));
                    kref_attn.pv(n, d, nq, s0, ss, kqr, bt, o0, qs);
                    memcpy(o1, oinit, nq * qs * sizeof(float));
                    kref_attn.pv(n, d, nq, s0, ss, kwr, GGUF_DT_F32, o1, qs);
                    for (int h = 0; h < nq; h++)
                        CHECK(same_floats(s0 + h * ss, s2 + h * ss, n) &&
                                  same_floats(o0 + h * qs, o1 + h * qs, d),
                              "attn %s rows d=%lld n=%lld nq=%d differ from widened rows",
                              gguf_dtype_name(bt), (long long)d, (long long)n, nq);
                    for (size_t v = 0; v < sizeof simd / sizeof simd[0]; v++)
                        if (simd[v])
                            check_rows_in_place(simd[v], n, d, nq, q, qs, kqr, bt, s0, ss, o0,
                                                oinit, s1, o1);
                    kvl_free(kq), kvl_free(kw), kvl_free(s2), kvl_free(kqr), kvl_free(kwr);
                }
                kvl_free(q), kvl_free(k), kvl_free(s0), kvl_free(s1), kvl_free(o0), kvl_free(o1),
                    kvl_free(oinit);
                kvl_free(kr);
            }
    /* merge: nc chunk partials against the same result in double */
    static const int64_t dvs[] = {1, 16, 20, 64, 512};
    for (size_t di = 0; di < sizeof dvs / sizeof dvs[0]; di++)
        for (int nc = 1; nc <= 5; nc++) {
            const int64_t dv = dvs[di];
            const int nq = 3;
            const size_t cs = (size_t)nq * (dv + 2);
            float *part = kvl_alloc(nc * cs * sizeof(float));
            float *out0 = kvl_alloc(nq * dv * sizeof(float)),
                  *out1 = kvl_alloc(nq * dv * sizeof(float));
            for (int c = 0; c < nc; c++)
                for (int h = 0; h < nq; h++) {
                    part[c * cs + h] = 3.0f * rng_gauss();
                    part[c * cs + nq + h] = 1.0f + 10.0f * (float)rng_unit();
                    for (int64_t i = 0; i < dv; i++)
                        part[c * cs + 2 * nq + h * dv + i] = rng_gauss();
                }
            kref_attn.merge(nc, nq, dv, part, out0, dv);
            double err = 0;
            for (int h = 0; h < nq; h++) {
                double M = -1e30;
                for (int c = 0; c < nc; c++) M = fmax(M, part[c * cs + h]);
                for (int64_t i = 0; i < dv; i++) {
                    double num = 0, den = 0, mag = 0;
                    for (int c = 0; c < nc; c++) {
                        const double w = exp(part[c * cs + h] - M);
                        num += w * part[c * cs + 2 * nq + h * dv + i];
                        mag += w * fabs(part[c * cs + 2 * nq + h * dv + i]);
                        den += w * part[c * cs + nq + h];
                    }
                    err = fmax(err, fabs(out0[h * dv + i] - num / den) / (mag / den + 1e-30));
                }
            }
            CHECK(err < 2e-6, "attn merge nc=%d dv=%lld: relative error %g", nc, (long long)dv,
                  err);
            for (int isa = 1; isa <= 2; isa++) {
                if (!isa_ok[isa]) continue;
                (isa == 1 ? &kavx2_attn : &kavx512_attn)->merge(nc, nq, dv, part, out1, dv);
                CHECK(same_floats(out0, out1, nq * dv), "attn merge nc=%d dv=%lld on %s differs",
                      nc, (long long)dv, isa_list[isa]);
            }
            kvl_free(part), kvl_free(out0), kvl_free(out1);
        }
}

static void test_get_row(void) {
    const int64_t n = 512, rows = 5;
    float *x = kvl_alloc(rows * n * sizeof(float)), *y = kvl_alloc(n * sizeof(float));
    fill_data(x, rows * n, 1.0f);
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int t = weight_types[ti];
        const size_t rb = kern_row_bytes(t, n);
        char *q = kvl_alloc(rows * rb);
        kern_traits_ref(t)->from_float(x, q, rows * n);
        kern_get_row(q, t, n, 3, y);
        float *want = dequantize_ref(t, q + 3 * rb, n);
        CHECK(memcmp(y, want, n * sizeof(float)) == 0, "%s get_row", gguf_dtype_name(t));
        kvl_free(want), kvl_free(q);
    }
    kvl_free(x), kvl_free(y);
}

/* ---------- the lattice types (IQ2_XXS .. IQ1_M) ----------
 * They have no quantizer: blocks are random bytes with a finite d. */

static const int iq_types[] = {GGUF_DT_IQ2_XXS, GGUF_DT_IQ2_XS, GGUF_DT_IQ2_S, GGUF_DT_IQ3_XXS,
                               GGUF_DT_IQ3_S,   GGUF_DT_IQ1_S,  GGUF_DT_IQ1_M};
#define N_IQ_TYPES ((int)(sizeof iq_types / sizeof iq_types[0]))

static void random_iq_blocks(int t, uint8_t *p, int64_t nb) {
    const size_t bb = gguf_dtype_traits_of(t)->block_bytes;
    for (size_t i = 0; i < (size_t)nb * bb; i++) p[i] = (uint8_t)rng_u64();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * bb;
        const kvl_f16 d =
            kvl_f32_to_f16((rng_u64() & 1 ? -0.01f : 0.01f) * (float)(1 + rng_u64() % 100));
        if (t != GGUF_DT_IQ1_M) {
            memcpy(blk, &d, 2);
            continue;
        }
        for (int k = 0; k < 4; k++) { /* IQ1_M: d in the scales' top nibbles */
            uint16_t w;
            memcpy(&w, blk + 48 + 2 * k, 2);
            w = (uint16_t)((w & 0x0FFF) | ((d >> (4 * k)) & 0xF) << 12);
            memcpy(blk + 48 + 2 * k, &w, 2);
        }
    }
}

/* tests/data/DIR/TYPE.bin, or NULL (counted as a failure). */
static FILE *open_iq_fixture(const char *dir, const char *type) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/%s/%s.bin", dir, type);
    FILE *fp = fopen(path, "rb");
    CHECK(fp, "%s: cannot open %s", type, path);
    return fp;
}

/* kvllm's dequantization against llama.cpp's Python package's, bit for bit,
 * on blocks whose indices sweep each codebook (tests/data/iq_dequant,
 * tests/unit/make_iq_fixtures.py). */
static void test_iq_dequant(void) {
    for (int ti = 0; ti < N_IQ_TYPES; ti++) {
        const int t = iq_types[ti];
        const gguf_dtype_traits *f = gguf_dtype_traits_of(t);
        FILE *fp = open_iq_fixture("iq_dequant", f->name);
        if (!fp) continue;
        fseek(fp, 0, SEEK_END);
        const long size = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        const int64_t nb = size / (long)(f->block_bytes + 256 * sizeof(float));
        CHECK(nb > 0 && size == nb * (long)(f->block_bytes + 256 * sizeof(float)), "%s: size %ld",
              f->name, size);
        uint8_t *buf = kvl_alloc((size_t)size + 1);
        CHECK(fread(buf, 1, (size_t)size, fp) == (size_t)size, "%s: short read", f->name);
        fclose(fp);
        const float *want = (const float *)(buf + nb * f->block_bytes);
        float *got = kvl_alloc((size_t)nb * 256 * sizeof(float));
        kern_traits_ref(t)->to_float(buf, got, nb * 256);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < nb * 256; i++) {
            float w;
            memcpy(&w, want + i, sizeof w);
            if (!same_bits(got[i], w) && bad++ == 0) first = i;
        }
        CHECK(bad == 0, "%s: %lld of %lld values differ from llama.cpp's, first at %lld (%g vs %g)",
              f->name, (long long)bad, (long long)(nb * 256), (long long)first,
              first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
        kvl_free(got), kvl_free(buf);
    }
}

/* kern_matmul on the active kernels (the rows kernels up to KERN_ROWS_WIDE
 * rows at once, the threads' chunks) = vec_dot row by row, for m across the
 * rows kernels' group sizes. */
static void test_iq_matmul(void) {
    static const int64_t ms[] = {1, 3, 4, 5, 16, 17, 40};
    const int64_t n_out = 37, k = 768;
    for (int ti = 0; ti < N_IQ_TYPES; ti++) {
        const int t = iq_types[ti];
        uint8_t *W = kvl_alloc(n_out * kern_row_bytes(t, k));
        random_iq_blocks(t, W, n_out * k / QK_K);
        float *X = kvl_alloc(40 * k * sizeof(float)), *Y = kvl_alloc(40 * n_out * sizeof(float)),
              *want = kvl_alloc(40 * n_out * sizeof(float));
        fill_data(X, 40 * k, 1.0f);
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int64_t m = ms[mi];
            run_matmul(W, t, n_out, k, X, m, Y);
            matmul_direct(W, t, n_out, k, X, m, want);
            CHECK(memcmp(Y, want, (size_t)(m * n_out) * sizeof(float)) == 0, "%s matmul m=%lld",
                  gguf_dtype_name(t), (long long)m);
        }
        kvl_free(W), kvl_free(X), kvl_free(Y), kvl_free(want);
    }
}

/* Dot products against llama.cpp's own (tests/data/iq_dot/<TYPE>.bin: per
 * record a block count nb, nb random blocks, a Q8_K row that llama.cpp
 * quantized, and what llama.cpp 81ff7abe's CPU vec_dot (its AVX2 kernels)
 * returned for them): the same float steps, so the same bits, on every ISA. */
static void test_iq_llama_dots(void) {
    for (int ti = 0; ti < N_IQ_TYPES; ti++) {
        const int t = iq_types[ti];
        const gguf_dtype_traits *f = gguf_dtype_traits_of(t);
        FILE *fp = open_iq_fixture("iq_dot", f->name);
        if (!fp) continue;
        int records = 0;
        uint32_t nb;
        while (fread(&nb, sizeof nb, 1, fp) == 1) {
            CHECK(nb >= 1 && nb <= 16, "%s: record %d: %u blocks", f->name, records, nb);
            if (nb < 1 || nb > 16) break;
            const int64_t n = (int64_t)nb * QK_K;
            const size_t xb = kern_row_bytes(t, n), yb = kern_row_bytes(GGUF_DT_Q8_K, n);
            char *x = kvl_alloc(xb), *y = kvl_alloc(yb);
            float want, got;
            const bool ok = fread(x, 1, xb, fp) == xb && fread(y, 1, yb, fp) == yb &&
                            fread(&want, sizeof want, 1, fp) == 1;
            CHECK(ok, "%s: record %d truncated", f->name, records);
            if (ok) {
                for (int active = 0; active < 2; active++) {
                    (active ? kern_traits_of(t) : kern_traits_ref(t))->vec_dot(n, &got, x, y);
                    CHECK(same_bits(got, want), "%s record %d (n=%lld, %s): %.9g, llama.cpp %.9g",
                          f->name, records, (long long)n, active ? kern_isa_name() : "reference",
                          got, want);
                }
            }
            kvl_free(x), kvl_free(y);
            records++;
            if (!ok) break;
        }
        fclose(fp);
        CHECK(records == 8, "%s: %d records in tests/data/iq_dot", f->name, records);
    }
}

/* Dot products: the reference against exact math on its own dequantization,
 * every SIMD vec_dot and the AVX-512 rows kernels against the reference. */
static void test_iq_dots(void) {
    static const int64_t blocks[] = {1, 2, 3, 5, 16};
    static const kern_vec_dot_fn avx2[] = {
        kavx2_vec_dot_iq2_xxs, kavx2_vec_dot_iq2_xs, kavx2_vec_dot_iq2_s, kavx2_vec_dot_iq3_xxs,
        kavx2_vec_dot_iq3_s,   kavx2_vec_dot_iq1_s,  kavx2_vec_dot_iq1_m};
    static const kern_vec_dot_fn avx512[] = {kavx512_vec_dot_iq2_xxs, kavx512_vec_dot_iq2_xs,
                                             kavx512_vec_dot_iq2_s,   kavx512_vec_dot_iq3_xxs,
                                             kavx512_vec_dot_iq3_s,   kavx512_vec_dot_iq1_s,
                                             kavx512_vec_dot_iq1_m};
    static const kern_vec_dot_rows_fn rows[] = {
        kavx512_rows_iq2_xxs, kavx512_rows_iq2_xs, kavx512_rows_iq2_s, kavx512_rows_iq3_xxs,
        kavx512_rows_iq3_s,   kavx512_rows_iq1_s,  kavx512_rows_iq1_m};
    for (int ti = 0; ti < N_IQ_TYPES; ti++) {
        const int t = iq_types[ti];
        const char *name = gguf_dtype_name(t);
        const kern_traits *r = kern_traits_ref(t);
        CHECK(kern_traits_of(t) && kern_traits_of(t)->vec_dot, "%s: no kernel installed", name);
        for (int si = 0; si < 5; si++) {
            const int64_t n = blocks[si] * QK_K;
            const size_t qrow = kern_row_bytes(GGUF_DT_Q8_K, n);
            uint8_t *qx = kvl_alloc(kern_row_bytes(t, n));
            char *qy = kvl_alloc(KERN_ROWS_WIDE * qrow);
            float *y = kvl_alloc(n * sizeof(float));
            random_iq_blocks(t, qx, blocks[si]);
            for (int i = 0; i < KERN_ROWS_WIDE; i++) {
                fill_data(y, n, 1.0f + i);
                kern_traits_ref(GGUF_DT_Q8_K)->from_float(y, qy + i * qrow, n);
            }
            float *dx = dequantize_ref(t, qx, n), *dy = dequantize_ref(GGUF_DT_Q8_K, qy, n);
            float want;
            r->vec_dot(n, &want, qx, qy);
            double abs_sum;
            const double exact = dot_double(dx, dy, n, &abs_sum);
            CHECK(fabs(want - exact) <= 2e-6 * abs_sum + 1e-30, "%s n=%lld: ref %.9g exact %.9g",
                  name, (long long)n, want, exact);
            for (int a = 1; a < 3; a++) {
                if (!isa_ok[a]) continue;
                float s;
                (a == 1 ? avx2 : avx512)[ti](n, &s, qx, qy);
                CHECK(same_bits(s, want), "%s n=%lld %s: %.9g vs reference %.9g", name,
                      (long long)n, isa_list[a], s, want);
            }
            if (isa_ok[2])
                for (int nr = 1; nr <= KERN_ROWS_WIDE; nr++) {
                    float s[2 * KERN_ROWS_WIDE] = {0};
                    rows[ti](n, s, 2, qx, qy, qrow, nr);
                    for (int i = 0; i < nr; i++) {
                        r->vec_dot(n, &want, qx, qy + i * qrow);
                        CHECK(same_bits(s[2 * i], want), "%s rows nr=%d row %d n=%lld: %g vs %g",
                              name, nr, i, (long long)n, s[2 * i], want);
                    }
                }
            kvl_free(qx), kvl_free(qy), kvl_free(y), kvl_free(dx), kvl_free(dy);
        }
    }
}

/* ---------- byte-exactness against llama-quantize output ----------
 * A minimal GGUF walk (the gguf module is tested elsewhere): just enough to find
 * tensor data by name. */

typedef struct {
    const uint8_t *p, *end;
    bool ok;
} rd;

static uint64_t rd_u(rd *r, int bytes) {
    uint64_t v = 0;
    if (r->end - r->p < bytes) {
        r->ok = false;
        return 0;
    }
    memcpy(&v, r->p, (size_t)bytes);
    r->p += bytes;
    return v;
}

static void rd_skip(rd *r, uint64_t n) {
    if ((uint64_t)(r->end - r->p) < n) r->ok = false;
    else r->p += n;
}

static int vt_size(uint32_t vt) {
    static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return vt < 13 ? sz[vt] : -1;
}

static void rd_skip_value(rd *r, uint32_t vt) {
    if (vt == 8) rd_skip(r, rd_u(r, 8));
    else if (vt == 9) {
        const uint32_t et = (uint32_t)rd_u(r, 4);
        const uint64_t cnt = rd_u(r, 8);
        for (uint64_t i = 0; i < cnt && r->ok; i++) rd_skip_value(r, et);
    } else if (vt_size(vt) > 0) rd_skip(r, (uint64_t)vt_size(vt));
    else r->ok = false;
}

typedef struct {
    uint8_t *buf;
    size_t len;
    const uint8_t *data; /* tensor data section */
    const uint8_t *ti;   /* first tensor info */
    uint64_t n_tensors;
} mini_gguf;

static bool mini_open(mini_gguf *g, const char *path) {
    memset(g, 0, sizeof *g);
    g->buf = (uint8_t *)kvl_read_file(path, &g->len, NULL);
    if (!g->buf) return false;
    rd r = {g->buf, g->buf + g->len, true};
    if (rd_u(&r, 4) != 0x46554747u) return false;
    rd_u(&r, 4);
    g->n_tensors = rd_u(&r, 8);
    const uint64_t n_kv = rd_u(&r, 8);
    uint64_t align = 32;
    for (uint64_t i = 0; i < n_kv && r.ok; i++) {
        const uint64_t kl = rd_u(&r, 8);
        const bool is_align =
            kl == 17 && r.end - r.p >= 17 && !memcmp(r.p, "general.alignment", 17);
        rd_skip(&r, kl);
        const uint32_t vt = (uint32_t)rd_u(&r, 4);
        if (is_align && vt == 4) align = rd_u(&r, 4);
        else rd_skip_value(&r, vt);
    }
    g->ti = r.p;
    for (uint64_t i = 0; i < g->n_tensors && r.ok; i++) {
        rd_skip(&r, rd_u(&r, 8));
        rd_skip(&r, 8 * rd_u(&r, 4));
        rd_skip(&r, 12);
    }
    const size_t off = (size_t)(r.p - g->buf);
    g->data = g->buf + (off + align - 1) / align * align;
    return r.ok && align;
}

/* Finds a tensor; returns its data, dtype, row length and row count. */
static const uint8_t *mini_find(const mini_gguf *g, const char *name, int *dtype, int64_t *ne0,
                                int64_t *rows) {
    rd r = {g->ti, g->buf + g->len, true};
    for (uint64_t i = 0; i < g->n_tensors && r.ok; i++) {
        const uint64_t nl = rd_u(&r, 8);
        const bool match =
            r.ok && nl == strlen(name) && (uint64_t)(r.end - r.p) >= nl && !memcmp(r.p, name, nl);
        rd_skip(&r, nl);
        const uint32_t nd = (uint32_t)rd_u(&r, 4);
        int64_t ne[4] = {1, 1, 1, 1};
        for (uint32_t d = 0; d < nd && d < 4; d++) ne[d] = (int64_t)rd_u(&r, 8);
        *dtype = (int)rd_u(&r, 4);
        const uint64_t off = rd_u(&r, 8);
        if (match && r.ok) {
            *ne0 = ne[0];
            *rows = ne[1] * ne[2] * ne[3];
            return g->data + off;
        }
    }
    return NULL;
}

static void check_golden_model(const mini_gguf *f32, const char *path) {
    mini_gguf q;
    if (!mini_open(&q, path)) {
        printf("  skip %s (not readable)\n", path);
        kvl_free(q.buf);
        return;
    }
    rd r = {q.ti, q.buf + q.len, true};
    int checked = 0;
    for (uint64_t i = 0; i < q.n_tensors && r.ok; i++) {
        char name[128] = {0};
        const uint64_t nl = rd_u(&r, 8);
        if (nl < sizeof name && (uint64_t)(r.end - r.p) >= nl) memcpy(name, r.p, nl);
        rd_skip(&r, nl);
        rd_skip(&r, 8 * rd_u(&r, 4) + 12);
        int qt, ft;
        int64_t ne0, rows, fne0, frows;
        const uint8_t *qd = mini_find(&q, name, &qt, &ne0, &rows);
        const uint8_t *fd = mini_find(f32, name, &ft, &fne0, &frows);
        if (!qd || !fd || ft != GGUF_DT_F32 || qt == GGUF_DT_F32 || !kern_traits_ref(qt)) continue;
        const size_t rb = kern_row_bytes(qt, ne0);
        uint8_t *mine = kvl_alloc(rb * rows);
        kern_traits_ref(qt)->from_float((const float *)fd, mine, ne0 * rows);
        size_t diff = 0;
        for (size_t b = 0; b < rb * rows; b++) diff += mine[b] != qd[b];
        CHECK(diff == 0, "%s %s (%s): %zu of %zu bytes differ from llama-quantize", path, name,
              gguf_dtype_name(qt), diff, rb * rows);
        /* and it decodes close to the source */
        float *deq = dequantize_ref(qt, qd, ne0 * rows);
        const double e = nrmse((const float *)fd, deq, ne0 * rows);
        CHECK(e <= roundtrip_bound(qt) * 1.5, "%s %s: nrmse %g", path, name, e);
        kvl_free(deq), kvl_free(mine);
        checked++;
    }
    printf("  %s: %d tensors byte-identical to llama-quantize\n", path, checked);
    CHECK(checked > 0, "%s: no tensors compared", path);
    kvl_free(q.buf);
}

static void test_golden(void) {
    const char *dir = "tests/data/golden/models/";
    char path[256];
    mini_gguf f32;
    snprintf(path, sizeof path, "%sllama-gqa-bpe-f32.gguf", dir);
    if (!mini_open(&f32, path)) {
        printf("  skip golden models (%s not readable)\n", path);
        kvl_free(f32.buf);
        return;
    }
    static const char *models[] = {"f16",    "q8_0",   "q4_0",   "q4_k_m", "q6_k",
                                   "q4_1",   "q5_0",   "q5_1",   "iq4_nl", "q2_k",
                                   "q3_k_m", "q4_k_s", "q5_k_s", "q5_k_m", "iq4_xs"};
    for (int i = 0; i < (int)(sizeof models / sizeof models[0]); i++) {
        snprintf(path, sizeof path, "%sllama-gqa-bpe-%s.gguf", dir, models[i]);
        check_golden_model(&f32, path);
    }
    kvl_free(f32.buf);
}

/* test_kernels [--isa scalar|avx2|avx512]: with --isa, only that ISA's
 * kernels are compared with the reference (none for scalar: the reference's
 * own checks), and a CPU without it exits 77, which CTest reports as skipped;
 * without, every ISA this CPU has. */
int main(int argc, char **argv) {
    int only = -1;
    if (argc == 3 && strcmp(argv[1], "--isa") == 0)
        for (int a = 0; a < 3; a++)
            if (strcmp(argv[2], isa_list[a]) == 0) only = a;
    if (argc != 1 && only < 0) {
        fprintf(stderr, "usage: test_kernels [--isa scalar|avx2|avx512]\n");
        return 2;
    }
    kern_init(NULL);
    printf("kernels: %s, %d threads; compared against the reference:", kern_isa_name(),
           kvl_pool_threads());
    for (int a = 1; a < 3; a++)
        if ((isa_ok[a] = (only < 0 || only == a) && probe_isa(a))) printf(" %s", isa_list[a]);
    printf("\n");
    if (only > 0 && !isa_ok[only]) {
        printf("SKIP: this CPU cannot run the %s kernels\n", isa_list[only]);
        return 77;
    }
    kern_init("auto");
    const bool common = only <= 0; /* checks that do not compare one ISA: once, not per ISA */
    if (common) test_tables();
    test_roundtrip();
    if (common) test_q8_K_layout();
    if (common) test_mxfp4_layout();
    test_vec_dot();
    test_rows_kernels();
    if (common) test_iq_dequant();
    test_iq_dots();
    test_iq_llama_dots();
    test_iq_matmul();
    test_matmul();
    test_matmul_shapes();
    test_repack();
    if (common) test_attn_exp();
    test_attn();
    test_silu();
    test_hadamard();
    test_read_sum();
    if (common) test_get_row();
    if (common) test_golden();
    if (failures) {
        fprintf(stderr, "test_kernels: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_kernels: ok\n");
    return 0;
}
