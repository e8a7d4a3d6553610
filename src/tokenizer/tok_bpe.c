/* BPE encoding, as llama.cpp's llm_tokenizer_bpe: pre-tokenize into words,
 * split each word into symbols, then repeatedly merge the adjacent pair with
 * the lowest merge rank (leftmost on ties). Byte-level vocabs ("gpt2") write
 * each byte as a GPT-2 character and start from one symbol per byte; gemma4
 * vocabs keep the UTF-8 (spaces as U+2581) and start from one symbol per
 * character. Pieces are tracked by interned string id so that a pair's rank is
 * one integer-keyed lookup. */
#include "tok_internal.h"
#include "tok_heap.h"
#include "tok_unicode.h"

typedef struct bpe_sym {
    int32_t prev, next;
    size_t off, n; /* bytes of the mapped word; n == 0 once merged away */
    int32_t sid;   /* interned id of the text, -1 if not interned (cannot merge) */
} bpe_sym;

/* Scratch reused across the words of one call. */
typedef struct bpe_ctx {
    const tok_vocab *v;
    char *word; /* mapped text of the current word */
    size_t word_cap;
    bpe_sym *sym;
    size_t sym_cap;
    tok_heap heap;
    bool ok;
} bpe_ctx;

static bool reserve(bpe_ctx *c, size_t n_bytes) {
    if (n_bytes > c->word_cap) {
        free(c->word);
        free(c->sym);
        c->word = malloc(n_bytes * 2); /* each byte maps to at most 2 bytes */
        c->sym = malloc(n_bytes * sizeof *c->sym);
        c->word_cap = c->sym_cap = n_bytes;
        if (!c->word || !c->sym) {
            c->word_cap = c->sym_cap = 0;
            return false;
        }
    }
    return true;
}

static void add_bigram(bpe_ctx *c, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const bpe_sym *l = &c->sym[left], *r = &c->sym[right];
    if (l->sid < 0 || r->sid < 0) return;
    int32_t rank = tok_pairmap_get(&c->v->merges, l->sid, r->sid);
    if (rank < 0) return;
    tok_bigram b = {-(float)rank, left, right, l->n + r->n}; /* lowest rank first */
    c->ok &= tok_heap_push(&c->heap, b);
}

static void merge_all(bpe_ctx *c) {
    while (c->heap.n > 0 && c->ok) {
        tok_bigram b = tok_heap_pop(&c->heap);
        bpe_sym *l = &c->sym[b.left], *r = &c->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = b.left;
        l->sid = tok_str_id(c->v, c->word + l->off, l->n);
        add_bigram(c, l->prev, b.left);
        add_bigram(c, b.left, l->next);
    }
}

/* A final piece: its token, else one token per byte: for gemma4 its <0xNN>
 * token, for byte-level BPE the byte's one-character token. Bytes without one
 * are dropped, as llama.cpp drops them. */
static bool emit_piece(const bpe_ctx *c, const bpe_sym *s, tok_i32vec *out) {
    const tok_vocab *v = c->v;
    if (s->sid >= 0 && s->sid < v->n_tokens) return tok_i32vec_push(out, s->sid);
    for (size_t j = 0; j < s->n; j++) {
        const char *b = c->word + s->off + j;
        int32_t id = v->spm_pieces ? v->hex_tok[(unsigned char)*b] : tok_text_to_token(v, b, 1);
        if (id >= 0 && !tok_i32vec_push(out, id)) return false;
    }
    return true;
}

/* Byte-level BPE: one symbol per byte, written as its GPT-2 character. */
static size_t map_bytes(bpe_ctx *c, const unsigned char *raw, size_t n, size_t *len) {
    const tok_vocab *v = c->v;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(c->word + *len, v->gpt2_chr[raw[i]], v->gpt2_len[raw[i]]);
        c->sym[i] = (bpe_sym){(int32_t)i - 1, i + 1 == n ? -1 : (int32_t)i + 1, *len,
                              v->gpt2_len[raw[i]], -1};
        *len += v->gpt2_len[raw[i]];
    }
    return n;
}

