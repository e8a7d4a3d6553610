/* kvllm serve: loads the model, sizes the KV pool, creates the engine and
 * hands both to the HTTP server (src/server). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "server.h"
#include "chat_template.h"
#include "kvl_pool.h"
#include "units.h"

typedef struct serve_opts {
    server_config sc;
    char model_first[256]; /* the first name of --alias / --served-model-name */
    const char *kv_memory;
    double kv_memory_fraction;
    int64_t max_seqs, max_batch_tokens;
    bool no_prefix_cache, help;
    bool reranking; /* --reranking: refuse a model without a classifier head */
    int pooling;    /* --pooling (llama-server's): 1 + engine_pooling, 0: the GGUF's */
    const char *reasoning_budget, *reasoning_format;
    char *kwargs_owned;    /* the template kwargs with --reasoning-budget 0's enable_thinking */
    char *owned_origin;    /* --allowed-origins' one origin */
    char *ui_config_owned; /* --ui-config-file's text */
    const char *inline_template; /* --chat-template's Jinja text */
    /* the server's grammar: the flag that gave it, its value, the GBNF made of it */
    const char *grammar_flag, *grammar_value;
    char *grammar_owned;
    const char *kv_disk, *kv_disk_size, *kv_disk_pin_max; /* the disk tier (kv_disk.h) */
    kv_disk_config disk;
    engine_sched scheduling;
    int64_t prefix_admission_wait;
    int64_t kv_rank_bytes[PP_MAX_RANKS * MODEL_MAX_KV_GROUPS]; /* --pp: server_config's */
    const char *lora_modules[MODEL_MAX_LORA];                  /* --lora-modules values, as given */
    int n_lora_modules;
    char lora_names[MODEL_MAX_LORA][128];
} serve_opts;

/* Help lines of server_settings[from, to): "  --FLAG M   DESC (default N; NOTE)". */
static void print_settings(FILE *out, int from, int to) {
    for (int i = from; i < to; i++) {
        const server_setting *st = &server_settings[i];
        int n = fprintf(out, "  %s %s", st->flag, st->metavar);
        fprintf(out, "%*s%s (default %lld%s%s)\n", n < 25 ? 27 - n : 2, "", st->desc,
                (long long)st->def, st->note ? "; " : "", st->note ? st->note : "");
    }
}

static void serve_usage(FILE *out) {
    fputs("usage: kvllm serve -m MODEL [options]\n\n"
          "  --host ADDR              address to bind (default 127.0.0.1)\n",
          out);
    print_settings(out, 0, 1); /* --port */
    fputs(
        "  --api-key KEY            require 'Authorization: Bearer KEY' on /v1/* and /metrics\n"
        "                           (several: KEY1,KEY2, each its own tenant)\n"
        "  --api-prefix PATH        serve every route under PATH (/llm: /llm/v1/chat/completions, "
        "the\n"
        "                           pages at /llm/), as behind a proxy's sub-path\n"
        "  --ssl-key-file FILE      HTTPS: the server's private key (PEM), with --ssl-cert-file\n"
        "  --ssl-cert-file FILE     HTTPS: its certificate (PEM, the chain after it)\n"
        "  --api-key-file FILE      several keys, one a line: 'KEY [TENANT]' ('#' comments); each "
        "key\n"
        "                           is a tenant (keys naming the same TENANT share one)\n"
        "  --metrics-public         /metrics without a key even when keys are set\n"
        "  --prefix-cache-shared    with keys: one prefix cache for all tenants (default: each "
        "tenant\n"
        "                           its own, so none can probe another's prompts)\n"
        "  --served-model-name NAME model id for /v1/models (default: the file name)\n"
        "  --chat-template-file F   Jinja chat template (default: the GGUF's "
        "tokenizer.chat_template,\n"
        "                           rendered as transformers does)\n"
        "  --chat-template NAME     built-in "
        "chatml|llama3|llama2|mistral|gemma|deepseek3|deepseek2;\n"
        "                           or a Jinja template's text, or a file holding one\n"
        "                           (default: the Jinja template; these are the fallback, detected "
        "from\n"
        "                           a template that does not compile; chatml without one)\n"
        "  -c N                     context size (default: the model's, at most 4096)\n"
        "  --block-size N           tokens per KV block (default 16)\n"
        "  --kv-type TYPE           KV element type: f32 f16 bf16 q8_0 q5_0 q4_0 iq4_nl fp8 "
        "(default f16;\n"
        "                           --kv-type-k / --kv-type-v set K and V apart)\n"
        "  --kv-blocks N            KV pool size in blocks\n"
        "  --kv-memory SIZE         KV pool size in bytes (e.g. 2GiB, 512MiB, 100000000)\n"
        "  --kv-memory-fraction F   without --kv-memory/--kv-blocks: the KV pool takes at most F "
        "of\n"
        "                           the memory available (MemAvailable, or less under a memory\n"
        "                           cgroup's limit), measured once the weights are loaded (default "
        "0.5),\n"
        "                           and never more than --max-seqs full-context sequences need\n"
        "                           (--pp: per rank, each rank's layers' share of a block; the "
        "ranks\n"
        "                           on one host share its available memory; the pool is the least "
        "any\n"
        "                           rank holds)\n"
        "  --cors ORIGIN            CORS: Access-Control-Allow-Origin ORIGIN (or *) on every "
        "response,\n"
        "                           OPTIONS preflights answered (default: off)\n"
        "  --max-batch-tokens N     tokens per engine step (default 2048; also -b)\n"
        "  --max-seqs N             running sequences at most (default 64)\n",
        out);
    print_settings(out, 1, 2); /* --max-queue */
    fputs("  --max-body BYTES         largest request body (default 8 MiB; larger: 413)\n", out);
    print_settings(out, 2, server_n_settings);
    fputs(
        "  --no-prefix-cache        disable prefix caching\n"
        "  --metrics-prefix NAME    /metrics' namespace (default kvllm; vllm: vLLM's own names,\n"
        "                           so its dashboards read them)\n"
        "  -sp, --special           write control tokens' text into the output, the end of\n"
        "                           generation's too (llama-server's; skip_special_tokens true "
        "undoes it)\n"
        "  --grammar GBNF, --grammar-file F, -j/--json-schema SCHEMA, -jf/--json-schema-file F\n"
        "                           the output grammar of every request without one of its own "
        "(or tools)\n"
        "  --no-slots               GET /slots answers 501 (llama-server's; --slots: served, "
        "the default)\n"
        "  --slot-save-path DIR     POST /slots/{id}?action=save|restore writes and reads slot "
        "files\n"
        "                           (a slot's ids and KV blocks) in DIR, an existing directory\n"
        "  --chat-template-kwargs JSON  template variables for every chat request (also\n"
        "                           --default-chat-template-kwargs), e.g. "
        "'{\"enable_thinking\": false}';\n"
        "                           a request's chat_template_kwargs win key by key\n"
        "  --reasoning-budget N     -1 unlimited (default), 0 no thinking (enable_thinking "
        "false),\n"
        "                           N: a thinking block's end is forced after N tokens (a "
        "request's\n"
        "                           thinking_budget_tokens wins); --reasoning-budget-message "
        "TEXT\n"
        "                           is forced before that end tag\n"
        "  --reasoning-format F     auto (default; also deepseek): thinking in reasoning_content; "
        "none:\n"
        "                           left in the content\n"
        "  --reranking              insist on a reranker (a classifier head: Qwen3-Reranker "
        "files); POST\n"
        "                           /rerank and /v1/rerank serve any such model without it\n"
        "  --lora FILE[,FILE]       LoRA adapters (llama.cpp's GGUF adapters; --lora-scaled "
        "FILE:SCALE[,...]),\n"
        "                           applied to requests that name none; a request's \"lora\": "
        "[{\"id\", \"scale\"}]\n"
        "                           picks its own, GET / POST /lora-adapters lists / sets them\n"
        "  --control-vector FILE[,FILE]  control vectors for every request (llama.cpp's;\n"
        "                           --control-vector-scaled FILE:SCALE, "
        "--control-vector-layer-range\n"
        "                           START END)\n"
        "  --lora-modules NAME=FILE[,NAME=FILE]  adapters a request applies by \"model\": NAME "
        "(vLLM's way;\n"
        "                           listed by /v1/models; not applied otherwise; with\n"
        "                           VLLM_ALLOW_RUNTIME_LORA_UPDATING=True also loaded and "
        "unloaded\n"
        "                           at run time: POST /v1/load_lora_adapter, "
        "/v1/unload_lora_adapter)\n"
        "  --spec off|ngram|draft   speculative decoding (default off; draft: --model-draft FILE; "
        "a request opts out with\n"
        "                           \"speculative\": false)  --spec-k N (default 4)  --spec-ngram "
        "N (default 3)\n"
        "                           --spec-fixed: always --spec-k drafts (default: as many as "
        "pay)\n"
        "  --kv-disk DIR            a disk tier for the prefix cache: blocks evicted from RAM are\n"
        "                           written there and read back instead of recomputed, also after "
        "a\n"
        "                           restart (same model file, KV type and block size only)\n"
        "  --kv-disk-size SIZE      the tier's size at most (default 20GiB; least recently used "
        "first out)\n"
        "  --kv-disk-pin-max SIZE   bytes of the tier POST /v1/kv/save may pin, kept from the "
        "size\n"
        "                           limit until POST /v1/kv/unpin (default: half of "
        "--kv-disk-size)\n"
        "  --scheduling-policy P    fcfs (default; a request 'priority' other than 0 is refused) "
        "or\n"
        "                           priority (lower 'priority' first; preemption takes the "
        "highest)\n"
        "  --prefix-admission-wait N  admit the waiting request with the longest cached prefix "
        "first,\n"
        "                           unless the next in order was passed over N times (default 0: "
        "off)\n"
        "  -t N                     threads;  -v  log every request\n",
        out);
}

