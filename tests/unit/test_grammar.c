/* Constrained decoding: the GBNF parser and its errors, the matcher on
 * hand-checked strings (UTF-8 included), JSON Schema and regex translation,
 * and the token mask against a token-by-token check of every token of real
 * vocabularies (Qwen3's byte-level BPE, Llama's SentencePiece with <0xNN>
 * byte fallback), including states inside a UTF-8 sequence. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "grammar.h"
#include "grammar_ref.h"

#include "check.h"

#define TOKDIR "tests/data/tokenizer"

static grammar *compile(const char *gbnf, const tok_vocab *v) {
    kvl_error err = {{0}};
    grammar *g = grammar_compile(gbnf, v, &err);
    CHECK(g != NULL, "grammar does not compile: %s\n%s", err.msg, gbnf);
    return g;
}

static void expect_error(const char *gbnf, const char *needle) {
    kvl_error err = {{0}};
    grammar *g = grammar_compile(gbnf, NULL, &err);
    CHECK(g == NULL, "compiled but should not: %s", gbnf);
    CHECK(strstr(err.msg, needle) != NULL, "error for %s is '%s', expected it to contain '%s'",
          gbnf, err.msg, needle);
    grammar_free(g);
}

/* Each accept[] string must match, each reject[] one must not. */
static void match_cases(const char *gbnf, const char *const *accept, const char *const *reject) {
    grammar *g = compile(gbnf, NULL);
    if (!g) return;
    for (int i = 0; accept && accept[i]; i++)
        CHECK(grammar_match_text(g, accept[i], strlen(accept[i])), "%s should accept '%s'", gbnf,
              accept[i]);
    for (int i = 0; reject && reject[i]; i++)
        CHECK(!grammar_match_text(g, reject[i], strlen(reject[i])), "%s should reject '%s'", gbnf,
              reject[i]);
    grammar_free(g);
}

