/* grammar vocabulary tables: each tokenizer vocabulary's token texts as a
 * byte trie, built once per process and shared by every grammar compiled
 * against it (reference counted; grammar_vocab_cache_trim frees unused ones). The
 * walk over it that computes a token mask is in grammar_match.c. */
#include "grammar_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t vocab_mu = PTHREAD_MUTEX_INITIALIZER;
static gvocab *vocab_cache;

static void gvocab_free(gvocab *gv) {
    if (!gv) return;
    free(gv->node);
    free(gv->tok_off);
    free(gv->toks);
    free(gv->eog);
    if (gv->text)
        for (int32_t i = 0; i < gv->n_vocab; i++) free(gv->text[i]);
    free(gv->text);
    free(gv->text_len);
    free(gv);
}

static const gvocab *sort_gv; /* qsort has no context argument; held under vocab_mu */
static int cmp_tok_text(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_gv->text_len[x], ly = sort_gv->text_len[y];
    int c = memcmp(sort_gv->text[x], sort_gv->text[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

#define MAX_TOKEN_BYTES 65535

static gvocab *gvocab_build(const tok_vocab *v) {
    gvocab *gv = calloc(1, sizeof *gv);
    if (!gv) return NULL;
    const int32_t V = tok_n_vocab(v);
    gv->uid = tok_vocab_uid(v);
    gv->n_vocab = V;
    gv->text = calloc((size_t)V, sizeof *gv->text);
    gv->text_len = calloc((size_t)V, sizeof *gv->text_len);
    gv->eog = malloc((size_t)V * sizeof *gv->eog);
    int32_t *order = malloc((size_t)V * sizeof *order);
    int32_t n = 0;
    int64_t total = 0;
    bool ok = gv->text && gv->text_len && gv->eog && order;
    for (int32_t i = 0; ok && i < V; i++) {
        if (tok_is_eog(v, i)) {
            gv->eog[gv->n_eog++] = i;
            continue;
        }
        if (tok_is_control(v, i)) continue;
        size_t len = tok_token_bytes(v, i, false, NULL, 0);
        if (len == 0 || len > MAX_TOKEN_BYTES) continue;
        gv->text[i] = malloc(len);
        if (!gv->text[i]) {
            ok = false;
            break;
        }
        tok_token_bytes(v, i, false, gv->text[i], len);
        gv->text_len[i] = (uint32_t)len;
        order[n++] = i;
        total += (int64_t)len;
    }
    if (ok) {
        sort_gv = gv;
        qsort(order, (size_t)n, sizeof *order, cmp_tok_text);
        sort_gv = NULL;
    }
    /* at most one node per byte of text, plus the root */
    int64_t cap = total + 1;
    gv->node = ok ? calloc((size_t)cap, sizeof *gv->node) : NULL;
    gv->tok_off = ok ? malloc((size_t)(cap + 1) * sizeof *gv->tok_off) : NULL;
    gv->toks = ok ? malloc((size_t)(n > 0 ? n : 1) * sizeof *gv->toks) : NULL;
    int32_t *path = ok ? malloc((MAX_TOKEN_BYTES + 2) * sizeof *path) : NULL;
    int32_t *tnode = ok ? malloc((size_t)(n > 0 ? n : 1) * sizeof *tnode) : NULL;
    ok = ok && gv->node && gv->tok_off && gv->toks && path && tnode;
    if (ok) {
        /* Sorted texts: each new text shares a prefix with the previous one; the
         * nodes deeper than that prefix are closed (their subtree ends here) and
         * the rest of the text opens new ones. A token's node is therefore the
         * previous token's (same text) or a newer one: tnode never decreases. */
        int32_t nodes = 1, depth = 0;
        path[0] = 0;
        const char *prev = "";
        uint32_t prev_len = 0;
        for (int32_t k = 0; k < n; k++) {
            int32_t id = order[k];
            const char *t = gv->text[id];
            uint32_t len = gv->text_len[id], lcp = 0;
            while (lcp < len && lcp < prev_len && t[lcp] == prev[lcp]) lcp++;
            while (depth > (int32_t)lcp) gv->node[path[depth--]].end = (uint32_t)nodes;
            for (uint32_t d = lcp; d < len; d++) {
                int32_t nd = nodes++;
                gv->node[nd].depth = (uint16_t)(d + 1);
                gv->node[nd].byte = (uint8_t)t[d];
                path[++depth] = nd;
            }
            gv->toks[k] = id;
            tnode[k] = path[depth];
            gv->node[path[depth]].has_tok = 1;
            if ((int32_t)len > gv->max_depth) gv->max_depth = (int32_t)len;
            prev = t;
            prev_len = len;
        }
        while (depth >= 0) gv->node[path[depth--]].end = (uint32_t)nodes;
        gv->n_nodes = nodes;
        int32_t k = 0;
        for (int32_t i = 0; i < nodes; i++) {
            gv->tok_off[i] = k;
            while (k < n && tnode[k] == i) k++;
        }
        gv->tok_off[nodes] = n;
    }
    free(tnode);
    free(path);
    free(order);
    if (!ok) {
        gvocab_free(gv);
        return NULL;
    }
    return gv;
}

gvocab *gvocab_acquire(const tok_vocab *v, kvl_error *err) {
    pthread_mutex_lock(&vocab_mu);
    uint64_t uid = tok_vocab_uid(v);
    gvocab *gv = vocab_cache;
    while (gv && gv->uid != uid) gv = gv->next;
    if (!gv && (gv = gvocab_build(v)) != NULL) {
        gv->next = vocab_cache;
        vocab_cache = gv;
    }
    if (gv) gv->refs++;
    pthread_mutex_unlock(&vocab_mu);
    if (!gv) kvl_fail(err, "grammar: out of memory building the vocabulary tables");
    return gv;
}

void gvocab_release(gvocab *gv) {
    if (!gv) return;
    pthread_mutex_lock(&vocab_mu);
    gv->refs--;
    pthread_mutex_unlock(&vocab_mu);
}

void grammar_vocab_cache_trim(void) {
    pthread_mutex_lock(&vocab_mu);
    for (gvocab **pp = &vocab_cache; *pp;) {
        gvocab *gv = *pp;
        if (gv->refs > 0) {
            pp = &gv->next;
            continue;
        }
        *pp = gv->next;
        gvocab_free(gv);
    }
    pthread_mutex_unlock(&vocab_mu);
}
