/* loadgen: see loadgen.h. Metrics follow vLLM's benchmark_serving: TTFT is
 * the time to the first streamed chunk, ITL the gaps between later chunks,
 * TPOT (latency - TTFT) / (output tokens - 1) per request, output tokens from
 * the final usage chunk (stream_options.include_usage). */
#define _GNU_SOURCE
#include "loadgen.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base.h"

/* ------------------------------------------------------------------ URL -- */

typedef struct url_parts {
    char host[300], port[8], prefix[256];
} url_parts;

static bool parse_url(const char *url, url_parts *u) {
    memset(u, 0, sizeof *u);
    if (strncmp(url, "http://", 7) != 0) return false;
    const char *p = url + 7, *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    char hp[300];
    if (n == 0 || n >= sizeof hp) return false;
    memcpy(hp, p, n);
    hp[n] = 0;
    char *colon = hp[0] == '[' ? strstr(hp, "]:") : strrchr(hp, ':');
    if (colon && hp[0] == '[') colon++;
    snprintf(u->port, sizeof u->port, "%s", colon ? colon + 1 : "80");
    if (colon) *colon = 0;
    char *h = hp;
    if (h[0] == '[') { /* [::1] */
        h++;
        char *close = strchr(h, ']');
        if (close) *close = 0;
    }
    snprintf(u->host, sizeof u->host, "%s", h);
    snprintf(u->prefix, sizeof u->prefix, "%s", slash ? slash : "");
    size_t pl = strlen(u->prefix);
    while (pl && u->prefix[pl - 1] == '/') u->prefix[--pl] = 0;
    return u->host[0] && atoi(u->port) > 0;
}

/* ---------------------------------------------------------- HTTP client -- */

typedef struct conn {
    int fd;
    char buf[16384];
    size_t beg, end;
} conn;

static int connect_to(const url_parts *u) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(u->host, u->port, &hints, &ai) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct timeval tv = {.tv_sec = 600};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static bool conn_fill(conn *c) {
    if (c->beg == c->end) c->beg = c->end = 0;
    if (c->end == sizeof c->buf) {
        memmove(c->buf, c->buf + c->beg, c->end - c->beg);
        c->end -= c->beg;
        c->beg = 0;
    }
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->end, sizeof c->buf - c->end, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        c->end += (size_t)r;
        return true;
    }
}

/* One line without its CR LF; false at EOF or if it does not fit. */
static bool conn_line(conn *c, char *out, size_t cap) {
    for (;;) {
        char *nl = memchr(c->buf + c->beg, '\n', c->end - c->beg);
        if (nl) {
            size_t n = (size_t)(nl - (c->buf + c->beg));
            size_t m = n && c->buf[c->beg + n - 1] == '\r' ? n - 1 : n;
            if (m >= cap) return false;
            memcpy(out, c->buf + c->beg, m);
            out[m] = 0;
            c->beg += n + 1;
            return true;
        }
        if (c->end - c->beg >= sizeof c->buf - 1 || !conn_fill(c)) return false;
    }
}

typedef void (*body_fn)(const char *p, size_t n, void *ctx);

/* Passes up to n body bytes to fn; n = SIZE_MAX reads to EOF. */
static bool conn_body(conn *c, size_t n, body_fn fn, void *ctx) {
    while (n > 0) {
        if (c->beg == c->end && !conn_fill(c)) return n == SIZE_MAX;
        size_t k = c->end - c->beg;
        if (k > n) k = n;
        fn(c->buf + c->beg, k, ctx);
        c->beg += k;
        if (n != SIZE_MAX) n -= k;
    }
    return true;
}

static bool chunked_body(conn *c, body_fn fn, void *ctx) {
    char line[128];
    for (;;) {
        if (!conn_line(c, line, sizeof line)) return false;
        char *end;
        unsigned long long size = strtoull(line, &end, 16);
        if (end == line) return false;
        if (size == 0) return true; /* trailers are ignored: the connection closes */
        if (!conn_body(c, (size_t)size, fn, ctx) || !conn_line(c, line, sizeof line)) return false;
    }
}

/* Sends one request on a new connection (Connection: close) and streams the
 * response body to fn. Returns the HTTP status, or -1 on a transport error. */
