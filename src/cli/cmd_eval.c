/* kvllm score / perplexity: teacher-forced evaluation of token sequences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct score_state {
    const cli_opts *o;
    const tok_vocab *vocab;
    const int32_t *ids;
    int64_t n;
    int32_t n_vocab;
    int32_t *top_ids; /* [top_logprobs] */
    float *top_lp;
} score_state;

static void score_position(int64_t pos, const float *logits, void *user) {
    score_state *st = user;
    int32_t *top_ids = st->top_ids;
    float *top_lp = st->top_lp;
    int k = logits_top_k(logits, st->n_vocab, st->o->top_logprobs, top_ids, top_lp);
    double lse = logits_logsumexp(logits, st->n_vocab);
    bool has_next = pos + 1 < st->n;
    if (!st->o->json) {
        printf("%6lld %8d", (long long)pos, st->ids[pos]);
        if (has_next)
            printf("  next %8d logprob %10.5f", st->ids[pos + 1], logits[st->ids[pos + 1]] - lse);
        for (int i = 0; i < k; i++) printf("  %d:%.5f", top_ids[i], top_lp[i]);
        printf("\n");
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "pos", (double)pos);
    cJSON_AddNumberToObject(j, "id", st->ids[pos]);
    if (has_next) {
        cJSON_AddNumberToObject(j, "next_id", st->ids[pos + 1]);
        cJSON_AddNumberToObject(j, "next_logprob", logits[st->ids[pos + 1]] - lse);
    }
    cJSON *top = cJSON_AddArrayToObject(j, "top_logprobs");
    for (int i = 0; i < k; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", top_ids[i]);
        cJSON_AddItemToObject(t, "text", cli_token_text_json(st->vocab, top_ids[i]));
        cJSON_AddNumberToObject(t, "logprob", top_lp[i]);
        cJSON_AddItemToArray(top, t);
    }
    cli_print_json(j);
}

static int cmd_score_opts(const cli_opts *o);

int cmd_score(int argc, char **argv) {
    cli_opts o;
    if (!cli_parse(argc, argv, &o)) return 2;
    return cmd_score_opts(&o);
}

static int cmd_score_opts(const cli_opts *o) {
    cli_model cm;
    if (!cli_load(o, true, &cm)) return 1;
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = 1;
    bool add_bos = tok_add_bos(cm.vocab) && !o->no_bos;
    if (!cli_prompt_ids(o, cm.vocab, add_bos, &ids, &n)) goto out;
    int64_t ctx = o->n_ctx > 0 ? o->n_ctx : model_hp(cm.m)->n_ctx_train;
    if (n == 0 || n > ctx) {
        fprintf(stderr, "kvllm: score: %lld tokens (need 1..%lld, the context size)\n", (long long)n,
                (long long)ctx);
        goto out;
    }
    score_state st = {.o = o, .vocab = cm.vocab, .ids = ids, .n = n,
                      .n_vocab = (int32_t)model_hp(cm.m)->n_vocab};
    st.top_ids = malloc((o->top_logprobs + 1) * sizeof(int32_t));
    st.top_lp = malloc((o->top_logprobs + 1) * sizeof(float));
    kvl_error err = {{0}};
    if (!st.top_ids || !st.top_lp) {
        fprintf(stderr, "kvllm: out of memory\n");
    } else if (!engine_eval(cm.m, o->kv_dtype, o->block_size, ids, n, score_position, &st, &err)) {
        fprintf(stderr, "kvllm: %s\n", err.msg);
    } else {
        rc = 0;
    }
    free(st.top_ids);
    free(st.top_lp);
out:
    free(ids);
    cli_unload(&cm);
    return rc;
}

/* Perplexity, llama-perplexity's way: the text is tokenized once; chunk k is
 * tokens [k*c, (k+1)*c) with its first token replaced by BOS when the vocab adds
 * BOS; each chunk starts from an empty cache; only the second half is scored:
 * the tokens at positions c/2+1 .. c-1, predicted from positions c/2 .. c-2. */
typedef struct ppl_state {
    const int32_t *chunk;
    int64_t c, first;
    int32_t n_vocab;
    double nll;
    int64_t count;
} ppl_state;

static void ppl_position(int64_t pos, const float *logits, void *user) {
    ppl_state *st = user;
    if (pos < st->first || pos + 1 >= st->c) return;
    st->nll -= logits[st->chunk[pos + 1]] - logits_logsumexp(logits, st->n_vocab);
    st->count++;
}

static int cmd_perplexity_opts(const cli_opts *o);

int cmd_perplexity(int argc, char **argv) {
    cli_opts o;
    if (!cli_parse(argc, argv, &o)) return 2;
    return cmd_perplexity_opts(&o);
}

static int cmd_perplexity_opts(const cli_opts *o) {
    cli_model cm;
    if (!cli_load(o, true, &cm)) return 1;
    int32_t *ids = NULL, *chunk = NULL;
    int64_t n = 0;
    int rc = 1;
    cJSON *chunks_json = cJSON_CreateArray();
    bool add_bos = tok_add_bos(cm.vocab) && !o->no_bos;
    if (!cli_prompt_ids(o, cm.vocab, add_bos, &ids, &n)) goto out;
    int64_t c = o->n_ctx > 0 ? o->n_ctx : 512;
    if (n < 2 * c) {
        fprintf(stderr, "kvllm: perplexity: need at least %lld tokens (2 x context %lld), the text has %lld\n",
                (long long)(2 * c), (long long)c, (long long)n);
        goto out;
    }
    int64_t n_chunks = n / c;
    chunk = malloc(c * sizeof *chunk);
    double total_nll = 0;
    int64_t total_count = 0;
    for (int64_t k = 0; chunk && k < n_chunks; k++) {
        memcpy(chunk, ids + k * c, c * sizeof *chunk);
        if (add_bos) chunk[0] = tok_bos(cm.vocab);
        ppl_state st = {.chunk = chunk, .c = c, .first = c / 2,
                        .n_vocab = (int32_t)model_hp(cm.m)->n_vocab};
        kvl_error err = {{0}};
        if (!engine_eval(cm.m, o->kv_dtype, o->block_size, chunk, c, ppl_position, &st, &err)) {
            fprintf(stderr, "kvllm: %s\n", err.msg);
            goto out;
        }
        total_nll += st.nll;
        total_count += st.count;
        cJSON_AddItemToArray(chunks_json, cJSON_CreateNumber(st.nll / st.count));
        if (!o->json)
            fprintf(stderr, "[%lld]%.4f ", (long long)k + 1, exp(total_nll / total_count));
    }
    double ppl = exp(total_nll / total_count);
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "final_ppl", ppl);
        cJSON_AddNumberToObject(j, "mean_nll", total_nll / total_count);
        cJSON_AddNumberToObject(j, "n_ctx", (double)c);
        cJSON_AddNumberToObject(j, "n_chunks", (double)n_chunks);
        cJSON_AddNumberToObject(j, "n_tokens", (double)n);
        cJSON_AddItemToObject(j, "per_chunk_mean_nll", chunks_json);
        chunks_json = NULL;
        cli_print_json(j);
    } else {
        printf("\nFinal estimate: PPL = %.4f (%lld chunks of %lld tokens)\n", ppl, (long long)n_chunks,
               (long long)c);
    }
    rc = 0;
out:
    cJSON_Delete(chunks_json);
    free(chunk);
    free(ids);
    cli_unload(&cm);
    return rc;
}
