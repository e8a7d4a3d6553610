/* The disk tier's background reads and pins (kv_disk.h) through the engine:
 * a request whose prefix is on disk waits while the reader thread loads it,
 * and the other requests run meanwhile; a read that fails its checks falls
 * back to recompute with the same ids; cancelling requests whose reads are
 * queued or in progress gives every reserved block back; saved prefixes are
 * kept from the size limit within their cap, across a restart, until
 * unpinned, and a save past the cap is refused with nothing pinned.
 * The reader is held without any timing: a FIFO stands in for a block file,
 * so its open() and read() wait until this test opens and closes the other
 * end. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "engine.h"
#include "test_dir.h"
#include "test_model.h"

#define MODEL    "models/stories260K.gguf"
#define N_PROMPT 80
#define N_GEN    8
#define BS       16
#define N_BLOCKS 12

typedef struct run_out {
    int32_t ids[N_GEN + 4];
    int n;
    bool finished;
    int64_t cached, disk;
    engine_finish finish;
} run_out;

static void on_event(const engine_event *ev, void *user) {
    run_out *o = user;
    if (ev->token >= 0 && o->n < N_GEN + 4) o->ids[o->n++] = ev->token;
    if (ev->finish) {
        o->finished = true;
        o->finish = ev->finish;
        o->cached = ev->stats->n_cached_prompt;
        o->disk = ev->stats->n_disk_prompt;
    }
}

static model *g_model;
static tok_vocab *g_vocab;
static uint8_t g_id[16];
static int32_t g_prompts[3][N_PROMPT];
static run_out g_refs[3];
static atomic_int g_wakes;

static void on_wake(void *user) {
    (void)user;
    atomic_fetch_add(&g_wakes, 1);
}

static engine *make_engine(const char *dir, uint64_t max_bytes, uint64_t max_pinned) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    c.max_seqs = 2;
    c.n_blocks = N_BLOCKS;
    c.prefix_cache = dir != NULL;
    kv_disk_config dc = {
        .dir = dir, .max_bytes = max_bytes, .queue_blocks = 8, .max_pinned_bytes = max_pinned};
    memcpy(dc.model_id, g_id, 16);
    c.kv_disk = dir ? &dc : NULL;
    kvl_error err;
    engine *e = engine_create(g_model, g_vocab, &c, &err);
    if (!e) fprintf(stderr, "engine_create: %s\n", err.msg);
    return e;
}

static bool submit(engine *e, const int32_t *prompt, int n, run_out *o) {
    memset(o, 0, sizeof *o);
    return submit_greedy(e, prompt, n, N_GEN, NULL, on_event, o);
}

static bool step(engine *e) {
    kvl_error err;
    if (engine_step(e, &err)) return true;
    fprintf(stderr, "step: %s\n", err.msg);
    failures++;
    return false;
}

static void run_one(engine *e, const int32_t *prompt, run_out *o) {
    if (!submit(e, prompt, N_PROMPT, o)) return failures++, (void)0;
    for (int k = 0; k < 10000 && engine_has_work(e); k++)
        if (!step(e)) return;
}

static bool same(const run_out *a, const run_out *b) {
    return a->n == b->n && memcmp(a->ids, b->ids, (size_t)a->n * sizeof(int32_t)) == 0;
}

/* The chain hash of block k of a prompt (no cache salt). */
static uint64_t block_hash_of(const int32_t *prompt, int k) {
    kv_seq s;
    kv_seq_init(&s);
    kv_seq_set_cache_salt(&s, NULL);
    uint64_t h = s.chain_root;
    for (int i = 0; i <= k; i++) h = kv_block_hash(h, prompt + i * BS, BS);
    return h;
}

/* The path of block k's file of a prompt into out; false when there is none. */
static bool block_file(const char *dir, const int32_t *prompt, int k, char *out, size_t cap) {
    char tail[32];
    snprintf(tail, sizeof tail, "-%016llx.kvb", (unsigned long long)block_hash_of(prompt, k));
    DIR *d = opendir(dir);
    struct dirent *de;
    bool found = false;
    while (d && (de = readdir(d)) && !found)
        if (strlen(de->d_name) > strlen(tail) &&
            strcmp(de->d_name + strlen(de->d_name) - strlen(tail), tail) == 0) {
            snprintf(out, cap, "%s/%s", dir, de->d_name);
            found = true;
        }
    if (d) closedir(d);
    return found;
}

