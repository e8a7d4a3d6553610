/* hub: Hugging Face downloads (hub.h). libcurl moves the bytes (redirects to
 * the CDN, TLS, resumption), cJSON reads the API's answers, nettle computes
 * the checksums. */
#define _GNU_SOURCE
#include "hub.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <nettle/sha1.h>
#include <nettle/sha2.h>

#define HUB_PATH     4096
#define HUB_MAX_JSON ((size_t)64 << 20) /* an API answer larger than this is refused */
#define HUB_ATTEMPTS 3                  /* tries of one file's transfer, resuming each time */

/* ---- names the server sends: checked before they name a file ---- */

static bool is_word(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* llama.cpp's rule: [A-Za-z0-9_] runs joined by single '/', '.' or '-', one '/'. */
static bool valid_repo(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 256) return false;
    int slashes = 0;
    bool after_special = true;
    for (size_t i = 0; i < n; i++) {
        if (is_word(s[i])) after_special = false;
        else if (s[i] == '/' || s[i] == '.' || s[i] == '-') {
            if (after_special) return false;
            slashes += s[i] == '/';
            after_special = true;
        } else return false;
    }
    return !after_special && slashes == 1;
}

static bool is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return true;
}

/* A path inside the snapshot: relative, components neither empty, "." nor
 * "..", no backslashes or control characters. */
static bool valid_rel_path(const char *p) {
    size_t n = strlen(p);
    if (n == 0 || n > 1024 || p[0] == '/') return false;
    for (const char *c = p; *c;) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)c[i] < 0x20 || c[i] == '\\') return false;
        c += len + (e ? 1 : 0);
        if (e && !*c) return false; /* a trailing '/' */
    }
    return true;
}

/* snprintf into a path buffer: false when it does not fit. */
static bool fmt_path(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

/* ---- the cache directory ---- */

static bool cache_dir(char *out, size_t cap, kvl_error *err) {
    static const struct {
        const char *var, *sub;
    } where[] = {{"LLAMA_CACHE", ""},
                 {"HF_HUB_CACHE", ""},
                 {"HUGGINGFACE_HUB_CACHE", ""},
                 {"HF_HOME", "/hub"},
                 {"XDG_CACHE_HOME", "/huggingface/hub"},
                 {"HOME", "/.cache/huggingface/hub"}};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        const char *v = getenv(where[i].var);
        if (v && *v) {
            if ((size_t)snprintf(out, cap, "%s%s", v, where[i].sub) >= cap)
                return kvl_fail(err, "hub: $%s is too long", where[i].var);
            return true;
        }
    }
    return kvl_fail(err, "hub: no cache directory (set LLAMA_CACHE or HOME)");
}

/* mkdir -p of path's directories; the last component too when whole. */
static bool make_dirs(const char *path, bool whole, kvl_error *err) {
    char buf[HUB_PATH];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return kvl_fail(err, "hub: path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return kvl_fail(err, "hub: cannot create %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (whole && mkdir(buf, 0755) != 0 && errno != EEXIST)
        return kvl_fail(err, "hub: cannot create %s: %s", buf, strerror(errno));
    return true;
}

/* ---- HTTP ---- */

typedef struct http_ctx {
    const char *token;
    const char *accept; /* the JSON answers' Accept header (NULL: application/json) */
    char agent[64];
} http_ctx;

/* A transfer's context (token may be NULL) with kvllm's User-Agent, and
 * libcurl started: each entry that calls it ends with curl_global_cleanup. */
static bool http_begin(http_ctx *h, const char *token, kvl_error *err) {
    *h = (http_ctx){.token = token};
    snprintf(h->agent, sizeof h->agent, "kvllm/%s", KVLLM_VERSION);
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ||
           kvl_fail(err, "hub: cannot initialise libcurl");
}

typedef struct membuf {
    char *data;
    size_t len;
    bool too_big;
} membuf;

static size_t to_mem(char *p, size_t sz, size_t n, void *user) {
    membuf *b = user;
    const size_t add = sz * n;
    if (b->len + add > HUB_MAX_JSON) {
        b->too_big = true;
        return 0;
    }
    char *d = realloc(b->data, b->len + add + 1);
    if (!d) return 0;
    memcpy(d + b->len, p, add);
    b->data = d;
    b->len += add;
    d[b->len] = '\0';
    return add;
}

static struct curl_slist *headers(const http_ctx *h, bool json, const char *range) {
    struct curl_slist *l = NULL;
    char line[512];
    if (json && h->accept && strlen(h->accept) < 400) {
        snprintf(line, sizeof line, "Accept: %s", h->accept);
        l = curl_slist_append(l, line);
    } else if (json) {
        l = curl_slist_append(l, "Accept: application/json");
    }
    if (h->token && *h->token && strlen(h->token) < 400 && !strpbrk(h->token, "\r\n")) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", h->token);
        l = curl_slist_append(l, line);
    }
    if (range) l = curl_slist_append(l, range);
    return l;
}

static CURL *easy(const http_ctx *h, const char *url, struct curl_slist *hdr) {
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_USERAGENT, h->agent);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L); /* resolve/ answers with the CDN */
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    /* a stalled transfer ends (and is resumed) instead of hanging */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    return c;
}

