/* srv_chunks: the chat answer's SSE chunks (openai_stream_events) read back,
 * for the endpoints that answer on the chat path in another API's shape
 * (srv_responses_out.c, srv_anthropic_out.c): each chunk's parts go to a
 * sink in the order the chunk has them. One parser of our own output, so the
 * two converters see the same things the chat clients see. */
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

static const char *str_of(const cJSON *o, const char *k) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* One choice of a chunk: reasoning, then content (with the token's logprobs;
 * "" with logprobs when the parser held the token's text back), then the
 * calls it starts or continues. */
static void choice(const cJSON *ch, const chunk_sink *k) {
    const cJSON *d = cJSON_GetObjectItem(ch, "delta");
    const cJSON *lps = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "logprobs"), "content");
    const char *reasoning = str_of(d, "reasoning_content"), *content = str_of(d, "content");
    const bool has_reasoning = reasoning && reasoning[0];
    if (has_reasoning) k->reasoning(k->ctx, reasoning);
    if (content && content[0]) k->content(k->ctx, content, lps);
    else if (lps && !has_reasoning) k->content(k->ctx, "", lps);
    const cJSON *calls = cJSON_GetObjectItem(d, "tool_calls");
    for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
        const cJSON *fn = cJSON_GetObjectItem(c, "function");
        const char *id = str_of(c, "id"), *args = str_of(fn, "arguments");
        if (id) k->call(k->ctx, id, str_of(fn, "name"));
        else if (args && args[0]) k->call_args(k->ctx, args);
    }
}

bool chat_chunks_read(kvl_buf *sse, const chunk_sink *k, bool *ended) {
    bool ok = true;
    const char *p = sse->p ? sse->p : "", *end = p + sse->len;
    while (p < end && !*ended) {
        const char *nl = strstr(p, "\n\n");
        if (!nl) break;
        if (!strncmp(p, "data: ", 6)) {
            p += 6;
            if (!strncmp(p, "[DONE]", 6)) {
                *ended = true;
                k->end(k->ctx, NULL);
            } else {
                cJSON *c = cJSON_ParseWithLength(p, (size_t)(nl - p));
                const cJSON *e = cJSON_GetObjectItem(c, "error");
                if (!c) {
                    ok = false; /* our own JSON: only memory runs out */
                } else if (e) {
                    *ended = true;
                    k->end(k->ctx, str_of(e, "message") ? str_of(e, "message") : "failed");
                } else {
                    const cJSON *u = cJSON_GetObjectItem(c, "usage");
                    if (cJSON_IsObject(u)) {
                        cJSON_Delete(*k->usage);
                        *k->usage = cJSON_Duplicate(u, true);
                    }
                    const cJSON *chs = cJSON_GetObjectItem(c, "choices");
                    for (const cJSON *ch = chs ? chs->child : NULL; ch; ch = ch->next)
                        choice(ch, k);
                }
                cJSON_Delete(c);
            }
        }
        p = nl + 2;
    }
    sse->len = 0;
    return ok;
}

void sse_event(kvl_buf *out, const char *type, cJSON *ev, int64_t seq) {
    /* "type" (and the number) first, as both APIs write them */
    cJSON *head[2] = {cJSON_CreateString(type), seq >= 0 ? cJSON_CreateNumber((double)seq) : NULL};
    static const char *const keys[2] = {"type", "sequence_number"};
    for (int i = 1; i >= 0; i--) {
        if (!head[i]) continue;
        head[i]->string = strdup(keys[i]);
        if (ev->child) cJSON_InsertItemInArray(ev, 0, head[i]);
        else cJSON_AddItemToArray(ev, head[i]);
    }
    char *js = cJSON_PrintUnformatted(ev);
    cJSON_Delete(ev);
    if (!js) {
        out->oom = true;
        return;
    }
    kvl_buf_printf(out, "event: %s\ndata: %s\n\n", type, js);
    free(js);
}
