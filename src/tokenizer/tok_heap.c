/* tokenizer, private: binary heap of merge candidates. See tok_heap.h. */
#include "tok_heap.h"

#include <stdlib.h>

#include "base.h"

static bool before(const tok_bigram *a, const tok_bigram *b) {
    return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

bool tok_heap_push(tok_heap *h, tok_bigram b) {
    if (!kvl_grow((void **)&h->v, &h->cap, h->n + 1, sizeof *h->v, 64)) return false;
    size_t i = h->n++;
    while (i > 0 && before(&b, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = b;
    return true;
}

tok_bigram tok_heap_pop(tok_heap *h) {
    tok_bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c])) c++;
        if (!before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}
