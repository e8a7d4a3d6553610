/* kv_disk reads: block files read and verified, the reader thread, the
 * synchronous lookup (kv_disk_prefix_match) and the background loads that
 * admission waits on (kv_disk_prefix_step). See kv_disk_internal.h. */
#define _GNU_SOURCE
#include "kv_disk.h"
#include "kv_disk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- reading a block ---- */

typedef enum read_result { READ_OK, READ_MISS, READ_BAD } read_result;

/* Reads block `hash` (expected parent hash and token ids) with its bytes
 * straight into dst (the pool's block bytes) and verifies it: READ_BAD (the
 * file is deleted) when torn or damaged, READ_MISS when gone or another
 * prefix's (a hash collision). io->buf takes the header and token ids. */
static read_result read_block(kv_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
                              uint8_t *dst, disk_io *io) {
    char path[4096];
    kvd_block_path(d, hash, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { /* deleted since (by the size limit, or by hand) */
        const bool gone = errno == ENOENT;
        pthread_mutex_lock(&d->sync.mu);
        if (gone) kvd_index_drop(d, hash);
        pthread_mutex_unlock(&d->sync.mu);
        return READ_MISS;
    }
    const size_t head = sizeof(disk_header) + d->tok_bytes, body = d->file_bytes - head;
    /* plain read()s, front to back (so a FIFO standing in for a block file blocks
     * here, which the tests use to hold a read at a known point) */
    bool ok = kvd_io_all(fd, io->buf, head, -1, false) && kvd_io_all(fd, dst, body, -1, false);
    uint8_t extra; /* a file one byte longer is as damaged as a short one */
    if (ok && read(fd, &extra, 1) != 0) ok = false;
    close(fd);
    disk_header h;
    memcpy(&h, io->buf, sizeof h);
    if (ok) {
        XXH3_64bits_reset(io->xxh); /* the same value as one XXH3_64bits over tokens + bytes */
        XXH3_64bits_update(io->xxh, io->buf + sizeof h, d->tok_bytes);
        XXH3_64bits_update(io->xxh, dst, body);
        ok = kvd_header_ok(d, &h, hash) && h.payload_xxh == XXH3_64bits_digest(io->xxh);
    }
    pthread_mutex_lock(&d->sync.mu);
    d->st.reads++;
    if (!ok) {
        kvd_index_drop(d, hash);
        d->st.corrupt++;
    }
    pthread_mutex_unlock(&d->sync.mu);
    if (!ok) { /* damaged: drop it; the block is recomputed */
        unlink(path);
        kvl_log(KVL_LOG_WARN, "kv disk: %s failed its checks and was deleted", path);
        return READ_BAD;
    }
    /* Intact, but a hash collision is still a miss. */
    if (h.parent != parent || memcmp(io->buf + sizeof h, tokens, d->tok_bytes) != 0)
        return READ_MISS;
    pthread_mutex_lock(&d->sync.mu);
    disk_entry *e = *kvd_index_slot(d, hash);
    if (e) e->stamp = kvd_next_stamp(d);
    pthread_mutex_unlock(&d->sync.mu);
    utimensat(AT_FDCWD, path, NULL, 0); /* its recency survives a restart */
    return READ_OK;
}

/* The reader thread: one load at a time, block by block, stopping at the
 * first that does not verify or when its sequence gave it up. */
void *kvd_reader_main(void *arg) {
    kv_disk *d = arg;
    const int bs = kv_pool_cfg(d->pool)->block_size;
    pthread_mutex_lock(&d->sync.mu);
    for (;;) {
        while (!d->q_head && !d->stop_reader) pthread_cond_wait(&d->sync.read, &d->sync.mu);
        if (d->stop_reader) break;
        kv_disk_load *l = d->q_head;
        d->q_head = l->qnext;
        if (!d->q_head) d->q_tail = NULL;
        l->queued = false;
        int ok = 0;
        while (ok < l->n && !l->abandoned) {
            pthread_mutex_unlock(&d->sync.mu);
            read_result r = read_block(d, l->hashes[ok], ok ? l->hashes[ok - 1] : l->parent,
                                       l->tokens + (size_t)ok * bs, l->dst[ok], &d->reader_io);
            pthread_mutex_lock(&d->sync.mu);
            if (r != READ_OK) break;
            ok++;
        }
        l->n_ok = ok;
        l->done = true;
        pthread_cond_broadcast(&d->sync.done);
        void (*fn)(void *) = d->notify;
        void *user = d->notify_user;
        if (fn) {
            d->notifying++;
            pthread_mutex_unlock(&d->sync.mu);
            fn(user); /* outside mu: it may take the caller's locks */
            pthread_mutex_lock(&d->sync.mu);
            if (--d->notifying == 0) pthread_cond_broadcast(&d->sync.done);
        }
    }
    pthread_mutex_unlock(&d->sync.mu);
    return NULL;
}

void kvd_free_load(kv_disk *d, kv_disk_load *l) {
    for (int i = 0; i < l->n; i++) kv_block_unref(d->pool, l->blocks[i]);
    free(l->blocks);
    free(l->hashes);
    free(l->dst);
    free(l->tokens);
    free(l);
}

/* ---- lookup ---- */

/* Reads s's next block of `all` (hash, with parent s->chain_hash) into a new
 * RAM block appended to s and committed, now. False (nothing changed) when it
 * is not on disk, does not verify, or no RAM block is free. */
static bool load_block(kv_disk *d, kv_seq *s, const int32_t *all, uint64_t hash) {
    if (!kvd_on_disk(d, hash)) return false;
    kv_pool *p = d->pool;
    const int bs = kv_pool_cfg(p)->block_size;
    int32_t b;
    if (!kv_block_alloc(p, 1, &b)) return false;
    read_result r =
        read_block(d, hash, s->chain_hash, all + s->n_hashed * bs, kv_block_k(p, b, 0), &d->io);
    if (r != READ_OK || !kv_seq_append(s, b)) {
        kv_block_unref(p, b);
        return false;
    }
    kv_prefix_commit(p, s, all, (s->n_hashed + 1) * bs);
    pthread_mutex_lock(&d->sync.mu);
    d->st.hits++;
    d->st.hit_tokens += bs;
    pthread_mutex_unlock(&d->sync.mu);
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

/* ---- background reads ---- */

static bool load_ready_locked(const kv_disk *d, const kv_disk_load *l) {
    return l->n > 0 ? l->done : l->gen != d->settled;
}

bool kv_disk_load_ready(kv_disk *d, const kv_disk_load *l) {
    pthread_mutex_lock(&d->sync.mu);
    bool r = load_ready_locked(d, l);
    pthread_mutex_unlock(&d->sync.mu);
    return r;
}

/* Takes l out of d->loads (and the reader's queue); mu held. A wait for it
 * becomes ready. */
static void unlink_load_locked(kv_disk *d, kv_disk_load *l) {
    for (kv_disk_load **pp = &d->loads; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    if (l->queued) {
        kv_disk_load *prev = NULL;
        for (kv_disk_load *q = d->q_head; q; prev = q, q = q->qnext)
            if (q == l) {
                if (prev) prev->qnext = q->qnext;
                else d->q_head = q->qnext;
                if (d->q_tail == q) d->q_tail = prev;
                break;
            }
        l->queued = false;
    }
    d->settled++;
}

void kv_disk_load_cancel(kv_disk *d, kv_disk_load *l) {
    if (!l) return;
    pthread_mutex_lock(&d->sync.mu);
    if (l->n > 0) d->st.loads_abandoned++;
    /* queued or finished: nobody else touches its blocks */
    bool now = l->n == 0 || l->queued || l->done;
    if (now) unlink_load_locked(d, l);
    else l->abandoned = true; /* the reader stops after its current block */
    pthread_mutex_unlock(&d->sync.mu);
    if (now) kvd_free_load(d, l);
}

void kv_disk_reap(kv_disk *d) {
    kv_disk_load *done = NULL;
    pthread_mutex_lock(&d->sync.mu);
    for (kv_disk_load *l = d->loads, *nx; l; l = nx) {
        nx = l->next;
        if (l->abandoned && l->done) {
            unlink_load_locked(d, l);
            l->next = done;
            done = l;
        }
    }
    pthread_mutex_unlock(&d->sync.mu);
    while (done) {
        kv_disk_load *l = done;
        done = l->next;
        kvd_free_load(d, l);
    }
}

static bool pending_locked(const kv_disk *d) {
    if (!d->loads) return false;
    for (const kv_disk_load *l = d->loads; l; l = l->next)
        if (load_ready_locked(d, l)) return false; /* an abandoned one: ready to give back */
    return true;
}

bool kv_disk_loads_pending(kv_disk *d) {
    pthread_mutex_lock(&d->sync.mu);
    bool r = pending_locked(d);
    pthread_mutex_unlock(&d->sync.mu);
    return r;
}

bool kv_disk_has_loads(kv_disk *d) {
    pthread_mutex_lock(&d->sync.mu);
    bool r = d->loads != NULL;
    pthread_mutex_unlock(&d->sync.mu);
    return r;
}

void kv_disk_wait_loads(kv_disk *d) {
    pthread_mutex_lock(&d->sync.mu);
    while (pending_locked(d)) pthread_cond_wait(&d->sync.done, &d->sync.mu);
    pthread_mutex_unlock(&d->sync.mu);
}

void kv_disk_set_notify(kv_disk *d, void (*fn)(void *user), void *user) {
    pthread_mutex_lock(&d->sync.mu);
    d->notify = fn;
    d->notify_user = user;
    while (d->notifying) pthread_cond_wait(&d->sync.done, &d->sync.mu);
    pthread_mutex_unlock(&d->sync.mu);
}

/* Attaches to s the blocks of a finished load that verified and still
 * continue its chain (RAM may have gained some meanwhile: those are taken
 * from RAM and ours given back). Frees l. Returns the tokens attached from it. */
static int64_t attach_load(kv_disk *d, kv_disk_load *l, kv_seq *s, const int32_t *tokens,
                           int64_t n_tokens) {
    kv_pool *p = d->pool;
    const int bs = kv_pool_cfg(p)->block_size;
    pthread_mutex_lock(&d->sync.mu);
    unlink_load_locked(d, l);
    const int n_ok = l->n_ok;
    pthread_mutex_unlock(&d->sync.mu);
    int64_t got = 0;
    if (l->n > 0) kv_prefix_match(p, s, tokens, n_tokens);
    for (int i = 0; i < l->n; i++) {
        const int64_t idx = l->first + i;
        const uint64_t parent = i ? l->hashes[i - 1] : l->parent;
        if (i < n_ok && idx == s->n_hashed && s->n_blocks == s->n_hashed &&
            s->chain_hash == parent && (idx + 1) * bs <= n_tokens &&
            kv_seq_append(s, l->blocks[i])) {
            kv_prefix_commit(p, s, tokens, (idx + 1) * bs);
            got += bs;
            l->blocks[i] = -1; /* the table holds it now */
        }
    }
    for (int i = 0; i < l->n; i++)
        if (l->blocks[i] >= 0) kv_block_unref(p, l->blocks[i]);
    l->n = 0;
    kvd_free_load(d, l);
    if (got) {
        pthread_mutex_lock(&d->sync.mu);
        d->st.hits += got / bs;
        d->st.hit_tokens += got;
        pthread_mutex_unlock(&d->sync.mu);
    }
    return got;
}

int64_t kv_disk_prefix_step(kv_disk *d, kv_seq *s, const int32_t *tokens, int64_t n_tokens,
                            kv_disk_load **load, int64_t *from_disk) {
    enum { LOAD_MAX = 256 }; /* blocks one load reads */
    kv_pool *p = d->pool;
    const int bs = kv_pool_cfg(p)->block_size;
    kv_disk_reap(d);
    if (*load) {
        if (!kv_disk_load_ready(d, *load)) return s->n_hashed * bs;
        *from_disk += attach_load(d, *load, s, tokens, n_tokens);
        *load = NULL;
    }
    int64_t have = kv_prefix_match(p, s, tokens, n_tokens);
    if (s->n_blocks != s->n_hashed) return have;
    uint64_t hashes[LOAD_MAX], h = s->chain_hash;
    int run = 0;
    for (int64_t at = have; run < LOAD_MAX && at + bs <= n_tokens; at += bs) {
        h = kv_block_hash(h, tokens + at, bs);
        if (!kvd_on_disk(d, h)) break;
        hashes[run++] = h;
    }
    if (run == 0) return have;
    pthread_mutex_lock(&d->sync.mu);
    bool busy = false; /* another load reads this block already: wait for it instead */
    for (const kv_disk_load *l = d->loads; l && !busy; l = l->next)
        for (int i = 0; i < l->n && !busy && !l->abandoned; i++) busy = l->hashes[i] == hashes[0];
    pthread_mutex_unlock(&d->sync.mu);
    int64_t n = busy ? 0 : kv_pool_n_free(p) < run ? kv_pool_n_free(p) : run;
    if (!busy && n <= 0) return have; /* no RAM to read into: computed instead */
    kv_disk_load *l = calloc(1, sizeof *l);
    bool ok = l != NULL;
    if (ok && n > 0) {
        l->blocks = malloc((size_t)n * sizeof *l->blocks);
        l->hashes = malloc((size_t)n * sizeof *l->hashes);
        l->dst = malloc((size_t)n * sizeof *l->dst);
        l->tokens = malloc((size_t)n * bs * sizeof *l->tokens);
        ok = l->blocks && l->hashes && l->dst && l->tokens && kv_block_alloc(p, n, l->blocks);
    }
    if (!ok) {
        if (l) {
            l->n = 0; /* no blocks taken */
            kvd_free_load(d, l);
        }
        return have;
    }
    l->n = (int)n;
    l->parent = s->chain_hash;
    l->first = s->n_hashed;
    for (int64_t i = 0; i < n; i++) {
        l->hashes[i] = hashes[i];
        l->dst[i] = kv_block_k(p, l->blocks[i], 0);
    }
    if (n > 0) memcpy(l->tokens, tokens + have, (size_t)n * bs * sizeof *l->tokens);
    pthread_mutex_lock(&d->sync.mu);
    l->gen = d->settled;
    l->next = d->loads;
    d->loads = l;
    if (n > 0) {
        l->queued = true;
        if (d->q_tail) d->q_tail->qnext = l;
        else d->q_head = l;
        d->q_tail = l;
        d->st.loads++;
        pthread_cond_signal(&d->sync.read);
    }
    pthread_mutex_unlock(&d->sync.mu);
    *load = l;
    return have;
}
