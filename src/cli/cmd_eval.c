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
    int k = logits_top_k(logits, st->n_vocab, st->o->req.top_logprobs, top_ids, top_lp);
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

static int score(const cli_opts *o, cli_model *cm, int32_t *ids, int64_t n) {
    int64_t ctx = o->n_ctx > 0 ? o->n_ctx : cli_default_ctx(model_hp(cm->m));
    if (n == 0 || n > ctx) {
        fprintf(stderr, "kvllm: score: %lld tokens (need 1..%lld, the context size)\n",
                (long long)n, (long long)ctx);
        return 1;
    }
    int rc = 1;
    score_state st = {.o = o,
                      .vocab = cm->vocab,
                      .ids = ids,
                      .n = n,
                      .n_vocab = (int32_t)model_hp(cm->m)->n_vocab};
    st.top_ids = malloc((o->req.top_logprobs + 1) * sizeof(int32_t));
    st.top_lp = malloc((o->req.top_logprobs + 1) * sizeof(float));
    kvl_error err = {{0}};
    if (!st.top_ids || !st.top_lp) {
        fprintf(stderr, "kvllm: out of memory\n");
    } else if (!engine_eval(cm->m, o->kv_dtype, o->kv_dtype_v, o->block_size, ids, n,
                            score_position, &st, &err)) {
        fprintf(stderr, "kvllm: %s\n", err.msg);
    } else {
        rc = 0;
    }
    free(st.top_ids);
    free(st.top_lp);
    return rc;
}

int cmd_score(int argc, char **argv) { return cli_run_prompt(argc, argv, NULL, NULL, true, score); }

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
    /* --kl-base: the base run stores its log-probabilities, the test run compares */
    float *base_lp; /* [c - first][n_vocab] or NULL */
    bool comparing;
    double kl;
    int64_t top1_agree;
} ppl_state;

