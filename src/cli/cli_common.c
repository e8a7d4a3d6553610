/* cli: flag parsing, loading, and JSON helpers shared by the subcommands. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hub.h"
#include "kvl_pool.h"

#define DEFAULT_MODEL "models/stories260K.gguf"

static bool parse_i64(const char *flag, const char *v, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) {
        fprintf(stderr, "kvllm: %s: '%s' is not an integer\n", flag, v);
        return false;
    }
    *out = x;
    return true;
}

static bool parse_f32(const char *flag, const char *v, float *out) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || end == v || *end) {
        fprintf(stderr, "kvllm: %s: '%s' is not a number\n", flag, v);
        return false;
    }
    *out = x;
    return true;
}

bool cli_parse_kv_type(const char *flag, const char *v, int *out) {
    if (kv_dtype_parse(v, out)) return true;
    if (!strcmp(v, "q4_1") || !strcmp(v, "q5_1")) {
        fprintf(stderr,
                "kvllm: %s: %s caches are not offered (llama.cpp takes their q.k through Q8_1 with "
                "an f16 block sum, which kvllm does not reproduce): use q4_0 or q5_0\n",
                flag, v);
        return false;
    }
    fprintf(
        stderr,
        "kvllm: %s: '%s' is not a KV cache type (f32, f16, bf16, q8_0, q5_0, q4_0, iq4_nl, fp8)\n",
        flag, v);
    return false;
}

static void opts_default(cli_opts *o) {
    memset(o, 0, sizeof *o);
    o->yarn_ext = o->yarn_attn = o->yarn_beta_fast = o->yarn_beta_slow = -1.0f;
    o->req.max_tokens = 128;
    o->n_threads = 0;
    sampler_params_default(&o->req.sampling);
    o->block_size = 16;
    o->kv_dtype = GGUF_DT_F16;
    o->kv_dtype_v = -1;
    o->batch_tokens = 2048;
    o->ubatch = 512;
    o->parse_special = false;
    o->spec = ENGINE_SPEC_OFF;
    o->spec_k = 4;
    o->spec_ngram = 3;
}

/* One flag with its value. Returns false on a bad value (message printed);
 * *unknown is set when f is not a flag at all. */
/* FILE[,FILE...], or with scaled FILE:SCALE[,...] (llama.cpp's --lora /
 * --lora-scaled and --control-vector / --control-vector-scaled): appended to
 * paths and scales (*n of at most max so far; 1 without a scale). */
static bool parse_file_list(const char *flag, const char *v, bool scaled, char (*paths)[1024],
                            float *scales, int *n, int max) {
    for (const char *p = v; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *next = end ? end + 1 : p + len;
        float scale = 1.0f;
        if (scaled) {
            const char *colon = NULL;
            for (const char *c = p; c < p + len; c++)
                if (*c == ':') colon = c;
            char num[64], *stop = NULL;
            const size_t nl = colon ? (size_t)(p + len - colon - 1) : 0;
            if (!colon || nl == 0 || nl >= sizeof num) {
                fprintf(stderr, "kvllm: %s: expected FILE:SCALE, got '%.*s'\n", flag, (int)len, p);
                return false;
            }
            memcpy(num, colon + 1, nl);
            num[nl] = '\0';
            scale = strtof(num, &stop);
            if (*stop || !isfinite(scale)) {
                fprintf(stderr, "kvllm: %s: scale '%s' is not a number\n", flag, num);
                return false;
            }
            len = (size_t)(colon - p);
        }
        if (len == 0 || len >= sizeof paths[0]) {
            fprintf(stderr, "kvllm: %s: empty or too long file name\n", flag);
            return false;
        }
        if (*n >= max) {
            fprintf(stderr, "kvllm: %s: at most %d files\n", flag, max);
            return false;
        }
        memcpy(paths[*n], p, len);
        paths[*n][len] = '\0';
        scales[(*n)++] = scale;
        p = next;
    }
    return true;
}

/* llama.cpp flags that ask for what kvllm always does, or for hardware it
 * does not use: accepted so that a llama.cpp command line runs, each saying
 * what it means here. */
static void habit_note(const char *flag, const char *what) {
    fprintf(stderr, "kvllm: note: %s: %s\n", flag, what);
}

/* Whether v is one of the NULL-terminated names. */
static bool one_of(const char *v, const char *const *names) {
    for (; *names; names++)
        if (strcmp(v, *names) == 0) return true;
    return false;
}

/* More of llama.cpp's (llama-server's) flags, with a value (takes) or not:
 * noted as above, or refused (refuse) where they would change the output in a
 * way kvllm does not, saying what to do instead. */
static const char NO_GPU[] = "no GPU here: every tensor is on the CPU";
static const char CPUS[] = "kvllm's compute threads are placed by the OS at the process's "
                           "priority, spinning briefly between steps (-t sets how many)";
static const char DRAFT_THREADS[] = "the draft model runs on the compute threads (-t)";
static const char ROUTER[] = "kvllm serves one model a process (llama-server's router mode is not "
                             "here): run one kvllm serve per model";
static const char AGENT[] =
    "kvllm runs no built-in agent tools and no MCP CORS proxy (llama-server's experimental ones "
    "run shell commands, write files and fetch any URL for whoever reaches the server): give "
    "the model tools through the API's \"tools\" and run them in the client";

