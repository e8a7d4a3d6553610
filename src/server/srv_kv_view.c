/* The live KV view: GET /v1/kv/state and the built-in pages (/, /kv).
 *
 * A state request never touches the engine from an HTTP thread: it queues a
 * srv_view_req (srv_engine_call) and waits until the engine thread, between
 * two steps, has copied the KV state into it (engine_view_take: the per-block
 * arrays, the sequences' block tables, the new events). Everything else (the
 * prefix tree, the JSON) is built here, off the engine thread. */
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

typedef struct srv_view_req {
    srv_engine_task task;
    engine_view v;
    uint64_t since;
    int64_t *holders; /* GET /slots: each slot's running request (srv_slot.holder), or NULL */
} srv_view_req;

/* Engine thread, between steps. */
static bool run_view(srv *s, srv_engine_task *t, api_error *err) {
    srv_view_req *r = (srv_view_req *)t;
    for (int i = 0; r->holders && i < s->max_seqs; i++)
        r->holders[i] = s->slots ? s->slots[i].holder : -1;
    return engine_view_take(s->e, &r->v, r->since) ||
           api_fail(err, 500, NULL, "out of memory taking the KV state");
}

static bool view_run(srv *s, srv_view_req *r, api_error *err) {
    if (!engine_view_prepare(s->e, &r->v)) return api_fail(err, 500, NULL, "out of memory");
    r->task.run = run_view;
    return srv_engine_call(s, &r->task, err);
}

/* ---------------------------------------------------------------- tree -- */

typedef struct hnode {
    uint64_t hash;
    int32_t block;
} hnode;

static int hnode_cmp(const void *a, const void *b) {
    uint64_t x = ((const hnode *)a)->hash, y = ((const hnode *)b)->hash;
    return x < y ? -1 : x > y;
}

static int32_t hnode_find(const hnode *h, int64_t n, uint64_t hash) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (h[mid].hash < hash) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && h[lo].hash == hash ? h[lo].block : -1;
}

/* The prefix cache of group 0 as a forest: each hashed block's parent is the
 * hashed block whose hash its chain continues (-1: a root, i.e. the chain's
 * first block, or its parent was evicted); depth = blocks above it, so it
 * holds tokens [depth * block_size, (depth + 1) * block_size). */
static void put_tree(kvl_buf *o, const engine_view *v) {
    const kv_block_info *bi = v->blocks[0];
    const int64_t n = v->n_blocks;
    hnode *h = malloc((size_t)n * sizeof *h);
    int32_t *par = malloc((size_t)n * sizeof *par), *depth = malloc((size_t)n * sizeof *depth);
    if (!h || !par || !depth) {
        o->oom = true;
        goto done;
    }
    int64_t nh = 0;
    for (int64_t b = 0; b < n; b++)
        if (bi[b].hashed) h[nh++] = (hnode){bi[b].hash, (int32_t)b};
    qsort(h, (size_t)nh, sizeof *h, hnode_cmp);
    for (int64_t b = 0; b < n; b++) {
        par[b] = bi[b].hashed ? hnode_find(h, nh, bi[b].parent) : -1;
        depth[b] = -1;
    }
    for (int64_t b = 0; b < n;
         b++) { /* depths along each chain, iteratively (chains can be long) */
        if (!bi[b].hashed || depth[b] >= 0) continue;
        int32_t x = (int32_t)b, len = 0;
        while (x >= 0 && depth[x] < 0 && len <= n) x = par[x], len++;
        int32_t d = x >= 0 && len <= n ? depth[x] + 1 : 0;
        /* walk again from b, assigning from the top down */
        int32_t *stack = malloc((size_t)len * sizeof *stack);
        if (!stack) {
            o->oom = true;
            goto done;
        }
        x = (int32_t)b;
        for (int32_t i = 0; i < len; i++, x = par[x]) stack[i] = x;
        for (int32_t i = len - 1; i >= 0; i--) depth[stack[i]] = d++;
        free(stack);
    }
    kvl_buf_puts(o, "\"nodes\":[");
    bool first = true;
    for (int64_t b = 0; b < n; b++) {
        if (!bi[b].hashed) continue;
        kvl_buf_printf(o,
                       "%s{\"block\":%lld,\"parent\":%d,\"depth\":%d,\"seqs\":%d,\"state\":\"%s\"}",
                       first ? "" : ",", (long long)b, par[b], depth[b], bi[b].refcount,
                       bi[b].state == KV_BLOCK_CACHED ? "cached" : "used");
        first = false;
    }
    kvl_buf_puts(o, "]");
done:
    free(h);
    free(par);
    free(depth);
}

/* ---------------------------------------------------------------- JSON -- */

