/* gguf: the element type table, one entry per type (see gguf_dtype_traits in
 * gguf.h). Geometry as ggml defines it (ggml-common.h), the block types' taken
 * from GGUF_BLOCK_TYPES (gguf.h); vec_dot_type is the activation type of the
 * kernels that exist (src/kernels/dispatch.c); kv_name marks the KV cache's
 * storage types (src/kv/kv_dtype.c). */
#include "gguf.h"

#include <strings.h>

/* A block type's elems and bytes (GGUF_BLOCK_TYPES, gguf.h) */
#define BLOCK(TYPE) GGUF_BLOCK_ELEMS_##TYPE, GGUF_BLOCK_BYTES_##TYPE

/* clang-format off */
static const gguf_dtype_traits TYPES[GGUF_DT_TABLE_SIZE] = {
    /*                   name      elems, bytes    vec_dot_type   kv_name */
    [GGUF_DT_F32]    = {"F32",     1, 4,           GGUF_DT_F32,   "f32"},
    [GGUF_DT_F16]    = {"F16",     1, 2,           GGUF_DT_F16,   "f16"},
    [GGUF_DT_BF16]   = {"BF16",    1, 2,           GGUF_DT_BF16,  "bf16"},
    [GGUF_DT_Q4_0]   = {"Q4_0",    BLOCK(Q4_0),    GGUF_DT_Q8_0,  "q4_0"},
    [GGUF_DT_Q4_1]   = {"Q4_1",    BLOCK(Q4_1),    GGUF_DT_Q8_1,  NULL},
    [GGUF_DT_Q5_0]   = {"Q5_0",    BLOCK(Q5_0),    GGUF_DT_Q8_0,  "q5_0"},
    [GGUF_DT_Q5_1]   = {"Q5_1",    BLOCK(Q5_1),    GGUF_DT_Q8_1,  NULL},
    [GGUF_DT_Q8_0]   = {"Q8_0",    BLOCK(Q8_0),    GGUF_DT_Q8_0,  "q8_0"},
    [GGUF_DT_Q8_1]   = {"Q8_1",    BLOCK(Q8_1),    -1,            NULL}, /* activations only */
    [GGUF_DT_Q2_K]   = {"Q2_K",    BLOCK(Q2_K),    GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_Q3_K]   = {"Q3_K",    BLOCK(Q3_K),    GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_Q4_K]   = {"Q4_K",    BLOCK(Q4_K),    GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_Q5_K]   = {"Q5_K",    BLOCK(Q5_K),    GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_Q6_K]   = {"Q6_K",    BLOCK(Q6_K),    GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_Q8_K]   = {"Q8_K",    BLOCK(Q8_K),    -1,            NULL}, /* activations only */
    [GGUF_DT_IQ4_NL] = {"IQ4_NL",  BLOCK(IQ4_NL),  GGUF_DT_Q8_0,  "iq4_nl"},
    [GGUF_DT_IQ4_XS] = {"IQ4_XS",  BLOCK(IQ4_XS),  GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_IQ2_XXS]= {"IQ2_XXS", BLOCK(IQ2_XXS), GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_IQ2_XS] = {"IQ2_XS",  BLOCK(IQ2_XS),  GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_IQ2_S]  = {"IQ2_S",   BLOCK(IQ2_S),   GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_IQ3_XXS]= {"IQ3_XXS", BLOCK(IQ3_XXS), GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_IQ3_S]  = {"IQ3_S",   BLOCK(IQ3_S),   GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_IQ1_S]  = {"IQ1_S",   BLOCK(IQ1_S),   GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_IQ1_M]  = {"IQ1_M",   BLOCK(IQ1_M),   GGUF_DT_Q8_K,  NULL},
    [GGUF_DT_MXFP4]  = {"MXFP4",   BLOCK(MXFP4),   GGUF_DT_Q8_0,  NULL},
    [GGUF_DT_I8]     = {"I8",      1, 1,           -1,            NULL},
    [GGUF_DT_I16]    = {"I16",     1, 2,           -1,            NULL},
    [GGUF_DT_I32]    = {"I32",     1, 4,           -1,            NULL},
    [GGUF_DT_I64]    = {"I64",     1, 8,           -1,            NULL},
    [GGUF_DT_F64]    = {"F64",     1, 8,           -1,            NULL},
    /* ggml types known by name only, so that an error can say what a file holds. */
    [34] = {"TQ1_0",   0, 0, -1, NULL},
    [35] = {"TQ2_0",   0, 0, -1, NULL},
    /* kvllm's own, KV cache only (never in a file) */
    [GGUF_DT_FP8_E4M3] = {"FP8_E4M3", 1, 1, -1, "fp8"},
};
/* clang-format on */
#undef BLOCK

const gguf_dtype_traits *gguf_dtype_traits_of(int dtype) {
    if (dtype < 0 || dtype >= GGUF_DT_TABLE_SIZE || !TYPES[dtype].name) return NULL;
    return &TYPES[dtype];
}

bool gguf_dtype_geometry(int dtype, int *block_elems, size_t *block_bytes) {
    if (dtype < 0 || dtype >= GGUF_DT_COUNT || TYPES[dtype].block_elems == 0) return false;
    if (block_elems) *block_elems = TYPES[dtype].block_elems;
    if (block_bytes) *block_bytes = TYPES[dtype].block_bytes;
    return true;
}

