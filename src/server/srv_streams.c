/* server: resumable streams, llama-server's (its web UI reattaches to an
 * answer still being written after a page reload).
 *
 * A streamed answer whose request carries `X-Conversation-Id: ID` is not
 * written to its connection directly: the pump thread formats the job's
 * events into the conversation's session, a byte buffer that outlives the
 * connection, and every reader (the request's own response, and any
 * `GET /v1/stream/ID?from=N`) sends from it. So a client that leaves does not
 * cancel the generation (the job is never polled for its socket): it runs to
 * its end into the buffer, and only `DELETE /v1/stream/ID`, a new request on
 * the same conversation or the server's shutdown cancel it.
 * `POST /v1/streams/lookup {"conversation_ids": [...]}` says which of the
 * named conversations have a session (the exact id, or any "ID::MODEL" the
 * UI makes of it per model), how many bytes it holds and whether it is done.
 *
 * As llama-server's: a session keeps its last 4 MiB (3 to 4: it drops a
 * megabyte at a time; a reader that falls behind what was dropped ends, and a
 * GET from there is a 400), and a finished one is kept 300 s. Beyond llama-server: sessions are the tenant's
 * own (with per-tenant keys another's conversation is unknown), and at most
 * RS_MAX exist; a new one evicts the oldest finished one, and with all of
 * them still running it is refused (503), so buffers stay bounded.
 *
 * Locks: rs->mu guards the sessions, their buffers and waiters; pump_mu the
 * pump's producer list and wake-ups, and is a leaf (job_wake_locked takes it
 * under a job's mu). Readers suspend their connection under rs->mu and are
 * resumed after it is released, as jobs resume theirs (srv_job.c). */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "srv_internal.h"

#define RS_MAX        64
#define RS_MAX_BYTES  (4u << 20)
#define RS_KEEP_BYTES (3u << 20) /* what is left when a session outgrows RS_MAX_BYTES */
#define RS_TTL_S      300
#define RS_ID_MAX     1024

struct rstream {
    rstream *next;     /* in the table (rs->mu) */
    char *tenant, *id; /* the tenant's namespace ("" without keys), the conversation */
    kvl_buf buf;       /* the bytes after the first `dropped` */
    size_t dropped;    /* bytes dropped from the front to stay within RS_MAX_BYTES */
    bool done;         /* no more bytes will come */
    bool listed;       /* in the table */
    time_t started, completed;
    srv_job *job;              /* the producing job while it runs (a reference), for cancelling */
    struct rs_reader *waiters; /* readers suspended until more bytes come */
    int refs;
};

typedef struct rs_reader {
    srv *s;
    rstream *st;
    struct MHD_Connection *conn;
    size_t off;              /* the next byte to send, counted from the session's start */
    struct rs_reader *wnext; /* in st->waiters */
} rs_reader;

typedef struct rs_producer {
    struct rs_producer *next;
    rstream *st;
    void *ctx;
    rstream_produce_fn produce;
    void (*drop)(void *ctx);
} rs_producer;

struct rstreams {
    pthread_mutex_t mu;
    rstream *head;
    int n;
    pthread_mutex_t pump_mu;
    pthread_cond_t pump_cv;
    rs_producer *producers; /* waiting for the pump (pump_mu) */
    bool kick, stop, started;
    pthread_t pump;
};

/* ------------------------------------------------------------ sessions -- */

static void release_locked(rstream *st) {
    if (--st->refs > 0) return;
    kvl_buf_free(&st->buf);
    free(st->tenant);
    free(st->id);
    free(st);
}

void rstream_release(srv *s, rstream *st) {
    if (!st) return;
    pthread_mutex_lock(&s->streams->mu);
    release_locked(st);
    pthread_mutex_unlock(&s->streams->mu);
}

