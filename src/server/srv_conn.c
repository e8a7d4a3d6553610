/* Connections: the listening socket, admission limits and the request deadline.
 *
 * kvllm accepts connections itself and hands them to libmicrohttpd
 * (MHD_add_connection), so that a connection over a limit gets a clean
 * "503 + Retry-After" instead of the reset libmicrohttpd gives at its own
 * limits. Limits: --max-connections open connections in all, and
 * --max-connections-per-ip from one client address. A connection must deliver
 * a whole request (headers and body) within --request-timeout seconds of
 * being accepted or of its previous response; past that the acceptor shuts the
 * socket down, so clients that trickle bytes (slowloris) hold a slot for a
 * bounded time. Waiting for generation is not covered: the deadline applies
 * only while a request is being received.
 *
 * A flood from many addresses can still fill --max-connections with clients
 * that are all "receiving" forever slowly. So when every slot is taken, a new
 * connection evicts the one that has been receiving longest (an idle
 * keep-alive or a trickling client), provided it has been at it for
 * EVICT_MIN_AGE_S: a well-behaved request is received in milliseconds and is
 * never the oldest, while a slowloris slot is freed for /health and honest
 * clients. Only when no connection qualifies (all are waiting for generation,
 * or all are younger) is the newcomer answered 503. */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "srv_internal.h"

/* One accepted connection. Created by the acceptor, attached to MHD's socket
 * context when MHD reports the connection started, freed when MHD reports it
 * closed (which libmicrohttpd does before it closes the socket, so fd is never
 * a reused descriptor while the record is listed). Fields under conns_mu. */
struct conn_rec {
    struct conn_rec *prev, *next;
    int fd;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    double deadline; /* receiving a request must end by then */
    double since;    /* receiving started then (accept, or the previous response) */
    bool receiving;  /* between requests or inside one: the deadline applies */
    bool started;    /* MHD reported the connection */
    bool cut;        /* shut down for missing the deadline */
};

/* Sockets answered with the canned 503, kept briefly so the reply is read
 * before the close (closing with unread input sends a reset, which can make
 * the client drop the reply). */
#define LINGER_MAX 512
#define LINGER_S   1.0

/* Unlinks and frees a connection record (conns_mu held). */
static void conn_drop(srv *s, conn_rec *r) {
    if (r->prev) r->prev->next = r->next;
    else s->conns = r->next;
    if (r->next) r->next->prev = r->prev;
    s->n_conns--;
    free(r);
}

/* Eviction when full: how long a connection must have been receiving to be
 * evicted, and how many evicted connections may still be closing (libmicrohttpd
 * closes them on its next event; until then they hold descriptors). */
#define EVICT_MIN_AGE_S 1.0
#define EVICT_SLACK     64

static bool same_client(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return true; /* unix sockets: one client */
}

/* ------------------------------------------------------------ listen -- */

bool conns_listen(srv *s) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        fprintf(stderr, "kvllm serve: cannot resolve host '%s': %s\n", s->cfg.host,
                gai_strerror(rc));
        return false;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    0); /* the acceptor drains bursts */
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
        fprintf(stderr, "kvllm serve: cannot listen on %s:%d: %s\n", s->cfg.host, s->cfg.port,
                strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return false;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    s->bound_port = s->cfg.port;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        if (sa.ss_family == AF_INET) s->bound_port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        else if (sa.ss_family == AF_INET6)
            s->bound_port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    }
    s->listen_fd = fd;
    return true;
}

/* ---------------------------------------------------- MHD's callbacks -- */

void conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                  enum MHD_ConnectionNotificationCode code) {
    srv *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        int fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&s->conns_mu);
        for (conn_rec *r = s->conns; r; r = r->next)
            if (!r->started && r->fd == fd) {
                r->started = true;
                *socket_context = r;
                break;
            }
        pthread_mutex_unlock(&s->conns_mu);
        return;
    }
    conn_rec *r = *socket_context;
    if (!r) return;
    pthread_mutex_lock(&s->conns_mu);
    conn_drop(s, r);
    pthread_mutex_unlock(&s->conns_mu);
    *socket_context = NULL;
}

