/* kv_prefix_file: a prefix's token ids and KV blocks in one self-contained
 * file (llama-server's slot files). See kv_disk.h.
 *
 * Layout (all integers little-endian, as the pool holds them):
 *   header      prefix_header below: the disk tier's identity fields (magic
 *               "KVLLMSLT", the block layout version, model, K/V types, block
 *               shape), the chain root, the counts, the payload's XXH3-64 and
 *               the header's own XXH3-64
 *   tokens      n_tokens int32 ids
 *   blocks      n_blocks = n_tokens / block_size blocks of block_bytes, block
 *               i holding tokens [i * block_size, (i + 1) * block_size)
 * A file is written to a temporary name, synced and renamed, so a crash
 * leaves the old file or the new one, never a torn one. */
#define _GNU_SOURCE
#include "kv_disk.h"
#include "kv_disk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define PREFIX_MAGIC "KVLLMSLT"
/* This file format's own version (the block layout's is the identity's). */
#define PREFIX_FORMAT 1

typedef struct prefix_header {
    disk_header id; /* identity fields only (hash ... header_xxh unused, zero) */
    uint64_t chain_root;
    int64_t n_tokens, n_blocks;
    uint64_t payload_xxh; /* of the token ids and the blocks */
    uint64_t header_xxh;  /* of everything above */
} prefix_header;
_Static_assert(sizeof(prefix_header) == 160, "the prefix file header is 160 bytes, no padding");

struct kv_prefix_file {
    int fd;
    char *path;
    prefix_header h;
    int32_t *tokens;
    uint64_t block_bytes;
};

static void expected_identity(disk_header *id, const kv_pool *p, const uint8_t model_id[16]) {
    kvd_identity(id, p, model_id);
    memcpy(id->magic, PREFIX_MAGIC, 8);
    id->header_bytes = sizeof(prefix_header);
    id->reserved = PREFIX_FORMAT;
}

bool kv_prefix_file_write(const char *path, const kv_pool *p, const uint8_t model_id[16],
                          uint64_t chain_root, const int32_t *tokens, int64_t n_tokens,
                          const int32_t *blocks, uint64_t *bytes, kvl_error *err) {
    const kv_pool_config *pc = kv_pool_cfg(p);
    const uint64_t bb = kv_pool_geometry(p)->block_bytes;
    prefix_header h = {0};
    expected_identity(&h.id, p, model_id);
    h.chain_root = chain_root;
    h.n_tokens = n_tokens;
    h.n_blocks = n_tokens / pc->block_size;
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.%ld.tmp", path, (long)getpid()) < 0)
        return kvl_fail(err, "prefix file: out of memory");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        kvl_fail(err, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return false;
    }
    XXH3_state_t *x = XXH3_createState();
    bool ok = x != NULL;
    if (!ok) kvl_fail(err, "prefix file: out of memory");
    if (ok) XXH3_64bits_reset(x);
    /* the header last, once the payload's checksum is known */
    ok = ok && lseek(fd, (off_t)sizeof h, SEEK_SET) == (off_t)sizeof h;
    const size_t tb = (size_t)n_tokens * sizeof(int32_t);
    if (ok) {
        XXH3_64bits_update(x, tokens, tb);
        ok = kvd_io_all(fd, (void *)tokens, tb, -1, true);
    }
    for (int64_t i = 0; ok && i < h.n_blocks; i++) {
        const void *b = kv_block_k_const(p, blocks[i], 0); /* the block's bytes, contiguous */
        XXH3_64bits_update(x, b, bb);
        ok = kvd_io_all(fd, (void *)b, bb, -1, true);
    }
    if (ok) {
        h.payload_xxh = XXH3_64bits_digest(x);
        h.header_xxh = XXH3_64bits(&h, offsetof(prefix_header, header_xxh));
        ok = lseek(fd, 0, SEEK_SET) == 0 && kvd_io_all(fd, &h, sizeof h, -1, true) &&
             fdatasync(fd) == 0;
    }
    if (!ok && !err->msg[0]) kvl_fail(err, "writing %s: %s", tmp, strerror(errno));
    XXH3_freeState(x);
    if (close(fd) != 0 && ok) ok = kvl_fail(err, "writing %s: %s", tmp, strerror(errno));
    if (ok && rename(tmp, path) != 0)
        ok = kvl_fail(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (!ok) unlink(tmp);
    free(tmp);
    if (ok && bytes) *bytes = sizeof h + tb + (uint64_t)h.n_blocks * bb;
    return ok;
}

void kv_prefix_file_close(kv_prefix_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->tokens);
    free(f->path);
    free(f);
}

/* Which identity field differs, in words (the header checksum held). */
static const char *identity_mismatch(const disk_header *got, const disk_header *want) {
    if (got->version != want->version || got->reserved != want->reserved)
        return "it was written by another version of kvllm (another block layout or format)";
    if (memcmp(got->model_id, want->model_id, 16) != 0)
        return "it was saved with another model file (or other metadata overrides, adapters)";
    if (got->dtype_k != want->dtype_k || got->dtype_v != want->dtype_v)
        return "it holds another KV cache type (--cache-type-k / --cache-type-v)";
    if (got->block_size != want->block_size) return "it holds blocks of another --block-size";
    return "it holds KV of another shape (layers, heads or row sizes)";
}

