/* kvllm run-batch: vLLM's offline batch runner (`python -m
 * vllm.entrypoints.openai.run_batch -i IN -o OUT --model M`): the OpenAI batch
 * file format in, one result line per request out, in the input's order.
 *
 * Input: one JSON object a line, {"custom_id", "method": "POST", "url",
 * "body"}; the urls vLLM takes (/v1/chat/completions, /v1/embeddings, any
 * path ending in /score or /rerank) and /v1/completions. Output:
 * {"id", "custom_id", "response": {"status_code", "request_id", "body"},
 * "error"}: the route's answer as body (error null), or for a request the
 * server refused its status and error object (body null), or for a line
 * that is not a request a 400 with the reason as error.
 *
 * The requests run on a `kvllm serve` child (this executable, the remaining
 * flags passed on; 127.0.0.1, a free port), so each is answered exactly as
 * the server answers it, continuous batching included; --concurrency of them
 * are in flight at once. Files: a path, - (stdin / stdout), or an http(s)
 * URL (GET for the input, PUT for the output), as vLLM's. */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

typedef struct batch {
    char **lines; /* the input's non-empty lines */
    char **out;   /* results done but not yet written: those after a missing one (mu) */
    int64_t n;
    int64_t next;    /* the next line a worker takes (mu) */
    int64_t written; /* results written so far, in order (mu) */
    FILE *f;         /* where they go */
    bool write_failed;
    int port;
    pthread_mutex_t mu;
    int64_t n_ok; /* answered 2xx (mu) */
} batch;

/* Line k's result (taken): written now if every earlier one is, with those
 * waiting on it, so the output streams in input order and holds in memory
 * only what ran ahead of a slow request. */
static void deliver(batch *b, int64_t k, char *line) {
    pthread_mutex_lock(&b->mu);
    b->out[k] = line ? line : strdup("{}");
    while (b->written < b->n && b->out[b->written]) {
        char *l = b->out[b->written];
        if (!b->write_failed && fprintf(b->f, "%s\n", l) < 0) b->write_failed = true;
        free(l);
        b->out[b->written++] = NULL;
    }
    pthread_mutex_unlock(&b->mu);
}

void cmd_run_batch_usage(FILE *out) {
    fprintf(
        out,
        "usage: kvllm run-batch -i INPUT -o OUTPUT [-m MODEL] [serve's flags]\n\n"
        "vLLM's offline batch runner: the OpenAI batch file format (one request a line:\n"
        "{\"custom_id\", \"method\": \"POST\", \"url\", \"body\"}) in, one result a line out,\n"
        "in order. urls: /v1/chat/completions, /v1/completions, /v1/embeddings, .../score,\n"
        ".../rerank; each runs on a `kvllm serve` of the model, as the server answers it.\n\n"
        "  -i, --input-file F   a path, - (stdin) or an http(s) URL (GET)\n"
        "  -o, --output-file F  a path, - (stdout) or an http(s) URL (PUT)\n"
        "  --output-tmp-dir D   where an upload's file is written first (default: /tmp)\n"
        "  --concurrency N      requests in flight (default 16)\n"
        "  every other flag is kvllm serve's (-m, -c, --max-seqs, --chat-template-file, ...)\n");
}

/* A random id: prefix and 32 hex digits. */
static void random_id(char *out, size_t cap, const char *prefix) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)rand();
    int n = snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof b && n + 2 < (int)cap; i++)
        n += snprintf(out + n, cap - (size_t)n, "%02x", b[i]);
}