static void test_parse_errors(void) {
    expect_error("root ::= foo", "undefined rule 'foo'");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    expect_error("start ::= \"a\"", "no 'root' rule");
    expect_error("root ::= root \"a\" | \"b\"", "left recursion");
    expect_error("root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "left recursion");
    expect_error("root ::= \"abc", "unterminated string");
    expect_error("root ::= [a-z", "unterminated character class");
    expect_error("root ::= (\"a\" | \"b\"", "unclosed '('");
    expect_error("root ::= (\"a\" | b\nb ::= \"x\"",
                 "line 2, column 1: unclosed '(' before the next rule");
    expect_error("root ::= \"a\"\n  x ::= \"\\q\"", "line 2, column 10: unknown escape");
    expect_error("root ::= [z-a]", "below its start");
    expect_error("root ::= \"a\"{3,2}", "maximum is below the minimum");
    expect_error("root ::= * \"a\"", "line 1, column 10");
    expect_error("root ::= \"\\u12\"", "hex digits");
    expect_error("root \"a\"", "expected '::='");
}

static void test_matching(void) {
    match_cases("root ::= \"ab\" | \"cd\"", (const char *[]){"ab", "cd", NULL},
                (const char *[]){"", "a", "abc", "ac", NULL});
    match_cases("root ::= [a-c]+ [^x]?  # a comment\n",
                (const char *[]){"a", "abc", "cbaz", "aa\n", NULL},
                (const char *[]){"", "x", "ax", "abzz", NULL});
    match_cases("root ::= \"x\"{2,4}", (const char *[]){"xx", "xxx", "xxxx", NULL},
                (const char *[]){"x", "xxxxx", NULL});
    match_cases("root ::= (\"ab\"){2} | \"z\"{3,}",
                (const char *[]){"abab", "zzz", "zzzzzzz", NULL},
                (const char *[]){"ab", "ababab", "zz", NULL});
    match_cases("root ::= [0-9]{,2} \"!\"", (const char *[]){"!", "1!", "12!", NULL},
                (const char *[]){"123!", NULL});
    /* escapes, and code points beyond ASCII */
    match_cases("root ::= \"\\x41\\u00e9\\t\\n\\\\\\\"\" [\\u4e00-\\u9fff]",
                (const char *[]){"A\xc3\xa9\t\n\\\"\xe4\xb8\xad", NULL},
                (const char *[]){"A\xc3\xa9\t\n\\\"a", "A\xc3\xa9\t\n\\\"", NULL});
    match_cases("root ::= [^a-z]* \"\xf0\x9f\x98\x80\"",
                (const char *[]){"\xf0\x9f\x98\x80",
                                 "\xc3\xa9"
                                 "AB\xf0\x9f\x98\x80",
                                 NULL},
                (const char *[]){"a\xf0\x9f\x98\x80", "\xf0\x9f\x98", "\xf0\x9f\x98\x81", NULL});
    match_cases("root ::= . .", (const char *[]){"ab", "\xc3\xa9\xe4\xb8\xad", "\n\n", NULL},
                (const char *[]){"a", "abc", NULL});
    /* a rule body over several lines; nested groups; nullable references */
    match_cases("root ::= item (\",\" item)*\n\n  item ::=\n   \"[\" (num | ) \"]\"\nnum ::= "
                "[0-9]+ # digits\n",
                (const char *[]){"[]", "[1],[22],[]", NULL},
                (const char *[]){"[1],", "[a]", "", NULL});
    /* invalid UTF-8 never matches, not even through a negated class */
    match_cases("root ::= [^a]*", (const char *[]){"", "b\xc3\xa9", NULL},
                (const char *[]){"\xc3", "\xc0\x80", "\xed\xa0\x80", "\xff", NULL});
    grammar *g;
    /* a lead byte or a prefix that cannot encode an accepted code point is
     * refused at once, not at the end of the sequence (overlong encodings of
     * ASCII, surrogates, past U+10FFFF) */
    g = compile("root ::= [a-z] | [\\u0800-\\uFFFF] | [\\U00010000-\\U0010FFFF]", NULL);
    if (g) {
        grammar_state *st = grammar_state_new(g);
        CHECK(!grammar_state_allows_bytes(st, "\xc1", 1));
        CHECK(!grammar_state_allows_bytes(st, "\xe0\x81", 2),
              "E0 81: an overlong form of U+0040..U+007F");
        CHECK(grammar_state_allows_bytes(st, "\xe0\xa0", 2));
        CHECK(!grammar_state_allows_bytes(st, "\xed\xa0", 2), "ED A0: a surrogate");
        CHECK(!grammar_state_allows_bytes(st, "\xf0\x80", 2), "F0 80: overlong");
        CHECK(!grammar_state_allows_bytes(st, "\xf4\x90", 2), "F4 90: past U+10FFFF");
        CHECK(grammar_state_allows_bytes(st, "\xf4\x8f", 2));
        grammar_state_free(st);
        grammar_free(g);
    }
    g = compile("root ::= \"{\" [a-z]", NULL);
    if (g) {
        grammar_state *st = grammar_state_new(g);
        CHECK(!grammar_state_allows_bytes(st, "\xe0", 1),
              "E0 starts U+0800 or above: cannot be '{'");
        CHECK(!grammar_state_allows_bytes(st, "\xc1", 1));
        grammar_state_free(st);
        grammar_free(g);
    }
    /* a partial code point: the state can tell whether it may still complete */
    g = compile("root ::= \"\xc3\xa9\" | \"\xc3\xa8x\"", NULL);
    if (g) {
        grammar_state *st = grammar_state_new(g);
        CHECK(grammar_state_accept_bytes(st, "\xc3", 1));
        CHECK(!grammar_state_can_end(st));
        CHECK(!grammar_state_allows_bytes(st, "\xa0", 1), "U+00E0 is not in the grammar");
        CHECK(grammar_state_allows_bytes(st, "\xa8", 1));
        CHECK(grammar_state_accept_bytes(st, "\xa9", 1));
        CHECK(grammar_state_can_end(st) && grammar_state_must_end(st));
        grammar_state_free(st);
        grammar_free(g);
    }
}

/* Compiles schema via json_schema_to_gbnf and checks strings against it. */
static void schema_cases(const char *schema, const char *const *accept, const char *const *reject) {
    kvl_buf b = {0};
    kvl_error err = {{0}};
    kvl_buf_puts(&b, "root ::= s-root\n");
    bool ok = json_schema_to_gbnf(schema, "s-", &b, &err);
    CHECK(ok, "schema %s: %s", schema, err.msg);
    if (ok) {
        grammar *g = compile(b.p, NULL);
        for (int i = 0; g && accept && accept[i]; i++)
            CHECK(grammar_match_text(g, accept[i], strlen(accept[i])), "schema %s should accept %s",
                  schema, accept[i]);
        for (int i = 0; g && reject && reject[i]; i++)
            CHECK(!grammar_match_text(g, reject[i], strlen(reject[i])),
                  "schema %s should reject %s", schema, reject[i]);
        grammar_free(g);
    }
    kvl_buf_free(&b);
}

static void schema_error(const char *schema, const char *needle) {
    kvl_buf b = {0};
    kvl_error err = {{0}};
    CHECK(!json_schema_to_gbnf(schema, "s-", &b, &err), "schema %s should be refused", schema);
    CHECK(strstr(err.msg, needle) != NULL, "schema %s: error '%s' lacks '%s'", schema, err.msg,
          needle);
    kvl_buf_free(&b);
}

static void test_json_schema(void) {
    schema_cases(
        "{}", (const char *[]){"1", "\"x\"", "{\"a\": [1, 2.5e3, null, true]}", "[]", "-0", NULL},
        (const char *[]){"", "01", "{a:1}", "[1,]", "\"\\x\"", NULL});
    schema_cases("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{"
                 "\"type\":\"integer\"}},"
                 "\"required\":[\"name\"],\"additionalProperties\":false}",
                 (const char *[]){"{\"name\":\"Al\"}", "{ \"name\": \"Al\", \"age\": 30 }",
                                  "{\n  \"name\": \"\\u00e9\",\n  \"age\": -3\n}", NULL},
                 (const char *[]){"{}", "{\"age\":3}", "{\"name\":\"a\",\"x\":1}",
                                  "{\"name\":\"a\",\"age\":1.5}",
                                  "{\"name\":\"a\"}                 ", NULL});
    /* found by fuzzing: a bound beyond long long was converted to it (UB) */
    schema_cases("{\"type\":\"integer\",\"minimum\":2,\"maximum\":9e123}",
                 (const char *[]){"2", "9999999999999999", NULL},
                 (const char *[]){"1", "-3", NULL});
    schema_cases("{\"type\":\"integer\",\"minimum\":-1e300,\"exclusiveMaximum\":1e300}",
                 (const char *[]){"-5", "0", "77", NULL}, (const char *[]){"1.5", NULL});
    /* additional properties: any name but the named ones */
    schema_cases("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\"}},"
                 "\"additionalProperties\":{\"type\":\"boolean\"}}",
                 (const char *[]){"{}", "{\"age\":1}", "{\"ag\":true}",
                                  "{\"agex\":false,\"b\":true}", "{\"age\":1,\"x\":true}", NULL},
                 (const char *[]){"{\"age\":true}", "{\"x\":1}", "{\"b\":true,\"age\":1}", NULL});
    schema_cases(
        "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",1,null]},\"minItems\":1,\"maxItems\":3}",
        (const char *[]){"[\"a\"]", "[1, null, \"a\"]", NULL},
        (const char *[]){"[]", "[1,1,1,1]", "[\"b\"]", NULL});
    schema_cases("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"const\":\"x\"}],"
                 "\"items\":false,\"minItems\":1}",
                 (const char *[]){"[1]", "[1,\"x\"]", NULL},
                 (const char *[]){"[]", "[1,\"x\",2]", "[\"x\"]", NULL});
    schema_cases("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
                 (const char *[]){"\"ab\"", "\"\\n\\u0041b\"", "\"\xc3\xa9\xc3\xa9\"", NULL},
                 (const char *[]){"\"a\"", "\"abcd\"", NULL});
    schema_cases("{\"type\":\"string\",\"pattern\":\"^[a-z]+-\\\\d{2,3}$\"}",
                 (const char *[]){"\"ab-12\"", "\"z-123\"", NULL},
                 (const char *[]){"\"ab-1\"", "\"Ab-12\"", "\"ab-1234\"", NULL});
    schema_cases("{\"type\":\"string\",\"pattern\":\"a[^b]\\\"\"}",
                 (const char *[]){"\"ax\\\"\"", "\"a\\\"\\\"\"", "\"a\\n\\\"\"", NULL},
                 (const char *[]){"\"ab\\\"\"", "\"ax\"\"", NULL});
    schema_cases("{\"type\":\"string\",\"format\":\"date\"}",
                 (const char *[]){"\"2024-02-28\"", "\"1999-12-31\"", "\"2000-04-30\"", NULL},
                 (const char *[]){"\"2024-02-30\"", "\"2024-04-31\"", "\"2024-13-01\"",
                                  "\"24-01-01\"", NULL});
    schema_cases(
        "{\"type\":\"string\",\"format\":\"date-time\"}",
        (const char *[]){"\"2024-01-02T03:04:05Z\"", "\"2024-01-02T23:59:59.123+05:30\"", NULL},
        (const char *[]){"\"2024-01-02T24:00:00Z\"", "\"2024-01-02T03:04:05\"", NULL});
    schema_cases("{\"type\":\"string\",\"format\":\"uuid\"}",
                 (const char *[]){"\"123e4567-e89b-12d3-a456-426614174000\"", NULL},
                 (const char *[]){"\"123e4567e89b12d3a456426614174000\"", NULL});
    schema_cases("{\"type\":\"integer\",\"minimum\":-15,\"maximum\":123}",
                 (const char *[]){"-15", "-9", "0", "7", "99", "100", "123", NULL},
                 (const char *[]){"-16", "124", "200", "-0", "007", "1000", NULL});
    schema_cases("{\"type\":\"integer\",\"exclusiveMinimum\":9}",
                 (const char *[]){"10", "99999", NULL}, (const char *[]){"9", "-1", "0", NULL});
    schema_cases("{\"type\":\"number\",\"minimum\":0}", (const char *[]){"0", "2.5", "1e3", NULL},
                 (const char *[]){"-1", NULL});
    schema_cases("{\"type\":[\"string\",\"null\"],\"maxLength\":1}",
                 (const char *[]){"null", "\"a\"", NULL}, (const char *[]){"\"ab\"", "1", NULL});
    schema_cases("{\"anyOf\":[{\"type\":\"boolean\"},{\"$ref\":\"#/$defs/"
                 "pt\"}],\"$defs\":{\"pt\":{\"type\":\"object\","
                 "\"properties\":{\"x\":{\"type\":\"number\"},\"next\":{\"$ref\":\"#/$defs/"
                 "pt\"}},\"required\":[\"x\"],\"additionalProperties\":false}}}",
                 (const char *[]){"true", "{\"x\":1}",
                                  "{\"x\":1,\"next\":{\"x\":2,\"next\":{\"x\":-3.5}}}", NULL},
                 (const char *[]){"{\"next\":{\"x\":1}}", "{\"x\":1,\"next\":true}", NULL});
    schema_cases("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                 "\"required\":[\"a\"]},"
                 "{\"properties\":{\"b\":{\"const\":true}},\"required\":[\"b\"]}]}",
                 (const char *[]){"{\"a\":1,\"b\":true}", NULL},
                 (const char *[]){"{\"a\":1}", "{\"b\":true}", NULL});
    schema_cases("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{"
                 "\"type\":\"integer\"}},\"additionalProperties\":false}",
                 (const char *[]){"{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}", NULL},
                 (const char *[]){"{\"b\":2,\"a\":1}", "{,\"b\":2}", "{\"a\":1,}", NULL});
    schema_error("{\"allOf\":[{\"type\":\"object\"}],\"additionalProperties\":false}",
                 "'additionalProperties' next to 'allOf'");
    schema_error("{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":false},{"
                 "\"properties\":{\"b\":{}}}]}",
                 "property 'b' is excluded");
    /* properties named and additionalProperties absent: no others generated */
    schema_cases("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"}}}",
                 (const char *[]){"{}", "{\"a\":null}", NULL},
                 (const char *[]){"{\"b\":null}", NULL});
    schema_cases("{\"type\":\"object\"}", (const char *[]){"{}", "{\"b\":null,\"\\n\":[{}]}", NULL},
                 (const char *[]){"[]", NULL});
    schema_cases("{\"type\":\"string\",\"format\":\"email\"}",
                 (const char *[]){"\"a.b+c@x-y.example.org\"", NULL},
                 (const char *[]){"\"a..b@x.org\"", "\"ab@x\"", "\"@x.org\"", "\"a@-x.org\"",
                                  "\"a@x-.org\"", NULL});
    schema_cases("{\"type\":\"string\",\"format\":\"ipv4\"}",
                 (const char *[]){"\"0.0.0.0\"", "\"255.249.10.199\"", NULL},
                 (const char *[]){"\"256.1.1.1\"", "\"01.1.1.1\"", "\"1.1.1\"", NULL});
    schema_error("{\"type\":\"string\",\"format\":\"uri\"}", "format 'uri' is not supported");
    schema_error("{\"type\":\"object\",\"patternProperties\":{}}",
                 "unsupported JSON Schema keyword 'patternProperties'");
    schema_error("{\"not\":{}}", "'not'");
    schema_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences");
    schema_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround");
    schema_error("{\"$ref\":\"http://x/y\"}", "$ref 'http://x/y' is not supported");
    schema_error("{\"$ref\":\"#/$defs/nope\"}", "does not resolve");
    schema_error("{\"type\":\"number\",\"maximum\":3.5}", "bounds on 'number'");
    schema_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer");
    schema_error("{\"type\":", "not valid JSON");
    schema_error("false", "allows no value");
    schema_cases(
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}",
        (const char *[]){"[]", "[1]", "[1,\"a\"]", "[1,\"a\",null,{}]", NULL},
        (const char *[]){"[\"a\"]", "[1,2]", "[,1]", NULL});
    /* 3,000 prefix items, 2 required: a rule per optional one (nested groups
     * were 2,998 deep, past the parser's 1,024, and took quadratic time) */
    kvl_buf pre = {0}, big = {0};
    kvl_buf_puts(&pre, "{\"type\":\"array\",\"items\":false,\"minItems\":2,\"prefixItems\":[");
    kvl_buf_puts(&big, "[");
    for (int i = 0; i < 3000; i++) {
        kvl_buf_printf(&pre, "%s{\"const\":%d}", i ? "," : "", i);
        kvl_buf_printf(&big, "%s%d", i ? "," : "", i);
    }
    kvl_buf_puts(&pre, "]}");
    kvl_buf_puts(&big, "]");
    schema_cases(pre.p, (const char *[]){"[0,1]", "[0,1,2]", big.p, NULL},
                 (const char *[]){"[0]", "[0,2]", "[0,1,3]", NULL});
    big.p[big.len - 1] = ',';
    kvl_buf_puts(&big, "3000]");
    schema_cases(pre.p, NULL, (const char *[]){big.p, NULL});
    kvl_buf_free(&pre);
    kvl_buf_free(&big);
    /* a 100,000-byte property name beside additional properties: the trie of
     * names other than it was built by a call per character (a stack
     * overflow: the server died) */
    {
        enum { L = 100000 };
        kvl_buf sch = {0}, t[4] = {{0}};
        char *name = malloc(L + 1);
        memset(name, 'k', L);
        name[L] = 0;
        kvl_buf_printf(&sch,
                       "{\"properties\":{\"%s\":{\"type\":\"integer\"}},"
                       "\"additionalProperties\":{\"type\":\"string\"}}",
                       name);
        kvl_buf_printf(&t[0], "{\"%s\":1}", name);
        kvl_buf_printf(&t[1], "{\"%.*s\":\"s\",\"%sk\":\"s\"}", L - 1, name, name);
        kvl_buf_printf(&t[2], "{\"%s\":\"s\"}", name);
        kvl_buf_printf(&t[3], "{\"%s\":1,\"%s\":\"s\"}", name, name);
        /* matched 1 KB per call, as generation feeds it (one call of 100 KB is
         * over the matcher's work bound per call) */
        kvl_buf gb = {0};
        kvl_error err = {{0}};
        kvl_buf_puts(&gb, "root ::= s-root\n");
        CHECK(json_schema_to_gbnf(sch.p, "s-", &gb, &err), "long name: %.100s", err.msg);
        grammar *g = compile(gb.p, NULL);
        for (int k = 0; g && k < 4; k++) {
            grammar_state *st = grammar_state_new(g);
            bool ok = true;
            for (size_t at = 0; ok && at < t[k].len; at += 1000)
                ok = grammar_state_accept_bytes(st, t[k].p + at,
                                                t[k].len - at < 1000 ? t[k].len - at : 1000);
            ok = ok && grammar_state_can_end(st);
            CHECK(!grammar_state_error(st) && ok == (k < 2), "long name, text %d: %d (%s)", k, ok,
                  grammar_state_error(st) ? grammar_state_error(st) : "");
            grammar_state_free(st);
        }
        grammar_free(g);
        kvl_buf_free(&gb);
        free(name);
        kvl_buf_free(&sch);
        for (int i = 0; i < 4; i++) kvl_buf_free(&t[i]);
    }
    /* allOf: a property named again takes the later member's schema and place */
    schema_cases(
        "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
        "\"required\":[\"a\",\"b\"]},{\"properties\":{\"a\":{\"type\":\"string\"}}}]}",
        (const char *[]){"{\"b\":1,\"a\":\"x\"}", NULL},
        (const char *[]){"{\"a\":\"x\",\"b\":1}", "{\"b\":1,\"a\":1}", NULL});
    schema_error("{\"allOf\":[{\"properties\":{\"a\":{}}},{\"properties\":[1]}]}",
                 "'properties' must be an object");
    /* 1,000 optional properties: a tree of halves, linear (one rule per
     * property listing all later ones was 28 MB of GBNF, refused as too large) */
    kvl_buf many = {0};
    kvl_buf_puts(&many, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 1000; i++)
        kvl_buf_printf(&many, "%s\"p%d\":{\"type\":\"integer\"}", i ? "," : "", i);
    kvl_buf_puts(&many, "}}");
    schema_cases(many.p,
                 (const char *[]){"{}", "{\"p0\":1}", "{\"p999\":2}",
                                  "{\"p1\":1,\"p500\":2,\"p999\":3}", "{ \"p7\": 1, \"p8\": 2 }",
                                  NULL},
                 (const char *[]){"{\"p500\":1,\"p1\":2}", "{\"p1\":1,\"p1\":1}", "{\"p1000\":1}",
                                  "{,\"p1\":1}", "{\"p1\":1,}", NULL});
    many.len = 0;
    /* and with additional properties after them */
    kvl_buf_puts(&many, "{\"type\":\"object\",\"additionalProperties\":true,\"properties\":{");
    for (int i = 0; i < 1000; i++)
        kvl_buf_printf(&many, "%s\"p%d\":{\"type\":\"integer\"}", i ? "," : "", i);
    kvl_buf_puts(&many, "}}");
    schema_cases(many.p,
                 (const char *[]){"{}", "{\"x\":true}", "{\"p3\":1,\"x\":[],\"y\":null}", NULL},
                 (const char *[]){"{\"x\":true,\"p3\":1}", "{\"p3\":\"a\"}", NULL});
    kvl_buf_free(&many);
    /* a $ref reached again before anything consumes input would be a
     * left-recursive grammar: refused in schema terms (found by fuzzing) */
    schema_error("{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"null\"},{\"$ref\":\"#\"}]}",
                 "JSON schema at #/anyOf/2: recursion without consuming input: #/anyOf/2 -> #");
    schema_error("{\"$ref\":\"#\"}", "recursion without consuming input: # -> #");
    schema_error("{\"oneOf\":[{\"anyOf\":[{\"$ref\":\"#\"}]}]}",
                 "recursion without consuming input: #/oneOf/0/anyOf/0 -> #");
    schema_error("{\"anyOf\":[{\"$ref\":\"#/$defs/a\"}],\"$defs\":{\"a\":{\"$ref\":\"#\"}}}",
                 "recursion without consuming input: #/$defs/a -> #/anyOf/0 -> #/$defs/a");
    schema_error("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"anyOf\":[{\"type\":\"null\"},{"
                 "\"$ref\":\"#/$defs/b\"}]},\"b\":{\"$ref\":\"#/$defs/a\"}}}",
                 "recursion without consuming input: #/$defs/a/anyOf/1 -> #/$defs/b -> #/$defs/a");
    /* the cycle first met through a consuming path (a is an array item of b
     * before b is reached at a's head) is still found */
    schema_error("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"anyOf\":[{\"type\":\"array\","
                 "\"items\":{\"$ref\":\"#/$defs/b\"}},{\"$ref\":\"#/$defs/b\"}]},"
                 "\"b\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/a\"}]}}}",
                 "recursion without consuming input: #/$defs/a/anyOf/1 -> #/$defs/b/anyOf/1 -> "
                 "#/$defs/a");
    /* allOf resolves its members' $refs itself, into one object */
    schema_error("{\"allOf\":[{\"$ref\":\"#\"}]}", "only supported for object schemas");
    /* recursion under something that consumes input is fine */
    schema_cases("{\"type\":\"object\",\"properties\":{\"child\":{\"$ref\":\"#\"}}}",
                 (const char *[]){"{}", "{\"child\":{\"child\":{}}}", NULL},
                 (const char *[]){"{\"child\":null}", NULL});
    schema_cases("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"$ref\":"
                 "\"#\"}}]}",
                 (const char *[]){"1", "[]", "[1,[2,[]],3]", NULL}, (const char *[]){"[[]", NULL});
    schema_cases("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/b\"},"
                 "{\"type\":\"null\"}]},\"b\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/"
                 "a\"}}}}",
                 (const char *[]){"null", "[null,[]]", NULL}, (const char *[]){"[1]", NULL});
}

