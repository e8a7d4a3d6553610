/* pp_split: the pipeline's layer split and its KV sizing rule (pp.h), plain
 * arithmetic over the file's tensors and the ranks' answers: no MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "hparams.h"
#include "pp.h"

/* Bytes of layer il's tensors ("blk.<il>."). */
static void layer_bytes(const gguf_file *f, int n_layer, int64_t *bytes, int64_t *head) {
    memset(bytes, 0, (size_t)n_layer * sizeof *bytes);
    *head = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        int il;
        char dot;
        if (sscanf(t->name, "blk.%d%c", &il, &dot) == 2 && dot == '.' && il >= 0 && il < n_layer)
            bytes[il] += (int64_t)t->nbytes;
        else if (strcmp(t->name, "output.weight") == 0 ||
                 strcmp(t->name, "output_norm.weight") == 0)
            *head += (int64_t)t->nbytes;
    }
    if (!gguf_find_tensor(f, "output.weight")) { /* tied: the last rank repacks the embedding */
        const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
        if (te) *head += (int64_t)te->nbytes;
    }
}

static bool parse_spec(const char *spec, int n_ranks, int n_layer, int *first, int *end,
                       kvl_error *err) {
    const char *s = spec;
    for (int r = 0; r < n_ranks; r++) {
        char *e1, *e2;
        long a = strtol(s, &e1, 10);
        if (e1 == s || *e1 != '-')
            return kvl_fail(err, "--pp-layers '%s': range %d is not FIRST-LAST", spec, r + 1);
        long b = strtol(e1 + 1, &e2, 10);
        if (e2 == e1 + 1 || (*e2 != ',' && *e2 != '\0'))
            return kvl_fail(err, "--pp-layers '%s': range %d is not FIRST-LAST", spec, r + 1);
        if (a != (r ? end[r - 1] : 0) || b < a || b >= n_layer)
            return kvl_fail(err,
                            "--pp-layers '%s': range %d (%ld-%ld) must start at layer %d and end "
                            "by layer %d (the ranges are contiguous, one per rank)",
                            spec, r + 1, a, b, r ? end[r - 1] : 0, n_layer - 1);
        first[r] = (int)a;
        end[r] = (int)b + 1;
        if ((*e2 == '\0') != (r == n_ranks - 1))
            return kvl_fail(err, "--pp-layers '%s': %s ranges for %d ranks", spec,
                            *e2 ? "more" : "fewer", n_ranks);
        s = e2 + 1;
    }
    if (end[n_ranks - 1] != n_layer)
        return kvl_fail(err, "--pp-layers '%s': the last range must end at layer %d", spec,
                        n_layer - 1);
    return true;
}

static bool check_ranks(int n_layer, int n_ranks, kvl_error *err) {
    if (n_ranks < 1 || n_ranks > PP_MAX_RANKS)
        return kvl_fail(err, "--pp %d: between 1 and %d ranks", n_ranks, PP_MAX_RANKS);
    if (n_ranks > n_layer)
        return kvl_fail(err, "--pp %d: the model has only %d layers (at most one rank per layer)",
                        n_ranks, n_layer);
    return true;
}

bool pp_split_layers(int n_layer, int n_ranks, const char *spec, int *first, int *end,
                     kvl_error *err) {
    if (!check_ranks(n_layer, n_ranks, err)) return false;
    if (spec && *spec) return parse_spec(spec, n_ranks, n_layer, first, end, err);
    for (int r = 0; r < n_ranks; r++) {
        first[r] = (int)((int64_t)n_layer * r / n_ranks);
        end[r] = (int)((int64_t)n_layer * (r + 1) / n_ranks);
    }
    return true;
}

