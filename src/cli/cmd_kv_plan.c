/* kvllm kv-plan: the KV capacity planner's front end. Reads the shape (GGUF,
 * config.json or flags), asks src/kv/kv_plan for the plan, prints it; with
 * --verify, replays B sequences of T tokens through the engine's real block
 * pools (one per KV group, laid out by the engine's own model loader when it can
 * load the file) and exits 1 unless the planned figures are exactly what was
 * allocated: block bytes, peak blocks, blocks held at T, lower bound. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "units.h"
#include "kv_plan.h"
#include "kv_disk.h"
#include "hparams.h"

/* --verify allocates real memory: keep it to what a small model needs. */
#define VERIFY_MAX_POOL_BYTES ((uint64_t)4 << 30)

#define UNSET (-1)

/* cmd_kv_plan_pp.c: the per-rank table of --pp N. */
bool kv_plan_print_pp(const cli_opts *o, const kv_plan_model *m, const kv_plan_request *r,
                      const char *gguf_path, cJSON *json);

_Static_assert(MODEL_MAX_KV_GROUPS <= KV_PLAN_MAX_GROUPS,
               "kv-plan --verify holds every engine KV group");

typedef struct plan_args {
    const char *config_path;
    int64_t context, concurrency, params;
    int64_t layers, heads, kv_heads, head_dim, head_dim_v, window, swa_layers, lora, rope, chunk,
        chunk_layers;
    int dtype;   /* K (and V): UNSET: the model's, else f16 */
    int dtype_v; /* UNSET: as K */
    uint64_t budget, weights, disk;
    bool has_budget, has_weights, has_disk, verify;
    const char *budget_source; /* --budget available: which figure it read, else NULL */
} plan_args;

/* Integer flags: where they go, the smallest accepted value, and whether
 * suffixes count in thousands (parameters) or in 1024s (tokens). */
typedef struct count_flag {
    const char *name;
    size_t off;
    int64_t min;
    bool thousand;
} count_flag;

#define F(name, field, min, th)                                                                    \
    { name, offsetof(plan_args, field), min, th }
static const count_flag COUNT_FLAGS[] = {
    F("--context", context, 1, false),       F("--concurrency", concurrency, 1, false),
    F("--params", params, 1, true),          F("--layers", layers, 1, false),
    F("--heads", heads, 1, false),           F("--kv-heads", kv_heads, 1, false),
    F("--head-dim", head_dim, 1, false),     F("--head-dim-v", head_dim_v, 0, false),
    F("--sliding-window", window, 0, false), F("--swa-layers", swa_layers, 0, false),
    F("--kv-lora-rank", lora, 0, false),     F("--rope-dim", rope, 0, false),
    F("--attn-chunk", chunk, 0, false),      F("--chunk-layers", chunk_layers, 0, false),
};
#undef F

static int bad(const char *flag, const char *v, const char *why) {
    if (v) fprintf(stderr, "kvllm kv-plan: %s: '%s' %s\n", flag, v, why);
    else fprintf(stderr, "kvllm kv-plan: %s %s\n", flag, why);
    return -1;
}

static int count_arg(const count_flag *c, const char *v, plan_args *a) {
    int64_t x;
    if (!kvl_parse_count(v, c->thousand, &x))
        return bad(c->name, v,
                   c->thousand ? "is not a whole count (e.g. 8030000000, 8.03B)"
                               : "is not a whole non-negative number (e.g. 8192, 32K)");
    if (x < c->min) return bad(c->name, v, c->min > 0 ? "must be at least 1" : "must be >= 0");
    *(int64_t *)((char *)a + c->off) = x;
    return 2;
}

static int size_arg(const char *flag, const char *v, uint64_t *out, bool *set) {
    if (!kvl_parse_size(v, out))
        return bad(flag, v, "is not a size in whole bytes (e.g. 80GiB, 16GB, 1073741824)");
    *set = true;
    return 2;
}

/* cli_parse_ex callback: the planner's own flags (see cli.h for the protocol). */
static int extra_flag(const char *f, const char *v, void *ctx) {
    plan_args *a = ctx;
    if (strcmp(f, "--verify") == 0) return a->verify = true, 1;
    bool ours = strcmp(f, "--config") == 0 || strcmp(f, "--kv-type") == 0 ||
                strcmp(f, "--kv-type-k") == 0 || strcmp(f, "--kv-type-v") == 0 ||
                strcmp(f, "--budget") == 0 || strcmp(f, "--weights-bytes") == 0 ||
                strcmp(f, "--disk") == 0;
    for (size_t i = 0; !ours && i < sizeof COUNT_FLAGS / sizeof COUNT_FLAGS[0]; i++)
        ours = strcmp(f, COUNT_FLAGS[i].name) == 0;
    if (!ours) return 0;
    if (!v) return bad(f, v, "needs a value");
    for (size_t i = 0; i < sizeof COUNT_FLAGS / sizeof COUNT_FLAGS[0]; i++)
        if (strcmp(f, COUNT_FLAGS[i].name) == 0) return count_arg(&COUNT_FLAGS[i], v, a);
    if (strcmp(f, "--config") == 0) return a->config_path = v, 2;
    if (strcmp(f, "--budget") == 0 && strcmp(v, "available") == 0) {
        /* what this process may take now: where the model would run */
        const kvl_mem_status st = kvl_mem_status_at("");
        if (st.available < 0) return bad(f, v, "cannot be read here (no /proc/meminfo)");
        a->budget = (uint64_t)st.available;
        a->has_budget = true;
        a->budget_source = st.by_cgroup ? "the memory cgroup's room now" : "MemAvailable now";
        return 2;
    }
    if (strcmp(f, "--budget") == 0) return size_arg(f, v, &a->budget, &a->has_budget);
    if (strcmp(f, "--weights-bytes") == 0) return size_arg(f, v, &a->weights, &a->has_weights);
    if (strcmp(f, "--disk") == 0) return size_arg(f, v, &a->disk, &a->has_disk);
    bool k = strcmp(f, "--kv-type") == 0 || strcmp(f, "--kv-type-k") == 0;
    int dt;
    if (!kv_plan_dtype_parse(v, &dt))
        return bad(f, v, "is not one of f32, f16, bf16, q8_0, q5_0, q4_0, iq4_nl, fp8");
    if (strcmp(f, "--kv-type") == 0) a->dtype_v = UNSET; /* both, as for kvllm run */
    *(k ? &a->dtype : &a->dtype_v) = dt;
    return 2;
}

