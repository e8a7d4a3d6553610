/* kvllm chat-template: renders a conversation with a Jinja chat template (the
 * GGUF's tokenizer.chat_template, or a file) as transformers'
 * apply_chat_template(tokenize=False) does, and prints the prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jinja.h"

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: kvllm chat-template (-m MODEL.gguf | --file T.jinja) --messages FILE.json "
        "[options]\n\n"
        "Renders the conversation with the Jinja chat template and prints the prompt to stdout.\n"
        "A template that refuses (raise_exception) or fails exits 1 with its message on stderr.\n\n"
        "  -m FILE               take the template, BOS and EOS texts from a GGUF file\n"
        "  --file FILE           take the template from a file\n"
        "  --messages FILE       JSON array of messages (\"-\": stdin)\n"
        "  --tools FILE          JSON array of tool definitions (default: none)\n"
        "  --no-generation-prompt  add_generation_prompt = false (default true)\n"
        "  --bos S  --eos S      bos_token / eos_token (default: the GGUF's, else \"\")\n"
        "  --kwargs JSON         extra template variables, e.g. '{\"enable_thinking\": false}'\n"
        "  --now YYYY-MM-DD      the date strftime_now() sees (default: today)\n"
        "  --caps                print what the template can do instead (no --messages):\n"
        "                        llama-server's /props chat_template_caps, found as it finds "
        "them\n");
}

static char *read_arg_file(const char *path, size_t *len) {
    if (strcmp(path, "-") == 0) {
        size_t cap = 4096, n = 0;
        char *p = malloc(cap);
        if (!p) return NULL;
        size_t k;
        while ((k = fread(p + n, 1, cap - n - 1, stdin)) > 0) {
            n += k;
            if (cap - n - 1 == 0) {
                char *q = realloc(p, cap * 2);
                if (!q) {
                    free(p);
                    return NULL;
                }
                p = q;
                cap *= 2;
            }
        }
        p[n] = 0;
        *len = n;
        return p;
    }
    kvl_error err = {{0}};
    char *p = kvl_read_file(path, len, &err);
    if (!p) fprintf(stderr, "kvllm: chat-template: %s\n", err.msg);
    return p;
}

static cJSON *read_json(const char *path, const char *what) {
    size_t n;
    char *s = read_arg_file(path, &n);
    if (!s) return NULL;
    const char *end = NULL;
    cJSON *j = jinja_json_parse(s, n, &end);
    if (!j)
        fprintf(stderr, "kvllm: chat-template: %s %s: invalid JSON near byte %zu\n", what, path,
                end ? (size_t)(end - s) : 0);
    free(s);
    return j;
}

int cmd_chat_template(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *messages = NULL, *tools = NULL, *bos = NULL,
               *eos = NULL, *kwargs = NULL, *now = NULL;
    bool add_gen = true, caps = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-generation-prompt")) {
            add_gen = false;
            continue;
        }
        if (!strcmp(a, "--caps")) {
            caps = true;
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dst = &model;
        else if (!strcmp(a, "--file")) dst = &file;
        else if (!strcmp(a, "--messages")) dst = &messages;
        else if (!strcmp(a, "--tools")) dst = &tools;
        else if (!strcmp(a, "--bos")) dst = &bos;
        else if (!strcmp(a, "--eos")) dst = &eos;
        else if (!strcmp(a, "--kwargs")) dst = &kwargs;
        else if (!strcmp(a, "--now")) dst = &now;
        if (!dst) {
            fprintf(stderr, "kvllm: chat-template: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvllm: chat-template: %s needs a value\n", a);
            return 2;
        }
        *dst = argv[++i];
    }
    if ((model != NULL) == (file != NULL) || (!messages && !caps)) {
        fprintf(stderr, "kvllm: chat-template: give one of -m or --file, and --messages\n");
        usage(stderr);
        return 2;
    }
    jinja_date date = {0}, *datep = NULL;
    if (now) {
        if (sscanf(now, "%d-%d-%d", &date.year, &date.month, &date.day) != 3 || date.month < 1 ||
            date.month > 12 || date.day < 1 || date.day > 31) {
            fprintf(stderr, "kvllm: chat-template: --now '%s' is not YYYY-MM-DD\n", now);
            return 2;
        }
        datep = &date;
    }

    int rc = 1;
    char *src = NULL, *out = NULL;
    size_t src_len = 0;
    cJSON *vars = NULL, *msgs = NULL, *tl = NULL, *kw = NULL;
    jinja_template *t = NULL;
    cli_model cm = {0};
    bool loaded = false;
    if (model) {
        cli_opts o = {0};
        o.model_path = model;
        if (!cli_load(&o, false, &cm)) goto done;
        loaded = true;
        const char *s;
        if (!gguf_get_str(cli_gguf(&cm), "tokenizer.chat_template", &s, &src_len)) {
            fprintf(stderr, "kvllm: chat-template: %s has no tokenizer.chat_template\n", model);
            goto done;
        }
        src = malloc(src_len + 1);
        if (!src) goto done;
        memcpy(src, s, src_len);
        src[src_len] = 0;
        if (!bos) bos = tok_bos(cm.vocab) >= 0 ? tok_piece(cm.vocab, tok_bos(cm.vocab)) : "";
        if (!eos) eos = tok_eos(cm.vocab) >= 0 ? tok_piece(cm.vocab, tok_eos(cm.vocab)) : "";
    } else if (!(src = read_arg_file(file, &src_len))) goto done;
    if (caps) {
        char err[1024];
        if (!(t = jinja_template_create(src, src_len, err, sizeof err))) {
            fprintf(stderr, "kvllm: chat-template: %s\n", err);
            goto done;
        }
        jinja_caps c;
        jinja_template_caps(t, &c);
        cJSON *j = jinja_caps_to_json(&c);
        char *txt = cJSON_Print(j);
        if (txt) printf("%s\n", txt);
        free(txt);
        cJSON_Delete(j);
        rc = txt ? 0 : 1;
        goto done;
    }

    if (!(msgs = read_json(messages, "--messages"))) goto done;
    if (!cJSON_IsArray(msgs)) {
        fprintf(stderr, "kvllm: chat-template: --messages %s: expected a JSON array of messages\n",
                messages);
        goto done;
    }
    if (tools && !(tl = read_json(tools, "--tools"))) goto done;
    if (kwargs) {
        kw = jinja_json_parse(kwargs, strlen(kwargs), NULL);
        if (!kw || !cJSON_IsObject(kw)) {
            fprintf(stderr, "kvllm: chat-template: --kwargs is not a JSON object\n");
            goto done;
        }
    }
    /* The variables transformers passes to render(); tools and documents are
     * always present (None when not given); kwargs override. */
    vars = cJSON_CreateObject();
    cJSON_AddItemToObject(vars, "messages", msgs);
    msgs = NULL;
    cJSON_AddItemToObject(vars, "tools", tl ? tl : cJSON_CreateNull());
    tl = NULL;
    cJSON_AddItemToObject(vars, "documents", cJSON_CreateNull());
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_gen);
    cJSON_AddStringToObject(vars, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(vars, "eos_token", eos ? eos : "");
    if (kw)
        for (cJSON *c = kw->child; c; c = c->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(vars, c->string);
            cJSON_AddItemToObject(vars, c->string, cJSON_Duplicate(c, true));
        }

    char err[1024];
    t = jinja_template_create(src, src_len, err, sizeof err);
    if (!t) {
        fprintf(stderr, "kvllm: chat-template: %s\n", err);
        goto done;
    }
    size_t out_len;
    jinja_status st = jinja_template_render(t, vars, datep, &out, &out_len, err, sizeof err);
    if (st == JINJA_ERR_RAISED) {
        fprintf(stderr, "kvllm: chat-template: the template refused: %s\n", err);
        goto done;
    }
    if (st != JINJA_OK) {
        fprintf(stderr, "kvllm: chat-template: rendering failed (%s): %s\n", jinja_status_name(st),
                err);
        goto done;
    }
    fwrite(out, 1, out_len, stdout);
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    free(out);
    jinja_template_destroy(t);
    cJSON_Delete(vars);
    cJSON_Delete(msgs);
    cJSON_Delete(tl);
    cJSON_Delete(kw);
    free(src);
    if (loaded) cli_unload(&cm);
    return rc;
}
