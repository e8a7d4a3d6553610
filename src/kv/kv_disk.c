/* kv_disk: the disk tier of the prefix cache. See kv_disk.h. */
#define _GNU_SOURCE
#include "kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define DISK_MAGIC "KVLLMKVB"
/* Bumped whenever the pool's block layout or this format changes: files of
 * another version belong to another identity and are never loaded. */
#define DISK_VERSION 1u

/* The fixed header; every field is a fixed-width integer, naturally aligned. */
typedef struct disk_header {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes;
    uint8_t model_id[16];
    int32_t dtype_k, dtype_v, block_size, n_layers, n_kv_heads, head_dim_k, head_dim_v, reserved;
    uint64_t k_row, v_row, block_bytes;
    /* the identity ends here */
    uint64_t hash, parent;
    uint64_t payload_xxh; /* XXH3-64 of the token ids and the block's bytes */
    uint64_t header_xxh;  /* XXH3-64 of everything above */
} disk_header;
#define IDENTITY_BYTES offsetof(disk_header, hash)
_Static_assert(sizeof(disk_header) == 120, "the block file header is 120 bytes, no padding");

typedef struct disk_entry {
    uint64_t hash;
    uint64_t stamp; /* last write or hit, ns (the file's mtime after a restart) */
    struct disk_entry *next;
} disk_entry;

typedef struct disk_slot {
    uint8_t *buf; /* header, tokens, payload */
    bool busy;    /* queued or being written */
} disk_slot;

struct kv_disk {
    kv_pool *pool;
    char *dir;
    uint64_t max_bytes;
    disk_header ident;   /* identity fields filled, the rest zero */
    uint64_t ident_hash; /* names our files */
    size_t tok_bytes, file_bytes;
    /* index: hash -> entry (chained), guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_idle;
    disk_entry **buckets;
    size_t n_buckets;
    int64_t n_entries;
    uint64_t last_stamp;
    /* writer queue: a ring of slot indices */
    disk_slot *slots;
    int n_slots;
    int *ring, ring_head, ring_len;
    int writing; /* slots the writer holds */
    bool stop;
    pthread_t writer;
    bool writer_started;
    uint8_t *read_buf; /* engine thread: one file */
    kv_disk_stats st;
};

uint64_t kv_disk_file_bytes(uint64_t block_bytes, int block_size) {
    return sizeof(disk_header) + (uint64_t)block_size * sizeof(int32_t) + block_bytes;
}

bool kv_disk_model_id(const char *path, uint8_t id[16], kvl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kvl_fail(err, "kv disk: cannot open %s to hash it: %s", path, strerror(errno));
    XXH3_state_t *h = XXH3_createState();
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    bool ok = h && buf;
    if (ok) XXH3_128bits_reset(h);
    size_t n;
    while (ok && (n = fread(buf, 1, CHUNK, f)) > 0) XXH3_128bits_update(h, buf, n);
    if (ok && ferror(f)) ok = kvl_fail(err, "kv disk: reading %s: %s", path, strerror(errno));
    else if (!ok) kvl_fail(err, "kv disk: out of memory");
    if (ok) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h));
        memcpy(id, c.digest, 16);
    }
    XXH3_freeState(h);
    free(buf);
    fclose(f);
    return ok;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A stamp later than every earlier one (the clock may stand still or step back). */
static uint64_t next_stamp(kv_disk *d) {
    uint64_t t = now_ns();
    d->last_stamp = t > d->last_stamp ? t : d->last_stamp + 1;
    return d->last_stamp;
}

static void block_path(const kv_disk *d, uint64_t hash, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx-%016llx.kvb", d->dir, (unsigned long long)d->ident_hash,
             (unsigned long long)hash);
}

/* ---- index (callers hold mu) ---- */

static disk_entry **index_slot(kv_disk *d, uint64_t hash) {
    disk_entry **pp = &d->buckets[hash & (d->n_buckets - 1)];
    while (*pp && (*pp)->hash != hash) pp = &(*pp)->next;
    return pp;
}

static void index_grow(kv_disk *d) {
    size_t n = d->n_buckets * 2;
    disk_entry **nb = calloc(n, sizeof *nb);
    if (!nb) return; /* longer chains, still correct */
    for (size_t i = 0; i < d->n_buckets; i++)
        for (disk_entry *e = d->buckets[i], *nx; e; e = nx) {
            nx = e->next;
            e->next = nb[e->hash & (n - 1)];
            nb[e->hash & (n - 1)] = e;
        }
    free(d->buckets);
    d->buckets = nb;
    d->n_buckets = n;
}

