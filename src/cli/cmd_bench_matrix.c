/* kvllm bench, llama-bench's way: a matrix of tests (every -m, -b, -ctk,
 * -ctv, -t, then every -d, then each -p, -n and -pg value), each run -r times through the real
 * engine and printed as a row of llama-bench's table or one of its records
 * (md, csv, json, jsonl, sql: the same fields in the same order, so the
 * scripts that read llama-bench's output read kvllm's).
 *
 * What each test times, as llama-bench does (its tokens per second are the
 * test's tokens over its time):
 *   ppP    a prompt of P random tokens, to its first token
 *   tgN    N forward passes of one token: a one-token prompt, then N - 1
 *          decoding steps
 *   ppP+tgN  a prompt of P, then N decoding steps
 *   @ dD   after D tokens already in the cache: llama-bench restores a saved
 *          state; here the D tokens are computed once (untimed) and the timed
 *          request finds them through the prefix cache (whole blocks: up to
 *          block size - 1 of them are computed again in the timed run, and a
 *          prefix the cache did not keep is reported on stderr)
 * Warm-ups as llama-bench's (a pp test's prompt, a tg test's one token) unless
 * --no-warmup. Fields that describe llama.cpp's devices and offloading carry
 * what they mean here (no GPU: n_gpu_layers 0, backends "CPU"); flash_attn
 * is 0 because kvllm's attention computes what llama.cpp's -fa off does. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd_bench.h"
#include "kernels.h"
#include "kv.h"
#include "kvl_pool.h"

#include <omp.h>

/* --------------------------------------------------------- the lists -- */

static bool list_add(const char *flag, bench_list *l, int64_t x) {
    if (l->n == BENCH_MAX_LIST) {
        fprintf(stderr, "kvllm bench: %s: at most %d values\n", flag, BENCH_MAX_LIST);
        return false;
    }
    l->v[l->n++] = x;
    return true;
}

static bool read_int(const char **p, int64_t *x) {
    char *end;
    if (**p < '0' || **p > '9') return false;
    errno = 0;
    long long v = strtoll(*p, &end, 10);
    if (errno || v > INT32_MAX) return false;
    *x = v;
    *p = end;
    return true;
}

bool bench_list_parse(const char *flag, const char *v, bench_list *l) {
    const char *p = v;
    while (p && *p) {
        int64_t first, last, step = 1;
        char op = '+';
        bool ok = read_int(&p, &first);
        last = first;
        if (ok && *p == '-') {
            p++;
            ok = read_int(&p, &last);
            if (ok && (*p == '+' || *p == '*')) {
                op = *p++;
                ok = read_int(&p, &step);
            }
        }
        ok = ok && (*p == ',' || *p == 0) && last >= first;
        for (int64_t x = first; ok && x <= last;) {
            ok = list_add(flag, l, x);
            const int64_t next = op == '+' ? x + step : x * step;
            if (next <= x) {
                fprintf(stderr, "kvllm bench: %s: the range %s never ends\n", flag, v);
                return false;
            }
            x = next;
        }
        if (!ok) {
            if (l->n < BENCH_MAX_LIST)
                fprintf(stderr,
                        "kvllm bench: %s: expected values >= 0 like 512, 128,512, 128-512*2 or "
                        "1-4+1 (got '%s')\n",
                        flag, v);
            return false;
        }
        p += *p == ',';
    }
    if (!v || !*v) fprintf(stderr, "kvllm bench: %s: expected a value\n", flag);
    return v && *v;
}

void bench_matrix_defaults(bench_matrix *mx, const cli_opts *o) {
    if (!mx->n_models) /* NULL: the bundled one */
        mx->models[mx->n_models++] = o->model_path ? strdup(o->model_path) : NULL;
    if (!mx->batch.n) list_add("-b", &mx->batch, o->batch_tokens);
    if (!mx->n_type_k) mx->type_k[mx->n_type_k++] = o->kv_dtype;
    if (!mx->n_type_v)
        mx->type_v[mx->n_type_v++] = o->kv_dtype_v >= 0 ? o->kv_dtype_v : o->kv_dtype;
    if (!mx->prompt.n) list_add("-p", &mx->prompt, 512);
    if (!mx->gen.n) list_add("-n", &mx->gen, 128);
    if (!mx->depth.n) list_add("-d", &mx->depth, 0);
    if (!mx->threads.n) list_add("-t", &mx->threads, kvl_pool_threads());
    if (mx->out == BENCH_FMT_NONE && mx->out_err == BENCH_FMT_NONE) mx->out = BENCH_FMT_MD;
}