bool pp_split_bytes(const gguf_file *f, int n_ranks, const char *spec, int *first, int *end,
                    int64_t *rank_bytes, kvl_error *err) {
    model_hparams hp;
    if (!model_hparams_from_gguf(f, &hp, err)) return false;
    const int L = (int)hp.n_layer;
    if (!check_ranks(L, n_ranks, err)) return false;
    const arch_desc *ad = arch_find(hp.arch);
    if (n_ranks > 1 && ad && ad->altup) /* the loader refuses such a stage too */
        return kvl_fail(err, "pp: %s keeps four residual streams: its layers are not split",
                        hp.arch);
    int64_t *bytes = calloc((size_t)L, sizeof *bytes), head, total = 0;
    if (!bytes) return kvl_fail(err, "pp: out of memory");
    layer_bytes(f, L, bytes, &head);
    for (int il = 0; il < L; il++) total += bytes[il];
    total += head;
    if (spec && *spec) {
        if (!parse_spec(spec, n_ranks, L, first, end, err)) {
            free(bytes);
            return false;
        }
    } else {
        /* Greedy over the running sum: rank r ends at the layer boundary
         * nearest (r + 1) / N of the total, each rank keeping at least one
         * layer and leaving one for each rank after it; the head counts on
         * the last rank. */
        int il = 0;
        int64_t sum = 0;
        for (int r = 0; r < n_ranks; r++) {
            first[r] = il;
            if (r == n_ranks - 1) {
                end[r] = L;
                break;
            }
            const double target = (double)total * (r + 1) / n_ranks;
            do {
                sum += bytes[il++];
            } while (il < L - (n_ranks - 1 - r) && (double)sum + (double)bytes[il] / 2 < target);
            end[r] = il;
        }
    }
    /* A layer reading another layer's KV cache (gemma4's shared KV layers)
     * runs on that layer's rank: a computed boundary past such a source moves
     * back to it; a given one is refused. */
    for (int r = n_ranks - 1; r >= 1; r--) {
        int lo = first[r];
        for (int il = L - 1; il >= lo; il--) { /* lo falls as the range takes in more layers */
            const int src = (int)model_hparams_kv_source(&hp, il);
            lo = src < lo ? src : lo;
        }
        if (lo == first[r]) continue;
        if ((spec && *spec) || lo <= first[r - 1]) {
            free(bytes);
            return kvl_fail(err,
                            "pp: rank %d's layers %d-%d read the KV cache of layer %d, which rank "
                            "%d holds; layers sharing a cache must stay on one rank",
                            r + 1, first[r], end[r] - 1, lo, r);
        }
        first[r] = end[r - 1] = lo;
    }
    for (int r = 0; rank_bytes && r < n_ranks; r++) {
        rank_bytes[r] = r == n_ranks - 1 ? head : 0;
        for (int il = first[r]; il < end[r]; il++) rank_bytes[r] += bytes[il];
    }
    free(bytes);
    return true;
}

bool pp_split(const gguf_file *f, int n_ranks, const char *spec, int *first, int *end,
              kvl_error *err) {
    return pp_split_bytes(f, n_ranks, spec, first, end, NULL, err);
}

int64_t pp_kv_blocks_fit(const pp_rank_mem *ranks, int n_ranks, int64_t kv_memory, double fraction,
                         int64_t *fit) {
    int64_t least = INT64_MAX;
    for (int r = 0; r < n_ranks; r++) {
        const pp_rank_mem *m = &ranks[r];
        int64_t budget = kv_memory, per_block = m->block_bytes;
        if (kv_memory <= 0) {
            if (m->mem_available < 0) {
                fit[r] = -1;
                least = -1;
                continue;
            }
            /* the ranks on this host share its memory: a block index takes
             * their bytes together */
            per_block = 0;
            for (int s = 0; s < n_ranks; s++)
                if (ranks[s].host == m->host) per_block += ranks[s].block_bytes;
            budget = (int64_t)(fraction * (double)m->mem_available);
        }
        fit[r] = per_block > 0 ? budget / per_block : INT64_MAX;
        if (least >= 0 && fit[r] < least) least = fit[r];
    }
    return least;
}
