/* gguf: strict reader (and a small writer) for GGUF v2/v3 model files.
 *
 * The file is mmap'd read-only; tensor data and string values point into the
 * mapping and stay valid until gguf_close. A model file is hostile input: every
 * count, length, offset, shape and type is checked against the file size and
 * against overflow before anything is dereferenced; failures produce a one-line
 * message naming the file, the byte offset or key, and the reason. */
#ifndef KVLLM_GGUF_H
#define KVLLM_GGUF_H

#include "base.h"

/* Metadata value types, numbered as in the GGUF spec: the one list of them,
 * X(name, number, short name, packed size of a scalar; 0 for string and
 * array), from which the enum and gguf_vtype_name/gguf_vtype_size are made.
 * A bool is stored as one byte. */
// clang-format off
#define GGUF_VTYPES(X)                           \
    X(UINT8,    0, "u8",     sizeof(uint8_t))    \
    X(INT8,     1, "i8",     sizeof(int8_t))     \
    X(UINT16,   2, "u16",    sizeof(uint16_t))   \
    X(INT16,    3, "i16",    sizeof(int16_t))    \
    X(UINT32,   4, "u32",    sizeof(uint32_t))   \
    X(INT32,    5, "i32",    sizeof(int32_t))    \
    X(FLOAT32,  6, "f32",    sizeof(float))      \
    X(BOOL,     7, "bool",   sizeof(uint8_t))    \
    X(STRING,   8, "string", 0)                  \
    X(ARRAY,    9, "array",  0)                  \
    X(UINT64,  10, "u64",    sizeof(uint64_t))   \
    X(INT64,   11, "i64",    sizeof(int64_t))    \
    X(FLOAT64, 12, "f64",    sizeof(double))

typedef enum gguf_vtype {
#define GGUF_VT_ENUM(name, num, str, size) GGUF_VT_##name = num,
    GGUF_VTYPES(GGUF_VT_ENUM)
#undef GGUF_VT_ENUM
    GGUF_VT_COUNT
} gguf_vtype;
// clang-format on

/* Tensor element types, numbered as ggml numbers them. Only the ones whose
 * block geometry is known (gguf_types.c) are accepted by the reader; others
 * are rejected by name. */
typedef enum gguf_dtype {
    GGUF_DT_F32 = 0,
    GGUF_DT_F16 = 1,
    GGUF_DT_Q4_0 = 2,
    GGUF_DT_Q4_1 = 3,
    GGUF_DT_Q5_0 = 6,
    GGUF_DT_Q5_1 = 7,
    GGUF_DT_Q8_0 = 8,
    GGUF_DT_Q8_1 = 9,
    GGUF_DT_Q2_K = 10,
    GGUF_DT_Q3_K = 11,
    GGUF_DT_Q4_K = 12,
    GGUF_DT_Q5_K = 13,
    GGUF_DT_Q6_K = 14,
    GGUF_DT_Q8_K = 15,
    GGUF_DT_IQ2_XXS = 16,
    GGUF_DT_IQ2_XS = 17,
    GGUF_DT_IQ3_XXS = 18,
    GGUF_DT_IQ1_S = 19,
    GGUF_DT_IQ4_NL = 20,
    GGUF_DT_IQ3_S = 21,
    GGUF_DT_IQ2_S = 22,
    GGUF_DT_IQ4_XS = 23,
    GGUF_DT_I8 = 24,
    GGUF_DT_I16 = 25,
    GGUF_DT_I32 = 26,
    GGUF_DT_I64 = 27,
    GGUF_DT_F64 = 28,
    GGUF_DT_IQ1_M = 29,
    GGUF_DT_BF16 = 30,
    GGUF_DT_MXFP4 = 39,
    GGUF_DT_COUNT = 40, /* ggml's types are numbered below this */
    /* kvllm's own storage type, never found in (or written to) a file: FP8
     * E4M3 for the KV cache (kv_dtype.c). */
    GGUF_DT_FP8_E4M3 = 64,
    GGUF_DT_TABLE_SIZE /* entries of the type table */
} gguf_dtype;