void cmd_kv_plan_usage(FILE *out) {
    fprintf(
        out,
        "usage: kvllm kv-plan (-m MODEL.gguf | --config config.json | --layers L --kv-heads H "
        "--head-dim D) --context T\n"
        "         [--concurrency B] [--kv-type f32|f16|bf16|q8_0|q5_0|q4_0|iq4_nl|fp8] "
        "[--kv-type-k T --kv-type-v "
        "T]\n"
        "         [--block-size 16]"
        " [--budget 80GiB|available] [--weights-bytes N | --params N] [--disk 20GiB] [--json] "
        "[--verify]\n"
        "  --budget available: the memory this process may take now (MemAvailable, or a memory\n"
        "    cgroup's room: a container's limit)\n"
        "  --disk SIZE: tokens per tier (RAM pool, and a --kv-disk tier of SIZE)\n"
        "  shape flags (alone or overriding the file): --layers --heads --kv-heads --head-dim\n"
        "  --head-dim-v --sliding-window W --swa-layers N --kv-lora-rank R --rope-dim R\n"
        "  --attn-chunk C --chunk-layers N (llama4's chunked attention)\n");
}

/* ------------------------------------------------------------- inputs -- */

/* The shape from the model layer's one reader (the engine's own), turned
 * into the planner's description. */
static bool load_gguf(const cli_opts *o, const char *path, kv_plan_model *m) {
    kvl_error err = {{0}}, why = {{0}};
    model_hparams hp;
    gguf_file *f = gguf_open(path, &err);
    if (f && !cli_apply_overrides(o, f)) {
        gguf_close(f);
        return false;
    }
    bool ok = f && model_hparams_from_gguf(f, &hp, &err);
    if (ok && !model_hparams_plan_model(&hp, m, &why)) ok = kvl_fail(&err, "%s: %s", path, why.msg);
    gguf_close(f);
    if (!ok) fprintf(stderr, "kvllm kv-plan: %s\n", err.msg);
    return ok;
}

static bool load_config(const char *path, kv_plan_model *m) {
    kvl_error err = {{0}};
    model_hparams hp;
    char *text = kvl_read_file(path, NULL, &err);
    bool ok = text && model_hparams_from_hf_config(text, &hp, &err) &&
              model_hparams_plan_model(&hp, m, &err);
    free(text);
    if (!ok)
        fprintf(stderr, "kvllm kv-plan: %s%s%s\n", text ? path : "", text ? ": " : "", err.msg);
    return ok;
}

static void set_if(int64_t v, int64_t *field) {
    if (v != UNSET) *field = v;
}

/* Flags override (or, alone, make up) the shape. */
static void apply_overrides(const plan_args *a, kv_plan_model *m) {
    set_if(a->layers, &m->n_layers);
    set_if(a->kv_heads, &m->n_kv_heads);
    set_if(a->heads, &m->n_head);
    if (m->n_head == 0) m->n_head = m->n_kv_heads; /* by hand without --heads: no GQA claim */
    set_if(a->head_dim, &m->head_dim_k);
    set_if(a->head_dim, &m->head_dim_v);
    set_if(a->head_dim_v, &m->head_dim_v);
    set_if(a->lora, &m->kv_lora_rank);
    set_if(a->rope, &m->rope_dim);
    set_if(a->window, &m->sliding_window);
    if (a->window > 0 && a->swa_layers == UNSET && m->n_swa_layers == 0)
        m->n_swa_layers = m->n_layers;
    if (a->window == 0) m->n_swa_layers = 0;
    set_if(a->swa_layers, &m->n_swa_layers);
    set_if(a->chunk, &m->attn_chunk);
    if (a->chunk > 0 && a->chunk_layers == UNSET && m->n_chunk_layers == 0)
        m->n_chunk_layers = m->n_layers - m->n_swa_layers;
    if (a->chunk == 0) m->n_chunk_layers = 0;
    set_if(a->chunk_layers, &m->n_chunk_layers);
}

static bool load_model(const cli_opts *o, const plan_args *a, kv_plan_model *m) {
    kv_plan_model_init(m);
    if (o->model_path && a->config_path) {
        fprintf(stderr, "kvllm kv-plan: give -m or --config, not both\n");
        return false;
    }
    if (!o->model_path && !a->config_path && a->layers == UNSET) {
        fprintf(stderr, "kvllm kv-plan: no model: give -m MODEL.gguf, --config config.json, "
                        "or --layers/--kv-heads/--head-dim\n");
        return false;
    }
    if (o->model_path && !load_gguf(o, o->model_path, m)) return false;
    if (a->config_path && !load_config(a->config_path, m)) return false;
    if (!o->model_path && !a->config_path) snprintf(m->arch, sizeof m->arch, "by hand");
    apply_overrides(a, m);
    kvl_error err = {{0}};
    if (kv_plan_model_check(m, &err)) return true;
    bool by_hand = !o->model_path && !a->config_path;
    fprintf(stderr, "kvllm kv-plan: %s%s\n", err.msg,
            by_hand ? " (shape flags: --layers, --kv-heads, --head-dim, or --kv-lora-rank and "
                      "--rope-dim)"
                    : "");
    return false;
}