static void index_put(kv_disk *d, uint64_t hash, uint64_t stamp) {
    disk_entry **pp = index_slot(d, hash);
    if (*pp) {
        (*pp)->stamp = stamp;
        return;
    }
    disk_entry *e = malloc(sizeof *e);
    if (!e) return; /* the file stays; it is indexed again on the next start */
    *e = (disk_entry){.hash = hash, .stamp = stamp};
    *pp = e;
    d->n_entries++;
    d->st.blocks = d->n_entries;
    d->st.bytes = (uint64_t)d->n_entries * d->file_bytes;
    if ((size_t)d->n_entries > d->n_buckets) index_grow(d);
}

static void index_drop(kv_disk *d, uint64_t hash) {
    disk_entry **pp = index_slot(d, hash);
    if (!*pp) return;
    disk_entry *e = *pp;
    *pp = e->next;
    free(e);
    d->n_entries--;
    d->st.blocks = d->n_entries;
    d->st.bytes = (uint64_t)d->n_entries * d->file_bytes;
}

/* Deletes least recently used files until the tier fits its size. O(n) per
 * deletion, which is small next to writing a block file. */
static void enforce_limit(kv_disk *d) {
    while (d->max_bytes && d->n_entries > 0 &&
           (uint64_t)d->n_entries * d->file_bytes > d->max_bytes) {
        disk_entry *old = NULL;
        for (size_t i = 0; i < d->n_buckets; i++)
            for (disk_entry *e = d->buckets[i]; e; e = e->next)
                if (!old || e->stamp < old->stamp) old = e;
        char path[4096];
        block_path(d, old->hash, path, sizeof path);
        unlink(path);
        index_drop(d, old->hash);
    }
}

/* ---- block files ---- */

/* Fills buf with block b's file (header, tokens, bytes), checksums not yet
 * computed: the writer thread does that (seal_file), off the step path. */
static void build_file(const kv_disk *d, uint8_t *buf, uint64_t hash, uint64_t parent,
                       const int32_t *tokens, const void *bytes) {
    disk_header h = d->ident;
    h.hash = hash;
    h.parent = parent;
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, tokens, d->tok_bytes);
    memcpy(buf + sizeof h + d->tok_bytes, bytes, d->file_bytes - sizeof h - d->tok_bytes);
}

static void seal_file(const kv_disk *d, uint8_t *buf) {
    disk_header h;
    memcpy(&h, buf, sizeof h);
    h.payload_xxh = XXH3_64bits(buf + sizeof h, d->file_bytes - sizeof h);
    h.header_xxh = XXH3_64bits(&h, offsetof(disk_header, header_xxh));
    memcpy(buf, &h, sizeof h);
}

static bool write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Writes one file crash-safely: a temporary, fdatasync (unless the caller
 * syncs the whole file system afterwards), rename. Then indexes it. */
static bool write_file(kv_disk *d, uint8_t *buf, bool sync, kvl_error *err) {
    seal_file(d, buf);
    uint64_t hash;
    memcpy(&hash, buf + offsetof(disk_header, hash), sizeof hash);
    char path[4096], tmp[4200];
    block_path(d, hash, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%ld.%lx.tmp", path, (long)getpid(),
             (unsigned long)pthread_self());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return kvl_fail(err, "kv disk: cannot create %s: %s", tmp, strerror(errno));
    bool ok = write_all(fd, buf, d->file_bytes) && (!sync || fdatasync(fd) == 0);
    int e = errno;
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        unlink(tmp);
        return kvl_fail(err, "kv disk: cannot write %s: %s", path, strerror(e));
    }
    pthread_mutex_lock(&d->mu);
    index_put(d, hash, next_stamp(d));
    d->st.writes++;
    enforce_limit(d);
    pthread_mutex_unlock(&d->mu);
    return true;
}