static int http_exchange(const url_parts *u, const char *method, const char *path, const char *body,
                         const char *api_key, body_fn fn, void *ctx) {
    conn *c = malloc(sizeof *c);
    if (!c) return -1;
    c->beg = c->end = 0;
    c->fd = connect_to(u);
    int status = -1;
    char head[1024], line[1024];
    int hn = snprintf(
        head, sizeof head,
        "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nAccept: text/event-stream, application/json\r\n"
        "Connection: close\r\n%s%s%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
        method, u->prefix, path, u->host, u->port, api_key ? "Authorization: Bearer " : "",
        api_key ? api_key : "", api_key ? "\r\n" : "", body ? strlen(body) : 0);
    if (c->fd < 0 || hn >= (int)sizeof head || !send_all(c->fd, head, (size_t)hn) ||
        (body && !send_all(c->fd, body, strlen(body))) || !conn_line(c, line, sizeof line) ||
        sscanf(line, "HTTP/%*d.%*d %d", &status) != 1)
        goto out;
    bool chunked = false;
    size_t length = SIZE_MAX;
    while (conn_line(c, line, sizeof line) && line[0]) {
        if (strncasecmp(line, "Transfer-Encoding:", 18) == 0 && strcasestr(line, "chunked"))
            chunked = true;
        if (strncasecmp(line, "Content-Length:", 15) == 0)
            length = (size_t)strtoull(line + 15, NULL, 10);
    }
    if (!(chunked ? chunked_body(c, fn, ctx) : conn_body(c, length, fn, ctx))) status = -1;
out:
    if (c->fd >= 0) close(c->fd);
    free(c);
    return status;
}

/* ------------------------------------------------------------ requests -- */

typedef struct req_result {
    bool ok;
    double ttft, latency;
    int64_t n_out, n_prompt;
    double *itl;
    int64_t n_itl, cap_itl;
    char err[200];
} req_result;

/* SSE parsing state of one streaming response. */
typedef struct sse_ctx {
    double t0, t_last;
    bool got_first, done;
    req_result *res;
    char *line;
    size_t len, cap;
    bool overflow;
} sse_ctx;

static void push_itl(req_result *r, double v) {
    if (r->n_itl == r->cap_itl) {
        int64_t cap = r->cap_itl ? r->cap_itl * 2 : 64;
        double *p = realloc(r->itl, (size_t)cap * sizeof *p);
        if (!p) return;
        r->itl = p;
        r->cap_itl = cap;
    }
    r->itl[r->n_itl++] = v;
}

static void sse_data(sse_ctx *x, const char *payload) {
    if (strcmp(payload, "[DONE]") == 0) {
        x->done = true;
        return;
    }
    double now = kvl_time_s();
    cJSON *j = cJSON_Parse(payload);
    if (!j) return;
    const cJSON *err = cJSON_GetObjectItem(j, "error");
    if (err) {
        const cJSON *m = cJSON_GetObjectItem(err, "message");
        snprintf(x->res->err, sizeof x->res->err, "%s",
                 cJSON_IsString(m) ? m->valuestring : "error");
    }
    const cJSON *choices = cJSON_GetObjectItem(j, "choices");
    if (cJSON_GetArraySize(choices) > 0) {
        if (!x->got_first) x->res->ttft = now - x->t0;
        else push_itl(x->res, now - x->t_last);
        x->got_first = true;
        x->t_last = now;
    }
    const cJSON *usage = cJSON_GetObjectItem(j, "usage");
    if (cJSON_IsObject(usage)) {
        x->res->n_out =
            (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(usage, "completion_tokens"));
        x->res->n_prompt =
            (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(usage, "prompt_tokens"));
    }
    cJSON_Delete(j);
}

static void sse_bytes(const char *p, size_t n, void *ctx) {
    sse_ctx *x = ctx;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (x->len + 1 >= x->cap) {
                size_t cap = x->cap ? x->cap * 2 : 4096;
                char *l = realloc(x->line, cap);
                if (!l) {
                    x->overflow = true;
                    continue;
                }
                x->line = l;
                x->cap = cap;
            }
            x->line[x->len++] = p[i];
            continue;
        }
        if (x->len && x->line[x->len - 1] == '\r') x->len--;
        if (x->line) x->line[x->len] = 0;
        if (x->len > 6 && strncmp(x->line, "data: ", 6) == 0) sse_data(x, x->line + 6);
        else if (x->len > 5 && strncmp(x->line, "data:", 5) == 0) sse_data(x, x->line + 5);
        else if (x->len && x->line[0] == '{') sse_data(x, x->line); /* a JSON error body */
        x->len = 0;
    }
}

