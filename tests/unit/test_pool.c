/* base: the compute thread pool (kvl_pool). Every task runs exactly once, on
 * a thread index below the pool size (or the run's limit), whatever the pool
 * size; runs nested in a task or started from a second thread complete
 * serially; many back-to-back runs hand over without losing or repeating a
 * task. Also built under TSan (label threads). */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "kvl_pool.h"

#include "check.h"

enum { MAX_TASKS = 4096 };

typedef struct {
    _Atomic int count[MAX_TASKS];
    _Atomic int bad_thread;
    int limit;
} counts;

static void count_task(void *ctx, int64_t t, int thread) {
    counts *c = ctx;
    atomic_fetch_add(&c->count[t], 1);
    if (thread < 0 || thread >= c->limit) atomic_fetch_add(&c->bad_thread, 1);
}

static void check_runs(int size) {
    static counts c;
    const int64_t ns[] = {1, 2, 3, 7, 64, 1000, MAX_TASKS};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        for (int64_t t = 0; t < MAX_TASKS; t++) atomic_store(&c.count[t], 0);
        atomic_store(&c.bad_thread, 0);
        c.limit = size;
        kvl_pool_run(count_task, &c, ns[i]);
        int wrong = 0;
        for (int64_t t = 0; t < MAX_TASKS; t++) wrong += atomic_load(&c.count[t]) != (t < ns[i]);
        CHECK(wrong == 0, "size %d, %lld tasks: %d tasks not run exactly once", size,
              (long long)ns[i], wrong);
        CHECK(atomic_load(&c.bad_thread) == 0, "size %d: thread index out of range", size);
    }
    /* at most 2 threads: indices 0 and 1 only */
    for (int64_t t = 0; t < 256; t++) atomic_store(&c.count[t], 0);
    atomic_store(&c.bad_thread, 0);
    c.limit = 2;
    kvl_pool_run_upto(count_task, &c, 256, 2);
    int wrong = 0;
    for (int64_t t = 0; t < 256; t++) wrong += atomic_load(&c.count[t]) != 1;
    CHECK(wrong == 0 && atomic_load(&c.bad_thread) == 0, "size %d, at most 2 threads", size);
}

/* Many small runs back to back: a sum over all of them. */
static void add_task(void *ctx, int64_t t, int thread) {
    atomic_fetch_add((_Atomic int64_t *)ctx, t + 1);
}

static void check_handover(void) {
    _Atomic int64_t sum = 0;
    const int runs = 20000;
    for (int r = 0; r < runs; r++) kvl_pool_run(add_task, &sum, 1 + r % 5);
    int64_t want = 0;
    for (int r = 0; r < runs; r++) want += (int64_t)(1 + r % 5) * (2 + r % 5) / 2;
    CHECK(atomic_load(&sum) == want, "back-to-back runs: sum %lld, want %lld",
          (long long)atomic_load(&sum), (long long)want);
}

/* A run from inside a task runs its tasks on that task's thread. */
typedef struct {
    _Atomic int64_t inner;
    _Atomic int wrong_thread;
} nest;

typedef struct {
    nest *n;
    int thread;
} inner_ctx;

static void inner_task(void *ctx, int64_t t, int thread) {
    inner_ctx *ic = ctx;
    atomic_fetch_add(&ic->n->inner, 1);
    if (thread != ic->thread) atomic_fetch_add(&ic->n->wrong_thread, 1);
}

static void outer_task(void *ctx, int64_t t, int thread) {
    inner_ctx ic = {ctx, thread};
    kvl_pool_run(inner_task, &ic, 10);
}

static void check_nested(void) {
    nest n = {0};
    kvl_pool_run(outer_task, &n, 8);
    CHECK(atomic_load(&n.inner) == 80, "nested runs: %lld inner tasks, want 80",
          (long long)atomic_load(&n.inner));
    CHECK(atomic_load(&n.wrong_thread) == 0, "nested runs left their task's thread");
}