/* Under mu: takes st's waiting readers onto *w, for resume_all after unlocking. */
static void take_waiters(rstream *st, rs_reader **w) {
    while (st->waiters) {
        rs_reader *r = st->waiters;
        st->waiters = r->wnext;
        r->wnext = *w;
        *w = r;
    }
}

/* Outside mu (libmicrohttpd takes its own locks). A suspended connection is
 * neither served nor closed, so its reader lives until resumed here: read its
 * successor first, as the resumed one may be freed at once. */
static void resume_all(rs_reader *w) {
    while (w) {
        rs_reader *next = w->wnext;
        w->wnext = NULL;
        MHD_resume_connection(w->conn);
        w = next;
    }
}

/* Under mu: ends st (readers drain what is there, then end). */
static void finish_locked(rstream *st, rs_reader **w) {
    if (!st->done) {
        st->done = true;
        st->completed = time(NULL);
    }
    take_waiters(st, w);
}

static void unlist_locked(rstreams *rs, rstream *st) {
    for (rstream **p = &rs->head; *p; p = &(*p)->next)
        if (*p == st) {
            *p = st->next;
            st->listed = false;
            rs->n--;
            release_locked(st);
            return;
        }
}

/* Under mu: drops the sessions finished more than RS_TTL_S ago. */
static void expire_locked(rstreams *rs) {
    const time_t cutoff = time(NULL) - RS_TTL_S;
    for (rstream *st = rs->head, *next; st; st = next) {
        next = st->next;
        if (st->done && st->completed <= cutoff) unlist_locked(rs, st);
    }
}

static rstream *find_locked(rstreams *rs, const char *tenant, const char *id) {
    for (rstream *st = rs->head; st; st = st->next)
        if (!strcmp(st->tenant, tenant) && !strcmp(st->id, id)) return st;
    return NULL;
}

/* Under mu: unlists st and cancels its generation; the pump still drains the
 * job's last events (into a session no reader can find). */
static void cancel_locked(rstreams *rs, rstream *st, rs_reader **w) {
    if (st->job) job_cancel(st->job, false);
    finish_locked(st, w);
    unlist_locked(rs, st);
}