/* The geometry of the block types, the one place it is written:
 * X(TYPE, type, elems, bytes) for GGUF_DT_TYPE, a block of elems elements in
 * bytes bytes; `type` is ggml's lower-case name, which the kernels' block
 * struct carries (blk_type). The type table (gguf_types.c) takes its
 * block_elems and block_bytes from here, and the kernels check each struct's
 * size against it (src/kernels/dispatch.c). */
#define GGUF_BLOCK_TYPES(X)                                                                        \
    X(Q4_0, q4_0, 32, 18)                                                                          \
    X(Q4_1, q4_1, 32, 20)                                                                          \
    X(Q5_0, q5_0, 32, 22)                                                                          \
    X(Q5_1, q5_1, 32, 24)                                                                          \
    X(Q8_0, q8_0, 32, 34)                                                                          \
    X(Q8_1, q8_1, 32, 36)                                                                          \
    X(Q2_K, q2_K, 256, 84)                                                                         \
    X(Q3_K, q3_K, 256, 110)                                                                        \
    X(Q4_K, q4_K, 256, 144)                                                                        \
    X(Q5_K, q5_K, 256, 176)                                                                        \
    X(Q6_K, q6_K, 256, 210)                                                                        \
    X(Q8_K, q8_K, 256, 292)                                                                        \
    X(IQ4_NL, iq4_nl, 32, 18)                                                                      \
    X(IQ4_XS, iq4_xs, 256, 136)                                                                    \
    X(IQ2_XXS, iq2_xxs, 256, 66)                                                                   \
    X(IQ2_XS, iq2_xs, 256, 74)                                                                     \
    X(IQ2_S, iq2_s, 256, 82)                                                                       \
    X(IQ3_XXS, iq3_xxs, 256, 98)                                                                   \
    X(IQ3_S, iq3_s, 256, 110)                                                                      \
    X(IQ1_S, iq1_s, 256, 50)                                                                       \
    X(IQ1_M, iq1_m, 256, 56)                                                                       \
    X(MXFP4, mxfp4, 32, 17)
/* GGUF_BLOCK_ELEMS_TYPE and GGUF_BLOCK_BYTES_TYPE as constants. */
#define GGUF_BLOCK_GEOMETRY(TYPE, type, elems, bytes)                                              \
    GGUF_BLOCK_ELEMS_##TYPE = (elems), GGUF_BLOCK_BYTES_##TYPE = (bytes),
enum { GGUF_BLOCK_TYPES(GGUF_BLOCK_GEOMETRY) };
#undef GGUF_BLOCK_GEOMETRY

/* The facts about one element type, the one place they are written
 * (gguf_types.c): the GGUF reader and writer, the kernels (which keep only
 * function pointers indexed by the same number, src/kernels/dispatch.c) and
 * the KV cache's storage types all read them here.
 *
 * Adding a type: give it its entry in gguf_types.c (a ggml type already has a
 * name-only entry: fill in its geometry); the reader then accepts it. To
 * compute with it, add its kernels as src/kernels/dispatch.c says; to store
 * KV in it, give it a kv_name and kv_row_store/kv_row_load a path. */
typedef struct gguf_dtype_traits {
    const char *name;    /* ggml's name: "Q4_K" */
    int block_elems;     /* elements per block; 0: known by name only, not supported */
    size_t block_bytes;  /* bytes per block */
    int vec_dot_type;    /* the type activations are quantized to for a dot product
                          * with a row of this type; -1: no kernel multiplies it */
    const char *kv_name; /* its name as a KV cache type ("q8_0"); NULL: not one */
} gguf_dtype_traits;
/* The entry of dtype, or NULL for a number with none (unknown to ggml). */
const gguf_dtype_traits *gguf_dtype_traits_of(int dtype);

/* Block geometry of a type a GGUF file may hold: elements per block and bytes
 * per block. Returns false for types not supported (name still given if known)
 * and for kvllm's own types. */
