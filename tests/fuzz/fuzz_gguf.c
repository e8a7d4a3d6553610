/* libFuzzer target for the GGUF reader: any input must either load or fail
 * with a one-line message; a loaded file must expose only consistent,
 * in-bounds data. Invariant violations trap so the fuzzer reports them.
 * Build: see tests/fuzz/run_fuzz.sh. */
#include "gguf.h"

#include <string.h>

#define ENSURE(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static volatile uint64_t sink; /* keeps the reads below from being optimized out */

static void touch(const void *p, size_t n) {
    const unsigned char *b = p;
    if (n) sink += b[0] + b[n - 1];
}

/* Elements 0..63 and the last 64: enough to hit both ends of every table. */
static bool pick(uint64_t j, uint64_t n) { return j < 64 || j + 64 >= n; }

static void walk_array(const gguf_file *f, const char *key, int64_t idx) {
    gguf_vtype et;
    uint64_t n, n2;
    const void *data;
    ENSURE(gguf_kv_array(f, idx, &et, &n));
    ENSURE(gguf_get_arr(f, key, &et, &n2, &data) && n2 == n);
    for (uint64_t j = 0; j < n; j = pick(j + 1, n) ? j + 1 : n - 64) {
        const char *s;
        size_t len;
        int64_t iv;
        double dv;
        if (et == GGUF_VT_STRING) {
            ENSURE(gguf_get_arr_str(f, key, j, &s, &len));
            touch(s, len);
        } else {
            ENSURE(gguf_get_arr_f64(f, key, j, &dv));
            if (gguf_get_arr_i64(f, key, j, &iv)) sink += (uint64_t)iv;
            touch((const char *)data + j * gguf_vtype_size(et), gguf_vtype_size(et));
        }
    }
    const char *s;
    size_t len;
    int64_t iv;
    ENSURE(!gguf_get_arr_str(f, key, n, &s, &len) && !gguf_get_arr_i64(f, key, n, &iv));
}

static void walk_kv(const gguf_file *f, int64_t i) {
    const char *key = gguf_key_name(f, i), *s;
    size_t len;
    int64_t iv;
    uint32_t u;
    double dv;
    float fv;
    bool b;
    char buf[16];
    ENSURE(key && key[0] && gguf_find_key(f, key) == i);
    gguf_vtype t = gguf_kv_type(f, i);
    ENSURE((unsigned)t < GGUF_VT_COUNT);
    if (gguf_get_i64(f, key, &iv)) sink += (uint64_t)iv;
    if (gguf_get_u32(f, key, &u)) sink += u;
    if (gguf_get_f64(f, key, &dv)) sink += dv == dv;
    if (gguf_get_f32(f, key, &fv)) sink += fv == fv;
    if (gguf_get_bool(f, key, &b)) sink += b;
    ENSURE(gguf_get_str(f, key, &s, &len) == (t == GGUF_VT_STRING));
    if (t == GGUF_VT_STRING) {
        touch(s, len);
        ENSURE(gguf_get_str_buf(f, key, buf, sizeof buf));
    }
    if (t == GGUF_VT_ARRAY) walk_array(f, key, i);
}

static void walk_tensor(const gguf_file *f, int64_t i, const uint8_t *base, size_t size) {
    const gguf_tensor *t = gguf_tensor_at(f, i);
    int be;
    size_t bb;
    ENSURE(t && gguf_find_tensor(f, t->name) == t);
    ENSURE(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS && gguf_dtype_geometry(t->dtype, &be, &bb));
    ENSURE(t->ne[0] % be == 0 && gguf_tensor_nelements(t) >= 0);
    const uint8_t *d = t->data;
    ENSURE(d >= base && (size_t)(d - base) <= size && t->nbytes <= size - (size_t)(d - base));
    ENSURE((size_t)(d - base) % gguf_file_layout(f)->alignment == 0);
    touch(d, t->nbytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvl_error err;
    err.msg[0] = '\0';
    gguf_file *f = gguf_open_memory(data, size, "fuzz", &err);
    if (!f) {
        ENSURE(strncmp(err.msg, "fuzz: ", 6) == 0 && !strchr(err.msg, '\n'));
        return 0;
    }
    const gguf_layout *lay = gguf_file_layout(f);
    ENSURE(lay->version == 2 || lay->version == 3);
    size_t a = lay->alignment;
    ENSURE(a && (a & (a - 1)) == 0 && lay->file_size == size);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) walk_kv(f, i);
    size_t total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        walk_tensor(f, i, data, size);
        total += gguf_tensor_at(f, i)->nbytes;
    }
    ENSURE(total == gguf_tensor_data_bytes(f));
    ENSURE(!gguf_tensor_at(f, gguf_n_tensors(f)) && !gguf_key_name(f, gguf_n_kv(f)));
    gguf_close(f);
    return 0;
}