const char *gguf_dtype_name(int dtype) {
    if (dtype < 0 || dtype >= GGUF_DT_COUNT || !TYPES[dtype].name) return "unknown";
    return TYPES[dtype].name;
}

/* general.file_type by number: llama-quantize's name, llama.cpp's description,
 * and the tensor type llama.cpp guesses it from for a file without the key
 * (-1: none; 0 is a real guess's, from F32). */
static const struct {
    const char *name, *desc;
    int guessed_from;
} FILE_TYPES[] = {
    [0] = {"F32", "all F32", GGUF_DT_F32},
    [1] = {"F16", "F16", GGUF_DT_F16},
    [2] = {"Q4_0", "Q4_0", GGUF_DT_Q4_0},
    [3] = {"Q4_1", "Q4_1", GGUF_DT_Q4_1},
    [7] = {"Q8_0", "Q8_0", GGUF_DT_Q8_0},
    [8] = {"Q5_0", "Q5_0", GGUF_DT_Q5_0},
    [9] = {"Q5_1", "Q5_1", GGUF_DT_Q5_1},
    [10] = {"Q2_K", "Q2_K - Medium", GGUF_DT_Q2_K},
    [11] = {"Q3_K_S", "Q3_K - Small", -1},
    [12] = {"Q3_K_M", "Q3_K - Medium", GGUF_DT_Q3_K},
    [13] = {"Q3_K_L", "Q3_K - Large", -1},
    [14] = {"Q4_K_S", "Q4_K - Small", -1},
    [15] = {"Q4_K_M", "Q4_K - Medium", GGUF_DT_Q4_K},
    [16] = {"Q5_K_S", "Q5_K - Small", -1},
    [17] = {"Q5_K_M", "Q5_K - Medium", GGUF_DT_Q5_K},
    [18] = {"Q6_K", "Q6_K", GGUF_DT_Q6_K},
    [19] = {"IQ2_XXS", "IQ2_XXS - 2.0625 bpw", GGUF_DT_IQ2_XXS},
    [20] = {"IQ2_XS", "IQ2_XS - 2.3125 bpw", GGUF_DT_IQ2_XS},
    [21] = {"Q2_K_S", "Q2_K - Small", -1},
    [22] = {"IQ3_XS", "IQ3_XS - 3.3 bpw", -1},
    [23] = {"IQ3_XXS", "IQ3_XXS - 3.0625 bpw", GGUF_DT_IQ3_XXS},
    [24] = {"IQ1_S", "IQ1_S - 1.5625 bpw", GGUF_DT_IQ1_S},
    [25] = {"IQ4_NL", "IQ4_NL - 4.5 bpw", GGUF_DT_IQ4_NL},
    [26] = {"IQ3_S", "IQ3_S - 3.4375 bpw", GGUF_DT_IQ3_S},
    [27] = {"IQ3_M", "IQ3_S mix - 3.66 bpw", -1},
    [28] = {"IQ2_S", "IQ2_S - 2.5 bpw", GGUF_DT_IQ2_S},
    [29] = {"IQ2_M", "IQ2_M - 2.7 bpw", -1},
    [30] = {"IQ4_XS", "IQ4_XS - 4.25 bpw", GGUF_DT_IQ4_XS},
    [31] = {"IQ1_M", "IQ1_M - 1.75 bpw", GGUF_DT_IQ1_M},
    [32] = {"BF16", "BF16", GGUF_DT_BF16},
    [36] = {"TQ1_0", "TQ1_0 - 1.69 bpw ternary", 34 /* TQ1_0 */},
    [37] = {"TQ2_0", "TQ2_0 - 2.06 bpw ternary", 35 /* TQ2_0 */},
    [38] = {"MXFP4_MOE", "MXFP4 MoE", -1},
    [39] = {"NVFP4", "NVFP4", -1},
    [40] = {"Q1_0", "Q1_0", -1},
    [41] = {"Q2_0", "Q2_0", -1},
};
#define N_FILE_TYPES (sizeof FILE_TYPES / sizeof FILE_TYPES[0])

const char *gguf_file_type_name(uint32_t ftype) {
    return ftype < N_FILE_TYPES ? FILE_TYPES[ftype].name : NULL;
}

const char *gguf_file_type_desc(uint32_t ftype) {
    return ftype < N_FILE_TYPES ? FILE_TYPES[ftype].desc : NULL;
}

int gguf_file_type_guess(int dtype) {
    for (size_t i = 0; i < N_FILE_TYPES; i++)
        if (FILE_TYPES[i].name && FILE_TYPES[i].guessed_from == dtype) return (int)i;
    return 0;
}

int gguf_file_type_parse(const char *name) {
    for (size_t i = 0; name && i < N_FILE_TYPES; i++)
        if (FILE_TYPES[i].name && strcasecmp(FILE_TYPES[i].name, name) == 0) return (int)i;
    return -1;
}

size_t gguf_row_bytes(int dtype, int64_t n) {
    const gguf_dtype_traits *t = gguf_dtype_traits_of(dtype);
    if (!t || !t->block_elems || n < 0 || n % t->block_elems) return 0;
    return (size_t)(n / t->block_elems) * t->block_bytes;
}
