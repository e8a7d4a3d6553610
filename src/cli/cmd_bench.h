/* kvllm bench internals shared by cmd_bench.c (flags, the engine runs, the
 * report) and cmd_bench_sweep.c (the memory-bandwidth probe and the context
 * sweep's CSV/SVG files). Not an API. */
#ifndef KVLLM_CMD_BENCH_H
#define KVLLM_CMD_BENCH_H

#include "cli.h"

/* One --context-sweep point. */
typedef struct sweep_point {
    int64_t ctx;
    double cache_ms, nocache_ms; /* per token; nocache_ms < 0: skipped */
    double nocache_est_s;
} sweep_point;

/* llama-bench's way (cmd_bench_matrix.c): a matrix of tests, each value list
 * as llama-bench takes it ("512", "128,512", "128-512*2", flags repeated),
 * every test in a row of llama-bench's output formats. */
#define BENCH_MAX_LIST 64
typedef struct bench_list {
    int64_t v[BENCH_MAX_LIST];
    int n;
} bench_list;
typedef enum bench_format {
    BENCH_FMT_NONE = 0,
    BENCH_FMT_MD,
    BENCH_FMT_CSV,
    BENCH_FMT_JSON,
    BENCH_FMT_JSONL,
    BENCH_FMT_SQL,
} bench_format;
typedef struct bench_matrix {
    char *models[BENCH_MAX_LIST]; /* -m, as llama-bench takes it (a list, or repeated); owned */
    int n_models;
    bench_list prompt, gen, depth, threads;             /* -p, -n, -d, -t (empty: not given) */
    bench_list batch;                                   /* -b */
    int type_k[BENCH_MAX_LIST], type_v[BENCH_MAX_LIST]; /* -ctk, -ctv (kv_dtype_parse's) */
    int n_type_k, n_type_v;
    int64_t pg[BENCH_MAX_LIST][2]; /* -pg pp,tg */
    int n_pg;
    bench_format out, out_err; /* -o (stdout), -oe (stderr) */
    bool out_given;            /* -o or -oe */
    bool progress;             /* --progress: a line on stderr as each run starts */
    int64_t delay_s;           /* --delay: seconds before each test */
} bench_matrix;
/* Appends "first[-last[+step|*mult]][,...]" to l (values >= 0); false (said
 * why on stderr) for anything else or more than BENCH_MAX_LIST values. */
bool bench_list_parse(const char *flag, const char *v, bench_list *l);
/* The matrix's defaults where a list was not given (-p 512, -n 128, -d 0, -t
 * the pool's size, as llama-bench has them; -m, -b, -ctk, -ctv: o's). */
void bench_matrix_defaults(bench_matrix *mx, const cli_opts *o);
/* The longest context any of its tests needs. */
int64_t bench_matrix_longest(const bench_matrix *mx);
/* Loads each model in turn and runs every test reps times on it (warm-ups
 * unless !warmup), printing each as it ends; 0, or 1 after a failure (said why). */
int bench_matrix_run(const cli_opts *o, const bench_matrix *mx, int reps, bool warmup);
/* The mean of n values (0 for none) and their sample standard deviation
 * (n - 1; 0 for fewer than two): every figure of both reports. */
double bench_mean(const double *v, int n);
double bench_sd(const double *v, int n);
/* A bench request: ids (n of them) to max_tokens outputs past any end token,
 * greedy (the cheapest sampler; llama-bench does not sample). */
engine_request bench_request(const int32_t *ids, int64_t n, int64_t max_tokens,
                             engine_event_fn on_event, void *user);
/* n random ids below n_vocab from *rng (xorshift64): prompts nothing shares. */
void bench_random_ids(uint64_t *rng, int64_t n_vocab, int32_t *ids, int64_t n);
/* An engine for the bench's runs: max_seqs sequences of up to n_ctx tokens,
 * steps of batch_tokens at least, n_blocks KV blocks (0: the engine's
 * default); NULL after saying why. */
engine *bench_engine_new(const cli_opts *o, const cli_model *cm, int max_seqs, int64_t n_ctx,
                         int64_t batch_tokens, int64_t n_blocks, bool no_cache);

/* Memory read bandwidth in GB/s: best of 5 passes over `mb` MiB, all threads. */
double bench_membw_gbps(int64_t mb);
/* A short probe run between decoding steps (--membw-steps): the bandwidth of
 * the same seconds as the decode, where the probes before and after the runs
 * may catch another minute's. new: a buffer of `mb` MiB (rounded down to
 * 4 MiB chunks), touched by the pool's threads; NULL if it cannot be had.
 * run: one read pass by all of the pool's threads, its seconds. */
typedef struct step_probe step_probe;
step_probe *bench_step_probe_new(int64_t mb);
double bench_step_probe_run(step_probe *p);
size_t bench_step_probe_bytes(const step_probe *p);
void bench_step_probe_free(step_probe *p);
/* Writes the sweep as <out>.csv and <out>.svg (out NULL: kvllm-context-sweep)
 * and says where on stderr; false (message printed) if either cannot be written. */
bool bench_sweep_files(const char *out, const model *m, const sweep_point *sw, int n);

#endif
