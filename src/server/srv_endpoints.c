/* The endpoints besides generation, in llama-server's and OpenAI's shapes:
 * GET /v1/models/{id}, POST /tokenize, POST /detokenize, GET /props and
 * POST /v1/embeddings and POST /rerank (its request: srv_rerank.c).
 * Embeddings and scores run on the engine thread (srv_engine.c), between
 * engine steps, since only that thread may touch the engine. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "srv_internal.h"

#define MAX_EMBED_INPUTS 2048

static char *print_delete(cJSON *o) {
    char *out = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return out;
}

/* ------------------------------------------------------------- models -- */

/* OpenAI's model object (vLLM's max_model_len beside), with the members
 * Anthropic's has (type, display_name, created_at), so that both SDKs'
 * models.list and models.retrieve read it. */
static cJSON *model_object_named(const srv *s, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->t_start);
    cJSON_AddStringToObject(m, "owned_by", "kvllm");
    cJSON_AddNumberToObject(m, "max_model_len", (double)s->n_ctx);
    cJSON_AddStringToObject(m, "type", "model");
    cJSON_AddStringToObject(m, "display_name", id);
    char when[32];
    struct tm tm;
    gmtime_r(&s->t_start, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON_AddStringToObject(m, "created_at", when);
    return m;
}

/* llama-server's "meta" of its model: the vocabulary's kind in llama.cpp's
 * numbering (tokenizer.ggml.model: 1 SPM "llama", 2 BPE "gpt2", 3 WPM "bert",
 * 4 UGM "t5", 5 "rwkv", 6 "plamo2"; 0 none), the context served and trained,
 * the width, parameters, bytes of tensor data and the file type's name. */
static cJSON *model_meta(srv *s) {
    const model *m = engine_model(s->e);
    const model_hparams *hp = model_hp(m);
    static const char *const kinds[] = {"no_vocab", "llama", "gpt2",  "bert",
                                        "t5",       "rwkv",  "plamo2"};
    char kind[32] = "";
    int vocab_type = 0;
    if (gguf_get_str_buf(model_gguf(m), "tokenizer.ggml.model", kind, sizeof kind))
        for (int i = 1; i < (int)(sizeof kinds / sizeof *kinds); i++)
            if (!strcmp(kind, kinds[i])) vocab_type = i;
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddNumberToObject(meta, "vocab_type", vocab_type);
    cJSON_AddNumberToObject(meta, "n_vocab", tok_n_vocab(s->vocab));
    cJSON_AddNumberToObject(meta, "n_ctx", (double)s->n_ctx);
    cJSON_AddNumberToObject(meta, "n_ctx_train", (double)hp->n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_embd", (double)hp->n_embd);
    cJSON_AddNumberToObject(meta, "n_params", (double)hp->n_params);
    cJSON_AddNumberToObject(meta, "size", (double)gguf_tensor_data_bytes(model_gguf(m)));
    char ftype[96];
    if (gguf_file_type_describe(model_gguf(m), ftype, sizeof ftype))
        cJSON_AddStringToObject(meta, "ftype", ftype);
    return meta;
}

/* The names of a comma-separated list (trimmed, the empty ones left out),
 * sorted and each once, as llama-server keeps its aliases and tags (sets). */
static cJSON *name_set(const char *first, const char *list) {
    char names[64][256];
    int n = 0;
    if (first) snprintf(names[n++], sizeof names[0], "%s", first);
    for (const char *p = list; p && *p && n < 64;) {
        size_t l = strcspn(p, ",");
        const char *q = p;
        while (l && (*q == ' ' || *q == '\t')) q++, l--;
        while (l && (q[l - 1] == ' ' || q[l - 1] == '\t')) l--;
        if (l) snprintf(names[n++], sizeof names[0], "%.*s", (int)(l < 255 ? l : 255), q);
        p += strcspn(p, ",");
        p += *p == ',';
    }
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        if (!i || strcmp(names[i], names[i - 1]) != 0)
            cJSON_AddItemToArray(a, cJSON_CreateString(names[i]));
    return a;
}

/* The served model's object: llama-server's "aliases" (its names: the model's
 * and --alias's), "tags" (--tags) and "meta" beside the others. */
static cJSON *model_object(srv *s) {
    cJSON *o = model_object_named(s, s->cfg.model_id);
    cJSON_AddItemToObject(o, "aliases", name_set(s->cfg.model_id, s->cfg.model_aliases));
    cJSON_AddItemToObject(o, "tags", name_set(NULL, s->cfg.model_tags));
    cJSON_AddItemToObject(o, "meta", model_meta(s));
    return o;
}

/* llama-server's Ollama-style "models" entry for the served model (clients of
 * both read /v1/models): name and model, format gguf, and the facts kvllm
 * has (Ollama's size in bytes, parameter count, family = architecture). */
static cJSON *ollama_model(srv *s) {
    const model_hparams *hp = model_hp(engine_model(s->e));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", s->cfg.model_id);
    cJSON_AddStringToObject(o, "model", s->cfg.model_id);
    cJSON_AddStringToObject(o, "type", "model");
    cJSON_AddNumberToObject(o, "size",
                            (double)gguf_tensor_data_bytes(model_gguf(engine_model(s->e))));
    cJSON_AddItemToObject(o, "capabilities",
                          cJSON_CreateStringArray((const char *[]){"completion"}, 1));
    cJSON *d = cJSON_AddObjectToObject(o, "details");
    cJSON_AddStringToObject(d, "format", "gguf");
    cJSON_AddStringToObject(d, "family", hp->arch);
    char n[32];
    const double np = (double)hp->n_params; /* Ollama's way: 8.0B, 494.03M */
    if (np >= 1e9) snprintf(n, sizeof n, "%.1fB", np / 1e9);
    else if (np >= 1e6) snprintf(n, sizeof n, "%.2fM", np / 1e6);
    else snprintf(n, sizeof n, "%.2fK", np / 1e3);
    cJSON_AddStringToObject(d, "parameter_size", n);
    return o;
}

char *openai_models(srv *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "models"), ollama_model(s));
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_object(s));
    for (const char *p = s->cfg.model_aliases; p && *p;) { /* each name, as vLLM lists them */
        const size_t l = strcspn(p, ",");
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)(l < sizeof name ? l : sizeof name - 1), p);
        cJSON_AddItemToArray(data, model_object_named(s, name));
        p += l + (p[l] == ',');
    }
    srv_lora_models(s, data, model_object_named); /* vLLM lists the adapters beside */
    /* Anthropic's page members */
    cJSON_AddBoolToObject(o, "has_more", false);
    cJSON_AddStringToObject(o, "first_id", s->cfg.model_id);
    const cJSON *last = cJSON_GetArrayItem(data, cJSON_GetArraySize(data) - 1);
    cJSON_AddStringToObject(o, "last_id", cJSON_GetObjectItem(last, "id")->valuestring);
    return print_delete(o);
}

