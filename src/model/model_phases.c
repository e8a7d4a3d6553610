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
                                                     "    experts: gate, up",
                                                     "    experts: act, down",
                                                     "  output norm and head"};

static void phase_report(void) {
    if (!phase_forwards) return;
    const double total = phase_s[PHASE_FORWARD];
    fprintf(stderr, "phase timers: %ld single-token forwards, %.3f ms each\n", phase_forwards,
            1e3 * total / (double)phase_forwards);
    fprintf(stderr, "| phase | ms per forward | share | MB read | GB/s |\n"
                    "|---|---:|---:|---:|---:|\n");
    for (int p = 0; p < PHASE_COUNT; p++) {
        if (phase_s[p] <= 0) continue;
        fprintf(stderr, "| %s | %.3f | %.1f%% |", PHASE_NAMES[p],
                1e3 * phase_s[p] / (double)phase_forwards, 100.0 * phase_s[p] / total);
        if (phase_bytes[p] > 0)
            fprintf(stderr, " %.1f | %.1f |\n", phase_bytes[p] / 1e6 / (double)phase_forwards,
                    phase_bytes[p] / phase_s[p] / 1e9);
        else fprintf(stderr, " | |\n");
    }
}

double phase_now(void) { return kvl_time_s(); }

void phase_add(int phase, double seconds, double bytes) {
    if (phase == PHASE_FORWARD && phase_forwards++ == 0) atexit(phase_report);
    phase_s[phase] += seconds;
    phase_bytes[phase] += bytes;
}
#endif
