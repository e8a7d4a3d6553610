/* JSON Schema -> GBNF: the leaf rules (see json_schema.c for what is supported).
 *
 * Integer ranges as digit-string alternations, numbers, strings with a format,
 * a pattern (json_regex.c) or length bounds, and the primitive rules appended
 * once per grammar. Split from json_schema.c, which walks objects, arrays,
 * anyOf/oneOf/allOf and $ref and calls these for the scalar types; the two
 * share conv and its helpers through json_schema_internal.h. */
#include "json_schema_internal.h"

#include <string.h>

/* ----------------------------------------------------------- numbers -- */

/* Digit strings of equal length n, lo <= hi, leading zeros allowed. */
static void digits_range(kvl_buf *o, const char *lo, const char *hi, int n) {
    if (n == 0) {
        kvl_buf_puts(o, "\"\"");
        return;
    }
    bool lo_zero = true, hi_nine = true;
    for (int i = 1; i < n; i++) lo_zero &= lo[i] == '0', hi_nine &= hi[i] == '9';
    if (lo_zero && hi_nine) {
        kvl_buf_printf(o, "[%c-%c]", lo[0], hi[0]);
        if (n > 1) kvl_buf_printf(o, " [0-9]{%d}", n - 1);
        return;
    }
    if (lo[0] == hi[0]) {
        kvl_buf_printf(o, "\"%c\" (", lo[0]);
        digits_range(o, lo + 1, hi + 1, n - 1);
        kvl_buf_puts(o, ")");
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    kvl_buf_printf(o, "(\"%c\" (", lo[0]);
    digits_range(o, lo + 1, nines, n - 1);
    kvl_buf_puts(o, ")");
    if (lo[0] + 1 <= hi[0] - 1) {
        kvl_buf_printf(o, " | [%c-%c]", lo[0] + 1, hi[0] - 1);
        if (n > 1) kvl_buf_printf(o, " [0-9]{%d}", n - 1);
    }
    kvl_buf_printf(o, " | \"%c\" (", hi[0]);
    digits_range(o, zeros, hi + 1, n - 1);
    kvl_buf_puts(o, "))");
}

/* Decimal numbers in [a, b], 0 <= a <= b, without leading zeros. */
static void uint_range(kvl_buf *o, long long a, long long b) {
    long long p = 1;
    bool first = true;
    kvl_buf_puts(o, "(");
    for (int d = 1; d <= 18; d++, p *= 10) {
        long long lo = d == 1 ? 0 : p, hi = p * 10 - 1;
        if (lo < a) lo = a;
        if (hi > b) hi = b;
        if (lo > hi) continue;
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%0*lld", d, lo);
        snprintf(hs, sizeof hs, "%0*lld", d, hi);
        kvl_buf_puts(o, first ? "" : " | ");
        first = false;
        digits_range(o, ls, hs, d);
    }
    kvl_buf_puts(o, ")");
}

static bool number_bound(conv *c, const cJSON *s, const char *k, const char *path, double *v) {
    const cJSON *x = get(s, k);
    if (!x) return false;
    if (!cJSON_IsNumber(x)) return cfail(c, path, "'%s' must be a number", k), false;
    /* kept where a conversion to long long is defined: past the 16-digit
     * rule's bound every value acts alike (9e123 as a maximum is no bound) */
    const double far = 2.0 * (double)INT_BOUND;
    *v = x->valuedouble > far ? far : x->valuedouble < -far ? -far : x->valuedouble;
    return true;
}

bool js_integer_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    double v;
    long long lo = -INT_BOUND, hi = INT_BOUND;
    bool bounded = false;
    if (number_bound(c, s, "minimum", path, &v)) lo = (long long)ceil(v), bounded = true;
    if (number_bound(c, s, "exclusiveMinimum", path, &v)) {
        long long x = (long long)floor(v) + 1;
        if (x > lo) lo = x;
        bounded = true;
    }
    if (number_bound(c, s, "maximum", path, &v)) hi = (long long)floor(v), bounded = true;
    if (number_bound(c, s, "exclusiveMaximum", path, &v)) {
        long long x = (long long)ceil(v) - 1;
        if (x < hi) hi = x;
        bounded = true;
    }
    if (c->failed) return false;
    if (!bounded) {
        kvl_buf_printf(e, "%sinteger", c->prefix);
        return true;
    }
    if (lo < -INT_BOUND) lo = -INT_BOUND;
    if (hi > INT_BOUND) hi = INT_BOUND;
    if (lo > hi) return cfail(c, path, "no integer lies between the minimum and the maximum");
    kvl_buf_puts(e, "(");
    bool any = false;
    if (lo < 0) {
        long long nhi = hi < -1 ? hi : -1; /* negatives [lo, nhi] = "-" [ -nhi, -lo ] */
        kvl_buf_puts(e, "\"-\" ");
        uint_range(e, -nhi, -lo);
        any = true;
    }
    if (hi >= 0) {
        if (any) kvl_buf_puts(e, " | ");
        uint_range(e, lo > 0 ? lo : 0, hi);
    }
    kvl_buf_printf(e, ") %sspace", c->prefix);
    return true;
}

