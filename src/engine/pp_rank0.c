/* pp_rank0: rank 0's side of the pipeline (pp.h, messages in pp_internal.h).
 * The model's forward hooks send each step to every rank and compute rank 0's
 * layers micro-batch by micro-batch; up to PP_MAX_FLIGHT steps are in flight,
 * each waited for (its logits and every rank's ack) in order. While no call
 * is in progress, a thread pings the workers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVLLM_HAVE_MPI

#include "pp_internal.h"

static bool send_ctrl(pp_stage *p, pp_flight *f, int64_t n, kvl_error *err) {
    for (int r = 1; r < p->size; r++) {
        MPI_Request rq;
        if (MPI_Isend(f->ctrl, (int)n, MPI_INT32_T, r, TAG_CTRL, MPI_COMM_WORLD, &rq) !=
                MPI_SUCCESS ||
            !pp_add_req(&f->q, r, rq))
            return pp_fail(p, err, "pipeline: cannot send a step to the other ranks");
        p->st.ctrl_bytes += n * 4;
    }
    p->last_sent = kvl_time_s();
    return true;
}

/* Rank 0: waits for the oldest step in flight (its logits and every rank's ack). */
static bool wait_oldest(pp_stage *p, kvl_error *err) {
    if (p->n_fl == 0) return pp_fail(p, err, "pipeline: no step in flight to wait for");
    pp_flight *f = &p->fl[p->fl_head];
    if (!pp_wait_reqs(p, &f->q, f->step, err)) return false;
    p->fl_head = (p->fl_head + 1) % PP_MAX_FLIGHT;
    p->n_fl--;
    p->st.steps++;
    p->st.tokens += f->n_tokens;
    return true;
}

/* Rank 0: a message outside the steps (pools, stop) in the next slot, sent
 * once every step in flight is done, and waited for. */
static bool send_now(pp_stage *p, pp_flight *f, int64_t n, kvl_error *err) {
    return send_ctrl(p, f, n, err) && pp_wait_reqs(p, &f->q, p->step, err);
}

static pp_flight *next_flight(pp_stage *p) {
    return &p->fl[(p->fl_head + p->n_fl) % PP_MAX_FLIGHT];
}

/* Rank 0: the descriptor of an OP_POOLS or OP_PROBE message in f, room for
 * ints words per group after the header, the header zero but for the op, the
 * step and G. NULL (the pipeline failed) when out of memory. */
static int32_t *start_group_msg(pp_stage *p, pp_flight *f, int32_t op, int G, int ints,
                                kvl_error *err) {
    if (!kvl_grow((void **)&f->ctrl, &f->ctrl_cap, (size_t)(HDR + ints * G), sizeof(int32_t), 64)) {
        pp_fail(p, err, "pipeline: out of memory");
        return NULL;
    }
    int32_t *c = f->ctrl;
    memset(c, 0, HDR * sizeof *c);
    c[0] = op;
    c[1] = (int32_t)p->step;
    c[4] = G;
    return c;
}

/* Rank 0: posts the receive of each worker's answer, n int64 into row r of
 * rows (row_len int64 each), in f's requests. */
static bool post_answers(pp_stage *p, pp_flight *f, int64_t *rows, int row_len, int n, int tag,
                         kvl_error *err) {
    for (int r = 1; r < p->size; r++) {
        MPI_Request rq;
        if (MPI_Irecv(rows + (size_t)r * row_len, n, MPI_INT64_T, r, tag, MPI_COMM_WORLD, &rq) !=
                MPI_SUCCESS ||
            !pp_add_req(&f->q, r, rq))
            return pp_fail(p, err, "pipeline: cannot post a receive");
    }
    return true;
}

static bool sync_pools(pp_stage *p, kv_pool *const *pools, kvl_error *err) {
    const int G = model_kv_n_groups(p->m);
    bool same = p->sent_pools == pools && p->n_sent == G;
    for (int g = 0; same && g < G; g++)
        same = memcmp(&p->sent_cfg[g], kv_pool_cfg(pools[g]), sizeof(kv_pool_config)) == 0;
    if (same) return true;
    if (p->n_fl > 0) /* the steps in flight use the old pools on the other ranks */
        return pp_fail(p, err, "pipeline: new KV pools while steps are in flight");
    pp_flight *f = next_flight(p);
    int32_t *c = start_group_msg(p, f, OP_POOLS, G, POOL_INTS, err);
    if (!c) return false;
    for (int g = 0; g < G; g++) {
        const kv_pool_config *k = kv_pool_cfg(pools[g]);
        int32_t *o = c + HDR + POOL_INTS * g;
        o[0] = k->block_size;
        o[1] = k->dtype;
        o[2] = k->split_v;
        o[3] = k->dtype_v;
        o[4] = (int32_t)k->n_blocks;
        p->sent_cfg[g] = *k;
    }
    p->sent_pools = pools;
    p->n_sent = G;
    for (int g = 0; g < G; g++)
        p->block_bytes[0][g] = (int64_t)kv_pool_geometry(pools[g])->block_bytes;
    /* each worker answers with its block bytes */
    return send_ctrl(p, f, HDR + POOL_INTS * G, err) &&
           post_answers(p, f, p->block_bytes[0], MODEL_MAX_KV_GROUPS, G, TAG_POOLS, err) &&
           pp_wait_reqs(p, &f->q, p->step, err);
}

