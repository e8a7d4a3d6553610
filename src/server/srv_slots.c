/* llama-server's slot actions, POST /slots/{id}?action=save|restore|erase
 * (its --slot-save-path), over kvllm's prefix cache.
 *
 * llama-server keeps each slot's last prompt and generation in that slot's
 * KV cells; save writes them to a file, restore reads one back into the slot,
 * erase clears it. kvllm runs requests on the engine's sequences, with one
 * paged pool and a prefix cache shared by all, so a slot here is a number a
 * request takes while it runs (the first idle one of max_seqs) and the ids it
 * leaves behind. save writes the full blocks of those ids (found in the
 * prefix cache, or computed again when evicted) and the ids themselves to a
 * slot file (kv_disk.h's prefix files: model identity, checksums); restore
 * puts a file's blocks back in the prefix cache, so that any request starting
 * with those ids, on any slot, skips their prefill, also after a restart;
 * erase forgets the slot's ids (the cache's blocks stay while they serve
 * others, as every cached block does). The tokens after the last full block
 * (fewer than --block-size) are recomputed by the next request: n_saved and
 * n_restored count the tokens whose KV the file holds.
 *
 * An action on a slot whose request is still running waits for it to end,
 * as llama-server defers it. With per-tenant keys a slot's ids belong to the
 * tenant whose request left them: another tenant's save or erase is a 403,
 * and a restore puts blocks under the chain they were computed under, which
 * only the saving tenant's requests reach. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

/* ------------------------------------------------------ engine thread -- */

static bool slots_ready(srv *s) {
    if (s->slots) return true;
    s->slots = calloc((size_t)s->max_seqs, sizeof *s->slots);
    for (int i = 0; s->slots && i < s->max_seqs; i++) s->slots[i].holder = -1;
    return s->slots != NULL;
}

int slot_take(srv *s, int64_t engine_id, int want) {
    if (!slots_ready(s)) return -1;
    if (want >= 0 && want < s->max_seqs && s->slots[want].holder < 0) {
        s->slots[want].holder = engine_id;
        return want;
    }
    for (int i = 0; i < s->max_seqs; i++)
        if (s->slots[i].holder < 0) {
            s->slots[i].holder = engine_id;
            return i;
        }
    return -1; /* more requests than slots: queued ones take none */
}

static void slot_clear(srv_slot *sl) {
    free(sl->tokens);
    free(sl->salt);
    const int64_t holder = sl->holder;
    memset(sl, 0, sizeof *sl);
    sl->holder = holder;
}

void slot_finish(srv *s, srv_choice *c) {
    if (c->slot < 0 || !s->slots) return;
    srv_slot *sl = &s->slots[c->slot];
    const srv_job *j = c->job;
    int64_t np = 0;
    const int32_t *prompt = job_prompt(j, c->index / j->per_prompt, &np);
    /* the last id generated was sampled, never fed back: the cache holds the rest */
    const int64_t ng = c->n_gen > 0 ? c->n_gen - 1 : 0;
    slot_clear(sl);
    sl->holder = -1;
    c->slot = -1;
    sl->tokens = malloc((size_t)(np + ng) * sizeof *sl->tokens);
    sl->salt = j->cache_salt ? strdup(j->cache_salt) : NULL;
    if (!sl->tokens || (j->cache_salt && !sl->salt)) { /* out of memory: the slot forgets */
        slot_clear(sl);
        return;
    }
    memcpy(sl->tokens, prompt, (size_t)np * sizeof *sl->tokens);
    if (ng) memcpy(sl->tokens + np, c->gen, (size_t)ng * sizeof *sl->tokens);
    sl->n_tokens = np + ng;
    sl->has_lora = j->n_lora > 0;
    if (sl->has_lora) memcpy(sl->lora, j->lora, sizeof sl->lora);
}

void slots_free(srv *s) {
    for (int i = 0; s->slots && i < s->max_seqs; i++) slot_clear(&s->slots[i]);
    free(s->slots);
    s->slots = NULL;
}

