/* gguf: GGUF v3 writer. See gguf.h.
 *
 * Each metadata value is serialized (u32 type + payload) when it is set, so
 * writing is a straight concatenation. Tensor data is laid out the way
 * llama.cpp requires: in descriptor order, each tensor starting at the running
 * total of the previous sizes rounded up to the alignment, the last one
 * padded too (llama.cpp reads the padded total when it loads the blob). */
#define _GNU_SOURCE
#include "gguf_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvl_buf.h"

enum { WRITER_ALIGN = 32, MAX_TENSOR_NAME = 63 /* llama.cpp: GGML_MAX_NAME - 1 */ };

/* ---------------------------------------------------------------- serializing */

/* The GGUF encodings (little-endian) onto a kvl_buf. */
static void bb_u32(kvl_buf *b, uint32_t v) { kvl_buf_put(b, &v, 4); }
static void bb_u64(kvl_buf *b, uint64_t v) { kvl_buf_put(b, &v, 8); }

static void bb_str(kvl_buf *b, const char *s) {
    size_t n = strlen(s);
    bb_u64(b, n);
    kvl_buf_put(b, s, n);
}

static void bb_pad(kvl_buf *b, size_t align) {
    static const uint8_t zeros[WRITER_ALIGN];
    kvl_buf_put(b, zeros, (align - b->len % align) % align);
}

/* ---------------------------------------------------------------- writer */

typedef struct wkv {
    char *key;
    kvl_buf val; /* u32 type + payload */
} wkv;

typedef struct wtensor {
    char *name;
    int dtype, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data;
    size_t nbytes;
    uint64_t offset;
} wtensor;

struct gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *ts;
    size_t n_t, cap_t;
    gguf_strindex kv_ix, t_ix;
    size_t data_size; /* padded total so far = offset of the next tensor */
    /* streaming (gguf_writer_begin .. finish) */
    FILE *fp;
    char *path;
    size_t cur;        /* tensor being written */
    uint64_t cur_done; /* of its bytes */
    size_t header_len;
};

gguf_writer *gguf_writer_create(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_destroy(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        kvl_buf_free(&w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->ts[i].name);
    free(w->kvs);
    free(w->ts);
    gguf_strindex_free(&w->kv_ix);
    gguf_strindex_free(&w->t_ix);
    if (w->fp) { /* begun, never finished: no partial model behind */
        fclose(w->fp);
        remove(w->path);
    }
    free(w->path);
    free(w);
}

/* The reader derives the data layout from general.alignment; the writer
 * always pads to 32, so any other value would make the file inconsistent. */
static bool alignment_ok(const char *key, const kvl_buf *val) {
    if (strcmp(key, "general.alignment") != 0) return true;
    uint32_t t, v;
    if (val->len != 8) return false;
    memcpy(&t, val->p, 4);
    memcpy(&v, val->p + 4, 4);
    return t == GGUF_VT_UINT32 && v == WRITER_ALIGN;
}

/* Stores key = val, taking ownership of val (freed on failure). */
static bool set_kv(gguf_writer *w, const char *key, kvl_buf *val) {
    bool ok = w && key && key[0] && !val->oom && alignment_ok(key, val);
    int64_t idx = ok ? gguf_strindex_find(&w->kv_ix, key) : -1;
    if (ok && idx >= 0) { /* replace in place, keeping the key's position */
        kvl_buf_free(&w->kvs[idx].val);
        w->kvs[idx].val = *val;
        return true;
    }
    char *copy = ok ? strdup(key) : NULL;
    ok = copy && kvl_grow((void **)&w->kvs, &w->cap_kv, w->n_kv + 1, sizeof *w->kvs, 16) &&
         gguf_strindex_add(&w->kv_ix, copy, (int64_t)w->n_kv);
    if (!ok) {
        free(copy);
        kvl_buf_free(val);
        return false;
    }
    w->kvs[w->n_kv++] = (wkv){.key = copy, .val = *val};
    return true;
}

bool gguf_writer_set_val(gguf_writer *w, const char *key, gguf_vtype type, const void *v) {
    size_t n = gguf_vtype_size(type);
    if (n == 0 || !v) return false;
    kvl_buf b = {0};
    bb_u32(&b, (uint32_t)type);
    if (type == GGUF_VT_BOOL) {
        uint8_t u = *(const bool *)v ? 1 : 0; /* C bool -> the on-disk 0/1 byte */
        kvl_buf_put(&b, &u, 1);
    } else {
        kvl_buf_put(&b, v, n);
    }
    return set_kv(w, key, &b);
}

bool gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    return gguf_writer_set_val(w, key, GGUF_VT_UINT32, &v);
}
bool gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) {
    return gguf_writer_set_val(w, key, GGUF_VT_INT32, &v);
}
bool gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) {
    return gguf_writer_set_val(w, key, GGUF_VT_UINT64, &v);
}
bool gguf_writer_set_f32(gguf_writer *w, const char *key, float v) {
    return gguf_writer_set_val(w, key, GGUF_VT_FLOAT32, &v);
}
bool gguf_writer_set_bool(gguf_writer *w, const char *key, bool v) {
    return gguf_writer_set_val(w, key, GGUF_VT_BOOL, &v);
}