static const struct {
    const char *flag;
    bool takes, refuse;
    const char *what;
} LLAMA_HABITS[] = {
    {"-ot", true, false, NO_GPU},
    {"--override-tensor", true, false, NO_GPU},
    {"--n-cpu-moe", true, false, NO_GPU},
    {"-ncmoe", true, false, NO_GPU},
    {"--cpu-moe", false, false, NO_GPU},
    {"-cmoe", false, false, NO_GPU},
    {"-nkvo", false, false, NO_GPU},
    {"--no-kv-offload", false, false, NO_GPU},
    {"-sm", true, false, NO_GPU},
    {"--split-mode", true, false, NO_GPU},
    {"-mg", true, false, NO_GPU},
    {"--main-gpu", true, false, NO_GPU},
    {"-ts", true, false, NO_GPU},
    {"--tensor-split", true, false, NO_GPU},
    {"-dev", true, false, NO_GPU},
    {"--device", true, false, NO_GPU},
    {"-tb", true, false, "prefill and decode both run on -t's threads"},
    {"--threads-batch", true, false, "prefill and decode both run on -t's threads"},
    {"--numa", true, false, "kvllm places no memory by NUMA node"},
    {"--cache-prompt", false, false, "prompts are cached (prefix cache) unless --no-prefix-cache"},
    {"--webui", false, false, "the built-in pages are served unless --no-webui"},
    {"--ui", false, false, "the built-in pages are served unless --no-webui"},
    {"--mmap", false, false,
     "weights are repacked into memory at load (or mapped from the file where they do not fit)"},
    {"--repack", false, false, "weights are repacked at load unless --no-repack"},
    {"--direct-io", false, false, "the model file is read through the page cache"},
    {"-dio", false, false, "the model file is read through the page cache"},
    {"--perf", false, false, "kvllm's timings cost nothing measurable; they stay on"},
    {"--show-timings", false, false, "timings are in every answer already"},
    {"--kv-offload", false, false, NO_GPU},
    {"-kvo", false, false, NO_GPU},
    {"--reuse-port", false, false, "kvllm binds its port alone (one server per port)"},
    {"--skip-chat-parsing", false, true,
     "tool calls and reasoning are always parsed in the chat template's format "
     "(--reasoning-format none keeps the reasoning in the content)"},
    {"--cache-ram", true, false,
     "prompts stay in the KV pool's prefix cache (and the --kv-disk tier): no separate RAM cache"},
    {"-cram", true, false,
     "prompts stay in the KV pool's prefix cache (and the --kv-disk tier): no separate RAM cache"},
    {"--ctx-checkpoints", true, false, "sliding-window layers keep their window's blocks"},
    {"--swa-checkpoints", true, false, "sliding-window layers keep their window's blocks"},
    {"-ctxcp", true, false, "sliding-window layers keep their window's blocks"},
    {"--fit", true, false, NO_GPU},
    {"-fit", true, false, NO_GPU},
    {"--fit-target", true, false, NO_GPU},
    {"-fitt", true, false, NO_GPU},
    {"--fit-ctx", true, false, NO_GPU},
    {"-fitc", true, false, NO_GPU},
    {"--no-host", false, false, NO_GPU},
    {"--cache-idle-slots", true, false, "idle slots' prompts stay in the prefix cache anyway"},
    {"--sse-ping-interval", true, false, "streams send no keep-alive pings"},
    {"--slot-prompt-similarity", true, false,
     "a request reuses any cached prefix, whichever slot computed it"},
    {"-sps", true, false, "a request reuses any cached prefix, whichever slot computed it"},
    {"-lv", true, false, "kvllm logs errors and warnings, and every request with -v"},
    {"--verbosity", true, false, "kvllm logs errors and warnings, and every request with -v"},
    {"--log-verbosity", true, false, "kvllm logs errors and warnings, and every request with -v"},
    {"--cache-reuse", true, false,
     "the prefix cache reuses a prompt's exact leading blocks; llama's reuse of shifted chunks "
     "is not done (the output is the same)"},
    {"--no-warmup", false, false, "kvllm runs no warm-up pass"},
    {"--props", false, false, "only kvllm serve has POST /props"},
    {"--swa-full", false, false,
     "sliding-window layers keep their window's blocks (the output is the same)"},
    {"-kvu", false, false, "one paged KV pool serves every sequence already"},
    {"--kv-unified", false, false, "one paged KV pool serves every sequence already"},
    {"--no-context-shift", false, false,
     "kvllm never shifts the context (a request that does not fit is refused)"},
    {"--keep", true, false, "kvllm never shifts the context: nothing to keep"},
    {"--defrag-thold", true, false, "a paged KV cache needs no defragmentation"},
    {"-dt", true, false, "a paged KV cache needs no defragmentation"},
    {"--draft-min", true, false, "drafts are --spec-k tokens long (adapted as they are accepted)"},
    {"--draft-p-min", true, false,
     "drafts are --spec-k tokens long (adapted as they are accepted)"},
    {"--no-mmproj", false, false, "kvllm serves text models only: there is no projector to load"},
    {"--verbose-prompt", false, false, "the prompt is not printed (-v logs the requests)"},
    {"--no-perf", false, false, "kvllm's timings cost nothing measurable; they stay on"},
    {"--log-colors", true, false, "kvllm's log lines are plain text on stderr"},
    {"--log-prefix", false, false, "kvllm's log lines are plain text on stderr"},
    {"--log-timestamps", false, false, "kvllm's log lines are plain text on stderr"},
    {"--context-shift", false, true,
     "kvllm does not shift the context: a request longer than it gets a 400"},
    {"--mmproj", true, true, "kvllm serves text models only (no multimodal projector)"},
    {"--mmproj-url", true, true, "kvllm serves text models only (no multimodal projector)"},
    {"--special", false, true, "only kvllm serve writes control tokens' text (serve --special)"},
    {"--path", true, true, "kvllm serves its own pages (--no-webui switches them off)"},
    /* llama.cpp's newer names and its CPU placement flags */
    {"--draft-n-min", true, false,
     "drafts are --spec-k tokens long (adapted as they are accepted)"},
    {"--spec-draft-n-min", true, false,
     "drafts are --spec-k tokens long (adapted as they are accepted)"},
    {"--spec-draft-p-min", true, false,
     "drafts are --spec-k tokens long (adapted as they are accepted)"},
    {"--spec-draft-p-split", true, false, "drafts are verified in the running step's batch"},
    {"--draft-p-split", true, false, "drafts are verified in the running step's batch"},
    {"-mm", true, true, "kvllm serves text models only (no multimodal projector)"},
    {"-mmu", true, true, "kvllm serves text models only (no multimodal projector)"},
    {"-C", true, false, CPUS},
    {"--cpu-mask", true, false, CPUS},
    {"-Cr", true, false, CPUS},
    {"--cpu-range", true, false, CPUS},
    {"--cpu-strict", true, false, CPUS},
    {"-Cb", true, false, CPUS},
    {"--cpu-mask-batch", true, false, CPUS},
    {"-Crb", true, false, CPUS},
    {"--cpu-range-batch", true, false, CPUS},
    {"--cpu-strict-batch", true, false, CPUS},
    {"--prio", true, false, CPUS},
    {"--prio-batch", true, false, CPUS},
    {"--poll", true, false, CPUS},
    {"--poll-batch", true, false, CPUS},
    {"-td", true, false, DRAFT_THREADS},
    {"--threads-draft", true, false, DRAFT_THREADS},
    {"-tbd", true, false, DRAFT_THREADS},
    {"--threads-batch-draft", true, false, DRAFT_THREADS},
    {"--sleep-idle-seconds", true, false,
     "the model stays loaded while kvllm runs (its weights are mapped or repacked once)"},
    {"--models-dir", true, true, ROUTER},
    {"--models-preset", true, true, ROUTER},
    {"--models-max", true, true, ROUTER},
    {"--models-autoload", false, true, ROUTER},
    {"--tools", true, true, AGENT},
    {"--ui-mcp-proxy", false, true, AGENT},
    {"--webui-mcp-proxy", false, true, AGENT},
    {"-ag", false, true, AGENT},
    {"--agent", false, true, AGENT},
    {"--no-ui-mcp-proxy", false, false, "off here already"},
    {"--no-webui-mcp-proxy", false, false, "off here already"},
    {"-no-ag", false, false, "off here already"},
    {"--no-agent", false, false, "off here already"},
};

/* vLLM's (`vllm serve`'s) flags the same way: a vLLM command line runs with
 * its settings kvllm has (apply_flag, and serve's own: --max-model-len,
 * --max-num-seqs, --kv-cache-dtype, ...), these noted or refused. */
static const char LOGS[] = "kvllm's log lines are plain text on stderr (-v logs every request)";
static const char CHUNKED[] = "prompts are computed in chunks of --max-batch-tokens beside the "
                              "running decodes, always";
static const char LORAS[] = "every adapter loaded with --lora, --lora-scaled or --lora-modules "
                            "serves every step, at its file's rank";
static const struct {
    const char *flag;
    bool takes, refuse;
    const char *what;
} VLLM_HABITS[] = {
    {"--gpu-memory-utilization", true, false,
     "no GPU here: the KV pool is sized from memory (--kv-memory, --kv-memory-fraction)"},
    {"--enforce-eager", false, false, NO_GPU},
    {"--cpu-offload-gb", true, false, NO_GPU},
    {"--enable-prefix-caching", false, false, "prefix caching is on unless --no-prefix-cache"},
    {"--enable-chunked-prefill", false, false, CHUNKED},
    {"--no-enable-chunked-prefill", false, false, CHUNKED},
    {"--swap-space", true, false,
     "a preempted request's blocks are recomputed, or read back from the --kv-disk tier"},
    {"--trust-remote-code", false, false, "a GGUF file carries no code to run"},
    {"--enable-auto-tool-choice", false, false,
     "tool calls are parsed in the chat template's format whenever a request has tools"},
    {"--tool-call-parser", true, false, "the tool-call format is found from the chat template"},
    {"--reasoning-parser", true, false,
     "reasoning is split out in the chat template's format (--reasoning-format none keeps it "
     "in the content)"},
    {"--disable-log-requests", false, false, LOGS},
    {"--enable-log-requests", false, false, LOGS},
    {"--disable-log-stats", false, false, "no periodic statistics are logged: GET /metrics"},
    {"--uvicorn-log-level", true, false, LOGS},
    {"--disable-uvicorn-access-log", false, false, LOGS},
    {"--enable-lora", false, false, LORAS},
    {"--max-loras", true, false, LORAS},
    {"--max-lora-rank", true, false, LORAS},
    {"--max-cpu-loras", true, false, LORAS},
    {"--generation-config", true, false,
     "a GGUF carries no generation_config.json: the sampling flags (--temp, --top-p, ...) are "
     "the requests' defaults"},
    {"--max-logprobs", true, false, "up to 20 logprobs a token are answered (OpenAI's limit)"},
    {"--root-path", true, false,
     "routes stay where they are (to serve under a path: --api-prefix)"},
    {"--distributed-executor-backend", true, false,
     "one process (pipeline stages on several hosts: --pp N under mpirun)"},
    {"--tokenizer", true, true,
     "the GGUF's own vocabulary is the tokenizer (another one would change the token ids)"},
    {"--speculative-config", true, true,
     "speculative decoding is --spec ngram|draft with --model-draft and --spec-k"},
    {"--chat-template-content-format", true, false,
     "message contents are rendered as the template expects them (strings or parts)"},
    {"--download-dir", true, false,
     "-hf downloads into the Hugging Face cache (HF_HUB_CACHE or LLAMA_CACHE name it)"},
    {"--revision", true, false, "-hf takes the repository's main branch"},
    {"--guided-decoding-backend", true, false,
     "structured output runs on kvllm's own grammar engine"},
    {"--max-seq-len-to-capture", true, false, NO_GPU},
    {"--disable-custom-all-reduce", false, false, NO_GPU},
    {"--num-scheduler-steps", true, false, "one engine step per scheduling decision"},
    {"--max-log-len", true, false, LOGS},
    {"--disable-frontend-multiprocessing", false, false, "one process serves HTTP and the engine"},
    {"--limit-mm-per-prompt", true, true, "kvllm serves text models only (no images or audio)"},
    {"--enable-sleep-mode", false, true, "no sleep mode: the weights stay where the load put them"},
};

