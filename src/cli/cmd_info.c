/* kvllm info / tokenize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "cli.h"

static int tokenize(const cli_opts *o, cli_model *cm, int32_t *ids, int64_t n) {
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON *jids = cJSON_AddArrayToObject(j, "ids");
        cJSON *jp = cJSON_AddArrayToObject(j, "pieces");
        for (int64_t i = 0; i < n; i++) {
            cJSON_AddItemToArray(jids, cJSON_CreateNumber(ids[i]));
            cJSON_AddItemToArray(jp, cJSON_CreateString(tok_piece(cm->vocab, ids[i])));
        }
        cJSON_AddNumberToObject(j, "n_tokens", (double)n);
        cli_print_json(j);
    } else {
        for (int64_t i = 0; i < n; i++)
            printf("%6d -> '%s'\n", ids[i], tok_piece(cm->vocab, ids[i]));
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    return cli_run_prompt(argc, argv, NULL, NULL, false, tokenize);
}

static void count_types(const gguf_file *f, int64_t counts[GGUF_DT_COUNT]) {
    memset(counts, 0, sizeof(int64_t) * GGUF_DT_COUNT);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        int t = gguf_tensor_at(f, i)->dtype;
        if (t >= 0 && t < GGUF_DT_COUNT) counts[t]++;
    }
}

static int cmd_info_opts(const cli_opts *o);

static int info_flag(const char *flag, const char *value, void *ctx) {
    if (strcmp(flag, "--archs") != 0) return 0;
    *(bool *)ctx = true;
    return 1;
}

/* kvllm info --archs [--json]: the architecture table's names, one per line
 * (what the golden tests compare with; `kvllm --help` is left as it was). */
static int print_archs(const cli_opts *o) {
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON *a = cJSON_AddArrayToObject(j, "architectures");
        for (int i = 0; i < arch_count(); i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(arch_at(i)->name));
        cli_print_json(j);
    } else {
        for (int i = 0; i < arch_count(); i++) printf("%s\n", arch_at(i)->name);
    }
    return 0;
}

int cmd_info(int argc, char **argv) {
    cli_opts o;
    bool archs = false;
    if (!cli_parse_ex(argc, argv, &o, info_flag, &archs)) return 2;
    return archs ? print_archs(&o) : cmd_info_opts(&o);
}

/* `info --json`: the hyperparameters in output order, in tables between the
 * members that cmd_info_opts writes itself. */
#define HP(field)          CLI_JSON(model_hparams, field)
#define HP_AS(name, field) CLI_JSON_AS(name, model_hparams, field)
static const cli_json_field HP_SHAPE[] = {HP_AS("architecture", arch),
                                          HP(n_vocab),
                                          HP(n_embd),
                                          HP(n_layer),
                                          HP(n_head),
                                          HP(n_head_kv),
                                          HP(head_dim_k),
                                          HP(head_dim_v),
                                          HP(n_ff),
                                          HP(n_ctx_train),
                                          HP(n_rot),
                                          HP_AS("rope_freq_base", rope_base)};
static const cli_json_field HP_NORM_WINDOW[] = {HP(rms_eps), HP(tied_output),
                                                HP_AS("sliding_window", n_swa),
                                                HP_AS("n_sliding_layers", n_swa_layers)};
/* the sliding layers' own shape (gemma4; the full layers' otherwise), KV sharing and
 * per-layer inputs */
static const cli_json_field HP_LAYER_KINDS[] = {
    HP_AS("n_head_kv_sliding", n_head_kv_swa),   HP_AS("head_dim_k_sliding", head_dim_k_swa),
    HP_AS("head_dim_v_sliding", head_dim_v_swa), HP_AS("n_rot_sliding", n_rot_swa),
    HP_AS("n_layers_with_kv", n_layer_kv),       HP_AS("n_embd_per_layer_input", n_embd_per_layer)};