/* A size flag's value (kvl_parse_size: "2GiB", "512M", "16GB", "100000"). */
static bool parse_size(const char *v, int64_t *out) {
    uint64_t x;
    if (!kvl_parse_size(v, &x)) return false;
    *out = (int64_t)x;
    return true;
}

static bool parse_int(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "kvllm: %s: expected an integer in %lld..%lld\n", flag, (long long)lo,
                (long long)hi);
        return false;
    }
    *out = x;
    return true;
}

static int serve_switch(const char *f, serve_opts *so) {
    if (strcmp(f, "--no-prefix-cache") == 0 || strcmp(f, "--no-enable-prefix-caching") == 0)
        so->no_prefix_cache = true; /* (vLLM's name) */
    else if (strcmp(f, "--metrics-public") == 0) so->sc.metrics_public = true;
    else if (strcmp(f, "--prefix-cache-shared") == 0) so->sc.prefix_cache_shared = true;
    else if (strcmp(f, "--reranking") == 0 || strcmp(f, "--rerank") == 0) so->reranking = true;
    else if (strcmp(f, "--no-webui") == 0) so->sc.no_webui = true;
    else if (strcmp(f, "--special") == 0 || strcmp(f, "-sp") == 0) so->sc.special = true;
    else if (strcmp(f, "--props") == 0) so->sc.props_endpoint = true;
    else if (strcmp(f, "--prefill-assistant") == 0) so->sc.prefill_assistant = true;
    else if (strcmp(f, "--no-prefill-assistant") == 0) so->sc.prefill_assistant = false;
    else if (strcmp(f, "--no-cache-prompt") == 0) so->no_prefix_cache = true; /* (llama's) */
    else if (strcmp(f, "--no-ui") == 0) so->sc.no_webui = true;
    else if (strcmp(f, "--slots") == 0) so->sc.no_slots = false; /* llama-server's default */
    else if (strcmp(f, "--no-slots") == 0) so->sc.no_slots = true;
    else if (strcmp(f, "--metrics") == 0 || strcmp(f, "--embedding") == 0 ||
             strcmp(f, "--embeddings") == 0 || strcmp(f, "-cb") == 0 ||
             strcmp(f, "--cont-batching") == 0)
        fprintf(stderr,
                "kvllm: note: %s: always on here (/metrics, /v1/embeddings, continuous "
                "batching)\n",
                f);
    else if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) so->help = true;
    else return 0;
    return 1;
}

/* vLLM's --allowed-origins: a JSON list of origins (or one origin). kvllm's
 * --cors sends one Access-Control-Allow-Origin, so a list of one, or "*". */
static bool allowed_origins(const char *v, serve_opts *so) {
    cJSON *j = cJSON_Parse(v);
    const cJSON *one =
        cJSON_IsArray(j) && cJSON_GetArraySize(j) == 1 ? cJSON_GetArrayItem(j, 0) : NULL;
    bool ok = !j || cJSON_IsString(one);
    if (!j) so->sc.cors_origin = v; /* a bare origin */
    else if (ok) {
        so->owned_origin = strdup(one->valuestring);
        so->sc.cors_origin = so->owned_origin;
        ok = so->owned_origin != NULL;
    }
    cJSON_Delete(j);
    if (!ok)
        fprintf(stderr,
                "kvllm: --allowed-origins: '%s': one origin (a JSON list of one, e.g. "
                "'[\"*\"]'); kvllm answers one Access-Control-Allow-Origin (--cors ORIGIN)\n",
                v);
    return ok;
}

/* --ui-config JSON / --ui-config-file PATH: the web UI's default settings, a
 * JSON object (llama-server hands any JSON out; its UI reads an object). */
static bool ui_config(serve_opts *so, const char *f, const char *v) {
    char *text = NULL;
    if (strstr(f, "file")) {
        kvl_error err = {{0}};
        size_t len;
        text = cli_read_input(v, &len, &err);
        if (!text) {
            fprintf(stderr, "kvllm: %s %s: %s\n", f, v, err.msg);
            return false;
        }
    }
    cJSON *j = cJSON_Parse(text ? text : v);
    const bool ok = cJSON_IsObject(j);
    cJSON_Delete(j);
    if (!ok) {
        fprintf(
            stderr,
            "kvllm: %s: not a JSON object of settings (e.g. '{\"showTokensPerSecond\": true}')\n",
            f);
        free(text);
        return false;
    }
    free(so->ui_config_owned);
    so->ui_config_owned = text;
    so->sc.ui_config = text ? text : v;
    return true;
}

