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
/* Writes the sweep as <out>.csv and <out>.svg (out NULL: kvllm-context-sweep)
 * and says where on stderr; false (message printed) if either cannot be written. */
bool bench_sweep_files(const char *out, const model *m, const sweep_point *sw, int n);

#endif
