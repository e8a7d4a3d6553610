/* FP8 E4M3 KV storage (kv_row_store / kv_row_load) against a reference written
 * here from the format's definition (OCP 8-bit floating point: sign, 4 exponent
 * bits with bias 7, 3 mantissa bits, subnormals at exponent 0, 0x7f and 0xff
 * NaN, no infinities, max 448): every one of the 256 codes decodes to its
 * value and encodes back; every midpoint between neighbouring codes rounds to
 * the even code and the floats either side of it to the nearer one; beyond
 * 448 saturates; a million random floats encode as the reference's nearest
 * value (searched in double over the decoded codes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

#include "check.h"

static double ref_value[256]; /* NaN for the two NaN codes */

static void ref_init(void) {
    for (int c = 0; c < 256; c++) {
        int e = (c >> 3) & 15, m = c & 7;
        double v = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
        if ((c & 0x7f) == 0x7f) v = NAN;
        ref_value[c] = c & 0x80 ? -v : v;
    }
}

/* Nearest code to x by search, ties to the even code, |x| beyond 448 saturating;
 * -1 for NaN. The sign follows x (so -0 and tiny negatives give 0x80). */
static int ref_encode(double x) {
    if (isnan(x)) return -1;
    double a = fabs(x);
    int best = 0;
    for (int c = 1; c < 0x7f; c++) {
        double d = fabs(ref_value[c] - a), db = fabs(ref_value[best] - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (signbit(x) ? 0x80 : 0) | best;
}

static int encode(float f) {
    uint8_t b;
    kv_row_store(KV_DT_FP8_E4M3, &f, &b, 1);
    return b;
}

static float decode(int c) {
    uint8_t b = (uint8_t)c;
    float f;
    kv_row_load(KV_DT_FP8_E4M3, &b, &f, 1);
    return f;
}

static int n_reported;
static void check_encode(float f) {
    int want = ref_encode(f), got = encode(f);
    bool ok = want < 0 ? (got & 0x7f) == 0x7f : got == want;
    if (!ok && n_reported++ < 10)
        fprintf(stderr, "fp8_encode(%a = %.9g) = 0x%02x (%g), reference 0x%02x (%g)\n", f, f, got,
                decode(got), want, want < 0 ? NAN : ref_value[want]);
    CHECK(ok);
}

/* Every code: decode is the reference value; encode(decode(c)) = c. */
static void test_codes(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        float v = decode(c);
        if ((c & 0x7f) == 0x7f) {
            bad += !isnan(v);
            bad += (encode(v) & 0x7f) != 0x7f;
            continue;
        }
        bad += (double)v != ref_value[c] || (signbit(v) != 0) != ((c & 0x80) != 0);
        bad += encode(v) != c;
    }
    if (bad) fprintf(stderr, "%d codes do not round-trip\n", bad);
    CHECK(bad == 0);
    CHECK(encode(NAN) == 0x7f || encode(NAN) == 0xff);
    CHECK((encode(-NAN) & 0x7f) == 0x7f);
}

/* The midpoint of every pair of neighbouring codes (exact in float: one bit more
 * than the 3 mantissa bits) and the floats either side of it. */
static void test_midpoints(void) {
    for (int s = 0; s <= 1; s++)
        for (int c = 0; c < 0x7e; c++) {
            double lo = ref_value[c], hi = ref_value[c + 1];
            float mid = (float)((lo + hi) / 2);
            CHECK((double)mid == (lo + hi) / 2);
            if (s) mid = -mid;
            check_encode(mid);
            check_encode(nextafterf(mid, INFINITY));
            check_encode(nextafterf(mid, -INFINITY));
            int want = (s ? 0x80 : 0) | (c & 1 ? c + 1 : c); /* the even code of the two */
            CHECK(encode(mid) == want);
        }
    /* the boundaries named: half the smallest subnormal is a tie that goes to 0 */
    CHECK(encode(0x1p-10f) == 0x00);
    CHECK(encode(-0x1p-10f) == 0x80);
    CHECK(encode(nextafterf(0x1p-10f, 1.0f)) == 0x01);
    CHECK(encode(-nextafterf(0x1p-10f, 1.0f)) == 0x81);
    CHECK(encode(0.0f) == 0x00 && encode(-0.0f) == 0x80);
    CHECK(encode(0x1p-149f) == 0x00 && encode(-0x1p-149f) == 0x80);
    /* beyond the largest value: saturate, infinities too */
    const float big[] = {448.0f, 449.0f, 464.0f, 480.0f, 512.0f, 1e30f, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        CHECK(encode(big[i]) == 0x7e);
        CHECK(encode(-big[i]) == 0xfe);
        check_encode(big[i]);
    }
    CHECK(encode(nextafterf(448.0f, 0.0f)) == 0x7e && encode(432.0f) == 0x7e &&
          encode(431.0f) == 0x7d);
}

/* Random floats: bit patterns over the whole range, and values over the codes' range. */
static void test_random(void) {
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float f;
        if (i % 2) {
            uint32_t bits = (uint32_t)x;
            memcpy(&f, &bits, sizeof f);
        } else {
            f = ldexpf((float)(x >> 40) / (float)(1 << 24), (int)(x % 24) - 14) *
                (x & (1ull << 32) ? -1 : 1);
        }
        check_encode(f);
    }
}

int main(void) {
    ref_init();
    test_codes();
    test_midpoints();
    test_random();
    printf("test_kv_fp8: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
