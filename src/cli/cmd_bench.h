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