static void run_request(const url_parts *u, const char *api_key, const char *body,
                        req_result *res) {
    sse_ctx x = {.res = res};
    x.t0 = kvl_time_s();
    int status = http_exchange(u, "POST", "/v1/completions", body, api_key, sse_bytes, &x);
    sse_bytes("\n", 1, &x); /* a body that does not end with a newline */
    res->latency = kvl_time_s() - x.t0;
    res->ok = status == 200 && x.done && x.got_first && !res->err[0];
    if (!res->ok && !res->err[0])
        snprintf(res->err, sizeof res->err, status < 0 ? "connection failed" : "HTTP %d", status);
    free(x.line);
}

/* ------------------------------------------------------------- prompts -- */

static const char *const WORDS[] = {
    "the",   "of",     "and",   "to",      "in",   "is",    "it",    "that",  "was",    "for",
    "on",    "are",    "with",  "as",      "his",  "they",  "be",    "at",    "one",    "have",
    "this",  "from",   "or",    "had",     "by",   "hot",   "but",   "some",  "what",   "there",
    "we",    "can",    "out",   "other",   "were", "all",   "your",  "when",  "up",     "use",
    "word",  "how",    "said",  "an",      "each", "she",   "which", "do",    "their",  "time",
    "if",    "will",   "way",   "about",   "many", "then",  "them",  "would", "write",  "like",
    "so",    "these",  "her",   "long",    "make", "thing", "see",   "him",   "two",    "has",
    "look",  "more",   "day",   "could",   "go",   "come",  "did",   "my",    "sound",  "no",
    "most",  "number", "who",   "over",    "know", "water", "than",  "call",  "first",  "people",
    "may",   "down",   "side",  "been",    "now",  "find",  "any",   "new",   "work",   "part",
    "take",  "get",    "place", "made",    "live", "where", "after", "back",  "little", "only",
    "round", "man",    "year",  "came",    "show", "every", "good",  "me",    "give",   "our",
    "under", "name",   "very",  "through", "just", "form",  "much",  "great", "think",  "say",
    "help",  "low",    "line",  "before",  "turn", "cause", "same",  "mean",  "move",   "right",
    "boy",   "old",    "too",   "does",    "tell", "set",   "three", "want",  "air",    "well",
    "also",  "play",   "small", "end",     "put",  "home",  "read",  "hand",  "large",  "add",
    "even",  "land",   "here",  "must",    "big",  "high",  "such",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Prompt i: the shared prefix (the same words for every i), then its own words. */
static char *make_prompt(const loadgen_opts *o, int64_t i) {
    size_t cap = (size_t)o->prompt_tokens * 10 + 16, len = 0;
    char *p = malloc(cap);
    if (!p) return NULL;
    p[0] = 0;
    uint64_t shared = o->seed, own = o->seed ^ ((uint64_t)(i + 1) * 0xD1B54A32D192ED03ull);
    for (int64_t w = 0; w < o->prompt_tokens; w++) {
        uint64_t r = rng_next(w < o->shared_prefix ? &shared : &own);
        len += (size_t)snprintf(p + len, cap - len, "%s%s", w ? " " : "", WORDS[r % N_WORDS]);
    }
    return p;
}

static char *make_body(const loadgen_opts *o, const char *model, int64_t i) {
    char *prompt = make_prompt(o, i);
    if (!prompt) return NULL;
    cJSON *b = cJSON_CreateObject();
    if (model) cJSON_AddStringToObject(b, "model", model);
    cJSON_AddStringToObject(b, "prompt", prompt);
    cJSON_AddNumberToObject(b, "max_tokens", (double)o->max_tokens);
    cJSON_AddNumberToObject(b, "temperature", o->temperature);
    cJSON_AddBoolToObject(b, "ignore_eos", 1);
    if (o->has_priority) cJSON_AddNumberToObject(b, "priority", (double)o->priority);
    cJSON_AddBoolToObject(b, "stream", 1);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(b, "stream_options"), "include_usage", 1);
    char *s = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    free(prompt);
    return s;
}

/* ------------------------------------------------------------- workers -- */

typedef struct shared {
    const loadgen_opts *o;
    const url_parts *u;
    const char *model;
    req_result *results;
    atomic_llong next;
} shared;

static void *worker(void *arg) {
    shared *sh = arg;
    for (;;) {
        long long i = atomic_fetch_add(&sh->next, 1);
        if (i >= sh->o->requests) break;
        char *body = make_body(sh->o, sh->model, i);
        if (!body) {
            snprintf(sh->results[i].err, sizeof sh->results[i].err, "out of memory");
            continue;
        }
        run_request(sh->u, sh->o->api_key, body, &sh->results[i]);
        free(body);
    }
    return NULL;
}