static void regex_cases(const char *re, const char *const *accept, const char *const *reject) {
    kvl_buf b = {0};
    kvl_error err = {{0}};
    kvl_buf_puts(&b, "root ::= r-root\n");
    bool ok = regex_to_gbnf(re, "r-", false, &b, &err);
    CHECK(ok, "regex %s: %s", re, err.msg);
    grammar *g = ok ? compile(b.p, NULL) : NULL;
    for (int i = 0; g && accept[i]; i++)
        CHECK(grammar_match_text(g, accept[i], strlen(accept[i])), "regex %s should accept '%s'",
              re, accept[i]);
    for (int i = 0; g && reject[i]; i++)
        CHECK(!grammar_match_text(g, reject[i], strlen(reject[i])), "regex %s should reject '%s'",
              re, reject[i]);
    grammar_free(g);
    kvl_buf_free(&b);
}

static void test_regex(void) {
    regex_cases("^(\\+\\d{1,3} )?\\(?\\d{3}\\)?[-. ]?\\d{4}$",
                (const char *[]){"555-1234", "+1 (555)1234", "5551234", NULL},
                (const char *[]){"55-1234", "+1234 5551234", NULL});
    regex_cases("(?:cat|dog)s?|[A-F\\d]{2}", (const char *[]){"cat", "dogs", "A9", NULL},
                (const char *[]){"cats|", "G1", "", NULL});
    regex_cases("a.c\\.\\w+?\\s\\S",
                (const char *[]){"abc.x_1 !",
                                 "a\xc3\xa9"
                                 "c.z\ty",
                                 NULL},
                (const char *[]){"a\nc.x y", "abc.x y ", NULL});
    regex_cases("[^\\d\\s]*", (const char *[]){"", "ab-\xc3\xa9", NULL},
                (const char *[]){"a1", "a b", NULL});
    kvl_buf b = {0};
    kvl_error err = {{0}};
    CHECK(!regex_to_gbnf("a\\bc", "r-", false, &b, &err) && strstr(err.msg, "word boundaries"),
          "%s", err.msg);
    CHECK(!regex_to_gbnf("a(?i)b", "r-", false, &b, &err) && strstr(err.msg, "inline flags"), "%s",
          err.msg);
    CHECK(!regex_to_gbnf("a**", "r-", false, &b, &err) && strstr(err.msg, "nested quantifier"),
          "%s", err.msg);
    CHECK(!regex_to_gbnf("a)", "r-", false, &b, &err) && strstr(err.msg, "unmatched ')'"), "%s",
          err.msg);
    CHECK(!regex_to_gbnf("a$b", "r-", false, &b, &err) && strstr(err.msg, "anchor"), "%s", err.msg);
    /* an unbounded repetition of a group that can be empty (found by fuzzing:
     * its rule would recurse without consuming input) is refused by name;
     * a bounded one, and one of a group that cannot be empty, still work */
    CHECK(!regex_to_gbnf("(ba|(c)?|v )*x", "r-", false, &b, &err) &&
              strstr(err.msg, "empty string"),
          "%s", err.msg);
    CHECK(!regex_to_gbnf("(a?b?){2,}", "r-", false, &b, &err) && strstr(err.msg, "empty string"),
          "%s", err.msg);
    kvl_buf_free(&b);
    regex_cases("(a?b?){1,2}c", (const char *[]){"c", "abc", "aabc", NULL},
                (const char *[]){"aaabc", NULL});
    regex_cases("(a?b)+", (const char *[]){"b", "abab", NULL}, (const char *[]){"", "a", NULL});
}

