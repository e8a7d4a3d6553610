/* kvllm chat (and run -cnv): a conversation in the terminal. Each turn renders
 * the whole conversation with the model's chat template (its Jinja
 * tokenizer.chat_template, --chat-template-file, or a built-in family), so
 * the prompt is exactly what the server would send; the engine's prefix cache
 * keeps the earlier turns' KV blocks, so only the new tokens are computed.
 * Works with stdin piped: one user message per line; "/exit" or end of input
 * ends the conversation. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "cli.h"
#include "jinja.h"
#include "kvl_buf.h"

typedef struct chat_args {
    const char *template_file, *family, *system;
    char *system_owned; /* -sysf FILE's text */
    double kv_fraction;
} chat_args;

// clang-format off
static void chat_usage(FILE *out) {
    fprintf(out,
            "usage: kvllm chat [-m MODEL] [options]     (also: kvllm run -cnv ...)\n\n"
            "An interactive conversation: type a message, the model answers; /exit or Ctrl-D ends it.\n"
            "With stdin piped, each line is one user message. After each answer stderr shows the\n"
            "prompt's tokens taken from the KV cache (earlier turns) and the new ones computed.\n\n"
            "  --system TEXT            a system message first (-sys, --system-prompt; -sysf FILE)\n"
            "  --chat-template-file F   Jinja chat template (default: the GGUF's tokenizer.chat_template)\n"
            "  --chat-template NAME     built-in chatml|llama3|llama2|mistral|gemma|deepseek3|deepseek2\n"
            "                           (the fallback for a model without a usable template: chatml)\n"
            "  -n N                     max tokens per answer (default 128; -1: until the context is full)\n"
            "  plus run's sampling and KV options (--temp, --top-p, -s/--seed, -c, --kv-type, ...)\n");
}
// clang-format on

static int chat_flag(const char *f, const char *v, void *ctx) {
    chat_args *a = ctx;
#define IS(name) (strcmp(f, name) == 0)
    if (IS("-cnv") || IS("--conversation")) return 1; /* from run -cnv */
    if (!(IS("--chat-template-file") || IS("--chat-template") || IS("--system") || IS("-sys") ||
          IS("--system-prompt") || IS("-sysf") || IS("--system-prompt-file")))
        return 0;
    if (!v) {
        fprintf(stderr, "kvllm chat: %s: missing value\n", f);
        return -1;
    }
    if (IS("--chat-template-file")) a->template_file = v;
    else if (IS("--chat-template")) {
        if (chat_family_from_name(v) == CHAT_TMPL_UNKNOWN) {
            fprintf(stderr, "kvllm chat: --chat-template: unknown family '%s'\n", v);
            return -1;
        }
        a->family = v;
    } else if (IS("-sysf") || IS("--system-prompt-file")) { /* llama-cli's */
        kvl_error err = {{0}};
        free(a->system_owned);
        if (!(a->system_owned = kvl_read_file(v, NULL, &err))) {
            fprintf(stderr, "kvllm chat: %s: %s\n", f, err.msg);
            return -1;
        }
        a->system = a->system_owned;
    } else a->system = v; /* --system, llama-cli's -sys / --system-prompt */
#undef IS
    return 2;
}

typedef struct chat_tmpl {
    jinja_template *jinja; /* NULL: the built-in family */
    chat_family family;
    const char *bos, *eos;
} chat_tmpl;

