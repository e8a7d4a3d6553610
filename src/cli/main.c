/* kvllm: command-line entry point; dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "hub.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
    /* --help: the command's own usage, or a synopsis followed by the common
     * options; neither: the command answers --help itself. */
    void (*usage)(FILE *out);
    const char *synopsis;
} command;

static void common_options(FILE *out);

static const command COMMANDS[] = {
    {"run", cmd_run, "generate text from a prompt (streams to stdout)", NULL,
     "kvllm run [-m MODEL] (-p TEXT | -f FILE | -f - | --prompt-ids 1,2,3) [options]\n"
     "  -cnv, --conversation  chat with the model instead (as `kvllm chat`)"},
    {"chat", cmd_chat, "interactive conversation in the terminal, with the chat template", NULL,
     NULL},
    {"score", cmd_score, "teacher-forced log-probabilities of a token sequence", NULL,
     "kvllm score [-m MODEL] (--ids 1,2,3 | -p TEXT | -f FILE) [--top-logprobs K] [--json]"},
    {"perplexity", cmd_perplexity, "perplexity of a text file, as llama-perplexity computes it",
     NULL,
     "kvllm perplexity [-m MODEL] -f FILE [-c N] [--chunks N] [--kv-type T] [--kl-base T] "
     "[--json]"},
    {"tokenize", cmd_tokenize, "text to token ids and pieces", NULL,
     "kvllm tokenize [-m MODEL] (-p TEXT | -f FILE | -f -) [--no-bos] [--parse-special] [--json]"},
    {"chat-template", cmd_chat_template, "render a conversation with a Jinja chat template", NULL,
     NULL},
    {"info", cmd_info, "architecture, hyperparameters, tensor types, KV bytes per token", NULL,
     "kvllm info [-m MODEL] [--json] | kvllm info --archs"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching", NULL, NULL},
    {"run-batch", cmd_run_batch,
     "vLLM's offline batch runner: OpenAI batch-format JSONL in, results out", cmd_run_batch_usage,
     NULL},
    {"loadgen", cmd_loadgen, "load generator for a running server (throughput, TTFT/TPOT/ITL)",
     NULL, NULL},
    {"kv-plan", cmd_kv_plan, "KV cache capacity planner (calculated vs allocated)",
     cmd_kv_plan_usage, NULL},
    {"synth", cmd_synth, "write a random-weight GGUF of a real model's shape (for benchmarks)",
     cmd_synth_usage, NULL},
    {"bench", cmd_bench, "prefill/decode tokens/s, batched decode, context sweep, memory bandwidth",
     cmd_bench_usage, NULL},
};

static bool has_flag(int argc, char **argv, const char *a, const char *b) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], a) == 0 || (b && strcmp(argv[i], b) == 0)) return true;
    return false;
}

static bool wants_help(int argc, char **argv) {
    return has_flag(argc, argv, "-h", "--help") || has_flag(argc, argv, "--usage", NULL);
}

void cli_usage(FILE *out) {
    fprintf(out,
            "kvllm %s - an LLM inference engine built around the KV cache\n\n"
            "usage: kvllm COMMAND [options]\n\ncommands:\n",
            KVLLM_VERSION);
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(out, "  %-13s %s\n", COMMANDS[i].name, COMMANDS[i].help);
    common_options(out);
}