/* A result line: body (taken; NULL: null) and error (taken; NULL: null). */
static char *result_line(const char *custom_id, long status, cJSON *body, cJSON *error) {
    char id[64], rid[64];
    random_id(id, sizeof id, "kvllm-");
    random_id(rid, sizeof rid, "kvllm-batch-");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    if (custom_id) cJSON_AddStringToObject(o, "custom_id", custom_id);
    else cJSON_AddNullToObject(o, "custom_id");
    cJSON *r = cJSON_AddObjectToObject(o, "response");
    cJSON_AddNumberToObject(r, "status_code", (double)status);
    cJSON_AddStringToObject(r, "request_id", rid);
    cJSON_AddItemToObject(r, "body", body ? body : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "error", error ? error : cJSON_CreateNull());
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static size_t collect(char *p, size_t size, size_t n, void *user) {
    kvl_buf *b = user;
    kvl_buf_put(b, p, size * n);
    return b->oom ? 0 : size * n;
}

/* vLLM's routes of the batch format (and /v1/completions). */
static bool url_supported(const char *u) {
    const size_t n = strlen(u);
    return !strcmp(u, "/v1/chat/completions") || !strcmp(u, "/v1/completions") ||
           !strcmp(u, "/v1/embeddings") || (n >= 6 && !strcmp(u + n - 6, "/score")) ||
           (n >= 7 && !strcmp(u + n - 7, "/rerank"));
}

/* Line k's result. */
static char *run_line(batch *b, CURL *curl, const char *line) {
    cJSON *req = cJSON_Parse(line);
    const char *cid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "custom_id"));
    const char *method = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "method"));
    const char *url = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "url"));
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(req, "body");
    const char *why = !cJSON_IsObject(req)                ? "the line is not a JSON object"
                      : !cid                              ? "'custom_id' (a string) is missing"
                      : !url                              ? "'url' (a string) is missing"
                      : !cJSON_IsObject(body)             ? "'body' (an object) is missing"
                      : !method || strcmp(method, "POST") ? "'method' must be \"POST\""
                      : !url_supported(url)               ? NULL
                      : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream"))
                          ? "Request must not be sent in stream mode"
                          : "";
    char msg[512];
    if (!why) {
        snprintf(msg, sizeof msg,
                 "URL %.200s was used. Supported endpoints: /v1/chat/completions, "
                 "/v1/completions, /v1/embeddings, /score, /rerank.",
                 url);
        why = msg;
    }
    if (*why) {
        char *s = result_line(cid, 400, NULL, cJSON_CreateString(why));
        cJSON_Delete(req);
        return s;
    }
    char *text = cJSON_PrintUnformatted(body), target[512];
    snprintf(target, sizeof target, "http://127.0.0.1:%d%s", b->port, url);
    kvl_buf resp = {0};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURLcode rc;
    long status = 0;
    /* 503: the server's queue is full (--max-queue below --concurrency): wait
     * and send it again, as a client honouring Retry-After would */
    for (int attempt = 0;; attempt++) {
        resp.len = 0;
        curl_easy_reset(curl);
        curl_easy_setopt(curl, CURLOPT_URL, target);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text ? text : "{}");
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &resp);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        rc = curl_easy_perform(curl);
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        if (rc != CURLE_OK || status != 503 || attempt == 6000) break;
        usleep(100 * 1000);
    }
    curl_slist_free_all(h);
    free(text);
    cJSON *answer = rc == CURLE_OK && resp.p ? cJSON_ParseWithLength(resp.p, resp.len) : NULL;
    char *s;
    if (rc != CURLE_OK || !answer) {
        snprintf(msg, sizeof msg, "the server gave no answer: %s",
                 rc != CURLE_OK ? curl_easy_strerror(rc) : "not JSON");
        s = result_line(cid, rc != CURLE_OK ? 500 : status, NULL, cJSON_CreateString(msg));
        cJSON_Delete(answer);
    } else if (status / 100 == 2) {
        s = result_line(cid, status, answer, NULL);
    } else {
        s = result_line(cid, status, NULL, answer); /* the server's error object */
    }
    kvl_buf_free(&resp);
    cJSON_Delete(req);
    pthread_mutex_lock(&b->mu);
    if (status / 100 == 2 && rc == CURLE_OK) b->n_ok++;
    pthread_mutex_unlock(&b->mu);
    return s;
}

static void *worker(void *arg) {
    batch *b = arg;
    CURL *curl = curl_easy_init();
    for (;;) {
        pthread_mutex_lock(&b->mu);
        const int64_t k = b->next < b->n ? b->next++ : -1;
        pthread_mutex_unlock(&b->mu);
        if (k < 0) break;
        deliver(b, k,
                curl ? run_line(b, curl, b->lines[k])
                     : result_line(NULL, 500, NULL, cJSON_CreateString("out of memory")));
    }
    if (curl) curl_easy_cleanup(curl);
    return NULL;
}

static bool is_url(const char *s) {
    return !strncmp(s, "http://", 7) || !strncmp(s, "https://", 8);
}