/* Weights: --weights-bytes, else --params x the model's bytes per parameter
 * (2 when the file does not say), else the GGUF's tensor bytes. */
static uint64_t weights_bytes(const plan_args *a, const kv_plan_model *m, const char **source) {
    if (a->has_weights) return *source = "--weights-bytes", a->weights;
    if (a->params != UNSET) {
        *source = m->param_bytes == 4 ? "--params x 4 B" : "--params x 2 B";
        return (uint64_t)a->params * (uint64_t)(m->param_bytes ? m->param_bytes : 2);
    }
    *source = m->weights_bytes ? "GGUF tensor data" : "unknown (give --weights-bytes or --params)";
    return m->weights_bytes;
}

/* ------------------------------------------------------------ verify -- */

typedef struct verify_result {
    bool done, agree, engine_shape;
    char note[600];
    kv_plan planned;
    kv_plan_measured measured;
    /* Per measured group, what the planner says for it (matched by window). */
    uint64_t planned_block_bytes[KV_PLAN_MAX_GROUPS];
    int64_t planned_peak_blocks[KV_PLAN_MAX_GROUPS], planned_end_blocks[KV_PLAN_MAX_GROUPS];
    uint64_t planned_end_bytes; /* seq_held_bytes x B */
} verify_result;

static void note_add(verify_result *v, const char *what) {
    size_t n = strlen(v->note);
    snprintf(v->note + n, sizeof v->note - n, "%s%s", n ? "; " : "", what);
}

/* The KV groups as the engine itself builds them for this model (its loader's
 * layer split and pool layouts), when it can load it; otherwise the planner's
 * (the allocator and the replay are still the real ones). */
static int verify_groups(const cli_opts *o, const kv_plan_model *m, const kv_plan_request *r,
                         kv_plan_group *groups, verify_result *v) {
    kvl_error err = {{0}};
    int n = kv_plan_pool_groups(m, r, groups, &err);
    if (n == 0) {
        fprintf(stderr, "kvllm kv-plan: --verify: %s\n", err.msg);
        return 0;
    }
    if (!o->model_path) return n;
    gguf_file *f = gguf_open(o->model_path, &err);
    if (f && !cli_apply_overrides(o, f)) {
        gguf_close(f);
        return 0;
    }
    model_params mp = {
        .max_ctx = 1, .max_ubatch = 1, .no_repack = true}; /* shape only: minimal scratch */
    model *mod = f ? model_load(f, &mp, &err) : NULL;
    if (mod) {
        kv_plan_group planner = groups[0]; /* K/V types and block size are the request's */
        n = model_kv_n_groups(mod);
        for (int g = 0; g < n; g++) {
            kv_attn a = {0, 0};
            kv_pool_config c = planner.cfg;
            model_kv_group_shape(mod, g, &c, &a);
            groups[g].cfg = c;
            groups[g].window = a.window;
            groups[g].chunk = a.chunk;
        }
        v->engine_shape = true;
    } else {
        char why[600];
        snprintf(why, sizeof why,
                 "the engine cannot load this model (%s); KV groups from the planner", err.msg);
        note_add(v, why);
    }
    model_destroy(mod);
    return n;
}

/* The planner's figures for each measured group, matched by window and chunk;
 * false when the engine has a group the planner does not (or not the same rule). */
static bool match_groups(const kv_plan_model *m, const kv_plan_request *r, verify_result *v) {
    const kv_plan *p = &v->planned;
    int64_t B = r->concurrency;
    bool ok = true, seen[3] = {false, false, false}; /* full, sliding, chunked */
    for (int g = 0; g < v->measured.n_groups; g++) {
        const kv_plan_measured_group *mg = &v->measured.group[g];
        int k = mg->window > 0 ? 1 : mg->chunk > 0 ? 2 : 0;
        const uint64_t bb[3] = {p->block_bytes, p->swa_block_bytes, p->chunk_block_bytes};
        const int64_t peak[3] = {p->blocks_per_seq, p->swa_blocks_per_seq, p->chunk_blocks_per_seq};
        const int64_t end[3] = {p->blocks_per_seq, p->swa_blocks_held, p->chunk_blocks_held};
        v->planned_block_bytes[g] = bb[k];
        v->planned_peak_blocks[g] = peak[k] * B;
        v->planned_end_blocks[g] = end[k] * B;
        if (k == 1 && (mg->window != m->sliding_window || mg->chunk)) ok = false;
        if (k == 2 && mg->chunk != m->attn_chunk) ok = false;
        seen[k] = true;
    }
    if (seen[0] != (m->n_layers > m->n_swa_layers + m->n_chunk_layers) ||
        seen[1] != (m->n_swa_layers > 0) || seen[2] != (m->n_chunk_layers > 0))
        ok = false;
    if (!ok) note_add(v, "the engine splits the layers into other KV groups than the planner");
    return ok;
}

