/* The engine thread: the only thread that touches the engine. Before each step
 * it drains the submission queue (engine_submit) and the cancellations
 * (engine_cancel); it sleeps on q_cv when there is nothing to do. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

bool srv_enqueue(srv *s, srv_job *j, api_error *err) {
    pthread_mutex_lock(&s->q_mu);
    int64_t limit = (int64_t)s->max_seqs + s->cfg.max_queue;
    bool stopping = s->stopping || atomic_load(&s->draining);
    bool ok = !stopping && s->n_inflight + j->n <= limit;
    if (ok) {
        s->n_inflight += j->n;
        j->refs++; /* the engine thread's reference; no other thread has j yet */
        j->next = NULL;
        if (s->q_tail) s->q_tail->next = j;
        else s->q_head = j;
        s->q_tail = j;
        pthread_cond_signal(&s->q_cv);
    }
    pthread_mutex_unlock(&s->q_mu);
    if (!ok) {
        api_fail(err, 503, NULL,
                 stopping
                     ? "the server is shutting down"
                     : "the server is overloaded (%lld requests queued or running); retry later",
                 (long long)limit);
        err->code = "server_overloaded";
    }
    return ok;
}

bool srv_engine_call(srv *s, srv_engine_task *t, api_error *err) {
    t->done = false;
    pthread_mutex_lock(&s->q_mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->q_mu);
        return api_fail(err, 503, NULL, "the server is shutting down");
    }
    t->next = s->task_head;
    s->task_head = t;
    pthread_cond_signal(&s->q_cv);
    /* No early exit: the engine thread writes into the task until done, and
     * it runs every queued task even while stopping. */
    while (!t->done) pthread_cond_wait(&s->task_cv, &s->q_mu);
    pthread_mutex_unlock(&s->q_mu);
    if (!t->ok) *err = t->err;
    return t->ok;
}

/* Engine thread, between steps. */
static void run_tasks(srv *s, srv_engine_task *list) {
    while (list) {
        srv_engine_task *t = list;
        list = t->next;
        t->defer = false;
        bool ok = t->run(s, t, &t->err);
        pthread_mutex_lock(&s->q_mu);
        if (t->defer && !s->stopping) { /* again after the next step */
            t->next = s->task_head;
            s->task_head = t;
            pthread_mutex_unlock(&s->q_mu);
            continue;
        }
        if (t->defer) ok = api_fail(&t->err, 503, NULL, "the server is shutting down");
        t->ok = ok;
        t->done = true;
        pthread_cond_broadcast(&s->task_cv);
        pthread_mutex_unlock(&s->q_mu);
    }
}

/* Frees the job's place in the queue limit. Done before the HTTP thread can
 * see the job's end, so a client sending its next request right after the
 * answer is never refused for room its previous request still seemed to hold. */
static void release_inflight(srv *s, srv_job *j) {
    if (j->released) return;
    j->released = true;
    pthread_mutex_lock(&s->q_mu);
    s->n_inflight -= j->n;
    pthread_mutex_unlock(&s->q_mu);
}

/* ---------------------------------------------------------- callbacks -- */

static void observe_token(srv *s, srv_choice *c, const engine_event *ev, double now) {
    srv_metrics *m = &s->metrics;
    bool produced = ev->token >= 0 || (ev->stats && ev->stats->n_generated > 0);
    pthread_mutex_lock(&m->mu);
    if (produced && c->t_first == 0) {
        c->t_first = now;
        histo_observe(&m->ttft, now - c->job->t_arrival);
    } else if (produced && ev->token >= 0) {
        histo_observe(&m->itl, now - c->t_last);
    }
    if (produced) c->t_last = now;
    if (ev->finish == ENGINE_FINISH_STOP || ev->finish == ENGINE_FINISH_LENGTH) {
        histo_observe(&m->e2e, now - c->job->t_arrival);
        int64_t n = ev->stats->n_generated;
        if (n > 1) histo_observe(&m->tpot, (now - c->t_first) / (double)(n - 1));
        const engine_req_stats *st = ev->stats;
        if (st->t_scheduled > 0) {
            histo_observe(&m->queue, st->t_scheduled - st->t_submit);
            histo_observe(&m->prefill, st->t_first_token - st->t_scheduled);
            histo_observe(&m->decode, st->t_end - st->t_first_token);
            const uint64_t computed = (uint64_t)(st->n_prompt - st->n_cached_prompt);
            const double tp = st->t_first_token - st->t_scheduled,
                         tg = st->t_end - st->t_first_token;
            m->llama_prompt_tokens += computed;
            m->bucket_prompt_tokens += computed;
            m->llama_prompt_s += tp;
            m->bucket_prompt_s += tp;
            m->llama_gen_tokens += (uint64_t)st->n_generated;
            m->bucket_gen_tokens += (uint64_t)st->n_generated;
            m->llama_gen_s += tg;
            m->bucket_gen_s += tg;
        }
        m->success[ev->finish == ENGINE_FINISH_STOP ? 0 : 1]++;
    } else if (ev->finish == ENGINE_FINISH_CANCELLED) {
        m->success[2]++;
    }
    pthread_mutex_unlock(&m->mu);
}