/* A flag of LLAMA_HABITS or VLLM_HABITS: 2 flag and value used, 1 a switch
 * used, 0 not one, -1 refused or its value missing. */
static int llama_habit(const char *f, const char *v) {
    for (int t = 0; t < 2; t++) {
        const size_t n = t ? sizeof VLLM_HABITS / sizeof *VLLM_HABITS
                           : sizeof LLAMA_HABITS / sizeof *LLAMA_HABITS;
        for (size_t k = 0; k < n; k++) {
            const char *flag = t ? VLLM_HABITS[k].flag : LLAMA_HABITS[k].flag;
            const char *what = t ? VLLM_HABITS[k].what : LLAMA_HABITS[k].what;
            const bool takes = t ? VLLM_HABITS[k].takes : LLAMA_HABITS[k].takes;
            if (strcmp(f, flag) != 0) continue;
            if (t ? VLLM_HABITS[k].refuse : LLAMA_HABITS[k].refuse) {
                fprintf(stderr, "kvllm: %s is not supported: %s\n", f, what);
                return -1;
            }
            if (takes && !v) {
                fprintf(stderr, "kvllm: %s: missing value\n", f);
                return -1;
            }
            habit_note(f, what);
            return takes ? 2 : 1;
        }
    }
    return 0;
}

/* vLLM's lengths: an integer, or with k / m / g (x 1000^n) or K / M / G (x 1024^n), as
 * `--max-model-len 32k`. */
static bool parse_vllm_len(const char *f, const char *v, int64_t *out) {
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    double mul = 1;
    if (*end && !end[1]) {
        const char *units = "kmgKMG";
        const char *u = strchr(units, *end);
        if (u) {
            const int at = (int)(u - units);
            mul = at < 3 ? pow(1000, at % 3 + 1) : pow(1024, at % 3 + 1);
            end++;
        }
    }
    const double n = x * mul;
    if (end == v || *end || errno || !(n >= 1 && n <= 1e12) || n != floor(n)) {
        fprintf(stderr, "kvllm: %s: '%s' is not a length (e.g. 4096, 32k, 32K)\n", f, v);
        return false;
    }
    *out = (int64_t)n;
    return true;
}

/* One of vLLM's settings that takes only some values: 1 taken (noted), 0 not
 * one of these flags, -1 refused (message printed). */
static int vllm_valued(cli_opts *o, const char *f, const char *v) {
#define IS(name)    (strcmp(f, name) == 0)
#define ONE_OF(...) one_of(v, (const char *const[]){__VA_ARGS__, NULL})
    if (IS("--kv-cache-dtype")) {
        if (strcmp(v, "auto") == 0) {
            o->kv_dtype = GGUF_DT_F16;
            o->kv_dtype_v = -1;
            habit_note(f, "auto: the cache stores f16, llama.cpp's default (--kv-type to change)");
            return 1;
        }
        if (ONE_OF("fp8", "fp8_e4m3")) {
            o->kv_dtype_v = -1; /* K and V both */
            return kv_dtype_parse("fp8", &o->kv_dtype) ? 1 : -1;
        }
        fprintf(stderr,
                "kvllm: %s %s is not supported: auto (f16), fp8 or fp8_e4m3 (kvllm's fp8 is "
                "E4M3; --kv-type takes llama.cpp's q8_0, q5_0, q4_0, iq4_nl too)\n",
                f, v);
        return -1;
    }
    if (IS("--tensor-parallel-size") || IS("-tp") || IS("--pipeline-parallel-size") ||
        IS("--data-parallel-size") || IS("-dp")) {
        if (strcmp(v, "1") == 0) {
            habit_note(f, "one process on this machine's CPUs");
            return 1;
        }
        fprintf(stderr,
                "kvllm: %s %s is not supported: one process computes every layer here (pipeline "
                "stages on several hosts: --pp N under mpirun)\n",
                f, v);
        return -1;
    }
    if (IS("--dtype")) {
        if (!ONE_OF("auto", "half", "float16", "bfloat16", "float", "float32")) {
            fprintf(stderr, "kvllm: %s: '%s' is not one of vLLM's dtypes\n", f, v);
            return -1;
        }
        habit_note(f, "the weights are the GGUF's types; activations are computed in f32");
        return 1;
    }
    if (IS("--quantization") || IS("-q") || IS("--load-format")) {
        if (ONE_OF("gguf", "auto")) {
            habit_note(f, "a GGUF file, its own weight types");
            return 1;
        }
        fprintf(stderr, "kvllm: %s %s is not supported: kvllm reads GGUF files (-m FILE.gguf)\n", f,
                v);
        return -1;
    }
    if (IS("--response-role")) {
        if (strcmp(v, "assistant") == 0) return 1;
        fprintf(stderr,
                "kvllm: %s %s is not supported: chat answers come from the role 'assistant'\n", f,
                v);
        return -1;
    }
#undef ONE_OF
#undef IS
    return 0;
}

/* The sampling field each sampling flag sets (kvllm serve: the requests'
 * default for it, as llama-server takes these flags). */
static const struct {
    const char *flag;
    uint32_t set;
} SAMPLING_FLAGS[] = {
    {"--temp", SAMPLER_SET_TEMPERATURE},
    {"--top-k", SAMPLER_SET_TOP_K},
    {"--top-p", SAMPLER_SET_TOP_P},
    {"--min-p", SAMPLER_SET_MIN_P},
    {"--repeat-penalty", SAMPLER_SET_REPEAT_PENALTY},
    {"--presence-penalty", SAMPLER_SET_PRESENCE_PENALTY},
    {"--frequency-penalty", SAMPLER_SET_FREQUENCY_PENALTY},
    {"--repeat-last-n", SAMPLER_SET_PENALTY_LAST_N},
    {"--seed", SAMPLER_SET_SEED},
    {"-s", SAMPLER_SET_SEED},
    {"--typical", SAMPLER_SET_TYPICAL_P},
    {"--typical-p", SAMPLER_SET_TYPICAL_P},
    {"--top-nsigma", SAMPLER_SET_TOP_N_SIGMA},
    {"--top-n-sigma", SAMPLER_SET_TOP_N_SIGMA},
    {"--xtc-probability", SAMPLER_SET_XTC_PROBABILITY},
    {"--xtc-threshold", SAMPLER_SET_XTC_THRESHOLD},
    {"--dynatemp-range", SAMPLER_SET_DYNATEMP_RANGE},
    {"--dynatemp-exp", SAMPLER_SET_DYNATEMP_EXPONENT},
    {"--min-keep", SAMPLER_SET_MIN_KEEP},
    {"--mirostat", SAMPLER_SET_MIROSTAT},
    {"--mirostat-ent", SAMPLER_SET_MIROSTAT_TAU},
    {"--mirostat-lr", SAMPLER_SET_MIROSTAT_ETA},
    {"--dry-multiplier", SAMPLER_SET_DRY_MULTIPLIER},
    {"--dry-base", SAMPLER_SET_DRY_BASE},
    {"--dry-allowed-length", SAMPLER_SET_DRY_ALLOWED_LENGTH},
    {"--dry-penalty-last-n", SAMPLER_SET_DRY_PENALTY_LAST_N},
    {"--dry-sequence-breaker", SAMPLER_SET_DRY_BREAKERS},
    {"--sampling-seq", SAMPLER_SET_ORDER},
    {"--sampler-seq", SAMPLER_SET_ORDER},
    {"--samplers", SAMPLER_SET_ORDER},
};

/* llama's --samplers: sampler names separated by ';' (the chain's: penalties,
 * dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature and their
 * aliases), into order's letters. */
static bool parse_sampler_names(const char *flag, const char *v, char order[16]) {
    size_t n = 0;
    for (const char *p = v; *p;) {
        const char *end = strchr(p, ';');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        char name[32] = {0};
        const char c = len < sizeof name ? (memcpy(name, p, len), sampler_letter(name)) : 0;
        if (!c || !strchr("edskypmxt", c) || n == 15) {
            fprintf(stderr,
                    "kvllm: %s: '%.*s' is not one of penalties, dry, top_n_sigma, top_k, typ_p, "
                    "top_p, min_p, xtc, temperature (at most 15, separated by ';')\n",
                    flag, (int)len, p);
            return false;
        }
        order[n++] = c;
        p += len + (end != NULL);
    }
    order[n] = 0;
    return n > 0;
}