/* ------------------------------------------------------- token masks -- */

static tok_vocab *load_vocab(const char *path) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    gguf_close(f);
    CHECK(v != NULL, "cannot load %s: %s", path, err.msg);
    return v;
}

/* After feeding prefix, the mask must hold exactly the tokens whose text the
 * state allows one at a time (and EOG exactly when the grammar can end). */
static void mask_vs_brute(const tok_vocab *v, const grammar *g, const char *prefix, size_t plen,
                          const char *what) {
    grammar_state *st = grammar_state_new(g);
    CHECK(st && grammar_state_accept_bytes(st, prefix, plen), "%s: prefix refused", what);
    if (!st) return;
    const int32_t V = tok_n_vocab(v);
    uint32_t *mask = calloc((size_t)(V + 31) / 32 + 1, sizeof *mask);
    int32_t n = grammar_state_mask(st, mask, V + 5); /* padding ids past the vocabulary: never */
    int32_t brute = 0, wrong = 0;
    char buf[1024];
    for (int32_t t = 0; t < V + 5; t++) {
        bool want;
        if (t >= V) want = false;
        else if (tok_is_eog(v, t)) want = grammar_state_can_end(st);
        else if (tok_is_control(v, t)) want = false;
        else {
            size_t len = tok_token_bytes(v, t, false, buf, sizeof buf);
            want = len > 0 && len <= sizeof buf && grammar_state_allows_bytes(st, buf, len);
        }
        bool got = mask[t >> 5] >> (t & 31) & 1;
        brute += want;
        if (want != got && wrong++ < 5)
            CHECK(false, "%s: token %d (%s): mask %d, one by one %d", what, t, tok_piece(v, t), got,
                  want);
    }
    CHECK(n == brute, "%s: mask counts %d tokens, one by one %d", what, n, brute);
    CHECK(brute > 0, "%s: no token allowed at all", what);
    free(mask);
    grammar_state_free(st);
}

