/* Tokenizer tests against llama.cpp's outputs (run from the repo root):
 *  - every .inp/.out vector pair beside a vocab GGUF in tests/data/tokenizer
 *    (no BOS, special text not parsed), plus the llama-bpe and qwen2 vectors
 *    run on the Llama 3 and Qwen3 vocabs;
 *  - tests/data/golden/<model>/tokenize.json (with BOS and special parsing);
 *  - decode(encode(x)) == x, the streaming decoder, invalid UTF-8, special
 *    tokens, EOG detection, load errors and encoding throughput.
 * Prints a pass count per file and the first mismatch in detail. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "tok_extra.h"
#include "tokenizer.h"

#include "check.h"

#define TOKDIR  "tests/data/tokenizer"
#define GOLDDIR "tests/data/golden"

/* ---------------------------------------------------------------- helpers */

static tok_vocab *load_vocab(const char *path) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "cannot open %s: %s\n", path, err.msg);
        failures++;
        return NULL;
    }
    tok_vocab *v = tok_vocab_create(f, &err);
    gguf_close(f); /* the vocab keeps its own copies */
    if (!v) {
        fprintf(stderr, "cannot load vocab %s: %s\n", path, err.msg);
        failures++;
    }
    return v;
}

/* Encodes with the two-call protocol (count, then fill). */
static int32_t *encode(const tok_vocab *v, const char *text, size_t len, bool bos, bool special,
                       int64_t *n) {
    kvl_error err = {{0}};
    *n = tok_encode(v, text, len, bos, special, NULL, 0, &err);
    if (*n < 0) {
        fprintf(stderr, "encode failed: %s\n", err.msg);
        failures++;
        *n = 0;
        return calloc(1, sizeof(int32_t));
    }
    int32_t *ids = calloc((size_t)*n + 1, sizeof *ids);
    int64_t again = tok_encode(v, text, len, bos, special, ids, *n, &err);
    CHECK(again == *n, "second call returned %lld, first %lld", (long long)again, (long long)*n);
    return ids;
}

/* Concatenated bytes of ids; caller frees. */
static char *decode(const tok_vocab *v, const int32_t *ids, int64_t n, bool special, size_t *len) {
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) total += tok_token_bytes(v, ids[i], special, NULL, 0);
    char *s = malloc(total + 1);
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) o += tok_token_bytes(v, ids[i], special, s + o, total - o);
    s[o] = '\0';
    *len = o;
    return s;
}

static void print_escaped(const char *label, const char *s, size_t n) {
    fprintf(stderr, "  %s: \"", label);
    for (size_t i = 0; i < n && i < 300; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stderr);
        else if (c == '\t') fputs("\\t", stderr);
        else if (c < 0x20 || c == 0x7F) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fprintf(stderr, "%s\" (%zu bytes)\n", n > 300 ? "..." : "", n);
}

static void print_ids(const char *label, const int32_t *ids, int64_t n) {
    fprintf(stderr, "  %s (%lld):", label, (long long)n);
    for (int64_t i = 0; i < n && i < 80; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 80 ? " ..." : "");
}

static void print_mismatch(const tok_vocab *v, const char *what, const char *text, size_t len,
                           const int32_t *want, int64_t nw, const int32_t *got, int64_t ng) {
    fprintf(stderr, "FIRST MISMATCH in %s\n", what);
    print_escaped("text", text, len);
    print_ids("expected", want, nw);
    print_ids("got     ", got, ng);
    for (int64_t i = 0; i < nw && i < ng; i++) {
        if (want[i] != got[i]) {
            fprintf(stderr, "  first difference at %lld: expected %d '%s', got %d '%s'\n",
                    (long long)i, want[i], tok_piece(v, want[i]), got[i], tok_piece(v, got[i]));
            break;
        }
    }
}

static bool same_ids(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* ---------------------------------------------------------------- .inp/.out vectors */

typedef struct vec_case {
    const char *text;
    size_t len;
    int32_t *ids;
    int64_t n;
} vec_case;

/* Cases are separated by "\n__ggml_vocab_test__\n"; a trailing separator adds none. */
static size_t split_inp(char *buf, size_t len, vec_case *cases, size_t max) {
    static const char SEP[] = "\n__ggml_vocab_test__\n";
    const size_t seplen = sizeof SEP - 1;
    size_t n = 0, pos = 0;
    while (pos <= len && n < max) {
        char *m = memmem(buf + pos, len - pos, SEP, seplen);
        size_t end = m ? (size_t)(m - buf) : len;
        if (!m && end == pos) break; /* nothing after the last separator */
        cases[n].text = buf + pos;
        cases[n++].len = end - pos;
        if (!m) break;
        pos = end + seplen;
    }
    return n;
}

/* One line of ids per case. */
static bool parse_out(char *buf, vec_case *cases, size_t n) {
    char *line = buf;
    for (size_t i = 0; i < n; i++) {
        if (!line) return false;
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        cases[i].ids = calloc(strlen(line) / 2 + 2, sizeof(int32_t));
        cases[i].n = 0;
        for (char *p = line, *e; *p; p = e) {
            long val = strtol(p, &e, 10);
            if (e == p) break;
            cases[i].ids[cases[i].n++] = (int32_t)val;
        }
        line = nl ? nl + 1 : NULL;
    }
    return true;
}

static bool has_unk(const tok_vocab *v, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (tok_token_bytes(v, ids[i], false, NULL, 0) == 0) return true;
    }
    return false;
}

