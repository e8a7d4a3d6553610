/* kvllm bench: prefill and decode speed through the real engine (scheduler,
 * paged KV, sampling), measured the way llama-bench / llama-batched-bench
 * measure them, so the figures can be put side by side:
 *   prefill  one request of -p tokens; time from submit to its first token
 *   decode   -n tokens after a short prompt (--decode-prompt); time per token
 *            after the first. With --decode-prompt equal to -p, the prefill's
 *            request itself continues to -n tokens, as in llama-batched-bench
 *   --batch  B sequences decoding together; aggregate tokens/s once all of
 *            them have their first token (distinct random prompts, so the
 *            prefix cache never shares anything)
 *   --context-sweep  decode cost per token at several context lengths, with
 *            the KV cache and without it (recompute), as CSV and SVG
 *   --membw  memory read bandwidth, the roofline for decode: the better of a
 *            probe before the runs and one after them
 *   --membw-steps  also a short probe after every timed decoding step of the
 *            prefill and decode tests (not counted in the step's time): the
 *            bandwidth of the same seconds as the decode, a steadier
 *            roofline on a machine whose bandwidth moves minute to minute
 * Every figure is the mean +- sd over -r repetitions, after one warm-up that
 * pages the weights in. Decode is reported with the bytes of weights read per
 * decoding step (all weight matrices once per step) and the implied GB/s, and
 * also with the KV cache's reads added (the text table's "with KV" column;
 * kv_read_bytes_per_token and roofline_read_pct in the JSON; calculated from
 * the context of each step: at long contexts attention reads more than the
 * weights).
 * The memory-bandwidth probe and the sweep's CSV/SVG files are in
 * cmd_bench_sweep.c; this file holds the options, the engine runs, the
 * repetition statistics and the JSON/text report, which all share them. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd_bench.h"
#include "kernels.h"
#include "kvl_pool.h"

#include <omp.h>

#define MAX_LIST 16

typedef struct bench_args {
    int64_t n_prefill, n_decode; /* -p, -n (0: skip that test) */
    int reps;                    /* -r */
    int64_t decode_prompt;       /* prompt length before decode and batched decode */
    int64_t batch[MAX_LIST];     /* --batch, always starting with 1 */
    int n_batch;
    int64_t sweep[MAX_LIST]; /* --context-sweep */
    int n_sweep;
    int64_t sweep_tokens;    /* tokens decoded at each sweep point with the cache */
    double nocache_budget_s; /* time allowed to the whole no-cache sweep */
    const char *out;         /* --out PREFIX for the sweep's .csv and .svg */
    bool membw, membw_steps;
    int64_t membw_mb, membw_step_mb;
    bool progress;
    bool warmup;     /* --no-warmup: false */
    bool reps_given; /* -r given (llama-bench's way defaults to 5) */
    bool kvllm_only; /* a flag of kvllm's own report (named in kvllm_flag) */
    const char *kvllm_flag;
    bench_matrix mx; /* -p, -n, -t as lists, -pg, -d, -o, -oe, --progress, --delay */
    bool matrix;     /* llama-bench's way (cmd_bench_matrix.c) */
} bench_args;

/* ------------------------------------------------------------ flags -- */

static bool parse_int(const char *flag, const char *v, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo) {
        fprintf(stderr, "kvllm bench: %s: expected an integer >= %lld\n", flag, (long long)lo);
        return false;
    }
    *out = x;
    return true;
}

/* "1,4,16" -> values (each >= 1). */
static bool parse_list(const char *flag, const char *v, int64_t *out, int *n) {
    *n = 0;
    for (const char *p = v; p && *p;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < 1 || *n == MAX_LIST || (*end && *end != ',')) {
            fprintf(stderr, "kvllm bench: %s: expected up to %d positive integers like 1,4,16\n",
                    flag, MAX_LIST);
            return false;
        }
        out[(*n)++] = x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) fprintf(stderr, "kvllm bench: %s: expected a list like 1,4,16\n", flag);
    return *n > 0;
}

/* Batch 1 always runs first: it is the single-sequence decode figure. */
static void batch_with_one(bench_args *a) {
    int at = 0;
    while (at < a->n_batch && a->batch[at] != 1) at++;
    if (at == a->n_batch && a->n_batch == MAX_LIST) at--; /* full: the last one gives way */
    else if (at == a->n_batch) a->n_batch++;
    memmove(a->batch + 1, a->batch, (size_t)at * sizeof a->batch[0]);
    a->batch[0] = 1;
}

/* A flag of kvllm's own report, which llama-bench's way has no place for. */
static void kvllm_own(bench_args *a, const char *f) {
    a->kvllm_only = true;
    if (!a->kvllm_flag) a->kvllm_flag = f;
}

/* llama-bench's -o / -oe formats. */
static bool parse_format(const char *f, const char *v, bench_format *out) {
    static const char *const names[] = {"md", "csv", "json", "jsonl", "sql"};
    for (int i = 0; v && i < 5; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = (bench_format)(BENCH_FMT_MD + i);
            return true;
        }
    fprintf(stderr, "kvllm bench: %s: csv, json, jsonl, md or sql\n", f);
    return false;
}

/* -pg PP,TG (llama-bench's prompt-then-generation test), appended. */
static bool parse_pg(const char *f, const char *v, bench_matrix *mx) {
    char *end1 = NULL, *end2 = NULL;
    long long pp = v ? strtoll(v, &end1, 10) : -1, tg = -1;
    if (end1 && end1 != v && *end1 == ',') tg = strtoll(end1 + 1, &end2, 10);
    if (pp < 0 || tg < 0 || !end2 || end2 == end1 + 1 || *end2 || mx->n_pg == BENCH_MAX_LIST) {
        fprintf(stderr, "kvllm bench: %s: expected PP,TG (two integers >= 0, like 512,128)\n", f);
        return false;
    }
    mx->pg[mx->n_pg][0] = pp;
    mx->pg[mx->n_pg++][1] = tg;
    return true;
}

/* bench_list_parse for values that must be >= 1 (why: the refusal's words). */
static bool positive_list(const char *f, const char *v, bench_list *l, const char *why) {
    if (!bench_list_parse(f, v, l)) return false;
    for (int i = 0; i < l->n; i++)
        if (l->v[i] < 1) {
            fprintf(stderr, "kvllm bench: %s: %s\n", f, why);
            return false;
        }
    return true;
}

