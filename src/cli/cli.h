/* cli: the kvllm command-line front end. Parses flags, loads things through the
 * library, prints results. No model logic lives here. */
#ifndef KVLLM_CLI_H
#define KVLLM_CLI_H

#include <cjson/cJSON.h>

#include "base.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "pp.h"
#include "tokenizer.h"

#define CLI_MAX_STOP        16
#define CLI_MAX_OVERRIDE_KV 32
#define CLI_MAX_CVEC        16

typedef struct cli_opts {
    const char *cmd;
    const char *model_path;
    /* -hf USER/MODEL[:QUANT], -hff FILE, -hft TOKEN, --offline (llama.cpp's): the
     * model from the Hugging Face cache, downloaded when missing; model_path then
     * points to hf_path */
    const char *hf_repo, *hf_file, *hf_token;
    const char *model_url;   /* -mu URL: downloaded to -m's path, else llama.cpp's cache */
    const char *docker_repo; /* -dr [REPO/]MODEL[:TAG]: Docker Hub's model registry */
    bool offline;
    bool no_escape; /* --no-escape: -p, --stop / -r, --dry-sequence-breaker as written */
    char hf_path[8192];
    const char *hf_repo_draft; /* -hfd USER/MODEL[:QUANT]: the draft model the same way */
    char hf_draft_path[8192];
    const char *prompt;      /* -p */
    const char *prompt_file; /* -f */
    const char *prompt_ids;  /* --prompt-ids / --ids */
    int64_t n_ctx;           /* -c */
    int n_threads;           /* -t */
    /* Parsed straight into the engine's request: -n (max_tokens), the sampling
     * flags, --top-logprobs, --ignore-eos and the count of --stop strings (the
     * strings are in stop: point req.stop there when submitting). */
    engine_request req;
    bool dry_breakers_given; /* the first --dry-sequence-breaker replaces llama's defaults */
    uint32_t sampling_set;   /* SAMPLER_SET_* of the sampling flags given (serve: defaults) */
    bool n_predict_given;    /* -n was given (serve: the requests' default length) */
    /* llama.cpp's rope flags, turned into the GGUF keys they stand for
     * (cli_apply_overrides): NULL / 0 where not given */
    const char *rope_scaling; /* --rope-scaling none|linear|yarn */
    float rope_factor;        /* --rope-scale N, or 1 / --rope-freq-scale */
    float rope_freq_base;     /* --rope-freq-base */
    int64_t yarn_orig_ctx;    /* --yarn-orig-ctx */
    /* --yarn-ext-factor, --yarn-attn-factor, --yarn-beta-fast, --yarn-beta-slow
     * (llama.cpp's context parameters, model_params.yarn_*): negative = the file's */
    bool yarn_set;
    float yarn_ext, yarn_attn, yarn_beta_fast, yarn_beta_slow;
    const char *stop[CLI_MAX_STOP];
    bool json, no_bos, parse_special, no_kv_cache, no_repack, verbose;
    const char *log_file; /* --log-file: stderr copied there too (kvl_log_to_file) */
    int block_size;
    int kv_dtype; /* K (and V unless kv_dtype_v >= 0) */
    int kv_dtype_v;
    int64_t kv_blocks;
    int64_t batch_tokens;
    int64_t ubatch;
    int spec;                /* engine_spec_mode: --spec off|ngram (default off) */
    int spec_k;              /* --spec-k: most drafts per step (default 4) */
    int spec_ngram;          /* --spec-ngram: longest n-gram looked up (default 3) */
    bool spec_fixed;         /* --spec-fixed: always spec_k drafts (no adaptation) */
    const char *model_draft; /* --model-draft: the draft model of --spec draft */
    bool chunks_keep_kv;     /* chunked layers (llama4) share the full layers' KV group and keep
                              * all their KV: the disk tier (serve --kv-disk) needs one group */
    int pp;                  /* --pp N: pipeline of N MPI ranks (0: none) */
    const char *pp_layers;   /* --pp-layers 0-13,14-27 (NULL: balanced by bytes) */
    double pp_timeout;       /* --pp-timeout seconds (default 60) */
    int pp_micro;            /* --pp-micro M: micro-batches per step (0: one per rank) */
    int pp_groups;           /* --pp-groups G: steps in flight (0: the ranks, at most 4) */
    /* --lora FILE[,FILE...] / --lora-scaled FILE:SCALE[,...] (llama.cpp's flags): LoRA
     * adapters attached at load with these default scales; --lora-init-without-apply:
     * with 0 instead (a server request or POST /lora-adapters sets them) */
    int n_lora;
    char lora_path[MODEL_MAX_LORA][1024];
    float lora_scale[MODEL_MAX_LORA];
    bool lora_init_without_apply;
    /* --control-vector FILE[,FILE...] / --control-vector-scaled FILE:SCALE[,...]
     * (llama.cpp's): summed into the model's control vectors at load;
     * --control-vector-layer-range START END: the layers they apply to (0: llama.cpp's
     * defaults, 1 and n_layer) */
    int n_cvec;
    char cvec_path[CLI_MAX_CVEC][1024];
    float cvec_scale[CLI_MAX_CVEC];
    int cvec_first, cvec_last;
    /* --override-kv KEY=TYPE:VALUE (llama.cpp's flag, repeatable): the model
     * file's metadata as if it held these values (gguf_override_kv) */
    int n_override_kv;
    const char *override_kv[CLI_MAX_OVERRIDE_KV];
} cli_opts;

