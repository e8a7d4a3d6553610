/* pp: pipeline-parallel stages over MPI (pp.h). The only file that calls MPI.
 *
 * Messages (MPI_COMM_WORLD, point to point):
 *   rank 0 -> every rank, TAG_CTRL: a step descriptor (int32s: op, step, then
 *     the batch or the pools' shape), or the end of the pipeline;
 *   rank r -> r + 1, TAG_HIDDEN: one micro-batch's hidden states, n x n_embd floats;
 *   last -> rank 0, TAG_LOGITS: one micro-batch's wanted logits, rows x n_vocab floats;
 *   rank r -> rank 0, TAG_ACK: rank r finished the step (so a silent rank can be named).
 * No call blocks: every wait polls MPI_Test / MPI_Iprobe against a deadline,
 * and Open MPI's blocking calls would spin on a core the other ranks need.
 *
 * For tests, KVLLM_PP_FAULT=RANK:STEP:exit|hang makes rank RANK exit (or stop
 * answering) when step STEP arrives. */
#include "pp.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hparams.h"
#include "kv.h"

/* ---------------------------------------------------------- layer split -- */

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

#ifndef KVLLM_HAVE_MPI

bool pp_available(void) { return false; }
bool pp_init(int n_ranks, int *rank, kvl_error *err) {
    (void)n_ranks;
    *rank = 0;
    return kvl_fail(err, "--pp: this kvllm was built without Open MPI (install libopenmpi-dev "
                         "and openmpi-bin, then configure again)");
}
void pp_finalize(void) {}
int pp_job_size(void) { return 1; }
_Noreturn void pp_abort(int code) { exit(code); }
pp_stage *pp_stage_create(model *m, const pp_config *cfg, kvl_error *err) {
    (void)m;
    (void)cfg;
    kvl_fail(err, "--pp: built without Open MPI");
    return NULL;
}
bool pp_worker_run(pp_stage *p, kvl_error *err) {
    (void)p;
    return kvl_fail(err, "--pp: built without Open MPI");
}
void pp_stage_destroy(pp_stage *p) { (void)p; }
void pp_stage_stats(const pp_stage *p, pp_stats *out) {
    (void)p;
    memset(out, 0, sizeof *out);
}
bool pp_stage_kv_block_bytes(const pp_stage *p, int rank, int64_t *per_group, int *n_groups) {
    (void)p;
    (void)rank;
    (void)per_group;
    (void)n_groups;
    return false;
}

#else

#include <mpi.h>

enum { TAG_CTRL = 1, TAG_HIDDEN, TAG_LOGITS, TAG_ACK, TAG_POOLS };
enum { OP_FORWARD = 1, OP_POOLS, OP_STOP, OP_PING };
enum { HDR = 6 }; /* op, step, n_tokens, n_seqs, n_groups, n_micro */

static int g_rank = -1, g_size = 0;
static bool g_inited, g_broken; /* broken: a rank stopped answering; Finalize would wait forever */

bool pp_available(void) { return true; }

bool pp_init(int n_ranks, int *rank, kvl_error *err) {
    if (!g_inited) {
        int provided = 0;
        /* serve calls the forward from its engine thread, one call at a time */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return kvl_fail(err, "--pp: MPI_Init failed");
        g_inited = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
        if (provided < MPI_THREAD_SERIALIZED) {
            *rank = g_rank;
            return kvl_fail(err,
                            "--pp: this MPI library does not allow calls from a second thread");
        }
    }
    *rank = g_rank;
    if (n_ranks > 0 && g_size != n_ranks)
        return kvl_fail(
            err, "--pp %d, but the job has %d rank%s (start it with mpirun -np %d kvllm ...)",
            n_ranks, g_size, g_size == 1 ? "" : "s", n_ranks);
    return true;
}

int pp_job_size(void) { return g_inited ? g_size : 1; }

void pp_finalize(void) {
    if (!g_inited) return;
    g_inited = false;
    if (g_broken) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
}

_Noreturn void pp_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (g_inited) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* ---------------------------------------------------------------- stage -- */

/* ---------------------------------------------------------------- stage -- */

/* Requests not yet complete, each with the rank whose answer it waits for (so
 * a silent rank can be named). */
typedef struct pp_reqs {
    MPI_Request *r;
    int *rank;
    int n, cap;
} pp_reqs;

/* One step in flight: on rank 0 everything a step's sends and receives use
 * until it is waited for; on a worker what its sends read until they
 * complete (a worker goes on with the next step meanwhile). */