/* -m: a path, or llama-bench's comma list, appended. */
static bool parse_models(const char *f, const char *v, bench_matrix *mx) {
    for (const char *p = v; p && *p;) {
        const size_t l = strcspn(p, ",");
        char *path = l ? strndup(p, l) : NULL; /* freed by cmd_bench */
        if (!path || mx->n_models == BENCH_MAX_LIST) {
            fprintf(stderr, "kvllm bench: %s: expected up to %d paths, comma-separated\n", f,
                    BENCH_MAX_LIST);
            free(path);
            return false;
        }
        mx->models[mx->n_models++] = path;
        p += l + (p[l] == ',');
    }
    if (!v || !*v) fprintf(stderr, "kvllm bench: %s: expected a model file\n", f);
    return v && *v;
}

/* -ctk / -ctv: a cache type, or llama-bench's comma list, appended. */
static bool parse_kv_types(const char *f, const char *v, int *types, int *n) {
    for (const char *p = v; p && *p;) {
        const size_t l = strcspn(p, ",");
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(l < 31 ? l : 31), p);
        if (*n == BENCH_MAX_LIST || !cli_parse_kv_type(f, name, &types[*n])) return false;
        (*n)++;
        p += l + (p[l] == ',');
    }
    if (!v || !*v) fprintf(stderr, "kvllm bench: %s: expected a cache type\n", f);
    return v && *v;
}

/* llama-bench's flags that take 0 / 1 (or a list of them) where llama-server's
 * are switches: what each means here. "1" refused where it would measure
 * something else (-embd 1: embeddings, not generation). */
static const struct {
    const char *flag, *alias, *note;
    bool one_refused;
} ZERO_ONE[] = {
    {"-mmp", "--mmap", "weights are repacked into memory at load (or mapped where they do not fit)",
     false},
    {"-dio", "--direct-io", "the model file is read through the page cache", false},
    {"-nkvo", "--no-kv-offload", "no GPU here: the KV cache is in host memory", false},
    {"-nopo", "--no-op-offload", "no GPU here: every operation runs on the CPU", false},
    {"--no-host", NULL, "no GPU here: every buffer is in host memory", false},
    {"--cpu-strict", NULL, "kvllm's compute threads are placed by the OS", false},
    {"-embd", "--embeddings", "kvllm bench measures generation; embeddings are not benchmarked",
     true},
};

/* One of ZERO_ONE with its value (0, 1 or a list of them): 2, or -1 after saying why. */
static int zero_one_flag(const char *f, const char *v) {
    for (size_t i = 0; i < sizeof ZERO_ONE / sizeof ZERO_ONE[0]; i++) {
        if (strcmp(f, ZERO_ONE[i].flag) && (!ZERO_ONE[i].alias || strcmp(f, ZERO_ONE[i].alias)))
            continue;
        bool one = false, ok = v && *v;
        for (const char *p = v; ok && *p; p += *p == ',') {
            ok = (*p == '0' || *p == '1') && (p[1] == ',' || !p[1]);
            one = one || *p == '1';
            p++;
        }
        if (!ok) fprintf(stderr, "kvllm bench: %s: 0 or 1 (or a list of them)\n", f);
        else if (one && ZERO_ONE[i].one_refused)
            fprintf(stderr, "kvllm bench: %s 1: %s\n", f, ZERO_ONE[i].note);
        else fprintf(stderr, "kvllm: note: %s: %s\n", f, ZERO_ONE[i].note);
        return ok && !(one && ZERO_ONE[i].one_refused) ? 2 : -1;
    }
    return 0;
}

static int bench_switch(bench_args *a, const char *f) {
    if (strcmp(f, "--membw") == 0) a->membw = true;
    else if (strcmp(f, "--membw-steps") == 0) a->membw = a->membw_steps = true;
    else if (strcmp(f, "--no-progress") == 0) a->progress = false;
    else if (strcmp(f, "--no-warmup") == 0) a->warmup = false;
    else if (strcmp(f, "--progress") == 0) a->mx.progress = a->mx.out_given = true;
    else return 0;
    if (strncmp(f, "--membw", 7) == 0) kvllm_own(a, f);
    return 1;
}

static int bench_flag(const char *f, const char *v, void *ctx) {
    bench_args *a = ctx;
    int64_t x = 0;
    int sw = bench_switch(a, f);
    if (sw) return sw;
    if ((sw = zero_one_flag(f, v))) return sw;
    if (!strcmp(f, "-fa") || !strcmp(f, "--flash-attn")) { /* llama-bench's: a list too */
        static const char *const ok[] = {"0", "1", "on", "off", "auto"};
        for (const char *p = v; p && *p;) {
            const size_t l = strcspn(p, ",");
            bool known = false;
            for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
                known = known || (strlen(ok[i]) == l && !strncmp(p, ok[i], l));
            if (!known) {
                fprintf(stderr, "kvllm bench: %s: on, off, auto, 1 or 0 (or a list of them)\n", f);
                return -1;
            }
            p += l + (p[l] == ',');
        }
        if (!v || !*v) return -1;
        fprintf(stderr,
                "kvllm: note: %s: attention is kvllm's own kernel over the paged cache "
                "(what llama.cpp's -fa off computes): every value runs the same\n",
                f);
        return 2;
    }
#define IS(name) (strcmp(f, name) == 0)
    if (IS("-p") || IS("--n-prompt")) return bench_list_parse(f, v, &a->mx.prompt) ? 2 : -1;
    if (IS("-n") || IS("--n-gen")) return bench_list_parse(f, v, &a->mx.gen) ? 2 : -1;
    if (IS("-d") || IS("--n-depth")) return bench_list_parse(f, v, &a->mx.depth) ? 2 : -1;
    if (IS("-t") || IS("--threads"))
        return positive_list(f, v, &a->mx.threads, "at least one thread") ? 2 : -1;
    if (IS("-pg")) return parse_pg(f, v, &a->mx) ? 2 : -1;
    if (IS("-m") || IS("--model")) return parse_models(f, v, &a->mx) ? 2 : -1;
    if (IS("-b") || IS("--batch-size"))
        return positive_list(f, v, &a->mx.batch, "at least one token") ? 2 : -1;
    if (IS("-ctk") || IS("--cache-type-k") || IS("-ctv") || IS("--cache-type-v")) {
        const bool k = IS("-ctk") || IS("--cache-type-k");
        return parse_kv_types(f, v, k ? a->mx.type_k : a->mx.type_v,
                              k ? &a->mx.n_type_k : &a->mx.n_type_v)
                   ? 2
                   : -1;
    }
    if (IS("-o") || IS("--output") || IS("-oe") || IS("--output-err")) {
        a->mx.out_given = true;
        return parse_format(f, v, IS("-o") || IS("--output") ? &a->mx.out : &a->mx.out_err) ? 2
                                                                                            : -1;
    }
    if (IS("--delay")) {
        a->mx.out_given = true;
        return parse_int(f, v, 0, &a->mx.delay_s) ? 2 : -1;
    }
    if (IS("--decode-prompt") || IS("--sweep-tokens") || IS("--membw-mb") ||
        IS("--membw-step-mb") || IS("--batch") || IS("--context-sweep") || IS("--out") ||
        IS("--no-cache-budget"))
        kvllm_own(a, f);
    if (IS("--decode-prompt")) return parse_int(f, v, 1, &a->decode_prompt) ? 2 : -1;
    if (IS("--sweep-tokens")) return parse_int(f, v, 2, &a->sweep_tokens) ? 2 : -1;
    if (IS("--membw-mb")) return parse_int(f, v, 1, &a->membw_mb) ? 2 : -1;
    if (IS("--membw-step-mb")) return parse_int(f, v, 4, &a->membw_step_mb) ? 2 : -1;
    if (IS("--batch")) return parse_list(f, v, a->batch, &a->n_batch) ? 2 : -1;
    if (IS("--context-sweep")) return parse_list(f, v, a->sweep, &a->n_sweep) ? 2 : -1;
    if (IS("--out")) {
        a->out = v;
        return v ? 2 : -1;
    }
    if (IS("-r") || IS("--repetitions")) {
        a->reps_given = true;
        if (!parse_int(f, v, 1, &x)) return -1;
        a->reps = x > 1000 ? 1000 : (int)x;
        return 2;
    }
    if (IS("--no-cache-budget")) {
        if (!parse_int(f, v, 0, &x)) return -1;
        a->nocache_budget_s = (double)x;
        return 2;
    }
#undef IS
    return 0;
}

