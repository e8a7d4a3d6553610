/* Tool calls and reasoning in chat output (src/server/srv_tools.c, srv_tool_calls.c, srv_tool_stream.c).
 *
 * The reference is transformers' rendering of the vendored templates
 * (tests/data/chat-templates): each template's expected rendering of an
 * assistant turn with tool calls is exactly what that model emits, and
 * cases.json says which calls it holds. For every template with a call format
 * the parser knows, the format is detected from the template source, the
 * assistant turn is cut out of the rendering and parsed, and the calls must be
 * the conversation's (names, arguments as JSON values); fed one byte at a time
 * (a stream) it must decide the same content, reasoning and calls. Then the
 * request-side checks (tools, tool_choice) and the grammar text. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine.h"
#include "grammar.h"
#include "srv_tools.h"

#include "check.h"

#define DIR      "tests/data/chat-templates/"
#define DIR_MORE "tests/data/chat-templates-more/" /* the same kind of oracle, 20 more templates */

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static cJSON *read_json(const char *path) {
    char *s = read_file(path);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

static cJSON *CASES;
static int n_ids, n_ids_last_a; /* every id is random to its last character */

static const cJSON *find_case(const char *id) {
    for (const cJSON *c = cJSON_GetObjectItem(CASES, "cases")->child; c; c = c->next)
        if (!strcmp(cJSON_GetObjectItem(c, "id")->valuestring, id)) return c;
    return NULL;
}

/* All of one parse: content, reasoning, calls (ids dropped). */
typedef struct result {
    kvl_buf content, reasoning;
    cJSON *calls; /* [{"name", "arguments" (parsed)}] */
} result;

static void result_free(result *r) {
    kvl_buf_free(&r->content);
    kvl_buf_free(&r->reasoning);
    cJSON_Delete(r->calls);
}

static void collect(result *r, const parse_out *o) {
    kvl_buf_put(&r->content, o->content.p, o->content.len);
    kvl_buf_put(&r->reasoning, o->reasoning.p, o->reasoning.len);
    for (int i = 0; i < o->n_calls; i++) {
        CHECK(!strncmp(o->calls[i].id, "call_", 5) && strlen(o->calls[i].id) == 29, "id %s",
              o->calls[i].id);
        bool seen[256] = {false};
        int distinct = 0;
        for (const char *c = o->calls[i].id + 5; *c; c++)
            distinct += !seen[(unsigned char)*c], seen[(unsigned char)*c] = true;
        CHECK(distinct >= 8, "id %s: its 24 characters look random", o->calls[i].id);
        n_ids++;
        n_ids_last_a += o->calls[i].id[28] == 'A';
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", o->calls[i].name);
        cJSON *a = cJSON_Parse(o->calls[i].arguments);
        CHECK(cJSON_IsObject(a), "arguments are a JSON object: %s", o->calls[i].arguments);
        cJSON_AddItemToObject(c, "arguments", a ? a : cJSON_CreateNull());
        cJSON_AddItemToArray(r->calls, c);
    }
}

/* The think tags the next run() uses (NULL: the parser's default <think>). */
static const chat_caps *RUN_CAPS;

/* Parses text whole (step 0) or step bytes at a time. */
static void run(result *r, tool_format f, const tool_spec *t, bool think, bool in_think,
                const char *text, size_t step) {
    memset(r, 0, sizeof *r);
    r->calls = cJSON_CreateArray();
    out_parser p;
    parse_out o = {0};
    out_parser_init(&p, f, t, think, in_think);
    if (RUN_CAPS) p.think_open = RUN_CAPS->think_open, p.think_close = RUN_CAPS->think_close;
    size_t n = strlen(text);
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n || i == 0; i += step) {
        size_t k = i + step < n ? step : n - i;
        parse_out_reset(&o);
        out_parser_feed(&p, text + i, k, i + k >= n, &o);
        collect(r, &o);
        if (i + k >= n) break;
    }
    parse_out_free(&o);
    out_parser_free(&p);
}

static bool buf_is(const kvl_buf *b, const char *s) {
    return b->len == strlen(s) && (b->len == 0 || !memcmp(b->p, s, b->len));
}

static tool_spec spec_of(const cJSON *tools) {
    cJSON *body = cJSON_CreateObject();
    if (tools) cJSON_AddItemToObject(body, "tools", cJSON_Duplicate(tools, true));
    tool_spec t;
    char p[64], m[400];
    bool ok = tool_spec_parse(body, &t, p, sizeof p, m, sizeof m);
    CHECK(ok, "tools parse: %s", m);
    cJSON_Delete(body);
    return t;
}

/* The calls of the case's assistant message, arguments as JSON values. */
static cJSON *expected_calls(const cJSON *c) {
    cJSON *out = cJSON_CreateArray();
    for (const cJSON *m = cJSON_GetObjectItem(c, "messages")->child; m; m = m->next) {
        const cJSON *calls = cJSON_GetObjectItem(m, "tool_calls");
        for (const cJSON *tc = calls ? calls->child : NULL; tc; tc = tc->next) {
            const cJSON *fn = cJSON_GetObjectItem(tc, "function");
            const cJSON *args = cJSON_GetObjectItem(fn, "arguments");
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", cJSON_GetObjectItem(fn, "name")->valuestring);
            cJSON_AddItemToObject(e, "arguments",
                                  cJSON_IsString(args) ? cJSON_Parse(args->valuestring)
                                                       : cJSON_Duplicate(args, true));
            cJSON_AddItemToArray(out, e);
        }
        if (calls) break;
    }
    return out;
}

typedef struct sample {
    const char *tmpl; /* template name */
    const char *case_id;
    tool_format fmt; /* what detection must find */
    const char
        *after; /* the assistant turn starts after this (searched after the first user message) */
    const char *end; /* and ends before this */
    bool thinks;     /* the template has <think> */
} sample;

#define DS_END                                                                                     \
    "<\xef\xbd\x9c"                                                                                \
    "end\xe2\x96\x81"                                                                              \
    "of\xe2\x96\x81"                                                                               \
    "sentence\xef\xbd\x9c>"
#define DS_ASSISTANT                                                                               \
    "<\xef\xbd\x9c"                                                                                \
    "Assistant\xef\xbd\x9c>"

