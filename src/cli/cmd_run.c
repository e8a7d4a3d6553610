/* kvllm run: generate from one prompt, streaming text (or JSON events) to
 * stdout and a summary (timings, KV lower bound vs allocated) to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct run_state {
    const cli_opts *o;
    const tok_vocab *vocab;
    engine_req_stats stats;
    engine_finish finish;
    bool done;
} run_state;

static const char *finish_name(engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_CANCELLED: return "cancelled";
    case ENGINE_FINISH_ERROR: return "error";
    default: return "none";
    }
}

static void print_token_json(run_state *st, const engine_event *ev) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "id", ev->token);
    cJSON_AddItemToObject(j, "text", cli_bytes_json(ev->text, ev->text_len));
    cJSON_AddItemToObject(j, "piece", cli_token_text_json(st->vocab, ev->token));
    cJSON_AddNumberToObject(j, "logprob", ev->logprob);
    cJSON *top = cJSON_AddArrayToObject(j, "top_logprobs");
    for (int i = 0; i < ev->n_top; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", ev->top_ids[i]);
        cJSON_AddItemToObject(t, "text", cli_token_text_json(st->vocab, ev->top_ids[i]));
        cJSON_AddNumberToObject(t, "logprob", ev->top_logprobs[i]);
        cJSON_AddItemToArray(top, t);
    }
    cli_print_json(j);
}

static void on_event(const engine_event *ev, void *user) {
    run_state *st = user;
    if (st->o->json) {
        if (ev->token >= 0) print_token_json(st, ev);
    } else if (ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
    }
    if (ev->finish != ENGINE_FINISH_NONE) {
        st->stats = *ev->stats;
        st->finish = ev->finish;
        st->done = true;
    }
}

static void report(const run_state *st, const engine *e, const cli_opts *o) {
    const engine_req_stats *s = &st->stats;
    const kv_pool_config *kc = kv_pool_cfg(engine_kv((engine *)e));
    double ttft = s->t_first_token - s->t_submit;
    double decode_s = s->t_end - s->t_first_token;
    int64_t n_dec = s->n_generated > 1 ? s->n_generated - 1 : 0;
    double prefill_tps = ttft > 0 ? s->n_prompt / ttft : 0;
    double decode_tps = decode_s > 0 ? n_dec / decode_s : 0;
    double tpot_ms = n_dec ? decode_s * 1e3 / n_dec : 0;
    const char *kvt = kv_dtype_name(kc->dtype);
    const engine_metrics em = engine_get_metrics(e);
    if (o->json) {
        cJSON *j = cJSON_CreateObject(), *js = cJSON_CreateObject();
        cJSON_AddBoolToObject(j, "done", 1);
        cJSON_AddStringToObject(js, "finish_reason", finish_name(st->finish));
        cJSON_AddNumberToObject(js, "prompt_tokens", (double)s->n_prompt);
        cJSON_AddNumberToObject(js, "generated_tokens", (double)s->n_generated);
        cJSON_AddNumberToObject(js, "ttft_ms", ttft * 1e3);
        cJSON_AddNumberToObject(js, "prefill_tokens_per_s", prefill_tps);
        cJSON_AddNumberToObject(js, "decode_tokens_per_s", decode_tps);
        cJSON_AddNumberToObject(js, "tpot_ms", tpot_ms);
        cJSON_AddNumberToObject(js, "kv_tokens", (double)s->kv.tokens);
        cJSON_AddNumberToObject(js, "kv_lower_bound_bytes", (double)s->kv.lower_bound_bytes);
        cJSON_AddNumberToObject(js, "kv_allocated_bytes", (double)s->kv.allocated_bytes);
        cJSON_AddNumberToObject(js, "kv_blocks", (double)s->kv.blocks);
        cJSON_AddNumberToObject(js, "block_size", kc->block_size);
        cJSON_AddStringToObject(js, "kv_type", kvt);
        cJSON_AddBoolToObject(js, "kv_cache", !o->no_kv_cache);
        cJSON_AddNumberToObject(js, "spec_draft_tokens", (double)em.spec_draft_tokens);
        cJSON_AddNumberToObject(js, "spec_accepted_tokens", (double)em.spec_accepted_tokens);
        cJSON_AddNumberToObject(js, "spec_drafts", (double)em.spec_drafts);
        cJSON_AddStringToObject(js, "engine_version", KVLLM_VERSION);
        cJSON *groups = cJSON_AddArrayToObject(js, "kv_groups");
        for (int g = 0; g < s->n_kv_groups; g++) {
            cJSON *jg = cJSON_CreateObject();
            cJSON_AddNumberToObject(jg, "window", s->kv_group_window[g]);
            cJSON_AddNumberToObject(jg, "chunk", s->kv_group_chunk[g]);
            cJSON_AddNumberToObject(jg, "blocks", (double)s->kv_group[g].blocks);
            cJSON_AddNumberToObject(jg, "lower_bound_bytes",
                                    (double)s->kv_group[g].lower_bound_bytes);
            cJSON_AddNumberToObject(jg, "allocated_bytes", (double)s->kv_group[g].allocated_bytes);
            cJSON_AddItemToArray(groups, jg);
        }
        cJSON_AddItemToObject(j, "stats", js);
        cli_print_json(j);
        return;
    }
    fprintf(stderr,
            "\n\n--- kvllm %s: %s\n"
            "prompt tokens      %lld\n"
            "generated tokens   %lld (finish: %s)\n"
            "TTFT               %.2f ms   (prefill %.1f tokens/s)\n"
            "decode             %.1f tokens/s   (TPOT %.3f ms)%s\n"
            "KV lower bound     %zu bytes (calculated: 2 x L x n_kv x d_head x bytes per token, T "
            "%lld%s)\n"
            "KV allocated       %zu bytes (measured: %lld blocks, block size %d, %s)\n",
            KVLLM_VERSION, o->model_path ? o->model_path : "models/stories260K.gguf",
            (long long)s->n_prompt, (long long)s->n_generated, finish_name(st->finish), ttft * 1e3,
            prefill_tps, decode_tps, tpot_ms, o->no_kv_cache ? "   [no KV cache: recomputing]" : "",
            s->kv.lower_bound_bytes, (long long)s->kv.tokens,
            s->n_kv_groups > 1 ? ", sliding layers capped at their window" : "",
            s->kv.allocated_bytes, (long long)s->kv.blocks, kc->block_size, kvt);
    if (em.spec_drafts > 0)
        fprintf(stderr,
                "speculation        %lld drafted, %lld accepted (%.1f%%) in %lld verifications\n",
                (long long)em.spec_draft_tokens, (long long)em.spec_accepted_tokens,
                100.0 * (double)em.spec_accepted_tokens / (double)em.spec_draft_tokens,
                (long long)em.spec_drafts);
}

static int run(const cli_opts *o, cli_model *cm, int32_t *ids, int64_t n_ids) {
    if (n_ids == 0) {
        if (tok_bos(cm->vocab) < 0) {
            fprintf(stderr, "kvllm: empty prompt and the vocabulary has no BOS token\n");
            return 1;
        }
        ids[0] = tok_bos(cm->vocab); /* generate from BOS alone */
        n_ids = 1;
    }
    int rc = 1;
    engine_config ec;
    cli_engine_config(o, cm, &ec);
    ec.max_seqs = 1;
    kvl_error err = {{0}};
    engine *e = engine_create(cm->m, cm->vocab, &ec, &err);
    if (!e) {
        fprintf(stderr, "kvllm: %s\n", err.msg);
        return 1;
    }
    run_state st = {.o = o, .vocab = cm->vocab};
    engine_request r = o->req; /* -n, the sampling flags, --stop, --top-logprobs, --ignore-eos */
    r.prompt = ids;
    r.n_prompt = n_ids;
    r.stop = o->stop;
    r.logprobs = o->json;
    r.on_event = on_event;
    r.user = &st;
    if (engine_submit(e, &r, &err) < 0) {
        fprintf(stderr, "kvllm: %s\n", err.msg);
        goto out;
    }
    while (!st.done) {
        if (!engine_step(e, &err)) {
            fprintf(stderr, "kvllm: %s\n", err.msg);
            goto out;
        }
    }
    report(&st, e, o);
    cli_pp_report_kv(cm, &st.stats);
    rc = 0;
out:
    engine_destroy(e);
    return rc;
}

int cmd_run(int argc, char **argv) {
    for (int i = 0; i < argc; i++) /* llama-cli's conversation mode */
        if (strcmp(argv[i], "-cnv") == 0 || strcmp(argv[i], "--conversation") == 0)
            return cmd_chat(argc, argv);
    return cli_run_prompt(argc, argv, NULL, NULL, true, run);
}