/* The API's "error" field of a failed answer, or its start. */
static void error_text(const membuf *b, char *out, size_t cap) {
    out[0] = '\0';
    if (!b->data) return;
    cJSON *j = cJSON_Parse(b->data);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsString(e)) snprintf(out, cap, ": %s", e->valuestring);
    else snprintf(out, cap, ": %.160s", b->data);
    cJSON_Delete(j);
}

/* GET url as JSON. *unreachable: the request never got an HTTP answer. */
static cJSON *get_json(const http_ctx *h, const char *url, bool *unreachable, kvl_error *err) {
    membuf b = {0};
    struct curl_slist *hdr = headers(h, true, NULL);
    CURL *c = easy(h, url, hdr);
    cJSON *j = NULL;
    *unreachable = false;
    if (!c) {
        kvl_fail(err, "hub: cannot start a transfer");
        goto done;
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_mem);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    const CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK && !b.too_big) {
        *unreachable = status == 0;
        kvl_fail(err, "hub: GET %s: %s", url, curl_easy_strerror(rc));
    } else if (b.too_big) {
        kvl_fail(err, "hub: GET %s: the answer is larger than %zu MiB", url, HUB_MAX_JSON >> 20);
    } else if (status != 200) {
        char why[200];
        error_text(&b, why, sizeof why);
        kvl_fail(err, "hub: GET %s: HTTP %ld%s%s", url, status, why,
                 status == 401 || status == 403
                     ? " (a gated or private repository: set HF_TOKEN or --hf-token)"
                 : status == 404 ? " (no such repository or revision)"
                                 : "");
    } else if (!(j = cJSON_Parse(b.data ? b.data : ""))) {
        kvl_fail(err, "hub: GET %s: the answer is not JSON", url);
    }
done:
    if (c) curl_easy_cleanup(c);
    curl_slist_free_all(hdr);
    free(b.data);
    return j;
}

/* ---- the repository's files ---- */

typedef struct hub_file {
    char path[1100]; /* in the repository */
    char oid[65];    /* LFS SHA-256, or git's blob SHA-1, or "" */
    long long size;  /* -1: unknown */
} hub_file;

typedef struct listing {
    char commit[41];
    hub_file *files;
    int n;
} listing;

static bool add_file(listing *l, const char *path, const char *oid, long long size) {
    hub_file *f = realloc(l->files, (size_t)(l->n + 1) * sizeof *f);
    if (!f) return false;
    l->files = f;
    hub_file *x = &f[l->n++];
    snprintf(x->path, sizeof x->path, "%s", path);
    snprintf(x->oid, sizeof x->oid, "%s", oid ? oid : "");
    x->size = size;
    return true;
}

static bool list_online(const http_ctx *h, const char *endpoint, const char *repo, listing *l,
                        bool *unreachable, kvl_error *err) {
    char url[HUB_PATH];
    snprintf(url, sizeof url, "%sapi/models/%s/refs", endpoint, repo);
    cJSON *refs = get_json(h, url, unreachable, err);
    if (!refs) return false;
    const cJSON *branches = cJSON_GetObjectItemCaseSensitive(refs, "branches"), *b;
    l->commit[0] = '\0';
    cJSON_ArrayForEach(b, branches) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
        const cJSON *commit = cJSON_GetObjectItemCaseSensitive(b, "targetCommit");
        if (!cJSON_IsString(name) || !cJSON_IsString(commit) || !is_hex(commit->valuestring, 40))
            continue;
        if (!l->commit[0] || strcmp(name->valuestring, "main") == 0)
            snprintf(l->commit, sizeof l->commit, "%s", commit->valuestring);
        if (strcmp(name->valuestring, "main") == 0) break;
    }
    cJSON_Delete(refs);
    if (!l->commit[0])
        return kvl_fail(err, "hub: %s lists no branch with a valid commit (%s)", repo, url);
    snprintf(url, sizeof url, "%sapi/models/%s/tree/%s?recursive=true", endpoint, repo, l->commit);
    cJSON *tree = get_json(h, url, unreachable, err);
    if (!tree) return false;
    if (!cJSON_IsArray(tree)) {
        cJSON_Delete(tree);
        return kvl_fail(err, "hub: %s: the file list is not an array", url);
    }
    const cJSON *it;
    bool ok = true;
    cJSON_ArrayForEach(it, tree) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(it, "path");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "file") != 0 ||
            !cJSON_IsString(path))
            continue;
        if (!valid_rel_path(path->valuestring)) {
            kvl_log(KVL_LOG_WARN, "hub: %s: skipping the unsafe path '%.200s'", repo,
                    path->valuestring);
            continue;
        }
        const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(it, "lfs");
        const cJSON *oid = cJSON_GetObjectItemCaseSensitive(lfs ? lfs : it, "oid");
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(lfs ? lfs : it, "size");
        const char *o = cJSON_IsString(oid) ? oid->valuestring : "";
        if (*o && !is_hex(o, 64) && !is_hex(o, 40)) {
            kvl_log(KVL_LOG_WARN, "hub: %s: skipping '%s' (its oid is not a hash)", repo,
                    path->valuestring);
            continue;
        }
        if (!(ok = add_file(l, path->valuestring, o,
                            cJSON_IsNumber(size) ? (long long)size->valuedouble : -1)))
            break;
    }
    cJSON_Delete(tree);
    return ok ? true : kvl_fail(err, "hub: out of memory");
}

