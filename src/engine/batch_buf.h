/* batch_buf: the arrays one model_batch points into and the logits its
 * forward returns, owned together. The engine's step slots and the draft
 * model's batch each hold one; they fill it token by token and sequence by
 * sequence, then run batch_buf_batch's view. Engine-internal. */
#ifndef KVLLM_BATCH_BUF_H
#define KVLLM_BATCH_BUF_H

#include "model.h"

typedef struct batch_buf {
    int32_t *tokens, *pos, *seq; /* [max_tokens] each, one allocation; seq: the token's sequence */
    uint8_t *want;               /* [max_tokens] 1: the token's logits are wanted */
    const kv_seq **seqs;         /* [max_seqs][n_groups] each sequence's block tables */
    const float **lora;          /* [max_seqs] each sequence's LoRA scales (model_batch.lora) */
    float *logits;               /* [rows][n_vocab] */
    int n_groups;
} batch_buf;

/* Sizes b (zeroed or freed before) for up to max_tokens tokens of max_seqs
 * sequences with n_groups KV groups each, and rows logits rows of n_vocab.
 * false: out of memory (batch_buf_free frees what was allocated). */
bool batch_buf_alloc(batch_buf *b, int64_t max_tokens, int64_t max_seqs, int n_groups, int64_t rows,
                     int64_t n_vocab);
/* Frees the arrays and zeroes b. */
void batch_buf_free(batch_buf *b);

/* Batch sequence si: the block tables kv[0..n_groups). */
static inline void batch_buf_set_seq(batch_buf *b, int si, const kv_seq *kv) {
    for (int g = 0; g < b->n_groups; g++) b->seqs[si * b->n_groups + g] = &kv[g];
}

/* Batch sequence si's LoRA adapter scales (NULL: the model's defaults). */
static inline void batch_buf_set_lora(batch_buf *b, int si, const float *lora) {
    b->lora[si] = lora;
}

/* Batch token t: id token at position pos of batch sequence si. */
static inline void batch_buf_set_token(batch_buf *b, int64_t t, int32_t token, int64_t pos, int si,
                                       bool want) {
    b->tokens[t] = token;
    b->pos[t] = (int32_t)pos;
    b->seq[t] = si;
    b->want[t] = want;
}

/* The batch of the first n_tokens tokens and n_seqs sequences. */
static inline model_batch batch_buf_batch(const batch_buf *b, int64_t n_tokens, int n_seqs) {
    return (model_batch){.n_tokens = n_tokens,
                         .tokens = b->tokens,
                         .pos = b->pos,
                         .seq = b->seq,
                         .want_logits = b->want,
                         .n_seqs = n_seqs,
                         .seqs = b->seqs,
                         .lora = b->lora};
}

#endif