/* Runs on the engine thread inside engine_step: copies what the event points
 * to (text, logprobs, stats) since those buffers belong to the engine. */
static void on_engine_event(const engine_event *ev, void *user) {
    srv_choice *c = user;
    srv_job *j = c->job;
    observe_token(j->s, c, ev, kvl_time_s());
    if (ev->finish == ENGINE_FINISH_ERROR) { /* a client-side cause (its grammar): a 400 */
        pthread_mutex_lock(&j->mu);
        if (!j->failed) {
            j->failed = true;
            api_fail(&j->fail, 400, NULL, "%s", ev->error ? ev->error : "generation failed");
        }
        pthread_mutex_unlock(&j->mu);
    }
    /* admitted while every slot was taken: the first idle one once it runs */
    if (c->slot < 0 && ev->finish == ENGINE_FINISH_NONE)
        c->slot = slot_take(j->s, c->engine_id, c->index == 0 ? j->id_slot : -1);
    const int slot = c->slot; /* before slot_finish lets it go */
    if (ev->token >= 0 &&
        kvl_grow((void **)&c->gen, &c->cap_gen, (size_t)c->n_gen + 1, sizeof *c->gen, 64))
        c->gen[c->n_gen++] = ev->token;
    if (ev->finish != ENGINE_FINISH_NONE) {
        c->done = true;
        slot_finish(j->s, c);
        if (--j->n_live == 0) release_inflight(j->s, j);
    }
    srv_event *e = malloc(sizeof *e + ev->text_len + 1);
    if (!e) {
        /* Out of memory: the request is reported as failed (500), but the end
         * still has to be counted, since the HTTP thread waits for it. */
        pthread_mutex_lock(&j->mu);
        j->failed = true;
        if (ev->finish != ENGINE_FINISH_NONE) j->n_finished++;
        struct MHD_Connection *conn = job_wake_locked(j);
        pthread_mutex_unlock(&j->mu);
        job_resume(conn);
        return;
    }
    memset(e, 0, sizeof *e);
    e->index = c->index;
    e->slot = slot;
    e->token = ev->token;
    e->logprob = ev->logprob;
    e->n_top = ev->n_top < SRV_MAX_TOP ? ev->n_top : SRV_MAX_TOP;
    if (e->n_top > 0) {
        memcpy(e->top_ids, ev->top_ids, e->n_top * sizeof(int32_t));
        memcpy(e->top_lps, ev->top_logprobs, e->n_top * sizeof(float));
    }
    e->finish = ev->finish;
    e->stats = *(ev->stats ? ev->stats : ev->live);
    e->progress = ev->progress;
    e->n_past = ev->n_past;
    e->text_len = ev->text_len;
    if (ev->text_len) memcpy(e->text, ev->text, ev->text_len);
    e->text[ev->text_len] = 0;
    job_push(j, e);
}

/* ---------------------------------------------------------- admission -- */

static void reject(srv_job *j, const api_error *err) {
    if (j->n_live == 0) release_inflight(j->s, j);
    pthread_mutex_lock(&j->mu);
    j->state = JOB_REJECTED;
    j->reject = *err;
    struct MHD_Connection *c = job_wake_locked(j);
    pthread_mutex_unlock(&j->mu);
    job_resume(c);
}

static void set_state(srv_job *j, job_state st) {
    pthread_mutex_lock(&j->mu);
    j->state = st;
    struct MHD_Connection *c = job_wake_locked(j);
    pthread_mutex_unlock(&j->mu);
    job_resume(c);
}

/* Submits the job's n engine requests. A rejection of the first one (the
 * engine's own checks) fails the whole job with 400. */
