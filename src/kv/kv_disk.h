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
 * whose checksum fails is deleted when read and the block is recomputed.
 *
 * Reads happen in the background (kv_disk_prefix_step): a sequence whose next
 * blocks are on disk gets free RAM blocks reserved for it and a load that a
 * reader thread fills, straight into those blocks, verifying each; the
 * sequence waits meanwhile and attaches what verified once the load is done.
 * A load is only ever created, attached and freed on the thread that drives
 * the pool; the reader touches nothing but the reserved blocks' bytes.
 *
 * Pins (kv_disk_save): a saved prefix's blocks are kept out of the size
 * limit's LRU deletion until kv_disk_unpin, within max_pinned_bytes. A pin
 * file per saved prefix, <identity>-<hash of its last block>.pin, lists its
 * block hashes (with a checksum), so pins survive a restart. */
#ifndef KVLLM_KV_DISK_H
#define KVLLM_KV_DISK_H

#include "kv.h"

typedef struct kv_disk kv_disk; /* opaque */

typedef struct kv_disk_config {
    const char *dir;      /* created if missing */
    uint64_t max_bytes;   /* files beyond it are deleted, least recently used first (0: no limit) */
    uint8_t model_id[16]; /* identity of the model file (kv_disk_model_id) */
    int queue_blocks;     /* staging slots for the writer (0: 256; each one block file) */
    /* block files saved prefixes may pin (0: half of max_bytes, or no cap when
     * max_bytes is 0; at most max_bytes) */
    uint64_t max_pinned_bytes;
} kv_disk_config;

typedef struct kv_disk_stats {
    int64_t blocks;          /* blocks on disk (indexed) */
    uint64_t bytes;          /* their file bytes */
    int64_t reads;           /* block files read */
    int64_t writes;          /* block files written */
    int64_t hits;            /* blocks loaded into RAM from disk */
    int64_t dropped;         /* evicted blocks not written: every staging slot busy */
    int64_t corrupt;         /* files dropped: bad checksum, size or tokens */
    int64_t hit_tokens;      /* prompt tokens served from disk */
    int64_t pinned_blocks;   /* blocks a saved prefix pins (kept from the size limit) */
    uint64_t pinned_bytes;   /* their file bytes */
    int64_t loads;           /* background reads started (kv_disk_prefix_step) */
    int64_t loads_abandoned; /* of those, given up by their sequence (cancelled) */
} kv_disk_stats;

/* kv_disk_save's result when pinning the prefix would pass max_pinned_bytes. */
#define KV_DISK_OVER_PIN_CAP (-2)

/* Bytes of one block's file: header, token ids, the pool's block bytes. */
uint64_t kv_disk_file_bytes(uint64_t block_bytes, int block_size);

/* The XXH3-128 of the model file's bytes: different files, different tiers. */
bool kv_disk_model_id(const char *path, uint8_t id[16], kvl_error *err);
/* Folds n strings (the --override-kv specs the model was loaded with) into
 * id: a model read with other metadata is another identity. */
void kv_disk_model_id_extend(uint8_t id[16], const char *const *extra, int n);

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

/* A background read of a sequence's next blocks (opaque). */
typedef struct kv_disk_load kv_disk_load;
/* kv_disk_prefix_match without waiting for the disk. With *load NULL: extends
 * s's chain over the RAM prefix cache and, when the disk holds the next
 * blocks, reserves free RAM blocks for them, starts reading them and sets
 * *load (or, when another load is reading the same blocks already, sets *load
 * to a wait for it). With *load set and kv_disk_load_ready: attaches the
 * blocks that verified (committed to the RAM cache), frees the load, and goes
 * on as with NULL. With *load set and not ready: changes nothing. Returns the
 * tokens s's chain covers; *from_disk grows by the tokens attached from disk.
 * The sequence must not be given to the model while *load is set. */
int64_t kv_disk_prefix_step(kv_disk *d, kv_seq *s, const int32_t *tokens, int64_t n_tokens,
                            kv_disk_load **load, int64_t *from_disk);
/* Whether the load is done (kv_disk_prefix_step will attach it now). */
bool kv_disk_load_ready(kv_disk *d, const kv_disk_load *l);
/* Gives a load up (its sequence was cancelled): the reserved blocks go back to
 * the pool now, or, while the reader still writes into them, at the next
 * kv_disk_reap after it stops. NULL is fine. */
