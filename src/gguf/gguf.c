/* gguf: strict GGUF v2/v3 reader and typed getters. See gguf.h.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 * n_kv x {string key, u32 type, value}, n_tensors x {string name, u32 n_dims,
 * u64 ne[n_dims], u32 dtype, u64 offset}, padding to `general.alignment`,
 * tensor data. A string is u64 length + bytes (no NUL). An array value is
 * u32 element type + u64 count + packed elements.
 *
 * Every read goes through the bounds-checked cursor below; nothing is
 * allocated in proportion to a count from the file before the bytes backing
 * that count have been seen, so a corrupt count fails fast instead of
 * attempting a huge allocation. */
#define _GNU_SOURCE
#include "gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c decodes little-endian values with memcpy; big-endian hosts are not supported"
#endif

/* ---------------------------------------------------------------- types */

/* Both tables are indexed by the type's number. */
#define VT_NAME(name, num, str, size) [num] = str,
#define VT_SIZE(name, num, str, size) [num] = size,
static const char *const VT_NAMES[GGUF_VT_COUNT] = {GGUF_VTYPES(VT_NAME)};
static const uint8_t VT_SIZES[GGUF_VT_COUNT] = {GGUF_VTYPES(VT_SIZE)};
#undef VT_NAME
#undef VT_SIZE

const char *gguf_vtype_name(gguf_vtype t) {
    return (unsigned)t < GGUF_VT_COUNT ? VT_NAMES[t] : "unknown";
}

size_t gguf_vtype_size(gguf_vtype t) { return (unsigned)t < GGUF_VT_COUNT ? VT_SIZES[t] : 0; }

/* ---------------------------------------------------------------- file object */

typedef struct gguf_kv {
    char *key;            /* NUL-terminated copy */
    gguf_vtype type;      /* GGUF_VT_ARRAY for arrays */
    gguf_vtype elem_type; /* arrays only */
    uint64_t count;       /* arrays: elements; strings: bytes */
    const uint8_t *data;  /* scalar bytes, string bytes, or first array element */
    uint64_t *str_offs;   /* string arrays: offset of element i's length prefix from data */
} gguf_kv;

struct gguf_file {
    char *path;
    const uint8_t *buf;
    gguf_layout layout;
    void *map; /* our mmap, or NULL for gguf_open_memory */
    size_t data_bytes;
    uint64_t n_kv_decl, n_tensors_decl;
    gguf_kv *kvs;
    int64_t n_kv;
    size_t cap_kv;
    gguf_tensor *tensors;
    int64_t n_tensors;
    size_t cap_tensors;
    gguf_strindex kv_ix, tensor_ix;
    void **owned; /* --override-kv values (gguf_override_kv) */
    size_t n_owned;
    /* A split model's other files (gguf_open: split.count > 1), whose
     * tensors joined this file's table; their mappings stay until close. */
    struct gguf_file **splits;
    int n_splits;
};

/* Smallest possible encodings, used to bound counts by the bytes left:
 * key (u64 len, >= 1 byte) + u32 type + 1-byte value; tensor name (u64 len,
 * >= 1 byte) + u32 n_dims + one u64 ne + u32 dtype + u64 offset. */
enum { MIN_KV_BYTES = 8 + 1 + 4 + 1, MIN_TENSOR_BYTES = 8 + 1 + 4 + 8 + 4 + 8 };

/* ---------------------------------------------------------------- errors */

/* Copies a hostile name into out as printable ASCII so that an error message
 * stays one line: other bytes become \xNN; long names are cut with "...". */
static const char *show(char out[static 96], const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 8 >= 96) {
            memcpy(out + o, "...", 4);
            return out;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, 96 - o, "\\x%02x", c);
    }
    out[o] = '\0';
    return out;
}

typedef struct rd {
    const uint8_t *buf;
    size_t len, pos;
    const char *file;
    kvl_error *err;
    const char *ctx_kind; /* "key" or "tensor" while inside one, else NULL */
    const char *ctx_name;
} rd;

/* Formats "FILE: key 'K': offset N: reason" (or tensor 'NAME') inside a key or
 * tensor record, otherwise "FILE: offset N: reason". Always returns false. */
static bool __attribute__((format(printf, 3, 4)))
rfail_at(rd *r, size_t off, const char *fmt, ...) {
    char reason[384], name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (r->ctx_kind)
        return kvl_fail(r->err, "%s: %s '%s': offset %zu: %s", r->file, r->ctx_kind,
                        show(name, r->ctx_name, strlen(r->ctx_name)), off, reason);
    return kvl_fail(r->err, "%s: offset %zu: %s", r->file, off, reason);
}
#define rfail(r, ...) rfail_at((r), (r)->pos, __VA_ARGS__)

/* ---------------------------------------------------------------- cursor */

static size_t left(const rd *r) { return r->len - r->pos; }

