/* loadgen: a load generator for an OpenAI-compatible server, measuring what
 * vLLM's benchmark_serving measures: request and token throughput, and TTFT,
 * TPOT and ITL percentiles. C client threads, each running streaming
 * /v1/completions requests one after another over a minimal HTTP/1.1 client. */
#ifndef KVLLM_LOADGEN_H
#define KVLLM_LOADGEN_H

#include <stdbool.h>
#include <stdint.h>

typedef struct loadgen_opts {
    const char *url;     /* http://host[:port][/prefix] */
    const char *api_key; /* NULL: none */
    const char *model;   /* NULL: the first id /v1/models lists */
    int concurrency;
    int64_t requests;
    int64_t prompt_tokens; /* words per prompt (about one token each) */
    int64_t shared_prefix; /* of which this many are the same in every prompt */
    int64_t max_tokens;
    double temperature; /* sent with every request (0: greedy) */
    uint64_t seed;
    bool json;
    bool has_priority; /* send "priority": priority with every request */
    int64_t priority;
} loadgen_opts;

/* Runs the benchmark and prints the report to stdout. Returns 0 if every
 * request succeeded, 1 if some failed, 2 if the server could not be used. */
int loadgen_run(const loadgen_opts *o);

#endif
