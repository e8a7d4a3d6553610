/* spec: see spec.h. */
#include "spec.h"
#include "batch_buf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int spec_ngram_propose(const int32_t *toks, int64_t n, int ngram_max, int k, int32_t *out,
                       int *matched) {
    *matched = 0;
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
            *matched = g;
            return (int)m;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ cost model -- */

enum { COST_MIN_OBS = 3 };
/* Before a size is measured, each extra token is taken to cost this much of
 * the nearest measured size: about what the 1B shapes measure up to 4 tokens
 * (bench/spec.sh), so a model where it holds drafts at once, and one where
 * extra tokens cost more (a tiny model, a compute-bound batch) learns so
 * from the one step that tries. */
#define COST_PRIOR_SLOPE 0.05
#define COST_EMA         0.125

void spec_cost_init(spec_cost *c) {
    memset(c, 0, sizeof *c);
    const char *e = getenv("KVLLM_SPEC_COST");
    for (const char *p = e; p && *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || *end != ':' || n < 1 || n >= SPEC_COST_N) break;
        p = end + 1;
        double t = strtod(p, &end);
        if (end == p || !(t > 0)) break;
        c->s[n] = t;
        c->n_obs[n] = COST_MIN_OBS;
        c->frozen = true;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') break;
    }
}

/* A shared machine only ever makes a step slower: the first few
 * measurements of a size keep their minimum (the first step after a prompt
 * runs on cold caches), later ones count at most 1.5 times the estimate, so
 * one descheduled step cannot put a size out of use. */
/* s[n] as of now: scaled by how the one-token cost moved since it was set. */
static double cost_now(const spec_cost *c, int64_t n) {
    return n > 1 && c->ref1[n] > 0 && c->n_obs[1] > 0 ? c->s[n] * (c->s[1] / c->ref1[n]) : c->s[n];
}

void spec_cost_observe(spec_cost *c, int64_t n_tokens, double seconds) {
    if (c->frozen || n_tokens < 1 || n_tokens >= SPEC_COST_N || !(seconds > 0)) return;
    const int seen = c->n_obs[n_tokens]++;
    double v = seen ? cost_now(c, n_tokens) : seconds;
    if (seen > 0 && seen < COST_MIN_OBS && seconds < v) v = seconds;
    else if (seen >= COST_MIN_OBS) v += COST_EMA * ((seconds < 1.5 * v ? seconds : 1.5 * v) - v);
    c->s[n_tokens] = v;
    c->ref1[n_tokens] = n_tokens > 1 && c->n_obs[1] > 0 ? c->s[1] : 0;
}

void spec_cost_observe_draft(spec_cost *c, int positions, double seconds) {
    if (c->frozen || positions < 1 || !(seconds > 0)) return;
    double per = seconds / positions;
    c->draft_s = c->draft_obs++ ? c->draft_s + COST_EMA * (per - c->draft_s) : per;
}

double spec_cost_at(const spec_cost *c, int64_t n) {
    if (n < 1) n = 1;
    int64_t top = n < SPEC_COST_N ? n : SPEC_COST_N - 1;
    int lo = 0, hi = 0;
    for (int64_t i = top; i >= 1 && !lo; i--)
        if (c->n_obs[i] >= COST_MIN_OBS) lo = (int)i;
    const double s_lo = lo ? cost_now(c, lo) : 0;
    if (lo == n) return s_lo;
    for (int64_t i = n + 1; i < SPEC_COST_N && !hi; i++)
        if (c->n_obs[i] >= COST_MIN_OBS) hi = (int)i;
    const double s_hi = hi ? cost_now(c, hi) : 0;
    if (lo && hi) return s_lo + (s_hi - s_lo) * (double)(n - lo) / (hi - lo);
    if (lo) return s_lo * (1 + COST_PRIOR_SLOPE * (double)(n - lo));
    if (hi) return s_hi / (1 + COST_PRIOR_SLOPE * (double)(hi - n));
    return 1 + COST_PRIOR_SLOPE * (double)(n - 1);
}

/* ---------------------------------------------------------- adaptation -- */

enum { PROBE_WAIT = 8, PROBE_WAIT_MAX = 256, EXPLORE_EVERY = 16 };
#define ACC_DECAY 0.85f /* per verification: about the last dozen count */
/* Drafting must promise this much more throughput than not (measurement noise). */
#define GAIN_MARGIN 1.05

/* Prior counts (accepted, rejected) per class: longer matches start more trusted. */
static const float PRIOR_ACC[SPEC_CLASSES] = {0.5f, 1.0f, 1.5f};
static const float PRIOR_REJ[SPEC_CLASSES] = {1.0f, 1.0f, 1.0f};

void spec_adapt_init(spec_adapt *a) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < SPEC_CLASSES; i++) a->backoff[i] = PROBE_WAIT;
}

