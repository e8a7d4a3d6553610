/* model control vectors: llama.cpp's --control-vector files, added to the
 * residual stream after each layer (model.h, "control vectors").
 *
 * The arithmetic is llama.cpp's (common_control_vector_load and
 * llama_adapter_cvec): each file's directions are scaled and summed into a
 * per-file vector per layer, the files' vectors summed in order, and layer
 * il's sum added to every token's output of layer il (on gemma3n, to each of
 * its streams) when il is in the range. Layer 0 never has one: a file's
 * direction.N is layer N, counted from 0, as llama.cpp's adapter stores it.
 * A file is validated whole before the model's vectors change, so a refused
 * file leaves them as they were. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

/* The layer N of a tensor name "direction.N" (N >= 1, decimal, nothing
 * after it), or -1. */
static long direction_layer(const char *name) {
    static const char prefix[] = "direction.";
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) return -1;
    const char *num = name + sizeof prefix - 1;
    if (*num < '0' || *num > '9') return -1;
    char *end = NULL;
    errno = 0;
    const long n = strtol(num, &end, 10);
    return errno || *end ? -1 : n;
}

bool model_cvec_add(model *m, const gguf_file *f, float scale, kvl_error *err) {
    const char *path = gguf_file_path_at(f, 0);
    const int64_t E = m->hp.n_embd, L = m->hp.n_layer;
    const int64_t n_t = gguf_n_tensors(f);
    if (!isfinite(scale)) return kvl_fail(err, "control vector %s: scale is not finite", path);
    if (n_t == 0) return kvl_fail(err, "control vector %s: no direction tensors", path);
    /* one pass to validate, accumulating into this file's own vectors */
    float *mine = kvl_calloc((size_t)(L * E), sizeof(float));
    if (!mine) return kvl_fail(err, "control vector %s: out of memory", path);
    long beyond = 0;
    for (int64_t i = 0; i < n_t; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const long il = direction_layer(t->name);
        const char *why = NULL;
        char shape[160];
        if (il < 0) why = "is not named direction.N";
        else if (il == 0) why = "layer 0 has no control vector (they start at direction.1)";
        else if (t->dtype != GGUF_DT_F32) why = gguf_dtype_name(t->dtype);
        else if (t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1 || t->ne[0] != E) {
            snprintf(shape, sizeof shape,
                     "has shape {%lld, %lld, %lld, %lld}; the model's vectors are %lld wide",
                     (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                     (long long)t->ne[3], (long long)E);
            why = shape;
        } else if (!t->data) why = "has no data";
        if (why) {
            kvl_free(mine);
            if (il > 0 && t->dtype != GGUF_DT_F32)
                return kvl_fail(err, "control vector %s: '%s' is %s, not F32", path, t->name, why);
            return kvl_fail(err, "control vector %s: %s'%s'%s %s", path, il < 0 ? "tensor " : "",
                            t->name, il == 0 ? ":" : "", why);
        }
        float row[4096];
        for (int64_t e0 = 0; e0 < E; e0 += 4096) {
            const int64_t ne = E - e0 < 4096 ? E - e0 : 4096;
            memcpy(row, (const float *)t->data + e0, (size_t)ne * sizeof(float));
            for (int64_t e = 0; e < ne; e++)
                if (!isfinite(row[e])) {
                    kvl_free(mine);
                    return kvl_fail(err, "control vector %s: '%s' value %lld is not finite", path,
                                    t->name, (long long)(e0 + e));
                }
            if (il >= L) continue;
            /* several directions of one layer in a file add up, as llama.cpp sums them */
            float *dst = mine + il * E + e0;
            for (int64_t e = 0; e < ne; e++) dst[e] += row[e] * scale;
        }
        if (il >= L) beyond = il > beyond ? il : beyond;
    }
    if (beyond)
        kvl_log(KVL_LOG_WARN,
                "control vector %s: directions up to layer %ld, beyond the model's %lld layers, "
                "are not applied",
                path, beyond, (long long)L);
    if (!m->cvec) {
        m->cvec = mine; /* the first file's vectors are the sum */
        if (m->cvec_first == 0 && m->cvec_last == 0) model_cvec_set_range(m, 0, 0);
        return true;
    }
    for (int64_t i = 0; i < L * E; i++) m->cvec[i] += mine[i];
    kvl_free(mine);
    return true;
}

void model_cvec_set_range(model *m, int first, int last) {
    /* llama.cpp's defaults for start and end at 0 or below: layers 1 .. n_layer */
    m->cvec_first = first > 0 ? first : 1;
    m->cvec_last = last > 0 ? last : m->hp.n_layer;
}

bool model_cvec_active(const model *m) { return m->cvec != NULL; }

const float *model_cvec_layer(const model *m, int il) {
    if (!m->cvec || il < 1 || il < m->cvec_first || il > m->cvec_last || il >= m->hp.n_layer)
        return NULL;
    return m->cvec + (int64_t)il * m->hp.n_embd;
}

void cvec_apply(const model *m, int il, float *x, int64_t rows) {
    const float *v = model_cvec_layer(m, il);
    if (!v) return;
    const int64_t E = m->hp.n_embd;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < E; e++) x[r * E + e] = x[r * E + e] + v[e];
}
