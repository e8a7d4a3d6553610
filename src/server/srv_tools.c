/* Tool calls and reasoning in chat output (srv_tools.h): the template's call
 * format, the request's tools, the system prompt and grammar of a call, and the
 * incremental parser that cuts generated text into content, reasoning and calls. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "srv_tools.h"

/* DeepSeek V4's markup prefix, "<｜DSML｜" */
#define DSML_BARE "\xef\xbd\x9c" "DSML\xef\xbd\x9c"
#define DSML "<" DSML_BARE

const char *tool_format_name(tool_format f) {
    static const char *const names[] = {"none",    "generic",     "hermes",   "qwen-xml", "glm",
                                        "llama3",  "mistral",     "mistral-v11", "deepseek",
                                        "deepseek-r1", "kimi",    "functionary", "gpt-oss",
                                        "apriel",  "command-r7b", "apertus",  "granite",
                                        "seed-oss", "minimax",    "minicpm",  "deepseek-dsml"};
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
    else if (has(src, "<|START_THINKING|>")) c->think_open = "<|START_THINKING|>", c->think_close = "<|END_THINKING|>";
    else if (has(src, "[THINK]")) c->think_open = "[THINK]", c->think_close = "[/THINK]"; /* Magistral, Ministral 3 */
    c->thinks = has(src, c->think_open) || has(src, c->think_close);
    /* The most specific markers first: Qwen3.5 writes <function=...> inside <tool_call>. */
    if (has(src, "<tool_call>") && has(src, "<function=")) c->format = TOOL_FMT_QWEN_XML;
    else if (has(src, "<tool_call>") && has(src, "<arg_key>")) c->format = TOOL_FMT_GLM;
    else if (has(src, "<tool_call>")) c->format = TOOL_FMT_HERMES;
    else if (has(src, "<seed:tool_call>")) c->format = TOOL_FMT_SEED_OSS;
    else if (has(src, "<minimax:tool_call>")) c->format = TOOL_FMT_MINIMAX;
    else if (has(src, DSML_BARE)) c->format = TOOL_FMT_DSML; /* '<' + dsml_token + 'tool_calls>' */
    else if (has(src, "<function name=")) c->format = TOOL_FMT_MINICPM;
    else if (has(src, "[TOOL_CALLS]") && has(src, "[ARGS]")) c->format = TOOL_FMT_MISTRAL_V11;
    else if (has(src, "[TOOL_CALLS]")) c->format = TOOL_FMT_MISTRAL;
    else if (has(src, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin"))
        c->format = has(src, "```json") ? TOOL_FMT_DEEPSEEK_R1 : TOOL_FMT_DEEPSEEK;
    else if (has(src, "<|tool_calls_section_begin|>")) c->format = TOOL_FMT_KIMI;
    else if (has(src, "<|channel|>") && has(src, "<|message|>")) c->format = TOOL_FMT_GPT_OSS;
    else if (has(src, "<tool_calls>")) c->format = TOOL_FMT_APRIEL;
    else if (has(src, "<|START_ACTION|>")) c->format = TOOL_FMT_COMMAND_R7B;
    else if (has(src, "<|tools_prefix|>")) c->format = TOOL_FMT_APERTUS;
    else if (has(src, "<|tool_call|>")) c->format = TOOL_FMT_GRANITE;
    else if (has(src, "<function=")) c->format = TOOL_FMT_FUNCTIONARY;
    else if (has(src, "<|python_tag|>") || (has(src, "<|start_header_id|>") && has(src, "\"parameters\"")))
        c->format = TOOL_FMT_LLAMA3;
}

/* ------------------------------------------------------------- spec --- */

static bool bad(char *param, size_t pcap, char *msg, size_t mcap, const char *p, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static bool bad(char *param, size_t pcap, char *msg, size_t mcap, const char *p, const char *fmt, ...) {
    snprintf(param, pcap, "%s", p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, mcap, fmt, ap);
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
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.') return false;
    return true;
}

bool tool_spec_parse(const cJSON *body, tool_spec *t, char *ep, size_t epc, char *em, size_t emc) {
    memset(t, 0, sizeof *t);
    t->parallel = true;
    const cJSON *tools = field(body, "tools");
    const cJSON *choice = field(body, "tool_choice");
    const cJSON *par = field(body, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par))
        return bad(ep, epc, em, emc, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    if (par) t->parallel = cJSON_IsTrue(par);
    if (tools && !cJSON_IsArray(tools))
        return bad(ep, epc, em, emc, "tools", "'tools' must be an array of {\"type\": \"function\", ...}");
    int n = tools ? cJSON_GetArraySize(tools) : 0;
    if (n > 0) {
        t->tools = cJSON_Duplicate(tools, true);
        t->names = calloc((size_t)n, sizeof *t->names);
        t->params = calloc((size_t)n, sizeof *t->params);
        if (!t->tools || !t->names || !t->params) {
            bad(ep, epc, em, emc, "tools", "out of memory");
            tool_spec_free(t);
            return false;
        }
        int i = 0;
        for (const cJSON *tool = t->tools->child; tool; tool = tool->next, i++) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(tool, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
            char p[32];
            snprintf(p, sizeof p, "tools[%d]", i);
            if (!cJSON_IsObject(tool) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0) {
                bad(ep, epc, em, emc, p, "%s: only {\"type\": \"function\"} tools are supported", p);
                tool_spec_free(t);
                return false;
            }
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !valid_name(name->valuestring)) {
                bad(ep, epc, em, emc, p,
                           "%s.function.name must be a string of 1 to 64 letters, digits, '_', '-' or '.'", p);
                tool_spec_free(t);
                return false;
            }
            const cJSON *desc = field(fn, "description");
            if (desc && !cJSON_IsString(desc)) {
                bad(ep, epc, em, emc, p, "%s.function.description must be a string", p);
                tool_spec_free(t);
                return false;
            }
            const cJSON *params = field(fn, "parameters");
            if (params && !cJSON_IsObject(params)) {
                bad(ep, epc, em, emc, p, "%s.function.parameters must be a JSON Schema object", p);
                tool_spec_free(t);
                return false;
            }
            const cJSON *strict = field(fn, "strict");
            if (strict && !cJSON_IsBool(strict)) {
                bad(ep, epc, em, emc, p, "%s.function.strict must be a boolean", p);
                tool_spec_free(t);
                return false;
            }
            for (int k = 0; k < i; k++)
                if (!strcmp(t->names[k], name->valuestring)) {
                    bad(ep, epc, em, emc, p, "%s: the function name '%s' is used twice", p, name->valuestring);
                    tool_spec_free(t);
                    return false;
                }
            t->names[i] = name->valuestring;
            t->params[i] = params;
        }
        t->n = n;
    }
    if (!choice) {
        t->choice = TOOL_CHOICE_AUTO;
    } else if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (!strcmp(c, "auto")) t->choice = TOOL_CHOICE_AUTO;
        else if (!strcmp(c, "none")) t->choice = TOOL_CHOICE_NONE;
        else if (!strcmp(c, "required")) t->choice = TOOL_CHOICE_REQUIRED;
        else {
            bad(ep, epc, em, emc, "tool_choice",
                       "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}} (got \"%.40s\")", c);
            tool_spec_free(t);
            return false;
        }
    } else if (cJSON_IsObject(choice)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name)) {
            bad(ep, epc, em, emc, "tool_choice",
                       "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
            tool_spec_free(t);
            return false;
        }
        t->choice = TOOL_CHOICE_NAMED;
        t->named = -1;
        for (int i = 0; i < t->n; i++)
            if (!strcmp(t->names[i], name->valuestring)) t->named = i;
        if (t->named < 0) {
            char nm[80];
            snprintf(nm, sizeof nm, "%s", name->valuestring);
            bad(ep, epc, em, emc, "tool_choice", "'tool_choice' names the function '%s', which is not in 'tools'",
                       nm);
            tool_spec_free(t);
            return false;
        }
    } else {
        bad(ep, epc, em, emc, "tool_choice", "'tool_choice' must be a string or an object");
        tool_spec_free(t);
        return false;
    }
    if (t->n == 0 && (t->choice == TOOL_CHOICE_REQUIRED || t->choice == TOOL_CHOICE_NAMED)) {
        bad(ep, epc, em, emc, "tool_choice", "'tool_choice' \"required\" needs a non-empty 'tools'");
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

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

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
        return (call_shape){"", "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>", "\n", "", true};
    case TOOL_FMT_LLAMA3: return (call_shape){"", "{\"name\": \"", "\", \"parameters\": ", "}", "", "", false};
    case TOOL_FMT_MISTRAL:
        return (call_shape){"[TOOL_CALLS][", "{\"name\": \"", "\", \"arguments\": ", "}", ", ", "]", true};
    case TOOL_FMT_MISTRAL_V11: return (call_shape){"", "[TOOL_CALLS]", "[ARGS]", "", "", "", true};
    case TOOL_FMT_DEEPSEEK:
        return (call_shape){DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_SEP, DS_CALL_END, "", DS_CALLS_END, true};
    case TOOL_FMT_DEEPSEEK_R1:
        return (call_shape){DS_CALLS_BEGIN, DS_CALL_BEGIN "function" DS_SEP, "\n```json\n", "\n```" DS_CALL_END, "",
                            DS_CALLS_END, true};
    case TOOL_FMT_KIMI:
        return (call_shape){"<|tool_calls_section_begin|>", "<|tool_call_begin|>functions.", ":0<|tool_call_argument_begin|>",
                            "<|tool_call_end|>", "", "<|tool_calls_section_end|>", true};
    case TOOL_FMT_FUNCTIONARY: return (call_shape){"", "<function=", ">", "</function>", "", "", true};
    case TOOL_FMT_GPT_OSS:
        return (call_shape){"", "<|channel|>commentary to=functions.", " <|constrain|>json<|message|>", "", "", "", false};
    case TOOL_FMT_APRIEL:
        return (call_shape){"<tool_calls>[", "{\"name\": \"", "\", \"arguments\": ", "}", ", ", "]</tool_calls>", true};
    case TOOL_FMT_COMMAND_R7B:
        return (call_shape){"<|START_ACTION|>[", "{\"tool_call_id\": \"0\", \"tool_name\": \"", "\", \"parameters\": ", "}",
                            ", ", "]<|END_ACTION|>", true};
    case TOOL_FMT_APERTUS: return (call_shape){"<|tools_prefix|>[", "{\"", "\": ", "}", ", ", "]<|tools_suffix|>", true};
    case TOOL_FMT_GRANITE:
        return (call_shape){"<|tool_call|>[", "{\"name\": \"", "\", \"arguments\": ", "}", ", ", "]", true};
    case TOOL_FMT_SEED_OSS:
        return (call_shape){"", "<seed:tool_call>\n<function=", ">\n", "\n</function>\n</seed:tool_call>", "\n", "", true};
    case TOOL_FMT_MINIMAX:
        return (call_shape){"<minimax:tool_call>\n", "<invoke name=\"", "\">\n", "\n</invoke>", "\n",
                            "\n</minimax:tool_call>", true};
    case TOOL_FMT_MINICPM: return (call_shape){"", "<function name=\"", "\">", "</function>", "\n", "", true};
    case TOOL_FMT_DSML:
        return (call_shape){DSML "tool_calls>\n", DSML "invoke name=\"", "\">\n", "\n</" DSML_BARE "invoke>", "\n",
                            "\n</" DSML_BARE "tool_calls>", true};
    default: return (call_shape){"", "{\"name\": \"", "\", \"arguments\": ", "}", "", "", false};
    }
}

