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
 * line and column, undefined rules and left recursion. Groups nest at most
 * 1,024 deep (GRAMMAR_MAX_NEST). */
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
/* Any one of count literals s[i] (n[i] bytes), as one expression: a tree of
 * nested groups by common prefix (grammar_choice.c), so that the matcher keeps
 * one parse stack per distinct next character rather than one per string (an
 * enum of 5,000 values would be past GRAMMAR_MAX_STACKS before its first byte). */
void gbnf_append_choice(kvl_buf *out, const char *const *s, const size_t *n, size_t count);

/* ---------------------------------------------------------- matching -- */

typedef struct grammar_state grammar_state; /* one sequence's position; not shareable */

/* Work bounds. A position is a set of distinct parse stacks (identical ones
 * are merged every step). Ambiguous grammars can still make that set grow
 * exponentially: nested repetitions whose alternatives share a prefix, or
 * rules like r ::= "a" r "b" | "a" r "c" | "" (2^n stacks after n a's). The
 * matcher never drops stacks to stay within its bounds (that would silently
 * refuse valid output): past a bound the state fails, every call on it
 * answers false / -1, and grammar_state_error says which bound.
 * grammar_compile already refuses a grammar whose start position is over them;
 * later positions fail during generation (the engine ends the request with
 * ENGINE_FINISH_ERROR and that message).
 *  - GRAMMAR_MAX_STACKS: distinct stacks at one position (after one byte);
 *  - GRAMMAR_MAX_STEP_WORK: work in one call (accept, allows, or one whole
 *    mask walk over the vocabulary): every stack expansion tried counts its
 *    stack's words + 2, every stack built its words + 1 (bench_grammar's
 *    JSON-schema decode loop over Qwen3's 151,669 tokens, cold caches
 *    included, peaks near 19 K: the bound leaves a 200x margin);
 *  - GRAMMAR_MAX_EXPAND_DEPTH: rules entered, nested, without consuming input. */
#define GRAMMAR_MAX_STACKS       4096
#define GRAMMAR_MAX_STEP_WORK    (1 << 22)
#define GRAMMAR_MAX_EXPAND_DEPTH 4096

/* NULL on out of memory. g must outlive the state. */
grammar_state *grammar_state_new(const grammar *g);
void grammar_state_free(grammar_state *st);
/* Advances by the token's text (an end-of-generation token: accepted iff the
 * grammar can end). Returns false, leaving the state as it was, if the token
 * cannot continue a valid output, or when a bound was exceeded (then
 * grammar_state_error is set). Needs a grammar compiled with a vocabulary. */
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
 * come next; returns how many, or -1 (none set) when the state failed
 * (grammar_state_error). Tokens past the tokenizer's vocabulary (a
 * model's padding rows) are never allowed. */
int32_t grammar_state_mask(grammar_state *st, uint32_t *allowed, int32_t n_vocab);

/* NULL, or why the state failed (a bound above was exceeded, or out of memory);
 * the text lives as long as the state. */
const char *grammar_state_error(const grammar_state *st);
/* Lowers the bounds for this state (tests). */
void grammar_state_set_limits(grammar_state *st, int32_t max_stacks, int64_t max_work);

/* Whether the whole of text[0..n) is a sentence of g: 1 yes, 0 no, -1 a bound
 * was exceeded (err says which: the answer is unknown). */
int grammar_match(const grammar *g, const char *text, size_t n, kvl_error *err);
/* grammar_match(...) == 1 (for tests and checks). */
bool grammar_match_text(const grammar *g, const char *text, size_t n);

/* Frees the cached per-vocabulary tables no grammar uses any more (they are
 * built once per vocabulary and kept for the next grammar). */
void grammar_vocab_cache_trim(void);

#endif
