/* srv_lora_info: the LoRA adapters as the engine's model holds them, for
 * the server's start (their scales), GET /lora-adapters and /v1/models
 * (srv_lora.c has the request side). */
#include <string.h>

#include "srv_internal.h"

void srv_lora_init(srv *s) {
    pthread_mutex_init(&s->lora_mu, NULL);
    s->n_lora = model_lora_count(engine_model(s->e));
    for (int i = 0; i < s->n_lora; i++) {
        model_lora_info info;
        model_lora_get(engine_model(s->e), i, &info);
        s->lora_scale[i] = info.scale;
    }
}

void srv_lora_free(srv *s) { pthread_mutex_destroy(&s->lora_mu); }

char *srv_lora_list(srv *s) {
    cJSON *a = cJSON_CreateArray();
    const model *m = engine_model(s->e);
    pthread_mutex_lock(&s->lora_mu);
    for (int i = 0; i < s->n_lora; i++) {
        model_lora_info info;
        model_lora_get(m, i, &info);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddStringToObject(o, "path", info.path);
        cJSON_AddNumberToObject(o, "scale", s->lora_scale[i]);
        /* llama.cpp's members: the adapter's own metadata, "" when it has none */
        char text[1024];
        const gguf_file *f = model_lora_gguf(m, i);
        cJSON_AddStringToObject(
            o, "task_name",
            gguf_get_str_buf(f, "adapter.lora.task_name", text, sizeof text) ? text : "");
        cJSON_AddStringToObject(
            o, "prompt_prefix",
            gguf_get_str_buf(f, "adapter.lora.prompt_prefix", text, sizeof text) ? text : "");
        if (s->cfg.lora_names[i]) cJSON_AddStringToObject(o, "name", s->cfg.lora_names[i]);
        cJSON_AddNumberToObject(o, "alpha", info.alpha);
        cJSON_AddNumberToObject(o, "rank", (double)info.rank);
        cJSON_AddNumberToObject(o, "n_tensors", info.n_pairs);
        cJSON_AddItemToArray(a, o);
    }
    pthread_mutex_unlock(&s->lora_mu);
    char *out = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return out;
}

void srv_lora_models(const srv *s, cJSON *data, cJSON *(*object)(const srv *, const char *)) {
    for (int i = 0; i < s->n_lora; i++) {
        if (!s->cfg.lora_names[i]) continue;
        model_lora_info info;
        model_lora_get(engine_model(s->e), i, &info);
        cJSON *o = object(s, s->cfg.lora_names[i]);
        /* vLLM's adapter entries: the file, and the base model they adapt */
        cJSON_AddStringToObject(o, "root", info.path);
        cJSON_AddStringToObject(o, "parent", s->cfg.model_id);
        cJSON_AddItemToArray(data, o);
    }
}