/* x with each U+2581 written as a space (gemma4 decodes it so, even where the
 * input had one); returns the new length. */
static size_t unescape_2581(const char *x, size_t len, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        bool esc = len - i >= 3 && memcmp(x + i, "\xE2\x96\x81", 3) == 0;
        out[k++] = esc ? ' ' : x[i];
        i += esc ? 3 : 1;
    }
    return k;
}

/* decode(encode(x)) == x for BPE (gemma4: with U+2581 as a space); SPM adds the
 * leading space (skipped when a character had to become the unknown token). */
static bool round_trips(const tok_vocab *v, const vec_case *c, const int32_t *ids, int64_t n) {
    size_t dl;
    char *d = decode(v, ids, n, true, &dl);
    bool spm = strcmp(tok_model_name(v), "llama") == 0;
    bool ok;
    if (spm) {
        ok = has_unk(v, ids, n) ||
             (c->len == 0 ? dl == 0
                          : (dl == c->len + 1 && d[0] == ' ' && !memcmp(d + 1, c->text, c->len)));
    } else if (strcmp(tok_model_name(v), "gemma4") == 0) {
        char *want = malloc(c->len + 1);
        size_t wl = unescape_2581(c->text, c->len, want);
        ok = dl == wl && !memcmp(d, want, dl);
        free(want);
    } else {
        ok = dl == c->len && !memcmp(d, c->text, dl);
    }
    free(d);
    return ok;
}

/* Runs one .inp/.out pair: by default as llama.cpp's test-tokenizer-0 (no BOS,
 * special text not parsed); with `special`, BOS added and special text parsed
 * (the round trip then leaves the BOS out). */
static void run_vectors_as(const char *gguf, const char *inp, const char *out, const char *label,
                           bool special) {
    tok_vocab *v = load_vocab(gguf);
    kvl_error err = {{0}};
    size_t ilen, olen;
    char *ibuf = kvl_read_file(inp, &ilen, &err), *obuf = kvl_read_file(out, &olen, &err);
    if (!v || !ibuf || !obuf) {
        fprintf(stderr, "%s: cannot read vectors (%s)\n", label, err.msg);
        failures++;
        goto done;
    }
    vec_case cases[512];
    size_t n = split_inp(ibuf, ilen, cases, 512);
    if (!parse_out(obuf, cases, n)) {
        fprintf(stderr, "%s: fewer .out lines than cases\n", label);
        failures++;
        goto done;
    }
    size_t pass = 0, rt = 0;
    bool shown = false;
    for (size_t i = 0; i < n; i++) {
        int64_t ng;
        int32_t *got = encode(v, cases[i].text, cases[i].len, special, special, &ng);
        if (same_ids(cases[i].ids, cases[i].n, got, ng)) {
            pass++;
        } else if (!shown) {
            print_mismatch(v, label, cases[i].text, cases[i].len, cases[i].ids, cases[i].n, got,
                           ng);
            shown = true;
        }
        const int skip = special && tok_add_bos(v) && ng > 0 && got[0] == tok_bos(v);
        rt += round_trips(v, &cases[i], got + skip, ng - skip);
        free(got);
        free(cases[i].ids);
    }
    printf("%-58s %3zu/%3zu passed, round trip %3zu/%3zu\n", label, pass, n, rt, n);
    CHECK(pass == n && n > 0, "%s: %zu of %zu cases differ", label, n - pass, n);
    CHECK(rt == n, "%s: %zu round trips differ", label, n - rt);
done:
    free(ibuf);
    free(obuf);
    tok_vocab_destroy(v);
}

static void run_vectors(const char *gguf, const char *inp, const char *out, const char *label) {
    run_vectors_as(gguf, inp, out, label, false);
}

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

static void test_vector_files(void) {
    DIR *d = opendir(TOKDIR);
    if (!d) {
        CHECK(0, "cannot list %s", TOKDIR);
        return;
    }
    char names[64][256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 64;) {
        size_t l = strlen(e->d_name);
        if (l > 9 && strcmp(e->d_name + l - 9, ".gguf.inp") == 0 && l < 200)
            snprintf(names[n++], sizeof names[0], "%.*s", (int)(l - 4), e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 0; i < n; i++) {
        char g[512], in[512], out[512];
        snprintf(g, sizeof g, TOKDIR "/%.200s", names[i]);
        snprintf(in, sizeof in, "%.400s.inp", g);
        snprintf(out, sizeof out, "%.400s.out", g);
        if (file_exists(g) && file_exists(out)) run_vectors(g, in, out, names[i]);
    }
    run_vectors(TOKDIR "/ggml-vocab-llama3.gguf",
                TOKDIR "/tests-without-gguf/ggml-vocab-llama-bpe.gguf.inp",
                TOKDIR "/tests-without-gguf/ggml-vocab-llama-bpe.gguf.out",
                "llama-bpe vectors on ggml-vocab-llama3.gguf");
    run_vectors(TOKDIR "/ggml-vocab-qwen3.gguf",
                TOKDIR "/tests-without-gguf/ggml-vocab-qwen2.gguf.inp",
                TOKDIR "/tests-without-gguf/ggml-vocab-qwen2.gguf.out",
                "qwen2 vectors on ggml-vocab-qwen3.gguf");
    run_vectors_as(TOKDIR "/ggml-vocab-gemma4.gguf", TOKDIR "/gemma4-special.inp",
                   TOKDIR "/gemma4-special.out", "gemma4 with BOS, special text parsed", true);
}

/* ---------------------------------------------------------------- golden tokenize.json */

static int64_t json_ids(const cJSON *arr, int32_t *out, int64_t max) {
    int64_t n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        if (n < max) out[n] = (int32_t)x->valuedouble;
        n++;
    }
    return n;
}

