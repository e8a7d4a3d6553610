/* BPE pre-tokenization, reproducing llama.cpp's unicode_regex_split (see
 * tok_pretok.h). The regex strings are llama.cpp's, per pre-tokenizer name. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok_pretok.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tok_unicode.h"

/* ---------------------------------------------------------------- regex sets */

/* These two strings select the hand-written splitters (as in llama.cpp, where
 * they are matched by exact text). */
#define RX_GPT2         "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_LLAMA3                                                                                  \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"   \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                   \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const char *const SET_DEFAULT[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+",
                                          "[0-9][0-9][0-9]", NULL};
static const char *const SET_GPT2[] = {RX_GPT2, NULL};
static const char *const SET_LLAMA3[] = {RX_LLAMA3, NULL};
/* llama.cpp's trigger for its hand-written Kimi K2 split (split_kimi_k2) */
#define RX_KIMI_K2 "\\p{Han}+"
static const char *const SET_KIMI_K2[] = {RX_KIMI_K2, NULL};
static const char *const SET_QWEN2[] = {RX_QWEN2, NULL};
static const char *const SET_QWEN35[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"
                    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const SET_FALCON[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]",
                                         NULL};
static const char *const SET_STARCODER[] = {"\\p{N}", RX_GPT2, NULL};
static const char *const SET_DEEPSEEK_CODER[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}", NULL};
/* Unicode ranges on long lines, as the tokenizer defines them */
// clang-format off
static const char *const SET_DEEPSEEK_LLM[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-"
    "ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-"
    "ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻"
    "𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
    NULL};