void cmd_bench_usage(FILE *out) {
    fprintf(out,
            "usage: kvllm bench -m MODEL [-p 512] [-n 128] [-r 3] [-t N] [--batch 1,4,16]\n"
            "                   [--decode-prompt 16] [--kv-type f16|...] [--json]\n"
            "                   [--context-sweep 128,512,2048 [--sweep-tokens 16] "
            "[--no-cache-budget 120]\n"
            "                    [--out PREFIX]] [--membw [--membw-mb 1024]]\n"
            "                   [--membw-steps [--membw-step-mb 256]] [--no-progress] "
            "[--no-warmup]\n"
            "       kvllm bench --membw        (memory read bandwidth only)\n"
            "  llama-bench's way: kvllm bench -m MODEL[,MODEL] [-p 512] [-n 128] [-pg PP,TG]\n"
            "                   [-d 0] [-t N] [-b 2048] [-ctk f16] [-ctv f16] [-r 5]\n"
            "                   [-o md|csv|json|jsonl|sql] [-oe FORMAT] [--progress] [--delay S]\n"
            "    taken whenever -o, -oe, -pg, -d, --progress or --delay is given, or -p, -n,\n"
            "    -t, -m, -b, -ctk or -ctv has several values (\"128,512\", \"128-512*2\",\n"
            "    \"1-4+1\", or the flag again):\n"
            "    one test per value (pp: the prompt, tg: tokens one at a time, pp+tg: both;\n"
            "    \"@ dN\": after N tokens already in the cache, reused through the prefix "
            "cache),\n"
            "    each a row of llama-bench's table (md, the default) or record.\n");
}

/* ---------------------------------------------------------- progress -- */

/* On a terminal: one line on stderr, redrawn at most 10 times a second.
 * Otherwise (a log file): one line as each run starts. */
typedef struct progress {
    bool on, tty;
    int run, n_runs;
    double t0, last;
    char label[96];
} progress;

static void prog_draw(progress *p, int64_t done, int64_t total) {
    double now = kvl_time_s();
    if (!p->on || !p->tty || now - p->last < 0.1) return;
    p->last = now;
    int width = 24, filled = p->n_runs ? width * p->run / p->n_runs : 0;
    char cells[32];
    for (int i = 0; i < width; i++) cells[i] = i < filled ? '#' : '.';
    cells[width] = 0;
    fprintf(stderr, "\r\033[K[%s] %d/%d %s  %lld/%lld tok  %.0f s", cells, p->run, p->n_runs,
            p->label, (long long)done, (long long)total, now - p->t0);
}

static void prog_next(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void prog_next(progress *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->label, sizeof p->label, fmt, ap);
    va_end(ap);
    p->run++;
    p->last = 0;
    if (p->on && !p->tty)
        fprintf(stderr, "kvllm bench: [%d/%d] %s (%.0f s)\n", p->run, p->n_runs, p->label,
                kvl_time_s() - p->t0);
    prog_draw(p, 0, 0);
}

static void prog_end(progress *p) {
    if (p->on && p->tty) fprintf(stderr, "\r\033[K");
}

/* ------------------------------------------------------------- stats -- */

typedef struct samples {
    double v[1000];
    int n;
} samples;

double bench_mean(const double *v, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    return n ? sum / n : 0;
}

double bench_sd(const double *v, int n) {
    if (n < 2) return 0;
    double m = bench_mean(v, n), ss = 0;
    for (int i = 0; i < n; i++) ss += (v[i] - m) * (v[i] - m);
    return sqrt(ss / (n - 1));
}

static double samples_mean(const samples *s) { return bench_mean(s->v, s->n); }
static double samples_sd(const samples *s) { return bench_sd(s->v, s->n); }

/* ------------------------------------------------------------ the bench -- */

typedef struct bench {
    const bench_args *a;
    const cli_opts *o;
    cli_model cm;
    progress prog;
    uint64_t rng;
    size_t weights_per_step;  /* bytes of weights one forward pass reads */
    double kv_read_per_token; /* bytes of K and V one decoding step's attention reads, per
                               * sequence: the mean over the timed steps (0: not known) */
    step_probe *probe;        /* --membw-steps: read after every timed step of the decode tests */
} bench;

typedef struct batch_result {
    int64_t batch;
    samples tps;                 /* aggregate decode tokens/s */
    double probe_bytes, probe_s; /* --membw-steps: read between this test's steps, and when */
    double routed_bytes, tokens; /* routed-expert bytes read in the timed steps, their tokens */
} batch_result;

typedef struct results {
    samples prefill_tps;
    batch_result batch[MAX_LIST];
    sweep_point sweep[MAX_LIST];
    double membw_gbps;
} results;

/* Weights a decoding step reads: every tensor once, except an untied token
 * embedding, of which only the looked-up rows are read. A mixture-of-experts
 * model reads only the selected experts: one token's worth is counted (a
 * batch's tokens may select more, so batched figures are lower bounds;
 * measured_bytes_per_token has what they did select). */
static size_t weights_per_step(const model *m) {
    return model_hparams_read_bytes(model_gguf(m), model_hp(m));
}