char *openai_model_get(srv *s, const char *id, api_error *err) {
    if (srv_model_alias(s, id)) return print_delete(model_object_named(s, id));
    if (strcmp(id, s->cfg.model_id) != 0 && srv_model_known(s, id)) {
        cJSON *data = cJSON_CreateArray(), *o = NULL;
        srv_lora_models(s, data, model_object_named);
        for (cJSON *e = data->child; e && !o; e = e->next)
            if (!strcmp(cJSON_GetObjectItem(e, "id")->valuestring, id))
                o = cJSON_DetachItemViaPointer(data, e);
        cJSON_Delete(data);
        return print_delete(o);
    }
    if (strcmp(id, s->cfg.model_id) != 0) {
        api_fail(err, 404, "model", "The model `%.200s` does not exist.", id);
        err->code = "model_not_found";
        return NULL;
    }
    return print_delete(model_object(s));
}

/* ---------------------------------------------------------- tokenize --- */

/* The bytes of a token (specials as their text), malloc'd and NUL-terminated. */
static char *token_bytes(srv *s, int32_t id, size_t *n) {
    *n = tok_token_bytes(s->vocab, id, true, NULL, 0);
    char *p = malloc(*n + 1);
    if (p) {
        tok_token_bytes(s->vocab, id, true, p, *n);
        p[*n] = 0;
    }
    return p;
}

/* A piece as a string when it is valid UTF-8, else its bytes (llama-server). */
static cJSON *piece_json(srv *s, int32_t id) {
    size_t n;
    char *p = token_bytes(s, id, &n);
    if (!p) return NULL;
    cJSON *out;
    if (utf8_valid(p, n)) {
        out = cJSON_CreateString(p);
    } else {
        out = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++)
            cJSON_AddItemToArray(out, cJSON_CreateNumber((unsigned char)p[i]));
    }
    free(p);
    return out;
}

