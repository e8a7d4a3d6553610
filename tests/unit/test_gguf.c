/* Unit tests for src/gguf: real model files, getter conversions, writer
 * round trip, and malformed files built in memory.
 *
 *   test_gguf                    all in-process tests (run from the repo root)
 *   test_gguf --check-dir DIR    opens every file listed in DIR/expected.tsv
 *                                (written by tools/make_bad_gguf.py) and checks
 *                                it loads ("OK") or fails with the given text */
#define _GNU_SOURCE
#include "gguf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* ---------------------------------------------------------------- helpers */

/* Walks everything a loaded file exposes; under ASan/valgrind this proves every
 * pointer the reader hands out is inside the buffer. Returns a checksum. */
static uint64_t walk_all(const gguf_file *f) {
    uint64_t sum = 0;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const char *key = gguf_key_name(f, i), *s;
        size_t n;
        int64_t iv;
        double dv;
        gguf_vtype et;
        uint64_t cnt;
        CHECK(key && gguf_find_key(f, key) == i, "key %lld lookup", (long long)i);
        if (gguf_get_str(f, key, &s, &n))
            for (size_t j = 0; j < n; j++) sum += (unsigned char)s[j];
        if (gguf_get_i64(f, key, &iv)) sum += (uint64_t)iv;
        if (gguf_get_f64(f, key, &dv)) sum += dv == dv;
        if (!gguf_kv_array(f, i, &et, &cnt)) continue;
        for (uint64_t j = 0; j < cnt; j++) {
            if (gguf_get_arr_str(f, key, j, &s, &n)) sum += n ? (unsigned char)s[n - 1] : 0;
            else if (gguf_get_arr_f64(f, key, j, &dv)) sum += dv == dv;
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK(gguf_find_tensor(f, t->name) == t, "tensor %s lookup", t->name);
        const unsigned char *d = t->data;
        if (t->nbytes) sum += d[0] + d[t->nbytes - 1];
    }
    return sum;
}

static bool has(const char *hay, const char *needle) { return hay && strstr(hay, needle) != NULL; }

static bool str_eq(const gguf_file *f, const char *key, const char *want) {
    const char *s;
    size_t n;
    return gguf_get_str(f, key, &s, &n) && n == strlen(want) && memcmp(s, want, n) == 0;
}

static bool arr_str_eq(const gguf_file *f, const char *key, uint64_t i, const char *want) {
    const char *s;
    size_t n;
    return gguf_get_arr_str(f, key, i, &s, &n) && n == strlen(want) && memcmp(s, want, n) == 0;
}

static int64_t get_i64(const gguf_file *f, const char *key) {
    int64_t v = INT64_MIN;
    gguf_get_i64(f, key, &v);
    return v;
}

static int64_t sum_elements(const gguf_file *f) {
    int64_t n = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++)
        n += gguf_tensor_nelements(gguf_tensor_at(f, i));
    return n;
}

/* Tensors must be aligned within the file and lie inside it. */
static void check_tensor_placement(const gguf_file *f, const void *base) {
    size_t total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        size_t off = (size_t)((const char *)t->data - (const char *)base);
        CHECK(off % gguf_file_layout(f)->alignment == 0, "%s misaligned at %zu", t->name, off);
        CHECK(off + t->nbytes <= gguf_file_layout(f)->file_size, "%s past end", t->name);
        CHECK(off == gguf_file_layout(f)->data_offset + t->offset, "%s offset", t->name);
        total += t->nbytes;
    }
    CHECK(total == gguf_tensor_data_bytes(f), "data bytes %zu vs %zu", total,
          gguf_tensor_data_bytes(f));
}

/* ---------------------------------------------------------------- real files */

static void test_stories(void) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open("models/stories260K.gguf", &err);
    CHECK(f, "open: %s", err.msg);
    if (!f) return;
    CHECK(gguf_file_layout(f)->version == 3 && gguf_file_layout(f)->alignment == 32,
          "version/alignment");
    CHECK(gguf_n_kv(f) == 19 && gguf_n_tensors(f) == 48, "counts %lld %lld",
          (long long)gguf_n_kv(f), (long long)gguf_n_tensors(f));
    CHECK(str_eq(f, "general.architecture", "llama"), "architecture");
    CHECK(get_i64(f, "llama.block_count") == 5, "block_count");
    CHECK(get_i64(f, "llama.embedding_length") == 64, "embedding_length");
    CHECK(get_i64(f, "llama.feed_forward_length") == 172, "ffn");
    CHECK(sum_elements(f) == 292800, "params %lld", (long long)sum_elements(f));
    uint32_t sep = 0;
    CHECK(gguf_get_u32(f, "tokenizer.ggml.seperator_token_id", &sep) && sep == UINT32_MAX, "sep");
    float eps = 0;
    CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps) &&
              fabsf(eps - 1e-5f) < 1e-9f,
          "eps %g", eps);
    CHECK(!gguf_find_tensor(f, "nope") && gguf_find_key(f, "llama.rope.freq_base") < 0, "absent");
    gguf_vtype et;
    uint64_t n;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, NULL) && et == GGUF_VT_STRING &&
              n == 512,
          "tokens");
    CHECK(arr_str_eq(f, "tokenizer.ggml.tokens", 1, "<s>") &&
              arr_str_eq(f, "tokenizer.ggml.tokens", 2, "</s>"),
          "token strings");
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->dtype == GGUF_DT_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 &&
              t->ne[2] == 1 && t->nbytes == 64 * 512 * 4,
          "token_embd");
    check_tensor_placement(f, (const char *)gguf_tensor_at(f, 0)->data -
                                  gguf_file_layout(f)->data_offset - gguf_tensor_at(f, 0)->offset);
    CHECK(gguf_file_layout(f)->data_offset == 14176, "data offset %zu",
          gguf_file_layout(f)->data_offset);
    walk_all(f);
    gguf_close(f);
}