static void run_golden_case(const tok_vocab *v, const cJSON *c, const char *label, size_t *pass,
                            bool *shown) {
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
    const cJSON *ids_j = cJSON_GetObjectItem(c, "ids"), *pieces = cJSON_GetObjectItem(c, "pieces");
    bool special = cJSON_IsTrue(cJSON_GetObjectItem(c, "parse_special"));
    bool bos = cJSON_IsTrue(cJSON_GetObjectItem(c, "bos_added"));
    if (!text || !ids_j) {
        CHECK(0, "%s: malformed case", label);
        return;
    }
    int32_t want[4096];
    int64_t nw = json_ids(ids_j, want, 4096), ng;
    int32_t *got = encode(v, text, strlen(text), tok_add_bos(v), special, &ng);
    bool ok = same_ids(want, nw, got, ng) && bos == (tok_add_bos(v) && tok_bos(v) >= 0);
    for (int64_t i = 0; ok && pieces && i < ng; i++) {
        const char *p = cJSON_GetStringValue(cJSON_GetArrayItem(pieces, (int)i));
        ok = p && strcmp(p, tok_piece(v, got[i])) == 0;
    }
    if (ok) {
        (*pass)++;
    } else if (!*shown) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        char what[512];
        snprintf(what, sizeof what, "%s case '%s' (parse_special %d, bos_added %d)", label,
                 name ? name : "?", special, bos);
        print_mismatch(v, what, text, strlen(text), want, nw, got, ng);
        *shown = true;
    }
    free(got);
}

static cJSON *read_json(const char *path) {
    kvl_error err;
    size_t len;
    char *s = kvl_read_file(path, &len, &err);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

static void run_golden(const char *model_dir) {
    char path[600], label[300];
    snprintf(path, sizeof path, GOLDDIR "/%.200s/meta.json", model_dir);
    cJSON *meta = read_json(path);
    snprintf(path, sizeof path, GOLDDIR "/%.200s/tokenize.json", model_dir);
    cJSON *tj = read_json(path);
    const char *file = cJSON_GetStringValue(cJSON_GetObjectItem(meta, "file"));
    if (!meta || !tj || !file) {
        CHECK(0, "golden %s: cannot read meta.json/tokenize.json", model_dir);
        goto done;
    }
    snprintf(path, sizeof path, GOLDDIR "/models/%.200s", file);
    tok_vocab *v = load_vocab(path);
    if (!v) goto done;
    snprintf(label, sizeof label, "golden %.200s/tokenize.json", model_dir);
    size_t pass = 0, n = 0;
    bool shown = false;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(tj, "cases")) {
        run_golden_case(v, c, label, &pass, &shown);
        n++;
    }
    printf("%-58s %3zu/%3zu passed\n", label, pass, n);
    CHECK(pass == n && n > 0, "%s: %zu of %zu cases differ", label, n - pass, n);
    tok_vocab_destroy(v);
done:
    cJSON_Delete(meta);
    cJSON_Delete(tj);
}

static void test_golden(void) {
    DIR *d = opendir(GOLDDIR);
    if (!d) {
        CHECK(0, "cannot list %s", GOLDDIR);
        return;
    }
    char names[64][256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 64;) {
        char p[600];
        snprintf(p, sizeof p, GOLDDIR "/%.200s/tokenize.json", e->d_name);
        if (e->d_name[0] != '.' && file_exists(p))
            snprintf(names[n++], sizeof names[0], "%.200s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 0; i < n; i++) run_golden(names[i]);
}

/* ---------------------------------------------------------------- behaviour */

/* Id of the byte-level token standing for byte b (GPT-2 mapping). */
static int32_t gpt2_byte_token(const tok_vocab *v, unsigned b) {
    unsigned cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))) {
        unsigned n = 0;
        for (unsigned c = 0; c < b; c++)
            n += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
        cp = 256 + n;
    }
    char u[3];
    size_t l = cp < 0x80 ? 1 : 2;
    if (l == 1) u[0] = (char)cp;
    else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F));
    return tok_token_id(v, u, l);
}

