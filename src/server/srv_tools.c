/* Tool calling, request side (srv_tools.h): the template's call format
 * (chat_caps_detect), the request's tools (tool_spec_parse), and how a call is
 * written: as text (tool_calls_text, tool_format_markers), in the system
 * prompt (tool_system_prompt) and as a grammar (tool_grammar). The output side
 * is srv_tool_calls.c (the per-format call parsers) and srv_tool_stream.c (the
 * incremental out_parser); they were one file of 1260 lines. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_tools_int.h"

const char *tool_format_name(tool_format f) {
    static const char *const names[] = {
        "none",          "generic",     "hermes",      "qwen-xml",
        "glm",           "llama3",      "mistral",     "mistral-v11",
        "deepseek",      "deepseek-r1", "kimi",        "functionary",
        "gpt-oss",       "apriel",      "command-r7b", "apertus",
        "granite",       "seed-oss",    "minimax",     "minicpm",
        "deepseek-dsml", "gigachat",    "solar-open",  "deepseek-dsml-v3.2",
        "gemma4"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

/* ------------------------------------------------------------- caps -- */

static bool has(const char *s, const char *m) { return strstr(s, m) != NULL; }

/* Whether the template reads the variable `tools`: the word appears outside a
 * longer identifier (tool_calls, tools_in_user_message do not count). */
static bool reads_word(const char *src, const char *w) {
    size_t n = strlen(w);
    for (const char *p = strstr(src, w); p; p = strstr(p + 1, w)) {
        bool before = p > src && (isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '.');
        bool after = isalnum((unsigned char)p[n]) || p[n] == '_';
        if (!before && !after) return true;
    }
    return false;
}

void chat_caps_detect(const char *src, chat_caps *c) {
    memset(c, 0, sizeof *c);
    c->format = TOOL_FMT_GENERIC;
    if (!src || !src[0]) return;
    c->reads_tools = reads_word(src, "tools");
    c->think_open = "<think>";
    c->think_close = "</think>";
    if (has(src, "<seed:think>")) c->think_open = "<seed:think>", c->think_close = "</seed:think>";
    else if (has(src, "<|START_THINKING|>"))
        c->think_open = "<|START_THINKING|>", c->think_close = "<|END_THINKING|>";
    else if (has(src, "[THINK]"))
        c->think_open = "[THINK]", c->think_close = "[/THINK]"; /* Magistral, Ministral 3 */
    else if (has(src, "<|channel>thought"))
        c->think_open = "<|channel>thought", c->think_close = "<channel|>"; /* Gemma 4 */
    c->thinks = has(src, c->think_open) || has(src, c->think_close);
    /* The most specific markers first: Qwen3.5 writes <function=...> inside <tool_call>;
     * Apriel 1.5 names <tool_call></tool_call> in its instructions but writes a
     * <tool_calls>[...] list. */
    if (has(src, "<|tool_call>call:")) c->format = TOOL_FMT_GEMMA4;
    else if (has(src, "<tool_calls>[")) c->format = TOOL_FMT_APRIEL;
    else if (has(src, "<tool_call>") && has(src, "<function=")) c->format = TOOL_FMT_QWEN_XML;
    else if (has(src, "<tool_call>") && has(src, "<arg_key>")) c->format = TOOL_FMT_GLM;
    else if (has(src, "<tool_call>")) c->format = TOOL_FMT_HERMES;
    else if (has(src, "<seed:tool_call>")) c->format = TOOL_FMT_SEED_OSS;
    else if (has(src, "<minimax:tool_call>")) c->format = TOOL_FMT_MINIMAX;
    else if (has(src, DSML_BARE)) /* '<' + dsml_token + 'tool_calls>' (V3.2: 'function_calls>') */
        c->format = has(src, "function_calls>") ? TOOL_FMT_DSML_V32 : TOOL_FMT_DSML;
    else if (has(src, "<function name=")) c->format = TOOL_FMT_MINICPM;
    else if (has(src, "[TOOL_CALLS]") && has(src, "[ARGS]")) c->format = TOOL_FMT_MISTRAL_V11;
    else if (has(src, "[TOOL_CALLS]")) c->format = TOOL_FMT_MISTRAL;
    else if (has(src, "tool\xe2\x96\x81"
                      "calls\xe2\x96\x81"
                      "begin"))
        c->format = has(src, "```json") ? TOOL_FMT_DEEPSEEK_R1 : TOOL_FMT_DEEPSEEK;
    else if (has(src, "<|tool_calls_section_begin|>")) c->format = TOOL_FMT_KIMI;
    else if (has(src, "<|channel|>") && has(src, "<|message|>")) c->format = TOOL_FMT_GPT_OSS;
    else if (has(src, "<tool_calls>")) c->format = TOOL_FMT_APRIEL;
    else if (has(src, "<|START_ACTION|>")) c->format = TOOL_FMT_COMMAND_R7B;
    else if (has(src, "<|tools_prefix|>")) c->format = TOOL_FMT_APERTUS;
    else if (has(src, "<|tool_call|>")) c->format = TOOL_FMT_GRANITE;
    else if (has(src, "<|tool_call:begin|>")) c->format = TOOL_FMT_SOLAR_OPEN;
    else if (has(src, "<|function_call|>")) c->format = TOOL_FMT_GIGACHAT; /* GigaChat 3.1 */
    else if (has(src, "<function=")) c->format = TOOL_FMT_FUNCTIONARY;
    else if (has(src, "<|python_tag|>") ||
             (has(src, "<|start_header_id|>") && has(src, "\"parameters\"")))
        c->format = TOOL_FMT_LLAMA3;
}