// clang-format on
static const char *const SET_DEEPSEEK3[] = {
    "\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
    "\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const SET_PORO[] = {" ?[^(\\s|.,!?…。，、।۔،)]+", NULL};
static const char *const SET_TEKKEN[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?"
    "((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const SET_GPT4O[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RX_CONTRACTIONS
    "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RX_CONTRACTIONS
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const SET_SEED_CODER[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const SET_BAILINGMOE[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const SET_MINICPM5[] = {
    "\\p{N}{1,3}",
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const SET_UFAKZEKA[] = {
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
    "\\s+",
    NULL};

/* Gemma 4 cuts only at newlines: the merges run over whole lines, spaces
 * (as U+2581) included. */
static const char *const SET_GEMMA4[] = {"[^\\n]+|[\\n]+", NULL};

/* Pre-tokenizer names (tokenizer.ggml.pre) as llama.cpp maps them. */
typedef struct pre_def {
    const char *names; /* '|'-separated */
    const char *const *set;
    tok_pre_info info; /* {0}: none of llama.cpp's overrides */
} pre_def;

static const pre_def PRE_DEFS[] = {
    {"default", SET_DEFAULT, {0}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano",
     SET_LLAMA3,
     {.ignore_merges = true, .add_bos = true}},
    {"dbrx|smaug-bpe", SET_LLAMA3, {0}},
    {"glm4|chatglm-bpe", SET_LLAMA3, {.no_bos = true}},
    {"deepseek-llm", SET_DEEPSEEK_LLM, {0}},
    {"deepseek-coder", SET_DEEPSEEK_CODER, {0}},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", SET_DEEPSEEK3, {0}},
    {"falcon", SET_FALCON, {0}},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|"
     "jina-v1-en|jina-v2-code|roberta-bpe|exaone4|mpt|olmo|jais|trillion|granite-docling",
     SET_GPT2,
     {0}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", SET_STARCODER, {0}},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2",
     SET_QWEN2,
     {0}},
    {"qwen35", SET_QWEN35, {0}},
    {"poro-chat|bloom|gpt3-finnish", SET_PORO, {0}},
    {"tekken", SET_TEKKEN, {.ignore_merges = true, .add_bos = true}},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", SET_GPT4O, {0}},
    {"seed-coder", SET_SEED_CODER, {0}},
    {"bailingmoe|bailingmoe2|llada-moe", SET_BAILINGMOE, {0}},
    {"minicpm5", SET_MINICPM5, {.ignore_merges = true}},
    {"ufakzeka", SET_UFAKZEKA, {0}},
    {"kimi-k2", SET_KIMI_K2, {0}},
    {"gemma4|granite-embed-multi-311m",
     SET_GEMMA4,
     {.spm_pieces = true, .newline_words = true, .force_bos = true}},
};

static bool name_in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

static const pre_def *find_pre(const char *name) {
    for (size_t i = 0; i < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; i++) {
        if (name_in_list(PRE_DEFS[i].names, name)) return &PRE_DEFS[i];
    }
    return NULL;
}

/* ---------------------------------------------------------------- compiled form */

enum rx_kind {
    RX_KIND_GPT2,
    RX_KIND_LLAMA3,
    RX_KIND_KIMI_K2,
    RX_KIND_COLLAPSED,
    RX_KIND_CODEPOINTS
};

typedef struct tok_rx {
    int kind;
    pcre2_code *code; /* NULL for the hand-written splitters */
} tok_rx;

#define MAX_RX 8

struct tok_pretok {
    int n_rx;
    tok_rx rx[MAX_RX];
    bool need_collapse;
};

bool tok_szvec_push(tok_szvec *a, size_t x) {
    if (!kvl_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v, 64)) return false;
    a->v[a->n++] = x;
    return true;
}

/* The \p{..} classes llama.cpp understands, and the byte each class collapses to
 * together with the ASCII members it keeps (codepoints < 128 are not collapsed). */
typedef struct ucat {
    const char *name;
    char byte;
    const char *ascii;
} ucat;

static const ucat UCATS[] = {
    {"\\p{N}", '\xD1', "0-9"},
    {"\\p{L}", '\xD2', "A-Za-z"},
    {"\\p{P}", '\xD3', "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", '\xD4', ""},
    {"\\p{S}", '\xD5', "\\$\\+<->^`\\|"},
    {"\\p{Lu}", '\xD2', "A-Za-z"},
    {"\\p{Ll}", '\xD2', "A-Za-z"},
    {"\\p{Lt}", '\xD2', "A-Za-z"},
    {"\\p{Lm}", '\xD2', "A-Za-z"},
    {"\\p{Lo}", '\xD2', "A-Za-z"},
};
#define N_UCATS (sizeof UCATS / sizeof UCATS[0])

static bool uses_ucat(const char *rx) {
    for (size_t i = 0; i < N_UCATS; i++) {
        if (strstr(rx, UCATS[i].name)) return true;
    }
    return false;
}

/* The class named by the \p{..} at rx[i] (closing brace within 10 bytes), or NULL. */
static const ucat *ucat_at(const char *rx, size_t i, size_t len, size_t *close) {
    if (!(rx[i] == '\\' && i + 3 < len && rx[i + 1] == 'p' && rx[i + 2] == '{')) return NULL;
    const char *c = memchr(rx + i + 3, '}', len - (i + 3));
    if (!c || (size_t)(c - rx) > i + 10) return NULL;
    size_t n = (size_t)(c - rx) - i + 1;
    for (size_t k = 0; k < N_UCATS; k++) {
        if (strlen(UCATS[k].name) == n && memcmp(UCATS[k].name, rx + i, n) == 0) {
            *close = (size_t)(c - rx);
            return &UCATS[k];
        }
    }
    return NULL;
}

/* Rewrites each \p{..} as the collapsed byte plus its ASCII members, bracketed
 * unless already inside a class: the same rewrite llama.cpp applies. Returns a
 * malloc'd pattern (not NUL-terminated: bytes 0xD1.. are data) and its length. */
static char *collapse_regex(const char *rx, size_t *out_len) {
    size_t len = strlen(rx);
    char *out = malloc(len * 16 + 1);
    if (!out) return NULL;
    size_t o = 0;
    bool inside = false;
    for (size_t i = 0; i < len; i++) {
        size_t close;
        const ucat *u;
        if (rx[i] == '[' && (i == 0 || rx[i - 1] != '\\')) {
            out[o++] = '[';
            inside = true;
        } else if (inside && rx[i] == ']' && rx[i - 1] != '\\') {
            out[o++] = ']';
            inside = false;
        } else if ((u = ucat_at(rx, i, len, &close)) != NULL) {
            if (!inside) out[o++] = '[';
            out[o++] = u->byte;
            memcpy(out + o, u->ascii, strlen(u->ascii));
            o += strlen(u->ascii);
            if (!inside) out[o++] = ']';
            i = close;
        } else {
            out[o++] = rx[i];
        }
    }
    *out_len = o;
    return out;
}

static bool compile_rx(tok_rx *r, const char *rx, kvl_error *err) {
    if (strcmp(rx, RX_GPT2) == 0) {
        r->kind = RX_KIND_GPT2;
        return true;
    }
    if (strcmp(rx, RX_LLAMA3) == 0) {
        r->kind = RX_KIND_LLAMA3;
        return true;
    }
    if (strcmp(rx, RX_KIMI_K2) == 0) {
        r->kind = RX_KIND_KIMI_K2;
        return true;
    }
    /* ECMAScript $ matches only at the very end: DOLLAR_ENDONLY. No UCP: classes
     * such as \s stay ASCII, as in std::regex (other whitespace is mapped to \v). */
    uint32_t opts = PCRE2_DOLLAR_ENDONLY | PCRE2_NO_AUTO_CAPTURE;
    char *pat = NULL;
    size_t pat_len = strlen(rx);
    if (uses_ucat(rx)) {
        r->kind = RX_KIND_COLLAPSED;
        pat = collapse_regex(rx, &pat_len);
        if (!pat) return kvl_fail(err, "tokenizer: out of memory compiling a regex");
    } else {
        r->kind = RX_KIND_CODEPOINTS;
        opts |= PCRE2_UTF;
    }
    int ec;
    PCRE2_SIZE eo;
    r->code = pcre2_compile((PCRE2_SPTR)(pat ? pat : rx), pat_len, opts, &ec, &eo, NULL);
    free(pat);
    if (!r->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return kvl_fail(err, "tokenizer: pre-tokenizer regex does not compile at %zu: %s",
                        (size_t)eo, (const char *)msg);
    }
#ifndef KVLLM_TOK_NO_JIT /* valgrind cannot follow JIT code: build with this for memcheck runs */
    pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE); /* optional: the interpreter is the fallback */
#endif
    return true;
}

tok_pretok *tok_pretok_create(const char *pre_name, tok_pre_info *info, kvl_error *err) {
    const pre_def *d = find_pre(pre_name);
    if (!d) {
        kvl_fail(err, "tokenizer: unknown pre-tokenizer type '%s' (tokenizer.ggml.pre)", pre_name);
        return NULL;
    }
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) {
        kvl_fail(err, "tokenizer: out of memory");
        return NULL;
    }
    for (const char *const *rx = d->set; *rx && p->n_rx < MAX_RX; rx++) {
        if (!compile_rx(&p->rx[p->n_rx], *rx, err)) {
            tok_pretok_destroy(p);
            return NULL;
        }
        p->need_collapse |= p->rx[p->n_rx].kind == RX_KIND_COLLAPSED;
        p->n_rx++;
    }
    *info = d->info;
    return p;
}

void tok_pretok_destroy(tok_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_rx; i++) pcre2_code_free(p->rx[i].code);
    free(p);
}