bool rstream_id_ok(const char *id, api_error *err) {
    size_t n = strlen(id);
    if (n > RS_ID_MAX)
        return api_fail(err, 400, NULL, "X-Conversation-Id is longer than %d bytes", RS_ID_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return api_fail(err, 400, NULL, "X-Conversation-Id holds a control character");
    return true;
}

/* ---------------------------------------------------------------- pump -- */

void rstreams_kick(srv *s) {
    rstreams *rs = s->streams;
    pthread_mutex_lock(&rs->pump_mu);
    rs->kick = true;
    pthread_cond_signal(&rs->pump_cv);
    pthread_mutex_unlock(&rs->pump_mu);
}

static void append(rstreams *rs, rstream *st, const char *p, size_t n) {
    rs_reader *w = NULL;
    pthread_mutex_lock(&rs->mu);
    if (!st->done && n && st->buf.len + n > RS_MAX_BYTES) {
        /* down to RS_KEEP_BYTES, so the front moves once per megabyte, not
         * with every chunk */
        if (n >= RS_KEEP_BYTES) { /* the chunk's tail alone */
            st->dropped += st->buf.len + (n - RS_KEEP_BYTES);
            st->buf.len = 0;
            p += n - RS_KEEP_BYTES;
            n = RS_KEEP_BYTES;
        } else {
            const size_t drop = st->buf.len + n - RS_KEEP_BYTES;
            memmove(st->buf.p, st->buf.p + drop, st->buf.len - drop);
            st->buf.len -= drop;
            st->dropped += drop;
        }
    }
    if (!st->done && n) {
        kvl_buf_put(&st->buf, p, n);
        if (st->buf.oom) finish_locked(st, &w); /* the readers end short rather than skip bytes */
        else take_waiters(st, &w);
    }
    pthread_mutex_unlock(&rs->mu);
    resume_all(w);
}

/* One producer's turn: whatever its job has ready goes into its session;
 * true once the stream has ended, or last (the server stops: its engine has
 * given every job its final events), when the producer is dropped. */
static bool pump_one(rstreams *rs, rs_producer *p, bool last) {
    kvl_buf out = {0};
    const bool ended = p->produce(p->ctx, &out);
    append(rs, p->st, out.p, out.len);
    kvl_buf_free(&out);
    if (!ended && !last) return false;
    rs_reader *w = NULL;
    pthread_mutex_lock(&rs->mu);
    srv_job *j = p->st->job;
    p->st->job = NULL;
    finish_locked(p->st, &w);
    release_locked(p->st);
    pthread_mutex_unlock(&rs->mu);
    resume_all(w);
    job_release(j);
    p->drop(p->ctx);
    free(p);
    return true;
}

static void *pump_main(void *arg) {
    rstreams *rs = arg;
    pthread_mutex_lock(&rs->pump_mu);
    for (;;) {
        while (!rs->kick && !rs->stop) pthread_cond_wait(&rs->pump_cv, &rs->pump_mu);
        const bool last = rs->stop; /* one more turn, then every producer is dropped */
        rs->kick = false;
        rs_producer *list =
            rs->producers; /* produced without pump_mu (jobs take it under theirs) */
        rs->producers = NULL;
        pthread_mutex_unlock(&rs->pump_mu);
        rs_producer *keep = NULL;
        for (rs_producer *p = list, *next; p; p = next) {
            next = p->next;
            if (!pump_one(rs, p, last)) {
                p->next = keep;
                keep = p;
            }
        }
        pthread_mutex_lock(&rs->pump_mu);
        while (keep) {
            rs_producer *next = keep->next;
            keep->next = rs->producers;
            rs->producers = keep;
            keep = next;
        }
        if (last) break;
    }
    pthread_mutex_unlock(&rs->pump_mu);
    return NULL;
}

rstreams *rstreams_new(void) {
    rstreams *rs = calloc(1, sizeof *rs);
    if (!rs) return NULL;
    pthread_mutex_init(&rs->mu, NULL);
    pthread_mutex_init(&rs->pump_mu, NULL);
    pthread_cond_init(&rs->pump_cv, NULL);
    return rs;
}

bool rstreams_start(srv *s) {
    rstreams *rs = s->streams;
    rs->started = kvl_thread_start(&rs->pump, pump_main, rs) == 0;
    return rs->started;
}

void rstreams_close(srv *s) {
    rstreams *rs = s->streams;
    rs_reader *w = NULL;
    pthread_mutex_lock(&rs->mu);
    for (rstream *st = rs->head; st; st = st->next) finish_locked(st, &w);
    pthread_mutex_unlock(&rs->mu);
    resume_all(w);
}

void rstreams_free(srv *s) {
    rstreams *rs = s->streams;
    if (!rs) return;
    if (rs->started) {
        pthread_mutex_lock(&rs->pump_mu);
        rs->stop = true;
        /* the engine has stopped (every job has its final events): the pump
         * takes what is left and drops every producer */
        rs->kick = true;
        pthread_cond_signal(&rs->pump_cv);
        pthread_mutex_unlock(&rs->pump_mu);
        pthread_join(rs->pump, NULL);
    }
    while (rs->head) unlist_locked(rs, rs->head);
    pthread_mutex_destroy(&rs->mu);
    pthread_mutex_destroy(&rs->pump_mu);
    pthread_cond_destroy(&rs->pump_cv);
    free(rs);
    s->streams = NULL;
}

rstream *rstream_open(srv *s, const char *tenant, const char *id, srv_job *j, void *ctx,
                      rstream_produce_fn produce, void (*drop)(void *ctx), api_error *err) {
    rstreams *rs = s->streams;
    rstream *st = calloc(1, sizeof *st);
    rs_producer *p = calloc(1, sizeof *p);
    if (st) st->tenant = strdup(tenant), st->id = strdup(id);
    if (!st || !p || !st->tenant || !st->id) {
        if (st) free(st->tenant), free(st->id);
        free(st);
        free(p);
        api_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    rs_reader *w = NULL;
    pthread_mutex_lock(&rs->mu);
    expire_locked(rs);
    rstream *old = find_locked(rs, tenant, id);
    if (old) cancel_locked(rs, old, &w); /* one live session a conversation */
    if (rs->n >= RS_MAX) {
        rstream *oldest = NULL;
        for (rstream *x = rs->head; x; x = x->next)
            if (x->done && (!oldest || x->completed < oldest->completed)) oldest = x;
        if (oldest) unlist_locked(rs, oldest);
    }
    if (rs->n >= RS_MAX) {
        pthread_mutex_unlock(&rs->mu);
        resume_all(w);
        free(st->tenant);
        free(st->id);
        free(st);
        free(p);
        api_fail(err, 503, NULL,
                 "%d resumable streams are running: retry later, or without X-Conversation-Id",
                 RS_MAX);
        return NULL;
    }
    st->started = time(NULL);
    st->refs = 3; /* the table, the producer, the caller */
    st->listed = true;
    st->next = rs->head;
    rs->head = st;
    rs->n++;
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    st->job = j;
    pthread_mutex_unlock(&rs->mu);
    resume_all(w);

    p->st = st;
    p->ctx = ctx;
    p->produce = produce;
    p->drop = drop;
    pthread_mutex_lock(&j->mu); /* from now on each event wakes the pump */
    j->pumped = true;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&rs->pump_mu);
    p->next = rs->producers;
    rs->producers = p;
    rs->kick = true; /* events may be queued already */
    pthread_cond_signal(&rs->pump_cv);
    pthread_mutex_unlock(&rs->pump_mu);
    return st;
}

/* ------------------------------------------------------------- readers -- */

struct MHD_Response *srv_sse_response(MHD_ContentReaderCallback read, void *cls,
                                      MHD_ContentReaderFreeCallback drop) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read, cls, drop);
    if (!r) {
        drop(cls);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no"); /* nginx: no buffering */
    return r;
}