static conn_rec *rec_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void conns_request_received(srv *s, struct MHD_Connection *c) {
    conn_rec *r = rec_of(c);
    if (!r) return;
    pthread_mutex_lock(&s->conns_mu);
    r->receiving = false;
    pthread_mutex_unlock(&s->conns_mu);
}

void conns_response_done(srv *s, struct MHD_Connection *c) {
    conn_rec *r = rec_of(c);
    if (!r) return;
    pthread_mutex_lock(&s->conns_mu);
    r->receiving = true;
    r->since = kvl_time_s();
    r->deadline = r->since + s->cfg.request_timeout_s;
    pthread_mutex_unlock(&s->conns_mu);
}

/* ---------------------------------------------------------- acceptor -- */

typedef struct lingering {
    int fd;
    double until;
} lingering;

static void drain(int fd) {
    char buf[4096];
    for (int i = 0; i < 16; i++)
        if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0) break;
}

/* Answers a connection that is over a limit (or arrives while draining)
 * without handing it to libmicrohttpd. */
static void refuse(int fd, const char *why, lingering *lg, int *n_lg) {
    char body[256], msg[512];
    int bl = snprintf(
        body, sizeof body,
        "{\"error\":{\"message\":\"%s; retry later\",\"type\":\"server_overloaded\",\"param\":null,"
        "\"code\":\"server_overloaded\"}}",
        why);
    int ml = snprintf(
        msg, sizeof msg,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        "Connection: close\r\nContent-Length: %d\r\n\r\n%s",
        bl, body);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    drain(fd);
    (void)!send(fd, msg, (size_t)ml, MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(fd, SHUT_WR);
    if (*n_lg < LINGER_MAX) lg[(*n_lg)++] = (lingering){fd, kvl_time_s() + LINGER_S};
    else close(fd);
}

static void linger_sweep(lingering *lg, int *n_lg, double now, bool all) {
    int k = 0;
    for (int i = 0; i < *n_lg; i++) {
        char buf[4096];
        ssize_t r = recv(lg[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        bool open = r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
        if (!all && open && now < lg[i].until) lg[k++] = lg[i];
        else close(lg[i].fd);
    }
    *n_lg = k;
}

/* Shuts down connections past their deadline; libmicrohttpd then sees the end
 * of the stream and closes them. Also forgets records MHD never reported
 * (MHD_add_connection can drop a connection without a notice). */
static void deadline_sweep(srv *s, double now) {
    pthread_mutex_lock(&s->conns_mu);
    for (conn_rec *r = s->conns, *next; r; r = next) {
        next = r->next;
        if (!r->started && now > r->deadline) {
            conn_drop(s, r);
            continue;
        }
        if (r->started && r->receiving && !r->cut && now > r->deadline) {
            r->cut = true;
            shutdown(r->fd, SHUT_RDWR);
            atomic_fetch_add(&s->n_timed_out, 1);
        }
    }
    pthread_mutex_unlock(&s->conns_mu);
}

/* Frees a slot when every one is taken: cuts the connection that has been
 * receiving longest, if it has been at it for EVICT_MIN_AGE_S. Connections cut
 * earlier but not yet closed by libmicrohttpd count as free, up to
 * EVICT_SLACK of them. Called under conns_mu. */
static bool evict_oldest_receiving(srv *s, double now) {
    int n_cut = 0;
    conn_rec *oldest = NULL;
    for (conn_rec *r = s->conns; r; r = r->next) {
        if (r->cut) {
            n_cut++;
            continue;
        }
        if (r->started && r->receiving && now - r->since >= EVICT_MIN_AGE_S &&
            (!oldest || r->since < oldest->since))
            oldest = r;
    }
    if (s->n_conns - n_cut < s->cfg.max_connections &&
        s->n_conns < s->cfg.max_connections + EVICT_SLACK)
        return true; /* slots held only by connections already on their way out */
    if (!oldest || n_cut >= EVICT_SLACK) return false;
    oldest->cut = true;
    shutdown(oldest->fd, SHUT_RDWR);
    atomic_fetch_add(&s->n_evicted, 1);
    return true;
}

/* Counts the connection in, or says which limit refuses it. */
static const char *admit_conn(srv *s, int fd, const struct sockaddr_storage *sa, socklen_t len) {
    if (atomic_load(&s->draining)) return "the server is shutting down";
    pthread_mutex_lock(&s->conns_mu);
    const char *why = NULL;
    double now = kvl_time_s();
    if (s->cfg.max_connections_per_ip > 0) {
        int same = 0;
        for (conn_rec *r = s->conns; r; r = r->next) same += !r->cut && same_client(&r->addr, sa);
        if (same >= s->cfg.max_connections_per_ip)
            why = "too many open connections from this address";
    }
    if (!why && s->n_conns >= s->cfg.max_connections && !evict_oldest_receiving(s, now))
        why = "too many open connections";
    conn_rec *r = why ? NULL : calloc(1, sizeof *r);
    if (!why && !r) why = "out of memory";
    if (r) {
        r->fd = fd;
        r->addr = *sa;
        r->addr_len = len;
        r->receiving = true;
        r->since = now;
        r->deadline = now + s->cfg.request_timeout_s;
        r->next = s->conns;
        if (s->conns) s->conns->prev = r;
        s->conns = r;
        s->n_conns++;
    }
    pthread_mutex_unlock(&s->conns_mu);
    return why;
}

static void forget_fd(srv *s, int fd) {
    pthread_mutex_lock(&s->conns_mu);
    for (conn_rec *r = s->conns; r; r = r->next)
        if (!r->started && r->fd == fd) {
            conn_drop(s, r);
            break;
        }
    pthread_mutex_unlock(&s->conns_mu);
}

static void *acceptor_main(void *arg) {
    srv *s = arg;
    lingering *lg = calloc(LINGER_MAX, sizeof *lg);
    int n_lg = 0;
    while (!atomic_load(&s->acceptor_stop)) {
        struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN},
                              {.fd = s->wake_pipe[0], .events = POLLIN}};
        /* Sweeps at least every 100 ms; deadlines are whole seconds. */
        int n = poll(p, 2, 100);
        double now = kvl_time_s();
        deadline_sweep(s, now);
        if (lg) linger_sweep(lg, &n_lg, now, false);
        if (n <= 0 || !(p[0].revents & POLLIN)) continue;
        for (int k = 0; k < 64; k++) { /* a burst, then the sweeps again */
            struct sockaddr_storage sa;
            socklen_t len = sizeof sa;
            int fd =
                accept4(s->listen_fd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd < 0) {
                if (errno == EMFILE || errno == ENFILE) {
                    kvl_log(KVL_LOG_WARN, "accept: %s (raise the open-files limit)",
                            strerror(errno));
                    usleep(10 * 1000);
                }
                break;
            }
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            const char *why = admit_conn(s, fd, &sa, len);
            if (why) {
                atomic_fetch_add(&s->n_refused, 1);
                /* over TLS a plain-text 503 would be garbage to the client: closed */
                if (lg && !s->tls_key) refuse(fd, why, lg, &n_lg);
                else close(fd);
                continue;
            }
            /* MHD owns (and on failure closes) the socket from here on. */
            if (MHD_add_connection(s->daemon, fd, (struct sockaddr *)&sa, len) != MHD_YES)
                forget_fd(s, fd);
        }
    }
    if (lg) linger_sweep(lg, &n_lg, kvl_time_s(), true);
    free(lg);
    return NULL;
}

bool conns_start(srv *s) {
    if (pipe2(s->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    atomic_store(&s->acceptor_stop, false);
    if (pthread_create(&s->acceptor, NULL, acceptor_main, s) != 0) {
        close(s->wake_pipe[0]);
        close(s->wake_pipe[1]);
        return false;
    }
    return true;
}

void conns_stop(srv *s) {
    atomic_store(&s->acceptor_stop, true);
    (void)!write(s->wake_pipe[1], "x", 1);
    pthread_join(s->acceptor, NULL);
    close(s->wake_pipe[0]);
    close(s->wake_pipe[1]);
    close(s->listen_fd);
    s->listen_fd = -1;
}

int conns_open(srv *s) {
    pthread_mutex_lock(&s->conns_mu);
    int n = s->n_conns;
    pthread_mutex_unlock(&s->conns_mu);
    return n;
}
