/* /metrics: vLLM's metric names under the kvllm: prefix, in the Prometheus
 * text format, and llama-server's series under its llamacpp: names.
 * Histogram buckets are vLLM's, so dashboards carry over. */
#include <stdio.h>
#include <string.h>

#include "srv_internal.h"

static const double TTFT_BOUNDS[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
/* vLLM uses the same bounds for time per output token and inter-token latency. */
static const double TOKEN_BOUNDS[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double E2E_BOUNDS[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                    5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void histo_init(histo *h, const char *name, const char *help, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->bounds = b;
    h->n_bounds = n;
}

void metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    histo_init(&m->ttft, "time_to_first_token_seconds",
               "Histogram of time to first token in seconds.", TTFT_BOUNDS, NB(TTFT_BOUNDS));
    histo_init(&m->tpot, "time_per_output_token_seconds",
               "Histogram of time per output token in seconds (per request, after the first).",
               TOKEN_BOUNDS, NB(TOKEN_BOUNDS));
    histo_init(&m->itl, "inter_token_latency_seconds",
               "Histogram of inter-token latency in seconds.", TOKEN_BOUNDS, NB(TOKEN_BOUNDS));
    histo_init(&m->e2e, "e2e_request_latency_seconds",
               "Histogram of e2e request latency in seconds.", E2E_BOUNDS, NB(E2E_BOUNDS));
    /* vLLM's request phase histograms, with its request-latency buckets. */
    histo_init(&m->queue, "request_queue_time_seconds",
               "Histogram of time spent in WAITING phase for request.", E2E_BOUNDS, NB(E2E_BOUNDS));
    histo_init(&m->prefill, "request_prefill_time_seconds",
               "Histogram of time spent in PREFILL phase for request.", E2E_BOUNDS, NB(E2E_BOUNDS));
    histo_init(&m->decode, "request_decode_time_seconds",
               "Histogram of time spent in DECODE phase for request.", E2E_BOUNDS, NB(E2E_BOUNDS));
}

void metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_set_kv_ranks(srv_metrics *m, const server_config *cfg, engine *e) {
    m->kv_groups = engine_kv_n_groups(e);
    if (cfg->kv_ranks > 0 && cfg->kv_rank_block_bytes) {
        m->kv_ranks = cfg->kv_ranks < PP_MAX_RANKS ? cfg->kv_ranks : PP_MAX_RANKS;
        for (int r = 0; r < m->kv_ranks; r++)
            for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++)
                m->kv_rank_bytes[r][g] = cfg->kv_rank_block_bytes[r * MODEL_MAX_KV_GROUPS + g];
        return;
    }
    m->kv_ranks = 1;
    for (int g = 0; g < m->kv_groups; g++)
        m->kv_rank_bytes[0][g] = (int64_t)kv_pool_geometry(engine_kv_group(e, g))->block_bytes;
}

void histo_observe(histo *h, double v) {
    if (v < 0) v = 0;
    int b = 0;
    while (b < h->n_bounds && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}

/* suffix: "_total" for counters. In the text format 0.0.4 (what promtool
 * checks and prometheus_client writes) HELP and TYPE name the series exactly as
 * the samples do; a counter named without its _total is a second, untyped
 * metric to the parser. (OpenMetrics drops the suffix there; this is not it.) */
static void put_header(kvl_buf *o, const char *name, const char *suffix, const char *type,
                       const char *help) {
    kvl_buf_printf(o, "# HELP kvllm:%s%s %s\n# TYPE kvllm:%s%s %s\n", name, suffix, help, name,
                   suffix, type);
}

static void put_gauge(kvl_buf *o, const char *label, const char *name, const char *help, double v) {
    put_header(o, name, "", "gauge", help);
    kvl_buf_printf(o, "kvllm:%s{%s} %.17g\n", name, label, v);
}

/* Counters are exposed as NAME_total, as prometheus_client (and vLLM) do. */
static void put_counter(kvl_buf *o, const char *label, const char *name, const char *help,
                        double v) {
    put_header(o, name, "_total", "counter", help);
    kvl_buf_printf(o, "kvllm:%s_total{%s} %.17g\n", name, label, v);
}

static void put_histo(kvl_buf *o, const char *label, const histo *h) {
    put_header(o, h->name, "", "histogram", h->help);
    uint64_t cum = 0;
    for (int b = 0; b <= h->n_bounds; b++) {
        cum += h->counts[b];
        if (b < h->n_bounds)
            kvl_buf_printf(o, "kvllm:%s_bucket{%s,le=\"%g\"} %llu\n", h->name, label, h->bounds[b],
                           (unsigned long long)cum);
        else
            kvl_buf_printf(o, "kvllm:%s_bucket{%s,le=\"+Inf\"} %llu\n", h->name, label,
                           (unsigned long long)cum);
    }
    kvl_buf_printf(o, "kvllm:%s_sum{%s} %.17g\n", h->name, label, h->sum);
    kvl_buf_printf(o, "kvllm:%s_count{%s} %llu\n", h->name, label, (unsigned long long)h->count);
}

/* Label values escape backslash, quote and newline. */
static void model_label(const char *name, char *out, size_t cap) {
    size_t o = 0;
    const char *pre = "model_name=\"";
    for (const char *p = pre; *p && o + 1 < cap; p++) out[o++] = *p;
    for (const char *p = name; *p && o + 4 < cap; p++) {
        if (*p == '\\' || *p == '"') out[o++] = '\\';
        if (*p == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
            continue;
        }
        out[o++] = *p;
    }
    if (o + 1 < cap) out[o++] = '"';
    out[o] = 0;
}

/* One gauge or counter: a row of the tables below. */
typedef enum { GAUGE, COUNTER } metric_kind;
typedef struct {
    metric_kind kind;
    const char *name, *help;
    double value;
} metric_row;

static void put_rows(kvl_buf *o, const char *label, const metric_row *rows, int n) {
    for (int i = 0; i < n; i++) {
        if (rows[i].kind == COUNTER)
            put_counter(o, label, rows[i].name, rows[i].help, rows[i].value);
        else put_gauge(o, label, rows[i].name, rows[i].help, rows[i].value);
    }
}

/* KV bytes: every rank holds its layers' share of each block (the block
 * counts are the same on all), so the job's bytes are the ranks' sum. The
 * job's figures are gauges of their own, each rank's a family with a rank
 * label, so that neither sum counts anything twice. */
static void put_kv_bytes(kvl_buf *o, const char *label, const srv_metrics *m,
                         const engine_metrics *e) {
    static const struct {
        const char *job, *rank, *help;
    } NAMES[4] = {
        {"kv_cache_bytes", "kv_cache_rank_bytes", "Bytes of the KV pools (every block)"},
        {"kv_cache_used_bytes", "kv_cache_rank_used_bytes", "Bytes of KV blocks held by sequences"},
        {"kv_cache_cached_bytes", "kv_cache_rank_cached_bytes",
         "Bytes of KV blocks kept for the prefix cache only"},
        {"kv_block_bytes", "kv_block_rank_bytes", "Bytes of one KV block (of every group)"},
    };
    const int G = e->n_kv_groups < m->kv_groups ? e->n_kv_groups : m->kv_groups;
    double v[PP_MAX_RANKS][4], job[4] = {0};
    for (int r = 0; r < m->kv_ranks; r++) {
        for (int k = 0; k < 4; k++) v[r][k] = 0;
        for (int g = 0; g < G; g++) {
            const double bb = (double)m->kv_rank_bytes[r][g];
            v[r][0] += bb * (double)e->kv_group_blocks[g];
            v[r][1] += bb * (double)e->kv_group_used[g];
            v[r][2] += bb * (double)e->kv_group_cached[g];
            v[r][3] += bb;
        }
        for (int k = 0; k < 4; k++) job[k] += v[r][k];
    }
    char help[160];
    for (int k = 0; k < 4; k++) {
        snprintf(help, sizeof help, "%s, all pipeline ranks together.", NAMES[k].help);
        put_gauge(o, label, NAMES[k].job, help, job[k]);
    }
    for (int k = 0; k < 4; k++) {
        snprintf(help, sizeof help, "%s, on each pipeline rank (its layers' share).",
                 NAMES[k].help);
        put_header(o, NAMES[k].rank, "", "gauge", help);
        for (int r = 0; r < m->kv_ranks; r++)
            kvl_buf_printf(o, "kvllm:%s{%s,rank=\"%d\"} %.17g\n", NAMES[k].rank, label, r, v[r][k]);
    }
}

/* llama-server's own series, under its names (llamacpp:*, no labels), so its
 * dashboards read kvllm too. Its throughput gauges cover the requests
 * finished since the previous read, as llama-server's bucket does. Caller
 * holds m->mu. */
static void put_llama(kvl_buf *o, srv_metrics *m, const engine_metrics *e) {
    const struct {
        const char *name, *type, *help;
        double value;
    } rows[] = {
        {"prompt_tokens_total", "counter", "Number of prompt tokens processed.",
         (double)m->llama_prompt_tokens},
        {"prompt_seconds_total", "counter", "Prompt process time", m->llama_prompt_s},
        {"tokens_predicted_total", "counter", "Number of generation tokens processed.",
         (double)m->llama_gen_tokens},
        {"tokens_predicted_seconds_total", "counter", "Predict process time", m->llama_gen_s},
        {"n_decode_total", "counter", "Total number of llama_decode() calls", (double)e->steps},
        /* a gauge here (a maximum; llama-server types it a counter, which promtool's lint
         * refuses for a name without _total) */
        {"n_tokens_max", "gauge", "Largest observed n_tokens.", (double)e->step_tokens_max},
        {"prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
         m->bucket_prompt_s > 0 ? (double)m->bucket_prompt_tokens / m->bucket_prompt_s : 0},
        {"predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
         m->bucket_gen_s > 0 ? (double)m->bucket_gen_tokens / m->bucket_gen_s : 0},
        {"requests_processing", "gauge", "Number of requests processing.", (double)e->n_running},
        {"requests_deferred", "gauge", "Number of requests deferred.", (double)e->n_waiting},
        {"n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
         (double)e->step_seqs_total / (double)(e->steps > 0 ? e->steps : 1)},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        kvl_buf_printf(o, "# HELP llamacpp:%s %s\n# TYPE llamacpp:%s %s\nllamacpp:%s %.17g\n",
                       rows[i].name, rows[i].help, rows[i].name, rows[i].type, rows[i].name,
                       rows[i].value);
    m->bucket_prompt_tokens = m->bucket_gen_tokens = 0;
    m->bucket_prompt_s = m->bucket_gen_s = 0;
}

void metrics_render(srv_metrics *m, const char *model_name, kvl_buf *o) {
    char label[320];
    model_label(model_name, label, sizeof label);
    pthread_mutex_lock(&m->mu);
    const engine_metrics *e = &m->em;
    double usage =
        e->kv_blocks_total > 0 ? (double)e->kv_blocks_used / (double)e->kv_blocks_total : 0;
    const metric_row rows[] = {
        {GAUGE, "num_requests_running", "Number of requests in model execution batches.",
         (double)e->n_running},
        {GAUGE, "num_requests_waiting", "Number of requests waiting to be processed.",
         (double)e->n_waiting},
        {GAUGE, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage},
        {GAUGE, "kv_blocks_used", "KV blocks held by sequences.", (double)e->kv_blocks_used},
        {GAUGE, "kv_blocks_cached", "KV blocks kept for the prefix cache only.",
         (double)e->kv_blocks_cached},
        {GAUGE, "kv_blocks_free", "KV blocks free.", (double)e->kv_blocks_free},
        {COUNTER, "prefix_cache_queries",
         "Prefix cache queries, in terms of number of queried tokens.",
         (double)e->prefix_cache_queries},
        {COUNTER, "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
         (double)e->prefix_cache_hits},
        /* the disk tier (--kv-disk; zeros without one) */
        {GAUGE, "kv_disk_blocks", "KV blocks in the disk tier.", (double)e->kv_disk.blocks},
        {GAUGE, "kv_disk_bytes", "Bytes of the disk tier's block files.", (double)e->kv_disk.bytes},
        {COUNTER, "kv_disk_reads", "Block files read from the disk tier.",
         (double)e->kv_disk.reads},
        {COUNTER, "kv_disk_writes", "Block files written to the disk tier.",
         (double)e->kv_disk.writes},
        {COUNTER, "kv_disk_hits", "KV blocks loaded from the disk tier instead of recomputed.",
         (double)e->kv_disk.hits},
        {COUNTER, "kv_disk_dropped", "Evicted KV blocks not written: the writer's queue was full.",
         (double)e->kv_disk.dropped},
        {COUNTER, "kv_disk_corrupt", "Disk tier files deleted for a bad checksum, size or header.",
         (double)e->kv_disk.corrupt},
        {GAUGE, "kv_disk_pinned_blocks",
         "Disk tier blocks pinned by POST /v1/kv/save (kept from the size limit).",
         (double)e->kv_disk.pinned_blocks},
        {COUNTER, "kv_disk_loads",
         "Background reads of a waiting request's prefix from the disk tier.",
         (double)e->kv_disk.loads},
        {COUNTER, "kv_disk_loads_abandoned",
         "Background reads given up because their request was cancelled.",
         (double)e->kv_disk.loads_abandoned},
        {COUNTER, "num_preemptions", "Cumulative number of preemptions from the engine.",
         (double)e->n_preemptions},
        {COUNTER, "prompt_tokens", "Number of prefill tokens processed.", (double)e->prompt_tokens},
        {COUNTER, "generation_tokens", "Number of generation tokens processed.",
         (double)e->generation_tokens},
        /* speculative decoding (vLLM's names); acceptance rate = accepted / draft tokens */
        {COUNTER, "spec_decode_num_drafts",
         "Verifications of drafted tokens (speculative decoding).", (double)e->spec_drafts},
        {COUNTER, "spec_decode_num_draft_tokens",
         "Tokens drafted for verification (speculative decoding).", (double)e->spec_draft_tokens},
        {COUNTER, "spec_decode_num_accepted_tokens",
         "Drafted tokens the model accepted (speculative decoding).",
         (double)e->spec_accepted_tokens},
    };
    put_rows(o, label, rows, NB(rows));
    put_kv_bytes(o, label, m, e);
    put_header(o, "request_success", "_total", "counter",
               "Count of finished requests, by finish reason.");
    static const char *reasons[3] = {"stop", "length", "abort"};
    for (int i = 0; i < 3; i++)
        kvl_buf_printf(o, "kvllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", label,
                       reasons[i], (unsigned long long)m->success[i]);
    put_histo(o, label, &m->ttft);
    put_histo(o, label, &m->tpot);
    put_histo(o, label, &m->itl);
    put_histo(o, label, &m->e2e);
    put_histo(o, label, &m->queue);
    put_histo(o, label, &m->prefill);
    put_histo(o, label, &m->decode);
    put_llama(o, m, e);
    pthread_mutex_unlock(&m->mu);
}

/* The HTTP layer's counters (srv_conn.c, srv_engine.c's watch_clients). */
void metrics_render_conns(kvl_buf *o, const char *model_name, int open, long refused, long timeouts,
                          long evicted, long disconnects) {
    char label[320];
    model_label(model_name, label, sizeof label);
    const metric_row rows[] = {
        {GAUGE, "http_connections_open", "Open HTTP connections.", (double)open},
        {COUNTER, "http_connections_refused",
         "Connections answered 503 by the acceptor (over a connection limit, or draining).",
         (double)refused},
        {COUNTER, "http_request_timeouts",
         "Connections closed for not delivering a whole request within --request-timeout.",
         (double)timeouts},
        {COUNTER, "http_connections_evicted",
         "Connections still receiving a request after 1 s, closed to make room when every "
         "slot was taken.",
         (double)evicted},
        {COUNTER, "client_disconnects",
         "Requests cancelled because their client left before the end.", (double)disconnects},
    };
    put_rows(o, label, rows, NB(rows));
}

void metrics_render_memory(kvl_buf *o, const char *model_name, const model *mdl) {
    char label[320];
    model_label(model_name, label, sizeof label);
    const kvl_mem_status st = kvl_mem_status_at("");
    const int64_t data = (int64_t)gguf_tensor_data_bytes(model_gguf(mdl)),
                  repacked = model_hp(mdl)->repacked_bytes;
    const metric_row rows[] = {
        {GAUGE, "memory_available_bytes",
         "Memory the process may still take: MemAvailable, or less under a memory cgroup's "
         "limit (-1: unknown).",
         (double)st.available},
        {GAUGE, "memory_cgroup_limit_bytes",
         "The tightest memory cgroup limit over the process (-1: none).", (double)st.cgroup_limit},
        {GAUGE, "process_resident_bytes", "Resident memory of this process (VmRSS; -1: unknown).",
         (double)kvl_resident_bytes()},
        {GAUGE, "weights_repacked_bytes",
         "Weights copied into the kernels' layout at load (anonymous memory).", (double)repacked},
        {GAUGE, "weights_mapped_bytes",
         "Weights read through the file mapping (page cache): those not repacked, all of them "
         "where the copy did not fit in memory.",
         (double)(data > repacked ? data - repacked : 0)},
    };
    put_rows(o, label, rows, NB(rows));
}

void metrics_prefix(const kvl_buf *in, const char *prefix, kvl_buf *out) {
    static const char OURS[] = "kvllm:";
    const size_t n = sizeof OURS - 1;
    for (const char *line = in->p ? in->p : "", *end; *line; line = end) {
        end = strchr(line, '\n');
        end = end ? end + 1 : line + strlen(line);
        const size_t at =
            strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0 ? 7 : 0;
        if (strncmp(line + at, OURS, n) == 0) {
            kvl_buf_put(out, line, at);
            kvl_buf_printf(out, "%s:", prefix);
            kvl_buf_put(out, line + at + n, (size_t)(end - line) - at - n);
        } else {
            kvl_buf_put(out, line, (size_t)(end - line));
        }
    }
}