static bool need(rd *r, uint64_t n, const char *what) {
    if (n <= left(r)) return true;
    return rfail(r, "truncated: %s needs %" PRIu64 " bytes, %zu left", what, n, left(r));
}

static bool rd_u32(rd *r, uint32_t *v, const char *what) {
    if (!need(r, 4, what)) return false;
    memcpy(v, r->buf + r->pos, 4);
    r->pos += 4;
    return true;
}

static bool rd_u64(rd *r, uint64_t *v, const char *what) {
    if (!need(r, 8, what)) return false;
    memcpy(v, r->buf + r->pos, 8);
    r->pos += 8;
    return true;
}

/* A string: u64 length then that many bytes, which must all be in the file. */
static bool rd_str(rd *r, const uint8_t **s, uint64_t *n, const char *what) {
    size_t at = r->pos;
    if (!rd_u64(r, n, what)) return false;
    if (*n > left(r))
        return rfail_at(
            r, at, "%s length %" PRIu64 " exceeds the %zu bytes left (corrupt or truncated file)",
            what, *n, left(r));
    *s = r->buf + r->pos;
    r->pos += (size_t)*n;
    return true;
}

/* Reads a key or tensor name and returns a NUL-terminated copy: these are
 * looked up with strcmp, so empty names and embedded NULs are rejected. */
static char *rd_name(rd *r, const char *what) {
    size_t at = r->pos;
    const uint8_t *s;
    uint64_t n;
    if (!rd_str(r, &s, &n, what)) return NULL;
    if (n == 0) return rfail_at(r, at, "empty %s", what), NULL;
    if (memchr(s, 0, (size_t)n)) {
        char shown[96];
        rfail_at(r, at, "%s '%s' contains a NUL byte", what,
                 show(shown, (const char *)s, (size_t)n));
        return NULL;
    }
    char *copy = strndup((const char *)s, (size_t)n);
    if (!copy) rfail_at(r, at, "out of memory");
    return copy;
}

/* ---------------------------------------------------------------- header */

static bool check_version(rd *r, uint32_t v) {
    if (v == 2 || v == 3) return true;
    if (v == 1)
        return rfail_at(r, 4,
                        "GGUF version 1 is not supported (obsolete format from before "
                        "November 2023; re-convert the model)");
    if ((v & 0xffff) == 0 && (v >> 24) >= 1 && (v >> 24) <= 3)
        return rfail_at(r, 4, "big-endian GGUF (version field 0x%08" PRIx32 ") is not supported",
                        v);
    return rfail_at(r, 4, "unsupported GGUF version %" PRIu32 " (this reader handles 2 and 3)", v);
}

/* A count is plausible only if the bytes left could hold that many minimal records. */
static bool check_count(rd *r, size_t at, uint64_t n, size_t min_bytes, const char *what) {
    if (n <= left(r) / min_bytes) return true;
    return rfail_at(r, at,
                    "absurd %s %" PRIu64
                    ": the %zu bytes left hold at most %zu (corrupt or truncated file)",
                    what, n, left(r), left(r) / min_bytes);
}

static bool parse_header(gguf_file *f, rd *r) {
    if (r->len < 4) return rfail_at(r, 0, "file too small for a GGUF header (%zu bytes)", r->len);
    if (memcmp(r->buf, "GGUF", 4) != 0) {
        char shown[96];
        return rfail_at(r, 0, "not a GGUF file (magic '%s', expected 'GGUF')",
                        show(shown, (const char *)r->buf, 4));
    }
    r->pos = 4;
    if (!rd_u32(r, &f->layout.version, "version") || !check_version(r, f->layout.version))
        return false;
    if (!rd_u64(r, &f->n_tensors_decl, "tensor count")) return false;
    if (!rd_u64(r, &f->n_kv_decl, "metadata count")) return false;
    return check_count(r, 16, f->n_kv_decl, MIN_KV_BYTES, "metadata count") &&
           check_count(r, 8, f->n_tensors_decl, MIN_TENSOR_BYTES, "tensor count");
}

/* ---------------------------------------------------------------- metadata */

/* Bools must be 0 or 1: anything else means a corrupt or misparsed file. */
static bool check_bools(rd *r, const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return rfail_at(r, (size_t)(p + i - r->buf), "invalid bool value %u", (unsigned)p[i]);
    return true;
}

/* String arrays: a validating walk first (no allocation), then an offsets
 * table so that element i is O(1) later. The walk bounds count by the file. */
static bool parse_str_array(rd *r, gguf_kv *kv) {
    size_t start = r->pos;
    for (uint64_t i = 0; i < kv->count; i++) {
        const uint8_t *s;
        uint64_t n;
        if (!rd_str(r, &s, &n, "string array element")) return false;
    }
    if (kv->count == 0) return true;
    kv->str_offs = malloc((size_t)kv->count * sizeof *kv->str_offs);
    if (!kv->str_offs)
        return rfail_at(r, start, "out of memory for %" PRIu64 " strings", kv->count);
    uint64_t off = 0;
    for (uint64_t i = 0; i < kv->count; i++) {
        uint64_t n;
        memcpy(&n, r->buf + start + off, 8);
        kv->str_offs[i] = off;
        off += 8 + n;
    }
    return true;
}