static void admit(srv *s, srv_job *j) {
    engine_request r = {
        .prompt = j->prompt,
        .n_prompt = j->n_prompt,
        .max_tokens = j->max_tokens,
        .sampling = j->sampling,
        .stop = (const char *const *)j->stop,
        .n_stop = j->n_stop,
        .top_logprobs = j->top_logprobs,
        .logprobs = j->logprobs,
        .ignore_eos = j->ignore_eos,
        .cache_salt = j->cache_salt,
        .logit_bias = j->logit_bias,
        .n_logit_bias = j->n_logit_bias,
        .penalize_prompt = j->penalize_prompt,
        .post_sampling_probs = j->post_sampling_probs,
        .n_indent = j->n_indent,
        .max_predict_s = j->max_predict_s,
        .lora = j->n_lora ? j->lora : NULL,
        .grammar = j->grammar,
        .no_speculative = j->no_speculative,
        .progress = j->return_progress,
        .budget = j->budget_ids != NULL,
        .budget_tokens = j->budget_tokens >= 0 ? j->budget_tokens : INT32_MAX, /* control alone */
        .budget_start = j->budget_ids,
        .n_budget_start = j->n_budget_start,
        .budget_end = j->budget_ids ? j->budget_ids + j->n_budget_start : NULL,
        .n_budget_end = j->n_budget_end,
        .budget_forced = j->budget_ids ? j->budget_ids + j->n_budget_start + j->n_budget_end : NULL,
        .n_budget_forced = j->n_budget_forced,
        .budget_inside = j->budget_inside,
        .priority = j->priority,
        .n_keep_special = j->n_keep_special,
        .stop_ids = j->stop_ids,
        .n_stop_ids = j->n_stop_ids,
        .min_tokens = j->min_tokens,
        .include_stop = j->include_stop,
        .allowed = j->allowed,
        .n_allowed = j->n_allowed,
        .keep_all_special = j->keep_all_special,
        .eog_text = j->eog_text,
        .bad_ids = j->bad_ids,
        .bad_lens = j->bad_lens,
        .n_bad = j->n_bad,
        .on_event = on_engine_event};
    memcpy(r.keep_special, j->keep_special, sizeof r.keep_special);
    for (int i = 0; i < j->n; i++) {
        r.user = &j->choices[i];
        if (j->vary_seed) r.sampling.seed = j->sampling.seed + (uint64_t)i;
        /* several prompts: choices prompt-major; the first choice of each prompt leads */
        r.prompt = job_prompt(j, i / j->per_prompt, &r.n_prompt);
        if (i % j->per_prompt == 0) r.prefix_leader = 0;
        kvl_error err = {{0}};
        int64_t id = engine_submit(s->e, &r, &err);
        if (id < 0) {
            api_error ae;
            api_fail(&ae, 400, "prompt", "%s", err.msg);
            reject(j, &ae);
            for (int k = 0; k < i; k++) engine_cancel(s->e, j->choices[k].engine_id);
            j->cancel_sent = true;
            return;
        }
        j->choices[i].engine_id = id;
        j->choices[i].slot = slot_take(s, id, i == 0 ? j->id_slot : -1);
        j->n_live++;
        /* the prompt's other choices reuse its first choice's prompt blocks */
        r.prefix_leader = j->choices[i - i % j->per_prompt].engine_id;
    }
    set_state(j, JOB_RUNNING);
}

static void admit_all(srv *s, srv_job *incoming, bool stopping) {
    while (incoming) {
        srv_job *j = incoming;
        incoming = j->next;
        j->next = s->active;
        s->active = j;
        api_error err;
        if (stopping) {
            api_fail(&err, 503, NULL, "the server is shutting down");
            reject(j, &err);
        } else if (atomic_load(&j->cancelled)) {
            api_fail(&err, 499, NULL, "the client closed the connection");
            reject(j, &err);
        } else {
            admit(s, j);
        }
    }
}

/* Marks the jobs whose client hung up, so cancel_marked cancels them before
 * this step: a waiting connection is suspended in libmicrohttpd, which then
 * does not notice a hang-up itself, and a busy job's tokens would otherwise
 * keep its HTTP side too busy to look. One poll per connection, under the
 * job's lock so the descriptor cannot be closed meanwhile. */