static bool pack_forward(pp_stage *p, pp_flight *f, const model_batch *b, const uint8_t *want,
                         int n_micro, int64_t *len, kvl_error *err) {
    const int G = model_kv_n_groups(p->m);
    const int64_t n = b->n_tokens;
    int64_t need = HDR + 4 * n + (int64_t)b->n_seqs * G;
    for (int64_t s = 0; s < (int64_t)b->n_seqs * G; s++) need += b->seqs[s]->n_blocks;
    if (need > INT32_MAX / 2 ||
        !kvl_grow((void **)&f->ctrl, &f->ctrl_cap, (size_t)need, sizeof(int32_t), 64))
        return pp_fail(p, err, "pipeline: out of memory");
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

/* Rank 0: sends the step down the pipeline, posts the receives of its logits
 * and acks, and computes its own layers, micro-batch by micro-batch, sending
 * each part on as it is done. Returns without waiting for the answers. */
static bool launch(pp_stage *p, model *m, kv_pool *const *pools, const model_batch *b,
                   float *logits, kvl_error *err) {
    if (p->failed) return kvl_fail(err, "%.500s", p->fail_msg);
    if (b->hidden)
        return kvl_fail(err, "pipeline: hidden states (embeddings) are not available with --pp");
    const model_hparams *hp = model_hp(m);
    const int64_t n = b->n_tokens, E = hp->n_embd, V = hp->n_vocab;
    if (n <= 0) return kvl_fail(err, "pipeline: an empty step");
    if (p->n_fl == PP_MAX_FLIGHT) return pp_fail(p, err, "pipeline: too many steps in flight");
    p->step++;
    pp_maybe_fault(p);
    if (!sync_pools(p, pools, err)) return false;
    pp_flight *f = next_flight(p);
    f->step = p->step;
    f->n_tokens = n;
    if (!kvl_grow((void **)&p->want, &p->want_cap, (size_t)n, 1, 64) ||
        !pp_floats_grow(&f->x_out, n * E))
        return pp_fail(p, err, "pipeline: out of memory");
    if (b->want_logits) memcpy(p->want, b->want_logits, (size_t)n);
    else {
        memset(p->want, 0, (size_t)n);
        p->want[n - 1] = 1;
    }
    const int64_t n_want = pp_count_wanted(p->want, 0, n);
    float *out = logits;
    if (!out) { /* the caller wants none of them, but the last rank sends what is wanted */
        if (!pp_floats_grow(&f->logits, n_want * V))
            return pp_fail(p, err, "pipeline: out of memory");
        out = f->logits.v;
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
        const int64_t t0 = pp_micro_start(n, n_micro, k), t1 = pp_micro_start(n, n_micro, k + 1);
        const int64_t w = pp_count_wanted(p->want, t0, t1);
        MPI_Request rq;
        if (MPI_Irecv(out + row * V, (int)(w * V), MPI_FLOAT, p->size - 1, TAG_LOGITS,
                      MPI_COMM_WORLD, &rq) != MPI_SUCCESS ||
            !pp_add_req(&f->q, p->size - 1, rq))
            return pp_fail(p, err, "pipeline: cannot post a receive");
        row += w;
    }
    for (int r = 1; r < p->size; r++) {
        MPI_Request rq;
        if (MPI_Irecv(&f->acks[r], 1, MPI_INT32_T, r, TAG_ACK, MPI_COMM_WORLD, &rq) !=
                MPI_SUCCESS ||
            !pp_add_req(&f->q, r, rq))
            return pp_fail(p, err, "pipeline: cannot post a receive");
    }
    for (int k = 0; k < n_micro; k++) {
        const int64_t t0 = pp_micro_start(n, n_micro, k), t1 = pp_micro_start(n, n_micro, k + 1);
        model_batch sb = pp_sub_batch(b, p->want, t0, t1);
        if (!model_forward_stage(m, pools, &sb, NULL, f->x_out.v + t0 * E, NULL, err)) {
            /* the others wait for this step: the pipeline cannot go on */
            char msg[sizeof p->fail_msg];
            snprintf(msg, sizeof msg, "pipeline: %s", err->msg);
            return pp_fail(p, err, msg);
        }
        MPI_Request rq;
        if (MPI_Isend(f->x_out.v + t0 * E, (int)((t1 - t0) * E), MPI_FLOAT, 1, TAG_HIDDEN,
                      MPI_COMM_WORLD, &rq) != MPI_SUCCESS ||
            !pp_add_req(&f->q, 1, rq))
            return pp_fail(p, err, "pipeline: cannot send hidden states to rank 1");
        p->st.hidden_bytes += (t1 - t0) * E * (int64_t)sizeof(float);
        int done; /* let the send start while the next part computes */
        MPI_Test(&f->q.v[f->q.n - 1].r, &done, MPI_STATUS_IGNORE);
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
                if (p->ping_q.v[i].r != MPI_REQUEST_NULL)
                    MPI_Test(&p->ping_q.v[i].r, &(int){0}, MPI_STATUS_IGNORE);
            p->ping_q.n = 0;
            p->ping[0] = OP_PING;
            for (int r = 1; r < p->size; r++) {
                MPI_Request rq;
                if (MPI_Isend(p->ping, HDR, MPI_INT32_T, r, TAG_CTRL, MPI_COMM_WORLD, &rq) ==
                    MPI_SUCCESS)
                    pp_add_req(&p->ping_q, r, rq);
            }
            p->last_sent = kvl_time_s();
        }
        pthread_mutex_unlock(&p->lock);
    }
}