/* vLLM's /tokenize: {prompt, add_special_tokens} or a chat request's
 * {messages, ...} (rendered as /v1/chat/completions renders it) ->
 * {count, max_model_len, tokens, token_strs} (the vocabulary's strings, as
 * transformers' convert_ids_to_tokens gives them, with return_token_strs). */
static char *tokenize_vllm(srv *s, cJSON *b, api_error *err) {
    bool strs = false, special = !req_field(b, "messages");
    if (!req_bool(b, "return_token_strs", &strs, err) ||
        !req_bool(b, "add_special_tokens", &special, err))
        return NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    const cJSON *prompt = req_field(b, "prompt");
    if (req_field(b, "messages")) {
        if (prompt)
            return api_fail(err, 400, "prompt", "send 'prompt' or 'messages', not both"), NULL;
        if (special)
            return api_fail(err, 400, "add_special_tokens",
                            "'add_special_tokens' is for a prompt: a chat template writes its own"),
                   NULL;
        cJSON_DeleteItemFromObjectCaseSensitive(b, "return_token_strs");
        cJSON_DeleteItemFromObjectCaseSensitive(b, "add_special_tokens");
        api_req r;
        if (!openai_parse(s, b, true, &r, err)) return NULL; /* every chat field, checked */
        n = r.job->n_prompt; /* the rendered prompt's ids, taken from the job */
        ids = r.job->prompt;
        r.job->prompt = NULL;
        api_req_free(&r);
    } else {
        static const char *const NAMES[] = {"prompt", "add_special_tokens", "return_token_strs",
                                            "model"};
        if (!srv_only_fields(b, NAMES, 4, "/tokenize", err) || !srv_check_model(s, b, err))
            return NULL;
        if (!cJSON_IsString(prompt))
            return api_fail(err, 400, "prompt", "'prompt' must be a string"), NULL;
        ids = srv_encode_special(s, prompt->valuestring, strlen(prompt->valuestring), special,
                                 (tok_mode){.parse_special = true}, &n, "prompt", err);
        if (!ids) return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", (double)n);
    cJSON_AddNumberToObject(o, "max_model_len", (double)s->n_ctx);
    cJSON *arr = cJSON_AddArrayToObject(o, "tokens");
    cJSON *ts = strs ? cJSON_AddArrayToObject(o, "token_strs") : NULL;
    if (!strs) cJSON_AddNullToObject(o, "token_strs");
    for (int64_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
        if (ts) cJSON_AddItemToArray(ts, cJSON_CreateString(tok_piece(s->vocab, ids[i])));
    }
    free(ids);
    char *out = print_delete(o);
    if (!out) api_fail(err, 500, NULL, "out of memory");
    return out;
}

char *srv_tokenize(srv *s, const char *body, size_t len, api_error *err) {
    static const char *const NAMES[] = {"content", "add_special", "with_pieces", "parse_special",
                                        "model"};
    cJSON *b;
    if (!srv_parse_object(body, len, &b, err)) return NULL;
    if (!req_field(b, "content") && (req_field(b, "prompt") || req_field(b, "messages"))) {
        char *out = tokenize_vllm(s, b, err); /* vLLM's request and answer */
        cJSON_Delete(b);
        return out;
    }
    bool add_special = false, with_pieces = false, parse_special = true;
    const cJSON *c = req_field(b, "content");
    char *out = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    if (!srv_only_fields(b, NAMES, 5, "/tokenize", err) || !srv_check_model(s, b, err) ||
        !req_bool(b, "add_special", &add_special, err) ||
        !req_bool(b, "with_pieces", &with_pieces, err) ||
        !req_bool(b, "parse_special", &parse_special, err))
        goto done;
    if (!cJSON_IsString(c)) {
        api_fail(err, 400, "content", "'content' must be a string");
        goto done;
    }
    if (!(ids = srv_encode_special(s, c->valuestring, strlen(c->valuestring), add_special,
                                   (tok_mode){.parse_special = parse_special}, &n, "content", err)))
        goto done;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "tokens");
    for (int64_t i = 0; i < n; i++) {
        if (!with_pieces) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            continue;
        }
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", ids[i]);
        cJSON_AddItemToObject(t, "piece", piece_json(s, ids[i]));
        cJSON_AddItemToArray(arr, t);
    }
    if (!(out = print_delete(o))) api_fail(err, 500, NULL, "out of memory");
done:
    free(ids);
    cJSON_Delete(b);
    return out;
}

