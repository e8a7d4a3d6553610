/* libFuzzer target for the request parser: a request body, as the HTTP layer
 * receives it, through the same steps (json_parse_body, openai_parse or
 * responses_parse) into a job, against two servers built as srv_new builds
 * them minus the engine: stories260K's SentencePiece vocab with the built-in
 * ChatML family, and Qwen 3's byte-level BPE vocab with its Jinja template.
 * Input: byte 0 picks the server (bit 0) and the endpoint (bit 1: chat, else
 * completions; bits 2-3: 1 /v1/responses, 2 /v1/messages, 3
 * /v1/messages/count_tokens instead; with bits 2-3 clear, bit 4: llama-server's
 * /completion, and with bit 5 too its /infill; bit 5 alone: /rerank, whose
 * prompts come from the Qwen server's rerank template, or from the stories
 * server's vocabulary without one); the rest is the body.
 *
 * Checked beyond "no crash, no leak, no sanitizer report": a refusal has a
 * 4xx/5xx status and a message; an accepted job has a non-empty prompt of ids
 * in the vocabulary that fits the context with its max_tokens, 1..16 choices
 * and stop strings within the documented limits. An accepted /v1/responses or
 * /v1/messages job is also answered, from made-up output (the body's last
 * bytes, split in two tokens' text: any bytes a model may write), and the
 * answer must be a JSON response object / message; a count is a JSON object
 * with input_tokens. An accepted rerank has one prompt a document, each of
 * 1..n_ctx ids in the vocabulary, and is answered from made-up scores. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "jinja.h"
#include "srv_internal.h"

#ifndef KVLLM_SRC
#define KVLLM_SRC "."
#endif

static srv S[2];
static gguf_file *files[2];

/* sampler.c is linked for sampler_params_default; its softmax comes from the
 * kernels, which parsing never reaches. */
float kern_attn_softmax(int64_t n, float *s, float *l) {
    (void)n, (void)s, (void)l;
    abort();
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (p) p[n] = 0;
    fclose(f);
    return p;
}

static void setup(srv *s, int i, const char *model) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", KVLLM_SRC, model);
    kvl_error err = {{0}};
    files[i] = gguf_open(path, &err);
    tok_vocab *v = files[i] ? tok_vocab_create(files[i], &err) : NULL;
    if (!v) {
        fprintf(stderr, "fuzz_request: %s: %s\n", path, err.msg);
        abort();
    }
    s->cfg.model_id = "fuzz";
    s->cfg.max_body_bytes = 8u << 20;
    s->vocab = v;
    s->n_ctx = 256;
    s->n_blocks = 8;
    s->block_size = 16;
    s->max_seqs = 4;
    s->chat = CHAT_TMPL_CHATML;
    s->bos_text = tok_bos(v) >= 0 ? tok_piece(v, tok_bos(v)) : "";
    s->eos_text = tok_eos(v) >= 0 ? tok_piece(v, tok_eos(v)) : "";
    pthread_mutex_init(&s->tok_mu, NULL);
    s->cfg.responses_store = 4; /* answered /v1/responses requests are kept */
    /* two LoRA adapters, the second one named for requests' "model" (srv_lora.c) */
    pthread_mutex_init(&s->lora_mu, NULL);
    s->n_lora = 2;
    s->lora_scale[0] = 0.5f;
    s->cfg.lora_names[1] = "tuned";
    s->responses = rstore_new(s->cfg.responses_store);
}

static void load(void) {
    setup(&S[0], 0, "models/stories260K.gguf");
    setup(&S[1], 1, "tests/data/tokenizer/ggml-vocab-qwen3.gguf");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/chat-templates/Qwen-Qwen3-0.6B.jinja", KVLLM_SRC);
    char *src = slurp(path), err[256];
    S[1].jinja = src ? jinja_template_create(src, strlen(src), err, sizeof err) : NULL;
    free(src);
    /* Qwen3-Reranker's rerank template, as llama.cpp's converter writes it */
    S[1].cfg.rerank_template =
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
        "and the Instruct provided. Note that the answer can only be \"yes\" or "
        "\"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve "
        "relevant passages that answer the query\n<Query>: {query}\n<Document>: "
        "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    if (!S[1].jinja) {
        fprintf(stderr, "fuzz_request: %s does not load\n", path);
        abort();
    }
}

/* Loading happens once, before the first input and outside its time limit. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    load();
    return 0;
}

/* Two events (a token's text, then the last with the finish) from the tail
 * of the input; the answer must parse as a response object. */
static void answer(srv *s, const api_req *r, const char *p, size_t len, bool messages) {
    const size_t n = len < 48 ? len : 48, a = n / 2;
    srv_event *ev[2];
    for (int i = 0; i < 2; i++) {
        const size_t tl = i ? n - a : a;
        ev[i] = calloc(1, sizeof *ev[i] + tl + 1);
        if (!ev[i]) abort();
        ev[i]->token = -1;
        ev[i]->text_len = tl;
        memcpy(ev[i]->text, p + len - n + (i ? a : 0), tl);
    }
    ev[0]->next = ev[1];
    ev[1]->finish = (p[len - 1] & 1) ? ENGINE_FINISH_LENGTH : ENGINE_FINISH_STOP;
    ev[1]->stats.stop_index = -1;
    api_error err = {0};
    char *js = messages ? anthropic_response(s, r, ev[0], &err) : responses_response(s, r, ev[0]);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    const char *obj = cJSON_GetStringValue(cJSON_GetObjectItem(o, messages ? "type" : "object"));
    if (!obj || strcmp(obj, messages ? "message" : "response") ||
        !cJSON_IsArray(cJSON_GetObjectItem(o, messages ? "content" : "output")))
        abort();
    cJSON_Delete(o);
    free(js);
    free(ev[0]);
    free(ev[1]);
}