static const cli_json_field HP_CHUNK[] = {HP_AS("attention_chunk", n_chunk),
                                          HP_AS("n_chunked_layers", n_chunk_layers)};
static const cli_json_field HP_SIZE[] = {HP(n_params), HP(weights_bytes),
                                         HP_AS("n_classifier_outputs", n_cls_out)};
#undef HP
#undef HP_AS
#define MOE(name, field) CLI_JSON_AS(name, model_moe_hparams, field)
static const cli_json_field MOE_SHAPE[] = {MOE("count", n_expert), MOE("used", n_expert_used),
                                           MOE("shared_ff", n_ff_shexp), MOE("expert_ff", n_ff_exp),
                                           MOE("moe_layers", n_layer_moe)};
static const cli_json_field MOE_ROUTING[] = {
    MOE("groups", n_group), MOE("groups_used", n_group_used),
    MOE("expert_weights_bytes", expert_bytes), MOE("active_weights_bytes_per_token", active_bytes)};
#undef MOE

static int cmd_info_opts(const cli_opts *o) {
    /* Open the file alone first so that a malformed file is reported as such.
     * The weights stay as the file maps them: info computes nothing, and
     * repacking read every byte (a minute for an 18.5 GB MoE file, against
     * 0.14 s). */
    cli_opts oi = *o;
    oi.no_repack = true;
    cli_model cm;
    if (!cli_load(&oi, true, &cm)) return 1;
    const model_hparams *hp = model_hp(cm.m);
    const gguf_file *f = model_gguf(cm.m);
    int64_t counts[GGUF_DT_COUNT];
    count_types(f, counts);
    size_t kv_tok_f16 = 0; /* what the pools store per token (MLA: latent + rope, no separate V) */
    for (int g = 0; g < model_kv_n_groups(cm.m); g++) {
        kv_pool_config kc;
        model_kv_group_shape(cm.m, g, &kc, NULL);
        kv_tok_f16 += (size_t)kc.n_layers * kc.n_kv_heads * (kc.head_dim_k + kc.head_dim_v) * 2;
    }
    size_t kv_tok_f32 = kv_tok_f16 * 2;
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "file", gguf_path(f));
        cJSON_AddNumberToObject(j, "gguf_version", gguf_file_layout(f)->version);
        cJSON_AddNumberToObject(j, "n_files", gguf_n_files(f));
        CLI_JSON_TABLE(j, hp, HP_SHAPE, false);
        cJSON_AddStringToObject(j, "rope_type",
                                hp->rope_type == MODEL_ROPE_NEOX ? "neox" : "normal");
        CLI_JSON_TABLE(j, hp, HP_NORM_WINDOW, false);
        CLI_JSON_TABLE(j, hp, HP_LAYER_KINDS, false);
        if (hp->n_chunk_layers) CLI_JSON_TABLE(j, hp, HP_CHUNK, false);
        cJSON *groups = cJSON_AddArrayToObject(j, "kv_groups"); /* one KV pool each */
        for (int g = 0; g < model_kv_n_groups(cm.m); g++) {
            kv_pool_config kc;
            kv_attn a;
            model_kv_group_shape(cm.m, g, &kc, &a);
            cJSON *jg = cJSON_CreateObject();
            cJSON_AddNumberToObject(jg, "n_layers", kc.n_layers);
            cJSON_AddNumberToObject(jg, "window", a.window);
            cJSON_AddNumberToObject(jg, "chunk", a.chunk);
            cJSON_AddItemToArray(groups, jg);
        }
        cJSON_AddStringToObject(j, "attention",
                                hp->kv_lora_rank             ? "mla"
                                : hp->n_head_kv == 1         ? "mqa"
                                : hp->n_head_kv < hp->n_head ? "gqa"
                                                             : "mha");
        CLI_JSON_TABLE(j, hp, HP_SIZE, false);
        if (hp->moe.n_expert) {
            const model_moe_hparams *mo = &hp->moe;
            cJSON *e = cJSON_AddObjectToObject(j, "experts");
            CLI_JSON_TABLE(e, mo, MOE_SHAPE, false);
            cJSON_AddStringToObject(e, "gating", model_moe_gating_name(mo->gating));
            CLI_JSON_TABLE(e, mo, MOE_ROUTING, false);
        }
        cJSON_AddStringToObject(j, "tokenizer", tok_model_name(cm.vocab));
        cJSON_AddStringToObject(j, "tokenizer_pre", tok_pre_name(cm.vocab));
        cJSON *tt = cJSON_AddObjectToObject(j, "tensor_types");
        for (int t = 0; t < GGUF_DT_COUNT; t++)
            if (counts[t]) cJSON_AddNumberToObject(tt, gguf_dtype_name(t), (double)counts[t]);
        cJSON *kv = cJSON_AddObjectToObject(j, "kv_bytes_per_token");
        cJSON_AddNumberToObject(kv, "f32", (double)kv_tok_f32);
        cJSON_AddNumberToObject(kv, "f16", (double)kv_tok_f16);
        if (model_lora_count(cm.m)) {
            cJSON *la = cJSON_AddArrayToObject(j, "lora");
            for (int i = 0; i < model_lora_count(cm.m); i++) {
                model_lora_info li;
                model_lora_get(cm.m, i, &li);
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "path", li.path);
                cJSON_AddNumberToObject(e, "scale", li.scale);
                cJSON_AddNumberToObject(e, "alpha", li.alpha);
                cJSON_AddNumberToObject(e, "rank", (double)li.rank);
                cJSON_AddNumberToObject(e, "n_tensors", li.n_pairs);
                cJSON_AddNumberToObject(e, "bytes", (double)li.bytes);
                cJSON_AddItemToArray(la, e);
            }
        }
        cli_print_json(j);
    } else {
        printf("file          %s (GGUF v%u", gguf_path(f), gguf_file_layout(f)->version);
        if (gguf_n_files(f) > 1) printf(", split in %d files", gguf_n_files(f));
        printf(")\n");
        printf("architecture  %s\n", hp->arch);
        printf("parameters    %lld (%zu bytes of weights)\n", (long long)hp->n_params,
               hp->weights_bytes);
        printf("vocab         %lld (%s, pre %s)\n", (long long)hp->n_vocab,
               tok_model_name(cm.vocab), tok_pre_name(cm.vocab));
        printf(
            "embd %lld, layers %lld, heads %lld / kv %lld, head dim %lld/%lld, ff %lld, ctx %lld\n",
            (long long)hp->n_embd, (long long)hp->n_layer, (long long)hp->n_head,
            (long long)hp->n_head_kv, (long long)hp->head_dim_k, (long long)hp->head_dim_v,
            (long long)hp->n_ff, (long long)hp->n_ctx_train);
        if (hp->n_swa_layers &&
            (hp->n_head_kv_swa != hp->n_head_kv || hp->head_dim_k_swa != hp->head_dim_k ||
             hp->head_dim_v_swa != hp->head_dim_v || hp->n_rot_swa != hp->n_rot))
            printf("sliding layers kv %lld, head dim %lld/%lld, rope dims %lld\n",
                   (long long)hp->n_head_kv_swa, (long long)hp->head_dim_k_swa,
                   (long long)hp->head_dim_v_swa, (long long)hp->n_rot_swa);
        if (hp->n_embd_per_layer)
            printf("per-layer in  %lld values a layer and token (per_layer_token_embd)\n",
                   (long long)hp->n_embd_per_layer);
        if (hp->n_layer_kv < hp->n_layer)
            printf("shared KV     layers %lld-%lld read earlier layers' caches\n",
                   (long long)hp->n_layer_kv, (long long)hp->n_layer - 1);
        printf("rope          %s, base %g, dims %lld%s\n",
               hp->rope_type == MODEL_ROPE_NEOX ? "neox" : "normal", hp->rope_base,
               (long long)hp->n_rot, hp->has_rope_freqs ? ", frequency factors" : "");
        if (hp->rope_yarn.yarn)
            printf("rope scaling  yarn, factor %g, original context %lld, beta %g/%g\n",
                   1.0 / hp->rope_freq_scale, (long long)hp->rope_yarn.n_ctx_orig,
                   hp->rope_yarn.beta_fast, hp->rope_yarn.beta_slow);
        else if (hp->rope_freq_scale != 1.0f)
            printf("rope scaling  linear, factor %g\n", 1.0 / hp->rope_freq_scale);
        printf("output        %s\n", hp->tied_output ? "tied to token_embd" : "separate");
        if (hp->n_cls_out)
            printf("classifier    cls.output, %lld scores: a reranker (POST /rerank)\n",
                   (long long)hp->n_cls_out);
        if (hp->n_swa_layers)
            printf("sliding window %lld tokens on %lld of %lld layers\n", (long long)hp->n_swa,
                   (long long)hp->n_swa_layers, (long long)hp->n_layer);
        if (hp->n_chunk_layers)
            printf("chunked attention %lld tokens on %lld of %lld layers (KV of earlier chunks "
                   "dropped)\n",
                   (long long)hp->n_chunk, (long long)hp->n_chunk_layers, (long long)hp->n_layer);
        for (int g = 0; model_kv_n_groups(cm.m) > 1 && g < model_kv_n_groups(cm.m); g++) {
            kv_pool_config kc;
            kv_attn a;
            model_kv_group_shape(cm.m, g, &kc, &a);
            printf("KV group %d    %d layer%s, %s", g, kc.n_layers, kc.n_layers == 1 ? "" : "s",
                   a.window  ? "sliding window "
                   : a.chunk ? "chunks of "
                             : "full attention\n");
            if (a.window || a.chunk) printf("%d tokens\n", a.window ? a.window : a.chunk);
        }
        if (hp->kv_lora_rank)
            printf("MLA           kv_lora_rank %lld + rope %lld cached per token per layer\n",
                   (long long)hp->kv_lora_rank, (long long)hp->n_rot);
        if (hp->moe.n_expert) {
            const model_moe_hparams *mo = &hp->moe;
            printf("experts       %lld, %lld used per token, %s gating%s, expert ff %lld, shared "
                   "ff %lld, "
                   "on %lld of %lld layers\n",
                   (long long)mo->n_expert, (long long)mo->n_expert_used,
                   model_moe_gating_name(mo->gating), mo->n_group ? " in groups" : "",
                   (long long)mo->n_ff_exp, (long long)mo->n_ff_shexp, (long long)mo->n_layer_moe,
                   (long long)hp->n_layer);
            printf("weights read  %zu bytes per token (routed experts %zu bytes in all, %lld of "
                   "%lld read)\n",
                   mo->active_bytes, mo->expert_bytes, (long long)mo->n_expert_used,
                   (long long)mo->n_expert);
        }
        printf("tensor types ");
        for (int t = 0; t < GGUF_DT_COUNT; t++)
            if (counts[t]) printf(" %s x%lld", gguf_dtype_name(t), (long long)counts[t]);
        printf("\nKV per token  %zu bytes f16, %zu bytes f32 (calculated: 2 x L x n_kv x d_head x "
               "bytes)\n",
               kv_tok_f16, kv_tok_f32);
        for (int i = 0; i < model_lora_count(cm.m); i++) {
            model_lora_info li;
            model_lora_get(cm.m, i, &li);
            printf("LoRA %d        %s: %d matrices, rank %lld, alpha %g, scale %g, %zu bytes\n", i,
                   li.path, li.n_pairs, (long long)li.rank, (double)li.alpha, (double)li.scale,
                   li.bytes);
        }
    }
    cli_unload(&cm);
    return 0;
}
