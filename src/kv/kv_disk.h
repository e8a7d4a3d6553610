/* kv_disk: the second KV tier, a directory of full prefix-cache blocks that
 * outlives RAM eviction and the process. Part of the kv module, in a header of
 * its own because it is an optional layer over the pool (kv.h stays the pool's
 * contract; only kv_disk.c and the engine's hooks need this one).
 *
 * Blocks enter the tier when the pool evicts them from its LRU list (a hook in
 * kv_block_alloc): their bytes are copied into a staging slot and a writer
 * thread checksums and writes them (temporary, rename), so the step path only copies; when every
 * slot is busy the block is dropped (counted). A prefix-cache miss continues
 * the hash chain on disk: each next full block found there is read into a
 * freshly allocated RAM block, verified (checksum, parent hash, token ids) and
 * committed to the prefix cache as if computed.
 *
 * File format (one file per block, <identity>-<block hash>.kvb, all integers
 * little-endian): a fixed header (magic "KVLLMKVB", format version, the
 * identity: model file hash, K/V dtypes, block size, layer count, head shape,
 * row and block bytes; then the block's chained hash and its parent's hash, the
 * XXH3-64 of everything after the header, and the XXH3-64 of the header
 * itself), the block_size token ids, then the block's bytes exactly as the
 * pool holds them (all layers, K then V per layer). The chained hash starts at
 * a root derived from the cache salt, so blocks of different salts never meet
 * on disk either. Files are written to a temporary name and renamed: a killed
 * process leaves either the whole file or none (temporaries are deleted on
 * start); evicted blocks are not synced one by one (a power loss may tear a
 * file, which then fails its checks and is dropped), saved prefixes
 * (kv_disk_save) are fdatasynced before the rename. Files of another
 * identity are ignored (not loaded, not deleted); files of ours with a bad header or size are deleted on start, and a payload
 * whose checksum fails is deleted when read and the block is recomputed. */
#ifndef KVLLM_KV_DISK_H
#define KVLLM_KV_DISK_H

#include "kv.h"

typedef struct kv_disk kv_disk; /* opaque */

typedef struct kv_disk_config {
    const char *dir;      /* created if missing */
    uint64_t max_bytes;   /* files beyond it are deleted, least recently used first (0: no limit) */
    uint8_t model_id[16]; /* identity of the model file (kv_disk_model_id) */
    int queue_blocks;     /* staging slots for the writer (0: 256; each one block file) */
} kv_disk_config;

typedef struct kv_disk_stats {
    int64_t blocks;     /* blocks on disk (indexed) */
    uint64_t bytes;     /* their file bytes */
    int64_t reads;      /* block files read */
    int64_t writes;     /* block files written */
    int64_t hits;       /* blocks loaded into RAM from disk */
    int64_t dropped;    /* evicted blocks not written: every staging slot busy */
    int64_t corrupt;    /* files dropped: bad checksum, size or tokens */
    int64_t hit_tokens; /* prompt tokens served from disk */
} kv_disk_stats;

/* Bytes of one block's file: header, token ids, the pool's block bytes. */
uint64_t kv_disk_file_bytes(uint64_t block_bytes, int block_size);

/* The XXH3-128 of the model file's bytes: different files, different tiers. */
bool kv_disk_model_id(const char *path, uint8_t id[16], kvl_error *err);

/* Opens (creating) the tier for pool p and hooks it into p's evictions. The
 * pool must outlive it and have the default block hash. Indexes the files
 * there (see above). */
kv_disk *kv_disk_open(const kv_disk_config *c, kv_pool *p, kvl_error *err);
/* Writes the pool's committed blocks not yet on disk (so a restart finds
 * them), drains the writer, unhooks and frees. NULL is fine. */
void kv_disk_close(kv_disk *d);
/* Extends s's chain (kv_prefix_match's contract) over the RAM prefix cache
 * and then the disk, alternating while either has the next block; returns the
 * tokens the chain covers. A block from disk is committed to the RAM cache. */
int64_t kv_disk_prefix_match(kv_disk *d, kv_seq *s, const int32_t *tokens, int64_t n_tokens);
/* Writes s's first n_blocks committed blocks now (those not on disk yet) and
 * waits for them: a prefix saved on purpose. Returns the blocks on disk among
 * them, or -1 with err on a write failure. */
int64_t kv_disk_save(kv_disk *d, const kv_seq *s, int64_t n_blocks, kvl_error *err);
/* Waits until every queued write is on disk. */
void kv_disk_flush(kv_disk *d);
kv_disk_stats kv_disk_get_stats(kv_disk *d);

#endif
