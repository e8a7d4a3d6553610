/* kvllm synth: writes a random-weight GGUF of a real model's shape (see
 * engine/synth.h), for benchmarks against llama.cpp on identical files. */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli.h"
#include "synth.h"

typedef struct synth_args {
    const char *shape, *type, *out;
    uint64_t seed;
    int64_t repeat_rows;
    bool list;
} synth_args;

static int synth_flag(const char *f, const char *v, void *ctx) {
    synth_args *a = ctx;
    if (strcmp(f, "--list") == 0) {
        a->list = true;
        return 1;
    }
    const char **dst = strcmp(f, "--shape") == 0                            ? &a->shape
                       : strcmp(f, "--type") == 0                           ? &a->type
                       : strcmp(f, "-o") == 0 || strcmp(f, "--output") == 0 ? &a->out
                                                                            : NULL;
    bool is_seed = strcmp(f, "--seed") == 0 || strcmp(f, "-s") == 0; /* -s: --seed everywhere */
    bool is_repeat = strcmp(f, "--repeat-rows") == 0;
    if (!dst && !is_seed && !is_repeat) return 0;
    if (!v) {
        fprintf(stderr, "kvllm synth: %s: missing value\n", f);
        return -1;
    }
    if (dst) {
        *dst = v;
        return 2;
    }
    char *end;
    errno = 0;
    if (is_repeat) {
        long long r = strtoll(v, &end, 10);
        if (errno || end == v || *end || r < 1) {
            fprintf(stderr, "kvllm synth: --repeat-rows: '%s' is not a positive integer\n", v);
            return -1;
        }
        a->repeat_rows = r;
        return 2;
    }
    a->seed = strtoull(v, &end, 10);
    if (errno || end == v || *end) {
        fprintf(stderr, "kvllm synth: --seed: '%s' is not an integer\n", v);
        return -1;
    }
    return 2;
}

static void list_shapes(FILE *out) {
    fprintf(out, "%-16s %-9s %5s %6s %5s %3s %4s %6s %7s %4s %4s %-13s %9s\n", "shape", "arch",
            "embd", "layers", "heads", "kv", "head", "ffn", "vocab", "tied", "bias", "experts",
            "Q4_K_M GB");
    for (int i = 0; synth_shape_at(i); i++) {
        const synth_shape *s = synth_shape_at(i);
        char experts[32] = "-";
        if (s->n_expert)
            snprintf(experts, sizeof experts, "%lld/%lld+%lld x%lld", (long long)s->n_expert_used,
                     (long long)s->n_expert, (long long)s->n_shared_exp, (long long)s->n_ff_exp);
        fprintf(out, "%-16s %-9s %5lld %6lld %5lld %3lld %4lld %6lld %7lld %4s %4s %-13s %9.2f\n",
                s->name, s->arch, (long long)s->n_embd, (long long)s->n_layer, (long long)s->n_head,
                (long long)s->n_head_kv,
                (long long)(s->kv_lora_rank ? s->qk_nope + s->qk_rope : s->head_dim),
                (long long)s->n_ff, (long long)s->n_vocab, s->tied_output ? "yes" : "no",
                s->qkv_bias ? "yes" : "no", experts,
                (double)synth_file_bytes(s, SYNTH_Q4_K_M) / 1e9);
    }
    fprintf(out, "experts: used/routed+shared x width; deepseek-v2-lite is MLA (head = qk_nope + "
                 "qk_rope)\n");
}

void cmd_synth_usage(FILE *out) {
    fprintf(out, "usage: kvllm synth --shape NAME --type "
                 "f16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|q4_k_m|q4_k_s|q5_k_s|q5_k_m|q3_k_m|q2_k|iq4_"
                 "xs|iq2_xxs|mxfp4_moe -o FILE.gguf [--seed N] "
                 "[--repeat-rows N] [-t N]\n       kvllm synth --list\n\n"
                 "--repeat-rows N: rows of a tensor from the N-th on repeat the first N (same\n"
                 "  layout and bytes read per token, written in minutes instead of hours; for\n"
                 "  speed runs of big shapes only)\n"
                 "iq2_xxs: llama-quantize's IQ2_XXS mix with random codes in its IQ2_XXS\n"
                 "  tensors (kvllm has no quantizer for the lattice types)\n\n");
    list_shapes(out);
}