bool gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    if (!v) return false;
    kvl_buf b = {0};
    bb_u32(&b, GGUF_VT_STRING);
    bb_str(&b, v);
    return set_kv(w, key, &b);
}

bool gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data,
                         uint64_t n) {
    size_t esize = gguf_vtype_size(elem_type), total;
    if (esize == 0 || n > SIZE_MAX || !kvl_mul_ok((size_t)n, esize, &total) || (n && !data))
        return false;
    if (elem_type == GGUF_VT_BOOL) /* the reader rejects bool bytes other than 0/1 */
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1) return false;
    kvl_buf b = {0};
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u32(&b, (uint32_t)elem_type);
    bb_u64(&b, n);
    kvl_buf_put(&b, data, total);
    return set_kv(w, key, &b);
}

bool gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (n && !strs) return false;
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i]) return false;
    kvl_buf b = {0};
    bb_u32(&b, GGUF_VT_ARRAY);
    bb_u32(&b, GGUF_VT_STRING);
    bb_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) bb_str(&b, strs[i]);
    return set_kv(w, key, &b);
}

/* Checks a descriptor the way the reader will, so a written file always reads back. */
static bool tensor_ok(const wtensor *t) {
    size_t len = t->name ? strlen(t->name) : 0;
    if (len == 0 || len > MAX_TENSOR_NAME) return false;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS || !gguf_dtype_geometry(t->dtype, NULL, NULL))
        return false;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        if (t->ne[d] < 0) return false;
    return true;
}

bool gguf_writer_add_tensor(gguf_writer *w, const char *name, int dtype, int n_dims,
                            const int64_t *ne, const void *data) {
    if (!w || !ne) return false;
    wtensor t = {.name = (char *)name, .dtype = dtype, .n_dims = n_dims, .data = data};
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
    size_t padded;
    if (!tensor_ok(&t) || gguf_strindex_find(&w->t_ix, name) >= 0 ||
        gguf_shape_nbytes(dtype, t.ne, &t.nbytes) != GGUF_SHAPE_OK ||
        !kvl_add_ok(t.nbytes, WRITER_ALIGN - 1, &padded) ||
        !kvl_add_ok(w->data_size, padded & ~(size_t)(WRITER_ALIGN - 1), &padded))
        return false;
    t.offset = w->data_size;
    t.name = strdup(name);
    if (!t.name || !kvl_grow((void **)&w->ts, &w->cap_t, w->n_t + 1, sizeof *w->ts, 16) ||
        !gguf_strindex_add(&w->t_ix, t.name, (int64_t)w->n_t)) {
        free(t.name);
        return false;
    }
    w->ts[w->n_t++] = t;
    w->data_size = padded;
    return true;
}

/* Everything before the data section, padded to the alignment. */
static void build_header(const gguf_writer *w, kvl_buf *h) {
    kvl_buf_put(h, "GGUF", 4);
    bb_u32(h, 3);
    bb_u64(h, w->n_t);
    bb_u64(h, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        bb_str(h, w->kvs[i].key);
        kvl_buf_put(h, w->kvs[i].val.p, w->kvs[i].val.len);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->ts[i];
        bb_str(h, t->name);
        bb_u32(h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) bb_u64(h, (uint64_t)t->ne[d]);
        bb_u32(h, (uint32_t)t->dtype);
        bb_u64(h, t->offset);
    }
    bb_pad(h, WRITER_ALIGN);
}

static bool write_data(const gguf_writer *w, FILE *fp) {
    static const uint8_t zeros[WRITER_ALIGN];
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->ts[i];
        size_t pad = (WRITER_ALIGN - t->nbytes % WRITER_ALIGN) % WRITER_ALIGN;
        if (t->nbytes && fwrite(t->data, 1, t->nbytes, fp) != t->nbytes) return false;
        if (pad && fwrite(zeros, 1, pad, fp) != pad) return false;
    }
    return true;
}