/* A value type (u32) that the spec defines; `what` names it in errors. */
static bool rd_vtype(rd *r, gguf_vtype *out, const char *what) {
    uint32_t t;
    size_t at = r->pos;
    if (!rd_u32(r, &t, what)) return false;
    if (t >= GGUF_VT_COUNT) return rfail_at(r, at, "unknown %s %" PRIu32, what, t);
    *out = (gguf_vtype)t;
    return true;
}

static bool parse_array(rd *r, gguf_kv *kv) {
    size_t at = r->pos;
    if (!rd_vtype(r, &kv->elem_type, "array element type")) return false;
    const gguf_vtype et = kv->elem_type;
    if (et == GGUF_VT_ARRAY) return rfail_at(r, at, "nested arrays are not supported");
    at = r->pos;
    if (!rd_u64(r, &kv->count, "array count")) return false;
    size_t esize = et == GGUF_VT_STRING ? 8 : gguf_vtype_size(kv->elem_type);
    if (kv->count > left(r) / esize)
        return rfail_at(r, at,
                        "absurd array count %" PRIu64 ": the %zu bytes left hold at most %zu "
                        "(corrupt or truncated file)",
                        kv->count, left(r), left(r) / esize);
    kv->data = r->buf + r->pos;
    if (et == GGUF_VT_STRING) return parse_str_array(r, kv);
    if (et == GGUF_VT_BOOL && !check_bools(r, kv->data, kv->count)) return false;
    r->pos += (size_t)kv->count * esize;
    return true;
}

static bool parse_value(rd *r, gguf_kv *kv) {
    if (!rd_vtype(r, &kv->type, "value type")) return false;
    const gguf_vtype t = kv->type;
    if (t == GGUF_VT_ARRAY) return parse_array(r, kv);
    if (t == GGUF_VT_STRING) return rd_str(r, &kv->data, &kv->count, "string value");
    size_t n = gguf_vtype_size(kv->type);
    if (!need(r, n, "value")) return false;
    kv->data = r->buf + r->pos;
    if (t == GGUF_VT_BOOL && !check_bools(r, kv->data, 1)) return false;
    r->pos += n;
    return true;
}

static bool parse_kv(gguf_file *f, rd *r) {
    char *key = rd_name(r, "key");
    if (!key) return false;
    if (!kvl_grow((void **)&f->kvs, &f->cap_kv, (size_t)f->n_kv + 1, sizeof *f->kvs, 16)) {
        free(key);
        return rfail(r, "out of memory");
    }
    gguf_kv *kv = &f->kvs[f->n_kv++];
    memset(kv, 0, sizeof *kv);
    kv->key = key; /* owned by f from here on, freed by gguf_close on failure */
    r->ctx_kind = "key";
    r->ctx_name = key;
    if (gguf_strindex_find(&f->kv_ix, key) >= 0) return rfail(r, "duplicate key");
    if (!parse_value(r, kv)) return false;
    if (!gguf_strindex_add(&f->kv_ix, key, f->n_kv - 1)) return rfail(r, "out of memory");
    r->ctx_kind = NULL;
    return true;
}

/* general.alignment: optional, an integer that is a nonzero power of two. */
static bool read_alignment(gguf_file *f, rd *r) {
    f->layout.alignment = 32;
    if (gguf_find_key(f, "general.alignment") < 0) return true;
    uint32_t a;
    if (!gguf_get_u32(f, "general.alignment", &a))
        return kvl_fail(
            r->err, "%s: key 'general.alignment': must be an unsigned 32-bit integer, got %s",
            r->file, gguf_vtype_name(gguf_kv_type(f, gguf_find_key(f, "general.alignment"))));
    if (a == 0 || (a & (a - 1)) != 0)
        return kvl_fail(r->err,
                        "%s: key 'general.alignment': %" PRIu32 " is not a nonzero power of two",
                        r->file, a);
    f->layout.alignment = a;
    return true;
}

/* ---------------------------------------------------------------- tensors */

static bool parse_shape(rd *r, gguf_tensor *t) {
    uint32_t nd;
    size_t at = r->pos;
    if (!rd_u32(r, &nd, "dimension count")) return false;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return rfail_at(r, at, "invalid number of dimensions %" PRIu32 " (must be 1..%d)", nd,
                        GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        at = r->pos;
        if (d < t->n_dims && !rd_u64(r, &ne, "dimension size")) return false;
        /* 0 is accepted (an empty tensor, as llama.cpp does); > INT64_MAX is not. */
        if (ne > (uint64_t)INT64_MAX)
            return rfail_at(r, at, "dimension %d has invalid size %" PRId64, d, (int64_t)ne);
        t->ne[d] = (int64_t)ne;
    }
    return true;
}