int tool_format_markers(tool_format f, const char **out, int cap) {
    static const char *const hermes[] = {"<tool_call>", "</tool_call>"};
    static const char *const llama3[] = {"<|python_tag|>"};
    static const char *const mistral[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
    static const char *const deepseek[] = {DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP};
    static const char *const kimi[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                       "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
    static const char *const oss[] = {"<|channel|>", "<|message|>", "<|constrain|>", "<|start|>", "<|end|>", "<|call|>"};
    static const char *const think[] = {"<think>", "</think>", "<seed:think>", "</seed:think>",
                                        "<|START_THINKING|>", "<|END_THINKING|>", "[THINK]", "[/THINK]"};
    static const char *const apriel[] = {"<tool_calls>", "</tool_calls>"};
    static const char *const cohere[] = {"<|START_ACTION|>", "<|END_ACTION|>"};
    static const char *const apertus[] = {"<|tools_prefix|>", "<|tools_suffix|>"};
    static const char *const granite[] = {"<|tool_call|>"};
    static const char *const seed[] = {"<seed:tool_call>", "</seed:tool_call>"};
    static const char *const minimax[] = {"<minimax:tool_call>", "</minimax:tool_call>"};
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
    default: break;
    }
    int k = 0;
    for (int i = 0; i < n && k < cap; i++) out[k++] = m[i];
    for (int i = 0; i < 8 && k < cap; i++) out[k++] = think[i];
    return k;
}

void tool_calls_text(tool_format f, const char *const *names, const char *const *args, int n, kvl_buf *out) {
    call_shape c = shape_of(f);
    kvl_buf_puts(out, c.open);
    for (int i = 0; i < n; i++) {
        if (i) kvl_buf_puts(out, c.sep);
        kvl_buf_printf(out, "%s%s%s%s%s", c.pre, names[i], c.mid, args[i], c.post);
    }
    kvl_buf_puts(out, c.close);
}

char *tool_system_prompt(tool_format f, const tool_spec *t) {
    kvl_buf b = {0};
    kvl_buf_puts(&b, "You can call the following tools (JSON Schema of each function's arguments):\n");
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

static void gbnf_literal(kvl_buf *out, const char *s) {
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
    gbnf_literal(out, s);
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
    bool object = (cJSON_IsString(type) && !strcmp(type->valuestring, "object")) || cJSON_IsObject(props);
    if (object && !cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties") &&
        !cJSON_GetObjectItemCaseSensitive(sch, "patternProperties"))
        cJSON_AddFalseToObject(sch, "additionalProperties");
    static const char *const maps[] = {"properties", "$defs", "definitions"};
    for (int i = 0; i < 3; i++) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(sch, maps[i]);
        for (cJSON *c = cJSON_IsObject(m) ? m->child : NULL; c; c = c->next) close_objects(c, depth + 1);
    }
    static const char *const lists[] = {"anyOf", "oneOf", "allOf", "prefixItems"};
    for (int i = 0; i < 4; i++) {
        cJSON *l = cJSON_GetObjectItemCaseSensitive(sch, lists[i]);
        for (cJSON *c = cJSON_IsArray(l) ? l->child : NULL; c; c = c->next) close_objects(c, depth + 1);
    }
    close_objects(cJSON_GetObjectItemCaseSensitive(sch, "items"), depth + 1);
}

bool tool_grammar(tool_format f, const tool_spec *t, const char *close_think, schema_rules_fn schema_rules,
                  kvl_buf *out, char *err, size_t err_cap) {
    call_shape c = shape_of(f);
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
        gbnf_literal(out, t->names[i]);
        kvl_buf_puts(out, " ");
        gbnf_lit_opt(out, c.mid);
        kvl_buf_printf(out, "t%d-root ", i);
        gbnf_lit_opt(out, c.post);
        kvl_buf_puts(out, "\n");
        char prefix[16];
        snprintf(prefix, sizeof prefix, "t%d-", i);
        cJSON *sch = t->params[i] ? cJSON_Duplicate(t->params[i], true) : cJSON_Parse("{\"type\": \"object\"}");
        close_objects(sch, 0);
        char *schema = sch ? cJSON_PrintUnformatted(sch) : NULL;
        cJSON_Delete(sch);
        char e[400] = "";
        bool ok = schema && schema_rules(schema, prefix, out, e, sizeof e);
        free(schema);
        if (!ok) {
            snprintf(err, err_cap, "tools[%d] (%s): %s", i, t->names[i], e[0] ? e : "out of memory");
            return false;
        }
    }
    if (out->oom) {
        snprintf(err, err_cap, "out of memory");
        return false;
    }
    return true;
}

