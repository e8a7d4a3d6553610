/* kvl_pool: see kvl_pool.h.
 *
 * One job at a time, published through a 64-bit ticket: generation (high 32
 * bits) and the next task (low 32). A thread takes a task by a compare-and-
 * swap that checks both, so a worker that wakes late, still holding an older
 * generation, can never take a task of a newer job. The job's function,
 * context and size live in one of two slots (generation & 1): a stale worker
 * reads its slot before its compare-and-swap, and the slot it reads is only
 * rewritten two generations later, after the ticket has moved on. All of
 * these are seq_cst atomics: a handful per run, not per element.
 *
 * Waiting (workers for a job, the caller for the last tasks) spins for
 * spin_ns, yielding the CPU every few µs, then sleeps on a futex; a waker makes the system call only when
 * someone sleeps. Memory ordering never relies on the futex: it only saves
 * CPU time, and a spurious or lost wake-up is covered by re-checking. */
#define _GNU_SOURCE
#include "kvl_pool.h"

#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base.h"

enum { POOL_MAX = 256 };
/* How long an idle thread spins before it sleeps: longer than the serial
 * steps between two matmuls of a decode step (norms, rope: a few µs) and
 * than the end of a token (LM head, sampling), so an idle machine never pays
 * a wake-up inside decoding; it yields while spinning (below), so a machine
 * shared with other work gets the core back. 1 ms measured best both idle
 * and next to a CPU-bound process against 30 and 200 µs (bench/README.md).
 * KVLLM_POOL_SPIN_US overrides it (benchmarks). */
#define SPIN_NS_DEFAULT 1000000
/* A spinning thread yields the CPU (sched_yield) every few µs: on an idle
 * core that returns at once, on a shared one the thread the spinner waits
 * for (a descheduled worker) or the other process runs instead of the spin.
 * KVLLM_POOL_YIELD=0 turns it off (benchmarks). */
#define SPIN_YIELD_DEFAULT 1
static int64_t spin_ns = SPIN_NS_DEFAULT; /* written before any worker starts */
static bool spin_yield = SPIN_YIELD_DEFAULT;

typedef struct job_slot {
    _Atomic(kvl_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic uint32_t n;
    _Atomic int max_threads; /* only threads with a lower index take its tasks */
} job_slot;

static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int size_set; /* 0: not resolved yet */
static job_slot slots[2];
static _Atomic uint64_t ticket;   /* generation << 32 | next task */
static _Atomic uint32_t gen_word; /* the generation, the workers' futex word */
static _Atomic uint32_t done;     /* tasks of the current job finished, the caller's futex word */
static _Atomic int workers_sleeping; /* how many wait on gen_word in the kernel */
static _Atomic int caller_sleeping;
/* under run_lock */
static pthread_t workers[POOL_MAX];
static int n_workers;
static uint32_t
    start_gen; /* the generation workers start from (written before the workers start) */
static _Thread_local int self_index;
static _Thread_local bool in_task;

static void futex_wait(_Atomic uint32_t *w, uint32_t v) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *w, int n) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until *w != v or spin_ns pass; true when it changed. */
static bool spin_while_equal(_Atomic uint32_t *w, uint32_t v) {
    const int64_t t0 = now_ns();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load(w) != v) return true;
            cpu_relax();
        }
        if (now_ns() - t0 > spin_ns) return false;
        if (spin_yield) sched_yield();
    }
}

static void read_tuning(void) {
    const char *e = getenv("KVLLM_POOL_SPIN_US");
    if (e && *e) {
        char *end;
        long us = strtol(e, &end, 10);
        if (end != e && us >= 0 && us <= 1000000) spin_ns = (int64_t)us * 1000;
    }
    e = getenv("KVLLM_POOL_YIELD");
    if (e && *e) spin_yield = strcmp(e, "0") != 0;
}

/* kvl_pool_threads_source's text, written with the size: by the one call that
 * sets it (kvl_pool_threads' first, or kvl_pool_set_threads under run_lock). */
static char size_source[64] = "the CPUs the process may use";

/* The default size; src (64 bytes) says where it comes from. */
static int default_size(char *src) {
    const char *e = getenv("OMP_NUM_THREADS"); /* the first level of an OpenMP list, e.g. "4,2" */
    if (e && *e) {
        char *end;
        long n = strtol(e, &end, 10);
        if (end != e && n > 0) {
            snprintf(src, 64, "OMP_NUM_THREADS");
            return n < POOL_MAX ? (int)n : POOL_MAX;
        }
    }
    cpu_set_t set;
    long n = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0
                 ? CPU_COUNT(&set)
                 : sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(src, 64, "the CPUs the process may use");
    /* A CPU quota (a container's --cpus) below that: one thread per CPU of it,
     * rounded up. More would be throttled in turn, and every parallel region
     * waits for its slowest thread (each spinning thread also spends quota). */
    const double quota = kvl_cpu_quota_at("");
    if (quota > 0 && quota < (double)n) {
        n = (long)ceil(quota);
        snprintf(src, 64, "the cgroup's CPU quota of %.2g CPUs", quota);
    }
    return n < 1 ? 1 : n < POOL_MAX ? (int)n : POOL_MAX;
}

const char *kvl_pool_threads_source(void) { return size_source; }

