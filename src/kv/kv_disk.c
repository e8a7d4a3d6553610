/* kv_disk: the disk tier of the prefix cache: opening (the directory
 * indexed), the writer thread and the eviction hook, closing, and saved
 * prefixes (pins). Reads (the reader thread, lookups, background loads):
 * kv_disk_load.c. See kv_disk.h. */
#define _GNU_SOURCE
#include "kv_disk.h"
#include "kv_disk_internal.h"

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

void kv_disk_model_id_extend(uint8_t id[16], const char *const *extra, int n) {
    if (n <= 0) return;
    XXH3_state_t *h = XXH3_createState();
    if (!h) { /* then no file of ours can match: a new identity of zeros but the first byte */
        memset(id, 0, 16);
        id[0] = 0xFF;
        return;
    }
    XXH3_128bits_reset(h);
    XXH3_128bits_update(h, id, 16);
    for (int i = 0; i < n; i++) XXH3_128bits_update(h, extra[i], strlen(extra[i]) + 1);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h));
    memcpy(id, c.digest, 16);
    XXH3_freeState(h);
}

void kvd_identity(disk_header *h, const kv_pool *p, const uint8_t model_id[16]) {
    const kv_pool_config *pc = kv_pool_cfg(p);
    const kv_pool_geom *geom = kv_pool_geometry(p);
    memset(h, 0, sizeof *h);
    h->version = DISK_VERSION;
    memcpy(h->model_id, model_id, 16);
    h->dtype_k = pc->dtype;
    h->dtype_v = kv_pool_dtype_v(p);
    h->block_size = pc->block_size;
    h->n_layers = pc->n_layers;
    h->n_kv_heads = pc->n_kv_heads;
    h->head_dim_k = pc->head_dim_k;
    h->head_dim_v = pc->head_dim_v;
    h->k_row = geom->k_row;
    h->v_row = geom->v_row;
    h->block_bytes = geom->block_bytes;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A stamp later than every earlier one (the clock may stand still or step back). */
uint64_t kvd_next_stamp(kv_disk *d) {
    uint64_t t = now_ns();
    d->last_stamp = t > d->last_stamp ? t : d->last_stamp + 1;
    return d->last_stamp;
}

void kvd_block_path(const kv_disk *d, uint64_t hash, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx-%016llx.kvb", d->dir, (unsigned long long)d->ident_hash,
             (unsigned long long)hash);
}

/* ---- index (callers hold mu) ---- */