/* llama.cpp's escape processing of a prompt-like value (-e, its default;
 * --no-escape turns it off): \n \r \t \' \" \\ and \xHH become the
 * character, any other backslash stays as it is. In place: the result is never
 * longer (argv's strings are the program's to modify). \x00 is refused: a C
 * string would end there and silently lose the rest. */
static bool unescape(const char *f, char *s) {
    char *out = s;
    for (const char *p = s; *p; p++) {
        if (p[0] != '\\' || !p[1]) {
            *out++ = *p;
            continue;
        }
        const char c = *++p;
        if (c == 'n') *out++ = '\n';
        else if (c == 'r') *out++ = '\r';
        else if (c == 't') *out++ = '\t';
        else if (c == '\'' || c == '"' || c == '\\') *out++ = c;
        else if (c == 'x' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
            const char hex[3] = {p[1], p[2], 0};
            const char byte = (char)strtol(hex, NULL, 16);
            if (!byte) {
                fprintf(stderr,
                        "kvllm: %s: \\x00 would end the text there (--no-escape takes it as "
                        "written)\n",
                        f);
                return false;
            }
            *out++ = byte;
            p += 2;
        } else {
            *out++ = '\\';
            *out++ = c;
        }
    }
    *out = 0;
    return true;
}

static bool apply_flag(cli_opts *o, const char *f, const char *v, bool *unknown) {
    int64_t i;
    if (!o->no_escape &&
        (!strcmp(f, "-p") || !strcmp(f, "--prompt") || !strcmp(f, "--stop") || !strcmp(f, "-r") ||
         !strcmp(f, "--reverse-prompt") || !strcmp(f, "--dry-sequence-breaker")) &&
        !unescape(f, (char *)v))
        return false;
#define IS(name) (strcmp(f, name) == 0)
    for (size_t k = 0; k < sizeof SAMPLING_FLAGS / sizeof *SAMPLING_FLAGS; k++)
        if (IS(SAMPLING_FLAGS[k].flag)) o->sampling_set |= SAMPLING_FLAGS[k].set;
    if (IS("-m") || IS("--model")) o->model_path = v;
    else if (IS("-hf") || IS("-hfr") || IS("--hf-repo")) o->hf_repo = v;
    else if (IS("-hff") || IS("--hf-file")) o->hf_file = v;
    else if (IS("-mu") || IS("--model-url")) o->model_url = v;
    else if (IS("-dr") || IS("--docker-repo")) o->docker_repo = v;
    else if (IS("-hft") || IS("--hf-token")) o->hf_token = v;
    else if (IS("--model-draft") || IS("-md") || IS("--spec-draft-model")) o->model_draft = v;
    else if (IS("-hfd") || IS("-hfrd") || IS("--hf-repo-draft") || IS("--spec-draft-hf"))
        o->hf_repo_draft = v;
    else if (IS("-p") || IS("--prompt")) o->prompt = v;
    else if (IS("-f") || IS("--file")) o->prompt_file = v;
    else if (IS("--prompt-ids") || IS("--ids")) o->prompt_ids = v;
    else if (IS("-n") || IS("--n-predict") || IS("--predict")) {
        o->n_predict_given = true;
        return parse_i64(f, v, &o->req.max_tokens);
    } else if (IS("-c") || IS("--ctx-size")) return parse_i64(f, v, &o->n_ctx);
    else if (IS("--max-model-len")) return parse_vllm_len(f, v, &o->n_ctx); /* vLLM's -c */
    else if (IS("-t") || IS("--threads")) {
        if (!parse_i64(f, v, &i)) return false;
        if (i < 1 || i > 1024) {
            fprintf(stderr, "kvllm: -t: must be 1..1024\n");
            return false;
        }
        o->n_threads = (int)i;
    } else if (IS("--temp") || IS("--temperature"))
        return parse_f32(f, v, &o->req.sampling.temperature);
    else if (IS("--top-k")) {
        if (!parse_i64(f, v, &i)) return false;
        o->req.sampling.top_k = (int32_t)i;
    } else if (IS("--top-p")) return parse_f32(f, v, &o->req.sampling.top_p);
    else if (IS("--min-p")) return parse_f32(f, v, &o->req.sampling.min_p);
    else if (IS("--repeat-penalty")) return parse_f32(f, v, &o->req.sampling.repeat_penalty);
    else if (IS("--presence-penalty")) return parse_f32(f, v, &o->req.sampling.presence_penalty);
    else if (IS("--frequency-penalty")) return parse_f32(f, v, &o->req.sampling.frequency_penalty);
    else if (IS("--typical") || IS("--typical-p")) {
        if (!parse_f32(f, v, &o->req.sampling.typical_p)) return false;
        o->req.sampling.typical_p = sampler_typical_from_llama(o->req.sampling.typical_p);
    } else if (IS("--top-nsigma") || IS("--top-n-sigma"))
        return parse_f32(f, v, &o->req.sampling.top_n_sigma);
    else if (IS("--xtc-probability")) return parse_f32(f, v, &o->req.sampling.xtc_probability);
    else if (IS("--xtc-threshold")) return parse_f32(f, v, &o->req.sampling.xtc_threshold);
    else if (IS("--dynatemp-range")) return parse_f32(f, v, &o->req.sampling.dynatemp_range);
    else if (IS("--dynatemp-exp")) return parse_f32(f, v, &o->req.sampling.dynatemp_exponent);
    else if (IS("--mirostat-lr")) return parse_f32(f, v, &o->req.sampling.mirostat_eta);
    else if (IS("--mirostat-ent")) return parse_f32(f, v, &o->req.sampling.mirostat_tau);
    else if (IS("--min-keep") || IS("--mirostat")) {
        if (!parse_i64(f, v, &i) || i < 0 || i > (IS("--mirostat") ? 2 : INT32_MAX)) {
            fprintf(stderr, "kvllm: %s: must be %s\n", f, IS("--mirostat") ? "0, 1 or 2" : ">= 0");
            return false;
        }
        *(IS("--mirostat") ? &o->req.sampling.mirostat : &o->req.sampling.min_keep) = (int32_t)i;
    } else if (IS("--dry-multiplier")) return parse_f32(f, v, &o->req.sampling.dry_multiplier);
    else if (IS("--dry-base")) return parse_f32(f, v, &o->req.sampling.dry_base);
    else if (IS("--dry-allowed-length") || IS("--dry-penalty-last-n")) {
        if (!parse_i64(f, v, &i) || i < (IS("--dry-allowed-length") ? 0 : -1) || i > INT32_MAX) {
            fprintf(stderr, "kvllm: %s: must be %s\n", f,
                    IS("--dry-allowed-length") ? ">= 0" : "-1 (the context) or more");
            return false;
        }
        *(IS("--dry-allowed-length") ? &o->req.sampling.dry_allowed_length
                                     : &o->req.sampling.dry_penalty_last_n) = (int32_t)i;
    } else if (IS("--dry-sequence-breaker")) {
        /* llama's: each adds one, the first replaces the defaults, "none" clears them */
        if (!o->dry_breakers_given || strcmp(v, "none") == 0)
            memset(o->req.sampling.dry_breakers, 0, sizeof o->req.sampling.dry_breakers);
        o->dry_breakers_given = true;
        if (strcmp(v, "none") == 0) return true;
        if (!v[0] || !sampler_dry_breaker_add(&o->req.sampling, v)) {
            fprintf(stderr, "kvllm: %s: empty, or more than %d bytes of breakers\n", f,
                    SAMPLER_DRY_BREAKERS - 2);
            return false;
        }
    } else if (IS("--rope-scaling")) { /* llama.cpp's rope flags (cli_apply_overrides) */
        if (strcmp(v, "none") && strcmp(v, "linear") && strcmp(v, "yarn")) {
            fprintf(stderr, "kvllm: --rope-scaling: none, linear or yarn\n");
            return false;
        }
        o->rope_scaling = v;
    } else if (IS("--rope-scale") || IS("--rope-freq-scale") || IS("--rope-freq-base")) {
        float x;
        if (!parse_f32(f, v, &x)) return false;
        if (!(x > 0) || !isfinite(x)) {
            fprintf(stderr, "kvllm: %s: must be positive\n", f);
            return false;
        }
        if (IS("--rope-freq-base")) o->rope_freq_base = x;
        else o->rope_factor = IS("--rope-scale") ? x : 1.0f / x; /* llama: scale = 1 / factor */
    } else if (IS("--yarn-orig-ctx")) {
        if (!parse_i64(f, v, &i) || i < 1 || i > (1 << 30)) {
            fprintf(stderr, "kvllm: --yarn-orig-ctx: must be 1..%d\n", 1 << 30);
            return false;
        }
        o->yarn_orig_ctx = i;
    } else if (IS("--yarn-ext-factor") || IS("--yarn-attn-factor") || IS("--yarn-beta-fast") ||
               IS("--yarn-beta-slow")) { /* negative: the file's value, as llama.cpp's -1 */
        float x;
        if (!parse_f32(f, v, &x)) return false;
        if (!isfinite(x)) {
            fprintf(stderr, "kvllm: %s: must be a finite number\n", f);
            return false;
        }
        o->yarn_set = true;
        *(IS("--yarn-ext-factor")    ? &o->yarn_ext
          : IS("--yarn-attn-factor") ? &o->yarn_attn
          : IS("--yarn-beta-fast")   ? &o->yarn_beta_fast
                                     : &o->yarn_beta_slow) = x;
    } else if (IS("--samplers")) {
        return parse_sampler_names(f, v, o->req.sampling.order);
    } else if (IS("--sampling-seq") || IS("--sampler-seq")) {
        /* llama's sampler letters, in the order they run */
        size_t n = strlen(v);
        if (n == 0 || n >= sizeof o->req.sampling.order || strspn(v, "edskypmxt") != n) {
            fprintf(stderr,
                    "kvllm: %s: 1..15 of the letters e (penalties), d (DRY), s (top-n-sigma), k "
                    "(top-k), y (typical), p (top-p), m (min-p), x (XTC), t (temperature)\n",
                    f);
            return false;
        }
        memcpy(o->req.sampling.order, v, n + 1);
    } else if (IS("--repeat-last-n")) {
        if (!parse_i64(f, v, &i)) return false;
        o->req.sampling.penalty_last_n = (int32_t)i;
    } else if (IS("--seed") || IS("-s")) {
        if (!parse_i64(f, v, &i)) return false;
        o->req.sampling.seed = (uint64_t)i;
    } else if (IS("--stop") || IS("-r") || IS("--reverse-prompt")) { /* llama's reverse prompt */
        if (o->req.n_stop == CLI_MAX_STOP) {
            fprintf(stderr, "kvllm: at most %d --stop strings\n", CLI_MAX_STOP);
            return false;
        }
        o->stop[o->req.n_stop++] = v;
    } else if (IS("--top-logprobs")) {
        if (!parse_i64(f, v, &i) || i < 0 || i > 1000) {
            fprintf(stderr, "kvllm: --top-logprobs: must be 0..1000 (run: 0..20)\n");
            return false;
        }
        o->req.top_logprobs = (int)i;
    } else if (IS("--block-size")) {
        if (!parse_i64(f, v, &i) || i < 1 || i > 4096) {
            fprintf(stderr, "kvllm: --block-size: must be 1..4096\n");
            return false;
        }
        o->block_size = (int)i;
    } else if (IS("--kv-type")) {
        o->kv_dtype_v = -1;
        return cli_parse_kv_type(f, v, &o->kv_dtype);
    } else if (IS("-ctk") || IS("--cache-type-k")) { /* llama.cpp's: K alone, V stays as it was */
        if (o->kv_dtype_v < 0) o->kv_dtype_v = o->kv_dtype;
        return cli_parse_kv_type(f, v, &o->kv_dtype);
    } else if (IS("-ctv") || IS("--cache-type-v")) return cli_parse_kv_type(f, v, &o->kv_dtype_v);
    else if (IS("-ngl") || IS("--n-gpu-layers") || IS("--gpu-layers"))
        habit_note(f, "no GPU here: every layer runs on the CPU");
    else if (IS("-fa") || IS("--flash-attn")) {
        if (strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "auto") && strcmp(v, "1") &&
            strcmp(v, "0")) {
            fprintf(stderr, "kvllm: %s: on, off or auto\n", f);
            return false;
        }
        habit_note(f, "attention is kvllm's own kernel over the paged cache (as llama.cpp's -fa "
                      "off computes it); the flag changes nothing");
    } else if (IS("--kv-type-k")) return cli_parse_kv_type(f, v, &o->kv_dtype);
    else if (IS("--kv-type-v")) return cli_parse_kv_type(f, v, &o->kv_dtype_v);
    else if (IS("--kv-blocks")) return parse_i64(f, v, &o->kv_blocks);
    else if (IS("-b") || IS("--batch-size")) return parse_i64(f, v, &o->batch_tokens);
    else if (IS("-ub") || IS("--ubatch-size")) return parse_i64(f, v, &o->ubatch);
    else if (IS("--pp") || IS("--pp-micro")) {
        if (!parse_i64(f, v, &i) || i < 1 || i > (IS("--pp") ? PP_MAX_RANKS : 64)) {
            fprintf(stderr, "kvllm: %s: must be 1..%d\n", f, IS("--pp") ? PP_MAX_RANKS : 64);
            return false;
        }
        *(IS("--pp") ? &o->pp : &o->pp_micro) = (int)i;
    } else if (IS("--pp-groups")) {
        if (!parse_i64(f, v, &i) || i < 1 || i > ENGINE_MAX_STEP_GROUPS) {
            fprintf(stderr, "kvllm: --pp-groups: must be 1..%d\n", ENGINE_MAX_STEP_GROUPS);
            return false;
        }
        o->pp_groups = (int)i;
    } else if (IS("--pp-layers")) o->pp_layers = v;
    else if (IS("--pp-timeout")) {
        float t;
        if (!parse_f32(f, v, &t) || !(t > 0 && t <= 86400)) {
            fprintf(stderr, "kvllm: --pp-timeout: must be a number of seconds in (0, 86400]\n");
            return false;
        }
        o->pp_timeout = t;
    } else if (IS("--spec")) {
        engine_spec_mode m;
        if (!engine_spec_parse(v, &m)) {
            fprintf(stderr, "kvllm: --spec: '%s' is not a speculation mode (off, ngram, draft)\n",
                    v);
            return false;
        }
        o->spec = (int)m;
    } else if (IS("--spec-type")) { /* llama.cpp's list of kinds: kvllm runs one */
        bool draft = false, ngram = false, none = false;
        for (const char *p = v; *p;) {
            const size_t l = strcspn(p, ",");
            if (l == 4 && !strncmp(p, "none", 4)) none = true;
            else if (l == 12 && !strncmp(p, "draft-simple", 12)) draft = true;
            else if (l > 6 && !strncmp(p, "ngram-", 6)) ngram = true; /* every n-gram kind */
            else {
                fprintf(stderr,
                        "kvllm: --spec-type: '%.*s' is not supported (draft-simple, the ngram-* "
                        "kinds or none; EAGLE-3, MTP and DFlash drafts are not here)\n",
                        (int)l, p);
                return false;
            }
            p += l + (p[l] == ',');
        }
        o->spec = (int)(draft ? ENGINE_SPEC_DRAFT : ngram ? ENGINE_SPEC_NGRAM : ENGINE_SPEC_OFF);
        if (draft + ngram + none > 1 || (ngram && strcmp(v, "ngram-simple") != 0))
            habit_note(f, "kvllm runs one kind: a draft model if named, else prompt lookup (its "
                          "n-gram drafts; the output is the same, only the speed differs)");
    } else if (IS("--spec-k") || IS("--draft-max") || IS("--draft") || IS("--draft-n") ||
               IS("--spec-draft-n-max")) { /* (llama's names) */
        if (!parse_i64(f, v, &i) || i < 1 || i > ENGINE_SPEC_MAX_K) {
            fprintf(stderr, "kvllm: %s: must be 1..%d\n", f, ENGINE_SPEC_MAX_K);
            return false;
        }
        o->spec_k = (int)i;
    } else if (IS("--spec-ngram")) {
        if (!parse_i64(f, v, &i) || i < 1 || i > ENGINE_SPEC_MAX_NGRAM) {
            fprintf(stderr, "kvllm: --spec-ngram: must be 1..%d\n", ENGINE_SPEC_MAX_NGRAM);
            return false;
        }
        o->spec_ngram = (int)i;
    } else if (IS("--lora") || IS("--lora-scaled")) {
        return parse_file_list(f, v, IS("--lora-scaled"), o->lora_path, o->lora_scale, &o->n_lora,
                               MODEL_MAX_LORA);
    } else if (IS("--control-vector") || IS("--control-vector-scaled")) {
        return parse_file_list(f, v, IS("--control-vector-scaled"), o->cvec_path, o->cvec_scale,
                               &o->n_cvec, CLI_MAX_CVEC);
    } else if (IS("--log-file")) {
        o->log_file = v;
    } else if (IS("--override-kv")) {
        if (o->n_override_kv == CLI_MAX_OVERRIDE_KV) {
            fprintf(stderr, "kvllm: --override-kv: at most %d of them\n", CLI_MAX_OVERRIDE_KV);
            return false;
        }
        o->override_kv[o->n_override_kv++] = v;
    } else {
        *unknown = true;
        return false;
    }