/* Two threads running at once: both complete every task. */
static void *second_caller(void *arg) {
    for (int r = 0; r < 2000; r++) kvl_pool_run(add_task, arg, 4);
    return NULL;
}

static void check_two_callers(void) {
    _Atomic int64_t a = 0, b = 0;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, second_caller, &b) == 0);
    for (int r = 0; r < 2000; r++) kvl_pool_run(add_task, &a, 4);
    pthread_join(th, NULL);
    CHECK(atomic_load(&a) == 2000 * 10 && atomic_load(&b) == 2000 * 10,
          "two callers: %lld and %lld, want 20000", (long long)atomic_load(&a),
          (long long)atomic_load(&b));
}

/* A worker's signal mask: SIGTERM and SIGINT blocked (they belong to the
 * server's sigwait), its own faults not (kvl_thread_start). */
static _Atomic int mask_seen; /* bit 0: a worker ran; 1: SIGTERM blocked; 2: SIGINT; 3: SIGSEGV */
static void mask_task(void *ctx, int64_t t, int thread) {
    (void)ctx, (void)t;
    if (thread == 0) { /* leave the worker room to take one: wait for it a while */
        const double t0 = kvl_time_s();
        while (!(atomic_load(&mask_seen) & 1) && kvl_time_s() - t0 < 0.05) {}
        return;
    }
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    atomic_fetch_or(&mask_seen, 1 | sigismember(&cur, SIGTERM) << 1 |
                                    sigismember(&cur, SIGINT) << 2 |
                                    sigismember(&cur, SIGSEGV) << 3);
}

static void check_worker_signals(void) {
    for (int tries = 0; tries < 100 && !(atomic_load(&mask_seen) & 1); tries++)
        kvl_pool_run(mask_task, NULL, 64);
    CHECK(atomic_load(&mask_seen) == 7,
          "worker signal mask bits %d (want a worker, TERM and INT "
          "blocked, SEGV not)",
          atomic_load(&mask_seen));
}

int main(void) {
    CHECK(kvl_pool_threads() >= 1);
    kvl_pool_set_threads(1);
    CHECK(kvl_pool_threads() == 1);
    for (int size = 1; size <= 4; size++) {
        kvl_pool_set_threads(size);
        CHECK(kvl_pool_threads() == size);
        check_runs(size);
        check_handover();
        check_nested();
        check_two_callers();
    }
    kvl_pool_set_threads(2);
    check_worker_signals();
    kvl_pool_set_threads(2); /* smaller again: the extra workers stay out */
    check_runs(2);
    CHECK(strcmp(kvl_pool_threads_source(), "-t") == 0, "%s", kvl_pool_threads_source());
    unsetenv("OMP_NUM_THREADS"); /* the default: the CPUs, at most a cgroup's CPU quota */
    kvl_pool_set_threads(0);
    const double quota = kvl_cpu_quota_at("");
    const char *src = kvl_pool_threads_source();
    if (strncmp(src, "the cgroup's CPU quota of ", 26) == 0) /* the quota set the size */
        CHECK(quota > 0 && (int)ceil(quota) == kvl_pool_threads(), "%s: %d threads", src,
              kvl_pool_threads());
    else /* the CPUs did, the quota (if any) no tighter */
        CHECK(strcmp(src, "the CPUs the process may use") == 0 &&
                  (quota <= 0 || quota >= kvl_pool_threads()),
              "%s: %d threads, quota %g", src, kvl_pool_threads(), quota);
    setenv("OMP_NUM_THREADS", "3,1", 1); /* the default follows OpenMP's variable */
    kvl_pool_set_threads(0);
    CHECK(kvl_pool_threads() == 3, "OMP_NUM_THREADS=3,1 gave %d threads", kvl_pool_threads());
    CHECK(strcmp(kvl_pool_threads_source(), "OMP_NUM_THREADS") == 0, "%s",
          kvl_pool_threads_source());
    check_runs(3);
    return failures != 0;
}