static ssize_t reader_read(void *cls, uint64_t pos, char *buf, size_t max) {
    rs_reader *r = cls;
    rstreams *rs = r->s->streams;
    rstream *st = r->st;
    (void)pos;
    pthread_mutex_lock(&rs->mu);
    ssize_t ret;
    if (r->off < st->dropped) {
        ret = MHD_CONTENT_READER_END_WITH_ERROR; /* fell behind what was dropped */
    } else if (r->off < st->dropped + st->buf.len) {
        size_t n = st->dropped + st->buf.len - r->off;
        if (n > max) n = max;
        memcpy(buf, st->buf.p + (r->off - st->dropped), n);
        r->off += n;
        ret = (ssize_t)n;
    } else if (st->done) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        r->wnext = st->waiters;
        st->waiters = r;
        MHD_suspend_connection(r->conn); /* under mu: an append cannot slip in between */
        ret = 0;
    }
    pthread_mutex_unlock(&rs->mu);
    return ret;
}

static void reader_free(void *cls) {
    rs_reader *r = cls;
    rstreams *rs = r->s->streams;
    pthread_mutex_lock(&rs->mu);
    for (rs_reader **q = &r->st->waiters; *q; q = &(*q)->wnext) /* not expected: see resume_all */
        if (*q == r) {
            *q = r->wnext;
            break;
        }
    release_locked(r->st);
    pthread_mutex_unlock(&rs->mu);
    free(r);
}

