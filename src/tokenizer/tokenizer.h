/* tokenizer: text <-> token ids from GGUF metadata (tokenizer.ggml.*).
 *
 * The families of llama.cpp that kvllm reads, with its exact results:
 *  - "llama": SentencePiece-style (scores, byte fallback <0xNN>, the leading-space
 *    rule: a space is prepended and spaces become U+2581).
 *  - "gpt2": byte-level BPE with merges, pre-tokenized by the regexes selected by
 *    tokenizer.ggml.pre (gpt-2, llama-bpe, qwen2, deepseek-coder, deepseek-llm,
 *    starcoder, falcon, refact, mpt, default, ...), via PCRE2 with Unicode classes.
 *  - "gemma4" (Gemma 4): BPE with merges over whole lines of UTF-8 text with
 *    spaces as U+2581 (no leading space added), runs of newlines taken whole,
 *    byte fallback <0xNN>; BOS always added.
 * Special/control tokens are recognised in text only when parse_special is set.
 * Works for vocab-only GGUF files. */
#ifndef KVLLM_TOKENIZER_H
#define KVLLM_TOKENIZER_H

#include "base.h"
#include "gguf.h"

typedef struct tok_vocab tok_vocab; /* opaque */

tok_vocab *tok_vocab_create(const gguf_file *f, kvl_error *err);
void tok_vocab_destroy(tok_vocab *v);

int32_t tok_n_vocab(const tok_vocab *v);
/* A number no other vocabulary of this process has had (a key for tables built
 * per vocabulary: an address can be reused after tok_vocab_destroy). */
uint64_t tok_vocab_uid(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v); /* -1 if none */
int32_t tok_eos(const tok_vocab *v); /* -1 if none */
/* End-of-turn token (tokenizer.ggml.eot_token_id, or detected by name), -1 if none. */
int32_t tok_eot(const tok_vocab *v);
/* Fill-in-the-middle tokens (tokenizer.ggml.fim_*_token_id, else found by
 * their usual texts, as llama.cpp does): -1 where the vocabulary has none. */
typedef struct tok_fim {
    int32_t pre, suf, mid, pad, rep, sep;
} tok_fim;
tok_fim tok_fim_ids(const tok_vocab *v);
/* tokenizer.ggml.add_bos_token, or the family default; always true for gemma4 */
bool tok_add_bos(const tok_vocab *v);
/* tokenizer.ggml.add_eos_token (tok_encode never appends EOS; callers do). */
bool tok_add_eos(const tok_vocab *v);
/* tokenizer.ggml.add_sep_token (false when absent: no decoder family adds it)
 * and the separator id (tokenizer.ggml.seperator_token_id, llama.cpp's
 * spelling), -1 if none: llama-server's rerank prompts without a template. */
bool tok_add_sep(const tok_vocab *v);
int32_t tok_sep(const tok_vocab *v);
/* End of generation: EOS, EOT, <|im_end|>, <|eot_id|>, ... (token types and known names). */
bool tok_is_eog(const tok_vocab *v, int32_t id);
bool tok_is_control(const tok_vocab *v, int32_t id);
const char *tok_model_name(const tok_vocab *v); /* "llama" | "gpt2" | "gemma4" */
const char *tok_pre_name(const tok_vocab *v);   /* tokenizer.ggml.pre, "default" or "gemma4" */

/* Encodes len bytes of text. Writes up to cap ids into out and returns the total
 * number of ids (which may exceed cap: call again with a larger buffer), or -1 on
 * error (err filled). add_bos prepends BOS if the vocab has one. */
int64_t tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_bos,
                   bool parse_special, int32_t *out, int64_t cap, kvl_error *err);

/* A byte range of a text. */
typedef struct tok_span {
    size_t off, len;
} tok_span;

/* tok_encode with special tokens parsed, except that a control (or unknown)
 * token is not recognised where its text overlaps one of the n_guard ranges
 * (sorted by offset, not overlapping): there it is plain text, as with
 * parse_special off. For chat prompts: the template's own markup becomes
 * special tokens, text a client sent never does. Raw text is cut exactly where
 * tok_encode would cut it, so unguarded text tokenizes the same. */
int64_t tok_encode_guarded(const tok_vocab *v, const char *text, size_t len, bool add_bos,
                           const tok_span *guard, size_t n_guard, int32_t *out, int64_t cap,
                           kvl_error *err);

/* tok_encode (guard NULL) or tok_encode_guarded (guard non-NULL; parse_special
 * is then implied) into an array it allocates: returns the ids, which the
 * caller frees, and their count in *n; NULL with err filled on failure. */
int32_t *tok_encode_alloc(const tok_vocab *v, const char *text, size_t len, bool add_bos,
                          bool parse_special, const tok_span *guard, size_t n_guard, int64_t *n,
                          kvl_error *err);

/* The tokens that are matched in text (tokenizer.ggml.token_type control,
 * user-defined, unknown), k = 0 .. tok_n_special - 1, longest text first; and
 * whether id is one that only parse_special lets text become (control, unknown). */
int32_t tok_n_special(const tok_vocab *v);
int32_t tok_special_id(const tok_vocab *v, int32_t k);
bool tok_is_parse_special(const tok_vocab *v, int32_t id);

/* The vocabulary string of id, as stored (e.g. "\u0120hand", "<0x0A>"); NUL-terminated. */
const char *tok_piece(const tok_vocab *v, int32_t id);
/* The bytes id stands for in output text (byte-level mapping undone, U+2581 -> ' ',
 * <0xNN> -> byte). Control tokens give their text only if `special` is true.
 * Returns the byte count (may exceed cap; nothing is written past cap). */
size_t tok_token_bytes(const tok_vocab *v, int32_t id, bool special, char *buf, size_t cap);

/* Streaming detokenizer: emits only complete UTF-8 sequences, holding back a
 * partial sequence until the bytes that finish it arrive (invalid bytes are
 * flushed as U+FFFD so output is always valid UTF-8). */
typedef struct tok_stream {
    char pending[8];
    int n_pending;
} tok_stream;
void tok_stream_init(tok_stream *s);
/* Appends the text of id; writes valid UTF-8 to out and returns the byte count
 * (out must have room for 3*tok_token_bytes()+12: invalid bytes become
 * 3-byte U+FFFD). */
size_t tok_stream_push(tok_stream *s, const tok_vocab *v, int32_t id, bool special, char *out,
                       size_t cap);
/* Flushes what is held back (as U+FFFD) at the end of a stream. */
size_t tok_stream_flush(tok_stream *s, char *out, size_t cap);

#endif