/* nftw passes no user pointer: the listing being filled (one at a time). */
static listing *walk_target;
static size_t walk_root_len;

static int walk_one(const char *fpath, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    if ((flag == FTW_F || flag == FTW_SL) && strlen(fpath) > walk_root_len + 1 &&
        !strstr(fpath, ".incomplete"))
        if (!add_file(walk_target, fpath + walk_root_len + 1, NULL, -1)) return 1;
    return 0;
}

/* The cached snapshot of the repository's branch (refs/main, else any ref). */
static bool list_cached(const char *repo_dir, const char *repo, listing *l, kvl_error *err) {
    char p[HUB_PATH];
    const char *refs[] = {"main", NULL};
    l->commit[0] = '\0';
    for (int i = 0; refs[i] && !l->commit[0]; i++) {
        FILE *f = fmt_path(p, sizeof p, "%s/refs/%s", repo_dir, refs[i]) ? fopen(p, "r") : NULL;
        char line[64] = "";
        if (f && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\r\n")] = '\0';
            if (is_hex(line, 40)) snprintf(l->commit, sizeof l->commit, "%s", line);
        }
        if (f) fclose(f);
    }
    if (!l->commit[0]) return kvl_fail(err, "hub: %s is not in the cache (%s)", repo, repo_dir);
    if (!fmt_path(p, sizeof p, "%s/snapshots/%s", repo_dir, l->commit))
        return kvl_fail(err, "hub: the cache path is too long");
    walk_target = l;
    walk_root_len = strlen(p);
    if (nftw(p, walk_one, 16, FTW_PHYS) != 0)
        return kvl_fail(err, "hub: cannot read the cached snapshot %s", p);
    return true;
}

/* ---- picking the model ---- */

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static bool is_model_file(const char *path) {
    const char *b = base_name(path);
    return ends_with(path, ".gguf") && !strstr(b, "mmproj") && !strstr(b, "imatrix") &&
           !strstr(b, "mtp-");
}

/* A split part's "-NNNNN-of-MMMMM.gguf": index and count, the prefix's
 * length; count 1 for a whole file. */
static int split_info(const char *path, int *index, size_t *prefix_len) {
    size_t n = strlen(path);
    *index = 1;
    *prefix_len = n >= 5 ? n - 5 : n;
    if (n < 5 + 15) return 1;
    const char *t = path + n - 5 - 15; /* "-00001-of-00003" */
    if (t[0] != '-' || memcmp(t + 6, "-of-", 4) != 0) return 1;
    for (int i = 1; i < 15; i++)
        if (i < 6 || i > 9)
            if (!isdigit((unsigned char)t[i])) return 1;
    *index = atoi(t + 1);
    *prefix_len = (size_t)(t - path);
    return atoi(t + 10);
}

/* Whether path holds tag followed by '.' or '-', ignoring case. */
static bool has_tag(const char *path, const char *tag) {
    const size_t m = strlen(tag);
    for (const char *p = path; *p; p++)
        if (strncasecmp(p, tag, m) == 0 && (p[m] == '.' || p[m] == '-')) return true;
    return false;
}

static int pick(const listing *l, const char *file, const char *tag) {
    if (file) {
        for (int i = 0; i < l->n; i++)
            if (strcmp(l->files[i].path, file) == 0) return i;
        return -1;
    }
    const char *defaults[] = {"Q4_K_M", "Q8_0"};
    const char *const *tags = tag && *tag ? &tag : defaults;
    const int n_tags = tag && *tag ? 1 : 2;
    for (int t = 0; t < n_tags; t++)
        for (int i = 0; i < l->n; i++) {
            int index;
            size_t pl;
            if (is_model_file(l->files[i].path) && has_tag(l->files[i].path, tags[t]) &&
                (split_info(l->files[i].path, &index, &pl) == 1 || index == 1))
                return i;
        }
    if (tag && *tag) return -1;
    for (int i = 0; i < l->n; i++) {
        int index;
        size_t pl;
        if (is_model_file(l->files[i].path) &&
            (split_info(l->files[i].path, &index, &pl) == 1 || index == 1))
            return i;
    }
    return -1;
}

/* ---- one file into the cache ---- */

typedef struct sink {
    FILE *f;
    struct sha256_ctx s256;
    struct sha1_ctx s1;
    bool sha256; /* which one the oid asks for */
    long long have, total, shown;
    const char *name;
    long long resume_from; /* bytes already in the file when the request went out */
    bool overflow;         /* the server sent more than the file's listed size */
    long long git_size;    /* a git blob's size (its SHA-1 covers it), else -1 */
} sink;

/* Starts the checksum: git hashes a blob as "blob SIZE\0" and its bytes. */
static void hash_init(sink *k) {
    if (k->sha256) {
        sha256_init(&k->s256);
        return;
    }
    sha1_init(&k->s1);
    if (k->git_size >= 0) {
        char hdr[64];
        const int m = snprintf(hdr, sizeof hdr, "blob %lld", k->git_size);
        sha1_update(&k->s1, (size_t)m + 1, (const uint8_t *)hdr);
    }
}

static void hash(sink *k, const void *p, size_t n) {
    if (k->sha256) sha256_update(&k->s256, n, p);
    else sha1_update(&k->s1, n, p);
}