/* ------------------------------------------------------------- spec --- */

/* Where a failure is reported: the offending parameter and the message. */
typedef struct spec_err {
    char *param;
    size_t pcap;
    char *msg;
    size_t mcap;
} spec_err;

static bool bad(const spec_err *e, const char *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool bad(const spec_err *e, const char *p, const char *fmt, ...) {
    snprintf(e->param, e->pcap, "%s", p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->mcap, fmt, ap);
    va_end(ap);
    return false;
}

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* OpenAI's rule for function names: a-z, A-Z, 0-9, underscores and dashes, at most 64. */
static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.')
            return false;
    return true;
}

/* tools[i], {"type": "function", "function": {"name", "description"?,
 * "parameters"?, "strict"?}}, its name unused by tools[0..i). */
static bool parse_tool(const cJSON *tool, int i, tool_spec *t, const spec_err *e) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tool, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    char p[32];
    snprintf(p, sizeof p, "tools[%d]", i);
    if (!cJSON_IsObject(tool) || !cJSON_IsString(type) ||
        strcmp(type->valuestring, "function") != 0)
        return bad(e, p, "%s: only {\"type\": \"function\"} tools are supported", p);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !valid_name(name->valuestring))
        return bad(e, p,
                   "%s.function.name must be a string of 1 to 64 letters, digits, '_', '-' or '.'",
                   p);
    const cJSON *desc = field(fn, "description");
    if (desc && !cJSON_IsString(desc))
        return bad(e, p, "%s.function.description must be a string", p);
    const cJSON *params = field(fn, "parameters");
    if (params && !cJSON_IsObject(params))
        return bad(e, p, "%s.function.parameters must be a JSON Schema object", p);
    const cJSON *strict = field(fn, "strict");
    if (strict && !cJSON_IsBool(strict))
        return bad(e, p, "%s.function.strict must be a boolean", p);
    for (int k = 0; k < i; k++)
        if (!strcmp(t->names[k], name->valuestring))
            return bad(e, p, "%s: the function name '%s' is used twice", p, name->valuestring);
    t->names[i] = name->valuestring;
    t->params[i] = params;
    return true;
}

/* The "tools" array (NULL or an array), copied into t. */
static bool parse_tool_array(const cJSON *tools, tool_spec *t, const spec_err *e) {
    int n = tools ? cJSON_GetArraySize(tools) : 0;
    if (n == 0) return true;
    t->tools = cJSON_Duplicate(tools, true);
    t->names = calloc((size_t)n, sizeof *t->names);
    t->params = calloc((size_t)n, sizeof *t->params);
    if (!t->tools || !t->names || !t->params) return bad(e, "tools", "out of memory");
    int i = 0;
    for (const cJSON *tool = t->tools->child; tool; tool = tool->next, i++)
        if (!parse_tool(tool, i, t, e)) return false;
    t->n = n;
    return true;
}

/* "tool_choice": absent (auto), "auto" | "none" | "required", or
 * {"type": "function", "function": {"name": ...}} naming one of t's tools. */