/* Pushes ids through a stream; returns the concatenated output. */
static size_t stream_all(const tok_vocab *v, const int32_t *ids, int n, char *out, size_t *sizes) {
    tok_stream s;
    tok_stream_init(&s);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        sizes[i] = tok_stream_push(&s, v, ids[i], false, out + o, 64);
        o += sizes[i];
    }
    o += tok_stream_flush(&s, out + o, 64);
    return o;
}

static void test_stream(void) {
    tok_vocab *v = load_vocab(TOKDIR "/ggml-vocab-gpt-2.gguf");
    if (!v) return;
    /* U+1F600 split into four byte tokens: nothing until the last one. */
    const unsigned char emoji[4] = {0xF0, 0x9F, 0x98, 0x80};
    int32_t ids[8];
    size_t sizes[8];
    char out[512];
    for (int i = 0; i < 4; i++) ids[i] = gpt2_byte_token(v, emoji[i]);
    size_t n = stream_all(v, ids, 4, out, sizes);
    CHECK(sizes[0] == 0 && sizes[1] == 0 && sizes[2] == 0 && sizes[3] == 4,
          "held back %zu %zu %zu %zu", sizes[0], sizes[1], sizes[2], sizes[3]);
    CHECK(n == 4 && memcmp(out, emoji, 4) == 0, "emoji out %zu", n);
    /* Invalid: a lone 0xFF, then a lead byte followed by ASCII, then a dangling lead. */
    ids[0] = gpt2_byte_token(v, 0xFF);
    ids[1] = gpt2_byte_token(v, 0xE6);
    ids[2] = gpt2_byte_token(v, 'a');
    ids[3] = gpt2_byte_token(v, 0xE6);
    ids[4] = gpt2_byte_token(v, 0x97);
    n = stream_all(v, ids, 5, out, sizes);
    /* FF -> U+FFFD; E6 then 'a' -> U+FFFD 'a'; E6 97 held back, flushed as one U+FFFD */
    CHECK(n == 10 && memcmp(out,
                            "\xEF\xBF\xBD\xEF\xBF\xBD"
                            "a\xEF\xBF\xBD",
                            10) == 0,
          "invalid bytes gave %zu bytes", n);
    CHECK(sizes[3] == 0 && sizes[4] == 0, "dangling lead byte not held back");
    /* Real text through encode + stream equals the text. */
    const char *text = "Zoë 日本語 😀👍🏽 façade — “quoted”";
    int64_t ni;
    int32_t *all = encode(v, text, strlen(text), false, false, &ni);
    tok_stream s;
    tok_stream_init(&s);
    size_t o = 0;
    for (int64_t i = 0; i < ni; i++)
        o += tok_stream_push(&s, v, all[i], false, out + o, sizeof out - o);
    o += tok_stream_flush(&s, out + o, sizeof out - o);
    CHECK(o == strlen(text) && memcmp(out, text, o) == 0, "streamed text differs (%zu bytes)", o);
    free(all);
    tok_vocab_destroy(v);

    /* SPM byte tokens: 日 = E6 97 A5 as <0xE6><0x97><0xA5>. */
    v = load_vocab(TOKDIR "/ggml-vocab-llama-spm.gguf");
    if (!v) return;
    ids[0] = tok_token_id(v, "<0xE6>", 6);
    ids[1] = tok_token_id(v, "<0x97>", 6);
    ids[2] = tok_token_id(v, "<0xA5>", 6);
    n = stream_all(v, ids, 3, out, sizes);
    CHECK(sizes[0] == 0 && sizes[1] == 0 && n == 3 && memcmp(out, "日", 3) == 0, "spm bytes %zu",
          n);
    tok_vocab_destroy(v);
    printf("%-58s done\n", "streaming decoder");
}

/* Invalid UTF-8: SPM keeps the raw bytes as byte tokens; BPE reads each bad
 * byte as U+FFFD (llama.cpp's decoding), so it matches that text's encoding. */
static void test_invalid_utf8(void) {
    static const char bad[] =
        "ab\xff\xfe cd \xc3 \xe6\x97 x\x80y \xf4\x90\x80\x80 \xed\xa0\x80 end\xe2";
    static const char fixed[] =
        "ab\xef\xbf\xbd\xef\xbf\xbd cd \xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd"
        " x\xef\xbf\xbdy \xef\xbf\xbd \xed\xa0\x80 end\xef\xbf\xbd";
    const char *bpe[] = {"ggml-vocab-gpt-2.gguf",  "ggml-vocab-llama3.gguf",
                         "ggml-vocab-qwen3.gguf",  "ggml-vocab-deepseek-llm.gguf",
                         "ggml-vocab-falcon.gguf", "ggml-vocab-gemma4.gguf"};
    for (size_t k = 0; k < sizeof bpe / sizeof bpe[0]; k++) {
        char p[300];
        snprintf(p, sizeof p, TOKDIR "/%s", bpe[k]);
        tok_vocab *v = load_vocab(p);
        if (!v) continue;
        int64_t na, nb;
        int32_t *a = encode(v, bad, sizeof bad - 1, false, false, &na);
        int32_t *b = encode(v, fixed, sizeof fixed - 1, false, false, &nb);
        /* U+10FFFF+1 (f4 90 80 80) decodes to a codepoint llama.cpp cannot encode;
         * we write U+FFFD for it, which is what `fixed` holds. */
        CHECK(same_ids(a, na, b, nb), "%s: invalid UTF-8 not read as U+FFFD", bpe[k]);
        free(a);
        free(b);
        tok_vocab_destroy(v);
    }
    tok_vocab *v = load_vocab(TOKDIR "/ggml-vocab-llama-spm.gguf");
    if (!v) return;
    int64_t n;
    int32_t *ids = encode(v, bad, sizeof bad - 1, false, false, &n);
    size_t dl, k = 0;
    char *d = decode(v, ids, n, false, &dl);
    /* A bad lead byte swallows the next bytes into one symbol, which can split an
     * escaped space (U+2581) into byte tokens: undo the escape before comparing. */
    for (size_t i = 0; i < dl; k++) {
        bool esc = dl - i >= 3 && memcmp(d + i, "\xE2\x96\x81", 3) == 0;
        d[k] = esc ? ' ' : d[i];
        i += esc ? 3 : 1;
    }
    CHECK(k == sizeof bad && d[0] == ' ' && memcmp(d + 1, bad, sizeof bad - 1) == 0,
          "SPM did not keep invalid bytes");
    free(d);
    free(ids);
    tok_vocab_destroy(v);
    printf("%-58s done\n", "invalid UTF-8");
}