typedef struct pp_flight {
    int32_t *ctrl; /* rank 0: the step descriptor being sent */
    int64_t ctrl_cap;
    float *x_out,
        *logits; /* hidden states sent on; logits (rank 0: when the caller has no buffer) */
    int64_t x_out_cap, logits_cap;
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
    int64_t ctrl_cap;
    float *x_in;
    int64_t x_in_cap;
    uint8_t *want;
    int64_t want_cap;
    kv_seq *seqs;
    const kv_seq **seq_ptrs;
    int64_t seqs_cap;
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

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return true;
    int64_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

static bool grow_f(float **p, int64_t *cap, int64_t need) {
    if (need <= *cap) return true;
    int64_t n = need + need / 2 + 1024;
    kvl_free(*p);
    *p = kvl_alloc((size_t)n * sizeof(float));
    *cap = *p ? n : 0;
    return *p != NULL;
}

static void nap(void) {
    struct timespec ts = {0, 20000}; /* 20 us: waiting ranks leave the cores to working ones */
    nanosleep(&ts, NULL);
}

static bool add_req(pp_reqs *q, int rank, MPI_Request r) {
    if (q->n == q->cap) {
        int n = q->cap ? 2 * q->cap : 64;
        MPI_Request *a = realloc(q->r, (size_t)n * sizeof *a);
        if (!a) return false;
        q->r = a;
        int *w = realloc(q->rank, (size_t)n * sizeof *w);
        if (!w) return false;
        q->rank = w;
        q->cap = n;
    }
    q->r[q->n] = r;
    q->rank[q->n++] = rank;
    return true;
}

static bool fail(pp_stage *p, kvl_error *err, const char *msg) {
    if (!p->failed && p->cfg.on_broken) p->cfg.on_broken(p->cfg.on_broken_user);
    p->failed = true;
    g_broken = true;
    if (msg != p->fail_msg) snprintf(p->fail_msg, sizeof p->fail_msg, "%s", msg);
    return kvl_fail(err, "%.500s", p->fail_msg);
}

/* Waits for every request of q; the deadline moves on whenever one
 * completes, so only timeout_s without any progress fails. */
static bool wait_reqs(pp_stage *p, pp_reqs *q, int64_t step, kvl_error *err) {
    const double t0 = kvl_time_s();
    double last = t0;
    int spins = 0;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < q->n; i++) {
            if (q->r[i] == MPI_REQUEST_NULL) continue;
            int done = 0;
            if (MPI_Test(&q->r[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                char msg[200];
                snprintf(msg, sizeof msg, "pipeline: MPI failed talking to rank %d", q->rank[i]);
                return fail(p, err, msg);
            }
            if (done) last = kvl_time_s();
            else pending++;
        }
        if (!pending) break;
        double now = kvl_time_s();
        if (now - last > p->cfg.timeout_s) {
            int who = p->size;
            for (int i = 0; i < q->n; i++)
                if (q->r[i] != MPI_REQUEST_NULL && q->rank[i] < who) who = q->rank[i];
            char msg[220];
            snprintf(msg, sizeof msg,
                     "pipeline: rank %d sent nothing for %.0f s (step %lld): it died or hangs; "
                     "ending the job",
                     who, p->cfg.timeout_s, (long long)step);
            p->st.wait_s += now - t0;
            return fail(p, err, msg);
        }
        if (++spins > 50) nap();
    }
    p->st.wait_s += kvl_time_s() - t0;
    q->n = 0;
    return true;
}

/* The first n_micro - 1 cut points of n tokens into n_micro parts, equal up to one. */
static int64_t micro_start(int64_t n, int n_micro, int k) { return n * k / n_micro; }

static int64_t count_wanted(const uint8_t *want, int64_t t0, int64_t t1) {
    int64_t c = 0;
    for (int64_t t = t0; t < t1; t++) c += want[t] != 0;
    return c;
}

/* ----------------------------------------------------------- rank 0 side -- */

static bool send_ctrl(pp_stage *p, pp_flight *f, int64_t n, kvl_error *err) {
    for (int r = 1; r < p->size; r++) {
        MPI_Request rq;
        if (MPI_Isend(f->ctrl, (int)n, MPI_INT32_T, r, TAG_CTRL, MPI_COMM_WORLD, &rq) !=
                MPI_SUCCESS ||
            !add_req(&f->q, r, rq))
            return fail(p, err, "pipeline: cannot send a step to the other ranks");
        p->st.ctrl_bytes += n * 4;
    }
    p->last_sent = kvl_time_s();
    return true;
}

/* Rank 0: waits for the oldest step in flight (its logits and every rank's ack). */
static bool wait_oldest(pp_stage *p, kvl_error *err) {
    if (p->n_fl == 0) return fail(p, err, "pipeline: no step in flight to wait for");
    pp_flight *f = &p->fl[p->fl_head];
    if (!wait_reqs(p, &f->q, f->step, err)) return false;
    p->fl_head = (p->fl_head + 1) % PP_MAX_FLIGHT;
    p->n_fl--;
    p->st.steps++;
    p->st.tokens += f->n_tokens;
    return true;
}

/* Rank 0: a message outside the steps (pools, stop) in the next slot, sent
 * once every step in flight is done, and waited for. */
static bool send_now(pp_stage *p, pp_flight *f, int64_t n, kvl_error *err) {
    return send_ctrl(p, f, n, err) && wait_reqs(p, &f->q, p->step, err);
}

static pp_flight *next_flight(pp_stage *p) {
    return &p->fl[(p->fl_head + p->n_fl) % PP_MAX_FLIGHT];
}

static bool sync_pools(pp_stage *p, kv_pool *const *pools, kvl_error *err) {
    const int G = model_kv_n_groups(p->m);
    bool same = p->sent_pools == pools && p->n_sent == G;
    for (int g = 0; same && g < G; g++)
        same = memcmp(&p->sent_cfg[g], kv_pool_cfg(pools[g]), sizeof(kv_pool_config)) == 0;
    if (same) return true;
    if (p->n_fl > 0) /* the steps in flight use the old pools on the other ranks */
        return fail(p, err, "pipeline: new KV pools while steps are in flight");
    pp_flight *f = next_flight(p);
    if (!grow((void **)&f->ctrl, &f->ctrl_cap, HDR + 5 * G, sizeof(int32_t)))
        return fail(p, err, "pipeline: out of memory");
    int32_t *c = f->ctrl;
    memset(c, 0, HDR * sizeof *c);
    c[0] = OP_POOLS;
    c[1] = (int32_t)p->step;
    c[4] = G;
    for (int g = 0; g < G; g++) {
        const kv_pool_config *k = kv_pool_cfg(pools[g]);
        int32_t *o = c + HDR + 5 * g;
        o[0] = k->block_size;
        o[1] = k->dtype;
        o[2] = k->split_v;
        o[3] = k->dtype_v;
        o[4] = (int32_t)k->n_blocks;
        p->sent_cfg[g] = *k;
    }
    p->sent_pools = pools;
    p->n_sent = G;
    for (int g = 0; g < G; g++) p->block_bytes[0][g] = (int64_t)kv_pool_block_bytes(pools[g]);
    if (!send_ctrl(p, f, HDR + 5 * G, err)) return false;
    for (int r = 1; r < p->size; r++) { /* each worker answers with its block bytes */
        MPI_Request rq;
        if (MPI_Irecv(p->block_bytes[r], G, MPI_INT64_T, r, TAG_POOLS, MPI_COMM_WORLD, &rq) !=
                MPI_SUCCESS ||
            !add_req(&f->q, r, rq))
            return fail(p, err, "pipeline: cannot post a receive");
    }
    return wait_reqs(p, &f->q, p->step, err);
}

static bool pack_forward(pp_stage *p, pp_flight *f, const model_batch *b, const uint8_t *want,
                         int n_micro, int64_t *len, kvl_error *err) {
    const int G = model_kv_n_groups(p->m);
    const int64_t n = b->n_tokens;
    int64_t need = HDR + 4 * n + (int64_t)b->n_seqs * G;
    for (int64_t s = 0; s < (int64_t)b->n_seqs * G; s++) need += b->seqs[s]->n_blocks;
    if (need > INT32_MAX / 2 || !grow((void **)&f->ctrl, &f->ctrl_cap, need, sizeof(int32_t)))
        return fail(p, err, "pipeline: out of memory");
    int32_t *c = f->ctrl;
    c[0] = OP_FORWARD;
    c[1] = (int32_t)p->step;
    c[2] = (int32_t)n;
    c[3] = b->n_seqs;
    c[4] = G;
    c[5] = n_micro;
    int32_t *o = c + HDR;
    memcpy(o, b->tokens, (size_t)n * sizeof *o);
    memcpy(o + n, b->pos, (size_t)n * sizeof *o);
    memcpy(o + 2 * n, b->seq, (size_t)n * sizeof *o);
    for (int64_t t = 0; t < n; t++) o[3 * n + t] = want[t];
    o += 4 * n;
    for (int64_t s = 0; s < (int64_t)b->n_seqs * G; s++) {
        const kv_seq *k = b->seqs[s];
        *o++ = (int32_t)k->n_blocks;
        memcpy(o, k->blocks, (size_t)k->n_blocks * sizeof *o);
        o += k->n_blocks;
    }
    *len = o - c;
    return true;
}

static model_batch sub_batch(const model_batch *b, const uint8_t *want, int64_t t0, int64_t t1) {
    return (model_batch){.n_tokens = t1 - t0,
                         .tokens = b->tokens + t0,
                         .pos = b->pos + t0,
                         .seq = b->seq + t0,
                         .want_logits = want + t0,
                         .n_seqs = b->n_seqs,
                         .seqs = b->seqs};
}

/* Rank 0: sends the step down the pipeline, posts the receives of its logits
 * and acks, and computes its own layers, micro-batch by micro-batch, sending
 * each part on as it is done. Returns without waiting for the answers. */
static void maybe_fault(pp_stage *p);

static bool launch(pp_stage *p, model *m, kv_pool *const *pools, const model_batch *b,
                   float *logits, kvl_error *err) {
    if (p->failed) return kvl_fail(err, "%.500s", p->fail_msg);
    if (b->hidden)
        return kvl_fail(err, "pipeline: hidden states (embeddings) are not available with --pp");
    const model_hparams *hp = model_hp(m);
    const int64_t n = b->n_tokens, E = hp->n_embd, V = hp->n_vocab;
    if (n <= 0) return kvl_fail(err, "pipeline: an empty step");
    if (p->n_fl == PP_MAX_FLIGHT) return fail(p, err, "pipeline: too many steps in flight");
    p->step++;
    maybe_fault(p);
    if (!sync_pools(p, pools, err)) return false;
    pp_flight *f = next_flight(p);
    f->step = p->step;
    f->n_tokens = n;
    if (!grow((void **)&p->want, &p->want_cap, n, 1) || !grow_f(&f->x_out, &f->x_out_cap, n * E))
        return fail(p, err, "pipeline: out of memory");
    if (b->want_logits) memcpy(p->want, b->want_logits, (size_t)n);
    else {
        memset(p->want, 0, (size_t)n);
        p->want[n - 1] = 1;
    }
    const int64_t n_want = count_wanted(p->want, 0, n);
    float *out = logits;
    if (!out) { /* the caller wants none of them, but the last rank sends what is wanted */
        if (!grow_f(&f->logits, &f->logits_cap, n_want * V))
            return fail(p, err, "pipeline: out of memory");
        out = f->logits;
    }
    /* by default a step is cut into one micro-batch per rank only when no
     * other step is in flight: otherwise the stages are busy with those, and
     * every extra part reads the stage's weights once more */
    int n_micro = p->cfg.micro > 0 ? p->cfg.micro : p->n_fl > 0 ? 1 : p->size;
    if (n_micro > n) n_micro = (int)n;
    int64_t len = 0;
    if (!pack_forward(p, f, b, p->want, n_micro, &len, err) || !send_ctrl(p, f, len, err))
        return false;
    p->n_fl++; /* from here on its requests are waited for */
    if (p->n_fl > p->st.most_in_flight) p->st.most_in_flight = p->n_fl;
    /* answers first, so they land in place whenever they come */
    int64_t row = 0;
    for (int k = 0; k < n_micro; k++) {
        const int64_t t0 = micro_start(n, n_micro, k), t1 = micro_start(n, n_micro, k + 1);
        const int64_t w = count_wanted(p->want, t0, t1);
        MPI_Request rq;
        if (MPI_Irecv(out + row * V, (int)(w * V), MPI_FLOAT, p->size - 1, TAG_LOGITS,
                      MPI_COMM_WORLD, &rq) != MPI_SUCCESS ||
            !add_req(&f->q, p->size - 1, rq))
            return fail(p, err, "pipeline: cannot post a receive");
        row += w;
    }
    for (int r = 1; r < p->size; r++) {
        MPI_Request rq;
        if (MPI_Irecv(&f->acks[r], 1, MPI_INT32_T, r, TAG_ACK, MPI_COMM_WORLD, &rq) !=
                MPI_SUCCESS ||
            !add_req(&f->q, r, rq))
            return fail(p, err, "pipeline: cannot post a receive");
    }
    for (int k = 0; k < n_micro; k++) {
        const int64_t t0 = micro_start(n, n_micro, k), t1 = micro_start(n, n_micro, k + 1);
        model_batch sb = sub_batch(b, p->want, t0, t1);
        if (!model_forward_stage(m, pools, &sb, NULL, f->x_out + t0 * E, NULL, err)) {
            /* the others wait for this step: the pipeline cannot go on */
            char msg[sizeof p->fail_msg];
            snprintf(msg, sizeof msg, "pipeline: %s", err->msg);
            return fail(p, err, msg);
        }
        MPI_Request rq;
        if (MPI_Isend(f->x_out + t0 * E, (int)((t1 - t0) * E), MPI_FLOAT, 1, TAG_HIDDEN,
                      MPI_COMM_WORLD, &rq) != MPI_SUCCESS ||
            !add_req(&f->q, 1, rq))
            return fail(p, err, "pipeline: cannot send hidden states to rank 1");
        p->st.hidden_bytes += (t1 - t0) * E * (int64_t)sizeof(float);
        int done; /* let the send start while the next part computes */
        MPI_Test(&f->q.r[f->q.n - 1], &done, MPI_STATUS_IGNORE);
    }
    return true;
}

static void enter(pp_stage *p) {
    pthread_mutex_lock(&p->lock);
    p->in_call = true;
}

static bool leave(pp_stage *p, bool ok) {
    p->in_call = false;
    pthread_mutex_unlock(&p->lock);
    return ok;
}

static bool launch_hook(void *user, model *m, kv_pool *const *pools, const model_batch *b,
                        float *logits, kvl_error *err) {
    pp_stage *p = user;
    enter(p);
    return leave(p, launch(p, m, pools, b, logits, err));
}

static bool wait_hook(void *user, kvl_error *err) {
    pp_stage *p = user;
    if (p->failed) return kvl_fail(err, "%.500s", p->fail_msg);
    enter(p);
    return leave(p, wait_oldest(p, err));
}

/* model_forward: one step alone, launched and waited for. */
static bool forward_hook(void *user, model *m, kv_pool *const *pools, const model_batch *b,
                         float *logits, kvl_error *err) {
    pp_stage *p = user;
    if (p->failed) return kvl_fail(err, "%.500s", p->fail_msg);
    if (p->n_fl > 0)
        return kvl_fail(err, "pipeline: a forward of its own while steps are in flight");
    if (b->n_tokens <= 0) return true;
    enter(p);
    return leave(p, launch(p, m, pools, b, logits, err) && wait_oldest(p, err));
}

/* Rank 0's ping thread (see pp_stage.beat). A ping is a few bytes, sent
 * eagerly: the previous one is done by the next. */
static void *beat_main(void *arg) {
    pp_stage *p = arg;
    const double every = p->cfg.timeout_s / 4;
    for (;;) {
        struct timespec ts = {0, 50 * 1000 * 1000}; /* stops within 50 ms */
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&p->lock);
        if (p->beat_stop || p->failed) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        if (!p->in_call && kvl_time_s() - p->last_sent >= every) {
            for (int i = 0; i < p->ping_q.n; i++)
                if (p->ping_q.r[i] != MPI_REQUEST_NULL)
                    MPI_Test(&p->ping_q.r[i], &(int){0}, MPI_STATUS_IGNORE);
            p->ping_q.n = 0;
            p->ping[0] = OP_PING;
            for (int r = 1; r < p->size; r++) {
                MPI_Request rq;
                if (MPI_Isend(p->ping, HDR, MPI_INT32_T, r, TAG_CTRL, MPI_COMM_WORLD, &rq) ==
                    MPI_SUCCESS)
                    add_req(&p->ping_q, r, rq);
            }
            p->last_sent = kvl_time_s();
        }
        pthread_mutex_unlock(&p->lock);
    }
}

