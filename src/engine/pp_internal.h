/* pp_internal: what the pieces of the pipeline share (engine-private).
 *   pp.c        MPI set-up, the stage's life, the helpers both sides use
 *               (requests with deadlines, buffers, failure, fault injection)
 *   pp_rank0.c  rank 0: steps sent down the pipeline, the forward hooks, pings
 *   pp_worker.c ranks > 0: receiving steps, running their layers, answering
 *   pp_split.c  the layer split and the KV sizing rule (no MPI)
 *
 * Messages (MPI_COMM_WORLD, point to point):
 *   rank 0 -> every rank, TAG_CTRL: a step descriptor (int32s: op, step, then
 *     the batch or the pools' shape), or the end of the pipeline;
 *   rank r -> r + 1, TAG_HIDDEN: one micro-batch's hidden states, n x n_embd floats;
 *   last -> rank 0, TAG_LOGITS: one micro-batch's wanted logits, rows x n_vocab floats;
 *   rank r -> rank 0, TAG_ACK: rank r finished the step (so a silent rank can be named);
 *   rank r -> rank 0, TAG_POOLS: its bytes per KV block of each group, once its
 *     pools are made (OP_POOLS);
 *   rank r -> rank 0, TAG_PROBE: its bytes per KV block of each group for
 *     proposed pool settings, its host's available memory and a host id (OP_PROBE,
 *     before rank 0 sizes the pools).
 * No call blocks: every wait polls MPI_Test / MPI_Iprobe against a deadline,
 * and Open MPI's blocking calls would spin on a core the other ranks need.
 * Only built with MPI (KVLLM_HAVE_MPI). */
#ifndef KVLLM_PP_INTERNAL_H
#define KVLLM_PP_INTERNAL_H

#include <mpi.h>
#include <pthread.h>

#include "kv.h"
#include "pp.h"

enum { TAG_CTRL = 1, TAG_HIDDEN, TAG_LOGITS, TAG_ACK, TAG_POOLS, TAG_PROBE };
enum { OP_FORWARD = 1, OP_POOLS, OP_STOP, OP_PING, OP_PROBE };
enum { HDR = 6 }; /* op, step, n_tokens, n_seqs, n_groups, n_micro */
/* OP_POOLS: per group after HDR, block_size, dtype, split_v, dtype_v, n_blocks;
 * OP_PROBE: the same without n_blocks. The answer to OP_PROBE: int64s, the
 * bytes of one block of each group, available memory (-1: unknown), host id. */
enum { POOL_INTS = 5, PROBE_INTS = 4 };

/* A request not yet complete, with the rank whose answer it waits for (so a
 * silent rank can be named). */
typedef struct pp_req {
    MPI_Request r;
    int rank;
} pp_req;

typedef struct pp_reqs {
    pp_req *v;
    int n;
    size_t cap;
} pp_reqs;

/* A float buffer (hidden states, logits), 64-byte aligned, grown by
 * pp_floats_grow (its contents are not kept) and freed by pp_floats_free. */
typedef struct pp_floats {
    float *v;
    int64_t cap;
} pp_floats;

/* One step in flight: on rank 0 everything a step's sends and receives use
 * until it is waited for; on a worker what its sends read until they
 * complete (a worker goes on with the next step meanwhile). */
typedef struct pp_flight {
    int32_t *ctrl; /* rank 0: the step descriptor being sent */
    size_t ctrl_cap;
    pp_floats x_out;  /* hidden states sent on */
    pp_floats logits; /* rank 0: when the caller has no buffer */
    pp_reqs q;
    int32_t acks[PP_MAX_RANKS]; /* rank 0: each rank's "step done"; a worker sends acks[0] */
    int64_t step, n_tokens;
} pp_flight;

enum { PP_MAX_FLIGHT = 4 };