/* ------------------------------------------------------------ output -- */

static uint64_t call_random(void) {
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^
                 (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* "call_" + 24 letters and digits, as OpenAI's ids look. */
static void call_id(char out[40]) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(out, "call_", 5);
    uint64_t r = 0;
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0) r = call_random(); /* 8 digits use 48 of its 64 bits */
        out[5 + i] = alphabet[r % 62];
        r /= 62;
    }
    out[29] = 0;
}

void parse_out_reset(parse_out *o) {
    o->content.len = 0;
    o->reasoning.len = 0;
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    o->n_calls = 0;
}

void parse_out_free(parse_out *o) {
    parse_out_reset(o);
    kvl_buf_free(&o->content);
    kvl_buf_free(&o->reasoning);
    free(o->calls);
    memset(o, 0, sizeof *o);
}

static bool add_call(out_parser *p, parse_out *o, const char *name, size_t name_len, const cJSON *args) {
    if (!p->tools->parallel && p->n_calls > 0) return true; /* parallel_tool_calls false: the first only */
    if (o->n_calls == o->cap_calls) {
        int cap = o->cap_calls ? 2 * o->cap_calls : 4;
        tool_call_out *c = realloc(o->calls, (size_t)cap * sizeof *c);
        if (!c) return false;
        o->calls = c;
        o->cap_calls = cap;
    }
    tool_call_out *c = &o->calls[o->n_calls];
    call_id(c->id);
    c->name = strndup(name, name_len);
    c->arguments = args ? cJSON_PrintUnformatted(args) : strdup("{}");
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return false;
    }
    o->n_calls++;
    p->n_calls++;
    return true;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* End of the JSON object or array at s[0..n) (just after its closing bracket);
 * 0 while it is incomplete. Brackets inside strings do not count. */
static size_t json_extent(const char *s, size_t n) {
    int depth = 0;
    bool str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') str = false;
            continue;
        }
        if (c == '"') str = true;
        else if (c == '{' || c == '[') depth++;
        else if ((c == '}' || c == ']') && --depth <= 0) return i + 1;
    }
    return 0;
}

