/* chat_template: see chat_template.h. Each render_* function, or the
 * header_family / folded_family entry that drives one, follows its family's
 * official Jinja template line by line; comments quote the parts whose
 * behaviour is easy to get wrong (trimming, where BOS/EOS go). */
#define _GNU_SOURCE
#include "chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "kvl_buf.h"

/* ------------------------------------------------------------- builder -- */

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Jinja's `| trim` and Python's str.strip(): leading and trailing whitespace. */
static void put_trimmed(kvl_buf *b, const char *s) {
    size_t n = strlen(s);
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    kvl_buf_put(b, s, n);
}

/* A message's content, `| trim`med where the template says so. */
static void put_content(kvl_buf *b, const char *s, bool trim) {
    if (trim) put_trimmed(b, s);
    else kvl_buf_puts(b, s);
}

/* ------------------------------------------------------------ families -- */

typedef struct family_info {
    chat_family f;
    const char *name, *bos, *eos;
} family_info;

static const family_info FAMILIES[] = {
    {CHAT_TMPL_CHATML, "chatml", "", "<|im_end|>"},
    {CHAT_TMPL_LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>"},
    {CHAT_TMPL_LLAMA2, "llama2", "<s>", "</s>"},
    {CHAT_TMPL_MISTRAL, "mistral", "<s>", "</s>"},
    {CHAT_TMPL_GEMMA, "gemma", "<bos>", "<eos>"},
    {CHAT_TMPL_DEEPSEEK3, "deepseek3",
     "<\xEF\xBD\x9C"
     "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
     "<\xEF\xBD\x9C"
     "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"},
    {CHAT_TMPL_DEEPSEEK2, "deepseek2",
     "<\xEF\xBD\x9C"
     "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
     "<\xEF\xBD\x9C"
     "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"},
};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

static const family_info *family(chat_family f) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (FAMILIES[i].f == f) return &FAMILIES[i];
    return NULL;
}

const char *chat_family_name(chat_family f) {
    const family_info *fi = family(f);
    return fi ? fi->name : "unknown";
}

chat_family chat_family_from_name(const char *name) {
    for (size_t i = 0; name && i < N_FAMILIES; i++)
        if (strcmp(FAMILIES[i].name, name) == 0) return FAMILIES[i].f;
    return CHAT_TMPL_UNKNOWN;
}

const char *chat_family_bos(chat_family f) {
    const family_info *fi = family(f);
    return fi ? fi->bos : "";
}

const char *chat_family_eos(chat_family f) {
    const family_info *fi = family(f);
    return fi ? fi->eos : "";
}

#define DS_USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>" /* <｜User｜> */
#define DS_ASSISTANT                                                                               \
    "<\xEF\xBD\x9C"                                                                                \
    "Assistant\xEF\xBD\x9C>" /* <｜Assistant｜> */

chat_family chat_template_detect(const char *t) {
    if (!t || !*t) return CHAT_TMPL_FALLBACK;
#define HAS(s) (strstr(t, s) != NULL)
    /* Most specific markers first: DeepSeek-R1 distills of Qwen/Llama carry
     * DeepSeek markers only, and Llama 2 templates also contain [INST]. */
    if (HAS(DS_USER) && HAS(DS_ASSISTANT)) return CHAT_TMPL_DEEPSEEK3;
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) return CHAT_TMPL_LLAMA3;
    if (HAS("<|im_start|>")) return CHAT_TMPL_CHATML;
    if (HAS("<start_of_turn>")) return CHAT_TMPL_GEMMA;
    if (HAS("[INST]")) return HAS("<<SYS>>") ? CHAT_TMPL_LLAMA2 : CHAT_TMPL_MISTRAL;
    if ((HAS("'Assistant: '") || HAS("\"Assistant: \"")) && HAS("User: "))
        return CHAT_TMPL_DEEPSEEK2;
#undef HAS
    return CHAT_TMPL_UNKNOWN;
}

/* -------------------------------------------------------------- render -- */