disk_entry **kvd_index_slot(kv_disk *d, uint64_t hash) {
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
    disk_entry **pp = kvd_index_slot(d, hash);
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

void kvd_index_drop(kv_disk *d, uint64_t hash) {
    disk_entry **pp = kvd_index_slot(d, hash);
    if (!*pp) return;
    disk_entry *e = *pp;
    *pp = e->next;
    if (e->pins > 0) d->n_pinned--;
    free(e);
    d->n_entries--;
    d->st.pinned_blocks = d->n_pinned;
    d->st.pinned_bytes = (uint64_t)d->n_pinned * d->file_bytes;
    d->st.blocks = d->n_entries;
    d->st.bytes = (uint64_t)d->n_entries * d->file_bytes;
}

static void pin_entry(kv_disk *d, disk_entry *e, int delta) {
    bool was = e->pins > 0;
    e->pins += delta;
    if (e->pins < 0) e->pins = 0;
    d->n_pinned += (e->pins > 0) - was;
    d->st.pinned_blocks = d->n_pinned;
    d->st.pinned_bytes = (uint64_t)d->n_pinned * d->file_bytes;
}

/* Deletes least recently used files until the tier fits its size; pinned
 * ones are never deleted (their bytes are capped below the size). O(n) per
 * deletion, which is small next to writing a block file. */
static void enforce_limit(kv_disk *d) {
    while (d->max_bytes && d->n_entries > 0 &&
           (uint64_t)d->n_entries * d->file_bytes > d->max_bytes) {
        disk_entry *old = NULL;
        for (size_t i = 0; i < d->n_buckets; i++)
            for (disk_entry *e = d->buckets[i]; e; e = e->next)
                if (e->pins == 0 && (!old || e->stamp < old->stamp)) old = e;
        if (!old) return; /* all pinned */
        char path[4096];
        kvd_block_path(d, old->hash, path, sizeof path);
        unlink(path);
        kvd_index_drop(d, old->hash);
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

bool kvd_io_all(int fd, void *p, size_t n, off_t off, bool out) {
    uint8_t *q = p;
    while (n > 0) {
        ssize_t k = out ? write(fd, q, n) : off < 0 ? read(fd, q, n) : pread(fd, q, n, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        q += k;
        n -= (size_t)k;
        if (off >= 0) off += k;
    }
    return true;
}

/* Writes one file crash-safely: a temporary, fdatasync (unless the caller
 * syncs the whole file system afterwards), rename. Then indexes it (pinned
 * once more when pin, before the size limit can see it). */
static bool write_file(kv_disk *d, uint8_t *buf, bool sync, bool pin, kvl_error *err) {
    seal_file(d, buf);
    uint64_t hash;
    memcpy(&hash, buf + offsetof(disk_header, hash), sizeof hash);
    char path[4096], tmp[4200];
    kvd_block_path(d, hash, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%ld.%lx.tmp", path, (long)getpid(),
             (unsigned long)pthread_self());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return kvl_fail(err, "kv disk: cannot create %s: %s", tmp, strerror(errno));
    bool ok = kvd_io_all(fd, buf, d->file_bytes, -1, true) && (!sync || fdatasync(fd) == 0);
    int e = errno;
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        unlink(tmp);
        return kvl_fail(err, "kv disk: cannot write %s: %s", path, strerror(e));
    }
    pthread_mutex_lock(&d->sync.mu);
    index_put(d, hash, kvd_next_stamp(d));
    disk_entry *ent = *kvd_index_slot(d, hash);
    if (pin && ent) pin_entry(d, ent, +1);
    d->st.writes++;
    enforce_limit(d);
    pthread_mutex_unlock(&d->sync.mu);
    return true;
}

static void *writer_main(void *arg) {
    kv_disk *d = arg;
    pthread_mutex_lock(&d->sync.mu);
    for (;;) {
        while (!d->ring_len && !d->stop) pthread_cond_wait(&d->sync.work, &d->sync.mu);
        if (!d->ring_len) break; /* stopping and drained */
        int si = d->ring[d->ring_head];
        d->ring_head = (d->ring_head + 1) % d->n_slots;
        d->ring_len--;
        d->writing++;
        pthread_mutex_unlock(&d->sync.mu);
        kvl_error err;
        /* No sync per file: a kill leaves the renamed file whole (the page
         * cache has it), and a file a power loss tore fails its checks and is
         * dropped; a sync each would cap the writer at the disk's flush rate
         * and drop most evictions (bench/README.md). */
        if (!write_file(d, d->slots[si].buf, false, false, &err))
            kvl_log(KVL_LOG_WARN, "%s", err.msg);
        pthread_mutex_lock(&d->sync.mu);
        d->slots[si].busy = false;
        d->writing--;
        if (!d->ring_len && !d->writing) pthread_cond_broadcast(&d->sync.idle);
    }
    pthread_mutex_unlock(&d->sync.mu);
    return NULL;
}

bool kvd_on_disk(kv_disk *d, uint64_t hash) {
    pthread_mutex_lock(&d->sync.mu);
    bool found = *kvd_index_slot(d, hash) != NULL;
    pthread_mutex_unlock(&d->sync.mu);
    return found;
}

/* The pool's eviction hook: stage the block for the writer, or drop it. */
static void on_evict(void *user, kv_pool *p, int32_t b) {
    kv_disk *d = user;
    uint64_t hash, parent;
    const int32_t *toks;
    if (!kv_block_prefix_info(p, b, &hash, &parent, &toks) || kvd_on_disk(d, hash)) return;
    pthread_mutex_lock(&d->sync.mu);
    int si = -1;
    for (int i = 0; i < d->n_slots && si < 0; i++)
        if (!d->slots[i].busy) si = i;
    if (si < 0) {
        d->st.dropped++;
        pthread_mutex_unlock(&d->sync.mu);
        return;
    }
    d->slots[si].busy = true;
    pthread_mutex_unlock(&d->sync.mu);
    /* The copy happens outside the lock: the slot is ours until queued. */
    build_file(d, d->slots[si].buf, hash, parent, toks, kv_block_k(p, b, 0));
    pthread_mutex_lock(&d->sync.mu);
    d->ring[(d->ring_head + d->ring_len) % d->n_slots] = si;
    d->ring_len++;
    pthread_cond_signal(&d->sync.work);
    pthread_mutex_unlock(&d->sync.mu);
}

/* ---- open: index the directory ---- */

/* Whether a header read from disk is one of ours, intact, for this hash. */
bool kvd_header_ok(const kv_disk *d, const disk_header *h, uint64_t hash) {
    return memcmp(h, &d->ident, IDENTITY_BYTES) == 0 && h->hash == hash &&
           h->header_xxh == XXH3_64bits(h, offsetof(disk_header, header_xxh));
}

/* ---- pin files: "KVLLMPIN", u64 n, n block hashes, XXH3-64 of all before ---- */

static void pin_path(const kv_disk *d, uint64_t id, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx-%016llx.pin", d->dir, (unsigned long long)d->ident_hash,
             (unsigned long long)id);
}

static bool write_pin_file(kv_disk *d, const pin_rec *r, kvl_error *err) {
    size_t bytes = 16 + (size_t)r->n * 8 + 8;
    uint8_t *buf = malloc(bytes);
    if (!buf) return kvl_fail(err, "kv disk: out of memory");
    memcpy(buf, "KVLLMPIN", 8);
    uint64_t n = (uint64_t)r->n;
    memcpy(buf + 8, &n, 8);
    memcpy(buf + 16, r->hashes, (size_t)r->n * 8);
    uint64_t x = XXH3_64bits(buf, bytes - 8);
    memcpy(buf + bytes - 8, &x, 8);
    char path[4096], tmp[4200];
    pin_path(d, r->id, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && kvd_io_all(fd, buf, bytes, -1, true) && fdatasync(fd) == 0;
    int e = errno;
    if (fd >= 0) close(fd);
    free(buf);
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        unlink(tmp);
        return kvl_fail(err, "kv disk: cannot write the pin file %s: %s", path, strerror(e));
    }
    return true;
}

/* Reads a pin file; NULL when damaged (the caller deletes it). */
static pin_rec *read_pin_file(const char *path, uint64_t id) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat sb;
    uint8_t head[16];
    pin_rec *r = NULL;
    uint8_t *buf = NULL;
    uint64_t n;
    if (fstat(fd, &sb) != 0 || sb.st_size < 24 || !kvd_io_all(fd, head, 16, 0, false) ||
        memcmp(head, "KVLLMPIN", 8) != 0)
        goto out;
    memcpy(&n, head + 8, 8);
    if (n == 0 || n > (1u << 24) || (uint64_t)sb.st_size != 24 + n * 8) goto out;
    buf = malloc((size_t)sb.st_size);
    if (!buf || !kvd_io_all(fd, buf, (size_t)sb.st_size, 0, false)) goto out;
    uint64_t x;
    memcpy(&x, buf + sb.st_size - 8, 8);
    if (x != XXH3_64bits(buf, (size_t)sb.st_size - 8)) goto out;
    r = calloc(1, sizeof *r);
    if (r && !(r->hashes = malloc(n * 8))) {
        free(r);
        r = NULL;
    }
    if (r) {
        r->id = id;
        r->n = (int64_t)n;
        memcpy(r->hashes, buf + 16, n * 8);
    }
out:
    free(buf);
    close(fd);
    return r;
}

/* Calls visit for each of this identity's files named "<identity>-<16 hex
 * digits><ext>" (blocks: the block hash, pins: the pin id), with its path and
 * that number. This identity's ".tmp" files, writes a crash interrupted, are
 * deleted on the way; other files are left alone. */
typedef void (*file_visit)(kv_disk *d, const char *path, uint64_t id);

static void each_file(kv_disk *d, const char *ext, file_visit visit) {
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
        if (len > 4 && strcmp(n + len - 4, ".tmp") == 0) {
            unlink(path);
            continue;
        }
        unsigned long long id;
        char tail[8];
        if (len != 17 + 16 + 4 || sscanf(n + 17, "%16llx%7s", &id, tail) != 2 ||
            strcmp(tail, ext) != 0)
            continue;
        visit(d, path, id);
    }
    closedir(dir);
}

