/* The request and the answer of POST /rerank (and /reranking, /v1/rerank,
 * /v1/reranking, /v2/rerank): llama-server's reranking, on a model with a
 * classifier head (Qwen3-Reranker files: engine_rank). One prompt a document,
 * laid out as llama-server lays it out; srv_endpoints.c's srv_rerank scores
 * them on the engine thread, as /v1/embeddings' inputs. The answer takes
 * Jina's shape (Cohere's and vLLM's clients read the same results), or TEI's
 * when the documents come as "texts" (llama-server's rule). No engine here,
 * so the request fuzzer reaches all of it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

#define MAX_RERANK_DOCS 2048

/* s with every pat replaced by rep (malloc'd), left to right and not
 * rescanning what was put in, as llama.cpp's string_replace_all. */
static char *replace_all(const char *s, const char *pat, const char *rep) {
    const size_t lp = strlen(pat), lr = strlen(rep);
    size_t n = 0;
    for (const char *p = strstr(s, pat); p; p = strstr(p + lp, pat)) n++;
    char *out = malloc(strlen(s) + n * lr + 1), *o = out;
    if (!out) return NULL;
    const char *p = s;
    for (const char *q; (q = strstr(p, pat)) != NULL; p = q + lp) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, rep, lr);
        o += lr;
    }
    strcpy(o, p);
    return out;
}

/* Appends the n ids of a (if any) to *ids, whose length is *len. */
static bool append_ids(int32_t **ids, int64_t *len, const int32_t *a, int64_t n) {
    if (n <= 0) return true;
    int32_t *grown = realloc(*ids, (size_t)(*len + n) * sizeof **ids);
    if (!grown) return false;
    memcpy(grown + *len, a, (size_t)n * sizeof *a);
    *ids = grown;
    *len += n;
    return true;
}

static bool append_text(srv *s, int32_t **ids, int64_t *len, const char *text, bool special,
                        api_error *err) {
    if (!*text) return true;
    int64_t n = 0;
    int32_t *t = srv_encode(s, text, strlen(text), false, (tok_mode){.parse_special = special}, &n,
                            "documents", err);
    if (!t) return false;
    bool ok = append_ids(ids, len, t, n);
    free(t);
    return ok || api_fail(err, 500, NULL, "out of memory");
}

static bool append_id(int32_t **ids, int64_t *len, int32_t id, api_error *err) {
    return append_ids(ids, len, &id, 1) || api_fail(err, 500, NULL, "out of memory");
}

/* llama-server's format_prompt_rerank: the model's rerank template with
 * {query} and then {document} replaced everywhere, its special tokens parsed
 * and nothing added; without a template [BOS] query [EOS] [SEP] doc [EOS], each
 * as the vocabulary adds it (EOS falling back to the separator), the texts
 * without special tokens. */
static bool rerank_prompt(srv *s, const char *query, const char *doc, int idx, int32_t **ids,
                          int64_t *n, api_error *err) {
    const tok_vocab *v = s->vocab;
    *ids = NULL;
    *n = 0;
    bool ok;
    if (s->cfg.rerank_template) {
        char *a = replace_all(s->cfg.rerank_template, "{query}", query);
        char *b = a ? replace_all(a, "{document}", doc) : NULL;
        ok = b ? append_text(s, ids, n, b, true, err) : api_fail(err, 500, NULL, "out of memory");
        free(a);
        free(b);
    } else {
        const int32_t eos = tok_eos(v) >= 0 ? tok_eos(v) : tok_sep(v);
        const bool add_eos = tok_add_eos(v) && eos >= 0;
        ok = (!tok_add_bos(v) || tok_bos(v) < 0 || append_id(ids, n, tok_bos(v), err)) &&
             append_text(s, ids, n, query, false, err) &&
             (!add_eos || append_id(ids, n, eos, err)) &&
             (!tok_add_sep(v) || append_id(ids, n, tok_sep(v), err)) &&
             append_text(s, ids, n, doc, false, err) && (!add_eos || append_id(ids, n, eos, err));
    }
    if (ok && *n == 0)
        ok = api_fail(err, 400, "documents", "documents[%d]: the prompt is empty", idx);
    if (ok && *n > s->n_ctx)
        ok = api_fail(err, 400, "documents",
                      "documents[%d]: the prompt has %lld tokens, more than the context of %lld",
                      idx, (long long)*n, (long long)s->n_ctx);
    if (!ok) {
        free(*ids);
        *ids = NULL;
    }
    return ok;
}

