/* pp_worker: the side of ranks > 0 (pp.h, messages in pp_internal.h). A
 * worker waits for rank 0's messages: a step runs its layers on the hidden
 * states from the rank before, micro-batch by micro-batch, and sends them on
 * (the last rank: the wanted logits to rank 0); OP_POOLS makes its pools,
 * OP_PROBE measures them; OP_STOP ends pp_worker_run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KVLLM_HAVE_MPI

#include "pp_internal.h"

static bool worker_pools(pp_stage *p, const int32_t *c, int64_t len, kvl_error *err) {
    const int G = c[4];
    if (G != model_kv_n_groups(p->m) || len != HDR + POOL_INTS * G)
        return kvl_fail(err, "pipeline: rank 0 has %d KV groups, this rank %d", G,
                        model_kv_n_groups(p->m));
    for (int g = 0; g < p->n_pools; g++) kv_pool_destroy(p->pools[g]);
    p->n_pools = 0;
    for (int g = 0; g < G; g++) {
        const int32_t *o = c + HDR + POOL_INTS * g;
        kv_pool_config kc;
        model_kv_group_shape(p->m, g, &kc, NULL);
        kc.block_size = o[0];
        kc.dtype = o[1];
        kc.split_v = o[2] != 0;
        kc.dtype_v = o[3];
        kc.n_blocks = o[4];
        if (!(p->pools[g] = kv_pool_create(&kc, err))) return false;
        p->n_pools = g + 1;
        p->block_bytes[0][g] = (int64_t)kv_pool_geometry(p->pools[g])->block_bytes;
    }
    /* a few bytes: sent at once (eagerly) */
    if (MPI_Send(p->block_bytes[0], G, MPI_INT64_T, 0, TAG_POOLS, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kvl_fail(err, "pipeline: rank %d: cannot answer rank 0", p->rank);
    return true;
}

/* OP_PROBE: the bytes of one block of each group with rank 0's settings on
 * this rank's layers, and this host's memory (-1 bytes for a group: this
 * rank cannot make such a pool; rank 0 says so). */
static bool worker_probe(pp_stage *p, const int32_t *c, int64_t len, kvl_error *err) {
    const int G = c[4];
    if (G < 1 || G > MODEL_MAX_KV_GROUPS || G != model_kv_n_groups(p->m) ||
        len != HDR + PROBE_INTS * G)
        return kvl_fail(err, "pipeline: rank 0 has %d KV groups, this rank %d", G,
                        model_kv_n_groups(p->m));
    int64_t ans[MODEL_MAX_KV_GROUPS + 2];
    kvl_error perr = {{0}};
    if (!pp_probe_self(p->m, c + HDR, G, ans, &perr)) {
        fprintf(stderr, "kvllm: rank %d: %s\n", p->rank, perr.msg);
        for (int g = 0; g < G; g++) ans[g] = -1;
    }
    /* a few bytes: sent at once (eagerly) */
    if (MPI_Send(ans, G + 2, MPI_INT64_T, 0, TAG_PROBE, MPI_COMM_WORLD) != MPI_SUCCESS)
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
            return pp_fail(p, err, "pipeline: MPI_Iprobe failed");
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
            return pp_fail(p, err, msg);
        }
        if (++spins > 50) pp_nap();
    }
}

/* A worker's next slot for a step's sends: the sends it made two steps ago
 * are waited for first. */
