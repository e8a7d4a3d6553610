/* The table of supported architectures. See arch.h. */
#include "arch.h"

#include <stdio.h>
#include <string.h>

#include "model.h"

/* What a family's rows share, named once; a row adds its own fields to them
 * and never sets one of them again. */
#define QWEN2_BASE .rope_type = MODEL_ROPE_NEOX, .qkv_bias_allowed = true
#define QWEN3_BASE .rope_type = MODEL_ROPE_NEOX, .qk_norm = true
#define GEMMA_BASE                                                                                 \
    .rope_type = MODEL_ROPE_NEOX, .ffn_act = ARCH_ACT_GELU, .embd_scale = true, .post_norms = true
#define GRANITE_BASE .rope_type = MODEL_ROPE_NORM, .granite_scales = true
#define COMMAND_R_BASE                                                                             \
    .rope_type = MODEL_ROPE_NORM, .norm = ARCH_NORM_LAYER, .parallel = true, .logit_scale = true,  \
    .tied_always = true

static const arch_desc ARCHS[] = {
    {.name = "llama",
     .rope_type = MODEL_ROPE_NORM,
     .qkv_bias_allowed = true,
     .moe = ARCH_MOE_OPTIONAL},
    {.name = "mistral", .rope_type = MODEL_ROPE_NORM},
    {.name = "mistral3", .rope_type = MODEL_ROPE_NORM, .attn_temp = true, .yarn_beta_keys = true},
    {.name = "smollm3", .rope_type = MODEL_ROPE_NORM, .nope_every = 4},
    {.name = "qwen2", QWEN2_BASE},
    {.name = "qwen3", QWEN3_BASE},
    {.name = "qwen2moe", QWEN2_BASE, .moe = ARCH_MOE_REQUIRED},
    {.name = "qwen3moe", QWEN3_BASE, .moe = ARCH_MOE_REQUIRED},
    {.name = "gemma2", GEMMA_BASE, .swa_pattern = 2, .n_layer_27b = 46},
    {.name = "gemma3",
     GEMMA_BASE,
     .qk_norm = true,
     .swa_pattern = 6,
     .n_layer_27b = 62,
     .swa_rope_scale_one = true},
    {.name = "gemma3n",
     GEMMA_BASE,
     .qk_norm = true,
     .swa_pattern = 5,
     .swa_rope_scale_one = true,
     .gemma4 = true,
     .altup = true},
    {.name = "gemma4",
     GEMMA_BASE,
     .qk_norm = true,
     .swa_rope_scale_one = true,
     .moe = ARCH_MOE_OPTIONAL,
     .gemma4 = true},
    {.name = "deepseek2",
     .rope_type = MODEL_ROPE_NORM,
     .attn = ARCH_ATTN_MLA,
     .moe = ARCH_MOE_OPTIONAL},
    {.name = "granite", GRANITE_BASE, .moe = ARCH_MOE_OPTIONAL},
    {.name = "granitemoe", GRANITE_BASE, .moe = ARCH_MOE_REQUIRED},
    {.name = "phi3", .rope_type = MODEL_ROPE_NEOX, .no_swa = true, .fused_gate_up = true},
    {.name = "olmo2",
     .rope_type = MODEL_ROPE_NEOX,
     .no_pre_norms = true,
     .post_norms = true,
     .qk_norm_full = true,
     .swa_pattern = 4,
     .swa_rope_plain = true},
    {.name = "command-r", COMMAND_R_BASE},
    {.name = "cohere2", COMMAND_R_BASE, .swa_pattern = 4, .rope_swa_only = true},
    {.name = "glm4moe",
     .rope_type = MODEL_ROPE_NEOX,
     .qkv_bias_allowed = true,
     .moe = ARCH_MOE_REQUIRED,
     .qk_norm_optional = true,
     .ffn_norm_post_attn = true,
     .nextn_layers = true},
    {.name = "olmoe",
     .rope_type = MODEL_ROPE_NEOX,
     .qkv_bias_allowed = true,
     .qk_norm_full = true,
     .moe = ARCH_MOE_REQUIRED},
    {.name = "gpt-oss",
     .rope_type = MODEL_ROPE_NEOX,
     .qkv_bias_allowed = true,
     .moe = ARCH_MOE_REQUIRED,
     .swa_pattern = 2,
     .ffn_norm_post_attn = true,
     .gpt_oss = true},
    {.name = "llama4",
     .rope_type = MODEL_ROPE_NORM,
     .moe = ARCH_MOE_REQUIRED,
     .swa_pattern = 4,
     .chunked = true},
};

const arch_desc *arch_find(const char *name) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strcmp(ARCHS[i].name, name) == 0) return &ARCHS[i];
    return NULL;
}

int arch_count(void) { return (int)(sizeof ARCHS / sizeof ARCHS[0]); }

const arch_desc *arch_at(int i) { return i >= 0 && i < arch_count() ? &ARCHS[i] : NULL; }

const char *arch_supported_list(void) {
    static char list[512]; /* built once from the table; model loading is single-threaded */
    if (!list[0])
        for (int i = 0; i < arch_count(); i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     ARCHS[i].name);
    return list;
}
