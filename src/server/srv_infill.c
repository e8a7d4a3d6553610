/* llama-server's POST /infill: the fill-in-the-middle prompt it lays out
 * (format_prompt_infill's layout, from the tokenizer's FIM tokens), then the
 * request goes on as POST /completion (srv_llama.c) with those ids as its
 * prompt. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

/* ------------------------------------------------------------- infill -- */

typedef struct ids {
    int32_t *p;
    int64_t n;
    size_t cap;
} ids;

static bool ids_push(ids *a, const int32_t *t, int64_t n) {
    if (n == 0) return true; /* t may be NULL then (an empty part) */
    if (!kvl_grow((void **)&a->p, &a->cap, (size_t)(a->n + n), sizeof *a->p, 64)) return false;
    memcpy(a->p + a->n, t, (size_t)n * sizeof *t);
    a->n += n;
    return true;
}

/* a text's tokens appended to a (no BOS) */
static bool ids_text(srv *s, ids *a, const char *text, bool special, const char *param,
                     api_error *err) {
    int64_t n = 0;
    int32_t *t = srv_encode(s, text, strlen(text), false, (tok_mode){.parse_special = special}, &n,
                            param, err);
    if (!t) return false;
    bool ok = ids_push(a, t, n);
    free(t);
    return ok ? true : api_fail(err, 500, NULL, "out of memory");
}

/* input_prefix / input_suffix appended to a: a string, or ids and strings
 * mixed (llama_tokenize_mixed: no BOS, special tokens not parsed, as
 * llama-server tokenizes them there). */
static bool ids_mixed(srv *s, ids *a, const cJSON *v, const char *param, api_error *err) {
    int64_t n = 0;
    int32_t *t = llama_tokenize_mixed(s, v, false, false, param, &n, err);
    if (!t) return false;
    bool ok = ids_push(a, t, n);
    free(t);
    return ok ? true : api_fail(err, 500, NULL, "out of memory");
}

/* llama-server's batch (its -b default): the prefix keeps its last 3/4 of
 * it, the suffix its first quarter less the prompt, as format_prompt_infill. */
#define INFILL_N_BATCH 2048

/* The FIM prompt as llama-server lays it out: the repo-level extra chunks
 * ([FIM_REP]myproject, per chunk [FIM_SEP]filename and its text; without
 * FIM_SEP a "--- snippet ---" line between chunks), then [FIM_PRE] prefix
 * prompt [FIM_SUF] suffix [FIM_MID], BOS before FIM_PRE if the vocabulary
 * adds one; the extra chunks only as far as the context leaves room. */
