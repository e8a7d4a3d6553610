/* base: see base.h. */
#define _GNU_SOURCE
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

int kvl_log_level = KVL_LOG_WARN;

bool kvl_fail(kvl_error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return false;
}

bool kvl_vfail_first(kvl_error *err, bool *failed, const char *where, const char *fmt, va_list ap) {
    if (*failed) return false;
    *failed = true;
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return kvl_fail(err, "%s: %s", where, msg);
}

void kvl_log(int level, const char *fmt, ...) {
    if (level > kvl_log_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "kvllm %s: ", names[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int kvl_thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    /* the faults the thread itself raises stay deliverable (blocked, the
     * kernel would kill the process without the handler's report) */
    const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof faults / sizeof *faults; i++) sigdelset(&all, faults[i]);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    const int rc = pthread_create(t, NULL, fn, arg); /* the new thread inherits the mask */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* kvl_log_to_file's copier: fds of the pipe's read end, the original
 * stderr and the file. */
static int tee_in = -1, tee_console = -1, tee_file = -1;
static pthread_t tee_thread;

static void write_all_fd(int fd, const char *p, size_t n) {
    while (n > 0) {
        const ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return; /* a log line is not worth more */
        p += k;
        n -= (size_t)k;
    }
}

static void *tee_main(void *arg) {
    (void)arg;
    char buf[4096];
    for (;;) {
        const ssize_t n = read(tee_in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL; /* every write end closed: exit */
        write_all_fd(tee_console, buf, (size_t)n);
        write_all_fd(tee_file, buf, (size_t)n);
    }
}

/* At exit: fd 2 back to the console (closing the pipe's write end), then the
 * copier drains what is left and stops. */
static void tee_stop(void) {
    fflush(stderr);
    dup2(tee_console, STDERR_FILENO);
    pthread_join(tee_thread, NULL);
}

bool kvl_log_to_file(const char *path, kvl_error *err) {
    if (tee_file >= 0) return kvl_fail(err, "--log-file: given twice");
    int fds[2];
    const int f = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f < 0) return kvl_fail(err, "--log-file: cannot create %s: %s", path, strerror(errno));
    if (pipe2(fds, O_CLOEXEC) != 0) {
        close(f);
        return kvl_fail(err, "--log-file: %s", strerror(errno));
    }
    fflush(stderr);
    tee_console = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    tee_in = fds[0];
    tee_file = f;
    if (tee_console < 0 || kvl_thread_start(&tee_thread, tee_main, NULL) != 0) {
        close(fds[0]);
        close(fds[1]);
        close(f);
        tee_file = -1;
        return kvl_fail(err, "--log-file: cannot start its copier");
    }
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    atexit(tee_stop);
    return true;
}

void *kvl_alloc(size_t size) {
    void *p = NULL;
    if (size == 0) size = 64;
    if (posix_memalign(&p, 64, size) != 0) return NULL;
    return p;
}

void *kvl_calloc(size_t n, size_t size) {
    size_t total;
    if (!kvl_mul_ok(n, size, &total)) return NULL;
    void *p = kvl_alloc(total);
    if (p) memset(p, 0, total ? total : 64);
    return p;
}

void *kvl_alloc_huge(size_t size) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (size < huge) return kvl_alloc(size);
    if (size > SIZE_MAX - huge) return NULL;
    const size_t rounded = (size + huge - 1) & ~(huge - 1);
    if (posix_memalign(&p, huge, rounded) != 0) return NULL;
    madvise(p, rounded, MADV_HUGEPAGE); /* advisory: ignore failure */
    return p;
}

void kvl_drop_file_pages(const void *p, size_t size, bool reclaim) {
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21 /* Linux 5.4 */
#endif
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    const uintptr_t a0 = (a + page - 1) & ~(page - 1), e0 = (a + size) & ~(page - 1);
    if (e0 <= a0) return;
    if (reclaim) madvise((void *)a0, e0 - a0, MADV_PAGEOUT); /* advisory: older kernels refuse */
    madvise((void *)a0, e0 - a0, MADV_DONTNEED);
}

void kvl_free(void *p) { free(p); }

void *kvl_alloc_parts(const kvl_part *parts, int n_parts) {
    size_t total = 0, bytes;
    for (int i = 0; i < n_parts; i++) {
        if (!kvl_mul_ok(parts[i].n, parts[i].elem, &bytes) || !kvl_add_ok(bytes, 63, &bytes) ||
            !kvl_add_ok(total, bytes & ~(size_t)63, &total))
            return NULL;
    }
    char *block = kvl_calloc(1, total);
    if (!block) return NULL;
    size_t at = 0;
    for (int i = 0; i < n_parts; i++) {
        *parts[i].ptr = block + at;
        at += (parts[i].n * parts[i].elem + 63) & ~(size_t)63;
    }
    return block;
}

double kvl_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kvl_f16_to_f32(kvl_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* subnormal: value = mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

kvl_f16 kvl_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (kvl_f16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (kvl_f16)(sign | 0x7c00); /* rounds to inf */
    if (ax < 0x38800000u) {                                 /* subnormal or zero in half */
        float a = bits_f32(ax);
        /* round to nearest even multiple of 2^-24 */
        float q = a * 16777216.0f;
        uint32_t m = (uint32_t)nearbyintf(q);
        return (kvl_f16)(sign | m);
    }
    uint32_t mant_odd = (ax >> 13) & 1;
    ax += 0xc8000fffu + mant_odd; /* rebias exponent (-112<<23) and round to nearest even */
    return (kvl_f16)(sign | (ax >> 13));
}

float kvl_bf16_to_f32(kvl_bf16 h) { return bits_f32((uint32_t)h << 16); }

kvl_bf16 kvl_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (kvl_bf16)((x >> 16) | 64); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (kvl_bf16)(x >> 16);
}

char *kvl_read_stream(FILE *f, const char *name, size_t *len_out, kvl_error *err) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (len < cap) break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (!buf || ferror(f)) {
        kvl_fail(err, "%s: %s", name, buf ? "read failed" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[len] = 0;
    if (len_out) *len_out = len;
    return buf;
}

char *kvl_read_file(const char *path, size_t *len_out, kvl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvl_fail(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = kvl_read_stream(f, path, len_out, err);
    fclose(f);
    return buf;
}

int kvl_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* ---------------------------------------------------------------- buffer */

uint64_t kvl_random_u64(void) {
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^
                 (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33; /* splitmix64 finaliser */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The first number in file path (a cgroup file: memory.max holds "max" where
 * there is no limit), or -1. */
static int64_t read_file_i64(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

/* The value of key in a "key value" file (memory.stat, /proc/meminfo), or -1. */
static int64_t read_keyed_i64(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    const size_t n = strlen(key);
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && (line[n] == ' ' || line[n] == ':') &&
            sscanf(line + n + 1, " %lld", &v) == 1)
            break;
    fclose(f);
    return v;
}

int64_t kvl_resident_bytes(void) {
    const int64_t kb = read_keyed_i64("/proc/self/status", "VmRSS");
    return kb < 0 ? -1 : kb * 1024;
}

/* v1 marks "no limit" with a page-rounded LLONG_MAX; anything this large is none. */
#define CGROUP_NO_LIMIT ((int64_t)1 << 60)

/* dir/name into p (false where it would not fit: the file is then not read). */
static bool cgroup_file(char *p, size_t n, const char *dir, const char *name) {
    const int k = snprintf(p, n, "%s/%s", dir, name);
    return k > 0 && (size_t)k < n;
}

/* The number in dir/name, -1 where absent or unreadable. */
static int64_t cgroup_i64(const char *dir, const char *name) {
    char p[1024];
    return cgroup_file(p, sizeof p, dir, name) ? read_file_i64(p) : -1;
}

/* The value of key in dir/memory.stat, -1 where absent. */
static int64_t cgroup_stat(const char *dir, const char *key) {
    char p[1024];
    return cgroup_file(p, sizeof p, dir, "memory.stat") ? read_keyed_i64(p, key) : -1;
}

/* Folds the memory cgroup in dir (v2 files, else v1 files) into st: its page
 * cache counts as free, as MemAvailable counts it (the cgroup's own reclaim
 * evicts it before the limit kills anything). */
static void fold_memory(const char *dir, void *ctx) {
    kvl_mem_status *st = ctx;
    int64_t limit = cgroup_i64(dir, "memory.max"), usage, cache;
    if (limit >= 0) { /* v2 */
        usage = cgroup_i64(dir, "memory.current");
        cache = cgroup_stat(dir, "file");
    } else { /* v1: total_ counts the cgroups below too */
        limit = cgroup_i64(dir, "memory.limit_in_bytes");
        usage = cgroup_i64(dir, "memory.usage_in_bytes");
        cache = cgroup_stat(dir, "total_cache");
        if (cache < 0) cache = cgroup_stat(dir, "cache");
    }
    if (limit < 0 || limit >= CGROUP_NO_LIMIT || usage < 0) return;
    int64_t free_bytes = limit - usage + (cache > 0 ? cache : 0);
    free_bytes = free_bytes < 0 ? 0 : free_bytes > limit ? limit : free_bytes;
    if (st->cgroup_limit < 0 || free_bytes < st->cgroup_free) {
        st->cgroup_limit = limit;
        st->cgroup_free = free_bytes;
    }
}

/* Calls fn on every cgroup from the one named in a /proc/self/cgroup line up
 * to the hierarchy's root, mounted at mount: a level not there is skipped
 * (inside a container the mount is the container's own cgroup, and the path
 * names it as the host sees it). */
static void walk_cgroup_path(const char *mount, const char *path, void (*fn)(const char *, void *),
                             void *ctx) {
    char rel[512], dir[1024];
    if (snprintf(rel, sizeof rel, "%s", path) >= (int)sizeof rel) return;
    for (;;) {
        if (snprintf(dir, sizeof dir, "%s%s", mount, strcmp(rel, "/") == 0 ? "" : rel) <
            (int)sizeof dir)
            fn(dir, ctx);
        if (strcmp(rel, "/") == 0) break;
        char *slash = strrchr(rel, '/');
        if (!slash) break;
        slash[slash == rel ? 1 : 0] = '\0'; /* "/a/b" -> "/a", "/a" -> "/" */
    }
}

/* Calls fn on every cgroup of the process (under root) that controller may
 * limit: the unified (v2) hierarchy's, and v1's where a hierarchy lists the
 * controller (mounted at /sys/fs/cgroup/CONTROLLER), each level up to its root. */
static void walk_cgroups(const char *root, const char *controller, void (*fn)(const char *, void *),
                         void *ctx) {
    char p[1024];
    FILE *f = cgroup_file(p, sizeof p, root, "proc/self/cgroup") ? fopen(p, "r") : NULL;
    if (!f) return;
    const size_t cn = strlen(controller);
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        /* "0::/path" (v2), "4:memory:/path" or "3:cpu,cpuacct:/path" (v1) */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        line[strcspn(line, "\n")] = '\0';
        *c2 = '\0';
        const char *ctl = c1 + 1, *path = c2 + 1;
        char sub[64] = "sys/fs/cgroup", mount[1024];
        if (*ctl) {
            bool listed = false;
            for (const char *t = ctl; *t;) {
                const size_t n = strcspn(t, ",");
                listed |= n == cn && strncmp(t, controller, n) == 0;
                t += n + (t[n] == ',');
            }
            if (!listed ||
                snprintf(sub, sizeof sub, "sys/fs/cgroup/%s", controller) >= (int)sizeof sub)
                continue;
        }
        if (cgroup_file(mount, sizeof mount, root, sub))
            walk_cgroup_path(mount, *path ? path : "/", fn, ctx);
    }
    fclose(f);
}

kvl_mem_status kvl_mem_status_at(const char *root) {
    kvl_mem_status st = {.available = -1, .meminfo = -1, .cgroup_limit = -1, .cgroup_free = -1};
    char p[1024];
    const int64_t kb =
        cgroup_file(p, sizeof p, root, "proc/meminfo") ? read_keyed_i64(p, "MemAvailable") : -1;
    st.meminfo = kb < 0 ? -1 : kb * 1024;
    walk_cgroups(root, "memory", fold_memory, &st);
    st.available = st.meminfo;
    st.by_cgroup = st.cgroup_limit >= 0 && (st.available < 0 || st.cgroup_free < st.available);
    if (st.by_cgroup) st.available = st.cgroup_free;
    return st;
}

/* Folds the CPU bandwidth limit of the cgroup in dir into *ctx (a double,
 * CPUs; < 0: none yet): v2's cpu.max "QUOTA PERIOD" ("max" for none), v1's
 * cpu.cfs_quota_us (-1 for none) over cpu.cfs_period_us. */
static void fold_cpu(const char *dir, void *ctx) {
    double *cpus = ctx;
    char p[1024];
    long long quota = -1, period = 0;
    FILE *f = cgroup_file(p, sizeof p, dir, "cpu.max") ? fopen(p, "r") : NULL;
    if (f) {
        if (fscanf(f, "%lld %lld", &quota, &period) != 2) quota = -1; /* "max ..." */
        fclose(f);
    } else {
        quota = cgroup_i64(dir, "cpu.cfs_quota_us");
        period = cgroup_i64(dir, "cpu.cfs_period_us");
    }
    if (quota <= 0 || period <= 0) return;
    const double c = (double)quota / (double)period;
    if (*cpus < 0 || c < *cpus) *cpus = c;
}

double kvl_cpu_quota_at(const char *root) {
    double cpus = -1;
    walk_cgroups(root, "cpu", fold_cpu, &cpus);
    return cpus;
}

int64_t kvl_mem_available(void) { return kvl_mem_status_at("").available; }

bool kvl_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : first;
    while (c < need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    if (c > SIZE_MAX / elem) return false;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}
