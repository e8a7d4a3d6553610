/* Request bodies as JSON, with the checks cJSON leaves to its caller: a NUL
 * written as \u0000 (cJSON decodes it into a C string, which would end there
 * and silently cut a prompt or a stop string), data after the value, and the
 * exact text of numbers (a double cannot hold every 64-bit seed). */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

static size_t skip_ws(const char *p, size_t n, size_t i) {
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
    return i;
}

/* Offset of the first \u0000 escape inside a string, or n. Only called on
 * text that parsed, so strings and escapes are well formed. */
static size_t find_nul_escape(const char *p, size_t n) {
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_str) {
            in_str = p[i] == '"';
            continue;
        }
        if (p[i] == '"') {
            in_str = false;
        } else if (p[i] == '\\' && i + 1 < n) {
            if (p[i + 1] == 'u' && i + 5 < n && memcmp(p + i + 2, "0000", 4) == 0) return i;
            i++; /* the escaped character, which may be a quote or a backslash */
        }
    }
    return n;
}

/* End of the JSON string starting at p[i] == '"'. */
static size_t skip_string(const char *p, size_t n, size_t i) {
    for (i++; i < n && p[i] != '"'; i++)
        if (p[i] == '\\') i++;
    return i < n ? i + 1 : n;
}

/* End of the value starting at p[i] (already parsed, so well formed). */
static size_t skip_value(const char *p, size_t n, size_t i) {
    if (p[i] == '"') return skip_string(p, n, i);
    if (p[i] == '{' || p[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            if (p[i] == '"') {
                i = skip_string(p, n, i) - 1;
            } else if (p[i] == '{' || p[i] == '[') {
                depth++;
            } else if (p[i] == '}' || p[i] == ']') {
                if (--depth == 0) return i + 1;
            }
        }
        return n;
    }
    while (i < n && p[i] != ',' && p[i] != '}' && p[i] != ']' && p[i] != ' ' && p[i] != '\t' &&
           p[i] != '\n' && p[i] != '\r')
        i++;
    return i;
}

/* Walks the top-level object's members alongside cJSON's children (same
 * order) and gives each number member its source text. */
static bool keep_number_text(cJSON *root, const char *p, size_t n) {
    size_t i = skip_ws(p, n, 0);
    if (i >= n || p[i] != '{' || !cJSON_IsObject(root)) return true;
    i++;
    for (cJSON *item = root->child; item; item = item->next) {
        i = skip_ws(p, n, i);
        if (i < n && p[i] == ',') i = skip_ws(p, n, i + 1);
        if (i >= n || p[i] != '"') return false;
        i = skip_ws(p, n, skip_string(p, n, i));
        if (i >= n || p[i] != ':') return false;
        i = skip_ws(p, n, i + 1);
        size_t end = skip_value(p, n, i);
        if (cJSON_IsNumber(item) && !item->valuestring) {
            item->valuestring = strndup(p + i, end - i);
            if (!item->valuestring) return false;
        }
        i = end;
    }
    return true;
}

cJSON *json_parse_body(const char *p, size_t n, api_error *err) {
    if (!utf8_valid(p, n)) {
        api_fail(err, 400, NULL, "the request body is not valid UTF-8 (or contains NUL bytes)");
        return NULL;
    }
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithLengthOpts(p, n, &end, false);
    if (!body) {
        api_fail(err, 400, NULL, "the request body is not valid JSON (error at byte %zu)",
                 end && end >= p ? (size_t)(end - p) : (size_t)0);
        return NULL;
    }
    size_t after = skip_ws(p, n, (size_t)(end - p));
    if (after < n) {
        api_fail(err, 400, NULL, "the request body has data after the JSON value (at byte %zu)",
                 after);
        cJSON_Delete(body);
        return NULL;
    }
    size_t nul = find_nul_escape(p, n);
    if (nul < n) {
        api_fail(err, 400, NULL,
                 "the request body has a NUL character (\\u0000) in a string (at byte %zu); "
                 "NUL is not allowed in prompts, messages or stop strings",
                 nul);
        cJSON_Delete(body);
        return NULL;
    }
    if (!keep_number_text(body, p, n)) {
        api_fail(err, 500, NULL, "out of memory");
        cJSON_Delete(body);
        return NULL;
    }
    return body;
}