static void check_oracle(const gguf_file *f, const char *name) {
    int64_t v;
    uint32_t u;
    double d;
    bool b;
    CHECK(get_i64(f, "oracle.u8") == 200 && get_i64(f, "oracle.i8") == -100, "%s u8/i8", name);
    CHECK(get_i64(f, "oracle.u16") == 60000 && get_i64(f, "oracle.i16") == -30000, "%s 16", name);
    CHECK(gguf_get_u32(f, "oracle.u32", &u) && u == 4000000000u, "%s u32", name);
    CHECK(get_i64(f, "oracle.i32") == -2000000000 && !gguf_get_u32(f, "oracle.i32", &u), "%s i32",
          name);
    CHECK(!gguf_get_i64(f, "oracle.u64", &v), "%s u64 beyond int64 must not convert", name);
    CHECK(gguf_get_f64(f, "oracle.u64", &d) && d == 9223372036854788153.0, "%s u64 as f64", name);
    CHECK(get_i64(f, "oracle.i64") == -4611686018427387911LL, "%s i64", name);
    CHECK(gguf_get_f64(f, "oracle.f32", &d) && d == 0.15625, "%s f32", name);
    CHECK(gguf_get_f64(f, "oracle.f64", &d) && d == -1e-300, "%s f64", name);
    CHECK(gguf_get_bool(f, "oracle.bool", &b) && b, "%s bool", name);
    const char *s;
    size_t n;
    CHECK(gguf_get_str(f, "oracle.string", &s, &n) && n > 9 &&
              memcmp(s + n - 9, "\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98\x80", 9) == 0,
          "%s string", name);
    CHECK(gguf_get_arr_i64(f, "oracle.arr_i16", 0, &v) && v == -1 &&
              gguf_get_arr_i64(f, "oracle.arr_i16", 3, &v) && v == 32767 &&
              !gguf_get_arr_i64(f, "oracle.arr_i16", 4, &v),
          "%s arr_i16", name);
    CHECK(gguf_get_arr_f64(f, "oracle.arr_f64", 1, &d) && d == -2.25, "%s arr_f64", name);
    CHECK(gguf_get_arr_i64(f, "oracle.arr_bool", 1, &v) && v == 0 &&
              gguf_get_arr_i64(f, "oracle.arr_bool", 2, &v) && v == 1,
          "%s arr_bool", name);
    CHECK(arr_str_eq(f, "oracle.arr_str", 1, "") &&
              arr_str_eq(f, "oracle.arr_str", 2, "multi word") &&
              arr_str_eq(f, "oracle.arr_str", 3, "\xc3\xbc\xc3\xb1\xc3\xae"),
          "%s arr_str", name);
}

static void check_manifest_entry(const cJSON *m) {
    const char *file = cJSON_GetStringValue(cJSON_GetObjectItem(m, "file"));
    const char *arch = cJSON_GetStringValue(cJSON_GetObjectItem(m, "arch"));
    char path[512], key[256];
    snprintf(path, sizeof path, "tests/data/golden/models/%s", file ? file : "?");
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    CHECK(f, "open: %s", err.msg);
    if (!f) return;
    CHECK(gguf_file_layout(f)->file_size ==
              (size_t)cJSON_GetNumberValue(cJSON_GetObjectItem(m, "size_bytes")),
          "%s size", path);
    CHECK(arch && str_eq(f, "general.architecture", arch), "%s arch", path);
    uint64_t n = 0;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", NULL, &n, NULL) &&
              n == (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(m, "n_vocab")),
          "%s n_vocab", path);
    const cJSON *types = cJSON_GetObjectItem(m, "tensor_types"), *it;
    CHECK(gguf_n_tensors(f) == cJSON_GetArraySize(types), "%s n_tensors", path);
    cJSON_ArrayForEach(it, types) {
        const gguf_tensor *t = gguf_find_tensor(f, it->string);
        CHECK(t && strcmp(gguf_dtype_name(t->dtype), cJSON_GetStringValue(it)) == 0, "%s %s type",
              path, it->string);
    }
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(m, "hparams")) {
        double d = NAN, want = cJSON_GetNumberValue(it);
        snprintf(key, sizeof key, "%s.%s", arch, it->string);
        if (cJSON_IsString(it)) { /* rope.scaling.type */
            CHECK(str_eq(f, key, cJSON_GetStringValue(it)), "%s %s", path, key);
            continue;
        }
        if (cJSON_IsBool(it)) { /* expert_weights_norm */
            bool b = false;
            CHECK(gguf_get_bool(f, key, &b) && b == cJSON_IsTrue(it), "%s %s", path, key);
            continue;
        }
        CHECK(gguf_get_f64(f, key, &d) && fabs(d - want) <= 1e-6 * fabs(want), "%s %s = %g", path,
              key, d);
    }
    if (gguf_n_tensors(f) > 0) {
        check_oracle(f, path);
        check_tensor_placement(f, (const char *)gguf_tensor_at(f, 0)->data -
                                      gguf_file_layout(f)->data_offset -
                                      gguf_tensor_at(f, 0)->offset);
    } else {
        CHECK(gguf_tensor_data_bytes(f) == 0, "%s vocab-only data bytes", path);
    }
    walk_all(f);
    gguf_close(f);
}

static void test_manifest(void) {
    kvl_error err = {{0}};
    char *text = kvl_read_file("tests/data/golden/models/manifest.json", NULL, &err);
    CHECK(text, "manifest: %s", err.msg);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root && cJSON_GetArraySize(root) >= 10, "manifest parse");
    const cJSON *m;
    cJSON_ArrayForEach(m, root) check_manifest_entry(m);
    cJSON_Delete(root);
    free(text);
}

