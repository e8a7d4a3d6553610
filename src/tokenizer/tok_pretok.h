/* tokenizer-private: BPE pre-tokenization (splitting text into words before the
 * merges), selected by tokenizer.ggml.pre. It reproduces llama.cpp's
 * unicode_regex_split: the regexes of a pre-tokenizer are applied one after the
 * other, each to every piece the previous ones produced; the GPT-2 and Llama-3
 * patterns use hand-written splitters, the others run on a "collapsed" text in
 * which each codepoint is replaced by one byte naming its class (or, without
 * \p classes, on the codepoints themselves), so the matching semantics and the
 * Unicode classes are exactly llama.cpp's. */
#ifndef KVLLM_TOK_PRETOK_H
#define KVLLM_TOK_PRETOK_H

#include "base.h"

typedef struct tok_pretok tok_pretok;

/* What a pre-tokenizer name implies besides its regexes (as llama.cpp sets it). */
typedef struct tok_pre_info {
    bool ignore_merges; /* a word that is itself a token is emitted whole */
    bool add_bos;       /* default for tokenizer.ggml.add_bos_token */
    bool no_bos;        /* the default BOS id is cleared */
    /* llama.cpp's GEMMA4 type: SentencePiece-style BPE. Words are raw UTF-8 (no
     * GPT-2 byte map) with spaces written as U+2581, and bytes that are no token
     * fall back to <0xNN> tokens. */
    bool spm_pieces;
    bool newline_words; /* a word of only newlines that is a token is taken whole */
    bool force_bos;     /* BOS is added even where tokenizer.ggml.add_bos_token is false */
} tok_pre_info;

/* NULL with err filled if the name is unknown or a regex fails to compile. */
tok_pretok *tok_pretok_create(const char *pre_name, tok_pre_info *info, kvl_error *err);
void tok_pretok_destroy(tok_pretok *p);

/* Growable size_t array: word lengths in codepoints. */
typedef struct tok_szvec {
    size_t *v;
    size_t n, cap;
} tok_szvec;
bool tok_szvec_push(tok_szvec *a, size_t x);

/* Splits cpts[0..n) into words; on success *lens holds each word's length in
 * codepoints (the lengths add up to n). */
bool tok_pretok_split(const tok_pretok *p, const uint32_t *cpts, size_t n, tok_szvec *lens,
                      kvl_error *err);

#endif
