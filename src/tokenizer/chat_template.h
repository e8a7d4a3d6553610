/* chat_template: renders a conversation into a prompt string the way a model's
 * official Jinja chat template would, without a Jinja engine.
 *
 * Like llama.cpp's llm_chat_detect_template, the family is recognised from
 * markers in the GGUF's tokenizer.chat_template text; each family's rendering is
 * hard-coded after the official template:
 *
 *   chatml     <|im_start|>          Qwen, OpenHermes, ... (also the fallback)
 *   llama3     <|start_header_id|>   Meta Llama 3 (content trimmed, BOS first)
 *   llama2     [INST] + <<SYS>>      Llama 2 chat (BOS before every user turn)
 *   mistral    [INST]                Mistral Instruct v0.1/v0.2 (system folded
 *                                    into the first user turn as "SYS\n\nUSER")
 *   gemma      <start_of_turn>       Gemma 1-3 (role "model"; system folded into
 *                                    the first user turn as Gemma 3 does)
 *   deepseek3  <｜User｜>/<｜Assistant｜> DeepSeek V2.5/V3/R1 (system prompt after BOS)
 *   deepseek2  'User: '/'Assistant: ' DeepSeek LLM / V2 chat
 *
 * The BOS text (bos_token in the templates) is written where the official
 * template writes it; the caller tokenizes with parse_special=true and adds a
 * BOS id only if the rendered text does not already begin with the BOS text.
 * A template that matches no family is an error (CHAT_TMPL_UNKNOWN). */
#ifndef KVLLM_CHAT_TEMPLATE_H
#define KVLLM_CHAT_TEMPLATE_H

#include "base.h"

typedef enum chat_family {
    CHAT_TMPL_UNKNOWN = 0,
    CHAT_TMPL_CHATML,
    CHAT_TMPL_LLAMA3,
    CHAT_TMPL_LLAMA2,
    CHAT_TMPL_MISTRAL,
    CHAT_TMPL_GEMMA,
    CHAT_TMPL_DEEPSEEK3,
    CHAT_TMPL_DEEPSEEK2,
} chat_family;

/* The family used when a model has no tokenizer.chat_template. */
#define CHAT_TMPL_FALLBACK CHAT_TMPL_CHATML

typedef struct chat_msg {
    const char *role;    /* "system", "user", "assistant" ("developer" = system) */
    const char *content; /* UTF-8, NUL-terminated */
} chat_msg;

/* Family of a Jinja template text; CHAT_TMPL_UNKNOWN if no marker matches.
 * NULL or "" gives CHAT_TMPL_FALLBACK. */
chat_family chat_template_detect(const char *tmpl_src);
/* "chatml", "llama3", ... ; "unknown". */
const char *chat_family_name(chat_family f);
/* The family of a name as chat_family_name spells it; CHAT_TMPL_UNKNOWN if none. */
chat_family chat_family_from_name(const char *name);
/* The BOS / EOS texts the family's official models use ("" for none). */
const char *chat_family_bos(chat_family f);
const char *chat_family_eos(chat_family f);

/* Renders msgs with family f. bos/eos: the vocabulary's BOS/EOS texts (NULL:
 * the family's defaults). On success *out is a malloc'd NUL-terminated string
 * (caller frees) and its length is returned; on failure (unknown family, a role
 * the family does not support, roles that do not alternate where the template
 * requires it, out of memory) -1 with err set. */
int64_t chat_template_render(chat_family f, const char *bos, const char *eos, const chat_msg *msgs,
                             int n, bool add_generation_prompt, char **out, kvl_error *err);

/* Detects the family of tmpl_src (NULL: the fallback) and renders with the
 * family's default BOS/EOS texts. Returns the length or -1 (err names the problem). */
int64_t chat_template_apply(const char *tmpl_src, const chat_msg *msgs, int n,
                            bool add_generation_prompt, char **out, kvl_error *err);

#endif
