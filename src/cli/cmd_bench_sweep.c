/* kvllm bench: the parts that need neither the engine nor the bench's options:
 * the memory-bandwidth probes (--membw, the decode roofline; --membw-steps,
 * the probe between decoding steps) and the context sweep's output files
 * (--context-sweep: CSV and a log-log SVG plot). Split from cmd_bench.c, which
 * runs the engine and reports; the two share only sweep_point and these entry
 * points (cmd_bench.h). */
#define _GNU_SOURCE
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_bench.h"
#include "kernels.h"
#include "kvl_pool.h"

/* ------------------------------------------------------ memory bandwidth -- */

/* Best of 5 passes over a buffer of `mb` MiB (far beyond the caches), each
 * thread reading its share as one stream with kern_read_sum: nothing
 * written, so the limit is read bandwidth. Both probes read huge pages, as
 * decode reads the repacked weights (kvl_alloc_huge): on 4 KiB pages the
 * Intel Xeon VM of 2026-12-06 read 29.05 GB/s on average against 30.6 (four
 * runs of each alternating), and between decoding steps 21.0-25.1 against
 * 24.4-29.5 (llama-3.2-1b Q4_K_M, three runs of each alternating), so every
 * roofline share measured before was too high by that much. */
/* Whether a probe of `bytes` fits in the memory this process may take now
 * (less a headroom): a probe beyond it would have the process killed in a
 * container (a cgroup's limit), or swap; the bench then goes on without it. */
static bool probe_fits(size_t bytes, const char *flag) {
    const int64_t avail = kvl_mem_available(), headroom = (int64_t)256 << 20;
    if (avail <= 0 || (int64_t)bytes + headroom <= avail) return true;
    fprintf(stderr,
            "kvllm bench: %s: a %.0f MiB probe does not fit in the %.0f MiB of memory available "
            "now (less 256 MiB): no roofline (a smaller probe: %s-mb)\n",
            flag, (double)bytes / 1048576.0, (double)avail / 1048576.0, flag);
    return false;
}

double bench_membw_gbps(int64_t mb) {
    size_t bytes = (size_t)mb << 20;
    if (!probe_fits(bytes, "--membw")) return 0;
    char *buf = kvl_alloc_huge(bytes);
    if (!buf) {
        fprintf(stderr, "kvllm bench: --membw: cannot allocate %lld MiB: no roofline\n",
                (long long)mb);
        return 0;
    }
    int nt = omp_get_max_threads();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < nt; t++) /* first touch by the thread that will read it */
        memset((char *)buf + bytes / nt * t, 1, t == nt - 1 ? bytes - bytes / nt * t : bytes / nt);
    double best = 0;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = kvl_time_s();
        uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
        {
            int t = omp_get_thread_num(), k = omp_get_num_threads();
            /* one read stream per thread, 4 KiB aligned, nothing written */
            size_t lo = bytes / k * t & ~(size_t)4095,
                   hi = t == k - 1 ? bytes : bytes / k * (t + 1) & ~(size_t)4095;
            total += kern_read_sum(buf + lo, hi - lo);
        }
        double dt = kvl_time_s() - t0;
        sink += total;
        if (bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
    (void)sink;
    kvl_free(buf);
    return best;
}

/* The probe between decoding steps: one pass over a smaller buffer, read
 * through the engine's own thread pool (the pool's workers would otherwise
 * spin beside OpenMP's threads on the same cores), in chunks the threads
 * claim as they go. */
#define STEP_PROBE_CHUNK ((size_t)4 << 20)

struct step_probe {
    char *buf;
    size_t bytes;
    _Atomic uint64_t sum;
};

static void step_probe_touch(void *ctx, int64_t c, int thread) {
    (void)thread;
    step_probe *p = ctx;
    memset(p->buf + (size_t)c * STEP_PROBE_CHUNK, 1, STEP_PROBE_CHUNK);
}

static void step_probe_read(void *ctx, int64_t c, int thread) {
    (void)thread;
    step_probe *p = ctx;
    p->sum += kern_read_sum(p->buf + (size_t)c * STEP_PROBE_CHUNK, STEP_PROBE_CHUNK);
}

step_probe *bench_step_probe_new(int64_t mb) {
    step_probe *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->bytes = ((size_t)mb << 20) / STEP_PROBE_CHUNK * STEP_PROBE_CHUNK;
    p->buf = p->bytes && probe_fits(p->bytes, "--membw-step") ? kvl_alloc_huge(p->bytes) : NULL;
    if (!p->buf) {
        free(p);
        return NULL;
    }
    kvl_pool_run(step_probe_touch, p, (int64_t)(p->bytes / STEP_PROBE_CHUNK));
    return p;
}

double bench_step_probe_run(step_probe *p) {
    const double t0 = kvl_time_s();
    kvl_pool_run(step_probe_read, p, (int64_t)(p->bytes / STEP_PROBE_CHUNK));
    return kvl_time_s() - t0;
}

size_t bench_step_probe_bytes(const step_probe *p) { return p->bytes; }

void bench_step_probe_free(step_probe *p) {
    if (!p) return;
    kvl_free(p->buf);
    free(p);
}

/* ------------------------------------------------------- sweep files -- */

static bool write_csv(const char *path, const sweep_point *sw, int n) {
    FILE *fp = fopen(path, "w");
    if (!fp) return false;
    fprintf(fp, "context,kv_cache_ms_per_token,no_kv_cache_ms_per_token\n");
    for (int i = 0; i < n; i++) {
        const sweep_point *sp = &sw[i];
        fprintf(fp, "%lld,%.4f,", (long long)sp->ctx, sp->cache_ms);
        if (sp->nocache_ms >= 0) fprintf(fp, "%.4f", sp->nocache_ms);
        fputc('\n', fp);
    }
    return fclose(fp) == 0;
}