static void progress(sink *k, bool done) {
    if (k->total <= 0) return;
    const long long step = k->total / 10 > 1 ? k->total / 10 : 1;
    if (!done && k->have - k->shown < step) return;
    k->shown = k->have;
    fprintf(stderr, "kvllm: downloading %s: %3d%% (%.1f of %.1f MB)\n", k->name,
            (int)(100.0 * (double)k->have / (double)k->total), (double)k->have / 1e6,
            (double)k->total / 1e6);
}

static size_t to_file(char *p, size_t sz, size_t n, void *user) {
    sink *k = user;
    const size_t len = sz * n;
    if (k->total >= 0 && k->have + (long long)len > k->total) { /* more than listed: stop */
        k->overflow = true;
        return 0;
    }
    if (fwrite(p, 1, len, k->f) != len) return 0;
    hash(k, p, len);
    k->have += (long long)len;
    progress(k, false);
    return len;
}

/* A resumed transfer must answer 206; a 200 starts the file over. */
static size_t on_header(char *p, size_t sz, size_t n, void *user) {
    sink *k = user;
    const size_t len = sz * n;
    if (len > 5 && strncmp(p, "HTTP/", 5) == 0) {
        const char *sp = memchr(p, ' ', len);
        const int status = sp ? atoi(sp + 1) : 0;
        if (status >= 300 && status < 400) return len; /* a redirect: the next answer counts */
        if (status == 200) {
            if (k->resume_from > 0) { /* no range support: over from the start */
                if (fflush(k->f) != 0 || ftruncate(fileno(k->f), 0) != 0) return 0;
                rewind(k->f);
                hash_init(k);
                k->have = 0;
                k->resume_from = 0;
            }
        }
    }
    return len;
}

/* The hash of the bytes already in the .incomplete file (a resumed transfer
 * hashes them first). */
static bool hash_existing(sink *k, const char *tmp) {
    FILE *f = fopen(tmp, "rb");
    if (!f) return true;
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        hash(k, buf, got);
        k->have += (long long)got;
    }
    const bool ok = !ferror(f);
    fclose(f);
    return ok;
}

static bool check_oid(sink *k, const char *oid, const char *what, kvl_error *err) {
    uint8_t d[SHA256_DIGEST_SIZE];
    char hex[2 * SHA256_DIGEST_SIZE + 1];
    const size_t n = k->sha256 ? SHA256_DIGEST_SIZE : SHA1_DIGEST_SIZE;
    if (k->sha256) sha256_digest(&k->s256, n, d);
    else sha1_digest(&k->s1, n, d);
    for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    if (strcasecmp(hex, oid) == 0) return true;
    return kvl_fail(err, "hub: %s: checksum %s, the repository says %s (a damaged transfer)", what,
                    hex, oid);
}

static bool download(const http_ctx *h, const char *url, const hub_file *f, const char *dest,
                     kvl_error *err) {
    struct stat st;
    if (stat(dest, &st) == 0) return true; /* the blob of another name with the same bytes */
    char tmp[HUB_PATH * 2 + 16];
    if (!fmt_path(tmp, sizeof tmp, "%s.incomplete", dest))
        return kvl_fail(err, "hub: the cache path is too long");
    if (!make_dirs(dest, false, err)) return false;
    /* one process downloads a file at a time; the next finds it done */
    const int lock = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0) return kvl_fail(err, "hub: cannot create %s: %s", tmp, strerror(errno));
    if (flock(lock, LOCK_EX) != 0) {
        close(lock);
        return kvl_fail(err, "hub: cannot lock %s: %s", tmp, strerror(errno));
    }
    if (stat(dest, &st) == 0) { /* another process finished it while this one waited */
        unlink(tmp);
        close(lock);
        return true;
    }
    bool ok = false;
    for (int attempt = 0; attempt < HUB_ATTEMPTS && !ok; attempt++) {
        sink k = {.name = f->path,
                  .total = f->size,
                  .sha256 = strlen(f->oid) == 64,
                  .git_size = strlen(f->oid) == 40 ? f->size : -1};
        hash_init(&k);
        if (!hash_existing(&k, tmp)) {
            kvl_fail(err, "hub: cannot read %s", tmp);
            break;
        }
        k.resume_from = k.have;
        k.f = fopen(tmp, "ab");
        if (!k.f) {
            kvl_fail(err, "hub: cannot write %s: %s", tmp, strerror(errno));
            break;
        }
        char range[64];
        snprintf(range, sizeof range, "Range: bytes=%lld-", k.have);
        struct curl_slist *hdr = headers(h, false, k.have > 0 ? range : NULL);
        CURL *c = easy(h, url, hdr);
        CURLcode rc = CURLE_FAILED_INIT;
        long status = 0;
        if (c) {
            curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_file);
            curl_easy_setopt(c, CURLOPT_WRITEDATA, &k);
            curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
            curl_easy_setopt(c, CURLOPT_HEADERDATA, &k);
            curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
            if (attempt == 0 && k.have > 0)
                fprintf(stderr, "kvllm: resuming %s at %.1f MB\n", f->path, (double)k.have / 1e6);
            rc = curl_easy_perform(c);
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
            curl_easy_cleanup(c);
        }
        curl_slist_free_all(hdr);
        const bool closed = fclose(k.f) == 0;
        if (rc == CURLE_HTTP_RETURNED_ERROR && status == 416 && f->size >= 0 && k.have == f->size)
            rc = CURLE_OK; /* the bytes were all there already */
        if (k.overflow) {
            kvl_fail(err, "hub: %s: the server sends more than the %lld bytes listed", f->path,
                     f->size);
            unlink(tmp);
            break;
        }
        if (rc != CURLE_OK || !closed) {
            if (rc == CURLE_HTTP_RETURNED_ERROR) {
                kvl_fail(err, "hub: GET %s: HTTP %ld%s", url, status,
                         status == 401 || status == 403 ? " (set HF_TOKEN or --hf-token)" : "");
                if (status != 416) break; /* the server said no: trying again will not help */
                unlink(tmp);              /* a range past the end: start over */
            } else {
                kvl_fail(err, "hub: GET %s: %s", url,
                         closed ? curl_easy_strerror(rc) : "cannot write the file");
                /* a host that cannot be found or reached now will not be in a second */
                if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY ||
                    rc == CURLE_COULDNT_CONNECT || !closed)
                    break;
            }
            if (attempt + 1 < HUB_ATTEMPTS) {
                kvl_log(KVL_LOG_WARN, "%s; trying again", err->msg);
                sleep((unsigned)(attempt + 1));
            }
            continue;
        }
        progress(&k, true);
        if (f->size >= 0 && k.have != f->size) {
            kvl_fail(err, "hub: %s: %lld bytes arrived, the repository lists %lld", f->path, k.have,
                     f->size);
            unlink(tmp);
            break;
        }
        if (f->oid[0] && !check_oid(&k, f->oid, f->path, err)) {
            unlink(tmp);
            break;
        }
        if (rename(tmp, dest) != 0) {
            kvl_fail(err, "hub: cannot move %s into place: %s", tmp, strerror(errno));
            break;
        }
        ok = true;
    }
    struct stat left;
    if (!ok && stat(tmp, &left) == 0 && left.st_size == 0) unlink(tmp); /* nothing to resume */
    close(lock);
    return ok;
}