/* Applies o's --override-kv specs to f (the model file): false with a message. */
bool cli_apply_overrides(const cli_opts *o, gguf_file *f);

/* Parses argv (after the subcommand). Prints a message and returns false on error.
 * A command may take flags of its own first: extra(flag, value, ctx) (or NULL)
 * returns 2 if it used flag and value, 1 if it used only flag (a switch), 0 if
 * the flag is not its own, -1 on a bad value (after printing why). value may be NULL. */
typedef int (*cli_extra_fn)(const char *flag, const char *value, void *ctx);
bool cli_parse_ex(int argc, char **argv, cli_opts *o, cli_extra_fn extra, void *ctx);
/* The GGUF keys llama.cpp's rope flags stand for, as --override-kv specs of
 * f's architecture; returns how many (-1: f names no architecture, said). */
#define CLI_ROPE_SPECS 4
int cli_rope_overrides(const cli_opts *o, const gguf_file *f, char spec[CLI_ROPE_SPECS][192]);
void cli_usage(FILE *out);

/* Loaded model + vocab. */
typedef struct cli_model {
    model *m;
    tok_vocab *vocab;
    gguf_file *gguf_vocab_only; /* set when only a vocab was loaded */
    model *draft;               /* --model-draft, its vocabulary checked against vocab */
    pp_stage *pp;               /* --pp: this rank's stage (rank 0 only gets here) */
} cli_model;
/* want_weights false: load only the tokenizer (vocab-only files work). */
bool cli_load(const cli_opts *o, bool want_weights, cli_model *cm);
/* A KV cache type's name (--kv-type's values) into *out; false after saying why. */
bool cli_parse_kv_type(const char *flag, const char *v, int *out);
/* The context of a run without -c: the file's context_length, at most
 * CLI_DEFAULT_CTX (llama.cpp's default); the model's scratch is sized the same. */
#define CLI_DEFAULT_CTX 4096
static inline int64_t cli_default_ctx(const model_hparams *hp) {
    return hp->n_ctx_train < CLI_DEFAULT_CTX ? hp->n_ctx_train : CLI_DEFAULT_CTX;
}
/* The engine settings of the common flags: -c (else cli_default_ctx),
 * --block-size, --kv-type*, --kv-blocks, -b, --no-kv-cache, --spec*, the draft
 * model; engine_config_default's for the rest. run, chat and serve start here. */