static void put_histo_json(kvl_buf *o, const char *name, const histo *h) {
    kvl_buf_printf(o, "\"%s\":{\"bounds\":[", name);
    for (int i = 0; i < h->n_bounds; i++) kvl_buf_printf(o, "%s%.17g", i ? "," : "", h->bounds[i]);
    kvl_buf_puts(o, "],\"counts\":[");
    for (int i = 0; i <= h->n_bounds; i++)
        kvl_buf_printf(o, "%s%llu", i ? "," : "", (unsigned long long)h->counts[i]);
    kvl_buf_printf(o, "],\"count\":%llu,\"sum\":%.17g}", (unsigned long long)h->count, h->sum);
}

static char block_char(const kv_block_info *b) {
    if (b->state == KV_BLOCK_CACHED) return 'c';
    if (b->state == KV_BLOCK_FREE) return 'f';
    return b->refcount > 1 ? 's' : 'u';
}

static void put_pool(kvl_buf *o, const engine_view *v, int g) {
    const kv_block_info *bi = v->blocks[g];
    int64_t cnt[4] = {0};
    char *states = malloc((size_t)v->n_blocks + 1);
    if (!states) {
        o->oom = true;
        return;
    }
    for (int64_t b = 0; b < v->n_blocks; b++) {
        states[b] = block_char(&bi[b]);
        cnt[states[b] == 'f' ? 0 : states[b] == 'u' ? 1 : states[b] == 's' ? 2 : 3]++;
    }
    states[v->n_blocks] = 0;
    kvl_buf_printf(
        o,
        "{\"group\":%d,\"window\":%d,\"chunk\":%d,\"n_blocks\":%lld,\"block_bytes\":%zu,\"free\":%"
        "lld,\"used\":%"
        "lld,"
        "\"shared\":%lld,\"cached\":%lld,\"evicted_total\":%lld,\"states\":\"%s\",\"refcount\":[",
        g, v->window[g], v->chunk[g], (long long)v->n_blocks, v->block_bytes[g], (long long)cnt[0],
        (long long)(cnt[1] + cnt[2]), (long long)cnt[2], (long long)cnt[3],
        (long long)v->n_evicted[g], states);
    free(states);
    for (int64_t b = 0; b < v->n_blocks; b++)
        kvl_buf_printf(o, "%s%d", b ? "," : "", bi[b].refcount);
    kvl_buf_puts(o, "],\"lru_rank\":[");
    for (int64_t b = 0; b < v->n_blocks; b++)
        kvl_buf_printf(o, "%s%d", b ? "," : "", bi[b].lru_rank);
    kvl_buf_puts(o, "]}");
}

static void put_seq(kvl_buf *o, const engine_view *v, const engine_seq_view *q) {
    kvl_buf_printf(
        o,
        "{\"id\":%lld,\"phase\":\"%s\",\"prompt_tokens\":%lld,\"generated_tokens\":%lld,"
        "\"cached_tokens\":%lld,\"computed_tokens\":%lld,\"preemptions\":%lld,\"age_s\":%.3f,"
        "\"kv\":{\"tokens\":%lld,\"blocks\":%lld,\"lower_bound_bytes\":%zu,\"allocated_bytes\":%zu}"
        ","
        "\"blocks\":[",
        (long long)q->id, engine_phase_name((engine_seq_phase)q->phase), (long long)q->n_prompt,
        (long long)q->n_generated, (long long)q->n_cached_prompt, (long long)q->n_computed,
        (long long)q->n_preemptions, v->t - q->t_submit, (long long)q->kv.tokens,
        (long long)q->kv.blocks, q->kv.lower_bound_bytes, q->kv.allocated_bytes);
    for (int g = 0; g < v->n_groups; g++) {
        kvl_buf_puts(o, g ? ",[" : "[");
        for (int64_t i = 0; i < q->table_len[g]; i++)
            kvl_buf_printf(o, "%s%d", i ? "," : "", v->tables[q->table_off[g] + i]);
        kvl_buf_puts(o, "]");
    }
    kvl_buf_puts(o, "]}");
}

