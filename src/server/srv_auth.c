/* API keys and tenants: --api-key and --api-key-file, and the prefix-cache
 * namespace of each tenant.
 *
 * Every key is a tenant; keys that name the same tenant in the file share it.
 * Unless --prefix-cache-shared is given, a request's cache salt is prefixed
 * with its tenant's namespace, a hash of the tenant's name (or of the key), so
 * one tenant can never hit, and so never detect through cached_tokens, timing
 * or the hit counters, another tenant's cached prompt blocks. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "srv_internal.h"

/* FNV-1a, 64 bit: the namespace only has to differ between tenants, and it
 * never leaves the process. */
static uint64_t fnv1a(const char *tag, const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = tag; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    for (const char *p = s; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

static bool add_key(srv *s, const char *key, const char *tenant) {
    for (int i = 0; i < s->n_keys; i++)
        if (strcmp(s->keys[i].key, key) == 0) {
            fprintf(stderr, "kvllm serve: API key listed twice (tenant '%s')\n",
                    tenant ? tenant : "-");
            return false;
        }
    srv_key *k = realloc(s->keys, (size_t)(s->n_keys + 1) * sizeof *k);
    if (!k) return false;
    s->keys = k;
    k = &s->keys[s->n_keys];
    memset(k, 0, sizeof *k);
    k->key = strdup(key);
    k->tenant = tenant ? strdup(tenant) : NULL;
    if (!k->key || (tenant && !k->tenant)) {
        free(k->key);
        free(k->tenant);
        return false;
    }
    snprintf(k->ns, sizeof k->ns, "%016llx",
             (unsigned long long)(tenant ? fnv1a("tenant\x1f", tenant) : fnv1a("key\x1f", key)));
    s->n_keys++;
    return true;
}

/* "KEY [TENANT]" per line; blank lines and lines starting with '#' skipped. */
static bool load_file(srv *s, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvllm serve: --api-key-file %s: cannot open\n", path);
        return false;
    }
    char line[4096];
    int ln = 0;
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        ln++;
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            fprintf(stderr, "kvllm serve: %s:%d: line longer than %zu bytes\n", path, ln,
                    sizeof line - 2);
            ok = false;
            break;
        }
        char *save = NULL, *key = strtok_r(line, " \t\r\n", &save);
        if (!key || key[0] == '#') continue;
        char *tenant = strtok_r(NULL, " \t\r\n", &save);
        if (strtok_r(NULL, " \t\r\n", &save)) {
            fprintf(stderr, "kvllm serve: %s:%d: expected 'KEY [TENANT]'\n", path, ln);
            ok = false;
            break;
        }
        ok = add_key(s, key, tenant);
    }
    fclose(f);
    if (ok && s->n_keys == 0) {
        fprintf(stderr, "kvllm serve: --api-key-file %s: no keys\n", path);
        ok = false;
    }
    return ok;
}

/* --api-key: one key, or several separated by commas (llama-server's form);
 * each its own tenant, as each line of a key file without a tenant name. */
static bool add_key_list(srv *s, const char *list) {
    char *copy = strdup(list), *save = NULL;
    bool ok = copy != NULL, any = false;
    for (char *k = copy ? strtok_r(copy, ",", &save) : NULL; ok && k;
         k = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*k)) k++;
        for (char *e = k + strlen(k); e > k && isspace((unsigned char)e[-1]);) *--e = 0;
        if (!*k) continue;
        ok = add_key(s, k, NULL);
        any = true;
    }
    free(copy);
    if (ok && !any) fprintf(stderr, "kvllm serve: --api-key: no key in '%s'\n", list);
    return ok && any;
}

bool keys_load(srv *s) {
    if (s->cfg.api_key && !add_key_list(s, s->cfg.api_key)) return false;
    if (s->cfg.api_key_file && !load_file(s, s->cfg.api_key_file)) return false;
    return true;
}

void keys_free(srv *s) {
    for (int i = 0; i < s->n_keys; i++) {
        free(s->keys[i].key);
        free(s->keys[i].tenant);
    }
    free(s->keys);
    s->keys = NULL;
    s->n_keys = 0;
}

const srv_key *keys_match(const srv *s, const char *h) {
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ') h++;
    return keys_match_key(s, h);
}

const srv_key *keys_match_key(const srv *s, const char *h) {
    if (!h) return NULL;
    /* Every key is compared, so the time does not say which one came close. */
    const srv_key *found = NULL;
    for (int i = 0; i < s->n_keys; i++)
        if (secret_equal(h, s->keys[i].key)) found = &s->keys[i];
    return found;
}

char *tenant_salt(const srv *s, const srv_key *k, const char *salt, bool *oom) {
    *oom = false;
    if (!k || s->cfg.prefix_cache_shared) {
        if (!salt) return NULL;
        char *c = strdup(salt);
        *oom = !c;
        return c;
    }
    /* The namespace has a fixed length, so "ns:salt" is unambiguous. */
    size_t n = strlen(k->ns) + 1 + (salt ? strlen(salt) : 0) + 1;
    char *c = malloc(n);
    if (!c) {
        *oom = true;
        return NULL;
    }
    snprintf(c, n, "%s:%s", k->ns, salt ? salt : "");
    return c;
}
