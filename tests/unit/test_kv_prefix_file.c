/* Prefix files (llama-server's slot files; kv_disk.h, engine_kv_export /
 * engine_kv_import): a prompt's KV written by one engine and read into a fresh
 * one gives exactly the greedy ids of a run that computes everything, with
 * the prompt's blocks served from the cache; a file of another model, cache
 * type or block size, a damaged, truncated or foreign file, or one too large
 * for the pool is refused with a message naming the cause, and leaves the
 * pool as it was. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "engine.h"
#include "test_dir.h"
#include "test_model.h"

#define MODEL    "models/stories260K.gguf"
#define N_PROMPT 83 /* five full blocks of 16 and three tokens more */
#define N_GEN    8

typedef struct run_out {
    int32_t ids[N_GEN + 4];
    int n;
    int64_t cached;
} run_out;

static model *g_model;
static tok_vocab *g_vocab;
static uint8_t g_id[16];
static int32_t g_prompt[N_PROMPT];

static void on_event(const engine_event *ev, void *user) {
    run_out *o = user;
    if (ev->token >= 0 && o->n < N_GEN + 4) o->ids[o->n++] = ev->token;
    if (ev->finish) o->cached = ev->stats->n_cached_prompt;
}

static engine *make_engine(int dtype, int block_size, int64_t n_blocks, bool prefix) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    c.max_seqs = 1;
    c.kv_dtype = dtype;
    c.block_size = block_size;
    c.n_blocks = n_blocks;
    c.prefix_cache = prefix;
    kvl_error err;
    engine *e = engine_create(g_model, g_vocab, &c, &err);
    if (!e) fprintf(stderr, "engine_create: %s\n", err.msg);
    return e;
}

static void run_prompt(engine *e, run_out *o) {
    memset(o, 0, sizeof *o);
    if (!submit_greedy(e, g_prompt, N_PROMPT, N_GEN, NULL, on_event, o) || !run_until_idle(e))
        failures++;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Copies src to dst with byte `at` xor-ed by x (at < 0: none), cut to len bytes (< 0: whole). */
static void copy_altered(const char *src, const char *dst, long at, int x, long len) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    long i = 0;
    for (int c; in && out && (c = fgetc(in)) != EOF && (len < 0 || i < len); i++)
        fputc(i == at ? c ^ x : c, out);
    if (in) fclose(in);
    if (out) fclose(out);
}

static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    for (int ca = 0, cb = 0; same && (ca != EOF || cb != EOF);)
        same = (ca = fgetc(fa)) == (cb = fgetc(fb));
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Imports path into e, expecting a refusal whose message contains `why`, and the pool unchanged. */
static void expect_refused(engine *e, const char *path, const uint8_t *id, const char *why) {
    const int64_t free_before = kv_pool_n_free(engine_kv(e));
    int32_t *ids = NULL;
    int64_t n = -1;
    uint64_t bytes = 0, root = 0;
    kvl_error err = {{0}};
    const int64_t got = engine_kv_import(e, path, id, &ids, &n, &root, &bytes, &err);
    CHECK(got == -1 && ids == NULL && n == 0, "%s: imported %lld tokens", path, (long long)got);
    CHECK(strstr(err.msg, why) != NULL, "%s: the error '%s' does not say '%s'", path, err.msg, why);
    CHECK(kv_pool_n_free(engine_kv(e)) == free_before, "%s: the pool lost blocks", path);
    kvl_error cerr = {{0}};
    CHECK(kv_pool_check(engine_kv(e), &cerr), "%s: %s", path, cerr.msg);
    free(ids);
}

