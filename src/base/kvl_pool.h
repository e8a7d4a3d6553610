/* kvl_pool: the library's compute threads, one persistent pool for the
 * process (the calling thread plus n - 1 workers).
 *
 * kvl_pool_run(fn, ctx, n) calls fn(ctx, task, thread) once for every task in
 * [0, n) and returns when all have finished. Tasks are handed out one at a
 * time from an atomic counter, so a worker the OS has descheduled holds up
 * only the task it is running: the caller and any awake worker take the
 * rest. Idle threads spin a few microseconds, then sleep in the kernel
 * (futex), so a busy machine gets its cores back instead of watching them
 * spin at a barrier. thread is in [0, kvl_pool_threads()) and is 0 for the
 * caller; it indexes per-thread scratch. Which thread runs which task varies
 * from run to run: tasks must not depend on it for their results.
 *
 * Size: kvl_pool_set_threads(n) (the -t flag); by default the first number of
 * OMP_NUM_THREADS if set, else the CPUs this process may run on, at most a
 * cgroup's CPU quota rounded up (kvl_cpu_quota_at). A run from
 * inside a task, or from a second thread while another run is in progress,
 * executes serially on its caller. */
#ifndef KVLLM_KVL_POOL_H
#define KVLLM_KVL_POOL_H

#include <stdint.h>

typedef void (*kvl_pool_fn)(void *ctx, int64_t task, int thread);

/* Threads a run uses (caller included), at least 1. */
int kvl_pool_threads(void);
/* Sets the size (n <= 0: the default above); workers start on the next run.
 * Not to be called while another thread runs tasks. */
void kvl_pool_set_threads(int n);
/* Where the size came from, for start-up logs: "-t", "OMP_NUM_THREADS", "the
 * CPUs the process may use" or "the cgroup's CPU quota of 1.5 CPUs". */
const char *kvl_pool_threads_source(void);
void kvl_pool_run(kvl_pool_fn fn, void *ctx, int64_t n_tasks);
/* The same with at most max_threads threads (thread < max_threads), for
 * tasks whose per-thread scratch is sized for that many. */
void kvl_pool_run_upto(kvl_pool_fn fn, void *ctx, int64_t n_tasks, int max_threads);

#endif
