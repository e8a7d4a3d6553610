/* jinja: a Jinja2 interpreter for chat templates, rendering them as Hugging
 * Face transformers' apply_chat_template does: jinja2's ImmutableSandbox-
 * Environment with trim_blocks and lstrip_blocks, loop controls, the default
 * Undefined, autoescape off, and transformers' globals and filters
 * (raise_exception, strftime_now, tojson with ensure_ascii=False).
 *
 * Values follow Python: the variables come in as JSON (cJSON), print with
 * str() ('None', 'True', "{'a': 1}"), compare and combine as Python would, and
 * fail where Python or jinja2 fails ('str + list', iterating None, attribute of
 * an undefined value, a list's append in the sandbox).
 *
 * The language covered is what chat templates use: output, if/elif/else,
 * for (loop.*, else, an if filter, unpacking, break/continue), set (targets,
 * namespace attributes, block set), macro and call blocks, filter blocks,
 * generation blocks, comments, whitespace control, and the expression grammar
 * of jinja2 (literals, lists, dicts, tuples, slices, attributes, subscripts,
 * calls with keyword arguments, filters, tests, in, ~, arithmetic, comparison,
 * and/or/not, inline if). */
#ifndef KVLLM_JINJA_H
#define KVLLM_JINJA_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

typedef struct jinja_template jinja_template; /* opaque; immutable once created */

typedef enum jinja_status {
    JINJA_OK = 0,
    JINJA_ERR_SYNTAX,  /* the template does not parse */
    JINJA_ERR_RAISED,  /* the template called raise_exception(msg): err is msg */
    JINJA_ERR_RUNTIME, /* rendering failed as jinja2 would (TypeError, UndefinedError, ...) */
    JINJA_ERR_NOMEM,
} jinja_status;

/* Compiles src (n bytes, UTF-8). Returns NULL on failure with the reason
 * (line number and what was expected) in err. */
jinja_template *jinja_template_create(const char *src, size_t n, char *err, size_t err_cap);
void jinja_template_destroy(jinja_template *t);

/* Date strftime_now() formats (local midnight of that day). */
typedef struct jinja_date {
    int year, month, day; /* e.g. 2024, 7, 26 */
} jinja_date;

/* Renders t with the variables of vars (a JSON object: messages, tools,
 * add_generation_prompt, bos_token, ... as the caller passes them; JSON null is
 * Python None). now: the date strftime_now uses (NULL: today).
 * On JINJA_OK *out is a malloc'd NUL-terminated string of *out_len bytes
 * (caller frees); otherwise *out is NULL and err says why (for
 * JINJA_ERR_RAISED, exactly the template's message). */
jinja_status jinja_template_render(const jinja_template *t, const cJSON *vars,
                                   const jinja_date *now, char **out, size_t *out_len, char *err,
                                   size_t err_cap);

const char *jinja_status_name(jinja_status s);

/* What t can do, as llama.cpp's chat templates report it (llama-server's
 * /props chat_template_caps): found by rendering probe conversations and
 * seeing which of their values t reads (jinja_caps.c). */
typedef struct jinja_caps {
    bool supports_tools;               /* reads the tools' function names */
    bool supports_tool_calls;          /* reads an assistant's tool_calls */
    bool supports_system_role;         /* reads a system message's content */
    bool supports_parallel_tool_calls; /* reads a second call of one turn */
    bool supports_preserve_reasoning;  /* prints an earlier turn's reasoning_content */
    bool supports_string_content;      /* renders a message whose content is a string */
    bool supports_typed_content;       /* indexes or iterates a message's content */
    bool supports_object_arguments;    /* reads a call's arguments as an object */
} jinja_caps;
void jinja_template_caps(const jinja_template *t, jinja_caps *caps);
/* The caps as llama-server's JSON object (its member names, sorted). */
cJSON *jinja_caps_to_json(const jinja_caps *caps);

/* cJSON keeps no difference between 1 and 1.0, which Python prints apart.
 * jinja_json_parse parses n bytes of JSON with cJSON and marks the numbers
 * written with a fraction or an exponent with this bit of their type (which
 * cJSON's own checks mask off), so they render as floats ('1.0'); unmarked
 * integral numbers render as ints. Returns NULL when the text is not JSON
 * (*err_at, if given: where parsing stopped). */
#define JINJA_CJSON_FLOAT (1 << 14)
cJSON *jinja_json_parse(const char *s, size_t n, const char **err_at);

#endif