static bool parse_choice(const cJSON *choice, tool_spec *t, const spec_err *e) {
    if (!choice) {
        t->choice = TOOL_CHOICE_AUTO;
    } else if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (!strcmp(c, "auto")) t->choice = TOOL_CHOICE_AUTO;
        else if (!strcmp(c, "none")) t->choice = TOOL_CHOICE_NONE;
        else if (!strcmp(c, "required")) t->choice = TOOL_CHOICE_REQUIRED;
        else
            return bad(e, "tool_choice",
                       "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                       "\"function\", "
                       "\"function\": {\"name\": ...}} (got \"%.40s\")",
                       c);
    } else if (cJSON_IsObject(choice)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
            !cJSON_IsString(name))
            return bad(e, "tool_choice",
                       "'tool_choice' as an object must be {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}}");
        t->choice = TOOL_CHOICE_NAMED;
        t->named = -1;
        for (int i = 0; i < t->n; i++)
            if (!strcmp(t->names[i], name->valuestring)) t->named = i;
        if (t->named < 0) {
            char nm[80];
            snprintf(nm, sizeof nm, "%s", name->valuestring);
            return bad(e, "tool_choice",
                       "'tool_choice' names the function '%s', which is not in 'tools'", nm);
        }
    } else {
        return bad(e, "tool_choice", "'tool_choice' must be a string or an object");
    }
    if (t->n == 0 && (t->choice == TOOL_CHOICE_REQUIRED || t->choice == TOOL_CHOICE_NAMED))
        return bad(e, "tool_choice", "'tool_choice' \"required\" needs a non-empty 'tools'");
    return true;
}

bool tool_spec_parse(const cJSON *body, tool_spec *t, char *ep, size_t epc, char *em, size_t emc) {
    const spec_err e = {ep, epc, em, emc};
    memset(t, 0, sizeof *t);
    t->parallel = true;
    const cJSON *tools = field(body, "tools");
    const cJSON *par = field(body, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par))
        return bad(&e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    if (par) t->parallel = cJSON_IsTrue(par);
    if (tools && !cJSON_IsArray(tools))
        return bad(&e, "tools", "'tools' must be an array of {\"type\": \"function\", ...}");
    if (!parse_tool_array(tools, t, &e) || !parse_choice(field(body, "tool_choice"), t, &e)) {
        tool_spec_free(t);
        return false;
    }
    return true;
}

void tool_spec_free(tool_spec *t) {
    cJSON_Delete(t->tools);
    free(t->names);
    free(t->params);
    memset(t, 0, sizeof *t);
}

/* --------------------------------------------------- formats as text -- */

/* How one call is written: pre + NAME + mid + ARGUMENTS + post; calls of one
 * answer sit between open and close, separated by sep. */
typedef struct call_shape {
    const char *open, *pre, *mid, *post, *sep, *close;
    bool parallel; /* the format can hold more than one call */
} call_shape;