void cli_engine_config(const cli_opts *o, const cli_model *cm, engine_config *ec);
void cli_unload(cli_model *cm);
/* --pp (cli_pp.c): before loading, MPI and this rank's layers into mp;
 * after loading, the stage (ranks > 0 serve rank 0 there and exit); at
 * unload, the pipeline's end. cli_pp_rank: this process's rank (0 without --pp). */
bool cli_pp_prepare(const cli_opts *o, const gguf_file *f, model_params *mp);
bool cli_pp_attach(const cli_opts *o, cli_model *cm);
void cli_pp_detach(cli_model *cm);
int cli_pp_rank(void);
/* engine_config.step_groups for o: --pp-groups, else one group per rank (up
 * to ENGINE_MAX_STEP_GROUPS) with --pp, else 1. */
int cli_step_groups(const cli_opts *o);
/* --pp, rank 0: the request's KV blocks in bytes on each rank (stderr). */
void cli_pp_report_kv(const cli_model *cm, const engine_req_stats *s);
/* serve --pp, rank 0, before the engine: asks every rank what one KV block
 * of ec's pool settings takes on its layers and what memory it has. With
 * size_pool, sets ec->n_blocks to the least that fits any rank (pp.h's
 * pp_kv_blocks_fit: kv_memory > 0 per rank, else fraction of each host's
 * available memory; at most ec->max_seqs full-context sequences then), printing
 * each rank's figures. rank_bytes[r * MODEL_MAX_KV_GROUPS + g]: rank r's bytes
 * per block of group g; *n_ranks the ranks. False (message printed) when a
 * rank cannot hold one sequence or the ranks do not answer. */
bool cli_pp_kv_size(const cli_model *cm, engine_config *ec, bool size_pool, int64_t kv_memory,
                    double fraction, int64_t *rank_bytes, int *n_ranks);
const gguf_file *cli_gguf(const cli_model *cm);

/* A file's bytes, NUL-terminated (caller frees); "-" reads stdin to its end. */
char *cli_read_input(const char *path, size_t *len, kvl_error *err);
/* Prompt ids from -p/-f/--prompt-ids (-f -: stdin; any bytes: invalid UTF-8 becomes byte tokens).
 * On success the caller owns *ids; on failure *ids is NULL. */
bool cli_prompt_ids(const cli_opts *o, const tok_vocab *v, bool add_bos, int32_t **ids, int64_t *n);
/* Whether a prompt starts with BOS: the vocabulary says so and no --no-bos. */
bool cli_add_bos(const cli_opts *o, const tok_vocab *v);
/* A command on one prompt (score, perplexity, run, tokenize): parses argv as
 * cli_parse_ex does (extra may be NULL), cli_load, the prompt's ids
 * (cli_prompt_ids, BOS as cli_add_bos says), runs fn on the model and the ids
 * (fn may change them in place), then frees the ids and unloads. Returns 2 on
 * a parse error, 1 when loading either fails (message printed), else what fn
 * returns. */
typedef int (*cli_prompt_fn)(const cli_opts *o, cli_model *cm, int32_t *ids, int64_t n);
int cli_run_prompt(int argc, char **argv, cli_extra_fn extra, void *ctx, bool want_weights,
                   cli_prompt_fn fn);
/* Parses "1,2,3". */
bool cli_parse_ids(const char *s, int32_t **ids, int64_t *n);

/* The bytes of a token as a JSON-safe UTF-8 string (invalid bytes -> U+FFFD). */
cJSON *cli_token_text_json(const tok_vocab *v, int32_t id);
/* Appends bytes as valid UTF-8 into a new cJSON string. */
cJSON *cli_bytes_json(const char *p, size_t n);
void cli_print_json(cJSON *j); /* prints one line and deletes j */

/* JSON members written from a struct's fields by a table (cli_json.c), so a
 * field is named once and its type decides how it is written:
 * CLI_JSON(type, field) writes field under its own name, CLI_JSON_AS("name",
 * type, field) under another. Fields: bool, int, int64_t, uint64_t (size_t),
 * float, and char arrays (written as the string in them). */