static void render(srv *s, const engine_view *v, kvl_buf *o) {
    const engine_metrics *m = &v->metrics;
    kvl_buf_printf(o,
                   "{\"object\":\"kv.state\",\"time\":%.6f,\"block_size\":%d,\"n_groups\":%d,"
                   "\"prefix_cache\":%s,\"max_seqs\":%d,",
                   v->t, v->block_size, v->n_groups, v->prefix_cache ? "true" : "false",
                   s->max_seqs);
    kvl_buf_printf(
        o,
        "\"metrics\":{\"running\":%lld,\"waiting\":%lld,\"preemptions\":%lld,\"prompt_tokens\":%"
        "lld,"
        "\"generation_tokens\":%lld,\"prefix_cache_queries\":%lld,\"prefix_cache_hits\":%lld,"
        "\"steps\":%lld,\"blocks_total\":%lld,\"blocks_used\":%lld,\"blocks_cached\":%lld,"
        "\"blocks_free\":%lld,",
        (long long)m->n_running, (long long)m->n_waiting, (long long)m->n_preemptions,
        (long long)m->prompt_tokens, (long long)m->generation_tokens,
        (long long)m->prefix_cache_queries, (long long)m->prefix_cache_hits, (long long)m->steps,
        (long long)m->kv_blocks_total, (long long)m->kv_blocks_used, (long long)m->kv_blocks_cached,
        (long long)m->kv_blocks_free);
    pthread_mutex_lock(&s->metrics.mu);
    histo ttft = s->metrics.ttft, tpot = s->metrics.tpot;
    pthread_mutex_unlock(&s->metrics.mu);
    put_histo_json(o, "ttft_seconds", &ttft);
    kvl_buf_puts(o, ",");
    put_histo_json(o, "tpot_seconds", &tpot);
    kvl_buf_puts(o, "},\"pools\":[");
    for (int g = 0; g < v->n_groups; g++) {
        if (g) kvl_buf_puts(o, ",");
        put_pool(o, v, g);
    }
    kvl_buf_puts(o, "],\"sequences\":[");
    for (int i = 0; i < v->n_seqs; i++) {
        if (i) kvl_buf_puts(o, ",");
        put_seq(o, v, &v->seqs[i]);
    }
    kvl_buf_printf(
        o,
        "],\"prefix_tree\":{\"enabled\":%s,\"lookups\":%lld,\"hits\":%lld,\"misses\":%lld,"
        "\"query_tokens\":%lld,\"hit_tokens\":%lld,",
        v->prefix_cache ? "true" : "false", (long long)v->prefix_lookups, (long long)v->prefix_hits,
        (long long)(v->prefix_lookups - v->prefix_hits), (long long)m->prefix_cache_queries,
        (long long)m->prefix_cache_hits);
    put_tree(o, v);
    kvl_buf_printf(o, "},\"last_event\":%llu,\"events\":[",
                   (unsigned long long)(v->next_event - 1));
    for (int i = 0; i < v->n_events; i++) {
        const engine_log_event *e = &v->events[i];
        kvl_buf_printf(o,
                       "%s{\"seq\":%llu,\"age_s\":%.3f,\"kind\":\"%s\",\"request\":%lld,\"a\":%lld,"
                       "\"b\":%lld}",
                       i ? "," : "", (unsigned long long)e->seq, v->t - e->t,
                       engine_ev_kind_name((engine_ev_kind)e->kind), (long long)e->request_id,
                       (long long)e->a, (long long)e->b);
    }
    kvl_buf_puts(o, "]}");
}

char *srv_kv_state(srv *s, const char *since, size_t *len, api_error *err) {
    uint64_t after = 0;
    if (since) {
        if (!*since || strspn(since, "0123456789") != strlen(since) || strlen(since) > 19) {
            api_fail(err, 400, "since", "since must be an event number (digits), got '%.40s'",
                     since);
            return NULL;
        }
        after = strtoull(since, NULL, 10);
    }
    srv_view_req *r = calloc(1, sizeof *r);
    if (!r) {
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    r->since = after;
    kvl_buf o = {0};
    if (view_run(s, r, err)) {
        render(s, &r->v, &o);
        if (o.oom) {
            kvl_buf_free(&o);
            api_fail(err, 500, NULL, "out of memory rendering the KV state");
        }
    }
    engine_view_free(&r->v);
    free(r);
    *len = o.len;
    return o.p;
}

/* --------------------------------------------------------------- slots -- */

/* llama-server's GET /slots: one entry per slot (--parallel), in its shape.
 * kvllm's slots are the engine's places for running sequences: entry i is
 * the i-th running one, the rest idle (llama-server also keeps a finished
 * request's entries on its slot; kvllm's idle slots show none). The prompt
 * and generated text that llama-server adds are left out (the view keeps no
 * text); the sampling parameters are those kvllm has. */
static cJSON *slot_params(const srv *s, const engine_seq_view *q) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "n_predict", (double)q->max_tokens);
    cJSON_AddNumberToObject(p, "seed", (double)q->sampling.seed);
    llama_sampling_json(p, &q->sampling, s->n_ctx); /* as /completion's generation_settings */
    cJSON_AddNumberToObject(p, "max_tokens", (double)q->max_tokens);
    cJSON_AddBoolToObject(p, "ignore_eos", q->ignore_eos);
    cJSON_AddNumberToObject(p, "n_probs", q->top_logprobs);
    cJSON_AddNumberToObject(p, "n_keep", 0);
    cJSON_AddNumberToObject(p, "n_discard", 0);
    return p;
}

