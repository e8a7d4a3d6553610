/* cli_pp: the command line's side of pipeline-parallel runs (--pp, engine/pp.h).
 * Every rank parses the same argv and opens the same file; each loads only
 * its layers. Rank 0 goes on with the command, the model's forwards going
 * through the pipeline; the other ranks serve them here and exit. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static int g_pp_rank = -1;
static int g_first[PP_MAX_RANKS], g_end[PP_MAX_RANKS]; /* the layer split */
static pp_stage *g_open_stage;                         /* rank 0's, until cli_pp_detach */

/* Leaving without cli_unload (an error return after loading): the other
 * ranks still wait for steps, so they are told the pipeline is closed. */
static void pp_at_exit(void) {
    if (g_open_stage) pp_stage_destroy(g_open_stage);
    g_open_stage = NULL;
    pp_finalize();
}

/* A rank stopped answering. `serve` waits for SIGTERM with it blocked in
 * every thread: sending it makes the server fail what is in flight, drain
 * and exit, and pp_finalize then ends the whole job. run and bench get the
 * error from the forward and exit by themselves. */
static void on_broken(void *user) {
    (void)user;
    sigset_t cur;
    if (pthread_sigmask(SIG_BLOCK, NULL, &cur) == 0 && sigismember(&cur, SIGTERM))
        kill(getpid(), SIGTERM);
}

int cli_pp_rank(void) { return g_pp_rank < 0 ? 0 : g_pp_rank; }

int cli_step_groups(const cli_opts *o) {
    if (o->pp_groups > 0) return o->pp_groups;
    if (o->pp <= 1) return 1;
    return o->pp < ENGINE_MAX_STEP_GROUPS ? o->pp : ENGINE_MAX_STEP_GROUPS;
}

bool cli_pp_prepare(const cli_opts *o, const gguf_file *f, model_params *mp) {
    if (o->pp <= 0) return true;
    kvl_error err = {{0}};
    if (o->spec != ENGINE_SPEC_OFF || o->model_draft) {
        fprintf(stderr, "kvllm: --pp: speculative decoding (--spec, --model-draft) is not "
                        "available with a pipeline\n");
        return false;
    }
    int rank = 0;
    bool ok = pp_init(o->pp, &rank, &err);
    if (g_pp_rank < 0 && pp_available()) atexit(pp_at_exit);
    g_pp_rank = rank;
    int first[PP_MAX_RANKS], end[PP_MAX_RANKS];
    if (ok) ok = pp_split(f, o->pp, o->pp_layers, first, end, &err);
    if (!ok) {
        if (rank == 0) fprintf(stderr, "kvllm: %s\n", err.msg);
        if (pp_available() && o->pp > 1) pp_abort(1); /* the other ranks would wait for us */
        return false;
    }
    if (rank == 0) {
        fprintf(stderr, "kvllm: pipeline of %d ranks, layers", o->pp);
        for (int r = 0; r < o->pp; r++)
            fprintf(stderr, "%s %d-%d", r ? "," : "", first[r], end[r] - 1);
        fprintf(stderr, "\n");
    }
    memcpy(g_first, first, sizeof first);
    memcpy(g_end, end, sizeof end);
    mp->layer_first = first[rank];
    mp->layer_end = end[rank];
    return true;
}

bool cli_pp_attach(const cli_opts *o, cli_model *cm) {
    if (o->pp <= 0) return true;
    kvl_error err = {{0}};
    pp_config pc = {.timeout_s = o->pp_timeout, .micro = o->pp_micro, .on_broken = on_broken};
    cm->pp = pp_stage_create(cm->m, &pc, &err);
    if (!cm->pp) {
        fprintf(stderr, "kvllm: rank %d: %s\n", g_pp_rank, err.msg);
        pp_abort(1);
    }
    if (g_pp_rank == 0) {
        g_open_stage = cm->pp;
        return true;
    }
    /* mpirun passes a Ctrl-C or SIGTERM to every rank: rank 0 drains its
     * requests, which needs the others, and then closes the pipeline */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    /* a worker: serve rank 0's steps, then leave with the job */
    bool ok = pp_worker_run(cm->pp, &err);
    if (!ok) {
        fprintf(stderr, "kvllm: rank %d: %s\n", g_pp_rank, err.msg);
        pp_abort(1);
    }
    if (getenv("KVLLM_PP_STATS")) {
        pp_stats st;
        pp_stage_stats(cm->pp, &st);
        fprintf(stderr,
                "kvllm: rank %d: %lld steps, %lld tokens, sent %lld hidden + %lld logits bytes, "
                "waited %.3f s\n",
                g_pp_rank, (long long)st.steps, (long long)st.tokens, (long long)st.hidden_bytes,
                (long long)st.logits_bytes, st.wait_s);
    }
    cli_unload(cm);
    pp_finalize();
    exit(0);
}