typedef struct grab {
    char *p;
    size_t len;
} grab;

static void grab_bytes(const char *p, size_t n, void *ctx) {
    grab *g = ctx;
    if (g->len + n > (1u << 20)) return;
    char *q = realloc(g->p, g->len + n + 1);
    if (!q) return;
    memcpy(q + g->len, p, n);
    g->p = q;
    g->len += n;
    g->p[g->len] = 0;
}

/* The first model id the server lists. */
static char *discover_model(const url_parts *u, const char *api_key) {
    grab g = {0};
    int status = http_exchange(u, "GET", "/v1/models", NULL, api_key, grab_bytes, &g);
    char *id = NULL;
    cJSON *j = status == 200 && g.p ? cJSON_Parse(g.p) : NULL;
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(first, "id"));
    if (s) id = strdup(s);
    if (!id)
        fprintf(stderr, "kvllm loadgen: GET /v1/models failed (HTTP %d)%s%s\n", status,
                g.p ? ": " : "", g.p ? g.p : "");
    cJSON_Delete(j);
    free(g.p);
    return id;
}

/* -------------------------------------------------------------- report -- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct summary {
    double mean, p50, p95, p99;
} summary;

/* Percentiles with linear interpolation (numpy's default), in ms. */
static summary summarize(double *v, int64_t n) {
    summary s = {0};
    if (n == 0) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += v[i];
    s.mean = sum / (double)n * 1e3;
    const double ps[3] = {50, 95, 99};
    double *out[3] = {&s.p50, &s.p95, &s.p99};
    for (int k = 0; k < 3; k++) {
        double pos = ps[k] / 100.0 * (double)(n - 1);
        int64_t lo = (int64_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
        *out[k] = (v[lo] + (v[hi] - v[lo]) * (pos - (double)lo)) * 1e3;
    }
    return s;
}

typedef struct report {
    int64_t ok, failed, in_tokens, out_tokens;
    double duration;
    summary ttft, tpot, itl, e2el;
    const char *first_error;
} report;

static void build_report(const loadgen_opts *o, req_result *r, double duration, report *rep) {
    int64_t n = o->requests, n_itl = 0;
    for (int64_t i = 0; i < n; i++) n_itl += r[i].ok ? r[i].n_itl : 0;
    double *ttft = calloc((size_t)n + 1, sizeof *ttft), *tpot = calloc((size_t)n + 1, sizeof *tpot);
    double *e2el = calloc((size_t)n + 1, sizeof *e2el),
           *itl = calloc((size_t)n_itl + 1, sizeof *itl);
    int64_t n_tpot = 0, k = 0;
    memset(rep, 0, sizeof *rep);
    rep->duration = duration;
    for (int64_t i = 0; ttft && tpot && e2el && itl && i < n; i++) {
        if (!r[i].ok) {
            rep->failed++;
            if (!rep->first_error) rep->first_error = r[i].err;
            continue;
        }
        ttft[rep->ok] = r[i].ttft;
        e2el[rep->ok] = r[i].latency;
        rep->ok++;
        rep->in_tokens += r[i].n_prompt;
        rep->out_tokens += r[i].n_out;
        if (r[i].n_out > 1) tpot[n_tpot++] = (r[i].latency - r[i].ttft) / (double)(r[i].n_out - 1);
        for (int64_t t = 0; t < r[i].n_itl; t++) itl[k++] = r[i].itl[t];
    }
    rep->ttft = summarize(ttft, rep->ok);
    rep->tpot = summarize(tpot, n_tpot);
    rep->itl = summarize(itl, k);
    rep->e2el = summarize(e2el, rep->ok);
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
}

static void add_summary(cJSON *j, const char *name, summary s) {
    char key[48];
    snprintf(key, sizeof key, "mean_%s_ms", name);
    cJSON_AddNumberToObject(j, key, s.mean);
    snprintf(key, sizeof key, "median_%s_ms", name);
    cJSON_AddNumberToObject(j, key, s.p50);
    snprintf(key, sizeof key, "p95_%s_ms", name);
    cJSON_AddNumberToObject(j, key, s.p95);
    snprintf(key, sizeof key, "p99_%s_ms", name);
    cJSON_AddNumberToObject(j, key, s.p99);
}

static void print_json(const loadgen_opts *o, const report *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "concurrency", o->concurrency);
    cJSON_AddNumberToObject(j, "completed", (double)r->ok);
    cJSON_AddNumberToObject(j, "failed", (double)r->failed);
    cJSON_AddNumberToObject(j, "duration_s", r->duration);
    cJSON_AddNumberToObject(j, "total_input_tokens", (double)r->in_tokens);
    cJSON_AddNumberToObject(j, "total_output_tokens", (double)r->out_tokens);
    cJSON_AddNumberToObject(j, "request_throughput",
                            r->duration > 0 ? (double)r->ok / r->duration : 0);
    cJSON_AddNumberToObject(j, "output_throughput",
                            r->duration > 0 ? (double)r->out_tokens / r->duration : 0);
    cJSON_AddNumberToObject(j, "total_token_throughput",
                            r->duration > 0 ? (double)(r->in_tokens + r->out_tokens) / r->duration
                                            : 0);
    add_summary(j, "ttft", r->ttft);
    add_summary(j, "tpot", r->tpot);
    add_summary(j, "itl", r->itl);
    add_summary(j, "e2el", r->e2el);
    if (r->first_error) cJSON_AddStringToObject(j, "first_error", r->first_error);
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

static void print_summary(const char *title, const char *name, summary s) {
    printf("%-50s\n", title);
    printf("Mean %s (ms):%*s%.2f\n", name, (int)(36 - strlen(name)), "", s.mean);
    printf("Median %s (ms):%*s%.2f\n", name, (int)(34 - strlen(name)), "", s.p50);
    printf("P95 %s (ms):%*s%.2f\n", name, (int)(37 - strlen(name)), "", s.p95);
    printf("P99 %s (ms):%*s%.2f\n", name, (int)(37 - strlen(name)), "", s.p99);
}

static void print_human(const loadgen_opts *o, const report *r) {
    double d = r->duration > 0 ? r->duration : 1e-9;
    printf("============ Serving Benchmark Result ============\n");
    printf("%-40s%lld\n", "Successful requests:", (long long)r->ok);
    printf("%-40s%lld\n", "Failed requests:", (long long)r->failed);
    printf("%-40s%d\n", "Concurrency:", o->concurrency);
    printf("%-40s%.2f\n", "Benchmark duration (s):", r->duration);
    printf("%-40s%lld\n", "Total input tokens:", (long long)r->in_tokens);
    printf("%-40s%lld\n", "Total generated tokens:", (long long)r->out_tokens);
    printf("%-40s%.2f\n", "Request throughput (req/s):", (double)r->ok / d);
    printf("%-40s%.2f\n", "Output token throughput (tok/s):", (double)r->out_tokens / d);
    printf("%-40s%.2f\n",
           "Total token throughput (tok/s):", (double)(r->in_tokens + r->out_tokens) / d);
    print_summary("---------------Time to First Token----------------", "TTFT", r->ttft);
    print_summary("-----Time per Output Token (excl. 1st token)------", "TPOT", r->tpot);
    print_summary("---------------Inter-token Latency----------------", "ITL", r->itl);
    print_summary("----------------End-to-end Latency----------------", "E2EL", r->e2el);
    printf("==================================================\n");
    if (r->first_error) printf("first error: %s\n", r->first_error);
}

int loadgen_run(const loadgen_opts *o) {
    url_parts u;
    if (!parse_url(o->url, &u)) {
        fprintf(stderr, "kvllm loadgen: --url must look like http://host:port (got '%s')\n",
                o->url);
        return 2;
    }
    char *model = o->model ? strdup(o->model) : discover_model(&u, o->api_key);
    if (!model) return 2;
    req_result *res = calloc((size_t)o->requests, sizeof *res);
    pthread_t *th = calloc((size_t)o->concurrency, sizeof *th);
    shared sh = {.o = o, .u = &u, .model = model, .results = res};
    atomic_init(&sh.next, 0);
    int started = 0;
    double t0 = kvl_time_s();
    for (; res && th && started < o->concurrency; started++)
        if (pthread_create(&th[started], NULL, worker, &sh) != 0) break;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double duration = kvl_time_s() - t0;
    int rc = 2;
    if (res && started > 0) {
        report rep;
        build_report(o, res, duration, &rep);
        if (o->json) print_json(o, &rep);
        else print_human(o, &rep);
        rc = rep.failed ? 1 : 0;
    }
    for (int64_t i = 0; res && i < o->requests; i++) free(res[i].itl);
    free(res);
    free(th);
    free(model);
    return rc;
}
