/* The incremental output parser (out_parser, srv_tools.h): cuts generated
 * text into content, reasoning and tool calls as it arrives, holding back what
 * may still be the start of a marker until the next token decides it, and the
 * harmony (gpt-oss) channel reader. The call formats themselves are parsed in
 * srv_tool_calls.c; split from srv_tools.c to keep files under 800 lines. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_tools_int.h"

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

void out_parser_init(out_parser *p, tool_format fmt, const tool_spec *t, bool think,
                     bool in_think) {
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
            cJSON *args = p->oss_name ? tools_parse_json(s, body) : NULL;
            if (!(cJSON_IsObject(args) &&
                  tools_add_call(p, o, p->oss_name, strlen(p->oss_name), args)))
                emit(p, o, s, body);
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
    const char *const *starts =
        p->fmt != TOOL_FMT_NONE ? tools_start_markers(p->fmt, &n_starts) : NULL;
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
            size_t e = tools_json_extent(t + k, len - k);
            if (!e && !final) break; /* undecided until the value closes */
            if (e && tools_add_calls_json(p, o, t + k, e, true) > 0) {
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
        size_t rl = tools_region_len(p->fmt, bm, best, len - at, final);
        if (rl == 0) { /* the call is not complete: send what precedes it */
            emit(p, o, t, at);
            p->pos += at;
            break;
        }
        if (tools_parse_region(p, o, bm, best, rl) > 0) {
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
    for (const char *x = find_n(prompt, n, topen); x;
         x = find_n(x + 1, n - (size_t)(x + 1 - prompt), topen))
        open = x;
    for (const char *x = find_n(prompt, n, tclose); x;
         x = find_n(x + 1, n - (size_t)(x + 1 - prompt), tclose))
        close = x;
    return open && (!close || open > close);
}