/* llama-server's /completion answer from one final event: an object (in an
 * array for n > 1) whose content, if not left out by response_fields, is a
 * string. */
static void answer_llama(srv *s, const api_req *r, const char *p, size_t len) {
    srv_event *ev = calloc(1, sizeof *ev + len + 1);
    if (!ev) abort();
    ev->token = -1;
    ev->text_len = len < 48 ? len : 48;
    memcpy(ev->text, p, ev->text_len);
    ev->finish = (p[0] & 1) ? ENGINE_FINISH_LENGTH : ENGINE_FINISH_STOP;
    ev->stats.stop_index = r->job->n_stop && (p[0] & 2) ? 0 : -1;
    char *js = llama_response(s, r, ev);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    const cJSON *one = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, 0) : o;
    const cJSON *content = cJSON_GetObjectItem(one, "content"); /* response_fields may omit it */
    if (!cJSON_IsObject(one) || (content && !cJSON_IsString(content))) abort();
    cJSON_Delete(o);
    free(js);
    free(ev);
}

/* /rerank: parsed as srv_rerank parses it, answered from scores made of the body's bytes. */
static void rerank(srv *s, const char *p, size_t len) {
    api_error err = {0};
    rerank_req rj;
    cJSON *body = json_parse_body(p, len, &err);
    if (!body) return;
    if (!cJSON_IsObject(body) || !rerank_parse(s, body, &rj, &err)) {
        if (cJSON_IsObject(body) && (err.status < 400 || err.status > 599 || !err.msg[0])) abort();
        if (cJSON_IsObject(body)) rerank_req_free(&rj);
        cJSON_Delete(body);
        return;
    }
    if (rj.n_docs < 1 || rj.n_docs != cJSON_GetArraySize(rj.docs) || rj.top_n < 0) abort();
    for (int i = 0; i < rj.n_docs; i++) {
        if (rj.n_ids[i] < 1 || rj.n_ids[i] > s->n_ctx) abort();
        for (int64_t k = 0; k < rj.n_ids[i]; k++)
            if (rj.ids[i][k] < 0 || rj.ids[i][k] >= tok_n_vocab(s->vocab)) abort();
        rj.score[i] = (float)(unsigned char)p[(size_t)i % len] / 255.0f;
    }
    char *js = rerank_answer(s, body, &rj);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    const cJSON *res = cJSON_IsArray(o) ? o : cJSON_GetObjectItem(o, "results");
    if (!js || !cJSON_IsArray(res) || cJSON_GetArraySize(res) > rj.n_docs) abort();
    cJSON_Delete(o);
    free(js);
    rerank_req_free(&rj);
    cJSON_Delete(body);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1) return 0;
    srv *s = &S[data[0] & 1];
    const bool chat = data[0] & 2;
    const int api = (data[0] >> 2) & 3;            /* 1 responses, 2 messages, 3 count_tokens */
    const bool llama = api == 0 && (data[0] & 16); /* llama-server's /completion */
    const bool infill = llama && (data[0] & 32);   /* its /infill */
    const char *p = (const char *)data + 1;
    const size_t len = size - 1;
    api_req r;
    api_error err = {0};
    bool ok = false;
    if (api == 0 && !llama && (data[0] & 32)) {
        rerank(s, p, len);
        return 0;
    }
    if (api == 3) { /* count_tokens parses the body itself */
        char *js = anthropic_count_tokens(s, p, len, &err);
        cJSON *o = js ? cJSON_Parse(js) : NULL;
        if (js && !cJSON_IsNumber(cJSON_GetObjectItem(o, "input_tokens"))) abort();
        if (!js && (err.status < 400 || err.status > 599 || !err.msg[0])) abort();
        cJSON_Delete(o);
        free(js);
        return 0;
    }
    cJSON *body = json_parse_body(p, len, &err);
    if (body)
        ok = infill     ? llama_infill_parse(s, body, &r, &err)
             : llama    ? llama_parse(s, body, &r, &err)
             : api == 1 ? responses_parse(s, body, "", &r, &err)
             : api == 2 ? anthropic_parse(s, body, &r, &err)
                        : openai_parse(s, body, chat, &r, &err);
    cJSON_Delete(body);
    if (!ok) {
        if (err.status && (err.status < 400 || err.status > 599 || !err.msg[0])) abort();
        return 0;
    }
    const srv_job *j = r.job;
    if (!j || j->n_prompt <= 0 || j->n < 1 || j->n > SRV_MAX_N || (j->max_tokens < 1 && !r.echo) ||
        j->n_prompt + j->max_tokens > s->n_ctx || j->n_stop < 0 || j->n_stop > ENGINE_MAX_STOP)
        abort();
    if (j->n_prompts < 1 || j->n_prompts * j->per_prompt != j->n) abort();
    for (int k = 0; k < j->n_prompts; k++) { /* every prompt of a batch */
        int64_t n;
        const int32_t *ids = job_prompt(j, k, &n);
        if (n <= 0 || (j->max_tokens > 0 && n + j->max_tokens > s->n_ctx)) abort();
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tok_n_vocab(s->vocab)) abort();
    }
    for (int i = 0; i < j->n_stop; i++)
        if (strlen(j->stop[i]) > ENGINE_MAX_STOP_BYTES) abort();
    for (int i = 0; i < j->n_logit_bias; i++)
        if (j->logit_bias[i].token < 0 || j->logit_bias[i].token >= tok_n_vocab(s->vocab) ||
            isnan(j->logit_bias[i].bias))
            abort();
    if (api) answer(s, &r, p, len, api == 2);
    if (llama) answer_llama(s, &r, p, len);
    api_req_free(&r);
    return 0;
}