/* Puts a FIFO where block 0 of the prompt's file was. */
static bool fifo_for_block0(const char *dir, const int32_t *prompt, char *path, size_t cap) {
    return block_file(dir, prompt, 0, path, cap) && unlink(path) == 0 && mkfifo(path, 0644) == 0;
}

/* Opens the FIFO's writing end once the reader has it open (so the reader is
 * inside that block's read, and stays there until the end is closed). */
static int hold_reader(const char *path) {
    for (int k = 0; k < 6000; k++) {
        int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) return fd;
        if (errno != ENXIO) break;
        usleep(5000);
    }
    return -1;
}

static void wait_wakes(int more_than) {
    for (int k = 0; k < 6000 && atomic_load(&g_wakes) <= more_than; k++) usleep(5000);
}

/* Prompts 0 and 2 written to the tier (on close), 1 never. */
static void fill_tier(const char *dir) {
    clear_dir(dir);
    engine *e = make_engine(dir, 0, 0);
    if (!e) return failures++, (void)0;
    run_out o;
    run_one(e, g_prompts[0], &o);
    run_one(e, g_prompts[2], &o);
    engine_destroy(e);
}

/* A tier holding prompts 0 and 2, an engine over it that wakes on_wake, and
 * block 0 of prompt 0's file replaced by a FIFO (its path into fifo), so that
 * the reader stays in that block's read until the test lets it go. NULL (a
 * failure counted) when a step fails. */
static engine *engine_with_held_block(const char *dir, char *fifo, size_t cap) {
    fill_tier(dir);
    engine *e = make_engine(dir, 0, 0);
    if (!e || !fifo_for_block0(dir, g_prompts[0], fifo, cap)) {
        failures++;
        engine_destroy(e);
        return NULL;
    }
    engine_set_disk_wake(e, on_wake, NULL);
    return e;
}

static void test_background(const char *dir) {
    char fifo[4096];
    engine *e = engine_with_held_block(dir, fifo, sizeof fifo);
    if (!e) return;
    run_out a, b;
    CHECK(submit(e, g_prompts[0], N_PROMPT, &a) && submit(e, g_prompts[1], N_PROMPT, &b));
    step(e); /* A's read starts, B is admitted */
    int fd = hold_reader(fifo);
    CHECK(fd >= 0, "the reader never opened the held block");
    for (int k = 0; k < 1000 && !b.finished; k++) step(e);
    CHECK(b.finished && same(&b, &g_refs[1]), "B did not run to the end while A's prefix loaded");
    CHECK(a.n == 0 && !a.finished, "A got %d tokens while its read was held", a.n);
    step(e); /* nothing but A left: the step computes nothing and does not sleep */
    CHECK(engine_waiting_on_disk(e), "not waiting on the disk with only A's read left");
    const int wakes = atomic_load(&g_wakes);
    if (fd >= 0) close(fd); /* an empty read: A's first block fails its checks */
    wait_wakes(wakes);
    CHECK(atomic_load(&g_wakes) > wakes, "no wake after the read ended");
    CHECK(!engine_waiting_on_disk(e), "still waiting on the disk after the read ended");
    for (int k = 0; k < 1000 && !a.finished; k++) step(e);
    kv_disk_stats st = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(a.finished && same(&a, &g_refs[0]) && a.cached == 0,
          "A after a failed read: ids %s, cached %lld (want the reference and 0)",
          same(&a, &g_refs[0]) ? "same" : "differ", (long long)a.cached);
    CHECK(st.corrupt == 1 && st.loads >= 1, "corrupt %lld, loads %lld", (long long)st.corrupt,
          (long long)st.loads);
    CHECK(kv_pool_n_free(engine_kv(e)) == N_BLOCKS, "%lld of %d blocks free at the end",
          (long long)kv_pool_n_free(engine_kv(e)), N_BLOCKS);
    /* and an intact tier: prompt 2 read in the background, same ids as computed
     * (without a wake callback: a step with nothing else to do sleeps on the read) */
    engine_set_disk_wake(e, NULL, NULL);
    run_out c;
    run_one(e, g_prompts[2], &c);
    CHECK(same(&c, &g_refs[2]) && c.disk == 64 && c.cached == 64,
          "prompt 2 from disk: ids %s, %lld from disk, %lld cached (want 64 and 64)",
          same(&c, &g_refs[2]) ? "same" : "differ", (long long)c.disk, (long long)c.cached);
    engine_destroy(e);
}