/* K and V bytes the attention of one decoding step reads for one sequence,
 * the mean over the timed steps of the decode test: the step after the
 * first token attends over P + k positions (k = 1 .. n - 1), and reads the
 * KV cache's lower bound at that length (kv_plan: every layer's K and V rows
 * as stored, sliding and chunked layers only their window; MLA the latent).
 * Calculated, not measured; 0 when the planner cannot describe the model. */
static double kv_read_per_token(const model *m, const cli_opts *o, int64_t prompt, int64_t n) {
    kv_plan_model pm;
    kvl_error err = {0};
    int dk, dv = -1;
    if (n < 2 || !model_hparams_plan_model(model_hp(m), &pm, &err) ||
        !kv_plan_dtype_parse(kv_dtype_name(o->kv_dtype), &dk) ||
        (o->kv_dtype_v >= 0 && !kv_plan_dtype_parse(kv_dtype_name(o->kv_dtype_v), &dv)))
        return 0;
    double sum = 0;
    for (int64_t k = 1; k < n; k++) {
        const kv_plan_request r = {.context = prompt + k,
                                   .concurrency = 1,
                                   .dtype = dk,
                                   .split_v = dv >= 0,
                                   .dtype_v = dv >= 0 ? dv : dk,
                                   .block_size = 16};
        kv_plan p;
        if (!kv_plan_compute(&pm, &r, &p, &err)) return 0;
        sum += (double)p.seq_lower_bound_bytes;
    }
    return sum / (double)(n - 1);
}

/* --------------------------------------------------------- one run -- */

typedef struct run_state {
    int n_seqs, n_first, n_done;
    int64_t base_id, n_tokens;
    bool first[256];
    double prefill_s; /* longest submit-to-first-token */
} run_state;

static void on_event(const engine_event *ev, void *user) {
    run_state *st = user;
    int64_t k = ev->request_id - st->base_id;
    if (ev->token >= 0) {
        st->n_tokens++;
        if (k >= 0 && k < st->n_seqs && !st->first[k]) {
            st->first[k] = true;
            st->n_first++;
        }
    }
    if (ev->finish == ENGINE_FINISH_NONE) return;
    st->n_done++;
    if (ev->stats->t_prefill_s > st->prefill_s) st->prefill_s = ev->stats->t_prefill_s;
}

typedef struct run_result {
    double prefill_s;            /* time to the first token (longest over the sequences) */
    int64_t dec_tokens;          /* tokens generated after every sequence had its first */
    double dec_s;                /* their time, less the probes' */
    double probe_bytes, probe_s; /* read by the probes between the steps (--membw-steps) */
    double routed_bytes;         /* routed-expert weights read by the timed steps (measured) */
} run_result;

engine_request bench_request(const int32_t *ids, int64_t n, int64_t max_tokens,
                             engine_event_fn on_event, void *user) {
    engine_request r = {.prompt = ids,
                        .n_prompt = n,
                        .max_tokens = max_tokens,
                        .ignore_eos = true,
                        .on_event = on_event,
                        .user = user};
    sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    return r;
}

void bench_random_ids(uint64_t *rng, int64_t n_vocab, int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        ids[i] = (int32_t)(*rng % (uint64_t)n_vocab);
    }
}

static bool submit_all(bench *b, engine *e, run_state *st, int64_t n_prompt, int64_t max_tokens) {
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    if (!ids) return false;
    const engine_request r = bench_request(ids, n_prompt, max_tokens, on_event, st);
    kvl_error err = {{0}};
    bool ok = true;
    for (int s = 0; ok && s < st->n_seqs; s++) {
        bench_random_ids(&b->rng, model_hp(b->cm.m)->n_vocab, ids, n_prompt); /* fresh */
        int64_t id = engine_submit(e, &r, &err);
        if (s == 0) st->base_id = id;
        ok = id >= 0 || (fprintf(stderr, "kvllm bench: %s\n", err.msg), false);
    }
    free(ids);
    return ok;
}

/* Runs n_seqs requests of n_prompt random tokens and max_tokens outputs to the
 * end; with a probe (the prefill and decode tests under --membw-steps), it
 * reads after every timed step. */
static bool run_requests(bench *b, engine *e, int n_seqs, int64_t n_prompt, int64_t max_tokens,
                         step_probe *probe, run_result *r) {
    run_state st = {.n_seqs = n_seqs};
    if (n_seqs > (int)sizeof st.first || !submit_all(b, e, &st, n_prompt, max_tokens)) return false;
    double t_all = 0, probe_s = 0;
    int64_t tok_at = 0, total = (int64_t)n_seqs * max_tokens, probes = 0;
    uint64_t routed_at = 0;
    kvl_error err = {{0}};
    while (st.n_done < n_seqs) {
        if (!engine_step(e, &err)) {
            fprintf(stderr, "kvllm bench: %s\n", err.msg);
            return false;
        }
        if (t_all == 0 && st.n_first == n_seqs) {
            t_all = kvl_time_s();
            tok_at = st.n_tokens;
            routed_at = model_moe_routed_bytes(b->cm.m);
        } else if (t_all > 0 && probe) { /* after a timed step */
            probe_s += bench_step_probe_run(probe);
            probes++;
        }
        prog_draw(&b->prog, st.n_tokens, total);
    }
    r->prefill_s = st.prefill_s;
    r->dec_tokens = st.n_tokens - tok_at;
    r->dec_s = kvl_time_s() - t_all - probe_s;
    r->probe_s = probe_s;
    r->probe_bytes = probe ? (double)probes * (double)bench_step_probe_bytes(probe) : 0;
    r->routed_bytes = (double)(model_moe_routed_bytes(b->cm.m) - routed_at);
    return true;
}

engine *bench_engine_new(const cli_opts *o, const cli_model *cm, int max_seqs, int64_t n_ctx,
                         int64_t batch_tokens, int64_t n_blocks, bool no_cache) {
    engine_config ec;
    engine_config_default(&ec);
    ec.n_ctx = n_ctx;
    ec.block_size = o->block_size;
    ec.kv_dtype = o->kv_dtype;
    ec.kv_dtype_v = o->kv_dtype_v;
    ec.max_seqs = max_seqs;
    ec.n_blocks = n_blocks;
    ec.max_batch_tokens = batch_tokens > o->batch_tokens ? batch_tokens : o->batch_tokens;
    ec.no_kv_cache = no_cache;
    ec.step_groups = cli_step_groups(o);
    kvl_error err = {{0}};
    engine *e = engine_create(cm->m, cm->vocab, &ec, &err);
    if (!e) fprintf(stderr, "kvllm bench: %s\n", err.msg);
    return e;
}

