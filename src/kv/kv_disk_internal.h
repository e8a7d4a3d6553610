/* kv_disk internals shared by kv_disk.c (open, writer, index, pins, close)
 * and kv_disk_load.c (reads); not an API. */
#ifndef KVLLM_KV_DISK_INTERNAL_H
#define KVLLM_KV_DISK_INTERNAL_H

#include "kv_disk.h"

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>
#include <xxhash.h>

#define DISK_MAGIC "KVLLMKVB"
/* Bumped whenever the pool's block layout or this format changes: files of
 * another version belong to another identity and are never loaded. 2: Q8_0
 * caches hold K and V rotated (model_forward.c, kv_rotation). */
#define DISK_VERSION 2u

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
    int32_t pins;   /* saved prefixes holding it: kept from the size limit while > 0 */
    struct disk_entry *next;
} disk_entry;

/* A saved prefix (kv_disk_save): the blocks it pins. Engine thread only. */
typedef struct pin_rec {
    uint64_t id; /* the hash of its last block; names its pin file */
    int64_t n;
    uint64_t *hashes;
    struct pin_rec *next;
} pin_rec;

/* A background read. Created, attached and freed by the thread that drives the
 * pool (the owner); the reader writes only the reserved blocks' bytes and
 * n_ok, and both sides exchange it under mu. */
struct kv_disk_load {
    kv_disk_load *next;  /* d->loads: every load not freed yet */
    kv_disk_load *qnext; /* d->q_head: waiting for the reader */
    int n;               /* blocks to read; 0: a wait for another load of the same blocks */
    int n_ok;            /* leading blocks read and verified (set with done) */
    bool queued, done, abandoned;
    uint64_t gen;    /* a wait: d->settled when it began (ready once that changed) */
    uint64_t parent; /* the chain hash before the first block */
    int64_t first;   /* chain index of the first block */
    int32_t *blocks; /* reserved RAM blocks, one reference each held by the load */
    uint64_t *hashes;
    uint8_t **dst;   /* their bytes (kv_block_k), taken by the owner */
    int32_t *tokens; /* n * block_size expected token ids */
};

/* What one thread reads (and checks) block files with. */
typedef struct disk_io {
    uint8_t *buf;
    XXH3_state_t *xxh;
} disk_io;

typedef struct disk_slot {
    uint8_t *buf; /* header, tokens, payload */
    bool busy;    /* queued or being written */
} disk_slot;

/* The disk tier's lock (over what is marked mu below) and the conditions
 * waited on under it; kvd_sync_init / kvd_sync_destroy. */
typedef struct kvd_sync {
    pthread_mutex_t mu;
    pthread_cond_t work, idle; /* the writer: a slot queued / the queue drained */
    pthread_cond_t read, done; /* the reader: a load queued / a load settled or notified */
} kvd_sync;

struct kv_disk {
    kv_pool *pool;
    kvd_sync sync;
    char *dir; /* dir, slots and ring: one block, sized at open, that starts at slots */
    uint64_t max_bytes;
    disk_header ident;   /* identity fields filled, the rest zero */
    uint64_t ident_hash; /* names our files */
    size_t tok_bytes, file_bytes;
    /* index: hash -> entry (chained), guarded by mu */
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
    disk_io io; /* engine thread: buf holds one file */
    /* pins */
    uint64_t max_pinned_bytes; /* 0: no cap */
    int64_t n_pinned;          /* entries with pins > 0 (mu) */
    pin_rec *pins;             /* engine thread */
    /* background reads (mu) */
    kv_disk_load *loads, *q_head, *q_tail;
    uint64_t settled; /* loads attached or given back so far */
    bool stop_reader;
    pthread_t reader;
    bool reader_started;
    void (*notify)(void *user);
    void *notify_user;
    int notifying;
    disk_io reader_io; /* reader thread: buf holds a header and token ids */
    kv_disk_stats st;
};

/* kv_disk.c */
/* The block file of hash. */
void kvd_block_path(const kv_disk *d, uint64_t hash, char *out, size_t cap);
/* A stamp later than every earlier one (the clock may stand still or step back). */
uint64_t kvd_next_stamp(kv_disk *d);
/* The index (callers hold mu). */
disk_entry **kvd_index_slot(kv_disk *d, uint64_t hash);
void kvd_index_drop(kv_disk *d, uint64_t hash);
/* Whether a header read from disk is one of ours, intact, for this hash. */
bool kvd_header_ok(const kv_disk *d, const disk_header *h, uint64_t hash);
bool kvd_on_disk(kv_disk *d, uint64_t hash);
/* Moves all n bytes between p and fd: write() when out, else pread() at off,
 * or read() from the current offset when off < 0. Retries when interrupted;
 * false on an error or an early end of file. */
bool kvd_io_all(int fd, void *p, size_t n, off_t off, bool out);
/* The identity fields of a file of pool p's blocks computed by model_id's
 * model (the rest of *h zeroed; the version DISK_VERSION: the blocks'
 * layout, which prefix files share). */
void kvd_identity(disk_header *h, const kv_pool *p, const uint8_t model_id[16]);

/* kv_disk_load.c */
/* The reader thread (arg: the kv_disk). */
void *kvd_reader_main(void *arg);
/* Gives back the load's reserved blocks and frees it. */
void kvd_free_load(kv_disk *d, kv_disk_load *l);

#endif