char *srv_detokenize(srv *s, const char *body, size_t len, api_error *err) {
    static const char *const NAMES[] = {"tokens", "model"};
    cJSON *b;
    if (!srv_parse_object(body, len, &b, err)) return NULL;
    char *out = NULL;
    kvl_buf text = {0};
    const cJSON *t = req_field(b, "tokens");
    if (!srv_only_fields(b, NAMES, 2, "/detokenize", err) || !srv_check_model(s, b, err)) goto done;
    if (!cJSON_IsArray(t)) {
        api_fail(err, 400, "tokens", "'tokens' must be an array of token ids");
        goto done;
    }
    int32_t n_vocab = tok_n_vocab(s->vocab);
    int i = 0;
    kvl_buf_puts(&text, "");
    for (const cJSON *v = t->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= n_vocab) {
            api_fail(err, 400, "tokens", "tokens[%d] is not a token id (0..%d)", i, n_vocab - 1);
            goto done;
        }
        size_t k;
        char *piece = token_bytes(s, (int32_t)v->valuedouble, &k);
        if (piece) kvl_buf_put(&text, piece, k);
        else text.oom = true;
        free(piece);
    }
    if (text.oom) {
        api_fail(err, 500, NULL, "out of memory");
        goto done;
    }
    cJSON *o = cJSON_CreateObject();
    /* ids can end inside a UTF-8 sequence: invalid bytes become U+FFFD */
    cJSON_AddItemToObject(o, "content", json_text(text.p, text.len));
    cJSON_AddItemToObject(o, "prompt", json_text(text.p, text.len)); /* vLLM's name for it */
    if (!(out = print_delete(o))) api_fail(err, 500, NULL, "out of memory");
done:
    kvl_buf_free(&text);
    cJSON_Delete(b);
    return out;
}

/* --------------------------------------------------------------- props -- */

char *srv_props(srv *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", s->cfg.model_id);
    cJSON_AddStringToObject(o, "model_path", s->cfg.model_path ? s->cfg.model_path : "");
    cJSON_AddNumberToObject(o, "n_ctx", (double)s->n_ctx);
    cJSON_AddNumberToObject(o, "n_embd", (double)s->n_embd);
    cJSON_AddNumberToObject(o, "total_slots", s->max_seqs);
    cJSON_AddBoolToObject(o, "endpoint_slots", !s->cfg.no_slots);
    cJSON_AddBoolToObject(o, "endpoint_metrics", true);
    cJSON *gen = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(gen, "n_ctx", (double)s->n_ctx);
    cJSON_AddItemToObject(gen, "params", llama_default_settings(s));
    cJSON_AddStringToObject(o, "chat_template",
                            s->jinja && s->cfg.chat_template_src ? s->cfg.chat_template_src : "");
    char src[320];
    if (s->jinja)
        snprintf(src, sizeof src, "%s%s",
                 s->cfg.chat_template_inline ? "inline"
                 : s->cfg.chat_template_file ? "file:"
                                             : "gguf",
                 s->cfg.chat_template_file ? s->cfg.chat_template_file : "");
    else if (s->chat == CHAT_TMPL_UNKNOWN) snprintf(src, sizeof src, "none");
    else snprintf(src, sizeof src, "builtin:%s", chat_family_name(s->chat));
    cJSON_AddStringToObject(o, "chat_template_source", src);
    /* llama-server's probes' findings (jinja_caps.c); without a Jinja template,
     * what it reports for its default ChatML one (no tools, a system role) */
    const jinja_caps builtin = {.supports_system_role = true, .supports_string_content = true};
    cJSON_AddItemToObject(o, "chat_template_caps",
                          jinja_caps_to_json(s->jinja ? &s->tmpl_caps : &builtin));
    cJSON_AddItemToObject(o, "bos_token", json_text(s->bos_text, strlen(s->bos_text)));
    cJSON_AddItemToObject(o, "eos_token", json_text(s->eos_text, strlen(s->eos_text)));
    cJSON_AddStringToObject(o, "build_info", "kvllm " KVLLM_VERSION);
    cJSON_AddStringToObject(o, "embedding_pooling",
                            s->cfg.pooling == ENGINE_POOL_MEAN  ? "mean"
                            : s->cfg.pooling == ENGINE_POOL_CLS ? "cls"
                                                                : "last");
    /* what llama.cpp's web UI reads besides: the model's name and file type,
     * its input kinds (text only here), the endpoints and the UI's settings,
     * and the features kvllm does not have (sleeping, the MCP CORS proxy) off */
    cJSON_AddStringToObject(o, "model_alias", s->cfg.model_id);
    char ftype[96];
    gguf_file_type_describe(model_gguf(engine_model(s->e)), ftype, sizeof ftype);
    cJSON_AddStringToObject(o, "model_ftype", ftype);
    cJSON *mod = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddBoolToObject(mod, "vision", false);
    cJSON_AddBoolToObject(mod, "video", false);
    cJSON_AddBoolToObject(mod, "audio", false);
    cJSON_AddBoolToObject(o, "endpoint_props", s->cfg.props_endpoint);
    cJSON_AddBoolToObject(o, "ui", !s->cfg.no_webui);
    cJSON *ui = s->cfg.ui_config ? cJSON_Parse(s->cfg.ui_config) : NULL; /* checked at start */
    cJSON_AddItemToObject(o, "ui_settings", ui ? ui : cJSON_CreateObject());
    cJSON_AddBoolToObject(o, "is_sleeping", false);
    cJSON_AddBoolToObject(o, "cors_proxy_enabled", false);
    return print_delete(o);
}