static engine *make_engine(bench *b, int max_seqs, int64_t n_prompt, int64_t max_tokens,
                           bool no_cache) {
    /* All prompts in one step, so every sequence starts decoding together;
     * without the cache, a whole sequence in one step, since a recompute cut
     * into chunks would be started over at every step. */
    int64_t all = no_cache ? n_prompt + max_tokens : (int64_t)max_seqs * n_prompt;
    return bench_engine_new(b->o, &b->cm, max_seqs, n_prompt + max_tokens + 1, all, 0, no_cache);
}

/* One engine, one request per repetition (or a batch of them); no probes
 * between its steps (the warm-up and the context sweep). */
static bool run_once(bench *b, int n_seqs, int64_t n_prompt, int64_t max_tokens, bool no_cache,
                     run_result *r) {
    engine *e = make_engine(b, n_seqs, n_prompt, max_tokens, no_cache);
    bool ok = e && run_requests(b, e, n_seqs, n_prompt, max_tokens, NULL, r);
    engine_destroy(e);
    return ok;
}

/* ------------------------------------------------------------ phases -- */

/* When the decode prompt is the prefill length, one request gives both
 * figures (as in llama-batched-bench): its TTFT and its tokens after the first. */
static bool fused_single(const bench_args *a) {
    return a->n_prefill > 0 && a->decode_prompt == a->n_prefill && a->n_decode > 1;
}

static void batch_add(batch_result *br, const run_result *r) {
    br->tps.v[br->tps.n++] = (double)r->dec_tokens / r->dec_s;
    br->probe_bytes += r->probe_bytes;
    br->probe_s += r->probe_s;
    br->routed_bytes += r->routed_bytes;
    br->tokens += (double)r->dec_tokens;
}

static bool phase_prefill(bench *b, results *res) {
    const bench_args *a = b->a;
    int64_t n_out = fused_single(a) ? a->n_decode : 1;
    engine *e = make_engine(b, 1, a->n_prefill, n_out, false);
    bool ok = e != NULL;
    for (int rep = 0; ok && rep < a->reps; rep++) {
        prog_next(&b->prog, "prefill %lld, rep %d/%d", (long long)a->n_prefill, rep + 1, a->reps);
        run_result r;
        ok = run_requests(b, e, 1, a->n_prefill, n_out, b->probe, &r);
        if (ok) res->prefill_tps.v[res->prefill_tps.n++] = a->n_prefill / r.prefill_s;
        batch_result *dec = &res->batch[0]; /* batch 1 */
        if (ok && n_out > 1 && r.dec_s > 0) batch_add(dec, &r);
    }
    engine_destroy(e);
    return ok;
}

static bool phase_decode(bench *b, results *res) {
    const bench_args *a = b->a;
    bool ok = true;
    for (int i = 0; ok && i < a->n_batch; i++) {
        int B = (int)a->batch[i];
        batch_result *br = &res->batch[i];
        br->batch = B;
        if (B == 1 && fused_single(a)) continue; /* measured with the prefill */
        engine *e = make_engine(b, B, a->decode_prompt, a->n_decode, false);
        ok = e != NULL;
        for (int rep = 0; ok && rep < a->reps; rep++) {
            prog_next(&b->prog, "decode %lld x%d, rep %d/%d", (long long)a->n_decode, B, rep + 1,
                      a->reps);
            run_result r;
            ok = run_requests(b, e, B, a->decode_prompt, a->n_decode, b->probe, &r);
            if (ok && r.dec_s > 0) batch_add(br, &r);
        }
        engine_destroy(e);
    }
    return ok;
}

/* With the cache: --sweep-tokens decoded after a prompt of N. Without it,
 * every token recomputes the whole prefix, so two tokens after the first are
 * enough; points whose estimate (from the cached run's prefill time) would
 * overrun the budget are skipped and reported as such. */
static bool phase_sweep(bench *b, results *res) {
    const bench_args *a = b->a;
    double spent = 0;
    for (int i = 0; i < a->n_sweep; i++) {
        sweep_point *sp = &res->sweep[i];
        sp->ctx = a->sweep[i];
        run_result r;
        prog_next(&b->prog, "context %lld, KV cache", (long long)sp->ctx);
        if (!run_once(b, 1, sp->ctx, a->sweep_tokens, false, &r)) return false;
        sp->cache_ms = r.dec_s * 1e3 / (double)r.dec_tokens;
        sp->nocache_est_s = 3 * r.prefill_s;
        sp->nocache_ms = -1;
        prog_next(&b->prog, "context %lld, no KV cache", (long long)sp->ctx);
        if (spent + sp->nocache_est_s > a->nocache_budget_s) continue;
        double t0 = kvl_time_s();
        if (!run_once(b, 1, sp->ctx, 3, true, &r)) return false;
        spent += kvl_time_s() - t0;
        sp->nocache_ms = r.dec_s * 1e3 / (double)r.dec_tokens;
    }
    return true;
}

/* Pages the weights in and starts the thread team before anything is timed. */
static bool phase_warmup(bench *b) {
    prog_next(&b->prog, "warm-up");
    run_result r;
    return run_once(b, 1, 8, 4, false, &r);
}

/* ------------------------------------------------------------ output -- */

/* The weight mix by name: general.file_type's (llama-quantize's name), else
 * the type most tensors have. */
static const char *model_type_name(const gguf_file *f) {
    uint32_t ft;
    if (gguf_get_u32(f, "general.file_type", &ft) && gguf_file_type_name(ft))
        return gguf_file_type_name(ft);
    return gguf_dtype_name(gguf_commonest_dtype(f));
}

static double batch_gbps(const bench *b, const batch_result *br) {
    return (double)b->weights_per_step * samples_mean(&br->tps) / (double)br->batch / 1e9;
}

/* Bytes a decoding step reads per token with the KV cache's reads: the
 * weights once per step shared by the batch, each sequence its own KV. */
static double read_bytes_per_token(const bench *b, const batch_result *br) {
    return (double)b->weights_per_step / (double)br->batch + b->kv_read_per_token;
}

/* The GB/s a test read with the KV cache's reads added (0: those not known). */
static double read_gbps(const bench *b, const batch_result *br) {
    return b->kv_read_per_token > 0 ? read_bytes_per_token(b, br) * samples_mean(&br->tps) / 1e9
                                    : 0;
}

/* --membw-steps: the bandwidth the probes between this test's steps read (0: none). */
static double steps_membw(const batch_result *br) {
    return br->probe_s > 0 ? br->probe_bytes / br->probe_s / 1e9 : 0;
}

