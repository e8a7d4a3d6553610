#define _GNU_SOURCE /* memmem */
/* libFuzzer target for the tokenizer: arbitrary bytes encoded with each vocab
 * type (SentencePiece with byte fallback; byte-level BPE with the GPT-2, Llama
 * 3 and Qwen pre-tokenizers; Gemma 4's BPE over lines with U+2581 spaces and
 * byte fallback), then decoded, token by token and through the streaming
 * detokenizer. Input: byte 0 picks the vocab (bits 0-1, or Gemma 4's when bit
 * 4 is set), special-token parsing (bit 2) and a guarded range over the
 * middle third (bit 3, tok_encode_guarded); the rest is the text.
 *
 * Checked beyond "no crash, no sanitizer report": every id is in the vocab;
 * the stream's output is valid UTF-8; and without special tokens the round
 * trip gives the text back: for BPE with each invalid UTF-8 byte as U+FFFD
 * (llama.cpp's unicode_cpts_from_utf8 rule; Gemma 4's then with each U+2581
 * read back as a space), for SPM exactly for valid UTF-8, after the one
 * leading space it adds (byte fallback keeps every byte). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

#ifndef KVLLM_SRC
#define KVLLM_SRC "."
#endif

#define N_VOCABS 5
static const char *const VOCABS[N_VOCABS] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf",
                                             "ggml-vocab-llama3.gguf", "ggml-vocab-qwen3.gguf",
                                             "ggml-vocab-gemma4.gguf"};
static tok_vocab *vocab[N_VOCABS];
static gguf_file *files[N_VOCABS]; /* open while the vocabularies live (they may point into them) */

static void load(void) {
    for (int i = 0; i < N_VOCABS; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/data/tokenizer/%s", KVLLM_SRC, VOCABS[i]);
        kvl_error err = {{0}};
        gguf_file *f = files[i] = gguf_open(path, &err);
        vocab[i] = f ? tok_vocab_create(f, &err) : NULL;
        if (!vocab[i]) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err.msg);
            abort();
        }
    }
}

/* llama.cpp's rule: a lead byte with all its continuation bytes is one code
 * point (overlong forms and surrogates included, then spelled the shortest
 * way; past U+10FFFF it is U+FFFD), any other byte becomes U+FFFD. */
static size_t replace_invalid(const unsigned char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned b = s[i];
        size_t need = b < 0x80             ? 1
                      : (b & 0xE0) == 0xC0 ? 2
                      : (b & 0xF0) == 0xE0 ? 3
                      : (b & 0xF8) == 0xF0 ? 4
                                           : 0;
        bool ok = need > 0 && i + need <= n;
        for (size_t k = 1; ok && k < need; k++) ok = (s[i + k] & 0xC0) == 0x80;
        if (ok) {
            static const unsigned lead_bits[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
            unsigned cp = b & lead_bits[need];
            for (size_t k = 1; k < need; k++) cp = cp << 6 | (s[i + k] & 0x3F);
            if (cp > 0x10FFFF) cp = 0xFFFD; /* past Unicode: one U+FFFD for the sequence */
            if (cp < 0x80) out[o++] = (char)cp;
            else if (cp < 0x800)
                out[o++] = (char)(0xC0 | cp >> 6), out[o++] = (char)(0x80 | (cp & 0x3F));
            else if (cp < 0x10000)
                out[o++] = (char)(0xE0 | cp >> 12), out[o++] = (char)(0x80 | (cp >> 6 & 0x3F)),
                out[o++] = (char)(0x80 | (cp & 0x3F));
            else
                out[o++] = (char)(0xF0 | cp >> 18), out[o++] = (char)(0x80 | (cp >> 12 & 0x3F)),
                out[o++] = (char)(0x80 | (cp >> 6 & 0x3F)), out[o++] = (char)(0x80 | (cp & 0x3F));
            i += need;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    return o;
}

/* s with each U+2581 written as a space, in place (Gemma 4 decodes it so);
 * returns the new length. */
static size_t unescape_2581(char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const bool esc = n - i >= 3 && memcmp(s + i, "\xE2\x96\x81", 3) == 0;
        s[k++] = esc ? ' ' : s[i];
        i += esc ? 3 : 1;
    }
    return k;
}

static bool utf8_ok(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned b = s[i];
        size_t need = b < 0x80             ? 1
                      : (b & 0xE0) == 0xC0 ? 2
                      : (b & 0xF0) == 0xE0 ? 3
                      : (b & 0xF8) == 0xF0 ? 4
                                           : 0;
        if (!need || i + need > n) return false;
        for (size_t k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += need;
    }
    return true;
}

/* Loading happens once, before the first input and outside its time limit. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    load();
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    const int which = data[0] & 16 ? 4 : data[0] & 3;
    const bool special = data[0] & 4, guarded = data[0] & 8;
    const tok_vocab *v = vocab[which];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;

    int64_t cap = (int64_t)len * 4 + 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    kvl_error err = {{0}};
    tok_span mid = {len / 3, len / 3};
    int64_t n = guarded ? tok_encode_guarded(v, text, len, false, &mid, 1, ids, cap, &err)
                        : tok_encode(v, text, len, false, special, ids, cap, &err);
    if (n < 0 || n > cap) {
        fprintf(stderr, "tok_encode: %lld ids (cap %lld): %s\n", (long long)n, (long long)cap,
                err.msg);
        abort();
    }
    const int32_t n_vocab = tok_n_vocab(v);
    size_t dec_cap = 64, dec_len = 0;
    char *dec = malloc(dec_cap);
    char piece[64 * 3 + 16];
    size_t st_len = 0;
    char *st_out = malloc((size_t)n * (3 * 64 + 12) + 64);
    tok_stream st;
    tok_stream_init(&st);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) abort();
        size_t b = tok_token_bytes(v, ids[i], true, NULL, 0);
        if (dec_len + b > dec_cap) {
            while (dec_len + b > dec_cap) dec_cap *= 2;
            dec = realloc(dec, dec_cap);
        }
        tok_token_bytes(v, ids[i], true, dec + dec_len, b);
        dec_len += b;
        if (b <= 64) st_len += tok_stream_push(&st, v, ids[i], true, st_out + st_len, sizeof piece);
    }
    st_len += tok_stream_flush(&st, st_out + st_len, 16);
    if (!utf8_ok((const unsigned char *)st_out, st_len)) abort();

    if (!special && !guarded) {
        char *want = malloc(len * 3 + 4);
        size_t want_len;
        bool spm = strcmp(tok_model_name(v), "llama") == 0;
        bool check = true;
        if (spm) {
            /* U+2581 in the text reads back as a space; a space after an
             * invalid lead byte is spelled as U+2581's bytes (the lead claims
             * them, as in llama.cpp): round trips hold for valid UTF-8 only. */
            check = len == 0 || (memmem(text, len, "\xE2\x96\x81", 3) == NULL && text[0] != ' ' &&
                                 utf8_ok((const unsigned char *)text, len));
            want[0] = ' ';
            memcpy(want + 1, text, len);
            want_len = len ? len + 1 : 0;
        } else {
            want_len = replace_invalid((const unsigned char *)text, len, want);
            if (strcmp(tok_model_name(v), "gemma4") == 0) want_len = unescape_2581(want, want_len);
        }
        if (check && (want_len != dec_len || memcmp(want, dec, dec_len) != 0)) {
            fprintf(stderr, "round trip differs (%s): %zu bytes in, %zu expected, %zu decoded\n",
                    VOCABS[which], len, want_len, dec_len);
            abort();
        }
        free(want);
    }
    free(st_out);
    free(dec);
    free(ids);
    return 0;
}
