/* srv_tools_int.h: what the three tool-calling files share and nothing else
 * needs (srv_tools.c writes calls, srv_tool_calls.c reads them per format,
 * srv_tool_stream.c finds them in a stream): the formats' marker spellings and
 * the call-region functions the stream parser drives, and srv_tool_gemma.c's
 * Gemma 4 value syntax. Private to src/server. */
#ifndef KVLLM_SRV_TOOLS_INT_H
#define KVLLM_SRV_TOOLS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "srv_tools.h"

/* DeepSeek V4's markup prefix, "<｜DSML｜" */
#define DSML_BARE                                                                                  \
    "\xef\xbd\x9c"                                                                                 \
    "DSML\xef\xbd\x9c"
#define DSML "<" DSML_BARE

/* DeepSeek V3.1 / R1 call markup */
#define DS_CALLS_BEGIN                                                                             \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "calls\xe2\x96\x81"                                                                            \
    "begin\xef\xbd\x9c>"
#define DS_CALLS_END                                                                               \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "calls\xe2\x96\x81"                                                                            \
    "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN                                                                              \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "call\xe2\x96\x81"                                                                             \
    "begin\xef\xbd\x9c>"
#define DS_CALL_END                                                                                \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "call\xe2\x96\x81"                                                                             \
    "end\xef\xbd\x9c>"
#define DS_SEP                                                                                     \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "sep\xef\xbd\x9c>"

static inline bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static inline const char *find_n(const char *s, size_t n, const char *m) {
    return memmem(s, n, m, strlen(m));
}

/* ---- srv_tool_calls.c ---- */

/* Adds one call (name[0..name_len), arguments object args, NULL: {}) to o,
 * unless parallel_tool_calls is false and one was found already. */
bool tools_add_call(out_parser *p, parse_out *o, const char *name, size_t name_len,
                    const cJSON *args);
/* End of the JSON object or array at s[0..n) (just after its closing bracket);
 * 0 while it is incomplete. Brackets inside strings do not count. */
size_t tools_json_extent(const char *s, size_t n);
/* The JSON value that is the whole of s[0..n) (whitespace around it
 * allowed); NULL if it is not one. */
cJSON *tools_parse_json(const char *s, size_t n);
/* A JSON text of one call object or an array of them. Returns calls added. */
int tools_add_calls_json(out_parser *p, parse_out *o, const char *s, size_t n, bool need_known);
/* The markers that open a call region in format f (*n of them). */
const char *const *tools_start_markers(tool_format f, int *n);
/* Length of the call region that starts at s (with marker m), 0 while
 * incomplete. final: the output ended, so an unclosed region runs to the end. */
size_t tools_region_len(tool_format f, const char *m, const char *s, size_t n, bool final);
/* Parses one region into calls; returns how many it held. */
int tools_parse_region(out_parser *p, parse_out *o, const char *m, const char *s, size_t n);

/* ---- srv_tools.c ---- */

/* s as a GBNF string literal, appended to out. */
void tools_gbnf_literal(kvl_buf *out, const char *s);

/* ---- srv_tool_gemma.c: Gemma 4's values ({key:<|"|>text<|"|>,n:1}) ---- */

/* The call region s[0..n) (<|tool_call>call:NAME{...}[<tool_call|>]) added to
 * o; returns 1, or 0 if it is not one well-formed call. */
int tools_gemma_call(out_parser *p, parse_out *o, const char *s, size_t n);
/* The arguments JSON json as Gemma's template writes them (text that is not a
 * JSON object is appended as it is). */
void tools_gemma_write(const char *json, kvl_buf *out);
/* A schema_rules_fn: the arguments' grammar in Gemma's syntax. */
bool tools_gemma_rules(const char *schema_json, const char *prefix, kvl_buf *out, char *err,
                       size_t err_cap);

#endif