static bool setup_template(const chat_args *a, const cli_model *cm, chat_tmpl *t) {
    const tok_vocab *v = cm->vocab;
    t->bos = tok_bos(v) >= 0 ? tok_piece(v, tok_bos(v)) : "";
    t->eos = tok_eos(v) >= 0 ? tok_piece(v, tok_eos(v)) : "";
    if (a->family) {
        t->family = chat_family_from_name(a->family);
        fprintf(stderr, "kvllm chat: chat template: built-in %s\n", a->family);
        return true;
    }
    char *src = NULL;
    size_t len = 0;
    const char *origin = "the model's tokenizer.chat_template";
    if (a->template_file) {
        kvl_error err = {{0}};
        if (!(src = kvl_read_file(a->template_file, &len, &err))) {
            fprintf(stderr, "kvllm chat: --chat-template-file: %s\n", err.msg);
            return false;
        }
        origin = a->template_file;
    } else {
        const char *s;
        if (gguf_get_str(cli_gguf(cm), "tokenizer.chat_template", &s, &len) &&
            (src = malloc(len + 1))) {
            memcpy(src, s, len);
            src[len] = 0;
        }
    }
    if (src) {
        char err[512];
        t->jinja = jinja_template_create(src, len, err, sizeof err);
        if (t->jinja) {
            fprintf(stderr, "kvllm chat: chat template: Jinja, from %s\n", origin);
            free(src);
            return true;
        }
        if (a->template_file) {
            fprintf(stderr, "kvllm chat: %s does not compile: %s\n", origin, err);
            free(src);
            return false;
        }
        t->family = chat_template_detect(src);
        free(src);
        if (t->family == CHAT_TMPL_UNKNOWN) {
            fprintf(stderr,
                    "kvllm chat: the model's chat template does not compile (%s) and matches no "
                    "built-in "
                    "family; use --chat-template NAME\n",
                    err);
            return false;
        }
    } else {
        t->family = CHAT_TMPL_FALLBACK;
    }
    fprintf(stderr, "kvllm chat: chat template: built-in %s\n", chat_family_name(t->family));
    return true;
}

/* The conversation as a prompt string (malloc'd), or NULL (message printed). */
static char *render(const chat_tmpl *t, const cJSON *msgs, size_t *len) {
    if (t->jinja) {
        cJSON *vars = cJSON_CreateObject();
        cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(msgs, true));
        cJSON_AddItemToObject(vars, "tools", cJSON_CreateNull());
        cJSON_AddItemToObject(vars, "documents", cJSON_CreateNull());
        cJSON_AddBoolToObject(vars, "add_generation_prompt", true);
        cJSON_AddStringToObject(vars, "bos_token", t->bos);
        cJSON_AddStringToObject(vars, "eos_token", t->eos);
        char *out = NULL, err[512];
        jinja_status st = jinja_template_render(t->jinja, vars, NULL, &out, len, err, sizeof err);
        cJSON_Delete(vars);
        if (st != JINJA_OK) fprintf(stderr, "kvllm chat: the chat template failed: %s\n", err);
        return out;
    }
    int n = cJSON_GetArraySize(msgs), i = 0;
    chat_msg *m = calloc((size_t)n, sizeof *m);
    if (!m) return NULL;
    for (const cJSON *v = msgs->child; v; v = v->next, i++) {
        m[i].role = cJSON_GetObjectItem(v, "role")->valuestring;
        m[i].content = cJSON_GetObjectItem(v, "content")->valuestring;
    }
    char *out = NULL;
    kvl_error err = {{0}};
    int64_t got = chat_template_render(t->family, t->bos, t->eos, m, n, true, &out, &err);
    free(m);
    if (got < 0) {
        fprintf(stderr, "kvllm chat: %s\n", err.msg);
        return NULL;
    }
    *len = (size_t)got;
    return out;
}

static bool starts_with(const char *s, const char *prefix) {
    return prefix[0] && strncmp(s, prefix, strlen(prefix)) == 0;
}

typedef struct turn {
    kvl_buf reply;
    engine_req_stats stats;
    bool done;
} turn;

static void on_event(const engine_event *ev, void *user) {
    turn *t = user;
    if (ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        kvl_buf_put(&t->reply, ev->text, ev->text_len);
    }
    if (ev->finish != ENGINE_FINISH_NONE) {
        t->stats = *ev->stats;
        t->done = true;
    }
}