static call_shape shape_of(tool_format f) {
    switch (f) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML: /* our parser reads a JSON body inside <tool_call> for these formats too */
    case TOOL_FMT_GLM:
        return (call_shape){
            "",  "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>", "\n", "",
            true};
    case TOOL_FMT_LLAMA3:
        return (call_shape){"", "{\"name\": \"", "\", \"parameters\": ", "}", "", "", false};
    case TOOL_FMT_MISTRAL:
        return (call_shape){
            "[TOOL_CALLS][", "{\"name\": \"", "\", \"arguments\": ", "}", ", ", "]", true};
    case TOOL_FMT_MISTRAL_V11: return (call_shape){"", "[TOOL_CALLS]", "[ARGS]", "", "", "", true};
    case TOOL_FMT_DEEPSEEK:
        return (call_shape){DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_SEP, DS_CALL_END, "",
                            DS_CALLS_END,   true};
    case TOOL_FMT_DEEPSEEK_R1:
        return (call_shape){DS_CALLS_BEGIN,
                            DS_CALL_BEGIN "function" DS_SEP,
                            "\n```json\n",
                            "\n```" DS_CALL_END,
                            "",
                            DS_CALLS_END,
                            true};
    case TOOL_FMT_KIMI:
        return (call_shape){"<|tool_calls_section_begin|>",
                            "<|tool_call_begin|>functions.",
                            ":0<|tool_call_argument_begin|>",
                            "<|tool_call_end|>",
                            "",
                            "<|tool_calls_section_end|>",
                            true};
    case TOOL_FMT_FUNCTIONARY:
        return (call_shape){"", "<function=", ">", "</function>", "", "", true};
    case TOOL_FMT_GPT_OSS:
        return (call_shape){"",
                            "<|channel|>commentary to=functions.",
                            " <|constrain|>json<|message|>",
                            "",
                            "",
                            "",
                            false};
    case TOOL_FMT_APRIEL:
        return (call_shape){"<tool_calls>[",
                            "{\"name\": \"",
                            "\", \"arguments\": ",
                            "}",
                            ", ",
                            "]</tool_calls>",
                            true};
    case TOOL_FMT_COMMAND_R7B:
        return (call_shape){"<|START_ACTION|>[",
                            "{\"tool_call_id\": \"0\", \"tool_name\": \"",
                            "\", \"parameters\": ",
                            "}",
                            ", ",
                            "]<|END_ACTION|>",
                            true};
    case TOOL_FMT_APERTUS:
        return (call_shape){"<|tools_prefix|>[", "{\"", "\": ", "}", ", ",
                            "]<|tools_suffix|>", true};
    case TOOL_FMT_GRANITE:
        return (call_shape){
            "<|tool_call|>[", "{\"name\": \"", "\", \"arguments\": ", "}", ", ", "]", true};
    case TOOL_FMT_SEED_OSS:
        return (call_shape){"",    "<seed:tool_call>\n<function=",
                            ">\n", "\n</function>\n</seed:tool_call>",
                            "\n",  "",
                            true};
    case TOOL_FMT_MINIMAX:
        return (call_shape){"<minimax:tool_call>\n",
                            "<invoke name=\"",
                            "\">\n",
                            "\n</invoke>",
                            "\n",
                            "\n</minimax:tool_call>",
                            true};
    case TOOL_FMT_MINICPM:
        return (call_shape){"", "<function name=\"", "\">", "</function>", "\n", "", true};
    case TOOL_FMT_DSML:
        return (call_shape){DSML "tool_calls>\n",
                            DSML "invoke name=\"",
                            "\">\n",
                            "\n</" DSML_BARE "invoke>",
                            "\n",
                            "\n</" DSML_BARE "tool_calls>",
                            true};
    case TOOL_FMT_DSML_V32:
        return (call_shape){DSML "function_calls>\n",
                            DSML "invoke name=\"",
                            "\">\n",
                            "\n</" DSML_BARE "invoke>",
                            "\n",
                            "\n</" DSML_BARE "function_calls>",
                            true};
    case TOOL_FMT_GIGACHAT: /* one call a message: the template renders tool_calls[0] only */
        return (call_shape){
            "", "<|function_call|>{\"name\": \"", "\", \"arguments\": ", "}", "", "", false};
    case TOOL_FMT_SOLAR_OPEN: /* each call carries an id; a constrained call writes "0" */
        return (call_shape){"<|tool_calls|>",
                            "<|tool_call:begin|>0<|tool_call:name|>",
                            "<|tool_call:args|>",
                            "<|tool_call:end|>",
                            "",
                            "<|calls|>",
                            true};
    case TOOL_FMT_GEMMA4: /* the arguments in its own syntax (tools_gemma_write) */
        return (call_shape){"", "<|tool_call>call:", "", "<tool_call|>", "", "", true};
    default: return (call_shape){"", "{\"name\": \"", "\", \"arguments\": ", "}", "", "", false};
    }
}

