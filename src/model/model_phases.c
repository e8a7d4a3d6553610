/* model: the phase timers of model_phases.h (built with KVLLM_PHASE_TIMERS). */
#include "model_phases.h"

#ifdef KVLLM_PHASE_TIMERS
#include <stdio.h>
#include <stdlib.h>

#include "base.h"

int phase_on;
static double phase_s[PHASE_COUNT], phase_bytes[PHASE_COUNT];
static long phase_forwards;

static const char *const PHASE_NAMES[PHASE_COUNT] = {"forward (one token)",
                                                     "  attention sublayer",
                                                     "    qkv projections",
                                                     "    MLA per-head k_b, v_b",
                                                     "    attention over the KV cache",
                                                     "    output projection",
                                                     "  FFN sublayer",
                                                     "    dense FFN",
                                                     "    router and routing",
                                                     "    experts: gate, up, act, down",
                                                     "  output norm and head"};

/* The sublayer each phase belongs to (-1: none); a sublayer's time less its
 * phases' is printed after its last phase as "the rest": norms, rope, the KV
 * store, the experts' sum, and the calling thread reading what the pool's
 * tasks wrote. */
static const int PHASE_PARENT[PHASE_COUNT] = {[PHASE_FORWARD] = -1,
                                              [PHASE_ATTN_LAYER] = -1,
                                              [PHASE_QKV] = PHASE_ATTN_LAYER,
                                              [PHASE_MLA_HEADS] = PHASE_ATTN_LAYER,
                                              [PHASE_ATTENTION] = PHASE_ATTN_LAYER,
                                              [PHASE_WO] = PHASE_ATTN_LAYER,
                                              [PHASE_FFN_LAYER] = -1,
                                              [PHASE_FFN_DENSE] = PHASE_FFN_LAYER,
                                              [PHASE_ROUTER] = PHASE_FFN_LAYER,
                                              [PHASE_EXPERTS] = PHASE_FFN_LAYER,
                                              [PHASE_OUTPUT] = -1};

static void print_row(const char *name, double s, double bytes, double total) {
    fprintf(stderr, "| %s | %.3f | %.1f%% |", name, 1e3 * s / (double)phase_forwards,
            100.0 * s / total);
    if (bytes > 0)
        fprintf(stderr, " %.1f | %.1f |\n", bytes / 1e6 / (double)phase_forwards, bytes / s / 1e9);
    else fprintf(stderr, " | |\n");
}

static void phase_report(void) {
    if (!phase_forwards) return;
    const double total = phase_s[PHASE_FORWARD];
    fprintf(stderr, "phase timers: %ld single-token forwards, %.3f ms each\n", phase_forwards,
            1e3 * total / (double)phase_forwards);
    fprintf(stderr, "| phase | ms per forward | share | MB read | GB/s |\n"
                    "|---|---:|---:|---:|---:|\n");
    for (int p = 0; p < PHASE_COUNT; p++) {
        if (phase_s[p] > 0) print_row(PHASE_NAMES[p], phase_s[p], phase_bytes[p], total);
        const int up = PHASE_PARENT[p];
        if (up < 0 || phase_s[up] <= 0 || (p + 1 < PHASE_COUNT && PHASE_PARENT[p + 1] == up))
            continue;
        double rest = phase_s[up];
        for (int c = 0; c < PHASE_COUNT; c++)
            if (PHASE_PARENT[c] == up) rest -= phase_s[c];
        print_row("    the rest", rest, 0, total);
    }
}

double phase_now(void) { return kvl_time_s(); }

void phase_add(int phase, double seconds, double bytes) {
    if (phase == PHASE_FORWARD && phase_forwards++ == 0) atexit(phase_report);
    phase_s[phase] += seconds;
    phase_bytes[phase] += bytes;
}
#endif