/* ---------------------------------------------------------------- splitting */

/* One piece being split: codepoints [ini, end) of the text. Positions outside
 * read as "no codepoint" (class 0), which is how llama.cpp's splitters see the
 * piece boundaries. */
typedef struct span {
    const uint32_t *cpts;
    size_t ini, end;
    size_t prev_end; /* where the next emitted word starts */
    tok_szvec *out;
    bool ok;
} span;

#define OUT_OF_RANGE 0xFFFFFFFFu

static uint32_t sp_cpt(const span *s, size_t pos) {
    return pos >= s->ini && pos < s->end ? s->cpts[pos] : OUT_OF_RANGE;
}

static uint16_t sp_flags(const span *s, size_t pos) {
    return pos >= s->ini && pos < s->end ? tok_uflags(s->cpts[pos]) : 0;
}

/* Ends the current word at pos (empty words are dropped). */
static void sp_emit(span *s, size_t pos) {
    if (pos > s->prev_end) s->ok &= tok_szvec_push(s->out, pos - s->prev_end);
    s->prev_end = pos;
}

static uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Length of a contraction ('s 't 'm 'd 're 've 'll) at pos, or 0. The Llama-3
 * pattern is case-insensitive here; no non-ASCII codepoint lowercases to these
 * letters, so ASCII folding is exact. */
static size_t contraction_len(const span *s, size_t pos, bool fold) {
    if (sp_cpt(s, pos) != '\'' || pos + 1 >= s->end) return 0;
    uint32_t a = sp_cpt(s, pos + 1);
    if (fold) a = ascii_lower(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= s->end) return 0;
    uint32_t b = sp_cpt(s, pos + 2);
    if (fold) b = ascii_lower(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

#define WLN (TOK_UF_WHITESPACE | TOK_UF_LETTER | TOK_UF_NUMBER)

/* Whitespace run at pos: \s+(?!\S) leaves the last space for the next word
 * unless the run reaches the end of the piece; \s+ takes it all. */
static void split_whitespace(span *s, size_t *pos, size_t n_ws) {
    if (n_ws > 1 && sp_cpt(s, *pos + n_ws) != OUT_OF_RANGE) {
        *pos += n_ws - 1;
    } else if (n_ws > 0) {
        *pos += n_ws;
    } else {
        *pos += 1; /* nothing matched: the codepoint stands alone */
    }
    sp_emit(s, *pos);
}

/* \p{N}{1,3}: digits in groups of three. */
static void split_digits3(span *s, size_t *pos) {
    size_t ini = *pos;
    while (sp_flags(s, *pos) & TOK_UF_NUMBER) {
        if (++*pos - ini >= 3) {
            sp_emit(s, *pos);
            ini = *pos;
        }
    }
    sp_emit(s, *pos);
}

/* The alternatives Llama-3 and Kimi K2 end with, at pos after their letter
 * alternatives failed: \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ |
 * \s+(?!\S) | \s+. For the punctuation run llama.cpp tests the class of the
 * codepoint after an optional space; Llama-3's split also requires the current
 * one to exist (same result as the regex), Kimi K2's the tested one. */
static void split_number_punct_space(span *s, size_t *pos_io, uint32_t cpt, uint16_t f,
                                     bool gate_on_current) {
    size_t pos = *pos_io;
    if (f & TOK_UF_NUMBER) {
        split_digits3(s, pos_io);
        return;
    }
    const uint16_t f2 = cpt == ' ' ? sp_flags(s, pos + 1) : f;
    if (!(f2 & WLN) && (gate_on_current ? f : f2)) {
        pos += cpt == ' ';
        while (!(sp_flags(s, pos) & WLN) && sp_flags(s, pos)) pos++;
        while (sp_cpt(s, pos) == '\r' || sp_cpt(s, pos) == '\n') pos++;
        sp_emit(s, pos);
        *pos_io = pos;
        return;
    }
    size_t n_ws = 0, last_nl_end = 0;
    while (sp_flags(s, pos + n_ws) & TOK_UF_WHITESPACE) {
        uint32_t w = sp_cpt(s, pos + n_ws);
        if (w == '\r' || w == '\n') last_nl_end = pos + n_ws + 1;
        n_ws++;
    }
    if (last_nl_end > 0) { /* \s*[\r\n]+ */
        *pos_io = last_nl_end;
        sp_emit(s, last_nl_end);
        return;
    }
    split_whitespace(s, pos_io, n_ws);
}

/* The loop of the two patterns that open with a contraction ('s 't 're 've
 * 'm 'll 'd, case-insensitive for Llama-3), which is a word of its own; else
 * the pattern's other alternatives take the next word:
 *   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Always inlined with a constant `llama3`, so each pattern gets a loop of its
 * own with no test of the flag in it: sharing the loop through a run-time
 * flag, or moving a step into a function that advances pos through a pointer,
 * made it run 2-10% more instructions (callgrind, GCC -O2). */
static inline __attribute__((always_inline)) void split_contraction_first(span *s, bool llama3) {
    for (size_t pos = s->ini; pos < s->end;) {
        size_t c = contraction_len(s, pos, llama3);
        if (c) {
            pos += c;
            sp_emit(s, pos);
            continue;
        }
        const uint32_t cpt = sp_cpt(s, pos);
        if (llama3) {
            const uint16_t f = sp_flags(s, pos);
            if (!(cpt == '\r' || cpt == '\n' || (f & TOK_UF_NUMBER)) &&
                ((f & TOK_UF_LETTER) || (sp_flags(s, pos + 1) & TOK_UF_LETTER))) {
                pos++;
                while (sp_flags(s, pos) & TOK_UF_LETTER) pos++;
                sp_emit(s, pos);
                continue;
            }
            split_number_punct_space(s, &pos, cpt, f, true);
            continue;
        }
        const uint16_t f2 = cpt == ' ' ? sp_flags(s, pos + 1) : sp_flags(s, pos);
        uint16_t cls = 0;
        if (f2 & TOK_UF_LETTER) cls = TOK_UF_LETTER;
        else if (f2 & TOK_UF_NUMBER) cls = TOK_UF_NUMBER;
        if (cls) {
            pos += cpt == ' ';
            while (sp_flags(s, pos) & cls) pos++;
            sp_emit(s, pos);
            continue;
        }
        if (!(f2 & WLN) && f2) {
            pos += cpt == ' ';
            while (!(sp_flags(s, pos) & WLN) && sp_flags(s, pos)) pos++;
            sp_emit(s, pos);
            continue;
        }
        size_t n_ws = 0;
        while (sp_flags(s, pos + n_ws) & TOK_UF_WHITESPACE) n_ws++;
        split_whitespace(s, &pos, n_ws);
    }
}

static void split_gpt2(span *s) { split_contraction_first(s, false); }
static void split_llama3(span *s) { split_contraction_first(s, true); }

/* Han as llama.cpp's unicode_cpt_is_han counts it: the CJK unified ideographs
 * (extensions A to F) and the compatibility ideographs, not all of \p{Han}. */
static bool is_han(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2EBEF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool letter_not_han(const span *s, size_t pos) {
    return (sp_flags(s, pos) & TOK_UF_LETTER) && !is_han(sp_cpt(s, pos));
}

/* Kimi K2 (tokenizer.ggml.pre "kimi-k2"), as llama.cpp's hand-written split
 * implements tokenization_kimi.py's pattern:
 *   [\p{Han}]+ | [^\r\n\p{L}\p{N}]?(\p{L} but not Han)+(?i:'s|'t|'re|'ve|'m|'ll|'d)? |
 *   \p{N}{1,3} |  ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * llama.cpp takes a run of letters whole (the pattern's upper/lower-case split
 * and its \p{M} are not modelled there), and so does this. */
static void split_kimi_k2(span *s) {
    for (size_t pos = s->ini; pos < s->end;) {
        const uint32_t cpt = sp_cpt(s, pos);
        const uint16_t f = sp_flags(s, pos);
        if (is_han(cpt)) {
            while (is_han(sp_cpt(s, pos))) pos++;
            sp_emit(s, pos);
            continue;
        }
        const bool lead = !(cpt == '\r' || cpt == '\n' || (f & (TOK_UF_LETTER | TOK_UF_NUMBER)));
        if (letter_not_han(s, pos) || (lead && letter_not_han(s, pos + 1))) {
            pos += lead;
            while (letter_not_han(s, pos)) pos++;
            pos += contraction_len(s, pos, true);
            sp_emit(s, pos);
            continue;
        }
        split_number_punct_space(s, &pos, cpt, f, false);
    }
}

/* Matching text for the PCRE2 paths, built once per split. */
typedef struct subject {
    char *bytes;  /* collapsed bytes (one per codepoint) or UTF-8 */
    size_t *boff; /* UTF-8 only: byte offset of each codepoint, n + 1 entries */
} subject;

/* One byte per codepoint: ASCII as is, whitespace as \v, others as their class
 * byte (0xD0 for classes a regex cannot name). */
static char collapse_cpt(uint32_t cp) {
    if (cp < 128) return (char)cp;
    uint16_t f = tok_uflags(cp);
    if (f & TOK_UF_WHITESPACE) return '\x0B';
    switch (f & TOK_UF_CATEGORIES) {
    case TOK_UF_NUMBER: return '\xD1';
    case TOK_UF_LETTER: return '\xD2';
    case TOK_UF_PUNCT: return '\xD3';
    case TOK_UF_MARK: return '\xD4';
    case TOK_UF_SYMBOL: return '\xD5';
    default: return '\xD0';
    }
}

static bool build_collapsed(subject *sj, const uint32_t *cpts, size_t n) {
    sj->bytes = malloc(n + 1);
    if (!sj->bytes) return false;
    for (size_t i = 0; i < n; i++) sj->bytes[i] = collapse_cpt(cpts[i]);
    return true;
}

/* UTF-8 of the codepoints with non-ASCII whitespace as \v (what llama.cpp feeds
 * std::wregex). Surrogates and values beyond U+10FFFF, which PCRE2 cannot take
 * as UTF-8, become U+FFFD: none of the codepoint regexes can tell them apart. */
static bool build_utf8(subject *sj, const uint32_t *cpts, size_t n) {
    sj->bytes = malloc(n * 4 + 1);
    sj->boff = malloc((n + 1) * sizeof *sj->boff);
    if (!sj->bytes || !sj->boff) return false;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cpts[i];
        if (cp > 0x7F && (tok_uflags(cp) & TOK_UF_WHITESPACE)) cp = 0x0B;
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
        sj->boff[i] = o;
        o += tok_utf8_put(cp, sj->bytes + o);
    }
    sj->boff[n] = o;
    return true;
}

/* Codepoint index of byte offset b (b is a codepoint boundary). */
static size_t cpt_at_byte(const subject *sj, size_t lo, size_t hi, size_t b) {
    if (!sj->boff) return b;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sj->boff[mid] < b) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Per-call matching resources: the match data, and a larger JIT stack and an
 * interpreter heap cap that are set up only if a match needs them. */
typedef struct matcher {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
} matcher;

#define JIT_STACK_MAX  (64u << 20) /* virtual; pages are touched only as used */
#define HEAP_LIMIT_KIB (256u << 10)

static bool matcher_grow(matcher *m) {
    if (m->mctx) return false;
    m->mctx = pcre2_match_context_create(NULL);
    if (!m->mctx) return false;
    pcre2_set_heap_limit(m->mctx, HEAP_LIMIT_KIB);
    m->jstack = pcre2_jit_stack_create(64u << 10, JIT_STACK_MAX, NULL);
    if (m->jstack) pcre2_jit_stack_assign(m->mctx, NULL, m->jstack);
    return m->jstack != NULL;
}

/* Long runs inside nested quantifiers (e.g. the GPT-4o letter groups) can
 * outgrow PCRE2's default 32 KiB JIT stack: retry with a large one, then with
 * the interpreter under a heap cap, so hostile input fails instead of using
 * gigabytes. */
static int run_match(matcher *m, const pcre2_code *code, const char *subj, size_t len, size_t start,
                     uint32_t opts) {
    int rc = pcre2_match(code, (PCRE2_SPTR)subj, len, start, opts, m->md, m->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && matcher_grow(m))
        rc = pcre2_match(code, (PCRE2_SPTR)subj, len, start, opts, m->md, m->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && (m->mctx || matcher_grow(m)))
        rc = pcre2_match(code, (PCRE2_SPTR)subj, len, start, opts | PCRE2_NO_JIT, m->md, m->mctx);
    return rc;
}

/* Splits piece [ini, end) with one regex: every match is a word and so is every
 * gap between matches (std::regex_iterator semantics over the piece alone). */
static bool split_pcre(span *s, const tok_rx *r, const subject *sj, matcher *m, kvl_error *err) {
    const bool utf = r->kind == RX_KIND_CODEPOINTS;
    const size_t b0 = utf ? sj->boff[s->ini] : s->ini;
    const size_t blen = (utf ? sj->boff[s->end] : s->end) - b0;
    const char *subj = sj->bytes + b0;
    const uint32_t opts = utf ? PCRE2_NO_UTF_CHECK : 0;
    size_t at = 0;
    while (at < blen) {
        int rc = run_match(m, r->code, subj, blen, at, opts);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kvl_fail(err, "tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* none of the patterns match empty; never loop on one */
            at = ms + 1;
            while (utf && at < blen && ((unsigned char)subj[at] & 0xC0) == 0x80) at++;
            continue;
        }
        sp_emit(s, cpt_at_byte(sj, s->ini, s->end, b0 + ms));
        sp_emit(s, cpt_at_byte(sj, s->ini, s->end, b0 + me));
        at = me;
    }
    sp_emit(s, s->end);
    return s->ok || kvl_fail(err, "tokenizer: out of memory");
}

/* Applies regex r to every piece in `in`, appending the finer pieces to `out`. */
static bool apply_rx(const tok_rx *r, const uint32_t *cpts, const subject *sj, const tok_szvec *in,
                     tok_szvec *out, kvl_error *err) {
    matcher m = {0};
    if (r->code) {
        m.md = pcre2_match_data_create(1, NULL); /* only the whole match is read */
        if (!m.md) return kvl_fail(err, "tokenizer: out of memory");
    }
    size_t start = 0;
    bool ok = true;
    for (size_t i = 0; i < in->n && ok; i++) {
        span s = {cpts, start, start + in->v[i], start, out, true};
        if (r->kind == RX_KIND_GPT2) {
            split_gpt2(&s);
        } else if (r->kind == RX_KIND_LLAMA3) {
            split_llama3(&s);
        } else if (r->kind == RX_KIND_KIMI_K2) {
            split_kimi_k2(&s);
        } else {
            ok = split_pcre(&s, r, sj, &m, err);
        }
        ok = ok && (s.ok || kvl_fail(err, "tokenizer: out of memory"));
        start += in->v[i];
    }
    pcre2_match_data_free(m.md);
    pcre2_match_context_free(m.mctx);
    pcre2_jit_stack_free(m.jstack);
    return ok;
}

bool tok_pretok_split(const tok_pretok *p, const uint32_t *cpts, size_t n, tok_szvec *lens,
                      kvl_error *err) {
    subject coll = {0}, utf = {0};
    tok_szvec cur = {0}, next = {0};
    bool ok = tok_szvec_push(&cur, n) && (!p->need_collapse || build_collapsed(&coll, cpts, n));
    if (!ok) kvl_fail(err, "tokenizer: out of memory");
    for (int i = 0; i < p->n_rx && ok; i++) {
        if (p->rx[i].kind == RX_KIND_CODEPOINTS && !utf.bytes && !build_utf8(&utf, cpts, n)) {
            ok = kvl_fail(err, "tokenizer: out of memory");
            break;
        }
        const subject *sj = p->rx[i].kind == RX_KIND_CODEPOINTS ? &utf : &coll;
        next.n = 0;
        ok = apply_rx(&p->rx[i], cpts, sj, &cur, &next, err);
        tok_szvec tmp = cur;
        cur = next;
        next = tmp;
    }
    free(coll.bytes);
    free(utf.bytes);
    free(utf.boff);
    free(next.v);
    if (ok) {
        free(lens->v);
        *lens = cur;
    } else {
        free(cur.v);
    }
    return ok;
}