static const sample SAMPLES[] = {
    {"Qwen-Qwen2.5-7B-Instruct", "c11_parallel_tool_calls", TOOL_FMT_HERMES,
     "<|im_start|>assistant\n", "<|im_end|>", false},
    {"Qwen-Qwen3-0.6B", "c11_parallel_tool_calls", TOOL_FMT_HERMES, "<|im_start|>assistant\n",
     "<|im_end|>", true},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "c11_parallel_tool_calls", TOOL_FMT_HERMES,
     "<|im_start|>assistant\n", "<|im_end|>", false},
    {"MiMo-VL", "c11_parallel_tool_calls", TOOL_FMT_HERMES, "<|im_start|>assistant\n", "<|im_end|>",
     false},
    {"ibm-granite-granite-4.0", "c11_parallel_tool_calls", TOOL_FMT_HERMES,
     "<|start_of_role|>assistant<|end_of_role|>", "<|end_of_text|>", false},
    {"Reka-Edge", "c11_parallel_tool_calls", TOOL_FMT_HERMES, "<sep>assistant: ", "<sep>", true},
    {"Qwen3.5-4B", "c11_parallel_tool_calls", TOOL_FMT_QWEN_XML, "<|im_start|>assistant\n",
     "<|im_end|>", true},
    {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "c11_parallel_tool_calls", TOOL_FMT_QWEN_XML,
     "<|im_start|>assistant\n", "<|im_end|>", true},
    {"GLM-4.6", "c11_parallel_tool_calls", TOOL_FMT_GLM, "<|assistant|>\n<think></think>\n",
     "<|observation|>", true},
    {"meta-llama-Llama-3.1-8B-Instruct", "c07a_tool_roundtrip_args_object", TOOL_FMT_LLAMA3,
     "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", false},
    {"meta-llama-Llama-3.2-3B-Instruct", "c07b_tool_roundtrip_args_string", TOOL_FMT_LLAMA3,
     "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", false},
    {"mistralai-Mistral-Nemo-Instruct-2407", "c11_parallel_tool_calls", TOOL_FMT_MISTRAL, "[/INST]",
     "</s>", false},
    {"Mistral-Small-3.2-24B-Instruct-2506", "c11_parallel_tool_calls", TOOL_FMT_MISTRAL_V11,
     "[/INST]", "</s>", false},
    {"mistralai-Ministral-3-14B-Reasoning-2512", "c11_parallel_tool_calls", TOOL_FMT_MISTRAL_V11,
     "[/INST]", "</s>", true},
    {"deepseek-ai-DeepSeek-V3.1", "c11_parallel_tool_calls", TOOL_FMT_DEEPSEEK, DS_ASSISTANT,
     DS_END, true},
    {"moonshotai-Kimi-K2", "c11_parallel_tool_calls", TOOL_FMT_KIMI,
     "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", false},
    {"Kimi-K2-Instruct", NULL, TOOL_FMT_KIMI, NULL, NULL, false},
    {"meetkai-functionary-medium-v3.1", "c11_parallel_tool_calls", TOOL_FMT_FUNCTIONARY,
     "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eom_id|>", false},
    {"openai-gpt-oss-120b", "c07a_tool_roundtrip_args_object", TOOL_FMT_GPT_OSS,
     "<|start|>assistant", "<|call|>", false},
    {"Apriel-1.6-15b-Thinker-fixed", "c11_parallel_tool_calls", TOOL_FMT_APRIEL,
     "<|begin_assistant|>\n", "<|end|>", false},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", "c11_parallel_tool_calls",
     TOOL_FMT_COMMAND_R7B, "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>", true},
    {"Apertus-8B-Instruct", "c11_parallel_tool_calls", TOOL_FMT_APERTUS, "<|assistant_start|>",
     "[{\"temperature", false},
    {"ByteDance-Seed-OSS", "c11_parallel_tool_calls", TOOL_FMT_SEED_OSS, "<seed:bos>assistant\n",
     "<seed:eos>", true},
    {"MiniMax-M2", "c11_parallel_tool_calls", TOOL_FMT_MINIMAX, "]~b]ai\n", "[e~[", true},
    {"openbmb-MiniCPM5-1B", "c11_parallel_tool_calls", TOOL_FMT_MINICPM, "<|im_start|>assistant\n",
     "<|im_end|>", true},
    {"deepseek-ai-DeepSeek-V4", "c11_parallel_tool_calls", TOOL_FMT_DSML,
     "<\xef\xbd\x9c"
     "Assistant\xef\xbd\x9c></think>",
     "<\xef\xbd\x9c"
     "end\xe2\x96\x81"
     "of\xe2\x96\x81"
     "sentence\xef\xbd\x9c>",
     true},
    /* Gemma 4: the turn ends where the template opens the tool responses */
    {"google-gemma-4-31B-it", "c11_parallel_tool_calls", TOOL_FMT_GEMMA4, "<|turn>model\n",
     "<|tool_response>", true},
    {"google-gemma-4-31B-it", "c07a_tool_roundtrip_args_object", TOOL_FMT_GEMMA4, "<|turn>model\n",
     "<|tool_response>", true},
    {"ibm-granite-granite-3.3-2B-Instruct", NULL, TOOL_FMT_GRANITE, NULL, NULL, true},
    {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", NULL, TOOL_FMT_DEEPSEEK_R1, NULL, NULL, true},
    {"google-gemma-2-2b-it", NULL, TOOL_FMT_GENERIC, NULL, NULL, false},
    {"microsoft-Phi-3.5-mini-instruct", NULL, TOOL_FMT_GENERIC, NULL, NULL, false},
};

/* The same for templates of DIR_MORE. */
static const sample SAMPLES_MORE[] = {
    {"Bielik-11B-v3.0-Instruct", "c11_parallel_tool_calls", TOOL_FMT_HERMES,
     "<|im_start|>assistant\n", "<|im_end|>", true},
    {"Cohere2MoE", "c11_parallel_tool_calls", TOOL_FMT_COMMAND_R7B, "<|CHATBOT_TOKEN|>",
     "<|END_OF_TURN_TOKEN|>", true},
    {"GLM-4.7-Flash", "c11_parallel_tool_calls", TOOL_FMT_GLM, "<|assistant|></think>",
     "<|observation|>", true},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "c11_parallel_tool_calls", TOOL_FMT_HERMES,
     "<|im_start|>assistant\n", "<|im_end|>", false},
    {"Qwen-QwQ-32B", "c11_parallel_tool_calls", TOOL_FMT_HERMES, "<|im_start|>assistant\n",
     "<|im_end|>", true},
    {"Qwen3-Coder", "c11_parallel_tool_calls", TOOL_FMT_QWEN_XML, "<|im_start|>assistant\n",
     "<|im_end|>", false},
    {"StepFun3.5-Flash", "c11_parallel_tool_calls", TOOL_FMT_QWEN_XML,
     "<|im_start|>assistant\n<think>\n\n</think>\n", "<|im_end|>", true},
    {"deepseek-ai-DeepSeek-V3.2", "c11_parallel_tool_calls", TOOL_FMT_DSML_V32,
     DS_ASSISTANT "</think>", DS_END, true},
    {"ibm-granite-granite-4.1", "c11_parallel_tool_calls", TOOL_FMT_HERMES,
     "<|start_of_role|>assistant<|end_of_role|>", "<|end_of_text|>", false},
    {"meta-llama-Llama-3.3-70B-Instruct", "c07a_tool_roundtrip_args_object", TOOL_FMT_LLAMA3,
     "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", false},
    {"unsloth-mistral-Devstral-Small-2507", "c11_parallel_tool_calls", TOOL_FMT_MISTRAL_V11,
     "[/INST]", "</s>", false},
    /* Apriel 1.5 names <tool_call></tool_call> in its instructions, writes <tool_calls>[...] */
    {"unsloth-Apriel-1.5", "c11_parallel_tool_calls", TOOL_FMT_APRIEL, "<|assistant|>\n", "<|end|>",
     false},
    {"upstage-Solar-Open-100B", "c11_parallel_tool_calls", TOOL_FMT_SOLAR_OPEN,
     "<|begin|>assistant", "<|begin|>tool", false},
    /* one call a message (the template renders the first) */
    {"GigaChat3.1-10B-A1.8B", "c07a_tool_roundtrip_args_object", TOOL_FMT_GIGACHAT,
     "assistant<|role_sep|>\n", "<|message_sep|>", false},
    {"google-gemma-4-31B-it-interleaved", "c11_parallel_tool_calls", TOOL_FMT_GEMMA4,
     "<|turn>model\n", "<turn|>", true},
};