typedef enum cli_json_kind {
    CLI_JSON_BOOL,
    CLI_JSON_INT,
    CLI_JSON_I64,
    CLI_JSON_U64,
    CLI_JSON_F32,
    CLI_JSON_CHARS,
} cli_json_kind;
#define CLI_JSON_KIND(x)                                                                           \
    _Generic((x),                                                                                \
        bool: CLI_JSON_BOOL,                                                                     \
        int: CLI_JSON_INT,                                                                       \
        int64_t: CLI_JSON_I64,                                                                   \
        uint64_t: CLI_JSON_U64,                                                                  \
        float: CLI_JSON_F32,                                                                     \
        char *: CLI_JSON_CHARS)
typedef struct cli_json_field {
    const char *name;
    size_t offset;
    cli_json_kind kind;
} cli_json_field;
#define CLI_JSON_AS(name, type, field)                                                             \
    { name, offsetof(type, field), CLI_JSON_KIND(((type *)0)->field) }
#define CLI_JSON(type, field) CLI_JSON_AS(#field, type, field)
/* Adds the n fields of the struct at base to j, in table order. Integers are
 * JSON numbers (doubles: exact only to 2^53), or with exact their decimal
 * digits (as cli_json_u64 writes them). CLI_JSON_TABLE: a whole array. */
void cli_json_fields(cJSON *j, const void *base, const cli_json_field *f, size_t n, bool exact);
#define CLI_JSON_TABLE(j, base, table, exact)                                                      \
    cli_json_fields(j, base, table, sizeof table / sizeof *table, exact)
/* Adds v to j as its exact decimal digits. */
void cli_json_u64(cJSON *j, const char *name, uint64_t v);

/* KV pool sizing from the memory available (cli_common.c): the blocks that
 * fraction x kvl_mem_available() (MemAvailable, or less under a memory
 * cgroup's limit; read now, after the weights are loaded) holds, at most
 * max_seqs full-context sequences, at least one. held_bytes is memory it
 * still counts as free that will be in use (weights read through the file
 * mapping), taken off first, up to half of it (weights larger than that
 * stream from the file whatever the pool). block_bytes covers every pool the engine
 * sizes with n_blocks (the draft model's too). Prints what it chose on
 * stderr; returns 0 (message printed) if not even one sequence fits. */
#define CLI_KV_MEMORY_FRACTION 0.5
int64_t cli_kv_blocks_from_memory(size_t block_bytes, int64_t held_bytes, int64_t n_ctx,
                                  int block_size, int max_seqs, double fraction, const char *who);
/* /v1/embeddings pooling: the GGUF's <arch>.pooling_type (llama.cpp's enum:
 * 1 mean, 2 cls, 3 last), else the last token, as decoder-only models use. */
engine_pooling cli_pooling(const gguf_file *f);

/* Subcommands: argv excludes the program and command names. */
int cmd_run(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_serve(int argc, char **argv);     /* src/cli/cmd_serve.c */
int cmd_loadgen(int argc, char **argv);   /* src/cli/cmd_loadgen.c */
int cmd_run_batch(int argc, char **argv); /* src/cli/cmd_run_batch.c */
void cmd_run_batch_usage(FILE *out);
int cmd_kv_plan(int argc, char **argv);       /* src/cli/cmd_kv_plan.c */
int cmd_synth(int argc, char **argv);         /* src/cli/cmd_synth.c */
int cmd_bench(int argc, char **argv);         /* src/cli/cmd_bench.c */
int cmd_chat_template(int argc, char **argv); /* src/cli/cmd_chat_template.c */
int cmd_chat(int argc, char **argv);          /* src/cli/cmd_chat.c */
/* Usage texts of the commands whose flags are their own. */
void cmd_kv_plan_usage(FILE *out);
void cmd_bench_usage(FILE *out);
void cmd_synth_usage(FILE *out);

#endif
