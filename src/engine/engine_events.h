/* engine_events: the engine's event log for the live KV view, a ring of the
 * last ENGINE_EV_RING events (admissions, prefix hits, preemptions, evictions,
 * sliding-window releases, finishes) numbered from 1 so a reader can ask for
 * what came after the last one it saw. Engine-internal: written and read on
 * the engine thread only (engine_view_take copies it out). */
#ifndef KVLLM_ENGINE_EVENTS_H
#define KVLLM_ENGINE_EVENTS_H

#include "engine.h"

typedef struct engine_ev_ring {
    engine_log_event ev[ENGINE_EV_RING];
    uint64_t next;          /* number of the next event (the first is 1) */
    int64_t prefix_lookups; /* admissions that looked up the prefix cache */
    int64_t prefix_hits;    /* ... and found at least one block */
} engine_ev_ring;

void ev_ring_push(engine_ev_ring *r, engine_ev_kind kind, int64_t request_id, int64_t a, int64_t b);
/* Copies the events numbered above `since` that the ring still holds, oldest
 * first, into v (v->events, v->n_events, v->next_event). */
void ev_ring_copy(const engine_ev_ring *r, uint64_t since, engine_view *v);

#endif