static void watch_clients(srv *s) {
    for (srv_job *j = s->active; j; j = j->next) {
        if (j->cancel_sent || atomic_load(&j->cancelled)) continue;
        pthread_mutex_lock(&j->mu);
        bool gone = j->fd >= 0 && j->n_finished < j->n && peer_closed(j->fd);
        pthread_mutex_unlock(&j->mu);
        /* counted once, whichever side sees the hang-up first (job_cancel) */
        if (gone && !atomic_exchange(&j->cancelled, true)) {
            atomic_fetch_add(&s->n_client_gone, 1);
            kvl_log(KVL_LOG_INFO, "client left: cancelling its request");
        }
    }
}

/* Cancels the jobs whose client left (all of them when stopping), and the
 * other choices of a job one of whose choices failed (n > 1: its grammar went
 * over the matcher's bounds, grammar.h): the answer is that error whatever the
 * siblings produce (a 400; streaming: an error event), so they end as "abort"
 * at the start of the next step instead of running to their end for nobody,
 * as llama-server cancels a multi-task request's other tasks on an error.
 * j->failed is only written on this thread. */
static void cancel_marked(srv *s, bool all) {
    for (srv_job *j = s->active; j; j = j->next) {
        if (j->cancel_sent || !(all || atomic_load(&j->cancelled) || j->failed)) continue;
        for (int i = 0; i < j->n; i++)
            if (j->choices[i].engine_id >= 0 && !j->choices[i].done)
                engine_cancel(s->e, j->choices[i].engine_id);
        j->cancel_sent = true;
    }
}

/* Drops the engine thread's reference to jobs that will get no more events. */
static void reap(srv *s) {
    for (srv_job **pp = &s->active; *pp;) {
        srv_job *j = *pp;
        if (j->n_live > 0) {
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        release_inflight(s, j);
        job_release(j);
    }
}

static void publish_metrics(srv *s) {
    engine_metrics em = engine_get_metrics(s->e);
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.em = em;
    pthread_mutex_unlock(&s->metrics.mu);
}

/* An engine failure cancels everything running; HTTP threads report 500. */
static void step(srv *s) {
    kvl_error err = {{0}};
    if (engine_step(s->e, &err)) return;
    kvl_log(KVL_LOG_ERROR, "engine step failed: %s (cancelling %s)", err.msg, "all requests");
    for (srv_job *j = s->active; j; j = j->next) {
        pthread_mutex_lock(&j->mu);
        j->failed = true;
        pthread_mutex_unlock(&j->mu);
        j->cancel_sent = false;
    }
    cancel_marked(s, true);
}

static void *engine_main(void *arg) {
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        while (!s->stopping && !s->q_head && !s->task_head && !s->cancel_pending) {
            if (!engine_has_work(s->e)) {
                pthread_cond_wait(&s->q_cv, &s->q_mu);
                continue;
            }
            if (!engine_waiting_on_disk(s->e)) break;
            /* Only disk reads are in flight: sleep until one ends (the reader
             * signals), but look at the clients every 50 ms, so one that left
             * has its request and its reserved blocks given up mid-read. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 50 * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            if (pthread_cond_timedwait(&s->q_cv, &s->q_mu, &until) != 0) break;
        }
        srv_job *incoming = s->q_head;
        s->q_head = s->q_tail = NULL;
        srv_engine_task *tasks = s->task_head;
        s->task_head = NULL;
        s->cancel_pending = false;
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->q_mu);

        run_tasks(s, tasks);
        admit_all(s, incoming, stopping);
        watch_clients(s);
        cancel_marked(s, stopping);
        if (engine_has_work(s->e)) step(s);
        reap(s);
        publish_metrics(s);
        if (stopping && !s->active && !engine_has_work(s->e)) break;
    }
    return NULL;
}

/* The disk tier's reader thread: a prefix read finished (engine_waiting_on_disk
 * is read under q_mu, so the signal cannot fall between its check and the wait). */
static void disk_read_done(void *user) {
    srv *s = user;
    pthread_mutex_lock(&s->q_mu);
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

bool engine_thread_start(srv *s) {
    publish_metrics(s);
    engine_set_disk_wake(s->e, disk_read_done, s);
    if (pthread_create(&s->engine_thread, NULL, engine_main, s) == 0) return true;
    engine_set_disk_wake(s->e, NULL, NULL);
    return false;
}

/* Cancels whatever runs, lets the engine send the final events, then joins. */
void engine_thread_stop(srv *s) {
    pthread_mutex_lock(&s->q_mu);
    s->stopping = true;
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    pthread_join(s->engine_thread, NULL);
    engine_set_disk_wake(s->e, NULL, NULL); /* the tier outlives the server */
}