/* llama.cpp's reading of bytes as codepoints, written back as UTF-8: a bad
 * sequence is U+FFFD and consumes one byte; overlongs/surrogates pass. */
static size_t llama_sanitize(const unsigned char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t need = s[i] < 0x80             ? 1
                      : (s[i] & 0xE0) == 0xC0 ? 2
                      : (s[i] & 0xF0) == 0xE0 ? 3
                      : (s[i] & 0xF8) == 0xF0 ? 4
                                              : 0;
        bool ok = need > 0 && i + need <= n;
        for (size_t k = 1; ok && k < need; k++) ok = (s[i + k] & 0xC0) == 0x80;
        uint32_t cp = 0;
        if (ok && need == 4)
            cp = ((s[i] & 7u) << 18) | ((s[i + 1] & 63u) << 12) | ((s[i + 2] & 63u) << 6) |
                 (s[i + 3] & 63u);
        if (!ok || cp > 0x10FFFF) { /* the latter: llama.cpp cannot write it; we use U+FFFD */
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += ok ? need : 1;
            continue;
        }
        memcpy(out + o, s + i, need);
        o += need;
        i += need;
    }
    return o;
}

/* Random bytes (mostly text-like, some invalid): encoding never fails and BPE
 * decodes back to the llama.cpp reading of the input. */
static void test_random_bytes(void) {
    const char *names[] = {"ggml-vocab-gpt-2.gguf",        "ggml-vocab-llama3.gguf",
                           "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-llama-spm.gguf",
                           "ggml-vocab-phi-3.gguf",        "ggml-vocab-gemma4.gguf"};
    static const char *const bits[] = {" ",
                                       "  ",
                                       "\n",
                                       "\r\n",
                                       "\t",
                                       "a",
                                       "Hello",
                                       "'s",
                                       "123",
                                       "!?",
                                       "\xC3\xA9",
                                       "\xE6\x97\xA5",
                                       "\xF0\x9F\x98\x80",
                                       "\xE2\x80\x8D",
                                       "\xFF",
                                       "\xC3",
                                       "\xED\xA0\x80",
                                       "\xF5\x80\x80\x80",
                                       "<s>",
                                       "</s>",
                                       "<|endoftext|>",
                                       "\0"};
    unsigned seed = 12345;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char p[300];
        snprintf(p, sizeof p, TOKDIR "/%s", names[k]);
        tok_vocab *v = load_vocab(p);
        if (!v) continue;
        bool spm = strcmp(tok_model_name(v), "llama") == 0;
        int bad = 0;
        for (int c = 0; c < 300; c++) {
            char text[512], want[2048];
            size_t n = 0;
            for (int parts = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 24; parts > 0;
                 parts--) {
                const char *b = bits[((seed = seed * 1103515245u + 12345u) >> 16) %
                                     (sizeof bits / sizeof bits[0])];
                size_t bl = b[0] ? strlen(b) : 1;
                memcpy(text + n, b, bl);
                n += bl;
            }
            bool special = c & 1;
            int64_t ni;
            int32_t *ids = encode(v, text, n, false, special, &ni);
            if (!spm) { /* SPM output is checked by the vectors; here it must not crash */
                size_t dl, wl = llama_sanitize((const unsigned char *)text, n, want);
                char *d = decode(v, ids, ni, true, &dl);
                bad += !(dl == wl && memcmp(d, want, dl) == 0);
                free(d);
            }
            free(ids);
        }
        CHECK(bad == 0, "%s: %d random strings did not round trip", names[k], bad);
        tok_vocab_destroy(v);
    }
    printf("%-58s done\n", "random bytes");
}

static void expect_ids(const tok_vocab *v, const char *text, bool bos, bool special,
                       const int32_t *want, int64_t nw, const char *what) {
    int64_t n;
    int32_t *got = encode(v, text, strlen(text), bos, special, &n);
    if (!same_ids(want, nw, got, n)) {
        print_mismatch(v, what, text, strlen(text), want, nw, got, n);
        CHECK(0, "%s", what);
    }
    free(got);
}