struct MHD_Response *rstream_response(srv *s, rstream *st, struct MHD_Connection *c, size_t from) {
    rs_reader *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->s = s;
    r->st = st;
    r->conn = c;
    r->off = from;
    pthread_mutex_lock(&s->streams->mu);
    st->refs++;
    pthread_mutex_unlock(&s->streams->mu);
    return srv_sse_response(reader_read, r, reader_free);
}

/* ----------------------------------------------------------- endpoints -- */

rstream *rstream_get(srv *s, const char *tenant, const char *id, const char *from, size_t *off,
                     api_error *err) {
    *off = 0;
    if (from && *from) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(from, &end, 10);
        if (*end || errno || from[0] == '-' || from[0] == '+' || from[0] == ' ') {
            api_fail(err, 400, "from", "Invalid 'from' offset: '%.40s' (a byte count)", from);
            return NULL;
        }
        *off = (size_t)v;
    }
    rstreams *rs = s->streams;
    pthread_mutex_lock(&rs->mu);
    expire_locked(rs);
    rstream *st = find_locked(rs, tenant, id);
    if (st && *off < st->dropped) {
        api_fail(err, 400, "from",
                 "Stream offset lost, please restart: bytes before %zu were dropped (the session "
                 "keeps the last %u)",
                 st->dropped, RS_MAX_BYTES);
        st = NULL;
    } else if (!st) {
        api_fail(err, 404, NULL,
                 "Stream not found or expired: no session for conversation '%.200s'", id);
        err->type = "not_found_error";
    } else {
        st->refs++;
    }
    pthread_mutex_unlock(&rs->mu);
    return st;
}

void rstream_delete(srv *s, const char *tenant, const char *id) {
    rstreams *rs = s->streams;
    rs_reader *w = NULL;
    pthread_mutex_lock(&rs->mu);
    expire_locked(rs);
    rstream *st = find_locked(rs, tenant, id);
    if (st) cancel_locked(rs, st, &w);
    pthread_mutex_unlock(&rs->mu);
    resume_all(w);
    kvl_log(KVL_LOG_INFO, "stream of conversation '%.200s' %s", id, st ? "cancelled" : "unknown");
}

char *rstreams_lookup(srv *s, const char *tenant, const char *body, size_t len, api_error *err) {
    cJSON *b = json_parse_body(body, len, err);
    if (!b) return NULL;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(b, "conversation_ids");
    if (!cJSON_IsObject(b) || (ids && !cJSON_IsArray(ids) && !cJSON_IsNull(ids))) {
        cJSON_Delete(b);
        api_fail(err, 400, "conversation_ids",
                 "the body is {\"conversation_ids\": [ID, ...]}: the conversations to look up");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    rstreams *rs = s->streams;
    pthread_mutex_lock(&rs->mu);
    expire_locked(rs);
    const cJSON *list = cJSON_IsArray(ids) ? ids : NULL, *id;
    cJSON_ArrayForEach(id, list) {
        const char *rid = cJSON_GetStringValue(id);
        if (!rid || !rid[0]) continue;
        const size_t n = strlen(rid);
        for (rstream *st = rs->head; st; st = st->next) {
            if (strcmp(st->tenant, tenant) != 0) continue;
            if (strcmp(st->id, rid) != 0 && strncmp(st->id, rid, n) != 0) continue;
            if (strcmp(st->id, rid) != 0 && strncmp(st->id + n, "::", 2) != 0) continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "conversation_id", st->id);
            cJSON_AddBoolToObject(o, "is_done", st->done);
            cJSON_AddNumberToObject(o, "total_bytes", (double)(st->dropped + st->buf.len));
            cJSON_AddNumberToObject(o, "started_at", (double)st->started);
            cJSON_AddNumberToObject(o, "completed_at", st->done ? (double)st->completed : 0);
            cJSON_AddItemToArray(out, o);
        }
    }
    pthread_mutex_unlock(&rs->mu);
    cJSON_Delete(b);
    char *js = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    if (!js) api_fail(err, 500, NULL, "out of memory");
    return js;
}
