/* base: the byte buffer (growth, NUL termination, formatted appends, the
 * sticky failure); one allocation carved into arrays; giving back a file
 * mapping's pages; the memory and CPU a cgroup leaves the process. */
#define _GNU_SOURCE /* mkstemp */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base.h"
#include "kvl_buf.h"

#include "check.h"

static void test_buf(void) {
    kvl_buf b = {0};
    kvl_buf_put(&b, "", 0);
    CHECK(b.p && b.len == 0 && b.p[0] == 0 && !b.oom); /* an empty put still gives "" */
    kvl_buf_put(&b, "a\0b", 3);
    CHECK(b.len == 3 && memcmp(b.p, "a\0b", 4) == 0);
    kvl_buf_free(&b);
    CHECK(!b.p && b.len == 0 && b.cap == 0);

    /* growth past the first allocations keeps every byte */
    char want[5001]; /* snprintf writes the NUL after the last entry */
    for (int i = 0; i < 1000; i++) kvl_buf_printf(&b, "%04d,", i);
    for (int i = 0; i < 1000; i++) snprintf(want + 5 * i, 6, "%04d,", i);
    CHECK(!b.oom && b.len == 5000 && memcmp(b.p, want, 5000) == 0 && b.p[5000] == 0 &&
          b.cap > b.len);
    kvl_buf_free(&b);

    /* a formatted append longer than any small stack buffer */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    kvl_buf_puts(&b, "<");
    kvl_buf_printf(&b, "%s>%d", big, 7);
    CHECK(b.len == 1 + 2999 + 2 && b.p[0] == '<' && b.p[3000] == '>' &&
          strcmp(b.p + 3001, "7") == 0);

    /* a size that overflows: oom, and nothing changes afterwards */
    const size_t len = b.len;
    kvl_buf_put(&b, big, SIZE_MAX - 1);
    CHECK(b.oom && b.len == len);
    kvl_buf_puts(&b, "more");
    kvl_buf_printf(&b, "%d", 1);
    CHECK(b.len == len && b.p[len] == 0);
    kvl_buf_free(&b);
    CHECK(!b.oom);
}