/* A log-log plot: a flat line is O(1) per token, slope 1 is O(N) per token
 * (O(N^2) for a whole sequence). */
typedef struct plot {
    double x0, x1, y0, y1; /* data range (log10) */
    int w, h, l, r, t, bm; /* size and margins */
} plot;

static double px(const plot *p, double x) {
    return p->l + (log10(x) - p->x0) / (p->x1 - p->x0) * (p->w - p->l - p->r);
}
static double py(const plot *p, double y) {
    return p->h - p->bm - (log10(y) - p->y0) / (p->y1 - p->y0) * (p->h - p->t - p->bm);
}

static void svg_series(FILE *fp, const plot *p, const sweep_point *sw, int n, bool cache,
                       const char *color) {
    fprintf(fp, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color);
    for (int i = 0; i < n; i++) {
        double v = cache ? sw[i].cache_ms : sw[i].nocache_ms;
        if (v > 0) fprintf(fp, "%.1f,%.1f ", px(p, (double)sw[i].ctx), py(p, v));
    }
    fprintf(fp, "\"/>\n");
    for (int i = 0; i < n; i++) {
        double v = cache ? sw[i].cache_ms : sw[i].nocache_ms;
        if (v > 0)
            fprintf(fp,
                    "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%lld: %.2f "
                    "ms</title></circle>\n",
                    px(p, (double)sw[i].ctx), py(p, v), color, (long long)sw[i].ctx, v);
    }
}

static void svg_axes(FILE *fp, const plot *p, const sweep_point *sw, int n) {
    fprintf(fp,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n",
            p->l, p->t, p->w - p->l - p->r, p->h - p->t - p->bm);
    for (int i = 0; i < n; i++) {
        double x = px(p, (double)sw[i].ctx);
        fprintf(fp, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", x,
                p->t, x, p->h - p->bm);
        fprintf(fp, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%lld</text>\n", x,
                p->h - p->bm + 16, (long long)sw[i].ctx);
    }
    for (int e = (int)floor(p->y0); e <= (int)ceil(p->y1); e++) {
        for (int m = 1; m <= 5; m += m == 1 ? 1 : 3) { /* 1, 2, 5 per decade */
            double v = m * pow(10, e), y = py(p, v);
            if (log10(v) < p->y0 || log10(v) > p->y1) continue;
            fprintf(fp, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                    p->l, y, p->w - p->r, y);
            fprintf(fp, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", p->l - 6,
                    y + 4, v);
        }
    }
}

static bool write_svg(const char *path, const char *model_name, const sweep_point *sw, int n) {
    plot p = {.w = 720, .h = 440, .l = 70, .r = 20, .t = 50, .bm = 60};
    double lo = 1e300, hi = 0;
    for (int i = 0; i < n; i++) {
        double v[2] = {sw[i].cache_ms, sw[i].nocache_ms};
        for (int k = 0; k < 2; k++)
            if (v[k] > 0) lo = fmin(lo, v[k]), hi = fmax(hi, v[k]);
    }
    if (hi <= 0) return false;
    p.x0 = log10((double)sw[0].ctx) - 0.1;
    p.x1 = log10((double)sw[n - 1].ctx) + 0.1;
    p.y0 = log10(lo) - 0.15;
    p.y1 = log10(hi) + 0.15;
    if (p.x1 - p.x0 < 0.3) p.x1 = p.x0 + 0.3;
    FILE *fp = fopen(path, "w");
    if (!fp) return false;
    fprintf(fp,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            p.w, p.h);
    fprintf(
        fp,
        "<text x=\"%d\" y=\"22\" font-size=\"15\">Decode cost per token vs context: %s</text>\n",
        p.l, model_name);
    svg_axes(fp, &p, sw, n);
    svg_series(fp, &p, sw, n, true, "#1f77b4");
    svg_series(fp, &p, sw, n, false, "#d62728");
    fprintf(fp,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">context length (tokens, log "
            "scale)</text>\n",
            (p.w + p.l) / 2, p.h - 22);
    fprintf(fp,
            "<text transform=\"translate(16,%d) rotate(-90)\" text-anchor=\"middle\">ms per token "
            "(log)</text>\n",
            (p.h + p.t) / 2);
    fprintf(fp,
            "<text x=\"%d\" y=\"40\" fill=\"#1f77b4\">&#9679; KV cache (attention O(N) per "
            "token)</text>\n",
            p.l + 8);
    fprintf(fp,
            "<text x=\"%d\" y=\"40\" fill=\"#d62728\">&#9679; no KV cache: recompute (O(N) to "
            "O(N&#178;) per token)"
            "</text>\n",
            p.l + 300);
    fprintf(fp, "</svg>\n");
    return fclose(fp) == 0;
}

bool bench_sweep_files(const char *out, const model *m, const sweep_point *sw, int n) {
    const char *prefix = out ? out : "kvllm-context-sweep";
    char csv[4096], svg[4096];
    snprintf(csv, sizeof csv, "%s.csv", prefix);
    snprintf(svg, sizeof svg, "%s.svg", prefix);
    const char *name = gguf_path(model_gguf(m));
    const char *slash = strrchr(name, '/');
    bool ok = write_csv(csv, sw, n) && write_svg(svg, slash ? slash + 1 : name, sw, n);
    if (!ok) fprintf(stderr, "kvllm bench: cannot write %s / %s\n", csv, svg);
    else fprintf(stderr, "kvllm bench: context sweep written to %s and %s\n", csv, svg);
    return ok;
}