/* cli_parse_ex hook: 2 = flag and value used, 1 = switch, 0 = not ours, -1 = bad. */
static int serve_flag(const char *f, const char *v, void *ctx) {
    serve_opts *so = ctx;
    int64_t x;
    int sw = serve_switch(f, so);
    if (sw) return sw;
#define IS(name) (strcmp(f, name) == 0)
    const server_setting *st = NULL;
    /* llama-server's names of two settings */
    const char *name = IS("--threads-http")           ? "--http-threads"
                       : IS("--timeout") || IS("-to") ? "--request-timeout"
                                                      : f;
    for (int i = 0; i < server_n_settings && !st; i++)
        if (strcmp(name, server_settings[i].flag) == 0) st = &server_settings[i];
    bool ours =
        st || IS("--host") || IS("--api-key") || IS("--served-model-name") || IS("--alias") ||
        IS("--tags") || IS("-a") || IS("-rea") || IS("--reasoning") || IS("-np") ||
        IS("--parallel") || IS("--chat-template") || IS("--chat-template-file") ||
        IS("--kv-memory") || IS("--max-batch-tokens") || IS("--max-seqs") || IS("--max-body") ||
        IS("--cors") || IS("--kv-memory-fraction") || IS("--api-key-file") || IS("--kv-disk") ||
        IS("--kv-disk-size") || IS("--scheduling-policy") || IS("--kv-disk-pin-max") ||
        IS("--prefix-admission-wait") || IS("--lora-modules") || IS("--chat-template-kwargs") ||
        IS("--default-chat-template-kwargs") || IS("--reasoning-budget") ||
        IS("--reasoning-format") || IS("--reasoning-budget-message") || IS("--ssl-key-file") ||
        IS("--ssl-cert-file") || IS("--api-prefix") || IS("--slot-save-path") || IS("--pooling") ||
        IS("--ui-config") || IS("--webui-config") || IS("--ui-config-file") ||
        IS("--webui-config-file") ||
        /* vLLM's names */
        IS("--max-num-seqs") || IS("--max-num-batched-tokens") || IS("--ssl-keyfile") ||
        IS("--ssl-certfile") || IS("--allowed-origins") || IS("--grammar") ||
        IS("--grammar-file") || IS("-j") || IS("--json-schema") || IS("-jf") ||
        IS("--json-schema-file") || IS("--metrics-prefix");
    if (!ours) return 0;
    if (!v) {
        fprintf(stderr, "kvllm: %s: missing value\n", f);
        return -1;
    }
    if (st) {
        if (!parse_int(f, v, st->lo, st->hi, &x)) return -1;
        server_setting_set(&so->sc, st, x);
    } else if (IS("--host")) so->sc.host = v;
    else if (IS("--api-key")) so->sc.api_key = v;
    else if (IS("--api-key-file")) so->sc.api_key_file = v;
    else if (IS("--api-prefix")) so->sc.api_prefix = v;
    else if (IS("--ui-config") || IS("--webui-config") || IS("--ui-config-file") ||
             IS("--webui-config-file")) {
        if (!ui_config(so, f, v)) return -1;
    } else if (IS("--ssl-key-file") || IS("--ssl-keyfile")) so->sc.tls_key_file = v;
    else if (IS("--ssl-cert-file") || IS("--ssl-certfile")) so->sc.tls_cert_file = v;
    else if (IS("--grammar") || IS("--grammar-file") || IS("-j") || IS("--json-schema") ||
             IS("-jf") || IS("--json-schema-file")) {
        if (so->grammar_flag) {
            fprintf(stderr, "kvllm: %s: %s gave the server's grammar already (one of them)\n", f,
                    so->grammar_flag);
            return -1;
        }
        so->grammar_flag = f;
        so->grammar_value = v;
    } else if (IS("--metrics-prefix")) {
        bool ok = (isalpha((unsigned char)v[0]) || v[0] == '_') && strlen(v) < 64;
        for (const char *p = v; ok && *p; p++) ok = isalnum((unsigned char)*p) || *p == '_';
        if (!ok) {
            fprintf(stderr,
                    "kvllm: --metrics-prefix: '%s' is not a metric namespace (letters, digits, "
                    "'_'; e.g. vllm)\n",
                    v);
            return -1;
        }
        so->sc.metrics_prefix = v;
    } else if (IS("--allowed-origins")) {
        if (!allowed_origins(v, so)) return -1;
    } else if (IS("--pooling")) { /* llama-server's: the embeddings' pooling */
        if (!strcmp(v, "mean")) so->pooling = 1 + ENGINE_POOL_MEAN;
        else if (!strcmp(v, "cls")) so->pooling = 1 + ENGINE_POOL_CLS;
        else if (!strcmp(v, "last")) so->pooling = 1 + ENGINE_POOL_LAST;
        else if (!strcmp(v, "rank")) so->reranking = true; /* as --reranking */
        else {
            fprintf(stderr,
                    "kvllm: --pooling: mean, cls, last or rank (%s: kvllm's embeddings "
                    "are pooled, one vector a text)\n",
                    v);
            return -1;
        }
    } else if (IS("--served-model-name") || IS("--alias") || IS("-a")) {
        /* NAME[,NAME...] (llama-server's aliases, vLLM's names): the first is the one
         * answers carry, every one is accepted as a request's model */
        const size_t first = strcspn(v, ",");
        if (first == 0 || first >= sizeof so->model_first || v[strlen(v) - 1] == ',' ||
            strstr(v, ",,")) {
            fprintf(stderr,
                    "kvllm: %s: NAME[,NAME...] with no empty name, the first under %zu "
                    "bytes\n",
                    f, sizeof so->model_first);
            return -1;
        }
        memcpy(so->model_first, v, first);
        so->model_first[first] = '\0';
        so->sc.model_id = so->model_first;
        so->sc.model_aliases = v[first] ? v + first + 1 : NULL;
    } else if (IS("--tags")) { /* llama-server's: informational, listed by /v1/models */
        so->sc.model_tags = v;
    } else if (IS("-rea") || IS("--reasoning")) {          /* llama-server's on | off | auto */
        if (!strcmp(v, "off")) so->reasoning_budget = "0"; /* as --reasoning-budget 0 */
        else if (strcmp(v, "on") && strcmp(v, "auto")) {
            fprintf(stderr, "kvllm: %s: on, off or auto\n", f);
            return -1;
        }
    } else if (IS("--kv-memory")) so->kv_memory = v;
    else if (IS("--cors")) so->sc.cors_origin = v;
    else if (IS("--kv-disk")) so->kv_disk = v;
    else if (IS("--slot-save-path")) so->sc.slot_save_path = v;
    else if (IS("--kv-disk-size")) so->kv_disk_size = v;
    else if (IS("--kv-disk-pin-max")) so->kv_disk_pin_max = v;
    else if (IS("--lora-modules")) {
        if (so->n_lora_modules == MODEL_MAX_LORA) {
            fprintf(stderr, "kvllm: --lora-modules: at most %d\n", MODEL_MAX_LORA);
            return -1;
        }
        so->lora_modules[so->n_lora_modules++] = v;
    } else if (IS("--prefix-admission-wait")) {
        if (!parse_int(f, v, 0, 1 << 20, &so->prefix_admission_wait)) return -1;
    } else if (IS("--scheduling-policy")) {
        if (strcmp(v, "fcfs") == 0) so->scheduling = ENGINE_SCHED_FCFS;
        else if (strcmp(v, "priority") == 0) so->scheduling = ENGINE_SCHED_PRIORITY;
        else {
            fprintf(stderr, "kvllm: --scheduling-policy: expected fcfs or priority, got '%s'\n", v);
            return -1;
        }
    } else if (IS("--kv-memory-fraction")) {
        char *end;
        so->kv_memory_fraction = strtod(v, &end);
        if (*end || end == v || !(so->kv_memory_fraction > 0 && so->kv_memory_fraction <= 1)) {
            fprintf(stderr, "kvllm: --kv-memory-fraction: expected a number in (0, 1], got '%s'\n",
                    v);
            return -1;
        }
    } else if (IS("--chat-template-kwargs") || IS("--default-chat-template-kwargs")) {
        so->sc.chat_template_kwargs = v;
    } else if (IS("--reasoning-budget")) so->reasoning_budget = v;
    else if (IS("--reasoning-format")) so->reasoning_format = v;
    else if (IS("--reasoning-budget-message")) so->sc.reasoning_budget_message = v;
    else if (IS("--chat-template-file")) so->sc.chat_template_file = v;
    else if (IS("--chat-template")) {
        /* a built-in family; else, as llama-server and vLLM take it, the
         * template's text, or (vLLM) a file holding it */
        if (chat_family_from_name(v) != CHAT_TMPL_UNKNOWN) so->sc.chat_template = v;
        else if (strstr(v, "{%") || strstr(v, "{{")) so->inline_template = v;
        else if (access(v, R_OK) == 0) so->sc.chat_template_file = v;
        else {
            fprintf(stderr,
                    "kvllm: --chat-template: '%s' is neither a built-in family (chatml, llama3, "
                    "llama2, mistral, gemma, deepseek3, deepseek2), a Jinja template's text nor a "
                    "readable file\n",
                    v);
            return -1;
        }
    } else if (IS("--max-batch-tokens") || IS("--max-num-batched-tokens")) {
        if (!parse_int(f, v, 1, 1 << 20, &so->max_batch_tokens)) return -1;
    } else if (IS("--max-seqs") || IS("-np") || IS("--parallel") || IS("--max-num-seqs")) {
        /* (llama-server's slots, vLLM's name) */
        if (!parse_int(f, v, 1, 4096, &so->max_seqs)) return -1;
    } else if (IS("--max-body")) {
        if (!parse_size(v, &x) || x < 1024) {
            fprintf(stderr, "kvllm: --max-body: expected a size of at least 1024 bytes\n");
            return -1;
        }
        so->sc.max_body_bytes = (size_t)x;
    }
#undef IS
    return 2;
}