#undef IS
    return true;
}

static bool apply_switch(cli_opts *o, const char *f) {
#define IS(name) (strcmp(f, name) == 0)
    if (IS("--jinja"))
        habit_note(f, "chat templates are always rendered as Jinja (transformers' way)");
    else if (IS("--mlock") || IS("--no-mmap"))
        habit_note(f, "weights are repacked into memory at load (or mapped from the file); not "
                      "changed by this flag");
    else if (IS("--json")) o->json = true;
    else if (IS("-e") || IS("--escape") || IS("--no-escape")) { /* read before the others */
    } else if (IS("--offline")) o->offline = true;
    else if (IS("--no-bos")) o->no_bos = true;
    else if (IS("--parse-special")) o->parse_special = true;
    else if (IS("--ignore-eos")) o->req.ignore_eos = true;
    else if (IS("--no-kv-cache")) o->no_kv_cache = true;
    else if (IS("--spec-fixed")) o->spec_fixed = true;
    else if (IS("--no-repack") || IS("-nr")) o->no_repack = true;
    else if (IS("--log-disable")) kvl_log_level = KVL_LOG_ERROR; /* llama's: errors only */
    else if (IS("--lora-init-without-apply")) o->lora_init_without_apply = true;
    else if (IS("-v") || IS("--verbose") || IS("--log-verbose")) o->verbose = true;
    else return false;
#undef IS
    return true;
}