static bool run_verify(const cli_opts *o, const kv_plan_model *m, const kv_plan_request *r,
                       verify_result *v) {
    kv_plan_group groups[KV_PLAN_MAX_GROUPS];
    kvl_error err = {{0}};
    int n = verify_groups(o, m, r, groups, v);
    if (n == 0 || !kv_plan_compute(m, r, &v->planned, &err) ||
        !kv_plan_measure(groups, n, r->context, r->concurrency, VERIFY_MAX_POOL_BYTES, &v->measured,
                         &err)) {
        if (err.msg[0]) fprintf(stderr, "kvllm kv-plan: --verify: %s\n", err.msg);
        return false;
    }
    v->done = true;
    v->planned_end_bytes = v->planned.seq_held_bytes * (uint64_t)r->concurrency;
    bool agree = match_groups(m, r, v);
    for (int g = 0; g < v->measured.n_groups; g++) {
        const kv_plan_measured_group *mg = &v->measured.group[g];
        agree = agree && v->planned_block_bytes[g] == mg->block_bytes &&
                v->planned_peak_blocks[g] == mg->peak_blocks &&
                v->planned_end_blocks[g] == mg->blocks;
    }
    v->agree = agree && v->planned.allocated_bytes == v->measured.peak_allocated_bytes &&
               v->planned.lower_bound_bytes == v->measured.lower_bound_bytes &&
               v->planned_end_bytes == v->measured.allocated_bytes;
    return true;
}

/* --------------------------------------------------------------- JSON -- */

/* The members of kv-plan --json that are fields, in output order (integers
 * written exactly). */
#define MODEL(field) CLI_JSON(kv_plan_model, field)
/* clang-format off */
static const cli_json_field MODEL_FIELDS[] = {
    MODEL(arch),           MODEL(n_layers),       MODEL(n_layers_shared_kv),
    MODEL(n_head),         MODEL(n_kv_heads),     MODEL(head_dim_k),
    MODEL(head_dim_v),     MODEL(kv_lora_rank),   MODEL(rope_dim),
    MODEL(sliding_window), MODEL(n_swa_layers),   MODEL(attn_chunk),
    MODEL(n_chunk_layers), MODEL(n_expert),       MODEL(n_expert_used),
    MODEL(active_weights_bytes),                  MODEL(n_kv_heads_swa),
    MODEL(head_dim_k_swa), MODEL(head_dim_v_swa)};
/* clang-format on */
#undef MODEL
#define PLAN(field) CLI_JSON(kv_plan, field)
#define REQ(field)  CLI_JSON(kv_plan_request, field)
static const cli_json_field PLAN_ROWS[] = {PLAN(k_row_bytes), PLAN(v_row_bytes),
                                           PLAN(swa_k_row_bytes), PLAN(swa_v_row_bytes)};
static const cli_json_field REQUEST_SHAPE[] = {REQ(block_size), REQ(context), REQ(concurrency)};
static const cli_json_field PLAN_BYTES[] = {
    PLAN(bytes_per_token),     PLAN(seq_lower_bound_bytes), PLAN(lower_bound_bytes),
    PLAN(block_bytes),         PLAN(blocks_per_seq),        PLAN(swa_block_bytes),
    PLAN(swa_blocks_per_seq),  PLAN(chunk_block_bytes),     PLAN(chunk_blocks_per_seq),
    PLAN(seq_allocated_bytes), PLAN(allocated_bytes),       PLAN(swa_blocks_held),
    PLAN(chunk_blocks_held),   PLAN(seq_held_bytes),        PLAN(seq_metadata_bytes),
    PLAN(metadata_bytes),      PLAN(weights_bytes),         PLAN(total_bytes)};
static const cli_json_field PLAN_FIT[] = {PLAN(fits), PLAN(max_concurrency)};
#undef PLAN
#undef REQ
#define SAV(field)          CLI_JSON(kv_plan_saving, field)
#define SAV_AS(name, field) CLI_JSON_AS(name, kv_plan_saving, field)
static const cli_json_field SAVING[] = {
    SAV(what),
    SAV(baseline),
    SAV(in_plan),
    SAV(bytes_per_token),
    SAV_AS("baseline_bytes_per_token", base_bytes_per_token),
    SAV(lower_bound_bytes),
    SAV_AS("baseline_lower_bound_bytes", base_lower_bound_bytes),
    SAV(allocated_bytes),
    SAV_AS("baseline_allocated_bytes", base_allocated_bytes)};
#undef SAV
#undef SAV_AS

static void json_model(cJSON *j, const kv_plan_model *m) {
    kv_plan_model shown = *m; /* MLA caches no KV heads; rope_dim counts only with MLA */
    if (kv_plan_is_mla(m)) shown.n_kv_heads = 0;
    else shown.rope_dim = 0;
    CLI_JSON_TABLE(j, &shown, MODEL_FIELDS, true);
}

static void json_plan(cJSON *j, const kv_plan *p, const kv_plan_request *r) {
    cJSON_AddStringToObject(j, "kv_type", kv_plan_dtype_name(r->dtype));
    cJSON_AddStringToObject(j, "kv_type_v", kv_plan_dtype_name(r->split_v ? r->dtype_v : r->dtype));
    CLI_JSON_TABLE(j, p, PLAN_ROWS, true);
    CLI_JSON_TABLE(j, r, REQUEST_SHAPE, true);
    CLI_JSON_TABLE(j, p, PLAN_BYTES, true);
    if (!r->budget_bytes) return;
    cli_json_u64(j, "budget_bytes", r->budget_bytes);
    CLI_JSON_TABLE(j, p, PLAN_FIT, true);
}