static void test_specials(void) {
    tok_vocab *v = load_vocab(TOKDIR "/ggml-vocab-qwen3.gguf");
    if (v) {
        const char *chat = "<|im_start|>user\nhi<|im_end|>";
        int32_t im_start = tok_token_id(v, "<|im_start|>", 12),
                im_end = tok_token_id(v, "<|im_end|>", 10);
        int64_t n;
        int32_t *ids = encode(v, chat, strlen(chat), false, true, &n);
        CHECK(n >= 3 && ids[0] == im_start && ids[n - 1] == im_end,
              "qwen3 chat markers not parsed");
        free(ids);
        ids = encode(v, chat, strlen(chat), false, false, &n);
        CHECK(n > 5 && ids[0] != im_start, "qwen3 parsed control text without parse_special");
        free(ids);
        CHECK(tok_is_eog(v, im_end) && tok_is_eog(v, tok_token_id(v, "<|endoftext|>", 13)),
              "qwen3 EOG tokens");
        CHECK(!tok_is_eog(v, im_start) && tok_is_control(v, im_start), "qwen3 im_start");
        CHECK(tok_eos(v) == 151645 && !tok_add_bos(v), "qwen3 eos %d", tok_eos(v));
        CHECK(strcmp(tok_pre_name(v), "qwen2") == 0 && strcmp(tok_model_name(v), "gpt2") == 0,
              "names");
        char buf[32];
        CHECK(tok_token_bytes(v, im_end, false, buf, sizeof buf) == 0 &&
                  tok_token_bytes(v, im_end, true, buf, sizeof buf) == 10 &&
                  !memcmp(buf, "<|im_end|>", 10),
              "control token bytes");
        tok_vocab_destroy(v);
    }
    v = load_vocab(TOKDIR "/ggml-vocab-llama3.gguf");
    if (v) {
        CHECK(tok_add_bos(v) && tok_bos(v) == 128000 && tok_eos(v) == 128001, "llama3 bos/eos");
        int32_t eot = tok_token_id(v, "<|eot_id|>", 10);
        CHECK(eot >= 0 && tok_is_eog(v, eot) && tok_is_eog(v, 128001) && !tok_is_eog(v, 128000),
              "llama3 EOG");
        const int32_t want[] = {128000, 128006, 882, 128007, 271, 13347, 128009};
        expect_ids(v, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", true, true, want,
                   7, "llama3 chat with BOS");
        tok_vocab_destroy(v);
    }
    v = load_vocab(TOKDIR "/ggml-vocab-llama-spm.gguf");
    if (v) {
        /* "<s>" is split off (with the leading space rule restarting after it). */
        int32_t want[16];
        int64_t nw;
        int32_t *plain = encode(v, "Hi", 2, false, false, &nw);
        want[0] = 1;
        want[1] = 1;
        memcpy(want + 2, plain, (size_t)nw * sizeof *want);
        expect_ids(v, "<s>Hi", true, true, want, nw + 2, "spm <s> parsed");
        free(plain);
        CHECK(tok_is_eog(v, 2) && tok_add_bos(v), "spm eos/add_bos");
        tok_vocab_destroy(v);
    }
    v = load_vocab(TOKDIR "/ggml-vocab-phi-3.gguf");
    if (v) {
        /* Phi-3 (by general.name): whitespace after <|user|> is stripped (RSTRIP),
         * and the text after it gets SPM's leading space again. */
        int32_t want[16], user = tok_token_id(v, "<|user|>", 8);
        int64_t nw;
        int32_t *plain = encode(v, "Hi", 2, false, false, &nw);
        want[0] = user;
        memcpy(want + 1, plain, (size_t)nw * sizeof *want);
        expect_ids(v, "<|user|>\n  Hi", false, true, want, nw + 1, "phi-3 rstrip");
        CHECK(user >= 0 && tok_is_eog(v, tok_token_id(v, "<|end|>", 7)), "phi-3 <|end|> is EOG");
        free(plain);
        tok_vocab_destroy(v);
    }
    v = load_vocab(TOKDIR "/ggml-vocab-gemma4.gguf");
    if (v) {
        int32_t eos = tok_token_id(v, "<eos>", 5), turn = tok_token_id(v, "<|turn>", 7),
                turn_end = tok_token_id(v, "<turn|>", 7),
                tool_resp = tok_token_id(v, "<|tool_response>", 16),
                s_end = tok_token_id(v, "</s>", 4), quote = tok_token_id(v, "<|\"|>", 5);
        CHECK(tok_is_eog(v, eos) && tok_is_eog(v, turn_end) && tok_is_eog(v, tool_resp),
              "gemma4 EOG tokens");
        /* </s> is plain text in a gemma4 vocab (llama.cpp drops it from EOG) */
        CHECK(s_end >= 0 && !tok_is_eog(v, s_end) && !tok_is_control(v, s_end) &&
                  !tok_is_eog(v, turn) && tok_is_control(v, turn),
              "gemma4 </s> and <|turn>");
        CHECK(tok_add_bos(v) && tok_bos(v) == 2 && tok_eos(v) == 1 &&
                  strcmp(tok_model_name(v), "gemma4") == 0 &&
                  strcmp(tok_pre_name(v), "gemma4") == 0,
              "gemma4 bos/eos/names");
        /* user-defined tokens are always text; control ones only when asked */
        char buf[32];
        CHECK(tok_token_bytes(v, quote, false, buf, sizeof buf) == 5 && !memcmp(buf, "<|\"|>", 5),
              "gemma4 <|\"|> is text");
        CHECK(tok_token_bytes(v, turn_end, false, buf, sizeof buf) == 0 &&
                  tok_token_bytes(v, tool_resp, false, buf, sizeof buf) == 0 &&
                  tok_token_bytes(v, tool_resp, true, buf, sizeof buf) == 16,
              "gemma4 control token bytes");
        int32_t byte_a = tok_token_id(v, "<0x41>", 6), space = tok_token_id(v, "\xE2\x96\x81", 3);
        CHECK(tok_token_bytes(v, byte_a, false, buf, sizeof buf) == 1 && buf[0] == 'A' &&
                  tok_token_bytes(v, space, false, buf, sizeof buf) == 1 && buf[0] == ' ',
              "gemma4 byte and space tokens");
        tok_vocab_destroy(v);
    }
    printf("%-58s done\n", "special tokens");
}