/* snapshots/{commit}/{path} -> the blob, as a relative link (a copy's
 * rename where links fail). */
static bool link_snapshot(const char *repo_dir, const char *blob_rel, const char *final,
                          const char *path, kvl_error *err) {
    if (!make_dirs(final, false, err)) return false;
    char target[HUB_PATH] = "../../";
    for (const char *c = path; *c; c++) /* one more ../ per directory of the path */
        if (*c == '/') strncat(target, "../", sizeof target - strlen(target) - 1);
    strncat(target, blob_rel, sizeof target - strlen(target) - 1);
    if (symlink(target, final) == 0 || errno == EEXIST) return true;
    char blob[HUB_PATH];
    if (fmt_path(blob, sizeof blob, "%s/%s", repo_dir, blob_rel) && rename(blob, final) == 0)
        return true;
    return kvl_fail(err, "hub: cannot place %s: %s", final, strerror(errno));
}

static void list_gguf(const listing *l, char *out, size_t cap) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < l->n && len + 8 < cap; i++)
        if (ends_with(l->files[i].path, ".gguf"))
            len +=
                (size_t)snprintf(out + len, cap - len, "%s%s", len ? ", " : "", l->files[i].path);
    if (!len) snprintf(out, cap, "none");
}

bool hub_fetch(const hub_request *r, char *path, size_t cap, kvl_error *err) {
    char repo[300], tag[128] = "";
    const char *colon = strchr(r->repo, ':');
    const size_t rl = colon ? (size_t)(colon - r->repo) : strlen(r->repo);
    if (rl >= sizeof repo || (colon && strlen(colon + 1) >= sizeof tag))
        return kvl_fail(err, "hub: '%s' is too long", r->repo);
    memcpy(repo, r->repo, rl);
    repo[rl] = '\0';
    if (colon) snprintf(tag, sizeof tag, "%s", colon + 1);
    if (!valid_repo(repo))
        return kvl_fail(err, "hub: '%s' is not a repository id: expected <user>/<model>[:quant]",
                        r->repo);
    for (const char *t = tag; *t; t++)
        if (!is_word(*t) && *t != '-' && *t != '.')
            return kvl_fail(err, "hub: quantization tag '%s': letters, digits, '_', '-', '.'", tag);
    if (r->file && !valid_rel_path(r->file))
        return kvl_fail(err, "hub: --hf-file '%s' is not a path in a repository", r->file);
    char cache[HUB_PATH], repo_dir[HUB_PATH];
    if (!cache_dir(cache, sizeof cache, err)) return false;
    int w = snprintf(repo_dir, sizeof repo_dir, "%s/models--", cache);
    for (const char *c = repo; *c && w + 3 < (int)sizeof repo_dir; c++)
        w += *c == '/' ? snprintf(repo_dir + w, sizeof repo_dir - (size_t)w, "--")
                       : snprintf(repo_dir + w, sizeof repo_dir - (size_t)w, "%c", *c);
    const char *ep_env =
        getenv("MODEL_ENDPOINT") ? getenv("MODEL_ENDPOINT") : getenv("HF_ENDPOINT");
    char endpoint[1024];
    snprintf(endpoint, sizeof endpoint, "%s",
             ep_env && *ep_env ? ep_env : "https://huggingface.co/");
    if (!ends_with(endpoint, "/") && strlen(endpoint) + 1 < sizeof endpoint) strcat(endpoint, "/");
    http_ctx h;
    listing l = {0};
    bool online = !r->offline, ok = false;
    if (!http_begin(&h, r->token ? r->token : getenv("HF_TOKEN"), err)) return false;
    if (online) {
        bool unreachable = false;
        if (!list_online(&h, endpoint, repo, &l, &unreachable, err)) {
            if (!unreachable) goto done;
            kvl_log(KVL_LOG_WARN, "%s; looking in the cache", err->msg);
            free(l.files);
            l = (listing){0};
            online = false;
        }
    }
    if (!online && !list_cached(repo_dir, repo, &l, err)) goto done;
    const int i = pick(&l, r->file, tag);
    if (i < 0) {
        char have[1024];
        list_gguf(&l, have, sizeof have);
        if (r->file)
            kvl_fail(err, "hub: %s has no file '%s' (GGUF files: %s)", repo, r->file, have);
        else
            kvl_fail(err, "hub: %s has no %s GGUF file (GGUF files: %s)", repo,
                     tag[0] ? tag : "model", have);
        goto done;
    }
    int index;
    size_t prefix_len;
    const int count = split_info(l.files[i].path, &index, &prefix_len);
    if (online) { /* the branch's commit, then every file of the model */
        char refs[HUB_PATH];
        FILE *rf =
            fmt_path(refs, sizeof refs, "%s/refs/main", repo_dir) && make_dirs(refs, false, err)
                ? fopen(refs, "w")
                : NULL;
        const bool written = rf && fprintf(rf, "%s", l.commit) > 0;
        if (!rf || fclose(rf) != 0 || !written) {
            kvl_fail(err, "hub: cannot write %s/refs/main", repo_dir);
            goto done;
        }
    }
    for (int j = 0; j < l.n; j++) {
        int jx;
        size_t jp;
        const hub_file *f = &l.files[j];
        const bool part =
            j == i || (count > 1 && split_info(f->path, &jx, &jp) == count && jp == prefix_len &&
                       strncmp(f->path, l.files[i].path, prefix_len) == 0);
        if (!part) continue;
        char final[HUB_PATH * 2];
        snprintf(final, sizeof final, "%s/snapshots/%s/%s", repo_dir, l.commit, f->path);
        struct stat st;
        if (stat(final, &st) == 0) continue; /* cached */
        if (!online) {
            kvl_fail(err, "hub: %s is not in the cache (offline)", final);
            goto done;
        }
        char url[HUB_PATH * 2], blob_rel[128], dest[HUB_PATH * 2];
        snprintf(url, sizeof url, "%s%s/resolve/%s/%s", endpoint, repo, l.commit, f->path);
        if (f->oid[0]) {
            snprintf(blob_rel, sizeof blob_rel, "blobs/%s", f->oid);
            snprintf(dest, sizeof dest, "%s/%s", repo_dir, blob_rel);
        } else snprintf(dest, sizeof dest, "%s", final);
        if (!download(&h, url, f, dest, err)) goto done;
        if (f->oid[0] && !link_snapshot(repo_dir, blob_rel, final, f->path, err)) goto done;
    }
    if ((size_t)snprintf(path, cap, "%s/snapshots/%s/%s", repo_dir, l.commit, l.files[i].path) >=
        cap) {
        kvl_fail(err, "hub: the cached path is too long");
        goto done;
    }
    ok = true;
done:
    free(l.files);
    curl_global_cleanup();
    return ok;
}

