/* jinja_caps: what a chat template can do, found as llama.cpp finds it
 * (common/jinja/caps.cpp, what llama-server reports as /props'
 * chat_template_caps): a few probe conversations are rendered with the
 * values tracked, and the capabilities read from which input values the
 * template read (jv.used), did to them (jv.ops) or printed:
 *   string content   the one-message probe renders (typed content: its
 *                    content indexed, iterated or passed to selectattr)
 *   system role      the system message's content was read
 *   tools            the tool's function name was read
 *   tool calls       the assistant's tool_calls were read (object arguments:
 *                    an argument of the object form was; else a probe with
 *                    the arguments as a JSON string must render)
 *   parallel calls   the second of two calls was read
 *   preserve reasoning  an earlier assistant turn's reasoning_content is in
 *                    the output with preserve_thinking set
 * Probes that fail (a template raising on what it does not take) leave the
 * defaults, as llama.cpp's: tools, tool calls, system role, parallel calls
 * and string content on; the rest off. */
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "jinja_internal.h"

/* ---------------------------------------------------- the probes' input -- */

static cJSON *msg(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}

/* One tool call named tool1 with {"arg": "value"}: an object, or its JSON text. */
static cJSON *call(const char *id, bool object_args) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", "tool1");
    if (object_args)
        cJSON_AddStringToObject(cJSON_AddObjectToObject(f, "arguments"), "arg", "value");
    else cJSON_AddStringToObject(f, "arguments", "{\"arg\": \"value\"}");
    return c;
}

/* user, assistant with n_calls tool calls, tool, assistant, user. */
static cJSON *tool_conversation(int n_calls, bool object_args) {
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, msg("user", "User message"));
    cJSON *as = msg("assistant", ""); /* some templates want empty content beside calls */
    cJSON *calls = cJSON_AddArrayToObject(as, "tool_calls");
    cJSON_AddItemToArray(calls, call("call00001", object_args));
    if (n_calls > 1) cJSON_AddItemToArray(calls, call("call00002", object_args));
    cJSON_AddItemToArray(a, as);
    cJSON *tr = msg("tool", "Tool response");
    cJSON_AddStringToObject(tr, "tool_call_id", "call00001");
    cJSON_AddItemToArray(a, tr);
    cJSON_AddItemToArray(a, msg("assistant", "The tool response was 'tool response'"));
    cJSON_AddItemToArray(a, msg("user", "User message"));
    return a;
}

static cJSON *one_tool(void) {
    cJSON *a = cJSON_CreateArray(), *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "name", "tool");
    cJSON_AddStringToObject(t, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(t, "function");
    cJSON_AddStringToObject(f, "name", "tool1");
    cJSON_AddStringToObject(f, "description", "Tool description");
    cJSON *p = cJSON_AddObjectToObject(f, "parameters");
    cJSON_AddStringToObject(p, "type", "object");
    cJSON *arg = cJSON_AddObjectToObject(cJSON_AddObjectToObject(p, "properties"), "arg");
    cJSON_AddStringToObject(arg, "type", "string");
    cJSON_AddStringToObject(arg, "description", "Arg description");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(p, "required"), cJSON_CreateString("arg"));
    cJSON_AddItemToArray(a, t);
    return a;
}

#define REASONING_PLACEHOLDER "<REASONING_CONTENT_PLACEHOLDER>"

/* ------------------------------------------------------- the analysis -- */

/* Walks a path of the render's values: names (dict keys) and "#N" (list items). */
static jv *walk(jx *x, const char *global, const char *const *path) {
    jv *v = jx_global_get(x, global);
    for (; v && *path; path++) {
        if ((*path)[0] == '#') {
            const size_t i = (size_t)atoi(*path + 1);
            v = v->type == JV_LIST && i < v->u.list.n ? v->u.list.items[i] : NULL;
        } else v = v->type == JV_DICT ? jv_dict_get(v, *path, strlen(*path)) : NULL;
    }
    return v;
}

#define PATH(...) ((const char *const[]){__VA_ARGS__, NULL})

static bool used(jx *x, const char *global, const char *const *path) {
    jv *v = walk(x, global, path);
    return v && v->used;
}

typedef enum {
    P_TYPED,
    P_SYSTEM,
    P_TOOLS_OBJECT,
    P_TOOLS_STRING,
    P_PARALLEL,
    P_REASONING
} probe_kind;

typedef struct probe {
    probe_kind kind;
    jinja_caps *caps;
} probe;