/* A vocab-only GGUF with the given tokenizer model / pre. */
static gguf_file *make_vocab(const char *model, const char *pre, const char *path) {
    gguf_writer *w = gguf_writer_create();
    const char *toks[] = {"a", "b", "ab", "<s>"};
    const char *merges[] = {"a b"};
    int32_t types[] = {1, 1, 1, 3};
    gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    if (pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 4);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 3);
    kvl_error err;
    bool ok = gguf_writer_write(w, path, &err);
    gguf_writer_destroy(w);
    return ok ? gguf_open(path, &err) : NULL;
}

static void expect_load_error(const char *model, const char *pre, const char *needle) {
    char path[] = "/tmp/kvllm_tok_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    gguf_file *f = make_vocab(model, pre, path);
    kvl_error err = {{0}};
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    CHECK(f && !v && strstr(err.msg, needle), "model %s pre %s: got '%s'", model, pre ? pre : "-",
          err.msg);
    tok_vocab_destroy(v);
    gguf_close(f);
    unlink(path);
}

static void test_load_errors(void) {
    expect_load_error("bert", "default", "unsupported tokenizer model 'bert'");
    expect_load_error("gpt2", "no-such-pre", "unknown pre-tokenizer type 'no-such-pre'");
    /* A tiny hand-made BPE vocab loads and merges. */
    char path[] = "/tmp/kvllm_tok_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    gguf_file *f = make_vocab("gpt2", "gpt-2", path);
    kvl_error err = {{0}};
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    CHECK(v, "tiny vocab: %s", err.msg);
    if (v) {
        const int32_t want[] = {3, 3, 2, 0};
        expect_ids(v, "<s>aba", true, true, want, 4, "tiny vocab: BOS, <s> parsed, merge");
        expect_ids(v, "aba", false, false, want + 2, 2, "tiny vocab merge");
        CHECK(tok_n_vocab(v) == 4 && tok_bos(v) == 3, "tiny vocab ids");
    }
    tok_vocab_destroy(v);
    gguf_close(f);
    unlink(path);
    printf("%-58s done\n", "load errors / hand-made vocab");
}

/* A tiny gemma4 vocab-only GGUF, whole or with one thing wrong. */
enum g4_flaw {
    G4_NONE,
    G4_ADD_BOS_FALSE,
    G4_ODD_MERGES,
    G4_NO_MERGES,
    G4_INT_MERGES,
    G4_NO_BOS_ID,
    G4_BAD_BOS_ID,
    G4_NO_TOKENS,
    G4_SHORT_TYPES
};

static gguf_file *make_gemma4(enum g4_flaw flaw, const char *path) {
    const char *toks[] = {"<eos>",
                          "<bos>",
                          "a",
                          "b",
                          "ab",
                          "\xE2\x96\x81",
                          "\xE2\x96\x81"
                          "ab",
                          "\n\n",
                          "<0x63>"};
    const int32_t types[] = {3, 3, 1, 1, 1, 1, 1, 1, 6};
    const char *merges[] = {"a b", "\xE2\x96\x81 ab"};
    const char *odd[] = {"ab", "", "a b", "\xE2\x96\x81 ab", "zz yy"};
    const int32_t nums[] = {1, 2};
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gemma4");
    if (flaw != G4_NO_TOKENS) gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 9);
    if (flaw == G4_ODD_MERGES) gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", odd, 5);
    else if (flaw == G4_INT_MERGES)
        gguf_writer_set_arr(w, "tokenizer.ggml.merges", GGUF_VT_INT32, nums, 2);
    else if (flaw != G4_NO_MERGES) gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 2);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, types,
                        flaw == G4_SHORT_TYPES ? 2 : 9);
    if (flaw != G4_NO_BOS_ID)
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", flaw == G4_BAD_BOS_ID ? 99 : 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 0);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", flaw != G4_ADD_BOS_FALSE);
    kvl_error err;
    bool ok = gguf_writer_write(w, path, &err);
    gguf_writer_destroy(w);
    return ok ? gguf_open(path, &err) : NULL;
}