bool pp_rank0_open(pp_stage *p, kvl_error *err) {
    p->last_sent = kvl_time_s();
    if (kvl_thread_start(&p->beat, beat_main, p) != 0)
        return kvl_fail(err, "pipeline: cannot start a thread");
    p->beating = true;
    model_set_forward_hook(p->m, forward_hook, p);
    model_set_forward_async(p->m, launch_hook, wait_hook, p);
    return true;
}

void pp_rank0_close(pp_stage *p) {
    model_set_forward_hook(p->m, NULL, NULL);
    model_set_forward_async(p->m, NULL, NULL, NULL);
    if (p->beating) {
        pthread_mutex_lock(&p->lock);
        p->beat_stop = true;
        pthread_mutex_unlock(&p->lock);
        pthread_join(p->beat, NULL);
    }
    kvl_error err = {{0}};
    if (!p->failed) pp_wait_reqs(p, &p->ping_q, p->step, &err);
    while (!p->failed && p->n_fl > 0 && wait_oldest(p, &err)) {}
    pp_flight *f = next_flight(p);
    if (!p->failed && kvl_grow((void **)&f->ctrl, &f->ctrl_cap, HDR, sizeof(int32_t), 64)) {
        memset(f->ctrl, 0, HDR * sizeof *f->ctrl);
        f->ctrl[0] = OP_STOP;
        if (!send_now(p, f, HDR, &err)) fprintf(stderr, "kvllm: %s\n", err.msg);
    }
    if (p->failed && err.msg[0]) fprintf(stderr, "kvllm: %s\n", err.msg);
}

/* OP_PROBE: the settings to every rank, each rank's answer (rank 0's own too). */
static bool probe_ranks(pp_stage *p, const kv_pool_config *groups, int G, pp_rank_mem *out,
                        kvl_error *err) {
    if (G < 1 || G > MODEL_MAX_KV_GROUPS || G != model_kv_n_groups(p->m))
        return kvl_fail(err, "pipeline: %d KV groups to probe, the model has %d", G,
                        model_kv_n_groups(p->m));
    if (p->failed) return kvl_fail(err, "%.500s", p->fail_msg);
    if (p->n_fl > 0) return pp_fail(p, err, "pipeline: a KV probe while steps are in flight");
    pp_flight *f = next_flight(p);
    int32_t *c = start_group_msg(p, f, OP_PROBE, G, PROBE_INTS, err);
    if (!c) return false;
    for (int g = 0; g < G; g++) {
        int32_t *o = c + HDR + PROBE_INTS * g;
        o[0] = groups[g].block_size;
        o[1] = groups[g].dtype;
        o[2] = groups[g].split_v;
        o[3] = groups[g].dtype_v;
    }
    int64_t ans[PP_MAX_RANKS][MODEL_MAX_KV_GROUPS + 2];
    if (!pp_probe_self(p->m, c + HDR, G, ans[0], err)) return false;
    if (!send_ctrl(p, f, HDR + PROBE_INTS * G, err) ||
        !post_answers(p, f, ans[0], MODEL_MAX_KV_GROUPS + 2, G + 2, TAG_PROBE, err) ||
        !pp_wait_reqs(p, &f->q, p->step, err))
        return false;
    for (int r = 0; r < p->size; r++) {
        memset(&out[r], 0, sizeof out[r]);
        for (int g = 0; g < G; g++) {
            if (ans[r][g] < 0) /* the worker could not make the pool */
                return kvl_fail(err, "pipeline: rank %d cannot make a KV pool of these settings",
                                r);
            out[r].group_bytes[g] = ans[r][g];
            out[r].block_bytes += ans[r][g];
        }
        out[r].mem_available = ans[r][G];
        out[r].host = (uint64_t)ans[r][G + 1];
    }
    return true;
}

bool pp_stage_kv_probe(pp_stage *p, const kv_pool_config *groups, int n_groups, pp_rank_mem *out,
                       kvl_error *err) {
    if (p->rank != 0) return kvl_fail(err, "pipeline: only rank 0 probes the ranks");
    pthread_mutex_lock(&p->lock);
    p->in_call = true;
    bool ok = probe_ranks(p, groups, n_groups, out, err);
    p->in_call = false;
    pthread_mutex_unlock(&p->lock);
    return ok;
}

#endif