static void test_vocab_files(void) {
    static const char *const files[] = {
        "tests/data/tokenizer/ggml-vocab-llama-spm.gguf",
        "tests/data/tokenizer/ggml-vocab-gpt-2.gguf",
        "tests/data/tokenizer/ggml-vocab-qwen3.gguf",
        "tests/data/tokenizer/ggml-vocab-llama3.gguf",
    };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        kvl_error err = {{0}};
        gguf_file *f = gguf_open(files[i], &err);
        CHECK(f, "open: %s", err.msg);
        if (!f) continue;
        uint64_t n = 0;
        const char *s;
        size_t len;
        CHECK(gguf_n_tensors(f) == 0 && gguf_tensor_data_bytes(f) == 0, "%s tensors", files[i]);
        CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", NULL, &n, NULL) && n > 1000, "%s tokens",
              files[i]);
        CHECK(gguf_get_arr_str(f, "tokenizer.ggml.tokens", n - 1, &s, &len) &&
                  !gguf_get_arr_str(f, "tokenizer.ggml.tokens", n, &s, &len),
              "%s last token", files[i]);
        walk_all(f);
        gguf_close(f);
    }
    kvl_error err = {{0}};
    gguf_file *f = gguf_open("tests/data/llama-2-tiny-random.gguf", &err);
    CHECK(f, "open: %s", err.msg);
    if (!f) return;
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->dtype == GGUF_DT_F16 && t->ne[1] == 32000 && t->nbytes == 8 * 32000 * 2,
          "tiny embd");
    CHECK(arr_str_eq(f, "tokenizer.ggml.tokens", 31999, "\xe7\xbb\x99"), "token 31999");
    walk_all(f);
    gguf_close(f);
}

static void test_open_errors(void) {
    kvl_error err = {{0}};
    CHECK(!gguf_open("/nonexistent/x.gguf", &err) &&
              has(err.msg, "/nonexistent/x.gguf: cannot open"),
          "%s", err.msg);
    CHECK(!gguf_open("tests", &err) && has(err.msg, "tests: not a regular file"), "%s", err.msg);
    char path[] = "/tmp/kvllm_gguf_empty_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    CHECK(!gguf_open(path, &err) && has(err.msg, path) && has(err.msg, "too small"), "%s", err.msg);
    unlink(path);
    CHECK(!gguf_open_memory(NULL, 0, NULL, &err) && has(err.msg, "<memory>"), "%s", err.msg);
}

/* ---------------------------------------------------------------- dtypes */

static void test_dtypes(void) {
    static const struct {
        int id;
        const char *name;
        int be;
        size_t bb;
    } want[] = {
        {0, "F32", 1, 4},
        {1, "F16", 1, 2},
        {2, "Q4_0", 32, 18},
        {3, "Q4_1", 32, 20},
        {6, "Q5_0", 32, 22},
        {7, "Q5_1", 32, 24},
        {8, "Q8_0", 32, 34},
        {9, "Q8_1", 32, 36},
        {10, "Q2_K", 256, 84},
        {11, "Q3_K", 256, 110},
        {12, "Q4_K", 256, 144},
        {13, "Q5_K", 256, 176},
        {14, "Q6_K", 256, 210},
        {15, "Q8_K", 256, 292},
        {24, "I8", 1, 1},
        {25, "I16", 1, 2},
        {26, "I32", 1, 4},
        {27, "I64", 1, 8},
        {28, "F64", 1, 8},
        {30, "BF16", 1, 2},
        {20, "IQ4_NL", 32, 18},
        /* ggml-common.h's sizes of the lattice types (block_iq2_xxs ... block_iq1_m) */
        {16, "IQ2_XXS", 256, 66},
        {17, "IQ2_XS", 256, 74},
        {22, "IQ2_S", 256, 82},
        {18, "IQ3_XXS", 256, 98},
        {21, "IQ3_S", 256, 110},
        {19, "IQ1_S", 256, 50},
        {29, "IQ1_M", 256, 56},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        int be = 0;
        size_t bb = 0;
        CHECK(gguf_dtype_geometry(want[i].id, &be, &bb) && be == want[i].be && bb == want[i].bb &&
                  strcmp(gguf_dtype_name(want[i].id), want[i].name) == 0,
              "dtype %d", want[i].id);
    }
    CHECK(!gguf_dtype_geometry(34, NULL, NULL) && strcmp(gguf_dtype_name(34), "TQ1_0") == 0,
          "TQ1_0");
    CHECK(!gguf_dtype_geometry(4, NULL, NULL) && !gguf_dtype_geometry(-1, NULL, NULL) &&
              !gguf_dtype_geometry(GGUF_DT_COUNT, NULL, NULL) &&
              strcmp(gguf_dtype_name(99), "unknown") == 0,
          "unknown dtypes");
    /* kvllm's own KV type is in the table but is no file type */
    const gguf_dtype_traits *fp8 = gguf_dtype_traits_of(GGUF_DT_FP8_E4M3);
    CHECK(fp8 && fp8->block_elems == 1 && fp8->block_bytes == 1 &&
              strcmp(fp8->kv_name, "fp8") == 0 &&
              !gguf_dtype_geometry(GGUF_DT_FP8_E4M3, NULL, NULL),
          "fp8");
    CHECK(!gguf_dtype_traits_of(99) && !gguf_dtype_traits_of(-1) &&
              !gguf_dtype_traits_of(GGUF_DT_TABLE_SIZE) && gguf_dtype_traits_of(34) &&
              gguf_dtype_traits_of(34)->block_elems == 0,
          "traits of unknown and name-only types");
    CHECK(gguf_row_bytes(GGUF_DT_Q4_K, 512) == 288 && gguf_row_bytes(GGUF_DT_Q4_K, 100) == 0 &&
              gguf_row_bytes(GGUF_DT_F16, 3) == 6 && gguf_row_bytes(GGUF_DT_FP8_E4M3, 5) == 5 &&
              gguf_row_bytes(34, 256) == 0 && gguf_row_bytes(GGUF_DT_F32, -1) == 0,
          "row bytes");
    CHECK(strcmp(gguf_vtype_name(GGUF_VT_UINT32), "u32") == 0 &&
              gguf_vtype_size(GGUF_VT_FLOAT64) == 8 && gguf_vtype_size(GGUF_VT_STRING) == 0 &&
              strcmp(gguf_vtype_name(GGUF_VT_COUNT), "unknown") == 0,
          "vtypes");
}

/* ---------------------------------------------------------------- writer */

/* Reads a whole file into malloc'd memory (for in-memory mutation tests). */
static uint8_t *slurp(const char *path, size_t *len) {
    kvl_error err;
    return (uint8_t *)kvl_read_file(path, len, &err);
}

typedef struct rt_data {
    float f32[2 * 3];
    uint16_t f16[64];
    uint8_t q8[2 * 34];
    uint8_t q4k[144];
    int32_t i32[5];
} rt_data;

