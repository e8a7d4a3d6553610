/* What the engine-level tests share: loading a model file (vocabulary and
 * weights) and collecting a request's tokens and text. */
#ifndef KVLLM_TEST_MODEL_H
#define KVLLM_TEST_MODEL_H

#include <stdio.h>
#include <string.h>

#include "engine.h"

/* Loads path's vocabulary into *v and its weights into the returned model,
 * sized for max_ctx positions and max_ubatch tokens a pass, the load taking
 * mem_available bytes as free (0: what the system says); NULL, with the
 * reason printed and nothing left open, when either fails. */
static inline model *load_test_model_mem(const char *path, int64_t max_ctx, int64_t max_ubatch,
                                         int64_t mem_available, tok_vocab **v) {
    kvl_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    *v = f ? tok_vocab_create(f, &err) : NULL;
    model_params mp = {
        .max_ctx = max_ctx, .max_ubatch = max_ubatch, .mem_available = mem_available};
    model *m = *v ? model_load(f, &mp, &err) : NULL; /* owns f from here on */
    if (m) return m;
    fprintf(stderr, "%s: %s\n", path, err.msg);
    if (*v) tok_vocab_destroy(*v);
    else gguf_close(f);
    *v = NULL;
    return NULL;
}

static inline model *load_test_model(const char *path, int64_t max_ctx, int64_t max_ubatch,
                                     tok_vocab **v) {
    return load_test_model_mem(path, max_ctx, max_ubatch, 0, v);
}

/* A request's output: its ids, its text and how it finished. */
typedef struct text_out {
    int32_t ids[512];
    int n;
    char text[4096];
    size_t len;
    engine_finish finish;
} text_out;

static inline void on_text_event(const engine_event *ev, void *user) {
    text_out *o = user;
    if (ev->token >= 0 && o->n < (int)(sizeof o->ids / sizeof o->ids[0]))
        o->ids[o->n++] = ev->token;
    if (ev->text_len && o->len + ev->text_len < sizeof o->text) {
        memcpy(o->text + o->len, ev->text, ev->text_len);
        o->len += ev->text_len;
    }
    if (ev->finish) o->finish = ev->finish;
}

/* load_test_model for the KV file tests (disk tier, prefix files): the model
 * and its identity in KV files (kv_disk_model_id); NULL with why printed. */
static inline model *load_test_model_id(const char *path, int64_t max_ctx, int64_t max_ubatch,
                                        tok_vocab **vocab, uint8_t id[16]) {
    model *m = load_test_model(path, max_ctx, max_ubatch, vocab);
    kvl_error err = {{0}};
    if (m && !kv_disk_model_id(path, id, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        model_destroy(m);
        tok_vocab_destroy(*vocab);
        return NULL;
    }
    return m;
}

/* Queues one greedy request of max_tokens (ignore_eos; salt: its cache salt,
 * NULL none) whose events go to on_event(user); false with why printed. */
static inline bool submit_greedy(engine *e, const int32_t *prompt, int64_t n, int64_t max_tokens,
                                 const char *salt, engine_event_fn on_event, void *user) {
    engine_request r = {.prompt = prompt,
                        .n_prompt = n,
                        .max_tokens = max_tokens,
                        .ignore_eos = true,
                        .cache_salt = salt,
                        .on_event = on_event,
                        .user = user};
    sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    kvl_error err;
    if (engine_submit(e, &r, &err) >= 0) return true;
    fprintf(stderr, "submit: %s\n", err.msg);
    return false;
}

/* Steps e until it has no work; false with why printed. */
static inline bool run_until_idle(engine *e) {
    kvl_error err;
    while (engine_has_work(e))
        if (!engine_step(e, &err)) {
            fprintf(stderr, "step: %s\n", err.msg);
            return false;
        }
    return true;
}

#endif