/* A block file: indexed when intact, deleted when ours by name but torn or damaged. */
static void index_block(kv_disk *d, const char *path, uint64_t hash) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat sb;
    disk_header h;
    bool ok = fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == d->file_bytes &&
              kvd_io_all(fd, &h, sizeof h, 0, false) && kvd_header_ok(d, &h, hash);
    close(fd);
    if (!ok) {
        unlink(path);
        d->st.corrupt++;
        return;
    }
    uint64_t stamp = (uint64_t)sb.st_mtim.tv_sec * 1000000000ull + (uint64_t)sb.st_mtim.tv_nsec;
    index_put(d, hash, stamp);
    if (stamp > d->last_stamp) d->last_stamp = stamp;
}

/* A pin file: its blocks pinned when intact, deleted when damaged. */
static void index_pin(kv_disk *d, const char *path, uint64_t id) {
    pin_rec *r = read_pin_file(path, id);
    if (!r) {
        unlink(path);
        return;
    }
    for (int64_t i = 0; i < r->n; i++) {
        disk_entry *e = *kvd_index_slot(d, r->hashes[i]);
        if (e) pin_entry(d, e, +1);
    }
    r->next = d->pins;
    d->pins = r;
}

/* Blocks first, so that the pins find their entries. */
static void index_dir(kv_disk *d) {
    each_file(d, ".kvb", index_block);
    each_file(d, ".pin", index_pin);
    enforce_limit(d);
}