bool gguf_writer_write(gguf_writer *w, const char *path, kvl_error *err) {
    if (!w || !path) return kvl_fail(err, "gguf writer: no writer or path");
    for (size_t i = 0; i < w->n_t; i++)
        if (w->ts[i].nbytes && !w->ts[i].data)
            return kvl_fail(err,
                            "%s: tensor %s has no data (streamed tensors need gguf_writer_begin)",
                            path, w->ts[i].name);
    kvl_buf h = {0};
    build_header(w, &h);
    if (h.oom) {
        kvl_buf_free(&h);
        return kvl_fail(err, "%s: out of memory building the GGUF header", path);
    }
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        kvl_buf_free(&h);
        return kvl_fail(err, "%s: cannot create: %s", path, strerror(errno));
    }
    bool ok = fwrite(h.p, 1, h.len, fp) == h.len && write_data(w, fp);
    int e = errno;
    if (fclose(fp) != 0 && ok) {
        ok = false;
        e = errno;
    }
    kvl_buf_free(&h);
    if (!ok) {
        remove(path); /* never leave a truncated model behind */
        return kvl_fail(err, "%s: write failed: %s", path, strerror(e));
    }
    return true;
}

/* ---------------------------------------------------------------- streaming */

uint64_t gguf_writer_file_bytes(const gguf_writer *w) {
    kvl_buf h = {0};
    build_header(w, &h);
    uint64_t n = h.oom ? 0 : h.len + w->data_size;
    kvl_buf_free(&h);
    return n;
}

/* Closes and removes a streamed file after a failure; returns false. */
static bool stream_abort(gguf_writer *w, kvl_error *err, const char *what, int e) {
    if (w->fp) fclose(w->fp);
    w->fp = NULL;
    remove(w->path);
    return kvl_fail(err, "%s: %s%s%s", w->path, what, e ? ": " : "", e ? strerror(e) : "");
}

/* Pads after every finished tensor up to the next one with data left. */
static bool stream_pad(gguf_writer *w) {
    static const uint8_t zeros[WRITER_ALIGN];
    while (w->cur < w->n_t && w->cur_done == w->ts[w->cur].nbytes) {
        size_t pad = (WRITER_ALIGN - w->ts[w->cur].nbytes % WRITER_ALIGN) % WRITER_ALIGN;
        if (pad && fwrite(zeros, 1, pad, w->fp) != pad) return false;
        w->cur++;
        w->cur_done = 0;
    }
    return true;
}

bool gguf_writer_begin(gguf_writer *w, const char *path, kvl_error *err) {
    if (!w || !path) return kvl_fail(err, "gguf writer: no writer or path");
    if (w->fp || w->path) return kvl_fail(err, "%s: gguf writer already begun", path);
    w->path = strdup(path);
    kvl_buf h = {0};
    build_header(w, &h);
    if (h.oom || !w->path) {
        kvl_buf_free(&h);
        return kvl_fail(err, "%s: out of memory building the GGUF header", path);
    }
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        kvl_buf_free(&h);
        return kvl_fail(err, "%s: cannot create: %s", path, strerror(errno));
    }
    setvbuf(w->fp, NULL, _IOFBF, 1 << 22);
    bool ok = fwrite(h.p, 1, h.len, w->fp) == h.len;
    w->header_len = h.len;
    kvl_buf_free(&h);
    w->cur = 0;
    w->cur_done = 0;
    return (ok && stream_pad(w)) || stream_abort(w, err, "write failed", errno);
}

bool gguf_writer_put(gguf_writer *w, const void *data, size_t n, kvl_error *err) {
    if (!w || !w->fp) return kvl_fail(err, "gguf writer: put without a begun file");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_t)
            return stream_abort(w, err, "more tensor data than the tensors declared", 0);
        uint64_t left = w->ts[w->cur].nbytes - w->cur_done;
        size_t k = n < left ? n : (size_t)left;
        if (fwrite(p, 1, k, w->fp) != k) return stream_abort(w, err, "write failed", errno);
        w->cur_done += k;
        p += k;
        n -= k;
        if (!stream_pad(w)) return stream_abort(w, err, "write failed", errno);
    }
    return true;
}

bool gguf_writer_finish(gguf_writer *w, kvl_error *err) {
    if (!w || !w->fp) return kvl_fail(err, "gguf writer: finish without a begun file");
    if (w->cur < w->n_t) {
        char what[128];
        snprintf(what, sizeof what, "tensor data ended early, in %.63s", w->ts[w->cur].name);
        return stream_abort(w, err, what, 0);
    }
    FILE *fp = w->fp;
    w->fp = NULL;
    if (fclose(fp) != 0) {
        int e = errno;
        remove(w->path);
        return kvl_fail(err, "%s: write failed: %s", w->path, strerror(e));
    }
    return true;
}