/* -hf user/model[:quant] (llama.cpp's): the model's file from the
 * Hugging Face cache, downloaded there first when missing (hub.h). */
static bool hf_model(cli_opts *o) {
    if (o->hf_file && !o->hf_repo) {
        fprintf(stderr, "kvllm: --hf-file names a file of the -hf repository: give -hf too\n");
        return false;
    }
    if ((o->model_url != NULL) + (o->hf_repo != NULL) + (o->docker_repo != NULL) > 1) {
        fprintf(stderr, "kvllm: -hf, -mu and -dr each name the model: give one\n");
        return false;
    }
    if (o->docker_repo) { /* llama.cpp's -dr: Docker Hub's model registry */
        kvl_error err = {{0}};
        if (o->model_path) {
            fprintf(stderr, "kvllm: -m and -dr both name the model: give one\n");
            return false;
        }
        if (!hub_fetch_docker(o->docker_repo, o->offline, o->hf_path, sizeof o->hf_path, &err)) {
            fprintf(stderr, "kvllm: -dr %s: %s\n", o->docker_repo, err.msg);
            return false;
        }
        o->model_path = o->hf_path;
        return true;
    }
    if (o->model_url) { /* llama.cpp's -mu URL: into -m's path, else its cache */
        kvl_error err = {{0}};
        if (!hub_fetch_url(o->model_url, o->model_path, o->hf_token, o->offline, o->hf_path,
                           sizeof o->hf_path, &err)) {
            fprintf(stderr, "kvllm: -mu %s: %s\n", o->model_url, err.msg);
            return false;
        }
        o->model_path = o->hf_path;
        return true;
    }
    if (o->hf_repo_draft) { /* the draft model the same way (llama.cpp's -hfd) */
        if (o->model_draft) {
            fprintf(stderr, "kvllm: -md and -hfd both name the draft model: give one\n");
            return false;
        }
        const hub_request rd = {
            .repo = o->hf_repo_draft, .token = o->hf_token, .offline = o->offline};
        kvl_error derr = {{0}};
        if (!hub_fetch(&rd, o->hf_draft_path, sizeof o->hf_draft_path, &derr)) {
            fprintf(stderr, "kvllm: -hfd %s: %s\n", o->hf_repo_draft, derr.msg);
            return false;
        }
        o->model_draft = o->hf_draft_path;
    }
    if (!o->hf_repo) return true;
    if (o->model_path) {
        fprintf(stderr, "kvllm: -m and -hf both name the model: give one\n");
        return false;
    }
    const hub_request r = {
        .repo = o->hf_repo, .file = o->hf_file, .token = o->hf_token, .offline = o->offline};
    kvl_error err = {{0}};
    if (!hub_fetch(&r, o->hf_path, sizeof o->hf_path, &err)) {
        fprintf(stderr, "kvllm: -hf %s: %s\n", o->hf_repo, err.msg);
        return false;
    }
    kvl_log(KVL_LOG_INFO, "-hf %s: %s", o->hf_repo, o->hf_path);
    o->model_path = o->hf_path;
    return true;
}

/* A layer number of --control-vector-layer-range (llama.cpp reads it with
 * stoi: any int, 0 or less meaning its default). */
static bool parse_layer(const char *flag, const char *v, int *out) {
    int64_t i = 0;
    if (!parse_i64(flag, v, &i)) return false;
    if (i < INT32_MIN || i > INT32_MAX) {
        fprintf(stderr, "kvllm: %s: %s is out of range\n", flag, v);
        return false;
    }
    *out = (int)i;
    return true;
}

bool cli_parse_ex(int argc, char **argv, cli_opts *o, cli_extra_fn extra, void *ctx) {
    opts_default(o);
    /* -e / --no-escape (the last one) governs every prompt-like value,
     * wherever it stands, as llama.cpp processes them after parsing */
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--no-escape")) o->no_escape = true;
        else if (!strcmp(argv[i], "-e") || !strcmp(argv[i], "--escape")) o->no_escape = false;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        if (extra && f[0] == '-') {
            int used = extra(f, i + 1 < argc ? argv[i + 1] : NULL, ctx);
            if (used < 0) return false;
            if (used > 0) {
                i += used - 1;
                continue;
            }
        }
        if (apply_switch(o, f)) continue;
        if (strcmp(f, "--control-vector-layer-range") == 0) { /* llama.cpp's: two values */
            if (i + 2 >= argc || !parse_layer(f, argv[i + 1], &o->cvec_first) ||
                !parse_layer(f, argv[i + 2], &o->cvec_last)) {
                if (i + 2 >= argc) fprintf(stderr, "kvllm: %s: expects START END\n", f);
                return false;
            }
            i += 2;
            continue;
        }
        const int habit = llama_habit(f, i + 1 < argc ? argv[i + 1] : NULL);
        if (habit < 0) return false;
        if (habit > 0) {
            i += habit - 1;
            continue;
        }
        if (i + 1 < argc) {
            const int valued = vllm_valued(o, f, argv[i + 1]);
            if (valued < 0) return false;
            if (valued > 0) {
                i++;
                continue;
            }
        }
        const size_t fl = strlen(f);
        if (f[0] != '-' && !o->model_path && fl > 5 && strcmp(f + fl - 5, ".gguf") == 0) {
            o->model_path = f; /* vLLM's `vllm serve MODEL`: the model as the bare argument */
            continue;
        }
        if (f[0] != '-') {
            fprintf(stderr, "kvllm: unexpected argument '%s'\n", f);
            return false;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvllm: %s: missing value, or unknown flag\n", f);
            return false;
        }
        bool unknown = false;
        if (!apply_flag(o, f, argv[++i], &unknown)) {
            if (unknown) fprintf(stderr, "kvllm: unknown flag '%s' (see kvllm --help)\n", f);
            return false;
        }
    }
    if (o->verbose) kvl_log_level = KVL_LOG_INFO;
    if (!hf_model(o)) return false;
    kvl_error lerr = {{0}};
    if (o->log_file && !kvl_log_to_file(o->log_file, &lerr)) {
        fprintf(stderr, "kvllm: %s\n", lerr.msg);
        return false;
    }
    if (o->n_threads > 0) kvl_pool_set_threads(o->n_threads);
    /* what still uses OpenMP (bench's bandwidth probe) runs on as many threads
     * as the pool: -t, else its default (a cgroup's CPU quota included) */
    omp_set_num_threads(kvl_pool_threads());
    if (o->model_draft && o->spec == ENGINE_SPEC_OFF) o->spec = ENGINE_SPEC_DRAFT; /* implied */
    if (o->spec == ENGINE_SPEC_DRAFT && !o->model_draft) {
        fprintf(stderr, "kvllm: --spec draft needs --model-draft FILE\n");
        return false;
    }
    if (o->batch_tokens < 1 || o->ubatch < 1) {
        fprintf(stderr, "kvllm: -b and -ub must be positive\n");
        return false;
    }
    return true;
}

/* The bundled model, found from the working directory or beside the binary. */
static const char *default_model(char *buf, size_t cap) {
    if (access(DEFAULT_MODEL, R_OK) == 0) return DEFAULT_MODEL;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(buf, cap, "%s/../%s", exe, DEFAULT_MODEL);
        if (access(buf, R_OK) == 0) return buf;
    }
    return DEFAULT_MODEL;
}

/* Loading progress on stderr: redrawn in place on a terminal, else a line
 * every few seconds; nothing for a load that ends within a second. */