int spec_adapt_choose(spec_adapt *a, const spec_cost *c, int64_t base, int m, int matched,
                      bool draft_model) {
    if (m <= 0) return 0;
    if (base < 1) base = 1;
    const int cls = draft_model || matched >= SPEC_CLASSES ? SPEC_CLASSES - 1
                    : matched >= 1                         ? matched - 1
                                                           : 0;
    const double p = (a->acc[cls] + PRIOR_ACC[cls]) /
                     (a->acc[cls] + a->rej[cls] + PRIOR_ACC[cls] + PRIOR_REJ[cls]);
    /* tokens per second with k drafts: (base + p + p^2 + ... + p^k) / cost */
    const double draft_s = draft_model && c->draft_obs ? c->draft_s : 0;
    double best = (double)base / spec_cost_at(c, base) * GAIN_MARGIN, emit = (double)base, q = 1;
    int best_k = 0;
    for (int k = 1; k <= m; k++) {
        q *= p;
        emit += q;
        const double v = emit / (spec_cost_at(c, base + k) + draft_s * k);
        if (v > best) {
            best = v;
            best_k = k;
        }
    }
    a->cls = cls;
    if (best_k > 0) {
        a->wait[cls] = 0;
        a->backoff[cls] = PROBE_WAIT;
        /* now and then one more than pays, so that the next size's cost is
         * measured again (an estimate that is too high would never be) */
        if (best_k < m && ++a->explore >= EXPLORE_EVERY) {
            a->explore = 0;
            best_k++;
        }
        return best_k;
    }
    if (a->wait[cls] > 0) {
        a->wait[cls]--;
        return 0;
    }
    /* a probe now; while drafting keeps not paying, probes get rarer */
    a->wait[cls] = a->backoff[cls];
    if (a->backoff[cls] < PROBE_WAIT_MAX) a->backoff[cls] *= 2;
    return 1;
}

void spec_adapt_update(spec_adapt *a, int drafted, int accepted) {
    if (drafted <= 0) return;
    const int cls = a->cls;
    a->acc[cls] = a->acc[cls] * ACC_DECAY + (float)accepted;
    a->rej[cls] = a->rej[cls] * ACC_DECAY + (accepted < drafted ? 1.0f : 0.0f);
}

/* ------------------------------------------------------------ draft model -- */

enum { DRAFT_CHUNK = 256 }; /* tokens per catch-up forward */

struct spec_drafter {
    model *m;
    kv_pool *kv[MODEL_MAX_KV_GROUPS];
    kv_attn attn[MODEL_MAX_KV_GROUPS];
    int n_groups;
    /* one forward's batch, grown to the most sequences drafted together:
     * DRAFT_CHUNK + cap_seqs tokens, cap_seqs sequences and logits rows */
    int cap_seqs;
    batch_buf in;
    int *row_job; /* [cap_seqs] the job of each logits row */
};

/* Group g's pool of the draft model: the main model's block size and K type
 * (for V too), as many blocks. */
static kv_pool_config draft_pool_config(model *draft, int g, int block_size, int kv_dtype,
                                        int64_t n_blocks, kv_attn *attn) {
    kv_pool_config kc;
    model_kv_group_shape(draft, g, &kc, attn);
    kc.block_size = block_size;
    kc.dtype = kv_dtype;
    kc.split_v = false;
    kc.dtype_v = kv_dtype;
    kc.n_blocks = n_blocks;
    return kc;
}

uint64_t spec_drafter_pool_bytes(model *draft, int block_size, int kv_dtype, int64_t n_blocks) {
    uint64_t bytes = 0;
    for (int g = 0; g < model_kv_n_groups(draft); g++) {
        const kv_pool_config kc = draft_pool_config(draft, g, block_size, kv_dtype, n_blocks, NULL);
        bytes += (uint64_t)kv_pool_block_bytes(&kc) * (uint64_t)n_blocks;
    }
    return bytes;
}

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
        const kv_pool_config kc =
            draft_pool_config(draft, g, block_size, kv_dtype, n_blocks, &d->attn[g]);
        if (!(d->kv[g] = kv_pool_create(&kc, err))) {
            spec_drafter_destroy(d);
            return NULL;
        }
    }
    return d;
}

void spec_drafter_destroy(spec_drafter *d) {
    if (!d) return;
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) kv_pool_destroy(d->kv[g]);
    batch_buf_free(&d->in);
    free(d->row_job);
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

int spec_drafter_reserve(spec_drafter *d, spec_dseq *ds, int64_t n, int k) {
    if (k <= 0 || n <= 0) return 0;
    if (ds->n_computed >= n)
        spec_drafter_rollback(d, ds, n - 1); /* the last token's logits are needed */
    /* tables cover the n - 1 + k positions drafting computes, all groups or none */
    int64_t before[MODEL_MAX_KV_GROUPS];
    for (int g = 0; g < d->n_groups; g++) {
        kv_seq_drop_unattended(d->kv[g], &ds->kv[g], ds->n_computed, d->attn[g]);
        before[g] = ds->kv[g].n_blocks;
        if (!kv_seq_reserve(d->kv[g], &ds->kv[g], n + k - 1)) {
            for (int h = 0; h < g; h++) kv_seq_truncate(d->kv[h], &ds->kv[h], before[h]);
            return 0;
        }
    }
    return k;
}