static void test_cancel(const char *dir) {
    char fifo[4096];
    engine *e = engine_with_held_block(dir, fifo, sizeof fifo);
    if (!e) return;
    kv_pool *p = engine_kv(e);
    run_out a, d;
    CHECK(submit(e, g_prompts[0], N_PROMPT, &a) && submit(e, g_prompts[2], N_PROMPT, &d));
    step(e); /* both start reading: 4 blocks reserved each */
    CHECK(kv_pool_n_free(p) == N_BLOCKS - 8, "%lld blocks free with two reads (want %d)",
          (long long)kv_pool_n_free(p), N_BLOCKS - 8);
    int fd = hold_reader(fifo); /* A's read is in progress, D's queued behind it */
    CHECK(fd >= 0, "the reader never opened the held block");
    engine_cancel(e, 2); /* D, queued: its blocks come back at once */
    step(e);
    CHECK(d.finished && d.finish == ENGINE_FINISH_CANCELLED, "D not cancelled");
    CHECK(kv_pool_n_free(p) == N_BLOCKS - 4, "%lld blocks free after cancelling a queued read",
          (long long)kv_pool_n_free(p));
    engine_cancel(e, 1); /* A, being read: its blocks come back once the reader lets go */
    step(e);
    CHECK(a.finished && a.finish == ENGINE_FINISH_CANCELLED, "A not cancelled");
    CHECK(kv_pool_n_free(p) == N_BLOCKS - 4, "%lld blocks free while the reader holds A's",
          (long long)kv_pool_n_free(p));
    const int wakes = atomic_load(&g_wakes);
    if (fd >= 0) close(fd);
    wait_wakes(wakes);
    kv_disk_reap(engine_kv_disk(e));
    kvl_error err;
    CHECK(kv_pool_n_free(p) == N_BLOCKS, "%lld of %d blocks free after the reader let go",
          (long long)kv_pool_n_free(p), N_BLOCKS);
    CHECK(kv_pool_check(p, &err), "pool: %s", err.msg);
    kv_disk_stats st = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(st.loads == 2 && st.loads_abandoned == 2, "loads %lld, abandoned %lld (want 2, 2)",
          (long long)st.loads, (long long)st.loads_abandoned);
    CHECK(!engine_has_work(e), "work left after both were cancelled");
    engine_set_disk_wake(e, NULL, NULL);
    engine_destroy(e);
}

/* Pushes eight more prompts through the pool (and the tier). */
static void churn(engine *e, int seed) {
    int32_t pr[N_PROMPT];
    uint32_t x = 2654435761u * (uint32_t)(seed + 1);
    run_out o;
    for (int r = 0; r < 8; r++) {
        for (int k = 0; k < N_PROMPT; k++) {
            x = x * 1664525u + 1013904223u;
            pr[k] = 3 + (int32_t)((x >> 8) % (uint32_t)(model_hp(g_model)->n_vocab - 3));
        }
        run_one(e, pr, &o);
    }
}

static int blocks_on_disk(const char *dir, const int32_t *prompt, int n) {
    char path[4096];
    int have = 0;
    for (int k = 0; k < n; k++) have += block_file(dir, prompt, k, path, sizeof path);
    return have;
}