/* ----------------------------------------------------------- actions -- */

typedef enum { SLOT_SAVE, SLOT_RESTORE, SLOT_ERASE } slot_verb;

typedef struct slot_task {
    srv_engine_task task;
    slot_verb verb;
    int id;
    const char *path;   /* save, restore: the file */
    const char *tenant; /* the requester's namespace prefix ("ns:"), NULL: no tenants */
    int64_t n_tokens;   /* the answer's count */
    uint64_t bytes;
    double ms;
    bool waited; /* deferred at least once */
} slot_task;

/* Whether the slot's ids may be acted on by the requester's tenant. */
static bool tenant_owns(const slot_task *t, const srv_slot *sl) {
    if (!t->tenant || sl->n_tokens == 0) return true;
    return sl->salt && strncmp(sl->salt, t->tenant, strlen(t->tenant)) == 0;
}

/* err's message with the file's path cut to its name: the server's
 * directories are not the client's business. */
static void only_filename(kvl_error *e, const char *path) {
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (name == path) return;
    for (char *at; (at = strstr(e->msg, path));)
        memmove(at, at + (name - path), strlen(at + (name - path)) + 1);
}

static bool run_slot_task(srv *s, srv_engine_task *task, api_error *err) {
    slot_task *t = (slot_task *)task;
    if (!slots_ready(s)) return api_fail(err, 500, NULL, "out of memory");
    srv_slot *sl = &s->slots[t->id];
    if (sl->holder >= 0) { /* its request is running: after it ends, as llama-server defers */
        if (!t->waited)
            kvl_log(KVL_LOG_INFO, "slot %d is busy: its action waits for its request", t->id);
        t->waited = task->defer = true;
        return true;
    }
    if (t->verb != SLOT_RESTORE && !tenant_owns(t, sl))
        return api_fail(err, 403, NULL, "slot %d holds another tenant's request", t->id);
    const double t0 = kvl_time_s();
    kvl_error kerr = {{0}};
    if (t->verb == SLOT_ERASE) {
        t->n_tokens = sl->n_tokens;
        slot_clear(sl);
    } else if (t->verb == SLOT_SAVE) {
        if (sl->n_tokens == 0)
            return api_fail(err, 400, NULL, "slot %d holds nothing to save", t->id);
        t->n_tokens = engine_kv_export(
            s->e, sl->tokens, sl->n_tokens, sl->salt, sl->has_lora ? sl->lora : NULL,
            sl->restored ? sl->chain_root : 0, t->path, s->cfg.slot_model_id, &t->bytes, &kerr);
        if (t->n_tokens < 0) {
            only_filename(&kerr, t->path);
            return api_fail(err, 400, NULL, "saving slot %d: %s", t->id, kerr.msg);
        }
    } else {
        int32_t *ids = NULL;
        int64_t n = 0;
        uint64_t root = 0;
        t->n_tokens = engine_kv_import(s->e, t->path, s->cfg.slot_model_id, &ids, &n, &root,
                                       &t->bytes, &kerr);
        if (t->n_tokens < 0) {
            only_filename(&kerr, t->path);
            return api_fail(err, 400, NULL, "Unable to restore slot %d: %s", t->id, kerr.msg);
        }
        slot_clear(sl);
        sl->tokens = ids;
        sl->n_tokens = n;
        sl->restored = true;
        sl->chain_root = root;
        /* the restoring tenant owns the ids now (its namespace marks them) */
        sl->salt = t->tenant ? strdup(t->tenant) : NULL;
    }
    t->ms = (kvl_time_s() - t0) * 1e3;
    return true;
}

/* llama-server's fs_validate_filename, as far as a name in one directory
 * goes: no separators or characters Windows reserves, no control
 * characters, not "." or "..", no leading or trailing space, no trailing dot,
 * at most 255 bytes of UTF-8. */