static void test_masks(const char *path, bool check_partial) {
    tok_vocab *v = load_vocab(path);
    if (!v) return;
    kvl_buf b = {0};
    kvl_error err = {{0}};
    kvl_buf_puts(&b, "root ::= s-root\n");
    CHECK(json_schema_to_gbnf("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                              "\"tags\":{\"type\":\"array\","
                              "\"items\":{\"enum\":[\"\xe4\xb8\xad\xe6\x96\x87\",\"caf\xc3\xa9\"]}}"
                              ",\"n\":{\"type\":\"integer\"}},"
                              "\"required\":[\"name\",\"tags\"],\"additionalProperties\":false}",
                              "s-", &b, &err),
          "%s", err.msg);
    grammar *g = compile(b.p, v);
    if (g) {
        static const char *const prefixes[] = {"",
                                               "{",
                                               "{\"name\"",
                                               "{\"name\": \"ab",
                                               "{\"name\": \"ab\\",
                                               "{\"name\":\"\",\"tags\":[",
                                               "{\"name\":\"\",\"tags\":[\"\xe4",
                                               "{\"name\":\"\",\"tags\":[\"caf\xc3",
                                               "{\"name\":\"\",\"tags\":[],\"n\":12",
                                               "{\"name\":\"\",\"tags\":[]}"};
        for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
            if (!check_partial && strchr(prefixes[i], '\xe4')) continue;
            char what[256];
            snprintf(what, sizeof what, "%s after '%s'", path, prefixes[i]);
            mask_vs_brute(v, g, prefixes[i], strlen(prefixes[i]), what);
        }
        /* the end: only EOG */
        grammar_state *st = grammar_state_new(g);
        const char *done = "{\"name\":\"x\",\"tags\":[]}";
        CHECK(grammar_state_accept_bytes(st, done, strlen(done)));
        CHECK(grammar_state_can_end(st));
        uint32_t *mask = calloc((size_t)(tok_n_vocab(v) + 31) / 32, sizeof *mask);
        int32_t n = grammar_state_mask(st, mask, tok_n_vocab(v));
        int32_t n_eog = 0;
        for (int32_t t = 0; t < tok_n_vocab(v); t++)
            n_eog += tok_is_eog(v, t) ? (mask[t >> 5] >> (t & 31) & 1) : 0;
        CHECK(n_eog > 0, "%s: no EOG allowed at the end", path);
        free(mask);
        (void)n;
        grammar_state_free(st);
        grammar_free(g);
        /* tokens drive the state the same way their bytes do (SentencePiece
         * encodes a leading space: the grammar allows one) */
        kvl_buf b2 = {0};
        kvl_buf_puts(&b2, "root ::= \" \"? s-root\n");
        kvl_buf_puts(&b2, b.p + strlen("root ::= s-root\n"));
        g = compile(b2.p, v);
        kvl_buf_free(&b2);
        grammar_state *a = grammar_state_new(g);
        const char *text = "{\"name\": \"caf\xc3\xa9 \xe4\xb8\xad\", \"tags\": []}";
        int32_t ids[256];
        int64_t nt = tok_encode(v, text, strlen(text), false, false, ids, 256, &err);
        CHECK(nt > 0 && nt <= 256);
        for (int64_t i = 0; i < nt; i++)
            CHECK(grammar_state_accept_token(a, ids[i]), "%s: token %lld (%d) refused", path,
                  (long long)i, ids[i]);
        CHECK(grammar_state_can_end(a));
        grammar_state_free(a);
        grammar_free(g);
    }
    kvl_buf_free(&b);
    /* a grammar that cannot start with any token text but one code point at a time */
    g = compile("root ::= [\\u4e00-\\u9fff]{2} \"!\"", v);
    if (g) {
        mask_vs_brute(v, g, "", 0, "CJK start");
        if (check_partial) mask_vs_brute(v, g, "\xe4\xb8", 2, "CJK inside a code point");
        grammar_free(g);
    }
    tok_vocab_destroy(v);
}