/* A document: a string, or an object {"text": string} (Jina's and vLLM's). */
static const char *doc_text(const cJSON *d) {
    if (cJSON_IsString(d)) return d->valuestring;
    if (!cJSON_IsObject(d) || json_unknown_key(d, (const char *const[]){"text", NULL})) return NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(d, "text");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

typedef struct ranked {
    int index;
    float score;
} ranked;

/* Best first; equal scores in document order. */
static int by_score(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return x->index - y->index;
}

char *rerank_answer(srv *s, const cJSON *b, const rerank_req *rj) {
    const bool tei = rj->tei, with_text = rj->with_text;
    const cJSON *docs = rj->docs;
    ranked *r = malloc((size_t)rj->n_docs * sizeof *r);
    if (!r) return NULL;
    int64_t tokens = 0;
    for (int i = 0; i < rj->n_docs; i++) {
        r[i] = (ranked){i, rj->score[i]};
        tokens += rj->n_ids[i];
    }
    qsort(r, (size_t)rj->n_docs, sizeof *r, by_score);
    cJSON *results = cJSON_CreateArray();
    for (int i = 0; i < rj->n_docs && i < rj->top_n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "index", r[i].index);
        cJSON_AddNumberToObject(e, tei ? "score" : "relevance_score", (double)r[i].score);
        const char *text = doc_text(cJSON_GetArrayItem(docs, r[i].index));
        if (with_text && tei) cJSON_AddStringToObject(e, "text", text);
        else if (with_text)
            cJSON_AddStringToObject(cJSON_AddObjectToObject(e, "document"), "text", text);
        cJSON_AddItemToArray(results, e);
    }
    free(r);
    if (tei) {
        char *out = cJSON_PrintUnformatted(results);
        cJSON_Delete(results);
        return out;
    }
    const cJSON *m = req_field(b, "model");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", m ? m->valuestring : s->cfg.model_id);
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)tokens);
    cJSON_AddItemToObject(o, "results", results);
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

void rerank_req_free(rerank_req *rj) {
    for (int i = 0; i < rj->n_docs; i++) free(rj->ids[i]);
    free(rj->ids);
    free(rj->n_ids);
    free(rj->score);
    memset(rj, 0, sizeof *rj);
}

/* The adapters' scales the request's model names (an adapter's name scores
 * through it) and room for n prompts and their scores. */
static bool prompts_alloc(srv *s, const cJSON *b, rerank_req *rj, int n, api_error *err) {
    const cJSON *model = req_field(b, "model");
    if (!srv_lora_scales(s, b, model ? model->valuestring : NULL, rj->lora, &rj->n_lora, err))
        return false;
    rj->ids = calloc((size_t)n, sizeof *rj->ids);
    rj->n_ids = calloc((size_t)n, sizeof *rj->n_ids);
    rj->score = calloc((size_t)n, sizeof *rj->score);
    return (rj->ids && rj->n_ids && rj->score) || api_fail(err, 500, NULL, "out of memory");
}

bool rerank_parse(srv *s, const cJSON *b, rerank_req *rj, api_error *err) {
    /* Jina's / Cohere's fields, TEI's texts and return_text; llama-server reads these */
    static const char *const NAMES[] = {"query",       "documents",        "texts", "top_n",
                                        "return_text", "return_documents", "model"};
    *rj = (rerank_req){.top_n = -1};
    const cJSON *q = req_field(b, "query"), *docs = req_field(b, "documents"),
                *texts = req_field(b, "texts");
    rj->tei = texts != NULL; /* llama-server: "texts" picks TEI's answer */
    bool return_text = false, return_docs = false;
    if (!srv_only_fields(b, NAMES, 7, "/rerank", err) || !srv_check_model(s, b, err) ||
        !req_int(b, "top_n", 0, INT32_MAX, &rj->top_n, err) ||
        !req_bool(b, "return_text", &return_text, err) ||
        !req_bool(b, "return_documents", &return_docs, err))
        return false;
    rj->with_text = rj->tei ? return_text : return_docs;
    if (docs && texts)
        return api_fail(err, 400, "texts",
                        "send the documents as 'documents' or as 'texts', not both");
    if (!q) return api_fail(err, 400, "query", "\"query\" must be provided");
    if (!cJSON_IsString(q)) return api_fail(err, 400, "query", "\"query\" must be a string");
    rj->docs = docs ? docs : texts;
    const int n = cJSON_IsArray(rj->docs) ? cJSON_GetArraySize(rj->docs) : 0;
    if (n == 0)
        return api_fail(err, 400, rj->tei ? "texts" : "documents",
                        "\"documents\" must be a non-empty string array");
    if (n > MAX_RERANK_DOCS)
        return api_fail(err, 400, "documents", "at most %d documents per request", MAX_RERANK_DOCS);
    if (rj->top_n < 0) rj->top_n = n;
    if (!prompts_alloc(s, b, rj, n, err)) return false;
    int i = 0;
    for (const cJSON *d = rj->docs->child; d; d = d->next, i++) {
        const char *text = doc_text(d);
        if (!text)
            return api_fail(err, 400, rj->tei ? "texts" : "documents",
                            "documents[%d] must be a string (or {\"text\": string})", i);
        if (!rerank_prompt(s, q->valuestring, text, i, &rj->ids[i], &rj->n_ids[i], err))
            return false;
        rj->n_docs = i + 1;
    }
    return true;
}