static void *writer_main(void *arg) {
    kv_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->ring_len && !d->stop) pthread_cond_wait(&d->cv_work, &d->mu);
        if (!d->ring_len) break; /* stopping and drained */
        int si = d->ring[d->ring_head];
        d->ring_head = (d->ring_head + 1) % d->n_slots;
        d->ring_len--;
        d->writing++;
        pthread_mutex_unlock(&d->mu);
        kvl_error err;
        /* No sync per file: a kill leaves the renamed file whole (the page
         * cache has it), and a file a power loss tore fails its checks and is
         * dropped; a sync each would cap the writer at the disk's flush rate
         * and drop most evictions (bench/README.md). */
        if (!write_file(d, d->slots[si].buf, false, &err)) kvl_log(KVL_LOG_WARN, "%s", err.msg);
        pthread_mutex_lock(&d->mu);
        d->slots[si].busy = false;
        d->writing--;
        if (!d->ring_len && !d->writing) pthread_cond_broadcast(&d->cv_idle);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static bool on_disk(kv_disk *d, uint64_t hash) {
    pthread_mutex_lock(&d->mu);
    bool found = *index_slot(d, hash) != NULL;
    pthread_mutex_unlock(&d->mu);
    return found;
}

/* The pool's eviction hook: stage the block for the writer, or drop it. */
static void on_evict(void *user, kv_pool *p, int32_t b) {
    kv_disk *d = user;
    uint64_t hash, parent;
    const int32_t *toks;
    if (!kv_block_prefix_info(p, b, &hash, &parent, &toks) || on_disk(d, hash)) return;
    pthread_mutex_lock(&d->mu);
    int si = -1;
    for (int i = 0; i < d->n_slots && si < 0; i++)
        if (!d->slots[i].busy) si = i;
    if (si < 0) {
        d->st.dropped++;
        pthread_mutex_unlock(&d->mu);
        return;
    }
    d->slots[si].busy = true;
    pthread_mutex_unlock(&d->mu);
    /* The copy happens outside the lock: the slot is ours until queued. */
    build_file(d, d->slots[si].buf, hash, parent, toks, kv_block_k(p, b, 0));
    pthread_mutex_lock(&d->mu);
    d->ring[(d->ring_head + d->ring_len) % d->n_slots] = si;
    d->ring_len++;
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
}

/* ---- open: index the directory ---- */

static bool read_all(int fd, uint8_t *p, size_t n, off_t off) {
    while (n > 0) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return true;
}

/* Whether a header read from disk is one of ours, intact, for this hash. */
static bool header_ok(const kv_disk *d, const disk_header *h, uint64_t hash) {
    return memcmp(h, &d->ident, IDENTITY_BYTES) == 0 && h->hash == hash &&
           h->header_xxh == XXH3_64bits(h, offsetof(disk_header, header_xxh));
}

static void index_dir(kv_disk *d) {
    DIR *dir = opendir(d->dir);
    if (!dir) return;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%016llx-", (unsigned long long)d->ident_hash);
    struct dirent *de;
    while ((de = readdir(dir))) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (strncmp(n, prefix, 17) != 0) continue; /* another identity's, or not ours */
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", d->dir, n);
        if (len > 4 && strcmp(n + len - 4, ".tmp") == 0) { /* a write a crash interrupted */
            unlink(path);
            continue;
        }
        unsigned long long hash;
        char tail[8];
        if (len != 17 + 16 + 4 || sscanf(n + 17, "%16llx%7s", &hash, tail) != 2 ||
            strcmp(tail, ".kvb") != 0)
            continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat sb;
        disk_header h;
        bool ok = fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == d->file_bytes &&
                  read_all(fd, (uint8_t *)&h, sizeof h, 0) && header_ok(d, &h, hash);
        close(fd);
        if (!ok) { /* ours by name, but torn or damaged */
            unlink(path);
            d->st.corrupt++;
            continue;
        }
        uint64_t stamp = (uint64_t)sb.st_mtim.tv_sec * 1000000000ull + (uint64_t)sb.st_mtim.tv_nsec;
        index_put(d, hash, stamp);
        if (stamp > d->last_stamp) d->last_stamp = stamp;
    }
    closedir(dir);
    enforce_limit(d);
}

