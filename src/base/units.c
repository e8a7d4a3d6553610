/* units: sizes and counts as people write them ("80GiB", "32K", "8.03B") and
 * byte counts as people read them ("171,798,691,840 B (160 GiB, 171.8 GB)").
 * Exact integer arithmetic throughout: a size that is not a whole number of
 * bytes is refused, not rounded. See units.h. */
#include "units.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A non-negative decimal "12", "1.5", "7e9" as num x 10^exp; returns the rest. */
static const char *parse_decimal(const char *s, unsigned __int128 *num, int *exp) {
    /* Below 1e21 even times a PiB (2^50) stays far inside 128 bits. */
    const unsigned __int128 cap = (unsigned __int128)10000000000ull * 10000000000ull; /* 1e20 */
    bool digits = false, frac = false;
    *num = 0;
    *exp = 0;
    for (; (*s >= '0' && *s <= '9') || (*s == '.' && !frac); s++) {
        if (*s == '.') {
            frac = true;
            continue;
        }
        if (*num >= cap) return NULL;
        *num = *num * 10 + (unsigned)(*s - '0');
        *exp -= frac;
        digits = true;
    }
    if (!digits) return NULL;
    if (*s == 'e' || *s == 'E') {
        char *end;
        long e = strtol(s + 1, &end, 10);
        if (end == s + 1 || e < -30 || e > 30) return NULL;
        *exp += (int)e;
        s = end;
    }
    while (*s == ' ') s++;
    return s;
}

/* num x unit x 10^exp as an exact integer <= INT64_MAX. */
static bool scale_exact(unsigned __int128 num, uint64_t unit, int exp, uint64_t *out) {
    unsigned __int128 v = num * unit; /* num < 1e21, unit <= 2^50: fits in 128 bits */
    for (; exp > 0; exp--) {
        if (v > (unsigned __int128)INT64_MAX) return false;
        v *= 10;
    }
    for (; exp < 0; exp++) {
        if (v % 10) return false; /* not a whole number */
        v /= 10;
    }
    if (v > (unsigned __int128)INT64_MAX) return false;
    *out = (uint64_t)v;
    return true;
}

typedef struct unit_name {
    const char *name;
    uint64_t mult;
} unit_name;

static bool find_unit(const unit_name *units, const char *s, uint64_t *mult) {
    for (; units->name; units++) {
        if (strcasecmp(s, units->name) == 0) {
            *mult = units->mult;
            return true;
        }
    }
    return false;
}

bool kvl_parse_size(const char *s, uint64_t *out) {
    static const unit_name UNITS[] = {{"", 1},
                                      {"B", 1},
                                      {"KB", 1000},
                                      {"MB", 1000000},
                                      {"GB", 1000000000},
                                      {"TB", 1000000000000},
                                      {"PB", 1000000000000000},
                                      {"KiB", 1ull << 10},
                                      {"MiB", 1ull << 20},
                                      {"GiB", 1ull << 30},
                                      {"TiB", 1ull << 40},
                                      {"PiB", 1ull << 50},
                                      /* a bare letter is binary, as docker's --memory 2g */
                                      {"K", 1ull << 10},
                                      {"M", 1ull << 20},
                                      {"G", 1ull << 30},
                                      {"T", 1ull << 40},
                                      {"P", 1ull << 50},
                                      {NULL, 0}};
    unsigned __int128 num;
    int exp;
    uint64_t mult;
    const char *rest = parse_decimal(s, &num, &exp);
    return rest && find_unit(UNITS, rest, &mult) && scale_exact(num, mult, exp, out);
}

bool kvl_parse_count(const char *s, bool thousand, int64_t *out) {
    static const unit_name TOKENS[] = {{"", 1}, {"K", 1024}, {"M", 1048576}, {NULL, 0}};
    static const unit_name PARAMS[] = {{"", 1},           {"K", 1000},          {"M", 1000000},
                                       {"B", 1000000000}, {"T", 1000000000000}, {NULL, 0}};
    unsigned __int128 num;
    int exp;
    uint64_t mult, v;
    const char *rest = parse_decimal(s, &num, &exp);
    if (!rest || !find_unit(thousand ? PARAMS : TOKENS, rest, &mult) ||
        !scale_exact(num, mult, exp, &v))
        return false;
    *out = (int64_t)v;
    return true;
}

/* "171,798,691,840" */
static void fmt_grouped(uint64_t v, char *buf, size_t cap) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v), o = 0;
    char tmp[48];
    for (int i = 0; i < n; i++) {
        if (i > 0 && (n - i) % 3 == 0) tmp[o++] = ',';
        tmp[o++] = digits[i];
    }
    tmp[o] = 0;
    snprintf(buf, cap, "%s", tmp);
}

/* value / unit to 2 decimals, trailing zeros (and a bare point) dropped. */
static void fmt_scaled(uint64_t v, uint64_t unit, const char *name, char *buf, size_t cap) {
    char num[48];
    snprintf(num, sizeof num, "%.2f", (double)v / (double)unit);
    char *dot = strchr(num, '.');
    if (dot) {
        char *end = num + strlen(num) - 1;
        while (end > dot && *end == '0') *end-- = 0;
        if (end == dot) *end = 0;
    }
    snprintf(buf, cap, "%s %s", num, name);
}

static const char *fmt_units(uint64_t v, uint64_t base, const char *const names[6], char *buf,
                             size_t cap) {
    uint64_t unit = 1;
    int i = 0;
    while (i < 5 && v / unit >= base) {
        unit *= base;
        i++;
    }
    if (i == 0) snprintf(buf, cap, "%llu B", (unsigned long long)v);
    else fmt_scaled(v, unit, names[i], buf, cap);
    return buf;
}

const char *kvl_fmt_binary(uint64_t bytes, char *buf, size_t cap) {
    static const char *const N[6] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    return fmt_units(bytes, 1024, N, buf, cap);
}

const char *kvl_fmt_decimal(uint64_t bytes, char *buf, size_t cap) {
    static const char *const N[6] = {"B", "KB", "MB", "GB", "TB", "PB"};
    return fmt_units(bytes, 1000, N, buf, cap);
}

const char *kvl_fmt_bytes(uint64_t bytes, char *buf, size_t cap) {
    char g[48], b[32], d[32];
    fmt_grouped(bytes, g, sizeof g);
    if (bytes < 1000) snprintf(buf, cap, "%s B", g);
    else
        snprintf(buf, cap, "%s B (%s, %s)", g, kvl_fmt_binary(bytes, b, sizeof b),
                 kvl_fmt_decimal(bytes, d, sizeof d));
    return buf;
}