int main(void) {
    kvl_error err = {{0}};
    g_model = load_test_model_id(MODEL, 128, 64, &g_vocab, g_id);
    if (!g_model) return 1;
    srand(5);
    for (int k = 0; k < N_PROMPT; k++)
        g_prompt[k] = 3 + rand() % (int)(model_hp(g_model)->n_vocab - 3);
    char dir[] = "/tmp/kvllm_test_prefix_file_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[4200], bad[4200];
    snprintf(path, sizeof path, "%s/slot.bin", dir);
    snprintf(bad, sizeof bad, "%s/bad.bin", dir);

    /* the reference: every token computed, no cache */
    run_out ref, got;
    engine *e = make_engine(GGUF_DT_F16, 16, 16, false);
    run_prompt(e, &ref);
    uint64_t bytes = 0;
    CHECK(engine_kv_export(e, g_prompt, N_PROMPT, NULL, NULL, 0, path, g_id, &bytes, &err) == -1 &&
              strstr(err.msg, "prefix cache is off"),
          "export without a prefix cache: %s", err.msg);
    engine_destroy(e);
    CHECK(ref.n == N_GEN, "reference run: %d ids", ref.n);

    /* written by one engine ... */
    e = make_engine(GGUF_DT_F16, 16, 16, true);
    const int64_t saved =
        engine_kv_export(e, g_prompt, N_PROMPT, NULL, NULL, 0, path, g_id, &bytes, &err);
    CHECK(saved == 80, "export: %lld tokens (%s)", (long long)saved, err.msg);
    CHECK(bytes > 0 && (long)bytes == file_size(path), "export: %llu bytes, the file %ld",
          (unsigned long long)bytes, file_size(path));
    CHECK(count_files(dir, ".tmp") == 0, "a temporary file was left behind");
    engine_destroy(e);

    /* ... read by another: the prompt's blocks come from the file, the ids are the reference's */
    e = make_engine(GGUF_DT_F16, 16, 16, true);
    int32_t *ids = NULL;
    int64_t n = 0;
    uint64_t read = 0, root = 0;
    const int64_t restored = engine_kv_import(e, path, g_id, &ids, &n, &root, &read, &err);
    CHECK(restored == 80 && n == N_PROMPT && read == bytes,
          "import: %lld tokens, %lld ids, %llu bytes (%s)", (long long)restored, (long long)n,
          (unsigned long long)read, err.msg);
    CHECK(ids && memcmp(ids, g_prompt, sizeof g_prompt) == 0, "import: other token ids");
    free(ids);
    run_prompt(e, &got);
    CHECK(got.cached == 80, "the prompt found %lld tokens cached, not 80", (long long)got.cached);
    CHECK(got.n == ref.n && memcmp(got.ids, ref.ids, sizeof ref.ids) == 0,
          "greedy ids after the import differ from the reference");
    /* importing again changes nothing: the blocks are cached already */
    ids = NULL;
    CHECK(engine_kv_import(e, path, g_id, &ids, &n, &root, &read, &err) == 80, "second import: %s",
          err.msg);
    free(ids);
    kvl_error cerr = {{0}};
    CHECK(kv_pool_check(engine_kv(e), &cerr), "%s", cerr.msg);
    /* saved again under the chain the file named (no salt known): the same file */
    char path2[4300];
    snprintf(path2, sizeof path2, "%s/again.bin", dir);
    uint64_t bytes2 = 0;
    CHECK(engine_kv_export(e, g_prompt, N_PROMPT, NULL, NULL, root, path2, g_id, &bytes2, &err) ==
              80,
          "export under the file's chain: %s", err.msg);
    CHECK(bytes2 == bytes && same_file(path, path2), "a restored prefix saved again differs");

    /* refusals, each naming its cause */
    const long size = file_size(path);
    uint8_t other[16];
    memcpy(other, g_id, 16);
    other[3] ^= 1;
    expect_refused(e, path, other, "another model file");
    expect_refused(e, bad, g_id, "cannot open"); /* not there */
    copy_altered(path, bad, size - 7, 0x10, -1);
    expect_refused(e, bad, g_id, "contents' checksum");
    copy_altered(path, bad, 200, 0x01, -1); /* a token id */
    expect_refused(e, bad, g_id, "contents' checksum");
    copy_altered(path, bad, 140, 0x01, -1); /* the token count, in the header */
    expect_refused(e, bad, g_id, "header's checksum");
    copy_altered(path, bad, -1, 0, size - 100);
    expect_refused(e, bad, g_id, "where its header says");
    copy_altered(path, bad, -1, 0, 100);
    expect_refused(e, bad, g_id, "not a kvllm slot file");
    copy_altered(MODEL, bad, -1, 0, 4096);
    expect_refused(e, bad, g_id, "not a kvllm slot file");
    engine_destroy(e);

    /* a chain named by root alone cannot be computed: its blocks must be cached */
    e = make_engine(GGUF_DT_F16, 16, 16, true);
    CHECK(engine_kv_export(e, g_prompt, N_PROMPT, NULL, NULL, root, path2, g_id, &bytes2, &err) ==
                  -1 &&
              strstr(err.msg, "no longer cached"),
          "export of an uncached chain: %s", err.msg);
    engine_destroy(e);
    e = make_engine(GGUF_DT_F32, 16, 16, true);
    expect_refused(e, path, g_id, "another KV cache type");
    engine_destroy(e);
    e = make_engine(GGUF_DT_F16, 32, 8, true);
    expect_refused(e, path, g_id, "--block-size");
    engine_destroy(e);
    e = make_engine(GGUF_DT_F16, 16, 4, true); /* 5 blocks do not fit in 4 */
    expect_refused(e, path, g_id, "not enough free KV blocks");
    engine_destroy(e);

    clear_dir(dir);
    rmdir(dir);
    model_destroy(g_model);
    tok_vocab_destroy(g_vocab);
    printf("test_kv_prefix_file: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