/* ---------------------------------------------------------- embeddings -- */

/* Engine thread: every input's embedding into em->out. */
static bool run_embedding(srv *s, srv_engine_task *t, api_error *err) {
    srv_embed *em = (srv_embed *)t;
    for (int i = 0; i < em->n_inputs; i++) {
        kvl_error kerr = {{0}};
        if (!engine_embed(
                s->e, em->ids[i], em->n_ids[i], s->cfg.pooling, em->normalize,
                em->n_lora ? em->lora : NULL, em->out + (size_t)i * (size_t)s->n_embd,
                &kerr)) /* the inputs were checked, so what is left is a full pool: retry later */
            return api_fail(err, 503, NULL, "input[%d]: %s", i, kerr.msg);
    }
    return true;
}

static void free_inputs(srv_embed *em) {
    for (int i = 0; i < em->n_inputs; i++) free(em->ids[i]);
    free(em->ids);
    free(em->n_ids);
    free(em->out);
}

static bool add_ids(srv *s, srv_embed *em, const cJSON *arr, int idx, api_error *err) {
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return api_fail(err, 400, em->field, "%s[%d] is empty", em->field, idx);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return api_fail(err, 500, NULL, "out of memory");
    int32_t n_vocab = tok_n_vocab(s->vocab);
    int i = 0;
    for (const cJSON *v = arr->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= n_vocab) {
            free(ids);
            return api_fail(err, 400, em->field, "%s[%d][%d] is not a token id (0..%d)", em->field,
                            idx, i, n_vocab - 1);
        }
        ids[i] = (int32_t)v->valuedouble;
    }
    em->ids[em->n_inputs] = ids;
    em->n_ids[em->n_inputs++] = n;
    return true;
}

/* A text as llama-server tokenizes embedding inputs: special tokens parsed,
 * BOS and EOS added as the vocabulary says (embedding models such as
 * Qwen3-Embedding add EOS, and last-token pooling reads that token). */
static bool add_text(srv *s, srv_embed *em, const char *text, int idx, api_error *err) {
    size_t len = strlen(text);
    if (len > (size_t)s->n_ctx * 256)
        return api_fail(err, 400, em->field, "%s[%d] is too long for the context of %lld tokens",
                        em->field, idx, (long long)s->n_ctx);
    int64_t n = 0;
    int32_t *ids = srv_encode_special(s, text, len, true, (tok_mode){.parse_special = true}, &n,
                                      em->field, err);
    if (!ids) return false;
    if (n == 0) {
        free(ids);
        return api_fail(err, 400, em->field, "%s[%d]: the input is empty", em->field, idx);
    }
    em->ids[em->n_inputs] = ids;
    em->n_ids[em->n_inputs++] = n;
    return true;
}