/* ---------------------------------------------------------- the tests -- */

typedef struct test {
    int64_t n_prompt, n_gen, n_depth;
    int threads;
    int model;       /* index into bench_matrix.models */
    int64_t n_batch; /* -b: tokens a step takes at most */
    int type_k, type_v;
} test;

/* The tests in llama-bench's order. Returns how many (at most max). */
static int matrix_tests(const bench_matrix *mx, test *t, int max) {
    int n = 0;
    for (int im = 0; im < mx->n_models; im++)
        for (int ib = 0; ib < mx->batch.n; ib++)
            for (int ik = 0; ik < mx->n_type_k; ik++)
                for (int iv = 0; iv < mx->n_type_v; iv++)
                    for (int it = 0; it < mx->threads.n; it++)
                        for (int id = 0; id < mx->depth.n; id++) {
                            const test base = {.n_depth = mx->depth.v[id],
                                               .threads = (int)mx->threads.v[it],
                                               .model = im,
                                               .n_batch = mx->batch.v[ib],
                                               .type_k = mx->type_k[ik],
                                               .type_v = mx->type_v[iv]};
                            for (int i = 0; i < mx->prompt.n && n < max; i++)
                                if (mx->prompt.v[i] > 0)
                                    t[n] = base, t[n++].n_prompt = mx->prompt.v[i];
                            for (int i = 0; i < mx->gen.n && n < max; i++)
                                if (mx->gen.v[i] > 0) t[n] = base, t[n++].n_gen = mx->gen.v[i];
                            for (int i = 0; i < mx->n_pg && n < max; i++)
                                if (mx->pg[i][0] > 0 || mx->pg[i][1] > 0) {
                                    t[n] = base;
                                    t[n].n_prompt = mx->pg[i][0];
                                    t[n++].n_gen = mx->pg[i][1];
                                }
                        }
    return n;
}

/* Tokens the timed request computes beyond the depth: the prompt (one token
 * for tg alone), and with a prompt and tokens to generate, one more output so
 * that every generated token is a forward pass of its own. */
static int64_t test_new_prompt(const test *t) { return t->n_prompt > 0 ? t->n_prompt : 1; }
static int64_t test_outputs(const test *t) {
    return t->n_gen == 0 ? 1 : t->n_prompt > 0 ? t->n_gen + 1 : t->n_gen;
}
static int64_t test_context(const test *t) {
    return t->n_depth + test_new_prompt(t) + test_outputs(t) + 1;
}

int64_t bench_matrix_longest(const bench_matrix *mx) {
    test *t = malloc(4096 * sizeof *t);
    if (!t) return 16;
    const int n = matrix_tests(mx, t, 4096);
    int64_t most = 16;
    for (int i = 0; i < n; i++)
        if (test_context(&t[i]) > most) most = test_context(&t[i]);
    free(t);
    return most;
}

/* ----------------------------------------------------------- the runs -- */

typedef struct run {
    bool done;
    int64_t generated, cached;
    const char *error;
    char error_buf[256];
} run;

static void on_event(const engine_event *ev, void *user) {
    run *r = user;
    if (ev->finish == ENGINE_FINISH_NONE) return;
    r->done = true;
    r->generated = ev->stats->n_generated;
    r->cached = ev->stats->n_cached_prompt;
    if (ev->finish == ENGINE_FINISH_ERROR) {
        snprintf(r->error_buf, sizeof r->error_buf, "%s", ev->error ? ev->error : "error");
        r->error = r->error_buf;
    }
}

typedef struct runner {
    cli_opts o;   /* the command line's, with the test's -b, -ctk and -ctv */
    cli_model cm; /* the test's model, loaded */
    int model;    /* its index in bench_matrix.models, -1: none yet */
    uint64_t rng;
} runner;