/* Bytes of one block index over all KV groups (each group has its own pool of
 * n_blocks blocks), measured with one-block probe pools. With a draft model,
 * its pools too: the engine gives them as many blocks (with the K type for V). */
static size_t block_bytes(model *m, model *draft, const engine_config *ec) {
    size_t total = 0;
    for (int i = 0; i < (draft ? 2 : 1); i++)
        for (int g = 0; g < model_kv_n_groups(i ? draft : m); g++) {
            kv_pool_config kc;
            model_kv_group_shape(i ? draft : m, g, &kc, NULL);
            kc.block_size = ec->block_size;
            kc.dtype = ec->kv_dtype;
            kc.split_v = !i && ec->kv_dtype_v >= 0;
            kc.dtype_v = i ? ec->kv_dtype : ec->kv_dtype_v;
            kc.n_blocks = 1;
            kvl_error err = {{0}};
            kv_pool *p = kv_pool_create(&kc, &err);
            if (!p) return 0;
            total += kv_pool_geometry(p)->block_bytes;
            kv_pool_destroy(p);
        }
    return total;
}

/* A model's weights still in the file mapping (those not repacked into the
 * kernels' layout at load: a draft model's, or all of them with --no-repack or
 * where the repacked copy did not fit): page cache, which the available memory
 * counts as free, yet read at every step, so not for the KV pool to take. */
static int64_t mapped_bytes(const model *m) {
    if (!m) return 0;
    int64_t mapped = (int64_t)gguf_tensor_data_bytes(model_gguf(m)) - model_hp(m)->repacked_bytes;
    return mapped > 0 ? mapped : 0;
}

/* --grammar GBNF, --grammar-file FILE, -j / --json-schema SCHEMA or -jf /
 * --json-schema-file FILE (llama-server's): the GBNF every request without a
 * constraint of its own gets, checked against the vocabulary before serving. */
static bool server_grammar(serve_opts *so, const tok_vocab *vocab) {
    const char *f = so->grammar_flag;
    if (!f) return true;
    const bool from_file = strstr(f, "file") || strcmp(f, "-jf") == 0;
    const bool schema = strstr(f, "schema") || f[1] == 'j';
    char *text = NULL;
    kvl_error err = {{0}};
    if (from_file) {
        size_t len;
        if (!(text = kvl_read_file(so->grammar_value, &len, &err))) {
            fprintf(stderr, "kvllm: %s: %s\n", f, err.msg);
            return false;
        }
    }
    const char *src = text ? text : so->grammar_value;
    bool ok = true;
    if (schema) {
        kvl_buf g = {0};
        ok = json_schema_to_gbnf(src, NULL, &g, &err) && !g.oom;
        if (ok) so->grammar_owned = g.p;
        else kvl_buf_free(&g);
        free(text);
    } else {
        so->grammar_owned = text ? text : strdup(src);
        ok = so->grammar_owned != NULL;
    }
    grammar *g = ok ? grammar_compile(so->grammar_owned, vocab, &err) : NULL;
    if (!g) {
        fprintf(stderr, "kvllm: %s: %s\n", f, err.msg[0] ? err.msg : "out of memory");
        return false;
    }
    grammar_free(g);
    so->sc.grammar = so->grammar_owned;
    return true;
}

/* The model's identity in KV files (the disk tier's blocks, slot files):
 * the file's bytes, a split model's other files', the metadata it was read
 * with (the rope flags' keys, then --override-kv) and the control vectors,
 * since those compute other K/V. */
static bool model_identity(const cli_opts *o, const cli_model *cm, const char *flag,
                           uint8_t id[16]) {
    kvl_error err = {{0}};
    if (!kv_disk_model_id(o->model_path ? o->model_path : "models/stories260K.gguf", id, &err)) {
        fprintf(stderr, "kvllm: %s: %s\n", flag, err.msg);
        return false;
    }
    const gguf_file *gf = cli_gguf(cm);
    for (int i = 1; i < gguf_n_files(gf); i++) {
        uint8_t part[16];
        char hex[33];
        if (!kv_disk_model_id(gguf_file_path_at(gf, i), part, &err)) {
            fprintf(stderr, "kvllm: %s: %s\n", flag, err.msg);
            return false;
        }
        for (int b = 0; b < 16; b++) snprintf(hex + 2 * b, 3, "%02x", part[b]);
        const char *one[1] = {hex};
        kv_disk_model_id_extend(id, one, 1);
    }
    char rope[CLI_ROPE_SPECS][192];
    const char *specs[CLI_ROPE_SPECS];
    const int n_rope = cli_rope_overrides(o, gf, rope);
    for (int i = 0; i < n_rope; i++) specs[i] = rope[i];
    kv_disk_model_id_extend(id, specs, n_rope);
    kv_disk_model_id_extend(id, o->override_kv, o->n_override_kv);
    if (o->yarn_set) { /* the YaRN flags change the rope, so K */
        char spec[128];
        snprintf(spec, sizeof spec, "yarn %a %a %a %a", (double)o->yarn_ext, (double)o->yarn_attn,
                 (double)o->yarn_beta_fast, (double)o->yarn_beta_slow);
        const char *one[1] = {spec};
        kv_disk_model_id_extend(id, one, 1);
    }
    for (int i = 0; i < o->n_cvec; i++) { /* control vectors change every K and V after layer 1 */
        uint8_t part[16];
        char spec[96];
        if (!kv_disk_model_id(o->cvec_path[i], part, &err)) {
            fprintf(stderr, "kvllm: %s: %s\n", flag, err.msg);
            return false;
        }
        int len = snprintf(spec, sizeof spec, "cvec ");
        for (int b = 0; b < 16; b++)
            len += snprintf(spec + len, sizeof spec - (size_t)len, "%02x", part[b]);
        snprintf(spec + len, sizeof spec - (size_t)len, " %a %d %d", (double)o->cvec_scale[i],
                 o->cvec_first, o->cvec_last);
        const char *one[1] = {spec};
        kv_disk_model_id_extend(id, one, 1);
    }
    return true;
}

/* --slot-save-path: an existing directory this process may write in, and the
 * model's identity for the files (the tier's, when --kv-disk computed it). */
static bool slot_dir_ok(const serve_opts *so) {
    const char *dir = so->sc.slot_save_path;
    struct stat st;
    if (!dir || (stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && access(dir, W_OK | X_OK) == 0))
        return true;
    fprintf(stderr, "kvllm: --slot-save-path: %s is not a directory this process can write in\n",
            dir);
    return false;
}

static bool slot_save_settings(const cli_opts *o, serve_opts *so, const cli_model *cm) {
    if (!so->sc.slot_save_path) return true;
    if (so->kv_disk) {
        memcpy(so->sc.slot_model_id, so->disk.model_id, 16);
        return true;
    }
    return model_identity(o, cm, "--slot-save-path", so->sc.slot_model_id);
}