static void fill_rt(rt_data *d) {
    for (int i = 0; i < 6; i++) d->f32[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 64; i++) d->f16[i] = kvl_f32_to_f16((float)i);
    for (int i = 0; i < (int)sizeof d->q8; i++) d->q8[i] = (uint8_t)(i * 7);
    for (int i = 0; i < (int)sizeof d->q4k; i++) d->q4k[i] = (uint8_t)(255 - i);
    for (int i = 0; i < 5; i++) d->i32[i] = -i * 1000;
}

static bool build_writer(gguf_writer *w, const rt_data *d) {
    static const char *const toks[] = {"<s>", "", "hello world", "\xe6\x9c\xa8"};
    static const int16_t arr16[] = {-3, 0, 7};
    static const bool bools[] = {true, false};
    int8_t i8 = -5;
    int64_t i64 = INT64_MIN;
    double f64 = 1e300;
    uint16_t u16 = 65535;
    const int64_t ne_f32[] = {2, 3}, ne_f16[] = {8, 4, 2}, ne_q8[] = {32, 2}, ne_q4k[] = {256},
                  ne_i32[] = {5, 1, 1, 1};
    bool ok =
        gguf_writer_set_str(w, "general.architecture", "test") &&
        gguf_writer_set_u32(w, "general.alignment", 32) && gguf_writer_set_u32(w, "t.u32", 7) &&
        gguf_writer_set_u32(w, "t.replaced", 1) && gguf_writer_set_i32(w, "t.i32", -7) &&
        gguf_writer_set_u64(w, "t.u64", UINT64_MAX) && gguf_writer_set_f32(w, "t.f32", 0.25f) &&
        gguf_writer_set_bool(w, "t.bool", true) && gguf_writer_set_str(w, "t.empty", "") &&
        gguf_writer_set_val(w, "t.i8", GGUF_VT_INT8, &i8) &&
        gguf_writer_set_val(w, "t.i64", GGUF_VT_INT64, &i64) &&
        gguf_writer_set_val(w, "t.f64", GGUF_VT_FLOAT64, &f64) &&
        gguf_writer_set_val(w, "t.u16", GGUF_VT_UINT16, &u16) &&
        gguf_writer_set_arr_str(w, "t.tokens", toks, 4) &&
        gguf_writer_set_arr_str(w, "t.no_tokens", NULL, 0) &&
        gguf_writer_set_arr(w, "t.arr16", GGUF_VT_INT16, arr16, 3) &&
        gguf_writer_set_arr(w, "t.bools", GGUF_VT_BOOL, bools, 2) &&
        gguf_writer_set_arr(w, "t.f32s", GGUF_VT_FLOAT32, d->f32, 6) &&
        gguf_writer_set_str(w, "t.replaced", "second") && /* replaces the u32, keeps its slot */
        gguf_writer_add_tensor(w, "w.f32", GGUF_DT_F32, 2, ne_f32, d->f32) &&
        gguf_writer_add_tensor(w, "w.f16", GGUF_DT_F16, 3, ne_f16, d->f16) &&
        gguf_writer_add_tensor(w, "w.q8", GGUF_DT_Q8_0, 2, ne_q8, d->q8) &&
        gguf_writer_add_tensor(w, "w.q4k", GGUF_DT_Q4_K, 1, ne_q4k, d->q4k) &&
        gguf_writer_add_tensor(w, "w.i32", GGUF_DT_I32, 4, ne_i32, d->i32);
    return ok;
}

static void test_writer_rejects(gguf_writer *w) {
    const int64_t ne[] = {32, 2, 1, 1, 1}, bad_row[] = {33}, neg[] = {-1};
    uint8_t buf[68] = {0}, two = 2;
    char long_name[80];
    memset(long_name, 'x', 64);
    long_name[64] = '\0';
    CHECK(!gguf_writer_add_tensor(w, "w.f32", GGUF_DT_F32, 1, ne, buf), "duplicate tensor");
    CHECK(!gguf_writer_add_tensor(w, long_name, GGUF_DT_F32, 1, ne, buf), "64-byte name");
    CHECK(!gguf_writer_add_tensor(w, "", GGUF_DT_F32, 1, ne, buf), "empty name");
    CHECK(!gguf_writer_add_tensor(w, "x", GGUF_DT_F32, 0, ne, buf) &&
              !gguf_writer_add_tensor(w, "x", GGUF_DT_F32, 5, ne, buf),
          "n_dims");
    CHECK(!gguf_writer_add_tensor(w, "x", 16, 1, ne, buf) &&
              !gguf_writer_add_tensor(w, "x", 99, 1, ne, buf) &&
              !gguf_writer_add_tensor(w, "x", GGUF_DT_FP8_E4M3, 1, ne, buf),
          "dtype");
    CHECK(!gguf_writer_add_tensor(w, "x", GGUF_DT_Q8_0, 1, bad_row, buf), "row not block multiple");
    CHECK(!gguf_writer_add_tensor(w, "x", GGUF_DT_F32, 1, neg, buf), "negative ne");
    CHECK(!gguf_writer_set_u32(w, "general.alignment", 64) &&
              !gguf_writer_set_str(w, "general.alignment", "32"),
          "alignment other than 32");
    CHECK(!gguf_writer_set_u32(w, "", 1) && !gguf_writer_set_u32(w, NULL, 1) &&
              !gguf_writer_set_str(w, "k", NULL),
          "bad keys");
    CHECK(!gguf_writer_set_arr(w, "k", GGUF_VT_STRING, buf, 1) &&
              !gguf_writer_set_arr(w, "k", GGUF_VT_ARRAY, buf, 1),
          "non-numeric set_arr");
    CHECK(!gguf_writer_set_arr(w, "k", GGUF_VT_BOOL, &two, 1), "bool array value 2");
    CHECK(!gguf_writer_set_val(w, "k", GGUF_VT_STRING, buf), "set_val string");
}

