/* engine: llama-server's reasoning budget (thinking_budget_tokens), as
 * llama.cpp's reasoning-budget sampler keeps it. Inside a thinking block (its
 * start tag's tokens seen, or the prompt opened it), each token counts; when
 * the budget is spent, at a token whose text ends a whole UTF-8 character,
 * the forced tokens (the budget message, then the end tag) are the next ones
 * whatever the model's distribution. The end tag seen ends the block; a new
 * start tag opens another with a fresh budget. The tag matchers are
 * llama.cpp's (a mismatch restarts at the tag's first token). Private to the
 * engine: the request's fields are in engine.h. */
#ifndef KVLLM_REASONING_BUDGET_H
#define KVLLM_REASONING_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct reasoning_budget {
    bool active; /* a budget was asked for */
    int32_t *start, *end, *forced;
    int n_start, n_end, n_forced;
    int32_t budget, remaining;
    int state; /* rb_state (reasoning_budget.c) */
    int start_pos, end_pos, force_pos;
} reasoning_budget;

/* Copies the tags (budget < 0: inactive, nothing copied). False when out of
 * memory. */
bool rb_init(reasoning_budget *b, int32_t budget, const int32_t *start, int n_start,
             const int32_t *end, int n_end, const int32_t *forced, int n_forced);
/* Where the prompt's last start tag begins (the tail llama.cpp feeds the
 * budget as its generation prompt: the tag and what follows count), or -1. */
int64_t rb_prompt_tail(const reasoning_budget *b, const int32_t *prompt, int64_t n);
void rb_free(reasoning_budget *b);
/* The token to force next, or -1 (sample as usual). */
int32_t rb_forced(const reasoning_budget *b);
/* After a token is taken: utf8_complete says whether its text ends a whole
 * UTF-8 character (llama.cpp waits for one before it forces). */
void rb_accept(reasoning_budget *b, int32_t tok, bool utf8_complete);
/* llama-server's control action reasoning_end: a block being counted is
 * ended now (its forced tokens come next). False when no block is counted. */
bool rb_force(reasoning_budget *b);
/* Whether bytes end with a whole UTF-8 character (llama.cpp's
 * common_utf8_is_complete: empty text is). */
bool rb_utf8_complete(const char *bytes, size_t n);

#endif
