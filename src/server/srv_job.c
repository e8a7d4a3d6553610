/* Jobs: one HTTP request's engine requests and the event queue between the
 * engine thread (producer) and the connection thread (consumer). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "srv_internal.h"

srv_job *job_new(srv *s) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = s;
    j->refs = 1;
    j->n = 1;
    j->n_prompts = 1;
    j->per_prompt = 1;
    j->id_slot = -1;
    j->budget_tokens = -1; /* no thinking budget unless a chat request or the server sets one */
    j->state = JOB_QUEUED;
    j->fd = -1;
    atomic_init(&j->cancelled, false);
    for (int i = 0; i < SRV_MAX_N; i++) {
        j->choices[i].job = j;
        j->choices[i].index = i;
        j->choices[i].engine_id = -1;
        j->choices[i].slot = -1;
    }
    /* Timed waits use the monotonic clock so wall-clock jumps do not matter. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&j->mu, NULL);
    return j;
}

void events_free(srv_event *ev) {
    while (ev) {
        srv_event *next = ev->next;
        free(ev);
        ev = next;
    }
}

static void job_free(srv_job *j) {
    events_free(j->head);
    for (int i = 0; i < SRV_MAX_N; i++) free(j->choices[i].gen);
    free(j->prompt);
    for (int k = 1; k < j->n_prompts; k++) free(j->prompts[k]);
    free(j->prompt_text);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->cache_salt);
    free(j->logit_bias);
    free(j->stop_ids);
    free(j->budget_ids);
    free(j->allowed);
    free(j->bad_ids);
    free(j->bad_lens);
    tool_spec_free(&j->tools);
    grammar_free(j->grammar);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void job_release(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left == 0) job_free(j);
}

struct MHD_Connection *job_wake_locked(srv_job *j) {
    pthread_cond_broadcast(&j->cv);
    if (j->pumped) rstreams_kick(j->s);
    if (!j->suspended) return NULL;
    j->suspended = false;
    return j->conn;
}

/* Outside j->mu: libmicrohttpd takes its own lock, and a resumed connection
 * cannot be closed before this call since only the resumer clears suspended. */
void job_resume(struct MHD_Connection *c) {
    if (c) MHD_resume_connection(c);
}

void job_push(srv_job *j, srv_event *ev) {
    ev->next = NULL;
    pthread_mutex_lock(&j->mu);
    if (j->tail) j->tail->next = ev;
    else j->head = ev;
    j->tail = ev;
    if (ev->finish != ENGINE_FINISH_NONE) j->n_finished++;
    struct MHD_Connection *c = job_wake_locked(j);
    pthread_mutex_unlock(&j->mu);
    job_resume(c);
}

bool job_ready_or_suspend(srv_job *j, struct MHD_Connection *c, bool (*pred)(const srv_job *j)) {
    pthread_mutex_lock(&j->mu);
    bool ready = pred(j);
    if (!ready) {
        /* Under j->mu, so a wake cannot fall between the check and the suspend. */
        j->conn = c;
        j->suspended = true;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&j->mu);
    return ready;
}

void job_detach(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->fd = -1;
    j->conn = NULL;
    pthread_mutex_unlock(&j->mu);
}

srv_event *job_take(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    srv_event *ev = j->head;
    j->head = j->tail = NULL;
    pthread_mutex_unlock(&j->mu);
    return ev;
}

void job_cancel(srv_job *j, bool client_left) {
    if (atomic_exchange(&j->cancelled, true)) return;
    srv *s = j->s;
    if (client_left) atomic_fetch_add(&s->n_client_gone, 1);
    pthread_mutex_lock(&s->q_mu);
    s->cancel_pending = true;
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

/* A client that closed its end shows as readable with nothing to read (or as
 * RDHUP/HUP). Data it sent (a pipelined request) does not count as closing. */
bool peer_closed(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

int64_t job_prompt_tokens(const srv_job *j) {
    int64_t n = j->n_prompt;
    for (int k = 1; k < j->n_prompts; k++) n += j->prompt_lens[k];
    return n;
}