static void check_same(const result *a, const result *b, const char *what) {
    CHECK(a->content.len == b->content.len &&
              (!a->content.len || !memcmp(a->content.p, b->content.p, a->content.len)),
          "%s: streamed content differs", what);
    CHECK(a->reasoning.len == b->reasoning.len &&
              (!a->reasoning.len || !memcmp(a->reasoning.p, b->reasoning.p, a->reasoning.len)),
          "%s: streamed reasoning differs", what);
    CHECK(cJSON_Compare(a->calls, b->calls, true), "%s: streamed calls differ", what);
}

static void test_templates(void) {
    int n_checked = 0;
    const size_t n_first = sizeof SAMPLES / sizeof SAMPLES[0];
    for (size_t i = 0; i < n_first + sizeof SAMPLES_MORE / sizeof SAMPLES_MORE[0]; i++) {
        const sample *s = i < n_first ? &SAMPLES[i] : &SAMPLES_MORE[i - n_first];
        const char *dir = i < n_first ? DIR : DIR_MORE;
        char path[256];
        snprintf(path, sizeof path, "%s%s.jinja", dir, s->tmpl);
        char *src = read_file(path);
        CHECK(src, "cannot read %s", path);
        if (!src) continue;
        chat_caps caps;
        chat_caps_detect(src, &caps);
        CHECK(caps.format == s->fmt, "%s: format %s, want %s", s->tmpl,
              tool_format_name(caps.format), tool_format_name(s->fmt));
        CHECK(caps.thinks == s->thinks, "%s: thinks %d", s->tmpl, caps.thinks);
        free(src);
        if (!s->case_id) continue;
        snprintf(path, sizeof path, "%s%s.expected.json", dir, s->tmpl);
        cJSON *exp = read_json(path);
        const cJSON *c = find_case(s->case_id);
        const char *rendered = NULL;
        for (const cJSON *r = cJSON_GetObjectItem(exp, "results")->child; r; r = r->next)
            if (!strcmp(cJSON_GetObjectItem(r, "case")->valuestring, s->case_id) &&
                !cJSON_GetObjectItem(r, "kwargs")->child)
                rendered = cJSON_GetStringValue(cJSON_GetObjectItem(r, "rendered"));
        CHECK(rendered, "%s: no rendering of %s", s->tmpl, s->case_id);
        if (!rendered) {
            cJSON_Delete(exp);
            continue;
        }
        const char *user =
            cJSON_GetObjectItem(cJSON_GetObjectItem(c, "messages")->child, "content")->valuestring;
        const char *u = strstr(rendered, user);
        const char *a = u ? strstr(u, s->after) : NULL;
        const char *e = a ? strstr(a + strlen(s->after), s->end) : NULL;
        CHECK(e, "%s: assistant turn not found", s->tmpl);
        if (!e) {
            cJSON_Delete(exp);
            continue;
        }
        a += strlen(s->after);
        char *turn = strndup(a, (size_t)(e - a));
        tool_spec t = spec_of(cJSON_GetObjectItem(c, "tools"));
        result whole, bytes;
        RUN_CAPS = &caps;
        run(&whole, caps.format, &t, caps.thinks, false, turn, 0);
        run(&bytes, caps.format, &t, caps.thinks, false, turn, 1);
        cJSON *want = expected_calls(c);
        CHECK(cJSON_GetArraySize(want) > 0 &&
                  cJSON_GetArraySize(whole.calls) == cJSON_GetArraySize(want),
              "%s: %d calls, want %d", s->tmpl, cJSON_GetArraySize(whole.calls),
              cJSON_GetArraySize(want));
        n_checked++;
        char *got = cJSON_PrintUnformatted(whole.calls);
        CHECK(cJSON_Compare(whole.calls, want, true), "%s: calls %s\nfrom %s", s->tmpl, got, turn);
        free(got);
        CHECK(whole.content.len == 0, "%s: content '%.*s'", s->tmpl, (int)whole.content.len,
              whole.content.p);
        CHECK(whole.reasoning.len == 0, "%s: reasoning '%.*s'", s->tmpl, (int)whole.reasoning.len,
              whole.reasoning.p);
        check_same(&whole, &bytes, s->tmpl);
        /* Text before the calls stays content (not the bare-JSON formats: a call comes first there). */
        if (caps.format != TOOL_FMT_LLAMA3 && caps.format != TOOL_FMT_GPT_OSS) {
            char *with = NULL;
            if (asprintf(&with, "Let me check.\n%s", turn) > 0) {
                result r2;
                run(&r2, caps.format, &t, caps.thinks, false, with, 3);
                CHECK(buf_is(&r2.content, "Let me check."), "%s: content '%.*s'", s->tmpl,
                      (int)r2.content.len, r2.content.p);
                CHECK(cJSON_Compare(r2.calls, want, true), "%s: calls after content", s->tmpl);
                result_free(&r2);
            }
            free(with);
        }
        RUN_CAPS = NULL;
        cJSON_Delete(want);
        result_free(&whole);
        result_free(&bytes);
        tool_spec_free(&t);
        free(turn);
        cJSON_Delete(exp);
    }
    printf("test_tools: %d templates' tool-call turns parsed\n", n_checked);
}