static void kvd_sync_init(kvd_sync *y) {
    pthread_mutex_init(&y->mu, NULL);
    pthread_cond_init(&y->work, NULL);
    pthread_cond_init(&y->idle, NULL);
    pthread_cond_init(&y->read, NULL);
    pthread_cond_init(&y->done, NULL);
}

static void kvd_sync_destroy(kvd_sync *y) {
    pthread_mutex_destroy(&y->mu);
    pthread_cond_destroy(&y->work);
    pthread_cond_destroy(&y->idle);
    pthread_cond_destroy(&y->read);
    pthread_cond_destroy(&y->done);
}

static bool io_init(disk_io *io, size_t bytes) {
    io->buf = malloc(bytes);
    io->xxh = XXH3_createState();
    return io->buf && io->xxh;
}

static void io_free(disk_io *io) {
    free(io->buf);
    XXH3_freeState(io->xxh);
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
    kvd_identity(&d->ident, p, c->model_id);
    memcpy(d->ident.magic, DISK_MAGIC, 8);
    d->ident.header_bytes = sizeof(disk_header);
    const kv_pool_geom *geom = kv_pool_geometry(p);
    d->ident_hash = XXH3_64bits(&d->ident, IDENTITY_BYTES);
    d->tok_bytes = (size_t)pc->block_size * sizeof(int32_t);
    d->file_bytes = kv_disk_file_bytes(geom->block_bytes, pc->block_size);
    d->n_slots = c->queue_blocks > 0 ? c->queue_blocks : 256;
    d->n_buckets = 1024;
    d->buckets = calloc(d->n_buckets, sizeof *d->buckets);
    const kvl_part parts[] = {KVL_PART(d->slots, d->n_slots), KVL_PART(d->ring, d->n_slots),
                              KVL_PART(d->dir, strlen(c->dir) + 1)};
    d->max_pinned_bytes = c->max_pinned_bytes ? c->max_pinned_bytes : d->max_bytes / 2;
    if (d->max_bytes && (!d->max_pinned_bytes || d->max_pinned_bytes > d->max_bytes))
        d->max_pinned_bytes = d->max_bytes;
    bool ok = d->buckets && KVL_ALLOC_PARTS(parts) && io_init(&d->io, d->file_bytes) &&
              io_init(&d->reader_io, sizeof(disk_header) + d->tok_bytes);
    if (ok) strcpy(d->dir, c->dir);
    for (int i = 0; ok && i < d->n_slots; i++)
        ok = (d->slots[i].buf = malloc(d->file_bytes)) != NULL;
    kvd_sync_init(&d->sync);
    if (!ok) {
        kvl_fail(err, "kv disk: out of memory for %d staging blocks of %zu bytes", d->n_slots,
                 d->file_bytes);
        kv_disk_close(d);
        return NULL;
    }
    index_dir(d);
    if (kvl_thread_start(&d->writer, writer_main, d) != 0) {
        kvl_fail(err, "kv disk: cannot start the writer thread");
        kv_disk_close(d);
        return NULL;
    }
    d->writer_started = true;
    if (kvl_thread_start(&d->reader, kvd_reader_main, d) != 0) {
        kvl_fail(err, "kv disk: cannot start the reader thread");
        kv_disk_close(d);
        return NULL;
    }
    d->reader_started = true;
    kv_pool_set_evict_hook(p, on_evict, d);
    return d;
}

