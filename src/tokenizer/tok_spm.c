/* SentencePiece-style encoding ("llama" vocabs), as llama.cpp's
 * llm_tokenizer_spm: start from single UTF-8 characters and repeatedly merge
 * the adjacent pair whose concatenation is the highest-scoring token (leftmost
 * on ties); whatever is not a token at the end falls back to byte tokens. The
 * caller has already escaped spaces to U+2581 and added the leading space. */
#include "tok_internal.h"
#include "tok_heap.h"
#include "tok_unicode.h"

typedef struct spm_sym {
    int32_t prev, next; /* neighbours in the current segmentation, -1 at the ends */
    size_t off, n;      /* bytes of text; n == 0 once merged into the left neighbour */
} spm_sym;

typedef struct spm_ctx {
    const tok_vocab *v;
    const char *text;
    spm_sym *sym;
    tok_heap heap;
    bool ok;
} spm_ctx;

/* Queues the pair (left, right) if their concatenation is a token. */
static void try_add(spm_ctx *c, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const spm_sym *l = &c->sym[left], *r = &c->sym[right];
    int32_t id = tok_text_to_token(c->v, c->text + l->off, l->n + r->n);
    if (id < 0) return;
    tok_bigram b = {c->v->scores[id], left, right, l->n + r->n};
    c->ok &= tok_heap_push(&c->heap, b);
}

static void merge_all(spm_ctx *c) {
    while (c->heap.n > 0 && c->ok) {
        tok_bigram b = tok_heap_pop(&c->heap);
        spm_sym *l = &c->sym[b.left], *r = &c->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = b.left;
        try_add(c, l->prev, b.left);
        try_add(c, b.left, l->next);
    }
}

/* A final piece: its token, or one token per byte (<0xNN>, else the unknown
 * token; llama.cpp would abort where a vocab has neither). */
static bool emit_piece(const spm_ctx *c, const spm_sym *s, tok_i32vec *out) {
    int32_t id = tok_text_to_token(c->v, c->text + s->off, s->n);
    if (id >= 0) return tok_i32vec_push(out, id);
    for (size_t j = 0; j < s->n; j++) {
        int32_t b = c->v->byte_tok[(unsigned char)c->text[s->off + j]];
        if (b < 0) b = c->v->sp.unk;
        if (b >= 0 && !tok_i32vec_push(out, b)) return false;
    }
    return true;
}

bool tok_spm_encode(const tok_vocab *v, const char *text, size_t len, tok_i32vec *out) {
    if (len == 0) return true;
    spm_ctx c = {v, text, malloc(len * sizeof(spm_sym)), {0}, true};
    if (!c.sym) return false;
    int32_t n = 0;
    for (size_t off = 0; off < len; n++) {
        size_t cl = tok_utf8_len((unsigned char)text[off]);
        if (cl > len - off) cl = len - off;
        c.sym[n] = (spm_sym){n - 1, off + cl == len ? -1 : n + 1, off, cl};
        off += cl;
    }
    for (int32_t i = 1; i < n; i++) try_add(&c, i - 1, i);
    merge_all(&c);
    for (int32_t i = 0; i != -1 && c.ok; i = c.sym[i].next) c.ok = emit_piece(&c, &c.sym[i], out);
    free(c.sym);
    free(c.heap.v);
    return c.ok;
}