static cJSON *json_savings(const kv_plan_saving *s, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        CLI_JSON_TABLE(e, &s[i], SAVING, true);
        cJSON_AddItemToArray(arr, e);
    }
    return arr;
}

static cJSON *json_verify(const verify_result *v) {
    const kv_plan_measured *ms = &v->measured;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "pool_shape_from", v->engine_shape ? "engine" : "planner");
    cJSON_AddStringToObject(j, "replay", "decode, one token per sequence per step");
    if (v->note[0]) cJSON_AddStringToObject(j, "note", v->note);
    cJSON *groups = cJSON_AddArrayToObject(j, "groups");
    int64_t planned_blocks = 0;
    for (int g = 0; g < ms->n_groups; g++) {
        const kv_plan_measured_group *mg = &ms->group[g];
        cJSON *e = cJSON_CreateObject();
        cli_json_u64(e, "window", (uint64_t)mg->window);
        cli_json_u64(e, "chunk", (uint64_t)mg->chunk);
        cli_json_u64(e, "n_layers", (uint64_t)mg->n_layers);
        cli_json_u64(e, "planned_block_bytes", v->planned_block_bytes[g]);
        cli_json_u64(e, "measured_block_bytes", mg->block_bytes);
        cli_json_u64(e, "planned_peak_blocks", (uint64_t)v->planned_peak_blocks[g]);
        cli_json_u64(e, "measured_peak_blocks", (uint64_t)mg->peak_blocks);
        cli_json_u64(e, "planned_end_blocks", (uint64_t)v->planned_end_blocks[g]);
        cli_json_u64(e, "measured_end_blocks", (uint64_t)mg->blocks);
        cli_json_u64(e, "measured_lower_bound_bytes", mg->lower_bound_bytes);
        cli_json_u64(e, "measured_peak_allocated_bytes", mg->peak_allocated_bytes);
        cli_json_u64(e, "measured_end_allocated_bytes", mg->allocated_bytes);
        cJSON_AddItemToArray(groups, e);
        planned_blocks += v->planned_peak_blocks[g];
    }
    cli_json_u64(j, "planned_blocks", (uint64_t)planned_blocks);
    cli_json_u64(j, "measured_blocks", (uint64_t)ms->peak_blocks);
    cli_json_u64(j, "planned_lower_bound_bytes", v->planned.lower_bound_bytes);
    cli_json_u64(j, "measured_lower_bound_bytes", ms->lower_bound_bytes);
    cli_json_u64(j, "planned_allocated_bytes", v->planned.allocated_bytes);
    cli_json_u64(j, "measured_allocated_bytes", ms->peak_allocated_bytes);
    cli_json_u64(j, "planned_end_bytes", v->planned_end_bytes);
    cli_json_u64(j, "measured_end_bytes", ms->allocated_bytes);
    cli_json_u64(j, "measured_table_bytes", ms->table_bytes);
    cJSON_AddBoolToObject(j, "agree", v->agree);
    return j;
}

typedef struct report {
    const char *source, *weights_source;
    const char *budget_source; /* --budget available's figure, or NULL */
    const kv_plan_model *m;
    const kv_plan_request *r;
    const kv_plan *p;
    const kv_plan_saving *sav;
    int n_sav;
    const verify_result *v;
    cJSON *pipeline; /* --pp with --json: the per-rank plan (taken) */
} report;

static void print_json(const report *rp) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "source", rp->source);
    json_model(j, rp->m);
    json_plan(j, rp->p, rp->r);
    cJSON_AddStringToObject(j, "weights_source", rp->weights_source);
    if (rp->budget_source) cJSON_AddStringToObject(j, "budget_source", rp->budget_source);
    cJSON_AddItemToObject(j, "savings", json_savings(rp->sav, rp->n_sav));
    if (rp->v->done) cJSON_AddItemToObject(j, "verify", json_verify(rp->v));
    if (rp->pipeline) cJSON_AddItemToObject(j, "pipeline", rp->pipeline);
    cli_print_json(j);
}

/* --------------------------------------------------------------- text -- */

#define FB(x)  kvl_fmt_bytes((x), (char[96]){0}, 96)
#define BIN(x) kvl_fmt_binary((x), (char[32]){0}, 32)

/* "2,048": kvl_fmt_bytes groups the digits; keep only the number. */
static const char *grouped(int64_t v, char *buf, size_t cap) {
    kvl_fmt_bytes((uint64_t)v, buf, cap);
    char *sp = strchr(buf, ' ');
    if (sp) *sp = 0;
    return buf;
}
#define GR(x) grouped((x), (char[96]){0}, 96)