static cJSON *parse_json(const char *s, size_t n) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, false);
    if (!v) return NULL;
    while (end < s + n && is_ws(*end)) end++;
    if (end != s + n) {
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

/* A call given as arguments JSON (an object, or a string that holds one). */
static bool add_call_json_args(out_parser *p, parse_out *o, const char *name, size_t nlen, const cJSON *args) {
    if (cJSON_IsString(args)) {
        cJSON *inner = parse_json(args->valuestring, strlen(args->valuestring));
        bool ok = cJSON_IsObject(inner) && add_call(p, o, name, nlen, inner);
        cJSON_Delete(inner);
        return ok;
    }
    if (!args) return add_call(p, o, name, nlen, NULL);
    return cJSON_IsObject(args) && add_call(p, o, name, nlen, args);
}

static bool known_name(const out_parser *p, const char *name) {
    for (int i = 0; i < p->tools->n; i++)
        if (!strcmp(p->tools->names[i], name)) return true;
    return false;
}

/* {"name": N, "arguments"|"parameters": {...}} (also {"function": {...}}). */
static bool add_call_object(out_parser *p, parse_out *o, const cJSON *obj, bool need_known) {
    if (!cJSON_IsObject(obj)) return false;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(obj, "function");
    if (cJSON_IsObject(fn)) obj = fn;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    if (!name) name = cJSON_GetObjectItemCaseSensitive(obj, "tool_name"); /* Command R7B */
    if (!name && p->fmt == TOOL_FMT_APERTUS && obj->child && !obj->child->next) /* Apertus: {NAME: {...}} */
        return add_call_json_args(p, o, obj->child->string, strlen(obj->child->string), obj->child);
    if (!cJSON_IsString(name) || !name->valuestring[0]) return false;
    if (need_known && !known_name(p, name->valuestring)) return false;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    return add_call_json_args(p, o, name->valuestring, strlen(name->valuestring), args);
}

/* A JSON text of one call object or an array of them. Returns calls added. */
static int add_calls_json(out_parser *p, parse_out *o, const char *s, size_t n, bool need_known) {
    cJSON *v = parse_json(s, n);
    int before = o->n_calls;
    if (cJSON_IsArray(v)) {
        for (const cJSON *c = v->child; c; c = c->next)
            if (!add_call_object(p, o, c, need_known)) break;
    } else if (cJSON_IsObject(v)) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, "tool_calls");
        if (cJSON_IsArray(list)) {
            for (const cJSON *c = list->child; c; c = c->next)
                if (!add_call_object(p, o, c, need_known)) break;
        } else {
            add_call_object(p, o, v, need_known);
        }
    }
    cJSON_Delete(v);
    return o->n_calls - before;
}

static const char *find_n(const char *s, size_t n, const char *m) { return memmem(s, n, m, strlen(m)); }

/* The type a function's schema gives parameter key ("" if none). */
static const char *param_type(const out_parser *p, const char *fn, const char *key) {
    for (int i = 0; i < p->tools->n; i++) {
        if (strcmp(p->tools->names[i], fn) != 0 || !p->tools->params[i]) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(p->tools->params[i], "properties");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
        return cJSON_IsString(type) ? type->valuestring : "";
    }
    return "";
}

static cJSON *param_value(const out_parser *p, const char *fn, const char *key, const char *v, size_t vn);

/* The tags of an XML-like call: fn_open NAME name_end ... (param_open KEY
 * key_end[ attributes]> VALUE param_close)* fn_close. */
typedef struct xml_tags {
    const char *fn_open, *name_end, *param_open, *key_end, *param_close, *fn_close;
} xml_tags;

static const xml_tags XML_QWEN = {"<function=", ">", "<parameter=", ">", "</parameter>", "</function>"};
static const xml_tags XML_MINIMAX = {"<invoke name=\"", "\">", "<parameter name=\"", "\"", "</parameter>", "</invoke>"};
static const xml_tags XML_MINICPM = {"<function name=\"", "\">", "<param name=\"", "\"", "</param>", "</function>"};
static const xml_tags XML_DSML = {DSML "invoke name=\"", "\">", DSML "parameter name=\"", "\"", "</" DSML_BARE "parameter>",
                                  "</" DSML_BARE "invoke>"};

/* Every call of s[0..n) written with tags t; a value is JSON unless the
 * schema says string (what Qwen3-Coder's and MiniMax's own parsers do).
 * Returns false at the first malformed call. */
static bool add_calls_xml(out_parser *p, parse_out *o, const xml_tags *t, const char *s, size_t n) {
    const char *end = s + n, *q = s;
    bool any = false;
    for (;;) {
        const char *f = find_n(q, (size_t)(end - q), t->fn_open);
        if (!f) return any;
        const char *nm = f + strlen(t->fn_open);
        const char *ne = find_n(nm, (size_t)(end - nm), t->name_end);
        const char *fe = ne ? find_n(ne, (size_t)(end - ne), t->fn_close) : NULL;
        if (!ne) return false;
        if (!fe) fe = end; /* the output ended inside the call */
        char *name = strndup(nm, (size_t)(ne - nm));
        cJSON *args = cJSON_CreateObject();
        bool ok = name && args && name[0];
        const char *r = ne + strlen(t->name_end);
        const char *body = r;
        size_t bodyn = (size_t)(fe - r);
        trim(&body, &bodyn);
        if (ok && bodyn && body[0] == '{') { /* arguments as one JSON object (constrained calls write them so) */
            cJSON_Delete(args);
            args = parse_json(body, bodyn);
            ok = cJSON_IsObject(args);
        }
        while (ok && !(bodyn && body[0] == '{')) {
            const char *pr = find_n(r, (size_t)(fe - r), t->param_open);
            if (!pr) break;
            const char *k = pr + strlen(t->param_open);
            const char *ke = find_n(k, (size_t)(fe - k), t->key_end);
            const char *gt = ke ? memchr(ke, '>', (size_t)(fe - ke)) : NULL;
            const char *pe = gt ? find_n(gt, (size_t)(fe - gt), t->param_close) : NULL;
            if (!pe) {
                ok = false;
                break;
            }
            char *key = strndup(k, (size_t)(ke - k));
            const char *v = gt + 1;
            size_t vn = (size_t)(pe - v);
            if (vn && v[0] == '\n') v++, vn--; /* templates write the value on its own line */
            if (vn && v[vn - 1] == '\n') vn--;
            cJSON *val = key ? param_value(p, name, key, v, vn) : NULL;
            ok = key && val && cJSON_AddItemToObject(args, key, val);
            if (!ok) cJSON_Delete(val);
            free(key);
            r = pe + strlen(t->param_close);
        }
        ok = ok && add_call(p, o, name, strlen(name), args);
        free(name);
        cJSON_Delete(args);
        if (!ok) return false;
        any = true;
        q = fe;
    }
}

