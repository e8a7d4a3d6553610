/* kv-plan --pp N: the plan per pipeline rank. Each rank keeps the weights and
 * the KV of its own layers (engine/pp.h), with the same block ids and so the
 * same sequences as every other rank: the job holds as many sequences as its
 * fullest rank allows. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "hparams.h"
#include "kv_plan.h"
#include "units.h"

#define FB(x) kvl_fmt_binary((x), (char[96]){0}, 96)

bool kv_plan_print_pp(const cli_opts *o, const kv_plan_model *m, const kv_plan_request *r,
                      const char *gguf_path, cJSON *json) {
    const int n = o->pp;
    int first[PP_MAX_RANKS], end[PP_MAX_RANKS];
    int64_t bytes[PP_MAX_RANKS], swa[PP_MAX_RANKS] = {0}, chunk[PP_MAX_RANKS] = {0};
    kvl_error err = {{0}};
    bool exact = false;
    if (gguf_path) { /* the file's own split, by bytes, and which layers slide or chunk */
        gguf_file *f = gguf_open(gguf_path, &err);
        model_hparams hp;
        if (f && !cli_apply_overrides(o, f)) {
            gguf_close(f);
            return false;
        }
        bool ok = f && pp_split_bytes(f, n, o->pp_layers, first, end, bytes, &err) &&
                  model_hparams_from_gguf(f, &hp, &err);
        for (int k = 0; ok && k < n; k++)
            for (int il = first[k]; il < end[k]; il++) {
                int64_t dk, dv, w;
                model_hparams_layer_kv(&hp, il, &dk, &dv, &w);
                swa[k] += w > 0;
                chunk[k] += hp.chunk_layers[il] != 0;
            }
        gguf_close(f);
        if (!ok) {
            fprintf(stderr, "kvllm kv-plan: %s\n", err.msg);
            return false;
        }
        exact = true;
    } else {
        if (!pp_split_layers((int)m->n_layers, n, o->pp_layers, first, end, &err)) {
            fprintf(stderr, "kvllm kv-plan: %s\n", err.msg);
            return false;
        }
        for (int k = 0; k < n; k++) {
            const int64_t lk = end[k] - first[k];
            bytes[k] = (int64_t)((double)r->weights_bytes * (double)lk / (double)m->n_layers);
            swa[k] = (m->n_swa_layers * end[k]) / m->n_layers -
                     (m->n_swa_layers * first[k]) / m->n_layers;
            chunk[k] = (m->n_chunk_layers * end[k]) / m->n_layers -
                       (m->n_chunk_layers * first[k]) / m->n_layers;
        }
    }
    cJSON *ranks = NULL;
    if (json) {
        cJSON_AddNumberToObject(json, "ranks", n);
        cJSON_AddStringToObject(json, "weights_source", exact ? "file" : "proportional");
        ranks = cJSON_AddArrayToObject(json, "per_rank");
    } else {
        printf("\npipeline       --pp %d: each rank holds its layers' weights and KV; %s\n", n,
               exact ? "weights from the file's tensors (the last rank adds the output head)"
                     : "weights split in proportion to the layers (no file)");
        printf("  rank  layers       weights      KV (T x B)   total        fits  max sequences "
               "at T\n");
    }
    int64_t worst = -1;
    bool all_fit = true;
    for (int k = 0; k < n; k++) {
        kv_plan_model mk = *m;
        mk.n_layers = end[k] - first[k];
        mk.n_swa_layers = swa[k];
        mk.n_chunk_layers = chunk[k];
        kv_plan_request rk = *r;
        rk.weights_bytes = (uint64_t)bytes[k];
        kv_plan pk;
        if (!kv_plan_compute(&mk, &rk, &pk, &err)) {
            fprintf(stderr, "kvllm kv-plan: rank %d: %s\n", k, err.msg);
            return false;
        }
        if (r->budget_bytes) {
            all_fit = all_fit && pk.fits;
            if (worst < 0 || pk.max_concurrency < worst) worst = pk.max_concurrency;
        }
        if (json) {
            cJSON *jr = cJSON_CreateObject();
            cJSON_AddNumberToObject(jr, "rank", k);
            cJSON_AddNumberToObject(jr, "layer_first", first[k]);
            cJSON_AddNumberToObject(jr, "layer_last", end[k] - 1);
            cJSON_AddNumberToObject(jr, "weights_bytes", (double)pk.weights_bytes);
            cJSON_AddNumberToObject(jr, "kv_bytes", (double)pk.allocated_bytes);
            cJSON_AddNumberToObject(jr, "kv_metadata_bytes", (double)pk.metadata_bytes);
            cJSON_AddNumberToObject(jr, "total_bytes", (double)pk.total_bytes);
            if (r->budget_bytes) {
                cJSON_AddBoolToObject(jr, "fits", pk.fits);
                cJSON_AddNumberToObject(jr, "max_concurrency", (double)pk.max_concurrency);
            }
            cJSON_AddItemToArray(ranks, jr);
            continue;
        }
        char range[32];
        snprintf(range, sizeof range, "%d-%d", first[k], end[k] - 1);
        printf("  %-5d %-12s %-12s %-12s %-12s ", k, range, FB(pk.weights_bytes),
               FB(pk.allocated_bytes + pk.metadata_bytes), FB(pk.total_bytes));
        if (r->budget_bytes)
            printf("%-5s %lld\n", pk.fits ? "yes" : "no", (long long)pk.max_concurrency);
        else printf("-     - (no --budget)\n");
    }
    if (json) {
        if (r->budget_bytes) {
            cJSON_AddBoolToObject(json, "fits", all_fit);
            cJSON_AddNumberToObject(json, "max_concurrency", (double)worst);
        }
        return true;
    }
    if (r->budget_bytes)
        printf("  the job: %s at %lld x %lld tokens; at most %lld sequences of %lld tokens (the "
               "fullest rank decides)\n",
               all_fit ? "fits" : "does not fit", (long long)r->concurrency, (long long)r->context,
               (long long)worst, (long long)r->context);
    return true;
}