static bool parse_dtype(rd *r, gguf_tensor *t) {
    uint32_t dt;
    size_t at = r->pos;
    if (!rd_u32(r, &dt, "tensor type")) return false;
    const gguf_dtype_traits *tt = dt < GGUF_DT_COUNT ? gguf_dtype_traits_of((int)dt) : NULL;
    if (tt && !tt->block_elems)
        return rfail_at(r, at, "unsupported tensor type %" PRIu32 " (%s)", dt, tt->name);
    if (!gguf_dtype_geometry((int)dt, NULL, NULL))
        return rfail_at(r, at, "unknown tensor type %" PRIu32, dt);
    t->dtype = (int)dt;
    return true;
}

int gguf_shape_nbytes(int dtype, const int64_t ne[GGUF_MAX_DIMS], size_t *nbytes) {
    int blk;
    size_t bb;
    if (!gguf_dtype_geometry(dtype, &blk, &bb)) return GGUF_SHAPE_ROW;
    if (ne[0] % blk != 0) return GGUF_SHAPE_ROW;
    int64_t nel = 1;
    size_t nb = (size_t)(ne[0] / blk);
    bool ok = kvl_mul_ok(nb, bb, &nb);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        ok = ok && !__builtin_mul_overflow(nel, ne[d], &nel);
        if (d > 0) ok = ok && kvl_mul_ok(nb, (size_t)ne[d], &nb);
    }
    if (!ok) return GGUF_SHAPE_OVERFLOW;
    *nbytes = nb;
    return GGUF_SHAPE_OK;
}

/* Rows must hold whole blocks; element and byte counts must not overflow. */
static bool tensor_nbytes(rd *r, gguf_tensor *t, size_t at) {
    const int64_t *ne = t->ne;
    int blk = 1;
    gguf_dtype_geometry(t->dtype, &blk, NULL);
    switch (gguf_shape_nbytes(t->dtype, ne, &t->nbytes)) {
    case GGUF_SHAPE_OK: return true;
    case GGUF_SHAPE_ROW:
        return rfail_at(r, at,
                        "row of %" PRId64 " elements is not a multiple of the %s block size %d",
                        ne[0], gguf_dtype_name(t->dtype), blk);
    default:
        return rfail_at(
            r, at, "size of shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] overflows",
            ne[0], ne[1], ne[2], ne[3]);
    }
}

static bool parse_tensor(gguf_file *f, rd *r) {
    char *name = rd_name(r, "tensor name");
    if (!name) return false;
    if (!kvl_grow((void **)&f->tensors, &f->cap_tensors, (size_t)f->n_tensors + 1,
                  sizeof *f->tensors, 16)) {
        free(name);
        return rfail(r, "out of memory");
    }
    gguf_tensor *t = &f->tensors[f->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = name;
    r->ctx_kind = "tensor";
    r->ctx_name = name;
    if (gguf_strindex_find(&f->tensor_ix, name) >= 0) return rfail(r, "duplicate tensor name");
    size_t at = r->pos;
    if (!parse_shape(r, t) || !parse_dtype(r, t) || !tensor_nbytes(r, t, at)) return false;
    if (!rd_u64(r, &t->offset, "data offset")) return false;
    if (!gguf_strindex_add(&f->tensor_ix, name, f->n_tensors - 1)) return rfail(r, "out of memory");
    r->ctx_kind = NULL;
    return true;
}

/* Data starts at the first aligned offset after the descriptors. Each tensor
 * must be aligned and lie entirely inside the file. Overlap is not checked:
 * it cannot cause an out-of-bounds read. */
static bool place_tensors(gguf_file *f, rd *r) {
    size_t a = f->layout.alignment, start;
    if (!kvl_add_ok(r->pos, a - 1, &start)) return rfail(r, "data offset overflows");
    f->layout.data_offset = start & ~(a - 1);
    if (f->n_tensors == 0) return true; /* vocab-only: the data section may be absent */
    if (f->layout.data_offset > r->len)
        return rfail(r, "data section would start at %zu, past the end of the file (%zu bytes)",
                     f->layout.data_offset, r->len);
    size_t avail = r->len - f->layout.data_offset;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        char nm[96];
        const char *shown = show(nm, t->name, strlen(t->name));
        if (t->offset % a != 0)
            return kvl_fail(r->err,
                            "%s: tensor '%s': data offset %" PRIu64
                            " is not a multiple of the alignment %zu",
                            r->file, shown, t->offset, a);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return kvl_fail(r->err,
                            "%s: tensor '%s': data at offset %" PRIu64
                            " + %zu bytes runs past the end "
                            "of the file (%zu bytes of data)",
                            r->file, shown, t->offset, t->nbytes, avail);
        t->data = r->buf + f->layout.data_offset + t->offset;
        f->data_bytes += t->nbytes; /* each <= avail and count <= len/32: cannot overflow */
    }
    return true;
}