static void test_pins(const char *dir) {
    clear_dir(dir);
    engine *probe = make_engine(NULL, 0, 0);
    if (!probe) return failures++, (void)0;
    const uint64_t fb = kv_disk_file_bytes(kv_pool_geometry(engine_kv(probe))->block_bytes, BS);
    engine_destroy(probe);
    const uint64_t max = 10 * fb, pin_max = 4 * fb;
    engine *e = make_engine(dir, max, pin_max);
    if (!e) return failures++, (void)0;
    kvl_error err;
    kv_disk *d = engine_kv_disk(e);
    int64_t r = engine_kv_save(e, g_prompts[0], N_PROMPT, NULL, NULL, &err);
    CHECK(r == KV_DISK_OVER_PIN_CAP && kv_disk_get_stats(d).pinned_blocks == 0,
          "5 blocks over a 4-block cap: %lld, %lld pinned", (long long)r,
          (long long)kv_disk_get_stats(d).pinned_blocks);
    r = engine_kv_save(e, g_prompts[0], 64, NULL, NULL, &err);
    CHECK(r == 4 && kv_disk_get_stats(d).pinned_blocks == 4, "save 4 blocks: %lld, %lld pinned",
          (long long)r, (long long)kv_disk_get_stats(d).pinned_blocks);
    r = engine_kv_save(e, g_prompts[0], 64, NULL, NULL, &err);
    CHECK(r == 4 && kv_disk_get_stats(d).pinned_blocks == 4 && count_files(dir, ".pin") == 1,
          "the same save again: %lld, %lld pinned, %d pin files", (long long)r,
          (long long)kv_disk_get_stats(d).pinned_blocks, count_files(dir, ".pin"));
    r = engine_kv_save(e, g_prompts[1], 32, NULL, NULL, &err);
    CHECK(r == KV_DISK_OVER_PIN_CAP, "2 more blocks past the cap: %lld", (long long)r);
    churn(e, 1);
    engine_destroy(e); /* what RAM caches is written too: well past 10 files */
    e = make_engine(dir, max, pin_max);
    if (!e) return failures++, (void)0;
    d = engine_kv_disk(e);
    kv_disk_stats st = kv_disk_get_stats(d);
    CHECK(st.pinned_blocks == 4 && st.blocks <= 10 && blocks_on_disk(dir, g_prompts[0], 4) == 4,
          "after churn and a restart: %lld pinned, %lld blocks, %d of prompt 0's 4 on disk",
          (long long)st.pinned_blocks, (long long)st.blocks, blocks_on_disk(dir, g_prompts[0], 4));
    run_out o;
    run_one(e, g_prompts[0], &o);
    CHECK(same(&o, &g_refs[0]) && o.disk == 64, "the pinned prefix: ids %s, %lld from disk",
          same(&o, &g_refs[0]) ? "same" : "differ", (long long)o.disk);
    CHECK(engine_kv_unpin(e, g_prompts[0], 64, "other-salt", NULL, &err) < 0,
          "unpin under another salt");
    CHECK(engine_kv_unpin(e, g_prompts[0], 48, NULL, NULL, &err) < 0, "unpin of a shorter prefix");
    r = engine_kv_unpin(e, g_prompts[0], 64, NULL, NULL, &err);
    CHECK(r == 4 && kv_disk_get_stats(d).pinned_blocks == 0 && count_files(dir, ".pin") == 0,
          "unpin: %lld, %lld pinned, %d pin files", (long long)r,
          (long long)kv_disk_get_stats(d).pinned_blocks, count_files(dir, ".pin"));
    CHECK(engine_kv_unpin(e, g_prompts[0], 64, NULL, NULL, &err) < 0, "unpin twice");
    r = engine_kv_save(e, g_prompts[1], 32, NULL, NULL, &err);
    CHECK(r == 2, "a save that fits after the unpin: %lld (%s)", (long long)r,
          r < 0 ? err.msg : "");
    churn(e, 2);
    churn(e, 3);
    engine_destroy(e);
    CHECK(blocks_on_disk(dir, g_prompts[0], 4) < 4 && blocks_on_disk(dir, g_prompts[1], 2) == 2,
          "after unpinning, %d of prompt 0's blocks stayed; %d of prompt 1's pinned 2",
          blocks_on_disk(dir, g_prompts[0], 4), blocks_on_disk(dir, g_prompts[1], 2));
}

int main(void) {
    g_model = load_test_model_id(MODEL, 128, 64, &g_vocab, g_id);
    if (!g_model) return 1;
    srand(23);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < N_PROMPT; k++)
            g_prompts[i][k] = 3 + rand() % (int)(model_hp(g_model)->n_vocab - 3);
    engine *ref = make_engine(NULL, 0, 0); /* every token computed, no cache */
    for (int i = 0; ref && i < 3; i++) run_one(ref, g_prompts[i], &g_refs[i]);
    engine_destroy(ref);
    char dir[] = "/tmp/kvllm_test_kv_disk_load_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_background(dir);
    test_cancel(dir);
    test_pins(dir);
    clear_dir(dir);
    rmdir(dir);
    model_destroy(g_model);
    tok_vocab_destroy(g_vocab);
    printf("test_kv_disk_load: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