kv_disk *kv_disk_open(const kv_disk_config *c, kv_pool *p, kvl_error *err) {
    if (!kv_pool_default_hash(p)) {
        kvl_fail(err, "kv disk: the pool uses a test block hash");
        return NULL;
    }
    if (!c->dir || !*c->dir) {
        kvl_fail(err, "kv disk: no directory given");
        return NULL;
    }
    if (mkdir(c->dir, 0755) != 0 && errno != EEXIST) {
        kvl_fail(err, "kv disk: cannot create the directory %s: %s", c->dir, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (stat(c->dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(c->dir, W_OK | X_OK) != 0) {
        kvl_fail(err, "kv disk: %s is not a writable directory", c->dir);
        return NULL;
    }
    kv_disk *d = calloc(1, sizeof *d);
    if (!d) {
        kvl_fail(err, "kv disk: out of memory");
        return NULL;
    }
    const kv_pool_config *pc = kv_pool_cfg(p);
    d->pool = p;
    d->max_bytes = c->max_bytes;
    memcpy(d->ident.magic, DISK_MAGIC, 8);
    d->ident.version = DISK_VERSION;
    d->ident.header_bytes = sizeof(disk_header);
    memcpy(d->ident.model_id, c->model_id, 16);
    d->ident.dtype_k = pc->dtype;
    d->ident.dtype_v = kv_pool_dtype_v(p);
    d->ident.block_size = pc->block_size;
    d->ident.n_layers = pc->n_layers;
    d->ident.n_kv_heads = pc->n_kv_heads;
    d->ident.head_dim_k = pc->head_dim_k;
    d->ident.head_dim_v = pc->head_dim_v;
    d->ident.k_row = kv_pool_k_row_bytes(p);
    d->ident.v_row = kv_pool_v_row_bytes(p);
    d->ident.block_bytes = kv_pool_block_bytes(p);
    d->ident_hash = XXH3_64bits(&d->ident, IDENTITY_BYTES);
    d->tok_bytes = (size_t)pc->block_size * sizeof(int32_t);
    d->file_bytes = kv_disk_file_bytes(kv_pool_block_bytes(p), pc->block_size);
    d->n_slots = c->queue_blocks > 0 ? c->queue_blocks : 256;
    d->n_buckets = 1024;
    d->dir = strdup(c->dir);
    d->buckets = calloc(d->n_buckets, sizeof *d->buckets);
    d->slots = calloc((size_t)d->n_slots, sizeof *d->slots);
    d->ring = calloc((size_t)d->n_slots, sizeof *d->ring);
    d->read_buf = malloc(d->file_bytes);
    bool ok = d->dir && d->buckets && d->slots && d->ring && d->read_buf;
    for (int i = 0; ok && i < d->n_slots; i++)
        ok = (d->slots[i].buf = malloc(d->file_bytes)) != NULL;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_idle, NULL);
    if (!ok) {
        kvl_fail(err, "kv disk: out of memory for %d staging blocks of %zu bytes", d->n_slots,
                 d->file_bytes);
        kv_disk_close(d);
        return NULL;
    }
    index_dir(d);
    if (pthread_create(&d->writer, NULL, writer_main, d) != 0) {
        kvl_fail(err, "kv disk: cannot start the writer thread");
        kv_disk_close(d);
        return NULL;
    }
    d->writer_started = true;
    kv_pool_set_evict_hook(p, on_evict, d);
    return d;
}

void kv_disk_flush(kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    while (d->ring_len || d->writing) pthread_cond_wait(&d->cv_idle, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void kv_disk_close(kv_disk *d) {
    if (!d) return;
    if (d->writer_started) {
        kv_pool_set_evict_hook(d->pool, NULL, NULL);
        /* What RAM still holds goes to disk too, so a restart finds it. */
        const int64_t n = kv_pool_cfg(d->pool)->n_blocks;
        for (int32_t b = 0; b < n; b++) {
            uint64_t hash, parent;
            const int32_t *toks;
            if (!kv_block_prefix_info(d->pool, b, &hash, &parent, &toks) || on_disk(d, hash))
                continue;
            kvl_error err;
            build_file(d, d->read_buf, hash, parent, toks, kv_block_k(d->pool, b, 0));
            if (!write_file(d, d->read_buf, false, &err)) {
                kvl_log(KVL_LOG_WARN, "%s", err.msg);
                break;
            }
        }
        /* one sync for them all: a shutdown must not wait on one per block */
        int dfd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            syncfs(dfd);
            close(dfd);
        }
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_signal(&d->cv_work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->writer, NULL);
    }
    for (size_t i = 0; d->buckets && i < d->n_buckets; i++)
        for (disk_entry *e = d->buckets[i], *nx; e; e = nx) {
            nx = e->next;
            free(e);
        }
    for (int i = 0; d->slots && i < d->n_slots; i++) free(d->slots[i].buf);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_work);
    pthread_cond_destroy(&d->cv_idle);
    free(d->buckets);
    free(d->slots);
    free(d->ring);
    free(d->read_buf);
    free(d->dir);
    free(d);
}

/* ---- lookup ---- */

/* Reads s's next block of `all` (hash, with parent s->chain_hash) into a new
 * RAM block appended to s and committed. False (nothing changed) when it is
 * not on disk, does not verify, or no RAM block is free. */
static bool load_block(kv_disk *d, kv_seq *s, const int32_t *all, uint64_t hash) {
    if (!on_disk(d, hash)) return false;
    kv_pool *p = d->pool;
    const int bs = kv_pool_cfg(p)->block_size;
    const uint64_t parent = s->chain_hash;
    const int32_t *tokens = all + s->n_hashed * bs;
    char path[4096];
    block_path(d, hash, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && read_all(fd, d->read_buf, d->file_bytes, 0);
    if (fd >= 0) {
        /* a file one byte longer is as damaged as a short one */
        uint8_t extra;
        if (ok && pread(fd, &extra, 1, (off_t)d->file_bytes) != 0) ok = false;
        close(fd);
    }
    pthread_mutex_lock(&d->mu);
    d->st.reads++;
    pthread_mutex_unlock(&d->mu);
    disk_header h;
    memcpy(&h, d->read_buf, sizeof h);
    const uint8_t *body = d->read_buf + sizeof h;
    ok = ok && header_ok(d, &h, hash) &&
         h.payload_xxh == XXH3_64bits(body, d->file_bytes - sizeof h);
    if (!ok) { /* damaged (or gone): drop it; the block is recomputed */
        unlink(path);
        pthread_mutex_lock(&d->mu);
        index_drop(d, hash);
        d->st.corrupt++;
        pthread_mutex_unlock(&d->mu);
        kvl_log(KVL_LOG_WARN, "kv disk: %s failed its checks and was deleted", path);
        return false;
    }
    /* Intact, but a hash collision is still a miss. */
    if (h.parent != parent || memcmp(body, tokens, d->tok_bytes) != 0) return false;
    int32_t b;
    if (!kv_block_alloc(p, 1, &b)) return false;
    if (!kv_seq_append(s, b)) {
        kv_block_unref(p, b);
        return false;
    }
    memcpy(kv_block_k(p, b, 0), body + d->tok_bytes, kv_pool_block_bytes(p));
    kv_prefix_commit(p, s, all, (s->n_hashed + 1) * bs);
    pthread_mutex_lock(&d->mu);
    disk_entry *e = *index_slot(d, hash);
    if (e) e->stamp = next_stamp(d);
    d->st.hits++;
    d->st.hit_tokens += bs;
    pthread_mutex_unlock(&d->mu);
    utimensat(AT_FDCWD, path, NULL, 0); /* its recency survives a restart */
    return true;
}

int64_t kv_disk_prefix_match(kv_disk *d, kv_seq *s, const int32_t *tokens, int64_t n_tokens) {
    kv_pool *p = d->pool;
    const int bs = kv_pool_cfg(p)->block_size;
    for (;;) {
        int64_t have = kv_prefix_match(p, s, tokens, n_tokens);
        if (s->n_blocks != s->n_hashed || have + bs > n_tokens) return have;
        if (!load_block(d, s, tokens, kv_block_hash(s->chain_hash, tokens + have, bs))) return have;
    }
}

int64_t kv_disk_save(kv_disk *d, const kv_seq *s, int64_t n_blocks, kvl_error *err) {
    if (n_blocks > s->n_hashed) n_blocks = s->n_hashed;
    int64_t saved = 0;
    for (int64_t i = 0; i < n_blocks; i++) {
        uint64_t hash, parent;
        const int32_t *toks;
        int32_t b = s->blocks[i];
        if (b < 0 || !kv_block_prefix_info(d->pool, b, &hash, &parent, &toks)) continue;
        if (!on_disk(d, hash)) {
            build_file(d, d->read_buf, hash, parent, toks, kv_block_k(d->pool, b, 0));
            if (!write_file(d, d->read_buf, true, err)) return -1;
        }
        saved++;
    }
    return saved;
}

kv_disk_stats kv_disk_get_stats(kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    kv_disk_stats st = d->st;
    pthread_mutex_unlock(&d->mu);
    return st;
}