/* A parameter value of the XML-like formats: JSON unless the function's
 * schema says string (what the models' own parsers do). */
/* A Python literal (what str() of a dict or list prints, as Seed-OSS's and
 * MiniCPM's templates show values: {'city': 'Paris', 'ok': True}) as JSON;
 * NULL when it is not one. */
static cJSON *parse_py_literal(const char *v, size_t n) {
    kvl_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (c == '\'' || c == '"') { /* a string: re-quoted, escapes kept, a bare " escaped */
            kvl_buf_puts(&b, "\"");
            size_t j = i + 1;
            for (; j < n && v[j] != c; j++) {
                if (v[j] == '\\' && j + 1 < n) {
                    if (v[j + 1] == '\'') kvl_buf_puts(&b, "'");
                    else kvl_buf_put(&b, v + j, 2);
                    j++;
                } else if (v[j] == '"') {
                    kvl_buf_puts(&b, "\\\"");
                } else {
                    kvl_buf_put(&b, v + j, 1);
                }
            }
            if (j >= n) break; /* unterminated */
            kvl_buf_puts(&b, "\"");
            i = j;
        } else if (!strncmp(v + i, "True", 4) && (i + 4 >= n || !isalnum((unsigned char)v[i + 4]))) {
            kvl_buf_puts(&b, "true"), i += 3;
        } else if (!strncmp(v + i, "False", 5) && (i + 5 >= n || !isalnum((unsigned char)v[i + 5]))) {
            kvl_buf_puts(&b, "false"), i += 4;
        } else if (!strncmp(v + i, "None", 4) && (i + 4 >= n || !isalnum((unsigned char)v[i + 4]))) {
            kvl_buf_puts(&b, "null"), i += 3;
        } else {
            kvl_buf_put(&b, &c, 1);
        }
    }
    cJSON *j = b.p && !b.oom ? parse_json(b.p, b.len) : NULL;
    kvl_buf_free(&b);
    return j;
}

static cJSON *param_value(const out_parser *p, const char *fn, const char *key, const char *v, size_t vn) {
    cJSON *val = NULL;
    if (strcmp(param_type(p, fn, key), "string") != 0) {
        val = parse_json(v, vn);
        if (!val && vn && (v[0] == '{' || v[0] == '[')) val = parse_py_literal(v, vn);
    }
    if (!val) {
        char *sv = strndup(v, vn);
        val = sv ? cJSON_CreateString(sv) : NULL;
        free(sv);
    }
    return val;
}

/* NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>... (GLM 4.5/4.6) */
static bool add_call_glm(out_parser *p, parse_out *o, const char *s, size_t n) {
    const char *end = s + n, *q = s;
    while (q < end && *q != '\n' && *q != '<') q++;
    const char *name = s;
    size_t nl = (size_t)(q - s);
    trim(&name, &nl);
    char *fn = strndup(name, nl);
    cJSON *args = cJSON_CreateObject();
    bool ok = fn && args && nl;
    while (ok) {
        const char *k = find_n(q, (size_t)(end - q), "<arg_key>");
        if (!k) break;
        const char *ke = find_n(k, (size_t)(end - k), "</arg_key>");
        const char *v = ke ? find_n(ke, (size_t)(end - ke), "<arg_value>") : NULL;
        const char *ve = v ? find_n(v, (size_t)(end - v), "</arg_value>") : NULL;
        if (!ve) {
            ok = false;
            break;
        }
        char *key = strndup(k + 9, (size_t)(ke - k - 9));
        cJSON *val = key ? param_value(p, fn, key, v + 11, (size_t)(ve - v - 11)) : NULL;
        ok = key && val && cJSON_AddItemToObject(args, key, val);
        if (!ok) cJSON_Delete(val);
        free(key);
        q = ve + 12;
    }
    ok = ok && add_call(p, o, fn, nl, args);
    free(fn);
    cJSON_Delete(args);
    return ok;
}

/* ---- regions: the span of text holding one format's call(s) ---- */

/* The markers that open a call region in format f (*n of them). */
static const char *const *start_markers(tool_format f, int *n) {
    static const char *const hermes[] = {"<tool_call>"};
    static const char *const llama3[] = {"<|python_tag|>"};
    static const char *const mistral[] = {"[TOOL_CALLS]"};
    static const char *const deepseek[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN};
    static const char *const kimi[] = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>"};
    static const char *const functionary[] = {"<function="};
    static const char *const apriel[] = {"<tool_calls>"};
    static const char *const cohere[] = {"<|START_ACTION|>"};
    static const char *const apertus[] = {"<|tools_prefix|>"};
    static const char *const granite[] = {"<|tool_call|>"};
    static const char *const seed[] = {"<seed:tool_call>"};
    static const char *const minimax[] = {"<minimax:tool_call>"};
    static const char *const minicpm[] = {"<function name=\""};
    static const char *const dsml[] = {DSML "tool_calls>"};
    switch (f) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML:
    case TOOL_FMT_GLM: *n = 1; return hermes;
    case TOOL_FMT_LLAMA3: *n = 1; return llama3;
    case TOOL_FMT_MISTRAL:
    case TOOL_FMT_MISTRAL_V11: *n = 1; return mistral;
    case TOOL_FMT_DEEPSEEK:
    case TOOL_FMT_DEEPSEEK_R1: *n = 2; return deepseek;
    case TOOL_FMT_KIMI: *n = 2; return kimi;
    case TOOL_FMT_FUNCTIONARY: *n = 1; return functionary;
    case TOOL_FMT_APRIEL: *n = 1; return apriel;
    case TOOL_FMT_COMMAND_R7B: *n = 1; return cohere;
    case TOOL_FMT_APERTUS: *n = 1; return apertus;
    case TOOL_FMT_GRANITE: *n = 1; return granite;
    case TOOL_FMT_SEED_OSS: *n = 1; return seed;
    case TOOL_FMT_MINIMAX: *n = 1; return minimax;
    case TOOL_FMT_MINICPM: *n = 1; return minicpm;
    case TOOL_FMT_DSML: *n = 1; return dsml;
    default: *n = 0; return NULL;
    }
}