/* ---------------------------------------------------------------- open / close */

static bool parse_all(gguf_file *f, rd *r) {
    if (!parse_header(f, r)) return false;
    for (uint64_t i = 0; i < f->n_kv_decl; i++)
        if (!parse_kv(f, r)) return false;
    if (!read_alignment(f, r)) return false;
    for (uint64_t i = 0; i < f->n_tensors_decl; i++)
        if (!parse_tensor(f, r)) return false;
    return place_tensors(f, r);
}

static gguf_file *parse(const void *buf, size_t len, const char *name, kvl_error *err) {
    gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name))) {
        free(f);
        kvl_fail(err, "%s: out of memory", name);
        return NULL;
    }
    f->buf = buf;
    f->layout.file_size = len;
    rd r = {.buf = buf, .len = len, .file = f->path, .err = err};
    if (!parse_all(f, &r)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open_memory(const void *buf, size_t len, const char *name, kvl_error *err) {
    static const uint8_t empty[1];
    return parse(buf ? buf : empty, buf ? len : 0, name ? name : "<memory>", err);
}

/* Maps path read-only. If another process truncates the file while it is
 * mapped, access faults (SIGBUS): model files are assumed not to change.
 * Opened without blocking: a FIFO given as a model (a path a request named:
 * /v1/load_lora_adapter) is refused below instead of waiting for a writer. */
static gguf_file *open_one(const char *path, kvl_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return kvl_fail(err, "%s: cannot open: %s", path, strerror(errno)), NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvl_fail(err, "%s: cannot stat: %s", path, strerror(e)), NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvl_fail(err, "%s: not a regular file", path), NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return kvl_fail(err, "%s: file too large to map", path), NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return kvl_fail(err, "%s: mmap failed: %s", path, strerror(e)), NULL;
        }
    }
    close(fd);
    gguf_file *f = gguf_open_memory(map, size, path, err);
    if (!f) {
        if (map) munmap(map, size);
        return NULL;
    }
    f->map = map;
    return f;
}

/* An integer key of a split file as llama.cpp reads it (u16), -1 when absent. */
static int64_t split_key(const gguf_file *f, const char *key) {
    int64_t v;
    return gguf_get_i64(f, key, &v) ? v : -1;
}

/* llama.cpp's split models (gguf-split): a first file whose split.count n > 1,
 * named <prefix>-00001-of-<n>.gguf, holds the metadata and some tensors; files
 * -00002- to -<n>- hold the rest, each with its split.no. Their tensors join
 * f's table (a name twice is refused), and split.tensors.count must be the
 * total, as llama.cpp checks. */
static bool open_splits(gguf_file *f, kvl_error *err) {
    const int64_t n = split_key(f, "split.count"), no = split_key(f, "split.no");
    if (n < 0 || n == 1) return true;
    if (n < 1 || n > 9999)
        return kvl_fail(err, "%s: key 'split.count' = %lld is not a number of files (1..9999)",
                        f->path, (long long)n);
    if (no != 0)
        return kvl_fail(err,
                        "%s: file %lld of a model split in %lld (key 'split.no'): load it from its "
                        "first file, ...-00001-of-%05lld.gguf",
                        f->path, (long long)no + 1, (long long)n, (long long)n);
    char tail[40];
    snprintf(tail, sizeof tail, "-00001-of-%05lld.gguf", (long long)n);
    const size_t pl = strlen(f->path), tl = strlen(tail);
    if (pl <= tl || strcmp(f->path + pl - tl, tail) != 0)
        return kvl_fail(err, "%s: a model split in %lld files, but the name does not end in %s",
                        f->path, (long long)n, tail);
    if (!(f->splits = calloc((size_t)n - 1, sizeof *f->splits)))
        return kvl_fail(err, "%s: out of memory", f->path);
    char *path = malloc(pl + 1);
    if (!path) return kvl_fail(err, "%s: out of memory", f->path);
    bool ok = true;
    for (int64_t i = 1; ok && i < n; i++) {
        memcpy(path, f->path, pl - tl);
        snprintf(path + pl - tl, tl + 1, "-%05lld-of-%05lld.gguf", (long long)i + 1, (long long)n);
        gguf_file *s = open_one(path, err);
        if (!s) {
            ok = false;
            break;
        }
        f->splits[f->n_splits++] = s;
        if (split_key(s, "split.no") != i || split_key(s, "split.count") != n) {
            ok = kvl_fail(
                err, "%s: keys 'split.no' / 'split.count' are %lld / %lld, expected %lld / %lld",
                path, (long long)split_key(s, "split.no"), (long long)split_key(s, "split.count"),
                (long long)i, (long long)n);
            break;
        }
        for (int64_t k = 0; ok && k < s->n_tensors; k++) {
            const gguf_tensor *t = &s->tensors[k];
            char nm[96];
            if (gguf_strindex_find(&f->tensor_ix, t->name) >= 0) {
                ok = kvl_fail(err, "%s: tensor '%s' is in an earlier file of the model too", path,
                              show(nm, t->name, strlen(t->name)));
                break;
            }
            char *name = strdup(t->name);
            if (!name || !kvl_grow((void **)&f->tensors, &f->cap_tensors, (size_t)f->n_tensors + 1,
                                   sizeof *f->tensors, 16)) {
                free(name);
                ok = kvl_fail(err, "%s: out of memory", path);
                break;
            }
            f->tensors[f->n_tensors] = *t;
            f->tensors[f->n_tensors].name = name;
            if (!gguf_strindex_add(&f->tensor_ix, name, f->n_tensors)) {
                free(name);
                ok = kvl_fail(err, "%s: out of memory", path);
                break;
            }
            f->n_tensors++;
            f->data_bytes += t->nbytes;
        }
    }
    free(path);
    const int64_t want = split_key(f, "split.tensors.count");
    if (ok && want != f->n_tensors)
        ok = kvl_fail(err,
                      "%s: key 'split.tensors.count' = %lld, but the %lld files hold %lld tensors",
                      f->path, (long long)want, (long long)n, (long long)f->n_tensors);
    return ok;
}

