/* KV storage types: row sizes and conversions. The types and their sizes are
 * gguf's type table (gguf_types.c); ggml types convert through the kernels'
 * tables; FP8 E4M3 (OCP format: 1 sign, 4 exponent bits with bias 7,
 * 3 mantissa bits, no infinities, max 448) is converted here. */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "kv.h"

/* The table entry of a KV storage type, or NULL. */
static const gguf_dtype_traits *kv_type(int dtype) {
    const gguf_dtype_traits *t = gguf_dtype_traits_of(dtype);
    return t && t->kv_name ? t : NULL;
}

bool kv_dtype_parse(const char *name, int *dtype) {
    if (strcmp(name, "fp8_e4m3") == 0) name = "fp8";
    for (int t = 0; t < GGUF_DT_TABLE_SIZE; t++)
        if (kv_type(t) && strcmp(name, kv_type(t)->kv_name) == 0) {
            *dtype = t;
            return true;
        }
    return false;
}

const char *kv_dtype_name(int dtype) {
    return kv_type(dtype) ? kv_type(dtype)->kv_name : "unknown";
}

size_t kv_dtype_bytes(int dtype) {
    const gguf_dtype_traits *t = kv_type(dtype);
    return t && t->block_elems == 1 ? t->block_bytes : 0;
}

size_t kv_row_bytes(int dtype, int64_t n) { return kv_type(dtype) ? gguf_row_bytes(dtype, n) : 0; }

/* float -> E4M3, round to nearest even, saturating at +-448 (NaN -> 0x7f). */
static uint8_t fp8_encode(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;
    /* Up to half the smallest subnormal (2^-9): zero. 2^-10 itself is a tie
     * between 0 and 2^-9 that goes to the even code, 0 (past this point it would
     * round to q = 0, which the normal path below cannot encode). */
    if (a <= 0.0009765625f) return sign;
    int e;
    frexpf(a, &e);       /* a = m * 2^e, m in [0.5, 1) */
    int exp = e - 1 + 7; /* biased exponent of a in [1, 2) form */
    float step =
        exp <= 0 ? ldexpf(1.0f, -9) : ldexpf(1.0f, e - 1 - 3); /* spacing of representable values */
    float q = nearbyintf(a / step) * step;
    if (q >= 448.0f) return sign | 0x7e;
    frexpf(q, &e);
    exp = e - 1 + 7;
    if (exp <= 0)
        return sign | (uint8_t)(q / ldexpf(1.0f, -9)); /* subnormal: mantissa counts 2^-9 */
    uint8_t mant = (uint8_t)(q / ldexpf(1.0f, e - 1 - 3)) - 8;
    return sign | (uint8_t)(exp << 3) | mant;
}

static float fp8_decode(uint8_t b) {
    int exp = (b >> 3) & 15, mant = b & 7;
    float v = exp == 0 ? ldexpf((float)mant, -9) : ldexpf((float)(8 + mant), exp - 7 - 3);
    if ((b & 0x7f) == 0x7f) v = NAN;
    return b & 0x80 ? -v : v;
}

void kv_row_store(int dtype, const float *src, void *dst, int64_t n) {
    if (dtype == GGUF_DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == KV_DT_FP8_E4M3) {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = fp8_encode(src[i]);
    } else {
        kern_act_quantizer(kern_traits_of(dtype))(src, dst, n);
    }
}

void kv_row_load(int dtype, const void *src, float *dst, int64_t n) {
    if (dtype == GGUF_DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == KV_DT_FP8_E4M3) {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = fp8_decode(s[i]);
    } else {
        kern_traits_of(dtype)->to_float(src, dst, n);
    }
}

bool kv_dtype_blocked(int dtype) {
    const gguf_dtype_traits *t = kv_type(dtype);
    return t && t->block_elems > 1;
}

void kv_query_as_k(int dtype, const float *q, float *out, int64_t n) {
    const gguf_dtype_traits *t = kv_type(dtype);
    const int vt = t ? t->vec_dot_type : -1;
    /* a block type's q only where the whole row is blocks (ggml's rows must be) */
    const bool convert = vt == GGUF_DT_F16 || vt == GGUF_DT_BF16 ||
                         (t && t->block_elems > 1 && n % t->block_elems == 0);
    if (!convert) {
        memcpy(out, q, (size_t)n * sizeof(float));
        return;
    }
    const kern_traits *k = kern_traits_of(vt);
    _Alignas(64) uint8_t tmp[512]; /* 256 values of f16 / bf16, or 8 blocks of Q8_0 / Q8_1 */
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        const int64_t m = n - i0 < 256 ? n - i0 : 256;
        kern_act_quantizer(k)(q + i0, tmp, m);
        k->to_float(tmp, out + i0, m);
    }
}
