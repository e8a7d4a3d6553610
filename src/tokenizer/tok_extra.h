/* Tokenizer functions beyond tokenizer.h (candidates to move there): lookups
 * that chat templates and the sampler need. */
#ifndef KVLLM_TOK_EXTRA_H
#define KVLLM_TOK_EXTRA_H

#include "tokenizer.h"

/* Id of the vocabulary string text[0..len) exactly as stored (e.g. "<|im_start|>"), or -1. */
int32_t tok_token_id(const tok_vocab *v, const char *text, size_t len);

#endif
