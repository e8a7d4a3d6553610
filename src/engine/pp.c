/* pp: pipeline-parallel stages over MPI (pp.h): MPI's set-up, the stage's
 * life and the helpers both sides use. Rank 0's side is pp_rank0.c, the other
 * ranks' pp_worker.c, the messages between them pp_internal.h; the layer split
 * (no MPI) pp_split.c. Only these files call MPI.
 *
 * For tests, KVLLM_PP_FAULT=RANK:STEP:exit|hang makes rank RANK exit (or stop
 * answering) when step STEP arrives. */
#include "pp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
bool pp_stage_kv_probe(pp_stage *p, const kv_pool_config *groups, int n_groups, pp_rank_mem *out,
                       kvl_error *err) {
    (void)p;
    (void)groups;
    (void)n_groups;
    (void)out;
    return kvl_fail(err, "--pp: built without Open MPI");
}

#else

#include "pp_internal.h"

static int g_rank = -1, g_size = 0;
static bool g_inited;
bool pp_g_broken;

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
    if (pp_g_broken) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
}

_Noreturn void pp_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (g_inited) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* ------------------------------------------------------------- helpers -- */

bool pp_floats_grow(pp_floats *b, int64_t need) {
    if (need <= b->cap) return true;
    int64_t n = need + need / 2 + 1024;
    kvl_free(b->v);
    b->v = kvl_alloc((size_t)n * sizeof *b->v);
    b->cap = b->v ? n : 0;
    return b->v != NULL;
}

void pp_floats_free(pp_floats *b) {
    kvl_free(b->v);
    *b = (pp_floats){0};
}

void pp_nap(void) {
    struct timespec ts = {0, 20000}; /* 20 us: waiting ranks leave the cores to working ones */
    nanosleep(&ts, NULL);
}

bool pp_add_req(pp_reqs *q, int rank, MPI_Request r) {
    if (!kvl_grow((void **)&q->v, &q->cap, (size_t)q->n + 1, sizeof *q->v, 64)) return false;
    q->v[q->n++] = (pp_req){.r = r, .rank = rank};
    return true;
}

void pp_reqs_free(pp_reqs *q) {
    free(q->v);
    *q = (pp_reqs){0};
}

bool pp_fail(pp_stage *p, kvl_error *err, const char *msg) {
    if (!p->failed && p->cfg.on_broken) p->cfg.on_broken(p->cfg.on_broken_user);
    p->failed = true;
    pp_g_broken = true;
    if (msg != p->fail_msg) snprintf(p->fail_msg, sizeof p->fail_msg, "%s", msg);
    return kvl_fail(err, "%.500s", p->fail_msg);
}

bool pp_wait_reqs(pp_stage *p, pp_reqs *q, int64_t step, kvl_error *err) {
    const double t0 = kvl_time_s();
    double last = t0;
    int spins = 0;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < q->n; i++) {
            if (q->v[i].r == MPI_REQUEST_NULL) continue;
            int done = 0;
            if (MPI_Test(&q->v[i].r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                char msg[200];
                snprintf(msg, sizeof msg, "pipeline: MPI failed talking to rank %d", q->v[i].rank);
                return pp_fail(p, err, msg);
            }
            if (done) last = kvl_time_s();
            else pending++;
        }
        if (!pending) break;
        double now = kvl_time_s();
        if (now - last > p->cfg.timeout_s) {
            int who = p->size;
            for (int i = 0; i < q->n; i++)
                if (q->v[i].r != MPI_REQUEST_NULL && q->v[i].rank < who) who = q->v[i].rank;
            char msg[220];
            snprintf(msg, sizeof msg,
                     "pipeline: rank %d sent nothing for %.0f s (step %lld): it died or hangs; "
                     "ending the job",
                     who, p->cfg.timeout_s, (long long)step);
            p->st.wait_s += now - t0;
            return pp_fail(p, err, msg);
        }
        if (++spins > 50) pp_nap();
    }
    p->st.wait_s += kvl_time_s() - t0;
    q->n = 0;
    return true;
}

void pp_maybe_fault(pp_stage *p) {
    if (p->fault_rank != p->rank || p->step != p->fault_step) return;
    fprintf(stderr, "kvllm: rank %d: %s at step %lld (KVLLM_PP_FAULT)\n", p->rank,
            p->fault_hang ? "stops answering" : "exits", (long long)p->step);
    fflush(stderr);
    if (!p->fault_hang) _exit(3);
    for (;;) pause();
}

/* A host id: FNV-1a of the host name (0 when it cannot be read). */
static uint64_t host_id(void) {
    char name[256] = "";
    if (gethostname(name, sizeof name - 1) != 0) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    return h;
}

bool pp_probe_self(const model *m, const int32_t *o, int n_groups, int64_t *ans, kvl_error *err) {
    for (int g = 0; g < n_groups; g++, o += PROBE_INTS) {
        kv_pool_config kc;
        model_kv_group_shape(m, g, &kc, NULL);
        kc.block_size = o[0];
        kc.dtype = o[1];
        kc.split_v = o[2] != 0;
        kc.dtype_v = o[3];
        kc.n_blocks = 1;
        kv_pool *pool = kv_pool_create(&kc, err);
        if (!pool) return false;
        ans[g] = (int64_t)kv_pool_geometry(pool)->block_bytes;
        kv_pool_destroy(pool);
    }
    ans[n_groups] = kvl_mem_available();
    ans[n_groups + 1] = (int64_t)host_id();
    return true;
}

/* --------------------------------------------------------------- stage -- */

/* KVLLM_PP_FAULT=RANK:STEP:exit|hang (tests): the rank that fails on purpose, and when. */
static bool read_fault(pp_stage *p, kvl_error *err) {
    p->fault_rank = -1;
    const char *f = getenv("KVLLM_PP_FAULT");
    if (!f || !*f) return true;
    char mode[16] = "";
    long long step = 0;
    if (sscanf(f, "%d:%lld:%15s", &p->fault_rank, &step, mode) != 3 ||
        (strcmp(mode, "exit") != 0 && strcmp(mode, "hang") != 0))
        return kvl_fail(err, "KVLLM_PP_FAULT='%s': expected RANK:STEP:exit|hang", f);
    p->fault_step = step;
    p->fault_hang = strcmp(mode, "hang") == 0;
    return true;
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
    pthread_mutex_init(&p->lock, NULL);
    if (!read_fault(p, err) || (p->rank == 0 && p->size > 1 && !pp_rank0_open(p, err))) {
        pp_stage_destroy(p); /* one teardown, also for a stage not fully made */
        return NULL;
    }
    return p;
}

void pp_stage_destroy(pp_stage *p) {
    if (!p) return;
    if (p->beating) pp_rank0_close(p); /* rank 0 of a pipeline, once pp_rank0_open succeeded */
    for (int g = 0; g < p->n_pools; g++) kv_pool_destroy(p->pools[g]);
    for (int k = 0; k < PP_MAX_FLIGHT; k++) {
        pp_flight *f = &p->fl[k];
        free(f->ctrl);
        pp_floats_free(&f->x_out);
        pp_floats_free(&f->logits);
        pp_reqs_free(&f->q);
    }
    pp_reqs_free(&p->ping_q);
    pthread_mutex_destroy(&p->lock);
    free(p->ctrl);
    pp_floats_free(&p->x_in);
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