/* Formats with no call in the renderings: built from their templates' source. */
static void test_handwritten(void) {
    tool_spec t = spec_of(cJSON_GetObjectItem(find_case("c06_tools"), "tools"));
    result r;
    /* DeepSeek R1 (its template: '<｜tool▁call▁begin｜>' + type + '<｜tool▁sep｜>' + name + '\n```json\n' + args + '\n```<｜tool▁call▁end｜>') */
    run(&r, TOOL_FMT_DEEPSEEK_R1, &t, true, true,
        "Paris, so get_weather.\n</think>\n\n<\xef\xbd\x9ctool\xe2\x96\x81"
        "calls\xe2\x96\x81"
        "begin\xef\xbd\x9c>"
        "<\xef\xbd\x9ctool\xe2\x96\x81"
        "call\xe2\x96\x81"
        "begin\xef\xbd\x9c>function<\xef\xbd\x9ctool\xe2\x96\x81"
        "sep\xef\xbd\x9c>get_weather\n```json\n{\"location\": {\"city\": "
        "\"Paris\"}}\n```<\xef\xbd\x9ctool\xe2\x96\x81"
        "call\xe2\x96\x81"
        "end\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"
        "calls\xe2\x96\x81"
        "end\xef\xbd\x9c>",
        2);
    CHECK(buf_is(&r.reasoning, "Paris, so get_weather."), "r1 reasoning '%.*s'",
          (int)r.reasoning.len, r.reasoning.p);
    CHECK(r.content.len == 0, "r1 content '%.*s'", (int)r.content.len, r.content.p);
    CHECK(cJSON_GetArraySize(r.calls) == 1 &&
              !strcmp(cJSON_GetObjectItem(r.calls->child, "name")->valuestring, "get_weather"),
          "r1 call");
    result_free(&r);

    /* Llama 3.1 <|python_tag|> */
    run(&r, TOOL_FMT_LLAMA3, &t, false, false,
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": {\"city\": "
        "\"Oslo\"}}}",
        4);
    CHECK(cJSON_GetArraySize(r.calls) == 1 && r.content.len == 0, "python_tag call");
    result_free(&r);

    /* Bare JSON must name a known function to be a call. */
    run(&r, TOOL_FMT_LLAMA3, &t, false, false, "{\"name\": \"nope\", \"parameters\": {}}", 1);
    CHECK(cJSON_GetArraySize(r.calls) == 0 &&
              buf_is(&r.content, "{\"name\": \"nope\", \"parameters\": {}}"),
          "unknown bare JSON stays content");
    result_free(&r);

    /* Generic: an object or a list of them. */
    run(&r, TOOL_FMT_GENERIC, &t, false, false,
        " [{\"name\": \"get_weather\", \"arguments\": {\"location\": {\"city\": \"Rome\"}}}, "
        "{\"name\": \"search_flights\", \"arguments\": {\"origin\": \"ICN\", \"destination\": "
        "\"CDG\", \"dates\": [\"2024-08-01\"]}}]",
        5);
    CHECK(cJSON_GetArraySize(r.calls) == 2 && r.content.len == 0, "generic list: %d calls",
          cJSON_GetArraySize(r.calls));
    result_free(&r);

    /* Reasoning: Qwen3 writes <think> itself; R1's prompt opened it. */
    run(&r, TOOL_FMT_NONE, &t, true, false, "<think>\nThe capital is Paris.\n</think>\n\nParis.",
        1);
    CHECK(buf_is(&r.reasoning, "The capital is Paris.") && buf_is(&r.content, "Paris."),
          "qwen3 think: '%.*s' / '%.*s'", (int)r.reasoning.len, r.reasoning.p, (int)r.content.len,
          r.content.p);
    result_free(&r);
    run(&r, TOOL_FMT_HERMES, &t, true, true, "Hmm.</think>The <b>answer</b>: 4 < 5", 1);
    CHECK(buf_is(&r.reasoning, "Hmm.") && buf_is(&r.content, "The <b>answer</b>: 4 < 5"),
          "open think: '%.*s'", (int)r.content.len, r.content.p);
    result_free(&r);
    /* Other tags: Seed-OSS */
    chat_caps seed = {.thinks = true, .think_open = "<seed:think>", .think_close = "</seed:think>"};
    RUN_CAPS = &seed;
    run(&r, TOOL_FMT_SEED_OSS, &t, true, false,
        "<seed:think>Sunny?</seed:think>\nIt is <think>sunny</think>.", 1);
    RUN_CAPS = NULL;
    CHECK(buf_is(&r.reasoning, "Sunny?") && buf_is(&r.content, "It is <think>sunny</think>."),
          "seed think: '%.*s' / '%.*s'", (int)r.reasoning.len, r.reasoning.p, (int)r.content.len,
          r.content.p);
    result_free(&r);
    chat_caps magistral = {.thinks = true, .think_open = "[THINK]", .think_close = "[/THINK]"};
    RUN_CAPS = &magistral;
    run(&r, TOOL_FMT_MISTRAL_V11, &t, true, false,
        "[THINK]Weather, so get_weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{\"location\": "
        "{\"city\": \"Nice\"}}",
        2);
    RUN_CAPS = NULL;
    CHECK(buf_is(&r.reasoning, "Weather, so get_weather.") && r.content.len == 0 &&
              cJSON_GetArraySize(r.calls) == 1,
          "[THINK] then a call");
    result_free(&r);
    /* Cut off inside the think block: all reasoning. */
    run(&r, TOOL_FMT_NONE, &t, true, true, "Still thinking about </thi", 2);
    CHECK(buf_is(&r.reasoning, "Still thinking about </thi") && r.content.len == 0,
          "unclosed think");
    result_free(&r);

    /* Plain text passes through byte for byte, whitespace included. */
    const char *plain = "  Hello,\n\n world <tool_ca \t\n";
    run(&r, TOOL_FMT_HERMES, &t, true, false, plain, 1);
    CHECK(buf_is(&r.content, plain), "plain '%.*s'", (int)r.content.len, r.content.p);
    result_free(&r);

    /* A malformed call stays text; an unclosed one at the end too. */
    const char *badcall =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {oops}\n</tool_call>";
    run(&r, TOOL_FMT_HERMES, &t, false, false, badcall, 1);
    CHECK(cJSON_GetArraySize(r.calls) == 0 && buf_is(&r.content, badcall),
          "bad call stays content");
    result_free(&r);
    run(&r, TOOL_FMT_HERMES, &t, false, false, "<tool_call>\n{\"name\": \"get_wea", 1);
    CHECK(cJSON_GetArraySize(r.calls) == 0 &&
              buf_is(&r.content, "<tool_call>\n{\"name\": \"get_wea"),
          "cut call");
    result_free(&r);

    /* gpt-oss: analysis is reasoning, final is content. */
    run(&r, TOOL_FMT_GPT_OSS, &t, false, false,
        "<|channel|>analysis<|message|>User wants "
        "hi.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
        1);
    CHECK(buf_is(&r.reasoning, "User wants hi.") && buf_is(&r.content, "Hi!"),
          "harmony: '%.*s' / '%.*s'", (int)r.reasoning.len, r.reasoning.p, (int)r.content.len,
          r.content.p);
    result_free(&r);
    run(&r, TOOL_FMT_GPT_OSS, &t, false, false,
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\": "
        "{\"city\": \"Lima\"}}",
        3);
    CHECK(cJSON_GetArraySize(r.calls) == 1 && r.content.len == 0, "harmony call");
    result_free(&r);

    /* parallel_tool_calls false keeps the first call. */
    t.parallel = false;
    run(&r, TOOL_FMT_HERMES, &t, false, false,
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": "
        "{}}</tool_call><tool_call>{\"name\": \"get_weather\", "
        "\"arguments\": {}}</tool_call>",
        0);
    CHECK(cJSON_GetArraySize(r.calls) == 1, "one call without parallel_tool_calls");
    result_free(&r);
    tool_spec_free(&t);

    CHECK(prompt_opens_think("<|Assistant|><think>\n", 21, "<think>", "</think>"), "open");
    CHECK(!prompt_opens_think("<think>\n\n</think>\n\n", 19, "<think>", "</think>"), "closed");
    CHECK(!prompt_opens_think("no tags", 7, "<think>", "</think>"), "none");
}

