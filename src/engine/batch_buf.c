/* batch_buf: see batch_buf.h. */
#include "batch_buf.h"

#include <stdlib.h>
#include <string.h>

bool batch_buf_alloc(batch_buf *b, int64_t max_tokens, int64_t max_seqs, int n_groups, int64_t rows,
                     int64_t n_vocab) {
    const size_t nt = (size_t)max_tokens;
    b->tokens = malloc(3 * nt * sizeof *b->tokens); /* tokens, pos and seq: one allocation */
    if (b->tokens) {
        b->pos = b->tokens + nt;
        b->seq = b->pos + nt;
    }
    b->want = malloc(nt * sizeof *b->want);
    b->seqs = malloc((size_t)max_seqs * (size_t)n_groups * sizeof *b->seqs);
    b->lora = calloc((size_t)max_seqs, sizeof *b->lora);
    b->logits = kvl_alloc((size_t)rows * (size_t)n_vocab * sizeof *b->logits);
    b->n_groups = n_groups;
    return b->tokens && b->want && b->seqs && b->lora && b->logits;
}

void batch_buf_free(batch_buf *b) {
    free(b->tokens);
    free(b->want);
    free(b->seqs);
    free(b->lora);
    kvl_free(b->logits);
    memset(b, 0, sizeof *b);
}