/* The test's roofline shares against the probes between its steps:
 * membw_between_steps_gb_per_s, roofline_between_steps_pct (weights) and,
 * with the KV cache's reads known, roofline_read_between_steps_pct. */
static void json_steps_roofline(cJSON *e, const bench *b, const batch_result *br) {
    const double bw = steps_membw(br);
    if (bw <= 0) return;
    cJSON_AddNumberToObject(e, "membw_between_steps_gb_per_s", bw);
    cJSON_AddNumberToObject(e, "roofline_between_steps_pct", 100 * batch_gbps(b, br) / bw);
    if (b->kv_read_per_token <= 0) return;
    cJSON_AddNumberToObject(e, "roofline_read_between_steps_pct", 100 * read_gbps(b, br) / bw);
}

/* The decode figures with the KV cache's reads added to the weights'
 * (read_bytes_per_token): kv_read_bytes_per_token (calculated),
 * read_bytes_per_token, read_gb_per_s and, with a probe, roofline_read_pct. */
static void json_kv_read(cJSON *e, const bench *b, const batch_result *br, const results *res) {
    if (b->kv_read_per_token <= 0) return;
    const double bytes = read_bytes_per_token(b, br), gbps = read_gbps(b, br);
    cJSON_AddNumberToObject(e, "kv_read_bytes_per_token", b->kv_read_per_token);
    cJSON_AddNumberToObject(e, "read_bytes_per_token", bytes);
    cJSON_AddNumberToObject(e, "read_gb_per_s", gbps);
    if (res->membw_gbps > 0)
        cJSON_AddNumberToObject(e, "roofline_read_pct", 100 * gbps / res->membw_gbps);
}

/* A mixture-of-experts model's weights per decoded token as measured: the
 * rest of the weights once a step, shared by the batch's tokens, plus the
 * routed experts the steps' routing selected (a batch's tokens select more
 * experts than one token's active_bytes counts, and share those they pick
 * alike). 0 for a dense model. */
static double measured_bytes_per_token(const bench *b, const batch_result *br) {
    const model_moe_hparams *mo = &model_hp(b->cm.m)->moe;
    if (!mo->n_expert || br->tokens <= 0) return 0;
    const double one_token =
        (double)mo->expert_bytes * (double)mo->n_expert_used / (double)mo->n_expert;
    return ((double)mo->active_bytes - one_token) / (double)br->batch +
           br->routed_bytes / br->tokens;
}

/* measured_bytes_per_token's fields of one decode test (nothing for a dense model). */
static void json_moe_measured(cJSON *e, const bench *b, const batch_result *br,
                              const results *res) {
    const double bytes = measured_bytes_per_token(b, br);
    if (bytes <= 0) return;
    const double gbps = bytes * samples_mean(&br->tps) / 1e9;
    cJSON_AddNumberToObject(e, "moe_routed_bytes_per_token_measured",
                            br->routed_bytes / br->tokens);
    cJSON_AddNumberToObject(e, "weights_bytes_per_token_measured", bytes);
    cJSON_AddNumberToObject(e, "weights_gb_per_s_measured", gbps);
    if (res->membw_gbps > 0)
        cJSON_AddNumberToObject(e, "roofline_pct_measured", 100 * gbps / res->membw_gbps);
}

static void json_batches(cJSON *j, const bench *b, const results *res) {
    cJSON *arr = cJSON_AddArrayToObject(j, "batches");
    for (int i = 0; i < b->a->n_batch && b->a->n_decode > 1; i++) {
        const batch_result *br = &res->batch[i];
        cJSON *e = cJSON_CreateObject();
        double gbps = batch_gbps(b, br);
        cJSON_AddNumberToObject(e, "batch", (double)br->batch);
        cJSON_AddNumberToObject(e, "decode_tokens_per_s", samples_mean(&br->tps));
        cJSON_AddNumberToObject(e, "decode_tokens_per_s_sd", samples_sd(&br->tps));
        cJSON_AddNumberToObject(e, "per_sequence_tokens_per_s", samples_mean(&br->tps) / br->batch);
        cJSON_AddNumberToObject(e, "weights_bytes_per_token",
                                (double)b->weights_per_step / br->batch);
        cJSON_AddNumberToObject(e, "weights_gb_per_s", gbps);
        if (res->membw_gbps > 0)
            cJSON_AddNumberToObject(e, "roofline_pct", 100 * gbps / res->membw_gbps);
        json_kv_read(e, b, br, res);
        json_steps_roofline(e, b, br);
        json_moe_measured(e, b, br, res);
        cJSON_AddItemToArray(arr, e);
    }
}

static void json_sweep(cJSON *j, const bench *b, const results *res) {
    if (b->a->n_sweep == 0) return;
    cJSON *arr = cJSON_AddArrayToObject(j, "context_sweep");
    for (int i = 0; i < b->a->n_sweep; i++) {
        const sweep_point *sp = &res->sweep[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "context", (double)sp->ctx);
        cJSON_AddNumberToObject(e, "kv_cache_ms_per_token", sp->cache_ms);
        if (sp->nocache_ms >= 0)
            cJSON_AddNumberToObject(e, "no_kv_cache_ms_per_token", sp->nocache_ms);
        else cJSON_AddNullToObject(e, "no_kv_cache_ms_per_token");
        cJSON_AddBoolToObject(e, "no_kv_cache_skipped", sp->nocache_ms < 0);
        cJSON_AddItemToArray(arr, e);
    }
}

static void json_model(cJSON *j, const bench *b) {
    const model_hparams *hp = model_hp(b->cm.m);
    const gguf_file *f = model_gguf(b->cm.m);
    cJSON_AddStringToObject(j, "model", gguf_path(f));
    cJSON_AddStringToObject(j, "arch", hp->arch);
    cJSON_AddStringToObject(j, "type", model_type_name(f));
    cJSON_AddNumberToObject(j, "model_size_bytes", (double)gguf_tensor_data_bytes(f));
    cJSON_AddNumberToObject(j, "n_params", (double)hp->n_params);
    cJSON_AddNumberToObject(j, "weights_bytes_per_token", (double)b->weights_per_step);
    cJSON_AddStringToObject(j, "kv_type", kv_dtype_name(b->o->kv_dtype));
}