/* vLLM's Score API (POST /score, /v1/score): text_1 and text_2, each a string
 * or an array of strings, paired 1:1, 1:N or N:N; every pair scored as
 * /rerank scores a query and a document. */
bool score_parse(srv *s, const cJSON *b, rerank_req *rj, api_error *err) {
    static const char *const NAMES[] = {"model", "text_1", "text_2", "truncate_prompt_tokens"};
    *rj = (rerank_req){.top_n = -1};
    if (!srv_only_fields(b, NAMES, 4, "/score", err) || !srv_check_model(s, b, err)) return false;
    const cJSON *tp = req_field(b, "truncate_prompt_tokens");
    if (tp && !cJSON_IsNull(tp))
        return api_fail(err, 400, "truncate_prompt_tokens",
                        "'truncate_prompt_tokens' is not supported on /score: a pair longer than "
                        "the context is a 400");
    const cJSON *t[2] = {req_field(b, "text_1"), req_field(b, "text_2")};
    int n[2];
    for (int k = 0; k < 2; k++) {
        const char *f = k ? "text_2" : "text_1";
        if (!t[k]) return api_fail(err, 400, f, "'%s' must be provided", f);
        n[k] = cJSON_IsString(t[k]) ? 1 : cJSON_IsArray(t[k]) ? cJSON_GetArraySize(t[k]) : -1;
        if (n[k] < 1) return api_fail(err, 400, f, "'%s' must be a string or a non-empty array", f);
        for (int i = 0; cJSON_IsArray(t[k]) && i < n[k]; i++)
            if (!cJSON_IsString(cJSON_GetArrayItem(t[k], i)))
                return api_fail(err, 400, f, "%s[%d] must be a string", f, i);
    }
    if (n[0] > 1 && n[0] != n[1])
        return api_fail(err, 400, "text_2",
                        "Input lengths must be either 1:1, 1:N or N:N (text_1 has %d, text_2 %d)",
                        n[0], n[1]);
    const int np = n[1];
    if (np > MAX_RERANK_DOCS)
        return api_fail(err, 400, "text_2", "at most %d pairs per request", MAX_RERANK_DOCS);
    if (!prompts_alloc(s, b, rj, np, err)) return false;
    for (int i = 0; i < np; i++) {
        const cJSON *q = cJSON_IsString(t[0]) ? t[0] : cJSON_GetArrayItem(t[0], n[0] > 1 ? i : 0);
        const cJSON *d = cJSON_IsString(t[1]) ? t[1] : cJSON_GetArrayItem(t[1], i);
        if (!rerank_prompt(s, q->valuestring, d->valuestring, i, &rj->ids[i], &rj->n_ids[i], err))
            return false;
        rj->n_docs = i + 1;
    }
    return true;
}

/* vLLM's ScoreResponse: {id, object "list", created, model, data: [{index,
 * object "score", score}] in pair order, usage}. */
char *score_answer(srv *s, const cJSON *b, const rerank_req *rj) {
    int64_t tokens = 0;
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray();
    char id[48];
    snprintf(id, sizeof id, "score-%016llx", (unsigned long long)kvl_random_u64());
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddNumberToObject(o, "created", (double)time(NULL));
    const cJSON *m = req_field(b, "model");
    cJSON_AddStringToObject(o, "model", m ? m->valuestring : s->cfg.model_id);
    for (int i = 0; i < rj->n_docs; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "index", i);
        cJSON_AddStringToObject(e, "object", "score");
        cJSON_AddNumberToObject(e, "score", (double)rj->score[i]);
        cJSON_AddItemToArray(data, e);
        tokens += rj->n_ids[i];
    }
    cJSON_AddItemToObject(o, "data", data);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", 0);
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}
