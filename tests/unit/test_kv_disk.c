/* The disk tier of the prefix cache (kv_disk.h) through the engine: a prompt
 * whose blocks were evicted from a tiny RAM pool is read back from disk and
 * gives exactly the greedy ids of a run that recomputes everything; the tier
 * survives a restart; another model, dtype or block size, or another cache
 * salt, gets no hits; a damaged file is detected and recomputed; and a writer
 * killed with SIGKILL at random moments never leaves a file that is loaded
 * wrongly. */
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "engine.h"
#include "test_dir.h"
#include "test_model.h"

#define MODEL    "models/stories260K.gguf"
#define N_PROMPT 80
#define N_GEN    8
#define N_OTHER  4

extern char **environ;

typedef struct run_out {
    int32_t ids[N_GEN + 4];
    int n;
    int64_t cached;
} run_out;

static void on_event(const engine_event *ev, void *user) {
    run_out *o = user;
    if (ev->token >= 0 && o->n < N_GEN + 4) o->ids[o->n++] = ev->token;
    if (ev->finish) o->cached = ev->stats->n_cached_prompt;
}

static model *g_model;
static tok_vocab *g_vocab;
static uint8_t g_id[16];
static int32_t g_prompts[1 + N_OTHER][N_PROMPT];

typedef struct tier {
    const char *dir; /* NULL: no disk tier */
    int dtype, block_size;
    bool other_model;
    bool no_prefix;
    int64_t n_blocks;
} tier;

static engine *make_engine(const tier *t) {
    engine_config c;
    engine_config_default(&c);
    c.n_ctx = 128;
    c.max_seqs = 1;
    c.kv_dtype = t->dtype;
    c.block_size = t->block_size;
    c.n_blocks = t->n_blocks;
    c.prefix_cache = !t->no_prefix;
    kv_disk_config dc = {.dir = t->dir, .max_bytes = 0, .queue_blocks = 8};
    memcpy(dc.model_id, g_id, 16);
    if (t->other_model) dc.model_id[0] ^= 1;
    c.kv_disk = t->dir ? &dc : NULL;
    kvl_error err;
    engine *e = engine_create(g_model, g_vocab, &c, &err);
    if (!e) fprintf(stderr, "engine_create: %s\n", err.msg);
    return e;
}

static void run_one(engine *e, int which, const char *salt, run_out *o) {
    memset(o, 0, sizeof *o);
    if (!submit_greedy(e, g_prompts[which], N_PROMPT, N_GEN, salt, on_event, o) ||
        !run_until_idle(e))
        failures++;
}

/* Runs prompt 0, then the other prompts (which push prompt 0's blocks out of
 * the 12-block pool), waits for the writer, then prompt 0 again into *again. */
static kv_disk_stats evict_and_rerun(engine *e, const char *salt, run_out *first, run_out *again) {
    run_out tmp;
    run_one(e, 0, salt, first);
    for (int i = 1; i <= N_OTHER; i++) run_one(e, i, salt, &tmp);
    if (engine_kv_disk(e)) kv_disk_flush(engine_kv_disk(e));
    run_one(e, 0, salt, again);
    return engine_kv_disk(e) ? kv_disk_get_stats(engine_kv_disk(e)) : (kv_disk_stats){0};
}

static bool same(const run_out *a, const run_out *b) {
    return a->n == b->n && memcmp(a->ids, b->ids, (size_t)a->n * sizeof(int32_t)) == 0;
}

/* Flips one byte in the middle of the first block file (its payload). */
static bool damage_one(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[4096] = "";
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".kvb")) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            break;
        }
    if (d) closedir(d);
    FILE *f = path[0] ? fopen(path, "r+b") : NULL;
    if (!f) return false;
    fseek(f, 0, SEEK_END);
    long mid = ftell(f) - 100;
    fseek(f, mid, SEEK_SET);
    int c = fgetc(f);
    fseek(f, mid, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    return true;
}