int tool_format_markers(tool_format f, const char **out, int cap) {
    static const char *const hermes[] = {"<tool_call>", "</tool_call>"};
    static const char *const llama3[] = {"<|python_tag|>"};
    static const char *const mistral[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
    static const char *const deepseek[] = {DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END,
                                           DS_SEP};
    static const char *const kimi[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                       "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                       "<|tool_call_end|>"};
    static const char *const oss[] = {"<|channel|>", "<|message|>", "<|constrain|>",
                                      "<|start|>",   "<|end|>",     "<|call|>"};
    static const char *const think[] = {
        "<think>",          "</think>", "<seed:think>", "</seed:think>", "<|START_THINKING|>",
        "<|END_THINKING|>", "[THINK]",  "[/THINK]",     "<|channel>",    "<channel|>"};
    static const char *const apriel[] = {"<tool_calls>", "</tool_calls>"};
    static const char *const cohere[] = {"<|START_ACTION|>", "<|END_ACTION|>"};
    static const char *const apertus[] = {"<|tools_prefix|>", "<|tools_suffix|>"};
    static const char *const granite[] = {"<|tool_call|>"};
    static const char *const seed[] = {"<seed:tool_call>", "</seed:tool_call>"};
    static const char *const minimax[] = {"<minimax:tool_call>", "</minimax:tool_call>"};
    static const char *const gigachat[] = {"<|function_call|>"};
    static const char *const solar[] = {"<|tool_calls|>",      "<|calls|>",
                                        "<|tool_call:begin|>", "<|tool_call:name|>",
                                        "<|tool_call:args|>",  "<|tool_call:end|>"};
    static const char *const gemma4[] = {"<|tool_call>", "<tool_call|>", "<|\"|>"};
    const char *const *m = NULL;
    int n = 0;
    switch (f) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML:
    case TOOL_FMT_GLM: m = hermes, n = 2; break;
    case TOOL_FMT_LLAMA3: m = llama3, n = 1; break;
    case TOOL_FMT_MISTRAL:
    case TOOL_FMT_MISTRAL_V11: m = mistral, n = 3; break;
    case TOOL_FMT_DEEPSEEK:
    case TOOL_FMT_DEEPSEEK_R1: m = deepseek, n = 5; break;
    case TOOL_FMT_KIMI: m = kimi, n = 5; break;
    case TOOL_FMT_GPT_OSS: m = oss, n = 6; break;
    case TOOL_FMT_APRIEL: m = apriel, n = 2; break;
    case TOOL_FMT_COMMAND_R7B: m = cohere, n = 2; break;
    case TOOL_FMT_APERTUS: m = apertus, n = 2; break;
    case TOOL_FMT_GRANITE: m = granite, n = 1; break;
    case TOOL_FMT_SEED_OSS: m = seed, n = 2; break;
    case TOOL_FMT_MINIMAX: m = minimax, n = 2; break;
    case TOOL_FMT_GIGACHAT: m = gigachat, n = 1; break;
    case TOOL_FMT_SOLAR_OPEN: m = solar, n = 6; break;
    case TOOL_FMT_GEMMA4: m = gemma4, n = 3; break;
    default: break;
    }
    int k = 0;
    for (int i = 0; i < n && k < cap; i++) out[k++] = m[i];
    for (int i = 0; i < (int)(sizeof think / sizeof think[0]) && k < cap; i++) out[k++] = think[i];
    return k;
}

void tool_calls_text(tool_format f, const char *const *names, const char *const *args, int n,
                     kvl_buf *out) {
    call_shape c = shape_of(f);
    kvl_buf_puts(out, c.open);
    for (int i = 0; i < n; i++) {
        if (i) kvl_buf_puts(out, c.sep);
        kvl_buf_printf(out, "%s%s%s", c.pre, names[i], c.mid);
        if (f == TOOL_FMT_GEMMA4) tools_gemma_write(args[i], out);
        else kvl_buf_puts(out, args[i]);
        kvl_buf_puts(out, c.post);
    }
    kvl_buf_puts(out, c.close);
}

char *tool_system_prompt(tool_format f, const tool_spec *t) {
    kvl_buf b = {0};
    kvl_buf_puts(&b,
                 "You can call the following tools (JSON Schema of each function's arguments):\n");
    for (const cJSON *tool = t->tools ? t->tools->child : NULL; tool; tool = tool->next) {
        char *js = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(tool, "function"));
        if (js) kvl_buf_printf(&b, "%s\n", js);
        free(js);
    }
    const char *one = t->n > 0 ? t->names[t->choice == TOOL_CHOICE_NAMED ? t->named : 0] : "name";
    const char *args = "{...arguments...}";
    kvl_buf_puts(&b, "\nTo call a tool, answer with only the call, written as:\n");
    tool_calls_text(f, &one, &args, 1, &b);
    kvl_buf_puts(&b, "\n");
    if (t->choice == TOOL_CHOICE_AUTO) kvl_buf_puts(&b, "If no tool is needed, answer normally.");
    if (b.oom) {
        kvl_buf_free(&b);
        return NULL;
    }
    return b.p;
}

/* ----------------------------------------------------------- grammar -- */

void tools_gbnf_literal(kvl_buf *out, const char *s) {
    kvl_buf_puts(out, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') kvl_buf_printf(out, "\\%c", *p);
        else if (*p == '\n') kvl_buf_puts(out, "\\n");
        else if (*p == '\r') kvl_buf_puts(out, "\\r");
        else if (*p == '\t') kvl_buf_puts(out, "\\t");
        else kvl_buf_put(out, (const char *)p, 1);
    }
    kvl_buf_puts(out, "\"");
}