static void check_round_trip(const gguf_file *f, const rt_data *d) {
    const char *s;
    size_t n;
    double dv;
    float fv;
    int64_t iv;
    uint32_t u;
    bool b;
    CHECK(gguf_file_layout(f)->version == 3 && gguf_file_layout(f)->file_size % 32 == 0 &&
              gguf_n_kv(f) == 18 && gguf_n_tensors(f) == 5,
          "rt header %lld", (long long)gguf_n_kv(f));
    CHECK(strcmp(gguf_key_name(f, 3), "t.replaced") == 0 && str_eq(f, "t.replaced", "second"),
          "rt replaced");
    CHECK(gguf_get_u32(f, "t.u32", &u) && u == 7 && get_i64(f, "t.i32") == -7 &&
              get_i64(f, "t.i8") == -5,
          "rt ints");
    CHECK(get_i64(f, "t.i64") == INT64_MIN && get_i64(f, "t.u16") == 65535, "rt i64/u16");
    CHECK(!gguf_get_i64(f, "t.u64", &iv) && gguf_get_f64(f, "t.u64", &dv) &&
              dv == 18446744073709551615.0,
          "rt u64");
    CHECK(gguf_get_f32(f, "t.f32", &fv) && fv == 0.25f && gguf_get_f64(f, "t.f64", &dv) &&
              dv == 1e300,
          "rt floats");
    CHECK(gguf_get_bool(f, "t.bool", &b) && b && str_eq(f, "t.empty", "") &&
              str_eq(f, "general.architecture", "test"),
          "rt bool/str");
    CHECK(arr_str_eq(f, "t.tokens", 0, "<s>") && arr_str_eq(f, "t.tokens", 1, "") &&
              arr_str_eq(f, "t.tokens", 2, "hello world") &&
              arr_str_eq(f, "t.tokens", 3, "\xe6\x9c\xa8") &&
              !gguf_get_arr_str(f, "t.no_tokens", 0, &s, &n),
          "rt string arrays");
    CHECK(gguf_get_arr_i64(f, "t.arr16", 0, &iv) && iv == -3 &&
              gguf_get_arr_i64(f, "t.bools", 1, &iv) && iv == 0 &&
              gguf_get_arr_f64(f, "t.f32s", 5, &dv) && dv == 1.5,
          "rt numeric arrays");
    static const struct {
        const char *name;
        size_t off;
        size_t nbytes;
    } want[] = {{"w.f32", 0, 24},
                {"w.f16", 32, 128},
                {"w.q8", 160, 68},
                {"w.q4k", 256, 144},
                {"w.i32", 416, 20}};
    const void *src[] = {d->f32, d->f16, d->q8, d->q4k, d->i32};
    for (int i = 0; i < 5; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK(t && strcmp(t->name, want[i].name) == 0 && t->offset == want[i].off &&
                  t->nbytes == want[i].nbytes && memcmp(t->data, src[i], t->nbytes) == 0,
              "rt tensor %s", want[i].name);
    }
    const gguf_tensor *t = gguf_find_tensor(f, "w.f16");
    CHECK(t && t->n_dims == 3 && t->ne[2] == 2 && t->ne[3] == 1 && gguf_tensor_nelements(t) == 64,
          "rt f16 shape");
}

/* Streaming: descriptors with NULL data, then the bytes in any chunking;
 * whole-file write refuses them, a short stream leaves no file. */
static void test_writer_stream(void) {
    char path[] = "/tmp/kvllm_gguf_st_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) close(fd);
    kvl_error err = {{0}};
    const int64_t na[1] = {5}, nb[1] = {3};
    float a[5] = {1, 2, 3, 4, 5}, b[3] = {6, 7, 8};
    gguf_writer *w = gguf_writer_create();
    CHECK(w && gguf_writer_set_u32(w, "k", 7) &&
              gguf_writer_add_tensor(w, "a", GGUF_DT_F32, 1, na, NULL) &&
              gguf_writer_add_tensor(w, "b", GGUF_DT_F32, 1, nb, NULL),
          "stream declare");
    CHECK(!gguf_writer_write(w, path, &err) && strstr(err.msg, "no data"), "write without data: %s",
          err.msg);
    uint64_t size = gguf_writer_file_bytes(w);
    CHECK(gguf_writer_begin(w, path, &err) && gguf_writer_put(w, a, 12, &err) &&
              gguf_writer_put(w, (char *)a + 12, 8, &err) && gguf_writer_put(w, b, 4, &err) &&
              gguf_writer_put(w, b + 1, 8, &err) && gguf_writer_finish(w, &err),
          "stream write: %s", err.msg);
    CHECK(!gguf_writer_put(w, a, 4, &err), "put after finish");
    gguf_writer_destroy(w);
    gguf_file *f = gguf_open(path, &err);
    const gguf_tensor *t = f ? gguf_find_tensor(f, "b") : NULL;
    CHECK(f && gguf_file_layout(f)->file_size == size && t && memcmp(t->data, b, sizeof b) == 0,
          "stream read back: %s", err.msg);
    gguf_close(f);
    w = gguf_writer_create();
    CHECK(w && gguf_writer_add_tensor(w, "a", GGUF_DT_F32, 1, na, NULL) &&
              gguf_writer_begin(w, path, &err) && gguf_writer_put(w, a, 8, &err) &&
              !gguf_writer_finish(w, &err) && strstr(err.msg, "ended early"),
          "short stream: %s", err.msg);
    CHECK(access(path, F_OK) != 0, "short stream leaves no file");
    gguf_writer_destroy(w);
    w = gguf_writer_create();
    CHECK(w && gguf_writer_add_tensor(w, "a", GGUF_DT_F32, 1, na, NULL) &&
              gguf_writer_begin(w, path, &err) && !gguf_writer_put(w, a, 24, &err) &&
              strstr(err.msg, "more tensor data"),
          "long stream: %s", err.msg);
    CHECK(access(path, F_OK) != 0, "long stream leaves no file");
    gguf_writer_destroy(w);
}

