/* srv_tools: tool calling and reasoning output for /v1/chat/completions.
 *
 * The chat template decides how a model writes a tool call; chat_caps_detect
 * reads that once from the template's source (its markers), and the request's
 * output is then cut by an out_parser into content, reasoning_content (the
 * text inside <think>...</think>) and tool calls, incrementally so that a
 * stream can send each part as soon as it is decided. Text that may still be
 * the beginning of a marker is held back until the next token decides it.
 *
 * Call formats (as the templates in tests/data/chat-templates render an
 * assistant's tool calls):
 *   HERMES       <tool_call>{"name": N, "arguments": {...}}</tool_call>
 *                (Qwen 2.5/3, Hermes 2 Pro, Granite 4, MiMo, Reka)
 *   QWEN_XML     <tool_call><function=N><parameter=K>V</parameter></function></tool_call>
 *                (Qwen3.5, Qwen3-Coder, Nemotron 3; a JSON body is accepted too)
 *   GLM          <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>  (GLM 4.5/4.6)
 *   LLAMA3       {"name": N, "parameters": {...}} as the whole answer, or after <|python_tag|>
 *   MISTRAL      [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]   (Nemo)
 *   MISTRAL_V11  [TOOL_CALLS]N[CALL_ID]id[ARGS]{...}  ([CALL_ID] optional; Small 3.2, Ministral 3)
 *   DEEPSEEK     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
 *                (V3.1), and R1's  ...begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>
 *   KIMI         <|tool_calls_section_begin|><|tool_call_begin|>functions.N:0<|tool_call_argument_begin|>{...}
 *                <|tool_call_end|>...<|tool_calls_section_end|>
 *   FUNCTIONARY  <function=N>{...}</function>   (Functionary v3.1)
 *   GPT_OSS      harmony: <|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}<|call|>;
 *                the analysis channel is the reasoning, the final channel the content
 *   APRIEL       <tool_calls>[{"name": N, "arguments": {...}}, ...]</tool_calls>
 *   COMMAND_R7B  <|START_ACTION|>[{"tool_call_id": "0", "tool_name": N, "parameters": {...}}]<|END_ACTION|>
 *   APERTUS      <|tools_prefix|>[{N: {...}}, ...]<|tools_suffix|>
 *   GRANITE      <|tool_call|>[{"name": N, "arguments": {...}}, ...]   (Granite 3.x)
 *   SEED_OSS     <seed:tool_call><function=N><parameter=K>V</parameter></function></seed:tool_call>
 *   MINIMAX      <minimax:tool_call><invoke name="N"><parameter name="K">V</parameter></invoke>...</minimax:tool_call>
 *   MINICPM      <function name="N"><param name="K">V</param></function>   (MiniCPM 5)
 *   DSML         <｜DSML｜tool_calls><｜DSML｜invoke name="N"><｜DSML｜parameter name="K" string="...">V
 *                </｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>   (DeepSeek V4)
 *                In these XML-like formats a value is JSON unless the schema says string;
 *                a JSON object as the whole body is read as the arguments (constrained calls).
 *   GEMMA4       <|tool_call>call:N{k:<|"|>text<|"|>,n:3,b:true,o:{...},a:[...]}<tool_call|>...
 *                (Gemma 4: bare keys, strings between <|"|> tokens, no whitespace; its
 *                reasoning is <|channel>thought\n...<channel|>). srv_tool_gemma.c reads and
 *                writes these values and builds their grammar from the schema.
 *   GENERIC      {"name": N, "arguments": {...}} (or an array of them) as the whole answer:
 *                for templates with no tool syntax; the tools are then described in a
 *                system message (tool_system_prompt), as llama-server does. */
#ifndef KVLLM_SRV_TOOLS_H
#define KVLLM_SRV_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "kvl_buf.h"

typedef enum tool_format {
    TOOL_FMT_NONE = 0, /* tool calls are not parsed */
    TOOL_FMT_GENERIC,
    TOOL_FMT_HERMES,
    TOOL_FMT_QWEN_XML,
    TOOL_FMT_GLM,
    TOOL_FMT_LLAMA3,
    TOOL_FMT_MISTRAL,
    TOOL_FMT_MISTRAL_V11,
    TOOL_FMT_DEEPSEEK,
    TOOL_FMT_DEEPSEEK_R1,
    TOOL_FMT_KIMI,
    TOOL_FMT_FUNCTIONARY,
    TOOL_FMT_GPT_OSS,
    TOOL_FMT_APRIEL,
    TOOL_FMT_COMMAND_R7B,
    TOOL_FMT_APERTUS,
    TOOL_FMT_GRANITE,
    TOOL_FMT_SEED_OSS,
    TOOL_FMT_MINIMAX,
    TOOL_FMT_MINICPM,
    TOOL_FMT_DSML,
    TOOL_FMT_GIGACHAT,
    TOOL_FMT_SOLAR_OPEN,
    TOOL_FMT_DSML_V32, /* DeepSeek V3.2: DSML with function_calls (V4: tool_calls) */
    TOOL_FMT_GEMMA4,   /* Gemma 4: <|tool_call>call:N{k:v,...}<tool_call|> */
    TOOL_FMT_COUNT     /* not a format: how many there are */
} tool_format;