static void look(void *ctx, jinja_status st, jx *x, const char *out) {
    const probe *p = ctx;
    jinja_caps *c = p->caps;
    const bool ok = st == JINJA_OK;
    switch (p->kind) {
    case P_TYPED: {
        jv *content = walk(x, "messages", PATH("#0", "content"));
        if (content && content->ops & (JV_OP_ARRAY | JV_OP_SELECTATTR))
            c->supports_typed_content = true;
        if (!ok) c->supports_string_content = false;
        break;
    }
    case P_SYSTEM:
        if (!used(x, "messages", PATH("#0", "content"))) c->supports_system_role = false;
        break;
    case P_TOOLS_OBJECT:
    case P_TOOLS_STRING:
        if (!ok) {
            if (p->kind == P_TOOLS_STRING) c->supports_tool_calls = c->supports_tools = false;
            break;
        }
        if (!used(x, "tools", PATH("#0", "function", "name"))) c->supports_tools = false;
        if (!used(x, "messages", PATH("#1", "tool_calls"))) {
            c->supports_tool_calls = false;
            break;
        }
        if (p->kind == P_TOOLS_OBJECT &&
            used(x, "messages", PATH("#1", "tool_calls", "#0", "function", "arguments", "arg")))
            c->supports_object_arguments = true;
        break;
    case P_PARALLEL:
        if (!ok || !used(x, "messages", PATH("#1", "tool_calls", "#1", "function")))
            c->supports_parallel_tool_calls = false;
        break;
    case P_REASONING:
        if (out && strstr(out, REASONING_PLACEHOLDER)) c->supports_preserve_reasoning = true;
        break;
    }
}

/* Renders t over messages (and tools: NULL for none) as probe `kind`. */
static void run(const jinja_template *t, probe_kind kind, cJSON *messages, cJSON *tools,
                bool preserve, jinja_caps *caps) {
    cJSON *vars = cJSON_CreateObject();
    cJSON_AddItemToObject(vars, "messages", messages);
    cJSON_AddItemToObject(vars, "tools", tools ? tools : cJSON_CreateArray());
    cJSON_AddStringToObject(vars, "bos_token", "");
    cJSON_AddStringToObject(vars, "eos_token", "");
    cJSON_AddBoolToObject(vars, "add_generation_prompt", true);
    if (preserve) { /* llama.cpp's caps_apply_preserve_reasoning */
        cJSON_AddBoolToObject(vars, "preserve_thinking", true);
        cJSON_AddBoolToObject(vars, "clear_thinking", false);
        cJSON_AddBoolToObject(vars, "truncate_history_thinking", false);
    }
    probe p = {kind, caps};
    jx_render_tracked(t, vars, look, &p);
    cJSON_Delete(vars);
}

void jinja_template_caps(const jinja_template *t, jinja_caps *caps) {
    *caps = (jinja_caps){.supports_tools = true,
                         .supports_tool_calls = true,
                         .supports_system_role = true,
                         .supports_parallel_tool_calls = true,
                         .supports_string_content = true};
    cJSON *m = cJSON_CreateArray();
    cJSON_AddItemToArray(m, msg("user", "content"));
    run(t, P_TYPED, m, NULL, false, caps);
    m = cJSON_CreateArray();
    cJSON_AddItemToArray(m, msg("system", "System message"));
    cJSON_AddItemToArray(m, msg("user", "User message"));
    run(t, P_SYSTEM, m, NULL, false, caps);
    run(t, P_TOOLS_OBJECT, tool_conversation(1, true), one_tool(), false, caps);
    if (!caps->supports_object_arguments)
        run(t, P_TOOLS_STRING, tool_conversation(1, false), one_tool(), false, caps);
    run(t, P_PARALLEL, tool_conversation(2, caps->supports_object_arguments), one_tool(), false,
        caps);
    m = cJSON_CreateArray();
    cJSON_AddItemToArray(m, msg("user", "User message"));
    cJSON *a = msg("assistant", "Assistant message"); /* deeper in the history than the last */
    cJSON_AddStringToObject(a, "reasoning_content", REASONING_PLACEHOLDER);
    cJSON_AddItemToArray(m, a);
    cJSON_AddItemToArray(m, msg("user", "User message"));
    a = msg("assistant", "Assistant message");
    cJSON_AddStringToObject(a, "reasoning_content", "Reasoning content");
    cJSON_AddItemToArray(m, a);
    cJSON_AddItemToArray(m, msg("user", "User message"));
    run(t, P_REASONING, m, NULL, true, caps);
}

cJSON *jinja_caps_to_json(const jinja_caps *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "supports_object_arguments", c->supports_object_arguments);
    cJSON_AddBoolToObject(o, "supports_parallel_tool_calls", c->supports_parallel_tool_calls);
    cJSON_AddBoolToObject(o, "supports_preserve_reasoning", c->supports_preserve_reasoning);
    cJSON_AddBoolToObject(o, "supports_string_content", c->supports_string_content);
    cJSON_AddBoolToObject(o, "supports_system_role", c->supports_system_role);
    cJSON_AddBoolToObject(o, "supports_tool_calls", c->supports_tool_calls);
    cJSON_AddBoolToObject(o, "supports_tools", c->supports_tools);
    cJSON_AddBoolToObject(o, "supports_typed_content", c->supports_typed_content);
    return o;
}