static void print_shape(const report *rp) {
    const kv_plan_model *m = rp->m;
    printf("model          %s (%s): ", rp->source, m->arch);
    if (m->n_layers_shared_kv)
        printf("%lld layers, %lld with a KV cache (the last %lld read earlier layers'), ",
               (long long)(m->n_layers + m->n_layers_shared_kv), (long long)m->n_layers,
               (long long)m->n_layers_shared_kv);
    else printf("%lld layers, ", (long long)m->n_layers);
    if (kv_plan_is_mla(m))
        printf("MLA: latent %lld + RoPE key %lld per layer (%lld query heads)\n",
               (long long)m->kv_lora_rank, (long long)m->rope_dim, (long long)m->n_head);
    else
        printf("%lld query / %lld KV heads, head dim %lld/%lld\n", (long long)m->n_head,
               (long long)m->n_kv_heads, (long long)m->head_dim_k, (long long)m->head_dim_v);
    if (m->n_expert)
        printf("               mixture of experts: %lld routed, %lld used per token\n",
               (long long)m->n_expert, (long long)m->n_expert_used);
    if (m->n_swa_layers)
        printf("               sliding window %lld tokens in %lld of %lld layers\n",
               (long long)m->sliding_window, (long long)m->n_swa_layers, (long long)m->n_layers);
    if (kv_plan_swa_own_shape(m))
        printf("               sliding layers: %lld KV heads, head dim %lld/%lld\n",
               (long long)(m->n_kv_heads_swa ? m->n_kv_heads_swa : m->n_kv_heads),
               (long long)(m->head_dim_k_swa ? m->head_dim_k_swa : m->head_dim_k),
               (long long)(m->head_dim_v_swa ? m->head_dim_v_swa : m->head_dim_v));
    if (m->n_chunk_layers)
        printf("               chunked attention: chunks of %lld tokens in %lld of %lld layers\n",
               (long long)m->attn_chunk, (long long)m->n_chunk_layers, (long long)m->n_layers);
    if (rp->r->split_v)
        printf("KV type        K %s, V %s, block size %lld tokens\n",
               kv_plan_dtype_name(rp->r->dtype), kv_plan_dtype_name(rp->r->dtype_v),
               (long long)rp->r->block_size);
    else
        printf("KV type        %s, block size %lld tokens\n", kv_plan_dtype_name(rp->r->dtype),
               (long long)rp->r->block_size);
    printf("request        context %s tokens x %lld sequence%s\n\n", GR(rp->r->context),
           (long long)rp->r->concurrency, rp->r->concurrency == 1 ? "" : "s");
}

/* ", q8_0: 34 B per 32 values" for a block type among the two, else "". */
static const char *block_note(int v, int k) {
    static char note[64];
    const int t = kv_plan_row_bytes(k, 1) == 0 ? k : kv_plan_row_bytes(v, 1) == 0 ? v : -1;
    if (t < 0) return "";
    snprintf(note, sizeof note, ", %s: %llu B per 32 values", kv_plan_dtype_name(t),
             (unsigned long long)kv_plan_row_bytes(t, 32));
    return note;
}

/* How bytes_per_token was formed, in the seeds' notation where it applies. */
static void print_formula(const kv_plan_model *m, const kv_plan_request *r, const kv_plan *p) {
    uint64_t vb = kv_plan_row_bytes(r->dtype, 1); /* 0 for q8_0 (block type) */
    if (kv_plan_is_mla(m) && vb)
        printf("               = %lld layers x (%lld latent + %lld rope) x %llu B\n",
               (long long)m->n_layers, (long long)m->kv_lora_rank, (long long)m->rope_dim,
               (unsigned long long)vb);
    else if (kv_plan_is_mla(m))
        printf("               = %lld layers x (%lld latent + %lld rope) as %s: %llu B\n",
               (long long)m->n_layers, (long long)m->kv_lora_rank, (long long)m->rope_dim,
               kv_plan_dtype_name(r->dtype), (unsigned long long)p->k_row_bytes);
    else if (kv_plan_swa_own_shape(m))
        printf("               = %lld full layers x (K %llu B + V %llu B) + %lld sliding layers x "
               "(K %llu B + V %llu B)\n",
               (long long)(m->n_layers - m->n_swa_layers), (unsigned long long)p->k_row_bytes,
               (unsigned long long)p->v_row_bytes, (long long)m->n_swa_layers,
               (unsigned long long)p->swa_k_row_bytes, (unsigned long long)p->swa_v_row_bytes);
    else if (r->split_v || !vb)
        printf("               = %lld layers x (K %llu B as %s + V %llu B as %s)%s\n",
               (long long)m->n_layers, (unsigned long long)p->k_row_bytes,
               kv_plan_dtype_name(r->dtype), (unsigned long long)p->v_row_bytes,
               kv_plan_dtype_name(r->split_v ? r->dtype_v : r->dtype),
               block_note(r->split_v ? r->dtype_v : r->dtype, r->dtype));
    else if (m->head_dim_k == m->head_dim_v)
        printf("               = 2 x %lld layers x %lld KV heads x %lld x %llu B\n",
               (long long)m->n_layers, (long long)m->n_kv_heads, (long long)m->head_dim_k,
               (unsigned long long)vb);
    else
        printf("               = %lld layers x %lld KV heads x (%lld K + %lld V) x %llu B\n",
               (long long)m->n_layers, (long long)m->n_kv_heads, (long long)m->head_dim_k,
               (long long)m->head_dim_v, (unsigned long long)vb);
}