gguf_file *gguf_open(const char *path, kvl_error *err) {
    gguf_file *f = open_one(path, err);
    if (f && !open_splits(f, err)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

int gguf_n_files(const gguf_file *f) { return 1 + f->n_splits; }
const char *gguf_file_path_at(const gguf_file *f, int i) {
    return i == 0 ? f->path : i > 0 && i <= f->n_splits ? f->splits[i - 1]->path : NULL;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_splits; i++) gguf_close(f->splits[i]);
    free(f->splits);
    for (int64_t i = 0; i < f->n_kv; i++) {
        free(f->kvs[i].key);
        free(f->kvs[i].str_offs);
    }
    for (int64_t i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->kvs);
    free(f->tensors);
    gguf_strindex_free(&f->kv_ix);
    gguf_strindex_free(&f->tensor_ix);
    for (size_t i = 0; i < f->n_owned; i++) free(f->owned[i]);
    free(f->owned);
    if (f->map) munmap(f->map, f->layout.file_size);
    free(f->path);
    free(f);
}

const char *gguf_path(const gguf_file *f) { return f->path; }
const gguf_layout *gguf_file_layout(const gguf_file *f) { return &f->layout; }

/* ---------------------------------------------------------------- metadata access */

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    return key ? gguf_strindex_find(&f->kv_ix, key) : -1;
}

static const gguf_kv *kv_at(const gguf_file *f, int64_t idx) {
    return idx >= 0 && idx < f->n_kv ? &f->kvs[idx] : NULL;
}

static const gguf_kv *kv_by_key(const gguf_file *f, const char *key) {
    return kv_at(f, gguf_find_key(f, key));
}

const char *gguf_key_name(const gguf_file *f, int64_t idx) {
    const gguf_kv *kv = kv_at(f, idx);
    return kv ? kv->key : NULL;
}

gguf_vtype gguf_kv_type(const gguf_file *f, int64_t idx) {
    const gguf_kv *kv = kv_at(f, idx);
    return kv ? kv->type : GGUF_VT_COUNT;
}

bool gguf_kv_array(const gguf_file *f, int64_t idx, gguf_vtype *elem_type, uint64_t *count) {
    const gguf_kv *kv = kv_at(f, idx);
    if (!kv || kv->type != GGUF_VT_ARRAY) return false;
    if (elem_type) *elem_type = kv->elem_type;
    if (count) *count = kv->count;
    return true;
}

/* One packed scalar of type t at p, as int64 (integers and bool that fit). */
static bool scalar_i64(gguf_vtype t, const uint8_t *p, int64_t *out) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    size_t n = gguf_vtype_size(t);
    if (n == 0 || t == GGUF_VT_FLOAT32 || t == GGUF_VT_FLOAT64) return false;
    memcpy(&v, p, n);
    switch (t) {
    case GGUF_VT_UINT8:
    case GGUF_VT_BOOL: *out = v.u8; return true;
    case GGUF_VT_INT8: *out = v.i8; return true;
    case GGUF_VT_UINT16: *out = v.u16; return true;
    case GGUF_VT_INT16: *out = v.i16; return true;
    case GGUF_VT_UINT32: *out = v.u32; return true;
    case GGUF_VT_INT32: *out = v.i32; return true;
    case GGUF_VT_INT64: *out = v.i64; return true;
    case GGUF_VT_UINT64:
        if (v.u64 > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v.u64;
        return true;
    default: return false;
    }
}