/* The marker closing a format's JSON list of calls (NULL: none). */
static const char *list_close(tool_format f) {
    switch (f) {
    case TOOL_FMT_APRIEL: return "</tool_calls>";
    case TOOL_FMT_COMMAND_R7B: return "<|END_ACTION|>";
    case TOOL_FMT_APERTUS: return "<|tools_suffix|>";
    default: return NULL;
    }
}

/* Length of the call region that starts at s (with marker m), 0 while
 * incomplete. final: the output ended, so an unclosed region runs to the end. */
static size_t region_len(tool_format f, const char *m, const char *s, size_t n, bool final) {
    size_t ml = strlen(m), k = ml;
    const char *endm = NULL;
    switch (f) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML:
    case TOOL_FMT_GLM: endm = "</tool_call>"; break;
    case TOOL_FMT_FUNCTIONARY:
    case TOOL_FMT_MINICPM: endm = "</function>"; break;
    case TOOL_FMT_SEED_OSS: endm = "</seed:tool_call>"; break;
    case TOOL_FMT_MINIMAX: endm = "</minimax:tool_call>"; break;
    case TOOL_FMT_DSML: endm = "</" DSML_BARE "tool_calls>"; break;
    case TOOL_FMT_DEEPSEEK:
    case TOOL_FMT_DEEPSEEK_R1: endm = !strcmp(m, DS_CALLS_BEGIN) ? DS_CALLS_END : DS_CALL_END; break;
    case TOOL_FMT_KIMI: endm = !strcmp(m, "<|tool_calls_section_begin|>") ? "<|tool_calls_section_end|>" : "<|tool_call_end|>"; break;
    case TOOL_FMT_MISTRAL_V11: {
        while (k < n && is_ws(s[k])) k++;
        if (k < n && s[k] == '[' && (n - k < 2 || s[k + 1] == '{' || is_ws(s[k + 1]))) break; /* the older JSON list */
        const char *a = find_n(s + ml, n - ml, "[ARGS]");
        if (!a) return final ? n : 0;
        k = (size_t)(a - s) + 6;
        break;
    }
    default: break;
    }
    if (endm) {
        const char *e = find_n(s + ml, n - ml, endm);
        return e ? (size_t)(e - s) + strlen(endm) : final ? n : 0;
    }
    /* The region is the marker and one JSON value. */
    while (k < n && is_ws(s[k])) k++;
    if (k == n) return final ? n : 0;
    /* No JSON after the marker: not a call (the marker stays text); <|python_tag|>
     * code runs to the end of the output. */
    if (s[k] != '{' && s[k] != '[') return f == TOOL_FMT_LLAMA3 ? (final ? n : 0) : k;
    size_t e = json_extent(s + k, n - k);
    if (!e) return final ? n : 0;
    const char *close = list_close(f);
    if (!close) return k + e;
    /* the list's closing marker belongs to the region (wait until it is there or cannot be) */
    size_t c = k + e;
    while (c < n && is_ws(s[c])) c++;
    size_t cl = strlen(close), have = n - c < cl ? n - c : cl;
    if (memcmp(s + c, close, have) != 0) return k + e;
    if (have < cl) return final ? k + e : 0;
    return c + cl;
}

