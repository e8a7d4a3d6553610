/* engine internals shared by engine.c (lifecycle, public API),
 * engine_sched.c (planning, admission, preemption) and engine_step.c (step
 * execution); not an API. */
#ifndef KVLLM_ENGINE_INTERNAL_H
#define KVLLM_ENGINE_INTERNAL_H

#include "engine.h"
#include "reasoning_budget.h"
#include "spec.h"
#include "engine_events.h"
#include "batch_buf.h"

#define MAX_TOP_LOGPROBS 20

typedef enum seq_state { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE } seq_state;

typedef struct seq {
    int64_t id;
    seq_state state;
    engine_request req; /* stop strings, prompt: engine-owned copies */
    char **stop;
    engine_logit_bias *bias; /* req.n_logit_bias of them */
    int32_t *stop_ids;       /* req.n_stop_ids of them */
    uint32_t *allowed;       /* [n_vocab bits] req.allowed as a mask, NULL: all */
    int32_t *bad_ids;        /* req's bad-word sequences, one after another */
    int32_t *bad_lens;       /* req.n_bad lengths */
    int32_t *tokens;         /* prompt followed by generated ids */
    int64_t n_tokens;
    size_t cap_tokens;
    int64_t n_prompt;
    int64_t n_computed;             /* tokens whose K/V are in the blocks */
    int64_t recompute_for;          /* --no-kv-cache: n_tokens the current recompute serves */
    kv_seq kv[MODEL_MAX_KV_GROUPS]; /* one block table per KV group (group 0: prefix chain) */
    float lora[MODEL_MAX_LORA];     /* its LoRA adapters' scales, fixed at submit */
    int n_lora;                     /* model_lora_count() (0: no adapters) */
    sampler *smp;
    reasoning_budget rb; /* llama-server's thinking budget (inactive unless asked) */
    grammar_state *gst;  /* the grammar's position (NULL: unconstrained); it lives
                                with the sequence, so preemption does not touch it */
    const char *error;   /* ENGINE_FINISH_ERROR's reason (owned by gst) */
    tok_stream stream;
    char *text; /* generated text not yet released (held for stop strings) */
    size_t text_len, text_cap;
    uint64_t text_base; /* offset of text[0] in all the text generated */
    stop_matcher stops; /* over all the text generated, one byte at a time */
    bool line_start;    /* n_indent: in a line's indentation, after the first newline */
    int indent;         /* its spaces and tabs so far */
    int64_t cut_at;     /* n_indent: the held text ends here (-1: nowhere) */
    engine_req_stats stats;
    bool cancelled;
    int32_t draft[ENGINE_SPEC_MAX_K]; /* this step's drafts, after tokens[n_tokens - 1] */
    int n_draft;                      /* 0 outside a step, and for a plain decode */
    int n_accepted;                   /* of this step's drafts */
    spec_adapt adapt;
    spec_ngram_index *ngram; /* prompt lookup's index of tokens (NULL until it drafts) */
    spec_dseq dseq;          /* the draft model's KV of this sequence */
    int passed_over;         /* admissions that preferred a later request (prefix-aware) */
    kv_disk_load *load;      /* its prefix being read from the disk tier: waits until ready */
    int flight;              /* step groups: 1 + the slot of the step in flight with it, 0: none */
    struct seq *next;        /* in the waiting queue or the running list */
} seq;

typedef struct step_plan {
    int64_t n_tokens;
    int n_seqs;
} step_plan;

/* One step's batch and logits, sized once; engine.b points at the slot being
 * planned or finished (engine_config.step_groups slots). */
typedef struct step_slot {
    batch_buf in;       /* the batch; logits [rows][n_vocab] */
    struct seq **owner; /* running sequence of each batch seq index */
    step_plan plan;
} step_slot;

struct engine {
    model *m;
    const tok_vocab *vocab;
    engine_config cfg;
    kv_pool *kv[MODEL_MAX_KV_GROUPS];  /* one pool per KV group (full / sliding / chunked) */
    kv_attn attn[MODEL_MAX_KV_GROUPS]; /* each group's rule: its blocks are dropped by it */
    int n_groups;
    bool prefix_cache;     /* enabled and possible for this model */
    int prefix_group;      /* the group whose chain the scheduler probes (a full-attention
                              one where there is one) */
    bool spec;             /* speculative decoding enabled and possible */
    int64_t spec_left;     /* draft tokens still allowed this step */
    spec_drafter *drafter; /* ENGINE_SPEC_DRAFT */
    kv_disk *disk;         /* second tier of the prefix cache (NULL: none) */
    bool disk_wake;        /* engine_set_disk_wake given: engine_step never sleeps on reads */
    bool disk_stalled;     /* the last step planned nothing while reads were in flight */
    int64_t next_id;
    seq *waiting; /* FIFO; preempted sequences go to the front */
    /* running, events, logits_tmp, mask and draft_jobs: one block, sized at
     * creation (kvl_alloc_parts), that starts at running */
    seq **running; /* [max_seqs] in admission order (newest last) */
    int n_running;
    engine_metrics metrics;
    engine_ev_ring *events; /* the live view's log (engine_events.h) */
    int64_t n_evicted_seen[MODEL_MAX_KV_GROUPS];
    step_slot *b;      /* the slot being planned or finished, in slots[] */
    float *logits_tmp; /* [n_vocab] sampler input */
    uint32_t *mask;    /* [n_vocab bits] tokens a grammar allows this step */
    int32_t *eog_ids;  /* the vocabulary's end-of-generation tokens (min_tokens masks them) */
    int32_t n_eog_ids;
    char *piece; /* token text scratch */
    size_t piece_cap;

    /* speculative decoding's per-step state */
    spec_draft_job *draft_jobs; /* [max_seqs] one step's draft-model jobs */
    spec_cost cost;             /* measured step times: what drafts cost */
    double step_draft_s;        /* this step's draft-model time (counted apart) */

    /* step groups (engine_config.step_groups): steps in flight, oldest at head */
    step_slot slots[ENGINE_MAX_STEP_GROUPS];
    int n_slots, fl_head, n_flight;
};

/* engine.c */
void eng_seq_free(engine *e, seq *s);
void eng_finish_seq(engine *e, seq *s, engine_finish why, int32_t token, float lp, int n_top,
                    const int32_t *ids, const float *lps);
/* Handles one sampled token: stop conditions, text streaming. */
/* A prompt progress event for s (engine_request.progress), until its first token. */
void eng_emit_progress(seq *s);
void eng_on_token(engine *e, seq *s, int32_t tok, float lp, int n_top, const int32_t *ids,
                  const float *lps);

/* engine_sched.c */
void eng_running_remove(engine *e, int idx);
void eng_seq_forget_kv(engine *e, seq *s);
bool eng_prefix_attach(engine *e, seq *s);
bool eng_seq_loading(const engine *e, const seq *s);
void eng_drop_cancelled(engine *e);
void eng_draft_all(engine *e, const step_plan *p);
void eng_plan_step(engine *e, step_plan *p);

/* engine_step.c */
/* Finishes every step in flight (before the engine goes away). */
void eng_drain_steps(engine *e);

#endif
