/* srv_rstore: the /v1/responses answers kept in memory (store: true, the
 * Responses API's default), so that a later request can continue one
 * (previous_response_id) and GET / DELETE /v1/responses/{id} can read or drop
 * it: the last `cap` of them, oldest dropped first, each visible only to the
 * tenant (API key) that made it. A kept response is its conversation as chat
 * messages (what it continued, its input and its answer; not its
 * instructions, which a continuation does not inherit) and its response
 * object as sent. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

typedef struct rentry {
    char id[40];
    char *tenant;
    cJSON *conversation;
    cJSON *input; /* the request's input items, as GET .../input_items lists them */
    char *response;
    uint64_t seq; /* insertion order: the smallest is dropped first */
} rentry;

struct rstore {
    pthread_mutex_t mu;
    int cap, n;
    uint64_t next_seq;
    rentry *e;
};

rstore *rstore_new(int cap) {
    if (cap <= 0) return NULL;
    rstore *r = calloc(1, sizeof *r);
    if (!r || !(r->e = calloc((size_t)cap, sizeof *r->e))) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->cap = cap;
    return r;
}

static void entry_clear(rentry *e) {
    free(e->tenant);
    cJSON_Delete(e->conversation);
    cJSON_Delete(e->input);
    free(e->response);
    memset(e, 0, sizeof *e);
}

void rstore_free(rstore *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) entry_clear(&r->e[i]);
    pthread_mutex_destroy(&r->mu);
    free(r->e);
    free(r);
}

/* Under mu: the entry of id for tenant, or NULL. */
static rentry *find(rstore *r, const char *tenant, const char *id) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->e[i].id, id) && !strcmp(r->e[i].tenant, tenant)) return &r->e[i];
    return NULL;
}

bool rstore_put(rstore *r, const char *tenant, const char *id, cJSON *conversation, cJSON *input,
                char *response) {
    char *t = strdup(tenant);
    if (!r || !t || strlen(id) >= sizeof r->e[0].id) {
        free(t);
        cJSON_Delete(conversation);
        cJSON_Delete(input);
        free(response);
        return false;
    }
    pthread_mutex_lock(&r->mu);
    rentry *e;
    if (r->n < r->cap) {
        e = &r->e[r->n++];
    } else { /* full: the oldest goes */
        e = &r->e[0];
        for (int i = 1; i < r->n; i++)
            if (r->e[i].seq < e->seq) e = &r->e[i];
    }
    entry_clear(e);
    snprintf(e->id, sizeof e->id, "%s", id);
    e->tenant = t;
    e->conversation = conversation;
    e->input = input;
    e->response = response;
    e->seq = ++r->next_seq;
    pthread_mutex_unlock(&r->mu);
    return true;
}

/* A copy of what copy takes from the entry of id for tenant, or NULL. */
static void *copy_of(rstore *r, const char *tenant, const char *id,
                     void *(*copy)(const rentry *e)) {
    if (!r) return NULL;
    pthread_mutex_lock(&r->mu);
    rentry *e = find(r, tenant, id);
    void *c = e ? copy(e) : NULL;
    pthread_mutex_unlock(&r->mu);
    return c;
}

static void *conversation_copy(const rentry *e) { return cJSON_Duplicate(e->conversation, true); }
static void *response_copy(const rentry *e) { return strdup(e->response); }
static void *input_copy(const rentry *e) { return cJSON_Duplicate(e->input, true); }

cJSON *rstore_conversation(rstore *r, const char *tenant, const char *id) {
    return copy_of(r, tenant, id, conversation_copy);
}

char *rstore_response(rstore *r, const char *tenant, const char *id) {
    return copy_of(r, tenant, id, response_copy);
}

cJSON *rstore_input(rstore *r, const char *tenant, const char *id) {
    return copy_of(r, tenant, id, input_copy);
}

char *rstore_input_list(rstore *r, const char *tenant, const char *id, const char *order,
                        const char *limit, const char *after, api_error *err) {
    const bool asc = order && !strcmp(order, "asc");
    if (order && !asc && strcmp(order, "desc")) {
        api_fail(err, 400, "order", "'order' must be \"asc\" or \"desc\"");
        return NULL;
    }
    char *end = NULL;
    long n = limit ? strtol(limit, &end, 10) : 20;
    if (limit && (*end || n < 1 || n > 100)) {
        api_fail(err, 400, "limit", "'limit' must be an integer from 1 to 100");
        return NULL;
    }
    cJSON *items = rstore_input(r, tenant, id);
    if (!items) {
        api_fail(err, 404, NULL, "no kept response '%.60s'", id);
        return NULL;
    }
    const int count = cJSON_GetArraySize(items);
    int at = 0; /* position in the listing order */
    if (after) {
        while (at < count && strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(
                                        cJSON_GetArrayItem(items, asc ? at : count - 1 - at), "id"))
                                        ?: "",
                                    after))
            at++;
        if (at == count) {
            cJSON_Delete(items);
            api_fail(err, 400, "after", "no input item '%.60s' in response '%.60s'", after, id);
            return NULL;
        }
        at++;
    }
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", data);
    for (int k = at; k < count && k - at < n; k++)
        cJSON_AddItemToArray(
            data, cJSON_Duplicate(cJSON_GetArrayItem(items, asc ? k : count - 1 - k), true));
    const cJSON *first = data->child,
                *last = cJSON_GetArrayItem(data, cJSON_GetArraySize(data) - 1);
    cJSON_AddItemToObject(o, "first_id",
                          first ? cJSON_Duplicate(cJSON_GetObjectItem(first, "id"), false)
                                : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "last_id",
                          last ? cJSON_Duplicate(cJSON_GetObjectItem(last, "id"), false)
                               : cJSON_CreateNull());
    cJSON_AddBoolToObject(o, "has_more", at + n < count);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(items);
    if (!js) api_fail(err, 500, NULL, "out of memory");
    return js;
}

bool rstore_delete(rstore *r, const char *tenant, const char *id) {
    if (!r) return false;
    pthread_mutex_lock(&r->mu);
    rentry *e = find(r, tenant, id);
    if (e) {
        entry_clear(e);
        *e = r->e[--r->n]; /* the last one fills the hole */
        memset(&r->e[r->n], 0, sizeof r->e[r->n]);
    }
    pthread_mutex_unlock(&r->mu);
    return e != NULL;
}
