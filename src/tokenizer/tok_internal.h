/* tokenizer-private: the vocabulary record shared by the loader, the SPM and
 * BPE encoders and the decoder, plus the small containers they use. */
#ifndef KVLLM_TOK_INTERNAL_H
#define KVLLM_TOK_INTERNAL_H

#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "tok_hash.h"
#include "tok_pretok.h"

/* Token attribute bits, numbered as llama.cpp's llama_token_attr: the loader
 * adjusts them (e.g. EOG-looking tokens become CONTROL) and the partitioner and
 * decoder read them, so the same bits must mean the same things. */
enum {
    TOK_ATTR_UNDEFINED = 0,
    TOK_ATTR_UNKNOWN = 1 << 0,
    TOK_ATTR_UNUSED = 1 << 1,
    TOK_ATTR_NORMAL = 1 << 2,
    TOK_ATTR_CONTROL = 1 << 3,
    TOK_ATTR_USER_DEFINED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
    TOK_ATTR_LSTRIP = 1 << 7,
    TOK_ATTR_RSTRIP = 1 << 8,
};

enum tok_kind { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 };

/* Special ids that llama.cpp tracks; -1 means none. */
typedef struct tok_specials {
    int32_t bos, eos, eot, eom, unk, sep, pad, mask;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
} tok_specials;

/* Interned strings: ids [0, n_tokens) are the tokens, ids above are merge
 * halves that are not tokens. All NUL-terminated, in an arena sized once at
 * load that shares one allocation with s and len. */
typedef struct tok_strings {
    const char **s; /* [id] its text */
    uint32_t *len;  /* [id] its length */
    char *arena;
    size_t used;    /* arena bytes taken */
    int32_t n;      /* strings interned */
    tok_strmap ids; /* text -> id */
} tok_strings;

struct tok_vocab {
    int kind; /* tok_kind */
    char model[16];
    char pre[64];
    int32_t n_tokens;
    uint64_t uid; /* tok_vocab_uid */

    tok_strings str;
    tok_pairmap merges; /* (left id, right id) -> rank; BPE only */

    /* Per token, [n_tokens] each, carved from one allocation (per_token). */
    void *per_token;
    float *scores;
    uint16_t *attrs; /* TOK_ATTR_* */
    uint8_t *eog;    /* 1 if it ends generation */
    /* Decoded bytes of every token (llama.cpp's piece cache, special = true):
     * piece_len[id] bytes at pieces + piece_off[id]. */
    size_t *piece_off;
    uint32_t *piece_len;
    char *pieces;

    tok_specials sp;
    bool add_bos, add_eos, add_sep, add_space_prefix, ignore_merges;
    bool pre_no_bos; /* the pre-tokenizer clears the default BOS id */
    /* gemma4 (tok_pre_info): raw UTF-8 words with U+2581 for spaces and <0xNN>
     * byte fallback; whole newline runs; BOS always added. */
    bool spm_pieces, newline_words, force_bos;

    int32_t *special_ids; /* partition candidates, longest text first */
    int32_t n_special;

    int32_t byte_tok[256]; /* SPM byte fallback (<0xNN> or the raw byte), -1 if none */
    int32_t hex_tok[256];  /* the <0xNN> token alone (gemma4 byte fallback), -1 if none */
    char gpt2_chr[256][2]; /* BPE: UTF-8 of the codepoint standing for each byte */
    uint8_t gpt2_len[256];

    tok_pretok *pretok; /* BPE only */
};

/* Growable arrays (plain malloc: they are scratch, not tensors). */
typedef struct tok_i32vec {
    int32_t *v;
    size_t n, cap;
} tok_i32vec;

static inline bool tok_i32vec_push(tok_i32vec *a, int32_t x) {
    if (!kvl_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v, 64)) return false;
    a->v[a->n++] = x;
    return true;
}

/* Id of the interned string s[0..len), or -1. */
static inline int32_t tok_str_id(const tok_vocab *v, const char *s, size_t len) {
    return tok_strmap_get(&v->str.ids, v->str.s, v->str.len, s, len);
}

/* Token id of s[0..len), or -1 (interned merge halves are not tokens). */
static inline int32_t tok_text_to_token(const tok_vocab *v, const char *s, size_t len) {
    int32_t id = tok_str_id(v, s, len);
    return id < v->n_tokens ? id : -1;
}

/* Encoders: append ids for one fragment of plain text. */
bool tok_spm_encode(const tok_vocab *v, const char *text, size_t len, tok_i32vec *out);
bool tok_bpe_encode(const tok_vocab *v, const char *text, size_t len, tok_i32vec *out,
                    kvl_error *err);

/* Loader steps (tok_load.c / tok_special.c). */
bool tok_load_specials(tok_vocab *v, const gguf_file *f, kvl_error *err);
bool tok_build_pieces(tok_vocab *v);

#endif
