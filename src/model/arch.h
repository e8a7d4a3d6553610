/* Architecture descriptions: what differs between the decoder-only families we
 * load. Adding a family is one table row (plus code only for genuinely new ops). */
#ifndef KVLLM_ARCH_H
#define KVLLM_ARCH_H

#include <stdbool.h>

typedef struct arch_desc {
    const char *name;      /* general.architecture */
    int rope_type;         /* MODEL_ROPE_NORM or MODEL_ROPE_NEOX */
    bool qk_norm;          /* per-head RMSNorm of q and k before rope (qwen3) */
    bool qkv_bias_allowed; /* optional q/k/v biases (qwen2) */
} arch_desc;

/* NULL if the architecture is not supported. */
const arch_desc *arch_find(const char *name);
/* Comma-separated list of supported names, for error messages. */
const char *arch_supported_list(void);

#endif
