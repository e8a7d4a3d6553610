/* libFuzzer target for the grammar compilers: byte 0 picks what the rest is,
 * a GBNF grammar, a JSON Schema or a regular expression; the schema and the
 * regex are translated to GBNF, and whatever compiles is matched against a
 * few texts and walked byte by byte with a grammar_state. Compile errors are
 * ordinary outcomes, and so is a match that goes over the matcher's bounds
 * (grammar.h) with its error; a crash, a sanitizer report, a leak, a match
 * that disagrees with the reference recognizer (tests/unit/grammar_ref.h), or
 * a translation that does not compile (the translators must emit valid GBNF)
 * is a finding.
 * Two refusals of a translation are expected, and the server answers both
 * with a 400: a pattern that repeats something that can match the empty
 * string ((|ab){1,3}, (a?)*) is refused by the compiler's ambiguity check; a
 * translation whose start is already over the matcher's bounds (grammar.h;
 * e.g. the regex a|a|...|a of 5,000 alternatives: 5,000 parse stacks before
 * the first byte) is refused with the bound's message, as the same GBNF
 * grammar would be: valid, but too large for the matcher.
 * Schemas and regexes reach the translators only as valid UTF-8 (the server
 * checks every body, and cJSON refuses lone surrogate escapes), so other
 * inputs are given to the GBNF compiler alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "srv_internal.h" /* utf8_valid */
#include "grammar_ref.h"  /* the reference recognizer (tests/unit) */

static const char *const TEXTS[] = {
    "", "a", "{}", "{\"a\": 1}", "[1, \"x\", null]", "2024-07-26", "\"\xC3\xA9\""};

/* Bounds far below grammar.h's, so that inputs that reach them (the error
 * path) cost milliseconds, not a large part of a second each. */
#define FUZZ_STACKS 256
#define FUZZ_WORK   (1 << 16)

static grammar_state *fuzz_state(const grammar *g) {
    grammar_state *st = grammar_state_new(g);
    if (st) grammar_state_set_limits(st, FUZZ_STACKS, FUZZ_WORK);
    return st;
}

/* The matcher is exact or says it went over a bound: where the reference
 * recognizer answers (ASCII texts up to 63 bytes), they agree. */
static void check_match(const grammar *g, const char *t, size_t n) {
    grammar_state *st = fuzz_state(g);
    if (!st) return;
    int got = grammar_state_accept_bytes(st, t, n) && grammar_state_can_end(st);
    const char *err = grammar_state_error(st);
    if (err) got = -1;
    int want = got < 0 ? -1 : grammar_ref_match(g, t, (int)n);
    if (want >= 0 && got != want) {
        fprintf(stderr, "'%.*s': the matcher says %d, the reference %d\n", (int)n, t, got, want);
        abort();
    }
    grammar_state_free(st);
}

/* The messages of grammar_check_start's refusals (grammar_match.c): a bound
 * of grammar.h exceeded at the start. */
static bool over_bounds(const char *msg) {
    return strncmp(msg, "grammar too ambiguous: ", 23) == 0 ||
           strncmp(msg, "grammar nests more than ", 24) == 0;
}

static void exercise(const grammar *g, const char *src, size_t n) {
    for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++)
        check_match(g, TEXTS[i], strlen(TEXTS[i]));
    /* the text of the input's last comment ("...\n#aabb"), as a sentence */
    const char *hash = NULL;
    for (size_t i = 0; i < n; i++)
        if (src[i] == '#') hash = src + i + 1;
    if (hash) {
        size_t len = n - (size_t)(hash - src);
        if (len > 0 && hash[len - 1] == '\n') len--;
        check_match(g, hash, len < 63 ? len : 63);
    }
    grammar_state *st = fuzz_state(g);
    if (!st) return;
    /* the input's own bytes as output, as far as the grammar allows them */
    for (size_t i = 0; i < n && i < 256; i++) {
        bool allowed = grammar_state_allows_bytes(st, src + i, 1);
        if (grammar_state_accept_bytes(st, src + i, 1) != allowed) {
            fprintf(stderr, "byte %zu: allows and accept disagree\n", i);
            abort();
        }
        if (!allowed) break;
    }
    grammar_state_can_end(st);
    grammar_state_must_end(st);
    grammar_state_free(st);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1 || size > 16384) return 0;
    char *src = malloc(size);
    if (!src) return 0;
    memcpy(src, data + 1, size - 1);
    src[size - 1] = 0; /* the compilers take NUL-terminated text */
    const int kind = utf8_valid(src, strlen(src)) ? data[0] % 3 : 0;
    kvl_error err = {{0}};
    grammar *g = NULL;
    if (kind == 0) {
        g = grammar_compile(src, NULL, &err);
    } else {
        kvl_buf b = {0};
        kvl_buf_puts(&b, "root ::= s-root\n");
        bool ok = kind == 1 ? json_schema_to_gbnf(src, "s-", &b, &err)
                            : regex_to_gbnf(src, "s-", false, &b, &err);
        if (ok && !b.oom) {
            g = grammar_compile(b.p, NULL, &err);
            /* a translation must be valid GBNF */
            if (!g && !strstr(err.msg, "can match the empty string") && !over_bounds(err.msg)) {
                fprintf(stderr, "translated grammar does not compile: %s\n%s\n", err.msg, b.p);
                abort();
            }
        }
        kvl_buf_free(&b);
    }
    if (g) {
        exercise(g, src, strlen(src));
        grammar_free(g);
    }
    free(src);
    return 0;
}
