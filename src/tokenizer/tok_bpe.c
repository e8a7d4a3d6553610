/* Byte-level BPE encoding ("gpt2" vocabs), as llama.cpp's llm_tokenizer_bpe:
 * pre-tokenize into words, write each word's bytes as GPT-2 characters, then
 * repeatedly merge the adjacent pair with the lowest merge rank (leftmost on
 * ties). Pieces are tracked by interned string id so that a pair's rank is one
 * integer-keyed lookup. */
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

/* A final piece: its token, else each of its bytes that happens to be a
 * one-byte token (others are dropped, as llama.cpp drops them). */
static bool emit_piece(const bpe_ctx *c, const bpe_sym *s, tok_i32vec *out) {
    if (s->sid >= 0 && s->sid < c->v->n_tokens) return tok_i32vec_push(out, s->sid);
    for (size_t j = 0; j < s->n; j++) {
        int32_t id = tok_text_to_token(c->v, c->word + s->off + j, 1);
        if (id >= 0 && !tok_i32vec_push(out, id)) return false;
    }
    return true;
}

/* Encodes one word given as its raw bytes. */
static bool encode_word(bpe_ctx *c, const unsigned char *raw, size_t n, tok_i32vec *out) {
    const tok_vocab *v = c->v;
    if (n == 0) return true;
    if (!reserve(c, n)) return false;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(c->word + len, v->gpt2_chr[raw[i]], v->gpt2_len[raw[i]]);
        c->sym[i] = (bpe_sym){(int32_t)i - 1, i + 1 == n ? -1 : (int32_t)i + 1, len,
                              v->gpt2_len[raw[i]], -1};
        len += v->gpt2_len[raw[i]];
    }
    if (v->ignore_merges) { /* a word that is a token is taken whole */
        int32_t id = tok_text_to_token(v, c->word, len);
        if (id >= 0) return tok_i32vec_push(out, id);
    }
    for (size_t i = 0; i < n; i++)
        c->sym[i].sid = tok_str_id(v, c->word + c->sym[i].off, c->sym[i].n);
    c->heap.n = 0;
    for (size_t i = 1; i < n; i++) add_bigram(c, (int32_t)i - 1, (int32_t)i);
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