/* llama.cpp's own cache directory (fs_get_cache_directory). */
static bool llama_cache_dir(char *out, size_t cap, kvl_error *err) {
    const char *v = getenv("LLAMA_CACHE");
    bool ok;
    if (v && *v) ok = fmt_path(out, cap, "%s", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) ok = fmt_path(out, cap, "%s/llama.cpp", v);
    else if ((v = getenv("HOME")) && *v) ok = fmt_path(out, cap, "%s/.cache/llama.cpp", v);
    else return kvl_fail(err, "hub: no cache directory (set LLAMA_CACHE or HOME)");
    return ok ? true : kvl_fail(err, "hub: the cache directory's name is too long");
}

bool hub_fetch_url(const char *url, const char *dest, const char *token, bool offline, char *path,
                   size_t cap, kvl_error *err) {
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return kvl_fail(err, "hub: '%.200s' is not an http(s) URL", url);
    if (strlen(url) >= HUB_PATH || strpbrk(url, " \r\n\t"))
        return kvl_fail(err, "hub: '%.200s' is not a URL kvllm fetches", url);
    /* the file name: the path's last component, without query or fragment */
    char base[HUB_PATH];
    const size_t end = strcspn(url, "?#");
    const char *slash = url + end;
    while (slash > url && slash[-1] != '/') slash--;
    const size_t bl = (size_t)(url + end - slash);
    if (bl == 0 || bl >= 256 || slash[0] == '.' || slash <= url + 8)
        return kvl_fail(err, "hub: '%.200s' names no file", url);
    memcpy(base, slash, bl);
    base[bl] = '\0';
    for (const char *c = base; *c; c++)
        if (!is_word(*c) && *c != '-' && *c != '.')
            return kvl_fail(
                err, "hub: the file name '%s' of the URL: letters, digits, '_', '-', '.'", base);
    int index;
    size_t prefix_len;
    const int count = split_info(base, &index, &prefix_len);
    if (count > 1 && index != 1)
        return kvl_fail(err, "hub: %s is part %d of a split model: give the URL of part 1", base,
                        index);
    if (count > 1 && dest)
        return kvl_fail(err, "hub: a split model's parts go to the cache directory (no -m)");
    char dir[HUB_PATH];
    if (!dest && !llama_cache_dir(dir, sizeof dir, err)) return false;
    http_ctx h;
    if (!http_begin(&h, token ? token : getenv("HF_TOKEN"), err)) return false;
    bool ok = true;
    const size_t url_prefix = (size_t)(slash - url) + prefix_len; /* up to the part's suffix */
    for (int part = 1; ok && part <= count; part++) {
        char name[300], part_url[HUB_PATH + 32], local[HUB_PATH * 2];
        const bool fits =
            (count > 1 ? fmt_path(name, sizeof name, "%.*s-%05d-of-%05d.gguf", (int)prefix_len,
                                  base, part, count) &&
                             fmt_path(part_url, sizeof part_url, "%.*s-%05d-of-%05d.gguf%s",
                                      (int)url_prefix, url, part, count, url + end)
                       : fmt_path(name, sizeof name, "%s", base) &&
                             fmt_path(part_url, sizeof part_url, "%s", url)) &&
            (dest ? fmt_path(local, sizeof local, "%s", dest)
                  : fmt_path(local, sizeof local, "%s/%s", dir, name)) &&
            (part > 1 || fmt_path(path, cap, "%s", local));
        if (!fits) {
            ok = kvl_fail(err, "hub: a path or URL is too long");
            break;
        }
        struct stat st;
        if (stat(local, &st) == 0) continue; /* there already */
        if (offline) {
            ok = kvl_fail(err, "hub: %s is not there (offline)", local);
            break;
        }
        hub_file f = {.size = -1};
        memcpy(f.path, name, strlen(name) + 1);
        ok = download(&h, part_url, &f, local, err);
    }
    curl_global_cleanup();
    return ok;
}

