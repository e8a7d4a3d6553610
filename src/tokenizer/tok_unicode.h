/* tokenizer-private: codepoint classes, UTF-8 coding and the GPT-2 byte map,
 * all with llama.cpp's exact conventions (including how it treats invalid UTF-8),
 * because tokenization must reproduce llama.cpp id for id. */
#ifndef KVLLM_TOK_UNICODE_H
#define KVLLM_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Codepoint class bits; exactly one of the low eight is set per codepoint. */
enum {
    TOK_UF_UNDEFINED = 0x0001, /* unassigned (Cn) */
    TOK_UF_NUMBER = 0x0002,    /* \p{N} */
    TOK_UF_LETTER = 0x0004,    /* \p{L} */
    TOK_UF_SEPARATOR = 0x0008, /* \p{Z} */
    TOK_UF_MARK = 0x0010,      /* \p{M} */
    TOK_UF_PUNCT = 0x0020,     /* \p{P} */
    TOK_UF_SYMBOL = 0x0040,    /* \p{S} */
    TOK_UF_CONTROL = 0x0080,   /* \p{C} except Cn */
    TOK_UF_CATEGORIES = 0x00FF,
    TOK_UF_WHITESPACE = 0x0100, /* Unicode White_Space */
};

typedef struct tok_urange {
    uint32_t start; /* first codepoint; the range runs to the next entry's start - 1 */
    uint16_t flags;
} tok_urange;

extern const tok_urange tok_unicode_ranges[]; /* generated: tok_unicode_data.c */
extern const size_t tok_unicode_n_ranges;

/* Class bits of cp; TOK_UF_UNDEFINED beyond U+10FFFF (as llama.cpp). */
uint16_t tok_uflags(uint32_t cp);

/* Bytes a UTF-8 sequence claims from its first byte (1 for continuation bytes). */
static inline size_t tok_utf8_len(unsigned char lead) {
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

/* Decodes one codepoint at *off like llama.cpp: continuation bytes are checked
 * but overlong forms and surrogates are accepted; a bad sequence yields U+FFFD
 * and consumes one byte. */
uint32_t tok_utf8_next(const char *s, size_t len, size_t *off);

/* Encodes cp (1..4 bytes); values beyond U+10FFFF become U+FFFD, since
 * llama.cpp cannot encode them either. Returns the byte count. */
size_t tok_utf8_put(uint32_t cp, char *out);

/* GPT-2 byte-level map: byte -> codepoint standing for it, and back (-1 if cp
 * stands for no byte). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);

#endif
