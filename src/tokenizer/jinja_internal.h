/* jinja_internal: what the pieces of the Jinja interpreter share (jinja.h is
 * the public API): the arena, values, tokens, the syntax tree, the render
 * context, and the helpers between lexer, parser, evaluator and builtins.
 *
 * Memory: a template's tokens and tree live in its arena; every value made
 * while rendering lives in the render's arena and is freed with it, so values
 * are plain pointers without ownership. Errors while rendering longjmp back to
 * jinja_template_render (jx_fail), which frees the arena. */
#ifndef KVLLM_JINJA_INTERNAL_H
#define KVLLM_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja.h"

/* ---- arena ---- */
typedef struct ja_chunk ja_chunk;
typedef struct jarena {
    ja_chunk *head;
    jmp_buf *oom; /* longjmp target when malloc fails or limit is passed (NULL: return NULL) */
    size_t bytes, limit; /* allocated so far; the most allowed (0: no limit) */
} jarena;
void *ja_alloc(jarena *a, size_t n); /* zeroed, 16-aligned */
char *ja_strndup(jarena *a, const char *s, size_t n);
/* A copy of the n first elements (elem bytes each) of p in a new arena block
 * of cap elements: how arena arrays grow (the old block stays till the end). */
void *ja_grow(jarena *a, const void *p, size_t n, size_t cap, size_t elem);
void ja_free_all(jarena *a);

/* ---- growable byte buffer (malloc'd) ---- */
typedef struct jbuf {
    char *p;
    size_t n, cap;
    jarena *arena; /* when set, grows inside the arena (capture buffers) */
} jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_putc(jbuf *b, char c);
void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- values ---- */
typedef enum jv_type {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,  /* sub: JL_LIST, JL_TUPLE, JL_GEN (a generator: map/select results) */
    JV_DICT,  /* sub: JD_DICT, JD_NS (namespace()) */
    JV_LOOP,  /* a for loop's "loop": its attributes are computed when read */
    JV_MACRO, /* a macro or a call block's caller */
    JV_FUNC,  /* a builtin function or a bound method */
} jv_type;

enum { JL_LIST = 0, JL_TUPLE = 1, JL_GEN = 2 };
enum { JD_DICT = 0, JD_NS = 1 };
enum { JVIEW_NONE = 0, JVIEW_ITEMS, JVIEW_KEYS, JVIEW_VALUES };
enum { JU_PLAIN = 0, JU_SECURITY = 1 }; /* undefined: plain, or an unsafe attribute */

typedef struct jv jv;
typedef struct jx jx;         /* render context */
typedef struct jnode jnode;   /* syntax tree node */
typedef struct jscope jscope; /* variable scope */

typedef struct jargs {
    jv **pos;
    int npos;
    const char **kwname;
    jv **kwval;
    int nkw;
} jargs;

typedef jv *(*jfunc_fn)(jx *x, jv *self, jargs *a);

typedef struct jkv {
    jv *key; /* a string */
    jv *val;
} jkv;

struct jv {
    uint8_t type;
    uint8_t sub;
    uint8_t markup; /* strings: a Markup (|safe): '+' escapes the other operand */
    uint8_t grow;   /* strings: s follows a jstr_hdr (made by concatenation, may extend in place) */
    uint8_t view;   /* lists: a dict view, JVIEW_ITEMS/KEYS/VALUES (prints as dict_items([...])) */
    uint8_t used;   /* jx.track: read by the template (jinja_caps.c) */
    uint8_t ops;    /* jx.track: JV_OP_* done on it */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t n;
        } str;
        struct {
            jv **items;
            size_t n, cap;
        } list;
        struct {
            jkv *kv;
            size_t n, cap;
        } dict;
        struct {
            jv **items;  /* the (filtered) items iterated */
            size_t n, i; /* their count, the current index */
        } loop;
        struct {
            const jnode *def; /* S_MACRO or the S_CALLBLOCK (caller) */
            jscope *closure;
        } mac;
        struct {
            jfunc_fn fn;
            jv *self;
            const char *name;
        } fn;
        struct {
            const char *what; /* message printed when used: "'x' is undefined" */
        } undef;
    } u;
};

