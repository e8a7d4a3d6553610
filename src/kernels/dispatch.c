/* kernels: per-type tables and run-time ISA selection.
 *
 * The library is compiled for generic x86-64; SIMD functions carry their own
 * target attributes and are only installed in the active table when CPUID says
 * the CPU (and OS) supports them. All variants compute bit-identical results
 * (see kern_impl.h), so the choice only affects speed.
 *
 * The tables hold functions only, indexed by gguf_dtype; what a type is (name,
 * block geometry, the type its activations are quantized to) is written once,
 * in gguf's type table (src/gguf/gguf_types.c). Adding kernels for a type:
 *  1. its entry in gguf_types.c has its geometry (a block type's in
 *     GGUF_BLOCK_TYPES, gguf.h) and vec_dot_type;
 *  2. kernels.h: its block struct blk_<t>, whose size is checked below
 *     against that geometry;
 *  3. quant_ref.c: kref_to_float_<t>, kref_from_float_<t>, kref_vec_dot_<t>,
 *     declared in kern_impl.h, and one REF(<T>, <t>) line in ref_table below
 *     (an entry written out, like Q8_K's, where one of them is NULL);
 *  4. SIMD versions (optional, bit-identical to the reference): one line each
 *     in install_avx2 / install_avx512, and matmul's paths (kern_rows_of,
 *     kern_prep_of, kern_gemm_of, kern_repack_of) likewise;
 *  5. tests/unit/test_kernels.c: the type in its lists (reference against
 *     llama.cpp's bytes, SIMD against the reference). */
#include "simd.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Every block struct (kernels.h, quant32.h) is the size that its type's
 * geometry says. */