/* input: "text" | ["text", ...] | [ids] | [[ids], ...] */
static bool parse_inputs(srv *s, const cJSON *in, srv_embed *em, api_error *err) {
    int n = 1;
    if (cJSON_IsArray(in)) {
        n = cJSON_GetArraySize(in);
        if (n == 0) return api_fail(err, 400, em->field, "'%s' must not be empty", em->field);
        if (cJSON_IsNumber(in->child)) n = 1;
    } else if (!cJSON_IsString(in)) {
        return api_fail(err, 400, em->field,
                        "'%s' must be a string, an array of strings, or token ids", em->field);
    }
    if (n > MAX_EMBED_INPUTS)
        return api_fail(err, 400, em->field, "at most %d inputs per request", MAX_EMBED_INPUTS);
    em->ids = calloc((size_t)n, sizeof *em->ids);
    em->n_ids = calloc((size_t)n, sizeof *em->n_ids);
    if (!em->ids || !em->n_ids) return api_fail(err, 500, NULL, "out of memory");
    if (cJSON_IsString(in)) return add_text(s, em, in->valuestring, 0, err);
    if (cJSON_IsNumber(in->child)) return add_ids(s, em, in, 0, err);
    int i = 0;
    for (const cJSON *v = in->child; v; v = v->next, i++) {
        bool ok = cJSON_IsString(v) ? add_text(s, em, v->valuestring, i, err)
                  : cJSON_IsArray(v)
                      ? add_ids(s, em, v, i, err)
                      : api_fail(err, 400, em->field, "%s[%d] must be a string or token ids",
                                 em->field, i);
        if (!ok) return false;
    }
    return true;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The floats' little-endian bytes in base64, as OpenAI's encoding_format=base64. */
static cJSON *base64_floats(const float *v, int64_t n) {
    size_t nb = (size_t)n * 4, o = 0;
    char *s = malloc((nb + 2) / 3 * 4 + 1);
    if (!s) return NULL;
    unsigned char *b = malloc(nb);
    if (!b) {
        free(s);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[i * 4 + k] = (unsigned char)(u >> (8 * k));
    }
    for (size_t i = 0; i < nb; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < nb ? b[i + 2] : 0);
        s[o++] = B64[x >> 18 & 63];
        s[o++] = B64[x >> 12 & 63];
        s[o++] = i + 1 < nb ? B64[x >> 6 & 63] : '=';
        s[o++] = i + 2 < nb ? B64[x & 63] : '=';
    }
    s[o] = 0;
    cJSON *j = cJSON_CreateString(s);
    free(s);
    free(b);
    return j;
}

static char *embed_response(srv *s, const srv_embed *em, bool b64) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    int64_t total = 0;
    for (int i = 0; i < em->n_inputs; i++) {
        const float *v = em->out + (size_t)i * (size_t)s->n_embd;
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", i);
        cJSON_AddItemToObject(d, "embedding",
                              b64 ? base64_floats(v, s->n_embd)
                                  : cJSON_CreateFloatArray(v, (int)s->n_embd));
        cJSON_AddItemToArray(data, d);
        total += em->n_ids[i];
    }
    cJSON_AddStringToObject(o, "model", s->cfg.model_id);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)total);
    cJSON_AddNumberToObject(u, "total_tokens", (double)total);
    return print_delete(o);
}

/* llama-server's own shape (/embedding, /embeddings, or "content" instead of
 * "input"): [{index, embedding: [[values]]}], one row a pooled input. */
static char *embed_response_llama(srv *s, const srv_embed *em) {
    cJSON *o = cJSON_CreateArray();
    for (int i = 0; i < em->n_inputs; i++) {
        cJSON *d = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(d, "embedding");
        cJSON_AddNumberToObject(d, "index", i);
        cJSON_AddItemToArray(
            rows, cJSON_CreateFloatArray(em->out + (size_t)i * (size_t)s->n_embd, (int)s->n_embd));
        cJSON_AddItemToArray(o, d);
    }
    return print_delete(o);
}