static bool real_rules(const char *schema, const char *prefix, kvl_buf *out, char *err, size_t cap);

/* Gemma 4: its values, its reasoning channel, and what is not a call. */
static const chat_caps GEMMA_CAPS = {
    .thinks = true, .think_open = "<|channel>thought", .think_close = "<channel|>"};

/* text parsed whole and one byte at a time with Gemma 4's tags: the same
 * result (returned: the whole one). */
static void run_gemma(result *r, tool_format f, const tool_spec *t, bool in_think, const char *text,
                      const char *what) {
    result bytes;
    RUN_CAPS = &GEMMA_CAPS;
    run(r, f, t, true, in_think, text, 0);
    run(&bytes, f, t, true, in_think, text, 1);
    RUN_CAPS = NULL;
    check_same(r, &bytes, what);
    result_free(&bytes);
}

static void check_call(const result *r, int i, const char *name, const char *args_json,
                       const char *what) {
    const cJSON *c = cJSON_GetArrayItem(r->calls, i);
    cJSON *want = cJSON_Parse(args_json);
    char *got = c ? cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "arguments")) : NULL;
    CHECK(c && !strcmp(cJSON_GetObjectItem(c, "name")->valuestring, name) &&
              cJSON_Compare(cJSON_GetObjectItem(c, "arguments"), want, true),
          "%s: call %d is %s", what, i, got ? got : "missing");
    free(got);
    cJSON_Delete(want);
}