static void print_kv(const report *rp) {
    const kv_plan *p = rp->p;
    const kv_plan_request *r = rp->r;
    long long B = (long long)r->concurrency;
    printf("per token      %s  (calculated)\n", FB(p->bytes_per_token));
    print_formula(rp->m, r, p);
    printf("lower bound    %s per sequence (calculated%s)\n", FB(p->seq_lower_bound_bytes),
           rp->m->n_swa_layers     ? "; sliding layers hold at most W tokens"
           : rp->m->n_chunk_layers ? "; chunked layers hold their current chunk"
                                   : "");
    printf("               x %lld = %s\n", B, FB(p->lower_bound_bytes));
    const char *label = "allocated     ";
    if (p->block_bytes) {
        printf("%s %s blocks x %s per sequence (block rounding)\n", label, GR(p->blocks_per_seq),
               FB(p->block_bytes));
        label = "              ";
    }
    if (p->swa_block_bytes)
        printf("%s %s sliding-layer blocks x %s per sequence (window + block rounding)\n", label,
               GR(p->swa_blocks_per_seq), FB(p->swa_block_bytes));
    if (p->chunk_block_bytes)
        printf("%s %s chunked-layer blocks x %s per sequence (one chunk + block rounding)\n", label,
               GR(p->chunk_blocks_per_seq), FB(p->chunk_block_bytes));
    printf("               = %s per sequence; x %lld = %s\n", FB(p->seq_allocated_bytes), B,
           FB(p->allocated_bytes));
    printf("               allocated - lower bound: %s (unfilled block tails%s)\n",
           FB(p->allocated_bytes - p->lower_bound_bytes),
           rp->m->n_swa_layers ? ", window not block-aligned" : "");
    if (rp->m->n_chunk_layers)
        printf("               (chunked layers are a KV group of their own; with all %s tokens "
               "written it holds %s chunked-layer blocks: %s per sequence)\n",
               GR(r->context), GR(p->chunk_blocks_held), FB(p->seq_held_bytes));
    if (rp->m->n_swa_layers) {
        printf(
            "               (sliding layers are a KV group of their own, as in kvllm's engine: the "
            "peak while decoding;\n"
            "                with all %s tokens written it holds %s sliding-layer block%s: %s per "
            "sequence)\n",
            GR(r->context), GR(p->swa_blocks_held), p->swa_blocks_held == 1 ? "" : "s",
            FB(p->seq_held_bytes));
    }
    printf("metadata       block table %lld B per entry + %d B header = %s per sequence; x %lld = "
           "%s\n",
           (long long)KV_PLAN_BLOCK_ENTRY_BYTES, KV_PLAN_SEQ_HEADER_BYTES,
           FB(p->seq_metadata_bytes), B, FB(p->metadata_bytes));
}

static void print_budget(const report *rp) {
    const kv_plan *p = rp->p;
    printf("weights        %s  [%s]\n", FB(p->weights_bytes), rp->weights_source);
    if (rp->m->active_weights_bytes)
        printf("               read per token: %s (the %lld selected of %lld experts; all stay "
               "resident)\n",
               FB(rp->m->active_weights_bytes), (long long)rp->m->n_expert_used,
               (long long)rp->m->n_expert);
    printf("total          %s  (weights + KV allocated + metadata)\n", FB(p->total_bytes));
    if (!rp->r->budget_bytes) return;
    printf("budget         %s%s%s%s: %s\n", FB(rp->r->budget_bytes), rp->budget_source ? " (" : "",
           rp->budget_source ? rp->budget_source : "", rp->budget_source ? ")" : "",
           p->fits ? "fits" : "does NOT fit");
    printf("max concurrency %lld sequences of %s tokens fit the budget\n",
           (long long)p->max_concurrency, GR(rp->r->context));
}

static void print_saving(const kv_plan_saving *s) {
    uint64_t base = s->base_lower_bound_bytes, now = s->lower_bound_bytes;
    printf("  %-5s vs %s%s\n", s->what, s->baseline, s->in_plan ? "" : "  (if used)");
    printf("        per token %s -> %s\n", BIN(s->base_bytes_per_token), BIN(s->bytes_per_token));
    printf("        lower bound %s -> %s", BIN(base), BIN(now));
    if (base > now)
        printf(": saves %s (%.1f%%, %.2fx)\n", FB(base - now),
               100.0 * (double)(base - now) / (double)base, (double)base / (double)now);
    else printf(": saves nothing\n");
    printf("        allocated %s -> %s\n", BIN(s->base_allocated_bytes), BIN(s->allocated_bytes));
}

static void print_verify(const verify_result *v) {
    const kv_plan_measured *ms = &v->measured;
    printf(
        "\nverify (engine's block pools, measured over a decode replay; KV groups from the %s)\n",
        v->engine_shape ? "engine's model loader" : "planner");
    if (v->note[0]) printf("  note: %s\n", v->note);
    for (int g = 0; g < ms->n_groups; g++) {
        const kv_plan_measured_group *mg = &ms->group[g];
        if (mg->window)
            printf("  group %d: %d sliding layers, window %lld\n", g, mg->n_layers,
                   (long long)mg->window);
        else if (mg->chunk)
            printf("  group %d: %d chunked layers, chunks of %lld\n", g, mg->n_layers,
                   (long long)mg->chunk);
        else printf("  group %d: %d full-attention layers\n", g, mg->n_layers);
        printf("    block bytes   planned %llu, measured %llu\n",
               (unsigned long long)v->planned_block_bytes[g], (unsigned long long)mg->block_bytes);
        printf("    peak blocks   planned %lld, measured %lld\n",
               (long long)v->planned_peak_blocks[g], (long long)mg->peak_blocks);
        printf("    blocks at T   planned %lld, measured %lld\n",
               (long long)v->planned_end_blocks[g], (long long)mg->blocks);
    }
    printf("  lower bound   planned %llu, measured %llu\n",
           (unsigned long long)v->planned.lower_bound_bytes,
           (unsigned long long)ms->lower_bound_bytes);
    printf("  allocated     planned %llu, measured %llu (peak, %lld blocks)\n",
           (unsigned long long)v->planned.allocated_bytes,
           (unsigned long long)ms->peak_allocated_bytes, (long long)ms->peak_blocks);
    printf("  held at T     planned %llu, measured %llu (%lld blocks)\n",
           (unsigned long long)v->planned_end_bytes, (unsigned long long)ms->allocated_bytes,
           (long long)ms->blocks);
    printf("  block tables  measured %llu B as allocated (grown by doubling)\n",
           (unsigned long long)ms->table_bytes);
    printf("  %s\n", v->agree ? "AGREE: the planner's allocation is exactly the engine's"
                              : "DISAGREE: the planner's allocation differs from the engine's");
}