/* gemma4: one symbol per UTF-8 character of the text as it is. */
static size_t split_chars(bpe_ctx *c, const unsigned char *raw, size_t n, size_t *len) {
    memcpy(c->word, raw, n);
    *len = n;
    size_t k = 0;
    for (size_t off = 0; off < n; k++) {
        size_t cl = tok_utf8_len(raw[off]);
        if (cl > n - off) cl = n - off;
        c->sym[k] = (bpe_sym){(int32_t)k - 1, off + cl == n ? -1 : (int32_t)k + 1, off, cl, -1};
        off += cl;
    }
    return k;
}

static bool only_newlines(const unsigned char *raw, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (raw[i] != '\n') return false;
    return true;
}

/* Encodes one word given as its raw bytes. */
static bool encode_word(bpe_ctx *c, const unsigned char *raw, size_t n, tok_i32vec *out) {
    const tok_vocab *v = c->v;
    if (n == 0) return true;
    if (!reserve(c, n)) return false;
    size_t len;
    const size_t n_sym = v->spm_pieces ? split_chars(c, raw, n, &len) : map_bytes(c, raw, n, &len);
    /* A word that is a token is taken whole: any word where the merges are
     * ignored, a run of newlines for gemma4 (whose merges need not build it). */
    if (v->ignore_merges || (v->newline_words && only_newlines(raw, n))) {
        int32_t id = tok_text_to_token(v, c->word, len);
        if (id >= 0) return tok_i32vec_push(out, id);
    }
    for (size_t i = 0; i < n_sym; i++)
        c->sym[i].sid = tok_str_id(v, c->word + c->sym[i].off, c->sym[i].n);
    c->heap.n = 0;
    for (size_t i = 1; i < n_sym; i++) add_bigram(c, (int32_t)i - 1, (int32_t)i);
    merge_all(c);
    for (int32_t i = 0; i != -1 && c->ok; i = c->sym[i].next)
        c->ok = emit_piece(c, &c->sym[i], out);
    return c->ok;
}

/* Text -> codepoints with llama.cpp's handling of invalid UTF-8. */
static uint32_t *decode_cpts(const char *text, size_t len, size_t *n) {
    uint32_t *cpts = malloc((len + 1) * sizeof *cpts);
    if (!cpts) return NULL;
    size_t k = 0;
    for (size_t off = 0; off < len;) cpts[k++] = tok_utf8_next(text, len, &off);
    *n = k;
    return cpts;
}

bool tok_bpe_encode(const tok_vocab *v, const char *text, size_t len, tok_i32vec *out,
                    kvl_error *err) {
    size_t n = 0;
    uint32_t *cpts = decode_cpts(text, len, &n);
    tok_szvec words = {0};
    unsigned char *raw = malloc(len * 4 + 4); /* a word re-encoded from its codepoints */
    bpe_ctx c = {v, NULL, 0, NULL, 0, {0}, true};
    bool ok = cpts && raw;
    if (!ok) kvl_fail(err, "tokenizer: out of memory");
    for (size_t i = 0; ok && v->spm_pieces && i < n; i++) /* gemma4 writes spaces as U+2581 */
        if (cpts[i] == ' ') cpts[i] = 0x2581;
    ok = ok && tok_pretok_split(v->pretok, cpts, n, &words, err);
    for (size_t w = 0, start = 0; ok && w < words.n; start += words.v[w++]) {
        size_t rn = 0;
        for (size_t i = start; i < start + words.v[w]; i++)
            rn += tok_utf8_put(cpts[i], (char *)raw + rn);
        ok = encode_word(&c, raw, rn, out) || kvl_fail(err, "tokenizer: out of memory");
    }
    free(cpts);
    free(raw);
    free(words.v);
    free(c.word);
    free(c.sym);
    free(c.heap.v);
    return ok;
}