static void print_json(const bench *b, const results *res) {
    const bench_args *a = b->a;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "engine", "kvllm " KVLLM_VERSION);
    if (b->cm.m) json_model(j, b);
    cJSON_AddNumberToObject(j, "threads", kvl_pool_threads());
    cJSON_AddStringToObject(j, "isa", kern_isa_name());
    cJSON_AddStringToObject(j, "cpu", kern_cpu_name());
    cJSON_AddStringToObject(j, "decode_prefetch", kern_decode_prefetch_name());
    cJSON_AddNumberToObject(j, "reps", a->reps);
    if (res->membw_gbps > 0) cJSON_AddNumberToObject(j, "membw_gb_per_s", res->membw_gbps);
    if (!b->cm.m) {
        cli_print_json(j);
        return;
    }
    cJSON_AddNumberToObject(j, "n_prefill", (double)a->n_prefill);
    cJSON_AddNumberToObject(j, "n_decode", (double)a->n_decode);
    cJSON_AddNumberToObject(j, "decode_prompt", (double)a->decode_prompt);
    cJSON_AddNumberToObject(j, "prefill_tokens_per_s", samples_mean(&res->prefill_tps));
    cJSON_AddNumberToObject(j, "prefill_tokens_per_s_sd", samples_sd(&res->prefill_tps));
    const batch_result *b1 = &res->batch[0]; /* batch 1 comes first */
    cJSON_AddNumberToObject(j, "decode_tokens_per_s", samples_mean(&b1->tps));
    cJSON_AddNumberToObject(j, "decode_tokens_per_s_sd", samples_sd(&b1->tps));
    cJSON_AddNumberToObject(j, "weights_gb_per_s", batch_gbps(b, b1));
    if (res->membw_gbps > 0)
        cJSON_AddNumberToObject(j, "roofline_pct", 100 * batch_gbps(b, b1) / res->membw_gbps);
    if (a->n_decode > 1) {
        json_kv_read(j, b, b1, res);
        json_steps_roofline(j, b, b1);
    }
    json_batches(j, b, res);
    json_sweep(j, b, res);
    cli_print_json(j);
}

/* A row of the text table: t/s, the weights' GB/s and their roofline share,
 * and the share with the KV cache's reads added (read_gbps; 0: not known). */
static void print_row(const char *test, const samples *s, double gbps, double read_gbps,
                      double membw) {
    printf("| %-22s | %10.2f | %8.2f |", test, samples_mean(s), samples_sd(s));
    if (gbps > 0) printf(" %12.2f |", gbps);
    else printf(" %12s |", "");
    if (gbps > 0 && membw > 0) printf(" %7.0f%% |", 100 * gbps / membw);
    else printf(" %8s |", "");
    if (read_gbps > 0 && membw > 0) printf(" %7.0f%% |\n", 100 * read_gbps / membw);
    else printf(" %8s |\n", "");
}

static void print_text(const bench *b, const results *res) {
    const bench_args *a = b->a;
    if (!b->cm.m) {
        printf("memory read bandwidth: %.2f GB/s (%d threads, %lld MiB)\n", res->membw_gbps,
               kvl_pool_threads(), (long long)a->membw_mb);
        return;
    }
    const model_hparams *hp = model_hp(b->cm.m);
    const gguf_file *f = model_gguf(b->cm.m);
    printf(
        "kvllm bench: %s\n  %s %s, %.3f GB, %.3f B params, %d threads, %s kernels, KV %s, %d reps\n"
        "  CPU: %s (decode prefetch: %s)\n"
        "  weights read per decoding step: %.3f GB\n",
        gguf_path(f), hp->arch, model_type_name(f), gguf_tensor_data_bytes(f) / 1e9,
        hp->n_params / 1e9, kvl_pool_threads(), kern_isa_name(), kv_dtype_name(b->o->kv_dtype),
        a->reps, kern_cpu_name(), kern_decode_prefetch_name(), b->weights_per_step / 1e9);
    if (b->kv_read_per_token > 0) /* 0 below two decoding steps */
        printf("  KV read per decoding step and sequence: %.0f bytes (calculated, mean over "
               "contexts %lld..%lld)\n",
               b->kv_read_per_token, (long long)a->decode_prompt + 1,
               (long long)(a->decode_prompt + a->n_decode - 1));
    if (res->membw_gbps > 0) printf("  memory read bandwidth: %.2f GB/s\n", res->membw_gbps);
    printf("\n| %-22s | %10s | %8s | %12s | %8s | %8s |\n", "test", "t/s", "sd", "weights GB/s",
           "roofline", "with KV");
    printf("|------------------------|-----------:|---------:|-------------:|---------:|---------:|"
           "\n");
    char name[64];
    if (a->n_prefill > 0) {
        snprintf(name, sizeof name, "pp%lld", (long long)a->n_prefill);
        print_row(name, &res->prefill_tps, 0, 0, 0);
    }
    for (int i = 0; i < a->n_batch && a->n_decode > 1; i++) {
        const batch_result *br = &res->batch[i];
        if (br->batch > 1)
            snprintf(name, sizeof name, "tg%lld x%lld (aggregate)", (long long)a->n_decode,
                     (long long)br->batch);
        else snprintf(name, sizeof name, "tg%lld", (long long)a->n_decode);
        print_row(name, &br->tps, batch_gbps(b, br), read_gbps(b, br), res->membw_gbps);
    }
    for (int i = 0; i < a->n_batch && a->n_decode > 1; i++) {
        const batch_result *br = &res->batch[i];
        const double bytes = measured_bytes_per_token(b, br);
        if (bytes > 0)
            printf("%s  batch %3lld: %.1f MB of routed experts a token, %.3f GB of weights a step "
                   "(%.2f GB/s)\n",
                   i ? ""
                     : "\nweights read, measured from the routing (one token's selection above):\n",
                   (long long)br->batch, br->routed_bytes / br->tokens / 1e6,
                   bytes * (double)br->batch / 1e9, bytes * samples_mean(&br->tps) / 1e9);
    }
    for (int i = 0; i < a->n_batch && a->n_decode > 1; i++) {
        const batch_result *br = &res->batch[i];
        const double bw = steps_membw(br);
        if (bw <= 0) continue;
        printf("%s  batch %3lld: %.2f GB/s read between its steps, roofline %.0f%%",
               i ? "" : "\nprobes between decoding steps (--membw-steps):\n", (long long)br->batch,
               bw, 100 * batch_gbps(b, br) / bw);
        if (read_gbps(b, br) > 0) printf(", with KV %.0f%%", 100 * read_gbps(b, br) / bw);
        printf("\n");
    }
    for (int i = 0; i < a->n_sweep; i++) {
        const sweep_point *sp = &res->sweep[i];
        printf("%s  context %6lld: %9.2f ms/token with KV cache, ", i ? "" : "\ncontext sweep:\n",
               (long long)sp->ctx, sp->cache_ms);
        if (sp->nocache_ms >= 0) printf("%9.2f ms/token recomputing\n", sp->nocache_ms);
        else
            printf("recompute skipped (estimated %.0f s, over the --no-cache-budget)\n",
                   sp->nocache_est_s);
    }
}

