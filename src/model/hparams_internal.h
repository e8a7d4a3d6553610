/* hparams, private: what the two readers of model shape share, the GGUF
 * reader (hparams.c) and the config.json reader (hparams_hf.c): the struct's
 * defaults, the sliding-window pattern rules and llama.cpp's per-family
 * mixture-of-experts defaults and checks, all defined in hparams.c. */
#ifndef KVLLM_HPARAMS_INTERNAL_H
#define KVLLM_HPARAMS_INTERNAL_H

#include "hparams.h"

#define MAX_WINDOW (1 << 24) /* the largest sliding window either reader accepts */

/* Zeroes *hp and sets llama.cpp's defaults for keys a file may leave out. */
void hparams_init(model_hparams *hp);
/* The architecture table's sliding-window pattern length for a family whose
 * files may not carry one (GGUF name or config.json model_type); 0: none. */
int64_t hparams_default_swa_pattern(const char *arch);
/* llama.cpp's set_swa_pattern(n): layer il slides iff n == 0 or il % n < n - 1. */
void hparams_set_swa_pattern(model_hparams *hp, int64_t n);
/* Counts the sliding layers; no window means none. */
void hparams_finish_swa(model_hparams *hp);

/* The MoE keys' names in messages: GGUF "key 'qwen3moe.expert_count'", or
 * config.json "'num_experts'". */
enum {
    MOE_COUNT,
    MOE_USED,
    MOE_LEAD,
    MOE_FF_EXP,
    MOE_SHARED,
    MOE_GATING,
    MOE_GROUP,
    MOE_GROUP_USED,
    MOE_SCALE,
    MOE_NAMES
};
typedef char moe_names[MOE_NAMES][96];

/* Expert widths, shared experts and gating as llama.cpp's loader sets them per
 * family, and the counts' consistency; path and nm name the file and keys in
 * messages. Called only for files with experts (mo->n_expert > 0). */
bool hparams_moe_defaults(const char *path, moe_names nm, const char *a, int64_t n_ff,
                          int64_t n_layer, int64_t n_shared, int64_t gating, model_moe_hparams *mo,
                          kvl_error *err);

#endif