static cJSON *slot_entry(srv *s, int id, const engine_seq_view *q) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    cJSON_AddNumberToObject(o, "n_ctx", (double)s->n_ctx);
    cJSON_AddBoolToObject(o, "speculative", q && q->speculative);
    cJSON_AddBoolToObject(o, "is_processing", q != NULL);
    if (!q) return o;
    cJSON_AddNumberToObject(o, "id_task", (double)q->id);
    cJSON_AddNumberToObject(o, "n_prompt_tokens", (double)q->n_prompt);
    const int64_t done = q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt;
    cJSON_AddNumberToObject(o, "n_prompt_tokens_processed", (double)(done - q->n_cached_prompt));
    cJSON_AddNumberToObject(o, "n_prompt_tokens_cache", (double)q->n_cached_prompt);
    cJSON_AddItemToObject(o, "params", slot_params(s, q));
    const char *piece = q->last_token >= 0 ? tok_piece(s->vocab, q->last_token) : NULL;
    /* an array of one object, as llama-server 81ff7abe answers (its README
     * shows the object alone) */
    cJSON *nt = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "next_token"), nt);
    cJSON_AddBoolToObject(nt, "has_next_token", true);
    cJSON_AddBoolToObject(nt, "has_new_line", piece && strchr(piece, '\n'));
    cJSON_AddNumberToObject(nt, "n_remain",
                            q->max_tokens < 0 ? -1.0 : (double)(q->max_tokens - q->n_generated));
    cJSON_AddNumberToObject(nt, "n_decoded", (double)q->n_generated);
    return o;
}

char *srv_slots(srv *s, const char *fail_on_no_slot, api_error *err) {
    if (s->cfg.no_slots) {
        api_fail(err, 501, NULL,
                 "This server does not support slots endpoint. Start it without --no-slots");
        err->type = "not_supported_error"; /* llama-server's types */
        return NULL;
    }
    srv_view_req *r = calloc(1, sizeof *r);
    const engine_seq_view **at = calloc((size_t)s->max_seqs, sizeof *at);
    if (!r || !at || !(r->holders = malloc((size_t)s->max_seqs * sizeof *r->holders))) {
        if (r) free(r->holders);
        free(r);
        free(at);
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    r->since = UINT64_MAX - 1; /* no events wanted (ev_ring_copy takes those above it) */
    char *out = NULL;
    if (view_run(s, r, err)) {
        /* each running request at the slot it took (srv_slots.c), so that the
         * ids here are the ones the slot actions take; one that found no slot
         * idle when it was admitted fills the first slot shown idle */
        int busy = 0;
        for (int i = 0; i < r->v.n_seqs; i++) {
            const engine_seq_view *q = &r->v.seqs[i];
            if (q->phase != ENGINE_PHASE_PREFILLING && q->phase != ENGINE_PHASE_DECODING) continue;
            int k = 0;
            while (k < s->max_seqs && r->holders[k] != q->id) k++;
            if (k == s->max_seqs)
                for (k = 0; k < s->max_seqs && (at[k] || r->holders[k] >= 0); k++) {}
            if (k < s->max_seqs && !at[k]) {
                at[k] = q;
                busy++;
            }
        }
        cJSON *a = cJSON_CreateArray();
        for (int i = 0; i < s->max_seqs; i++) cJSON_AddItemToArray(a, slot_entry(s, i, at[i]));
        /* ?fail_on_no_slot=1: 503 when every slot is busy, as llama-server */
        if (fail_on_no_slot && *fail_on_no_slot && busy >= s->max_seqs) {
            api_fail(err, 503, NULL, "no slot available");
            err->type = "unavailable_error";
        } else out = cJSON_PrintUnformatted(a);
        cJSON_Delete(a);
        if (!out && !err->status) api_fail(err, 500, NULL, "out of memory");
    }
    engine_view_free(&r->v);
    free(r->holders);
    free(r);
    free(at);
    return out;
}

/* --------------------------------------------------------------- pages -- */

const srv_asset *srv_asset_find(const char *url) {
    const char *want = strcmp(url, "/") == 0     ? "/web/chat.html"
                       : strcmp(url, "/kv") == 0 ? "/web/kv.html"
                                                 : url;
    for (int i = 0; i < SRV_WEB_N_ASSETS; i++)
        if (strcmp(SRV_WEB_ASSETS[i].path, want) == 0) return &SRV_WEB_ASSETS[i];
    return NULL;
}