static bool engine_settings(const cli_opts *o, serve_opts *so, const cli_model *cm,
                            engine_config *ec) {
    model *m = cm->m, *draft = cm->draft;
    cli_engine_config(o, cm, ec);
    ec->prefix_cache = !so->no_prefix_cache;
    if (so->max_batch_tokens > 0) ec->max_batch_tokens = so->max_batch_tokens;
    ec->max_seqs = (int)so->max_seqs;
    ec->scheduling = so->scheduling;
    ec->prefix_admission_wait = (int)so->prefix_admission_wait;
    ec->step_groups = cli_step_groups(o);
    if ((so->kv_disk_size || so->kv_disk_pin_max) && !so->kv_disk) {
        fprintf(stderr, "kvllm: %s needs --kv-disk DIR\n",
                so->kv_disk_size ? "--kv-disk-size" : "--kv-disk-pin-max");
        return false;
    }
    if (so->kv_disk) {
        uint64_t bytes = 20ull << 30;
        if (so->kv_disk_size && (!kvl_parse_size(so->kv_disk_size, &bytes) || bytes == 0)) {
            fprintf(stderr, "kvllm: --kv-disk-size: '%s' is not a size (e.g. 20GiB)\n",
                    so->kv_disk_size);
            return false;
        }
        if (!model_identity(o, cm, "--kv-disk", so->disk.model_id)) return false;
        uint64_t pin = 0;
        if (so->kv_disk_pin_max &&
            (!kvl_parse_size(so->kv_disk_pin_max, &pin) || pin == 0 || pin > bytes)) {
            fprintf(stderr,
                    "kvllm: --kv-disk-pin-max: '%s' is not a size between 1 byte and the tier's "
                    "size (%llu bytes)\n",
                    so->kv_disk_pin_max, (unsigned long long)bytes);
            return false;
        }
        so->disk.dir = so->kv_disk;
        so->disk.max_bytes = bytes;
        so->disk.max_pinned_bytes = pin;
        ec->kv_disk = &so->disk;
    }
    int64_t kv_bytes = 0; /* --kv-memory */
    if (so->kv_memory && (!parse_size(so->kv_memory, &kv_bytes) || kv_bytes <= 0)) {
        fprintf(stderr,
                "kvllm: --kv-memory: '%s' is not a size in whole bytes (e.g. 2GiB, 512M, "
                "1000000000)\n",
                so->kv_memory);
        return false;
    }
    if (cm->pp) {
        /* --pp: every rank's share of a block and its own memory decide (cli_pp.c) */
        if (!cli_pp_kv_size(cm, ec, so->kv_memory || ec->n_blocks <= 0, kv_bytes,
                            so->kv_memory_fraction, so->kv_rank_bytes, &so->sc.kv_ranks))
            return false;
        so->sc.kv_rank_block_bytes = so->kv_rank_bytes;
    } else if (so->kv_memory) {
        size_t bb = block_bytes(m, draft, ec);
        if (bb == 0) return true; /* no pool of this shape: engine_create says why */
        ec->n_blocks = kv_bytes / (int64_t)bb;
        if (ec->n_blocks < 1) {
            fprintf(stderr, "kvllm: --kv-memory %s is less than one block (%zu bytes)\n",
                    so->kv_memory, bb);
            return false;
        }
    } else if (ec->n_blocks <= 0) {
        if (draft)
            fprintf(stderr,
                    "kvllm serve: the draft model's KV takes %zu of %zu bytes per block; %.1f MiB "
                    "of its weights stay mapped\n",
                    block_bytes(m, draft, ec) - block_bytes(m, NULL, ec), block_bytes(m, draft, ec),
                    (double)mapped_bytes(draft) / 1048576.0);
        ec->n_blocks = cli_kv_blocks_from_memory(
            block_bytes(m, draft, ec), mapped_bytes(m) + mapped_bytes(draft), ec->n_ctx,
            ec->block_size, ec->max_seqs, so->kv_memory_fraction, "serve");
        if (ec->n_blocks < 1) return false;
    }
    return true;
}

static void log_pool(engine *e, const serve_opts *so) {
    const engine_config *ec = engine_cfg(e);
    size_t bb = 0;
    for (int g = 0; g < engine_kv_n_groups(e); g++)
        bb += kv_pool_geometry(engine_kv_group(e, g))->block_bytes;
    int64_t tokens = ec->n_blocks * ec->block_size;
    int64_t per_seq = (ec->n_ctx + ec->block_size - 1) / ec->block_size;
    fprintf(
        stderr,
        "kvllm serve: KV pool %lld blocks x %d tokens = %lld tokens, %zu bytes per block "
        "(%.1f MiB, K %s, V %s%s); %lld full-context (%lld-token) sequences fit; max %d running, "
        "%lld tokens per step; prefix cache %s\n",
        (long long)ec->n_blocks, ec->block_size, (long long)tokens, bb,
        (double)bb * (double)ec->n_blocks / (1024.0 * 1024.0), kv_dtype_name(ec->kv_dtype),
        kv_dtype_name(ec->kv_dtype_v >= 0 ? ec->kv_dtype_v : ec->kv_dtype),
        engine_kv_n_groups(e) > 1 ? ", all KV groups" : "", (long long)(ec->n_blocks / per_seq),
        (long long)ec->n_ctx, ec->max_seqs, (long long)ec->max_batch_tokens,
        engine_prefix_cache_enabled(e) ? "on" : "off");
    fprintf(stderr, "kvllm serve: %d compute thread%s (%s)\n", kvl_pool_threads(),
            kvl_pool_threads() == 1 ? "" : "s", kvl_pool_threads_source());
    if (so->sc.kv_ranks > 0) { /* the figures above are rank 0's share */
        int64_t all = 0;
        for (int i = 0; i < so->sc.kv_ranks * MODEL_MAX_KV_GROUPS; i++) all += so->kv_rank_bytes[i];
        fprintf(stderr,
                "kvllm serve: KV pools of all %d ranks: %lld bytes per block (%.1f MiB); rank 0's "
                "share above\n",
                so->sc.kv_ranks, (long long)all,
                (double)all * (double)ec->n_blocks / (1024.0 * 1024.0));
    }
    if (engine_kv_disk(e)) {
        kv_disk_stats st = kv_disk_get_stats(engine_kv_disk(e));
        fprintf(stderr,
                "kvllm serve: KV disk tier: %lld blocks (%.1f MiB) indexed, %lld damaged files "
                "dropped\n",
                (long long)st.blocks, (double)st.bytes / (1024.0 * 1024.0), (long long)st.corrupt);
    }
}

/* A template of the model's (tokenizer.chat_template, or a named one such as
 * tokenizer.chat_template.rerank), NUL-terminated (caller frees), or NULL. */
static char *gguf_template(const cli_model *cm, const char *key) {
    const char *s;
    size_t len;
    if (!gguf_get_str(cli_gguf(cm), key, &s, &len)) return NULL;
    char *out = malloc(len + 1);
    if (!out) return NULL;
    memcpy(out, s, len);
    out[len] = 0;
    return out;
}

/* Default model id: the file name without directory and ".gguf". */
static void default_model_id(const char *path, char *buf, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(buf, cap, "%s", base);
    size_t n = strlen(buf);
    if (n > 5 && strcmp(buf + n - 5, ".gguf") == 0) buf[n - 5] = 0;
}

/* Idle OpenMP workers spin by default; on a small shared machine they starve the
 * HTTP and client threads (measured: 98 vs 1385 tokens/s at one stream). libgomp
 * reads OMP_WAIT_POLICY only at start-up, so the server re-executes itself with
 * passive waiting unless the user chose a policy. */
static void reexec_with_passive_wait(int argc, char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) return;
    args[0] = "kvllm";
    args[1] = "serve";
    for (int i = 0; i < argc; i++) args[i + 2] = argv[i];
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", args);
    free(args); /* exec failed: carry on with the default policy */
}

/* --lora-modules NAME=FILE[,...]: each adapter after the --lora ones, at scale
 * 0 (a request applies it by naming it), its name for the server. */