static void test_gemma(void) {
    char *src = read_file(DIR "google-gemma-4-31B-it.jinja");
    chat_caps caps;
    chat_caps_detect(src, &caps);
    free(src);
    CHECK(caps.format == TOOL_FMT_GEMMA4 && caps.thinks &&
              !strcmp(caps.think_open, GEMMA_CAPS.think_open) &&
              !strcmp(caps.think_close, GEMMA_CAPS.think_close),
          "gemma 4 caps: %s, think %s", tool_format_name(caps.format), caps.think_open);
    tool_spec t = spec_of(cJSON_GetObjectItem(find_case("c06_tools"), "tools"));
    result r;

    /* An assistant turn with reasoning_content and a call as the template renders it (jinja2,
     * enable_thinking): every kind of value, a string with quotes, a backslash and a line break,
     * Python's None. */
    run_gemma(&r, TOOL_FMT_GEMMA4, &t, false,
              "<|channel>thought\nThe user wants Oslo's weather, so get_weather.\n<channel|>"
              "<|tool_call>call:get_weather{days:3,hourly:true,location:{city:<|\"|>Oslo<|\"|>,"
              "country:<|\"|>NO<|\"|>},note:None,path:<|\"|>C:\\tmp\nx<|\"|>,tags:[<|\"|>a "
              "\"q\"<|\"|>,1.5,false]}<tool_call|>",
              "gemma reasoning + call");
    CHECK(buf_is(&r.reasoning, "The user wants Oslo's weather, so get_weather.") &&
              r.content.len == 0 && cJSON_GetArraySize(r.calls) == 1,
          "gemma: reasoning '%.*s', content '%.*s'", (int)r.reasoning.len, r.reasoning.p,
          (int)r.content.len, r.content.p);
    check_call(&r, 0, "get_weather",
               "{\"days\": 3, \"hourly\": true, \"location\": {\"city\": \"Oslo\", \"country\": "
               "\"NO\"}, \"note\": null, \"path\": \"C:\\\\tmp\\nx\", \"tags\": [\"a \\\"q\\\"\", "
               "1.5, false]}",
               "gemma values");
    result_free(&r);

    /* Numbers as written, nesting, empty containers, whitespace and JSON strings a model may
     * add, content before the calls, two calls. */
    run_gemma(&r, TOOL_FMT_GEMMA4, &t, false,
              "Checking both.<|tool_call>call:search_flights{ dates: [<|\"|>2024-08-01<|\"|>], "
              "n:-0.5e3, big:12345678901234567890, e:{}, l:[], m:[[1,{k:null}]], \"q\":\"\\u00e9\" "
              "}<tool_call|>\n<|tool_call>call:get_weather{}<tool_call|>",
              "gemma two calls");
    CHECK(buf_is(&r.content, "Checking both.") && cJSON_GetArraySize(r.calls) == 2,
          "gemma two calls: content '%.*s', %d calls", (int)r.content.len, r.content.p,
          cJSON_GetArraySize(r.calls));
    check_call(&r, 0, "search_flights",
               "{\"dates\": [\"2024-08-01\"], \"n\": -0.5e3, \"big\": 12345678901234567890, \"e\": "
               "{}, \"l\": [], \"m\": [[1, {\"k\": null}]], \"q\": \"\\u00e9\"}",
               "gemma two calls");
    check_call(&r, 1, "get_weather", "{}", "gemma two calls");
    result_free(&r);

    /* Thinking off: the prompt wrote an empty channel, so the answer is content; the model may
     * write an empty one itself. Reasoning without tools too. */
    const char *off = "<|turn>model\n<|channel>thought\n<channel|>";
    CHECK(!prompt_opens_think(off, strlen(off), GEMMA_CAPS.think_open, GEMMA_CAPS.think_close),
          "gemma: thinking off closes the channel");
    const char *on = "<|turn>model\n<|channel>thought\n";
    CHECK(prompt_opens_think(on, strlen(on), GEMMA_CAPS.think_open, GEMMA_CAPS.think_close),
          "gemma: an open channel");
    run_gemma(&r, TOOL_FMT_GEMMA4, &t, false, "<|channel>thought\n<channel|>Paris.", "empty");
    CHECK(r.reasoning.len == 0 && buf_is(&r.content, "Paris."), "gemma empty thought: '%.*s'",
          (int)r.content.len, r.content.p);
    result_free(&r);
    run_gemma(&r, TOOL_FMT_NONE, &t, false,
              "<|channel>thought\nThe capital of France is Paris.\n<channel|>It is Paris.",
              "gemma reasoning");
    CHECK(buf_is(&r.reasoning, "The capital of France is Paris.") &&
              buf_is(&r.content, "It is Paris."),
          "gemma reasoning: '%.*s' / '%.*s'", (int)r.reasoning.len, r.reasoning.p,
          (int)r.content.len, r.content.p);
    result_free(&r);

    /* Not calls: they stay content, as written. */
    static const char *const bad[] = {
        "<|tool_call>call:get_weather{location:{city:<|\"|>Par",           /* cut off */
        "<|tool_call>call:get_weather{location:{city Paris}}<tool_call|>", /* no ':' */
        "<|tool_call>call:get_weather{location:<|\"|>Paris}<tool_call|>",  /* open string */
        "<|tool_call>call:get_weather{unit:celsius}<tool_call|>",          /* bare word */
        "<|tool_call>call:get_weather{a:1}}<tool_call|>",                  /* extra brace */
        "<|tool_call>call:get_weather{a:[1,2}<tool_call|>",                /* bad nesting */
        "<|tool_call>call:get_weather{a:01}<tool_call|>",                  /* not a number */
        "<|tool_call>get_weather{a:1}<tool_call|>",                        /* no call: */
        "<|tool_call>call:{a:1}<tool_call|>",                              /* no name */
        "<|tool_call>call:get_weather[1]<tool_call|>",                     /* not an object */
        "<|tool_call>call:get_weather{a:1} and more<tool_call|>",          /* text after */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        run_gemma(&r, TOOL_FMT_GEMMA4, &t, false, bad[i], bad[i]);
        CHECK(cJSON_GetArraySize(r.calls) == 0 && buf_is(&r.content, bad[i]),
              "gemma: not a call, content '%.*s'", (int)r.content.len, r.content.p);
        result_free(&r);
    }
    kvl_buf deep = {0}; /* nested deeper than the reader goes */
    kvl_buf_puts(&deep, "<|tool_call>call:get_weather{");
    for (int i = 0; i < 80; i++) kvl_buf_puts(&deep, "a:{");
    for (int i = 0; i < 81; i++) kvl_buf_puts(&deep, "}");
    kvl_buf_puts(&deep, "<tool_call|>");
    run_gemma(&r, TOOL_FMT_GEMMA4, &t, false, deep.p, "deep");
    CHECK(cJSON_GetArraySize(r.calls) == 0 && buf_is(&r.content, deep.p), "gemma: too deep");
    result_free(&r);
    kvl_buf_free(&deep);
    /* A complete call the output ended before closing is a call, as in the other formats. */
    run_gemma(&r, TOOL_FMT_GEMMA4, &t, false, "<|tool_call>call:get_weather{a:1}", "unclosed");
    CHECK(cJSON_GetArraySize(r.calls) == 1 && r.content.len == 0, "gemma: unclosed call");
    result_free(&r);

    /* The constrained grammar takes the template's own rendering of the calls (c11) and keeps
     * to the schema: an enum, a required property, the sorted order, strings. */
    t.choice = TOOL_CHOICE_REQUIRED;
    kvl_buf g = {0};
    char err[400] = "";
    CHECK(tool_grammar(TOOL_FMT_GEMMA4, &t, NULL, real_rules, &g, err, sizeof err), "%s", err);
    kvl_error ke = {{0}};
    grammar *gr = grammar_compile(g.p, NULL, &ke);
    CHECK(gr, "gemma grammar: %s\n%s", ke.msg, g.p);
    static const struct {
        const char *text;
        bool ok;
    } texts[] = {
        {"<|tool_call>call:get_weather{location:{city:<|\"|>Paris<|\"|>}}<tool_call|><|tool_call>"
         "call:get_weather{location:{city:<|\"|>\xec\x84\x9c\xec\x9a\xb8<|\"|>,country:<|\"|>KR<|"
         "\"|>},unit:<|\"|>celsius<|\"|>}<tool_call|>",
         true},
        {"<|tool_call>call:search_flights{cabin:<|\"|>first<|\"|>,dates:[<|\"|>a<|\"|>,<|\"|>b<|"
         "\"|>],destination:<|\"|>CDG<|\"|>,origin:<|\"|>I<C<|\"|>,passengers:2}<tool_call|>",
         true},
        {"<|tool_call>call:get_weather{location:{city:<|\"|>a<<|\"|>}}<tool_call|>", true},
        {"<|tool_call>call:get_weather{location:{city:<|\"|>Paris<|\"|>},unit:<|\"|>kelvin<|\"|>}"
         "<tool_call|>",
         false},
        {"<|tool_call>call:get_weather{unit:<|\"|>celsius<|\"|>}<tool_call|>", false},
        {"<|tool_call>call:get_weather{unit:<|\"|>celsius<|\"|>,location:{city:<|\"|>P<|\"|>}}"
         "<tool_call|>",
         false},
        {"<|tool_call>call:get_weather{\"location\": {\"city\": \"Paris\"}}<tool_call|>", false},
        {"<|tool_call>call:search_flights{dates:[],destination:<|\"|>C<|\"|>,origin:<|\"|>I<|\"|>,"
         "passengers:2.5}<tool_call|>",
         false},
        {"<|tool_call>call:get_time{}<tool_call|>", false},
    };
    for (size_t i = 0; gr && i < sizeof texts / sizeof texts[0]; i++)
        CHECK(grammar_match_text(gr, texts[i].text, strlen(texts[i].text)) == texts[i].ok,
              "gemma grammar %s\n%s", texts[i].ok ? "refuses" : "matches", texts[i].text);
    grammar_free(gr);
    kvl_buf_free(&g);
    tool_spec_free(&t);

    /* Optional keys only (any of them left out), type lists, anyOf, const, keys sorted
     * without case as jinja's dictsort does. */
    cJSON *tools = cJSON_Parse(
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"C\": {\"const\": \"x\"}, \"a\": "
        "{\"type\": [\"integer\", \"null\"]}, \"b\": {\"anyOf\": [{\"type\": \"boolean\"}, "
        "{\"type\": \"array\", \"items\": {\"type\": \"number\"}}]}}}}}]");
    t = spec_of(tools);
    cJSON_Delete(tools);
    t.choice = TOOL_CHOICE_REQUIRED;
    CHECK(tool_grammar(TOOL_FMT_GEMMA4, &t, NULL, real_rules, &g, err, sizeof err), "%s", err);
    gr = grammar_compile(g.p, NULL, &ke);
    CHECK(gr, "gemma grammar: %s\n%s", ke.msg, g.p);
    static const struct {
        const char *args;
        bool ok;
    } args[] = {{"{}", true},
                {"{a:null}", true},
                {"{a:-3,b:[1.5,2e3]}", true},
                {"{b:true}", true},
                {"{C:<|\"|>x<|\"|>}", true},
                {"{a:1,b:false,C:<|\"|>x<|\"|>}", true},
                {"{C:<|\"|>x<|\"|>,a:1}", false},
                {"{a:1.5}", false},
                {"{b:<|\"|>x<|\"|>}", false},
                {"{C:<|\"|>y<|\"|>}", false},
                {"{a:1,}", false},
                {"{d:1}", false}};
    for (size_t i = 0; gr && i < sizeof args / sizeof args[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "<|tool_call>call:f%s<tool_call|>", args[i].args);
        CHECK(grammar_match_text(gr, text, strlen(text)) == args[i].ok, "gemma grammar %s %s",
              args[i].ok ? "refuses" : "matches", text);
        if (args[i].ok) { /* and the parser reads it */
            run_gemma(&r, TOOL_FMT_GEMMA4, &t, false, text, text);
            CHECK(cJSON_GetArraySize(r.calls) == 1 && r.content.len == 0, "gemma: %s", text);
            result_free(&r);
        }
    }
    grammar_free(gr);
    kvl_buf_free(&g);
    tool_spec_free(&t);
}