char *srv_embeddings(srv *s, const char *body, size_t len, bool llama, api_error *err) {
    static const char *const NAMES[] = {"input",      "content", "model",         "encoding_format",
                                        "dimensions", "user",    "embd_normalize"};
    cJSON *b;
    if (!srv_parse_object(body, len, &b, err)) return NULL;
    srv_embed em = {.task.run = run_embedding, .field = "input", .normalize = 2};
    char *out = NULL;
    bool b64 = false;
    int64_t norm = 2;
    const char *ep = llama ? "/embedding" : "/v1/embeddings";
    if (s->cfg.kv_ranks > 0) {
        api_fail(err, 501, NULL,
                 "embeddings are not available with --pp: the hidden states stay on the last rank");
        err->type = "not_supported_error";
        goto done;
    }
    if (!srv_only_fields(b, NAMES, 7, ep, err) || !srv_check_model(s, b, err) ||
        !req_int(b, "embd_normalize", -1, 64, &norm, err))
        goto done;
    em.normalize = (int)norm;
    const cJSON *model = req_field(b, "model"); /* an adapter's name: embeddings through it */
    if (!srv_lora_scales(s, b, model ? model->valuestring : NULL, em.lora, &em.n_lora, err))
        goto done;
    const cJSON *fmt = req_field(b, "encoding_format"), *dim = req_field(b, "dimensions"),
                *in = req_field(b, "input"), *content = req_field(b, "content");
    if (in && content) {
        api_fail(err, 400, "content", "send 'input' or 'content', not both");
        goto done;
    }
    if (content) { /* llama-server: "content" answers in its own shape */
        in = content;
        em.field = "content";
        llama = true;
    }
    if (fmt && (!cJSON_IsString(fmt) ||
                (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64")))) {
        api_fail(err, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        goto done;
    }
    b64 = fmt && strcmp(fmt->valuestring, "base64") == 0;
    if (b64 && llama) {
        api_fail(err, 400, "encoding_format",
                 "'encoding_format' base64 is for OpenAI's answer: /v1/embeddings with 'input'");
        goto done;
    }
    if (dim && (!cJSON_IsNumber(dim) || dim->valuedouble != (double)s->n_embd)) {
        api_fail(err, 400, "dimensions",
                 "'dimensions' is not supported: this model's embeddings have %lld dimensions "
                 "(send that, or "
                 "leave it out)",
                 (long long)s->n_embd);
        goto done;
    }
    if (!in) {
        api_fail(err, 400, "input", "'input' (or 'content') is required");
        goto done;
    }
    if (!parse_inputs(s, in, &em, err)) goto done;
    for (int i = 0; i < em.n_inputs; i++)
        if (em.n_ids[i] > s->n_ctx) {
            api_fail(err, 400, em.field, "%s[%d] has %lld tokens, more than the context of %lld",
                     em.field, i, (long long)em.n_ids[i], (long long)s->n_ctx);
            goto done;
        }
    em.out = malloc((size_t)em.n_inputs * (size_t)s->n_embd * sizeof(float));
    if (!em.out) {
        api_fail(err, 500, NULL, "out of memory");
        goto done;
    }
    if (!srv_engine_call(s, &em.task, err)) goto done;
    if (!(out = llama ? embed_response_llama(s, &em) : embed_response(s, &em, b64)))
        api_fail(err, 500, NULL, "out of memory");
done:
    free_inputs(&em);
    cJSON_Delete(b);
    return out;
}

/* ------------------------------------------------------------- rerank -- */

/* Engine thread: each prompt's scores; the first (Qwen3-Reranker's "yes") is
 * the document's, as llama-server reports it. */
static bool run_rerank(srv *s, srv_engine_task *t, api_error *err) {
    rerank_req *rj = (rerank_req *)t;
    const int64_t n_cls = model_hp(engine_model(s->e))->n_cls_out;
    float *cls = malloc((size_t)(n_cls > 0 ? n_cls : 1) * sizeof *cls);
    if (!cls) return api_fail(err, 500, NULL, "out of memory");
    for (int i = 0; i < rj->n_docs; i++) {
        kvl_error kerr = {{0}};
        /* the prompts were checked, so what is left is a full pool: retry later */
        if (!engine_rank(s->e, rj->ids[i], rj->n_ids[i], rj->n_lora ? rj->lora : NULL, cls,
                         &kerr)) {
            free(cls);
            return api_fail(err, 503, NULL, "documents[%d]: %s", i, kerr.msg);
        }
        rj->score[i] = cls[0];
    }
    free(cls);
    return true;
}

/* /rerank or /score: parse, score every prompt on the engine thread, answer. */
static char *score_pairs(srv *s, const char *body, size_t len, bool score, api_error *err) {
    cJSON *b;
    if (!srv_parse_object(body, len, &b, err)) return NULL;
    rerank_req rj;
    char *out = NULL;
    if (s->cfg.kv_ranks > 0) {
        api_fail(err, 501, NULL,
                 "reranking is not available with --pp: the hidden states stay on the last rank");
        err->type = "not_supported_error";
        rj = (rerank_req){0};
    } else if (model_hp(engine_model(s->e))->n_cls_out == 0) {
        api_fail(err, 501, NULL,
                 "this model cannot rerank: it has no classifier head (tensor "
                 "'cls.output.weight', as Qwen3-Reranker GGUF files carry)");
        err->type = "not_supported_error";
        rj = (rerank_req){0};
    } else if (score ? score_parse(s, b, &rj, err) : rerank_parse(s, b, &rj, err)) {
        rj.task.run = run_rerank;
        if (srv_engine_call(s, &rj.task, err) &&
            !(out = score ? score_answer(s, b, &rj) : rerank_answer(s, b, &rj)))
            api_fail(err, 500, NULL, "out of memory");
    }
    rerank_req_free(&rj);
    cJSON_Delete(b);
    return out;
}

char *srv_rerank(srv *s, const char *body, size_t len, api_error *err) {
    return score_pairs(s, body, len, false, err);
}

char *srv_score(srv *s, const char *body, size_t len, api_error *err) {
    return score_pairs(s, body, len, true, err);
}

char *srv_apply_template(srv *s, const char *body, size_t len, api_error *err) {
    cJSON *b = json_parse_body(body, len, err);
    if (!b) return NULL;
    api_req r;
    const bool ok = openai_parse(s, b, true, &r, err); /* every chat field, as a chat request */
    cJSON_Delete(b);
    if (!ok) return NULL;
    cJSON *o = cJSON_CreateObject();
    const char *text = r.job->prompt_text ? r.job->prompt_text : "";
    cJSON_AddItemToObject(o, "prompt", json_text(text, strlen(text)));
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    api_req_free(&r);
    if (!js) api_fail(err, 500, NULL, "out of memory");
    return js;
}

/* ------------------------------------------------- completions' echo -- */

typedef struct echo_task {
    srv_engine_task task;
    api_req *r;
} echo_task;

static bool run_echo(srv *s, srv_engine_task *t, api_error *err) {
    api_req *r = ((echo_task *)t)->r;
    const srv_job *j = r->job;
    for (int k = 0; k < j->n_prompts; k++) {
        kvl_error kerr = {{0}};
        int64_t n;
        const int32_t *ids = job_prompt(j, k, &n);
        const float *lora = j->n_lora ? j->lora : NULL;
        if (r->echo_lp[k] &&
            !engine_prompt_logprobs(s->e, ids, n, lora, j->top_logprobs, r->echo_lp[k],
                                    r->echo_top_ids[k], r->echo_top_lps[k], NULL, &kerr))
            return api_fail(err, 503, NULL, "prompt %d: %s", k, kerr.msg);
        if (r->plp_lp[k] &&
            !engine_prompt_logprobs(s->e, ids, n, lora, r->prompt_logprobs, r->plp_lp[k],
                                    r->plp_top_ids[k], r->plp_top_lps[k], r->plp_rank[k], &kerr))
            return api_fail(err, 503, NULL, "prompt %d: %s", k, kerr.msg);
    }
    return true;
}

bool srv_echo_prepare(srv *s, api_req *r, api_error *err) {
    const srv_job *j = r->job;
    for (int p = 0; p < j->n_prompts; p++) {
        int64_t n;
        const int32_t *ids = job_prompt(j, p, &n);
        if (r->echo && !r->echo_text[p]) { /* a prompt of ids: their text */
            kvl_buf t = {0};
            srv_ids_text(s, ids, n, &t);
            r->echo_len[p] = t.len;
            kvl_buf_put(&t, "", 1);
            r->echo_text[p] = t.p;
            if (t.oom || !t.p) return api_fail(err, 500, NULL, "out of memory");
        }
        if (r->prompt_logprobs >= 0) {
            const size_t k = (size_t)r->prompt_logprobs;
            r->plp_lp[p] = malloc((size_t)n * sizeof *r->plp_lp[p]);
            r->plp_rank[p] = malloc((size_t)n * sizeof *r->plp_rank[p]);
            r->plp_top_ids[p] = malloc(((size_t)n * k + 1) * sizeof *r->plp_top_ids[p]);
            r->plp_top_lps[p] = malloc(((size_t)n * k + 1) * sizeof *r->plp_top_lps[p]);
            if (!r->plp_lp[p] || !r->plp_rank[p] || !r->plp_top_ids[p] || !r->plp_top_lps[p])
                return api_fail(err, 500, NULL, "out of memory");
        }
        if (!r->echo || !r->logprobs) continue;
        const size_t k = (size_t)j->top_logprobs;
        r->echo_lp[p] = malloc((size_t)n * sizeof *r->echo_lp[p]);
        r->echo_top_ids[p] = malloc(((size_t)n * k + 1) * sizeof *r->echo_top_ids[p]);
        r->echo_top_lps[p] = malloc(((size_t)n * k + 1) * sizeof *r->echo_top_lps[p]);
        if (!r->echo_lp[p] || !r->echo_top_ids[p] || !r->echo_top_lps[p])
            return api_fail(err, 500, NULL, "out of memory");
    }
    if (!r->echo_lp[0] && !r->plp_lp[0]) return true;
    echo_task et = {.task.run = run_echo, .r = r};
    return srv_engine_call(s, &et.task, err);
}