/* --disk: what each tier of the prefix cache holds, in tokens of full blocks. */
static void print_tiers(const report *rp, uint64_t disk) {
    const kv_plan *p = rp->p;
    const int64_t bs = rp->r->block_size;
    printf("\ntiers (prefix cache, full blocks of %lld tokens)\n", (long long)bs);
    if (p->swa_block_bytes || p->chunk_block_bytes || !p->block_bytes) {
        printf("  disk           none: the disk tier needs the prefix cache and one KV group, "
               "which sliding-window and chunked-attention models lack\n");
        return;
    }
    uint64_t ram = p->allocated_bytes;
    const char *why = "this plan's allocation";
    if (rp->r->budget_bytes) {
        uint64_t used = p->weights_bytes + p->metadata_bytes;
        ram = rp->r->budget_bytes > used ? rp->r->budget_bytes - used : 0;
        why = "the budget less weights and metadata";
    }
    const uint64_t file = kv_disk_file_bytes(p->block_bytes, (int)bs);
    printf("  RAM            %s tokens in %s (%s)\n", GR((int64_t)(ram / p->block_bytes) * bs),
           BIN(ram), why);
    printf("  disk           %s tokens in %s (%llu B per block file)\n",
           GR((int64_t)(disk / file) * bs), BIN(disk), (unsigned long long)file);
}

static void print_text(const report *rp, const plan_args *a) {
    print_shape(rp);
    print_kv(rp);
    print_budget(rp);
    if (a->has_disk) print_tiers(rp, a->disk);
    if (rp->n_sav)
        printf("\nsavings (lower bound for %s tokens x %lld)\n", GR(rp->r->context),
               (long long)rp->r->concurrency);
    for (int i = 0; i < rp->n_sav; i++) print_saving(&rp->sav[i]);
    if (rp->v->done) print_verify(rp->v);
}

/* --------------------------------------------------------------- main -- */

static bool parse_args(int argc, char **argv, cli_opts *o, plan_args *a) {
    memset(a, 0, sizeof *a);
    int64_t *ints[] = {&a->context, &a->concurrency, &a->params,   &a->layers,
                       &a->heads,   &a->kv_heads,    &a->head_dim, &a->head_dim_v,
                       &a->window,  &a->swa_layers,  &a->lora,     &a->rope,
                       &a->chunk,   &a->chunk_layers};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) *ints[i] = UNSET;
    a->dtype = a->dtype_v = UNSET;
    if (!cli_parse_ex(argc, argv, o, extra_flag, a)) {
        cmd_kv_plan_usage(stderr);
        return false;
    }
    if (a->context == UNSET && o->n_ctx != 0) a->context = o->n_ctx; /* -c works too */
    if (a->context == UNSET || a->context < 1) {
        fprintf(stderr, "kvllm kv-plan: %s\n",
                a->context == UNSET ? "--context T is required (tokens per sequence)"
                                    : "-c: context must be at least 1");
        cmd_kv_plan_usage(stderr);
        return false;
    }
    if (a->concurrency == UNSET) a->concurrency = 1;
    return true;
}

static const char *source_name(const cli_opts *o, const plan_args *a) {
    return o->model_path ? o->model_path : a->config_path ? a->config_path : "flags";
}

int cmd_kv_plan(int argc, char **argv) {
    cli_opts o;
    plan_args a;
    kv_plan_model m;
    if (!parse_args(argc, argv, &o, &a) || !load_model(&o, &a, &m)) return 2;
    report rp = {.source = source_name(&o, &a), .m = &m, .budget_source = a.budget_source};
    kv_plan_request r = {.context = a.context,
                         .concurrency = a.concurrency,
                         .dtype = a.dtype != UNSET  ? a.dtype
                                  : m.kv_dtype >= 0 ? m.kv_dtype
                                                    : KV_PLAN_F16,
                         .block_size = o.block_size,
                         .budget_bytes = a.has_budget ? a.budget : 0};
    r.split_v = a.dtype_v != UNSET && a.dtype_v != r.dtype;
    r.dtype_v = r.split_v ? a.dtype_v : 0;
    r.weights_bytes = weights_bytes(&a, &m, &rp.weights_source);
    kv_plan p;
    kv_plan_saving sav[KV_PLAN_MAX_SAVINGS];
    verify_result v;
    memset(&v, 0, sizeof v);
    kvl_error err = {{0}};
    if (!kv_plan_compute(&m, &r, &p, &err)) {
        fprintf(stderr, "kvllm kv-plan: %s\n", err.msg);
        return 2;
    }
    if (a.verify && !run_verify(&o, &m, &r, &v)) return 1;
    rp.r = &r;
    rp.p = &p;
    rp.sav = sav;
    rp.n_sav = kv_plan_savings(&m, &r, sav, KV_PLAN_MAX_SAVINGS);
    rp.v = &v;
    const char *pp_file = a.config_path ? NULL : o.model_path;
    if (o.pp && o.json) {
        rp.pipeline = cJSON_CreateObject();
        if (!rp.pipeline || !kv_plan_print_pp(&o, &m, &r, pp_file, rp.pipeline)) {
            cJSON_Delete(rp.pipeline);
            return 2;
        }
    }
    if (o.json) print_json(&rp);
    else print_text(&rp, &a);
    if (o.pp && !o.json && !kv_plan_print_pp(&o, &m, &r, pp_file, NULL)) return 2;
    return v.done && !v.agree ? 1 : 0;
}