const char *tool_format_name(tool_format f);

/* What a chat template offers, read from its source once at start-up. */
typedef struct chat_caps {
    tool_format format; /* the model's call syntax; GENERIC when the template shows none */
    bool reads_tools;   /* the template renders the `tools` variable itself */
    bool thinks;        /* reasoning between think_open and think_close */
    const char *think_open,
        *think_close; /* <think> </think>; Seed-OSS's <seed:think>, Command R7B's
                                             <|START_THINKING|>, Gemma 4's <|channel>thought */
} chat_caps;

/* src NULL or "": no Jinja template (GENERIC, no tools, no reasoning). */
void chat_caps_detect(const char *src, chat_caps *caps);

typedef enum tool_choice {
    TOOL_CHOICE_AUTO = 0,
    TOOL_CHOICE_NONE,
    TOOL_CHOICE_REQUIRED,
    TOOL_CHOICE_NAMED,
} tool_choice;

/* A request's tools, validated. */
typedef struct tool_spec {
    cJSON *tools; /* copy of the request's "tools" array; NULL: none */
    int n;
    const char **names;   /* n function names (into tools) */
    const cJSON **params; /* n parameter schemas (into tools; NULL when absent) */
    tool_choice choice;
    int named;     /* TOOL_CHOICE_NAMED: index of the function */
    bool parallel; /* parallel_tool_calls (default true) */
} tool_spec;

/* Reads tools / tool_choice / parallel_tool_calls from a request body. On a bad
 * value fills err_param (the field) and err_msg and returns false. */
bool tool_spec_parse(const cJSON *body, tool_spec *t, char *err_param, size_t param_cap,
                     char *err_msg, size_t msg_cap);
void tool_spec_free(tool_spec *t);

/* The text of a system message describing t's tools and how to call one in
 * format f (for templates that do not render `tools`). malloc'd. */
char *tool_system_prompt(tool_format f, const tool_spec *t);

/* n calls written in format f as a constrained call writes them (names[i]
 * with the arguments JSON args[i]), appended to out. */
void tool_calls_text(tool_format f, const char *const *names, const char *const *args, int n,
                     kvl_buf *out);

/* The marker strings of format f (for keeping their control tokens in the
 * output text). Returns how many were written to out (at most cap). */
int tool_format_markers(tool_format f, const char **out, int cap);

/* GBNF (llama.cpp syntax) of the calls format f allows for t's tool_choice
 * (required: any function, one call or, with parallel_tool_calls, one or
 * more; named: one call of that function). Each function's arguments follow its
 * parameter schema through schema_rules(schema JSON, rule prefix, out, err),
 * which appends the rules (the value rule is <prefix>root). close_think: the
 * output starts inside a think block, which the grammar closes first with this
 * tag (NULL: it does not). */
typedef bool (*schema_rules_fn)(const char *schema_json, const char *prefix, kvl_buf *out,
                                char *err, size_t err_cap);
bool tool_grammar(tool_format f, const tool_spec *t, const char *close_think,
                  schema_rules_fn schema_rules, kvl_buf *out, char *err, size_t err_cap);

/* ------------------------------------------------------------ output -- */

typedef struct tool_call_out {
    char id[40];
    char *name;
    char *arguments; /* JSON text */
} tool_call_out;

/* What one feed decided. */
typedef struct parse_out {
    kvl_buf content, reasoning;
    tool_call_out *calls;
    int n_calls;
    size_t cap_calls;
} parse_out;
void parse_out_reset(parse_out *o); /* empties it, keeping its buffers */
void parse_out_free(parse_out *o);

typedef struct out_parser {
    tool_format fmt; /* NONE: no tool calls */
    const tool_spec *tools;
    bool think;       /* split <think> reasoning */
    bool in_think;    /* inside a think block (or harmony's analysis channel) */
    bool any_content; /* non-space content was decided (bare-JSON calls only come first) */
    bool skip_ws;     /* drop whitespace here: just after a marker */
    kvl_buf held;     /* whitespace before a possible marker, not sent yet */
    kvl_buf text;     /* the whole output so far */
    size_t pos;       /* text[0..pos) is decided */
    int n_calls;      /* calls found so far */
    bool oss_header;  /* gpt-oss: inside a message header (before <|message|>) */
    bool oss_call;    /* gpt-oss: the current message is a call */
    char *oss_name;
    const char *think_open, *think_close; /* "<think>" "</think>" unless set after init */
} out_parser;

/* in_think: the prompt ends inside a think block (the template opened it). */
void out_parser_init(out_parser *p, tool_format fmt, const tool_spec *t, bool think, bool in_think);
/* Adds n bytes of output; final: the output is complete (decide everything). */
void out_parser_feed(out_parser *p, const char *s, size_t n, bool final, parse_out *o);
void out_parser_free(out_parser *p);

/* Whether the prompt text ends inside a think block (its last open tag comes
 * after its last close tag). */
bool prompt_opens_think(const char *prompt, size_t n, const char *open, const char *close);

#endif