static void test_tier(const char *dir, const run_out *ref) {
    clear_dir(dir);
    tier t = {.dir = dir, .dtype = GGUF_DT_F16, .block_size = 16, .n_blocks = 12};
    run_out first, again;
    /* 1: evicted blocks come back from disk, same ids */
    engine *e = make_engine(&t);
    if (!e) return failures++, (void)0;
    kv_disk_stats st = evict_and_rerun(e, NULL, &first, &again);
    CHECK(same(&first, ref) && same(&again, ref), "ids with the disk tier differ from recompute");
    CHECK(st.writes > 0 && st.hits > 0 && again.cached >= 64, "writes %lld hits %lld cached %lld",
          (long long)st.writes, (long long)st.hits, (long long)again.cached);
    printf("tier: %lld writes, %lld hits, %lld reads, %lld dropped; rerun cached %lld of %d prompt "
           "tokens\n",
           (long long)st.writes, (long long)st.hits, (long long)st.reads, (long long)st.dropped,
           (long long)again.cached, N_PROMPT);
    engine_destroy(e);
    int files = count_files(dir, ".kvb");
    CHECK(files >= 5, "only %d block files after close", files);

    /* 2: a restart finds them (the first run is already a hit) */
    e = make_engine(&t);
    run_one(e, 0, NULL, &again);
    st = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(same(&again, ref) && again.cached == 64 && st.hits == 4,
          "after restart: cached %lld, hits %lld (want 64 and 4)", (long long)again.cached,
          (long long)st.hits);
    /* salt isolation: the same prompt under a salt finds nothing on disk */
    run_out salted;
    run_one(e, 0, "tenant-a", &salted);
    kv_disk_stats st2 = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(salted.cached == 0 && st2.hits == st.hits && same(&salted, ref),
          "a salted request hit %lld tokens", (long long)salted.cached);
    engine_destroy(e);

    /* 3: another model, dtype or block size: no hits, and their files are left alone */
    tier others[3] = {t, t, t};
    others[0].other_model = true;
    others[1].dtype = GGUF_DT_F32;
    others[2].block_size = 8;
    others[2].n_blocks = 24;
    const char *what[3] = {"model", "dtype", "block size"};
    for (int k = 0; k < 3; k++) {
        files = count_files(dir, ".kvb");
        e = make_engine(&others[k]);
        if (!e) continue;
        run_one(e, 0, NULL, &again);
        st = kv_disk_get_stats(engine_kv_disk(e));
        CHECK(st.blocks == 0 && st.hits == 0 && again.cached == 0,
              "another %s: %lld blocks indexed, %lld hits", what[k], (long long)st.blocks,
              (long long)st.hits);
        if (k != 1) CHECK(same(&again, ref), "another %s: ids differ", what[k]);
        engine_destroy(e);
        CHECK(count_files(dir, ".kvb") >= files, "another %s deleted files", what[k]);
    }

    /* 4: a damaged file is caught by its checksum, deleted, and the block recomputed */
    clear_dir(dir);
    e = make_engine(&t);
    run_one(e, 0, NULL, &again);
    engine_destroy(e); /* 5 full blocks of prompt 0 written on close */
    CHECK(damage_one(dir), "no block file to damage");
    e = make_engine(&t);
    run_one(e, 0, NULL, &again);
    st = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(st.corrupt == 1 && same(&again, ref), "damaged file: corrupt %lld, ids %s",
          (long long)st.corrupt, same(&again, ref) ? "same" : "differ");
    engine_destroy(e);

    /* 5: a truncated file and a leftover temporary are dropped when indexing */
    char path[4096];
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".kvb")) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            if (truncate(path, 200) != 0) failures++;
            char tmp[4200];
            snprintf(tmp, sizeof tmp, "%s.1.2.tmp", path);
            FILE *f = fopen(tmp, "wb");
            if (f) fclose(f);
            break;
        }
    if (d) closedir(d);
    e = make_engine(&t);
    st = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(st.corrupt == 1 && count_files(dir, ".tmp") == 0,
          "truncated: corrupt %lld, %d temporaries left", (long long)st.corrupt,
          count_files(dir, ".tmp"));
    run_one(e, 0, NULL, &again);
    CHECK(same(&again, ref), "after a truncated file: ids differ");
    engine_destroy(e);
}

/* The prompts of the SIGKILL test: a different one per round, reproducible. */
static void kill_prompt(int round, int32_t *out) {
    uint32_t x = 2654435761u * (uint32_t)(round + 1);
    for (int k = 0; k < N_PROMPT; k++) {
        x = x * 1664525u + 1013904223u;
        out[k] = 3 + (int32_t)((x >> 8) % (uint32_t)(model_hp(g_model)->n_vocab - 3));
    }
}