static pp_flight *worker_flight(pp_stage *p, kvl_error *err) {
    pp_flight *f = &p->fl[p->fl_head];
    p->fl_head = (p->fl_head + 1) % 2;
    return pp_wait_reqs(p, &f->q, p->step, err) ? f : NULL;
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
    if (!kvl_grow((void **)&p->want, &p->want_cap, (size_t)n, 1, 64) ||
        !kvl_grow((void **)&p->seqs, &p->seqs_cap, (size_t)n_seqs * G, sizeof *p->seqs, 64) ||
        !pp_floats_grow(&p->x_in, n * E))
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
        k->n_blocks = *o;
        k->cap = (size_t)*o;
        k->blocks = (int32_t *)(o + 1); /* borrowed from the message, read only */
        sp[s] = k;
        o += 1 + *o;
    }
    const bool last = p->rank == p->size - 1;
    float *x_out = NULL;
    if (!last && !pp_floats_grow(&f->x_out, n * E)) return kvl_fail(err, "pipeline: out of memory");
    if (last && !pp_floats_grow(&f->logits, pp_count_wanted(p->want, 0, n) * V))
        return kvl_fail(err, "pipeline: out of memory");
    x_out = last ? NULL : f->x_out.v;
    model_batch b = {
        .n_tokens = n, .tokens = tokens, .pos = pos, .seq = seq, .n_seqs = n_seqs, .seqs = sp};
    int64_t row = 0;
    for (int k = 0; k < n_micro; k++) {
        const int64_t t0 = pp_micro_start(n, n_micro, k), t1 = pp_micro_start(n, n_micro, k + 1);
        int count;
        if (!probe(p, p->rank - 1, TAG_HIDDEN, MPI_FLOAT, p->cfg.timeout_s, &count, err))
            return false;
        if (count != (t1 - t0) * E)
            return kvl_fail(err, "pipeline: rank %d: %d hidden values from rank %d, expected %lld",
                            p->rank, count, p->rank - 1, (long long)((t1 - t0) * E));
        MPI_Recv(p->x_in.v + t0 * E, count, MPI_FLOAT, p->rank - 1, TAG_HIDDEN, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        model_batch sb = pp_sub_batch(&b, p->want, t0, t1);
        float *rows = last ? f->logits.v + row * V : NULL;
        if (!model_forward_stage(p->m, p->pools, &sb, p->x_in.v + t0 * E,
                                 x_out ? x_out + t0 * E : NULL, rows, err))
            return false;
        MPI_Request rq;
        if (last) {
            const int64_t w = pp_count_wanted(p->want, t0, t1);
            MPI_Isend(rows, (int)(w * V), MPI_FLOAT, 0, TAG_LOGITS, MPI_COMM_WORLD, &rq);
            p->st.logits_bytes += w * V * (int64_t)sizeof(float);
            row += w;
            if (!pp_add_req(&f->q, 0, rq)) return kvl_fail(err, "pipeline: out of memory");
        } else {
            MPI_Isend(x_out + t0 * E, (int)((t1 - t0) * E), MPI_FLOAT, p->rank + 1, TAG_HIDDEN,
                      MPI_COMM_WORLD, &rq);
            p->st.hidden_bytes += (t1 - t0) * E * (int64_t)sizeof(float);
            if (!pp_add_req(&f->q, p->rank + 1, rq))
                return kvl_fail(err, "pipeline: out of memory");
        }
        int done;
        MPI_Test(&f->q.v[f->q.n - 1].r, &done, MPI_STATUS_IGNORE);
    }
    f->acks[0] = (int32_t)p->step;
    MPI_Request rq;
    MPI_Isend(&f->acks[0], 1, MPI_INT32_T, 0, TAG_ACK, MPI_COMM_WORLD, &rq);
    if (!pp_add_req(&f->q, 0, rq)) return kvl_fail(err, "pipeline: out of memory");
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
        if (count < HDR ||
            !kvl_grow((void **)&p->ctrl, &p->ctrl_cap, (size_t)count, sizeof(int32_t), 64))
            return kvl_fail(err, "pipeline: rank %d: bad message from rank 0", p->rank);
        MPI_Recv(p->ctrl, count, MPI_INT32_T, 0, TAG_CTRL, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        const int32_t *c = p->ctrl;
        if (c[0] == OP_PING) continue;
        if (c[0] == OP_STOP) /* what it sent last is received before rank 0 stops */
            return pp_wait_reqs(p, &p->fl[0].q, p->step, err) &&
                   pp_wait_reqs(p, &p->fl[1].q, p->step, err);
        p->step = c[1];
        if (c[0] == OP_POOLS) {
            if (!worker_pools(p, c, count, err)) return false;
        } else if (c[0] == OP_PROBE) {
            if (!worker_probe(p, c, count, err)) return false;
        } else if (c[0] == OP_FORWARD) {
            pp_maybe_fault(p);
            if (!worker_forward(p, c, count, err)) return false;
        } else {
            return kvl_fail(err, "pipeline: rank %d: unknown message %d from rank 0", p->rank,
                            c[0]);
        }
    }
}

#endif