static void test_parts(void) {
    double *a = NULL;
    char *b = NULL;
    int32_t *c = NULL, *d = NULL;
    kvl_part parts[] = {KVL_PART(a, 3), KVL_PART(b, 1), KVL_PART(c, 0), KVL_PART(d, 100)};
    void *block = kvl_alloc_parts(parts, 4);
    CHECK(block && (void *)a == block);
    /* aligned, zeroed, in order and apart: writing one part leaves the others */
    CHECK((uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0 && (uintptr_t)c % 64 == 0 &&
          (uintptr_t)d % 64 == 0);
    CHECK((char *)b >= (char *)(a + 3) && (char *)c >= b + 1 && (char *)d >= (char *)c);
    bool zero = a[0] == 0 && a[2] == 0 && b[0] == 0;
    for (int i = 0; i < 100; i++) zero = zero && d[i] == 0;
    CHECK(zero);
    for (int i = 0; i < 3; i++) a[i] = -1.0;
    b[0] = 'x';
    for (int i = 0; i < 100; i++) d[i] = i;
    CHECK(a[2] == -1.0 && b[0] == 'x' && d[0] == 0 && d[99] == 99);
    kvl_free(a); /* the first part's pointer frees the block */

    /* a size that overflows: NULL, and no pointer set */
    char *e = NULL, *f = NULL;
    int32_t *g = NULL;
    kvl_part big[] = {KVL_PART(e, 16), KVL_PART(g, SIZE_MAX / 2)}; /* n x elem overflows */
    CHECK(kvl_alloc_parts(big, 2) == NULL && !e && !g);
    kvl_part sum[] = {KVL_PART(e, SIZE_MAX / 2 - 8), KVL_PART(f, SIZE_MAX / 2 - 8)};
    CHECK(kvl_alloc_parts(sum, 2) == NULL && !e && !f); /* the total overflows */

    /* no parts at all: still a block to free */
    void *none = kvl_alloc_parts(NULL, 0);
    CHECK(none != NULL);
    kvl_free(none);
}

/* A file mapping's pages given back (unmapped, and with reclaim their page
 * cache freed) read the file's bytes again, whatever the range's alignment;
 * the pages around an unaligned range stay as they are. */
static void test_drop_file_pages(void) {
    const long page = sysconf(_SC_PAGESIZE);
    const size_t n = (size_t)page * 5 + 123;
    char path[] = "/tmp/kvllm_test_base_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    unlink(path);
    unsigned char *want = malloc(n);
    for (size_t i = 0; i < n; i++) want[i] = (unsigned char)(i * 7 + i / 4096);
    CHECK(write(fd, want, n) == (ssize_t)n);
    const unsigned char *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(p != MAP_FAILED);
    if (p != MAP_FAILED) {
        for (int reclaim = 0; reclaim < 2; reclaim++) {
            CHECK(memcmp(p, want, n) == 0);                 /* every page mapped in */
            kvl_drop_file_pages(p + 100, n - 200, reclaim); /* pages 1..4 whole */
            kvl_drop_file_pages(p + 10, 20, reclaim);       /* no whole page: nothing */
            CHECK(memcmp(p, want, n) == 0);
            kvl_drop_file_pages(p, n, reclaim);
            CHECK(memcmp(p, want, n) == 0);
        }
        munmap((void *)p, n);
    }
    free(want);
    close(fd);
}

/* kvl_mem_status_at and kvl_cpu_quota_at over tests/data/cgroup: trees laid
 * out as /proc and /sys/fs/cgroup are, one per kind of host. */
static void test_cgroups(void) {
    static const struct {
        const char *tree;
        int64_t available, meminfo, limit;
        double cpus; /* kvl_cpu_quota_at */
    } cases[] = {
        /* no cgroup limit: MemAvailable (8000000 kB) */
        {"plain", 8192000000, 8192000000, -1, -1},
        /* cgroup v2, a systemd unit: no limit of its own ("max"), its slice's
         * 1e9 with 7e8 used of which 2.5e8 page cache: 5.5e8; CPU: the unit's
         * 2 CPUs (cpu.max 200000 100000), the slice's "max" */
        {"v2-nested", 550000000, 8192000000, 1000000000, 2.0},
        /* cgroup v2 inside a container (its own cgroup at the mount, path "/"):
         * 2 GiB limit, 1 GiB used, no page cache; --cpus 1.5 */
        {"v2-container", 1073741824, 8192000000, 2147483648, 1.5},
        /* cgroup v1, Docker: the path names the container as the host sees it,
         * the mount is the container's cgroup; 3 GiB limit, 2.5 GiB used of
         * which 0.5 GiB page cache (total_cache, not cache); the v2 line of a
         * hybrid host has no memory files; --cpus 2.5 (cpu,cpuacct's quota) */
        {"v1-docker", 1073741824, 8192000000, 3221225472, 2.5},
        /* v1's "no limit" (LLONG_MAX rounded to pages; quota -1) at every level */
        {"v1-unlimited", 8192000000, 8192000000, -1, -1},
        /* usage over the limit (it happens briefly): nothing free, not negative;
         * no /proc/meminfo: the cgroup's figure alone */
        {"over-limit", 0, -1, 1000000, -1},
        /* nothing readable */
        {"absent", -1, -1, -1, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char root[256];
        snprintf(root, sizeof root, "tests/data/cgroup/%s", cases[i].tree);
        const kvl_mem_status st = kvl_mem_status_at(root);
        CHECK(st.available == cases[i].available, "%s: available %lld, want %lld", cases[i].tree,
              (long long)st.available, (long long)cases[i].available);
        CHECK(st.meminfo == cases[i].meminfo, "%s: meminfo %lld", cases[i].tree,
              (long long)st.meminfo);
        CHECK(st.cgroup_limit == cases[i].limit, "%s: cgroup limit %lld", cases[i].tree,
              (long long)st.cgroup_limit);
        CHECK(st.by_cgroup == (cases[i].available != cases[i].meminfo), "%s: by_cgroup %d",
              cases[i].tree, st.by_cgroup);
        const double cpus = kvl_cpu_quota_at(root);
        CHECK(cpus == cases[i].cpus, "%s: cpu quota %g, want %g", cases[i].tree, cpus,
              cases[i].cpus);
    }
    /* the system's own reading agrees with kvl_mem_available */
    const int64_t a = kvl_mem_available(), b = kvl_mem_status_at("").available;
    CHECK(a > 0 && b > 0 && (a > b ? a - b : b - a) < ((int64_t)256 << 20), "%lld vs %lld",
          (long long)a, (long long)b);
    /* the resident size grows by what the process touches */
    const int64_t r0 = kvl_resident_bytes();
    const size_t n = (size_t)64 << 20;
    char *p = malloc(n);
    if (p) memset(p, 1, n);
    const int64_t r1 = kvl_resident_bytes();
    CHECK(p && r0 > 0 && r1 - r0 >= (int64_t)(60 << 20), "resident %lld -> %lld after 64 MiB",
          (long long)r0, (long long)r1);
    free(p);
}

int main(void) {
    test_buf();
    test_parts();
    test_drop_file_pages();
    test_cgroups();
    printf("test_base: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
