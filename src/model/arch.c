/* The table of supported architectures. See arch.h. */
#include "arch.h"

#include <string.h>

#include "model.h"

static const arch_desc ARCHS[] = {
    {.name = "llama", .rope_type = MODEL_ROPE_NORM, .qkv_bias_allowed = true},
    {.name = "mistral", .rope_type = MODEL_ROPE_NORM},
    {.name = "qwen2", .rope_type = MODEL_ROPE_NEOX, .qkv_bias_allowed = true},
    {.name = "qwen3", .rope_type = MODEL_ROPE_NEOX, .qk_norm = true},
};

const arch_desc *arch_find(const char *name) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strcmp(ARCHS[i].name, name) == 0) return &ARCHS[i];
    return NULL;
}

const char *arch_supported_list(void) { return "llama, mistral, qwen2, qwen3"; }
