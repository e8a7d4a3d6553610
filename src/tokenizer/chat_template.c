/* chat_template: see chat_template.h. Each render_* function follows its
 * family's official Jinja template line by line; comments quote the parts
 * whose behaviour is easy to get wrong (trimming, where BOS/EOS go). */
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

/* {% for m %}'<|im_start|>' + role + '\n' + content + '<|im_end|>\n'{% endfor %} */
static bool render_chatml(render_ctx *c) {
    if (!check_named_roles(c)) return false;
    for (int i = 0; i < c->n; i++) {
        kvl_buf_puts(c->out, "<|im_start|>");
        kvl_buf_puts(c->out, role_name(&c->msgs[i]));
        kvl_buf_puts(c->out, "\n");
        kvl_buf_puts(c->out, c->msgs[i].content);
        kvl_buf_puts(c->out, "<|im_end|>\n");
    }
    if (c->add_gen) kvl_buf_puts(c->out, "<|im_start|>assistant\n");
    return true;
}

/* bos_token before the first message; content | trim. */
static bool render_llama3(render_ctx *c) {
    if (!check_named_roles(c)) return false;
    for (int i = 0; i < c->n; i++) {
        if (i == 0) kvl_buf_puts(c->out, c->bos);
        kvl_buf_puts(c->out, "<|start_header_id|>");
        kvl_buf_puts(c->out, role_name(&c->msgs[i]));
        kvl_buf_puts(c->out, "<|end_header_id|>\n\n");
        put_trimmed(c->out, c->msgs[i].content);
        kvl_buf_puts(c->out, "<|eot_id|>");
    }
    if (c->add_gen) kvl_buf_puts(c->out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
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

/* Mistral-7B-Instruct v0.1/v0.2: bos_token once, '[INST] ' + content + ' [/INST]',
 * assistant content + eos_token, nothing trimmed. The official template rejects a
 * system message; like Mistral's later templates we fold it into the first user
 * turn as SYSTEM + '\n\n' + USER. */
static bool render_mistral(render_ctx *c) {
    int first = first_turn(c);
    if (first < 0) return false;
    kvl_buf_puts(c->out, c->bos);
    for (int i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        if (role_is(m, "user")) {
            kvl_buf_puts(c->out, "[INST] ");
            put_folded_system(c, i, first);
            kvl_buf_puts(c->out, m->content);
            kvl_buf_puts(c->out, " [/INST]");
        } else {
            kvl_buf_puts(c->out, m->content);
            kvl_buf_puts(c->out, c->eos);
        }
    }
    return true;
}

/* Gemma 3: bos_token, the system message becomes a prefix (SYSTEM + '\n\n') of
 * the first turn, assistant is called 'model', content | trim. */
static bool render_gemma(render_ctx *c) {
    int first = first_turn(c);
    if (first < 0) return false;
    kvl_buf_puts(c->out, c->bos);
    for (int i = first; i < c->n; i++) {
        const chat_msg *m = &c->msgs[i];
        kvl_buf_puts(c->out, "<start_of_turn>");
        kvl_buf_puts(c->out, role_is(m, "user") ? "user\n" : "model\n");
        put_folded_system(c, i, first);
        put_trimmed(c->out, m->content);
        kvl_buf_puts(c->out, "<end_of_turn>\n");
    }
    if (c->add_gen) kvl_buf_puts(c->out, "<start_of_turn>model\n");
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
    case CHAT_TMPL_CHATML: return render_chatml(c);
    case CHAT_TMPL_LLAMA3: return render_llama3(c);
    case CHAT_TMPL_LLAMA2: return render_llama2(c);
    case CHAT_TMPL_MISTRAL: return render_mistral(c);
    case CHAT_TMPL_GEMMA: return render_gemma(c);
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