bool js_number_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    double v;
    bool has_min = number_bound(c, s, "minimum", path, &v);
    if (c->failed) return false;
    if (get(s, "maximum") || get(s, "exclusiveMinimum") || get(s, "exclusiveMaximum") ||
        (has_min && v != 0))
        return cfail(
            c, path,
            "bounds on 'number' other than minimum 0 are not supported (use type integer)");
    if (has_min)
        kvl_buf_printf(e, "%sintegral (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? %sspace",
                       c->prefix, c->prefix);
    else kvl_buf_printf(e, "%snumber", c->prefix);
    return true;
}

/* ----------------------------------------------------------- strings -- */

bool js_string_rule(conv *c, const cJSON *s, const char *path, kvl_buf *e) {
    const cJSON *fmt = get(s, "format"), *pat = get(s, "pattern");
    long min = 0, max = -1;
    if (!get_count(c, s, "minLength", path, &min) || !get_count(c, s, "maxLength", path, &max))
        return false;
    if (max >= 0 && max < min) return cfail(c, path, "maxLength is below minLength");
    bool lengths = get(s, "minLength") || get(s, "maxLength");
    if ((fmt || pat) && lengths)
        return cfail(c, path, "minLength/maxLength together with '%s' are not supported",
                     fmt ? "format" : "pattern");
    if (fmt && pat) return cfail(c, path, "'format' together with 'pattern' is not supported");
    if (fmt) {
        if (!cJSON_IsString(fmt)) return cfail(c, path, "'format' must be a string");
        const char *f = fmt->valuestring;
        if (strcmp(f, "date") == 0) c->date = true;
        else if (strcmp(f, "time") == 0) c->time = true;
        else if (strcmp(f, "date-time") == 0) c->date = c->time = true;
        else if (strcmp(f, "uuid") == 0) c->uuid = true;
        else if (strcmp(f, "email") == 0) c->email = true;
        else if (strcmp(f, "ipv4") == 0) c->ipv4 = true;
        else
            return cfail(
                c, path,
                "format '%s' is not supported (date, time, date-time, uuid, email, ipv4 are)", f);
        kvl_buf_printf(e, "\"\\\"\" %s%s \"\\\"\" %sspace", c->prefix,
                       strcmp(f, "date-time") == 0 ? "datetime" : f, c->prefix);
        return true;
    }
    if (pat) {
        if (!cJSON_IsString(pat)) return cfail(c, path, "'pattern' must be a string");
        char name[96], pre[100];
        new_name(c, "pattern", name, sizeof name);
        snprintf(pre, sizeof pre, "%s-", name);
        kvl_error rerr = {0};
        if (!regex_to_gbnf(pat->valuestring, pre, true, c->out, &rerr))
            return cfail(c, path, "pattern: %s", rerr.msg);
        kvl_buf_printf(e, "\"\\\"\" %s-root \"\\\"\" %sspace", name, c->prefix);
        return true;
    }
    if (!lengths) {
        kvl_buf_printf(e, "%sstring", c->prefix);
        return true;
    }
    if (max < 0)
        kvl_buf_printf(e, "\"\\\"\" %schar{%ld,} \"\\\"\" %sspace", c->prefix, min, c->prefix);
    else
        kvl_buf_printf(e, "\"\\\"\" %schar{%ld,%ld} \"\\\"\" %sspace", c->prefix, min, max,
                       c->prefix);
    return true;
}