/* ------------------------------------------------------------- main -- */

static int count_runs(const bench_args *a) {
    int n = a->warmup + (a->n_prefill > 0 ? a->reps : 0) + 2 * a->n_sweep;
    if (a->n_decode > 1) n += a->reps * (a->n_batch - fused_single(a));
    return n;
}

static int64_t longest_context(const bench_args *a) {
    int64_t ctx = a->n_prefill + 2;
    if (a->decode_prompt + a->n_decode + 1 > ctx) ctx = a->decode_prompt + a->n_decode + 1;
    for (int i = 0; i < a->n_sweep; i++)
        if (a->sweep[i] + a->sweep_tokens + 1 > ctx) ctx = a->sweep[i] + a->sweep_tokens + 1;
    return ctx < 16 ? 16 : ctx;
}

static bool run_phases(bench *b, results *res) {
    const bench_args *a = b->a;
    return (!a->warmup || phase_warmup(b)) && (a->n_prefill <= 0 || phase_prefill(b, res)) &&
           (a->n_decode <= 1 || phase_decode(b, res)) && phase_sweep(b, res);
}

static bool parse_args(int argc, char **argv, cli_opts *o, bench_args *a) {
    *a = (bench_args){.n_prefill = 512,
                      .n_decode = 128,
                      .reps = 3,
                      .decode_prompt = 16,
                      .batch = {1},
                      .n_batch = 1,
                      .sweep_tokens = 16,
                      .nocache_budget_s = 120,
                      .membw_mb = 1024,
                      .membw_step_mb = 256,
                      .progress = true,
                      .warmup = true};
    if (!cli_parse_ex(argc, argv, o, bench_flag, a)) {
        cmd_bench_usage(stderr);
        return false;
    }
    bench_matrix *mx = &a->mx;
    a->matrix = mx->out_given || mx->prompt.n > 1 || mx->gen.n > 1 || mx->threads.n > 1 ||
                mx->depth.n > 0 || mx->n_pg > 0 || mx->n_models > 1 || mx->batch.n > 1 ||
                mx->n_type_k > 1 || mx->n_type_v > 1;
    /* single values: as the common flags would have set them (-ctk: K alone) */
    if (mx->n_models) o->model_path = mx->models[0];
    if (mx->batch.n) o->batch_tokens = mx->batch.v[0];
    if (mx->n_type_k && o->kv_dtype_v < 0 && !mx->n_type_v) o->kv_dtype_v = o->kv_dtype;
    if (mx->n_type_k) o->kv_dtype = mx->type_k[0];
    if (mx->n_type_v) o->kv_dtype_v = mx->type_v[0];
    if (a->matrix && (a->kvllm_only || o->json)) {
        fprintf(stderr,
                "kvllm bench: %s is kvllm's own report's; llama-bench's way (-o, -oe, -pg, -d, "
                "--progress, --delay, several values of -p, -n or -t) has no place for it%s\n",
                a->kvllm_only ? a->kvllm_flag : "--json", o->json ? " (use -o json)" : "");
        return false;
    }
    if (mx->threads.n > 0) { /* the most any test uses: the model's scratch is sized for it */
        int64_t most = 0;
        for (int i = 0; i < mx->threads.n; i++)
            if (mx->threads.v[i] > most) most = mx->threads.v[i];
        o->n_threads = (int)most;
        kvl_pool_set_threads(o->n_threads);
        omp_set_num_threads(kvl_pool_threads());
    }
    if (a->matrix) {
        bench_matrix_defaults(mx, o);
        if (!a->reps_given) a->reps = 5; /* llama-bench's */
        return true;
    }
    if (mx->prompt.n) a->n_prefill = mx->prompt.v[0];
    if (mx->gen.n) a->n_decode = mx->gen.v[0];
    batch_with_one(a);
    for (int i = 0; i < a->n_batch; i++)
        if (a->batch[i] > 256) {
            fprintf(stderr, "kvllm bench: --batch: at most 256 sequences\n");
            return false;
        }
    for (int i = 1; i < a->n_sweep; i++)
        if (a->sweep[i] <= a->sweep[i - 1]) {
            fprintf(stderr, "kvllm bench: --context-sweep: lengths must increase\n");
            return false;
        }
    return true;
}

int cmd_bench(int argc, char **argv) {
    cli_opts o;
    bench_args a;
    const bool parsed = parse_args(argc, argv, &o, &a);
    bench b = {.a = &a, .o = &o, .rng = 0x9E3779B97F4A7C15ull};
    results *res = parsed ? calloc(1, sizeof *res) : NULL;
    int rc = parsed ? 1 : 2;
    if (!res) goto out;
    if (a.matrix) {
        rc = bench_matrix_run(&o, &a.mx, a.reps, a.warmup);
        goto out;
    }
    bool model_wanted = o.model_path || !a.membw;
    o.n_ctx = longest_context(&a);
    if (model_wanted && !cli_load(&o, true, &b.cm)) goto out;
    if (a.membw) res->membw_gbps = bench_membw_gbps(a.membw_mb);
    if (b.cm.m) {
        b.weights_per_step = weights_per_step(b.cm.m);
        b.kv_read_per_token = kv_read_per_token(b.cm.m, &o, a.decode_prompt, a.n_decode);
        b.prog = (progress){.on = a.progress,
                            .tty = isatty(STDERR_FILENO),
                            .n_runs = count_runs(&a),
                            .t0 = kvl_time_s()};
        if (a.membw_steps && !(b.probe = bench_step_probe_new(a.membw_step_mb)))
            fprintf(stderr, "kvllm bench: --membw-steps: cannot allocate %lld MiB\n",
                    (long long)a.membw_step_mb);
        bool ok = (!a.membw_steps || b.probe) && run_phases(&b, res);
        prog_end(&b.prog);
        /* the bandwidth moves minute to minute: the roofline is the better
         * of the probes before and after the runs */
        const double end = a.membw && ok ? bench_membw_gbps(a.membw_mb) : 0;
        if (end > res->membw_gbps) res->membw_gbps = end;
        if (!ok || (a.n_sweep > 0 && !bench_sweep_files(a.out, b.cm.m, res->sweep, a.n_sweep)))
            goto out;
    }
    if (!b.cm.m && res->membw_gbps <= 0) goto out; /* --membw alone, not measured (said why) */
    if (o.json) print_json(&b, res);
    else print_text(&b, res);
    rc = 0;
out:
    for (int i = 0; i < a.mx.n_models; i++) free(a.mx.models[i]);
    bench_step_probe_free(b.probe);
    cli_unload(&b.cm);
    free(res);
    return rc;
}