/* Found by fuzzing: a chain of thousands of nullable items recursed past the
 * thread's stack while expanding, and repetitions of nullable items made the
 * matcher's work combinatorial (seconds per character). Both are refused when
 * compiled; a fixed count of them is not ambiguous in that way and compiles,
 * and its expansion must not follow every path to the same place; a chain of 60,000 rule references, each entered before anything
 * is consumed, stops at the expansion's depth limit instead of the stack. */
static void test_pathological(void) {
    /* a rule of many alternatives that each begin with a reference (a regex
     * a|a|...|a translates so): the left-recursion walk rescanned the rule
     * from its first alternative for each one, 4 s for 64,000 of them and
     * about 40 s for these 200,000 (a 1.6 MB request); now tens of ms */
    kvl_buf alts = {0};
    kvl_buf_puts(&alts, "root ::= ");
    for (int i = 0; i < 200000; i++) kvl_buf_puts(&alts, i ? " | (\"a\")" : "(\"a\")");
    expect_error(alts.p, "more than 4096 parse stacks");
    kvl_buf_free(&alts);
    /* groups nested 200,000 deep overflowed the parser's stack (a 400 KB
     * request crashed the server); 1,024 deep are fine */
    kvl_buf deep = {0};
    for (int k = 0; k < 2; k++) {
        const int n = k ? 200000 : 1024;
        deep.len = 0;
        kvl_buf_puts(&deep, "root ::= ");
        for (int i = 0; i < n; i++) kvl_buf_puts(&deep, "(");
        kvl_buf_puts(&deep, "\"a\"");
        for (int i = 0; i < n; i++) kvl_buf_puts(&deep, ")");
        if (!k) match_cases(deep.p, (const char *const[]){"a", NULL}, NULL);
        else expect_error(deep.p, "line 1, column 1034: groups nested more than 1024 deep");
    }
    kvl_buf_free(&deep);
    expect_error("root ::= \"a\" (\"b\")?{0,9999} \"c\"", "can match the empty string");
    expect_error("root ::= \"a\" [b-d]* ?{,210}", "can match the empty string");
    expect_error("root ::= (\"x\"?)*", "can match the empty string");
    expect_error("root ::= ([a-z]? [0-9]?)+ \"!\"", "can match the empty string");
    static const char *const acc[] = {"ac", "abc", "abbbbbbbbbbbbbbbc", NULL};
    static const char *const rej[] = {"a", "abcb", NULL};
    match_cases("root ::= \"a\" \"b\"{0,200} \"c\"", acc, rej);
    match_cases("root ::= \"a\" (\"b\"?){3} \"c\"", (const char *const[]){"ac", "abbbc", NULL},
                (const char *const[]){"abbbbc", NULL});
    /* a fixed count of items that can each be empty two ways (the option
     * empty, or the star inside it empty): without cutting the paths that
     * meet again while expanding, 2^100 of them */
    match_cases("root ::= \"a\" ([b-d]*)?{100}",
                (const char *const[]){"a", "abcd", "adddcbb", NULL},
                (const char *const[]){"", "abx", NULL});
    match_cases("root ::= \"\" [b,d-d]* ?{73}", (const char *const[]){"", "b,d", NULL},
                (const char *const[]){"c", NULL});
    /* consecutive *, + and ? fold into one operator: nested, 21 '+' kept
     * exponentially many stacks (seconds per byte; found by fuzzing) */
    char many[256];
    memset(many, 'a', 200);
    many[200] = 0;
    match_cases("root ::= [a-z]+++++++++++++++++++++*",
                (const char *const[]){"", "abc", many, NULL}, (const char *const[]){"A", NULL});
    match_cases("root ::= \"a\" \"b\"?+ \"c\"", (const char *const[]){"ac", "abc", "abbbc", NULL},
                (const char *const[]){"abd", NULL});
    match_cases("root ::= \"a\" \"b\"+? \"c\"", (const char *const[]){"ac", "abbc", NULL}, NULL);
    match_cases("root ::= \"a\" \"b\"?? \"c\"", (const char *const[]){"ac", "abc", NULL},
                (const char *const[]){"abbc", NULL});
    match_cases("root ::= \"a\" \"b\"++ \"c\"", (const char *const[]){"abc", "abbc", NULL},
                (const char *const[]){"ac", NULL});
    kvl_buf b = {0};
    kvl_buf_puts(&b, "root ::= r0\n");
    for (int i = 0; i < 60000; i++) kvl_buf_printf(&b, "r%d ::= r%d\n", i, i + 1);
    kvl_buf_puts(&b, "r60000 ::= \"z\"\n");
    kvl_error err = {{0}};
    grammar *g = grammar_compile(b.p, NULL, &err);
    CHECK(g == NULL && strstr(err.msg, "nests more than 4096 rules"),
          "a 60,000-deep reference chain is refused when compiled (its start is past the "
          "expansion's depth bound), not matched as nothing: '%s'",
          err.msg);
    grammar_free(g);
    kvl_buf_free(&b);
}