void js_primitives(conv *c) {
    const char *p = c->prefix;
    kvl_buf *o = c->out;
    kvl_buf_printf(o, "%sspace ::= \"\" | \" \" | \"\\n\" [ \\t]{0,20}\n", p);
    kvl_buf_printf(o, "%sboolean ::= (\"true\" | \"false\") %sspace\n", p, p);
    kvl_buf_printf(o, "%snull ::= \"null\" %sspace\n", p, p);
    kvl_buf_printf(o, "%sintegral ::= \"0\" | [1-9] [0-9]{0,15}\n", p);
    kvl_buf_printf(
        o, "%snumber ::= \"-\"? %sintegral (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? %sspace\n",
        p, p, p);
    kvl_buf_printf(o, "%sinteger ::= \"-\"? %sintegral %sspace\n", p, p, p);
    kvl_buf_printf(
        o,
        "%schar ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n",
        p);
    kvl_buf_printf(o, "%sstring ::= \"\\\"\" %schar* \"\\\"\" %sspace\n", p, p, p);
    kvl_buf_printf(o, "%svalue ::= %sobject | %sarray | %sstring | %snumber | %sboolean | %snull\n",
                   p, p, p, p, p, p, p);
    kvl_buf_printf(o,
                   "%sobject ::= \"{\" %sspace (%sstring \":\" %sspace %svalue (\",\" %sspace "
                   "%sstring \":\" %sspace %svalue)*)? \"}\" %sspace\n",
                   p, p, p, p, p, p, p, p, p, p);
    kvl_buf_printf(o,
                   "%sarray ::= \"[\" %sspace (%svalue (\",\" %sspace %svalue)*)? \"]\" %sspace\n",
                   p, p, p, p, p, p);
    if (c->date) {
        /* month-day pairs that exist in every year (February: up to 28); years
         * 1000-9999 (Python's date has no year 0) */
        kvl_buf_printf(
            o,
            "%sdate ::= [1-9] [0-9]{3} \"-\" (\"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]) | "
            "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
            "(\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]))\n",
            p);
    }
    if (c->time)
        kvl_buf_printf(o,
                       "%stime ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                       "(\".\" [0-9]{1,6})? "
                       "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n",
                       p);
    if (c->date && c->time) kvl_buf_printf(o, "%sdatetime ::= %sdate \"T\" %stime\n", p, p, p);
    if (c->email) /* dot-atoms on both sides: a plain subset of RFC 5321 addresses */
        kvl_buf_printf(o,
                       "%semail ::= [a-zA-Z0-9_+-]{1,32} (\".\" [a-zA-Z0-9_+-]{1,32}){0,3} \"@\" "
                       "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,30} [a-zA-Z0-9])? (\".\" [a-zA-Z0-9] "
                       "([a-zA-Z0-9-]{0,30} [a-zA-Z0-9])?){0,3} "
                       "\".\" [a-zA-Z]{2,8}\n",
                       p);
    if (c->ipv4)
        kvl_buf_printf(
            o,
            "%sipv4 ::= %soctet \".\" %soctet \".\" %soctet \".\" %soctet\n"
            "%soctet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]\n",
            p, p, p, p, p, p);
    if (c->uuid)
        kvl_buf_printf(o,
                       "%suuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                       "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}\n",
                       p);
}