/* The input's text (malloc'd), from a path, stdin or a URL. */
static char *read_input(const char *path, size_t *len) {
    if (!is_url(path)) {
        kvl_error err = {{0}};
        char *t = cli_read_input(path, len, &err);
        if (!t) fprintf(stderr, "kvllm run-batch: -i %s: %s\n", path, err.msg);
        return t;
    }
    CURL *c = curl_easy_init();
    kvl_buf b = {0};
    long status = 0;
    CURLcode rc = CURLE_FAILED_INIT;
    if (c) {
        curl_easy_setopt(c, CURLOPT_URL, path);
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        rc = curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
    }
    if (rc != CURLE_OK || status / 100 != 2 || b.oom) {
        fprintf(stderr, "kvllm run-batch: -i %s: %s\n", path,
                rc != CURLE_OK ? curl_easy_strerror(rc) : "the server did not answer 2xx");
        kvl_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.p ? b.p : strdup("");
}

/* Where the results go: path, stdout, or for a URL a temporary file in tmpdir
 * (its name in tmp) uploaded at the end. NULL with the reason printed. */
static FILE *open_output(const char *path, const char *tmpdir, char *tmp, size_t cap) {
    tmp[0] = 0;
    FILE *f;
    if (!strcmp(path, "-")) f = stdout;
    else if (is_url(path)) {
        snprintf(tmp, cap, "%s/kvllm-batch-XXXXXX", tmpdir ? tmpdir : "/tmp");
        const int fd = mkstemp(tmp);
        f = fd >= 0 ? fdopen(fd, "w+") : NULL;
        if (!f && fd < 0) tmp[0] = 0;
    } else f = fopen(path, "w");
    if (!f) fprintf(stderr, "kvllm run-batch: -o %s: %s\n", path, strerror(errno));
    return f;
}

/* The results written: flushed and closed, or PUT to the URL (vLLM's way). */
static bool finish_output(FILE *f, bool ok, const char *path, const char *tmp) {
    ok = fflush(f) == 0 && ok;
    if (ok && tmp[0]) {
        CURL *c = curl_easy_init();
        long status = 0;
        CURLcode rc = CURLE_FAILED_INIT;
        if (c) {
            fseek(f, 0, SEEK_END);
            const long size = ftell(f);
            rewind(f);
            curl_easy_setopt(c, CURLOPT_URL, path);
            curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(c, CURLOPT_READDATA, f);
            curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)size);
            rc = curl_easy_perform(c);
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
            curl_easy_cleanup(c);
        }
        if (rc != CURLE_OK || status / 100 != 2) {
            fprintf(stderr, "kvllm run-batch: -o %s: upload failed (%s)\n", path,
                    rc != CURLE_OK ? curl_easy_strerror(rc) : "the server did not answer 2xx");
            ok = false;
        }
    }
    if (f != stdout) ok = fclose(f) == 0 && ok;
    if (tmp[0]) unlink(tmp);
    if (!ok) fprintf(stderr, "kvllm run-batch: -o %s: could not write the results\n", path);
    return ok;
}

/* The server child: `kvllm serve --host 127.0.0.1 --port 0 ARGS`; its port
 * from its "listening on" line (0: it failed, its log already shown). Its
 * later log goes on to our stderr (forward). */
typedef struct child {
    pid_t pid;
    int err_fd;
    pthread_t fwd;
    bool fwd_started;
} child;

static void *forward(void *arg) {
    child *c = arg;
    char buf[4096];
    ssize_t n;
    while ((n = read(c->err_fd, buf, sizeof buf)) > 0)
        if (write(2, buf, (size_t)n) < 0) break;
    return NULL;
}