static int32_t argmax_f(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* KL(base || test) over the full vocabulary, and whether both pick the same top token. */
static void compare_to_base(ppl_state *st, const float *base, const float *logits, double lse) {
    double kl = 0;
    for (int32_t i = 0; i < st->n_vocab; i++) {
        double lb = base[i], lt = logits[i] - lse;
        kl += exp(lb) * (lb - lt);
    }
    st->kl += kl;
    st->top1_agree += argmax_f(base, st->n_vocab) == argmax_f(logits, st->n_vocab);
}

static void ppl_position(int64_t pos, const float *logits, void *user) {
    ppl_state *st = user;
    if (pos < st->first || pos + 1 >= st->c) return;
    double lse = logits_logsumexp(logits, st->n_vocab);
    if (st->base_lp) {
        float *base = st->base_lp + (pos - st->first) * st->n_vocab;
        if (!st->comparing) {
            for (int32_t i = 0; i < st->n_vocab; i++) base[i] = (float)(logits[i] - lse);
            return; /* the base run only records */
        }
        compare_to_base(st, base, logits, lse);
    }
    st->nll -= logits[st->chunk[pos + 1]] - lse;
    st->count++;
}
static int kl_base_dtype = -1;
static int64_t max_chunks = -1; /* --chunks N (llama-perplexity's): at most N chunks */

static int perplexity_flag(const char *flag, const char *value, void *ctx) {
    (void)ctx;
    if (strcmp(flag, "--chunks") == 0) {
        char *end = NULL;
        const long long v = value ? strtoll(value, &end, 10) : 0;
        if (!value || !*value || *end || v < -1) {
            fprintf(stderr, "kvllm: --chunks: a number of chunks (-1: all)\n");
            return -1;
        }
        max_chunks = v;
        return 2;
    }
    if (strcmp(flag, "--kl-base") != 0) return 0;
    if (!value || !kv_dtype_parse(value, &kl_base_dtype)) {
        fprintf(stderr, "kvllm: --kl-base: expected a KV type (f32, f16, bf16, q8_0, q5_0, q4_0, "
                        "iq4_nl, fp8)\n");
        return -1;
    }
    return 2;
}

static int perplexity(const cli_opts *o, cli_model *cm, int32_t *ids, int64_t n) {
    int32_t *chunk = NULL;
    int rc = 1;
    cJSON *chunks_json = cJSON_CreateArray();
    const bool add_bos = cli_add_bos(o, cm->vocab);
    int64_t c = o->n_ctx > 0 ? o->n_ctx : 512;
    if (n < 2 * c) {
        fprintf(
            stderr,
            "kvllm: perplexity: need at least %lld tokens (2 x context %lld), the text has %lld\n",
            (long long)(2 * c), (long long)c, (long long)n);
        goto out;
    }
    int64_t n_chunks = n / c;
    if (max_chunks >= 0 && max_chunks < n_chunks) n_chunks = max_chunks; /* llama's --chunks */
    chunk = malloc(c * sizeof *chunk);
    double total_nll = 0, total_kl = 0;
    int64_t total_count = 0, total_agree = 0;
    int32_t V = (int32_t)model_hp(cm->m)->n_vocab;
    float *base_lp = kl_base_dtype >= 0 ? malloc((size_t)(c - c / 2) * V * sizeof(float)) : NULL;
    if (kl_base_dtype >= 0 && !base_lp) {
        fprintf(stderr, "kvllm: out of memory\n");
        goto out;
    }
    for (int64_t k = 0; chunk && k < n_chunks; k++) {
        memcpy(chunk, ids + k * c, c * sizeof *chunk);
        if (add_bos) chunk[0] = tok_bos(cm->vocab);
        ppl_state st = {.chunk = chunk, .c = c, .first = c / 2, .n_vocab = V, .base_lp = base_lp};
        kvl_error err = {{0}};
        bool ok = !base_lp || engine_eval(cm->m, kl_base_dtype, -1, o->block_size, chunk, c,
                                          ppl_position, &st, &err);
        st.comparing = true;
        ok = ok && engine_eval(cm->m, o->kv_dtype, o->kv_dtype_v, o->block_size, chunk, c,
                               ppl_position, &st, &err);
        if (!ok) {
            fprintf(stderr, "kvllm: %s\n", err.msg);
            free(base_lp);
            goto out;
        }
        total_nll += st.nll;
        total_count += st.count;
        total_kl += st.kl;
        total_agree += st.top1_agree;
        cJSON_AddItemToArray(chunks_json, cJSON_CreateNumber(st.nll / st.count));
        if (!o->json)
            fprintf(stderr, "[%lld]%.4f ", (long long)k + 1, exp(total_nll / total_count));
    }
    free(base_lp);
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
        cJSON_AddStringToObject(j, "kv_type", kv_dtype_name(o->kv_dtype));
        if (kl_base_dtype >= 0) {
            cJSON_AddStringToObject(j, "kl_base", kv_dtype_name(kl_base_dtype));
            cJSON_AddNumberToObject(j, "mean_kl", total_kl / total_count);
            cJSON_AddNumberToObject(j, "top1_agreement", (double)total_agree / total_count);
        }
        cli_print_json(j);
    } else {
        printf("\nFinal estimate: PPL = %.4f (%lld chunks of %lld tokens, KV %s)\n", ppl,
               (long long)n_chunks, (long long)c, kv_dtype_name(o->kv_dtype));
        if (kl_base_dtype >= 0)
            printf("against KV %s: mean KL divergence %.6g nats, top-1 agreement %.2f%%\n",
                   kv_dtype_name(kl_base_dtype), total_kl / total_count,
                   100.0 * total_agree / total_count);
    }
    rc = 0;
out:
    cJSON_Delete(chunks_json);
    free(chunk);
    return rc;
}

int cmd_perplexity(int argc, char **argv) {
    return cli_run_prompt(argc, argv, perplexity_flag, NULL, true, perplexity);
}
