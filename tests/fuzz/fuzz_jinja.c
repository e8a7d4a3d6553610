/* libFuzzer target for the Jinja interpreter: the input is a template source,
 * compiled and (when it compiles) rendered with a conversation that has tools,
 * tool calls, content parts and a reasoning trace. Any crash, sanitizer report
 * or leak is a finding; syntax and render errors are ordinary outcomes. */
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

static const char *VARS =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Weather in Paris?\"}]},"
    " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"think\", "
    "\"tool_calls\": [{\"id\": \"c1\","
    " \"type\": \"function\", \"function\": {\"name\": \"w\", \"arguments\": {\"city\": \"Paris\", "
    "\"n\": 2.5}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"sunny\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": "
    "{\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"a\", \"b\"]}}, \"required\": "
    "[\"city\"]}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": "
    "\"</s>\","
    " \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static cJSON *vars;
    if (!vars) vars = jinja_json_parse(VARS, strlen(VARS), NULL);
    if (size > 65536) return 0;
    char err[256];
    jinja_template *t = jinja_template_create((const char *)data, size, err, sizeof err);
    if (!t) return 0;
    const jinja_date d = {2024, 7, 26};
    char *out = NULL;
    size_t n;
    jinja_template_render(t, vars, &d, &out, &n, err, sizeof err);
    free(out);
    jinja_template_destroy(t);
    return 0;
}