typedef struct load_progress {
    const char *path;
    double t0, last;
    bool tty, shown;
} load_progress;

static void on_load_progress(double done, void *user) {
    load_progress *p = user;
    double now = kvl_time_s(), el = now - p->t0;
    if (done >= 1) {
        if (p->shown)
            fprintf(stderr, "%skvllm: loaded %s in %.1f s\n", p->tty ? "\r\033[K" : "", p->path,
                    el);
        return;
    }
    if (el < 1.0 || now - p->last < (p->tty ? 0.2 : 5.0)) return;
    p->last = now;
    p->shown = true;
    fprintf(stderr, "%skvllm: loading %s: %3.0f%% (%.0f s)%s", p->tty ? "\r\033[K" : "", p->path,
            100.0 * done, el, p->tty ? "" : "\n");
}

/* --model-draft: loaded like the model; its vocabulary must be the model's,
 * token for token, since drafted ids are verified as the model's ids. */
static bool load_draft(const cli_opts *o, const char *main_path, cli_model *cm) {
    const char *path = o->model_draft;
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "kvllm: --model-draft: %s\n", err.msg);
        return false;
    }
    tok_vocab *v = tok_vocab_create(f, &err);
    if (!v) {
        fprintf(stderr, "kvllm: --model-draft %s: %s\n", path, err.msg);
        gguf_close(f);
        return false;
    }
    model_params mp = {.max_ctx = o->n_ctx > 0 ? o->n_ctx : 0,
                       .max_ctx_cap = CLI_DEFAULT_CTX,
                       .max_ubatch = o->ubatch,
                       .no_repack = o->no_repack};
    cm->draft = model_load(f, &mp, &err); /* takes f */
    bool ok = cm->draft != NULL;
    if (!ok) fprintf(stderr, "kvllm: --model-draft %s: %s\n", path, err.msg);
    int32_t n = tok_n_vocab(cm->vocab);
    if (ok && (tok_n_vocab(v) != n || model_hp(cm->draft)->n_vocab != model_hp(cm->m)->n_vocab)) {
        fprintf(stderr,
                "kvllm: --model-draft %s: its vocabulary has %d tokens (%lld logits), %s's has %d "
                "(%lld): "
                "the draft model must share the model's vocabulary\n",
                path, tok_n_vocab(v), (long long)model_hp(cm->draft)->n_vocab, main_path, n,
                (long long)model_hp(cm->m)->n_vocab);
        ok = false;
    }
    for (int32_t i = 0; ok && i < n; i++) {
        const char *a = tok_piece(cm->vocab, i), *b = tok_piece(v, i);
        if (strcmp(a ? a : "", b ? b : "") != 0) {
            fprintf(stderr,
                    "kvllm: --model-draft %s: token %d is '%s' there but '%s' in %s: the draft "
                    "model must "
                    "share the model's vocabulary\n",
                    path, i, b ? b : "", a ? a : "", main_path);
            ok = false;
        }
    }
    tok_vocab_destroy(v);
    if (!ok) {
        model_destroy(cm->draft);
        cm->draft = NULL;
    }
    return ok;
}

int cli_rope_overrides(const cli_opts *o, const gguf_file *f, char spec[CLI_ROPE_SPECS][192]) {
    int n = 0;
    const char *arch = NULL;
    size_t alen = 0;
    if (!o->rope_scaling && !(o->rope_factor > 0) && !(o->rope_freq_base > 0) &&
        o->yarn_orig_ctx <= 0)
        return 0;
    if (!gguf_get_str(f, "general.architecture", &arch, &alen) || alen > 64) {
        fprintf(stderr, "kvllm: %s: no general.architecture for the rope flags\n", gguf_path(f));
        return -1;
    }
    if (o->rope_scaling)
        snprintf(spec[n++], 192, "%.*s.rope.scaling.type=str:%s", (int)alen, arch, o->rope_scaling);
    if (o->rope_factor > 0)
        snprintf(spec[n++], 192, "%.*s.rope.scaling.factor=float:%.9g", (int)alen, arch,
                 o->rope_factor);
    if (o->rope_freq_base > 0)
        snprintf(spec[n++], 192, "%.*s.rope.freq_base=float:%.9g", (int)alen, arch,
                 o->rope_freq_base);
    if (o->yarn_orig_ctx > 0)
        snprintf(spec[n++], 192, "%.*s.rope.scaling.original_context_length=int:%lld", (int)alen,
                 arch, (long long)o->yarn_orig_ctx);
    return n;
}

bool cli_apply_overrides(const cli_opts *o, gguf_file *f) {
    /* llama.cpp's rope flags as the keys they stand for (its context params
     * take the same values from either), then --override-kv, which wins */
    char spec[CLI_ROPE_SPECS][192];
    const int n = cli_rope_overrides(o, f, spec);
    if (n < 0) return false;
    for (int i = 0; i < n + o->n_override_kv; i++) {
        kvl_error err = {{0}};
        if (!gguf_override_kv(f, i < n ? spec[i] : o->override_kv[i - n], &err)) {
            fprintf(stderr, "kvllm: %s: %s\n", gguf_path(f), err.msg);
            return false;
        }
    }
    return true;
}

bool cli_load(const cli_opts *o, bool want_weights, cli_model *cm) {
    memset(cm, 0, sizeof *cm);
    char buf[PATH_MAX + 64];
    const char *path = o->model_path ? o->model_path : default_model(buf, sizeof buf);
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "kvllm: %s\n", err.msg);
        return false;
    }
    if (!cli_apply_overrides(o, f)) {
        gguf_close(f);
        return false;
    }
    cm->vocab = tok_vocab_create(f, &err);
    if (!cm->vocab) {
        fprintf(stderr, "kvllm: %s: %s\n", path, err.msg);
        gguf_close(f);
        return false;
    }
    if (!want_weights) {
        cm->gguf_vocab_only = f;
        return true;
    }
    int64_t ctx = o->n_ctx;
    /* Scratch is sized for the run's context (-c, else the default context),
     * never for the file's context_length alone: a file may claim 2^32 - 1. */
    load_progress lp = {.path = path, .t0 = kvl_time_s(), .tty = isatty(STDERR_FILENO)};
    model_params mp = {.max_ctx = ctx > 0 ? ctx : 0,
                       .max_ctx_cap = CLI_DEFAULT_CTX,
                       .max_ubatch = o->ubatch,
                       .no_repack = o->no_repack,
                       .yarn_override = o->yarn_set,
                       .yarn_ext_factor = o->yarn_ext,
                       .yarn_attn_factor = o->yarn_attn,
                       .yarn_beta_fast = o->yarn_beta_fast,
                       .yarn_beta_slow = o->yarn_beta_slow,
                       .chunks_keep_kv = o->chunks_keep_kv,
                       .progress = on_load_progress,
                       .progress_user = &lp};
    if (!cli_pp_prepare(o, f, &mp)) {
        tok_vocab_destroy(cm->vocab);
        cm->vocab = NULL;
        gguf_close(f);
        return false;
    }
    cm->m = model_load(f, &mp, &err); /* takes f, even on failure */
    if (!cm->m && o->pp > 0) {
        fprintf(stderr, "kvllm: rank %d: %s\n", cli_pp_rank(), err.msg);
        pp_abort(1);
    }
    if (!cm->m) {
        fprintf(stderr, "kvllm: %s\n", err.msg);
        tok_vocab_destroy(cm->vocab);
        cm->vocab = NULL;
        return false;
    }
    if (tok_n_vocab(cm->vocab) > model_hp(cm->m)->n_vocab) {
        fprintf(stderr, "kvllm: %s: vocabulary has %d tokens but token_embd has %lld rows\n", path,
                tok_n_vocab(cm->vocab), (long long)model_hp(cm->m)->n_vocab);
        cli_unload(cm);
        return false;
    }
    for (int i = 0; i < o->n_lora; i++) {
        gguf_file *lf = gguf_open(o->lora_path[i], &err);
        const float scale = o->lora_init_without_apply ? 0.0f : o->lora_scale[i];
        if (!lf || model_lora_add(cm->m, lf, scale, &err) < 0) { /* takes lf */
            fprintf(stderr, "kvllm: %s\n", err.msg);
            cli_unload(cm);
            return false;
        }
    }
    for (int i = 0; i < o->n_cvec; i++) {
        gguf_file *cf = gguf_open(o->cvec_path[i], &err);
        const bool ok = cf && model_cvec_add(cm->m, cf, o->cvec_scale[i], &err);
        gguf_close(cf);
        if (!ok) {
            fprintf(stderr, "kvllm: --control-vector: %s\n", err.msg);
            cli_unload(cm);
            return false;
        }
    }
    if (o->n_cvec) {
        model_cvec_set_range(cm->m, o->cvec_first, o->cvec_last);
        int applied = 0, first = -1, last = -1; /* the layers that get a vector */
        for (int il = 0; il < (int)model_hp(cm->m)->n_layer; il++)
            if (model_cvec_layer(cm->m, il)) {
                applied++;
                if (first < 0) first = il;
                last = il;
            }
        if (applied)
            kvl_log(KVL_LOG_INFO, "control vectors: %d file(s) on layers %d-%d", o->n_cvec, first,
                    last);
        else
            kvl_log(KVL_LOG_WARN, "control vectors: layer range %d-%d leaves none of layers 1-%d",
                    o->cvec_first, o->cvec_last, (int)model_hp(cm->m)->n_layer - 1);
    }
    if (o->model_draft && !load_draft(o, path, cm)) {
        cli_unload(cm);
        return false;
    }
    return cli_pp_attach(o, cm); /* ranks > 0 do not return */
}

