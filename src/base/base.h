/* base: errors, logging, aligned allocation, a byte buffer, timers, fp16/bf16
 * conversion.
 * Everything else in libkvllm depends on this and nothing here depends on
 * anything else. Library code never exits the process: failures are reported
 * through a kvl_error filled by the callee and returned to the caller. */
#ifndef KVLLM_BASE_H
#define KVLLM_BASE_H

#include <stdarg.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVLLM_VERSION "0.1.0"

/* A human-readable reason for the last failure; callers own it (stack is fine). */
typedef struct kvl_error {
    char msg[512];
} kvl_error;

/* Formats into err (if non-NULL). Always returns false so that
 * `return kvl_fail(err, ...)` works in bool functions. */
bool kvl_fail(kvl_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The first failure of a multi-step translation, as "WHERE: MESSAGE": once
 * *failed is set, later calls (callers failing because a callee did) leave err
 * as the first one wrote it. Always returns false. */
bool kvl_vfail_first(kvl_error *err, bool *failed, const char *where, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* Logging to stderr; level filtered by kvl_log_level (0 error .. 3 debug). */
enum { KVL_LOG_ERROR = 0, KVL_LOG_WARN = 1, KVL_LOG_INFO = 2, KVL_LOG_DEBUG = 3 };
extern int kvl_log_level;
void kvl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* From now on everything written to stderr (kvl_log and every other message)
 * also goes to the file at path (created or truncated), as llama.cpp's
 * --log-file: a thread copies a pipe in place of fd 2 to both, and drains it
 * at exit. Once per process; false with err when the file or pipe fails. */
bool kvl_log_to_file(const char *path, kvl_error *err);

/* pthread_create for the library's helper threads (compute pool, disk tier,
 * log copier): the thread starts with every signal blocked but its own
 * faults' (SIGSEGV, SIGBUS, SIGFPE, ...), so a
 * process-directed SIGTERM reaches the thread that waits for it (the server's
 * sigwait) instead of one of these, where its default action would kill the
 * process. Returns pthread_create's result. */
int kvl_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* 64-byte aligned allocation (cache line / AVX-512); free with kvl_free. NULL on failure. */
void *kvl_alloc(size_t size);
void *kvl_calloc(size_t n, size_t size); /* zeroed, overflow-checked */
/* Large long-lived buffers (weights, the KV pool): 2 MiB aligned and on
 * transparent huge pages where the system allows, so filling them faults 512x
 * fewer times and reading them misses the TLB less. Free with kvl_free. */
void *kvl_alloc_huge(size_t size);
/* Gives back the whole pages inside [p, p + size) of a read-only file mapping
 * (read again from the file if touched). Always unmapped (MADV_DONTNEED); with
 * `reclaim`, their page cache is freed too where no other mapping holds them
 * (MADV_PAGEOUT): memory then stays free for what is written next instead of
 * filling with pages of a file read once. */
void kvl_drop_file_pages(const void *p, size_t size, bool reclaim);
void kvl_free(void *p);
/* The one growable-array step: makes room for need elements of elem bytes in
 * the malloc'd array *p of *cap elements, doubling the capacity (from first
 * when 0) until it fits. False on overflow or out of memory, *p and *cap then
 * unchanged. Call as kvl_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v, 64). */
bool kvl_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first);

/* One allocation for arrays whose sizes are all fixed when their owner is
 * created: one free instead of one per array, and one failure path. Each
 * part gets n elements of elem bytes at *ptr, 64-byte aligned and zeroed.
 * The block starts at the first part, so kvl_free of the first part's
 * pointer frees them all. Returns the block, or NULL (no *ptr set) on
 * overflow or out of memory. Parts with n == 0 get a valid, empty place.
 * Write a part as KVL_PART(a->v, n): the array and its element count. */
typedef struct kvl_part {
    void **ptr;
    size_t n, elem;
} kvl_part;
#define KVL_PART(array, count)                                                                     \
    { (void **)&(array), (size_t)(count), sizeof *(array) }
void *kvl_alloc_parts(const kvl_part *parts, int n_parts);
/* kvl_alloc_parts over a whole array of parts, its count taken from the array. */
#define KVL_ALLOC_PARTS(parts) kvl_alloc_parts(parts, (int)(sizeof(parts) / sizeof *(parts)))

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool kvl_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kvl_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* The value of hex digit c, or -1. */
static inline int kvl_hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}
/* The value of the n (<= 8) hex digits at s; -1 with *bad the index of the
 * first character that is not one (reading stops there). */
static inline int64_t kvl_hex_value(const char *s, int n, int *bad) {
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        int d = kvl_hex_digit(s[i]);
        if (d < 0) {
            *bad = i;
            return -1;
        }
        v = v << 4 | d;
    }
    return v;
}

/* Monotonic clock in seconds. */
double kvl_time_s(void);

/* A fresh 64-bit value each call (the clock and a counter through splitmix64's
 * finaliser): default seeds and response ids. Not for secrets. */
uint64_t kvl_random_u64(void);

/* IEEE half and bfloat16 <-> float, exact round-to-nearest-even. */
typedef uint16_t kvl_f16;
typedef uint16_t kvl_bf16;
float kvl_f16_to_f32(kvl_f16 h);
kvl_f16 kvl_f32_to_f16(float f);
float kvl_bf16_to_f32(kvl_bf16 h);
kvl_bf16 kvl_f32_to_bf16(float f);

/* Reads a whole file into a NUL-terminated buffer (caller frees with free()). */
char *kvl_read_file(const char *path, size_t *len_out, kvl_error *err);
/* Reads f (stdin, a pipe) to its end the same way; name is for messages. */
char *kvl_read_stream(FILE *f, const char *name, size_t *len_out, kvl_error *err);

/* Number of online CPUs (>= 1). */
int kvl_cpu_count(void);

/* The CPU time a cgroup holding the process may use, in CPUs (a container's
 * --cpus 2.5, a systemd unit's CPUQuota, a pod's CPU limit: cgroup v2
 * cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us; the least over its
 * cgroup and those above), or -1 where none limits it. /proc and /sys are
 * read under root ("" for the system itself). The CPU affinity does not
 * show this limit: more threads than it allows are throttled in turn. */
double kvl_cpu_quota_at(const char *root);

/* Memory this process can still take, in bytes: MemAvailable of /proc/meminfo
 * (what the kernel can give without swapping, page cache included), or less
 * where a memory cgroup holding the process allows less (a container's or a
 * systemd unit's limit, which MemAvailable does not show): for its cgroup and
 * each above it, limit - usage + its page cache. -1 when neither can be read. */
int64_t kvl_mem_available(void);

/* What kvl_mem_available read. */
typedef struct kvl_mem_status {
    int64_t available;    /* kvl_mem_available(): the smaller of the two below */
    int64_t meminfo;      /* MemAvailable, -1 if unreadable */
    int64_t cgroup_limit; /* the tightest cgroup limit found, -1 if none */
    int64_t cgroup_free;  /* under that limit: limit - usage + page cache */
    bool by_cgroup;       /* available is the cgroup's figure, not MemAvailable */
} kvl_mem_status;

/* kvl_mem_available's reading, with /proc and /sys read under root ("" for
 * the system itself; a directory of the same layout for tests). */
kvl_mem_status kvl_mem_status_at(const char *root);

/* This process's resident memory (VmRSS of /proc/self/status) in bytes, or -1. */
int64_t kvl_resident_bytes(void);

#endif