static bool valid_filename(const char *f) {
    const size_t n = strlen(f);
    if (n == 0 || n > 255 || strcmp(f, ".") == 0 || strcmp(f, "..") == 0) return false;
    if (f[0] == ' ' || f[n - 1] == ' ' || f[n - 1] == '.') return false;
    for (const unsigned char *p = (const unsigned char *)f; *p; p++)
        if (*p < 0x20 || *p == 0x7f || strchr("/\\:*?\"<>|", *p)) return false;
    return utf8_valid(f, n);
}

/* The id in ".../slots/{id}"; -1 when it is not a number. */
static int slot_id(const char *url) {
    const char *p = strrchr(url, '/');
    if (!p || !p[1]) return -1;
    char *end;
    errno = 0;
    const long v = strtol(p + 1, &end, 10);
    return *end || errno || v < 0 || v > 1000000 ? -1 : (int)v;
}

char *srv_slot_action(srv *s, const char *url, const char *action, const char *body, size_t len,
                      const srv_key *key, api_error *err) {
    if (!s->cfg.slot_save_path) {
        api_fail(err, 501, NULL,
                 "This server does not support slots action. Start it with `--slot-save-path`");
        err->type = "not_supported_error";
        return NULL;
    }
    const int id = slot_id(url);
    slot_verb verb;
    if (!action) action = "";
    if (strcmp(action, "save") == 0) verb = SLOT_SAVE;
    else if (strcmp(action, "restore") == 0) verb = SLOT_RESTORE;
    else if (strcmp(action, "erase") == 0) verb = SLOT_ERASE;
    else {
        api_fail(err, 400, "action", "Invalid action '%s': save, restore or erase", action);
        return NULL;
    }
    if (id < 0 || id >= s->max_seqs) {
        api_fail(err, 400, NULL, "Invalid slot ID: slots are 0 to %d (--parallel)",
                 s->max_seqs - 1);
        return NULL;
    }
    char *path = NULL, *filename = NULL, *tenant = NULL, *out = NULL;
    bool oom = false;
    if (verb != SLOT_ERASE) {
        cJSON *b = json_parse_body(body ? body : "", len, err);
        if (!b) return NULL;
        static const char *const NAMES[] = {"filename"};
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(b, "filename");
        bool ok =
            (cJSON_IsObject(b) ||
             api_fail(err, 400, NULL, "the request body must be a JSON object")) &&
            srv_only_fields(b, NAMES, 1, "/slots", err) &&
            (cJSON_IsString(f) || api_fail(err, 400, "filename", "'filename' must be a string")) &&
            (valid_filename(f->valuestring) ||
             api_fail(err, 400, "filename", "Invalid filename '%s': one name in --slot-save-path",
                      f->valuestring));
        if (ok && (!(filename = strdup(f->valuestring)) ||
                   asprintf(&path, "%s/%s", s->cfg.slot_save_path, filename) < 0)) {
            path = NULL;
            api_fail(err, 500, NULL, "out of memory");
        }
        cJSON_Delete(b);
        if (!path) {
            free(filename);
            return NULL;
        }
    }
    tenant = tenant_salt(s, key, NULL, &oom);
    slot_task t = {
        .task.run = run_slot_task, .verb = verb, .id = id, .path = path, .tenant = tenant};
    if (oom) api_fail(err, 500, NULL, "out of memory");
    else if (srv_engine_call(s, &t.task, err)) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id_slot", id);
        if (verb == SLOT_ERASE) {
            cJSON_AddNumberToObject(o, "n_erased", (double)t.n_tokens);
        } else {
            const bool save = verb == SLOT_SAVE;
            cJSON_AddStringToObject(o, "filename", filename);
            cJSON_AddNumberToObject(o, save ? "n_saved" : "n_restored", (double)t.n_tokens);
            cJSON_AddNumberToObject(o, save ? "n_written" : "n_read", (double)t.bytes);
            cJSON *tm = cJSON_AddObjectToObject(o, "timings");
            cJSON_AddNumberToObject(tm, save ? "save_ms" : "restore_ms", t.ms);
        }
        out = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!out) api_fail(err, 500, NULL, "out of memory");
    }
    free(tenant);
    free(filename);
    free(path);
    return out;
}