static void random_ids(runner *rn, int32_t *ids, int64_t n) {
    bench_random_ids(&rn->rng, model_hp(rn->cm.m)->n_vocab, ids, n);
}

/* One request of ids to max_tokens outputs, to its end; its seconds (< 0:
 * failed, said why). */
static double run_request(engine *e, const int32_t *ids, int64_t n, int64_t max_tokens, run *r) {
    const engine_request q = bench_request(ids, n, max_tokens, on_event, r);
    *r = (run){0};
    kvl_error err = {{0}};
    const double t0 = kvl_time_s();
    if (engine_submit(e, &q, &err) < 0) {
        fprintf(stderr, "kvllm bench: %s\n", err.msg);
        return -1;
    }
    while (!r->done)
        if (!engine_step(e, &err)) {
            fprintf(stderr, "kvllm bench: %s\n", err.msg);
            return -1;
        }
    const double s = kvl_time_s() - t0;
    if (r->error || r->generated != max_tokens) {
        fprintf(stderr, "kvllm bench: a run ended after %lld of %lld tokens%s%s\n",
                (long long)r->generated, (long long)max_tokens, r->error ? ": " : "",
                r->error ? r->error : "");
        return -1;
    }
    return s;
}

typedef struct result {
    test t;
    char time[32];   /* when the test started, RFC 3339 */
    double ns[1000]; /* per repetition */
    int n;
} result;

static void progress(const bench_matrix *mx, int i, int n, const char *what, int rep, int reps) {
    if (!mx->progress) return;
    if (rep > 0) fprintf(stderr, "kvllm bench: benchmark %d/%d: %s %d/%d\n", i, n, what, rep, reps);
    else fprintf(stderr, "kvllm bench: benchmark %d/%d: %s\n", i, n, what);
}