bool gguf_dtype_geometry(int dtype, int *block_elems, size_t *block_bytes);
const char *gguf_dtype_name(int dtype); /* "Q4_K", or "unknown" */
/* A whole file's type, general.file_type (llama.cpp's llama_ftype numbers):
 * llama-quantize's name for it ("Q4_K_M") and llama.cpp's description of it
 * ("Q4_K - Medium", as llama_model_ftype_name and llama-server report it);
 * NULL for a number with neither. parse: the number of a name, any case, or -1. */
const char *gguf_file_type_name(uint32_t ftype);
const char *gguf_file_type_desc(uint32_t ftype);
int gguf_file_type_parse(const char *name);
/* The file type llama.cpp guesses for a file whose tensors are mostly of dtype
 * (Q4_K: Q4_K_M); 0 (all F32) for a type it maps to none. */
int gguf_file_type_guess(int dtype);
/* Bytes of a row of n elements, (n / block_elems) * block_bytes, for any type
 * of the table (kvllm's own included); 0 when the type has no geometry, n < 0
 * or n is not a whole number of blocks. */
size_t gguf_row_bytes(int dtype, int64_t n);
/* Metadata type name ("u32", "string", ...; "unknown") and packed size of a
 * scalar of that type (0 for string, array and unknown types). */
const char *gguf_vtype_name(gguf_vtype t);
size_t gguf_vtype_size(gguf_vtype t);

#define GGUF_MAX_DIMS 4

typedef struct gguf_tensor {
    const char *name;          /* NUL-terminated copy owned by the gguf_file */
    int dtype;                 /* gguf_dtype */
    int n_dims;                /* 1..4 */
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims = 1 */
    uint64_t offset;           /* relative to the data section start */
    size_t nbytes;             /* exact byte size of the data */
    const void *data;          /* into the mapping (NULL for vocab-only files) */
} gguf_tensor;

typedef struct gguf_file gguf_file; /* opaque */

/* Opens and validates path. Returns NULL and fills err on any problem. A
 * model split by llama.cpp's gguf-split is opened from its first file
 * (<prefix>-00001-of-<n>.gguf): the other files are found by their names and
 * their tensors join the first's, as if it were one file. */
gguf_file *gguf_open(const char *path, kvl_error *err);
/* The files a gguf_open read: 1, or a split model's n (0: the first). */
int gguf_n_files(const gguf_file *f);
const char *gguf_file_path_at(const gguf_file *f, int i); /* NULL out of range */
/* Same checks over a caller-owned buffer (used by the fuzzer); buf must outlive the result. */
gguf_file *gguf_open_memory(const void *buf, size_t len, const char *name, kvl_error *err);
void gguf_close(gguf_file *f);

const char *gguf_path(const gguf_file *f);

/* llama.cpp's --override-kv: spec "KEY=TYPE:VALUE", TYPE int, float, bool or
 * str (at most 127 bytes), replaces KEY's value (or adds KEY) for every reader
 * of f from now on. A key the file has keeps its kind: an integer key takes
 * int, a float key float (or int), a bool key bool, a string key str; arrays
 * are not overridden. False with err naming the spec and why. */
bool gguf_override_kv(gguf_file *f, const char *spec, kvl_error *err);

/* Where the file puts things, as its header and metadata say. */
typedef struct gguf_layout {
    uint32_t version;   /* 2 or 3 */
    size_t file_size;   /* bytes */
    size_t alignment;   /* of each tensor's data (general.alignment, 32 if absent) */
    size_t data_offset; /* absolute file offset of the (aligned) tensor data section */
} gguf_layout;
const gguf_layout *gguf_file_layout(const gguf_file *f);

/* ---- metadata ---- */
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_key(const gguf_file *f, const char *key); /* index or -1 */
const char *gguf_key_name(const gguf_file *f, int64_t idx); /* NUL-terminated */
gguf_vtype gguf_kv_type(const gguf_file *f, int64_t idx);
/* For arrays: element type and count (false if idx is not an array). */
bool gguf_kv_array(const gguf_file *f, int64_t idx, gguf_vtype *elem_type, uint64_t *count);

