/* engine_events: the event ring and the parts of engine_view that need no
 * engine internals. See engine_events.h and engine.h. */
#include "engine_events.h"

#include <stdlib.h>
#include <string.h>

const char *engine_ev_kind_name(engine_ev_kind k) {
    static const char *names[] = {"admit", "prefix_hit",     "preempt",
                                  "evict", "window_release", "finish"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

const char *engine_phase_name(engine_seq_phase ph) {
    static const char *names[] = {"waiting", "prefilling", "decoding", "preempted"};
    return (unsigned)ph < sizeof names / sizeof names[0] ? names[ph] : "?";
}

void ev_ring_push(engine_ev_ring *r, engine_ev_kind kind, int64_t request_id, int64_t a,
                  int64_t b) {
    uint64_t n = ++r->next; /* numbers start at 1: "since 0" means everything */
    engine_log_event *e = &r->ev[n % ENGINE_EV_RING];
    *e = (engine_log_event){
        .seq = n, .t = kvl_time_s(), .request_id = request_id, .a = a, .b = b, .kind = kind};
}

void ev_ring_copy(const engine_ev_ring *r, uint64_t since, engine_view *v) {
    uint64_t first = r->next >= ENGINE_EV_RING ? r->next - ENGINE_EV_RING + 1 : 1;
    if (since + 1 > first) first = since + 1;
    v->n_events = 0;
    for (uint64_t n = first; n <= r->next; n++)
        v->events[v->n_events++] = r->ev[n % ENGINE_EV_RING];
    v->next_event = r->next + 1;
    v->prefix_lookups = r->prefix_lookups;
    v->prefix_hits = r->prefix_hits;
}

bool engine_view_prepare(const engine *e, engine_view *v) {
    const engine_config *c = engine_cfg(e);
    v->n_groups = engine_kv_n_groups(e);
    v->n_blocks = c->n_blocks;
    for (int g = 0; g < v->n_groups; g++)
        if (!v->blocks[g] && !(v->blocks[g] = malloc((size_t)v->n_blocks * sizeof *v->blocks[g])))
            return false;
    return true;
}

void engine_view_free(engine_view *v) {
    for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++) free(v->blocks[g]);
    free(v->seqs);
    free(v->tables);
    memset(v, 0, sizeof *v);
}