/* A literal, skipped when empty (GBNF has no empty string literal in every dialect). */
static void gbnf_lit_opt(kvl_buf *out, const char *s) {
    if (!s[0]) return;
    tools_gbnf_literal(out, s);
    kvl_buf_puts(out, " ");
}

/* Objects of a tool's schema that do not say otherwise get
 * "additionalProperties": false: a call's arguments are the declared
 * parameters only (xgrammar's strict mode, which vLLM's required tool calls
 * use), and a random model cannot pad them with keys without end. */
static void close_objects(cJSON *sch, int depth) {
    if (!cJSON_IsObject(sch) || depth > 64) return;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sch, "type");
    cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
    bool object =
        (cJSON_IsString(type) && !strcmp(type->valuestring, "object")) || cJSON_IsObject(props);
    if (object && !cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties") &&
        !cJSON_GetObjectItemCaseSensitive(sch, "patternProperties"))
        cJSON_AddFalseToObject(sch, "additionalProperties");
    static const char *const maps[] = {"properties", "$defs", "definitions"};
    for (int i = 0; i < 3; i++) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(sch, maps[i]);
        for (cJSON *c = cJSON_IsObject(m) ? m->child : NULL; c; c = c->next)
            close_objects(c, depth + 1);
    }
    static const char *const lists[] = {"anyOf", "oneOf", "allOf", "prefixItems"};
    for (int i = 0; i < 4; i++) {
        cJSON *l = cJSON_GetObjectItemCaseSensitive(sch, lists[i]);
        for (cJSON *c = cJSON_IsArray(l) ? l->child : NULL; c; c = c->next)
            close_objects(c, depth + 1);
    }
    close_objects(cJSON_GetObjectItemCaseSensitive(sch, "items"), depth + 1);
}

bool tool_grammar(tool_format f, const tool_spec *t, const char *close_think,
                  schema_rules_fn schema_rules, kvl_buf *out, char *err, size_t err_cap) {
    call_shape c = shape_of(f);
    if (f == TOOL_FMT_GEMMA4) schema_rules = tools_gemma_rules; /* not JSON: its own syntax */
    /* A named function is called once (vLLM and llama-server constrain it to one call too). */
    bool many = t->parallel && c.parallel && t->choice != TOOL_CHOICE_NAMED;
    kvl_buf_puts(out, "root ::= ");
    if (close_think) {
        char closing[64];
        snprintf(closing, sizeof closing, "%s\n\n", close_think);
        gbnf_lit_opt(out, closing);
    }
    gbnf_lit_opt(out, c.open);
    kvl_buf_puts(out, "call ");
    if (many) {
        kvl_buf_puts(out, "( ");
        gbnf_lit_opt(out, c.sep);
        kvl_buf_puts(out, "call )* ");
    }
    gbnf_lit_opt(out, c.close);
    kvl_buf_puts(out, "\ncall ::= ");
    bool first = true;
    for (int i = 0; i < t->n; i++) {
        if (t->choice == TOOL_CHOICE_NAMED && i != t->named) continue;
        kvl_buf_puts(out, first ? "" : " | ");
        first = false;
        kvl_buf_printf(out, "fn%d", i);
    }
    kvl_buf_puts(out, "\n");
    for (int i = 0; i < t->n; i++) {
        if (t->choice == TOOL_CHOICE_NAMED && i != t->named) continue;
        kvl_buf_printf(out, "fn%d ::= ", i);
        gbnf_lit_opt(out, c.pre);
        tools_gbnf_literal(out, t->names[i]);
        kvl_buf_puts(out, " ");
        gbnf_lit_opt(out, c.mid);
        kvl_buf_printf(out, "t%d-root ", i);
        gbnf_lit_opt(out, c.post);
        kvl_buf_puts(out, "\n");
        char prefix[16];
        snprintf(prefix, sizeof prefix, "t%d-", i);
        cJSON *sch = t->params[i] ? cJSON_Duplicate(t->params[i], true)
                                  : cJSON_Parse("{\"type\": \"object\"}");
        close_objects(sch, 0);
        char *schema = sch ? cJSON_PrintUnformatted(sch) : NULL;
        cJSON_Delete(sch);
        char e[400] = "";
        bool ok = schema && schema_rules(schema, prefix, out, e, sizeof e);
        free(schema);
        if (!ok) {
            snprintf(err, err_cap, "tools[%d] (%s): %s", i, t->names[i],
                     e[0] ? e : "out of memory");
            return false;
        }
    }
    if (out->oom) {
        snprintf(err, err_cap, "out of memory");
        return false;
    }
    return true;
}