#define BLOCK_SIZE_OK(TYPE, type, elems, bytes)                                                    \
    _Static_assert(sizeof(blk_##type) == (bytes), #type " block");
GGUF_BLOCK_TYPES(BLOCK_SIZE_OK)
#undef BLOCK_SIZE_OK

/* The scalar reference kernels of a type. */
#define REF(ty, sfx)                                                                               \
    [GGUF_DT_##ty] = {kref_to_float_##sfx, kref_from_float_##sfx, kref_vec_dot_##sfx}

#define REF_NO_QUANTIZER(ty, sfx) [GGUF_DT_##ty] = {kref_to_float_##sfx, NULL, kref_vec_dot_##sfx}

static const kern_traits ref_table[GGUF_DT_COUNT] = {
    REF(F32, f32),
    REF(F16, f16),
    REF(BF16, bf16),
    [GGUF_DT_Q8_0] = {kref_to_float_q8_0, kref_from_float_q8_0, kref_vec_dot_q8_0,
                      kref_act_from_float_q8_0},
    REF(Q4_0, q4_0),
    REF(Q4_K, q4_K),
    REF(Q6_K, q6_K),
    REF(Q4_1, q4_1),
    REF(Q5_0, q5_0),
    REF(Q5_1, q5_1),
    [GGUF_DT_IQ4_NL] = {kref_to_float_iq4_nl, kref_from_float_iq4_nl, kref_vec_dot_iq4_nl,
                        kref_act_from_float_iq4_nl}, /* cache rows: no scale search */
    /* activation-only: the vec_dot_type of Q4_1 and Q5_1 */
    [GGUF_DT_Q8_1] = {kref_to_float_q8_1, kref_from_float_q8_1, NULL},
    REF(Q2_K, q2_K),
    REF(Q3_K, q3_K),
    REF(Q5_K, q5_K),
    REF(IQ4_XS, iq4_xs),
    REF(MXFP4, mxfp4),
    /* the lattice types: no quantizer (llama-quantize needs an importance
     * matrix for most of them) */
    REF_NO_QUANTIZER(IQ2_XXS, iq2_xxs),
    REF_NO_QUANTIZER(IQ2_XS, iq2_xs),
    REF_NO_QUANTIZER(IQ2_S, iq2_s),
    REF_NO_QUANTIZER(IQ3_XXS, iq3_xxs),
    REF_NO_QUANTIZER(IQ3_S, iq3_s),
    REF_NO_QUANTIZER(IQ1_S, iq1_s),
    REF_NO_QUANTIZER(IQ1_M, iq1_m),
    /* activation-only type: no kernel multiplies Q8_K weights */
    [GGUF_DT_Q8_K] = {kref_to_float_q8_K, kref_from_float_q8_K, NULL},
};

static kern_traits active[GGUF_DT_COUNT];
static kern_vec_dot_rows_fn active_rows[GGUF_DT_COUNT];
static int active_rows_max[GGUF_DT_COUNT]; /* 0: KERN_ROWS_MAX */
static const kern_prep_ops *active_prep[GGUF_DT_COUNT];
static const kern_gemm_ops *active_gemm[GGUF_DT_COUNT];
static const kern_repack_ops *active_repack[GGUF_DT_COUNT];

static const kern_prep_ops prep512_q8_0 = {kavx512_prepare_q8_0, kavx512_prows_q8_0,
                                           kavx512_prows4_q8_0};
static const kern_prep_ops prep512_q4_0 = {kavx512_prepare_q4_0, kavx512_prows_q4_0,
                                           kavx512_prows4_q4_0};

static const kern_attn_ops *active_attn = &kref_attn;
static const char *active_isa = "scalar";
static bool active_avx512; /* kern_read_sum's loads */
static pthread_once_t auto_once = PTHREAD_ONCE_INIT;

enum isa_level { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
static const char *const isa_names[] = {"scalar", "avx2", "avx512"};

static bool cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* The best level this CPU supports. __builtin_cpu_supports also checks that the
 * OS saves the wide registers (XCR0). */
static enum isa_level cpu_level(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !cpu_has_f16c())
        return ISA_SCALAR;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return ISA_AVX512;
    return ISA_AVX2;
}

static void install_avx2(void) {
    active[GGUF_DT_F16].to_float = kavx2_to_float_f16;
    active[GGUF_DT_F16].from_float = kavx2_from_float_f16;
    active[GGUF_DT_Q8_0].from_float = kavx2_from_float_q8_0;
    active[GGUF_DT_Q8_0].act_from_float = kavx2_act_from_float_q8_0;
    active[GGUF_DT_Q8_K].from_float = kavx2_from_float_q8_K;
    active[GGUF_DT_F32].vec_dot = kavx2_vec_dot_f32;
    active[GGUF_DT_F16].vec_dot = kavx2_vec_dot_f16;
    active[GGUF_DT_BF16].vec_dot = kavx2_vec_dot_bf16;
    active[GGUF_DT_Q8_0].vec_dot = kavx2_vec_dot_q8_0;
    active[GGUF_DT_Q4_0].vec_dot = kavx2_vec_dot_q4_0;
    active[GGUF_DT_Q4_K].vec_dot = kavx2_vec_dot_q4_K;
    active[GGUF_DT_Q6_K].vec_dot = kavx2_vec_dot_q6_K;
    active[GGUF_DT_Q8_1].from_float = kavx2_from_float_q8_1;
    active[GGUF_DT_Q4_1].vec_dot = kavx2_vec_dot_q4_1;
    active[GGUF_DT_Q5_0].vec_dot = kavx2_vec_dot_q5_0;
    active[GGUF_DT_Q5_1].vec_dot = kavx2_vec_dot_q5_1;
    active[GGUF_DT_IQ4_NL].vec_dot = kavx2_vec_dot_iq4_nl;
    active[GGUF_DT_Q2_K].vec_dot = kavx2_vec_dot_q2_K;
    active[GGUF_DT_Q3_K].vec_dot = kavx2_vec_dot_q3_K;
    active[GGUF_DT_Q5_K].vec_dot = kavx2_vec_dot_q5_K;
    active[GGUF_DT_IQ4_XS].vec_dot = kavx2_vec_dot_iq4_xs;
    active[GGUF_DT_MXFP4].vec_dot = kavx2_vec_dot_mxfp4;
#define IQ_AVX2(T, t) active[GGUF_DT_##T].vec_dot = kavx2_vec_dot_##t;
    KERN_IQ_TYPES(IQ_AVX2)
#undef IQ_AVX2
    active_attn = &kavx2_attn;
}

bool kavx512_decode_nta = false;

static void install_avx512(void) {
    /* gemm_avx512.h (kavx512_decode_prefetch): non-temporal on AMD, into L2
     * elsewhere */
    kavx512_decode_nta = __builtin_cpu_is("amd");
    /* AMD (Zen 4) splits 512-bit operations in two, and there its 512-bit
     * fp16 conversions lose to the AVX2 loop; the float dots gain nothing else
     * from AVX-512. Results are identical either way (kern_impl.h). */
    if (!__builtin_cpu_is("amd")) {
        active[GGUF_DT_F32].vec_dot = kavx512_vec_dot_f32;
        active[GGUF_DT_F16].vec_dot = kavx512_vec_dot_f16;
        active[GGUF_DT_BF16].vec_dot = kavx512_vec_dot_bf16;
    }
    active[GGUF_DT_Q8_0].vec_dot = kavx512_vec_dot_q8_0;
    active[GGUF_DT_Q4_0].vec_dot = kavx512_vec_dot_q4_0;
    active[GGUF_DT_Q4_K].vec_dot = kavx512_vec_dot_q4_K;
    active[GGUF_DT_Q6_K].vec_dot = kavx512_vec_dot_q6_K;
    active[GGUF_DT_Q4_1].vec_dot = kavx512_vec_dot_q4_1;
    active[GGUF_DT_Q5_0].vec_dot = kavx512_vec_dot_q5_0;
    active[GGUF_DT_Q5_1].vec_dot = kavx512_vec_dot_q5_1;
    active[GGUF_DT_IQ4_NL].vec_dot = kavx512_vec_dot_iq4_nl;
    active_prep[GGUF_DT_Q8_0] = &prep512_q8_0;
    active_prep[GGUF_DT_Q4_0] = &prep512_q4_0;
    active_rows[GGUF_DT_Q4_K] = kavx512_rows_q4_K;
    active_rows[GGUF_DT_Q6_K] = kavx512_rows_q6_K;
    active[GGUF_DT_Q2_K].vec_dot = kavx512_vec_dot_q2_K;
    active[GGUF_DT_Q3_K].vec_dot = kavx512_vec_dot_q3_K;
    active[GGUF_DT_Q5_K].vec_dot = kavx512_vec_dot_q5_K;
    active[GGUF_DT_IQ4_XS].vec_dot = kavx512_vec_dot_iq4_xs;
    active[GGUF_DT_MXFP4].vec_dot = kavx512_vec_dot_mxfp4;
    active_rows[GGUF_DT_Q2_K] = kavx512_rows_q2_K;
    active_rows[GGUF_DT_Q3_K] = kavx512_rows_q3_K;
    active_rows[GGUF_DT_Q5_K] = kavx512_rows_q5_K;
    active_rows[GGUF_DT_IQ4_XS] = kavx512_rows_iq4_xs;
    active_gemm[GGUF_DT_Q2_K] = &kavx512_gemm_q2_K;
    active_gemm[GGUF_DT_Q3_K] = &kavx512_gemm_q3_K;
    active_gemm[GGUF_DT_Q5_K] = &kavx512_gemm_q5_K;
    active_gemm[GGUF_DT_IQ4_XS] = &kavx512_gemm_iq4_xs;
    active_gemm[GGUF_DT_Q8_0] = &kavx512_gemm_q8_0;
    active_gemm[GGUF_DT_Q4_0] = &kavx512_gemm_q4_0;
    active_gemm[GGUF_DT_Q4_K] = &kavx512_gemm_q4_K;
    active_gemm[GGUF_DT_Q6_K] = &kavx512_gemm_q6_K;
    active_gemm[GGUF_DT_Q5_0] = &kavx512_gemm_q5_0;
    active_gemm[GGUF_DT_IQ4_NL] = &kavx512_gemm_iq4_nl;
    active_gemm[GGUF_DT_Q4_1] = &kavx512_gemm_q4_1;
    active_gemm[GGUF_DT_Q5_1] = &kavx512_gemm_q5_1;
    active_repack[GGUF_DT_Q5_0] = &kavx512_repack_q5_0;
    active_repack[GGUF_DT_IQ4_NL] = &kavx512_repack_iq4_nl;
    active_repack[GGUF_DT_Q4_1] = &kavx512_repack_q4_1;
    active_repack[GGUF_DT_Q5_1] = &kavx512_repack_q5_1;
    active_repack[GGUF_DT_Q8_0] = &kavx512_repack_q8_0;
    active_repack[GGUF_DT_Q4_0] = &kavx512_repack_q4_0;
    active_repack[GGUF_DT_Q4_K] = &kavx512_repack_q4_K;
    active_repack[GGUF_DT_Q6_K] = &kavx512_repack_q6_K;
    active_repack[GGUF_DT_IQ4_XS] = &kavx512_repack_iq4_xs;
    active_repack[GGUF_DT_Q3_K] = &kavx512_repack_q3_K;
    active_repack[GGUF_DT_Q5_K] = &kavx512_repack_q5_K;
    active_repack[GGUF_DT_Q2_K] = &kavx512_repack_q2_K;
    active_gemm[GGUF_DT_MXFP4] = &kavx512_gemm_mxfp4;
    active_repack[GGUF_DT_MXFP4] = &kavx512_repack_mxfp4;
#define IQ_AVX512(T, t)                                                                            \
    active[GGUF_DT_##T].vec_dot = kavx512_vec_dot_##t,                                             \
    active_rows[GGUF_DT_##T] = kavx512_rows_##t, active_rows_max[GGUF_DT_##T] = KERN_ROWS_WIDE;
    KERN_IQ_TYPES(IQ_AVX512)
#undef IQ_AVX512
    active_attn = &kavx512_attn;
    active_gemm[GGUF_DT_F32] = &kavx512_gemm_f32;
    active_gemm[GGUF_DT_F16] = &kavx512_gemm_f16;
    active_gemm[GGUF_DT_BF16] = &kavx512_gemm_bf16;
}

static void select_level(enum isa_level want) {
    const enum isa_level have = cpu_level();
    if (want > have) {
        kvl_log(KVL_LOG_WARN, "kernels: %s not supported by this CPU, using %s", isa_names[want],
                isa_names[have]);
        want = have;
    }
    memcpy(active, ref_table, sizeof active);
    memset(active_rows, 0, sizeof active_rows);
    memset(active_rows_max, 0, sizeof active_rows_max);
    memset(active_prep, 0, sizeof active_prep);
    memset(active_gemm, 0, sizeof active_gemm);
    memset(active_repack, 0, sizeof active_repack);
    active_attn = &kref_attn;
    if (want >= ISA_AVX2) install_avx2();
    if (want >= ISA_AVX512) install_avx512();
    active_isa = isa_names[want];
    active_avx512 = want >= ISA_AVX512;
}

/* "scalar" | "avx2" | "avx512" | NULL or "" or "auto" (best available). */
static enum isa_level parse_level(const char *name) {
    if (!name || !*name || !strcmp(name, "auto")) return cpu_level();
    for (int i = ISA_SCALAR; i <= ISA_AVX512; i++)
        if (!strcmp(name, isa_names[i])) return (enum isa_level)i;
    kvl_log(KVL_LOG_WARN, "kernels: unknown ISA '%s', choosing automatically", name);
    return cpu_level();
}

/* Default selection; the KVLLM_KERNELS environment variable overrides it. */
static void auto_init(void) { select_level(parse_level(getenv("KVLLM_KERNELS"))); }

void kern_init(const char *force) {
    pthread_once(&auto_once, auto_init);
    if (force) select_level(parse_level(force));
}

const char *kern_isa_name(void) {
    pthread_once(&auto_once, auto_init);
    return active_isa;
}

const char *kern_decode_prefetch_name(void) {
    pthread_once(&auto_once, auto_init);
    if (strcmp(active_isa, "avx512") != 0) return "none";
    return kavx512_decode_nta ? "nta" : "t1";
}

static char cpu_name[49];
static pthread_once_t cpu_name_once = PTHREAD_ONCE_INIT;

/* CPUID leaves 0x80000002-4: 48 bytes of brand string, space-padded on some
 * CPUs; leading and trailing blanks dropped. */
static void read_cpu_name(void) {
    unsigned r[12] = {0}, top = __get_cpuid_max(0x80000000u, NULL);
    if (top < 0x80000004u) return;
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    char raw[49];
    memcpy(raw, r, 48);
    raw[48] = '\0';
    const char *b = raw;
    while (*b == ' ') b++;
    size_t n = strlen(b);
    while (n > 0 && b[n - 1] == ' ') n--;
    memcpy(cpu_name, b, n);
    cpu_name[n] = '\0';
}

const char *kern_cpu_name(void) {
    pthread_once(&cpu_name_once, read_cpu_name);
    return cpu_name;
}

/* True for a type number the tables have, after the default selection ran. */
static bool selected(int dtype) {
    if (dtype < 0 || dtype >= GGUF_DT_COUNT) return false;
    pthread_once(&auto_once, auto_init);
    return true;
}

const kern_traits *kern_traits_of(int dtype) {
    return selected(dtype) && active[dtype].to_float ? &active[dtype] : NULL;
}
kern_vec_dot_rows_fn kern_rows_of(int dtype) { return selected(dtype) ? active_rows[dtype] : NULL; }
int kern_rows_max_of(int dtype) {
    return selected(dtype) && active_rows_max[dtype] ? active_rows_max[dtype] : KERN_ROWS_MAX;
}
const kern_prep_ops *kern_prep_of(int dtype) { return selected(dtype) ? active_prep[dtype] : NULL; }
const kern_gemm_ops *kern_gemm_of(int dtype) { return selected(dtype) ? active_gemm[dtype] : NULL; }
const kern_repack_ops *kern_repack_of(int dtype) {
    return selected(dtype) ? active_repack[dtype] : NULL;
}

const kern_attn_ops *kern_attn_active(void) {
    pthread_once(&auto_once, auto_init);
    return active_attn;
}

const kern_traits *kern_traits_ref(int dtype) {
    if (dtype < 0 || dtype >= GGUF_DT_COUNT) return NULL;
    return ref_table[dtype].to_float ? &ref_table[dtype] : NULL;
}

size_t kern_row_bytes(int dtype, int64_t n) {
    const gguf_dtype_traits *t = gguf_dtype_traits_of(dtype);
    if (!kern_traits_ref(dtype) || n < 0) return 0;
    return (size_t)(n / t->block_elems) * t->block_bytes;
}

/* kern_read_sum: four accumulators, 64 bytes a step with 128-bit loads; with
 * 512-bit ones two streams half the buffer apart, 128 bytes a step each (the
 * tails by the 128-bit loop). Two streams read 5-7% more than one on Zen 4 at
 * 2 threads (a 512 MiB buffer, the variants alternating 30 times), as the
 * two-stream decode kernels do; three or four streams read 30-35% less. */
typedef uint64_t v2u64 __attribute__((vector_size(16)));
static uint64_t read_sum_128(const char *p, size_t bytes) {
    v2u64 s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0;
    for (size_t o = 0; o + 64 <= bytes; o += 64) {
        const v2u64 *v = (const v2u64 *)(p + o);
        s0 += v[0];
        s1 += v[1];
        s2 += v[2];
        s3 += v[3];
    }
    const v2u64 s = s0 + s1 + s2 + s3;
    return s[0] + s[1];
}
T_512 static uint64_t read_sum_512(const char *p, size_t bytes) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    const size_t half = bytes / 2 & ~(size_t)127;
    const char *q = p + half;
    size_t o = 0;
    for (; o + 128 <= half; o += 128) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + o));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + o + 64));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(q + o));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(q + o + 64));
    }
    uint64_t lane[8], sum = read_sum_128(q + o, bytes - half - o);
    _mm512_storeu_si512(lane, _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    for (int i = 0; i < 8; i++) sum += lane[i]; /* unsigned: the reduce intrinsic adds signed */
    return sum;
}

uint64_t kern_read_sum(const void *p, size_t bytes) {
    pthread_once(&auto_once, auto_init);
    return active_avx512 ? read_sum_512(p, bytes) : read_sum_128(p, bytes);
}