static bool infill_prompt(srv *s, const cJSON *b, ids *out, api_error *err) {
    const tok_fim f = tok_fim_ids(s->vocab);
    if (f.pre < 0 || f.suf < 0 || f.mid < 0)
        return api_fail(err, 501, NULL, "Infill is not supported by this model: %s%s%s",
                        f.pre < 0 ? "prefix token is missing. " : "",
                        f.suf < 0 ? "suffix token is missing. " : "",
                        f.mid < 0 ? "middle token is missing. " : "");
    const cJSON *pre = req_field(b, "input_prefix"), *suf = req_field(b, "input_suffix"),
                *extra = req_field(b, "input_extra"), *prompt = req_field(b, "prompt");
    if (!pre) return api_fail(err, 400, "input_prefix", "\"input_prefix\" is required");
    if (!suf) return api_fail(err, 400, "input_suffix", "\"input_suffix\" is required");
    if (prompt && !cJSON_IsString(prompt))
        return api_fail(err, 400, "prompt", "\"prompt\" must be a string");
    if (extra && !cJSON_IsArray(extra))
        return api_fail(
            err, 400, "input_extra",
            "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}");
    ids x = {0}, p = {0}, sfx = {0}, mid = {0};
    bool ok = true;
    if (f.rep >= 0)
        ok = ids_push(&x, &f.rep, 1) && ids_text(s, &x, "myproject\n", false, "input_extra", err);
    int i = 0;
    for (const cJSON *c = extra ? extra->child : NULL; ok && c; c = c->next, i++) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text"),
                    *name = cJSON_GetObjectItemCaseSensitive(c, "filename");
        const char *k =
            cJSON_IsObject(c)
                ? json_unknown_key(c, (const char *const[]){"text", "filename", "time", NULL})
                : NULL;
        /* "time": when llama.vim saw the chunk; llama-server reads it nowhere either */
        if (!cJSON_IsObject(c) || !cJSON_IsString(text) || (name && !cJSON_IsString(name)) || k) {
            ok = api_fail(err, 400, "input_extra",
                          "input_extra[%d] must be {\"text\": string, \"filename\": string}", i);
            break;
        }
        if (f.sep >= 0) {
            char *line = NULL;
            ok = asprintf(&line, "%s\n", name ? name->valuestring : "tmp") >= 0 &&
                 ids_push(&x, &f.sep, 1) && ids_text(s, &x, line, false, "input_extra", err);
            free(line);
        } else {
            ok = ids_text(s, &x, "\n\n--- snippet ---\n\n", false, "input_extra", err);
        }
        ok = ok && ids_text(s, &x, text->valuestring, false, "input_extra", err);
    }
    if (ok && f.sep >= 0)
        ok = ids_push(&x, &f.sep, 1) && ids_text(s, &x, "filename\n", false, "input_extra", err);
    ok = ok && ids_mixed(s, &p, pre, "input_prefix", err) &&
         ids_mixed(s, &sfx, suf, "input_suffix", err) &&
         (!prompt || ids_text(s, &mid, prompt->valuestring, true, "prompt", err));
    if (ok) {
        const int64_t n_pre = p.n < 3 * (INFILL_N_BATCH / 4) ? p.n : 3 * (INFILL_N_BATCH / 4);
        int64_t n_suf = INFILL_N_BATCH / 4 - (2 + mid.n);
        n_suf = n_suf < 0 ? 0 : n_suf < sfx.n ? n_suf : sfx.n;
        int64_t n_x = s->n_ctx - INFILL_N_BATCH + 2; /* llama's n_predict default -1 */
        n_x = n_x < 0 ? 0 : n_x < x.n ? n_x : x.n;
        const int32_t bos = tok_bos(s->vocab);
        ok = ids_push(out, x.p + x.n - n_x, n_x) &&
             (!(tok_add_bos(s->vocab) && bos >= 0) || ids_push(out, &bos, 1)) &&
             ids_push(out, &f.pre, 1) && ids_push(out, p.p + p.n - n_pre, n_pre) &&
             ids_push(out, mid.p, mid.n) && ids_push(out, &f.suf, 1) &&
             ids_push(out, sfx.p, n_suf) && ids_push(out, &f.mid, 1);
        if (!ok) api_fail(err, 500, NULL, "out of memory");
    }
    free(x.p), free(p.p), free(sfx.p), free(mid.p);
    return ok;
}

bool llama_infill_parse(srv *s, const cJSON *body, api_req *r, api_error *err) {
    memset(r, 0, sizeof *r);
    if (!cJSON_IsObject(body))
        return api_fail(err, 400, NULL, "the request body must be a JSON object");
    ids t = {0};
    if (!infill_prompt(s, body, &t, err)) {
        free(t.p);
        return false;
    }
    /* the completion request it becomes: the FIM ids as its prompt */
    cJSON *b = cJSON_Duplicate(body, true), *a = cJSON_CreateArray();
    for (int64_t i = 0; a && i < t.n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(t.p[i]));
    free(t.p);
    if (!b || !a) {
        cJSON_Delete(b), cJSON_Delete(a);
        return api_fail(err, 500, NULL, "out of memory");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(b, "input_prefix");
    cJSON_DeleteItemFromObjectCaseSensitive(b, "input_suffix");
    cJSON_DeleteItemFromObjectCaseSensitive(b, "input_extra");
    cJSON_DeleteItemFromObjectCaseSensitive(b, "prompt");
    cJSON_AddItemToObject(b, "prompt", a);
    bool ok = llama_parse(s, b, r, err);
    cJSON_Delete(b);
    return ok;
}