/* Parses one region into calls; returns how many it held. */
static int parse_region(out_parser *p, parse_out *o, const char *m, const char *s, size_t n) {
    int before = o->n_calls;
    size_t ml = strlen(m);
    const char *b = s + ml;
    size_t bn = n - ml;
    switch (p->fmt) {
    case TOOL_FMT_HERMES:
    case TOOL_FMT_QWEN_XML: {
        const char *e = find_n(b, bn, "</tool_call>");
        if (e) bn = (size_t)(e - b);
        trim(&b, &bn);
        if (bn && b[0] == '{') add_calls_json(p, o, b, bn, false);
        else add_calls_xml(p, o, &XML_QWEN, b, bn);
        break;
    }
    case TOOL_FMT_SEED_OSS: add_calls_xml(p, o, &XML_QWEN, s, n); break;
    case TOOL_FMT_MINIMAX: add_calls_xml(p, o, &XML_MINIMAX, s, n); break;
    case TOOL_FMT_MINICPM: add_calls_xml(p, o, &XML_MINICPM, s, n); break;
    case TOOL_FMT_DSML: add_calls_xml(p, o, &XML_DSML, s, n); break;
    case TOOL_FMT_GLM: {
        const char *e = find_n(b, bn, "</tool_call>");
        if (e) bn = (size_t)(e - b);
        trim(&b, &bn);
        if (bn && b[0] == '{') add_calls_json(p, o, b, bn, false);
        else add_call_glm(p, o, b, bn);
        break;
    }
    case TOOL_FMT_FUNCTIONARY: {
        const char *gt = memchr(b, '>', bn);
        if (!gt) break;
        const char *a = gt + 1;
        size_t an = (size_t)(s + n - a);
        const char *e = find_n(a, an, "</function>");
        if (e) an = (size_t)(e - a);
        cJSON *args = parse_json(a, an);
        if (cJSON_IsObject(args)) add_call(p, o, b, (size_t)(gt - b), args);
        cJSON_Delete(args);
        break;
    }
    case TOOL_FMT_LLAMA3:
    case TOOL_FMT_MISTRAL:
    case TOOL_FMT_GRANITE: add_calls_json(p, o, b, bn, false); break;
    case TOOL_FMT_APRIEL:
    case TOOL_FMT_COMMAND_R7B:
    case TOOL_FMT_APERTUS: {
        const char *close = list_close(p->fmt);
        const char *e = find_n(b, bn, close);
        if (e && e + strlen(close) == s + n) bn = (size_t)(e - b); /* the region ends with it */
        add_calls_json(p, o, b, bn, false);
        break;
    }
    case TOOL_FMT_MISTRAL_V11: {
        const char *a = find_n(b, bn, "[ARGS]");
        if (!a) {
            add_calls_json(p, o, b, bn, false);
            break;
        }
        const char *name = b;
        size_t nl = (size_t)(a - b);
        const char *cid = find_n(name, nl, "[CALL_ID]");
        if (cid) nl = (size_t)(cid - name);
        trim(&name, &nl);
        cJSON *args = parse_json(a + 6, (size_t)(s + n - a - 6));
        if (nl && cJSON_IsObject(args)) add_call(p, o, name, nl, args);
        cJSON_Delete(args);
        break;
    }
    case TOOL_FMT_DEEPSEEK:
    case TOOL_FMT_DEEPSEEK_R1:
    case TOOL_FMT_KIMI: {
        bool kimi = p->fmt == TOOL_FMT_KIMI;
        const char *cb = kimi ? "<|tool_call_begin|>" : DS_CALL_BEGIN;
        const char *sep = kimi ? "<|tool_call_argument_begin|>" : DS_SEP;
        const char *ce = kimi ? "<|tool_call_end|>" : DS_CALL_END;
        const char *q = s, *end = s + n;
        for (;;) {
            const char *c = find_n(q, (size_t)(end - q), cb);
            if (!c) break;
            c += strlen(cb);
            const char *sp = find_n(c, (size_t)(end - c), sep);
            if (!sp) break;
            const char *a = sp + strlen(sep);
            const char *e = find_n(a, (size_t)(end - a), ce);
            size_t an = e ? (size_t)(e - a) : (size_t)(end - a);
            const char *name = c;
            size_t nl = (size_t)(sp - c);
            if (kimi) { /* functions.NAME:IDX */
                if (nl > 10 && !memcmp(name, "functions.", 10)) name += 10, nl -= 10;
                const char *colon = memrchr(name, ':', nl);
                if (colon) nl = (size_t)(colon - name);
            } else if (nl == 8 && !memcmp(name, "function", 8)) { /* R1: function<sep>NAME\n```json\n{...}\n``` */
                const char *nlp = memchr(a, '\n', an);
                if (!nlp) break;
                name = a;
                nl = (size_t)(nlp - a);
                const char *j = find_n(nlp, an - (size_t)(nlp - a), "```json");
                if (j) {
                    a = j + 7;
                    an = (size_t)((e ? e : end) - a);
                    const char *fence = find_n(a, an, "```");
                    if (fence) an = (size_t)(fence - a);
                } else {
                    an -= (size_t)(nlp - a);
                    a = nlp;
                }
            }
            trim(&name, &nl);
            cJSON *args = parse_json(a, an);
            bool ok = nl && cJSON_IsObject(args) && add_call(p, o, name, nl, args);
            cJSON_Delete(args);
            if (!ok || !e) break;
            q = e + strlen(ce);
        }
        break;
    }
    default: break;
    }
    return o->n_calls - before;
}

/* ---- emitting decided text ---- */

/* Appends decided text to content or reasoning. Whitespace is held back, so
 * that the whitespace a template puts around a marker (a call, </think>) is
 * dropped with the marker rather than sent as content. */
static void emit(out_parser *p, parse_out *o, const char *s, size_t n) {
    kvl_buf *dst = p->in_think ? &o->reasoning : &o->content;
    if (p->skip_ws)
        while (n && is_ws(*s)) s++, n--;
    size_t body = n;
    while (body && is_ws(s[body - 1])) body--;
    if (body) {
        kvl_buf_put(dst, p->held.p, p->held.len);
        p->held.len = 0;
        kvl_buf_put(dst, s, body);
        p->skip_ws = false;
        if (!p->in_think) p->any_content = true;
    }
    kvl_buf_put(&p->held, s + body, n - body);
}

/* At a marker: whatever whitespace was held goes. */
static void at_marker(out_parser *p) {
    p->held.len = 0;
    p->skip_ws = true;
}