/* One packed scalar as double: floats, and integers (u64 beyond int64 too). */
static bool scalar_f64(gguf_vtype t, const uint8_t *p, double *out) {
    if (t == GGUF_VT_FLOAT32) {
        float x;
        memcpy(&x, p, 4);
        *out = x;
        return true;
    }
    if (t == GGUF_VT_FLOAT64) {
        memcpy(out, p, 8);
        return true;
    }
    if (t == GGUF_VT_UINT64) {
        uint64_t u;
        memcpy(&u, p, 8);
        *out = (double)u;
        return true;
    }
    int64_t i;
    if (!scalar_i64(t, p, &i)) return false;
    *out = (double)i;
    return true;
}

/* The numeric value of key (elem NULL) or element *elem of its array, as an
 * int64 (as_i64) or a double (as_f64): the one lookup behind the i64 and f64
 * getters, scalar and array alike. Strings, arrays read as scalars and string
 * arrays do not convert. */
static bool get_number(const gguf_file *f, const char *key, const uint64_t *elem, int64_t *as_i64,
                       double *as_f64) {
    const gguf_kv *kv = kv_by_key(f, key);
    if (!kv) return false;
    gguf_vtype t = kv->type;
    const uint8_t *p = kv->data;
    if (elem) {
        if (t != GGUF_VT_ARRAY || kv->elem_type == GGUF_VT_STRING || *elem >= kv->count)
            return false;
        t = kv->elem_type;
        p += *elem * gguf_vtype_size(t);
    }
    return as_i64 ? scalar_i64(t, p, as_i64) : scalar_f64(t, p, as_f64);
}

bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    return get_number(f, key, NULL, out, NULL);
}

bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    int64_t v;
    if (!gguf_get_i64(f, key, &v) || v < 0 || v > (int64_t)UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

bool gguf_get_f64(const gguf_file *f, const char *key, double *out) {
    return get_number(f, key, NULL, NULL, out);
}

/* Finite doubles beyond float range do not convert (the cast would be UB). */
bool gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    double d;
    if (!gguf_get_f64(f, key, &d)) return false;
    if (isfinite(d) && fabs(d) > FLT_MAX) return false;
    *out = (float)d;
    return true;
}

/* Bools, and integers that are exactly 0 or 1. */
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
    int64_t v;
    if (!gguf_get_i64(f, key, &v) || v < 0 || v > 1) return false;
    *out = v == 1;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len) {
    const gguf_kv *kv = kv_by_key(f, key);
    if (!kv || kv->type != GGUF_VT_STRING) return false;
    *s = (const char *)kv->data;
    *len = (size_t)kv->count;
    return true;
}

bool gguf_get_str_buf(const gguf_file *f, const char *key, char *buf, size_t cap) {
    const char *s;
    size_t n;
    if (cap == 0 || !gguf_get_str(f, key, &s, &n)) return false;
    if (n > cap - 1) n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return true;
}

bool gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype *elem_type, uint64_t *count,
                  const void **data) {
    const gguf_kv *kv = kv_by_key(f, key);
    if (!kv || kv->type != GGUF_VT_ARRAY) return false;
    if (elem_type) *elem_type = kv->elem_type;
    if (count) *count = kv->count;
    if (data) *data = kv->data;
    return true;
}

bool gguf_get_arr_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out) {
    return get_number(f, key, &i, out, NULL);
}

bool gguf_get_arr_f64(const gguf_file *f, const char *key, uint64_t i, double *out) {
    return get_number(f, key, &i, NULL, out);
}

bool gguf_get_arr_str(const gguf_file *f, const char *key, uint64_t i, const char **s,
                      size_t *len) {
    const gguf_kv *kv = kv_by_key(f, key);
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->elem_type != GGUF_VT_STRING || i >= kv->count)
        return false;
    const uint8_t *p = kv->data + kv->str_offs[i];
    uint64_t n;
    memcpy(&n, p, 8);
    *s = (const char *)p + 8;
    *len = (size_t)n;
    return true;
}

/* ---------------------------------------------------------------- tensor access */

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    return name ? gguf_tensor_at(f, gguf_strindex_find(&f->tensor_ix, name)) : NULL;
}

size_t gguf_tensor_data_bytes(const gguf_file *f) { return f->data_bytes; }

int gguf_commonest_dtype(const gguf_file *f) {
    int64_t count[GGUF_DT_COUNT] = {0}, most = 0;
    int best = GGUF_DT_F32;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const int t = gguf_tensor_at(f, i)->dtype;
        if (t < 0 || t >= GGUF_DT_COUNT || ++count[t] <= most) continue;
        most = count[t];
        best = t;
    }
    return best;
}

bool gguf_file_type_describe(const gguf_file *f, char *buf, size_t cap) {
    uint32_t ft;
    const bool known = gguf_get_u32(f, "general.file_type", &ft);
    if (!known) ft = (uint32_t)gguf_file_type_guess(gguf_commonest_dtype(f));
    const char *desc = gguf_file_type_desc(ft);
    snprintf(buf, cap, "%s%s", desc && !known ? "(guessed) " : "", desc ? desc : "unknown");
    return desc != NULL;
}

int64_t gguf_tensor_nelements(const gguf_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; /* checked not to overflow at load */
}