/* constructors (in the render arena) */
jv *jv_undef(jx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv *jv_none(void);
jv *jv_bool(bool b);
jv *jv_int(jx *x, int64_t i);
jv *jv_float(jx *x, double f);
jv *jv_str(jx *x, const char *s, size_t n); /* copies */
jv *jv_str_nocopy(jx *x, const char *s, size_t n);
jv *jv_cstr(jx *x, const char *s);
jv *jv_list(jx *x, int sub);
void jv_list_push(jx *x, jv *l, jv *v);
jv *jv_dict(jx *x, int sub);
void jv_dict_set(jx *x, jv *d, jv *key, jv *val);
jv *jv_dict_get(jv *d, const char *k, size_t kn); /* NULL when absent */
jv *jv_func(jx *x, jfunc_fn fn, jv *self, const char *name);
jv *jv_from_json(jx *x, const cJSON *j);

const char *jv_type_name(const jv *v); /* Python's: 'str', 'NoneType', 'dict', ... */
bool jv_truthy(const jv *v);
bool jv_equal(const jv *a, const jv *b);
int jv_compare(jx *x, jv *a, jv *b, const char *op); /* <0, 0, >0; TypeError when unordered */
/* str(v) and repr(v) appended to b */
void jv_to_str(jx *x, jbuf *b, const jv *v);
void jv_repr(jx *x, jbuf *b, const jv *v);
jv *jv_stringify(jx *x, jv *v); /* str(v) as a value (v itself if a string) */
/* json.dumps(v, ensure_ascii, indent (NULL: none), separators, sort_keys) */
void jv_tojson(jx *x, jbuf *b, const jv *v, bool ensure_ascii, const char *indent,
               const char *item_sep, const char *key_sep, bool sort_keys);
void jv_float_repr(char *out, size_t cap, double f); /* Python's repr(float) */

/* UTF-8 helpers */
size_t ju_len(const char *s, size_t n);                 /* code points */
size_t ju_offset(const char *s, size_t n, size_t cp);   /* byte offset of code point cp */
uint32_t ju_decode(const char *s, size_t n, size_t *i); /* code point at *i, advances */
void ju_encode(jbuf *b, uint32_t cp);
bool ju_isspace(uint32_t cp); /* Python str.isspace */

/* ---- tokens ---- */
typedef enum jtok_type {
    JT_EOF,
    JT_TEXT,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP,
} jtok_type;

typedef struct jtok {
    jtok_type type;
    int line;
    const char *s; /* text / name / decoded string / operator */
    size_t n;
    int64_t i;
    double f;
} jtok;

/* Splits src into tokens, with trim_blocks, lstrip_blocks, '-' whitespace
 * control, comments dropped and newlines normalised as jinja2's lexer does.
 * Returns false with err set on a lexing error. */
bool jinja_lex(jarena *a, const char *src, size_t n, jtok **toks, size_t *ntoks, char *err,
               size_t err_cap);

/* ---- syntax tree ---- */
typedef enum jnode_kind {
    /* expressions */
    N_LIT,
    N_NAME,
    N_LIST,
    N_TUPLE,
    N_DICT,    /* v1: keys, v2: values */
    N_GETATTR, /* a . name */
    N_GETITEM, /* a [ b ] */
    N_SLICE,   /* a [ b : c : d ] */
    N_CALL,    /* a ( v1 ; names = v2 ) */
    N_FILTER,  /* name ( a , v1 ; names = v2 ) ; a NULL in a filter block */
    N_TEST,    /* a is [not] name ( v1 ) ; op = 1 for not */
    N_BIN,     /* a op b */
    N_UNARY,   /* op a */
    N_COND,    /* a if b else c */
    /* statements */
    S_TEXT,
    S_OUT,
    S_IF,          /* if a: v1 else v2 (elif is an S_IF alone in v2) */
    S_FOR,         /* for names in a [if b]: v1 else v2 */
    S_SET,         /* set names|a-target = b ; block set: v1 (c: filter chain) */
    S_MACRO,       /* macro name(names = v2 defaults): v1 */
    S_CALLBLOCK,   /* call(names = v2) a: v1 */
    S_FILTERBLOCK, /* filter a: v1 */
    S_BREAK,
    S_CONTINUE,
    S_BODY, /* v1 */
} jnode_kind;

enum {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_AND,
    OP_OR,
    OP_NOT,
    OP_NEG,
    OP_POS,
};

struct jnode {
    jnode_kind kind;
    int op;
    int line;
    const char *name; /* NUL-terminated */
    jv *lit;
    jnode *a, *b, *c, *d;
    jnode **v1;
    int n1;
    jnode **v2;
    int n2;
    const char **names; /* keyword names for calls (NULL entry = positional) / targets / params */
    int nnames;
};

struct jinja_template {
    jarena arena;
    jnode *root; /* S_BODY */
};

jnode *jinja_parse(jarena *a, jtok *toks, size_t ntoks, char *err, size_t err_cap);

/* ---- render ---- */
struct jscope {
    jscope *parent;
    const char **names;
    jv **vals;
    int n, cap;
};

/* What a tracked render (jx.track) saw done to a value: indexed or iterated as
 * a list, passed to selectattr. */
enum { JV_OP_ARRAY = 1, JV_OP_SELECTATTR = 2 };
/* jx.track: marks v (deep: its items and values too) as read. */
void jx_mark_used(jx *x, jv *v, bool deep);
/* Renders t with vars and its values tracked (jx.track), then look(ctx, status,
 * x, output or NULL) before the render's memory goes (jinja_caps.c). */
typedef struct jinja_template jinja_template;
void jx_render_tracked(const jinja_template *t, const cJSON *vars,
                       void (*look)(void *ctx, jinja_status st, jx *x, const char *out), void *ctx);
/* "messages" or "tools" of that render as they came in (before the template
 * could rebind them), or NULL. */
jv *jx_global_get(jx *x, const char *name);

struct jx {
    bool track; /* mark the values the template reads (jv.used, jv.ops): jinja_caps.c */
    jv *in_messages, *in_tools; /* track: the variables as they came in (a template may rebind) */
    jarena arena;
    jmp_buf jmp;
    jinja_status status;
    char *err;
    size_t err_cap;
    jbuf *out; /* current output (captures swap it) */
    jscope *globals;
    jinja_date now;
    int depth;      /* macro call depth */
    uint64_t steps; /* loop iterations and calls so far (JX_MAX_STEPS) */
    jv *small_ints; /* 0..JX_SMALL_INTS-1, made on first use (range() lists share them) */
};

/* Bounds on one render, so a hostile template fails instead of running away. */
#define JX_MAX_STEPS  20000000ull
#define JX_MAX_OUTPUT ((size_t)256 << 20)
#define JX_MAX_MEMORY ((size_t)1 << 30)
#define JX_SMALL_INTS 1024
void jx_step(jx *x);

_Noreturn void jx_fail(jx *x, jinja_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails with the undefined value's message (UndefinedError / SecurityError). */
_Noreturn void jx_undef_fail(jx *x, const jv *u);

jv *jx_call(jx *x, jv *callee, jargs *a);
/* jinja_ops.c */
jv *jx_getattr(jx *x, jv *obj, const char *name);
jv *jx_getitem(jx *x, jv *obj, jv *key);
/* The items of an iterable value (list, tuple, dict keys, string chars;
 * undefined: none); TypeError otherwise. */
jv **jx_iter(jx *x, jv *v, size_t *n);
jv *jx_binop(jx *x, int op, jv *a, jv *b);
jv *jx_unop(jx *x, int op, jv *v);                 /* not, -, + */
bool jx_contains(jx *x, jv *hay, jv *needle);      /* needle in hay */
jv *jx_slice(jx *x, jv *obj, jv *a, jv *b, jv *c); /* obj[a:b:c], each may be NULL */

/* builtins: jinja_builtins.c (globals, argument helpers), jinja_filters.c
 * (filters, tests), jinja_methods.c (str/dict/list methods, string helpers) */
jv *jb_filter(jx *x, const char *name, jv *v, jargs *a);
bool jb_test(jx *x, const char *name, jv *v, jargs *a);
bool jb_test_exists(const char *name);
jv *jb_method(jx *x, jv *obj, const char *name); /* a bound method, or NULL */
jv *jb_global(jx *x, const char *name);          /* a global function, or NULL */
jv *jarg(jargs *a, int pos, const char *kw);     /* positional pos or keyword kw; NULL if absent */
bool jb_opt_bool(jargs *a, int pos, const char *kw, bool def); /* truthiness; def if absent */
jv *jb_need_str(jx *x, jv *v, const char *what);               /* v, or a TypeError naming what */
int64_t jb_int_arg(jx *x, jv *v, int64_t def);        /* an int argument; def if absent or None */
bool jb_in_list(const char *const *l, const char *n); /* n in the NULL-ended list l */
jv *jb_percent_format(jx *x, jv *fmt, jv **args, int nargs); /* Python's fmt % args */
/* the string work filters and methods share */
jv *jb_str_strip(jx *x, jv *s, jv *chars, bool left, bool right); /* chars NULL: whitespace */
/* mode 0 lower, 1 upper, 2 str.title(), 3 str.capitalize(), 4 jinja2's title filter */
jv *jb_str_case(jx *x, jv *s, int mode);
bool jb_cp_cased(uint32_t c); /* a code point with an upper or lower case */
jv *jb_str_replace(jx *x, jv *s, jv *old, jv *new, int64_t count);          /* count < 0: all */
const char *jb_memfind(const char *h, size_t hn, const char *n, size_t nn); /* NULL: absent */
jv *jb_dict_items(jx *x, jv *d);                                            /* d.items() */
jv *jb_str_splitlines(jx *x, jv *s);                                        /* s.splitlines() */

/* A string value over a buffer's bytes (not copied). */
static inline jv *jv_buf(jx *x, const jbuf *b) { return jv_str_nocopy(x, b->p ? b->p : "", b->n); }

#endif