typedef struct render_ctx {
    const chat_msg *msgs;
    int n;
    const char *bos, *eos;
    bool add_gen;
    kvl_buf *out;
    kvl_error *err;
} render_ctx;

static bool role_is(const chat_msg *m, const char *role) {
    if (strcmp(role, "system") == 0 && strcmp(m->role, "developer") == 0) return true;
    return strcmp(m->role, role) == 0;
}

/* The official Llama 2 / Mistral / Gemma templates raise_exception unless the
 * messages after an optional leading system message go user, assistant, user... */
static bool check_alternation(const render_ctx *c, int first) {
    for (int i = first; i < c->n; i++) {
        bool want_user = (i - first) % 2 == 0;
        if (role_is(&c->msgs[i], want_user ? "user" : "assistant")) continue;
        if (role_is(&c->msgs[i], "system"))
            return kvl_fail(c->err, "chat template: a system message is only allowed first");
        if (!role_is(&c->msgs[i], "user") && !role_is(&c->msgs[i], "assistant"))
            return kvl_fail(c->err,
                            "chat template: role '%s' is not supported (user, assistant, system)",
                            c->msgs[i].role);
        return kvl_fail(c->err,
                        "chat template: conversation roles must alternate "
                        "user/assistant/user/assistant/... (message %d)",
                        i);
    }
    return true;
}

/* The index of the first turn, after an optional leading system message (0 or
 * 1), once the turns are checked to alternate; -1 with c->err when not. */
static int first_turn(const render_ctx *c) {
    int first = c->n > 0 && role_is(&c->msgs[0], "system") ? 1 : 0;
    return check_alternation(c, first) ? first : -1;
}

/* Mistral and Gemma fold the system message into the first turn: before that
 * turn's content (turn i), SYSTEM + '\n\n'. */
static void put_folded_system(const render_ctx *c, int i, int first) {
    if (i == first && first == 1) {
        kvl_buf_puts(c->out, c->msgs[0].content);
        kvl_buf_puts(c->out, "\n\n");
    }
}

static const char *role_name(const chat_msg *m) {
    return strcmp(m->role, "developer") == 0 ? "system" : m->role;
}

/* ChatML and Llama 3 write the role itself into the prompt: only a role the
 * family knows may go there, never a client's text (a forged turn). */
static bool check_named_roles(const render_ctx *c) {
    static const char *const known[] = {"system",    "developer", "user",
                                        "assistant", "tool",      "ipython"};
    for (int i = 0; i < c->n; i++) {
        bool ok = false;
        for (size_t k = 0; !ok && k < sizeof known / sizeof known[0]; k++)
            ok = strcmp(c->msgs[i].role, known[k]) == 0;
        if (!ok)
            return kvl_fail(
                c->err,
                "chat template: message %d: role '%.64s' is not supported (system, developer, "
                "user, assistant, tool, ipython)",
                i, c->msgs[i].role);
    }
    return true;
}

/* ChatML and Llama 3 open each turn with a header that names the role:
 * PRE + role + MID, then content + POST; the generation prompt is the header of
 * an assistant turn. */
typedef struct header_family {
    const char *pre, *mid, *post;
    bool trim; /* content | trim */
    bool bos;  /* bos_token before the first message */
} header_family;

/* {% for m %}'<|im_start|>' + role + '\n' + content + '<|im_end|>\n'{% endfor %} */
static const header_family CHATML = {.pre = "<|im_start|>", .mid = "\n", .post = "<|im_end|>\n"};

/* bos_token before the first message; content | trim. */
static const header_family LLAMA3 = {.pre = "<|start_header_id|>",
                                     .mid = "<|end_header_id|>\n\n",
                                     .post = "<|eot_id|>",
                                     .trim = true,
                                     .bos = true};

static void put_header(render_ctx *c, const header_family *fam, const char *role) {
    kvl_buf_puts(c->out, fam->pre);
    kvl_buf_puts(c->out, role);
    kvl_buf_puts(c->out, fam->mid);
}