/* Loads a tiny gemma4 vocab with the given flaw: an error containing `needle`
 * is expected (needle NULL: it must load and tokenize). */
static void check_gemma4_load(enum g4_flaw flaw, const char *needle) {
    char path[] = "/tmp/kvllm_tok_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    gguf_file *f = make_gemma4(flaw, path);
    kvl_error err = {{0}};
    tok_vocab *v = f ? tok_vocab_create(f, &err) : NULL;
    if (needle) {
        CHECK(f && !v && strstr(err.msg, needle), "gemma4 flaw %d: got '%s'", (int)flaw, err.msg);
    } else if (v) {
        /* merges (a b, then U+2581 ab), a newline run taken whole, 'c' as <0x63>;
         * BOS although the file may say not to add it */
        const int32_t want[] = {1, 4, 6, 7, 8};
        expect_ids(v, "ab ab\n\nc", tok_add_bos(v), false, want, 5, "tiny gemma4 vocab");
        CHECK(tok_add_bos(v), "gemma4 flaw %d: BOS not forced", (int)flaw);
    } else {
        CHECK(0, "gemma4 flaw %d: %s", (int)flaw, err.msg);
    }
    tok_vocab_destroy(v);
    gguf_close(f);
    unlink(path);
}

static void test_gemma4_load(void) {
    check_gemma4_load(G4_NONE, NULL);
    check_gemma4_load(G4_ADD_BOS_FALSE, NULL);
    check_gemma4_load(G4_ODD_MERGES, NULL); /* lines without a space are ignored, as in llama.cpp */
    check_gemma4_load(G4_NO_MERGES, "'tokenizer.ggml.merges'");
    check_gemma4_load(G4_INT_MERGES, "'tokenizer.ggml.merges'");
    check_gemma4_load(G4_NO_BOS_ID, "tokenizer.ggml.bos_token_id");
    check_gemma4_load(G4_BAD_BOS_ID, "tokenizer.ggml.bos_token_id");
    check_gemma4_load(G4_NO_TOKENS, "'tokenizer.ggml.tokens'");
    check_gemma4_load(G4_SHORT_TYPES, "'tokenizer.ggml.token_type' has 2 entries for 9 tokens");
    printf("%-58s done\n", "gemma4 load errors / hand-made vocab");
}

/* Encoding throughput on the Llama 3 vocab (the largest merge table). */
static void test_throughput(void) {
    kvl_error err;
    size_t len;
    char *inp =
        kvl_read_file(TOKDIR "/tests-without-gguf/ggml-vocab-llama-bpe.gguf.inp", &len, &err);
    double t0 = kvl_time_s();
    tok_vocab *v = load_vocab(TOKDIR "/ggml-vocab-llama3.gguf");
    double t1 = kvl_time_s();
    if (!v || !inp) {
        free(inp);
        tok_vocab_destroy(v);
        return;
    }
    const int reps = 200;
    size_t big_len = len * reps;
    char *big = malloc(big_len);
    for (int i = 0; i < reps; i++) memcpy(big + (size_t)i * len, inp, len);
    double t2 = kvl_time_s();
    int64_t n1 = tok_encode(v, inp, len, false, false, NULL, 0, &err);
    double t3 = kvl_time_s();
    int64_t n2 = tok_encode(v, big, big_len, false, true, NULL, 0, &err);
    double t4 = kvl_time_s();
    printf("throughput (llama3): load %.3f s; test file %zu B -> %lld tokens in %.4f s; "
           "%zu B -> %lld tokens in %.3f s (%.1f MB/s)\n",
           t1 - t0, len, (long long)n1, t3 - t2, big_len, (long long)n2, t4 - t3,
           (double)big_len / 1e6 / (t4 - t3));
    /* Speed is measured in bench/, not here: the time bounds below only catch a
     * hang or a quadratic blow-up (minutes on 256 KiB), never a slow machine. */
    CHECK(n1 > 0 && t3 - t2 < 30.0, "test file took %.3f s", t3 - t2);
    /* Long runs of one class stay linear (no regex blow-up): 256 KiB each. */
    const char fill[] = {' ', 'a', '7', '!', '\n'};
    for (size_t k = 0; k < sizeof fill; k++) {
        memset(big, fill[k], 1u << 18);
        double t5 = kvl_time_s();
        int64_t nk = tok_encode(v, big, 1u << 18, false, false, NULL, 0, &err);
        double dt = kvl_time_s() - t5;
        CHECK(nk > 0 && dt < 30.0, "run of '%c': %lld tokens in %.3f s", fill[k], (long long)nk,
              dt);
    }
    free(big);
    free(inp);
    tok_vocab_destroy(v);
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0; /* skip timing (valgrind) */
    test_vector_files();
    test_golden();
    test_stream();
    test_invalid_utf8();
    test_random_bytes();
    test_specials();
    test_load_errors();
    test_gemma4_load();
    if (!quick) test_throughput();
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