void kv_disk_flush(kv_disk *d) {
    pthread_mutex_lock(&d->sync.mu);
    while (d->ring_len || d->writing) pthread_cond_wait(&d->sync.idle, &d->sync.mu);
    pthread_mutex_unlock(&d->sync.mu);
}

void kv_disk_close(kv_disk *d) {
    if (!d) return;
    if (d->reader_started) {
        pthread_mutex_lock(&d->sync.mu);
        d->stop_reader = true;
        pthread_cond_signal(&d->sync.read);
        pthread_mutex_unlock(&d->sync.mu);
        pthread_join(d->reader, NULL);
    }
    while (d->loads) { /* their sequences are gone; the reader is too */
        kv_disk_load *l = d->loads;
        d->loads = l->next;
        kvd_free_load(d, l);
    }
    while (d->pins) {
        pin_rec *r = d->pins;
        d->pins = r->next;
        free(r->hashes);
        free(r);
    }
    if (d->writer_started) {
        kv_pool_set_evict_hook(d->pool, NULL, NULL);
        /* What RAM still holds goes to disk too, so a restart finds it. */
        const int64_t n = kv_pool_cfg(d->pool)->n_blocks;
        for (int32_t b = 0; b < n; b++) {
            uint64_t hash, parent;
            const int32_t *toks;
            if (!kv_block_prefix_info(d->pool, b, &hash, &parent, &toks) || kvd_on_disk(d, hash))
                continue;
            kvl_error err;
            build_file(d, d->io.buf, hash, parent, toks, kv_block_k(d->pool, b, 0));
            if (!write_file(d, d->io.buf, false, false, &err)) {
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
        pthread_mutex_lock(&d->sync.mu);
        d->stop = true;
        pthread_cond_signal(&d->sync.work);
        pthread_mutex_unlock(&d->sync.mu);
        pthread_join(d->writer, NULL);
    }
    for (size_t i = 0; d->buckets && i < d->n_buckets; i++)
        for (disk_entry *e = d->buckets[i], *nx; e; e = nx) {
            nx = e->next;
            free(e);
        }
    for (int i = 0; d->slots && i < d->n_slots; i++) free(d->slots[i].buf);
    kvd_sync_destroy(&d->sync);
    io_free(&d->io);
    io_free(&d->reader_io);
    free(d->buckets);
    kvl_free(d->slots); /* and the ring and dir */
    free(d);
}

/* ---- saved prefixes ---- */

int64_t kv_disk_save(kv_disk *d, const kv_seq *s, int64_t n_blocks, kvl_error *err) {
    if (n_blocks > s->n_hashed) n_blocks = s->n_hashed;
    if (n_blocks <= 0) return 0;
    pin_rec *r = calloc(1, sizeof *r);
    if (!r || !(r->hashes = malloc((size_t)n_blocks * sizeof *r->hashes))) {
        free(r);
        kvl_fail(err, "kv disk: out of memory");
        return -1;
    }
    for (int64_t i = 0; i < n_blocks; i++) {
        uint64_t hash, parent;
        const int32_t *toks;
        if (s->blocks[i] >= 0 && kv_block_prefix_info(d->pool, s->blocks[i], &hash, &parent, &toks))
            r->hashes[r->n++] = hash;
    }
    r->id = n_blocks == s->n_hashed ? s->chain_hash : r->n ? r->hashes[r->n - 1] : 0;
    for (pin_rec *o = d->pins; o && r; o = o->next)
        if (o->id == r->id || r->n == 0) { /* saved already (or nothing to pin): the files only */
            free(r->hashes);
            free(r);
            r = NULL;
            break;
        }
    /* The blocks this save would pin for the first time must fit the cap. */
    pthread_mutex_lock(&d->sync.mu);
    int64_t fresh = 0;
    for (int64_t i = 0; r && i < r->n; i++) {
        disk_entry *e = *kvd_index_slot(d, r->hashes[i]);
        fresh += !e || e->pins == 0;
    }
    const uint64_t want = (uint64_t)(d->n_pinned + fresh) * d->file_bytes;
    const bool over = d->max_pinned_bytes && want > d->max_pinned_bytes;
    pthread_mutex_unlock(&d->sync.mu);
    if (over) {
        kvl_fail(err,
                 "pinning this prefix would pin %llu bytes of the KV disk tier, over its cap of "
                 "%llu (--kv-disk-pin-max; unpin a saved prefix with POST /v1/kv/unpin first)",
                 (unsigned long long)want, (unsigned long long)d->max_pinned_bytes);
        free(r->hashes);
        free(r);
        return KV_DISK_OVER_PIN_CAP;
    }
    int64_t saved = 0, pinned = 0;
    bool ok = true;
    for (int64_t i = 0; ok && i < n_blocks; i++) {
        uint64_t hash, parent;
        const int32_t *toks;
        int32_t b = s->blocks[i];
        if (b < 0 || !kv_block_prefix_info(d->pool, b, &hash, &parent, &toks)) continue;
        bool have = false;
        if (r) { /* pin it where it is, under the lock the size limit takes */
            pthread_mutex_lock(&d->sync.mu);
            disk_entry *e = *kvd_index_slot(d, hash);
            if (e) pin_entry(d, e, +1);
            pthread_mutex_unlock(&d->sync.mu);
            have = e != NULL;
        } else {
            have = kvd_on_disk(d, hash);
        }
        if (!have) {
            build_file(d, d->io.buf, hash, parent, toks, kv_block_k(d->pool, b, 0));
            ok = write_file(d, d->io.buf, true, r != NULL, err);
        }
        if (ok) saved++;
        pinned += ok && r;
    }
    if (ok && r) ok = write_pin_file(d, r, err);
    if (!ok && r) { /* nothing stays pinned */
        pthread_mutex_lock(&d->sync.mu);
        for (int64_t i = 0; i < pinned; i++) {
            disk_entry *e = *kvd_index_slot(d, r->hashes[i]);
            if (e) pin_entry(d, e, -1);
        }
        enforce_limit(d);
        pthread_mutex_unlock(&d->sync.mu);
    }
    if (ok && r) {
        r->next = d->pins;
        d->pins = r;
    } else if (r) {
        free(r->hashes);
        free(r);
    }
    return ok ? saved : -1;
}

int64_t kv_disk_unpin(kv_disk *d, uint64_t root, const int32_t *tokens, int64_t n_tokens,
                      kvl_error *err) {
    const int bs = kv_pool_cfg(d->pool)->block_size;
    uint64_t id = root;
    for (int64_t at = 0; at + bs <= n_tokens; at += bs) id = kv_block_hash(id, tokens + at, bs);
    pin_rec **pp = &d->pins;
    while (*pp && (n_tokens < bs || (*pp)->id != id)) pp = &(*pp)->next;
    if (!*pp) {
        kvl_fail(err, "no saved prefix is exactly these %lld tokens (%lld full blocks)",
                 (long long)n_tokens, (long long)(n_tokens / bs));
        return -1;
    }
    pin_rec *r = *pp;
    *pp = r->next;
    char path[4096];
    pin_path(d, r->id, path, sizeof path);
    unlink(path);
    pthread_mutex_lock(&d->sync.mu);
    for (int64_t i = 0; i < r->n; i++) {
        disk_entry *e = *kvd_index_slot(d, r->hashes[i]);
        if (e) pin_entry(d, e, -1);
    }
    enforce_limit(d);
    pthread_mutex_unlock(&d->sync.mu);
    int64_t n = r->n;
    free(r->hashes);
    free(r);
    return n;
}

kv_disk_stats kv_disk_get_stats(kv_disk *d) {
    pthread_mutex_lock(&d->sync.mu);
    kv_disk_stats st = d->st;
    pthread_mutex_unlock(&d->sync.mu);
    return st;
}