/* ------------------------------------------------ ambiguity and bounds -- */

/* Every string over alphabet of up to max_len bytes: the matcher (default
 * bounds) answers, never -1, and agrees with the reference. */
static void ambiguous_vs_reference(const char *gbnf, const char *alphabet, int max_len) {
    grammar *g = compile(gbnf, NULL);
    if (!g) return;
    const int k = (int)strlen(alphabet);
    int digits[64] = {0};
    char s[64];
    long n_strings = 0, n_in = 0, n_wrong = 0, n_err = 0;
    for (int len = 0; len <= max_len; len++) {
        memset(digits, 0, sizeof digits);
        for (;;) {
            for (int i = 0; i < len; i++) s[i] = alphabet[digits[i]];
            kvl_error err = {{0}};
            int got = grammar_match(g, s, (size_t)len, &err);
            bool want = grammar_ref_match(g, s, len) == 1;
            n_strings++;
            n_in += want;
            if (got < 0 && n_err++ < 3)
                CHECK(got >= 0, "%s: '%.*s' went over a bound: %s", gbnf, len, s, err.msg);
            if (got >= 0 && (got == 1) != want && n_wrong++ < 3)
                CHECK((got == 1) == want, "%s: '%.*s' matched %d, the reference says %d", gbnf, len,
                      s, got, want);
            int i = 0;
            while (i < len && ++digits[i] == k) digits[i++] = 0;
            if (i == len) break;
        }
    }
    CHECK(n_wrong == 0 && n_err == 0, "%s: %ld wrong, %ld errors in %ld strings", gbnf, n_wrong,
          n_err, n_strings);
    CHECK(n_in > 0 && n_in < n_strings, "%s: a trivial language (%ld of %ld)", gbnf, n_in,
          n_strings);
    grammar_free(g);
}

/* r ::= "a" r "b" | "a" r "c" | "": after n a's, 3 * 2^n distinct stacks
 * (each a different sequence of b/c still owed, with either alternative's a
 * or the last b/c on top), so no merging helps. */
#define EMBED "root ::= r\nr ::= \"a\" r \"b\" | \"a\" r \"c\" | \"\"\n"

static void test_ambiguous(void) {
    ambiguous_vs_reference("root ::= (\"a\" | \"a\")+", "ab", 12);
    ambiguous_vs_reference("root ::= (\"a\" | \"a\" \"a\")*", "ab", 12);
    ambiguous_vs_reference("root ::= ((\"a\" | \"a\")+ (\"b\" | \"a\" \"b\")?)+ \"c\"?", "abc", 8);
    ambiguous_vs_reference("root ::= ((((\"a\" | \"a\")+ | \"a\")+ \"b\"? | \"a\")+ \"c\"?)+",
                           "abc", 8);
    ambiguous_vs_reference("root ::= x+\nx ::= \"a\" | \"ab\" | \"a\" \"b\" | (\"a\" \"b\"?)+",
                           "ab", 12);
    ambiguous_vs_reference(
        "root ::= ((((((\"a\"+ \"b\"?)+ \"c\"?)+ \"b\"?)+ \"c\"?)+ \"b\"?)+ \"c\"?)+", "abc", 8);
    ambiguous_vs_reference("root ::= ws (item ws)*\nitem ::= [a-b]+ | [a-b]+ \"c\"? | \"a\" item?\n"
                           "ws ::= \" \"*",
                           "abc ", 7);
    ambiguous_vs_reference(EMBED, "abc", 10);
    ambiguous_vs_reference(
        "root ::= r\nr ::= \"a\" r (\"b\" | \"c\") | \"a\" r \"b\" | \"a\" r \"c\" "
        "| \"a\" r | \"\"",
        "abc", 5);

    /* Past the stack bound: a clear error, never a refusal. a^n (b|c)^n is in
     * the language; after 11 a's there are 6144 stacks > 4096. The old
     * matcher dropped them past its buffer and refused this sentence. */
    grammar *g = compile(EMBED, NULL);
    if (!g) return;
    char s[64];
    memset(s, 'a', 24);
    for (int i = 0; i < 24; i++) s[24 + i] = i % 3 ? 'b' : 'c';
    kvl_error err = {{0}};
    int r = grammar_match(g, s, 48, &err);
    CHECK(r == -1 && strstr(err.msg, "more than 4096 parse stacks at one position (at byte 11 "),
          "a^24 (b|c)^24 past the bound: %d '%s' (expected -1 and the stack bound)", r, err.msg);
    CHECK(!grammar_match_text(g, s, 48));
    /* within the bound (10 a's: 3072 stacks), exact */
    memset(s, 'a', 10);
    for (int i = 0; i < 10; i++) s[10 + i] = i % 2 ? 'b' : 'c';
    CHECK(grammar_match(g, s, 20, &err) == 1, "a^10 (b|c)^10: %s", err.msg);
    CHECK(grammar_match(g, s, 19, &err) == 0, "a^10 (b|c)^9: %s", err.msg);
    s[19] = 'a';
    CHECK(grammar_match(g, s, 20, &err) == 0, "a^10 (b|c)^9 a: %s", err.msg);
    /* the bound is exact: 12 stacks (2 a's) pass a limit of 12, 24 do not;
     * the failed state answers nothing more and says why */
    grammar_state *st = grammar_state_new(g);
    if (st) {
        grammar_state_set_limits(st, 12, GRAMMAR_MAX_STEP_WORK);
        CHECK(grammar_state_accept_bytes(st, "aa", 2) && !grammar_state_error(st));
        CHECK(grammar_state_allows_bytes(st, "cb", 2));
        CHECK(!grammar_state_allows_bytes(st, "a", 1) && grammar_state_error(st) &&
                  strstr(grammar_state_error(st),
                         "more than 12 parse stacks at one position (at byte 3 "),
              "the 3rd a: '%s'", grammar_state_error(st) ? grammar_state_error(st) : "no error");
        CHECK(!grammar_state_accept_bytes(st, "b", 1), "failed: even a valid byte is refused");
        CHECK(!grammar_state_can_end(st) && !grammar_state_must_end(st));
        grammar_state_free(st);
    }
    /* the work bound: one call's expansions */
    st = grammar_state_new(g);
    if (st) {
        grammar_state_set_limits(st, GRAMMAR_MAX_STACKS, 200);
        CHECK(grammar_state_accept_bytes(st, "aa", 2) && !grammar_state_error(st));
        CHECK(!grammar_state_accept_bytes(st, "aaaaaa", 6) && grammar_state_error(st) &&
                  strstr(grammar_state_error(st), "more than 200 units of work"),
              "6 more a's in one call: '%s'",
              grammar_state_error(st) ? grammar_state_error(st) : "no error");
        grammar_state_free(st);
    }
    grammar_free(g);
}