/* Typed getters by key. Each returns false if the key is missing or its type
 * does not convert; integer getters accept any integer type (and bool) whose value
 * fits; float getters accept float32/float64 and integers. */
bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
bool gguf_get_f64(const gguf_file *f, const char *key, double *out);
bool gguf_get_f32(const gguf_file *f, const char *key, float *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
/* String value: pointer into the mapping (NOT NUL-terminated) and length. */
bool gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len);
/* Convenience: copies into buf (NUL-terminated, truncated to cap-1); false if missing. */
bool gguf_get_str_buf(const gguf_file *f, const char *key, char *buf, size_t cap);

/* Arrays by key. For numeric arrays, data points at `count` packed little-endian
 * elements of elem_type inside the mapping (possibly unaligned: use memcpy or the
 * element getters). */
bool gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype *elem_type, uint64_t *count,
                  const void **data);
/* Element i of a numeric array as i64/f64 (false if out of range or not numeric). */
bool gguf_get_arr_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out);
bool gguf_get_arr_f64(const gguf_file *f, const char *key, uint64_t i, double *out);
/* Element i of a string array (pointer into the mapping, not NUL-terminated). */
bool gguf_get_arr_str(const gguf_file *f, const char *key, uint64_t i, const char **s, size_t *len);

/* ---- tensors ---- */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */
/* Total bytes of tensor data (the weights' size). */
size_t gguf_tensor_data_bytes(const gguf_file *f);
/* The element type most tensors have (the first to reach that count, in file
 * order): what llama.cpp guesses a file without general.file_type from. */
int gguf_commonest_dtype(const gguf_file *f);
/* llama.cpp's description of f's type (llama_model_ftype_name): general.file_type's
 * ("Q4_K - Medium"), else "(guessed) " and the type its commonest tensor type
 * stands for ("(guessed) all F32"). False (buf "unknown") for a number without one. */
bool gguf_file_type_describe(const gguf_file *f, char *buf, size_t cap);
/* ne[0]*ne[1]*ne[2]*ne[3] (checked at load not to overflow). */
int64_t gguf_tensor_nelements(const gguf_tensor *t);

/* ---- writer ----
 * Builds a GGUF v3 file in memory order: add metadata and tensor descriptors,
 * then write. Tensor data is supplied by pointer and copied at write time. */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_create(void);
void gguf_writer_destroy(gguf_writer *w);
bool gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
bool gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
bool gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
bool gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
bool gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
bool gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Any scalar type (not string/array): v points at one value of that C type. */
bool gguf_writer_set_val(gguf_writer *w, const char *key, gguf_vtype type, const void *v);
/* Arrays: numeric data of n elements of elem_type (copied); strings: n NUL-terminated strings. */
bool gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data,
                         uint64_t n);
bool gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* ne[0] is the row length. data must stay valid until gguf_writer_write
 * (NULL: supplied later through gguf_writer_put). */
bool gguf_writer_add_tensor(gguf_writer *w, const char *name, int dtype, int n_dims,
                            const int64_t *ne, const void *data);
/* Setting an existing key replaces its value in place. Keys must be non-empty;
 * general.alignment may only be set to u32 32 (the alignment the writer uses).
 * Tensor names must be 1..63 bytes (llama.cpp's limit) and unique. */
bool gguf_writer_write(gguf_writer *w, const char *path, kvl_error *err);

/* Streaming, for files larger than memory: declare every tensor with data
 * NULL, then gguf_writer_begin writes the header, gguf_writer_put appends
 * tensor data in declaration order (any chunking; the padding between tensors
 * is inserted by the writer), and gguf_writer_finish checks that every byte
 * was supplied and closes the file. On any failure the file is removed and
 * the later calls fail. gguf_writer_file_bytes is the size the file will have. */
uint64_t gguf_writer_file_bytes(const gguf_writer *w);
bool gguf_writer_begin(gguf_writer *w, const char *path, kvl_error *err);
bool gguf_writer_put(gguf_writer *w, const void *data, size_t n, kvl_error *err);
bool gguf_writer_finish(gguf_writer *w, kvl_error *err);

#endif
