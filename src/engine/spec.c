/* spec: see spec.h. */
#include "spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int spec_ngram_propose(const int32_t *toks, int64_t n, int ngram_max, int k, int32_t *out) {
    if (k <= 0 || n < 2) return 0;
    for (int g = ngram_max; g >= 1; g--) {
        if (g >= n) continue;
        const int32_t *pat = toks + n - g;
        /* the most recent earlier occurrence, ending before the last token so
         * that something follows it */
        for (int64_t i = n - g - 1; i >= 0; i--) {
            if (toks[i] != pat[0] || memcmp(toks + i, pat, (size_t)g * sizeof *pat) != 0) continue;
            int64_t from = i + g, m = n - from < k ? n - from : k;
            memcpy(out, toks + from, (size_t)m * sizeof *out);
            return (int)m;
        }
    }
    return 0;
}

enum { COOLDOWN_STEPS = 16 };

void spec_adapt_init(spec_adapt *a, int k_max) {
    a->k = k_max;
    a->cooldown = 0;
}

int spec_adapt_want(spec_adapt *a) {
    if (a->k > 0) return a->k;
    if (a->cooldown > 0 && --a->cooldown > 0) return 0;
    a->k = 1; /* try again, cautiously */
    return a->k;
}

void spec_adapt_update(spec_adapt *a, int k_max, int drafted, int accepted) {
    if (drafted <= 0) return;
    if (accepted == drafted) {
        if (a->k < k_max) a->k++;
    } else if (accepted == 0) {
        a->k /= 2;
        if (a->k == 0) a->cooldown = COOLDOWN_STEPS;
    } else {
        a->k = accepted + 1 < k_max ? accepted + 1 : k_max;
    }
}

/* ------------------------------------------------------------ draft model -- */

struct spec_drafter {
    model *m;
    kv_pool *kv[MODEL_MAX_KV_GROUPS];
    int32_t window[MODEL_MAX_KV_GROUPS];
    int n_groups;
    float *logits; /* [n_vocab] */
};

spec_drafter *spec_drafter_create(model *draft, int block_size, int kv_dtype, int64_t n_blocks,
                                  kvl_error *err) {
    spec_drafter *d = calloc(1, sizeof *d);
    if (!d) {
        kvl_fail(err, "draft model: out of memory");
        return NULL;
    }
    d->m = draft;
    d->n_groups = model_kv_n_groups(draft);
    for (int g = 0; g < d->n_groups; g++) {
        kv_pool_config kc;
        model_kv_group_shape(draft, g, &kc, &d->window[g]);
        kc.block_size = block_size;
        kc.dtype = kv_dtype;
        kc.split_v = false;
        kc.dtype_v = kv_dtype;
        kc.n_blocks = n_blocks;
        if (!(d->kv[g] = kv_pool_create(&kc, err))) {
            spec_drafter_destroy(d);
            return NULL;
        }
    }
    if (!(d->logits = kvl_alloc((size_t)model_hp(draft)->n_vocab * sizeof(float)))) {
        kvl_fail(err, "draft model: out of memory");
        spec_drafter_destroy(d);
        return NULL;
    }
    return d;
}

void spec_drafter_destroy(spec_drafter *d) {
    if (!d) return;
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) kv_pool_destroy(d->kv[g]);
    kvl_free(d->logits);
    free(d);
}

void spec_dseq_init(spec_dseq *ds) {
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) kv_seq_init(&ds->kv[g]);
    ds->n_computed = 0;
}

void spec_dseq_release(spec_drafter *d, spec_dseq *ds, bool free_table) {
    if (!d) return;
    for (int g = 0; g < d->n_groups; g++) {
        if (free_table) kv_seq_free(d->kv[g], &ds->kv[g]);
        else kv_seq_release(d->kv[g], &ds->kv[g]);
    }
    ds->n_computed = 0;
}

/* The first index of the largest logit (the sampler's greedy rule). */
static int32_t argmax_first(const float *l, int64_t n) {
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = (int32_t)i;
    return best;
}