/* ------------------------------------------------------------- overrides */

static bool is_int_type(gguf_vtype t) {
    return t != GGUF_VT_FLOAT32 && t != GGUF_VT_FLOAT64 && t != GGUF_VT_BOOL &&
           t != GGUF_VT_STRING && t != GGUF_VT_ARRAY;
}

bool gguf_override_kv(gguf_file *f, const char *spec, kvl_error *err) {
    const char *eq = strchr(spec, '='), *colon = eq ? strchr(eq + 1, ':') : NULL;
    if (!eq || eq == spec || !colon)
        return kvl_fail(err,
                        "--override-kv %.200s: expected KEY=TYPE:VALUE (TYPE int, float, "
                        "bool or str)",
                        spec);
    const size_t klen = (size_t)(eq - spec), tlen = (size_t)(colon - eq - 1);
    const char *val = colon + 1, *t = eq + 1;
    if (klen >= 128)
        return kvl_fail(err, "--override-kv: the key is %zu bytes long (at most 127)", klen);
    gguf_vtype type;
    union {
        int64_t i;
        double d;
        uint8_t b;
    } v;
    size_t n = 8;
    char *end = NULL;
    errno = 0;
    if (tlen == 3 && !strncmp(t, "int", 3)) {
        type = GGUF_VT_INT64, v.i = strtoll(val, &end, 10);
        if (!*val || *end || errno)
            return kvl_fail(err, "--override-kv %.200s: '%.60s' is not an integer", spec, val);
    } else if (tlen == 5 && !strncmp(t, "float", 5)) {
        type = GGUF_VT_FLOAT64, v.d = strtod(val, &end);
        if (!*val || *end || !isfinite(v.d))
            return kvl_fail(err, "--override-kv %.200s: '%.60s' is not a finite number", spec, val);
    } else if (tlen == 4 && !strncmp(t, "bool", 4)) {
        type = GGUF_VT_BOOL, n = 1;
        if (strcmp(val, "true") && strcmp(val, "false"))
            return kvl_fail(err, "--override-kv %.200s: a bool is true or false", spec);
        v.b = val[0] == 't';
    } else if (tlen == 3 && !strncmp(t, "str", 3)) {
        type = GGUF_VT_STRING, n = strlen(val);
        if (n > 127)
            return kvl_fail(err, "--override-kv: the string is %zu bytes long (at most 127)", n);
    } else {
        return kvl_fail(err, "--override-kv %.200s: unknown type '%.*s' (int, float, bool or str)",
                        spec, (int)(tlen < 20 ? tlen : 20), t);
    }
    char key[128];
    memcpy(key, spec, klen);
    key[klen] = 0;
    const int64_t at = gguf_find_key(f, key);
    if (at >= 0) { /* the file's kind of value stays */
        const gguf_vtype had = f->kvs[at].type;
        const bool fits = had == GGUF_VT_ARRAY ? false
                          : type == GGUF_VT_INT64
                              ? is_int_type(had) || had == GGUF_VT_FLOAT32 || had == GGUF_VT_FLOAT64
                          : type == GGUF_VT_FLOAT64
                              ? had == GGUF_VT_FLOAT32 || had == GGUF_VT_FLOAT64
                              : had == type;
        if (!fits)
            return kvl_fail(err, "--override-kv %.200s: the file's %s is %s", spec, key,
                            had == GGUF_VT_ARRAY    ? "an array (not overridable)"
                            : had == GGUF_VT_STRING ? "a string: use str:"
                            : had == GGUF_VT_BOOL   ? "a bool: use bool:"
                            : is_int_type(had)      ? "an integer: use int:"
                                                    : "a float: use float: (or int:)");
    }
    void **owned = realloc(f->owned, (f->n_owned + 1) * sizeof *owned);
    if (owned) f->owned = owned;
    uint8_t *mem = owned ? malloc(n ? n : 1) : NULL;
    if (!mem) return kvl_fail(err, "--override-kv: out of memory");
    f->owned[f->n_owned++] = mem;
    memcpy(mem, type == GGUF_VT_STRING ? (const void *)val : (const void *)&v, n);
    gguf_kv *kv;
    if (at >= 0) {
        kv = &f->kvs[at];
    } else {
        char *copy = strdup(key);
        if (!copy ||
            !kvl_grow((void **)&f->kvs, &f->cap_kv, (size_t)f->n_kv + 1, sizeof *f->kvs, 16) ||
            !gguf_strindex_add(&f->kv_ix, copy, f->n_kv)) {
            free(copy);
            return kvl_fail(err, "--override-kv: out of memory");
        }
        kv = &f->kvs[f->n_kv++];
        *kv = (gguf_kv){.key = copy};
    }
    free(kv->str_offs);
    kv->str_offs = NULL;
    kv->type = type;
    kv->count = type == GGUF_VT_STRING ? n : 0;
    kv->data = mem;
    return true;
}
