/* pp: pipeline-parallel serving over MPI. Rank r of N holds a contiguous range
 * of layers (model_params.layer_first/end) and the KV of those layers only.
 * Rank 0 runs everything else (tokenizer, scheduler, KV manager, sampling,
 * HTTP): its model's forward hook sends each ragged batch (tokens, positions,
 * sequence indices, wanted rows, block tables) to every other rank, runs its
 * own layers, and hidden states travel rank to rank; the last rank sends the
 * logits back. Block ids mean the same on every rank: the pools have the same
 * size and only rank 0 decides which block holds what. Ranks other than 0 run
 * pp_worker_run until rank 0 closes the pipeline.
 *
 * A batch is cut into micro-batches (consecutive tokens) so that stages work
 * at once: rank 1 computes part k while rank 0 computes part k + 1.
 *
 * Every receive has a deadline (pp_config.timeout_s): a rank that stops
 * answering fails the forward on rank 0 with an error naming it, and every
 * later forward fails the same way. All MPI calls live in pp.c, pp_rank0.c
 * and pp_worker.c (pp_split.c is plain arithmetic); without Open MPI at build
 * time pp_available() is false and pp_init fails saying so. */
#ifndef KVLLM_PP_H
#define KVLLM_PP_H

#include "base.h"
#include "gguf.h"
#include "model.h"

#define PP_MAX_RANKS 64

/* Whether this build has MPI. */
bool pp_available(void);
/* Initializes MPI (once per process) and checks the job has n_ranks ranks
 * (n_ranks 0: any number). Sets *rank. */
bool pp_init(int n_ranks, int *rank, kvl_error *err);
/* The number of ranks of the job (after pp_init; 1 before). */
int pp_job_size(void);
/* Finalizes MPI if pp_init ran (idempotent). */
void pp_finalize(void);
/* Ends the whole job at once (all ranks), after an error. */
_Noreturn void pp_abort(int code);

/* The layer split: first[r], end[r] for each rank. spec "0-13,14-27" gives it
 * (contiguous, covering every layer, one range per rank); NULL or "" balances
 * the ranks by the bytes of their layers (the last rank also counts the output
 * norm and head). Fails when there are more ranks than layers. */
bool pp_split(const gguf_file *f, int n_ranks, const char *spec, int *first, int *end,
              kvl_error *err);
/* The same split with the weight bytes each rank maps: its layers' tensors,
 * plus the output norm and head on the last (the tied embedding, when the
 * head is tied; rank 0 reads the embedding a row per token only). */
bool pp_split_bytes(const gguf_file *f, int n_ranks, const char *spec, int *first, int *end,
                    int64_t *rank_bytes, kvl_error *err);
/* Layer ranges for n_ranks over n_layer layers without a file (the planner
 * given a config.json): spec as pp_split, else equal counts. */
bool pp_split_layers(int n_layer, int n_ranks, const char *spec, int *first, int *end,
                     kvl_error *err);

/* One rank's share of a KV block and the memory it has (pp_stage_kv_probe). */
typedef struct pp_rank_mem {
    int64_t group_bytes[MODEL_MAX_KV_GROUPS]; /* one block of each KV group, its layers only */
    int64_t block_bytes;                      /* their sum: one block index on this rank */
    int64_t mem_available; /* its host's kvl_mem_available(), bytes (-1: unknown) */
    uint64_t host;         /* equal for ranks sharing one host's memory */
} pp_rank_mem;

/* The KV blocks (one block index: a block of every group) each rank's memory
 * holds, into fit[r], by the rule one process uses: kv_memory > 0 gives each
 * rank a pool of at most kv_memory bytes; otherwise a rank's pool takes at
 * most fraction x its host's available memory, the ranks on one host sharing it in
 * proportion to their bytes per block (with one rank per host, fraction x
 * available memory / its bytes per block). Returns the least over the ranks, the
 * pool every rank can hold (-1: a rank's available memory is unknown). */
int64_t pp_kv_blocks_fit(const pp_rank_mem *ranks, int n_ranks, int64_t kv_memory, double fraction,
                         int64_t *fit);

typedef struct pp_config {
    double timeout_s; /* longest wait for any message of a step (default 60) */
    int micro;        /* micro-batches per step, at most (<= 0: the number of ranks while no
                       * other step is in flight, else 1) */
    /* Rank 0: called once when a rank stops answering (the pipeline is
     * unusable from then on; every forward fails). NULL: nothing. */
    void (*on_broken)(void *user);
    void *on_broken_user;
} pp_config;

typedef struct pp_stats {
    int64_t steps;        /* forwards run through the pipeline */
    int64_t tokens;       /* tokens of those forwards */
    int64_t hidden_bytes; /* hidden-state bytes this rank sent to the next */
    int64_t ctrl_bytes;   /* batch descriptors this rank sent */
    int64_t logits_bytes; /* logits this rank sent (the last) */
    double wait_s;        /* time spent waiting for messages */
    int most_in_flight;   /* rank 0: the most steps in flight at once */
} pp_stats;

typedef struct pp_stage pp_stage; /* opaque */

/* The stage of this rank around its loaded model (borrowed). On rank 0 it
 * installs the model's forward hook; on the others it is driven by
 * pp_worker_run. */
pp_stage *pp_stage_create(model *m, const pp_config *cfg, kvl_error *err);
/* Ranks > 0: serves rank 0's forwards until it closes the pipeline (true) or
 * something fails (false, err set). */
bool pp_worker_run(pp_stage *p, kvl_error *err);
/* Rank 0: tells the other ranks the pipeline is closed (they return from
 * pp_worker_run), removes the hook. Any rank: frees the stage. */
void pp_stage_destroy(pp_stage *p);
void pp_stage_stats(const pp_stage *p, pp_stats *out);
/* Rank 0: the bytes of one KV block of each group on rank `rank` (its layers'
 * share), as that rank reported when its pools were made; false before the
 * first step. */
bool pp_stage_kv_block_bytes(const pp_stage *p, int rank, int64_t *per_group, int *n_groups);
/* Rank 0, before any step: asks every rank (itself too) what one KV block of
 * each group takes on its layers with these settings (block_size, dtype,
 * split_v, dtype_v of groups[g]; each rank's own shape for the rest), and its
 * host's available memory now (kvl_mem_available), into out[0 .. pp_job_size()). */
bool pp_stage_kv_probe(pp_stage *p, const kv_pool_config *groups, int n_groups, pp_rank_mem *out,
                       kvl_error *err);

#endif
