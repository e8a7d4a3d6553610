/* kvllm: command-line entry point; dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command COMMANDS[] = {
    {"run", cmd_run, "generate text from a prompt (streams to stdout)"},
    {"score", cmd_score, "teacher-forced log-probabilities of a token sequence"},
    {"perplexity", cmd_perplexity, "perplexity of a text file, as llama-perplexity computes it"},
    {"tokenize", cmd_tokenize, "text to token ids and pieces"},
    {"info", cmd_info, "architecture, hyperparameters, tensor types, KV bytes per token"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
    {"loadgen", cmd_loadgen, "load generator for a running server (throughput, TTFT/TPOT/ITL)"},
    {"kv-plan", cmd_kv_plan, "KV cache capacity planner (calculated vs allocated)"},
    {"synth", cmd_synth, "write a random-weight GGUF of a real model's shape (for benchmarks)"},
    {"bench", cmd_bench, "prefill/decode tokens/s, batched decode, context sweep, memory bandwidth"},
};

void cli_usage(FILE *out) {
    fprintf(out, "kvllm %s - an LLM inference engine built around the KV cache\n\n"
                 "usage: kvllm COMMAND [options]\n\ncommands:\n", KVLLM_VERSION);
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(out, "  %-11s %s\n", COMMANDS[i].name, COMMANDS[i].help);
    fprintf(out,
            "\ncommon options:\n"
            "  -m FILE            GGUF model (default: models/stories260K.gguf)\n"
            "  -p TEXT | -f FILE  prompt text / file;  --prompt-ids 1,2,3 (score: --ids)\n"
            "  -n N               max new tokens (default 128; -1: until the context is full)\n"
            "  -c N               context size (default: the model's, at most 4096)\n"
            "  -t N               threads (default: all cores)\n"
            "  --temp T --top-k K --top-p P --min-p P --seed S\n"
            "  --repeat-penalty R --repeat-last-n N --presence-penalty P --frequency-penalty P\n"
            "  --stop STRING (repeatable)  --ignore-eos  --no-bos  --parse-special\n"
            "  --json  --top-logprobs K\n"
            "  --block-size N (default 16)  --kv-blocks N  --no-kv-cache\n"
            "  --kv-type f32|f16|bf16|q8_0|fp8 (default f16)  --kv-type-k T  --kv-type-v T\n"
            "  -b N               max tokens per scheduler step (default 2048)\n"
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
        if (strcmp(argv[1], COMMANDS[i].name) != 0) continue;
        return COMMANDS[i].fn(argc - 2, argv + 2);
    }
    fprintf(stderr, "kvllm: unknown command '%s' (try kvllm --help)\n", argv[1]);
    return 2;
}