/* The quantization tag of a model file's name, as llama.cpp reads it: the
 * last run of [A-Za-z0-9_] after '-' or '.' before ".gguf" (and a split
 * suffix), upper-cased; "" when there is none. */
static void name_tag(const char *path, char *tag, size_t cap) {
    int index;
    size_t plen;
    split_info(path, &index, &plen);
    size_t i = plen;
    while (i > 0 && is_word(path[i - 1])) i--;
    tag[0] = '\0';
    if (i == 0 || i == plen || (path[i - 1] != '-' && path[i - 1] != '.')) return;
    const size_t n = plen - i < cap - 1 ? plen - i : cap - 1;
    for (size_t k = 0; k < n; k++) tag[k] = (char)toupper((unsigned char)path[i + k]);
    tag[n] = '\0';
}

static int cmp_names(const void *a, const void *b) { return strcmp(a, b); }

void hub_list_cached(FILE *out) {
    char cache[HUB_PATH];
    kvl_error err = {{0}};
    char(*names)[400] = NULL;
    int n = 0;
    if (cache_dir(cache, sizeof cache, &err)) {
        DIR *d = opendir(cache);
        for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
            if (strncmp(e->d_name, "models--", 8) != 0) continue;
            char repo[300], repo_dir[HUB_PATH];
            size_t w = 0;
            for (const char *c = e->d_name + 8; *c && w + 2 < sizeof repo; c++) {
                if (c[0] == '-' && c[1] == '-') repo[w++] = '/', c++;
                else repo[w++] = *c;
            }
            repo[w] = '\0';
            listing l = {0};
            kvl_error lerr = {{0}};
            if (!valid_repo(repo) ||
                !fmt_path(repo_dir, sizeof repo_dir, "%s/%s", cache, e->d_name) ||
                !list_cached(repo_dir, repo, &l, &lerr)) {
                free(l.files);
                continue;
            }
            for (int i = 0; i < l.n; i++) {
                int index;
                size_t plen;
                const int count = split_info(l.files[i].path, &index, &plen);
                char tag[64], line[400];
                name_tag(l.files[i].path, tag, sizeof tag);
                if (!is_model_file(l.files[i].path) || (count > 1 && index != 1) || !tag[0] ||
                    !fmt_path(line, sizeof line, "%s:%s", repo, tag))
                    continue;
                bool seen = false;
                for (int k = 0; k < n && !seen; k++) seen = !strcmp(names[k], line);
                char(*grown)[400] = seen ? names : realloc(names, (size_t)(n + 1) * sizeof *names);
                if (!grown) break;
                names = grown;
                if (!seen) memcpy(names[n++], line, sizeof line);
            }
            free(l.files);
        }
        if (d) closedir(d);
    }
    qsort(names, (size_t)n, sizeof *names, cmp_names); /* the directory's order is none */
    fprintf(out, "number of models in cache: %d\n", n);
    for (int i = 0; i < n; i++) fprintf(out, "%4d. %s\n", i + 1, names[i]);
    free(names);
}

/* ---- Docker Hub models (llama.cpp's -dr) ---- */

/* Docker's repository names: lower-case [a-z0-9] runs joined by '.', '_', '-'
 * or '/', at most 255 bytes. */