/* ----------------------------------------------------------- worker side -- */

static bool worker_pools(pp_stage *p, const int32_t *c, int64_t len, kvl_error *err) {
    const int G = c[4];
    if (G != model_kv_n_groups(p->m) || len != HDR + 5 * G)
        return kvl_fail(err, "pipeline: rank 0 has %d KV groups, this rank %d", G,
                        model_kv_n_groups(p->m));
    for (int g = 0; g < p->n_pools; g++) kv_pool_destroy(p->pools[g]);
    p->n_pools = 0;
    for (int g = 0; g < G; g++) {
        const int32_t *o = c + HDR + 5 * g;
        kv_pool_config kc;
        model_kv_group_shape(p->m, g, &kc, NULL);
        kc.block_size = o[0];
        kc.dtype = o[1];
        kc.split_v = o[2] != 0;
        kc.dtype_v = o[3];
        kc.n_blocks = o[4];
        if (!(p->pools[g] = kv_pool_create(&kc, err))) return false;
        p->n_pools = g + 1;
        p->block_bytes[0][g] = (int64_t)kv_pool_block_bytes(p->pools[g]);
    }
    /* a few bytes: sent at once (eagerly) */
    if (MPI_Send(p->block_bytes[0], G, MPI_INT64_T, 0, TAG_POOLS, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kvl_fail(err, "pipeline: rank %d: cannot answer rank 0", p->rank);
    return true;
}

/* Waits for a message from src with tag; *count its int32 / float count. no
 * deadline when timeout < 0. */
static bool probe(pp_stage *p, int src, int tag, MPI_Datatype dt, double timeout, int *count,
                  kvl_error *err) {
    const double t0 = kvl_time_s();
    int spins = 0;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(src, tag, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS)
            return fail(p, err, "pipeline: MPI_Iprobe failed");
        if (flag) {
            MPI_Get_count(&st, dt, count);
            if (timeout >= 0) p->st.wait_s += kvl_time_s() - t0;
            return true;
        }
        if (timeout >= 0 && kvl_time_s() - t0 > timeout) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "pipeline: rank %d: rank %d sent nothing for %.0f s (step %lld)", p->rank, src,
                     timeout, (long long)p->step);
            return fail(p, err, msg);
        }
        if (++spins > 50) nap();
    }
}