static bool render_headed(render_ctx *c, const header_family *fam) {
    if (!check_named_roles(c)) return false;
    for (int i = 0; i < c->n; i++) {
        if (i == 0 && fam->bos) kvl_buf_puts(c->out, c->bos);
        put_header(c, fam, role_name(&c->msgs[i]));
        put_content(c->out, c->msgs[i].content, fam->trim);
        kvl_buf_puts(c->out, fam->post);
    }
    if (c->add_gen) put_header(c, fam, "assistant");
    return true;
}

/* Llama-2-chat: the system prompt joins the first user message inside <<SYS>>,
 * every user turn starts with bos_token + '[INST] ', content.strip() (after the
 * <<SYS>> block is prepended), assistant turns are ' ' + strip + ' ' + eos. */
static bool render_llama2(render_ctx *c) {
    int first = first_turn(c);
    if (first < 0) return false;
    for (int i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        kvl_buf content = {0};
        if (i == first && first == 1) {
            kvl_buf_puts(&content, "<<SYS>>\n");
            kvl_buf_puts(&content, c->msgs[0].content);
            kvl_buf_puts(&content, "\n<</SYS>>\n\n");
        }
        kvl_buf_puts(&content, m->content);
        if (content.oom) c->out->oom = true;
        bool user = role_is(m, "user");
        kvl_buf_puts(c->out, user ? c->bos : " ");
        if (user) kvl_buf_puts(c->out, "[INST] ");
        put_trimmed(c->out, content.p ? content.p : "");
        kvl_buf_puts(c->out, user ? " [/INST]" : " ");
        if (!user) kvl_buf_puts(c->out, c->eos);
        free(content.p);
    }
    return true;
}

/* Mistral and Gemma write bos_token once, then the alternating turns, each
 * PRE + content + POST by role, with the system message folded into the first
 * turn (put_folded_system, between PRE and content). */
typedef struct folded_family {
    const char *user_pre, *user_post;
    const char *assistant_pre, *assistant_post; /* NULL post: eos_token */
    bool trim;                                  /* content | trim */
    const char *gen;                            /* generation prompt, or NULL */
} folded_family;

/* Mistral-7B-Instruct v0.1/v0.2: '[INST] ' + content + ' [/INST]', assistant
 * content + eos_token, nothing trimmed. The official template rejects a system
 * message; like Mistral's later templates we fold it into the first user turn
 * as SYSTEM + '\n\n' + USER. */
static const folded_family MISTRAL = {
    .user_pre = "[INST] ", .user_post = " [/INST]", .assistant_pre = "", .assistant_post = NULL};

/* Gemma 3: the system message becomes a prefix (SYSTEM + '\n\n') of the first
 * turn, assistant is called 'model', content | trim. */
static const folded_family GEMMA = {.user_pre = "<start_of_turn>user\n",
                                    .user_post = "<end_of_turn>\n",
                                    .assistant_pre = "<start_of_turn>model\n",
                                    .assistant_post = "<end_of_turn>\n",
                                    .trim = true,
                                    .gen = "<start_of_turn>model\n"};

static bool render_folded(render_ctx *c, const folded_family *fam) {
    int first = first_turn(c);
    if (first < 0) return false;
    kvl_buf_puts(c->out, c->bos);
    for (int i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        bool user = role_is(m, "user");
        kvl_buf_puts(c->out, user ? fam->user_pre : fam->assistant_pre);
        put_folded_system(c, i, first);
        put_content(c->out, m->content, fam->trim);
        const char *post = user ? fam->user_post : fam->assistant_post;
        kvl_buf_puts(c->out, post ? post : c->eos);
    }
    if (c->add_gen && fam->gen) kvl_buf_puts(c->out, fam->gen);
    return true;
}

static bool check_roles(const render_ctx *c) {
    for (int i = 0; i < c->n; i++)
        if (!role_is(&c->msgs[i], "system") && !role_is(&c->msgs[i], "user") &&
            !role_is(&c->msgs[i], "assistant"))
            return kvl_fail(c->err,
                            "chat template: role '%s' is not supported (user, assistant, system)",
                            c->msgs[i].role);
    return true;
}

/* DeepSeek V3: bos_token, then all system prompts joined by '\n\n', then
 * '<｜User｜>' + content and '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'. */