static bool lora_modules(serve_opts *so, cli_opts *o) {
    for (int k = 0; k < so->n_lora_modules; k++)
        for (const char *p = so->lora_modules[k]; *p;) {
            const char *end = strchr(p, ','), *eq = strchr(p, '=');
            const size_t len = end ? (size_t)(end - p) : strlen(p);
            if (!eq || eq >= p + len || eq == p || eq + 1 == p + len ||
                (size_t)(eq - p) >= sizeof so->lora_names[0] ||
                (size_t)(p + len - eq - 1) >= sizeof o->lora_path[0]) {
                fprintf(stderr, "kvllm: --lora-modules: expected NAME=FILE, got '%.*s'\n", (int)len,
                        p);
                return false;
            }
            if (o->n_lora == MODEL_MAX_LORA) {
                fprintf(stderr, "kvllm: at most %d LoRA adapters\n", MODEL_MAX_LORA);
                return false;
            }
            const int i = o->n_lora++;
            memcpy(so->lora_names[i], p, (size_t)(eq - p));
            so->lora_names[i][eq - p] = '\0';
            for (int j = 0; j < i; j++)
                if (so->sc.lora_names[j] && !strcmp(so->sc.lora_names[j], so->lora_names[i])) {
                    fprintf(stderr, "kvllm: --lora-modules: '%s' named twice\n", so->lora_names[i]);
                    return false;
                }
            so->sc.lora_names[i] = so->lora_names[i];
            memcpy(o->lora_path[i], eq + 1, (size_t)(p + len - eq - 1));
            o->lora_path[i][p + len - eq - 1] = '\0';
            o->lora_scale[i] = 0.0f;
            p = end ? end + 1 : p + len;
        }
    return true;
}

/* --chat-template-kwargs (a JSON object), --reasoning-budget (llama-server's:
 * -1 unlimited, 0 no thinking: enable_thinking false unless the kwargs say)
 * and --reasoning-format (none: thinking stays in the content; auto and
 * deepseek: reasoning_content, the default). */