static void common_options(FILE *out) {
    fprintf(
        out,
        "\ncommon options:\n"
        "  -m FILE            GGUF model (default: models/stories260K.gguf)\n"
        "  -hf USER/MODEL[:QUANT]  the model from Hugging Face (downloaded into its cache;\n"
        "                     -hff FILE picks a file, -hft TOKEN or $HF_TOKEN, --offline)\n"
        "  -mu URL            the model from a URL (into -m's path, else llama.cpp's cache)\n"
        "  -dr [REPO/]MODEL[:TAG]  the model from Docker Hub's model registry (ai/, latest)\n"
        "  -p TEXT | -f FILE  prompt text / file (-f -: stdin);  --prompt-ids 1,2,3 (score: "
        "--ids)\n"
        "                     -p's \\n \\t \\r \\\\ \\\" \\' \\xHH are processed (llama.cpp's -e; "
        "also in\n"
        "                     --stop / -r); --no-escape: as written. -f's text is as written\n"
        "  -n N               max new tokens (default 128; -1: until the context is full)\n"
        "  -c N               context size (default: the model's, at most 4096)\n"
        "  -t N               threads (default: OMP_NUM_THREADS, else the CPUs the process "
        "may use:\n"
        "                     its affinity, at most a cgroup's CPU quota, e.g. docker "
        "--cpus)\n"
        "  --temp T --top-k K --top-p P --min-p P --seed S (-s S)\n"
        "  --repeat-penalty R --repeat-last-n N --presence-penalty P --frequency-penalty P\n"
        "  --typical P --top-nsigma N --xtc-probability P --xtc-threshold T --min-keep N\n"
        "  --dynatemp-range R --dynatemp-exp E --mirostat 1|2 --mirostat-lr ETA\n"
        "  --mirostat-ent TAU --dry-multiplier M --dry-base B --dry-allowed-length N\n"
        "  --dry-penalty-last-n N --dry-sequence-breaker S (repeatable; none: no breakers)\n"
        "  --sampling-seq edskypmxt (llama's samplers, in that order; --samplers "
        "\"top_k;temperature\" by name)\n"
        "  (kvllm serve: each sampling flag is every request's default for its field)\n"
        "  --rope-scaling none|linear|yarn --rope-scale N --rope-freq-scale N\n"
        "  --rope-freq-base N --yarn-orig-ctx N   (llama.cpp's: the GGUF's rope keys)\n"
        "  --yarn-ext-factor N --yarn-attn-factor N --yarn-beta-fast N --yarn-beta-slow N\n"
        "                     (llama.cpp's YaRN parameters; negative: the file's)\n"
        "  --stop STRING (repeatable)  --ignore-eos  --no-bos  --parse-special\n"
        "  --json  --top-logprobs K\n"
        "  --block-size N (default 16)  --kv-blocks N  --no-kv-cache\n"
        "  --kv-type f32|f16|bf16|q8_0|q5_0|q4_0|iq4_nl|fp8 (default f16)  --kv-type-k T  "
        "--kv-type-v T\n"
        "  --lora FILE[,FILE]  LoRA adapters (llama.cpp's GGUF adapters), scale 1\n"
        "  --lora-scaled FILE:SCALE[,...]  the same with a scale each\n"
        "  --lora-init-without-apply  load them with scale 0 (serve: set per request or by\n"
        "                     POST /lora-adapters)\n"
        "  --control-vector FILE[,FILE]  control vectors (llama.cpp's cvector files), added\n"
        "                     to each layer's output; --control-vector-scaled FILE:SCALE[,...]\n"
        "  --control-vector-layer-range START END  the layers they apply to (default 1..n)\n"
        "  --override-kv KEY=TYPE:VALUE  the model's metadata as if KEY held VALUE (TYPE int,\n"
        "                     float, bool, str; repeatable), as llama.cpp's flag\n"
        "  -b N               max tokens per scheduler step (default 2048)\n"
        "  --spec off|ngram|draft  speculative decoding (default off): ngram drafts by prompt\n"
        "                     lookup, draft by --model-draft FILE (same vocabulary; implies\n"
        "                     --spec draft), verified in one forward; output identical to "
        "plain decoding\n"
        "  --spec-k N         most drafted tokens per step (default 4)  --spec-ngram N "
        "(default 3)\n"
        "  --spec-fixed       always draft --spec-k tokens when there are any (default: as\n"
        "                     many as pay, from acceptance and the measured step cost)\n"
        "  --no-repack, -nr   keep matmul weights in their GGUF layout (default: repacked\n"
        "                     at load into the CPU kernels' panels, about the same size)\n"
        "  -v                 verbose log\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        cli_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kvllm %s\n", KVLLM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++) {
        const command *c = &COMMANDS[i];
        if (strcmp(argv[1], c->name) != 0) continue;
        /* llama.cpp's: --version and --cache-list (-cl) answer and exit, whatever else */
        if (has_flag(argc - 2, argv + 2, "--version", NULL)) {
            printf("kvllm %s\n", KVLLM_VERSION);
            return 0;
        }
        if (has_flag(argc - 2, argv + 2, "-cl", "--cache-list")) {
            hub_list_cached(stdout);
            return 0;
        }
        if ((c->usage || c->synopsis) && wants_help(argc - 2, argv + 2)) {
            if (c->usage) {
                c->usage(stdout);
            } else {
                printf("usage: %s\n\n%s.\n", c->synopsis, c->help);
                common_options(stdout);
            }
            return 0;
        }
        return c->fn(argc - 2, argv + 2);
    }
    fprintf(stderr, "kvllm: unknown command '%s' (try kvllm --help)\n", argv[1]);
    return 2;
}