static int start_server(child *c, int argc, char **argv) {
    int p[2];
    if (pipe(p) != 0) return 0;
    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (!args) return 0;
    int k = 0;
    args[k++] = "kvllm";
    args[k++] = "serve";
    args[k++] = "--host";
    args[k++] = "127.0.0.1";
    args[k++] = "--port";
    args[k++] = "0";
    for (int i = 0; i < argc; i++) args[k++] = argv[i];
    c->pid = fork();
    if (c->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlives run-batch */
        dup2(p[1], 1);                    /* nothing of its own on our stdout (-o -) */
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    free(args);
    close(p[1]);
    c->err_fd = p[0];
    if (c->pid < 0) return 0;
    /* its log up to the listening line, shown as it comes */
    char line[8192];
    size_t n = 0;
    int port = 0;
    for (;;) {
        char ch;
        const ssize_t r = read(c->err_fd, &ch, 1);
        if (r <= 0) break;
        if (n + 1 < sizeof line) line[n++] = ch;
        if (ch != '\n') continue;
        line[n] = 0;
        fputs(line, stderr);
        const char *at = strstr(line, "listening on http://127.0.0.1:");
        n = 0;
        if (at) {
            port = atoi(at + strlen("listening on http://127.0.0.1:"));
            break;
        }
    }
    if (port > 0) c->fwd_started = kvl_thread_start(&c->fwd, forward, c) == 0;
    return port;
}

static int stop_server(child *c) {
    int st = 0;
    if (c->pid > 0) {
        kill(c->pid, SIGTERM);
        waitpid(c->pid, &st, 0);
    }
    if (c->fwd_started) pthread_join(c->fwd, NULL);
    close(c->err_fd);
    return st;
}

int cmd_run_batch(int argc, char **argv) {
    const char *in = NULL, *outp = NULL, *tmpdir = NULL;
    int64_t conc = 16;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int n_rest = 0;
    if (!rest) return 1;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(name) (strcmp(f, name) == 0)
        if (IS("-h") || IS("--help")) {
            cmd_run_batch_usage(stdout);
            free(rest);
            return 0;
        }
        const bool valued = IS("-i") || IS("--input-file") || IS("-o") || IS("--output-file") ||
                            IS("--output-tmp-dir") || IS("--concurrency") ||
                            IS("--response-role") || IS("--max-log-len");
        if (valued && !v) {
            fprintf(stderr, "kvllm run-batch: %s: missing value\n", f);
            free(rest);
            return 2;
        }
        if (IS("-i") || IS("--input-file")) in = v;
        else if (IS("-o") || IS("--output-file")) outp = v;
        else if (IS("--output-tmp-dir")) tmpdir = v;
        else if (IS("--concurrency")) {
            char *end;
            conc = strtoll(v, &end, 10);
            if (*end || conc < 1 || conc > 1024) {
                fprintf(stderr, "kvllm run-batch: --concurrency: 1..1024\n");
                free(rest);
                return 2;
            }
        } else if (IS("--response-role")) {
            if (strcmp(v, "assistant") != 0) {
                fprintf(stderr, "kvllm run-batch: --response-role: only \"assistant\" here\n");
                free(rest);
                return 2;
            }
        } else if (IS("--max-log-len")) {
            fprintf(stderr, "kvllm run-batch: note: --max-log-len: requests are not logged\n");
        } else if (IS("--enable-prompt-tokens-details") || IS("--enable-force-include-usage")) {
            fprintf(stderr, "kvllm run-batch: note: %s: always so here\n", f);
            continue;
        } else if (IS("--enable-metrics")) {
            fprintf(stderr, "kvllm run-batch: --enable-metrics is not supported: run kvllm serve "
                            "for /metrics\n");
            free(rest);
            return 2;
        } else {
            rest[n_rest++] = argv[i];
            continue;
        }
        i++;
#undef IS
    }
    if (!in || !outp) {
        fprintf(stderr, "kvllm run-batch: -i INPUT and -o OUTPUT are required\n");
        cmd_run_batch_usage(stderr);
        free(rest);
        return 2;
    }
    size_t len = 0;
    char *text = read_input(in, &len);
    if (!text) {
        free(rest);
        return 1;
    }
    batch b = {0};
    pthread_mutex_init(&b.mu, NULL);
    for (size_t i = 0; i < len; i++) b.n += text[i] == '\n';
    b.lines = calloc((size_t)b.n + 1, sizeof *b.lines);
    b.out = calloc((size_t)b.n + 1, sizeof *b.out);
    if (!b.lines || !b.out) {
        fprintf(stderr, "kvllm run-batch: out of memory\n");
        free(text);
        free(rest);
        return 1;
    }
    b.n = 0;
    for (char *p = text, *save = NULL, *l; (l = strtok_r(p, "\n", &save)); p = NULL) {
        while (*l == ' ' || *l == '\t' || *l == '\r') l++;
        if (*l) b.lines[b.n++] = l;
    }
    char tmp[4096];
    b.f = open_output(outp, tmpdir, tmp, sizeof tmp);
    child c = {0};
    b.port = b.f ? start_server(&c, n_rest, rest) : 0;
    int rc = 1;
    if (!b.f) {
    } else if (b.port <= 0) {
        int st = stop_server(&c);
        fprintf(stderr, "kvllm run-batch: the server did not start (exit %d): see its log above\n",
                WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    } else {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        const int nt = (int)(conc < b.n ? conc : b.n > 0 ? b.n : 1);
        pthread_t *t = calloc((size_t)nt, sizeof *t);
        int started = 0;
        for (int i = 0; t && i < nt; i++) started += kvl_thread_start(&t[i], worker, &b) == 0;
        if (!started) worker(&b); /* no threads: one at a time here */
        for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
        free(t);
        stop_server(&c);
        rc = finish_output(b.f, !b.write_failed, outp, tmp) ? 0 : 1;
        b.f = NULL;
        fprintf(stderr, "kvllm run-batch: %lld requests: %lld answered, %lld failed%s%s\n",
                (long long)b.n, (long long)b.n_ok, (long long)(b.n - b.n_ok),
                rc ? "" : "; results in ", rc ? "" : outp);
        curl_global_cleanup();
    }
    if (b.f && b.f != stdout) fclose(b.f); /* the server did not start: nothing to upload */
    if (b.f && tmp[0]) unlink(tmp);
    for (int64_t k = 0; k < b.n; k++) free(b.out[k]);
    free(b.out);
    free(b.lines);
    free(text);
    free(rest);
    pthread_mutex_destroy(&b.mu);
    return rc;
}