static bool grow(spec_drafter *d, int n_jobs, kvl_error *err) {
    if (n_jobs <= d->cap_seqs) return true;
    const int64_t V = model_hp(d->m)->n_vocab;
    batch_buf_free(&d->in);
    free(d->row_job);
    d->row_job = malloc((size_t)n_jobs * sizeof *d->row_job);
    const bool ok =
        batch_buf_alloc(&d->in, DRAFT_CHUNK + (int64_t)n_jobs, n_jobs, d->n_groups, n_jobs, V) &&
        d->row_job;
    d->cap_seqs = ok ? n_jobs : 0;
    return ok || kvl_fail(err, "draft model: out of memory");
}

/* Adds job j's sequence to the batch being built (its tables); returns its index there. */
static int batch_seq(spec_drafter *d, int *n_seqs, const spec_draft_job *job) {
    const int si = (*n_seqs)++;
    batch_buf_set_seq(&d->in, si, job->ds->kv);
    return si;
}

static bool run_batch(spec_drafter *d, int64_t n_tokens, int n_seqs, spec_draft_job *jobs,
                      int n_rows, int out_index, kvl_error *err) {
    model_batch b = batch_buf_batch(&d->in, n_tokens, n_seqs);
    if (!model_forward(d->m, d->kv, &b, d->in.logits, err)) return false;
    const int64_t V = model_hp(d->m)->n_vocab;
    for (int r = 0; r < n_rows; r++) {
        spec_draft_job *job = &jobs[d->row_job[r]];
        job->out[out_index] = argmax_first(d->in.logits + (int64_t)r * V, V);
    }
    return true;
}

bool spec_drafter_run(spec_drafter *d, spec_draft_job *jobs, int n_jobs, kvl_error *err) {
    if (n_jobs <= 0) return true;
    if (!grow(d, n_jobs, err)) return false;
    /* Catch-up: every sequence's tokens the draft model has not seen, up to
     * its last one (whose logits give the first draft), ragged, in chunks. */
    for (;;) {
        int64_t nt = 0;
        int n_seqs = 0, n_rows = 0;
        for (int j = 0; j < n_jobs && nt < DRAFT_CHUNK; j++) {
            spec_dseq *ds = jobs[j].ds;
            const int64_t t0 = ds->n_computed, n = jobs[j].n;
            if (jobs[j].k <= 0 || t0 >= n) continue;
            const int64_t cnt = n - t0 < DRAFT_CHUNK - nt ? n - t0 : DRAFT_CHUNK - nt;
            for (int g = 0; g < d->n_groups; g++)
                kv_seq_drop_unattended(d->kv[g], &ds->kv[g], t0, d->attn[g]);
            const int si = batch_seq(d, &n_seqs, &jobs[j]);
            for (int64_t i = 0; i < cnt; i++, nt++)
                batch_buf_set_token(&d->in, nt, jobs[j].toks[t0 + i], t0 + i, si, t0 + i == n - 1);
            if (t0 + cnt == n) d->row_job[n_rows++] = j;
            ds->n_computed += cnt;
        }
        if (nt == 0) break;
        if (!run_batch(d, nt, n_seqs, jobs, n_rows, 0, err)) return false;
    }
    /* Then one forward per draft position, one token of every sequence still drafting. */
    for (int i = 1;; i++) {
        int64_t nt = 0;
        int n_seqs = 0;
        for (int j = 0; j < n_jobs; j++) {
            if (jobs[j].k <= i) continue;
            spec_dseq *ds = jobs[j].ds;
            /* (no window drop here: these positions may be rolled back) */
            const int si = batch_seq(d, &n_seqs, &jobs[j]);
            batch_buf_set_token(&d->in, nt, jobs[j].out[i - 1], jobs[j].n + i - 1, si, true);
            d->row_job[nt] = j;
            nt++;
            ds->n_computed++;
        }
        if (nt == 0) break;
        if (!run_batch(d, nt, n_seqs, jobs, (int)nt, i, err)) return false;
    }
    return true;
}

int spec_drafter_propose(spec_drafter *d, spec_dseq *ds, const int32_t *toks, int64_t n, int k,
                         int32_t *out, kvl_error *err) {
    spec_draft_job job = {
        .ds = ds, .toks = toks, .n = n, .k = spec_drafter_reserve(d, ds, n, k), .out = out};
    if (job.k == 0) return 0;
    return spec_drafter_run(d, &job, 1, err) ? job.k : -1;
}

void spec_drafter_rollback(spec_drafter *d, spec_dseq *ds, int64_t n_valid) {
    if (ds->n_computed > n_valid) ds->n_computed = n_valid;
    for (int g = 0; g < d->n_groups; g++) {
        int64_t held = kv_seq_truncate_tokens(d->kv[g], &ds->kv[g], ds->n_computed);
        if (held < ds->n_computed) ds->n_computed = held;
    }
}
