/* grammar: constrained decoding. A GBNF grammar (llama.cpp's syntax) is
 * compiled once into rules of code-point sets and rule references; a
 * grammar_state follows one sequence's output through it as a set of
 * pushdown stacks, and masks the vocabulary before each sampling step.
 *
 * The mask does not test tokens one by one: every vocabulary gets, once per
 * process, a byte trie of its token texts laid out in preorder (grammar_vocab.c).
 * A step walks that trie once, following cached byte transitions between
 * interned matcher states (a lazily built DFA over the stack sets), and skips
 * a whole subtree at the first byte the grammar refuses. Token texts are
 * matched byte by byte, so tokens that end inside a UTF-8 sequence (byte-level
 * BPE, SentencePiece <0xNN> byte fallback) are allowed when the code point
 * they begin can still be accepted. Control tokens never match grammar text;
 * end-of-generation tokens are allowed exactly when the grammar can end.
 *
 * JSON Schema and regular expressions are translated to GBNF text
 * (json_schema.c) and compiled the same way. */
#ifndef KVLLM_GRAMMAR_H
#define KVLLM_GRAMMAR_H

#include "base.h"
#include "kvl_buf.h"
#include "tokenizer.h"

typedef struct grammar grammar; /* compiled GBNF + its per-vocabulary tables; immutable after
                                   compile, shareable by many sequences/threads */

/* Compiles a GBNF grammar (rules `name ::= ...`, "literals", [char classes],
 * [^...], ., ( ), |, * + ? {m} {m,} {m,n}, # comments; the start rule is `root`)
 * for this vocabulary (NULL: text matching only, no masking). Errors name the
 * line and column, undefined rules and left recursion. */
grammar *grammar_compile(const char *gbnf, const tok_vocab *vocab, kvl_error *err);
void grammar_free(grammar *g);

/* JSON Schema (JSON text) -> GBNF rules appended to out. Every rule name gets
 * `prefix` (so several schemas can live in one grammar); the schema's own value
 * rule is named `<prefix>root`. A complete grammar for one schema is
 * "root ::= <prefix>root\n" + rules. Unsupported schema features fail with err
 * naming the keyword. */
bool json_schema_to_gbnf(const char *schema_json, const char *prefix, kvl_buf *out, kvl_error *err);

/* A regular expression (a subset: literals, escapes, classes, ., groups,
 * alternation, * + ? {m,n}, ^ and $ at the ends) -> GBNF rules appended to out,
 * the whole-match rule named `<prefix>root`. json_string: the text is the
 * content of a JSON string (quotes, backslashes and control characters are
 * produced in their escaped form). Unsupported syntax fails, naming it. */
bool regex_to_gbnf(const char *regex, const char *prefix, bool json_string, kvl_buf *out,
                   kvl_error *err);

/* For composing grammars as text: a GBNF string literal for s (quoted, escaped). */
void gbnf_append_literal(kvl_buf *out, const char *s, size_t n);

/* ---------------------------------------------------------- matching -- */

typedef struct grammar_state grammar_state; /* one sequence's position; not shareable */

/* NULL on out of memory. g must outlive the state. */
grammar_state *grammar_state_new(const grammar *g);
void grammar_state_free(grammar_state *st);
/* Advances by the token's text (an end-of-generation token: accepted iff the
 * grammar can end). Returns false, leaving the state as it was, if the token
 * cannot continue a valid output. Needs a grammar compiled with a vocabulary. */
bool grammar_state_accept_token(grammar_state *st, int32_t token);
/* Advances by raw bytes (may end inside a UTF-8 sequence). */
bool grammar_state_accept_bytes(grammar_state *st, const char *p, size_t n);
/* Whether p[0..n) could come next (the state is not changed): the check one
 * token at a time that grammar_state_mask does for all of them at once. */
bool grammar_state_allows_bytes(grammar_state *st, const char *p, size_t n);
/* Whether the output so far is a complete sentence of the grammar. */
bool grammar_state_can_end(const grammar_state *st);
/* Whether nothing but the end can follow. */
bool grammar_state_must_end(const grammar_state *st);
/* Sets bit i of allowed (n_vocab bits, cleared first) for every token that may
 * come next; returns how many. Tokens past the tokenizer's vocabulary (a
 * model's padding rows) are never allowed. */
int32_t grammar_state_mask(grammar_state *st, uint32_t *allowed, int32_t n_vocab);

/* Whether the whole of text[0..n) is a sentence of g (for tests and checks). */
bool grammar_match_text(const grammar *g, const char *text, size_t n);

/* Frees the cached per-vocabulary tables no grammar uses any more (they are
 * built once per vocabulary and kept for the next grammar). */
void grammar_vocab_cache_trim(void);

#endif