void kv_disk_load_cancel(kv_disk *d, kv_disk_load *l);
/* Returns the blocks of given-up loads the reader has finished with. Call it
 * between steps (kv_disk_prefix_step does too). */
void kv_disk_reap(kv_disk *d);
/* Whether loads exist and none is ready: nothing but the reader can make
 * progress on them (a caller with nothing else to do may sleep). */
bool kv_disk_loads_pending(kv_disk *d);
/* Whether any load exists (ready or not). */
bool kv_disk_has_loads(kv_disk *d);
/* Sleeps while kv_disk_loads_pending. */
void kv_disk_wait_loads(kv_disk *d);
/* fn(user) is called on the reader thread after each load finishes (to wake
 * the thread that drives the pool); NULL: none. Returns once no earlier
 * callback is running, so user may be freed after setting NULL. fn must not
 * call into the tier. */
void kv_disk_set_notify(kv_disk *d, void (*fn)(void *user), void *user);

/* Writes s's first n_blocks committed blocks now (those not on disk yet),
 * waits for them and pins them as one saved prefix (saving the same prefix
 * again changes nothing). Returns the blocks on disk among them; -1 with err
 * on a write failure; KV_DISK_OVER_PIN_CAP with err when the blocks it would
 * newly pin do not fit max_pinned_bytes (nothing is pinned then). */
int64_t kv_disk_save(kv_disk *d, const kv_seq *s, int64_t n_blocks, kvl_error *err);
/* Drops the pin of the saved prefix whose full blocks are tokens[0..n_tokens)
 * under the chain root (kv_seq.chain_root); its blocks join the LRU order
 * again (unless another saved prefix pins them). Returns the blocks it
 * pinned, or -1 with err when no saved prefix is exactly that. */
int64_t kv_disk_unpin(kv_disk *d, uint64_t root, const int32_t *tokens, int64_t n_tokens,
                      kvl_error *err);
/* Waits until every queued write is on disk. */
void kv_disk_flush(kv_disk *d);
kv_disk_stats kv_disk_get_stats(kv_disk *d);

/* Prefix files (kv_prefix_file.c): one prefix's token ids and the KV blocks of
 * its full blocks in one self-contained file, what llama-server's slot save /
 * restore write and read (POST /slots/{id}?action=save|restore). Same
 * identity as the tier's block files (model, K/V types, block shape and
 * layout version): a file of another identity is refused, naming what
 * differs. Independent of the tier: no directory, index or threads. */
/* Writes tokens[0..n_tokens) and the full blocks holding them (blocks[i]:
 * tokens [i * block_size, (i + 1) * block_size); n_tokens / block_size of
 * them) of pool p, computed under chain_root (kv_seq.chain_root), to path
 * crash-safely (a temporary, fdatasync, rename). *bytes: the file's size. */
bool kv_prefix_file_write(const char *path, const kv_pool *p, const uint8_t model_id[16],
                          uint64_t chain_root, const int32_t *tokens, int64_t n_tokens,
                          const int32_t *blocks, uint64_t *bytes, kvl_error *err);
typedef struct kv_prefix_file kv_prefix_file; /* opaque: one file being read */
/* Opens path and checks its header (checksum, identity against pool p and
 * model_id, counts: 1..max_tokens tokens, the size they imply) and reads its
 * token ids; NULL with err saying what is wrong. */
kv_prefix_file *kv_prefix_file_open(const char *path, const kv_pool *p, const uint8_t model_id[16],
                                    int64_t max_tokens, kvl_error *err);
const int32_t *kv_prefix_file_tokens(const kv_prefix_file *f, int64_t *n_tokens);
int64_t kv_prefix_file_blocks(const kv_prefix_file *f); /* n_tokens / block_size */
uint64_t kv_prefix_file_chain_root(const kv_prefix_file *f);
/* Reads block i into dst[i] (block_bytes each; NULL: read and checked but not
 * kept) and checks the contents' checksum; false with err when it fails (then
 * dst holds garbage). *bytes: the bytes read in all. */
bool kv_prefix_file_read_blocks(kv_prefix_file *f, uint8_t *const *dst, uint64_t *bytes,
                                kvl_error *err);
void kv_prefix_file_close(kv_prefix_file *f); /* NULL is fine */

#endif