static bool valid_docker_repo(const char *r) {
    const size_t n = strlen(r);
    if (n == 0 || n > 255) return false;
    bool sep = true;
    for (size_t i = 0; i < n; i++) {
        const char c = r[i];
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) sep = false;
        else if (c == '.' || c == '_' || c == '-' || c == '/') {
            if (sep) return false;
            sep = true;
        } else return false;
    }
    return !sep;
}

static const char *env_or(const char *var, const char *dflt) {
    const char *v = getenv(var);
    return v && *v ? v : dflt;
}

bool hub_fetch_docker(const char *spec, bool offline, char *path, size_t cap, kvl_error *err) {
    char repo[300], tag[130];
    const char *colon = strrchr(spec, ':');
    const size_t rl = colon ? (size_t)(colon - spec) : strlen(spec);
    const bool slash = memchr(spec, '/', rl) != NULL;
    if (rl + 4 >= sizeof repo || (colon && strlen(colon + 1) >= sizeof tag))
        return kvl_fail(err, "hub: '%s' is too long", spec);
    snprintf(repo, sizeof repo, "%s%.*s", slash ? "" : "ai/", (int)rl, spec); /* ai/ the default */
    snprintf(tag, sizeof tag, "%s", colon ? colon + 1 : "latest");
    if (!valid_docker_repo(repo))
        return kvl_fail(err, "hub: '%s' is not a Docker repository: [<repo>/]<model>[:tag]", spec);
    for (const char *t = tag; *t; t++)
        if (!is_word(*t) && *t != '-' && *t != '.')
            return kvl_fail(err, "hub: tag '%s': letters, digits, '_', '-', '.'", tag);
    if (!tag[0]) return kvl_fail(err, "hub: an empty tag in '%s'", spec);
    char dir[HUB_PATH], name[512];
    if (!llama_cache_dir(dir, sizeof dir, err)) return false;
    size_t w = 0; /* llama.cpp's file name: the repository's '/' as '_', then _TAG.gguf */
    for (const char *c = repo; *c; c++) name[w++] = *c == '/' ? '_' : *c;
    snprintf(name + w, sizeof name - w, "_%s.gguf", tag);
    if (!fmt_path(path, cap, "%s/%s", dir, name))
        return kvl_fail(err, "hub: the cache path is too long");
    struct stat st;
    if (stat(path, &st) == 0) return true; /* fetched before */
    if (offline) return kvl_fail(err, "hub: %s is not in the cache (offline)", path);
    http_ctx h;
    const char *auth = env_or("KVLLM_DOCKER_AUTH", "https://auth.docker.io");
    const char *reg = env_or("KVLLM_DOCKER_REGISTRY", "https://registry-1.docker.io");
    char url[HUB_PATH], token[4096] = "", digest[80] = "";
    long long size = -1;
    bool unreachable = false, ok = false;
    if (!http_begin(&h, NULL, err)) return false;
    /* an anonymous pull token, then the manifest's GGUF layer */
    snprintf(url, sizeof url, "%s/token?service=registry.docker.io&scope=repository:%s:pull", auth,
             repo);
    cJSON *t = get_json(&h, url, &unreachable, err);
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(t, "token");
    if (t && (!cJSON_IsString(tok) || strlen(tok->valuestring) >= sizeof token ||
              strpbrk(tok->valuestring, "\r\n")))
        kvl_fail(err, "hub: %s: no usable 'token' in the answer", url);
    else if (t) snprintf(token, sizeof token, "%s", tok->valuestring);
    cJSON_Delete(t);
    if (!token[0]) goto done;
    h.token = token;
    h.accept = "application/vnd.docker.distribution.manifest.v2+json,"
               "application/vnd.oci.image.manifest.v1+json";
    snprintf(url, sizeof url, "%s/v2/%s/manifests/%s", reg, repo, tag);
    cJSON *m = get_json(&h, url, &unreachable, err);
    if (!m) goto done;
    const cJSON *layer;
    cJSON_ArrayForEach(layer, cJSON_GetObjectItemCaseSensitive(m, "layers")) {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(layer, "mediaType");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(layer, "digest");
        const cJSON *sz = cJSON_GetObjectItemCaseSensitive(layer, "size");
        if (!cJSON_IsString(mt) || !strstr(mt->valuestring, "gguf") || !cJSON_IsString(d)) continue;
        if (strncmp(d->valuestring, "sha256:", 7) != 0 || !is_hex(d->valuestring + 7, 64)) {
            kvl_fail(err, "hub: %s: the GGUF layer's digest '%.80s' is not sha256:<hex>", url,
                     d->valuestring);
            break;
        }
        snprintf(digest, sizeof digest, "%s", d->valuestring);
        size = cJSON_IsNumber(sz) ? (long long)sz->valuedouble : -1;
        break;
    }
    cJSON_Delete(m);
    if (!digest[0]) {
        if (!err->msg[0]) kvl_fail(err, "hub: %s: no GGUF layer in the manifest", url);
        goto done;
    }
    hub_file f = {.size = size};
    snprintf(f.path, sizeof f.path, "%s", name);
    for (int i = 0; i < 64; i++) f.oid[i] = (char)tolower((unsigned char)digest[7 + i]);
    snprintf(url, sizeof url, "%s/v2/%s/blobs/%s", reg, repo, digest);
    h.accept = NULL;
    ok = download(&h, url, &f, path, err);
done:
    curl_global_cleanup();
    return ok;
}