/* Random text made of the formats' markers, pieces of them, JSON and words,
 * cut at random points: streamed, the parser must decide exactly what it
 * decides on the whole text (and never crash on its way). */
static void test_soup(void) {
    static const char *const pieces[] = {
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "call>",
        "<think>",
        "</think>",
        "</thi",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "<|python_tag|>",
        "<function=",
        "</function>",
        "<function=get_weather>",
        "<parameter=city>",
        "</parameter>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<\xef\xbd\x9ctool\xe2\x96\x81"
        "calls\xe2\x96\x81"
        "begin\xef\xbd\x9c>",
        "<\xef\xbd\x9ctool\xe2\x96\x81"
        "call\xe2\x96\x81"
        "begin\xef\xbd\x9c>",
        "<\xef\xbd\x9ctool\xe2\x96\x81"
        "sep\xef\xbd\x9c>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "to=functions.get_weather",
        "analysis",
        "final",
        "{",
        "}",
        "[",
        "]",
        "\"",
        "\\",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
        "\"parameters\": ",
        ", ",
        "get_weather",
        " ",
        "\n",
        "Hello",
        "x<y",
        "\xc3\xa9",
        "<|tool_call>",
        "<tool_call|>",
        "call:get_weather{",
        "location:{city:",
        "<|\"|>",
        "<|channel>thought\n",
        "<channel|>",
        "None",
        "-1.5e3",
        "true,"};
    const int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    tool_spec t = spec_of(cJSON_GetObjectItem(find_case("c06_tools"), "tools"));
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int differ = 0;
    for (int f = TOOL_FMT_NONE; f < TOOL_FMT_COUNT; f++)
        for (int iter = 0; iter < 150; iter++) {
            char text[2048];
            size_t len = 0;
            int k = 1 + (int)(rng % 24);
            for (int i = 0; i < k; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                const char *pc = pieces[(rng >> 33) % (uint64_t)n_pieces];
                size_t pl = strlen(pc);
                if (len + pl >= sizeof text) break;
                memcpy(text + len, pc, pl);
                len += pl;
            }
            text[len] = 0;
            bool think = iter & 1, in_think = think && (iter & 2);
            result whole, cut;
            if (f == TOOL_FMT_GEMMA4) RUN_CAPS = &GEMMA_CAPS; /* its reasoning channel */
            run(&whole, (tool_format)f, &t, think, in_think, text, 0);
            run(&cut, (tool_format)f, &t, think, in_think, text, 1 + (rng >> 40) % 7);
            RUN_CAPS = NULL;
            bool same = whole.content.len == cut.content.len &&
                        whole.reasoning.len == cut.reasoning.len &&
                        (!whole.content.len ||
                         !memcmp(whole.content.p, cut.content.p, whole.content.len)) &&
                        (!whole.reasoning.len ||
                         !memcmp(whole.reasoning.p, cut.reasoning.p, whole.reasoning.len)) &&
                        cJSON_Compare(whole.calls, cut.calls, true);
            if (!same && differ++ < 5)
                fprintf(stderr, "soup %s (think %d/%d): streamed differs on\n%s\n",
                        tool_format_name((tool_format)f), think, in_think, text);
            result_free(&whole);
            result_free(&cut);
        }
    CHECK(differ == 0, "%d random texts parsed differently when streamed", differ);
    tool_spec_free(&t);
}

static bool refused(const char *body_json, const char *param) {
    cJSON *b = cJSON_Parse(body_json);
    tool_spec t;
    char p[64] = "", m[400] = "";
    bool ok = tool_spec_parse(b, &t, p, sizeof p, m, sizeof m);
    cJSON_Delete(b);
    if (ok) tool_spec_free(&t);
    CHECK(!ok, "accepted: %s", body_json);
    CHECK(ok || !strncmp(p, param, strlen(param)), "param '%s' (want %s): %s", p, param, m);
    return !ok;
}