static void maybe_fault(pp_stage *p) {
    if (p->fault_rank != p->rank || p->step != p->fault_step) return;
    fprintf(stderr, "kvllm: rank %d: %s at step %lld (KVLLM_PP_FAULT)\n", p->rank,
            p->fault_hang ? "stops answering" : "exits", (long long)p->step);
    fflush(stderr);
    if (!p->fault_hang) _exit(3);
    for (;;) pause();
}

/* A worker's next slot for a step's sends: the sends it made two steps ago
 * are waited for first. */
static pp_flight *worker_flight(pp_stage *p, kvl_error *err) {
    pp_flight *f = &p->fl[p->fl_head];
    p->fl_head = (p->fl_head + 1) % 2;
    return wait_reqs(p, &f->q, p->step, err) ? f : NULL;
}

static bool worker_forward(pp_stage *p, const int32_t *c, int64_t len, kvl_error *err) {
    const model_hparams *hp = model_hp(p->m);
    const int64_t n = c[2], E = hp->n_embd, V = hp->n_vocab;
    const int n_seqs = c[3], G = c[4], n_micro = c[5];
    if (G != p->n_pools || n <= 0 || n_seqs <= 0 || n_micro <= 0 || n_micro > n ||
        len < HDR + 4 * n + (int64_t)n_seqs * G)
        return kvl_fail(err, "pipeline: rank %d: malformed step from rank 0", p->rank);
    pp_flight *f = worker_flight(p, err);
    if (!f) return false;
    const int32_t *tokens = c + HDR, *pos = tokens + n, *seq = pos + n, *want32 = seq + n;
    if (!grow((void **)&p->want, &p->want_cap, n, 1) ||
        !grow((void **)&p->seqs, &p->seqs_cap, (int64_t)n_seqs * G, sizeof *p->seqs) ||
        !grow_f(&p->x_in, &p->x_in_cap, n * E))
        return kvl_fail(err, "pipeline: out of memory");
    /* seq_ptrs follows seqs' capacity */
    const kv_seq **sp = realloc(p->seq_ptrs, (size_t)p->seqs_cap * sizeof *sp);
    if (!sp) return kvl_fail(err, "pipeline: out of memory");
    p->seq_ptrs = sp;
    for (int64_t t = 0; t < n; t++) p->want[t] = want32[t] != 0;
    const int32_t *o = want32 + n, *end = c + len;
    for (int64_t s = 0; s < (int64_t)n_seqs * G; s++) {
        if (o >= end || *o < 0 || o + 1 + *o > end)
            return kvl_fail(err, "pipeline: rank %d: malformed block tables", p->rank);
        kv_seq *k = &p->seqs[s];
        kv_seq_init(k);
        k->n_blocks = k->cap = *o;
        k->blocks = (int32_t *)(o + 1); /* borrowed from the message, read only */
        sp[s] = k;
        o += 1 + *o;
    }
    const bool last = p->rank == p->size - 1;
    float *x_out = NULL;
    if (!last && !grow_f(&f->x_out, &f->x_out_cap, n * E))
        return kvl_fail(err, "pipeline: out of memory");
    if (last && !grow_f(&f->logits, &f->logits_cap, count_wanted(p->want, 0, n) * V))
        return kvl_fail(err, "pipeline: out of memory");
    x_out = last ? NULL : f->x_out;
    model_batch b = {
        .n_tokens = n, .tokens = tokens, .pos = pos, .seq = seq, .n_seqs = n_seqs, .seqs = sp};
    int64_t row = 0;
    for (int k = 0; k < n_micro; k++) {
        const int64_t t0 = micro_start(n, n_micro, k), t1 = micro_start(n, n_micro, k + 1);
        int count;
        if (!probe(p, p->rank - 1, TAG_HIDDEN, MPI_FLOAT, p->cfg.timeout_s, &count, err))
            return false;
        if (count != (t1 - t0) * E)
            return kvl_fail(err, "pipeline: rank %d: %d hidden values from rank %d, expected %lld",
                            p->rank, count, p->rank - 1, (long long)((t1 - t0) * E));
        MPI_Recv(p->x_in + t0 * E, count, MPI_FLOAT, p->rank - 1, TAG_HIDDEN, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        model_batch sb = sub_batch(&b, p->want, t0, t1);
        float *rows = last ? f->logits + row * V : NULL;
        if (!model_forward_stage(p->m, p->pools, &sb, p->x_in + t0 * E,
                                 x_out ? x_out + t0 * E : NULL, rows, err))
            return false;
        MPI_Request rq;
        if (last) {
            const int64_t w = count_wanted(p->want, t0, t1);
            MPI_Isend(rows, (int)(w * V), MPI_FLOAT, 0, TAG_LOGITS, MPI_COMM_WORLD, &rq);
            p->st.logits_bytes += w * V * (int64_t)sizeof(float);
            row += w;
            if (!add_req(&f->q, 0, rq)) return kvl_fail(err, "pipeline: out of memory");
        } else {
            MPI_Isend(x_out + t0 * E, (int)((t1 - t0) * E), MPI_FLOAT, p->rank + 1, TAG_HIDDEN,
                      MPI_COMM_WORLD, &rq);
            p->st.hidden_bytes += (t1 - t0) * E * (int64_t)sizeof(float);
            if (!add_req(&f->q, p->rank + 1, rq)) return kvl_fail(err, "pipeline: out of memory");
        }
        int done;
        MPI_Test(&f->q.r[f->q.n - 1], &done, MPI_STATUS_IGNORE);
    }
    f->acks[0] = (int32_t)p->step;
    MPI_Request rq;
    MPI_Isend(&f->acks[0], 1, MPI_INT32_T, 0, TAG_ACK, MPI_COMM_WORLD, &rq);
    if (!add_req(&f->q, 0, rq)) return kvl_fail(err, "pipeline: out of memory");
    p->st.steps++;
    p->st.tokens += n;
    return true;
}

bool pp_worker_run(pp_stage *p, kvl_error *err) {
    for (bool first = true;; first = false) {
        int count;
        /* rank 0 pings while it has no step to send: silence for timeout_s
         * means it died or hangs (before its first message it may still be
         * loading, for any time) */
        if (!probe(p, 0, TAG_CTRL, MPI_INT32_T, first ? -1 : p->cfg.timeout_s, &count, err))
            return false;
        if (count < HDR || !grow((void **)&p->ctrl, &p->ctrl_cap, count, sizeof(int32_t)))
            return kvl_fail(err, "pipeline: rank %d: bad message from rank 0", p->rank);
        MPI_Recv(p->ctrl, count, MPI_INT32_T, 0, TAG_CTRL, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        const int32_t *c = p->ctrl;
        if (c[0] == OP_PING) continue;
        if (c[0] == OP_STOP) /* what it sent last is received before rank 0 stops */
            return wait_reqs(p, &p->fl[0].q, p->step, err) &&
                   wait_reqs(p, &p->fl[1].q, p->step, err);
        p->step = c[1];
        if (c[0] == OP_POOLS) {
            if (!worker_pools(p, c, count, err)) return false;
        } else if (c[0] == OP_FORWARD) {
            maybe_fault(p);
            if (!worker_forward(p, c, count, err)) return false;
        } else {
            return kvl_fail(err, "pipeline: rank %d: unknown message %d from rank 0", p->rank,
                            c[0]);
        }
    }
}

pp_stage *pp_stage_create(model *m, const pp_config *cfg, kvl_error *err) {
    if (!g_inited) {
        kvl_fail(err, "pipeline: pp_init first");
        return NULL;
    }
    pp_stage *p = calloc(1, sizeof *p);
    if (!p) {
        kvl_fail(err, "pipeline: out of memory");
        return NULL;
    }
    p->m = m;
    p->cfg = *cfg;
    if (p->cfg.timeout_s <= 0) p->cfg.timeout_s = 60;
    p->rank = g_rank;
    p->size = g_size;
    p->fault_rank = -1;
    const char *f = getenv("KVLLM_PP_FAULT");
    if (f && *f) {
        char mode[16] = "";
        long long step = 0;
        if (sscanf(f, "%d:%lld:%15s", &p->fault_rank, &step, mode) != 3 ||
            (strcmp(mode, "exit") != 0 && strcmp(mode, "hang") != 0)) {
            kvl_fail(err, "KVLLM_PP_FAULT='%s': expected RANK:STEP:exit|hang", f);
            free(p);
            return NULL;
        }
        p->fault_step = step;
        p->fault_hang = strcmp(mode, "hang") == 0;
    }
    pthread_mutex_init(&p->lock, NULL);
    if (p->rank == 0 && p->size > 1) {
        p->last_sent = kvl_time_s();
        if (pthread_create(&p->beat, NULL, beat_main, p) != 0) {
            kvl_fail(err, "pipeline: cannot start a thread");
            pthread_mutex_destroy(&p->lock);
            free(p);
            return NULL;
        }
        p->beating = true;
        model_set_forward_hook(m, forward_hook, p);
        model_set_forward_async(m, launch_hook, wait_hook, p);
    }
    return p;
}

void pp_stage_destroy(pp_stage *p) {
    if (!p) return;
    if (p->rank == 0 && p->size > 1) {
        model_set_forward_hook(p->m, NULL, NULL);
        model_set_forward_async(p->m, NULL, NULL, NULL);
        if (p->beating) {
            pthread_mutex_lock(&p->lock);
            p->beat_stop = true;
            pthread_mutex_unlock(&p->lock);
            pthread_join(p->beat, NULL);
        }
        kvl_error err = {{0}};
        if (!p->failed) wait_reqs(p, &p->ping_q, p->step, &err);
        while (!p->failed && p->n_fl > 0 && wait_oldest(p, &err)) {}
        pp_flight *f = next_flight(p);
        if (!p->failed && grow((void **)&f->ctrl, &f->ctrl_cap, HDR, sizeof(int32_t))) {
            memset(f->ctrl, 0, HDR * sizeof *f->ctrl);
            f->ctrl[0] = OP_STOP;
            if (!send_now(p, f, HDR, &err)) fprintf(stderr, "kvllm: %s\n", err.msg);
        }
        if (p->failed && err.msg[0]) fprintf(stderr, "kvllm: %s\n", err.msg);
    }
    for (int g = 0; g < p->n_pools; g++) kv_pool_destroy(p->pools[g]);
    for (int k = 0; k < PP_MAX_FLIGHT; k++) {
        pp_flight *f = &p->fl[k];
        free(f->ctrl);
        kvl_free(f->x_out);
        kvl_free(f->logits);
        free(f->q.r);
        free(f->q.rank);
    }
    free(p->ping_q.r);
    free(p->ping_q.rank);
    pthread_mutex_destroy(&p->lock);
    free(p->ctrl);
    kvl_free(p->x_in);
    free(p->want);
    free(p->seqs);
    free(p->seq_ptrs);
    free(p);
}

void pp_stage_stats(const pp_stage *p, pp_stats *out) { *out = p->st; }

bool pp_stage_kv_block_bytes(const pp_stage *p, int rank, int64_t *per_group, int *n_groups) {
    if (p->rank != 0 || p->n_sent == 0 || rank < 0 || rank >= p->size) return false;
    memcpy(per_group, p->block_bytes[rank], (size_t)p->n_sent * sizeof *per_group);
    *n_groups = p->n_sent;
    return true;
}

#endif