int kvl_pool_threads(void) {
    int n = atomic_load_explicit(&size_set, memory_order_relaxed);
    if (n) return n;
    char src[64];
    n = default_size(src);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&size_set, &expected, n)) return expected;
    memcpy(size_source, src, sizeof src);
    return n;
}

/* Takes and runs the tasks of generation g still untaken; returns after the last. */
static void run_tasks(uint32_t g, int self) {
    job_slot *s = &slots[g & 1];
    const kvl_pool_fn fn = atomic_load(&s->fn);
    void *const ctx = atomic_load(&s->ctx);
    const uint32_t n = atomic_load(&s->n);
    if (self >= atomic_load(&s->max_threads)) return;
    uint64_t t = atomic_load(&ticket);
    while ((uint32_t)(t >> 32) == g && (uint32_t)t < n) {
        if (!atomic_compare_exchange_weak(&ticket, &t, t + 1)) continue;
        fn(ctx, (int64_t)(uint32_t)t, self);
        if (atomic_fetch_add(&done, 1) + 1 == n && atomic_load(&caller_sleeping))
            futex_wake(&done, 1);
        t = atomic_load(&ticket);
    }
}

static void *worker_main(void *arg) {
    const int self = (int)(intptr_t)arg;
    self_index = self;
    in_task = true;
    uint32_t seen = start_gen;
    for (;;) { /* never returns: workers live as long as the process */
        if (!spin_while_equal(&gen_word, seen)) {
            atomic_fetch_add(&workers_sleeping, 1);
            while (atomic_load(&gen_word) == seen) futex_wait(&gen_word, seen);
            atomic_fetch_sub(&workers_sleeping, 1);
        }
        seen = atomic_load(&gen_word);
        if (self < atomic_load(&size_set))
            run_tasks(seen, self); /* else: beyond a pool made smaller */
    }
    return NULL;
}

/* Starts workers up to a pool of n threads (under run_lock); false when
 * fewer could start (then runs are serial). Workers are never stopped (as
 * OpenMP's are not): a pool made smaller leaves the extra ones asleep, and
 * their thread-local buffers stay reachable. */
static bool start_workers(int n) {
    if (n_workers == 0) read_tuning();
    start_gen = atomic_load(&gen_word);
    while (n_workers < n - 1) { /* taking no signals: kvl_thread_start */
        if (kvl_thread_start(&workers[n_workers], worker_main, (void *)(intptr_t)(n_workers + 1)) !=
            0) {
            kvl_log(KVL_LOG_WARN, "kvl_pool: could not start worker thread %d; running with %d",
                    n_workers + 1, n_workers + 1);
            break;
        }
        n_workers++;
    }
    return n_workers >= n - 1;
}

void kvl_pool_set_threads(int n) {
    pthread_mutex_lock(&run_lock);
    if (n > 0) snprintf(size_source, sizeof size_source, "-t");
    const int want = n > 0 ? (n < POOL_MAX ? n : POOL_MAX) : default_size(size_source);
    atomic_store(&size_set, want);
    pthread_mutex_unlock(&run_lock);
}

static void run_serial(kvl_pool_fn fn, void *ctx, int64_t n_tasks) {
    for (int64_t i = 0; i < n_tasks; i++) fn(ctx, i, self_index);
}

void kvl_pool_run(kvl_pool_fn fn, void *ctx, int64_t n_tasks) {
    kvl_pool_run_upto(fn, ctx, n_tasks, POOL_MAX);
}

void kvl_pool_run_upto(kvl_pool_fn fn, void *ctx, int64_t n_tasks, int max_threads) {
    if (n_tasks <= 0) return;
    const int size = kvl_pool_threads();
    if (n_tasks == 1 || size == 1 || max_threads <= 1 || in_task || n_tasks > UINT32_MAX / 2) {
        run_serial(fn, ctx, n_tasks);
        return;
    }
    if (pthread_mutex_trylock(&run_lock) != 0) { /* another thread's run is in progress */
        run_serial(fn, ctx, n_tasks);
        return;
    }
    if (n_workers < size - 1 && !start_workers(size)) {
        pthread_mutex_unlock(&run_lock);
        run_serial(fn, ctx, n_tasks);
        return;
    }
    const uint32_t g = atomic_load(&gen_word) + 1, n = (uint32_t)n_tasks;
    job_slot *s = &slots[g & 1];
    atomic_store(&s->fn, fn);
    atomic_store(&s->ctx, ctx);
    atomic_store(&s->n, n);
    atomic_store(&s->max_threads, max_threads);
    atomic_store(&done, 0);
    atomic_store(&ticket, (uint64_t)g << 32);
    atomic_store(&gen_word, g);
    if (atomic_load(&workers_sleeping) > 0) futex_wake(&gen_word, INT_MAX);

    in_task = true;
    run_tasks(g, 0);
    in_task = false;
    /* the tasks taken by workers: wait for them to finish */
    const int64_t t0 = now_ns();
    for (int i = 1; atomic_load(&done) != n; i++) {
        cpu_relax();
        if (i % 64 != 0) continue;
        if (now_ns() - t0 > spin_ns) {
            atomic_store(&caller_sleeping, 1);
            for (uint32_t d; (d = atomic_load(&done)) != n;) futex_wait(&done, d);
            atomic_store(&caller_sleeping, 0);
        } else if (spin_yield) {
            sched_yield();
        }
    }
    pthread_mutex_unlock(&run_lock);
}