static bool reasoning_options(serve_opts *so) {
    cJSON *kw = NULL;
    if (so->sc.chat_template_kwargs) {
        kw = cJSON_Parse(so->sc.chat_template_kwargs);
        if (!cJSON_IsObject(kw)) {
            cJSON_Delete(kw);
            fprintf(stderr, "kvllm: --chat-template-kwargs: expected a JSON object, e.g. "
                            "'{\"enable_thinking\": false}'\n");
            return false;
        }
    }
    const char *b = so->reasoning_budget, *f = so->reasoning_format;
    char *end = NULL;
    const long budget = b ? strtol(b, &end, 10) : -1;
    if (b && (!*b || *end || budget < -1 || budget > INT32_MAX)) {
        cJSON_Delete(kw);
        fprintf(stderr, "kvllm: --reasoning-budget: -1 (unlimited), 0 (no thinking) or the "
                        "tokens a thinking block may take, as llama-server takes it\n");
        return false;
    }
    so->sc.reasoning_budget = budget > 0 ? (int32_t)budget : -1; /* 0: enable_thinking false */
    if (f && strcmp(f, "none") && strcmp(f, "auto") && strcmp(f, "deepseek")) {
        cJSON_Delete(kw);
        fprintf(stderr, "kvllm: --reasoning-format: none, auto or deepseek\n");
        return false;
    }
    so->sc.reasoning_none = f && !strcmp(f, "none");
    if (b && !strcmp(b, "0")) {
        if (!kw) kw = cJSON_CreateObject();
        if (!cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking"))
            cJSON_AddFalseToObject(kw, "enable_thinking");
    }
    bool ok = true;
    if (kw) {
        so->kwargs_owned = cJSON_PrintUnformatted(kw);
        so->sc.chat_template_kwargs = so->kwargs_owned;
        ok = so->kwargs_owned != NULL;
        if (!ok) fprintf(stderr, "kvllm: out of memory\n");
    }
    cJSON_Delete(kw);
    return ok;
}

/* llama-server's environment variables (its Docker images are configured
 * through them; and vLLM's VLLM_API_KEY): each set one stands for its flag, placed before the command
 * line's, so the flag itself, given too, wins (llama.cpp's rule: the variable
 * is not used then). flags: the flag's spellings, '|'-separated, the first
 * used; a switch (takes false) applies on 1 / true / on / enabled, and off
 * (if any) on 0 / false / off / disabled. */
static const struct {
    const char *env, *flags;
    bool takes;
    const char *off;
} LLAMA_ENV[] = {
    {"LLAMA_ARG_MODEL", "-m|--model", true, NULL},
    {"LLAMA_ARG_CTX_SIZE", "-c|--ctx-size", true, NULL},
    {"LLAMA_ARG_N_PARALLEL", "-np|--parallel", true, NULL},
    {"LLAMA_ARG_HOST", "--host", true, NULL},
    {"LLAMA_ARG_PORT", "--port", true, NULL},
    {"LLAMA_ARG_THREADS", "-t|--threads", true, NULL},
    {"LLAMA_ARG_N_PREDICT", "-n|--predict|--n-predict", true, NULL},
    {"LLAMA_ARG_BATCH", "-b|--batch-size", true, NULL},
    {"LLAMA_ARG_UBATCH", "-ub|--ubatch-size", true, NULL},
    {"LLAMA_ARG_CACHE_TYPE_K", "-ctk|--cache-type-k", true, NULL},
    {"LLAMA_ARG_CACHE_TYPE_V", "-ctv|--cache-type-v", true, NULL},
    {"LLAMA_ARG_ALIAS", "--alias|-a", true, NULL},
    {"LLAMA_ARG_TAGS", "--tags", true, NULL},
    {"LLAMA_API_KEY", "--api-key", true, NULL},
    {"VLLM_API_KEY", "--api-key", true, NULL}, /* vLLM's, read the same way */
    {"LLAMA_ARG_API_KEY_FILE", "--api-key-file", true, NULL},
    {"LLAMA_ARG_SSL_KEY_FILE", "--ssl-key-file", true, NULL},
    {"LLAMA_ARG_SSL_CERT_FILE", "--ssl-cert-file", true, NULL},
    {"LLAMA_ARG_API_PREFIX", "--api-prefix", true, NULL},
    {"LLAMA_ARG_CHAT_TEMPLATE", "--chat-template", true, NULL},
    {"LLAMA_ARG_CHAT_TEMPLATE_FILE", "--chat-template-file", true, NULL},
    {"LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "--chat-template-kwargs", true, NULL},
    {"LLAMA_ARG_THINK", "--reasoning-format", true, NULL},
    {"LLAMA_ARG_THINK_BUDGET", "--reasoning-budget", true, NULL},
    {"LLAMA_ARG_THINK_BUDGET_MESSAGE", "--reasoning-budget-message", true, NULL},
    {"LLAMA_ARG_TIMEOUT", "--timeout|-to", true, NULL},
    {"LLAMA_ARG_THREADS_HTTP", "--threads-http", true, NULL},
    {"LLAMA_ARG_LOG_FILE", "--log-file", true, NULL},
    {"LLAMA_ARG_TOP_K", "--top-k", true, NULL},
    {"LLAMA_ARG_ROPE_SCALING_TYPE", "--rope-scaling", true, NULL},
    {"LLAMA_ARG_ROPE_SCALE", "--rope-scale", true, NULL},
    {"LLAMA_ARG_ROPE_FREQ_BASE", "--rope-freq-base", true, NULL},
    {"LLAMA_ARG_ROPE_FREQ_SCALE", "--rope-freq-scale", true, NULL},
    {"LLAMA_ARG_YARN_ORIG_CTX", "--yarn-orig-ctx", true, NULL},
    {"LLAMA_ARG_YARN_EXT_FACTOR", "--yarn-ext-factor", true, NULL},
    {"LLAMA_ARG_YARN_ATTN_FACTOR", "--yarn-attn-factor", true, NULL},
    {"LLAMA_ARG_YARN_BETA_SLOW", "--yarn-beta-slow", true, NULL},
    {"LLAMA_ARG_YARN_BETA_FAST", "--yarn-beta-fast", true, NULL},
    {"LLAMA_ARG_SPEC_DRAFT_MODEL", "--model-draft|-md|--spec-draft-model", true, NULL},
    {"LLAMA_ARG_DRAFT_MAX", "--draft-max|--draft|--draft-n", true, NULL},
    {"LLAMA_ARG_SPEC_TYPE", "--spec-type", true, NULL},
    {"LLAMA_ARG_FLASH_ATTN", "-fa|--flash-attn", true, NULL},
    {"LLAMA_ARG_N_GPU_LAYERS", "-ngl|--gpu-layers|--n-gpu-layers", true, NULL},
    {"LLAMA_ARG_CACHE_REUSE", "--cache-reuse", true, NULL},
    {"LLAMA_ARG_MMPROJ", "--mmproj|-mm", true, NULL},
    {"LLAMA_ARG_HF_REPO", "-hf|-hfr|--hf-repo", true, NULL},
    {"LLAMA_ARG_HF_FILE", "-hff|--hf-file", true, NULL},
    {"LLAMA_ARG_DOCKER_REPO", "-dr|--docker-repo", true, NULL},
    {"LLAMA_OFFLINE", "--offline", false, NULL},
    {"LLAMA_ARG_MODEL_URL", "--model-url|-mu", true, NULL},
    {"LLAMA_ARG_RERANKING", "--reranking|--rerank", false, NULL},
    {"LLAMA_ARG_POOLING", "--pooling", true, NULL},
    {"LLAMA_ARG_EMBEDDINGS", "--embeddings|--embedding", false, NULL},
    {"LLAMA_ARG_ENDPOINT_METRICS", "--metrics", false, NULL},
    {"LLAMA_ARG_ENDPOINT_PROPS", "--props", false, NULL},
    {"LLAMA_ARG_ENDPOINT_SLOTS", "--slots", false, "--no-slots"},
    {"LLAMA_ARG_UI", "--webui|--ui", false, "--no-webui"},
    {"LLAMA_ARG_JINJA", "--jinja", false, NULL},
    {"LLAMA_ARG_CONT_BATCHING", "--cont-batching|-cb", false, NULL},
    {"LLAMA_ARG_CONTEXT_SHIFT", "--context-shift", false, "--no-context-shift"},
    {"LLAMA_ARG_PREFILL_ASSISTANT", "--prefill-assistant", false, "--no-prefill-assistant"},
    {"LLAMA_ARG_CACHE_PROMPT", "--cache-prompt", false, "--no-cache-prompt"},
    {"LLAMA_ARG_UI_CONFIG", "--ui-config|--webui-config", true, NULL},
    {"LLAMA_ARG_UI_CONFIG_FILE", "--ui-config-file|--webui-config-file", true, NULL},
    {"LLAMA_ARG_TOOLS", "--tools", true, NULL},
    {"LLAMA_ARG_UI_MCP_PROXY", "--ui-mcp-proxy|--webui-mcp-proxy", false, "--no-ui-mcp-proxy"},
    {"LLAMA_ARG_AGENT", "--agent|-ag", false, "--no-agent"},
};

/* Whether flag is one of the '|'-separated spellings. */
static bool spelled(const char *spellings, const char *flag) {
    const size_t n = strlen(flag);
    for (const char *p = spellings; *p;) {
        const char *e = strchr(p, '|');
        const size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && strncmp(p, flag, n) == 0) return true;
        p += l + (e != NULL);
    }
    return false;
}

/* Vertex AI's custom-container variables, as llama-server reads them: with
 * AIP_MODE=PREDICTION the port is AIP_HTTP_PORT (8080 by default, whatever
 * --port said), the prediction route AIP_PREDICT_ROUTE (/predict) and
 * AIP_HEALTH_ROUTE, when set, another path of /health; a leading '/' is
 * added where missing. The paths live as long as the process (static). */
static bool vertex_env(server_config *sc) {
    const char *mode = getenv("AIP_MODE");
    if (!mode || strcmp(mode, "PREDICTION") != 0) return true;
    static char predict[256], health[256];
    const char *port = getenv("AIP_HTTP_PORT"), *pr = getenv("AIP_PREDICT_ROUTE"),
               *hr = getenv("AIP_HEALTH_ROUTE");
    long pn = 8080;
    char *end = NULL;
    if (port && *port) pn = strtol(port, &end, 10);
    if (port && *port && (*end || pn < 1 || pn > 65535)) {
        fprintf(stderr, "kvllm serve: AIP_HTTP_PORT=%s: not a port (1..65535)\n", port);
        return false;
    }
    if (sc->port && sc->port != pn)
        fprintf(stderr,
                "kvllm serve: note: AIP_MODE=PREDICTION: port %d replaced by AIP_HTTP_PORT %ld\n",
                sc->port, pn);
    sc->port = (int)pn;
    snprintf(predict, sizeof predict, "%s%s", pr && *pr && pr[0] != '/' ? "/" : "",
             pr && *pr ? pr : "/predict");
    sc->gcp_predict_route = predict;
    if (hr && *hr) {
        snprintf(health, sizeof health, "%s%s", hr[0] != '/' ? "/" : "", hr);
        if (server_route_taken(health)) /* /health itself, say: it stays what it is */
            fprintf(stderr, "kvllm serve: note: AIP_HEALTH_ROUTE=%s is a route already\n", hr);
        else sc->gcp_health_route = health;
    }
    fprintf(stderr, "kvllm serve: Vertex AI prediction: POST %s, port %d%s%s\n", predict, sc->port,
            sc->gcp_health_route ? ", health " : "", sc->gcp_health_route ? health : "");
    return true;
}

/* argv with the flags LLAMA_ENV's variables stand for in front (malloc'd;
 * *n its length), each noted on stderr; NULL when out of memory. */
static char **with_llama_env(int argc, char **argv, int *n) {
    const int cap = argc + 2 * (int)(sizeof LLAMA_ENV / sizeof *LLAMA_ENV) + 1;
    char **out = calloc((size_t)cap, sizeof *out);
    if (!out) return NULL;
    int k = 0;
    for (size_t i = 0; i < sizeof LLAMA_ENV / sizeof *LLAMA_ENV; i++) {
        const char *v = getenv(LLAMA_ENV[i].env);
        if (!v || !*v) continue;
        bool given = false;
        for (int a = 0; a < argc && !given; a++) given = spelled(LLAMA_ENV[i].flags, argv[a]);
        if (given) continue; /* the command line's flag wins */
        char flag[64];
        const char *bar = strchr(LLAMA_ENV[i].flags, '|');
        snprintf(flag, sizeof flag, "%.*s",
                 bar ? (int)(bar - LLAMA_ENV[i].flags) : (int)strlen(LLAMA_ENV[i].flags),
                 LLAMA_ENV[i].flags);
        const char *use = NULL;
        if (LLAMA_ENV[i].takes) use = flag;
        else if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "on") ||
                 !strcasecmp(v, "enabled"))
            use = flag;
        else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off") ||
                 !strcasecmp(v, "disabled"))
            use = LLAMA_ENV[i].off;
        else {
            fprintf(stderr,
                    "kvllm: note: %s=%s: not a switch value (1/true/on, 0/false/off): "
                    "ignored\n",
                    LLAMA_ENV[i].env, v);
            continue;
        }
        if (!use) continue;
        char *f = strdup(use), *val = LLAMA_ENV[i].takes ? strdup(v) : NULL;
        if (!f || (LLAMA_ENV[i].takes && !val)) {
            free(f);
            free(val);
            for (int j = 0; j < k; j++) free(out[j]);
            free(out);
            return NULL;
        }
        fprintf(stderr, "kvllm: note: %s: %s%s%s\n", LLAMA_ENV[i].env, use,
                LLAMA_ENV[i].takes ? " " : "",
                LLAMA_ENV[i].takes ? (strstr(LLAMA_ENV[i].env, "KEY") ? "(set)" : v) : "");
        out[k++] = f;
        if (val) out[k++] = val;
    }
    for (int a = 0; a < argc; a++) out[k++] = argv[a];
    *n = k;
    return out;
}