/* Tables cover n_tokens positions, all groups or none. */
static bool reserve(spec_drafter *d, spec_dseq *ds, int64_t n_tokens) {
    int64_t before[MODEL_MAX_KV_GROUPS];
    for (int g = 0; g < d->n_groups; g++) {
        kv_seq_drop_outside_window(d->kv[g], &ds->kv[g], ds->n_computed, d->window[g]);
        before[g] = ds->kv[g].n_blocks;
        if (!kv_seq_reserve(d->kv[g], &ds->kv[g], n_tokens)) {
            for (int k = 0; k < g; k++) kv_seq_truncate(d->kv[k], &ds->kv[k], before[k]);
            return false;
        }
    }
    return true;
}

typedef struct catch_up {
    spec_drafter *d;
    spec_dseq *ds;
} catch_up;

/* Before each chunk: what the window no longer needs goes, and n_computed says
 * how far the catch-up got if the chunk fails. */
static void catch_up_chunk(void *user, int64_t pos) {
    catch_up *c = user;
    for (int g = 0; g < c->d->n_groups; g++)
        kv_seq_drop_outside_window(c->d->kv[g], &c->ds->kv[g], pos, c->d->window[g]);
    c->ds->n_computed = pos;
}

/* Computes toks[ds->n_computed..n) (the last one's logits into d->logits). */
static bool forward(spec_drafter *d, spec_dseq *ds, const int32_t *toks, int64_t n,
                    kvl_error *err) {
    if (ds->n_computed >= n) return true;
    const kv_seq *seqs[MODEL_MAX_KV_GROUPS];
    for (int g = 0; g < d->n_groups; g++) seqs[g] = &ds->kv[g];
    catch_up c = {.d = d, .ds = ds};
    model_span span = {.tokens = toks,
                       .from = ds->n_computed,
                       .to = n,
                       .want_from = n - 1,
                       .want_to = n,
                       .seqs = seqs,
                       .logits = d->logits,
                       .before_chunk = catch_up_chunk,
                       .user = &c};
    if (!model_forward_span(d->m, d->kv, &span, err)) return false;
    ds->n_computed = n;
    return true;
}

int spec_drafter_propose(spec_drafter *d, spec_dseq *ds, const int32_t *toks, int64_t n, int k,
                         int32_t *out, kvl_error *err) {
    if (k <= 0 || n <= 0) return 0;
    if (ds->n_computed >= n)
        spec_drafter_rollback(d, ds, n - 1); /* the last token's logits are needed */
    if (!reserve(d, ds, n + k - 1)) return 0;
    const int64_t V = model_hp(d->m)->n_vocab;
    if (!forward(d, ds, toks, n, err)) return -1;
    for (int i = 0; i < k; i++) {
        out[i] = argmax_first(d->logits, V);
        if (i == k - 1) break;
        /* the draft at position n + i, for the next one's logits */
        int32_t pos = (int32_t)(n + i), sq = 0;
        uint8_t want = 1;
        const kv_seq *seqs[MODEL_MAX_KV_GROUPS];
        /* (no window drop here: these positions may be rolled back) */
        for (int g = 0; g < d->n_groups; g++) seqs[g] = &ds->kv[g];
        model_batch b = {.n_tokens = 1,
                         .tokens = &out[i],
                         .pos = &pos,
                         .seq = &sq,
                         .want_logits = &want,
                         .n_seqs = 1,
                         .seqs = seqs};
        if (!model_forward(d->m, d->kv, &b, d->logits, err)) return -1;
        ds->n_computed++;
    }
    return k;
}

void spec_drafter_rollback(spec_drafter *d, spec_dseq *ds, int64_t n_valid) {
    if (ds->n_computed > n_valid) ds->n_computed = n_valid;
    for (int g = 0; g < d->n_groups; g++) {
        int64_t held = kv_seq_truncate_tokens(d->kv[g], &ds->kv[g], ds->n_computed);
        if (held < ds->n_computed) ds->n_computed = held;
    }
}