static void test_writer_round_trip(void) {
    rt_data d;
    fill_rt(&d);
    gguf_writer *w = gguf_writer_create();
    CHECK(w && build_writer(w, &d), "writer build");
    test_writer_rejects(w);
    char path[] = "/tmp/kvllm_gguf_rt_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) close(fd);
    kvl_error err = {{0}};
    CHECK(gguf_writer_write(w, path, &err), "write: %s", err.msg);
    gguf_writer_destroy(w);
    gguf_file *f = gguf_open(path, &err);
    CHECK(f, "reopen: %s", err.msg);
    if (f) {
        check_round_trip(f, &d);
        walk_all(f);
        gguf_close(f);
    }
    /* v2 has the same little-endian layout: the reader must take it too. */
    size_t len;
    uint8_t *buf = slurp(path, &len);
    if (buf) {
        buf[4] = 2;
        f = gguf_open_memory(buf, len, "v2", &err);
        CHECK(f && gguf_file_layout(f)->version == 2, "v2: %s", err.msg);
        gguf_close(f);
        free(buf);
    }
    unlink(path);
    w = gguf_writer_create();
    CHECK(!gguf_writer_write(w, "/nonexistent/dir/x.gguf", &err),
          "write to a missing dir must fail");
    CHECK(has(err.msg, "/nonexistent/dir/x.gguf"), "%s", err.msg);
    gguf_writer_destroy(w);
}

/* ---------------------------------------------------------------- getter conversions */

static void test_getters(void) {
    gguf_writer *w = gguf_writer_create();
    float big = 3e38f;
    double huge = 1e300, inf = INFINITY;
    int64_t neg = -1, max_u32 = UINT32_MAX, over_u32 = (int64_t)UINT32_MAX + 1;
    uint8_t one = 1, two = 2;
    gguf_writer_set_val(w, "neg", GGUF_VT_INT64, &neg);
    gguf_writer_set_val(w, "max_u32", GGUF_VT_INT64, &max_u32);
    gguf_writer_set_val(w, "over_u32", GGUF_VT_INT64, &over_u32);
    gguf_writer_set_val(w, "u8_one", GGUF_VT_UINT8, &one);
    gguf_writer_set_val(w, "u8_two", GGUF_VT_UINT8, &two);
    gguf_writer_set_val(w, "f32_big", GGUF_VT_FLOAT32, &big);
    gguf_writer_set_val(w, "f64_huge", GGUF_VT_FLOAT64, &huge);
    gguf_writer_set_val(w, "f64_inf", GGUF_VT_FLOAT64, &inf);
    gguf_writer_set_bool(w, "flag", true);
    gguf_writer_set_str(w, "str", "hello");
    gguf_writer_set_arr_str(w, "strs", (const char *const[]){"a"}, 1);
    char path[] = "/tmp/kvllm_gguf_get_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    kvl_error err = {{0}};
    CHECK(gguf_writer_write(w, path, &err), "%s", err.msg);
    gguf_writer_destroy(w);
    gguf_file *f = gguf_open(path, &err);
    unlink(path);
    CHECK(f && gguf_n_tensors(f) == 0, "open: %s", err.msg);
    if (!f) return;
    uint32_t u;
    int64_t iv;
    double dv;
    float fv;
    bool b;
    char buf[4];
    const char *s;
    size_t n;
    const void *data;
    CHECK(!gguf_get_u32(f, "neg", &u) && gguf_get_u32(f, "max_u32", &u) && u == UINT32_MAX &&
              !gguf_get_u32(f, "over_u32", &u),
          "u32 ranges");
    CHECK(gguf_get_f64(f, "neg", &dv) && dv == -1.0 && gguf_get_f32(f, "neg", &fv) && fv == -1.0f,
          "int as float");
    CHECK(!gguf_get_i64(f, "f32_big", &iv) && gguf_get_f32(f, "f32_big", &fv) && fv == big,
          "float as int");
    CHECK(!gguf_get_f32(f, "f64_huge", &fv) && gguf_get_f32(f, "f64_inf", &fv) && isinf(fv),
          "f64 -> f32 range");
    CHECK(gguf_get_bool(f, "u8_one", &b) && b && !gguf_get_bool(f, "u8_two", &b) &&
              !gguf_get_bool(f, "str", &b),
          "bool conversions");
    CHECK(gguf_get_i64(f, "flag", &iv) && iv == 1 && gguf_get_u32(f, "flag", &u) && u == 1,
          "bool as int");
    CHECK(!gguf_get_i64(f, "str", &iv) && !gguf_get_f64(f, "str", &dv) &&
              !gguf_get_str(f, "neg", &s, &n),
          "types");
    CHECK(gguf_get_str_buf(f, "str", buf, sizeof buf) && strcmp(buf, "hel") == 0 &&
              !gguf_get_str_buf(f, "str", buf, 0) &&
              !gguf_get_str_buf(f, "missing", buf, sizeof buf),
          "str_buf");
    CHECK(!gguf_get_i64(f, "missing", &iv) && !gguf_get_arr(f, "str", NULL, NULL, &data) &&
              !gguf_get_arr_i64(f, "strs", 0, &iv) && !gguf_get_arr_f64(f, "strs", 0, &dv) &&
              !gguf_get_arr_str(f, "str", 0, &s, &n) && !gguf_get_i64(f, "strs", &iv),
          "mismatches");
    CHECK(gguf_find_key(f, "missing") == -1 && gguf_find_key(f, NULL) == -1 &&
              !gguf_key_name(f, -1) && !gguf_key_name(f, gguf_n_kv(f)) &&
              gguf_kv_type(f, 99) == GGUF_VT_COUNT &&
              gguf_kv_type(f, gguf_find_key(f, "strs")) == GGUF_VT_ARRAY &&
              !gguf_kv_array(f, gguf_find_key(f, "str"), NULL, NULL) && !gguf_tensor_at(f, 0) &&
              !gguf_find_tensor(f, NULL),
          "index access");
    gguf_close(f);
}

/* ---------------------------------------------------------------- malformed, in memory */

/* A small hand-encoded GGUF with knobs for the corruptions below; mirrors
 * tools/make_bad_gguf.py so that the library check does not need Python. */
typedef struct spec {
    uint32_t version, dims0, dtype1, align_type, align;
    uint64_t n_kv, n_tensors, ne0_1, offset1, str_len, arr_count;
    uint8_t bool_val;
    const char *key2, *name1;
    uint32_t vtype2;
} spec;

typedef struct enc {
    uint8_t b[1024];
    size_t n;
} enc;