static void add_message(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* One turn: render, tokenize, generate. False on an error that ends the chat. */
static bool run_turn(engine *e, const cli_opts *o, const cli_model *cm, const chat_tmpl *t,
                     cJSON *msgs) {
    size_t len = 0;
    char *text = render(t, msgs, &len);
    if (!text) return false;
    bool bos = tok_add_bos(cm->vocab) && tok_bos(cm->vocab) >= 0 && !starts_with(text, t->bos);
    int64_t cap = (int64_t)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    kvl_error err = {{0}};
    int64_t n = ids ? tok_encode(cm->vocab, text, len, bos, true, ids, cap, &err) : -1;
    free(text);
    if (n < 0 || n > cap) {
        fprintf(stderr, "kvllm chat: cannot tokenize the conversation: %s\n",
                n < 0 ? err.msg : "too long");
        free(ids);
        return false;
    }
    int64_t n_ctx = engine_cfg(e)->n_ctx;
    if (n >= n_ctx) {
        fprintf(stderr,
                "kvllm chat: the conversation (%lld tokens) no longer fits the context of %lld; "
                "start again with a larger -c\n",
                (long long)n, (long long)n_ctx);
        free(ids);
        return false;
    }
    turn tr = {0};
    engine_request r = {.prompt = ids,
                        .n_prompt = n,
                        .max_tokens = o->req.max_tokens < 0 || n + o->req.max_tokens > n_ctx
                                          ? n_ctx - n
                                          : o->req.max_tokens,
                        .sampling = o->req.sampling,
                        .stop = o->stop,
                        .n_stop = o->req.n_stop,
                        .on_event = on_event,
                        .user = &tr};
    bool ok = engine_submit(e, &r, &err) >= 0;
    while (ok && !tr.done) ok = engine_step(e, &err);
    free(ids);
    if (!ok) {
        fprintf(stderr, "kvllm chat: %s\n", err.msg);
        kvl_buf_free(&tr.reply);
        return false;
    }
    const engine_req_stats *s = &tr.stats;
    double dec = s->t_end - s->t_first_token;
    fputc('\n', stdout);
    fflush(stdout); /* the answer before its stats line, also when stdout is a pipe */
    fprintf(stderr, "[prompt %lld tokens: %lld cached, %lld new; %lld generated, %.1f tokens/s]\n",
            (long long)s->n_prompt, (long long)s->n_cached_prompt,
            (long long)(s->n_prompt - s->n_cached_prompt), (long long)s->n_generated,
            dec > 0 && s->n_generated > 1 ? (double)(s->n_generated - 1) / dec : 0.0);
    kvl_buf_puts(&tr.reply, "");
    add_message(msgs, "assistant", tr.reply.p ? tr.reply.p : "");
    kvl_buf_free(&tr.reply);
    return true;
}

int cmd_chat(int argc, char **argv) {
    chat_args a = {0};
    cli_opts o;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            chat_usage(stdout);
            return 0;
        }
    if (!cli_parse_ex(argc, argv, &o, chat_flag, &a)) {
        free(a.system_owned);
        return 2;
    }
    if (o.prompt || o.prompt_file || o.prompt_ids) {
        fprintf(stderr,
                "kvllm chat: the messages come from stdin (-p, -f and --prompt-ids are for run)\n");
        free(a.system_owned);
        return 2;
    }
    cli_model cm;
    if (!cli_load(&o, true, &cm)) {
        free(a.system_owned);
        return 1;
    }
    int rc = 1;
    engine *e = NULL;
    chat_tmpl t = {0};
    cJSON *msgs = cJSON_CreateArray();
    char *line = NULL;
    size_t line_cap = 0;
    if (!setup_template(&a, &cm, &t)) goto out;
    engine_config ec;
    cli_engine_config(&o, &cm, &ec);
    ec.max_seqs = 1;
    /* what carries the conversation's KV from turn to turn: --no-kv-cache does not apply */
    ec.prefix_cache = true;
    ec.no_kv_cache = false;
    kvl_error err = {{0}};
    if (!(e = engine_create(cm.m, cm.vocab, &ec, &err))) {
        fprintf(stderr, "kvllm chat: %s\n", err.msg);
        goto out;
    }
    if (!engine_prefix_cache_enabled(e))
        fprintf(
            stderr,
            "kvllm chat: this model's sliding-window layers rule out the prefix cache: every turn "
            "recomputes the conversation\n");
    if (a.system) add_message(msgs, "system", a.system);
    bool tty = isatty(STDIN_FILENO);
    rc = 0;
    for (;;) {
        if (tty) fputs("> ", stderr);
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break; /* Ctrl-D or end of the piped input */
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0) break;
        if (got == 0) continue;
        add_message(msgs, "user", line);
        if (!run_turn(e, &o, &cm, &t, msgs)) {
            rc = 1;
            break;
        }
    }
    if (tty) fputc('\n', stderr);
out:
    free(line);
    cJSON_Delete(msgs);
    jinja_template_destroy(t.jinja);
    engine_destroy(e);
    cli_unload(&cm);
    free(a.system_owned);
    return rc;
}