/* Bytes at the end of s[0..n) that are a proper prefix of marker m. */
static size_t partial(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

void out_parser_init(out_parser *p, tool_format fmt, const tool_spec *t, bool think, bool in_think) {
    memset(p, 0, sizeof *p);
    p->fmt = fmt;
    p->tools = t;
    p->think = think || fmt == TOOL_FMT_GPT_OSS;
    p->in_think = think && in_think;
    p->skip_ws = p->in_think;
    p->think_open = "<think>";
    p->think_close = "</think>";
    p->oss_header = fmt == TOOL_FMT_GPT_OSS; /* the output begins with a message header */
}

void out_parser_free(out_parser *p) {
    kvl_buf_free(&p->held);
    kvl_buf_free(&p->text);
    free(p->oss_name);
}

/* Whether the answer so far could still be a bare JSON call (LLAMA3, GENERIC):
 * nothing but whitespace decided, and the rest starts with '{' (or '['). */
static bool bare_json_start(const out_parser *p, const char *s, size_t n, size_t *k) {
    if (p->any_content || p->n_calls > 0 || p->in_think) return false;
    if (p->fmt != TOOL_FMT_LLAMA3 && p->fmt != TOOL_FMT_GENERIC) return false;
    size_t i = 0;
    while (i < n && is_ws(s[i])) i++;
    *k = i;
    return i < n && (s[i] == '{' || (s[i] == '[' && p->fmt == TOOL_FMT_GENERIC));
}

/* gpt-oss harmony: each message is a header ([<|start|>assistant][ to=functions.N]
 * <|channel|>C[ to=functions.N][ <|constrain|>json]) then <|message|>BODY, ending
 * <|end|>, <|call|> or the end of output (the generation prompt already wrote
 * "<|start|>assistant"). analysis -> reasoning, a message to functions.N ->
 * a call, anything else (final) -> content. */
static void feed_harmony(out_parser *p, parse_out *o, bool final) {
    static const char *const ends[] = {"<|end|>", "<|call|>", "<|start|>", "<|channel|>"};
    for (;;) {
        const char *s = p->text.p + p->pos;
        size_t n = p->text.len - p->pos;
        if (n == 0) return;
        if (p->oss_header) {
            const char *m = find_n(s, n, "<|message|>");
            if (!m) {
                if (final) { /* no harmony structure at all: plain content */
                    p->in_think = false;
                    emit(p, o, s, n);
                    p->pos += n;
                }
                return;
            }
            free(p->oss_name);
            p->oss_name = NULL;
            const char *to = find_n(s, (size_t)(m - s), "to=functions.");
            p->oss_call = to != NULL;
            if (to) {
                const char *nm = to + 13, *ne = nm;
                while (ne < m && !is_ws(*ne) && *ne != '<') ne++;
                p->oss_name = strndup(nm, (size_t)(ne - nm));
            }
            p->in_think = !p->oss_call && find_n(s, (size_t)(m - s), "analysis") != NULL;
            p->oss_header = false;
            at_marker(p);
            p->pos += (size_t)(m - s) + 11;
            continue;
        }
        const char *e = NULL;
        int which = -1;
        for (int i = 0; i < 4; i++) {
            const char *x = find_n(s, n, ends[i]);
            if (x && (!e || x < e)) e = x, which = i;
        }
        if (!e && !final) {
            if (p->oss_call) return; /* a call's arguments are parsed whole */
            size_t hold = 0;
            for (int i = 0; i < 4; i++) {
                size_t h = partial(s, n, ends[i]);
                if (h > hold) hold = h;
            }
            emit(p, o, s, n - hold);
            p->pos += n - hold;
            return;
        }
        size_t body = e ? (size_t)(e - s) : n;
        if (p->oss_call) {
            cJSON *args = p->oss_name ? parse_json(s, body) : NULL;
            if (!(cJSON_IsObject(args) && add_call(p, o, p->oss_name, strlen(p->oss_name), args))) emit(p, o, s, body);
            cJSON_Delete(args);
            p->oss_call = false;
        } else {
            emit(p, o, s, body);
        }
        at_marker(p);
        p->pos += body;
        if (!e) return;
        p->pos += strlen(ends[which]);
        p->oss_header = true; /* the next message's header follows */
    }
}

static void feed_marked(out_parser *p, parse_out *o, bool final);

void out_parser_feed(out_parser *p, const char *s, size_t n, bool final, parse_out *o) {
    kvl_buf_put(&p->text, s, n);
    if (p->fmt == TOOL_FMT_GPT_OSS) feed_harmony(p, o, final);
    else feed_marked(p, o, final);
    /* At the end, whitespace held before a marker that never came is text,
     * unless calls were made (it sat between them). */
    if (final && p->n_calls > 0) p->held.len = 0;
    if (final && p->held.len) {
        kvl_buf_put(p->in_think ? &o->reasoning : &o->content, p->held.p, p->held.len);
        p->held.len = 0;
    }
}

/* Every format but harmony: calls and think blocks found by their markers. */
static void feed_marked(out_parser *p, parse_out *o, bool final) {
    int n_starts = 0;
    const char *const *starts = p->fmt != TOOL_FMT_NONE ? start_markers(p->fmt, &n_starts) : NULL;
    for (;;) {
        const char *t = p->text.p + p->pos;
        size_t len = p->text.len - p->pos;
        if (len == 0) break;
        if (p->in_think) {
            const char *e = find_n(t, len, p->think_close);
            if (!e) {
                size_t hold = final ? 0 : partial(t, len, p->think_close);
                emit(p, o, t, len - hold);
                p->pos += len - hold;
                break;
            }
            emit(p, o, t, (size_t)(e - t));
            at_marker(p);
            p->in_think = false;
            p->pos += (size_t)(e - t) + strlen(p->think_close);
            continue;
        }
        size_t k;
        if (bare_json_start(p, t, len, &k)) {
            size_t e = json_extent(t + k, len - k);
            if (!e && !final) break; /* undecided until the value closes */
            if (e && add_calls_json(p, o, t + k, e, true) > 0) {
                at_marker(p);
                p->pos += k + e;
                continue;
            }
            size_t upto = e ? k + e : len; /* not a call: the value is plain content */
            emit(p, o, t, upto);
            p->pos += upto;
            continue;
        }
        /* The earliest marker: a call start, or <think>. */
        const char *best = NULL, *bm = NULL;
        for (int i = 0; i < n_starts; i++) {
            const char *x = find_n(t, len, starts[i]);
            if (x && (!best || x < best)) best = x, bm = starts[i];
        }
        if (p->think) {
            const char *x = find_n(t, len, p->think_open);
            if (x && (!best || x < best)) best = x, bm = p->think_open;
        }
        if (!best) {
            size_t hold = 0;
            if (!final) {
                for (int i = 0; i < n_starts; i++) {
                    size_t h = partial(t, len, starts[i]);
                    if (h > hold) hold = h;
                }
                size_t h = p->think ? partial(t, len, p->think_open) : 0;
                if (h > hold) hold = h;
            }
            emit(p, o, t, len - hold);
            p->pos += len - hold;
            break;
        }
        size_t at = (size_t)(best - t);
        if (bm == p->think_open) {
            emit(p, o, t, at);
            at_marker(p);
            p->in_think = true;
            p->pos += at + strlen(p->think_open);
            continue;
        }
        size_t rl = region_len(p->fmt, bm, best, len - at, final);
        if (rl == 0) { /* the call is not complete: send what precedes it */
            emit(p, o, t, at);
            p->pos += at;
            break;
        }
        if (parse_region(p, o, bm, best, rl) > 0) {
            emit(p, o, t, at);
            at_marker(p);
        } else {
            emit(p, o, t, at + rl); /* not a valid call: it stays text */
        }
        p->pos += at + rl;
    }
}

bool prompt_opens_think(const char *prompt, size_t n, const char *topen, const char *tclose) {
    const char *open = NULL, *close = NULL;
    for (const char *x = find_n(prompt, n, topen); x; x = find_n(x + 1, n - (size_t)(x + 1 - prompt), topen)) open = x;
    for (const char *x = find_n(prompt, n, tclose); x; x = find_n(x + 1, n - (size_t)(x + 1 - prompt), tclose)) close = x;
    return open && (!close || open > close);
}