/* gbnf_append_choice: "root ::= " + the choice of strs, compiled. */
static grammar *choice_grammar(const char *const *strs, size_t n, kvl_buf *b) {
    size_t *len = malloc(n * sizeof *len);
    for (size_t i = 0; i < n; i++) len[i] = strlen(strs[i]);
    kvl_buf_puts(b, "root ::= ");
    gbnf_append_choice(b, strs, len, n);
    kvl_buf_puts(b, "\n");
    free(len);
    return compile(b->p, NULL);
}

/* Literal sets (enum, guided_choice) as a tree by common prefix: the same
 * strings, and thousands of them within the matcher's bounds. */
static void test_choice(void) {
    kvl_buf b = {0};
    const char *const s1[] = {"abc", "b", "abd", "ab", "abc"};
    grammar *g = choice_grammar(s1, 5, &b);
    CHECK(b.p && strcmp(b.p, "root ::= (\"ab\" (\"c\" | \"d\")? | \"b\")\n") == 0, "tree: %s", b.p);
    const char *const no1[] = {"", "a", "abcd", "bb", "ac", "c"};
    for (size_t i = 0; g && i < 5; i++)
        CHECK(grammar_match_text(g, s1[i], strlen(s1[i])), "%s should accept '%s'", b.p, s1[i]);
    for (size_t i = 0; g && i < 6; i++)
        CHECK(!grammar_match_text(g, no1[i], strlen(no1[i])), "%s should reject '%s'", b.p, no1[i]);
    grammar_free(g);
    kvl_buf_free(&b);
    /* é and ê share their first byte: branches are cut at characters */
    const char *const s2[] = {"\xC3\xA9", "\xC3\xAA",
                              "\xC3\xA9"
                              "a",
                              "", "x\"\\"};
    g = choice_grammar(s2, 5, &b);
    const char *const no2[] = {"e",
                               "\xC3\xAA"
                               "a",
                               "a", "x"};
    for (size_t i = 0; g && i < 5; i++)
        CHECK(grammar_match_text(g, s2[i], strlen(s2[i])), "%s should accept '%s'", b.p, s2[i]);
    for (size_t i = 0; g && i < 4; i++)
        CHECK(!grammar_match_text(g, no2[i], strlen(no2[i])), "%s should reject '%s'", b.p, no2[i]);
    grammar_free(g);
    kvl_buf_free(&b);
    /* 6,000 strings: one alternative each would be 6,000 parse stacks at the
     * start, past GRAMMAR_MAX_STACKS (4,096) */
    enum { N = 6000 };
    char(*names)[16] = malloc(N * sizeof *names);
    const char **ptr = malloc(N * sizeof *ptr);
    for (int i = 0; i < N; i++)
        snprintf(names[i], sizeof names[i], "id-%d", i * 7), ptr[i] = names[i];
    g = choice_grammar(ptr, N, &b);
    CHECK(g && grammar_match_text(g, "id-41993", 8) && grammar_match_text(g, "id-0", 4) &&
              !grammar_match_text(g, "id-41994", 8) && !grammar_match_text(g, "id-", 3),
          "6,000 choices");
    grammar_free(g);
    kvl_buf_free(&b);
    free(ptr);
    free(names);
    /* and as a JSON schema enum (the server's guided_choice takes the same path) */
    kvl_buf en = {0};
    kvl_buf_puts(&en, "{\"enum\":[");
    for (int i = 0; i < N; i++) kvl_buf_printf(&en, "%s%d", i ? "," : "", i * 3);
    kvl_buf_puts(&en, ",\"x\",null,{\"a\":[1]}]}");
    schema_cases(en.p, (const char *[]){"0", "17997", "\"x\"", "null", "{\"a\":[1]}", NULL},
                 (const char *[]){"1", "18000", "\"y\"", "{}", NULL});
    kvl_buf_free(&en);
}

int main(void) {
    test_choice();
    test_parse_errors();
    test_pathological();
    test_ambiguous();
    test_matching();
    test_json_schema();
    test_regex();
    test_masks(TOKDIR "/ggml-vocab-qwen3.gguf", true);
    test_masks(TOKDIR "/ggml-vocab-llama-spm.gguf", true);
    grammar_vocab_cache_trim();
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
