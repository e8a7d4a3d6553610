/* model span: one sequence's tokens over a range of positions, forwarded in
 * chunks of MODEL_SPAN_CHUNK, for the callers that compute a single sequence of
 * their own (perplexity, embeddings, saving a prefix to disk, the draft model's
 * catch-up). Each chunk is one model_forward batch; the caller decides which
 * rows it wants and what happens to the KV between chunks. */
#include "model.h"

bool model_forward_span(model *m, kv_pool *const *pools, const model_span *s, kvl_error *err) {
    int32_t pos[MODEL_SPAN_CHUNK], sq[MODEL_SPAN_CHUNK] = {0};
    uint8_t want[MODEL_SPAN_CHUNK];
    const float *const lora[1] = {s->lora};
    for (int64_t t0 = s->from; t0 < s->to; t0 += MODEL_SPAN_CHUNK) {
        int64_t cnt = s->to - t0 < MODEL_SPAN_CHUNK ? s->to - t0 : MODEL_SPAN_CHUNK, n_rows = 0;
        for (int64_t i = 0; i < cnt; i++) {
            pos[i] = (int32_t)(t0 + i);
            want[i] = t0 + i >= s->want_from && t0 + i < s->want_to;
            n_rows += want[i];
        }
        if (s->before_chunk) s->before_chunk(s->user, t0);
        model_batch b = {.n_tokens = cnt,
                         .tokens = s->tokens + t0,
                         .pos = pos,
                         .seq = sq,
                         .want_logits = want,
                         .n_seqs = 1,
                         .seqs = s->seqs,
                         .hidden = s->hidden,
                         .lora = s->lora ? lora : NULL};
        if (!model_forward(m, pools, &b, s->logits, err)) return false;
        if (s->on_rows && n_rows > 0) {
            int64_t first = t0 > s->want_from ? t0 : s->want_from;
            s->on_rows(s->user, first, n_rows, s->logits, s->hidden);
        }
    }
    return true;
}