#define KILL_ROUNDS 40 /* prompts per writer */
#define KILLS       4

/* The writer process of the SIGKILL test: evicts blocks to disk as fast as it
 * can, prompts [first, first + KILL_ROUNDS). */
static int writer_child(const char *dir, int first) {
    tier t = {.dir = dir, .dtype = GGUF_DT_F16, .block_size = 16, .n_blocks = 12};
    engine *e = make_engine(&t);
    if (!e) return 1;
    run_out o;
    for (int round = first; round < first + KILL_ROUNDS; round++) {
        kill_prompt(round, g_prompts[0]);
        run_one(e, 0, NULL, &o);
    }
    engine_destroy(e);
    return 0;
}

static void test_sigkill(const char *dir, const char *self) {
    clear_dir(dir);
    srand((unsigned)time(NULL));
    for (int k = 0; k < KILLS; k++) {
        char first[16];
        snprintf(first, sizeof first, "%d", k * KILL_ROUNDS);
        char *argv[] = {(char *)self, "--writer", (char *)dir, first, NULL};
        pid_t pid;
        if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0) {
            failures++;
            return;
        }
        usleep(100000 + (useconds_t)(rand() % 400000));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    int files = count_files(dir, ".kvb");
    tier t = {.dir = dir, .dtype = GGUF_DT_F16, .block_size = 16, .n_blocks = 12};
    tier none = {.dtype = GGUF_DT_F16, .block_size = 16, .n_blocks = 12, .no_prefix = true};
    engine *e = make_engine(&t), *ref = make_engine(&none);
    if (!e || !ref) return failures++, (void)0;
    kv_disk_stats st0 = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(count_files(dir, ".tmp") == 0 && st0.corrupt == 0,
          "after kills: %d temporaries, %lld bad files", count_files(dir, ".tmp"),
          (long long)st0.corrupt);
    /* every block that survived is used by one of these prompts: each must
     * give the ids of a full recompute */
    for (int round = 0; round < KILLS * KILL_ROUNDS; round++) {
        run_out o, r;
        kill_prompt(round, g_prompts[0]);
        run_one(ref, 0, NULL, &r);
        run_one(e, 0, NULL, &o);
        CHECK(same(&o, &r), "after kills: round %d's prompt differs from recompute", round);
    }
    kv_disk_stats st = kv_disk_get_stats(engine_kv_disk(e));
    CHECK(st.corrupt == 0, "after kills: %lld files failed their checks", (long long)st.corrupt);
    printf("sigkill: %d files survived "
           "%d kills, %lld indexed, %lld hits after\n",
           files, KILLS, (long long)st0.blocks, (long long)st.hits);
    engine_destroy(e);
    engine_destroy(ref);
}

int main(int argc, char **argv) {
    g_model = load_test_model_id(MODEL, 128, 64, &g_vocab, g_id);
    if (!g_model) return 1;
    srand(11);
    for (int i = 0; i <= N_OTHER; i++)
        for (int k = 0; k < N_PROMPT; k++)
            g_prompts[i][k] = 3 + rand() % (int)(model_hp(g_model)->n_vocab - 3);
    int rc;
    if (argc == 4 && strcmp(argv[1], "--writer") == 0) {
        rc = writer_child(argv[2], atoi(argv[3]));
    } else {
        char dir[] = "/tmp/kvllm_test_kv_disk_XXXXXX";
        if (!mkdtemp(dir)) return 1;
        /* the reference: every token computed, no cache at all */
        run_out refs[1 + N_OTHER];
        tier none = {.dtype = GGUF_DT_F16, .block_size = 16, .n_blocks = 12, .no_prefix = true};
        engine *e = make_engine(&none);
        for (int i = 0; e && i <= N_OTHER; i++) run_one(e, i, NULL, &refs[i]);
        engine_destroy(e);
        test_tier(dir, &refs[0]);
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = 0;
            test_sigkill(dir, self);
        }
        clear_dir(dir);
        rmdir(dir);
        printf("test_kv_disk: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
        rc = failures != 0;
    }
    model_destroy(g_model);
    tok_vocab_destroy(g_vocab);
    return rc;
}