/* Runs test t (number i of n) reps times into res. */
static bool run_test(runner *rn, const bench_matrix *mx, const test *t, int i, int n, int reps,
                     bool warmup, result *res) {
    kvl_pool_set_threads(t->threads);
    omp_set_num_threads(t->threads);
    rn->o.batch_tokens = t->n_batch;
    rn->o.kv_dtype = t->type_k;
    rn->o.kv_dtype_v = t->type_v;
    const int64_t bs = rn->o.block_size, ctx = test_context(t);
    /* room for the depth's blocks and a timed request beside them */
    const int64_t blocks = 2 * ((ctx + bs - 1) / bs) + 2;
    engine *e = bench_engine_new(&rn->o, &rn->cm, 1, ctx, 0, blocks, false);
    const int64_t n_ids = t->n_depth + test_new_prompt(t);
    int32_t *ids = malloc((size_t)(n_ids > 1 ? n_ids : 1) * sizeof *ids);
    bool ok = e && ids;
    run r;
    if (mx->delay_s > 0) sleep((unsigned)mx->delay_s);
    const time_t now = time(NULL);
    strftime(res->time, sizeof res->time, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    res->t = *t;
    res->n = 0;
    if (ok && warmup && t->n_prompt > 0) {
        progress(mx, i, n, "warmup prompt run", 0, 0);
        random_ids(rn, ids, t->n_prompt);
        ok = run_request(e, ids, t->n_prompt, 1, &r) >= 0;
    }
    if (ok && warmup && t->n_gen > 0) {
        progress(mx, i, n, "warmup generation run", 0, 0);
        random_ids(rn, ids, 1);
        ok = run_request(e, ids, 1, 1, &r) >= 0;
    }
    if (ok && t->n_depth > 0) random_ids(rn, ids, t->n_depth); /* the same depth every time */
    if (ok && t->n_depth % bs)
        fprintf(stderr,
                "kvllm bench: depth %lld is not a whole number of %lld-token blocks: each timed "
                "run computes its last %lld tokens again\n",
                (long long)t->n_depth, (long long)bs, (long long)(t->n_depth % bs));
    bool told = false;
    for (int rep = 1; ok && rep <= reps; rep++) {
        if (t->n_depth > 0) {
            progress(mx, i, n, "depth run", rep, reps);
            ok = run_request(e, ids, t->n_depth, 1, &r) >= 0;
        }
        progress(mx, i, n, t->n_prompt > 0 ? "prompt run" : "generation run", rep, reps);
        random_ids(rn, ids + t->n_depth, test_new_prompt(t)); /* fresh: nothing shared */
        const double s = ok ? run_request(e, ids, n_ids, test_outputs(t), &r) : -1;
        ok = s >= 0;
        if (ok) res->ns[res->n++] = s * 1e9;
        const int64_t reused = t->n_depth / bs * bs;
        if (ok && r.cached < reused && !told) {
            told = true;
            fprintf(stderr,
                    "kvllm bench: depth %lld: the prefix cache gave %lld of its %lld whole-block "
                    "tokens; the timed run computed the rest\n",
                    (long long)t->n_depth, (long long)r.cached, (long long)reused);
        }
    }
    free(ids);
    engine_destroy(e);
    return ok;
}

/* -------------------------------------------------------- the records -- */

typedef enum { F_STR, F_BOOL, F_INT, F_FLOAT } field_kind;

typedef struct field {
    const char *name;
    field_kind kind;
    char value[512];
} field;

enum { N_FIELDS = 41 };

/* Tokens per second of each repetition. */
static void result_ts(const result *r, double *ts) {
    for (int i = 0; i < r->n; i++) ts[i] = 1e9 * (double)(r->t.n_prompt + r->t.n_gen) / r->ns[i];
}

/* llama.cpp's description of the model: architecture, size label ("?B"
 * without general.size_label) and file type ("(guessed) ..." from the
 * tensors without general.file_type). */
static void model_desc(const model *m, char *out, size_t cap) {
    const gguf_file *f = model_gguf(m);
    char label[64] = "?B", type[96];
    gguf_get_str_buf(f, "general.size_label", label, sizeof label);
    gguf_file_type_describe(f, type, sizeof type);
    snprintf(out, cap, "%s %s %s", model_hp(m)->arch, label, type);
}

#define FS(NAME, ...) (f[k] = (field){NAME, F_STR, ""}, snprintf(f[k++].value, 512, __VA_ARGS__))
#define FB(NAME, V)   (f[k] = (field){NAME, F_BOOL, ""}, snprintf(f[k++].value, 512, "%d", (V)))
#define FI(NAME, V)                                                                                \
    (f[k] = (field){NAME, F_INT, ""}, snprintf(f[k++].value, 512, "%lld", (long long)(V)))
#define FF(NAME, V) (f[k] = (field){NAME, F_FLOAT, ""}, snprintf(f[k++].value, 512, "%f", (V)))

/* llama-bench's fields of a result, in its order. */
static int result_fields(const runner *rn, const result *r, field *f) {
    const model *m = rn->cm.m;
    const cli_opts *o = &rn->o;
    double ts[1000];
    result_ts(r, ts);
    char desc[256];
    model_desc(m, desc, sizeof desc);
    const char *tk = kv_dtype_name(r->t.type_k), *tv = kv_dtype_name(r->t.type_v);
    int k = 0;
    FS("build_commit", "kvllm %s", KVLLM_VERSION);
    FI("build_number", 0);
    FS("cpu_info", "%s", kern_cpu_name());
    FS("gpu_info", "%s", "");
    FS("backends", "CPU");
    FS("model_filename", "%s", gguf_path(model_gguf(m)));
    FS("model_type", "%s", desc);
    FI("model_size", gguf_tensor_data_bytes(model_gguf(m)));
    FI("model_n_params", model_hp(m)->n_params);
    FI("n_batch", r->t.n_batch);
    FI("n_ubatch", o->ubatch);
    FI("n_threads", r->t.threads);
    FS("cpu_mask", "0x0");
    FB("cpu_strict", 0);
    FI("poll", 50);
    FS("type_k", "%s", tk);
    FS("type_v", "%s", tv);
    FI("n_gpu_layers", 0);
    FI("n_cpu_moe", 0);
    FS("split_mode", "none");
    FI("main_gpu", 0);
    FB("no_kv_offload", 0);
    FI("flash_attn", 0);
    FS("devices", "CPU");
    FS("tensor_split", "0.00");
    FS("tensor_buft_overrides", "none");
    FB("use_mmap", 1);
    FB("use_direct_io", 0);
    FB("embeddings", 0);
    FI("no_op_offload", 0);
    FB("no_host", 0);
    FI("fit_target", 0);
    FI("fit_min_ctx", 0);
    FI("n_prompt", r->t.n_prompt);
    FI("n_gen", r->t.n_gen);
    FI("n_depth", r->t.n_depth);
    FS("test_time", "%s", r->time);
    FI("avg_ns", llround(bench_mean(r->ns, r->n)));
    FI("stddev_ns", llround(bench_sd(r->ns, r->n)));
    FF("avg_ts", bench_mean(ts, r->n));
    FF("stddev_ts", bench_sd(ts, r->n));
    return k;
}

/* --------------------------------------------------------- the formats -- */

static void csv_quoted(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"') fputc('"', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

static cJSON *result_json(const runner *rn, const result *r) {
    field f[N_FIELDS];
    const int n = result_fields(rn, r, f);
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < n; i++) {
        if (f[i].kind == F_STR) cJSON_AddStringToObject(o, f[i].name, f[i].value);
        else if (f[i].kind == F_BOOL) cJSON_AddBoolToObject(o, f[i].name, strcmp(f[i].value, "0"));
        else cJSON_AddNumberToObject(o, f[i].name, strtod(f[i].value, NULL));
    }
    double ts[1000];
    result_ts(r, ts);
    cJSON *ns = cJSON_AddArrayToObject(o, "samples_ns");
    cJSON *tsa = cJSON_AddArrayToObject(o, "samples_ts");
    for (int i = 0; i < r->n; i++) {
        cJSON_AddItemToArray(ns, cJSON_CreateNumber(llround(r->ns[i])));
        cJSON_AddItemToArray(tsa, cJSON_CreateNumber(ts[i]));
    }
    return o;
}

/* The md table's columns: llama-bench's, with n_batch, n_ubatch, type_k and
 * type_v only where they differ from its defaults. */
typedef struct md_col {
    const char *field, *title;
    int width; /* < 0: left-aligned */
} md_col;

static int md_columns(const bench_matrix *mx, const cli_opts *o, md_col *c) {
    int n = 0;
    c[n++] = (md_col){"model", "model", -30};
    c[n++] = (md_col){"size", "size", 10};
    c[n++] = (md_col){"params", "params", 10};
    c[n++] = (md_col){"backends", "backend", -10};
    c[n++] = (md_col){"n_threads", "threads", 7};
    if (mx->batch.n > 1 || mx->batch.v[0] != 2048) c[n++] = (md_col){"n_batch", "n_batch", 7};
    if (o->ubatch != 512) c[n++] = (md_col){"n_ubatch", "n_ubatch", 8};
    if (mx->n_type_k > 1 || strcmp(kv_dtype_name(mx->type_k[0]), "f16"))
        c[n++] = (md_col){"type_k", "type_k", 6};
    if (mx->n_type_v > 1 || strcmp(kv_dtype_name(mx->type_v[0]), "f16"))
        c[n++] = (md_col){"type_v", "type_v", 6};
    c[n++] = (md_col){"test", "test", 15};
    c[n++] = (md_col){"t/s", "t/s", 20};
    return n;
}

static void md_header(FILE *out, const bench_matrix *mx, const cli_opts *o) {
    md_col c[12];
    const int n = md_columns(mx, o, c);
    fprintf(out, "|");
    for (int i = 0; i < n; i++) fprintf(out, " %*s |", c[i].width, c[i].title);
    fprintf(out, "\n|");
    for (int i = 0; i < n; i++) {
        const int w = abs(c[i].width);
        fputc(' ', out);
        for (int d = 0; d < w - 1; d++) fputc('-', out);
        fprintf(out, "%c |", c[i].width > 0 ? ':' : '-');
    }
    fprintf(out, "\n");
}

static void md_row(FILE *out, const bench_matrix *mx, const runner *rn, const result *r) {
    field f[N_FIELDS];
    const int nf = result_fields(rn, r, f);
    md_col c[12];
    const int n = md_columns(mx, &rn->o, c);
    const test *t = &r->t;
    double ts[1000];
    result_ts(r, ts);
    fprintf(out, "|");
    for (int i = 0; i < n; i++) {
        char v[256] = "";
        int w = c[i].width;
        const double size = (double)gguf_tensor_data_bytes(model_gguf(rn->cm.m));
        const double params = (double)model_hp(rn->cm.m)->n_params;
        if (!strcmp(c[i].field, "model")) model_desc(rn->cm.m, v, sizeof v);
        else if (!strcmp(c[i].field, "size"))
            snprintf(v, sizeof v, size < 1073741824.0 ? "%.2f MiB" : "%.2f GiB",
                     size < 1073741824.0 ? size / 1048576.0 : size / 1073741824.0);
        else if (!strcmp(c[i].field, "params"))
            snprintf(v, sizeof v, params < 1e9 ? "%.2f M" : "%.2f B",
                     params < 1e9 ? params / 1e6 : params / 1e9);
        else if (!strcmp(c[i].field, "test")) {
            int l = t->n_gen == 0      ? snprintf(v, sizeof v, "pp%lld", (long long)t->n_prompt)
                    : t->n_prompt == 0 ? snprintf(v, sizeof v, "tg%lld", (long long)t->n_gen)
                                       : snprintf(v, sizeof v, "pp%lld+tg%lld",
                                                  (long long)t->n_prompt, (long long)t->n_gen);
            if (t->n_depth > 0) snprintf(v + l, sizeof v - l, " @ d%lld", (long long)t->n_depth);
        } else if (!strcmp(c[i].field, "t/s")) {
            snprintf(v, sizeof v, "%.2f \xC2\xB1 %.2f", bench_mean(ts, r->n), bench_sd(ts, r->n));
            w += 1; /* the two bytes of U+00B1 take one column */
        } else
            for (int j = 0; j < nf; j++)
                if (!strcmp(f[j].name, c[i].field)) snprintf(v, sizeof v, "%s", f[j].value);
        fprintf(out, " %*s |", w, v);
    }
    fprintf(out, "\n");
}

typedef struct printer {
    FILE *out;
    bench_format fmt;
    const bench_matrix *mx;
    int printed;
} printer;

static void print_header(printer *p, const runner *rn) {
    if (p->fmt == BENCH_FMT_MD) md_header(p->out, p->mx, &rn->o);
    else if (p->fmt == BENCH_FMT_JSON) fprintf(p->out, "[\n");
    else if (p->fmt == BENCH_FMT_CSV || p->fmt == BENCH_FMT_SQL) {
        /* the names come from a result's fields: the same list for every result */
        result dummy = {0};
        field f[N_FIELDS];
        const int n = result_fields(rn, &dummy, f);
        if (p->fmt == BENCH_FMT_SQL) fprintf(p->out, "CREATE TABLE IF NOT EXISTS llama_bench (\n");
        for (int i = 0; i < n; i++) {
            if (p->fmt == BENCH_FMT_CSV) fprintf(p->out, "%s%s", i ? "," : "", f[i].name);
            else
                fprintf(p->out, "  %s %s%s\n", f[i].name,
                        f[i].kind == F_STR     ? "TEXT"
                        : f[i].kind == F_FLOAT ? "REAL"
                                               : "INTEGER",
                        i < n - 1 ? "," : "");
        }
        fprintf(p->out, p->fmt == BENCH_FMT_CSV ? "\n" : ");\n\n");
    }
    fflush(p->out);
}

static void print_result(printer *p, const runner *rn, const result *r) {
    field f[N_FIELDS];
    const int n = result_fields(rn, r, f);
    switch (p->fmt) {
    case BENCH_FMT_MD: md_row(p->out, p->mx, rn, r); break;
    case BENCH_FMT_CSV:
        for (int i = 0; i < n; i++) {
            if (i) fputc(',', p->out);
            csv_quoted(p->out, f[i].value);
        }
        fputc('\n', p->out);
        break;
    case BENCH_FMT_SQL:
        fprintf(p->out, "INSERT INTO llama_bench (");
        for (int i = 0; i < n; i++) fprintf(p->out, "%s%s", i ? ", " : "", f[i].name);
        fprintf(p->out, ") VALUES (");
        for (int i = 0; i < n; i++) {
            fprintf(p->out, "%s'", i ? ", " : "");
            for (const char *s = f[i].value; *s; s++) /* a quote doubled, as SQL has it */
                fprintf(p->out, *s == '\'' ? "''" : "%c", *s);
            fputc('\'', p->out);
        }
        fprintf(p->out, ");\n");
        break;
    case BENCH_FMT_JSON:
    case BENCH_FMT_JSONL: {
        cJSON *j = result_json(rn, r);
        char *s = p->fmt == BENCH_FMT_JSON ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
        if (s)
            fprintf(p->out, "%s%s%s", p->fmt == BENCH_FMT_JSON && p->printed ? ",\n" : "", s,
                    p->fmt == BENCH_FMT_JSONL ? "\n" : "");
        free(s);
        cJSON_Delete(j);
        break;
    }
    case BENCH_FMT_NONE: break;
    }
    p->printed++;
    fflush(p->out);
}

static void print_footer(printer *p) {
    if (p->fmt == BENCH_FMT_MD) fprintf(p->out, "\nbuild: kvllm %s (0)\n", KVLLM_VERSION);
    else if (p->fmt == BENCH_FMT_JSON) fprintf(p->out, "%s]\n", p->printed ? "\n" : "");
    fflush(p->out);
}

/* ------------------------------------------------------------ the run -- */

/* Loads test t's model into rn unless it is there: false (said why) if it does not load. */
static bool load_model(runner *rn, const cli_opts *o, const bench_matrix *mx, const test *t) {
    if (rn->model == t->model) return true;
    cli_unload(&rn->cm);
    rn->model = -1;
    cli_opts om = *o;
    om.model_path = mx->models[t->model];
    om.n_ctx = bench_matrix_longest(mx);
    if (!cli_load(&om, true, &rn->cm)) return false;
    rn->model = t->model;
    return true;
}

int bench_matrix_run(const cli_opts *o, const bench_matrix *mx, int reps, bool warmup) {
    enum { MAX_TESTS = 4096 };
    test *tests = malloc(MAX_TESTS * sizeof *tests);
    result *res = malloc(sizeof *res);
    runner *rn = calloc(1, sizeof *rn);
    const int n = tests ? matrix_tests(mx, tests, MAX_TESTS) : 0;
    bool ok = tests && res && rn && n > 0;
    if (!ok)
        fprintf(stderr, tests && res && rn
                            ? "kvllm bench: no test to run (every -p, -n and -pg is 0)\n"
                            : "kvllm bench: out of memory\n");
    if (rn) *rn = (runner){.o = *o, .model = -1, .rng = 0x9E3779B97F4A7C15ull};
    printer ps[2] = {{stdout, mx->out, mx, 0}, {stderr, mx->out_err, mx, 0}};
    bool headed =
        false; /* the headers follow the first model's load (csv and sql name its fields) */
    for (int i = 0; ok && i < n; i++) {
        progress(mx, i + 1, n, "starting", 0, 0);
        ok = load_model(rn, o, mx, &tests[i]);
        for (int p = 0; ok && !headed && p < 2; p++)
            if (ps[p].fmt != BENCH_FMT_NONE) print_header(&ps[p], rn);
        headed = headed || ok;
        ok = ok && run_test(rn, mx, &tests[i], i + 1, n, reps > 1000 ? 1000 : reps, warmup, res);
        for (int p = 0; ok && p < 2; p++)
            if (ps[p].fmt != BENCH_FMT_NONE) print_result(&ps[p], rn, res);
    }
    for (int p = 0; headed && p < 2; p++)
        if (ps[p].fmt != BENCH_FMT_NONE) print_footer(&ps[p]);
    if (rn) cli_unload(&rn->cm);
    free(tests);
    free(res);
    free(rn);
    return ok ? 0 : 1;
}
