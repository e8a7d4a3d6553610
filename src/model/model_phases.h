/* model: wall time of the phases of single-token forwards (decode), for
 * finding where a decode step goes without a profiler's guesswork.
 *
 * Compiled in only with -DKVLLM_PHASE_TIMERS=ON (a separate build: the
 * timers read the clock about 10 times a layer); otherwise every macro is
 * empty. At exit the process prints, on stderr, each phase's milliseconds per
 * forward and its share. Phases nest in layer_forward: the attention
 * sublayer holds the projections, attention over the cache and the output
 * projection, the FFN sublayer the dense FFN or the router and the experts;
 * each sublayer's time outside its phases (norms, rope, the KV store, the
 * experts' sum) is printed after them as "the rest".
 * Only the calling thread reads the clock, around whole parallel regions, so
 * a phase is the wall time both threads spend in it. The matmul phases also
 * count the weight bytes they read (one 2-D slice per matrix or selected
 * expert, in the file's type), attention the K and V bytes of the positions it
 * attends to, which gives their rate against the machine's bandwidth (kvllm
 * bench --membw). */
#ifndef KVLLM_MODEL_PHASES_H
#define KVLLM_MODEL_PHASES_H

enum {
    PHASE_FORWARD,    /* the whole forward of one token */
    PHASE_ATTN_LAYER, /* attention sublayer: pre-norm to output projection */
    PHASE_QKV,        /* q, k, v projections (MLA: q and the latent) */
    PHASE_MLA_HEADS,  /* MLA decode: the per-head absorbed k_b and v_b products */
    PHASE_ATTENTION,  /* attention over the cache (bytes: the K and V it reads) */
    PHASE_WO,         /* output projection */
    PHASE_FFN_LAYER,  /* residual, FFN norm, FFN, residual */
    PHASE_FFN_DENSE,  /* dense FFN: gate and up, activation, down */
    PHASE_ROUTER,     /* MoE: router matmul, routing, grouping */
    PHASE_EXPERTS,    /* MoE decode: the selected (and shared) experts, one region */
    PHASE_OUTPUT,     /* output norm and head */
    PHASE_COUNT
};

#ifdef KVLLM_PHASE_TIMERS
/* Whether the forward in progress is timed (a single token). */
extern int phase_on;
void phase_add(int phase, double seconds, double bytes);
double phase_now(void);
#define PHASE_FORWARD_BEGIN(n) (phase_on = (n) == 1)
#define PHASE_BEGIN(var)       const double var = phase_on ? phase_now() : 0
/* bytes: the weights the phase read (evaluated only when timed), or 0 */
#define PHASE_END(var, phase, bytes)                                                               \
    do {                                                                                           \
        if (phase_on) phase_add(phase, phase_now() - (var), (double)(bytes));                      \
    } while (0)
#else
#define PHASE_FORWARD_BEGIN(n)       ((void)0)
#define PHASE_BEGIN(var)             ((void)0)
#define PHASE_END(var, phase, bytes) ((void)0)
#endif

#endif
