/* The pipeline's KV sizing rule (pp_kv_blocks_fit, engine/pp_split.c): each
 * rank's blocks from its own bytes per block and memory, the pool the least
 * of them; ranks on one host share its memory. No MPI: plain arithmetic over
 * what the ranks report. */
#include <stdint.h>
#include <string.h>

#include "pp.h"

#include "check.h"

static pp_rank_mem rank(int64_t block_bytes, int64_t mem, uint64_t host) {
    pp_rank_mem r;
    memset(&r, 0, sizeof r);
    r.group_bytes[0] = r.block_bytes = block_bytes;
    r.mem_available = mem;
    r.host = host;
    return r;
}

int main(void) {
    int64_t fit[4];

    /* --kv-memory: every rank's pool at most that many bytes; the rank with
     * more layers (4000 bytes a block) holds fewer blocks and sets the pool */
    pp_rank_mem a[2] = {rank(1000, -1, 1), rank(4000, -1, 2)};
    CHECK(pp_kv_blocks_fit(a, 2, 100000, 0.5, fit) == 25);
    CHECK(fit[0] == 100 && fit[1] == 25, "%lld %lld", (long long)fit[0], (long long)fit[1]);

    /* fraction of MemAvailable, one rank per host: each rank as one process */
    pp_rank_mem b[2] = {rank(1000, 1000000, 1), rank(4000, 1000000, 2)};
    CHECK(pp_kv_blocks_fit(b, 2, 0, 0.5, fit) == 125);
    CHECK(fit[0] == 500 && fit[1] == 125, "%lld %lld", (long long)fit[0], (long long)fit[1]);

    /* a worker on a host with less memory binds though its blocks are no
     * larger: rank 0's own figure (500) would overfill it */
    pp_rank_mem c[2] = {rank(1000, 1000000, 1), rank(1000, 200000, 2)};
    CHECK(pp_kv_blocks_fit(c, 2, 0, 0.5, fit) == 100);
    CHECK(fit[0] == 500 && fit[1] == 100, "%lld %lld", (long long)fit[0], (long long)fit[1]);
    /* ... and the same with the ranks the other way round: the least, not the last */
    pp_rank_mem c2[2] = {c[1], c[0]};
    CHECK(pp_kv_blocks_fit(c2, 2, 0, 0.5, fit) == 100);

    /* two ranks on one host share its memory: a block index takes 5000 bytes there */
    pp_rank_mem d[3] = {rank(1000, 1000000, 7), rank(4000, 1000000, 7), rank(1000, 1000000, 9)};
    CHECK(pp_kv_blocks_fit(d, 3, 0, 0.5, fit) == 100);
    CHECK(fit[0] == 100 && fit[1] == 100 && fit[2] == 500, "%lld %lld %lld", (long long)fit[0],
          (long long)fit[1], (long long)fit[2]);

    /* one rank: the one-process rule, fraction x MemAvailable / bytes per block */
    pp_rank_mem e[1] = {rank(3000, 999999, 1)};
    CHECK(pp_kv_blocks_fit(e, 1, 0, 0.9, fit) == 299);

    /* a rank that cannot read MemAvailable: unknown (-1), as one process */
    pp_rank_mem f[2] = {rank(1000, 1000000, 1), rank(1000, -1, 2)};
    CHECK(pp_kv_blocks_fit(f, 2, 0, 0.5, fit) == -1);
    CHECK(fit[0] == 500 && fit[1] == -1);
    /* ... but --kv-memory needs no MemAvailable */
    CHECK(pp_kv_blocks_fit(f, 2, 10000, 0.5, fit) == 10);

    /* the layer split without a file: equal counts, or --pp-layers */
    int first[3], end[3];
    kvl_error err = {{0}};
    CHECK(pp_split_layers(5, 2, NULL, first, end, &err) && first[1] == 2 && end[1] == 5);
    CHECK(pp_split_layers(5, 2, "0-0,1-4", first, end, &err) && end[0] == 1 && first[1] == 1);
    CHECK(!pp_split_layers(5, 2, "0-1,3-4", first, end, &err));
    CHECK(!pp_split_layers(2, 3, NULL, first, end, &err));
    return failures != 0;
}