static void test_request(void) {
    const char *fn = "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                     "{\"type\": \"object\"}}}";
    char body[512];
    snprintf(body, sizeof body,
             "{\"tools\": [%s], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
             "\"g\"}}}",
             fn);
    refused(body, "tool_choice");
    snprintf(body, sizeof body, "{\"tools\": [%s], \"tool_choice\": \"sometimes\"}", fn);
    refused(body, "tool_choice");
    refused("{\"tool_choice\": \"required\"}", "tool_choice");
    refused("{\"tools\": [{\"type\": \"retrieval\"}]}", "tools[0]");
    refused("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}",
            "tools[0]");
    refused("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": "
            "[]}}]}",
            "tools[0]");
    refused("{\"tools\": {}}", "tools");
    refused("{\"parallel_tool_calls\": 1}", "parallel_tool_calls");
    snprintf(body, sizeof body, "{\"tools\": [%s, %s]}", fn, fn);
    refused(body, "tools[1]");

    snprintf(body, sizeof body,
             "{\"tools\": [%s], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
             "\"f\"}}, "
             "\"parallel_tool_calls\": false}",
             fn);
    cJSON *b = cJSON_Parse(body);
    tool_spec t;
    char p[64], m[400];
    CHECK(tool_spec_parse(b, &t, p, sizeof p, m, sizeof m), "%s", m);
    CHECK(t.n == 1 && t.choice == TOOL_CHOICE_NAMED && t.named == 0 && !t.parallel, "named spec");
    char *sys = tool_system_prompt(TOOL_FMT_GENERIC, &t);
    CHECK(sys && strstr(sys, "\"name\":\"f\"") && strstr(sys, "{\"name\": \"f\", \"arguments\": "),
          "system prompt: %s", sys);
    free(sys);
    tool_spec_free(&t);
    cJSON_Delete(b);
}

/* The grammar text: the format's literal markers around each function's
 * schema rules (here a stand-in for json_schema_to_gbnf). */
static bool fake_rules(const char *schema, const char *prefix, kvl_buf *out, char *err,
                       size_t cap) {
    (void)schema;
    (void)err;
    (void)cap;
    kvl_buf_printf(out, "%sroot ::= \"{}\"\n", prefix);
    return true;
}

static void test_grammar_text(void) {
    cJSON *b =
        cJSON_Parse("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, "
                    "{\"type\": \"function\", \"function\": {\"name\": \"b\"}}], \"tool_choice\": "
                    "\"required\"}");
    tool_spec t;
    char p[64], m[400];
    CHECK(tool_spec_parse(b, &t, p, sizeof p, m, sizeof m), "%s", m);
    kvl_buf g = {0};
    char err[200];
    CHECK(tool_grammar(TOOL_FMT_HERMES, &t, NULL, fake_rules, &g, err, sizeof err), "%s", err);
    kvl_buf_puts(&g, "");
    const char *want = "root ::= call ( \"\\n\" call )* \n"
                       "call ::= fn0 | fn1\n"
                       "fn0 ::= \"<tool_call>\\n{\\\"name\\\": \\\"\" \"a\" \"\\\", "
                       "\\\"arguments\\\": \" t0-root \"}\\n</tool_call>\" \n"
                       "t0-root ::= \"{}\"\n"
                       "fn1 ::= \"<tool_call>\\n{\\\"name\\\": \\\"\" \"b\" \"\\\", "
                       "\\\"arguments\\\": \" t1-root \"}\\n</tool_call>\" \n"
                       "t1-root ::= \"{}\"\n";
    CHECK(g.p && !strcmp(g.p, want), "grammar:\n%s", g.p);
    kvl_buf_free(&g);
    t.choice = TOOL_CHOICE_NAMED; /* parallel_tool_calls still true: one call all the same */
    t.named = 0;
    CHECK(tool_grammar(TOOL_FMT_HERMES, &t, NULL, fake_rules, &g, err, sizeof err), "%s", err);
    kvl_buf_puts(&g, "");
    CHECK(g.p && !strncmp(g.p, "root ::= call \ncall ::= fn0\n", 27) && !strstr(g.p, "fn1"),
          "named:\n%s", g.p);
    kvl_buf_free(&g);
    t.parallel = false;
    t.choice = TOOL_CHOICE_NAMED;
    t.named = 1;
    CHECK(tool_grammar(TOOL_FMT_MISTRAL_V11, &t, "</think>", fake_rules, &g, err, sizeof err), "%s",
          err);
    kvl_buf_puts(&g, "");
    CHECK(g.p && strstr(g.p, "root ::= \"</think>\\n\\n\" call \n") &&
              strstr(g.p, "call ::= fn1\n") &&
              strstr(g.p, "fn1 ::= \"[TOOL_CALLS]\" \"b\" \"[ARGS]\" t1-root \n") &&
              !strstr(g.p, "fn0"),
          "mistral grammar:\n%s", g.p);
    kvl_buf_free(&g);
    tool_spec_free(&t);
    cJSON_Delete(b);
}

static bool real_rules(const char *schema, const char *prefix, kvl_buf *out, char *err,
                       size_t cap) {
    kvl_error ke = {{0}};
    if (json_schema_to_gbnf(schema, prefix, out, &ke)) return true;
    snprintf(err, cap, "%s", ke.msg);
    return false;
}

/* Every format: the calls a constrained decoder writes (tool_calls_text) are
 * sentences of the format's grammar (json_schema_to_gbnf for the arguments),
 * and the parser reads exactly those calls back. */
static void test_grammar_roundtrip(void) {
    tool_spec t = spec_of(cJSON_GetObjectItem(find_case("c06_tools"), "tools"));
    t.choice = TOOL_CHOICE_REQUIRED;
    const char *names[] = {"get_weather", "search_flights"};
    const char *args[] = {
        "{\"location\": {\"city\": \"Paris\"}, \"unit\": \"celsius\"}",
        "{\"origin\": \"ICN\", \"destination\": \"CDG\", \"dates\": [\"2024-08-01\"]}"};
    for (int f = TOOL_FMT_GENERIC; f < TOOL_FMT_COUNT; f++) {
        kvl_buf g = {0};
        char err[400] = "";
        bool ok = tool_grammar((tool_format)f, &t, NULL, real_rules, &g, err, sizeof err);
        CHECK(ok, "%s: %s", tool_format_name((tool_format)f), err);
        kvl_error ke = {{0}};
        grammar *gr = ok ? grammar_compile(g.p, NULL, &ke) : NULL;
        CHECK(gr, "%s: %s\n%s", tool_format_name((tool_format)f), ke.msg, g.p);
        for (int n = 1; n <= 2 && gr; n++) {
            kvl_buf text = {0};
            tool_calls_text((tool_format)f, names, args, n, &text);
            kvl_buf_puts(&text, "");
            bool many = f != TOOL_FMT_GENERIC && f != TOOL_FMT_LLAMA3 && f != TOOL_FMT_GPT_OSS &&
                        f != TOOL_FMT_GIGACHAT;
            bool match = grammar_match_text(gr, text.p, text.len);
            CHECK(match == (n == 1 || many), "%s, %d calls: grammar %s\n%s",
                  tool_format_name((tool_format)f), n, match ? "matches" : "refuses", text.p);
            if (n > 1 && !many) { /* a single-call format: nothing more to read */
                kvl_buf_free(&text);
                continue;
            }
            result r;
            run(&r, (tool_format)f, &t, false, false, text.p, 3);
            CHECK(cJSON_GetArraySize(r.calls) == n && r.content.len == 0,
                  "%s: %d calls parsed of %d\n%s", tool_format_name((tool_format)f),
                  cJSON_GetArraySize(r.calls), n, text.p);
            for (int i = 0; i < n && cJSON_GetArraySize(r.calls) == n; i++) {
                const cJSON *c = cJSON_GetArrayItem(r.calls, i);
                cJSON *want = cJSON_Parse(args[i]);
                CHECK(!strcmp(cJSON_GetObjectItem(c, "name")->valuestring, names[i]) &&
                          cJSON_Compare(cJSON_GetObjectItem(c, "arguments"), want, true),
                      "%s: call %d", tool_format_name((tool_format)f), i);
                cJSON_Delete(want);
            }
            result_free(&r);
            kvl_buf_free(&text);
        }
        grammar_free(gr);
        kvl_buf_free(&g);
    }
    tool_spec_free(&t);
}

int main(void) {
    CASES = read_json(DIR "cases.json");
    if (!CASES) {
        fprintf(stderr, "cannot read " DIR "cases.json (run from the repository root)\n");
        return 1;
    }
    test_templates();
    test_handwritten();
    test_gemma();
    test_soup();
    test_request();
    test_grammar_text();
    test_grammar_roundtrip();
    /* every format's markers (and the reasoning tags) fit the engine's kept control tokens:
     * one dropped would be printed as nothing and the call never parsed */
    for (int f = TOOL_FMT_NONE; f < TOOL_FMT_COUNT; f++) {
        const char *m[ENGINE_MAX_KEEP_SPECIAL + 1];
        CHECK(tool_format_markers((tool_format)f, m, ENGINE_MAX_KEEP_SPECIAL + 1) <=
                  ENGINE_MAX_KEEP_SPECIAL,
              "format %d: more markers than ENGINE_MAX_KEEP_SPECIAL", f);
    }
    CHECK(n_ids > 20 && n_ids_last_a * 4 < n_ids, "%d of %d ids end with 'A'", n_ids_last_a, n_ids);
    cJSON_Delete(CASES);
    if (failures) fprintf(stderr, "test_tools: %d failure(s)\n", failures);
    else printf("test_tools: all passed\n");
    return failures != 0;
}
