/* kvllm loadgen: flags for the load generator (src/server/loadgen.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loadgen.h"

static void loadgen_usage(FILE *out) {
    fprintf(out,
            "usage: kvllm loadgen [--url http://127.0.0.1:8080] [options]\n\n"
            "  --concurrency C     client threads, each with one request in flight (default 1)\n"
            "  --requests N        requests in total (default 16)\n"
            "  --prompt-tokens P   prompt length in words, about one token each (default 128)\n"
            "  --shared-prefix S   the first S words are the same in every prompt (default 0)\n"
            "  --max-tokens M      tokens to generate per request, EOS ignored (default 128)\n"
            "  --temperature T     sampling temperature of every request (default 0: greedy)\n"
            "  --api-key KEY       sent as 'Authorization: Bearer KEY'\n"
            "  --model NAME        model id (default: the first one /v1/models lists)\n"
            "  --seed N, -s N      prompt word seed (default 0)\n"
            "  --priority N        send \"priority\": N (serve --scheduling-policy priority)\n"
            "  --json              one JSON object instead of the table\n");
}

static bool int_arg(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "kvllm loadgen: %s: expected an integer in %lld..%lld\n", flag,
                (long long)lo, (long long)hi);
        return false;
    }
    *out = x;
    return true;
}

/* One flag with its value; false on a bad or unknown flag (message printed). */
static bool apply(loadgen_opts *o, const char *f, const char *v) {
    int64_t x;
#define IS(name) (strcmp(f, name) == 0)
    if (IS("--url")) o->url = v;
    else if (IS("--api-key")) o->api_key = v;
    else if (IS("--model")) o->model = v;
    else if (IS("--concurrency")) {
        if (!int_arg(f, v, 1, 4096, &x)) return false;
        o->concurrency = (int)x;
    } else if (IS("--requests")) return int_arg(f, v, 1, 10000000, &o->requests);
    else if (IS("--prompt-tokens")) return int_arg(f, v, 1, 1000000, &o->prompt_tokens);
    else if (IS("--shared-prefix")) return int_arg(f, v, 0, 1000000, &o->shared_prefix);
    else if (IS("--max-tokens")) return int_arg(f, v, 1, 1000000, &o->max_tokens);
    else if (IS("--temperature")) {
        char *end;
        errno = 0;
        const double t = strtod(v, &end);
        if (errno || end == v || *end || !(t >= 0 && t <= 100)) {
            fprintf(stderr, "kvllm loadgen: --temperature: expected a number in 0..100\n");
            return false;
        }
        o->temperature = t;
    } else if (IS("--priority")) {
        o->has_priority = true;
        return int_arg(f, v, -1000000, 1000000, &o->priority);
    } else if (IS("--seed") || IS("-s")) {
        if (!int_arg(f, v, 0, INT64_MAX, &x)) return false;
        o->seed = (uint64_t)x;
    } else {
        fprintf(stderr, "kvllm loadgen: unknown flag '%s' (see kvllm loadgen --help)\n", f);
        return false;
    }
#undef IS
    return true;
}

int cmd_loadgen(int argc, char **argv) {
    loadgen_opts o = {.url = "http://127.0.0.1:8080",
                      .concurrency = 1,
                      .requests = 16,
                      .prompt_tokens = 128,
                      .max_tokens = 128};
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            loadgen_usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--json") == 0) {
            o.json = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvllm loadgen: %s: missing value, or unknown flag\n", argv[i]);
            return 2;
        }
        if (!apply(&o, argv[i], argv[i + 1])) return 2;
        i++;
    }
    if (o.shared_prefix > o.prompt_tokens) {
        fprintf(stderr, "kvllm loadgen: --shared-prefix must not exceed --prompt-tokens\n");
        return 2;
    }
    return loadgen_run(&o);
}