static int serve(int argc, char **argv);

/* vLLM's `--served-model-name a b c` (argparse's nargs="+": the names up to
 * the next flag) as kvllm's one value "a,b,c" (malloc'd into *joined), the
 * other names taken out of args. A bare .gguf ends the list: it is the model. */
static bool join_served_names(char **args, int *n, char **joined) {
    for (int i = 0; i + 1 < *n; i++) {
        if (strcmp(args[i], "--served-model-name") != 0) continue;
        int k = 1;
        while (i + 1 + k < *n && args[i + 1 + k][0] != '-') {
            const size_t l = strlen(args[i + 1 + k]);
            if (l > 5 && !strcmp(args[i + 1 + k] + l - 5, ".gguf")) break;
            k++;
        }
        if (k == 1 || *joined) continue; /* one name; or a second list (the flag's last wins) */
        size_t len = 1;
        for (int j = 0; j < k; j++) len += strlen(args[i + 1 + j]) + 1;
        char *out = malloc(len);
        if (!out) return false;
        size_t at = 0;
        for (int j = 0; j < k; j++) {
            const size_t l = strlen(args[i + 1 + j]);
            if (j) out[at++] = ',';
            memcpy(out + at, args[i + 1 + j], l);
            at += l;
        }
        out[at] = '\0';
        *joined = out;
        args[i + 1] = out;
        memmove(args + i + 2, args + i + 1 + k, (size_t)(*n - (i + 1 + k)) * sizeof *args);
        *n -= k - 1;
    }
    return true;
}

int cmd_serve(int argc, char **argv) {
    reexec_with_passive_wait(argc, argv);
    int n_args = 0;
    char **args = with_llama_env(argc, argv, &n_args);
    const int n_env = n_args - argc; /* the variables' flags and values, first and malloc'd */
    char *joined = NULL;
    if (!args || !join_served_names(args + n_env, &argc, &joined)) {
        fprintf(stderr, "kvllm: out of memory\n");
        free(args);
        return 1;
    }
    const int rc = serve(n_env + argc, args); /* the settings point into args' strings until then */
    for (int i = 0; i < n_env; i++) free(args[i]);
    free(args);
    free(joined);
    return rc;
}

static int serve(int argc, char **argv) {
    serve_opts so = {.max_seqs = 64, .kv_memory_fraction = CLI_KV_MEMORY_FRACTION};
    server_config_default(&so.sc);
    so.sc.model_id = NULL;
    cli_opts o;
    if (!cli_parse_ex(argc, argv, &o, serve_flag, &so)) return 2;
    if (so.help) {
        serve_usage(stdout);
        return 0;
    }
    /* kvllm run's own flags mean nothing to a server: said, not ignored */
    const char *run_flag = o.prompt             ? "-p"
                           : o.prompt_file      ? "-f"
                           : o.prompt_ids       ? "--prompt-ids"
                           : o.json             ? "--json"
                           : o.req.top_logprobs ? "--top-logprobs"
                           : o.req.n_stop       ? "--stop"
                           : o.req.ignore_eos   ? "--ignore-eos"
                           : o.no_bos           ? "--no-bos"
                           : o.parse_special    ? "--parse-special"
                                                : NULL;
    if (run_flag) {
        fprintf(stderr,
                "kvllm: %s is a flag of kvllm run: a server's requests carry their own prompt "
                "and options (the sampling flags and -n are their defaults)\n",
                run_flag);
        return 2;
    }
    if (o.n_predict_given && o.req.max_tokens == 0) {
        fprintf(stderr, "kvllm: -n 0: a default length must be -1 (to the context) or more\n");
        return 2;
    }
    if (o.pp && (so.kv_disk || so.sc.slot_save_path)) {
        fprintf(stderr, "kvllm: %s is not available with --pp (each rank holds other layers' KV)\n",
                so.kv_disk ? "--kv-disk" : "--slot-save-path");
        return 2;
    }
    o.chunks_keep_kv = so.kv_disk != NULL;
    if (!lora_modules(&so, &o) || !reasoning_options(&so)) {
        free(so.kwargs_owned);
        free(so.owned_origin);
        free(so.ui_config_owned);
        return 2;
    }
    if (!vertex_env(&so.sc)) {
        free(so.kwargs_owned);
        free(so.owned_origin);
        free(so.ui_config_owned);
        return 2;
    }
    if (!server_config_check(&so.sc)) {
        free(so.kwargs_owned);
        free(so.owned_origin);
        free(so.ui_config_owned);
        return 2;
    }
    if (!slot_dir_ok(&so)) return 2;
    cli_model cm;
    if (!cli_load(&o, true, &cm)) return 1;
    int rc = 1;
    char *tmpl = NULL, *rerank_tmpl = NULL, id[256];
    engine_config ec;
    engine *e = NULL;
    if (!engine_settings(&o, &so, &cm, &ec) || !slot_save_settings(&o, &so, &cm) ||
        !server_grammar(&so, cm.vocab))
        goto out;
    kvl_error err = {{0}};
    e = engine_create(cm.m, cm.vocab, &ec, &err);
    if (!e) {
        fprintf(stderr, "kvllm: %s\n", err.msg);
        goto out;
    }
    log_pool(e, &so);
    default_model_id(o.model_path ? o.model_path : "models/stories260K.gguf", id, sizeof id);
    if (!so.sc.model_id) so.sc.model_id = o.hf_repo ? o.hf_repo : id; /* -hf: llama-server's name */
    if (so.inline_template) {
        so.sc.chat_template_inline = true;
        if (!(tmpl = strdup(so.inline_template))) goto out;
    } else if (so.sc.chat_template_file) {
        size_t len;
        kvl_error ferr = {{0}};
        tmpl = kvl_read_file(so.sc.chat_template_file, &len, &ferr);
        if (!tmpl) {
            fprintf(stderr, "kvllm: --chat-template-file: %s\n", ferr.msg);
            goto out;
        }
    } else tmpl = gguf_template(&cm, "tokenizer.chat_template");
    so.sc.chat_template_src = tmpl;
    so.sc.model_path = o.model_path ? o.model_path : "models/stories260K.gguf";
    so.sc.pooling = so.pooling ? (engine_pooling)(so.pooling - 1) : cli_pooling(cli_gguf(&cm));
    if (so.reranking && model_hp(cm.m)->n_cls_out == 0) {
        fprintf(stderr,
                "kvllm: --reranking: %s has no classifier head (tensor 'cls.output.weight' of a "
                "qwen3 reranker)\n",
                so.sc.model_path);
        goto out;
    }
    rerank_tmpl = gguf_template(&cm, "tokenizer.chat_template.rerank");
    so.sc.rerank_template = rerank_tmpl;
    so.sc.sampling = o.req.sampling; /* the sampling flags: the requests' defaults */
    so.sc.sampling_set = o.sampling_set;
    so.sc.n_predict = o.n_predict_given ? (o.req.max_tokens < 0 ? -1 : o.req.max_tokens) : 0;
    rc = server_run(e, cm.vocab, &so.sc);
out:
    free(so.kwargs_owned);
    free(so.owned_origin);
    free(so.ui_config_owned);
    free(so.grammar_owned);
    free(rerank_tmpl);
    free(tmpl);
    engine_destroy(e);
    cli_unload(&cm);
    return rc;
}