/* Refuses to start a write that cannot finish: free space in FILE's directory. */
static bool disk_ok(const char *path, uint64_t need) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    struct statvfs st;
    if (statvfs(dirname(dir), &st) != 0) return true; /* fopen will say what is wrong */
    uint64_t avail = (uint64_t)st.f_bavail * st.f_frsize;
    if (avail >= need + (64u << 20)) return true;
    fprintf(stderr, "kvllm synth: %s needs %.2f GB but only %.2f GB are free there\n", path,
            need / 1e9, avail / 1e9);
    return false;
}

typedef struct bar {
    bool tty;
    double t0, last;
} bar;

static void on_progress(uint64_t done, uint64_t total, void *user) {
    bar *b = user;
    double now = kvl_time_s();
    if (!b->tty) { /* a log: a line every 5 s once the write takes more than 1 s */
        if (now - b->t0 < 1.0 || (now - b->last < 5.0 && done < total)) return;
        b->last = now;
        fprintf(stderr, "kvllm synth: %5.1f%%  %.2f / %.2f GB  %.0f s\n",
                total ? 100.0 * done / total : 100.0, done / 1e9, total / 1e9, now - b->t0);
        return;
    }
    if (now - b->last < 0.2 && done < total) return;
    b->last = now;
    int filled = total ? (int)(30.0 * (double)done / (double)total) : 30;
    char cells[31];
    for (int i = 0; i < 30; i++) cells[i] = i < filled ? '#' : '.';
    cells[30] = 0;
    fprintf(stderr, "\r[%s] %5.1f%%  %.2f / %.2f GB  %.0f s", cells,
            total ? 100.0 * done / total : 100.0, done / 1e9, total / 1e9, now - b->t0);
}

int cmd_synth(int argc, char **argv) {
    cli_opts o;
    synth_args a = {.seed = 1};
    if (!cli_parse_ex(argc, argv, &o, synth_flag, &a)) return 2;
    if (a.list) {
        list_shapes(stdout);
        return 0;
    }
    if (!a.shape || !a.type || !a.out) {
        cmd_synth_usage(stderr);
        return 2;
    }
    const synth_shape *s = synth_shape_find(a.shape);
    synth_ftype ft;
    if (!s) {
        fprintf(stderr, "kvllm synth: unknown shape '%s' (kvllm synth --list)\n", a.shape);
        return 2;
    }
    if (!synth_ftype_parse(a.type, &ft)) {
        fprintf(stderr,
                "kvllm synth: unknown type '%s' (f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, "
                "q4_k_m, q4_k_s, q5_k_s, q5_k_m, q3_k_m, q2_k, iq4_xs, iq2_xxs, mxfp4_moe)\n",
                a.type);
        return 2;
    }
    uint64_t size = synth_file_bytes(s, ft);
    if (!disk_ok(a.out, size)) return 1;
    bar b = {.tty = isatty(STDERR_FILENO), .t0 = kvl_time_s()};
    kvl_error err = {{0}};
    bool ok = synth_write(s, ft, a.seed, a.repeat_rows, a.out, on_progress, &b, &err);
    if (b.tty) fputc('\n', stderr);
    if (!ok) {
        fprintf(stderr, "kvllm synth: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "kvllm synth: wrote %s (%s %s, %.3f GB, seed %llu) in %.1f s\n", a.out, s->name,
            synth_ftype_name(ft), size / 1e9, (unsigned long long)a.seed, kvl_time_s() - b.t0);
    return 0;
}
