/* tokenizer, private: the priority queue of adjacent-pair merges shared by the
 * SentencePiece and BPE encoders. Highest priority pops first; ties go to the
 * leftmost pair, as llama.cpp orders them. */
#ifndef KVLLM_TOK_HEAP_H
#define KVLLM_TOK_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tok_bigram {
    float prio; /* SPM: the merged token's score; BPE: minus the merge rank (exact below 2^24) */
    int32_t left, right; /* symbol indices */
    size_t size;         /* byte length when queued: a changed length marks a stale entry */
} tok_bigram;

typedef struct tok_heap {
    tok_bigram *v;
    size_t n, cap;
} tok_heap;

/* False on out of memory (the heap is unchanged). */
bool tok_heap_push(tok_heap *h, tok_bigram b);
/* Requires h->n > 0. */
tok_bigram tok_heap_pop(tok_heap *h);

#endif