void cli_pp_report_kv(const cli_model *cm, const engine_req_stats *s) {
    if (!cm->pp || g_pp_rank != 0) return;
    int64_t all = 0;
    fprintf(stderr, "KV allocated       by rank:");
    for (int r = 0; r < pp_job_size(); r++) {
        int64_t bb[MODEL_MAX_KV_GROUPS], bytes = 0;
        int n = 0;
        if (!pp_stage_kv_block_bytes(cm->pp, r, bb, &n)) return;
        for (int g = 0; g < n && g < s->n_kv_groups; g++) bytes += s->kv_group[g].blocks * bb[g];
        fprintf(stderr, "%s rank %d %lld bytes", r ? "," : "", r, (long long)bytes);
        all += bytes;
    }
    fprintf(stderr, "; all ranks %lld bytes\n", (long long)all);
}

bool cli_pp_kv_size(const cli_model *cm, engine_config *ec, bool size_pool, int64_t kv_memory,
                    double fraction, int64_t *rank_bytes, int *n_ranks) {
    const int G = model_kv_n_groups(cm->m), R = pp_job_size();
    kv_pool_config groups[MODEL_MAX_KV_GROUPS];
    for (int g = 0; g < G; g++) {
        model_kv_group_shape(cm->m, g, &groups[g], NULL);
        groups[g].block_size = ec->block_size;
        groups[g].dtype = ec->kv_dtype;
        groups[g].split_v = ec->kv_dtype_v >= 0;
        groups[g].dtype_v = ec->kv_dtype_v;
    }
    pp_rank_mem ranks[PP_MAX_RANKS];
    int64_t fit[PP_MAX_RANKS];
    kvl_error err = {{0}};
    if (!pp_stage_kv_probe(cm->pp, groups, G, ranks, &err)) {
        fprintf(stderr, "kvllm serve: %s\n", err.msg);
        return false;
    }
    *n_ranks = R;
    for (int r = 0; r < R; r++)
        for (int g = 0; g < MODEL_MAX_KV_GROUPS; g++)
            rank_bytes[r * MODEL_MAX_KV_GROUPS + g] = g < G ? ranks[r].group_bytes[g] : 0;
    if (!size_pool) return true;
    const int64_t least = pp_kv_blocks_fit(ranks, R, kv_memory, fraction, fit);
    const int64_t per_seq = (ec->n_ctx + ec->block_size - 1) / ec->block_size;
    const int64_t want = per_seq * ec->max_seqs;
    int binding = 0;
    for (int r = 0; r < R; r++) {
        if (fit[r] >= 0 && fit[r] < fit[binding]) binding = r;
        int64_t host = 0; /* bytes per block of the ranks on this rank's host */
        for (int s = 0; s < R; s++)
            if (ranks[s].host == ranks[r].host) host += ranks[s].block_bytes;
        char budget[160];
        if (kv_memory > 0)
            snprintf(budget, sizeof budget, "--kv-memory %lld bytes", (long long)kv_memory);
        else if (ranks[r].mem_available < 0)
            snprintf(budget, sizeof budget, "available memory unknown");
        else
            snprintf(budget, sizeof budget,
                     "%g x available memory %.1f MiB for %lld bytes per block on its host",
                     fraction, (double)ranks[r].mem_available / 1048576.0, (long long)host);
        fprintf(stderr,
                "kvllm serve: rank %d (layers %d-%d): %lld bytes per KV block; %s -> %lld "
                "blocks fit\n",
                r, g_first[r], g_end[r] - 1, (long long)ranks[r].block_bytes, budget,
                (long long)fit[r]);
    }
    int64_t n = least;
    if (least < 0) { /* as one process: sized for max_seqs sequences */
        fprintf(stderr,
                "kvllm serve: a rank cannot read its available memory: KV pool sized for %d "
                "full-context sequences\n",
                ec->max_seqs);
        n = want;
    } else if (kv_memory > 0 ? least < 1 : least < per_seq) {
        fprintf(stderr,
                "kvllm serve: rank %d holds %lld KV blocks, less than %s (%lld); lower -c, use "
                "--kv-type q8_0, move layers off it with --pp-layers, or set --kv-memory / "
                "--kv-blocks\n",
                binding, (long long)least, kv_memory > 0 ? "one block" : "one sequence needs",
                (long long)(kv_memory > 0 ? 1 : per_seq));
        return false;
    } else if (kv_memory <= 0 && n > want) {
        n = want;
    }
    if (least >= 0 && n == least)
        fprintf(stderr, "kvllm serve: KV pool %lld blocks on every rank: the least, rank %d's\n",
                (long long)n, binding);
    else if (least >= 0)
        fprintf(stderr,
                "kvllm serve: KV pool %lld blocks on every rank: capped at --max-seqs "
                "full-context sequences\n",
                (long long)n);
    ec->n_blocks = n;
    return true;
}

void cli_pp_detach(cli_model *cm) {
    if (!cm->pp) return;
    if (g_pp_rank == 0 && getenv("KVLLM_PP_STATS")) {
        pp_stats st;
        pp_stage_stats(cm->pp, &st);
        fprintf(stderr,
                "kvllm: rank 0: %lld steps, %lld tokens, sent %lld hidden + %lld descriptor bytes, "
                "waited %.3f s\n",
                (long long)st.steps, (long long)st.tokens, (long long)st.hidden_bytes,
                (long long)st.ctrl_bytes, st.wait_s);
    }
    pp_stage_destroy(cm->pp);
    if (g_open_stage == cm->pp) g_open_stage = NULL;
    cm->pp = NULL;
}