static void put(enc *e, const void *p, size_t n) {
    if (e->n + n <= sizeof e->b) memcpy(e->b + e->n, p, n);
    e->n += n;
}
static void put32(enc *e, uint32_t v) { put(e, &v, 4); }
static void put64(enc *e, uint64_t v) { put(e, &v, 8); }
static void putstr(enc *e, const char *s) {
    put64(e, strlen(s));
    put(e, s, strlen(s));
}

static spec base_spec(void) {
    return (spec){.version = 3,
                  .dims0 = 2,
                  .dtype1 = GGUF_DT_Q8_0,
                  .align_type = GGUF_VT_UINT32,
                  .align = 32,
                  .n_kv = 5,
                  .n_tensors = 2,
                  .ne0_1 = 32,
                  .offset1 = 64,
                  .str_len = 5,
                  .arr_count = 2,
                  .bool_val = 1,
                  .key2 = "test.flag",
                  .name1 = "blk.0.w",
                  .vtype2 = GGUF_VT_BOOL};
}

static void encode_spec(enc *e, const spec *s) {
    e->n = 0;
    put(e, "GGUF", 4);
    put32(e, s->version);
    put64(e, s->n_tensors);
    put64(e, s->n_kv);
    putstr(e, "general.architecture");
    put32(e, GGUF_VT_STRING);
    put64(e, s->str_len);
    put(e, "llama", 5);
    putstr(e, "general.alignment");
    put32(e, s->align_type);
    put32(e, s->align);
    putstr(e, s->key2);
    put32(e, s->vtype2);
    put(e, &s->bool_val, 1);
    putstr(e, "tokens");
    put32(e, GGUF_VT_ARRAY);
    put32(e, GGUF_VT_STRING);
    put64(e, s->arr_count);
    putstr(e, "ab");
    putstr(e, "c");
    putstr(e, "scores");
    put32(e, GGUF_VT_ARRAY);
    put32(e, GGUF_VT_FLOAT32);
    put64(e, 2);
    put(e, (const float[]){1.0f, 2.0f}, 8);
    /* tensor 0: F32 [4, 3] at 0 (48 bytes); tensor 1: [ne0_1, 2] at offset1 */
    putstr(e, "tok.weight");
    put32(e, s->dims0);
    for (uint32_t d = 0; d < s->dims0 && d < 8; d++) put64(e, d == 0 ? 4 : 3);
    put32(e, GGUF_DT_F32);
    put64(e, 0);
    putstr(e, s->name1);
    put32(e, 2);
    put64(e, s->ne0_1);
    put64(e, 2);
    put32(e, s->dtype1);
    put64(e, s->offset1);
    while (e->n % 32) put(e, "", 1);
    for (int i = 0; i < 64 + 68; i++) put(e, "\x11", 1);
    while (e->n % 32) put(e, "", 1);
}

static void expect_fail(const spec *s, size_t trunc, const char *want, int line) {
    enc e;
    encode_spec(&e, s);
    kvl_error err = {{0}};
    gguf_file *f = gguf_open_memory(e.b, trunc ? trunc : e.n, "mem.gguf", &err);
    if (f || !has(err.msg, want) || strncmp(err.msg, "mem.gguf: ", 10) != 0 ||
        strchr(err.msg, '\n')) {
        failures++;
        fprintf(stderr, "FAIL %s:%d: expected failure with '%s', got %s\n", __FILE__, line, want,
                f ? "success" : err.msg);
    }
    gguf_close(f);
}
#define EXPECT_FAIL(s, trunc, want) expect_fail(&(s), (trunc), (want), __LINE__)

static void test_malformed_memory(void) {
    spec s = base_spec();
    enc e;
    encode_spec(&e, &s);
    kvl_error err = {{0}};
    gguf_file *f = gguf_open_memory(e.b, e.n, "mem.gguf", &err);
    CHECK(f && gguf_n_tensors(f) == 2 && gguf_find_tensor(f, "blk.0.w")->nbytes == 68, "base: %s",
          err.msg);
    size_t data_end = f ? gguf_file_layout(f)->data_offset + 64 + 68 : e.n;
    gguf_close(f);
#define VARIANT(field, value, want)                                                                \
    do {                                                                                           \
        spec v = base_spec();                                                                      \
        v.field = value;                                                                           \
        EXPECT_FAIL(v, 0, want);                                                                   \
    } while (0)
    VARIANT(version, 1, "version 1 is not supported");
    VARIANT(version, 99, "unsupported GGUF version 99");
    VARIANT(n_kv, 1ull << 60, "absurd metadata count");
    VARIANT(n_tensors, 1ull << 60, "absurd tensor count");
    VARIANT(str_len, 1ull << 60, "exceeds");
    VARIANT(arr_count, 1ull << 60, "absurd array count");
    VARIANT(arr_count, 3, "exceeds"); /* eats the next key, then reads garbage as a key length */
    VARIANT(align, 0, "not a nonzero power of two");
    VARIANT(align, 48, "not a nonzero power of two");
    VARIANT(align_type, GGUF_VT_FLOAT32, "must be an unsigned 32-bit integer, got f32");
    VARIANT(bool_val, 2, "invalid bool value 2");
    VARIANT(vtype2, 13, "unknown value type 13");
    VARIANT(key2, "general.alignment", "duplicate key");
    VARIANT(name1, "tok.weight", "duplicate tensor name");
    VARIANT(dims0, 0, "invalid number of dimensions 0");
    VARIANT(dims0, 5, "invalid number of dimensions 5");
    VARIANT(dtype1, 99, "unknown tensor type 99");
    VARIANT(dtype1, 35, "unsupported tensor type 35 (TQ2_0)");
    VARIANT(dtype1, GGUF_DT_FP8_E4M3, "unknown tensor type 64");
    VARIANT(ne0_1, 48, "not a multiple of the Q8_0 block size 32");
    VARIANT(ne0_1, 1ull << 63, "invalid size");
    VARIANT(ne0_1, 1ull << 62, "overflows");
    VARIANT(offset1, 48, "not a multiple of the alignment 32");
    VARIANT(offset1, 1ull << 40, "past the end");
    VARIANT(offset1, UINT64_MAX - 31, "past the end");
    spec v = base_spec();
    EXPECT_FAIL(v, 3, "too small");
    EXPECT_FAIL(v, data_end - 1, "past the end");
    /* Every truncation short of the last tensor's bytes must fail cleanly. */
    for (size_t len = 0; len < data_end; len++) {
        f = gguf_open_memory(e.b, len, "mem.gguf", &err);
        CHECK(!f && strncmp(err.msg, "mem.gguf: ", 10) == 0, "truncated to %zu", len);
        gguf_close(f);
    }
    f = gguf_open_memory(e.b, data_end, "mem.gguf", &err); /* trailing padding is optional */
    CHECK(f, "without final padding: %s", err.msg);
    gguf_close(f);
    memcpy(e.b, "GGML", 4);
    f = gguf_open_memory(e.b, e.n, "mem.gguf", &err);
    CHECK(!f && has(err.msg, "not a GGUF file"), "magic: %s", err.msg);
}