struct pp_stage {
    model *m;
    pp_config cfg;
    int rank, size;
    int64_t step;
    pp_stats st;
    bool failed;
    char fail_msg[600];
    /* rank 0: the pools the workers were told about */
    kv_pool *const *sent_pools;
    kv_pool_config sent_cfg[MODEL_MAX_KV_GROUPS];
    int n_sent;
    /* each rank's bytes per KV block and group (rank 0: the answers to OP_POOLS;
     * a worker: its own, row 0, sent with the answer) */
    int64_t block_bytes[PP_MAX_RANKS][MODEL_MAX_KV_GROUPS];
    /* steps in flight: rank 0's oldest at fl_head; a worker's in turn */
    pp_flight fl[PP_MAX_FLIGHT];
    int fl_head, n_fl;
    /* workers: their own pools */
    kv_pool *pools[MODEL_MAX_KV_GROUPS];
    int n_pools;
    /* buffers, grown as needed */
    int32_t *ctrl; /* a worker's step received */
    size_t ctrl_cap;
    pp_floats x_in;
    uint8_t *want;
    size_t want_cap;
    kv_seq *seqs;
    const kv_seq **seq_ptrs;
    size_t seqs_cap;
    /* rank 0: while it is outside every pipeline call (idle, or busy with
     * other work), a thread sends the workers a ping every timeout_s / 4, so
     * a worker waiting for the next step tells a live rank 0 from a dead or
     * hung one. lock serializes MPI between the two threads. */
    pthread_t beat;
    bool beating, beat_stop, in_call;
    pthread_mutex_t lock;
    double last_sent; /* kvl_time_s of the last message to the workers */
    int32_t ping[HDR];
    pp_reqs ping_q;
    /* fault injection (tests) */
    int fault_rank;
    int64_t fault_step;
    bool fault_hang;
};

/* pp.c */
extern bool pp_g_broken; /* a rank stopped answering: MPI_Finalize would wait forever */
bool pp_floats_grow(pp_floats *b, int64_t need);
void pp_floats_free(pp_floats *b);
void pp_nap(void);
bool pp_add_req(pp_reqs *q, int rank, MPI_Request r);
void pp_reqs_free(pp_reqs *q);
/* Marks the pipeline broken (calls on_broken once) and fails with msg. */
bool pp_fail(pp_stage *p, kvl_error *err, const char *msg);
/* Waits for every request of q; the deadline moves on whenever one
 * completes, so only timeout_s without any progress fails. */
bool pp_wait_reqs(pp_stage *p, pp_reqs *q, int64_t step, kvl_error *err);
/* KVLLM_PP_FAULT: exits or hangs when this rank reaches the step. */
void pp_maybe_fault(pp_stage *p);
/* This rank's answer to OP_PROBE for the groups' settings o (PROBE_INTS
 * each): n_groups + 2 int64s into ans. */
bool pp_probe_self(const model *m, const int32_t *o, int n_groups, int64_t *ans, kvl_error *err);

/* pp_rank0.c: rank 0's side of pp_stage_create / pp_stage_destroy. */
bool pp_rank0_open(pp_stage *p, kvl_error *err);
void pp_rank0_close(pp_stage *p);

/* The first n_micro - 1 cut points of n tokens into n_micro parts, equal up to one. */
static inline int64_t pp_micro_start(int64_t n, int n_micro, int k) { return n * k / n_micro; }

static inline int64_t pp_count_wanted(const uint8_t *want, int64_t t0, int64_t t1) {
    int64_t c = 0;
    for (int64_t t = t0; t < t1; t++) c += want[t] != 0;
    return c;
}

static inline model_batch pp_sub_batch(const model_batch *b, const uint8_t *want, int64_t t0,
                                       int64_t t1) {
    return (model_batch){.n_tokens = t1 - t0,
                         .tokens = b->tokens + t0,
                         .pos = b->pos + t0,
                         .seq = b->seq + t0,
                         .want_logits = want + t0,
                         .n_seqs = b->n_seqs,
                         .seqs = b->seqs};
}

#endif