static bool render_deepseek3(render_ctx *c) {
    if (!check_roles(c)) return false;
    kvl_buf_puts(c->out, c->bos);
    bool first_sp = true;
    for (int i = 0; i < c->n; i++) {
        if (!role_is(&c->msgs[i], "system")) continue;
        if (!first_sp) kvl_buf_puts(c->out, "\n\n");
        kvl_buf_puts(c->out, c->msgs[i].content);
        first_sp = false;
    }
    for (int i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (role_is(m, "system")) continue;
        bool user = role_is(m, "user");
        kvl_buf_puts(c->out, user ? DS_USER : DS_ASSISTANT);
        kvl_buf_puts(c->out, m->content);
        if (!user) kvl_buf_puts(c->out, c->eos);
    }
    if (c->add_gen) kvl_buf_puts(c->out, DS_ASSISTANT);
    return true;
}

/* DeepSeek LLM / V2: 'User: ' + content + '\n\n', 'Assistant: ' + content +
 * eos_token, system content + '\n\n', generation prompt 'Assistant:'. */
static bool render_deepseek2(render_ctx *c) {
    if (!check_roles(c)) return false;
    kvl_buf_puts(c->out, c->bos);
    for (int i = 0; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (role_is(m, "user")) {
            kvl_buf_puts(c->out, "User: ");
            kvl_buf_puts(c->out, m->content);
            kvl_buf_puts(c->out, "\n\n");
        } else if (role_is(m, "assistant")) {
            kvl_buf_puts(c->out, "Assistant: ");
            kvl_buf_puts(c->out, m->content);
            kvl_buf_puts(c->out, c->eos);
        } else {
            kvl_buf_puts(c->out, m->content);
            kvl_buf_puts(c->out, "\n\n");
        }
    }
    if (c->add_gen) kvl_buf_puts(c->out, "Assistant:");
    return true;
}

static bool render_family(chat_family f, render_ctx *c) {
    switch (f) {
    case CHAT_TMPL_CHATML: return render_headed(c, &CHATML);
    case CHAT_TMPL_LLAMA3: return render_headed(c, &LLAMA3);
    case CHAT_TMPL_LLAMA2: return render_llama2(c);
    case CHAT_TMPL_MISTRAL: return render_folded(c, &MISTRAL);
    case CHAT_TMPL_GEMMA: return render_folded(c, &GEMMA);
    case CHAT_TMPL_DEEPSEEK3: return render_deepseek3(c);
    case CHAT_TMPL_DEEPSEEK2: return render_deepseek2(c);
    default:
        return kvl_fail(c->err,
                        "unsupported chat template: the model's tokenizer.chat_template matches "
                        "none of the known families (chatml, llama3, llama2, mistral, gemma, "
                        "deepseek3, deepseek2); send a formatted prompt to /v1/completions or "
                        "start the server with --chat-template NAME");
    }
}

int64_t chat_template_render(chat_family f, const char *bos, const char *eos, const chat_msg *msgs,
                             int n, bool add_generation_prompt, char **out, kvl_error *err) {
    *out = NULL;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) {
            kvl_fail(err, "chat template: message %d has no role or content", i);
            return -1;
        }
    kvl_buf b = {0};
    render_ctx c = {.msgs = msgs,
                    .n = n,
                    .bos = bos ? bos : chat_family_bos(f),
                    .eos = eos ? eos : chat_family_eos(f),
                    .add_gen = add_generation_prompt,
                    .out = &b,
                    .err = err};
    bool ok = render_family(f, &c);
    kvl_buf_puts(&b, ""); /* an empty rendering is still a string */
    if (ok && b.oom) ok = kvl_fail(err, "chat template: out of memory");
    if (!ok) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    return (int64_t)b.len;
}

int64_t chat_template_apply(const char *tmpl_src, const chat_msg *msgs, int n,
                            bool add_generation_prompt, char **out, kvl_error *err) {
    return chat_template_render(chat_template_detect(tmpl_src), NULL, NULL, msgs, n,
                                add_generation_prompt, out, err);
}