kv_prefix_file *kv_prefix_file_open(const char *path, const kv_pool *p, const uint8_t model_id[16],
                                    int64_t max_tokens, kvl_error *err) {
    kv_prefix_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        kvl_fail(err, "prefix file: out of memory");
        return NULL;
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        kvl_fail(err, "cannot open %s: %s", path, strerror(errno));
        kv_prefix_file_close(f);
        return NULL;
    }
    struct stat st;
    disk_header want;
    expected_identity(&want, p, model_id);
    const uint64_t bb = kv_pool_geometry(p)->block_bytes;
    const int bs = kv_pool_cfg(p)->block_size;
    f->block_bytes = bb;
    bool ok = fstat(f->fd, &st) == 0;
    if (!ok) kvl_fail(err, "cannot read %s: %s", path, strerror(errno));
    else if ((uint64_t)st.st_size < sizeof f->h ||
             !kvd_io_all(f->fd, &f->h, sizeof f->h, 0, false) ||
             memcmp(f->h.id.magic, PREFIX_MAGIC, 8) != 0)
        ok = kvl_fail(err, "%s is not a kvllm slot file", path);
    else if (f->h.header_xxh != XXH3_64bits(&f->h, offsetof(prefix_header, header_xxh)))
        ok = kvl_fail(err, "%s is damaged: its header's checksum does not match", path);
    else if (memcmp(&f->h.id, &want, IDENTITY_BYTES) != 0)
        ok = kvl_fail(err, "%s cannot be restored here: %s", path,
                      identity_mismatch(&f->h.id, &want));
    else if (f->h.n_tokens < 1 || f->h.n_tokens > max_tokens || f->h.n_blocks != f->h.n_tokens / bs)
        ok = kvl_fail(
            err, "%s is damaged: %lld tokens in %lld blocks (this server takes 1 to %lld)", path,
            (long long)f->h.n_tokens, (long long)f->h.n_blocks, (long long)max_tokens);
    else if ((uint64_t)st.st_size !=
             sizeof f->h + (uint64_t)f->h.n_tokens * sizeof(int32_t) + (uint64_t)f->h.n_blocks * bb)
        ok = kvl_fail(err, "%s is damaged: %lld bytes where its header says %llu", path,
                      (long long)st.st_size,
                      (unsigned long long)(sizeof f->h + (uint64_t)f->h.n_tokens * 4 +
                                           (uint64_t)f->h.n_blocks * bb));
    if (ok) {
        const size_t tb = (size_t)f->h.n_tokens * sizeof(int32_t);
        f->tokens = malloc(tb);
        if (!f->tokens) ok = kvl_fail(err, "prefix file: out of memory");
        else if (!kvd_io_all(f->fd, f->tokens, tb, (off_t)sizeof f->h, false))
            ok = kvl_fail(err, "cannot read %s: %s", path, strerror(errno));
    }
    if (!ok) {
        kv_prefix_file_close(f);
        return NULL;
    }
    return f;
}

const int32_t *kv_prefix_file_tokens(const kv_prefix_file *f, int64_t *n_tokens) {
    *n_tokens = f->h.n_tokens;
    return f->tokens;
}

int64_t kv_prefix_file_blocks(const kv_prefix_file *f) { return f->h.n_blocks; }

uint64_t kv_prefix_file_chain_root(const kv_prefix_file *f) { return f->h.chain_root; }

bool kv_prefix_file_read_blocks(kv_prefix_file *f, uint8_t *const *dst, uint64_t *bytes,
                                kvl_error *err) {
    const size_t tb = (size_t)f->h.n_tokens * sizeof(int32_t);
    XXH3_state_t *x = XXH3_createState();
    uint8_t *scratch = NULL;
    bool ok = x != NULL || kvl_fail(err, "prefix file: out of memory");
    if (ok) {
        XXH3_64bits_reset(x);
        XXH3_64bits_update(x, f->tokens, tb);
    }
    off_t at = (off_t)(sizeof f->h + tb);
    for (int64_t i = 0; ok && i < f->h.n_blocks; i++, at += (off_t)f->block_bytes) {
        uint8_t *d = dst[i]; /* NULL: a block the cache holds already, read past */
        if (!d && !scratch && !(scratch = malloc(f->block_bytes)))
            ok = kvl_fail(err, "prefix file: out of memory");
        if (!d) d = scratch;
        errno = 0;
        if (ok && !kvd_io_all(f->fd, d, f->block_bytes, at, false))
            ok = kvl_fail(err, "cannot read %s: %s", f->path,
                          errno ? strerror(errno) : "it ended early");
        if (ok) XXH3_64bits_update(x, d, f->block_bytes);
    }
    if (ok && XXH3_64bits_digest(x) != f->h.payload_xxh)
        ok = kvl_fail(err, "%s is damaged: its contents' checksum does not match", f->path);
    if (ok && bytes) *bytes = (uint64_t)at;
    free(scratch);
    XXH3_freeState(x);
    return ok;
}