/* Every single-byte change of the header region must load or fail with a
 * message; under ASan/valgrind this also proves no out-of-bounds read. */
static void test_byte_mutations(void) {
    spec s = base_spec();
    enc e;
    encode_spec(&e, &s);
    static const uint8_t vals[] = {0x00, 0x01, 0x02, 0x0d, 0x20, 0x7f, 0x80, 0xff};
    for (size_t i = 0; i < e.n - 64 - 68; i++) {
        uint8_t orig = e.b[i];
        for (size_t k = 0; k < sizeof vals; k++) {
            kvl_error err = {{0}};
            e.b[i] = vals[k];
            gguf_file *f = gguf_open_memory(e.b, e.n, "mut", &err);
            if (f) walk_all(f);
            else
                CHECK(strncmp(err.msg, "mut: ", 5) == 0 && !strchr(err.msg, '\n'), "byte %zu: %s",
                      i, err.msg);
            gguf_close(f);
        }
        e.b[i] = orig;
    }
}

/* ---------------------------------------------------------------- generated files */

/* Checks the files tools/make_bad_gguf.py wrote into dir against expected.tsv. */
static int check_dir(const char *dir) {
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/expected.tsv", dir);
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "FAIL cannot read %s\n", path);
        return 1;
    }
    int n = 0;
    while (fgets(line, sizeof line, fp)) {
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = '\0';
        tab[strcspn(tab + 1, "\n") + 1] = '\0';
        const char *want = tab + 1;
        snprintf(path, sizeof path, "%s/%s", dir, line);
        kvl_error err = {{0}};
        gguf_file *f = gguf_open(path, &err);
        if (strcmp(want, "OK") == 0) {
            CHECK(f, "%s must load: %s", line, err.msg);
            if (f) walk_all(f);
        } else {
            CHECK(!f && has(err.msg, want) && strncmp(err.msg, path, strlen(path)) == 0 &&
                      !strchr(err.msg, '\n'),
                  "%s: want '%s', got '%s'", line, want, f ? "success" : err.msg);
            if (!f) printf("  %s\n", err.msg);
        }
        gguf_close(f);
        n++;
    }
    fclose(fp);
    printf("checked %d generated files\n", n);
    CHECK(n >= 12, "too few generated files");
    return failures != 0;
}

/* --override-kv: values replaced or added for every reader, the file's kind
 * of value kept, bad specs refused with the reason. */
static void test_override(void) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open("models/stories260K.gguf", &err);
    CHECK(f, "open: %s", err.msg);
    if (!f) return;
    CHECK(gguf_override_kv(f, "llama.block_count=int:3", &err), "int: %s", err.msg);
    CHECK(get_i64(f, "llama.block_count") == 3, "block_count overridden");
    float eps = 0;
    CHECK(gguf_override_kv(f, "llama.attention.layer_norm_rms_epsilon=float:2.5e-6", &err) &&
              gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps) && eps == 2.5e-6f,
          "float: %s", err.msg);
    CHECK(gguf_override_kv(f, "llama.attention.layer_norm_rms_epsilon=int:1", &err),
          "int into a float key: %s", err.msg);
    bool b = true;
    CHECK(gguf_override_kv(f, "tokenizer.ggml.add_bos_token=bool:false", &err) &&
              gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) && !b,
          "bool: %s", err.msg);
    CHECK(gguf_override_kv(f, "general.name=str:renamed", &err) &&
              str_eq(f, "general.name", "renamed"),
          "str: %s", err.msg);
    const int64_t n_kv = gguf_n_kv(f);
    CHECK(gguf_override_kv(f, "kvllm.test.new_key=int:-7", &err) &&
              get_i64(f, "kvllm.test.new_key") == -7 && gguf_n_kv(f) == n_kv + 1,
          "a new key: %s", err.msg);
    CHECK(gguf_override_kv(f, "kvllm.test.new_key=int:8", &err) &&
              get_i64(f, "kvllm.test.new_key") == 8 && gguf_n_kv(f) == n_kv + 1,
          "twice: %s", err.msg);
    static const char *const bad[][2] = {
        {"llama.block_count", "expected KEY=TYPE:VALUE"},
        {"=int:3", "expected KEY=TYPE:VALUE"},
        {"llama.block_count=int:x", "not an integer"},
        {"llama.block_count=int:", "not an integer"},
        {"llama.block_count=float:1.5", "an integer: use int:"},
        {"llama.block_count=long:1", "unknown type"},
        {"general.name=int:1", "a string: use str:"},
        {"tokenizer.ggml.tokens=str:x", "an array"},
        {"tokenizer.ggml.add_bos_token=bool:yes", "true or false"},
        {"llama.rope.dimension_count=float:nan", "not a finite number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = 0;
        CHECK(!gguf_override_kv(f, bad[i][0], &err) && strstr(err.msg, bad[i][1]),
              "%s: refused naming '%s' (got '%s')", bad[i][0], bad[i][1], err.msg);
    }
    CHECK(get_i64(f, "llama.block_count") == 3, "a refused override changes nothing");
    gguf_close(f);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--check-dir") == 0) return check_dir(argv[2]);
    test_dtypes();
    test_stories();
    test_manifest();
    test_vocab_files();
    test_open_errors();
    test_writer_round_trip();
    test_writer_stream();
    test_getters();
    test_override();
    test_malformed_memory();
    test_byte_mutations();
    if (failures) {
        fprintf(stderr, "test_gguf: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_gguf: all passed\n");
    return 0;
}