void cli_engine_config(const cli_opts *o, const cli_model *cm, engine_config *ec) {
    engine_config_default(ec);
    ec->n_ctx = o->n_ctx > 0 ? o->n_ctx : cli_default_ctx(model_hp(cm->m));
    ec->block_size = o->block_size;
    ec->kv_dtype = o->kv_dtype;
    ec->kv_dtype_v = o->kv_dtype_v;
    ec->n_blocks = o->kv_blocks;
    ec->max_batch_tokens = o->batch_tokens;
    ec->no_kv_cache = o->no_kv_cache;
    ec->spec = (engine_spec_mode)o->spec;
    ec->spec_k = o->spec_k;
    ec->spec_ngram = o->spec_ngram;
    ec->spec_fixed = o->spec_fixed;
    ec->draft_model = cm->draft;
}

void cli_unload(cli_model *cm) {
    cli_pp_detach(cm);
    tok_vocab_destroy(cm->vocab);
    model_destroy(cm->m);
    model_destroy(cm->draft);
    gguf_close(cm->gguf_vocab_only);
    memset(cm, 0, sizeof *cm);
}

const gguf_file *cli_gguf(const cli_model *cm) {
    return cm->m ? model_gguf(cm->m) : cm->gguf_vocab_only;
}

bool cli_parse_ids(const char *s, int32_t **ids, int64_t *n) {
    size_t cap = 16;
    int64_t count = 0;
    int32_t *out = malloc(cap * sizeof *out);
    const char *p = s;
    while (out && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "kvllm: token ids: bad id at '%.20s'\n", p);
            free(out);
            return false;
        }
        if (!kvl_grow((void **)&out, &cap, (size_t)count + 1, sizeof *out, 16)) {
            free(out); /* never run a prompt cut short */
            out = NULL;
            break;
        }
        out[count++] = (int32_t)v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (!out) {
        fprintf(stderr, "kvllm: token ids: out of memory\n");
        return false;
    }
    *ids = out;
    *n = count;
    return true;
}

char *cli_read_input(const char *path, size_t *len, kvl_error *err) {
    return strcmp(path, "-") != 0 ? kvl_read_file(path, len, err)
                                  : kvl_read_stream(stdin, "stdin", len, err);
}

bool cli_prompt_ids(const cli_opts *o, const tok_vocab *v, bool add_bos, int32_t **ids,
                    int64_t *n) {
    if (o->prompt_ids) return cli_parse_ids(o->prompt_ids, ids, n);
    char *text = NULL;
    size_t len = 0;
    kvl_error err = {{0}};
    if (o->prompt_file) {
        text = cli_read_input(o->prompt_file, &len, &err);
        if (!text) {
            fprintf(stderr, "kvllm: %s\n", err.msg);
            return false;
        }
    } else {
        text = strdup(o->prompt ? o->prompt : "");
        len = strlen(text);
    }
    /* The caller owns *ids only on success: on failure it stays NULL, so a
     * caller's cleanup path may free it unconditionally. */
    *ids = tok_encode_alloc(v, text, len, add_bos, o->parse_special, NULL, 0, n, &err);
    free(text);
    if (!*ids) {
        fprintf(stderr, "kvllm: tokenize: %s\n", err.msg);
        return false;
    }
    return true;
}

bool cli_add_bos(const cli_opts *o, const tok_vocab *v) { return tok_add_bos(v) && !o->no_bos; }

int cli_run_prompt(int argc, char **argv, cli_extra_fn extra, void *ctx, bool want_weights,
                   cli_prompt_fn fn) {
    cli_opts o;
    if (!cli_parse_ex(argc, argv, &o, extra, ctx)) return 2;
    cli_model cm;
    if (!cli_load(&o, want_weights, &cm)) return 1;
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = 1;
    if (cli_prompt_ids(&o, cm.vocab, cli_add_bos(&o, cm.vocab), &ids, &n)) rc = fn(&o, &cm, ids, n);
    free(ids);
    cli_unload(&cm);
    return rc;
}

cJSON *cli_bytes_json(const char *p, size_t n) {
    /* Copy valid UTF-8 sequences; replace anything else with U+FFFD. */
    char *out = malloc(n * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; out && i < n;) {
        unsigned char c = (unsigned char)p[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (int k = 1; ok && k < len; k++) ok = ((unsigned char)p[i + k] >> 6) == 2;
        if (ok && len == 1 && c == 0) ok = false;
        if (ok) {
            memcpy(out + o, p + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    if (!out) return cJSON_CreateString("");
    out[o] = 0;
    cJSON *j = cJSON_CreateString(out);
    free(out);
    return j;
}

cJSON *cli_token_text_json(const tok_vocab *v, int32_t id) {
    char buf[256];
    size_t n = tok_token_bytes(v, id, true, buf, sizeof buf);
    if (n <= sizeof buf) return cli_bytes_json(buf, n);
    char *big = malloc(n);
    if (!big) return cJSON_CreateString("");
    tok_token_bytes(v, id, true, big, n);
    cJSON *j = cli_bytes_json(big, n);
    free(big);
    return j;
}

void cli_print_json(cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    }
    cJSON_Delete(j);
}

int64_t cli_kv_blocks_from_memory(size_t block_bytes, int64_t held_bytes, int64_t n_ctx,
                                  int block_size, int max_seqs, double fraction, const char *who) {
    int64_t per_seq = (n_ctx + block_size - 1) / block_size;
    int64_t want = per_seq * max_seqs;
    const kvl_mem_status st = kvl_mem_status_at("");
    int64_t avail = st.available;
    /* which figure bounds it, for the messages */
    const char *what = st.by_cgroup ? "the memory cgroup's room" : "MemAvailable";
    if (avail >= 0) avail -= held_bytes < avail / 2 ? held_bytes : avail / 2;
    if (avail < 0 || block_bytes == 0) {
        fprintf(stderr,
                "kvllm %s: cannot read MemAvailable: KV pool sized for %d full-context sequences\n",
                who, max_seqs);
        return want;
    }
    int64_t fit = (int64_t)(fraction * (double)avail) / (int64_t)block_bytes;
    if (fit < per_seq) {
        fprintf(stderr,
                "kvllm %s: %g x %s (%.1f MiB) holds %lld KV blocks of %zu bytes, less than one "
                "%lld-token sequence needs (%lld); lower -c, use --kv-type q8_0, or set "
                "--kv-memory / --kv-blocks\n",
                who, fraction, what, (double)avail / 1048576.0, (long long)fit, block_bytes,
                (long long)n_ctx, (long long)per_seq);
        return 0;
    }
    int64_t n = fit < want ? fit : want;
    fprintf(stderr, "kvllm %s: KV pool from memory: %g x %s %.1f MiB -> %lld blocks (%s)\n", who,
            fraction, what, (double)avail / 1048576.0, (long long)n,
            n == want ? "capped at --max-seqs full-context sequences" : "limited by memory");
    return n;
}

engine_pooling cli_pooling(const gguf_file *f) {
    char arch[64], key[96];
    uint32_t t = 0;
    if (!gguf_get_str_buf(f, "general.architecture", arch, sizeof arch)) return ENGINE_POOL_LAST;
    snprintf(key, sizeof key, "%s.pooling_type", arch);
    if (!gguf_get_u32(f, key, &t)) return ENGINE_POOL_LAST;
    switch (t) {
    case 1: return ENGINE_POOL_MEAN;
    case 2: return ENGINE_POOL_CLS;
    case 3: return ENGINE_POOL_LAST;
    case 4: /* rank: a reranker (POST /rerank); its hidden states pool as the last token's */
        return ENGINE_POOL_LAST;
    default:
        fprintf(stderr,
                "kvllm: %s = %u (none) is not supported for /v1/embeddings: using the last "
                "token\n",
                key, t);
        return ENGINE_POOL_LAST;
    }
}
